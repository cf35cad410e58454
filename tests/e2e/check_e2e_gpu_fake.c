/*
 * check_e2e_gpu_fake.c — libkvc's GPU section against a pool over the fake device, and a
 * prefix in a bounded number of device operations (issue 25).
 *
 * With a pool over the fake device (the store and server in this process): the daemon's
 * moves between the pool and the host arena run while its loop serves other clients (the
 * fake keeps the device busy until another client's requests were answered), a client that
 * cannot read the pool gets the pool's blocks when their copies have landed, the window,
 * state and KV kinds go through the pool, attach keeps the client's current device, and the
 * fake refuses a forked child that did not reset it.
 * Issue 25: host-tier hits and slots, and pool hits, move in as many device operations for
 * 64 blocks as for one; layer ranges scatter and gather only those layers; lossy codecs
 * decode on the way in. The engines are tests/lib/gpu_engine.h's; no case needs a CUDA
 * device (the real-device cases are check_e2e_gpu's).
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc.h"
#include "client/libkvc_internal.h"
#include "daemon/acl.h"
#include "daemon/config.h"
#include "daemon/engine.h"
#include "daemon/engine_gpu.h"
#include "daemon/log.h"
#include "daemon/loop.h"
#include "daemon/server.h"
#include "daemon/store.h"
#include "kernels/kern.h"
#include "kernels/kern_batch.h"
#include "kernels/kern_dev.h"
#include "kernels/kern_fmt.h"
#include "kernels/kern_pack.h"
#include "tests/lib/daemon.h"
#include "tests/lib/fake_dev.h"
#include "tests/lib/gpu_engine.h"
#include "tests/lib/inproc.h"
/* ---- a pool over the fake device: the server in this process, clients forked ------------ */

/* The store and server run here with a pool on fake device 0 (a memfd); each client is a
 * forked child that resets the fake first (a fresh process for the driver) and imports the
 * pool from the descriptor the server passes, as a real engine process would. */
struct gf_server {
    struct daemon d;
    struct inproc ip;
};

static struct gf_server gf;

/* What kvcd's main does with the pool's descriptor: its copies completed on the loop, then
 * the requests that wait for them (a lookup held for the pool's move slots) asked again. */
static void gf_on_gpu(struct loop *l, int fd, uint32_t events, void *arg)
{
    struct gf_server *x = arg;
    (void)fd;
    (void)events;
    engine_gpu_poll(x->ip.s, loop_now_ms(l));
    server_retry(x->ip.sv, loop_now_ms(l));
}

/* The server over a pool of gpu_size bytes, disk.put_wait = put_wait_ms (-1: its default). */
static void gf_setup_with(uint64_t gpu_size, int put_wait_ms)
{
    struct store_params sp = {.host_size = 16 << 20,
                              .host_page_size = 64 << 10,
                              .high_watermark = 0.95,
                              .low_watermark = 0.9,
                              .max_namespaces = 8,
                              .max_handles = 64,
                              .policy = POLICY_LRU,
                              .gpu_size = gpu_size,
                              .gpu_device = 0,
                              .gpu_page_size = 64 << 10,
                              .gpu_ops = &fake_dev_ops};
    struct config *cfg = config_new();
    memset(&gf, 0, sizeof(gf));
    log_setup(LOG_LEVEL_WARNING, 1000);
    ck_assert_int_eq(daemon_dir_init(&gf.d), 0);
    fake_dev_reset(2);
    ck_assert_ptr_nonnull(cfg);
    if (put_wait_ms >= 0)
        cfg->disk_put_wait = (uint64_t)put_wait_ms;
    inproc_start(&gf.ip, cfg, &sp, gf.d.sock, 0600, 16);
    ck_assert_ptr_nonnull(gf.ip.s->gpu);
    ck_assert_int_eq(loop_add(gf.ip.l, engine_gpu_fd(gf.ip.s), EPOLLIN, gf_on_gpu, &gf), 0);
}

static void gf_setup(void)
{
    gf_setup_with(4 << 20, -1);
}

static void gf_teardown(void)
{
    kvci_gpu_ops_set(NULL);
    inproc_stop(&gf.ip);
    ck_assert_int_eq(fake_dev.pools_live, 0);
    ck_assert_int_eq(fake_dev.registered, 0);
    ck_assert_uint_eq(fake_dev.queued, 0);
    ck_assert_uint_eq(fake_dev.fork_refused, 0);
    daemon_cleanup(&gf.d);
}

/* Runs fn in a forked client while this process serves it; its exit status. */
static int gf_run(int (*fn)(void *), void *arg)
{
    return inproc_run(&gf.ip, daemon_child_spawn(fn, arg));
}

/* A client process: the driver starts here (fake reset), on device `dev`. */
static int gf_client(int dev, kvc_client **c, kvc_ns **ns, struct kvc_key *keys)
{
    static uint32_t tokens[GE_TOKENS];
    struct kvc_layout lay = ge_layout();
    fake_dev_reset(2);
    fake_dev_current_set(dev);
    kvci_gpu_ops_set(&fake_dev_ops);
    for (uint32_t i = 0; i < GE_TOKENS; i++)
        tokens[i] = 2000 + i;
    if (kvc_connect(gf.d.sock, c) || kvc_ns_open(*c, &lay, ns))
        return -1;
    return kvc_keys_from_tokens(*ns, NULL, tokens, GE_TOKENS, NULL, 0, keys, GE_BLOCKS) == GE_BLOCKS
               ? 0
               : -1;
}

/* Child: the engine's thread is on device 1, the pool on device 0. The pool's mapping
 * would be usable from device 0 only, so attach says host copies and leaves the thread on
 * device 1; a thread on device 0 maps it. */
static int gf_attach_other_device(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key keys[GE_BLOCKS];
    (void)arg;
    if (gf_client(1, &c, &ns, keys))
        return 10;
    if (kvc_gpu_attach(c) != 0)
        return 11;
    if (fake_dev_current() != 1)
        return 12;
    if (fake_dev.pools_live != 0)
        return 13; /* not even imported */
    kvc_disconnect(c);
    fake_dev_current_set(0);
    if (gf_client(0, &c, &ns, keys))
        return 14;
    if (kvc_gpu_attach(c) != 1 || fake_dev.pools_live != 1 || fake_dev_current() != 0)
        return 15;
    kvc_disconnect(c);
    if (fake_dev.pools_live != 0 || fake_dev.streams_live != 0 || fake_dev_last_error())
        return 16;
    return 0;
}

START_TEST(test_attach_keeps_current_device)
{
    ck_assert_int_eq(gf_run(gf_attach_other_device, NULL), 0);
}
END_TEST

/* Child: a put into the pool with kvc_resv_write() and a load of the pool hit with
 * kvc_lease_copy() (synchronous: the bytes are in place on return), then a load with
 * kvc_lease_copy_cuda() into device memory on the engine's stream: device to device,
 * queued (nothing lands before the stream or the lease is waited for), no allocation and no
 * wait on the legacy default stream per hit, and kvc_release() waits for it. */
static int gf_pool_put_load(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS];
    (void)arg;
    if (gf_client(0, &c, &ns, keys))
        return 20;
    if (kvc_gpu_attach(c) != 1)
        return 21;
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *src = malloc(bb), *dst = malloc(bb), *dev = NULL;
    void *stream = fake_dev_stream(0);
    if (!src || !dst || !stream || fake_dev_ops.mem_alloc((void **)&dev, bb))
        return 22;
    daemon_block_fill(&keys[0], src, bb);
    if (kvc_reserve_gpu(ns, NULL, keys, 1, &r) != 1 || kvc_resv_data(r, 0) == NULL)
        return 23;
    if (fake_dev_ops.pointer_device(kvc_resv_data(r, 0)) != 0)
        return 24; /* a pool slot */
    if (kvc_resv_write(r, 0, src, bb) != 0 || kvc_commit(r, SIZE_MAX) != 1)
        return 25;
    if (kvc_lookup(ns, keys, 1, KVC_LOOKUP_GPU, &l) != 1 || kvc_lease_tier(l, 0) != KVC_TIER_GPU)
        return 26;
    /* The committed bytes are in the pool (the fake's pool reads as host memory). */
    if (daemon_block_check(&keys[0], kvc_lease_data(l, 0), bb) != -1)
        return 27;
    memset(dst, 0, bb);
    if (kvc_lease_copy(l, 0, dst, bb) != 0 || daemon_block_check(&keys[0], dst, bb) != -1)
        return 28;
    memset(dev, 0, bb);
    uint64_t allocs = fake_dev.allocs, legacy = fake_dev.legacy_syncs;
    if (kvc_lease_copy_cuda(l, 0, dev, bb, stream) != 0)
        return 29;
    if (fake_dev.bad_kinds || fake_dev_last_error())
        return 30;
    if (fake_dev.queued != 1 || daemon_block_check(&keys[0], dev, bb) == -1)
        return 31; /* queued on the engine's stream, not performed yet */
    if (kvc_release(l) != 0)
        return 32;
    if (fake_dev.queued != 0 || daemon_block_check(&keys[0], dev, bb) != -1)
        return 33; /* the release waited for it */
    if (fake_dev.allocs != allocs || fake_dev.legacy_syncs != legacy)
        return 34;
    if (fake_dev_current() != 0)
        return 35;
    fake_dev_ops.mem_free(dev);
    fake_dev_stream_free(stream);
    free(src);
    free(dst);
    kvc_disconnect(c); /* gives back the events libkvc keeps for reuse */
    return fake_dev.pools_live == 0 && fake_dev.streams_live == 0 && fake_dev.events_live == 0 ? 0
                                                                                               : 36;
}

/* The window (3 blocks of GE_BT) and the state namespaces of the kinds cases; keys as
 * gf_client's. */
#define GF_WIN (3 * GE_BT - 5)
static int gf_kind_open(kvc_client *c, enum kvc_kv_kind kind, kvc_ns **ns, struct kvc_key *keys)
{
    static uint32_t tokens[GE_TOKENS];
    struct kvc_layout lay = ge_layout();
    lay.kv_kind = kind;
    lay.model_id = kind == KVC_KV_KIND_STATE ? "e2e-gpu-state" : "e2e-gpu-swa";
    for (uint32_t i = 0; i < GE_TOKENS; i++)
        tokens[i] = 3000 + i;
    if (kind == KVC_KV_KIND_KV_WINDOW ? kvc_ns_open_window(c, &lay, GF_WIN, ns)
                                      : kvc_ns_open(c, &lay, ns))
        return -1;
    return kvc_keys_from_tokens(*ns, NULL, tokens, GE_TOKENS, NULL, 0, keys, GE_BLOCKS) == GE_BLOCKS
               ? 0
               : -1;
}

/* A lookup with flags of the window (w, keys kw) and of the state (st, keys ks) that
 * gf_kinds_pool_put stored: the window of the whole prefix (its last 3 blocks) and the state
 * of prefix 4, in tier, every byte the put's. 0, or what was wrong: 1 the window's lookup, 2
 * its blocks, 3 the state. */
static int gf_kinds_check(kvc_ns *w, const struct kvc_key *kw, kvc_ns *st, const struct kvc_key *ks,
                          unsigned flags, int tier)
{
    size_t bb = kvc_ns_block_bytes(w), sb = kvc_ns_block_bytes(st);
    kvc_lease *l;
    if (kvc_lookup(w, kw, GE_BLOCKS, flags, &l) != 3 || kvc_lease_first(l) != GE_BLOCKS - 3)
        return 1;
    for (size_t i = 0; i < 3; i++)
        if (kvc_lease_tier(l, i) != tier ||
            daemon_block_check(&kw[GE_BLOCKS - 3 + i], kvc_lease_data(l, i), bb) != -1)
            return 2;
    kvc_release(l);
    if (kvc_lookup(st, ks, GE_BLOCKS, flags, &l) != 1 || kvc_lease_first(l) != 3 ||
        kvc_lease_tier(l, 0) != tier || daemon_block_check(&ks[3], kvc_lease_data(l, 0), sb) != -1)
        return 3;
    kvc_release(l);
    return 0;
}

/* Child: puts every window block (each a root) and the states at blocks 1 and 3 into the
 * pool; a pool-mapped lookup answers the window of the whole prefix and the state of prefix
 * 4 as pool locations, with and without READY_ONLY, every byte the put's. */
static int gf_kinds_pool_put(void *arg)
{
    kvc_client *c;
    kvc_ns *w, *st;
    kvc_resv *r;
    struct kvc_key kw[GE_BLOCKS], ks[GE_BLOCKS];
    (void)arg;
    fake_dev_reset(2);
    fake_dev_current_set(0);
    kvci_gpu_ops_set(&fake_dev_ops);
    if (kvc_connect(gf.d.sock, &c) || kvc_gpu_attach(c) != 1 ||
        gf_kind_open(c, KVC_KV_KIND_KV_WINDOW, &w, kw) ||
        gf_kind_open(c, KVC_KV_KIND_STATE, &st, ks))
        return 90;
    size_t bb = kvc_ns_block_bytes(w), sb = kvc_ns_block_bytes(st);
    for (size_t i = 0; i < GE_BLOCKS; i++) {
        if (kvc_reserve_gpu(w, NULL, &kw[i], 1, &r) != 1 ||
            fake_dev_ops.pointer_device(kvc_resv_data(r, 0)) != 0)
            return 91;
        daemon_block_fill(&kw[i], kvc_resv_data(r, 0), bb);
        if (kvc_commit(r, SIZE_MAX) != 1)
            return 92;
        if (i != 1 && i != 3)
            continue;
        if (kvc_reserve_gpu(st, NULL, &ks[i], 1, &r) != 1)
            return 93;
        daemon_block_fill(&ks[i], kvc_resv_data(r, 0), sb);
        if (kvc_commit(r, SIZE_MAX) != 1)
            return 94;
    }
    for (unsigned f = 0; f < 2; f++) {
        int rc = gf_kinds_check(w, kw, st, ks, KVC_LOOKUP_GPU | (f ? KVC_LOOKUP_READY_ONLY : 0),
                                KVC_TIER_GPU);
        if (rc)
            return 94 + rc;
    }
    kvc_disconnect(c);
    return 0;
}

/* Child: a client that cannot read the pool. A READY_ONLY lookup answers no span in the
 * pool (not readable by it) but starts their copies to the host; a plain lookup waits for
 * them: the same window and state, host locations, every byte the put's. */
static int gf_kinds_host_load(void *arg)
{
    kvc_client *c;
    kvc_ns *w, *st;
    kvc_lease *l;
    struct kvc_key kw[GE_BLOCKS], ks[GE_BLOCKS];
    int h;
    (void)arg;
    if (kvc_connect(gf.d.sock, &c) || gf_kind_open(c, KVC_KV_KIND_KV_WINDOW, &w, kw) ||
        gf_kind_open(c, KVC_KV_KIND_STATE, &st, ks))
        return 100;
    h = kvc_lookup(w, kw, GE_BLOCKS, KVC_LOOKUP_READY_ONLY, &l);
    if (h > 0) {
        /* Whatever it answers is a whole window in host memory. */
        if (h != 3 || kvc_lease_first(l) != GE_BLOCKS - 3 || kvc_lease_tier(l, 0) != KVC_TIER_HOST)
            return 101;
        kvc_release(l);
    }
    /* Asked until the copies out of the pool landed: READY_ONLY alone gets there. */
    for (int i = 0; i < 500 && h <= 0; i++) {
        usleep(2000);
        h = kvc_lookup(w, kw, GE_BLOCKS, KVC_LOOKUP_READY_ONLY, &l);
        if (h > 0)
            kvc_release(l);
    }
    if (h != 3)
        return 102;
    if ((h = gf_kinds_check(w, kw, st, ks, 0, KVC_TIER_HOST)))
        return 102 + h;
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_kinds_through_the_pool)
{
    ck_assert_int_eq(gf_run(gf_kinds_pool_put, NULL), 0);
    ck_assert_int_eq(gf_run(gf_kinds_host_load, NULL), 0);
}
END_TEST

START_TEST(test_pool_copies_land_in_order)
{
    ck_assert_int_eq(gf_run(gf_pool_put_load, NULL), 0);
    /* The daemon side saw the client's bytes in the pool. */
    ck_assert_uint_gt(store_gpu_used(gf.ip.s), 0);
}
END_TEST

/* Puts the prefix (a child's): into the pool by a pool-mapped client (device 0) where pool,
 * else into the host arena by a client that cannot read the pool. 0, or the step that
 * failed. */
static int gf_put(int pool)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    struct kvc_key keys[GE_BLOCKS];
    if (gf_client(0, &c, &ns, keys) || (pool && kvc_gpu_attach(c) != 1))
        return 60;
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *src = malloc(bb);
    if (!src || (pool ? kvc_reserve_gpu(ns, NULL, keys, GE_BLOCKS, &r)
                      : kvc_reserve(ns, NULL, keys, GE_BLOCKS, &r)) != GE_BLOCKS)
        return 61;
    for (size_t i = 0; i < GE_BLOCKS; i++) {
        daemon_block_fill(&keys[i], src, bb);
        if (kvc_resv_write(r, i, src, bb))
            return 62;
    }
    if (kvc_commit(r, SIZE_MAX) != GE_BLOCKS)
        return 63;
    free(src);
    kvc_disconnect(c);
    return 0;
}

/* Child: puts the prefix into the pool (a pool-mapped client, device 0). */
static int gf_put_pool(void *arg)
{
    (void)arg;
    return gf_put(1);
}

/* Child: a client that cannot read the pool loads the prefix: its lookup waits until the
 * daemon's copies out of the pool have landed, then every byte is the put's. */
static int gf_load_host(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS];
    (void)arg;
    if (gf_client(0, &c, &ns, keys))
        return 70;
    if (kvc_lookup(ns, keys, GE_BLOCKS, 0, &l) != GE_BLOCKS)
        return 71;
    size_t bb = kvc_ns_block_bytes(ns);
    for (size_t i = 0; i < GE_BLOCKS; i++)
        if (kvc_lease_tier(l, i) != KVC_TIER_HOST ||
            daemon_block_check(&keys[i], kvc_lease_data(l, i), bb) != -1)
            return 72;
    if (kvc_release(l))
        return 73;
    kvc_disconnect(c);
    return 0;
}

/* Child: another client, with its own prefix in the host arena: a put, a lookup. */
static int gf_other_client(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS], mine[2];
    uint32_t tokens[2 * GE_BT];
    (void)arg;
    if (gf_client(0, &c, &ns, keys))
        return 80;
    for (uint32_t i = 0; i < 2 * GE_BT; i++)
        tokens[i] = 900000 + i;
    if (kvc_keys_from_tokens(ns, NULL, tokens, 2 * GE_BT, NULL, 0, mine, 2) != 2)
        return 81;
    size_t bb = kvc_ns_block_bytes(ns);
    if (kvc_reserve(ns, NULL, mine, 2, &r) != 2)
        return 82;
    for (size_t i = 0; i < 2; i++)
        daemon_block_fill(&mine[i], kvc_resv_data(r, i), bb);
    if (kvc_commit(r, SIZE_MAX) != 2 || kvc_lookup(ns, mine, 2, 0, &l) != 2)
        return 83;
    for (size_t i = 0; i < 2; i++)
        if (daemon_block_check(&mine[i], kvc_lease_data(l, i), bb) != -1)
            return 84;
    kvc_release(l);
    kvc_disconnect(c);
    return 0;
}

struct gf_moves {
    pid_t loader, other;
    int loader_status, other_status;
    bool other_done_while_held; /* the other client finished with the moves still held */
};

static struct gf_moves gm;

static void gf_moves_stat(void *arg, const char *name, uint64_t v)
{
    if (strcmp(name, "gpu_moves_inflight") == 0)
        *(uint64_t *)arg = v;
}

/* The loop's tick for test_pool_moves_off_the_loop: once the loader's lookup has started
 * the moves (held by the fake), the other client runs; when it is done, the device is let
 * go; the loop stops when both are gone. */
static void gf_moves_tick(void *arg)
{
    struct gf_server *x = arg;
    uint64_t inflight = 0;
    int st;
    server_tick(x->ip.sv);
    engine_gpu_stats(x->ip.s, gf_moves_stat, &inflight);
    if (gm.other == 0 && gm.other_status < 0 && inflight == GE_BLOCKS)
        gm.other = daemon_child_spawn(gf_other_client, NULL);
    if (gm.other > 0 && waitpid(gm.other, &st, WNOHANG) == gm.other) {
        gm.other_status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        gm.other = 0;
        gm.other_done_while_held = inflight == GE_BLOCKS && gm.loader > 0;
        fake_dev.hold = 0;
    }
    if (gm.loader > 0 && waitpid(gm.loader, &st, WNOHANG) == gm.loader) {
        gm.loader_status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        gm.loader = 0;
    }
    if (gm.loader == 0 && gm.other == 0 && server_clients(x->ip.sv) == 0)
        loop_stop(x->ip.l);
}

/* The daemon's copies out of the pool are queued and completed by its loop: while the
 * device is kept busy with them, another client's put and lookup are answered, the loader's
 * lookup waits (not ready), and once the copies land it gets every byte. The loop thread
 * waits for no copy. */
START_TEST(test_pool_moves_off_the_loop)
{
    ck_assert_int_eq(gf_run(gf_put_pool, NULL), 0);
    ck_assert_uint_eq(store_gpu_used(gf.ip.s), GE_BLOCKS * store_ns_get(gf.ip.s, 1)->block_bytes);
    uint64_t waits = fake_dev.waits;
    memset(&gm, 0, sizeof(gm));
    gm.loader_status = gm.other_status = -1;
    fake_dev.hold = 1;
    gm.loader = daemon_child_spawn(gf_load_host, NULL);
    ck_assert_int_gt(gm.loader, 0);
    loop_run(gf.ip.l, 20, gf_moves_tick, &gf);
    fake_dev.hold = 0;
    ck_assert_int_eq(gm.other_status, 0);
    ck_assert_msg(gm.other_done_while_held, "the other client was not served during the moves");
    ck_assert_int_eq(gm.loader_status, 0);
    ck_assert_uint_eq(gf.ip.s->total.gpu_demoted_blocks, GE_BLOCKS);
    ck_assert_uint_eq(store_gpu_used(gf.ip.s), 0);
    ck_assert_uint_eq(fake_dev.waits, waits); /* the loop never waited for a copy */
    ck_assert_int_eq(fake_dev_last_error(), 0);
}
END_TEST

/* ---- issue 26: promotions wait for the release of the lease that hit them ---------------- */

/* Child: a client that cannot read the pool puts the prefix into the host arena. */
static int gf_put_host(void *arg)
{
    (void)arg;
    return gf_put(0);
}

/* The daemon's counter `name` (0 if it has none). */
static uint64_t gf_stat(kvc_client *c, const char *name)
{
    struct kvc_stat *st = NULL;
    size_t n = 0;
    uint64_t v = 0;
    if (kvc_stats(c, 0, &st, &n) == 0)
        for (size_t i = 0; i < n; i++)
            if (strcmp(st[i].name, name) == 0)
                v = st[i].value;
    free(st);
    return v;
}

/* Child: a client that mapped the pool hits the host blocks (KVC_LOOKUP_GPU): while it
 * holds the lease the daemon starts no promotion of them (no pool slot taken, nothing
 * copied beside the client's own load); once released they are promoted, and its next
 * lookup names the pool, with the same bytes. */
static int gf_promote_after_release(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS];
    (void)arg;
    if (gf_client(0, &c, &ns, keys) || kvc_gpu_attach(c) != 1)
        return 80;
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *back = malloc(bb);
    if (!back || kvc_lookup(ns, keys, GE_BLOCKS, KVC_LOOKUP_GPU, &l) != GE_BLOCKS)
        return 81;
    for (size_t i = 0; i < GE_BLOCKS; i++)
        if (kvc_lease_tier(l, i) != KVC_TIER_HOST ||
            daemon_block_check(&keys[i], kvc_lease_data(l, i), bb) != -1)
            return 82;
    if (gf_stat(c, "gpu_used") != 0 || gf_stat(c, "gpu_promoted_blocks") != 0)
        return 83; /* promotions started under the lease */
    kvc_release(l);
    for (int i = 0; i < 500 && gf_stat(c, "gpu_promoted_blocks") < GE_BLOCKS; i++)
        usleep(10000);
    if (gf_stat(c, "gpu_promoted_blocks") != GE_BLOCKS)
        return 84;
    if (kvc_lookup(ns, keys, GE_BLOCKS, KVC_LOOKUP_GPU, &l) != GE_BLOCKS)
        return 85;
    for (size_t i = 0; i < GE_BLOCKS; i++)
        if (kvc_lease_tier(l, i) != KVC_TIER_GPU || kvc_lease_copy(l, i, back, bb) ||
            daemon_block_check(&keys[i], back, bb) != -1)
            return 86;
    kvc_release(l);
    free(back);
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_promotion_after_release)
{
    ck_assert_int_eq(gf_run(gf_put_host, NULL), 0);
    ck_assert_uint_eq(store_gpu_used(gf.ip.s), 0);
    ck_assert_int_eq(gf_run(gf_promote_after_release, NULL), 0);
    ck_assert_uint_eq(gf.ip.s->total.gpu_promoted_blocks, GE_BLOCKS);
    ck_assert_int_eq(fake_dev_last_error(), 0);
}
END_TEST

/* Issue 26: a lookup's half-life tuner work (the default policy) runs after its reply is
 * sent, once the loop has paused (server_handle, loop_pause), and by the time a client's
 * requests are answered none is left: each of its lookups' keys reached the tuner, none waits
 * for a later request. The last lookup is the client's last request (its connection ends
 * with the process: no release, no SYNC after it), so only the pause applies its work. */
#define GF_LOOKUP_KEYS 64 /* SERVER_POST_PAUSE_KEYS: the put's prefix and misses after it */
static int gf_lookups(void *arg)
{
    static uint32_t tokens[GF_LOOKUP_KEYS * GE_BT];
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_key keys[GF_LOOKUP_KEYS];
    (void)arg;
    if (gf_client(0, &c, &ns, keys))
        return 90;
    for (uint32_t i = 0; i < GF_LOOKUP_KEYS * GE_BT; i++)
        tokens[i] = 2000 + i; /* gf_client's tokens, longer */
    if (kvc_keys_from_tokens(ns, NULL, tokens, GF_LOOKUP_KEYS * GE_BT, NULL, 0, keys,
                             GF_LOOKUP_KEYS) != GF_LOOKUP_KEYS)
        return 95;
    for (int i = 0; i < 3; i++) {
        if (kvc_lookup(ns, keys, GF_LOOKUP_KEYS, 0, &l) != GE_BLOCKS)
            return 91;
        if (kvc_release(l))
            return 92;
    }
    /* a lookup shorter than SERVER_POST_PAUSE_KEYS: its work right after its reply */
    if (kvc_lookup(ns, keys, GE_BLOCKS, 0, &l) != GE_BLOCKS)
        return 96;
    if (kvc_release(l))
        return 97;
    if (kvc_flush(c)) /* the releases answered: nothing is sent after the last lookup */
        return 93;
    if (kvc_lookup(ns, keys, GF_LOOKUP_KEYS, 0, &l) != GE_BLOCKS)
        return 94;
    return 0; /* its pins die with the connection */
}

START_TEST(test_lookup_tunes_after_reply)
{
    struct store *s = gf.ip.s;
    const struct store_ns *ns = NULL;
    s->p.policy = POLICY_DEFAULT; /* for the namespace the put opens */
    ck_assert_int_eq(gf_run(gf_put_host, NULL), 0);
    const uint64_t pauses = loop_pauses(gf.ip.l);
    ck_assert_int_eq(gf_run(gf_lookups, NULL), 0);
    /* one pause a reply of a lookup of 64 keys, none for the short one; each lookup's work
     * applied by its pause or before the request after it, the short one's at once, the last
     * one's by its pause alone */
    ck_assert_uint_eq(loop_pauses(gf.ip.l) - pauses, 4);
    for (uint32_t i = 1; i < s->nns && !ns; i++)
        ns = store_ns_get(s, i);
    ck_assert_ptr_nonnull(ns);
    ck_assert_int_eq(ns->policy, POLICY_DEFAULT);
    ck_assert(s->post_defer);
    ck_assert_uint_eq(s->post_ns, 0);
    ck_assert_ptr_nonnull(ns->tune);
    ck_assert_uint_eq(ns->tune->refs, 4 * GF_LOOKUP_KEYS + GE_BLOCKS);
}
END_TEST

/* Check forks each case from main(), and these fork clients: a child of a process whose
 * driver is started is refused (CUDA is undefined there) until it starts its own. */
static int gf_forked_without_reset(void *arg)
{
    (void)arg;
    int n = fake_dev_ops.device_count();
    uint64_t refused = fake_dev.fork_refused;
    fake_dev_reset(1);
    return n == 0 && refused == 1 && fake_dev_ops.device_count() == 1 ? 0 : 40;
}

START_TEST(test_fake_refuses_forked_child)
{
    ck_assert_int_eq(fake_dev_ops.device_count(), 2); /* the server's driver is started */
    pid_t p = daemon_child_spawn(gf_forked_without_reset, NULL);
    ck_assert_int_eq(daemon_child_wait(p, daemon_ms(10000), NULL), 0);
}
END_TEST

/* ---- issue 25: a prefix in a bounded number of device operations; layer ranges ------------
 *
 * The engine side: per-layer K and V tensors of GB_PAGES pages of GB_PAGE tokens, a shuffled
 * block table, in fake device memory (or host memory), GB_BLOCKS blocks of tokens. Device
 * operations of a call = what it queued (copies, copy batches, kernels) plus the events it
 * recorded (fake_dev.ops + fake_dev.records), counted for 1, 4 and 64 blocks. The engine is
 * tests/lib/gpu_engine.h's gb_engine. */

/* Issue 25: host-tier hits and slots (a daemon without a pool, the fake device) move in as
 * many device operations for 64 blocks as for one. Per call, whatever the count, into
 * vLLM's packed paged tensors (pad 0, _i == 0: contiguous sections):
 *   kvc_resv_gather (a put into host slots): one device-to-host batch straight from the
 *   pages (a range per (block, layer, kind, page)), record;
 *   kvc_lease_copy_range_async: one host-to-device batch, record;
 *   kvc_lease_scatter and kvc_lease_scatter_layers: one host-to-device batch straight into
 *   the pages, record; no kernel, no staging;
 * and with padded heads (a strided layout, _i == 1): the gather kernel into device staging
 * and one device-to-host batch, record; the scatters one host-to-device batch into staging
 * (the layers moved), the scatter kernel (row steps), record. Packed again at libkvc's
 * default least DMA piece (_i == 2: these 4 KiB page pieces are below it; ge_setup lowers
 * it for the other cases; here KVC_GPU_DMA_MIN is not a number, which libkvc ignores): staged
 * as the strided layout is, by the kernel's run steps.
 * (Before: every layout took the staged path, and the real device made one DMA call per
 * contiguous range of a batch: a range per host block.) Every byte checked, pages of a
 * shuffled block table. */
START_TEST(test_host_hits_bounded_ops)
{
    const uint32_t pad = _i == 1 ? 16 : 0;
    static const uint32_t counts[] = {1, 4, GB_BLOCKS};
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    kvc_lease *l;
    struct kvc_layout lay = gb_layout(2);
    struct kvc_key keys[GB_BLOCKS];
    struct gb_engine src, dst;
    uint64_t ops[3][4];
    ck_assert_int_eq(kvc_connect(ge_d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fake_dev_reset(1);
    kvci_gpu_ops_set(&fake_dev_ops);
    if (_i == 2) /* not a number of bytes: libkvc keeps its default (4096 would go direct) */
        setenv("KVC_GPU_DMA_MIN", "4096x", 1);
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    void *stream = fake_dev_stream(0);
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *buf = NULL;
    ck_assert_int_eq(fake_dev_ops.mem_alloc((void **)&buf, GB_BLOCKS * bb), 0);
    gb_engine_init_pad(&src, 2, 1, 1, 1, pad);
    gb_engine_init_pad(&dst, 2, 1, 0, 0, pad);
    uint8_t *want = gb_blocks(&src, GB_BLOCKS, bb);
    const uint64_t packs0 = fake_dev.packs, runs0 = fake_dev.pack_runs;
    const uint64_t ranges0 = fake_dev.dma_ranges;
    for (int i = 0; i < 3; i++) {
        uint32_t n = counts[i];
        uint64_t o;
        gb_keys(ns, 300000 + 10000 * n + 1000 * pad, n, keys);
        ck_assert_int_eq(kvc_reserve(ns, NULL, keys, n, &r), (int)n);
        o = gb_ops();
        ck_assert_int_eq(kvc_resv_gather(r, 0, n, &src.kv, 0, stream, NULL), (int)n);
        ops[i][0] = gb_ops() - o;
        ck_assert_int_eq(kvc_commit(r, SIZE_MAX), (int)n);
        ck_assert_int_eq(kvc_lookup(ns, keys, n, 0, &l), (int)n);
        memset(buf, 0, n * bb);
        o = gb_ops();
        ck_assert_int_eq(kvc_lease_copy_range_async(l, 0, n, buf, n * bb, stream), (int)n);
        ops[i][1] = gb_ops() - o;
        gb_engine_clear(&dst);
        o = gb_ops();
        ck_assert_int_eq(kvc_lease_scatter(l, 0, n, &dst.kv, 0, stream, NULL), (int)n);
        ops[i][2] = gb_ops() - o;
        ck_assert_int_eq(kvc_release(l), 0);
        ck_assert(memcmp(buf, want, n * bb) == 0);
        ck_assert_int_eq(gb_engine_check(&dst, &src, n * GE_BT, 0, 2), 0);
        gb_engine_clear(&dst);
        ck_assert_int_eq(kvc_lookup(ns, keys, n, 0, &l), (int)n);
        o = gb_ops();
        ck_assert_int_eq(kvc_lease_scatter_layers(l, 0, n, &dst.kv, 0, 1, 1, stream, NULL), (int)n);
        ops[i][3] = gb_ops() - o;
        ck_assert_int_eq(kvc_release(l), 0);
        ck_assert_int_eq(gb_engine_check(&dst, &src, n * GE_BT, 1, 1), 0);
    }
    printf(
        "e2e_gpu: host hits, %s layout, device operations per call (1/4/64 blocks): gather "
        "%llu/%llu/%llu, copy range %llu/%llu/%llu, scatter %llu/%llu/%llu, scatter of a layer "
        "%llu/%llu/%llu; DMA ranges in all %llu\n",
        _i == 1 ? "strided"
        : _i    ? "contiguous (staged at the default)"
                : "contiguous",
        (unsigned long long)ops[0][0], (unsigned long long)ops[1][0], (unsigned long long)ops[2][0],
        (unsigned long long)ops[0][1], (unsigned long long)ops[1][1], (unsigned long long)ops[2][1],
        (unsigned long long)ops[0][2], (unsigned long long)ops[1][2], (unsigned long long)ops[2][2],
        (unsigned long long)ops[0][3], (unsigned long long)ops[1][3], (unsigned long long)ops[2][3],
        (unsigned long long)(fake_dev.dma_ranges - ranges0));
    for (int k = 0; k < 4; k++) {
        ck_assert_uint_eq(ops[0][k], ops[1][k]);
        ck_assert_uint_eq(ops[0][k], ops[2][k]);
    }
    ck_assert_uint_eq(ops[0][1], 2); /* host-to-device batch, record */
    if (_i) {
        ck_assert_uint_eq(ops[0][0], 3); /* gather kernel, device-to-host batch, record */
        ck_assert_uint_eq(ops[0][2], 3); /* host-to-device batch, scatter kernel, record */
        ck_assert_uint_eq(ops[0][3], 3);
        ck_assert_uint_eq(fake_dev.packs - packs0, 9);
        /* row steps where the heads are padded, run steps where they are packed */
        ck_assert_uint_eq(fake_dev.pack_runs - runs0, _i == 1 ? 0 : 9);
    } else {
        ck_assert_uint_eq(ops[0][0], 2); /* device-to-host batch from the pages, record */
        ck_assert_uint_eq(ops[0][2], 2); /* host-to-device batch into the pages, record */
        ck_assert_uint_eq(ops[0][3], 2);
        ck_assert_uint_eq(fake_dev.packs - packs0, 0); /* no kernel, no staging */
    }
    ck_assert_uint_eq(fake_dev.bad_kinds + fake_dev.bad_packs, 0);
    ck_assert_int_eq(fake_dev_last_error(), 0);
    free(want);
    fake_dev_ops.mem_free(buf);
    gb_engine_fini(&src);
    gb_engine_fini(&dst);
    fake_dev_stream_free(stream);
    kvc_disconnect(c);
    ck_assert_int_eq(fake_dev.events_live, 0);
    kvci_gpu_ops_set(NULL);
}
END_TEST

/* Issue 26: kvc_lease_scatter_layers moves only the layers asked for — into fake device
 * tensors and into host tensors (on_device 0), packed (_i == 0: the host blocks by DMA
 * straight into the pages) and with padded heads (_i == 1: staged, the scatter kernel) — and
 * leaves the others as they were (the heads' padding too); bad ranges are refused before
 * anything moves. */
START_TEST(test_scatter_layers_only_those)
{
    const uint32_t pad = _i ? 16 : 0;
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_layout lay = gb_layout(4);
    struct kvc_key keys[GB_BLOCKS];
    struct gb_engine src, dst;
    const uint32_t n = 5;
    ck_assert_int_eq(kvc_connect(ge_d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fake_dev_reset(1);
    kvci_gpu_ops_set(&fake_dev_ops);
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    void *stream = fake_dev_stream(0);
    size_t bb = kvc_ns_block_bytes(ns);
    gb_engine_init_pad(&src, 4, 0, 1, 3, pad);
    uint8_t *blocks = gb_blocks(&src, n, bb);
    const void *bp[GB_BLOCKS];
    for (uint32_t j = 0; j < n; j++)
        bp[j] = blocks + j * bb;
    gb_keys(ns, 700000, n, keys);
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, keys, n, bp), (int)n);
    for (int dev = 0; dev < 2; dev++) {
        gb_engine_init_pad(&dst, 4, dev, 0, 0, pad);
        ck_assert_int_eq(kvc_lookup(ns, keys, n, 0, &l), (int)n);
        ck_assert_int_eq(kvc_lease_scatter_layers(l, 0, n, &dst.kv, 0, 1, 2, stream, NULL), (int)n);
        ck_assert_int_eq(kvc_release(l), 0);
        ck_assert_msg(gb_engine_check(&dst, &src, n * GE_BT, 1, 2) == 0, "dev %d", dev);
        /* the last layer alone, then the first: every layer, and still nothing else */
        ck_assert_int_eq(kvc_lookup(ns, keys, n, 0, &l), (int)n);
        ck_assert_int_eq(kvc_lease_scatter_layers(l, 0, n, &dst.kv, 0, 3, 1, stream, NULL), (int)n);
        ck_assert_int_eq(kvc_lease_scatter_layers(l, 0, n, &dst.kv, 0, 0, 1, stream, NULL), (int)n);
        /* bad ranges: nothing queued, nothing written */
        uint64_t o = gb_ops();
        ck_assert_int_eq(kvc_lease_scatter_layers(l, 0, n, &dst.kv, 0, 1, 0, stream, NULL),
                         -EINVAL);
        ck_assert_int_eq(kvc_lease_scatter_layers(l, 0, n, &dst.kv, 0, 3, 2, stream, NULL),
                         -ERANGE);
        ck_assert_int_eq(kvc_lease_scatter_layers(l, 0, n, &dst.kv, 0, 4, 1, stream, NULL),
                         -ERANGE);
        ck_assert_int_eq(kvc_lease_scatter_layers(l, 0, n, &dst.kv, 0, UINT32_MAX, 2, stream, NULL),
                         -ERANGE);
        ck_assert_int_eq(kvc_lease_scatter_layers(l, 2, n, &dst.kv, 0, 0, 1, stream, NULL),
                         -ERANGE);
        ck_assert_uint_eq(gb_ops(), o);
        ck_assert_int_eq(kvc_release(l), 0);
        ck_assert_int_eq(gb_engine_check(&dst, &src, n * GE_BT, 0, 4), 0);
        gb_engine_fini(&dst);
    }
    ck_assert_int_eq(fake_dev_last_error(), 0);
    free(blocks);
    gb_engine_fini(&src);
    fake_dev_stream_free(stream);
    kvc_disconnect(c);
    kvci_gpu_ops_set(NULL);
}
END_TEST

/* Issue 26: a reservation filled layer by layer (kvc_resv_gather_layers, device and host
 * tensors): kvc_commit refuses -EBUSY while a slot has some layers and not all, and the
 * reservation stays usable; once every layer is written it commits and every byte is the
 * whole gather's. A commit of fewer slots than the partial ones publishes them. */
START_TEST(test_gather_layers_commit)
{
    const uint32_t pad = _i ? 16 : 0; /* packed: by DMA from the pages; padded: staged */
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    kvc_lease *l;
    struct kvc_layout lay = gb_layout(4);
    struct kvc_key keys[GB_BLOCKS];
    struct gb_engine src;
    const uint32_t n = 6;
    ck_assert_int_eq(kvc_connect(ge_d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fake_dev_reset(1);
    kvci_gpu_ops_set(&fake_dev_ops);
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    void *stream = fake_dev_stream(0), *other = fake_dev_stream(0);
    size_t bb = kvc_ns_block_bytes(ns);
    for (int dev = 0; dev < 2; dev++) {
        gb_engine_init_pad(&src, 4, dev, 1, 5 + (unsigned)dev, pad);
        uint8_t *want = gb_blocks(&src, n, bb);
        gb_keys(ns, 800000 + 10000 * (uint32_t)dev, n, keys);
        ck_assert_int_eq(kvc_reserve(ns, NULL, keys, n, &r), (int)n);
        ck_assert_int_eq(kvc_resv_gather_layers(r, 0, n, &src.kv, 0, 0, 2, stream, NULL), (int)n);
        ck_assert_int_eq(kvc_commit(r, SIZE_MAX), -EBUSY);
        ck_assert_int_eq(kvc_resv_gather_layers(r, 0, n, &src.kv, 0, 3, 1, other, NULL), (int)n);
        ck_assert_int_eq(kvc_commit(r, SIZE_MAX), -EBUSY);
        /* bad ranges refused */
        ck_assert_int_eq(kvc_resv_gather_layers(r, 0, n, &src.kv, 0, 2, 0, stream, NULL), -EINVAL);
        ck_assert_int_eq(kvc_resv_gather_layers(r, 0, n, &src.kv, 0, 2, 3, stream, NULL), -ERANGE);
        ck_assert_int_eq(kvc_resv_gather_layers(r, 1, n, &src.kv, 0, 2, 1, stream, NULL), -ERANGE);
        ck_assert_int_eq(kvc_lookup(ns, keys, 1, 0, &l), 0); /* nothing published */
        kvc_release(l);
        ck_assert_int_eq(kvc_resv_gather_layers(r, 0, n, &src.kv, 0, 2, 1, stream, NULL), (int)n);
        ck_assert_int_eq(kvc_commit(r, SIZE_MAX), (int)n);
        ck_assert_int_eq(kvc_lookup(ns, keys, n, 0, &l), (int)n);
        for (uint32_t j = 0; j < n; j++)
            ck_assert_msg(memcmp(kvc_lease_data(l, j), want + j * bb, bb) == 0, "block %u", j);
        ck_assert_int_eq(kvc_release(l), 0);
        /* partial slots past the committed ones do not matter; kvc_resv_write completes a
         * slot as a whole */
        gb_keys(ns, 900000 + 10000 * (uint32_t)dev, n, keys);
        ck_assert_int_eq(kvc_reserve(ns, NULL, keys, n, &r), (int)n);
        ck_assert_int_eq(kvc_resv_gather(r, 0, 2, &src.kv, 0, stream, NULL), 2);
        ck_assert_int_eq(kvc_resv_gather_layers(r, 2, 1, &src.kv, 2 * GE_BT, 0, 1, stream, NULL),
                         1);
        ck_assert_int_eq(kvc_commit(r, 3), -EBUSY);
        ck_assert_int_eq(kvc_resv_write(r, 2, want + 2 * bb, bb), 0);
        ck_assert_int_eq(kvc_resv_gather_layers(r, 3, 1, &src.kv, 3 * GE_BT, 1, 1, stream, NULL),
                         1);
        ck_assert_int_eq(kvc_commit(r, 3), 3);
        ck_assert_int_eq(kvc_lookup(ns, keys, n, 0, &l), 3);
        ck_assert(memcmp(kvc_lease_data(l, 2), want + 2 * bb, bb) == 0);
        ck_assert_int_eq(kvc_release(l), 0);
        free(want);
        gb_engine_fini(&src);
    }
    ck_assert_int_eq(fake_dev_last_error(), 0);
    fake_dev_stream_free(other);
    fake_dev_stream_free(stream);
    kvc_disconnect(c);
    kvci_gpu_ops_set(NULL);
}
END_TEST

/* Issue 25: lossy host hits of every codec scattered into paged device tensors are decoded by
 * one kernel straight into them (no raw staging copy), bit-identical to the CPU decoder and
 * pack: one host-to-device batch of the stored bytes, one decode kernel, one record; with
 * raw hits in the same call, one scatter kernel more; a layer range decodes only its layers;
 * a range copy into one device buffer decodes the same way. */
START_TEST(test_scatter_lossy_every_codec)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_layout lay = gb_layout(4);
    struct kvc_key keys[GB_BLOCKS];
    struct gb_engine src, dst, ref;
    const uint32_t n = 4;
    ck_assert_int_eq(kvc_connect(ge_d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fake_dev_reset(1);
    kvci_gpu_ops_set(&fake_dev_ops);
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    void *stream = fake_dev_stream(0);
    size_t bb = kvc_ns_block_bytes(ns);
    gb_engine_init(&src, 4, 0, 1, 9);
    /* smooth fp16 values, so every codec sees finite data */
    for (uint32_t li = 0; li < 4; li++)
        for (uint64_t x = 0; x < src.bytes / 2; x++) {
            ((uint16_t *)src.k[li])[x] = kern_f2h((float)((int)(x * 7 % 401) - 200) / 64.0f);
            ((uint16_t *)src.v[li])[x] = kern_f2h((float)((int)(x * 13 % 301) - 150) / 32.0f);
        }
    uint8_t *blocks = gb_blocks(&src, n, bb);
    const void *bp[GB_BLOCKS];
    for (uint32_t j = 0; j < n; j++)
        bp[j] = blocks + j * bb;
    gb_keys(ns, 1000000, n, keys);
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, keys, n, bp), (int)n);
    struct kern_layout kl = {4, GE_HEADS, GE_DIM, GE_BT, KERN_DTYPE_FP16, 0};
    struct kern_pack_layout pl = gb_pack_layout(4);
    for (int codec = KERN_CODEC_Q8_0; codec < KERN_CODEC_COUNT; codec++) {
        struct kern_recipe rec;
        kern_recipe_fill(&rec, (enum kern_codec)codec, (enum kern_codec)codec, 1);
        int64_t es = kern_encoded_size(&kl, &rec);
        ck_assert_int_gt(es, 0);
        uint8_t *enc = malloc(n * (size_t)es), *dec = malloc(n * bb);
        for (uint32_t j = 0; j < n; j++) {
            ck_assert_int_eq(
                kern_encode_cpu(&kl, &rec, blocks + j * bb, enc + j * es, (size_t)es, NULL), es);
            ck_assert_int_eq(
                kern_decode_cpu(&kl, enc + j * es, (size_t)es, dec + j * bb, bb, KERN_DTYPE_FP16),
                (int64_t)bb);
        }
        for (int range = 0; range < 2; range++) {
            uint32_t lf = range ? 1 : 0, lc = range ? 2 : 4;
            gb_engine_init(&dst, 4, 1, 0, 0);
            gb_engine_init(&ref, 4, 0, 0, 0);
            /* the reference: the CPU decoder's blocks, packed by the reference */
            struct kern_pack_layout sub = pl;
            sub.layers = lc;
            struct kern_pack_engine re = gb_pack_engine(&ref);
            re.k = ref.k + lf;
            re.v = ref.v + lf;
            for (uint32_t j = 0; j < n; j++) {
                void *b = dec + j * bb + (uint64_t)lf * (bb / 4);
                ck_assert_int_eq(
                    kern_pack_ref(&sub, &re, (uint64_t)j * GE_BT, 1, &b, KERN_PACK_SCATTER), 0);
            }
            ck_assert_int_eq(kvc_lookup(ns, keys, n, 0, &l), (int)n);
            for (uint32_t j = 0; j < n; j++) { /* as if the daemon had quantized them */
                l->hits[j].data = enc + j * es;
                l->hits[j].len = (uint64_t)es;
                l->hits[j].format = (uint8_t)codec;
            }
            uint64_t o = gb_ops(), decodes = fake_dev.decodes, packs = fake_dev.packs;
            kern_batch_kivik_pieces = kern_batch_lrm_pieces = 0;
            ck_assert_int_eq(kvc_lease_scatter_layers(l, 0, n, &dst.kv, 0, lf, lc, stream, NULL),
                             (int)n);
            ck_assert_uint_eq(gb_ops() - o, 3);
            ck_assert_uint_eq(fake_dev.decodes - decodes, 1);
            ck_assert_uint_eq(fake_dev.packs - packs, 0);
            ck_assert_int_eq(kvc_release(l), 0);
            for (uint32_t li = 0; li < 4; li++) {
                ck_assert_msg(memcmp(dst.k[li], ref.k[li], dst.bytes) == 0, "%s layer %u K",
                              kern_codec_name((enum kern_codec)codec), li);
                ck_assert_msg(memcmp(dst.v[li], ref.v[li], dst.bytes) == 0, "%s layer %u V",
                              kern_codec_name((enum kern_codec)codec), li);
            }
            /* libkvc told the decode its hits' formats (kern_decode_batches' codecs): the
             * kernel with the KIVI key rounds for KIVI hits, with the ROT ones too for ROT
             * hits, with the LOWRANK and MERGE rounds for those hits, without any for the
             * rest; KIVI keys, LOWRANK keys and MERGE rows went by their rounds */
            const int kivi = codec == KERN_CODEC_KIVI2 || codec == KERN_CODEC_KIVI4;
            const int rot = codec == KERN_CODEC_ROT2 || codec == KERN_CODEC_ROT4;
            const int lrm = codec == KERN_CODEC_LOWRANK || codec == KERN_CODEC_MERGE;
            const uint32_t cols = KERN_BATCH_COLS_KIVI | KERN_BATCH_COLS_ROT;
            ck_assert_uint_eq(fake_dev.decode_cols, kivi  ? KERN_BATCH_COLS_KIVI
                                                    : rot ? cols
                                                    : lrm ? KERN_BATCH_COLS_LRM
                                                          : 0);
            ck_assert_msg((kern_batch_kivik_pieces != 0) == kivi, "%s: %llu KIVI key pieces",
                          kern_codec_name((enum kern_codec)codec),
                          (unsigned long long)kern_batch_kivik_pieces);
            ck_assert_msg((kern_batch_lrm_pieces != 0) == lrm, "%s: %llu LOWRANK/MERGE pieces",
                          kern_codec_name((enum kern_codec)codec),
                          (unsigned long long)kern_batch_lrm_pieces);
            gb_engine_fini(&dst);
            gb_engine_fini(&ref);
        }
        /* the same hits into one contiguous device buffer: one batch of their stored bytes,
         * one decode kernel, one record; the CPU decoder's bytes */
        uint8_t *buf = NULL;
        ck_assert_int_eq(fake_dev_ops.mem_alloc((void **)&buf, n * bb), 0);
        ck_assert_int_eq(kvc_lookup(ns, keys, n, 0, &l), (int)n);
        for (uint32_t j = 0; j < n; j++) {
            l->hits[j].data = enc + j * es;
            l->hits[j].len = (uint64_t)es;
            l->hits[j].format = (uint8_t)codec;
        }
        uint64_t o0 = gb_ops();
        ck_assert_int_eq(kvc_lease_copy_range_async(l, 0, n, buf, n * bb, stream), (int)n);
        ck_assert_uint_eq(gb_ops() - o0, 3);
        /* the hint here too: KIVI's kernel for KIVI and ROT hits (whole blocks into a buffer
         * take no ROT key rounds), the LOWRANK and MERGE one for those, the lean one for the
         * rest */
        const int kivi_or_rot = codec == KERN_CODEC_KIVI2 || codec == KERN_CODEC_KIVI4 ||
                                codec == KERN_CODEC_ROT2 || codec == KERN_CODEC_ROT4;
        const int lr_or_merge = codec == KERN_CODEC_LOWRANK || codec == KERN_CODEC_MERGE;
        ck_assert_uint_eq(fake_dev.decode_cols, kivi_or_rot   ? KERN_BATCH_COLS_KIVI
                                                : lr_or_merge ? KERN_BATCH_COLS_LRM
                                                              : 0);
        ck_assert_int_eq(kvc_release(l), 0);
        ck_assert_msg(memcmp(buf, dec, n * bb) == 0, "%s range copy",
                      kern_codec_name((enum kern_codec)codec));
        fake_dev_ops.mem_free(buf);
        /* raw and lossy hits in one call: a scatter kernel and a decode kernel */
        gb_engine_init(&dst, 4, 1, 0, 0);
        ck_assert_int_eq(kvc_lookup(ns, keys, n, 0, &l), (int)n);
        l->hits[1].data = enc + es;
        l->hits[1].len = (uint64_t)es;
        l->hits[1].format = (uint8_t)codec;
        uint64_t o = gb_ops();
        ck_assert_int_eq(kvc_lease_scatter(l, 0, n, &dst.kv, 0, stream, NULL), (int)n);
        ck_assert_uint_eq(gb_ops() - o, 4);
        ck_assert_int_eq(kvc_release(l), 0);
        gb_engine_fini(&dst);
        free(enc);
        free(dec);
    }
    ck_assert_uint_eq(fake_dev.bad_kinds + fake_dev.bad_packs, 0);
    ck_assert_int_eq(fake_dev_last_error(), 0);
    free(blocks);
    gb_engine_fini(&src);
    fake_dev_stream_free(stream);
    kvc_disconnect(c);
    kvci_gpu_ops_set(NULL);
}
END_TEST

/* ---- staging bounded by the cap ----------------------------------------------------------- */

/* The chunks of a staged call of n blocks under cap, as the spec of the staging reads: the
 * blocks after a chunk's first whose staged bytes (st[j], 256-aligned; 0: nothing staged)
 * fit cap together, a block over cap alone. Returns the device operations the call queues —
 * per chunk one copy batch when it copies anything (first: pieces the first chunk's batch
 * also carries) and a kernel for each kind of block in it (raw[j]: the gather or scatter
 * kernel, else the decode kernel), then one record — and the largest chunk in *most. */
static uint64_t gs_chunk_ops(const uint64_t *st, const int *raw, uint32_t n, uint64_t cap,
                             int first, uint64_t *most)
{
    uint64_t ops = 1;
    *most = 0;
    for (uint32_t j0 = 0, j1; j0 < n; j0 = j1) {
        uint64_t sum = st[j0];
        int has_raw = raw[j0] > 0, has_enc = raw[j0] == 0, copies = st[j0] > 0 || first;
        for (j1 = j0 + 1; j1 < n && sum + st[j1] <= cap; j1++) {
            sum += st[j1];
            has_raw |= raw[j1] > 0;
            has_enc |= raw[j1] == 0;
            copies |= st[j1] > 0;
        }
        first = 0;
        *most = sum > *most ? sum : *most;
        ops += (uint64_t)copies + (uint64_t)has_raw + (uint64_t)has_enc;
    }
    return ops;
}

/* A prefix of GB_BLOCKS blocks (2 MiB) staged through a cap far smaller: raw host hits into
 * a strided engine (every block staged), a gather of the same engine into host slots, lossy
 * (q8_0) hits, and a mix of both, scattered (all layers, and the second alone) and
 * range-copied into device memory. Every byte
 * lands right (the CPU decoder's and the reference pack's), the calls queue the operations of
 * their chunks, and no device scratch the client allocates exceeds the cap (a block over it:
 * that block's bytes) nor does more than that stay idle after the calls. _i: a cap of 4 raw
 * blocks (128 KiB), one of 100,000 bytes (3 raw blocks, not a power of two) and 16 KiB (less
 * than any block: a block a chunk). (Before: one scratch of the whole call's bytes, 2 MiB
 * here, kept until the disconnect.) */
START_TEST(test_staging_capped)
{
    static const uint64_t caps[] = {128 << 10, 100000, 16 << 10};
    const uint64_t cap = caps[_i];
    const uint32_t n = GB_BLOCKS, pad = 16;
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    kvc_lease *l;
    struct kvc_layout lay = gb_layout(2);
    struct kvc_key keys[GB_BLOCKS];
    struct gb_engine src, dst, dst1, ref;
    ck_assert_int_eq(kvc_connect(ge_d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fake_dev_reset(1);
    kvci_gpu_ops_set(&fake_dev_ops);
    kvci_gpu_stage_cap_set(cap);
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    kvci_gpu_stage_cap_set(0);
    void *stream = fake_dev_stream(0);
    const size_t bb = kvc_ns_block_bytes(ns);
    gb_engine_init_pad(&src, 2, 1, 1, 4, pad);
    for (uint32_t li = 0; li < 2; li++) /* smooth fp16 values: finite for the codec */
        for (uint64_t x = 0; x < src.bytes / 2; x++) {
            ((uint16_t *)src.k[li])[x] = kern_f2h((float)((int)(x * 7 % 401) - 200) / 64.0f);
            ((uint16_t *)src.v[li])[x] = kern_f2h((float)((int)(x * 13 % 301) - 150) / 32.0f);
        }
    gb_engine_init_pad(&dst, 2, 1, 0, 0, pad);
    gb_engine_init_pad(&dst1, 2, 1, 0, 0, pad);
    gb_engine_init_pad(&ref, 2, 0, 0, 0, pad);
    uint8_t *want = gb_blocks(&src, n, bb), *buf = NULL;
    ck_assert_int_eq(fake_dev_ops.mem_alloc((void **)&buf, n * bb), 0);
    /* the q8_0 blocks, the CPU decoder's bytes of them, and the mix: odd blocks lossy */
    struct kern_layout kl = {2, GE_HEADS, GE_DIM, GE_BT, KERN_DTYPE_FP16, 0};
    struct kern_recipe rec;
    kern_recipe_fill(&rec, KERN_CODEC_Q8_0, KERN_CODEC_Q8_0, 1);
    const int64_t es = kern_encoded_size(&kl, &rec);
    ck_assert_int_gt(es, 0);
    uint8_t *enc = malloc(n * (size_t)es), *dec = malloc(n * bb), *mix = malloc(n * bb);
    ck_assert(enc && dec && mix);
    for (uint32_t j = 0; j < n; j++) {
        ck_assert_int_eq(kern_encode_cpu(&kl, &rec, want + j * bb, enc + j * es, (size_t)es, NULL),
                         es);
        ck_assert_int_eq(
            kern_decode_cpu(&kl, enc + j * es, (size_t)es, dec + j * bb, bb, KERN_DTYPE_FP16),
            (int64_t)bb);
        memcpy(mix + j * bb, (j % 2 ? dec : want) + j * bb, bb);
    }
    const uint64_t araw = (bb + 255) & ~(uint64_t)255, aenc = ((uint64_t)es + 255) & ~255ull;
    const uint64_t most_block = araw > aenc ? araw : aenc;
    const uint64_t bound = cap > most_block ? cap : most_block; /* the most scratch, idle too */
    const uint64_t engine_bytes = fake_dev.alloc_bytes;
    fake_dev.alloc_max = 0; /* from here: the client's scratch alone */
    uint64_t st[GB_BLOCKS], most, o;
    int raw[GB_BLOCKS];

    /* a gather of every block into host slots, staged */
    gb_keys(ns, 2000000, n, keys);
    ck_assert_int_eq(kvc_reserve(ns, NULL, keys, n, &r), (int)n);
    for (uint32_t j = 0; j < n; j++)
        st[j] = araw, raw[j] = 1;
    o = gb_ops();
    ck_assert_int_eq(kvc_resv_gather(r, 0, n, &src.kv, 0, stream, NULL), (int)n);
    ck_assert_uint_le(fake_dev.alloc_max, bound);
    ck_assert_uint_eq(gb_ops() - o, gs_chunk_ops(st, raw, n, cap, 0, &most));
    ck_assert_uint_gt(gb_ops() - o, 3); /* more than one chunk */
    ck_assert_int_eq(kvc_commit(r, SIZE_MAX), (int)n);
    ck_assert_int_eq(kvc_lookup(ns, keys, n, 0, &l), (int)n);
    for (uint32_t j = 0; j < n; j++)
        ck_assert_msg(memcmp(kvc_lease_data(l, j), want + j * bb, bb) == 0, "gather block %u", j);

    /* raw hits, lossy hits, the mix: scattered into the strided engine, then range-copied */
    ck_assert_int_eq(kvc_release(l), 0);
    for (int kind = 0; kind < 3; kind++) { /* 0 raw, 1 lossy, 2 mix */
        const uint8_t *blocks = kind == 0 ? want : kind == 1 ? dec : mix;
        ck_assert_int_eq(kvc_lookup(ns, keys, n, 0, &l), (int)n);
        for (uint32_t j = 0; j < n; j++) {
            int lossy = kind == 1 || (kind == 2 && j % 2);
            raw[j] = !lossy;
            st[j] = lossy ? aenc : araw;
            if (!lossy)
                continue;
            l->hits[j].data = enc + j * es; /* as if the daemon had quantized them */
            l->hits[j].len = (uint64_t)es;
            l->hits[j].format = KERN_CODEC_Q8_0;
        }
        gb_engine_clear(&dst);
        gb_engine_clear(&ref);
        struct kern_pack_layout pl = gb_pack_layout(2);
        struct kern_pack_engine re = gb_pack_engine(&ref);
        void *bp[GB_BLOCKS];
        for (uint32_t j = 0; j < n; j++)
            bp[j] = (uint8_t *)blocks + j * bb;
        ck_assert_int_eq(kern_pack_ref(&pl, &re, 0, n, bp, KERN_PACK_SCATTER), 0);
        o = gb_ops();
        ck_assert_int_eq(kvc_lease_scatter(l, 0, n, &dst.kv, 0, stream, NULL), (int)n);
        ck_assert_uint_le(fake_dev.alloc_max, bound);
        ck_assert_uint_eq(gb_ops() - o, gs_chunk_ops(st, raw, n, cap, 0, &most));
        ck_assert_uint_le(most, bound);
        /* the second layer alone, into another engine: a raw block stages half its bytes, a
         * lossy one all of them */
        for (uint32_t j = 0; j < n; j++)
            st[j] = raw[j] ? araw / 2 : aenc;
        gb_engine_clear(&dst1);
        o = gb_ops();
        ck_assert_int_eq(kvc_lease_scatter_layers(l, 0, n, &dst1.kv, 0, 1, 1, stream, NULL),
                         (int)n);
        ck_assert_uint_le(fake_dev.alloc_max, bound);
        ck_assert_uint_eq(gb_ops() - o, gs_chunk_ops(st, raw, n, cap, 0, &most));
        /* into one device buffer: the raw hits straight in (with the first chunk's batch),
         * the lossy ones staged and decoded */
        for (uint32_t j = 0; j < n; j++)
            st[j] = raw[j] ? 0 : aenc;
        memset(buf, 0, n * bb);
        o = gb_ops();
        ck_assert_int_eq(kvc_lease_copy_range_async(l, 0, n, buf, n * bb, stream), (int)n);
        for (uint32_t j = 0; j < n; j++)
            raw[j] = raw[j] ? -1 : 0; /* raw: no kernel here */
        ck_assert_uint_eq(gb_ops() - o, gs_chunk_ops(st, raw, n, cap, 1, &most));
        ck_assert_int_eq(kvc_release(l), 0);
        ck_assert_msg(gb_engine_check(&dst, &ref, n * GE_BT, 0, 2) == 0, "scatter, kind %d", kind);
        ck_assert_msg(gb_engine_check(&dst1, &ref, n * GE_BT, 1, 1) == 0, "layer 1, kind %d", kind);
        for (uint32_t j = 0; j < n; j++)
            ck_assert_msg(memcmp(buf + j * bb, blocks + j * bb, bb) == 0, "copy, kind %d block %u",
                          kind, j);
    }
    /* the scratch: never more than the cap (or a block over it), at most that much idle (a
     * lease's calls on one stream stage through one buffer) */
    printf("e2e_gpu: staged through a cap of %llu bytes: largest scratch %llu, idle after the "
           "calls %llu (the whole prefix stages %llu)\n",
           (unsigned long long)cap, (unsigned long long)fake_dev.alloc_max,
           (unsigned long long)(fake_dev.alloc_bytes - engine_bytes),
           (unsigned long long)(n * araw));
    ck_assert_uint_gt(fake_dev.alloc_max, 0);
    ck_assert_uint_le(fake_dev.alloc_max, bound);
    ck_assert_uint_le(fake_dev.alloc_bytes - engine_bytes, bound);
    ck_assert_uint_eq(fake_dev.bad_kinds + fake_dev.bad_packs, 0);
    ck_assert_int_eq(fake_dev_last_error(), 0);
    free(enc);
    free(dec);
    free(mix);
    free(want);
    fake_dev_ops.mem_free(buf);
    gb_engine_fini(&src);
    gb_engine_fini(&dst);
    gb_engine_fini(&dst1);
    gb_engine_fini(&ref);
    fake_dev_stream_free(stream);
    kvc_disconnect(c);
    ck_assert_int_eq(fake_dev.events_live, 0);
    kvci_gpu_ops_set(NULL);
}
END_TEST

/* Child of test_pool_bounded_ops: pool hits and slots (a pool-mapped client of the fake pool),
 * 1, 4 and 64 blocks: a gather into pool slots (gather kernel, record), a range copy into one
 * device buffer (one device-to-device batch, record), a scatter and a scatter of one layer
 * (scatter kernel, record): the same count for every block count, every byte right. The exit
 * status says which check failed. */
static int gf_pool_bounded_ops(void *arg)
{
    static const uint32_t counts[] = {1, 4, GB_BLOCKS};
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    kvc_lease *l;
    struct kvc_key keys[GB_BLOCKS];
    struct gb_engine src, dst;
    uint64_t ops[3][4];
    const uint32_t pad = (uint32_t)(uintptr_t)arg;
    if (gf_client(0, &c, &ns, keys) || kvc_gpu_attach(c) != 1)
        return 90;
    void *stream = fake_dev_stream(0);
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *buf = NULL;
    if (!stream || fake_dev_ops.mem_alloc((void **)&buf, GB_BLOCKS * bb))
        return 91;
    gb_engine_init_pad(&src, GE_LAYERS, 1, 1, 2, pad);
    gb_engine_init_pad(&dst, GE_LAYERS, 1, 0, 0, pad);
    uint8_t *want = gb_blocks(&src, GB_BLOCKS, bb);
    const uint64_t runs0 = fake_dev.pack_runs, packs0 = fake_dev.packs;
    for (int i = 0; i < 3; i++) {
        uint32_t n = counts[i];
        uint64_t o;
        gb_keys(ns, 500000 + 10000 * n + 1000 * pad, n, keys);
        if (kvc_reserve_gpu(ns, NULL, keys, n, &r) != (int)n)
            return 92;
        for (uint32_t j = 0; j < n; j++)
            if (fake_dev_ops.pointer_device(kvc_resv_data(r, j)) != 0)
                return 93; /* a pool slot */
        o = gb_ops();
        if (kvc_resv_gather(r, 0, n, &src.kv, 0, stream, NULL) != (int)n)
            return 94;
        ops[i][0] = gb_ops() - o;
        if (kvc_commit(r, SIZE_MAX) != (int)n)
            return 95;
        if (kvc_lookup(ns, keys, n, KVC_LOOKUP_GPU, &l) != (int)n)
            return 96;
        for (uint32_t j = 0; j < n; j++)
            if (kvc_lease_tier(l, j) != KVC_TIER_GPU)
                return 97;
        memset(buf, 0, n * bb);
        o = gb_ops();
        if (kvc_lease_copy_range_async(l, 0, n, buf, n * bb, stream) != (int)n)
            return 98;
        ops[i][1] = gb_ops() - o;
        gb_engine_clear(&dst);
        o = gb_ops();
        if (kvc_lease_scatter(l, 0, n, &dst.kv, 0, stream, NULL) != (int)n)
            return 99;
        ops[i][2] = gb_ops() - o;
        if (fake_dev.queued == 0)
            return 100; /* queued, not performed before the release */
        if (kvc_release(l) || memcmp(buf, want, n * bb) ||
            gb_engine_check(&dst, &src, n * GE_BT, 0, GE_LAYERS))
            return 101;
        gb_engine_clear(&dst);
        if (kvc_lookup(ns, keys, n, KVC_LOOKUP_GPU, &l) != (int)n)
            return 102;
        o = gb_ops();
        if (kvc_lease_scatter_layers(l, 0, n, &dst.kv, 0, 1, 1, stream, NULL) != (int)n)
            return 103;
        ops[i][3] = gb_ops() - o;
        if (kvc_release(l) || gb_engine_check(&dst, &src, n * GE_BT, 1, 1))
            return 104;
    }
    printf(
        "e2e_gpu: pool hits, %s layout, device operations per call (1/4/64 blocks): gather "
        "%llu/%llu/%llu, copy range %llu/%llu/%llu, scatter %llu/%llu/%llu, scatter of a layer "
        "%llu/%llu/%llu\n",
        pad ? "strided" : "contiguous", (unsigned long long)ops[0][0],
        (unsigned long long)ops[1][0], (unsigned long long)ops[2][0], (unsigned long long)ops[0][1],
        (unsigned long long)ops[1][1], (unsigned long long)ops[2][1], (unsigned long long)ops[0][2],
        (unsigned long long)ops[1][2], (unsigned long long)ops[2][2], (unsigned long long)ops[0][3],
        (unsigned long long)ops[1][3], (unsigned long long)ops[2][3]);
    fflush(stdout);
    for (int k = 0; k < 4; k++)
        if (ops[0][k] != ops[1][k] || ops[0][k] != ops[2][k] || ops[0][k] != 2)
            return 110 + k;
    if (fake_dev.bad_kinds || fake_dev.bad_packs || fake_dev_last_error())
        return 120;
    /* three kernels a round (gather, scatter, scatter of a layer): run steps where the
     * layout is contiguous, the row steps where it is strided */
    if (fake_dev.packs - packs0 != 9 || fake_dev.pack_runs - runs0 != (pad ? 0u : 9u))
        return 122;
    free(want);
    fake_dev_ops.mem_free(buf);
    gb_engine_fini(&src);
    gb_engine_fini(&dst);
    fake_dev_stream_free(stream);
    kvc_disconnect(c);
    return fake_dev.pools_live == 0 && fake_dev.events_live == 0 ? 0 : 121;
}

START_TEST(test_pool_bounded_ops)
{
    ck_assert_int_eq(gf_run(gf_pool_bounded_ops, NULL), 0);
}
END_TEST

/* The same with padded heads (a strided layout): the row steps, the same counts and bytes. */
START_TEST(test_pool_bounded_ops_strided)
{
    ck_assert_int_eq(gf_run(gf_pool_bounded_ops, (void *)(uintptr_t)16), 0);
}
END_TEST

/* ---- a prefix longer than the pool's moves in flight, for a client without the pool ---- */

/* GF_LONG blocks, past ENGINE_GPU_INFLIGHT and TIER_GPU_MAX_INFLIGHT (64): 5 MiB of 32 KiB
 * blocks in an 8 MiB pool (under its high watermark, so every put lands there). */
#define GF_LONG 160
#define GF_LONG_WAIT_MS 300 /* disk.put_wait of the bounded case */

/* A prefix of n blocks (at most GF_LONG) of tokens base, base + 1, ...; zeros: the long
 * prefix (GF_LONG blocks from token 500000). */
struct gf_prefix {
    uint32_t base, n;
};

static struct gf_prefix gf_prefix_of(const struct gf_prefix *p)
{
    return (struct gf_prefix){.base = p && p->base ? p->base : 500000,
                              .n = p && p->n ? p->n : GF_LONG};
}

/* A client process (the driver started here) and the keys of prefix p. */
static int gf_long_client(bool pool, struct gf_prefix p, kvc_client **c, kvc_ns **ns,
                          struct kvc_key *keys)
{
    static uint32_t tokens[GF_LONG * GE_BT];
    struct kvc_layout lay = ge_layout();
    fake_dev_reset(2);
    fake_dev_current_set(0);
    kvci_gpu_ops_set(&fake_dev_ops);
    for (uint32_t i = 0; i < p.n * GE_BT; i++)
        tokens[i] = p.base + i;
    if (kvc_connect(gf.d.sock, c) || kvc_ns_open(*c, &lay, ns) ||
        kvc_keys_from_tokens(*ns, NULL, tokens, p.n * GE_BT, NULL, 0, keys, p.n) != (int)p.n)
        return -1;
    return pool && kvc_gpu_attach(*c) != 1 ? -1 : 0;
}

/* Child: a pool-mapped client puts a prefix (arg: a gf_prefix, NULL: the long one) into
 * the pool. */
static int gf_long_put(void *arg)
{
    struct gf_prefix p = gf_prefix_of(arg);
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    static struct kvc_key keys[GF_LONG];
    if (gf_long_client(true, p, &c, &ns, keys))
        return 130;
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *src = malloc(bb);
    if (!src || kvc_reserve_gpu(ns, NULL, keys, p.n, &r) != (int)p.n)
        return 131;
    for (size_t i = 0; i < p.n; i++) {
        daemon_block_fill(&keys[i], src, bb);
        if (kvc_resv_write(r, i, src, bb))
            return 132;
    }
    if (kvc_commit(r, SIZE_MAX) != (int)p.n)
        return 133;
    free(src);
    kvc_disconnect(c);
    return 0;
}

/* Child: a client without the pool flag looks the long prefix up (arg: a gf_long_look) and
 * checks every hit's bytes in its host arena. Exits 0 with `want` hits, the lookup call
 * taking least_ms..most_ms where they are set (a lookup that must have waited, bounded). */
struct gf_long_look {
    struct gf_prefix p; /* zeros: the long prefix */
    unsigned flags;
    int want;
    int least_ms, most_ms; /* the lookup call's time (0: not checked) */
};

static int gf_long_load(void *arg)
{
    const struct gf_long_look *lk = arg;
    struct gf_prefix p = gf_prefix_of(&lk->p);
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l = NULL;
    static struct kvc_key keys[GF_LONG];
    struct timespec t0, t1;
    if (gf_long_client(false, p, &c, &ns, keys))
        return 140;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int hits = kvc_lookup(ns, keys, p.n, lk->flags, &l);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    if (hits != lk->want) {
        fprintf(stderr, "gf_long_load: %d hits of %u, %d wanted\n", hits, p.n, lk->want);
        return 141;
    }
    if ((lk->least_ms && ms < lk->least_ms) || (lk->most_ms && ms > lk->most_ms)) {
        fprintf(stderr, "gf_long_load: the lookup took %ld ms (%d..%d)\n", ms, lk->least_ms,
                lk->most_ms);
        return 142;
    }
    if (lk->flags & KVC_LOOKUP_NOWAIT) /* the copies are held: nothing to read yet */
        hits = 0;
    size_t bb = kvc_ns_block_bytes(ns);
    for (int i = 0; i < hits; i++)
        if (kvc_lease_tier(l, (size_t)i) != KVC_TIER_HOST ||
            daemon_block_check(&keys[i], kvc_lease_data(l, (size_t)i), bb) != -1)
            return 143;
    if (l && kvc_release(l))
        return 144;
    kvc_disconnect(c);
    return 0;
}

static void gf_long_setup(void)
{
    gf_setup_with(8 << 20, -1);
}

static void gf_long_bounded_setup(void)
{
    gf_setup_with(8 << 20, GF_LONG_WAIT_MS);
}

/* The long prefix put into the pool: every block there. */
static void gf_long_in_pool(void)
{
    ck_assert_int_eq(gf_run(gf_long_put, NULL), 0);
    ck_assert_uint_eq(store_gpu_used(gf.ip.s), GF_LONG * store_ns_get(gf.ip.s, 1)->block_bytes);
}

/* Issue 25 (bench_gpu's "256 KiB blocks" row on an H200: "host lookup: not every block"): a
 * client without the pool flag looks up a prefix of GF_LONG blocks that live only in the
 * pool. Its lookup waits while the pool's 64 move slots are taken and starts the next
 * moves as they land, so it is answered every block (before: the first 64, the rest a miss
 * it recomputes), each block's bytes the put's, and it counts once: one lookup, GF_LONG
 * hits, each key resolved at most once, nothing pinned once it is released. */
START_TEST(test_host_lookup_waits_for_pool_moves)
{
    struct gf_long_look lk = {.flags = 0, .want = GF_LONG};
    gf_long_in_pool();
    struct stats before = gf.ip.s->total;
    ck_assert_int_eq(gf_run(gf_long_load, &lk), 0);
    const struct stats *t = &gf.ip.s->total;
    ck_assert_uint_eq(t->gpu_demoted_blocks - before.gpu_demoted_blocks, GF_LONG);
    ck_assert_uint_eq(store_gpu_used(gf.ip.s), 0);
    ck_assert_uint_eq(t->lookups - before.lookups, 1);
    ck_assert_uint_eq(t->hit_blocks - before.hit_blocks, GF_LONG);
    ck_assert_uint_le(t->lookup_index_finds - before.lookup_index_finds, GF_LONG);
    ck_assert_uint_eq(t->put_waits - before.put_waits, 1); /* it waited, once */
    ck_assert_uint_eq(gf.ip.s->pins_now, 0);
    ck_assert_int_eq(fake_dev_last_error(), 0);
}
END_TEST

/* Child: two clients without the pool flag at once, each looking up a pool-only prefix of
 * its own of GF_SHARE blocks (arg: two gf_long_look), both past the pool's moves in flight. */
#define GF_SHARE 100

static int gf_two_loads(void *arg)
{
    struct gf_long_look *lk = arg;
    pid_t a = daemon_child_spawn(gf_long_load, &lk[0]);
    pid_t b = daemon_child_spawn(gf_long_load, &lk[1]);
    int ra = daemon_child_wait(a, daemon_ms(30000), NULL);
    int rb = daemon_child_wait(b, daemon_ms(30000), NULL);
    if (ra || rb) {
        fprintf(stderr, "gf_two_loads: %d, %d\n", ra, rb);
        return 150;
    }
    return 0;
}

/* Two clients whose lookups both need more moves than the pool has slots take them in turn:
 * each waits while the other's copies hold the slots and gets its whole prefix, the put's
 * bytes; nothing is left pinned or in the pool. */
START_TEST(test_host_lookups_share_pool_moves)
{
    struct gf_prefix pa = {.base = 600000, .n = GF_SHARE}, pb = {.base = 800000, .n = GF_SHARE};
    struct gf_long_look lk[2] = {{.p = pa, .want = GF_SHARE}, {.p = pb, .want = GF_SHARE}};
    ck_assert_int_eq(gf_run(gf_long_put, &pa), 0);
    ck_assert_int_eq(gf_run(gf_long_put, &pb), 0);
    ck_assert_uint_eq(store_gpu_used(gf.ip.s),
                      2 * GF_SHARE * store_ns_get(gf.ip.s, 1)->block_bytes);
    struct stats before = gf.ip.s->total;
    ck_assert_int_eq(gf_run(gf_two_loads, lk), 0);
    const struct stats *t = &gf.ip.s->total;
    ck_assert_uint_eq(t->gpu_demoted_blocks - before.gpu_demoted_blocks, 2 * GF_SHARE);
    ck_assert_uint_eq(t->lookups - before.lookups, 2);
    ck_assert_uint_eq(t->hit_blocks - before.hit_blocks, 2 * GF_SHARE);
    ck_assert_uint_ge(t->put_waits - before.put_waits, 1);
    ck_assert_uint_eq(store_gpu_used(gf.ip.s), 0);
    ck_assert_uint_eq(gf.ip.s->pins_now, 0);
    ck_assert_int_eq(fake_dev_last_error(), 0);
}
END_TEST

/* Lookups that wait for the pool's move slots, come one after the other, the copies landing
 * one round per tick (none lands while the waiting requests are asked again, as on a device
 * whose copies take longer than the loop's pass over them): the hits answered when two of
 * them had been, and the children. */
static struct {
    struct stats since;
    uint64_t second_hits;
    pid_t pid[3];
    int rc[3];
    int open;
} gf_turn;

static struct gf_long_look gf_turn_look[3] = {
    {.p = {.base = 600000, .n = GF_SHARE}, .want = GF_SHARE},
    {.p = {.base = 800000, .n = GF_SHARE}, .want = GF_SHARE},
    {.p = {.base = 700000, .n = 8}, .want = 8},
};

static void gf_turn_tick(void *arg)
{
    struct gf_server *x = arg;
    int st, running = 0;
    server_tick(x->ip.sv);
    const uint64_t waits = x->ip.s->total.put_waits - gf_turn.since.put_waits;
    for (int i = 0; i < 3; i++) {
        if (gf_turn.pid[i] > 0 && waitpid(gf_turn.pid[i], &st, WNOHANG) == gf_turn.pid[i]) {
            gf_turn.rc[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            gf_turn.pid[i] = 0;
        }
        /* each comes once the ones before it wait */
        if (gf_turn.pid[i] < 0 && waits >= (uint64_t)i && (i == 0 || gf_turn.pid[i - 1] >= 0))
            gf_turn.pid[i] = daemon_child_spawn(gf_long_load, &gf_turn_look[i]);
        running += gf_turn.pid[i] != 0;
    }
    if (waits >= 3)
        gf_turn.open = 1;
    if (gf_turn.open) { /* one round: what is in flight lands, then the waiting ask again */
        fake_dev.hold = 0;
        engine_gpu_poll(x->ip.s, loop_now_ms(x->ip.l));
        fake_dev.hold = 1;
        server_retry(x->ip.sv, loop_now_ms(x->ip.l));
    }
    if (!gf_turn.second_hits && x->ip.s->total.lookups - gf_turn.since.lookups >= 2)
        gf_turn.second_hits = x->ip.s->total.hit_blocks - gf_turn.since.hit_blocks;
    if (!running) {
        fake_dev.hold = 0;
        if (server_clients(x->ip.sv) == 0 && !engine_gpu_landing(x->ip.s))
            loop_stop(x->ip.l);
    }
}

/* A lookup that started moves and waits on goes behind the others waiting. Two connections
 * each look up a pool-only prefix of GF_SHARE blocks (one tenant's long prefixes), then an
 * 8-block lookup comes on a third (another's): it is the second answered, in the round after
 * the first (100 + 8 hits by then); before, the landings' slots went to the second long
 * prefix round after round and it was answered only with it (200 and its 8 at once). All
 * get every block, the put's bytes. */
START_TEST(test_host_lookup_not_behind_long_prefix)
{
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(gf_run(gf_long_put, &gf_turn_look[i].p), 0);
    ck_assert_uint_eq(store_gpu_used(gf.ip.s),
                      (2 * GF_SHARE + 8) * store_ns_get(gf.ip.s, 1)->block_bytes);
    memset(&gf_turn, 0, sizeof(gf_turn));
    gf_turn.since = gf.ip.s->total;
    for (int i = 0; i < 3; i++) {
        gf_turn.pid[i] = -1;
        gf_turn.rc[i] = -1;
    }
    fake_dev.hold = 1;
    loop_run(gf.ip.l, 20, gf_turn_tick, &gf);
    fake_dev.hold = 0;
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(gf_turn.rc[i], 0);
    ck_assert_uint_eq(gf.ip.s->total.lookups - gf_turn.since.lookups, 3);
    ck_assert_uint_eq(gf.ip.s->total.hit_blocks - gf_turn.since.hit_blocks, 2 * GF_SHARE + 8);
    ck_assert_uint_eq(gf_turn.second_hits, GF_SHARE + 8);
    ck_assert_uint_eq(gf.ip.s->pins_now, 0);
    ck_assert_int_eq(fake_dev_last_error(), 0);
}
END_TEST

/* The tick of the bounded case: the copies are held (they cannot land) until the lookup
 * has been answered (its hits pinned) or its client is gone, then let go so its WAIT and
 * its release end; the
 * loop stops once the client is gone and the copies have landed. */
static void gf_hold_tick(void *arg)
{
    struct gf_server *x = arg;
    int st;
    server_tick(x->ip.sv);
    if (x->ip.child > 0 && waitpid(x->ip.child, &st, WNOHANG) == x->ip.child) {
        x->ip.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        x->ip.child = 0;
    }
    if (fake_dev.hold && (x->ip.s->pins_now > 0 || x->ip.child == 0))
        fake_dev.hold = 0;
    if (x->ip.child == 0 && server_clients(x->ip.sv) == 0 && !engine_gpu_landing(x->ip.s))
        loop_stop(x->ip.l);
}

/* The wait is bounded: with the pool's copies held (none lands), the lookup is answered
 * with what is there once disk.put_wait ran out (the 64 blocks whose moves started, read
 * when they land), not later; with KVC_LOOKUP_NOWAIT it is answered at once (no wait). */
START_TEST(test_host_lookup_pool_wait_bounded)
{
    struct gf_long_look nowait = {.flags = KVC_LOOKUP_NOWAIT, .want = ENGINE_GPU_INFLIGHT};
    struct gf_long_look held = {.flags = 0,
                                .want = ENGINE_GPU_INFLIGHT,
                                .least_ms = GF_LONG_WAIT_MS,
                                .most_ms = GF_LONG_WAIT_MS + daemon_ms(5000)};
    gf_long_in_pool();
    struct stats before = gf.ip.s->total;
    fake_dev.hold = 1;
    gf.ip.child = daemon_child_spawn(gf_long_load, &nowait);
    gf.ip.status = -1;
    loop_run(gf.ip.l, 20, gf_hold_tick, &gf);
    ck_assert_int_eq(gf.ip.status, 0);
    ck_assert_uint_eq(gf.ip.s->total.put_waits, before.put_waits); /* it never waited */
    /* The NOWAIT lookup's moves landed once let go: the first 64 blocks are in the host
     * arena now; the rest is still in the pool. */
    ck_assert_uint_eq(store_gpu_used(gf.ip.s),
                      (GF_LONG - ENGINE_GPU_INFLIGHT) * store_ns_get(gf.ip.s, 1)->block_bytes);
    /* Now a lookup that waits: the next 64 moves start and are held past its wait. */
    held.want = 2 * ENGINE_GPU_INFLIGHT;
    fake_dev.hold = 1;
    gf.ip.child = daemon_child_spawn(gf_long_load, &held);
    gf.ip.status = -1;
    loop_run(gf.ip.l, 20, gf_hold_tick, &gf);
    ck_assert_int_eq(gf.ip.status, 0);
    ck_assert_uint_eq(gf.ip.s->total.put_waits - before.put_waits, 1);
    ck_assert_uint_eq(gf.ip.s->total.lookups - before.lookups, 2);
    ck_assert_uint_eq(gf.ip.s->pins_now, 0);
    ck_assert_int_eq(fake_dev_last_error(), 0);
}
END_TEST

/* A case of s under a fixture, with a slow host's timeout. */
/* A client that attaches its GPU while kvcd still faults its arena in registers (pins) only
 * what kvcd has faulted (its shared index says how far: kvc_fast_hdr.faulted), and the rest
 * from the GPU calls after, once faulted: the pinning never faults a page in itself (at
 * 4 KiB, ahead of the daemon's collapse, and at the attach's cost: a 256 GiB host tier would
 * hold the attach for all of it). Hits copy right before, during and after. */
START_TEST(test_attach_registers_what_is_faulted)
{
    static const char *const args[] = {"-o", "host.size=512m", "-o", "host.page_size=64k", "-o",
                                       "host.prefault_threads=1", NULL};
    const uint64_t chunk = 32ull << 20, size = 512ull << 20;
    const uint32_t n = 4;
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    kvc_lease *l;
    struct kvc_layout lay = gb_layout(2);
    struct kvc_key keys[4];
    struct gb_engine src;
    uint64_t faulted = 0;
    /* mapped as touched (as arenas above 2 GiB are): populated, the mapping itself would
     * fault in what kvcd has not yet */
    kvci_arena_populate_max_set(0);
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    kvci_arena_populate_max_set(UINT64_MAX);
    fake_dev_reset(1);
    kvci_gpu_ops_set(&fake_dev_ops);
    kvci_gpu_reg_chunk_set(chunk);
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    const int at_attach = fake_dev.registered;
    uint64_t faulted_at_attach = 0;
    ck_assert_int_eq(daemon_client_stat(c, 0, "host_faulted", &faulted_at_attach), 0);
    ck_assert_uint_eq(fake_dev.register_unresident, 0);
    /* no more than was faulted in (the daemon says so about once a second, behind the truth).
     * A chunk whose every page is resident counts as faulted for the client (the check above
     * that nothing unresident was pinned is the strict one), and the fault thread counts its
     * chunk in host_faulted only after its pages are in: the one chunk (2 MiB) that thread
     * may be between the two is allowed (CI saw 96 MiB registered against 94 counted). */
    ck_assert_uint_le((uint64_t)at_attach * chunk, faulted_at_attach + (2ull << 20));
    void *stream = fake_dev_stream(0);
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *buf = NULL;
    ck_assert_int_eq(fake_dev_ops.mem_alloc((void **)&buf, n * bb), 0);
    gb_engine_init(&src, 2, 1, 1, 3);
    uint8_t *want = gb_blocks(&src, n, bb);
    gb_keys(ns, 700000, n, keys);
    ck_assert_int_eq(kvc_reserve(ns, NULL, keys, n, &r), (int)n);
    ck_assert_int_eq(kvc_resv_gather(r, 0, n, &src.kv, 0, stream, NULL), (int)n);
    ck_assert_int_eq(kvc_commit(r, SIZE_MAX), (int)n);
    /* Hits while the rest is faulted in and after: the calls register what has been since. */
    for (int i = 0; i < daemon_ms(30000) / 20 && fake_dev.registered < (int)(size / chunk); i++) {
        ck_assert_int_eq(kvc_lookup(ns, keys, n, 0, &l), (int)n);
        memset(buf, 0, n * bb);
        ck_assert_int_eq(kvc_lease_copy_range_async(l, 0, n, buf, n * bb, stream), (int)n);
        ck_assert_int_eq(fake_dev_ops.stream_sync(stream), 0);
        ck_assert_int_eq(kvc_release(l), 0);
        ck_assert(memcmp(buf, want, n * bb) == 0);
        usleep(20000);
    }
    ck_assert_int_eq(daemon_client_stat(c, 0, "host_faulted", &faulted), 0);
    printf("e2e_gpu: a %llu MiB arena registered in %llu MiB chunks: %d at the attach (%llu MiB "
           "faulted in then), %d once faulted in (%llu MiB now)\n",
           (unsigned long long)(size >> 20), (unsigned long long)(chunk >> 20), at_attach,
           (unsigned long long)(faulted_at_attach >> 20), fake_dev.registered,
           (unsigned long long)(faulted >> 20));
    ck_assert_uint_eq(faulted, size);
    ck_assert_int_eq(fake_dev.registered, (int)(size / chunk));
    ck_assert_uint_eq(fake_dev.register_unresident, 0);
    ck_assert_uint_eq(fake_dev.bad_kinds, 0);
    free(want);
    fake_dev_ops.mem_free(buf);
    gb_engine_fini(&src);
    fake_dev_stream_free(stream);
    kvc_disconnect(c);
    ck_assert_int_eq(fake_dev.registered, 0);
    kvci_gpu_ops_set(NULL);
    kvci_gpu_reg_chunk_set(0);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

static TCase *gf_case(Suite *s, const char *name, void (*setup)(void), void (*teardown)(void))
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, daemon_slow() * 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    suite_add_tcase(s, tc);
    return tc;
}

int main(void)
{
    Suite *s = suite_create("e2e_gpu_fake");
    TCase *tf = gf_case(s, "fake-pool", gf_setup, gf_teardown);
    tcase_add_test(tf, test_attach_keeps_current_device);
    tcase_add_test(tf, test_pool_copies_land_in_order);
    tcase_add_test(tf, test_kinds_through_the_pool);
    tcase_add_test(tf, test_fake_refuses_forked_child);
    tcase_add_test(tf, test_pool_moves_off_the_loop);
    tcase_add_test(tf, test_promotion_after_release);
    tcase_add_test(tf, test_lookup_tunes_after_reply);
    TCase *tb = gf_case(s, "batch", ge_setup, ge_teardown);
    tcase_add_loop_test(tb, test_host_hits_bounded_ops, 0, 3);
    tcase_add_loop_test(tb, test_scatter_layers_only_those, 0, 2);
    tcase_add_loop_test(tb, test_gather_layers_commit, 0, 2);
    tcase_add_test(tb, test_scatter_lossy_every_codec);
    tcase_add_loop_test(tb, test_staging_capped, 0, 3);
    TCase *tp = gf_case(s, "batch-pool", gf_setup, gf_teardown);
    tcase_add_test(tp, test_pool_bounded_ops);
    tcase_add_test(tp, test_pool_bounded_ops_strided);
    TCase *tl = gf_case(s, "host-lookup-long", gf_long_setup, gf_teardown);
    tcase_add_test(tl, test_host_lookup_waits_for_pool_moves);
    tcase_add_test(tl, test_host_lookups_share_pool_moves);
    tcase_add_test(tl, test_host_lookup_not_behind_long_prefix);
    TCase *tw = gf_case(s, "host-lookup-wait", gf_long_bounded_setup, gf_teardown);
    tcase_add_test(tw, test_host_lookup_pool_wait_bounded);
    TCase *tr = gf_case(s, "register", NULL, NULL);
    tcase_add_test(tr, test_attach_registers_what_is_faulted);
    fflush(stdout);
    if (daemon_suite_init("e2e-gpu-fake"))
        return 1;
    return daemon_suite_run(s);
}
