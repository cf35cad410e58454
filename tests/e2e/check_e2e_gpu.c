/*
 * check_e2e_gpu.c — libkvc's GPU section against the real daemon.
 *
 * Everywhere: two processes share a prefix through paged engine layouts on the host
 * (vLLM-style pages with a shuffled block table in, a contiguous tensor out, every byte
 * compared); kvc_gpu_attach() against a daemon without a GPU tier says "host copies" and
 * registers the arenas once (fake device table), and gives them back at disconnect; a daemon
 * configured with a pool but no device logs one line, reports gpu_capacity 0 and serves
 * from the host arena as before.
 * With a pool over the fake device (the store and server in this process): the daemon's
 * moves between the pool and the host arena run while its loop serves other clients (the
 * fake keeps the device busy until another client's requests were answered), and a client
 * that cannot read the pool gets the pool's blocks when their copies have landed.
 * With a CUDA device (make check-gpu on a GPU host): one process puts from device tensors
 * into the pool, another loads into its own device tensors through the pool, every byte
 * compared; host-tier hits land in device tensors the same way; a client killed while it
 * holds pool pins leaks nothing.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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
#include "kernels/kern_dev.h"
#include "kernels/kern_fmt.h"
#include "kernels/kern_pack.h"
#include "tests/lib/daemon.h"
#include "tests/lib/fake_dev.h"

#define GE_LAYERS 2
#define GE_HEADS 2
#define GE_DIM 64
#define GE_BT 32    /* tokens per kvcd block */
#define GE_BLOCKS 6 /* the shared prefix */
#define GE_TOKENS (GE_BT * GE_BLOCKS)
#define GE_ROW (GE_DIM * 2) /* fp16 */

/* The value of element (layer, kind, token, head, dim): what any correct copy yields. */
static uint16_t ge_val(uint32_t l, uint32_t k, uint32_t t, uint32_t h, uint32_t d)
{
    return (uint16_t)(l * 40503u ^ k * 9176u ^ t * 2654435761u ^ h * 97u ^ d * 7919u);
}

/* One engine's KV on the host: per-layer K and V in pages of page_tokens, with a table. */
struct ge_engine {
    uint32_t page_tokens, npages;
    void *k[GE_LAYERS], *v[GE_LAYERS];
    int32_t table[GE_TOKENS];
    uint64_t bytes;
    struct kvc_paged_kv kv;
};

static void ge_engine_init(struct ge_engine *e, uint32_t page_tokens, int shuffle, int fill)
{
    memset(e, 0, sizeof(*e));
    e->page_tokens = page_tokens;
    e->npages = GE_TOKENS / page_tokens;
    e->bytes = (uint64_t)GE_TOKENS * GE_HEADS * GE_ROW;
    for (uint32_t i = 0; i < e->npages; i++)
        e->table[i] = (int32_t)(shuffle ? (i * 7 + 3) % e->npages : i);
    for (uint32_t l = 0; l < GE_LAYERS; l++) {
        e->k[l] = calloc(1, e->bytes);
        e->v[l] = calloc(1, e->bytes);
        for (uint32_t t = 0; fill && t < GE_TOKENS; t++)
            for (uint32_t h = 0; h < GE_HEADS; h++)
                for (uint32_t d = 0; d < GE_DIM; d++) {
                    uint64_t at =
                        (((uint64_t)e->table[t / page_tokens] * page_tokens + t % page_tokens) *
                             GE_HEADS +
                         h) *
                            GE_DIM +
                        d;
                    ((uint16_t *)e->k[l])[at] = ge_val(l, 0, t, h, d);
                    ((uint16_t *)e->v[l])[at] = ge_val(l, 1, t, h, d);
                }
    }
    e->kv = (struct kvc_paged_kv){.k = e->k,
                                  .v = e->v,
                                  .block_table = e->table,
                                  .table_len = e->npages,
                                  .page_tokens = page_tokens,
                                  .page_stride = (uint64_t)page_tokens * GE_HEADS * GE_ROW,
                                  .token_stride = GE_HEADS * GE_ROW,
                                  .head_stride = GE_ROW};
}

static void ge_engine_fini(struct ge_engine *e)
{
    for (uint32_t l = 0; l < GE_LAYERS; l++) {
        free(e->k[l]);
        free(e->v[l]);
    }
}

/* 0 if tokens [0, ntok) of e hold the expected values. */
static int ge_engine_check(const struct ge_engine *e, uint32_t ntok)
{
    for (uint32_t l = 0; l < GE_LAYERS; l++)
        for (uint32_t t = 0; t < ntok; t++)
            for (uint32_t h = 0; h < GE_HEADS; h++)
                for (uint32_t d = 0; d < GE_DIM; d++) {
                    uint64_t at = (((uint64_t)e->table[t / e->page_tokens] * e->page_tokens +
                                    t % e->page_tokens) *
                                       GE_HEADS +
                                   h) *
                                      GE_DIM +
                                  d;
                    if (((uint16_t *)e->k[l])[at] != ge_val(l, 0, t, h, d) ||
                        ((uint16_t *)e->v[l])[at] != ge_val(l, 1, t, h, d))
                        return -1;
                }
    return 0;
}

static struct daemon ge_d;

static struct kvc_layout ge_layout(void)
{
    struct kvc_layout lay = {.model_id = "e2e-gpu",
                             .layers = GE_LAYERS,
                             .kv_heads = GE_HEADS,
                             .head_dim = GE_DIM,
                             .block_tokens = GE_BT,
                             .dtype = KVC_DTYPE_FP16,
                             .kv_kind = KVC_KV_KIND_KV};
    return lay;
}

static int ge_open(kvc_client **c, kvc_ns **ns, struct kvc_key *keys)
{
    static uint32_t tokens[GE_TOKENS];
    struct kvc_layout lay = ge_layout();
    for (uint32_t i = 0; i < GE_TOKENS; i++)
        tokens[i] = 1000 + i;
    if (kvc_connect(ge_d.sock, c) || kvc_ns_open(*c, &lay, ns))
        return -1;
    return kvc_keys_from_tokens(*ns, NULL, tokens, GE_TOKENS, NULL, 0, keys, GE_BLOCKS) == GE_BLOCKS
               ? 0
               : -1;
}

static void ge_setup(void)
{
    static const char *const args[] = {"-o", "host.size=32m", "-o", "host.page_size=64k", NULL};
    memset(&ge_d, 0, sizeof(ge_d));
    ck_assert_int_eq(daemon_start(&ge_d, args), 0);
}

static void ge_teardown(void)
{
    /* A fake case that failed half way must not leave its table to the cases after it (one
     * process runs them all when CK_FORK=no, as under compute-sanitizer). */
    kvci_gpu_ops_set(NULL);
    ck_assert_int_eq(daemon_stop(&ge_d), 0);
    daemon_cleanup(&ge_d);
}

/* Child: puts the prefix from a vLLM-style paged host engine (16-token pages, shuffled). */
static int ge_put_host(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    struct kvc_key keys[GE_BLOCKS];
    struct ge_engine e;
    (void)arg;
    if (ge_open(&c, &ns, keys))
        return 10;
    ge_engine_init(&e, 16, 1, 1);
    if (kvc_reserve(ns, NULL, keys, GE_BLOCKS, &r) != GE_BLOCKS)
        return 11;
    if (kvc_resv_gather(r, 0, GE_BLOCKS, &e.kv, 0, NULL, NULL) != GE_BLOCKS)
        return 12;
    if (kvc_commit(r, SIZE_MAX) != GE_BLOCKS)
        return 13;
    ge_engine_fini(&e);
    kvc_disconnect(c);
    return 0;
}

/* Child: loads the prefix into one contiguous host tensor per layer. */
static int ge_load_host(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS];
    struct ge_engine e;
    (void)arg;
    if (ge_open(&c, &ns, keys))
        return 20;
    ge_engine_init(&e, GE_TOKENS, 0, 0);
    if (kvc_lookup(ns, keys, GE_BLOCKS, 0, &l) != GE_BLOCKS)
        return 21;
    for (size_t i = 0; i < GE_BLOCKS; i++)
        if (kvc_lease_tier(l, i) != KVC_TIER_HOST)
            return 22;
    if (kvc_lease_scatter(l, 0, GE_BLOCKS, &e.kv, 0, NULL, NULL) != GE_BLOCKS)
        return 23;
    if (kvc_release(l))
        return 24;
    if (ge_engine_check(&e, GE_TOKENS))
        return 25;
    /* A missing lease is refused, not dereferenced. */
    if (kvc_lease_scatter(NULL, 0, 1, &e.kv, 0, NULL, NULL) != -EINVAL)
        return 26;
    ge_engine_fini(&e);
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_paged_host_two_processes)
{
    pid_t a = daemon_child_spawn(ge_put_host, NULL);
    ck_assert_int_gt(a, 0);
    ck_assert_int_eq(daemon_child_wait(a, daemon_ms(20000), NULL), 0);
    pid_t b = daemon_child_spawn(ge_load_host, NULL);
    ck_assert_int_gt(b, 0);
    ck_assert_int_eq(daemon_child_wait(b, daemon_ms(20000), NULL), 0);
}
END_TEST

/* Child: this build's own table against a daemon without a GPU tier means host copies (0),
 * with a device here or without, and the same answer when asked again. */
static int ge_attach_own_table(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key keys[GE_BLOCKS];
    (void)arg;
    if (ge_open(&c, &ns, keys))
        return 10;
    if (kvc_gpu_attach(c) != 0 || kvc_gpu_attach(c) != 0)
        return 11;
    kvc_disconnect(c);
    return kvci_gpu_cuda_used() ? 0 : 12;
}

/* No GPU tier in the daemon: attach says "host copies" (0), pins each arena chunk once,
 * asks again with the same answer, and gives the registrations back at disconnect. */
START_TEST(test_attach_without_tier)
{
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key keys[GE_BLOCKS];
    ck_assert_int_eq(ge_open(&c, &ns, keys), 0);
    fake_dev_reset(1);
    kvci_gpu_ops_set(&fake_dev_ops);
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    ck_assert_int_eq(fake_dev.registered, 1); /* a 32 MiB arena: one chunk */
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    ck_assert_int_eq(fake_dev.registered, 1);
    /* Host copies work as before; async copies of host hits go through the device table,
     * and bring the block's own bytes. */
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *src = malloc(bb), *dst = malloc(bb);
    ck_assert(src && dst);
    daemon_block_fill(&keys[0], src, bb);
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, keys, 1, (const void *const[]){src}), 1);
    kvc_lease *l;
    ck_assert_int_eq(kvc_lookup(ns, keys, 1, KVC_LOOKUP_GPU, &l), 1);
    ck_assert_int_eq(kvc_lease_tier(l, 0), KVC_TIER_HOST);
    memset(dst, 0xee, bb);
    uint64_t copied = fake_dev.bytes;
    ck_assert_int_eq(kvc_lease_copy_async(l, 0, dst, bb, NULL), 0);
    ck_assert_int_eq(fake_dev.events_live, 1);
    ck_assert_int_eq(kvc_release(l), 0);
    ck_assert_int_eq(fake_dev.events_live, 1); /* kept by the client for the next call */
    ck_assert_uint_eq(fake_dev.bytes - copied, bb);
    ck_assert_int_eq(daemon_block_check(&keys[0], dst, bb), -1);
    free(src);
    free(dst);
    kvc_disconnect(c);
    ck_assert_int_eq(fake_dev.registered, 0);
    ck_assert_int_eq(fake_dev.events_live, 0);
    kvci_gpu_ops_set(NULL);
    /* This build's own table, in a child: CUDA may start there, and must not in this
     * process, which forks the clients of the cases after it when CK_FORK=no. */
    pid_t p = daemon_child_spawn(ge_attach_own_table, NULL);
    ck_assert_int_eq(daemon_child_wait(p, daemon_ms(60000), NULL), 0);
    ck_assert(!kvci_gpu_cuda_used());
}
END_TEST

static uint64_t ge_stat(kvc_client *c, const char *name)
{
    struct kvc_stat *st;
    size_t n;
    uint64_t v = UINT64_MAX;
    ck_assert_int_eq(kvc_stats(c, 0, &st, &n), 0);
    for (size_t i = 0; i < n; i++)
        if (strcmp(st[i].name, name) == 0)
            v = st[i].value;
    free(st);
    return v;
}

/* A pool configured where there is no device: one log line, no GPU tier, the rest as ever.
 * Registered only where no device is found (main() says SKIP otherwise). */
START_TEST(test_configured_without_device)
{
    static const char *const args[] = {"-o", "host.size=32m", "-o", "gpu.pool_size=64m", NULL};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key keys[GE_BLOCKS];
    ck_assert_int_eq(daemon_stop(&ge_d), 0);
    daemon_cleanup(&ge_d);
    memset(&ge_d, 0, sizeof(ge_d));
    ck_assert_int_eq(daemon_start(&ge_d, args), 0);
    ck_assert_int_eq(daemon_log_count(&ge_d, "gpu: tier disabled"), 1);
    ck_assert_int_eq(ge_open(&c, &ns, keys), 0);
    ck_assert_uint_eq(ge_stat(c, "gpu_capacity"), 0);
    ck_assert_uint_eq(ge_stat(c, "gpu_used"), 0);
    kvc_disconnect(c);
    char out[4096], err[4096];
    ck_assert_int_eq(daemon_kvcctl(&ge_d, out, sizeof(out), err, sizeof(err), "tiers", NULL), 0);
    ck_assert_msg(strstr(out, "gpu   disabled") && strstr(out, "host "), "%s", out);
    pid_t a = daemon_child_spawn(ge_put_host, NULL);
    ck_assert_int_eq(daemon_child_wait(a, daemon_ms(20000), NULL), 0);
    pid_t b = daemon_child_spawn(ge_load_host, NULL);
    ck_assert_int_eq(daemon_child_wait(b, daemon_ms(20000), NULL), 0);
}
END_TEST

/* Issue 18: a wait that reports a fault (the DMA into the slot failed) makes kvc_commit()
 * refuse to publish: it returns the error, and the key stays a miss. */
START_TEST(test_commit_refuses_faulted_copy)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS];
    ck_assert_int_eq(ge_open(&c, &ns, keys), 0);
    fake_dev_reset(1);
    kvci_gpu_ops_set(&fake_dev_ops);
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    void *stream = fake_dev_stream(0);
    ck_assert_ptr_nonnull(stream);
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *src = malloc(bb);
    ck_assert_ptr_nonnull(src);
    daemon_block_fill(&keys[0], src, bb);
    ck_assert_int_eq(kvc_reserve(ns, NULL, keys, 1, &r), 1);
    ck_assert_int_eq(kvc_resv_write_async(r, 0, src, bb, stream), 0);
    fake_dev.fail_wait = EIO;
    ck_assert_int_eq(kvc_commit(r, SIZE_MAX), -EIO);
    ck_assert_int_eq(kvc_lookup(ns, keys, 1, 0, &l), 0);
    kvc_release(l);
    /* The same put without the fault is published. */
    ck_assert_int_eq(kvc_reserve(ns, NULL, keys, 1, &r), 1);
    ck_assert_int_eq(kvc_resv_write_async(r, 0, src, bb, stream), 0);
    ck_assert_int_eq(kvc_commit(r, SIZE_MAX), 1);
    ck_assert_int_eq(kvc_lookup(ns, keys, 1, 0, &l), 1);
    ck_assert_int_eq(daemon_block_check(&keys[0], kvc_lease_data(l, 0), bb), -1);
    ck_assert_int_eq(kvc_release(l), 0);
    ck_assert_int_eq(fake_dev_last_error(), 0);
    fake_dev_stream_free(stream);
    free(src);
    kvc_disconnect(c);
    ck_assert_int_eq(fake_dev.events_live, 0);
    kvci_gpu_ops_set(NULL);
}
END_TEST

/* src (the first `tokens` tokens of a GE layout block) encoded in q8_0 (malloc'd), *n its
 * size: a block as the daemon would have quantized it. */
static uint8_t *ge_encode_q8(const void *src, uint32_t tokens, int64_t *n)
{
    struct kern_layout kl = {.layers = GE_LAYERS,
                             .heads = GE_HEADS,
                             .head_dim = GE_DIM,
                             .tokens = tokens,
                             .dtype = KVC_DTYPE_FP16};
    struct kern_recipe rec;
    int q8 = kern_codec_from_name("q8_0");
    ck_assert_int_ge(q8, 0);
    kern_recipe_fill(&rec, (enum kern_codec)q8, (enum kern_codec)q8, 0);
    int64_t cap = kern_encoded_size(&kl, &rec);
    ck_assert_int_gt(cap, 0);
    uint8_t *enc = malloc((size_t)cap);
    ck_assert_ptr_nonnull(enc);
    *n = kern_encode_cpu(&kl, &rec, src, enc, (size_t)cap, NULL);
    ck_assert_int_gt(*n, 0);
    return enc;
}

/* Issue 18: a quantized host hit copied with kvc_lease_copy_async() lands decoded (the raw
 * block, within the codec's error), never as its encoded bytes. The hit is made quantized
 * in the lease itself: the daemon quantizes only under pressure, and the copy path is what
 * is under test. */
START_TEST(test_copy_async_decodes_quantized)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS];
    ck_assert_int_eq(ge_open(&c, &ns, keys), 0);
    fake_dev_reset(1);
    kvci_gpu_ops_set(&fake_dev_ops);
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    size_t bb = kvc_ns_block_bytes(ns);
    uint16_t *src = malloc(bb), *dst = malloc(bb);
    ck_assert(src && dst);
    daemon_smooth_fill(&keys[0], src, bb / 2);
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, keys, 1, (const void *const[]){src}), 1);
    int64_t n;
    uint8_t *enc = ge_encode_q8(src, GE_BT, &n);
    ck_assert_int_eq(kvc_lookup(ns, keys, 1, 0, &l), 1);
    l->hits[0].data = enc;
    l->hits[0].len = (uint64_t)n;
    l->hits[0].format = KVC_WIRE_FORMAT_Q8_0;
    memset(dst, 0, bb);
    ck_assert_int_eq(kvc_lease_copy_async(l, 0, dst, bb, NULL), 0);
    ck_assert(memcmp(dst, enc, (size_t)n) != 0);
    ck_assert(daemon_smooth_err(&keys[0], dst, bb / 2) < 0.02);
    ck_assert_uint_eq(fake_dev.queued, 0); /* the staging block is gone: nothing reads it */
    ck_assert_int_eq(kvc_release(l), 0);
    ck_assert_int_eq(fake_dev_last_error(), 0);
    free(enc);
    free(src);
    free(dst);
    kvc_disconnect(c);
    kvci_gpu_ops_set(NULL);
}
END_TEST

/* A quantized host hit into device memory crosses in its stored size to a pooled device
 * scratch and is decoded there (kvc_lease_copy_async and kvc_lease_copy_cuda alike), queued
 * and tracked on the lease: after the first hit no allocation, free or wait; the decoded
 * bytes are right once the lease is released; a block whose header does not match the
 * namespace is refused before anything is queued. */
START_TEST(test_quantized_hits_decode_on_device)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS];
    ck_assert_int_eq(ge_open(&c, &ns, keys), 0);
    fake_dev_reset(1);
    kvci_gpu_ops_set(&fake_dev_ops);
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    void *stream = fake_dev_stream(0);
    size_t bb = kvc_ns_block_bytes(ns);
    uint16_t *src = malloc(bb), *host = malloc(bb);
    uint8_t *dev = NULL;
    ck_assert(src && host);
    ck_assert_int_eq(fake_dev_ops.mem_alloc((void **)&dev, 2 * bb), 0);
    daemon_smooth_fill(&keys[0], src, bb / 2);
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, keys, 1, (const void *const[]){src}), 1);
    int64_t n;
    uint8_t *enc = ge_encode_q8(src, GE_BT, &n);
    uint64_t allocs = 0, frees = 0, syncs = 0, legacy = 0;
    for (int round = 0; round < 6; round++) {
        if (round == 1) {
            allocs = fake_dev.allocs;
            frees = fake_dev.frees;
            syncs = fake_dev.device_syncs;
            legacy = fake_dev.legacy_syncs;
        }
        ck_assert_int_eq(kvc_lookup(ns, keys, 1, 0, &l), 1);
        l->hits[0].data = enc; /* as if the daemon had quantized it */
        l->hits[0].len = (uint64_t)n;
        l->hits[0].format = KVC_WIRE_FORMAT_Q8_0;
        memset(dev, 0, 2 * bb);
        ck_assert_int_eq(kvc_lease_copy_async(l, 0, dev, bb, stream), 0);
        ck_assert_int_eq(kvc_lease_copy_cuda(l, 0, dev + bb, bb, stream), 0);
        ck_assert_uint_gt(fake_dev.queued, 0); /* queued, not waited for */
        ck_assert_int_eq(kvc_release(l), 0);
        ck_assert_uint_eq(fake_dev.queued, 0);
        ck_assert(daemon_smooth_err(&keys[0], (const uint16_t *)dev, bb / 2) < 0.02);
        ck_assert(daemon_smooth_err(&keys[0], (const uint16_t *)(dev + bb), bb / 2) < 0.02);
    }
    ck_assert_uint_eq(fake_dev.allocs - allocs, 0);
    ck_assert_uint_eq(fake_dev.frees - frees, 0);
    ck_assert_uint_eq(fake_dev.device_syncs - syncs, 0);
    ck_assert_uint_eq(fake_dev.legacy_syncs - legacy, 0);
    ck_assert_uint_gt(fake_dev.decodes, 0);
    /* a block of another layout: refused, nothing queued */
    ck_assert_int_eq(kvc_lookup(ns, keys, 1, 0, &l), 1);
    int64_t n2;
    uint8_t *enc2 = ge_encode_q8(src, GE_BT / 2, &n2); /* fewer tokens: another layout */
    l->hits[0].data = enc2;
    l->hits[0].len = (uint64_t)n2;
    l->hits[0].format = KVC_WIRE_FORMAT_Q8_0;
    uint64_t queued = fake_dev.copies + fake_dev.decodes;
    ck_assert_int_eq(kvc_lease_copy_async(l, 0, dev, bb, stream), -EBADMSG);
    ck_assert_int_eq(kvc_lease_copy_cuda(l, 0, dev, bb, stream), -EBADMSG);
    ck_assert_uint_eq(fake_dev.copies + fake_dev.decodes, queued);
    ck_assert_int_eq(kvc_release(l), 0);
    ck_assert_int_eq(fake_dev_last_error(), 0);
    free(enc2);
    free(enc);
    free(src);
    free(host);
    fake_dev_ops.mem_free(dev);
    fake_dev_stream_free(stream);
    kvc_disconnect(c);
    ck_assert_uint_eq(fake_dev.allocs, fake_dev.frees);
    kvci_gpu_ops_set(NULL);
}
END_TEST

/* ---- issue 18, item 7: what a hit costs an engine, on the fake device -------------------- */

/* An engine's tensors in fake device memory, copied from a host engine (same pages and
 * table); the fake's device memory is host memory, so the test reads it back directly. */
struct ge_fake_engine {
    void *k[GE_LAYERS], *v[GE_LAYERS];
    uint64_t bytes;
    struct kvc_paged_kv kv;
};

static void ge_fake_from_host(struct ge_fake_engine *fe, const struct ge_engine *e)
{
    for (uint32_t l = 0; l < GE_LAYERS; l++) {
        ck_assert_int_eq(fake_dev_ops.mem_alloc(&fe->k[l], e->bytes), 0);
        ck_assert_int_eq(fake_dev_ops.mem_alloc(&fe->v[l], e->bytes), 0);
        memcpy(fe->k[l], e->k[l], e->bytes);
        memcpy(fe->v[l], e->v[l], e->bytes);
    }
    fe->bytes = e->bytes;
    fe->kv = e->kv;
    fe->kv.k = fe->k;
    fe->kv.v = fe->v;
    fe->kv.on_device = 1;
}

/* 0 if the first ntok tokens of fe hold the expected values (laid out as e). */
static int ge_fake_check(const struct ge_fake_engine *fe, struct ge_engine *e, uint32_t ntok)
{
    for (uint32_t l = 0; l < GE_LAYERS; l++) {
        memcpy(e->k[l], fe->k[l], fe->bytes);
        memcpy(e->v[l], fe->v[l], fe->bytes);
    }
    return ge_engine_check(e, ntok);
}

static void ge_fake_clear(struct ge_fake_engine *fe)
{
    for (uint32_t l = 0; l < GE_LAYERS; l++) {
        memset(fe->k[l], 0, fe->bytes);
        memset(fe->v[l], 0, fe->bytes);
    }
}

static void ge_fake_free(struct ge_fake_engine *fe)
{
    for (uint32_t l = 0; l < GE_LAYERS; l++) {
        fake_dev_ops.mem_free(fe->k[l]);
        fake_dev_ops.mem_free(fe->v[l]);
    }
}

/* Keys of a prefix of its own (tokens from base on). */
static void ge_keys(kvc_ns *ns, uint32_t base, struct kvc_key *keys)
{
    uint32_t tokens[GE_TOKENS];
    for (uint32_t i = 0; i < GE_TOKENS; i++)
        tokens[i] = base + i;
    ck_assert_int_eq(kvc_keys_from_tokens(ns, NULL, tokens, GE_TOKENS, NULL, 0, keys, GE_BLOCKS),
                     GE_BLOCKS);
}

/* A client of the host-only daemon on the fake device (host copies: 0), with its stream. */
static void ge_fake_client(kvc_client **c, kvc_ns **ns, struct kvc_key *keys, void **stream)
{
    ck_assert_int_eq(ge_open(c, ns, keys), 0);
    fake_dev_reset(1);
    kvci_gpu_ops_set(&fake_dev_ops);
    ck_assert_int_eq(kvc_gpu_attach(*c), 0);
    *stream = fake_dev_stream(0);
    ck_assert_ptr_nonnull(*stream);
}

/* Issue 18 item 7: hits in a row cost the device nothing after the first. A put gathered
 * from device tensors, a load scattered into device tensors and per-hit copies
 * (kvc_lease_copy_cuda, kvc_lease_copy_async), round after round: after the first round no
 * device allocation, no free (cudaFree waits for the whole device), no device-wide and no
 * legacy-stream synchronisation; every round's bytes are right; what libkvc keeps is given
 * back at disconnect. */
START_TEST(test_hits_in_a_row_allocate_nothing)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS];
    struct ge_engine src, dst;
    struct ge_fake_engine fsrc, fdst;
    void *stream;
    uint8_t *blocks = NULL;
    uint64_t allocs = 0, frees = 0, syncs = 0, legacy = 0;
    ge_fake_client(&c, &ns, keys, &stream);
    size_t bb = kvc_ns_block_bytes(ns);
    ge_engine_init(&src, 16, 1, 1);
    ge_engine_init(&dst, GE_TOKENS, 0, 0);
    ge_fake_from_host(&fsrc, &src);
    ge_fake_from_host(&fdst, &dst);
    ck_assert_int_eq(fake_dev_ops.mem_alloc((void **)&blocks, bb * GE_BLOCKS), 0);
    for (uint32_t round = 0; round < 8; round++) {
        if (round == 1) {
            allocs = fake_dev.allocs;
            frees = fake_dev.frees;
            syncs = fake_dev.device_syncs;
            legacy = fake_dev.legacy_syncs;
        }
        ge_keys(ns, 50000 + round * 1000, keys);
        ck_assert_int_eq(kvc_reserve(ns, NULL, keys, GE_BLOCKS, &r), GE_BLOCKS);
        ck_assert_int_eq(kvc_resv_gather(r, 0, GE_BLOCKS, &fsrc.kv, 0, stream, NULL), GE_BLOCKS);
        ck_assert_int_eq(kvc_commit(r, SIZE_MAX), GE_BLOCKS);
        ck_assert_int_eq(kvc_lookup(ns, keys, GE_BLOCKS, 0, &l), GE_BLOCKS);
        ge_fake_clear(&fdst);
        memset(blocks, 0, bb * GE_BLOCKS);
        ck_assert_int_eq(kvc_lease_scatter(l, 0, GE_BLOCKS, &fdst.kv, 0, stream, NULL), GE_BLOCKS);
        for (size_t i = 0; i < GE_BLOCKS; i++)
            ck_assert_int_eq(i % 2 ? kvc_lease_copy_async(l, i, blocks + i * bb, bb, stream)
                                   : kvc_lease_copy_cuda(l, i, blocks + i * bb, bb, stream),
                             0);
        ck_assert_int_eq(kvc_release(l), 0);
        ck_assert_int_eq(ge_fake_check(&fdst, &dst, GE_TOKENS), 0);
        ck_assert_int_eq(kvc_lookup(ns, keys, GE_BLOCKS, 0, &l), GE_BLOCKS);
        for (size_t i = 0; i < GE_BLOCKS; i++)
            ck_assert(memcmp(blocks + i * bb, kvc_lease_data(l, i), bb) == 0);
        ck_assert_int_eq(kvc_release(l), 0);
    }
    ck_assert_uint_eq(fake_dev.allocs - allocs, 0);
    ck_assert_uint_eq(fake_dev.frees - frees, 0);
    ck_assert_uint_eq(fake_dev.device_syncs - syncs, 0);
    ck_assert_uint_eq(fake_dev.legacy_syncs - legacy, 0);
    ck_assert_uint_eq(fake_dev.bad_kinds + fake_dev.bad_packs, 0);
    ck_assert_int_eq(fake_dev_last_error(), 0);
    fake_dev_ops.mem_free(blocks);
    ge_fake_free(&fsrc);
    ge_fake_free(&fdst);
    ge_engine_fini(&src);
    ge_engine_fini(&dst);
    fake_dev_stream_free(stream);
    kvc_disconnect(c);
    ck_assert_uint_eq(fake_dev.allocs, fake_dev.frees); /* the kept scratch too */
    ck_assert_int_eq(fake_dev.events_live, 0);
    kvci_gpu_ops_set(NULL);
}
END_TEST

/* Issue 18 item 7: a batch is in flight together. Per-hit copies on two streams and two
 * scatters of one lease are all queued when the calls return (none waits for another, and
 * nothing has landed yet), and everything has landed when kvc_release() returns. */
START_TEST(test_batch_in_flight_until_release)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS];
    struct ge_engine src, dst;
    struct ge_fake_engine fsrc, fdst;
    void *stream, *other;
    uint8_t *blocks = NULL;
    ge_fake_client(&c, &ns, keys, &stream);
    other = fake_dev_stream(0);
    ck_assert_ptr_nonnull(other);
    size_t bb = kvc_ns_block_bytes(ns);
    ge_engine_init(&src, 16, 1, 1);
    ge_engine_init(&dst, GE_TOKENS, 0, 0);
    ge_fake_from_host(&fsrc, &src);
    ge_fake_from_host(&fdst, &dst);
    ck_assert_int_eq(fake_dev_ops.mem_alloc((void **)&blocks, bb * GE_BLOCKS), 0);
    kvc_resv *r;
    ck_assert_int_eq(kvc_reserve(ns, NULL, keys, GE_BLOCKS, &r), GE_BLOCKS);
    ck_assert_int_eq(kvc_resv_gather(r, 0, GE_BLOCKS, &fsrc.kv, 0, stream, NULL), GE_BLOCKS);
    ck_assert_int_eq(kvc_commit(r, SIZE_MAX), GE_BLOCKS);
    ck_assert_int_eq(kvc_lookup(ns, keys, GE_BLOCKS, 0, &l), GE_BLOCKS);
    memset(blocks, 0, bb * GE_BLOCKS);
    uint64_t waits = fake_dev.waits;
    ck_assert_uint_eq(fake_dev.queued, 0);
    for (size_t i = 0; i < GE_BLOCKS; i++)
        ck_assert_int_eq(kvc_lease_copy_async(l, i, blocks + i * bb, bb, i % 2 ? other : stream),
                         0);
    ck_assert_uint_eq(fake_dev.queued, GE_BLOCKS);
    ck_assert_int_eq(kvc_lease_scatter(l, 0, GE_BLOCKS / 2, &fdst.kv, 0, stream, NULL),
                     GE_BLOCKS / 2);
    ck_assert_int_eq(kvc_lease_scatter(l, GE_BLOCKS / 2, GE_BLOCKS / 2, &fdst.kv,
                                       (uint64_t)GE_BT * (GE_BLOCKS / 2), stream, NULL),
                     GE_BLOCKS / 2);
    ck_assert_uint_eq(fake_dev.packs, 1 + 2); /* the put's, then both scatters' */
    ck_assert_uint_gt(fake_dev.queued, GE_BLOCKS + 2);
    ck_assert_uint_eq(fake_dev.waits, waits); /* no call waited */
    for (size_t i = 0; i < GE_BLOCKS; i++)
        ck_assert(memcmp(blocks + i * bb, kvc_lease_data(l, i), bb) != 0); /* not yet */
    ck_assert_int_ne(ge_fake_check(&fdst, &dst, GE_BT), 0);
    /* Copy what the lease holds before it goes: the comparison after the release. */
    uint8_t *want = malloc(bb * GE_BLOCKS);
    ck_assert_ptr_nonnull(want);
    for (size_t i = 0; i < GE_BLOCKS; i++)
        memcpy(want + i * bb, kvc_lease_data(l, i), bb);
    ck_assert_int_eq(kvc_release(l), 0);
    ck_assert_uint_eq(fake_dev.queued, 0);
    ck_assert(memcmp(blocks, want, bb * GE_BLOCKS) == 0);
    ck_assert_int_eq(ge_fake_check(&fdst, &dst, GE_TOKENS), 0);
    ck_assert_int_eq(fake_dev_last_error(), 0);
    free(want);
    fake_dev_ops.mem_free(blocks);
    ge_fake_free(&fsrc);
    ge_fake_free(&fdst);
    ge_engine_fini(&src);
    ge_engine_fini(&dst);
    fake_dev_stream_free(other);
    fake_dev_stream_free(stream);
    kvc_disconnect(c);
    kvci_gpu_ops_set(NULL);
}
END_TEST

/* Issue 18 item 7: with nothing waited for between calls, a fault in the first copy of a
 * batch is not lost: every later call returns 0, kvc_release() returns the fault, and a
 * reservation whose first write faulted before a gather of the rest is refused by
 * kvc_commit() (nothing published); the same put without the fault is published. */
START_TEST(test_batch_fault_surfaces_at_release_and_commit)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    kvc_resv *r;
    struct kvc_key keys[GE_BLOCKS];
    struct ge_engine src;
    struct ge_fake_engine fsrc;
    void *stream;
    uint8_t *blocks = NULL;
    ge_fake_client(&c, &ns, keys, &stream);
    size_t bb = kvc_ns_block_bytes(ns);
    ge_engine_init(&src, 16, 1, 1);
    ge_fake_from_host(&fsrc, &src);
    ck_assert_int_eq(fake_dev_ops.mem_alloc((void **)&blocks, bb * GE_BLOCKS), 0);
    ck_assert_int_eq(kvc_reserve(ns, NULL, keys, GE_BLOCKS, &r), GE_BLOCKS);
    ck_assert_int_eq(kvc_resv_gather(r, 0, GE_BLOCKS, &fsrc.kv, 0, stream, NULL), GE_BLOCKS);
    ck_assert_int_eq(kvc_commit(r, SIZE_MAX), GE_BLOCKS);
    /* a lease: the fault hits the copies queued so far at the first wait */
    ck_assert_int_eq(kvc_lookup(ns, keys, GE_BLOCKS, 0, &l), GE_BLOCKS);
    ck_assert_int_eq(kvc_lease_copy_async(l, 0, blocks, bb, stream), 0);
    fake_dev.fail_wait = EIO;
    for (size_t i = 1; i < GE_BLOCKS; i++)
        ck_assert_int_eq(kvc_lease_copy_cuda(l, i, blocks + i * bb, bb, stream), 0);
    ck_assert_int_eq(kvc_release(l), -EIO);
    /* a reservation: a faulted write, then a gather of the other slots */
    uint8_t *one = malloc(bb);
    ck_assert_ptr_nonnull(one);
    memcpy(one, src.k[0], bb); /* any bytes */
    ge_keys(ns, 90000, keys);
    ck_assert_int_eq(kvc_reserve(ns, NULL, keys, GE_BLOCKS, &r), GE_BLOCKS);
    ck_assert_int_eq(kvc_resv_write_async(r, 0, one, bb, stream), 0);
    fake_dev.fail_wait = EIO;
    ck_assert_int_eq(kvc_resv_gather(r, 1, GE_BLOCKS - 1, &fsrc.kv, GE_BT, stream, NULL),
                     GE_BLOCKS - 1);
    ck_assert_int_eq(kvc_commit(r, SIZE_MAX), -EIO);
    ck_assert_int_eq(kvc_lookup(ns, keys, GE_BLOCKS, 0, &l), 0);
    kvc_release(l);
    /* the same put without the fault */
    ck_assert_int_eq(kvc_reserve(ns, NULL, keys, GE_BLOCKS, &r), GE_BLOCKS);
    ck_assert_int_eq(kvc_resv_write_async(r, 0, one, bb, stream), 0);
    ck_assert_int_eq(kvc_resv_gather(r, 1, GE_BLOCKS - 1, &fsrc.kv, GE_BT, stream, NULL),
                     GE_BLOCKS - 1);
    ck_assert_int_eq(kvc_commit(r, SIZE_MAX), GE_BLOCKS);
    ck_assert_int_eq(kvc_lookup(ns, keys, GE_BLOCKS, 0, &l), GE_BLOCKS);
    ck_assert(memcmp(kvc_lease_data(l, 0), one, bb) == 0);
    ck_assert_int_eq(kvc_release(l), 0);
    ck_assert_int_eq(fake_dev_last_error(), 0);
    free(one);
    fake_dev_ops.mem_free(blocks);
    ge_fake_free(&fsrc);
    ge_engine_fini(&src);
    fake_dev_stream_free(stream);
    kvc_disconnect(c);
    ck_assert_int_eq(fake_dev.events_live, 0);
    kvci_gpu_ops_set(NULL);
}
END_TEST

/* ---- a pool over the fake device: the server in this process, clients forked ------------ */

/* The store and server run here with a pool on fake device 0 (a memfd); each client is a
 * forked child that resets the fake first (a fresh process for the driver) and imports the
 * pool from the descriptor the server passes, as a real engine process would. */
struct gf_server {
    struct daemon d;
    struct config *cfg;
    struct loop *l;
    struct store *s;
    struct acl *acl;
    struct server *sv;
    pid_t child;
    int status;
};

static struct gf_server gf;

/* What kvcd's main does with the pool's descriptor: its copies completed on the loop. */
static void gf_on_gpu(struct loop *l, int fd, uint32_t events, void *arg)
{
    struct gf_server *x = arg;
    (void)fd;
    (void)events;
    engine_gpu_poll(x->s, loop_now_ms(l));
}

static void gf_tick(void *arg)
{
    struct gf_server *x = arg;
    int st;
    server_tick(x->sv);
    if (x->child > 0 && waitpid(x->child, &st, WNOHANG) == x->child) {
        x->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        x->child = 0;
    }
    if (x->child == 0 && server_clients(x->sv) == 0)
        loop_stop(x->l);
}

static void gf_setup(void)
{
    struct store_params sp = {.host_size = 16 << 20,
                              .host_page_size = 64 << 10,
                              .high_watermark = 0.95,
                              .low_watermark = 0.9,
                              .max_namespaces = 8,
                              .max_handles = 64,
                              .policy = POLICY_LRU,
                              .gpu_size = 4 << 20,
                              .gpu_device = 0,
                              .gpu_page_size = 64 << 10,
                              .gpu_ops = &fake_dev_ops};
    int rc = 0;
    memset(&gf, 0, sizeof(gf));
    log_setup(LOG_LEVEL_WARNING, 1000);
    ck_assert_int_eq(daemon_dir_init(&gf.d), 0);
    fake_dev_reset(2);
    gf.cfg = config_new();
    gf.s = store_new(&sp, &rc);
    ck_assert_msg(gf.s && gf.s->gpu, "store_new: %d", rc);
    engine_attach(gf.s);
    gf.acl = acl_new(gf.s, gf.cfg, &rc);
    ck_assert_ptr_nonnull(gf.acl);
    gf.l = loop_new(&rc);
    ck_assert_ptr_nonnull(gf.l);
    ck_assert_int_eq(loop_add(gf.l, engine_gpu_fd(gf.s), EPOLLIN, gf_on_gpu, &gf), 0);
    struct server_params vp;
    daemon_server_params(&vp, gf.d.sock, 0600, 16, gf.cfg, gf.acl);
    gf.sv = server_new(gf.l, gf.s, &vp, &rc);
    ck_assert_msg(gf.sv, "server_new: %d", rc);
}

static void gf_teardown(void)
{
    kvci_gpu_ops_set(NULL);
    ck_assert_uint_eq(gf.s->pins_now, 0);
    ck_assert_uint_eq(gf.s->reserved_now, 0);
    server_free(gf.sv);
    acl_free(gf.acl);
    engine_stop(gf.s);
    store_free(gf.s);
    loop_free(gf.l);
    config_free(gf.cfg);
    ck_assert_int_eq(fake_dev.pools_live, 0);
    ck_assert_int_eq(fake_dev.registered, 0);
    ck_assert_uint_eq(fake_dev.queued, 0);
    ck_assert_uint_eq(fake_dev.fork_refused, 0);
    daemon_cleanup(&gf.d);
}

/* Runs fn in a forked client while this process serves it; its exit status. */
static int gf_run(int (*fn)(void *), void *arg)
{
    gf.child = daemon_child_spawn(fn, arg);
    ck_assert_int_gt(gf.child, 0);
    gf.status = -1;
    loop_run(gf.l, 20, gf_tick, &gf);
    return gf.status;
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

/* Child: puts every window block (each a root) and the states at blocks 1 and 3 into the
 * pool; a pool-mapped lookup answers the window of the whole prefix and the state of prefix
 * 4 as pool locations, with and without READY_ONLY, every byte the put's. */
static int gf_kinds_pool_put(void *arg)
{
    kvc_client *c;
    kvc_ns *w, *st;
    kvc_resv *r;
    kvc_lease *l;
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
        unsigned flags = KVC_LOOKUP_GPU | (f ? KVC_LOOKUP_READY_ONLY : 0);
        if (kvc_lookup(w, kw, GE_BLOCKS, flags, &l) != 3 || kvc_lease_first(l) != GE_BLOCKS - 3)
            return 95;
        for (size_t i = 0; i < 3; i++)
            if (kvc_lease_tier(l, i) != KVC_TIER_GPU ||
                daemon_block_check(&kw[GE_BLOCKS - 3 + i], kvc_lease_data(l, i), bb) != -1)
                return 96;
        kvc_release(l);
        if (kvc_lookup(st, ks, GE_BLOCKS, flags, &l) != 1 || kvc_lease_first(l) != 3 ||
            kvc_lease_tier(l, 0) != KVC_TIER_GPU ||
            daemon_block_check(&ks[3], kvc_lease_data(l, 0), sb) != -1)
            return 97;
        kvc_release(l);
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
    size_t bb = kvc_ns_block_bytes(w), sb = kvc_ns_block_bytes(st);
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
    if (kvc_lookup(w, kw, GE_BLOCKS, 0, &l) != 3 || kvc_lease_first(l) != GE_BLOCKS - 3)
        return 103;
    for (size_t i = 0; i < 3; i++)
        if (kvc_lease_tier(l, i) != KVC_TIER_HOST ||
            daemon_block_check(&kw[GE_BLOCKS - 3 + i], kvc_lease_data(l, i), bb) != -1)
            return 104;
    kvc_release(l);
    if (kvc_lookup(st, ks, GE_BLOCKS, 0, &l) != 1 || kvc_lease_first(l) != 3 ||
        kvc_lease_tier(l, 0) != KVC_TIER_HOST ||
        daemon_block_check(&ks[3], kvc_lease_data(l, 0), sb) != -1)
        return 105;
    kvc_release(l);
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
    ck_assert_uint_gt(store_gpu_used(gf.s), 0);
}
END_TEST

/* Child: puts the prefix into the pool (a pool-mapped client, device 0). */
static int gf_put_pool(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    struct kvc_key keys[GE_BLOCKS];
    (void)arg;
    if (gf_client(0, &c, &ns, keys) || kvc_gpu_attach(c) != 1)
        return 60;
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *src = malloc(bb);
    if (!src || kvc_reserve_gpu(ns, NULL, keys, GE_BLOCKS, &r) != GE_BLOCKS)
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
    server_tick(x->sv);
    engine_gpu_stats(x->s, gf_moves_stat, &inflight);
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
    if (gm.loader == 0 && gm.other == 0 && server_clients(x->sv) == 0)
        loop_stop(x->l);
}

/* The daemon's copies out of the pool are queued and completed by its loop: while the
 * device is kept busy with them, another client's put and lookup are answered, the loader's
 * lookup waits (not ready), and once the copies land it gets every byte. The loop thread
 * waits for no copy. */
START_TEST(test_pool_moves_off_the_loop)
{
    ck_assert_int_eq(gf_run(gf_put_pool, NULL), 0);
    ck_assert_uint_eq(store_gpu_used(gf.s), GE_BLOCKS * store_ns_get(gf.s, 1)->block_bytes);
    uint64_t waits = fake_dev.waits;
    memset(&gm, 0, sizeof(gm));
    gm.loader_status = gm.other_status = -1;
    fake_dev.hold = 1;
    gm.loader = daemon_child_spawn(gf_load_host, NULL);
    ck_assert_int_gt(gm.loader, 0);
    loop_run(gf.l, 20, gf_moves_tick, &gf);
    fake_dev.hold = 0;
    ck_assert_int_eq(gm.other_status, 0);
    ck_assert_msg(gm.other_done_while_held, "the other client was not served during the moves");
    ck_assert_int_eq(gm.loader_status, 0);
    ck_assert_uint_eq(gf.s->total.gpu_demoted_blocks, GE_BLOCKS);
    ck_assert_uint_eq(store_gpu_used(gf.s), 0);
    ck_assert_uint_eq(fake_dev.waits, waits); /* the loop never waited for a copy */
    ck_assert_int_eq(fake_dev_last_error(), 0);
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
 * recorded (fake_dev.ops + fake_dev.records), counted for 1, 4 and 64 blocks. */

#define GB_MAX_LAYERS 4
#define GB_BLOCKS 64
#define GB_TOKENS (GE_BT * GB_BLOCKS)
#define GB_PAGE 16
#define GB_PAGES (GB_TOKENS / GB_PAGE)

struct gb_engine {
    uint32_t layers;
    int dev; /* tensors in fake device memory */
    void *k[GB_MAX_LAYERS], *v[GB_MAX_LAYERS];
    int32_t table[GB_PAGES];
    uint64_t bytes;
    struct kvc_paged_kv kv;
};

static uint8_t gb_byte(uint32_t l, uint32_t k, uint64_t off, unsigned salt)
{
    return (uint8_t)((off * 2654435761u >> 7) ^ (l * 29u + k * 101u + salt * 7u));
}

static void gb_engine_init(struct gb_engine *e, uint32_t layers, int dev, int fill, unsigned salt)
{
    memset(e, 0, sizeof(*e));
    e->layers = layers;
    e->dev = dev;
    e->bytes = (uint64_t)GB_TOKENS * GE_HEADS * GE_ROW;
    for (uint32_t i = 0; i < GB_PAGES; i++)
        e->table[i] = (int32_t)((i * 37 + 11) % GB_PAGES);
    for (uint32_t l = 0; l < layers; l++) {
        if (dev) {
            ck_assert_int_eq(fake_dev_ops.mem_alloc(&e->k[l], e->bytes), 0);
            ck_assert_int_eq(fake_dev_ops.mem_alloc(&e->v[l], e->bytes), 0);
        } else {
            e->k[l] = malloc(e->bytes);
            e->v[l] = malloc(e->bytes);
            ck_assert(e->k[l] && e->v[l]);
        }
        for (uint64_t x = 0; x < e->bytes; x++) {
            ((uint8_t *)e->k[l])[x] = fill ? gb_byte(l, 0, x, salt) : 0x5a;
            ((uint8_t *)e->v[l])[x] = fill ? gb_byte(l, 1, x, salt) : 0x5a;
        }
    }
    e->kv = (struct kvc_paged_kv){.k = e->k,
                                  .v = e->v,
                                  .block_table = e->table,
                                  .table_len = GB_PAGES,
                                  .page_tokens = GB_PAGE,
                                  .page_stride = (uint64_t)GB_PAGE * GE_HEADS * GE_ROW,
                                  .token_stride = GE_HEADS * GE_ROW,
                                  .head_stride = GE_ROW,
                                  .on_device = dev};
}

static void gb_engine_fini(struct gb_engine *e)
{
    for (uint32_t l = 0; l < e->layers; l++) {
        if (e->dev) {
            fake_dev_ops.mem_free(e->k[l]);
            fake_dev_ops.mem_free(e->v[l]);
        } else {
            free(e->k[l]);
            free(e->v[l]);
        }
    }
}

static struct kern_pack_layout gb_pack_layout(uint32_t layers)
{
    return (struct kern_pack_layout){layers, 2, GE_BT, GE_HEADS, GE_DIM, 2};
}

static struct kern_pack_engine gb_pack_engine(const struct gb_engine *e)
{
    return (struct kern_pack_engine){e->k,
                                     e->v,
                                     e->table,
                                     GB_PAGES,
                                     GB_PAGE,
                                     e->kv.page_stride,
                                     e->kv.token_stride,
                                     e->kv.head_stride};
}

/* The canonical blocks of e's first n blocks (the reference gather), malloc'd. */
static uint8_t *gb_blocks(const struct gb_engine *e, uint32_t n, size_t bb)
{
    struct kern_pack_layout lay = gb_pack_layout(e->layers);
    struct kern_pack_engine pe = gb_pack_engine(e);
    uint8_t *b = malloc(n * bb);
    void *ptrs[GB_BLOCKS];
    ck_assert_ptr_nonnull(b);
    for (uint32_t j = 0; j < n; j++)
        ptrs[j] = b + j * bb;
    ck_assert_int_eq(kern_pack_ref(&lay, &pe, 0, n, ptrs, KERN_PACK_GATHER), 0);
    return b;
}

static struct kvc_layout gb_layout(uint32_t layers)
{
    static char names[GB_MAX_LAYERS + 1][32];
    snprintf(names[layers], sizeof(names[layers]), "e2e-gpu-batch-%u", layers);
    struct kvc_layout lay = ge_layout();
    lay.model_id = names[layers];
    lay.layers = layers;
    return lay;
}

static void gb_keys(kvc_ns *ns, uint32_t base, uint32_t n, struct kvc_key *keys)
{
    static uint32_t tokens[GB_TOKENS];
    for (uint32_t i = 0; i < n * GE_BT; i++)
        tokens[i] = base + i;
    ck_assert_int_eq(kvc_keys_from_tokens(ns, NULL, tokens, n * GE_BT, NULL, 0, keys, n), (int)n);
}

static uint64_t gb_ops(void)
{
    return fake_dev.ops + fake_dev.records;
}

/* Layers [lf, lf+lc) of dst hold src's tokens [0, ntok) and everything else of dst is still
 * 0x5a: 0, else -1. */
static int gb_engine_check(const struct gb_engine *dst, const struct gb_engine *src, uint32_t ntok,
                           uint32_t lf, uint32_t lc)
{
    const uint64_t tb = GE_HEADS * GE_ROW;
    for (uint32_t l = 0; l < dst->layers; l++)
        for (uint32_t k = 0; k < 2; k++) {
            const uint8_t *d = k ? dst->v[l] : dst->k[l], *s = k ? src->v[l] : src->k[l];
            int in = l >= lf && l < lf + lc;
            for (uint32_t t = 0; t < GB_TOKENS; t++) {
                uint64_t at = ((uint64_t)dst->table[t / GB_PAGE] * GB_PAGE + t % GB_PAGE) * tb;
                int want = in && t < ntok;
                for (uint64_t x = 0; x < tb; x++)
                    if (want ? d[at + x] != s[at + x] : d[at + x] != 0x5a)
                        return -1;
            }
        }
    return 0;
}

static void gb_engine_clear(struct gb_engine *e)
{
    for (uint32_t l = 0; l < e->layers; l++) {
        memset(e->k[l], 0x5a, e->bytes);
        memset(e->v[l], 0x5a, e->bytes);
    }
}

/* Issue 25: host-tier hits and slots (a daemon without a pool, the fake device) move in as
 * many device operations for 64 blocks as for one. Per call, whatever the count:
 *   kvc_resv_gather (a put into host slots): gather kernel, one device-to-host batch, record;
 *   kvc_lease_copy_range_async: one host-to-device batch, record;
 *   kvc_lease_scatter and kvc_lease_scatter_layers: one host-to-device batch (the layers
 *   moved, staged), scatter kernel, record.
 * (Before: a copy and an event record per hit for the copies, a copy per host block per
 * scatter and gather, the tables copied per call, and a kernel per 64 slots of a gather.)
 * Every byte checked. */
START_TEST(test_host_hits_bounded_ops)
{
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
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    void *stream = fake_dev_stream(0);
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *buf = NULL;
    ck_assert_int_eq(fake_dev_ops.mem_alloc((void **)&buf, GB_BLOCKS * bb), 0);
    gb_engine_init(&src, 2, 1, 1, 1);
    gb_engine_init(&dst, 2, 1, 0, 0);
    uint8_t *want = gb_blocks(&src, GB_BLOCKS, bb);
    for (int i = 0; i < 3; i++) {
        uint32_t n = counts[i];
        uint64_t o;
        gb_keys(ns, 300000 + 10000 * n, n, keys);
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
    printf("e2e_gpu: host hits, device operations per call (1/4/64 blocks): gather %llu/%llu/%llu, "
           "copy range %llu/%llu/%llu, scatter %llu/%llu/%llu, scatter of a layer "
           "%llu/%llu/%llu\n",
           (unsigned long long)ops[0][0], (unsigned long long)ops[1][0],
           (unsigned long long)ops[2][0], (unsigned long long)ops[0][1],
           (unsigned long long)ops[1][1], (unsigned long long)ops[2][1],
           (unsigned long long)ops[0][2], (unsigned long long)ops[1][2],
           (unsigned long long)ops[2][2], (unsigned long long)ops[0][3],
           (unsigned long long)ops[1][3], (unsigned long long)ops[2][3]);
    for (int k = 0; k < 4; k++) {
        ck_assert_uint_eq(ops[0][k], ops[1][k]);
        ck_assert_uint_eq(ops[0][k], ops[2][k]);
    }
    ck_assert_uint_eq(ops[0][0], 3); /* gather kernel, device-to-host batch, record */
    ck_assert_uint_eq(ops[0][1], 2); /* host-to-device batch, record */
    ck_assert_uint_eq(ops[0][2], 3); /* host-to-device batch, scatter kernel, record */
    ck_assert_uint_eq(ops[0][3], 3);
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
 * tensors and into host tensors (on_device 0) — and leaves the others as they were; bad
 * ranges are refused before anything moves. */
START_TEST(test_scatter_layers_only_those)
{
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
    gb_engine_init(&src, 4, 0, 1, 3);
    uint8_t *blocks = gb_blocks(&src, n, bb);
    const void *bp[GB_BLOCKS];
    for (uint32_t j = 0; j < n; j++)
        bp[j] = blocks + j * bb;
    gb_keys(ns, 700000, n, keys);
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, keys, n, bp), (int)n);
    for (int dev = 0; dev < 2; dev++) {
        gb_engine_init(&dst, 4, dev, 0, 0);
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
        gb_engine_init(&src, 4, dev, 1, 5 + (unsigned)dev);
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
    (void)arg;
    if (gf_client(0, &c, &ns, keys) || kvc_gpu_attach(c) != 1)
        return 90;
    void *stream = fake_dev_stream(0);
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *buf = NULL;
    if (!stream || fake_dev_ops.mem_alloc((void **)&buf, GB_BLOCKS * bb))
        return 91;
    gb_engine_init(&src, GE_LAYERS, 1, 1, 2);
    gb_engine_init(&dst, GE_LAYERS, 1, 0, 0);
    uint8_t *want = gb_blocks(&src, GB_BLOCKS, bb);
    for (int i = 0; i < 3; i++) {
        uint32_t n = counts[i];
        uint64_t o;
        gb_keys(ns, 500000 + 10000 * n, n, keys);
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
    printf("e2e_gpu: pool hits, device operations per call (1/4/64 blocks): gather %llu/%llu/%llu, "
           "copy range %llu/%llu/%llu, scatter %llu/%llu/%llu, scatter of a layer "
           "%llu/%llu/%llu\n",
           (unsigned long long)ops[0][0], (unsigned long long)ops[1][0],
           (unsigned long long)ops[2][0], (unsigned long long)ops[0][1],
           (unsigned long long)ops[1][1], (unsigned long long)ops[2][1],
           (unsigned long long)ops[0][2], (unsigned long long)ops[1][2],
           (unsigned long long)ops[2][2], (unsigned long long)ops[0][3],
           (unsigned long long)ops[1][3], (unsigned long long)ops[2][3]);
    fflush(stdout);
    for (int k = 0; k < 4; k++)
        if (ops[0][k] != ops[1][k] || ops[0][k] != ops[2][k] || ops[0][k] != 2)
            return 110 + k;
    if (fake_dev.bad_kinds || fake_dev.bad_packs || fake_dev_last_error())
        return 120;
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

/* ---- with a device ---------------------------------------------------------------------- */

/* What the device cases need of the process that forks their clients: the build's own device
 * table (no fake left installed by an earlier case), and no CUDA started in this process
 * (CUDA does not survive fork(): a child would hang or fail). With CK_FORK=no every case runs
 * in this one process, so an earlier case's state is here (issue 25: under compute-sanitizer
 * the device cases' children did not finish). */
static void ge_device_preconditions(void)
{
    ck_assert_msg(kvci_gpu_ops_get() == NULL, "a fake device table is still installed");
    ck_assert_msg(!kvci_gpu_cuda_used(), "CUDA was started in the process that forks clients");
    ck_assert_uint_eq(fake_dev.queued, 0);
}

/* Runs after the fake cases (in the same process when CK_FORK=no): the device cases would
 * find what they need. */
START_TEST(test_device_cases_start_clean)
{
    ge_device_preconditions();
}
END_TEST

/* Regression (issue 25): the fake cases and then the device cases in one process, as
 * compute-sanitizer runs the suite (CK_FORK=no): this binary again, every case tagged
 * "nofork" (the host and fake-pool cases, then test_device_cases_start_clean), in one
 * process; it must pass. Before the fix, test_attach_without_tier started CUDA in the test
 * process and the device cases forked their clients from it. */
START_TEST(test_nofork_fake_then_device_cases)
{
    char exe[512], out[16384], err[16384];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    ck_assert_int_gt(n, 0);
    exe[n] = 0;
    const char *argv[] = {"/usr/bin/env",
                          "-u",
                          "CK_RUN_CASE",
                          "-u",
                          "CK_RUN_SUITE",
                          "-u",
                          "CK_EXCLUDE_TAGS",
                          "CK_FORK=no",
                          "CK_INCLUDE_TAGS=nofork",
                          exe,
                          NULL};
    int rc = daemon_run(argv, out, sizeof(out), err, sizeof(err), daemon_ms(120000));
    const char *sum = strstr(out, "100%: Checks: ");
    ck_assert_msg(rc == 0 && sum, "rc %d\n%s\n%s", rc, out, err);
    /* every case tagged nofork ran: the host, fake-pool and batch cases and the guard */
    ck_assert_msg(atoi(sum + strlen("100%: Checks: ")) >= 15, "%s", out);
}
END_TEST

/* Device copies of a host engine (same pages, same table). */
struct ge_dev_engine {
    void *k[GE_LAYERS], *v[GE_LAYERS];
    struct kvc_paged_kv kv;
};

static int ge_dev_from_host(struct ge_dev_engine *de, const struct ge_engine *e)
{
    for (uint32_t l = 0; l < GE_LAYERS; l++) {
        if (kern_cuda_alloc(&de->k[l], e->bytes) || kern_cuda_alloc(&de->v[l], e->bytes))
            return -1;
        if (kern_cuda_copy(de->k[l], e->k[l], e->bytes, KERN_CUDA_H2D, NULL) ||
            kern_cuda_copy(de->v[l], e->v[l], e->bytes, KERN_CUDA_H2D, NULL))
            return -1;
    }
    de->kv = e->kv;
    de->kv.k = de->k;
    de->kv.v = de->v;
    de->kv.on_device = 1;
    return 0;
}

static int ge_dev_to_host(const struct ge_dev_engine *de, struct ge_engine *e)
{
    for (uint32_t l = 0; l < GE_LAYERS; l++)
        if (kern_cuda_copy(e->k[l], de->k[l], e->bytes, KERN_CUDA_D2H, NULL) ||
            kern_cuda_copy(e->v[l], de->v[l], e->bytes, KERN_CUDA_D2H, NULL))
            return -1;
    return 0;
}

static void ge_dev_free(struct ge_dev_engine *de)
{
    for (uint32_t l = 0; l < GE_LAYERS; l++) {
        kern_cuda_free(de->k[l]);
        kern_cuda_free(de->v[l]);
    }
}

/* Child: puts from device tensors into the pool. */
static int ge_put_device(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    struct kvc_key keys[GE_BLOCKS];
    struct ge_engine e;
    struct ge_dev_engine de;
    (void)arg;
    if (ge_open(&c, &ns, keys))
        return 30;
    if (kvc_gpu_attach(c) != 1)
        return 31;
    ge_engine_init(&e, 16, 1, 1);
    if (ge_dev_from_host(&de, &e))
        return 32;
    if (kvc_reserve_gpu(ns, NULL, keys, GE_BLOCKS, &r) != GE_BLOCKS)
        return 33;
    if (kvc_resv_gather(r, 0, GE_BLOCKS, &de.kv, 0, NULL, NULL) != GE_BLOCKS)
        return 34;
    if (kvc_commit(r, SIZE_MAX) != GE_BLOCKS)
        return 35;
    ge_dev_free(&de);
    ge_engine_fini(&e);
    kvc_disconnect(c);
    return 0;
}

/* Child: loads into its own device tensors (contiguous layout); arg != NULL: without the
 * pool flag (host-tier hits). */
static int ge_load_device(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS];
    struct ge_engine e;
    struct ge_dev_engine de;
    unsigned flags = arg ? 0 : KVC_LOOKUP_GPU;
    if (ge_open(&c, &ns, keys))
        return 40;
    if (kvc_gpu_attach(c) != 1)
        return 41;
    ge_engine_init(&e, GE_TOKENS, 0, 0);
    if (ge_dev_from_host(&de, &e))
        return 42;
    if (kvc_lookup(ns, keys, GE_BLOCKS, flags, &l) != GE_BLOCKS)
        return 43;
    for (size_t i = 0; i < GE_BLOCKS; i++)
        if (kvc_lease_tier(l, i) != (arg ? KVC_TIER_HOST : KVC_TIER_GPU))
            return 44;
    if (kvc_lease_scatter(l, 0, GE_BLOCKS, &de.kv, 0, NULL, NULL) != GE_BLOCKS)
        return 45;
    if (kvc_release(l))
        return 46;
    if (ge_dev_to_host(&de, &e) || ge_engine_check(&e, GE_TOKENS))
        return 47;
    ge_dev_free(&de);
    ge_engine_fini(&e);
    kvc_disconnect(c);
    return 0;
}

/* Child: pins pool blocks and dies without releasing them. */
static int ge_pin_and_die(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS];
    (void)arg;
    if (ge_open(&c, &ns, keys) || kvc_gpu_attach(c) != 1)
        return 50;
    if (kvc_lookup(ns, keys, GE_BLOCKS, KVC_LOOKUP_GPU, &l) != GE_BLOCKS)
        return 51;
    _exit(0);
}

static void ge_gpu_setup(void)
{
    static const char *const args[] = {"-o", "host.size=32m",     "-o", "host.page_size=64k",
                                       "-o", "gpu.pool_size=64m", NULL};
    ge_device_preconditions();
    memset(&ge_d, 0, sizeof(ge_d));
    ck_assert_int_eq(daemon_start(&ge_d, args), 0);
}

/* Child of test_gpu_batched_moves: a pool-mapped client puts GB_BLOCKS blocks from paged
 * device tensors into the pool (one gather kernel), then loads them back: a range copy into one
 * device buffer (one batched device-to-device copy), a paged scatter and a scatter of layer 1
 * (one kernel each), and lossy host hits of every codec decoded by the kernel straight into
 * paged device tensors; every byte compared with the CPU's. */
static int ge_batched_device(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    kvc_lease *l;
    struct kvc_key keys[GB_BLOCKS];
    struct gb_engine hsrc, hdst;
    (void)arg;
    if (ge_open(&c, &ns, keys) || kvc_gpu_attach(c) != 1)
        return 60;
    size_t bb = kvc_ns_block_bytes(ns);
    gb_engine_init(&hsrc, GE_LAYERS, 0, 1, 4);
    gb_engine_init(&hdst, GE_LAYERS, 0, 0, 0);
    uint8_t *want = gb_blocks(&hsrc, GB_BLOCKS, bb), *back = malloc(GB_BLOCKS * bb);
    void *dk[GE_LAYERS], *dv[GE_LAYERS], *ok[GE_LAYERS], *ov[GE_LAYERS], *buf = NULL;
    for (uint32_t i = 0; i < GE_LAYERS; i++)
        if (kern_cuda_alloc(&dk[i], hsrc.bytes) || kern_cuda_alloc(&dv[i], hsrc.bytes) ||
            kern_cuda_alloc(&ok[i], hsrc.bytes) || kern_cuda_alloc(&ov[i], hsrc.bytes) ||
            kern_cuda_copy(dk[i], hsrc.k[i], hsrc.bytes, KERN_CUDA_H2D, NULL) ||
            kern_cuda_copy(dv[i], hsrc.v[i], hsrc.bytes, KERN_CUDA_H2D, NULL))
            return 61;
    if (!back || kern_cuda_alloc(&buf, GB_BLOCKS * bb) || kern_cuda_stream_sync(NULL))
        return 62;
    struct kvc_paged_kv skv = hsrc.kv, dkv = hsrc.kv;
    skv.k = dk;
    skv.v = dv;
    skv.on_device = 1;
    dkv.k = ok;
    dkv.v = ov;
    dkv.on_device = 1;
    gb_keys(ns, 1200000, GB_BLOCKS, keys);
    if (kvc_reserve_gpu(ns, NULL, keys, GB_BLOCKS, &r) != GB_BLOCKS ||
        kvc_resv_gather(r, 0, GB_BLOCKS, &skv, 0, NULL, NULL) != GB_BLOCKS ||
        kvc_commit(r, SIZE_MAX) != GB_BLOCKS)
        return 63;
    if (kvc_lookup(ns, keys, GB_BLOCKS, KVC_LOOKUP_GPU, &l) != GB_BLOCKS ||
        kvc_lease_tier(l, 0) != KVC_TIER_GPU)
        return 64;
    if (kvc_lease_copy_range_async(l, 0, GB_BLOCKS, buf, GB_BLOCKS * bb, NULL) != GB_BLOCKS)
        return 65;
    for (uint32_t i = 0; i < GE_LAYERS; i++) /* 0x5a everywhere first */
        if (kern_cuda_copy(ok[i], hdst.k[i], hsrc.bytes, KERN_CUDA_H2D, NULL) ||
            kern_cuda_copy(ov[i], hdst.v[i], hsrc.bytes, KERN_CUDA_H2D, NULL))
            return 66;
    if (kvc_lease_scatter_layers(l, 0, GB_BLOCKS, &dkv, 0, 1, 1, NULL, NULL) != GB_BLOCKS ||
        kvc_release(l))
        return 67;
    if (kern_cuda_copy(back, buf, GB_BLOCKS * bb, KERN_CUDA_D2H, NULL) ||
        kern_cuda_stream_sync(NULL) || memcmp(back, want, GB_BLOCKS * bb))
        return 68;
    for (uint32_t i = 0; i < GE_LAYERS; i++)
        if (kern_cuda_copy(hdst.k[i], ok[i], hsrc.bytes, KERN_CUDA_D2H, NULL) ||
            kern_cuda_copy(hdst.v[i], ov[i], hsrc.bytes, KERN_CUDA_D2H, NULL))
            return 69;
    if (kern_cuda_stream_sync(NULL) || gb_engine_check(&hdst, &hsrc, GB_TOKENS, 1, 1))
        return 70;
    /* lossy hits of every codec (the lease pointed at blocks encoded here, as the daemon's
     * quantized blocks would be), decoded into the paged device tensors */
    struct kern_layout kl = {GE_LAYERS, GE_HEADS, GE_DIM, GE_BT, KERN_DTYPE_FP16, 0};
    struct kern_pack_layout pl = gb_pack_layout(GE_LAYERS);
    const uint32_t n = 8;
    for (int codec = KERN_CODEC_Q8_0; codec < KERN_CODEC_COUNT; codec++) {
        struct kern_recipe rec;
        kern_recipe_fill(&rec, (enum kern_codec)codec, (enum kern_codec)codec, 1);
        int64_t es = kern_encoded_size(&kl, &rec);
        uint8_t *enc = malloc(n * (size_t)es), *dec = malloc(n * bb);
        struct gb_engine ref;
        if (!enc || !dec)
            return 71;
        gb_engine_init(&ref, GE_LAYERS, 0, 0, 0);
        struct kern_pack_engine re = gb_pack_engine(&ref);
        for (uint32_t j = 0; j < n; j++) {
            void *b = dec + j * bb;
            if (kern_encode_cpu(&kl, &rec, want + j * bb, enc + j * es, (size_t)es, NULL) != es ||
                kern_decode_cpu(&kl, enc + j * es, (size_t)es, b, bb, KERN_DTYPE_FP16) !=
                    (int64_t)bb ||
                kern_pack_ref(&pl, &re, (uint64_t)j * GE_BT, 1, &b, KERN_PACK_SCATTER))
                return 72;
        }
        for (uint32_t i = 0; i < GE_LAYERS; i++)
            if (kern_cuda_copy(ok[i], ref.k[i], hsrc.bytes, KERN_CUDA_H2D, NULL) ||
                kern_cuda_copy(ov[i], ref.v[i], hsrc.bytes, KERN_CUDA_H2D, NULL) ||
                kern_cuda_stream_sync(NULL))
                return 73;
        /* ref was all 0x5a before the pack above: reset the device copy to that */
        struct gb_engine blank;
        gb_engine_init(&blank, GE_LAYERS, 0, 0, 0);
        for (uint32_t i = 0; i < GE_LAYERS; i++)
            if (kern_cuda_copy(ok[i], blank.k[i], hsrc.bytes, KERN_CUDA_H2D, NULL) ||
                kern_cuda_copy(ov[i], blank.v[i], hsrc.bytes, KERN_CUDA_H2D, NULL))
                return 74;
        gb_engine_fini(&blank);
        if (kvc_lookup(ns, keys, n, 0, &l) != (int)n)
            return 75;
        for (uint32_t j = 0; j < n; j++) {
            l->hits[j].data = enc + j * es;
            l->hits[j].len = (uint64_t)es;
            l->hits[j].tier = KVC_WIRE_TIER_HOST;
            l->hits[j].format = (uint8_t)codec;
        }
        if (kvc_lease_scatter(l, 0, n, &dkv, 0, NULL, NULL) != (int)n || kvc_release(l))
            return 76;
        for (uint32_t i = 0; i < GE_LAYERS; i++)
            if (kern_cuda_copy(hdst.k[i], ok[i], hsrc.bytes, KERN_CUDA_D2H, NULL) ||
                kern_cuda_copy(hdst.v[i], ov[i], hsrc.bytes, KERN_CUDA_D2H, NULL) ||
                kern_cuda_stream_sync(NULL) || memcmp(hdst.k[i], ref.k[i], hsrc.bytes) ||
                memcmp(hdst.v[i], ref.v[i], hsrc.bytes)) {
                fprintf(stderr, "e2e_gpu: %s decode into paged device tensors differs\n",
                        kern_codec_name((enum kern_codec)codec));
                return 77;
            }
        gb_engine_fini(&ref);
        free(enc);
        free(dec);
    }
    for (uint32_t i = 0; i < GE_LAYERS; i++) {
        kern_cuda_free(dk[i]);
        kern_cuda_free(dv[i]);
        kern_cuda_free(ok[i]);
        kern_cuda_free(ov[i]);
    }
    kern_cuda_free(buf);
    free(want);
    free(back);
    gb_engine_fini(&hsrc);
    gb_engine_fini(&hdst);
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_gpu_batched_moves)
{
    pid_t a = daemon_child_spawn(ge_batched_device, NULL);
    ck_assert_int_eq(daemon_child_wait(a, daemon_ms(60000), NULL), 0);
}
END_TEST

START_TEST(test_gpu_two_processes_through_pool)
{
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key keys[GE_BLOCKS];
    pid_t a = daemon_child_spawn(ge_put_device, NULL);
    ck_assert_int_eq(daemon_child_wait(a, daemon_ms(30000), NULL), 0);
    ck_assert_int_eq(ge_open(&c, &ns, keys), 0);
    ck_assert_uint_gt(ge_stat(c, "gpu_used"), 0);
    pid_t b = daemon_child_spawn(ge_load_device, NULL);
    ck_assert_int_eq(daemon_child_wait(b, daemon_ms(30000), NULL), 0);
    /* host-tier hits into device memory: a client without the pool flag demotes them */
    b = daemon_child_spawn(ge_load_device, (void *)1);
    ck_assert_int_eq(daemon_child_wait(b, daemon_ms(30000), NULL), 0);
    kvc_disconnect(c);
}
END_TEST

START_TEST(test_gpu_killed_with_pins)
{
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key keys[GE_BLOCKS];
    pid_t a = daemon_child_spawn(ge_put_device, NULL);
    ck_assert_int_eq(daemon_child_wait(a, daemon_ms(30000), NULL), 0);
    ck_assert_int_eq(ge_open(&c, &ns, keys), 0);
    uint64_t used = ge_stat(c, "gpu_used");
    pid_t b = daemon_child_spawn(ge_pin_and_die, NULL);
    ck_assert_int_eq(daemon_child_wait(b, daemon_ms(30000), NULL), 0);
    uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(10000);
    while (ge_stat(c, "pins_now") != 0 && daemon_now_ms() < end)
        usleep(10000);
    ck_assert_uint_eq(ge_stat(c, "pins_now"), 0);
    ck_assert_uint_eq(ge_stat(c, "gpu_used"), used);
    b = daemon_child_spawn(ge_load_device, NULL);
    ck_assert_int_eq(daemon_child_wait(b, daemon_ms(30000), NULL), 0);
    kvc_disconnect(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_gpu");
    TCase *tc = tcase_create("host");
    SRunner *sr;
    int failed;
    tcase_set_timeout(tc, daemon_slow() * 60);
    tcase_add_checked_fixture(tc, ge_setup, ge_teardown);
    tcase_add_test(tc, test_paged_host_two_processes);
    tcase_add_test(tc, test_attach_without_tier);
    tcase_add_test(tc, test_commit_refuses_faulted_copy);
    tcase_add_test(tc, test_copy_async_decodes_quantized);
    tcase_add_test(tc, test_quantized_hits_decode_on_device);
    tcase_add_test(tc, test_hits_in_a_row_allocate_nothing);
    tcase_add_test(tc, test_batch_in_flight_until_release);
    tcase_add_test(tc, test_batch_fault_surfaces_at_release_and_commit);
    /* Devices are counted in a child: neither main() nor a case that forks clients may
     * start CUDA, which does not survive fork(). */
    int devices = daemon_cuda_devices();
    if (devices == 0)
        tcase_add_test(tc, test_configured_without_device);
    else
        printf("SKIP: e2e_gpu: test_configured_without_device: %s\n",
               devices > 0 ? "a CUDA device is here (make check-gpu covers the pool)"
                           : "the CUDA probe died");
    suite_add_tcase(s, tc);
    TCase *tf = tcase_create("fake-pool");
    tcase_set_timeout(tf, daemon_slow() * 60);
    tcase_add_checked_fixture(tf, gf_setup, gf_teardown);
    tcase_add_test(tf, test_attach_keeps_current_device);
    tcase_add_test(tf, test_pool_copies_land_in_order);
    tcase_add_test(tf, test_kinds_through_the_pool);
    tcase_add_test(tf, test_fake_refuses_forked_child);
    tcase_add_test(tf, test_pool_moves_off_the_loop);
    suite_add_tcase(s, tf);
    TCase *tb = tcase_create("batch");
    tcase_set_timeout(tb, daemon_slow() * 60);
    tcase_add_checked_fixture(tb, ge_setup, ge_teardown);
    tcase_add_test(tb, test_host_hits_bounded_ops);
    tcase_add_test(tb, test_scatter_layers_only_those);
    tcase_add_test(tb, test_gather_layers_commit);
    tcase_add_test(tb, test_scatter_lossy_every_codec);
    suite_add_tcase(s, tb);
    TCase *tp = tcase_create("batch-pool");
    tcase_set_timeout(tp, daemon_slow() * 60);
    tcase_add_checked_fixture(tp, gf_setup, gf_teardown);
    tcase_add_test(tp, test_pool_bounded_ops);
    suite_add_tcase(s, tp);
    TCase *tn = tcase_create("nofork");
    tcase_add_test(tn, test_device_cases_start_clean);
    suite_add_tcase(s, tn);
    TCase *tr = tcase_create("nofork-regression");
    tcase_set_timeout(tr, daemon_slow() * 180);
    tcase_add_test(tr, test_nofork_fake_then_device_cases);
    tcase_set_tags(tr, "regression"); /* the compute-sanitizer stage leaves it out */
    suite_add_tcase(s, tr);
    tcase_set_tags(tc, "nofork");
    tcase_set_tags(tf, "nofork");
    tcase_set_tags(tb, "nofork");
    tcase_set_tags(tp, "nofork");
    tcase_set_tags(tn, "nofork");
    if (devices > 0) {
        TCase *tg = tcase_create("gpu");
        tcase_set_timeout(tg, daemon_slow() * 120);
        tcase_add_checked_fixture(tg, ge_gpu_setup, ge_teardown);
        tcase_add_test(tg, test_gpu_two_processes_through_pool);
        tcase_add_test(tg, test_gpu_killed_with_pins);
        tcase_add_test(tg, test_gpu_batched_moves);
        tcase_set_tags(tg, "nofork device");
        suite_add_tcase(s, tg);
    } else {
        const char *why = devices < 0 ? "the CUDA probe died" : "no CUDA device found";
        printf("SKIP: e2e_gpu: test_gpu_two_processes_through_pool: %s\n", why);
        printf("SKIP: e2e_gpu: test_gpu_killed_with_pins: %s\n", why);
        printf("SKIP: e2e_gpu: test_gpu_batched_moves: %s\n", why);
    }
    fflush(stdout);
    if (daemon_suite_init("e2e-gpu"))
        return 1;
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    daemon_suite_fini();
    return failed ? 1 : 0;
}
