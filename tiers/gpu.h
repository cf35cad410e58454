/*
 * gpu.h — the gpu tier: one device pool owned by kvcd, cut by the slab allocator, shared
 * with engines on the same GPU through an exported handle.
 *
 * DESIGN
 * The pool is allocated once at start on one device and never resized. The allocator
 * (tiers/slab.c) works on offsets and keeps its metadata in the daemon's heap, so it is the
 * same code over a device range as over the host arena, and clients that write into the
 * pool can never corrupt it. Every device call goes through a struct kern_dev_ops table:
 * the real CUDA one in kvcd, a fake over host memory in the unit tests, so the tier's
 * accounting and the conformance suite run on machines without a GPU. read and write copy
 * between the pool and host memory and wait (the daemon moves blocks between tiers with
 * them; engines copy on their own streams, never through the daemon). Owned by the
 * daemon's loop thread.
 */
#ifndef KVC_TIER_GPU_H
#define KVC_TIER_GPU_H

#include <stdint.h>

#include "kernels/kern_dev.h"
#include "tiers/tier.h"

struct tier_gpu_config {
    const struct kern_dev_ops *ops; /* device calls; borrowed for the tier's life */
    int device;                     /* ordinal */
    uint32_t arena_id;              /* id carried in tier_loc.arena and on the wire */
    uint64_t size;                  /* bytes; rounded to page_size (and the device's grain) */
    uint64_t page_size;             /* allocator page, power of two >= 4 KiB */
};

/* Creates the pool. NULL on failure with *err: -EINVAL (config), -ENODEV (no device or no
 * driver, or ops NULL), -ENOMEM (device memory), -EIO (a CUDA error). */
struct tier *tier_gpu_new(const struct tier_gpu_config *cfg, int *err);

/* The pool as exported: handle type, fd (owned by the tier; dup before passing it on),
 * legacy bytes, uuid, size, base (the daemon's own device address). */
const struct kern_dev_pool *tier_gpu_pool(const struct tier *t);
uint32_t tier_gpu_arena_id(const struct tier *t);
int tier_gpu_class(struct tier *t, uint64_t len);
struct slab *tier_gpu_slab(const struct tier *t);
/* True if t is a gpu tier (its ops table is this file's). */
int tier_is_gpu(const struct tier *t);

#endif
