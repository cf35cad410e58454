/*
 * gpu.c — the gpu tier (see gpu.h for the design).
 *
 * DESIGN
 * The slab allocator runs over [0, pool size) and a location's offset is an offset into
 * the pool, which is what clients add to their own mapping of it: device addresses differ
 * per process, offsets do not. A location from another tier or outside the pool is refused
 * before any device call. The tier holds no CUDA types; the pool struct and the ops table
 * come from kernels/kern_dev.h.
 *
 * Reads and writes are synchronous for the engine: a promoted block's location is handed
 * out right after the write returns, so the bytes must be in the pool by then. Each copy
 * is queued on the tier's private non-blocking stream and that stream is waited for; the
 * stream never orders against an engine's streams in other processes or this one.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern_dev.h"
#include "tiers/gpu.h"
#include "tiers/slab.h"

struct tier_gpu {
    struct tier base;
    const struct kern_dev_ops *ops;
    struct kern_dev_pool pool;
    void *stream; /* private, non-blocking, on the pool's device */
    struct slab *slab;
    uint64_t size; /* bytes the allocator covers (<= pool.size) */
    uint32_t arena_id;
    int pool_live;
};

static struct tier_gpu *tier_gpu_of(const struct tier *t)
{
    return (struct tier_gpu *)t;
}

static int tier_gpu_alloc(struct tier *t, uint64_t len, struct tier_loc *loc)
{
    struct tier_gpu *g = tier_gpu_of(t);
    uint64_t off, slot;
    int cls;
    int ret = slab_alloc(g->slab, len, &off, &slot, &cls);
    if (ret < 0)
        return ret;
    loc->arena = g->arena_id;
    loc->cls = (uint32_t)cls;
    loc->off = off;
    loc->len = slot;
    return 0;
}

static void tier_gpu_free(struct tier *t, const struct tier_loc *loc)
{
    struct tier_gpu *g = tier_gpu_of(t);
    if (loc->arena == g->arena_id)
        slab_release(g->slab, loc->off);
}

/* Device address of [off, off+len) inside loc, or NULL if any part is outside. */
static char *tier_gpu_span(struct tier_gpu *g, const struct tier_loc *loc, uint64_t off,
                           uint64_t len)
{
    if (loc->arena != g->arena_id || len == 0)
        return NULL;
    if (loc->off > g->size || loc->len > g->size - loc->off)
        return NULL;
    if (off > loc->len || len > loc->len - off)
        return NULL;
    return (char *)g->pool.base + loc->off + off;
}

/* A copy that has landed when it returns: queued on the private stream, then waited for. */
static int tier_gpu_copy(struct tier_gpu *g, void *dst, const void *src, uint64_t len, int kind)
{
    int rc = g->ops->copy_async(dst, src, len, kind, g->stream);
    int wrc = g->ops->stream_sync(g->stream); /* also after a failed queue: nothing in flight */
    return rc ? rc : wrc;
}

static int tier_gpu_read(struct tier *t, const struct tier_loc *loc, uint64_t off, void *dst,
                         uint64_t len, tier_done_fn done, void *arg)
{
    struct tier_gpu *g = tier_gpu_of(t);
    char *p = tier_gpu_span(g, loc, off, len);
    int rc;
    if (!p || !dst)
        return -EINVAL;
    rc = tier_gpu_copy(g, dst, p, len, KERN_DEV_COPY_D2H);
    if (done)
        done(arg, rc);
    return 0;
}

static int tier_gpu_write(struct tier *t, const struct tier_loc *loc, uint64_t off,
                          const void *src, uint64_t len, tier_done_fn done, void *arg)
{
    struct tier_gpu *g = tier_gpu_of(t);
    char *p = tier_gpu_span(g, loc, off, len);
    int rc;
    if (!p || !src)
        return -EINVAL;
    rc = tier_gpu_copy(g, p, src, len, KERN_DEV_COPY_H2D);
    if (done)
        done(arg, rc);
    return 0;
}

static uint64_t tier_gpu_capacity(const struct tier *t)
{
    return tier_gpu_of(t)->size;
}

static uint64_t tier_gpu_usage(const struct tier *t)
{
    struct slab_stats st;
    slab_stats_get(tier_gpu_of(t)->slab, &st);
    return st.used;
}

static void tier_gpu_destroy(struct tier *t)
{
    struct tier_gpu *g = tier_gpu_of(t);
    if (g->stream)
        g->ops->stream_free(g->stream);
    if (g->pool_live)
        g->ops->pool_destroy(&g->pool);
    slab_free(g->slab);
    free(g);
}

static const struct tier_ops tier_gpu_ops = {
    .name = "gpu",
    .alloc = tier_gpu_alloc,
    .free = tier_gpu_free,
    .read = tier_gpu_read,
    .write = tier_gpu_write,
    .capacity = tier_gpu_capacity,
    .usage = tier_gpu_usage,
    .destroy = tier_gpu_destroy,
};

struct tier *tier_gpu_new(const struct tier_gpu_config *cfg, int *err)
{
    struct tier_gpu *g = NULL;
    int ret = 0;
    if (!cfg || cfg->size == 0 || cfg->page_size < SLAB_MIN_SLOT ||
        (cfg->page_size & (cfg->page_size - 1)) || cfg->device < 0 ||
        cfg->size > UINT64_MAX - cfg->page_size) {
        ret = -EINVAL;
        goto out;
    }
    if (!cfg->ops || cfg->ops->device_count() <= cfg->device) {
        ret = -ENODEV;
        goto out;
    }
    g = calloc(1, sizeof(*g));
    if (!g) {
        ret = -ENOMEM;
        goto out;
    }
    g->base.ops = &tier_gpu_ops;
    g->ops = cfg->ops;
    g->arena_id = cfg->arena_id;
    g->pool.fd = -1;
    uint64_t size = (cfg->size + cfg->page_size - 1) & ~(cfg->page_size - 1);
    ret = g->ops->pool_create(cfg->device, size, &g->pool);
    if (ret < 0)
        goto out;
    g->pool_live = 1;
    ret = g->ops->stream_new(cfg->device, &g->stream);
    if (ret < 0)
        goto out;
    /* The device may round up; the allocator covers whole pages of what was asked. */
    g->size = size <= g->pool.size ? size : g->pool.size & ~(cfg->page_size - 1);
    g->slab = slab_new(g->size, cfg->page_size);
    if (!g->slab)
        ret = -ENOMEM;
out:
    if (ret < 0) {
        if (g)
            tier_gpu_destroy(&g->base);
        if (err)
            *err = ret;
        return NULL;
    }
    if (err)
        *err = 0;
    return &g->base;
}

const struct kern_dev_pool *tier_gpu_pool(const struct tier *t)
{
    return &tier_gpu_of(t)->pool;
}

uint32_t tier_gpu_arena_id(const struct tier *t)
{
    return tier_gpu_of(t)->arena_id;
}

int tier_gpu_class(struct tier *t, uint64_t len)
{
    return slab_class_get(tier_gpu_of(t)->slab, len);
}

struct slab *tier_gpu_slab(const struct tier *t)
{
    return tier_gpu_of(t)->slab;
}

int tier_is_gpu(const struct tier *t)
{
    return t && t->ops == &tier_gpu_ops;
}
