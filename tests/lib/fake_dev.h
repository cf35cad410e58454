/*
 * fake_dev.h — a kern_dev_ops table over host memory, for the unit tests of code above the
 * device calls (the gpu tier's accounting, libkvc's GPU checks) on machines without a GPU.
 *
 * DESIGN
 * "Device memory" is malloc'd; copies are memcpy and complete at once; events are counted.
 * The counters let a test check that every pool, registration and event it caused was
 * given back. Not thread-safe: one test at a time.
 */
#ifndef KVC_TESTS_FAKE_DEV_H
#define KVC_TESTS_FAKE_DEV_H

#include <stdint.h>

#include "kernels/kern_dev.h"

struct fake_dev_state {
    int devices;        /* device_count() answers this */
    int fail_create;    /* pool_create answers this errno when non-zero */
    int pools_live;     /* created or imported, not destroyed */
    int registered;     /* host_register minus host_unregister */
    int events_live;    /* event_new_record minus event_wait_free */
    uint64_t copies;    /* copy and copy_async calls */
    uint64_t bytes;     /* bytes they moved */
};

extern struct fake_dev_state fake_dev;
extern const struct kern_dev_ops fake_dev_ops;

/* Resets the counters; `devices` fake devices. */
void fake_dev_reset(int devices);

#endif
