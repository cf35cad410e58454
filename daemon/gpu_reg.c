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
#include "daemon/store.h"
#include "tiers/gpu.h"
#include "tiers/host.h"

/* How often the thread looks again at a chunk the fault-in has not finished. */
#define GPU_REG_POLL_NS 2000000L

enum { GPU_REG_PENDING = 0, GPU_REG_DONE, GPU_REG_REFUSED };

struct gpu_reg_arena {
    uint64_t next;       /* registered below this offset; the thread's once handed to it */
    uint64_t size;       /* the arena's */
    _Atomic int state;   /* GPU_REG_* */
    _Atomic int err;     /* the refusal (negative errno) */
    bool logged;         /* the loop said what became of it */
};

struct gpu_reg {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool started;
    bool stop;                            /* under mu */
    uint32_t queue[STORE_MAX_ARENAS + 2]; /* arenas handed to the thread, in order (under mu) */
    uint32_t nqueued, nfinished;          /* under mu */
    struct gpu_reg_arena a[STORE_MAX_ARENAS + 2];
    _Atomic uint64_t bytes;   /* registered */
    _Atomic uint64_t pending; /* handed and neither registered nor refused */
    uint64_t t_start_ns;
    _Atomic uint64_t t_end_ns; /* when the thread finished the last arena it was handed */
    bool logged_end;
};

static uint64_t gpu_reg_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The bytes of the arena's next chunk. */
static uint64_t gpu_reg_len(const struct store *s, const struct gpu_reg_arena *ra)
{
    uint64_t chunk = s->p.gpu_reg_chunk ? s->p.gpu_reg_chunk : STORE_GPU_REG_CHUNK;
    return ra->size - ra->next < chunk ? ra->size - ra->next : chunk;
}

/* Registers arena a's chunk at ra->next; 0 or the device's refusal (recorded). */
static int gpu_reg_chunk(struct store *s, struct gpu_reg *r, uint32_t a)
{
    struct gpu_reg_arena *ra = &r->a[a];
    struct tier *t = s->arenas[a].tier;
    uint64_t len = gpu_reg_len(s, ra);
    int rc = tier_gpu_host_register(s->gpu, (char *)tier_host_base(t) + ra->next, len);
    if (rc) {
        atomic_store(&ra->err, rc);
        atomic_fetch_sub(&r->pending, ra->size - ra->next);
        atomic_store(&ra->state, GPU_REG_REFUSED);
        return rc;
    }
    ra->next += len;
    atomic_fetch_add(&r->bytes, len);
    atomic_fetch_sub(&r->pending, len);
    if (ra->next == ra->size)
        atomic_store(&ra->state, GPU_REG_DONE);
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
    struct store *s = arg;
    struct gpu_reg *r = s->gpu_reg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->nfinished == r->nqueued)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop)
            break;
        uint32_t a = r->queue[r->nfinished];
        struct gpu_reg_arena *ra = &r->a[a];
        struct tier *t = s->arenas[a].tier;
        while (ra->next < ra->size) {
            if (!tier_host_range_faulted(t, ra->next, gpu_reg_len(s, ra))) {
                if (gpu_reg_nap(r))
                    goto out;
                continue;
            }
            pthread_mutex_unlock(&r->mu); /* the pinning lasts; a stop waits for it */
            int rc = gpu_reg_chunk(s, r, a);
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

static struct gpu_reg *gpu_reg_get(struct store *s)
{
    struct gpu_reg *r = s->gpu_reg;
    if (r)
        return r;
    r = calloc(1, sizeof(*r));
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
    r->t_start_ns = gpu_reg_mono_ns();
    s->gpu_reg = r;
    return r;
}

void gpu_reg_arena(struct store *s, uint32_t a)
{
    struct gpu_reg *r = gpu_reg_get(s);
    struct tier *t = s->arenas[a].tier;
    if (!r) { /* no memory for the bookkeeping: the arena stays pageable */
        s->gpu_unregistered++;
        log_warn("gpu: host arena %u not registered with the device (%s); moves to and from "
                 "the pool copy through pageable memory, holding the loop for each copy",
                 a, strerror(ENOMEM));
        return;
    }
    struct gpu_reg_arena *ra = &r->a[a];
    ra->size = tier_host_size(t);
    atomic_fetch_add(&r->pending, ra->size);
    /* The chunks the fault-in has already been over, now (what the start faulted in itself),
     * unless the thread is registering: one caller of the device's registration at a time. */
    pthread_mutex_lock(&r->mu);
    bool idle = r->nfinished == r->nqueued;
    pthread_mutex_unlock(&r->mu);
    while (idle && ra->next < ra->size && ra->next < STORE_PREFAULT_FIRST) {
        if (!tier_host_range_faulted(t, ra->next, gpu_reg_len(s, ra)) || gpu_reg_chunk(s, r, a))
            break;
    }
    if (atomic_load(&ra->state) != GPU_REG_PENDING) {
        gpu_reg_tick(s); /* said now: the start's log tells where the arena stands */
        return;
    }
    pthread_mutex_lock(&r->mu);
    r->queue[r->nqueued++] = a;
    if (!r->started) {
        if (pthread_create(&r->thread, NULL, gpu_reg_main, s) == 0) {
            r->started = true;
        } else { /* no thread: the rest now, as the pool's opening always did */
            r->nqueued--;
            pthread_mutex_unlock(&r->mu);
            while (ra->next < ra->size && gpu_reg_chunk(s, r, a) == 0)
                ;
            gpu_reg_tick(s);
            return;
        }
    }
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void gpu_reg_tick(struct store *s)
{
    struct gpu_reg *r = s->gpu_reg;
    if (!r)
        return;
    for (uint32_t a = 0; a < STORE_MAX_ARENAS + 2; a++) {
        struct gpu_reg_arena *ra = &r->a[a];
        int state = atomic_load(&ra->state);
        if (ra->logged || state != GPU_REG_REFUSED)
            continue;
        ra->logged = true;
        if (s->gpu_unregistered++ == 0)
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
}

void gpu_reg_stop(struct store *s)
{
    struct gpu_reg *r = s->gpu_reg;
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->started)
        pthread_join(r->thread, NULL);
    r->started = false;
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
    s->gpu_reg = NULL;
}

void gpu_reg_stats_get(const struct store *s, struct gpu_reg_stats *st)
{
    const struct gpu_reg *r = s->gpu_reg;
    *st = (struct gpu_reg_stats){0};
    if (!r)
        return;
    st->bytes = atomic_load(&r->bytes);
    st->pending = atomic_load(&r->pending);
    for (uint32_t a = 0; a < STORE_MAX_ARENAS + 2; a++) {
        int state = atomic_load(&r->a[a].state);
        st->arenas += state == GPU_REG_DONE && r->a[a].size;
        st->refused += state == GPU_REG_REFUSED;
    }
}
