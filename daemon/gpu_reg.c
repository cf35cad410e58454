/*
 * gpu_reg.c — the host arenas registered with the device as their fault-in reaches them
 * (see gpu_reg.h).
 */
#include "daemon/gpu_reg.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/log.h"
#include "tiers/gpu.h"
#include "tiers/host.h"

/* How often the thread looks again at a chunk the fault-in has not finished. */
#define GPU_REG_POLL_NS 2000000L

enum { GPU_REG_PENDING = 0, GPU_REG_DONE, GPU_REG_REFUSED };

struct gpu_reg_arena {
    struct tier *host;   /* NULL: not handed over */
    uint64_t next;       /* registered below this offset; the thread's once handed to it */
    uint64_t size;       /* the arena's */
    _Atomic int state;   /* GPU_REG_* */
    _Atomic int err;     /* the refusal (negative errno) */
    bool logged;         /* the loop said what became of it */
};

struct gpu_reg {
    struct tier *gpu;
    uint64_t chunk;
    uint64_t now_bytes; /* registered when handed over, if faulted (gpu_reg_new) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool started;
    bool stop;                            /* under mu */
    uint32_t queue[GPU_REG_MAX_ARENAS]; /* arenas handed to the thread, in order (under mu) */
    uint32_t nqueued, nfinished;        /* under mu */
    struct gpu_reg_arena a[GPU_REG_MAX_ARENAS];
    _Atomic uint64_t bytes;   /* registered */
    _Atomic uint64_t pending; /* handed and neither registered nor refused */
    uint64_t t_start_ns;
    _Atomic uint64_t t_end_ns; /* when the thread finished the last arena it was handed */
    bool logged_end;
    uint32_t refused_logged; /* refusals said (the first is logged) */
};

static uint64_t gpu_reg_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The bytes of the arena's next chunk. */
static uint64_t gpu_reg_len(const struct gpu_reg *r, const struct gpu_reg_arena *ra)
{
    return ra->size - ra->next < r->chunk ? ra->size - ra->next : r->chunk;
}

/* Registers the arena's chunk at ra->next; 0 or the device's refusal (recorded). */
static int gpu_reg_chunk(struct gpu_reg *r, struct gpu_reg_arena *ra)
{
    uint64_t len = gpu_reg_len(r, ra);
    int rc = tier_gpu_host_register(r->gpu, (char *)tier_host_base(ra->host) + ra->next, len);
    /* The arena's state before what is pending: a reader that finds nothing pending finds
     * every arena's verdict. */
    if (rc) {
        atomic_store(&ra->err, rc);
        atomic_store(&ra->state, GPU_REG_REFUSED);
        atomic_fetch_sub(&r->pending, ra->size - ra->next);
        return rc;
    }
    ra->next += len;
    atomic_fetch_add(&r->bytes, len);
    if (ra->next == ra->size)
        atomic_store(&ra->state, GPU_REG_DONE);
    atomic_fetch_sub(&r->pending, len);
    return 0;
}

/* Waits (a poll interval at most) unless stopped; true when stopped. Called with mu held. */
static bool gpu_reg_nap(struct gpu_reg *r)
{
    struct timespec ts;
    if (r->stop)
        return true;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += GPU_REG_POLL_NS;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    (void)pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    return r->stop;
}

static void *gpu_reg_main(void *arg)
{
    struct gpu_reg *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->nfinished == r->nqueued)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop)
            break;
        struct gpu_reg_arena *ra = &r->a[r->queue[r->nfinished]];
        while (ra->next < ra->size) {
            if (r->stop) /* a stop waits for one registration at most */
                goto out;
            if (!tier_host_range_faulted(ra->host, ra->next, gpu_reg_len(r, ra))) {
                if (gpu_reg_nap(r))
                    goto out;
                continue;
            }
            pthread_mutex_unlock(&r->mu); /* the pinning lasts; a stop waits for it */
            int rc = gpu_reg_chunk(r, ra);
            pthread_mutex_lock(&r->mu);
            if (rc)
                break;
        }
        r->nfinished++;
        if (r->nfinished == r->nqueued)
            atomic_store(&r->t_end_ns, gpu_reg_mono_ns());
    }
out:
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

struct gpu_reg *gpu_reg_new(struct tier *gpu, uint64_t chunk, uint64_t now_bytes)
{
    struct gpu_reg *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    if (pthread_mutex_init(&r->mu, NULL)) {
        free(r);
        return NULL;
    }
    if (pthread_cond_init(&r->cv, NULL)) {
        pthread_mutex_destroy(&r->mu);
        free(r);
        return NULL;
    }
    r->gpu = gpu;
    r->chunk = chunk ? chunk : GPU_REG_CHUNK;
    r->now_bytes = now_bytes;
    r->t_start_ns = gpu_reg_mono_ns();
    return r;
}

uint32_t gpu_reg_arena(struct gpu_reg *r, uint32_t a, struct tier *host)
{
    if (a >= GPU_REG_MAX_ARENAS || r->a[a].host)
        return gpu_reg_tick(r);
    struct gpu_reg_arena *ra = &r->a[a];
    ra->host = host;
    ra->size = tier_host_size(host);
    atomic_fetch_add(&r->pending, ra->size);
    /* The chunks the fault-in has already been over, now (what the start faulted in itself),
     * unless the thread is registering: one caller of the device's registration at a time. */
    pthread_mutex_lock(&r->mu);
    bool idle = r->nfinished == r->nqueued;
    pthread_mutex_unlock(&r->mu);
    while (idle && ra->next < ra->size && ra->next < r->now_bytes) {
        if (!tier_host_range_faulted(host, ra->next, gpu_reg_len(r, ra)) || gpu_reg_chunk(r, ra))
            break;
    }
    if (atomic_load(&ra->state) != GPU_REG_PENDING)
        return gpu_reg_tick(r); /* said now: the start's log tells where the arena stands */
    pthread_mutex_lock(&r->mu);
    r->queue[r->nqueued++] = a;
    if (!r->started) {
        if (pthread_create(&r->thread, NULL, gpu_reg_main, r) == 0) {
            r->started = true;
        } else { /* no thread: the rest now, as the pool's opening always did */
            r->nqueued--;
            pthread_mutex_unlock(&r->mu);
            while (ra->next < ra->size && gpu_reg_chunk(r, ra) == 0)
                ;
            return gpu_reg_tick(r);
        }
    }
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return gpu_reg_tick(r);
}

uint32_t gpu_reg_tick(struct gpu_reg *r)
{
    uint32_t refused = 0;
    if (!r)
        return 0;
    for (uint32_t a = 0; a < GPU_REG_MAX_ARENAS; a++) {
        struct gpu_reg_arena *ra = &r->a[a];
        if (atomic_load(&ra->state) != GPU_REG_REFUSED)
            continue;
        refused++;
        if (ra->logged)
            continue;
        ra->logged = true;
        if (r->refused_logged++ == 0)
            log_warn("gpu: host arena %u not registered with the device beyond %llu MiB (%s); "
                     "moves to and from the pool copy through pageable memory there, holding "
                     "the loop for each copy",
                     a, (unsigned long long)(ra->next >> 20), strerror(-atomic_load(&ra->err)));
    }
    uint64_t end = atomic_load(&r->t_end_ns);
    if (!r->logged_end && end && atomic_load(&r->pending) == 0) {
        r->logged_end = true;
        log_info("gpu: host arenas registered with the device: %llu MiB, within %.1f s of the "
                 "pool's opening, each part once the fault-in was over it",
                 (unsigned long long)(atomic_load(&r->bytes) >> 20),
                 (double)(end - r->t_start_ns) / 1e9);
    }
    return refused;
}

void gpu_reg_free(struct gpu_reg *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->started)
        pthread_join(r->thread, NULL);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

void gpu_reg_stats_get(const struct gpu_reg *r, struct gpu_reg_stats *st)
{
    *st = (struct gpu_reg_stats){0};
    if (!r)
        return;
    st->bytes = atomic_load(&r->bytes);
    st->pending = atomic_load(&r->pending);
    for (uint32_t a = 0; a < GPU_REG_MAX_ARENAS; a++) {
        int state = atomic_load(&r->a[a].state);
        st->arenas += state == GPU_REG_DONE && r->a[a].size;
        st->refused += state == GPU_REG_REFUSED;
    }
}
