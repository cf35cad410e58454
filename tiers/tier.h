/*
 * tier.h — the interface every storage tier implements (host arena, disk, gpu).
 *
 * DESIGN
 * A tier is an ops table plus its private state. The tier engine in the daemon talks to a
 * tier only through these calls, so one conformance suite (tests/check_tier_*.c) runs the
 * same cases against every tier. Calls are made from the daemon's loop thread. read and
 * write are asynchronous: `done` runs exactly once, possibly before the call returns
 * (memory tiers complete at once), with 0 or a negative errno. A tier never includes
 * daemon headers.
 */
#ifndef KVC_TIER_H
#define KVC_TIER_H

#include <stdint.h>

/* Where a block lives inside one tier. */
struct tier_loc {
    uint32_t arena; /* tier-specific container id (host: arena id; disk: file) */
    uint32_t cls;   /* allocator size class, for eviction that frees the right room */
    uint64_t off;   /* byte offset inside the container */
    uint64_t len;   /* bytes owned by this location (the slot, >= requested length) */
};

typedef void (*tier_done_fn)(void *arg, int status);

struct tier;

struct tier_ops {
    const char *name;
    /* Reserves room for len bytes. -ENOSPC when full, -EINVAL when len cannot fit at all. */
    int (*alloc)(struct tier *t, uint64_t len, struct tier_loc *loc);
    /* Returns the room of a location obtained from alloc. */
    void (*free)(struct tier *t, const struct tier_loc *loc);
    /* Copies len bytes at byte `off` inside loc into dst / from src, then calls done. */
    int (*read)(struct tier *t, const struct tier_loc *loc, uint64_t off, void *dst, uint64_t len,
                tier_done_fn done, void *arg);
    int (*write)(struct tier *t, const struct tier_loc *loc, uint64_t off, const void *src,
                 uint64_t len, tier_done_fn done, void *arg);
    uint64_t (*capacity)(const struct tier *t);
    uint64_t (*usage)(const struct tier *t);
    void (*destroy)(struct tier *t);
};

struct tier {
    const struct tier_ops *ops;
};

static inline void tier_destroy(struct tier *t)
{
    if (t)
        t->ops->destroy(t);
}

#endif
