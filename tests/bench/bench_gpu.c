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
 * Throughput (a CUDA device): starts kvcd with a 512 MiB GPU pool and a 1 GiB host arena;
 * for 2 MiB blocks (32 layers, 8 kv heads, 128 dim, fp16, 16 tokens), 32 of them, and 256 KiB
 * blocks (2 kv heads), 128 of them, with the engine's KV in vLLM-style paged device tensors (one page per block,
 * the block table reversed), it times, with CUDA events over BG_ITERS calls on the legacy
 * default stream, each call against cudaMemcpy of the same bytes, BG_RUNS runs alternating
 * with the baseline, and writes the best and the median run as two rows:
 *  - pool put: kvc_resv_gather from the paged tensors into pool slots (one kernel), against
 *    cudaMemcpy device to device (target ratio >= 0.9);
 *  - pool-to-device prefix load: kvc_lease_copy_range_async into one contiguous buffer, and
 *    kvc_lease_scatter into paged tensors, against cudaMemcpy device to device (>= 0.9);
 *  - host tier -> device (2 MiB and 256 KiB blocks): the prefix looked up by a client without
 *    the pool flag (the daemon moves it to the host arena, which libkvc registered as
 *    pinned), then kvc_lease_copy_range_async of the host hits into one buffer, and
 *    kvc_lease_scatter of them into the paged tensors (one batched DMA straight into the
 *    pages), each against cudaMemcpy from a pinned buffer of the same bytes (>= 0.9; issue
 *    26's prefill rows need the paged load within 1.1 x the pinned copy);
 *  - host put (2 MiB and 256 KiB blocks): kvc_resv_gather from the paged tensors into host
 *    slots of fresh keys (DMA straight from the pages, or staged where the page pieces are
 *    under libkvc's least DMA piece), against cudaMemcpy to a pinned buffer (>= 0.9);
 *  - all of the above again for 512 blocks of 256 KiB (their own namespace): the host rows
 *    stage 128 MiB, two chunks of libkvc's 64 MiB of device scratch a call, where the 128
 *    blocks' 32 MiB are one (what the chunks cost: the two rows' ratios side by side);
 *  - lossy host hits (2 MiB blocks, every codec): the prefix encoded here and handed to
 *    kvc_lease_scatter as the daemon's quantized blocks would be, decoded by the kernel into
 *    the paged tensors, against cudaMemcpy of the raw bytes from pinned memory (what a raw
 *    host hit costs: above 1 where the smaller transfer and the decode beat it).
 * Each destination is checked once against the CPU's bytes.
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
 * A pool load's fixed part (issue 26; bp_run): the stages of a load of 255 and 1,023 blocks of
 * the 8B shape from a pool on the fake device (lookup, scatter queued, wait, release), wall,
 * client CPU and daemon CPU, where no CUDA device is found or KVC_BENCH_ONLY=poolload asks
 * for it alone (KVC_BENCH_REPS: loads per size; KVC_BENCH_HEAD_DIM: a smaller head for a
 * profile, the fake's copies then smaller, the requests and tables the same;
 * KVC_BENCH_SERVER_CPU and KVC_BENCH_CLIENT_CPU: the CPU each process is bound to;
 * KVC_BENCH_POLICY=lru: the namespaces' policy LRU, not the default's tuner).
 * Usage: bench_gpu OUT.json
 */
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc.h"
#include "client/libkvc_internal.h"
#include "daemon/acl.h"
#include "daemon/config.h"
#include "daemon/engine.h"
#include "daemon/engine_disk.h"
#include "daemon/engine_gpu.h"
#include "daemon/log.h"
#include "daemon/loop.h"
#include "daemon/server.h"
#include "daemon/store.h"
#include "kernels/kern.h"
#include "kernels/kern_dev.h"
#include "kernels/kern_pack.h"
#include "tests/lib/bench.h"
#include "tests/lib/daemon.h"
#include "tests/lib/fake_dev.h"
#include "tiers/gpu.h"
#include "tiers/host.h"

#define BG_ITERS 20
#define BG_RUNS 5
#define BG_ROWS 96

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

/* Device operations (queued copies, copy batches and kernels, and event records) of the
 * calls of each path's measured rounds, and the calls: printed per call. */
static uint64_t bc_ops[BC_PATHS], bc_calls[BC_PATHS];

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
        uint64_t o0 = fake_dev.ops + fake_dev.records;
        rc = kvc_resv_gather(v, 0, BC_BLOCKS, &b->src, 0, b->stream, NULL);
        *call_waits += fake_dev.waits - w0;
        bc_ops[p] += fake_dev.ops + fake_dev.records - o0;
        bc_calls[p]++;
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
    uint64_t o0 = fake_dev.ops + fake_dev.records;
    rc = 0;
    if (p == BC_SCATTER)
        rc = kvc_lease_scatter(l, 0, BC_BLOCKS, &b->dst, 0, b->stream, NULL) == BC_BLOCKS ? 0 : -1;
    for (size_t i = 0; p != BC_SCATTER && rc == 0 && i < BC_BLOCKS; i++)
        rc = p == BC_COPY_ASYNC || p == BC_QCOPY_ASYNC
                 ? kvc_lease_copy_async(l, i, b->blocks + i * b->bb, b->bb, b->stream)
                 : kvc_lease_copy_cuda(l, i, b->blocks + i * b->bb, b->bb, b->stream);
    *call_waits += fake_dev.waits - w0;
    bc_ops[p] += fake_dev.ops + fake_dev.records - o0;
    bc_calls[p] += p == BC_SCATTER ? 1 : BC_BLOCKS;
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
        bc_ops[p] = bc_calls[p] = 0;
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
        /* Promotion: the release of a pool-mapped client's lease starts them; they land,
         * then switch. */
        uint64_t promoted = s->total.gpu_promoted_blocks;
        bm_snap(&a);
        if (engine_lookup(s, &g, ns, keys, BM_BLOCKS, ++now, &lease, locs) != BM_BLOCKS ||
            bm_check(s, locs, r, KVC_WIRE_TIER_HOST) || engine_release(s, &g, lease, now) ||
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
            bench_row_add(rows, BG_ROWS, nrows, name, (double)v[m] / (double)c->moves, "per move",
                          NULL, 0);
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

/* ---- a pool load's fixed part, on the fake device --------------------------------------- */

/* A load of a prefix from kvcd's pool into paged tensors as an engine pays it (issue 26):
 * kvc_lookup with KVC_LOOKUP_GPU, kvc_lease_scatter queued, the stream's wait, kvc_release;
 * everything but the wait is the load's fixed part. The store and server run in this process
 * with a pool on the fake device (kvcd's own code, its loop on this process's CPU); the client
 * is a forked process, as an engine is. The fake's wait is the CPU performing the copies, not
 * a device's time; the daemon's round trips, its lookup and release work, libkvc's tables and
 * the release are the real CPU code. The 8B shape: 32 layers, 8 KV heads of 128, 16-token
 * blocks of 2 MiB, vLLM's per-layer pages; the engine's tensors hold BP_PAGES pages, the block
 * table's BP_TABLE entries naming them in turn (the table's size is the engine's, its pages
 * are shared to keep the fake's memory small). Per prefix length, BP_REPS loads after a
 * warm-up: wall, client CPU and daemon CPU (the server process's clock, read by the client)
 * of each stage; best and median. KVC_BENCH_ONLY=poolload runs this case alone (on any
 * host); the full run takes it where there is no CUDA device. */
#define BP_LAYERS 32
#define BP_PAGES 64
#define BP_TABLE 1024
#define BP_SIZES 2
#define BP_REPS_MAX 31
#define BP_PUT 64 /* blocks per reservation of the put */

enum bp_stage { BP_LOOKUP, BP_SCATTER, BP_WAIT, BP_RELEASE, BP_FIXED, BP_STAGES };
static const char *const bp_stage_name[BP_STAGES] = {"lookup", "scatter", "wait", "release",
                                                     "fixed"};
enum bp_clock { BP_WALL, BP_CPU, BP_DCPU, BP_CLOCKS };
static const char *const bp_clock_name[BP_CLOCKS] = {"wall", "client cpu", "daemon cpu"};

/* What the client process measured, in memory shared with this one. */
struct bp_shared {
    uint32_t sizes[BP_SIZES];
    uint32_t head_dim; /* 128; KVC_BENCH_HEAD_DIM: smaller, for a profile (the fake's copies
                          shrink, the requests and tables stay) */
    int reps;
    double us[BP_SIZES][BP_STAGES][BP_CLOCKS][BP_REPS_MAX];
};

struct bp_arg {
    const char *sock;
    pid_t server; /* the process whose CPU clock is the daemon's */
    struct bp_shared *out;
};

static double bp_clock_us(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* The client: the prefix put into the pool (gathered from the engine's tensors), checked
 * once, then the timed loads. Its exit status says which step failed. */
static int bp_client(void *argp)
{
    const struct bp_arg *a = argp;
    struct bp_shared *out = a->out;
    struct kvc_layout lay = {.model_id = "bench-gpu-poolload",
                             .layers = BP_LAYERS,
                             .kv_heads = 8,
                             .head_dim = out->head_dim,
                             .block_tokens = 16,
                             .dtype = KVC_DTYPE_BF16,
                             .kv_kind = KVC_KV_KIND_KV};
    static uint32_t tokens[BP_TABLE * 16];
    static struct kvc_key keys[BP_TABLE];
    static int32_t table[BP_TABLE];
    void *src_k[BP_LAYERS], *src_v[BP_LAYERS], *dst_k[BP_LAYERS], *dst_v[BP_LAYERS];
    const uint64_t row = 8 * (uint64_t)out->head_dim * 2, page = 16 * row, tbytes = BP_PAGES * page;
    const uint32_t top = out->sizes[BP_SIZES - 1];
    kvc_client *c = NULL;
    kvc_ns *ns = NULL;
    clockid_t dclk;
    fake_dev_reset(1);
    kvci_gpu_ops_set(&fake_dev_ops);
    if (getenv("KVC_BENCH_CLIENT_CPU")) { /* the engine on a CPU of its own, or the daemon's */
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(atoi(getenv("KVC_BENCH_CLIENT_CPU")), &set);
        if (sched_setaffinity(0, sizeof(set), &set))
            return 9;
    }
    if (clock_getcpuclockid(a->server, &dclk))
        return 10;
    for (uint32_t i = 0; i < BP_TABLE * 16; i++)
        tokens[i] = 7000 + i;
    for (uint32_t i = 0; i < BP_TABLE; i++)
        table[i] = (int32_t)((BP_PAGES - 1) - i % BP_PAGES);
    if (kvc_connect(a->sock, &c) || kvc_ns_open(c, &lay, &ns) || kvc_gpu_attach(c) != 1)
        return 11;
    if (kvc_keys_from_tokens(ns, NULL, tokens, (size_t)top * 16, NULL, 0, keys, top) != (int)top)
        return 12;
    void *stream = fake_dev_stream(0);
    for (int l = 0; l < BP_LAYERS; l++) {
        if (fake_dev_ops.mem_alloc(&src_k[l], tbytes) ||
            fake_dev_ops.mem_alloc(&src_v[l], tbytes) ||
            fake_dev_ops.mem_alloc(&dst_k[l], tbytes) || fake_dev_ops.mem_alloc(&dst_v[l], tbytes))
            return 13;
        for (uint64_t x = 0; x < tbytes; x++) { /* the fake's device memory is the host's */
            ((uint8_t *)src_k[l])[x] = (uint8_t)(x * 131 + (uint64_t)l * 7 + 1);
            ((uint8_t *)src_v[l])[x] = (uint8_t)(x * 37 + (uint64_t)l * 5 + 2);
        }
        memset(dst_k[l], 0, tbytes);
        memset(dst_v[l], 0, tbytes);
    }
    struct kvc_paged_kv src = {.k = src_k,
                               .v = src_v,
                               .block_table = table,
                               .table_len = BP_TABLE,
                               .page_tokens = 16,
                               .page_stride = page,
                               .token_stride = row,
                               .head_stride = (uint64_t)out->head_dim * 2,
                               .on_device = 1},
                        dst = src;
    dst.k = dst_k;
    dst.v = dst_v;
    for (uint32_t j = 0; j < top; j += BP_PUT) {
        uint32_t m = top - j < BP_PUT ? top - j : BP_PUT;
        kvc_resv *r;
        if (kvc_reserve_gpu(ns, j ? &keys[j - 1] : NULL, keys + j, m, &r) != (int)m)
            return 14;
        if (kvc_resv_gather(r, 0, m, &src, (uint64_t)j * 16, stream, NULL) != (int)m ||
            kvc_commit(r, SIZE_MAX) != (int)m)
            return 15;
    }
    usleep(2000);
    double d0 = bp_clock_us(dclk); /* the daemon's clock where the next load starts */
    for (int rep = -1; rep < out->reps; rep++)
        for (int si = 0; si < BP_SIZES; si++) {
            const uint32_t n = out->sizes[si];
            double t[BP_STAGES - 1][BP_CLOCKS];
            kvc_lease *l = NULL;
            int got = -1;
            if (fake_dev_ops.stream_sync(stream))
                return 16;
            /* Each stage timed alone (wall, this thread's CPU); another process's CPU clock is
             * brought up to date when it sleeps, so the daemon's is read 2 ms after the lookup,
             * the wait and the release, outside the timed stages: the lookup's share holds its
             * work after the reply, the wait's the loop's ticks in it (the scatter asks nothing
             * of the daemon: its share is 0), the release's all of its own. */
            for (int sg = 0; sg < BP_FIXED; sg++) {
                double w0 = bp_clock_us(CLOCK_MONOTONIC), c0 = bp_clock_us(CLOCK_THREAD_CPUTIME_ID);
                int rc = 0;
                if (sg == BP_LOOKUP)
                    rc = kvc_lookup(ns, keys, n, KVC_LOOKUP_GPU, &l) == (int)n ? 0 : 17;
                else if (sg == BP_SCATTER)
                    got = kvc_lease_scatter(l, 0, n, &dst, 0, stream, NULL);
                else if (sg == BP_WAIT)
                    rc = fake_dev_ops.stream_sync(stream) ? 18 : 0;
                else
                    rc = kvc_release(l) ? 19 : 0;
                t[sg][BP_WALL] = bp_clock_us(CLOCK_MONOTONIC) - w0;
                t[sg][BP_CPU] = bp_clock_us(CLOCK_THREAD_CPUTIME_ID) - c0;
                if (rc)
                    return rc;
                t[sg][BP_DCPU] = 0;
                if (sg != BP_SCATTER) {
                    usleep(2000);
                    double d1 = bp_clock_us(dclk);
                    t[sg][BP_DCPU] = d1 - d0;
                    d0 = d1;
                }
            }
            if (got != (int)n)
                return 20;
            if (rep < 0 && si == BP_SIZES - 1) { /* every page the load wrote, once */
                for (int ly = 0; ly < BP_LAYERS; ly++)
                    if (memcmp(dst_k[ly], src_k[ly], tbytes) ||
                        memcmp(dst_v[ly], src_v[ly], tbytes))
                        return 21;
            }
            for (int cl = 0; rep >= 0 && cl < BP_CLOCKS; cl++) {
                for (int sg = 0; sg < BP_FIXED; sg++)
                    out->us[si][sg][cl][rep] = t[sg][cl];
                out->us[si][BP_FIXED][cl][rep] =
                    t[BP_LOOKUP][cl] + t[BP_SCATTER][cl] + t[BP_RELEASE][cl];
            }
        }
    if (fake_dev.bad_kinds || fake_dev.bad_packs || fake_dev_last_error())
        return 22;
    for (int l = 0; l < BP_LAYERS; l++) {
        fake_dev_ops.mem_free(src_k[l]);
        fake_dev_ops.mem_free(src_v[l]);
        fake_dev_ops.mem_free(dst_k[l]);
        fake_dev_ops.mem_free(dst_v[l]);
    }
    fake_dev_stream_free(stream);
    kvc_disconnect(c);
    return 0;
}

static int bp_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* kvcd's store, engine, ACL, loop and server in this process, as tests/lib/inproc.c sets
 * them up (whose Check assertions want a test runner), serving until the client exited. */
struct bp_server {
    struct config *cfg;
    struct store *s;
    struct acl *acl;
    struct loop *l;
    struct server *sv;
    pid_t child;
    int status;
};

static void bp_tick(void *arg)
{
    struct bp_server *x = arg;
    int st;
    server_tick(x->sv);
    if (x->child > 0 && waitpid(x->child, &st, WNOHANG) == x->child) {
        x->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        x->child = 0;
    }
    if (x->child <= 0 && server_clients(x->sv) == 0)
        loop_stop(x->l);
}

static void bp_server_free(struct bp_server *x)
{
    server_free(x->sv);
    acl_free(x->acl);
    if (x->s)
        engine_stop(x->s);
    store_free(x->s);
    loop_free(x->l);
    config_free(x->cfg);
}

static int bp_server_new(struct bp_server *x, const struct store_params *sp, const char *sock)
{
    struct server_params vp;
    int rc = 0;
    memset(x, 0, sizeof(*x));
    if (!(x->cfg = config_new()) || !(x->s = store_new(sp, &rc)) || !x->s->gpu)
        return -1;
    engine_attach(x->s);
    if (!(x->acl = acl_new(x->s, x->cfg, &rc)) || !(x->l = loop_new(&rc)))
        return -1;
    daemon_server_params(&vp, sock, 0600, 16, x->cfg, x->acl);
    return (x->sv = server_new(x->l, x->s, &vp, &rc)) ? 0 : -1;
}

/* The store and server here, a pool on the fake device, the client forked. */
static void bp_run(struct bench_row *rows, size_t *nrows)
{
    const bool smoke = bench_smoke();
    const uint32_t top = smoke ? 64 : 1023;
    /* host arena and pool of one size, as bench_python's loadstages rows have them: the
     * default policy's tuner sizes its miniature caches by the arena's blocks */
    const uint64_t arena = ((uint64_t)top * 2 * 10 / 9 + 8) << 20;
    struct store_params sp = {.host_size = arena,
                              .host_page_size = 2 << 20,
                              .high_watermark = 0.95,
                              .low_watermark = 0.9,
                              .max_namespaces = 4,
                              .max_handles = 64,
                              /* KVC_BENCH_POLICY=lru: no tuner after the lookups' replies */
                              .policy = getenv("KVC_BENCH_POLICY") &&
                                                strcmp(getenv("KVC_BENCH_POLICY"), "lru") == 0
                                            ? POLICY_LRU
                                            : POLICY_DEFAULT,
                              /* the prefix under the low watermark: every put in the pool */
                              .gpu_size = arena,
                              .gpu_device = 0,
                              .gpu_page_size = 2 << 20,
                              .gpu_ops = &fake_dev_ops};
    struct daemon d = {0};
    struct bp_server x;
    struct bp_shared *sh =
        mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED || daemon_dir_init(&d)) {
        bench_fail("gpu: poolload: no shared memory or directory");
        return;
    }
    sh->sizes[0] = smoke ? 16 : 255;
    sh->sizes[1] = top;
    sh->reps = smoke ? 2 : 15;
    if (getenv("KVC_BENCH_REPS"))
        sh->reps = atoi(getenv("KVC_BENCH_REPS"));
    sh->head_dim =
        getenv("KVC_BENCH_HEAD_DIM") ? (uint32_t)atoi(getenv("KVC_BENCH_HEAD_DIM")) : 128;
    sh->head_dim = sh->head_dim >= 8 && sh->head_dim <= 128 ? sh->head_dim & ~7u : 128;
    sh->reps = sh->reps < 1 ? 1 : sh->reps > BP_REPS_MAX ? BP_REPS_MAX : sh->reps;
    log_setup(LOG_LEVEL_WARNING, 100);
    fake_dev_reset(1);
    if (bp_server_new(&x, &sp, d.sock)) {
        bench_fail("gpu: poolload: no store with a pool on the fake device");
        bp_server_free(&x);
        daemon_cleanup(&d);
        munmap(sh, sizeof(*sh));
        return;
    }
    if (getenv("KVC_BENCH_SERVER_CPU")) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(atoi(getenv("KVC_BENCH_SERVER_CPU")), &set);
        if (sched_setaffinity(0, sizeof(set), &set))
            bench_fail("gpu: poolload: KVC_BENCH_SERVER_CPU refused");
    }
    struct bp_arg arg = {.sock = d.sock, .server = getpid(), .out = sh};
    x.child = daemon_child_spawn(bp_client, &arg);
    x.status = -1;
    if (x.child > 0)
        loop_run(x.l, 20, bp_tick, &x);
    int st = x.status;
    if (x.s->pins_now || x.s->reserved_now)
        st = 99; /* the client's leases and reservations all went */
    bp_server_free(&x);
    daemon_cleanup(&d);
    if (st != 0) {
        bench_fail("gpu: poolload: the client failed (status %d)", st);
        munmap(sh, sizeof(*sh));
        return;
    }
    printf("\none pool load's stages, us (fake device: its wait is the CPU copying; 8B shape, "
           "head_dim %u, %u KiB blocks; %d loads each), best (median)\n",
           sh->head_dim, 32 * 2 * 16 * 8 * sh->head_dim * 2 / 1024, sh->reps);
    printf("%-28s %-8s %20s %20s %20s\n", "load", "stage", bp_clock_name[0], bp_clock_name[1],
           bp_clock_name[2]);
    for (int si = 0; si < BP_SIZES; si++)
        for (int sg = 0; sg < BP_STAGES; sg++) {
            char name[96];
            snprintf(name, sizeof(name), "pool_load_%ublk_fake", sh->sizes[si]);
            printf("%-28s %-8s", name, bp_stage_name[sg]);
            for (int cl = 0; cl < BP_CLOCKS; cl++) {
                double v[BP_REPS_MAX];
                memcpy(v, sh->us[si][sg][cl], (size_t)sh->reps * sizeof(double));
                qsort(v, (size_t)sh->reps, sizeof(double), bp_cmp);
                printf(" %9.1f (%8.1f)", v[0], v[sh->reps / 2]);
                if (sg == BP_FIXED || sg == BP_LOOKUP || sg == BP_SCATTER || sg == BP_RELEASE) {
                    char rn[160];
                    snprintf(rn, sizeof(rn), "%s_%s_%s_us", name, bp_stage_name[sg],
                             cl == BP_WALL  ? "wall"
                             : cl == BP_CPU ? "cpu"
                                            : "daemon_cpu");
                    bench_row_add(rows, BG_ROWS, nrows, rn, v[0], "us", NULL, 0);
                }
            }
            printf("\n");
        }
    munmap(sh, sizeof(*sh));
}

/* ---- throughput, on a CUDA device ------------------------------------------------------- */

/* One engine's KV on the device, vLLM-style: per layer a K and a V tensor of `pages` pages of
 * one kvcd block's tokens, the block table reversed (page i of the sequence in physical page
 * pages-1-i), filled from a host pattern (kept in `host` for the checks). */
struct bg_engine {
    uint32_t layers, pages;
    uint64_t bytes; /* of one tensor */
    void *k[64], *v[64];
    uint8_t *host[2][64];
    int32_t *table;
    struct kvc_paged_kv kv;
};

static int bg_engine_new(struct bg_engine *e, const struct kvc_layout *lay, uint32_t pages,
                         int fill)
{
    memset(e, 0, sizeof(*e));
    e->layers = lay->layers;
    e->pages = pages;
    uint64_t row = (uint64_t)lay->kv_heads * lay->head_dim * 2;
    e->bytes = (uint64_t)pages * lay->block_tokens * row;
    e->table = malloc(pages * sizeof(int32_t));
    if (!e->table || lay->layers > 64)
        return -1;
    for (uint32_t i = 0; i < pages; i++)
        e->table[i] = (int32_t)(pages - 1 - i);
    for (uint32_t l = 0; l < lay->layers; l++)
        for (int k = 0; k < 2; k++) {
            void **d = k ? &e->v[l] : &e->k[l];
            uint8_t *h = e->host[k][l] = malloc(e->bytes);
            if (!h || kern_cuda_alloc(d, e->bytes))
                return -1;
            for (uint64_t x = 0; x < e->bytes; x++)
                h[x] = fill ? (uint8_t)(x * 131 + l * 7 + (uint64_t)k * 3 + 1) : 0;
            if (kern_cuda_copy(*d, h, e->bytes, KERN_CUDA_H2D, NULL))
                return -1;
        }
    e->kv = (struct kvc_paged_kv){.k = e->k,
                                  .v = e->v,
                                  .block_table = e->table,
                                  .table_len = pages,
                                  .page_tokens = lay->block_tokens,
                                  .page_stride = (uint64_t)lay->block_tokens * row,
                                  .token_stride = row,
                                  .head_stride = (uint64_t)lay->head_dim * 2,
                                  .on_device = 1};
    return kern_cuda_stream_sync(NULL) ? -1 : 0;
}

static void bg_engine_free(struct bg_engine *e)
{
    for (uint32_t l = 0; l < e->layers; l++) {
        kern_cuda_free(e->k[l]);
        kern_cuda_free(e->v[l]);
        free(e->host[0][l]);
        free(e->host[1][l]);
    }
    free(e->table);
}

/* 0 when the device tensors of e hold what the host copies of `want` hold. */
static int bg_engine_same(const struct bg_engine *e, const struct bg_engine *want)
{
    uint8_t *back = malloc(e->bytes);
    int rc = back ? 0 : -1;
    for (uint32_t l = 0; rc == 0 && l < e->layers; l++)
        for (int k = 0; rc == 0 && k < 2; k++)
            if (kern_cuda_copy(back, k ? e->v[l] : e->k[l], e->bytes, KERN_CUDA_D2H, NULL) ||
                kern_cuda_stream_sync(NULL) || memcmp(back, want->host[k][l], e->bytes))
                rc = -1;
    free(back);
    return rc;
}

/* What one timed call does, and its baseline: a copy of the same bytes. */
struct bg_ctx {
    kvc_lease *l;
    kvc_resv *r;
    size_t n, bb;
    void *dst;
    const struct kvc_paged_kv *kv;
    void *mdst;
    const void *msrc;
    uint64_t bytes;
    int kind;
};

static void bg_copy_range(void *arg)
{
    struct bg_ctx *c = arg;
    int rc = kvc_lease_copy_range_async(c->l, 0, c->n, c->dst, c->n * c->bb, NULL);
    if (rc != (int)c->n)
        bench_fail("gpu: copy range: %s", kvc_strerror(rc));
}

static void bg_scatter(void *arg)
{
    struct bg_ctx *c = arg;
    int rc = kvc_lease_scatter(c->l, 0, c->n, c->kv, 0, NULL, NULL);
    if (rc != (int)c->n)
        bench_fail("gpu: scatter: %s", kvc_strerror(rc));
}

static void bg_gather(void *arg)
{
    struct bg_ctx *c = arg;
    int rc = kvc_resv_gather(c->r, 0, c->n, c->kv, 0, NULL, NULL);
    if (rc != (int)c->n)
        bench_fail("gpu: gather: %s", kvc_strerror(rc));
}

static void bg_memcpy(void *arg)
{
    struct bg_ctx *c = arg;
    int rc = kern_cuda_copy(c->mdst, c->msrc, c->bytes, c->kind, NULL);
    if (rc)
        bench_fail("gpu: cudaMemcpy baseline: %d", rc);
}

static int bg_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Times fn and base (BG_ITERS calls each, on the legacy default stream, CUDA events) BG_RUNS
 * times, alternating, and adds the rows "NAME (best)" and "NAME (median)": GB/s of `bytes`
 * per call against the baseline's of the same bytes. */
static void bg_time(struct bench_row *rows, size_t *nrows, const char *name, uint64_t bytes,
                    void (*fn)(void *), void (*base)(void *), struct bg_ctx *c,
                    const char *baseline)
{
    double v[BG_RUNS], w[BG_RUNS];
    if (bench_failed()) { /* the run is no result already: say so once a row, not why again */
        printf("bench: gpu: %s: not timed (an earlier row failed)\n", name);
        return;
    }
    fn(c); /* warm-up: the first call may grow the client's scratch */
    base(c);
    if (kern_cuda_stream_sync(NULL) || bench_failed()) {
        bench_fail("gpu: %s: the warm-up failed", name);
        return;
    }
    for (int r = 0; r < BG_RUNS; r++) {
        double t = kern_cuda_time_ms(fn, c, BG_ITERS);
        double tb = kern_cuda_time_ms(base, c, BG_ITERS);
        if (t <= 0 || tb <= 0 || bench_failed()) {
            bench_fail("gpu: %s: timing failed (%g, %g ms)", name, t, tb);
            return;
        }
        v[r] = (double)bytes * BG_ITERS / t / 1e6;
        w[r] = (double)bytes * BG_ITERS / tb / 1e6;
    }
    qsort(v, BG_RUNS, sizeof(v[0]), bg_cmp);
    qsort(w, BG_RUNS, sizeof(w[0]), bg_cmp);
    char row[96];
    snprintf(row, sizeof(row), "%s (best)", name);
    bench_row_add(rows, BG_ROWS, nrows, row, v[BG_RUNS - 1], "GB/s", baseline, w[BG_RUNS - 1]);
    snprintf(row, sizeof(row), "%s (median)", name);
    bench_row_add(rows, BG_ROWS, nrows, row, v[BG_RUNS / 2], "GB/s", baseline, w[BG_RUNS / 2]);
}

/* The canonical blocks of e's first n blocks, from its host copies (the reference). */
static uint8_t *bg_blocks(const struct bg_engine *e, const struct kvc_layout *lay, size_t n,
                          size_t bb)
{
    struct kern_pack_layout pl = {lay->layers,   2, lay->block_tokens, lay->kv_heads,
                                  lay->head_dim, 2};
    void *hk[64], *hv[64], **ptrs = calloc(n, sizeof(void *));
    uint8_t *b = malloc(n * bb);
    if (!b || !ptrs) {
        free(b);
        free(ptrs);
        return NULL;
    }
    for (uint32_t l = 0; l < lay->layers; l++) {
        hk[l] = e->host[0][l];
        hv[l] = e->host[1][l];
    }
    struct kern_pack_engine pe = {hk,
                                  hv,
                                  e->table,
                                  e->pages,
                                  e->kv.page_tokens,
                                  e->kv.page_stride,
                                  e->kv.token_stride,
                                  e->kv.head_stride};
    for (size_t j = 0; j < n; j++)
        ptrs[j] = b + j * bb;
    if (kern_pack_cpu(&pl, &pe, 0, (uint32_t)n, ptrs, KERN_PACK_GATHER)) {
        free(b);
        b = NULL;
    }
    free(ptrs);
    return b;
}

/* What bg_block_size moves through the host arena too: the raw host hits (into one buffer
 * and into the paged tensors), and the lossy ones of every codec. */
#define BG_HOST_RAW 1
#define BG_HOST_LOSSY 2

/* Every byte of e's tensors 0, on the device. */
static void bg_engine_zero(struct bg_engine *e)
{
    uint8_t *z = calloc(1, e->bytes);
    for (uint32_t l = 0; z && l < e->layers; l++)
        for (int k = 0; k < 2; k++)
            if (kern_cuda_copy(k ? e->v[l] : e->k[l], z, e->bytes, KERN_CUDA_H2D, NULL))
                bench_fail("gpu: clearing the paged tensors failed");
    if (!z || kern_cuda_stream_sync(NULL))
        bench_fail("gpu: clearing the paged tensors failed");
    free(z);
}

/* One block size: a put of n blocks gathered from paged device tensors into pool slots, then
 * loads of them from the pool into one contiguous buffer and into paged tensors, each against
 * cudaMemcpy device to device of the same bytes; with BG_HOST_RAW in `host`, the same prefix
 * moved to the host arena and loaded from there into one buffer and into the paged tensors
 * against cudaMemcpy from pinned memory, and with BG_HOST_LOSSY as lossy host hits of every
 * codec decoded into paged tensors. Every destination checked once. */
static void bg_block_size(struct daemon *d, kvc_client *c, struct bench_row *rows, size_t *nrows,
                          const struct kvc_layout *lay, size_t n, const char *tag, int host)
{
    kvc_ns *ns;
    kvc_resv *r = NULL;
    kvc_lease *l = NULL;
    struct bg_engine src, dst;
    struct kvc_key *keys = calloc(n, sizeof(*keys));
    uint32_t *tokens = calloc(n * lay->block_tokens, sizeof(uint32_t));
    void *buf = NULL, *pinned = NULL;
    uint8_t *want = NULL, *back = NULL;
    char name[96];
    memset(&src, 0, sizeof(src));
    memset(&dst, 0, sizeof(dst));
    if (!keys || !tokens || kvc_ns_open(c, lay, &ns)) {
        bench_fail("gpu: %s: no namespace", tag);
        goto out;
    }
    size_t bb = kvc_ns_block_bytes(ns), bytes = bb * n;
    for (size_t i = 0; i < n * lay->block_tokens; i++)
        tokens[i] = (uint32_t)i;
    kvc_keys_from_tokens(ns, NULL, tokens, n * lay->block_tokens, NULL, 0, keys, n);
    if (bg_engine_new(&src, lay, (uint32_t)n, 1) || bg_engine_new(&dst, lay, (uint32_t)n, 0) ||
        kern_cuda_alloc(&buf, bytes) || !(want = bg_blocks(&src, lay, n, bb)) ||
        !(back = malloc(bytes))) {
        bench_fail("gpu: %s: no device memory", tag);
        goto out;
    }
    struct bg_ctx cx = {.n = n, .bb = bb, .dst = buf, .bytes = bytes, .kind = KERN_CUDA_D2D};
    /* the baseline copies the same bytes between two device buffers of its own (not into
     * buf: the loads' bytes there are checked after the timed runs) */
    void *mb = NULL, *mb_dst = NULL;
    if (kern_cuda_alloc(&mb, bytes) || kern_cuda_alloc(&mb_dst, bytes)) {
        bench_fail("gpu: %s: no device memory", tag);
        kern_cuda_free(mb);
        goto out;
    }
    cx.msrc = mb;
    cx.mdst = mb_dst;
    /* the put: gathers into the reserved pool slots, then committed (the loads' prefix) */
    if (kvc_reserve_gpu(ns, NULL, keys, n, &r) != (int)n) {
        bench_fail("gpu: %s: no pool slots", tag);
        kern_cuda_free(mb);
        kern_cuda_free(mb_dst);
        goto out;
    }
    cx.r = r;
    cx.kv = &src.kv;
    snprintf(name, sizeof(name), "pool put, gather from paged tensors, %s", tag);
    bg_time(rows, nrows, name, bytes, bg_gather, bg_memcpy, &cx, "cudaMemcpy D2D");
    int crc = kvc_commit(r, SIZE_MAX);
    r = NULL;
    if (crc != (int)n || kvc_lookup(ns, keys, n, KVC_LOOKUP_GPU, &l) != (int)n ||
        kvc_lease_tier(l, 0) != KVC_TIER_GPU || kvc_lease_tier(l, n - 1) != KVC_TIER_GPU) {
        bench_fail("gpu: %s: the put did not land in the pool (%d)", tag, crc);
        kern_cuda_free(mb);
        kern_cuda_free(mb_dst);
        goto out;
    }
    cx.l = l;
    snprintf(name, sizeof(name), "pool-to-device prefix load, %s, contiguous", tag);
    bg_time(rows, nrows, name, bytes, bg_copy_range, bg_memcpy, &cx, "cudaMemcpy D2D");
    cx.kv = &dst.kv;
    snprintf(name, sizeof(name), "pool-to-device prefix load, %s, paged", tag);
    bg_time(rows, nrows, name, bytes, bg_scatter, bg_memcpy, &cx, "cudaMemcpy D2D");
    kvc_release(l);
    l = NULL;
    kern_cuda_free(mb);
    kern_cuda_free(mb_dst);
    if (kern_cuda_copy(back, buf, bytes, KERN_CUDA_D2H, NULL) || kern_cuda_stream_sync(NULL) ||
        memcmp(back, want, bytes) || bg_engine_same(&dst, &src)) {
        bench_fail("gpu: %s: the loads' bytes are not the put's", tag);
        goto out;
    }
    if (!host)
        goto out;
    /* A client without the pool flag moves the prefix to the host arena. */
    kvc_client *h;
    kvc_ns *hns;
    if (kvc_connect(d->sock, &h) || kvc_ns_open(h, lay, &hns) ||
        kvc_lookup(hns, keys, n, 0, &l) != (int)n) {
        bench_fail("gpu: %s: host lookup: not every block", tag);
        goto out;
    }
    kvc_release(l);
    kvc_disconnect(h);
    l = NULL;
    if (kvc_lookup(ns, keys, n, 0, &l) != (int)n || kvc_lease_tier(l, 0) != KVC_TIER_HOST) {
        bench_fail("gpu: %s: the blocks did not move to the host arena", tag);
        goto out;
    }
    const struct kern_dev_ops *ops = kern_dev_cuda();
    pinned = malloc(bytes);
    if (!pinned || ops->host_register(pinned, bytes, 0)) {
        bench_fail("gpu: %s: no pinned buffer", tag);
        free(pinned);
        pinned = NULL;
        goto out;
    }
    memset(pinned, 1, bytes);
    cx.l = l;
    cx.msrc = pinned;
    cx.mdst = buf; /* the host rows' destinations are not checked after their timing */
    cx.kind = KERN_CUDA_H2D;
    snprintf(name, sizeof(name), "host-tier hit into device, %s", tag);
    bg_time(rows, nrows, name, bytes, bg_copy_range, bg_memcpy, &cx, "cudaMemcpy H2D pinned");
    /* the same host hits into the paged tensors: one batched DMA straight into the pages
     * (vLLM's packed layout), against the pinned copy of the same bytes */
    bg_engine_zero(&dst);
    cx.kv = &dst.kv;
    snprintf(name, sizeof(name), "host-tier hit into paged tensors, %s", tag);
    bg_time(rows, nrows, name, bytes, bg_scatter, bg_memcpy, &cx, "cudaMemcpy H2D pinned");
    if (bg_engine_same(&dst, &src)) {
        bench_fail("gpu: %s: the host hits' bytes in the paged tensors are not the put's", tag);
        goto out;
    }
    /* A put into host slots: the paged tensors gathered into the host arena (by DMA straight
     * from the pages where the pieces are long enough, else staged and gathered by the
     * kernel), against a pinned D2H copy of the same bytes. Fresh keys: the prefix above is
     * cached; the reservation is aborted after the timing. */
    for (size_t i = 0; i < n * lay->block_tokens; i++)
        tokens[i] = (uint32_t)i + (1u << 30);
    kvc_keys_from_tokens(ns, NULL, tokens, n * lay->block_tokens, NULL, 0, keys, n);
    if (kvc_reserve(ns, NULL, keys, n, &r) != (int)n) {
        bench_fail("gpu: %s: no host slots", tag);
        goto unpin;
    }
    cx.r = r;
    cx.kv = &src.kv;
    cx.msrc = buf;
    cx.mdst = pinned;
    cx.kind = KERN_CUDA_D2H;
    snprintf(name, sizeof(name), "host put, gather from paged tensors, %s", tag);
    bg_time(rows, nrows, name, bytes, bg_gather, bg_memcpy, &cx, "cudaMemcpy D2H pinned");
    kvc_abort(r);
    r = NULL;
    cx.msrc = pinned;
    cx.mdst = buf;
    cx.kind = KERN_CUDA_H2D;
    if (!(host & BG_HOST_LOSSY))
        goto unpin;
    /* the cached prefix's keys again (the put above took fresh ones) */
    for (size_t i = 0; i < n * lay->block_tokens; i++)
        tokens[i] = (uint32_t)i;
    kvc_keys_from_tokens(ns, NULL, tokens, n * lay->block_tokens, NULL, 0, keys, n);
    /* Lossy host hits: the prefix encoded here in each codec (registered, as the arena is),
     * the lease pointed at them as at blocks the daemon quantized; decoded into the paged
     * tensors, against the pinned copy of the raw bytes. */
    struct kern_layout kl = {lay->layers,       lay->kv_heads,   lay->head_dim,
                             lay->block_tokens, KERN_DTYPE_FP16, 0};
    for (int codec = KERN_CODEC_Q8_0; codec < KERN_CODEC_COUNT && !bench_failed(); codec++) {
        struct kern_recipe rec;
        kern_recipe_fill(&rec, (enum kern_codec)codec, (enum kern_codec)codec, 0);
        int64_t es = kern_encoded_size(&kl, &rec);
        uint8_t *enc = es > 0 ? malloc(n * (size_t)es) : NULL;
        if (!enc || ops->host_register(enc, n * (uint64_t)es, 0)) {
            bench_fail("gpu: %s: no room for the %s blocks", tag,
                       kern_codec_name((enum kern_codec)codec));
            free(enc);
            break;
        }
        for (size_t j = 0; j < n; j++)
            if (kern_encode_cpu(&kl, &rec, want + j * bb, enc + j * es, (size_t)es, NULL) != es)
                bench_fail("gpu: %s: encode failed", tag);
        kvc_lease *q;
        if (kvc_lookup(ns, keys, n, 0, &q) != (int)n) {
            bench_fail("gpu: %s: lossy lookup", tag);
        } else {
            for (size_t j = 0; j < n; j++) {
                q->hits[j].data = enc + j * es;
                q->hits[j].len = (uint64_t)es;
                q->hits[j].format = (uint8_t)codec;
            }
            cx.l = q;
            snprintf(name, sizeof(name), "lossy host hit into paged tensors, %s, %s", tag,
                     kern_codec_name((enum kern_codec)codec));
            bg_time(rows, nrows, name, bytes, bg_scatter, bg_memcpy, &cx,
                    "cudaMemcpy H2D pinned of the raw bytes");
            kvc_release(q);
        }
        ops->host_unregister(enc);
        free(enc);
    }
unpin:
    ops->host_unregister(pinned);
    free(pinned);
    pinned = NULL;
out:
    if (r)
        kvc_abort(r);
    if (l)
        kvc_release(l);
    kern_cuda_free(buf);
    bg_engine_free(&src);
    bg_engine_free(&dst);
    free(want);
    free(back);
    free(keys);
    free(tokens);
}

/* The throughput rows against a kvcd with a pool on the CUDA device: 2 MiB blocks (32
 * layers, 8 kv heads, 128 dim, fp16, 16 tokens: a Llama-3-8B block) 32 of them, and 256 KiB
 * blocks (2 kv heads) 128 of them. */
static void bg_run(struct daemon *d, struct bench_row *rows, size_t *nrows)
{
    static const char *const args[] = {"-o", "host.size=1g", "-o", "gpu.pool_size=512m", NULL};
    struct kvc_layout big = {.model_id = "bench-gpu-2m",
                             .layers = 32,
                             .kv_heads = 8,
                             .head_dim = 128,
                             .block_tokens = 16,
                             .dtype = KVC_DTYPE_FP16,
                             .kv_kind = KVC_KV_KIND_KV};
    struct kvc_layout small = big, longer;
    small.model_id = "bench-gpu-256k";
    small.kv_heads = 2;
    longer = small;
    longer.model_id = "bench-gpu-256k-long";
    kvc_client *c = NULL;
    kvc_ns *ns;
    /* the namespaces first: attach registers the arenas mapped by then */
    if (daemon_start(d, args) || kvc_connect(d->sock, &c) || kvc_ns_open(c, &big, &ns) ||
        kvc_ns_open(c, &small, &ns) || kvc_ns_open(c, &longer, &ns) || kvc_gpu_attach(c) != 1) {
        bench_fail("gpu: no daemon with a mapped pool");
        goto out;
    }
    bg_block_size(d, c, rows, nrows, &big, 32, "2 MiB blocks", BG_HOST_RAW | BG_HOST_LOSSY);
    bg_block_size(d, c, rows, nrows, &small, 128, "256 KiB blocks", BG_HOST_RAW);
    /* the host rows of 256 KiB blocks stage them (8 KiB page pieces): 512 of them (128 MiB)
     * go through libkvc's 64 MiB of device scratch in two chunks, where the 128 above are one */
    bg_block_size(d, c, rows, nrows, &longer, 512, "256 KiB blocks x512 (2 staged chunks)",
                  BG_HOST_RAW);
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
    if (getenv("KVC_BENCH_ONLY") && strcmp(getenv("KVC_BENCH_ONLY"), "poolload") == 0) {
        bp_run(rows, &nrows);
        rc = bench_finish(argv[1], rows, nrows);
        daemon_suite_fini();
        return rc;
    }
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
    printf("device operations per call (fake device, %d blocks of host-tier hits; a "
           "per-hit copy is one call): ",
           BC_BLOCKS);
    for (int p = 0; p < BC_PATHS; p++)
        printf("%s%s %.2f", p ? ", " : "", bc_path_name[p],
               bc_calls[p] ? (double)bc_ops[p] / (double)bc_calls[p] : 0.0);
    printf("\n");
    if (nrows > ncalls)
        printf("\n%-66s %9s %9s %7s\n", "case (GB/s of the raw bytes)", "GB/s", "baseline",
               "ratio");
    for (size_t i = ncalls; i < nrows; i++)
        printf("%-66s %9.1f %9.1f %7.3f\n", rows[i].name, rows[i].value, rows[i].base,
               rows[i].value / rows[i].base);
    if (kern_cuda_device_count() <= 0) /* on a device, bench_python's loadstages rows */
        bp_run(rows, &nrows);
    rc = bench_finish(argv[1], rows, nrows);
    if (d.pid) {
        daemon_stop(&d);
        daemon_cleanup(&d);
    }
    daemon_suite_fini();
    return rc;
}
