/*
 * check_sim — the trace simulator on small traces with hand-checked answers.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policies/policy.h"
#include "tests/lib/sim.h"
#include "tests/lib/daemon.h"

/* r1 [1,2,3], r2 [1,2,4], r3 [1,2,3]; capacity 3.
 * LRU: r2 evicts 3 for 4, r3 evicts 4 for 3: hits 2 + 2 of 9.
 * MIN: r2 does not keep 4 (never used again): hits 2 + 3 of 9; infinite the same. */
static const char trace_a[] =
    "{\"timestamp\": 0, \"input_length\": 1536, \"output_length\": 5, \"hash_ids\": [1, 2, 3]}\n"
    "{\"timestamp\": 5, \"input_length\": 1536, \"output_length\": 5, \"hash_ids\": [1, 2, 4]}\n"
    "\n"
    "{\"timestamp\": 9, \"input_length\": 1536, \"output_length\": 5, \"hash_ids\": [1, 2, 3]}\n";

static void run(const char *text, int policy, double cap, struct sim_result *r)
{
    struct sim_trace t;
    struct sim_config c;
    ck_assert_int_eq(sim_trace_parse(&t, text, strlen(text)), 0);
    sim_config_init(&c);
    c.policy = policy;
    c.capacity = cap;
    ck_assert_int_eq(sim_run(&t, &c, r), 0);
    sim_trace_free(&t);
}

START_TEST(test_parse)
{
    struct sim_trace t;
    ck_assert_int_eq(sim_trace_parse(&t, trace_a, strlen(trace_a)), 0);
    ck_assert_uint_eq(t.nreq, 3);
    ck_assert_uint_eq(t.nref, 9);
    ck_assert_uint_eq(t.nblocks, 4);
    ck_assert_uint_eq(t.ids[6], t.ids[0]);
    sim_trace_free(&t);
    const char *bad = "{\"timestamp\": 0, \"hash_ids\": [1, x]}\n";
    ck_assert_int_eq(sim_trace_parse(&t, bad, strlen(bad)), -EINVAL);
}
END_TEST

START_TEST(test_lru_min_inf)
{
    struct sim_result r;
    run(trace_a, POLICY_LRU, 3, &r);
    ck_assert_uint_eq(r.refs, 9);
    ck_assert_uint_eq(r.hits_full, 4);
    ck_assert_uint_eq(r.prefix_hits, 4);
    run(trace_a, SIM_POLICY_MIN, 3, &r);
    ck_assert_uint_eq(r.hits_full, 5);
    run(trace_a, SIM_POLICY_INFINITE, 1, &r);
    ck_assert_uint_eq(r.hits_full, 5);
    /* Every policy: never more than the oracle, hits only where cached. */
    for (int k = 0; k < POLICY_KIND_COUNT; k++) {
        run(trace_a, k, 3, &r);
        ck_assert_uint_le(r.hits_full + r.hits_lossy + r.hits_disk, 5);
        ck_assert_uint_ge(r.hits_full, 4);
    }
    /* Capacity 2: the prefix tree holds [1,2] only when 3 is dropped: LRU hits 2+2. */
    run(trace_a, POLICY_LRU, 2, &r);
    ck_assert_uint_eq(r.hits_full, 4);
}
END_TEST

/* The counts kvcsim --counts prints beside the daemon's: on trace_a under LRU at 3 blocks, r2
 * evicts 3 and r3 evicts 4, then finds 3 evicted one eviction ago (within 8 x 3): one ghost
 * hit; with no ghost window, none, and the same evictions. */
START_TEST(test_counts)
{
    struct sim_trace t;
    struct sim_config c;
    struct sim_result r;
    ck_assert_int_eq(sim_trace_parse(&t, trace_a, strlen(trace_a)), 0);
    sim_config_init(&c);
    c.policy = POLICY_LRU;
    c.capacity = 3;
    ck_assert_int_eq(sim_run(&t, &c, &r), 0);
    ck_assert_uint_eq(r.evictions, 2);
    ck_assert_uint_eq(r.ghost_hits, 1);
    c.ghost_factor = 0;
    ck_assert_int_eq(sim_run(&t, &c, &r), 0);
    ck_assert_uint_eq(r.evictions, 2);
    ck_assert_uint_eq(r.ghost_hits, 0);
    sim_trace_free(&t);
}
END_TEST

/* Token ratio: a partial last block (188 tokens). */
START_TEST(test_tokens)
{
    const char *t = "{\"timestamp\": 0, \"input_length\": 700, \"hash_ids\": [1, 2]}\n"
                    "{\"timestamp\": 1, \"input_length\": 1024, \"hash_ids\": [1, 5]}\n";
    struct sim_result r;
    run(t, SIM_POLICY_INFINITE, 1, &r);
    ck_assert_uint_eq(r.tokens, 512 + 188 + 512 + 512);
    ck_assert_uint_eq(r.token_hits, 512);
    run(t, POLICY_LRU, 10, &r);
    ck_assert_uint_eq(r.token_hits, 512);
}
END_TEST

/* Prefix ratio counts hits before a request's first miss only. */
START_TEST(test_prefix_ratio)
{
    const char *t = "{\"timestamp\": 0, \"input_length\": 1024, \"hash_ids\": [1, 2]}\n"
                    "{\"timestamp\": 1, \"input_length\": 1024, \"hash_ids\": [3, 2]}\n";
    struct sim_result r;
    run(t, SIM_POLICY_INFINITE, 1, &r);
    ck_assert_uint_eq(r.hits_full, 1);
    ck_assert_uint_eq(r.prefix_hits, 0);
    /* An id names its whole prefix, so the cache serves 2 though 3 missed: a block hit,
     * not a prefix hit. */
    run(t, POLICY_LRU, 10, &r);
    ck_assert_uint_eq(r.hits_full, 1);
    ck_assert_uint_eq(r.prefix_hits, 0);
}
END_TEST

/* r3 needs room while 2 (reused once, not a sink) is unpinned: quantized (q8_0 takes 0.53)
 * it stays, so r4 hits it lossy; offloaded it stays on disk; dropped it misses. Regression
 * (offload admission): the policy's offload rule follows the configured admission. */
START_TEST(test_quantize_and_disk)
{
    const char *t = "{\"timestamp\": 0, \"input_length\": 1024, \"hash_ids\": [1, 2]}\n"
                    "{\"timestamp\": 1, \"input_length\": 1024, \"hash_ids\": [1, 2]}\n"
                    "{\"timestamp\": 2, \"input_length\": 1024, \"hash_ids\": [1, 3]}\n"
                    "{\"timestamp\": 3, \"input_length\": 1024, \"hash_ids\": [1, 2]}\n";
    struct sim_trace tr;
    struct sim_config c;
    struct sim_result r;
    ck_assert_int_eq(sim_trace_parse(&tr, t, strlen(t)), 0);
    sim_config_init(&c);
    c.policy = POLICY_DEFAULT;
    c.capacity = 2.6;
    ck_assert_int_eq(sim_run(&tr, &c, &r), 0);
    ck_assert_uint_eq(r.hits_full, 2 + 1 + 1);
    c.codec = POLICY_CODEC_Q8;
    ck_assert_int_eq(sim_run(&tr, &c, &r), 0);
    ck_assert_uint_eq(r.hits_full, 2 + 1 + 1);
    ck_assert_uint_eq(r.hits_lossy, 1);
    c.codec = 0;
    c.capacity = 2;
    c.disk_blocks = 4;
    ck_assert_int_eq(sim_run(&tr, &c, &r), 0);
    ck_assert_uint_eq(r.hits_full, 2 + 1 + 1);
    ck_assert_uint_eq(r.hits_disk, 1);
    /* Admission 0 (the daemon's default): r4 brings 2 back and pushes 3 (never reused) out
     * to disk too. Admission 1: 3 is dropped, only 2 was written. */
    ck_assert_uint_eq(r.disk_writes, 2);
    c.admit_hits = 1;
    ck_assert_int_eq(sim_run(&tr, &c, &r), 0);
    ck_assert_uint_eq(r.hits_disk, 1);
    ck_assert_uint_eq(r.disk_writes, 1);
    sim_trace_free(&tr);
}
END_TEST

/* A generated hot-set + scan trace (the shape where LRU fails): the default, tuning its
 * half-life, beats LRU and stays under MIN; on a one-reuse recency trace it is not below
 * LRU. Every policy keeps the prefix invariant (checked by the simulator's bookkeeping:
 * hits never exceed MIN's). */
static char *gen(int hot)
{
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    uint64_t next = 100000;
    ck_assert_ptr_nonnull(buf);
    for (int i = 0; i < 3000; i++) {
        char ids[512];
        int m = 0;
        if (hot && i % 2 == 0) {
            int h = (i / 2) % 30; /* 30 hot prompts of 3 blocks under root 0 */
            m = snprintf(ids, sizeof(ids), "0, %d, %d, %d", 1 + 3 * h, 2 + 3 * h, 3 + 3 * h);
        } else if (!hot && i >= 5) {
            m = snprintf(ids, sizeof(ids), "0, %llu, %llu", (unsigned long long)(next - 10),
                         (unsigned long long)next); /* r(i) reuses r(i-5)'s prefix */
            next += 2;
        } else {
            m = snprintf(ids, sizeof(ids), "0, %llu, %llu, %llu, %llu",
                         (unsigned long long)next, (unsigned long long)next + 1,
                         (unsigned long long)next + 2, (unsigned long long)next + 3);
            next += 4;
        }
        ck_assert_int_gt(m, 0);
        n += (size_t)snprintf(buf + n, cap - n,
                              "{\"timestamp\": %d, \"input_length\": 0, \"hash_ids\": [%s]}\n",
                              i, ids);
        ck_assert_uint_lt(n, cap);
    }
    return buf;
}

/* The precision ladder on a hand-checked trace: r1 [1,2], r2 [1,3], r3 [1,2] at 2.6 blocks.
 * Without a ladder r2 evicts 2 for 3 and r3 misses it. With q8_0 r2 quantizes 2 (0.53 of a
 * block) instead, 3 fits beside it, and r3 hits 2 lossy. A sink is never quantized. */
START_TEST(test_ladder_hand)
{
    const char *t = "{\"timestamp\": 0, \"input_length\": 1024, \"hash_ids\": [1, 2]}\n"
                    "{\"timestamp\": 1, \"input_length\": 1024, \"hash_ids\": [1, 3]}\n"
                    "{\"timestamp\": 2, \"input_length\": 1024, \"hash_ids\": [1, 2]}\n";
    const char *sink = "{\"timestamp\": 0, \"input_length\": 512, \"hash_ids\": [1]}\n"
                       "{\"timestamp\": 1, \"input_length\": 512, \"hash_ids\": [2]}\n"
                       "{\"timestamp\": 2, \"input_length\": 512, \"hash_ids\": [1]}\n";
    struct sim_trace tr;
    struct sim_config c;
    struct sim_result r;
    ck_assert_int_eq(sim_trace_parse(&tr, t, strlen(t)), 0);
    sim_config_init(&c);
    c.policy = POLICY_LRU;
    c.capacity = 2.6;
    ck_assert_int_eq(sim_run(&tr, &c, &r), 0);
    ck_assert_uint_eq(r.hits_full, 2);
    ck_assert_uint_eq(r.hits_lossy, 0);
    c.ladder = 1u << POLICY_CODEC_Q8;
    ck_assert_int_eq(sim_run(&tr, &c, &r), 0);
    ck_assert_uint_eq(r.hits_full, 2);
    ck_assert_uint_eq(r.hits_lossy, 1);
    ck_assert_uint_eq(r.hits_codec[POLICY_CODEC_Q8], 1);
    ck_assert_uint_eq(r.ladder_steps, 1);
    sim_trace_free(&tr);
    /* depth 0 is a sink: dropped, never quantized */
    ck_assert_int_eq(sim_trace_parse(&tr, sink, strlen(sink)), 0);
    c.capacity = 1.6;
    ck_assert_int_eq(sim_run(&tr, &c, &r), 0);
    ck_assert_uint_eq(r.hits_lossy, 0);
    ck_assert_uint_eq(r.ladder_steps, 0);
    ck_assert_uint_eq(r.hits_full, 0);
    sim_trace_free(&tr);
}
END_TEST

/* What a codec costs the tier (codec_room, kvcsim --layout): test_ladder_hand's trace at
 * 2.55 blocks. Charged its ratio (34/64), q8_0 block 2 leaves room for 3 beside the sink
 * (1 + 0.53 + 1) and r3 hits it lossy; charged 0.6 (a store's slot), it does not
 * (1 + 0.6 + 1 > 2.55): 2 leaves and r3 hits the sink only. */
START_TEST(test_codec_room)
{
    const char *t = "{\"timestamp\": 0, \"input_length\": 1024, \"hash_ids\": [1, 2]}\n"
                    "{\"timestamp\": 1, \"input_length\": 1024, \"hash_ids\": [1, 3]}\n"
                    "{\"timestamp\": 2, \"input_length\": 1024, \"hash_ids\": [1, 2]}\n";
    struct sim_trace tr;
    struct sim_config c;
    struct sim_result r;
    ck_assert_int_eq(sim_trace_parse(&tr, t, strlen(t)), 0);
    sim_config_init(&c);
    c.policy = POLICY_LRU;
    c.capacity = 2.55;
    c.ladder = 1u << POLICY_CODEC_Q8;
    ck_assert_int_eq(sim_run(&tr, &c, &r), 0);
    ck_assert_uint_eq(r.hits_lossy, 1);
    c.codec_room[POLICY_CODEC_Q8] = 0.6;
    ck_assert_int_eq(sim_run(&tr, &c, &r), 0);
    ck_assert_uint_eq(r.hits_lossy, 0);
    ck_assert_uint_eq(r.hits_full, 2);
    sim_trace_free(&tr);
}
END_TEST

/* Clients replaying in turn (procs): r1 writes [1,2]; with 2 clients r2 [1,2,3] looks up
 * while r1's put is not committed: 1 and 2 are busy misses, and 3 is put below them (the
 * daemon holds r2's put until r1's commits, then goes on); r3 [1,2] comes after r1's commit
 * and hits both, r4 [1,2,3] after r2's and hits all three. With one client every block but
 * the first request's hits. */
static const char procs_trace[] =
    "{\"timestamp\": 0, \"input_length\": 1024, \"hash_ids\": [1, 2]}\n"
    "{\"timestamp\": 1, \"input_length\": 1536, \"hash_ids\": [1, 2, 3]}\n"
    "{\"timestamp\": 2, \"input_length\": 1024, \"hash_ids\": [1, 2]}\n"
    "{\"timestamp\": 3, \"input_length\": 1536, \"hash_ids\": [1, 2, 3]}\n";

START_TEST(test_procs)
{
    struct sim_trace tr;
    struct sim_config c;
    struct sim_result r;
    ck_assert_int_eq(sim_trace_parse(&tr, procs_trace, strlen(procs_trace)), 0);
    sim_config_init(&c);
    c.policy = POLICY_LRU;
    c.capacity = 10;
    ck_assert_int_eq(sim_run(&tr, &c, &r), 0);
    ck_assert_uint_eq(r.hits_full, 7);
    ck_assert_uint_eq(r.busy, 0);
    c.procs = 2;
    ck_assert_int_eq(sim_run(&tr, &c, &r), 0);
    ck_assert_uint_eq(r.busy, 2);
    ck_assert_uint_eq(r.hits_full, 5);
    ck_assert_uint_eq(r.prefix_hits, 5);
    sim_trace_free(&tr);
}
END_TEST

/* A synthetic trace with shared prefixes (40 documents, each asked again with new
 * questions): the ladder turns capacity into hits, one rung more gives more, only the
 * allowed codecs serve, and the lossy weight trades lossy hits for raw ones. */
static char *ladder_trace(void)
{
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    unsigned seed = 3;
    ck_assert_ptr_nonnull(buf);
    for (int q = 0; q < 3000; q++) {
        int doc = (int)(rand_r(&seed) % 40), len = 6 + (int)(rand_r(&seed) % 6);
        n += (size_t)snprintf(buf + n, cap - n,
                              "{\"timestamp\": %d, \"input_length\": %d, \"hash_ids\": [",
                              q, (len + 2) * 512);
        for (int i = 0; i < len; i++)
            n += (size_t)snprintf(buf + n, cap - n, "%d, ", doc * 100 + i);
        n += (size_t)snprintf(buf + n, cap - n, "%d, %d]}\n", 100000 + q * 2, 100001 + q * 2);
        ck_assert_uint_lt(n, cap - 256);
    }
    return buf;
}

START_TEST(test_ladder_trace)
{
    char *text = ladder_trace();
    struct sim_trace tr;
    struct sim_config c;
    struct sim_result raw, q8, q84, heavy;
    ck_assert_int_eq(sim_trace_parse(&tr, text, strlen(text)), 0);
    sim_config_init(&c);
    c.policy = POLICY_DEFAULT;
    c.capacity = 120;
    ck_assert_int_eq(sim_run(&tr, &c, &raw), 0);
    c.ladder = 1u << POLICY_CODEC_Q8;
    ck_assert_int_eq(sim_run(&tr, &c, &q8), 0);
    c.ladder |= 1u << POLICY_CODEC_Q4;
    ck_assert_int_eq(sim_run(&tr, &c, &q84), 0);
    c.lossy_weight = 1000;
    ck_assert_int_eq(sim_run(&tr, &c, &heavy), 0);
    uint64_t h_raw = raw.hits_full, h_q8 = q8.hits_full + q8.hits_lossy,
             h_q84 = q84.hits_full + q84.hits_lossy;
    ck_assert_uint_gt(h_q8, h_raw + h_raw / 10);
    ck_assert_uint_gt(h_q84, h_q8);
    ck_assert_uint_gt(q8.hits_lossy, 0);
    ck_assert_uint_eq(q8.hits_lossy, q8.hits_codec[POLICY_CODEC_Q8]);
    ck_assert_uint_eq(q84.hits_lossy,
                      q84.hits_codec[POLICY_CODEC_Q8] + q84.hits_codec[POLICY_CODEC_Q4]);
    ck_assert_uint_gt(q84.hits_codec[POLICY_CODEC_Q4], 0);
    /* a lossy hit worth 1000 misses: most of the tier stays raw (0.89 at the end of this run,
     * 0.92 before the tuner's hysteresis: the share follows the half-life's path) */
    ck_assert_uint_lt(heavy.hits_lossy * 4, q84.hits_lossy);
    ck_assert_uint_gt(heavy.hits_full, q84.hits_full);
    ck_assert(heavy.raw_share > 0.85);
    ck_assert(q84.raw_share < 0.1);
    sim_trace_free(&tr);
    free(text);
}
END_TEST

START_TEST(test_default_tunes)
{
    struct sim_result lru, def, min;
    char *hot = gen(1), *rec = gen(0);
    run(hot, POLICY_LRU, 120, &lru);
    run(hot, POLICY_DEFAULT, 120, &def);
    run(hot, SIM_POLICY_MIN, 120, &min);
    ck_assert_uint_gt(def.hits_full, lru.hits_full + (min.hits_full - lru.hits_full) / 2);
    ck_assert_uint_le(def.hits_full, min.hits_full);
    run(rec, POLICY_LRU, 40, &lru);
    run(rec, POLICY_DEFAULT, 40, &def);
    run(rec, SIM_POLICY_MIN, 40, &min);
    ck_assert_uint_ge(def.hits_full, lru.hits_full);
    ck_assert_uint_le(def.hits_full, min.hits_full);
    free(hot);
    free(rec);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sim");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_parse);
    tcase_add_test(tc, test_lru_min_inf);
    tcase_add_test(tc, test_tokens);
    tcase_add_test(tc, test_prefix_ratio);
    tcase_add_test(tc, test_quantize_and_disk);
    tcase_add_test(tc, test_default_tunes);
    tcase_add_test(tc, test_ladder_hand);
    tcase_add_test(tc, test_ladder_trace);
    tcase_add_test(tc, test_codec_room);
    tcase_add_test(tc, test_procs);
    tcase_add_test(tc, test_counts);
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
