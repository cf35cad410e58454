/*
 * store_policy.c — the policy library (policies/) inside the store: each namespace's policy
 * and tuner, the metadata the policies read, client hints, budgeted lookups, and the tier
 * engine's per-block decisions under pressure.
 *
 * DESIGN
 * Selection. A namespace ranks with its own policy: its [namespace.PATTERN] section's
 * `policy`, else cache.policy, changed at run time by POLICY_SET (store_ns_policy_set).
 * Under POLICY_DEFAULT the namespace holds a policy_tune (created on its first reference,
 * sized to its arena in blocks) fed with every key a lookup references, in prefix order (not
 * again at commit: the commit of a miss follows its lookup, and counting both would make
 * every block look reused); its advice becomes the namespace's half-life. Other policies
 * adapt the half-life to the observed reuse intervals (policy_params_observe_reuse on every
 * hit and ghost).
 *
 * Metadata. struct block is at its budget (96 bytes + ~6 of map, 128 in all), so what the
 * policies need beyond it (decayed frequency, H2O mass and its time, SnapKV score, a handle
 * to a Quest summary, heap positions, the value norm) is a 32-byte side table by block
 * index, reset at commit. Hits call
 * policy_touch, hints policy_hint; the key norm is the quantize pass's (store.keysum, written by quant.c);
 * depth 0 is the sink flag. Quest summaries (per channel key min and max of a block, summed
 * over its layers and heads) come from the same pass, so only quantized blocks have one:
 * the daemon never reads a raw block's bytes on the loop thread. A block without one gets
 * an unbounded Quest bound (it may hold the largest score, so a budgeted read never drops
 * it on no evidence). The same pass measures the mean value L1 norm (store_meta.vnorm, bf16)
 * that VATP multiplies with the H2O mass; a block never quantized ranks as under H2O.
 *
 * Eviction order (engine_victim, daemon/engine.c). Under LRU the sample is the 16 coldest
 * evictable leaves, as before. Under any other policy the namespace of the coldest evictable
 * leaf gives its policy's first evictable leaf exactly: the namespace keeps a binary heap of
 * its blocks in its arena's memory with no cached child, by policy_key (time-invariant, so
 * the heap moves only when a block changes: store_heap_sync from the LRU list's link and
 * unlink, children, pins, hints, quantization). A pinned block leaves the heap while pinned
 * (store_block_pin), so a tenant holding leases cannot fill the heap's top; a moving block
 * stays in and is passed over by a best-first walk; the heap is re-keyed when the half-life
 * moves by more than 5 %. A
 * sample (tail window plus random probes) remains as the fallback and for clean lists.
 * Between namespaces the order stays LRU.
 *
 * Ghosts. A block evicted (engine_evict) under a policy other than LRU leaves its decayed
 * count in a set-associative table (cache.ghosts x the namespace's capacity in blocks, at
 * most 1/1024 of host memory past a floor of 512 KiB); committed again within that window it
 * gets it back (policy_ghost_restore), as kvcsim's ghost entries do.
 *
 * Actions (engine_policy_trim). When a namespace other than LRU exists, engine_trim runs this
 * engine instead of the fixed quantize-then-demote-then-drop order: per round the coldest
 * namespace's sample (leaves and inner blocks) goes to policy_decide with what the engine
 * can do for it — quantize when the namespace's creator allowed codecs (its recipe is the
 * per-layer plan: raw_layers raw, then the recipe's codec) and the worker has room, offload
 * when a disk tier exists, drop always — and the actions are carried out (quantize-in-place,
 * a disk write, an eviction). Queued quantizations and writes count as freed. A round that
 * finds no action falls back to engine_victim. Namespaces with only "drop" available skip
 * policy_decide and use engine_victim directly (the same ranking, without the walk over
 * inner blocks). The miss cost is the recompute time of a block (block_tokens /
 * cache.recompute_tokens_per_s), the disk cost a read at STORE_POLICY_DISK_BPS.
 *
 * The precision ladder (store_ladder_*, docs/policies.md): a namespace with codecs keeps, besides
 * its leaf heap, a heap per rung over the blocks that may step down (inner blocks too) and the
 * bytes each rung holds; store_ladder_pick is policy_ladder_pick over them, the decision
 * kvcsim's ladder makes. The engine (engine_ladder_step) carries the steps out; the rung
 * heaps share the leaf heap's key, half-life and syncs.
 * Owned by the loop thread.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store.h"
#include "kernels/kern.h"
#include "tiers/tier.h"

#define STORE_POLICY_UNBOUNDED 1e30f

/* ---- namespaces ----------------------------------------------------------------------- */

static void store_ns_tune_drop(struct store_ns *ns)
{
    if (!ns->tune)
        return;
    policy_tune_free(ns->tune);
    free(ns->tune);
    ns->tune = NULL;
    ns->pp.adapt = 1;
}

int store_ns_policy_set(struct store *s, uint32_t ns_id, int kind, enum store_policy_src src)
{
    struct store_ns *ns = store_ns_get(s, ns_id);
    if (!ns)
        return -ENOENT;
    if (kind >= POLICY_KIND_COUNT)
        return -EINVAL;
    if (kind < 0) {
        kind = (int)s->p.policy;
        src = STORE_POLICY_SRC_DEFAULT;
    }
    if (ns->policy != kind)
        ns->heap_stale = true;
    ns->policy = (uint8_t)kind;
    ns->policy_src = (uint8_t)src;
    if (kind != POLICY_DEFAULT)
        store_ns_tune_drop(ns);
    if (!s->heap_defer)
        store_heap_rebuild_stale(s);
    return 0;
}

bool store_policy_engine(const struct store *s)
{
    for (uint32_t i = 1; i < s->nns; i++)
        if (s->ns[i] && s->ns[i]->policy != POLICY_LRU)
            return true;
    return false;
}

/* ---- metadata side table ------------------------------------------------------------- */

static struct store_meta *store_meta_at(struct store *s, uint32_t idx)
{
    if (idx >= s->nmeta) {
        uint64_t n = s->nmeta ? s->nmeta : 1024;
        while (n <= idx)
            n *= 2;
        struct store_meta *m = realloc(s->meta, (size_t)n * sizeof(*m));
        if (!m)
            return NULL;
        memset(m + s->nmeta, 0, (size_t)(n - s->nmeta) * sizeof(*m));
        s->meta = m;
        s->nmeta = (uint32_t)n;
    }
    return &s->meta[idx];
}

/* Block idx's entry of the hint and codec table, grown to hold it. NULL on ENOMEM. */
static struct store_meta_x *store_meta_x_at(struct store *s, uint32_t idx)
{
    if (idx >= s->nmeta_x) {
        uint64_t n = s->nmeta_x ? s->nmeta_x : 1024;
        while (n <= idx)
            n *= 2;
        struct store_meta_x *m = realloc(s->meta_x, (size_t)n * sizeof(*m));
        if (!m)
            return NULL;
        memset(m + s->nmeta_x, 0, (size_t)(n - s->nmeta_x) * sizeof(*m));
        s->meta_x = m;
        s->nmeta_x = (uint32_t)n;
    }
    return &s->meta_x[idx];
}

/* Block idx's entry of the rung heap positions, grown to hold it. NULL on ENOMEM. */
static uint32_t *store_rpos_at(struct store *s, uint32_t idx)
{
    if (idx >= s->nrpos) {
        uint64_t n = s->nrpos ? s->nrpos : 1024;
        while (n <= idx)
            n *= 2;
        uint32_t *r = realloc(s->rpos, (size_t)n * sizeof(*r));
        if (!r)
            return NULL;
        memset(r + s->nrpos, 0, (size_t)(n - s->nrpos) * sizeof(*r));
        s->rpos = r;
        s->nrpos = (uint32_t)n;
    }
    return &s->rpos[idx];
}

/* Block idx's place in a rung heap (store.rpos), 0 when in none. */
static uint32_t store_rpos_get(const struct store *s, uint32_t idx)
{
    return idx < s->nrpos ? s->rpos[idx] : 0;
}

/* The same without growing it: NULL when idx has none (every field 0). */
static const struct store_meta_x *store_meta_x_get(const struct store *s, uint32_t idx)
{
    return idx < s->nmeta_x ? &s->meta_x[idx] : NULL;
}

static void store_meta_quest_drop(struct store *s, struct store_meta_x *m)
{
    if (!m->quest)
        return;
    uint32_t slot = m->quest - 1;
    free(s->qsum[slot]);
    s->qsum[slot] = NULL;
    s->qfree[s->nqfree++] = slot; /* qfree has qcap entries: never full */
    m->quest = 0;
}

/* ---- namespace heaps ------------------------------------------------------------------- */

struct store_heap_ent {
    double key;     /* policy_key with the namespace's params as of heap_hl */
    uint32_t idx;   /* block index */
    uint32_t depth; /* ties: the deeper block first (policy_rank's rule), then the lower index */
};

/* A block's place in a rung heap (store.rpos): the rung above, 1 + its position below. */
#define STORE_RPOS_SHIFT 29
#define STORE_RPOS_MASK ((1u << STORE_RPOS_SHIFT) - 1)

static bool store_heap_less(const struct store_heap_ent *a, const struct store_heap_ent *b)
{
    if (a->key != b->key)
        return a->key < b->key;
    if (a->depth != b->depth)
        return a->depth > b->depth;
    return a->idx < b->idx;
}

static void store_heap_place(struct store *s, struct store_heap *h, uint32_t i)
{
    if (h->rung) /* store_heap_in made its entry */
        s->rpos[h->a[i].idx] = (uint32_t)(h->rung - 1) << STORE_RPOS_SHIFT | (i + 1);
    else
        s->meta[h->a[i].idx].hpos = i + 1;
}

/* 1 + idx's position in h, 0 when it is not in h. */
static uint32_t store_heap_at(const struct store *s, const struct store_heap *h, uint32_t idx)
{
    uint32_t r;
    if (!h->rung)
        return idx < s->nmeta ? s->meta[idx].hpos : 0;
    r = store_rpos_get(s, idx);
    if (!r || r >> STORE_RPOS_SHIFT != (uint32_t)(h->rung - 1))
        return 0;
    return r & STORE_RPOS_MASK;
}

static void store_heap_up(struct store *s, struct store_heap *h, uint32_t i)
{
    struct store_heap_ent e = h->a[i];
    while (i > 0 && store_heap_less(&e, &h->a[(i - 1) / 2])) {
        h->a[i] = h->a[(i - 1) / 2];
        store_heap_place(s, h, i);
        i = (i - 1) / 2;
    }
    h->a[i] = e;
    store_heap_place(s, h, i);
}

static void store_heap_down(struct store *s, struct store_heap *h, uint32_t i)
{
    struct store_heap_ent e = h->a[i];
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && store_heap_less(&h->a[c + 1], &h->a[c]))
            c++;
        if (!store_heap_less(&h->a[c], &e))
            break;
        h->a[i] = h->a[c];
        store_heap_place(s, h, i);
        i = c;
    }
    h->a[i] = e;
    store_heap_place(s, h, i);
}

/* Takes idx out of h (it must be in it). */
static void store_heap_out(struct store *s, struct store_heap *h, uint32_t idx)
{
    uint32_t i = store_heap_at(s, h, idx) - 1;
    if (h->rung)
        s->rpos[idx] = 0;
    else
        s->meta[idx].hpos = 0;
    if (i >= h->n || --h->n == i)
        return;
    uint32_t moved = h->a[h->n].idx;
    h->a[i] = h->a[h->n];
    store_heap_up(s, h, i);
    store_heap_down(s, h, store_heap_at(s, h, moved) - 1);
}

/* Puts e in h, or moves it to its new key. -ENOMEM leaves it out. */
static int store_heap_in(struct store *s, struct store_heap *h, const struct store_heap_ent *e)
{
    uint32_t at = store_heap_at(s, h, e->idx);
    if (at) {
        h->a[at - 1] = *e;
        store_heap_up(s, h, at - 1);
        store_heap_down(s, h, store_heap_at(s, h, e->idx) - 1);
        return 0;
    }
    if (h->rung && !store_rpos_at(s, e->idx))
        return -ENOMEM;
    if (h->n == h->cap) {
        uint32_t n = h->cap ? h->cap * 2 : 256;
        struct store_heap_ent *a = realloc(h->a, (size_t)n * sizeof(*a));
        if (!a)
            return -ENOMEM;
        h->a = a;
        h->cap = n;
    }
    h->a[h->n++] = *e;
    store_heap_up(s, h, h->n - 1);
    return 0;
}

/* Whether idx belongs in its namespace's heap. */
static struct store_ns *store_heap_owner(const struct store *s, uint32_t idx)
{
    const struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = b->ns < s->nns ? s->ns[b->ns] : NULL;
    if (!ns || ns->policy == POLICY_LRU || b->state != BLOCK_STATE_COMMITTED ||
        b->arena != ns->arena || b->children || b->pins || (b->flags & BLOCK_F_LOST))
        return NULL;
    return ns;
}

/* Whether idx belongs in a rung heap of its namespace's ladder, and which (*rung): committed
 * in its arena's memory, not pinned, not lost, not clean (its disk record holds it raw) and
 * not on the last rung. Blocks in motion stay in and are passed over. A sink that is a leaf is
 * in rung 0's heap although it never steps down: at the cold end it leaves the tier; one with
 * children is out until its last child goes (kvcsim parks it so). So is a block merge refused
 * (merge_refused: a leaf then leaves when the ladder takes it to merge again). */
static struct store_ns *store_rung_owner(const struct store *s, uint32_t idx, uint32_t *rung)
{
    const struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = b->ns < s->nns ? s->ns[b->ns] : NULL;
    if (!ns || ns->rungs < 2 || ns->policy == POLICY_LRU || b->state != BLOCK_STATE_COMMITTED ||
        b->arena != ns->arena || b->tier != KVC_WIRE_TIER_HOST || b->pins ||
        ((b->depth == 0 || b->merge_refused) && b->children) ||
        (b->flags & (BLOCK_F_LOST | BLOCK_F_DISK)))
        return NULL;
    *rung = store_ladder_rung(ns, b->format);
    return *rung + 1 < ns->rungs ? ns : NULL;
}

static bool store_heaps_empty(const struct store_ns *ns)
{
    for (uint32_t k = 0; k < POLICY_LADDER_RUNGS; k++)
        if (ns->rheap[k].n)
            return false;
    return !ns->heap.n;
}

void store_block_pin(struct store *s, uint32_t idx)
{
    if (s->ix.blocks[idx].pins++ == 0)
        store_heap_remove(s, idx);
}

void store_block_unpin(struct store *s, uint32_t idx)
{
    if (--s->ix.blocks[idx].pins == 0)
        store_heap_sync(s, idx);
}

/* idx's key with the half-life the heap is keyed with (one order for every entry). */
static double store_heap_key(const struct store *s, const struct store_ns *ns, uint32_t idx)
{
    struct policy_block pb;
    struct policy_params pp = ns->pp;
    if (ns->heap_hl > 0)
        pp.half_life = ns->heap_hl;
    store_policy_block(s, idx, &pb);
    return policy_key((enum policy_kind)ns->policy, &pb, &pp);
}

/* The rung heap idx is in, or NULL. */
static struct store_heap *store_rheap_of(struct store *s, uint32_t idx)
{
    uint32_t r;
    struct store_ns *ns;
    if (!store_rpos_get(s, idx))
        return NULL;
    r = s->rpos[idx] >> STORE_RPOS_SHIFT;
    ns = s->ns[s->ix.blocks[idx].ns];
    return ns && r < POLICY_LADDER_RUNGS ? &ns->rheap[r] : NULL;
}

void store_heap_remove(struct store *s, uint32_t idx)
{
    struct store_heap *rh = store_rheap_of(s, idx);
    struct store_ns *ns;
    if (rh)
        store_heap_out(s, rh, idx);
    if (idx >= s->nmeta || !s->meta[idx].hpos)
        return;
    ns = s->ns[s->ix.blocks[idx].ns];
    if (!ns) { /* not reachable: a namespace goes only once it holds no block */
        s->meta[idx].hpos = 0;
        return;
    }
    store_heap_out(s, &ns->heap, idx);
}

void store_heap_sync(struct store *s, uint32_t idx)
{
    struct store_ns *ns = store_heap_owner(s, idx), *rns;
    struct store_heap *rh = store_rheap_of(s, idx);
    uint32_t rung = 0;
    struct store_heap_ent e;
    rns = store_rung_owner(s, idx, &rung);
    if (rh && (!rns || rh != &rns->rheap[rung]))
        store_heap_out(s, rh, idx);
    if (!ns && s->meta && idx < s->nmeta && s->meta[idx].hpos)
        store_heap_out(s, &s->ns[s->ix.blocks[idx].ns]->heap, idx);
    if (!ns && !rns)
        return;
    if (!store_meta_at(s, idx))
        return; /* no memory: the block is found by the sampled path instead */
    ns = ns ? ns : rns;
    if (store_heaps_empty(ns))
        ns->heap_hl = ns->pp.half_life;
    e = (struct store_heap_ent){
        .key = store_heap_key(s, ns, idx), .idx = idx, .depth = s->ix.blocks[idx].depth};
    if (store_heap_owner(s, idx))
        (void)store_heap_in(s, &ns->heap, &e);
    if (rns)
        (void)store_heap_in(s, &rns->rheap[rung], &e);
}

static void store_heap_reset(struct store *s, struct store_heap *h)
{
    for (uint32_t i = 0; i < h->n; i++) {
        if (h->rung)
            s->rpos[h->a[i].idx] = 0;
        else
            s->meta[h->a[i].idx].hpos = 0;
    }
    h->n = 0;
}

void store_heap_rebuild_stale(struct store *s)
{
    bool any = false;
    for (uint32_t n = 1; n < s->nns; n++) {
        struct store_ns *ns = s->ns[n];
        if (!ns || !ns->heap_stale)
            continue;
        store_heap_reset(s, &ns->heap);
        for (uint32_t k = 0; k < POLICY_LADDER_RUNGS; k++)
            store_heap_reset(s, &ns->rheap[k]);
        ns->heap_hl = ns->pp.half_life;
        any = true;
    }
    /* One pass over the blocks for every namespace that changed (a reload changes many). */
    for (uint32_t i = 0; any && i < s->ix.nblocks; i++) {
        const struct block *b = &s->ix.blocks[i];
        uint32_t r;
        if (b->ns < s->nns && s->ns[b->ns] && s->ns[b->ns]->heap_stale &&
            (store_heap_owner(s, i) || store_rung_owner(s, i, &r)))
            store_heap_sync(s, i);
    }
    for (uint32_t n = 1; n < s->nns; n++)
        if (s->ns[n])
            s->ns[n]->heap_stale = false;
}

static void store_heap_rekey_one(struct store *s, struct store_ns *ns, struct store_heap *h)
{
    for (uint32_t i = 0; i < h->n; i++)
        h->a[i].key = store_heap_key(s, ns, h->a[i].idx);
    for (uint32_t i = h->n / 2; i-- > 0;)
        store_heap_down(s, h, i);
}

/* Keys follow the half-life: rekeyed in place when it moved by more than 5 % (the order
 * between rekeys is that of the old half-life, as the simulator's). */
static void store_heap_rekey(struct store *s, struct store_ns *ns)
{
    if (fabs(ns->pp.half_life - ns->heap_hl) <= 0.05 * ns->heap_hl)
        return;
    ns->heap_hl = ns->pp.half_life;
    store_heap_rekey_one(s, ns, &ns->heap);
    for (uint32_t k = 0; k < POLICY_LADDER_RUNGS; k++)
        store_heap_rekey_one(s, ns, &ns->rheap[k]);
}

/* Best-first walk of h's tree (a small heap of positions) without changing it: blocks that
 * may not go now (pinned, moving) are passed over. Stops at max blocks, or at the first of
 * size class cls (cls < 0: none stops it): what follows it cannot change store_heap_victim's
 * choice, and each block passed is a read of memory a large tier has out of the caches. */
static uint32_t store_heap_walk(struct store *s, struct store_ns *ns, struct store_heap *h,
                                bool (*ok)(const struct store *s, uint32_t idx, void *arg),
                                void *arg, uint32_t *out, uint32_t max, int cls)
{
    uint32_t open[2 * STORE_HEAP_SCAN + 2], nopen = 0, n = 0;
    if (!h->n || !max)
        return 0;
    store_heap_rekey(s, ns);
    open[nopen++] = 0;
    for (uint32_t seen = 0; nopen && seen < STORE_HEAP_SCAN; seen++) {
        uint32_t best = 0;
        for (uint32_t k = 1; k < nopen; k++)
            if (store_heap_less(&h->a[open[k]], &h->a[open[best]]))
                best = k;
        uint32_t pos = open[best];
        open[best] = open[--nopen];
        if (ok(s, h->a[pos].idx, arg)) {
            out[n++] = h->a[pos].idx;
            if (n == max || (cls >= 0 && s->ix.blocks[h->a[pos].idx].cls == cls))
                break;
        }
        for (uint32_t c = 2 * pos + 1; c <= 2 * pos + 2; c++)
            if (c < h->n)
                open[nopen++] = c;
    }
    return n;
}

uint32_t store_heap_first(struct store *s, struct store_ns *ns,
                          bool (*ok)(const struct store *s, uint32_t idx, void *arg), void *arg,
                          uint32_t *out, uint32_t max)
{
    return store_heap_walk(s, ns, &ns->heap, ok, arg, out, max, -1);
}

uint32_t store_heap_victim(struct store *s, struct store_ns *ns,
                           bool (*ok)(const struct store *s, uint32_t idx, void *arg), void *arg,
                           int cls)
{
    uint32_t first[16],
        n = store_heap_walk(s, ns, &ns->heap, ok, arg, first, cls < 0 ? 1 : 16, cls);
    for (uint32_t k = 0; k < n; k++)
        if (cls < 0 || s->ix.blocks[first[k]].cls == cls)
            return first[k];
    return n ? first[0] : INDEX_NONE;
}

void store_heap_ahead(const struct store *s, const struct store_ns *ns)
{
    const struct store_heap *h = &ns->heap;
    for (uint32_t p = 1; p < 7 && p < h->n; p++)
        __builtin_prefetch(&s->ix.blocks[h->a[p].idx]);
}

void store_heap_free(struct store_ns *ns)
{
    free(ns->head_mass);
    ns->head_mass = NULL;
    ns->head_seen = 0;
    free(ns->heap.a);
    ns->heap = (struct store_heap){0};
    store_ladder_free(ns);
}

static const char *store_heap_check_one(const struct store *s, const struct store_ns *ns,
                                        const struct store_heap *h, uint32_t *total)
{
    *total += h->n;
    for (uint32_t i = 0; i < h->n; i++) {
        uint32_t idx = h->a[i].idx, r = 0;
        if (idx >= s->ix.nblocks || store_heap_at(s, h, idx) != i + 1)
            return "a heap entry's block does not point back at it";
        if (h->rung ? store_rung_owner(s, idx, &r) != ns || r + 1 != h->rung
                    : store_heap_owner(s, idx) != ns)
            return "a block is in a heap it does not belong to";
        if (i && store_heap_less(&h->a[i], &h->a[(i - 1) / 2]))
            return "heap order broken";
        if (h->a[i].key != store_heap_key(s, ns, idx))
            return "a heap key is stale";
    }
    return NULL;
}

const char *store_heap_check(const struct store *s)
{
    uint32_t total = 0;
    const char *why;
    for (uint32_t n = 1; n < s->nns; n++) {
        const struct store_ns *ns = s->ns[n];
        if (!ns)
            continue;
        if ((why = store_heap_check_one(s, ns, &ns->heap, &total)))
            return why;
        for (uint32_t k = 0; k < POLICY_LADDER_RUNGS; k++)
            if ((why = store_heap_check_one(s, ns, &ns->rheap[k], &total)))
                return why;
        /* The ladder's bytes per rung, counted again. */
        uint64_t bytes[POLICY_LADDER_RUNGS] = {0};
        for (uint32_t i = 0; ns->rungs >= 2 && i < s->ix.nblocks; i++) {
            const struct block *b = &s->ix.blocks[i];
            if (b->ns == ns->id && b->state == BLOCK_STATE_COMMITTED && b->arena == ns->arena)
                bytes[store_ladder_rung(ns, b->format)] += b->len;
        }
        for (uint32_t k = 0; k < POLICY_LADDER_RUNGS; k++)
            if (bytes[k] != ns->rung_bytes[k])
                return "a rung's bytes are not those of its blocks";
    }
    for (uint32_t i = 0; i < s->ix.nblocks; i++) {
        uint32_t r;
        bool in = i < s->nmeta && s->meta[i].hpos, rin = store_rpos_get(s, i) != 0;
        if (store_heap_owner(s, i) && !in)
            return "an evictable block is missing from its namespace's heap";
        if (store_rung_owner(s, i, &r) && !rin)
            return "a block that may step down is missing from its rung's heap";
        total -= in + rin;
    }
    return total ? "heap entries counted twice" : NULL;
}

/* ---- what a block costs in a format --------------------------------------------------- */

/* The kernel layout of namespace ns's blocks. */
void store_ns_kern_layout(const struct store_ns *ns, struct kern_layout *lay)
{
    *lay = (struct kern_layout){.layers = ns->layout.layers,
                                .heads = ns->layout.kv_heads,
                                .head_dim = ns->layout.head_dim,
                                .tokens = ns->layout.block_tokens,
                                .dtype = ns->layout.dtype,
                                .k_only = kvc_wire_layout_kinds(&ns->layout) == 1};
}

/* The format of ns's first lossy rung: its recipe's key codec, or its value codec when keys
 * stay raw. */
uint8_t store_ns_first_format(const struct store_ns *ns)
{
    uint32_t f = ns->layout.flags;
    return (uint8_t)(KVC_WIRE_QUANT_K(f) ? KVC_WIRE_QUANT_K(f) : KVC_WIRE_QUANT_V(f));
}

/* The recipe of ns's blocks in `format`: the creator's recipe for its first format; for the
 * others the same shape (raw layers, which of keys and values are quantized) in that codec. */
void store_ns_kern_recipe(const struct store_ns *ns, uint8_t format, struct kern_recipe *rec)
{
    uint32_t f = ns->layout.flags, k = KVC_WIRE_QUANT_K(f), v = KVC_WIRE_QUANT_V(f);
    if (format != store_ns_first_format(ns)) {
        k = k ? format : 0;
        v = v ? format : 0;
    }
    kern_recipe_fill(rec, k, v, KVC_WIRE_QUANT_RAW_LAYERS(f));
    /* ROT's rotation is fixed per namespace: its seed from the model id (FNV-1a) */
    uint32_t seed = 2166136261u;
    for (const char *c = ns->layout.model_id;
         *c && c < ns->layout.model_id + sizeof(ns->layout.model_id); c++)
        seed = (seed ^ (uint8_t)*c) * 16777619u;
    rec->seed = seed;
}

int64_t store_format_bytes(const struct store_ns *ns, uint8_t format)
{
    struct kern_layout lay;
    struct kern_recipe rec;
    if (format == KVC_WIRE_FORMAT_RAW)
        return (int64_t)ns->block_bytes;
    if (format >= KVC_WIRE_FORMAT_COUNT ||
        !(KVC_WIRE_QUANT_ALLOWED(ns->layout.flags) & (1u << format)))
        return -EINVAL;
    store_ns_kern_layout(ns, &lay);
    store_ns_kern_recipe(ns, format, &rec);
    return kern_encoded_size(&lay, &rec);
}

/* ---- the precision ladder --------------------------------------------------------------- */

uint32_t store_ladder_rung(const struct store_ns *ns, uint32_t format)
{
    if (format == KVC_WIRE_FORMAT_RAW || ns->rungs < 2)
        return 0;
    for (uint32_t k = 1; k < ns->rungs; k++)
        if (ns->rung_format[k] == format)
            return k;
    return ns->rungs - 1u; /* a lossy format off the ladder (a record of an older recipe) */
}

void store_ladder_account(struct store *s, uint32_t idx, int sign)
{
    const struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = b->ns < s->nns ? s->ns[b->ns] : NULL;
    uint64_t *r;
    if (!ns || ns->rungs < 2 || b->arena != ns->arena || b->state != BLOCK_STATE_COMMITTED)
        return;
    r = &ns->rung_bytes[store_ladder_rung(ns, b->format)];
    if (sign > 0)
        *r += b->len;
    else
        *r = *r > b->len ? *r - b->len : 0;
}

void store_ladder_setup(struct store *s, struct store_ns *ns)
{
    uint32_t allowed = KVC_WIRE_QUANT_ALLOWED(ns->layout.flags);
    uint32_t f = ns->layout.flags;
    int64_t last = (int64_t)ns->block_bytes;
    if (ns->merge_off)
        allowed &= ~(1u << KVC_WIRE_FORMAT_MERGE);
    struct tier *t = s->arenas[ns->arena].tier;
    uint8_t old = ns->rungs;
    for (uint32_t k = 0; k < POLICY_LADDER_RUNGS; k++)
        ns->rheap[k].rung = (uint8_t)(k + 1);
    ns->rungs = 0;
    memset(ns->rung_format, 0, sizeof(ns->rung_format));
    if (allowed) {
        /* Rung 1: the creator's recipe; then each allowed codec smaller than the rung above,
         * largest first, within the fidelity budget; the smallest always last. */
        uint32_t first = KVC_WIRE_QUANT_K(f) ? KVC_WIRE_QUANT_K(f) : KVC_WIRE_QUANT_V(f);
        if (!(allowed & (1u << first)))
            first = 0; /* the recipe, merge, is off: the largest allowed codec is rung 1 */
        ns->rung_format[0] = KVC_WIRE_FORMAT_RAW;
        ns->rungs = 1;
        for (;;) {
            int64_t best = 0;
            uint32_t pick = 0;
            for (uint32_t c = 1; c < KVC_WIRE_FORMAT_COUNT; c++) {
                int64_t n;
                if (!(allowed & (1u << c)) || (ns->rungs == 1 && first && c != first) ||
                    (ns->max_error > 0 &&
                     kern_codec_attn_error((enum kern_codec)c) > ns->max_error))
                    continue;
                n = store_format_bytes(ns, (uint8_t)c);
                /* of equal sizes the more precise (rot4 before kivi4 and q4_1) */
                if (n > 0 && n < last &&
                    (n > best || (n == best && kern_codec_attn_error((enum kern_codec)c) <
                                                   kern_codec_attn_error((enum kern_codec)pick)))) {
                    best = n;
                    pick = c;
                }
            }
            if (!pick)
                break;
            /* More codecs than rungs: the smallest stays the last rung (what the tier's
             * capacity comes from) in place of the one before it. */
            if (ns->rungs == POLICY_LADDER_RUNGS)
                ns->rungs--;
            ns->rung_format[ns->rungs++] = (uint8_t)pick;
            last = best;
        }
        if (ns->rungs < 2)
            ns->rungs = 0;
    }
    policy_ladder_init(&ns->ladder, ns->rungs ? ns->rungs : 1, ns->lossy_weight,
                       (double)t->ops->capacity(t) / (double)ns->block_bytes);
    if (old || ns->rungs) {
        /* Its blocks counted again by the new rungs; the rung heaps rebuilt. */
        memset(ns->rung_bytes, 0, sizeof(ns->rung_bytes));
        for (uint32_t i = 0; i < s->ix.nblocks; i++) {
            if (s->ix.blocks[i].ns != ns->id)
                continue;
            /* new rungs: merge may have one after it */
            s->ix.blocks[i].merge_refused = 0;
            if (ns->rungs) /* a committed block is on its arena's list */
                store_ladder_account(s, i, +1);
        }
        ns->heap_stale = true;
        if (!s->heap_defer)
            store_heap_rebuild_stale(s);
    }
}

int store_ns_ladder_set(struct store *s, uint32_t ns_id, double lossy_weight, double max_error)
{
    struct store_ns *ns = store_ns_get(s, ns_id);
    if (!ns)
        return -ENOENT;
    if (ns->lossy_weight == lossy_weight && ns->max_error == max_error)
        return 0;
    ns->lossy_weight = lossy_weight;
    ns->max_error = max_error;
    store_ladder_setup(s, ns); /* the targets start again from an even split */
    return 0;
}

void store_ladder_free(struct store_ns *ns)
{
    for (uint32_t k = 0; k < POLICY_LADDER_RUNGS; k++) {
        free(ns->rheap[k].a);
        ns->rheap[k].a = NULL;
        ns->rheap[k].n = ns->rheap[k].cap = 0;
    }
}

int store_ladder_pick(struct store *s, struct store_ns *ns, int *out)
{
    double bytes[POLICY_LADDER_RUNGS] = {0}, cap = 0;
    int ready[POLICY_LADDER_RUNGS] = {0};
    *out = 1;
    if (ns->rungs < 2)
        return -1;
    for (uint32_t k = 0; k < ns->rungs; k++) {
        double b =
            (double)ns->rung_bytes[k] - (double)ns->rung_moving[k] + (double)ns->rung_coming[k];
        bytes[k] = b > 0 ? b : 0;
        cap += bytes[k];
        /* A rung whose blocks are all pinned or in motion is passed over, as kvcsim's rung
         * whose heap is empty. */
        ready[k] =
            k + 1 < ns->rungs ? store_ladder_first(s, ns, k) != INDEX_NONE : ns->rung_bytes[k] > 0;
    }
    return policy_ladder_pick(&ns->ladder, bytes, cap, ready, out);
}

uint32_t store_ladder_dest(struct store *s, struct store_ns *ns, uint32_t v, uint32_t k)
{
    double bytes[POLICY_LADDER_RUNGS] = {0}, cap = 0, key, vb;
    uint32_t j = k + 1;
    if (ns->rungs < 2 || k + 1 >= ns->rungs)
        return k;
    for (uint32_t r = 0; r < ns->rungs; r++) {
        double b =
            (double)ns->rung_bytes[r] - (double)ns->rung_moving[r] + (double)ns->rung_coming[r];
        bytes[r] = b > 0 ? b : 0;
        cap += bytes[r];
    }
    key = store_heap_key(s, ns, v);
    vb = (double)s->ix.blocks[v].len;
    bytes[k] = bytes[k] > vb ? bytes[k] - vb : 0;
    for (;; j++) {
        double sz = (double)store_format_bytes(ns, ns->rung_format[j]), cum = 0;
        bytes[j] += sz;
        cap += sz - vb;
        vb = sz;
        if (j + 1 >= ns->rungs)
            break;
        for (uint32_t r = 0; r <= j; r++)
            cum += bytes[r];
        if (cum <= ns->ladder.below[j] * cap)
            break; /* rungs 0..j within their target with it: it rests on j */
        /* Rung j is over its target: its coldest block goes down next. Under a target of 0
         * every block of it does, so v too; otherwise v goes on only if it is the coldest. */
        if (ns->ladder.below[j] > 0) {
            uint32_t w = store_ladder_first(s, ns, j);
            if (w != INDEX_NONE && store_heap_key(s, ns, w) < key)
                break;
        }
        bytes[j] -= sz;
    }
    return j;
}

static bool store_ladder_ok(const struct store *s, uint32_t idx, void *arg)
{
    (void)arg;
    return store_block_idle(s, idx) && s->ix.blocks[idx].tier == KVC_WIRE_TIER_HOST;
}

uint32_t store_ladder_first(struct store *s, struct store_ns *ns, uint32_t rung)
{
    uint32_t v;
    if (rung + 1 >= ns->rungs)
        return INDEX_NONE;
    return store_heap_walk(s, ns, &ns->rheap[rung], store_ladder_ok, NULL, &v, 1, -1) ? v
                                                                                        : INDEX_NONE;
}

/* ---- ghosts ---------------------------------------------------------------------------- */

#define STORE_GHOST_WAYS 4 /* entries per set: the oldest of a full set is replaced */
/* Entries of the first table (64 KiB); it grows towards the window as evictions come. */
#define STORE_GHOST_MIN 4096u
/* Entries the budget allows at least, whatever the arenas (512 KiB): a cache of up to 2,730
 * blocks keeps the whole window of cache.ghosts = 8 (the table wants 1.5 x the window, a
 * 4-way set loses a ghost within it at fewer). Without it the byte budget alone held 4,096 at
 * a 64 MiB arena of 64 KiB blocks, half the window of 8,192 evictions: half of kvcsim's ghost
 * hits (13,700 of 31,500 on the shared trace under the precision ladder), and a returning
 * block ranked as a new one. */
#define STORE_GHOST_FLOOR 32768u
/* Ghost memory at most 1/1024 of the host arenas' past the floor: a 16-byte ghost per
 * 16 KiB, so one for every fourth block at 4 KiB blocks (4 B a block at a million of them;
 * 1/128 took 16), one for every other block at 8 KiB (2Q's A1out: half the cache), one per
 * block at 16 KiB (ARC's ghost lists: the cache's size), and the whole window of
 * cache.ghosts = 8 from blocks of 256 KiB up. The table keeps the most recent evictions;
 * kvcsim keeps every one within the window (its --ghost F with F below 1 is what a smaller
 * table does). */
#define STORE_GHOST_MEM_DIV 1024u
#define STORE_GHOST_TAG_MASK 0xffffffffffff0000ull /* the tag's bits in store_ghost.tf */

/* 16 bytes: the tag's top 48 bits share a word with the count as a bfloat16, the time is
 * kept in STORE_META_TSHIFT units as store_meta's. */
struct store_ghost {
    uint64_t tf;  /* store_ghost_tag(namespace, key) (its top 48 bits; 0: empty) | bf16 freq */
    uint32_t t;   /* the block's last access before it went >> STORE_META_TSHIFT */
    uint32_t seq; /* store.ghost_seq when it went */
};
_Static_assert(sizeof(struct store_ghost) == 16, "a ghost is 16 bytes");

static uint16_t store_ghost_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* rounded to nearest even */
}

static float store_ghost_freq(const struct store_ghost *g)
{
    uint32_t u = (uint32_t)(g->tf & 0xffffu) << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Evictions within which a ghost of ns still counts: cache.ghosts x its capacity in blocks. */
static uint32_t store_ghost_window(const struct store *s, const struct store_ns *ns)
{
    const struct tier *t = s->arenas[ns->arena].tier;
    double w = s->p.ghosts * (double)t->ops->capacity((struct tier *)t) /
               (double)(ns->block_bytes ? ns->block_bytes : 1);
    return w >= 2147483647.0 ? 2147483647u : (uint32_t)w;
}

static uint64_t store_ghost_tag(const struct store *s, uint16_t ns, const struct kvc_wire_key *k)
{
    uint64_t x = k->lo ^ (k->hi * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)ns << 48) ^ s->ghost_salt;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (x & STORE_GHOST_TAG_MASK) | 0x10000u; /* never 0 in the tag's bits */
}

static struct store_ghost *store_ghost_set(const struct store *s, uint64_t tag)
{
    /* Any number of sets (the budget, not a power of two): the tag's top half scaled. */
    uint32_t set = (uint32_t)(((tag >> 32) * (s->nghost / STORE_GHOST_WAYS)) >> 32);
    return &s->ghost[(size_t)set * STORE_GHOST_WAYS];
}

static void store_ghost_put(struct store *s, const struct store_ghost *g)
{
    uint64_t tag = g->tf & STORE_GHOST_TAG_MASK;
    struct store_ghost *set = store_ghost_set(s, tag), *v = set;
    for (uint32_t w = 0; w < STORE_GHOST_WAYS; w++) {
        if ((set[w].tf & STORE_GHOST_TAG_MASK) == tag || set[w].tf == 0) {
            v = &set[w];
            break;
        }
        if ((uint32_t)(s->ghost_seq - set[w].seq) > (uint32_t)(s->ghost_seq - v->seq))
            v = &set[w];
    }
    *v = *g;
}

/* Sizes the table for ns's window (grown, never shrunk; what it held is kept). */
static int store_ghost_fit(struct store *s, const struct store_ns *ns)
{
    uint64_t want = STORE_GHOST_MIN, w = store_ghost_window(s, ns);
    /* Called on every eviction: the table mostly fits already, or is at its largest. */
    if ((s->nghost && s->nghost >= w + w / 2) || (s->ghost_cap && s->nghost == s->ghost_cap))
        return 0;
    if (!s->ghost_cap) { /* the host arenas are fixed at start: their size once */
        uint64_t mem = 0, cap;
        for (uint32_t a = 0; a < s->narenas; a++)
            mem += s->arenas[a].tier->ops->capacity(s->arenas[a].tier);
        cap = mem / STORE_GHOST_MEM_DIV / sizeof(struct store_ghost) / STORE_GHOST_WAYS *
              STORE_GHOST_WAYS;
        s->ghost_cap = (uint32_t)(cap < STORE_GHOST_FLOOR ? STORE_GHOST_FLOOR
                                  : cap > (1u << 30)      ? 1u << 30
                                                          : cap);
    }
    while (want < w + w / 2 && want < s->ghost_cap)
        want *= 2;
    if (want > s->ghost_cap)
        want = s->ghost_cap;
    if (want <= s->nghost)
        return 0;
    struct store_ghost *old = s->ghost, *g = calloc(want, sizeof(*g));
    uint32_t nold = s->nghost;
    if (!g)
        return -ENOMEM;
    if (!old) {
        s->rng ^= s->rng << 13;
        s->rng ^= s->rng >> 7;
        s->rng ^= s->rng << 17;
        s->ghost_salt = s->rng;
    }
    s->ghost = g;
    s->nghost = (uint32_t)want;
    for (uint32_t i = 0; i < nold; i++)
        if (old[i].tf)
            store_ghost_put(s, &old[i]);
    free(old);
    return 0;
}

void store_ghost_note(struct store *s, uint32_t idx)
{
    const struct block *b = &s->ix.blocks[idx];
    const struct store_ns *ns = s->ns[b->ns];
    if (!ns || ns->policy == POLICY_LRU || s->p.ghosts <= 0 || b->state != BLOCK_STATE_COMMITTED ||
        store_ghost_fit(s, ns))
        return;
    float freq = idx < s->nmeta && s->meta[idx].freq > 0 ? s->meta[idx].freq : 1.0f;
    s->ghost_seq++;
    store_ghost_put(s, &(struct store_ghost){
                           .tf = store_ghost_tag(s, b->ns, &b->key) | store_ghost_bf16(freq),
                           .t = (uint32_t)(b->last_access >> STORE_META_TSHIFT),
                           .seq = s->ghost_seq,
                       });
}

/* The ghost of b's key if one was noted within its namespace's window; it is used up. */
static bool store_ghost_take(struct store *s, const struct store_ns *ns, const struct block *b,
                             struct store_ghost *out)
{
    if (!s->nghost || ns->policy == POLICY_LRU || s->p.ghosts <= 0)
        return false;
    uint64_t tag = store_ghost_tag(s, b->ns, &b->key);
    struct store_ghost *set = store_ghost_set(s, tag);
    for (uint32_t w = 0; w < STORE_GHOST_WAYS; w++) {
        if ((set[w].tf & STORE_GHOST_TAG_MASK) != tag)
            continue;
        *out = set[w];
        set[w].tf = 0;
        return (uint32_t)(s->ghost_seq - out->seq) < store_ghost_window(s, ns);
    }
    return false;
}

void store_meta_commit(struct store *s, uint32_t idx, uint64_t now)
{
    struct store_meta *m = store_meta_at(s, idx);
    const struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    struct store_ghost g;
    if (!m)
        return;
    *m = (struct store_meta){.freq = 1.0f, .hpos = m->hpos};
    if (idx < s->nrpos)
        s->rpos[idx] = 0;
    if (idx < s->nmeta_x) {
        store_meta_quest_drop(s, &s->meta_x[idx]);
        s->meta_x[idx] = (struct store_meta_x){0};
    }
    /* Back soon after its eviction: the count it had, decayed, plus this access; the gap
     * is a reuse interval the half-life learns from. */
    if (ns && store_ghost_take(s, ns, b, &g)) {
        struct policy_block pb = {.freq = 1.0f, .last_access = now};
        uint64_t gt = (uint64_t)g.t << STORE_META_TSHIFT;
        if (ns->pp.adapt && now > gt)
            policy_params_observe_reuse(&ns->pp, now - gt);
        policy_ghost_restore(&pb, store_ghost_freq(&g), gt, now, &ns->pp);
        m->freq = pb.freq;
        s->total.ghost_hits++;
        ns->stats.ghost_hits++;
        /* A miss more compression would have turned into a hit. */
        if (ns->rungs >= 2)
            policy_ladder_ghost_hit(&ns->ladder);
    }
}

void store_meta_prefetch(const struct store *s, uint32_t idx)
{
    const struct block *b = &s->ix.blocks[idx];
    const struct store_ns *ns = b->ns < s->nns ? s->ns[b->ns] : NULL;
    if (idx < s->nmeta)
        __builtin_prefetch(&s->meta[idx]);
    if (idx < s->nrpos)
        __builtin_prefetch(&s->rpos[idx]);
    if (s->nghost && ns && ns->policy != POLICY_LRU && s->p.ghosts > 0)
        __builtin_prefetch(store_ghost_set(s, store_ghost_tag(s, b->ns, &b->key)));
}

void store_meta_drop(struct store *s, uint32_t idx)
{
    if (idx >= s->nmeta)
        return;
    store_heap_remove(s, idx);
    s->meta[idx] = (struct store_meta){0};
    if (idx < s->nrpos)
        s->rpos[idx] = 0;
    if (idx < s->nmeta_x) {
        store_meta_quest_drop(s, &s->meta_x[idx]);
        s->meta_x[idx] = (struct store_meta_x){0};
    }
}

void store_meta_hit(struct store *s, uint32_t idx, uint64_t now)
{
    const struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    struct store_meta *m = store_meta_at(s, idx);
    struct policy_block pb = {.hits = b->hits, .last_access = b->last_access};
    if (!m)
        return;
    if (ns->pp.adapt && now > b->last_access)
        policy_params_observe_reuse(&ns->pp, now - b->last_access);
    pb.freq = m->freq;
    policy_touch(&pb, now, &ns->pp);
    m->freq = pb.freq;
}

void store_meta_ref(struct store *s, struct store_ns *ns, const struct kvc_wire_key *k,
                    uint32_t depth, uint64_t now)
{
    if (ns->policy != POLICY_DEFAULT)
        return;
    if (!ns->tune) {
        struct tier *t = s->arenas[ns->arena].tier;
        uint64_t cap = t->ops->capacity(t) / (ns->block_bytes ? ns->block_bytes : 1);
        struct policy_tune *tu = calloc(1, sizeof(*tu));
        if (!tu || policy_tune_init(tu, cap ? cap : 1)) {
            free(tu);
            return;
        }
        ns->tune = tu;
    }
    policy_tune_access(ns->tune, k->lo ^ (k->hi * 0x9e3779b97f4a7c15ull), depth, now);
    double h = policy_tune_half_life(ns->tune);
    if (h > 0) {
        ns->pp.half_life = h;
        ns->pp.adapt = 0;
    }
}

void store_meta_vnorm_set(struct store *s, uint32_t idx, float vnorm)
{
    struct store_meta_x *m = store_meta_x_at(s, idx);
    uint32_t u;
    if (!m)
        return;
    memcpy(&u, &vnorm, sizeof(u));
    m->vnorm = (uint16_t)(u >> 16);
}

bool store_meta_vnorm_known(const struct store *s, uint32_t idx)
{
    const struct store_meta_x *m = store_meta_x_get(s, idx);
    return m && m->vnorm != 0;
}

void store_meta_quest_set(struct store *s, uint32_t idx, float *kminmax, uint32_t dim)
{
    struct store_meta_x *m = store_meta_x_at(s, idx);
    uint32_t slot;
    if (!m)
        goto fail;
    store_meta_quest_drop(s, m);
    if (s->nqfree) {
        slot = s->qfree[--s->nqfree];
    } else {
        if (s->nqsum == s->qcap) {
            uint32_t n = s->qcap ? s->qcap * 2 : 256;
            float **q = realloc(s->qsum, n * sizeof(*q));
            if (q)
                s->qsum = q;
            uint32_t *d = realloc(s->qdim, n * sizeof(*d));
            if (d)
                s->qdim = d;
            uint32_t *f = realloc(s->qfree, n * sizeof(*f));
            if (f)
                s->qfree = f;
            if (!q || !d || !f)
                goto fail;
            s->qcap = n;
        }
        slot = s->nqsum++;
    }
    s->qsum[slot] = kminmax;
    s->qdim[slot] = dim;
    m->quest = slot + 1;
    return;
fail:
    free(kminmax);
}

void store_meta_free(struct store *s)
{
    for (uint32_t i = 0; i < s->nqsum; i++)
        free(s->qsum[i]);
    free(s->qsum);
    free(s->qdim);
    free(s->qfree);
    free(s->meta);
    free(s->meta_x);
    s->meta_x = NULL;
    s->nmeta_x = 0;
    free(s->rpos);
    s->rpos = NULL;
    s->nrpos = 0;
    free(s->ghost);
    s->ghost = NULL;
    s->nghost = 0;
    s->qsum = NULL;
    s->qdim = s->qfree = NULL;
    s->meta = NULL;
    s->nmeta = s->nqsum = s->qcap = s->nqfree = 0;
}

void store_policy_block(const struct store *s, uint32_t idx, struct policy_block *pb)
{
    const struct block *b = &s->ix.blocks[idx];
    float norm;
    *pb = (struct policy_block){.id = idx,
                                .hits = b->hits,
                                .last_access = b->last_access,
                                .bytes = b->len,
                                .depth = b->depth,
                                .children = b->children,
                                .freq = 1.0f};
    if (b->pins)
        pb->flags |= POLICY_BLOCK_PINNED;
    if (b->depth == 0)
        pb->flags |= POLICY_BLOCK_SINK;
    if (b->format != KVC_WIRE_FORMAT_RAW)
        pb->flags |= POLICY_BLOCK_QUANTIZED;
    if (b->tier == KVC_WIRE_TIER_DISK)
        pb->flags |= POLICY_BLOCK_ON_DISK;
    if (idx < s->nmeta) {
        const struct store_meta *m = &s->meta[idx];
        pb->freq = m->freq > 0 ? m->freq : 1.0f;
    }
    const struct store_meta_x *x = store_meta_x_get(s, idx);
    if (x) {
        pb->hint = x->hint;
        pb->snap = x->snap;
        pb->hint_time = (uint64_t)x->hint_t << STORE_META_TSHIFT;
        uint32_t v = (uint32_t)x->vnorm << 16; /* bf16 value norm (quant.c) */
        memcpy(&pb->value_norm, &v, sizeof(v));
    }
    if (b->format != KVC_WIRE_FORMAT_RAW && idx < s->nkeysum) {
        uint32_t u = s->keysum[idx] & 0xffff0000u; /* bf16 key norm (quant.c) */
        memcpy(&norm, &u, sizeof(norm));
        pb->key_norm = norm;
    }
}

/* ---- hints ---------------------------------------------------------------------------- */

int store_hint(struct store *s, uint32_t ns_id, uint32_t kind, const struct kvc_wire_hint *h,
               uint32_t n, uint64_t now)
{
    struct store_ns *ns = store_ns_get(s, ns_id);
    int applied = 0;
    if (!ns)
        return -ENOENT;
    if (kind != KVC_HINT_H2O && kind != KVC_HINT_SNAPKV)
        return -EINVAL;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t idx = index_find(&s->ix, (uint16_t)ns_id, &h[i].key);
        struct store_meta_x *m;
        if (idx == INDEX_NONE || s->ix.blocks[idx].state != BLOCK_STATE_COMMITTED ||
            (s->ix.blocks[idx].flags & BLOCK_F_LOST) || !store_meta_at(s, idx) ||
            !(m = store_meta_x_at(s, idx)))
            continue;
        if (kind == KVC_HINT_H2O) {
            struct policy_block pb = {.hint = m->hint,
                                      .hint_time = (uint64_t)m->hint_t << STORE_META_TSHIFT};
            policy_hint(&pb, h[i].score, now, &ns->pp);
            m->hint = pb.hint;
            m->hint_t = (uint32_t)(pb.hint_time >> STORE_META_TSHIFT);
        } else {
            m->snap = h[i].score;
        }
        store_heap_sync(s, idx);
        applied++;
    }
    s->total.hint_blocks += (uint64_t)applied;
    ns->stats.hint_blocks += (uint64_t)applied;
    return applied;
}

/* Per-head hints. A run of hinted blocks is one sequence's: the blocks of depth < sinks (or
 * 0) are its sinks, the STORE_HEAD_LOCAL_BLOCKS deepest of the call its local window. A head
 * whose mass falls on the sinks (resp. sinks plus window) for STORE_HEAD_RECOVER of its total
 * is sink-only (resp. local), as FastGen profiles heads by the attention they recover. */
#define STORE_HEAD_LOCAL_BLOCKS 2

int store_hint_heads(struct store *s, uint32_t ns_id, uint32_t kind,
                     const struct kvc_wire_key *keys, const float *score, uint32_t n,
                     uint32_t layers, uint32_t heads, uint64_t now)
{
    struct store_ns *ns = store_ns_get(s, ns_id);
    struct kvc_wire_hint one;
    uint32_t lh = layers * heads, maxdepth = 0, d;
    int applied = 0;
    if (!ns)
        return -ENOENT;
    if (kind != KVC_HINT_H2O && kind != KVC_HINT_SNAPKV)
        return -EINVAL;
    if (layers != ns->layout.layers || heads != ns->layout.kv_heads)
        return -EINVAL;
    if (!ns->head_mass && !(ns->head_mass = calloc(3 * (size_t)lh, sizeof(float))))
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t idx = index_find(&s->ix, (uint16_t)ns_id, &keys[i]);
        if (idx != INDEX_NONE && s->ix.blocks[idx].depth > maxdepth)
            maxdepth = s->ix.blocks[idx].depth;
    }
    for (uint32_t i = 0; i < n; i++) {
        const float *sc = score + (size_t)i * lh;
        uint32_t idx = index_find(&s->ix, (uint16_t)ns_id, &keys[i]);
        double sum = 0.0;
        float peak = 0.0f;
        for (uint32_t j = 0; j < lh; j++) {
            sum += sc[j];
            peak = sc[j] > peak ? sc[j] : peak;
        }
        one = (struct kvc_wire_hint){.key = keys[i], .score = (float)sum};
        if (store_hint(s, ns_id, kind, &one, 1, now) != 1)
            continue;
        applied++;
        if (sum > 0) {
            float conc = (float)(peak / (sum / lh));
            struct store_meta_x *m = store_meta_x_at(s, idx); /* store_hint made it */
            uint32_t u;
            memcpy(&u, &conc, sizeof(u));
            if (m)
                m->hpeak = (uint16_t)(u >> 16);
        }
        d = s->ix.blocks[idx].depth;
        bool sink = d == 0 || d < ns->pp.sinks;
        bool local = d + STORE_HEAD_LOCAL_BLOCKS > maxdepth;
        for (uint32_t j = 0; j < lh; j++) {
            if (sink)
                ns->head_mass[j] += sc[j];
            else if (local)
                ns->head_mass[lh + j] += sc[j];
            ns->head_mass[2 * (size_t)lh + j] += sc[j];
        }
        if (++ns->head_seen >= STORE_HEAD_AGE_BLOCKS) {
            for (size_t j = 0; j < 3 * (size_t)lh; j++)
                ns->head_mass[j] *= 0.5f;
            ns->head_seen /= 2;
        }
    }
    return applied;
}

int store_head_profile(const struct store *s, uint32_t ns_id, uint8_t *out)
{
    const struct store_ns *ns = store_ns_get(s, ns_id);
    int full = 0;
    if (!ns)
        return -ENOENT;
    uint32_t lh = ns->layout.layers * ns->layout.kv_heads;
    for (uint32_t j = 0; j < lh; j++) {
        const float *m = ns->head_mass;
        uint8_t k = STORE_HEAD_UNKNOWN;
        if (m && m[2 * (size_t)lh + j] > 0) {
            double all = m[2 * (size_t)lh + j];
            k = m[j] >= STORE_HEAD_RECOVER * all               ? STORE_HEAD_SINK
                : m[j] + m[lh + j] >= STORE_HEAD_RECOVER * all ? STORE_HEAD_LOCAL
                                                               : STORE_HEAD_FULL;
        }
        full += k == STORE_HEAD_FULL || k == STORE_HEAD_UNKNOWN;
        out[j] = k;
    }
    return full;
}

int store_head_raw(const struct store *s, uint32_t ns_id, uint8_t *out)
{
    const struct store_ns *ns = store_ns_get(s, ns_id);
    if (!ns || !ns->head_mass)
        return ns ? 0 : -ENOENT;
    uint32_t lh = ns->layout.layers * ns->layout.kv_heads, n = 0;
    store_head_profile(s, ns_id, out);
    for (uint32_t j = 0; j < lh; j++) {
        out[j] = out[j] == STORE_HEAD_FULL;
        n += out[j];
    }
    if (2 * n > lh) {
        memset(out, 0, lh);
        n = 0;
    }
    return (int)n;
}

uint8_t store_head_step(const struct store *s, uint32_t idx, uint8_t format)
{
    const struct block *b = &s->ix.blocks[idx];
    const struct store_ns *ns = s->ns[b->ns];
    uint32_t sinks = ns->pp.sinks > 1 ? ns->pp.sinks : 1;
    if (!s->p.head_step || b->format != KVC_WIRE_FORMAT_RAW || ns->rungs < 3 ||
        format != ns->rung_format[1] || b->depth < sinks)
        return format;
    uint8_t next = ns->rung_format[2];
    /* MERGE may refuse a block (forced tokens) and then takes the rung after it: not here. */
    if (next == KVC_WIRE_FORMAT_MERGE ||
        !(KVC_WIRE_QUANT_ALLOWED(ns->layout.flags) & (1u << next)) ||
        (ns->max_error > 0 && kern_codec_attn_error((enum kern_codec)next) > ns->max_error))
        return format;
    return next;
}

/* Per-head budgets (Ada-KV's head-wise allocation over FastGen's categories): `budget` blocks
 * per (layer, kv head) on average, budget x layers x kv_heads head-blocks in all. A sink-only
 * head keeps the sinks (max(sinks, 1) blocks), a local head the sinks and the recent window;
 * each is charged that (at most `budget`), on the request's n keys, and the full heads (and
 * UNKNOWN ones) share the rest evenly, never less than `budget` each. The selection is what a
 * full head keeps: every other head's blocks are among it (sinks and window come first). */
_Static_assert((int)STORE_HEAD_UNKNOWN == (int)KVC_WIRE_HEAD_UNKNOWN &&
                   (int)STORE_HEAD_SINK == (int)KVC_WIRE_HEAD_SINK &&
                   (int)STORE_HEAD_LOCAL == (int)KVC_WIRE_HEAD_LOCAL &&
                   (int)STORE_HEAD_FULL == (int)KVC_WIRE_HEAD_FULL,
               "head categories are the wire's");

int store_head_budget(const struct store *s, uint32_t ns_id, uint32_t budget, uint32_t sinks,
                      uint32_t recent, uint32_t n, uint8_t *prof, uint32_t *full_budget)
{
    const struct store_ns *ns = store_ns_get(s, ns_id);
    uint64_t lh, nsink = 0, nlocal = 0, nfull, cs, cl, total, spent, b;
    if (!ns)
        return -ENOENT;
    lh = (uint64_t)ns->layout.layers * ns->layout.kv_heads;
    if (lh == 0 || lh > KVC_PROTO_MAX_HINT_HEADS || budget == 0)
        return -EINVAL;
    store_head_profile(s, ns_id, prof);
    for (uint64_t j = 0; j < lh; j++) {
        nsink += prof[j] == STORE_HEAD_SINK;
        nlocal += prof[j] == STORE_HEAD_LOCAL;
    }
    nfull = lh - nsink - nlocal;
    cs = sinks ? sinks : 1;
    cs = cs < n ? cs : n;
    cl = cs + recent < n ? cs + recent : n;
    total = (uint64_t)budget * lh;
    spent = nsink * (cs < budget ? cs : budget) + nlocal * (cl < budget ? cl : budget);
    b = nfull ? (total - spent) / nfull : cl;
    if (nfull && b < budget)
        b = budget;
    *full_budget = b > UINT32_MAX ? UINT32_MAX : (uint32_t)b;
    return 0;
}

/* ---- budgeted lookup ----------------------------------------------------------------- */

int store_lookup_budget(struct store *s, struct store_owner *o, uint32_t ns_id,
                        const struct kvc_wire_key *keys, uint32_t n, uint32_t budget, int kind,
                        uint32_t sinks, uint32_t recent, const float *q, uint32_t dim, uint64_t now,
                        uint64_t *lease_id, uint32_t *nprefix, uint32_t *pos,
                        struct kvc_wire_loc *locs)
{
    struct store_ns *ns = store_ns_get(s, ns_id);
    struct policy_block *pb = NULL;
    struct policy_params pp;
    struct store_handle *h;
    float *kmm = NULL;
    uint32_t m = 0;
    size_t nsel = 0;
    uint64_t bytes = 0;
    int rc;
    *lease_id = 0;
    *nprefix = 0;
    if (!ns)
        return -ENOENT;
    /* A budget picks blocks of one prefix by their KV's importance: a window's blocks or a
     * state have no such prefix to pick from. */
    if (ns->layout.kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW ||
        ns->layout.kv_kind == KVC_WIRE_KV_KIND_STATE)
        return -EINVAL;
    if (kind < 0)
        kind = ns->policy;
    if (kind >= POLICY_KIND_COUNT || (dim && dim != ns->layout.head_dim) || !budget)
        return -EINVAL;
    if (n > KVC_PROTO_MAX_KEYS)
        n = KVC_PROTO_MAX_KEYS;
    pb = malloc((size_t)n * sizeof(*pb));
    if (!pb)
        return -ENOMEM;
    /* The run of committed blocks whose bytes are in host memory now. */
    for (; m < n; m++) {
        uint32_t idx = index_find(&s->ix, (uint16_t)ns_id, &keys[m]);
        const struct block *b;
        if (idx == INDEX_NONE)
            break;
        b = &s->ix.blocks[idx];
        if (b->state != BLOCK_STATE_COMMITTED || b->tier != KVC_WIRE_TIER_HOST ||
            (b->flags & (BLOCK_F_LOST | BLOCK_F_PROMOTING)))
            break;
        if (b->pins >= STORE_PIN_MAX) {
            s->total.pin_saturated++;
            ns->stats.pin_saturated++;
            break;
        }
        store_policy_block(s, idx, &pb[m]);
    }
    *nprefix = m;
    rc = 0;
    if (m == 0)
        goto out;
    pp = ns->pp;
    pp.sinks = sinks;
    pp.recent = recent;
    struct policy_query pq = {.q = q, .dim = dim};
    if (q && dim && kind == POLICY_QUEST) {
        rc = -ENOMEM;
        kmm = malloc((size_t)m * dim * 2 * sizeof(float));
        if (!kmm)
            goto out;
        for (uint32_t i = 0; i < m; i++) {
            const struct store_meta_x *mt = store_meta_x_get(s, pb[i].id);
            float *lo = kmm + (size_t)i * dim, *hi = kmm + ((size_t)m + i) * dim;
            if (mt && mt->quest && s->qdim[mt->quest - 1] == dim) {
                memcpy(lo, s->qsum[mt->quest - 1], dim * sizeof(float));
                memcpy(hi, s->qsum[mt->quest - 1] + dim, dim * sizeof(float));
            } else {
                for (uint32_t d = 0; d < dim; d++) {
                    lo[d] = -STORE_POLICY_UNBOUNDED;
                    hi[d] = STORE_POLICY_UNBOUNDED;
                }
            }
        }
        pq.kmin = kmm;
        pq.kmax = kmm + (size_t)m * dim;
    }
    nsel =
        policy_select((enum policy_kind)kind, pb, m, budget, now, &pp, pq.kmin ? &pq : NULL, pos);
    rc = 0;
    if (nsel == 0)
        goto out;
    rc = store_handle_new(s, o, STORE_HANDLE_LEASE, (uint16_t)ns_id, (uint32_t)nsel, &h);
    if (rc)
        goto out;
    h->n = (uint32_t)nsel;
    /* Last first, so that a selected parent ends up more recent than a selected child. */
    for (size_t i = nsel; i-- > 0;) {
        uint32_t idx = pb[pos[i]].id;
        struct block *b = &s->ix.blocks[idx];
        h->blocks[i] = idx;
        store_block_pin(s, idx);
        store_meta_hit(s, idx, now);
        block_hit(b);
        store_touch(s, idx, now);
        store_loc_fill(b, &locs[i]);
        bytes += b->len;
        if (b->format != KVC_WIRE_FORMAT_RAW)
            store_stat_lossy_hit(s, ns, b->format);
    }
    o->pins += nsel;
    s->pins_now += nsel;
    *lease_id = h->id;
    rc = (int)nsel;
out:
    if (rc >= 0) {
        s->total.lookups++;
        ns->stats.lookups++;
        s->total.budget_lookups++;
        ns->stats.budget_lookups++;
        s->total.hit_blocks += nsel;
        ns->stats.hit_blocks += nsel;
        s->total.pins += nsel;
        ns->stats.pins += nsel;
        s->total.bytes_out += bytes;
        ns->stats.bytes_out += bytes;
    }
    free(kmm);
    free(pb);
    return rc;
}
