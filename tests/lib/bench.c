/*
 * bench.c — see bench.h.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "tests/lib/bench.h"

struct bench_row *bench_row_add(struct bench_row *rows, size_t cap, size_t *n, const char *name,
                                double value, const char *unit, const char *baseline,
                                double base)
{
    struct bench_row *r;
    if (*n >= cap)
        return NULL;
    r = &rows[(*n)++];
    snprintf(r->name, sizeof(r->name), "%s", name);
    r->value = value;
    r->unit = unit;
    r->baseline = baseline;
    r->base = base;
    return r;
}

int bench_json_write(const char *path, const struct bench_row *rows, size_t n)
{
    FILE *f = fopen(path, "we");
    if (!f) {
        fprintf(stderr, "bench: %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "[\n");
    for (size_t i = 0; i < n; i++) {
        const struct bench_row *r = &rows[i];
        fprintf(f, "  {\"case\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", ", r->name, r->value,
                r->unit);
        if (!r->baseline)
            fprintf(f, "\"baseline\": null, \"baseline_value\": null, \"ratio\": null}");
        else if (r->base > 0)
            fprintf(f, "\"baseline\": \"%s\", \"baseline_value\": %.6g, \"ratio\": %.6g}",
                    r->baseline, r->base, r->value / r->base);
        else
            fprintf(f, "\"baseline\": \"%s\", \"baseline_value\": %.6g, \"ratio\": null}",
                    r->baseline, r->base);
        fprintf(f, "%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "]\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "bench: %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}
