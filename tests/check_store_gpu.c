/*
 * check_store_gpu.c — the store with a GPU tier over the fake device (host memory): where
 * puts land, promotion and demotion with the watermarks, what a client that cannot read
 * the pool gets, and that a client's exit leaks nothing. The real device runs the same
 * store code; only the copies differ.
 * Moves are asynchronous: the fake performs a copy only when the engine's poll asks its
 * event (or a wait covers it), and `hold` keeps the device busy, so a hit handed out before
 * its copy landed reads stale bytes here. Every move is checked to cost the calling thread
 * (the daemon's loop) no wait at all.
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/engine.h"
#include "daemon/engine_disk.h"
#include "daemon/engine_gpu.h"
#include "daemon/gpu_reg.h"
#include "daemon/store.h"
#include "tests/lib/daemon.h"
#include "tests/lib/fake_dev.h"
#include "tests/lib/store_fixture.h"
#include "tiers/gpu.h"
#include "tiers/host.h"

#define BLOCK (64u << 10)

static struct store *s;
static uint32_t ns;

static struct store *store_with_gpu_reg(int devices, uint64_t gpu_size, int fail_register)
{
    struct store_params p = store_fixture_params();
    struct store *st;
    p.high_watermark = 0.75;
    p.gpu_size = gpu_size;
    p.gpu_device = 0;
    p.gpu_page_size = 64 << 10;
    p.gpu_ops = &fake_dev_ops;
    fake_dev_reset(devices);
    fake_dev.fail_register = fail_register;
    st = store_fixture_new(&p, NULL);
    /* 2 layers * 16 tokens * 4 heads * 128 * fp16 * K and V: 64 KiB */
    ns = store_fixture_ns(st, "m", 2, 0);
    ck_assert_uint_eq(store_ns_get(st, ns)->block_bytes, BLOCK);
    return st;
}

static struct store *store_with_gpu(int devices, uint64_t gpu_size)
{
    return store_with_gpu_reg(devices, gpu_size, 0);
}

static void setup(void)
{
    s = store_with_gpu(1, 8 * BLOCK);
    ck_assert_ptr_nonnull(s->gpu);
}

static void teardown(void)
{
    store_fixture_free(s, NULL);
    s = NULL;
    ck_assert_int_eq(fake_dev.pools_live, 0);
    ck_assert_int_eq(fake_dev.registered, 0);
    ck_assert_int_eq(fake_dev.events_live, 0);
    ck_assert_uint_eq(fake_dev.queued, 0);
    ck_assert_uint_eq(fake_dev.bad_kinds, 0);
}

struct gpu_stat_q {
    const char *name;
    uint64_t v;
};

static void gpu_stat_cb(void *arg, const char *name, uint64_t v)
{
    struct gpu_stat_q *q = arg;
    if (strcmp(name, q->name) == 0)
        q->v = v;
}

static uint64_t gpu_stat(const char *name)
{
    struct gpu_stat_q q = {name, UINT64_MAX};
    engine_gpu_stats(s, gpu_stat_cb, &q);
    ck_assert_msg(q.v != UINT64_MAX, "no stat %s", name);
    return q.v;
}

/* The loop's polls until no copy is in flight (the fake's device is done when asked). */
static void moves_land(void)
{
    for (int i = 0; i < 1000 && tier_gpu_inflight(s->gpu); i++)
        engine_gpu_poll(s, 50);
    ck_assert_uint_eq(tier_gpu_inflight(s->gpu), 0);
    engine_gpu_poll(s, 50);
}

/* Hits of a lease: how many are ready from the first, and how many are still copying. */
static void lease_state(struct store_owner *o, uint64_t lease, uint32_t *nready, uint32_t *pending)
{
    uint32_t nhit;
    ck_assert_int_eq(engine_disk_lease_state(s, o, lease, &nhit, nready, pending), 0);
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

/* The 4 blocks put_chain put, looked up by h, a client that cannot read the pool: moved back
 * to the host arena and byte-exact there once the moves landed (the lease goes with h). */
static void lookup_moved_back(struct store_owner *h)
{
    struct kvc_wire_key keys[4];
    struct kvc_wire_loc locs[4];
    uint64_t lease;
    for (uint32_t i = 0; i < 4; i++)
        keys[i] = key(i);
    ck_assert_int_eq(engine_lookup(s, h, ns, keys, 4, 3, &lease, locs), 4);
    moves_land();
    check_bytes(locs, 4);
}

START_TEST(test_no_device)
{
    struct store *st = store_with_gpu(0, 8 * BLOCK);
    ck_assert_ptr_null(st->gpu);
    ck_assert_uint_eq(st->narenas, 1);
    ck_assert_uint_eq(store_gpu_capacity(st), 0);
    store_fixture_free(st, NULL);
    st = store_with_gpu(1, 0); /* not configured */
    ck_assert_ptr_null(st->gpu);
    ck_assert_int_eq(fake_dev.pools_live, 0);
    store_fixture_free(st, NULL);
}
END_TEST

/* Puts from a client that mapped the pool go to the pool up to the high watermark, then to
 * the host arena; a client that cannot read the pool gets every block from the host arena:
 * the pool's blocks switch to fresh host slots at once, not ready until their copies land
 * (its WAIT answers then), with the same bytes, and no wait on the loop. */
START_TEST(test_put_gpu_load_host)
{
    struct store_owner g, h;
    struct kvc_wire_key keys[8];
    struct kvc_wire_loc locs[8];
    uint64_t lease;
    uint32_t nready, pending;
    store_owner_init(&g);
    store_owner_init(&h);
    g.gpu = true;
    ck_assert_uint_eq(put_chain(&g, 8), 6); /* 0.75 of 8 slots */
    ck_assert_uint_eq(store_gpu_used(s), 6 * BLOCK);
    for (uint32_t i = 0; i < 8; i++)
        keys[i] = key(i);
    uint64_t waits = fake_dev.waits;
    ck_assert_int_eq(engine_lookup(s, &h, ns, keys, 8, 3, &lease, locs), 8);
    for (uint32_t i = 0; i < 8; i++) {
        ck_assert_uint_eq(locs[i].tier, KVC_WIRE_TIER_HOST);
        ck_assert_uint_eq(locs[i].flags & KVC_LOC_F_READY, i < 6 ? 0 : KVC_LOC_F_READY);
    }
    /* In flight: the pool slots are still held, nothing is counted yet. */
    ck_assert_uint_eq(gpu_stat("gpu_moves_inflight"), 6);
    ck_assert_uint_eq(store_gpu_used(s), 6 * BLOCK);
    ck_assert_uint_eq(s->total.gpu_demoted_blocks, 0);
    lease_state(&h, lease, &nready, &pending);
    ck_assert_uint_eq(nready, 0);
    ck_assert_uint_eq(pending, 6);
    moves_land();
    lease_state(&h, lease, &nready, &pending);
    ck_assert_uint_eq(nready, 8);
    ck_assert_uint_eq(pending, 0);
    check_bytes(locs, 8);
    ck_assert_uint_eq(store_gpu_used(s), 0);
    ck_assert_uint_eq(s->total.gpu_demoted_blocks, 6);
    ck_assert_uint_eq(fake_dev.waits, waits); /* not one wait on the loop */
    ck_assert_uint_eq(gpu_stat("gpu_move_waits"), 0);
    ck_assert_int_eq(store_release(s, &h, lease), 0);
    store_owner_fini(s, &g);
    store_owner_fini(s, &h);
    ck_assert_uint_eq(s->pins_now, 0);
}
END_TEST

/* 1 when every byte of the pool is zero (nothing has landed there). */
static int pool_untouched(void)
{
    const struct kern_dev_pool *p = tier_gpu_pool(s->gpu);
    for (uint64_t i = 0; i < store_gpu_capacity(s); i += 512)
        if (((const uint8_t *)p->base)[i])
            return 0;
    return 1;
}

/* A client that mapped the pool gets host blocks promoted while the pool has room, once it
 * released the lease that hit them (issue 26): while it holds it, it copies those bytes out
 * of the host slots itself, and no copy of the daemon's shares the link with that load.
 * They switch to the pool once landed, and the next lookup names the pool with the same
 * bytes. */
START_TEST(test_promote_on_gpu_release)
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
    uint64_t waits = fake_dev.waits, host_used = store_host_used(s);
    ck_assert_int_eq(engine_lookup(s, &g, ns, keys, 8, 3, &lease, locs), 8);
    for (uint32_t i = 0; i < 8; i++) {
        ck_assert_uint_eq(locs[i].tier, KVC_WIRE_TIER_HOST);
        ck_assert_uint_eq(locs[i].flags & KVC_LOC_F_READY, KVC_LOC_F_READY);
    }
    check_bytes(locs, 8);
    /* No move while g holds the lease: nothing queued on the device, no pool slot taken. */
    ck_assert_uint_eq(gpu_stat("gpu_moves_inflight"), 0);
    ck_assert_uint_eq(store_gpu_used(s), 0);
    ck_assert(pool_untouched());
    ck_assert_uint_eq(fake_dev.queued, 0);
    ck_assert_int_eq(engine_release(s, &g, lease, 4), 0);
    ck_assert_uint_eq(gpu_stat("gpu_moves_inflight"), 6);
    ck_assert_uint_eq(store_gpu_used(s), 6 * BLOCK); /* the destinations, held */
    ck_assert_uint_eq(store_host_used(s), host_used);
    moves_land();
    ck_assert_uint_eq(gpu_stat("gpu_moves_waiting"), 0);
    ck_assert_uint_eq(s->total.gpu_promoted_blocks, 6);
    ck_assert_uint_eq(store_host_used(s), host_used - 6 * BLOCK);
    ck_assert_int_eq(engine_lookup(s, &g, ns, keys, 8, 5, &lease, locs), 8);
    uint32_t on_gpu = 0;
    for (uint32_t i = 0; i < 8; i++)
        on_gpu += locs[i].tier == KVC_WIRE_TIER_GPU;
    ck_assert_uint_eq(on_gpu, 6);
    check_bytes(locs, 8);
    ck_assert_uint_eq(fake_dev.waits, waits);
    /* While g holds them, a host-only client cannot have the pinned pool blocks moved:
     * its hit run ends at the first one. */
    uint64_t lease2;
    struct kvc_wire_loc locs2[8];
    ck_assert_int_eq(engine_lookup(s, &h, ns, keys, 8, 6, &lease2, locs2), 0);
    ck_assert_uint_eq(store_gpu_used(s), 6 * BLOCK);
    store_owner_fini(s, &g); /* the client dies holding its pins */
    ck_assert_uint_eq(s->pins_now, 0);
    ck_assert_int_eq(engine_lookup(s, &h, ns, keys, 8, 7, &lease2, locs2), 8);
    moves_land();
    check_bytes(locs2, 8);
    ck_assert_uint_eq(fake_dev.waits, waits);
    store_owner_fini(s, &h);
    ck_assert_uint_eq(s->pins_now, 0);
}
END_TEST

/* Above the high watermark the pool demotes its coldest blocks to the host arena, down to
 * the low one, counting the demotions in flight as gone; nothing is lost. */
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
    ck_assert_uint_eq(store_gpu_used(s), 6 * BLOCK); /* copies in flight */
    ck_assert_int_eq(engine_trim(s, 10), 0);         /* and counted: no more start */
    moves_land();
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

/* A promotion that landed but waits for its lease holds a pool slot; when the pool goes
 * above its high watermark the trim gives it up first (the block stays on the host). */
START_TEST(test_waiting_promotion_given_up_under_pressure)
{
    struct store_owner g, h;
    struct kvc_wire_key keys[2] = {key(0), key(1)};
    struct kvc_wire_loc locs[2];
    uint64_t lease;
    store_owner_init(&g);
    store_owner_init(&h);
    ck_assert_uint_eq(put_chain(&h, 2), 0);
    g.gpu = true;
    ck_assert_int_eq(engine_lookup(s, &g, ns, keys, 2, 3, &lease, locs), 2);
    fake_dev.hold = 1; /* the copies have not landed when h pins the host slots */
    ck_assert_int_eq(engine_release(s, &g, lease, 3), 0);
    ck_assert_int_eq(engine_lookup(s, &h, ns, keys, 2, 3, &lease, locs), 2);
    fake_dev.hold = 0;
    moves_land(); /* landed: they wait for h's lease */
    ck_assert_uint_eq(gpu_stat("gpu_moves_waiting"), 2);
    ck_assert_uint_eq(store_gpu_used(s), 2 * BLOCK);
    struct store_params p = s->p;
    p.high_watermark = 0.2;
    p.low_watermark = 0.1;
    store_reload(s, &p);
    (void)engine_trim(s, 4);
    ck_assert_uint_eq(gpu_stat("gpu_moves_waiting"), 0);
    ck_assert_uint_eq(store_gpu_used(s), 0);
    ck_assert_uint_eq(s->total.gpu_promoted_blocks, 0);
    check_bytes(locs, 2);
    store_owner_fini(s, &g);
    store_owner_fini(s, &h);
}
END_TEST

static int ready_calls;

static void on_ready_count(void *arg)
{
    (void)arg;
    ready_calls++;
}

/* A demotion that lands while a lookup or a trim runs (maybe inside a request) is announced
 * (store.on_ready: the server answers WAITs) only from the loop's handler of the pool's
 * descriptor, which that work makes readable. */
START_TEST(test_waits_answered_from_the_loop)
{
    struct store_owner g, h;
    struct kvc_wire_key k0 = key(0), k1 = key(1);
    struct kvc_wire_loc loc;
    uint64_t lease, lease2;
    struct pollfd pf = {.fd = engine_gpu_fd(s), .events = POLLIN};
    store_owner_init(&g);
    store_owner_init(&h);
    g.gpu = true;
    s->on_ready = on_ready_count;
    ready_calls = 0;
    ck_assert_uint_eq(put_chain(&g, 2), 2);
    ck_assert_int_eq(engine_lookup(s, &h, ns, &k0, 1, 3, &lease, &loc), 1);
    ck_assert_uint_eq(loc.flags & KVC_LOC_F_READY, 0);
    ck_assert_int_eq(engine_trim(s, 4), 0); /* lands it: the fake's device is done when asked */
    ck_assert_int_eq(engine_lookup(s, &g, ns, &k1, 1, 5, &lease2, &loc), 1);
    ck_assert_uint_eq(s->total.gpu_demoted_blocks, 1);
    ck_assert_int_eq(ready_calls, 0);
    ck_assert_int_eq(poll(&pf, 1, 1000), 1);
    engine_gpu_poll(s, 6);
    ck_assert_int_eq(ready_calls, 1);
    ck_assert_int_eq(poll(&pf, 1, 20), 0);
    s->on_ready = NULL;
    store_owner_fini(s, &g);
    store_owner_fini(s, &h);
}
END_TEST

/* While the device is busy with the moves, nothing of theirs is handed out as ready and the
 * calling thread never waits: other lookups and puts are answered, the pool slots hold
 * nothing yet, and the blocks stay readable where they were. */
START_TEST(test_moves_never_block)
{
    struct store_owner g, h;
    struct kvc_wire_key keys[8];
    struct kvc_wire_loc locs[8];
    uint64_t lease;
    store_owner_init(&g);
    store_owner_init(&h);
    ck_assert_uint_eq(put_chain(&h, 4), 0);
    for (uint32_t i = 0; i < 8; i++)
        keys[i] = key(i);
    g.gpu = true;
    uint64_t waits = fake_dev.waits;
    fake_dev.hold = 1;
    ck_assert_int_eq(engine_lookup(s, &g, ns, keys, 4, 3, &lease, locs), 4);
    ck_assert_int_eq(engine_release(s, &g, lease, 3), 0);
    for (int round = 0; round < 5; round++) {
        engine_gpu_poll(s, 4);
        ck_assert_int_eq(engine_trim(s, 4), 0);
    }
    ck_assert_uint_eq(gpu_stat("gpu_moves_inflight"), 4);
    ck_assert(pool_untouched());
    /* Another client is served meanwhile: a lookup of the same blocks (host, ready) and a
     * put of its own. */
    ck_assert_int_eq(engine_lookup(s, &h, ns, keys, 4, 5, &lease, locs), 4);
    for (uint32_t i = 0; i < 4; i++)
        ck_assert_uint_eq(locs[i].tier, KVC_WIRE_TIER_HOST);
    check_bytes(locs, 4);
    ck_assert_int_eq(store_release(s, &h, lease), 0);
    struct kvc_wire_key more[2] = {key(4), key(5)};
    struct kvc_wire_loc ml[2];
    uint8_t st[2];
    uint64_t resv;
    uint32_t dropped;
    ck_assert_int_eq(store_reserve(s, &h, ns, &keys[3], more, 2, 6, &resv, st, ml), 2);
    ck_assert_int_eq(store_commit(s, &h, resv, UINT32_MAX, 6, &dropped), 2);
    ck_assert_uint_eq(fake_dev.waits, waits);
    ck_assert_uint_eq(gpu_stat("gpu_move_waits"), 0);
    fake_dev.hold = 0;
    moves_land();
    ck_assert_uint_eq(s->total.gpu_promoted_blocks, 4);
    ck_assert(!pool_untouched());
    ck_assert_int_eq(engine_lookup(s, &g, ns, keys, 4, 7, &lease, locs), 4);
    for (uint32_t i = 0; i < 4; i++)
        ck_assert_uint_eq(locs[i].tier, KVC_WIRE_TIER_GPU);
    check_bytes(locs, 4);
    ck_assert_uint_eq(fake_dev.waits, waits);
    ck_assert_uint_gt(gpu_stat("gpu_move_queries"), 0);
    store_owner_fini(s, &g);
    store_owner_fini(s, &h);
}
END_TEST

/* A promotion whose copy fails leaves the block in its host slot with its bytes, frees the
 * pool slot and is counted; the next lookup promotes it again. */
START_TEST(test_failed_promotion_keeps_block)
{
    struct store_owner g, h;
    struct kvc_wire_key keys[2] = {key(0), key(1)};
    struct kvc_wire_loc locs[2];
    uint64_t lease;
    store_owner_init(&g);
    store_owner_init(&h);
    ck_assert_uint_eq(put_chain(&h, 2), 0);
    g.gpu = true;
    ck_assert_int_eq(engine_lookup(s, &g, ns, keys, 2, 3, &lease, locs), 2);
    ck_assert_int_eq(engine_release(s, &g, lease, 3), 0);
    fake_dev.fail_wait = EIO; /* the first copy the device reports on */
    moves_land();
    (void)fake_dev_last_error();
    ck_assert_uint_eq(s->total.gpu_move_failures, 1);
    ck_assert_uint_eq(s->total.gpu_promoted_blocks, 1);
    ck_assert_uint_eq(store_gpu_used(s), BLOCK);
    ck_assert_int_eq(engine_lookup(s, &h, ns, keys, 1, 4, &lease, locs), 1);
    ck_assert_uint_eq(locs[0].tier, KVC_WIRE_TIER_HOST);
    ck_assert_uint_eq(locs[0].flags & KVC_LOC_F_READY, KVC_LOC_F_READY);
    check_bytes(locs, 1);
    ck_assert_int_eq(store_release(s, &h, lease), 0);
    ck_assert_int_eq(engine_lookup(s, &g, ns, keys, 2, 5, &lease, locs), 2);
    ck_assert_int_eq(engine_release(s, &g, lease, 5), 0);
    moves_land();
    ck_assert_uint_eq(s->total.gpu_promoted_blocks, 2);
    ck_assert_int_eq(engine_lookup(s, &g, ns, keys, 2, 6, &lease, locs), 2);
    ck_assert_uint_eq(locs[0].tier, KVC_WIRE_TIER_GPU);
    check_bytes(locs, 2);
    store_owner_fini(s, &g);
    store_owner_fini(s, &h);
}
END_TEST

/* A demotion whose copy fails goes back to its pool slot, which still holds the bytes, and
 * frees its host slot; the others land. */
START_TEST(test_failed_demotion_goes_back)
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
    fake_dev.fail_wait = EIO;
    moves_land();
    (void)fake_dev_last_error();
    ck_assert_uint_eq(s->total.gpu_move_failures, 1);
    ck_assert_uint_eq(s->total.gpu_demoted_blocks, 3);
    ck_assert_uint_eq(store_gpu_used(s), 3 * BLOCK);
    ck_assert_uint_eq(store_host_used(s), 3 * BLOCK);
    struct kvc_wire_key keys[6];
    struct kvc_wire_loc locs[6];
    uint64_t lease;
    uint32_t on_gpu = 0;
    for (uint32_t i = 0; i < 6; i++)
        keys[i] = key(i);
    ck_assert_int_eq(engine_lookup(s, &g, ns, keys, 6, 11, &lease, locs), 6);
    for (uint32_t i = 0; i < 6; i++)
        on_gpu += locs[i].tier == KVC_WIRE_TIER_GPU;
    ck_assert_uint_eq(on_gpu, 3);
    check_bytes(locs, 6);
    store_owner_fini(s, &g);
}
END_TEST

/* A demotion that fails while a lease holds its not-ready host slot: the lease sees the
 * block lost (its WAIT stops there, nothing pending), other lookups miss it; once the lease
 * goes it is back in the pool with its bytes. */
START_TEST(test_failed_demotion_while_pinned)
{
    struct store_owner g, h, h2;
    struct kvc_wire_key k0 = key(0);
    struct kvc_wire_loc loc;
    uint64_t lease, lease2;
    uint32_t nready, pending;
    store_owner_init(&g);
    store_owner_init(&h);
    store_owner_init(&h2);
    g.gpu = true;
    ck_assert_uint_eq(put_chain(&g, 1), 1);
    ck_assert_int_eq(engine_lookup(s, &h, ns, &k0, 1, 3, &lease, &loc), 1);
    ck_assert_uint_eq(loc.flags & KVC_LOC_F_READY, 0);
    fake_dev.fail_wait = EIO;
    moves_land();
    (void)fake_dev_last_error();
    ck_assert_uint_eq(s->total.gpu_move_failures, 1);
    lease_state(&h, lease, &nready, &pending);
    ck_assert_uint_eq(nready, 0);
    ck_assert_uint_eq(pending, 0);
    ck_assert_int_eq(engine_lookup(s, &h2, ns, &k0, 1, 4, &lease2, &loc), 0);
    ck_assert_int_eq(engine_lookup(s, &g, ns, &k0, 1, 4, &lease2, &loc), 0);
    ck_assert_uint_eq(gpu_stat("gpu_moves_waiting"), 1);
    ck_assert_int_eq(store_release(s, &h, lease), 0);
    ck_assert_uint_eq(store_ns_get(s, ns)->blocks, 1); /* not dropped as a lost block */
    engine_gpu_poll(s, 5);
    ck_assert_uint_eq(gpu_stat("gpu_moves_waiting"), 0);
    ck_assert_uint_eq(store_host_used(s), 0);
    ck_assert_int_eq(engine_lookup(s, &g, ns, &k0, 1, 6, &lease, &loc), 1);
    ck_assert_uint_eq(loc.tier, KVC_WIRE_TIER_GPU);
    check_bytes(&loc, 1);
    store_owner_fini(s, &g);
    store_owner_fini(s, &h);
    store_owner_fini(s, &h2);
}
END_TEST

/* Blocks in motion are not flushed, evicted or dropped with their namespace (their copies
 * read and write their slots); once their moves completed they go like any other. */
START_TEST(test_flush_evict_drop_while_moving)
{
    struct store_owner g, h;
    struct kvc_wire_key keys[8];
    struct kvc_wire_loc locs[8];
    uint64_t lease, dropped = 0;
    store_owner_init(&g);
    store_owner_init(&h);
    g.gpu = true;
    ck_assert_uint_eq(put_chain(&g, 6), 6);
    for (uint32_t i = 0; i < 8; i++)
        keys[i] = key(i);
    fake_dev.hold = 1;
    /* The first three go out of the pool (a host-only client asked for them). */
    ck_assert_int_eq(engine_lookup(s, &h, ns, keys, 3, 3, &lease, locs), 3);
    ck_assert_int_eq(store_release(s, &h, lease), 0);
    ck_assert_uint_eq(gpu_stat("gpu_moves_inflight"), 3);
    /* A flush takes the idle leaves (5, then 4, then 3) and stops at the moving 2. */
    ck_assert_int_eq(engine_evict_where(s, 0, UINT32_MAX, 0, true, 4), 3);
    ck_assert_uint_eq(store_ns_get(s, ns)->blocks, 3);
    engine_evict(s, index_find(&s->ix, (uint16_t)ns, &keys[2]));
    ck_assert_uint_eq(store_ns_get(s, ns)->blocks, 3);
    ck_assert_int_eq(store_ns_drop(s, ns, &dropped), -EBUSY);
    ck_assert_uint_eq(dropped, 0);
    ck_assert_uint_eq(store_ns_get(s, ns)->blocks, 3);
    fake_dev.hold = 0;
    moves_land();
    ck_assert_uint_eq(s->total.gpu_demoted_blocks, 3);
    ck_assert_int_eq(engine_lookup(s, &h, ns, keys, 3, 5, &lease, locs), 3);
    check_bytes(locs, 3);
    ck_assert_int_eq(store_release(s, &h, lease), 0);
    ck_assert_int_eq(engine_evict_where(s, 0, UINT32_MAX, 0, true, 6), 3);
    ck_assert_uint_eq(store_host_used(s), 0);
    ck_assert_uint_eq(store_gpu_used(s), 0);
    store_owner_fini(s, &g);
    store_owner_fini(s, &h);
}
END_TEST

/* A host page lost under a move (engine_arena_fault): a promotion reading it is dropped
 * with its slots; a demotion writing into it goes back to the pool, bytes intact. */
START_TEST(test_arena_fault_while_moving)
{
    struct store_owner g, h;
    struct kvc_wire_key k0 = key(0);
    struct kvc_wire_loc loc;
    uint64_t lease;
    store_owner_init(&g);
    store_owner_init(&h);
    ck_assert_uint_eq(put_chain(&h, 1), 0);
    g.gpu = true;
    fake_dev.hold = 1;
    ck_assert_int_eq(engine_lookup(s, &g, ns, &k0, 1, 3, &lease, &loc), 1);
    ck_assert_int_eq(engine_release(s, &g, lease, 3), 0);
    ck_assert_uint_eq(engine_arena_fault(s, loc.arena_id, loc.offset, BLOCK), 1);
    fake_dev.hold = 0;
    moves_land();
    ck_assert_uint_eq(store_ns_get(s, ns)->blocks, 0);
    ck_assert_uint_eq(store_gpu_used(s), 0);
    ck_assert_uint_eq(store_host_used(s), 0);
    /* Now a block in the pool, demoted for a host-only client into a page that goes. */
    ck_assert_uint_eq(put_chain(&g, 1), 1);
    fake_dev.hold = 1;
    ck_assert_int_eq(engine_lookup(s, &h, ns, &k0, 1, 4, &lease, &loc), 1);
    ck_assert_uint_eq(loc.tier, KVC_WIRE_TIER_HOST);
    ck_assert_int_eq(store_release(s, &h, lease), 0);
    ck_assert_uint_eq(engine_arena_fault(s, loc.arena_id, loc.offset, BLOCK), 1);
    fake_dev.hold = 0;
    moves_land();
    ck_assert_uint_eq(store_ns_get(s, ns)->blocks, 1);
    ck_assert_uint_eq(store_host_used(s), 0);
    ck_assert_int_eq(engine_lookup(s, &g, ns, &k0, 1, 5, &lease, &loc), 1);
    ck_assert_uint_eq(loc.tier, KVC_WIRE_TIER_GPU);
    check_bytes(&loc, 1);
    store_owner_fini(s, &g);
    store_owner_fini(s, &h);
}
END_TEST

/* A lookup with READY_ONLY stops at a block on its way out of the pool (its move still
 * starts), and has it once it landed. */
START_TEST(test_ready_only_stops_at_demotion)
{
    struct store_owner g, h;
    struct kvc_wire_key keys[2] = {key(0), key(1)};
    struct kvc_wire_loc locs[2];
    uint64_t lease;
    store_owner_init(&g);
    store_owner_init(&h);
    g.gpu = true;
    ck_assert_uint_eq(put_chain(&g, 2), 2);
    ck_assert_int_eq(
        engine_lookup_flags(s, &h, ns, keys, 2, KVC_LOOKUP_F_READY_ONLY, 3, &lease, locs), 0);
    ck_assert_uint_eq(gpu_stat("gpu_moves_inflight"), 1);
    moves_land();
    ck_assert_int_eq(
        engine_lookup_flags(s, &h, ns, keys, 2, KVC_LOOKUP_F_READY_ONLY, 4, &lease, locs), 1);
    check_bytes(locs, 1);
    store_owner_fini(s, &g);
    store_owner_fini(s, &h);
}
END_TEST

/* engine_stop with moves in flight, one of them landed under a lease: it waits for the
 * copies (once), abandons what cannot switch and leaves every block readable where it was;
 * nothing is left queued, registered or alive on the device after store_free. */
START_TEST(test_stop_with_moves_in_flight)
{
    struct store_owner g, h;
    struct kvc_wire_key keys[4];
    struct kvc_wire_loc locs[4];
    uint64_t lease, lease2;
    store_owner_init(&g);
    store_owner_init(&h);
    ck_assert_uint_eq(put_chain(&h, 2), 0); /* keys 0, 1 on the host */
    for (uint32_t i = 0; i < 4; i++)
        keys[i] = key(i);
    g.gpu = true;
    ck_assert_int_eq(engine_lookup(s, &g, ns, keys, 1, 3, &lease, locs), 1);
    fake_dev.hold = 1; /* the copy has not landed when h pins the host slot */
    ck_assert_int_eq(engine_release(s, &g, lease, 3), 0);
    ck_assert_int_eq(engine_lookup(s, &h, ns, keys, 1, 3, &lease, locs), 1);
    fake_dev.hold = 0;
    moves_land(); /* landed, waiting for h's pin */
    fake_dev.hold = 1;
    ck_assert_int_eq(engine_lookup(s, &g, ns, &keys[1], 1, 4, &lease2, locs), 1);
    ck_assert_int_eq(engine_release(s, &g, lease2, 4), 0);
    ck_assert_uint_eq(gpu_stat("gpu_moves_inflight"), 1);
    ck_assert_uint_eq(gpu_stat("gpu_moves_waiting"), 1);
    uint64_t waits = fake_dev.waits;
    engine_stop(s);
    ck_assert_uint_eq(fake_dev.waits - waits, 1);
    ck_assert_uint_eq(fake_dev.queued, 0);
    /* key 0 stays on the host (its lease), key 1 landed and switched */
    ck_assert_uint_eq(store_gpu_used(s), BLOCK);
    ck_assert_uint_eq(s->total.gpu_promoted_blocks, 1);
    ck_assert_int_eq(engine_lookup(s, &h, ns, keys, 2, 5, &lease2, locs), 2);
    ck_assert_uint_eq(locs[0].tier, KVC_WIRE_TIER_HOST);
    check_bytes(locs, 1);
    store_owner_fini(s, &g);
    store_owner_fini(s, &h);
}
END_TEST

/* The host arenas are registered with the device once (arenas added later too) and given
 * back with the pool; a device that refuses leaves them pageable, and moves still land. */
START_TEST(test_arenas_registered)
{
    uint32_t id;
    ck_assert_int_eq(fake_dev.registered, 1);
    ck_assert_uint_eq(gpu_stat("gpu_arenas_registered"), 1);
    ck_assert_int_eq(store_arena_add(s, 1 << 20, &id), 0);
    ck_assert_int_eq(fake_dev.registered, 2);
    ck_assert_uint_eq(s->gpu_unregistered, 0);
    engine_stop(s);
    store_free(s);
    ck_assert_int_eq(fake_dev.registered, 0);

    s = store_with_gpu_reg(1, 8 * BLOCK, ENOMEM);
    ck_assert_int_eq(fake_dev.registered, 0);
    ck_assert_uint_eq(s->gpu_unregistered, 1);
    struct store_owner g, h;
    store_owner_init(&g);
    store_owner_init(&h);
    g.gpu = true;
    ck_assert_uint_eq(put_chain(&g, 4), 4);
    lookup_moved_back(&h);
    store_owner_fini(s, &g);
    store_owner_fini(s, &h);
}
END_TEST

/* A host arena larger than what the start faults in is registered with the device part by
 * part, each part once the fault-in has been over all of it: the registration never faults
 * a page in itself (the driver's pinning would, at 4 KiB, ahead of the fault-in and of its
 * collapse into 2 MiB pages; and a whole arena registered at the pool's opening made the
 * start wait for all of it). Moves work before, during and after. */
START_TEST(test_arena_registered_as_faulted)
{
    const uint64_t size = 256ull << 20, chunk = 16ull << 20;
    struct store_params p = store_fixture_params();
    struct gpu_reg_stats rs;
    struct store_owner g, h;
    store_fixture_free(s, NULL);
    p.host_size = size;
    p.host_prefault = true;
    p.host_prefault_threads = 1;
    p.host_collapse = true;
    p.high_watermark = 0.75;
    p.gpu_size = 8 * BLOCK;
    p.gpu_page_size = 64 << 10;
    p.gpu_ops = &fake_dev_ops;
    p.gpu_reg_chunk = chunk;
    fake_dev_reset(1);
    s = store_fixture_new(&p, NULL);
    ns = store_fixture_ns(s, "m", 2, 0);
    /* From the opening on, whole chunks (the thread may be registering more already); that
     * none was registered before it was faulted in is counted by the fake (below). */
    gpu_reg_stats_get(s->gpu_reg, &rs);
    ck_assert_uint_eq(rs.bytes + rs.pending, size);
    ck_assert_uint_eq(rs.bytes % chunk, 0);
    store_owner_init(&g);
    store_owner_init(&h);
    g.gpu = true;
    ck_assert_uint_eq(put_chain(&g, 4), 4); /* into the pool while the rest is faulted in */
    for (int i = 0; i < daemon_ms(20000) && (gpu_reg_stats_get(s->gpu_reg, &rs), rs.pending); i++)
        usleep(1000);
    ck_assert_uint_eq(rs.pending, 0);
    ck_assert_uint_eq(rs.bytes, size);
    ck_assert_uint_eq(rs.arenas, 1);
    ck_assert_uint_eq(rs.refused, 0);
    ck_assert_int_eq(fake_dev.registered, (int)(size / chunk));
    ck_assert_uint_eq(fake_dev.register_unresident, 0);
    ck_assert_uint_eq(gpu_stat("gpu_host_registered_bytes"), size);
    ck_assert_uint_eq(gpu_stat("gpu_host_register_pending_bytes"), 0);
    ck_assert_uint_eq(gpu_stat("gpu_arenas_registered"), 1);
    /* a client that cannot read the pool gets the blocks moved back to registered memory */
    lookup_moved_back(&h);
    store_owner_fini(s, &g);
    store_owner_fini(s, &h);
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
    tcase_add_test(tc, test_promote_on_gpu_release);
    tcase_add_test(tc, test_trim_demotes);
    tcase_add_test(tc, test_abort_frees_pool);
    tcase_add_test(tc, test_moves_never_block);
    tcase_add_test(tc, test_failed_promotion_keeps_block);
    tcase_add_test(tc, test_failed_demotion_goes_back);
    tcase_add_test(tc, test_failed_demotion_while_pinned);
    tcase_add_test(tc, test_flush_evict_drop_while_moving);
    tcase_add_test(tc, test_arena_fault_while_moving);
    tcase_add_test(tc, test_ready_only_stops_at_demotion);
    tcase_add_test(tc, test_stop_with_moves_in_flight);
    tcase_add_test(tc, test_arenas_registered);
    tcase_add_test(tc, test_arena_registered_as_faulted);
    tcase_add_test(tc, test_waiting_promotion_given_up_under_pressure);
    tcase_add_test(tc, test_waits_answered_from_the_loop);
    suite_add_tcase(su, tc);
    return su;
}

int main(void)
{
    return daemon_suite_run(store_gpu_suite());
}
