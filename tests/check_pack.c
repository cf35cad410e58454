/*
 * check_pack.c — gather/scatter between engine page layouts and kvcd's canonical block
 * layout: the reference against hand-written expectations for vLLM-style paged tensors and
 * contiguous tensors, the CPU version against the reference, round trips, the argument
 * checks, and the CUDA twin against the CPU where a device is found.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern.h"
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
    uint64_t idx = (((uint64_t)page * g->e.page_tokens + slot) * g->lay.heads + h) * g->head_pad + d;
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
                            ck_assert_msg(memcmp(c, eng_elem(g, b, first, l, k, t, h, d),
                                                 L->elem_bytes) == 0,
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

#if KVC_CUDA
/* The CUDA twin against the CPU, bit for bit, both directions. */
static void cuda_case(struct eng *g, uint64_t first, uint32_t nblocks)
{
    uint64_t bb = kern_pack_block_bytes(&g->lay);
    uint32_t L = g->lay.layers;
    void **host = blocks_new(g, nblocks), **dev_blocks = calloc(nblocks, sizeof(void *));
    void *dk[8] = {0}, *dv[8] = {0}, *d_k_arr, *d_v_arr, *d_blk_arr, *d_table, *out = malloc(bb);
    ck_assert_int_eq(kern_pack_cpu(&g->lay, &g->e, first, nblocks, host, KERN_PACK_GATHER), 0);
    for (uint32_t l = 0; l < L; l++) {
        ck_assert_int_eq(kern_cuda_alloc(&dk[l], g->tensor_bytes), 0);
        ck_assert_int_eq(kern_cuda_copy(dk[l], g->k[l], g->tensor_bytes, KERN_CUDA_H2D, NULL), 0);
        if (g->v[l]) {
            ck_assert_int_eq(kern_cuda_alloc(&dv[l], g->tensor_bytes), 0);
            ck_assert_int_eq(kern_cuda_copy(dv[l], g->v[l], g->tensor_bytes, KERN_CUDA_H2D, NULL), 0);
        }
    }
    for (uint32_t i = 0; i < nblocks; i++)
        ck_assert_int_eq(kern_cuda_alloc(&dev_blocks[i], bb), 0);
    ck_assert_int_eq(kern_cuda_alloc(&d_k_arr, sizeof(dk)), 0);
    ck_assert_int_eq(kern_cuda_alloc(&d_v_arr, sizeof(dv)), 0);
    ck_assert_int_eq(kern_cuda_alloc(&d_blk_arr, nblocks * sizeof(void *)), 0);
    ck_assert_int_eq(kern_cuda_alloc(&d_table, sizeof(g->table)), 0);
    kern_cuda_copy(d_k_arr, dk, sizeof(dk), KERN_CUDA_H2D, NULL);
    kern_cuda_copy(d_v_arr, dv, sizeof(dv), KERN_CUDA_H2D, NULL);
    kern_cuda_copy(d_blk_arr, dev_blocks, nblocks * sizeof(void *), KERN_CUDA_H2D, NULL);
    kern_cuda_copy(d_table, g->table, sizeof(g->table), KERN_CUDA_H2D, NULL);
    struct kern_pack_engine de = g->e;
    de.k = d_k_arr;
    de.v = g->lay.kinds == 2 ? d_v_arr : NULL;
    de.block_table = d_table;
    ck_assert_int_eq(kern_pack_cuda(&g->lay, &de, first, nblocks, d_blk_arr, KERN_PACK_GATHER, NULL), 0);
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
    ck_assert_int_eq(kern_pack_cuda(&g->lay, &de, first, nblocks, d_blk_arr, KERN_PACK_SCATTER, NULL), 0);
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
    kern_cuda_free(d_k_arr);
    kern_cuda_free(d_v_arr);
    kern_cuda_free(d_blk_arr);
    kern_cuda_free(d_table);
    free(cpu_k);
    free(gpu_k);
    free(out);
    free(dev_blocks);
    blocks_free(host, nblocks);
}

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
#if KVC_CUDA
    if (daemon_cuda_devices() > 0) { /* asked in a child: CUDA starts in the case only */
        TCase *tg = tcase_create("cuda");
        tcase_add_test(tg, test_cuda_vs_cpu);
        suite_add_tcase(s, tg);
    } else {
        printf("SKIP: pack: test_cuda_vs_cpu: %s\n",
               daemon_cuda_devices() < 0 ? "the CUDA probe died" : "no CUDA device found");
    }
#else
    printf("SKIP: pack: test_cuda_vs_cpu: built without CUDA\n");
#endif
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(pack_suite());
    fflush(stdout);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
