/*
 * bench_disk.c — disk-tier write and read throughput (whole records: header, data, XXH3,
 * verification on read) for 256 KiB and 2 MiB blocks at queue depth 1, 8 and 32, beside fio
 * (ioengine=io_uring, direct=1, same file, block size and depth) run here, as a ratio;
 * then the latency of reading one block back into the arena (what a promoting lookup waits
 * for), p50 and p99; then a whole lookup that promotes one block from disk through a real
 * kvcd over its socket (kvc_lookup waiting for the read), p50 and p99, beside a lookup of a
 * block in memory, raw and with disk.compress=1 on fp16-like data; and the walk at a start
 * without a checkpoint (43,000 records of 16 KiB found by reading the pages' record headers),
 * records/s and MB/s beside fio's sequential read of the same bytes
 * (KVC_BENCH_ONLY=walk: that case alone). Usage: bench_disk OUT.json
 * [DIR] (DIR defaults to $KVC_BENCH_DIR or /var/tmp; it must take O_DIRECT).
 *
 * DESIGN
 * What is measured is what the daemon runs: records move between the disk and an arena made
 * by tiers/host.c exactly as the daemon makes its host arena (a memfd, host.page_size and
 * host.hugepages as configured: $KVC_BENCH_PAGE_SIZE, default 2m, and
 * $KVC_BENCH_HUGEPAGES=auto|on|off, default auto as the daemon's; prefaulted, and made huge
 * pages by collapse as host.thp_collapse does unless $KVC_BENCH_THP_COLLAPSE=0), registered
 * with the tier as fixed buffers as the daemon registers it. The output and every case name
 * say what the arena got: hugetlb pages, transparent huge pages, or 4 KiB pages ("[4k]"),
 * which on a host with shmem THP off (Debian's default), no reserved hugetlb pages and a
 * kernel before 6.1 (or host.thp_collapse off) is what the daemon has. Records are written
 * as the daemon's demotions write them (encode on a worker, then place and write) from, and
 * read into, every slot of the arena in turn;
 * the benchmark sleeps on the tier's eventfd between completions, as the daemon's loop does.
 * Queue depth is the tier's queue_depth: the records on the device at once, as fio's
 * iodepth. kvcd and fio take turns on the same file, KVC_BENCH_ROUNDS (5) times, and each
 * side's best round counts; KVC_BENCH_ONLY="256k qd8" runs that case alone.
 * Any error inside a timed case (a request or an encode that failed, fio missing or
 * failing, the tier falling back to buffered I/O) fails the run: its exit status is 1 and
 * the case has no row. KVC_BENCH_SMOKE=1: 256 KiB at depth 1 and 8, 8 MiB per case, one
 * round, short latency runs.
 */
#include <errno.h>
#include <jansson.h>
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
#include "tiers/host.h"

#define MiB (1024ull * 1024)
#define ARENA (bench_smoke() ? 16 * MiB : 128 * MiB)
#define PER_CASE (bench_smoke() ? 8 * MiB : getenv("KVC_BENCH_QUICK") ? 64 * MiB : 512 * MiB)

static struct bench_row res[64];
static size_t nres;
static uint8_t *arena;     /* the host tier's mapping, ARENA bytes */
static char arena_tag[16]; /* "hugetlb", "thp", "4k": what the arena's pages are */
static uint64_t inflight;
static int errors;     /* requests or encodes that failed in the case running */
static char phase[64]; /* the case running, for error lines */

/* Runs completions, or sleeps until some may be ready. */
static void reap(struct tier *t)
{
    if (tier_disk_poll(t) == 0) {
        struct pollfd pfd = {.fd = tier_disk_fd(t), .events = POLLIN};
        poll(&pfd, 1, 10);
    }
}

/* A "Name: N kB" line of a /proc file, KiB (0 when absent). */
static uint64_t proc_kib(const char *file, const char *name)
{
    char line[256];
    unsigned long long kib = 0;
    size_t nl = strlen(name);
    FILE *f = fopen(file, "r");
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, name, nl) == 0 && line[nl] == ':' &&
            sscanf(line + nl + 1, "%llu", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

/* The bracketed setting of a sysfs choice ("always [advise] never" -> "advise"). */
static void sysfs_choice(const char *file, char *out, size_t len)
{
    char line[256] = "";
    FILE *f = fopen(file, "r");
    snprintf(out, len, "unknown");
    if (f && fgets(line, sizeof(line), f)) {
        char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
        if (a && b) {
            *b = 0;
            snprintf(out, len, "%s", a + 1);
        }
    }
    if (f)
        fclose(f);
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
    if (status) {
        bench_fail("disk: %s: request failed (%s)", phase, strerror(-status));
        errors++;
    }
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
        bench_fail("disk: %s: encode failed (%s)", phase, strerror(-status));
        errors++;
        inflight--;
        return;
    }
    int rc = tier_disk_rec_put(w->t, w->loc, r, done_cb, NULL);
    if (rc) {
        bench_fail("disk: %s: write refused (%s)", phase, strerror(-rc));
        errors++;
        inflight--;
    }
}

/* Writes n records of bs bytes into freshly allocated locations, as fast as the tier takes
 * them (its queue_depth bounds the requests on the device); returns the seconds it took, or
 * -1 when anything failed (reported). */
static double write_pass(struct tier *t, struct tier_loc *locs, uint64_t n, uint64_t bs,
                         const uint8_t *base)
{
    struct tier_disk_meta m = {.len = bs};
    struct wrec *w = calloc(n, sizeof(*w));
    double t0 = now_s(), dt;
    int rc;
    errors = 0;
    for (uint64_t i = 0; i < n && !errors; i++) {
        m.key[0] = i + 1;
        w[i] = (struct wrec){.t = t, .loc = &locs[i]};
        while ((rc = tier_disk_encode(t, &m, base + (i % (ARENA / bs)) * bs, 0, 0, encoded_cb,
                                      &w[i])) == -EAGAIN)
            reap(t);
        if (rc) {
            bench_fail("disk: %s: encode refused (%s)", phase, strerror(-rc));
            errors++;
            break;
        }
        inflight++;
    }
    tier_disk_drain(t);
    dt = now_s() - t0;
    free(w);
    return errors ? -1 : dt;
}

/* Reads the n records back in order, as fast as the tier takes them (each verified);
 * returns the seconds, or -1 when anything failed (reported). */
static double read_pass(struct tier *t, const struct tier_loc *locs, uint64_t n, uint64_t bs,
                        uint8_t *base)
{
    struct tier_disk_meta m = {.len = bs};
    double t0 = now_s();
    int rc;
    errors = 0;
    for (uint64_t i = 0; i < n && !errors; i++) {
        m.key[0] = i + 1;
        while ((rc = tier_disk_get(t, &locs[i], &m, base + (i % (ARENA / bs)) * bs, bs, done_cb,
                                   NULL)) == -EAGAIN)
            reap(t);
        if (rc) {
            bench_fail("disk: %s: read refused (%s)", phase, strerror(-rc));
            errors++;
            break;
        }
        inflight++;
    }
    tier_disk_drain(t);
    return errors ? -1 : now_s() - t0;
}

/* fio's bandwidth in bytes/s for one job over size bytes of file from offset, or 0 (then
 * reported: fio failed, and the run fails). */
static double fio_bw(const char *file, uint64_t offset, const char *rw, uint64_t bs, int qd,
                     uint64_t size)
{
    char cmd[1024];
    FILE *p;
    double bw = 0;
    snprintf(cmd, sizeof(cmd),
             "fio --name=kvcd --filename=%s --ioengine=io_uring --direct=1 --rw=%s --bs=%llu "
             "--iodepth=%d --offset=%llu --size=%llu --output-format=json 2>/dev/null",
             file, rw, (unsigned long long)bs, qd, (unsigned long long)offset,
             (unsigned long long)size);
    p = popen(cmd, "r");
    if (!p)
        return 0;
    /* jobs[0].read.bw_bytes (or .write): the one job's bandwidth in the direction asked. */
    json_t *doc = json_loadf(p, 0, NULL);
    const json_t *v = json_object_get(
        json_object_get(json_array_get(json_object_get(doc, "jobs"), 0), rw), "bw_bytes");
    if (json_is_number(v))
        bw = json_number_value(v);
    json_decref(doc);
    int st = pclose(p);
    if (st != 0 || !(bw > 0))
        bench_fail("disk: fio %s bs=%llu iodepth=%d failed (status %d, %g bytes/s)", rw,
                   (unsigned long long)bs, qd, st, bw);
    return st == 0 ? bw : 0;
}

static void add(const char *name, double v, const char *unit, const char *baseline, double base)
{
    if (!bench_row_add(res, sizeof(res) / sizeof(res[0]), &nres, name, v, unit, baseline, base))
        return;
    if (baseline)
        printf("%-40s %10.1f %-6s  %-22s %10.1f  ratio %.3f\n", name, v, unit, baseline, base,
               v / base);
    else
        printf("%-40s %10.1f %-6s\n", name, v, unit);
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
    const char *args[] = {"-o", o_path,
                          "-o", o_host,
                          "-o", "host.page_size=256k",
                          "-o", "host.hugepages=off",
                          "-o", "disk.capacity=1g",
                          "-o", o_page,
                          "-o", "disk.write_rate=0",
                          "-o", "host.high_watermark=0.6",
                          "-o", "host.low_watermark=0.4",
                          "-o", compress ? "disk.compress=1" : "disk.compress=0",
                          NULL};
    uint32_t tokens = (uint32_t)(bs / (4 * 4 * 128 * 2 * 2));
    struct kvc_layout lay = {.model_id = "bench/disk",
                             .layers = 4,
                             .kv_heads = 4,
                             .head_dim = 128,
                             .block_tokens = tokens,
                             .dtype = KVC_DTYPE_FP16,
                             .kv_kind = KVC_KV_KIND_KV};
    enum { NB_MAX = 160 };
    const int NB = bench_smoke() ? 40 : NB_MAX;
    static struct kvc_key keys[NB_MAX];
    double disk_lat[NB_MAX], mem_lat[NB_MAX];
    int nd = 0, nm = 0;
    kvc_client *c = NULL;
    kvc_ns *ns = NULL;
    char name[64];
    snprintf(o_path, sizeof(o_path), "disk.path=%s/kvcd-bench-lookup.kvc", dir);
    snprintf(o_host, sizeof(o_host), "host.size=%llum", (unsigned long long)(bs * 64 / MiB));
    snprintf(o_page, sizeof(o_page), "disk.page=%llum", (unsigned long long)(bs * 8 / MiB));
    if (daemon_start(&d, args) || kvc_connect(d.sock, &c) || kvc_ns_open(c, &lay, &ns)) {
        bench_fail("disk: cannot start kvcd for the lookup case");
        goto out;
    }
    uint8_t *buf = malloc(bs);
    for (int i = 0; i < NB && buf; i++) {
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
        int rc = kvc_put_prefix(ns, NULL, &keys[i], 1, &p);
        if (rc < 0) {
            bench_fail("disk: lookup %lluk: put: %s", (unsigned long long)(bs >> 10),
                       kvc_strerror(rc));
            free(buf);
            goto out;
        }
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
        if (h < 0) {
            bench_fail("disk: lookup %lluk: %s", (unsigned long long)(bs >> 10), kvc_strerror(h));
            goto out;
        }
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
    if (nd >= 10 && nm >= 10 && !bench_failed()) {
        qsort(disk_lat, (size_t)nd, sizeof(double), cmp_d);
        qsort(mem_lat, (size_t)nm, sizeof(double), cmp_d);
        const char *z = compress ? " zstd-1" : "";
        snprintf(name, sizeof(name), "lookup promote %lluk%s p50", (unsigned long long)(bs >> 10),
                 z);
        add(name, disk_lat[nd / 2], "us", "lookup in memory p50", mem_lat[nm / 2]);
        snprintf(name, sizeof(name), "lookup promote %lluk%s p99", (unsigned long long)(bs >> 10),
                 z);
        add(name, disk_lat[nd * 99 / 100], "us", "lookup in memory p99", mem_lat[nm * 99 / 100]);
        printf("  (%d promoting lookups, %d in memory)\n", nd, nm);
    } else if (!bench_failed()) {
        bench_fail("disk: lookup %lluk: %d on disk, %d in memory: too few to measure",
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

/* The daemon's arena (tiers/host.c) as configured; its page kind into arena_tag. */
static struct tier *arena_new(void)
{
    const char *hp = getenv("KVC_BENCH_HUGEPAGES"), *ps = getenv("KVC_BENCH_PAGE_SIZE");
    const char *col = getenv("KVC_BENCH_THP_COLLAPSE");
    struct tier_host_config hc = {
        .name = "kvcd-bench-arena",
        .size = ARENA,
        .page_size = ps ? strtoull(ps, NULL, 0) : 2 * MiB,
        .huge = !hp || strcmp(hp, "auto") == 0 ? TIER_HOST_HUGE_AUTO
                : strcmp(hp, "on") == 0        ? TIER_HOST_HUGE_ON
                                               : TIER_HOST_HUGE_OFF,
        .prefault = true,
        .collapse = !col || strcmp(col, "0") != 0, /* host.thp_collapse's default */
    };
    char thp[32];
    int err = 0;
    uint64_t shmem0 = proc_kib("/proc/self/smaps_rollup", "ShmemPmdMapped");
    struct tier *t = tier_host_new(&hc, &err);
    if (!t) {
        bench_fail("disk: the arena (host tier, %s pages): %s", hp ? hp : "auto", strerror(-err));
        return NULL;
    }
    arena = tier_host_base(t);
    uint64_t pmd = proc_kib("/proc/self/smaps_rollup", "ShmemPmdMapped") - shmem0;
    sysfs_choice("/sys/kernel/mm/transparent_hugepage/shmem_enabled", thp, sizeof(thp));
    snprintf(arena_tag, sizeof(arena_tag), "%s",
             tier_host_hugetlb(t)      ? "hugetlb"
             : pmd * 1024 >= ARENA / 2 ? "thp"
                                       : "4k");
    printf("arena: the daemon's host arena (tiers/host.c memfd), %llu MiB, allocator page "
           "%llu KiB, host.hugepages=%s: %s (hugetlb %s; shmem THP '%s', %llu MiB mapped "
           "huge)\n",
           (unsigned long long)(ARENA / MiB), (unsigned long long)(hc.page_size >> 10),
           hp ? hp : "auto",
           !strcmp(arena_tag, "hugetlb") ? "hugetlb pages"
           : !strcmp(arena_tag, "thp")   ? "transparent huge pages"
                                         : "4 KiB pages",
           tier_host_hugetlb(t) ? "yes" : "no", thp, (unsigned long long)(pmd >> 10));
    return t;
}

/* A disk tier on path with the arena registered as the daemon registers it; NULL after a
 * reported failure. */
static struct tier *disk_new(const struct tier_disk_config *cfg, const char *path)
{
    struct tier_disk_stats st;
    int err = 0;
    unlink(path);
    struct tier *t = tier_disk_new(cfg, &err);
    if (!t) {
        bench_fail("disk: %s: %s", path, strerror(-err));
        return NULL;
    }
    tier_disk_stats_get(t, &st);
    if (st.buffered) {
        bench_fail("disk: %s refuses O_DIRECT: buffered I/O is not what is measured "
                   "(set KVC_BENCH_DIR)",
                   path);
        tier_destroy(t);
        return NULL;
    }
    err = tier_disk_buffers_register(t, arena, ARENA);
    if (err)
        printf("note: the arena is not registered as fixed buffers (%s): requests pin pages "
               "as the daemon's then do\n",
               strerror(-err));
    return t;
}

static int walk_cb(void *arg, const struct tier_disk_meta *m, const struct tier_loc *loc)
{
    (void)m;
    (void)loc;
    ++*(uint64_t *)arg;
    return 0;
}

/* A start without a checkpoint (a crash before the first one): n records of 16 KiB are
 * written, then the tier is opened again KVC_BENCH_ROUNDS times with no checkpoint and every
 * record must be found by walking the pages. Records per second and MB/s of the pages
 * holding records, median and best, beside fio's sequential read of the same bytes (1 MiB
 * requests at depth 8, O_DIRECT). */
static void walk_bench(const char *path, int rounds)
{
    const uint64_t bs = 16 * 1024, n = bench_smoke() ? 2048 : 43000;
    const uint64_t span = n * (bs + TIER_DISK_SB); /* each record: a 4 KiB header and 16 KiB */
    struct tier_disk_config cfg = {.paths = {path},
                                   .npaths = 1,
                                   .size = (span + 64 * MiB) & ~(16 * MiB - 1),
                                   .page_size = 16 * MiB,
                                   .queue_depth = 32,
                                   .ckpt_path = ""};
    struct tier_loc *locs = calloc(n, sizeof(*locs));
    double secs[16], fbest = 0, fr[16];
    char name[96];
    int ok = 1, nr = rounds < 1 ? 1 : rounds > 16 ? 16 : rounds;
    struct tier *t = locs ? disk_new(&cfg, path) : NULL;
    if (!t) {
        free(locs);
        return;
    }
    snprintf(phase, sizeof(phase), "walk: write");
    ok = write_pass(t, locs, n, bs, arena) > 0;
    tier_destroy(t);
    free(locs);
    for (int r = 0; r < nr && ok; r++) {
        struct tier_disk_stats st;
        uint64_t found = 0;
        int err = 0;
        cfg.scan = walk_cb;
        cfg.scan_arg = &found;
        t = tier_disk_new(&cfg, &err);
        if (!t) {
            bench_fail("disk: walk: %s: %s", path, strerror(-err));
            ok = 0;
            break;
        }
        tier_disk_stats_get(t, &st);
        tier_destroy(t);
        if (found != n || st.records_walked != n || st.ckpt_loaded) {
            bench_fail("disk: walk: %llu of %llu records found", (unsigned long long)found,
                       (unsigned long long)n);
            ok = 0;
            break;
        }
        secs[r] = (double)st.start_us / 1e6;
        fr[r] = fio_bw(path, TIER_DISK_SB, "read", 1 * MiB, 8, span & ~(MiB - 1));
        fbest = fr[r] > fbest ? fr[r] : fbest;
        printf("walk round %d: %llu records in %.3f s (%llu header reads), fio %.0f MB/s\n", r + 1,
               (unsigned long long)n, secs[r], (unsigned long long)st.start_reads, fr[r] / 1e6);
        if (!(fr[r] > 0))
            ok = 0;
    }
    if (!ok)
        return;
    qsort(secs, (size_t)nr, sizeof(secs[0]), cmp_d);
    qsort(fr, (size_t)nr, sizeof(fr[0]), cmp_d);
    snprintf(name, sizeof(name), "walk 16k records/s median");
    add(name, (double)n / secs[nr / 2], "rec/s", NULL, 0);
    snprintf(name, sizeof(name), "walk 16k records/s best");
    add(name, (double)n / secs[0], "rec/s", NULL, 0);
    snprintf(name, sizeof(name), "walk 16k median");
    add(name, (double)span / secs[nr / 2] / 1e6, "MB/s", "fio seq read median", fr[nr / 2] / 1e6);
    snprintf(name, sizeof(name), "walk 16k best");
    add(name, (double)span / secs[0] / 1e6, "MB/s", "fio seq read best", fbest / 1e6);
}

static int fio_present(void)
{
    return system("fio --version >/dev/null 2>&1") == 0;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 2                  ? argv[2]
                      : getenv("KVC_BENCH_DIR") ? getenv("KVC_BENCH_DIR")
                                                : "/var/tmp";
    const uint64_t sizes[2] = {256 * 1024, 2 * MiB};
    const int qds[3] = {1, 8, 32};
    const int nsizes = bench_smoke() ? 1 : 2, nqds = bench_smoke() ? 2 : 3;
    const int rounds = bench_smoke()                ? 1
                       : getenv("KVC_BENCH_ROUNDS") ? atoi(getenv("KVC_BENCH_ROUNDS"))
                                                    : 5;
    char path[512];
    if (argc < 2) {
        fprintf(stderr, "usage: bench_disk OUT.json [DIR]\n");
        return 2;
    }
    snprintf(path, sizeof(path), "%s/kvcd-bench-disk.kvc", dir);
    struct tier *host = arena_new();
    if (!host)
        return bench_finish(argv[1], res, nres);
    int fio = fio_present();
    if (!fio && !getenv("KVC_BENCH_LOOKUP_ONLY"))
        bench_fail("disk: fio is not installed (etc/install-deps.sh): the throughput cases "
                   "have no baseline");
    printf("%-40s %10s %-6s  %-22s %10s\n", "case", "value", "unit", "baseline", "value");
    if (fio && !getenv("KVC_BENCH_LOOKUP_ONLY") &&
        (!getenv("KVC_BENCH_ONLY") || strcmp(getenv("KVC_BENCH_ONLY"), "walk") == 0))
        walk_bench(path, rounds < 3 ? 3 : rounds);
    for (int si = 0; si < nsizes && fio; si++) {
        for (int qi = 0; qi < nqds; qi++) {
            uint64_t bs = sizes[si];
            int qd = qds[qi];
            char tag[32];
            snprintf(tag, sizeof(tag), "%lluk qd%d", (unsigned long long)(bs >> 10), qd);
            if (getenv("KVC_BENCH_LOOKUP_ONLY") ||
                (getenv("KVC_BENCH_ONLY") && strcmp(getenv("KVC_BENCH_ONLY"), tag) != 0))
                continue; /* KVC_BENCH_ONLY="256k qd8": that case alone */
            /* Room for a pass of records (each a header more than its block: 31 of 2 MiB
             * in a 64 MiB page, not 32) in whole pages, and two pages more: the page left
             * open by the pass before, and slack for pages whose records were just freed. */
            const uint64_t pg = bench_smoke() ? 4 * MiB : 64 * MiB;
            const uint64_t per_page = pg / tier_disk_record_bytes(bs);
            struct tier_disk_config cfg = {.paths = {path},
                                           .npaths = 1,
                                           .size =
                                               ((PER_CASE / bs + per_page - 1) / per_page + 2) * pg,
                                           .page_size = pg,
                                           .queue_depth = (uint32_t)qd};
            uint64_t n = PER_CASE / bs;
            struct tier_loc *locs = calloc(n, sizeof(*locs));
            double wbw = 0, rbw = 0, fw = 0, fr = 0;
            int ok = 1;
            char name[96];
            struct tier *t = disk_new(&cfg, path);
            if (!t || !locs) {
                free(locs);
                goto done;
            }
            snprintf(phase, sizeof(phase), "write %s", tag);
            /* Steady state, as a daemon that reuses its pages sees it: a first, untimed pass
             * converts the file's unwritten extents; its records are freed and the timed
             * passes reuse the same pages (and fio overwrites the same extents). On ext4 a
             * first write costs about a third more than an overwrite. */
            ok = write_pass(t, locs, n, bs, arena) > 0;
            /* The drive's speed drifts by half between seconds here (fio alone: 1.4 to
             * 2.9 GB/s for one command): kvcd and fio take turns, and each side's best
             * round counts. */
            for (int r = 0; r < rounds && ok; r++) {
                for (uint64_t i = 0; i < n; i++)
                    t->ops->free(t, &locs[i]);
                snprintf(phase, sizeof(phase), "write %s", tag);
                double wt = write_pass(t, locs, n, bs, arena);
                snprintf(phase, sizeof(phase), "read %s", tag);
                double rt = wt > 0 ? read_pass(t, locs, n, bs, arena) : -1;
                /* fio on the same file, past the superblock: the same extents kvcd
                 * just wrote and read (kvcd rewrites them in its next round). */
                double f1 = rt > 0 ? fio_bw(path, TIER_DISK_SB, "write", bs, qd, PER_CASE) : 0;
                double f2 = f1 > 0 ? fio_bw(path, TIER_DISK_SB, "read", bs, qd, PER_CASE) : 0;
                ok = wt > 0 && rt > 0 && f1 > 0 && f2 > 0;
                if (!ok)
                    break;
                double w = (double)(n * bs) / wt, rd = (double)(n * bs) / rt;
                wbw = w > wbw ? w : wbw;
                rbw = rd > rbw ? rd : rbw;
                fw = f1 > fw ? f1 : fw;
                fr = f2 > fr ? f2 : fr;
            }
            if (ok) {
                snprintf(name, sizeof(name), "write %s [%s]", tag, arena_tag);
                add(name, wbw / MiB, "MiB/s", "fio write", fw / MiB);
                snprintf(name, sizeof(name), "read %s [%s]", tag, arena_tag);
                add(name, rbw / MiB, "MiB/s", "fio read", fr / MiB);
            }
            tier_destroy(t);
            free(locs);
        }
    }
    /* One block read back at a time: the disk part of a promoting lookup. */
    for (int si = 0; si < nsizes && !getenv("KVC_BENCH_ONLY"); si++) {
        uint64_t bs = sizes[si];
        struct tier_disk_config cfg = {.paths = {path},
                                       .npaths = 1,
                                       .size = 512 * MiB, /* 200 records of either size */
                                       .page_size = 64 * MiB,
                                       .queue_depth = 8};
        enum { N_MAX = 200 };
        const int N = bench_smoke() ? 20 : N_MAX;
        struct tier_loc locs[N_MAX];
        double lat[N_MAX];
        struct tier_disk_meta m = {.len = bs};
        char name[96];
        int rc = 0;
        struct tier *t = disk_new(&cfg, path);
        if (!t)
            goto done;
        snprintf(phase, sizeof(phase), "promote write %llu", (unsigned long long)bs);
        errors = 0;
        for (int i = 0; i < N && !rc && !errors; i++) {
            m.key[0] = (uint64_t)i + 1;
            if (t->ops->alloc(t, bs, &locs[i])) {
                bench_fail("disk: %s: the disk is full", phase);
                rc = -ENOSPC;
                break;
            }
            while ((rc = tier_disk_put(t, &locs[i], &m, arena, done_cb, NULL)) == -EAGAIN)
                reap(t);
            if (!rc)
                inflight++;
            tier_disk_drain(t);
        }
        snprintf(phase, sizeof(phase), "promote read %llu", (unsigned long long)bs);
        /* Random order, so the drive's read-ahead does not help. */
        for (int i = 0; i < N && !rc && !errors; i++) {
            int j = (int)((unsigned)(i * 7919) % (unsigned)N);
            double t0 = now_s();
            m.key[0] = (uint64_t)j + 1;
            rc = tier_disk_get(t, &locs[j], &m, arena + ARENA / 2, bs, done_cb, NULL);
            if (!rc)
                inflight++;
            tier_disk_drain(t);
            lat[i] = (now_s() - t0) * 1e6;
        }
        if (rc)
            bench_fail("disk: %s: %s", phase, strerror(-rc));
        if (!rc && !errors) {
            qsort(lat, (size_t)N, sizeof(lat[0]), cmp_d);
            snprintf(name, sizeof(name), "promote read %lluk p50 [%s]",
                     (unsigned long long)(bs >> 10), arena_tag);
            add(name, lat[N / 2], "us", NULL, 0);
            snprintf(name, sizeof(name), "promote read %lluk p99 [%s]",
                     (unsigned long long)(bs >> 10), arena_tag);
            add(name, lat[N * 99 / 100], "us", NULL, 0);
        }
        tier_destroy(t);
    }
    unlink(path);
    if (!getenv("KVC_BENCH_ONLY") && daemon_suite_init("bench-disk") == 0) {
        /* a real kvcd: its own arena, as its configuration makes it */
        lookup_bench(dir, 256 * 1024, false);
        if (!bench_smoke()) {
            lookup_bench(dir, 2 * MiB, false);
            lookup_bench(dir, 256 * 1024, true);
        }
        daemon_suite_fini();
    }
done:
    unlink(path);
    tier_destroy(host);
    return bench_finish(argv[1], res, nres);
}
