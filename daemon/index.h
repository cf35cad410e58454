/*
 * index.h — every block the daemon knows, and the (namespace, key) → block map.
 *
 * DESIGN
 * Blocks live in one pool (an array that grows by doubling) and are named by their index,
 * never by pointer, so links (LRU, hash) are 4 bytes and survive the pool's growth. The map
 * is open addressing with linear probing over 32-bit slots and backward-shift deletion, so
 * a lookup touches one or two cache lines of slots whatever the number of blocks. A slot
 * holds index + 1 (0: empty) in its low bits and, in the bits the pool's size leaves free
 * (11 at a million blocks, none from 2^31), a tag from other bits of the key's hash: a
 * probe reads only the blocks whose tag matches, so a miss or a walk past other keys costs
 * no block's cache line (at the map's load of 0.35-0.7 a new key passed 1-5 blocks, each a
 * cache miss in a large pool). The slot and tag come from a seeded XXH3 of (key, namespace)
 * with a seed drawn at start, since keys may be chosen by clients. Metadata per block: the
 * struct below (64 bytes) plus 6-12 bytes of map. Owned by the loop thread.
 */
#ifndef KVC_INDEX_H
#define KVC_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "client/kvc_proto.h"

#define INDEX_NONE UINT32_MAX

enum block_state {
    BLOCK_STATE_FREE = 0,      /* pool entry unused */
    BLOCK_STATE_RESERVED = 1,  /* slot handed to a writer; invisible to lookups */
    BLOCK_STATE_COMMITTED = 2, /* visible */
};

/* 64 bytes: the fields that never need 32 or 64 bits share words. off keeps 48 bits (host.size
 * is at most 2^42, gpu.pool_size 2^44), last_access 39 (ms since start: 17 years), hits
 * 24 (it stops counting at 2^24 - 1). The parent is named by its block index: a committed
 * block's parent is committed and holds it as a child (daemon/store.h), so the index stays
 * that block's while the link exists; its key is blocks[parent].key. A disk record's place
 * and length are in store.rec. */
struct block {
    struct kvc_wire_key key;
    uint64_t off : 48;         /* location in its fastest tier (host, GPU, or disk) */
    uint64_t ns : 16;          /* namespace id */
    uint64_t last_access : 39; /* ms since start */
    uint64_t format : 7;       /* KVC_WIRE_FORMAT_* */
    uint64_t merge_refused : 1; /* a step to merge with no rung after it was refused (more
                                   runs than merge stores): off the ladder while it has
                                   children, then it leaves (daemon/quant.c) */
    uint64_t flags : 8;        /* BLOCK_F_* */
    uint64_t state : 2;        /* enum block_state */
    uint64_t tier : 2;         /* fastest tier holding it (KVC_WIRE_TIER_*) */
    uint64_t arena : 5;        /* its LRU list: a host arena, STORE_ARENA_GPU or STORE_ARENA_DISK */
    uint32_t hits : 24;        /* saturates at BLOCK_HITS_MAX */
    uint32_t cls : 8;
    uint32_t len;      /* slot bytes there */
    uint32_t lru_prev; /* FREE: unused; RESERVED: the handle slot of its reservation */
    uint32_t lru_next; /* FREE: the next free entry (index.free_head); RESERVED: its place
                          in that reservation's blocks[] (store_resv_holding) */
    uint32_t pins;
    uint32_t children; /* committed blocks whose parent this is */
    uint32_t depth;
    uint32_t parent; /* the block before it in its prefix, INDEX_NONE for the first */
};
_Static_assert(sizeof(struct block) == 64, "struct block is at its metadata budget");
#define BLOCK_HITS_MAX ((1u << 24) - 1)
#define BLOCK_OFF_MAX ((1ull << 48) - 1)
#define BLOCK_ARENA_MAX 31u

/* Where a block is and what is happening to it (daemon/engine_disk.h: the tier engine owns
 * these transitions).
 * DISK: it has a valid record on disk at store.rec[its index]. Inclusive hierarchy: a block in
 *   memory with DISK set is clean — its memory copy can go at no cost, and writing it to
 *   disk again costs nothing; without DISK it is dirty.
 * DEMOTING: a disk write of it is in flight (encode or I/O); PROMOTING: its memory slot is
 *   being filled (from disk, the remote tier or the GPU pool), so lookups name it not ready;
 *   GPU_MOVING: a copy to or from the GPU pool is in flight; COMPACTING: its disk record is
 *   being copied to another page;
 *   QUANTIZING: a quantize-in-place job holds it.
 * LOST: its only copy failed verification; a miss until dropped.
 * A block with any BUSY flag, or pinned, is never freed, moved or evicted by any path. */
#define BLOCK_F_DEMOTING 0x1u
#define BLOCK_F_PROMOTING 0x2u
#define BLOCK_F_LOST 0x4u
#define BLOCK_F_QUANTIZING 0x8u
#define BLOCK_F_DISK 0x10u
#define BLOCK_F_COMPACTING 0x20u
#define BLOCK_F_REMOTE 0x40u /* the remote tier holds it (written, or read from there) */
#define BLOCK_F_GPU_MOVING                                                                         \
    0x80u /* a copy between its host arena and the GPU pool is in flight
                                    (daemon/engine_gpu.h); with PROMOTING: out of the pool */
#define BLOCK_F_MOVING (BLOCK_F_DEMOTING | BLOCK_F_PROMOTING | BLOCK_F_GPU_MOVING)
#define BLOCK_F_BUSY (BLOCK_F_MOVING | BLOCK_F_QUANTIZING | BLOCK_F_COMPACTING)

struct index {
    struct block *blocks; /* pool; entries [0, nblocks) are allocated */
    uint32_t nblocks;
    uint32_t cap;
    uint32_t free_head; /* free list through lru_next */
    uint32_t live;      /* entries not FREE */
    uint32_t *slots;    /* map: block index + 1 in the low ibits, a tag above; 0 empty */
    uint32_t nslots;    /* power of two */
    uint32_t ibits;     /* bits of a slot that hold index + 1: every index < cap fits */
    uint32_t used;      /* map entries */
    uint64_t seed;      /* of the slot hash, random per start */
    uint64_t finds;     /* index_find calls so far: the lookups count theirs (stats.h) */
    uint64_t reads;     /* blocks whose key a probe compared (a tag matched) */
    uint64_t rebuilds;  /* times the map was rebuilt (grown, or its slots widened) */
};

/* The key map's slots on huge pages where the kernel allows them (transparent huge pages
 * "madvise" or "always"), called on an allocation before its pages are first touched: at a
 * million blocks a probe reads a random 4 KiB page of it, so on small pages it missed the TLB
 * as well as the cache (a page walk; under a hypervisor, two). Only for a table every part
 * of which is used: a huge page is resident whole once touched (the pool of blocks on them
 * cost 1-2 B a block at a million, past the design's 128). An allocation under 2 MiB, or
 * its parts outside whole 2 MiB pages, stays as it is; where the kernel refuses, nothing
 * changes. */
void index_huge_pages(void *p, size_t bytes);

int index_init(struct index *ix, uint32_t initial);
void index_fini(struct index *ix);
/* Room for n blocks with no rebuild of the map on the way: slots for n at the map's load
 * limit, and slot values wide enough for the pool that holds n (one rebuild now, or none);
 * the pool itself at that size (its pages touched as blocks come; pointers into the pool are
 * invalidated, as by index_block_new). Rebuilding the map
 * costs O(entries) on the loop: ~40 ms at a million blocks here, ~110 ms at two. Never
 * shrinks. -ENOMEM: what could not grow stays as it was. */
int index_reserve(struct index *ix, uint32_t n);

/* A new pool entry (state FREE, zeroed apart from links). -ENOMEM. Pointers into the pool
 * are invalidated by this call; indices are not. */
int index_block_new(struct index *ix, uint32_t *idx);
/* Returns an entry to the pool; it must not be in the map. */
void index_block_delete(struct index *ix, uint32_t idx);

/* The block of (ns, key) or INDEX_NONE. Counts itself in ix->finds (index_insert's own probe
 * for a duplicate is part of the insert, not counted). */
uint32_t index_find(struct index *ix, uint16_t ns, const struct kvc_wire_key *key);
/* index_find over keys[0..n) taken in order, each probe's cache misses (its slot, then its
 * block: one after the other, ~100 ns each in a map larger than the caches) started
 * INDEX_AHEAD keys ahead, so a lookup of many keys waits on several at once instead of one
 * at a time. index_ahead_init, then index_ahead_find for i = 0, 1, ... (any i < n; out of
 * order is slower, never wrong). Counts in ix->finds as index_find does, each key it
 * resolves; a key it only looked ahead at is not counted. */
#define INDEX_AHEAD 8
#define INDEX_AHEAD_RING 32 /* hashes kept: the key resolved and the 2 x INDEX_AHEAD after it */
struct index_ahead {
    const struct kvc_wire_key *keys;
    uint32_t n;
    uint32_t hashed; /* keys[0..hashed) hashed into h (by index), their slots prefetched */
    uint16_t ns;
    uint64_t h[INDEX_AHEAD_RING];
};
void index_ahead_init(struct index_ahead *a, const struct index *ix, uint16_t ns,
                      const struct kvc_wire_key *keys, uint32_t n);
uint32_t index_ahead_find(struct index_ahead *a, struct index *ix, uint32_t i);

/* Maps blocks[idx] under its ns and key. -EEXIST if present, -ENOMEM. */
int index_insert(struct index *ix, uint32_t idx);
/* Unmaps blocks[idx]. -ENOENT if it is not mapped. */
int index_remove(struct index *ix, uint32_t idx);
/* Block idx's home slot on its way into the cache, for an index_remove to come (blocks[idx]
 * is read: best where it is in the cache already). */
void index_prefetch_slot(const struct index *ix, uint32_t idx);

/* A hit counted on b: the count stops at BLOCK_HITS_MAX instead of wrapping to 0. */
static inline void block_hit(struct block *b)
{
    if (b->hits < BLOCK_HITS_MAX)
        b->hits++;
}

static inline bool index_key_is_zero(const struct kvc_wire_key *k)
{
    return (k->lo | k->hi) == 0;
}

/* The key of b's parent, all-zero for the first block of a prefix (what records and replies
 * carry). */
static inline struct kvc_wire_key index_parent_key(const struct index *ix, const struct block *b)
{
    return b->parent == INDEX_NONE ? (struct kvc_wire_key){0, 0} : ix->blocks[b->parent].key;
}

/* Whether idx, found for (ns, key) earlier in the same request, still names that key's
 * committed block: what a later step checks instead of a second index_find. A block dropped
 * in between has its entry FREE, or reused for another key; an entry reused for the same key
 * is the block the map holds for it now, so no generation number is needed. */
static inline bool index_handle_ok(const struct index *ix, uint32_t idx, uint16_t ns,
                                   const struct kvc_wire_key *key)
{
    const struct block *b = idx < ix->nblocks ? &ix->blocks[idx] : NULL;
    return b && b->state == BLOCK_STATE_COMMITTED && b->ns == ns && b->key.lo == key->lo &&
           b->key.hi == key->hi;
}

#endif
