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
 * (before that the strict fake has not performed them). One thread drives the fake.
 */
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

int fdp_install(void *set, int on)
{
    fdp_set_fn f = (fdp_set_fn)(uintptr_t)set;
    if (!f)
        return -1;
    if (on)
        fake_dev_reset(1);
    f(on ? &fake_dev_ops : NULL);
    return 0;
}

void *fdp_alloc(uint64_t len)
{
    void *p = NULL;
    return fake_dev_ops.mem_alloc(&p, len) == 0 ? p : NULL;
}

void fdp_free(void *p)
{
    fake_dev_ops.mem_free(p);
}

void *fdp_stream(void)
{
    return fake_dev_stream(0);
}

void fdp_stream_free(void *s)
{
    fake_dev_stream_free(s);
}

int fdp_stream_sync(void *s)
{
    return fake_dev_ops.stream_sync(s);
}

void *fdp_event(void)
{
    void *ev = NULL;
    return fake_dev_ops.event_new(0, &ev) == 0 ? ev : NULL;
}

int fdp_event_query(void *ev)
{
    return fake_dev_ops.event_query(ev);
}

int fdp_event_wait(void *ev)
{
    return fake_dev_ops.event_wait(ev);
}

void fdp_event_free(void *ev)
{
    fake_dev_ops.event_free(ev);
}

/* A counter of struct fake_dev_state by name; -1 for an unknown name. */
long long fdp_stat(const char *name)
{
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
    return fake_dev_last_error();
}
