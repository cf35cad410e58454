/*
 * check_e2e_gpu.c — libkvc's GPU section against the real daemon, on the host tier and on a
 * CUDA device.
 *
 * Everywhere: two processes share a prefix through paged engine layouts on the host
 * (vLLM-style pages with a shuffled block table in, a contiguous tensor out, every byte
 * compared); kvc_gpu_attach() against a daemon without a GPU tier says "host copies" and
 * registers the arenas once (fake device table), and gives them back at disconnect; a daemon
 * configured with a pool but no device logs one line, reports gpu_capacity 0 and serves
 * from the host arena as before; a faulted copy is refused at commit, quantized hits decode
 * on the device, and hits in a row (issue 18, on the fake device) allocate nothing and keep
 * a batch in flight until its release.
 * With a CUDA device (make check-gpu on a GPU host): one process puts from device tensors
 * into the pool, another loads into its own device tensors through the pool, every byte
 * compared; host-tier hits land in device tensors the same way; a client killed while it
 * holds pool pins leaks nothing; a prefix moves in batched device operations, and host
 * blocks staged in chunks through a small scratch cap land right on the legacy default
 * stream and on an engine's own (stream order between the chunks). The device
 * cases are registered only where a device is found (each prints a SKIP line otherwise), and
 * a guard and a no-fork regression case check that the host cases leave this process fit to
 * fork the device cases' clients. The pool over the fake device (the server in this
 * process) and issue 25's bounded device operations are check_e2e_gpu_fake's.
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
#include "tests/lib/gpu_engine.h"
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

/* A counter of the daemon, UINT64_MAX when it has none of that name. */
static uint64_t ge_stat(kvc_client *c, const char *name)
{
    uint64_t v = UINT64_MAX;
    int rc = daemon_client_stat(c, 0, name, &v);
    ck_assert(rc == 0 || rc == -ENOENT);
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
    const uint64_t batches = fake_dev.copy_batches;
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
    /* the put's, the per-hit copies, then both scatters': the engine's pages are packed, so
     * the put and each scatter are one batched DMA straight out of or into them (no kernel,
     * no staging) */
    ck_assert_uint_eq(fake_dev.packs, 0);
    ck_assert_uint_eq(fake_dev.copy_batches - batches, 1 + GE_BLOCKS + 2);
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
 * "nofork" (the host cases, which use the fake device table, then
 * test_device_cases_start_clean), in one process; it must pass. Before the fix, test_attach_without_tier started CUDA in the test
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
    /* every case tagged nofork ran: the host cases (8, and one more without a device) and
     * the guard (the fake-pool and batch cases are check_e2e_gpu_fake's) */
    ck_assert_msg(atoi(sum + strlen("100%: Checks: ")) >= 9, "%s", out);
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

/* Child of test_gpu_staged_chunks: host-tier blocks staged through a scratch cap of 64 KiB
 * (two of these 32 KiB blocks a chunk: GB_BLOCKS / 2 chunks through one scratch; the 4 KiB
 * page pieces are under the default least DMA piece), on the legacy default stream (the
 * batched DMA's bridge must order each chunk's copy behind the kernel before it), on a
 * non-blocking stream of its own (an engine's) and on cudaStreamPerThread: a gather from
 * paged device tensors into host slots, a scatter of them back into other tensors, and q8_0
 * hits scattered and range-copied into device memory, every byte compared with the CPU's. A chunk's copy that overtook the
 * kernel before it would overwrite the scratch that kernel reads. */
static int ge_staged_device(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    kvc_lease *l;
    struct kvc_key keys[GB_BLOCKS];
    struct gb_engine hsrc, hdst, blank, ref;
    const struct kern_dev_ops *ops = kern_dev_cuda();
    void *side = NULL;
    int dev = 0;
    (void)arg;
    unsetenv("KVC_GPU_DMA_MIN");
    kvci_gpu_stage_cap_set(64 << 10);
    if (!ops || ge_open(&c, &ns, keys) || kvc_gpu_attach(c) != 1)
        return 80;
    kvci_gpu_stage_cap_set(0);
    if (ops->device_get(&dev) || ops->stream_new(dev, &side))
        return 81;
    const size_t bb = kvc_ns_block_bytes(ns);
    gb_engine_init(&hsrc, GE_LAYERS, 0, 1, 6);
    gb_engine_init(&hdst, GE_LAYERS, 0, 0, 0);
    gb_engine_init(&blank, GE_LAYERS, 0, 0, 0);
    gb_engine_init(&ref, GE_LAYERS, 0, 0, 0);
    uint8_t *want = gb_blocks(&hsrc, GB_BLOCKS, bb), *back = malloc(GB_BLOCKS * bb);
    /* the q8_0 blocks and the reference engine of the CPU decoder's bytes */
    struct kern_layout kl = {GE_LAYERS, GE_HEADS, GE_DIM, GE_BT, KERN_DTYPE_FP16, 0};
    struct kern_pack_layout pl = gb_pack_layout(GE_LAYERS);
    struct kern_pack_engine re = gb_pack_engine(&ref);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, KERN_CODEC_Q8_0, KERN_CODEC_Q8_0, 1);
    const int64_t es = kern_encoded_size(&kl, &rec);
    uint8_t *enc = es > 0 ? malloc(GB_BLOCKS * (size_t)es) : NULL, *dec = malloc(GB_BLOCKS * bb);
    if (!back || !enc || !dec)
        return 82;
    for (uint32_t j = 0; j < GB_BLOCKS; j++) {
        void *b = dec + j * bb;
        if (kern_encode_cpu(&kl, &rec, want + j * bb, enc + j * es, (size_t)es, NULL) != es ||
            kern_decode_cpu(&kl, enc + j * es, (size_t)es, b, bb, KERN_DTYPE_FP16) != (int64_t)bb ||
            kern_pack_ref(&pl, &re, (uint64_t)j * GE_BT, 1, &b, KERN_PACK_SCATTER))
            return 83;
    }
    void *dk[GE_LAYERS], *dv[GE_LAYERS], *ok[GE_LAYERS], *ov[GE_LAYERS], *buf = NULL;
    for (uint32_t i = 0; i < GE_LAYERS; i++)
        if (kern_cuda_alloc(&dk[i], hsrc.bytes) || kern_cuda_alloc(&dv[i], hsrc.bytes) ||
            kern_cuda_alloc(&ok[i], hsrc.bytes) || kern_cuda_alloc(&ov[i], hsrc.bytes) ||
            kern_cuda_copy(dk[i], hsrc.k[i], hsrc.bytes, KERN_CUDA_H2D, NULL) ||
            kern_cuda_copy(dv[i], hsrc.v[i], hsrc.bytes, KERN_CUDA_H2D, NULL))
            return 84;
    if (kern_cuda_alloc(&buf, GB_BLOCKS * bb) || kern_cuda_stream_sync(NULL))
        return 85;
    struct kvc_paged_kv skv = hsrc.kv, dkv = hsrc.kv;
    skv.k = dk;
    skv.v = dv;
    skv.on_device = 1;
    dkv.k = ok;
    dkv.v = ov;
    dkv.on_device = 1;
    for (int si = 0; si < 3; si++) {
        /* the legacy default stream, an engine's own, and cudaStreamPerThread (0x2: one
         * handle, a stream per thread, on which libkvc never reuses a lease's scratch) */
        void *stream = si == 2 ? (void *)0x2 : si ? side : NULL;
        gb_keys(ns, 1300000 + 100000 * (uint32_t)si, GB_BLOCKS, keys);
        if (kvc_reserve(ns, NULL, keys, GB_BLOCKS, &r) != GB_BLOCKS ||
            kvc_resv_gather(r, 0, GB_BLOCKS, &skv, 0, stream, NULL) != GB_BLOCKS ||
            kvc_commit(r, SIZE_MAX) != GB_BLOCKS)
            return 86;
        if (kvc_lookup(ns, keys, GB_BLOCKS, 0, &l) != GB_BLOCKS)
            return 87;
        for (uint32_t j = 0; j < GB_BLOCKS; j++)
            if (kvc_lease_tier(l, j) != KVC_TIER_HOST ||
                memcmp(kvc_lease_data(l, j), want + j * bb, bb)) {
                fprintf(stderr, "e2e_gpu: staged gather, stream %d, block %u differs\n", si, j);
                return 88;
            }
        for (uint32_t i = 0; i < GE_LAYERS; i++) /* 0x5a everywhere first */
            if (kern_cuda_copy(ok[i], blank.k[i], hsrc.bytes, KERN_CUDA_H2D, NULL) ||
                kern_cuda_copy(ov[i], blank.v[i], hsrc.bytes, KERN_CUDA_H2D, NULL))
                return 89;
        if (kern_cuda_stream_sync(NULL) ||
            kvc_lease_scatter(l, 0, GB_BLOCKS, &dkv, 0, stream, NULL) != GB_BLOCKS ||
            kvc_release(l))
            return 90;
        for (uint32_t i = 0; i < GE_LAYERS; i++)
            if (kern_cuda_copy(hdst.k[i], ok[i], hsrc.bytes, KERN_CUDA_D2H, NULL) ||
                kern_cuda_copy(hdst.v[i], ov[i], hsrc.bytes, KERN_CUDA_D2H, NULL))
                return 91;
        if (kern_cuda_stream_sync(NULL) || gb_engine_check(&hdst, &hsrc, GB_TOKENS, 0, GE_LAYERS)) {
            fprintf(stderr, "e2e_gpu: staged scatter, stream %d, differs\n", si);
            return 92;
        }
        /* the q8_0 hits: 64 of about 17 KiB, three a chunk */
        if (kvc_lookup(ns, keys, GB_BLOCKS, 0, &l) != GB_BLOCKS)
            return 93;
        for (uint32_t j = 0; j < GB_BLOCKS; j++) {
            l->hits[j].data = enc + j * es;
            l->hits[j].len = (uint64_t)es;
            l->hits[j].tier = KVC_WIRE_TIER_HOST;
            l->hits[j].format = KERN_CODEC_Q8_0;
        }
        for (uint32_t i = 0; i < GE_LAYERS; i++)
            if (kern_cuda_copy(ok[i], blank.k[i], hsrc.bytes, KERN_CUDA_H2D, NULL) ||
                kern_cuda_copy(ov[i], blank.v[i], hsrc.bytes, KERN_CUDA_H2D, NULL))
                return 94;
        if (kern_cuda_stream_sync(NULL) ||
            kvc_lease_scatter(l, 0, GB_BLOCKS, &dkv, 0, stream, NULL) != GB_BLOCKS ||
            kvc_lease_copy_range_async(l, 0, GB_BLOCKS, buf, GB_BLOCKS * bb, stream) != GB_BLOCKS ||
            kvc_release(l))
            return 95;
        for (uint32_t i = 0; i < GE_LAYERS; i++)
            if (kern_cuda_copy(hdst.k[i], ok[i], hsrc.bytes, KERN_CUDA_D2H, NULL) ||
                kern_cuda_copy(hdst.v[i], ov[i], hsrc.bytes, KERN_CUDA_D2H, NULL) ||
                kern_cuda_stream_sync(NULL) || memcmp(hdst.k[i], ref.k[i], hsrc.bytes) ||
                memcmp(hdst.v[i], ref.v[i], hsrc.bytes)) {
                fprintf(stderr, "e2e_gpu: staged q8_0 scatter, stream %d, differs\n", si);
                return 96;
            }
        if (kern_cuda_copy(back, buf, GB_BLOCKS * bb, KERN_CUDA_D2H, NULL) ||
            kern_cuda_stream_sync(NULL) || memcmp(back, dec, GB_BLOCKS * bb)) {
            fprintf(stderr, "e2e_gpu: staged q8_0 range copy, stream %d, differs\n", si);
            return 97;
        }
    }
    for (uint32_t i = 0; i < GE_LAYERS; i++) {
        kern_cuda_free(dk[i]);
        kern_cuda_free(dv[i]);
        kern_cuda_free(ok[i]);
        kern_cuda_free(ov[i]);
    }
    kern_cuda_free(buf);
    ops->stream_free(side);
    free(want);
    free(back);
    free(enc);
    free(dec);
    gb_engine_fini(&hsrc);
    gb_engine_fini(&hdst);
    gb_engine_fini(&blank);
    gb_engine_fini(&ref);
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_gpu_staged_chunks)
{
    pid_t a = daemon_child_spawn(ge_staged_device, NULL);
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
    TCase *tn = tcase_create("nofork");
    tcase_add_test(tn, test_device_cases_start_clean);
    suite_add_tcase(s, tn);
    TCase *tr = tcase_create("nofork-regression");
    tcase_set_timeout(tr, daemon_slow() * 180);
    tcase_add_test(tr, test_nofork_fake_then_device_cases);
    tcase_set_tags(tr, "regression"); /* the compute-sanitizer stage leaves it out */
    suite_add_tcase(s, tr);
    tcase_set_tags(tc, "nofork");
    tcase_set_tags(tn, "nofork");
    if (devices > 0) {
        TCase *tg = tcase_create("gpu");
        tcase_set_timeout(tg, daemon_slow() * 120);
        tcase_add_checked_fixture(tg, ge_gpu_setup, ge_teardown);
        tcase_add_test(tg, test_gpu_two_processes_through_pool);
        tcase_add_test(tg, test_gpu_killed_with_pins);
        tcase_add_test(tg, test_gpu_batched_moves);
        tcase_add_test(tg, test_gpu_staged_chunks);
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
    return daemon_suite_run(s);
}
