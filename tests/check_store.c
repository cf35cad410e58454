/* check_store — the cache rules without a socket: visibility, dedup, pins, reservations,
 * eviction order and the prefix-tree invariant. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client/kvc_fast.h"
#include "daemon/engine.h"
#include "daemon/fast.h"
#include "daemon/store.h"
#include "tests/lib/layout.h"
#include "tiers/host.h"
#include "tiers/tier.h"
#include "tests/lib/daemon.h"
#include "tests/lib/store_fixture.h"

#define BLOCK (64 * 1024)

static struct store *s;
static uint32_t ns;

/* The store of p with the suite's namespace. */
static void setup_with(const struct store_params *p)
{
    struct kvc_wire_layout l = layout_fp16("m", 2, 0);
    bool created;
    s = store_fixture_new(p, NULL);
    ck_assert_int_eq(store_ns_open(s, &l, &ns, &created), 0);
    ck_assert(created);
    ck_assert_uint_eq(store_ns_get(s, ns)->block_bytes, BLOCK);
}

static void setup(void)
{
    struct store_params p = store_fixture_params();
    p.high_watermark = 1.0;
    p.low_watermark = 0.9;
    setup_with(&p);
}

static void teardown(void)
{
    store_fixture_free(s, NULL);
    s = NULL;
}

/* Keys of chain `c`: block i of chain c; chains share their first `shared` blocks. */
static struct kvc_wire_key key(uint32_t chain, uint32_t i, uint32_t shared)
{
    uint32_t c = i < shared ? 0 : chain;
    return (struct kvc_wire_key){.lo = ((uint64_t)c << 32) | (i + 1), .hi = 0xabcdull + c};
}

static void chain(struct kvc_wire_key *k, uint32_t c, uint32_t n, uint32_t shared)
{
    for (uint32_t i = 0; i < n; i++)
        k[i] = key(c, i, shared);
}

/* Every committed block's parent is committed; children counts and pins add up. */
static void check_invariants(void)
{
    struct index *ix = &s->ix;
    uint64_t pins = 0;
    for (uint32_t i = 0; i < ix->nblocks; i++) {
        const struct block *b = &ix->blocks[i];
        uint32_t children = 0;
        pins += b->pins; /* a reserved block's: the reservations hanging from it */
        if (b->state != BLOCK_STATE_COMMITTED)
            continue;
        if (b->parent != INDEX_NONE) {
            uint32_t p = b->parent;
            ck_assert_msg(p < ix->nblocks && ix->blocks[p].state == BLOCK_STATE_COMMITTED &&
                              ix->blocks[p].ns == b->ns && ix->blocks[p].depth + 1 == b->depth,
                          "block %u has no cached parent", i);
        }
        for (uint32_t j = 0; j < ix->nblocks; j++) {
            const struct block *c = &ix->blocks[j];
            if (c->state == BLOCK_STATE_COMMITTED && c->parent == i)
                children++;
        }
        ck_assert_uint_eq(b->children, children);
    }
    ck_assert_uint_eq(pins, s->pins_now); /* the gauge is the sum of the blocks' pins */
}

/* Writes each reserved slot: the key's low word at the start of the block. */
static void fill(const struct kvc_wire_key *k, const uint8_t *st, const struct kvc_wire_loc *locs,
                 uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (st[i] == KVC_WIRE_SLOT_RESERVED)
            memcpy((uint8_t *)tier_host_base(s->arenas[0].tier) + locs[i].offset, &k[i].lo, 8);
}

static int put(struct store_owner *o, uint32_t c, uint32_t n, uint32_t shared, uint64_t now)
{
    struct kvc_wire_key k[64], zero = {0, 0};
    uint8_t st[64];
    struct kvc_wire_loc locs[64];
    uint64_t resv;
    uint32_t dropped;
    chain(k, c, n, shared);
    int r = store_reserve(s, o, ns, &zero, k, n, now, &resv, st, locs);
    if (r <= 0)
        return r;
    fill(k, st, locs, n);
    return store_commit(s, o, resv, UINT32_MAX, now, &dropped);
}

static int lookup(struct store_owner *o, uint32_t c, uint32_t n, uint32_t shared, uint64_t now,
                  uint64_t *lease)
{
    struct kvc_wire_key k[64];
    struct kvc_wire_loc locs[64];
    chain(k, c, n, shared);
    int hits = engine_lookup(s, o, ns, k, n, now, lease, locs);
    for (int i = 0; i < hits; i++) {
        uint64_t v;
        memcpy(&v, (uint8_t *)tier_host_base(s->arenas[0].tier) + locs[i].offset, 8);
        ck_assert_uint_eq(v, k[i].lo); /* never wrong data */
    }
    return hits;
}

START_TEST(test_put_lookup_release)
{
    struct store_owner o;
    uint64_t lease;
    store_owner_init(&o);
    ck_assert_int_eq(lookup(&o, 1, 4, 2, 1, &lease), 0);
    ck_assert_uint_eq(lease, 0);
    ck_assert_int_eq(put(&o, 1, 4, 2, 2), 4);
    ck_assert_int_eq(lookup(&o, 1, 4, 2, 3, &lease), 4);
    ck_assert_uint_ne(lease, 0);
    ck_assert_uint_eq(s->pins_now, 4);
    /* A chain diverging after 2 blocks hits exactly the shared 2. */
    uint64_t lease2;
    ck_assert_int_eq(lookup(&o, 2, 4, 2, 4, &lease2), 2);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    ck_assert_int_eq(store_release(s, &o, lease), -ENOENT);
    ck_assert_int_eq(store_release(s, &o, lease2), 0);
    ck_assert_uint_eq(s->pins_now, 0);
    ck_assert_uint_eq(s->total.hit_blocks, 6);
    ck_assert_uint_eq(s->total.lookup_tokens, 12 * 16);
    ck_assert_uint_eq(s->total.hit_tokens_host, s->total.hit_tokens);
    ck_assert_uint_eq(s->total.hit_tokens_disk, 0);
    check_invariants();
    store_owner_fini(s, &o);
}
END_TEST

START_TEST(test_reserved_invisible_busy_and_dedup)
{
    struct store_owner a, b;
    struct kvc_wire_key k[4], zero = {0, 0};
    uint8_t st[4];
    struct kvc_wire_loc locs[4];
    uint64_t ra, rb, lease;
    uint32_t dropped;
    store_owner_init(&a);
    store_owner_init(&b);
    chain(k, 1, 4, 0);
    ck_assert_int_eq(store_reserve(s, &a, ns, &zero, k, 4, 1, &ra, st, locs), 4);
    fill(k, st, locs, 4);
    ck_assert_int_eq(lookup(&b, 1, 4, 0, 2, &lease), 0); /* uncommitted: invisible */
    ck_assert_int_eq(store_reserve(s, &b, ns, &zero, k, 4, 3, &rb, st, locs), 0);
    ck_assert_uint_eq(rb, 0);
    ck_assert_int_eq(st[0], KVC_WIRE_SLOT_BUSY);
    ck_assert_int_eq(st[1], KVC_WIRE_SLOT_SKIPPED);
    ck_assert_int_eq(store_commit(s, &a, ra, 2, 4, &dropped), 2); /* first 2 only */
    ck_assert_uint_eq(dropped, 2);
    ck_assert_int_eq(lookup(&b, 1, 4, 0, 5, &lease), 2);
    ck_assert_int_eq(store_release(s, &b, lease), 0);
    /* Now b writes the rest: 2 present (dedup), 2 reserved. */
    ck_assert_int_eq(store_reserve(s, &b, ns, &zero, k, 4, 6, &rb, st, locs), 2);
    ck_assert_int_eq(st[0], KVC_WIRE_SLOT_PRESENT);
    ck_assert_int_eq(st[2], KVC_WIRE_SLOT_RESERVED);
    fill(k, st, locs, 4);
    ck_assert_int_eq(store_commit(s, &b, rb, UINT32_MAX, 7, &dropped), 2);
    ck_assert_int_eq(lookup(&a, 1, 4, 0, 8, &lease), 4);
    ck_assert_uint_eq(s->total.dedup_blocks, 2);
    check_invariants();
    store_owner_fini(s, &a);
    store_owner_fini(s, &b);
    ck_assert_uint_eq(s->pins_now, 0);
}
END_TEST

/* What a RESERVE that waits for a writer asks (server_reserve_writing): the first key of a
 * chain not committed, when a reservation holds it, and whose reservation that is. Nothing
 * while the chain's first missing key is absent or the chain is all committed. */
START_TEST(test_reserve_writing)
{
    struct store_owner a, b;
    struct kvc_wire_key k[4], zero = {0, 0};
    uint8_t st[4];
    struct kvc_wire_loc locs[4];
    uint64_t ra;
    uint32_t dropped, w;
    store_owner_init(&a);
    store_owner_init(&b);
    chain(k, 7, 4, 0);
    ck_assert_uint_eq(store_reserve_writing(s, ns, k, 4), INDEX_NONE); /* absent */
    ck_assert_int_eq(store_reserve(s, &a, ns, &zero, k, 4, 1, &ra, st, locs), 4);
    w = store_reserve_writing(s, ns, k, 4);
    ck_assert_uint_eq(w, index_find(&s->ix, (uint16_t)ns, &k[0]));
    ck_assert(store_resv_holds(s, &a, w));
    ck_assert(!store_resv_holds(s, &b, w));
    ck_assert(store_block_reserved(s, w, ns));
    ck_assert(!store_block_reserved(s, w, ns + 1));
    fill(k, st, locs, 4);
    ck_assert_int_eq(store_commit(s, &a, ra, 2, 2, &dropped), 2);
    ck_assert_uint_eq(store_reserve_writing(s, ns, k, 4), INDEX_NONE); /* k[2] dropped */
    ck_assert_int_eq(store_reserve(s, &a, ns, &k[1], k + 2, 2, 3, &ra, st, locs), 2);
    w = store_reserve_writing(s, ns, k, 4); /* past the two committed */
    ck_assert_uint_eq(w, index_find(&s->ix, (uint16_t)ns, &k[2]));
    ck_assert(store_resv_holds(s, &a, w));
    ck_assert_uint_eq(store_reserve_writing(s, ns, k, 2), INDEX_NONE); /* all committed */
    fill(k + 2, st, locs, 2);
    ck_assert_int_eq(store_commit(s, &a, ra, UINT32_MAX, 4, &dropped), 2);
    ck_assert_uint_eq(store_reserve_writing(s, ns, k, 4), INDEX_NONE);
    ck_assert(!store_resv_holds(s, &a, w));
    ck_assert(!store_block_reserved(s, w, ns)); /* committed */
    check_invariants();
    store_owner_fini(s, &a);
    store_owner_fini(s, &b);
}
END_TEST

START_TEST(test_orphan_parent_and_abort)
{
    struct store_owner o;
    struct kvc_wire_key k[2], parent = {.lo = 42, .hi = 42};
    uint8_t st[2];
    struct kvc_wire_loc locs[2];
    uint64_t r;
    store_owner_init(&o);
    chain(k, 1, 2, 0);
    /* The parent is not cached: nothing is reserved, so no orphan can appear. */
    ck_assert_int_eq(store_reserve(s, &o, ns, &parent, k, 2, 1, &r, st, locs), 0);
    ck_assert_int_eq(st[0], KVC_WIRE_SLOT_SKIPPED);
    ck_assert_int_eq(st[1], KVC_WIRE_SLOT_SKIPPED);
    /* Abort gives the room back. */
    uint64_t before = store_host_used(s);
    struct kvc_wire_key zero = {0, 0};
    ck_assert_int_eq(store_reserve(s, &o, ns, &zero, k, 2, 2, &r, st, locs), 2);
    ck_assert_uint_gt(store_host_used(s), before);
    ck_assert_int_eq(store_abort(s, &o, r), 0);
    ck_assert_int_eq(store_abort(s, &o, r), -ENOENT);
    ck_assert_uint_eq(store_host_used(s), before);
    ck_assert_uint_eq(s->reserved_now, 0);
    /* A reservation id is not a lease id. */
    ck_assert_int_eq(store_reserve(s, &o, ns, &zero, k, 2, 3, &r, st, locs), 2);
    ck_assert_int_eq(store_release(s, &o, r), -ENOENT);
    store_owner_fini(s, &o); /* the client dies holding it */
    ck_assert_uint_eq(s->reserved_now, 0);
    ck_assert_uint_eq(store_host_used(s), before);
    store_owner_init(&o);
    uint64_t lease;
    ck_assert_int_eq(lookup(&o, 1, 2, 0, 4, &lease), 0);
    store_owner_fini(s, &o);
}
END_TEST

/* 4 MiB / 64 KiB = 64 slots. Many chains sharing a prefix: eviction keeps the tree whole,
 * never takes pinned blocks, and hits stay byte-exact. */
START_TEST(test_eviction_keeps_prefix_tree)
{
    struct store_owner o, pinner;
    uint64_t lease, pinned;
    uint64_t now = 10;
    store_owner_init(&o);
    store_owner_init(&pinner);
    ck_assert_int_eq(put(&o, 1, 8, 4, now++), 8);
    ck_assert_int_eq(lookup(&pinner, 1, 8, 4, now++, &pinned), 8);
    for (uint32_t c = 2; c < 60; c++) {
        int r = put(&o, c, 8, 4, now++);
        ck_assert_int_ge(r, 0);
        check_invariants();
    }
    ck_assert_uint_gt(s->total.evicted_blocks, 0);
    /* The pinned chain is intact. */
    ck_assert_int_eq(lookup(&o, 1, 8, 4, now++, &lease), 8);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    /* The most recent chain is there. */
    ck_assert_int_eq(lookup(&o, 59, 8, 4, now++, &lease), 8);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    /* An early, unpinned chain lost its tail first, keeping the shared prefix. */
    ck_assert_int_eq(lookup(&o, 2, 8, 4, now++, &lease), 4);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    store_owner_fini(s, &pinner);
    store_owner_fini(s, &o);
    check_invariants();
}
END_TEST

/* Everything pinned: a reservation reports NOSPACE instead of evicting pinned blocks. */
START_TEST(test_nospace_when_all_pinned)
{
    struct store_owner o;
    uint64_t leases[8];
    struct kvc_wire_key k[4], zero = {0, 0};
    uint8_t st[4];
    struct kvc_wire_loc locs[4];
    uint64_t r;
    store_owner_init(&o);
    for (uint32_t c = 0; c < 8; c++) {
        ck_assert_int_eq(put(&o, 100 + c, 8, 0, c + 1), 8);
        ck_assert_int_eq(lookup(&o, 100 + c, 8, 0, c + 1, &leases[c]), 8);
    }
    chain(k, 500, 4, 0);
    ck_assert_int_eq(store_reserve(s, &o, ns, &zero, k, 4, 50, &r, st, locs), 0);
    ck_assert_int_eq(st[0], KVC_WIRE_SLOT_NOSPACE);
    ck_assert_int_eq(st[1], KVC_WIRE_SLOT_SKIPPED);
    ck_assert_uint_eq(s->total.evicted_blocks, 0);
    ck_assert_int_eq(store_release(s, &o, leases[0]), 0);
    ck_assert_int_eq(store_reserve(s, &o, ns, &zero, k, 4, 51, &r, st, locs), 4);
    ck_assert_uint_eq(s->total.evicted_blocks, 4);
    store_owner_fini(s, &o);
    check_invariants();
}
END_TEST

START_TEST(test_watermarks_trim)
{
    struct store_owner o;
    struct store_params p = s->p;
    store_owner_init(&o);
    for (uint32_t c = 0; c < 8; c++)
        ck_assert_int_eq(put(&o, 200 + c, 8, 0, c + 1), 8); /* 64 slots: full */
    p.high_watermark = 0.5;
    p.low_watermark = 0.25;
    store_reload(s, &p);
    ck_assert_int_gt(engine_trim(s, 100), 0);
    ck_assert_uint_le(store_host_used(s), store_host_capacity(s) / 4);
    check_invariants();
    store_owner_fini(s, &o);
}
END_TEST

/* A store of 4,096 blocks (256 MiB of 64 KiB) ranking with `policy`, filled by 64 chains of
 * 64 with no trim, then its watermarks set to 0.9 / 0.05: the next trim's band is ~3,500
 * blocks. */
static void trim_band_setup(struct store_owner *o, enum policy_kind policy)
{
    struct store_params p = s->p;
    struct kvc_wire_layout l = layout_fp16("m", 2, 0);
    bool created;
    teardown();
    p.host_size = 256u << 20; /* 4,096 blocks */
    p.policy = policy;
    p.high_watermark = 1.0;
    p.low_watermark = 0.9;
    s = store_fixture_new(&p, NULL);
    ck_assert_int_eq(store_ns_open(s, &l, &ns, &created), 0);
    store_owner_init(o);
    for (uint32_t c = 0; c < 64; c++)
        ck_assert_int_eq(put(o, 1000 + c, 64, 0, c + 1), 64);
    p.high_watermark = 0.9;
    p.low_watermark = 0.05;
    store_reload(s, &p);
}

/* A trim of a band larger than a few hundred blocks stops at its time budget (200 us, after
 * its first 256 actions) above the low watermark and says so (trim_more), so no request
 * waits behind the whole band; the trims after go on from there, below the high watermark,
 * down to the low one. (Without the budget the first trim evicted all 3,500.) */
START_TEST(test_trim_budget)
{
    struct store_owner o;
    int first, n, rounds = 0;
    trim_band_setup(&o, POLICY_LRU);
    first = engine_trim(s, 100);
    ck_assert_int_ge(first, 256);
    ck_assert_int_lt(first, 3500);
    ck_assert(s->trim_more);
    ck_assert_uint_gt(store_host_used(s), store_host_capacity(s) / 20);
    for (n = first; s->trim_more && rounds < 10000; rounds++)
        n += engine_trim(s, 100);
    ck_assert(!s->trim_more);
    ck_assert_int_ge(n, 3800);
    ck_assert_uint_le(store_host_used(s), store_host_capacity(s) / 20);
    printf("check_store: a trim of %d blocks in %d steps, the first %d\n", n, rounds + 1, first);
    check_invariants();
    store_owner_fini(s, &o);
}
END_TEST

/* A trim yields to a waiting request (store.trim_yield, which the server points at a poll of
 * its loop) every 16 actions, long before its budget: the request is answered, the trim goes
 * on after it (trim_more) down to the low watermark, and each stop is counted. */
static int yield_calls, yield_after;

static bool yield_when(void *arg)
{
    (void)arg;
    return ++yield_calls >= yield_after;
}

START_TEST(test_trim_yields_to_requests)
{
    struct store_owner o;
    int first, n, rounds = 0;
    trim_band_setup(&o, POLICY_LRU);
    s->trim_yield = yield_when;
    yield_calls = 0;
    yield_after = 2; /* nothing waits at the first check, a request at the second */
    first = engine_trim(s, 100);
    ck_assert_int_eq(first, 32);
    ck_assert_int_eq(yield_calls, 2);
    ck_assert(s->trim_more);
    ck_assert_uint_eq(s->total.trim_yields, 1);
    /* Requests keep coming: every trim still takes its 16. */
    yield_calls = 0;
    yield_after = 1;
    ck_assert_int_eq(engine_trim(s, 100), 16);
    ck_assert(s->trim_more);
    ck_assert_uint_eq(s->total.trim_yields, 2);
    /* None waits: the budget rules again, and the trims go down to the low watermark. */
    yield_after = INT32_MAX;
    n = first + 16;
    for (; s->trim_more && rounds < 10000; rounds++)
        n += engine_trim(s, 100);
    ck_assert(!s->trim_more);
    ck_assert_int_ge(n, 3800);
    ck_assert_uint_le(store_host_used(s), store_host_capacity(s) / 20);
    ck_assert_uint_eq(s->total.trim_yields, 2);
    s->trim_yield = NULL;
    check_invariants();
    store_owner_fini(s, &o);
    /* The policy engine's trim (rounds that may act on several blocks) stops the same way,
     * at its first check past 16 actions. */
    trim_band_setup(&o, POLICY_DEFAULT);
    ck_assert(store_policy_engine(s));
    s->trim_yield = yield_when;
    yield_calls = 0;
    yield_after = 1;
    first = engine_trim(s, 100);
    ck_assert_int_ge(first, 16);
    ck_assert_int_lt(first, 256);
    ck_assert_int_eq(yield_calls, 1);
    ck_assert(s->trim_more);
    ck_assert_uint_eq(s->total.trim_yields, 1);
    s->trim_yield = NULL;
    for (n = first, rounds = 0; s->trim_more && rounds < 10000; rounds++)
        n += engine_trim(s, 100);
    ck_assert_uint_le(store_host_used(s), store_host_capacity(s) / 20);
    check_invariants();
    store_owner_fini(s, &o);
}
END_TEST

/* Opening a namespace sizes the key map for the blocks the arena can hold at its block size
 * (store_index_reserve): filling the arena then rebuilds the map no more (a rebuild stalls
 * the loop, ~40 ms at a million blocks), where it used to rebuild at every doubling. */
START_TEST(test_ns_open_reserves_key_map)
{
    struct store_owner o;
    struct store_params p = s->p;
    struct kvc_wire_layout l = layout_fp16("small", 1, 0);
    bool created;
    uint64_t at_open;
    teardown();
    p.host_size = 256u << 20;
    p.high_watermark = 1.0;
    p.low_watermark = 0.9;
    s = store_fixture_new(&p, NULL);
    l.kv_heads = 1;
    l.head_dim = 64; /* 4 KiB blocks: 65,536 in the arena */
    ck_assert_int_eq(store_ns_open(s, &l, &ns, &created), 0);
    ck_assert_uint_eq(store_ns_get(s, ns)->block_bytes, 4096);
    at_open = s->ix.rebuilds;
    ck_assert_uint_ge(s->ix.nslots * 7ull, 65536ull * 10);
    store_owner_init(&o);
    for (uint32_t c = 0; c < 320; c++) /* 20,480 blocks: two doublings of the map past 8,192 */
        ck_assert_int_eq(put(&o, 1000 + c, 64, 0, c + 1), 64);
    ck_assert_uint_ge(s->ix.live, 20480);
    ck_assert_uint_eq(s->ix.rebuilds, at_open);
    check_invariants();
    store_owner_fini(s, &o);
}
END_TEST

/* A hit's touch moves the block in its list and leaves its entry in the shared index alone
 * (its slot, format and tier are unchanged): republishing it cost a probe of the index, a
 * cache miss a hit at a million blocks. Where the index once had no room for a block, the
 * touch gives it another try, as every publish does. */
/* The suite's store again, with the fast path's shared index. */
static void setup_fast_path(void)
{
    struct store_params p = s->p;
    teardown();
    p.fast_path = true;
    p.high_watermark = 1.0;
    p.low_watermark = 0.9;
    setup_with(&p);
}

START_TEST(test_touch_and_the_shared_index)
{
    struct store_owner o;
    struct fast_index_stats st;
    uint64_t lease;
    setup_fast_path();
    struct fast_index *fi = s->fast[0];
    ck_assert_ptr_nonnull(fi);
    store_owner_init(&o);
    ck_assert_int_eq(put(&o, 1, 4, 0, 1), 4);
    fast_index_stats_get(fi, &st);
    ck_assert_uint_eq(st.published, 4);
    ck_assert_uint_eq(st.full, 0);
    /* Touched with no loss yet: the touch writes nothing (an entry taken out behind the
     * store's back stays out, which a republish would have put back). */
    struct kvc_wire_key k1 = key(1, 0, 0);
    fast_unpublish(fi, (uint16_t)ns, &k1);
    ck_assert_int_eq(lookup(&o, 1, 4, 0, 2, &lease), 4);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    fast_index_stats_get(fi, &st);
    ck_assert_uint_eq(st.published, 3);
    fast_publish(fi, (uint16_t)ns, &k1, s->ix.blocks[index_find(&s->ix, (uint16_t)ns, &k1)].off,
                 BLOCK, KVC_WIRE_FORMAT_RAW);
    /* The index filled with other keys (namespace 7, never opened) until no more fit: the
     * next block committed finds no room and has no entry. */
    struct kvc_wire_key junk[4096];
    uint32_t nj = 0;
    for (; nj < 4096; nj++) {
        junk[nj] = (struct kvc_wire_key){.lo = 0x5bd1e995ull * (nj + 1), .hi = nj + 1};
        fast_publish(fi, 7, &junk[nj], (uint64_t)(nj % 64) << KVC_FAST_UNIT_SHIFT, 4096,
                     KVC_WIRE_FORMAT_RAW);
    }
    fast_index_stats_get(fi, &st);
    ck_assert_uint_gt(st.full, 0);
    uint64_t published = st.published, full = st.full;
    ck_assert_int_eq(put(&o, 2, 1, 0, 3), 1);
    fast_index_stats_get(fi, &st);
    ck_assert_uint_eq(st.published, published);
    ck_assert_uint_eq(st.full, full + 1);
    /* Room again; the block's touch publishes it. */
    for (uint32_t j = 0; j < nj; j++)
        fast_unpublish(fi, 7, &junk[j]);
    fast_index_stats_get(fi, &st);
    ck_assert_uint_eq(st.published, 4);
    ck_assert_int_eq(lookup(&o, 2, 1, 0, 4, &lease), 1);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    fast_index_stats_get(fi, &st);
    ck_assert_uint_eq(st.published, 5);
    check_invariants();
    store_owner_fini(s, &o);
}
END_TEST

/* A reader's check of block idx through index fi, mapped read-only as a client maps it: its
 * entry names its slot and the generation of the slot's granule is the entry's. */
static bool granule_entry_ok(const struct fast_index *fi, uint32_t idx)
{
    const struct block *b = &s->ix.blocks[idx];
    int fd = fast_index_fd_ro(fi);
    ck_assert_int_ge(fd, 0);
    uint64_t bytes = fast_index_bytes(fi);
    const uint8_t *map = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(map, MAP_FAILED);
    close(fd);
    const struct kvc_fast_hdr *h = (const struct kvc_fast_hdr *)map;
    const struct kvc_fast_ent *ents = (const struct kvc_fast_ent *)(map + h->ents_off);
    const uint32_t *gens = (const uint32_t *)(map + h->gens_off);
    uint64_t n = (uint64_t)h->nbuckets * KVC_FAST_WAYS + h->nstash;
    bool ok = false;
    ck_assert_uint_ge(h->gen_units, 1);
    ck_assert_uint_le(h->gens_off + kvc_fast_ngens(h->arena_bytes, h->gen_units) * 4, bytes);
    for (uint64_t i = 0; i < n; i++)
        if (ents[i].klo == b->key.lo && ents[i].khi == b->key.hi && ents[i].ns == b->ns)
            ok = (uint64_t)ents[i].unit << KVC_FAST_UNIT_SHIFT == b->off &&
                 gens[ents[i].unit / h->gen_units] == ents[i].gen;
    munmap((void *)map, bytes);
    return ok;
}

/* The arena's granule: the smallest slot it hands out, so the index keeps a generation (and
 * the owner map an entry) per block of that size, never two slots in one; a freed slot moves
 * its own granule's generation alone; a slot cut smaller than the granule (a size no
 * namespace announced) lowers it before that block is published: a new index of finer
 * generations, every block in it found with its generation. */
START_TEST(test_slot_granule)
{
    struct store_owner o;
    uint64_t lease;
    setup_fast_path();
    struct tier *t = s->arenas[0].tier;
    struct fast_index *fi = s->fast[0];
    ck_assert_uint_eq(s->arenas[0].gran, BLOCK);
    ck_assert_uint_eq(fast_index_gen_units(fi), BLOCK >> KVC_FAST_UNIT_SHIFT);
    store_owner_init(&o);
    ck_assert_int_eq(put(&o, 1, 8, 0, 1), 8);
    uint32_t idx[8];
    for (uint32_t i = 0; i < 8; i++) {
        struct kvc_wire_key k = key(1, i, 0);
        idx[i] = index_find(&s->ix, (uint16_t)ns, &k);
        ck_assert_uint_ne(idx[i], INDEX_NONE);
        ck_assert(granule_entry_ok(fi, idx[i]));
        /* The owner map answers a slot's start, not another offset in its granule. */
        ck_assert_uint_eq(store_slot_owner(s, 0, s->ix.blocks[idx[i]].off), idx[i]);
        ck_assert_uint_eq(store_slot_owner(s, 0, s->ix.blocks[idx[i]].off + 4096), INDEX_NONE);
    }
    /* A slot freed moves its granule's generation and no other block's. */
    uint32_t *gens = fast_index_gens(fi);
    uint64_t g0 = s->ix.blocks[idx[7]].off / BLOCK;
    uint32_t before = gens[g0];
    ck_assert_int_eq(store_block_drop(s, idx[7]), 0);
    ck_assert_uint_eq(gens[g0], before + 1);
    for (uint32_t i = 0; i < 7; i++)
        ck_assert(granule_entry_ok(fi, idx[i]));
    /* Block 6 moved by hand into a quarter-size slot, as a block read back from disk in a
     * codec its namespace does not announce would be: the arena's granule falls to it before
     * the block is published there, the index is replaced, and every block is found in the
     * new one with its generation. */
    struct block *b = &s->ix.blocks[idx[6]];
    struct tier_loc from = {.arena = 0, .cls = b->cls, .off = b->off, .len = b->len}, to;
    ck_assert_int_eq(t->ops->alloc(t, BLOCK / 4, &to), 0);
    store_lru_unlink(s, idx[6]);
    memcpy((uint8_t *)tier_host_base(t) + to.off, (uint8_t *)tier_host_base(t) + b->off,
           BLOCK / 4);
    t->ops->free(t, &from);
    b->off = to.off;
    b->len = (uint32_t)to.len;
    b->cls = to.cls;
    store_lru_push_head(s, idx[6]);
    ck_assert_uint_eq(s->arenas[0].gran, BLOCK / 4);
    ck_assert_ptr_ne(s->fast[0], fi); /* replaced (the old one retired and freed) */
    fi = s->fast[0];
    ck_assert_uint_eq(fast_index_gen_units(fi), (BLOCK / 4) >> KVC_FAST_UNIT_SHIFT);
    for (uint32_t i = 0; i < 7; i++) {
        ck_assert(granule_entry_ok(fi, idx[i]));
        ck_assert_uint_eq(store_slot_owner(s, 0, s->ix.blocks[idx[i]].off), idx[i]);
    }
    /* Data and hits as before. */
    ck_assert_int_eq(lookup(&o, 1, 7, 0, 2, &lease), 7);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    check_invariants();
    store_owner_fini(s, &o);
}
END_TEST

START_TEST(test_namespaces_and_layouts)
{
    struct kvc_wire_layout l = layout_fp16("m", 2, 0), other = layout_fp16("m", 3, 0), bad;
    uint32_t id;
    bool created;
    const char *why;
    uint64_t bb;
    ck_assert_int_eq(store_ns_open(s, &l, &id, &created), 0);
    ck_assert_uint_eq(id, ns);
    ck_assert(!created);
    ck_assert_int_eq(store_ns_open(s, &other, &id, &created), -EEXIST);
    bad = l;
    bad.layers = 0;
    ck_assert_int_eq(store_layout_check(&bad, 1 << 30, &bb, &why), -EINVAL);
    bad = l;
    bad.dtype = 99;
    ck_assert_int_eq(store_layout_check(&bad, 1 << 30, &bb, &why), -EINVAL);
    bad = l;
    memset(bad.model_id, 'x', sizeof(bad.model_id)); /* no NUL */
    ck_assert_int_eq(store_layout_check(&bad, 1 << 30, &bb, &why), -EINVAL);
    bad = layout_fp16("huge", 4096, 0);
    bad.kv_heads = 4096;
    bad.head_dim = 65536;
    bad.block_tokens = 65536; /* overflows 64 bits without care */
    ck_assert_int_eq(store_layout_check(&bad, 1 << 30, &bb, &why), -EINVAL);
    for (int i = 0; i < 7; i++) {
        char name[16];
        snprintf(name, sizeof(name), "n%d", i);
        struct kvc_wire_layout li = layout_fp16(name, 1, 0);
        ck_assert_int_eq(store_ns_open(s, &li, &id, &created), 0);
    }
    struct kvc_wire_layout full = layout_fp16("one-too-many", 1, 0);
    ck_assert_int_eq(store_ns_open(s, &full, &id, &created), -ENOSPC);
    ck_assert_ptr_null(store_ns_get(s, 0));
    ck_assert_ptr_null(store_ns_get(s, 999));
}
END_TEST

START_TEST(test_handle_limits)
{
    struct store_owner o;
    uint64_t lease;
    int got = 0;
    store_owner_init(&o);
    ck_assert_int_eq(put(&o, 1, 1, 0, 1), 1);
    for (int i = 0; i < 100; i++) {
        int r = lookup(&o, 1, 1, 0, 2, &lease);
        if (r < 0) {
            ck_assert_int_eq(r, -EMFILE);
            break;
        }
        got++;
    }
    ck_assert_int_eq(got, 64);
    store_owner_fini(s, &o);
    ck_assert_uint_eq(s->pins_now, 0);
}
END_TEST

/* Regression (a 32-bit pin count could wrap under a pin flood): a lookup stops at a block
 * pinned STORE_PIN_MAX times, counted as pin_saturated; the count never passes it. */
START_TEST(test_pin_count_cannot_wrap)
{
    struct store_owner o;
    struct kvc_wire_key k[4];
    uint64_t lease;
    store_owner_init(&o);
    ck_assert_int_eq(put(&o, 1, 4, 0, 1), 4);
    chain(k, 1, 4, 0);
    uint32_t b2 = index_find(&s->ix, (uint16_t)ns, &k[2]);
    s->ix.blocks[b2].pins = STORE_PIN_MAX; /* as if 2^31 leases held it */
    ck_assert_int_eq(lookup(&o, 1, 4, 0, 2, &lease), 2);
    ck_assert_uint_eq(s->total.pin_saturated, 1);
    ck_assert_uint_eq(s->ix.blocks[b2].pins, STORE_PIN_MAX);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    s->ix.blocks[b2].pins = 0;
    ck_assert_int_eq(lookup(&o, 1, 4, 0, 3, &lease), 4);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    ck_assert_uint_eq(s->pins_now, 0);
    store_owner_fini(s, &o);
}
END_TEST

/* struct block keeps 24 bits of hits: the count stops at BLOCK_HITS_MAX instead of wrapping
 * to 0 (which would make the most used block look never used). */
START_TEST(test_hit_count_saturates)
{
    struct store_owner o;
    struct kvc_wire_key k[1];
    uint64_t lease;
    store_owner_init(&o);
    ck_assert_int_eq(put(&o, 1, 1, 0, 1), 1);
    chain(k, 1, 1, 0);
    uint32_t b = index_find(&s->ix, (uint16_t)ns, &k[0]);
    s->ix.blocks[b].hits = BLOCK_HITS_MAX - 1;
    for (uint64_t t = 2; t < 5; t++) {
        ck_assert_int_eq(lookup(&o, 1, 1, 0, t, &lease), 1);
        ck_assert_int_eq(store_release(s, &o, lease), 0);
    }
    ck_assert_uint_eq(s->ix.blocks[b].hits, BLOCK_HITS_MAX);
    store_owner_fini(s, &o);
}
END_TEST

/* A daemon without a disk tier keeps no disk record table (store.rec: 8 bytes a block index
 * with one); puts, hits and evictions leave it unallocated. */
START_TEST(test_no_disk_no_record_table)
{
    struct store_owner o;
    uint64_t lease;
    store_owner_init(&o);
    for (uint32_t c = 1; c <= 80; c++) /* 80 chains of 2 in 64 blocks' room: evictions */
        ck_assert_int_eq(put(&o, c, 2, 0, c), 2);
    ck_assert_int_eq(lookup(&o, 80, 2, 0, 100, &lease), 2);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    ck_assert_uint_gt(s->total.evicted_blocks, 0);
    ck_assert_ptr_null(s->rec);
    ck_assert_uint_eq(s->nrec, 0);
    store_owner_fini(s, &o);
}
END_TEST

/* A block's offset keeps 48 bits: an arena whose offsets would not fit is refused. */
START_TEST(test_arena_offset_bound)
{
    struct store_params p = s->p;
    uint32_t id;
    int err = 0;
    p.host_size = BLOCK_OFF_MAX + 2;
    ck_assert_ptr_null(store_new(&p, &err));
    ck_assert_int_eq(err, -EINVAL);
    ck_assert_int_eq(store_arena_add(s, BLOCK_OFF_MAX + 2, &id), -EINVAL);
    ck_assert_uint_eq(s->narenas, 1);
}
END_TEST

/* kvcctl ns drop: every block of the namespace goes, leaves first up the chains, in one
 * pass; pinned or reserved blocks keep it (-EBUSY, nothing else lost); its id is free after. */
START_TEST(test_ns_drop)
{
    struct store_owner o;
    struct kvc_wire_key k[8], zero = {0, 0};
    struct kvc_wire_loc locs[8];
    uint8_t st[8];
    uint64_t lease, resv, dropped;
    struct kvc_wire_layout l2 = layout_fp16("other", 2, 0);
    uint32_t ns2, id;
    bool created;
    store_owner_init(&o);
    ck_assert_int_eq(store_ns_open(s, &l2, &ns2, &created), 0);
    ck_assert_int_eq(put(&o, 1, 6, 3, 1), 6);
    ck_assert_int_eq(put(&o, 2, 6, 3, 2), 3); /* a branch after 3 shared blocks */
    uint64_t used = s->arenas[0].tier->ops->usage(s->arenas[0].tier);
    ck_assert_uint_eq(used, 9 * BLOCK);
    /* A lease on the namespace keeps it (the pinned chain and its parents stay). */
    ck_assert_int_eq(lookup(&o, 1, 6, 3, 3, &lease), 6);
    ck_assert_int_eq(store_ns_drop(s, ns, &dropped), -EBUSY);
    ck_assert_uint_eq(dropped, 3); /* the unpinned branch */
    ck_assert_ptr_nonnull(store_ns_get(s, ns));
    check_invariants();
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    /* A reservation keeps it too. */
    chain(k, 3, 2, 0);
    ck_assert_int_eq(store_reserve(s, &o, ns, &zero, k, 2, 4, &resv, st, locs), 2);
    ck_assert_int_eq(store_ns_drop(s, ns, &dropped), -EBUSY);
    ck_assert_uint_eq(dropped, 6);
    ck_assert_int_eq(store_abort(s, &o, resv), 0);
    ck_assert_int_eq(store_ns_drop(s, ns, &dropped), 0);
    ck_assert_uint_eq(dropped, 0);
    ck_assert_ptr_null(store_ns_get(s, ns));
    ck_assert_uint_eq(s->arenas[0].tier->ops->usage(s->arenas[0].tier), 0);
    ck_assert_uint_eq(s->ix.live, 0);
    ck_assert_int_eq(store_ns_drop(s, ns, &dropped), -ENOENT);
    ck_assert_ptr_nonnull(store_ns_get(s, ns2)); /* the other one is untouched */
    /* The id is free for the next namespace. */
    struct kvc_wire_layout l3 = layout_fp16("third", 2, 0);
    ck_assert_int_eq(store_ns_open(s, &l3, &id, &created), 0);
    ck_assert(created);
    ck_assert_uint_eq(id, ns);
    store_owner_fini(s, &o);
}
END_TEST

/* A page of the arena faulted under the daemon (tiers/host.h): unpinned blocks there go,
 * pinned ones stay as they are. */
START_TEST(test_arena_fault)
{
    struct store_owner o;
    uint64_t lease;
    struct kvc_wire_key k[4];
    store_owner_init(&o);
    ck_assert_int_eq(put(&o, 1, 4, 0, 1), 4);
    chain(k, 1, 4, 0);
    uint32_t b3 = index_find(&s->ix, (uint16_t)ns, &k[3]);
    uint64_t off = s->ix.blocks[b3].off;
    ck_assert_uint_eq(engine_arena_fault(s, 0, off + 4096, 4096), 1);
    ck_assert_uint_eq(index_find(&s->ix, (uint16_t)ns, &k[3]), INDEX_NONE);
    ck_assert_int_eq(lookup(&o, 1, 4, 0, 2, &lease), 3);
    uint32_t b2 = index_find(&s->ix, (uint16_t)ns, &k[2]);
    ck_assert_uint_eq(engine_arena_fault(s, 0, s->ix.blocks[b2].off, 4096), 1);
    ck_assert_uint_ne(index_find(&s->ix, (uint16_t)ns, &k[2]), INDEX_NONE);     /* pinned */
    ck_assert_uint_eq(engine_arena_fault(s, 1, s->ix.blocks[b2].off, 4096), 0); /* other arena */
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    check_invariants();
    store_owner_fini(s, &o);
}
END_TEST

/* ---- a chain under a slot its client has not committed yet (issue 26) ---------------- */

/* Keys [first, first + n) of chain c reserved by o under parent key(c, first - 1) (none
 * when first is 0), each slot written; returns what store_reserve did. */
static int reserve_at(struct store_owner *o, uint32_t c, uint32_t first, uint32_t n, uint64_t now,
                      uint64_t *resv, uint8_t *st)
{
    struct kvc_wire_key k[64], parent = {0, 0};
    struct kvc_wire_loc locs[64];
    for (uint32_t i = 0; i < n; i++)
        k[i] = key(c, first + i, 0);
    if (first)
        parent = key(c, first - 1, 0);
    int r = store_reserve(s, o, ns, &parent, k, n, now, resv, st, locs);
    fill(k, st, locs, n);
    return r;
}

static uint32_t block_of(uint32_t c, uint32_t i)
{
    struct kvc_wire_key k = key(c, i, 0);
    return index_find(&s->ix, (uint16_t)ns, &k);
}

/* Reserved slots, by the gauge and by the counters: what is reserved is neither committed
 * nor aborted. */
static void check_reserved(uint64_t want)
{
    const struct stats *t = &s->total;
    ck_assert_uint_eq(s->reserved_now, want);
    ck_assert_uint_eq(t->reserved_blocks - t->committed_blocks - t->aborted_blocks, want);
}

/* A prompt's second chunk reserves under the last block of its first while that one's
 * commit is still to come; it commits after it (EAGAIN before, the reservation intact),
 * and the whole prefix is then a hit, byte for byte, with the tree whole. */
START_TEST(test_chain_under_own_reserved_parent)
{
    struct store_owner a, b;
    uint8_t st[16];
    uint64_t r1, r2, lease;
    uint32_t dropped;
    store_owner_init(&a);
    store_owner_init(&b);
    ck_assert_int_eq(reserve_at(&a, 1, 0, 4, 1, &r1, st), 4);
    ck_assert_int_eq(reserve_at(&a, 1, 4, 4, 2, &r2, st), 4);
    ck_assert_uint_ne(r2, 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(st[i], KVC_WIRE_SLOT_RESERVED);
    ck_assert_uint_eq(s->total.reserved_chained_blocks, 4);
    ck_assert_uint_eq(s->total.skipped_parent_busy_blocks, 0);
    uint32_t p = block_of(1, 3), c = block_of(1, 4);
    ck_assert_uint_eq(s->ix.blocks[p].pins, 1); /* the chunk after it holds it */
    ck_assert_uint_eq(s->ix.blocks[c].parent, p);
    ck_assert_uint_eq(s->ix.blocks[c].depth, 4);
    check_invariants();
    /* Before its parent: refused, nothing done, still a's. */
    ck_assert_int_eq(store_commit(s, &a, r2, UINT32_MAX, 3, &dropped), -EAGAIN);
    ck_assert_uint_eq(s->total.commit_parent_busy, 1);
    ck_assert_int_eq(store_commit(s, &a, r2, 2, 3, &dropped), -EAGAIN);
    check_reserved(8);
    ck_assert_int_eq(lookup(&b, 1, 8, 0, 4, &lease), 0);
    ck_assert_int_eq(store_commit(s, &a, r1, UINT32_MAX, 5, &dropped), 4);
    ck_assert_uint_eq(s->ix.blocks[p].state, BLOCK_STATE_COMMITTED);
    ck_assert_uint_eq(s->ix.blocks[p].pins, 1); /* still: eviction cannot take it */
    ck_assert_uint_eq(s->ix.blocks[p].children, 0);
    ck_assert_int_eq(lookup(&b, 1, 8, 0, 6, &lease), 4); /* the second chunk: not yet */
    ck_assert_int_eq(store_release(s, &b, lease), 0);
    check_invariants();
    ck_assert_int_eq(store_commit(s, &a, r2, UINT32_MAX, 7, &dropped), 4);
    ck_assert_uint_eq(dropped, 0);
    ck_assert_uint_eq(s->ix.blocks[p].pins, 0);
    ck_assert_uint_eq(s->ix.blocks[p].children, 1); /* the second chunk's first block */
    ck_assert_int_eq(lookup(&b, 1, 8, 0, 8, &lease), 8);
    ck_assert_int_eq(store_release(s, &b, lease), 0);
    check_reserved(0);
    check_invariants();
    ck_assert_uint_eq(s->pins_now, 0);
    ck_assert_ptr_null(store_heap_check(s));
    store_owner_fini(s, &a);
    store_owner_fini(s, &b);
}
END_TEST

/* Another client's slot is never a parent: its RESERVE skips every key as before (counted as
 * under a busy parent), takes no pin, and learns nothing more, even when it holds a
 * reservation in the handle slot the writer's reservation has (a block names its handle by
 * slot). Once the writer commits, the same RESERVE gets its slots. */
START_TEST(test_chain_under_other_clients_slot_refused)
{
    struct store_owner a, b;
    uint8_t st[16];
    uint64_t ra, rb0, rb;
    uint32_t dropped;
    store_owner_init(&a);
    store_owner_init(&b);
    ck_assert_int_eq(reserve_at(&b, 2, 0, 8, 1, &rb0, st), 8); /* b's handle slot 0 */
    ck_assert_int_eq(reserve_at(&a, 1, 0, 4, 2, &ra, st), 4);  /* a's handle slot 0 */
    ck_assert_uint_eq((uint32_t)ra, (uint32_t)rb0);
    ck_assert_int_eq(reserve_at(&b, 1, 4, 4, 3, &rb, st), 0);
    ck_assert_uint_eq(rb, 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(st[i], KVC_WIRE_SLOT_SKIPPED);
    ck_assert_uint_eq(s->total.skipped_parent_busy_blocks, 4);
    ck_assert_uint_eq(s->total.reserved_chained_blocks, 0);
    ck_assert_uint_eq(s->ix.blocks[block_of(1, 3)].pins, 0);
    ck_assert_uint_eq(block_of(1, 4), INDEX_NONE);
    ck_assert_uint_eq(b.live, 1);
    check_reserved(12);
    /* a's commit is a's own: b's end cannot touch it, nor a's abort b's. */
    ck_assert_int_eq(store_abort(s, &b, rb0), 0);
    ck_assert_int_eq(store_commit(s, &a, ra, UINT32_MAX, 4, &dropped), 4);
    ck_assert_int_eq(reserve_at(&b, 1, 4, 4, 5, &rb, st), 4);
    ck_assert_uint_eq(s->total.reserved_chained_blocks, 0); /* under a committed parent */
    ck_assert_int_eq(store_commit(s, &b, rb, UINT32_MAX, 6, &dropped), 4);
    check_reserved(0);
    check_invariants();
    store_owner_fini(s, &a);
    store_owner_fini(s, &b);
    ck_assert_uint_eq(s->pins_now, 0);
}
END_TEST

/* The reservation a chain hangs from is aborted: every slot below it goes with it, down a
 * chain of three chunks whose reservations sit in handle slots in the reverse order (so the
 * slots go level by level), and nothing is left reserved, pinned or in the map. The
 * orphaned reservations stay their owner's, empty: a commit commits nothing and says every
 * slot was dropped. Their keys are free for any writer. */
START_TEST(test_chain_parent_abort_drops_children)
{
    struct store_owner a, b;
    uint8_t st[16];
    uint64_t d0, d1, r1, r2, r3, lease;
    uint32_t dropped;
    uint64_t used = store_host_used(s);
    store_owner_init(&a);
    store_owner_init(&b);
    ck_assert_int_eq(reserve_at(&a, 7, 0, 1, 1, &d0, st), 1); /* handle slot 0 */
    ck_assert_int_eq(reserve_at(&a, 8, 0, 1, 1, &d1, st), 1); /* slot 1 */
    ck_assert_int_eq(reserve_at(&a, 1, 0, 4, 1, &r1, st), 4); /* slot 2 */
    ck_assert_int_eq(store_abort(s, &a, d1), 0);
    ck_assert_int_eq(reserve_at(&a, 1, 4, 4, 2, &r2, st), 4); /* slot 1, under r1 */
    ck_assert_int_eq(store_abort(s, &a, d0), 0);
    ck_assert_int_eq(reserve_at(&a, 1, 8, 4, 3, &r3, st), 4); /* slot 0, under r2 */
    ck_assert_uint_eq((uint32_t)r3, 0);
    ck_assert_uint_eq((uint32_t)r2, 1);
    ck_assert_uint_eq(s->total.reserved_chained_blocks, 8);
    ck_assert_uint_eq(s->pins_now, 2);
    check_reserved(12);
    check_invariants();
    ck_assert_int_eq(store_abort(s, &a, r1), 0);
    check_reserved(0);
    ck_assert_uint_eq(s->pins_now, 0);
    ck_assert_uint_eq(store_host_used(s), used);
    for (uint32_t i = 0; i < 12; i++)
        ck_assert_uint_eq(block_of(1, i), INDEX_NONE);
    ck_assert_uint_eq(a.live, 2); /* r2 and r3, empty */
    ck_assert_uint_eq(a.orphans, 0);
    /* Their keys are anyone's now. */
    ck_assert_int_eq(reserve_at(&b, 1, 0, 12, 4, &lease, st), 12);
    ck_assert_int_eq(store_abort(s, &b, lease), 0);
    ck_assert_int_eq(store_commit(s, &a, r2, UINT32_MAX, 5, &dropped), 0);
    ck_assert_uint_eq(dropped, 4);
    ck_assert_int_eq(store_abort(s, &a, r3), 0);
    ck_assert_uint_eq(a.live, 0);
    ck_assert_int_eq(lookup(&b, 1, 12, 0, 6, &lease), 0);
    check_reserved(0);
    check_invariants();
    store_owner_fini(s, &a);
    store_owner_fini(s, &b);
}
END_TEST

/* A commit of the parent's reservation cut short drops the slots after its cut, and with
 * them the chunk that hangs from its last one; a chain hanging from a slot it committed
 * stays, and commits. A client that dies holding chains (parents before or after their
 * children among its handles) leaves nothing reserved or pinned. */
START_TEST(test_chain_short_commit_and_client_death)
{
    struct store_owner a;
    struct kvc_wire_key k[4], parent = key(1, 1, 0);
    struct kvc_wire_loc locs[4];
    uint8_t st[16];
    uint64_t r1, r2, r3, d0, lease;
    uint32_t dropped;
    uint64_t used = store_host_used(s);
    store_owner_init(&a);
    ck_assert_int_eq(reserve_at(&a, 1, 0, 4, 1, &r1, st), 4);
    ck_assert_int_eq(reserve_at(&a, 1, 4, 4, 2, &r2, st), 4); /* under block 3 */
    /* Another prompt, under block 1. */
    chain(k, 2, 4, 0);
    ck_assert_int_eq(store_reserve(s, &a, ns, &parent, k, 4, 3, &r3, st, locs), 4);
    fill(k, st, locs, 4);
    ck_assert_int_eq(store_commit(s, &a, r1, 2, 4, &dropped), 2);
    ck_assert_uint_eq(dropped, 2);
    check_reserved(4); /* r3's */
    ck_assert_int_eq(store_commit(s, &a, r2, UINT32_MAX, 5, &dropped), 0);
    ck_assert_uint_eq(dropped, 4);
    ck_assert_int_eq(store_commit(s, &a, r3, UINT32_MAX, 6, &dropped), 4);
    ck_assert_uint_eq(s->ix.blocks[block_of(1, 1)].children, 1); /* r3's first, not block 2 */
    ck_assert_uint_eq(block_of(1, 2), INDEX_NONE);
    check_reserved(0);
    check_invariants();
    ck_assert_uint_eq(s->pins_now, 0);
    store_owner_fini(s, &a);

    /* Death: parent in handle slot 0, its child in slot 1 ... */
    store_owner_init(&a);
    ck_assert_int_eq(reserve_at(&a, 3, 0, 2, 7, &r1, st), 2);
    ck_assert_int_eq(reserve_at(&a, 3, 2, 2, 8, &r2, st), 2);
    /* ... and a child in slot 2 whose parent reservation sits in slot 3. */
    ck_assert_int_eq(reserve_at(&a, 9, 0, 1, 9, &d0, st), 1);
    ck_assert_int_eq(reserve_at(&a, 4, 0, 2, 9, &r3, st), 2);
    ck_assert_int_eq(store_abort(s, &a, d0), 0);
    ck_assert_int_eq(reserve_at(&a, 4, 2, 2, 10, &r1, st), 2);
    ck_assert_uint_eq((uint32_t)r1, 2);
    ck_assert_uint_eq(s->pins_now, 2);
    store_owner_fini(s, &a);
    check_reserved(0);
    ck_assert_uint_eq(s->pins_now, 0);
    ck_assert_uint_eq(store_host_used(s) - used, 6 * (uint64_t)BLOCK); /* the 6 committed */
    store_owner_init(&a);
    ck_assert_int_eq(lookup(&a, 3, 4, 0, 11, &lease), 0);
    ck_assert_int_eq(lookup(&a, 4, 4, 0, 11, &lease), 0);
    check_invariants();
    store_owner_fini(s, &a);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("store");
    TCase *tc = tcase_create("store");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_put_lookup_release);
    tcase_add_test(tc, test_reserved_invisible_busy_and_dedup);
    tcase_add_test(tc, test_reserve_writing);
    tcase_add_test(tc, test_orphan_parent_and_abort);
    tcase_add_test(tc, test_eviction_keeps_prefix_tree);
    tcase_add_test(tc, test_nospace_when_all_pinned);
    tcase_add_test(tc, test_watermarks_trim);
    tcase_add_test(tc, test_trim_budget);
    tcase_add_test(tc, test_trim_yields_to_requests);
    tcase_add_test(tc, test_ns_open_reserves_key_map);
    tcase_add_test(tc, test_namespaces_and_layouts);
    tcase_add_test(tc, test_handle_limits);
    tcase_add_test(tc, test_pin_count_cannot_wrap);
    tcase_add_test(tc, test_hit_count_saturates);
    tcase_add_test(tc, test_arena_offset_bound);
    tcase_add_test(tc, test_no_disk_no_record_table);
    tcase_add_test(tc, test_ns_drop);
    tcase_add_test(tc, test_arena_fault);
    tcase_add_test(tc, test_touch_and_the_shared_index);
    tcase_add_test(tc, test_slot_granule);
    tcase_add_test(tc, test_chain_under_own_reserved_parent);
    tcase_add_test(tc, test_chain_under_other_clients_slot_refused);
    tcase_add_test(tc, test_chain_parent_abort_drops_children);
    tcase_add_test(tc, test_chain_short_commit_and_client_death);
    suite_add_tcase(su, tc);
    return daemon_suite_run(su);
}
