/*
 * policy.h — eviction / tiering / precision policies as pure functions.
 *
 * DESIGN
 * A policy sees an array of candidate blocks (a sample of the coldest unpinned leaves the
 * daemon collected, or every block in the simulator) and orders it: the first entry is the
 * one to act on first. It does no I/O, takes no lock and reads no clock: `now` is passed in,
 * so the daemon and the simulator run the same code and tests are table-driven.
 */
#ifndef KVC_POLICY_H
#define KVC_POLICY_H

#include <stddef.h>
#include <stdint.h>

enum policy_kind {
    POLICY_LRU = 0,
    POLICY_KIND_COUNT
};

/* What a policy may know of a block. */
struct policy_block {
    uint32_t id;          /* the caller's handle; policies never interpret it */
    uint32_t hits;        /* lookups that hit this block */
    uint64_t last_access; /* ms, same clock as `now` */
    uint64_t bytes;       /* room freed by evicting it */
    uint32_t depth;       /* position in its prefix: 0 for the first block */
    uint32_t children;    /* cached blocks whose parent it is */
};

/* Policy by name ("lru"); -1 if unknown. */
int policy_from_name(const char *name);
const char *policy_name(enum policy_kind k);

/* Orders b[0..n) in place: b[0] is the block to evict first. */
void policy_rank(enum policy_kind k, struct policy_block *b, size_t n, uint64_t now);

#endif
