/*
 * bench_scale.c — kvcd at production size (issue 32): time to ready against the machine's
 * page-fault rate, hit/put latency and daemon cost from thousands to a million cached blocks,
 * fast-path coverage, memory per block, and throughput with 1 to 1,024 clients.
 * Usage: bench_scale OUT.json (make bench-scale writes build/bench/scale.json).
 *
 * DESIGN
 * Everything runs against the real kvcd (built beside it) through libkvc, one daemon at a
 * time, each in a private directory:
 *  - ready: the machine's shmem fault rate first (a memfd populated with MADV_POPULATE_WRITE
 *    by one thread and by one per CPU, in this process), then kvcd started with host.size =
 *    1 GiB and 8 GiB (the largest the machine's free memory allows; KVC_SCALE_READY=SIZES
 *    overrides): the time from its start until it answers a HELLO, and until its arena is
 *    faulted in (host_faulted, polled), as a rate against the machine's. Sizes the machine
 *    cannot hold are projected from that rate, said so in the output, and get no row. With
 *    KVC_SCALE_READY_GPU=POOL (a device there), each size up to 8 GiB again with a GPU pool:
 *    ready, and the arena registered with the device whole, against the same without one.
 *  - levels: for 4 KiB and 64 KiB blocks, one daemon per level with an arena that holds N
 *    blocks (N = 4,096 [the smallest arena, 16 MiB], 10^4, 10^5, 10^6 for 4 KiB; 10^3 .. 10^5
 *    for 64 KiB, as far as free memory allows), filled past full with chains of 64 blocks so
 *    that it evicts, then measured: a one-block and a 64-block get through the shared index
 *    (kvc_get_prefix) and through the socket (kvc_lookup, kvc_lease_copy, kvc_release) of
 *    random cached blocks and chains, p50 and p99; the fast-path gets again with each
 *    sample's blocks flushed from the CPU's caches first (hit*_fast_cold: at 4,096 blocks
 *    the whole arena fits in the caches, so the warm rows compare a cached copy with one
 *    from DRAM; the cold ones compare kvcd's own costs); a one-block and a 64-block put of fresh
 *    keys (kvc_put_prefix: each evicts as much), p50 and p99; the machine's floors beside them
 *    (memcpy of the same blocks from and to random places of memory as large as the arena,
 *    copy*_floor: what a hit or a put copies grows with the memory, not the daemon); the
 *    daemon's loop thread's CPU
 *    per block put and evicted, per one-block socket hit and per fast-path hit it counts
 *    from the hit rings (/proc/PID/schedstat of its main thread: the daemon's own cost, apart
 *    from the wake-ups a latency counts; the socket's gets are timed once the rings of the
 *    fast gets before them are read); the share of cached
 *    blocks in the shared index (fast_index_blocks / blocks_now, and fast_index_full); and the
 *    daemon's memory beyond its arena per cached block (VmRSS at the end less VmRSS once the
 *    empty arena was faulted in, less its shared index, over blocks_now: the index counts
 *    whether its pages are resident at once or as entries land). Each figure's baseline is
 *    the same figure
 *    at the smallest level of the same block size, in the same run (target: ratio <= 1.5);
 *    coverage against 0.99 and memory against 128 B a block (the targets of the design).
 *  - clients: one daemon (a 64 MiB arena of 4 KiB blocks, 64 chains of 64 blocks cached for
 *    the gets), and 1, 16, 128 and 1,024 client connections in min(N, 16) forked processes
 *    (each running its connections in turn), all started together for a fixed time per
 *    operation: one-block and 64-block gets (fast path), one-block gets through the socket,
 *    one-block and 64-block puts of fresh keys. Throughput against one client's times the
 *    cores the clients can use (min(N, online CPUs)); the loop thread's CPU per request
 *    (the STATS counter `requests`) for the socket operations, whose inverse is where one
 *    loop saturates. Then the same again on a daemon with server.io_threads =
 *    KVC_SCALE_IO_THREADS (default 2; 0 skips it; a comma-separated list runs each count):
 *    rows ending in _io<N>, throughput against the same row without I/O threads, and the I/O
 *    threads' CPU per request beside the loop's.
 *    The daemon's server.io_threads_min_active applies (few busy connections stay on the
 *    loop thread); KVC_SCALE_IO_MIN_ACTIVE=N sets it (1: every connection on the threads).
 * Keys are random 128-bit values (the daemon never derives them), blocks are filled from
 * their key (tests/lib/daemon.c) and a sample of every get is checked byte for byte. Any
 * failed request, short hit or wrong byte fails the run (exit 1). KVC_SCALE_ONLY=ready,
 * levels or clients runs one part. KVC_BENCH_SMOKE=1: a 64 MiB ready case, one level of each
 * block size, 1 and 4 clients, short phases. KVC_SCALE_CLIENTS=1,16,128 and KVC_SCALE_SECS=0.5
 * shorten the clients part (etc/device-check.sh's many-core stage); KVC_SCALE_CLIENTS=1,2
 * checks on 2 CPUs that the fast path scales (clients_2_get1_fast against 2 x one client).
 * The fast gets also report the share of their hits the daemon counted
 * (fast_counted_share_*: the rest skipped, fast_dropped).
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc.h"
#include "tests/lib/bench.h"
#include "tests/lib/daemon.h"
#include "tests/lib/rng.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define MiB (1024ull * 1024)
#define GiB (1024ull * MiB)
#define SC_CHAIN 64
#define SC_ROWS 320

static struct bench_row rows[SC_ROWS];
static size_t nrows;

static double sc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int sc_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile (0..1) of v[0..n) (sorted in place). */
static double sc_pct(double *v, size_t n, double q)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof(*v), sc_cmp);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static uint64_t sc_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A key no other (tag, i) gives; never all zero. */
static struct kvc_key sc_key(uint64_t tag, uint64_t i)
{
    struct kvc_key k = {.lo = sc_mix(tag * 0x100000001b3ull ^ i), .hi = sc_mix(~tag ^ (i << 1))};
    k.lo |= 1;
    return k;
}

static uint64_t sc_rng = 88172645463325252ull;
static uint64_t sc_rand(void)
{
    return rng_next(&sc_rng);
}

/* MemAvailable, bytes. */
static uint64_t sc_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    char line[128];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return (uint64_t)kb * 1024;
}

/* CPU time of pid's main thread (the daemon's loop), seconds. */
static double sc_loop_cpu(pid_t pid)
{
    char path[64];
    unsigned long long ns = 0;
    snprintf(path, sizeof(path), "/proc/%d/task/%d/schedstat", (int)pid, (int)pid);
    FILE *f = fopen(path, "re");
    if (f) {
        if (fscanf(f, "%llu", &ns) != 1)
            ns = 0;
        fclose(f);
    }
    return (double)ns * 1e-9;
}

/* CPU seconds of pid's I/O threads (server.io_threads: its threads named kvcd-io*). */
static double sc_io_cpu(pid_t pid)
{
    char path[300], comm[32];
    double sum = 0;
    struct dirent *e;
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    while (d && (e = readdir(d))) {
        unsigned long long ns;
        FILE *f;
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid, e->d_name);
        f = fopen(path, "re");
        if (!f)
            continue;
        bool io = fgets(comm, sizeof(comm), f) && strncmp(comm, "kvcd-io", 7) == 0;
        fclose(f);
        if (!io)
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%s/schedstat", (int)pid, e->d_name);
        f = fopen(path, "re");
        if (f && fscanf(f, "%llu", &ns) == 1)
            sum += (double)ns * 1e-9;
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    return sum;
}

/* VmRSS of pid, bytes. */
static uint64_t sc_rss(pid_t pid)
{
    char path[64], line[128];
    unsigned long long kb = 0;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return (uint64_t)kb * 1024;
}

/* Resident bytes of the daemon's mappings of its shared indexes (memfd:kvcd-index-*). */
static uint64_t sc_index_rss(pid_t pid)
{
    char path[64], line[256];
    unsigned long long kb, sum = 0;
    bool in = false;
    snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
    FILE *f = fopen(path, "re");
    while (f && fgets(line, sizeof(line), f)) {
        unsigned long long a, b;
        if (sscanf(line, "%llx-%llx", &a, &b) == 2)
            in = strstr(line, "memfd:kvcd-index-") != NULL;
        else if (in && sscanf(line, "Rss: %llu kB", &kb) == 1)
            sum += kb;
    }
    if (f)
        fclose(f);
    return (uint64_t)sum * 1024;
}

/* KVC_SCALE_SMAPS=1: the daemon's mappings by resident size (what its memory is). */
static void sc_smaps(pid_t pid)
{
    char path[64], line[256], name[200] = "";
    unsigned long long kb;
    if (!getenv("KVC_SCALE_SMAPS"))
        return;
    snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
    FILE *f = fopen(path, "re");
    while (f && fgets(line, sizeof(line), f)) {
        unsigned long long a, b;
        if (sscanf(line, "%llx-%llx", &a, &b) == 2) {
            char *sp = strrchr(line, ' ');
            snprintf(name, sizeof(name), "%s", sp && sp[1] != '\n' ? sp + 1 : "[anon]\n");
            name[strcspn(name, "\n")] = 0;
        } else if (sscanf(line, "Rss: %llu kB", &kb) == 1 && kb >= 1024) {
            printf("  smaps: %8llu KiB  %s\n", kb, name);
        }
    }
    if (f)
        fclose(f);
}

static uint64_t sc_stat(kvc_client *c, const char *name)
{
    uint64_t v = 0;
    if (daemon_client_stat(c, 0, name, &v))
        bench_fail("STATS %s failed", name);
    return v;
}

/* Several counters from one STATS reply, so they describe the same moment (a trim may run
 * between two requests: blocks_now read before it and fast_index_blocks after it made the
 * coverage look short by what it evicted). */
static void sc_stats(kvc_client *c, const char *const *names, uint64_t *v, size_t n)
{
    struct kvc_stat *st;
    size_t ns;
    if (kvc_stats(c, 0, &st, &ns)) {
        bench_fail("STATS failed");
        return;
    }
    for (size_t j = 0; j < n; j++) {
        size_t i = 0;
        while (i < ns && strcmp(st[i].name, names[j]) != 0)
            i++;
        if (i == ns)
            bench_fail("STATS: no %s", names[j]);
        v[j] = i < ns ? st[i].value : 0;
    }
    free(st);
}

static void sc_row(const char *name, double value, const char *unit, const char *base, double basev)
{
    /* The row keeps the baseline's name by pointer, and callers format it on their stack:
     * a copy for the run's life. */
    char *keep = base ? strdup(base) : NULL;
    if (base && !keep) {
        bench_fail("no memory");
        return;
    }
    bench_row_add(rows, SC_ROWS, &nrows, name, value, unit, keep, basev);
    if (base)
        printf("%-40s %12.3f %-6s vs %-34s %12.3f  ratio %.3f\n", name, value, unit, base, basev,
               basev > 0 ? value / basev : 0);
    else
        printf("%-40s %12.3f %s\n", name, value, unit);
    fflush(stdout);
}

/* Starts kvcd with host.size = size and the overrides in extra (NULL-terminated). */
static int sc_start(struct daemon *d, uint64_t size, const char *const *extra)
{
    char o_size[64];
    const char *args[32] = {
        "-o", o_size, "-o", "server.max_clients=4096", "-o", "server.max_clients_per_uid=4096"};
    int n = 6;
    snprintf(o_size, sizeof(o_size), "host.size=%llum", (unsigned long long)(size / MiB));
    for (int i = 0; extra && extra[i] && n < 30; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    memset(d, 0, sizeof(*d));
    return daemon_start(d, args);
}

/* Polls until every arena is faulted in: seconds since t0, or -1 after the deadline. */
static double sc_wait_faulted(kvc_client *c, double t0, double deadline_s)
{
    for (;;) {
        uint64_t f = sc_stat(c, "host_faulted"), t = sc_stat(c, "host_arenas_bytes");
        double now = sc_now();
        if (t && f >= t)
            return now - t0;
        if (now - t0 > deadline_s || bench_failed())
            return -1;
        usleep(2000);
    }
}

/* ---- ready ---------------------------------------------------------------------------- */

struct sc_pf {
    char *map;
    uint64_t size, chunk;
    _Atomic uint64_t next;
};

static void *sc_pf_main(void *arg)
{
    struct sc_pf *p = arg;
    for (;;) {
        uint64_t o = atomic_fetch_add(&p->next, p->chunk);
        if (o >= p->size)
            break;
        if (madvise(p->map + o, p->chunk, MADV_POPULATE_WRITE))
            for (uint64_t x = 0; x < p->chunk; x += 4096)
                p->map[o + x] = 0;
    }
    return NULL;
}

/* The rate (B/s) at which `threads` threads fault in a fresh memfd of `size`. */
static double sc_fault_rate(uint64_t size, int threads)
{
    struct sc_pf p = {.size = size, .chunk = 2 * MiB};
    pthread_t th[64];
    int fd = memfd_create("bench-scale-faults", MFD_CLOEXEC);
    double t, rate = 0;
    if (fd < 0 || ftruncate(fd, (off_t)size) < 0)
        goto out;
    p.map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p.map == MAP_FAILED)
        goto out;
    t = sc_now();
    for (int i = 0; i < threads; i++)
        pthread_create(&th[i], NULL, sc_pf_main, &p);
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    rate = (double)size / (sc_now() - t);
    munmap(p.map, size);
out:
    if (fd >= 0)
        close(fd);
    return rate;
}

/* With a GPU tier (KVC_SCALE_READY_GPU=POOL, e.g. 1g, where a device is; arenas up to 8 GiB):
 * the same start with a pool of that size, whose arena registration (pinning) must not hold
 * the start (daemon/gpu_reg.h): ready against the start without a pool in the same run, and
 * the time until the arena is registered whole against the fault-in's. */
static void sc_ready_gpu(uint64_t size, const char *tag, double ready0, double full0)
{
    const char *pool = getenv("KVC_SCALE_READY_GPU");
    char o_pool[64], name[96];
    const char *extra[] = {"-o", o_pool, NULL};
    struct daemon d;
    kvc_client *c = NULL;
    uint64_t cap = 0, reg = 0;
    if (!pool || !*pool || size > 8 * GiB)
        return;
    snprintf(o_pool, sizeof(o_pool), "gpu.pool_size=%s", pool);
    double t0 = sc_now();
    if (sc_start(&d, size, extra) || kvc_connect(d.sock, &c)) {
        bench_fail("ready: kvcd with host.size %s and gpu.pool_size %s did not start", tag, pool);
        daemon_cleanup(&d);
        return;
    }
    double ready = sc_now() - t0, registered = -1;
    if (daemon_client_stat(c, 0, "gpu_capacity", &cap) || cap == 0) {
        printf("ready_%s_gpu: not run: kvcd has no GPU tier here\n", tag);
    } else {
        for (;;) {
            double now = sc_now();
            if (daemon_client_stat(c, 0, "gpu_host_registered_bytes", &reg) == 0 && reg >= size) {
                registered = now - t0;
                break;
            }
            if (now - t0 > (double)size / 20e6 + 60 || bench_failed())
                break;
            usleep(2000);
        }
    }
    kvc_disconnect(c);
    daemon_stop(&d);
    daemon_cleanup(&d);
    if (!cap)
        return;
    if (registered < 0) {
        bench_fail("ready: the %s arena was not registered with the device in time (%llu MiB)",
                   tag, (unsigned long long)(reg / MiB));
        return;
    }
    snprintf(name, sizeof(name), "ready_%s_gpu", tag);
    sc_row(name, ready, "s", "ready without a pool, same run", ready0);
    snprintf(name, sizeof(name), "registered_%s_gpu", tag);
    sc_row(name, registered, "s", "fault-in without a pool, same run", full0);
}

static void sc_ready(void)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = ncpu < 1 ? 1 : ncpu > 8 ? 8 : (int)ncpu;
    uint64_t probe = bench_smoke() ? 64 * MiB : GiB;
    uint64_t sizes[8] = {64 * MiB}, nsizes = 1;
    double r1 = sc_fault_rate(probe, 1), rn = sc_fault_rate(probe, threads), best = 0;
    char name[96];
    if (r1 <= 0 || rn <= 0) {
        bench_fail("ready: cannot measure the machine's fault rate");
        return;
    }
    sc_row("machine_fault_rate_1_thread", r1 / 1e9, "GB/s", NULL, 0);
    snprintf(name, sizeof(name), "machine_fault_rate_%d_threads", threads);
    sc_row(name, rn / 1e9, "GB/s", NULL, 0);
    double machine = r1 > rn ? r1 : rn;
    if (!bench_smoke()) {
        const char *env = getenv("KVC_SCALE_READY");
        nsizes = 0;
        if (env) {
            char *dup = strdup(env), *save = NULL;
            for (char *t = strtok_r(dup, ",", &save); t && nsizes < 8;
                 t = strtok_r(NULL, ",", &save))
                sizes[nsizes++] = strtoull(t, NULL, 10) * GiB;
            free(dup);
        } else {
            sizes[nsizes++] = GiB;
            sizes[nsizes++] = 8 * GiB;
            sizes[nsizes++] = 64 * GiB;
        }
    }
    for (uint64_t i = 0; i < nsizes; i++) {
        uint64_t size = sizes[i];
        struct daemon d;
        kvc_client *c = NULL;
        char tag[32];
        snprintf(tag, sizeof(tag), "%llu%s",
                 (unsigned long long)(size >= GiB ? size / GiB : size / MiB),
                 size >= GiB ? "g" : "m");
        if (size + 2 * GiB > sc_mem_available() && size > 64 * MiB) {
            printf("ready_%s: not run: %llu MiB free here; projected at the fault-in rate "
                   "measured (%.2f GB/s): faulted in after %.0f s, serving after the same "
                   "time as the sizes above (it does not depend on the size)\n",
                   tag, (unsigned long long)(sc_mem_available() / MiB),
                   (best > 0 ? best : machine) / 1e9, (double)size / (best > 0 ? best : machine));
            continue;
        }
        double t0 = sc_now();
        if (sc_start(&d, size, NULL) || kvc_connect(d.sock, &c)) {
            bench_fail("ready: kvcd with host.size %s did not start", tag);
            daemon_cleanup(&d);
            continue;
        }
        double ready = sc_now() - t0;
        double full = sc_wait_faulted(c, t0, (double)size / 20e6 + 60);
        kvc_disconnect(c);
        daemon_stop(&d);
        daemon_cleanup(&d);
        if (full <= 0) {
            bench_fail("ready: the %s arena was not faulted in in time", tag);
            continue;
        }
        double rate = (double)size / full;
        best = rate > best ? rate : best;
        snprintf(name, sizeof(name), "ready_%s", tag);
        sc_row(name, ready, "s", "fault-in of the arena at the machine's rate",
               (double)size / machine);
        snprintf(name, sizeof(name), "ready_per_gib_%s", tag);
        sc_row(name, ready / ((double)size / GiB), "s/GiB", "machine fault time per GiB",
               (double)GiB / machine);
        snprintf(name, sizeof(name), "faultin_rate_%s", tag);
        sc_row(name, rate / 1e9, "GB/s", "machine fault rate", machine / 1e9);
        sc_ready_gpu(size, tag, ready, full);
    }
}

/* ---- levels --------------------------------------------------------------------------- */

/* Hit-ring entries the daemon has read so far (counted, refused or dropped past its rate). */
static uint64_t sc_fast_counted(kvc_client *c)
{
    return sc_stat(c, "fast_hits") + sc_stat(c, "fast_refused") + sc_stat(c, "fast_dropped");
}

struct sc_level {
    uint64_t n; /* blocks the arena holds */
    bool run;
    double v[24]; /* figures, by SC_F_* */
};

enum {
    SC_F_HIT1_FAST_P50,
    SC_F_HIT1_FAST_P99,
    SC_F_HIT64_FAST_P50,
    SC_F_HIT64_FAST_P99,
    SC_F_HIT1_SOCK_P50,
    SC_F_HIT1_SOCK_P99,
    SC_F_HIT64_SOCK_P50,
    SC_F_HIT64_SOCK_P99,
    SC_F_PUT1_P50,
    SC_F_PUT1_P99,
    SC_F_PUT64_P50,
    SC_F_PUT64_P99,
    SC_F_LOOP_US_PER_PUT_BLOCK,
    SC_F_LOOP_US_PER_HIT1_SOCK,
    SC_F_LOOP_US_PER_FAST_BLOCK,
    SC_F_LOOP_US_PER_HIT64_SOCK,
    SC_F_COPY1_P50,
    SC_F_COPY64_P50,
    SC_F_HIT1_FAST_COLD_P50,
    SC_F_HIT1_FAST_COLD_P99,
    SC_F_HIT64_FAST_COLD_P50,
    SC_F_HIT64_FAST_COLD_P99,
    SC_F_COPY64_WRITE_P50,
    SC_F_COUNT
};
_Static_assert(SC_F_COUNT <= sizeof(((struct sc_level *)0)->v) / sizeof(double),
               "sc_level holds every figure");
static const char *const sc_fname[SC_F_COUNT] = {"hit1_fast_p50",
                                                 "hit1_fast_p99",
                                                 "hit64_fast_p50",
                                                 "hit64_fast_p99",
                                                 "hit1_sock_p50",
                                                 "hit1_sock_p99",
                                                 "hit64_sock_p50",
                                                 "hit64_sock_p99",
                                                 "put1_p50",
                                                 "put1_p99",
                                                 "put64_p50",
                                                 "put64_p99",
                                                 "loop_us_per_block_put_evicted",
                                                 "loop_us_per_hit1_sock",
                                                 "loop_us_per_fast_block_counted",
                                                 "loop_us_per_hit64_sock",
                                                 "copy1_floor_p50",
                                                 "copy64_floor_p50",
                                                 "hit1_fast_cold_p50",
                                                 "hit1_fast_cold_p99",
                                                 "hit64_fast_cold_p50",
                                                 "hit64_fast_cold_p99",
                                                 "copy64_write_floor_p50"};

/* Blocks for one chain of 64, filled from their keys. */
struct sc_bufs {
    void *blk[SC_CHAIN];
    size_t bb;
};

static int sc_bufs_init(struct sc_bufs *b, size_t bb)
{
    b->bb = bb;
    for (int i = 0; i < SC_CHAIN; i++)
        if (!(b->blk[i] = malloc(bb)))
            return -ENOMEM;
    return 0;
}

static void sc_bufs_fini(struct sc_bufs *b)
{
    for (int i = 0; i < SC_CHAIN; i++)
        free(b->blk[i]);
}

/* Puts a chain of n fresh blocks (keys k); the time it took, or -1. */
static double sc_put(kvc_ns *ns, const struct kvc_key *k, uint32_t n, struct sc_bufs *b, bool fill)
{
    for (uint32_t i = 0; fill && i < n; i++)
        daemon_block_fill(&k[i], b->blk[i], b->bb);
    double t = sc_now();
    int rc = kvc_put_prefix(ns, NULL, k, n, (const void *const *)b->blk);
    t = sc_now() - t;
    if (rc < 0) {
        bench_fail("put of %u blocks: %s", n, kvc_strerror(rc));
        return -1;
    }
    return t;
}

/* One get of k[0..n) (fast: kvc_get_prefix; else lookup, lease copies, release) into b: the
 * time, or -1 when it did not hit them all (counted in *miss) or failed. */
static double sc_get(kvc_ns *ns, const struct kvc_key *k, uint32_t n, struct sc_bufs *b, bool fast,
                     bool check, uint64_t *miss)
{
    double t = sc_now();
    int h;
    if (fast) {
        h = kvc_get_prefix(ns, k, n, b->blk);
    } else {
        kvc_lease *l = NULL;
        h = kvc_lookup(ns, k, n, 0, &l);
        for (int i = 0; i < h; i++)
            if (kvc_lease_copy(l, (size_t)i, b->blk[i], b->bb) < 0)
                h = -EIO;
        if (l)
            kvc_release(l);
    }
    t = sc_now() - t;
    if (h < 0) {
        bench_fail("get of %u blocks: %s", n, kvc_strerror(h));
        return -1;
    }
    if ((uint32_t)h < n) {
        (*miss)++;
        return -1;
    }
    for (uint32_t i = 0; check && i < n; i++)
        if (daemon_block_check(&k[i], b->blk[i], b->bb) >= 0)
            bench_fail("get: wrong bytes in block %u", i);
    return t;
}

/* The machine's floor for a hit at this level: memcpy of one block, and of 64 blocks each
 * at its own place, from random places in memory as large as the arena (1 GiB at most:
 * past any cache either way), into the same buffers; and for a put, of the 64 blocks into
 * random places; p50 in us into v[SC_F_COPY*]. A hit or put that grows with the level as
 * this does grows with the memory, not the daemon. */
static void sc_floor(uint64_t arena, struct sc_bufs *b, size_t nsamp, size_t nsamp64, double *lat,
                     double *v)
{
    size_t len = arena < GiB ? (size_t)arena : (size_t)GiB, nb = len / b->bb, m = 0;
    uint8_t *p =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED || nb == 0)
        return;
    memset(p, 0x5a, len);
    for (size_t i = 0; i < nsamp; i++) {
        double t = sc_now();
        memcpy(b->blk[0], p + (sc_rand() % nb) * b->bb, b->bb);
        lat[m++] = (sc_now() - t) * 1e6;
    }
    v[SC_F_COPY1_P50] = sc_pct(lat, m, 0.5);
    m = 0;
    for (size_t i = 0; i < nsamp64; i++) {
        double t = sc_now();
        for (int j = 0; j < SC_CHAIN; j++)
            memcpy(b->blk[j], p + (sc_rand() % nb) * b->bb, b->bb);
        lat[m++] = (sc_now() - t) * 1e6;
    }
    v[SC_F_COPY64_P50] = sc_pct(lat, m, 0.5);
    /* A put's floor: the same 64 blocks copied into random places (a put's client writes its
     * blocks into slots eviction just freed, out of the caches at a large level). */
    m = 0;
    for (size_t i = 0; i < nsamp64; i++) {
        double t = sc_now();
        for (int j = 0; j < SC_CHAIN; j++)
            memcpy(p + (sc_rand() % nb) * b->bb, b->blk[j], b->bb);
        lat[m++] = (sc_now() - t) * 1e6;
    }
    v[SC_F_COPY64_WRITE_P50] = sc_pct(lat, m, 0.5);
    munmap(p, len);
}

/* Takes the bytes of k[0..n) out of this CPU's caches (every level): found through the socket
 * client (a lease, released at once), each block's lines flushed. A fast hit timed after it
 * copies from memory at every level, as a hit on a block no process touched lately does, so
 * that level against level is kvcd's own cost (its index, the generations, the ring) and not
 * a small arena's blocks left in cache by the previous sample. 0, or -1 (not all found). */
static int sc_uncache(kvc_ns *nss, const struct kvc_key *k, uint32_t n, size_t bb)
{
    kvc_lease *l = NULL;
    int h = kvc_lookup(nss, k, n, 0, &l);
    for (int i = 0; i < h; i++) {
        const uint8_t *p = kvc_lease_data(l, (size_t)i);
#if defined(__x86_64__)
        for (size_t o = 0; p && o < bb; o += 64)
            __builtin_ia32_clflush(p + o);
#else
        (void)p; /* no flush here: these rows are the warm ones */
        (void)bb;
#endif
    }
#if defined(__x86_64__)
    __builtin_ia32_mfence();
#endif
    if (l)
        kvc_release(l);
    return h == (int)n ? 0 : -1;
}

/* One level: an arena holding about lv->n blocks of bb bytes, filled past full, measured. */
static void sc_level(size_t bb, struct sc_level *lv, uint64_t tag)
{
    const bool smoke = bench_smoke();
    uint64_t arena = (uint64_t)((double)lv->n * (double)bb / 0.985);
    arena = (arena + 2 * MiB - 1) & ~(2 * MiB - 1);
    if (arena < 16 * MiB)
        arena = 16 * MiB;
    uint64_t nchains = (uint64_t)((double)lv->n * 1.1) / SC_CHAIN + 2;
    struct kvc_layout lay = daemon_layout("bench-scale", (uint32_t)(bb / 1024));
    struct daemon d;
    kvc_client *c = NULL, *cs = NULL;
    kvc_ns *ns = NULL, *nss = NULL;
    struct sc_bufs b = {0};
    struct kvc_key *keys = calloc(nchains * SC_CHAIN, sizeof(*keys));
    const size_t nsamp = smoke ? 64 : 3000, nsamp64 = smoke ? 16 : 400;
    uint64_t *hot = calloc(4 * nsamp64, sizeof(*hot)), nhot = 0, miss = 0;
    double *lat = calloc(nsamp, sizeof(*lat));
    if (!keys || !hot || !lat || sc_bufs_init(&b, bb)) {
        bench_fail("levels: no memory");
        goto out;
    }
    for (uint64_t i = 0; i < nchains * SC_CHAIN; i++)
        keys[i] = sc_key(tag, i);
    if (sc_start(&d, arena, NULL) || kvc_connect(d.sock, &c)) {
        bench_fail("levels: kvcd (host.size %llu MiB) did not start",
                   (unsigned long long)(arena / MiB));
        goto out;
    }
    if (sc_wait_faulted(c, sc_now(), (double)arena / 20e6 + 60) < 0) {
        bench_fail("levels: arena not faulted in");
        goto out;
    }
    /* The shared index counts as the blocks' memory whether it is resident at once (huge
     * pages) or as entries land: the baseline leaves it out, and is taken before the
     * namespace grows it. */
    uint64_t rss0 = sc_rss(d.pid) - sc_index_rss(d.pid);
    if (kvc_ns_open(c, &lay, &ns)) {
        bench_fail("levels: namespace");
        goto out;
    }
    setenv("KVC_NO_FASTPATH", "1", 1);
    int rc = kvc_connect(d.sock, &cs);
    unsetenv("KVC_NO_FASTPATH");
    if (rc || kvc_ns_open(cs, &lay, &nss) || kvc_ns_block_bytes(ns) != bb) {
        bench_fail("levels: second client");
        goto out;
    }
    /* Fill past full: the oldest chains go. */
    for (uint64_t ch = 0; ch < nchains && !bench_failed(); ch++)
        sc_put(ns, keys + ch * SC_CHAIN, SC_CHAIN, &b, true);
    kvc_flush(c);
    uint64_t blocks = sc_stat(c, "blocks_now"), evicted = sc_stat(c, "evicted_blocks");
    /* Cached chains: sampled from the newest (the policy may have taken a few), each
     * confirmed whole through the socket. */
    for (uint64_t tries = 0; tries < 4 * nsamp64 + 64 && nhot < 4 * nsamp64; tries++) {
        uint64_t span = blocks / SC_CHAIN * 9 / 10 + 1, ch = nchains - 1 - sc_rand() % span;
        kvc_lease *l = NULL;
        int h = kvc_lookup(nss, keys + ch * SC_CHAIN, SC_CHAIN, 0, &l);
        if (l)
            kvc_release(l);
        if (h == SC_CHAIN)
            hot[nhot++] = ch;
    }
    if (nhot < 4) {
        bench_fail("levels: no whole chain cached (%llu blocks)", (unsigned long long)blocks);
        goto out;
    }
    /* Gets: one block anywhere in a cached chain, and whole chains; fast path and socket. */
    uint64_t fast0 = sc_fast_counted(c), fast_blocks = 0;
    double fcpu0 = sc_loop_cpu(d.pid);
    for (int fast = 1; fast >= 0; fast--) {
        size_t m = 0;
        if (!fast) {
            /* The fast hits' ring entries, counted by the loop in bounded passes, all read
             * before the socket's gets are timed (else those pay for them): the loop's CPU
             * from the first fast get to here is what counting a fast hit costs it. */
            double t0 = sc_now();
            while (sc_fast_counted(c) < fast0 + fast_blocks && sc_now() - t0 < 10)
                usleep(2000);
            lv->v[SC_F_LOOP_US_PER_FAST_BLOCK] =
                fast_blocks ? (sc_loop_cpu(d.pid) - fcpu0) * 1e6 / (double)fast_blocks : 0;
        }
        /* The loop thread's CPU over the socket's one-block gets (lookup and release): the
         * daemon's own cost per hit, apart from the wake-ups a latency also counts. */
        double hcpu0 = sc_loop_cpu(d.pid);
        for (size_t i = 0; i < nsamp; i++) {
            uint64_t ch = hot[sc_rand() % nhot], pos = sc_rand() % SC_CHAIN;
            double t =
                sc_get(fast ? ns : nss, keys + ch * SC_CHAIN + pos, 1, &b, fast, i < 16, &miss);
            if (t >= 0)
                lat[m++] = t * 1e6;
        }
        fast_blocks += fast ? m : 0;
        if (!fast && m)
            lv->v[SC_F_LOOP_US_PER_HIT1_SOCK] = (sc_loop_cpu(d.pid) - hcpu0) * 1e6 / (double)m;
        lv->v[fast ? SC_F_HIT1_FAST_P50 : SC_F_HIT1_SOCK_P50] = sc_pct(lat, m, 0.5);
        lv->v[fast ? SC_F_HIT1_FAST_P99 : SC_F_HIT1_SOCK_P99] = sc_pct(lat, m, 0.99);
        m = 0;
        hcpu0 = sc_loop_cpu(d.pid); /* the same for whole chains: 64 keys a lookup */
        for (size_t i = 0; i < nsamp64; i++) {
            uint64_t ch = hot[sc_rand() % nhot];
            double t =
                sc_get(fast ? ns : nss, keys + ch * SC_CHAIN, SC_CHAIN, &b, fast, i < 2, &miss);
            if (t >= 0)
                lat[m++] = t * 1e6;
        }
        fast_blocks += fast ? m * SC_CHAIN : 0;
        if (!fast && m)
            lv->v[SC_F_LOOP_US_PER_HIT64_SOCK] = (sc_loop_cpu(d.pid) - hcpu0) * 1e6 / (double)m;
        lv->v[fast ? SC_F_HIT64_FAST_P50 : SC_F_HIT64_SOCK_P50] = sc_pct(lat, m, 0.5);
        lv->v[fast ? SC_F_HIT64_FAST_P99 : SC_F_HIT64_SOCK_P99] = sc_pct(lat, m, 0.99);
    }
    /* The fast path again, each sample's blocks out of the caches first (sc_uncache). */
    for (int chain = 0; chain < 2; chain++) {
        const size_t ns_cold = chain ? nsamp64 / 2 : nsamp / 3;
        const uint32_t kn = chain ? SC_CHAIN : 1;
        size_t m = 0;
        for (size_t i = 0; i < ns_cold; i++) {
            uint64_t ch = hot[sc_rand() % nhot], pos = chain ? 0 : sc_rand() % SC_CHAIN;
            const struct kvc_key *k = keys + ch * SC_CHAIN + pos;
            if (sc_uncache(nss, k, kn, bb) < 0) {
                miss++;
                continue;
            }
            double t = sc_get(ns, k, kn, &b, true, false, &miss);
            if (t >= 0)
                lat[m++] = t * 1e6;
        }
        lv->v[chain ? SC_F_HIT64_FAST_COLD_P50 : SC_F_HIT1_FAST_COLD_P50] = sc_pct(lat, m, 0.5);
        lv->v[chain ? SC_F_HIT64_FAST_COLD_P99 : SC_F_HIT1_FAST_COLD_P99] = sc_pct(lat, m, 0.99);
    }
    sc_floor(arena, &b, nsamp, nsamp64, lat, lv->v);
    /* Puts of fresh keys into the full arena: each evicts as much (after its reply). */
    uint64_t put0 = sc_stat(c, "committed_blocks"), ev0 = sc_stat(c, "evicted_blocks");
    double cpu0 = sc_loop_cpu(d.pid);
    size_t m = 0;
    for (size_t i = 0; i < nsamp; i++) {
        struct kvc_key k = sc_key(tag ^ 0x5a5a, i);
        daemon_block_fill(&k, b.blk[0], bb);
        double t = sc_put(ns, &k, 1, &b, false);
        if (t >= 0)
            lat[m++] = t * 1e6;
    }
    lv->v[SC_F_PUT1_P50] = sc_pct(lat, m, 0.5);
    lv->v[SC_F_PUT1_P99] = sc_pct(lat, m, 0.99);
    m = 0;
    for (size_t i = 0; i < nsamp64; i++) {
        struct kvc_key k[SC_CHAIN];
        for (int j = 0; j < SC_CHAIN; j++)
            k[j] = sc_key(tag ^ 0xa5a5, i * SC_CHAIN + (uint64_t)j);
        double t = sc_put(ns, k, SC_CHAIN, &b, false);
        if (t >= 0)
            lat[m++] = t * 1e6;
    }
    lv->v[SC_F_PUT64_P50] = sc_pct(lat, m, 0.5);
    lv->v[SC_F_PUT64_P99] = sc_pct(lat, m, 0.99);
    kvc_flush(c);
    usleep(200000); /* the trims after the last commits */
    uint64_t put1 = sc_stat(c, "committed_blocks"), ev1 = sc_stat(c, "evicted_blocks");
    double cpu1 = sc_loop_cpu(d.pid);
    lv->v[SC_F_LOOP_US_PER_PUT_BLOCK] =
        put1 > put0 ? (cpu1 - cpu0) * 1e6 / (double)(put1 - put0) : 0;
    static const char *const cov[] = {"blocks_now", "fast_index_blocks", "fast_index_full"};
    uint64_t cv[3];
    sc_stats(c, cov, cv, 3);
    blocks = cv[0];
    uint64_t pub = cv[1], full = cv[2];
    uint64_t rss1 = sc_rss(d.pid);
    sc_smaps(d.pid);
    char name[96], base[96];
    snprintf(name, sizeof(name), "fast_coverage_%zuk_%llu", bb / 1024, (unsigned long long)lv->n);
    sc_row(name, blocks ? (double)pub / (double)blocks : 0, "share", "target", 0.99);
    snprintf(name, sizeof(name), "fast_index_full_%zuk_%llu", bb / 1024, (unsigned long long)lv->n);
    sc_row(name, (double)full, "blocks", NULL, 0);
    snprintf(name, sizeof(name), "mem_per_block_%zuk_%llu", bb / 1024, (unsigned long long)lv->n);
    snprintf(base, sizeof(base), "target");
    sc_row(name, blocks && rss1 > rss0 ? (double)(rss1 - rss0) / (double)blocks : 0, "B", base,
           128);
    printf("level %zuk %llu: arena %llu MiB, %llu blocks cached, %llu evicted while filling, "
           "%llu while putting, %llu gets missed (of %zu); RSS %llu -> %llu MiB\n",
           bb / 1024, (unsigned long long)lv->n, (unsigned long long)(arena / MiB),
           (unsigned long long)blocks, (unsigned long long)evicted, (unsigned long long)(ev1 - ev0),
           (unsigned long long)miss, 2 * (nsamp + nsamp64), (unsigned long long)(rss0 / MiB),
           (unsigned long long)(rss1 / MiB));
    if (miss > (nsamp + nsamp64) / 10)
        bench_fail("levels: %llu gets of cached chains missed", (unsigned long long)miss);
    lv->run = !bench_failed();
out:
    kvc_disconnect(cs);
    kvc_disconnect(c);
    if (d.pid)
        daemon_stop(&d);
    daemon_cleanup(&d);
    sc_bufs_fini(&b);
    free(keys);
    free(hot);
    free(lat);
}

static void sc_levels(size_t bb, const uint64_t *ns, int nlev)
{
    struct sc_level lv[8] = {{0}};
    uint64_t cap = getenv("KVC_SCALE_MAX_BLOCKS") ? strtoull(getenv("KVC_SCALE_MAX_BLOCKS"), 0, 10)
                                                  : UINT64_MAX;
    const char *only = getenv("KVC_SCALE_BLOCK"); /* 4 or 64: that block size alone */
    int first = -1;
    if (only && strtoull(only, NULL, 10) * 1024 != bb)
        return;
    for (int i = 0; i < nlev; i++) {
        lv[i].n = ns[i];
        uint64_t need = ns[i] * (bb + 512) + GiB;
        if (getenv("KVC_SCALE_MIN_BLOCKS") &&
            ns[i] < strtoull(getenv("KVC_SCALE_MIN_BLOCKS"), NULL, 10))
            continue;
        if (ns[i] > cap || need * 3 / 2 > sc_mem_available()) {
            printf("level %zuk %llu: not run (%llu MiB free here, about %llu MiB needed)\n",
                   bb / 1024, (unsigned long long)ns[i],
                   (unsigned long long)(sc_mem_available() / MiB),
                   (unsigned long long)(need / MiB));
            continue;
        }
        sc_level(bb, &lv[i], 0x1000 + i + bb);
        if (!lv[i].run)
            continue;
        if (first < 0)
            first = i;
        for (int f = 0; f < SC_F_COUNT; f++) {
            char name[96], base[96];
            snprintf(name, sizeof(name), "%s_%zuk_%llu", sc_fname[f], bb / 1024,
                     (unsigned long long)lv[i].n);
            snprintf(base, sizeof(base), "%s_%zuk_%llu", sc_fname[f], bb / 1024,
                     (unsigned long long)lv[first].n);
            sc_row(name, lv[i].v[f], "us", base, lv[first].v[f] > 0 ? lv[first].v[f] : 1e-9);
        }
    }
}

/* ---- clients -------------------------------------------------------------------------- */

enum { SC_OP_GET1, SC_OP_GET64, SC_OP_GET1_SOCK, SC_OP_PUT1, SC_OP_PUT64, SC_OPS };
static const char *const sc_opname[SC_OPS] = {"get1_fast", "get64_fast", "get1_sock", "put1",
                                              "put64"};

#define SC_PROCS_MAX 16
struct sc_shared {
    _Atomic int phase; /* the op running (+1), 0 none; -1: leave */
    _Atomic int ready; /* children connected / done with the phase */
    double deadline;   /* CLOCK_MONOTONIC seconds the phase ends */
    _Atomic uint64_t ops[SC_PROCS_MAX];
    _Atomic uint64_t errors;
};

#define SC_HOT_CHAINS 64

static int sc_child(struct sc_shared *sh, const char *sock, int proc, int nconn)
{
    struct kvc_layout lay = daemon_layout("bench-scale-clients", 4);
    kvc_client **c = calloc((size_t)nconn, sizeof(*c));
    kvc_ns **ns = calloc((size_t)nconn, sizeof(*ns));
    struct sc_bufs b = {0};
    uint64_t seq = 0;
    int seen = 0;
    if (!c || !ns || sc_bufs_init(&b, 4096))
        return 1;
    for (int i = 0; i < nconn; i++)
        if (kvc_connect(sock, &c[i]) || kvc_ns_open(c[i], &lay, &ns[i])) {
            atomic_fetch_add(&sh->errors, 1);
            return 1;
        }
    for (int i = 0; i < SC_CHAIN; i++)
        memset(b.blk[i], proc + i, 4096);
    sc_rng ^= sc_mix((uint64_t)getpid());
    atomic_fetch_add(&sh->ready, 1);
    for (;;) {
        int ph = atomic_load(&sh->phase);
        if (ph < 0)
            break;
        if (ph == seen || ph == 0) {
            usleep(200);
            continue;
        }
        seen = ph;
        int op = (ph - 1) % SC_OPS;
        uint64_t n = 0;
        while (sc_now() < sh->deadline) {
            for (int i = 0; i < nconn && sc_now() < sh->deadline; i++) {
                uint64_t ch = sc_rand() % SC_HOT_CHAINS, miss = 0;
                struct kvc_key k[SC_CHAIN];
                int rc = 0;
                switch (op) {
                case SC_OP_GET1:
                case SC_OP_GET1_SOCK:
                    k[0] = sc_key(7, ch * SC_CHAIN + sc_rand() % SC_CHAIN);
                    rc = sc_get(ns[i], k, 1, &b, op == SC_OP_GET1, false, &miss) < 0 ? -1 : 0;
                    break;
                case SC_OP_GET64:
                    for (int j = 0; j < SC_CHAIN; j++)
                        k[j] = sc_key(7, ch * SC_CHAIN + (uint64_t)j);
                    rc = sc_get(ns[i], k, SC_CHAIN, &b, true, false, &miss) < 0 ? -1 : 0;
                    break;
                default: {
                    uint32_t len = op == SC_OP_PUT1 ? 1 : SC_CHAIN;
                    for (uint32_t j = 0; j < len; j++)
                        k[j] = sc_key(((uint64_t)proc << 40) | ((uint64_t)i << 20) | 9, seq++);
                    rc = kvc_put_prefix(ns[i], NULL, k, len, (const void *const *)b.blk) < 0 ? -1
                                                                                             : 0;
                }
                }
                if (rc)
                    atomic_fetch_add(&sh->errors, 1);
                else
                    n++;
            }
        }
        for (int i = 0; i < nconn; i++)
            kvc_flush(c[i]);
        atomic_store(&sh->ops[proc], n);
        atomic_fetch_add(&sh->ready, 1);
    }
    for (int i = 0; i < nconn; i++)
        kvc_disconnect(c[i]);
    sc_bufs_fini(&b);
    free(c);
    free(ns);
    return 0;
}

/* The chains the gets read, put again (those the puts evicted come back). */
static void sc_hot_fill(kvc_client *c, kvc_ns *ns, struct sc_bufs *b)
{
    for (uint64_t ch = 0; ch < SC_HOT_CHAINS; ch++) {
        struct kvc_key k[SC_CHAIN];
        for (int j = 0; j < SC_CHAIN; j++)
            k[j] = sc_key(7, ch * SC_CHAIN + (uint64_t)j);
        sc_put(ns, k, SC_CHAIN, b, true);
    }
    kvc_flush(c);
}

/* Throughput of each client count and op with server.io_threads = 0, the threaded pass's
 * baseline. */
static double sc_thr0[4][SC_OPS];

/* iot: server.io_threads of the daemon; rows of iot > 0 end in _io<iot> and compare with the
 * same row at 0 of this run. */
/* KVC_SCALE_CLIENTS: at most 4 connection counts, comma-separated, rising, at most 1024
 * (the first must be 1: every row's baseline; 1,2 on a 2-CPU host shows whether two
 * clients get twice one's throughput); KVC_SCALE_SECS: seconds a phase (0.1 to 10). For a
 * short run on a host lent for minutes (etc/device-check.sh). true when the counts were
 * given; a malformed value fails the run. */
static bool sc_clients_env(int counts[4], int *ncounts, double *secs)
{
    const char *cs = getenv("KVC_SCALE_CLIENTS"), *ss = getenv("KVC_SCALE_SECS");
    if (ss) {
        char *end;
        double v = strtod(ss, &end);
        if (*end || !(v >= 0.1 && v <= 10))
            bench_fail("KVC_SCALE_SECS=%s: not 0.1 to 10", ss);
        else
            *secs = v;
    }
    if (!cs)
        return false;
    int n = 0, last = 0;
    for (const char *p = cs; *p && !bench_failed();) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || n == 4 || v <= last || v > 1024 || (n == 0 && v != 1) ||
            (*end && *end != ','))
            bench_fail("KVC_SCALE_CLIENTS=%s: want 1 then up to 3 more, rising, to 1024", cs);
        else
            counts[n++] = last = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!bench_failed() && n == 0)
        bench_fail("KVC_SCALE_CLIENTS is empty");
    *ncounts = n;
    return !bench_failed();
}

static void sc_clients(int iot)
{
    char o_io[48], o_min[64], sfx[16] = "";
    const char *min_active = getenv("KVC_SCALE_IO_MIN_ACTIVE");
    const char *extra[] = {"-o", o_io, min_active ? "-o" : NULL, o_min, NULL};
    const bool smoke = bench_smoke();
    const int counts_full[] = {1, 16, 128, 1024}, counts_smoke[] = {1, 4};
    int counts_env[4];
    const int *counts = smoke ? counts_smoke : counts_full;
    int ncounts = smoke ? 2 : 4;
    double secs = smoke ? 0.3 : 2.0;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    struct kvc_layout lay = daemon_layout("bench-scale-clients", 4);
    struct daemon d;
    kvc_client *c = NULL;
    kvc_ns *ns = NULL;
    struct sc_bufs b = {0};
    double base[SC_OPS] = {0};
    struct sc_shared *sh =
        mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED || sc_bufs_init(&b, 4096)) {
        bench_fail("clients: no memory");
        return;
    }
    if (sc_clients_env(counts_env, &ncounts, &secs))
        counts = counts_env;
    snprintf(o_io, sizeof(o_io), "server.io_threads=%d", iot);
    snprintf(o_min, sizeof(o_min), "server.io_threads_min_active=%d",
             min_active ? atoi(min_active) : 0);
    if (iot)
        snprintf(sfx, sizeof(sfx), "_io%d", iot);
    if (sc_start(&d, 64 * MiB, extra) || kvc_connect(d.sock, &c) || kvc_ns_open(c, &lay, &ns)) {
        bench_fail("clients: kvcd did not start");
        goto out;
    }
    sc_wait_faulted(c, sc_now(), 60);
    for (int ci = 0; ci < ncounts && !bench_failed(); ci++) {
        int n = counts[ci], procs = n < SC_PROCS_MAX ? n : SC_PROCS_MAX;
        pid_t pids[SC_PROCS_MAX];
        memset(sh, 0, sizeof(*sh));
        for (int p = 0; p < procs; p++) {
            int nconn = n / procs + (p < n % procs);
            pids[p] = daemon_fork();
            if (pids[p] == 0)
                _exit(sc_child(sh, d.sock, p, nconn));
        }
        double t0 = sc_now();
        while (atomic_load(&sh->ready) < procs && sc_now() - t0 < 120 && !atomic_load(&sh->errors))
            usleep(1000);
        if (atomic_load(&sh->ready) < procs) {
            bench_fail("clients: %d connections not made", n);
            atomic_store(&sh->phase, -1);
        }
        for (int op = 0; op < SC_OPS && atomic_load(&sh->phase) >= 0; op++) {
            if (op == SC_OP_GET1)
                sc_hot_fill(c, ns, &b);
            uint64_t req0 = sc_stat(c, "requests"), fh0 = sc_stat(c, "fast_hits"),
                     fd0 = sc_stat(c, "fast_dropped");
            double cpu0 = sc_loop_cpu(d.pid), io0 = sc_io_cpu(d.pid);
            atomic_store(&sh->ready, 0);
            sh->deadline = sc_now() + secs;
            atomic_store(&sh->phase, op + 1);
            while (atomic_load(&sh->ready) < procs && sc_now() < sh->deadline + 60)
                usleep(1000);
            uint64_t total = 0;
            for (int p = 0; p < procs; p++)
                total += atomic_load(&sh->ops[p]);
            double thr = (double)total / secs, cpu = sc_loop_cpu(d.pid) - cpu0;
            double iocpu = sc_io_cpu(d.pid) - io0;
            uint64_t req = sc_stat(c, "requests") - req0;
            uint64_t fh = sc_stat(c, "fast_hits") - fh0, fd = sc_stat(c, "fast_dropped") - fd0;
            int cores = n < ncpu ? n : (int)ncpu;
            char name[96], bname[96];
            if (n == 1)
                base[op] = thr;
            snprintf(name, sizeof(name), "clients_%d_%s%s", n, sc_opname[op], sfx);
            if (iot) { /* against the same clients on a daemon without I/O threads */
                snprintf(bname, sizeof(bname), "clients_%d_%s", n, sc_opname[op]);
                sc_row(name, thr, "ops/s", bname, sc_thr0[ci][op] > 0 ? sc_thr0[ci][op] : 1e-9);
            } else {
                sc_thr0[ci][op] = thr;
                snprintf(bname, sizeof(bname), "clients_1_%s x %d cores", sc_opname[op], cores);
                sc_row(name, thr, "ops/s", bname, base[op] > 0 ? base[op] * cores : 1e-9);
            }
            printf("  %s: loop thread busy %.0f%% of the phase, %.2f us of its CPU per request "
                   "(%llu requests: one loop saturates near %.0f requests/s)",
                   name, 100.0 * cpu / secs, req ? cpu * 1e6 / (double)req : 0,
                   (unsigned long long)req, req && cpu > 0 ? (double)req / cpu : 0);
            if (iot)
                printf("; I/O threads %.2f us per request", req ? iocpu * 1e6 / (double)req : 0);
            printf("\n");
            if ((op == SC_OP_GET1 || op == SC_OP_GET64) && fh + fd) {
                /* The hits the daemon counted of those it read or skipped by the phase's end:
                 * below 1 where the rings' rate or the passes' share made it sample them. */
                snprintf(name, sizeof(name), "fast_counted_share_%s_clients_%d%s", sc_opname[op], n,
                         sfx);
                sc_row(name, (double)fh / (double)(fh + fd), "share", NULL, 0);
            }
            if (op == SC_OP_GET1_SOCK || op == SC_OP_PUT1) {
                snprintf(name, sizeof(name), "loop_us_per_request_%s_clients_%d%s", sc_opname[op],
                         n, sfx);
                sc_row(name, req ? cpu * 1e6 / (double)req : 0, "us", NULL, 0);
                if (iot) {
                    snprintf(name, sizeof(name), "io_us_per_request_%s_clients_%d%s", sc_opname[op],
                             n, sfx);
                    sc_row(name, req ? iocpu * 1e6 / (double)req : 0, "us", NULL, 0);
                }
            }
        }
        atomic_store(&sh->phase, -1);
        for (int p = 0; p < procs; p++)
            if (daemon_child_wait(pids[p], daemon_ms(120000), NULL) != 0)
                bench_fail("clients: a client process failed");
        if (atomic_load(&sh->errors))
            bench_fail("clients: %llu requests failed with %d clients",
                       (unsigned long long)atomic_load(&sh->errors), n);
    }
out:
    kvc_disconnect(c);
    if (d.pid)
        daemon_stop(&d);
    daemon_cleanup(&d);
    sc_bufs_fini(&b);
    munmap(sh, sizeof(*sh));
}

int main(int argc, char **argv)
{
    const char *only = getenv("KVC_SCALE_ONLY");
    const uint64_t lev4[] = {4096, 10000, 100000, 1000000}, lev64[] = {1000, 10000, 100000};
    const uint64_t lev4s[] = {4096}, lev64s[] = {1000};
    char cpu[128] = "?", line[256];
    if (argc < 2) {
        fprintf(stderr, "usage: bench_scale OUT.json\n");
        return 2;
    }
    FILE *f = fopen("/proc/cpuinfo", "re");
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "model name : %127[^\n]", cpu) == 1)
            break;
    if (f)
        fclose(f);
    /* The host's choice for shared memory: the arena and the shared index are on huge pages
     * (both ask for them) only where it is advise, within_size or always. */
    char thp[128] = "?";
    f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");
    if (f && fgets(thp, sizeof(thp), f))
        thp[strcspn(thp, "\n")] = 0;
    if (f)
        fclose(f);
    printf("bench_scale: %s, %ld CPUs, %llu MiB free, shmem THP: %s\n", cpu,
           sysconf(_SC_NPROCESSORS_ONLN), (unsigned long long)(sc_mem_available() / MiB), thp);
    signal(SIGPIPE, SIG_IGN);
    if (daemon_suite_init("bench-scale"))
        return 1;
    if (!only || strcmp(only, "ready") == 0)
        sc_ready();
    if (!only || strcmp(only, "levels") == 0) {
        sc_levels(4096, bench_smoke() ? lev4s : lev4, bench_smoke() ? 1 : 4);
        sc_levels(65536, bench_smoke() ? lev64s : lev64, bench_smoke() ? 1 : 3);
    }
    if (!only || strcmp(only, "clients") == 0) {
        /* I/O thread counts, comma-separated, each against the loop alone */
        const char *iot = getenv("KVC_SCALE_IO_THREADS");
        sc_clients(0);
        for (const char *t = iot ? iot : "2"; !bench_failed() && *t;) {
            char *end;
            long v = strtol(t, &end, 10);
            if (end == t || v < 0 || v > 64 || (*end && *end != ',')) {
                bench_fail("clients: KVC_SCALE_IO_THREADS '%s': counts 0 to 64, comma-separated",
                           iot);
                break;
            }
            if (v > 0)
                sc_clients((int)v);
            t = *end ? end + 1 : end;
        }
    }
    daemon_suite_fini();
    return bench_finish(argv[1], rows, nrows);
}
