/*
 * check_e2e_policy — policies end to end: a namespace takes `policy = h2o` from its
 * [namespace.PATTERN] section; of two otherwise equal prefixes the one a client reported high
 * H2O attention for survives pressure while the other is evicted; a budgeted lookup returns
 * the sink, the most-attended middle blocks and the recent window, pinned, with the right
 * bytes; kvcctl policy shows and changes each namespace's policy.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/lib/daemon.h"

#define PE_LEN 40     /* blocks per hinted/unhinted prefix */
#define PE_FILL 20    /* filler prefixes */
#define PE_FILL_LEN 10

static const char pe_ini[] = "[host]\nsize = 16m\npage_size = 64k\nhugepages = off\n"
                             "prefault = no\n\n[namespace.e2e-hint*]\npolicy = h2o\n";

static int pe_put(kvc_ns *ns, const struct kvc_key *keys, size_t n, size_t bb)
{
    void **bufs = calloc(n, sizeof(*bufs));
    int rc;
    for (size_t i = 0; i < n; i++) {
        bufs[i] = malloc(bb);
        daemon_block_fill(&keys[i], bufs[i], bb);
    }
    rc = kvc_put_prefix(ns, NULL, keys, n, (const void *const *)bufs);
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    return rc;
}

static int pe_hits(kvc_ns *ns, const struct kvc_key *keys, size_t n)
{
    kvc_lease *l;
    int h = kvc_lookup(ns, keys, n, 0, &l);
    if (h > 0)
        kvc_release(l);
    return h;
}

START_TEST(test_hints_keep_and_budget)
{
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns, *other;
    char path[DAEMON_PATH_MAX], out[65536], err[4096];
    static struct kvc_key ka[PE_LEN], kb[PE_LEN], kf[PE_FILL][PE_FILL_LEN];
    float score[PE_LEN];
    struct kvc_layout lay = daemon_layout("e2e-hint-model", 64); /* 64 KiB blocks */
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    ck_assert_int_eq(daemon_file_write(&d, "kvcd.ini", pe_ini, path), 0);
    const char *args[] = {"-c", path, NULL};
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    size_t bb = kvc_ns_block_bytes(ns);
    ck_assert_uint_eq(bb, 64 << 10);
    /* the section named the policy */
    ck_assert_int_eq(daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "policy", NULL), 0);
    ck_assert_msg(strstr(out, "default policy: default") && strstr(out, "e2e-hint-model") &&
                      strstr(out, "h2o") && strstr(out, "config"),
                  "%s", out);
    /* two equal prefixes (two families, nothing shared); the one to be hinted, B, goes in
     * first, so that recency alone would evict it before A */
    ck_assert_int_eq(daemon_chain_keys(ns, 1, 0, 0, PE_LEN, ka), 0);
    ck_assert_int_eq(daemon_chain_keys(ns, 2, 0, 0, PE_LEN, kb), 0);
    ck_assert_int_eq(pe_put(ns, kb, PE_LEN, bb), PE_LEN);
    ck_assert_int_eq(pe_put(ns, ka, PE_LEN, bb), PE_LEN);
    /* the engine of B reports attention: every block heavy, blocks 10..12 the heaviest */
    for (int i = 0; i < PE_LEN; i++)
        score[i] = i >= 10 && i <= 12 ? 500.0f : 50.0f;
    ck_assert_int_eq(kvc_hint(ns, KVC_HINT_ATTENTION, kb, score, PE_LEN), PE_LEN);
    ck_assert_int_eq(kvc_hint(ns, 7, kb, score, PE_LEN), -EINVAL);
    score[0] = -1.0f;
    ck_assert_int_eq(kvc_hint(ns, KVC_HINT_ATTENTION, kb, score, 1), -EINVAL);
    score[0] = 50.0f;
    /* pressure: 80 + 200 blocks of 64 KiB in 16 MiB (256 slots, high watermark 95 %) */
    for (int f = 0; f < PE_FILL; f++) {
        ck_assert_int_eq(daemon_chain_keys(ns, 100 + (uint32_t)f, 0, 0, PE_FILL_LEN, kf[f]), 0);
        ck_assert_int_eq(pe_put(ns, kf[f], PE_FILL_LEN, bb), PE_FILL_LEN);
    }
    uint64_t ev = 0;
    ck_assert_int_eq(daemon_stat(&d, "evicted_blocks", &ev), 0);
    ck_assert_uint_gt(ev, PE_LEN / 2);
    /* the hinted prefix survived whole; the other, younger, lost most of its blocks (the
     * rest of the evictions went to fillers: the sample is the LRU tail's window plus random
     * probes, not a full ordering) */
    ck_assert_int_eq(pe_hits(ns, kb, PE_LEN), PE_LEN);
    ck_assert_int_lt(pe_hits(ns, ka, PE_LEN), PE_LEN / 2);
    /* budgeted read of B: sink + the three heaviest + the last two */
    struct kvc_budget bud = {.budget = 6, .policy = "h2o", .sinks = 1, .recent = 2};
    size_t pos[6], np = 0;
    kvc_lease *l;
    int n = kvc_lookup_budget(ns, kb, PE_LEN, &bud, pos, &np, &l);
    ck_assert_int_eq(n, 6);
    ck_assert_uint_eq(np, PE_LEN);
    size_t want[6] = {0, 10, 11, 12, PE_LEN - 2, PE_LEN - 1};
    void *buf = malloc(bb);
    for (int i = 0; i < 6; i++) {
        ck_assert_uint_eq(pos[i], want[i]);
        ck_assert_int_eq(kvc_lease_copy(l, (size_t)i, buf, bb), 0);
        ck_assert_int_eq(daemon_block_check(&kb[pos[i]], buf, bb), -1);
    }
    ck_assert_uint_eq(kvc_lease_count(l), 6);
    ck_assert_int_eq(kvc_release(l), 0);
    /* the namespace's own policy (h2o) is the default choice; a query needs head_dim */
    bud.policy = NULL;
    ck_assert_int_eq(kvc_lookup_budget(ns, kb, PE_LEN, &bud, pos, &np, &l), 6);
    ck_assert_uint_eq(pos[1], 10);
    kvc_release(l);
    float qv[3] = {1, 2, 3};
    bud.query = qv;
    bud.query_dim = 3;
    ck_assert_int_eq(kvc_lookup_budget(ns, kb, PE_LEN, &bud, pos, &np, &l), -EINVAL);
    bud.query = NULL;
    bud.query_dim = 0;
    bud.policy = "nonesuch";
    ck_assert_int_eq(kvc_lookup_budget(ns, kb, PE_LEN, &bud, pos, &np, &l), -EINVAL);
    /* kvcctl: another namespace follows the default until set */
    struct kvc_layout lo = daemon_layout("e2e-other", 16);
    ck_assert_int_eq(kvc_ns_open(c, &lo, &other), 0);
    ck_assert_int_eq(daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "policy", "get",
                                   "--ns", "2", NULL),
                     0);
    ck_assert_str_eq(out, "default\n");
    ck_assert_int_eq(daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "policy", "set",
                                   "--ns", "2", "streaming", NULL),
                     0);
    ck_assert_int_eq(daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "--json", "policy",
                                   NULL),
                     0);
    ck_assert_msg(daemon_json_valid(out), "%s", out);
    ck_assert_msg(strstr(out, "\"policy\": \"streaming\", \"source\": \"admin\""), "%s", out);
    ck_assert_int_ne(daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "policy", "set",
                                   "--ns", "9", "lru", NULL),
                     0);
    ck_assert_ptr_nonnull(strstr(err, "no such namespace"));
    uint64_t v = 0;
    ck_assert_int_eq(daemon_stat(&d, "hint_blocks", &v), 0);
    ck_assert_uint_eq(v, PE_LEN);
    ck_assert_int_eq(daemon_stat(&d, "budget_lookups", &v), 0);
    ck_assert_uint_ge(v, 2);
    free(buf);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_policy");
    TCase *tc = tcase_create("policy");
    tcase_set_timeout(tc, daemon_slow() * 120);
    tcase_add_test(tc, test_hints_keep_and_budget);
    suite_add_tcase(s, tc);
    if (daemon_suite_init("e2e-policy"))
        return 1;
    return daemon_suite_run(s);
}
