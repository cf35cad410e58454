/*
 * check_bench.c — the benchmarks' row table (tests/lib/bench.c) refuses what cannot be a
 * measurement, and a refused row or a reported error makes the run's exit status 1.
 * Each case runs in its own process (Check's fork mode): the failure state is global.
 */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/lib/bench.h"
#include "tests/lib/daemon.h"

static char path[64];

static void setup(void)
{
    snprintf(path, sizeof(path), "/tmp/kvcd-check-bench-%d.json", (int)getpid());
}

static void teardown(void)
{
    unlink(path);
}

START_TEST(test_good_rows)
{
    struct bench_row rows[4];
    size_t n = 0;
    char buf[1024] = "";
    ck_assert_ptr_nonnull(bench_row_add(rows, 4, &n, "a", 2.0, "GB/s", "memcpy", 4.0));
    ck_assert_ptr_nonnull(bench_row_add(rows, 4, &n, "b", 0.0, "abs", NULL, 0));
    ck_assert(!bench_failed());
    ck_assert_int_eq(bench_finish(path, rows, n), 0);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_gt(fread(buf, 1, sizeof(buf) - 1, f), 0);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(buf, "\"ratio\": 0.5}"));
    ck_assert_ptr_nonnull(strstr(buf, "\"baseline\": null"));
}
END_TEST

/* The file is JSON whatever a case is named (a name with a quote and a backslash was written
 * as it was, and no JSON reader took the file), each row's numbers numbers and its missing
 * baseline nulls. */
START_TEST(test_rows_are_json)
{
    struct bench_row rows[2];
    size_t n = 0;
    json_error_t err;
    ck_assert_ptr_nonnull(
        bench_row_add(rows, 2, &n, "get \"16 MiB\" \\ x2", 3.0, "GB/s", "memcpy", 4.0));
    ck_assert_ptr_nonnull(bench_row_add(rows, 2, &n, "plain", 1e-3, "us", NULL, 0));
    ck_assert_int_eq(bench_finish(path, rows, n), 0);
    json_t *doc = json_load_file(path, 0, &err);
    ck_assert_msg(doc != NULL, "%s: %s", path, err.text);
    ck_assert_uint_eq(json_array_size(doc), 2);
    json_t *a = json_array_get(doc, 0), *b = json_array_get(doc, 1);
    ck_assert_str_eq(json_string_value(json_object_get(a, "case")), "get \"16 MiB\" \\ x2");
    ck_assert_double_eq(json_number_value(json_object_get(a, "ratio")), 0.75);
    ck_assert_double_eq(json_number_value(json_object_get(a, "baseline_value")), 4.0);
    ck_assert_double_eq_tol(json_number_value(json_object_get(b, "value")), 1e-3, 1e-12);
    ck_assert(json_is_null(json_object_get(b, "ratio")));
    json_decref(doc);
}
END_TEST

/* _i: a zero baseline, a negative one, a NaN baseline, a NaN value, an infinite value, a
 * negative value, a full table. */
START_TEST(test_refused_rows)
{
    struct bench_row rows[2];
    size_t n = 0;
    static const double base[] = {0.0, -1.0, NAN, 1.0, 1.0, 1.0, 1.0};
    static const double val[] = {1.0, 1.0, 1.0, NAN, INFINITY, -3.0, 1.0};
    if (_i == 6) {
        ck_assert_ptr_nonnull(bench_row_add(rows, 1, &n, "first", 1.0, "x", "y", 1.0));
        ck_assert_ptr_null(bench_row_add(rows, 1, &n, "second", 1.0, "x", "y", 1.0));
    } else {
        ck_assert_ptr_null(bench_row_add(rows, 2, &n, "bad", val[_i], "x", "peer", base[_i]));
        ck_assert_uint_eq(n, 0);
    }
    ck_assert(bench_failed());
    ck_assert_int_eq(bench_finish(path, rows, n), 1);
}
END_TEST

START_TEST(test_fail_fails_the_run)
{
    struct bench_row rows[2];
    size_t n = 0;
    ck_assert_ptr_nonnull(bench_row_add(rows, 2, &n, "a", 1.0, "x", "y", 1.0));
    bench_fail("case %d: request failed", 3);
    ck_assert_int_eq(bench_finish(path, rows, n), 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bench");
    TCase *tc = tcase_create("rows");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_good_rows);
    tcase_add_test(tc, test_rows_are_json);
    tcase_add_loop_test(tc, test_refused_rows, 0, 7);
    tcase_add_test(tc, test_fail_fails_the_run);
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
