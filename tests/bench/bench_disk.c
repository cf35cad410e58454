/*
 * bench_disk.c — disk-tier write and read throughput (whole records: header, data, XXH3,
 * verification on read) for 256 KiB and 2 MiB blocks at queue depth 1, 8 and 32, beside fio
 * (ioengine=io_uring, direct=1, same file system, block size and depth) run here, as a ratio;
 * then the latency of reading one block back into the arena (what a promoting lookup waits
 * for), p50 and p99. Usage: bench_disk OUT.json [DIR] (DIR defaults to $KVC_BENCH_DIR or
 * /var/tmp; it must take O_DIRECT).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tiers/disk.h"

#define MiB (1024ull * 1024)
#define ARENA (128 * MiB)
#define PER_CASE (512 * MiB)

struct result {
    char name[64];
    double value, base;
    const char *unit, *baseline;
};

static struct result res[64];
static int nres;
static uint8_t *arena;
static uint64_t inflight;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void done_cb(void *arg, int status)
{
    (void)arg;
    if (status)
        fprintf(stderr, "bench_disk: request failed (%s)\n", strerror(-status));
    inflight--;
}

/* fio's bandwidth in bytes/s for one job, or 0. */
static double fio_bw(const char *file, const char *rw, uint64_t bs, int qd, uint64_t size)
{
    char cmd[1024];
    FILE *p;
    double bw = 0;
    char line[512];
    snprintf(cmd, sizeof(cmd),
             "fio --name=kvcd --filename=%s --ioengine=io_uring --direct=1 --rw=%s --bs=%llu "
             "--iodepth=%d --size=%llu --output-format=json 2>/dev/null",
             file, rw, (unsigned long long)bs, qd, (unsigned long long)size);
    p = popen(cmd, "r");
    if (!p)
        return 0;
    /* The first "bw_bytes" of the direction asked for. */
    const char *dir = strcmp(rw, "read") == 0 ? "\"read\"" : "\"write\"";
    int in_dir = 0;
    while (fgets(line, sizeof(line), p)) {
        if (strstr(line, dir))
            in_dir = 1;
        char *at = strstr(line, "\"bw_bytes\"");
        if (in_dir && at && bw == 0)
            bw = strtod(strchr(at, ':') + 1, NULL);
    }
    pclose(p);
    return bw;
}

static void add(const char *name, double v, const char *unit, const char *baseline, double base)
{
    struct result *r = &res[nres++];
    snprintf(r->name, sizeof(r->name), "%s", name);
    r->value = v;
    r->unit = unit;
    r->baseline = baseline;
    r->base = base;
    printf("%-34s %10.1f %-6s  %-22s %10.1f  ratio %.3f\n", name, v, unit, baseline, base,
           base > 0 ? v / base : 0);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 2 ? argv[2] : getenv("KVC_BENCH_DIR") ? getenv("KVC_BENCH_DIR")
                                                                     : "/var/tmp";
    const uint64_t sizes[2] = {256 * 1024, 2 * MiB};
    const int qds[3] = {1, 8, 32};
    char path[512], fpath[512];
    FILE *out;
    int err;
    if (argc < 2) {
        fprintf(stderr, "usage: bench_disk OUT.json [DIR]\n");
        return 2;
    }
    snprintf(path, sizeof(path), "%s/kvcd-bench-disk.kvc", dir);
    snprintf(fpath, sizeof(fpath), "%s/kvcd-bench-fio.dat", dir);
    arena = aligned_alloc(4096, ARENA);
    for (uint64_t i = 0; i < ARENA; i += 8)
        *(uint64_t *)(arena + i) = i * 0x9e3779b97f4a7c15ull;
    printf("%-34s %10s %-6s  %-22s %10s\n", "case", "value", "unit", "baseline", "value");
    for (int si = 0; si < 2; si++) {
        for (int qi = 0; qi < 3; qi++) {
            uint64_t bs = sizes[si];
            int qd = qds[qi];
            struct tier_disk_config cfg = {.paths = {path},
                                           .npaths = 1,
                                           .size = PER_CASE + 64 * MiB,
                                           .page_size = 64 * MiB,
                                           .queue_depth = (uint32_t)qd};
            struct tier *t;
            uint64_t n = PER_CASE / bs, slots = ARENA / bs;
            struct tier_loc *locs = calloc(n, sizeof(*locs));
            struct tier_disk_meta m = {.len = bs};
            double t0, wbw, rbw;
            char name[64];
            unlink(path);
            t = tier_disk_new(&cfg, &err);
            if (!t) {
                fprintf(stderr, "bench_disk: %s: %s\n", path, strerror(-err));
                return 1;
            }
            tier_disk_buffers_register(t, arena, ARENA);
            t0 = now_s();
            for (uint64_t i = 0; i < n; i++) {
                m.key[0] = i + 1;
                t->ops->alloc(t, bs, &locs[i]);
                while (tier_disk_put(t, &locs[i], &m, arena + (i % slots) * bs, done_cb, NULL) ==
                       -EAGAIN)
                    tier_disk_poll(t);
                inflight++;
                while (inflight >= (uint64_t)qd)
                    tier_disk_poll(t);
            }
            tier_disk_drain(t);
            wbw = (double)(n * bs) / (now_s() - t0);
            t0 = now_s();
            for (uint64_t i = 0; i < n; i++) {
                m.key[0] = i + 1;
                while (tier_disk_get(t, &locs[i], &m, arena + (i % slots) * bs, bs, done_cb,
                                     NULL) == -EAGAIN)
                    tier_disk_poll(t);
                inflight++;
                while (inflight >= (uint64_t)qd)
                    tier_disk_poll(t);
            }
            tier_disk_drain(t);
            rbw = (double)(n * bs) / (now_s() - t0);
            double fw = fio_bw(fpath, "write", bs, qd, PER_CASE);
            double fr = fio_bw(fpath, "read", bs, qd, PER_CASE);
            snprintf(name, sizeof(name), "write %lluk qd%d", (unsigned long long)(bs >> 10), qd);
            add(name, wbw / MiB, "MiB/s", "fio write", fw / MiB);
            snprintf(name, sizeof(name), "read %lluk qd%d", (unsigned long long)(bs >> 10), qd);
            add(name, rbw / MiB, "MiB/s", "fio read", fr / MiB);
            tier_destroy(t);
            free(locs);
        }
    }
    /* One block read back at a time: the disk part of a promoting lookup. */
    for (int si = 0; si < 2; si++) {
        uint64_t bs = sizes[si];
        struct tier_disk_config cfg = {.paths = {path},
                                       .npaths = 1,
                                       .size = 256 * MiB,
                                       .page_size = 64 * MiB,
                                       .queue_depth = 8};
        struct tier *t;
        enum { N = 200 };
        struct tier_loc locs[N];
        double lat[N];
        struct tier_disk_meta m = {.len = bs};
        char name[64];
        unlink(path);
        t = tier_disk_new(&cfg, &err);
        tier_disk_buffers_register(t, arena, ARENA);
        for (int i = 0; i < N; i++) {
            m.key[0] = (uint64_t)i + 1;
            t->ops->alloc(t, bs, &locs[i]);
            while (tier_disk_put(t, &locs[i], &m, arena, done_cb, NULL) == -EAGAIN)
                tier_disk_poll(t);
            inflight++;
            tier_disk_drain(t);
        }
        /* Random order, so the drive's read-ahead does not help. */
        for (int i = 0; i < N; i++) {
            int j = (int)((unsigned)(i * 7919) % N);
            double t0 = now_s();
            m.key[0] = (uint64_t)j + 1;
            tier_disk_get(t, &locs[j], &m, arena + 64 * MiB, bs, done_cb, NULL);
            inflight++;
            tier_disk_drain(t);
            lat[i] = (now_s() - t0) * 1e6;
        }
        qsort(lat, N, sizeof(lat[0]), cmp_d);
        snprintf(name, sizeof(name), "promote read %lluk p50", (unsigned long long)(bs >> 10));
        add(name, lat[N / 2], "us", "none", 0);
        snprintf(name, sizeof(name), "promote read %lluk p99", (unsigned long long)(bs >> 10));
        add(name, lat[N * 99 / 100], "us", "none", 0);
        tier_destroy(t);
    }
    unlink(path);
    unlink(fpath);
    out = fopen(argv[1], "w");
    if (!out)
        return 1;
    fprintf(out, "[\n");
    for (int i = 0; i < nres; i++)
        fprintf(out,
                "  {\"case\": \"%s\", \"value\": %.1f, \"unit\": \"%s\", \"baseline\": \"%s\", "
                "\"baseline_value\": %.1f, \"ratio\": %.3f}%s\n",
                res[i].name, res[i].value, res[i].unit, res[i].baseline, res[i].base,
                res[i].base > 0 ? res[i].value / res[i].base : 0, i + 1 < nres ? "," : "");
    fprintf(out, "]\n");
    fclose(out);
    free(arena);
    return 0;
}
