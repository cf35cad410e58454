/*
 * engine_core.h — the engine core's services that the tier engines use (engine_disk.c,
 * engine_gpu.c, engine_remote.c): a victim, its eviction, a step of the precision ladder, a
 * slot of a namespace's block size. engine.c implements them and hands them down, one table
 * in the store (struct store.core, set by engine_attach), so the tier engines call nothing
 * above them (the layers: daemon/engine.h).
 *
 * DESIGN
 * A table of functions, not a callback per use: the tier engines make room as the memory
 * half does (engine_alloc's eviction order, the ladder before eviction), and that order has
 * one owner. Owned by the loop thread, as the store.
 */
#ifndef KVC_ENGINE_CORE_H
#define KVC_ENGINE_CORE_H

#include <stdint.h>

struct store;
struct store_ns;
struct tier_loc;

/* What a step of a namespace's precision ladder did (engine_ladder_evict). */
enum engine_ladder_r {
    ENGINE_LADDER_NONE = 0, /* nothing it may act on: the caller evicts as without a ladder */
    ENGINE_LADDER_FREED,    /* a block left the tier: room now */
    ENGINE_LADDER_QUEUED,   /* a block goes one rung down: room when its job lands */
    ENGINE_LADDER_WAIT,     /* a step down is due but the worker is full, or the disk asks
                               to wait: room comes with the jobs (and writes) in flight */
};

/* engine_victim, engine_evict, engine_ladder_evict and engine_alloc (daemon/engine.h says
 * what each does). */
struct engine_core {
    uint32_t (*victim)(struct store *s, uint32_t arena, int cls, uint64_t now);
    void (*evict)(struct store *s, uint32_t idx);
    enum engine_ladder_r (*ladder_evict)(struct store *s, uint32_t arena, uint32_t v, uint64_t need,
                                         uint64_t now);
    int (*alloc)(struct store *s, struct store_ns *ns, uint64_t now, struct tier_loc *loc);
};

#endif
