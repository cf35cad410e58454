/*
 * store.c — see store.h for the design and invariants.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/fast.h"
#include "daemon/gpu_reg.h"
#include "daemon/log.h"
#include "daemon/store.h"
#include "kernels/kern_dev.h"
#include "tiers/gpu.h"
#include "kernels/kern.h"
#include "tiers/host.h"
#include "tiers/slab.h"
#include "tiers/tier.h"

/* struct block's narrow fields hold every value the store puts there. */
_Static_assert(STORE_ARENA_GPU <= BLOCK_ARENA_MAX && STORE_ARENA_DISK <= BLOCK_ARENA_MAX,
               "block.arena holds every list");
_Static_assert(KVC_WIRE_TIER_HOST < 4 && KVC_WIRE_TIER_DISK < 4 && KVC_WIRE_TIER_GPU < 4,
               "block.tier holds every tier");
_Static_assert(BLOCK_STATE_COMMITTED < 4, "block.state holds every state");

#define STORE_STAT_ADD(s, nsp, field, v)                                                           \
    do {                                                                                           \
        (s)->total.field += (v);                                                                   \
        (nsp)->stats.field += (v);                                                                 \
    } while (0)

static const uint32_t store_dtype_bytes[] = {
    [KVC_WIRE_DTYPE_FP16] = 2,     [KVC_WIRE_DTYPE_BF16] = 2, [KVC_WIRE_DTYPE_FP32] = 4,
    [KVC_WIRE_DTYPE_FP8_E4M3] = 1, [KVC_WIRE_DTYPE_INT8] = 1,
};

/* ---- LRU list (per arena, committed blocks) ------------------------------------------ */

/* Whether b sits on its arena's clean list (a copy on disk, the fast one in memory). */
static bool store_lru_clean(const struct block *b)
{
    return (b->flags & BLOCK_F_DISK) && b->arena != STORE_ARENA_DISK;
}

static void store_gran_check(struct store *s, const struct block *b);

/* The slot-owner map: which block's slot starts in each granule of a host arena (its `gran`
 * bytes, the smallest slot it hands out: no two slots start in one). */
static void store_slot_set(struct store *s, const struct block *b, uint32_t idx, bool on)
{
    if (!s->owner[b->arena])
        return; /* no map yet: store_slot_owner makes it from the lists when first asked */
    uint64_t u = b->off / s->arenas[b->arena].gran;
    if (u >= s->arenas[b->arena].owner_n)
        return;
    if (on)
        s->owner[b->arena][u] = idx + 1;
    else if (s->owner[b->arena][u] == idx + 1)
        s->owner[b->arena][u] = 0;
}

void store_slot_own(struct store *s, uint32_t idx, bool on)
{
    const struct block *b = &s->ix.blocks[idx];
    if (b->arena >= s->narenas || b->tier != KVC_WIRE_TIER_HOST)
        return;
    if (on)
        store_gran_check(s, b); /* may lower the granule: the map is then made again */
    store_slot_set(s, b, idx, on);
}

/* Arena a's map, made from the blocks its lists hold (what store_slot_own would have set):
 * once, the first time a slab step asks, so that a cache whose slabs never empty (one slot
 * size, no codecs) spends nothing on it. 0 or -ENOMEM. */
static int store_slot_map(struct store *s, uint32_t a)
{
    uint64_t g = s->arenas[a].gran, n = (tier_host_size(s->arenas[a].tier) + g - 1) / g;
    s->owner[a] = calloc(n, sizeof(uint32_t));
    if (!s->owner[a])
        return -ENOMEM; /* the ladder steps one block at a time */
    s->arenas[a].owner_n = n;
    /* Every linked block passed store_gran_check when it was linked: none is below the
     * granule, so the map is filled as it is. */
    for (int list = 0; list < 2; list++)
        for (uint32_t i = list ? s->arenas[a].clean_head : s->arenas[a].lru_head; i != INDEX_NONE;
             i = s->ix.blocks[i].lru_next)
            if (s->ix.blocks[i].tier == KVC_WIRE_TIER_HOST)
                store_slot_set(s, &s->ix.blocks[i], i, true);
    return 0;
}

uint32_t store_slot_owner(struct store *s, uint32_t arena, uint64_t off)
{
    if (arena >= s->narenas || (!s->owner[arena] && store_slot_map(s, arena)))
        return INDEX_NONE;
    uint64_t u = off / s->arenas[arena].gran;
    uint32_t x = u < s->arenas[arena].owner_n ? s->owner[arena][u] : 0;
    if (!x)
        return INDEX_NONE;
    /* The granule's owner starts its slot there, not merely in that granule (a slot smaller
     * than the granule would have to be cut first: store_gran_check). */
    const struct block *b = &s->ix.blocks[x - 1];
    return b->arena == arena && b->tier == KVC_WIRE_TIER_HOST && b->off == off ? x - 1 : INDEX_NONE;
}

void store_lru_unlink(struct store *s, uint32_t idx)
{
    struct block *b = &s->ix.blocks[idx];
    struct store_arena *a = &s->arenas[b->arena];
    bool clean = store_lru_clean(b);
    uint32_t *head = clean ? &a->clean_head : &a->lru_head;
    uint32_t *tail = clean ? &a->clean_tail : &a->lru_tail;
    if (b->arena < STORE_MAX_ARENAS && s->fast[b->arena] && !s->fast_keep)
        fast_unpublish(s->fast[b->arena], b->ns, &b->key);
    store_ladder_account(s, idx, -1);
    store_slot_own(s, idx, false);
    if (b->lru_prev != INDEX_NONE)
        s->ix.blocks[b->lru_prev].lru_next = b->lru_next;
    else
        *head = b->lru_next;
    if (b->lru_next != INDEX_NONE)
        s->ix.blocks[b->lru_next].lru_prev = b->lru_prev;
    else
        *tail = b->lru_prev;
    b->lru_prev = b->lru_next = INDEX_NONE;
    if (clean)
        a->clean_bytes -= b->len;
    store_heap_remove(s, idx);
}

void store_lru_push_head(struct store *s, uint32_t idx)
{
    struct block *b = &s->ix.blocks[idx];
    struct store_arena *a = &s->arenas[b->arena];
    bool clean = store_lru_clean(b);
    uint32_t *head = clean ? &a->clean_head : &a->lru_head;
    uint32_t *tail = clean ? &a->clean_tail : &a->lru_tail;
    b->lru_prev = INDEX_NONE;
    b->lru_next = *head;
    if (*head != INDEX_NONE)
        s->ix.blocks[*head].lru_prev = idx;
    else
        *tail = idx;
    *head = idx;
    if (clean)
        a->clean_bytes += b->len;
    store_ladder_account(s, idx, +1);
    store_slot_own(s, idx, true);
    store_heap_sync(s, idx);
    /* A touch (fast_keep) moves the block in its list alone: slot, format and tier as they
     * were, so its entry in the shared index is too, and a publish would only find it (a
     * probe of a large index: a cache miss a hit, after the lookup's reply but before the
     * next request). Where the index once had no room, the touch gives the block another
     * try, as every publish does. */
    struct fast_index *fi = b->arena < STORE_MAX_ARENAS ? s->fast[b->arena] : NULL;
    if (s->pub_queue)
        s->pub_q[s->pub_n++] = idx; /* store_resv_end made room */
    else if (!s->fast_keep || (fi && fast_index_lost_any(fi)))
        store_fast_sync(s, idx);
}

/* A batch's publications a few blocks ahead (a large shared index misses the cache on each):
 * measured on an index of a million blocks, 64 publications at a time, 4 ahead took them
 * from ~850 to ~620 ns each, 8 no better. */
#define STORE_FAST_AHEAD 4

static void store_fast_prefetch(struct store *s, uint32_t idx)
{
    const struct block *b = &s->ix.blocks[idx];
    struct fast_index *fi = b->arena < STORE_MAX_ARENAS ? s->fast[b->arena] : NULL;
    if (fi)
        fast_prefetch(fi, b->ns, &b->key, b->off);
}

/* Whether b belongs in its arena's shared index: committed and ready in a host arena. */
static bool store_fast_ready(const struct block *b)
{
    return b->state == BLOCK_STATE_COMMITTED && b->tier == KVC_WIRE_TIER_HOST &&
           !(b->flags & (BLOCK_F_PROMOTING | BLOCK_F_LOST));
}

void store_fast_sync(struct store *s, uint32_t idx)
{
    const struct block *b = &s->ix.blocks[idx];
    struct fast_index *fi = b->arena < STORE_MAX_ARENAS ? s->fast[b->arena] : NULL;
    const struct store_ns *ns = b->ns < s->nns ? s->ns[b->ns] : NULL;
    if (!fi || !ns)
        return;
    if (store_fast_ready(b)) {
        store_gran_check(s, b); /* then s->fast[] is a new index, where it lowered the granule */
        fast_publish(s->fast[b->arena], b->ns, &b->key, b->off, b->len, b->format);
    } else {
        fast_unpublish(fi, b->ns, &b->key);
    }
}

/* Room in the publication queue for n more; false when it cannot grow (publish at once). */
static bool store_pub_room(struct store *s, uint32_t n)
{
    if (s->pub_n + (uint64_t)n <= s->pub_cap)
        return true;
    if (s->pub_head) { /* what a flush that yielded left, to the front */
        memmove(s->pub_q, s->pub_q + s->pub_head, (s->pub_n - s->pub_head) * sizeof(*s->pub_q));
        s->pub_n -= s->pub_head;
        s->pub_head = 0;
        if (s->pub_n + (uint64_t)n <= s->pub_cap)
            return true;
    }
    uint64_t cap = s->pub_cap ? s->pub_cap : 256;
    while (cap < s->pub_n + (uint64_t)n)
        cap *= 2;
    if (cap > (1u << 24))
        return false;
    uint32_t *q = realloc(s->pub_q, cap * sizeof(*q));
    if (!q)
        return false;
    s->pub_q = q;
    s->pub_cap = (uint32_t)cap;
    return true;
}

/* Block idx published if it is committed and ready in a host arena now (a queued block may
 * have left, moved, or its index been given to another block since: that one is published as
 * it is, and nothing is ever taken out here — another block of the same key has its own). */
static void store_pub_one(struct store *s, uint32_t idx)
{
    if (idx < s->ix.nblocks && store_fast_ready(&s->ix.blocks[idx]))
        store_fast_sync(s, idx);
}

bool store_pub_flush(struct store *s, bool (*yield)(void *arg), void *arg)
{
    for (uint32_t j = s->pub_head; j < s->pub_head + STORE_FAST_AHEAD && j < s->pub_n; j++)
        if (s->pub_q[j] < s->ix.nblocks)
            store_fast_prefetch(s, s->pub_q[j]);
    while (s->pub_head < s->pub_n) {
        uint32_t i = s->pub_head++, j = i + STORE_FAST_AHEAD;
        if (j < s->pub_n && s->pub_q[j] < s->ix.nblocks)
            store_fast_prefetch(s, s->pub_q[j]);
        store_pub_one(s, s->pub_q[i]);
        if (yield && s->pub_head % 16 == 0 && s->pub_head < s->pub_n && yield(arg))
            return false;
    }
    s->pub_head = s->pub_n = 0;
    return true;
}

static uint64_t store_round_unit(uint64_t n)
{
    return (n + SLAB_MIN_SLOT - 1) & ~(uint64_t)(SLAB_MIN_SLOT - 1);
}

/* The smallest slot a block of ns can take: its raw block's, or its smallest codec's. */
static uint64_t store_ns_min_slot(const struct store_ns *ns)
{
    uint64_t m = store_round_unit(ns->block_bytes);
    uint32_t allowed = KVC_WIRE_QUANT_ALLOWED(ns->layout.flags);
    for (uint32_t c = 1; c < KVC_WIRE_FORMAT_COUNT; c++) {
        int64_t n = allowed & (1u << c) ? store_format_bytes(ns, (uint8_t)c) : 0;
        if (n > 0 && store_round_unit((uint64_t)n) < m)
            m = store_round_unit((uint64_t)n);
    }
    return m;
}

/* The granule of host arena a: the smallest slot it can hand out, its namespaces'
 * (store_ns_min_slot) and any its allocator has cut already (64 KiB while it has neither).
 * Slots never overlap and none is smaller, so no two start in one granule: the shared
 * index keeps a slot generation per granule and the slot-owner map an entry, which makes
 * them 4 bytes a block of the smallest slot whatever its size. */
static uint64_t store_arena_gran(const struct store *s, uint32_t a)
{
    const struct slab *sl = tier_host_slab(s->arenas[a].tier);
    uint64_t slot = 0;
    for (uint32_t i = 1; i < s->nns; i++)
        if (s->ns[i] && s->ns[i]->arena == a) {
            uint64_t m = store_ns_min_slot(s->ns[i]);
            slot = !slot || m < slot ? m : slot;
        }
    for (uint32_t c = 0; sl && c < slab_class_count(sl); c++) {
        uint64_t m = slab_class_slot(sl, (int)c);
        slot = !slot || m < slot ? m : slot;
    }
    return slot ? slot : 64u << 10;
}

/* The blocks host arena a can hold at its granule: what its shared index is sized for. */
static uint64_t store_fast_capacity(const struct store *s, uint32_t a)
{
    return tier_host_size(s->arenas[a].tier) / s->arenas[a].gran;
}

/* A new shared index for host arena a, sized by store_fast_capacity, in place of the one
 * there (if any): the namespace table and every block ready in the arena published in it,
 * the host tier bumping its generations from now on; the old one retired (its readers move,
 * client/kvc_fast.h "Growth") and freed. 0 or -errno (the old one stays then). */
static int store_fast_open(struct store *s, uint32_t a)
{
    struct fast_index *old = s->fast[a], *fi;
    struct fast_index_stats st;
    int rc = 0;
    if (!s->arenas[a].gran)
        s->arenas[a].gran = store_arena_gran(s, a);
    if (!s->p.fast_path)
        return 0;
    fi = fast_index_new(a, tier_host_size(s->arenas[a].tier), s->nns, store_fast_capacity(s, a),
                        (uint32_t)(s->arenas[a].gran >> KVC_FAST_UNIT_SHIFT), s->p.host_collapse,
                        &rc);
    if (!fi)
        return rc;
    for (uint32_t i = 1; i < s->nns; i++)
        if (s->ns[i] && s->ns[i]->arena == a)
            fast_ns_set(fi, i, &s->ns[i]->layout);
    if (old) {
        fast_index_stats_get(old, &st);
        s->fast_full_before += st.full;
        fast_index_retire(old);
    }
    tier_host_gens_set(s->arenas[a].tier, fast_index_gens(fi), s->arenas[a].gran);
    fast_index_faulted_set(fi, tier_host_faulted_prefix(s->arenas[a].tier));
    s->fast[a] = fi;
    for (int clean = 0; clean < 2; clean++)
        for (uint32_t i = clean ? s->arenas[a].clean_head : s->arenas[a].lru_head; i != INDEX_NONE;
             i = s->ix.blocks[i].lru_next)
            store_fast_sync(s, i);
    fast_index_free(old);
    return 0;
}

/* A namespace came to host arena a, or its allocator cut a smaller slot: where that lowers
 * the arena's granule, the slot-owner map is made again at the new one when next asked and
 * the shared index replaced by one of more blocks and finer generations. */
static void store_fast_grow(struct store *s, uint32_t a)
{
    uint64_t g = store_arena_gran(s, a);
    int rc;
    if (g >= s->arenas[a].gran)
        return;
    s->arenas[a].gran = g;
    free(s->owner[a]);
    s->owner[a] = NULL;
    s->arenas[a].owner_n = 0;
    if (!s->fast[a])
        return;
    rc = store_fast_open(s, a);
    if (rc)
        log_warn("fast: the shared index of arena %u stays at %llu blocks (%s): blocks past "
                 "that take the socket",
                 a, (unsigned long long)fast_index_capacity(s->fast[a]), strerror(-rc));
}

/* A block in a slot smaller than its arena's granule (a size no namespace of the arena
 * announced: a block read back from disk in a codec its namespace no longer allows) lowers
 * the granule before the block is published or owns a granule: until then the slot would
 * share a generation with the one before it, whose readers it would send to the socket. */
static void store_gran_check(struct store *s, const struct block *b)
{
    if (b->arena < s->narenas && b->len && store_round_unit(b->len) < s->arenas[b->arena].gran)
        store_fast_grow(s, b->arena);
}

/* The blocks the key map is sized for ahead (index_reserve): what the host arenas can hold at
 * their namespaces' smallest slots, up to STORE_INDEX_RESERVE_MAX. Past that (a disk tier
 * holding more, or a larger arena of small blocks) the map grows as blocks come, each
 * doubling a rebuild on the loop. */
#define STORE_INDEX_RESERVE_MAX (1u << 26)

/* A namespace came: the key map (and the width of its slots) grows now, once, to the blocks
 * the host arenas can hold, rather than doubling on the loop as they fill (a rebuild of the
 * map at a million blocks stalls every request ~40 ms here). */
static void store_index_reserve(struct store *s)
{
    uint64_t n = 0;
    for (uint32_t a = 0; a < s->narenas; a++) {
        uint64_t slot = 0;
        for (uint32_t i = 1; i < s->nns; i++)
            if (s->ns[i] && s->ns[i]->arena == a) {
                uint64_t m = store_ns_min_slot(s->ns[i]);
                slot = !slot || m < slot ? m : slot;
            }
        if (slot)
            n += tier_host_size(s->arenas[a].tier) / slot;
    }
    if (n > STORE_INDEX_RESERVE_MAX)
        n = STORE_INDEX_RESERVE_MAX;
    if (index_reserve(&s->ix, (uint32_t)n))
        log_warn("store: the key map stays at %u slots (no memory for %llu blocks); it grows "
                 "as blocks come",
                 s->ix.nslots, (unsigned long long)n);
}

void store_touch(struct store *s, uint32_t idx, uint64_t now)
{
    /* Only its place in the list moves: its index entry stays, so readers of the shared
     * index never see it missing for the length of a touch, and the push leaves it alone. */
    s->fast_keep = true;
    store_lru_unlink(s, idx);
    s->ix.blocks[idx].last_access = now; /* before the push: the heap keys with it */
    store_lru_push_head(s, idx);
    s->fast_keep = false;
}

/* ---- creation ------------------------------------------------------------------------ */

_Static_assert(STORE_MAX_ARENAS <= GPU_REG_MAX_ARENAS, "host arenas within the registration's");

/* Host arena a handed to the registration with the device (gpu_reg.h). */
static void store_gpu_register(struct store *s, uint32_t a)
{
    if (s->gpu_reg)
        s->gpu_unregistered = gpu_reg_arena(s->gpu_reg, a, s->arenas[a].tier);
    else
        s->gpu_unregistered++; /* no memory for the registration's bookkeeping (said once) */
}

void store_gpu_reg_tick(struct store *s)
{
    if (s->gpu_reg)
        s->gpu_unregistered = gpu_reg_tick(s->gpu_reg);
}

/* The GPU tier, when configured. A missing device or driver is not an error: the daemon
 * runs without the tier and says so in one line. */
static void store_gpu_open(struct store *s)
{
    const struct kern_dev_ops *ops = s->p.gpu_ops ? s->p.gpu_ops : kern_dev_cuda();
    struct tier_gpu_config gc = {
        .ops = ops,
        .device = s->p.gpu_device,
        .arena_id = STORE_ARENA_GPU,
        .size = s->p.gpu_size,
        .page_size = s->p.gpu_page_size ? s->p.gpu_page_size : 2u << 20,
    };
    int rc;
    if (!s->p.gpu_size)
        return;
    if (s->p.gpu_size > BLOCK_OFF_MAX) { /* a block's offset keeps 48 bits (struct block) */
        log_warn("gpu: tier disabled (gpu.pool_size above 2^48 bytes)");
        return;
    }
    struct tier *g = tier_gpu_new(&gc, &rc);
    if (!g) {
        log_warn("gpu: tier disabled (%s)", rc != -ENODEV ? strerror(-rc)
                                            : ops         ? "no CUDA device or driver found"
                                                          : "kvcd built without CUDA");
        return;
    }
    s->arenas[STORE_ARENA_GPU].tier = g;
    s->gpu = g;
    /* Each arena registered part by part as its fault-in is over it (gpu_reg.h). */
    s->gpu_reg = gpu_reg_new(g, s->p.gpu_reg_chunk, STORE_PREFAULT_FIRST);
    if (!s->gpu_reg)
        log_warn("gpu: host arenas not registered with the device (%s); moves to and from "
                 "the pool copy through pageable memory, holding the loop for each copy",
                 strerror(ENOMEM));
    for (uint32_t a = 0; a < s->narenas; a++)
        store_gpu_register(s, a);
    log_info("gpu: pool of %.1f MiB on device %d (%s handles)",
             (double)g->ops->capacity(g) / 1048576.0, s->p.gpu_device,
             kern_dev_handle_name(tier_gpu_pool(g)->handle));
}

struct store *store_new(const struct store_params *p, int *err)
{
    struct tier_host_config hc = {
        .name = "kvcd-host-0",
        .arena_id = 0,
        .size = p->host_size,
        .page_size = p->host_page_size,
        .huge = (enum tier_host_huge)p->host_huge,
        .prefault = p->host_prefault,
        .prefault_first = STORE_PREFAULT_FIRST,
        .prefault_threads = p->host_prefault_threads,
        .collapse = p->host_collapse,
    };
    struct store *s = NULL;
    int rc = -EINVAL;
    if (p->host_size > BLOCK_OFF_MAX) /* a block's offset keeps 48 bits (struct block) */
        goto fail;
    rc = -ENOMEM;
    s = calloc(1, sizeof(*s));
    if (!s)
        goto fail;
    s->p = *p;
    s->nns = p->max_namespaces + 1;
    s->ns = calloc(s->nns, sizeof(*s->ns));
    if (!s->ns)
        goto fail;
    rc = index_init(&s->ix, 4096);
    if (rc)
        goto fail;
    s->arenas[0].tier = tier_host_new(&hc, &rc);
    if (!s->arenas[0].tier)
        goto fail;
    for (uint32_t a = 0; a < STORE_MAX_ARENAS + 2; a++)
        s->arenas[a].lru_head = s->arenas[a].lru_tail = s->arenas[a].clean_head =
            s->arenas[a].clean_tail = INDEX_NONE;
    s->narenas = 1;
    rc = store_fast_open(s, 0);
    if (rc)
        goto fail;
    store_gpu_open(s);
    return s;
fail:
    store_free(s);
    *err = rc;
    return NULL;
}

void store_free(struct store *s)
{
    if (!s)
        return;
    /* The pool first: it gives back the arenas' registrations while they are mapped (and
     * waits for copies still in flight, whose moves engine_stop settles when it is called),
     * once the thread registering them has stopped. */
    gpu_reg_free(s->gpu_reg);
    tier_destroy(s->gpu);
    free(s->gpu_moves);
    for (uint32_t a = 0; a < s->narenas; a++) {
        tier_destroy(s->arenas[a].tier);
        fast_index_free(s->fast[a]);
        free(s->owner[a]);
    }
    if (s->ns)
        for (uint32_t i = 0; i < s->nns; i++)
            if (s->ns[i]) {
                if (s->ns[i]->tune)
                    policy_tune_free(s->ns[i]->tune);
                free(s->ns[i]->tune);
                store_heap_free(s->ns[i]);
                free(s->ns[i]);
            }
    store_meta_free(s);
    free(s->post_keys);
    free(s->post_idx);
    free(s->pub_q);
    free(s->rec);
    free(s->ns);
    if (s->ix.blocks)
        index_fini(&s->ix);
    free(s);
}

void store_reload(struct store *s, const struct store_params *p)
{
    s->p.high_watermark = p->high_watermark;
    s->p.low_watermark = p->low_watermark;
    s->p.policy = p->policy;
    s->p.max_handles = p->max_handles;
    s->p.recompute_tokens_per_s = p->recompute_tokens_per_s;
    s->p.ghosts = p->ghosts;
    s->p.quantize_inflight = p->quantize_inflight;
    s->p.quantize_threads = p->quantize_threads;
    s->p.head_step = p->head_step;
    s->heap_defer = true;
    for (uint32_t i = 1; i < s->nns; i++)
        if (s->ns[i] && s->ns[i]->policy_src == STORE_POLICY_SRC_DEFAULT)
            store_ns_policy_set(s, i, -1, STORE_POLICY_SRC_DEFAULT);
    s->heap_defer = false;
    store_heap_rebuild_stale(s);
}

/* ---- namespaces ---------------------------------------------------------------------- */

/* The namespace's quantization (layout.flags, kvc_proto.h): NULL if valid, else why not. */
static const char *store_quant_check(const struct kvc_wire_layout *l)
{
    uint32_t f = l->flags, allowed = KVC_WIRE_QUANT_ALLOWED(f);
    uint32_t k = KVC_WIRE_QUANT_K(f), v = KVC_WIRE_QUANT_V(f);
    struct kern_layout kl = {.layers = l->layers,
                             .heads = l->kv_heads,
                             .head_dim = l->head_dim,
                             .tokens = l->block_tokens,
                             .dtype = l->dtype,
                             .k_only = kvc_wire_layout_kinds(l) == 1};
    if (l->kv_kind == KVC_WIRE_KV_KIND_STATE)
        return "a state namespace takes no codec (its blocks stay raw)";
    if (allowed & ~((1u << KVC_WIRE_FORMAT_COUNT) - 2))
        return "unknown codec in the allowed set";
    if (!allowed)
        return "a quantization recipe without allowed codecs";
    if ((k && !(allowed & (1u << k))) || (v && !(allowed & (1u << v))))
        return "recipe codec not in the allowed set";
    for (uint32_t c = 1; c < KVC_WIRE_FORMAT_COUNT; c++)
        if ((allowed & (1u << c)) && kern_layout_check(&kl) == 0 &&
            !kern_codec_supports(&kl, (enum kern_codec)c))
            return "an allowed codec does not take this shape (rot2/rot4: head_dim a power of "
                   "two 8..256; lowrank: min(block_tokens, head_dim) <= 64)";
    if (!k && (!v || kvc_wire_layout_kinds(l) == 1))
        return "recipe quantizes nothing";
    if (KVC_WIRE_QUANT_RAW_LAYERS(f) >= l->layers)
        return "recipe keeps every layer raw";
    if (kern_layout_check(&kl) < 0)
        return "codecs need fp16 or bf16 and a shape the kernels take";
    return NULL;
}

bool store_model_id_ok(const char *id)
{
    for (; *id; id++)
        if ((unsigned char)*id < 0x20 || *id == 0x7f)
            return false;
    return true;
}

int store_layout_check(const struct kvc_wire_layout *l, uint64_t arena_bytes, uint64_t *block_bytes,
                       const char **why)
{
    size_t idlen = strnlen(l->model_id, sizeof(l->model_id));
    unsigned __int128 bytes;
    *why = NULL;
    if (idlen == 0 || idlen == sizeof(l->model_id))
        *why = "model id empty or not NUL-terminated";
    else if (!store_model_id_ok(l->model_id))
        *why = "model id holds a control character (newline, tab, ...)";
    else if (l->dtype == 0 || l->dtype >= sizeof(store_dtype_bytes) / sizeof(store_dtype_bytes[0]))
        *why = "unknown dtype";
    else if (l->kv_kind < KVC_WIRE_KV_KIND_KV || l->kv_kind > KVC_WIRE_KV_KIND_STATE)
        *why = "unknown kv kind";
    else if ((l->kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW) != (l->window_tokens != 0))
        *why = "window_tokens is for (and needed by) a kv_window namespace";
    else if (l->block_tokens && kvc_wire_window_blocks(l) > KVC_PROTO_MAX_WINDOW_BLOCKS)
        *why = "window wider than 1024 blocks (KVC_PROTO_MAX_WINDOW_BLOCKS)";
    else if (l->layers == 0 || l->layers > 4096)
        *why = "layers out of range 1..4096";
    else if (l->kv_heads == 0 || l->kv_heads > 4096)
        *why = "kv_heads out of range 1..4096";
    else if (l->head_dim == 0 || l->head_dim > 65536)
        *why = "head_dim out of range 1..65536";
    else if (l->block_tokens == 0 || l->block_tokens > 65536)
        *why = "block_tokens out of range 1..65536";
    else if (l->flags & ~KVC_WIRE_QUANT_MASK)
        *why = "reserved fields not zero";
    else if (l->flags)
        *why = store_quant_check(l);
    if (*why)
        return -EINVAL;
    bytes = (unsigned __int128)l->layers * kvc_wire_layout_kinds(l) * kvc_wire_layout_tokens(l) *
            l->kv_heads * l->head_dim * store_dtype_bytes[l->dtype];
    if (bytes > arena_bytes) {
        *why = "block larger than the host arena";
        return -EINVAL;
    }
    if (bytes > STORE_BLOCK_MAX) {
        *why = "block larger than 1 GiB";
        return -EINVAL;
    }
    *block_bytes = (uint64_t)bytes;
    return 0;
}

static bool store_layout_equal(const struct kvc_wire_layout *a, const struct kvc_wire_layout *b)
{
    return a->layers == b->layers && a->kv_heads == b->kv_heads && a->head_dim == b->head_dim &&
           a->block_tokens == b->block_tokens && a->dtype == b->dtype && a->kv_kind == b->kv_kind &&
           a->window_tokens == b->window_tokens;
}

int store_ns_open(struct store *s, const struct kvc_wire_layout *l, uint32_t *ns_id, bool *created)
{
    return store_ns_open_in(s, l, 0, ns_id, created);
}

int store_ns_open_in(struct store *s, const struct kvc_wire_layout *l, uint32_t arena,
                     uint32_t *ns_id, bool *created)
{
    const char *why;
    uint64_t bb;
    uint32_t free_id = 0;
    int rc;
    if (arena >= s->narenas)
        return -ENOENT;
    rc = store_layout_check(l, tier_host_size(s->arenas[arena].tier), &bb, &why);
    if (rc)
        return rc;
    for (uint32_t i = 1; i < s->nns; i++) {
        struct store_ns *n = s->ns[i];
        if (!n) {
            if (!free_id)
                free_id = i;
            continue;
        }
        if (strcmp(n->layout.model_id, l->model_id) == 0) {
            /* quantization: the creator's stays; a later opener passes 0 or the same */
            if (!store_layout_equal(&n->layout, l) || (l->flags && l->flags != n->layout.flags))
                return -EEXIST;
            *ns_id = i;
            *created = false;
            return 0;
        }
    }
    if (!free_id)
        return -ENOSPC;
    struct store_ns *n = calloc(1, sizeof(*n));
    if (!n)
        return -ENOMEM;
    n->id = free_id;
    n->serial = ++s->ns_serials;
    n->arena = arena;
    n->layout = *l;
    n->block_bytes = bb;
    policy_params_init(&n->pp);
    s->ns[free_id] = n;
    if (s->fast[arena])
        fast_ns_set(s->fast[arena], free_id, l);
    store_ns_policy_set(s, free_id, -1, STORE_POLICY_SRC_DEFAULT);
    store_ladder_setup(s, n);
    store_fast_grow(s, arena);
    store_index_reserve(s);
    *ns_id = free_id;
    *created = true;
    return 0;
}

int store_ns_close(struct store *s, uint32_t ns_id)
{
    struct store_ns *ns = store_ns_get(s, ns_id);
    if (!ns)
        return -ENOENT;
    if (ns->blocks)
        return -EBUSY;
    for (uint32_t i = 0; i < s->ix.nblocks; i++)
        if (s->ix.blocks[i].state != BLOCK_STATE_FREE && s->ix.blocks[i].ns == ns_id)
            return -EBUSY; /* reserved slots */
    if (ns->tune)
        policy_tune_free(ns->tune);
    free(ns->tune);
    store_heap_free(ns);
    if (s->fast[ns->arena])
        fast_ns_set(s->fast[ns->arena], ns_id, NULL);
    free(ns);
    s->ns[ns_id] = NULL;
    return 0;
}

struct store_ns *store_ns_get(const struct store *s, uint32_t ns_id)
{
    return ns_id > 0 && ns_id < s->nns ? s->ns[ns_id] : NULL;
}

struct tier *store_ns_tier(const struct store *s, const struct store_ns *ns)
{
    return s->arenas[ns->arena].tier;
}

/* ---- handles (leases and reservations) ----------------------------------------------- */

void store_owner_init(struct store_owner *o)
{
    memset(o, 0, sizeof(*o));
}

struct store_handle *store_handle_get(struct store_owner *o, uint64_t id, uint8_t kind)
{
    uint32_t slot = (uint32_t)id;
    struct store_handle *h;
    if (slot >= o->nhandles)
        return NULL;
    h = o->handles[slot];
    return h && h->id == id && h->kind == kind ? h : NULL;
}

int store_handle_new(struct store *s, struct store_owner *o, uint8_t kind, uint16_t ns, uint32_t n,
                     struct store_handle **out)
{
    uint32_t slot;
    struct store_handle *h;
    if (o->live >= s->p.max_handles)
        return -EMFILE;
    if (o->live == o->nhandles) {
        uint32_t ncap = o->nhandles ? o->nhandles * 2 : 16;
        struct store_handle **nh = realloc(o->handles, ncap * sizeof(*nh));
        if (!nh)
            return -ENOMEM;
        memset(nh + o->nhandles, 0, (ncap - o->nhandles) * sizeof(*nh));
        o->handles = nh;
        o->nhandles = ncap;
    }
    for (slot = 0; o->handles[slot]; slot++)
        ;
    h = calloc(1, sizeof(*h) + (size_t)n * sizeof(h->blocks[0]));
    if (!h)
        return -ENOMEM;
    /* Generation in the high half: a stale id naming a reused slot fails the check. */
    h->id = ((uint64_t)(++o->gen | 1u) << 32) | slot;
    h->kind = kind;
    h->ns = ns;
    h->parent_pin = INDEX_NONE;
    o->handles[slot] = h;
    o->live++;
    *out = h;
    return 0;
}

static void store_handle_delete(struct store_owner *o, struct store_handle *h)
{
    o->handles[(uint32_t)h->id] = NULL;
    o->live--;
    free(h);
}

/* ---- blocks ---------------------------------------------------------------------------- */

static void store_unpin(struct store *s, struct store_owner *o, struct store_ns *ns, uint32_t idx)
{
    struct block *b = &s->ix.blocks[idx];
    store_block_unpin(s, idx);
    s->pins_now--;
    if (o)
        o->pins--;
    STORE_STAT_ADD(s, ns, unpins, 1);
    if ((b->flags & BLOCK_F_LOST) && !b->pins && !b->children)
        (void)store_block_drop(s, idx);
}

void store_record_free(struct store *s, uint32_t idx)
{
    struct block *b = &s->ix.blocks[idx];
    struct tier *d = s->arenas[STORE_ARENA_DISK].tier;
    struct tier_loc l;
    if (!(b->flags & BLOCK_F_DISK))
        return;
    store_record_loc(s, b, &l);
    if (d)
        d->ops->free(d, &l);
    b->flags &= (uint8_t)~BLOCK_F_DISK;
}

void store_record_loc(const struct store *s, const struct block *b, struct tier_loc *l)
{
    const struct store_rec *r = &s->rec[b - s->ix.blocks]; /* BLOCK_F_DISK: reserved */
    *l = (struct tier_loc){
        .arena = 0, .cls = r->ver, .off = (uint64_t)r->doff * STORE_RECORD_ALIGN, .len = r->len};
}

int store_record_reserve(struct store *s, uint32_t idx)
{
    if (idx < s->nrec)
        return 0;
    uint64_t n = s->nrec ? s->nrec : 1024;
    while (n <= idx)
        n *= 2;
    struct store_rec *r = realloc(s->rec, (size_t)n * sizeof(*r));
    if (!r)
        return -ENOMEM;
    memset(r + s->nrec, 0, (size_t)(n - s->nrec) * sizeof(*r));
    s->rec = r;
    s->nrec = (uint32_t)n;
    return 0;
}

void store_record_set(struct store *s, uint32_t idx, const struct tier_loc *l)
{
    struct block *b = &s->ix.blocks[idx];
    s->rec[idx] = (struct store_rec){
        .doff = (uint32_t)(l->off / STORE_RECORD_ALIGN), .ver = l->cls, .len = (uint32_t)l->len};
    b->flags |= BLOCK_F_DISK;
}

bool store_block_idle(const struct store *s, uint32_t idx)
{
    const struct block *b = &s->ix.blocks[idx];
    return b->state == BLOCK_STATE_COMMITTED && !b->pins &&
           !(b->flags & (BLOCK_F_BUSY | BLOCK_F_LOST));
}

void store_drop_prefetch(struct store *s, uint32_t idx)
{
    const struct block *b = &s->ix.blocks[idx];
    const uint32_t near[3] = {b->lru_prev, b->lru_next, b->parent};
    if (b->state != BLOCK_STATE_COMMITTED)
        return; /* a reservation's links name its handle, not blocks */
    index_prefetch_slot(&s->ix, idx);
    store_fast_prefetch(s, idx);
    for (int k = 0; k < 3; k++)
        if (near[k] < s->ix.nblocks)
            __builtin_prefetch(&s->ix.blocks[near[k]]);
    store_meta_prefetch(s, idx);
}

int store_block_drop(struct store *s, uint32_t idx)
{
    struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    struct tier *t = s->arenas[b->arena].tier;
    struct tier_loc loc = {.arena = b->arena, .cls = b->cls, .off = b->off, .len = b->len};
    uint32_t lost_parent = INDEX_NONE;
    if (b->state == BLOCK_STATE_COMMITTED && (b->flags & BLOCK_F_BUSY))
        return -EBUSY;
    if (b->state == BLOCK_STATE_COMMITTED) {
        store_lru_unlink(s, idx);
        if (b->parent != INDEX_NONE) {
            uint32_t p = b->parent;
            if (s->ix.blocks[p].children && !--s->ix.blocks[p].children)
                store_heap_sync(s, p); /* a leaf now */
            if (s->ix.blocks[p].flags & BLOCK_F_LOST)
                lost_parent = p;
        }
        ns->blocks--;
        ns->bytes -= b->len;
    } else if (b->state == BLOCK_STATE_RESERVED) {
        s->reserved_now--;
        s->reserved_bytes_now -= b->len;
    }
    if (b->state == BLOCK_STATE_COMMITTED)
        store_meta_drop(s, idx);
    index_remove(&s->ix, idx);
    /* Its memory slot (unless its one copy is the disk record), then its disk record. */
    if (!(b->flags & BLOCK_F_LOST) && b->tier != KVC_WIRE_TIER_DISK)
        t->ops->free(t, &loc);
    if (b->state == BLOCK_STATE_COMMITTED && (b->flags & BLOCK_F_DISK))
        store_record_free(s, idx);
    index_block_delete(&s->ix, idx);
    /* A lost block goes once nothing hangs from it and nobody holds it. */
    if (lost_parent != INDEX_NONE && !s->ix.blocks[lost_parent].children &&
        !s->ix.blocks[lost_parent].pins)
        (void)store_block_drop(s, lost_parent);
    return 0;
}

void store_loc_fill(const struct block *b, struct kvc_wire_loc *loc)
{
    loc->arena_id = b->arena;
    loc->tier = b->tier == KVC_WIRE_TIER_GPU ? KVC_WIRE_TIER_GPU : KVC_WIRE_TIER_HOST;
    loc->format = b->format;
    loc->flags = (b->flags & BLOCK_F_PROMOTING) ? 0 : KVC_LOC_F_READY;
    loc->offset = b->off;
    loc->length = b->len;
}

/* ---- lookup / release ---------------------------------------------------------------- */

void store_stat_lossy_hit(struct store *s, struct store_ns *ns, uint32_t format)
{
    STORE_STAT_ADD(s, ns, hit_blocks_lossy, 1);
    /* A larger share above its rung would have served it at better precision. */
    if (ns->rungs >= 2)
        policy_ladder_hit(&ns->ladder, store_ladder_rung(ns, format));
    switch (format) {
    case KVC_WIRE_FORMAT_Q8_0:
        STORE_STAT_ADD(s, ns, hit_blocks_q8_0, 1);
        break;
    case KVC_WIRE_FORMAT_Q4_1:
        STORE_STAT_ADD(s, ns, hit_blocks_q4_1, 1);
        break;
    case KVC_WIRE_FORMAT_Q5_1:
        STORE_STAT_ADD(s, ns, hit_blocks_q5_1, 1);
        break;
    case KVC_WIRE_FORMAT_KIVI2:
        STORE_STAT_ADD(s, ns, hit_blocks_kivi2, 1);
        break;
    case KVC_WIRE_FORMAT_KIVI4:
        STORE_STAT_ADD(s, ns, hit_blocks_kivi4, 1);
        break;
    case KVC_WIRE_FORMAT_FP8:
        STORE_STAT_ADD(s, ns, hit_blocks_fp8, 1);
        break;
    default:
        break;
    }
}

/* Whether idx may be a hit of a run: committed, not lost, and below the pin cap (counted when
 * it is not). */
static bool store_run_hit(struct store *s, uint32_t ns_id, uint32_t idx)
{
    if (idx == INDEX_NONE || s->ix.blocks[idx].state != BLOCK_STATE_COMMITTED ||
        (s->ix.blocks[idx].flags & BLOCK_F_LOST))
        return false;
    if (s->ix.blocks[idx].pins >= STORE_PIN_MAX) {
        struct store_ns *ns = s->ns[ns_id];
        STORE_STAT_ADD(s, ns, pin_saturated, 1);
        return false;
    }
    return true;
}

uint32_t store_lookup_run(struct store *s, uint32_t ns_id, const struct kvc_wire_key *keys,
                          uint32_t n, struct store_lookup_blocks *lb)
{
    uint32_t hits = 0;
    struct index_ahead ahead;
    if (lb)
        lb->n = 0;
    index_ahead_init(&ahead, &s->ix, (uint16_t)ns_id, keys,
                     n < KVC_PROTO_MAX_KEYS ? n : KVC_PROTO_MAX_KEYS);
    while (hits < n && hits < KVC_PROTO_MAX_KEYS) {
        uint32_t idx = index_ahead_find(&ahead, &s->ix, hits);
        if (lb)
            lb->idx[lb->n++] = idx;
        if (!store_run_hit(s, ns_id, idx))
            break;
        hits++;
    }
    return hits;
}

uint32_t store_lookup_run_found(struct store *s, uint32_t ns_id, const struct kvc_wire_key *keys,
                                uint32_t n, const uint32_t *idx)
{
    uint32_t hits = 0;
    while (hits < n && hits < KVC_PROTO_MAX_KEYS &&
           index_handle_ok(&s->ix, idx[hits], (uint16_t)ns_id, &keys[hits]) &&
           store_run_hit(s, ns_id, idx[hits]))
        hits++;
    return hits;
}

void store_lookup_blocks_init(struct store_lookup_blocks *lb, uint32_t n)
{
    lb->n = n < KVC_PROTO_MAX_KEYS ? n : KVC_PROTO_MAX_KEYS;
    for (uint32_t i = 0; i < lb->n; i++)
        lb->idx[i] = STORE_LOOKUP_UNSEEN;
}

uint32_t store_lookup_block(struct store *s, uint32_t ns_id, const struct kvc_wire_key *keys,
                            struct store_lookup_blocks *lb, uint32_t i)
{
    if (lb->idx[i] == STORE_LOOKUP_UNSEEN)
        lb->idx[i] = index_find(&s->ix, (uint16_t)ns_id, &keys[i]);
    return lb->idx[i];
}

/* Committed and servable (not lost) in namespace ns_id, its block as lb has it (looked up
 * when first asked for); with STORE_SPAN_READY, also in memory now and readable by the client
 * (STORE_SPAN_GPU: it maps the pool). */
static bool store_key_cached(struct store *s, uint32_t ns_id, const struct kvc_wire_key *keys,
                             struct store_lookup_blocks *lb, uint32_t i, unsigned mode)
{
    uint32_t idx = store_lookup_block(s, ns_id, keys, lb, i);
    const struct block *b =
        index_handle_ok(&s->ix, idx, (uint16_t)ns_id, &keys[i]) ? &s->ix.blocks[idx] : NULL;
    if (!b || (b->flags & BLOCK_F_LOST))
        return false;
    if (!(mode & STORE_SPAN_READY))
        return true;
    return !(b->flags & BLOCK_F_PROMOTING) && b->tier != KVC_WIRE_TIER_DISK &&
           (b->tier != KVC_WIRE_TIER_GPU || (mode & STORE_SPAN_GPU));
}

uint32_t store_lookup_span(struct store *s, uint32_t ns_id, const struct kvc_wire_key *keys,
                           struct store_lookup_blocks *lb, uint32_t base, unsigned mode,
                           uint32_t *count)
{
    const struct store_ns *ns = s->ns[ns_id];
    uint32_t end = 0, w, run = 0, n = lb->n;
    *count = 0;
    if (ns->layout.kv_kind == KVC_WIRE_KV_KIND_STATE) {
        /* The state of the longest prefix that has one: it is valid at that prefix's end
         * alone, and stored under that end's key. */
        for (end = n; end > 0 && !store_key_cached(s, ns_id, keys, lb, end - 1, mode); end--)
            ;
        *count = end ? 1 : 0;
        return end ? end - 1 : 0;
    }
    if (ns->layout.kv_kind != KVC_WIRE_KV_KIND_KV_WINDOW) {
        /* The run from keys[0], each key looked up as the run reaches it. */
        while (*count < n && (store_lookup_block(s, ns_id, keys, lb, *count),
                              store_lookup_run_found(s, ns_id, keys + *count, 1, lb->idx + *count)))
            (*count)++;
        return 0;
    }
    /* The longest prefix keys[0..e) whose last min(w, base + e) blocks are all cached: the
     * blocks before its window may have gone (evicted, or never stored). Past base, a window
     * reaching before keys[0] cannot be judged (run <= e < its need). */
    w = kvc_wire_window_blocks(&ns->layout);
    for (uint32_t i = 0; i < n; i++) {
        run = store_key_cached(s, ns_id, keys, lb, i, mode) ? run + 1 : 0;
        if (run >= store_window_need(w, base, i + 1))
            end = i + 1;
    }
    *count = end ? store_window_need(w, base, end) : 0;
    return end - *count;
}

/* What a lookup tells the policies: each hit's access (last first, so every parent ends up
 * more recent than its children) and, under the default policy, every key to the tuner. */
static void store_lookup_policy(struct store *s, struct store_ns *ns, const uint32_t *idx,
                                uint32_t hits, const struct kvc_wire_key *keys, uint32_t n,
                                uint64_t now)
{
    for (uint32_t i = hits; i-- > 0;) {
        store_meta_hit(s, idx[i], now); /* before the touch: it reads last_access */
        block_hit(&s->ix.blocks[idx[i]]);
        store_touch(s, idx[i], now);
    }
    if (ns->policy == POLICY_DEFAULT)
        for (uint32_t i = 0; i < n; i++)
            store_meta_ref(s, ns, &keys[i], i, now);
}

void store_post_flush(struct store *s)
{
    if (!s->post_ns) /* after every request and fast-ring entry: mostly nothing kept */
        return;
    struct store_ns *ns = store_ns_get(s, s->post_ns);
    s->post_ns = 0;
    if (ns && ns->serial == s->post_serial) /* pinned hits: still these blocks */
        store_lookup_policy(s, ns, s->post_idx, s->post_nhit, s->post_keys, s->post_nkey,
                            s->post_now);
}

/* store_lookup_policy now, or kept for store_post_flush when the server defers it past the
 * reply (post_defer). */
static void store_lookup_policy_post(struct store *s, struct store_ns *ns, const uint32_t *idx,
                                     uint32_t hits, const struct kvc_wire_key *keys, uint32_t n,
                                     uint64_t now)
{
    store_post_flush(s); /* an earlier lookup's first */
    if (ns->policy != POLICY_DEFAULT)
        n = 0;
    /* each on its own: one that failed is asked for again, the other kept (not leaked) */
    if (s->post_defer && !s->post_keys)
        s->post_keys = malloc(KVC_PROTO_MAX_KEYS * sizeof(*s->post_keys));
    if (s->post_defer && !s->post_idx)
        s->post_idx = malloc(KVC_PROTO_MAX_KEYS * sizeof(*s->post_idx));
    if (!s->post_defer || !s->post_keys || !s->post_idx || n > KVC_PROTO_MAX_KEYS ||
        hits > KVC_PROTO_MAX_KEYS) {
        store_lookup_policy(s, ns, idx, hits, keys, n, now);
        return;
    }
    memcpy(s->post_idx, idx, hits * sizeof(*idx));
    memcpy(s->post_keys, keys, n * sizeof(*keys));
    s->post_ns = ns->id;
    s->post_serial = ns->serial;
    s->post_now = now;
    s->post_nhit = hits;
    s->post_nkey = n;
}

int store_lease_pin(struct store *s, struct store_owner *o, uint32_t ns_id,
                    const struct kvc_wire_key *keys, const uint32_t *idx, uint32_t n, uint32_t hits,
                    const uint8_t *tier, uint64_t now, uint64_t *lease_id,
                    struct kvc_wire_loc *locs)
{
    struct store_ns *ns = store_ns_get(s, ns_id);
    struct store_handle *h = NULL;
    uint64_t bytes = 0;
    uint64_t per_tier[4] = {0};
    *lease_id = 0;
    if (!ns)
        return -ENOENT;
    for (uint32_t i = 0; i < hits; i++)
        if (!index_handle_ok(&s->ix, idx[i], (uint16_t)ns_id, &keys[i]))
            hits = i; /* dropped since the lookup found it: the hits end before it */
    for (uint32_t i = 0; i < hits; i++)
        per_tier[tier[i] & 3]++;
    if (hits) {
        int rc = store_handle_new(s, o, STORE_HANDLE_LEASE, (uint16_t)ns_id, hits, &h);
        if (rc)
            return rc;
        h->n = hits;
        h->gpu = o->gpu;
        for (uint32_t i = hits; i-- > 0;) {
            struct block *b = &s->ix.blocks[idx[i]];
            h->blocks[i] = idx[i];
            store_block_pin(s, idx[i]);
            store_loc_fill(b, &locs[i]);
            bytes += b->len;
            if (b->format != KVC_WIRE_FORMAT_RAW)
                store_stat_lossy_hit(s, ns, b->format);
        }
        o->pins += hits;
        s->pins_now += hits;
        *lease_id = h->id;
    }
    store_lookup_policy_post(s, ns, idx, hits, keys,
                             n < KVC_PROTO_MAX_KEYS ? n : KVC_PROTO_MAX_KEYS, now);
    STORE_STAT_ADD(s, ns, lookups, 1);
    STORE_STAT_ADD(s, ns, lookup_blocks, n);
    STORE_STAT_ADD(s, ns, lookup_tokens, (uint64_t)n * ns->layout.block_tokens);
    STORE_STAT_ADD(s, ns, hit_blocks, hits);
    STORE_STAT_ADD(s, ns, hit_tokens, (uint64_t)hits * ns->layout.block_tokens);
    STORE_STAT_ADD(s, ns, hit_tokens_host, per_tier[KVC_WIRE_TIER_HOST] * ns->layout.block_tokens);
    STORE_STAT_ADD(s, ns, hit_tokens_disk, per_tier[KVC_WIRE_TIER_DISK] * ns->layout.block_tokens);
    STORE_STAT_ADD(s, ns, hit_tokens_gpu, per_tier[KVC_WIRE_TIER_GPU] * ns->layout.block_tokens);
    STORE_STAT_ADD(s, ns, miss_blocks, n - hits);
    STORE_STAT_ADD(s, ns, miss_tokens, (uint64_t)(n - hits) * ns->layout.block_tokens);
    STORE_STAT_ADD(s, ns, pins, hits);
    STORE_STAT_ADD(s, ns, bytes_out, bytes);
    return (int)hits;
}

void store_fast_ref(struct store *s, uint32_t ns_id, const struct kvc_wire_key *key, uint32_t pos,
                    uint64_t now)
{
    struct store_ns *ns = store_ns_get(s, ns_id);
    store_post_flush(s); /* a lookup's references come before the ring's later ones */
    if (ns && ns->policy == POLICY_DEFAULT)
        store_meta_ref(s, ns, key, pos, now);
}

int store_fast_hit(struct store *s, uint32_t ns_id, uint32_t idx, const struct kvc_wire_key *key,
                   uint32_t nkeys, uint64_t now)
{
    struct store_ns *ns = store_ns_get(s, ns_id);
    struct block *b;
    store_post_flush(s); /* a lookup's accesses come before the ring's later ones */
    if (!ns)
        return -ENOENT;
    if (idx >= s->ix.nblocks || s->ix.blocks[idx].ns != ns_id ||
        s->ix.blocks[idx].key.lo != key->lo || s->ix.blocks[idx].key.hi != key->hi)
        idx = index_find(&s->ix, (uint16_t)ns_id, key);
    if (idx == INDEX_NONE)
        return -ENOENT;
    b = &s->ix.blocks[idx];
    if (b->state != BLOCK_STATE_COMMITTED || (b->flags & BLOCK_F_LOST))
        return -ENOENT;
    if (nkeys) {
        nkeys = nkeys > KVC_PROTO_MAX_KEYS ? KVC_PROTO_MAX_KEYS : nkeys;
        STORE_STAT_ADD(s, ns, lookups, 1);
        STORE_STAT_ADD(s, ns, lookup_blocks, nkeys);
        STORE_STAT_ADD(s, ns, lookup_tokens, (uint64_t)nkeys * ns->layout.block_tokens);
    }
    store_meta_hit(s, idx, now); /* before the touch: it reads last_access */
    block_hit(b);
    store_touch(s, idx, now);
    if (b->format != KVC_WIRE_FORMAT_RAW)
        store_stat_lossy_hit(s, ns, b->format);
    STORE_STAT_ADD(s, ns, hit_blocks, 1);
    STORE_STAT_ADD(s, ns, fast_hits, 1);
    STORE_STAT_ADD(s, ns, hit_tokens, ns->layout.block_tokens);
    STORE_STAT_ADD(s, ns, hit_tokens_host, ns->layout.block_tokens);
    STORE_STAT_ADD(s, ns, bytes_out, b->len);
    return 0;
}

static void store_lease_drop(struct store *s, struct store_owner *o, struct store_handle *h)
{
    struct store_ns *ns = s->ns[h->ns];
    for (uint32_t i = 0; i < h->n; i++)
        store_unpin(s, o, ns, h->blocks[i]);
    store_handle_delete(o, h);
}

uint32_t store_lease_ns(struct store_owner *o, uint64_t lease_id)
{
    struct store_handle *h = store_handle_get(o, lease_id, STORE_HANDLE_LEASE);
    return h ? h->ns : 0;
}

int store_release(struct store *s, struct store_owner *o, uint64_t lease_id)
{
    struct store_handle *h = store_handle_get(o, lease_id, STORE_HANDLE_LEASE);
    if (!h)
        return -ENOENT;
    store_lease_drop(s, o, h);
    return 0;
}

/* ---- reserve / commit / abort -------------------------------------------------------- */

/* o's reservation holding block idx, or NULL (not reserved, or another owner's): a reserved
 * block names its handle's slot and its place in that handle's blocks[] (struct block), and
 * only the handle holding it has it there, so another owner's handle never answers. */
static struct store_handle *store_resv_holding(const struct store *s, struct store_owner *o,
                                               uint32_t idx)
{
    const struct block *b = &s->ix.blocks[idx];
    struct store_handle *h;
    if (b->state != BLOCK_STATE_RESERVED || b->lru_prev >= o->nhandles)
        return NULL;
    h = o->handles[b->lru_prev];
    return h && h->kind == STORE_HANDLE_RESV && b->lru_next < h->n && h->blocks[b->lru_next] == idx
               ? h
               : NULL;
}

bool store_resv_holds(const struct store *s, struct store_owner *o, uint32_t idx)
{
    return idx < s->ix.nblocks && store_resv_holding(s, o, idx) != NULL;
}

bool store_block_reserved(const struct store *s, uint32_t idx, uint32_t ns_id)
{
    return idx < s->ix.nblocks && s->ix.blocks[idx].state == BLOCK_STATE_RESERVED &&
           s->ix.blocks[idx].ns == ns_id;
}

uint32_t store_reserve_writing(struct store *s, uint32_t ns_id, const struct kvc_wire_key *keys,
                               uint32_t n)
{
    struct index_ahead ahead;
    if (!store_ns_get(s, ns_id))
        return INDEX_NONE;
    index_ahead_init(&ahead, &s->ix, (uint16_t)ns_id, keys, n);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t idx = index_ahead_find(&ahead, &s->ix, i);
        if (idx == INDEX_NONE)
            return INDEX_NONE;
        const struct block *b = &s->ix.blocks[idx];
        if (b->state == BLOCK_STATE_RESERVED)
            return idx;
        if (b->state != BLOCK_STATE_COMMITTED || (b->flags & BLOCK_F_LOST))
            return INDEX_NONE;
    }
    return INDEX_NONE;
}

/* Reserved block idx of o is about to be dropped: the reservations of o hanging from it give
 * up their pin on it and are marked orphan (their slots go in store_resv_orphans_end). Only
 * o's reservations can hang from it (store_reserve), and a reserved block's pins are theirs. */
static void store_resv_orphan(struct store *s, struct store_owner *o, uint32_t idx)
{
    for (uint32_t slot = 0; slot < o->nhandles && s->ix.blocks[idx].pins; slot++) {
        struct store_handle *h = o->handles[slot];
        if (!h || h->kind != STORE_HANDLE_RESV || h->parent_pin != idx)
            continue;
        store_block_unpin(s, idx);
        s->pins_now--;
        h->parent_pin = INDEX_NONE;
        h->orphan = true;
        o->orphans++;
    }
}

/* Drops reserved slot idx of o unwritten; what hangs from it is orphaned first. */
static void store_resv_slot_drop(struct store *s, struct store_owner *o, uint32_t idx)
{
    if (s->ix.blocks[idx].pins)
        store_resv_orphan(s, o, idx);
    (void)store_block_drop(s, idx);
}

/* Drops the slots of o's orphaned reservations, and of those hanging from them in turn (a
 * pass per level of such chains): none of them can be committed under a committed parent
 * any more, and their keys go back to whoever writes them next. Each keeps its id, empty
 * (counted in its dropped), until o commits it (nothing committed) or aborts it. At worst
 * (a chain of one-block reservations in reverse handle order) quadratic in o's
 * reservations, each of which took a RESERVE: measured, 1,024 (quota.client_reservations'
 * default) ~1 ms, 4,000 ~16 ms. */
static void store_resv_orphans_end(struct store *s, struct store_owner *o)
{
    while (o->orphans)
        for (uint32_t slot = 0; slot < o->nhandles && o->orphans; slot++) {
            struct store_handle *h = o->handles[slot];
            struct store_ns *ns;
            if (!h || !h->orphan)
                continue;
            h->orphan = false;
            o->orphans--;
            ns = s->ns[h->ns];
            for (uint32_t i = 0; i < h->n; i++)
                store_resv_slot_drop(s, o, h->blocks[i]);
            STORE_STAT_ADD(s, ns, aborted_blocks, h->n);
            h->dropped += h->n;
            h->n = 0;
        }
}

int store_reserve(struct store *s, struct store_owner *o, uint32_t ns_id,
                  const struct kvc_wire_key *parent, const struct kvc_wire_key *keys, uint32_t n,
                  uint64_t now, uint64_t *resv_id, uint8_t *st, struct kvc_wire_loc *locs)
{
    struct store_ns *ns = store_ns_get(s, ns_id);
    struct store_handle *h = NULL;
    uint32_t prev = INDEX_NONE; /* committed block the next key hangs from */
    uint32_t depth = 0, i = 0;
    bool after_nospace = false, after_busy = false;
    int rc;
    *resv_id = 0;
    if (!ns)
        return -ENOENT;
    STORE_STAT_ADD(s, ns, reserves, 1);
    STORE_STAT_ADD(s, ns, reserve_keys, n);
    /* A window's older blocks may be gone, and states are stored at some block ends only:
     * there a chain whose parent is not cached starts a root of its own. */
    bool roots_ok = ns->layout.kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW ||
                    ns->layout.kv_kind == KVC_WIRE_KV_KIND_STATE;
    if (!index_key_is_zero(parent)) {
        prev = index_find(&s->ix, (uint16_t)ns_id, parent);
        bool cached = prev != INDEX_NONE && s->ix.blocks[prev].state == BLOCK_STATE_COMMITTED;
        if (roots_ok && !cached) {
            static const struct kvc_wire_key none;
            prev = INDEX_NONE;
            parent = &none; /* recorded as a root */
        } else if (!cached && (prev == INDEX_NONE || !store_resv_holding(s, o, prev))) {
            /* The chain would hang from nothing, or from another client's slot: an orphan is
             * never cached, and one client's reservations never depend on another's (nor
             * tell it more than that the parent is not there). Under a slot of its own, the
             * chain commits after that slot does (store_commit). */
            for (; i < n; i++)
                st[i] = KVC_WIRE_SLOT_SKIPPED;
            if (prev == INDEX_NONE)
                STORE_STAT_ADD(s, ns, skipped_parent_blocks, n);
            else
                STORE_STAT_ADD(s, ns, skipped_parent_busy_blocks, n);
            return 0;
        } else {
            depth = s->ix.blocks[prev].depth + 1;
        }
    }
    /* Cached prefix first. Every key is probed in order below, fresh ones too: their map
     * slots asked for ahead (index_ahead_find), so a put of many keys into a map past the
     * caches waits on several misses at once instead of one a key. */
    struct index_ahead ahead;
    index_ahead_init(&ahead, &s->ix, (uint16_t)ns_id, keys, n);
    for (; i < n; i++) {
        uint32_t idx = index_ahead_find(&ahead, &s->ix, i);
        if (idx == INDEX_NONE || s->ix.blocks[idx].state != BLOCK_STATE_COMMITTED ||
            (s->ix.blocks[idx].flags & BLOCK_F_LOST))
            break;
        st[i] = KVC_WIRE_SLOT_PRESENT;
        prev = idx;
        depth = s->ix.blocks[idx].depth + 1;
        STORE_STAT_ADD(s, ns, dedup_blocks, 1);
    }
    if (i < n && index_ahead_find(&ahead, &s->ix, i) == INDEX_NONE) {
        rc = store_handle_new(s, o, STORE_HANDLE_RESV, (uint16_t)ns_id, n - i, &h);
        if (rc)
            return rc;
        /* Pin the parent so that making room for the slots cannot evict it. */
        if (prev != INDEX_NONE) {
            store_block_pin(s, prev);
            s->pins_now++;
            h->parent_pin = prev;
        }
    }
    /* Then a slot per absent key, until a key is taken or room runs out. Every key after the
     * one that stops the chain is skipped, counted by what stopped it. */
    uint32_t up = prev; /* the block the next slot hangs from */
    bool chained = prev != INDEX_NONE && s->ix.blocks[prev].state == BLOCK_STATE_RESERVED;
    for (; h && i < n; i++) {
        struct tier *t = s->arenas[ns->arena].tier;
        struct tier_loc loc;
        uint32_t idx;
        if (index_ahead_find(&ahead, &s->ix, i) != INDEX_NONE)
            break;
        s->room_want = (uint64_t)(n - i) * ns->block_bytes;
        rc = s->room ? s->room(s, ns, o->gpu, now, &loc)
                     : s->arenas[ns->arena].tier->ops->alloc(s->arenas[ns->arena].tier,
                                                             ns->block_bytes, &loc);
        t = s->arenas[rc ? ns->arena : loc.arena].tier;
        if (rc == -ENOSPC) {
            st[i++] = KVC_WIRE_SLOT_NOSPACE;
            STORE_STAT_ADD(s, ns, nospace_blocks, 1);
            after_nospace = true;
            break;
        }
        if (rc)
            break;
        if (index_block_new(&s->ix, &idx)) {
            t->ops->free(t, &loc);
            break;
        }
        struct block *b = &s->ix.blocks[idx];
        b->key = keys[i];
        b->parent = up; /* keys[i - 1]'s block, or the request's parent's */
        b->off = loc.off;
        b->len = loc.len;
        b->depth = depth++;
        if (ns->layout.kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW) {
            /* Every block of a window is a leaf: a prefix needs only its last window, and a
             * window lookup touches those blocks alone, so the blocks behind every cached
             * window grow cold and are evicted first (a chain would keep them as parents). */
            b->parent = INDEX_NONE;
            b->depth = 0;
        }
        b->ns = (uint16_t)ns_id;
        b->arena = (uint8_t)loc.arena;
        b->cls = (uint8_t)loc.cls;
        b->tier = s->gpu && loc.arena == STORE_ARENA_GPU ? KVC_WIRE_TIER_GPU : KVC_WIRE_TIER_HOST;
        b->format = KVC_WIRE_FORMAT_RAW;
        b->state = BLOCK_STATE_RESERVED;
        b->lru_prev = (uint32_t)h->id; /* its reservation (store_resv_holding) */
        b->lru_next = h->n;
        if (index_insert(&s->ix, idx)) {
            t->ops->free(t, &loc);
            index_block_delete(&s->ix, idx);
            break;
        }
        h->blocks[h->n++] = idx;
        up = idx;
        s->reserved_now++;
        s->reserved_bytes_now += loc.len;
        st[i] = KVC_WIRE_SLOT_RESERVED;
        store_loc_fill(b, &locs[i]);
        locs[i].length = ns->block_bytes;
        STORE_STAT_ADD(s, ns, reserved_blocks, 1);
        if (chained)
            STORE_STAT_ADD(s, ns, reserved_chained_blocks, 1);
    }
    s->room_want = 0;
    /* A key in the map but not committed is being written by another reservation (or is
     * repeated in this request); the keys after it have no cached parent yet. */
    if (i < n && index_ahead_find(&ahead, &s->ix, i) != INDEX_NONE) {
        st[i++] = KVC_WIRE_SLOT_BUSY;
        STORE_STAT_ADD(s, ns, busy_blocks, 1);
        after_busy = true;
    }
    if (i < n) {
        if (after_busy)
            STORE_STAT_ADD(s, ns, skipped_busy_blocks, n - i);
        else if (after_nospace)
            STORE_STAT_ADD(s, ns, skipped_nospace_blocks, n - i);
        else /* no slot could be made for key i (index full, allocation failed) */
            STORE_STAT_ADD(s, ns, skipped_failed_blocks, n - i);
    }
    for (; i < n; i++)
        st[i] = KVC_WIRE_SLOT_SKIPPED;
    if (h && h->n == 0) {
        if (h->parent_pin != INDEX_NONE) {
            store_block_unpin(s, h->parent_pin);
            s->pins_now--;
        }
        store_handle_delete(o, h);
        h = NULL;
    }
    if (!h)
        return 0;
    *resv_id = h->id;
    return (int)h->n;
}

/* Ends a reservation: commits its first ncommit slots, frees the rest. */
static uint32_t store_resv_end(struct store *s, struct store_owner *o, struct store_handle *h,
                               uint32_t ncommit, uint64_t now)
{
    struct store_ns *ns = s->ns[h->ns];
    uint32_t committed = 0;
    /* Window blocks hang from nothing (store_reserve). */
    uint32_t parent = ns->layout.kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW ? INDEX_NONE : h->parent_pin;
    for (uint32_t i = 0; i < h->n; i++) {
        uint32_t idx = h->blocks[i];
        struct block *b = &s->ix.blocks[idx];
        if (i < ncommit) {
            b->state = BLOCK_STATE_COMMITTED;
            b->last_access = now;
            s->reserved_now--;
            s->reserved_bytes_now -= b->len;
            ns->blocks++;
            ns->bytes += b->len;
            if (parent != INDEX_NONE && !s->ix.blocks[parent].children++)
                store_heap_sync(s, parent); /* no longer a leaf */
            committed++;
            STORE_STAT_ADD(s, ns, bytes_in, ns->block_bytes);
            /* Not a reference for the half-life tuner: the lookup before it was (a second
             * one would count every miss twice and make every block look reused). */
            store_meta_commit(s, idx, now);
            if (s->on_commit)
                s->on_commit(s, idx, now);
            if (ns->layout.kv_kind != KVC_WIRE_KV_KIND_KV_WINDOW)
                parent = idx;
        } else {
            store_resv_slot_drop(s, o, idx);
            STORE_STAT_ADD(s, ns, aborted_blocks, 1);
        }
    }
    /* Into the LRU list deepest first, so the parents end up more recent; each block's
     * shared-index lines asked for STORE_FAST_AHEAD blocks before its publication, or the
     * publications queued for store_pub_flush (pub_defer). */
    s->pub_queue = s->pub_defer && committed && store_pub_room(s, committed);
    for (uint32_t i = committed; i-- > 0;) {
        if (s->pub_queue) {
            store_lru_push_head(s, h->blocks[i]);
            continue;
        }
        if (i == committed - 1)
            for (uint32_t j = 1; j <= STORE_FAST_AHEAD && j <= committed; j++)
                store_fast_prefetch(s, h->blocks[committed - j]);
        if (i >= STORE_FAST_AHEAD)
            store_fast_prefetch(s, h->blocks[i - STORE_FAST_AHEAD]);
        store_lru_push_head(s, h->blocks[i]);
    }
    s->pub_queue = false;
    STORE_STAT_ADD(s, ns, committed_blocks, committed);
    if (ns->merge_off && ns->stats.committed_blocks - ns->merge_off_at >= ns->merge_retry) {
        ns->merge_off = false; /* another try: the namespace's KV may have runs now */
        store_ladder_setup(s, ns);
    }
    if (h->parent_pin != INDEX_NONE) {
        store_block_unpin(s, h->parent_pin);
        s->pins_now--;
    }
    store_handle_delete(o, h);
    store_resv_orphans_end(s, o);
    return committed;
}

int store_commit(struct store *s, struct store_owner *o, uint64_t resv_id, uint32_t ncommit,
                 uint64_t now, uint32_t *dropped)
{
    struct store_handle *h = store_handle_get(o, resv_id, STORE_HANDLE_RESV);
    uint32_t n, c;
    if (!h)
        return -ENOENT;
    if (ncommit && h->n && h->parent_pin != INDEX_NONE &&
        s->ix.blocks[h->parent_pin].state != BLOCK_STATE_COMMITTED) {
        /* Its parent is a slot of o's not committed yet (store_reserve): committed now, the
         * chain would hang from an invisible block. */
        STORE_STAT_ADD(s, s->ns[h->ns], commit_parent_busy, 1);
        return -EAGAIN;
    }
    n = h->n + h->dropped;
    c = store_resv_end(s, o, h, ncommit, now);
    *dropped = n - c;
    return (int)c;
}

int store_abort(struct store *s, struct store_owner *o, uint64_t resv_id)
{
    struct store_handle *h = store_handle_get(o, resv_id, STORE_HANDLE_RESV);
    if (!h)
        return -ENOENT;
    store_resv_end(s, o, h, 0, 0);
    return 0;
}

void store_owner_fini(struct store *s, struct store_owner *o)
{
    for (uint32_t slot = 0; slot < o->nhandles; slot++) {
        struct store_handle *h = o->handles[slot];
        if (!h)
            continue;
        if (h->kind == STORE_HANDLE_LEASE)
            store_lease_drop(s, o, h);
        else
            store_resv_end(s, o, h, 0, 0);
    }
    free(o->handles);
    memset(o, 0, sizeof(*o));
}

uint64_t store_host_used(const struct store *s)
{
    const struct tier *t = s->arenas[0].tier;
    return t->ops->usage(t);
}

uint64_t store_host_capacity(const struct store *s)
{
    const struct tier *t = s->arenas[0].tier;
    return t->ops->capacity(t);
}

uint64_t store_host_collapsed(const struct store *s)
{
    uint64_t n = 0;
    for (uint32_t a = 0; a < s->narenas; a++)
        n += tier_host_collapsed(s->arenas[a].tier);
    return n;
}

void store_fast_faulted_publish(struct store *s)
{
    for (uint32_t a = 0; a < s->narenas; a++)
        fast_index_faulted_set(s->fast[a], tier_host_faulted_prefix(s->arenas[a].tier));
}

void store_host_faulted(const struct store *s, uint64_t *faulted, uint64_t *total)
{
    *faulted = *total = 0;
    for (uint32_t a = 0; a < s->narenas; a++) {
        const struct tier *t = s->arenas[a].tier;
        *faulted += s->p.host_prefault ? tier_host_faulted(t) : tier_host_size(t);
        *total += tier_host_size(t);
    }
}

/* ---- operator and access-list support (issue 6) -------------------------------------- */

int store_arena_add(struct store *s, uint64_t size, uint32_t *id)
{
    char name[32];
    struct tier_host_config hc = {
        .name = name,
        .arena_id = s->narenas,
        .size = size,
        .page_size = s->p.host_page_size,
        .huge = (enum tier_host_huge)s->p.host_huge,
        .prefault = s->p.host_prefault,
        .prefault_first = STORE_PREFAULT_FIRST,
        .prefault_threads = s->p.host_prefault_threads,
        .collapse = s->p.host_collapse,
    };
    int rc = 0;
    if (s->narenas == STORE_MAX_ARENAS)
        return -ENOSPC;
    if (size > BLOCK_OFF_MAX) /* a block's offset keeps 48 bits (struct block) */
        return -EINVAL;
    snprintf(name, sizeof(name), "kvcd-host-%u", s->narenas);
    s->arenas[s->narenas].tier = tier_host_new(&hc, &rc);
    if (!s->arenas[s->narenas].tier)
        return rc;
    rc = store_fast_open(s, s->narenas);
    if (rc) {
        tier_destroy(s->arenas[s->narenas].tier);
        s->arenas[s->narenas].tier = NULL;
        return rc;
    }
    *id = s->narenas++;
    if (s->gpu)
        store_gpu_register(s, *id);
    return 0;
}

void store_fast_stats(const struct store *s, uint64_t *published, uint64_t *full)
{
    *published = 0;
    *full = s->fast_full_before;
    for (uint32_t a = 0; a < s->narenas; a++)
        if (s->fast[a]) {
            struct fast_index_stats st;
            fast_index_stats_get(s->fast[a], &st);
            *published += st.published;
            *full += st.full;
        }
}

uint64_t store_gpu_used(const struct store *s)
{
    return s->gpu ? s->gpu->ops->usage(s->gpu) : 0;
}

uint64_t store_gpu_capacity(const struct store *s)
{
    return s->gpu ? s->gpu->ops->capacity(s->gpu) : 0;
}

/* ---- operator drop (server.c) ----------------------------------------- */

/* Whether block idx can leave now: idle (store_block_idle) and a leaf. */
static bool store_block_droppable(const struct store *s, uint32_t idx)
{
    return store_block_idle(s, idx) && !s->ix.blocks[idx].children;
}

int store_ns_drop(struct store *s, uint32_t ns_id, uint64_t *dropped)
{
    struct store_ns *ns = store_ns_get(s, ns_id);
    uint64_t n = 0;
    int rc = 0;
    *dropped = 0;
    if (!ns)
        return -ENOENT;
    /* One pass over the pool; dropping a leaf may make its parent one, so walk up. */
    for (uint32_t i = 0; i < s->ix.nblocks; i++) {
        uint32_t idx = i;
        while (idx != INDEX_NONE && s->ix.blocks[idx].ns == ns_id &&
               store_block_droppable(s, idx)) {
            struct block *b = &s->ix.blocks[idx];
            uint32_t p = b->parent;
            STORE_STAT_ADD(s, ns, flushed_blocks, 1);
            STORE_STAT_ADD(s, ns, flushed_bytes, b->len);
            store_block_drop(s, idx);
            n++;
            idx = p;
        }
    }
    for (uint32_t i = 0; i < s->ix.nblocks && !rc; i++)
        if (s->ix.blocks[i].state != BLOCK_STATE_FREE && s->ix.blocks[i].ns == ns_id)
            rc = -EBUSY;
    *dropped = n;
    if (rc)
        return rc;
    if (ns->tune)
        policy_tune_free(ns->tune);
    free(ns->tune);
    store_heap_free(ns);
    if (s->fast[ns->arena])
        fast_ns_set(s->fast[ns->arena], ns_id, NULL);
    free(ns);
    s->ns[ns_id] = NULL;
    return 0;
}
