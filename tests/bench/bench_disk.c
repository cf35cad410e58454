/*
 * bench_disk.c — disk-tier write and read throughput (whole records: header, data, XXH3,
 * verification on read) for 256 KiB and 2 MiB blocks at queue depth 1, 8 and 32, beside fio
 * (ioengine=io_uring, direct=1, same file system, block size and depth) run here, as a ratio;
 * then the latency of reading one block back into the arena (what a promoting lookup waits
 * for), p50 and p99; then a whole lookup that promotes one block from disk through a real
 * kvcd over its socket (kvc_lookup waiting for the read), p50 and p99, beside a lookup of a
 * block in memory, raw and with disk.compress=1 on fp16-like data. Usage: bench_disk OUT.json
 * [DIR] (DIR defaults to $KVC_BENCH_DIR or /var/tmp; it must take O_DIRECT). The benchmark
 * sleeps on the tier's eventfd between completions, as the daemon's loop does (the tier's
 * worker threads need the CPU a spinning loop would take). Records are written as the
 * daemon's demotions write them (encode on a worker, then place and write) from, and read
 * into, every slot of a 128 MiB arena in turn. Queue depth is the tier's queue_depth: the
 * records on the device at once, as fio's iodepth. kvcd and fio take turns on the same
 * file, KVC_BENCH_ROUNDS (5) times, and each side's best round counts;
 * KVC_BENCH_ONLY="256k qd8" runs that case alone.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/lib/bench.h"
#include "tests/lib/daemon.h"
#include "tiers/disk.h"

#define MiB (1024ull * 1024)
#define ARENA (128 * MiB)
#define PER_CASE (getenv("KVC_BENCH_QUICK") ? 64 * MiB : 512 * MiB)

static struct bench_row res[64];
static size_t nres;
static uint8_t *arena, *arena4k; /* 128 MiB each: on huge pages where the kernel gives them,
                                    and on 4 KiB pages */
static uint64_t inflight;
static char phase[64]; /* the case running, for error lines */

/* Runs completions, or sleeps until some may be ready. */
static void reap(struct tier *t)
{
    if (tier_disk_poll(t) == 0) {
        struct pollfd pfd = {.fd = tier_disk_fd(t), .events = POLLIN};
        poll(&pfd, 1, 10);
    }
}

/* AnonHugePages of this process, KiB. */
static uint64_t anon_huge_kib(void)
{
    char line[256];
    uint64_t kib = 0;
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "AnonHugePages: %llu", (unsigned long long *)&kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

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
        fprintf(stderr, "bench_disk: %s: request failed (%s)\n", phase, strerror(-status));
    inflight--;
}

/* One record of a write pass: encoded (hashed) on a worker, then placed and written, as the
 * daemon's demotions do. */
struct wrec {
    struct tier *t;
    struct tier_loc *loc;
};

static void encoded_cb(void *arg, struct tier_disk_rec *r, int status)
{
    struct wrec *w = arg;
    if (status == 0 && w->t->ops->alloc(w->t, tier_disk_rec_len(r), w->loc) != 0) {
        tier_disk_rec_free(w->t, r);
        status = -ENOSPC;
    }
    if (status) {
        fprintf(stderr, "bench_disk: %s: encode failed (%s)\n", phase, strerror(-status));
        inflight--;
        return;
    }
    if (tier_disk_rec_put(w->t, w->loc, r, done_cb, NULL))
        inflight--;
}

/* Writes n records of bs bytes into freshly allocated locations, as fast as the tier takes
 * them (its queue_depth bounds the requests on the device); returns the seconds it took. */
static double write_pass(struct tier *t, struct tier_loc *locs, uint64_t n, uint64_t bs,
                         const uint8_t *base)
{
    struct tier_disk_meta m = {.len = bs};
    struct wrec *w = calloc(n, sizeof(*w));
    double t0 = now_s(), dt;
    for (uint64_t i = 0; i < n; i++) {
        m.key[0] = i + 1;
        w[i] = (struct wrec){.t = t, .loc = &locs[i]};
        while (tier_disk_encode(t, &m, base + (i % (ARENA / bs)) * bs, 0, 0, encoded_cb, &w[i]) ==
               -EAGAIN)
            reap(t);
        inflight++;
    }
    tier_disk_drain(t);
    dt = now_s() - t0;
    free(w);
    return dt;
}

/* Reads the n records back in order, as fast as the tier takes them (each verified);
 * returns the seconds. */
static double read_pass(struct tier *t, const struct tier_loc *locs, uint64_t n, uint64_t bs,
                        uint8_t *base)
{
    struct tier_disk_meta m = {.len = bs};
    double t0 = now_s();
    for (uint64_t i = 0; i < n; i++) {
        m.key[0] = i + 1;
        while (tier_disk_get(t, &locs[i], &m, base + (i % (ARENA / bs)) * bs, bs, done_cb, NULL) ==
               -EAGAIN)
            reap(t);
        inflight++;
    }
    tier_disk_drain(t);
    return now_s() - t0;
}

/* fio's bandwidth in bytes/s for one job over size bytes of file from offset, or 0. */
static double fio_bw(const char *file, uint64_t offset, const char *rw, uint64_t bs, int qd,
                     uint64_t size)
{
    char cmd[1024];
    FILE *p;
    double bw = 0;
    char line[512];
    snprintf(cmd, sizeof(cmd),
             "fio --name=kvcd --filename=%s --ioengine=io_uring --direct=1 --rw=%s --bs=%llu "
             "--iodepth=%d --offset=%llu --size=%llu --output-format=json 2>/dev/null",
             file, rw, (unsigned long long)bs, qd, (unsigned long long)offset,
             (unsigned long long)size);
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
    bench_row_add(res, sizeof(res) / sizeof(res[0]), &nres, name, v, unit, baseline, base);
    printf("%-34s %10.1f %-6s  %-22s %10.1f  ratio %.3f\n", name, v, unit, baseline, base,
           base > 0 ? v / base : 0);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One lookup per block of a single-block prefix that is on disk now (kvc_lookup waits for
 * the read: socket round trip, LOOKUP, read and verify, WAIT), and of blocks in memory. */
static void lookup_bench(const char *dir, uint64_t bs, bool compress)
{
    struct daemon d = {0};
    char o_path[600], o_host[64], o_page[64];
    const char *args[] = {"-o", o_path, "-o", o_host, "-o", "host.page_size=256k", "-o",
                          "host.hugepages=off", "-o", "disk.capacity=1g", "-o", o_page, "-o",
                          "disk.write_rate=0", "-o", "host.high_watermark=0.6", "-o",
                          "host.low_watermark=0.4", "-o",
                          compress ? "disk.compress=1" : "disk.compress=0", NULL};
    uint32_t tokens = (uint32_t)(bs / (4 * 4 * 128 * 2 * 2));
    struct kvc_layout lay = {.model_id = "bench/disk", .layers = 4, .kv_heads = 4,
                             .head_dim = 128, .block_tokens = tokens,
                             .dtype = KVC_DTYPE_FP16, .kv_kind = KVC_KV_KIND_KV};
    enum { NB = 160 };
    static struct kvc_key keys[NB];
    double disk_lat[NB], mem_lat[NB];
    int nd = 0, nm = 0;
    kvc_client *c = NULL;
    kvc_ns *ns = NULL;
    char name[64];
    snprintf(o_path, sizeof(o_path), "disk.path=%s/kvcd-bench-lookup.kvc", dir);
    snprintf(o_host, sizeof(o_host), "host.size=%llum", (unsigned long long)(bs * 64 / MiB));
    snprintf(o_page, sizeof(o_page), "disk.page=%llum", (unsigned long long)(bs * 8 / MiB));
    if (daemon_start(&d, args) || kvc_connect(d.sock, &c) || kvc_ns_open(c, &lay, &ns)) {
        fprintf(stderr, "bench_disk: cannot start kvcd for the lookup case\n");
        goto out;
    }
    uint8_t *buf = malloc(bs);
    for (int i = 0; i < NB; i++) {
        const void *p = buf;
        uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull + 1;
        daemon_chain_keys(ns, (uint32_t)i, 0, 0, 1, &keys[i]);
        for (uint64_t j = 0; j < bs; j += 2) { /* fp16 values in [1, 2): zstd-1 gets ~1.3x */
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[j] = (uint8_t)x;
            buf[j + 1] = (uint8_t)(0x3c | ((x >> 8) & 3));
        }
        kvc_put_prefix(ns, NULL, &keys[i], 1, &p);
        usleep(2000); /* an engine's prefill is slower than the disk */
    }
    free(buf);
    usleep(500000); /* demotions finish */
    for (int r = 0; r < NB; r++) {
        int i = (int)((unsigned)(r * 7919) % NB);
        struct kvc_block_info *bi = NULL;
        size_t nbi = 0;
        uint64_t cursor = 0;
        int tier = -1;
        do {
            if (kvc_block_list(c, kvc_ns_id(ns), &cursor, 256, &bi, &nbi))
                break;
            for (size_t j = 0; j < nbi; j++)
                if (bi[j].key.lo == keys[i].lo && bi[j].key.hi == keys[i].hi)
                    tier = bi[j].tier;
            free(bi);
        } while (cursor);
        kvc_lease *l = NULL;
        double t0 = now_s();
        int h = kvc_lookup(ns, &keys[i], 1, 0, &l);
        double us = (now_s() - t0) * 1e6;
        if (h == 1 && tier == 2)
            disk_lat[nd++] = us;
        kvc_release(l);
        if (h == 1) { /* the same block again: in memory now */
            t0 = now_s();
            h = kvc_lookup(ns, &keys[i], 1, 0, &l);
            us = (now_s() - t0) * 1e6;
            if (h == 1)
                mem_lat[nm++] = us;
            kvc_release(l);
        }
        usleep(5000); /* room is made again (demotion) between lookups */
    }
    if (nd >= 10 && nm >= 10) {
        qsort(disk_lat, (size_t)nd, sizeof(double), cmp_d);
        qsort(mem_lat, (size_t)nm, sizeof(double), cmp_d);
        const char *z = compress ? " zstd-1" : "";
        snprintf(name, sizeof(name), "lookup promote %lluk%s p50", (unsigned long long)(bs >> 10), z);
        add(name, disk_lat[nd / 2], "us", "lookup in memory p50", mem_lat[nm / 2]);
        snprintf(name, sizeof(name), "lookup promote %lluk%s p99", (unsigned long long)(bs >> 10), z);
        add(name, disk_lat[nd * 99 / 100], "us", "lookup in memory p99", mem_lat[nm * 99 / 100]);
        printf("  (%d promoting lookups, %d in memory)\n", nd, nm);
    } else {
        fprintf(stderr, "bench_disk: lookup %lluk: %d on disk, %d in memory: too few\n",
                (unsigned long long)(bs >> 10), nd, nm);
    }
out:
    if (c)
        kvc_disconnect(c);
    daemon_stop(&d);
    daemon_cleanup(&d);
    snprintf(o_path, sizeof(o_path), "%s/kvcd-bench-lookup.kvc", dir);
    unlink(o_path);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 2 ? argv[2] : getenv("KVC_BENCH_DIR") ? getenv("KVC_BENCH_DIR")
                                                                     : "/var/tmp";
    const uint64_t sizes[2] = {256 * 1024, 2 * MiB};
    const int qds[3] = {1, 8, 32};
    const int rounds = getenv("KVC_BENCH_ROUNDS") ? atoi(getenv("KVC_BENCH_ROUNDS")) : 5;
    char path[512];
    int err;
    if (argc < 2) {
        fprintf(stderr, "usage: bench_disk OUT.json [DIR]\n");
        return 2;
    }
    snprintf(path, sizeof(path), "%s/kvcd-bench-disk.kvc", dir);
    /* The daemon's arena is on huge pages where the host has them (hugetlb, or transparent
     * huge pages for shared memory): a block is then a few physically contiguous segments
     * of a request instead of one per 4 KiB page. The main cases use such an arena (here
     * anonymous memory with transparent huge pages); the "4k-pages" cases an arena of
     * small pages, as a daemon on a host without huge pages has. */
    arena = aligned_alloc(2 * MiB, ARENA);
    arena4k = aligned_alloc(2 * MiB, ARENA);
    madvise(arena, ARENA, MADV_HUGEPAGE);
    madvise(arena4k, ARENA, MADV_NOHUGEPAGE);
    for (uint64_t i = 0; i < ARENA; i += 8)
        *(uint64_t *)(arena + i) = *(uint64_t *)(arena4k + i) = i * 0x9e3779b97f4a7c15ull;
    printf("arena: %llu of %llu MiB on huge pages (AnonHugePages)\n",
           (unsigned long long)(anon_huge_kib() / 1024), (unsigned long long)(ARENA / MiB));
    printf("%-34s %10s %-6s  %-22s %10s\n", "case", "value", "unit", "baseline", "value");
    for (int si = 0; si < 2; si++) {
        for (int qi = 0; qi < 3; qi++) {
            uint64_t bs = sizes[si];
            int qd = qds[qi];
            char tag[32];
            snprintf(tag, sizeof(tag), "%lluk qd%d", (unsigned long long)(bs >> 10), qd);
            if (getenv("KVC_BENCH_LOOKUP_ONLY") ||
                (getenv("KVC_BENCH_ONLY") && strcmp(getenv("KVC_BENCH_ONLY"), tag) != 0))
                continue; /* KVC_BENCH_ONLY="256k qd8": that case alone */
            struct tier_disk_config cfg = {.paths = {path},
                                           .npaths = 1,
                                           .size = PER_CASE + 64 * MiB,
                                           .page_size = 64 * MiB,
                                           .queue_depth = (uint32_t)qd};
            struct tier *t;
            uint64_t n = PER_CASE / bs;
            struct tier_loc *locs = calloc(n, sizeof(*locs));
            double wbw = 0, rbw = 0, wbw_4k = 0, rbw_4k = 0, fw = 0, fr = 0;
            char name[64];
            unlink(path);
            t = tier_disk_new(&cfg, &err);
            if (!t) {
                fprintf(stderr, "bench_disk: %s: %s\n", path, strerror(-err));
                return 1;
            }
            tier_disk_buffers_register(t, arena, ARENA);
            snprintf(phase, sizeof(phase), "write %llu qd%d", (unsigned long long)bs, qd);
            /* Steady state, as a daemon that reuses its pages sees it: a first, untimed pass
             * converts the file's unwritten extents; its records are freed and the timed
             * passes reuse the same pages (and fio overwrites the same extents). On ext4 a
             * first write costs about a third more than an overwrite. */
            write_pass(t, locs, n, bs, arena);
            /* The drive's speed drifts by half between seconds here (fio alone: 1.4 to
             * 2.9 GB/s for one command): kvcd and fio take turns, and each side's best
             * round counts. */
            for (int r = 0; r < rounds; r++) {
                for (uint64_t i = 0; i < n; i++)
                    t->ops->free(t, &locs[i]);
                double w = (double)(n * bs) / write_pass(t, locs, n, bs, arena);
                snprintf(phase, sizeof(phase), "read %llu qd%d", (unsigned long long)bs, qd);
                double rd = (double)(n * bs) / read_pass(t, locs, n, bs, arena);
                for (uint64_t i = 0; i < n; i++)
                    t->ops->free(t, &locs[i]);
                snprintf(phase, sizeof(phase), "write %llu qd%d 4k", (unsigned long long)bs, qd);
                double w4 = (double)(n * bs) / write_pass(t, locs, n, bs, arena4k);
                snprintf(phase, sizeof(phase), "read %llu qd%d 4k", (unsigned long long)bs, qd);
                double r4 = (double)(n * bs) / read_pass(t, locs, n, bs, arena4k);
                /* fio on the same file, past the superblock: the same extents kvcd
                 * just wrote and read (kvcd rewrites them in its next round). */
                double f1 = fio_bw(path, TIER_DISK_SB, "write", bs, qd, PER_CASE);
                double f2 = fio_bw(path, TIER_DISK_SB, "read", bs, qd, PER_CASE);
                wbw = w > wbw ? w : wbw;
                wbw_4k = w4 > wbw_4k ? w4 : wbw_4k;
                rbw_4k = r4 > rbw_4k ? r4 : rbw_4k;
                rbw = rd > rbw ? rd : rbw;
                fw = f1 > fw ? f1 : fw;
                fr = f2 > fr ? f2 : fr;
            }
            snprintf(name, sizeof(name), "write %lluk qd%d", (unsigned long long)(bs >> 10), qd);
            add(name, wbw / MiB, "MiB/s", "fio write", fw / MiB);
            snprintf(name, sizeof(name), "read %lluk qd%d", (unsigned long long)(bs >> 10), qd);
            add(name, rbw / MiB, "MiB/s", "fio read", fr / MiB);
            snprintf(name, sizeof(name), "write %lluk qd%d 4k-pages", (unsigned long long)(bs >> 10), qd);
            add(name, wbw_4k / MiB, "MiB/s", "fio write", fw / MiB);
            snprintf(name, sizeof(name), "read %lluk qd%d 4k-pages", (unsigned long long)(bs >> 10), qd);
            add(name, rbw_4k / MiB, "MiB/s", "fio read", fr / MiB);
            tier_destroy(t);
            free(locs);
        }
    }
    /* One block read back at a time: the disk part of a promoting lookup. */
    for (int si = 0; si < 2 && !getenv("KVC_BENCH_ONLY"); si++) {
        uint64_t bs = sizes[si];
        struct tier_disk_config cfg = {.paths = {path},
                                       .npaths = 1,
                                       .size = 512 * MiB, /* 200 records of either size */
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
        snprintf(phase, sizeof(phase), "promote write %llu", (unsigned long long)bs);
        for (int i = 0; i < N; i++) {
            m.key[0] = (uint64_t)i + 1;
            if (t->ops->alloc(t, bs, &locs[i])) {
                fprintf(stderr, "bench_disk: %s: the disk is full\n", phase);
                return 1;
            }
            while (tier_disk_put(t, &locs[i], &m, arena, done_cb, NULL) == -EAGAIN)
                reap(t);
            inflight++;
            tier_disk_drain(t);
        }
        snprintf(phase, sizeof(phase), "promote read %llu", (unsigned long long)bs);
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
    if (!getenv("KVC_BENCH_ONLY") && daemon_suite_init("bench-disk") == 0) {
        lookup_bench(dir, 256 * 1024, false);
        lookup_bench(dir, 2 * MiB, false);
        lookup_bench(dir, 256 * 1024, true);
        daemon_suite_fini();
    }
    if (bench_json_write(argv[1], res, nres))
        return 1;
    free(arena);
    free(arena4k);
    return 0;
}
