/*
 * check_e2e_kvcctl.c — kvcctl's commands against a real kvcd, in text and JSON, and its
 * exit codes (0 ok, 1 no daemon, 2 usage).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/daemon.h"

#define CT_OUT (1 << 17)

static struct daemon ct_d;
static char ct_out[CT_OUT], ct_err[CT_OUT];

static void ct_setup(void)
{
    static const char *const args[] = {"-o", "host.size=32m", "-o", "host.page_size=64k", NULL};
    memset(&ct_d, 0, sizeof(ct_d));
    ck_assert_int_eq(daemon_start(&ct_d, args), 0);
    ck_assert_int_eq(daemon_roundtrip(&ct_d), 0); /* one namespace with 3 blocks */
}

static void ct_teardown(void)
{
    ck_assert_int_eq(daemon_stop(&ct_d), 0);
    daemon_cleanup(&ct_d);
}

static uint64_t ct_json_u64(const char *key)
{
    uint64_t v = 0;
    ck_assert_msg(daemon_json_u64(ct_out, key, &v) == 0, "no \"%s\" in %s", key, ct_out);
    return v;
}

START_TEST(test_kvcctl_json_validator)
{
    /* The validator itself must be able to say no. */
    ck_assert(daemon_json_valid("{\"a\": [1, 2.5e3, -0, \"x\\n\", true, null], \"b\": {}}\n"));
    ck_assert(!daemon_json_valid("{\"a\": 1,}"));
    ck_assert(!daemon_json_valid("{\"a\" 1}"));
    ck_assert(!daemon_json_valid("[1, 2"));
    ck_assert(!daemon_json_valid("[01]"));
    ck_assert(!daemon_json_valid("{} {}"));
    ck_assert(!daemon_json_valid(""));
}
END_TEST

START_TEST(test_kvcctl_status)
{
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "status", NULL), 0);
    ck_assert_msg(strstr(ct_out, "kvcd pid") && strstr(ct_out, "host tier"), "%s", ct_out);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "--json", "status",
                                   NULL),
                     0);
    ck_assert_msg(daemon_json_valid(ct_out), "not JSON: %s", ct_out);
    ck_assert_uint_eq(ct_json_u64("pid"), (uint64_t)ct_d.pid);
    ck_assert_uint_eq(ct_json_u64("namespaces"), 1);
    ck_assert_uint_eq(ct_json_u64("blocks"), 3);
    ck_assert_uint_eq(ct_json_u64("clients"), 1);
    ck_assert_uint_ge(ct_json_u64("host_capacity"), 16u << 20);
    ck_assert_uint_ge(ct_json_u64("host_used"), 3 * 16384);
}
END_TEST

START_TEST(test_kvcctl_stats)
{
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "stats", NULL), 0);
    ck_assert_msg(strstr(ct_out, "total:") && strstr(ct_out, "committed_blocks") &&
                      strstr(ct_out, "e2e-roundtrip"),
                  "%s", ct_out);
    /* --json after the command works as well as before it. */
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "stats", "--json",
                                   NULL),
                     0);
    ck_assert_msg(daemon_json_valid(ct_out), "not JSON: %s", ct_out);
    ck_assert_uint_eq(ct_json_u64("committed_blocks"), 3);
    ck_assert_uint_eq(ct_json_u64("blocks_now"), 3);
    ck_assert_uint_eq(ct_json_u64("pins_now"), 0);
    ck_assert_uint_eq(ct_json_u64("reserved_now"), 0);
    ck_assert_ptr_nonnull(strstr(ct_out, "\"model\": \"e2e-roundtrip\""));
}
END_TEST

START_TEST(test_kvcctl_ns)
{
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ns", NULL), 0);
    ck_assert_msg(strstr(ct_out, "MODEL") && strstr(ct_out, "e2e-roundtrip") &&
                      strstr(ct_out, "fp16"),
                  "%s", ct_out);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "-j", "ns", NULL), 0);
    ck_assert_msg(daemon_json_valid(ct_out), "not JSON: %s", ct_out);
    ck_assert_uint_eq(ct_json_u64("id"), 1);
    ck_assert_uint_eq(ct_json_u64("layers"), 2);
    ck_assert_uint_eq(ct_json_u64("block_tokens"), 16);
    ck_assert_uint_eq(ct_json_u64("block_bytes"), 16384);
    ck_assert_uint_eq(ct_json_u64("blocks"), 3);
    ck_assert_ptr_nonnull(strstr(ct_out, "\"dtype\": \"fp16\""));
}
END_TEST

static size_t ct_count(const char *s, const char *what)
{
    size_t n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

START_TEST(test_kvcctl_ls)
{
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ls", NULL), 0);
    ck_assert_msg(strstr(ct_out, "KEY") && strstr(ct_out, "PARENT"), "%s", ct_out);
    ck_assert_uint_eq(ct_count(ct_out, "\n"), 4); /* header and 3 blocks */
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ls", "--json", NULL),
                     0);
    ck_assert_msg(daemon_json_valid(ct_out), "not JSON: %s", ct_out);
    ck_assert_uint_eq(ct_count(ct_out, "\"key\""), 3);
    ck_assert_uint_eq(ct_count(ct_out, "\"depth\": 0"), 1);
    ck_assert_uint_eq(ct_count(ct_out, "\"depth\": 2"), 1);
    ck_assert_uint_eq(ct_count(ct_out, "\"parent\": \"00000000000000000000000000000000\""), 1);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ls", "--json",
                                   "--limit", "2", NULL),
                     0);
    ck_assert(daemon_json_valid(ct_out));
    ck_assert_uint_eq(ct_count(ct_out, "\"key\""), 2);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ls", "--json", "--ns",
                                   "7", NULL),
                     0);
    ck_assert(daemon_json_valid(ct_out));
    ck_assert_uint_eq(ct_count(ct_out, "\"key\""), 0);
}
END_TEST

/* kvc_get_prefix reports its copy time at release; the daemon adds it up beside the
 * recompute time the hits saved at cache.recompute_tokens_per_s (default 8000). */
START_TEST(test_load_vs_recompute_counters)
{
    uint64_t load0, load1, hit0, hit1, saved;
    ck_assert_int_eq(daemon_stat(&ct_d, "load_us", &load0), 0);
    ck_assert_int_eq(daemon_stat(&ct_d, "hit_tokens", &hit0), 0);
    for (int i = 0; i < 20; i++) /* 20 gets of 48 KiB: well over a microsecond of copying */
        ck_assert_int_eq(daemon_roundtrip(&ct_d), 0);
    ck_assert_int_eq(daemon_stat(&ct_d, "load_us", &load1), 0);
    ck_assert_int_eq(daemon_stat(&ct_d, "hit_tokens", &hit1), 0);
    ck_assert_int_eq(daemon_stat(&ct_d, "recompute_saved_est_us", &saved), 0);
    ck_assert_uint_eq(hit1 - hit0, 20 * 3 * 16);
    ck_assert_uint_gt(load1, load0);
    ck_assert_uint_eq(saved, hit1 * 1000000 / 8000);
}
END_TEST

/* kvcctl tiers: no GPU stats and no disk here (rows say disabled), then a daemon with a
 * disk tier, in text and JSON, rates since start and between two samples. */
START_TEST(test_kvcctl_tiers)
{
    struct daemon dd;
    char opt[DAEMON_PATH_MAX + 32];
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "tiers", "--interval",
                                   "0.2", NULL),
                     0);
    ck_assert_msg(strstr(ct_out, "TIER") && strstr(ct_out, "gpu   disabled") &&
                      strstr(ct_out, "\nhost ") && strstr(ct_out, "disk  disabled"),
                  "%s", ct_out);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "--json", "tiers",
                                   "--interval", "0", NULL),
                     0);
    ck_assert_msg(daemon_json_valid(ct_out), "not JSON: %s", ct_out);
    ck_assert_msg(strstr(ct_out, "{\"tier\": \"gpu\", \"enabled\": false}"), "%s", ct_out);
    ck_assert_uint_ge(ct_json_u64("capacity"), 16u << 20); /* the host row comes first */
    ck_assert_uint_eq(ct_json_u64("blocks"), 3);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "tiers", "--bogus",
                                   NULL),
                     2);

    memset(&dd, 0, sizeof(dd));
    snprintf(opt, sizeof(opt), "disk.path=%s/disk.kvc", ct_d.dir);
    const char *const args[] = {"-o", "host.size=16m", "-o", "host.page_size=64k", "-o", opt,
                                "-o", "disk.capacity=8m", "-o", "disk.page=1m", NULL};
    ck_assert_int_eq(daemon_start(&dd, args), 0);
    ck_assert_int_eq(daemon_kvcctl(&dd, ct_out, CT_OUT, ct_err, CT_OUT, "tiers", "--interval",
                                   "0.1", NULL),
                     0);
    ck_assert_msg(strstr(ct_out, "\ndisk ") && strstr(ct_out, "8.0 MiB") &&
                      !strstr(ct_out, "disk  disabled"),
                  "%s", ct_out);
    ck_assert_int_eq(daemon_kvcctl(&dd, ct_out, CT_OUT, ct_err, CT_OUT, "tiers", "--json", NULL),
                     0);
    ck_assert_msg(daemon_json_valid(ct_out), "not JSON: %s", ct_out);
    const char *drow = strstr(ct_out, "\"tier\": \"disk\"");
    ck_assert_msg(drow && strstr(drow, "\"capacity\": 8388608") &&
                      strstr(drow, "\"pages\": 8") && strstr(drow, "\"checksum_failures\": 0") &&
                      strstr(drow, "\"write_bytes_per_s\": "),
                  "%s", ct_out);
    ck_assert_int_eq(daemon_stop(&dd), 0);
    daemon_cleanup(&dd);
}
END_TEST

START_TEST(test_kvcctl_exit_codes)
{
    struct daemon none = {0};
    static const char *const cmds[] = {"status", "stats", "ns", "ls"};
    ck_assert_int_eq(daemon_dir_init(&none), 0); /* an empty directory: nobody listens */
    for (size_t i = 0; i < 4; i++) {
        ck_assert_int_eq(daemon_kvcctl(&none, ct_out, CT_OUT, ct_err, CT_OUT, cmds[i], NULL), 1);
        ck_assert_msg(strstr(ct_err, "cannot reach kvcd"), "%s: %s", cmds[i], ct_err);
        ck_assert_int_eq(
            daemon_kvcctl(&none, ct_out, CT_OUT, ct_err, CT_OUT, "--json", cmds[i], NULL), 1);
    }
    daemon_cleanup(&none);
    /* Usage errors, with the daemon there. */
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, NULL), 2);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "frobnicate", NULL), 2);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "--bogus", "stats",
                                   NULL),
                     2);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ls", "--limit", "x",
                                   NULL),
                     2);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ls", "--ns", "0",
                                   NULL),
                     2);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "help", NULL), 0);
    ck_assert_ptr_nonnull(strstr(ct_out, "usage: kvcctl"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_kvcctl");
    TCase *tc = tcase_create("kvcctl");
    SRunner *sr;
    int failed;
    tcase_set_timeout(tc, daemon_slow() * 60);
    tcase_add_checked_fixture(tc, ct_setup, ct_teardown);
    tcase_add_test(tc, test_kvcctl_json_validator);
    tcase_add_test(tc, test_kvcctl_status);
    tcase_add_test(tc, test_kvcctl_tiers);
    tcase_add_test(tc, test_kvcctl_stats);
    tcase_add_test(tc, test_kvcctl_ns);
    tcase_add_test(tc, test_kvcctl_ls);
    tcase_add_test(tc, test_kvcctl_exit_codes);
    tcase_add_test(tc, test_load_vs_recompute_counters);
    suite_add_tcase(s, tc);
    if (daemon_suite_init("e2e-kvcctl"))
        return 1;
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    daemon_suite_fini();
    return failed ? 1 : 0;
}
