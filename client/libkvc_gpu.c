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
 * blocks) comes from a pool the client keeps: a gather or scatter borrows one buffer (or
 * reuses the one its lease holds for the same stream), the wait gives it back, and it is
 * freed at kvc_disconnect(). A call stages at most KVC_GPU_STAGE_CAP bytes at once, in
 * chunks, so no buffer outgrows that (but for one block larger than it). The pool grows
 * only when a call needs more than any idle buffer holds (cudaMalloc, rounded up so that
 * growth is rare, to at most the cap; the buffer it replaces is freed then, the one
 * cudaFree, which waits for the whole device, outside kvc_disconnect()). Events are pooled
 * the same way. State changes happen under the client's mutex; the waits themselves run
 * without it.
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
#include <sys/mman.h>
#include <unistd.h>

#include "client/kvc.h"
#include "client/libkvc_internal.h"
#include "kernels/kern.h"
#include "kernels/kern_batch.h"
#include "kernels/kern_dev.h"
#include "kernels/kern_pack.h"

/* Host arenas are registered in chunks: one cudaHostRegister of many GiB can fail where
 * smaller ones succeed, and chunks keep each call's pinning time short. A chunk is
 * registered only once the daemon has faulted all of it in (its shared index says how far
 * it is, kvc_fast_hdr.faulted, about once a second; meanwhile a chunk whose every page is
 * resident counts as faulted): registering pins, and pins what is not resident by faulting
 * it in, at 4 KiB and at the caller's cost — an attach during the daemon's start would wait
 * for the whole host tier and leave the daemon nothing to collapse into 2 MiB pages. The
 * chunks faulted later are registered by the GPU calls that come after (one chunk a call,
 * at most every KVC_GPU_REG_RETRY_NS); until then their copies are pageable (staged by the
 * driver: correct, slower). */
#define KVC_GPU_REG_CHUNK (1ull << 30)
#define KVC_GPU_MAX_REG 256
#define KVC_GPU_REG_RETRY_NS 100000000ull

/* Scratch buffers are rounded up to a power of two below this, to multiples of it above. */
#define KVC_GPU_SCRATCH_STEP (16ull << 20)
/* The most device scratch one call stages through (bytes): a scatter, gather or range copy
 * whose staged blocks need more goes in chunks of blocks that fit, each chunk's copy into
 * the scratch and then its kernel queued on the caller's stream, the next chunk reusing the
 * same scratch (stream order starts its copy after the kernel before it has read the
 * scratch). Sized for the whole call, the scratch of a 16k-token prefix of an 8B model's
 * shape was 2 GiB (256 MiB for one KV head's shard), kept in the client's pool until
 * kvc_disconnect(): device memory an engine that sizes its KV cache from the free memory
 * cannot plan for. 64 MiB is 32 of that shape's 2 MiB blocks and about 1.2 ms of PCIe at
 * 54 GB/s, against the few microseconds of the two or three operations a chunk adds; a
 * block larger than this is a chunk of its own. kvci_gpu_stage_cap_set sets another (the
 * tests' small prefixes). */
#define KVC_GPU_STAGE_CAP (64ull << 20)
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
    void *stream; /* borrowed: the stream whose queued work reads it, while borrowed */
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
    uint64_t reg_chunk;                 /* KVC_GPU_REG_CHUNK, or the tests' */
    uint64_t reg_next[KVC_MAX_ARENAS];  /* arena a registered (or given up) below this */
    bool reg_pending;                   /* some mapped arena is not yet */
    uint64_t reg_retry_ns;              /* CLOCK_MONOTONIC of the next look (kvc_gpu_reg_more) */
    struct kvc_gpu_scratch *idle;       /* scratch no queued work reads; freed at disconnect */
    void *ev_idle[KVC_GPU_IDLE_EVENTS]; /* events whose last record has been waited for */
    uint32_t nev_idle;
    struct kern_batch_args *args; /* the tables of the batch being queued, under c->mu */
    uint64_t dma_min;             /* host pieces at least this long go by DMA, not staged */
    uint64_t stage_cap;           /* a call's most staged bytes at once (KVC_GPU_STAGE_CAP) */
};

/* Host blocks go straight to and from the engine's pages, one DMA range per (block, layer,
 * kind, page) piece, where the engine's layout is contiguous (kern_pack_contiguous) and the
 * pieces are at least g->dma_min bytes; shorter ones are staged in device scratch (a block's
 * layers cross as one range) and moved by the gather/scatter kernel. A DMA range has a fixed
 * cost, about half a microsecond of the driver and the copy engines: on the H200 (PCIe,
 * cudaMemcpyBatchAsync) host-tier hits into paged tensors ran at 0.60 to 0.64 of a pinned
 * copy in 32 KiB pieces (two runs; one earlier run 0.98) and 0.23 in 8 KiB ones, staged at
 * 0.97 in both shapes (a put from the pages 0.61 direct, 0.96 staged). So the default is
 * 1 MiB, where a range's fixed cost is a few percent of its transfer (pieces that long are
 * rare: a 16-token page of 8 KV heads of 128 in fp16 is 32 KiB): in practice every host
 * block is staged, in at most KVC_GPU_STAGE_CAP of scratch a call. KVC_GPU_DMA_MIN (bytes,
 * read at kvc_gpu_attach) sets another for a device whose copy engines differ. */
#define KVC_GPU_DMA_MIN (1u << 20)

/* KVC_GPU_DMA_MIN's value: decimal digits only, 1 or more; anything else the default. */
static uint64_t kvc_gpu_dma_min(void)
{
    const char *e = getenv("KVC_GPU_DMA_MIN");
    char *end;
    if (!e || *e < '0' || *e > '9')
        return KVC_GPU_DMA_MIN;
    errno = 0;
    unsigned long long v = strtoull(e, &end, 10);
    return errno || *end || v == 0 ? KVC_GPU_DMA_MIN : (uint64_t)v;
}

/* cudaStreamPerThread's handle value (CUDA's driver_types.h), which this file, built without
 * CUDA's headers, cannot name. */
#define KVC_GPU_STREAM_PER_THREAD ((void *)0x2)

static const struct kern_dev_ops *kvc_gpu_ops_override;
static uint64_t kvc_gpu_stage_cap_override; /* 0: KVC_GPU_STAGE_CAP */
static uint64_t kvc_gpu_reg_chunk_override;  /* 0: KVC_GPU_REG_CHUNK */
/* The process that last attached with this build's own CUDA table (0: none): a process that
 * forks clients must not have started CUDA itself (tests check it, kvci_gpu_cuda_used). */
static pid_t kvc_gpu_cuda_pid;

void kvci_gpu_ops_set(const struct kern_dev_ops *ops)
{
    kvc_gpu_ops_override = ops;
}

const struct kern_dev_ops *kvci_gpu_ops_get(void)
{
    return kvc_gpu_ops_override;
}

void kvci_gpu_stage_cap_set(uint64_t bytes)
{
    kvc_gpu_stage_cap_override = bytes;
}

void kvci_gpu_reg_chunk_set(uint64_t bytes)
{
    kvc_gpu_reg_chunk_override = bytes;
}

int kvci_gpu_cuda_used(void)
{
    pid_t pid = __atomic_load_n(&kvc_gpu_cuda_pid, __ATOMIC_RELAXED);
    return pid != 0 && pid == getpid();
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

/* Rounds a scratch request up so that a pool serving similar calls stops growing at once,
 * to at most the larger of need and most (the staging cap). */
static uint64_t kvc_gpu_scratch_cap(uint64_t need, uint64_t most)
{
    uint64_t cap = 1ull << 16, top = need > most ? need : most;
    if (need > KVC_GPU_SCRATCH_STEP)
        cap = (need + KVC_GPU_SCRATCH_STEP - 1) / KVC_GPU_SCRATCH_STEP * KVC_GPU_SCRATCH_STEP;
    while (cap < need)
        cap <<= 1;
    return cap < top ? cap : top;
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
        s->cap = kvc_gpu_scratch_cap(len, g->stage_cap);
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
static int kvc_gpu_copy_range(kvc_lease *l, size_t first, size_t n, void *dst, void *stream,
                              int dev_only);
static int kvc_gpu_lease_copy(kvc_lease *l, size_t i, void *dst, int kind, void *stream);
static int kvc_gpu_lease_decode(kvc_lease *l, size_t i, void *dst, void *stream);
static void kvc_gpu_arena_mapped(kvc_client *c, struct kvc_arena *a);

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
    free(g->args);
    free(g);
    c->gpu = NULL;
    c->gpu_base = NULL;
}

static const struct kvc_gpu_hooks kvc_gpu_hooks = {
    .wait = kvc_gpu_wait,
    .copy_sync = kvc_gpu_copy_sync,
    .lease_copy = kvc_gpu_lease_copy,
    .lease_decode = kvc_gpu_lease_decode,
    .arena_mapped = kvc_gpu_arena_mapped,
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

/* Pins arena a for DMA, the chunks the daemon has faulted in that are not yet, at most `max`
 * of them; a failure only costs speed (pageable copies: the driver stages them, and the call
 * lasts about as long as its copy). Caller holds c->mu. */
/* Whether every page of [p, p + len) is resident (the daemon's fault-in has been there):
 * what kvcd says in its index lags by up to a second. */
static bool kvc_gpu_resident(const uint8_t *p, uint64_t len)
{
    const uint64_t page = 4096;
    unsigned char vec[4096];
    for (uint64_t off = 0; off < len;) {
        uint64_t n = (len - off + page - 1) / page;
        n = n > sizeof(vec) ? sizeof(vec) : n;
        if (mincore((void *)(p + off), n * page, vec) != 0)
            return false;
        for (uint64_t i = 0; i < n; i++)
            if (!(vec[i] & 1))
                return false;
        off += n * page;
    }
    return true;
}

static void kvc_gpu_register_arena(kvc_client *c, struct kvc_gpu *g, uint32_t a, uint32_t max)
{
    const struct kvc_arena *ar = &c->arenas[a];
    if (!ar->base || g->reg_next[a] >= ar->size)
        return;
    uint64_t faulted = kvci_fast_faulted(c, a);
    for (uint32_t n = 0; n < max && g->reg_next[a] < ar->size && g->nreg < KVC_GPU_MAX_REG; n++) {
        uint64_t off = g->reg_next[a];
        uint64_t len = ar->size - off < g->reg_chunk ? ar->size - off : g->reg_chunk;
        if ((len > faulted || off > faulted - len) && !kvc_gpu_resident(ar->base + off, len))
            break; /* the daemon has not faulted it all in yet: a later call */
        int rc = g->ops->host_register(ar->base + off, len, !ar->writable);
        g->reg_next[a] = off + len;
        if (rc == 0)
            g->reg[g->nreg++] = ar->base + off;
        else if (rc == -ENOTSUP)
            g->reg_next[a] = ar->size; /* read-only registration unsupported: all pageable */
    }
    if (g->reg_next[a] < ar->size && g->nreg < KVC_GPU_MAX_REG)
        g->reg_pending = true;
}

static uint64_t kvc_gpu_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* From a GPU call: one more chunk of the arenas the daemon was still faulting in when they
 * were registered, if it has faulted it in since (looked at every KVC_GPU_REG_RETRY_NS at
 * most). Caller holds c->mu. */
static void kvc_gpu_reg_more(kvc_client *c, struct kvc_gpu *g)
{
    if (!g || !g->reg_pending)
        return;
    uint64_t now = kvc_gpu_mono_ns();
    if (now < g->reg_retry_ns)
        return;
    g->reg_retry_ns = now + KVC_GPU_REG_RETRY_NS;
    g->reg_pending = false;
    uint32_t before = g->nreg;
    for (uint32_t a = 0; a < KVC_MAX_ARENAS; a++)
        kvc_gpu_register_arena(c, g, a, g->nreg == before ? 1 : 0);
}

/* Pins every mapped arena for DMA (at the attach; kvc_gpu_arena_mapped those mapped later). */
static void kvc_gpu_register(kvc_client *c, struct kvc_gpu *g)
{
    for (uint32_t a = 0; a < KVC_MAX_ARENAS; a++)
        kvc_gpu_register_arena(c, g, a, UINT32_MAX);
}

/* An arena mapped after the attach (kvc_ns_open of a namespace in another arena): pinned as
 * the attach pinned those before it, else its hits would cross from pageable memory. */
static void kvc_gpu_arena_mapped(kvc_client *c, struct kvc_arena *a)
{
    kvc_gpu_register_arena(c, kvc_gpu_of(c), (uint32_t)(a - c->arenas), UINT32_MAX);
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
    g->dma_min = kvc_gpu_dma_min();
    g->stage_cap = kvc_gpu_stage_cap_override ? kvc_gpu_stage_cap_override : KVC_GPU_STAGE_CAP;
    g->reg_chunk = kvc_gpu_reg_chunk_override ? kvc_gpu_reg_chunk_override : KVC_GPU_REG_CHUNK;
    if (!kvc_gpu_ops_override) /* clients of several threads may attach at once */
        __atomic_store_n(&kvc_gpu_cuda_pid, getpid(), __ATOMIC_RELAXED);
    g->pool.fd = -1;
    g->args = malloc(sizeof(*g->args));
    if (!g->args) {
        free(g);
        rc = -ENOMEM;
        goto out;
    }
    if (!g->ops || g->ops->device_count() <= 0 || g->ops->device_get(&g->device) ||
        g->ops->stream_new(g->device, &g->stream)) {
        free(g->args);
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
    struct kvc_gpu_scratch *t = w->scratch;
    uint32_t i = 0;
    int rc;
    while (t && t != s)
        t = t->next;
    if (s && !t) { /* not w's already (kvc_gpu_stage) */
        s->stream = stream;
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
    int rc = kvc_gpu_of(c)->ops->copy_async(dst, l->hits[i].data, l->ns->block_bytes, kind, stream);
    if (rc == 0)
        rc = kvc_gpu_track(c, &l->gpu, NULL, stream);
    return rc;
}

static int kvc_gpu_lease_copy(kvc_lease *l, size_t i, void *dst, int kind, void *stream)
{
    kvc_client *c = l->ns->c;
    pthread_mutex_lock(&c->mu);
    kvc_gpu_reg_more(c, kvc_gpu_of(c));
    int rc = kvc_gpu_lease_copy_locked(l, i, dst, kind, stream);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int kvc_gpu_lease_decode(kvc_lease *l, size_t i, void *dst, void *stream)
{
    return kvc_gpu_copy_range(l, i, 1, dst, stream, 1);
}

/*
 * A quantized hit is never handed out as it is stored. Into device memory it crosses in its
 * stored size to a pooled device scratch and is decoded there by one kernel for all such hits
 * of the call (kvc_gpu_copy_range), tracked on the lease like a raw copy; into host memory it
 * is decoded on the CPU, in place.
 */
KVC_API int kvc_lease_copy_async(kvc_lease *l, size_t i, void *dst, size_t len, void *stream)
{
    if (!l || !dst)
        return -EINVAL;
    if (i >= l->n)
        return -ERANGE;
    if (len < l->ns->block_bytes)
        return -EINVAL;
    if (!l->ns->c->gpu)
        return -ENOTSUP;
    return kvc_gpu_copy_range(l, i, 1, dst, stream, 0);
}

KVC_API int kvc_lease_copy_range_async(kvc_lease *l, size_t first, size_t n, void *dst, size_t len,
                                       void *stream)
{
    if (!l || !dst)
        return -EINVAL;
    if (first > l->n || n > l->n - first)
        return -ERANGE;
    if (n == 0)
        return 0;
    if (n > INT32_MAX || len / l->ns->block_bytes < n)
        return -EINVAL;
    if (!l->ns->c->gpu)
        return -ENOTSUP;
    int rc = kvc_gpu_copy_range(l, first, n, dst, stream, 0);
    return rc ? rc : (int)n;
}

KVC_API int kvc_resv_write_async(kvc_resv *r, size_t i, const void *src, size_t len, void *stream)
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
    kvc_gpu_reg_more(c, kvc_gpu_of(c));
    rc = kvc_gpu_of(c)->ops->copy_async(r->slots[i].data, src, len, KERN_DEV_COPY_DEFAULT, stream);
    if (rc == 0)
        rc = kvc_gpu_track(c, &r->gpu, NULL, stream);
    pthread_mutex_unlock(&c->mu);
    return rc ? rc : kvci_resv_layers_mark(r, i, 1, 0, r->ns->layout.layers);
}

KVC_API int kvc_reserve_gpu(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                            size_t n, kvc_resv **out)
{
    return kvci_reserve_flags(ns, parent, keys, n, KVC_RESERVE_F_GPU, out);
}

/* ---- batched moves: a prefix in a bounded number of device operations -------------------
 *
 * A load or put of n blocks queues at most: one copy batch to or from host memory (the host
 * hits or slots, staged in one device scratch), one device-to-device copy batch (a range copy
 * of pool hits), one gather or scatter kernel (every raw block of the call), one decode kernel
 * (every lossy block of the call, decoded straight into the destination), and one event
 * record — whatever n is (kern_batch.h: the kernels take their tables by value, so nothing
 * else is queued; more than KERN_COPY_BATCH_MAX pieces, or tables beyond one launch's
 * parameters, are split). A block a batch does not move is a NULL in its table.
 */

static int kvc_gpu_layout(const kvc_ns *ns, struct kern_pack_layout *lay)
{
    static const uint32_t elem[] = {[KVC_DTYPE_FP16] = 2,
                                    [KVC_DTYPE_BF16] = 2,
                                    [KVC_DTYPE_FP32] = 4,
                                    [KVC_DTYPE_FP8_E4M3] = 1,
                                    [KVC_DTYPE_INT8] = 1};
    const struct kvc_wire_layout *w = &ns->layout;
    if (w->dtype == 0 || w->dtype >= sizeof(elem) / sizeof(elem[0]))
        return -EINVAL;
    *lay = (struct kern_pack_layout){.layers = w->layers,
                                     .kinds = kvc_wire_layout_kinds(w),
                                     .block_tokens = w->block_tokens,
                                     .heads = w->kv_heads,
                                     .head_dim = w->head_dim,
                                     .elem_bytes = elem[w->dtype]};
    return kern_pack_block_bytes(lay) == ns->block_bytes ? 0 : -EINVAL;
}

static void kvc_gpu_kern_layout(const kvc_ns *ns, struct kern_layout *kl)
{
    *kl = (struct kern_layout){.layers = ns->layout.layers,
                               .heads = ns->layout.kv_heads,
                               .head_dim = ns->layout.head_dim,
                               .tokens = ns->layout.block_tokens,
                               .dtype = ns->layout.dtype,
                               .k_only = ns->layout.kv_kind == KVC_WIRE_KV_KIND_K_ONLY};
}

/* The engine's tensors of layers [lf, ...): kv's own arrays, advanced. */
static void kvc_gpu_engine(const struct kvc_paged_kv *kv, uint32_t lf, struct kern_pack_engine *e)
{
    *e = (struct kern_pack_engine){.k = kv->k + lf,
                                   .v = kv->v ? kv->v + lf : NULL,
                                   .block_table = kv->block_table,
                                   .table_len = kv->table_len,
                                   .page_tokens = kv->page_tokens,
                                   .page_stride = kv->page_stride,
                                   .token_stride = kv->token_stride,
                                   .head_stride = kv->head_stride};
}

/* Bytes of lossy hit h as stored: -EBADMSG unless it is an encoded block of ns's layout (the
 * kernel checks the header again on the device and writes zeros for a block it cannot
 * decode: what crosses may have been changed by a writer of the arena since). */
static int64_t kvc_gpu_enc_len(const kvc_ns *ns, const struct kvc_hit *h)
{
    struct kern_layout kl, bl;
    kvc_gpu_kern_layout(ns, &kl);
    int64_t n = kern_block_info(h->data, h->len, &bl, NULL);
    if (n <= 0 || (uint64_t)n > h->len || bl.layers != kl.layers || bl.heads != kl.heads ||
        bl.head_dim != kl.head_dim || bl.tokens != kl.tokens || bl.k_only != kl.k_only ||
        bl.dtype != kl.dtype)
        return -EBADMSG;
    return n;
}

#define KVC_GPU_ALIGN(x) (((x) + 255) & ~(uint64_t)255)

/* Host arrays of one call: copy pieces (up to n of each direction) and a batch's tables. */
struct kvc_gpu_plan {
    void **dst;
    const void **src;
    uint64_t *len;
    uint32_t npieces;
    void **ddst; /* device to device */
    const void **dsrc;
    uint64_t *dlen;
    uint32_t nd;
    void **blocks;    /* raw blocks of a gather or scatter, NULL: not in that batch */
    const void **enc; /* lossy blocks staged on the device, NULL: not in the decode */
    uint64_t *enc_len;
    uint32_t *pos;   /* range copy: position of each decoded block */
    uint64_t *stage; /* device scratch block j stages through (aligned; 0: none) */
    uint32_t nraw, nenc;
    void *mem;
};

static int kvc_gpu_plan_new(struct kvc_gpu_plan *p, size_t n)
{
    size_t per = 3 * sizeof(void *) + 2 * sizeof(uint64_t) + 3 * sizeof(void *) +
                 2 * sizeof(uint64_t) + sizeof(uint32_t) + sizeof(void *);
    memset(p, 0, sizeof(*p));
    uint8_t *m = calloc(n ? n : 1, per);
    if (!m)
        return -ENOMEM;
    p->mem = m;
    p->dst = (void **)m;
    p->src = (const void **)(p->dst + n);
    p->ddst = (void **)(p->src + n);
    p->dsrc = (const void **)(p->ddst + n);
    p->blocks = (void **)(p->dsrc + n);
    p->enc = (const void **)(p->blocks + n);
    p->len = (uint64_t *)(p->enc + n);
    p->dlen = p->len + n;
    p->enc_len = p->dlen + n;
    p->stage = p->enc_len + n;
    p->pos = (uint32_t *)(p->stage + n);
    return 0;
}

/* The chunk of a staged call that starts at block j0: its end, the blocks after j0 whose
 * staged bytes (stage[]) still fit cap together (a block over cap alone is a chunk), their
 * bytes in *bytes (bytes NULL: not wanted). A call that stages nothing is one chunk. */
static size_t kvc_gpu_chunk(const uint64_t *stage, size_t j0, size_t n, uint64_t cap,
                            uint64_t *bytes)
{
    uint64_t sum = stage[j0];
    size_t j = j0 + 1;
    while (j < n && sum + stage[j] <= cap)
        sum += stage[j++];
    if (bytes)
        *bytes = sum;
    return j;
}

/* The scratch the chunks of n blocks need: the largest chunk's bytes. */
static uint64_t kvc_gpu_chunks_max(const uint64_t *stage, size_t n, uint64_t cap)
{
    uint64_t most = 0;
    for (size_t j = 0; j < n;) {
        uint64_t b = 0;
        j = kvc_gpu_chunk(stage, j, n, cap, &b);
        most = b > most ? b : most;
    }
    return most;
}

static void kvc_gpu_piece(struct kvc_gpu_plan *p, void *dst, const void *src, uint64_t len)
{
    p->dst[p->npieces] = dst;
    p->src[p->npieces] = src;
    p->len[p->npieces++] = len;
}

/* A DMA batch to or from the host is queued in calls of at most this many ranges, the first
 * KVC_GPU_DMA_FIRST, doubling up to KVC_GPU_DMA_CHUNK. The driver takes about half a
 * microsecond of the calling thread per range (H200, 32 KiB ranges: 8 ms for the 16k ranges of
 * a 4k-token 8B prefix, 41 ms for 64k) and the copy engines start on a call's ranges only
 * once it has taken them all: one call of every range put its whole submission before the
 * first byte moved (a 4k-token host load at 1.39 x the pinned copy of its bytes, 16k tokens at
 * 1.42 to 1.88 x), calls of 1,024 ranges overlap the copies with the submission of the next
 * (1.09 x and 1.06 x). The first call is smaller so that the copies start sooner (about
 * 0.25 ms of submission); up to KVC_GPU_DMA_FIRST ranges stay one call, as before. */
#define KVC_GPU_DMA_FIRST 512
#define KVC_GPU_DMA_CHUNK 1024
_Static_assert(KVC_GPU_DMA_CHUNK <= KERN_DMA_BATCH_MAX, "a DMA call's bound");

/* Queues n pieces of one kind: KERN_COPY_BATCH_MAX (device to device) per operation, or (to
 * or from the host) in calls of KVC_GPU_DMA_FIRST growing to KVC_GPU_DMA_CHUNK pieces. */
static int kvc_gpu_copies(const struct kern_dev_ops *ops, void **dst, const void **src,
                          const uint64_t *len, uint64_t n, int kind, void *stream)
{
    const int d2d = kind == KERN_DEV_COPY_D2D;
    uint64_t max = d2d ? KERN_COPY_BATCH_MAX : KVC_GPU_DMA_FIRST;
    for (uint64_t i = 0, m; i < n; i += m) {
        m = n - i < max ? n - i : max;
        int rc = ops->copy_batch(dst + i, (const void *const *)(src + i), len + i, (uint32_t)m,
                                 kind, stream);
        if (rc)
            return rc;
        if (!d2d)
            max = max * 2 < KVC_GPU_DMA_CHUNK ? max * 2 : KVC_GPU_DMA_CHUNK;
    }
    return 0;
}

struct kvc_gpu_run {
    const struct kern_dev_ops *ops;
    void *stream;
};

static int kvc_gpu_run_batch(const struct kern_batch_args *a, void *arg)
{
    struct kvc_gpu_run *r = arg;
    return r->ops->batch(a, r->stream);
}

/* A scratch of len bytes for a call on stream tracked on w, when len > 0: one w holds for
 * earlier work on the same stream if it is large enough (stream order puts this call's
 * copies into it after that work has read it: a lease's loads, one after another, stage
 * through one buffer), else one of the pool's. Caller holds c->mu. */
static int kvc_gpu_stage(struct kvc_gpu *g, struct kvc_gpu_work *w, void *stream, uint64_t len,
                         struct kvc_gpu_scratch **s)
{
    *s = NULL;
    /* cudaStreamPerThread's handle names another stream in each thread: never reused */
    for (struct kvc_gpu_scratch *t = w->scratch; len && stream != KVC_GPU_STREAM_PER_THREAD && t;
         t = t->next)
        if (t->stream == stream && t->cap >= len) {
            *s = t;
            return 0;
        }
    return len ? kvc_gpu_scratch_take(g, len, 0, s) : 0;
}

/*
 * Hits [first, first+n) of l into dst (block j at dst + j * block size), queued on stream and
 * tracked on the lease. Into device memory (or any dst when dev_only): pool hits as one
 * device-to-device batch, raw host hits as one host-to-device batch straight into dst, lossy
 * host hits crossing in their stored size to a scratch (in the same batch) and decoded by one
 * kernel — per chunk of g->stage_cap staged bytes: the raw hits go with the first chunk's
 * batch, each later chunk is a batch and a kernel of its own. Into host memory: raw hits as
 * one batch of the default kind, lossy hits decoded on the CPU before the call returns.
 */
static int kvc_gpu_copy_range(kvc_lease *l, size_t first, size_t n, void *dst, void *stream,
                              int dev_only)
{
    kvc_client *c = l->ns->c;
    struct kvc_gpu *g = kvc_gpu_of(c);
    const struct kern_dev_ops *ops = g->ops;
    const uint64_t bb = l->ns->block_bytes;
    struct kvc_gpu_scratch *s = NULL;
    struct kvc_gpu_plan p;
    struct kern_layout kl;
    int rc, dev = dev_only || ops->pointer_device(dst) >= 0;
    kvc_gpu_kern_layout(l->ns, &kl);
    if (kvc_gpu_plan_new(&p, n))
        return -ENOMEM;
    /* Everything that can be refused is, before anything is queued; the stored lengths are
     * read once (a writer of the arena may change the header after this). */
    for (size_t j = 0; j < n; j++) {
        const struct kvc_hit *h = &l->hits[first + j];
        if (h->format == KVC_WIRE_FORMAT_RAW)
            continue;
        int64_t e = h->tier == KVC_WIRE_TIER_GPU ? -ENOTSUP /* the pool holds raw blocks */
                                                 : kvc_gpu_enc_len(l->ns, h);
        if (e < 0) {
            free(p.mem);
            return (int)e;
        }
        p.enc_len[j] = (uint64_t)e;
        p.stage[j] = dev ? KVC_GPU_ALIGN((uint64_t)e) : 0;
    }
    if (!dev) {
        /* Host memory: a lossy hit is decoded right there, now. */
        for (size_t j = 0; j < n; j++) {
            if (l->hits[first + j].format == KVC_WIRE_FORMAT_RAW)
                continue;
            rc = kvc_lease_copy(l, first + j, (uint8_t *)dst + j * bb, bb);
            if (rc) {
                free(p.mem);
                return rc == -EINVAL ? -EBADMSG : rc;
            }
        }
    }
    pthread_mutex_lock(&c->mu);
    kvc_gpu_reg_more(c, g);
    rc = kvc_gpu_stage(g, &l->gpu, stream, kvc_gpu_chunks_max(p.stage, n, g->stage_cap), &s);
    for (size_t j = 0; rc == 0 && j < n; j++) {
        const struct kvc_hit *h = &l->hits[first + j];
        uint8_t *to = (uint8_t *)dst + j * bb;
        if (h->format == KVC_WIRE_FORMAT_RAW && h->tier == KVC_WIRE_TIER_GPU && dev) {
            p.ddst[p.nd] = to;
            p.dsrc[p.nd] = h->data;
            p.dlen[p.nd++] = bb;
        } else if (h->format == KVC_WIRE_FORMAT_RAW) {
            kvc_gpu_piece(&p, to, h->data, bb);
        }
    }
    int queued = 0;
    if (rc == 0 && p.nd) {
        rc = kvc_gpu_copies(ops, p.ddst, p.dsrc, p.dlen, p.nd, KERN_DEV_COPY_D2D, stream);
        queued = 1;
    }
    for (size_t j0 = 0, j1; rc == 0 && j0 < n; j0 = j1) {
        uint64_t off = 0;
        j1 = kvc_gpu_chunk(p.stage, j0, n, g->stage_cap, NULL);
        if (j0) /* the raw pieces went with the first chunk's batch */
            p.npieces = 0;
        p.nenc = 0;
        uint32_t codecs = 0; /* the chunk's lossy formats: the decode kernel's hint */
        for (size_t j = j0; dev && j < j1; j++) {
            const struct kvc_hit *h = &l->hits[first + j];
            if (h->format == KVC_WIRE_FORMAT_RAW)
                continue;
            codecs |= h->format < 32 ? 1u << h->format : 0;
            uint64_t e = p.enc_len[j]; /* j >= nenc: the packed entries trail the indices */
            uint8_t *at = s->dev + off;
            kvc_gpu_piece(&p, at, h->data, e);
            p.enc[p.nenc] = at;
            p.enc_len[p.nenc] = e;
            p.pos[p.nenc++] = (uint32_t)j;
            off += KVC_GPU_ALIGN(e);
        }
        if (p.npieces) {
            rc = kvc_gpu_copies(ops, p.dst, p.src, p.len, p.npieces,
                                dev ? KERN_DEV_COPY_H2D : KERN_DEV_COPY_DEFAULT, stream);
            queued = 1;
        }
        for (uint32_t i = 0; rc == 0 && i < p.nenc; i += KERN_COPY_BATCH_MAX) {
            uint32_t m = p.nenc - i < KERN_COPY_BATCH_MAX ? p.nenc - i : KERN_COPY_BATCH_MAX;
            rc = kern_batch_decode_raw(g->args, &kl, dst, p.pos + i, m, p.enc + i, p.enc_len + i,
                                       kl.dtype);
            /* whole blocks into a buffer, as kern_decode_cuda decodes one: the kernel of the
             * hint's codecs, a ROT block's without the ROT key rounds (slower there) */
            g->args->h.kivik = kern_decode_cols(codecs) & ~KERN_BATCH_COLS_ROT;
            if (rc == 0)
                rc = ops->batch(g->args, stream);
            queued = 1;
        }
    }
    if (queued || s) {
        int trc = kvc_gpu_track(c, &l->gpu, s, stream);
        rc = rc ? rc : trc;
    }
    pthread_mutex_unlock(&c->mu);
    free(p.mem);
    return rc;
}

/* The direct host <-> engine pieces of a scatter or gather: host[j] the host block of j (NULL:
 * not one), its pieces in r (eptr: the engine's side, bptr: the host's). */
struct kvc_gpu_runs {
    void **host;
    void **eptr, **bptr;
    uint64_t *len;
    uint64_t cap, n;
    uint64_t dma_min; /* the pieces' least length */
    void *mem;
};

/* Whether the host blocks of a move of n blocks can go direct, and room for their pieces:
 * 1 (r ready), 0 (stage them), or -ENOMEM. */
static int kvc_gpu_runs_new(struct kvc_gpu_runs *r, uint64_t dma_min,
                            const struct kern_pack_layout *sub, const struct kern_pack_engine *e,
                            uint64_t first_token, size_t n)
{
    memset(r, 0, sizeof(*r));
    int64_t cap =
        kern_pack_runs(sub, e, first_token, (uint32_t)n, NULL, dma_min, NULL, NULL, NULL, 0);
    if (cap < 0)
        return 0;
    r->cap = (uint64_t)cap;
    r->mem = calloc(n + 3 * r->cap + 1, sizeof(void *));
    if (!r->mem)
        return -ENOMEM;
    r->host = r->mem;
    r->eptr = r->host + n;
    r->bptr = r->eptr + r->cap;
    r->len = (uint64_t *)(r->bptr + r->cap);
    r->dma_min = dma_min;
    return 1;
}

/* Fills r's pieces from r->host; 0 or a negative errno. */
static int kvc_gpu_runs_fill(struct kvc_gpu_runs *r, const struct kern_pack_layout *sub,
                             const struct kern_pack_engine *e, uint64_t first_token, size_t n)
{
    int64_t m = kern_pack_runs(sub, e, first_token, (uint32_t)n, r->host, r->dma_min, r->eptr,
                               r->bptr, r->len, r->cap);
    if (m < 0)
        return (int)m;
    r->n = (uint64_t)m;
    return 0;
}

/* Checks shared by scatter and gather: the layout, the layer range and the engine's shape
 * against the tokens of n blocks from first_token. Fills *lay (whole blocks), *sub (the
 * layers moved) and *e (their tensors). */
static int kvc_gpu_check(const kvc_ns *ns, const struct kvc_paged_kv *kv, uint64_t first_token,
                         size_t n, uint32_t lf, uint32_t lc, struct kern_pack_layout *lay,
                         struct kern_pack_layout *sub, struct kern_pack_engine *e)
{
    int rc = kvc_gpu_layout(ns, lay);
    if (rc)
        return rc;
    if (lc == 0 || !kv->k || !kv->block_table)
        return -EINVAL;
    if (lf >= lay->layers || lc > lay->layers - lf)
        return -ERANGE;
    if (n > UINT32_MAX)
        return -EINVAL;
    *sub = *lay;
    sub->layers = lc;
    kvc_gpu_engine(kv, lf, e);
    return kern_pack_check(sub, e, first_token, (uint32_t)n, 1);
}

KVC_API int kvc_lease_scatter_layers(kvc_lease *l, size_t first, size_t n,
                                     const struct kvc_paged_kv *kv, uint64_t first_token,
                                     uint32_t layer_first, uint32_t layer_count, void *stream,
                                     void *event)
{
    struct kern_pack_layout lay, sub;
    struct kern_pack_engine e;
    struct kvc_gpu_scratch *s = NULL;
    struct kvc_gpu_plan p;
    struct kern_layout kl;
    uint8_t *dec = NULL;
    kvc_client *c;
    int rc;
    if (!l || !kv)
        return -EINVAL;
    if (first > l->n || n > l->n - first)
        return -ERANGE;
    c = l->ns->c;
    rc = kvc_gpu_check(l->ns, kv, first_token, n, layer_first, layer_count, &lay, &sub, &e);
    if (rc || n == 0)
        return rc;
    const uint64_t bb = l->ns->block_bytes, lbytes = bb / lay.layers;
    const uint64_t from = (uint64_t)layer_first * lbytes, rbytes = (uint64_t)layer_count * lbytes;
    kvc_gpu_kern_layout(l->ns, &kl);
    if (kv->on_device && !c->gpu)
        return -ENOTSUP;
    if (kvc_gpu_plan_new(&p, n))
        return -ENOMEM;
    /* Raw host hits into device tensors of a contiguous layout: straight into the pages. */
    struct kvc_gpu_runs runs;
    size_t nhost = 0;
    for (size_t j = 0; j < n; j++)
        nhost += l->hits[first + j].format == KVC_WIRE_FORMAT_RAW &&
                 l->hits[first + j].tier != KVC_WIRE_TIER_GPU;
    int direct = kv->on_device && nhost
                     ? kvc_gpu_runs_new(&runs, kvc_gpu_of(c)->dma_min, &sub, &e, first_token, n)
                     : 0;
    if (direct < 0) {
        free(p.mem);
        return direct;
    }
    if (!direct)
        memset(&runs, 0, sizeof(runs));
    /* Everything that can be refused is, before anything is queued; the stored lengths are
     * read once (a writer of the arena may change the header after this). */
    size_t nlossy = 0;
    for (size_t j = 0; j < n && rc == 0; j++) {
        const struct kvc_hit *h = &l->hits[first + j];
        if (h->tier == KVC_WIRE_TIER_GPU && (!kv->on_device || h->format != KVC_WIRE_FORMAT_RAW)) {
            rc = -ENOTSUP; /* pool hits are device memory, and raw */
        } else if (h->format != KVC_WIRE_FORMAT_RAW) {
            int64_t len = kvc_gpu_enc_len(l->ns, h);
            if (len < 0)
                rc = (int)len;
            p.enc_len[j] = len < 0 ? 0 : (uint64_t)len;
            p.stage[j] = KVC_GPU_ALIGN(p.enc_len[j]);
            nlossy++;
        } else if (h->tier != KVC_WIRE_TIER_GPU && !direct) {
            p.stage[j] = KVC_GPU_ALIGN(rbytes);
        }
    }
    if (rc)
        goto out;
    if (!kv->on_device) {
        /* Host tensors: a CPU copy; a lossy hit decoded on the CPU into a private block. */
        if (nlossy && !(dec = malloc(nlossy * bb))) {
            rc = -ENOMEM;
            goto out;
        }
        for (size_t j = 0, k = 0; j < n && rc == 0; j++) {
            const struct kvc_hit *h = &l->hits[first + j];
            if (h->format == KVC_WIRE_FORMAT_RAW) {
                p.blocks[j] = (uint8_t *)h->data + from;
                continue;
            }
            rc = kvc_lease_copy(l, first + j, dec + k * bb, bb);
            rc = rc == -EINVAL ? -EBADMSG : rc;
            p.blocks[j] = dec + k++ * bb + from;
        }
        if (rc == 0)
            rc = kern_pack_cpu(&sub, &e, first_token, (uint32_t)n, p.blocks, KERN_PACK_SCATTER);
        goto out;
    }
    struct kvc_gpu *g = kvc_gpu_of(c);
    struct kvc_gpu_run run = {g->ops, stream};
    pthread_mutex_lock(&c->mu);
    kvc_gpu_reg_more(c, g);
    rc = kvc_gpu_stage(g, &l->gpu, stream, kvc_gpu_chunks_max(p.stage, n, g->stage_cap), &s);
    for (size_t j = 0; rc == 0 && direct && j < n; j++) {
        const struct kvc_hit *h = &l->hits[first + j];
        if (h->format == KVC_WIRE_FORMAT_RAW && h->tier != KVC_WIRE_TIER_GPU)
            runs.host[j] = (uint8_t *)h->data + from; /* by DMA into the pages */
    }
    int queued = 0;
    if (rc == 0 && direct)
        rc = kvc_gpu_runs_fill(&runs, &sub, &e, first_token, n);
    if (rc == 0 && runs.n) {
        /* one batched DMA: each host section into its page */
        rc = kvc_gpu_copies(g->ops, runs.eptr, (const void **)runs.bptr, runs.len, runs.n,
                            KERN_DEV_COPY_H2D, stream);
        queued = 1;
    }
    /* The staged blocks, a chunk at a time: its copy into the scratch, then its kernels. */
    for (size_t j0 = 0, j1; rc == 0 && j0 < n; j0 = j1) {
        uint64_t off = 0;
        j1 = kvc_gpu_chunk(p.stage, j0, n, g->stage_cap, NULL);
        const uint64_t tok = first_token + (uint64_t)j0 * lay.block_tokens;
        uint32_t codecs = 0; /* the chunk's lossy formats: the decode kernel's hint */
        p.npieces = p.nraw = p.nenc = 0;
        for (size_t j = j0; j < j1; j++) {
            const struct kvc_hit *h = &l->hits[first + j];
            if (h->format == KVC_WIRE_FORMAT_RAW && h->tier == KVC_WIRE_TIER_GPU) {
                p.blocks[j] = (uint8_t *)h->data + from; /* straight from the pool */
                p.nraw++;
            } else if (h->format == KVC_WIRE_FORMAT_RAW && direct) {
                continue; /* by DMA, above */
            } else if (h->format == KVC_WIRE_FORMAT_RAW) {
                /* the layers moved, staged: they cross once, the kernel reads them there */
                p.blocks[j] = s->dev + off;
                kvc_gpu_piece(&p, s->dev + off, h->data + from, rbytes);
                off += KVC_GPU_ALIGN(rbytes);
                p.nraw++;
            } else {
                p.enc[j] = s->dev + off;
                kvc_gpu_piece(&p, s->dev + off, h->data, p.enc_len[j]);
                off += KVC_GPU_ALIGN(p.enc_len[j]);
                codecs |= h->format < 32 ? 1u << h->format : 0;
                p.nenc++;
            }
        }
        if (p.npieces) {
            rc = kvc_gpu_copies(g->ops, p.dst, p.src, p.len, p.npieces, KERN_DEV_COPY_H2D, stream);
            queued = 1;
        }
        if (rc == 0 && p.nraw) {
            rc = kern_pack_batches(g->args, &sub, &e, tok, (uint32_t)(j1 - j0), p.blocks + j0,
                                   KERN_PACK_SCATTER, kvc_gpu_run_batch, &run);
            queued = 1;
        }
        if (rc == 0 && p.nenc) {
            /* lossy hits: decoded straight into the engine's tensors, one kernel */
            rc = kern_decode_batches(g->args, &kl, layer_first, layer_count, &e, tok,
                                     (uint32_t)(j1 - j0), p.enc + j0, p.enc_len + j0, kl.dtype,
                                     codecs, kvc_gpu_run_batch, &run);
            queued = 1;
        }
    }
    if (queued || s) {
        int trc = kvc_gpu_track(c, &l->gpu, s, stream);
        rc = rc ? rc : trc;
    }
    if (rc == 0 && event)
        rc = g->ops->event_record(event, stream);
    pthread_mutex_unlock(&c->mu);
out:
    free(dec);
    free(runs.mem);
    free(p.mem);
    return rc ? rc : (int)n;
}

KVC_API int kvc_lease_scatter(kvc_lease *l, size_t first, size_t n, const struct kvc_paged_kv *kv,
                              uint64_t first_token, void *stream, void *event)
{
    if (!l)
        return -EINVAL;
    return kvc_lease_scatter_layers(l, first, n, kv, first_token, 0, l->ns->layout.layers, stream,
                                    event);
}

KVC_API int kvc_resv_gather_layers(kvc_resv *r, size_t first, size_t n,
                                   const struct kvc_paged_kv *kv, uint64_t first_token,
                                   uint32_t layer_first, uint32_t layer_count, void *stream,
                                   void *event)
{
    struct kern_pack_layout lay, sub;
    struct kern_pack_engine e;
    struct kvc_gpu_scratch *s = NULL;
    struct kvc_gpu_plan p;
    kvc_client *c;
    int rc, written = 0;
    if (!r || !kv)
        return -EINVAL;
    if (first > r->n || n > r->n - first)
        return -ERANGE;
    c = r->ns->c;
    rc = kvc_gpu_check(r->ns, kv, first_token, n, layer_first, layer_count, &lay, &sub, &e);
    if (rc || n == 0)
        return rc;
    if (kv->on_device && !c->gpu)
        return -ENOTSUP;
    const uint64_t bb = r->ns->block_bytes, lbytes = bb / lay.layers;
    const uint64_t from = (uint64_t)layer_first * lbytes, rbytes = (uint64_t)layer_count * lbytes;
    for (size_t j = 0; j < n; j++) {
        if (!r->slots[first + j].data)
            continue;
        if (r->slots[first + j].tier == KVC_WIRE_TIER_GPU && !kv->on_device)
            return -ENOTSUP;
    }
    /* Device tensors of a contiguous layout into host slots: straight from the pages. */
    struct kvc_gpu_runs runs;
    size_t nhost = 0;
    for (size_t j = 0; j < n; j++)
        nhost += r->slots[first + j].data && r->slots[first + j].tier != KVC_WIRE_TIER_GPU;
    int direct = kv->on_device && nhost
                     ? kvc_gpu_runs_new(&runs, kvc_gpu_of(c)->dma_min, &sub, &e, first_token, n)
                     : 0;
    if (direct < 0)
        return direct;
    if (!direct)
        memset(&runs, 0, sizeof(runs));
    if (kvc_gpu_plan_new(&p, n)) {
        free(runs.mem);
        return -ENOMEM;
    }
    for (size_t j = 0; j < n && !direct; j++)
        if (r->slots[first + j].data && r->slots[first + j].tier != KVC_WIRE_TIER_GPU)
            p.stage[j] = KVC_GPU_ALIGN(rbytes);
    if (!kv->on_device) {
        /* Host tensors into host slots: a CPU copy per reserved slot. */
        for (size_t j = 0; j < n && rc == 0; j++) {
            void *blk = r->slots[first + j].data;
            if (!blk)
                continue;
            blk = (uint8_t *)blk + from;
            rc = kern_pack_cpu(&sub, &e, first_token + (uint64_t)j * lay.block_tokens, 1, &blk,
                               KERN_PACK_GATHER);
            written += rc == 0;
        }
        goto out;
    }
    struct kvc_gpu *g = kvc_gpu_of(c);
    struct kvc_gpu_run run = {g->ops, stream};
    pthread_mutex_lock(&c->mu);
    kvc_gpu_reg_more(c, g);
    rc = kvc_gpu_stage(g, &r->gpu, stream, kvc_gpu_chunks_max(p.stage, n, g->stage_cap), &s);
    int queued = 0;
    /* A chunk at a time: its kernel into the scratch, then its copy out of it. */
    for (size_t j0 = 0, j1; rc == 0 && j0 < n; j0 = j1) {
        uint64_t off = 0;
        j1 = kvc_gpu_chunk(p.stage, j0, n, g->stage_cap, NULL);
        p.npieces = p.nraw = 0;
        for (size_t j = j0; j < j1; j++) {
            uint8_t *slot = r->slots[first + j].data;
            if (!slot)
                continue; /* not reserved here: NULL, the kernel leaves it */
            if (r->slots[first + j].tier == KVC_WIRE_TIER_GPU) {
                p.blocks[j] = slot + from; /* straight into the pool */
                p.nraw++;
            } else if (direct) {
                runs.host[j] = slot + from; /* by DMA from the pages */
            } else {
                p.blocks[j] = s->dev + off; /* staged, then one DMA each into the host slot */
                kvc_gpu_piece(&p, slot + from, s->dev + off, rbytes);
                off += KVC_GPU_ALIGN(rbytes);
                p.nraw++;
            }
            written++;
        }
        if (p.nraw) {
            rc = kern_pack_batches(g->args, &sub, &e, first_token + (uint64_t)j0 * lay.block_tokens,
                                   (uint32_t)(j1 - j0), p.blocks + j0, KERN_PACK_GATHER,
                                   kvc_gpu_run_batch, &run);
            queued = 1;
        }
        if (rc == 0 && p.npieces)
            rc = kvc_gpu_copies(g->ops, p.dst, p.src, p.len, p.npieces, KERN_DEV_COPY_D2H, stream);
    }
    if (rc == 0 && direct)
        rc = kvc_gpu_runs_fill(&runs, &sub, &e, first_token, n);
    if (rc == 0 && runs.n) {
        /* one batched DMA: each page's section into its host slot */
        rc = kvc_gpu_copies(g->ops, runs.bptr, (const void **)runs.eptr, runs.len, runs.n,
                            KERN_DEV_COPY_D2H, stream);
        queued = 1;
    }
    if (queued || s) {
        int trc = kvc_gpu_track(c, &r->gpu, s, stream);
        rc = rc ? rc : trc;
    }
    if (rc == 0 && event)
        rc = g->ops->event_record(event, stream);
    pthread_mutex_unlock(&c->mu);
out:
    free(runs.mem);
    free(p.mem);
    if (rc == 0)
        rc = kvci_resv_layers_mark(r, first, n, layer_first, layer_count);
    return rc ? rc : written;
}

KVC_API int kvc_resv_gather(kvc_resv *r, size_t first, size_t n, const struct kvc_paged_kv *kv,
                            uint64_t first_token, void *stream, void *event)
{
    if (!r)
        return -EINVAL;
    return kvc_resv_gather_layers(r, first, n, kv, first_token, 0, r->ns->layout.layers, stream,
                                  event);
}
