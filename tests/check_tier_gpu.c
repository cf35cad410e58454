/*
 * check_tier_gpu.c — the gpu tier: the conformance cases and its accounting over the fake
 * device table (host memory), then the real CUDA table where a device is found.
 */
#include <check.h>
#include <errno.h>
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
    };
    static const struct tier_conformance cuda = {
        .name = "gpu-cuda",
        .capacity = 32 * MiB,
        .block = 3 * MiB,
        .whole_slot = true,
        .create = factory_cuda,
    };
    suite_add_tcase(s, tier_conformance_tcase(&fake));
    TCase *tc = tcase_create("gpu");
    tcase_add_test(tc, test_bad_config);
    tcase_add_test(tc, test_no_device);
    tcase_add_test(tc, test_accounting);
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
    SRunner *sr = srunner_create(tier_gpu_suite());
    fflush(stdout);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
