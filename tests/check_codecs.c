/*
 * check_codecs.c — the transform codecs (ROT2/ROT4, MERGE, LOWRANK; kernels/kern_ext.h):
 * every CPU path and the CUDA kernels' indexing (their CPU emulation: the encoder's units and
 * the batched decoder's rows) give the reference's bytes, on ordinary, outlier-structured
 * and non-finite input, fp16 and bf16, K+V and K-only; each codec keeps its error bound on
 * the data it is for; a rotation lowers 4-bit key error on keys with outlier channels
 * (measured against KIVI on the same blocks); a merged block decodes each token to its run's
 * mean and a low-rank block to the rank its energy asks. With a GPU the device's bytes are
 * the reference's too.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kern.h"
#include "kernels/kern_batch.h"
#include "kernels/kern_cpu.h"
#include "kernels/kern_ext.h"
#include "kernels/kern_fmt.h"
#include "kernels/kern_pack.h"
#include "tests/lib/daemon.h"
#include "tests/lib/rng.h"

enum data_kind {
    DATA_OUTLIER = 0, /* Gaussian, keys with a few large outlier channels (docs/kernels.md) */
    DATA_RUNS,        /* runs of 1-6 near-identical tokens (repetitive text) */
    DATA_LOWRANK,     /* keys of rank 3 plus a little noise */
};

static void put(const struct kern_layout *lay, uint16_t *b, uint64_t i, float v)
{
    b[i] = lay->dtype == KERN_DTYPE_BF16 ? kern_f2bf(v) : kern_f2h(v);
}

static uint16_t *make_data(const struct kern_layout *lay, enum data_kind kind, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 7;
    uint16_t *b = malloc(kern_raw_size(lay));
    const uint32_t kinds = lay->k_only ? 1 : 2, T = lay->tokens, D = lay->head_dim;
    float *base = malloc(sizeof(float) * D * 4);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_nonnull(base);
    for (uint32_t l = 0; l < lay->layers; l++)
        for (uint32_t k = 0; k < kinds; k++)
            for (uint32_t h = 0; h < lay->heads; h++) {
                for (uint32_t i = 0; i < 4 * D; i++)
                    base[i] = rng_gauss(&s);
                /* the run lengths of a head are the same in its K and V */
                uint64_t runs_rng = seed * 31 + l * 7919 + h * 104729 + 1;
                uint32_t left = 0;
                float coef[3] = {0, 0, 0};
                for (uint32_t t = 0; t < T; t++) {
                    if (kind == DATA_RUNS && left == 0) {
                        left = 1 + (uint32_t)(rng_next(&runs_rng) % 6);
                        for (uint32_t d = 0; d < D; d++)
                            base[d] = rng_gauss(&s) + (k == 0 && d % 29 == 3 ? 8.0f : 0.0f);
                    }
                    for (int c = 0; c < 3; c++)
                        coef[c] = rng_gauss(&s);
                    for (uint32_t d = 0; d < D; d++) {
                        float v;
                        if (kind == DATA_RUNS)
                            v = base[d] + 0.01f * rng_gauss(&s);
                        else if (kind == DATA_LOWRANK && k == 0)
                            v = coef[0] * base[D + d] + coef[1] * base[2 * D + d] +
                                0.5f * coef[2] * base[3 * D + d] + 0.003f * rng_gauss(&s);
                        else {
                            v = rng_gauss(&s);
                            if (k == 0 && (d * 7 + h) % 29 == 3)
                                v = v * 0.5f + 12.0f;
                        }
                        put(lay, b, kern_raw_index(lay, l, k, t, h) + d, v);
                    }
                    if (left)
                        left--;
                }
            }
    free(base);
    return b;
}

/* sqrt(sum (x - y)^2 / sum x^2) of section (l, k) of raw a against decoded b. */
static double sect_err(const struct kern_layout *lay, const uint16_t *a, const uint16_t *b,
                       uint32_t l, uint32_t k)
{
    double num = 0, den = 0;
    uint64_t base = kern_raw_index(lay, l, k, 0, 0);
    uint64_t n = (uint64_t)lay->tokens * lay->heads * lay->head_dim;
    for (uint64_t i = 0; i < n; i++) {
        double x = kern_sanitize(kern_load(a, lay->dtype, base + i));
        double y = kern_load(b, lay->dtype, base + i);
        num += (x - y) * (x - y);
        den += x * x;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

struct shape {
    uint32_t layers, heads, dim, tokens, dtype, k_only;
};

/* ROT needs head_dim a power of two (8..256); LOWRANK min(tokens, head_dim) <= 64. */
static const struct shape shapes[] = {
    {2, 2, 128, 32, KERN_DTYPE_FP16, 0}, {1, 3, 64, 16, KERN_DTYPE_BF16, 0},
    {2, 1, 8, 33, KERN_DTYPE_FP16, 0},   {1, 2, 256, 5, KERN_DTYPE_BF16, 0},
    {1, 2, 32, 70, KERN_DTYPE_FP16, 1},  {1, 1, 16, 64, KERN_DTYPE_BF16, 0},
};
#define NSHAPES (sizeof(shapes) / sizeof(shapes[0]))
static const uint32_t codecs[] = {KERN_CODEC_ROT2, KERN_CODEC_ROT4, KERN_CODEC_MERGE,
                                  KERN_CODEC_LOWRANK};
#define NCODECS (sizeof(codecs) / sizeof(codecs[0]))

static struct kern_layout layout_of(const struct shape *sh)
{
    struct kern_layout l = {sh->layers, sh->heads, sh->dim, sh->tokens, sh->dtype, sh->k_only};
    return l;
}

/* Whether this CPU has what ROT's AVX-512 path needs (kern_rot512.c): then the suite runs
 * the CPU paths with it and without it (the AVX2 path). */
static int have_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("f16c");
}

/* Both encoders, the encode kernel's emulation, both decoders (the AVX2 one with and without
 * its FMA build) and the batched decoder's emulation: the reference's bytes; returns the
 * encoded block. */
static uint8_t *same_bytes(const struct kern_layout *lay, const struct kern_recipe *rec,
                           const uint16_t *raw)
{
    int64_t sz = kern_encoded_size(lay, rec);
    uint64_t rs = kern_raw_size(lay);
    ck_assert_int_gt(sz, 0);
    uint8_t *e1 = malloc((size_t)sz), *e2 = malloc((size_t)sz), *e3 = malloc((size_t)sz);
    uint8_t *d1 = malloc(rs), *d2 = malloc(rs), *d3 = malloc(rs);
    struct kern_batch_args *a = malloc(sizeof(*a));
    ck_assert(e1 && e2 && e3 && d1 && d2 && d3 && a);
    memset(e1, 0xa5, (size_t)sz);
    memset(e2, 0x5a, (size_t)sz);
    memset(e3, 0x3c, (size_t)sz); /* every byte written, padding too */
    ck_assert_int_eq(kern_encode_ref(lay, rec, raw, e1, (size_t)sz, NULL), sz);
    ck_assert_int_eq(kern_encode_batched_cpu(lay, rec, raw, e3, (size_t)sz), sz);
    ck_assert_mem_eq(e3, e1, (size_t)sz);
    ck_assert_int_eq(kern_block_info(e1, (size_t)sz, NULL, NULL), sz);
    const void *srcs[1] = {e1};
    uint64_t lens[1] = {(uint64_t)sz};
    /* the CPU paths: ROT's AVX-512 one where the CPU has it (wide), then the AVX2 one */
    for (int wide = have_avx512(); wide >= 0; wide--) {
        const int was = kern_rot_avx512(wide);
        memset(e2, 0x5a, (size_t)sz);
        ck_assert_int_eq(kern_encode_cpu(lay, rec, raw, e2, (size_t)sz, NULL), sz);
        ck_assert_mem_eq(e2, e1, (size_t)sz);
        for (uint32_t out = KERN_DTYPE_FP16; out <= KERN_DTYPE_BF16; out++) {
            memset(d2, 0x5a, rs);
            ck_assert_int_eq(kern_decode_ref(lay, e1, (size_t)sz, d1, rs, out), (int64_t)rs);
            ck_assert_int_eq(kern_decode_cpu(lay, e1, (size_t)sz, d2, rs, out), (int64_t)rs);
            ck_assert_mem_eq(d2, d1, rs);
            if (wide)
                continue;
            /* the AVX2 path as on a CPU without FMA (LOWRANK's product: lr_rows_nofma) */
            const int fma = kern_avx2_fma(0);
            memset(d2, 0x5a, rs);
            ck_assert_int_eq(kern_decode_cpu(lay, e1, (size_t)sz, d2, rs, out), (int64_t)rs);
            kern_avx2_fma(fma);
            ck_assert_mem_eq(d2, d1, rs);
            memset(d3, 0x3c, rs);
            ck_assert_int_eq(kern_batch_decode_raw(a, lay, d3, NULL, 1, srcs, lens, out), 0);
            kern_batch_run_cpu(a);
            ck_assert_mem_eq(d3, d1, rs);
        }
        kern_rot_avx512(was);
    }
    free(a);
    free(e2);
    free(e3);
    free(d1);
    free(d2);
    free(d3);
    return e1;
}

/* Every path gives the reference's bytes, for every codec and shape, on outlier data, on
 * data with NaN and +-Inf, on merge- and low-rank-shaped data; a recipe mixing the codec
 * with raw layers and plain codecs too, and MERGE in a layer's K or V section alone. */
START_TEST(test_paths_same_bytes)
{
    const struct shape *sh = &shapes[(uint32_t)_i / NCODECS];
    const uint32_t codec = codecs[(uint32_t)_i % NCODECS];
    struct kern_layout lay = layout_of(sh);
    struct kern_recipe rec;
    ck_assert(kern_codec_supports(&lay, (enum kern_codec)codec));
    kern_recipe_fill(&rec, codec, codec, 0);
    rec.seed = 0x1234u + (uint32_t)_i;
    for (int kind = DATA_OUTLIER; kind <= DATA_LOWRANK; kind++) {
        uint16_t *raw = make_data(&lay, (enum data_kind)kind, 50 + (uint64_t)_i);
        if (kind == DATA_OUTLIER) {
            raw[2] = lay.dtype == KERN_DTYPE_FP16 ? 0x7c00 : 0x7f80;
            raw[9] = lay.dtype == KERN_DTYPE_FP16 ? 0x7e00 : 0x7fc0;
            raw[lay.head_dim + 1] = lay.dtype == KERN_DTYPE_FP16 ? 0xfbff : 0xff80;
        }
        free(same_bytes(&lay, &rec, raw));
        free(raw);
    }
    if (lay.layers > 1 && !lay.k_only) {
        uint16_t *raw = make_data(&lay, DATA_OUTLIER, 90 + (uint64_t)_i);
        rec.codec[0][0] = KERN_CODEC_RAW;
        rec.codec[0][1] = KERN_CODEC_Q4_1;
        free(same_bytes(&lay, &rec, raw));
        if (codec == KERN_CODEC_MERGE) {
            /* MERGE in one section of a layer: the encoder's MERGE units cover a layer's K
             * and V sections only where both are MERGE (kern_enc_merge_kv) */
            rec.codec[0][0] = KERN_CODEC_MERGE;
            rec.codec[0][1] = KERN_CODEC_Q8_0;
            rec.codec[1][0] = KERN_CODEC_Q4_1;
            rec.codec[1][1] = KERN_CODEC_MERGE;
            free(same_bytes(&lay, &rec, raw));
        }
        free(raw);
    }
}
END_TEST

/* Heads constant over the block's tokens (every centred value +0, signed by the rotation into
 * +0 and -0: a ROT group whose minimum or maximum is zero, where the reference keeps the
 * first of +0 and -0) and heads of zeros, beside ordinary heads: every path gives the
 * reference's bytes. */
START_TEST(test_constant_heads_same_bytes)
{
    const struct shape *sh = &shapes[(uint32_t)_i / NCODECS];
    const uint32_t codec = codecs[(uint32_t)_i % NCODECS];
    struct kern_layout lay = layout_of(sh);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    uint16_t *raw = make_data(&lay, DATA_OUTLIER, 70 + (uint64_t)_i);
    const uint32_t kinds = lay.k_only ? 1 : 2;
    for (uint32_t l = 0; l < lay.layers; l++)
        for (uint32_t k = 0; k < kinds; k++)
            for (uint32_t t = 0; t < lay.tokens; t++)
                for (uint32_t d = 0; d < lay.head_dim; d++) {
                    const uint64_t i = kern_raw_index(&lay, l, k, t, 0) + d;
                    /* head 0: zeros in layer 0, a constant row (some channels 0) after it */
                    put(&lay, raw, i, l == 0 ? 0.0f : (float)((int)(d % 5) - 2));
                }
    free(same_bytes(&lay, &rec, raw));
    free(raw);
}
END_TEST

/* ROT keys of signed zeros that the rotation's signs turn into -0 in every channel of head
 * 0 (the mean +0, so each centred value is its input): the butterfly's outputs are +0 and
 * -0 mixed, every group's minimum and maximum a zero whose sign is its first zero's, as the
 * reference keeps it; the AVX2 encoder's extremes (eight tokens in the lanes, or a row's
 * tree) take either, so such groups must go to the reference. Every path gives the
 * reference's bytes, token counts with and without a tail of fewer than eight. */
START_TEST(test_rot_signed_zero_rows_same_bytes)
{
    const struct shape *sh = &shapes[(uint32_t)_i / NCODECS];
    const uint32_t codec = codecs[(uint32_t)_i % NCODECS];
    if (codec != KERN_CODEC_ROT2 && codec != KERN_CODEC_ROT4)
        return;
    struct kern_layout lay = layout_of(sh);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    uint16_t *raw = make_data(&lay, DATA_OUTLIER, 190 + (uint64_t)_i);
    for (uint32_t l = 0; l < lay.layers; l++) {
        const uint32_t sseed = kern_rot_sect_seed(rec.seed, l);
        for (uint32_t t = 0; t < lay.tokens; t++)
            for (uint32_t d = 0; d < lay.head_dim; d++)
                raw[kern_raw_index(&lay, l, 0, t, 0) + d] =
                    kern_rot_neg(sseed, 0, d) ? 0x0000 : 0x8000; /* +0 or -0 */
    }
    free(same_bytes(&lay, &rec, raw));
    free(raw);
}
END_TEST

/* ROT keys with one Inf or NaN at one of several places of the last layer's K slab (each
 * 64-byte line of a 256-byte stretch, and the slab's last half): the encode's first pass
 * scans the slab for them in chains of lines, and a missed one takes the clean path (no
 * sanitizing, so Inf or NaN reach the means and rows where the reference clamps or zeroes
 * them). Every path gives the reference's bytes. */
START_TEST(test_rot_scan_bad_anywhere_same_bytes)
{
    const struct shape *sh = &shapes[(uint32_t)_i / NCODECS];
    const uint32_t codec = codecs[(uint32_t)_i % NCODECS];
    struct kern_layout lay = layout_of(sh);
    if ((codec != KERN_CODEC_ROT2 && codec != KERN_CODEC_ROT4) || lay.dtype != KERN_DTYPE_FP16)
        return;
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    const uint64_t n = (uint64_t)lay.tokens * lay.heads * lay.head_dim,
                   at[] = {5, 37, 70, 101, n - 1};
    for (uint32_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
        if (at[i] >= n)
            continue;
        uint16_t *raw = make_data(&lay, DATA_OUTLIER, 210 + (uint64_t)_i);
        raw[kern_raw_index(&lay, lay.layers - 1, 0, 0, 0) + at[i]] = i % 2 ? 0x7e00 : 0xfc00;
        free(same_bytes(&lay, &rec, raw));
        free(raw);
    }
}
END_TEST

/* Inputs with -0 (every third channel, on outlier data whose tokens stay apart and on runs
 * of near-identical tokens): MERGE's clean path copies a run of one row as its halves with
 * -0 made +0 (the reference's 0 + x) and sums longer runs from 0. Then runs with one NaN
 * or Inf in a V row of the middle token (read by MERGE's K pass only where the K rows
 * join, which is where its clean path finds it and starts again). Every path gives the
 * reference's bytes. */
START_TEST(test_signed_zeros_same_bytes)
{
    const struct shape *sh = &shapes[(uint32_t)_i / NCODECS];
    const uint32_t codec = codecs[(uint32_t)_i % NCODECS];
    struct kern_layout lay = layout_of(sh);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    for (int kind = DATA_OUTLIER; kind <= DATA_RUNS; kind++) {
        uint16_t *raw = make_data(&lay, (enum data_kind)kind, 110 + (uint64_t)_i);
        for (uint64_t i = 1; i < kern_raw_size(&lay) / 2; i += 3)
            raw[i] = 0x8000; /* -0 in fp16 and bf16 */
        free(same_bytes(&lay, &rec, raw));
        free(raw);
    }
    for (uint16_t bad = 0; !lay.k_only && bad < 2; bad++) {
        uint16_t *raw = make_data(&lay, DATA_RUNS, 130 + (uint64_t)_i);
        const uint16_t nan = lay.dtype == KERN_DTYPE_FP16 ? 0x7e00 : 0x7fc0;
        const uint16_t inf = lay.dtype == KERN_DTYPE_FP16 ? 0xfc00 : 0xff80;
        raw[kern_raw_index(&lay, lay.layers - 1, 1, lay.tokens / 2, lay.heads - 1) + 1] =
            bad ? inf : nan;
        free(same_bytes(&lay, &rec, raw));
        free(raw);
    }
}
END_TEST

/* MERGE on outlier data (tokens apart: every head's rows fill, the last tokens are forced into
 * the last run) with a NaN, then an Inf, in a forced token's key row and value row: the
 * AVX-512 pass reads a forced key row only for its distance to the run's first (NaN or Inf
 * there: the distance is not finite) and a value row only for the sum, and must find either
 * and start again the sanitizing way. Every path gives the reference's bytes. */
START_TEST(test_merge_forced_bad_row_same_bytes)
{
    const struct shape *sh = &shapes[(uint32_t)_i / NCODECS];
    const uint32_t codec = codecs[(uint32_t)_i % NCODECS];
    struct kern_layout lay = layout_of(sh);
    if (codec != KERN_CODEC_MERGE || lay.tokens < 3)
        return;
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    const uint16_t nan = lay.dtype == KERN_DTYPE_FP16 ? 0x7e00 : 0x7fc0;
    const uint16_t inf = lay.dtype == KERN_DTYPE_FP16 ? 0xfc00 : 0xff80;
    for (uint32_t k = 0; k < (lay.k_only ? 1u : 2u); k++)
        for (int bad = 0; bad < 2; bad++) {
            uint16_t *raw = make_data(&lay, DATA_OUTLIER, 170 + (uint64_t)_i);
            ck_assert_uint_gt(kern_merge_forced(&lay, &rec, raw), 0);
            raw[kern_raw_index(&lay, lay.layers - 1, k, lay.tokens - 1, lay.heads - 1) +
                lay.head_dim - 1] = bad ? inf : nan;
            free(same_bytes(&lay, &rec, raw));
            free(raw);
        }
}
END_TEST

/* Whether some head of a MERGE section of rec ends its plan (kern_merge_plan, the reference)
 * holding all its rows: what kern_merge_may_force must answer 1 for, from the encoded bytes. */
static int plan_fills(const struct kern_layout *lay, const struct kern_recipe *rec,
                      const uint16_t *raw)
{
    uint32_t *map = malloc(kern_merge_map_bytes(lay->tokens));
    int full = 0;
    ck_assert_ptr_nonnull(map);
    for (uint32_t l = 0; l < lay->layers; l++) {
        if (rec->codec[l][0] != KERN_CODEC_MERGE &&
            (lay->k_only || rec->codec[l][1] != KERN_CODEC_MERGE))
            continue;
        const uint8_t *rk = (const uint8_t *)raw + 2 * kern_raw_index(lay, l, 0, 0, 0);
        const uint8_t *rv =
            lay->k_only ? NULL : (const uint8_t *)raw + 2 * kern_raw_index(lay, l, 1, 0, 0);
        for (uint32_t h = 0; h < lay->heads; h++)
            full |= kern_merge_plan(lay, rk, rv, h, rec->merge_cos, map, NULL) ==
                    kern_merge_rows(lay->tokens);
    }
    free(map);
    return full;
}

/* kern_merge_may_force on the blocks both CPU encoders write: 1 exactly where a MERGE head's
 * plan ends with all its rows (so on every block kern_merge_forced counts a forced token in),
 * 0 where every head ends under them. Returns kern_merge_forced. */
static int64_t may_force_check(const struct kern_layout *lay, const struct kern_recipe *rec,
                               const uint16_t *raw, int *said)
{
    int64_t sz = kern_encoded_size(lay, rec), f = kern_merge_forced(lay, rec, raw);
    uint8_t *e = malloc((size_t)sz);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_ge(f, 0);
    const int full = plan_fills(lay, rec, raw);
    ck_assert_int_eq(kern_encode_cpu(lay, rec, raw, e, (size_t)sz, NULL), sz);
    int mf = kern_merge_may_force(lay, rec, e, (size_t)sz);
    ck_assert_msg(mf == full, "may_force %d, plan fills %d, forced %lld, codecs %u/%u cos %g", mf,
                  full, (long long)f, rec->codec[lay->layers - 1][0],
                  rec->codec[lay->layers - 1][1], (double)rec->merge_cos);
    if (f > 0)
        ck_assert_int_eq(mf, 1);
    ck_assert_int_eq(kern_encode_ref(lay, rec, raw, e, (size_t)sz, NULL), sz);
    ck_assert_int_eq(kern_merge_may_force(lay, rec, e, (size_t)sz), mf);
    said[mf]++;
    free(e);
    return f;
}

/* MERGE's shortcut past the reference plan: on random (outlier) blocks, run-structured blocks
 * (default threshold: heads end under their rows; a strict one: tokens forced), run blocks
 * with a NaN or an Inf row, with recipes of MERGE in K and V, in K only, in V only, mixed per
 * layer, raw layers and raw heads, the answer is the plan's (may_force_check). */
START_TEST(test_merge_may_force)
{
    const struct shape *sh = &shapes[(uint32_t)_i];
    const struct kern_layout lay = layout_of(sh);
    const uint32_t nlh = lay.layers * lay.heads;
    uint8_t *rawh = calloc(nlh, 1);
    int said[2] = {0, 0};
    int64_t forced = 0;
    ck_assert_ptr_nonnull(rawh);
    rawh[nlh - 1] = 1;
    for (int r = 0; r < 6; r++) {
        struct kern_recipe rec;
        if (lay.k_only && (r == 1 || r == 2 || r == 3))
            continue;
        kern_recipe_fill(&rec, r == 2 ? KERN_CODEC_Q8_0 : KERN_CODEC_MERGE,
                         r == 1 ? KERN_CODEC_Q8_0 : KERN_CODEC_MERGE, 0);
        if (r == 3) /* layer 0 merges keys only, the others values only */
            for (uint32_t l = 0; l < lay.layers; l++) {
                rec.codec[l][0] = l == 0 ? KERN_CODEC_MERGE : KERN_CODEC_KIVI4;
                rec.codec[l][1] = l == 0 ? KERN_CODEC_Q4_1 : KERN_CODEC_MERGE;
            }
        if (r == 4 && lay.layers > 1)
            rec.codec[0][0] = rec.codec[0][1] = KERN_CODEC_RAW;
        if (r == 5)
            rec.raw_heads = rawh;
        for (int d = 0; d < 5; d++) {
            uint16_t *raw = make_data(&lay, d == 0 ? DATA_OUTLIER : DATA_RUNS,
                                      600 + 10 * (uint64_t)_i + (uint64_t)d);
            rec.merge_cos = d == 2 ? 0.999999f : 0.0f;
            if (d >= 3) { /* a NaN, an Inf in a K row, a V row where there is one */
                const uint16_t bad = d == 3 ? (lay.dtype == KERN_DTYPE_FP16 ? 0x7e00 : 0x7fc0)
                                            : (lay.dtype == KERN_DTYPE_FP16 ? 0xfc00 : 0xff80);
                raw[kern_raw_index(&lay, lay.layers - 1, 0, lay.tokens / 2, 0)] = bad;
                if (!lay.k_only)
                    raw[kern_raw_index(&lay, lay.layers - 1, 1, lay.tokens - 1, lay.heads - 1)] =
                        bad;
            }
            forced += may_force_check(&lay, &rec, raw, said);
            /* the mixed recipes: every path the same (the batched encoder takes no raw heads) */
            if (r != 5)
                free(same_bytes(&lay, &rec, raw));
            free(raw);
        }
    }
    /* both answers given, and forced blocks among the 1s (the strict threshold's) */
    if (lay.tokens >= 16) /* a head of a few tokens fills its rows with runs of 1-6 */
        ck_assert_int_gt(said[0], 0);
    ck_assert_int_gt(said[1], 0);
    ck_assert_int_gt(forced, 0);
    free(rawh);
}
END_TEST

/* Hand-made heads of 6 tokens (3 rows stored): runs of three, two rows (0, no token forced);
 * runs of two, exactly three rows and nothing forced (1: the plan alone can tell those from
 * forced ones); four distinct runs, the last token forced (1). A block not what lay and rec
 * encode to, or a rows field out of range, is refused. */
START_TEST(test_merge_may_force_hand)
{
    struct kern_layout lay = {1, 1, 8, 6, KERN_DTYPE_FP16, 1};
    struct kern_recipe rec, other;
    uint16_t raw[48];
    const float rows[3][6] = {{1, 1.01f, 0.99f, -5, -5.02f, -4.99f},
                              {1, 1.01f, -5, -5.02f, 3, 3.02f},
                              {1, 1.01f, -5, -5.02f, 3, -7}};
    const int want[3] = {0, 1, 1}, forced[3] = {0, 0, 1};
    int64_t sz;
    uint8_t e[1024];
    kern_recipe_fill(&rec, KERN_CODEC_MERGE, KERN_CODEC_MERGE, 0);
    sz = kern_encoded_size(&lay, &rec);
    ck_assert_int_le(sz, (int64_t)sizeof(e));
    for (int c = 0; c < 3; c++) {
        for (uint32_t t = 0; t < 6; t++)
            for (uint32_t d = 0; d < 8; d++)
                raw[t * 8 + d] = kern_f2h(rows[c][t] * (float)(d + 1));
        ck_assert_int_eq(kern_merge_forced(&lay, &rec, raw), forced[c]);
        ck_assert_int_eq(kern_encode_cpu(&lay, &rec, raw, e, sizeof(e), NULL), sz);
        ck_assert_int_eq(kern_merge_may_force(&lay, &rec, e, (size_t)sz), want[c]);
    }
    uint8_t *head = e + kern_hdr_bytes(&lay);
    uint32_t r = 4; /* past the 3 rows stored */
    memcpy(head, &r, 4);
    ck_assert_int_eq(kern_merge_may_force(&lay, &rec, e, (size_t)sz), -EBADMSG);
    r = 0;
    memcpy(head, &r, 4);
    ck_assert_int_eq(kern_merge_may_force(&lay, &rec, e, (size_t)sz), -EBADMSG);
    r = 2;
    memcpy(head, &r, 4);
    ck_assert_int_eq(kern_merge_may_force(&lay, &rec, e, (size_t)sz), 0);
    ck_assert_int_eq(kern_merge_may_force(&lay, &rec, e, (size_t)sz - 1), -EBADMSG);
    ck_assert_int_eq(kern_merge_may_force(&lay, &rec, NULL, (size_t)sz), -EINVAL);
    kern_recipe_fill(&other, KERN_CODEC_Q8_0, KERN_CODEC_Q8_0, 0);
    ck_assert_int_eq(kern_merge_may_force(&lay, &other, e, (size_t)sz), -EBADMSG);
    lay.tokens = 5; /* another layout, the same bytes */
    ck_assert_int_eq(kern_merge_may_force(&lay, &rec, e, (size_t)sz), -EBADMSG);
}
END_TEST

/* The quantize worker asks kern_merge_may_force of the block it just encoded into an arena
 * slot, which every writer of the arena maps: another process rewrites the last section's
 * offset while it reads. kern_block_info checked the table; the section read again after
 * that took the rewritten offset and read a rows field 4 GiB on. Every answer now is the
 * block's (0: runs of four tokens, no head holding all its rows) or a refusal. */
START_TEST(test_merge_may_force_raced)
{
    struct kern_layout lay = {4, 2, 64, 16, KERN_DTYPE_FP16, 0};
    struct kern_recipe rec;
    kern_recipe_fill(&rec, KERN_CODEC_MERGE, KERN_CODEC_MERGE, 0);
    const int64_t sz = kern_encoded_size(&lay, &rec);
    const uint64_t rb = kern_raw_size(&lay);
    ck_assert_int_gt(sz, 0);
    uint16_t *raw = malloc(rb);
    for (uint32_t l = 0; l < lay.layers; l++)
        for (uint32_t k = 0; k < 2; k++)
            for (uint32_t t = 0; t < lay.tokens; t++)
                for (uint32_t i = 0; i < lay.heads * lay.head_dim; i++)
                    raw[kern_raw_index(&lay, l, k, t, 0) + i] =
                        kern_f2h(sinf((float)(i * 0.37 + 10 * l + 5 * k + t / 4)));
    /* the block shared with the writer, 4 GiB of nothing after it: a read at any offset
     * the table can name past the block faults */
    const size_t mapped = ((size_t)sz + 4095) & ~(size_t)4095, span = mapped + (5ull << 30);
    uint8_t *e = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ck_assert(e != MAP_FAILED);
    ck_assert(mmap(e, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1,
                   0) == e);
    ck_assert_int_eq(kern_encode_cpu(&lay, &rec, raw, e, (size_t)sz, NULL), sz);
    ck_assert_int_eq(kern_merge_may_force(&lay, &rec, e, (size_t)sz), 0);
    uint32_t *at = (uint32_t *)(e + sizeof(struct kern_block_hdr) +
                                (2 * lay.layers - 1) * sizeof(struct kern_block_sect));
    const uint32_t good = *at;
    pid_t w = fork();
    if (w == 0)
        for (;;) {
            __atomic_store_n(at, 0xfffffff0u, __ATOMIC_RELAXED);
            __atomic_store_n(at, good, __ATOMIC_RELAXED);
        }
    ck_assert_int_gt(w, 0);
    uint32_t said[2] = {0, 0};
    time_t until = time(NULL) + 20;
    for (uint32_t i = 0; i < 200000 || (!said[1] && time(NULL) < until); i++) {
        int rc = kern_merge_may_force(&lay, &rec, e, (size_t)sz);
        ck_assert_msg(rc == 0 || rc == -EBADMSG, "%d", rc);
        said[rc < 0]++;
    }
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);
    printf("codecs: kern_merge_may_force under a racing writer: %u answered, %u refused\n", said[0],
           said[1]);
    ck_assert_uint_gt(said[1], 0); /* the writer did race the reader */
    munmap(e, span);
    free(raw);
}
END_TEST

/* Keys of large magnitude (layer 0's scaled by 250: up to ~3000), and then rows of +-60000
 * with the signs of the rotation (token 0 and 1 of head 0: rotated, one channel reaches
 * ~680000 and is clamped): ROT's AVX2 encode skips its clamp only where the largest magnitude
 * of a section proves no rotated value can reach the fp16 range; every path gives the
 * reference's bytes. */
START_TEST(test_large_keys_same_bytes)
{
    const struct shape *sh = &shapes[(uint32_t)_i / NCODECS];
    const uint32_t codec = codecs[(uint32_t)_i % NCODECS];
    struct kern_layout lay = layout_of(sh);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    const uint32_t sseed = kern_rot_sect_seed(rec.seed, 0);
    for (int big = 0; big < 2; big++) {
        uint16_t *raw = make_data(&lay, DATA_OUTLIER, 150 + (uint64_t)_i);
        for (uint32_t t = 0; t < lay.tokens; t++)
            for (uint32_t h = 0; h < lay.heads; h++) {
                const uint64_t i = kern_raw_index(&lay, 0, 0, t, h);
                for (uint32_t d = 0; d < lay.head_dim; d++) {
                    float v = kern_load(raw, lay.dtype, i + d) * 250.0f;
                    if (big && h == 0 && t < 2)
                        v = (kern_rot_neg(sseed, 0, d) ? -60000.0f : 60000.0f) * (t ? -1 : 1);
                    put(&lay, raw, i + d, v);
                }
            }
        free(same_bytes(&lay, &rec, raw));
        free(raw);
    }
}
END_TEST

/* Encode with key statistics (the daemon's call): the reference and the AVX2 path give the
 * same section bytes and the same channel minima and maxima, bit for bit, and the same key
 * norms within 1e-5 (summed in another order, as check_kernels allows), every codec and
 * shape. */
START_TEST(test_stats_same)
{
    const struct shape *sh = &shapes[(uint32_t)_i / NCODECS];
    const uint32_t codec = codecs[(uint32_t)_i % NCODECS];
    struct kern_layout lay = layout_of(sh);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    uint16_t *raw = make_data(&lay, DATA_OUTLIER, 170 + (uint64_t)_i);
    raw[5] = lay.dtype == KERN_DTYPE_FP16 ? 0x7c00 : 0x7f80; /* +Inf: sanitised */
    const int64_t sz = kern_encoded_size(&lay, &rec);
    const size_t n = (size_t)lay.layers * lay.heads * lay.head_dim,
                 nh = (size_t)lay.layers * lay.heads;
    float *f[2][3];
    uint8_t *e[2];
    for (int v = 0; v < 2; v++) {
        e[v] = malloc((size_t)sz);
        ck_assert_ptr_nonnull(e[v]);
        for (int j = 0; j < 3; j++) {
            f[v][j] = malloc(sizeof(float) * (j == 2 ? nh : n));
            ck_assert_ptr_nonnull(f[v][j]);
            memset(f[v][j], v ? 0x5a : 0xa5, sizeof(float) * (j == 2 ? nh : n));
        }
        const struct kern_key_stats ks = {f[v][0], f[v][1], f[v][2]};
        ck_assert_int_eq(
            (v ? kern_encode_cpu : kern_encode_ref)(&lay, &rec, raw, e[v], (size_t)sz, &ks), sz);
    }
    ck_assert_mem_eq(e[1], e[0], (size_t)sz);
    ck_assert_mem_eq(f[1][0], f[0][0], sizeof(float) * n);
    ck_assert_mem_eq(f[1][1], f[0][1], sizeof(float) * n);
    for (size_t i = 0; i < nh; i++) /* a float statistic, summed in another order */
        ck_assert_double_eq_tol(f[1][2][i], f[0][2][i], 1e-5 * f[0][2][i] + 1e-6);
    for (int v = 0; v < 2; v++) {
        free(e[v]);
        for (int j = 0; j < 3; j++)
            free(f[v][j]);
    }
    free(raw);
}
END_TEST

/* MERGE's K pass takes the key statistics on its way (the AVX-512 pass, kern_merge512.c):
 * the same floats, bit for bit, as the statistics pass of a RAW section (kern_avx2_enc.c's
 * stats_rows), and the reference's section bytes, on fp16 shapes it takes (D a multiple of
 * 32; an odd head count, whose last head takes the pair's distances alone), on outlier
 * data (every head's rows fill, the rest forced), on runs, and on runs with a NaN in a key
 * row or an Inf in a value row (the pass gives up: the statistics come from their own pass).
 * Both CPU paths. */
static const struct shape merge_stats_shapes[] = {
    {2, 2, 128, 32, KERN_DTYPE_FP16, 0},
    {1, 2, 32, 70, KERN_DTYPE_FP16, 1},
    {2, 3, 64, 20, KERN_DTYPE_FP16, 0},
};
#define NMERGE_STATS (sizeof(merge_stats_shapes) / sizeof(merge_stats_shapes[0]))

START_TEST(test_merge_stats_same)
{
    struct kern_layout lay = layout_of(&merge_stats_shapes[_i]);
    struct kern_recipe rec, raw_rec;
    kern_recipe_fill(&rec, KERN_CODEC_MERGE, KERN_CODEC_MERGE, 0);
    kern_recipe_fill(&raw_rec, KERN_CODEC_RAW, KERN_CODEC_RAW, 0);
    const int64_t sz = kern_encoded_size(&lay, &rec), rsz = kern_encoded_size(&lay, &raw_rec);
    const size_t n = (size_t)lay.layers * lay.heads * lay.head_dim,
                 nh = (size_t)lay.layers * lay.heads;
    uint8_t *e = malloc((size_t)sz), *r = malloc((size_t)sz), *er = malloc((size_t)rsz);
    float *f[2][3];
    ck_assert(e && r && er);
    for (int v = 0; v < 2; v++)
        for (int j = 0; j < 3; j++) {
            f[v][j] = malloc(sizeof(float) * (j == 2 ? nh : n));
            ck_assert_ptr_nonnull(f[v][j]);
        }
    for (int kind = 0; kind < 4; kind++) {
        uint16_t *raw = make_data(&lay, kind == 0 ? DATA_OUTLIER : DATA_RUNS, 230 + (uint64_t)_i);
        if (kind == 2) /* a NaN in a key row of the last layer */
            raw[kern_raw_index(&lay, lay.layers - 1, 0, lay.tokens / 2, 0) + 3] = 0x7e00;
        if (kind == 3 && !lay.k_only) /* an Inf in a value row */
            raw[kern_raw_index(&lay, 0, 1, lay.tokens - 1, lay.heads - 1) + 1] = 0x7c00;
        ck_assert_int_eq(kern_encode_ref(&lay, &rec, raw, r, (size_t)sz, NULL), sz);
        for (int wide = have_avx512(); wide >= 0; wide--) {
            const int was = kern_rot_avx512(wide);
            for (int v = 0; v < 2; v++)
                for (int j = 0; j < 3; j++)
                    memset(f[v][j], v ? 0x5a : 0xa5, sizeof(float) * (j == 2 ? nh : n));
            const struct kern_key_stats km = {f[0][0], f[0][1], f[0][2]},
                                        kr = {f[1][0], f[1][1], f[1][2]};
            memset(e, 0x3c, (size_t)sz);
            ck_assert_int_eq(kern_encode_cpu(&lay, &rec, raw, e, (size_t)sz, &km), sz);
            ck_assert_mem_eq(e, r, (size_t)sz);
            memset(e, 0xc3, (size_t)sz);
            ck_assert_int_eq(kern_encode_cpu(&lay, &rec, raw, e, (size_t)sz, NULL), sz);
            ck_assert_mem_eq(e, r, (size_t)sz);
            ck_assert_int_eq(kern_encode_cpu(&lay, &raw_rec, raw, er, (size_t)rsz, &kr), rsz);
            ck_assert_mem_eq(f[0][0], f[1][0], sizeof(float) * n);
            ck_assert_mem_eq(f[0][1], f[1][1], sizeof(float) * n);
            ck_assert_mem_eq(f[0][2], f[1][2], sizeof(float) * nh);
            kern_rot_avx512(was);
        }
        free(raw);
    }
    for (int v = 0; v < 2; v++)
        for (int j = 0; j < 3; j++)
            free(f[v][j]);
    free(e);
    free(r);
    free(er);
}
END_TEST

/* Normalised RMS error of every section of `kind` data decoded. */
static double worst_err(const struct kern_layout *lay, const struct kern_recipe *rec,
                        const uint16_t *raw, int which_kind)
{
    int64_t sz = kern_encoded_size(lay, rec);
    uint64_t rs = kern_raw_size(lay);
    uint8_t *e = malloc((size_t)sz);
    uint16_t *d = malloc(rs);
    double worst = 0;
    ck_assert_int_eq(kern_encode_cpu(lay, rec, raw, e, (size_t)sz, NULL), sz);
    ck_assert_int_eq(kern_decode_cpu(lay, e, (size_t)sz, d, rs, lay->dtype), (int64_t)rs);
    for (uint32_t l = 0; l < lay->layers; l++)
        for (uint32_t k = 0; k < (lay->k_only ? 1u : 2u); k++) {
            if (which_kind >= 0 && (int)k != which_kind)
                continue;
            double x = sect_err(lay, raw, d, l, k);
            worst = x > worst ? x : worst;
        }
    free(e);
    free(d);
    return worst;
}

/* The bounds, per codec, on the data each is for (docs/kernels.md):
 *  - rot4 0.12, rot2 0.5 (KIVI's at the same bits: the rotation is orthonormal, so the error
 *    of the rotated keys is the keys' error, and the means are exact to fp16) on
 *    outlier-structured blocks;
 *  - merge on runs of near-identical tokens: every token's row is its run's mean, within
 *    2 d / (1 - d) of it, d = sqrt(2 (1 - cos)) (0.2 at the default 0.98): 0.5, and no
 *    merge beyond the threshold (kern_merge_forced 0);
 *  - lowrank keys of rank 3 plus noise: sqrt(1 - energy) plus the factors' fp16 rounding,
 *    0.1 + 0.01; values q8_0's 0.02.
 * On data a codec is not for it still decodes finite values of the block's shape. */
START_TEST(test_error_bounds)
{
    const struct shape *sh = &shapes[(uint32_t)_i];
    struct kern_layout lay = layout_of(sh);
    struct kern_recipe rec;
    uint16_t *out = make_data(&lay, DATA_OUTLIER, 200 + (uint64_t)_i);
    uint16_t *runs = make_data(&lay, DATA_RUNS, 300 + (uint64_t)_i);
    uint16_t *lr = make_data(&lay, DATA_LOWRANK, 400 + (uint64_t)_i);
    double e;
    kern_recipe_fill(&rec, KERN_CODEC_ROT4, KERN_CODEC_ROT4, 0);
    ck_assert_msg((e = worst_err(&lay, &rec, out, -1)) <= 0.12, "rot4 %g", e);
    kern_recipe_fill(&rec, KERN_CODEC_ROT2, KERN_CODEC_ROT2, 0);
    ck_assert_msg((e = worst_err(&lay, &rec, out, -1)) <= 0.5, "rot2 %g", e);
    kern_recipe_fill(&rec, KERN_CODEC_MERGE, KERN_CODEC_MERGE, 0);
    ck_assert_int_eq(kern_merge_forced(&lay, &rec, runs), 0);
    ck_assert_msg((e = worst_err(&lay, &rec, runs, -1)) <= 0.5, "merge %g", e);
    /* Gaussian rows are not alike: merge has to join past its threshold there */
    if (lay.tokens >= 16)
        ck_assert_int_gt(kern_merge_forced(&lay, &rec, out), 0);
    rec.merge_cos = 0.999999f; /* a stricter threshold: the runs' noise is past it */
    ck_assert_int_gt(kern_merge_forced(&lay, &rec, runs), 0);
    kern_recipe_fill(&rec, KERN_CODEC_LOWRANK, KERN_CODEC_LOWRANK, 0);
    if (kern_lowrank_cap(lay.head_dim, lay.tokens) >= 3) {
        ck_assert_msg((e = worst_err(&lay, &rec, lr, 0)) <= sqrt(1.0 - 0.99) + 0.01,
                      "lowrank keys %g", e);
    }
    if (!lay.k_only)
        ck_assert_msg((e = worst_err(&lay, &rec, lr, 1)) <= 0.02, "lowrank values %g", e);
    free(out);
    free(runs);
    free(lr);
}
END_TEST

/* The rotation spreads outlier channels: on keys with outlier channels, 4-bit and 2-bit
 * keys quantized per token lose less rotated (rot4, rot2) than as they are (q4_1 and 4-bit
 * KIVI value groups have the same per-token groups and bits), over 8 blocks of a realistic
 * shape: the ratios measured are printed (docs/kernels.md has them) beside KIVI's per-channel
 * keys, which handle constant-offset channels without a rotation. */
START_TEST(test_rotation_lowers_key_error)
{
    struct kern_layout lay = {2, 4, 128, 32, KERN_DTYPE_FP16, 0};
    struct kern_recipe rec;
    double q4 = 0, rot4 = 0, v2 = 0, rot2 = 0, kivi4 = 0;
    for (uint64_t b = 0; b < 8; b++) {
        uint16_t *raw = make_data(&lay, DATA_OUTLIER, 500 + b);
        kern_recipe_fill(&rec, KERN_CODEC_Q4_1, KERN_CODEC_Q4_1, 0);
        q4 += worst_err(&lay, &rec, raw, 0);
        kern_recipe_fill(&rec, KERN_CODEC_ROT4, KERN_CODEC_ROT4, 0);
        rot4 += worst_err(&lay, &rec, raw, 0);
        kern_recipe_fill(&rec, KERN_CODEC_ROT2, KERN_CODEC_ROT2, 0);
        rot2 += worst_err(&lay, &rec, raw, 0);
        /* 2-bit per-token groups as they are: KIVI-2's value groups, the keys put in the
         * V section's place */
        kern_recipe_fill(&rec, KERN_CODEC_RAW, KERN_CODEC_KIVI2, 0);
        {
            uint16_t *swapped = malloc(kern_raw_size(&lay));
            memcpy(swapped, raw, kern_raw_size(&lay));
            for (uint32_t l = 0; l < lay.layers; l++)
                memcpy(swapped + kern_raw_index(&lay, l, 1, 0, 0),
                       raw + kern_raw_index(&lay, l, 0, 0, 0),
                       2ull * lay.tokens * lay.heads * lay.head_dim);
            v2 += worst_err(&lay, &rec, swapped, 1);
            free(swapped);
        }
        kern_recipe_fill(&rec, KERN_CODEC_KIVI4, KERN_CODEC_KIVI4, 0);
        kivi4 += worst_err(&lay, &rec, raw, 0);
        free(raw);
    }
    printf("rotation: 4-bit per-token key error %.4f rotated / %.4f as is (q4_1) = %.3f; "
           "2-bit %.4f / %.4f = %.3f; KIVI-4 per-channel keys %.4f\n",
           rot4 / 8, q4 / 8, rot4 / q4, rot2 / 8, v2 / 8, rot2 / v2, kivi4 / 8);
    ck_assert_msg(rot4 < q4, "rot4 %g >= q4_1 %g", rot4, q4);
    ck_assert_msg(rot2 < v2, "rot2 %g >= 2-bit groups %g", rot2, v2);
}
END_TEST

/* The transform itself: orthonormal to rounding (norm kept to 1e-6), its own inverse up to
 * the signs, and a seed that changes the signs changes the rotation. */
START_TEST(test_rotation_orthonormal)
{
    uint64_t s = 11;
    for (uint32_t dim = 8; dim <= 256; dim *= 2) {
        float x[256], y[256], z[256];
        double nx = 0, ny = 0, err = 0;
        for (uint32_t j = 0; j < dim; j++)
            x[j] = rng_gauss(&s) * (j == 3 ? 20.0f : 1.0f);
        kern_rot_fwd(x, y, 77, 1, dim);
        memcpy(z, y, sizeof(float) * dim);
        kern_rot_inv(z, 77, 1, dim);
        for (uint32_t j = 0; j < dim; j++) {
            nx += (double)x[j] * x[j];
            ny += (double)y[j] * y[j];
            err += ((double)z[j] - x[j]) * ((double)z[j] - x[j]);
        }
        ck_assert_double_le(fabs(ny - nx) / nx, 1e-6);
        ck_assert_double_le(sqrt(err / nx), 1e-6);
        kern_rot_fwd(x, z, 78, 1, dim);
        ck_assert(memcmp(y, z, sizeof(float) * dim) != 0);
    }
}
END_TEST

/* A hand-made head: tokens 0-2 alike, 3 apart, 4-5 alike: three rows, the map 0b11001, each
 * token decoded to its run's mean (rounded to fp16 once). */
START_TEST(test_merge_hand)
{
    struct kern_layout lay = {1, 1, 8, 6, KERN_DTYPE_FP16, 1};
    struct kern_recipe rec;
    uint16_t raw[48], dec[48];
    const float rows[6] = {1.0f, 1.01f, 0.99f, -5.0f, 3.0f, 3.02f};
    for (uint32_t t = 0; t < 6; t++)
        for (uint32_t d = 0; d < 8; d++)
            raw[t * 8 + d] = kern_f2h(rows[t] * (float)(d + 1));
    kern_recipe_fill(&rec, KERN_CODEC_MERGE, KERN_CODEC_MERGE, 0);
    ck_assert_int_eq(kern_merge_forced(&lay, &rec, raw), 0);
    uint8_t *e = same_bytes(&lay, &rec, raw);
    int64_t sz = kern_encoded_size(&lay, &rec);
    const uint8_t *head = e + kern_hdr_bytes(&lay);
    uint32_t nrows, map;
    memcpy(&nrows, head, 4);
    memcpy(&map, head + 16, 4);
    ck_assert_uint_eq(nrows, 3);
    ck_assert_uint_eq(map, 0x19u);
    ck_assert_int_eq(kern_decode_ref(&lay, e, (size_t)sz, dec, sizeof(dec), KERN_DTYPE_FP16),
                     (int64_t)sizeof(dec));
    for (uint32_t t = 0; t < 6; t++)
        for (uint32_t d = 0; d < 8; d++) {
            uint32_t a = t < 3 ? 0 : t < 4 ? 3 : 4, b = t < 3 ? 3 : t < 4 ? 4 : 6;
            float sum = 0.0f;
            for (uint32_t u = a; u < b; u++)
                sum += kern_h2f(raw[u * 8 + d]);
            ck_assert_uint_eq(dec[t * 8 + d], kern_f2h(sum / (float)(b - a)));
        }
    free(e);
}
END_TEST

/* LOWRANK's rank: keys of exact rank 2 keep 2 factors at the default energy, 1 at 60 %
 * (their first direction holds more), and random keys fill the room (ceil(min(T, D) / 4)). */
START_TEST(test_lowrank_rank)
{
    struct kern_layout lay = {1, 1, 32, 16, KERN_DTYPE_FP16, 1};
    struct kern_recipe rec;
    uint16_t raw[512];
    uint64_t s = 5;
    float a[32], b[32];
    for (uint32_t d = 0; d < 32; d++) {
        a[d] = rng_gauss(&s);
        b[d] = rng_gauss(&s);
    }
    for (uint32_t t = 0; t < 16; t++) {
        float c1 = 3.0f * rng_gauss(&s), c2 = 0.5f * rng_gauss(&s);
        for (uint32_t d = 0; d < 32; d++)
            raw[t * 32 + d] = kern_f2h(c1 * a[d] + c2 * b[d]);
    }
    kern_recipe_fill(&rec, KERN_CODEC_LOWRANK, KERN_CODEC_LOWRANK, 0);
    uint8_t *e = same_bytes(&lay, &rec, raw);
    uint32_t r;
    memcpy(&r, e + kern_hdr_bytes(&lay), 4);
    ck_assert_uint_eq(r, 2);
    free(e);
    rec.lowrank_energy = 0.6f;
    e = same_bytes(&lay, &rec, raw);
    memcpy(&r, e + kern_hdr_bytes(&lay), 4);
    ck_assert_uint_eq(r, 1);
    free(e);
    for (uint32_t i = 0; i < 512; i++)
        raw[i] = kern_f2h(rng_gauss(&s));
    rec.lowrank_energy = 0.0f;
    e = same_bytes(&lay, &rec, raw);
    memcpy(&r, e + kern_hdr_bytes(&lay), 4);
    ck_assert_uint_eq(r, kern_lowrank_cap(32, 16));
    free(e);
}
END_TEST

/* Shapes a codec does not take are refused (-EINVAL), the others' sizes are what the format
 * says: ROT keys are the seed, the channels' means and KIVI value groups, values KIVI values;
 * LOWRANK values q8_0. */
START_TEST(test_sizes_and_shapes)
{
    struct kern_layout odd = {1, 2, 80, 32, KERN_DTYPE_FP16, 0};
    struct kern_layout big = {1, 2, 128, 128, KERN_DTYPE_FP16, 0};
    struct kern_layout lay = {1, 2, 128, 32, KERN_DTYPE_FP16, 0};
    struct kern_recipe rec, base;
    kern_recipe_fill(&rec, KERN_CODEC_ROT4, KERN_CODEC_ROT4, 0);
    ck_assert_int_eq(kern_encoded_size(&odd, &rec), -EINVAL);
    ck_assert(!kern_codec_supports(&odd, KERN_CODEC_ROT4));
    /* header 80; K: seed 16, means 2 x 128 x 2, 32 x 2 x 4 groups of 20; V: the groups */
    kern_recipe_fill(&base, KERN_CODEC_KIVI4, KERN_CODEC_KIVI4, 0);
    ck_assert_int_eq(kern_encoded_size(&lay, &rec), 80 + 16 + 512 + 5120 + 5120);
    ck_assert_int_eq(kern_encoded_size(&lay, &rec) - kern_encoded_size(&lay, &base),
                     16 + 512 + 5120 - (int64_t)kern_sect_bytes(&lay, KERN_CODEC_KIVI4, 0));
    kern_recipe_fill(&rec, KERN_CODEC_LOWRANK, KERN_CODEC_LOWRANK, 0);
    ck_assert_int_eq(kern_encoded_size(&big, &rec), -EINVAL);
    ck_assert(kern_codec_supports(&odd, KERN_CODEC_LOWRANK));
    ck_assert(kern_codec_supports(&odd, KERN_CODEC_MERGE));
    /* K at rank room 8: 16 + 32 + 2 * 8 * (32 + 128) = 2608 B a head (raw 8192) */
    ck_assert_uint_eq(kern_lowrank_head_bytes(128, 32), 2608);
    kern_recipe_fill(&rec, KERN_CODEC_MERGE, KERN_CODEC_MERGE, 0);
    ck_assert_uint_eq(kern_merge_head_bytes(128, 32), (16 + 4 + 2 * 16 * 128 + 15) / 16 * 16);
    ck_assert_str_eq(kern_codec_name(KERN_CODEC_ROT4), "rot4");
    ck_assert_int_eq(kern_codec_from_name("lowrank"), KERN_CODEC_LOWRANK);
}
END_TEST

/* ---- the encode kernel's units across the thread block ----------------------------------- */

/* Shapes for the encoder units' parallel structure (kern_encb.h): ROT at every head_dim with
 * token counts crossing its rounds of KERN_ENC_ROT_VALS values (4096 / head_dim rows: one row
 * past a round, several rounds, one token); LOWRANK at odd and non-power-of-two head dims,
 * T above and below D (Gram matrix of keys or of tokens), an odd number of columns, the
 * largest search (n = 64, 16 columns), one column (n 2..3), the 1 x 1 case and more heads
 * than the CPU encoder's groups of eight; fp8 at head
 * dims that are and are not multiples of 8 with 1 and 3 heads (its codes' 8-byte stores at
 * 8-byte and other alignments); MERGE with token counts over many windows of
 * KERN_ENC_MERGE_WIN (32) judged tokens, K+V and K only, 1 and 2 tokens, one and eight
 * windows of joins followed by a run that starts exactly at the next window (token 33,
 * 257); MERGE by pairs (T <= 64 where the rows fit: 32 tokens of 128 channels, 64 of 96 K
 * only, head dims 7, 20, 256) with half the tokens alike, in K and V or in V alone, and at 64
 * tokens of 128 channels by rounds; every MERGE shape on a drift (runs of two tokens, each
 * near its predecessor but not the token before that); KIVI keys (columns of 8 channels
 * over slices of tokens) at head dims that are and are not multiples of 8 (a last column of
 * 4 or 7 channels), rows of codes 4-byte aligned or not
 * (head_dim 40 at 2 bits: rows of 10 bytes), 1 .. 16 tokens a slice (head_dim 8 .. 1024,
 * slices of 1, 2, 4, 11, 16), a last group of 1, 3 or 8 tokens, K only. */
struct unit_case {
    struct shape sh;
    uint32_t codec;
};
static const struct unit_case unit_cases[] = {
    {{1, 2, 8, 513, KERN_DTYPE_FP16, 0}, KERN_CODEC_ROT2},
    {{1, 1, 16, 300, KERN_DTYPE_BF16, 1}, KERN_CODEC_ROT4},
    {{2, 1, 32, 129, KERN_DTYPE_FP16, 0}, KERN_CODEC_ROT4},
    {{1, 3, 64, 65, KERN_DTYPE_FP16, 1}, KERN_CODEC_ROT2},
    {{1, 2, 128, 97, KERN_DTYPE_BF16, 0}, KERN_CODEC_ROT4},
    {{1, 2, 256, 40, KERN_DTYPE_FP16, 0}, KERN_CODEC_ROT2},
    /* AVX-512's blocks of 16 tokens, then AVX2's of 8, then a row: 57 = 3 x 16 + 8 + 1 */
    {{1, 2, 128, 57, KERN_DTYPE_FP16, 0}, KERN_CODEC_ROT2},
    {{1, 1, 256, 1, KERN_DTYPE_FP16, 1}, KERN_CODEC_ROT4},
    {{1, 2, 20, 40, KERN_DTYPE_FP16, 0}, KERN_CODEC_LOWRANK},
    {{1, 1, 33, 70, KERN_DTYPE_BF16, 1}, KERN_CODEC_LOWRANK},
    {{1, 2, 100, 24, KERN_DTYPE_FP16, 1}, KERN_CODEC_LOWRANK},
    {{1, 1, 96, 64, KERN_DTYPE_FP16, 1}, KERN_CODEC_LOWRANK},
    {{1, 2, 40, 48, KERN_DTYPE_BF16, 0}, KERN_CODEC_LOWRANK},
    {{1, 2, 64, 3, KERN_DTYPE_FP16, 1}, KERN_CODEC_LOWRANK},
    {{1, 1, 7, 2, KERN_DTYPE_FP16, 1}, KERN_CODEC_LOWRANK},
    {{1, 2, 24, 1, KERN_DTYPE_FP16, 1}, KERN_CODEC_LOWRANK},
    /* more heads than the CPU encoder's groups of eight (kern_lowrank.c): 8 + 4, 2 x 8 + 1 */
    {{1, 12, 64, 32, KERN_DTYPE_FP16, 0}, KERN_CODEC_LOWRANK},
    {{1, 17, 48, 20, KERN_DTYPE_BF16, 1}, KERN_CODEC_LOWRANK},
    {{1, 3, 128, 33, KERN_DTYPE_FP16, 0}, KERN_CODEC_FP8},
    {{1, 1, 8, 257, KERN_DTYPE_BF16, 0}, KERN_CODEC_FP8},
    {{1, 3, 20, 9, KERN_DTYPE_FP16, 1}, KERN_CODEC_FP8},
    {{1, 2, 16, 600, KERN_DTYPE_FP16, 0}, KERN_CODEC_MERGE},
    {{1, 1, 8, 300, KERN_DTYPE_BF16, 1}, KERN_CODEC_MERGE},
    {{1, 3, 32, 257, KERN_DTYPE_FP16, 0}, KERN_CODEC_MERGE},
    {{1, 2, 64, 1, KERN_DTYPE_FP16, 0}, KERN_CODEC_MERGE},
    {{1, 1, 24, 2, KERN_DTYPE_BF16, 1}, KERN_CODEC_MERGE},
    /* MERGE by pairs: the benchmark's head, 64 tokens K only, head dims not a multiple of 8
     * (7, 20) and 256; and 64 tokens of 128 channels, past the pairs' shared memory: rounds */
    {{1, 2, 128, 32, KERN_DTYPE_FP16, 0}, KERN_CODEC_MERGE},
    {{1, 2, 96, 64, KERN_DTYPE_BF16, 1}, KERN_CODEC_MERGE},
    {{1, 3, 20, 33, KERN_DTYPE_FP16, 0}, KERN_CODEC_MERGE},
    {{1, 1, 7, 17, KERN_DTYPE_BF16, 0}, KERN_CODEC_MERGE},
    {{1, 2, 256, 16, KERN_DTYPE_FP16, 0}, KERN_CODEC_MERGE},
    {{1, 1, 128, 64, KERN_DTYPE_FP16, 0}, KERN_CODEC_MERGE},
    {{1, 2, 128, 97, KERN_DTYPE_FP16, 0}, KERN_CODEC_KIVI4},
    {{1, 2, 128, 97, KERN_DTYPE_BF16, 0}, KERN_CODEC_KIVI2},
    {{1, 3, 20, 40, KERN_DTYPE_FP16, 0}, KERN_CODEC_KIVI2},
    {{1, 3, 20, 40, KERN_DTYPE_BF16, 1}, KERN_CODEC_KIVI4},
    {{1, 2, 40, 65, KERN_DTYPE_BF16, 0}, KERN_CODEC_KIVI2},
    {{1, 1, 7, 3, KERN_DTYPE_FP16, 1}, KERN_CODEC_KIVI4},
    {{1, 1, 7, 3, KERN_DTYPE_FP16, 0}, KERN_CODEC_KIVI2},
    {{1, 2, 8, 1, KERN_DTYPE_FP16, 0}, KERN_CODEC_KIVI4},
    {{1, 2, 200, 32, KERN_DTYPE_FP16, 0}, KERN_CODEC_KIVI4},
    {{1, 1, 576, 70, KERN_DTYPE_BF16, 1}, KERN_CODEC_KIVI2},
    {{1, 1, 1024, 33, KERN_DTYPE_FP16, 1}, KERN_CODEC_KIVI4},
};
#define NUNIT_CASES (sizeof(unit_cases) / sizeof(unit_cases[0]))

/* Every path gives the reference's bytes on each unit case (outlier, run and low-rank data:
 * MERGE's runs of 1-6 tokens, and on outlier data no runs, its rows full halfway), and
 * the encoder's emulation does so from a source 2 bytes off a 16-byte boundary too (its
 * element-by-element loads). */
START_TEST(test_encoder_units_same_bytes)
{
    const struct unit_case *uc = &unit_cases[_i];
    struct kern_layout lay = layout_of(&uc->sh);
    struct kern_recipe rec;
    ck_assert(kern_codec_supports(&lay, (enum kern_codec)uc->codec));
    kern_recipe_fill(&rec, uc->codec, uc->codec, 0);
    rec.seed = 0x5150u + (uint32_t)_i;
    for (int kind = DATA_OUTLIER; kind <= DATA_LOWRANK; kind++) {
        uint16_t *raw = make_data(&lay, (enum data_kind)kind, 200 + (uint64_t)_i);
        const uint64_t rs = kern_raw_size(&lay);
        const int64_t sz = kern_encoded_size(&lay, &rec);
        uint8_t *e1 = same_bytes(&lay, &rec, raw), *e3 = malloc((size_t)sz);
        uint8_t *off = malloc(rs + 2);
        ck_assert(e3 && off);
        memcpy(off + 2, raw, rs);
        memset(e3, 0x77, (size_t)sz);
        ck_assert_int_eq(kern_encode_batched_cpu(&lay, &rec, off + 2, e3, (size_t)sz), sz);
        ck_assert_mem_eq(e3, e1, (size_t)sz);
        free(off);
        free(e3);
        free(e1);
        free(raw);
    }
    const uint32_t alike[3] = {33, 257, lay.tokens / 2 + 1};
    for (uint32_t i = 0; uc->codec == KERN_CODEC_MERGE && i < 3; i++) {
        /* tokens 0..p-1 alike (one window of joins, then eight), token p the first of a new
         * run: the next window starts with a run; then half the tokens alike in V alone
         * (K+V layouts): K's rows are far apart, so every token starts a run */
        const uint32_t p = alike[i], kinds = lay.k_only ? 1 : 2;
        uint16_t *raw = make_data(&lay, DATA_OUTLIER, 300 + (uint64_t)_i);
        for (uint32_t l = 0; l < lay.layers; l++)
            for (uint32_t k = i == 2 ? kinds - 1 : 0; k < kinds; k++)
                for (uint32_t t = 1; t < lay.tokens && t < p; t++)
                    memcpy(raw + kern_raw_index(&lay, l, k, t, 0),
                           raw + kern_raw_index(&lay, l, k, 0, 0), 2ull * lay.heads * lay.head_dim);
        free(same_bytes(&lay, &rec, raw));
        free(raw);
    }
    if (uc->codec == KERN_CODEC_MERGE) {
        /* a drift: each head's rows turn 0.15 radian a token in the plane of two Gaussian rows
         * a and b, so a token is near the one before it (cos 0.989 > 0.98) but not the one two
         * before (cos 0.955): runs of two tokens, each token judged against its run's first,
         * not against its predecessor, which would join them all */
        uint16_t *raw = make_data(&lay, DATA_OUTLIER, 400 + (uint64_t)_i);
        const uint32_t D = lay.head_dim;
        float *a = malloc(2 * sizeof(float) * D);
        uint64_t st = 0x5eedu + (uint64_t)_i;
        ck_assert_ptr_nonnull(a);
        for (uint32_t l = 0; l < lay.layers; l++)
            for (uint32_t k = 0; k < (lay.k_only ? 1u : 2u); k++)
                for (uint32_t h = 0; h < lay.heads; h++) {
                    for (uint32_t d = 0; d < 2 * D; d++)
                        a[d] = rng_gauss(&st);
                    for (uint32_t t = 0; t < lay.tokens; t++)
                        for (uint32_t d = 0; d < D; d++)
                            put(&lay, raw, kern_raw_index(&lay, l, k, t, h) + d,
                                cosf(0.15f * (float)t) * a[d] + sinf(0.15f * (float)t) * a[D + d]);
                }
        free(same_bytes(&lay, &rec, raw));
        free(a);
        free(raw);
    }
}
END_TEST

/* KIVI keys whose channel minimum is a zero of both signs: the reference's min is the first,
 * in token order, of the values no later one is below, so -0 or +0 by which comes first, and
 * its fp16 min says which. The units take each slice's min in registers and fold the slices
 * in order (kern_enc_kk_phase0, _phase1): channel 0 has -0 at token 5 and +0 at token 20
 * (other slices at every head_dim here), channel 1 +0 at token 4 and -0 at token 5 (one slice
 * where a slice holds 2 tokens or more: head_dim 128, 2 a slice); the other values are
 * positive. Head dims 128 (16-byte loads) and 20 (element loads, a token a slice), KIVI-2
 * and KIVI-4. */
static uint16_t *kivi_zero_ties(const struct kern_layout *lay)
{
    uint16_t *raw = malloc(kern_raw_size(lay));
    ck_assert_ptr_nonnull(raw);
    for (uint64_t i = 0; i < kern_raw_size(lay) / 2; i++)
        put(lay, raw, i, 0.25f + 0.01f * (float)(i % 97));
    raw[kern_raw_index(lay, 0, 0, 5, 0)] = 0x8000;
    raw[kern_raw_index(lay, 0, 0, 20, 0)] = 0x0000;
    raw[kern_raw_index(lay, 0, 0, 4, 0) + 1] = 0x0000;
    raw[kern_raw_index(lay, 0, 0, 5, 0) + 1] = 0x8000;
    return raw;
}

START_TEST(test_kivi_key_zero_ties)
{
    const uint32_t codec = _i % 2 ? KERN_CODEC_KIVI4 : KERN_CODEC_KIVI2, D = _i / 2 ? 20 : 128;
    struct kern_layout lay = {1, 2, D, 32, KERN_DTYPE_FP16, 0};
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    uint16_t *raw = kivi_zero_ties(&lay);
    uint8_t *e = same_bytes(&lay, &rec, raw);
    const uint8_t *mins = e + kern_hdr_bytes(&lay) + 2 * D; /* head 0, group 0: scales, mins */
    ck_assert_uint_eq(mins[0] | mins[1] << 8, 0x8000);
    ck_assert_uint_eq(mins[2] | mins[3] << 8, 0x0000);
    free(e);
    free(raw);
}
END_TEST

/* ---- CUDA: the device's bytes ------------------------------------------------------------ */

/* The device encodes and decodes raw as the reference does, byte for byte. */
static void cuda_same(const struct kern_layout *lay, const struct kern_recipe *rec,
                      const uint16_t *raw)
{
    int64_t sz = kern_encoded_size(lay, rec);
    uint64_t rs = kern_raw_size(lay);
    uint8_t *e_ref = malloc((size_t)sz), *e_gpu = malloc((size_t)sz);
    uint8_t *d_ref = malloc(rs), *d_gpu = malloc(rs);
    void *g_raw, *g_enc, *g_dec;
    ck_assert_int_eq(kern_encode_ref(lay, rec, raw, e_ref, (size_t)sz, NULL), sz);
    ck_assert_int_eq(kern_cuda_alloc(&g_raw, rs), 0);
    ck_assert_int_eq(kern_cuda_alloc(&g_enc, (size_t)sz), 0);
    ck_assert_int_eq(kern_cuda_alloc(&g_dec, rs), 0);
    ck_assert_int_eq(kern_cuda_copy(g_raw, raw, rs, KERN_CUDA_H2D, NULL), 0);
    ck_assert_int_eq(kern_encode_cuda(lay, rec, g_raw, g_enc, (size_t)sz, NULL, NULL), sz);
    ck_assert_int_eq(kern_decode_cuda(lay, g_enc, (size_t)sz, g_dec, rs, lay->dtype, 0, NULL),
                     (int64_t)rs);
    ck_assert_int_eq(kern_cuda_copy(e_gpu, g_enc, (size_t)sz, KERN_CUDA_D2H, NULL), 0);
    ck_assert_int_eq(kern_cuda_copy(d_gpu, g_dec, rs, KERN_CUDA_D2H, NULL), 0);
    ck_assert_int_eq(kern_cuda_stream_sync(NULL), 0);
    kern_cuda_free(g_raw);
    kern_cuda_free(g_enc);
    kern_cuda_free(g_dec);
    ck_assert_mem_eq(e_gpu, e_ref, (size_t)sz);
    ck_assert_int_eq(kern_decode_ref(lay, e_ref, (size_t)sz, d_ref, rs, lay->dtype), (int64_t)rs);
    ck_assert_mem_eq(d_gpu, d_ref, rs);
    free(e_ref);
    free(e_gpu);
    free(d_ref);
    free(d_gpu);
}

/* ROT's AVX-512 path is in use exactly where the CPU has AVX-512 F, BW, VL, DQ and F16C
 * (unless KVC_NO_AVX512 says otherwise), and the tests' switch can take it off and put it
 * back but never turn it on for a CPU without it. */
START_TEST(test_rot_avx512_switch)
{
    const char *e = getenv("KVC_NO_AVX512");
    const int off = e && *e && strcmp(e, "0") != 0;
    ck_assert_int_eq(kern_rot512_on(), have_avx512() && !off);
    const int was = kern_rot_avx512(0);
    ck_assert_int_eq(kern_rot512_on(), 0);
    kern_rot_avx512(1);
    ck_assert_int_eq(kern_rot512_on(), have_avx512());
    kern_rot_avx512(was);
    ck_assert_int_eq(kern_rot512_on(), have_avx512() && !off);
}
END_TEST

START_TEST(test_cuda_same_bytes)
{
    const struct shape *sh = &shapes[(uint32_t)_i / NCODECS];
    const uint32_t codec = codecs[(uint32_t)_i % NCODECS];
    struct kern_layout lay = layout_of(sh);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    uint16_t *raw =
        make_data(&lay, codec == KERN_CODEC_MERGE ? DATA_RUNS : DATA_OUTLIER, 600 + (uint64_t)_i);
    cuda_same(&lay, &rec, raw);
    free(raw);
}
END_TEST

/* test_kivi_key_zero_ties on the device. */
START_TEST(test_cuda_kivi_key_zero_ties)
{
    const uint32_t codec = _i % 2 ? KERN_CODEC_KIVI4 : KERN_CODEC_KIVI2, D = _i / 2 ? 20 : 128;
    struct kern_layout lay = {1, 2, D, 32, KERN_DTYPE_FP16, 0};
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    uint16_t *raw = kivi_zero_ties(&lay);
    cuda_same(&lay, &rec, raw);
    free(raw);
}
END_TEST

/* The encoder units' shapes (unit_cases) on the device, every data kind. */
START_TEST(test_cuda_units_same_bytes)
{
    const struct unit_case *uc = &unit_cases[_i];
    struct kern_layout lay = layout_of(&uc->sh);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, uc->codec, uc->codec, 0);
    rec.seed = 0x5150u + (uint32_t)_i;
    for (int kind = DATA_OUTLIER; kind <= DATA_LOWRANK; kind++) {
        uint16_t *raw = make_data(&lay, (enum data_kind)kind, 200 + (uint64_t)_i);
        cuda_same(&lay, &rec, raw);
        free(raw);
    }
}
END_TEST

static Suite *codecs_suite(void)
{
    Suite *s = suite_create("codecs");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, daemon_slow() * 120);
    tcase_add_loop_test(tc, test_paths_same_bytes, 0, (int)(NSHAPES * NCODECS));
    tcase_add_loop_test(tc, test_constant_heads_same_bytes, 0, (int)(NSHAPES * NCODECS));
    tcase_add_loop_test(tc, test_signed_zeros_same_bytes, 0, (int)(NSHAPES * NCODECS));
    tcase_add_loop_test(tc, test_merge_forced_bad_row_same_bytes, 0, (int)(NSHAPES * NCODECS));
    tcase_add_loop_test(tc, test_rot_signed_zero_rows_same_bytes, 0, (int)(NSHAPES * NCODECS));
    tcase_add_loop_test(tc, test_rot_scan_bad_anywhere_same_bytes, 0, (int)(NSHAPES * NCODECS));
    tcase_add_loop_test(tc, test_large_keys_same_bytes, 0, (int)(NSHAPES * NCODECS));
    tcase_add_loop_test(tc, test_stats_same, 0, (int)(NSHAPES * NCODECS));
    tcase_add_loop_test(tc, test_merge_stats_same, 0, (int)NMERGE_STATS);
    tcase_add_loop_test(tc, test_encoder_units_same_bytes, 0, (int)NUNIT_CASES);
    tcase_add_loop_test(tc, test_kivi_key_zero_ties, 0, 4);
    tcase_add_loop_test(tc, test_error_bounds, 0, (int)NSHAPES);
    tcase_add_test(tc, test_rotation_lowers_key_error);
    tcase_add_test(tc, test_rotation_orthonormal);
    tcase_add_test(tc, test_merge_hand);
    tcase_add_loop_test(tc, test_merge_may_force, 0, (int)NSHAPES);
    tcase_add_test(tc, test_merge_may_force_hand);
    tcase_add_test(tc, test_merge_may_force_raced);
    tcase_add_test(tc, test_lowrank_rank);
    tcase_add_test(tc, test_sizes_and_shapes);
    tcase_add_test(tc, test_rot_avx512_switch);
    suite_add_tcase(s, tc);
    if (!(kern_supports() & KERN_SUPPORT_CPU_AVX2))
        printf("SKIP: check_codecs: avx2: this CPU lacks AVX2+F16C, so kern_*_cpu is the "
               "reference and no vectorised code is tested\n");
    if (!have_avx512())
        printf("SKIP: check_codecs: avx512: this CPU lacks AVX-512 F/BW/VL/DQ, so ROT's "
               "AVX-512 path is not tested (the AVX2 path is)\n");
    if (daemon_cuda_devices() > 0) {
        tc = tcase_create("cuda");
        tcase_set_timeout(tc, daemon_slow() * 120);
        tcase_add_loop_test(tc, test_cuda_same_bytes, 0, (int)(NSHAPES * NCODECS));
        tcase_add_loop_test(tc, test_cuda_units_same_bytes, 0, (int)NUNIT_CASES);
        tcase_add_loop_test(tc, test_cuda_kivi_key_zero_ties, 0, 4);
        suite_add_tcase(s, tc);
    } else {
        printf("SKIP: check_codecs: cuda: %s\n",
               daemon_cuda_devices() < 0 ? "the CUDA probe died" : "no device");
    }
    return s;
}

int main(void)
{
    return daemon_suite_run(codecs_suite());
}
