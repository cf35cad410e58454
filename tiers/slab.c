/*
 * slab.c — size-class slab allocator over a range it never touches.
 *
 * DESIGN
 * Three tables sized by the page count live on the heap, never in the range:
 *  - a page bitmap (bit set = page owned by no slab), scanned first-fit from the lowest
 *    free page for a run of m contiguous free pages;
 *  - per page, a slab descriptor slot: a slab is named by its first page, and every page
 *    of a slab records that first page (page_owner), so slab_release goes from an offset
 *    to its slab in O(1) and can reject offsets inside no slab, in a slab's tail waste,
 *    not on a slot boundary, or on a slot that is not allocated (double free);
 *  - per page, words of slot bitmap (bit set = slot allocated). A slab of m pages holds at
 *    most m*page/4 KiB slots, so the words reserved for its pages always cover it and
 *    creating a slab never calls malloc.
 * Each class keeps a doubly linked list of its slabs that have a free slot; allocation
 * takes the head and scans its slot bitmap from a per-slab hint, so the common case
 * (one block size) is O(1) plus a short word scan. A slab that empties gives its pages
 * back at once, so room moves between classes.
 * Single-threaded: the owner (the daemon's loop thread) serialises every call.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/slab.h"

#define SLAB_NONE UINT32_MAX
/* A class run longer than its minimum by this many pages is not worth the bookkeeping. */
#define SLAB_RUN_EXTRA_MAX 64u

struct slab_desc {
    uint32_t npages; /* 0 when this page starts no slab */
    uint32_t cls;
    uint32_t nslots;
    uint32_t nfree;
    uint32_t hint; /* lowest slot word that may hold a free slot */
    uint32_t prev; /* partial list of the class, by first page */
    uint32_t next;
    uint32_t draining; /* off the partial list until it empties (slab_drain) */
};

struct slab_class {
    uint64_t slot;
    uint32_t run;        /* pages per slab */
    uint32_t per_slab;   /* slots per slab */
    uint32_t partial;    /* first slab with a free slot, SLAB_NONE if none */
    uint64_t free_slots; /* free slots over the partial slabs */
};

struct slab {
    uint64_t capacity;
    uint64_t page_size;
    unsigned page_shift;
    uint32_t npages;
    uint32_t pages_free;
    uint32_t page_hint; /* no free page below it */
    uint32_t words_per_page;
    uint32_t nclasses;
    uint32_t nslabs;
    uint32_t last_cls; /* class of the last lookup: blocks come in runs of one size */
    uint64_t used;
    uint64_t *page_free;  /* npages bits */
    uint32_t *page_owner; /* first page of the owning slab, SLAB_NONE if free */
    struct slab_desc *desc;
    uint64_t *slot_bits; /* npages * words_per_page words */
    struct slab_class cls[SLAB_MAX_CLASSES];
};

static inline bool slab_page_is_free(const struct slab *s, uint32_t p)
{
    return s->page_free[p >> 6] >> (p & 63) & 1;
}

static void slab_pages_mark(struct slab *s, uint32_t first, uint32_t n, bool free_)
{
    for (uint32_t p = first; p < first + n; p++) {
        uint64_t bit = 1ull << (p & 63);
        if (free_)
            s->page_free[p >> 6] |= bit;
        else
            s->page_free[p >> 6] &= ~bit;
    }
}

/* First free page at or after p, or npages. */
static uint32_t slab_page_next_free(const struct slab *s, uint32_t p)
{
    uint32_t nwords = (s->npages + 63) / 64;
    if (p >= s->npages)
        return s->npages;
    uint32_t w = p >> 6;
    uint64_t bits = s->page_free[w] & (~0ull << (p & 63));
    while (!bits) {
        if (++w >= nwords)
            return s->npages;
        bits = s->page_free[w];
    }
    uint32_t r = w * 64 + (uint32_t)__builtin_ctzll(bits);
    return r < s->npages ? r : s->npages;
}

/* First used page at or after p, or npages. */
static uint32_t slab_page_next_used(const struct slab *s, uint32_t p)
{
    uint32_t nwords = (s->npages + 63) / 64;
    if (p >= s->npages)
        return s->npages;
    uint32_t w = p >> 6;
    uint64_t bits = ~s->page_free[w] & (~0ull << (p & 63));
    while (!bits) {
        if (++w >= nwords)
            return s->npages;
        bits = ~s->page_free[w];
    }
    uint32_t r = w * 64 + (uint32_t)__builtin_ctzll(bits);
    return r < s->npages ? r : s->npages;
}

/* First-fit run of n free pages: its first page, or SLAB_NONE. */
static uint32_t slab_run_find(const struct slab *s, uint32_t n)
{
    if (n > s->pages_free)
        return SLAB_NONE;
    uint32_t p = slab_page_next_free(s, s->page_hint);
    while (p < s->npages && s->npages - p >= n) {
        uint32_t end = slab_page_next_used(s, p);
        if (end - p >= n)
            return p;
        p = slab_page_next_free(s, end);
    }
    return SLAB_NONE;
}

/* Pages per slab for a slot size, in a range of npages pages of 1 << page_shift bytes: the
 * smallest run from the minimum that wastes at most an eighth of itself; if none does within
 * the cap, the least wasteful one. 0 if the slot cannot fit in the range. */
static uint32_t slab_run_for(unsigned page_shift, uint64_t npages, uint64_t slot)
{
    uint64_t page_size = 1ull << page_shift;
    uint64_t min = (slot + page_size - 1) >> page_shift;
    if (min == 0 || min > npages)
        return 0;
    uint64_t max = min + SLAB_RUN_EXTRA_MAX;
    if (max > npages)
        max = npages;
    uint64_t best = min;
    /* waste(best)/bytes(best) minimal, compared by cross-multiplying in 128 bits */
    unsigned __int128 best_waste = ((min << page_shift) % slot), best_bytes = min << page_shift;
    for (uint64_t m = min; m <= max; m++) {
        uint64_t bytes = m << page_shift;
        uint64_t waste = bytes % slot;
        if (waste * 8 <= bytes)
            return (uint32_t)m;
        if ((unsigned __int128)waste * best_bytes < best_waste * bytes) {
            best = m;
            best_waste = waste;
            best_bytes = bytes;
        }
    }
    return (uint32_t)best;
}

static uint32_t slab_run_pick(const struct slab *s, uint64_t slot)
{
    return slab_run_for(s->page_shift, s->npages, slot);
}

static uint64_t slab_slot_round(uint64_t len)
{
    return (len + SLAB_MIN_SLOT - 1) & ~(uint64_t)(SLAB_MIN_SLOT - 1);
}

double slab_slot_cost(uint64_t page_size, uint64_t len)
{
    if (len == 0 || page_size < SLAB_MIN_SLOT || (page_size & (page_size - 1)))
        return 0;
    unsigned shift = (unsigned)__builtin_ctzll(page_size);
    uint64_t slot = slab_slot_round(len);
    uint32_t run = slab_run_for(shift, UINT32_MAX, slot);
    uint64_t per = run ? ((uint64_t)run << shift) / slot : 0;
    return per ? (double)((uint64_t)run << shift) / (double)per : 0;
}

struct slab *slab_new(uint64_t capacity, uint64_t page_size)
{
    struct slab *s = NULL;
    if (page_size < SLAB_MIN_SLOT || (page_size & (page_size - 1)))
        goto fail;
    uint64_t npages = capacity / page_size;
    if (npages == 0 || npages >= SLAB_NONE)
        goto fail;
    s = calloc(1, sizeof(*s));
    if (!s)
        goto fail;
    s->page_size = page_size;
    s->page_shift = (unsigned)__builtin_ctzll(page_size);
    s->npages = (uint32_t)npages;
    s->capacity = npages * page_size;
    s->pages_free = s->npages;
    uint64_t bits_per_page = page_size / SLAB_MIN_SLOT;
    s->words_per_page = (uint32_t)((bits_per_page + 63) / 64);
    s->page_free = calloc((npages + 63) / 64, sizeof(uint64_t));
    s->page_owner = malloc(npages * sizeof(uint32_t));
    s->desc = calloc(npages, sizeof(struct slab_desc));
    s->slot_bits = calloc(npages * s->words_per_page, sizeof(uint64_t));
    if (!s->page_free || !s->page_owner || !s->desc || !s->slot_bits)
        goto fail;
    for (uint32_t p = 0; p < s->npages; p++)
        s->page_owner[p] = SLAB_NONE;
    slab_pages_mark(s, 0, s->npages, true);
    return s;
fail:
    slab_free(s);
    return NULL;
}

void slab_free(struct slab *s)
{
    if (!s)
        return;
    free(s->slot_bits);
    free(s->desc);
    free(s->page_owner);
    free(s->page_free);
    free(s);
}

int slab_class_get(struct slab *s, uint64_t len)
{
    if (len == 0 || len > s->capacity)
        return -EINVAL;
    uint64_t slot = slab_slot_round(len);
    if (s->last_cls < s->nclasses && s->cls[s->last_cls].slot == slot)
        return (int)s->last_cls;
    for (uint32_t c = 0; c < s->nclasses; c++) {
        if (s->cls[c].slot == slot) {
            s->last_cls = c;
            return (int)c;
        }
    }
    uint32_t run = slab_run_pick(s, slot);
    if (run == 0)
        return -EINVAL;
    if (s->nclasses >= SLAB_MAX_CLASSES)
        return -ENOSPC;
    struct slab_class *c = &s->cls[s->nclasses];
    c->slot = slot;
    c->run = run;
    c->per_slab = (uint32_t)(((uint64_t)run << s->page_shift) / slot);
    c->partial = SLAB_NONE;
    c->free_slots = 0;
    s->last_cls = s->nclasses;
    return (int)s->nclasses++;
}

int slab_span(const struct slab *s, uint64_t off, uint64_t *start, uint64_t *slot, uint32_t *nslots,
              uint32_t *used)
{
    if (off >= s->capacity)
        return -EINVAL;
    uint32_t first = s->page_owner[off >> s->page_shift];
    if (first == SLAB_NONE)
        return -EINVAL;
    const struct slab_desc *d = &s->desc[first];
    *start = (uint64_t)first << s->page_shift;
    *slot = s->cls[d->cls].slot;
    *nslots = d->nslots;
    *used = d->nslots - d->nfree;
    return 0;
}

uint64_t slab_class_slot(const struct slab *s, int cls)
{
    if (cls < 0 || (uint32_t)cls >= s->nclasses)
        return 0;
    return s->cls[cls].slot;
}

uint64_t slab_class_free_slots(const struct slab *s, int cls)
{
    if (cls < 0 || (uint32_t)cls >= s->nclasses)
        return 0;
    return s->cls[cls].free_slots;
}

static void slab_partial_push(struct slab *s, struct slab_class *c, uint32_t first)
{
    struct slab_desc *d = &s->desc[first];
    d->prev = SLAB_NONE;
    d->next = c->partial;
    if (c->partial != SLAB_NONE)
        s->desc[c->partial].prev = first;
    c->partial = first;
}

static void slab_partial_unlink(struct slab *s, struct slab_class *c, uint32_t first)
{
    struct slab_desc *d = &s->desc[first];
    if (d->prev != SLAB_NONE)
        s->desc[d->prev].next = d->next;
    else
        c->partial = d->next;
    if (d->next != SLAB_NONE)
        s->desc[d->next].prev = d->prev;
    d->prev = d->next = SLAB_NONE;
}

int slab_drain(struct slab *s, uint64_t off, bool on)
{
    if (off >= s->capacity || s->page_owner[off >> s->page_shift] == SLAB_NONE)
        return -EINVAL;
    uint32_t first = s->page_owner[off >> s->page_shift];
    struct slab_desc *d = &s->desc[first];
    struct slab_class *c = &s->cls[d->cls];
    if (on == !!d->draining)
        return 0;
    if (on) {
        if (d->nfree)
            slab_partial_unlink(s, c, first);
        c->free_slots -= d->nfree;
        d->draining = 1;
    } else {
        d->draining = 0;
        c->free_slots += d->nfree;
        if (d->nfree)
            slab_partial_push(s, c, first);
    }
    return 0;
}

int slab_sparsest(const struct slab *s, int cls, uint32_t max_scan, uint64_t *start, uint32_t *used)
{
    uint32_t best = SLAB_NONE, n = 0;
    if (cls < 0 || (uint32_t)cls >= s->nclasses)
        return -ENOENT;
    for (uint32_t f = s->cls[cls].partial; f != SLAB_NONE && n < max_scan; f = s->desc[f].next, n++)
        if (best == SLAB_NONE || s->desc[f].nfree > s->desc[best].nfree)
            best = f;
    if (best == SLAB_NONE)
        return -ENOENT;
    *start = (uint64_t)best << s->page_shift;
    *used = s->desc[best].nslots - s->desc[best].nfree;
    return 0;
}

uint32_t slab_fit(struct slab *s, uint64_t off, uint64_t len)
{
    if (off >= s->capacity || s->page_owner[off >> s->page_shift] == SLAB_NONE)
        return 0;
    const struct slab_desc *d = &s->desc[s->page_owner[off >> s->page_shift]];
    int ci = slab_class_get(s, len);
    if (ci < 0)
        return 0;
    return d->npages / s->cls[ci].run * s->cls[ci].per_slab;
}

uint32_t slab_class_count(const struct slab *s)
{
    return s->nclasses;
}

static inline uint64_t *slab_bits(struct slab *s, uint32_t first)
{
    return &s->slot_bits[(uint64_t)first * s->words_per_page];
}

/* Carves a new slab for class ci out of free pages; its first page or SLAB_NONE. */
static uint32_t slab_create(struct slab *s, uint32_t ci)
{
    struct slab_class *c = &s->cls[ci];
    uint32_t first = slab_run_find(s, c->run);
    if (first == SLAB_NONE)
        return SLAB_NONE;
    slab_pages_mark(s, first, c->run, false);
    for (uint32_t p = first; p < first + c->run; p++)
        s->page_owner[p] = first;
    s->pages_free -= c->run;
    if (first == s->page_hint)
        s->page_hint = first + c->run;
    struct slab_desc *d = &s->desc[first];
    d->npages = c->run;
    d->cls = ci;
    d->nslots = c->per_slab;
    d->nfree = c->per_slab;
    d->hint = 0;
    memset(slab_bits(s, first), 0, ((c->per_slab + 63) / 64) * sizeof(uint64_t));
    c->free_slots += c->per_slab;
    slab_partial_push(s, c, first);
    s->nslabs++;
    return first;
}

/* Gives back the pages of an empty slab already off its class's partial list. */
static void slab_destroy(struct slab *s, uint32_t first)
{
    struct slab_desc *d = &s->desc[first];
    struct slab_class *c = &s->cls[d->cls];
    c->free_slots -= d->nslots;
    for (uint32_t p = first; p < first + d->npages; p++)
        s->page_owner[p] = SLAB_NONE;
    slab_pages_mark(s, first, d->npages, true);
    s->pages_free += d->npages;
    if (first < s->page_hint)
        s->page_hint = first;
    d->npages = 0;
    s->nslabs--;
}

int slab_alloc(struct slab *s, uint64_t len, uint64_t *off, uint64_t *slot_len, int *cls)
{
    int ci = slab_class_get(s, len);
    if (ci < 0)
        return ci;
    struct slab_class *c = &s->cls[ci];
    uint32_t first = c->partial;
    if (first == SLAB_NONE)
        first = slab_create(s, (uint32_t)ci);
    if (first == SLAB_NONE)
        return -ENOSPC;
    struct slab_desc *d = &s->desc[first];
    uint64_t *bits = slab_bits(s, first);
    uint32_t nwords = (d->nslots + 63) / 64;
    uint32_t w = d->hint;
    /* nfree > 0 and no free slot below the hint word, so this finds one in range */
    while (w < nwords && bits[w] == ~0ull)
        w++;
    uint32_t i = w * 64 + (uint32_t)__builtin_ctzll(~bits[w]);
    bits[w] |= 1ull << (i & 63);
    d->hint = w;
    d->nfree--;
    c->free_slots--;
    if (d->nfree == 0)
        slab_partial_unlink(s, c, first);
    s->used += c->slot;
    *off = ((uint64_t)first << s->page_shift) + (uint64_t)i * c->slot;
    if (slot_len)
        *slot_len = c->slot;
    if (cls)
        *cls = ci;
    return 0;
}

int slab_release(struct slab *s, uint64_t off)
{
    if (off >= s->capacity)
        return -EINVAL;
    uint32_t first = s->page_owner[off >> s->page_shift];
    if (first == SLAB_NONE)
        return -EINVAL;
    struct slab_desc *d = &s->desc[first];
    struct slab_class *c = &s->cls[d->cls];
    uint64_t rel = off - ((uint64_t)first << s->page_shift);
    if (rel % c->slot)
        return -EINVAL;
    uint64_t i = rel / c->slot;
    if (i >= d->nslots)
        return -EINVAL; /* the tail a slab cannot use */
    uint64_t *bits = slab_bits(s, first);
    uint64_t bit = 1ull << (i & 63);
    if (!(bits[i >> 6] & bit))
        return -EINVAL; /* double free */
    bits[i >> 6] &= ~bit;
    if ((uint32_t)(i >> 6) < d->hint)
        d->hint = (uint32_t)(i >> 6);
    s->used -= c->slot;
    bool was_full = d->nfree == 0;
    d->nfree++;
    if (d->draining) {
        /* Off the partial list, its free slots not counted: nothing lands in it. */
        if (d->nfree == d->nslots) {
            d->draining = 0;
            c->free_slots += d->nslots;
            slab_destroy(s, first);
        }
        return 0;
    }
    c->free_slots++;
    if (d->nfree == d->nslots) {
        if (!was_full)
            slab_partial_unlink(s, c, first);
        slab_destroy(s, first);
    } else if (was_full) {
        slab_partial_push(s, c, first);
    }
    return 0;
}

void slab_stats_get(const struct slab *s, struct slab_stats *st)
{
    st->capacity = s->capacity;
    st->used = s->used;
    st->pages = s->npages;
    st->pages_free = s->pages_free;
    st->classes = s->nclasses;
    st->slabs = s->nslabs;
}
