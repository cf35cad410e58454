/*
 * tier_conformance.h — the cases every tier must pass, for any tier's Check suite.
 *
 * DESIGN
 * A suite registers a factory (create a fresh tier of a given capacity, destroy it) and
 * gets back a TCase whose cases only use the ops table, so the host, disk and gpu tiers
 * are held to one contract:
 *  - alloc: -EINVAL for 0 bytes and for more than the capacity, -ENOSPC when full, room
 *    comes back after free; usage is the sum of loc.len over live locations;
 *  - read/write: -EINVAL (and no callback) for 0 bytes or any byte outside the location
 *    or the tier; otherwise 0 and `done` exactly once with status 0, and the bytes written
 *    are the bytes read.
 * Check runs test functions without an argument, so factories live in a small static
 * table and each case is a loop test over its factory's index.
 */
#ifndef KVC_TESTS_TIER_CONFORMANCE_H
#define KVC_TESTS_TIER_CONFORMANCE_H

#include <check.h>
#include <stdbool.h>
#include <stdint.h>

#include "tiers/tier.h"

#define TIER_CONFORMANCE_MAX 8

struct tier_conformance {
    const char *name;  /* shown in the TCase name */
    /* What the cases ask the factory for (a few MiB). A case keeps at most 7 blocks of
     * distinct sizes (1 B to 64 KiB, and `block`) live at once: room for that much. */
    uint64_t capacity;
    uint64_t block;    /* a typical block size for fill tests; capacity/block >= 4 */
    bool whole_slot;   /* one location may span the whole capacity */
    /* A fresh, empty tier of at least `capacity` bytes, or NULL. */
    struct tier *(*create)(uint64_t capacity, void *arg);
    /* Destroys a tier from create; NULL means tier_destroy(). */
    void (*destroy)(struct tier *t, void *arg);
    /* Runs the tier until every read/write issued so far has called done; NULL for tiers
     * that complete before returning. */
    void (*drain)(struct tier *t, void *arg);
    void *arg;
};

/* A TCase named "conformance:<name>" with every conformance case run against f, which is
 * copied. Never NULL: a full factory table or an unusable factory (no create, capacity
 * below 4 blocks) is a bug of the suite, which then exits with status 2 and one line on
 * stderr, so no case is ever dropped in silence. */
TCase *tier_conformance_tcase(const struct tier_conformance *f);

#endif
