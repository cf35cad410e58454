/*
 * bench.c — see bench.h.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/bench.h"

static bool bench_bad;

void bench_fail(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "bench: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    bench_bad = true;
}

bool bench_failed(void)
{
    return bench_bad;
}

bool bench_smoke(void)
{
    const char *e = getenv("KVC_BENCH_SMOKE");
    return e && strcmp(e, "1") == 0;
}

struct bench_row *bench_row_add(struct bench_row *rows, size_t cap, size_t *n, const char *name,
                                double value, const char *unit, const char *baseline, double base)
{
    struct bench_row *r;
    if (*n >= cap) {
        bench_fail("%s: refused: the table holds %zu rows", name, cap);
        return NULL;
    }
    if (!isfinite(value) || value < 0) {
        bench_fail("%s: refused: value %g %s is not a measurement", name, value, unit);
        return NULL;
    }
    if (baseline && !(isfinite(base) && base > 0)) {
        bench_fail("%s: refused: baseline \"%s\" is %g (failed or missing)", name, baseline, base);
        return NULL;
    }
    r = &rows[(*n)++];
    snprintf(r->name, sizeof(r->name), "%s", name);
    r->value = value;
    r->unit = unit;
    r->baseline = baseline;
    r->base = baseline ? base : 0;
    return r;
}

/* A row as an object: value and ratio with the 6 significant digits the file has always had
 * (JSON_REAL_PRECISION(6) in bench_finish), a row without a baseline with nulls. */
static json_t *bench_row_json(const struct bench_row *r)
{
    if (!r->baseline)
        return json_pack("{s:s, s:f, s:s, s:n, s:n, s:n}", "case", r->name, "value", r->value,
                         "unit", r->unit, "baseline", "baseline_value", "ratio");
    return json_pack("{s:s, s:f, s:s, s:s, s:f, s:f}", "case", r->name, "value", r->value, "unit",
                     r->unit, "baseline", r->baseline, "baseline_value", r->base, "ratio",
                     r->value / r->base);
}

int bench_finish(const char *path, const struct bench_row *rows, size_t n)
{
    FILE *f = fopen(path, "we");
    if (!f) {
        bench_fail("%s: %s", path, strerror(errno));
        return 1;
    }
    /* A list with one row a line, each row written by jansson. */
    fprintf(f, "[\n");
    for (size_t i = 0; i < n; i++) {
        json_t *row = bench_row_json(&rows[i]);
        char *text = row ? json_dumps(row, JSON_REAL_PRECISION(6)) : NULL;
        if (!text)
            bench_fail("%s: row %s: cannot write it (out of memory)", path, rows[i].name);
        else
            fprintf(f, "  %s%s\n", text, i + 1 < n ? "," : "");
        free(text);
        json_decref(row);
    }
    fprintf(f, "]\n");
    if (fclose(f) != 0)
        bench_fail("%s: %s", path, strerror(errno));
    if (bench_bad)
        fprintf(stderr, "bench: %s: the run failed (errors above); its rows are not a result\n",
                path);
    return bench_bad ? 1 : 0;
}
