/*
 * check_e2e_demo — `make demo`'s script (tests/demo/demo.sh) run whole against this build's
 * kvcd, kvc-demo and kvcctl, its output parsed: a line per engine run with its bytes exact,
 * then exactly three summary lines (tokens loaded vs computed; load GB/s beside memcpy of
 * the same bytes; time saved), whose figures agree with each other and with the prompts the
 * demo runs (4 runs of 4608 tokens: 0, 4096, 4096 and 4608 of them loaded). Without
 * --stats nothing of `kvcctl stats` appears; with it, `kvcctl status` estimates the
 * recompute time the summary does (the daemon is given engine A's measured rate).
 * The speeds themselves are not asserted (make bench-host measures them).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/daemon.h"

#define DEMO_OUT (256 << 10)

static char demo_out[DEMO_OUT], demo_err[64 << 10];

/* Runs demo.sh [--stats] on this build (KVC_BUILD_BIN's parent); its exit status. */
static int demo_run(bool stats)
{
    char build[512];
    snprintf(build, sizeof(build), "%s", KVC_BUILD_BIN);
    char *slash = strrchr(build, '/');
    ck_assert_ptr_nonnull(slash);
    *slash = 0;
    const char *argv[] = {"/bin/sh", KVC_SRC_DIR "/tests/demo/demo.sh", stats ? "--stats" : build,
                          stats ? build : NULL, NULL};
    return daemon_run(argv, demo_out, sizeof(demo_out), demo_err, sizeof(demo_err),
                      daemon_ms(240000));
}

/* The line of out that starts with prefix, or NULL; *count: how many do. */
static const char *demo_line(const char *out, const char *prefix, int *count)
{
    const char *found = NULL;
    *count = 0;
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, prefix, strlen(prefix)) == 0) {
            found = found ? found : p;
            (*count)++;
        }
    return found;
}

struct demo_summary {
    long loaded, computed, runs, prompt;
    double mib, load_ms, gbps, memcpy_gbps, ratio;
    double saved_ms, tokens, rate, recompute_ms, load2_ms;
};

/* Parses the three summary lines; checks the figures agree with each other. */
static void demo_summary_check(const char *out, struct demo_summary *s)
{
    int n;
    const char *t = demo_line(out, "tokens: ", &n);
    ck_assert_msg(t && n == 1, "one tokens: line:\n%s", out);
    ck_assert_int_eq(sscanf(t,
                            "tokens: %ld loaded from kvcd, %ld computed (%ld engine runs, %ld "
                            "prompt tokens)",
                            &s->loaded, &s->computed, &s->runs, &s->prompt),
                     4);
    const char *l = demo_line(out, "load:   ", &n);
    ck_assert_msg(l && n == 1, "one load: line:\n%s", out);
    ck_assert_int_eq(sscanf(l,
                            "load:   %lf MiB in %lf ms through kvc_get_prefix, %lf GB/s; "
                            "memcpy of the same bytes into the same buffers: %lf GB/s (%lfx)",
                            &s->mib, &s->load_ms, &s->gbps, &s->memcpy_gbps, &s->ratio),
                     5);
    const char *v = demo_line(out, "saved:  ", &n);
    ck_assert_msg(v && n == 1, "one saved: line:\n%s", out);
    ck_assert_int_eq(sscanf(v,
                            "saved:  %lf ms: recomputing the %lf loaded tokens at engine A's "
                            "%lf tokens/s would take %lf ms, loading them took %lf ms",
                            &s->saved_ms, &s->tokens, &s->rate, &s->recompute_ms, &s->load2_ms),
                     5);
    /* the three lines follow each other, last of the demo's figures */
    ck_assert_ptr_eq(strchr(t, '\n') + 1, l);
    ck_assert_ptr_eq(strchr(l, '\n') + 1, v);
    /* what the demo's prompts make: A computes 4608 tokens, B and C load the 4096 shared and
     * compute their own 512, A2 loads all 4608 */
    ck_assert_int_eq(s->runs, 4);
    ck_assert_int_eq(s->loaded, 4096 + 4096 + 4608);
    ck_assert_int_eq(s->computed, 4608 + 512 + 512);
    ck_assert_int_eq(s->prompt, s->loaded + s->computed);
    /* 256 KiB per 16 tokens */
    ck_assert(s->mib > s->loaded / 16 * 0.25 - 0.05 && s->mib < s->loaded / 16 * 0.25 + 0.05);
    ck_assert(s->load_ms > 0 && s->gbps > 0 && s->memcpy_gbps > 0 && s->ratio > 0);
    /* consistent within the rounding of the printed figures (2 decimals) */
    double gbps = s->mib * 1048576 / (s->load_ms * 1e6);
    ck_assert_msg(s->gbps > gbps * 0.99 - 0.006 && s->gbps < gbps * 1.01 + 0.006,
                  "GB/s %.2f is not %.1f MiB in %.1f ms", s->gbps, s->mib, s->load_ms);
    double lo = (s->gbps - 0.006) / (s->memcpy_gbps + 0.006),
           hi = (s->gbps + 0.006) / (s->memcpy_gbps - 0.006);
    ck_assert_msg(s->ratio > lo - 0.006 && (s->memcpy_gbps <= 0.006 || s->ratio < hi + 0.006),
                  "ratio %.2f is not %.2f / %.2f", s->ratio, s->gbps, s->memcpy_gbps);
    /* the estimate is the demo's own: loaded tokens at the measured rate, minus the load */
    ck_assert_int_eq((long)s->tokens, s->loaded);
    ck_assert(s->rate > 0);
    ck_assert(s->recompute_ms > s->tokens / s->rate * 1e3 - 1 &&
              s->recompute_ms < s->tokens / s->rate * 1e3 + 1);
    ck_assert(s->load2_ms > s->load_ms - 0.1 && s->load2_ms < s->load_ms + 0.1);
    ck_assert(s->saved_ms > s->recompute_ms - s->load_ms - 1 &&
              s->saved_ms < s->recompute_ms - s->load_ms + 1);
}

/* Every engine run's line says its loaded bytes were exact. */
static void demo_runs_check(const char *out)
{
    static const char *const names[] = {"A   prompt", "B   prompt", "C   prompt", "A2  prompt"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        int n;
        const char *p = demo_line(out, names[i], &n);
        ck_assert_msg(p && n == 1, "no line for %s:\n%s", names[i], out);
        const char *e = strchr(p, '\n');
        ck_assert_ptr_nonnull(e);
        ck_assert_msg(memmem(p, (size_t)(e - p), "loaded bytes exact: yes", 23), "%.*s",
                      (int)(e - p), p);
    }
}

START_TEST(test_demo_summary_three_lines)
{
    struct demo_summary s;
    int rc = demo_run(false);
    ck_assert_msg(rc == 0, "demo.sh exit %d:\n%s\n%s", rc, demo_out, demo_err);
    demo_runs_check(demo_out);
    demo_summary_check(demo_out, &s);
    /* the summary closes the output; the daemon's counters stay behind --stats */
    const char *v = strstr(demo_out, "saved:  ");
    ck_assert_str_eq(strchr(v, '\n'), "\n");
    ck_assert_ptr_null(strstr(demo_out, "kvcctl stats"));
    ck_assert_ptr_null(strstr(demo_out, "lookup_tokens"));
}
END_TEST

START_TEST(test_demo_stats_agree)
{
    struct demo_summary s;
    int rc = demo_run(true), n;
    ck_assert_msg(rc == 0, "demo.sh --stats exit %d:\n%s\n%s", rc, demo_out, demo_err);
    demo_summary_check(demo_out, &s);
    ck_assert_ptr_nonnull(strstr(demo_out, "== kvcctl stats"));
    /* kvcctl status: "hits loaded in X ms (as clients report) vs ~Y ms to recompute them" */
    const char *h = demo_line(demo_out, "hits loaded in ", &n);
    ck_assert_msg(h && n == 1, "%s", demo_out);
    double x, y;
    ck_assert_int_eq(sscanf(h, "hits loaded in %lf ms (as clients report) vs ~%lf ms", &x, &y), 2);
    ck_assert_msg(y > s.recompute_ms * 0.99 - 1 && y < s.recompute_ms * 1.01 + 1,
                  "kvcctl status estimates %.1f ms, the summary %.1f ms", y, s.recompute_ms);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_demo");
    TCase *tc = tcase_create("demo");
    if (daemon_suite_init("e2e_demo") < 0)
        return 1;
    tcase_set_timeout(tc, daemon_slow() * 300);
    tcase_add_test(tc, test_demo_summary_three_lines);
    tcase_add_test(tc, test_demo_stats_agree);
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
