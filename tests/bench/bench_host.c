/*
 * bench_host.c — host-tier put and get bandwidth through libkvc against memcpy.
 *
 * DESIGN
 * The benchmark starts the real kvcd (built beside it) on a private socket in a fresh
 * temporary directory and measures through the public API, as an engine would:
 *  - put: kvc_reserve of a chain of fresh keys, memcpy of each block into its slot,
 *    kvc_commit; and the same bytes through kvc_put_prefix;
 *  - get: kvc_get_prefix of a cached chain into the caller's buffers (hits copied through
 *    the arena's shared index, no round trip: client/kvc_fast.h);
 *  - get_lease: the socket path, kvc_lookup, kvc_lease_copy of every hit, kvc_release;
 * for blocks of 256 KiB, 2 MiB and 16 MiB (three namespaces whose layouts give exactly
 * those sizes), with 1 and 2 client processes started together at a process-shared
 * barrier, each with its own connection, keys and buffers.
 * One operation covers BENCH_OP_BYTES of blocks (a prompt prefix chunk), so a 256 KiB
 * case is 64 blocks per round trip and a 16 MiB case one.
 * The baseline is memcpy in the same run: the same number of processes each copying,
 * block by block, between two pre-faulted buffers of its own with the same footprint as
 * its kvcd case (the caller buffer plus the arena blocks it touches). kvc_put_prefix copies
 * blocks of 32 KiB and more with non-temporal stores (client/libkvc_copy.c), which glibc's
 * memcpy does not use at these sizes: its put_prefix rows are also printed against that
 * same streaming copy between the same two buffers (stream copy), the tighter limit. Each process's
 * working set (BENCH_WS_BYTES of blocks plus the same again of caller buffer) is well above
 * the last-level cache this machine reports, so both sides run from DRAM.
 * Every figure is the best of BENCH_REPS timed repetitions after one untimed warm-up (the
 * machine is shared, and interference only ever slows a repetition down); the median is
 * printed beside it. A repetition's time runs from the first process's start to the last
 * one's end. Page faults taken inside timed operations are counted and printed: there
 * should be none, since the arena and the caller buffers are pre-faulted.
 * Engines' buffers are rarely page-aligned (malloc returns memory 16 bytes past a page):
 * get_off16 and get_off64 get the same chains into caller buffers 16 and 64 bytes past a
 * page, against aligned memcpy (the target: a hit at memcpy speed whatever the alignment)
 * and, printed beside, memcpy into the same misaligned addresses.
 * Page sizes: the arena's pages (hugetlb, transparent huge or 4 KiB) are read from this
 * process's /proc/self/smaps, the memcpy and caller buffers are asked for the same kind, and
 * both are printed: a ratio between different page sizes says "pages differ".
 * Bytes are checked outside the timings: every get's buffer is compared with the source
 * the blocks were put from. Two more cases: lookup_hit_1block, a whole hit of a one-block
 * prefix of 4 KiB through the shared index, as kvc_get_prefix makes it (kvci_fast_get: the
 * index lookup and generation checks, the copy, the two clock reads, the client mutex and
 * the hit ring's entry, with the ring's drain requests as they come), against a
 * LOOKUP+RELEASE round trip in the same run, with the lookup alone (kvci_fast_resolve)
 * printed beside; and get_256KiB_x2_while_evicting, two processes getting their cached
 * chains while a third puts fresh ones as fast as it can, so the daemon evicts all along
 * (the two readers' memcpy is the baseline); and the prefix case (bench_prefix_run: lookup and
 * release of 1, 255 and 1023 keys, under the default policy and LRU, and a load's model).
 * Exit status: 0 with figures (a missed target is
 * reported, not failed), 1 when something broke (no daemon, an API error, a short hit, a mismatch, a row
 * the table refuses). KVC_BENCH_SMOKE=1: a 256 MiB arena, 32 MiB per process, 2 repetitions.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc.h"
#include "client/libkvc_internal.h"
#include "tests/lib/bench.h"
#include "tests/lib/daemon.h"

#define BENCH_ARENA (bench_smoke() ? "256m" : "2g")
#define BENCH_WS_BYTES (bench_smoke() ? 32ull << 20 : 256ull << 20) /* blocks per process, case */
#define BENCH_OP_BYTES (16ull << 20)  /* block bytes per round trip */
#define BENCH_WS_MAX_OPS 16 /* round trips of a working set: 256 MiB / 16 MiB */
#define BENCH_REPS_MAX 11
#define BENCH_REPS (bench_smoke() ? 2 : BENCH_REPS_MAX)
#define BENCH_MAX_PROCS 3 /* 2 for the put and get cases; 3 while evicting */
#define BENCH_RTT_OPS (bench_smoke() ? 1000 : 20000)
#define BENCH_RTT_REPS 5
#define BENCH_PFX_SIZES 3                               /* 1, 255 and 1023 keys */
#define BENCH_PFX_KEYS 1023                             /* the longest prefix */
#define BENCH_PFX_WORK (bench_smoke() ? 20000 : 400000) /* keys per repetition and size */
/* The gap of the load model: an H200's device-to-device copy of one 2 MiB block, 0.28 ms for
 * 255 of them (docs/performance.md, the prefill rows). */
#define BENCH_PFX_GAP_US 1.1

enum bench_step {
    BENCH_STEP_MEMCPY_PUT, /* memcpy baseline interleaved with the put repetitions */
    BENCH_STEP_PUT,
    BENCH_STEP_PUT_PREFIX,
    BENCH_STEP_MEMCPY_GET, /* memcpy baseline interleaved with the get repetitions */
    BENCH_STEP_GET,
    BENCH_STEP_GET_LEASE,
    BENCH_STEP_STREAM_PUT,   /* the copy kvc_put_prefix makes (non-temporal stores), private */
    BENCH_STEP_MEMCPY_OFF16, /* memcpy into the caller buffer 16 bytes past a page */
    BENCH_STEP_GET_OFF16,
    BENCH_STEP_MEMCPY_OFF64,
    BENCH_STEP_GET_OFF64,
    BENCH_STEP_COUNT,
};

/* Timings of one case, shared between the parent and its client processes. */
struct bench_shared {
    pthread_barrier_t barrier;
    double t0[BENCH_STEP_COUNT][BENCH_REPS_MAX][BENCH_MAX_PROCS];
    double t1[BENCH_STEP_COUNT][BENCH_REPS_MAX][BENCH_MAX_PROCS];
    long faults[BENCH_STEP_COUNT][BENCH_MAX_PROCS]; /* minor+major, timed repetitions */
    double rtt_us[BENCH_RTT_REPS];
    double fast_us[BENCH_RTT_REPS];
    double resolve_us[BENCH_RTT_REPS];
    uint64_t got[BENCH_REPS_MAX][BENCH_MAX_PROCS + 1]; /* while_evicting: bytes the gets hit */
    int readers_done;                                  /* while_evicting: per repetition */
    /* The prefix case, us per call: [variant: default policy, lru, default with the gap]
     * [size][phase: lookup, release, the gap][repetition]. */
    double pfx_us[3][BENCH_PFX_SIZES][3][BENCH_RTT_REPS];
};

struct bench_size {
    const char *name;
    struct kvc_layout layout;
};

/* Layouts of fp16 K+V: bytes = layers * 2 * block_tokens * kv_heads * head_dim * 2. */
static const struct bench_size bench_sizes[] = {
    {"256KiB", {"bench/host-8l-4h-128d", 8, 4, 128, 16, KVC_DTYPE_FP16, KVC_KV_KIND_KV}},
    {"2MiB", {"bench/host-32l-8h-128d", 32, 8, 128, 16, KVC_DTYPE_FP16, KVC_KV_KIND_KV}},
    {"16MiB", {"bench/host-32l-8h-128d-t128", 32, 8, 128, 128, KVC_DTYPE_FP16,
               KVC_KV_KIND_KV}},
};

/* The 4 KiB namespace of lookup_hit_1block: 1 layer, 1 head of 64, 16 tokens, fp16 K+V. */
static const struct kvc_layout bench_tiny = {"bench/host-1l-1h-64d", 1, 1, 64, 16, KVC_DTYPE_FP16,
                                             KVC_KV_KIND_KV};

static const char *bench_sock;

/* The kind of pages kvcd's arena has, which the memcpy and caller buffers are given too. */
enum bench_pages { BENCH_PAGES_SMALL, BENCH_PAGES_THP, BENCH_PAGES_HUGETLB };
static enum bench_pages bench_pages;
static const char *const bench_pages_name[] = {"4 KiB pages", "transparent huge pages",
                                               "hugetlb pages"};

/* The size of the pages mapping addr in this process, in KiB (from /proc/self/smaps): the
 * mapping's KernelPageSize (in *kernel_kib too: above 4 for hugetlb), or the huge page's when
 * transparent huge pages map any of it; 0 if unknown. */
static unsigned bench_page_kib(const void *addr, unsigned *kernel_kib)
{
    FILE *f = fopen("/proc/self/smaps", "re");
    char line[512];
    bool in = false;
    unsigned kps = 0, thp = 0;
    uintptr_t a = (uintptr_t)addr;
    while (f && fgets(line, sizeof(line), f)) {
        unsigned long lo, hi, kb;
        char field[64];
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            if (in)
                break;
            in = a >= lo && a < hi;
        } else if (in && sscanf(line, "%63[^:]: %lu kB", field, &kb) == 2) {
            if (strcmp(field, "KernelPageSize") == 0)
                kps = (unsigned)kb;
            else if ((strcmp(field, "AnonHugePages") == 0 || strcmp(field, "ShmemPmdMapped") == 0 ||
                      strcmp(field, "FilePmdMapped") == 0) &&
                     kb)
                thp = 2048;
        }
    }
    if (f)
        fclose(f);
    *kernel_kib = kps;
    return thp > kps ? thp : kps;
}

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double bench_median(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* A buffer of len bytes on the arena's kind of pages (bench_pages; 4 KiB pages when huge
 * ones are not to be had: the printed page sizes then differ) with every page written, so
 * no timed copy takes a first-touch fault. */
static uint8_t *bench_buf(size_t len)
{
    void *p = MAP_FAILED;
    if (bench_pages == BENCH_PAGES_HUGETLB)
        p = mmap(NULL, (len + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (p == MAP_FAILED)
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    (void)madvise(p, len, bench_pages == BENCH_PAGES_THP ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    memset(p, 0x5a, len);
    return p;
}

/* Distinct content per process and block, so a block handed back under the wrong key
 * shows up in the comparison. */
static void bench_fill(uint8_t *buf, size_t len, uint64_t seed)
{
    uint64_t *w = (uint64_t *)buf, s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < len / 8; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        w[i] = s;
    }
}

/* Keys unique per (process, size, step, repetition, block). */
static void bench_keys(struct kvc_key *k, size_t n, unsigned proc, unsigned size, unsigned step,
                       unsigned rep)
{
    uint64_t hi = (uint64_t)(proc + 1) << 48 | (uint64_t)size << 40 | (uint64_t)step << 32 |
                  (uint64_t)rep << 16 | 0xbe;
    for (size_t i = 0; i < n; i++)
        k[i] = (struct kvc_key){.lo = (uint64_t)i * 0x100000001b3ull + 1, .hi = hi};
}

struct bench_client {
    kvc_ns *ns;
    size_t bb;       /* block bytes */
    size_t nblocks;  /* blocks per repetition */
    size_t per_op;   /* blocks per round trip */
    uint8_t *src;    /* what puts copy from */
    uint8_t *dst;    /* what gets copy into (BENCH_WS_BYTES and a page more) */
    size_t doff;     /* where in dst the blocks start: 0, or 16 or 64 bytes past a page */
    struct kvc_key *keys;
    const void **blocks;
};

static int bench_do_memcpy(struct bench_client *b)
{
    for (size_t i = 0; i < b->nblocks; i++)
        memcpy(b->dst + b->doff + i * b->bb, b->src + i * b->bb, b->bb);
    return 0;
}

/* The same copies with libkvc's copy into the arena (client/libkvc_copy.c): what the memory
 * allows a put that streams its blocks, the tighter limit for put_prefix. */
static int bench_do_stream(struct bench_client *b)
{
    for (size_t i = 0; i < b->nblocks; i++)
        kvci_copy_to_arena(b->dst + i * b->bb, b->src + i * b->bb, b->bb);
    return 0;
}

static int bench_do_nothing(struct bench_client *b)
{
    (void)b;
    return 0;
}

static int bench_do_put(struct bench_client *b)
{
    for (size_t done = 0; done < b->nblocks; done += b->per_op) {
        kvc_resv *r;
        int rc = kvc_reserve(b->ns, NULL, b->keys + done, b->per_op, &r);
        if (rc < 0)
            return rc;
        if ((size_t)rc != b->per_op) {
            kvc_abort(r);
            return -ENOSPC;
        }
        for (size_t i = 0; i < b->per_op; i++)
            memcpy(kvc_resv_data(r, i), b->src + (done + i) * b->bb, b->bb);
        rc = kvc_commit(r, SIZE_MAX);
        if (rc < 0)
            return rc;
        if ((size_t)rc != b->per_op)
            return -EIO;
    }
    return 0;
}

static int bench_do_put_prefix(struct bench_client *b)
{
    for (size_t done = 0; done < b->nblocks; done += b->per_op) {
        for (size_t i = 0; i < b->per_op; i++)
            b->blocks[i] = b->src + (done + i) * b->bb;
        int rc = kvc_put_prefix(b->ns, NULL, b->keys + done, b->per_op, b->blocks);
        if (rc < 0)
            return rc;
        if ((size_t)rc != b->per_op)
            return -ENOSPC;
    }
    return 0;
}

static int bench_do_get(struct bench_client *b)
{
    for (size_t done = 0; done < b->nblocks; done += b->per_op) {
        for (size_t i = 0; i < b->per_op; i++)
            b->blocks[i] = b->dst + b->doff + (done + i) * b->bb;
        int rc = kvc_get_prefix(b->ns, b->keys + done, b->per_op, (void *const *)b->blocks);
        if (rc < 0)
            return rc;
        if ((size_t)rc != b->per_op)
            return -ENODATA;
    }
    return 0;
}

static int bench_do_get_lease(struct bench_client *b)
{
    for (size_t done = 0; done < b->nblocks; done += b->per_op) {
        kvc_lease *l;
        int rc = kvc_lookup(b->ns, b->keys + done, b->per_op, 0, &l);
        if (rc < 0)
            return rc;
        if ((size_t)rc != b->per_op) {
            kvc_release(l);
            return -ENODATA;
        }
        for (size_t i = 0; i < b->per_op && rc >= 0; i++)
            rc = kvc_lease_copy(l, i, b->dst + (done + i) * b->bb, b->bb);
        int rr = kvc_release(l);
        if (rc < 0 || rr < 0)
            return rc < 0 ? rc : rr;
    }
    return 0;
}

/* One timed step of one process: wait for the others, run, record. */
static int bench_step(struct bench_shared *sh, unsigned proc, int step, int rep,
                      int (*fn)(struct bench_client *), struct bench_client *b)
{
    struct rusage u0, u1;
    pthread_barrier_wait(&sh->barrier);
    getrusage(RUSAGE_SELF, &u0);
    double t0 = bench_now();
    int rc = fn(b);
    double t1 = bench_now();
    getrusage(RUSAGE_SELF, &u1);
    if (rep >= 0) {
        sh->t0[step][rep][proc] = t0;
        sh->t1[step][rep][proc] = t1;
        sh->faults[step][proc] += u1.ru_minflt - u0.ru_minflt + u1.ru_majflt - u0.ru_majflt;
    }
    return rc;
}

/* Connects, opens sz's namespace and sets up b's buffers; 0, or -errno with *what failed. */
static int bench_client_open(const struct bench_size *sz, kvc_client **c, struct bench_client *b,
                             const char **what)
{
    int rc;
    *what = "connect";
    if ((rc = kvc_connect(bench_sock, c)) < 0)
        return rc;
    *what = "ns_open";
    if ((rc = kvc_ns_open(*c, &sz->layout, &b->ns)) < 0)
        return rc;
    b->bb = kvc_ns_block_bytes(b->ns);
    b->nblocks = BENCH_WS_BYTES / b->bb;
    b->per_op = BENCH_OP_BYTES > b->bb ? BENCH_OP_BYTES / b->bb : 1;
    b->src = bench_buf(BENCH_WS_BYTES);
    b->dst = bench_buf(BENCH_WS_BYTES + 4096);
    b->keys = calloc(b->nblocks, sizeof(*b->keys));
    b->blocks = calloc(b->per_op, sizeof(*b->blocks));
    *what = "buffers";
    return b->src && b->dst && b->keys && b->blocks ? 0 : -ENOMEM;
}

/* A client process of one case. Returns its exit status. */
static int bench_client_run(struct bench_shared *sh, unsigned proc, unsigned size_idx)
{
    const struct bench_size *sz = &bench_sizes[size_idx];
    struct bench_client b = {0};
    kvc_client *c = NULL;
    const char *what;
    int rc = bench_client_open(sz, &c, &b, &what);
    if (rc < 0)
        goto out;
    bench_fill(b.src, BENCH_WS_BYTES, proc * 16 + size_idx + 1);

    /* Warm-up (untimed): one pass of each kind, so code, page tables and the daemon's
     * first allocations are out of the way. */
    what = "warm-up";
    bench_keys(b.keys, b.nblocks, proc, size_idx, BENCH_STEP_PUT, 0xffff);
    if ((rc = bench_step(sh, proc, 0, -1, bench_do_memcpy, &b)) < 0 ||
        (rc = bench_step(sh, proc, 0, -1, bench_do_put, &b)) < 0 ||
        (rc = bench_step(sh, proc, 0, -1, bench_do_get, &b)) < 0)
        goto out;

    for (int r = 0; r < BENCH_REPS; r++) {
        what = "memcpy";
        if ((rc = bench_step(sh, proc, BENCH_STEP_MEMCPY_PUT, r, bench_do_memcpy, &b)) < 0)
            goto out;
        what = "stream copy";
        if ((rc = bench_step(sh, proc, BENCH_STEP_STREAM_PUT, r, bench_do_stream, &b)) < 0)
            goto out;
        what = "put";
        bench_keys(b.keys, b.nblocks, proc, size_idx, BENCH_STEP_PUT, (unsigned)r);
        if ((rc = bench_step(sh, proc, BENCH_STEP_PUT, r, bench_do_put, &b)) < 0)
            goto out;
        what = "put_prefix";
        bench_keys(b.keys, b.nblocks, proc, size_idx, BENCH_STEP_PUT_PREFIX, (unsigned)r);
        if ((rc = bench_step(sh, proc, BENCH_STEP_PUT_PREFIX, r, bench_do_put_prefix, &b)) < 0)
            goto out;
    }
    /* The keys of the last put_prefix repetition stay cached: they are the get set. */
    for (int r = 0; r < BENCH_REPS; r++) {
        what = "memcpy";
        if ((rc = bench_step(sh, proc, BENCH_STEP_MEMCPY_GET, r, bench_do_memcpy, &b)) < 0)
            goto out;
        what = "get";
        /* Spoil one byte per block: a get that skipped a block cannot pass the check. */
        for (size_t i = 0; i < b.nblocks; i++)
            b.dst[i * b.bb] ^= 0xff;
        if ((rc = bench_step(sh, proc, BENCH_STEP_GET, r, bench_do_get, &b)) < 0)
            goto out;
        what = "get data check";
        if (memcmp(b.dst, b.src, BENCH_WS_BYTES) != 0) {
            rc = -EILSEQ;
            goto out;
        }
        what = "get_lease";
        for (size_t i = 0; i < b.nblocks; i++)
            b.dst[i * b.bb] ^= 0xff;
        if ((rc = bench_step(sh, proc, BENCH_STEP_GET_LEASE, r, bench_do_get_lease, &b)) < 0)
            goto out;
        what = "get_lease data check";
        if (memcmp(b.dst, b.src, BENCH_WS_BYTES) != 0) {
            rc = -EILSEQ;
            goto out;
        }
        /* The same gets into caller buffers 16 and 64 bytes past a page. */
        static const struct {
            size_t off;
            int memcpy_step, get_step;
        } offs[] = {{16, BENCH_STEP_MEMCPY_OFF16, BENCH_STEP_GET_OFF16},
                    {64, BENCH_STEP_MEMCPY_OFF64, BENCH_STEP_GET_OFF64}};
        for (size_t o = 0; o < sizeof(offs) / sizeof(offs[0]); o++) {
            b.doff = offs[o].off;
            what = "memcpy, misaligned";
            if ((rc = bench_step(sh, proc, offs[o].memcpy_step, r, bench_do_memcpy, &b)) < 0)
                goto out;
            what = "get, misaligned";
            for (size_t i = 0; i < b.nblocks; i++)
                b.dst[b.doff + i * b.bb] ^= 0xff;
            if ((rc = bench_step(sh, proc, offs[o].get_step, r, bench_do_get, &b)) < 0)
                goto out;
            what = "get, misaligned, data check";
            if (memcmp(b.dst + b.doff, b.src, BENCH_WS_BYTES) != 0) {
                rc = -EILSEQ;
                goto out;
            }
            b.doff = 0;
        }
    }
    rc = 0;
out:
    if (rc < 0)
        fprintf(stderr, "bench_host: %s, process %u: %s: %s\n", sz->name, proc, what,
                kvc_strerror(rc));
    kvc_disconnect(c);
    /* The barrier must not wait for a process that gave up: the parent kills the rest. */
    return rc < 0 ? 1 : 0;
}

/* Lookup+release round trips of a one-block prefix, in microseconds per pair. */
static int bench_rtt_run(struct bench_shared *sh)
{
    const struct bench_size *sz = &bench_sizes[0];
    kvc_client *c = NULL;
    kvc_ns *ns;
    kvc_resv *r = NULL;
    struct kvc_key k = {.lo = 0x7777, .hi = 0x7777};
    int rc;
    if ((rc = kvc_connect(bench_sock, &c)) < 0 || (rc = kvc_ns_open(c, &sz->layout, &ns)) < 0)
        goto out;
    if ((rc = kvc_reserve(ns, NULL, &k, 1, &r)) < 0)
        goto out;
    if (rc == 1)
        memset(kvc_resv_data(r, 0), 1, kvc_ns_block_bytes(ns));
    if ((rc = kvc_commit(r, SIZE_MAX)) < 0)
        goto out;
    for (int rep = -1; rep < BENCH_RTT_REPS; rep++) {
        double t0 = bench_now();
        for (int i = 0; i < BENCH_RTT_OPS; i++) {
            kvc_lease *l;
            rc = kvc_lookup(ns, &k, 1, 0, &l);
            if (rc != 1) {
                rc = rc < 0 ? rc : -ENODATA;
                goto out;
            }
            if ((rc = kvc_release(l)) < 0)
                goto out;
        }
        if (rep >= 0)
            sh->rtt_us[rep] = (bench_now() - t0) * 1e6 / BENCH_RTT_OPS;
    }
    /* A whole fast hit of a one-block prefix of 4 KiB (the path of kvc_get_prefix: the
     * index, the copy, the clock reads, the mutex, the hit ring and its drain requests). */
    kvc_ns *tiny;
    static uint8_t tiny_dst[4096] __attribute__((aligned(64)));
    void *tiny_ptr = tiny_dst;
    if ((rc = kvc_ns_open(c, &bench_tiny, &tiny)) < 0 ||
        (rc = kvc_reserve(tiny, NULL, &k, 1, &r)) < 0)
        goto out;
    if (rc == 1)
        memset(kvc_resv_data(r, 0), 2, kvc_ns_block_bytes(tiny));
    if ((rc = kvc_commit(r, SIZE_MAX)) < 0)
        goto out;
    for (int rep = -1; rep < BENCH_RTT_REPS; rep++) {
        double t0 = bench_now();
        for (int i = 0; i < BENCH_RTT_OPS * 10; i++) {
            if (kvci_fast_get(tiny, &k, 1, &tiny_ptr) != 1) {
                rc = -ENODATA;
                goto out;
            }
        }
        if (rep >= 0)
            sh->fast_us[rep] = (bench_now() - t0) * 1e6 / (BENCH_RTT_OPS * 10);
    }
    if (tiny_dst[0] != 2 || tiny_dst[sizeof(tiny_dst) - 1] != 2) {
        rc = -EILSEQ;
        goto out;
    }
    /* The index lookup alone, as part of that. */
    for (int rep = -1; rep < BENCH_RTT_REPS; rep++) {
        double t0 = bench_now();
        for (int i = 0; i < BENCH_RTT_OPS * 10; i++) {
            const void *data;
            size_t len;
            if (kvci_fast_resolve(tiny, &k, &data, &len) != 1) {
                rc = -ENODATA;
                goto out;
            }
        }
        if (rep >= 0)
            sh->resolve_us[rep] = (bench_now() - t0) * 1e6 / (BENCH_RTT_OPS * 10);
    }
    rc = 0;
out:
    if (rc < 0)
        fprintf(stderr, "bench_host: round trip: %s\n", kvc_strerror(rc));
    kvc_disconnect(c);
    return rc < 0 ? 1 : 0;
}

/* The prefix case: lookup and release of a cached prefix of 1, 255 and 1023 keys through the
 * socket (kvc_lookup without KVC_LOOKUP_NOWAIT, kvc_release), the two calls timed apart, in two
 * namespaces of the same layout: one under the configured policy (the default, with its
 * half-life tuner) and one set to LRU (no tuner), interleaved repetition by repetition. A
 * block is 1/4096 of the arena (512 KiB; 64 KiB in a smoke run), so the tuner samples every
 * key, as it does for the 2 MiB blocks of a GPU pool of a few GiB. */
static const unsigned bench_pfx_n[BENCH_PFX_SIZES] = {1, 255, BENCH_PFX_KEYS};

static int bench_pfx_ops(unsigned n)
{
    int ops = (int)(BENCH_PFX_WORK / n);
    return n == 1 ? (bench_smoke() ? 200 : 4000) : ops < 20 ? 20 : ops;
}

static int bench_prefix_run(struct bench_shared *sh)
{
    unsigned layers = bench_smoke() ? 1 : 8; /* 64 KiB a layer */
    struct kvc_layout lay = {"bench/host-lookup", layers,        8, 128, 16,
                             KVC_DTYPE_FP16,      KVC_KV_KIND_KV};
    static struct kvc_key keys[BENCH_PFX_KEYS];
    kvc_client *c = NULL;
    kvc_ns *ns[2] = {NULL, NULL};
    const char *what = "connect";
    int rc;
    if ((rc = kvc_connect(bench_sock, &c)) < 0)
        goto out;
    for (int p = 0; p < 2; p++) {
        kvc_resv *r;
        lay.model_id = p ? "bench/host-lookup-lru" : "bench/host-lookup";
        what = "open";
        if ((rc = kvc_ns_open(c, &lay, &ns[p])) < 0)
            goto out;
        what = "policy";
        if (p && (rc = kvc_policy_set(c, kvc_ns_id(ns[p]), "lru")) < 0)
            goto out;
        for (unsigned i = 0; i < BENCH_PFX_KEYS; i++)
            keys[i] = (struct kvc_key){.lo = 0xbe00000000ull + i, .hi = 0x5eed + (uint64_t)p};
        what = "put";
        if ((rc = kvc_reserve(ns[p], NULL, keys, BENCH_PFX_KEYS, &r)) < 0)
            goto out;
        for (unsigned i = 0; i < BENCH_PFX_KEYS; i++)
            if (kvc_resv_status(r, i) == KVC_SLOT_RESERVED)
                memset(kvc_resv_data(r, i), (int)i, kvc_ns_block_bytes(ns[p]));
        if ((rc = kvc_commit(r, SIZE_MAX)) < 0)
            goto out;
    }
    what = "lookup";
    for (int rep = -1; rep < BENCH_RTT_REPS; rep++) {
        for (int v = 0; v < 3; v++) {
            int p = v == 1; /* 2: the default policy's namespace, with the gap */
            for (unsigned i = 0; i < BENCH_PFX_KEYS; i++)
                keys[i] = (struct kvc_key){.lo = 0xbe00000000ull + i, .hi = 0x5eed + (uint64_t)p};
            for (int z = 0; z < BENCH_PFX_SIZES; z++) {
                unsigned n = bench_pfx_n[z];
                int ops = bench_pfx_ops(n);
                double tl = 0, tr = 0, tg = 0;
                for (int op = 0; op < ops; op++) {
                    kvc_lease *l;
                    double t0 = bench_now();
                    rc = kvc_lookup(ns[p], keys, n, 0, &l);
                    double t1 = bench_now(), tgap = t1;
                    if (v == 2) { /* the engine's copy out of the pins */
                        while ((tgap = bench_now()) < t1 + n * BENCH_PFX_GAP_US * 1e-6)
                            ;
                        tg += tgap - t1;
                    }
                    if (rc != (int)n) {
                        if (rc >= 0)
                            kvc_release(l);
                        rc = rc < 0 ? rc : -ENODATA;
                        goto out;
                    }
                    if ((rc = kvc_release(l)) < 0)
                        goto out;
                    tr += bench_now() - tgap;
                    tl += t1 - t0;
                }
                if (rep >= 0) {
                    sh->pfx_us[v][z][0][rep] = tl * 1e6 / ops;
                    sh->pfx_us[v][z][1][rep] = tr * 1e6 / ops;
                    sh->pfx_us[v][z][2][rep] = tg * 1e6 / ops;
                }
            }
        }
    }
    rc = 0;
out:
    if (rc < 0)
        fprintf(stderr, "bench_host: prefix case: %s: %s\n", what, kvc_strerror(rc));
    kvc_disconnect(c);
    return rc < 0 ? 1 : 0;
}

/* get_256KiB_x2_while_evicting: processes 0 and 1 get their cached chains (as the get
 * case), process 2 puts fresh chains until both are done with each repetition. A get that
 * finds blocks evicted counts the bytes it did copy; the missing blocks are put back
 * outside the timing. Each repetition also times the readers' plain memcpy alone (the
 * baseline) and while process 2 copies as much with memcpy (what sharing two CPUs and the
 * memory bus with a busy writer leaves them, printed beside). */

/* One writer op: a fresh 16 MiB chain put through kvcd, or the same bytes memcpy'd. */
static int bench_writer_put(struct bench_client *b, unsigned tag)
{
    bench_keys(b->keys, b->per_op, 2, 7, BENCH_STEP_PUT, tag);
    for (size_t i = 0; i < b->per_op; i++)
        b->blocks[i] = b->src + i * b->bb;
    int rc = kvc_put_prefix(b->ns, NULL, b->keys, b->per_op, b->blocks);
    return rc < 0 ? rc : 0;
}

static int bench_writer_memcpy(struct bench_client *b, unsigned tag)
{
    size_t off = (size_t)(tag % (BENCH_WS_BYTES / BENCH_OP_BYTES)) * BENCH_OP_BYTES;
    memcpy(b->dst + off, b->src + off, BENCH_OP_BYTES);
    return 0;
}

/* The readers' timed part of a phase: all their cached chains through kvc_get_prefix
 * (checked), or the same bytes memcpy'd. Bytes copied, or -errno. */
/* Hits of each round trip of the last bench_reader_get (this process's), checked after the
 * timing by bench_reader_check. */
static int bench_reader_hits[BENCH_WS_MAX_OPS];

static int64_t bench_reader_get(struct bench_client *b)
{
    uint64_t got = 0;
    for (size_t done = 0, op = 0; done < b->nblocks; done += b->per_op, op++) {
        for (size_t i = 0; i < b->per_op; i++)
            b->blocks[i] = b->dst + (done + i) * b->bb;
        int rc = kvc_get_prefix(b->ns, b->keys + done, b->per_op, (void *const *)b->blocks);
        if (rc < 0)
            return rc;
        bench_reader_hits[op] = rc;
        got += (uint64_t)rc * b->bb;
    }
    return (int64_t)got;
}

/* Every hit of the last bench_reader_get holds the bytes that were put. 0 or -EILSEQ. */
static int bench_reader_check(const struct bench_client *b)
{
    for (size_t done = 0, op = 0; done < b->nblocks; done += b->per_op, op++)
        if (memcmp(b->dst + done * b->bb, b->src + done * b->bb,
                   (size_t)bench_reader_hits[op] * b->bb) != 0)
            return -EILSEQ;
    return 0;
}

static int64_t bench_reader_memcpy(struct bench_client *b)
{
    bench_do_memcpy(b);
    return (int64_t)BENCH_WS_BYTES;
}

/* One phase of a repetition: readers run theirs (timed into step), the writer repeats its
 * op until both are through. */
static int bench_evict_phase(struct bench_shared *sh, unsigned proc, int r, int step,
                             int64_t (*reader)(struct bench_client *),
                             int (*writer)(struct bench_client *, unsigned),
                             struct bench_client *b)
{
    int rc = 0;
    pthread_barrier_wait(&sh->barrier);
    if (proc == 2) {
        for (unsigned w = 0; rc == 0 && __atomic_load_n(&sh->readers_done, __ATOMIC_ACQUIRE) < 2;
             w++)
            rc = writer(b, (unsigned)(r + 2) * 65536 + (unsigned)step * 4096 + w);
        pthread_barrier_wait(&sh->barrier);
        return rc;
    }
    double t0 = bench_now();
    int64_t got = reader(b);
    double t1 = bench_now();
    __atomic_fetch_add(&sh->readers_done, 1, __ATOMIC_RELEASE);
    pthread_barrier_wait(&sh->barrier);
    if (r >= 0 && got >= 0) {
        sh->t0[step][r][proc] = t0;
        sh->t1[step][r][proc] = t1;
        if (step == BENCH_STEP_GET)
            sh->got[r][proc] = (uint64_t)got;
    }
    if (proc == 0)
        __atomic_store_n(&sh->readers_done, 0, __ATOMIC_RELEASE);
    if (got >= 0 && reader == bench_reader_get) /* bytes checked outside the timing */
        return bench_reader_check(b);
    return got < 0 ? (int)got : 0;
}

static int bench_evict_run(struct bench_shared *sh, unsigned proc)
{
    struct bench_client b = {0};
    kvc_client *c = NULL;
    const char *what;
    int rc = bench_client_open(&bench_sizes[0], &c, &b, &what);
    if (rc < 0)
        goto out;
    bench_fill(b.src, BENCH_WS_BYTES, proc * 16 + 99);
    bench_keys(b.keys, b.nblocks, proc, 7, BENCH_STEP_GET, 0);
    what = "put";
    if (proc < 2 && (rc = bench_do_put_prefix(&b)) < 0)
        goto out;
    for (int r = -1; r < BENCH_REPS; r++) {
        what = "memcpy";
        if ((rc = bench_step(sh, proc, BENCH_STEP_MEMCPY_GET, r,
                             proc < 2 ? bench_do_memcpy : bench_do_nothing, &b)) < 0)
            goto out;
        what = "memcpy beside a memcpy";
        if ((rc = bench_evict_phase(sh, proc, r, BENCH_STEP_MEMCPY_PUT, bench_reader_memcpy,
                                    bench_writer_memcpy, &b)) < 0)
            goto out;
        what = "get beside puts";
        if ((rc = bench_evict_phase(sh, proc, r, BENCH_STEP_GET, bench_reader_get,
                                    bench_writer_put, &b)) < 0)
            goto out;
        what = "put back"; /* what was evicted (present blocks are skipped by the put) */
        for (size_t done = 0; proc < 2 && r >= 0 && sh->got[r][proc] < BENCH_WS_BYTES &&
                              done < b.nblocks;
             done += b.per_op) {
            for (size_t i = 0; i < b.per_op; i++)
                b.blocks[i] = b.src + (done + i) * b.bb;
            if ((rc = kvc_put_prefix(b.ns, NULL, b.keys + done, b.per_op, b.blocks)) < 0)
                goto out;
        }
    }
    rc = 0;
out:
    if (rc < 0)
        fprintf(stderr, "bench_host: while evicting, process %u: %s: %s\n", proc, what,
                kvc_strerror(rc));
    kvc_disconnect(c);
    return rc < 0 ? 1 : 0;
}

/* Forks nprocs clients of one case (or the round-trip client when size_idx is -1, the
 * while-evicting processes when -2) and waits for them. Returns 0 when all succeeded. */
static int bench_case_run(struct bench_shared *sh, unsigned nprocs, int size_idx)
{
    pthread_barrierattr_t ba;
    pid_t pids[BENCH_MAX_PROCS];
    int ret = 0;
    memset(sh, 0, sizeof(*sh));
    pthread_barrierattr_init(&ba);
    pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(&sh->barrier, &ba, nprocs);
    pthread_barrierattr_destroy(&ba);
    fflush(NULL);
    for (unsigned p = 0; p < nprocs; p++) {
        pids[p] = daemon_fork();
        if (pids[p] < 0) {
            perror("bench_host: fork");
            nprocs = p;
            ret = -1;
            break;
        }
        if (pids[p] == 0)
            _exit(size_idx == -1   ? bench_rtt_run(sh)
                  : size_idx == -2 ? bench_evict_run(sh, p)
                  : size_idx == -3 ? bench_prefix_run(sh)
                                   : bench_client_run(sh, p, (unsigned)size_idx));
    }
    for (unsigned p = 0; p < nprocs; p++) {
        int st;
        pid_t w;
        while ((w = waitpid(-1, &st, 0)) < 0 && errno == EINTR)
            ;
        if (w < 0)
            break;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            /* One failed: the others may wait at the barrier forever. */
            for (unsigned q = 0; q < nprocs; q++)
                if (pids[q] != w)
                    kill(pids[q], SIGKILL);
            ret = -1;
        }
    }
    pthread_barrier_destroy(&sh->barrier);
    return ret;
}

/* Best (and, in *median, the median) over repetitions of the aggregate bandwidth of a
 * step, in GB/s. */
static double bench_gbps(const struct bench_shared *sh, int step, unsigned nprocs,
                         double *median)
{
    double v[BENCH_REPS_MAX];
    for (int r = 0; r < BENCH_REPS; r++) {
        double t0 = sh->t0[step][r][0], t1 = sh->t1[step][r][0];
        for (unsigned p = 1; p < nprocs; p++) {
            t0 = sh->t0[step][r][p] < t0 ? sh->t0[step][r][p] : t0;
            t1 = sh->t1[step][r][p] > t1 ? sh->t1[step][r][p] : t1;
        }
        v[r] = (double)BENCH_WS_BYTES * nprocs / (t1 - t0) / 1e9;
    }
    *median = bench_median(v, BENCH_REPS);
    return v[BENCH_REPS - 1];
}

/* Reads the page size of kvcd's arena as a client maps it (its first 4 MiB touched), sets
 * bench_pages to match, and prints it beside the page size bench_buf then gets. 0, or -1. */
static int bench_pages_probe(void)
{
    kvc_client *c;
    kvc_ns *ns;
    unsigned kk, arena_kib, buf_kib;
    if (kvc_connect(bench_sock, &c) < 0)
        return -1;
    if (kvc_ns_open(c, &bench_sizes[0].layout, &ns) < 0) {
        kvc_disconnect(c);
        return -1;
    }
    const struct kvc_arena *a = &c->arenas[ns->arena];
    volatile const uint8_t *p = a->base;
    for (size_t off = 0; off < a->size && off < (4u << 20); off += 4096)
        (void)p[off];
    arena_kib = bench_page_kib(a->base, &kk);
    kvc_disconnect(c);
    bench_pages = kk > 4          ? BENCH_PAGES_HUGETLB
                  : arena_kib > 4 ? BENCH_PAGES_THP
                                  : BENCH_PAGES_SMALL;
    uint8_t *probe = bench_buf(8u << 20);
    if (!probe)
        return -1;
    buf_kib = bench_page_kib(probe + (4u << 20), &kk);
    munmap(probe, 8u << 20);
    printf("pages: kvcd's arena %u KiB (%s), the memcpy and caller buffers %u KiB%s\n\n", arena_kib,
           bench_pages_name[bench_pages], buf_kib,
           arena_kib == buf_kib ? " (the same)"
                                : " (pages differ: the ratios compare different page sizes)");
    return 0;
}

/* Starts kvcd on dir/kvcd.sock; returns its pid, or -1 when it did not come up. */
static pid_t bench_daemon_start(const char *dir, const char *sock)
{
    char opt_sock[200], log[160], opt_size[32];
    snprintf(opt_sock, sizeof(opt_sock), "server.socket=%s", sock);
    snprintf(log, sizeof(log), "%s/kvcd.log", dir);
    snprintf(opt_size, sizeof(opt_size), "host.size=%s", BENCH_ARENA);
    const char *kvcd = daemon_bin("kvcd"); /* before the fork: it takes a lock */
    pid_t pid = daemon_fork(); /* dies with the benchmark */
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd >= 0)
            dup2(fd, 2);
        execl(kvcd, "kvcd", "-o", opt_sock, "-o", opt_size,
              "-o", "log.level=warning", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 600; i++) {
        kvc_client *c;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            break;
        if (kvc_connect(sock, &c) == 0) {
            kvc_disconnect(c);
            return pid;
        }
        usleep(50000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fprintf(stderr, "bench_host: kvcd did not start (%s); its log:\n", kvcd);
    FILE *f = fopen(log, "re");
    if (f) {
        char line[256];
        while (fgets(line, sizeof(line), f))
            fputs(line, stderr);
        fclose(f);
    }
    return -1;
}

int main(int argc, char **argv)
{
    const char *json = argc > 1 ? argv[1] : "build/bench/host.json";
    const char *only = argc > 2 ? argv[2] : NULL; /* one case, e.g. 2MiB_x1, for profiling */
    char dir[] = "/tmp/kvcd-bench.XXXXXX", sock[160], log[160];
    struct bench_row res[96];
    size_t nres = 0;
    struct bench_shared *sh;
    pid_t daemon = -1;
    int status = 1;
    if (!mkdtemp(dir)) {
        perror("bench_host: mkdtemp");
        return 1;
    }
    snprintf(sock, sizeof(sock), "%s/kvcd.sock", dir);
    snprintf(log, sizeof(log), "%s/kvcd.log", dir);
    bench_sock = sock;
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("bench_host: mmap");
        goto out;
    }
    daemon = bench_daemon_start(dir, sock);
    if (daemon < 0)
        goto out;

    printf("kvcd host tier through libkvc: arena %s, %llu MiB of blocks per process per case, "
           "%llu MiB per round trip;\nGB/s (1e9 bytes/s of block bytes, all processes together) "
           "over %d repetitions after a warm-up;\nratio = best kvcd / best memcpy, memcpy "
           "copying the same bytes between two pre-faulted buffers per process.\n\n",
           BENCH_ARENA, BENCH_WS_BYTES >> 20, BENCH_OP_BYTES >> 20, BENCH_REPS);
    if (bench_pages_probe() < 0) {
        fprintf(stderr, "bench_host: could not map kvcd's arena to read its page size\n");
        goto out;
    }
    printf("%-22s %8s %8s %8s %8s %6s %9s\n", "", "kvcd", "", "memcpy", "", "", "faults in");
    printf("%-22s %8s %8s %8s %8s %6s %9s\n", "case", "best", "median", "best", "median",
           "ratio", "timed ops");
    for (unsigned np = 1; np <= 2; np++) {
        for (unsigned s = 0; s < sizeof(bench_sizes) / sizeof(bench_sizes[0]); s++) {
            char tag[32];
            snprintf(tag, sizeof(tag), "%s_x%u", bench_sizes[s].name, np);
            if (only && strcmp(only, tag) != 0)
                continue;
            if (bench_case_run(sh, np, (int)s) < 0) {
                fprintf(stderr, "bench_host: case %s x%u failed\n", bench_sizes[s].name, np);
                goto out;
            }
            /* same: memcpy into the same misaligned addresses, printed beside */
            static const struct {
                const char *op;
                int step, base, same;
            } rows[] = {
                {"put", BENCH_STEP_PUT, BENCH_STEP_MEMCPY_PUT, -1},
                {"put_prefix", BENCH_STEP_PUT_PREFIX, BENCH_STEP_MEMCPY_PUT, -1},
                {"get", BENCH_STEP_GET, BENCH_STEP_MEMCPY_GET, -1},
                {"get_lease", BENCH_STEP_GET_LEASE, BENCH_STEP_MEMCPY_GET, -1},
                {"get_off16", BENCH_STEP_GET_OFF16, BENCH_STEP_MEMCPY_GET, BENCH_STEP_MEMCPY_OFF16},
                {"get_off64", BENCH_STEP_GET_OFF64, BENCH_STEP_MEMCPY_GET, BENCH_STEP_MEMCPY_OFF64},
            };
            for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
                char name[64];
                snprintf(name, sizeof(name), "%s_%s_x%u", rows[i].op, bench_sizes[s].name, np);
                double med, base_med;
                long faults = 0;
                double v = bench_gbps(sh, rows[i].step, np, &med);
                double base = bench_gbps(sh, rows[i].base, np, &base_med);
                struct bench_row *r = bench_row_add(res, sizeof(res) / sizeof(res[0]), &nres,
                                                    name, v, "GB/s", "memcpy", base);
                if (!r)
                    goto out; /* refused (reported): not a measurement */
                for (unsigned p = 0; p < np; p++)
                    faults += sh->faults[rows[i].step][p];
                printf("%-24s %8.2f %8.2f %8.2f %8.2f %6.2f %9ld%s\n", r->name, r->value, med,
                       r->base, base_med, r->value / r->base, faults,
                       rows[i].step == BENCH_STEP_GET_LEASE ? "  (socket path)"
                       : r->value < 0.95 * r->base          ? "  below 0.95 target"
                                                            : "");
                if (rows[i].step == BENCH_STEP_PUT_PREFIX) {
                    /* put_prefix against the copy it makes, between private buffers */
                    double smed, sv = bench_gbps(sh, BENCH_STEP_STREAM_PUT, np, &smed);
                    snprintf(name, sizeof(name), "put_prefix_%s_x%u_vs_stream_copy",
                             bench_sizes[s].name, np);
                    r = bench_row_add(res, sizeof(res) / sizeof(res[0]), &nres, name, v, "GB/s",
                                      "stream copy", sv);
                    if (!r)
                        goto out;
                    printf("%-24s %8s %8s %8.2f %8.2f %6.2f %9s  (medians %.2f; vs the streaming "
                           "copy put_prefix makes)\n",
                           "  same, vs stream copy", "", "", sv, smed, v / sv, "-", med / smed);
                }
                if (rows[i].same >= 0) {
                    /* against memcpy into the same misaligned addresses */
                    double smed, sv = bench_gbps(sh, rows[i].same, np, &smed);
                    snprintf(name, sizeof(name), "%s_%s_x%u_vs_memcpy_same_offset", rows[i].op,
                             bench_sizes[s].name, np);
                    r = bench_row_add(res, sizeof(res) / sizeof(res[0]), &nres, name, v, "GB/s",
                                      "memcpy, same offset", sv);
                    if (!r)
                        goto out;
                    printf("%-24s %8s %8s %8.2f %8.2f %6.2f %9s  (medians %.2f; vs memcpy into "
                           "the same offset)\n",
                           "  same, vs memcpy +off", "", "", sv, smed, v / sv, "-", med / smed);
                }
            }
            fflush(stdout);
        }
    }
    if (!only || strcmp(only, "evicting") == 0) {
        if (bench_case_run(sh, 3, -2) < 0) {
            fprintf(stderr, "bench_host: case while_evicting failed\n");
            goto out;
        }
        double v[BENCH_REPS_MAX], m[BENCH_REPS_MAX], w[BENCH_REPS_MAX], med, base_med;
        for (int rep = 0; rep < BENCH_REPS; rep++) {
            for (int st = 0; st < 3; st++) {
                static const int steps[] = {BENCH_STEP_GET, BENCH_STEP_MEMCPY_GET,
                                            BENCH_STEP_MEMCPY_PUT};
                int step = steps[st];
                double t0 = sh->t0[step][rep][0] < sh->t0[step][rep][1] ? sh->t0[step][rep][0]
                                                                         : sh->t0[step][rep][1];
                double t1 = sh->t1[step][rep][0] > sh->t1[step][rep][1] ? sh->t1[step][rep][0]
                                                                         : sh->t1[step][rep][1];
                double bytes = st ? 2.0 * BENCH_WS_BYTES
                                  : (double)(sh->got[rep][0] + sh->got[rep][1]);
                (st == 0 ? v : st == 1 ? m : w)[rep] = bytes / (t1 - t0) / 1e9;
            }
        }
        double best = 0, base = 0, hit = 0, wbest = 0;
        for (int rep = 0; rep < BENCH_REPS; rep++) {
            best = v[rep] > best ? v[rep] : best;
            base = m[rep] > base ? m[rep] : base;
            wbest = w[rep] > wbest ? w[rep] : wbest;
            hit += (double)(sh->got[rep][0] + sh->got[rep][1]) / (2.0 * BENCH_WS_BYTES);
        }
        med = bench_median(v, BENCH_REPS);
        base_med = bench_median(m, BENCH_REPS);
        struct bench_row *r = bench_row_add(res, sizeof(res) / sizeof(res[0]), &nres,
                                            "get_256KiB_x2_while_evicting", best, "GB/s",
                                            "memcpy", base);
        if (!r)
            goto out;
        printf("%-24s %8.2f %8.2f %8.2f %8.2f %6.2f %9s%s (%.0f %% of the blocks hit)\n",
               r->name, r->value, med, r->base, base_med, r->value / r->base, "-",
               r->value < 0.8 * r->base ? "  below 0.8 target" : "", 100.0 * hit / BENCH_REPS);
        double wmed = bench_median(w, BENCH_REPS);
        r = bench_row_add(res, sizeof(res) / sizeof(res[0]), &nres,
                          "get_256KiB_x2_while_evicting_vs_memcpy_beside_memcpy", best, "GB/s",
                          "memcpy x2 beside a third memcpy", wbest);
        if (!r)
            goto out;
        printf("%-24s %8s %8s %8.2f %8.2f %6.2f %9s  (the readers' memcpy while a third "
               "process memcpys)\n",
               "  same, vs memcpy beside", "", "", wbest, wmed, best / wbest, "-");
    }
    if (!only || strcmp(only, "prefix") == 0) {
        if (bench_case_run(sh, 1, -3) < 0) {
            fprintf(stderr, "bench_host: case prefix failed\n");
            goto out;
        }
        printf("\nlookup + release of a cached prefix through the socket, us per call (best, "
               "median of %d repetitions);\nratio = against a one-key lookup + release "
               "of the same namespace in the same run\n",
               BENCH_RTT_REPS);
        static const char *const pol[2] = {"", "_lru"};
        double best[3][BENCH_PFX_SIZES][4], med[3][BENCH_PFX_SIZES][4];
        for (int p = 0; p < 3; p++)
            for (int z = 0; z < BENCH_PFX_SIZES; z++)
                for (int ph = 0; ph < 4; ph++) { /* lookup, release, all three, the gap */
                    double v[BENCH_RTT_REPS];
                    for (int rep = 0; rep < BENCH_RTT_REPS; rep++)
                        v[rep] = ph < 2    ? sh->pfx_us[p][z][ph][rep]
                                 : ph == 3 ? sh->pfx_us[p][z][2][rep]
                                           : sh->pfx_us[p][z][0][rep] + sh->pfx_us[p][z][1][rep] +
                                                 sh->pfx_us[p][z][2][rep];
                    med[p][z][ph] = bench_median(v, BENCH_RTT_REPS);
                    best[p][z][ph] = v[0];
                    for (int rep = 1; rep < BENCH_RTT_REPS; rep++)
                        best[p][z][ph] = v[rep] < best[p][z][ph] ? v[rep] : best[p][z][ph];
                }
        for (int p = 0; p < 2; p++) {
            char base[64];
            snprintf(base, sizeof(base), "lookup_release_1key%s", pol[p]);
            struct bench_row *r = bench_row_add(res, sizeof(res) / sizeof(res[0]), &nres, base,
                                                best[p][0][2], "us", NULL, 0);
            if (!r)
                goto out;
            printf("%-32s %9.2f %9.2f  (lookup %.2f, release %.2f)\n", r->name, r->value,
                   med[p][0][2], best[p][0][0], best[p][0][1]);
            for (int z = 1; z < BENCH_PFX_SIZES; z++) {
                static const char *const ph_name[3] = {"lookup", "release", "lookup_release"};
                for (int ph = 2; ph >= 0; ph--) {
                    char name[64];
                    snprintf(name, sizeof(name), "%s_%ukeys%s", ph_name[ph], bench_pfx_n[z],
                             pol[p]);
                    r = bench_row_add(res, sizeof(res) / sizeof(res[0]), &nres, name,
                                      best[p][z][ph], "us", base, best[p][0][2]);
                    if (!r)
                        goto out;
                    printf("%-32s %9.2f %9.2f  ratio %6.2f", r->name, r->value, med[p][z][ph],
                           r->value / r->base);
                    if (ph == 2)
                        printf("  (%.3f us a key past the one-key call; medians %.3f)",
                               (best[p][z][2] - best[p][0][2]) / (bench_pfx_n[z] - 1),
                               (med[p][z][2] - med[p][0][2]) / (bench_pfx_n[z] - 1));
                    printf("\n");
                }
            }
        }
        printf("a load's model: lookup, %.1f us a key of the engine's copy out of the pins (the "
               "client spins: an H200's\nD2D copy of 2 MiB blocks), release; ratio = against "
               "that copy alone (the prefill rows' load_8b_*_pool_cuda / D2D)\n",
               BENCH_PFX_GAP_US);
        for (int z = 1; z < BENCH_PFX_SIZES; z++) {
            char name[64];
            snprintf(name, sizeof(name), "load_model_%ukeys", bench_pfx_n[z]);
            struct bench_row *r =
                bench_row_add(res, sizeof(res) / sizeof(res[0]), &nres, name, best[2][z][2], "us",
                              "the copy alone", best[2][z][3]);
            if (!r)
                goto out;
            printf("%-32s %9.2f %9.2f  ratio %6.2f  (lookup %.2f, release %.2f; medians: "
                   "ratio %.2f)\n",
                   r->name, r->value, med[2][z][2], r->value / r->base, best[2][z][0],
                   best[2][z][1], med[2][z][2] / med[2][z][3]);
        }
        for (int z = 1; z < BENCH_PFX_SIZES; z++) {
            char name[64];
            snprintf(name, sizeof(name), "lookup_release_%ukeys_vs_lru", bench_pfx_n[z]);
            struct bench_row *r =
                bench_row_add(res, sizeof(res) / sizeof(res[0]), &nres, name, best[0][z][2], "us",
                              "the same under lru", best[1][z][2]);
            if (!r)
                goto out;
            printf("%-32s %9.2f %9.2f  ratio %6.2f  (the configured policy against lru; "
                   "medians %.2f)\n",
                   r->name, r->value, med[0][z][2], r->value / r->base,
                   med[0][z][2] / med[1][z][2]);
        }
        fflush(stdout);
    }
    if (only && strcmp(only, "rtt") != 0)
        goto done;
    if (bench_case_run(sh, 1, -1) < 0)
        goto out;
    struct bench_row *r = bench_row_add(res, sizeof(res) / sizeof(res[0]), &nres,
                                        "rtt_lookup_release_1block",
                                        bench_median(sh->rtt_us, BENCH_RTT_REPS), "us", NULL, 0);
    if (!r)
        goto out;
    printf("%-24s %10.2f us per lookup+release pair (1-block prefix, one client)\n", r->name,
           r->value);
    double rtt = r->value;
    r = bench_row_add(res, sizeof(res) / sizeof(res[0]), &nres, "lookup_hit_1block",
                      bench_median(sh->fast_us, BENCH_RTT_REPS), "us",
                      "rtt_lookup_release_1block", rtt);
    if (!r)
        goto out;
    double fast_best = sh->fast_us[0];
    for (int i = 1; i < BENCH_RTT_REPS; i++)
        fast_best = sh->fast_us[i] < fast_best ? sh->fast_us[i] : fast_best;
    printf("%-24s %10.3f us for a whole hit of a 1-block prefix (4 KiB) through the shared "
           "index (median; best %.3f); %.4f of the round trip%s\n",
           r->name, r->value, fast_best, r->value / rtt,
           r->value > 1.0 || r->value > 0.05 * rtt ? "  above the 1 us / 0.05 target" : "");
    r = bench_row_add(res, sizeof(res) / sizeof(res[0]), &nres, "lookup_resolve_1block",
                      bench_median(sh->resolve_us, BENCH_RTT_REPS), "us",
                      "rtt_lookup_release_1block", rtt);
    if (!r)
        goto out;
    printf("%-24s %10.3f us of that in the index lookup alone (kvci_fast_resolve, median)\n",
           r->name, r->value);
done:
    status = bench_finish(json, res, nres);
    if (status == 0)
        printf("\nwrote %s\n", json);
out:
    if (daemon > 0) {
        kill(daemon, SIGTERM);
        waitpid(daemon, NULL, 0);
    }
    if (status != 0) {
        FILE *f = fopen(log, "re");
        char line[256];
        while (f && fgets(line, sizeof(line), f))
            fputs(line, stderr);
        if (f)
            fclose(f);
    }
    unlink(log);
    unlink(sock);
    rmdir(dir);
    return status;
}
