/*
 * gpu_engine.c — see gpu_engine.h.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvc.h"
#include "client/libkvc_internal.h"
#include "kernels/kern_pack.h"
#include "tests/lib/daemon.h"
#include "tests/lib/fake_dev.h"
#include "tests/lib/gpu_engine.h"

struct daemon ge_d;

struct kvc_layout ge_layout(void)
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

void ge_setup(void)
{
    static const char *const args[] = {"-o", "host.size=32m", "-o", "host.page_size=64k", NULL};
    memset(&ge_d, 0, sizeof(ge_d));
    ck_assert_int_eq(daemon_start(&ge_d, args), 0);
    /* These shapes' page pieces are 4 KiB (16 tokens of 2 heads of 64): below libkvc's
     * default least DMA piece, so the direct host <-> page path is taken here only at this
     * setting (a case that tests the default unsets it before kvc_gpu_attach). */
    setenv("KVC_GPU_DMA_MIN", "4096", 1);
}

void ge_teardown(void)
{
    /* A fake case that failed half way must not leave its table to the cases after it (one
     * process runs them all when CK_FORK=no, as under compute-sanitizer). */
    kvci_gpu_ops_set(NULL);
    unsetenv("KVC_GPU_DMA_MIN");
    ck_assert_int_eq(daemon_stop(&ge_d), 0);
    daemon_cleanup(&ge_d);
}

static uint8_t gb_byte(uint32_t l, uint32_t k, uint64_t off, unsigned salt)
{
    return (uint8_t)((off * 2654435761u >> 7) ^ (l * 29u + k * 101u + salt * 7u));
}

void gb_engine_init(struct gb_engine *e, uint32_t layers, int dev, int fill, unsigned salt)
{
    gb_engine_init_pad(e, layers, dev, fill, salt, 0);
}

void gb_engine_init_pad(struct gb_engine *e, uint32_t layers, int dev, int fill, unsigned salt,
                        uint32_t pad)
{
    memset(e, 0, sizeof(*e));
    e->layers = layers;
    e->dev = dev;
    e->pad = pad;
    const uint64_t hs = GE_ROW + pad, ts = GE_HEADS * hs;
    e->bytes = (uint64_t)GB_TOKENS * ts;
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
                                  .page_stride = (uint64_t)GB_PAGE * ts,
                                  .token_stride = ts,
                                  .head_stride = hs,
                                  .on_device = dev};
}

void gb_engine_fini(struct gb_engine *e)
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

struct kern_pack_layout gb_pack_layout(uint32_t layers)
{
    return (struct kern_pack_layout){layers, 2, GE_BT, GE_HEADS, GE_DIM, 2};
}

struct kern_pack_engine gb_pack_engine(const struct gb_engine *e)
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
uint8_t *gb_blocks(const struct gb_engine *e, uint32_t n, size_t bb)
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

struct kvc_layout gb_layout(uint32_t layers)
{
    static char names[GB_MAX_LAYERS + 1][32];
    snprintf(names[layers], sizeof(names[layers]), "e2e-gpu-batch-%u", layers);
    struct kvc_layout lay = ge_layout();
    lay.model_id = names[layers];
    lay.layers = layers;
    return lay;
}

void gb_keys(kvc_ns *ns, uint32_t base, uint32_t n, struct kvc_key *keys)
{
    static uint32_t tokens[GB_TOKENS];
    for (uint32_t i = 0; i < n * GE_BT; i++)
        tokens[i] = base + i;
    ck_assert_int_eq(kvc_keys_from_tokens(ns, NULL, tokens, n * GE_BT, NULL, 0, keys, n), (int)n);
}

uint64_t gb_ops(void)
{
    return fake_dev.ops + fake_dev.records;
}

/* Layers [lf, lf+lc) of dst hold src's tokens [0, ntok) and everything else of dst is still
 * 0x5a: 0, else -1. */
int gb_engine_check(const struct gb_engine *dst, const struct gb_engine *src, uint32_t ntok,
                    uint32_t lf, uint32_t lc)
{
    const uint64_t hs = dst->kv.head_stride, tb = dst->kv.token_stride;
    if (src->kv.token_stride != tb)
        return -1;
    for (uint32_t l = 0; l < dst->layers; l++)
        for (uint32_t k = 0; k < 2; k++) {
            const uint8_t *d = k ? dst->v[l] : dst->k[l], *s = k ? src->v[l] : src->k[l];
            int in = l >= lf && l < lf + lc;
            for (uint32_t t = 0; t < GB_TOKENS; t++) {
                uint64_t at = ((uint64_t)dst->table[t / GB_PAGE] * GB_PAGE + t % GB_PAGE) * tb;
                int want = in && t < ntok;
                /* a head's row: src's where moved; its padding never written */
                for (uint64_t x = 0; x < tb; x++)
                    if (want && x % hs < GE_ROW ? d[at + x] != s[at + x] : d[at + x] != 0x5a)
                        return -1;
            }
        }
    return 0;
}

void gb_engine_clear(struct gb_engine *e)
{
    for (uint32_t l = 0; l < e->layers; l++) {
        memset(e->k[l], 0x5a, e->bytes);
        memset(e->v[l], 0x5a, e->bytes);
    }
}