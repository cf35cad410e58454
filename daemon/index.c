/*
 * index.c — see index.h for the design.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <xxhash.h>

#include "daemon/index.h"

_Static_assert(sizeof(struct block) <= 96, "per-block metadata budget");

/* Keys may come from engines that hash blocks themselves, or from a hostile client: the
 * slot is a seeded hash with a seed drawn at start, so nobody can aim keys at one run. */
static uint64_t index_hash(const struct index *ix, uint16_t ns, const struct kvc_wire_key *k)
{
    struct {
        uint64_t lo, hi;
        uint64_t ns;
    } in = {k->lo, k->hi, ns};
    return XXH3_64bits_withSeed(&in, sizeof(in), ix->seed);
}

/* The tag part of a slot for a key that hashes to h: the hash's high word (the slot's place
 * takes the low word) in the bits above ibits. */
static uint32_t index_tag(uint32_t ibits, uint64_t h)
{
    return ibits >= 32 ? 0 : (uint32_t)(h >> 32) << ibits;
}

/* The slot value of index idx whose key hashes to h. */
static uint32_t index_slot_val(uint32_t ibits, uint64_t h, uint32_t idx)
{
    return index_tag(ibits, h) | (idx + 1);
}

/* The bits of a slot that hold index + 1 when the pool has cap entries. */
static uint32_t index_ibits(uint32_t cap)
{
    uint32_t b = 1;
    while (b < 32 && (uint64_t)cap >= (1ull << b)) /* index + 1 <= cap < 2^b */
        b++;
    return b;
}

static uint32_t index_slot_idx(const struct index *ix, uint32_t v)
{
    return (ix->ibits >= 32 ? v : v & ((1u << ix->ibits) - 1)) - 1;
}

static bool index_match(const struct block *b, uint16_t ns, const struct kvc_wire_key *k)
{
    return b->ns == ns && b->key.lo == k->lo && b->key.hi == k->hi;
}

void index_huge_pages(void *p, size_t bytes)
{
    const uintptr_t huge = 2u << 20;
    uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1), e = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (p && e > a)
        (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
}

int index_init(struct index *ix, uint32_t initial)
{
    memset(ix, 0, sizeof(*ix));
    ix->cap = initial < 64 ? 64 : initial;
    ix->blocks = calloc(ix->cap, sizeof(*ix->blocks));
    ix->nslots = 128;
    while (ix->nslots < ix->cap * 2)
        ix->nslots <<= 1;
    ix->slots = calloc(ix->nslots, sizeof(*ix->slots));
    index_huge_pages(ix->slots, (size_t)ix->nslots * sizeof(*ix->slots));
    ix->ibits = index_ibits(ix->cap);
    ix->free_head = INDEX_NONE;
    if (getrandom(&ix->seed, sizeof(ix->seed), 0) != sizeof(ix->seed))
        ix->seed = (uint64_t)(uintptr_t)ix ^ 0x2545f4914f6cdd1dull;
    if (!ix->blocks || !ix->slots) {
        index_fini(ix);
        return -ENOMEM;
    }
    return 0;
}

void index_fini(struct index *ix)
{
    free(ix->blocks);
    free(ix->slots);
    memset(ix, 0, sizeof(*ix));
}

static int index_rebuild(struct index *ix, uint32_t nslots, uint32_t ibits);

int index_block_new(struct index *ix, uint32_t *idx)
{
    uint32_t i;
    if (ix->free_head != INDEX_NONE) {
        i = ix->free_head;
        ix->free_head = ix->blocks[i].lru_next;
    } else {
        if (ix->nblocks == ix->cap) {
            uint32_t ncap = ix->cap * 2;
            struct block *nb;
            if (ncap <= ix->cap || ncap >= INDEX_NONE)
                return -ENOMEM;
            /* Indices of the larger pool may need a bit more of each slot: the map is
             * rebuilt with one bit less of tag first, so a failure changes nothing. */
            if (index_ibits(ncap) > ix->ibits &&
                index_rebuild(ix, ix->nslots, index_ibits(ncap)))
                return -ENOMEM;
            nb = realloc(ix->blocks, (size_t)ncap * sizeof(*nb));
            if (!nb)
                return -ENOMEM;
            ix->blocks = nb;
            ix->cap = ncap;
        }
        i = ix->nblocks++;
    }
    memset(&ix->blocks[i], 0, sizeof(ix->blocks[i]));
    ix->blocks[i].lru_prev = ix->blocks[i].lru_next = INDEX_NONE;
    ix->blocks[i].parent = INDEX_NONE;
    ix->live++;
    *idx = i;
    return 0;
}

void index_block_delete(struct index *ix, uint32_t idx)
{
    struct block *b = &ix->blocks[idx];
    memset(b, 0, sizeof(*b));
    b->state = BLOCK_STATE_FREE;
    b->lru_prev = INDEX_NONE;
    b->lru_next = ix->free_head;
    ix->free_head = idx;
    ix->live--;
}

/* The block of (ns, key) or INDEX_NONE, uncounted: index_insert's probe for a duplicate. */
static uint32_t index_probe_hashed(struct index *ix, uint16_t ns, const struct kvc_wire_key *key,
                                   uint64_t h)
{
    uint32_t mask = ix->nslots - 1;
    uint32_t tag = index_tag(ix->ibits, h);
    uint32_t tmask = ix->ibits >= 32 ? 0 : ~((1u << ix->ibits) - 1);
    for (uint32_t s = (uint32_t)h & mask;; s = (s + 1) & mask) {
        uint32_t v = ix->slots[s];
        if (v == 0)
            return INDEX_NONE;
        if ((v & tmask) == tag) {
            uint32_t i = index_slot_idx(ix, v);
            ix->reads++;
            if (index_match(&ix->blocks[i], ns, key))
                return i;
        }
    }
}

static uint32_t index_probe(struct index *ix, uint16_t ns, const struct kvc_wire_key *key)
{
    return index_probe_hashed(ix, ns, key, index_hash(ix, ns, key));
}

uint32_t index_find(struct index *ix, uint16_t ns, const struct kvc_wire_key *key)
{
    ix->finds++;
    return index_probe(ix, ns, key);
}

/* keys[j] hashed, and its home slot on its way into the cache. */
static void index_ahead_hash(struct index_ahead *a, const struct index *ix, uint32_t j)
{
    uint64_t h = index_hash(ix, a->ns, &a->keys[j]);
    a->h[j % INDEX_AHEAD_RING] = h;
    __builtin_prefetch(&ix->slots[(uint32_t)h & (ix->nslots - 1)]);
}

void index_ahead_init(struct index_ahead *a, const struct index *ix, uint16_t ns,
                      const struct kvc_wire_key *keys, uint32_t n)
{
    a->keys = keys;
    a->n = n;
    a->ns = ns;
    a->hashed = 0;
    while (a->hashed < n && a->hashed < 2 * INDEX_AHEAD)
        index_ahead_hash(a, ix, a->hashed++);
}

uint32_t index_ahead_find(struct index_ahead *a, struct index *ix, uint32_t i)
{
    uint32_t mask = ix->nslots - 1;
    /* Slots 2 x INDEX_AHEAD keys ahead; then, for the key INDEX_AHEAD ahead, whose slot has
     * had that long to arrive, the block its home slot names (the first slot is where a
     * key sits in all but a few probes at the map's load). */
    while (a->hashed < a->n && a->hashed <= i + 2 * INDEX_AHEAD)
        index_ahead_hash(a, ix, a->hashed++);
    uint32_t j = i + INDEX_AHEAD;
    if (j < a->hashed) {
        uint64_t h = a->h[j % INDEX_AHEAD_RING];
        uint32_t v = ix->slots[(uint32_t)h & mask];
        uint32_t tmask = ix->ibits >= 32 ? 0 : ~((1u << ix->ibits) - 1);
        if (v && (v & tmask) == index_tag(ix->ibits, h))
            __builtin_prefetch(&ix->blocks[index_slot_idx(ix, v)]);
    }
    ix->finds++;
    if (i >= a->hashed || i + INDEX_AHEAD_RING < a->hashed)
        return index_probe(ix, a->ns, &a->keys[i]); /* not in the ring: asked out of order */
    return index_probe_hashed(ix, a->ns, &a->keys[i], a->h[i % INDEX_AHEAD_RING]);
}

static void index_place(uint32_t *slots, uint32_t nslots, uint32_t h, uint32_t v)
{
    uint32_t mask = nslots - 1;
    uint32_t s = h & mask;
    while (slots[s])
        s = (s + 1) & mask;
    slots[s] = v;
}

/* The map again with n slots whose index part is ibits wide. -ENOMEM changes nothing. */
static int index_rebuild(struct index *ix, uint32_t n, uint32_t ibits)
{
    uint32_t *ns = calloc(n, sizeof(*ns));
    if (!ns)
        return -ENOMEM;
    index_huge_pages(ns, (size_t)n * sizeof(*ns));
    for (uint32_t s = 0; s < ix->nslots; s++) {
        uint32_t v = ix->slots[s];
        if (v) {
            uint32_t i = index_slot_idx(ix, v);
            const struct block *b = &ix->blocks[i];
            uint64_t h = index_hash(ix, b->ns, &b->key);
            index_place(ns, n, (uint32_t)h, index_slot_val(ibits, h, i));
        }
    }
    free(ix->slots);
    ix->slots = ns;
    ix->nslots = n;
    ix->ibits = ibits;
    ix->rebuilds++;
    return 0;
}

int index_reserve(struct index *ix, uint32_t n)
{
    uint32_t nslots = ix->nslots, cap = ix->cap;
    while ((uint64_t)n * 10 > (uint64_t)nslots * 7 && nslots < (1u << 31))
        nslots <<= 1;
    while (cap < n && cap < (1u << 31)) /* the pool doubles: the size it will have */
        cap <<= 1;
    uint32_t ibits = index_ibits(cap) > ix->ibits ? index_ibits(cap) : ix->ibits;
    if (nslots != ix->nslots || ibits != ix->ibits) {
        int rc = index_rebuild(ix, nslots, ibits);
        if (rc)
            return rc;
    }
    /* The pool at that size too, its pages untouched until blocks come (they count in the
     * daemon's memory as they are used): no copy of it on the loop as it fills. */
    if (cap > ix->cap) {
        struct block *nb = realloc(ix->blocks, (size_t)cap * sizeof(*nb));
        if (!nb)
            return -ENOMEM;
        ix->blocks = nb;
        ix->cap = cap;
    }
    return 0;
}

static int index_grow(struct index *ix)
{
    return index_rebuild(ix, ix->nslots * 2, ix->ibits);
}

int index_insert(struct index *ix, uint32_t idx)
{
    const struct block *b = &ix->blocks[idx];
    if (index_probe(ix, b->ns, &b->key) != INDEX_NONE)
        return -EEXIST;
    if ((uint64_t)(ix->used + 1) * 10 > (uint64_t)ix->nslots * 7) {
        int rc = index_grow(ix);
        if (rc)
            return rc;
    }
    uint64_t h = index_hash(ix, b->ns, &b->key);
    index_place(ix->slots, ix->nslots, (uint32_t)h, index_slot_val(ix->ibits, h, idx));
    ix->used++;
    return 0;
}

void index_prefetch_slot(const struct index *ix, uint32_t idx)
{
    const struct block *b = &ix->blocks[idx];
    __builtin_prefetch(&ix->slots[(uint32_t)index_hash(ix, b->ns, &b->key) & (ix->nslots - 1)]);
}

int index_remove(struct index *ix, uint32_t idx)
{
    const struct block *b = &ix->blocks[idx];
    uint32_t mask = ix->nslots - 1;
    uint64_t h = index_hash(ix, b->ns, &b->key);
    uint32_t want = index_slot_val(ix->ibits, h, idx), s = (uint32_t)h & mask;
    while (ix->slots[s] != want) {
        if (ix->slots[s] == 0)
            return -ENOENT;
        s = (s + 1) & mask;
    }
    /* Backward shift: pull later entries of the run into the hole when their home slot
     * does not lie cyclically in (hole, current]. Each entry's home is its block's key
     * hashed: the run's blocks (random places in a pool past the caches) asked for at once
     * first, not one miss after another. */
    for (uint32_t j = (s + 1) & mask, k = 0; ix->slots[j] && k < INDEX_AHEAD;
         j = (j + 1) & mask, k++)
        __builtin_prefetch(&ix->blocks[index_slot_idx(ix, ix->slots[j])]);
    uint32_t hole = s;
    for (uint32_t j = (s + 1) & mask; ix->slots[j]; j = (j + 1) & mask) {
        const struct block *o = &ix->blocks[index_slot_idx(ix, ix->slots[j])];
        uint32_t home = (uint32_t)index_hash(ix, o->ns, &o->key) & mask;
        bool in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!in_range) {
            ix->slots[hole] = ix->slots[j];
            hole = j;
        }
    }
    ix->slots[hole] = 0;
    ix->used--;
    return 0;
}
