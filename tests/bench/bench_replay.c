/*
 * bench_replay.c — the Mooncake conversation trace through the real kvcd (kvcreplay), and
 * restart time with a full disk tier. Usage: bench_replay OUT.json.
 *
 * DESIGN
 * Every case starts its own kvcd (tests/lib/daemon) with a fresh disk file and runs the
 * built kvcreplay against it as a child process, reading its --json report. Blocks are
 * 16 KiB (one per 512-token trace block: the trace's bytes scaled down 4096-fold from
 * Llama-3-8B's 64 MiB, so the whole trace fits this machine).
 *
 *   disk_p1, disk_p4   host tier of 2048 blocks (32 MiB) + a disk tier for every distinct
 *                      block of the trace; 1 and 4 processes. Value: block hit ratio;
 *                      baseline: the trace's infinite-cache ratio. Target ratio >= 0.97.
 *   disk_writes_p4     disk writes of the p4 run per distinct block (the hierarchy is
 *                      inclusive: a promoted block demoted again costs no write). Target <= 1.1.
 *   host_p4_10k        host tier of 10000 blocks, no disk, 4 processes; baseline: kvcsim
 *                      with the namespace's policy and 10000 blocks (kvcreplay runs it).
 *                      Target ratio >= 0.97.
 *   ladder_q8_0_10k    host tier of 10000 blocks of 64 KiB, no disk, 1 process, a namespace
 *   ladder_q8_q4_10k   that allows q8_0 (then q4_1) under the default policy: the precision
 *                      ladder; baseline kvcsim's ladder on the same requests and capacity,
 *                      charging each codec its slot in the store (kvcsim --layout).
 *   ladder_q8_q4_10k_p4 the two-codec ladder with 4 processes (kvcsim --procs 4: the
 *                      requests overlap as the processes take them),
 *   ladder_q8_q4_1k    and on a host tier of 1024 blocks (64 MiB), 1 and 4 processes (where
 *   ladder_q8_q4_1k_p4 the room in-flight puts hold is a fifth of the tier). Target for every
 *                      ladder row: within 0.03 of kvcsim's ratio (|ratio - 1| <= 0.03).
 *   restart_2g/_8g     seconds from exec to READY=1 on a NOTIFY_SOCKET this bench binds, after
 *                      SIGKILL, with the disk tier full of 16 KiB records (filled through the
 *                      daemon: a 16 MiB host tier demotes every put, until the disk starts
 *                      evicting); baseline: the same start with an empty disk tier of the same
 *                      size. Median of three starts each. Targets 1 s and 2 s. After the last
 *                      start a sample of blocks written before the kill is read back and
 *                      checked byte for byte.
 *   wrong_bytes        wrong bytes over all cases: must be 0.
 *
 * A case whose daemon, replay or fill fails prints why and gets no row, and the bench exits 1;
 * a failure is never a 0. Environment: KVC_TRACE (the trace; default ../shared/traces/ beside
 * the source tree), KVC_BENCH_QUICK=1 (the first 400 requests, restart on 128 MiB and
 * 256 MiB disks), KVC_BENCH_ONLY="disk host restart" (substrings of the cases to run),
 * KVC_BENCH_DIR (where the disk files go; default the bench's temp dir, which must take
 * O_DIRECT).
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/lib/bench.h"
#include "tests/lib/daemon.h"
#include "tests/lib/sim.h"

#define BENCH_BLOCK ((uint64_t)16384)
#define BENCH_RECORD (BENCH_BLOCK + 4096) /* a disk record: 4 KiB header + the data */
#define BENCH_HOST_DISK_BLOCKS 2048ull
#define BENCH_HOST_BLOCKS 10000ull
#define BENCH_QUICK_REQUESTS 400
#define BENCH_OUT (64u << 10)
#define BENCH_CHAIN 32  /* blocks per chain of the restart fill */
#define BENCH_SAMPLE 64 /* chains read back after a restart */
#define KVCREPLAY daemon_bin("kvcreplay")

static struct bench_row rows[32];
static size_t nrows;
static bool quick;
static int failures;
static uint64_t wrong_total;
static char trace_path[DAEMON_PATH_MAX * 2];
static uint64_t trace_requests; /* requests replayed (0: all) */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool case_wanted(const char *name)
{
    const char *only = getenv("KVC_BENCH_ONLY");
    char buf[256], *save = NULL;
    if (!only || !*only)
        return true;
    snprintf(buf, sizeof(buf), "%s", only);
    for (char *w = strtok_r(buf, " ,", &save); w; w = strtok_r(NULL, " ,", &save))
        if (strstr(name, w))
            return true;
    return false;
}

static void case_fail(const char *name, const char *why)
{
    fprintf(stderr, "bench_replay: %s: %s; no figure for this case\n", name, why);
    failures++;
}

/* Where a disk file of daemon d goes. */
static void disk_path(const struct daemon *d, const char *name, char *out, size_t len)
{
    const char *dir = getenv("KVC_BENCH_DIR");
    if (dir && *dir)
        snprintf(out, len, "%.120s/kvc-bench-replay-%d-%.40s", dir, (int)getpid(), name);
    else
        snprintf(out, len, "%.150s/%.40s", d->dir, name);
}

static int stat_get(kvc_client *c, const char *name, uint64_t *v)
{
    int rc = daemon_client_stat(c, 0, name, v);
    if (rc)
        fprintf(stderr, "bench_replay: stat %s: %s\n", name, kvc_strerror(rc));
    return rc;
}

/* ---- the trace -------------------------------------------------------------------------- */

/* Distinct blocks of the first `limit` requests (0: all) of the trace, through the
 * simulator's parser. 0 or -errno. */
static int trace_distinct(const char *path, uint64_t limit, uint64_t *distinct, uint64_t *reqs)
{
    struct sim_trace t;
    char *text = NULL;
    size_t len = 0, cap = 0, lines = 0;
    FILE *f = fopen(path, "r");
    int rc = 0;
    char line[1 << 16];
    if (!f)
        return -errno;
    /* Whole lines only: a long line is read in pieces that are joined again. */
    while (fgets(line, sizeof(line), f)) {
        size_t l = strlen(line);
        if (len + l + 1 > cap) {
            size_t ncap = cap ? cap * 2 : 1 << 20;
            while (ncap < len + l + 1)
                ncap *= 2;
            char *nt = realloc(text, ncap);
            if (!nt) {
                rc = -ENOMEM;
                goto out;
            }
            text = nt;
            cap = ncap;
        }
        memcpy(text + len, line, l);
        len += l;
        if (l && line[l - 1] == '\n' && ++lines == limit)
            break;
    }
    rc = sim_trace_parse(&t, text ? text : "", len);
    if (rc == 0) {
        *distinct = t.nblocks;
        *reqs = t.nreq;
        sim_trace_free(&t);
    }
out:
    free(text);
    fclose(f);
    return rc;
}

/* ---- kvcreplay ----------------------------------------------------------------------------- */

struct replay_out {
    uint64_t requests, looked_up, hits, inf_hits, distinct, wrong, errors, failed, disk_writes;
    uint64_t hits_host_tokens, hits_disk_tokens, refused, busy, dropped, evicted;
    bool have_disk_writes, have_sim;
    double sim_ratio, wall_s;
};

/* The number at obj.key of kvcreplay's report (obj NULL: at the top); *have says whether it
 * is there. */
static double json_double(const char *s, const char *obj, const char *key, bool *have)
{
    json_t *doc = json_loads(s, 0, NULL);
    const json_t *v =
        obj ? json_object_get(json_object_get(doc, obj), key) : json_object_get(doc, key);
    double d = json_is_number(v) ? json_number_value(v) : 0;
    *have = json_is_number(v);
    json_decref(doc);
    return d;
}

/* Runs kvcreplay -p procs on daemon d and reads its report. 0, or -1 (reported). The wrong
 * bytes it found are added to the bench's total whatever its exit status. */
static int replay_run_args(const char *name, const struct daemon *d, int procs,
                           const char *const *extra, struct replay_out *o);

static int replay_run(const char *name, const struct daemon *d, int procs, struct replay_out *o)
{
    return replay_run_args(name, d, procs, NULL, o);
}

/* The same with more kvcreplay arguments (NULL-terminated). */
static int replay_run_args(const char *name, const struct daemon *d, int procs,
                           const char *const *extra, struct replay_out *o)
{
    static char out[BENCH_OUT], err[BENCH_OUT];
    char p[16], n[32];
    const char *argv[24];
    int k = 0, rc;
    bool have;
    struct {
        const char *key;
        uint64_t *v;
    } ints[] = {{"requests", &o->requests},
                {"blocks_looked_up", &o->looked_up},
                {"blocks_hit", &o->hits},
                {"infinite_hits", &o->inf_hits},
                {"distinct_blocks", &o->distinct},
                {"wrong_bytes", &o->wrong},
                {"errors", &o->errors},
                {"failed_processes", &o->failed},
                {"puts_refused", &o->refused},
                {"blocks_busy", &o->busy},
                {"hit_tokens_host", &o->hits_host_tokens},
                {"hit_tokens_disk", &o->hits_disk_tokens}};
    memset(o, 0, sizeof(*o));
    snprintf(p, sizeof(p), "%d", procs);
    argv[k++] = KVCREPLAY;
    argv[k++] = "-s";
    argv[k++] = d->sock;
    argv[k++] = "-p";
    argv[k++] = p;
    argv[k++] = "--json";
    if (trace_requests) {
        snprintf(n, sizeof(n), "%" PRIu64, trace_requests);
        argv[k++] = "-n";
        argv[k++] = n;
    }
    for (; extra && *extra && k < 20; extra++)
        argv[k++] = *extra;
    argv[k++] = trace_path;
    argv[k] = NULL;
    rc = daemon_run(argv, out, sizeof(out), err, sizeof(err), 1800 * 1000);
    if (!daemon_json_valid(out)) {
        fprintf(stderr, "bench_replay: %s: kvcreplay exit %d, no report\n%s", name, rc, err);
        case_fail(name, "kvcreplay failed");
        return -1;
    }
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
        if (daemon_json_u64(out, ints[i].key, ints[i].v)) {
            case_fail(name, "kvcreplay's report lacks a field");
            return -1;
        }
    wrong_total += o->wrong;
    o->have_disk_writes = daemon_json_u64(out, "disk_writes", &o->disk_writes) == 0;
    daemon_json_u64(out, "demote_dropped", &o->dropped);
    daemon_json_u64(out, "evicted_blocks", &o->evicted);
    o->sim_ratio = json_double(out, "kvcsim", "block_hit_ratio", &o->have_sim);
    o->wall_s = json_double(out, NULL, "wall_s", &have);
    if (rc != 0 || o->wrong || o->errors || o->failed || o->requests == 0) {
        fprintf(stderr,
                "bench_replay: %s: kvcreplay exit %d, %" PRIu64 " wrong bytes, %" PRIu64
                " errors\n%s",
                name, rc, o->wrong, o->errors, err);
        case_fail(name, "kvcreplay reported a failure");
        return -1;
    }
    printf("  %-16s %" PRIu64 " requests, %d process%s: hit %.4f (host %" PRIu64 ", disk %" PRIu64
           " blocks), infinite %.4f, kvcsim %s%.4f, puts refused %" PRIu64 ", busy %" PRIu64
           ", disk writes %" PRIu64 ", evicted %" PRIu64 ", dropped unwritten %" PRIu64
           ", wall %.1f s\n",
           name, o->requests, procs, procs == 1 ? "" : "es", (double)o->hits / (double)o->looked_up,
           o->hits_host_tokens / 512, o->hits_disk_tokens / 512,
           (double)o->inf_hits / (double)o->looked_up, o->have_sim ? "" : "n/a ",
           o->have_sim ? o->sim_ratio : 0.0, o->refused, o->busy, o->disk_writes, o->evicted,
           o->dropped, o->wall_s);
    fflush(stdout);
    return 0;
}

/* kvcd with a host tier of `host_blocks` and, when disk_bytes, a disk tier in a fresh file. */
static int replay_daemon_start_bb(const char *name, struct daemon *d, uint64_t host_blocks,
                                  uint64_t block, uint64_t disk_bytes);

static int replay_daemon_start(const char *name, struct daemon *d, uint64_t host_blocks,
                               uint64_t disk_bytes)
{
    return replay_daemon_start_bb(name, d, host_blocks, BENCH_BLOCK, disk_bytes);
}

/* The same with blocks of `block` bytes. */
static int replay_daemon_start_bb(const char *name, struct daemon *d, uint64_t host_blocks,
                                  uint64_t block, uint64_t disk_bytes)
{
    char o_host[64], o_path[DAEMON_PATH_MAX + 32], o_cap[64], path[DAEMON_PATH_MAX];
    const char *args[24];
    int n = 0, rc;
    memset(d, 0, sizeof(*d));
    rc = daemon_dir_init(d);
    if (rc) {
        case_fail(name, "no temp dir");
        return -1;
    }
    snprintf(o_host, sizeof(o_host), "host.size=%" PRIu64, host_blocks * block);
    args[n++] = "-o";
    args[n++] = o_host;
    args[n++] = "-o";
    args[n++] = "host.page_size=256k"; /* 2048 and 10000 blocks are whole pages */
    if (disk_bytes) {
        disk_path(d, "disk.kvc", path, sizeof(path));
        unlink(path);
        snprintf(o_path, sizeof(o_path), "disk.path=%s", path);
        snprintf(o_cap, sizeof(o_cap), "disk.capacity=%" PRIu64, disk_bytes);
        args[n++] = "-o";
        args[n++] = o_path;
        args[n++] = "-o";
        args[n++] = o_cap;
        if (quick) {
            args[n++] = "-o";
            args[n++] = "disk.page=4m";
        }
    }
    args[n] = NULL;
    if (daemon_start(d, args)) {
        case_fail(name, "kvcd did not start");
        daemon_cleanup(d);
        return -1;
    }
    return 0;
}

static int replay_daemon_stop(const char *name, struct daemon *d)
{
    char path[DAEMON_PATH_MAX];
    int rc = daemon_stop(d);
    disk_path(d, "disk.kvc", path, sizeof(path));
    unlink(path);
    daemon_cleanup(d);
    if (rc != 0) {
        case_fail(name, "kvcd did not exit cleanly");
        return -1;
    }
    return 0;
}

static void bench_disk_cases(uint64_t distinct)
{
    /* Every distinct block on disk, with a quarter to spare for pages not yet compacted. */
    uint64_t disk = (distinct * BENCH_RECORD * 5 / 4 + (32ull << 20) + (16ull << 20) - 1) &
                    ~((16ull << 20) - 1);
    static const int procs[] = {1, 4};
    printf("disk tier %.0f MiB for %" PRIu64 " distinct blocks (%llu-byte records), host tier "
           "%llu blocks\n",
           (double)disk / 1048576.0, distinct, (unsigned long long)BENCH_RECORD,
           (unsigned long long)BENCH_HOST_DISK_BLOCKS);
    for (size_t i = 0; i < 2; i++) {
        char name[32];
        struct daemon d;
        struct replay_out o;
        snprintf(name, sizeof(name), "disk_p%d", procs[i]);
        if (!case_wanted(name) && !(procs[i] == 4 && case_wanted("disk_writes_p4")))
            continue;
        if (replay_daemon_start(name, &d, BENCH_HOST_DISK_BLOCKS, disk))
            continue;
        int rc = replay_run(name, &d, procs[i], &o);
        if (replay_daemon_stop(name, &d) || rc)
            continue;
        if (!o.have_disk_writes) {
            case_fail(name, "the daemon reports no disk_writes");
            continue;
        }
        bench_row_add(rows, 32, &nrows, name, (double)o.hits / (double)o.looked_up,
                      "block_hit_ratio", "infinite_cache",
                      (double)o.inf_hits / (double)o.looked_up);
        if (procs[i] == 4)
            bench_row_add(rows, 32, &nrows, "disk_writes_p4",
                          (double)o.disk_writes / (double)o.distinct, "writes_per_block", "limit",
                          1.1);
    }
}

static void bench_host_case(void)
{
    const char *name = "host_p4_10k";
    struct daemon d;
    struct replay_out o;
    int rc;
    if (!case_wanted(name))
        return;
    if (replay_daemon_start(name, &d, BENCH_HOST_BLOCKS, 0))
        return;
    rc = replay_run(name, &d, 4, &o);
    if (replay_daemon_stop(name, &d) || rc)
        return;
    if (!o.have_sim) {
        case_fail(name, "kvcreplay gave no kvcsim prediction");
        return;
    }
    bench_row_add(rows, 32, &nrows, name, (double)o.hits / (double)o.looked_up, "block_hit_ratio",
                  "kvcsim", o.sim_ratio);
}

/* The precision ladder through the daemon (docs/policies.md): a host tier of `blocks` blocks
 * of 64 KiB (the smallest a codec makes smaller: a head_dim of 32), `procs` processes, a
 * namespace that allows `codecs` under the default policy; baseline kvcsim's ladder on the same
 * requests and capacity, with the store's slot costs and the processes' overlap (kvcreplay
 * passes --layout, --page-size and --procs). Target: within 0.03 of it. */
static void bench_ladder_case(const char *name, const char *codecs, uint64_t blocks, int procs)
{
    const char *extra[] = {"--block-bytes", "64k", "--quant", codecs, NULL};
    struct daemon d;
    struct replay_out o;
    int rc;
    if (!case_wanted(name))
        return;
    if (replay_daemon_start_bb(name, &d, blocks, 64 << 10, 0))
        return;
    rc = replay_run_args(name, &d, procs, extra, &o);
    if (replay_daemon_stop(name, &d) || rc)
        return;
    if (!o.have_sim) {
        case_fail(name, "kvcreplay gave no kvcsim prediction");
        return;
    }
    bench_row_add(rows, 32, &nrows, name, (double)o.hits / (double)o.looked_up, "block_hit_ratio",
                  "kvcsim", o.sim_ratio);
}

/* ---- restart ------------------------------------------------------------------------------- */

/* A datagram socket for sd_notify at d->dir/notify.sock. The fd or -errno. */
static int notify_open(const struct daemon *d, char *path, size_t len)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    snprintf(path, len, "%.150s/notify.sock", d->dir);
    unlink(path);
    if (strlen(path) >= sizeof(a.sun_path)) {
        close(fd);
        return -ENAMETOOLONG;
    }
    memcpy(a.sun_path, path, strlen(path) + 1);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    return fd;
}

/* Starts kvcd with `args` and NOTIFY_SOCKET; seconds from the fork to READY=1, or < 0. */
static double restart_timed(struct daemon *d, const char *const *args)
{
    char npath[DAEMON_PATH_MAX];
    char msg[4096];
    double t0, t = -1;
    int fd = notify_open(d, npath, sizeof(npath));
    if (fd < 0) {
        fprintf(stderr, "bench_replay: notify socket: %s\n", strerror(-fd));
        return -1;
    }
    setenv("NOTIFY_SOCKET", npath, 1);
    t0 = now_s();
    if (daemon_spawn(d, args, &d->pid)) {
        d->pid = 0;
        goto out;
    }
    while (now_s() - t0 < 600) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ssize_t n;
        if (poll(&p, 1, 100) <= 0) {
            if (!daemon_alive(d))
                break;
            continue;
        }
        n = recv(fd, msg, sizeof(msg) - 1, 0);
        if (n <= 0)
            continue;
        msg[n] = 0;
        if (strncmp(msg, "READY=1", 7) == 0 || strstr(msg, "\nREADY=1")) {
            t = now_s() - t0;
            break;
        }
    }
out:
    unsetenv("NOTIFY_SOCKET");
    close(fd);
    unlink(npath);
    if (t < 0)
        fprintf(stderr, "bench_replay: kvcd sent no READY=1 (see %s)\n", d->log);
    else if (daemon_wait_ready(d, 20000))
        t = -1;
    return t;
}

static void restart_kill(struct daemon *d)
{
    if (d->pid) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
        d->pid = 0;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Three SIGKILLed starts: the median, and the best in *best. < 0 on a failure. */
static double restart_median(struct daemon *d, const char *const *args, double *best)
{
    double t[3];
    for (int i = 0; i < 3; i++) {
        t[i] = restart_timed(d, args);
        restart_kill(d);
        if (t[i] < 0)
            return -1;
    }
    qsort(t, 3, sizeof(t[0]), cmp_double);
    *best = t[0];
    return t[1];
}

/* Puts chains of BENCH_CHAIN blocks through a 16 MiB host tier until the disk tier starts
 * evicting (it is full), pacing on the daemon's demotions. The number of chains put, or < 0. */
static long restart_fill(const char *name, const struct daemon *d, uint64_t disk_bytes)
{
    struct kvc_layout lay = daemon_layout("bench-restart", 16);
    struct kvc_key keys[BENCH_CHAIN];
    kvc_client *c = NULL;
    kvc_ns *ns;
    long chains = 0, rc = -1;
    /* Blocks the engine drops instead of demoting need puts of their own: allow 8 disks' worth. */
    uint64_t max_chains = disk_bytes / BENCH_RECORD / BENCH_CHAIN * 8 + 64;
    uint64_t evicted = 0, full = 0, used = 0;
    double t0 = now_s(), last = t0;
    if (kvc_connect(d->sock, &c) || kvc_ns_open(c, &lay, &ns) ||
        kvc_ns_block_bytes(ns) != BENCH_BLOCK) {
        case_fail(name, "cannot open the fill namespace");
        goto out;
    }
    for (;;) {
        int ok = 0;
        if ((uint64_t)chains > max_chains) {
            fprintf(stderr,
                    "bench_replay: %s: %ld chains put; disk_evicted_blocks %" PRIu64
                    ", disk_full %" PRIu64 ", disk_used %" PRIu64 " of %" PRIu64 "\n",
                    name, chains, evicted, full, used, disk_bytes);
            case_fail(name, "the disk tier never filled up");
            goto out;
        }
        if (daemon_chain_keys(ns, (uint32_t)chains, 0, 0, BENCH_CHAIN, keys)) {
            case_fail(name, "keys");
            goto out;
        }
        /* A chain the host tier has no room for yet is retried once demotions free some. */
        for (int tries = 0; ok < BENCH_CHAIN; tries++) {
            kvc_resv *r;
            int n = kvc_reserve(ns, NULL, keys, BENCH_CHAIN, &r), done = 0;
            if (n < 0 && n != -ENOSPC) {
                fprintf(stderr, "bench_replay: %s: reserve: %s\n", name, kvc_strerror(n));
                case_fail(name, "a put failed");
                goto out;
            }
            for (int i = 0; n >= 0 && i < BENCH_CHAIN; i++) {
                int st = kvc_resv_status(r, (size_t)i);
                if (st == KVC_SLOT_PRESENT) {
                    done = i + 1;
                } else if (st == KVC_SLOT_RESERVED) {
                    daemon_block_fill(&keys[i], kvc_resv_data(r, (size_t)i), BENCH_BLOCK);
                    done = i + 1;
                }
            }
            if (n >= 0 && kvc_commit(r, SIZE_MAX) < 0) {
                case_fail(name, "a commit failed");
                goto out;
            }
            ok = done;
            if (ok < BENCH_CHAIN) {
                if (tries > 20000) {
                    case_fail(name, "the host tier never made room");
                    goto out;
                }
                usleep(500);
            }
        }
        chains++;
        if (chains % 32)
            continue;
        if (stat_get(c, "disk_evicted_blocks", &evicted) || stat_get(c, "disk_full", &full) ||
            stat_get(c, "disk_used", &used))
            goto out;
        if (now_s() - last > 5) {
            last = now_s();
            printf("    filling: %ld chains, disk %.0f of %.0f MiB, %.0f MiB/s\n", chains,
                   (double)used / 1048576.0, (double)disk_bytes / 1048576.0,
                   (double)chains * BENCH_CHAIN * BENCH_BLOCK / 1048576.0 / (last - t0));
            fflush(stdout);
        }
        if (evicted || full)
            break;
    }
    /* Let the last demotions land before the kill. */
    for (int i = 0; i < 3000; i++) {
        uint64_t w, m;
        if (stat_get(c, "disk_writes_inflight", &w) || stat_get(c, "disk_moves_inflight", &m))
            goto out;
        if (w + m == 0)
            break;
        usleep(10000);
    }
    rc = chains;
out:
    kvc_disconnect(c);
    return rc;
}

/* Reads back BENCH_SAMPLE chains written in the middle of the fill (older ones may have been
 * evicted from the disk, the newest may have been in memory only at the kill) and checks
 * every byte. Blocks found, or < 0. */
static long restart_verify(const char *name, const struct daemon *d, long chains)
{
    struct kvc_layout lay = daemon_layout("bench-restart", 16);
    struct kvc_key keys[BENCH_CHAIN];
    static uint8_t want[BENCH_BLOCK];
    kvc_client *c = NULL;
    kvc_ns *ns;
    long found = 0, rc = -1;
    if (kvc_connect(d->sock, &c) || kvc_ns_open(c, &lay, &ns)) {
        case_fail(name, "cannot reopen the fill namespace");
        goto out;
    }
    for (int s = 0; s < BENCH_SAMPLE; s++) {
        long chain = chains / 4 + (long)((uint64_t)s * (uint64_t)chains / 2 / BENCH_SAMPLE);
        kvc_lease *l = NULL;
        int hit;
        if (daemon_chain_keys(ns, (uint32_t)chain, 0, 0, BENCH_CHAIN, keys))
            goto out;
        hit = kvc_lookup(ns, keys, BENCH_CHAIN, 0, &l);
        if (hit < 0) {
            fprintf(stderr, "bench_replay: %s: lookup: %s\n", name, kvc_strerror(hit));
            case_fail(name, "a lookup failed");
            goto out;
        }
        for (int i = 0; i < hit; i++) {
            const uint8_t *p = kvc_lease_data(l, (size_t)i);
            uint64_t wrong = 0;
            daemon_block_fill(&keys[i], want, BENCH_BLOCK);
            for (size_t j = 0; j < BENCH_BLOCK; j++)
                wrong += p[j] != want[j];
            if (wrong)
                fprintf(stderr, "bench_replay: %s: chain %ld block %d: %" PRIu64 " wrong bytes\n",
                        name, chain, i, wrong);
            wrong_total += wrong;
        }
        found += hit;
        kvc_release(l);
    }
    rc = found;
out:
    kvc_disconnect(c);
    return rc;
}

static void bench_restart_case(const char *name, uint64_t disk_bytes)
{
    char o_path[DAEMON_PATH_MAX + 32], o_cap[64], path[DAEMON_PATH_MAX];
    const char *args[20];
    struct daemon d = {0};
    double empty, empty_best, full_s, full_best;
    uint64_t blocks = 0, used = 0, found_at_start = 0, from_ckpt = 0, walked = 0;
    long chains, verified;
    int n = 0;
    if (!case_wanted(name))
        return;
    if (daemon_dir_init(&d)) {
        case_fail(name, "no temp dir");
        return;
    }
    disk_path(&d, "disk.kvc", path, sizeof(path));
    snprintf(o_path, sizeof(o_path), "disk.path=%s", path);
    snprintf(o_cap, sizeof(o_cap), "disk.capacity=%" PRIu64, disk_bytes);
    args[n++] = "-o";
    args[n++] = "host.size=16m";
    args[n++] = "-o";
    args[n++] = "host.page_size=256k";
    args[n++] = "-o";
    args[n++] = o_path;
    args[n++] = "-o";
    args[n++] = o_cap;
    args[n++] = "-o";
    args[n++] = "disk.write_rate=0"; /* the fill as fast as the drive takes it */
    args[n++] = "-o";
    args[n++] = quick ? "disk.page=4m" : "disk.page=16m";
    args[n++] = "-o";
    args[n++] = "disk.checkpoint_interval=1s"; /* so the fill ends with a checkpoint soon */
    args[n] = NULL;

    /* Baseline: an empty disk tier of the same size (made by a first start). */
    unlink(path);
    if (daemon_start(&d, args)) {
        case_fail(name, "kvcd did not start");
        goto out;
    }
    restart_kill(&d);
    empty = restart_median(&d, args, &empty_best);
    if (empty < 0) {
        case_fail(name, "the empty start failed");
        goto out;
    }
    unlink(path);

    /* The same size, full of records written through the daemon. */
    if (daemon_start(&d, args)) {
        case_fail(name, "kvcd did not start");
        goto out;
    }
    chains = restart_fill(name, &d, disk_bytes);
    if (chains < 0)
        goto out;
    if (daemon_stat(&d, "disk_blocks", &blocks) || daemon_stat(&d, "disk_used", &used)) {
        case_fail(name, "no disk counters");
        goto out;
    }
    printf("  %-16s disk %.0f MiB: %" PRIu64 " records of %llu bytes on it (%.0f%% of the %llu "
           "it can hold), %.0f MiB used, %ld chains put\n",
           name, (double)disk_bytes / 1048576.0, blocks, (unsigned long long)BENCH_RECORD,
           100.0 * (double)blocks / (double)(disk_bytes / BENCH_RECORD),
           (unsigned long long)(disk_bytes / BENCH_RECORD), (double)used / 1048576.0, chains);
    if (blocks < disk_bytes / BENCH_RECORD * 3 / 4) {
        case_fail(name, "the disk tier holds less than 3/4 of what it can");
        goto out;
    }
    /* A daemon that has been running has a checkpoint from its last interval: wait for the
     * one written after the fill (nothing changed since), then the SIGKILL. */
    {
        uint64_t writes = 0, stale = 1, t0 = daemon_now_ms();
        while (daemon_now_ms() - t0 < 120000) {
            if (daemon_stat(&d, "disk_checkpoint_writes", &writes) ||
                daemon_stat(&d, "disk_checkpoint_stale", &stale))
                break;
            if (writes && !stale && daemon_now_ms() - t0 > 2500)
                break;
            usleep(100000);
        }
        if (!writes) {
            case_fail(name, "no checkpoint was written after the fill");
            goto out;
        }
    }
    restart_kill(&d);
    full_s = restart_median(&d, args, &full_best);
    if (full_s < 0) {
        case_fail(name, "a start on the full disk failed");
        goto out;
    }
    /* One more start, to read back what the restarts kept. */
    if (restart_timed(&d, args) < 0 || daemon_stat(&d, "disk_records_found", &found_at_start) ||
        daemon_stat(&d, "disk_start_records_checkpoint", &from_ckpt) ||
        daemon_stat(&d, "disk_start_records_walked", &walked)) {
        case_fail(name, "the last start failed");
        goto out;
    }
    verified = restart_verify(name, &d, chains);
    if (verified < 0)
        goto out;
    printf("  %-16s exec to READY: full %.3f s (best %.3f), empty %.3f s (best %.3f); "
           "%" PRIu64 " records found at start (%" PRIu64 " from the checkpoint, %" PRIu64
           " walked); %ld of %d sampled blocks read back\n",
           name, full_s, full_best, empty, empty_best, found_at_start, from_ckpt, walked, verified,
           BENCH_SAMPLE * BENCH_CHAIN);
    fflush(stdout);
    if (verified == 0) {
        case_fail(name, "no block survived the restart");
        goto out;
    }
    if (daemon_stop(&d) != 0) {
        case_fail(name, "kvcd did not exit cleanly");
        goto out;
    }
    bench_row_add(rows, 32, &nrows, name, full_s, "s", "empty_disk", empty);
out:
    restart_kill(&d);
    unlink(path);
    daemon_cleanup(&d);
}

int main(int argc, char **argv)
{
    const char *json = argc > 1 ? argv[1] : "build/bench/replay.json";
    const char *trace = getenv("KVC_TRACE");
    uint64_t distinct = 0, reqs = 0;
    int rc;
    /* make check's smoke run (KVC_BENCH_SMOKE, tests/bench/smoke.sh) uses the quick setup */
    quick = (getenv("KVC_BENCH_QUICK") && strcmp(getenv("KVC_BENCH_QUICK"), "0") != 0) ||
            (getenv("KVC_BENCH_SMOKE") && strcmp(getenv("KVC_BENCH_SMOKE"), "0") != 0);
    snprintf(trace_path, sizeof(trace_path), "%s",
             trace && *trace ? trace : KVC_SRC_DIR "/../shared/traces/conversation_trace.jsonl");
    trace_requests = quick ? BENCH_QUICK_REQUESTS : 0;
    signal(SIGPIPE, SIG_IGN);
    if (daemon_suite_init("bench-replay")) {
        fprintf(stderr, "bench_replay: no temp dir\n");
        return 1;
    }
    rc = trace_distinct(trace_path, trace_requests, &distinct, &reqs);
    if (rc) {
        fprintf(stderr, "bench_replay: %s: %s\n", trace_path, strerror(-rc));
        daemon_suite_fini();
        return 1;
    }
    printf("bench_replay: %s, %" PRIu64 " requests, %" PRIu64 " distinct blocks of %llu bytes%s\n",
           trace_path, reqs, distinct, (unsigned long long)BENCH_BLOCK,
           quick ? " (KVC_BENCH_QUICK)" : "");
    fflush(stdout);
    if (case_wanted("disk"))
        bench_disk_cases(distinct);
    bench_host_case();
    bench_ladder_case("ladder_q8_0_10k", "q8_0", BENCH_HOST_BLOCKS, 1);
    bench_ladder_case("ladder_q8_q4_10k", "q8_0,q4_1", BENCH_HOST_BLOCKS, 1);
    bench_ladder_case("ladder_q8_q4_10k_p4", "q8_0,q4_1", BENCH_HOST_BLOCKS, 4);
    bench_ladder_case("ladder_q8_q4_1k", "q8_0,q4_1", 1024, 1);
    bench_ladder_case("ladder_q8_q4_1k_p4", "q8_0,q4_1", 1024, 4);
    bench_restart_case(quick ? "restart_128m" : "restart_2g", quick ? 128ull << 20 : 2ull << 30);
    bench_restart_case(quick ? "restart_256m" : "restart_8g", quick ? 256ull << 20 : 8ull << 30);
    /* Must be 0: a count, no ratio (a zero baseline is no baseline). */
    bench_row_add(rows, 32, &nrows, "wrong_bytes", (double)wrong_total, "bytes", NULL, 0);
    if (wrong_total)
        failures++;

    printf("\n%-20s %12s %-16s %-16s %12s %8s %s\n", "case", "value", "unit", "baseline",
           "base value", "ratio", "target");
    for (size_t i = 0; i < nrows; i++) {
        const struct bench_row *r = &rows[i];
        const char *target =
            strncmp(r->name, "disk_p", 6) == 0 || strcmp(r->name, "host_p4_10k") == 0
                ? "ratio >= 0.97"
            : strncmp(r->name, "ladder", 6) == 0     ? "|ratio - 1| <= 0.03"
            : strcmp(r->name, "disk_writes_p4") == 0 ? "value <= 1.1"
            : strncmp(r->name, "restart", 7) == 0
                ? (strstr(r->name, "8g") || strstr(r->name, "256m") ? "<= 2 s" : "<= 1 s")
                : "0";
        printf("%-20s %12.4f %-16s %-16s %12.4f %8.3f %s\n", r->name, r->value, r->unit,
               r->baseline ? r->baseline : "-", r->base, r->base > 0 ? r->value / r->base : 0.0,
               target);
    }
    rc = bench_finish(json, rows, nrows);
    printf("\nwrote %s%s\n", json, failures ? "; some cases FAILED (see above)" : "");
    daemon_suite_fini();
    return rc || failures ? 1 : 0;
}
