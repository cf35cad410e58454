/*
 * bench_gpu.c — what a hit costs an engine on the GPU path: the device calls libkvc makes
 * per hit (on the fake device, everywhere), and GPU-tier loads against cudaMemcpy of the
 * same bytes (on a CUDA device only).
 *
 * DESIGN
 * Calls per hit (tests/lib/fake_dev.c, against the real kvcd without a pool: host-tier hits
 * into device tensors, the paths with staging): for kvc_lease_copy_async,
 * kvc_lease_copy_cuda, kvc_resv_gather (a put) and kvc_lease_scatter (a load), one warm-up
 * round and then BC_ROUNDS rounds of BC_BLOCKS blocks each (lookup or reserve, the calls,
 * kvc_release or kvc_commit), counting device allocations, frees, device-wide
 * synchronisations (cudaFree waits for the whole device), waits on the legacy default
 * stream, and host waits inside the calls themselves (before the release or commit, which
 * serialise an engine's batch). Each is a row in calls per hit with target 0 (value <= 0;
 * no baseline: a zero is no baseline). Every round's bytes are checked: a put gathered from
 * a device tensor comes back bit-exact through all three load paths.
 * Throughput (a CUDA device): starts kvcd with a GPU pool, puts a prefix of BG_BLOCKS
 * blocks of 2 MiB (a 32-layer, 8-head, 128-dim fp16 model at 16 tokens per block) from
 * device memory into the pool, then times, with CUDA events over BG_ITERS repetitions after
 * a warm-up:
 *  - pool → device: kvc_lease_copy_async of every hit into one device buffer, against
 *    cudaMemcpy device-to-device of the same bytes (target ratio >= 0.9);
 *  - host tier → device: the same prefix looked up without the pool flag (the daemon
 *    moves it to the host arena, which libkvc registered as pinned memory), against
 *    cudaMemcpy from a pinned host buffer of the same size (target >= 0.9).
 * Quantized host hits (q8_0 blocks encoded here and handed to the copy calls as the
 * daemon's would be) take the copy-small, dequantize-on-the-device path: the same counts,
 * and the bytes must equal the CPU decoder's.
 * The daemon's own moves between the pool and the host arena (on the fake device, the store
 * and engine in this process, this thread standing for kvcd's loop): BM_ROUNDS rounds of
 * BM_BLOCKS blocks promoted (a pool-mapped client's lookup, completed by the engine's polls
 * once released) and demoted again (a host-only client's lookup, which waits for them),
 * after one warm-up round, counting per move the host waits on this thread, device-wide
 * synchronisations and events created (rows with target 0), and the event queries the polls
 * made (printed). Every round's bytes are checked in the pool and back in the host arena.
 * Without a CUDA device the throughput part prints one SKIP line. Every call is checked
 * (the timed copies too): a failure fails the run, with no row.
 * Usage: bench_gpu OUT.json
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvc.h"
#include "client/libkvc_internal.h"
#include "daemon/engine.h"
#include "daemon/engine_disk.h"
#include "daemon/engine_gpu.h"
#include "daemon/log.h"
#include "daemon/store.h"
#include "kernels/kern.h"
#include "kernels/kern_dev.h"
#include "kernels/kern_pack.h"
#include "tests/lib/bench.h"
#include "tests/lib/daemon.h"
#include "tests/lib/fake_dev.h"
#include "tiers/gpu.h"
#include "tiers/host.h"

#define BG_BLOCKS 32
#define BG_ITERS 20
#define BG_ROWS 48

/* ---- calls per hit, on the fake device -------------------------------------------------- */

#define BC_LAYERS 2
#define BC_HEADS 2
#define BC_DIM 64
#define BC_BT 32
#define BC_BLOCKS 8
#define BC_TOKENS (BC_BT * BC_BLOCKS)
#define BC_ROUNDS_MAX 64

enum bc_path {
    BC_COPY_ASYNC,
    BC_COPY_CUDA,
    BC_GATHER,
    BC_SCATTER,
    BC_QCOPY_ASYNC, /* quantized host hits (q8_0), decoded on the device */
    BC_QCOPY_CUDA,
    BC_PATHS
};

static const char *const bc_path_name[BC_PATHS] = {
    [BC_COPY_ASYNC] = "kvc_lease_copy_async",
    [BC_COPY_CUDA] = "kvc_lease_copy_cuda",
    [BC_GATHER] = "gather (put)",
    [BC_SCATTER] = "scatter (get)",
    [BC_QCOPY_ASYNC] = "kvc_lease_copy_async, q8_0 hit",
    [BC_QCOPY_CUDA] = "kvc_lease_copy_cuda, q8_0 hit",
};

/* The counters of one path's measured rounds. */
struct bc_count {
    uint64_t allocs, frees, device_syncs, legacy_syncs, call_waits, hits;
};

struct bc_state {
    kvc_ns *ns;
    void *stream;
    size_t bb;
    struct kvc_key keys[BC_ROUNDS_MAX + 1][BC_BLOCKS];
    /* one engine's K and V per layer on the fake device, contiguous: the put's source */
    void *src_k[BC_LAYERS], *src_v[BC_LAYERS];
    /* the load's destination, same shape */
    void *dst_k[BC_LAYERS], *dst_v[BC_LAYERS];
    uint64_t tensor_bytes;
    struct kvc_paged_kv src, dst;
    int32_t table[1];
    uint8_t *blocks;   /* device buffer for the per-hit copies: BC_BLOCKS blocks */
    uint8_t *expected; /* the canonical blocks of src, from kern_pack_cpu */
    uint8_t *enc;      /* those blocks encoded in q8_0 (encsz bytes apart), the quantized hits */
    int64_t encsz;
    uint8_t *qexpected; /* what they decode to */
};

static void bc_snapshot(struct bc_count *c)
{
    c->allocs = fake_dev.allocs;
    c->frees = fake_dev.frees;
    c->device_syncs = fake_dev.device_syncs;
    c->legacy_syncs = fake_dev.legacy_syncs;
}

/* One round of path p over the keys of round r. The waits inside the calls (not the release
 * or commit) are added to *call_waits. 0, or -1 after bench_fail(). */
static int bc_round(struct bc_state *b, enum bc_path p, int r, uint64_t *call_waits)
{
    const struct kvc_key *keys = b->keys[r];
    kvc_lease *l;
    kvc_resv *v;
    uint64_t w0;
    int rc;
    if (p == BC_GATHER) {
        if (kvc_reserve(b->ns, NULL, keys, BC_BLOCKS, &v) != BC_BLOCKS) {
            bench_fail("gpu: calls: reserve round %d", r);
            return -1;
        }
        w0 = fake_dev.waits;
        rc = kvc_resv_gather(v, 0, BC_BLOCKS, &b->src, 0, b->stream, NULL);
        *call_waits += fake_dev.waits - w0;
        if (rc != BC_BLOCKS) {
            kvc_abort(v);
            bench_fail("gpu: calls: gather round %d: %s", r, kvc_strerror(rc));
            return -1;
        }
        rc = kvc_commit(v, SIZE_MAX);
        if (rc != BC_BLOCKS) {
            bench_fail("gpu: calls: commit round %d: %s", r, kvc_strerror(rc));
            return -1;
        }
        return 0;
    }
    if (kvc_lookup(b->ns, keys, BC_BLOCKS, 0, &l) != BC_BLOCKS) {
        bench_fail("gpu: calls: round %d: not every block is a hit", r);
        return -1;
    }
    if (p == BC_SCATTER) {
        for (uint32_t i = 0; i < BC_LAYERS; i++) {
            memset(b->dst_k[i], 0, b->tensor_bytes);
            memset(b->dst_v[i], 0, b->tensor_bytes);
        }
    } else {
        memset(b->blocks, 0, b->bb * BC_BLOCKS);
    }
    bool quant = p == BC_QCOPY_ASYNC || p == BC_QCOPY_CUDA;
    for (size_t i = 0; quant && i < BC_BLOCKS; i++) { /* as if the daemon had quantized them */
        l->hits[i].data = b->enc + i * (size_t)b->encsz;
        l->hits[i].len = (uint64_t)b->encsz;
        l->hits[i].format = KVC_WIRE_FORMAT_Q8_0;
    }
    w0 = fake_dev.waits;
    rc = 0;
    if (p == BC_SCATTER)
        rc = kvc_lease_scatter(l, 0, BC_BLOCKS, &b->dst, 0, b->stream, NULL) == BC_BLOCKS ? 0 : -1;
    for (size_t i = 0; p != BC_SCATTER && rc == 0 && i < BC_BLOCKS; i++)
        rc = p == BC_COPY_ASYNC || p == BC_QCOPY_ASYNC
                 ? kvc_lease_copy_async(l, i, b->blocks + i * b->bb, b->bb, b->stream)
                 : kvc_lease_copy_cuda(l, i, b->blocks + i * b->bb, b->bb, b->stream);
    *call_waits += fake_dev.waits - w0;
    int rrc = kvc_release(l);
    if (rc || rrc) {
        bench_fail("gpu: calls: %s round %d: %s", bc_path_name[p], r, kvc_strerror(rc ? rc : rrc));
        return -1;
    }
    /* Everything has landed once kvc_release() returns: compare now. */
    if (p == BC_SCATTER) {
        for (uint32_t i = 0; i < BC_LAYERS; i++)
            if (memcmp(b->dst_k[i], b->src_k[i], b->tensor_bytes) ||
                memcmp(b->dst_v[i], b->src_v[i], b->tensor_bytes)) {
                bench_fail("gpu: calls: scatter round %d: wrong bytes in layer %u", r, i);
                return -1;
            }
    } else if (memcmp(b->blocks, quant ? b->qexpected : b->expected, b->bb * BC_BLOCKS)) {
        bench_fail("gpu: calls: %s round %d: wrong bytes", bc_path_name[p], r);
        return -1;
    }
    return 0;
}

static void *bc_dev_alloc(uint64_t len)
{
    void *p = NULL;
    return fake_dev_ops.mem_alloc(&p, len) ? NULL : p;
}

/* Runs every path on the fake device against daemon d (no pool: host-tier hits and slots)
 * and adds its rows. 0, or -1 after bench_fail(). */
static int bc_run(const struct daemon *d, struct bench_row *rows, size_t *nrows,
                  struct bc_count *counts)
{
    struct kvc_layout lay = {.model_id = "bench-gpu-calls",
                             .layers = BC_LAYERS,
                             .kv_heads = BC_HEADS,
                             .head_dim = BC_DIM,
                             .block_tokens = BC_BT,
                             .dtype = KVC_DTYPE_FP16,
                             .kv_kind = KVC_KV_KIND_KV};
    static struct bc_state b;
    static uint32_t tokens[BC_TOKENS];
    int rounds = bench_smoke() ? 4 : BC_ROUNDS_MAX;
    kvc_client *c = NULL;
    int rc = -1;
    fake_dev_reset(1);
    kvci_gpu_ops_set(&fake_dev_ops);
    if (kvc_connect(d->sock, &c) || kvc_ns_open(c, &lay, &b.ns) || kvc_gpu_attach(c) != 0) {
        bench_fail("gpu: calls: no client attached to the fake device");
        goto out;
    }
    b.bb = kvc_ns_block_bytes(b.ns);
    b.tensor_bytes = (uint64_t)BC_TOKENS * BC_HEADS * BC_DIM * 2;
    b.stream = fake_dev_stream(0);
    b.blocks = bc_dev_alloc(b.bb * BC_BLOCKS);
    b.expected = malloc(b.bb * BC_BLOCKS);
    if (!b.stream || !b.blocks || !b.expected) {
        bench_fail("gpu: calls: no engine stream or buffers");
        goto out;
    }
    for (uint32_t i = 0; i < BC_LAYERS; i++) {
        b.src_k[i] = bc_dev_alloc(b.tensor_bytes);
        b.src_v[i] = bc_dev_alloc(b.tensor_bytes);
        b.dst_k[i] = bc_dev_alloc(b.tensor_bytes);
        b.dst_v[i] = bc_dev_alloc(b.tensor_bytes);
        if (!b.src_k[i] || !b.src_v[i] || !b.dst_k[i] || !b.dst_v[i]) {
            bench_fail("gpu: calls: no engine tensors");
            goto out;
        }
        for (uint64_t j = 0; j < b.tensor_bytes; j++) {
            ((uint8_t *)b.src_k[i])[j] = (uint8_t)(j * 131 + i * 7 + 1);
            ((uint8_t *)b.src_v[i])[j] = (uint8_t)(j * 37 + i * 11 + 3);
        }
    }
    b.table[0] = 0;
    b.src = (struct kvc_paged_kv){.k = b.src_k,
                                  .v = b.src_v,
                                  .block_table = b.table,
                                  .table_len = 1,
                                  .page_tokens = BC_TOKENS,
                                  .page_stride = b.tensor_bytes,
                                  .token_stride = BC_HEADS * BC_DIM * 2,
                                  .head_stride = BC_DIM * 2,
                                  .on_device = 1};
    b.dst = b.src;
    b.dst.k = b.dst_k;
    b.dst.v = b.dst_v;
    /* The blocks a correct put stores: the CPU gather of the same tensors. */
    struct kern_pack_layout pl = {.layers = BC_LAYERS,
                                  .kinds = 2,
                                  .block_tokens = BC_BT,
                                  .heads = BC_HEADS,
                                  .head_dim = BC_DIM,
                                  .elem_bytes = 2};
    struct kern_pack_engine pe = {.k = b.src_k,
                                  .v = b.src_v,
                                  .block_table = b.table,
                                  .table_len = 1,
                                  .page_tokens = BC_TOKENS,
                                  .page_stride = b.src.page_stride,
                                  .token_stride = b.src.token_stride,
                                  .head_stride = b.src.head_stride};
    void *exp_blocks[BC_BLOCKS];
    for (size_t j = 0; j < BC_BLOCKS; j++)
        exp_blocks[j] = b.expected + j * b.bb;
    if (kern_pack_cpu(&pl, &pe, 0, BC_BLOCKS, exp_blocks, KERN_PACK_GATHER)) {
        bench_fail("gpu: calls: reference gather failed");
        goto out;
    }
    /* The same blocks in q8_0, and what the CPU decodes them to (the device must agree). */
    struct kern_layout kl = {.layers = BC_LAYERS,
                             .heads = BC_HEADS,
                             .head_dim = BC_DIM,
                             .tokens = BC_BT,
                             .dtype = KVC_DTYPE_FP16};
    struct kern_recipe rec;
    kern_recipe_fill(&rec, (enum kern_codec)kern_codec_from_name("q8_0"),
                     (enum kern_codec)kern_codec_from_name("q8_0"), 0);
    b.encsz = kern_encoded_size(&kl, &rec);
    b.enc = b.encsz > 0 ? malloc((size_t)b.encsz * BC_BLOCKS) : NULL;
    b.qexpected = malloc(b.bb * BC_BLOCKS);
    if (!b.enc || !b.qexpected) {
        bench_fail("gpu: calls: no room for the quantized blocks");
        goto out;
    }
    for (size_t j = 0; j < BC_BLOCKS; j++)
        if (kern_encode_cpu(&kl, &rec, b.expected + j * b.bb, b.enc + j * (size_t)b.encsz,
                            (size_t)b.encsz, NULL) <= 0 ||
            kern_decode_cpu(&kl, b.enc + j * (size_t)b.encsz, (size_t)b.encsz,
                            b.qexpected + j * b.bb, b.bb, KERN_DTYPE_FP16) <= 0) {
            bench_fail("gpu: calls: reference q8_0 encode or decode failed");
            goto out;
        }
    for (int r = 0; r <= rounds; r++) {
        for (uint32_t t = 0; t < BC_TOKENS; t++)
            tokens[t] = (uint32_t)r * 100000u + t + 1;
        kvc_keys_from_tokens(b.ns, NULL, tokens, BC_TOKENS, NULL, 0, b.keys[r], BC_BLOCKS);
    }
    /* The gather first: its puts are what the loads hit. Round 0 warms up (the first use
     * may grow what libkvc keeps); rounds 1.. are counted. */
    static const enum bc_path order[BC_PATHS] = {BC_GATHER,  BC_COPY_ASYNC,  BC_COPY_CUDA,
                                                 BC_SCATTER, BC_QCOPY_ASYNC, BC_QCOPY_CUDA};
    for (int k = 0; k < BC_PATHS; k++) {
        enum bc_path p = order[k];
        struct bc_count s0, s1;
        uint64_t waits = 0;
        if (bc_round(&b, p, 0, &waits))
            goto out;
        waits = 0;
        bc_snapshot(&s0);
        for (int r = 1; r <= rounds; r++)
            if (bc_round(&b, p, r, &waits))
                goto out;
        bc_snapshot(&s1);
        counts[p] = (struct bc_count){.allocs = s1.allocs - s0.allocs,
                                      .frees = s1.frees - s0.frees,
                                      .device_syncs = s1.device_syncs - s0.device_syncs,
                                      .legacy_syncs = s1.legacy_syncs - s0.legacy_syncs,
                                      .call_waits = waits,
                                      .hits = (uint64_t)rounds * BC_BLOCKS};
    }
    if (fake_dev.bad_kinds || fake_dev.bad_packs || fake_dev_last_error()) {
        bench_fail("gpu: calls: the fake device refused work (%llu kinds, %llu kernels)",
                   (unsigned long long)fake_dev.bad_kinds, (unsigned long long)fake_dev.bad_packs);
        goto out;
    }
    for (int p = 0; p < BC_PATHS; p++) {
        static const char *const what[] = {"device allocations", "device frees",
                                           "device-wide syncs", "legacy-stream waits",
                                           "waits in the calls"};
        const struct bc_count *n = &counts[p];
        uint64_t v[] = {n->allocs, n->frees, n->device_syncs, n->legacy_syncs, n->call_waits};
        for (size_t m = 0; m < sizeof(v) / sizeof(v[0]); m++) {
            char name[96];
            snprintf(name, sizeof(name), "%s: %s", bc_path_name[p], what[m]);
            bench_row_add(rows, BG_ROWS, nrows, name, (double)v[m] / (double)n->hits, "per hit",
                          NULL, 0);
        }
    }
    rc = 0;
out:
    for (uint32_t i = 0; i < BC_LAYERS; i++) {
        fake_dev_ops.mem_free(b.src_k[i]);
        fake_dev_ops.mem_free(b.src_v[i]);
        fake_dev_ops.mem_free(b.dst_k[i]);
        fake_dev_ops.mem_free(b.dst_v[i]);
    }
    fake_dev_ops.mem_free(b.blocks);
    free(b.expected);
    free(b.enc);
    free(b.qexpected);
    kvc_disconnect(c);
    if (b.stream)
        fake_dev_stream_free(b.stream);
    kvci_gpu_ops_set(NULL);
    return rc;
}

/* ---- the daemon's pool moves, on the fake device ---------------------------------------- */

#define BM_BLOCKS 8
#define BM_ROUNDS_MAX 64

/* Per direction: moves made, and what they cost this thread and the device. */
struct bm_count {
    uint64_t moves, waits, device_syncs, events, queries;
};

static void bm_snap(struct bm_count *c)
{
    c->waits = fake_dev.waits;
    c->device_syncs = fake_dev.device_syncs;
    c->events = fake_dev.events_created;
    c->queries = fake_dev.queries;
}

static void bm_add(struct bm_count *sum, const struct bm_count *a, const struct bm_count *b,
                   uint64_t moves)
{
    sum->moves += moves;
    sum->waits += b->waits - a->waits;
    sum->device_syncs += b->device_syncs - a->device_syncs;
    sum->events += b->events - a->events;
    sum->queries += b->queries - a->queries;
}

static uint8_t bm_byte(int r, uint32_t i)
{
    return (uint8_t)(r * 31 + (int)i * 7 + 1);
}

/* gpu_moves_inflight and gpu_moves_waiting into v[0], v[1]. */
static void bm_stat(void *arg, const char *name, uint64_t v)
{
    uint64_t *out = arg;
    if (strcmp(name, "gpu_moves_inflight") == 0)
        out[0] = v;
    else if (strcmp(name, "gpu_moves_waiting") == 0)
        out[1] = v;
}

/* Polls as the loop does until no move is in flight or waiting; false if that never comes. */
static bool bm_settle(struct store *s, uint64_t now)
{
    for (int i = 0; i < 100000; i++) {
        uint64_t v[2] = {1, 1};
        engine_gpu_poll(s, now);
        engine_gpu_stats(s, bm_stat, v);
        if (!v[0] && !v[1])
            return true;
    }
    return false;
}

/* 0 if each block i of keys is filled with bm_byte(r, i) at its location. */
static int bm_check(struct store *s, const struct kvc_wire_loc *locs, int r, uint32_t tier)
{
    for (uint32_t i = 0; i < BM_BLOCKS; i++) {
        const uint8_t *p;
        if (locs[i].tier != tier)
            return -1;
        p = tier == KVC_WIRE_TIER_GPU
                ? (const uint8_t *)tier_gpu_pool(s->gpu)->base + locs[i].offset
                : (const uint8_t *)tier_host_base(s->arenas[locs[i].arena_id].tier) +
                      locs[i].offset;
        for (uint64_t j = 0; j < locs[i].length; j += 509)
            if (p[j] != bm_byte(r, i))
                return -1;
    }
    return 0;
}

/* Runs the moves and adds their rows. 0, or -1 after bench_fail(). */
static int bm_run(struct bench_row *rows, size_t *nrows)
{
    struct store_params sp = {.host_size = 16 << 20,
                              .host_page_size = 64 << 10,
                              .high_watermark = 0.95,
                              .low_watermark = 0.9,
                              .max_namespaces = 4,
                              .max_handles = 64,
                              .policy = POLICY_LRU,
                              .gpu_size = 4 << 20,
                              .gpu_device = 0,
                              .gpu_page_size = 64 << 10,
                              .gpu_ops = &fake_dev_ops};
    struct kvc_wire_layout lay = {.layers = BC_LAYERS,
                                  .kv_heads = BC_HEADS,
                                  .head_dim = BC_DIM,
                                  .block_tokens = BC_BT,
                                  .dtype = KVC_WIRE_DTYPE_FP16,
                                  .kv_kind = KVC_WIRE_KV_KIND_KV};
    struct bm_count promo = {0}, demo = {0}, a, b;
    struct store_owner g, h;
    struct store *s;
    uint32_t ns;
    bool created;
    int rounds = bench_smoke() ? 4 : BM_ROUNDS_MAX, rc = -1, err = 0;
    uint64_t now = 1;
    log_setup(LOG_LEVEL_WARNING, 100);
    fake_dev_reset(1);
    snprintf(lay.model_id, sizeof(lay.model_id), "bench-gpu-moves");
    s = store_new(&sp, &err);
    if (!s || !s->gpu) {
        bench_fail("gpu: moves: no store with a pool on the fake device (%d)", err);
        store_free(s);
        return -1;
    }
    engine_attach(s);
    store_owner_init(&g);
    store_owner_init(&h);
    g.gpu = true;
    if (store_ns_open(s, &lay, &ns, &created)) {
        bench_fail("gpu: moves: no namespace");
        goto out;
    }
    for (int r = 0; r <= rounds; r++) {
        struct kvc_wire_key keys[BM_BLOCKS], root = {0};
        struct kvc_wire_loc locs[BM_BLOCKS];
        uint8_t st[BM_BLOCKS];
        uint64_t resv, lease;
        uint32_t dropped, nhit, nready, pending;
        for (uint32_t i = 0; i < BM_BLOCKS; i++)
            keys[i] = (struct kvc_wire_key){.lo = (uint64_t)r * 1000 + i + 1, .hi = 0x6d76};
        if (store_reserve(s, &h, ns, &root, keys, BM_BLOCKS, now, &resv, st, locs) != BM_BLOCKS) {
            bench_fail("gpu: moves: round %d: no host slots", r);
            goto out;
        }
        for (uint32_t i = 0; i < BM_BLOCKS; i++)
            memset((uint8_t *)tier_host_base(s->arenas[locs[i].arena_id].tier) + locs[i].offset,
                   bm_byte(r, i), locs[i].length);
        if (store_commit(s, &h, resv, UINT32_MAX, now, &dropped) != BM_BLOCKS) {
            bench_fail("gpu: moves: round %d: commit", r);
            goto out;
        }
        /* Promotion: a pool-mapped client's lookup starts them; they land, then switch. */
        uint64_t promoted = s->total.gpu_promoted_blocks;
        bm_snap(&a);
        if (engine_lookup(s, &g, ns, keys, BM_BLOCKS, ++now, &lease, locs) != BM_BLOCKS ||
            bm_check(s, locs, r, KVC_WIRE_TIER_HOST) || store_release(s, &g, lease) ||
            !bm_settle(s, ++now)) {
            bench_fail("gpu: moves: round %d: promotion lookup", r);
            goto out;
        }
        bm_snap(&b);
        if (s->total.gpu_promoted_blocks - promoted != BM_BLOCKS) {
            bench_fail("gpu: moves: round %d: %llu of %u promoted", r,
                       (unsigned long long)(s->total.gpu_promoted_blocks - promoted), BM_BLOCKS);
            goto out;
        }
        if (r)
            bm_add(&promo, &a, &b, BM_BLOCKS);
        if (engine_lookup(s, &g, ns, keys, BM_BLOCKS, ++now, &lease, locs) != BM_BLOCKS ||
            bm_check(s, locs, r, KVC_WIRE_TIER_GPU) || store_release(s, &g, lease)) {
            bench_fail("gpu: moves: round %d: wrong bytes in the pool", r);
            goto out;
        }
        /* Demotion: a client that cannot read the pool; its hits are not ready until then. */
        uint64_t demoted = s->total.gpu_demoted_blocks;
        bm_snap(&a);
        if (engine_lookup(s, &h, ns, keys, BM_BLOCKS, ++now, &lease, locs) != BM_BLOCKS ||
            !bm_settle(s, ++now) ||
            engine_disk_lease_state(s, &h, lease, &nhit, &nready, &pending) ||
            nready != BM_BLOCKS || pending) {
            bench_fail("gpu: moves: round %d: demotion lookup", r);
            goto out;
        }
        bm_snap(&b);
        if (s->total.gpu_demoted_blocks - demoted != BM_BLOCKS ||
            bm_check(s, locs, r, KVC_WIRE_TIER_HOST) || store_release(s, &h, lease)) {
            bench_fail("gpu: moves: round %d: wrong bytes back in the host arena", r);
            goto out;
        }
        if (r)
            bm_add(&demo, &a, &b, BM_BLOCKS);
        (void)engine_evict_where(s, ns, UINT32_MAX, 0, true, ++now);
    }
    if (fake_dev.bad_kinds || fake_dev_last_error()) {
        bench_fail("gpu: moves: the fake device refused work");
        goto out;
    }
    for (int d = 0; d < 2; d++) {
        static const char *const what[] = {"waits on the loop thread", "device-wide syncs",
                                           "events created"};
        const struct bm_count *c = d ? &demo : &promo;
        uint64_t v[] = {c->waits, c->device_syncs, c->events};
        for (size_t m = 0; m < sizeof(v) / sizeof(v[0]); m++) {
            char name[96];
            snprintf(name, sizeof(name), "pool %s: %s", d ? "demotion" : "promotion", what[m]);
            bench_row_add(rows, BG_ROWS, nrows, name, (double)v[m] / (double)c->moves,
                          "per move", NULL, 0);
        }
    }
    printf("pool moves (fake device): %llu promotions, %llu demotions; event queries per move "
           "%.2f and %.2f (never a wait)\n",
           (unsigned long long)promo.moves, (unsigned long long)demo.moves,
           (double)promo.queries / (double)promo.moves, (double)demo.queries / (double)demo.moves);
    rc = 0;
out:
    store_owner_fini(s, &g);
    store_owner_fini(s, &h);
    engine_stop(s);
    store_free(s);
    return rc;
}

/* ---- throughput, on a CUDA device ------------------------------------------------------- */

struct bg_copy {
    kvc_lease *l;
    uint8_t *dst;
    size_t bb;
    const void *src;
    size_t bytes;
    int kind;
};

static void bg_lease_copy(void *arg)
{
    struct bg_copy *c = arg;
    for (size_t i = 0; i < kvc_lease_count(c->l); i++) {
        int rc = kvc_lease_copy_async(c->l, i, c->dst + i * c->bb, c->bb, NULL);
        if (rc)
            bench_fail("gpu: lease copy %zu: %s", i, kvc_strerror(rc));
    }
}

static void bg_memcpy(void *arg)
{
    struct bg_copy *c = arg;
    int rc = kern_cuda_copy(c->dst, c->src, c->bytes, c->kind, NULL);
    if (rc)
        bench_fail("gpu: cudaMemcpy baseline: %d", rc);
}

/* The two throughput rows against a kvcd with a pool on the CUDA device. */
static void bg_run(struct daemon *d, struct bench_row *rows, size_t *nrows)
{
    static const char *const args[] = {"-o", "host.size=256m", "-o", "gpu.pool_size=256m", NULL};
    struct kvc_layout lay = {.model_id = "bench-gpu",
                             .layers = 32,
                             .kv_heads = 8,
                             .head_dim = 128,
                             .block_tokens = 16,
                             .dtype = KVC_DTYPE_FP16,
                             .kv_kind = KVC_KV_KIND_KV};
    kvc_client *c = NULL;
    kvc_ns *ns;
    kvc_lease *l;
    kvc_resv *r;
    struct kvc_key keys[BG_BLOCKS];
    uint32_t tokens[BG_BLOCKS * 16];
    if (daemon_start(d, args) || kvc_connect(d->sock, &c) || kvc_ns_open(c, &lay, &ns) ||
        kvc_gpu_attach(c) != 1) {
        bench_fail("gpu: no daemon with a mapped pool");
        goto out;
    }
    size_t bb = kvc_ns_block_bytes(ns), bytes = bb * BG_BLOCKS;
    for (size_t i = 0; i < BG_BLOCKS * 16; i++)
        tokens[i] = (uint32_t)i;
    kvc_keys_from_tokens(ns, NULL, tokens, BG_BLOCKS * 16, NULL, 0, keys, BG_BLOCKS);
    void *src = NULL, *dst = NULL, *pinned = malloc(bytes);
    kern_cuda_alloc(&src, bytes);
    kern_cuda_alloc(&dst, bytes);
    if (!src || !dst || !pinned || kvc_reserve_gpu(ns, NULL, keys, BG_BLOCKS, &r) != BG_BLOCKS) {
        bench_fail("gpu: no buffers or no pool slots");
        goto out;
    }
    for (size_t i = 0; i < BG_BLOCKS; i++)
        if (kvc_resv_write_async(r, i, (uint8_t *)src + i * bb, bb, NULL))
            bench_fail("gpu: write into the pool failed");
    if (kvc_commit(r, SIZE_MAX) != BG_BLOCKS) {
        bench_fail("gpu: commit into the pool failed");
        goto out;
    }

    struct bg_copy cp = {.dst = dst, .bb = bb, .src = src, .bytes = bytes, .kind = KERN_CUDA_D2D};
    if (kvc_lookup(ns, keys, BG_BLOCKS, KVC_LOOKUP_GPU, &l) != BG_BLOCKS) {
        bench_fail("gpu: pool lookup: not every block");
        goto out;
    }
    cp.l = l;
    double t = kern_cuda_time_ms(bg_lease_copy, &cp, BG_ITERS);
    double tb = kern_cuda_time_ms(bg_memcpy, &cp, BG_ITERS);
    kvc_release(l);
    if (t > 0 && tb > 0 && !bench_failed())
        bench_row_add(rows, BG_ROWS, nrows, "pool-to-device prefix load",
                      (double)bytes * BG_ITERS / t / 1e6, "GB/s", "cudaMemcpy D2D",
                      (double)bytes * BG_ITERS / tb / 1e6);
    else
        bench_fail("gpu: pool-to-device timing failed (%g, %g ms)", t, tb);

    /* A second client without the pool flag gets the blocks moved to the host arena. */
    kvc_client *h;
    kvc_ns *hns;
    if (kvc_connect(d->sock, &h) || kvc_ns_open(h, &lay, &hns) ||
        kvc_lookup(hns, keys, BG_BLOCKS, 0, &l) != BG_BLOCKS) {
        bench_fail("gpu: host lookup: not every block");
        goto out;
    }
    kvc_release(l);
    kvc_disconnect(h);
    if (kvc_lookup(ns, keys, BG_BLOCKS, 0, &l) != BG_BLOCKS ||
        kvc_lease_tier(l, 0) != KVC_TIER_HOST) {
        bench_fail("gpu: the blocks did not move to the host arena");
        goto out;
    }
    const struct kern_dev_ops *ops = kern_dev_cuda();
    memset(pinned, 1, bytes);
    ops->host_register(pinned, bytes, 0);
    cp.l = l;
    cp.src = pinned;
    cp.kind = KERN_CUDA_H2D;
    t = kern_cuda_time_ms(bg_lease_copy, &cp, BG_ITERS);
    tb = kern_cuda_time_ms(bg_memcpy, &cp, BG_ITERS);
    kvc_release(l);
    ops->host_unregister(pinned);
    if (t > 0 && tb > 0 && !bench_failed())
        bench_row_add(rows, BG_ROWS, nrows, "host-tier hit into device",
                      (double)bytes * BG_ITERS / t / 1e6, "GB/s", "cudaMemcpy H2D from pinned",
                      (double)bytes * BG_ITERS / tb / 1e6);
    else
        bench_fail("gpu: host-to-device timing failed (%g, %g ms)", t, tb);
out:
    kvc_disconnect(c);
}

int main(int argc, char **argv)
{
    static const char *const cargs[] = {"-o", "host.size=64m", NULL};
    struct daemon dc = {0}, d = {0};
    struct bench_row rows[BG_ROWS];
    struct bc_count counts[BC_PATHS];
    size_t nrows = 0;
    int rc;
    if (argc != 2) {
        fprintf(stderr, "usage: bench_gpu OUT.json\n");
        return 2;
    }
    if (daemon_suite_init("bench-gpu"))
        return 1;
    if (daemon_start(&dc, cargs))
        bench_fail("gpu: calls: kvcd did not start");
    else
        bc_run(&dc, rows, &nrows, counts);
    if (dc.pid) {
        daemon_stop(&dc);
        daemon_cleanup(&dc);
    }
    bm_run(rows, &nrows);
    size_t ncalls = nrows;
    if (kern_cuda_device_count() <= 0)
        printf("SKIP: bench_gpu: no CUDA device found; the throughput rows are not measured\n");
    else
        bg_run(&d, rows, &nrows);
    printf("%-54s %10s %-10s %s\n", "case (fake device: host-tier hits, pool moves)", "value",
           "unit", "target");
    for (size_t i = 0; i < ncalls; i++)
        printf("%-54s %10.4f %-10s <= 0%s\n", rows[i].name, rows[i].value, rows[i].unit,
               rows[i].value > 0 ? "  (above target)" : "");
    if (nrows > ncalls)
        printf("\n%-32s %10s %10s %8s\n", "case", "GB/s", "baseline", "ratio");
    for (size_t i = ncalls; i < nrows; i++)
        printf("%-32s %10.1f %10.1f %8.3f\n", rows[i].name, rows[i].value, rows[i].base,
               rows[i].value / rows[i].base);
    if (nrows > ncalls)
        printf("quantized host hit + GPU dequantize: calls per hit above; throughput not "
               "measured\n");
    rc = bench_finish(argv[1], rows, nrows);
    if (d.pid) {
        daemon_stop(&d);
        daemon_cleanup(&d);
    }
    daemon_suite_fini();
    return rc;
}
