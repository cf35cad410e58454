/*
 * check_pack.c — gather/scatter between engine page layouts and kvcd's canonical block
 * layout: the reference against hand-written expectations for vLLM-style paged tensors and
 * contiguous tensors, the CPU version against the reference, round trips, the argument
 * checks; the batches the CUDA kernels run (kern_batch.h), run here row by row, against the
 * reference: gathers and scatters, layer ranges, tables split over several launches, and
 * every codec decoded straight into paged tensors; and the CUDA twins against the CPU where
 * a device is found.
 */
#include <check.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/kern.h"
#include "kernels/kern_batch.h"
#include "kernels/kern_pack.h"
#include "tests/lib/daemon.h"

/* One engine: per-layer K and V tensors of npages pages, each page a
 * [page_tokens][heads][head_pad] array of elem_bytes elements (head_pad >= head_dim). */
struct eng {
    struct kern_pack_layout lay;
    struct kern_pack_engine e;
    uint32_t npages, head_pad;
    void *k[8], *v[8];
    int32_t table[64];
    uint64_t tensor_bytes;
};

static void eng_init(struct eng *g, uint32_t layers, uint32_t kinds, uint32_t block_tokens,
                     uint32_t heads, uint32_t dim, uint32_t elem, uint32_t page_tokens,
                     uint32_t npages, uint32_t head_pad, unsigned seed)
{
    memset(g, 0, sizeof(*g));
    g->lay = (struct kern_pack_layout){layers, kinds, block_tokens, heads, dim, elem};
    g->npages = npages;
    g->head_pad = head_pad;
    uint64_t row = (uint64_t)head_pad * elem;
    g->e.head_stride = row;
    g->e.token_stride = row * heads;
    g->e.page_stride = g->e.token_stride * page_tokens;
    g->e.page_tokens = page_tokens;
    g->tensor_bytes = g->e.page_stride * npages;
    srand(seed);
    for (uint32_t l = 0; l < layers; l++) {
        g->k[l] = malloc(g->tensor_bytes);
        g->v[l] = kinds == 2 ? malloc(g->tensor_bytes) : NULL;
        for (uint64_t i = 0; i < g->tensor_bytes; i++) {
            ((uint8_t *)g->k[l])[i] = (uint8_t)rand();
            if (g->v[l])
                ((uint8_t *)g->v[l])[i] = (uint8_t)rand();
        }
    }
    /* A shuffled table: the sequence's pages are scattered over the pool. */
    for (uint32_t i = 0; i < npages; i++)
        g->table[i] = (int32_t)i;
    for (uint32_t i = npages; i > 1; i--) {
        uint32_t j = (uint32_t)rand() % i;
        int32_t t = g->table[i - 1];
        g->table[i - 1] = g->table[j];
        g->table[j] = t;
    }
    g->e.k = g->k;
    g->e.v = kinds == 2 ? g->v : NULL;
    g->e.block_table = g->table;
    g->e.table_len = npages;
}

static void eng_fini(struct eng *g)
{
    for (uint32_t l = 0; l < g->lay.layers; l++) {
        free(g->k[l]);
        free(g->v[l]);
    }
}

/* The expectation written out by hand: element (l, k, t, h, d) of block b. */
static const uint8_t *eng_elem(const struct eng *g, uint32_t b, uint64_t first, uint32_t l,
                               uint32_t k, uint32_t t, uint32_t h, uint32_t d)
{
    uint64_t p = first + (uint64_t)b * g->lay.block_tokens + t;
    uint32_t page = (uint32_t)g->table[p / g->e.page_tokens];
    uint32_t slot = (uint32_t)(p % g->e.page_tokens);
    const uint8_t *base = k ? g->v[l] : g->k[l];
    uint64_t idx =
        (((uint64_t)page * g->e.page_tokens + slot) * g->lay.heads + h) * g->head_pad + d;
    return base + idx * g->lay.elem_bytes;
}

static void check_blocks(const struct eng *g, uint64_t first, uint32_t nblocks, void **blocks)
{
    const struct kern_pack_layout *L = &g->lay;
    for (uint32_t b = 0; b < nblocks; b++) {
        const uint8_t *c = blocks[b];
        for (uint32_t l = 0; l < L->layers; l++)
            for (uint32_t k = 0; k < L->kinds; k++)
                for (uint32_t t = 0; t < L->block_tokens; t++)
                    for (uint32_t h = 0; h < L->heads; h++)
                        for (uint32_t d = 0; d < L->head_dim; d++, c += L->elem_bytes)
                            ck_assert_msg(
                                memcmp(c, eng_elem(g, b, first, l, k, t, h, d), L->elem_bytes) == 0,
                                "block %u l%u k%u t%u h%u d%u", b, l, k, t, h, d);
    }
}

static void **blocks_new(const struct eng *g, uint32_t n)
{
    void **b = calloc(n, sizeof(*b));
    for (uint32_t i = 0; i < n; i++)
        b[i] = calloc(1, kern_pack_block_bytes(&g->lay));
    return b;
}

static void blocks_free(void **b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        free(b[i]);
    free(b);
}

/* Gather with ref and cpu, compare with the hand expectation; scatter into a zeroed copy of
 * the engine and gather again: the same blocks. */
static void run_case(struct eng *g, uint64_t first, uint32_t nblocks)
{
    void **r = blocks_new(g, nblocks), **c = blocks_new(g, nblocks), **c2 = blocks_new(g, nblocks);
    uint64_t bb = kern_pack_block_bytes(&g->lay);
    ck_assert_int_eq(kern_pack_ref(&g->lay, &g->e, first, nblocks, r, KERN_PACK_GATHER), 0);
    check_blocks(g, first, nblocks, r);
    ck_assert_int_eq(kern_pack_cpu(&g->lay, &g->e, first, nblocks, c, KERN_PACK_GATHER), 0);
    for (uint32_t i = 0; i < nblocks; i++)
        ck_assert_mem_eq(r[i], c[i], bb);
    /* the kernel's batches, row by row */
    for (uint32_t i = 0; i < nblocks; i++)
        memset(c[i], 0, bb);
    ck_assert_int_eq(kern_pack_batched_cpu(&g->lay, &g->e, first, nblocks, c, KERN_PACK_GATHER), 0);
    for (uint32_t i = 0; i < nblocks; i++)
        ck_assert_mem_eq(r[i], c[i], bb);
    for (uint32_t l = 0; l < g->lay.layers; l++) {
        memset(g->k[l], 0, g->tensor_bytes);
        if (g->v[l])
            memset(g->v[l], 0, g->tensor_bytes);
    }
    ck_assert_int_eq(kern_pack_cpu(&g->lay, &g->e, first, nblocks, c, KERN_PACK_SCATTER), 0);
    ck_assert_int_eq(kern_pack_ref(&g->lay, &g->e, first, nblocks, c2, KERN_PACK_GATHER), 0);
    for (uint32_t i = 0; i < nblocks; i++)
        ck_assert_mem_eq(r[i], c2[i], bb);
    /* the reference's scatter, into a zeroed engine again, writes the same engine bytes as
     * the CPU version's (the tokens of the blocks, and nothing around them) */
    void *snap_k[8], *snap_v[8];
    for (uint32_t l = 0; l < g->lay.layers; l++) {
        snap_k[l] = malloc(g->tensor_bytes);
        snap_v[l] = g->v[l] ? malloc(g->tensor_bytes) : NULL;
        memcpy(snap_k[l], g->k[l], g->tensor_bytes);
        memset(g->k[l], 0, g->tensor_bytes);
        if (g->v[l]) {
            memcpy(snap_v[l], g->v[l], g->tensor_bytes);
            memset(g->v[l], 0, g->tensor_bytes);
        }
    }
    ck_assert_int_eq(kern_pack_ref(&g->lay, &g->e, first, nblocks, c2, KERN_PACK_SCATTER), 0);
    for (uint32_t l = 0; l < g->lay.layers; l++) {
        ck_assert_mem_eq(g->k[l], snap_k[l], g->tensor_bytes);
        if (g->v[l])
            ck_assert_mem_eq(g->v[l], snap_v[l], g->tensor_bytes);
    }
    /* and the batches' scatter, into a zeroed engine, the same bytes */
    for (uint32_t l = 0; l < g->lay.layers; l++) {
        memset(g->k[l], 0, g->tensor_bytes);
        if (g->v[l])
            memset(g->v[l], 0, g->tensor_bytes);
    }
    ck_assert_int_eq(kern_pack_batched_cpu(&g->lay, &g->e, first, nblocks, c2, KERN_PACK_SCATTER),
                     0);
    for (uint32_t l = 0; l < g->lay.layers; l++) {
        ck_assert_mem_eq(g->k[l], snap_k[l], g->tensor_bytes);
        if (g->v[l])
            ck_assert_mem_eq(g->v[l], snap_v[l], g->tensor_bytes);
        free(snap_k[l]);
        free(snap_v[l]);
    }
    check_blocks(g, first, nblocks, r);
    blocks_free(r, nblocks);
    blocks_free(c, nblocks);
    blocks_free(c2, nblocks);
}

/* vLLM: [num_pages][16][heads][dim] per layer, kvcd blocks of 32 tokens = two pages, a
 * prefix that starts at the sequence's second block. */
START_TEST(test_vllm_paged)
{
    struct eng g;
    eng_init(&g, 3, 2, 32, 4, 64, 2, 16, 12, 64, 1);
    run_case(&g, 32, 4);
    eng_fini(&g);
}
END_TEST

/* One contiguous [tokens][heads][dim] tensor per layer: a one-entry table. */
START_TEST(test_contiguous)
{
    struct eng g;
    eng_init(&g, 2, 2, 16, 2, 32, 2, 128, 1, 32, 2);
    run_case(&g, 0, 8);
    eng_fini(&g);
}
END_TEST

/* Pages that do not divide blocks, padded heads (head_stride > row), odd element counts,
 * 1- and 4-byte elements, K only (MLA). */
START_TEST(test_odd_shapes)
{
    struct eng g;
    eng_init(&g, 2, 2, 8, 3, 5, 1, 12, 8, 7, 3);
    run_case(&g, 4, 9);
    eng_fini(&g);
    eng_init(&g, 4, 1, 16, 1, 24, 4, 16, 6, 24, 4);
    run_case(&g, 16, 4);
    eng_fini(&g);
}
END_TEST

START_TEST(test_bad_args)
{
    struct eng g;
    void **b;
    eng_init(&g, 2, 2, 16, 2, 8, 2, 16, 4, 8, 5);
    b = blocks_new(&g, 4);
    /* past the table */
    ck_assert_int_eq(kern_pack_cpu(&g.lay, &g.e, 16, 4, b, KERN_PACK_GATHER), -EINVAL);
    ck_assert_int_eq(kern_pack_ref(&g.lay, &g.e, 16, 4, b, KERN_PACK_GATHER), -EINVAL);
    /* a negative entry */
    g.table[1] = -1;
    ck_assert_int_eq(kern_pack_cpu(&g.lay, &g.e, 0, 2, b, KERN_PACK_GATHER), -EINVAL);
    g.table[1] = 1;
    ck_assert_int_eq(kern_pack_cpu(&g.lay, &g.e, 0, 2, b, KERN_PACK_GATHER), 0);
    /* overlapping heads, bad direction, bad shapes */
    g.e.head_stride = 4;
    ck_assert_int_eq(kern_pack_cpu(&g.lay, &g.e, 0, 1, b, KERN_PACK_GATHER), -EINVAL);
    g.e.head_stride = 16;
    ck_assert_int_eq(kern_pack_cpu(&g.lay, &g.e, 0, 1, b, 0), -EINVAL);
    struct kern_pack_layout bad = g.lay;
    bad.elem_bytes = 3;
    ck_assert_int_eq(kern_pack_cpu(&bad, &g.e, 0, 1, b, KERN_PACK_GATHER), -EINVAL);
    bad = g.lay;
    bad.kinds = 3;
    ck_assert_int_eq(kern_pack_cpu(&bad, &g.e, 0, 1, b, KERN_PACK_GATHER), -EINVAL);
    g.e.v = NULL;
    ck_assert_int_eq(kern_pack_cpu(&g.lay, &g.e, 0, 1, b, KERN_PACK_GATHER), -EINVAL);
    ck_assert_int_eq(kern_pack_cpu(&g.lay, &g.e, 0, 0, NULL, KERN_PACK_GATHER), -EINVAL);
    g.e.v = g.v;
    ck_assert_int_eq(kern_pack_cpu(&g.lay, &g.e, 0, 0, NULL, KERN_PACK_GATHER), 0);
    blocks_free(b, 4);
    eng_fini(&g);
}
END_TEST

/* Layer ranges through the batches: a scatter of layers [1, 3) of four writes exactly those
 * layers' tokens and leaves the other layers' tensors as they were; a gather of the range
 * fills exactly that range of each block. */
START_TEST(test_batch_layer_range)
{
    struct eng g;
    eng_init(&g, 4, 2, 16, 2, 32, 2, 8, 16, 40, 7); /* padded heads: head_stride > row */
    const uint32_t n = 3, lf = 1, lc = 2;
    uint64_t bb = kern_pack_block_bytes(&g.lay), lbytes = bb / g.lay.layers;
    void **full = blocks_new(&g, n), **part = blocks_new(&g, n);
    ck_assert_int_eq(kern_pack_ref(&g.lay, &g.e, 16, n, full, KERN_PACK_GATHER), 0);
    struct kern_pack_layout sub = g.lay;
    sub.layers = lc;
    struct kern_pack_engine se = g.e;
    se.k = g.k + lf;
    se.v = g.v + lf;
    struct kern_batch_args *a = malloc(sizeof(*a));
    ck_assert_ptr_nonnull(a);
    for (uint32_t i = 0; i < n; i++)
        memset(part[i], 0xa5, bb);
    ck_assert_int_eq(kern_batch_pack(a, &sub, &se, 16, n, part, lf * lbytes, KERN_PACK_GATHER), 0);
    kern_batch_run_cpu(a);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *p = part[i], *f = full[i];
        ck_assert_mem_eq(p + lf * lbytes, f + lf * lbytes, lc * lbytes);
        for (uint64_t x = 0; x < lf * lbytes; x++)
            ck_assert_uint_eq(p[x], 0xa5);
        for (uint64_t x = (lf + lc) * lbytes; x < bb; x++)
            ck_assert_uint_eq(p[x], 0xa5);
    }
    /* scatter the range from other blocks: only layers 1 and 2 change */
    void *before_k[4], *before_v[4];
    for (uint32_t l = 0; l < 4; l++) {
        before_k[l] = malloc(g.tensor_bytes);
        before_v[l] = malloc(g.tensor_bytes);
        memcpy(before_k[l], g.k[l], g.tensor_bytes);
        memcpy(before_v[l], g.v[l], g.tensor_bytes);
    }
    for (uint32_t i = 0; i < n; i++)
        for (uint64_t x = 0; x < bb; x++)
            ((uint8_t *)part[i])[x] = (uint8_t)(x * 7 + i);
    ck_assert_int_eq(kern_batch_pack(a, &sub, &se, 16, n, part, lf * lbytes, KERN_PACK_SCATTER), 0);
    kern_batch_run_cpu(a);
    for (uint32_t l = 0; l < 4; l++) {
        int in = l >= lf && l < lf + lc;
        ck_assert_int_eq(memcmp(before_k[l], g.k[l], g.tensor_bytes) != 0, in);
        ck_assert_int_eq(memcmp(before_v[l], g.v[l], g.tensor_bytes) != 0, in);
    }
    /* what landed is what the reference gathers back from the range */
    void **back = blocks_new(&g, n);
    ck_assert_int_eq(kern_pack_ref(&g.lay, &g.e, 16, n, back, KERN_PACK_GATHER), 0);
    for (uint32_t i = 0; i < n; i++)
        ck_assert_mem_eq((uint8_t *)back[i] + lf * lbytes, (uint8_t *)part[i] + lf * lbytes,
                         lc * lbytes);
    for (uint32_t l = 0; l < 4; l++) {
        free(before_k[l]);
        free(before_v[l]);
    }
    /* a NULL block is not this batch's: its tokens are left alone */
    void *keep = part[1];
    part[1] = NULL;
    memcpy(before_k[0] = malloc(g.tensor_bytes), g.k[lf], g.tensor_bytes);
    for (uint32_t i = 0; i < n; i++)
        if (part[i])
            memset(part[i], 0x11, bb);
    ck_assert_int_eq(kern_batch_pack(a, &sub, &se, 16, n, part, lf * lbytes, KERN_PACK_SCATTER), 0);
    kern_batch_run_cpu(a);
    part[1] = keep;
    ck_assert_int_eq(kern_pack_ref(&g.lay, &g.e, 16, n, back, KERN_PACK_GATHER), 0);
    ck_assert_uint_eq(((uint8_t *)back[0])[lf * lbytes], 0x11);
    ck_assert_uint_ne(((uint8_t *)back[1])[lf * lbytes], 0x11);
    ck_assert_uint_eq(((uint8_t *)back[2])[lf * lbytes], 0x11);
    free(before_k[0]);
    free(a);
    blocks_free(back, n);
    blocks_free(full, n);
    blocks_free(part, n);
    eng_fini(&g);
}
END_TEST

/* The access width the batch picks: 16 bytes where everything allows it, narrower where a
 * stride or a base does not; the bytes are the same either way. */
START_TEST(test_batch_access_width)
{
    struct eng g;
    struct kern_batch_args *a = malloc(sizeof(*a));
    void **b;
    ck_assert_ptr_nonnull(a);
    eng_init(&g, 2, 2, 16, 4, 64, 2, 16, 4, 64, 9);
    b = blocks_new(&g, 2);
    ck_assert_int_eq(kern_batch_pack(a, &g.lay, &g.e, 0, 2, b, 0, KERN_PACK_GATHER), 0);
    ck_assert_uint_eq(a->h.vec, 16);
    ck_assert_uint_eq(kern_batch_nrows(a), 2ull * 2 * 2 * 16);
    ck_assert_int_eq(kern_batch_pack(a, &g.lay, &g.e, 0, 2, b, 2, KERN_PACK_GATHER), 0);
    ck_assert_uint_eq(a->h.vec, 2);
    blocks_free(b, 2);
    eng_fini(&g);
    eng_init(&g, 2, 2, 8, 3, 5, 1, 12, 8, 7, 3); /* 5-byte rows, 7-byte heads */
    b = blocks_new(&g, 2);
    ck_assert_int_eq(kern_batch_pack(a, &g.lay, &g.e, 0, 2, b, 0, KERN_PACK_GATHER), 0);
    ck_assert_uint_eq(a->h.vec, 1);
    blocks_free(b, 2);
    eng_fini(&g);
    free(a);
}
END_TEST

/* Tables that do not fit one launch (SGLang's one-token pages: an entry per token) are
 * split over several batches; every byte is still the reference's. */
START_TEST(test_batch_split)
{
    const uint32_t T = 64, nb = 160, tokens = T * nb, H = 1, D = 8;
    struct kern_pack_layout lay = {2, 2, T, H, D, 2};
    uint64_t row = (uint64_t)H * D * 2, tensor = row * tokens;
    int32_t *table = malloc(tokens * sizeof(int32_t));
    void *k[2], *v[2];
    ck_assert_ptr_nonnull(table);
    for (uint32_t i = 0; i < tokens; i++)
        table[i] = (int32_t)((i * 7919u) % tokens);
    for (int l = 0; l < 2; l++) {
        k[l] = malloc(tensor);
        v[l] = malloc(tensor);
        for (uint64_t x = 0; x < tensor; x++) {
            ((uint8_t *)k[l])[x] = (uint8_t)(x * 13 + l);
            ((uint8_t *)v[l])[x] = (uint8_t)(x * 29 + l + 1);
        }
    }
    struct kern_pack_engine e = {k, v, table, tokens, 1, row, row, row};
    uint64_t bb = kern_pack_block_bytes(&lay);
    void **r = calloc(nb, sizeof(void *)), **c = calloc(nb, sizeof(void *));
    for (uint32_t i = 0; i < nb; i++) {
        r[i] = calloc(1, bb);
        c[i] = calloc(1, bb);
    }
    struct kern_batch_args *a = malloc(sizeof(*a));
    ck_assert_int_eq(kern_batch_pack(a, &lay, &e, 0, nb, c, 0, KERN_PACK_GATHER), -E2BIG);
    free(a);
    ck_assert_int_eq(kern_pack_ref(&lay, &e, 0, nb, r, KERN_PACK_GATHER), 0);
    ck_assert_int_eq(kern_pack_batched_cpu(&lay, &e, 0, nb, c, KERN_PACK_GATHER), 0);
    for (uint32_t i = 0; i < nb; i++) {
        ck_assert_mem_eq(r[i], c[i], bb);
        free(r[i]);
        free(c[i]);
    }
    free(r);
    free(c);
    for (int l = 0; l < 2; l++) {
        free(k[l]);
        free(v[l]);
    }
    free(table);
}
END_TEST

/* Rows per step (R = 1 << rshift) as the host picks them: row steps (strided layouts) the
 * largest power of two dividing the block's tokens with R token rows in 2 KiB; run steps
 * (heads and tokens packed: run == 1) the largest dividing the block's tokens, the page's and
 * the first token's place in its page, with R rows in 8 KiB. */
static uint32_t batch_rshift(struct eng *g, uint32_t run)
{
    struct kern_batch_args *a = malloc(sizeof(*a));
    void **b = blocks_new(g, 1);
    ck_assert_ptr_nonnull(a);
    ck_assert_int_eq(kern_batch_pack(a, &g->lay, &g->e, 0, 1, b, 0, KERN_PACK_GATHER), 0);
    ck_assert_uint_eq(a->h.run, run);
    uint32_t r = a->h.rshift;
    ck_assert_uint_eq(a->h.groups << r, g->lay.block_tokens);
    ck_assert_uint_eq(a->h.steps, g->lay.layers * g->lay.kinds * a->h.groups);
    blocks_free(b, 1);
    free(a);
    return r;
}

/* Small rows: a warp step moves R consecutive tokens of one (block, layer, kind), and pages
 * that R does not divide make a step's tokens cross pages; packed and padded heads, a
 * head_dim of 20 (40-byte head rows, 2-byte accesses, a token's chunk count not a power of
 * two), K only. Every byte the reference's, both directions (run_case). */
START_TEST(test_batch_rows_per_step)
{
    struct eng g;
    eng_init(&g, 2, 2, 16, 1, 64, 2, 12, 8, 64, 11); /* 128-byte rows, pages of 12: runs of 4 */
    ck_assert_uint_eq(batch_rshift(&g, 1), 2);
    run_case(&g, 3, 5);
    eng_fini(&g);
    eng_init(&g, 3, 2, 32, 2, 128, 2, 5, 16, 128, 12); /* 512-byte rows, pages of 5: runs of 1 */
    ck_assert_uint_eq(batch_rshift(&g, 1), 0);
    run_case(&g, 3, 2);
    eng_fini(&g);
    eng_init(&g, 2, 2, 16, 2, 32, 2, 7, 12, 40, 13); /* padded heads: R = 16, pages of 7 */
    ck_assert_uint_eq(batch_rshift(&g, 0), 4);
    run_case(&g, 2, 3);
    eng_fini(&g);
    eng_init(&g, 2, 2, 32, 2, 20, 2, 6, 16, 21, 14); /* D = 20, heads 21 apart: R = 16 */
    ck_assert_uint_eq(batch_rshift(&g, 0), 4);
    run_case(&g, 1, 2);
    eng_fini(&g);
    eng_init(&g, 3, 1, 32, 1, 20, 2, 3, 24, 22, 15); /* K only, 40-byte rows 44 apart: R = 32 */
    ck_assert_uint_eq(batch_rshift(&g, 0), 5);
    run_case(&g, 2, 2);
    eng_fini(&g);
}
END_TEST

/* Rows whose R token rows would pass 2 KiB: R stops below the block's tokens (768-byte rows:
 * R = 2), or stays 1 (2 KiB and 2.5 KiB rows); blocks of 12 tokens allow R = 4 at most. */
START_TEST(test_batch_rows_per_step_cap)
{
    struct eng g;
    eng_init(&g, 2, 2, 16, 3, 128, 2, 16, 6, 136, 21);
    ck_assert_uint_eq(batch_rshift(&g, 0), 1);
    run_case(&g, 5, 3);
    eng_fini(&g);
    eng_init(&g, 2, 2, 8, 8, 128, 2, 16, 3, 136, 22);
    ck_assert_uint_eq(batch_rshift(&g, 0), 0);
    run_case(&g, 8, 2);
    eng_fini(&g);
    eng_init(&g, 2, 1, 8, 4, 160, 4, 3, 8, 168, 23);
    ck_assert_uint_eq(batch_rshift(&g, 0), 0);
    run_case(&g, 1, 2);
    eng_fini(&g);
    eng_init(&g, 2, 2, 12, 1, 8, 2, 5, 10, 9, 24); /* 16-byte rows, 12 tokens: R = 4 */
    ck_assert_uint_eq(batch_rshift(&g, 0), 2);
    run_case(&g, 7, 3);
    eng_fini(&g);
}
END_TEST

/* The batches a split hands to run: how many, their blocks and first tokens. */
struct split_rec {
    uint32_t n, nblocks[8];
    uint64_t first[8];
};

static int split_rec_run(const struct kern_batch_args *a, void *arg)
{
    struct split_rec *s = arg;
    ck_assert_uint_lt(s->n, 8);
    ck_assert_uint_le(a->h.steps, KERN_BATCH_MAX_STEPS);
    ck_assert_uint_le((uint64_t)a->h.off0 + (uint64_t)a->h.nblocks * a->h.block_tokens, UINT32_MAX);
    s->nblocks[s->n] = a->h.nblocks;
    s->first[s->n++] = a->h.first_token;
    return 0;
}

/* Batches whose step count, or whose tokens counted from the slice's first page, do not fit
 * the kernel's 32-bit indices are split by the host (the batches are built, not run: the
 * tensors they describe would be terabytes); the step decomposition is exact at the top of
 * the 32-bit range. */
START_TEST(test_batch_split_32bit)
{
    static void *kp[256], *vp[256], *blk[1024];
    static int32_t table[1024];
    for (uint32_t i = 0; i < 256; i++) {
        kp[i] = (void *)(uintptr_t)(0x100000ull * (i + 1));
        vp[i] = (void *)(uintptr_t)(0x80000000ull + 0x100000ull * i);
    }
    for (uint32_t i = 0; i < 1024; i++) {
        blk[i] = (void *)(uintptr_t)(0x10000000000ull + 0x1000ull * i);
        table[i] = (int32_t)i;
    }
    struct kern_batch_args *a = malloc(sizeof(*a));
    ck_assert_ptr_nonnull(a);
    /* 256 layers, K and V, 2^22-token blocks of 2 KiB rows 4 KiB apart (row steps, R = 1):
     * 2^31 steps a block */
    struct kern_pack_layout lay = {256, 2, 1u << 22, 1, 1024, 2};
    struct kern_pack_engine e = {kp, vp, table, 4, 1u << 22, 1ull << 34, 4096, 2048};
    ck_assert_int_eq(kern_batch_pack(a, &lay, &e, 0, 2, blk, 0, KERN_PACK_GATHER), -E2BIG);
    ck_assert_int_eq(kern_batch_pack(a, &lay, &e, 0, 1, blk, 0, KERN_PACK_GATHER), 0);
    ck_assert_uint_eq(a->h.steps, 1u << 31);
    struct kern_batch_at at;
    kern_batch_step_at(&a->h, (1u << 31) - 1, &at);
    ck_assert_uint_eq(at.bi, 0);
    ck_assert_uint_eq(at.l, 255);
    ck_assert_uint_eq(at.k, 1);
    ck_assert_uint_eq(at.t0, (1u << 22) - 1);
    kern_batch_step_at(&a->h, 3u << 22, &at);
    ck_assert_uint_eq(at.l, 1);
    ck_assert_uint_eq(at.k, 1);
    ck_assert_uint_eq(at.t0, 0);
    struct split_rec rec = {0};
    ck_assert_int_eq(
        kern_pack_batches(a, &lay, &e, 0, 3, blk, KERN_PACK_SCATTER, split_rec_run, &rec), 0);
    ck_assert_uint_eq(rec.n, 3);
    for (uint32_t i = 0; i < 3; i++) {
        ck_assert_uint_eq(rec.nblocks[i], 1);
        ck_assert_uint_eq(rec.first[i], (uint64_t)i << 22);
    }
    /* one layer, 16-byte rows 32 apart (R = 128, few steps), 1024 blocks of 2^22 tokens: 2^32 tokens
     * from the slice's first page, past 32 bits; two batches of 512 fit */
    struct kern_pack_layout lay1 = {1, 1, 1u << 22, 1, 8, 2};
    struct kern_pack_engine e1 = {kp, NULL, table, 1024, 1u << 22, 1ull << 27, 32, 16};
    ck_assert_int_eq(kern_batch_pack(a, &lay1, &e1, 0, 1024, blk, 0, KERN_PACK_GATHER), -E2BIG);
    ck_assert_int_eq(kern_batch_pack(a, &lay1, &e1, 0, 512, blk, 0, KERN_PACK_GATHER), 0);
    ck_assert_uint_eq(a->h.rshift, 7);
    ck_assert_uint_eq(a->h.steps, 512u << 15);
    memset(&rec, 0, sizeof(rec));
    ck_assert_int_eq(
        kern_pack_batches(a, &lay1, &e1, 0, 1024, blk, KERN_PACK_GATHER, split_rec_run, &rec), 0);
    ck_assert_uint_eq(rec.n, 2);
    ck_assert_uint_eq(rec.nblocks[0], 512);
    ck_assert_uint_eq(rec.nblocks[1], 512);
    ck_assert_uint_eq(rec.first[1], 512ull << 22);
    free(a);
}
END_TEST

/* Run steps: a contiguous layout (heads and tokens packed) takes them, a strided one the
 * row steps; every run step's R rows lie on one page (R divides the page and the first
 * token's place in it), and the bytes are the reference's both ways, nothing around them
 * written (run_case), for vLLM's pages of one block, blocks of two pages, pages of three
 * blocks (not a power of two), a prefix starting mid-page, one-byte elements of odd rows,
 * and K only. */
static void runs_case(uint32_t layers, uint32_t kinds, uint32_t T, uint32_t H, uint32_t D,
                      uint32_t E, uint32_t pt, uint32_t npages, uint32_t pad, uint64_t first,
                      uint32_t nblocks, uint32_t want_run)
{
    struct eng g;
    eng_init(&g, layers, kinds, T, H, D, E, pt, npages, pad, 31 + (unsigned)first);
    struct kern_batch_args *a = malloc(sizeof(*a));
    void **b = blocks_new(&g, nblocks);
    ck_assert_ptr_nonnull(a);
    ck_assert_int_eq(kern_pack_contiguous(&g.lay, &g.e), (int)want_run);
    ck_assert_int_eq(kern_batch_pack(a, &g.lay, &g.e, first, nblocks, b, 0, KERN_PACK_SCATTER), 0);
    ck_assert_uint_eq(a->h.run, want_run);
    const uint32_t R = 1u << a->h.rshift;
    ck_assert_uint_eq(a->h.groups * R, T);
    ck_assert_uint_eq(a->h.steps, nblocks * layers * kinds * a->h.groups);
    if (want_run) {
        ck_assert_uint_le((uint64_t)R * H * D * E, KERN_BATCH_RUN_BYTES);
        for (uint32_t st = 0; st < a->h.steps; st++) {
            struct kern_batch_at at;
            struct kern_batch_eng e;
            kern_batch_step_at(&a->h, st, &at);
            kern_batch_eng_at(&a->h, a->w, &at, &e);
            ck_assert_msg(e.slot0 + R <= pt, "step %u crosses a page", st);
        }
    }
    blocks_free(b, nblocks);
    free(a);
    run_case(&g, first, nblocks);
    eng_fini(&g);
}

START_TEST(test_batch_runs)
{
    runs_case(2, 2, 16, 2, 64, 2, 16, 8, 64, 0, 4, 1);   /* vLLM: a page a block */
    runs_case(2, 2, 16, 2, 64, 2, 16, 8, 64, 16, 3, 1);  /* from the second page */
    runs_case(2, 2, 32, 2, 64, 2, 16, 12, 64, 8, 3, 1);  /* two pages a block, mid-page start */
    runs_case(3, 2, 16, 1, 128, 2, 48, 4, 128, 0, 5, 1); /* pages of 48 tokens */
    runs_case(2, 2, 8, 3, 5, 1, 8, 6, 5, 0, 4, 1);       /* 15-byte tokens: one-byte accesses */
    runs_case(2, 1, 16, 8, 128, 2, 16, 4, 128, 0, 3, 1); /* K only, 2 KiB rows: runs of 4 */
    runs_case(2, 2, 16, 2, 64, 2, 16, 8, 72, 0, 4, 0);   /* padded heads: rows */
    runs_case(2, 2, 16, 1, 64, 2, 16, 8, 72, 16, 3, 0);  /* one head, padded tokens: rows */
}
END_TEST

/* kern_pack_runs: the pieces of a contiguous layout, one per (block, layer, kind, page),
 * joined across pages that lie next to each other; copying them is the reference's gather
 * and scatter; a NULL block has none; a strided layout, or a piece under min_len, is refused
 * (-ENOTSUP), and more pieces than max -E2BIG. */
START_TEST(test_pack_runs)
{
    struct eng g;
    eng_init(&g, 2, 2, 32, 2, 64, 2, 16, 12, 64, 41); /* blocks of two pages, shuffled */
    const uint32_t n = 4;
    const uint64_t bb = kern_pack_block_bytes(&g.lay), first = 8;
    void **r = blocks_new(&g, n), **c = blocks_new(&g, n);
    void *ep[256], *bp[256];
    uint64_t len[256];
    ck_assert_int_eq(kern_pack_ref(&g.lay, &g.e, first, n, r, KERN_PACK_GATHER), 0);
    /* from token 8: each block's 32 tokens touch three pages (8 + 16 + 8 tokens) */
    ck_assert_int_eq(kern_pack_runs(&g.lay, &g.e, first, n, NULL, 0, NULL, NULL, NULL, 0),
                     n * 2 * 2 * 3);
    int64_t m = kern_pack_runs(&g.lay, &g.e, first, n, c, 0, ep, bp, len, 256);
    ck_assert_int_gt(m, 0);
    ck_assert_int_le(m, n * 2 * 2 * 3);
    uint64_t total = 0;
    for (int64_t i = 0; i < m; i++) {
        memcpy(bp[i], ep[i], len[i]); /* a gather */
        total += len[i];
    }
    ck_assert_uint_eq(total, n * bb);
    for (uint32_t j = 0; j < n; j++)
        ck_assert_mem_eq(r[j], c[j], bb);
    ck_assert_int_eq(kern_pack_runs(&g.lay, &g.e, first, n, c, 0, ep, bp, len, 5), -E2BIG);
    /* 8-token pieces are 2 KiB: min_len above that refuses */
    ck_assert_int_eq(kern_pack_runs(&g.lay, &g.e, first, n, NULL, 2049, NULL, NULL, NULL, 0),
                     -ENOTSUP);
    ck_assert_int_eq(kern_pack_runs(&g.lay, &g.e, first, n, NULL, 2048, NULL, NULL, NULL, 0),
                     n * 12);
    /* a scatter of blocks 0 and 2 only, into a cleared engine: theirs land, 1 and 3 not */
    for (uint32_t l = 0; l < 2; l++) {
        memset(g.k[l], 0, g.tensor_bytes);
        memset(g.v[l], 0, g.tensor_bytes);
    }
    void *sel[4] = {r[0], NULL, r[2], NULL};
    m = kern_pack_runs(&g.lay, &g.e, first, n, sel, 0, ep, bp, len, 256);
    ck_assert_int_gt(m, 0);
    ck_assert_int_le(m, 2 * 2 * 2 * 3); /* pages next to each other joined */
    for (int64_t i = 0; i < m; i++)
        memcpy(ep[i], bp[i], len[i]);
    void **back = blocks_new(&g, n);
    ck_assert_int_eq(kern_pack_ref(&g.lay, &g.e, first, n, back, KERN_PACK_GATHER), 0);
    ck_assert_mem_eq(back[0], r[0], bb);
    ck_assert_mem_eq(back[2], r[2], bb);
    ck_assert_int_ne(memcmp(back[1], r[1], bb), 0);
    ck_assert_int_ne(memcmp(back[3], r[3], bb), 0);
    blocks_free(back, n);
    /* pages next to each other in order (an identity table): one piece per section */
    for (uint32_t i = 0; i < g.npages; i++)
        g.table[i] = (int32_t)i;
    ck_assert_int_eq(kern_pack_runs(&g.lay, &g.e, 0, n, c, 0, ep, bp, len, 256), n * 2 * 2);
    for (uint32_t i = 0; i < n * 4; i++)
        ck_assert_uint_eq(len[i], bb / 4);
    blocks_free(r, n);
    blocks_free(c, n);
    eng_fini(&g);
    /* strided: padded heads, or one head with padded tokens */
    eng_init(&g, 2, 2, 16, 2, 64, 2, 16, 4, 72, 42);
    ck_assert_int_eq(kern_pack_runs(&g.lay, &g.e, 0, 2, NULL, 0, NULL, NULL, NULL, 0), -ENOTSUP);
    eng_fini(&g);
    eng_init(&g, 2, 2, 16, 1, 64, 2, 16, 4, 72, 43);
    ck_assert_int_eq(kern_pack_runs(&g.lay, &g.e, 0, 2, NULL, 0, NULL, NULL, NULL, 0), -ENOTSUP);
    eng_fini(&g);
}
END_TEST

/* ---- decoding into the engine's tensors ------------------------------------------------ */

/* kern_decode_batches' run: the batch on the CPU. */
static int run_cpu_cb(const struct kern_batch_args *a, void *arg)
{
    (void)arg;
    kern_batch_run_cpu(a);
    return 0;
}

/* decode_case's runs with the hints of KIVI and ROT blocks too (test_decode_hint_kernels) */
static int decode_hint_runs;

/* kern_decode_batches with a codecs hint into fresh tensors of tb bytes a layer (eng's table
 * and strides): the reference's bytes (eng's tensors), and kivik, rotk and lrm pieces by the
 * KIVI key, ROT key and LOWRANK/MERGE rounds. */
static void decode_hinted_lrm(const struct kern_layout *kl, uint32_t lf, uint32_t lc,
                              const struct kern_pack_engine *eng, uint32_t nblocks,
                              const void **src, const uint64_t *len, uint32_t out, uint64_t tb,
                              uint32_t hint, uint64_t kivik, uint64_t rotk, uint64_t lrm)
{
    void *k[8], *v[8];
    for (uint32_t l = 0; l < lc; l++) {
        k[l] = malloc(tb);
        v[l] = malloc(tb);
        memset(k[l], 0x3c, tb);
        memset(v[l], 0x3c, tb);
    }
    struct kern_pack_engine e = *eng;
    e.k = k;
    e.v = eng->v ? v : NULL;
    struct kern_batch_args *ba = malloc(sizeof(*ba));
    ck_assert_ptr_nonnull(ba);
    kern_batch_kivik_pieces = kern_batch_rotk_pieces = kern_batch_lrm_pieces = 0;
    ck_assert_int_eq(
        kern_decode_batches(ba, kl, lf, lc, &e, 5, nblocks, src, len, out, hint, run_cpu_cb, NULL),
        0);
    free(ba);
    ck_assert_msg(kern_batch_kivik_pieces == kivik && kern_batch_rotk_pieces == rotk &&
                      kern_batch_lrm_pieces == lrm,
                  "hint %#x: %llu / %llu / %llu pieces by the KIVI / ROT key and LOWRANK / MERGE "
                  "rounds, want %llu / %llu / %llu",
                  hint, (unsigned long long)kern_batch_kivik_pieces,
                  (unsigned long long)kern_batch_rotk_pieces,
                  (unsigned long long)kern_batch_lrm_pieces, (unsigned long long)kivik,
                  (unsigned long long)rotk, (unsigned long long)lrm);
    for (uint32_t l = 0; l < lc; l++) {
        ck_assert_msg(memcmp(eng->k[l], k[l], tb) == 0, "hint %#x layer %u K", hint, lf + l);
        if (eng->v)
            ck_assert_msg(memcmp(eng->v[l], v[l], tb) == 0, "hint %#x layer %u V", hint, lf + l);
        free(k[l]);
        free(v[l]);
    }
}

static void decode_hinted(const struct kern_layout *kl, uint32_t lf, uint32_t lc,
                          const struct kern_pack_engine *eng, uint32_t nblocks, const void **src,
                          const uint64_t *len, uint32_t out, uint64_t tb, uint32_t hint,
                          uint64_t kivik, uint64_t rotk)
{
    decode_hinted_lrm(kl, lf, lc, eng, nblocks, src, len, out, tb, hint, kivik, rotk, 0);
}

/* A decode case: blocks of layout kl encoded under codec (layer 0 raw where there are
 * several layers), each `place` bytes past a 64-byte boundary (0: aligned as device staging
 * and pool slots are; else the decoder's narrower loads), ending where its allocation ends,
 * an engine of fp16/bf16 tensors in pages (shuffled, padded heads where pad > dim), decoded
 * for layers [lf, lf+lc) by the batches and by the reference. */
static void decode_case_at(uint32_t layers, uint32_t heads, uint32_t dim, uint32_t tokens,
                           uint32_t dtype, uint32_t k_only, uint32_t codec, uint32_t out,
                           uint32_t page_tokens, uint32_t pad, uint32_t lf, uint32_t lc,
                           uint32_t nblocks, unsigned seed, const uint8_t *raw_heads,
                           uint32_t place)
{
    struct kern_layout kl = {layers, heads, dim, tokens, dtype, k_only};
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec == KERN_CODEC_RAW ? KERN_CODEC_Q8_0 : codec, 0);
    if (layers > 1)
        rec.codec[0][0] = KERN_CODEC_RAW;
    rec.raw_heads = raw_heads; /* [layers * heads], or NULL */
    int64_t es = kern_encoded_size(&kl, &rec);
    ck_assert_int_gt(es, 0);
    uint64_t rs = kern_raw_size(&kl);
    uint16_t *raw = malloc(rs);
    const void **src = calloc(nblocks, sizeof(void *));
    void **mem = calloc(nblocks, sizeof(void *));
    uint64_t *len = calloc(nblocks, sizeof(uint64_t));
    srand(seed);
    for (uint32_t b = 0; b < nblocks; b++) {
        for (uint64_t i = 0; i < rs / 2; i++) {
            float x = (float)(rand() % 2001 - 1000) / 250.0f;
            raw[i] = dtype == KERN_DTYPE_BF16 ? kern_f2bf(x) : kern_f2h(x);
        }
        raw[3] = dtype == KERN_DTYPE_FP16 ? 0x7e01 : 0x7fc1; /* a NaN: raw sections keep it */
        void *e = malloc((size_t)es);
        ck_assert_int_eq(kern_encode_ref(&kl, &rec, raw, e, (size_t)es, NULL), es);
        ck_assert_int_eq(posix_memalign(&mem[b], 64, (size_t)es + place), 0);
        memcpy((uint8_t *)mem[b] + place, e, (size_t)es);
        free(e);
        src[b] = (uint8_t *)mem[b] + place;
        len[b] = (uint64_t)es;
    }
    /* the engine: pages of page_tokens, heads pad elements apart */
    uint32_t kinds = k_only ? 1 : 2, ntok = tokens * nblocks + 5;
    uint32_t npages = (ntok + page_tokens - 1) / page_tokens;
    uint64_t hs = 2ull * pad, ts = hs * heads, ps = ts * page_tokens, tb = ps * npages;
    int32_t *table = malloc(npages * sizeof(int32_t));
    /* a permutation of the pages (reversed, then rotated by 2): no two tokens share a page
     * slot, so the order in which the device's warps write cannot matter */
    for (uint32_t i = 0; i < npages; i++)
        table[i] = (int32_t)((npages - 1 - i + 2) % npages);
    void *ka[8], *va[8], *kb[8], *vb[8];
    for (uint32_t l = 0; l < lc; l++) {
        ka[l] = malloc(tb);
        kb[l] = malloc(tb);
        va[l] = malloc(tb);
        vb[l] = malloc(tb);
        memset(ka[l], 0x3c, tb);
        memset(kb[l], 0x3c, tb);
        memset(va[l], 0x3c, tb);
        memset(vb[l], 0x3c, tb);
    }
    struct kern_pack_engine ea = {ka, k_only ? NULL : va, table, npages, page_tokens, ps, ts, hs};
    struct kern_pack_engine eb = ea;
    eb.k = kb;
    eb.v = k_only ? NULL : vb;
    ck_assert_int_eq(kern_pack_decode_ref(&kl, lf, lc, &ea, 5, nblocks, src, len, out), 0);
    kern_batch_kivik_pieces = kern_batch_rotk_pieces = 0;
    ck_assert_int_eq(kern_pack_decode_cpu(&kl, lf, lc, &eb, 5, nblocks, src, len, out), 0);
    /* every piece of a KIVI key section (raw heads too) went by the KIVI key rounds, every
     * piece of a ROT key section by the ROT key rounds */
    uint64_t kpieces = 0;
    for (uint32_t l = lf; l < lf + lc; l++)
        if (layers == 1 || l != 0)
            kpieces += (uint64_t)nblocks * tokens * heads * ((dim + 7) / 8);
    const int is_kivi = codec == KERN_CODEC_KIVI2 || codec == KERN_CODEC_KIVI4;
    const int is_rot = codec == KERN_CODEC_ROT2 || codec == KERN_CODEC_ROT4;
    const uint64_t kivik = is_kivi ? kpieces : 0, rotk = is_rot ? kpieces : 0;
    ck_assert_msg(kern_batch_kivik_pieces == kivik,
                  "codec %u: %llu pieces by the KIVI key rounds, want %llu", codec,
                  (unsigned long long)kern_batch_kivik_pieces, (unsigned long long)kivik);
    ck_assert_msg(kern_batch_rotk_pieces == rotk,
                  "codec %u: %llu pieces by the ROT key rounds, want %llu", codec,
                  (unsigned long long)kern_batch_rotk_pieces, (unsigned long long)rotk);
    /* the batches told no block is KIVI or ROT (a q8_0 hint, as libkvc gives for q8_0 hits):
     * the kernel without the column rounds, the same bytes for every codec; with
     * decode_hint_runs (test_decode_hint_kernels) also told the blocks' own codec (libkvc
     * passes its hits' formats: a kernel with their rounds, every key piece that way) and, for
     * ROT blocks, KIVI4 (the kernel without the ROT key rounds: ROT keys by the generic ones) */
    if (decode_hint_runs && (is_kivi || is_rot))
        decode_hinted(&kl, lf, lc, &ea, nblocks, src, len, out, tb, 1u << codec, kivik, rotk);
    if (decode_hint_runs && is_rot)
        decode_hinted(&kl, lf, lc, &ea, nblocks, src, len, out, tb, 1u << KERN_CODEC_KIVI4, 0, 0);
    /* LOWRANK and MERGE blocks told their own codec (libkvc's hint for such hits): the kernel
     * with their rounds, every LOWRANK key piece and every MERGE piece (both kinds) that way,
     * raw heads too; LOWRANK's q8_0 values by the fast or generic rounds */
    if (codec == KERN_CODEC_LOWRANK || codec == KERN_CODEC_MERGE) {
        /* layer 0's values keep the codec where its keys are raw */
        const uint64_t vpieces = (uint64_t)lc * nblocks * tokens * heads * ((dim + 7) / 8);
        decode_hinted_lrm(&kl, lf, lc, &ea, nblocks, src, len, out, tb, 1u << codec, 0, 0,
                          kpieces + (codec == KERN_CODEC_MERGE && kinds == 2 ? vpieces : 0));
    }
    decode_hinted(&kl, lf, lc, &ea, nblocks, src, len, out, tb, 1u << KERN_CODEC_Q8_0, 0, 0);
    for (uint32_t l = 0; l < lc; l++) {
        ck_assert_msg(memcmp(ka[l], kb[l], tb) == 0, "codec %u layer %u K", codec, lf + l);
        if (kinds == 2)
            ck_assert_msg(memcmp(va[l], vb[l], tb) == 0, "codec %u layer %u V", codec, lf + l);
        free(ka[l]);
        free(kb[l]);
        free(va[l]);
        free(vb[l]);
    }
    for (uint32_t b = 0; b < nblocks; b++)
        free(mem[b]);
    free(mem);
    free(src);
    free(len);
    free(table);
    free(raw);
    (void)kinds;
}

static void decode_case_rh(uint32_t layers, uint32_t heads, uint32_t dim, uint32_t tokens,
                           uint32_t dtype, uint32_t k_only, uint32_t codec, uint32_t out,
                           uint32_t page_tokens, uint32_t pad, uint32_t lf, uint32_t lc,
                           uint32_t nblocks, unsigned seed, const uint8_t *raw_heads)
{
    decode_case_at(layers, heads, dim, tokens, dtype, k_only, codec, out, page_tokens, pad, lf, lc,
                   nblocks, seed, raw_heads, 0);
}

static void decode_case(uint32_t layers, uint32_t heads, uint32_t dim, uint32_t tokens,
                        uint32_t dtype, uint32_t k_only, uint32_t codec, uint32_t out,
                        uint32_t page_tokens, uint32_t pad, uint32_t lf, uint32_t lc,
                        uint32_t nblocks, unsigned seed)
{
    decode_case_rh(layers, heads, dim, tokens, dtype, k_only, codec, out, page_tokens, pad, lf, lc,
                   nblocks, seed, NULL);
}

/* Every codec, straight into vLLM-style pages, fp16 and bf16 out, a layer range. */
START_TEST(test_decode_paged_every_codec)
{
    uint32_t codec = (uint32_t)_i / 2, out = 1 + (uint32_t)_i % 2;
    decode_case(4, 2, 64, 32, KERN_DTYPE_FP16, 0, codec, out, 16, 64, 1, 3, 3, 10 + _i);
    decode_case(3, 2, 128, 16, KERN_DTYPE_BF16, 0, codec, out, 8, 136, 0, 3, 2, 20 + _i);
    /* one head: 256-byte rows, 8 per step, crossing pages of 6 */
    decode_case(2, 1, 128, 16, KERN_DTYPE_FP16, 0, codec, out, 6, 128, 0, 2, 3, 60 + _i);
    /* 32-byte rows: 32 a step (one KIVI key group; 64 would fit 2 KiB), four groups a block */
    decode_case(2, 1, 16, 128, KERN_DTYPE_FP16, 0, codec, out, 48, 16, 0, 2, 2, 70 + _i);
}
END_TEST

/* The rows per step of a decode: R token rows of 2-byte output in 2 KiB, R dividing the
 * block's tokens, at most 32 (a KIVI key group); items (8-element pieces) per token row. */
START_TEST(test_decode_rows_per_step)
{
    static const struct {
        uint32_t layers, heads, dim, tokens, rshift, items;
    } c[] = {{4, 2, 64, 32, 3, 16}, {32, 8, 128, 32, 0, 128}, {2, 2, 20, 32, 4, 6},
             {2, 1, 576, 8, 0, 72}, {3, 1, 128, 24, 3, 16},   {2, 2, 128, 16, 2, 32},
             {2, 1, 16, 128, 5, 2}, {1, 1, 8, 256, 5, 1}};
    struct kern_batch_args *a = malloc(sizeof(*a));
    ck_assert_ptr_nonnull(a);
    uint8_t dst[64];
    const void *src[2] = {dst, dst};
    uint64_t len[2] = {1, 1};
    for (uint32_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        struct kern_layout kl = {c[i].layers, c[i].heads,      c[i].dim,
                                 c[i].tokens, KERN_DTYPE_FP16, 0};
        ck_assert_int_eq(kern_batch_decode_raw(a, &kl, dst, NULL, 2, src, len, KERN_DTYPE_FP16), 0);
        ck_assert_msg(a->h.rshift == c[i].rshift, "case %u: rshift %u", i, a->h.rshift);
        ck_assert_uint_eq(a->h.items, c[i].items);
        ck_assert_uint_eq(a->h.steps, 2 * c[i].layers * 2 * (c[i].tokens >> c[i].rshift));
    }
    free(a);
}
END_TEST

/* A batch with steps to spare (more than 2 x 8,192) takes steps of more rows, up to 8 KiB of
 * output (kern_batch_decode_widen): 32 blocks of 8 layers x 8 heads x 128 dim x 32 tokens
 * (2 KiB rows, one a step alone) take two rows a step, which then cross the pages of 16
 * the prefix starts 5 tokens into; the fast rounds (q8_0, KIVI values), the generic ones
 * (KIVI keys, ROT keys' lane exchange), the LOWRANK and MERGE rounds (two tokens a lane, the
 * second past a page's end) and raw layers decode as the reference does. A small batch keeps
 * its steps. */
START_TEST(test_decode_wide_steps)
{
    static const uint32_t codecs[] = {KERN_CODEC_Q8_0, KERN_CODEC_KIVI4, KERN_CODEC_ROT4,
                                      KERN_CODEC_MERGE, KERN_CODEC_LOWRANK};
    struct kern_layout kl = {8, 8, 128, 32, KERN_DTYPE_FP16, 0};
    struct kern_batch_args *a = malloc(sizeof(*a));
    ck_assert_ptr_nonnull(a);
    uint8_t dst[64];
    const void *src[32];
    uint64_t len[32];
    for (uint32_t j = 0; j < 32; j++) {
        src[j] = dst;
        len[j] = 1;
    }
    ck_assert_int_eq(kern_batch_decode_raw(a, &kl, dst, NULL, 32, src, len, KERN_DTYPE_FP16), 0);
    ck_assert_uint_eq(a->h.rshift, 1);
    ck_assert_uint_eq(a->h.steps, 32 * 8 * 2 * 16);
    ck_assert_int_eq(kern_batch_decode_raw(a, &kl, dst, NULL, 8, src, len, KERN_DTYPE_FP16), 0);
    ck_assert_uint_eq(a->h.rshift, 0);
    free(a);
    decode_case(8, 8, 128, 32, KERN_DTYPE_FP16, 0, codecs[_i], KERN_DTYPE_FP16, 16, 128, 0, 8, 32,
                400 + (unsigned)_i);
}
END_TEST

/* Odd shapes: head_dim not a multiple of 8 (or of 32), tokens not a multiple of 32 (KIVI
 * key groups with a tail), pages that do not divide blocks, K only (MLA: one 576-wide
 * latent), one layer of many. */
/* Every codec that takes shapes of any head_dim (ROT2/ROT4 take powers of two only). */
static const uint32_t odd_codecs[] = {KERN_CODEC_RAW,  KERN_CODEC_Q8_0,  KERN_CODEC_Q4_1,
                                      KERN_CODEC_Q5_1, KERN_CODEC_KIVI2, KERN_CODEC_KIVI4,
                                      KERN_CODEC_FP8,  KERN_CODEC_MERGE, KERN_CODEC_LOWRANK};
#define NODD_CODECS (sizeof(odd_codecs) / sizeof(odd_codecs[0]))

START_TEST(test_decode_paged_odd_shapes)
{
    uint32_t codec = odd_codecs[_i];
    decode_case(2, 3, 20, 40, KERN_DTYPE_FP16, 0, codec, KERN_DTYPE_FP16, 12, 21, 0, 2, 3, 30 + _i);
    decode_case(2, 1, 576, 8, KERN_DTYPE_BF16, 1, codec, KERN_DTYPE_BF16, 16, 576, 1, 1, 2,
                40 + _i);
    decode_case(5, 2, 40, 33, KERN_DTYPE_FP16, 0, codec, KERN_DTYPE_BF16, 7, 48, 4, 1, 2, 50 + _i);
    /* head_dim 20, two heads 21 apart: 80-byte rows, 16 per step, 6 pieces a row (not a
     * power of two), crossing pages of 6 */
    decode_case(2, 2, 20, 32, KERN_DTYPE_FP16, 0, codec, KERN_DTYPE_FP16, 6, 21, 0, 2, 2, 70 + _i);
    /* head_dim 20 in heads 24 apart: 48-byte head rows, so 16-byte stores are allowed (vec
     * 16) while a row's last piece has 4 elements, stored one by one */
    decode_case(2, 3, 20, 32, KERN_DTYPE_FP16, 0, codec, KERN_DTYPE_FP16, 8, 24, 0, 2, 2, 80 + _i);
}
END_TEST

/* ROT keys are decoded by the lanes of a head row together (D / 8 lanes, the Walsh-Hadamard
 * stages of length >= 8 across them) and LOWRANK keys a piece per lane with the rank's factors
 * loaded once: bit for bit the reference's, for every head_dim ROT takes (8: one lane a row,
 * no exchange; 16, 32, 64, 128; 256: the whole warp a row), rounds that hold several heads and
 * several tokens (R > 1, 5 heads of 16: 10 pieces a token), tokens crossing pages inside a
 * round, padded heads (vec 16 and element stores), K only, bf16 in and out, and raw heads
 * (the appendix) beside rotated heads in one round; LOWRANK also at head_dims that are not
 * powers of two (20: a last piece of 4, 40, 96, 100). MERGE at the same shapes: LOWRANK and
 * MERGE go by their column rounds where hinted (decode_case_at), a lane's column through the
 * step, from one lane a row (head_dim 8) to 32 lanes (256), several tokens a lane where the
 * row has fewer than 32 pieces, tokens crossing pages. */
static const struct {
    uint32_t layers, heads, dim, tokens, dtype, k_only, out, page_tokens, pad, nblocks;
} rot_shapes[] = {
    {2, 3, 8, 32, KERN_DTYPE_FP16, 0, KERN_DTYPE_FP16, 7, 8, 2},
    {2, 5, 16, 32, KERN_DTYPE_FP16, 0, KERN_DTYPE_BF16, 7, 16, 3},
    {3, 2, 32, 16, KERN_DTYPE_BF16, 0, KERN_DTYPE_BF16, 5, 33, 2},
    {2, 4, 64, 32, KERN_DTYPE_FP16, 0, KERN_DTYPE_FP16, 16, 72, 2},
    {2, 2, 128, 24, KERN_DTYPE_FP16, 0, KERN_DTYPE_FP16, 6, 129, 2},
    {2, 8, 128, 32, KERN_DTYPE_BF16, 0, KERN_DTYPE_FP16, 16, 128, 2},
    {2, 2, 256, 16, KERN_DTYPE_FP16, 0, KERN_DTYPE_BF16, 5, 256, 3},
    {2, 1, 256, 8, KERN_DTYPE_BF16, 1, KERN_DTYPE_BF16, 3, 264, 2},
};
#define NROT_SHAPES (sizeof(rot_shapes) / sizeof(rot_shapes[0]))
static const uint32_t rot_codecs[] = {KERN_CODEC_ROT2, KERN_CODEC_ROT4, KERN_CODEC_LOWRANK,
                                      KERN_CODEC_MERGE};
#define NROT_CODECS (sizeof(rot_codecs) / sizeof(rot_codecs[0]))

START_TEST(test_decode_rot_lowrank_shapes)
{
    const uint32_t codec = rot_codecs[(uint32_t)_i / NROT_SHAPES];
    const uint32_t i = (uint32_t)_i % NROT_SHAPES;
    uint8_t mask[64] = {0};
    mask[1] = 1;                                             /* layer 0, head 1 */
    mask[rot_shapes[i].heads + rot_shapes[i].heads - 1] = 1; /* layer 1, the last head */
    for (uint32_t rh = 0; rh < 2; rh++)
        decode_case_rh(rot_shapes[i].layers, rot_shapes[i].heads, rot_shapes[i].dim,
                       rot_shapes[i].tokens, rot_shapes[i].dtype, rot_shapes[i].k_only, codec,
                       rot_shapes[i].out, rot_shapes[i].page_tokens, rot_shapes[i].pad, 0,
                       rot_shapes[i].layers, rot_shapes[i].nblocks, 90 + (unsigned)_i,
                       rh ? mask : NULL);
    if (codec == KERN_CODEC_LOWRANK || codec == KERN_CODEC_MERGE) {
        decode_case(2, 3, 20, 40, KERN_DTYPE_FP16, 0, codec, KERN_DTYPE_FP16, 12, 21, 0, 2, 3,
                    95 + (unsigned)_i);
        decode_case(2, 2, 40, 32, KERN_DTYPE_BF16, 0, codec, KERN_DTYPE_FP16, 6, 40, 0, 2, 2,
                    96 + (unsigned)_i);
        decode_case(2, 2, 96, 16, KERN_DTYPE_FP16, 0, codec, KERN_DTYPE_BF16, 5, 96, 0, 2, 2,
                    97 + (unsigned)_i);
        decode_case_rh(2, 3, 100, 32, KERN_DTYPE_FP16, 0, codec, KERN_DTYPE_FP16, 7, 101, 0, 2, 2,
                       98 + (unsigned)_i, mask);
    }
}
END_TEST

/* kern_decode_batches' run that records the batches' table words, then runs each on the CPU */
static uint32_t words_runs, words_max;

static int run_cpu_words_cb(const struct kern_batch_args *a, void *arg)
{
    (void)arg;
    words_runs++;
    words_max = a->h.nwords > words_max ? a->h.nwords : words_max;
    kern_batch_run_cpu(a);
    return 0;
}

/* The LOWRANK/MERGE kernel is built for the small parameter block alone (kern_pack.cu): a
 * prefix under that hint whose tables would take more (120 blocks of 8 layers: 256 words
 * and more) is decoded in batches that fit it, every LOWRANK key piece by their rounds, the
 * reference's bytes; under a q8_0 hint the same prefix stays one batch. */
START_TEST(test_decode_lrm_small_params)
{
    struct kern_layout kl = {8, 1, 16, 8, KERN_DTYPE_FP16, 0};
    const uint32_t nb = 120, npages = nb + 1;
    struct kern_recipe rec;
    kern_recipe_fill(&rec, KERN_CODEC_LOWRANK, KERN_CODEC_LOWRANK, 0);
    const int64_t es = kern_encoded_size(&kl, &rec);
    ck_assert_int_gt(es, 0);
    const uint64_t rs = kern_raw_size(&kl);
    uint16_t *raw = malloc(rs);
    uint8_t *e = malloc((size_t)es);
    srand(321);
    for (uint64_t x = 0; x < rs / 2; x++)
        raw[x] = kern_f2h((float)(rand() % 2001 - 1000) / 250.0f);
    ck_assert_int_eq(kern_encode_ref(&kl, &rec, raw, e, (size_t)es, NULL), es);
    const void *src[120];
    uint64_t len[120];
    for (uint32_t j = 0; j < nb; j++) {
        src[j] = e;
        len[j] = (uint64_t)es;
    }
    int32_t table[121];
    for (uint32_t i = 0; i < npages; i++)
        table[i] = (int32_t)(npages - 1 - i);
    const uint64_t ts = 2ull * 16, ps = ts * 8, tb = ps * npages;
    void *ka[8], *va[8], *kb[8], *vb[8];
    for (uint32_t l = 0; l < 8; l++) {
        ka[l] = calloc(1, tb);
        va[l] = calloc(1, tb);
        kb[l] = malloc(tb);
        vb[l] = malloc(tb);
    }
    struct kern_pack_engine ea = {ka, va, table, npages, 8, ps, ts, ts};
    struct kern_pack_engine eb = {kb, vb, table, npages, 8, ps, ts, ts};
    ck_assert_int_eq(kern_pack_decode_ref(&kl, 0, 8, &ea, 5, nb, src, len, KERN_DTYPE_FP16), 0);
    struct kern_batch_args *ba = malloc(sizeof(*ba));
    for (uint32_t hint = 0; hint < 2; hint++) {
        for (uint32_t l = 0; l < 8; l++) {
            memset(kb[l], 0, tb);
            memset(vb[l], 0, tb);
        }
        words_runs = words_max = 0;
        kern_batch_lrm_pieces = 0;
        ck_assert_int_eq(kern_decode_batches(ba, &kl, 0, 8, &eb, 5, nb, src, len, KERN_DTYPE_FP16,
                                             1u << (hint ? KERN_CODEC_Q8_0 : KERN_CODEC_LOWRANK),
                                             run_cpu_words_cb, NULL),
                         0);
        if (hint == 0) {
            ck_assert_uint_ge(words_runs, 2);
            ck_assert_uint_le(words_max, KERN_BATCH_SMALL_WORDS);
            ck_assert_uint_eq(kern_batch_lrm_pieces, (uint64_t)nb * 8 * 8 * 2);
        } else {
            ck_assert_uint_eq(words_runs, 1);
            ck_assert_uint_gt(words_max, KERN_BATCH_SMALL_WORDS);
            ck_assert_uint_eq(kern_batch_lrm_pieces, 0);
        }
        for (uint32_t l = 0; l < 8; l++) {
            ck_assert_msg(memcmp(ka[l], kb[l], tb) == 0, "hint %u layer %u K", hint, l);
            ck_assert_msg(memcmp(va[l], vb[l], tb) == 0, "hint %u layer %u V", hint, l);
        }
    }
    for (uint32_t l = 0; l < 8; l++) {
        free(ka[l]);
        free(va[l]);
        free(kb[l]);
        free(vb[l]);
    }
    free(ba);
    free(e);
    free(raw);
}
END_TEST

/* kern_batch_h8_nan, the device's test before it converts 8 fp16 values by the conversion
 * instruction (whose NaN would lose kern_h2f's payload): every fp16 bit pattern, in either
 * half of any of the four words, beside finite values, is a NaN to it exactly when kern_h2f
 * makes a NaN of it; and the device's NaN bits (kern_batch_h2f_nan) are kern_h2f's. */
START_TEST(test_decode_h8_nan)
{
    for (uint32_t h = 0; h < 0x10000u; h++) {
        const int nan = isnan(kern_h2f((uint16_t)h));
        if (nan)
            ck_assert_msg(kern_f2u(kern_batch_h2f_nan(h)) == kern_f2u(kern_h2f((uint16_t)h)),
                          "NaN %#x", h);
        for (uint32_t j = 0; j < 8; j++) {
            uint32_t v[4] = {0x3c00bc00u, 0x7bff7c00u, 0xfc0003ffu, 0x80000001u};
            v[j >> 1] &= j & 1 ? 0x0000ffffu : 0xffff0000u;
            v[j >> 1] |= j & 1 ? h << 16 : h;
            ck_assert_msg((kern_batch_h8_nan(v) != 0) == nan, "half %#x at %u", h, j);
        }
    }
}
END_TEST

/* The hint (kern_decode_batches' codecs) chooses the decode kernel: a KIVI block's own codec
 * the kernel with the KIVI key rounds, a ROT block's the one with the KIVI and ROT key rounds,
 * every key piece by them (raw heads too); a ROT block hinted KIVI4, or any block hinted
 * q8_0, a kernel without its rounds: the generic rounds, the same bytes. */
static const uint32_t hint_codecs[] = {KERN_CODEC_KIVI2, KERN_CODEC_KIVI4, KERN_CODEC_ROT2,
                                       KERN_CODEC_ROT4};

START_TEST(test_decode_hint_kernels)
{
    const uint32_t codec = hint_codecs[_i];
    uint8_t mask[8] = {0, 0, 0, 0, 1, 0, 0, 0}; /* layer 1, head 1 */
    decode_hint_runs = 1;
    decode_case_rh(2, 3, 16, 32, KERN_DTYPE_FP16, 0, codec, KERN_DTYPE_FP16, 7, 16, 0, 2, 2,
                   500 + (unsigned)_i, mask);
    decode_case(2, 4, 64, 32, KERN_DTYPE_BF16, 0, codec, KERN_DTYPE_FP16, 16, 72, 0, 2, 2,
                510 + (unsigned)_i);
    decode_hint_runs = 0;
}
END_TEST

/* The decoder's loads (kern_batch_ld) are as wide as the format lets them be: from a block
 * aligned as device staging and pool slots are, each field in accesses of its alignment
 * (sections start 16-byte aligned; q8_0's codes 2 (34-byte groups), q4_1's 4, q5_1's 8, fp8's
 * 8, a MERGE row 4 with 32 tokens (its 4-byte bitmap before the rows), raw, KIVI, ROT and
 * LOWRANK rows 16); from a block 1 byte off, byte accesses only (the fallback: the device
 * would fault on a wider one); 2, 4 or 8 off, at most that. Bit for bit the reference every
 * time, raw heads (the appendix) too. The emulation faults on an access not aligned to its
 * width, as the device does. */
static const uint32_t ld_widest[KERN_CODEC_COUNT] = {
    [KERN_CODEC_RAW] = 16,  [KERN_CODEC_Q8_0] = 2,     [KERN_CODEC_Q4_1] = 4,
    [KERN_CODEC_Q5_1] = 8,  [KERN_CODEC_KIVI2] = 16,   [KERN_CODEC_KIVI4] = 16,
    [KERN_CODEC_FP8] = 8,   [KERN_CODEC_ROT2] = 16,    [KERN_CODEC_ROT4] = 16,
    [KERN_CODEC_MERGE] = 4, [KERN_CODEC_LOWRANK] = 16,
};
static const uint32_t ld_places[] = {0, 1, 2, 4, 8, 3};
#define NLD_PLACES (sizeof(ld_places) / sizeof(ld_places[0]))

static uint32_t ld_count_widest(enum kern_batch_ld_what what)
{
    uint32_t w = 0;
    for (uint32_t i = 0; i < 5; i++)
        if (kern_batch_ld_count[what][i])
            w = 1u << i;
    return w;
}

START_TEST(test_decode_load_widths)
{
    const uint32_t codec = (uint32_t)_i / NLD_PLACES, place = ld_places[_i % NLD_PLACES];
    const uint32_t al = place ? place & (0u - place) : 16;
    const uint32_t want = ld_widest[codec] < al ? ld_widest[codec] : al;
    memset(kern_batch_ld_count, 0, sizeof(kern_batch_ld_count));
    decode_case_at(1, 2, 64, 32, KERN_DTYPE_FP16, 0, codec, KERN_DTYPE_BF16, 16, 64, 0, 1, 3,
                   200 + (unsigned)_i, NULL, place);
    const uint32_t got = ld_count_widest(KERN_BATCH_LD_DATA);
    ck_assert_msg(got == want, "codec %u at +%u: widest load %u, want %u", codec, place, got, want);
    if (want > 1) /* every field of these shapes has an even size and offset */
        ck_assert_uint_eq(kern_batch_ld_count[KERN_BATCH_LD_DATA][0], 0);
    /* the header in 16-byte accesses where the block allows, its section descriptor (12
     * bytes) in 4-byte ones */
    ck_assert_uint_eq(ld_count_widest(KERN_BATCH_LD_HDR), al);
    /* two layers (layer 0 raw), a raw head in each, both kinds, fp16 out */
    const uint8_t mask[4] = {0, 1, 1, 0};
    memset(kern_batch_ld_count, 0, sizeof(kern_batch_ld_count));
    decode_case_at(2, 2, 64, 32, KERN_DTYPE_BF16, 0, codec, KERN_DTYPE_FP16, 16, 72, 0, 2, 2,
                   300 + (unsigned)_i, mask, place);
    ck_assert_uint_eq(ld_count_widest(KERN_BATCH_LD_DATA), al);
}
END_TEST

/* The decode of one block into one raw block (kern_decode_cuda's batch) is the reference
 * decoder's output; a block that is not one of the layout decodes to zeros there (the
 * device cannot return an error), where the reference says -EBADMSG. */
START_TEST(test_decode_raw_batch)
{
    struct kern_layout kl = {3, 2, 64, 32, KERN_DTYPE_FP16, 0};
    struct kern_recipe rec;
    kern_recipe_fill(&rec, KERN_CODEC_KIVI4, KERN_CODEC_Q4_1, 1);
    int64_t es = kern_encoded_size(&kl, &rec);
    uint64_t rs = kern_raw_size(&kl);
    uint16_t *raw = malloc(rs);
    uint8_t *enc = malloc((size_t)es), *d1 = malloc(2 * rs), *d2 = malloc(2 * rs);
    for (uint64_t i = 0; i < rs / 2; i++)
        raw[i] = kern_f2h((float)((int)(i * 37 % 301) - 150) / 40.0f);
    ck_assert_int_eq(kern_encode_ref(&kl, &rec, raw, enc, (size_t)es, NULL), es);
    ck_assert_int_eq(kern_decode_ref(&kl, enc, (size_t)es, d1, rs, KERN_DTYPE_BF16), (int64_t)rs);
    struct kern_batch_args *a = malloc(sizeof(*a));
    const void *src[2] = {enc, enc};
    uint64_t len[2] = {(uint64_t)es, (uint64_t)es};
    uint32_t pos[2] = {1, 0};
    memset(d2, 0x77, 2 * rs);
    ck_assert_int_eq(kern_batch_decode_raw(a, &kl, d2, pos, 2, src, len, KERN_DTYPE_BF16), 0);
    kern_batch_run_cpu(a);
    ck_assert_mem_eq(d2, d1, rs);
    ck_assert_mem_eq(d2 + rs, d1, rs);
    /* a corrupt header: zeros from the batch, -EBADMSG from the reference */
    enc[0] ^= 0xff;
    memset(d2, 0x77, rs);
    ck_assert_int_eq(kern_batch_decode_raw(a, &kl, d2, NULL, 1, src, len, KERN_DTYPE_BF16), 0);
    kern_batch_run_cpu(a);
    for (uint64_t i = 0; i < rs; i++)
        ck_assert_uint_eq(d2[i], 0);
    ck_assert_int_eq(kern_decode_ref(&kl, enc, (size_t)es, d1, rs, KERN_DTYPE_BF16), -EBADMSG);
    /* a length that cuts the last section: zeros for the rows that would read past it */
    enc[0] ^= 0xff;
    len[0] = (uint64_t)es - 16;
    ck_assert_int_eq(kern_batch_decode_raw(a, &kl, d2, NULL, 1, src, len, KERN_DTYPE_BF16), 0);
    kern_batch_run_cpu(a);
    free(a);
    free(raw);
    free(enc);
    free(d1);
    free(d2);
}
END_TEST

/* A section that claims a codec its layout cannot take (ROT at a head_dim that is not a power
 * of two in 8..256, LOWRANK with min(tokens, head_dim) over 64) has size 0 there; the batched
 * decoder refuses it (zeros for its rows, the other sections as the reference decodes them)
 * instead of decoding ROT rows wider than a warp's lanes or LOWRANK heads past the block. */
START_TEST(test_decode_bad_section_size)
{
    static const struct {
        uint32_t heads, dim, tokens, k_only, codec;
    } c[] = {{1, 576, 8, 1, KERN_CODEC_ROT2},
             {2, 20, 32, 0, KERN_CODEC_ROT4},
             {2, 96, 72, 0, KERN_CODEC_LOWRANK}};
    for (uint32_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        struct kern_layout kl = {2,           c[i].heads,      c[i].dim,
                                 c[i].tokens, KERN_DTYPE_FP16, c[i].k_only};
        struct kern_recipe rec;
        kern_recipe_fill(&rec, KERN_CODEC_Q8_0, KERN_CODEC_Q8_0, 0);
        ck_assert(!kern_codec_supports(&kl, c[i].codec));
        int64_t es = kern_encoded_size(&kl, &rec);
        uint64_t rs = kern_raw_size(&kl);
        uint16_t *raw = malloc(rs);
        uint8_t *enc = malloc((size_t)es), *d1 = malloc(rs), *d2 = malloc(rs);
        for (uint64_t j = 0; j < rs / 2; j++)
            raw[j] = kern_f2h((float)((int)(j * 37 % 301) - 150) / 40.0f);
        ck_assert_int_eq(kern_encode_ref(&kl, &rec, raw, enc, (size_t)es, NULL), es);
        ck_assert_int_eq(kern_decode_ref(&kl, enc, (size_t)es, d1, rs, KERN_DTYPE_FP16),
                         (int64_t)rs);
        /* layer 1's K section: that codec, size 0 */
        struct kern_block_sect sect;
        uint8_t *sp = enc + sizeof(struct kern_block_hdr) + kern_kinds(&kl) * sizeof(sect);
        memcpy(&sect, sp, sizeof(sect));
        sect.codec = (uint8_t)c[i].codec;
        sect.bytes = 0;
        memcpy(sp, &sect, sizeof(sect));
        struct kern_batch_args *a = malloc(sizeof(*a));
        const void *src[1] = {enc};
        uint64_t len[1] = {(uint64_t)es};
        memset(d2, 0x77, rs);
        ck_assert_int_eq(kern_batch_decode_raw(a, &kl, d2, NULL, 1, src, len, KERN_DTYPE_FP16), 0);
        kern_batch_run_cpu(a);
        const uint64_t k1 = 2 * kern_raw_index(&kl, 1, 0, 0, 0);
        const uint64_t kb = 2ull * kl.tokens * kl.heads * kl.head_dim;
        ck_assert_mem_eq(d2, d1, k1);
        for (uint64_t j = k1; j < k1 + kb; j++)
            ck_assert_msg(d2[j] == 0, "case %u: byte %llu of layer 1 K", i, (unsigned long long)j);
        ck_assert_mem_eq(d2 + k1 + kb, d1 + k1 + kb, rs - k1 - kb);
        free(a);
        free(raw);
        free(enc);
        free(d1);
        free(d2);
    }
}
END_TEST

/* A block in memory a client can write (a host arena slot, a pool slot it gathers into):
 * whatever its section table says, past the checks of kern_batch_sect (the layout's header,
 * the codec's exact size, inside the block's length), the decode reads nothing outside the
 * block and writes nothing outside its rows. Every codec in both kinds (the fast rounds'
 * forms and the generic ones), each section at any offset, the V section ending on the
 * block's last byte (an exact allocation: ASan sees a read one past it), decodes as the same
 * bytes do at an aligned offset; the emulation faults on an access its address does not
 * align. Then random bytes over the header and table of such blocks: no read outside. Each
 * block ends on a page the process may not read, so a read past it faults with or without
 * ASan. */
static uint32_t hostile_rand(uint32_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return *x;
}

/* len bytes ending on a page the process may not read (a read past them faults without
 * ASan too); hostile_free gives them back. */
static uint8_t *hostile_alloc(uint64_t len)
{
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), n = (len + pg - 1) / pg * pg;
    uint8_t *m = mmap(NULL, n + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(m, MAP_FAILED);
    ck_assert_int_eq(mprotect(m + n, pg, PROT_NONE), 0);
    return m + n - len;
}

static void hostile_free(uint8_t *b, uint64_t len)
{
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), n = (len + pg - 1) / pg * pg;
    if (b)
        munmap(b + len - n, n + pg);
}

/* A LOWRANK or MERGE block's batch told its codec, as libkvc tells it: the kernel with the
 * LOWRANK and MERGE rounds (kern_batch_decode_raw's batch has the KIVI and ROT key rounds). */
static void hostile_hint(struct kern_batch_args *a, uint32_t codec)
{
    if (codec == KERN_CODEC_LOWRANK || codec == KERN_CODEC_MERGE)
        a->h.kivik = kern_decode_cols(1u << codec);
}

/* A block of layout kl with both sections codec c at offsets hdr + place (K) and right after
 * it (V), payload bytes from seed; *len its length. NULL where c has no size there. */
static uint8_t *hostile_block(const struct kern_layout *kl, uint32_t c, uint32_t place,
                              uint32_t seed, uint64_t *len)
{
    const uint64_t kb = kern_sect_bytes(kl, c, 0), vb = kern_sect_bytes(kl, c, 1);
    const uint32_t hb = kern_hdr_bytes(kl);
    struct kern_recipe rec;
    if (!kb || !vb)
        return NULL;
    kern_recipe_fill(&rec, KERN_CODEC_Q8_0, KERN_CODEC_Q8_0, 0);
    *len = hb + place + kb + vb;
    uint8_t *b = hostile_alloc(*len);
    ck_assert_uint_gt(kern_hdr_build(kl, &rec, b), 0);
    struct kern_block_sect s[2] = {{hb + place, (uint32_t)kb, (uint8_t)c, {0}},
                                   {(uint32_t)(hb + place + kb), (uint32_t)vb, (uint8_t)c, {0}}};
    memcpy(b + sizeof(struct kern_block_hdr), s, sizeof(s));
    memset(b + hb, 0x5a, place);
    for (uint64_t i = 0; i < kb + vb; i++)
        b[hb + place + i] = (uint8_t)hostile_rand(&seed);
    return b;
}

START_TEST(test_decode_hostile_sections)
{
    static const struct kern_layout lays[] = {{1, 2, 40, 8, KERN_DTYPE_FP16, 0},
                                              {1, 3, 64, 4, KERN_DTYPE_BF16, 0}};
    static const uint32_t places[] = {0, 1, 2, 3, 4, 6, 8, 12};
    uint32_t seed = 0x9e3779b9u, fuzzed = 0;
    for (uint32_t li = 0; li < sizeof(lays) / sizeof(lays[0]); li++) {
        const struct kern_layout *kl = &lays[li];
        const uint64_t rs = kern_raw_size(kl);
        uint8_t *d0 = malloc(rs), *d1 = malloc(rs);
        struct kern_batch_args *a = malloc(sizeof(*a));
        for (uint32_t c = 0; c < KERN_CODEC_COUNT; c++) {
            uint64_t len0, len;
            uint8_t *b0 = hostile_block(kl, c, 0, 77 + c, &len0);
            if (!b0)
                continue;
            const void *src[1] = {b0};
            memset(d0, 0x77, rs);
            ck_assert_int_eq(kern_batch_decode_raw(a, kl, d0, NULL, 1, src, &len0, kl->dtype), 0);
            hostile_hint(a, c);
            kern_batch_run_cpu(a);
            for (uint32_t pi = 1; pi < sizeof(places) / sizeof(places[0]); pi++) {
                uint8_t *b = hostile_block(kl, c, places[pi], 77 + c, &len);
                src[0] = b;
                memset(d1, 0x33, rs);
                ck_assert_int_eq(kern_batch_decode_raw(a, kl, d1, NULL, 1, src, &len, kl->dtype),
                                 0);
                hostile_hint(a, c);
                kern_batch_run_cpu(a);
                ck_assert_msg(memcmp(d0, d1, rs) == 0, "layout %u codec %u at +%u", li, c,
                              places[pi]);
                /* random bytes over its header and table, the payload left; every other
                 * time a raw-head appendix (the header's reserved word: its offset and
                 * count) anywhere in the block */
                const uint32_t hb = kern_hdr_bytes(kl);
                uint8_t *h0 = malloc(hb);
                memcpy(h0, b, hb);
                for (uint32_t it = 0; it < 64; it++) {
                    memcpy(b, h0, hb);
                    for (uint32_t f = 0, nf = 1 + hostile_rand(&seed) % 4; f < nf; f++)
                        b[sizeof(struct kern_block_hdr) +
                          hostile_rand(&seed) % (hb - sizeof(struct kern_block_hdr))] =
                            (uint8_t)hostile_rand(&seed);
                    if (it & 1) {
                        const uint32_t rh = hostile_rand(&seed) % (uint32_t)len;
                        const uint32_t rcnt = hostile_rand(&seed) % 3;
                        memcpy(b + offsetof(struct kern_block_hdr, reserved), &rh, 4);
                        memcpy(b + offsetof(struct kern_block_hdr, reserved) + 4, &rcnt, 4);
                    }
                    ck_assert_int_eq(
                        kern_batch_decode_raw(a, kl, d1, NULL, 1, src, &len, kl->dtype), 0);
                    hostile_hint(a, c);
                    kern_batch_run_cpu(a);
                    fuzzed++;
                }
                free(h0);
                hostile_free(b, len);
            }
            hostile_free(b0, len0);
        }
        free(a);
        free(d0);
        free(d1);
    }
    ck_assert_uint_gt(fuzzed, 0);
}
END_TEST

/* The KIVI and ROT key rounds (kern_batch_kivik_lane, kern_batch_rotk_rounds) and the LOWRANK
 * and MERGE rounds (kern_batch_lrm_lane) against hostile blocks with a raw-head appendix: KIVI,
 * ROT, MERGE and LOWRANK blocks (ROT at the power-of-two head_dims)
 * encoded with raw heads (several key groups and a partial last one, a head_dim
 * not a multiple of 8, a K-only layout), each ending on a page the process may not read, the
 * decoded rows too; then random slot-table entries (0, in range, past the count), appendix
 * offsets and counts near the block's end and bytes over the header and section table: the
 * decode reads nothing outside the block and writes nothing outside its rows. */
START_TEST(test_decode_hostile_kivi_raw_heads)
{
    static const struct kern_layout lays[] = {{1, 3, 12, 48, KERN_DTYPE_FP16, 0},
                                              {2, 2, 16, 64, KERN_DTYPE_BF16, 1},
                                              {1, 2, 40, 8, KERN_DTYPE_FP16, 0},
                                              {1, 1, 8, 256, KERN_DTYPE_FP16, 0}};
    uint32_t seed = 0x2545f491u, fuzzed = 0;
    struct kern_batch_args *a = malloc(sizeof(*a));
    for (uint32_t li = 0; li < sizeof(lays) / sizeof(lays[0]); li++) {
        const struct kern_layout *kl = &lays[li];
        const uint64_t rs = kern_raw_size(kl);
        const uint32_t lh = kl->layers * kl->heads;
        uint8_t rh_mask[16] = {0};
        for (uint32_t i = 0; i < lh; i += 2)
            rh_mask[i] = 1; /* every other head raw */
        uint16_t *raw = malloc(rs);
        for (uint64_t i = 0; i < rs / 2; i++)
            raw[i] = kern_f2h((float)(hostile_rand(&seed) % 2001) / 500.0f - 2.0f);
        static const uint32_t codecs[] = {KERN_CODEC_KIVI2, KERN_CODEC_KIVI4,
                                          KERN_CODEC_ROT2,  KERN_CODEC_ROT4,
                                          KERN_CODEC_MERGE, KERN_CODEC_LOWRANK};
        for (uint32_t ci = 0; ci < sizeof(codecs) / sizeof(codecs[0]); ci++) {
            const uint32_t c = codecs[ci];
            if (!kern_codec_supports(kl, c))
                continue; /* ROT at a head_dim that is not a power of two */
            struct kern_recipe rec;
            kern_recipe_fill(&rec, c, c, 0);
            rec.raw_heads = rh_mask;
            const int64_t es = kern_encoded_size(kl, &rec);
            ck_assert_int_gt(es, 0);
            uint64_t len = (uint64_t)es;
            uint8_t *e = malloc(len), *b = hostile_alloc(len), *d = hostile_alloc(rs);
            ck_assert_int_eq(kern_encode_ref(kl, &rec, raw, e, len, NULL), es);
            uint64_t r0;
            memcpy(&r0, e + offsetof(struct kern_block_hdr, reserved), 8);
            const uint32_t rh0 = (uint32_t)r0, rcnt0 = (uint32_t)(r0 >> 32);
            ck_assert_uint_gt(rh0, 0);
            ck_assert_uint_gt(rcnt0, 0);
            const void *src[1] = {b};
            for (uint32_t it = 0; it < 256; it++) {
                memcpy(b, e, len);
                const uint32_t what = it % 4;
                if (what == 0 || what == 3) /* slot table entries: 0, in range, past it */
                    for (uint32_t i = 0; i < lh; i++) {
                        const uint16_t v = (uint16_t)(hostile_rand(&seed) % (rcnt0 + 3));
                        memcpy(b + rh0 + 2 * i, &v, 2);
                    }
                if (what == 1 || what == 3) { /* the appendix elsewhere, more heads */
                    const uint32_t rh = (uint32_t)(len - hostile_rand(&seed) % (len / 2 + 1));
                    const uint32_t rcnt = 1 + hostile_rand(&seed) % (rcnt0 + 2);
                    memcpy(b + offsetof(struct kern_block_hdr, reserved), &rh, 4);
                    memcpy(b + offsetof(struct kern_block_hdr, reserved) + 4, &rcnt, 4);
                }
                if (what == 2) { /* the header and section table */
                    const uint32_t hb = kern_hdr_bytes(kl);
                    for (uint32_t f = 0, nf = 1 + hostile_rand(&seed) % 4; f < nf; f++)
                        b[sizeof(struct kern_block_hdr) +
                          hostile_rand(&seed) % (hb - sizeof(struct kern_block_hdr))] =
                            (uint8_t)hostile_rand(&seed);
                }
                ck_assert_int_eq(kern_batch_decode_raw(a, kl, d, NULL, 1, src, &len, kl->dtype), 0);
                hostile_hint(a, c);
                kern_batch_run_cpu(a);
                fuzzed++;
            }
            /* the block as encoded decodes as the reference does */
            memcpy(b, e, len);
            uint8_t *want = malloc(rs);
            ck_assert_int_eq(kern_decode_cpu(kl, b, len, want, rs, kl->dtype), (int64_t)rs);
            ck_assert_int_eq(kern_batch_decode_raw(a, kl, d, NULL, 1, src, &len, kl->dtype), 0);
            hostile_hint(a, c);
            kern_batch_run_cpu(a);
            ck_assert_msg(memcmp(d, want, rs) == 0, "layout %u codec %u", li, c);
            free(want);
            free(e);
            hostile_free(b, len);
            hostile_free(d, rs);
        }
        free(raw);
    }
    free(a);
    ck_assert_uint_gt(fuzzed, 0);
}
END_TEST

/* Arguments the decode refuses: layer ranges, dtypes, tables. */
START_TEST(test_decode_bad_args)
{
    struct kern_layout kl = {2, 1, 32, 16, KERN_DTYPE_FP16, 0};
    int32_t table[2] = {0, 1};
    uint8_t t0[4096], t1[4096];
    void *k[2] = {t0, t1}, *v[2] = {t1, t0};
    struct kern_pack_engine e = {k, v, table, 2, 16, 1024, 64, 64};
    const void *src[1] = {t0};
    uint64_t len[1] = {sizeof(t0)};
    ck_assert_int_eq(kern_pack_decode_cpu(&kl, 0, 0, &e, 0, 1, src, len, 1), -EINVAL);
    ck_assert_int_eq(kern_pack_decode_cpu(&kl, 1, 2, &e, 0, 1, src, len, 1), -EINVAL);
    ck_assert_int_eq(kern_pack_decode_cpu(&kl, 2, 1, &e, 0, 1, src, len, 1), -EINVAL);
    ck_assert_int_eq(kern_pack_decode_cpu(&kl, 0, 2, &e, 0, 1, src, len, 3), -EINVAL);
    ck_assert_int_eq(kern_pack_decode_cpu(&kl, 0, 2, &e, 32, 1, src, len, 1), -EINVAL);
    ck_assert_int_eq(kern_pack_decode_cpu(&kl, 0, 2, &e, 0, 1, src, len, 1), -EBADMSG);
    ck_assert_int_eq(kern_pack_decode_ref(&kl, 0, 2, &e, 0, 1, src, len, 1), -EBADMSG);
    table[1] = -1;
    ck_assert_int_eq(kern_pack_decode_ref(&kl, 0, 2, &e, 16, 1, src, len, 1), -EINVAL);
}
END_TEST

#if KVC_CUDA
/* The CUDA twin against the CPU, bit for bit, both directions. */
static void cuda_case(struct eng *g, uint64_t first, uint32_t nblocks)
{
    uint64_t bb = kern_pack_block_bytes(&g->lay);
    uint32_t L = g->lay.layers;
    void **host = blocks_new(g, nblocks), **dev_blocks = calloc(nblocks, sizeof(void *));
    void *dk[8] = {0}, *dv[8] = {0}, *out = malloc(bb);
    ck_assert_int_eq(kern_pack_cpu(&g->lay, &g->e, first, nblocks, host, KERN_PACK_GATHER), 0);
    for (uint32_t l = 0; l < L; l++) {
        ck_assert_int_eq(kern_cuda_alloc(&dk[l], g->tensor_bytes), 0);
        ck_assert_int_eq(kern_cuda_copy(dk[l], g->k[l], g->tensor_bytes, KERN_CUDA_H2D, NULL), 0);
        if (g->v[l]) {
            ck_assert_int_eq(kern_cuda_alloc(&dv[l], g->tensor_bytes), 0);
            ck_assert_int_eq(kern_cuda_copy(dv[l], g->v[l], g->tensor_bytes, KERN_CUDA_H2D, NULL),
                             0);
        }
    }
    for (uint32_t i = 0; i < nblocks; i++)
        ck_assert_int_eq(kern_cuda_alloc(&dev_blocks[i], bb), 0);
    /* host arrays of device pointers: the kernel takes its tables by value */
    struct kern_pack_engine de = g->e;
    de.k = dk;
    de.v = g->lay.kinds == 2 ? dv : NULL;
    ck_assert_int_eq(
        kern_pack_cuda(&g->lay, &de, first, nblocks, dev_blocks, KERN_PACK_GATHER, NULL), 0);
    ck_assert_int_eq(kern_cuda_stream_sync(NULL), 0);
    for (uint32_t i = 0; i < nblocks; i++) {
        kern_cuda_copy(out, dev_blocks[i], bb, KERN_CUDA_D2H, NULL);
        ck_assert_mem_eq(out, host[i], bb);
    }
    /* scatter into zeroed device tensors, then compare the engine bytes with the CPU's */
    void *cpu_k = malloc(g->tensor_bytes), *gpu_k = malloc(g->tensor_bytes);
    for (uint32_t l = 0; l < L; l++) {
        memset(g->k[l], 0, g->tensor_bytes);
        kern_cuda_copy(dk[l], g->k[l], g->tensor_bytes, KERN_CUDA_H2D, NULL);
        if (g->v[l]) {
            memset(g->v[l], 0, g->tensor_bytes);
            kern_cuda_copy(dv[l], g->v[l], g->tensor_bytes, KERN_CUDA_H2D, NULL);
        }
    }
    ck_assert_int_eq(kern_pack_cpu(&g->lay, &g->e, first, nblocks, host, KERN_PACK_SCATTER), 0);
    ck_assert_int_eq(
        kern_pack_cuda(&g->lay, &de, first, nblocks, dev_blocks, KERN_PACK_SCATTER, NULL), 0);
    ck_assert_int_eq(kern_cuda_stream_sync(NULL), 0);
    for (uint32_t l = 0; l < L; l++) {
        kern_cuda_copy(gpu_k, dk[l], g->tensor_bytes, KERN_CUDA_D2H, NULL);
        ck_assert_mem_eq(gpu_k, g->k[l], g->tensor_bytes);
        if (g->v[l]) {
            kern_cuda_copy(gpu_k, dv[l], g->tensor_bytes, KERN_CUDA_D2H, NULL);
            ck_assert_mem_eq(gpu_k, g->v[l], g->tensor_bytes);
        }
        kern_cuda_free(dk[l]);
        kern_cuda_free(dv[l]);
    }
    for (uint32_t i = 0; i < nblocks; i++)
        kern_cuda_free(dev_blocks[i]);
    free(cpu_k);
    free(gpu_k);
    free(out);
    free(dev_blocks);
    blocks_free(host, nblocks);
}

/* The decode kernel into paged device tensors against the reference, every codec, a layer
 * range, fp16 and bf16 out; the 16-byte store path (aligned, D % 8 == 0) and the element
 * path (D = 20, heads 21 elements apart). */
static void cuda_decode_case(uint32_t layers, uint32_t heads, uint32_t dim, uint32_t tokens,
                             uint32_t codec, uint32_t out, uint32_t pad, uint32_t lf, uint32_t lc,
                             uint32_t nblocks)
{
    struct kern_layout kl = {layers, heads, dim, tokens, KERN_DTYPE_FP16, 0};
    struct kern_recipe rec;
    if (!kern_codec_supports(&kl, (enum kern_codec)codec))
        return; /* ROT2/ROT4 on a head_dim that is not a power of two */
    kern_recipe_fill(&rec, codec, codec == KERN_CODEC_RAW ? KERN_CODEC_Q8_0 : codec, 0);
    rec.codec[0][0] = KERN_CODEC_RAW;
    int64_t es = kern_encoded_size(&kl, &rec);
    uint64_t rs = kern_raw_size(&kl);
    uint16_t *raw = malloc(rs);
    const void *hsrc[8], *dsrc[8];
    uint64_t len[8];
    for (uint32_t b = 0; b < nblocks; b++) {
        for (uint64_t i = 0; i < rs / 2; i++)
            raw[i] = kern_f2h((float)((int)((i + b) * 7919 % 2001) - 1000) / 250.0f);
        void *e = malloc((size_t)es), *d = NULL;
        ck_assert_int_eq(kern_encode_ref(&kl, &rec, raw, e, (size_t)es, NULL), es);
        ck_assert_int_eq(kern_cuda_alloc(&d, (size_t)es), 0);
        ck_assert_int_eq(kern_cuda_copy(d, e, (size_t)es, KERN_CUDA_H2D, NULL), 0);
        hsrc[b] = e;
        dsrc[b] = d;
        len[b] = (uint64_t)es;
    }
    uint32_t pt = 16, ntok = tokens * nblocks, npages = (ntok + pt - 1) / pt;
    uint64_t hs = 2ull * pad, ts = hs * heads, ps = ts * pt, tb = ps * npages;
    int32_t table[256];
    /* a permutation of the pages (reversed, then rotated by 2): no two tokens share a page
     * slot, so the order in which the device's warps write cannot matter */
    for (uint32_t i = 0; i < npages; i++)
        table[i] = (int32_t)((npages - 1 - i + 2) % npages);
    void *hk[8], *hv[8], *dk[8], *dv[8], *back = malloc(tb);
    for (uint32_t l = 0; l < lc; l++) {
        hk[l] = malloc(tb);
        hv[l] = malloc(tb);
        memset(hk[l], 0x3c, tb);
        memset(hv[l], 0x3c, tb);
        ck_assert_int_eq(kern_cuda_alloc(&dk[l], tb), 0);
        ck_assert_int_eq(kern_cuda_alloc(&dv[l], tb), 0);
        ck_assert_int_eq(kern_cuda_copy(dk[l], hk[l], tb, KERN_CUDA_H2D, NULL), 0);
        ck_assert_int_eq(kern_cuda_copy(dv[l], hv[l], tb, KERN_CUDA_H2D, NULL), 0);
    }
    struct kern_pack_engine he = {hk, hv, table, npages, pt, ps, ts, hs}, de = he;
    de.k = dk;
    de.v = dv;
    ck_assert_int_eq(kern_pack_decode_ref(&kl, lf, lc, &he, 0, nblocks, hsrc, len, out), 0);
    /* the format hint: the block's own (a KIVI codec's kernel with the KIVI key rounds, a ROT
     * codec's with the KIVI and ROT ones, LOWRANK's and MERGE's with their rounds) for fp16
     * out, q8_0's for bf16 (the kernel without them, whatever the blocks) */
    const uint32_t hint = out == KERN_DTYPE_FP16 ? 1u << codec : 1u << KERN_CODEC_Q8_0;
    ck_assert_int_eq(
        kern_pack_decode_cuda(&kl, lf, lc, &de, 0, nblocks, dsrc, len, out, hint, NULL), 0);
    ck_assert_int_eq(kern_cuda_stream_sync(NULL), 0);
    for (uint32_t l = 0; l < lc; l++) {
        ck_assert_int_eq(kern_cuda_copy(back, dk[l], tb, KERN_CUDA_D2H, NULL), 0);
        ck_assert_int_eq(kern_cuda_stream_sync(NULL), 0);
        ck_assert_msg(memcmp(back, hk[l], tb) == 0, "codec %u layer %u K", codec, lf + l);
        ck_assert_int_eq(kern_cuda_copy(back, dv[l], tb, KERN_CUDA_D2H, NULL), 0);
        ck_assert_int_eq(kern_cuda_stream_sync(NULL), 0);
        ck_assert_msg(memcmp(back, hv[l], tb) == 0, "codec %u layer %u V", codec, lf + l);
        free(hk[l]);
        free(hv[l]);
        kern_cuda_free(dk[l]);
        kern_cuda_free(dv[l]);
    }
    for (uint32_t b = 0; b < nblocks; b++) {
        free((void *)hsrc[b]);
        kern_cuda_free((void *)dsrc[b]);
    }
    free(back);
    free(raw);
}

START_TEST(test_cuda_decode_paged)
{
    for (uint32_t codec = 0; codec < KERN_CODEC_COUNT; codec++)
        for (uint32_t out = KERN_DTYPE_FP16; out <= KERN_DTYPE_BF16; out++) {
            cuda_decode_case(4, 2, 128, 32, codec, out, 128, 1, 3, 3);
            cuda_decode_case(3, 3, 20, 40, codec, out, 21, 0, 3, 2);
        }
}
END_TEST

START_TEST(test_cuda_vs_cpu)
{
    struct eng g;
    eng_init(&g, 3, 2, 32, 4, 64, 2, 16, 12, 64, 1);
    cuda_case(&g, 32, 4);
    eng_fini(&g);
    eng_init(&g, 2, 2, 8, 3, 5, 1, 12, 8, 7, 3);
    cuda_case(&g, 4, 9);
    eng_fini(&g);
    eng_init(&g, 4, 1, 16, 1, 24, 4, 16, 6, 24, 4);
    cuda_case(&g, 16, 4);
    eng_fini(&g);
}
END_TEST
#endif

static Suite *pack_suite(void)
{
    Suite *s = suite_create("pack");
    TCase *tc = tcase_create("cpu");
    tcase_add_test(tc, test_vllm_paged);
    tcase_add_test(tc, test_contiguous);
    tcase_add_test(tc, test_odd_shapes);
    tcase_add_test(tc, test_bad_args);
    suite_add_tcase(s, tc);
    TCase *tb = tcase_create("batch");
    tcase_add_test(tb, test_batch_layer_range);
    tcase_add_test(tb, test_batch_access_width);
    tcase_add_test(tb, test_batch_split);
    tcase_add_test(tb, test_batch_rows_per_step);
    tcase_add_test(tb, test_batch_rows_per_step_cap);
    tcase_add_test(tb, test_batch_split_32bit);
    tcase_add_test(tb, test_batch_runs);
    tcase_add_test(tb, test_pack_runs);
    tcase_add_loop_test(tb, test_decode_paged_every_codec, 0, 2 * KERN_CODEC_COUNT);
    tcase_add_loop_test(tb, test_decode_paged_odd_shapes, 0, (int)NODD_CODECS);
    tcase_add_loop_test(tb, test_decode_wide_steps, 0, 5);
    tcase_add_loop_test(tb, test_decode_rot_lowrank_shapes, 0, (int)(NROT_CODECS * NROT_SHAPES));
    tcase_add_test(tb, test_decode_h8_nan);
    tcase_add_test(tb, test_decode_lrm_small_params);
    tcase_add_loop_test(tb, test_decode_hint_kernels, 0,
                        (int)(sizeof(hint_codecs) / sizeof(hint_codecs[0])));
    tcase_add_loop_test(tb, test_decode_load_widths, 0, (int)(KERN_CODEC_COUNT * NLD_PLACES));
    tcase_add_test(tb, test_decode_raw_batch);
    tcase_add_test(tb, test_decode_bad_section_size);
    tcase_add_test(tb, test_decode_hostile_sections);
    tcase_add_test(tb, test_decode_hostile_kivi_raw_heads);
    tcase_add_test(tb, test_decode_rows_per_step);
    tcase_add_test(tb, test_decode_bad_args);
    suite_add_tcase(s, tb);
#if KVC_CUDA
    if (daemon_cuda_devices() > 0) { /* asked in a child: CUDA starts in the case only */
        TCase *tg = tcase_create("cuda");
        tcase_add_test(tg, test_cuda_vs_cpu);
        tcase_add_test(tg, test_cuda_decode_paged);
        suite_add_tcase(s, tg);
    } else {
        const char *why =
            daemon_cuda_devices() < 0 ? "the CUDA probe died" : "no CUDA device found";
        printf("SKIP: pack: test_cuda_vs_cpu: %s\n", why);
        printf("SKIP: pack: test_cuda_decode_paged: %s\n", why);
    }
#else
    printf("SKIP: pack: test_cuda_vs_cpu: built without CUDA\n");
    printf("SKIP: pack: test_cuda_decode_paged: built without CUDA\n");
#endif
    return s;
}

int main(void)
{
    return daemon_suite_run(pack_suite());
}
