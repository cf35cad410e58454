/*
 * check_e2e_remote.c — the remote tier against a real three-master Redis Cluster on
 * loopback, with two (or three) kvcd daemons on their own sockets and arenas standing for
 * hosts: a prefix put through daemon A is a hit through daemon B with the same bytes; a
 * record under another layout, and a torn one, are refused (counted, a miss); blocks larger
 * than remote.part_size go in parts spread over the masters and come back whole through
 * another daemon; a part deleted from the cluster makes a counted miss; a part swapped with
 * one of an older write of the same block, of another block, or another part of the same
 * block makes a counted refusal, never wrong bytes; remote.part_size=0 keeps one value a
 * block, and a kvcd set to another part size misses those blocks rather than refusing; a slot
 * migrated during a run (ASK while it moves, MOVED after) is followed; a lookup whose tail
 * misses in the cluster, then a put of that tail under the lease, works; a cluster that is
 * not there at start leaves kvcd serving locally with a degraded tier; a master killed
 * mid-run: no wrong byte, B serves its local hits, the tier is degraded, and it comes back
 * by itself when the node does.
 * The cluster is started once for the suite in a temporary directory (redis-server
 * --cluster-enabled yes on 127.0.0.1 only, then redis-cli --cluster create) and stopped by
 * pid at the end; every server dies with the suite (daemon_fork). Without redis-server the
 * suite says "SKIP: e2e_remote: all: ..." and passes nothing.
 */
#include <check.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc.h"
#include "client/kvc_proto.h"
#include "tests/lib/daemon.h"
#include "tests/lib/rcluster.h"
#include "tests/lib/kinds.h"
#include "tiers/remote_rec.h"
#include "tiers/remote_seal.h"

#define NODES 3
#define BT 64 /* tokens per block: 64 KiB blocks (daemon_layout) */
#define NPFX 8
/* The split cases: blocks of 200 KiB in parts of 64 KiB (the least part size): four parts,
 * the last one of 8 KiB. */
#define SBT 200
#define SPART (64u << 10)
#define SPARTS 4
#define SPLIT "remote.part_size=64k"

static void msleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- the cluster ------------------------------------------------------------------------ */

static struct rcluster rc;
#define ports rc.ports

static redisContext *redis_at(int port)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && c->err) {
        redisFree(c);
        return NULL;
    }
    if (c)
        redisSetTimeout(c, tv);
    return c;
}

/* The reply's text of a command on the node at port ("" on error). */
static void redis_cmd(int port, char *out, size_t len, const char *fmt, ...)
{
    va_list ap;
    redisContext *c = redis_at(port);
    redisReply *r = NULL;
    out[0] = '\0';
    if (!c)
        return;
    va_start(ap, fmt);
    r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ||
              r->type == REDIS_REPLY_ERROR))
        snprintf(out, len, "%s", r->str);
    if (r)
        freeReplyObject(r);
    redisFree(c);
}

/* ---- daemons and blocks ----------------------------------------------------------------- */

/* Starts a kvcd on the cluster with the suite's deployment secret (sealed records), and
 * `extra`: more "-o" values (NULL-terminated; later ones win), or with a config file. */
static void kvcd_upv(struct daemon *d, const char *ini, const char *const *extra)
{
    char o_nodes[300], o_key[400], path[DAEMON_PATH_MAX];
    const char *args[64] = {"-o", "host.size=32m",
                            "-o", "host.page_size=64k",
                            "-o", "host.hugepages=off",
                            "-o", "host.prefault=no",
                            "-o", o_nodes,
                            "-o", o_key,
                            "-o", "remote.backoff_max=500ms",
                            "-o", "remote.timeout=1s",
                            "-o", "remote.negative_ttl=200ms",
                            "-o", "cache.policy=lru"};
    int n = 20;
    snprintf(o_nodes, sizeof(o_nodes), "remote.nodes=%s", rc.seeds);
    snprintf(o_key, sizeof(o_key), "remote.key_file=%s", rc.key_file);
    if (ini) {
        ck_assert_int_eq(daemon_dir_init(d), 0);
        ck_assert_int_eq(daemon_file_write(d, "kvcd.ini", ini, path), 0);
        args[n++] = "-c";
        args[n++] = path;
    }
    for (; extra && *extra && n < 62; extra++) {
        args[n++] = "-o";
        args[n++] = *extra;
    }
    args[n] = NULL;
    ck_assert_int_eq(daemon_start(d, args), 0);
}

static void kvcd_up(struct daemon *d, const char *extra)
{
    memset(d, 0, sizeof(*d));
    kvcd_upv(d, NULL, (const char *const[]){extra, NULL});
}

static uint64_t stat_of(const struct daemon *d, const char *name)
{
    uint64_t v = UINT64_MAX;
    ck_assert_int_eq(daemon_stat(d, name, &v), 0);
    return v;
}

static bool stat_wait(const struct daemon *d, const char *name, uint64_t want, int ms)
{
    uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(ms), v = 0;
    while (daemon_now_ms() < end) {
        if (daemon_stat(d, name, &v) == 0 && v >= want)
            return true;
        msleep(20);
    }
    return false;
}

struct client {
    kvc_client *c;
    kvc_ns *ns;
    size_t bb;
};

static void client_open_bt(struct client *cl, const struct daemon *d, const char *model,
                           uint32_t bt)
{
    struct kvc_layout l = daemon_layout(model, bt);
    ck_assert_int_eq(kvc_connect(d->sock, &cl->c), 0);
    ck_assert_int_eq(kvc_ns_open(cl->c, &l, &cl->ns), 0);
    cl->bb = kvc_ns_block_bytes(cl->ns);
}

static void client_open(struct client *cl, const struct daemon *d, const char *model)
{
    client_open_bt(cl, d, model, BT);
}

/* Puts the prefix: each block's own bytes (daemon_block_fill), or, with a salt, other bytes
 * under the same keys (every KiB of the block differs). */
static void client_put_salted(struct client *cl, const struct kvc_key *keys, int n, uint8_t salt)
{
    void *blocks[NPFX] = {0};
    for (int i = 0; i < n; i++) {
        blocks[i] = malloc(cl->bb);
        ck_assert_ptr_nonnull(blocks[i]);
        daemon_block_fill(&keys[i], blocks[i], cl->bb);
        for (size_t j = 0; j < cl->bb; j += 1024)
            ((uint8_t *)blocks[i])[j] ^= salt;
    }
    ck_assert_int_eq(kvc_put_prefix(cl->ns, NULL, keys, (size_t)n, (const void *const *)blocks), n);
    for (int i = 0; i < n; i++)
        free(blocks[i]);
}

static void client_put(struct client *cl, const struct kvc_key *keys, int n)
{
    client_put_salted(cl, keys, n, 0);
}

/* Gets the prefix: the hit count; every byte of every hit checked. */
static int client_get(struct client *cl, const struct kvc_key *keys, int n)
{
    void *blocks[NPFX] = {0};
    int hits;
    for (int i = 0; i < n; i++) {
        blocks[i] = calloc(1, cl->bb);
        ck_assert_ptr_nonnull(blocks[i]);
    }
    hits = kvc_get_prefix(cl->ns, keys, (size_t)n, blocks);
    ck_assert_int_ge(hits, 0);
    for (int i = 0; i < hits; i++)
        ck_assert_msg(daemon_block_check(&keys[i], blocks[i], cl->bb) < 0, "block %d: wrong bytes",
                      i);
    for (int i = 0; i < n; i++)
        free(blocks[i]);
    return hits;
}

static void client_close(struct client *cl)
{
    kvc_disconnect(cl->c);
}

/* A test's daemons go down with their clients: each client closed, then its daemon stopped
 * (status 0: no crash, no sanitizer report) and its directory removed. */
static void down(struct client *const *cl, struct daemon *const *d, int n)
{
    for (int i = 0; i < n; i++)
        client_close(cl[i]);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(daemon_stop(d[i]), 0);
        daemon_cleanup(d[i]);
    }
}

/* The bytes of the value of a part of len bytes: sealed (the default here) or not. */
#define VLEN(len) (REMOTE_SEAL_HDR + (size_t)(len) + REMOTE_SEAL_TAG)
#define VLEN_UNSEALED(len) (REMOTE_REC_HDR + (size_t)(len))

/* The keys of model's namespace in the group of the deployment secret key_file and the
 * group secret group_file (NULL: the default group). */
static void seal_keys_of(const uint8_t ns[REMOTE_REC_NS_BYTES], const char *key_file,
                         const char *group_file, struct remote_seal *k)
{
    uint8_t master[REMOTE_SEAL_KEY_BYTES], gs[REMOTE_SEAL_KEY_BYTES], group[REMOTE_SEAL_KEY_BYTES];
    char why[256];
    ck_assert_msg(remote_seal_secret_load(key_file, master, why, sizeof(why)) == 0, "%s", why);
    if (group_file)
        ck_assert_msg(remote_seal_secret_load(group_file, gs, why, sizeof(why)) == 0, "%s", why);
    remote_seal_group(master, group_file ? gs : NULL, group);
    remote_seal_ns(group, ns, k);
}

/* The Redis key of part index of a block of model (bt tokens a block) cut with part_size
 * that a daemon of the deployment key_file (NULL: an unsealed tier) asks for, in the group
 * of group_file (NULL: the default): the model's raw layout (as libkvc sends it), the block
 * key. */
static void redis_kind_key_in(const char *key_file, const char *group_file, const char *model,
                              uint32_t bt, enum kvc_kv_kind kind, uint16_t window,
                              const struct kvc_key *k, uint64_t part_size, uint32_t index,
                              char *out)
{
    struct kvc_layout l = daemon_layout(model, bt);
    struct kvc_wire_layout wl;
    struct remote_rec_geom g;
    uint8_t ns[REMOTE_REC_NS_BYTES] = {0};
    uint64_t key[2] = {k->lo, k->hi};
    memset(&wl, 0, sizeof(wl));
    memcpy(wl.model_id, l.model_id, strlen(l.model_id));
    wl.layers = l.layers;
    wl.kv_heads = l.kv_heads;
    wl.head_dim = l.head_dim;
    wl.block_tokens = l.block_tokens;
    wl.dtype = (uint8_t)l.dtype;
    wl.kv_kind = (uint8_t)kind;
    wl.window_tokens = window;
    memcpy(ns, &wl, sizeof(wl));
    ck_assert_int_eq(remote_rec_geom((uint64_t)bt << 10, part_size, &g), 0); /* 1 KiB a token */
    if (key_file) {
        struct remote_seal sk;
        seal_keys_of(ns, key_file, group_file, &sk);
        remote_seal_key(out, &sk, key, &g, index);
    } else {
        remote_rec_key(out, remote_rec_ns_fp(ns), key, &g, index);
    }
}

static void redis_part_key_in(const char *key_file, const char *group_file, const char *model,
                              uint32_t bt, const struct kvc_key *k, uint64_t part_size,
                              uint32_t index, char *out)
{
    redis_kind_key_in(key_file, group_file, model, bt, KVC_KV_KIND_KV, 0, k, part_size, index, out);
}

/* The same in the suite's deployment, default group. */
static void redis_part_key_of(const char *model, uint32_t bt, const struct kvc_key *k,
                              uint64_t part_size, uint32_t index, char *out)
{
    redis_part_key_in(rc.key_file, NULL, model, bt, k, part_size, index, out);
}

/* The key of a block stored in one value. */
static void redis_key_of(const char *model, const struct kvc_key *k, char *out)
{
    redis_part_key_of(model, BT, k, 0, 0, out);
}

/* The port of the master serving a key now (asks node 0, follows one MOVED). */
static int redis_port_of(const char *key)
{
    for (int i = 0; i < NODES; i++) {
        redisContext *c = redis_at(ports[i]);
        redisReply *r = c ? redisCommand(c, "EXISTS %s", key) : NULL;
        bool here = r && r->type == REDIS_REPLY_INTEGER;
        if (r)
            freeReplyObject(r);
        if (c)
            redisFree(c);
        if (here)
            return ports[i];
    }
    return -1;
}

/* GET / SET of a raw value on the master of key. */
static char *redis_get(const char *key, size_t *len)
{
    redisContext *c = redis_at(redis_port_of(key));
    redisReply *r = c ? redisCommand(c, "GET %s", key) : NULL;
    char *v = NULL;
    if (r && r->type == REDIS_REPLY_STRING) {
        v = malloc(r->len);
        memcpy(v, r->str, r->len);
        *len = r->len;
    }
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return v;
}

static bool redis_set(const char *key, const char *v, size_t len)
{
    redisContext *c = redis_at(redis_port_of(key));
    redisReply *r = c ? redisCommand(c, "SET %s %b", key, v, len) : NULL;
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return ok;
}

/* DEL of a key on its master: the number of keys removed. */
static long long redis_del(const char *key)
{
    redisContext *c = redis_at(redis_port_of(key));
    redisReply *r = c ? redisCommand(c, "DEL %s", key) : NULL;
    long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return n;
}

/* ---- cases ---------------------------------------------------------------------------- */

START_TEST(test_cross_daemon_hit)
{
    struct daemon a, b;
    struct client ca, cb;
    struct kvc_key keys[NPFX];
    kvcd_up(&a, NULL);
    kvcd_up(&b, NULL);
    client_open(&ca, &a, "e2e/remote-hit");
    client_open(&cb, &b, "e2e/remote-hit");
    ck_assert_int_eq(daemon_chain_keys(ca.ns, 1, 0, NPFX, NPFX, keys), 0);
    client_put(&ca, keys, NPFX);
    ck_assert_msg(stat_wait(&a, "remote_written_blocks", NPFX, 10000), "A wrote %llu blocks",
                  (unsigned long long)stat_of(&a, "remote_written_blocks"));
    /* Local misses read from the cluster: each key resolved in B's index once per LOOKUP,
     * the reads' blocks handed to the lease (issue 31). */
    uint64_t f0 = stat_of(&b, "lookup_index_finds"), b0 = stat_of(&b, "lookup_blocks");
    ck_assert_int_eq(client_get(&cb, keys, NPFX), NPFX); /* from the cluster, same bytes */
    uint64_t f1 = stat_of(&b, "lookup_index_finds"), b1 = stat_of(&b, "lookup_blocks");
    printf("e2e_remote: lookups of %llu keys (remote reads): %llu index resolutions\n",
           (unsigned long long)(b1 - b0), (unsigned long long)(f1 - f0));
    ck_assert_uint_le(f1 - f0, b1 - b0);
    ck_assert_uint_eq(stat_of(&b, "remote_hit_blocks"), NPFX);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 0);
    uint64_t gets = stat_of(&b, "remote_gets");
    ck_assert_int_eq(client_get(&cb, keys, NPFX), NPFX); /* now local: no request */
    ck_assert_uint_eq(stat_of(&b, "remote_gets"), gets);
    ck_assert_uint_eq(stat_of(&b, "remote_slots"), 16384);
    ck_assert_uint_eq(stat_of(&b, "remote_nodes"), NODES);
    /* A prefix nobody stored: a miss, asked once within the negative cache's time. */
    struct kvc_key other[NPFX];
    ck_assert_int_eq(daemon_chain_keys(cb.ns, 2, 0, NPFX, NPFX, other), 0);
    ck_assert_int_eq(client_get(&cb, other, NPFX), 0);
    ck_assert_int_eq(client_get(&cb, other, NPFX), 0);
    ck_assert_uint_ge(stat_of(&b, "remote_negative_hits"), 1);
    /* And B can put it now (the failed reads left no trace in its index). */
    client_put(&cb, other, NPFX);
    ck_assert_int_eq(client_get(&cb, other, NPFX), NPFX);
    down((struct client *[]){&ca, &cb}, (struct daemon *[]){&a, &b}, 2);
}
END_TEST

START_TEST(test_other_layout_refused)
{
    struct daemon a, b;
    struct client ca, cb;
    struct kvc_key keys[2];
    char ka[REMOTE_REC_KEY_MAX], kb[REMOTE_REC_KEY_MAX], kb1[REMOTE_REC_KEY_MAX];
    size_t len = 0;
    kvcd_up(&a, NULL);
    kvcd_up(&b, NULL);
    client_open(&ca, &a, "e2e/remote-layout-a");
    client_open(&cb, &b, "e2e/remote-layout-b");
    ck_assert_int_eq(daemon_chain_keys(ca.ns, 3, 0, 2, 2, keys), 0);
    client_put(&ca, keys, 2);
    ck_assert(stat_wait(&a, "remote_written_blocks", 2, 10000));
    /* A's record of block 0 (layout a) under the key B asks for (layout b); a torn copy of
     * block 1's record under B's key of block 1. */
    redis_key_of("e2e/remote-layout-a", &keys[0], ka);
    redis_key_of("e2e/remote-layout-b", &keys[0], kb);
    redis_key_of("e2e/remote-layout-b", &keys[1], kb1);
    char *v = redis_get(ka, &len);
    ck_assert_ptr_nonnull(v);
    ck_assert_uint_eq(len, VLEN(ca.bb));
    ck_assert(redis_set(kb, v, len));
    free(v);
    ck_assert_int_eq(client_get(&cb, keys, 2), 0);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 1);
    ck_assert_uint_eq(stat_of(&b, "remote_seal_refused"), 1); /* sealed for another layout */
    ck_assert_uint_eq(stat_of(&b, "remote_hit_blocks"), 0);
    /* Block 0 of layout b, stored properly by B itself, then a torn block 1. */
    redis_key_of("e2e/remote-layout-a", &keys[1], ka);
    v = redis_get(ka, &len);
    ck_assert_ptr_nonnull(v);
    ck_assert(redis_set(kb1, v, len - 1000));
    free(v);
    struct daemon c;
    struct client cc;
    kvcd_up(&c, NULL);
    client_open(&cc, &c, "e2e/remote-layout-b");
    client_put(&cb, keys, 1); /* B: block 0 in layout b, written behind */
    ck_assert(stat_wait(&b, "remote_written_blocks", 1, 10000));
    ck_assert_int_eq(client_get(&cc, keys, 2), 1); /* block 0 served, torn block 1 refused */
    ck_assert_uint_eq(stat_of(&c, "remote_bad_records"), 1);
    ck_assert_uint_eq(stat_of(&c, "remote_hit_blocks"), 1);
    down((struct client *[]){&ca, &cb, &cc}, (struct daemon *[]){&a, &b, &c}, 3);
}
END_TEST

/* ---- blocks in parts ------------------------------------------------------------------ */

/* A block larger than remote.part_size goes to the cluster in parts, each on its own master,
 * and comes back through another daemon with the same bytes. A seals on its threads, B
 * opens on its network thread (remote.seal_threads = 0). */
START_TEST(test_split_cross_daemon_hit)
{
    static const char model[] = "e2e/remote-split";
    struct daemon a, b;
    struct client ca, cb;
    struct kvc_key keys[3];
    char k[REMOTE_REC_KEY_MAX];
    int ports_used[NODES] = {0};
    size_t len = 0;
    kvcd_up(&a, SPLIT);
    memset(&b, 0, sizeof(b));
    kvcd_upv(&b, NULL, (const char *const[]){SPLIT, "remote.seal_threads=0", NULL});
    client_open_bt(&ca, &a, model, SBT);
    client_open_bt(&cb, &b, model, SBT);
    ck_assert_uint_eq(ca.bb, (size_t)SBT << 10);
    ck_assert_int_eq(daemon_chain_keys(ca.ns, 10, 0, 3, 3, keys), 0);
    client_put(&ca, keys, 3);
    ck_assert(stat_wait(&a, "remote_written_blocks", 3, 10000));
    ck_assert_uint_eq(stat_of(&a, "remote_parts_written"), 3 * SPARTS);
    /* Block 0: each part a value of its own length, the four on all three masters (slots a
     * quarter of the slot space apart); nothing under the block's one-value key. */
    for (uint32_t i = 0; i < SPARTS; i++) {
        redis_part_key_of(model, SBT, &keys[0], SPART, i, k);
        char *v = redis_get(k, &len);
        ck_assert_msg(v != NULL, "part %u missing (%s)", i, k);
        ck_assert_uint_eq(len, VLEN(i < SPARTS - 1 ? SPART : 8192));
        free(v);
        for (int n = 0; n < NODES; n++)
            ports_used[n] |= redis_port_of(k) == ports[n];
    }
    ck_assert_int_eq(ports_used[0] + ports_used[1] + ports_used[2], NODES);
    redis_part_key_of(model, SBT, &keys[0], 0, 0, k);
    ck_assert_ptr_null(redis_get(k, &len));
    /* B reads them all: every byte checked. */
    ck_assert_int_eq(client_get(&cb, keys, 3), 3);
    ck_assert_uint_eq(stat_of(&b, "remote_hit_blocks"), 3);
    ck_assert_uint_eq(stat_of(&b, "remote_parts_read"), 3 * SPARTS);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 0);
    ck_assert_uint_eq(stat_of(&b, "remote_part_missing"), 0);
    ck_assert_uint_eq(stat_of(&b, "remote_part_mixed"), 0);
    down((struct client *[]){&ca, &cb}, (struct daemon *[]){&a, &b}, 2);
}
END_TEST

/* One part of a block gone from the cluster (as the cluster's LRU may take it): the block is
 * a miss, counted, and nothing of it is served; the block before it is. */
START_TEST(test_split_part_missing)
{
    static const char model[] = "e2e/remote-split-missing";
    struct daemon a, b;
    struct client ca, cb;
    struct kvc_key keys[3];
    char k[REMOTE_REC_KEY_MAX];
    kvcd_up(&a, SPLIT);
    /* B remembers a miss for longer than two lookups take in the slowest build. */
    memset(&b, 0, sizeof(b));
    kvcd_upv(&b, NULL, (const char *const[]){SPLIT, "remote.negative_ttl=20s", NULL});
    client_open_bt(&ca, &a, model, SBT);
    client_open_bt(&cb, &b, model, SBT);
    ck_assert_int_eq(daemon_chain_keys(ca.ns, 11, 0, 3, 3, keys), 0);
    client_put(&ca, keys, 3);
    ck_assert(stat_wait(&a, "remote_written_blocks", 3, 10000));
    redis_part_key_of(model, SBT, &keys[1], SPART, 2, k);
    ck_assert_int_eq(redis_del(k), 1);
    ck_assert_int_eq(client_get(&cb, keys, 3), 1); /* block 0, its bytes checked */
    ck_assert_uint_eq(stat_of(&b, "remote_part_missing"), 1);
    ck_assert_uint_ge(stat_of(&b, "remote_miss_blocks"), 1);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 0);
    ck_assert_uint_eq(stat_of(&b, "remote_part_mixed"), 0);
    /* The miss is remembered: asked again, the cluster is not. What stops the lookup depends
     * on the order the two reads came back in: block 1 failed first and left the index (the
     * negative cache stops it: remote_negative_hits), or block 2 landed first as its child
     * and block 1 stays in the index as lost (a miss for every lookup) until its child goes.
     * Either way no request goes out; other cases test the negative cache itself. */
    uint64_t gets = stat_of(&b, "remote_gets");
    ck_assert_int_eq(client_get(&cb, keys, 3), 1);
    ck_assert_uint_eq(stat_of(&b, "remote_gets"), gets);
    /* kvcctl tiers shows it on the remote row */
    char out[8192], err[1024];
    ck_assert_int_eq(daemon_kvcctl(&b, out, sizeof(out), err, sizeof(err), "--json", "tiers", NULL),
                     0);
    ck_assert(daemon_json_valid(out));
    ck_assert_msg(strstr(out, "\"parts_missing\": 1, \"parts_mixed\": 0"), "%s", out);
    down((struct client *[]){&ca, &cb}, (struct daemon *[]){&a, &b}, 2);
}
END_TEST

/* Waits past the reader's negative cache (remote.negative_ttl=200ms) for a key it refused. */
static void negative_ttl_wait(void)
{
    msleep(daemon_ms(300));
}

/* A part replaced by a part of an older write of the same block (other bytes), by a part of
 * another block, or by another part of the same block (each a valid record alone), or by
 * itself with a byte flipped: each time the block is refused and counted, never served; the
 * part put back, the block is served with the bytes of the write that stands. */
START_TEST(test_split_part_swapped)
{
    static const char model[] = "e2e/remote-split-swap";
    struct daemon a, b, c;
    struct client ca, cb, cc;
    struct kvc_key key[1], other[1];
    char k1[REMOTE_REC_KEY_MAX], k2[REMOTE_REC_KEY_MAX], ko1[REMOTE_REC_KEY_MAX];
    size_t lold = 0, lnew1 = 0, lnew2 = 0, loth = 0;
    kvcd_up(&a, SPLIT);
    kvcd_up(&b, SPLIT);
    kvcd_up(&c, SPLIT);
    client_open_bt(&ca, &a, model, SBT);
    client_open_bt(&cb, &b, model, SBT);
    client_open_bt(&cc, &c, model, SBT);
    ck_assert_int_eq(daemon_chain_keys(ca.ns, 12, 0, 1, 1, key), 0);
    ck_assert_int_eq(daemon_chain_keys(ca.ns, 13, 0, 1, 1, other), 0);
    redis_part_key_of(model, SBT, &key[0], SPART, 1, k1);
    redis_part_key_of(model, SBT, &key[0], SPART, 2, k2);
    redis_part_key_of(model, SBT, &other[0], SPART, 1, ko1);
    /* An older write of the block, with other bytes, through A; then the write that stands,
     * with the block's own bytes, through C (which holds none of it). */
    client_put_salted(&ca, key, 1, 0x5a);
    client_put(&ca, other, 1);
    ck_assert(stat_wait(&a, "remote_written_blocks", 2, 10000));
    char *old1 = redis_get(k1, &lold);
    ck_assert_ptr_nonnull(old1);
    client_put(&cc, key, 1);
    ck_assert(stat_wait(&c, "remote_written_blocks", 1, 10000));
    char *new1 = redis_get(k1, &lnew1), *new2 = redis_get(k2, &lnew2),
         *oth1 = redis_get(ko1, &loth);
    ck_assert(new1 && new2 && oth1);
    ck_assert(lold == lnew1 && lnew1 == lnew2 && lnew1 == loth);
    ck_assert(memcmp(old1, new1, lold) != 0);
    /* Part 1 of the older write among the new parts. */
    ck_assert(redis_set(k1, old1, lold));
    ck_assert_int_eq(client_get(&cb, key, 1), 0);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 1);
    ck_assert_uint_eq(stat_of(&b, "remote_part_mixed"), 1);
    ck_assert_uint_eq(stat_of(&b, "remote_seal_refused"), 0); /* it opens: of this block */
    /* Part 1 of another block (sealed for that block: it does not open here). */
    negative_ttl_wait();
    ck_assert(redis_set(k1, oth1, loth));
    ck_assert_int_eq(client_get(&cb, key, 1), 0);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 2);
    /* Part 2 of the same block in part 1's place. */
    negative_ttl_wait();
    ck_assert(redis_set(k1, new2, lnew2));
    ck_assert_int_eq(client_get(&cb, key, 1), 0);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 3);
    /* The right part with one byte of its data flipped (a torn or rotten value). */
    negative_ttl_wait();
    new1[lnew1 - 100] ^= 1;
    ck_assert(redis_set(k1, new1, lnew1));
    new1[lnew1 - 100] ^= 1;
    ck_assert_int_eq(client_get(&cb, key, 1), 0);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 4);
    ck_assert_uint_eq(stat_of(&b, "remote_part_mixed"), 1);
    ck_assert_uint_eq(stat_of(&b, "remote_seal_refused"), 3);
    ck_assert_uint_eq(stat_of(&b, "remote_hit_blocks"), 0);
    /* Put back: served, every byte the standing write's (client_get checks them). */
    negative_ttl_wait();
    ck_assert(redis_set(k1, new1, lnew1));
    ck_assert_int_eq(client_get(&cb, key, 1), 1);
    ck_assert_uint_eq(stat_of(&b, "remote_hit_blocks"), 1);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 4);
    free(old1);
    free(new1);
    free(new2);
    free(oth1);
    down((struct client *[]){&ca, &cb, &cc}, (struct daemon *[]){&a, &b, &c}, 3);
}
END_TEST

/* remote.part_size=0: the same blocks in one value each. A kvcd set to another part size
 * looks under other keys: a miss, never a refusal. */
START_TEST(test_split_off)
{
    static const char model[] = "e2e/remote-split-off";
    struct daemon a, b, c;
    struct client ca, cb, cc;
    struct kvc_key keys[3];
    char k[REMOTE_REC_KEY_MAX];
    size_t len = 0;
    kvcd_up(&a, "remote.part_size=0");
    kvcd_up(&b, "remote.part_size=0");
    kvcd_up(&c, SPLIT);
    client_open_bt(&ca, &a, model, SBT);
    client_open_bt(&cb, &b, model, SBT);
    client_open_bt(&cc, &c, model, SBT);
    ck_assert_int_eq(daemon_chain_keys(ca.ns, 14, 0, 3, 3, keys), 0);
    client_put(&ca, keys, 3);
    ck_assert(stat_wait(&a, "remote_written_blocks", 3, 10000));
    ck_assert_uint_eq(stat_of(&a, "remote_parts_written"), 3);
    redis_part_key_of(model, SBT, &keys[0], 0, 0, k);
    char *v = redis_get(k, &len);
    ck_assert_ptr_nonnull(v);
    ck_assert_uint_eq(len, VLEN(ca.bb));
    free(v);
    ck_assert_int_eq(client_get(&cb, keys, 3), 3);
    ck_assert_uint_eq(stat_of(&b, "remote_hit_blocks"), 3);
    ck_assert_uint_eq(stat_of(&b, "remote_parts_read"), 3);
    ck_assert_int_eq(client_get(&cc, keys, 3), 0);
    ck_assert_uint_ge(stat_of(&c, "remote_miss_blocks"), 1);
    ck_assert_uint_eq(stat_of(&c, "remote_bad_records"), 0);
    down((struct client *[]){&ca, &cb, &cc}, (struct daemon *[]){&a, &b, &c}, 3);
}
END_TEST

/* The engine's usual order: look a prompt up (the cached part is a hit, the rest is asked
 * of the cluster and misses), then put the rest under the last hit while the lease is still
 * held. The misses must not stand in the way of that put. */
START_TEST(test_lookup_then_put_holding_lease)
{
    struct daemon b;
    struct client cb;
    struct kvc_key keys[NPFX];
    kvc_lease *l = NULL;
    kvcd_up(&b, NULL);
    client_open(&cb, &b, "e2e/remote-lease");
    ck_assert_int_eq(daemon_chain_keys(cb.ns, 9, 0, NPFX, NPFX, keys), 0);
    client_put(&cb, keys, 3);
    ck_assert_int_eq(kvc_lookup(cb.ns, keys, NPFX, 0, &l), 3);
    ck_assert_uint_ge(stat_of(&b, "remote_miss_blocks"), 1);
    void *blocks[NPFX] = {0};
    for (int i = 3; i < NPFX; i++) {
        blocks[i] = malloc(cb.bb);
        ck_assert_ptr_nonnull(blocks[i]);
        daemon_block_fill(&keys[i], blocks[i], cb.bb);
    }
    ck_assert_int_eq(
        kvc_put_prefix(cb.ns, &keys[2], keys + 3, NPFX - 3, (const void *const *)(blocks + 3)),
        NPFX - 3);
    ck_assert_int_eq(kvc_release(l), 0);
    for (int i = 3; i < NPFX; i++)
        free(blocks[i]);
    ck_assert_int_eq(client_get(&cb, keys, NPFX), NPFX);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 0);
    client_close(&cb);
    ck_assert_int_eq(daemon_stop(&b), 0);
    daemon_cleanup(&b);
}
END_TEST

/* A cluster that is not there at start: kvcd serves from its local tiers, says the remote
 * tier is degraded, and stops cleanly. */
START_TEST(test_cluster_unreachable)
{
    struct daemon d;
    const char *o_nodes = "remote.nodes=127.0.0.1:1"; /* nothing listens on port 1 */
    char o_key[400];
    uint64_t v = 0;
    const char *args[] = {"-o", "host.size=32m",
                          "-o", "host.hugepages=off",
                          "-o", "host.prefault=no",
                          "-o", o_nodes,
                          "-o", o_key,
                          "-o", "remote.backoff_max=200ms",
                          NULL};
    snprintf(o_key, sizeof(o_key), "remote.key_file=%s", rc.key_file);
    memset(&d, 0, sizeof(d));
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert(stat_wait(&d, "remote_degraded", 1, 10000));
    ck_assert_int_eq(daemon_roundtrip(&d), 0);
    ck_assert_int_eq(daemon_stat(&d, "remote_bad_records", &v), 0);
    ck_assert_uint_eq(v, 0);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

static void node_id(int port, char *out, size_t len)
{
    redis_cmd(port, out, len, "CLUSTER MYID");
}

START_TEST(test_slot_migration)
{
    struct daemon a, b, c;
    struct client ca, cb, cc;
    struct kvc_key keys[NPFX], warm[1];
    char k[REMOTE_REC_KEY_MAX], src_id[64], dst_id[64], out[256];
    kvcd_up(&a, NULL);
    kvcd_up(&b, NULL);
    kvcd_up(&c, NULL);
    client_open(&ca, &a, "e2e/remote-move");
    client_open(&cb, &b, "e2e/remote-move");
    client_open(&cc, &c, "e2e/remote-move");
    ck_assert_int_eq(daemon_chain_keys(ca.ns, 4, 0, NPFX, NPFX, keys), 0);
    ck_assert_int_eq(daemon_chain_keys(cb.ns, 5, 0, 1, 1, warm), 0);
    ck_assert_int_eq(client_get(&cb, warm, 1), 0); /* B and C load their slot maps */
    ck_assert_int_eq(client_get(&cc, warm, 1), 0);
    client_put(&ca, keys, NPFX);
    ck_assert(stat_wait(&a, "remote_written_blocks", NPFX, 10000));
    /* Block 0's slot moves to another master: its key first (ASK while the slot is
     * migrating), then the slot (MOVED). */
    redis_key_of("e2e/remote-move", &keys[0], k);
    unsigned slot = remote_rec_slot(k, strlen(k));
    int src = redis_port_of(k), dst = src == ports[0] ? ports[1] : ports[0];
    ck_assert_int_gt(src, 0);
    node_id(src, src_id, sizeof(src_id));
    node_id(dst, dst_id, sizeof(dst_id));
    redis_cmd(dst, out, sizeof(out), "CLUSTER SETSLOT %u IMPORTING %s", slot, src_id);
    ck_assert_str_eq(out, "OK");
    redis_cmd(src, out, sizeof(out), "CLUSTER SETSLOT %u MIGRATING %s", slot, dst_id);
    ck_assert_str_eq(out, "OK");
    redis_cmd(src, out, sizeof(out), "MIGRATE 127.0.0.1 %d %s 0 5000", dst, k);
    ck_assert_str_eq(out, "OK");
    ck_assert_int_eq(client_get(&cb, keys, 1), 1); /* ASK followed */
    ck_assert_uint_ge(stat_of(&b, "remote_asked"), 1);
    for (int i = 0; i < NODES; i++)
        redis_cmd(ports[i], out, sizeof(out), "CLUSTER SETSLOT %u NODE %s", slot, dst_id);
    ck_assert(rcluster_wait_ok(&rc, 10000));
    /* C learnt the old map before the move: MOVED, followed. */
    ck_assert_int_eq(client_get(&cc, keys, NPFX), NPFX);
    ck_assert_uint_ge(stat_of(&c, "remote_moved"), 1);
    ck_assert_uint_eq(stat_of(&c, "remote_bad_records"), 0);
    down((struct client *[]){&ca, &cb, &cc}, (struct daemon *[]){&a, &b, &c}, 3);
}
END_TEST

START_TEST(test_master_killed)
{
    struct daemon a, b;
    struct client ca, cb;
    struct kvc_key p1[NPFX], p2[NPFX], p3[NPFX];
    kvcd_up(&a, NULL);
    kvcd_up(&b, NULL);
    client_open(&ca, &a, "e2e/remote-kill");
    client_open(&cb, &b, "e2e/remote-kill");
    ck_assert_int_eq(daemon_chain_keys(ca.ns, 6, 0, NPFX, NPFX, p1), 0);
    ck_assert_int_eq(daemon_chain_keys(ca.ns, 8, 0, NPFX, NPFX, p3), 0);
    /* p2 starts with a block on the master that dies, so that B's first read of it goes
     * there (sealed names are keyed with this run's secret: which master serves a key
     * changes from run to run). */
    int fam = 100;
    for (;; fam++) {
        char k0[REMOTE_REC_KEY_MAX];
        ck_assert_int_lt(fam, 1000);
        ck_assert_int_eq(daemon_chain_keys(ca.ns, (uint32_t)fam, 0, NPFX, NPFX, p2), 0);
        redis_key_of("e2e/remote-kill", &p2[0], k0);
        if (redis_port_of(k0) == ports[2])
            break;
    }
    client_put(&ca, p1, NPFX);
    ck_assert(stat_wait(&a, "remote_written_blocks", NPFX, 10000));
    ck_assert_int_eq(client_get(&cb, p1, NPFX), NPFX);
    /* A master dies mid-run. */
    rcluster_node_kill(&rc, 2);
    client_put(&ca, p2, NPFX);
    /* B: its local hits still served; whatever it gets of p2 is right (checked bytes). */
    uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(15000);
    while (daemon_now_ms() < end && stat_of(&b, "remote_degraded") == 0) {
        ck_assert_int_eq(client_get(&cb, p1, NPFX), NPFX);
        (void)client_get(&cb, p2, NPFX);
        msleep(50);
    }
    ck_assert_uint_eq(stat_of(&b, "remote_degraded"), 1);
    ck_assert_int_eq(client_get(&cb, p1, NPFX), NPFX);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 0);
    /* The node comes back with its state: the tier recovers by itself. */
    ck_assert_int_eq(rcluster_node_start(&rc, 2), 0);
    ck_assert(rcluster_wait_ok(&rc, 20000));
    end = daemon_now_ms() + (uint64_t)daemon_ms(15000);
    while (daemon_now_ms() < end &&
           (stat_of(&b, "remote_degraded") != 0 || stat_of(&a, "remote_degraded") != 0))
        msleep(50);
    ck_assert_uint_eq(stat_of(&b, "remote_degraded"), 0);
    uint64_t w = stat_of(&a, "remote_written_blocks");
    client_put(&ca, p3, NPFX);
    ck_assert(stat_wait(&a, "remote_written_blocks", w + NPFX, 10000));
    ck_assert_int_eq(client_get(&cb, p3, NPFX), NPFX);
    ck_assert_uint_ge(stat_of(&b, "remote_trips"), 1);
    down((struct client *[]){&ca, &cb}, (struct daemon *[]){&a, &b}, 2);
}
END_TEST

/* ---- trust: sealed records (docs/remote.md, docs/security.md) --------------------------- */

/* Whether the len bytes at v hold a 64-byte run of the block of k (at 0, the middle, the
 * end): the block's bytes in clear. */
static bool holds_plaintext(const char *v, size_t len, const struct kvc_key *k, size_t bb)
{
    uint8_t *blk = malloc(bb);
    bool found = false;
    ck_assert_ptr_nonnull(blk);
    daemon_block_fill(k, blk, bb);
    for (size_t at = 0; at + 64 <= bb && !found; at += bb / 2 - 32)
        found = memmem(v, len, blk + at, 64) != NULL;
    free(blk);
    return found;
}

/* Every key of the cluster (SCAN on every master) into one text, a line each. */
static char *cluster_keys(void)
{
    size_t cap = 1 << 16, n = 0;
    char *all = malloc(cap);
    ck_assert_ptr_nonnull(all);
    all[0] = '\0';
    for (int i = 0; i < NODES; i++) {
        redisContext *c = redis_at(ports[i]);
        unsigned long long cursor = 0;
        ck_assert_ptr_nonnull(c);
        do {
            redisReply *r = redisCommand(c, "SCAN %llu COUNT 1000", cursor);
            ck_assert(r && r->type == REDIS_REPLY_ARRAY && r->elements == 2);
            cursor = strtoull(r->element[0]->str, NULL, 10);
            for (size_t j = 0; j < r->element[1]->elements; j++) {
                const redisReply *k = r->element[1]->element[j];
                while (n + k->len + 2 > cap) {
                    cap *= 2;
                    all = realloc(all, cap);
                    ck_assert_ptr_nonnull(all);
                }
                memcpy(all + n, k->str, k->len);
                n += k->len;
                all[n++] = '\n';
                all[n] = '\0';
            }
            freeReplyObject(r);
        } while (cursor);
        redisFree(c);
    }
    return all;
}

/* What anyone who reaches the cluster sees of a sealed block: a value of the sealed length
 * under a name that does not give the block key away, holding neither the block's bytes nor
 * the model id; the names an unsealed kvcd would use hold nothing. */
START_TEST(test_sealed_cluster_holds_ciphertext)
{
    static const char model[] = "e2e/remote-sealed-model";
    struct daemon a;
    struct client ca;
    struct kvc_key keys[2];
    char k[REMOTE_REC_KEY_MAX], hex[33];
    size_t len = 0;
    kvcd_up(&a, NULL);
    client_open(&ca, &a, model);
    ck_assert_int_eq(daemon_chain_keys(ca.ns, 20, 0, 2, 2, keys), 0);
    client_put(&ca, keys, 2);
    ck_assert(stat_wait(&a, "remote_written_blocks", 2, 10000));
    ck_assert_uint_eq(stat_of(&a, "remote_sealed"), 1);
    char *names = cluster_keys();
    for (int i = 0; i < 2; i++) {
        redis_key_of(model, &keys[i], k);
        ck_assert_int_eq(strncmp(k, "kvc3:", 5), 0);
        char *v = redis_get(k, &len);
        ck_assert_ptr_nonnull(v);
        ck_assert_uint_eq(len, VLEN(ca.bb));
        ck_assert_msg(!holds_plaintext(v, len, &keys[i], ca.bb), "block %d in clear", i);
        ck_assert_ptr_null(memmem(v, len, model, strlen(model)));
        free(v);
        /* Neither the block key nor the layout's fingerprint names it. */
        snprintf(hex, sizeof(hex), "%016llx%016llx", (unsigned long long)keys[i].hi,
                 (unsigned long long)keys[i].lo);
        ck_assert_msg(!strstr(names, hex), "the block key is in a Redis key name");
        redis_part_key_in(NULL, NULL, model, BT, &keys[i], 0, 0, k);
        ck_assert_ptr_null(redis_get(k, &len));
        ck_assert_msg(!strstr(names, k), "an unsealed name exists: %s", k);
    }
    free(names);
    down((struct client *[]){&ca}, (struct daemon *[]){&a}, 1);
}
END_TEST

/* Records planted by a kvcd without this deployment's secret — one of another deployment
 * (another key), one of an unsealed tier — under the names this deployment reads: each a
 * miss and a refusal counted, never served; left under their own names, a plain miss. */
START_TEST(test_planted_records_refused)
{
    static const char model[] = "e2e/remote-planted";
    struct daemon p, u, b;
    struct client cp, cu, cb;
    struct kvc_key keys[2];
    char kb0[REMOTE_REC_KEY_MAX], kb1[REMOTE_REC_KEY_MAX], kp[REMOTE_REC_KEY_MAX],
        ku[REMOTE_REC_KEY_MAX], o_other[400];
    size_t len = 0;
    snprintf(o_other, sizeof(o_other), "remote.key_file=%s", rc.other_key_file);
    kvcd_up(&p, o_other);
    kvcd_up(&u, "remote.seal=no");
    kvcd_up(&b, NULL);
    client_open(&cp, &p, model);
    client_open(&cu, &u, model);
    client_open(&cb, &b, model);
    ck_assert_int_eq(daemon_chain_keys(cb.ns, 21, 0, 2, 2, keys), 0);
    client_put(&cp, keys, 2); /* another deployment's blocks, sealed under its key */
    client_put(&cu, keys, 2); /* an unsealed kvcd's */
    ck_assert(stat_wait(&p, "remote_written_blocks", 2, 10000));
    ck_assert(stat_wait(&u, "remote_written_blocks", 2, 10000));
    ck_assert_uint_eq(stat_of(&u, "remote_sealed"), 0);
    /* Under their own names: not this deployment's, a miss with nothing refused. */
    ck_assert_int_eq(client_get(&cb, keys, 2), 0);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 0);
    /* Planted under this deployment's names. */
    redis_key_of(model, &keys[0], kb0);
    redis_key_of(model, &keys[1], kb1);
    redis_part_key_in(rc.other_key_file, NULL, model, BT, &keys[0], 0, 0, kp);
    redis_part_key_in(NULL, NULL, model, BT, &keys[1], 0, 0, ku);
    char *vp = redis_get(kp, &len);
    ck_assert_ptr_nonnull(vp);
    ck_assert_uint_eq(len, VLEN(cb.bb));
    ck_assert(redis_set(kb0, vp, len));
    free(vp);
    char *vu = redis_get(ku, &len);
    ck_assert_ptr_nonnull(vu);
    ck_assert_uint_eq(len, VLEN_UNSEALED(cb.bb));
    ck_assert(redis_set(kb1, vu, len));
    free(vu);
    negative_ttl_wait();
    ck_assert_int_eq(client_get(&cb, keys, 2), 0); /* both read in one batch, both refused */
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 2);
    ck_assert_uint_eq(stat_of(&b, "remote_seal_refused"), 1); /* the unsealed one: a version */
    ck_assert_uint_eq(stat_of(&b, "remote_hit_blocks"), 0);
    /* Block 0 put properly by this deployment: block 1, the unsealed record, is refused. */
    client_put(&cb, keys, 1);
    struct daemon c;
    struct client cc;
    kvcd_up(&c, NULL);
    client_open(&cc, &c, model);
    ck_assert(stat_wait(&b, "remote_written_blocks", 1, 10000));
    ck_assert_int_eq(client_get(&cc, keys, 2), 1);
    ck_assert_uint_eq(stat_of(&c, "remote_hit_blocks"), 1);
    ck_assert_uint_eq(stat_of(&c, "remote_bad_records"), 1);
    ck_assert_uint_eq(stat_of(&c, "remote_seal_refused"), 0); /* not sealed at all */
    down((struct client *[]){&cp, &cu, &cb, &cc}, (struct daemon *[]){&p, &u, &b, &c}, 4);
}
END_TEST

/* A block stored in one value (every block up to the part size) with one byte of its data
 * flipped, then cut short: refused both times, sealed or not; put back, served. */
static void one_value_damaged(const char *extra, const char *model, bool sealed)
{
    struct daemon a, b;
    struct client ca, cb;
    struct kvc_key keys[2];
    char k[REMOTE_REC_KEY_MAX];
    size_t len = 0;
    memset(&a, 0, sizeof(a));
    kvcd_upv(&a, NULL, (const char *const[]){"remote.seal_threads=0", extra, NULL}); /* inline */
    kvcd_up(&b, extra);
    client_open(&ca, &a, model);
    client_open(&cb, &b, model);
    ck_assert_int_eq(daemon_chain_keys(ca.ns, 22, 0, 2, 2, keys), 0);
    client_put(&ca, keys, 2);
    ck_assert(stat_wait(&a, "remote_written_blocks", 2, 10000));
    redis_part_key_in(sealed ? rc.key_file : NULL, NULL, model, BT, &keys[1], 0, 0, k);
    char *v = redis_get(k, &len);
    ck_assert_ptr_nonnull(v);
    ck_assert_uint_eq(len, sealed ? VLEN(ca.bb) : VLEN_UNSEALED(ca.bb));
    size_t at = len - (sealed ? REMOTE_SEAL_TAG : 0) - ca.bb / 2; /* in the block's bytes */
    v[at] ^= 0x10;
    ck_assert(redis_set(k, v, len));
    v[at] ^= 0x10;
    ck_assert_int_eq(client_get(&cb, keys, 2), 1);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 1);
    ck_assert_uint_eq(stat_of(&b, "remote_seal_refused"), sealed ? 1 : 0);
    /* The same record cut short (its own layout, its own key): refused. */
    negative_ttl_wait();
    ck_assert(redis_set(k, v, len - 1000));
    ck_assert_int_eq(client_get(&cb, keys, 2), 1);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 2);
    negative_ttl_wait();
    ck_assert(redis_set(k, v, len));
    ck_assert_int_eq(client_get(&cb, keys, 2), 2);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 2);
    free(v);
    down((struct client *[]){&ca, &cb}, (struct daemon *[]){&a, &b}, 2);
}

START_TEST(test_one_value_damaged_sealed)
{
    one_value_damaged(NULL, "e2e/remote-one-value-sealed", true);
}
END_TEST

START_TEST(test_one_value_damaged_unsealed)
{
    one_value_damaged("remote.seal=no", "e2e/remote-one-value-plain", false);
}
END_TEST

/* ---- window and state blocks ----------------------------------------------------------- */

#define KWIN 182 /* window tokens: 3 blocks of BT */

static kvc_ns *kind_open(kvc_client *c, const char *model, enum kvc_kv_kind kind)
{
    return kinds_open(c, daemon_layout(model, BT), kind, KWIN);
}

static void kind_keys(struct kvc_key *k, uint32_t n, uint64_t salt)
{
    for (uint32_t i = 0; i < n; i++)
        k[i] = (struct kvc_key){.lo = salt * 1000 + i + 1, .hi = 0x72656d6b696e64ull ^ salt};
}

/* Looks keys[0..n) up in daemon d: the hits must be keys[first..first + hits), byte for
 * byte; each of its LOOKUPs (libkvc asks again after a failed read) resolves each key in the
 * index once (issue 31: the span judged, its reads started and its blocks pinned with the
 * blocks found first). */
static void kind_expect(const struct daemon *d, kvc_ns *ns, const struct kvc_key *keys, uint32_t n,
                        size_t first, int hits)
{
    uint64_t f0 = stat_of(d, "lookup_index_finds"), l0 = stat_of(d, "lookups");
    kinds_expect(ns, keys, n, first, hits);
    uint64_t f1 = stat_of(d, "lookup_index_finds"), l1 = stat_of(d, "lookups");
    printf("e2e_remote: %llu LOOKUPs of %u keys (kind %d): %llu index resolutions\n",
           (unsigned long long)(l1 - l0), n, kvc_ns_kind(ns), (unsigned long long)(f1 - f0));
    ck_assert_uint_ge(l1 - l0, 1);
    ck_assert_uint_le(f1 - f0, (l1 - l0) * n);
}

/* Window blocks and states written behind by A are found by B, which holds none of them: a
 * window lookup answers exactly the window of the longest prefix whose window the local
 * tiers and the cluster hold together (its blocks read as roots, whatever chain they were
 * written in), a state lookup the state of the longest prefix that has one. A window with a
 * block gone from the cluster is never answered cut short (what is left of it is no
 * prefix's window): libkvc asks the local tiers again. */
START_TEST(test_window_and_state_cross_daemon)
{
    struct daemon a, b;
    kvc_client *ca = NULL, *cb = NULL;
    struct kvc_key k[12];
    char key[REMOTE_REC_KEY_MAX];
    kvcd_up(&a, NULL);
    kvcd_up(&b, NULL);
    ck_assert_int_eq(kvc_connect(a.sock, &ca), 0);
    ck_assert_int_eq(kvc_connect(b.sock, &cb), 0);
    kvc_ns *wa = kind_open(ca, "e2e/remote-swa", KVC_KV_KIND_KV_WINDOW);
    kvc_ns *wb = kind_open(cb, "e2e/remote-swa", KVC_KV_KIND_KV_WINDOW);
    kvc_ns *sa = kind_open(ca, "e2e/remote-state", KVC_KV_KIND_STATE);
    kvc_ns *sb = kind_open(cb, "e2e/remote-state", KVC_KV_KIND_STATE);
    kind_keys(k, 12, 1);
    /* Window blocks 0..1 and 4..11 (2 and 3 never stored); states at the ends of 3 and 6. */
    kinds_put_roots(wa, k, (const int[]){0, 1, 4, 5, 6, 7, 8, 9, 10, 11}, 10);
    kinds_put_roots(sa, k, (const int[]){2, 5}, 2);
    ck_assert_msg(stat_wait(&a, "remote_written_blocks", 12, 10000), "A wrote %llu blocks",
                  (unsigned long long)stat_of(&a, "remote_written_blocks"));
    kind_expect(&b, wb, k, 12, 9, 3); /* the longest prefix: its window, from the cluster */
    ck_assert_uint_eq(stat_of(&b, "remote_hit_blocks"), 3);
    kind_expect(&b, wb, k, 7, 4, 3); /* blocks 4 and 5 from the cluster, 6 local now */
    kind_expect(&b, wb, k, 5, 0, 2); /* prefix 5 needs 2..4, 3 needs 2: prefix 2 */
    kind_expect(&b, sb, k, 12, 5, 1);
    kind_expect(&b, sb, k, 5, 2, 1); /* never the state of another boundary */
    kind_expect(&b, sb, k, 2, 0, 0);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 0);
    /* C holds nothing either; block 10 goes from the cluster: the window of prefix 12 (9..11)
     * cannot be read whole, and what C then holds (9, 11) is no window of any prefix: the
     * answer is the window of prefix 10 (7..9), not 9 alone. */
    struct daemon d;
    kvc_client *cc = NULL;
    kvcd_up(&d, NULL);
    ck_assert_int_eq(kvc_connect(d.sock, &cc), 0);
    kvc_ns *wc = kind_open(cc, "e2e/remote-swa", KVC_KV_KIND_KV_WINDOW);
    redis_kind_key_in(rc.key_file, NULL, "e2e/remote-swa", BT, KVC_KV_KIND_KV_WINDOW, KWIN, &k[10],
                      0, 0, key);
    ck_assert_int_eq(redis_del(key), 1);
    kind_expect(&d, wc, k, 12, 7, 3);
    ck_assert_uint_eq(stat_of(&d, "remote_miss_blocks"), 1);
    kind_expect(&d, wc, k, 10, 7, 3); /* local now */
    /* 9 and 11, then 7 and 8, and 6 read ahead (one key was missing past the window) */
    ck_assert_uint_eq(stat_of(&d, "remote_hit_blocks"), 5);
    kvc_disconnect(cc);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
    kvc_disconnect(ca);
    kvc_disconnect(cb);
    ck_assert_int_eq(daemon_stop(&a), 0);
    ck_assert_int_eq(daemon_stop(&b), 0);
    daemon_cleanup(&a);
    daemon_cleanup(&b);
}
END_TEST

/* The kind and the window are part of the namespace's descriptor, so of the record's key and
 * its seal: a window block's record planted under the key of the same model's KV block (a
 * daemon that opened the model as plain KV), and a KV block's under a window block's key, are
 * refused (counted), never served as the other kind. */
START_TEST(test_kind_records_never_cross)
{
    struct daemon a, b, c;
    kvc_client *ca = NULL, *cb = NULL, *cc = NULL;
    struct kvc_key k[4];
    char kw[REMOTE_REC_KEY_MAX], kk[REMOTE_REC_KEY_MAX];
    size_t len = 0;
    kvcd_up(&a, NULL);
    kvcd_up(&b, NULL);
    kvcd_up(&c, NULL);
    ck_assert_int_eq(kvc_connect(a.sock, &ca), 0);
    ck_assert_int_eq(kvc_connect(b.sock, &cb), 0);
    ck_assert_int_eq(kvc_connect(c.sock, &cc), 0);
    kvc_ns *wa = kind_open(ca, "e2e/remote-cross", KVC_KV_KIND_KV_WINDOW);
    kvc_ns *kb = kind_open(cb, "e2e/remote-cross", KVC_KV_KIND_KV);
    kvc_ns *wc = kind_open(cc, "e2e/remote-cross", KVC_KV_KIND_KV_WINDOW);
    kind_keys(k, 4, 2);
    kinds_put_roots(wa, k, (const int[]){0}, 1);
    kinds_put_roots(kb, k, (const int[]){1}, 1);
    ck_assert(stat_wait(&a, "remote_written_blocks", 1, 10000));
    ck_assert(stat_wait(&b, "remote_written_blocks", 1, 10000));
    /* A's window block 0 under B's KV key of block 0. */
    redis_kind_key_in(rc.key_file, NULL, "e2e/remote-cross", BT, KVC_KV_KIND_KV_WINDOW, KWIN, &k[0],
                      0, 0, kw);
    redis_kind_key_in(rc.key_file, NULL, "e2e/remote-cross", BT, KVC_KV_KIND_KV, 0, &k[0], 0, 0,
                      kk);
    char *v = redis_get(kw, &len);
    ck_assert_ptr_nonnull(v);
    ck_assert(redis_set(kk, v, len));
    free(v);
    kind_expect(&b, kb, k, 1, 0, 0);
    ck_assert_uint_eq(stat_of(&b, "remote_bad_records"), 1);
    ck_assert_uint_eq(stat_of(&b, "remote_seal_refused"), 1);
    /* B's KV block 1 under the window key of block 1, asked by C as a window. */
    redis_kind_key_in(rc.key_file, NULL, "e2e/remote-cross", BT, KVC_KV_KIND_KV, 0, &k[1], 0, 0,
                      kk);
    redis_kind_key_in(rc.key_file, NULL, "e2e/remote-cross", BT, KVC_KV_KIND_KV_WINDOW, KWIN, &k[1],
                      0, 0, kw);
    v = redis_get(kk, &len);
    ck_assert_ptr_nonnull(v);
    ck_assert(redis_set(kw, v, len));
    free(v);
    kind_expect(&c, wc, k, 2, 0, 1); /* prefix 2 needs 0 and 1: 1 refused; prefix 1 needs 0 */
    ck_assert_uint_eq(stat_of(&c, "remote_bad_records"), 1);
    ck_assert_uint_eq(stat_of(&c, "remote_seal_refused"), 1);
    ck_assert_uint_eq(stat_of(&c, "remote_hit_blocks"), 1); /* A's block 0, its own record */
    kvc_disconnect(ca);
    kvc_disconnect(cb);
    kvc_disconnect(cc);
    ck_assert_int_eq(daemon_stop(&a), 0);
    ck_assert_int_eq(daemon_stop(&b), 0);
    ck_assert_int_eq(daemon_stop(&c), 0);
    daemon_cleanup(&a);
    daemon_cleanup(&b);
    daemon_cleanup(&c);
}
END_TEST

/* Namespaces whose section restricts who may read or write them: kept out of the remote
 * tier by default; with remote = yes and a group secret, shared by the daemons holding that
 * secret only; a daemon of the deployment without it finds nothing under its names. */
START_TEST(test_restricted_namespaces)
{
    struct daemon a, b, c;
    struct client ca, cb, cc, cs;
    struct kvc_key keys[NPFX];
    char group_file[400], ini[1024], ini_nogroup[1024], k[REMOTE_REC_KEY_MAX];
    size_t len = 0;
    unsigned uid = (unsigned)getuid();
    snprintf(group_file, sizeof(group_file), "%s/group-e2e.key", rc.dir);
    ck_assert_int_eq(rcluster_secret_write(group_file), 0);
    snprintf(ini, sizeof(ini),
             "[namespace.e2e/secret*]\nread = %u\nwrite = %u\nhost_size = 8m\n"
             "[namespace.e2e/grouped*]\nread = %u\nwrite = %u\nhost_size = 8m\n"
             "remote = yes\nremote_key_file = %s\n",
             uid, uid, uid, uid, group_file);
    snprintf(ini_nogroup, sizeof(ini_nogroup),
             "[namespace.e2e/secret*]\nread = %u\nwrite = %u\nhost_size = 8m\n"
             "[namespace.e2e/grouped*]\nread = %u\nwrite = %u\nhost_size = 8m\n"
             "remote = yes\n",
             uid, uid, uid, uid);
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    memset(&c, 0, sizeof(c));
    kvcd_upv(&a, ini, NULL);
    kvcd_upv(&b, ini, NULL);
    kvcd_upv(&c, ini_nogroup, NULL);
    /* Restricted, no remote = yes: never written. */
    client_open(&cs, &a, "e2e/secret-model");
    ck_assert_int_eq(daemon_chain_keys(cs.ns, 23, 0, NPFX, NPFX, keys), 0);
    client_put(&cs, keys, NPFX);
    ck_assert_int_eq(daemon_roundtrip(&a), 0); /* an open namespace's blocks do go */
    ck_assert(stat_wait(&a, "remote_written_blocks", 3, 10000));
    msleep(daemon_ms(200));
    ck_assert_uint_eq(stat_of(&a, "remote_puts"), 3);
    redis_part_key_of("e2e/secret-model", BT, &keys[0], 0, 0, k);
    ck_assert_ptr_null(redis_get(k, &len));
    /* Its own group: A writes, B (same secrets) reads, C (no group secret) does not. */
    client_open(&ca, &a, "e2e/grouped-model");
    client_open(&cb, &b, "e2e/grouped-model");
    client_open(&cc, &c, "e2e/grouped-model");
    ck_assert_int_eq(daemon_chain_keys(ca.ns, 24, 0, NPFX, NPFX, keys), 0);
    client_put(&ca, keys, NPFX);
    ck_assert(stat_wait(&a, "remote_written_blocks", 3 + NPFX, 10000));
    ck_assert_int_eq(client_get(&cb, keys, NPFX), NPFX);
    ck_assert_uint_eq(stat_of(&b, "remote_hit_blocks"), NPFX);
    ck_assert_int_eq(client_get(&cc, keys, NPFX), 0);
    ck_assert_uint_eq(stat_of(&c, "remote_hit_blocks"), 0);
    ck_assert_uint_eq(stat_of(&c, "remote_bad_records"), 0);
    /* Under the group's names: ciphertext; under the default group's: nothing. */
    redis_part_key_in(rc.key_file, group_file, "e2e/grouped-model", BT, &keys[0], 0, 0, k);
    char *v = redis_get(k, &len);
    ck_assert_ptr_nonnull(v);
    ck_assert(!holds_plaintext(v, len, &keys[0], ca.bb));
    free(v);
    redis_part_key_of("e2e/grouped-model", BT, &keys[0], 0, 0, k);
    ck_assert_ptr_null(redis_get(k, &len));
    client_close(&cs);
    down((struct client *[]){&ca, &cb, &cc}, (struct daemon *[]){&a, &b, &c}, 3);
}
END_TEST

/* What another user sees of the configuration: the remote tier's password, nodes, files
 * and every placement are for admins; a secret is "(set)" even for them, and it is in no
 * reply, metric or log line. */
struct tenant_view {
    const char *sock;
};

static int tenant_config(void *arg)
{
    const struct tenant_view *t = arg;
    kvc_client *c = NULL;
    char buf[16384];
    if (setgroups(0, NULL) || setresgid(65502, 65502, 65502) || setresuid(65502, 65502, 65502))
        return 120;
    if (kvc_connect(t->sock, &c))
        return 10;
    if (kvc_config_get(c, "remote.password", buf, sizeof(buf)) != -EACCES)
        return 11;
    if (kvc_config_get(c, "remote.nodes", buf, sizeof(buf)) != -EACCES)
        return 12;
    if (kvc_config_get(c, "host.size", buf, sizeof(buf)) != 0)
        return 13;
    if (kvc_config_get(c, NULL, buf, sizeof(buf)) != 0 || strstr(buf, "s3cret") ||
        strstr(buf, "127.0.0.1") || !strstr(buf, "remote.password = (admin only)") ||
        !strstr(buf, "remote.key_file = (admin only)") || !strstr(buf, "host.size = 32m"))
        return 14;
    char *m = NULL;
    if (kvc_metrics(c, &m) || strstr(m, "s3cret"))
        return 15;
    free(m);
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_secrets_hidden)
{
    struct daemon d;
    char parent[DAEMON_PATH_MAX], out[16384], err[1024];
    memset(&d, 0, sizeof(d));
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    snprintf(parent, sizeof(parent), "%s", d.dir);
    *strrchr(parent, '/') = 0;
    ck_assert_int_eq(chmod(parent, 0711), 0);
    ck_assert_int_eq(chmod(d.dir, 0711), 0);
    kvcd_upv(
        &d, NULL,
        (const char *const[]){"remote.password=s3cret-pw-77", "server.socket_mode=0666", NULL});
    /* The cluster wants no password: the tier says why it is degraded, not what was sent. */
    struct tenant_view t = {.sock = d.sock};
    ck_assert_int_eq(
        daemon_child_wait(daemon_child_spawn(tenant_config, &t), daemon_ms(30000), NULL), 0);
    ck_assert_int_eq(daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "config", "get",
                                   "remote.password", NULL),
                     0);
    ck_assert_msg(strstr(out, "(set)") && !strstr(out, "s3cret"), "%s", out);
    ck_assert_int_eq(daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "config", "get", NULL),
                     0);
    ck_assert(!strstr(out, "s3cret") && strstr(out, "remote.nodes = 127.0.0.1"));
    ck_assert_int_eq(daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "metrics", NULL), 0);
    ck_assert(!strstr(out, "s3cret"));
    ck_assert_int_eq(daemon_stop(&d), 0);
    FILE *f = fopen(d.log, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    fclose(f);
    ck_assert_msg(!strstr(out, "s3cret"), "the log shows the password");
    daemon_cleanup(&d);
}
END_TEST

/* A deployment secret anyone else can read, one that is too short, or none at all while
 * records are sealed: kvcd refuses to start and says why (nothing is written to the
 * cluster); --check-config says the same. */
static void start_refused(const char *const *extra, const char *why)
{
    struct daemon d;
    pid_t pid;
    char o_nodes[300], text[4096];
    const char *args[16] = {"-o", "host.size=16m", "-o", "host.prefault=no", "-o", o_nodes};
    int n = 6, st;
    snprintf(o_nodes, sizeof(o_nodes), "remote.nodes=%s", rc.seeds);
    for (; *extra; extra++) {
        args[n++] = "-o";
        args[n++] = *extra;
    }
    args[n] = NULL;
    memset(&d, 0, sizeof(d));
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    ck_assert_int_eq(daemon_spawn(&d, args, &pid), 0);
    st = daemon_child_wait(pid, daemon_ms(10000), NULL);
    ck_assert_int_eq(st, 1);
    FILE *f = fopen(d.log, "r");
    ck_assert_ptr_nonnull(f);
    n = (int)fread(text, 1, sizeof(text) - 1, f);
    text[n] = '\0';
    fclose(f);
    ck_assert_msg(strstr(text, why), "%s", text);
    daemon_cleanup(&d);
}

START_TEST(test_bad_secret_refused)
{
    char loose[400], shrt[400], o_loose[500], o_short[500];
    snprintf(loose, sizeof(loose), "%s/loose.key", rc.dir);
    snprintf(shrt, sizeof(shrt), "%s/short.key", rc.dir);
    ck_assert_int_eq(rcluster_secret_write(loose), 0);
    ck_assert_int_eq(chmod(loose, 0644), 0);
    FILE *f = fopen(shrt, "w");
    ck_assert_ptr_nonnull(f);
    fputs("tooshort", f);
    fclose(f);
    ck_assert_int_eq(chmod(shrt, 0600), 0);
    snprintf(o_loose, sizeof(o_loose), "remote.key_file=%s", loose);
    snprintf(o_short, sizeof(o_short), "remote.key_file=%s", shrt);
    start_refused((const char *const[]){o_loose, NULL}, "chmod 0600");
    start_refused((const char *const[]){o_short, NULL}, "fewer than 32");
    start_refused((const char *const[]){NULL}, "remote.seal needs the deployment secret");
    start_refused((const char *const[]){"remote.key_file=/nonexistent/kvcd.key", NULL},
                  "No such file");
}
END_TEST

int main(void)
{
    char why[256];
    int failed, up;
    if (!rcluster_available()) {
        printf("SKIP: e2e_remote: all: redis-server or redis-cli is not installed\n");
        return 0;
    }
    if (daemon_suite_init("e2e_remote"))
        return 1;
    up = rcluster_up(&rc, NODES, "256mb", why, sizeof(why));
    if (up) {
        rcluster_down(&rc);
        daemon_suite_fini();
        if (up > 0) {
            printf("SKIP: e2e_remote: all: %s\n", why);
            return 0;
        }
        fprintf(stderr, "e2e_remote: %s\n", why);
        return 1;
    }
    Suite *s = suite_create("e2e_remote");
    TCase *tc = tcase_create("remote");
    tcase_set_timeout(tc, 120 * daemon_slow());
    tcase_add_test(tc, test_cross_daemon_hit);
    tcase_add_test(tc, test_other_layout_refused);
    tcase_add_test(tc, test_split_cross_daemon_hit);
    tcase_add_test(tc, test_split_part_missing);
    tcase_add_test(tc, test_split_part_swapped);
    tcase_add_test(tc, test_split_off);
    tcase_add_test(tc, test_lookup_then_put_holding_lease);
    tcase_add_test(tc, test_cluster_unreachable);
    tcase_add_test(tc, test_sealed_cluster_holds_ciphertext);
    tcase_add_test(tc, test_planted_records_refused);
    tcase_add_test(tc, test_one_value_damaged_sealed);
    tcase_add_test(tc, test_one_value_damaged_unsealed);
    tcase_add_test(tc, test_window_and_state_cross_daemon);
    tcase_add_test(tc, test_kind_records_never_cross);
    tcase_add_test(tc, test_restricted_namespaces);
    tcase_add_test(tc, test_secrets_hidden);
    tcase_add_test(tc, test_bad_secret_refused);
    tcase_add_test(tc, test_slot_migration);
    tcase_add_test(tc, test_master_killed); /* last: it restarts a node */
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    rcluster_down(&rc);
    daemon_suite_fini();
    return failed ? 1 : 0;
}
