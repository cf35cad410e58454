/*
 * slab.h — size-class allocator over an address range the allocator never touches.
 *
 * DESIGN
 * The range (a host arena, later a GPU pool) is cut into pages of page_size bytes. A size
 * class has one slot size (the request rounded up to 4 KiB; blocks of one namespace all
 * have the same size, so classes are exact and waste nothing). A slab is a run of m pages
 * holding floor(m*page_size/slot) slots, m chosen as the smallest run that wastes at most
 * 1/8 of it (so 3 MiB blocks on 2 MiB pages use 3-page runs of two slots). Pages return
 * to the page pool when their slab empties, so room moves between classes.
 * All metadata lives outside the range: clients may write into the range, and must never
 * be able to corrupt the allocator. Single-threaded: the owner serialises calls.
 */
#ifndef KVC_SLAB_H
#define KVC_SLAB_H

#include <stdbool.h>
#include <stdint.h>

#define SLAB_MAX_CLASSES 64
#define SLAB_MIN_SLOT 4096u

struct slab;

struct slab_stats {
    uint64_t capacity;   /* bytes in whole pages */
    uint64_t used;       /* bytes in allocated slots */
    uint64_t pages;      /* pages in the range */
    uint64_t pages_free; /* pages owned by no slab */
    uint32_t classes;    /* size classes created so far */
    uint32_t slabs;      /* slabs live */
};

/* New allocator over [0, capacity) cut into pages of page_size (a power of two >= 4 KiB).
 * NULL on bad arguments or no memory. */
struct slab *slab_new(uint64_t capacity, uint64_t page_size);
void slab_free(struct slab *s); /* NULL is a no-op */

/* Size class that would serve len bytes, created on first use. -EINVAL if len is 0 or a slot
 * of that size cannot fit in the range, -ENOSPC if the class table is full. */
int slab_class_get(struct slab *s, uint64_t len);

/* Bytes of the range one slot for len bytes takes in an allocator of page_size pages once
 * its slabs are full (the slot rounded up to 4 KiB, plus its share of its slab's tail): what
 * a block of len bytes costs the tier. Pure: the rule slab_class_get applies (for a range of
 * more pages than a slab of that size needs). 0 on bad arguments. */
double slab_slot_cost(uint64_t page_size, uint64_t len);

/* Slot size of a class. */
uint64_t slab_class_slot(const struct slab *s, int cls);

/* Allocates a slot for len bytes: its offset, size and class. -ENOSPC when no slot of that
 * class is free and no run of free pages is left; -EINVAL as slab_class_get. */
int slab_alloc(struct slab *s, uint64_t len, uint64_t *off, uint64_t *slot_len, int *cls);

/* Frees the slot at off. Returns 0, or -EINVAL if off is not the start of an allocated slot
 * (the allocator is unchanged then). */
int slab_release(struct slab *s, uint64_t off);

/* Slots of class cls free right now without taking new pages. */
uint64_t slab_class_free_slots(const struct slab *s, int cls);
/* Draining (on): the slab holding offset off takes no more allocations and its free slots
 * leave its class's count, until it empties (its pages are free again, as for any slab) or
 * it is drained no more (off). For compaction: its blocks move elsewhere. 0 or -EINVAL. */
int slab_drain(struct slab *s, uint64_t off, bool on);
/* Of the first max_scan slabs with a free slot of class cls, the one with the fewest slots
 * in use: its first byte and that count. -ENOENT when there is none. */
int slab_sparsest(const struct slab *s, int cls, uint32_t max_scan, uint64_t *start,
                  uint32_t *used);
/* Slots of `len` bytes the pages of the slab holding off would give once it is empty (0: a
 * slab of that size needs more pages, or off is in no slab). May create len's class. */
uint32_t slab_fit(struct slab *s, uint64_t off, uint64_t len);
/* Size classes created so far (numbered from 0). */
uint32_t slab_class_count(const struct slab *s);
/* The slab holding offset off: its first byte, its slot size, its slots and how many are
 * allocated. 0, or -EINVAL for an offset in no slab. */
int slab_span(const struct slab *s, uint64_t off, uint64_t *start, uint64_t *slot,
              uint32_t *nslots, uint32_t *used);

void slab_stats_get(const struct slab *s, struct slab_stats *st);

#endif
