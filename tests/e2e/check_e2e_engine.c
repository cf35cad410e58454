/*
 * check_e2e_engine.c — the tier engine end to end: the real kvcd with small host arenas and
 * a disk tier, driven by real client processes through libkvc.
 *
 * - A namespace with its own arena (a [namespace.*] section with host_size) next to one in
 *   the shared arena: every block comes back byte for byte after write-back, demotion,
 *   promotion, compaction and restarts (SIGTERM and SIGKILL), and the namespace comes back
 *   in its own arena.
 * - Inclusive hierarchy: a block promoted from disk keeps its record, so pushing it out of
 *   memory again writes nothing (demoted_clean counts it), and no block is written twice.
 * - No hit lost to a disk that has room: with a disk larger than the working set, every
 *   block put is found again after the host arena turned over many times.
 * - Blocks in motion are never freed: admin evictions, quota evictions and flushes race
 *   promotions and write-backs from several processes for many rounds; the daemon stays
 *   up, no byte is wrong, and every pin and reservation is given back.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/kvc.h"
#include "tests/lib/daemon.h"

#define BT 64            /* tokens per block: daemon_layout gives 64 KiB blocks */
#define CHAIN 10         /* blocks per chain */

static struct daemon d;
static char disk_path[DAEMON_PATH_MAX + 16];

static void setup(void)
{
    memset(&d, 0, sizeof(d));
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    snprintf(disk_path, sizeof(disk_path), "%s/disk", d.dir);
}

static void teardown(void)
{
    daemon_cleanup(&d);
}

/* Starts kvcd on the test's disk file with a host arena of `host` and a disk of `disk`, plus
 * `conf` (a configuration file's text, may be NULL) and extra -o options. */
static void engine_start(const char *host, const char *disk, const char *conf,
                         const char *const *extra)
{
    static char o_host[64], o_disk[DAEMON_PATH_MAX + 32], o_cap[64], conf_path[DAEMON_PATH_MAX];
    const char *args[48];
    int n = 0;
    snprintf(o_host, sizeof(o_host), "host.size=%s", host);
    snprintf(o_disk, sizeof(o_disk), "disk.path=%s", disk_path);
    snprintf(o_cap, sizeof(o_cap), "disk.capacity=%s", disk);
    if (conf) {
        ck_assert_int_eq(daemon_file_write(&d, "kvcd.ini", conf, conf_path), 0);
        args[n++] = "-c";
        args[n++] = conf_path;
    }
    const char *base[] = {o_host, "host.page_size=256k", "host.hugepages=off",
                          "host.prefault=no", o_disk, o_cap, "disk.page=1m",
                          "disk.admit_hits=0", "disk.write_rate=0", "cache.policy=lru",
                          "host.high_watermark=0.8", "host.low_watermark=0.6"};
    for (size_t i = 0; i < sizeof(base) / sizeof(base[0]); i++) {
        args[n++] = "-o";
        args[n++] = base[i];
    }
    for (size_t i = 0; extra && extra[i]; i++) {
        args[n++] = "-o";
        args[n++] = extra[i];
    }
    args[n] = NULL;
    ck_assert_int_eq(daemon_start(&d, args), 0);
}

static void engine_kill(void)
{
    kill(d.pid, SIGKILL);
    daemon_child_wait(d.pid, 20000, NULL);
    d.pid = 0;
}

static uint64_t stat_of(kvc_client *c, const char *name)
{
    uint64_t v = 0;
    ck_assert_msg(daemon_client_stat(c, 0, name, &v) == 0, "no counter %s", name);
    return v;
}

/* Waits until the disk has no write or read in flight. */
static void settle(kvc_client *c)
{
    uint64_t t0 = daemon_now_ms();
    while (stat_of(c, "disk_moves_inflight") || stat_of(c, "disk_writes_inflight")) {
        ck_assert_msg(daemon_now_ms() - t0 < 60000, "disk never settled");
        usleep(5000);
    }
}

static kvc_client *engine_connect(void)
{
    kvc_client *c = NULL;
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    return c;
}

/* Puts chain `family` (CHAIN blocks, bytes derived from each whole key). */
static void put_chain(kvc_ns *ns, uint32_t family)
{
    struct kvc_key keys[CHAIN];
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *buf = malloc(CHAIN * bb);
    const void *ptrs[CHAIN];
    ck_assert_int_eq(daemon_chain_keys(ns, family, 0, CHAIN, CHAIN, keys), 0);
    for (int i = 0; i < CHAIN; i++) {
        daemon_block_fill(&keys[i], buf + i * bb, bb);
        ptrs[i] = buf + i * bb;
    }
    ck_assert_int_ge(kvc_put_prefix(ns, NULL, keys, CHAIN, ptrs), 0);
    free(buf);
}

/* Looks chain `family` up, waits for its reads from disk and checks every byte of every
 * hit. Returns the hits; *wrong counts blocks with a wrong byte. */
static int get_chain(kvc_ns *ns, uint32_t family, int *wrong)
{
    struct kvc_key keys[CHAIN];
    kvc_lease *l = NULL;
    size_t bb = kvc_ns_block_bytes(ns);
    int n;
    ck_assert_int_eq(daemon_chain_keys(ns, family, 0, CHAIN, CHAIN, keys), 0);
    n = kvc_lookup(ns, keys, CHAIN, 0, &l);
    if (n <= 0)
        return n < 0 ? 0 : n;
    n = kvc_lease_wait(l, 30000);
    for (int i = 0; i < n; i++)
        if (daemon_block_check(&keys[i], kvc_lease_data(l, (size_t)i), bb) >= 0)
            (*wrong)++;
    kvc_release(l);
    return n;
}

static uint32_t ns_arena(kvc_client *c, uint32_t ns_id)
{
    struct kvc_ns_info *v;
    size_t n;
    uint32_t arena = UINT32_MAX;
    ck_assert_int_eq(kvc_ns_list(c, &v, &n), 0);
    for (size_t i = 0; i < n; i++)
        if (v[i].ns_id == ns_id)
            arena = v[i].arena_id;
    free(v);
    return arena;
}

/* Every chain of both namespaces back, byte for byte: all of them hits. */
static void check_all(kvc_ns *priv, kvc_ns *pub, int chains, const char *when)
{
    int wrong = 0, hits = 0;
    for (int f = 0; f < chains; f++) {
        hits += get_chain(priv, (uint32_t)f, &wrong);
        hits += get_chain(pub, (uint32_t)(1000 + f), &wrong);
    }
    ck_assert_msg(wrong == 0, "%s: %d blocks with wrong bytes", when, wrong);
    ck_assert_msg(hits == 2 * chains * CHAIN, "%s: %d of %d blocks found", when, hits,
                  2 * chains * CHAIN);
}

static const char private_conf[] = "[namespace.e2e/priv*]\n"
                                   "write = 0\n"
                                   "host_size = 2m\n";

START_TEST(test_private_arena_disk_restart)
{
    struct kvc_layout lp = daemon_layout("e2e/priv", BT), lq = daemon_layout("e2e/pub", BT);
    kvc_client *c;
    kvc_ns *priv, *pub;
    uint32_t arena;
    const int chains = 48; /* 480 blocks each: 15 times the private arena, 2 times arena 0 */
    engine_start("16m", "128m", private_conf, NULL);
    c = engine_connect();
    ck_assert_int_eq(kvc_ns_open(c, &lp, &priv), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lq, &pub), 0);
    arena = ns_arena(c, kvc_ns_id(priv));
    ck_assert_uint_ne(arena, 0);
    ck_assert_uint_eq(ns_arena(c, kvc_ns_id(pub)), 0);
    for (int f = 0; f < chains; f++) {
        put_chain(priv, (uint32_t)f);
        put_chain(pub, (uint32_t)(1000 + f));
        settle(c);
    }
    settle(c);
    ck_assert_uint_eq(stat_of(c, "put_wait_timeouts"), 0); /* every put got its room */
    ck_assert_uint_gt(stat_of(c, "demoted_blocks"), 0);
    check_all(priv, pub, chains, "after demotion and promotion");
    ck_assert_uint_gt(stat_of(c, "promoted_blocks"), 0);
    settle(c);
    kvc_disconnect(c);

    /* SIGTERM: every block written before the stop is back, in its own arena. */
    ck_assert_int_eq(daemon_stop(&d), 0);
    engine_start("16m", "128m", private_conf, NULL);
    c = engine_connect();
    ck_assert_int_eq(kvc_ns_open(c, &lp, &priv), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lq, &pub), 0);
    ck_assert_uint_eq(ns_arena(c, kvc_ns_id(priv)), arena);
    ck_assert_uint_eq(ns_arena(c, kvc_ns_id(pub)), 0);
    {
        int wrong = 0, hits = 0;
        for (int f = 0; f < chains; f++) {
            hits += get_chain(priv, (uint32_t)f, &wrong);
            hits += get_chain(pub, (uint32_t)(1000 + f), &wrong);
        }
        ck_assert_int_eq(wrong, 0);
        ck_assert_int_gt(hits, 0);
        /* Whatever was in memory only is put again: all back to full. */
        for (int f = 0; f < chains; f++) {
            put_chain(priv, (uint32_t)f);
            put_chain(pub, (uint32_t)(1000 + f));
            settle(c);
        }
    }
    check_all(priv, pub, chains, "after SIGTERM");
    settle(c);
    kvc_disconnect(c);

    /* SIGKILL: the records on disk come back, bound to the section's arena again. */
    engine_kill();
    engine_start("16m", "128m", private_conf, NULL);
    c = engine_connect();
    ck_assert_int_eq(kvc_ns_open(c, &lp, &priv), 0);
    ck_assert_uint_eq(ns_arena(c, kvc_ns_id(priv)), arena);
    {
        int wrong = 0, hits = 0;
        for (int f = 0; f < chains; f++)
            hits += get_chain(priv, (uint32_t)f, &wrong);
        ck_assert_int_eq(wrong, 0);
        ck_assert_int_gt(hits, 0);
    }
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* A namespace adopted at start goes where its section says or nowhere: after a restart
 * whose section gives it an arena too small for its blocks, its records are refused (not
 * placed in the shared arena, which its access list would not protect). */
START_TEST(test_adopt_refuses_misplaced_namespace)
{
    struct kvc_layout lb = daemon_layout("e2e/big", 2048); /* 2 MiB blocks */
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_ns_info *v;
    size_t n;
    static const char *const big_pages[] = {"disk.page=4m", NULL}; /* records of 2 MiB */
    engine_start("16m", "64m", NULL, big_pages);
    c = engine_connect();
    ck_assert_int_eq(kvc_ns_open(c, &lb, &ns), 0);
    for (int f = 0; f < 2; f++) {
        put_chain(ns, (uint32_t)f);
        settle(c);
    }
    ck_assert_uint_gt(stat_of(c, "demoted_blocks"), 0);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    engine_start("16m", "64m", "[namespace.e2e/big]\nwrite = 0\nhost_size = 1m\n", big_pages);
    c = engine_connect();
    ck_assert_int_eq(kvc_ns_list(c, &v, &n), 0);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(strcmp(v[i].model_id, "e2e/big") != 0,
                      "namespace adopted in arena %u against its section", v[i].arena_id);
    free(v);
    ck_assert_uint_eq(stat_of(c, "disk_records"), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lb, &ns), -EINVAL);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

START_TEST(test_clean_redemotion_writes_nothing)
{
    struct kvc_layout l = daemon_layout("e2e/clean", BT);
    kvc_client *c;
    kvc_ns *ns;
    const int chains = 60; /* 600 blocks in a 256-block arena */
    uint64_t written, disk_writes, clean0;
    int wrong = 0, hits = 0;
    engine_start("16m", "64m", NULL, NULL);
    c = engine_connect();
    ck_assert_int_eq(kvc_ns_open(c, &l, &ns), 0);
    for (int f = 0; f < chains; f++) {
        put_chain(ns, (uint32_t)f);
        settle(c);
    }
    settle(c);
    clean0 = stat_of(c, "demoted_clean");
    ck_assert_uint_gt(clean0, 0); /* written back ahead, then let go without a write */
    /* Every chain back: promotions push other clean blocks out again, at no write. */
    for (int round = 0; round < 2; round++)
        for (int f = 0; f < chains; f++) {
            hits += get_chain(ns, (uint32_t)f, &wrong);
            settle(c);
        }
    ck_assert_int_eq(wrong, 0);
    ck_assert_int_eq(hits, 2 * chains * CHAIN);
    written = stat_of(c, "demoted_blocks");
    disk_writes = stat_of(c, "disk_writes");
    printf("e2e_engine: %d blocks: %llu written, %llu disk writes, %llu promoted, %llu memory "
           "copies dropped clean\n",
           chains * CHAIN, (unsigned long long)written, (unsigned long long)disk_writes,
           (unsigned long long)stat_of(c, "promoted_blocks"),
           (unsigned long long)stat_of(c, "demoted_clean"));
    ck_assert_uint_gt(stat_of(c, "promoted_blocks"), (uint64_t)chains * CHAIN / 2);
    ck_assert_uint_gt(stat_of(c, "demoted_clean"), clean0);
    /* Once per content: never more writes than distinct blocks. */
    ck_assert_uint_le(written, (uint64_t)chains * CHAIN);
    ck_assert_uint_le(disk_writes, (uint64_t)chains * CHAIN);
    ck_assert_uint_eq(stat_of(c, "evicted_blocks"), 0);
    ck_assert_uint_eq(stat_of(c, "demote_dropped"), 0);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- evictions racing moves --------------------------------------------------------- */

struct racer {
    const char *sock;
    int role; /* 0 reader, 1 writer, 2 admin */
    uint64_t until_ms;
};

static int racer_main(void *arg)
{
    const struct racer *r = arg;
    /* One namespace under a quota (every reserve evicts its coldest blocks), one without,
     * larger than the host arena (its blocks go to disk and come back). */
    struct kvc_layout lq = daemon_layout("e2e/race-quota", BT), lf = daemon_layout("e2e/race", BT);
    kvc_client *c = NULL;
    kvc_ns *ns[2] = {NULL, NULL};
    int wrong = 0;
    uint32_t k = (uint32_t)getpid() * 7919u;
    if (kvc_connect(r->sock, &c) || kvc_ns_open(c, &lq, &ns[0]) || kvc_ns_open(c, &lf, &ns[1]))
        return 2;
    while (daemon_now_ms() < r->until_ms) {
        kvc_ns *n;
        k = k * 1103515245u + 12345u;
        n = ns[(k >> 4) & 1];
        if (r->role == 0) {
            get_chain(n, (k >> 8) % 64, &wrong);
        } else if (r->role == 1) {
            put_chain(n, (k >> 8) % 64);
        } else {
            uint64_t ev;
            /* A namespace, the host tier, everything: all race the moves in flight. */
            int rc = kvc_evict(c, (k & 1) ? kvc_ns_id(n) : 0, (k & 2) ? 1 : 0, &ev);
            if (rc && rc != -ENOENT)
                return 3;
            usleep(50000);
        }
    }
    kvc_disconnect(c);
    return wrong ? 1 : 0;
}

START_TEST(test_evictions_race_moves)
{
    /* max_bytes makes every reserve evict the namespace's coldest blocks (quota eviction). */
    static const char conf[] = "[namespace.e2e/race-quota]\nmax_bytes = 4m\n";
    struct racer r[5];
    pid_t pid[5];
    kvc_client *c;
    int st;
    engine_start("16m", "32m", conf, (const char *const[]){"disk.compact_below=90", NULL});
    uint64_t until = daemon_now_ms() + 6000;
    for (int i = 0; i < 5; i++) {
        r[i] = (struct racer){.sock = d.sock, .role = i < 2 ? 0 : i < 4 ? 1 : 2, .until_ms = until};
        pid[i] = daemon_child_spawn(racer_main, &r[i]);
        ck_assert_int_gt(pid[i], 0);
    }
    for (int i = 0; i < 5; i++) {
        st = daemon_child_wait(pid[i], 120000, NULL);
        ck_assert_msg(st == 0, "racer %d (role %d) exit status %d", i, r[i].role, st);
    }
    ck_assert(daemon_alive(&d));
    c = engine_connect();
    settle(c);
    ck_assert_uint_eq(stat_of(c, "pins_now"), 0);
    ck_assert_uint_eq(stat_of(c, "reserved_now"), 0);
    ck_assert_uint_eq(stat_of(c, "checksum_failures"), 0);
    printf("e2e_engine: race: %llu promoted, %llu written, %llu flushed, %llu quota-evicted\n",
           (unsigned long long)stat_of(c, "promoted_blocks"),
           (unsigned long long)stat_of(c, "demoted_blocks"),
           (unsigned long long)stat_of(c, "flushed_blocks"),
           (unsigned long long)stat_of(c, "evicted_quota_blocks"));
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0); /* the ASan daemon's leak check too */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_engine");
    TCase *tc = tcase_create("engine");
    if (daemon_suite_init("e2e_engine"))
        return 1;
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_private_arena_disk_restart);
    tcase_add_test(tc, test_adopt_refuses_misplaced_namespace);
    tcase_add_test(tc, test_clean_redemotion_writes_nothing);
    tcase_add_test(tc, test_evictions_race_moves);
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
