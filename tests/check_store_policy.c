/* check_store_policy — the policies inside the store, without a socket: under random
 * operations with every policy, the engine never evicts or quantizes a pinned block, never
 * evicts a parent before its cached children, never makes a block lossy in a namespace that
 * allows no codec; hints change what survives; budgeted lookups take sinks, the recent window
 * and the most important middle blocks; quantized blocks carry a Quest summary; per-namespace
 * policies and their sources. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine.h"
#include "daemon/quant.h"
#include "daemon/store.h"
#include "tests/lib/daemon.h"
#include "tests/lib/layout.h"
#include "tests/lib/store_fixture.h"
#include "tiers/host.h"
#include "tiers/tier.h"

#define Q8                                                                                         \
    KVC_WIRE_QUANT_FLAGS(1u << KVC_WIRE_FORMAT_Q8_0, KVC_WIRE_FORMAT_Q8_0, KVC_WIRE_FORMAT_Q8_0, 0)

static struct store *s;
static struct quant *q;
static struct store_owner o;

static void setup_policy(enum policy_kind k)
{
    struct store_params p = store_fixture_params();
    p.low_watermark = 0.6;
    p.max_handles = 1024;
    p.policy = k;
    p.recompute_tokens_per_s = 8000;
    p.quantize_inflight = 8;
    s = store_fixture_new(&p, &q);
    store_owner_init(&o);
}

static void setup(void)
{
    setup_policy(POLICY_DEFAULT);
}

static void teardown(void)
{
    store_fixture_free(s, &o);
    s = NULL;
    q = NULL;
}

static uint32_t ns_open(const char *model, uint32_t flags)
{
    return store_fixture_ns(s, model, 2, flags);
}

static struct kvc_wire_key key(uint32_t ns, uint32_t chain, uint32_t i)
{
    return (struct kvc_wire_key){.lo = 100000u * ns + 1000u * chain + i + 1, .hi = 7};
}

static void fill(uint16_t *p, size_t n, uint32_t seed)
{
    for (size_t j = 0; j < n; j++) {
        _Float16 h = (_Float16)(sinf((float)(j * 0.37 + seed)) * 3.0f);
        memcpy(&p[j], &h, 2);
    }
}

/* Puts blocks [from, to) of a chain; returns how many were committed. */
static int put_chain(uint32_t ns, uint32_t chain, uint32_t from, uint32_t to, uint64_t now)
{
    struct kvc_wire_key parent = from ? key(ns, chain, from - 1) : (struct kvc_wire_key){0};
    struct kvc_wire_key k[64] = {{0}};
    struct kvc_wire_loc loc[64] = {{0}};
    uint8_t st[64] = {0};
    uint64_t resv;
    uint32_t dropped;
    int n = 0;
    for (uint32_t i = from; i < to; i++)
        k[i - from] = key(ns, chain, i);
    int r = store_reserve(s, &o, ns, &parent, k, to - from, now, &resv, st, loc);
    if (r <= 0)
        return 0;
    for (uint32_t i = 0; i < to - from; i++)
        if (st[i] == KVC_WIRE_SLOT_RESERVED)
            fill((uint16_t *)((uint8_t *)tier_host_base(s->arenas[loc[i].arena_id].tier) +
                              loc[i].offset),
                 loc[i].length / 2, from + i);
    n = store_commit(s, &o, resv, UINT32_MAX, now, &dropped);
    ck_assert_int_ge(n, 0);
    return n;
}

static bool committed(uint32_t ns, struct kvc_wire_key k)
{
    uint32_t idx = index_find(&s->ix, (uint16_t)ns, &k);
    return idx != INDEX_NONE && s->ix.blocks[idx].state == BLOCK_STATE_COMMITTED;
}

/* The prefix tree, children counts and the lossless namespace, over every block. */
static void check_tree(uint32_t raw_ns)
{
    for (uint32_t i = 0; i < s->ix.nblocks; i++) {
        const struct block *b = &s->ix.blocks[i];
        uint32_t kids = 0;
        if (b->state != BLOCK_STATE_COMMITTED)
            continue;
        if (b->parent != INDEX_NONE)
            ck_assert_msg(committed(b->ns, s->ix.blocks[b->parent].key), "block %u lost its parent",
                          i);
        if (b->ns == raw_ns)
            ck_assert_msg(b->format == KVC_WIRE_FORMAT_RAW, "raw namespace block %u lossy", i);
        for (uint32_t j = 0; j < s->ix.nblocks; j++) {
            const struct block *c = &s->ix.blocks[j];
            kids += c->state == BLOCK_STATE_COMMITTED && c->parent == i;
        }
        ck_assert_uint_eq(kids, b->children);
    }
}

#define NCHAIN 24
#define CHAIN_LEN 8
#define NLEASE 6

/* Random puts, lookups (some leases held across trims), releases, hints and trims. */
START_TEST(test_random_ops_every_policy)
{
    enum policy_kind k = (enum policy_kind)_i;
    struct {
        uint64_t id;
        uint32_t ns, chain, n;
    } held[NLEASE] = {0};
    unsigned seed = 7 + (unsigned)k;
    uint32_t len[2][NCHAIN] = {{0}};
    setup_policy(k);
    uint32_t nraw = ns_open("raw", 0), nq = ns_open("q8", Q8);
    uint32_t nss[2] = {nraw, nq};
    ck_assert_int_eq(store_ns_get(s, nraw)->policy, k);
    for (int step = 0; step < 1500; step++) {
        uint64_t now = 10 + (uint64_t)step * 7;
        int w = (int)(rand_r(&seed) % 2), c = (int)(rand_r(&seed) % NCHAIN);
        uint32_t ns = nss[w];
        /* a chain may have lost blocks: continue from what is cached */
        while (len[w][c] && !committed(ns, key(ns, (uint32_t)c, len[w][c] - 1)))
            len[w][c]--;
        switch (rand_r(&seed) % 5) {
        case 0:
        case 1: {
            uint32_t to = len[w][c] + 1 + rand_r(&seed) % 3;
            if (to > CHAIN_LEN)
                to = CHAIN_LEN;
            if (to > len[w][c])
                len[w][c] += (uint32_t)put_chain(ns, (uint32_t)c, len[w][c], to, now);
            break;
        }
        case 2: {
            struct kvc_wire_key ks[CHAIN_LEN];
            struct kvc_wire_loc locs[CHAIN_LEN];
            uint64_t lease;
            int slot = (int)(rand_r(&seed) % NLEASE);
            for (uint32_t i = 0; i < CHAIN_LEN; i++)
                ks[i] = key(ns, (uint32_t)c, i);
            if (held[slot].id) {
                ck_assert_int_eq(store_release(s, &o, held[slot].id), 0);
                held[slot].id = 0;
            }
            int h = engine_lookup(s, &o, ns, ks, CHAIN_LEN, now, &lease, locs);
            ck_assert_int_ge(h, 0);
            if (h > 0)
                held[slot] = (typeof(held[0])){lease, ns, (uint32_t)c, (uint32_t)h};
            break;
        }
        case 3: {
            struct kvc_wire_hint hs[CHAIN_LEN];
            for (uint32_t i = 0; i < CHAIN_LEN; i++)
                hs[i] = (struct kvc_wire_hint){.key = key(ns, (uint32_t)c, i),
                                               .score = (float)(rand_r(&seed) % 100)};
            ck_assert_int_ge(store_hint(s, ns, 1 + rand_r(&seed) % 2, hs, CHAIN_LEN, now), 0);
            break;
        }
        default: {
            /* budgeted read with a random budget: what it returns is cached and ascending */
            struct kvc_wire_key ks[CHAIN_LEN];
            struct kvc_wire_loc locs[CHAIN_LEN];
            uint32_t pos[CHAIN_LEN], np;
            uint64_t lease;
            for (uint32_t i = 0; i < CHAIN_LEN; i++)
                ks[i] = key(ns, (uint32_t)c, i);
            int n = store_lookup_budget(s, &o, ns, ks, CHAIN_LEN, 1 + rand_r(&seed) % 4, -1, 1, 1,
                                        NULL, 0, now, &lease, &np, pos, locs);
            ck_assert_int_ge(n, 0);
            for (int i = 1; i < n; i++)
                ck_assert_uint_gt(pos[i], pos[i - 1]);
            if (n)
                ck_assert_int_eq(store_release(s, &o, lease), 0);
            break;
        }
        }
        engine_trim(s, now);
        if (step % 16 == 0)
            quant_drain(q);
        else
            quant_poll(q);
        /* pinned blocks survive every trim and are never quantized under the lease */
        for (int l = 0; l < NLEASE; l++)
            for (uint32_t i = 0; held[l].id && i < held[l].n; i++)
                ck_assert_msg(committed(held[l].ns, key(held[l].ns, held[l].chain, i)),
                              "%s: a pinned block was evicted", policy_name(k));
        if (step % 50 == 0)
            check_tree(nraw);
        const char *why = store_heap_check(s);
        ck_assert_msg(!why, "%s: step %d: %s", policy_name(k), step, why);
        if (step == 700 && k != POLICY_LRU) { /* a policy change rebuilds (LRU: empties) */
            ck_assert_int_eq(store_ns_policy_set(s, nraw, POLICY_LRU, STORE_POLICY_SRC_ADMIN), 0);
            ck_assert_uint_eq(store_ns_get(s, nraw)->heap.n, 0);
            ck_assert_ptr_null(store_heap_check(s));
            ck_assert_int_eq(store_ns_policy_set(s, nraw, (int)k, STORE_POLICY_SRC_ADMIN), 0);
        }
        if (step == 1100) { /* a reload changes every namespace that follows cache.policy */
            struct store_params p = s->p;
            p.policy = k == POLICY_LFU ? POLICY_DEFAULT : POLICY_LFU;
            store_reload(s, &p);
            ck_assert_int_eq(store_ns_get(s, nq)->policy, p.policy);
            ck_assert_ptr_null(store_heap_check(s));
            /* rebuilt with every leaf that may go (none when every one left or is pinned) */
            uint32_t leaves = 0, pinned = 0, inner = 0;
            for (uint32_t i = 0; i < s->ix.nblocks; i++) {
                const struct block *b = &s->ix.blocks[i];
                if (b->ns != nq || b->state != BLOCK_STATE_COMMITTED ||
                    b->arena != store_ns_get(s, nq)->arena || (b->flags & BLOCK_F_LOST))
                    continue;
                inner += b->children != 0;
                pinned += !b->children && b->pins;
                leaves += !b->children && !b->pins;
            }
            ck_assert_msg(store_ns_get(s, nq)->heap.n == leaves,
                          "%s: heap of %u, %u unpinned leaves (%u pinned, %u inner)",
                          policy_name(k), store_ns_get(s, nq)->heap.n, leaves, pinned, inner);
        }
    }
    quant_drain(q);
    check_tree(nraw);
    /* pressure did happen and, with codecs allowed, something was made smaller or dropped */
    ck_assert_uint_gt(s->total.evicted_blocks + s->total.quantized_blocks, 0);
    teardown();
}
END_TEST

/* store_victim never names a pinned block or a parent, whatever the policy. */
START_TEST(test_victim_unpinned_leaf)
{
    enum policy_kind k = (enum policy_kind)_i;
    setup_policy(k);
    uint32_t ns = ns_open("v", 0);
    struct kvc_wire_key ks[4];
    struct kvc_wire_loc locs[4];
    uint64_t lease;
    for (uint32_t c = 0; c < 12; c++) /* 48 blocks of 64 KiB in 4 MiB: no eviction yet */
        ck_assert_int_eq(put_chain(ns, c, 0, 4, 10 + c), 4);
    for (uint32_t i = 0; i < 4; i++)
        ks[i] = key(ns, 0, i);
    ck_assert_int_eq(engine_lookup(s, &o, ns, ks, 4, 100, &lease, locs), 4);
    /* every unpinned block goes, leaves first, and nothing else: 44 victims, then none */
    int evicted = 0;
    for (int round = 0; round < 60; round++) {
        uint32_t v = engine_victim(s, 0, -1, 200);
        if (v == INDEX_NONE)
            break;
        ck_assert_uint_eq(s->ix.blocks[v].pins, 0);
        ck_assert_uint_eq(s->ix.blocks[v].children, 0);
        engine_evict(s, v);
        evicted++;
    }
    ck_assert_int_eq(evicted, 44);
    for (uint32_t i = 0; i < 4; i++)
        ck_assert(committed(ns, ks[i]));
    teardown();
}
END_TEST

/* The victim is the policy's first among every evictable leaf of the namespace, however far
 * from the LRU tail it sits (the namespace heap), and the next one when that one is pinned. */
START_TEST(test_victim_exact_order)
{
    enum policy_kind k = _i ? POLICY_DEFAULT : POLICY_LFU;
    setup_policy(k);
    uint32_t ns = ns_open("x", 0);
    struct store_ns *n = store_ns_get(s, ns);
    struct kvc_wire_key kk;
    struct kvc_wire_loc loc;
    uint64_t lease, hot_lease = 0;
    /* 20 one-block chains hit often, then 30 never hit: the LRU tail holds only hit blocks,
     * the policy's first is the oldest of the others */
    for (uint32_t c = 0; c < 20; c++)
        ck_assert_int_eq(put_chain(ns, c, 0, 1, 10 + c), 1);
    for (uint32_t r = 0; r < 6; r++)
        for (uint32_t c = 0; c < 20; c++) {
            kk = key(ns, c, 0);
            ck_assert_int_eq(engine_lookup(s, &o, ns, &kk, 1, 60 + r * 10 + c, &lease, &loc), 1);
            if (r == 5 && c == 0)
                hot_lease = lease; /* held: chain 0 stays pinned */
            else
                ck_assert_int_eq(store_release(s, &o, lease), 0);
        }
    for (uint32_t c = 20; c < 50; c++)
        ck_assert_int_eq(put_chain(ns, c, 0, 1, 200 + c), 1);
    n->pp.half_life = 1e6; /* counts dominate: the exact order is far from the LRU tail */
    for (int round = 0; round < 30; round++) {
        uint32_t best = INDEX_NONE;
        double bk = 0;
        for (uint32_t i = 0; i < s->ix.nblocks; i++) {
            const struct block *b = &s->ix.blocks[i];
            struct policy_block pb;
            if (b->state != BLOCK_STATE_COMMITTED || b->ns != ns || b->pins || b->children)
                continue;
            store_policy_block(s, i, &pb);
            double key_i = policy_key(k, &pb, &n->pp);
            if (best == INDEX_NONE || key_i < bk ||
                (key_i == bk && (b->depth > s->ix.blocks[best].depth ||
                                 (b->depth == s->ix.blocks[best].depth && i < best)))) {
                best = i;
                bk = key_i;
            }
        }
        uint32_t v = engine_victim(s, 0, -1, 1000);
        ck_assert_uint_eq(v, best);
        ck_assert_uint_eq(s->ix.blocks[v].pins, 0);
        engine_evict(s, v);
        ck_assert_ptr_null(store_heap_check(s));
    }
    /* under LFU the 30 gone are the never-hit chains; the hit ones, pinned or not, stay
     * (the default policy counted the hits with its tuner's half-life, short here) */
    for (uint32_t c = 0; c < 20 && k == POLICY_LFU; c++)
        ck_assert(committed(ns, key(ns, c, 0)));
    ck_assert_int_eq(store_release(s, &o, hot_lease), 0);
    teardown();
}
END_TEST

/* The ghost table stays within its byte budget, 1/1024 of the host arenas past its floor,
 * whatever window cache.ghosts asks for (here 8 x 12,288 blocks of 64 KiB, 1.5 x that
 * wanted): 768 MiB holds 49,152 ghosts, in sets that are not a power of two; a block evicted
 * and committed again still finds its own. */
START_TEST(test_ghost_table_budget)
{
    struct store_params p = {.host_size = 768u << 20,
                             .host_page_size = 64 << 10,
                             .host_huge = TIER_HOST_HUGE_OFF,
                             .high_watermark = 0.9,
                             .low_watermark = 0.6,
                             .max_namespaces = 8,
                             .max_handles = 1024,
                             .policy = POLICY_LFU,
                             .recompute_tokens_per_s = 8000,
                             .quantize_inflight = 8,
                             .ghosts = 8};
    int err = 0;
    s = store_new(&p, &err);
    ck_assert_msg(s, "store_new: %d", err);
    engine_attach(s);
    store_owner_init(&o);
    uint32_t ns = ns_open("gb", 0);
    struct store_ns *n = store_ns_get(s, ns);
    n->pp.half_life = 1e6;
    n->pp.adapt = 0;
    for (uint32_t c = 0; c < 64; c++) {
        struct kvc_wire_key kk = key(ns, c, 0);
        ck_assert_int_eq(put_chain(ns, c, 0, 1, 10 + c), 1);
        uint32_t idx = index_find(&s->ix, (uint16_t)ns, &kk);
        s->meta[idx].freq = 5.0f;
        engine_evict(s, idx);
    }
    ck_assert_uint_eq(s->nghost, (768u << 20) / 1024 / 16);
    for (uint32_t c = 0; c < 64; c++) {
        struct kvc_wire_key kk = key(ns, c, 0);
        ck_assert_int_eq(put_chain(ns, c, 0, 1, 100 + c), 1);
        ck_assert_float_gt(s->meta[index_find(&s->ix, (uint16_t)ns, &kk)].freq, 5.5f);
    }
    ck_assert_uint_eq(s->total.ghost_hits, 64);
    store_owner_fini(s, &o);
    engine_stop(s);
    store_free(s);
    s = NULL;
}
END_TEST

/* Regression (issue 30): a 64 MiB arena of 64 KiB blocks keeps the ghosts of its whole
 * window, 8 x 1,024 evictions. Its byte budget alone (1/1024: 4,096 ghosts) held half of it,
 * so a block back 6,000 evictions after it went had lost its count (about 9 of these 64 kept
 * it; half of kvcsim's ghost hits under the precision ladder on the shared trace). */
START_TEST(test_ghost_window_small_cache)
{
    struct store_params p = store_fixture_params();
    p.host_size = 64 << 20;
    p.host_page_size = 256 << 10;
    p.low_watermark = 0.6;
    p.max_handles = 1024;
    p.policy = POLICY_LFU;
    p.recompute_tokens_per_s = 8000;
    p.quantize_inflight = 8;
    p.ghosts = 8;
    p.head_step = false;
    uint32_t kept = 0;
    s = store_fixture_new(&p, NULL);
    store_owner_init(&o);
    uint32_t ns = ns_open("gw", 0);
    struct store_ns *n = store_ns_get(s, ns);
    n->pp.half_life = 1e9;
    n->pp.adapt = 0;
    /* chains 0..63 go first, with a count of 5; then 6,000 others, well within the window */
    for (uint32_t c = 0; c < 64 + 6000; c++) {
        struct kvc_wire_key kk = key(ns, c, 0);
        ck_assert_int_eq(put_chain(ns, c, 0, 1, 10), 1);
        uint32_t idx = index_find(&s->ix, (uint16_t)ns, &kk);
        if (c < 64)
            s->meta[idx].freq = 5.0f;
        engine_evict(s, idx);
    }
    for (uint32_t c = 0; c < 64; c++) {
        struct kvc_wire_key kk = key(ns, c, 0);
        ck_assert_int_eq(put_chain(ns, c, 0, 1, 20), 1);
        kept += s->meta[index_find(&s->ix, (uint16_t)ns, &kk)].freq > 5.5f;
    }
    /* a 4-way set loses a ghost within the window now and then (4 of these 64) */
    ck_assert_msg(kept >= 48, "%u of 64 blocks back within the window kept their count", kept);
    store_fixture_free(s, &o);
    s = NULL;
}
END_TEST

/* The slot-owner map is made the first time a slab step asks, from the arena's lists: until
 * then a cache spends nothing on it; from then on it follows every link and unlink. */
START_TEST(test_slot_owner_map_on_demand)
{
    setup_policy(POLICY_DEFAULT);
    uint32_t ns = ns_open("so", 0), a = store_ns_get(s, ns)->arena;
    for (uint32_t c = 0; c < 8; c++)
        ck_assert_int_eq(put_chain(ns, c, 0, 4, 10 + c), 4);
    ck_assert_ptr_null(s->owner[a]);
    uint32_t seen = 0;
    for (uint32_t i = 0; i < s->ix.nblocks; i++) {
        const struct block *b = &s->ix.blocks[i];
        if (b->state != BLOCK_STATE_COMMITTED || b->arena != a)
            continue;
        ck_assert_uint_eq(store_slot_owner(s, a, b->off), i);
        seen++;
    }
    ck_assert_uint_eq(seen, 32);
    ck_assert_ptr_nonnull(s->owner[a]);
    struct kvc_wire_key leaf = key(ns, 0, 3);
    uint32_t idx = index_find(&s->ix, (uint16_t)ns, &leaf);
    uint64_t off = s->ix.blocks[idx].off;
    engine_evict(s, idx);
    ck_assert_uint_eq(store_slot_owner(s, a, off), INDEX_NONE);
    ck_assert_int_eq(put_chain(ns, 0, 3, 4, 30), 1);
    idx = index_find(&s->ix, (uint16_t)ns, &leaf);
    ck_assert_uint_eq(store_slot_owner(s, a, s->ix.blocks[idx].off), idx);
    teardown();
}
END_TEST

/* A block evicted and committed again soon gets its count back (cache.ghosts); with
 * ghosts off, or once its window has passed, it starts from one. */
START_TEST(test_ghost_restores_count)
{
    struct store_params p;
    struct kvc_wire_key kk;
    struct kvc_wire_loc loc;
    uint64_t lease;
    setup_policy(POLICY_LFU);
    p = s->p;
    p.ghosts = 8;
    store_reload(s, &p);
    uint32_t ns = ns_open("g", 0);
    struct store_ns *n = store_ns_get(s, ns);
    n->pp.half_life = 1e6;
    n->pp.adapt = 0;
    ck_assert_int_eq(put_chain(ns, 0, 0, 1, 10), 1);
    kk = key(ns, 0, 0);
    for (uint32_t r = 0; r < 5; r++) {
        ck_assert_int_eq(engine_lookup(s, &o, ns, &kk, 1, 20 + r, &lease, &loc), 1);
        ck_assert_int_eq(store_release(s, &o, lease), 0);
    }
    uint32_t idx = index_find(&s->ix, (uint16_t)ns, &kk);
    ck_assert_float_gt(s->meta[idx].freq, 5.5f);
    engine_evict(s, idx);
    ck_assert(!committed(ns, kk));
    ck_assert_int_eq(put_chain(ns, 0, 0, 1, 40), 1);
    idx = index_find(&s->ix, (uint16_t)ns, &kk);
    ck_assert_float_gt(s->meta[idx].freq, 6.5f); /* 6 decayed a little, plus this commit */
    ck_assert_uint_eq(s->total.ghost_hits, 1);
    /* used up: evicted again with count 7 and ghosts off, it comes back at 1 */
    p.ghosts = 0;
    store_reload(s, &p);
    engine_evict(s, idx);
    ck_assert_int_eq(put_chain(ns, 0, 0, 1, 50), 1);
    idx = index_find(&s->ix, (uint16_t)ns, &kk);
    ck_assert_float_eq(s->meta[idx].freq, 1.0f);
    ck_assert_uint_eq(s->total.ghost_hits, 1);
    teardown();
}
END_TEST

/* The hint and codec table (store_meta_x) costs nothing until a block gets a hint, and a
 * block that takes a dropped block's pool entry starts without its hint. */
START_TEST(test_hint_table_on_demand)
{
    uint32_t ns = ns_open("x", 0);
    struct kvc_wire_loc loc;
    struct policy_block pb;
    uint64_t lease;
    ck_assert_int_eq(store_ns_policy_set(s, ns, POLICY_H2O, STORE_POLICY_SRC_ADMIN), 0);
    ck_assert_int_eq(put_chain(ns, 0, 0, 4, 10), 4);
    struct kvc_wire_key kk = key(ns, 0, 3);
    ck_assert_int_eq(engine_lookup(s, &o, ns, &kk, 1, 11, &lease, &loc), 1);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    ck_assert_ptr_null(s->meta_x);
    struct kvc_wire_hint h = {.key = kk, .score = 50.0f};
    ck_assert_int_eq(store_hint(s, ns, KVC_HINT_H2O, &h, 1, 12), 1);
    ck_assert_ptr_nonnull(s->meta_x);
    uint32_t idx = index_find(&s->ix, (uint16_t)ns, &kk);
    store_policy_block(s, idx, &pb);
    ck_assert_float_eq(pb.hint, 50.0f);
    ck_assert_int_eq(store_block_drop(s, idx), 0);
    ck_assert_int_eq(put_chain(ns, 1, 0, 1, 20), 1);
    kk = key(ns, 1, 0);
    ck_assert_uint_eq(index_find(&s->ix, (uint16_t)ns, &kk), idx); /* the same pool entry */
    store_policy_block(s, idx, &pb);
    ck_assert_float_eq(pb.hint, 0.0f);
    ck_assert_float_eq(s->meta[idx].freq, 1.0f);
}
END_TEST

/* Under h2o, of two equal prefixes the hinted one survives pressure. */
START_TEST(test_h2o_hint_keeps)
{
    uint32_t ns = ns_open("h", 0);
    ck_assert_int_eq(store_ns_policy_set(s, ns, POLICY_H2O, STORE_POLICY_SRC_ADMIN), 0);
    ck_assert_int_eq(put_chain(ns, 0, 0, 8, 10), 8);
    ck_assert_int_eq(put_chain(ns, 1, 0, 8, 10), 8);
    struct kvc_wire_hint hs[8];
    for (uint32_t i = 0; i < 8; i++)
        hs[i] = (struct kvc_wire_hint){.key = key(ns, 1, i), .score = 50.0f};
    ck_assert_int_eq(store_hint(s, ns, KVC_HINT_H2O, hs, 8, 20), 8);
    ck_assert_float_gt(s->meta_x[index_find(&s->ix, (uint16_t)ns, &hs[3].key)].hint, 49.0f);
    /* evict 7 blocks through the policy */
    for (int i = 0; i < 7; i++) {
        uint32_t v = engine_victim(s, 0, -1, 30);
        ck_assert_uint_ne(v, INDEX_NONE);
        engine_evict(s, v);
    }
    for (uint32_t i = 0; i < 8; i++)
        ck_assert_msg(committed(ns, key(ns, 1, i)), "hinted block %u evicted", i);
    ck_assert(committed(ns, key(ns, 0, 0))); /* the sink of the other goes last */
    ck_assert(!committed(ns, key(ns, 0, 1)));
}
END_TEST

/* Budgeted lookup: sinks + hinted middle blocks + recent window, pinned in order. */
START_TEST(test_budget_select)
{
    uint32_t ns = ns_open("b", 0);
    struct kvc_wire_key ks[10];
    struct kvc_wire_loc locs[10];
    struct kvc_wire_hint hs[2];
    uint32_t pos[10], np;
    uint64_t lease;
    ck_assert_int_eq(put_chain(ns, 0, 0, 10, 10), 10);
    for (uint32_t i = 0; i < 10; i++)
        ks[i] = key(ns, 0, i);
    hs[0] = (struct kvc_wire_hint){.key = ks[4], .score = 9.0f};
    hs[1] = (struct kvc_wire_hint){.key = ks[6], .score = 5.0f};
    ck_assert_int_eq(store_hint(s, ns, KVC_HINT_H2O, hs, 2, 20), 2);
    int n = store_lookup_budget(s, &o, ns, ks, 10, 5, POLICY_H2O, 1, 2, NULL, 0, 30, &lease, &np,
                                pos, locs);
    ck_assert_int_eq(n, 5);
    ck_assert_uint_eq(np, 10);
    uint32_t want[5] = {0, 4, 6, 8, 9};
    for (int i = 0; i < 5; i++) {
        ck_assert_uint_eq(pos[i], want[i]);
        uint32_t idx = index_find(&s->ix, (uint16_t)ns, &ks[pos[i]]);
        ck_assert_uint_eq(s->ix.blocks[idx].pins, 1);
        ck_assert_uint_eq(locs[i].offset, s->ix.blocks[idx].off);
    }
    ck_assert_uint_eq(s->ix.blocks[index_find(&s->ix, (uint16_t)ns, &ks[5])].pins, 0);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    /* SnapKV scores pick the middle instead */
    hs[0] = (struct kvc_wire_hint){.key = ks[2], .score = 3.0f};
    ck_assert_int_eq(store_hint(s, ns, KVC_HINT_SNAPKV, hs, 1, 40), 1);
    n = store_lookup_budget(s, &o, ns, ks, 10, 4, POLICY_SNAPKV, 1, 2, NULL, 0, 50, &lease, &np,
                            pos, locs);
    ck_assert_int_eq(n, 4);
    ck_assert_uint_eq(pos[1], 2);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    /* a miss in the middle cuts the prefix */
    ks[7].lo ^= 0xff00;
    n = store_lookup_budget(s, &o, ns, ks, 10, 10, -1, 1, 2, NULL, 0, 60, &lease, &np, pos, locs);
    ck_assert_int_eq(n, 7);
    ck_assert_uint_eq(np, 7);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    /* refusals */
    float qv[128] = {0};
    ck_assert_int_eq(store_lookup_budget(s, &o, ns, ks, 10, 3, POLICY_QUEST, 1, 1, qv, 64, 70,
                                         &lease, &np, pos, locs),
                     -EINVAL);
    ck_assert_int_eq(
        store_lookup_budget(s, &o, 99, ks, 10, 3, -1, 1, 1, NULL, 0, 70, &lease, &np, pos, locs),
        -ENOENT);
}
END_TEST

/* Quantized blocks carry a Quest summary; a query ranks them by their bound, blocks without
 * one count as unbounded. */
START_TEST(test_quest_summary)
{
    uint32_t ns = ns_open("qq", Q8);
    struct kvc_wire_key ks[6];
    struct kvc_wire_loc locs[6];
    uint32_t pos[6], np;
    uint64_t lease;
    float qv[128];
    ck_assert_int_eq(put_chain(ns, 0, 0, 6, 10), 6);
    for (uint32_t i = 0; i < 6; i++)
        ks[i] = key(ns, 0, i);
    for (uint32_t i = 1; i < 5; i++)
        ck_assert_int_eq(store_quantize(s, index_find(&s->ix, (uint16_t)ns, &ks[i])), 0);
    quant_drain(q);
    for (uint32_t i = 1; i < 5; i++) {
        uint32_t idx = index_find(&s->ix, (uint16_t)ns, &ks[i]);
        ck_assert_uint_ne(s->meta_x[idx].quest, 0);
        const float *sum = s->qsum[s->meta_x[idx].quest - 1];
        for (uint32_t d = 0; d < 128; d++)
            ck_assert_float_le(sum[d], sum[128 + d]); /* min below max */
    }
    /* the data of block i is sin(j * 0.37 + i) * 3: the bounds differ by block */
    for (uint32_t d = 0; d < 128; d++)
        qv[d] = (d % 3) ? 1.0f : -0.5f;
    int n = store_lookup_budget(s, &o, ns, ks, 6, 3, POLICY_QUEST, 1, 1, qv, 128, 20, &lease, &np,
                                pos, locs);
    ck_assert_int_eq(n, 3);
    ck_assert_uint_eq(pos[0], 0);
    ck_assert_uint_eq(pos[2], 5);
    ck_assert(pos[1] >= 1 && pos[1] <= 4);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    /* the summary goes with the block */
    uint32_t idx = index_find(&s->ix, (uint16_t)ns, &ks[5]);
    engine_evict(s, idx);
    idx = index_find(&s->ix, (uint16_t)ns, &ks[4]);
    uint32_t slots = s->nqfree;
    engine_evict(s, idx);
    ck_assert_uint_eq(s->nqfree, slots + 1);
}
END_TEST

/* A namespace's policy: the default follows store_reload, an explicit one stays. */
START_TEST(test_ns_policy_sources)
{
    uint32_t a = ns_open("a", 0), b = ns_open("b", 0);
    struct store_params p = s->p;
    ck_assert_int_eq(store_ns_get(s, a)->policy, POLICY_DEFAULT);
    ck_assert_int_eq(store_ns_policy_set(s, b, POLICY_H2O, STORE_POLICY_SRC_CONFIG), 0);
    p.policy = POLICY_LFU;
    store_reload(s, &p);
    ck_assert_int_eq(store_ns_get(s, a)->policy, POLICY_LFU);
    ck_assert_int_eq(store_ns_get(s, b)->policy, POLICY_H2O);
    ck_assert_int_eq(store_ns_get(s, b)->policy_src, STORE_POLICY_SRC_CONFIG);
    ck_assert_int_eq(store_ns_policy_set(s, b, -1, STORE_POLICY_SRC_ADMIN), 0);
    ck_assert_int_eq(store_ns_get(s, b)->policy, POLICY_LFU);
    ck_assert_int_eq(store_ns_get(s, b)->policy_src, STORE_POLICY_SRC_DEFAULT);
    ck_assert_int_eq(store_ns_policy_set(s, 99, POLICY_LRU, STORE_POLICY_SRC_ADMIN), -ENOENT);
    ck_assert_int_eq(store_ns_policy_set(s, a, POLICY_KIND_COUNT, STORE_POLICY_SRC_ADMIN), -EINVAL);
    /* the default policy's tuner appears with the first reference (a lookup: a commit is
     * not one) and sets the half-life */
    ck_assert_int_eq(store_ns_policy_set(s, a, POLICY_DEFAULT, STORE_POLICY_SRC_ADMIN), 0);
    ck_assert_ptr_null(store_ns_get(s, a)->tune);
    ck_assert_int_eq(put_chain(a, 0, 0, 4, 10), 4);
    ck_assert_ptr_null(store_ns_get(s, a)->tune);
    {
        struct kvc_wire_key ks[4];
        struct kvc_wire_loc locs[4];
        uint64_t lease;
        for (uint32_t i = 0; i < 4; i++)
            ks[i] = key(a, 0, i);
        ck_assert_int_eq(engine_lookup(s, &o, a, ks, 4, 20, &lease, locs), 4);
        ck_assert_int_eq(store_release(s, &o, lease), 0);
    }
    ck_assert_ptr_nonnull(store_ns_get(s, a)->tune);
    ck_assert_int_eq(store_ns_policy_set(s, a, POLICY_LRU, STORE_POLICY_SRC_ADMIN), 0);
    ck_assert_ptr_null(store_ns_get(s, a)->tune);
    /* the policy engine runs while any namespace has a policy other than LRU (b: LFU) */
    ck_assert(store_policy_engine(s));
    ck_assert_int_eq(store_ns_policy_set(s, b, POLICY_LRU, STORE_POLICY_SRC_ADMIN), 0);
    ck_assert(!store_policy_engine(s));
}
END_TEST

/* A lookup's policy work (its hits' accesses, its keys to the default policy's tuner) waits
 * for store_post_flush when the store defers it (the server does, to send the reply first),
 * and the flush applies exactly what the lookup would have at once: two namespaces of one
 * arena fed the same lookups, one at once and one deferred, end with the same tuner,
 * half-life and block accesses; a deferred lookup's work goes before a later lookup's. */
START_TEST(test_lookup_policy_after_reply)
{
    uint32_t a = ns_open("a", 0), b = ns_open("b", 0);
    static struct kvc_wire_key ks[300];
    static struct kvc_wire_loc locs[300];
    uint64_t la, lb;
    ck_assert_int_eq(put_chain(a, 0, 0, 8, 10), 8);
    ck_assert_int_eq(put_chain(b, 0, 0, 8, 10), 8);
    for (uint32_t r = 0; r < 60; r++) {
        uint32_t n = 50 + (r * 37) % 250;
        uint64_t now = 100 + r * 7;
        bool hit = r % 4 == 1; /* the cached chain of each namespace, else the same misses */
        uint32_t ia[8], ib[8];
        for (uint32_t i = 0; i < n; i++)
            ks[i] = (struct kvc_wire_key){.lo = (r * 13 + i) % 600 + 1, .hi = 9};
        for (uint32_t i = 0; hit && i < 8; i++) {
            ia[i] = index_find(&s->ix, (uint16_t)a, &(struct kvc_wire_key){key(a, 0, i).lo, 7});
            ib[i] = index_find(&s->ix, (uint16_t)b, &(struct kvc_wire_key){key(b, 0, i).lo, 7});
        }
        s->post_defer = false;
        for (uint32_t i = 0; hit && i < 8; i++)
            ks[i] = key(a, 0, i);
        ck_assert_int_eq(engine_lookup(s, &o, a, ks, n, now, &la, locs), hit ? 8 : 0);
        ck_assert_uint_eq(s->post_ns, 0);
        s->post_defer = true;
        for (uint32_t i = 0; hit && i < 8; i++)
            ks[i] = key(b, 0, i);
        struct policy_tune *t = store_ns_get(s, b)->tune;
        uint64_t refs = t ? t->refs : 0, last = hit ? s->ix.blocks[ib[3]].last_access : 0;
        ck_assert_int_eq(engine_lookup(s, &o, b, ks, n, now, &lb, locs), hit ? 8 : 0);
        ck_assert_uint_eq(s->post_ns, b); /* kept, not applied */
        ck_assert_uint_eq(s->post_nkey, n);
        ck_assert_ptr_eq(store_ns_get(s, b)->tune, t);
        ck_assert_uint_eq(t ? t->refs : 0, refs);
        if (hit) {
            ck_assert_uint_eq(s->ix.blocks[ib[3]].last_access, last);
            ck_assert_uint_ne(s->ix.blocks[ia[3]].last_access, last);
        }
        if (r % 3 != 2 || hit) {
            store_post_flush(s); /* else the next lookup applies it first */
            ck_assert_uint_eq(s->post_ns, 0);
        }
        for (uint32_t i = 0; hit && i < 8; i++) {
            ck_assert_uint_eq(s->ix.blocks[ia[i]].hits, s->ix.blocks[ib[i]].hits);
            ck_assert_uint_eq(s->ix.blocks[ia[i]].last_access, s->ix.blocks[ib[i]].last_access);
            ck_assert(s->meta[ia[i]].freq == s->meta[ib[i]].freq);
        }
        if (hit) {
            ck_assert_int_eq(store_release(s, &o, la), 0);
            ck_assert_int_eq(store_release(s, &o, lb), 0);
        }
    }
    store_post_flush(s);
    const struct store_ns *na = store_ns_get(s, a), *nb = store_ns_get(s, b);
    ck_assert_ptr_nonnull(na->tune);
    ck_assert_ptr_nonnull(nb->tune);
    ck_assert_uint_eq(na->tune->refs, nb->tune->refs);
    ck_assert_uint_eq(na->tune->sampled, nb->tune->sampled);
    ck_assert(na->tune->tc == nb->tune->tc && na->tune->tc > 0);
    ck_assert_int_eq(na->tune->best, nb->tune->best);
    for (int c = 0; c < POLICY_TUNE_CANDIDATES; c++)
        ck_assert(na->tune->hits[c] == nb->tune->hits[c]);
    ck_assert(na->pp.half_life == nb->pp.half_life && na->pp.half_life > 0);
    ck_assert_int_eq(na->pp.adapt, nb->pp.adapt);
    s->post_defer = false;
}
END_TEST

/* A deferred lookup whose namespace is dropped before the flush (an admin's drop, a tenant's
 * own) and whose blocks' indexes another namespace's blocks take: the flush applies nothing,
 * to that namespace's blocks least (another tenant's hit counts, recency and tuner), and the
 * eviction heap stays consistent. */
START_TEST(test_deferred_lookup_ns_dropped)
{
    uint32_t a = ns_open("a", 0), old[8], ia[8];
    struct kvc_wire_key ks[8];
    struct kvc_wire_loc locs[8];
    uint64_t la, dropped = 0;
    ck_assert_int_eq(put_chain(a, 0, 0, 8, 10), 8);
    for (uint32_t i = 0; i < 8; i++) {
        ks[i] = key(a, 0, i);
        ia[i] = index_find(&s->ix, (uint16_t)a, &ks[i]);
        ck_assert_uint_ne(ia[i], INDEX_NONE);
    }
    s->post_defer = true;
    ck_assert_int_eq(engine_lookup(s, &o, a, ks, 8, 100, &la, locs), 8);
    ck_assert_uint_eq(s->post_ns, a);
    ck_assert_int_eq(store_release(s, &o, la), 0);
    ck_assert_int_eq(store_ns_drop(s, a, &dropped), 0);
    ck_assert_uint_eq(dropped, 8);
    /* another namespace, its blocks in the indexes a's had (the same id where it is free) */
    uint32_t b = ns_open("b", 0), reused = 0;
    ck_assert_int_eq(put_chain(b, 0, 0, 8, 50), 8);
    uint64_t hits[8], last[8];
    for (uint32_t i = 0; i < 8; i++) {
        old[i] = index_find(&s->ix, (uint16_t)b, &(struct kvc_wire_key){key(b, 0, i).lo, 7});
        ck_assert_uint_ne(old[i], INDEX_NONE);
        hits[i] = s->ix.blocks[old[i]].hits;
        last[i] = s->ix.blocks[old[i]].last_access;
        for (uint32_t j = 0; j < 8; j++)
            reused += old[i] == ia[j];
    }
    ck_assert_uint_eq(b, a);
    ck_assert_uint_gt(reused, 0);
    const struct policy_tune *t = store_ns_get(s, b)->tune;
    const uint64_t refs = t ? t->refs : 0;
    store_post_flush(s);
    ck_assert_uint_eq(s->post_ns, 0);
    for (uint32_t i = 0; i < 8; i++) {
        ck_assert_uint_eq(s->ix.blocks[old[i]].hits, hits[i]);
        ck_assert_uint_eq(s->ix.blocks[old[i]].last_access, last[i]);
    }
    t = store_ns_get(s, b)->tune;
    ck_assert_uint_eq(t ? t->refs : 0, refs);
    ck_assert_ptr_null(store_heap_check(s));
    s->post_defer = false;
}
END_TEST

/* The deferral's two buffers where one allocation failed (the keys') and the other did: the
 * next deferring lookup asks for the missing one and keeps the other (was: both asked for
 * again, the one held leaked, a lookup at a time under memory pressure). */
START_TEST(test_deferred_lookup_buffers_after_failed_alloc)
{
    uint32_t a = ns_open("a", 0);
    struct kvc_wire_key ks[8];
    struct kvc_wire_loc locs[8];
    uint64_t la;
    ck_assert_int_eq(put_chain(a, 0, 0, 8, 10), 8);
    for (uint32_t i = 0; i < 8; i++)
        ks[i] = key(a, 0, i);
    ck_assert_ptr_null(s->post_keys);
    uint32_t *held = malloc(KVC_PROTO_MAX_KEYS * sizeof(*held));
    ck_assert_ptr_nonnull(held);
    s->post_idx = held; /* the state a failed malloc of the keys' buffer leaves */
    s->post_defer = true;
    ck_assert_int_eq(engine_lookup(s, &o, a, ks, 8, 100, &la, locs), 8);
    ck_assert_ptr_eq(s->post_idx, held);
    ck_assert_ptr_nonnull(s->post_keys);
    ck_assert_uint_eq(s->post_ns, a); /* deferred with both */
    store_post_flush(s);
    ck_assert_int_eq(store_release(s, &o, la), 0);
    s->post_defer = false;
}
END_TEST

int main(void)
{
    Suite *su = suite_create("store_policy");
    TCase *tc = tcase_create("engine");
    TCase *tf = tcase_create("fixture");
    tcase_set_timeout(tc, daemon_slow() * 120);
    tcase_add_loop_test(tc, test_random_ops_every_policy, 0, POLICY_KIND_COUNT);
    tcase_add_loop_test(tc, test_victim_unpinned_leaf, 0, POLICY_KIND_COUNT);
    tcase_add_loop_test(tc, test_victim_exact_order, 0, 2);
    tcase_add_test(tc, test_ghost_restores_count);
    tcase_add_test(tc, test_ghost_table_budget);
    tcase_add_test(tc, test_ghost_window_small_cache);
    tcase_add_test(tc, test_slot_owner_map_on_demand);
    tcase_add_checked_fixture(tf, setup, teardown);
    tcase_add_test(tf, test_h2o_hint_keeps);
    tcase_add_test(tf, test_hint_table_on_demand);
    tcase_add_test(tf, test_budget_select);
    tcase_add_test(tf, test_quest_summary);
    tcase_add_test(tf, test_ns_policy_sources);
    tcase_add_test(tf, test_lookup_policy_after_reply);
    tcase_add_test(tf, test_deferred_lookup_ns_dropped);
    tcase_add_test(tf, test_deferred_lookup_buffers_after_failed_alloc);
    suite_add_tcase(su, tc);
    suite_add_tcase(su, tf);
    return daemon_suite_run(su);
}
