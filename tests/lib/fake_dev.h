/*
 * fake_dev.h — a kern_dev_ops table over host memory, for the unit tests of code above the
 * device calls (the gpu tier's accounting, libkvc's GPU paths) on machines without a GPU.
 *
 * DESIGN
 * The fake is as strict as the driver where a mistake would otherwise only show on a real
 * device:
 * - Copies are queued on their stream and performed only when that stream is synchronised
 *   or an event recorded after them is waited for, reading their source then: code that
 *   forgets to wait reads stale bytes, code that frees or unpins a source before the wait
 *   copies what is there by then. As with the driver, a source in pageable host memory
 *   (not host_register'ed) is staged when the copy is queued, so it may go at once.
 * - "Device memory" is a set of ranges the fake handed out (pools, imports, mem_alloc);
 *   everything else is host memory. A copy whose kind disagrees with where its pointers
 *   live fails (-EINVAL) and leaves an error pending, as cudaMemcpyAsync does.
 * - Each thread has a current device (0 after fake_dev_reset); no op changes it, so a test
 *   can check it is the same after every call of the code under test.
 * - A pending error is what the engine's cudaGetLastError would see: fake_dev_last_error()
 *   returns and clears it. A sticky error (fake_dev.sticky) fails every later call.
 * - The driver is initialised in the process of its first call; a forked child of that
 *   process is refused every call (-EIO), as CUDA is undefined there, until it calls
 *   fake_dev_reset() (what an exec'd process would start from).
 * - Pools live in a memfd, so a process the descriptor is passed to can import them.
 * - A batch kernel (gather, scatter, decode into the engine: kern_batch.h) is queued like a
 *   copy, its tables copied at the call as the launch copies its parameters, and run at the
 *   wait that covers it by kern_batch_run_cpu, the kernel's own row function with one lane;
 *   every tensor base and block it is given must be device memory then, else the wait
 *   reports the fault (-EIO), as a real kernel reading host or freed memory would.
 * - A copy batch (copy_batch) is one operation of n copies, each checked like copy_async
 *   (at most KERN_COPY_BATCH_MAX device to device, KERN_DMA_BATCH_MAX to or from the host).
 * - mem_free is cudaFree: it waits for the whole device first (every stream's work is
 *   performed) and counts a device-wide synchronisation. The largest mem_alloc and the
 *   bytes of those still live are counted (the device memory a client holds for itself).
 * - event_query never waits: when work before the event is still queued it performs that
 *   work and answers 0 (the device has caught up by the time it is asked), unless `hold`
 *   is set: then the device is still copying and the answer is -EAGAIN, as long as the test
 *   keeps it so. A wait performs the work whatever `hold` says (a host wait blocks until
 *   the device is done). An event from event_new belongs to a device and may only be
 *   recorded on a stream of that device.
 * - host_register can be refused (fail_register), as it is where memory cannot be locked.
 *   It counts the pages of its range not resident yet (register_unresident): the driver
 *   pins a range by faulting in what is not, at the caller's cost and at 4 KiB. It may be
 *   called from another thread than the test's (kvcd's registration thread): the pinned
 *   table is locked.
 * - fake_dev_stream_wait_event orders one stream behind another's event, as the engine's
 *   cudaStreamWaitEvent does: a wait on the first stream performs the second's work up to
 *   the event first (a stream wait the engine forgot lets the streams run in either order).
 * Counters let a test check that everything it caused was given back, that a hit costs
 * no allocation, no free, no device-wide synchronisation and no wait before the release, and
 * how many device operations a call queued (ops: copies, copy batches and kernels, each one;
 * records: events recorded), whatever the number of blocks it moved.
 * One test thread drives the fake at a time; the current device alone is per thread.
 */
#ifndef KVC_TESTS_FAKE_DEV_H
#define KVC_TESTS_FAKE_DEV_H

#include <stdint.h>
#include <sys/types.h>

#include "kernels/kern_dev.h"

struct fake_dev_state {
    int devices;             /* device_count() answers this */
    int fail_create;         /* pool_create answers this errno when non-zero */
    int fail_wait;           /* the next wait answers -fail_wait; its copies are lost */
    int readonly_unsup;      /* host_register(readonly) answers -ENOTSUP */
    int sticky;              /* a sticky error: every call fails -EIO */
    int hold;                /* event_query answers -EAGAIN for queued work (device busy) */
    int fail_register;       /* host_register answers -fail_register when non-zero */
    int pools_live;          /* created or imported, not destroyed */
    int registered;          /* host_register minus host_unregister */
    uint64_t register_unresident; /* pages host_register found not yet faulted in (the
                                     driver's pinning would fault them itself) */
    int events_live;         /* event_new_record and event_new, minus their frees */
    int streams_live;        /* stream_new minus stream_free */
    uint64_t allocs;         /* mem_alloc calls */
    uint64_t frees;          /* mem_free calls */
    uint64_t alloc_max;      /* the largest mem_alloc (bytes) */
    uint64_t alloc_bytes;    /* bytes of mem_alloc not freed yet (live) */
    uint64_t device_syncs;   /* waits for the whole device (cudaFree does one) */
    uint64_t legacy_syncs;   /* waits on the legacy default stream (device-wide ordering) */
    uint64_t waits;          /* host waits: stream_sync, event_wait, event_wait_free */
    uint64_t blocking_waits; /* of them, those that found work still queued before their
                                point (a device would block the host there) */
    uint64_t queries;        /* event_query calls (never a wait) */
    uint64_t events_created; /* event_new_record calls */
    uint64_t ops;            /* device operations queued: copy_async, copy_batch, batch */
    uint64_t records;        /* events recorded: event_record, event_new_record */
    uint64_t copies;         /* copies queued (each piece of a copy batch counts) */
    uint64_t copy_batches;   /* copy_batch calls */
    uint64_t dma_ranges;     /* contiguous ranges of host<->device copy batches (one DMA call
                                each where the runtime has no batched DMA) */
    uint64_t packs;          /* gather/scatter kernels queued */
    uint64_t pack_runs;      /* of them, kernels of run steps (kern_batch.h; else row steps) */
    uint64_t decodes;        /* decode kernels queued */
    uint32_t decode_cols;    /* the last one's column rounds (kern_batch's kivik): its kernel */
    uint64_t bad_packs;      /* kernels that met a pointer outside device memory */
    uint64_t bytes;          /* bytes they moved once performed */
    uint64_t queued;         /* copies and kernels queued, not yet performed nor lost */
    uint64_t bad_kinds;      /* copies refused for a wrong kind */
    uint64_t stream_waits;   /* stream waits queued (fake_dev_stream_wait_event) */
    uint64_t fork_refused;   /* calls refused in a forked child */
    int last_error;          /* pending error (negative errno), 0 if none */
    pid_t init_pid;          /* process whose first call initialised the fake; 0: none yet */
};

extern struct fake_dev_state fake_dev;
extern const struct kern_dev_ops fake_dev_ops;

/* Forgets every queued copy and range, resets the counters; `devices` fake devices. In a
 * forked child this stands for a fresh process (the parent's pools stay mapped, but as
 * host memory of this process). */
void fake_dev_reset(int devices);

/* The calling thread's current device, as cudaSetDevice would set it. */
void fake_dev_current_set(int dev);
int fake_dev_current(void);

/* Returns and clears the pending error (cudaGetLastError). */
int fake_dev_last_error(void);

/* An engine's stream on dev (a cudaStreamNonBlocking stream of its own). */
void *fake_dev_stream(int dev);
void fake_dev_stream_free(void *stream);

/* cudaStreamWaitEvent, as an engine's framework calls it (libkvc never does): the work queued
 * on stream after this call is performed only after the work before ev's latest record, so
 * a wait that performs it performs that work first, whatever stream it is on. */
int fake_dev_stream_wait_event(void *stream, void *ev);

#endif
