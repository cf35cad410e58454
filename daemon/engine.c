/*
 * engine.c — the tier engine: where every block lives and every move; see engine.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/engine.h"
#include "daemon/engine_disk.h"
#include "daemon/engine_gpu.h"
#include "daemon/engine_remote.h"
#include "daemon/log.h"
#include "daemon/quant.h"
#include "daemon/store.h"
#include "tiers/host.h"
#include "tiers/slab.h"
#include "tiers/tier.h"

/* Candidates handed to the policy per eviction; the longest walk to find the first one
 * (everything colder may be pinned or a parent); and how much further the walk looks for
 * more once it has one. Long prefix chains put one leaf per chain at the cold end, so an
 * unbounded sample would walk the whole chain of every candidate on every eviction. */
#define ENGINE_EVICT_SAMPLE 16
#define ENGINE_EVICT_WALK 65536
#define ENGINE_EVICT_WINDOW 64
/* Random probes into the block pool per eviction under a policy other than LRU. */
#define ENGINE_EVICT_PROBES 16
/* What one trim may spend evicting before it lets the loop answer requests again: the band
 * between the watermarks is 1 % of an arena, which is 10,000 blocks of 4 KiB in 4 GiB (tens
 * of milliseconds of work, and every request waited behind it). The rest goes on after the
 * next batch of requests (store.trim_more); a put that finds the arena full meanwhile evicts
 * what it needs itself. */
#define ENGINE_TRIM_BUDGET_NS 200000
/* Actions one trim always takes before its budget counts, so that a trim of a few blocks
 * (tests, small arenas) finishes whatever the machine's load. */
#define ENGINE_TRIM_MIN_ACTIONS 256
/* A request waiting for the loop stops a trim sooner: after this many actions, checked every
 * this many (store.trim_yield, a poll of the loop's descriptors). A client that sends its next
 * request right behind the reply of a commit (a put after a put) otherwise finds the loop in
 * the first ENGINE_TRIM_MIN_ACTIONS of the trim that commit called for: ~300 us at a million
 * blocks, every fourth put of 64 blocks. Sixteen keep each trim's progress, and a poll costs
 * well under a microsecond against ~16 evictions. */
#define ENGINE_TRIM_YIELD_EVERY 16

static uint64_t engine_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Whether this trim has spent its budget (a clock read per action: tens of nanoseconds
 * against microseconds), or a request waits: then the rest is left for the next one, which
 * goes on down to the low watermark. */
static bool engine_trim_spent(struct store *s, uint64_t t0, int acted)
{
    bool spent = acted >= ENGINE_TRIM_MIN_ACTIONS && engine_mono_ns() - t0 >= ENGINE_TRIM_BUDGET_NS;
    if (!spent && s->trim_yield && acted >= s->trim_yield_next) {
        /* A policy round may act on several blocks: the next check 16 past this one. */
        s->trim_yield_next = acted + ENGINE_TRIM_YIELD_EVERY;
        if (s->trim_yield(s->trim_yield_arg)) {
            s->total.trim_yields++;
            spent = true;
        }
    }
    if (spent)
        s->trim_more = true;
    return spent;
}

static int engine_policy_trim_from(struct store *s, uint32_t a, uint64_t now, bool more,
                                   uint64_t t0, int before);

/* The policy engine (engine_policy_trim): see store_policy.c's DESIGN. */
#define ENGINE_POLICY_SAMPLE 32    /* candidates per engine round from the LRU tail */
#define ENGINE_POLICY_WINDOW 256   /* tail entries a round looks at past the first */
#define ENGINE_POLICY_PROBES 16    /* random probes per engine round */
#define ENGINE_POLICY_ROUNDS 4096  /* rounds per trim of one arena */
#define ENGINE_POLICY_WALK 65536   /* tail entries looked at for the first candidate */
#define ENGINE_POLICY_DISK_BPS 2e9 /* bytes per second a disk read is costed at */

#define ENGINE_STAT_ADD(s, nsp, field, v)                                                          \
    do {                                                                                           \
        (s)->total.field += (v);                                                                   \
        (nsp)->stats.field += (v);                                                                 \
    } while (0)

/* Whether b sits on its arena's clean list (store.c keeps the lists). */
static bool engine_clean(const struct block *b)
{
    return (b->flags & BLOCK_F_DISK) && b->arena != STORE_ARENA_DISK;
}

/* ---- victims ------------------------------------------------------------------------------ */

/* Which blocks of a list may be victims. */
enum engine_victim_mode {
    ENGINE_VICTIM_LEAF = 0,       /* unpinned committed leaves: dropping them loses nothing else */
    ENGINE_VICTIM_CLEAN = 1,      /* any unpinned clean block: only its memory copy goes */
    ENGINE_VICTIM_UNADMITTED = 2, /* leaves the disk tier would not take */
};

static bool engine_victim_ok(const struct store *s, uint32_t i, enum engine_victim_mode mode)
{
    const struct block *b = &s->ix.blocks[i];
    if (!store_block_idle(s, i))
        return false;
    if (mode == ENGINE_VICTIM_CLEAN)
        return true;
    if (b->children)
        return false;
    return mode == ENGINE_VICTIM_LEAF || !engine_disk_takes(s, i);
}

struct engine_victim_ctx {
    bool clean;
    enum engine_victim_mode mode;
};

static bool engine_victim_heap_ok(const struct store *s, uint32_t i, void *arg)
{
    const struct engine_victim_ctx *c = arg;
    return engine_clean(&s->ix.blocks[i]) == c->clean && engine_victim_ok(s, i, c->mode);
}

/* The policy's first among a sample of candidates from the cold end of one list (the
 * clean or the dirty list of `arena`), preferring size class `cls` (its slot serves the
 * pending allocation directly). */
static uint32_t engine_victim_list(struct store *s, uint32_t arena, bool clean,
                                   enum engine_victim_mode mode, int cls, uint64_t now)
{
    struct policy_block cand[ENGINE_EVICT_SAMPLE + ENGINE_EVICT_PROBES];
    size_t n = 0;
    uint32_t walked = 0, limit = ENGINE_EVICT_WALK;
    struct store_ns *ns = NULL;
    uint32_t tail = clean ? s->arenas[arena].clean_tail : s->arenas[arena].lru_tail;
    for (uint32_t i = tail; i != INDEX_NONE && n < ENGINE_EVICT_SAMPLE && walked < limit;
         i = s->ix.blocks[i].lru_prev, walked++) {
        const struct block *b = &s->ix.blocks[i];
        if (!engine_victim_ok(s, i, mode))
            continue;
        if (n == 0) {
            limit = walked + ENGINE_EVICT_WINDOW;
            ns = s->ns[b->ns];
            if (ns->policy != POLICY_LRU && mode != ENGINE_VICTIM_CLEAN && arena == ns->arena) {
                /* The namespace's heap: its first evictable leaf in policy order, exactly.
                 * Asked before the sample is walked, which only a heap with nothing to give
                 * needs (on chains, most of the list's cold end is parents: the walk to 16
                 * leaves read up to ENGINE_EVICT_WINDOW blocks a victim). */
                struct engine_victim_ctx ctx = {.clean = clean, .mode = mode};
                uint32_t v = store_heap_victim(s, ns, engine_victim_heap_ok, &ctx, cls);
                if (v != INDEX_NONE) {
                    /* The next call's reads on their way: the heap's next blocks and the
                     * list's next-coldest (where v is this one, the next call starts there). */
                    store_heap_ahead(s, ns);
                    if (b->lru_prev < s->ix.nblocks)
                        __builtin_prefetch(&s->ix.blocks[b->lru_prev]);
                    return v;
                }
            }
        }
        /* Under LRU the sample spans namespaces (the original order); under another
         * policy the coldest candidate's namespace ranks its own blocks with its policy. */
        if (ns->policy != POLICY_LRU && b->ns != ns->id)
            continue;
        store_policy_block(s, i, &cand[n++]);
    }
    if (n == 0)
        return INDEX_NONE;
    if (ns->policy == POLICY_LRU) {
        policy_rank(POLICY_LRU, cand, n, now);
    } else {
        /* The cold end holds only what is old; a policy that keeps old blocks (frequency,
         * hints) must also see younger ones: random candidates of the namespace. */
        size_t m = n;
        for (int k = 0; k < ENGINE_EVICT_PROBES && s->ix.nblocks; k++) {
            s->rng ^= s->rng << 13;
            s->rng ^= s->rng >> 7;
            s->rng ^= s->rng << 17;
            uint32_t i = (uint32_t)(s->rng % s->ix.nblocks);
            const struct block *b = &s->ix.blocks[i];
            bool dup = false;
            if (b->state != BLOCK_STATE_COMMITTED || b->arena != arena || b->ns != ns->id ||
                (arena != STORE_ARENA_DISK && engine_clean(b) != clean) ||
                !engine_victim_ok(s, i, mode))
                continue;
            for (size_t j = 0; j < m && !dup; j++)
                dup = cand[j].id == i;
            if (!dup)
                store_policy_block(s, i, &cand[m++]);
        }
        n = m;
        policy_rank_params(ns->policy, cand, n, now, &ns->pp);
    }
    for (size_t k = 0; cls >= 0 && k < n; k++)
        if (s->ix.blocks[cand[k].id].cls == cls)
            return (uint32_t)cand[k].id;
    return (uint32_t)cand[0].id;
}

/* Picks the block to evict from an arena. With a disk tier, a memory arena gives its clean
 * blocks first (their memory goes, they stay cached), then only dirty leaves the disk would
 * not take: a block the disk can take is written, never dropped (engine_disk.c). INDEX_NONE if
 * nothing can go now. */
uint32_t engine_victim(struct store *s, uint32_t arena, int cls, uint64_t now)
{
    uint32_t v;
    if (arena == STORE_ARENA_DISK || !s->disk)
        return engine_victim_list(s, arena, false, ENGINE_VICTIM_LEAF, cls, now);
    v = engine_victim_list(s, arena, true, ENGINE_VICTIM_CLEAN, cls, now);
    if (v == INDEX_NONE)
        v = engine_victim_list(s, arena, false, ENGINE_VICTIM_UNADMITTED, cls, now);
    return v;
}

void engine_evict(struct store *s, uint32_t idx)
{
    struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    if (!store_block_idle(s, idx))
        return;
    store_drop_prefetch(s, idx);
    if (s->disk && b->tier != KVC_WIRE_TIER_DISK && (b->flags & BLOCK_F_DISK)) {
        engine_disk_memory_drop(s, idx);
        return;
    }
    ENGINE_STAT_ADD(s, ns, evicted_blocks, 1);
    ENGINE_STAT_ADD(s, ns, evicted_bytes, b->len);
    store_ghost_note(s, idx);
    (void)store_block_drop(s, idx);
}

/* ---- compaction ------------------------------------------------------------------------ */

/* Blocks one slab step may take down at once, or a compaction move (a slab of more slots is
 * never emptied so). */
#define ENGINE_LADDER_SLAB_MAX 256
/* Slabs a compaction looks at for the sparsest, and the most it copies to empty one. */
#define ENGINE_COMPACT_SCAN 64
#define ENGINE_COMPACT_MAX_BYTES (4u << 20)

/* The blocks of the slab at `start` of host arena a (nslots slots of `slot` bytes, `used` of
 * them allocated) into out, when every allocated slot holds a committed block for which ok
 * holds (none a reservation's or a job's); false otherwise. */
static bool engine_slab_blocks(struct store *s, uint32_t a, uint64_t start, uint64_t slot,
                               uint32_t nslots, uint32_t used,
                               bool (*ok)(const struct store *s, uint32_t idx, const void *arg),
                               const void *arg, uint32_t *out)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < nslots && n < used; i++) {
        uint32_t x = store_slot_owner(s, a, start + (uint64_t)i * slot);
        if (x == INDEX_NONE)
            continue;
        if (!ok(s, x, arg))
            return false;
        out[n++] = x;
    }
    return n == used;
}

static bool engine_compact_ok(const struct store *s, uint32_t idx, const void *arg)
{
    (void)arg;
    return store_block_idle(s, idx) && s->ix.blocks[idx].tier == KVC_WIRE_TIER_HOST;
}

/* Room for a slot of size class `want` in host arena a without evicting: when another class
 * has free slots elsewhere for every block of its sparsest slab, those blocks are copied into
 * them (on the loop thread: a few MiB at most) and the slab, empty, gives its pages back to
 * any size. A slab allocator keeps its pages with the size they were cut for; a tier whose
 * blocks change size (the precision ladder, namespaces of several block sizes) would
 * otherwise evict to find room while another size holds it free. Only idle blocks move (no
 * lease points at them; a reader of the shared index sees the old slot's generation change).
 * True when a slab was emptied. */
static bool engine_compact(struct store *s, uint32_t a, int want)
{
    struct tier *t = s->arenas[a].tier;
    struct slab *sl = tier_host_slab(t);
    uint64_t start = 0, slot, best_free = 0;
    uint32_t used = 0, nslots, move[ENGINE_LADDER_SLAB_MAX];
    int cls = -1;
    for (uint32_t c = 0; c < slab_class_count(sl); c++) {
        uint64_t st, fr = slab_class_free_slots(sl, (int)c), sz = slab_class_slot(sl, (int)c);
        uint32_t u;
        if ((int)c == want || !fr || fr * sz <= best_free ||
            slab_sparsest(sl, (int)c, ENGINE_COMPACT_SCAN, &st, &u) ||
            (uint64_t)u * sz > ENGINE_COMPACT_MAX_BYTES || u > ENGINE_LADDER_SLAB_MAX)
            continue;
        if (slab_span(sl, st, &st, &slot, &nslots, &u) || fr - (nslots - u) < u)
            continue; /* its blocks would not fit in the class's other slabs */
        best_free = fr * sz;
        cls = (int)c;
        start = st;
        used = u;
    }
    if (cls < 0 || slab_span(sl, start, &start, &slot, &nslots, &used) ||
        !engine_slab_blocks(s, a, start, slot, nslots, used, engine_compact_ok, NULL, move))
        return false; /* a slot held by a reservation or a job: the slab cannot empty now */
    slab_drain(sl, start, true);
    for (uint32_t i = 0; i < used; i++) {
        struct block *b = &s->ix.blocks[move[i]];
        struct tier_loc from = {.arena = a, .cls = b->cls, .off = b->off, .len = b->len}, to;
        if (t->ops->alloc(t, b->len, &to)) {
            slab_drain(sl, start, false);
            return false;
        }
        memcpy((uint8_t *)tier_host_base(t) + to.off, (const uint8_t *)tier_host_base(t) + b->off,
               b->len);
        store_slot_own(s, move[i], false);
        b->off = to.off;
        b->cls = (uint8_t)to.cls;
        store_slot_own(s, move[i], true);
        store_fast_sync(s, move[i]); /* the new slot, before the old one is freed */
        t->ops->free(t, &from);
    }
    s->total.compacted_slabs++;
    s->total.compacted_blocks += used;
    return true;
}

/* ---- the precision ladder ------------------------------------------------------------- */

struct engine_ladder_ctx {
    const struct store_ns *ns;
    uint32_t rung;
    bool any;      /* any rung */
    uint32_t keep; /* a block that may not go (the one a slot is made for), or INDEX_NONE */
};

static bool engine_ladder_out_ok(const struct store *s, uint32_t i, void *arg)
{
    const struct engine_ladder_ctx *c = arg;
    const struct block *b = &s->ix.blocks[i];
    return i != c->keep && store_block_idle(s, i) && !b->children && b->arena == c->ns->arena &&
           (c->any || store_ladder_rung(c->ns, b->format) == c->rung);
}

/* The coldest leaf of rung `rung` (else of any rung) but `keep`, or block v when it is not
 * INDEX_NONE, leaves the tier: to disk when the policy offloads it there, else dropped; as
 * kvcsim's ladder takes a rung's coldest block out. */
static enum engine_ladder_r engine_ladder_out_but(struct store *s, struct store_ns *ns,
                                                  uint32_t rung, uint32_t v, uint32_t keep,
                                                  uint64_t now)
{
    struct engine_ladder_ctx c = {.ns = ns, .rung = rung, .keep = keep};
    if (v == INDEX_NONE && !store_heap_first(s, ns, engine_ladder_out_ok, &c, &v, 1)) {
        c.any = true;
        if (!store_heap_first(s, ns, engine_ladder_out_ok, &c, &v, 1))
            return ENGINE_LADDER_NONE;
    }
    if (s->disk && !engine_clean(&s->ix.blocks[v])) {
        struct policy_pressure pr = {.bytes_to_free = s->ix.blocks[v].len,
                                     .actions =
                                         1u << POLICY_ACTION_DROP | 1u << POLICY_ACTION_OFFLOAD,
                                     .offload_min_hits = engine_disk_admit_hits(s),
                                     .miss_cost = 1.0,
                                     .disk_cost = 0.1};
        struct policy_block pb;
        struct policy_action a;
        store_policy_block(s, v, &pb);
        if (policy_decide((enum policy_kind)ns->policy, &pb, 1, now, &ns->pp, &pr, &a) == 1 &&
            a.action == POLICY_ACTION_OFFLOAD) {
            int rc = engine_disk_offload(s, v, now);
            if (rc == 0)
                return ENGINE_LADDER_QUEUED;
            if (rc == -EAGAIN)
                return ENGINE_LADDER_WAIT;
        }
    }
    engine_evict(s, v);
    return ENGINE_LADDER_FREED;
}

static enum engine_ladder_r engine_ladder_out(struct store *s, struct store_ns *ns, uint32_t rung,
                                              uint32_t v, uint64_t now)
{
    return engine_ladder_out_but(s, ns, rung, v, INDEX_NONE, now);
}

/* Block v's slab quantized whole into `format` (store_quantize_slab) when every block of it
 * passes ok and the slab's pages hold them all at the format's size (ns's recipe): once the
 * jobs land the slab is empty and its pages serve the smaller size, as a slab allocator's
 * rebalancing moves a page between sizes. Returns the blocks queued, 0 when that slab may
 * not. */
static uint32_t engine_slab_quantize(struct store *s, const struct store_ns *ns, uint32_t v,
                                     uint8_t format,
                                     bool (*ok)(const struct store *s, uint32_t idx,
                                                const void *arg),
                                     const void *arg)
{
    const struct block *b = &s->ix.blocks[v];
    struct slab *sl = tier_host_slab(s->arenas[b->arena].tier);
    uint32_t idx[ENGINE_LADDER_SLAB_MAX], nslots, used;
    uint64_t start, slot;
    int64_t enc = store_format_bytes(ns, format);
    if (enc > 0 && slab_span(sl, b->off, &start, &slot, &nslots, &used) == 0 &&
        used <= ENGINE_LADDER_SLAB_MAX && slab_fit(sl, b->off, (uint64_t)enc) >= used &&
        engine_slab_blocks(s, b->arena, start, slot, nslots, used, ok, arg, idx) &&
        store_quantize_slab(s, idx, used, format) == 0)
        return used;
    return 0;
}

/* A step down from rung k to rung d found no free slot of the smaller size: the slab of block
 * v steps down whole when every block in it may (of ns, idle, on rung k, not a sink).
 * QUEUED, or NONE when that slab may not. */
static bool engine_ladder_slab_ok(const struct store *s, uint32_t idx, const void *arg)
{
    const struct engine_ladder_ctx *c = arg;
    const struct block *b = &s->ix.blocks[idx];
    return b->ns == c->ns->id && store_block_idle(s, idx) && b->depth != 0 && !b->merge_refused &&
           store_ladder_rung(c->ns, b->format) == c->rung;
}

static enum engine_ladder_r engine_ladder_slab(struct store *s, struct store_ns *ns, uint32_t v,
                                               uint32_t k, uint32_t d)
{
    struct engine_ladder_ctx c = {.ns = ns, .rung = k, .keep = INDEX_NONE};
    uint32_t used = engine_slab_quantize(s, ns, v, ns->rung_format[d], engine_ladder_slab_ok, &c);
    if (!used)
        return ENGINE_LADDER_NONE;
    ENGINE_STAT_ADD(s, ns, ladder_steps, (uint64_t)used * (d - k));
    ENGINE_STAT_ADD(s, ns, ladder_slab_steps, 1);
    return ENGINE_LADDER_QUEUED;
}

/* LRU's trigger found no slot of the encoded size for raw block v (quant_pressure): every
 * page of the arena is cut for other sizes, as in an arena full of raw blocks, where evicting
 * raw blocks frees raw slots only and a quantization would never find room. v's slab steps
 * down whole as a ladder's does: every block of it idle, raw and of v's namespace (one
 * recipe, one encoded size). Returns the jobs queued (0: the slab holds a block that cannot
 * go now, or the worker is full). */
static bool engine_lru_slab_ok(const struct store *s, uint32_t idx, const void *arg)
{
    const struct block *b = &s->ix.blocks[idx];
    return b->ns == *(const uint32_t *)arg && store_block_idle(s, idx) &&
           b->format == KVC_WIRE_FORMAT_RAW && !b->merge_refused;
}

static int engine_lru_quant_slab(struct store *s, uint32_t v)
{
    const struct block *b = &s->ix.blocks[v];
    struct store_ns *ns = s->ns[b->ns];
    uint32_t nsid = b->ns, used;
    if (b->tier != KVC_WIRE_TIER_HOST ||
        quant_inflight_in(s->quant, b->arena) >= s->p.quantize_inflight)
        return 0;
    used = engine_slab_quantize(s, ns, v, store_ns_first_format(ns), engine_lru_slab_ok, &nsid);
    if (used)
        ENGINE_STAT_ADD(s, ns, quant_slab_steps, 1);
    return (int)used;
}

/* Block v of rung k goes down to the rung it comes to rest on (store_ladder_dest), its smaller
 * copy made room for as it must: a slot of that size now; else its slab steps down whole
 * (engine_ladder_slab); else the copy is placed when its job lands, and a slot of that size is
 * made to come before: the coldest block of that rung steps down in turn (queued before it,
 * so it lands first), or, from the last rung, leaves the tier. In bytes what kvcsim's ladder
 * does when the rungs below are over their targets too. */
static enum engine_ladder_r engine_ladder_down(struct store *s, struct store_ns *ns, uint32_t v,
                                               uint32_t k, uint64_t now, uint32_t depth)
{
    uint32_t d;
    uint8_t to;
    int rc;
    if (!s->quant || !s->p.quantize_inflight)
        return engine_ladder_out(s, ns, k, INDEX_NONE, now);
    if (quant_inflight_in(s->quant, s->ix.blocks[v].arena) >= s->p.quantize_inflight)
        return ENGINE_LADDER_WAIT; /* this arena's jobs at the bound: room is coming */
    d = store_ladder_dest(s, ns, v, k);
    to = ns->rung_format[d];
    rc = store_quantize_to(s, v, to);
    if (rc == -ENOSPC && engine_ladder_slab(s, ns, v, k, d) == ENGINE_LADDER_QUEUED)
        return ENGINE_LADDER_QUEUED;
    if (rc == -ENOSPC && d < ns->rungs && depth < POLICY_LADDER_RUNGS) {
        /* A slot of rung d's size first, then this block's job behind it. */
        uint32_t w = d + 1 < ns->rungs ? store_ladder_first(s, ns, d) : INDEX_NONE;
        enum engine_ladder_r r;
        if (w != INDEX_NONE && w != v) {
            r = engine_ladder_down(s, ns, w, d, now, depth + 1);
        } else {
            r = engine_ladder_out_but(s, ns, ns->rungs - 1u, INDEX_NONE, v, now);
            if (r == ENGINE_LADDER_FREED)
                ENGINE_STAT_ADD(s, ns, ladder_slot_outs, 1);
        }
        if (r == ENGINE_LADDER_WAIT || r == ENGINE_LADDER_NONE)
            return r;
        rc = store_quantize_to(s, v, to); /* a slot may be free now (the block left) */
        if (rc == -ENOSPC)
            rc = store_quantize_later(s, v, to);
    }
    if (rc)
        return engine_ladder_out(s, ns, k, INDEX_NONE, now);
    ENGINE_STAT_ADD(s, ns, ladder_steps, d - k);
    return ENGINE_LADDER_QUEUED;
}

/* One step of ns's ladder (store_ladder_pick, the decision kvcsim's ladder makes): the
 * coldest block of the rung it names goes down, or out of the tier. A step down that cannot
 * start now (the worker full) waits: evicting instead is what keeps a ladder from ever
 * holding its rungs. */
static enum engine_ladder_r engine_ladder_step(struct store *s, struct store_ns *ns, uint64_t now)
{
    int out, k = store_ladder_pick(s, ns, &out);
    if (k < 0)
        return ENGINE_LADDER_NONE;
    if (!out && (uint32_t)k + 1 < ns->rungs) {
        uint32_t v = store_ladder_first(s, ns, (uint32_t)k);
        if (v != INDEX_NONE && s->ix.blocks[v].depth == 0 && !s->ix.blocks[v].children)
            return engine_ladder_out(s, ns, (uint32_t)k, v, now); /* a sink stays raw */
        if (v != INDEX_NONE)
            return engine_ladder_down(s, ns, v, (uint32_t)k, now, 0);
    }
    return engine_ladder_out(s, ns, (uint32_t)k, INDEX_NONE, now);
}

/* Steps ns's ladder until the room coming in arena a (the raw slots of quantize jobs in
 * flight, and what the disk tier is writing out) covers `need` bytes, or a block left the
 * tier (room now). */
static enum engine_ladder_r engine_ladder_room(struct store *s, struct store_ns *ns, uint32_t a,
                                               uint64_t need, uint64_t now)
{
    enum engine_ladder_r r = ENGINE_LADDER_NONE;
    for (uint32_t n = 0; n < ENGINE_POLICY_ROUNDS &&
                         quant_pending_bytes(s->quant, a) + engine_disk_pending_bytes(s) < need;
         n++) {
        r = engine_ladder_step(s, ns, now);
        if (r != ENGINE_LADDER_QUEUED)
            break;
    }
    if (r == ENGINE_LADDER_NONE && quant_pending_bytes(s->quant, a))
        return ENGINE_LADDER_WAIT;
    return r;
}

enum engine_ladder_r engine_ladder_evict(struct store *s, uint32_t arena, uint32_t v, uint64_t need,
                                         uint64_t now)
{
    struct store_ns *vns = s->ns[s->ix.blocks[v].ns];
    if (vns->rungs < 2 || vns->policy == POLICY_LRU || vns->arena != arena)
        return ENGINE_LADDER_NONE;
    return engine_ladder_room(s, vns, arena, need, now);
}

bool engine_room_coming(struct store *s, uint32_t arena)
{
    return quant_pending_bytes(s->quant, arena) > 0 || engine_disk_room_coming(s, arena);
}

/* Allocates a slot, evicting as needed. -ENOSPC when nothing more can be evicted, or when
 * the ladder of the namespace that gives makes the room by quantizing (it comes when the
 * jobs land: engine_room_coming). */
int engine_alloc(struct store *s, struct store_ns *ns, uint64_t now, struct tier_loc *loc)
{
    struct tier *t = s->arenas[ns->arena].tier;
    int cls = tier_host_class(t, ns->block_bytes);
    for (bool first = true;; first = false) {
        int rc = t->ops->alloc(t, ns->block_bytes, loc);
        if (rc != -ENOSPC)
            return rc;
        if (first && s->on_evict)
            s->on_evict(s->on_evict_arg);
        if (engine_compact(s, ns->arena, cls))
            continue;
        uint32_t v = engine_victim(s, ns->arena, cls, now);
        if (v == INDEX_NONE)
            return -ENOSPC;
        uint64_t need = s->room_want > ns->block_bytes ? s->room_want : ns->block_bytes;
        switch (engine_ladder_evict(s, ns->arena, v, need, now)) {
        case ENGINE_LADDER_FREED:
            continue;
        case ENGINE_LADDER_QUEUED:
        case ENGINE_LADDER_WAIT:
            return -ENOSPC;
        case ENGINE_LADDER_NONE:
            engine_evict(s, v);
            break;
        }
    }
}

/* With a disk tier, the share of an arena that puts may not fill with dirty (or pinned)
 * blocks: room kept free or clean for the reads of lookups, which cannot wait for a write
 * (a lookup names its slots at once). A put beyond it waits for write-back (disk.put_wait). */
#define ENGINE_READ_RESERVE_DIV 8

/* Room for a put: as engine_alloc, but with a disk tier only while dirty memory stays out of
 * the read reserve. -ENOSPC when it would not. */
static int engine_alloc_put(struct store *s, struct store_ns *ns, uint64_t now,
                            struct tier_loc *loc)
{
    const struct store_arena *a = &s->arenas[ns->arena];
    if (s->disk) {
        uint64_t cap = a->tier->ops->capacity(a->tier), used = a->tier->ops->usage(a->tier);
        uint64_t dirty = used > a->clean_bytes ? used - a->clean_bytes : 0;
        uint64_t limit = cap - cap / ENGINE_READ_RESERVE_DIV;
        if (dirty + ns->block_bytes > limit) {
            /* Write-back past its usual target: this put (and the ones behind it) wait. */
            engine_disk_write_ahead(
                s, ns->arena, dirty + ns->block_bytes - limit + cap / ENGINE_READ_RESERVE_DIV, now);
            return -ENOSPC;
        }
    }
    return engine_alloc(s, ns, now, loc);
}

int engine_trim(struct store *s, uint64_t now)
{
    int n = 0;
    uint64_t t0 = engine_mono_ns();
    bool more = s->trim_more; /* the last trim stopped above the low watermark */
    store_post_flush(s); /* a lookup's policy work before the evictions read it */
    s->trim_yield_next = ENGINE_TRIM_YIELD_EVERY;
    s->trim_more = false;
    engine_gpu_refresh(s); /* moves that landed, or waited for their pins to go */
    if (s->on_evict)
        s->on_evict(s->on_evict_arg);
    /* Write-behind to the remote tier: blocks committed since (before anything leaves). */
    if (s->remote)
        engine_remote_pump(s, now);
    /* The pool first: what it demotes lands in the host arenas checked next. */
    if (s->gpu && (double)s->gpu->ops->usage(s->gpu) >
                      s->p.high_watermark * (double)s->gpu->ops->capacity(s->gpu))
        n += engine_gpu_demote(s, now);
    /* With a disk tier its half of the engine does the rest (quantize, write-back,
     * demotion, clean blocks leaving memory). */
    if (s->disk)
        return n + engine_disk_trim(s, now);
    if (store_policy_engine(s))
        goto engine;
    /* Quantize first where a namespace allows it; the raw slots its jobs will free count
     * as free already, so eviction takes only the rest. */
    quant_pressure(s->quant, now, engine_lru_quant_slab);
    for (uint32_t a = 0; a < s->narenas; a++) {
        struct tier *t = s->arenas[a].tier;
        double cap = (double)t->ops->capacity(t);
        uint64_t pend = quant_pending_bytes(s->quant, a);
        if (!more && (double)(t->ops->usage(t) - pend) <= s->p.high_watermark * cap)
            continue;
        while ((double)(t->ops->usage(t) - pend) > s->p.low_watermark * cap &&
               !engine_trim_spent(s, t0, n)) {
            uint32_t v = engine_victim(s, a, -1, now);
            if (v == INDEX_NONE)
                break;
            engine_evict(s, v);
            n++;
        }
    }
    return n;
engine:
    /* A namespace ranks with another policy than LRU: its actions come from policy_decide
     * (engine_policy_trim), arena by arena. */
    for (uint32_t a = 0; a < s->narenas; a++)
        n += engine_policy_trim_from(s, a, now, more, t0, n);
    return n;
}

int engine_evict_where(struct store *s, uint32_t ns_id, uint32_t arena, uint64_t keep_bytes,
                       bool flush, uint64_t now)
{
    uint32_t lists[2 * (STORE_MAX_ARENAS + 2)][2], nl = 0, *cand = NULL, ncand, cap = 0;
    int n = 0;
    (void)now;
    /* Every list of the arenas asked for: memory (clean and dirty), the GPU pool and the
     * disk when every arena is. */
    for (uint32_t a = 0; a < STORE_MAX_ARENAS + 2; a++) {
        if (!s->arenas[a].tier || (arena != UINT32_MAX && a != arena))
            continue;
        lists[nl][0] = a;
        lists[nl++][1] = 0;
        if (a != STORE_ARENA_DISK) {
            lists[nl][0] = a;
            lists[nl++][1] = 1;
        }
    }
    /* Leaves from the cold end, collected first (a drop may take a lost parent with it);
     * evicting one may make its parent a leaf, so again until a pass frees nothing. */
    for (;;) {
        uint32_t freed = 0;
        ncand = 0;
        for (uint32_t l = 0; l < nl; l++) {
            const struct store_arena *sa = &s->arenas[lists[l][0]];
            for (uint32_t i = lists[l][1] ? sa->clean_tail : sa->lru_tail; i != INDEX_NONE;
                 i = s->ix.blocks[i].lru_prev) {
                const struct block *b = &s->ix.blocks[i];
                if ((ns_id && b->ns != ns_id) || b->children || !store_block_idle(s, i))
                    continue;
                if (ncand == cap) {
                    uint32_t nc = cap ? cap * 2 : 1024, *v = realloc(cand, nc * sizeof(*v));
                    if (!v)
                        goto out;
                    cand = v;
                    cap = nc;
                }
                cand[ncand++] = i;
            }
        }
        for (uint32_t k = 0; k < ncand; k++) {
            uint32_t i = cand[k];
            struct block *b = &s->ix.blocks[i];
            struct store_ns *ns;
            uint64_t len;
            if (b->state != BLOCK_STATE_COMMITTED || b->children || !store_block_idle(s, i))
                continue;
            ns = s->ns[b->ns];
            if (ns_id && ns->bytes <= keep_bytes)
                goto out;
            len = b->len;
            if (store_block_drop(s, i))
                continue;
            if (flush) {
                ENGINE_STAT_ADD(s, ns, flushed_blocks, 1);
                ENGINE_STAT_ADD(s, ns, flushed_bytes, len);
            } else {
                ENGINE_STAT_ADD(s, ns, evicted_quota_blocks, 1);
            }
            freed++;
            n++;
        }
        if (!freed)
            break;
    }
out:
    free(cand);
    return n;
}

/* ---- tier engine ----------------------------------------------------------------------- */

/* enum policy_codec of a wire format. */
static uint8_t engine_policy_codec(uint32_t f)
{
    static const uint8_t map[KVC_WIRE_FORMAT_COUNT] = {
        [KVC_WIRE_FORMAT_RAW] = POLICY_CODEC_RAW,
        [KVC_WIRE_FORMAT_Q8_0] = POLICY_CODEC_Q8,
        [KVC_WIRE_FORMAT_Q4_1] = POLICY_CODEC_Q4,
        [KVC_WIRE_FORMAT_Q5_1] = POLICY_CODEC_Q5,
        [KVC_WIRE_FORMAT_KIVI2] = POLICY_CODEC_KIVI2,
        [KVC_WIRE_FORMAT_KIVI4] = POLICY_CODEC_KIVI4,
        [KVC_WIRE_FORMAT_FP8] = POLICY_CODEC_FP8,
        [KVC_WIRE_FORMAT_ROT2] = POLICY_CODEC_ROT2,
        [KVC_WIRE_FORMAT_ROT4] = POLICY_CODEC_ROT4,
        [KVC_WIRE_FORMAT_MERGE] = POLICY_CODEC_MERGE,
        [KVC_WIRE_FORMAT_LOWRANK] = POLICY_CODEC_LOWRANK,
    };
    return f < KVC_WIRE_FORMAT_COUNT ? map[f] : POLICY_CODEC_RAW;
}

static bool engine_policy_eligible(const struct block *b, uint32_t arena, uint16_t ns)
{
    return b->state == BLOCK_STATE_COMMITTED && b->arena == arena && b->ns == ns && !b->pins &&
           !(b->flags & (BLOCK_F_MOVING | BLOCK_F_LOST));
}

static bool engine_policy_heap_ok(const struct store *s, uint32_t i, void *arg)
{
    const struct block *b = &s->ix.blocks[i];
    (void)arg;
    return engine_policy_eligible(b, b->arena, b->ns);
}

/* One round: the coldest namespace's sample through policy_decide, actions carried out.
 * Returns the blocks acted on, 0 when the round found nothing to do (or only drops are
 * possible: the caller evicts through engine_victim), -EAGAIN when the disk asks to wait. */
static int engine_policy_round(struct store *s, uint32_t a, uint64_t to_free, uint64_t now)
{
    struct policy_block cand[ENGINE_POLICY_SAMPLE + 2 * ENGINE_POLICY_PROBES];
    struct policy_action act[ENGINE_POLICY_SAMPLE + 2 * ENGINE_POLICY_PROBES];
    uint8_t plan[POLICY_MAX_LAYERS];
    struct store_ns *ns = NULL;
    size_t n = 0, m = 0;
    uint32_t walked = 0, limit = ENGINE_POLICY_WALK;
    int acted = 0;
    for (uint32_t i = s->arenas[a].lru_tail;
         i != INDEX_NONE && n < ENGINE_POLICY_SAMPLE && walked < limit;
         i = s->ix.blocks[i].lru_prev, walked++) {
        const struct block *b = &s->ix.blocks[i];
        if (!ns) {
            if (b->pins || (b->flags & (BLOCK_F_MOVING | BLOCK_F_LOST)))
                continue;
            ns = s->ns[b->ns];
            limit = walked + ENGINE_POLICY_WINDOW;
        }
        if (engine_policy_eligible(b, a, (uint16_t)ns->id))
            store_policy_block(s, i, &cand[n++]);
    }
    if (!ns)
        return 0;
    if (ns->rungs >= 2 && a == ns->arena) {
        /* A namespace with a ladder: its steps instead of policy_decide's actions. */
        switch (engine_ladder_step(s, ns, now)) {
        case ENGINE_LADDER_NONE:
            return 0;
        case ENGINE_LADDER_WAIT:
            return -EAGAIN;
        default:
            return 1;
        }
    }
    uint32_t f = ns->layout.flags;
    struct policy_pressure pr = {.bytes_to_free = to_free,
                                 .actions = 1u << POLICY_ACTION_DROP,
                                 .codecs = 1u << POLICY_CODEC_RAW};
    if (s->quant && KVC_WIRE_QUANT_ALLOWED(f) &&
        quant_inflight_in(s->quant, a) < s->p.quantize_inflight) {
        uint32_t c = KVC_WIRE_QUANT_K(f) ? KVC_WIRE_QUANT_K(f) : KVC_WIRE_QUANT_V(f);
        pr.actions |= 1u << POLICY_ACTION_QUANTIZE;
        for (uint32_t k = 1; k < KVC_WIRE_FORMAT_COUNT; k++)
            if (KVC_WIRE_QUANT_ALLOWED(f) & (1u << k))
                pr.codecs |= 1u << engine_policy_codec(k);
        if (ns->layout.layers <= POLICY_MAX_LAYERS) {
            pr.layers = ns->layout.layers;
            for (uint32_t l = 0; l < pr.layers; l++)
                plan[l] =
                    l < KVC_WIRE_QUANT_RAW_LAYERS(f) ? POLICY_CODEC_RAW : engine_policy_codec(c);
            pr.layer_codec = plan;
        }
    }
    if (s->disk) {
        pr.actions |= 1u << POLICY_ACTION_OFFLOAD;
        pr.offload_min_hits = engine_disk_admit_hits(s);
    }
    if (pr.actions == 1u << POLICY_ACTION_DROP)
        return 0;
    pr.miss_cost = (double)ns->layout.block_tokens /
                   (double)(s->p.recompute_tokens_per_s ? s->p.recompute_tokens_per_s : 8000);
    pr.disk_cost = (double)ns->block_bytes / ENGINE_POLICY_DISK_BPS;
    /* The namespace's own first evictable leaves in policy order (its heap), then random
     * probes of the pool for younger inner blocks. */
    if (a == ns->arena) {
        uint32_t first[ENGINE_POLICY_PROBES];
        uint32_t nf =
            store_heap_first(s, ns, engine_policy_heap_ok, NULL, first, ENGINE_POLICY_PROBES);
        for (uint32_t k = 0; k < nf; k++) {
            bool dup = false;
            for (size_t j = 0; j < n && !dup; j++)
                dup = cand[j].id == first[k];
            if (!dup)
                store_policy_block(s, first[k], &cand[n++]);
        }
    }
    for (int k = 0; k < ENGINE_POLICY_PROBES && s->ix.nblocks; k++) {
        s->rng ^= s->rng << 13;
        s->rng ^= s->rng >> 7;
        s->rng ^= s->rng << 17;
        uint32_t i = (uint32_t)(s->rng % s->ix.nblocks);
        bool dup = false;
        if (!engine_policy_eligible(&s->ix.blocks[i], a, (uint16_t)ns->id))
            continue;
        for (size_t j = 0; j < n && !dup; j++)
            dup = cand[j].id == i;
        if (!dup)
            store_policy_block(s, i, &cand[n++]);
    }
    m = policy_decide((enum policy_kind)ns->policy, cand, n, now, &ns->pp, &pr, act);
    for (size_t k = 0; k < m; k++) {
        uint32_t idx = act[k].id;
        const struct block *b = &s->ix.blocks[idx];
        int rc;
        /* An earlier action may have dropped it (a lost parent goes with its last child). */
        if (!engine_policy_eligible(b, a, (uint16_t)ns->id))
            continue;
        switch (act[k].action) {
        case POLICY_ACTION_QUANTIZE:
            if (quant_inflight_in(s->quant, a) < s->p.quantize_inflight &&
                store_quantize(s, idx) == 0)
                acted++;
            break;
        case POLICY_ACTION_OFFLOAD:
            rc = engine_disk_offload(s, idx, now);
            if (rc == -EAGAIN)
                return acted ? acted : -EAGAIN;
            if (rc == 0) {
                acted++;
            } else if (!s->ix.blocks[idx].children) {
                engine_evict(s, idx); /* the disk cannot take it: dropped as without one */
                acted++;
            }
            break;
        case POLICY_ACTION_DROP:
            if (!b->children) {
                engine_evict(s, idx);
                acted++;
            }
            break;
        default:
            break;
        }
    }
    return acted;
}

/* engine_policy_trim within engine_trim's budget (t0, and `before` actions already taken):
 * `more` goes on below the high watermark, where the last trim stopped. */
static int engine_policy_trim_from(struct store *s, uint32_t a, uint64_t now, bool more,
                                   uint64_t t0, int before)
{
    struct tier *t = s->arenas[a].tier;
    double cap = (double)t->ops->capacity(t);
    int acted = 0;
    if (!more &&
        (double)(t->ops->usage(t) - quant_pending_bytes(s->quant, a)) <= s->p.high_watermark * cap)
        return 0;
    for (int round = 0; round < ENGINE_POLICY_ROUNDS && !engine_trim_spent(s, t0, before + acted);
         round++) {
        uint64_t pend = quant_pending_bytes(s->quant, a) + engine_disk_pending_bytes(s);
        uint64_t used = t->ops->usage(t);
        double over = (double)(used > pend ? used - pend : 0) - s->p.low_watermark * cap;
        if (over <= 0)
            break;
        int r = engine_policy_round(s, a, (uint64_t)over + 1, now);
        if (r < 0)
            break; /* the disk's rate or queue limit: the next trim goes on */
        if (r == 0) {
            uint32_t v = engine_victim(s, a, -1, now);
            if (v == INDEX_NONE)
                break;
            engine_evict(s, v);
            r = 1;
        }
        acted += r;
    }
    return acted;
}

int engine_policy_trim(struct store *s, uint32_t a, uint64_t now)
{
    s->trim_yield_next = ENGINE_TRIM_YIELD_EVERY;
    return engine_policy_trim_from(s, a, now, false, engine_mono_ns(), 0);
}

/* ---- lookup ------------------------------------------------------------------------------ */

int engine_lookup(struct store *s, struct store_owner *o, uint32_t ns_id,
                  const struct kvc_wire_key *keys, uint32_t n, uint64_t now, uint64_t *lease_id,
                  struct kvc_wire_loc *locs)
{
    return engine_lookup_flags(s, o, ns_id, keys, n, 0, now, lease_id, locs);
}

/* engine_lookup_flags, and for the kinds' spans: with ENGINE_LOOKUP_F_WHOLE all n hits or
 * none (a window cut short is no prefix's window), no remote read past the run with
 * KVC_LOOKUP_F_LOCAL, fetched[i] set for the keys engine_lookup_kind had read from the
 * remote tier (counted as its hits, not the host's), and found[0..n) the blocks it had found
 * for keys[0..n) (NULL: this lookup finds them). */
#define ENGINE_LOOKUP_F_WHOLE 0x40000000u
static int engine_lookup_keys(struct store *s, struct store_owner *o, uint32_t ns_id,
                              const struct kvc_wire_key *keys, uint32_t n, uint32_t flags,
                              uint64_t now, uint64_t *lease_id, struct kvc_wire_loc *locs,
                              const uint8_t *fetched, const uint32_t *found)
{
    uint8_t tier[KVC_PROTO_MAX_KEYS]; /* where each hit was found, before any promotion */
    struct store_lookup_blocks lb;    /* each key found once, handed to every step below */
    uint32_t run, hits = 0;
    uint64_t finds0 = s->ix.finds;
    bool moves_full = false; /* stopped at a pool block: the pool's moves all in flight */
    *lease_id = 0;
    if (!store_ns_get(s, ns_id))
        return -ENOENT;
    if (s->gpu)
        engine_gpu_refresh(s); /* hits name the places of the moves that have landed */
    if (found) {
        lb.n = n < KVC_PROTO_MAX_KEYS ? n : KVC_PROTO_MAX_KEYS;
        memcpy(lb.idx, found, lb.n * sizeof(*found));
        run = store_lookup_run_found(s, ns_id, keys, n, lb.idx);
    } else {
        run = store_lookup_run(s, ns_id, keys, n, &lb);
    }
    while (hits < run) {
        uint32_t idx = lb.idx[hits];
        /* A move of an earlier hit into the pool may have made room there by dropping it. */
        if (!index_handle_ok(&s->ix, idx, (uint16_t)ns_id, &keys[hits]))
            break;
        /* A client that cannot read the pool gets the block in its host arena (not ready
         * until its copy lands), or a miss if it is pinned there; one that can reads a host
         * block where it is, promoted once its lease goes (engine_release). */
        if (s->gpu && s->ix.blocks[idx].tier == KVC_WIRE_TIER_GPU && !o->gpu) {
            int mrc = engine_gpu_move(s, idx, false, now);
            if (mrc) {
                moves_full = mrc == -EAGAIN;
                break;
            }
        }
        tier[hits] = fetched && fetched[hits] ? 0 : s->ix.blocks[idx].tier;
        if ((flags & KVC_LOOKUP_F_READY_ONLY) &&
            (s->ix.blocks[idx].flags & (BLOCK_F_GPU_MOVING | BLOCK_F_PROMOTING)) ==
                (BLOCK_F_GPU_MOVING | BLOCK_F_PROMOTING))
            break; /* on its way out of the pool */
        hits++;
    }
    /* Hits on disk start their reads into fresh slots (not ready until they complete). */
    if (hits && s->disk)
        hits = engine_disk_lookup_prepare(s, (uint16_t)ns_id, keys, lb.idx, hits, flags, now,
                                          &o->lookup_short);
    /* Cut short for room, and the caller waits for it and asks again: nothing is pinned or
     * counted for this try, so the lookup counts once, as answered. */
    if ((flags & ENGINE_LOOKUP_F_DEFER) && o->lookup_short)
        return -EAGAIN;
    /* Cut short at the pool's bound of moves in flight, and the caller waits for them to
     * land (each landing frees a slot and asks again), so the whole prefix comes to the host
     * arena a bounded batch at a time: the same, nothing pinned or counted for this try. */
    if ((flags & ENGINE_LOOKUP_F_DEFER_MOVES) && moves_full && engine_gpu_landing(s))
        return -EAGAIN;
    /* Past the local run, the remote tier: reads into fresh slots, not ready until they
     * land (engine_remote.h). */
    if (s->remote && hits == run && hits < n && !(flags & KVC_LOOKUP_F_LOCAL))
        hits =
            engine_remote_lookup_prepare(s, (uint16_t)ns_id, keys, &lb, hits, n, flags, now, tier);
    if ((flags & ENGINE_LOOKUP_F_WHOLE) && hits < n)
        hits = 0;
    int rc = store_lease_pin(s, o, ns_id, keys, lb.idx, n, hits, tier, now, lease_id, locs);
    if (rc > 0 && s->remote) {
        store_post_flush(s); /* it reads the hits' counts */
        engine_remote_lookup_done(s, lb.idx, (uint32_t)rc, now);
    }
    /* A KV lookup's resolutions, counted with it (a span's are its kind's own business). */
    if (rc >= 0 && !(flags & ENGINE_LOOKUP_F_WHOLE))
        ENGINE_STAT_ADD(s, s->ns[ns_id], lookup_index_finds, s->ix.finds - finds0);
    return rc;
}

int engine_release(struct store *s, struct store_owner *o, uint64_t lease_id, uint64_t now)
{
    const struct store_handle *h = store_handle_get(o, lease_id, STORE_HANDLE_LEASE);
    uint32_t up[ENGINE_GPU_INFLIGHT], nup = 0;
    if (!h)
        return -ENOENT;
    /* The client's own copies out of these host slots are done when it releases: the pool's
     * copies of them go now, not beside its load on the same link. */
    for (uint32_t i = 0; s->gpu && h->gpu && i < h->n && nup < ENGINE_GPU_INFLIGHT; i++)
        if (s->ix.blocks[h->blocks[i]].tier == KVC_WIRE_TIER_HOST)
            up[nup++] = h->blocks[i];
    int rc = store_release(s, o, lease_id);
    for (uint32_t i = 0; rc == 0 && i < nup; i++)
        if (engine_gpu_move(s, up[i], true, now) == -EAGAIN)
            break; /* ENGINE_GPU_INFLIGHT moves in flight: a later release promotes the rest */
    return rc;
}

int engine_lookup_flags(struct store *s, struct store_owner *o, uint32_t ns_id,
                        const struct kvc_wire_key *keys, uint32_t n, uint32_t flags, uint64_t now,
                        uint64_t *lease_id, struct kvc_wire_loc *locs)
{
    return engine_lookup_keys(s, o, ns_id, keys, n, flags, now, lease_id, locs, NULL, NULL);
}

int engine_lookup_kind(struct store *s, struct store_owner *o, uint32_t ns_id,
                       const struct kvc_wire_key *keys, uint32_t n, uint32_t base, uint32_t flags,
                       uint64_t now, uint64_t *lease_id, uint32_t *first, struct kvc_wire_loc *locs)
{
    const struct store_ns *ns = store_ns_get(s, ns_id);
    uint8_t fetched[KVC_PROTO_MAX_KEYS];
    struct store_lookup_blocks lb; /* each key found once, when a step first asks for it */
    uint32_t count = n, span = 0;
    uint64_t finds0 = s->ix.finds;
    bool dummy = false;
    int rc;
    *first = 0;
    *lease_id = 0;
    if (!ns)
        return -ENOENT;
    if (ns->layout.kv_kind != KVC_WIRE_KV_KIND_KV_WINDOW && base)
        return -EINVAL; /* a run from keys[0], or a state: judged by its key alone */
    if (ns->layout.kv_kind != KVC_WIRE_KV_KIND_KV_WINDOW &&
        ns->layout.kv_kind != KVC_WIRE_KV_KIND_STATE)
        return engine_lookup_keys(s, o, ns_id, keys, n, flags, now, lease_id, locs, NULL, NULL);
    if (n > KVC_PROTO_MAX_KEYS)
        n = KVC_PROTO_MAX_KEYS;
    if (s->gpu)
        engine_gpu_refresh(s); /* spans judged on the moves that have landed */
    /* The span the local tiers answer with; past its end, a longer prefix the remote tier
     * may complete (its reads start now, not ready until they land, their blocks into lb). */
    store_lookup_blocks_init(&lb, n);
    span = store_lookup_span(s, ns_id, keys, &lb, base, 0, &count);
    memset(fetched, 0, n);
    if (s->remote && !(flags & KVC_LOOKUP_F_LOCAL) && span + count < n)
        (void)engine_remote_span_prepare(s, (uint16_t)ns_id, keys, &lb, base, span + count, now,
                                         &span, &count, fetched);
    if (flags & KVC_LOOKUP_F_READY_ONLY) {
        /* The span in memory now; the reads of the longer one's blocks on disk start, so a
         * later lookup finds them ready. */
        for (uint32_t i = 0; i < count; i++)
            (void)store_lookup_block(s, ns_id, keys, &lb, span + i);
        if (count && s->disk)
            (void)engine_disk_lookup_prepare(s, (uint16_t)ns_id, keys + span, lb.idx + span, count,
                                             0, now, &dummy);
        /* Pool blocks of a client that cannot read the pool: their copies to the host start
         * (engine_gpu_move declines any other block); the disk step may have made room. */
        for (uint32_t i = 0; s->gpu && !o->gpu && i < count; i++)
            if (index_handle_ok(&s->ix, lb.idx[span + i], (uint16_t)ns_id, &keys[span + i]))
                (void)engine_gpu_move(s, lb.idx[span + i], false, now);
        span = store_lookup_span(s, ns_id, keys, &lb, base,
                                 STORE_SPAN_READY | (o->gpu ? STORE_SPAN_GPU : 0), &count);
        memset(fetched, 0, n);
    }
    /* The span's blocks, as found, to the lease (each checked there: the steps above may have
     * made room). */
    for (uint32_t i = 0; i < count; i++)
        (void)store_lookup_block(s, ns_id, keys, &lb, span + i);
    rc = engine_lookup_keys(s, o, ns_id, keys + span, count,
                            flags | KVC_LOOKUP_F_LOCAL | ENGINE_LOOKUP_F_WHOLE, now, lease_id, locs,
                            fetched + span, lb.idx + span);
    *first = rc > 0 ? span : 0;
    /* The span's resolutions, counted with it: each of keys[0..n) at most once. */
    if (rc >= 0)
        ENGINE_STAT_ADD(s, s->ns[ns_id], lookup_index_finds, s->ix.finds - finds0);
    return rc;
}

/* ---- arena faults --------------------------------------------------------------------- */

uint32_t engine_arena_fault(struct store *s, uint32_t arena, uint64_t off, uint64_t len)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->ix.nblocks; i++) {
        struct block *b = &s->ix.blocks[i];
        if (b->state == BLOCK_STATE_FREE || b->arena != arena || b->off >= off + len ||
            b->off + b->len <= off || (b->flags & BLOCK_F_LOST))
            continue;
        n++;
        if (store_block_idle(s, i) && !b->children) {
            engine_evict(s, i);
        } else if (b->flags & BLOCK_F_BUSY) {
            /* The daemon's own copy into or out of the page went to its stand-in and is
             * gone: a miss from now on, dropped once nothing holds it. */
            b->flags |= BLOCK_F_LOST;
            store_heap_sync(s, i);
            store_fast_sync(s, i);
        }
        /* Pinned blocks, parents and reserved slots keep what the page holds for every
         * process (the hole reads as zeros): what any writer of the arena could write. */
    }
    return n;
}

/* ---- life cycle ----------------------------------------------------------------------------- */

/* Where a reservation finds room: the GPU pool for a client that maps it while the pool is
 * below its high watermark, else the namespace's arena, making room there. */
static int engine_room(struct store *s, struct store_ns *ns, bool gpu, uint64_t now,
                       struct tier_loc *loc)
{
    if (gpu && engine_gpu_alloc(s, ns->block_bytes, loc) == 0)
        return 0;
    return engine_alloc_put(s, ns, now, loc);
}

static const struct engine_core engine_core_ops = {
    .victim = engine_victim,
    .evict = engine_evict,
    .ladder_evict = engine_ladder_evict,
    .alloc = engine_alloc,
};

void engine_attach(struct store *s)
{
    s->room = engine_room;
    s->core = &engine_core_ops;
}

void engine_stop(struct store *s)
{
    engine_gpu_stop(s);   /* its copies read and write the arenas */
    quant_free(s->quant); /* its jobs hold slots of the arenas */
    s->quant = NULL;
    engine_remote_free(s); /* its reads and writes hold slots and pins */
    engine_disk_free(s);
}
