/*
 * check_e2e_replay.c — kvcreplay against the real kvcd on a trace the suite writes itself.
 *
 * The trace (TRACE_REQUESTS requests) has shared prefixes of three kinds: a few system
 * prompts every request starts from, conversations that come back with their whole earlier
 * prompt plus new turns, and blocks of their own. The suite counts the trace's blocks and
 * infinite-cache hits itself, independently of kvcreplay. The host tier holds every distinct
 * block, so one process must hit exactly what an infinite cache hits; three processes at most
 * that (each distinct block is put by a request that missed it) and close to it (only
 * requests running at the same time can miss each other's blocks). Every run must have zero
 * wrong bytes; a run that checks the hits against another fill seed must find them wrong and
 * exit 1, so the byte check is known to fail when it should. A malformed line stops the run
 * with its line number before anything reaches the daemon.
 */
#include <check.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/daemon.h"
#include "tests/lib/rng.h"

#define TRACE_REQUESTS 300
#define TRACE_SYSTEMS 6     /* system prompts */
#define TRACE_SYSTEM_LEN 3  /* blocks each */
#define TRACE_MAX_BLOCKS 24 /* per request */
#define TRACE_GAP 8         /* a conversation returns at least this many requests later */
#define REPLAY_OUT 16384
#define KVCREPLAY daemon_bin("kvcreplay")

struct trace_req {
    uint64_t ids[TRACE_MAX_BLOCKS];
    int n;
};

struct trace_info {
    char path[DAEMON_PATH_MAX];
    uint64_t blocks, distinct, inf_hits;
};

static struct daemon rep_d;
static struct trace_info rep_trace;

/* Writes the trace into the daemon's directory and counts it: in this format an id names a
 * whole prefix, so a block hits an infinite cache iff its id came before. */
static void trace_write(const struct daemon *d, struct trace_info *ti)
{
    static struct trace_req req[TRACE_REQUESTS];
    static uint64_t seen[TRACE_REQUESTS * TRACE_MAX_BLOCKS];
    uint64_t s = 0x2545f4914f6cdd1dull, next_id = 1000;
    size_t nseen = 0;
    FILE *f;
    memset(ti, 0, sizeof(*ti));
    snprintf(ti->path, sizeof(ti->path), "%.150s/trace.jsonl", d->dir);
    f = fopen(ti->path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < TRACE_REQUESTS; i++) {
        struct trace_req *r = &req[i];
        uint64_t kind = rng_next(&s) % 10;
        int own;
        if (kind < 4 && i >= TRACE_GAP) { /* a conversation comes back with a new turn */
            const struct trace_req *prev = &req[rng_next(&s) % (uint64_t)(i - TRACE_GAP + 1)];
            *r = *prev;
        } else { /* a system prompt, then the request's own blocks */
            uint64_t sys = rng_next(&s) % TRACE_SYSTEMS;
            r->n = 0;
            for (int b = 0; b < TRACE_SYSTEM_LEN; b++)
                r->ids[r->n++] = sys * TRACE_SYSTEM_LEN + (uint64_t)b;
        }
        own = 1 + (int)(rng_next(&s) % 4);
        for (int b = 0; b < own && r->n < TRACE_MAX_BLOCKS; b++)
            r->ids[r->n++] = next_id++;
        fprintf(f,
                "{\"timestamp\": %d, \"input_length\": %d, \"output_length\": 10, "
                "\"hash_ids\": [",
                i * 100, r->n * 512 - (int)(rng_next(&s) % 500));
        for (int b = 0; b < r->n; b++) {
            bool hit = false;
            for (size_t k = 0; k < nseen && !hit; k++)
                hit = seen[k] == r->ids[b];
            if (!hit)
                seen[nseen++] = r->ids[b];
            ti->inf_hits += hit;
            fprintf(f, "%s%llu", b ? ", " : "", (unsigned long long)r->ids[b]);
        }
        fputs("]}\n", f);
        ti->blocks += (uint64_t)r->n;
    }
    ti->distinct = nseen;
    ck_assert_int_eq(fclose(f), 0);
}

static void rep_setup(void)
{
    static const char *const args[] = {"-o", "host.size=64m",      "-o", "host.page_size=256k",
                                       "-o", "host.hugepages=off", "-o", "host.prefault=no",
                                       NULL};
    memset(&rep_d, 0, sizeof(rep_d));
    ck_assert_int_eq(daemon_start(&rep_d, args), 0);
    trace_write(&rep_d, &rep_trace);
    /* 64 MiB hold 4096 blocks of 16 KiB; eviction starts at 95 % of it. */
    ck_assert_uint_lt(rep_trace.distinct, 3500);
}

static void rep_teardown(void)
{
    ck_assert_int_eq(daemon_stop(&rep_d), 0);
    daemon_cleanup(&rep_d);
}

/* Runs kvcreplay -s SOCK --json ARGS... TRACE; its exit status, its output on stderr when that
 * is not `expect`. */
static int rep_run(char *out, char *err, const char *trace, int expect, const char *a1,
                   const char *a2, const char *a3)
{
    const char *argv[16];
    int n = 0, rc;
    argv[n++] = KVCREPLAY;
    argv[n++] = "-s";
    argv[n++] = rep_d.sock;
    argv[n++] = "--json";
    if (a1)
        argv[n++] = a1;
    if (a2)
        argv[n++] = a2;
    if (a3)
        argv[n++] = a3;
    argv[n++] = trace;
    argv[n] = NULL;
    rc = daemon_run(argv, out, REPLAY_OUT, err, REPLAY_OUT, 60000);
    if (rc != expect)
        fprintf(stderr, "kvcreplay exit %d\nstdout: %s\nstderr: %s\n", rc, out, err);
    return rc;
}

static uint64_t rep_u64(const char *json, const char *key)
{
    uint64_t v = 0;
    ck_assert_msg(daemon_json_u64(json, key, &v) == 0, "no \"%s\" in %s", key, json);
    return v;
}

/* The number after `"key": ` inside the object that follows `"obj": `. */
static double rep_double_in(const char *json, const char *obj, const char *key)
{
    char pat[64];
    const char *p;
    snprintf(pat, sizeof(pat), "\"%s\": {", obj);
    p = strstr(json, pat);
    ck_assert_msg(p != NULL, "no object \"%s\" in %s", obj, json);
    snprintf(pat, sizeof(pat), "\"%s\": ", key);
    p = strstr(p, pat);
    ck_assert_msg(p != NULL, "no \"%s\" in \"%s\"", key, obj);
    return strtod(p + strlen(pat), NULL);
}

/* What every run must show, and its figures against the suite's own count of the trace. */
static void rep_check_common(const char *out)
{
    ck_assert_msg(daemon_json_valid(out), "not JSON: %s", out);
    ck_assert_uint_eq(rep_u64(out, "requests"), TRACE_REQUESTS);
    ck_assert_uint_eq(rep_u64(out, "blocks_looked_up"), rep_trace.blocks);
    ck_assert_uint_eq(rep_u64(out, "distinct_blocks"), rep_trace.distinct);
    ck_assert_uint_eq(rep_u64(out, "infinite_hits"), rep_trace.inf_hits);
    ck_assert_uint_eq(rep_u64(out, "wrong_bytes"), 0);
    ck_assert_uint_eq(rep_u64(out, "errors"), 0);
    ck_assert_uint_eq(rep_u64(out, "puts_refused"), 0);
    /* The daemon saw the hits the replay counted. */
    ck_assert_uint_eq(rep_u64(out, "hit_blocks"), rep_u64(out, "blocks_hit"));
    ck_assert_uint_eq(rep_u64(out, "bytes_loaded"), rep_u64(out, "blocks_hit") * 16384);
}

START_TEST(test_replay_one_process_hits_as_infinite_cache)
{
    static char out[REPLAY_OUT], err[REPLAY_OUT];
    ck_assert_int_eq(rep_run(out, err, rep_trace.path, 0, "-p", "1", NULL), 0);
    rep_check_common(out);
    ck_assert_uint_gt(rep_trace.inf_hits, rep_trace.blocks / 4);
    ck_assert_uint_eq(rep_u64(out, "blocks_hit"), rep_trace.inf_hits);
    ck_assert_uint_eq(rep_u64(out, "blocks_put"), rep_trace.distinct);
    /* kvcsim, with the same capacity (the whole trace fits), predicts the same. */
    ck_assert_double_eq_tol(rep_double_in(out, "kvcsim", "block_hit_ratio"),
                            (double)rep_trace.inf_hits / (double)rep_trace.blocks, 1e-3);
}
END_TEST

/* --chain: kvcreplay hands kvcsim the chained keys as the trace's ids, each below 2^63 as the
 * trace format bounds them, so kvcsim predicts the run (kvcsim refused the keys above 2^63,
 * about half of them, and the prediction was null). */
START_TEST(test_replay_chain_kvcsim_predicts)
{
    static char out[REPLAY_OUT], err[REPLAY_OUT];
    ck_assert_int_eq(rep_run(out, err, rep_trace.path, 0, "--chain", "-p", "1"), 0);
    rep_check_common(out);
    ck_assert_uint_eq(rep_u64(out, "blocks_hit"), rep_trace.inf_hits);
    ck_assert_msg(!strstr(err, "kvcsim"), "%s", err);
    ck_assert_double_eq_tol(rep_double_in(out, "kvcsim", "block_hit_ratio"),
                            (double)rep_trace.inf_hits / (double)rep_trace.blocks, 1e-3);
}
END_TEST

START_TEST(test_replay_three_processes_hit_close_to_infinite_cache)
{
    static char out[REPLAY_OUT], err[REPLAY_OUT];
    uint64_t hits;
    ck_assert_int_eq(rep_run(out, err, rep_trace.path, 0, "-p", "3", NULL), 0);
    rep_check_common(out);
    hits = rep_u64(out, "blocks_hit");
    ck_assert_uint_le(hits, rep_trace.inf_hits);
    ck_assert_msg(hits * 10 >= rep_trace.inf_hits * 9, "%llu hits of an infinite cache's %llu",
                  (unsigned long long)hits, (unsigned long long)rep_trace.inf_hits);
    /* Nothing is put twice: a block another process was writing is left to it. */
    ck_assert_uint_le(rep_u64(out, "blocks_put"), rep_trace.distinct);
}
END_TEST

START_TEST(test_replay_wrong_fill_seed_is_detected)
{
    static char out[REPLAY_OUT], err[REPLAY_OUT];
    ck_assert_int_eq(rep_run(out, err, rep_trace.path, 0, "-p", "1", "--no-sim"), 0);
    /* The same trace again, hits checked against another seed: every hit is wrong. */
    ck_assert_int_eq(rep_run(out, err, rep_trace.path, 1, "-p", "2", "--verify-seed=1"), 1);
    ck_assert_msg(daemon_json_valid(out), "not JSON: %s", out);
    ck_assert_uint_gt(rep_u64(out, "blocks_hit"), 0);
    ck_assert_uint_eq(rep_u64(out, "wrong_blocks"), rep_u64(out, "blocks_hit"));
    ck_assert_uint_gt(rep_u64(out, "wrong_bytes"), rep_u64(out, "blocks_hit") * 16000);
    ck_assert_uint_eq(rep_u64(out, "errors"), 0);
    ck_assert_ptr_nonnull(strstr(err, "wrong bytes"));
}
END_TEST

START_TEST(test_replay_malformed_line_stops_before_the_daemon)
{
    static char out[REPLAY_OUT], err[REPLAY_OUT];
    char path[DAEMON_PATH_MAX];
    uint64_t committed = 1;
    ck_assert_int_eq(daemon_file_write(&rep_d, "bad.jsonl",
                                       "{\"timestamp\": 0, \"hash_ids\": [1, 2]}\n"
                                       "\n"
                                       "{\"timestamp\": 1, \"hash_ids\": [1, 2, 3]}\n"
                                       "{\"timestamp\": 2, \"hash_ids\": [1, 2, -3]}\n",
                                       path),
                     0);
    ck_assert_int_eq(rep_run(out, err, path, 2, NULL, NULL, NULL), 2);
    ck_assert_msg(strstr(err, "bad.jsonl:4: hash_ids") != NULL, "stderr: %s", err);
    ck_assert_int_eq(daemon_stat(&rep_d, "committed_blocks", &committed), 0);
    ck_assert_uint_eq(committed, 0);
}
END_TEST

/* --quant: a namespace that allows q8_0 in a daemon that quantizes its cold tail before it
 * evicts (cache.policy = lru, a wide watermark band): lossy hits come back within q8_0's
 * bound, counted alike by the client and the daemon; checked against another seed, every hit
 * (lossy or raw) is wrong. Too small a block is refused before the daemon is asked. */
START_TEST(test_replay_quant_lossy_hits_checked)
{
    static char out[REPLAY_OUT], err[REPLAY_OUT];
    static const char *const args[] = {
        "-o", "host.size=16m",           "-o", "host.page_size=64k",
        "-o", "host.hugepages=off",      "-o", "host.prefault=no",
        "-o", "cache.policy=lru",        "-o", "host.high_watermark=0.90",
        "-o", "host.low_watermark=0.60", "-o", "host.quantize_inflight=64",
        NULL};
    struct daemon q = {0};
    uint64_t v = 0;
    ck_assert_int_eq(daemon_start(&q, args), 0);
    const char *argv[] = {KVCREPLAY,  "-s",           q.sock, "--json",
                          "--no-sim", "--quant",      "q8_0", "--block-bytes",
                          "64k",      rep_trace.path, NULL};
    int rc = daemon_run(argv, out, REPLAY_OUT, err, REPLAY_OUT, 60000);
    ck_assert_msg(rc == 0, "kvcreplay exit %d: %s %s", rc, out, err);
    ck_assert_msg(daemon_json_valid(out), "not JSON: %s", out);
    ck_assert_uint_eq(rep_u64(out, "wrong_bytes"), 0);
    ck_assert_uint_eq(rep_u64(out, "errors"), 0);
    uint64_t lossy = rep_u64(out, "hits_lossy");
    ck_assert_uint_gt(lossy, 0);
    ck_assert_int_eq(daemon_stat(&q, "hit_blocks_q8_0", &v), 0);
    ck_assert_uint_eq(v, lossy);
    /* every hit checked against another seed: wrong, lossy or not */
    const char *bad[] = {KVCREPLAY,      "-s",   q.sock,          "--json", "--no-sim",
                         "--quant",      "q8_0", "--block-bytes", "64k",    "--verify-seed=7",
                         rep_trace.path, NULL};
    ck_assert_int_eq(daemon_run(bad, out, REPLAY_OUT, err, REPLAY_OUT, 60000), 1);
    ck_assert_uint_gt(rep_u64(out, "blocks_hit"), 0);
    ck_assert_uint_eq(rep_u64(out, "wrong_blocks"), rep_u64(out, "blocks_hit"));
    /* the transform codecs too, each within its bound (kvcreplay's replay_codec_bound) */
    static const struct {
        const char *codec;
        double bound;
    } more[] = {{"rot4", 0.12}, {"lowrank", 0.5}};
    for (size_t k = 0; k < sizeof(more) / sizeof(more[0]); k++) {
        const char *tv[] = {KVCREPLAY, "-s",          q.sock, "--json",       "--no-sim",
                            "--model", more[k].codec, /* a namespace of its own recipe */
                            "--quant", more[k].codec, "--block-bytes", "64k", rep_trace.path, NULL};
        rc = daemon_run(tv, out, REPLAY_OUT, err, REPLAY_OUT, 60000);
        ck_assert_msg(rc == 0, "%s: kvcreplay exit %d: %s %s", more[k].codec, rc, out, err);
        ck_assert_uint_eq(rep_u64(out, "wrong_bytes"), 0);
        ck_assert_uint_gt(rep_u64(out, "hits_lossy"), 0);
        const char *ep = strstr(out, "\"lossy_err_max\": ");
        ck_assert_ptr_nonnull(ep);
        double e = strtod(ep + strlen("\"lossy_err_max\": "), NULL);
        ck_assert_msg(e > 0 && e <= more[k].bound, "%s: largest error %g", more[k].codec, e);
    }
    const char *small[] = {KVCREPLAY, "-s", q.sock, "--quant", "q8_0", rep_trace.path, NULL};
    ck_assert_int_eq(daemon_run(small, out, REPLAY_OUT, err, REPLAY_OUT, 60000), 2);
    ck_assert_msg(strstr(err, "--block-bytes 64k") != NULL, "stderr: %s", err);
    ck_assert_int_eq(daemon_stop(&q), 0);
    daemon_cleanup(&q);
}
END_TEST

/* A trace where counts matter: 300 documents of 6 blocks asked with a skewed popularity (a
 * few often, most rarely), each request followed by 3 blocks of its own: the documents alone
 * are more than the host tier holds. Written into dir; its path in path. */
static void policy_trace_write(const char *dir, char *path, size_t len)
{
    uint64_t s = 0x9e3779b97f4a7c15ull, own = 1000000;
    FILE *f;
    snprintf(path, len, "%.150s/policy.jsonl", dir);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 3000; i++) {
        /* doc = floor(300 * u^3): the first few often, most rarely */
        double u = (double)(rng_next(&s) >> 11) * 0x1p-53;
        int doc = (int)(300.0 * u * u * u);
        fprintf(f, "{\"timestamp\": %d, \"input_length\": %d, \"hash_ids\": [", i, 9 * 512);
        for (int b = 0; b < 6; b++)
            fprintf(f, "%d, ", doc * 10 + b);
        fprintf(f, "%llu, %llu, %llu]}\n", (unsigned long long)own, (unsigned long long)own + 1,
                (unsigned long long)own + 2);
        own += 3;
    }
    ck_assert_int_eq(fclose(f), 0);
}

/* Block hit ratio of one kvcreplay -p 1 run against a fresh kvcd with `policy` and a 16 MiB
 * host tier (1024 blocks of 16 KiB); *sim gets kvcsim's for the same policy and capacity. */
static double policy_run(const char *policy, const char *trace, double *sim)
{
    static char out[REPLAY_OUT], err[REPLAY_OUT];
    char pol[64];
    snprintf(pol, sizeof(pol), "cache.policy=%s", policy);
    const char *args[] = {"-o", "host.size=16m",
                          "-o", "host.page_size=64k",
                          "-o", "host.hugepages=off",
                          "-o", "host.prefault=no",
                          "-o", pol,
                          NULL};
    struct daemon d = {0};
    ck_assert_int_eq(daemon_start(&d, args), 0);
    const char *argv[] = {KVCREPLAY, "-s", d.sock, "--json", "-p", "1", trace, NULL};
    int rc = daemon_run(argv, out, REPLAY_OUT, err, REPLAY_OUT, 120000);
    ck_assert_msg(rc == 0, "kvcreplay exit %d: %s %s", rc, out, err);
    ck_assert_uint_eq(rep_u64(out, "wrong_bytes"), 0);
    double hit = (double)rep_u64(out, "blocks_hit") / (double)rep_u64(out, "blocks_looked_up");
    *sim = rep_double_in(out, "kvcsim", "block_hit_ratio");
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
    return hit;
}

/* The daemon's policies rank as kvcsim's do: under `default` and `lfu` it gets within 5 % of
 * the simulator, and ahead of its own `lru` where counts matter. Regression: with an
 * eviction sample of a few tail leaves, `default` and `lfu` evicted in LRU order. */
START_TEST(test_replay_policies_follow_kvcsim)
{
    char trace[DAEMON_PATH_MAX];
    double sim_lru, sim_lfu, sim_def;
    policy_trace_write(rep_d.dir, trace, sizeof(trace));
    double lru = policy_run("lru", trace, &sim_lru);
    double lfu = policy_run("lfu", trace, &sim_lfu);
    double def = policy_run("default", trace, &sim_def);
    printf("e2e_replay: policies: lru %.4f (kvcsim %.4f), lfu %.4f (%.4f), default %.4f "
           "(%.4f)\n",
           lru, sim_lru, lfu, sim_lfu, def, sim_def);
    ck_assert_msg(lfu >= 0.95 * sim_lfu, "lfu %.4f against kvcsim %.4f", lfu, sim_lfu);
    ck_assert_msg(def >= 0.95 * sim_def, "default %.4f against kvcsim %.4f", def, sim_def);
    ck_assert_msg(sim_lfu > 1.05 * sim_lru, "the trace should reward counts: %.4f, %.4f", sim_lfu,
                  sim_lru);
    ck_assert_msg(lfu > 1.05 * lru, "lfu %.4f not ahead of lru %.4f", lfu, lru);
}
END_TEST

/* A ladder whose last rung is merge, on blocks merge refuses (kvcreplay's smooth fill has no
 * runs of alike tokens): each refused block leaves, or, holding children, stays raw off the
 * ladder until its last child goes; it is never taken to merge again and again. Regression:
 * a slab step whose group held a refused block changed nothing and was tried again at once
 * (millions of refusals in a minute, both CPUs busy), the arena stayed full and every put
 * waited out its timeout. And after a window of steps nearly all refused, merge is off the
 * ladder: q8_0 before it then holds blocks and serves hits (before: every q8_0 block was
 * stepped on to merge and left, no lossy hit at all). Counts, not time. */
START_TEST(test_replay_merge_refused_blocks_leave)
{
    static char out[REPLAY_OUT], err[REPLAY_OUT];
    static const char *const args[] = {"-o", "host.size=16m",      "-o", "host.page_size=256k",
                                       "-o", "host.hugepages=off", "-o", "host.prefault=no",
                                       NULL};
    static const char *const mixes[] = {"merge", "q8_0,merge"};
    char trace[DAEMON_PATH_MAX];
    policy_trace_write(rep_d.dir, trace, sizeof(trace));
    for (size_t m = 0; m < sizeof(mixes) / sizeof(mixes[0]); m++) {
        struct daemon d = {0};
        uint64_t refused = 0, committed = 0, timeouts = 0, evicted = 0, off = 0, q8 = 0;
        ck_assert_int_eq(daemon_start(&d, args), 0);
        const char *argv[] = {KVCREPLAY, "-s",   d.sock,    "--json", "--no-sim",
                              "-n",      "1500", "--quant", mixes[m], "--block-bytes",
                              "64k",     trace,  NULL};
        int rc = daemon_run(argv, out, REPLAY_OUT, err, REPLAY_OUT, 60000);
        ck_assert_msg(rc == 0, "%s: kvcreplay exit %d: %s %s", mixes[m], rc, out, err);
        ck_assert_uint_eq(rep_u64(out, "wrong_bytes"), 0);
        ck_assert_uint_eq(rep_u64(out, "errors"), 0);
        ck_assert_int_eq(daemon_stat(&d, "merge_refused_blocks", &refused), 0);
        ck_assert_int_eq(daemon_stat(&d, "committed_blocks", &committed), 0);
        ck_assert_int_eq(daemon_stat(&d, "put_wait_timeouts", &timeouts), 0);
        ck_assert_int_eq(daemon_stat(&d, "evicted_blocks", &evicted), 0);
        ck_assert_int_eq(daemon_stat(&d, "merge_off", &off), 0);
        ck_assert_int_eq(daemon_stat(&d, "hit_blocks_q8_0", &q8), 0);
        printf("e2e_replay: %s: %" PRIu64 " committed, %" PRIu64 " merge refusals, %" PRIu64
               " evicted, %" PRIu64 " put timeouts, hit ratio %.4f\n",
               mixes[m], committed, refused, evicted, timeouts,
               (double)rep_u64(out, "blocks_hit") / (double)rep_u64(out, "blocks_looked_up"));
        ck_assert_uint_gt(refused, 0); /* the case: merge refuses these blocks */
        ck_assert_uint_le(refused, committed);
        /* one window of refusals (and jobs in flight then), fewer blocks than a retry takes */
        ck_assert_uint_lt(committed, 65536);
        ck_assert_uint_eq(off, 1);
        ck_assert_uint_le(refused, 2 * 256);
        if (m == 1)
            ck_assert_uint_gt(q8, 0);
        ck_assert_uint_eq(timeouts, 0);
        ck_assert_uint_gt(evicted, 0);
        ck_assert_int_eq(daemon_stop(&d), 0);
        daemon_cleanup(&d);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_replay");
    TCase *tc = tcase_create("replay");
    tcase_add_checked_fixture(tc, rep_setup, rep_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_replay_one_process_hits_as_infinite_cache);
    tcase_add_test(tc, test_replay_three_processes_hit_close_to_infinite_cache);
    tcase_add_test(tc, test_replay_wrong_fill_seed_is_detected);
    tcase_add_test(tc, test_replay_malformed_line_stops_before_the_daemon);
    tcase_add_test(tc, test_replay_quant_lossy_hits_checked);
    tcase_add_test(tc, test_replay_policies_follow_kvcsim);
    tcase_add_test(tc, test_replay_merge_refused_blocks_leave);
    tcase_add_test(tc, test_replay_chain_kvcsim_predicts);
    suite_add_tcase(s, tc);
    if (daemon_suite_init("e2e-replay"))
        return 1;
    return daemon_suite_run(s);
}
