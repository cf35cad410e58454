/*
 * fake_dev_py.c — the strict fake device (tests/lib/fake_dev.c) for the Python tests: a
 * test-only shared object (build/tests/libkvc_fakedev_py.so, never installed) that the tests
 * load with ctypes to install the fake's ops table into the kvcd extension of their process
 * and to drive it (device memory, streams, events, counters).
 *
 * DESIGN
 * The extension links libkvc, whose GPU calls go through a kern_dev_ops table; the tests pass
 * the address of the extension's kvci_gpu_ops_set (found with ctypes in the extension's own
 * image) to fdp_install, which resets the fake and hands it its table. Clients that attach
 * afterwards use the fake; fdp_install(set, 0) puts libkvc's own table back. The fake's
 * "device memory" is host memory it keeps a list of, so a test reads a device tensor with
 * ctypes once the stream or event that covers the copies into it has been waited for
 * (before that the strict fake has not performed them).
 * The fake is for one thread; the kvcd package calls libkvc from several (vLLM's connector
 * commits on a thread of its own, with the GIL released), so the table installed here
 * takes one lock around every call into the fake, as do the functions the tests call. It
 * also counts the host waits of each thread (fdp_stat("thread_waits") answers the calling
 * thread's, "thread_blocking_waits" those of them that found device work still queued,
 * where a device would block the thread): a test asks whether a call of its own thread
 * waited while another thread's commits wait as they should. fdp_copy queues device work
 * of the test's own (a model's reads and writes of its KV cache) and fdp_stream_wait_event
 * orders a stream behind an event, as the engine's framework does.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kern_dev.h"
#include "tests/lib/fake_dev.h"

#define FDP_API __attribute__((visibility("default")))

typedef void (*fdp_set_fn)(const struct kern_dev_ops *ops);

FDP_API int fdp_install(void *set, int on);
FDP_API void *fdp_alloc(uint64_t len);
FDP_API void fdp_free(void *p);
FDP_API void *fdp_stream(void);
FDP_API void fdp_stream_free(void *s);
FDP_API int fdp_stream_sync(void *s);
FDP_API void *fdp_event(void);
FDP_API int fdp_event_query(void *ev);
FDP_API int fdp_event_wait(void *ev);
FDP_API void fdp_event_free(void *ev);
FDP_API long long fdp_stat(const char *name);
FDP_API int fdp_set(const char *name, int v);
FDP_API int fdp_last_error(void);
FDP_API int fdp_event_record(void *ev, void *stream);
FDP_API int fdp_stream_wait_event(void *stream, void *ev);
FDP_API int fdp_copy(void *dst, const void *src, uint64_t len, int kind, void *stream);

static pthread_mutex_t fdp_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local long long fdp_thread_waits;    /* host waits of the calling thread */
static _Thread_local long long fdp_thread_blocking; /* of them, those that found work queued */

#define FDP_LOCKED(type, call)                                                                     \
    do {                                                                                           \
        pthread_mutex_lock(&fdp_mu);                                                               \
        type r_ = call;                                                                            \
        pthread_mutex_unlock(&fdp_mu);                                                             \
        return r_;                                                                                 \
    } while (0)
#define FDP_LOCKED_VOID(call)                                                                      \
    do {                                                                                           \
        pthread_mutex_lock(&fdp_mu);                                                               \
        call;                                                                                      \
        pthread_mutex_unlock(&fdp_mu);                                                             \
    } while (0)

static int fdp_device_count(void)
{
    FDP_LOCKED(int, fake_dev_ops.device_count());
}

static int fdp_device_uuid(int dev, uint8_t uuid[KERN_DEV_UUID_BYTES])
{
    FDP_LOCKED(int, fake_dev_ops.device_uuid(dev, uuid));
}

static int fdp_pool_create(int dev, uint64_t size, struct kern_dev_pool *p)
{
    FDP_LOCKED(int, fake_dev_ops.pool_create(dev, size, p));
}

static int fdp_pool_import(struct kern_dev_pool *p)
{
    FDP_LOCKED(int, fake_dev_ops.pool_import(p));
}

static void fdp_pool_destroy(struct kern_dev_pool *p)
{
    FDP_LOCKED_VOID(fake_dev_ops.pool_destroy(p));
}

static int fdp_copy_async(void *dst, const void *src, uint64_t len, int kind, void *stream)
{
    FDP_LOCKED(int, fake_dev_ops.copy_async(dst, src, len, kind, stream));
}

static int fdp_stream_new(int dev, void **stream)
{
    FDP_LOCKED(int, fake_dev_ops.stream_new(dev, stream));
}

static void fdp_stream_free_op(void *stream)
{
    FDP_LOCKED_VOID(fake_dev_ops.stream_free(stream));
}

static int fdp_device_get(int *dev)
{
    FDP_LOCKED(int, fake_dev_ops.device_get(dev));
}

static int fdp_event_record_op(void *event, void *stream)
{
    FDP_LOCKED(int, fake_dev_ops.event_record(event, stream));
}

static int fdp_event_new_record(void **ev, void *stream)
{
    FDP_LOCKED(int, fake_dev_ops.event_new_record(ev, stream));
}

static int fdp_event_wait_op(void *ev)
{
    pthread_mutex_lock(&fdp_mu);
    uint64_t before = fake_dev.blocking_waits;
    int rc = fake_dev_ops.event_wait(ev);
    fdp_thread_blocking += (long long)(fake_dev.blocking_waits - before);
    pthread_mutex_unlock(&fdp_mu);
    fdp_thread_waits++;
    return rc;
}

static int fdp_event_wait_free(void *ev)
{
    pthread_mutex_lock(&fdp_mu);
    uint64_t before = fake_dev.blocking_waits;
    int rc = fake_dev_ops.event_wait_free(ev);
    fdp_thread_blocking += (long long)(fake_dev.blocking_waits - before);
    pthread_mutex_unlock(&fdp_mu);
    fdp_thread_waits++;
    return rc;
}

static int fdp_stream_sync_op(void *stream)
{
    pthread_mutex_lock(&fdp_mu);
    uint64_t before = fake_dev.blocking_waits;
    int rc = fake_dev_ops.stream_sync(stream);
    fdp_thread_blocking += (long long)(fake_dev.blocking_waits - before);
    pthread_mutex_unlock(&fdp_mu);
    fdp_thread_waits++;
    return rc;
}

static int fdp_host_register(void *p, uint64_t len, int readonly)
{
    FDP_LOCKED(int, fake_dev_ops.host_register(p, len, readonly));
}

static int fdp_host_unregister(void *p)
{
    FDP_LOCKED(int, fake_dev_ops.host_unregister(p));
}

static int fdp_pointer_device(const void *p)
{
    FDP_LOCKED(int, fake_dev_ops.pointer_device(p));
}

static int fdp_mem_alloc(void **p, uint64_t len)
{
    FDP_LOCKED(int, fake_dev_ops.mem_alloc(p, len));
}

static void fdp_mem_free(void *p)
{
    fdp_thread_waits++; /* cudaFree waits for the whole device */
    FDP_LOCKED_VOID(fake_dev_ops.mem_free(p));
}

static int fdp_batch(const struct kern_batch_args *a, void *stream)
{
    FDP_LOCKED(int, fake_dev_ops.batch(a, stream));
}

static int fdp_copy_batch(void *const *dst, const void *const *src, const uint64_t *len, uint32_t n,
                          int kind, void *stream)
{
    FDP_LOCKED(int, fake_dev_ops.copy_batch(dst, src, len, n, kind, stream));
}

static int fdp_event_new(int dev, void **ev)
{
    FDP_LOCKED(int, fake_dev_ops.event_new(dev, ev));
}

static int fdp_event_query_op(void *ev)
{
    FDP_LOCKED(int, fake_dev_ops.event_query(ev));
}

static void fdp_event_free_op(void *ev)
{
    FDP_LOCKED_VOID(fake_dev_ops.event_free(ev));
}

/* The fake's table, each call under fdp_mu. */
static const struct kern_dev_ops fdp_ops = {
    .name = "fake",
    .device_count = fdp_device_count,
    .device_uuid = fdp_device_uuid,
    .pool_create = fdp_pool_create,
    .pool_import = fdp_pool_import,
    .pool_destroy = fdp_pool_destroy,
    .copy_async = fdp_copy_async,
    .stream_new = fdp_stream_new,
    .stream_free = fdp_stream_free_op,
    .device_get = fdp_device_get,
    .event_record = fdp_event_record_op,
    .event_new_record = fdp_event_new_record,
    .event_wait = fdp_event_wait_op,
    .event_wait_free = fdp_event_wait_free,
    .stream_sync = fdp_stream_sync_op,
    .host_register = fdp_host_register,
    .host_unregister = fdp_host_unregister,
    .pointer_device = fdp_pointer_device,
    .mem_alloc = fdp_mem_alloc,
    .mem_free = fdp_mem_free,
    .batch = fdp_batch,
    .copy_batch = fdp_copy_batch,
    .event_new = fdp_event_new,
    .event_query = fdp_event_query_op,
    .event_free = fdp_event_free_op,
};

int fdp_install(void *set, int on)
{
    fdp_set_fn f = (fdp_set_fn)(uintptr_t)set;
    if (!f)
        return -1;
    if (on) {
        pthread_mutex_lock(&fdp_mu);
        fake_dev_reset(1);
        pthread_mutex_unlock(&fdp_mu);
    }
    f(on ? &fdp_ops : NULL);
    return 0;
}

void *fdp_alloc(uint64_t len)
{
    void *p = NULL;
    return fdp_mem_alloc(&p, len) == 0 ? p : NULL;
}

void fdp_free(void *p)
{
    fdp_mem_free(p);
}

void *fdp_stream(void)
{
    FDP_LOCKED(void *, fake_dev_stream(0));
}

void fdp_stream_free(void *s)
{
    FDP_LOCKED_VOID(fake_dev_stream_free(s));
}

int fdp_stream_sync(void *s)
{
    return fdp_stream_sync_op(s);
}

void *fdp_event(void)
{
    void *ev = NULL;
    return fdp_event_new(0, &ev) == 0 ? ev : NULL;
}

int fdp_event_query(void *ev)
{
    return fdp_event_query_op(ev);
}

int fdp_event_wait(void *ev)
{
    return fdp_event_wait_op(ev);
}

void fdp_event_free(void *ev)
{
    fdp_event_free_op(ev);
}

/* A counter of struct fake_dev_state by name; -1 for an unknown name. */
long long fdp_stat(const char *name)
{
    if (strcmp(name, "thread_waits") == 0)
        return fdp_thread_waits;
    if (strcmp(name, "thread_blocking_waits") == 0)
        return fdp_thread_blocking;
#define FDP_STAT(f)                                                                                \
    if (strcmp(name, #f) == 0)                                                                     \
        return (long long)fake_dev.f;
    FDP_STAT(pools_live)
    FDP_STAT(registered)
    FDP_STAT(events_live)
    FDP_STAT(streams_live)
    FDP_STAT(allocs)
    FDP_STAT(frees)
    FDP_STAT(device_syncs)
    FDP_STAT(legacy_syncs)
    FDP_STAT(waits)
    FDP_STAT(queries)
    FDP_STAT(events_created)
    FDP_STAT(ops)
    FDP_STAT(records)
    FDP_STAT(copy_batches)
    FDP_STAT(copies)
    FDP_STAT(packs)
    FDP_STAT(decodes)
    FDP_STAT(bad_packs)
    FDP_STAT(bytes)
    FDP_STAT(queued)
    FDP_STAT(bad_kinds)
    FDP_STAT(fork_refused)
    FDP_STAT(stream_waits)
    FDP_STAT(blocking_waits)
#undef FDP_STAT
    return -1;
}

/* Sets a switch of the fake (hold, fail_wait, sticky, fail_register); -1 unknown. */
int fdp_set(const char *name, int v)
{
    if (strcmp(name, "hold") == 0)
        fake_dev.hold = v;
    else if (strcmp(name, "fail_wait") == 0)
        fake_dev.fail_wait = v;
    else if (strcmp(name, "sticky") == 0)
        fake_dev.sticky = v;
    else if (strcmp(name, "fail_register") == 0)
        fake_dev.fail_register = v;
    else
        return -1;
    return 0;
}

int fdp_last_error(void)
{
    FDP_LOCKED(int, fake_dev_last_error());
}

int fdp_event_record(void *ev, void *stream)
{
    return fdp_event_record_op(ev, stream);
}

int fdp_stream_wait_event(void *stream, void *ev)
{
    FDP_LOCKED(int, fake_dev_stream_wait_event(stream, ev));
}

/* Queues a copy of the test's own (kern_dev_copy kind) on stream. */
int fdp_copy(void *dst, const void *src, uint64_t len, int kind, void *stream)
{
    return fdp_copy_async(dst, src, len, kind, stream);
}
