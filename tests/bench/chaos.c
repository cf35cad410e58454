/*
 * chaos.c — make chaos: a real kvcd with a small host arena and a disk tier, client
 * processes SIGKILLed at random moments in the middle of lookups, reservations, commits and
 * waits, and the daemon itself SIGKILLed and restarted under that load. Usage: chaos OUT.json.
 *
 * DESIGN
 * The parent starts kvcd (16 MiB host arena, 256 MiB disk tier, a checkpoint every second,
 * disk.put_wait at its default) and keeps CHAOS_CLIENTS children alive. Each child opens its
 * own connection and loops over the public API: lookups (with KVC_LOOKUP_NOWAIT and
 * kvc_lease_wait, or waiting), reservations written in place then committed in full, in
 * part or aborted, kvc_put_prefix, leases and reservations held for a while. Block bytes
 * are a function of the key (daemon_block_fill), so every byte of every hit is compared and
 * the wrong ones counted in a shared page. Every few ms the parent SIGKILLs a random child
 * and forks a new one, CHAOS_CLIENT_KILLS times. CHAOS_DAEMON_KILLS times, spread over the
 * run, it lists the blocks whose record, and every ancestor's, is on disk (kvcd drops a
 * record whose parent lived only in memory at start, by design), waits until two
 * checkpoints have been written after the listing (disk_checkpoint_writes, so one started
 * after it completed) or sees disk_checkpoint_stale = 0 (none is due), at most 15 s,
 * SIGKILLs kvcd, restarts it on the same files and reads a sample of those blocks back: each
 * must be a hit with the right bytes (without a checkpoint too: the start walks the pages
 * written since). Every cycle must verify blocks: one that reads none back fails the run,
 * as does a run whose restart_blocks_verified is 0. Children that lose the daemon reconnect. Keys
 * come from a bounded set (CHAOS_FAMILIES chains of shared prefix plus variants) whose
 * records fit the disk several times over, so the disk never has to evict one and a miss
 * after a restart is a lost block, not a policy decision.
 * At the end every child is killed, the gauges must fall to zero (pins_now, reserved_now,
 * reserved_bytes_now), every block still listed is read and checked, and a SIGTERM must
 * stop kvcd with status 0. kvcd exiting in any other way than by our SIGKILL is a crash.
 * Every wait has a deadline; CHAOS_SECONDS bounds the whole run; every process comes from
 * daemon_fork() and dies with the parent.
 * Rows (no baseline): wrong_bytes, leaked_pins, leaked_reservations, daemon_crashes,
 * restart_lost_blocks (all must be 0), client_kills, daemon_kills, blocks_verified,
 * restart_blocks_verified.
 * CHAOS_QUANT=1: the namespace allows q8_0 and q4_1, so the daemon's precision ladder steps
 * blocks down (in memory, on their way to disk and back) under the same kills; block values
 * are smooth, a raw hit must match exactly and a lossy one decode within its codec's bound;
 * row lossy_blocks_verified (must not be 0).
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/lib/bench.h"
#include "tests/lib/daemon.h"
#include "tests/lib/rng.h"

#define CHAOS_MODEL "chaos"
#define CHAOS_TOKENS 16  /* 16 KiB blocks with daemon_layout */
#define CHAOS_FAMILIES 64
#define CHAOS_VARIANTS 16
#define CHAOS_SHARED 4   /* blocks of a chain that depend on the family alone */
#define CHAOS_CHAIN 8    /* at most: 64 * (4 + 16 * 4) = 4352 blocks, 87 MiB of records */
#define CHAOS_SAMPLE 256 /* blocks read back after each restart */
#define CHAOS_MAX_CHILDREN 16
#define CHAOS_ERRNOS 160

/* Written by every child, read by the parent: one page of MAP_SHARED memory made before the
 * first fork. Updated with __atomic builtins. */
struct chaos_shared {
    uint64_t wrong_bytes;
    uint64_t wrong_blocks;
    uint64_t verified;
    uint64_t lossy_verified; /* CHAOS_QUANT: hits stored in a lossy codec, within its bound */
    uint64_t lookups, hits, reserves, commits, committed, aborts, puts, waits;
    uint64_t sessions; /* connections opened */
    uint64_t errs[CHAOS_ERRNOS]; /* failed calls by errno */
};

static struct chaos_shared *sh;
static struct daemon d;
static const char *dargs[16];
static uint64_t run_deadline; /* daemon_now_ms() */
static bool quant; /* CHAOS_QUANT=1: namespaces that allow q8_0 and q4_1 (the ladder) */

static uint64_t env_u64(const char *name, uint64_t def)
{
    const char *s = getenv(name);
    return s && *s ? strtoull(s, NULL, 10) : def;
}

static void add(uint64_t *p, uint64_t v)
{
    __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

static void err_count(int rc)
{
    int e = -rc;
    add(&sh->errs[e > 0 && e < CHAOS_ERRNOS ? e : 0], 1);
}

/* A block's bytes, a function of its key: any bytes when every hit must match exactly,
 * smooth values (tests/lib/daemon.h) when hits may be lossy, so a decoded block's error
 * measures its codec. */
static void block_fill(const struct kvc_key *k, void *p, size_t bb)
{
    if (quant)
        daemon_smooth_fill(k, p, bb / 2);
    else
        daemon_block_fill(k, p, bb);
}

static void wrong_block(const struct kvc_key *k, uint64_t wrong, long first, const char *who)
{
    add(&sh->wrong_bytes, wrong);
    if (__atomic_fetch_add(&sh->wrong_blocks, 1, __ATOMIC_RELAXED) < 20)
        fprintf(stderr,
                "chaos: %s: key %016" PRIx64 "%016" PRIx64 ": %" PRIu64 " wrong bytes, first at %ld\n",
                who, k->hi, k->lo, wrong, first);
}

/* Checks hit i of a lease against its key; counts the wrong ones. Raw hits must hold the
 * key's bytes exactly; with CHAOS_QUANT a lossy hit must decode within its codec's bound
 * (q8_0 0.02, q4_1 0.12 relative error, as check_e2e_quant), any other codec is wrong. want:
 * bb bytes of scratch. */
static void hit_verify(const kvc_lease *l, size_t i, const struct kvc_key *k, size_t bb,
                       uint8_t *want, const char *who)
{
    add(&sh->verified, 1);
    if (quant) {
        const void *data;
        size_t len;
        int f = kvc_lease_stored(l, i, &data, &len);
        if (f < 0 || kvc_lease_copy(l, i, want, bb) != 0) {
            wrong_block(k, bb, 0, who);
            return;
        }
        double e = daemon_smooth_err(k, (const uint16_t *)want, bb / 2);
        double bound = f == KVC_CODEC_RAW ? 0.0 : f == KVC_CODEC_Q8_0 ? 0.02
                                                : f == KVC_CODEC_Q4_1 ? 0.12 : -1.0;
        if (f == KVC_CODEC_RAW ? e != 0.0 : !(e < bound)) {
            fprintf(stderr, "chaos: %s: stored as codec %d, relative error %g\n", who, f, e);
            wrong_block(k, bb, 0, who);
        } else if (f != KVC_CODEC_RAW) {
            add(&sh->lossy_verified, 1);
        }
        return;
    }
    const uint8_t *p = kvc_lease_data(l, i);
    daemon_block_fill(k, want, bb);
    if (memcmp(p, want, bb)) {
        uint64_t wrong = 0;
        for (size_t j = 0; j < bb; j++)
            wrong += p[j] != want[j];
        wrong_block(k, wrong, daemon_block_check(k, p, bb), who);
    }
}

/* The namespace of the run: raw, or with CHAOS_QUANT q8_0 (the recipe) and q4_1 allowed. */
static int chaos_ns_open(kvc_client *c, kvc_ns **ns)
{
    struct kvc_layout lay = daemon_layout(CHAOS_MODEL, CHAOS_TOKENS);
    struct kvc_quant q = {.allowed = 1u << KVC_CODEC_Q8_0 | 1u << KVC_CODEC_Q4_1,
                          .k_codec = KVC_CODEC_Q8_0,
                          .v_codec = KVC_CODEC_Q8_0};
    return quant ? kvc_ns_open_quant(c, &lay, &q, ns) : kvc_ns_open(c, &lay, ns);
}

/* Errors a live connection may return in normal operation. */
static bool err_benign(int rc)
{
    return rc == -EDQUOT || rc == -EMFILE || rc == -ENOSPC || rc == -ETIMEDOUT || rc == -EBUSY ||
           rc == -EAGAIN;
}

/* One operation on a random chain. 0, or a negative errno after which the connection is
 * dropped. */
static int client_op(kvc_ns *ns, uint64_t *rs, size_t bb, uint8_t *want, void **bufs)
{
    struct kvc_key keys[CHAOS_CHAIN];
    uint32_t fam = (uint32_t)(rng_next(rs) % CHAOS_FAMILIES);
    uint32_t var = (uint32_t)(rng_next(rs) % CHAOS_VARIANTS);
    uint32_t n = 1 + (uint32_t)(rng_next(rs) % CHAOS_CHAIN);
    uint64_t op = rng_next(rs) % 20;
    int rc = daemon_chain_keys(ns, fam, var, CHAOS_SHARED, n, keys);
    if (rc)
        return rc;
    if (op < 9) { /* lookup: NOWAIT + wait, NOWAIT + whatever is ready, or waiting */
        unsigned flags = op < 7 ? KVC_LOOKUP_NOWAIT : 0;
        kvc_lease *l = NULL;
        int hit = kvc_lookup(ns, keys, n, flags, &l), ready;
        add(&sh->lookups, 1);
        if (hit <= 0) {
            rc = hit;
            goto out;
        }
        add(&sh->hits, (uint64_t)hit);
        if (op < 5) {
            ready = kvc_lease_wait(l, 2000);
            add(&sh->waits, 1);
        } else {
            ready = kvc_lease_ready(l);
        }
        if (ready < 0) {
            kvc_release(l);
            rc = ready;
            goto out;
        }
        if ((size_t)ready > kvc_lease_count(l))
            ready = (int)kvc_lease_count(l);
        for (int i = 0; i < ready; i++)
            hit_verify(l, (size_t)i, &keys[i], bb, want, "hit");
        if (rng_next(rs) % 8 == 0)
            usleep((useconds_t)(rng_next(rs) % 4000)); /* killed holding pins, sometimes */
        rc = kvc_release(l);
    } else if (op < 17) { /* reserve, write in place, commit all / part / abort */
        kvc_resv *r = NULL;
        int got = kvc_reserve(ns, NULL, keys, n, &r);
        uint64_t how = rng_next(rs) % 8;
        add(&sh->reserves, 1);
        if (got < 0) {
            rc = got;
            goto out;
        }
        for (uint32_t i = 0; i < n; i++) {
            void *p = kvc_resv_status(r, i) == KVC_SLOT_RESERVED ? kvc_resv_data(r, i) : NULL;
            if (!p)
                continue;
            if (how == 7 && i == n / 2) { /* killed mid-write, sometimes */
                memset(p, 0xa5, bb);
                usleep((useconds_t)(rng_next(rs) % 3000));
            }
            block_fill(&keys[i], p, bb);
        }
        if (how == 6)
            usleep((useconds_t)(rng_next(rs) % 3000)); /* killed holding slots */
        if (how == 0) {
            rc = kvc_abort(r);
            add(&sh->aborts, 1);
        } else {
            int c = kvc_commit(r, how == 1 ? (size_t)(rng_next(rs) % (n + 1)) : SIZE_MAX);
            add(&sh->commits, 1);
            if (c > 0)
                add(&sh->committed, (uint64_t)c);
            rc = c < 0 ? c : 0;
        }
    } else { /* whole prefix */
        for (uint32_t i = 0; i < n; i++)
            block_fill(&keys[i], bufs[i], bb);
        rc = kvc_put_prefix(ns, NULL, keys, n, (const void *const *)bufs);
        add(&sh->puts, 1);
        if (rc > 0)
            add(&sh->committed, (uint64_t)rc);
        rc = rc < 0 ? rc : 0;
    }
out:
    if (rc < 0)
        err_count(rc);
    return rc < 0 && !err_benign(rc) ? rc : 0;
}

/* A child: connects, works until the connection breaks, connects again; until killed (or
 * the run's deadline). */
static void client_main(uint64_t seed)
{
    uint64_t rs = seed * 0x9e3779b97f4a7c15ull + (uint64_t)getpid();
    size_t bb = 0;
    uint8_t *want = NULL;
    void *bufs[CHAOS_CHAIN];
    for (int i = 0; i < CHAOS_CHAIN; i++)
        bufs[i] = NULL;
    if (!rs)
        rs = 1;
    while (daemon_now_ms() < run_deadline + 30000) {
        kvc_client *c = NULL;
        kvc_ns *ns = NULL;
        int rc = kvc_connect(d.sock, &c);
        if (!rc)
            rc = chaos_ns_open(c, &ns);
        if (rc) {
            kvc_disconnect(c);
            usleep(1000 + (useconds_t)(rng_next(&rs) % 4000));
            continue;
        }
        add(&sh->sessions, 1);
        if (!want) {
            bb = kvc_ns_block_bytes(ns);
            want = malloc(bb);
            for (int i = 0; i < CHAOS_CHAIN; i++)
                bufs[i] = malloc(bb);
        }
        while (client_op(ns, &rs, bb, want, bufs) == 0)
            ;
        kvc_disconnect(c);
    }
    _exit(0);
}

/* ---- the parent -------------------------------------------------------------------------- */

static pid_t kids[CHAOS_MAX_CHILDREN];
static int nkids;
static uint64_t client_kills, client_exits, daemon_kills, daemon_crashes, spawned;
static uint64_t rs_parent = 0x2545f4914f6cdd1dull;

static pid_t kid_spawn(void)
{
    pid_t p = daemon_fork();
    if (p == 0)
        client_main(++spawned);
    spawned++;
    return p;
}

/* A crash: kvcd exited while we did not kill it. Restarts it. */
static int daemon_check(void)
{
    int st;
    pid_t p = waitpid(d.pid, &st, WNOHANG);
    if (p == 0)
        return 0;
    daemon_crashes++;
    fprintf(stderr, "chaos: kvcd exited on its own (%s %d); log: %s\n",
            WIFSIGNALED(st) ? "signal" : "status", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st),
            d.log);
    d.pid = 0;
    if (daemon_start(&d, dargs)) {
        bench_fail("kvcd does not start again after a crash");
        return -1;
    }
    return 0;
}

/* One client kill after a random pause of 1-6 ms; respawns. Children that exited on their
 * own are replaced too. */
static void kill_tick(void)
{
    int i, st;
    usleep(1000 + (useconds_t)(rng_next(&rs_parent) % 5000));
    for (i = 0; i < nkids; i++)
        if (waitpid(kids[i], &st, WNOHANG) == kids[i]) {
            client_exits++;
            fprintf(stderr, "chaos: a client exited on its own (%s %d)\n",
                    WIFSIGNALED(st) ? "signal" : "status",
                    WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
            kids[i] = kid_spawn();
        }
    i = (int)(rng_next(&rs_parent) % (uint64_t)nkids);
    kill(kids[i], SIGKILL);
    if (daemon_child_wait(kids[i], daemon_ms(5000), NULL) != -1)
        fprintf(stderr, "chaos: a killed client was not reaped in time\n");
    client_kills++;
    kids[i] = kid_spawn();
}

struct chaos_conn {
    kvc_client *c;
    kvc_ns *ns;
};

static int conn_open(struct chaos_conn *cc)
{
    int rc = kvc_connect(d.sock, &cc->c);
    if (!rc)
        rc = chaos_ns_open(cc->c, &cc->ns);
    if (rc) {
        kvc_disconnect(cc->c);
        cc->c = NULL;
    }
    return rc;
}

static void conn_close(struct chaos_conn *cc)
{
    kvc_disconnect(cc->c);
    cc->c = NULL;
}

static bool key_eq(const struct kvc_key *a, const struct kvc_key *b)
{
    return a->lo == b->lo && a->hi == b->hi;
}

/* The index of key k in bi[0..n) through the open-addressing table tab[0..cap) (entries are
 * index + 1), or -1. */
static long info_find(const struct kvc_block_info *bi, const uint32_t *tab, size_t cap,
                      const struct kvc_key *k)
{
    for (size_t h = (size_t)(k->lo ^ k->hi) & (cap - 1);; h = (h + 1) & (cap - 1)) {
        if (!tab[h])
            return -1;
        if (key_eq(&bi[tab[h] - 1].key, k))
            return (long)tab[h] - 1;
    }
}

/* Keys of the namespace's blocks, a reservoir sample of at most max. With disk_only, only
 * blocks whose record and every ancestor's record are on disk: kvcd takes a record back at
 * start only when its parent is there (docs/design/disk.md, Persistence), so a record under a
 * parent held only in memory is dropped by design; those are counted in *orphans. Count, or
 * -errno. */
static long blocks_sample(struct chaos_conn *cc, bool disk_only, struct kvc_key *out, long max,
                          long *orphans)
{
    struct kvc_block_info *all = NULL;
    uint32_t *tab = NULL;
    size_t nall = 0, cap = 0;
    uint64_t cursor = 0;
    long seen = 0, rc;
    do {
        struct kvc_block_info *bi = NULL, *grown;
        size_t n = 0;
        rc = kvc_block_list(cc->c, kvc_ns_id(cc->ns), &cursor, 1024, &bi, &n);
        if (rc)
            goto out;
        grown = realloc(all, (nall + n + 1) * sizeof(*all));
        if (!grown) {
            free(bi);
            rc = -ENOMEM;
            goto out;
        }
        all = grown;
        memcpy(all + nall, bi, n * sizeof(*bi));
        nall += n;
        free(bi);
    } while (cursor);
    for (cap = 16; cap < 2 * nall; cap *= 2)
        ;
    tab = calloc(cap, sizeof(*tab));
    if (!tab) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < nall; i++) {
        size_t h = (size_t)(all[i].key.lo ^ all[i].key.hi) & (cap - 1);
        while (tab[h])
            h = (h + 1) & (cap - 1);
        tab[h] = (uint32_t)i + 1;
    }
    if (orphans)
        *orphans = 0;
    for (size_t i = 0; i < nall; i++) {
        if (disk_only) {
            const struct kvc_block_info *b = &all[i];
            int depth = 0;
            if (!b->on_disk)
                continue;
            while ((b->parent.lo || b->parent.hi) && depth++ < 64) {
                long p = info_find(all, tab, cap, &b->parent);
                b = p < 0 ? NULL : &all[p];
                if (!b || !b->on_disk)
                    break;
            }
            if (!b || !b->on_disk || depth >= 64) {
                if (orphans)
                    (*orphans)++;
                continue;
            }
        }
        if (seen < max) {
            out[seen] = all[i].key;
        } else {
            uint64_t j = rng_next(&rs_parent) % (uint64_t)(seen + 1);
            if (j < (uint64_t)max)
                out[j] = all[i].key;
        }
        seen++;
    }
    rc = seen < max ? seen : max;
out:
    free(tab);
    free(all);
    return rc;
}

/* Reads keys one by one (waiting for the disk) and checks their bytes. Hits, or -errno. */
static long blocks_read(struct chaos_conn *cc, const struct kvc_key *keys, long n,
                        const char *who, uint8_t *want)
{
    size_t bb = kvc_ns_block_bytes(cc->ns);
    long found = 0;
    for (long i = 0; i < n; i++) {
        kvc_lease *l = NULL;
        int hit = kvc_lookup(cc->ns, &keys[i], 1, 0, &l);
        if (hit < 0)
            return hit;
        if (hit == 1) {
            hit_verify(l, 0, &keys[i], bb, want, who);
            found++;
        } else if (!strcmp(who, "restart") && found + 8 > i) {
            fprintf(stderr, "chaos: restart: key %016" PRIx64 "%016" PRIx64 " is gone\n",
                    keys[i].hi, keys[i].lo);
        }
        kvc_release(l);
    }
    return found;
}

/* Counters that explain a cycle, on one line. */
static void stats_line(struct chaos_conn *cc, const char *what, const char *const *names)
{
    printf("    %s:", what);
    for (; *names; names++) {
        uint64_t v = 0;
        if (daemon_client_stat(cc->c, 0, *names, &v) == 0)
            printf(" %s=%" PRIu64, *names, v);
    }
    printf("\n");
}

static const char *const stats_before[] = {
    "blocks_now", "disk_blocks", "disk_used", "evicted_blocks", "demote_dropped",
    "disk_evicted_blocks", "disk_records_forgotten", "checksum_failures",
    "disk_checkpoint_records", "disk_checkpoint_stale", "quantized_blocks", "ladder_steps",
    "hit_blocks_lossy", NULL};
static const char *const stats_after[] = {
    "blocks_now", "disk_blocks", "disk_start_checkpoint", "disk_start_records_checkpoint",
    "disk_start_records_walked", NULL};

static uint64_t restart_expected, restart_found, ckpt_timeouts, cycles_empty;

/* List the blocks on disk, wait for two checkpoints after it (clients still being killed),
 * SIGKILL kvcd, start it again, read the sample back. */
static int daemon_cycle(struct kvc_key *sample, uint8_t *want)
{
    struct chaos_conn cc = {0};
    uint64_t c0 = 0, c = 0, t0;
    long n, orphans = 0;
    int rc = -1;
    if (conn_open(&cc) || daemon_client_stat(cc.c, 0, "disk_checkpoint_writes", &c0)) {
        bench_fail("cycle %" PRIu64 ": cannot connect to kvcd", daemon_kills + 1);
        goto out;
    }
    n = blocks_sample(&cc, true, sample, CHAOS_SAMPLE, &orphans);
    if (n < 0) {
        bench_fail("cycle %" PRIu64 ": block list: %s", daemon_kills + 1, kvc_strerror((int)n));
        goto out;
    }
    t0 = daemon_now_ms();
    /* Two checkpoints after the listing, or none needed: disk_checkpoint_stale = 0 (no record
     * changed since the latest one; kvcd writes none then) seen at least 2.5 s after it. */
    while (c < c0 + 2) {
        uint64_t stale = 1;
        if (daemon_now_ms() - t0 > 2500 &&
            !daemon_client_stat(cc.c, 0, "disk_checkpoint_stale", &stale) && !stale)
            break;
        if (daemon_now_ms() - t0 > (uint64_t)daemon_ms(15000)) {
            /* Verified all the same: a record whose write completed is found at the start,
             * from a checkpoint or by walking the pages written since. */
            fprintf(stderr,
                    "chaos: cycle %" PRIu64 ": no checkpoint in 15 s; the restart "
                    "must find the sample all the same\n",
                    daemon_kills + 1);
            ckpt_timeouts++;
            break;
        }
        kill_tick();
        if (daemon_client_stat(cc.c, 0, "disk_checkpoint_writes", &c)) {
            daemon_check();
            bench_fail("cycle %" PRIu64 ": lost kvcd while waiting for a checkpoint",
                       daemon_kills + 1);
            goto out;
        }
    }
    stats_line(&cc, "before the kill", stats_before);
    conn_close(&cc);
    if (daemon_check())
        goto out;
    kill(d.pid, SIGKILL);
    waitpid(d.pid, NULL, 0);
    d.pid = 0;
    daemon_kills++;
    if (daemon_start(&d, dargs)) {
        bench_fail("cycle %" PRIu64 ": kvcd does not start again", daemon_kills);
        goto out;
    }
    if (conn_open(&cc)) {
        bench_fail("cycle %" PRIu64 ": cannot connect after the restart", daemon_kills);
        goto out;
    }
    stats_line(&cc, "after the start", stats_after);
    {
        long found = blocks_read(&cc, sample, n, "restart", want);
        if (found < 0) {
            bench_fail("cycle %" PRIu64 ": read back: %s", daemon_kills,
                       kvc_strerror((int)found));
            goto out;
        }
        restart_expected += (uint64_t)n;
        restart_found += (uint64_t)found;
        if (found == 0) {
            /* A cycle that reads nothing back proves nothing about the restart. */
            bench_fail("cycle %" PRIu64 ": no block verified after the restart (%ld sampled "
                       "on disk)",
                       daemon_kills, n);
            cycles_empty++;
        }
        printf("  cycle %2" PRIu64 ": %4ld blocks on disk with their chain sampled, %4ld back "
               "after the restart (%ld on disk under a parent only in memory; %" PRIu64
               " client kills so far)\n",
               daemon_kills, n, found, orphans, client_kills);
        fflush(stdout);
    }
    rc = 0;
out:
    conn_close(&cc);
    return rc;
}

/* Polls the gauges until pins and reservations are gone (clients_now may count us). */
static int gauges_settle(uint64_t *pins, uint64_t *resv, uint64_t *resv_bytes)
{
    uint64_t t0 = daemon_now_ms(), clients = 0;
    int rc;
    do {
        rc = daemon_stat(&d, "pins_now", pins);
        if (!rc)
            rc = daemon_stat(&d, "reserved_now", resv);
        if (!rc)
            rc = daemon_stat(&d, "reserved_bytes_now", resv_bytes);
        if (!rc)
            rc = daemon_stat(&d, "clients_now", &clients);
        if (rc)
            return rc;
        if (!*pins && !*resv && !*resv_bytes && clients <= 1)
            return 0;
        usleep(100000);
    } while (daemon_now_ms() - t0 < (uint64_t)daemon_ms(10000));
    fprintf(stderr, "chaos: after 10 s: pins_now %" PRIu64 " reserved_now %" PRIu64
            " reserved_bytes_now %" PRIu64 " clients_now %" PRIu64 "\n",
            *pins, *resv, *resv_bytes, clients);
    return 0;
}

/* Disk requests still in flight once every client is gone: they must drain within 10 s.
 * What is left, or 0. */
static uint64_t inflight_settle(void)
{
    static const char *const names[] = {"disk_reads_inflight", "disk_writes_inflight",
                                        "disk_moves_inflight"};
    uint64_t t0 = daemon_now_ms(), sum = 0;
    do {
        sum = 0;
        for (int i = 0; i < 3; i++) {
            uint64_t v = 0;
            if (daemon_stat(&d, names[i], &v) == 0)
                sum += v;
        }
        if (!sum)
            return 0;
        usleep(100000);
    } while (daemon_now_ms() - t0 < (uint64_t)daemon_ms(10000));
    fprintf(stderr, "chaos: %" PRIu64 " disk requests still in flight after 10 s idle\n", sum);
    return sum;
}

/* Every gauge-like counter (a name ending in _now, or holding inflight/pending/waiting),
 * printed; those about leases, waits and pins that are not zero count as leaks. */
static uint64_t gauges_print(const char *when)
{
    struct chaos_conn cc = {0};
    struct kvc_stat *s = NULL;
    size_t n = 0;
    uint64_t leaks = 0;
    if (conn_open(&cc) || kvc_stats(cc.c, 0, &s, &n)) {
        conn_close(&cc);
        return 0;
    }
    printf("  gauges %s:", when);
    for (size_t i = 0; i < n; i++) {
        const char *nm = s[i].name;
        size_t l = strlen(nm);
        bool gauge = (l > 4 && !strcmp(nm + l - 4, "_now")) || strstr(nm, "inflight") ||
                     strstr(nm, "pending") || strstr(nm, "waiting");
        if (!gauge)
            continue;
        printf(" %s=%" PRIu64, nm, s[i].value);
        if (s[i].value && (strstr(nm, "lease") || strstr(nm, "wait") || strstr(nm, "pending")))
            leaks++;
    }
    printf("\n");
    free(s);
    conn_close(&cc);
    return leaks;
}

int main(int argc, char **argv)
{
    static struct bench_row rows[16];
    size_t nrows = 0;
    uint64_t kill_target = env_u64("CHAOS_CLIENT_KILLS", 10000);
    uint64_t dkill_target = env_u64("CHAOS_DAEMON_KILLS", 20);
    uint64_t seconds = env_u64("CHAOS_SECONDS", 480), t_start;
    int clients = (int)env_u64("CHAOS_CLIENTS", 6);
    char o_path[DAEMON_PATH_MAX + 32], path[DAEMON_PATH_MAX];
    uint64_t pins = 0, resv = 0, resv_bytes = 0, other_leaks = 0, final_verified = 0;
    struct kvc_key *sample = NULL;
    uint8_t *want = NULL;
    int n = 0, st = 0;
    if (argc != 2) {
        fprintf(stderr, "usage: chaos OUT.json\n");
        return 2;
    }
    if (clients < 1 || clients > CHAOS_MAX_CHILDREN)
        clients = 6;
    quant = env_u64("CHAOS_QUANT", 0) != 0;
    signal(SIGPIPE, SIG_IGN);
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    sample = calloc(8192, sizeof(*sample));
    want = malloc(1 << 20);
    if (sh == MAP_FAILED || !sample || !want || daemon_suite_init("chaos") ||
        daemon_dir_init(&d)) {
        fprintf(stderr, "chaos: setup failed\n");
        return 1;
    }
    snprintf(path, sizeof(path), "%.180s/disk.kvc", d.dir);
    snprintf(o_path, sizeof(o_path), "disk.path=%s", path);
    dargs[n++] = "-o";
    dargs[n++] = "host.size=16m";
    dargs[n++] = "-o";
    dargs[n++] = "host.page_size=256k";
    dargs[n++] = "-o";
    dargs[n++] = o_path;
    dargs[n++] = "-o";
    dargs[n++] = "disk.capacity=256m";
    dargs[n++] = "-o";
    dargs[n++] = "disk.page=4m";
    dargs[n++] = "-o";
    dargs[n++] = "disk.checkpoint_interval=1s";
    dargs[n] = NULL;

    printf("chaos: kvcd with a 16 MiB host arena and a 256 MiB disk tier, %d clients, "
           "%" PRIu64 " client kills, %" PRIu64 " daemon kills, at most %" PRIu64 " s%s\n",
           clients, kill_target, dkill_target, seconds,
           quant ? ", blocks that may step down to q8_0 and q4_1" : "");
    fflush(stdout);
    t_start = daemon_now_ms();
    run_deadline = t_start + seconds * 1000;
    if (daemon_start(&d, dargs)) {
        bench_fail("kvcd does not start");
        goto end;
    }
    for (nkids = 0; nkids < clients; nkids++)
        kids[nkids] = kid_spawn();
    while (client_kills < kill_target || daemon_kills < dkill_target) {
        uint64_t next = (daemon_kills + 1) * kill_target / (dkill_target + 1);
        if (daemon_now_ms() > run_deadline) {
            bench_fail("out of time after %" PRIu64 " client and %" PRIu64 " daemon kills",
                       client_kills, daemon_kills);
            break;
        }
        if (daemon_check())
            break;
        if (daemon_kills < dkill_target && client_kills >= next) {
            if (daemon_cycle(sample, want))
                break;
            continue;
        }
        kill_tick();
        if (client_kills % 1000 == 0) {
            printf("  %" PRIu64 " client kills, %" PRIu64 " blocks verified, %.0f s\n",
                   client_kills, sh->verified, (double)(daemon_now_ms() - t_start) / 1000.0);
            fflush(stdout);
        }
    }
    for (int i = 0; i < nkids; i++) {
        kill(kids[i], SIGKILL);
        daemon_child_wait(kids[i], daemon_ms(5000), NULL);
    }
    nkids = 0;
    if (daemon_check())
        goto end;

    if (gauges_settle(&pins, &resv, &resv_bytes))
        bench_fail("no gauges from kvcd at the end");
    other_leaks = gauges_print("with every client gone");
    {
        struct chaos_conn cc = {0};
        uint64_t before = sh->verified;
        long k = -1;
        if (!conn_open(&cc)) {
            k = blocks_sample(&cc, false, sample, 8192, NULL);
            if (k >= 0)
                k = blocks_read(&cc, sample, k, "final", want);
        }
        conn_close(&cc);
        if (k < 0)
            bench_fail("the final read of every block failed");
        final_verified = sh->verified - before;
        /* Reads of the final pass took pins: they must be gone too. */
        if (!gauges_settle(&pins, &resv, &resv_bytes) && (pins || resv))
            fprintf(stderr, "chaos: leaks after the final read\n");
    }
    other_leaks += inflight_settle() ? 1 : 0;
    other_leaks += gauges_print("after the final read");
    st = daemon_stop(&d);
    if (st != 0) {
        daemon_crashes++;
        fprintf(stderr, "chaos: kvcd did not stop cleanly on SIGTERM (%d)\n", st);
    }

end:
    {
        uint64_t lost = restart_expected - restart_found, e;
        double secs = (double)(daemon_now_ms() - t_start) / 1000.0;
        printf("\n  %-26s %12s\n", "case", "value");
        bench_row_add(rows, 16, &nrows, "wrong_bytes", (double)sh->wrong_bytes, "bytes", NULL, 0);
        bench_row_add(rows, 16, &nrows, "leaked_pins", (double)pins, "pins", NULL, 0);
        bench_row_add(rows, 16, &nrows, "leaked_reservations", (double)resv, "slots", NULL, 0);
        bench_row_add(rows, 16, &nrows, "daemon_crashes", (double)daemon_crashes, "crashes",
                      NULL, 0);
        bench_row_add(rows, 16, &nrows, "restart_lost_blocks", (double)lost, "blocks", NULL, 0);
        bench_row_add(rows, 16, &nrows, "client_kills", (double)client_kills, "kills", NULL, 0);
        bench_row_add(rows, 16, &nrows, "daemon_kills", (double)daemon_kills, "kills", NULL, 0);
        bench_row_add(rows, 16, &nrows, "blocks_verified", (double)sh->verified, "blocks", NULL,
                      0);
        bench_row_add(rows, 16, &nrows, "restart_blocks_verified", (double)restart_found,
                      "blocks", NULL, 0);
        if (quant)
            bench_row_add(rows, 16, &nrows, "lossy_blocks_verified", (double)sh->lossy_verified,
                          "blocks", NULL, 0);
        bench_row_add(rows, 16, &nrows, "run_seconds", secs, "s", NULL, 0);
        for (size_t i = 0; i < nrows; i++)
            printf("  %-26s %12.0f %s\n", rows[i].name, rows[i].value, rows[i].unit);
        printf("  (lookups %" PRIu64 ", hits %" PRIu64 ", reserves %" PRIu64 ", commits %" PRIu64
               ", blocks committed %" PRIu64 ", aborts %" PRIu64 ", put_prefix %" PRIu64
               ", waits %" PRIu64 ", connections %" PRIu64 ", final pass %" PRIu64
               " blocks, checkpoint timeouts %" PRIu64 ", clients exited on their own %" PRIu64
               ", gauge leaks %" PRIu64 ")\n",
               sh->lookups, sh->hits, sh->reserves, sh->commits, sh->committed, sh->aborts,
               sh->puts, sh->waits, sh->sessions, final_verified, ckpt_timeouts, client_exits,
               other_leaks);
        printf("  errors by errno:");
        for (e = 0; e < CHAOS_ERRNOS; e++)
            if (sh->errs[e])
                printf(" %" PRIu64 " (%s)=%" PRIu64, e, e ? kvc_strerror(-(int)e) : "other",
                       sh->errs[e]);
        printf("\n");
        if (sh->wrong_bytes || pins || resv || daemon_crashes || lost || other_leaks)
            bench_fail("wrong bytes, leaks, crashes or lost blocks (see above)");
        if (client_kills < kill_target || daemon_kills < dkill_target)
            bench_fail("the run stopped before its kill counts");
        if (client_exits)
            bench_fail("clients exited on their own");
        if (daemon_kills && (!restart_found || cycles_empty))
            bench_fail("%" PRIu64 " of %" PRIu64 " restarts verified no block "
                       "(restart_blocks_verified %" PRIu64 ")",
                       cycles_empty, daemon_kills, restart_found);
        if (quant && !sh->lossy_verified)
            bench_fail("CHAOS_QUANT=1 but no hit was lossy: the ladder was not exercised");
    }
    if (bench_failed()) { /* keep kvcd's log beside the rows */
        char cmd[3 * DAEMON_PATH_MAX];
        snprintf(cmd, sizeof(cmd), "cp '%s' '%s.kvcd.log'", d.log, argv[1]);
        if (system(cmd) == 0)
            fprintf(stderr, "chaos: kvcd's log: %s.kvcd.log\n", argv[1]);
    }
    daemon_cleanup(&d);
    daemon_suite_fini();
    return bench_finish(argv[1], rows, nrows);
}
