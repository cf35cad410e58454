/*
 * check_tier_gpu.c — the gpu tier: the conformance cases and its accounting over the fake
 * device table (host memory), its asynchronous copies (queued, completed by tier_gpu_poll
 * when the fake's device has done them, never waited for), then the real CUDA table where a
 * device is found.
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern_dev.h"
#include "tests/lib/daemon.h"
#include "tests/lib/fake_dev.h"
#include "tests/lib/tier_conformance.h"
#include "tiers/gpu.h"
#include "tiers/slab.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024)

static struct tier *gpu_new(const struct kern_dev_ops *ops, uint64_t size, uint64_t page)
{
    struct tier_gpu_config cfg = {
        .ops = ops, .device = 0, .arena_id = 9, .size = size, .page_size = page};
    int err = 1;
    struct tier *t = tier_gpu_new(&cfg, &err);
    ck_assert_msg(t != NULL, "tier_gpu_new: %s", strerror(-err));
    ck_assert_int_eq(err, 0);
    return t;
}

static struct tier *factory_fake(uint64_t capacity, void *arg)
{
    (void)arg;
    fake_dev_reset(1);
    return gpu_new(&fake_dev_ops, capacity, 64 * KiB);
}

static void destroy_fake(struct tier *t, void *arg)
{
    (void)arg;
    tier_destroy(t);
    ck_assert_int_eq(fake_dev.pools_live, 0);
}

/* The conformance cases' drain: the loop's polls until every copy has called back. */
static void drain_poll(struct tier *t, void *arg)
{
    (void)arg;
    while (tier_gpu_inflight(t))
        tier_gpu_poll(t);
}

static struct tier *factory_cuda(uint64_t capacity, void *arg)
{
    (void)arg;
    return gpu_new(kern_dev_cuda(), capacity, 2 * MiB);
}

START_TEST(test_bad_config)
{
    struct tier_gpu_config cfg = {
        .ops = &fake_dev_ops, .device = 0, .arena_id = 1, .size = 4 * MiB, .page_size = 64 * KiB};
    int err = 0;
    fake_dev_reset(1);
    struct tier_gpu_config c = cfg;
    c.size = 0;
    ck_assert_ptr_null(tier_gpu_new(&c, &err));
    ck_assert_int_eq(err, -EINVAL);
    c = cfg;
    c.page_size = 3 * 4096;
    ck_assert_ptr_null(tier_gpu_new(&c, &err));
    ck_assert_int_eq(err, -EINVAL);
    c = cfg;
    c.device = -1;
    ck_assert_ptr_null(tier_gpu_new(&c, &err));
    ck_assert_int_eq(err, -EINVAL);
    ck_assert_ptr_null(tier_gpu_new(NULL, &err));
    ck_assert_int_eq(err, -EINVAL);
    ck_assert_int_eq(fake_dev.pools_live, 0);
}
END_TEST

/* No ops table (a build without CUDA), no device, or a device index past the last: the
 * tier is not created and says -ENODEV, which the daemon turns into "gpu tier disabled". */
START_TEST(test_no_device)
{
    struct tier_gpu_config cfg = {
        .ops = NULL, .device = 0, .arena_id = 1, .size = 4 * MiB, .page_size = 64 * KiB};
    int err = 0;
    ck_assert_ptr_null(tier_gpu_new(&cfg, &err));
    ck_assert_int_eq(err, -ENODEV);
    fake_dev_reset(0);
    cfg.ops = &fake_dev_ops;
    ck_assert_ptr_null(tier_gpu_new(&cfg, &err));
    ck_assert_int_eq(err, -ENODEV);
    fake_dev_reset(2);
    cfg.device = 2;
    ck_assert_ptr_null(tier_gpu_new(&cfg, &err));
    ck_assert_int_eq(err, -ENODEV);
    fake_dev.fail_create = ENOMEM;
    cfg.device = 1;
    ck_assert_ptr_null(tier_gpu_new(&cfg, &err));
    ck_assert_int_eq(err, -ENOMEM);
    ck_assert_int_eq(fake_dev.pools_live, 0);
}
END_TEST

START_TEST(test_accounting)
{
    fake_dev_reset(1);
    struct tier *t = gpu_new(&fake_dev_ops, 1 * MiB + 1, 64 * KiB);
    ck_assert(tier_is_gpu(t));
    ck_assert_str_eq(t->ops->name, "gpu");
    /* rounded up to whole pages */
    ck_assert_uint_eq(t->ops->capacity(t), 1 * MiB + 64 * KiB);
    ck_assert_uint_eq(t->ops->usage(t), 0);
    const struct kern_dev_pool *p = tier_gpu_pool(t);
    ck_assert_uint_eq(p->handle, KERN_DEV_HANDLE_FD);
    ck_assert_int_ge(p->fd, 0);
    ck_assert_uint_ge(p->size, t->ops->capacity(t));
    ck_assert_uint_eq(tier_gpu_arena_id(t), 9);

    struct tier_loc locs[32];
    int n = 0;
    while (n < 32 && t->ops->alloc(t, 100 * KiB, &locs[n]) == 0) {
        ck_assert_uint_eq(locs[n].arena, 9);
        ck_assert_uint_eq(locs[n].off % 4096, 0);
        ck_assert_uint_le(locs[n].off + locs[n].len, t->ops->capacity(t));
        n++;
    }
    ck_assert_int_gt(n, 4);
    uint64_t used = 0;
    for (int i = 0; i < n; i++)
        used += locs[i].len;
    ck_assert_uint_eq(t->ops->usage(t), used);
    /* The bytes land at pool base + offset: what a client adds to its own mapping. */
    char buf[64] = "kvcd gpu block";
    ck_assert_int_eq(t->ops->write(t, &locs[1], 8, buf, sizeof(buf), NULL, NULL), 0);
    ck_assert_mem_eq((char *)p->base + locs[1].off + 8, buf, sizeof(buf));
    ck_assert_uint_eq(fake_dev.copies, 1);
    /* Another tier's location is refused before any device call. */
    struct tier_loc other = locs[1];
    other.arena = 3;
    ck_assert_int_eq(t->ops->read(t, &other, 0, buf, 8, NULL, NULL), -EINVAL);
    t->ops->free(t, &other);
    ck_assert_uint_eq(t->ops->usage(t), used);
    ck_assert_uint_eq(fake_dev.copies, 1);
    for (int i = 0; i < n; i++)
        t->ops->free(t, &locs[i]);
    ck_assert_uint_eq(t->ops->usage(t), 0);
    ck_assert_int_ge(tier_gpu_class(t, 100 * KiB), 0);
    struct slab_stats st;
    slab_stats_get(tier_gpu_slab(t), &st);
    ck_assert_uint_eq(st.pages_free, st.pages);
    tier_destroy(t);
    ck_assert_int_eq(fake_dev.pools_live, 0);
}
END_TEST

struct done_rec {
    int calls;
    int status;
    int order; /* completion number */
};

static int done_seq;

static void done_cb(void *arg, int status)
{
    struct done_rec *d = arg;
    d->calls++;
    d->status = status;
    d->order = ++done_seq;
}

/* Whether the tier's descriptor becomes readable within ms. */
static int fd_ready(struct tier *t, int ms)
{
    struct pollfd p = {.fd = tier_gpu_fd(t), .events = POLLIN};
    return poll(&p, 1, ms) == 1;
}

/* A write with a callback is only queued: the pool keeps its old bytes and nothing waits;
 * while the device is busy (hold) polls complete nothing; once it is done the descriptor
 * turns readable and the poll runs the callback once, the bytes in place. A read back the
 * same way. No host wait anywhere. */
START_TEST(test_async_write_read)
{
    fake_dev_reset(1);
    struct tier *t = gpu_new(&fake_dev_ops, 1 * MiB, 64 * KiB);
    const struct kern_dev_pool *p = tier_gpu_pool(t);
    struct tier_loc loc;
    char src[4096], back[4096];
    struct done_rec w = {0}, r = {0};
    ck_assert_int_eq(t->ops->alloc(t, sizeof(src), &loc), 0);
    memset((char *)p->base + loc.off, 0xee, sizeof(src));
    memset(src, 0x5a, sizeof(src));
    uint64_t waits = fake_dev.waits;
    fake_dev.hold = 1;
    ck_assert_int_eq(t->ops->write(t, &loc, 0, src, sizeof(src), done_cb, &w), 0);
    ck_assert_int_eq(w.calls, 0);
    ck_assert_uint_eq(tier_gpu_inflight(t), 1);
    ck_assert_uint_eq(fake_dev.queued, 1);
    ck_assert_uint_eq((uint8_t)((char *)p->base)[loc.off], 0xee); /* not landed */
    ck_assert(fd_ready(t, 1000)); /* the timer for the first check */
    ck_assert_uint_eq(tier_gpu_poll(t), 0);
    ck_assert_int_eq(w.calls, 0);
    ck_assert_uint_gt(fake_dev.queries, 0);
    fake_dev.hold = 0;
    ck_assert(fd_ready(t, 1000)); /* checked again later */
    ck_assert_uint_eq(tier_gpu_poll(t), 1);
    ck_assert_int_eq(w.calls, 1);
    ck_assert_int_eq(w.status, 0);
    ck_assert_mem_eq((char *)p->base + loc.off, src, sizeof(src));
    ck_assert_uint_eq(tier_gpu_inflight(t), 0);
    ck_assert(!fd_ready(t, 20)); /* nothing in flight: the timer is off */

    memset(back, 0, sizeof(back));
    ck_assert_int_eq(t->ops->read(t, &loc, 0, back, sizeof(back), done_cb, &r), 0);
    ck_assert_int_eq(r.calls, 0);
    ck_assert_uint_eq((uint8_t)back[0], 0); /* the destination is written when it runs */
    ck_assert(fd_ready(t, 1000));
    ck_assert_uint_eq(tier_gpu_poll(t), 1);
    ck_assert_int_eq(r.calls, 1);
    ck_assert_int_eq(r.status, 0);
    ck_assert_mem_eq(back, src, sizeof(back));
    ck_assert_uint_eq(fake_dev.waits, waits);
    struct tier_gpu_stats st;
    tier_gpu_stats_get(t, &st);
    ck_assert_uint_eq(st.copies, 2);
    ck_assert_uint_eq(st.waits, 0);
    ck_assert_int_eq(fake_dev_last_error(), 0);
    t->ops->free(t, &loc);
    tier_destroy(t);
    ck_assert_int_eq(fake_dev.events_live, 0);
    ck_assert_int_eq(fake_dev.streams_live, 0);
}
END_TEST

/* Copies complete in the order they were queued, at most TIER_GPU_MAX_INFLIGHT at once; a
 * copy the device fails calls back with -EIO and leaves its destination as it was. */
START_TEST(test_async_order_bound_failure)
{
    fake_dev_reset(1);
    struct tier *t = gpu_new(&fake_dev_ops, 1 * MiB, 64 * KiB);
    const struct kern_dev_pool *p = tier_gpu_pool(t);
    struct tier_loc loc;
    static struct done_rec d[TIER_GPU_MAX_INFLIGHT + 1];
    static char src[TIER_GPU_MAX_INFLIGHT + 1][64];
    memset(d, 0, sizeof(d));
    done_seq = 0;
    ck_assert_int_eq(t->ops->alloc(t, 64 * KiB, &loc), 0);
    memset((char *)p->base + loc.off, 0, 64 * KiB);
    fake_dev.hold = 1;
    for (int i = 0; i < TIER_GPU_MAX_INFLIGHT; i++) {
        memset(src[i], i + 1, sizeof(src[i]));
        ck_assert_int_eq(t->ops->write(t, &loc, (uint64_t)i * 64, src[i], 64, done_cb, &d[i]),
                         0);
    }
    ck_assert_int_eq(t->ops->write(t, &loc, 0, src[0], 64, done_cb, &d[TIER_GPU_MAX_INFLIGHT]),
                     -EAGAIN);
    ck_assert_uint_eq(tier_gpu_inflight(t), TIER_GPU_MAX_INFLIGHT);
    fake_dev.hold = 0;
    fake_dev.fail_wait = EIO; /* the first copy the device reports on fails */
    ck_assert_uint_eq(tier_gpu_poll(t), TIER_GPU_MAX_INFLIGHT);
    for (int i = 0; i < TIER_GPU_MAX_INFLIGHT; i++) {
        ck_assert_int_eq(d[i].calls, 1);
        ck_assert_int_eq(d[i].order, i + 1);
        ck_assert_int_eq(d[i].status, i == 0 ? -EIO : 0);
        ck_assert_uint_eq((uint8_t)((char *)p->base)[loc.off + (uint64_t)i * 64],
                          i == 0 ? 0 : i + 1);
    }
    ck_assert_int_eq(d[TIER_GPU_MAX_INFLIGHT].calls, 0);
    struct tier_gpu_stats st;
    tier_gpu_stats_get(t, &st);
    ck_assert_uint_eq(st.failed, 1);
    ck_assert_uint_eq(st.waits, 0);
    (void)fake_dev_last_error();
    t->ops->free(t, &loc);
    tier_destroy(t);
    ck_assert_int_eq(fake_dev.events_live, 0);
}
END_TEST

/* tier_gpu_drain waits (one wait) for what is in flight however busy the device says it is
 * and runs every callback; destroying a tier with copies in flight waits for them and runs
 * none. */
START_TEST(test_drain_and_destroy_in_flight)
{
    fake_dev_reset(1);
    struct tier *t = gpu_new(&fake_dev_ops, 1 * MiB, 64 * KiB);
    const struct kern_dev_pool *p = tier_gpu_pool(t);
    struct tier_loc loc;
    char src[256];
    struct done_rec a = {0}, b = {0};
    memset(src, 7, sizeof(src));
    ck_assert_int_eq(t->ops->alloc(t, 4096, &loc), 0);
    fake_dev.hold = 1;
    ck_assert_int_eq(t->ops->write(t, &loc, 0, src, sizeof(src), done_cb, &a), 0);
    ck_assert_int_eq(t->ops->write(t, &loc, 256, src, sizeof(src), done_cb, &b), 0);
    uint64_t waits = fake_dev.waits;
    ck_assert_uint_eq(tier_gpu_drain(t), 2);
    ck_assert_uint_eq(fake_dev.waits - waits, 1);
    ck_assert_int_eq(a.calls + b.calls, 2);
    ck_assert_int_eq(a.status | b.status, 0);
    ck_assert_mem_eq((char *)p->base + loc.off + 256, src, sizeof(src));
    ck_assert_int_eq(t->ops->write(t, &loc, 512, src, sizeof(src), done_cb, &a), 0);
    tier_destroy(t);
    ck_assert_int_eq(a.calls, 1); /* not called again */
    ck_assert_uint_eq(fake_dev.queued, 0);
    ck_assert_int_eq(fake_dev.events_live, 0);
    ck_assert_int_eq(fake_dev.pools_live, 0);
}
END_TEST

/* Host memory registered through the tier stays registered until the tier goes; a device
 * that refuses leaves it pageable, and copies from it still land (staged when queued). */
START_TEST(test_host_register)
{
    fake_dev_reset(1);
    struct tier *t = gpu_new(&fake_dev_ops, 1 * MiB, 64 * KiB);
    const struct kern_dev_pool *p = tier_gpu_pool(t);
    char *a = calloc(1, 64 * KiB), *b = calloc(1, 64 * KiB);
    struct tier_loc loc;
    struct done_rec d = {0};
    struct tier_gpu_stats st;
    ck_assert_int_eq(tier_gpu_host_register(t, a, 64 * KiB), 0);
    ck_assert_int_eq(fake_dev.registered, 1);
    fake_dev.fail_register = ENOMEM;
    ck_assert_int_eq(tier_gpu_host_register(t, b, 64 * KiB), -ENOMEM);
    ck_assert_int_eq(fake_dev.registered, 1);
    tier_gpu_stats_get(t, &st);
    ck_assert_uint_eq(st.registered, 1);
    /* From registered memory the copy reads its source when it runs: what is there then. */
    ck_assert_int_eq(t->ops->alloc(t, 4096, &loc), 0);
    memset(a, 1, 4096);
    ck_assert_int_eq(t->ops->write(t, &loc, 0, a, 4096, done_cb, &d), 0);
    memset(a, 2, 4096);
    drain_poll(t, NULL);
    ck_assert_uint_eq((uint8_t)((char *)p->base)[loc.off], 2);
    /* From pageable memory it was staged when queued. */
    memset(b, 3, 4096);
    ck_assert_int_eq(t->ops->write(t, &loc, 0, b, 4096, done_cb, &d), 0);
    memset(b, 4, 4096);
    drain_poll(t, NULL);
    ck_assert_uint_eq((uint8_t)((char *)p->base)[loc.off], 3);
    ck_assert_int_eq(d.calls, 2);
    tier_destroy(t);
    ck_assert_int_eq(fake_dev.registered, 0);
    free(a);
    free(b);
}
END_TEST

static Suite *tier_gpu_suite(void)
{
    Suite *s = suite_create("tier_gpu");
    static const struct tier_conformance fake = {
        .name = "gpu-fake-device",
        .capacity = 8 * MiB,
        .block = 256 * KiB,
        .whole_slot = true,
        .create = factory_fake,
        .destroy = destroy_fake,
        .drain = drain_poll,
    };
    static const struct tier_conformance cuda = {
        .name = "gpu-cuda",
        .capacity = 32 * MiB,
        .block = 3 * MiB,
        .whole_slot = true,
        .create = factory_cuda,
        .drain = drain_poll,
    };
    suite_add_tcase(s, tier_conformance_tcase(&fake));
    TCase *tc = tcase_create("gpu");
    tcase_add_test(tc, test_bad_config);
    tcase_add_test(tc, test_no_device);
    tcase_add_test(tc, test_accounting);
    tcase_add_test(tc, test_async_write_read);
    tcase_add_test(tc, test_async_order_bound_failure);
    tcase_add_test(tc, test_drain_and_destroy_in_flight);
    tcase_add_test(tc, test_host_register);
    suite_add_tcase(s, tc);
    /* the device is counted in a child: CUDA starts in the cases only */
    const struct kern_dev_ops *ops = kern_dev_cuda();
    int devices = ops ? daemon_cuda_devices() : 0;
    if (devices > 0)
        suite_add_tcase(s, tier_conformance_tcase(&cuda));
    else
        printf("SKIP: tier_gpu: conformance:gpu-cuda: %s\n",
               !ops ? "built without CUDA" : devices < 0 ? "the CUDA probe died"
                                                         : "no CUDA device found");
    return s;
}

int main(void)
{
    return daemon_suite_run(tier_gpu_suite());
}
