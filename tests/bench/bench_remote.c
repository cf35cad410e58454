/*
 * bench_remote.c — the remote tier against a plain hiredis client on the same cluster, and
 * kvcd's host tier against redis-server and memcached as peers sharing a prefix.
 *
 * DESIGN
 * One run starts a three-master Redis Cluster on loopback (tests/lib/rcluster.h) and two
 * kvcd daemons on it (A writes, B reads; each its own socket and arena), then measures:
 *  - remote_put_256k / remote_put_2m / remote_put_16m: a prefix of BENCH_TOTAL bytes put
 *    through daemon A until A counts every block written to the cluster (write-behind: the
 *    time from the first put to the last write's completion); 16 MiB blocks are larger than
 *    remote.part_size (1 MiB by default), so kvcd stores each in parts on every master;
 *  - remote_get_256k / remote_get_2m / remote_get_16m: the same prefix loaded through daemon
 *    B (kvc_lookup, which waits for B's reads from the cluster, then kvc_lease_copy of every
 *    block);
 *  - the same six with _unsealed: daemons with remote.seal = no, so that the cost of sealing
 *    (the records sealed and opened on the tier's worker, docs/remote.md) reads off the two
 *    (both against the plain client of their own run);
 * baseline: a plain client in this process doing the same work on the same cluster with
 * hiredis, pipelined: each block cut into the parts kvcd cuts it into (remote.part_size,
 * remote_rec_geom), each part under a key made as kvcd makes it (remote_rec_key: the parts
 * of a block spread over the slot space, so over every master) and sent to the master of
 * its slot (slot map from CLUSTER SLOTS); every node's SETs (GETs) appended, every node
 * written, then every reply read (a GET's part copied to its place in the caller's buffer).
 * Only kvcd's 384-byte record header per part is not sent by the plain client.
 *  - peers_256k / peers_2m: process A stores a 4096-token prefix (64 MiB) and process B
 *    loads it, through kvcd's host tier (B maps the arena and copies once), through a local
 *    redis-server and a local memcached, both over Unix sockets (hiredis pipelined GETs;
 *    libmemcached mget), in the same run; value kvcd's GB/s, baseline the faster peer. B
 *    loads the prefix once untimed, then timed (warm mappings and connections, as in a
 *    long-lived engine, for every peer alike).
 * Each figure is the best of BENCH_REPS repetitions (fresh keys each time), the median
 * printed beside it. Bytes are checked outside the timings. Exit status 1 when anything
 * broke; a missing redis-server is a SKIP line. KVC_BENCH_SMOKE=1: 8 MiB prefixes (one
 * 16 MiB block), 2 repetitions. KVC_BENCH_PART_SIZE=SIZE runs the daemons with that
 * remote.part_size (0: one value a block), to compare part sizes.
 */
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <libmemcached/memcached.h>
#include <signal.h>
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
#include "daemon/config.h"
#include "tests/lib/rcluster.h"
#include "tiers/remote_rec.h"

#define BENCH_TOTAL (bench_smoke() ? 8ull << 20 : 64ull << 20)
#define BENCH_REPS_MAX 7
#define BENCH_REPS (bench_smoke() ? 2 : BENCH_REPS_MAX)
#define BENCH_TOKENS 4096 /* the prefix of the peers cases: 64 MiB at 16 KiB a token */
#define BENCH_MAX_BLOCKS 256

static struct rcluster cl;
static char bdir[256];

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Best (largest) and median of n rates. */
static double bench_best(double *v, int n, double *median)
{
    qsort(v, (size_t)n, sizeof(*v), bench_cmp);
    *median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    return v[n - 1];
}

/* 16 KiB a token: 32 layers, K and V, 2 heads of 64 fp16. */
static struct kvc_layout bench_layout(const char *model, uint32_t bt)
{
    return (struct kvc_layout){.model_id = model,
                               .layers = 32,
                               .kv_heads = 2,
                               .head_dim = 64,
                               .block_tokens = bt,
                               .dtype = KVC_DTYPE_FP16,
                               .kv_kind = KVC_KV_KIND_KV};
}

static uint8_t **bench_blocks(int n, size_t bb, const struct kvc_key *keys)
{
    uint8_t **v = calloc((size_t)n, sizeof(*v));
    for (int i = 0; v && i < n; i++) {
        v[i] = malloc(bb);
        if (!v[i])
            return NULL;
        if (keys)
            daemon_block_fill(&keys[i], v[i], bb);
        else
            memset(v[i], 0, bb);
    }
    return v;
}

static void bench_blocks_free(uint8_t **v, int n)
{
    for (int i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

/* ---- the plain hiredis cluster client (baseline) ----------------------------------------- */

struct plain {
    redisContext *c[RCLUSTER_MAX];
    int port[RCLUSTER_MAX];
    int n;
    uint8_t slot_node[16384];
};

static int plain_open(struct plain *p)
{
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", cl.ports[0], tv);
    redisReply *r = c && !c->err ? redisCommand(c, "CLUSTER SLOTS") : NULL;
    int rc2 = -EIO;
    memset(p, 0, sizeof(*p));
    if (!r || r->type != REDIS_REPLY_ARRAY)
        goto out;
    for (size_t e = 0; e < r->elements; e++) {
        redisReply *x = r->element[e];
        int port = (int)x->element[2]->element[1]->integer, node = -1;
        for (int i = 0; i < p->n; i++)
            if (p->port[i] == port)
                node = i;
        if (node < 0) {
            node = p->n++;
            p->port[node] = port;
            p->c[node] = redisConnectWithTimeout("127.0.0.1", port, tv);
            if (!p->c[node] || p->c[node]->err)
                goto out;
        }
        for (long long s = x->element[0]->integer; s <= x->element[1]->integer; s++)
            p->slot_node[s] = (uint8_t)node;
    }
    rc2 = 0;
out:
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return rc2;
}

static void plain_close(struct plain *p)
{
    for (int i = 0; i < p->n; i++)
        if (p->c[i])
            redisFree(p->c[i]);
}

/* The daemons' remote.part_size (KVC_BENCH_PART_SIZE, else 1m), in bytes. */
static uint64_t bench_part_size(void)
{
    const char *e = getenv("KVC_BENCH_PART_SIZE");
    uint64_t v = 1u << 20;
    if (e && *e && config_parse_size(e, &v))
        bench_fail("KVC_BENCH_PART_SIZE=%s is not a size", e);
    return v;
}

/* SETs (dst NULL) or GETs of n blocks of bb bytes, each cut into kvcd's parts, each part to
 * the master of its slot: pipelined per node, every node written first. */
static int plain_move(struct plain *p, int rep, int n, size_t bb, uint8_t **src, uint8_t **dst)
{
    struct remote_rec_geom g;
    char key[REMOTE_REC_KEY_MAX];
    int rc = -EIO;
    if (remote_rec_geom(bb, bench_part_size(), &g))
        return -EINVAL;
    size_t nparts = (size_t)n * g.count;
    int *node_of = calloc(nparts, sizeof(*node_of));
    if (!node_of)
        return -ENOMEM;
    for (int i = 0; i < n; i++)
        for (uint32_t k = 0; k < g.count; k++) {
            /* this run's own namespace fingerprint and keys: (rep, block) */
            uint64_t bkey[2] = {(uint64_t)i, (uint64_t)rep}, fp = 0x706c61696e000000ull | bb;
            size_t kl = remote_rec_key(key, fp, bkey, &g, k);
            int node = p->slot_node[remote_rec_slot(key, kl)];
            uint8_t *at = (dst ? dst[i] : src[i]) + remote_rec_part_off(&g, k);
            node_of[(size_t)i * g.count + k] = node;
            if (dst)
                redisAppendCommand(p->c[node], "GET %b", key, kl);
            else
                redisAppendCommand(p->c[node], "SET %b %b", key, kl, at,
                                   (size_t)remote_rec_part_len(&g, k));
        }
    for (int j = 0; j < p->n; j++) {
        int done = 0;
        while (!done)
            if (redisBufferWrite(p->c[j], &done) != REDIS_OK)
                goto out;
    }
    for (int j = 0; j < p->n; j++)
        for (size_t q = 0; q < nparts; q++) {
            redisReply *r;
            if (node_of[q] != j)
                continue;
            if (redisGetReply(p->c[j], (void **)&r) != REDIS_OK)
                goto out;
            if (dst) {
                uint32_t k = (uint32_t)(q % g.count);
                size_t len = (size_t)remote_rec_part_len(&g, k);
                if (r->type != REDIS_REPLY_STRING || r->len != len) {
                    freeReplyObject(r);
                    goto out;
                }
                memcpy(dst[q / g.count] + remote_rec_part_off(&g, k), r->str, len);
            }
            freeReplyObject(r);
        }
    rc = 0;
out:
    free(node_of);
    return rc;
}

/* ---- kvcd ------------------------------------------------------------------------------ */

static int bench_kvcd(struct daemon *d, const char *extra, bool sealed)
{
    char o_nodes[300], o_key[400];
    snprintf(o_nodes, sizeof(o_nodes), "remote.nodes=%s", cl.seeds);
    snprintf(o_key, sizeof(o_key), "remote.key_file=%s", cl.key_file);
    char o_part[64];
    snprintf(o_part, sizeof(o_part), "remote.part_size=%llu",
             (unsigned long long)bench_part_size());
    const char *args[] = {"-o", "host.size=1g",
                          "-o", "host.hugepages=off",
                          "-o", extra ? o_nodes : "log.level=warning",
                          "-o", o_part,
                          "-o", "remote.max_inflight=1024",
                          "-o", "remote.batch=256",
                          "-o", "log.level=warning",
                          "-o", "cache.policy=lru",
                          "-o", o_key,
                          "-o", sealed ? "remote.seal=yes" : "remote.seal=no",
                          NULL};
    memset(d, 0, sizeof(*d));
    return daemon_start(d, args);
}

static uint64_t bench_stat(kvc_client *c, const char *name)
{
    uint64_t v = 0;
    if (daemon_client_stat(c, 0, name, &v))
        bench_fail("stat %s unreadable", name);
    return v;
}

/* ---- remote_put / remote_get --------------------------------------------------------------- */

static void bench_remote_case(const struct daemon *a, const struct daemon *b, size_t bb,
                              const char *tag, struct bench_row *rows, size_t cap, size_t *nrows)
{
    char model[64];
    double put[BENCH_REPS_MAX], get[BENCH_REPS_MAX], pput[BENCH_REPS_MAX], pget[BENCH_REPS_MAX];
    int n = BENCH_TOTAL / bb ? (int)(BENCH_TOTAL / bb) : 1;
    uint32_t bt = (uint32_t)(bb / 16384);
    struct plain p;
    kvc_client *ca = NULL, *cb = NULL;
    kvc_ns *na = NULL, *nb = NULL;
    snprintf(model, sizeof(model), "bench/remote-%s", tag);
    struct kvc_layout l = bench_layout(model, bt);
    if (kvc_connect(a->sock, &ca) || kvc_connect(b->sock, &cb) || kvc_ns_open(ca, &l, &na) ||
        kvc_ns_open(cb, &l, &nb) || kvc_ns_block_bytes(na) != bb || plain_open(&p)) {
        bench_fail("remote %s: setup failed", tag);
        return;
    }
    struct remote_rec_geom g = {0};
    if (remote_rec_geom(bb, bench_part_size(), &g) == 0)
        printf("remote %s: %d blocks, each in %u part%s of at most %llu KiB, kvcd and the plain "
               "client alike\n",
               tag, n, g.count, g.count > 1 ? "s" : "",
               (unsigned long long)((g.count > 1 ? g.size : g.len) >> 10));
    for (int rep = 0; rep < BENCH_REPS; rep++) {
        struct kvc_key keys[BENCH_MAX_BLOCKS];
        uint8_t **src, **dst;
        kvc_lease *lease = NULL;
        if (daemon_chain_keys(na, 1000u + (uint32_t)rep, (uint32_t)bb, (uint32_t)n, (uint32_t)n,
                              keys)) {
            bench_fail("keys");
            break;
        }
        src = bench_blocks(n, bb, keys);
        dst = bench_blocks(n, bb, NULL);
        if (!src || !dst) {
            bench_fail("out of memory");
            break;
        }
        /* kvcd: put through A, until A wrote every block to the cluster. */
        uint64_t w0 = bench_stat(ca, "remote_written_blocks");
        double t0 = bench_now();
        if (kvc_put_prefix(na, NULL, keys, (size_t)n, (const void *const *)src) != n)
            bench_fail("remote %s: put refused", tag);
        double deadline = t0 + 120;
        while (bench_stat(ca, "remote_written_blocks") < w0 + (uint64_t)n && bench_now() < deadline)
            usleep(100);
        double t1 = bench_now();
        if (bench_stat(ca, "remote_written_blocks") < w0 + (uint64_t)n)
            bench_fail("remote %s: A wrote too few blocks", tag);
        put[rep] = (double)n * (double)bb / (t1 - t0) / 1e9;
        /* kvcd: get through B (its reads from the cluster, then the copy). */
        t0 = bench_now();
        int hits = kvc_lookup(nb, keys, (size_t)n, 0, &lease);
        for (int i = 0; i < hits; i++)
            if (kvc_lease_copy(lease, (size_t)i, dst[i], bb))
                bench_fail("remote %s: copy failed", tag);
        if (lease)
            kvc_release(lease);
        t1 = bench_now();
        if (hits != n)
            bench_fail("remote %s: B hit %d of %d blocks", tag, hits, n);
        get[rep] = (double)n * (double)bb / (t1 - t0) / 1e9;
        for (int i = 0; i < hits; i++)
            if (daemon_block_check(&keys[i], dst[i], bb) >= 0)
                bench_fail("remote %s: wrong bytes in block %d", tag, i);
        /* The plain client, same values, same cluster. */
        t0 = bench_now();
        if (plain_move(&p, rep, n, bb, src, NULL))
            bench_fail("plain SET failed");
        t1 = bench_now();
        pput[rep] = (double)n * (double)bb / (t1 - t0) / 1e9;
        t0 = bench_now();
        if (plain_move(&p, rep, n, bb, NULL, dst))
            bench_fail("plain GET failed");
        t1 = bench_now();
        pget[rep] = (double)n * (double)bb / (t1 - t0) / 1e9;
        for (int i = 0; i < n; i++)
            if (memcmp(src[i], dst[i], bb) != 0)
                bench_fail("plain: wrong bytes in block %d", i);
        bench_blocks_free(src, n);
        bench_blocks_free(dst, n);
    }
    double mput, mget, mpput, mpget;
    double bput = bench_best(put, BENCH_REPS, &mput), bget = bench_best(get, BENCH_REPS, &mget);
    double bpput = bench_best(pput, BENCH_REPS, &mpput),
           bpget = bench_best(pget, BENCH_REPS, &mpget);
    char name[96];
    printf("remote_put_%s: kvcd %.3f GB/s (median %.3f), plain hiredis %.3f (median %.3f): "
           "ratio %.2f (median %.2f)\n",
           tag, bput, mput, bpput, mpput, bput / bpput, mput / mpput);
    printf("remote_get_%s: kvcd %.3f GB/s (median %.3f), plain hiredis %.3f (median %.3f): "
           "ratio %.2f (median %.2f)\n",
           tag, bget, mget, bpget, mpget, bget / bpget, mget / mpget);
    snprintf(name, sizeof(name), "remote_put_%s", tag);
    bench_row_add(rows, cap, nrows, name, bput, "GB/s", "hiredis_pipelined_set", bpput);
    snprintf(name, sizeof(name), "remote_get_%s", tag);
    bench_row_add(rows, cap, nrows, name, bget, "GB/s", "hiredis_pipelined_get", bpget);
    plain_close(&p);
    kvc_disconnect(ca);
    kvc_disconnect(cb);
}

/* ---- peers ------------------------------------------------------------------------------- */

struct peer_shared {
    double gbps[BENCH_REPS_MAX];
    int failed;
};

enum peer_kind { PEER_KVCD, PEER_REDIS, PEER_MEMCACHED };

struct peer_job {
    enum peer_kind kind;
    bool store; /* process A; else B, which loads and times */
    int rep;
    size_t bb;
    int n;
    const char *where; /* kvcd socket, redis socket, memcached socket */
    struct peer_shared *sh;
};

static int peer_redis(struct peer_job *j, uint8_t **v, const struct kvc_key *keys)
{
    redisContext *c = redisConnectUnix(j->where);
    char key[64];
    int rc = 0;
    if (!c || c->err)
        return 1;
    double t0 = bench_now();
    for (int i = 0; i < j->n; i++) {
        int kl = snprintf(key, sizeof(key), "p:%d:%zu:%d", j->rep, j->bb, i);
        if (j->store)
            redisAppendCommand(c, "SET %b %b", key, (size_t)kl, v[i], j->bb);
        else
            redisAppendCommand(c, "GET %b", key, (size_t)kl);
    }
    for (int i = 0; i < j->n && !rc; i++) {
        redisReply *r;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            rc = 1;
            break;
        }
        if (!j->store) {
            if (r->type == REDIS_REPLY_STRING && r->len == j->bb)
                memcpy(v[i], r->str, j->bb);
            else
                rc = 1;
        }
        freeReplyObject(r);
    }
    double t1 = bench_now();
    if (!j->store)
        j->sh->gbps[j->rep] = (double)j->n * (double)j->bb / (t1 - t0) / 1e9;
    (void)keys;
    redisFree(c);
    return rc;
}

static int peer_memcached(struct peer_job *j, uint8_t **v)
{
    memcached_st *m = memcached_create(NULL);
    char keys[BENCH_MAX_BLOCKS][64];
    const char *kp[BENCH_MAX_BLOCKS];
    size_t kl[BENCH_MAX_BLOCKS];
    int rc = 0, got = 0;
    if (!m || memcached_server_add_unix_socket(m, j->where) != MEMCACHED_SUCCESS)
        return 1;
    for (int i = 0; i < j->n; i++) {
        kl[i] = (size_t)snprintf(keys[i], sizeof(keys[i]), "p:%d:%zu:%d", j->rep, j->bb, i);
        kp[i] = keys[i];
    }
    double t0 = bench_now();
    if (j->store) {
        for (int i = 0; i < j->n && !rc; i++)
            rc = memcached_set(m, kp[i], kl[i], (const char *)v[i], j->bb, 0, 0) !=
                 MEMCACHED_SUCCESS;
    } else {
        /* mget in groups of 16 keys (ASCII protocol: with the binary one, libmemcached
         * here lost about a third of the large values it stored). */
        memcached_result_st *r;
        memcached_return_t err = MEMCACHED_SUCCESS;
        for (int i0 = 0; i0 < j->n && !rc; i0 += 16) {
            size_t g = (size_t)(j->n - i0 < 16 ? j->n - i0 : 16);
            if (memcached_mget(m, kp + i0, kl + i0, g) != MEMCACHED_SUCCESS) {
                rc = 1;
                break;
            }
            while ((r = memcached_fetch_result(m, NULL, &err)) != NULL) {
                const char *k = memcached_result_key_value(r);
                size_t len = memcached_result_length(r);
                int i = atoi(strrchr(k, ':') + 1);
                if (i >= 0 && i < j->n && len == j->bb) {
                    memcpy(v[i], memcached_result_value(r), len);
                    got++;
                }
                memcached_result_free(r);
            }
        }
        rc = rc || got != j->n;
        if (rc)
            fprintf(stderr, "bench_remote: memcached gave %d of %d values (%s)\n", got, j->n,
                    memcached_strerror(m, err));
    }
    double t1 = bench_now();
    if (!j->store)
        j->sh->gbps[j->rep] = (double)j->n * (double)j->bb / (t1 - t0) / 1e9;
    memcached_free(m);
    return rc;
}

static int peer_kvcd(struct peer_job *j, uint8_t **v, const struct kvc_key *keys, kvc_ns *ns)
{
    int rc = 0;
    double t0 = bench_now();
    if (j->store) {
        rc = kvc_put_prefix(ns, NULL, keys, (size_t)j->n, (const void *const *)v) != j->n;
    } else {
        kvc_lease *l = NULL;
        int hits = kvc_lookup(ns, keys, (size_t)j->n, 0, &l);
        for (int i = 0; i < hits; i++)
            rc |= kvc_lease_copy(l, (size_t)i, v[i], j->bb) != 0;
        if (l)
            kvc_release(l);
        rc |= hits != j->n;
    }
    double t1 = bench_now();
    if (!j->store)
        j->sh->gbps[j->rep] = (double)j->n * (double)j->bb / (t1 - t0) / 1e9;
    return rc;
}

/* One process's side of a peers case. */
static int peer_child(void *arg)
{
    struct peer_job *j = arg;
    struct kvc_key keys[BENCH_MAX_BLOCKS];
    kvc_client *c = NULL;
    kvc_ns *ns = NULL;
    char model[64];
    uint8_t **v;
    int rc;
    /* Keys from a kvcd namespace in every case: the same values everywhere. */
    snprintf(model, sizeof(model), "bench/peers-%zu", j->bb);
    struct kvc_layout l = bench_layout(model, (uint32_t)(j->bb / 16384));
    if (kvc_connect(bdir, &c) || kvc_ns_open(c, &l, &ns) ||
        daemon_chain_keys(ns, 5000u + (uint32_t)j->rep, (uint32_t)j->bb, (uint32_t)j->n,
                          (uint32_t)j->n, keys))
        return 1;
    v = bench_blocks(j->n, j->bb, j->store ? keys : NULL);
    if (!v)
        return 1;
    /* B loads twice and times the second: a long-lived engine has its mappings and
     * connections warm (every peer alike). */
    for (int pass = j->store ? 1 : 0; pass < 2; pass++) {
        if (j->kind == PEER_KVCD)
            rc = peer_kvcd(j, v, keys, ns);
        else if (j->kind == PEER_REDIS)
            rc = peer_redis(j, v, keys);
        else
            rc = peer_memcached(j, v);
        if (rc)
            break;
    }
    if (!rc && !j->store)
        for (int i = 0; i < j->n; i++)
            if (daemon_block_check(&keys[i], v[i], j->bb) >= 0)
                rc = 1;
    bench_blocks_free(v, j->n);
    kvc_disconnect(c);
    return rc;
}

static pid_t peer_server(enum peer_kind kind, const char *sock)
{
    pid_t pid = daemon_fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (kind == PEER_REDIS)
            execlp("redis-server", "redis-server", "--port", "0", "--unixsocket", sock, "--save",
                   "", "--appendonly", "no", (char *)NULL);
        else if (getuid() == 0) /* memcached refuses root unless told which user */
            execlp("memcached", "memcached", "-s", sock, "-m", "1024", "-I", "4m", "-u", "root",
                   (char *)NULL);
        else
            execlp("memcached", "memcached", "-s", sock, "-m", "1024", "-I", "4m", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200 && pid > 0; i++) {
        if (access(sock, F_OK) == 0)
            return pid;
        usleep(20000);
    }
    return -1;
}

static double peer_run(enum peer_kind kind, const char *where, size_t bb, struct peer_shared *sh,
                       double *median)
{
    double v[BENCH_REPS_MAX];
    int n = (int)((uint64_t)BENCH_TOKENS * 16384 / bb);
    if (bench_smoke())
        n = (int)(BENCH_TOTAL / bb);
    for (int rep = 0; rep < BENCH_REPS; rep++) {
        struct peer_job a = {kind, true, rep, bb, n, where, sh}, b = a;
        b.store = false;
        pid_t pa = daemon_child_spawn(peer_child, &a);
        if (pa < 0 || daemon_child_wait(pa, daemon_ms(120000), NULL) != 0) {
            bench_fail("peers: store through %d failed", (int)kind);
            return 0;
        }
        pid_t pb = daemon_child_spawn(peer_child, &b);
        if (pb < 0 || daemon_child_wait(pb, daemon_ms(120000), NULL) != 0) {
            bench_fail("peers: load through %d failed (or wrong bytes)", (int)kind);
            return 0;
        }
        v[rep] = sh->gbps[rep];
    }
    return bench_best(v, BENCH_REPS, median);
}

static void bench_peers(const struct daemon *k, size_t bb, const char *tag, struct bench_row *rows,
                        size_t cap, size_t *nrows)
{
    char rsock[300], msock[300], name[64];
    struct peer_shared *sh =
        mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    double mk, mr, mm;
    snprintf(rsock, sizeof(rsock), "%s/redis-%s.sock", k->dir, tag);
    snprintf(msock, sizeof(msock), "%s/mc-%s.sock", k->dir, tag);
    pid_t rp = peer_server(PEER_REDIS, rsock), mp = peer_server(PEER_MEMCACHED, msock);
    if (sh == MAP_FAILED || rp < 0 || mp < 0) {
        bench_fail("peers: redis-server or memcached did not start");
        return;
    }
    double kv = peer_run(PEER_KVCD, k->sock, bb, sh, &mk);
    double re = peer_run(PEER_REDIS, rsock, bb, sh, &mr);
    double me = peer_run(PEER_MEMCACHED, msock, bb, sh, &mm);
    kill(rp, SIGKILL);
    kill(mp, SIGKILL);
    waitpid(rp, NULL, 0);
    waitpid(mp, NULL, 0);
    double peer = re > me ? re : me;
    printf("peers_%s: kvcd host tier %.2f GB/s (median %.2f), redis-server %.2f (median %.2f), "
           "memcached %.2f (median %.2f): ratio to the faster peer %.1f\n",
           tag, kv, mk, re, mr, me, mm, peer > 0 ? kv / peer : 0);
    snprintf(name, sizeof(name), "peers_%s", tag);
    bench_row_add(rows, cap, nrows, name, kv, "GB/s",
                  re > me ? "redis_unix_socket" : "memcached_unix_socket", peer);
    munmap(sh, sizeof(*sh));
}

int main(int argc, char **argv)
{
    struct bench_row rows[24];
    size_t nrows = 0;
    struct daemon a, b;
    char why[256];
    const char *out = argc > 1 ? argv[1] : "build/bench/remote.json";
    if (!rcluster_available()) {
        printf("SKIP: bench_remote: redis-server or redis-cli is not installed\n");
        return bench_finish(out, rows, 0);
    }
    if (daemon_suite_init("bench_remote"))
        return 1;
    int up = rcluster_up(&cl, 3, "4gb", why, sizeof(why));
    if (up) {
        rcluster_down(&cl);
        daemon_suite_fini();
        printf("%s: bench_remote: %s\n", up > 0 ? "SKIP" : "FAIL", why);
        return up > 0 ? bench_finish(out, rows, 0) : 1;
    }
    for (int sealed = 1; sealed >= 0 && !bench_failed(); sealed--) {
        const char *sfx = sealed ? "" : "_unsealed";
        char tag[32];
        if (bench_kvcd(&a, "remote", sealed) || bench_kvcd(&b, "remote", sealed)) {
            bench_fail("kvcd did not start");
            break;
        }
        snprintf(bdir, sizeof(bdir), "%s", a.sock);
        snprintf(tag, sizeof(tag), "256k%s", sfx);
        bench_remote_case(&a, &b, 256u << 10, tag, rows, 24, &nrows);
        snprintf(tag, sizeof(tag), "2m%s", sfx);
        bench_remote_case(&a, &b, 2u << 20, tag, rows, 24, &nrows);
        snprintf(tag, sizeof(tag), "16m%s", sfx);
        bench_remote_case(&a, &b, 16u << 20, tag, rows, 24, &nrows);
        daemon_stop(&a);
        daemon_stop(&b);
        daemon_cleanup(&a);
        daemon_cleanup(&b);
    }
    /* The peers: a kvcd with no remote tier. */
    struct daemon k;
    if (!bench_failed() && bench_kvcd(&k, NULL, true) == 0) {
        snprintf(bdir, sizeof(bdir), "%s", k.sock);
        bench_peers(&k, 256u << 10, "256k", rows, 24, &nrows);
        bench_peers(&k, 2u << 20, "2m", rows, 24, &nrows);
        daemon_stop(&k);
        daemon_cleanup(&k);
    }
    rcluster_down(&cl);
    daemon_suite_fini();
    return bench_finish(out, rows, nrows);
}
