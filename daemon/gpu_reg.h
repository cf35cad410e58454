/*
 * gpu_reg.h — the host arenas registered with the device (page-locked), chunk by chunk as
 * their fault-in reaches them.
 *
 * The pool's moves copy between a host arena and device memory; from registered memory the
 * copy is DMA and does not hold the loop. Registering pins every page of the range, and
 * pins the ones not yet faulted in by faulting them itself: done for a whole arena when the
 * pool opens, it made the start wait for all of it (a 256 GiB host tier: minutes before the
 * first client), and it pinned the pages at 4 KiB before the fault-in could make them 2 MiB
 * pages by collapse (a pinned page cannot be collapsed), so every hit then walked 4 KiB page
 * tables. Now each arena is registered in chunks (GPU_REG_CHUNK), each once the fault-in has
 * been over all of it: when the arena is handed over, the chunks already faulted within its
 * first `now_bytes` (what the start faulted in itself), and the others from a thread of this
 * module as the fault-in threads finish them, in order. Until its chunk is registered a move
 * copies through pageable memory (the driver stages it: correct, slower). A block across two
 * chunks stays so (one copy may not span two registrations); slab pages do not cross a chunk
 * boundary, so only a block larger than its arena's page size can.
 * The thread calls nothing but the device's registration (tier_gpu_host_register) and the
 * fault-in's progress (tier_host_range_faulted); what it did is read by the loop through
 * atomics, and gpu_reg_tick logs its refusals and its end from the loop. Below the store
 * (daemon/store.c owns one with its GPU tier): it knows tiers, not the store.
 */
#ifndef KVCD_GPU_REG_H
#define KVCD_GPU_REG_H

#include <stdbool.h>
#include <stdint.h>

struct tier;
struct gpu_reg;

/* Bytes registered at once (the driver's pinning of one range holds its caller for about
 * its length in page-table walks). */
#define GPU_REG_CHUNK (1ull << 30)
/* Host arenas one registration covers (the store's, with room to spare). */
#define GPU_REG_MAX_ARENAS 64

/* The registration of host arenas with gpu (a GPU tier), chunk bytes at once (0:
 * GPU_REG_CHUNK), registering at once (in the caller's thread) what is faulted in within
 * each arena's first now_bytes. NULL: no memory. */
struct gpu_reg *gpu_reg_new(struct tier *gpu, uint64_t chunk, uint64_t now_bytes);
/* Hands host arena number a (< GPU_REG_MAX_ARENAS; its tier, a host tier) over: the chunks
 * already faulted now, the rest from the thread (started at the first arena that needs it).
 * Loop thread. Returns the arenas the device has refused so far (the rest of each stays
 * pageable). */
uint32_t gpu_reg_arena(struct gpu_reg *r, uint32_t a, struct tier *host);
/* From the loop's tick: logs what the thread refused or finished since the last call;
 * returns the arenas refused so far. */
uint32_t gpu_reg_tick(struct gpu_reg *r);
/* Stops the thread (after the registration it is in), joins it and frees r (NULL: no-op);
 * before the pool or an arena goes. The registrations stay the pool's (tier_gpu). */
void gpu_reg_free(struct gpu_reg *r);

struct gpu_reg_stats {
    uint64_t bytes;   /* of the host arenas registered so far */
    uint64_t pending; /* handed over and not registered yet (nor refused) */
    uint32_t arenas;  /* host arenas registered whole */
    uint32_t refused; /* host arenas the device refused (the rest of each stays pageable) */
};
/* NULL r: all zero. */
void gpu_reg_stats_get(const struct gpu_reg *r, struct gpu_reg_stats *st);

#endif
