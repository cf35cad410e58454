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
 * between the pool and host memory (the daemon moves blocks between tiers with them;
 * engines copy on their own streams, never through the daemon): with a callback they only
 * queue the copy, and the callback runs from tier_gpu_poll() once it has landed, which the
 * owner calls when tier_gpu_fd() is readable; without one they wait. Owned by the daemon's
 * loop thread: every call, callbacks included, runs there.
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

/* Copies a tier keeps in flight at most: read/write with a callback answer -EAGAIN beyond. */
#define TIER_GPU_MAX_INFLIGHT 64

/* Asynchronous copies. read/write with a `done` callback queue the copy on the tier's
 * private stream and return 0 (or -EINVAL, -EAGAIN, -EIO with nothing queued and no
 * callback); `done` runs exactly once, from tier_gpu_poll() or tier_gpu_drain(), with 0 when
 * the bytes have landed or -EIO when the device failed the copy. Without a callback the copy
 * has landed when the call returns (a wait). */
/* A timerfd, readable when a copy in flight may have landed: watch it for EPOLLIN. */
int tier_gpu_fd(const struct tier *t);
/* Completes the copies that have landed, in the order they were queued, without waiting
 * (one event query for the oldest), and arms tier_gpu_fd for the next check. Returns the
 * callbacks run. */
uint32_t tier_gpu_poll(struct tier *t);
/* Makes tier_gpu_fd readable at once, so the owner's loop polls again from its own handler
 * (for work a poll made outside that handler left to be announced). */
void tier_gpu_wake(struct tier *t);
/* Waits for every copy in flight and runs their callbacks (shutdown). Returns how many. */
uint32_t tier_gpu_drain(struct tier *t);
uint32_t tier_gpu_inflight(const struct tier *t);

struct tier_gpu_stats {
    uint64_t copies;     /* queued with a callback */
    uint64_t bytes;      /* of those */
    uint64_t failed;     /* of those, completed with an error */
    uint64_t queries;    /* event queries (never a wait) */
    uint64_t waits;      /* host waits for the stream: copies without a callback, drains */
    uint32_t inflight;   /* copies queued and not completed */
    uint32_t registered; /* host ranges registered by tier_gpu_host_register */
};
void tier_gpu_stats_get(const struct tier *t, struct tier_gpu_stats *st);

/* Registers host memory the tier will copy from and into (page-locked, read-write) with the
 * device, until the tier is destroyed: its copies are DMA, asynchronous for the host (a
 * copy must lie within one registered range to be; one across two is staged). One caller
 * thread at a time, which may be another than the loop's (a registration takes as long as
 * pinning the range). 0, -ENOMEM, or the ops table's error (then the memory stays pageable:
 * the copies still work, the driver staging them). */
int tier_gpu_host_register(struct tier *t, void *p, uint64_t len);

#endif
