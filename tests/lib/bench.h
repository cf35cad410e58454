/*
 * bench.h — the result rows every benchmark writes to build/bench/NAME.json: a list of
 * {"case", "value", "unit", "baseline", "baseline_value", "ratio"}, the baseline being the
 * limit or peer measured in the same run.
 *
 * DESIGN
 * A benchmark's number is only worth printing if everything behind it worked, so the table
 * refuses what cannot be a measurement: a row whose baseline is named but is not a positive
 * finite number (a failed or missing peer, fio not installed, a copy timed at zero), a value
 * that is negative or not finite, a row past the table's end. Errors inside a timed case
 * (a request that failed, a short hit, wrong bytes) are reported with bench_fail(). Either
 * makes bench_finish() return 1, so the benchmark's exit status says the run is not a
 * result, whatever rows it printed before. One benchmark per process: the failure state is
 * global.
 */
#ifndef KVC_TESTS_BENCH_H
#define KVC_TESTS_BENCH_H

#include <stdbool.h>
#include <stddef.h>

struct bench_row {
    char name[96];
    double value;
    const char *unit;
    const char *baseline; /* NULL: none (baseline, baseline_value and ratio are null) */
    double base;          /* the baseline's value, > 0 whenever baseline is named */
};

/* Appends a row to rows[0..cap) holding *n. Returns the row, or NULL when it is refused
 * (see DESIGN; the reason goes to stderr and the run is marked failed). */
struct bench_row *bench_row_add(struct bench_row *rows, size_t cap, size_t *n, const char *name,
                                double value, const char *unit, const char *baseline,
                                double base);

/* Reports an error of a timed case (one line on stderr, "bench: " + the message) and marks
 * the run failed. */
void bench_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Whether anything was refused or reported failed so far. */
bool bench_failed(void);

/* Writes the rows as a JSON list to path and returns the benchmark's exit status: 0, or 1
 * when the file could not be written or the run failed (bench_failed()). */
int bench_finish(const char *path, const struct bench_row *rows, size_t n);

/* KVC_BENCH_SMOKE=1: make check runs every benchmark once in a tiny configuration (so they
 * cannot rot); the numbers of such a run mean nothing, the exit status does. */
bool bench_smoke(void);

#endif
