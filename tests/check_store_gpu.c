/*
 * check_store_gpu.c — the store with a GPU tier over the fake device (host memory): where
 * puts land, promotion and demotion with the watermarks, what a client that cannot read
 * the pool gets, and that a client's exit leaks nothing. The real device runs the same
 * store code; only the copies differ.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine.h"
#include "daemon/store.h"
#include "tests/lib/fake_dev.h"
#include "tiers/gpu.h"
#include "tiers/host.h"

#define BLOCK (64u << 10)

static struct store *s;
static uint32_t ns;

static struct store *store_with_gpu(int devices, uint64_t gpu_size)
{
    struct store_params p = {.host_size = 4 << 20,
                             .host_page_size = 64 << 10,
                             .host_huge = TIER_HOST_HUGE_OFF,
                             .high_watermark = 0.75,
                             .low_watermark = 0.5,
                             .max_namespaces = 8,
                             .max_handles = 64,
                             .policy = POLICY_LRU,
                             .gpu_size = gpu_size,
                             .gpu_device = 0,
                             .gpu_page_size = 64 << 10,
                             .gpu_ops = &fake_dev_ops};
    struct kvc_wire_layout l;
    bool created;
    int err = 0;
    fake_dev_reset(devices);
    struct store *st = store_new(&p, &err);
    if (st)
        engine_attach(st);
    ck_assert_msg(st, "store_new: %d", err);
    memset(&l, 0, sizeof(l));
    snprintf(l.model_id, sizeof(l.model_id), "m");
    l.layers = 2; /* 2 * 16 tokens * 4 heads * 128 * fp16 = 32 KiB per layer */
    l.kv_heads = 4;
    l.head_dim = 128;
    l.block_tokens = 16;
    l.dtype = KVC_WIRE_DTYPE_FP16;
    l.kv_kind = KVC_WIRE_KV_KIND_KV;
    ck_assert_int_eq(store_ns_open(st, &l, &ns, &created), 0);
    ck_assert_uint_eq(store_ns_get(st, ns)->block_bytes, BLOCK);
    return st;
}

static void setup(void)
{
    s = store_with_gpu(1, 8 * BLOCK);
    ck_assert_ptr_nonnull(s->gpu);
}

static void teardown(void)
{
    if (s)
        engine_stop(s);
    store_free(s);
    s = NULL;
    ck_assert_int_eq(fake_dev.pools_live, 0);
}

static struct kvc_wire_key key(uint32_t i)
{
    return (struct kvc_wire_key){.lo = i + 1, .hi = 0x6770u};
}

static uint8_t *loc_ptr(const struct kvc_wire_loc *l)
{
    if (l->tier == KVC_WIRE_TIER_GPU) {
        ck_assert_uint_eq(l->arena_id, STORE_ARENA_GPU);
        return (uint8_t *)tier_gpu_pool(s->gpu)->base + l->offset;
    }
    ck_assert_uint_eq(l->tier, KVC_WIRE_TIER_HOST);
    return (uint8_t *)tier_host_base(s->arenas[l->arena_id].tier) + l->offset;
}

/* Puts n blocks of a chain, each filled with its index, as owner o; returns how many
 * slots landed in the pool. */
static uint32_t put_chain(struct store_owner *o, uint32_t n)
{
    struct kvc_wire_key keys[32] = {{0}}, root = {0};
    struct kvc_wire_loc locs[32];
    uint8_t st[32];
    uint64_t resv;
    uint32_t dropped, on_gpu = 0;
    for (uint32_t i = 0; i < n; i++)
        keys[i] = key(i);
    ck_assert_int_eq(store_reserve(s, o, ns, &root, keys, n, 1, &resv, st, locs), (int)n);
    for (uint32_t i = 0; i < n; i++) {
        ck_assert_int_eq(st[i], KVC_WIRE_SLOT_RESERVED);
        memset(loc_ptr(&locs[i]), (int)(i + 1), BLOCK);
        on_gpu += locs[i].tier == KVC_WIRE_TIER_GPU;
    }
    ck_assert_int_eq(store_commit(s, o, resv, UINT32_MAX, 2, &dropped), (int)n);
    return on_gpu;
}

static void check_bytes(const struct kvc_wire_loc *locs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *p = loc_ptr(&locs[i]);
        for (uint32_t j = 0; j < BLOCK; j += 4093)
            ck_assert_uint_eq(p[j], i + 1);
    }
}

START_TEST(test_no_device)
{
    struct store *st = store_with_gpu(0, 8 * BLOCK);
    ck_assert_ptr_null(st->gpu);
    ck_assert_uint_eq(st->narenas, 1);
    ck_assert_uint_eq(store_gpu_capacity(st), 0);
    if (st)
        engine_stop(st);
    store_free(st);
    st = store_with_gpu(1, 0); /* not configured */
    ck_assert_ptr_null(st->gpu);
    ck_assert_int_eq(fake_dev.pools_live, 0);
    if (st)
        engine_stop(st);
    store_free(st);
}
END_TEST

/* Puts from a client that mapped the pool go to the pool up to the high watermark, then to
 * the host arena; a client that cannot read the pool gets every block from the host arena,
 * moved there on its lookup, with the same bytes. */
START_TEST(test_put_gpu_load_host)
{
    struct store_owner g, h;
    struct kvc_wire_key keys[8];
    struct kvc_wire_loc locs[8];
    uint64_t lease;
    store_owner_init(&g);
    store_owner_init(&h);
    g.gpu = true;
    ck_assert_uint_eq(put_chain(&g, 8), 6); /* 0.75 of 8 slots */
    ck_assert_uint_eq(store_gpu_used(s), 6 * BLOCK);
    for (uint32_t i = 0; i < 8; i++)
        keys[i] = key(i);
    ck_assert_int_eq(engine_lookup(s, &h, ns, keys, 8, 3, &lease, locs), 8);
    for (uint32_t i = 0; i < 8; i++)
        ck_assert_uint_eq(locs[i].tier, KVC_WIRE_TIER_HOST);
    check_bytes(locs, 8);
    ck_assert_uint_eq(store_gpu_used(s), 0);
    ck_assert_uint_eq(s->total.gpu_demoted_blocks, 6);
    ck_assert_int_eq(store_release(s, &h, lease), 0);
    store_owner_fini(s, &g);
    store_owner_fini(s, &h);
    ck_assert_uint_eq(s->pins_now, 0);
}
END_TEST

/* A client that mapped the pool gets host blocks promoted while the pool has room. */
START_TEST(test_promote_on_gpu_lookup)
{
    struct store_owner g, h;
    struct kvc_wire_key keys[8];
    struct kvc_wire_loc locs[8];
    uint64_t lease;
    store_owner_init(&g);
    store_owner_init(&h);
    ck_assert_uint_eq(put_chain(&h, 8), 0);
    for (uint32_t i = 0; i < 8; i++)
        keys[i] = key(i);
    g.gpu = true;
    ck_assert_int_eq(engine_lookup(s, &g, ns, keys, 8, 3, &lease, locs), 8);
    uint32_t on_gpu = 0;
    for (uint32_t i = 0; i < 8; i++)
        on_gpu += locs[i].tier == KVC_WIRE_TIER_GPU;
    ck_assert_uint_eq(on_gpu, 6);
    ck_assert_uint_eq(s->total.gpu_promoted_blocks, 6);
    check_bytes(locs, 8);
    /* While g holds them, a host-only client cannot have the pinned pool blocks moved:
     * its hit run ends at the first one. */
    uint64_t lease2;
    struct kvc_wire_loc locs2[8];
    ck_assert_int_eq(engine_lookup(s, &h, ns, keys, 8, 4, &lease2, locs2), 0);
    ck_assert_uint_eq(store_gpu_used(s), 6 * BLOCK);
    store_owner_fini(s, &g); /* the client dies holding its pins */
    ck_assert_uint_eq(s->pins_now, 0);
    ck_assert_int_eq(engine_lookup(s, &h, ns, keys, 8, 5, &lease2, locs2), 8);
    check_bytes(locs2, 8);
    store_owner_fini(s, &h);
    ck_assert_uint_eq(s->pins_now, 0);
}
END_TEST

/* Above the high watermark the pool demotes its coldest blocks to the host arena, down to
 * the low one; nothing is lost. */
START_TEST(test_trim_demotes)
{
    struct store_owner g;
    store_owner_init(&g);
    g.gpu = true;
    ck_assert_uint_eq(put_chain(&g, 6), 6);
    struct store_params p = s->p;
    p.high_watermark = 0.6;
    p.low_watermark = 0.25;
    store_reload(s, &p);
    ck_assert_int_eq(engine_trim(s, 10), 4);
    ck_assert_uint_eq(store_gpu_used(s), 2 * BLOCK);
    ck_assert_uint_eq(s->total.gpu_demoted_blocks, 4);
    ck_assert_uint_eq(s->total.evicted_blocks, 0);
    ck_assert_uint_eq(store_ns_get(s, ns)->blocks, 6);
    struct kvc_wire_key keys[6];
    struct kvc_wire_loc locs[6];
    uint64_t lease;
    for (uint32_t i = 0; i < 6; i++)
        keys[i] = key(i);
    ck_assert_int_eq(engine_lookup(s, &g, ns, keys, 6, 11, &lease, locs), 6);
    check_bytes(locs, 6);
    store_owner_fini(s, &g);
}
END_TEST

/* A client that dies mid-put into the pool leaks no slot. */
START_TEST(test_abort_frees_pool)
{
    struct store_owner g;
    struct kvc_wire_key keys[4], root = {0};
    struct kvc_wire_loc locs[4];
    uint8_t st[4];
    uint64_t resv;
    store_owner_init(&g);
    g.gpu = true;
    for (uint32_t i = 0; i < 4; i++)
        keys[i] = key(i);
    ck_assert_int_eq(store_reserve(s, &g, ns, &root, keys, 4, 1, &resv, st, locs), 4);
    ck_assert_uint_eq(store_gpu_used(s), 4 * BLOCK);
    store_owner_fini(s, &g);
    ck_assert_uint_eq(store_gpu_used(s), 0);
    ck_assert_uint_eq(s->reserved_now, 0);
}
END_TEST

static Suite *store_gpu_suite(void)
{
    Suite *su = suite_create("store_gpu");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_no_device);
    suite_add_tcase(su, tc);
    tc = tcase_create("fake-device");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_put_gpu_load_host);
    tcase_add_test(tc, test_promote_on_gpu_lookup);
    tcase_add_test(tc, test_trim_demotes);
    tcase_add_test(tc, test_abort_frees_pool);
    suite_add_tcase(su, tc);
    return su;
}

int main(void)
{
    SRunner *sr = srunner_create(store_gpu_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
