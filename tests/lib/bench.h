/*
 * bench.h — the result rows every benchmark writes to build/bench/NAME.json: a list of
 * {"case", "value", "unit", "baseline", "baseline_value", "ratio"}, the baseline being the
 * limit or peer measured in the same run.
 */
#ifndef KVC_TESTS_BENCH_H
#define KVC_TESTS_BENCH_H

#include <stddef.h>

struct bench_row {
    char name[96];
    double value;
    const char *unit;
    const char *baseline; /* NULL: none (baseline, baseline_value and ratio are null) */
    double base;          /* the baseline's value; ratio is null unless it is > 0 */
};

/* Appends a row to rows[0..cap) holding *n; a full table drops it. The row, or NULL. */
struct bench_row *bench_row_add(struct bench_row *rows, size_t cap, size_t *n, const char *name,
                                double value, const char *unit, const char *baseline,
                                double base);

/* Writes the rows as a JSON list to path. 0, or -1 (reported on stderr). */
int bench_json_write(const char *path, const struct bench_row *rows, size_t n);

#endif
