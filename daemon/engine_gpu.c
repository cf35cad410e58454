/*
 * engine_gpu.c — moves between the host arenas and the GPU pool, asynchronous (see
 * engine_gpu.h for the design).
 */
#include "daemon/engine_gpu.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine_core.h"
#include "daemon/gpu_reg.h"
#include "daemon/index.h"
#include "daemon/log.h"
#include "daemon/store.h"
#include "tiers/gpu.h"
#include "tiers/host.h"
#include "tiers/tier.h"

#define ENGINE_GPU_STAT_ADD(s, nsp, field, v)                                                  \
    do {                                                                                       \
        (s)->total.field += (v);                                                               \
        (nsp)->stats.field += (v);                                                             \
    } while (0)

/* Candidates handed to the policy per demotion, and the longest walk to find them. */
#define ENGINE_GPU_DEMOTE_SAMPLE 16
#define ENGINE_GPU_DEMOTE_WALK 65536

/* Where a move is. */
enum engine_gpu_state {
    ENGINE_GPU_FREE = 0,
    ENGINE_GPU_COPYING = 1, /* the copy is queued on the tier's stream */
    ENGINE_GPU_LANDED = 2,  /* the copy is done; a promotion waits here for its pins to go */
    ENGINE_GPU_FAILED = 3,  /* the copy failed; a demotion waits here for its pins to go */
};

struct engine_gpu_move {
    struct store *s;
    uint32_t idx;
    uint8_t state; /* enum engine_gpu_state */
    bool to_gpu;
    struct tier_loc src; /* where the bytes come from: the block's place before the move */
    struct tier_loc dst; /* where they go */
};

/* The loop thread's. */
struct engine_gpu {
    struct engine_gpu_move mv[ENGINE_GPU_INFLIGHT];
    uint32_t live;     /* moves not FREE */
    uint32_t copying;  /* of those, COPYING */
    uint64_t outgoing; /* pool bytes of demotions whose copies are in flight */
    bool ready;        /* a demotion settled: WAITs to answer at the end of the poll */
    uint64_t started;  /* moves started, ever (engine_gpu_moves_started) */
};

static struct engine_gpu *engine_gpu_state(struct store *s)
{
    if (!s->gpu_moves)
        s->gpu_moves = calloc(1, sizeof(*s->gpu_moves));
    return s->gpu_moves;
}

int engine_gpu_alloc(struct store *s, uint64_t len, struct tier_loc *loc)
{
    struct tier *g = s->gpu;
    if (!g)
        return -ENODEV;
    if ((double)(g->ops->usage(g) + len) > s->p.high_watermark * (double)g->ops->capacity(g))
        return -ENOSPC;
    return g->ops->alloc(g, len, loc);
}

/* Points block idx at loc, on the list of arena loc->arena, as tier `tier`; with `old`, frees
 * that slot once the block is off its list (its index entry is gone before its generation
 * moves). The block's flags are set by the caller first: the list push publishes by them. */
static void engine_gpu_place(struct store *s, uint32_t idx, const struct tier_loc *loc,
                             uint8_t tier, const struct tier_loc *old)
{
    struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    store_lru_unlink(s, idx);
    if (old) {
        struct tier *t = s->arenas[old->arena].tier;
        t->ops->free(t, old);
    }
    ns->bytes = ns->bytes - b->len + loc->len;
    b->arena = (uint8_t)loc->arena;
    b->cls = (uint8_t)loc->cls;
    b->off = loc->off;
    b->len = (uint32_t)loc->len;
    b->tier = tier;
    store_lru_push_head(s, idx);
}

/* A promotion whose host page was lost under it (engine_arena_fault marked it LOST): no copy
 * is left, as after a failed read from disk; it goes once free of pins and children. */
static void engine_gpu_forget(struct store *s, uint32_t idx)
{
    struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    struct tier *host = s->arenas[b->arena].tier;
    struct tier_loc loc = {.arena = b->arena, .cls = b->cls, .off = b->off, .len = b->len};
    store_lru_unlink(s, idx);
    host->ops->free(host, &loc);
    b->tier = 0;
    b->arena = STORE_ARENA_DISK;
    ns->bytes -= b->len;
    b->len = 0;
    store_lru_push_head(s, idx);
    if (!b->pins && !b->children)
        (void)store_block_drop(s, idx);
}

static void engine_gpu_release(struct engine_gpu *eg, struct engine_gpu_move *mv)
{
    mv->state = ENGINE_GPU_FREE;
    eg->live--;
}

/* Finishes a move whose copy has completed, if it can now. false while it must wait for
 * the block's pins to go; with force (shutdown) it never waits: a landed promotion is
 * abandoned, a failed demotion goes back to the pool. */
static bool engine_gpu_settle(struct store *s, struct engine_gpu_move *mv, bool force)
{
    struct engine_gpu *eg = s->gpu_moves;
    uint32_t idx = mv->idx;
    struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    bool lost = b->flags & BLOCK_F_LOST;
    if (mv->to_gpu) {
        if (mv->state == ENGINE_GPU_LANDED && !lost && b->pins && !force)
            return false; /* its leases read the host slot: it switches once they are gone */
        b->flags &= (uint8_t)~BLOCK_F_GPU_MOVING;
        if (mv->state == ENGINE_GPU_LANDED && !lost && !b->pins) {
            engine_gpu_place(s, idx, &mv->dst, KVC_WIRE_TIER_GPU, &mv->src);
            ENGINE_GPU_STAT_ADD(s, ns, gpu_promoted_blocks, 1);
        } else {
            /* Failed, abandoned or lost: it stays where it is, the pool slot goes. */
            struct tier *g = s->arenas[mv->dst.arena].tier;
            g->ops->free(g, &mv->dst);
            if (lost)
                engine_gpu_forget(s, idx);
        }
        engine_gpu_release(eg, mv);
        return true;
    }
    if (mv->state == ENGINE_GPU_LANDED && !lost) {
        /* Its host slot (named since the move started) holds the bytes now. */
        struct tier *g = s->arenas[mv->src.arena].tier;
        b->flags &= (uint8_t)~(BLOCK_F_GPU_MOVING | BLOCK_F_PROMOTING);
        g->ops->free(g, &mv->src);
        store_heap_sync(s, idx);
        store_fast_sync(s, idx);
        ENGINE_GPU_STAT_ADD(s, ns, gpu_demoted_blocks, 1);
        eg->ready = true;
        engine_gpu_release(eg, mv);
        return true;
    }
    /* Failed, or its host page was lost under the copy: the pool slot still holds the bytes.
     * Leases that named the host slot see it lost (their WAIT stops there) until they go. */
    mv->state = ENGINE_GPU_FAILED;
    if (b->pins && !force) {
        if (!lost || (b->flags & BLOCK_F_PROMOTING)) {
            b->flags = (uint8_t)((b->flags & ~BLOCK_F_PROMOTING) | BLOCK_F_LOST);
            store_heap_sync(s, idx);
            store_fast_sync(s, idx);
            eg->ready = true;
        }
        return false;
    }
    b->flags &= (uint8_t)~(BLOCK_F_GPU_MOVING | BLOCK_F_PROMOTING | BLOCK_F_LOST);
    engine_gpu_place(s, idx, &mv->src, KVC_WIRE_TIER_GPU, &mv->dst);
    eg->ready = true;
    engine_gpu_release(eg, mv);
    return true;
}

/* The tier's callback: the copy of mv has landed (0) or failed. */
static void engine_gpu_copy_done(void *arg, int status)
{
    struct engine_gpu_move *mv = arg;
    struct store *s = mv->s;
    struct engine_gpu *eg = s->gpu_moves;
    const struct block *b = &s->ix.blocks[mv->idx];
    eg->copying--;
    if (!mv->to_gpu)
        eg->outgoing -= mv->src.len;
    if (status) {
        ENGINE_GPU_STAT_ADD(s, s->ns[b->ns], gpu_move_failures, 1);
        log_limited(LOG_LEVEL_WARNING, "gpu: a copy %s the pool failed (%s); the block stays %s",
                    mv->to_gpu ? "into" : "out of", strerror(-status),
                    mv->to_gpu ? "in its host arena" : "in the pool");
    }
    mv->state = status ? ENGINE_GPU_FAILED : ENGINE_GPU_LANDED;
    (void)engine_gpu_settle(s, mv, false);
}

int engine_gpu_move(struct store *s, uint32_t idx, bool to_gpu, uint64_t now)
{
    struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    uint32_t to = to_gpu ? STORE_ARENA_GPU : ns->arena;
    struct engine_gpu *eg;
    struct engine_gpu_move *mv = NULL;
    struct tier *src, *dst;
    struct tier_loc from = {.arena = b->arena, .cls = b->cls, .off = b->off, .len = b->len};
    struct tier_loc loc;
    int rc;
    if (!s->gpu || !store_block_idle(s, idx) || b->arena == to ||
        b->format != KVC_WIRE_FORMAT_RAW ||
        b->tier != (to_gpu ? KVC_WIRE_TIER_HOST : KVC_WIRE_TIER_GPU))
        return -EBUSY;
    eg = engine_gpu_state(s);
    if (!eg)
        return -ENOMEM;
    for (uint32_t k = 0; k < ENGINE_GPU_INFLIGHT && !mv; k++)
        if (eg->mv[k].state == ENGINE_GPU_FREE)
            mv = &eg->mv[k];
    if (!mv || tier_gpu_inflight(s->gpu) == TIER_GPU_MAX_INFLIGHT)
        return -EAGAIN;
    src = s->arenas[b->arena].tier;
    dst = s->arenas[to].tier;
    if (to_gpu) {
        rc = engine_gpu_alloc(s, ns->block_bytes, &loc);
    } else {
        store_block_pin(s, idx); /* making host room must not evict the block being moved */
        rc = s->core->alloc(s, ns, now, &loc);
        store_block_unpin(s, idx);
    }
    if (rc)
        return rc;
    b = &s->ix.blocks[idx];
    *mv = (struct engine_gpu_move){
        .s = s, .idx = idx, .state = ENGINE_GPU_COPYING, .to_gpu = to_gpu, .src = from, .dst = loc};
    eg->live++;
    eg->copying++;
    eg->started++;
    if (to_gpu) {
        /* It stays readable where it is until the copy has landed. */
        b->flags |= BLOCK_F_GPU_MOVING;
        rc = dst->ops->write(dst, &loc, 0, (char *)tier_host_base(src) + from.off,
                             ns->block_bytes, engine_gpu_copy_done, mv);
    } else {
        /* Lookups name the host slot from now on, not ready until the copy has landed. */
        b->flags |= BLOCK_F_GPU_MOVING | BLOCK_F_PROMOTING;
        engine_gpu_place(s, idx, &loc, KVC_WIRE_TIER_HOST, NULL);
        eg->outgoing += from.len;
        rc = src->ops->read(src, &from, 0, (char *)tier_host_base(dst) + loc.off,
                            ns->block_bytes, engine_gpu_copy_done, mv);
    }
    if (rc) {
        /* Nothing was queued (the tier calls back only for what it queued). */
        b = &s->ix.blocks[idx];
        b->flags &= (uint8_t)~(BLOCK_F_GPU_MOVING | BLOCK_F_PROMOTING);
        if (!to_gpu) {
            eg->outgoing -= from.len;
            engine_gpu_place(s, idx, &from, KVC_WIRE_TIER_GPU, NULL);
        }
        dst->ops->free(dst, &loc);
        eg->copying--;
        engine_gpu_release(eg, mv);
        if (rc != -EAGAIN)
            log_limited(LOG_LEVEL_WARNING, "gpu: a copy %s the pool cannot start (%s)",
                        to_gpu ? "into" : "out of", strerror(-rc));
    }
    return rc;
}

bool engine_gpu_landing(const struct store *s)
{
    return s->gpu && tier_gpu_inflight(s->gpu) > 0;
}

uint64_t engine_gpu_moves_started(const struct store *s)
{
    return s->gpu_moves ? s->gpu_moves->started : 0;
}

int engine_gpu_demote(struct store *s, uint64_t now)
{
    struct tier *g = s->gpu;
    struct engine_gpu *eg = engine_gpu_state(s);
    double low = s->p.low_watermark * (double)g->ops->capacity(g);
    int n = 0;
    /* Promotions that landed and still wait for their pins to go hold pool slots the pool
     * needs now: they are given up (the blocks stay in their host slots). */
    for (uint32_t k = 0; eg && eg->live > eg->copying && k < ENGINE_GPU_INFLIGHT; k++)
        if (eg->mv[k].state == ENGINE_GPU_LANDED && eg->mv[k].to_gpu)
            (void)engine_gpu_settle(s, &eg->mv[k], true);
    while (eg && (double)(g->ops->usage(g) - eg->outgoing) > low) {
        struct policy_block cand[ENGINE_GPU_DEMOTE_SAMPLE];
        size_t nc = 0;
        uint32_t walked = 0;
        int rc;
        /* Clean blocks first (a copy is on disk), then dirty ones. */
        uint32_t i = s->arenas[STORE_ARENA_GPU].clean_tail;
        if (i == INDEX_NONE)
            i = s->arenas[STORE_ARENA_GPU].lru_tail;
        for (; i != INDEX_NONE && nc < ENGINE_GPU_DEMOTE_SAMPLE && walked < ENGINE_GPU_DEMOTE_WALK;
             i = s->ix.blocks[i].lru_prev, walked++) {
            const struct block *b = &s->ix.blocks[i];
            if (!store_block_idle(s, i))
                continue;
            cand[nc++] = (struct policy_block){.id = i,
                                               .hits = b->hits,
                                               .last_access = b->last_access,
                                               .bytes = b->len,
                                               .depth = b->depth,
                                               .children = b->children};
        }
        if (nc == 0)
            break;
        policy_rank(s->p.policy, cand, nc, now);
        uint32_t v = (uint32_t)cand[0].id;
        rc = engine_gpu_move(s, v, false, now);
        if (rc == -EAGAIN)
            break; /* moves in flight at their bound: the next trim goes on */
        if (rc) {
            if (s->ix.blocks[v].children && !(s->ix.blocks[v].flags & BLOCK_F_DISK))
                break;
            s->core->evict(s, v);
        }
        n++;
    }
    return n;
}

/* Completes what landed and settles what waited for its pins; never waits. */
static void engine_gpu_progress(struct store *s)
{
    struct engine_gpu *eg = s->gpu_moves;
    (void)tier_gpu_poll(s->gpu); /* runs engine_gpu_copy_done for the copies that landed */
    if (eg && eg->live > eg->copying)
        for (uint32_t k = 0; k < ENGINE_GPU_INFLIGHT; k++)
            if (eg->mv[k].state == ENGINE_GPU_LANDED || eg->mv[k].state == ENGINE_GPU_FAILED)
                (void)engine_gpu_settle(s, &eg->mv[k], false);
}

void engine_gpu_poll(struct store *s, uint64_t now)
{
    struct engine_gpu *eg = s->gpu_moves;
    (void)now;
    if (!s->gpu)
        return;
    engine_gpu_progress(s);
    if (eg && eg->ready) {
        eg->ready = false;
        if (s->on_ready)
            s->on_ready(s->on_ready_arg);
    }
}

void engine_gpu_refresh(struct store *s)
{
    struct engine_gpu *eg = s->gpu_moves;
    if (!s->gpu)
        return;
    engine_gpu_progress(s);
    /* WAITs are answered from the loop's own handler, never from inside a request's. */
    if (eg && eg->ready)
        tier_gpu_wake(s->gpu);
}

int engine_gpu_fd(const struct store *s)
{
    return s->gpu ? tier_gpu_fd(s->gpu) : -1;
}

void engine_gpu_stop(struct store *s)
{
    struct engine_gpu *eg = s->gpu_moves;
    if (!eg)
        return;
    if (s->gpu && eg->copying)
        (void)tier_gpu_drain(s->gpu); /* the copies touch the arenas: they end first */
    for (uint32_t k = 0; k < ENGINE_GPU_INFLIGHT; k++)
        if (eg->mv[k].state != ENGINE_GPU_FREE)
            (void)engine_gpu_settle(s, &eg->mv[k], true);
    free(eg);
    s->gpu_moves = NULL;
}

void engine_gpu_stats(const struct store *s, void (*put)(void *arg, const char *name, uint64_t v),
                      void *arg)
{
    const struct engine_gpu *eg = s->gpu_moves;
    struct tier_gpu_stats st;
    if (!s->gpu)
        return;
    tier_gpu_stats_get(s->gpu, &st);
    put(arg, "gpu_moves_inflight", eg ? eg->copying : 0);
    put(arg, "gpu_moves_waiting", eg ? eg->live - eg->copying : 0);
    put(arg, "gpu_move_waits", st.waits);
    put(arg, "gpu_move_queries", st.queries);
    struct gpu_reg_stats rs;
    gpu_reg_stats_get(s->gpu_reg, &rs);
    put(arg, "gpu_arenas_registered", rs.arenas);
    put(arg, "gpu_host_registered_bytes", rs.bytes);
    put(arg, "gpu_host_register_pending_bytes", rs.pending);
}
