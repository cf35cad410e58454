/*
 * kern_dev.h — the device-memory operations kvcd and libkvc need, as one small ops table.
 *
 * DESIGN
 * Everything that touches the CUDA driver or runtime for the GPU tier goes through
 * struct kern_dev_ops, so the code above it (the gpu tier's accounting in tiers/gpu.c, the
 * checks and fallbacks of libkvc's GPU calls) is the same code whether the table is the
 * real one (kern_dev.cu), none at all (a build without CUDA: kern_dev_cuda() is NULL), or
 * a fake over host memory that the unit tests install.
 *
 * A pool is one device allocation of fixed size, exportable to other processes. The real
 * table prefers the CUDA virtual memory API (cuMemCreate with a POSIX file-descriptor
 * handle): the handle is a descriptor, so it travels over the daemon's socket with
 * SCM_RIGHTS like the host arena, only processes the daemon hands it to can map the pool,
 * and the pool lives as long as any process holds the descriptor or a mapping. Where the
 * device or driver lacks VMM or descriptor handles, it falls back to cudaMalloc plus
 * cudaIpcGetMemHandle, whose 64-byte handle travels in the reply instead (any process of
 * the host that learns those bytes can open it, which is why it is only the fallback).
 *
 * The calling thread's current device is the caller's: no op changes it. Ops that must run
 * on one device (pool create and import, private streams) make it current for the call and
 * restore the caller's device before they return; pool_import maps the pool for access
 * from the pool's device only, so a caller whose current device is another one cannot use
 * the mapping (libkvc then stays on host copies).
 *
 * Copies are stream-ordered on the stream passed (cudaStream_t as void *, NULL for the
 * legacy default stream). There is no synchronous copy in the table: cudaMemcpy may return
 * before a pageable host-to-device DMA lands and does not wait for device-to-device work,
 * so a caller that needs the bytes in place queues on a private stream (stream_new: a
 * cudaStreamNonBlocking stream, which never synchronises with the engine's streams through
 * the legacy default stream) and then waits for that stream, or records an event after the
 * copy and asks it later without waiting (event_new, event_query: the daemon's pool moves,
 * whose loop thread must never block on a copy). Every call returns 0 or a
 * negative errno: -ENODEV (no device or driver), -ENOTSUP (not available here), -EIO (a
 * CUDA error, one line on stderr); a failure the table handled leaves no error pending in
 * the runtime (cudaGetLastError), so the engine's own error checks never see ours.
 * Thread safety: the real table may be called from any thread.
 */
#ifndef KVC_KERN_DEV_H
#define KVC_KERN_DEV_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kern_batch_args;

enum kern_dev_handle {
    KERN_DEV_HANDLE_NONE = 0,
    KERN_DEV_HANDLE_FD = 1,     /* VMM allocation, POSIX file descriptor */
    KERN_DEV_HANDLE_LEGACY = 2, /* cudaIpcMemHandle_t bytes */
};

#define KERN_DEV_LEGACY_BYTES 64
#define KERN_DEV_UUID_BYTES 16

/* One pool as a process sees it. Filled by pool_create (the owner) or pool_import. */
struct kern_dev_pool {
    int device;      /* CUDA ordinal in this process */
    uint64_t size;   /* bytes mapped at base */
    void *base;      /* device address in this process (for the fake: host memory) */
    uint32_t handle; /* enum kern_dev_handle */
    int fd;          /* FD handle, owned by the pool (closed by pool_destroy); -1 if none */
    uint8_t legacy[KERN_DEV_LEGACY_BYTES];
    uint8_t uuid[KERN_DEV_UUID_BYTES]; /* the device's UUID: the same GPU in every process */
    void *priv;                        /* the backend's own state */
};

enum kern_dev_copy {
    KERN_DEV_COPY_DEFAULT = 0, /* unified addressing decides (any pair of pointers) */
    KERN_DEV_COPY_H2D = 1,
    KERN_DEV_COPY_D2H = 2,
    KERN_DEV_COPY_D2D = 3,
};

struct kern_dev_ops {
    const char *name;
    /* Devices visible (0 when the driver finds none). */
    int (*device_count)(void);
    /* UUID of device `dev`. */
    int (*device_uuid)(int dev, uint8_t uuid[KERN_DEV_UUID_BYTES]);
    /* Allocates and exports a pool of at least size bytes on dev; fills p. */
    int (*pool_create)(int dev, uint64_t size, struct kern_dev_pool *p);
    /* Maps a pool exported by another process: p->handle, fd (consumed on success: owned by
     * p), legacy, size and uuid as the exporter filled them. Picks the local device with
     * that uuid; -ENODEV when there is none. Sets p->base and p->device. */
    int (*pool_import)(struct kern_dev_pool *p);
    /* Unmaps and frees (or releases the import of) a pool; closes p->fd. */
    void (*pool_destroy)(struct kern_dev_pool *p);
    /* Queues a copy of len bytes on stream. The kind must match where the pointers live
     * (KERN_DEV_COPY_DEFAULT: unified addressing decides). */
    int (*copy_async)(void *dst, const void *src, uint64_t len, int kind, void *stream);
    /* A private non-blocking stream on dev (*stream owned by the caller: stream_free). */
    int (*stream_new)(int dev, void **stream);
    void (*stream_free)(void *stream);
    /* The calling thread's current device. */
    int (*device_get)(int *dev);
    /* Records event (a cudaEvent_t the caller owns, or one from event_new_record, which it
     * then marks the point of: a recorded event may be recorded again) on stream. */
    int (*event_record)(void *event, void *stream);
    /* A new internal event recorded on stream (*ev owned by the caller: event_wait_free). */
    int (*event_new_record)(void **ev, void *stream);
    /* Waits until the work before an event's latest record is done; the event stays the
     * caller's, to be recorded again (event_record) or freed (event_wait_free). */
    int (*event_wait)(void *ev);
    /* Waits for an event from event_new_record and frees it. */
    int (*event_wait_free)(void *ev);
    int (*stream_sync)(void *stream);
    /* Pins [p, p+len) of host memory for DMA (read-only mappings when readonly). -ENOTSUP:
     * readonly where the device cannot register read-only memory (nothing is pinned; the
     * copies from it stay pageable). */
    int (*host_register)(void *p, uint64_t len, int readonly);
    int (*host_unregister)(void *p);
    /* Device ordinal of a device pointer; -EINVAL for host memory. */
    int (*pointer_device)(const void *p);
    /* Device memory (*p owned: mem_free). cudaMalloc and cudaFree: mem_free waits for the
     * whole device first, so callers keep such memory and never free it on a hot path. */
    int (*mem_alloc)(void **p, uint64_t len);
    void (*mem_free)(void *p);
    /* Queues one batch (kern_batch.h: a gather, a scatter or a decode into the engine's
     * tensors, its tables by value in *a, which is read before the call returns) as one
     * kernel on stream. */
    int (*batch)(const struct kern_batch_args *a, void *stream);
    /* Queues n copies (dst[i] <- src[i], len[i] bytes; host arrays read before the call
     * returns) of one kind on stream, as one operation where the kind allows it: device to
     * device, one kernel (kern_copy_batch_cuda), at most KERN_COPY_BATCH_MAX pieces; to or
     * from host memory, one batched DMA call (cudaMemcpyBatchAsync, a range per piece that
     * does not continue the one before; one cudaMemcpyAsync per range where the runtime lacks
     * it), at most KERN_DMA_BATCH_MAX pieces. */
    int (*copy_batch)(void *const *dst, const void *const *src, const uint64_t *len, uint32_t n,
                      int kind, void *stream);
    /* An event on device dev (made current for the call only), not recorded yet: record it
     * with event_record on a stream of the same device, ask it with event_query, free it with
     * event_free (*ev owned by the caller). For work that a thread must not wait for. */
    int (*event_new)(int dev, void **ev);
    /* Never waits: 0 when the work before the event's latest record is done (or it was never
     * recorded), -EAGAIN while it is not, -EIO when that work failed (cudaEventQuery). */
    int (*event_query)(void *ev);
    /* Frees an event without waiting for it (cudaEventDestroy); NULL is a no-op. */
    void (*event_free)(void *ev);
};

/* The CUDA table, or NULL in a build without CUDA. The real table answers -ENODEV where no
 * device is found. */
const struct kern_dev_ops *kern_dev_cuda(void);

/* Name of a handle type: "vmm-fd", "legacy-ipc", "none". */
const char *kern_dev_handle_name(uint32_t handle);

#ifdef __cplusplus
}
#endif
#endif
