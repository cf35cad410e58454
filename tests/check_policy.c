/*
 * check_policy — policies/: per-policy ranking tables, budgeted selection, Quest's bound and
 * the action properties every policy must keep.
 */
#include <check.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "policies/policy.h"
#include "tests/lib/daemon.h"

static struct policy_block blk(uint32_t id, uint64_t t, uint32_t depth)
{
    struct policy_block b = { .id = id, .last_access = t, .depth = depth, .bytes = 100,
                              .freq = 1.0f };
    return b;
}

START_TEST(test_names)
{
    for (int k = 0; k < POLICY_KIND_COUNT; k++)
        ck_assert_int_eq(policy_from_name(policy_name((enum policy_kind)k)), k);
    ck_assert_int_eq(policy_from_name("nope"), -1);
    ck_assert_int_eq(policy_from_name(NULL), -1);
}
END_TEST

START_TEST(test_lru_order)
{
    struct policy_block b[4] = { blk(1, 30, 0), blk(2, 10, 1), blk(3, 10, 4), blk(4, 20, 0) };
    policy_rank(POLICY_LRU, b, 4, 100);
    ck_assert_uint_eq(b[0].id, 3); /* oldest; deeper wins the tie */
    ck_assert_uint_eq(b[1].id, 2);
    ck_assert_uint_eq(b[2].id, 4);
    ck_assert_uint_eq(b[3].id, 1);
}
END_TEST

START_TEST(test_blocked_last_every_policy)
{
    for (int k = 0; k < POLICY_KIND_COUNT; k++) {
        struct policy_block b[3] = { blk(1, 1, 5), blk(2, 2, 5), blk(3, 90, 5) };
        b[0].flags = POLICY_BLOCK_PINNED;
        b[1].children = 2;
        policy_rank((enum policy_kind)k, b, 3, 100);
        ck_assert_msg(b[0].id == 3, "%s", policy_name((enum policy_kind)k));
    }
}
END_TEST

START_TEST(test_lfu_frequency_and_decay)
{
    struct policy_params p;
    policy_params_init(&p);
    p.half_life = 10;
    struct policy_block a = blk(1, 0, 1), b = blk(2, 0, 1);
    policy_commit(&a, 0);
    policy_commit(&b, 0);
    for (int i = 1; i <= 3; i++)
        policy_touch(&a, (uint64_t)i, &p);
    policy_touch(&b, 3, &p);
    ck_assert_double_lt(policy_key(POLICY_LFU, &b, &p), policy_key(POLICY_LFU, &a, &p));
    ck_assert_uint_eq(a.hits, 3);
    /* Much later, a single recent access outweighs an old count. */
    struct policy_block c = blk(3, 0, 1);
    policy_commit(&c, 200);
    ck_assert_double_lt(policy_key(POLICY_LFU, &a, &p), policy_key(POLICY_LFU, &c, &p));
    /* Ghost restore carries the count over. */
    struct policy_block g = blk(4, 0, 1);
    policy_commit(&g, 5);
    policy_ghost_restore(&g, 3.0f, 5, 5, &p);
    ck_assert_double_eq_tol(g.freq, 4.0, 1e-6);
}
END_TEST

START_TEST(test_prefix_and_default)
{
    struct policy_params p;
    policy_params_init(&p);
    p.half_life = 100;
    p.depth_cost = 0.1;
    struct policy_block a = blk(1, 50, 1), b = blk(2, 50, 30);
    ck_assert_double_lt(policy_key(POLICY_PREFIX, &a, &p), policy_key(POLICY_PREFIX, &b, &p));
    struct policy_block c = blk(3, 50, 1);
    c.children = 3;
    ck_assert_double_lt(policy_key(POLICY_PREFIX, &a, &p), policy_key(POLICY_PREFIX, &c, &p));
    struct policy_block d = blk(4, 50, 1);
    d.flags = POLICY_BLOCK_PARTIAL;
    ck_assert_double_lt(policy_key(POLICY_DEFAULT, &d, &p), policy_key(POLICY_DEFAULT, &a, &p));
    struct policy_block e = blk(5, 50, 1);
    e.hint = 10;
    ck_assert_double_lt(policy_key(POLICY_DEFAULT, &a, &p), policy_key(POLICY_DEFAULT, &e, &p));
}
END_TEST

START_TEST(test_signal_policies)
{
    struct policy_params p;
    policy_params_init(&p);
    p.half_life = 1000;
    struct policy_block s = blk(1, 0, 0), m = blk(2, 90, 5), h = blk(3, 10, 6);
    /* StreamingLLM: the sink outlives a more recent middle block. */
    ck_assert_double_lt(policy_key(POLICY_STREAMING, &m, &p),
                        policy_key(POLICY_STREAMING, &s, &p));
    /* H2O: a heavy hitter outlives a recent block with no attention. */
    policy_hint(&h, 5.0f, 10, &p);
    ck_assert_double_lt(policy_key(POLICY_H2O, &m, &p), policy_key(POLICY_H2O, &h, &p));
    /* SnapKV: higher window score kept. */
    m.snap = 0.1f;
    h.snap = 0.7f;
    ck_assert_double_lt(policy_key(POLICY_SNAPKV, &m, &p), policy_key(POLICY_SNAPKV, &h, &p));
    /* Key-norm: the high-norm block goes first. */
    m.key_norm = 9.0f;
    h.key_norm = 2.0f;
    ck_assert_double_lt(policy_key(POLICY_KEYNORM, &m, &p), policy_key(POLICY_KEYNORM, &h, &p));
    /* VATP: equal attention, the block with small values goes first; a tenfold attention
     * outweighs a value norm eight times as large; no norm measured ranks as H2O. */
    struct policy_block a = blk(4, 10, 6), b = blk(5, 10, 6);
    policy_hint(&a, 2.0f, 10, &p);
    policy_hint(&b, 2.0f, 10, &p);
    ck_assert_double_eq(policy_key(POLICY_VATP, &a, &p), policy_key(POLICY_H2O, &a, &p));
    a.value_norm = 0.5f;
    b.value_norm = 8.0f;
    ck_assert_double_lt(policy_key(POLICY_VATP, &a, &p), policy_key(POLICY_VATP, &b, &p));
    ck_assert_double_eq(policy_key(POLICY_H2O, &a, &p), policy_key(POLICY_H2O, &b, &p));
    policy_hint(&a, 18.0f, 10, &p); /* mass 20 x norm 1 against 2 x 8 */
    a.value_norm = 1.0f;
    ck_assert_double_gt(policy_key(POLICY_VATP, &a, &p), policy_key(POLICY_VATP, &b, &p));
    /* A mass that would pass FLT_MAX saturates there, and still decays (an infinite one
     * would keep its block first forever). */
    struct policy_block x = blk(6, 10, 6);
    policy_hint(&x, 3.0e38f, 10, &p);
    policy_hint(&x, 3.0e38f, 10, &p);
    ck_assert(isfinite(x.hint));
    ck_assert_float_eq(x.hint, FLT_MAX);
    policy_hint(&x, 0.0f, 10 + 20 * p.half_life, &p);
    ck_assert_float_lt(x.hint, FLT_MAX / 1000);
}
END_TEST

START_TEST(test_quest_bound)
{
    const float q[2] = { 1, -1 }, kmin[2] = { 0, -2 }, kmax[2] = { 1, 3 };
    ck_assert_double_eq_tol(policy_quest_bound(q, kmin, kmax, 2), 3.0, 1e-9);
    /* The bound is >= q·k for any k inside the box. */
    const float k[2] = { 0.5f, -1.5f };
    ck_assert_double_ge(policy_quest_bound(q, kmin, kmax, 2), q[0] * k[0] + q[1] * k[1]);
}
END_TEST

START_TEST(test_select)
{
    struct policy_params p;
    policy_params_init(&p);
    p.sinks = 1;
    p.recent = 2;
    struct policy_block b[10];
    float kmin[10], kmax[10], q[1] = { 1 };
    for (int i = 0; i < 10; i++) {
        b[i] = blk((uint32_t)i, 0, (uint32_t)i);
        kmin[i] = 0;
        kmax[i] = (float)i == 3 ? 10.0f : 1.0f;
    }
    struct policy_query qq = { .q = q, .kmin = kmin, .kmax = kmax, .dim = 1 };
    uint32_t pos[10];
    size_t m = policy_select(POLICY_QUEST, b, 10, 4, 0, &p, &qq, pos);
    ck_assert_uint_eq(m, 4);
    ck_assert_uint_eq(pos[0], 0);
    ck_assert_uint_eq(pos[1], 3);
    ck_assert_uint_eq(pos[2], 8);
    ck_assert_uint_eq(pos[3], 9);
    /* Budget below sinks + window: sinks first, then the newest. */
    m = policy_select(POLICY_STREAMING, b, 10, 2, 0, &p, NULL, pos);
    ck_assert_uint_eq(m, 2);
    ck_assert_uint_eq(pos[0], 0);
    ck_assert_uint_eq(pos[1], 9);
    /* Every policy keeps sinks and window and respects the budget. */
    for (int k = 0; k < POLICY_KIND_COUNT; k++) {
        m = policy_select((enum policy_kind)k, b, 10, 5, 0, &p, NULL, pos);
        ck_assert_uint_eq(m, 5);
        ck_assert_uint_eq(pos[0], 0);
        ck_assert_uint_eq(pos[3], 8);
        ck_assert_uint_eq(pos[4], 9);
    }
}
END_TEST

/* The properties, for every policy, over random metadata and pressures. */
START_TEST(test_decide_properties)
{
    static const uint8_t bad_plan[4] = { POLICY_CODEC_RAW, POLICY_CODEC_RAW, POLICY_CODEC_Q4,
                                         POLICY_CODEC_Q8 };
    static const uint8_t good_plan[4] = { POLICY_CODEC_RAW, POLICY_CODEC_RAW, POLICY_CODEC_Q8,
                                          POLICY_CODEC_Q8 };
    struct policy_params p;
    uint32_t seen[POLICY_KIND_COUNT][POLICY_ACTION_DROP + 1];
    memset(seen, 0, sizeof(seen));
    policy_params_init(&p);
    srand(7);
    for (int round = 0; round < 300; round++) {
        for (int k = 0; k < POLICY_KIND_COUNT; k++) {
            struct policy_block b[32], orig[32];
            struct policy_action a[32];
            for (int i = 0; i < 32; i++) {
                b[i] = blk((uint32_t)i, (uint64_t)(rand() % 1000), (uint32_t)(rand() % 8));
                b[i].hits = (uint32_t)(rand() % 3);
                b[i].children = rand() % 3 == 0 ? 1 : 0;
                b[i].flags = (rand() % 4 == 0 ? POLICY_BLOCK_PINNED : 0) |
                             (rand() % 5 == 0 ? POLICY_BLOCK_SINK : 0) |
                             (rand() % 6 == 0 ? POLICY_BLOCK_QUANTIZED : 0);
                b[i].hint = (float)(rand() % 10);
                b[i].key_norm = (float)(rand() % 10);
                orig[i] = b[i];
            }
            struct policy_pressure pr = {
                .bytes_to_free = (uint64_t)(rand() % 4000),
                .actions = (uint32_t)(rand() % 16) & ~1u,
                .codecs = round % 3 == 0 ? 0 : 1u << POLICY_CODEC_Q8,
                .miss_cost = 1, .disk_cost = 0.5,
            };
            if (round % 5 == 1) {
                pr.layers = 4;
                pr.layer_codec = round % 2 ? bad_plan : good_plan;
            }
            size_t m = policy_decide((enum policy_kind)k, b, 32, 1000, &p, &pr, a);
            ck_assert_uint_le(m, 32);
            for (size_t i = 0; i < m; i++) {
                const struct policy_block *o = &orig[a[i].id];
                ck_assert_uint_le(a[i].action, POLICY_ACTION_DROP);
                seen[k][a[i].action]++;
                ck_assert(!(o->flags & POLICY_BLOCK_PINNED));
                ck_assert(pr.actions & (1u << a[i].action));
                if (a[i].action == POLICY_ACTION_DROP)
                    ck_assert_uint_eq(o->children, 0);
                if (a[i].action == POLICY_ACTION_QUANTIZE) {
                    ck_assert_uint_ne(pr.codecs, 0);
                    ck_assert(pr.layer_codec != bad_plan || pr.layers == 0);
                    ck_assert(!(o->flags & POLICY_BLOCK_SINK));
                    ck_assert(pr.codecs & (1u << a[i].codec));
                }
            }
        }
    }
    /* the properties held over real decisions: every policy quantized, offloaded and dropped */
    for (int k = 0; k < POLICY_KIND_COUNT; k++)
        for (int act = POLICY_ACTION_QUANTIZE; act <= POLICY_ACTION_DROP; act++)
            ck_assert_msg(seen[k][act] > 0, "policy %s never chose action %d",
                          policy_name((enum policy_kind)k), act);
}
END_TEST

START_TEST(test_quantized_bytes)
{
    static const uint8_t plan[2] = { POLICY_CODEC_RAW, POLICY_CODEC_Q8 };
    struct policy_pressure pr = { .codecs = 1u << POLICY_CODEC_Q8 };
    ck_assert_uint_eq(policy_quantized_bytes(&pr, 6400), 3400);
    pr.layers = 2;
    pr.layer_codec = plan;
    ck_assert_uint_eq(policy_quantized_bytes(&pr, 6400), 4900);
    pr.codecs = 0;
    ck_assert_uint_eq(policy_quantized_bytes(&pr, 6400), 0);
}
END_TEST

/* policy_tune: a hot set that recency cannot hold (its reuse distance is 2.5 capacities,
 * between unique scan keys) makes a frequency-leaning half-life win; a pure one-reuse
 * stream gives every candidate the same hits, and the tie goes to the LRU end. */
/* The tuner's half-life between grid points: two candidates tied give their geometric mean
 * whichever is "best", a clear winner moves less than half a step; at either end of the grid
 * the parabola of the last three candidates, so two tied there give their geometric mean
 * too (it was the last candidate's own half-life, twice that); the LRU candidate is not
 * interpolated. */
START_TEST(test_tune_interpolates)
{
    struct policy_tune t;
    ck_assert_int_eq(policy_tune_init(&t, 10000), 0);
    t.tc = 100;
    for (int c = 0; c < POLICY_TUNE_CANDIDATES; c++)
        t.h[c] = t.tc * (c == 0 ? 1.0 / 4096.0 : exp2(2.0 * (c - 2)));
    const double tied[POLICY_TUNE_CANDIDATES] = {0, 10, 50, 50, 10, 0};
    memcpy(t.hits, tied, sizeof(tied));
    t.best = 2;
    ck_assert_double_eq_tol(policy_tune_half_life(&t), 200.0, 1e-9);
    t.best = 3;
    ck_assert_double_eq_tol(policy_tune_half_life(&t), 200.0, 1e-9);
    const double lean[POLICY_TUNE_CANDIDATES] = {0, 10, 50, 20, 10, 0};
    memcpy(t.hits, lean, sizeof(lean));
    t.best = 2;
    double h = policy_tune_half_life(&t);
    ck_assert(h > 100.0 && h < 200.0);
    const double last[POLICY_TUNE_CANDIDATES] = {0, 0, 10, 50, 80, 80};
    memcpy(t.hits, last, sizeof(last));
    t.best = POLICY_TUNE_CANDIDATES - 1; /* the last two tied */
    ck_assert_double_eq_tol(policy_tune_half_life(&t), 3200.0, 1e-9);
    t.best = POLICY_TUNE_CANDIDATES - 2;
    ck_assert_double_eq_tol(policy_tune_half_life(&t), 3200.0, 1e-9);
    const double first[POLICY_TUNE_CANDIDATES] = {0, 80, 80, 50, 10, 0};
    memcpy(t.hits, first, sizeof(first));
    t.best = 1; /* next to the LRU candidate, tied with the next */
    ck_assert_double_eq_tol(policy_tune_half_life(&t), 50.0, 1e-9);
    t.best = 2;
    ck_assert_double_eq_tol(policy_tune_half_life(&t), 50.0, 1e-9);
    t.best = 0; /* the LRU candidate */
    ck_assert_double_eq(policy_tune_half_life(&t), t.h[0]);
    const double rising[POLICY_TUNE_CANDIDATES] = {0, 0, 10, 20, 40, 80};
    memcpy(t.hits, rising, sizeof(rising));
    t.best = POLICY_TUNE_CANDIDATES - 1; /* a clear winner at the end: its own */
    ck_assert_double_eq(policy_tune_half_life(&t), t.h[POLICY_TUNE_CANDIDATES - 1]);
    const double peaked[POLICY_TUNE_CANDIDATES] = {0, 0, 10, 60, 74, 75};
    memcpy(t.hits, peaked, sizeof(peaked));
    double hl = policy_tune_half_life(&t); /* vertex past 4.5: between the last two */
    ck_assert(hl > 3200.0 && hl < 6400.0);
    const double flat[POLICY_TUNE_CANDIDATES] = {0, 50, 50, 50, 50, 50};
    memcpy(t.hits, flat, sizeof(flat));
    t.best = 2; /* no curvature: the grid point */
    ck_assert_double_eq(policy_tune_half_life(&t), t.h[2]);
    policy_tune_free(&t);
}
END_TEST

/* One sampled reference of a new key to t: no mini cache hits it, so the hit counts stay as
 * the test set them and only the choice between candidates runs. */
static void tune_touch(struct policy_tune *t, uint64_t *key, uint64_t now)
{
    uint64_t sampled = t->sampled;
    while (t->sampled == sampled)
        policy_tune_access(t, (*key)++, 0, now);
}

/* Hysteresis: two candidates alternately ahead by less than POLICY_TUNE_MARGIN standard
 * errors of the lead (the square root of the references only one of them hit) leave the
 * current one chosen; a clear lead moves the choice, and moving back takes the same margin. */
START_TEST(test_tune_hysteresis)
{
    struct policy_tune t;
    uint64_t key = 1u << 30, now = 1000;
    ck_assert_int_eq(policy_tune_init(&t, 10000), 0);
    t.tc = 100;
    for (int c = 0; c < POLICY_TUNE_CANDIDATES; c++)
        t.h[c] = t.tc * (c == 0 ? 1.0 / 4096.0 : exp2(2.0 * (c - 2)));
    const double base[POLICY_TUNE_CANDIDATES] = {100, 200, 500, 1000, 1000, 600};
    memcpy(t.hits, base, sizeof(base));
    t.split[3][4] = 400; /* standard error of the lead 20 */
    t.best = 3;
    double margin = POLICY_TUNE_MARGIN * 20.0;
    for (int round = 0; round < 6; round++) {
        double lead = (round % 2 ? -0.9 : 0.9) * margin; /* 4 ahead, then 3, then 4, ... */
        t.hits[3] = 1000;
        t.hits[4] = 1000 + lead;
        tune_touch(&t, &key, ++now);
        ck_assert_int_eq(t.best, 3);
    }
    t.hits[4] = 1000 + 1.1 * margin; /* a clear lead */
    tune_touch(&t, &key, ++now);
    ck_assert_int_eq(t.best, 4);
    for (int round = 0; round < 6; round++) {
        t.hits[3] = t.hits[4] + (round % 2 ? -0.9 : 0.9) * margin;
        tune_touch(&t, &key, ++now);
        ck_assert_int_eq(t.best, 4);
    }
    /* Near-tied, either choice gives about the same half-life (the parabola's vertex). */
    t.hits[3] = t.hits[4] = 1000;
    double h4 = policy_tune_half_life(&t);
    t.best = 3;
    ck_assert_double_eq_tol(policy_tune_half_life(&t), h4, 1e-9 * h4);
    ck_assert_double_eq_tol(h4, 2.0 * t.h[3], 1e-9 * h4);
    t.hits[3] = 1000 + 1.1 * margin;
    t.best = 4;
    tune_touch(&t, &key, ++now);
    ck_assert_int_eq(t.best, 3);
    policy_tune_free(&t);
}
END_TEST

/* The turnover time follows the load of the last turnovers: the stream slows down 4x and
 * the tuner's tc follows (averaged since the start it would lag at ~0.8 of it). */
START_TEST(test_tune_follows_load)
{
    struct policy_tune t;
    uint64_t now = 1;
    ck_assert_int_eq(policy_tune_init(&t, 1000), 0);
    for (uint64_t i = 0; i < 20000; i++)
        policy_tune_access(&t, i % 3000, 0, now++);
    ck_assert_double_eq_tol(t.tc, 1000.0, 120.0);
    for (uint64_t i = 0; i < 64000; i++, now += 4)
        policy_tune_access(&t, i % 3000, 0, now);
    ck_assert_msg(fabs(t.tc - 4000.0) < 0.15 * 4000.0, "tc %.1f", t.tc);
    policy_tune_free(&t);
}
END_TEST

/* The ladder's rungs, its choice of rung and how hits and ghosts move its targets. */
START_TEST(test_ladder)
{
    struct policy_ladder l;
    uint32_t q8q4 = 1u << POLICY_CODEC_Q8 | 1u << POLICY_CODEC_Q4;
    ck_assert_int_eq(policy_ladder_next(q8q4, POLICY_CODEC_RAW), POLICY_CODEC_Q8);
    ck_assert_int_eq(policy_ladder_next(q8q4, POLICY_CODEC_Q8), POLICY_CODEC_Q4);
    ck_assert_int_eq(policy_ladder_next(q8q4, POLICY_CODEC_Q4), POLICY_CODEC_RAW);
    ck_assert_int_eq(policy_ladder_next(1u << POLICY_CODEC_KIVI2, POLICY_CODEC_RAW),
                     POLICY_CODEC_KIVI2);
    ck_assert_int_eq(policy_ladder_next(0, POLICY_CODEC_RAW), POLICY_CODEC_RAW);
    /* never up: from q4_1, q8_0 (larger) is not a step */
    ck_assert_int_eq(policy_ladder_next(1u << POLICY_CODEC_Q8, POLICY_CODEC_Q4),
                     POLICY_CODEC_RAW);

    policy_ladder_init(&l, 3, 0.0, 100);
    ck_assert_double_eq_tol(l.below[0], 1.0 / 3, 1e-12);
    ck_assert_double_eq_tol(l.below[1], 2.0 / 3, 1e-12);
    ck_assert_double_eq(l.below[2], 1.0);
    double bytes[3] = {50, 10, 0};
    int ready[3] = {1, 1, 0}, out;
    ck_assert_int_eq(policy_ladder_pick(&l, bytes, 100, ready, &out), 0); /* raw over 1/3 */
    ck_assert_int_eq(out, 0);
    bytes[0] = 20;
    ck_assert_int_eq(policy_ladder_pick(&l, bytes, 100, ready, &out), 1); /* none over: */
    ck_assert_int_eq(out, 1);                                             /* the deepest out */
    bytes[1] = 60;
    ck_assert_int_eq(policy_ladder_pick(&l, bytes, 100, ready, &out), 1); /* 0..1 over 2/3 */
    ck_assert_int_eq(out, 0);
    ready[1] = 0; /* only raw, within its target: out, not through the codecs */
    ck_assert_int_eq(policy_ladder_pick(&l, bytes, 100, ready, &out), 0);
    ck_assert_int_eq(out, 1);
    ready[0] = 0;
    ck_assert_int_eq(policy_ladder_pick(&l, bytes, 100, ready, &out), -1);
    /* ghosts lower every target down to 0; weight 0: lossy hits move nothing */
    for (int i = 0; i < 1000; i++)
        policy_ladder_ghost_hit(&l);
    ck_assert_double_eq(l.below[0], 0.0);
    ck_assert_double_eq(l.below[1], 0.0);
    policy_ladder_hit(&l, 2);
    ck_assert_double_eq(l.below[0], 0.0);
    /* weight 2: a hit at rung 2 raises rungs 0 and 1 by 2 steps, one at rung 1 only rung 0 */
    policy_ladder_init(&l, 3, 2.0, 100);
    double b0 = l.below[0], b1 = l.below[1];
    policy_ladder_hit(&l, 2);
    ck_assert_double_eq_tol(l.below[0], b0 + 0.02, 1e-12);
    ck_assert_double_eq_tol(l.below[1], b1 + 0.02, 1e-12);
    policy_ladder_hit(&l, 1);
    ck_assert_double_eq_tol(l.below[0], b0 + 0.04, 1e-12);
    ck_assert_double_eq_tol(l.below[1], b1 + 0.02, 1e-12);
    for (int i = 0; i < 1000; i++)
        policy_ladder_hit(&l, 2);
    ck_assert_double_eq(l.below[0], 1.0); /* clamped */
    ck_assert_double_eq(l.below[2], 1.0);
}
END_TEST

START_TEST(test_tune)
{
    struct policy_tune t;
    uint64_t now = 0, scan = 1000000;
    ck_assert_int_eq(policy_tune_init(&t, 0), -EINVAL);
    ck_assert_int_eq(policy_tune_init(&t, 100), 0);
    ck_assert(policy_tune_half_life(&t) == 0);
    for (int round = 0; round < 200; round++)
        for (uint64_t h = 0; h < 50; h++) {
            policy_tune_access(&t, h, 0, ++now);
            for (int k = 0; k < 4; k++)
                policy_tune_access(&t, scan++, 0, ++now);
        }
    ck_assert(t.tc > 0);
    ck_assert(policy_tune_half_life(&t) >= t.tc);
    ck_assert(t.hits[t.best] > 2.0 * t.hits[0]);
    policy_tune_free(&t);

    ck_assert_int_eq(policy_tune_init(&t, 100), 0);
    now = 0;
    for (uint64_t k = 0; k < 20000; k++) {
        policy_tune_access(&t, 2 * k, 0, ++now);
        if (k >= 30)
            policy_tune_access(&t, 2 * (k - 30), 0, ++now);
    }
    ck_assert(policy_tune_half_life(&t) > 0);
    ck_assert(policy_tune_half_life(&t) < t.tc);
    ck_assert(t.hits[0] > 0);
    policy_tune_free(&t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("policy");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_names);
    tcase_add_test(tc, test_lru_order);
    tcase_add_test(tc, test_blocked_last_every_policy);
    tcase_add_test(tc, test_lfu_frequency_and_decay);
    tcase_add_test(tc, test_prefix_and_default);
    tcase_add_test(tc, test_signal_policies);
    tcase_add_test(tc, test_quest_bound);
    tcase_add_test(tc, test_select);
    tcase_add_test(tc, test_decide_properties);
    tcase_add_test(tc, test_quantized_bytes);
    tcase_add_test(tc, test_tune);
    tcase_add_test(tc, test_tune_interpolates);
    tcase_add_test(tc, test_tune_hysteresis);
    tcase_add_test(tc, test_tune_follows_load);
    tcase_add_test(tc, test_ladder);
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
