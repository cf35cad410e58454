/*
 * check_e2e_policy — policies end to end: a namespace takes `policy = h2o` from its
 * [namespace.PATTERN] section; of two otherwise equal prefixes the one a client reported high
 * H2O attention for survives pressure while the other is evicted; a budgeted lookup returns
 * the sink, the most-attended middle blocks and the recent window, pinned, with the right
 * bytes; kvcctl policy shows and changes each namespace's policy; VATP ranks raw blocks by the
 * value norms their disk writes measured; per-head hints change what a per-head budget
 * selects.
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

/* VATP's value norms from the disk write path: a namespace that allows no codec never meets
 * the quantize pass, so a raw block's norms come from the encode of its disk record. Eight
 * blocks of one chain, the even ones with values 16 times the odd ones', go to disk under the
 * pressure of fillers; read back, equally hinted, a budget of 4 by vatp takes the even ones
 * (H2O alone ties them, and ties go to the later positions: 4..7). */
#define PV_LEN 8
static const char pv_ini_fmt[] =
    "[host]\nsize = 16m\npage_size = 64k\nhugepages = off\nprefault = no\n\n"
    "[disk]\npath = %s/disk.kvc\ncapacity = 256m\npage = 1m\nadmit_hits = 0\n"
    "write_rate = 0\n\n[namespace.e2e-vatp*]\npolicy = vatp\n";

START_TEST(test_vatp_norms_from_disk)
{
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    char path[DAEMON_PATH_MAX], ini[2 * DAEMON_PATH_MAX];
    static struct kvc_key kv[PV_LEN], kf[PE_FILL * 2][PE_FILL_LEN];
    float score[PV_LEN];
    void *bufs[PV_LEN];
    struct kvc_layout lay = daemon_layout("e2e-vatp-model", 64); /* 64 KiB blocks */
    uint64_t writes = 0, quantized = 1, v = 0;
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    snprintf(ini, sizeof(ini), pv_ini_fmt, d.dir);
    ck_assert_int_eq(daemon_file_write(&d, "kvcd.ini", ini, path), 0);
    const char *args[] = {"-c", path, NULL};
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    size_t bb = kvc_ns_block_bytes(ns);
    /* [layer][k/v][token][head][dim] fp16: keys 0.5, values 1.0 (even blocks) or 1/16 */
    size_t row = (size_t)lay.block_tokens * lay.kv_heads * lay.head_dim;
    ck_assert_uint_eq(bb, (size_t)lay.layers * 2 * row * 2);
    ck_assert_int_eq(daemon_chain_keys(ns, 1, 0, 0, PV_LEN, kv), 0);
    for (int i = 0; i < PV_LEN; i++) {
        uint16_t *h = malloc(bb);
        for (uint32_t l = 0; l < lay.layers; l++)
            for (size_t j = 0; j < row; j++) {
                h[2 * l * row + j] = 0x3800;                             /* 0.5 */
                h[(2 * l + 1) * row + j] = i % 2 == 0 ? 0x3c00 : 0x2c00; /* 1 or 1/16 */
            }
        bufs[i] = h;
    }
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, kv, PV_LEN, (const void *const *)bufs), PV_LEN);
    ck_assert_int_eq(pe_hits(ns, kv, PV_LEN), PV_LEN); /* reused: worth a disk record */
    /* pressure: 400 more blocks of 64 KiB through 256 slots */
    for (int f = 0; f < PE_FILL * 2; f++) {
        ck_assert_int_eq(daemon_chain_keys(ns, 100 + (uint32_t)f, 0, 0, PE_FILL_LEN, kf[f]), 0);
        ck_assert_int_eq(pe_put(ns, kf[f], PE_FILL_LEN, bb), PE_FILL_LEN);
    }
    ck_assert_int_eq(daemon_stat(&d, "disk_writes", &writes), 0);
    ck_assert_uint_ge(writes, PV_LEN);
    ck_assert_int_eq(daemon_stat(&d, "quantized_blocks", &quantized), 0);
    ck_assert_uint_eq(quantized, 0); /* no codec allowed: the norms came from the disk path */
    for (int i = 0; i < PV_LEN; i++)
        score[i] = 100.0f;
    ck_assert_int_eq(kvc_hint(ns, KVC_HINT_ATTENTION, kv, score, PV_LEN), PV_LEN);
    /* every block back in memory (read from disk where it left), with the bytes put */
    kvc_lease *l;
    ck_assert_int_eq(kvc_lookup(ns, kv, PV_LEN, 0, &l), PV_LEN);
    void *buf = malloc(bb);
    for (int i = 0; i < PV_LEN; i++) {
        ck_assert_int_eq(kvc_lease_copy(l, (size_t)i, buf, bb), 0);
        ck_assert_int_eq(memcmp(buf, bufs[i], bb), 0);
    }
    ck_assert_int_eq(kvc_release(l), 0);
    struct kvc_budget bud = {.budget = 4, .policy = "vatp"};
    size_t pos[4], np = 0;
    ck_assert_int_eq(kvc_lookup_budget(ns, kv, PV_LEN, &bud, pos, &np, &l), 4);
    ck_assert_uint_eq(np, PV_LEN);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(pos[i] == (size_t)(2 * i), "vatp took position %zu as its #%d", pos[i], i);
    ck_assert_int_eq(kvc_release(l), 0);
    bud.policy = "h2o"; /* the same hints without the norms: a tie, the later ones */
    ck_assert_int_eq(kvc_lookup_budget(ns, kv, PV_LEN, &bud, pos, &np, &l), 4);
    ck_assert_uint_eq(pos[0], 4);
    ck_assert_int_eq(kvc_release(l), 0);
    ck_assert_int_eq(daemon_stat(&d, "promoted_blocks", &v), 0);
    ck_assert_uint_gt(v, 0); /* some came back from disk */
    for (int i = 0; i < PV_LEN; i++)
        free(bufs[i]);
    free(buf);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* Per-head budgets through the daemon: per-head hints on a chain of 20 blocks of a 2-layer,
 * 2-head namespace make heads 0 and 1 sink-only, head 2 local (the last two blocks) and head
 * 3 full (spread, blocks 5, 9 and 13 heavy). A budget of 4 blocks a head is then 16
 * head-blocks: the sink-only heads keep the sink (1 each), the local one the sink and the
 * window (3), and the full head the other 11: the lease holds 11 blocks where the same
 * request before the hints, and kvc_lookup_budget after them, hold 4. */
#define PH_LEN 20
START_TEST(test_budget_heads)
{
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    char path[DAEMON_PATH_MAX];
    static struct kvc_key k[PH_LEN];
    static float sc[PH_LEN][4];
    unsigned char heads[4] = {9, 9, 9, 9};
    size_t pos[PH_LEN], np = 0;
    kvc_lease *l;
    struct kvc_layout lay = daemon_layout("e2e-heads-model", 16); /* 2 layers x 2 kv heads */
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    ck_assert_int_eq(daemon_file_write(&d, "kvcd.ini", pe_ini, path), 0);
    const char *args[] = {"-c", path, NULL};
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    ck_assert_int_eq(daemon_chain_keys(ns, 7, 0, 0, PH_LEN, k), 0);
    ck_assert_int_eq(pe_put(ns, k, PH_LEN, kvc_ns_block_bytes(ns)), PH_LEN);
    struct kvc_budget bud = {.budget = 4, .policy = "h2o", .sinks = 1, .recent = 2};
    /* no profile yet: every head full, the plain selection */
    ck_assert_int_eq(kvc_lookup_budget_heads(ns, k, PH_LEN, &bud, pos, heads, &np, &l), 4);
    ck_assert_uint_eq(np, PH_LEN);
    for (int j = 0; j < 4; j++)
        ck_assert_uint_eq(heads[j], KVC_HEAD_UNKNOWN);
    ck_assert_int_eq(kvc_release(l), 0);
    for (int i = 0; i < PH_LEN; i++) {
        sc[i][0] = sc[i][1] = i == 0 ? 10.0f : 0.0f;           /* the sink */
        sc[i][2] = i >= PH_LEN - 2 ? 10.0f : 0.0f;             /* the last two blocks */
        sc[i][3] = i == 5 || i == 9 || i == 13 ? 50.0f : 1.0f; /* everywhere */
    }
    /* a score past KVC_HINT_SCORE_MAX is refused whole, nothing applied (summed into the
     * head masses, such scores once made them infinite for good) */
    float keep = sc[3][3];
    sc[3][3] = 3.0e38f;
    ck_assert_int_eq(kvc_hint_heads(ns, KVC_HINT_ATTENTION, k, &sc[0][0], PH_LEN, 2, 2), -EINVAL);
    sc[3][3] = keep;
    /* the bound is per head: a block's scalar hint (a sum over its heads) may pass it */
    float big = 2e9f;
    ck_assert_int_eq(kvc_hint(ns, KVC_HINT_ATTENTION, k, &big, 1), 1);
    ck_assert_int_eq(kvc_hint_heads(ns, KVC_HINT_ATTENTION, k, &sc[0][0], PH_LEN, 2, 2), PH_LEN);
    ck_assert_int_eq(kvc_lookup_budget_heads(ns, k, PH_LEN, &bud, pos, heads, &np, &l), 11);
    ck_assert_uint_eq(kvc_lease_count(l), 11);
    ck_assert_uint_eq(heads[0], KVC_HEAD_SINK);
    ck_assert_uint_eq(heads[1], KVC_HEAD_SINK);
    ck_assert_uint_eq(heads[2], KVC_HEAD_LOCAL);
    ck_assert_uint_eq(heads[3], KVC_HEAD_FULL);
    ck_assert_uint_eq(pos[0], 0);
    ck_assert_uint_eq(pos[9], PH_LEN - 2);
    ck_assert_uint_eq(pos[10], PH_LEN - 1);
    int heavy = 0;
    for (int i = 0; i < 11; i++)
        heavy += pos[i] == 5 || pos[i] == 9 || pos[i] == 13;
    ck_assert_int_eq(heavy, 3);
    void *buf = malloc(kvc_ns_block_bytes(ns));
    for (int i = 0; i < 11; i++) { /* the bytes put, at the positions named */
        ck_assert_int_eq(kvc_lease_copy(l, (size_t)i, buf, kvc_ns_block_bytes(ns)), 0);
        ck_assert_int_eq(daemon_block_check(&k[pos[i]], buf, kvc_ns_block_bytes(ns)), -1);
    }
    free(buf);
    ck_assert_int_eq(kvc_release(l), 0);
    /* the plain budgeted read is unchanged by the profile */
    ck_assert_int_eq(kvc_lookup_budget(ns, k, PH_LEN, &bud, pos, &np, &l), 4);
    ck_assert_int_eq(kvc_release(l), 0);
    /* a budget the sink-only and local heads' needs exceed: the full head still gets it */
    bud.budget = 1;
    ck_assert_int_eq(kvc_lookup_budget_heads(ns, k, PH_LEN, &bud, pos, NULL, &np, &l), 1);
    ck_assert_uint_eq(pos[0], 0);
    ck_assert_int_eq(kvc_release(l), 0);
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
    tcase_add_test(tc, test_vatp_norms_from_disk);
    tcase_add_test(tc, test_budget_heads);
    suite_add_tcase(s, tc);
    if (daemon_suite_init("e2e-policy"))
        return 1;
    return daemon_suite_run(s);
}
