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
 * Copies go on the tier's private non-blocking stream, which never orders against an
 * engine's streams in this process or another. A read or write with a `done` callback is
 * asynchronous: the copy is queued, an event (one of a ring the tier creates with the pool,
 * on its device, so a move creates nothing) is recorded after it, and `done` runs from tier_gpu_poll() once that event has
 * fired; nothing here waits. The stream runs its copies in order, so completions are taken
 * from the head of the ring, and one event query answers for the head (a later copy cannot
 * be done before it). What calls tier_gpu_poll() is the caller's loop, woken by a timerfd
 * (tier_gpu_fd) that the tier arms when the head copy should be done — its length at
 * TIER_GPU_EST_BPS — and then, while it is not, at doubling intervals up to
 * TIER_GPU_POLL_MAX_NS; a query costs a microsecond and never blocks, so a copy that is
 * late costs a few wake-ups, not a stalled loop. (A helper thread blocked in
 * cudaEventSynchronize would wake the loop sooner, at the price of a thread, a lock between
 * it and the loop, and a spinning or blocking-sync event: not needed while moves are not on
 * a client's critical path.) Without a callback a copy has landed when the call returns (a
 * wait on the stream, counted): for tests and tools, not for the daemon's loop.
 * Host memory the daemon copies from or into (its arenas) is registered once
 * (tier_gpu_host_register), so the copies are DMA from locked pages and really
 * asynchronous; from pageable memory the driver stages the bytes and the call itself
 * blocks for about the copy's duration, which is correct but not what the loop wants.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kern_dev.h"
#include "tiers/gpu.h"
#include "tiers/slab.h"

/* The rate a copy is first expected to run at (pinned host memory over PCIe 4 x16 moves
 * about 25 GB/s), and the bounds of the intervals between checks of a copy still running. */
#define TIER_GPU_EST_BPS 20e9
#define TIER_GPU_POLL_MIN_NS 20000ull
#define TIER_GPU_POLL_MAX_NS 2000000ull

/* One asynchronous copy: queued on the stream, its event recorded after it. */
struct tier_gpu_op {
    tier_done_fn done;
    void *arg;
    void *event; /* the ring slot's event, created with the tier and recorded again */
    uint64_t len;
};

struct tier_gpu {
    struct tier base;
    const struct kern_dev_ops *ops;
    struct kern_dev_pool pool;
    void *stream; /* private, non-blocking, on the pool's device */
    struct slab *slab;
    uint64_t size; /* bytes the allocator covers (<= pool.size) */
    uint32_t arena_id;
    int device;
    int pool_live;
    int tfd; /* timerfd: readable when the head copy should be checked */
    struct tier_gpu_op ring[TIER_GPU_MAX_INFLIGHT];
    uint32_t head, n;    /* copies in flight, from ring[head] in stream order */
    uint64_t backoff_ns; /* interval before the next check of the head copy */
    int armed;           /* the timer is set */
    /* Host ranges registered by the tier: appended by one thread at a time (the loop's, or
     * the store's registration thread), the count read by the loop for its stats. */
    void **registered;
    uint32_t capregistered;
    _Atomic uint32_t nregistered;
    struct tier_gpu_stats st;
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

/* Arms the timer after ns (0 disarms it). */
static void tier_gpu_timer(struct tier_gpu *g, uint64_t ns)
{
    struct itimerspec it = {.it_value = {.tv_sec = (time_t)(ns / 1000000000ull),
                                         .tv_nsec = (long)(ns % 1000000000ull)}};
    if (g->tfd >= 0 && (ns || g->armed))
        (void)timerfd_settime(g->tfd, 0, &it, NULL); /* also forgets an expiry not read */
    g->armed = ns != 0;
}

/* When a copy of len bytes should be done, from its start. */
static uint64_t tier_gpu_est_ns(uint64_t len)
{
    uint64_t ns = (uint64_t)((double)len * 1e9 / TIER_GPU_EST_BPS);
    if (ns < TIER_GPU_POLL_MIN_NS)
        ns = TIER_GPU_POLL_MIN_NS;
    return ns < TIER_GPU_POLL_MAX_NS ? ns : TIER_GPU_POLL_MAX_NS;
}

/* A copy that has landed when it returns: queued on the private stream, then waited for. */
static int tier_gpu_copy_sync(struct tier_gpu *g, void *dst, const void *src, uint64_t len,
                              int kind)
{
    int rc = g->ops->copy_async(dst, src, len, kind, g->stream);
    int wrc = g->ops->stream_sync(g->stream); /* also after a failed queue: nothing in flight */
    g->st.waits++;
    return rc ? rc : wrc;
}

/* Queues a copy; with done, asynchronous (done from tier_gpu_poll), else waited for here.
 * -EAGAIN: TIER_GPU_MAX_INFLIGHT copies are in flight (nothing queued). */
static int tier_gpu_copy(struct tier_gpu *g, void *dst, const void *src, uint64_t len,
                         int kind, tier_done_fn done, void *arg)
{
    struct tier_gpu_op *op;
    int rc;
    if (!done)
        return tier_gpu_copy_sync(g, dst, src, len, kind);
    if (g->n == TIER_GPU_MAX_INFLIGHT)
        return -EAGAIN;
    op = &g->ring[(g->head + g->n) % TIER_GPU_MAX_INFLIGHT];
    rc = g->ops->copy_async(dst, src, len, kind, g->stream);
    if (rc)
        return rc;
    g->st.copies++;
    g->st.bytes += len;
    rc = g->ops->event_record(op->event, g->stream);
    if (rc) {
        /* Nothing would tell when the queued copy is done: wait for it now (and for those
         * before it), so that no copy outlives what its caller holds unseen. */
        int wrc = g->ops->stream_sync(g->stream);
        g->st.waits++;
        done(arg, wrc ? wrc : rc);
        return 0;
    }
    op->done = done;
    op->arg = arg;
    op->len = len;
    if (g->n++ == 0) {
        g->backoff_ns = tier_gpu_est_ns(len);
        tier_gpu_timer(g, g->backoff_ns);
    }
    return 0;
}

static int tier_gpu_read(struct tier *t, const struct tier_loc *loc, uint64_t off, void *dst,
                         uint64_t len, tier_done_fn done, void *arg)
{
    struct tier_gpu *g = tier_gpu_of(t);
    char *p = tier_gpu_span(g, loc, off, len);
    if (!p || !dst)
        return -EINVAL;
    if (done)
        return tier_gpu_copy(g, dst, p, len, KERN_DEV_COPY_D2H, done, arg);
    return tier_gpu_copy_sync(g, dst, p, len, KERN_DEV_COPY_D2H);
}

static int tier_gpu_write(struct tier *t, const struct tier_loc *loc, uint64_t off,
                          const void *src, uint64_t len, tier_done_fn done, void *arg)
{
    struct tier_gpu *g = tier_gpu_of(t);
    char *p = tier_gpu_span(g, loc, off, len);
    if (!p || !src)
        return -EINVAL;
    if (done)
        return tier_gpu_copy(g, p, src, len, KERN_DEV_COPY_H2D, done, arg);
    return tier_gpu_copy_sync(g, p, src, len, KERN_DEV_COPY_H2D);
}

uint32_t tier_gpu_poll(struct tier *t)
{
    struct tier_gpu *g = tier_gpu_of(t);
    uint64_t expired;
    uint32_t n = 0;
    if (!g->n && !g->armed)
        return 0; /* nothing in flight: no system call */
    if (g->tfd >= 0 && read(g->tfd, &expired, sizeof(expired)) < 0)
        expired = 0; /* EAGAIN: polled before the timer fired */
    while (g->n) {
        struct tier_gpu_op *op = &g->ring[g->head];
        int rc = g->ops->event_query(op->event);
        g->st.queries++;
        if (rc == -EAGAIN)
            break;
        tier_done_fn done = op->done;
        void *arg = op->arg;
        op->done = NULL;
        op->arg = NULL;
        g->head = (g->head + 1) % TIER_GPU_MAX_INFLIGHT;
        g->n--;
        n++;
        if (rc)
            g->st.failed++;
        done(arg, rc); /* may queue more: the ring is consistent by now */
    }
    if (!g->n) {
        tier_gpu_timer(g, 0);
    } else {
        /* A new head is expected after its own length; a late one is checked less and less
         * often, up to the cap. */
        g->backoff_ns = n ? tier_gpu_est_ns(g->ring[g->head].len)
                          : (g->backoff_ns * 2 < TIER_GPU_POLL_MAX_NS ? g->backoff_ns * 2
                                                                      : TIER_GPU_POLL_MAX_NS);
        tier_gpu_timer(g, g->backoff_ns);
    }
    return n;
}

void tier_gpu_wake(struct tier *t)
{
    tier_gpu_timer(tier_gpu_of(t), 1);
}

uint32_t tier_gpu_drain(struct tier *t)
{
    struct tier_gpu *g = tier_gpu_of(t);
    uint32_t n = 0;
    if (!g->n)
        return 0;
    (void)g->ops->stream_sync(g->stream); /* its error comes back from each event */
    g->st.waits++;
    while (g->n) {
        uint32_t k = tier_gpu_poll(t);
        if (!k) {
            /* The device says not done after a wait: complete the rest as failed rather
             * than spin (only a broken driver or fake gets here). */
            struct tier_gpu_op *op = &g->ring[g->head];
            tier_done_fn done = op->done;
            void *arg = op->arg;
            op->done = NULL;
            g->head = (g->head + 1) % TIER_GPU_MAX_INFLIGHT;
            g->n--;
            g->st.failed++;
            k = 1;
            done(arg, -EIO);
        }
        n += k;
    }
    return n;
}

int tier_gpu_fd(const struct tier *t)
{
    return tier_gpu_of(t)->tfd;
}

uint32_t tier_gpu_inflight(const struct tier *t)
{
    return tier_gpu_of(t)->n;
}

void tier_gpu_stats_get(const struct tier *t, struct tier_gpu_stats *st)
{
    const struct tier_gpu *g = tier_gpu_of(t);
    *st = g->st;
    st->inflight = g->n;
    st->registered = atomic_load_explicit(&g->nregistered, memory_order_relaxed);
}

int tier_gpu_host_register(struct tier *t, void *p, uint64_t len)
{
    struct tier_gpu *g = tier_gpu_of(t);
    uint32_t n = atomic_load_explicit(&g->nregistered, memory_order_relaxed);
    int rc;
    if (!p || !len)
        return -EINVAL;
    if (n == g->capregistered) {
        uint32_t ncap = n ? 2 * n : 16;
        void **nv = ncap > n ? realloc(g->registered, ncap * sizeof(*nv)) : NULL;
        if (!nv)
            return -ENOMEM;
        g->registered = nv;
        g->capregistered = ncap;
    }
    rc = g->ops->host_register(p, len, 0);
    if (rc == 0) {
        g->registered[n] = p;
        atomic_store_explicit(&g->nregistered, n + 1, memory_order_relaxed);
    }
    return rc;
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
    /* Copies still in flight finish before the memory they touch may go; their callbacks
     * are dropped (the caller drained what it wanted to hear about). */
    if (g->stream && g->n)
        (void)g->ops->stream_sync(g->stream);
    for (uint32_t i = 0; i < TIER_GPU_MAX_INFLIGHT; i++)
        g->ops->event_free(g->ring[i].event);
    for (uint32_t i = 0; i < atomic_load(&g->nregistered); i++)
        (void)g->ops->host_unregister(g->registered[i]);
    free(g->registered);
    if (g->tfd >= 0)
        close(g->tfd);
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
    g->device = cfg->device;
    g->pool.fd = -1;
    g->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (g->tfd < 0) {
        ret = -errno;
        goto out;
    }
    uint64_t size = (cfg->size + cfg->page_size - 1) & ~(cfg->page_size - 1);
    ret = g->ops->pool_create(cfg->device, size, &g->pool);
    if (ret < 0)
        goto out;
    g->pool_live = 1;
    ret = g->ops->stream_new(cfg->device, &g->stream);
    if (ret < 0)
        goto out;
    for (uint32_t i = 0; i < TIER_GPU_MAX_INFLIGHT && ret == 0; i++)
        ret = g->ops->event_new(cfg->device, &g->ring[i].event);
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
