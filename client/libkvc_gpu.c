/*
 * libkvc_gpu.c — libkvc's GPU calls (see the GPU section of kvc.h).
 *
 * DESIGN
 * Every device call goes through a struct kern_dev_ops table (kernels/kern_dev.h): the CUDA
 * one, or none in a build without CUDA, so this file holds no CUDA types and its checks and
 * host fallbacks run everywhere. libkvc.c reaches this file only through the hooks it
 * installs at kvc_gpu_attach(), so a program that never calls the GPU API links no CUDA.
 *
 * Nothing an engine does per hit allocates, frees or waits on the device. Work is queued on
 * the caller's stream and tracked on its lease or reservation (struct kvc_gpu_work): one
 * event per stream, recorded again after each call, so a batch of copies, gathers and
 * scatters is in flight together; kvc_release(), kvc_commit() and kvc_abort() wait for
 * those events (never the whole device), which is what keeps pins alive under copies in
 * flight and makes a fault surface there. Device scratch (pointer tables, staging for host
 * blocks) comes from a pool the client keeps: a gather or scatter borrows one buffer, the
 * wait gives it back, and it is freed at kvc_disconnect(). The pool grows only when a call
 * needs more than any idle buffer holds (cudaMalloc, rounded up so that growth is rare; the
 * buffer it replaces is freed then, the one cudaFree, which waits for the whole device,
 * outside kvc_disconnect()). Events are pooled the same way. State changes happen under the
 * client's mutex; the waits themselves run without it.
 *
 * libkvc runs in the engine's threads and never changes their current device (no table op
 * does). The pool is used only from a thread whose current device is the pool's at attach:
 * the mapping grants access to that device alone, so elsewhere the client stays on host
 * copies. Synchronous copies (kvc_lease_copy, kvc_resv_write into the pool) are queued on
 * the client's private non-blocking stream and waited for there, never on the legacy
 * default stream, so they neither return early nor wait for the engine's work. A wait that
 * reports an error is passed up: kvc_commit() then publishes nothing.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/kvc.h"
#include "client/libkvc_internal.h"
#include "kernels/kern.h"
#include "kernels/kern_dev.h"
#include "kernels/kern_pack.h"

/* Host arenas are registered in chunks: one cudaHostRegister of many GiB can fail where
 * smaller ones succeed, and chunks keep each call's pinning time short. */
#define KVC_GPU_REG_CHUNK (1ull << 30)
#define KVC_GPU_MAX_REG 256

/* Scratch buffers are rounded up to a power of two below this, to multiples of it above. */
#define KVC_GPU_SCRATCH_STEP (16ull << 20)
/* Idle events the client keeps for reuse; more are freed when given back. */
#define KVC_GPU_IDLE_EVENTS 64

enum kvc_gpu_state { KVC_GPU_HOST_ONLY = 0, KVC_GPU_MAPPED = 1 };

/* One device scratch buffer of the client's pool, with the host-side tables staged into it
 * (pageable: the copy stages them before it returns). Owned by the pool while idle, borrowed
 * by one lease or reservation while work that reads it is queued. */
struct kvc_gpu_scratch {
    uint8_t *dev; /* cap bytes of device memory */
    uint64_t cap;
    uint8_t *host; /* hcap bytes */
    uint64_t hcap;
    struct kvc_gpu_scratch *next;
};

struct kvc_gpu {
    const struct kern_dev_ops *ops; /* NULL: no CUDA in this libkvc */
    int state;                      /* enum kvc_gpu_state */
    int pool_live;
    int device;   /* the caller's current device at attach */
    void *stream; /* private non-blocking stream on it, for the synchronous copies */
    struct kern_dev_pool pool;
    void *reg[KVC_GPU_MAX_REG]; /* registered chunks */
    uint32_t nreg;
    struct kvc_gpu_scratch *idle;       /* scratch no queued work reads; freed at disconnect */
    void *ev_idle[KVC_GPU_IDLE_EVENTS]; /* events whose last record has been waited for */
    uint32_t nev_idle;
};

static const struct kern_dev_ops *kvc_gpu_ops_override;

void kvci_gpu_ops_set(const struct kern_dev_ops *ops)
{
    kvc_gpu_ops_override = ops;
}

static struct kvc_gpu *kvc_gpu_of(const kvc_client *c)
{
    return (struct kvc_gpu *)c->gpu;
}

static void kvc_gpu_scratch_free(struct kvc_gpu *g, struct kvc_gpu_scratch *s)
{
    g->ops->mem_free(s->dev);
    free(s->host);
    free(s);
}

/* Rounds a scratch request up so that a pool serving similar calls stops growing at once. */
static uint64_t kvc_gpu_scratch_cap(uint64_t need)
{
    uint64_t cap = 1ull << 16;
    if (need > KVC_GPU_SCRATCH_STEP)
        return (need + KVC_GPU_SCRATCH_STEP - 1) / KVC_GPU_SCRATCH_STEP * KVC_GPU_SCRATCH_STEP;
    while (cap < need)
        cap <<= 1;
    return cap;
}

/* Borrows the smallest idle scratch of at least len device and hlen host bytes, growing
 * the pool when none is big enough: the largest idle buffer, too small, is replaced. Caller
 * holds c->mu. */
static int kvc_gpu_scratch_take(struct kvc_gpu *g, uint64_t len, uint64_t hlen,
                                struct kvc_gpu_scratch **out)
{
    struct kvc_gpu_scratch **best = NULL, **small = NULL, *s;
    for (struct kvc_gpu_scratch **pp = &g->idle; *pp; pp = &(*pp)->next) {
        if ((*pp)->cap >= len && (!best || (*pp)->cap < (*best)->cap))
            best = pp;
        if ((*pp)->cap < len && (!small || (*pp)->cap > (*small)->cap))
            small = pp;
    }
    if (best) {
        s = *best;
        *best = s->next;
    } else {
        s = calloc(1, sizeof(*s));
        if (!s)
            return -ENOMEM;
        s->cap = kvc_gpu_scratch_cap(len);
        int rc = g->ops->mem_alloc((void **)&s->dev, s->cap);
        if (rc) {
            free(s);
            return rc;
        }
        if (small) { /* replaced: idle, so nothing queued reads it */
            struct kvc_gpu_scratch *old = *small;
            *small = old->next;
            kvc_gpu_scratch_free(g, old);
        }
    }
    s->next = NULL;
    if (s->hcap < hlen) {
        uint8_t *h = realloc(s->host, hlen);
        if (!h) {
            s->next = g->idle;
            g->idle = s;
            return -ENOMEM;
        }
        s->host = h;
        s->hcap = hlen;
    }
    *out = s;
    return 0;
}

/* An event recorded on stream: an idle one recorded again, or a new one. Caller holds
 * c->mu. */
static int kvc_gpu_event_take(struct kvc_gpu *g, void *stream, void **ev)
{
    if (g->nev_idle == 0)
        return g->ops->event_new_record(ev, stream);
    int rc = g->ops->event_record(g->ev_idle[g->nev_idle - 1], stream);
    if (rc == 0)
        *ev = g->ev_idle[--g->nev_idle];
    return rc;
}

/* Gives back an event whose last record was waited for. Caller holds c->mu. */
static void kvc_gpu_event_give(struct kvc_gpu *g, void *ev)
{
    if (g->nev_idle < KVC_GPU_IDLE_EVENTS)
        g->ev_idle[g->nev_idle++] = ev;
    else
        g->ops->event_wait_free(ev); /* done already: no wait */
}

static int kvc_gpu_wait(kvc_client *c, struct kvc_gpu_work *w)
{
    struct kvc_gpu *g = kvc_gpu_of(c);
    int rc = w->err, failed[KVC_GPU_WORK_STREAMS] = {0};
    for (uint32_t i = 0; i < w->nev; i++) {
        failed[i] = g->ops->event_wait(w->ev[i]);
        rc = rc ? rc : failed[i];
    }
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < w->nev; i++) {
        if (failed[i])
            g->ops->event_wait_free(w->ev[i]); /* not reused after an error */
        else
            kvc_gpu_event_give(g, w->ev[i]);
    }
    while (w->scratch) {
        struct kvc_gpu_scratch *s = w->scratch;
        w->scratch = s->next;
        s->next = g->idle;
        g->idle = s;
    }
    pthread_mutex_unlock(&c->mu);
    memset(w, 0, sizeof(*w));
    return rc;
}

static int kvc_gpu_copy_sync(kvc_client *c, void *dst, const void *src, uint64_t len);
static int kvc_gpu_lease_copy(kvc_lease *l, size_t i, void *dst, int kind, void *stream);
static int kvc_gpu_lease_decode(kvc_lease *l, size_t i, void *dst, void *stream);

static void kvc_gpu_fini(kvc_client *c)
{
    struct kvc_gpu *g = kvc_gpu_of(c);
    if (!g)
        return;
    while (g->idle) {
        struct kvc_gpu_scratch *s = g->idle;
        g->idle = s->next;
        kvc_gpu_scratch_free(g, s);
    }
    for (uint32_t i = 0; i < g->nev_idle; i++)
        g->ops->event_wait_free(g->ev_idle[i]);
    if (g->stream)
        g->ops->stream_free(g->stream);
    for (uint32_t i = 0; i < g->nreg; i++)
        g->ops->host_unregister(g->reg[i]);
    if (g->pool_live)
        g->ops->pool_destroy(&g->pool);
    free(g);
    c->gpu = NULL;
    c->gpu_base = NULL;
}

static const struct kvc_gpu_hooks kvc_gpu_hooks = {
    .wait = kvc_gpu_wait,
    .copy_sync = kvc_gpu_copy_sync,
    .lease_copy = kvc_gpu_lease_copy,
    .lease_decode = kvc_gpu_lease_decode,
    .fini = kvc_gpu_fini,
};

static int kvc_gpu_copy_sync(kvc_client *c, void *dst, const void *src, uint64_t len)
{
    struct kvc_gpu *g = kvc_gpu_of(c);
    int rc, wrc;
    if (!g || !g->stream)
        return -ENOTSUP;
    rc = g->ops->copy_async(dst, src, len, KERN_DEV_COPY_DEFAULT, g->stream);
    wrc = g->ops->stream_sync(g->stream); /* also after a failed queue: nothing in flight */
    return rc ? rc : wrc;
}

/* 1 when the calling thread's current device is the pool's (uuid), so the mapping that
 * pool_import makes for that device is usable here; 0 otherwise. */
static int kvc_gpu_pool_here(struct kvc_gpu *g, const uint8_t uuid[KERN_DEV_UUID_BYTES])
{
    uint8_t u[KERN_DEV_UUID_BYTES];
    return g->ops->device_uuid(g->device, u) == 0 && memcmp(u, uuid, sizeof(u)) == 0;
}

/* Pins every mapped arena for DMA; a failure only costs speed (pageable copies). */
static void kvc_gpu_register(kvc_client *c, struct kvc_gpu *g)
{
    for (int a = 0; a < KVC_MAX_ARENAS; a++) {
        struct kvc_arena *ar = &c->arenas[a];
        for (uint64_t off = 0; ar->base && off < ar->size && g->nreg < KVC_GPU_MAX_REG;
             off += KVC_GPU_REG_CHUNK) {
            uint64_t len = ar->size - off < KVC_GPU_REG_CHUNK ? ar->size - off : KVC_GPU_REG_CHUNK;
            int rc = g->ops->host_register(ar->base + off, len, !ar->writable);
            if (rc == 0)
                g->reg[g->nreg++] = ar->base + off;
            else if (rc == -ENOTSUP)
                break; /* read-only registration unsupported: the whole arena stays pageable */
        }
    }
}

KVC_API int kvc_gpu_attach(kvc_client *c)
{
    struct kvc_gpu *g;
    int rc = 0, fd = -1;
    if (!c)
        return -EINVAL;
    pthread_mutex_lock(&c->mu);
    if (c->gpu) {
        rc = kvc_gpu_of(c)->state;
        goto out;
    }
    g = calloc(1, sizeof(*g));
    if (!g) {
        rc = -ENOMEM;
        goto out;
    }
    g->ops = kvc_gpu_ops_override ? kvc_gpu_ops_override : kern_dev_cuda();
    g->pool.fd = -1;
    if (!g->ops || g->ops->device_count() <= 0 || g->ops->device_get(&g->device) ||
        g->ops->stream_new(g->device, &g->stream)) {
        free(g); /* nothing to undo: host copies, and later calls ask again */
        goto out;
    }
    c->gpu = g;
    c->gpu_hooks = &kvc_gpu_hooks;
    kvc_gpu_register(c, g);

    struct kvc_gpu_attach_req *q = kvci_req(c);
    memset(q, 0, sizeof(*q));
    rc = kvci_call(c, KVC_OP_GPU_ATTACH, sizeof(*q), &fd);
    if (rc == -ENODEV || rc == -EOPNOTSUPP || rc == -EACCES) {
        rc = 0; /* no GPU tier, or not for this client: host copies (pinned) */
        goto out;
    }
    if (rc)
        goto out;
    uint32_t len;
    const struct kvc_gpu_attach_rep *p = kvci_rep(c, &len);
    if (len != sizeof(*p) || p->pool_bytes == 0 ||
        (p->handle != KVC_GPU_HANDLE_FD && p->handle != KVC_GPU_HANDLE_LEGACY) ||
        (p->handle == KVC_GPU_HANDLE_FD && fd < 0)) {
        rc = -EPROTO;
        goto out;
    }
    g->pool.handle = p->handle;
    g->pool.fd = fd;
    g->pool.size = p->pool_bytes;
    memcpy(g->pool.uuid, p->uuid, sizeof(g->pool.uuid));
    memcpy(g->pool.legacy, p->legacy, sizeof(g->pool.legacy));
    uint32_t arena = p->arena_id;
    /* The pool on another device than this thread's (or none here), or a driver that
     * cannot map it: host copies. */
    if (!kvc_gpu_pool_here(g, g->pool.uuid) || g->ops->pool_import(&g->pool) != 0) {
        rc = 0;
        goto out;
    }
    fd = -1; /* owned by the pool now */
    g->pool_live = 1;
    if (g->pool.device != g->device) {
        rc = 0; /* mapped for another device than this thread's: unusable here */
        goto out;
    }
    q = kvci_req(c);
    memset(q, 0, sizeof(*q));
    q->flags = KVC_GPU_ATTACH_F_MAPPED;
    rc = kvci_call(c, KVC_OP_GPU_ATTACH, sizeof(*q), NULL);
    if (rc)
        goto out;
    c->gpu_arena = arena;
    c->gpu_base = g->pool.base;
    c->gpu_size = g->pool.size;
    g->state = KVC_GPU_MAPPED;
    rc = KVC_GPU_MAPPED;
out:
    if (fd >= 0)
        close(fd); /* not imported: the pool never owned it */
    pthread_mutex_unlock(&c->mu);
    return rc;
}

KVC_API int kvc_lease_tier(const kvc_lease *l, size_t i)
{
    if (!l)
        return -EINVAL;
    return i < l->n ? (l->hits[i].tier == KVC_WIRE_TIER_GPU ? KVC_TIER_GPU : KVC_TIER_HOST)
                    : -ERANGE;
}

/* Adds the work just queued on stream (and the scratch s it reads, if any) to w without
 * waiting: the stream's event is recorded again after it, or a new one is taken. Caller
 * holds c->mu. */
static int kvc_gpu_track(kvc_client *c, struct kvc_gpu_work *w, struct kvc_gpu_scratch *s,
                         void *stream)
{
    struct kvc_gpu *g = kvc_gpu_of(c);
    uint32_t i = 0;
    int rc;
    if (s) {
        s->next = w->scratch;
        w->scratch = s;
    }
    while (i < w->nev && w->stream[i] != stream)
        i++;
    if (i < w->nev) {
        rc = g->ops->event_record(w->ev[i], stream);
    } else if (w->nev < KVC_GPU_WORK_STREAMS) {
        rc = kvc_gpu_event_take(g, stream, &w->ev[w->nev]);
        if (rc == 0)
            w->stream[w->nev++] = stream;
    } else {
        /* One lease on more streams than it tracks: the first one's work is waited for
         * (the only wait in a call) and its event follows this stream from now on. */
        rc = g->ops->event_wait(w->ev[0]);
        if (rc)
            w->err = w->err ? w->err : rc;
        rc = g->ops->event_record(w->ev[0], stream);
        if (rc == 0)
            w->stream[0] = stream;
    }
    if (rc) { /* without an event, wait now: nothing may outlive the pins unseen */
        int src = g->ops->stream_sync(stream);
        w->err = w->err ? w->err : (src ? src : rc);
    }
    return rc;
}

/* Queues raw hit i into dst on stream, tracked on the lease. Caller holds c->mu. */
static int kvc_gpu_lease_copy_locked(kvc_lease *l, size_t i, void *dst, int kind, void *stream)
{
    kvc_client *c = l->ns->c;
    int rc = kvc_gpu_of(c)->ops->copy_async(dst, l->hits[i].data, l->ns->block_bytes, kind,
                                            stream);
    if (rc == 0)
        rc = kvc_gpu_track(c, &l->gpu, NULL, stream);
    return rc;
}

static int kvc_gpu_lease_copy(kvc_lease *l, size_t i, void *dst, int kind, void *stream)
{
    kvc_client *c = l->ns->c;
    pthread_mutex_lock(&c->mu);
    int rc = kvc_gpu_lease_copy_locked(l, i, dst, kind, stream);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int kvc_gpu_lease_decode(kvc_lease *l, size_t i, void *dst, void *stream)
{
    kvc_client *c = l->ns->c;
    struct kvc_gpu *g = kvc_gpu_of(c);
    struct kvc_gpu_scratch *s;
    struct kern_layout kl = {.layers = l->ns->layout.layers,
                             .heads = l->ns->layout.kv_heads,
                             .head_dim = l->ns->layout.head_dim,
                             .tokens = l->ns->layout.block_tokens,
                             .dtype = l->ns->layout.dtype,
                             .k_only = l->ns->layout.kv_kind == KVC_WIRE_KV_KIND_K_ONLY};
    uint64_t n = l->hits[i].len;
    struct kern_layout bl;
    if (n == 0)
        return -EBADMSG;
    pthread_mutex_lock(&c->mu);
    int rc = kvc_gpu_scratch_take(g, n, n, &s);
    if (rc == 0) {
        /* Writers of the arena can change the stored bytes: what crosses is a private copy,
         * checked against the namespace's layout here so a bad block is an error now (the
         * kernel checks the header again and writes zeros for a block it cannot decode). */
        memcpy(s->host, l->hits[i].data, n);
        if (kern_block_info(s->host, n, &bl, NULL) < 0 || bl.layers != kl.layers ||
            bl.heads != kl.heads || bl.head_dim != kl.head_dim || bl.tokens != kl.tokens ||
            bl.k_only != kl.k_only) {
            rc = -EBADMSG;
            s->next = g->idle;
            g->idle = s;
        }
    }
    if (rc == 0) {
        /* The scratch's host copy is what crosses: checked, and stable until the lease's
         * work is waited for (the scratch is tracked with it). */
        rc = g->ops->copy_async(s->dev, s->host, n, KERN_DEV_COPY_H2D, stream);
        if (rc == 0)
            rc = g->ops->decode(&kl, s->dev, n, dst, l->ns->block_bytes, kl.dtype, stream);
        int trc = kvc_gpu_track(c, &l->gpu, s, stream);
        rc = rc ? rc : trc;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/*
 * A quantized hit is never handed out as it is stored. Into device memory it crosses in its
 * stored size to a pooled device scratch and is decoded there (kvc_gpu_lease_decode),
 * tracked on the lease like a raw copy; into host memory it is decoded on the CPU, in place.
 */
KVC_API int kvc_lease_copy_async(kvc_lease *l, size_t i, void *dst, size_t len, void *stream)
{
    kvc_client *c;
    int rc;
    if (!l || !dst)
        return -EINVAL;
    if (i >= l->n)
        return -ERANGE;
    if (len < l->ns->block_bytes)
        return -EINVAL;
    c = l->ns->c;
    if (!c->gpu)
        return -ENOTSUP;
    if (l->hits[i].format == KVC_WIRE_FORMAT_RAW)
        return kvc_gpu_lease_copy(l, i, dst, KERN_DEV_COPY_DEFAULT, stream);
    if (l->hits[i].tier == KVC_WIRE_TIER_GPU)
        return -ENOTSUP; /* the pool holds raw blocks only */
    if (kvc_gpu_of(c)->ops->pointer_device(dst) >= 0)
        return kvc_gpu_lease_decode(l, i, dst, stream);
    rc = kvc_lease_copy(l, i, dst, l->ns->block_bytes); /* host memory: decoded right there */
    return rc == -EINVAL ? -EBADMSG : rc;
}

KVC_API int kvc_resv_write_async(kvc_resv *r, size_t i, const void *src, size_t len,
                                 void *stream)
{
    kvc_client *c;
    int rc;
    if (!r || !src)
        return -EINVAL;
    if (i >= r->n)
        return -ERANGE;
    if (!r->slots[i].data || len != r->ns->block_bytes)
        return -EINVAL;
    c = r->ns->c;
    if (!c->gpu)
        return -ENOTSUP;
    pthread_mutex_lock(&c->mu);
    rc = kvc_gpu_of(c)->ops->copy_async(r->slots[i].data, src, len, KERN_DEV_COPY_DEFAULT,
                                        stream);
    if (rc == 0)
        rc = kvc_gpu_track(c, &r->gpu, NULL, stream);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

KVC_API int kvc_reserve_gpu(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                            size_t n, kvc_resv **out)
{
    return kvci_reserve_flags(ns, parent, keys, n, KVC_RESERVE_F_GPU, out);
}

/* ---- gather / scatter ------------------------------------------------------------------ */

static int kvc_gpu_layout(const kvc_ns *ns, struct kern_pack_layout *lay)
{
    static const uint32_t elem[] = {[KVC_DTYPE_FP16] = 2, [KVC_DTYPE_BF16] = 2,
                                    [KVC_DTYPE_FP32] = 4, [KVC_DTYPE_FP8_E4M3] = 1,
                                    [KVC_DTYPE_INT8] = 1};
    const struct kvc_wire_layout *w = &ns->layout;
    if (w->dtype == 0 || w->dtype >= sizeof(elem) / sizeof(elem[0]))
        return -EINVAL;
    *lay = (struct kern_pack_layout){.layers = w->layers,
                                     .kinds = w->kv_kind == KVC_WIRE_KV_KIND_KV ? 2 : 1,
                                     .block_tokens = w->block_tokens,
                                     .heads = w->kv_heads,
                                     .head_dim = w->head_dim,
                                     .elem_bytes = elem[w->dtype]};
    return kern_pack_block_bytes(lay) == ns->block_bytes ? 0 : -EINVAL;
}

static void kvc_gpu_engine(const struct kvc_paged_kv *kv, struct kern_pack_engine *e)
{
    *e = (struct kern_pack_engine){.k = kv->k,
                                   .v = kv->v,
                                   .block_table = kv->block_table,
                                   .table_len = kv->table_len,
                                   .page_tokens = kv->page_tokens,
                                   .page_stride = kv->page_stride,
                                   .token_stride = kv->token_stride,
                                   .head_stride = kv->head_stride};
}

/*
 * The device side of one gather or scatter over blocks[0..n) (each a host or pool
 * pointer, host ones flagged in is_host): one scratch borrowed from the client's pool holds
 * the pointer tables, the block table and a staging block per host block. Scatter: host
 * blocks are DMA-copied to staging, then one kernel. Gather: one kernel, then staging is
 * DMA-copied to host blocks. The work and its scratch are tracked on w (also after a
 * failure: what was queued before it reads the scratch). Caller holds c->mu.
 */
static int kvc_gpu_pack(kvc_client *c, struct kvc_gpu_work *w, const struct kern_pack_layout *lay,
                        const struct kvc_paged_kv *kv, uint64_t first_token, uint8_t **blocks,
                        const uint8_t *is_host, uint32_t n, int dir, void *stream)
{
    struct kvc_gpu *g = kvc_gpu_of(c);
    const struct kern_dev_ops *ops = g->ops;
    const uint64_t bb = kern_pack_block_bytes(lay);
    struct kvc_gpu_scratch *s;
    uint32_t nhost = 0;
    for (uint32_t j = 0; j < n; j++)
        nhost += is_host[j];
    /* [k ptrs][v ptrs][block ptrs][table][pad to 256][staging] */
    uint64_t ptrs = ((uint64_t)lay->layers * 2 + n) * sizeof(void *);
    uint64_t table = (uint64_t)kv->table_len * sizeof(int32_t);
    uint64_t meta = (ptrs + table + 255) & ~255ull;
    int rc = kvc_gpu_scratch_take(g, meta + nhost * bb, ptrs + table, &s);
    if (rc)
        return rc;
    uint8_t *host = s->host, *dev = s->dev;
    memset(host, 0, ptrs + table);
    void **hk = (void **)host, **hv = hk + lay->layers, **hb = hv + lay->layers;
    memcpy(hk, kv->k, lay->layers * sizeof(void *));
    if (kv->v)
        memcpy(hv, kv->v, lay->layers * sizeof(void *));
    memcpy(host + ptrs, kv->block_table, table);
    for (uint32_t j = 0, k = 0; j < n; j++)
        hb[j] = is_host[j] ? dev + meta + (uint64_t)k++ * bb : blocks[j];
    /* From pageable memory: staged before the call returns, so the next call may refill
     * `host` (it stays with the scratch until the wait all the same). */
    rc = ops->copy_async(dev, host, ptrs + table, KERN_DEV_COPY_H2D, stream);
    for (uint32_t j = 0; rc == 0 && dir == KERN_PACK_SCATTER && j < n; j++)
        if (is_host[j])
            rc = ops->copy_async(hb[j], blocks[j], bb, KERN_DEV_COPY_H2D, stream);
    struct kern_pack_engine de;
    kvc_gpu_engine(kv, &de);
    de.k = (void *const *)dev;
    de.v = kv->v ? (void *const *)(dev + lay->layers * sizeof(void *)) : NULL;
    de.block_table = (const int32_t *)(dev + ptrs);
    if (rc == 0)
        rc = ops->pack(lay, &de, first_token, n,
                       (void *const *)(dev + 2 * lay->layers * sizeof(void *)), dir, stream);
    for (uint32_t j = 0; rc == 0 && dir == KERN_PACK_GATHER && j < n; j++)
        if (is_host[j])
            rc = ops->copy_async(blocks[j], hb[j], bb, KERN_DEV_COPY_D2H, stream);
    int trc = kvc_gpu_track(c, w, s, stream);
    return rc ? rc : trc;
}

KVC_API int kvc_lease_scatter(kvc_lease *l, size_t first, size_t n,
                              const struct kvc_paged_kv *kv, uint64_t first_token,
                              void *stream, void *event)
{
    struct kern_pack_layout lay;
    struct kern_pack_engine e;
    uint8_t **blocks = NULL, *is_host = NULL, **dec = NULL;
    kvc_client *c;
    int rc;
    if (!l || !kv)
        return -EINVAL;
    if (first > l->n || n > l->n - first)
        return -ERANGE;
    c = l->ns->c;
    rc = kvc_gpu_layout(l->ns, &lay);
    if (rc)
        return rc;
    kvc_gpu_engine(kv, &e);
    rc = kern_pack_check(&lay, &e, first_token, (uint32_t)n, 1);
    if (rc || n == 0)
        return rc;
    blocks = calloc(n, sizeof(*blocks));
    is_host = calloc(n, 1);
    if (!blocks || !is_host) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t j = 0; j < n; j++) {
        const struct kvc_hit *h = &l->hits[first + j];
        if (h->format != KVC_WIRE_FORMAT_RAW) {
            /* A lossy hit (the precision ladder): decoded on the CPU into a private raw copy,
             * which is scattered as a host block; kept until the copies from it have run. */
            if (h->tier == KVC_WIRE_TIER_GPU) {
                rc = -ENOTSUP; /* the pool holds raw blocks only */
                goto out;
            }
            if (!dec && !(dec = calloc(n, sizeof(*dec)))) {
                rc = -ENOMEM;
                goto out;
            }
            dec[j] = malloc(l->ns->block_bytes);
            if (!dec[j]) {
                rc = -ENOMEM;
                goto out;
            }
            rc = kvc_lease_copy(l, first + j, dec[j], l->ns->block_bytes);
            if (rc)
                goto out;
            blocks[j] = dec[j];
            is_host[j] = 1;
            continue;
        }
        blocks[j] = (uint8_t *)h->data;
        is_host[j] = h->tier != KVC_WIRE_TIER_GPU;
        if (!kv->on_device && !is_host[j]) {
            rc = -ENOTSUP;
            goto out;
        }
    }
    if (!kv->on_device) {
        rc = kern_pack_cpu(&lay, &e, first_token, (uint32_t)n, (void *const *)blocks,
                           KERN_PACK_SCATTER);
        goto out;
    }
    if (!c->gpu) {
        rc = -ENOTSUP;
        goto out;
    }
    pthread_mutex_lock(&c->mu);
    rc = kvc_gpu_pack(c, &l->gpu, &lay, kv, first_token, blocks, is_host, (uint32_t)n,
                      KERN_PACK_SCATTER, stream);
    /* The DMA from the decoded copies must have run before they are freed: the one wait a
     * lossy scatter costs (raw hits are copied from the arena, which outlives the lease). */
    if (dec) {
        int src = kvc_gpu_of(c)->ops->stream_sync(stream);
        rc = rc ? rc : src;
    }
    if (rc == 0 && event)
        rc = kvc_gpu_of(c)->ops->event_record(event, stream);
    pthread_mutex_unlock(&c->mu);
out:
    for (size_t j = 0; dec && j < n; j++)
        free(dec[j]);
    free(dec);
    free(blocks);
    free(is_host);
    return rc ? rc : (int)n;
}

KVC_API int kvc_resv_gather(kvc_resv *r, size_t first, size_t n, const struct kvc_paged_kv *kv,
                            uint64_t first_token, void *stream, void *event)
{
    struct kern_pack_layout lay;
    struct kern_pack_engine e;
    kvc_client *c;
    int rc, written = 0;
    if (!r || !kv)
        return -EINVAL;
    if (first > r->n || n > r->n - first)
        return -ERANGE;
    c = r->ns->c;
    rc = kvc_gpu_layout(r->ns, &lay);
    if (rc)
        return rc;
    kvc_gpu_engine(kv, &e);
    rc = kern_pack_check(&lay, &e, first_token, (uint32_t)n, 1);
    if (rc || n == 0)
        return rc;
    if (kv->on_device && !c->gpu)
        return -ENOTSUP;
    for (size_t j = 0; j < n; j++)
        if (r->slots[first + j].data && r->slots[first + j].tier == KVC_WIRE_TIER_GPU &&
            !kv->on_device)
            return -ENOTSUP;
    if (kv->on_device)
        pthread_mutex_lock(&c->mu);
    /* One pack per run of consecutive reserved slots: their tokens are consecutive. */
    for (size_t j = 0; j < n && rc == 0;) {
        if (!r->slots[first + j].data) {
            j++;
            continue;
        }
        size_t run = 0;
        uint8_t *blocks[64], is_host[64];
        while (j + run < n && run < 64 && r->slots[first + j + run].data) {
            blocks[run] = r->slots[first + j + run].data;
            is_host[run] = r->slots[first + j + run].tier != KVC_WIRE_TIER_GPU;
            run++;
        }
        uint64_t tok = first_token + (uint64_t)j * lay.block_tokens;
        if (!kv->on_device) {
            rc = kern_pack_cpu(&lay, &e, tok, (uint32_t)run, (void *const *)blocks,
                               KERN_PACK_GATHER);
        } else {
            /* Several runs: each borrows its own scratch, all in flight together. */
            rc = kvc_gpu_pack(c, &r->gpu, &lay, kv, tok, blocks, is_host, (uint32_t)run,
                              KERN_PACK_GATHER, stream);
        }
        if (rc == 0)
            written += (int)run;
        j += run;
    }
    if (kv->on_device) {
        if (rc == 0 && event)
            rc = kvc_gpu_of(c)->ops->event_record(event, stream);
        pthread_mutex_unlock(&c->mu);
    }
    return rc ? rc : written;
}
