/*
 * check_kernels.c — the block codecs: every fast version against the reference.
 *
 * The reference is checked against hand-computed ggml blocks and an independent transcription
 * of ggml's quantize formulas; every codec of the reference and of the AVX2 version, encoder
 * and decoder, must give the bytes of a second implementation of the format that shares no
 * code with kernels/ (tests/lib/kern_oracle.c), on ordinary data, on data that lands on
 * rounding ties and on edge values; the AVX2 and CUDA versions must give the reference's
 * bytes exactly (codes, scales, decoded values), and every codec must reconstruct within its
 * normalised error bound. CUDA cases are registered only when a device is found; on a CPU
 * without AVX2 the suite says SKIP for the vectorised code.
 */
#include <check.h>
#include <errno.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern.h"
#include "kernels/kern_cpu.h"
#include "kernels/kern_batch.h"
#include "kernels/kern_fmt.h"
#include "kernels/kern_pack.h"
#include "tests/lib/daemon.h"
#include "tests/lib/kern_oracle.h"
#include "tests/lib/rng.h"

/* The codecs every shape takes and the oracle knows (raw .. fp8); the transform codecs
 * (ROT2/ROT4, MERGE, LOWRANK) have cases of their own below. */
#define NCODEC_V1 (KERN_CODEC_FP8 + 1)

/* ---- data ---------------------------------------------------------------------------- */

/* A raw block with KV-like structure: keys have a few large outlier channels. */
static void *make_block(const struct kern_layout *lay, uint64_t seed)
{
    uint64_t n = kern_raw_size(lay) / 2, s = seed * 0x9e3779b97f4a7c15ull + 1;
    uint16_t *b = malloc(n * 2);
    ck_assert_ptr_nonnull(b);
    uint32_t kinds = lay->k_only ? 1 : 2;
    for (uint32_t l = 0; l < lay->layers; l++)
        for (uint32_t k = 0; k < kinds; k++)
            for (uint32_t t = 0; t < lay->tokens; t++)
                for (uint32_t h = 0; h < lay->heads; h++)
                    for (uint32_t d = 0; d < lay->head_dim; d++) {
                        float v = rng_gauss(&s);
                        if (k == 0 && (d * 7 + h) % 29 == 3)
                            v = v * 0.5f + 12.0f; /* outlier channel */
                        uint64_t i = kern_raw_index(lay, l, k, t, h) + d;
                        b[i] = lay->dtype == KERN_DTYPE_BF16 ? kern_f2bf(v) : kern_f2h(v);
                    }
    return b;
}

static struct kern_layout layout(uint32_t layers, uint32_t heads, uint32_t dim, uint32_t tokens,
                                 uint32_t dtype, uint32_t k_only)
{
    struct kern_layout l = {layers, heads, dim, tokens, dtype, k_only};
    return l;
}

/* ---- ggml vectors -------------------------------------------------------------------- */

START_TEST(test_ggml_hand_vectors)
{
    float x[32];
    uint8_t b[34];

    /* q8_0, roundf ties away from zero: d = 1, q = round(x) */
    memset(x, 0, sizeof(x));
    x[0] = 127.0f, x[1] = 2.5f, x[2] = -2.5f, x[3] = 0.5f, x[4] = -0.5f, x[5] = -127.0f;
    kern_q8_0_enc(x, 32, b);
    ck_assert_uint_eq(b[0] | b[1] << 8, 0x3c00);
    ck_assert_int_eq((int8_t)b[2], 127);
    ck_assert_int_eq((int8_t)b[3], 3);
    ck_assert_int_eq((int8_t)b[4], -3);
    ck_assert_int_eq((int8_t)b[5], 1);
    ck_assert_int_eq((int8_t)b[6], -1);
    ck_assert_int_eq((int8_t)b[7], -127);
    ck_assert_int_eq(b[8], 0);

    /* q8_0: x = (j - 16) / 2: amax 8, d = 8/127 -> half 0x2c08, q = round(x * 15.875) */
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16) * 0.5f;
    kern_q8_0_enc(x, 32, b);
    ck_assert_uint_eq(b[0] | b[1] << 8, 0x2c08);
    ck_assert_int_eq((int8_t)b[2 + 0], -127);
    ck_assert_int_eq((int8_t)b[2 + 1], -119);
    ck_assert_int_eq((int8_t)b[2 + 16], 0);
    ck_assert_int_eq((int8_t)b[2 + 17], 8);
    ck_assert_int_eq((int8_t)b[2 + 18], 16);
    ck_assert_int_eq((int8_t)b[2 + 31], 119);

    /* q4_1: x = j: d = 31/15 -> half 0x4022, m = 0, q = min(15, (int)(j * 15/31 + 0.5)) */
    for (int j = 0; j < 32; j++)
        x[j] = (float)j;
    kern_qx_1_enc(x, 32, b, 4);
    ck_assert_uint_eq(b[0] | b[1] << 8, 0x4022);
    ck_assert_uint_eq(b[2] | b[3] << 8, 0x0000);
    ck_assert_uint_eq(b[4 + 0], 0x80);  /* q0 = 0, q16 = 8 */
    ck_assert_uint_eq(b[4 + 1], 0x80);  /* q1 = 0 (0.98), q17 = 8 (8.73) */
    ck_assert_uint_eq(b[4 + 2], 0x91);  /* q2 = 1, q18 = 9 */
    ck_assert_uint_eq(b[4 + 15], 0xf7); /* q15 = 7, q31 = 15 */

    /* q5_1: x = j: d = 1, m = 0, q = j: qs[j] = j | j << 4, bit 4 set for j >= 16 */
    kern_qx_1_enc(x, 32, b, 5);
    ck_assert_uint_eq(b[0] | b[1] << 8, 0x3c00);
    ck_assert_uint_eq(b[2] | b[3] << 8, 0x0000);
    uint32_t qh;
    memcpy(&qh, b + 4, 4);
    ck_assert_uint_eq(qh, 0xffff0000u);
    for (int j = 0; j < 16; j++)
        ck_assert_uint_eq(b[8 + j], (uint8_t)(j | j << 4));
}
END_TEST

/* ggml's quantize_row_*_ref formulas, written out independently, fp16 through F16C. */
__attribute__((target("f16c"))) static uint16_t f16c(float f)
{
    return (uint16_t)_cvtss_sh(f, 0);
}

static void indep_q8_0(const float *x, uint8_t *b)
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127;
    const float id = d ? 1.0f / d : 0.0f;
    uint16_t dh = f16c(d);
    memcpy(b, &dh, 2);
    for (int j = 0; j < 32; j++)
        b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

static void indep_qx_1(const float *x, uint8_t *b, int bits)
{
    float min = 3.402823466e38f, max = -3.402823466e38f;
    for (int j = 0; j < 32; j++) {
        min = x[j] < min ? x[j] : min;
        max = x[j] > max ? x[j] : max;
    }
    const float d = (max - min) / ((1 << bits) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    uint16_t dh = f16c(d), mh = f16c(min);
    memcpy(b, &dh, 2);
    memcpy(b + 2, &mh, 2);
    uint32_t qh = 0;
    uint8_t *qs = b + (bits == 5 ? 8 : 4);
    for (int j = 0; j < 16; j++) {
        const float x0 = (x[j] - min) * id;
        const float x1 = (x[16 + j] - min) * id;
        int q0 = (int8_t)(x0 + 0.5f), q1 = (int8_t)(x1 + 0.5f);
        if (bits == 4) {
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
        }
        qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
        qh |= ((q0 & 0x10u) >> 4) << j;
        qh |= ((q1 & 0x10u) >> 4) << (j + 16);
    }
    if (bits == 5)
        memcpy(b + 4, &qh, 4);
}

START_TEST(test_ggml_independent)
{
    uint64_t s = 7;
    float x[32];
    uint8_t a[34], b[34];
    for (int it = 0; it < 2000; it++) {
        float scale = (float)ldexp(1.0, (int)(rng_next(&s) % 24) - 12);
        for (int j = 0; j < 32; j++)
            x[j] = kern_h2f(kern_f2h(rng_gauss(&s) * scale));
        kern_q8_0_enc(x, 32, a);
        indep_q8_0(x, b);
        ck_assert_mem_eq(a, b, 34);
        kern_qx_1_enc(x, 32, a, 4);
        indep_qx_1(x, b, 4);
        ck_assert_mem_eq(a, b, 20);
        kern_qx_1_enc(x, 32, a, 5);
        indep_qx_1(x, b, 5);
        ck_assert_mem_eq(a, b, 24);
    }
}
END_TEST

/* The scalar fp16 conversion is F16C's, for every float class we feed it. */
START_TEST(test_f16_conversion)
{
    uint64_t s = 11;
    for (int it = 0; it < 200000; it++) {
        uint32_t u = (uint32_t)rng_next(&s);
        if (it % 3 == 0) /* concentrate on the half range and its edges */
            u = (u & 0x81ffffffu) | (0x33000000u + ((u >> 8) % 0x14800000u));
        float f = kern_u2f(u);
        ck_assert_uint_eq(kern_f2h(f), f16c(f));
    }
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = kern_h2f((uint16_t)h);
        if (f == f)
            ck_assert_uint_eq(kern_f2h(f), h);
    }
    ck_assert_uint_eq(kern_f2h(65519.0f), 0x7bff);
    ck_assert_uint_eq(kern_f2h(65520.0f), 0x7c00);
}
END_TEST

/* kern_value_l1 (VATP's value norm, on the quantize worker's path) is the mean over (layer,
 * head, token) of the sanitised |value| summed in order, for every bit pattern of both dtypes
 * (NaN, infinity, subnormals, bf16 past the fp16 range) and a row that is no multiple of the
 * eight partial sums. Keys are never read. */
START_TEST(test_value_l1)
{
    static const struct {
        uint32_t layers, heads, head_dim, tokens;
    } shape[] = {{2, 8, 128, 16}, {1, 1, 3, 5}, {3, 2, 7, 9}};
    for (uint32_t dt = 0; dt < 2; dt++)
        for (uint32_t k = 0; k < sizeof(shape) / sizeof(shape[0]); k++) {
            struct kern_layout lay = {.layers = shape[k].layers,
                                      .heads = shape[k].heads,
                                      .head_dim = shape[k].head_dim,
                                      .tokens = shape[k].tokens,
                                      .dtype = dt ? KERN_DTYPE_BF16 : KERN_DTYPE_FP16};
            uint64_t row = (uint64_t)lay.tokens * lay.heads * lay.head_dim;
            uint64_t n = 2 * lay.layers * row;
            uint16_t *v = malloc(n * 2);
            ck_assert_ptr_nonnull(v);
            for (uint32_t pass = 0; pass * lay.layers * row < 0x10000u || pass < 3; pass++) {
                double want = 0.0;
                for (uint64_t i = 0; i < n; i++) {
                    uint64_t l = i / (2 * row), val = (i / row) % 2;
                    /* values: bit pattern after bit pattern; keys: NaN, never counted */
                    v[i] = val ? (uint16_t)((pass * lay.layers + l) * row + i % row) : 0x7fff;
                }
                for (uint32_t l = 0; l < lay.layers; l++)
                    for (uint64_t i = 0; i < row; i++)
                        want +=
                            fabsf(kern_sanitize(kern_load(v, lay.dtype, (2 * l + 1) * row + i)));
                want /= (double)lay.layers * lay.heads * lay.tokens;
                double got = kern_value_l1(&lay, v);
                ck_assert_msg(fabs(got - want) <= 1e-5 * want,
                              "dtype %u shape %u pass %u: %g, want %g", dt, k, pass, got, want);
            }
            free(v);
        }
}
END_TEST

START_TEST(test_e4m3)
{
    /* every finite code decodes and re-encodes to itself (0x80 = -0) */
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f)
            continue;
        ck_assert_uint_eq(kern_e4m3_enc(kern_e4m3_dec((uint8_t)c)), (uint8_t)c);
    }
    ck_assert_float_eq(kern_e4m3_dec(0x7e), 448.0f);
    ck_assert_float_eq(kern_e4m3_dec(0x01), 0.001953125f);
    ck_assert_float_eq(kern_e4m3_dec(0x08), 0.015625f);
    ck_assert_uint_eq(kern_e4m3_enc(1000.0f), 0x7e);
    ck_assert_uint_eq(kern_e4m3_enc(-1000.0f), 0xfe);
    ck_assert_uint_eq(kern_e4m3_enc(17.0f), 0x58); /* tie between 16 and 18: even -> 16 */
    ck_assert_uint_eq(kern_e4m3_enc(19.0f), 0x5a); /* tie between 18 and 20: even -> 20 */
    ck_assert_uint_eq(kern_e4m3_enc(0.0009765625f), 0x00); /* half the smallest: even -> 0 */
}
END_TEST

/* ---- block round trips --------------------------------------------------------------- */

struct shape {
    uint32_t layers, heads, dim, tokens, dtype, k_only;
};

static const struct shape shapes[] = {
    {2, 2, 128, 32, KERN_DTYPE_FP16, 0}, {2, 2, 128, 16, KERN_DTYPE_BF16, 0},
    {1, 3, 80, 33, KERN_DTYPE_FP16, 0},  {1, 2, 7, 5, KERN_DTYPE_BF16, 0},
    {2, 1, 576, 16, KERN_DTYPE_FP16, 1}, {1, 2, 100, 40, KERN_DTYPE_BF16, 1},
    {1, 1, 33, 64, KERN_DTYPE_FP16, 0},
};
#define NSHAPES (sizeof(shapes) / sizeof(shapes[0]))

/* Normalised RMS reconstruction error bound per codec on Gaussian-like data. */
static const double err_bound[KERN_CODEC_COUNT] = {
    [KERN_CODEC_RAW] = 0.0,     [KERN_CODEC_Q8_0] = 0.02, [KERN_CODEC_Q4_1] = 0.12,
    [KERN_CODEC_Q5_1] = 0.06,   [KERN_CODEC_KIVI2] = 0.5,  [KERN_CODEC_KIVI4] = 0.12,
    [KERN_CODEC_FP8] = 0.05,
};

static float raw_get(const struct kern_layout *lay, const void *b, uint32_t dtype, uint64_t i)
{
    (void)lay;
    return kern_load(b, dtype, i);
}

/* sqrt(sum (x - y)^2 / sum x^2) over one (layer, kind) section, on sanitised input. */
static double sect_err(const struct kern_layout *lay, const void *a, const void *b,
                       uint32_t bdtype, uint32_t l, uint32_t k)
{
    double num = 0, den = 0;
    uint64_t base = kern_raw_index(lay, l, k, 0, 0);
    uint64_t n = (uint64_t)lay->tokens * lay->heads * lay->head_dim;
    for (uint64_t i = 0; i < n; i++) {
        double x = kern_sanitize(raw_get(lay, a, lay->dtype, base + i));
        double y = raw_get(lay, b, bdtype, base + i);
        num += (x - y) * (x - y);
        den += x * x;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Encodes with both CPU versions (identical bytes), decodes with both (identical values) and
 * checks each section's error; returns the encoded block (ref) for more checks. */
static uint8_t *roundtrip(const struct kern_layout *lay, const struct kern_recipe *rec,
                          const void *raw, uint32_t out_dtype, int check_err)
{
    int64_t sz = kern_encoded_size(lay, rec);
    ck_assert_int_gt(sz, 0);
    uint64_t rs = kern_raw_size(lay);
    uint8_t *e1 = malloc((size_t)sz), *e2 = malloc((size_t)sz);
    uint8_t *d1 = malloc(rs), *d2 = malloc(rs);
    ck_assert(e1 && e2 && d1 && d2);
    memset(e1, 0xa5, (size_t)sz);
    memset(e2, 0x5a, (size_t)sz);
    ck_assert_int_eq(kern_encode_ref(lay, rec, raw, e1, (size_t)sz, NULL), sz);
    ck_assert_int_eq(kern_encode_cpu(lay, rec, raw, e2, (size_t)sz, NULL), sz);
    ck_assert_mem_eq(e1, e2, (size_t)sz);
    ck_assert_int_eq(kern_block_info(e1, (size_t)sz, NULL, NULL), sz);
    memset(d1, 0xa5, rs);
    memset(d2, 0x5a, rs);
    ck_assert_int_eq(kern_decode_ref(lay, e1, (size_t)sz, d1, rs, out_dtype), (int64_t)rs);
    ck_assert_int_eq(kern_decode_cpu(lay, e1, (size_t)sz, d2, rs, out_dtype), (int64_t)rs);
    ck_assert_mem_eq(d1, d2, rs);
    uint32_t kinds = lay->k_only ? 1 : 2;
    for (uint32_t l = 0; check_err && l < lay->layers; l++)
        for (uint32_t k = 0; k < kinds; k++) {
            uint32_t c = rec->codec[l][k];
            double e = sect_err(lay, raw, d1, out_dtype, l, k);
            double bound = c == KERN_CODEC_RAW ? (out_dtype == lay->dtype ? 0.0 : 0.004)
                                               : err_bound[c];
            ck_assert_msg(e <= bound, "%s layer %u kind %u dim %u: error %g > %g",
                          kern_codec_name(c), l, k, lay->head_dim, e, bound);
        }
    free(e2);
    free(d1);
    free(d2);
    return e1;
}

START_TEST(test_codec_roundtrip)
{
    uint32_t codec = (uint32_t)_i % NCODEC_V1;
    const struct shape *sh = &shapes[(uint32_t)_i / NCODEC_V1];
    struct kern_layout lay =
        layout(sh->layers, sh->heads, sh->dim, sh->tokens, sh->dtype, sh->k_only);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    void *raw = make_block(&lay, 100 + (uint64_t)_i);
    free(roundtrip(&lay, &rec, raw, lay.dtype, 1));
    /* the other output dtype decodes the same values, rounded once more */
    free(roundtrip(&lay, &rec, raw, lay.dtype == KERN_DTYPE_FP16 ? KERN_DTYPE_BF16
                                                                 : KERN_DTYPE_FP16, 0));
    free(raw);
}
END_TEST

START_TEST(test_encoded_sizes)
{
    struct kern_layout lay = layout(32, 8, 128, 32, KERN_DTYPE_FP16, 0);
    struct kern_recipe rec;
    uint64_t raw = kern_raw_size(&lay);
    ck_assert_uint_eq(raw, 32ull * 2 * 32 * 8 * 128 * 2);
    uint64_t hdr = kern_hdr_bytes(&lay);
    ck_assert_uint_eq(hdr, 48 + 64 * 12);
    kern_recipe_fill(&rec, KERN_CODEC_RAW, KERN_CODEC_RAW, 0);
    ck_assert_int_eq(kern_encoded_size(&lay, &rec), (int64_t)(hdr + raw));
    kern_recipe_fill(&rec, KERN_CODEC_Q8_0, KERN_CODEC_Q8_0, 0);
    ck_assert_int_eq(kern_encoded_size(&lay, &rec), (int64_t)(hdr + raw / 64 * 34));
    kern_recipe_fill(&rec, KERN_CODEC_Q4_1, KERN_CODEC_Q5_1, 0);
    ck_assert_int_eq(kern_encoded_size(&lay, &rec), (int64_t)(hdr + raw / 128 * 20 + raw / 128 * 24));
    /* KIVI 2-bit keys at d = 128, 32 tokens: 1,024 B codes + 512 B scale/min per head */
    kern_recipe_fill(&rec, KERN_CODEC_KIVI2, KERN_CODEC_KIVI2, 0);
    ck_assert_uint_eq(kern_sect_bytes(&lay, KERN_CODEC_KIVI2, 0), 8 * (1024 + 512));
    ck_assert_uint_eq(kern_sect_bytes(&lay, KERN_CODEC_KIVI2, 1), 32 * 8 * 4 * 12);
    kern_recipe_fill(&rec, KERN_CODEC_FP8, KERN_CODEC_FP8, 0);
    ck_assert_int_eq(kern_encoded_size(&lay, &rec), (int64_t)(hdr + raw / 2 + 64 * 32));
    rec.codec[3][1] = KERN_CODEC_COUNT;
    ck_assert_int_eq(kern_encoded_size(&lay, &rec), -EINVAL);
    lay.head_dim = 0;
    ck_assert_int_eq(kern_encoded_size(&lay, &rec), -EINVAL);
    ck_assert_int_eq(kern_codec_from_name("kivi2"), KERN_CODEC_KIVI2);
    ck_assert_int_eq(kern_codec_from_name("q9"), -EINVAL);
    ck_assert_str_eq(kern_codec_name(KERN_CODEC_Q5_1), "q5_1");
}
END_TEST

/* Per-layer recipe: raw layers 0-1 bit-exact, every codec on some layer, K != V. */
START_TEST(test_recipe_mixed)
{
    struct kern_layout lay = layout(8, 2, 96, 32, KERN_DTYPE_FP16, 0);
    struct kern_recipe rec, got;
    struct kern_layout gl;
    kern_recipe_fill(&rec, KERN_CODEC_Q8_0, KERN_CODEC_Q8_0, 2);
    for (uint32_t l = 2; l < 8; l++) {
        rec.codec[l][0] = (uint8_t)(1 + (l - 2) % 6);
        rec.codec[l][1] = (uint8_t)(1 + (l + 1) % 6);
    }
    uint16_t *raw = make_block(&lay, 5);
    /* non-finite values in a raw layer survive bit for bit */
    raw[3] = 0x7e01;
    raw[4] = 0xfc00;
    int64_t sz = kern_encoded_size(&lay, &rec);
    uint8_t *enc = roundtrip(&lay, &rec, raw, KERN_DTYPE_FP16, 0);
    ck_assert_int_eq(kern_block_info(enc, (size_t)sz, &gl, &got), sz);
    ck_assert_uint_eq(gl.layers, 8);
    ck_assert_uint_eq(gl.head_dim, 96);
    for (uint32_t l = 0; l < 8; l++)
        ck_assert_mem_eq(got.codec[l], rec.codec[l], 2);
    uint8_t *dec = malloc(kern_raw_size(&lay));
    ck_assert_int_eq(kern_decode_cpu(&lay, enc, (size_t)sz, dec, kern_raw_size(&lay),
                                     KERN_DTYPE_FP16),
                     (int64_t)kern_raw_size(&lay));
    uint64_t l2 = kern_raw_index(&lay, 2, 0, 0, 0) * 2;
    ck_assert_mem_eq(dec, raw, l2); /* layers 0-1 */
    for (uint32_t l = 2; l < 8; l++)
        for (uint32_t k = 0; k < 2; k++)
            ck_assert_double_le(sect_err(&lay, raw, dec, KERN_DTYPE_FP16, l, k),
                                err_bound[rec.codec[l][k]]);

    /* errors: short buffers, a wrong layout, a damaged header */
    ck_assert_int_eq(kern_encode_cpu(&lay, &rec, raw, enc, (size_t)sz - 1, NULL), -ENOSPC);
    ck_assert_int_eq(kern_decode_cpu(&lay, enc, (size_t)sz, dec, kern_raw_size(&lay) - 1,
                                     KERN_DTYPE_FP16),
                     -ENOSPC);
    ck_assert_int_eq(kern_decode_ref(&lay, enc, (size_t)sz - 1, dec, kern_raw_size(&lay),
                                     KERN_DTYPE_FP16),
                     -EBADMSG);
    struct kern_layout other = lay;
    other.heads = 4;
    ck_assert_int_eq(kern_decode_cpu(&other, enc, (size_t)sz, dec, 1 << 30, KERN_DTYPE_FP16),
                     -EBADMSG);
    ck_assert_int_eq(kern_decode_cpu(&lay, enc, (size_t)sz, dec, kern_raw_size(&lay), 3),
                     -EINVAL);
    struct kern_key_stats partial = {.kmin = (float *)dec};
    ck_assert_int_eq(kern_encode_ref(&lay, &rec, raw, enc, (size_t)sz, &partial), -EINVAL);
    enc[sizeof(struct kern_block_hdr) + 5 * sizeof(struct kern_block_sect)] ^= 0x10;
    ck_assert_int_eq(kern_block_info(enc, (size_t)sz, NULL, NULL), -EBADMSG);
    ck_assert_int_eq(kern_decode_cpu(&lay, enc, (size_t)sz, dec, kern_raw_size(&lay),
                                     KERN_DTYPE_FP16),
                     -EBADMSG);
    enc[0] ^= 1;
    ck_assert_int_eq(kern_block_info(enc, (size_t)sz, NULL, NULL), -EBADMSG);
    free(dec);
    free(enc);
    free(raw);
}
END_TEST

/* NaN -> 0, +-Inf and huge -> +-65504 before a lossy codec; decoded output stays finite. */
START_TEST(test_nonfinite)
{
    uint32_t codec = 1 + (uint32_t)_i % (NCODEC_V1 - 1);
    uint32_t dtype = _i < NCODEC_V1 - 1 ? KERN_DTYPE_FP16 : KERN_DTYPE_BF16;
    struct kern_layout lay = layout(1, 2, 64, 32, dtype, 0);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    uint16_t *raw = make_block(&lay, 9);
    uint16_t nan = dtype == KERN_DTYPE_FP16 ? 0x7e00 : 0x7fc0;
    uint16_t pinf = dtype == KERN_DTYPE_FP16 ? 0x7c00 : 0x7f80;
    uint64_t n = kern_raw_size(&lay) / 2;
    for (uint64_t i = 0; i < n; i += 37)
        raw[i] = i % 3 == 0 ? nan : i % 3 == 1 ? pinf : (uint16_t)(pinf | 0x8000);
    if (dtype == KERN_DTYPE_BF16)
        raw[5] = kern_f2bf(1e30f); /* finite but past the fp16 range */
    uint8_t *enc = roundtrip(&lay, &rec, raw, dtype, 0);
    int64_t sz = kern_encoded_size(&lay, &rec);
    uint16_t *dec = malloc(n * 2);
    ck_assert_int_eq(kern_decode_ref(&lay, enc, (size_t)sz, dec, n * 2, KERN_DTYPE_BF16),
                     (int64_t)n * 2);
    for (uint64_t i = 0; i < n; i++) {
        float y = kern_bf2f(dec[i]);
        ck_assert_msg(isfinite(y), "%s: element %llu decodes to %g", kern_codec_name(codec),
                      (unsigned long long)i, y);
        ck_assert_float_le(fabsf(y), 65600.0f);
    }
    /* per element: NaN near 0 relative to its group, Inf near +-65504 */
    for (uint64_t i = 0; i < n; i += 37) {
        float y = kern_bf2f(dec[i]);
        if (i % 3 == 1)
            ck_assert_float_gt(y, codec == KERN_CODEC_KIVI2 ? 40000.0f : 60000.0f);
        else if (i % 3 == 2)
            ck_assert_float_lt(y, codec == KERN_CODEC_KIVI2 ? -40000.0f : -60000.0f);
    }
    free(dec);
    free(enc);
    free(raw);
}
END_TEST

START_TEST(test_key_stats)
{
    const struct shape *sh = &shapes[_i];
    struct kern_layout lay =
        layout(sh->layers, sh->heads, sh->dim, sh->tokens, sh->dtype, sh->k_only);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, KERN_CODEC_Q4_1, KERN_CODEC_KIVI2, 1); /* layer 0 raw */
    uint16_t *raw = make_block(&lay, 77);
    raw[1] = lay.dtype == KERN_DTYPE_FP16 ? 0x7e00 : 0x7fc0; /* NaN counts as 0 */
    uint64_t nlh = (uint64_t)lay.layers * lay.heads, nc = nlh * lay.head_dim;
    float *st[2][3];
    int64_t sz = kern_encoded_size(&lay, &rec);
    uint8_t *enc = malloc((size_t)sz);
    for (int v = 0; v < 2; v++) {
        st[v][0] = malloc(nc * 4);
        st[v][1] = malloc(nc * 4);
        st[v][2] = malloc(nlh * 4);
        struct kern_key_stats ks = {st[v][0], st[v][1], st[v][2]};
        int64_t r = v ? kern_encode_cpu(&lay, &rec, raw, enc, (size_t)sz, &ks)
                      : kern_encode_ref(&lay, &rec, raw, enc, (size_t)sz, &ks);
        ck_assert_int_eq(r, sz);
    }
    for (uint32_t l = 0; l < lay.layers; l++)
        for (uint32_t h = 0; h < lay.heads; h++) {
            double norm = 0;
            for (uint32_t t = 0; t < lay.tokens; t++) {
                double ss = 0;
                for (uint32_t d = 0; d < lay.head_dim; d++) {
                    double x = kern_sanitize(
                        kern_load(raw, lay.dtype, kern_raw_index(&lay, l, 0, t, h) + d));
                    ss += x * x;
                }
                norm += sqrt(ss);
            }
            norm /= lay.tokens;
            for (int v = 0; v < 2; v++)
                ck_assert_double_eq_tol(st[v][2][l * lay.heads + h], norm, 1e-4 * norm + 1e-6);
            for (uint32_t d = 0; d < lay.head_dim; d++) {
                float mn = INFINITY, mx = -INFINITY;
                for (uint32_t t = 0; t < lay.tokens; t++) {
                    float x = kern_sanitize(
                        kern_load(raw, lay.dtype, kern_raw_index(&lay, l, 0, t, h) + d));
                    mn = fminf(mn, x);
                    mx = fmaxf(mx, x);
                }
                uint64_t i = ((uint64_t)l * lay.heads + h) * lay.head_dim + d;
                for (int v = 0; v < 2; v++) {
                    ck_assert_float_eq(st[v][0][i], mn);
                    ck_assert_float_eq(st[v][1][i], mx);
                }
            }
        }
    for (int v = 0; v < 2; v++)
        for (int j = 0; j < 3; j++)
            free(st[v][j]);
    free(enc);
    free(raw);
}
END_TEST

START_TEST(test_supports)
{
    unsigned s = kern_supports();
    ck_assert_uint_eq(!!(s & KERN_SUPPORT_CUDA_BUILT), KVC_CUDA);
    ck_assert_uint_eq(!!(s & KERN_SUPPORT_CPU_AVX2),
                      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"));
    if (!KVC_CUDA) {
        struct kern_layout lay = layout(1, 1, 32, 32, KERN_DTYPE_FP16, 0);
        struct kern_recipe rec;
        kern_recipe_fill(&rec, KERN_CODEC_Q8_0, KERN_CODEC_Q8_0, 0);
        ck_assert_int_eq(kern_encode_cuda(&lay, &rec, NULL, NULL, 0, NULL, NULL), -ENOTSUP);
        ck_assert_int_eq(kern_decode_cuda(&lay, NULL, 0, NULL, 0, KERN_DTYPE_FP16, 0, NULL),
                         -ENOTSUP);
        ck_assert_int_eq(kern_cuda_device_count(), 0);
    }
}
END_TEST

/* ---- the CUDA twins' indexing on the CPU ----------------------------------------------- */

/* The encode and decode kernels' work (kern_encb.h, kern_batch.h: units, phases, rows, lanes),
 * run here one thread after another, writes the reference's bytes: every codec and shape,
 * NaN and Inf in the input, and shapes with several units per section (many groups, raw
 * sections above one unit, KIVI keys with several token groups). What runs on a GPU differs
 * only in which thread does what. */
static const struct shape emul_shapes[] = {
    {1, 8, 128, 256, KERN_DTYPE_FP16, 0},
    {2, 4, 96, 70, KERN_DTYPE_BF16, 0},
};
#define NEMUL (NSHAPES + sizeof(emul_shapes) / sizeof(emul_shapes[0]))

START_TEST(test_cuda_indexing_matches_ref)
{
    uint32_t codec = (uint32_t)_i % NCODEC_V1, si = (uint32_t)_i / NCODEC_V1;
    const struct shape *sh = si < NSHAPES ? &shapes[si] : &emul_shapes[si - NSHAPES];
    struct kern_layout lay =
        layout(sh->layers, sh->heads, sh->dim, sh->tokens, sh->dtype, sh->k_only);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec == KERN_CODEC_RAW ? KERN_CODEC_Q8_0 : codec, 0);
    if (lay.layers > 1)
        rec.codec[0][0] = KERN_CODEC_RAW;
    uint16_t *raw = make_block(&lay, 700 + (uint64_t)_i);
    raw[2] = lay.dtype == KERN_DTYPE_FP16 ? 0x7c00 : 0x7f80;
    raw[9] = lay.dtype == KERN_DTYPE_FP16 ? 0x7e00 : 0x7fc0;
    int64_t sz = kern_encoded_size(&lay, &rec);
    uint64_t rs = kern_raw_size(&lay);
    uint8_t *e_ref = malloc((size_t)sz), *e_emu = malloc((size_t)sz);
    uint8_t *d_ref = malloc(rs), *d_emu = malloc(rs);
    ck_assert_int_eq(kern_encode_ref(&lay, &rec, raw, e_ref, (size_t)sz, NULL), sz);
    memset(e_emu, 0xa5, (size_t)sz); /* every byte must be written, padding too */
    ck_assert_int_eq(kern_encode_batched_cpu(&lay, &rec, raw, e_emu, (size_t)sz), sz);
    ck_assert_mem_eq(e_emu, e_ref, (size_t)sz);
    struct kern_batch_args *a = malloc(sizeof(*a));
    const void *srcs[1] = {e_ref};
    uint64_t lens[1] = {(uint64_t)sz};
    for (uint32_t out = KERN_DTYPE_FP16; out <= KERN_DTYPE_BF16; out++) {
        ck_assert_int_eq(kern_decode_ref(&lay, e_ref, (size_t)sz, d_ref, rs, out), (int64_t)rs);
        memset(d_emu, 0xa5, rs);
        ck_assert_int_eq(kern_batch_decode_raw(a, &lay, d_emu, NULL, 1, srcs, lens, out), 0);
        kern_batch_run_cpu(a);
        ck_assert_mem_eq(d_emu, d_ref, rs);
    }
    free(a);
    free(e_ref);
    free(e_emu);
    free(d_ref);
    free(d_emu);
    free(raw);
}
END_TEST

/* Every 16-bit pattern, once each (a block of 65,536 values: K and V of 8 heads x 128 x 32
 * tokens, value i = i), fp16 and bf16, through the encode kernel's units for each v1 codec:
 * the reference's bytes. On the device the units convert fp16 by the conversion instruction
 * (kern_enc_in), which must agree with kern_h2f on every input once sanitised: subnormals, -0,
 * infinities and NaN payloads (test_cuda_every_half runs this block there). */
static uint16_t *every_half(struct kern_layout *lay, uint32_t dtype)
{
    *lay = layout(1, 8, 128, 32, dtype, 0);
    uint16_t *raw = malloc(kern_raw_size(lay));
    ck_assert(raw && kern_raw_size(lay) == 2 * 65536);
    for (uint32_t i = 0; i < 65536; i++)
        raw[i] = (uint16_t)i;
    return raw;
}

START_TEST(test_encode_every_half)
{
    const uint32_t codec = 1 + (uint32_t)_i / 2; /* q8_0 .. fp8 */
    struct kern_layout lay;
    uint16_t *raw = every_half(&lay, _i % 2 ? KERN_DTYPE_BF16 : KERN_DTYPE_FP16);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    const int64_t sz = kern_encoded_size(&lay, &rec);
    uint8_t *e_ref = malloc((size_t)sz), *e_emu = malloc((size_t)sz);
    ck_assert(e_ref && e_emu);
    ck_assert_int_eq(kern_encode_ref(&lay, &rec, raw, e_ref, (size_t)sz, NULL), sz);
    memset(e_emu, 0xa5, (size_t)sz);
    ck_assert_int_eq(kern_encode_batched_cpu(&lay, &rec, raw, e_emu, (size_t)sz), sz);
    ck_assert_mem_eq(e_emu, e_ref, (size_t)sz);
    free(e_ref);
    free(e_emu);
    free(raw);
}
END_TEST

/* Per-head precision: heads marked raw come back bit-exact from every decoder (reference,
 * vectorised, the CUDA decoder's rows on the CPU), in both output dtypes' own dtype; the
 * others decode as the codec alone; the CPU encoders agree byte for byte; the header check
 * refuses a tampered appendix; the encoders without an appendix refuse the recipe. */
START_TEST(test_raw_heads_bit_exact)
{
    static const uint32_t codecs[] = {KERN_CODEC_Q4_1, KERN_CODEC_KIVI2, KERN_CODEC_ROT4,
                                      KERN_CODEC_FP8};
    uint32_t codec = codecs[_i % 4];
    struct kern_layout lay = layout(3, 4, 64, 32, _i < 4 ? KERN_DTYPE_FP16 : KERN_DTYPE_BF16, 0);
    struct kern_recipe rec, plain;
    uint8_t mask[12] = {0}, got[12];
    mask[1] = mask[6] = mask[11] = 1; /* (0,1), (1,2), (2,3) */
    kern_recipe_fill(&plain, codec, codec, 0);
    rec = plain;
    rec.raw_heads = mask;
    uint16_t *raw = make_block(&lay, 900 + (uint64_t)_i);
    int64_t sz = kern_encoded_size(&lay, &rec), psz = kern_encoded_size(&lay, &plain);
    ck_assert_int_eq(sz, psz + 16 * 2 /* slot table, 24 B */ + 3 * 2 * 32 * 64 * 2);
    uint64_t rs = kern_raw_size(&lay);
    uint8_t *e_ref = malloc((size_t)sz), *e_cpu = malloc((size_t)sz), *e_plain = malloc(psz);
    uint16_t *d = malloc(rs), *dp = malloc(rs), *de = malloc(rs);
    ck_assert_int_eq(kern_encode_ref(&lay, &rec, raw, e_ref, (size_t)sz, NULL), sz);
    memset(e_cpu, 0xa5, (size_t)sz);
    ck_assert_int_eq(kern_encode_cpu(&lay, &rec, raw, e_cpu, (size_t)sz, NULL), sz);
    ck_assert_mem_eq(e_cpu, e_ref, (size_t)sz);
    ck_assert_int_eq(kern_encode_ref(&lay, &plain, raw, e_plain, (size_t)psz, NULL), psz);
    ck_assert_int_eq(kern_block_info(e_ref, (size_t)sz, NULL, NULL), sz);
    ck_assert_int_eq(kern_block_raw_heads(e_ref, (size_t)sz, got), 3);
    ck_assert_mem_eq(got, mask, sizeof(mask));
    ck_assert_int_eq(kern_decode_ref(&lay, e_plain, (size_t)psz, dp, rs, lay.dtype), (int64_t)rs);
    ck_assert_int_eq(kern_decode_ref(&lay, e_ref, (size_t)sz, d, rs, lay.dtype), (int64_t)rs);
    for (uint32_t l = 0; l < 3; l++)
        for (uint32_t k = 0; k < 2; k++)
            for (uint32_t t = 0; t < 32; t++)
                for (uint32_t h = 0; h < 4; h++) {
                    uint64_t i = (((uint64_t)l * 2 + k) * 32 + t) * 4 * 64 + (uint64_t)h * 64;
                    const uint16_t *want = mask[l * 4 + h] ? raw + i : dp + i;
                    ck_assert_mem_eq(d + i, want, 64 * 2);
                }
    ck_assert_int_eq(kern_decode_cpu(&lay, e_ref, (size_t)sz, de, rs, lay.dtype), (int64_t)rs);
    ck_assert_mem_eq(de, d, rs);
    struct kern_batch_args *a = malloc(sizeof(*a));
    const void *srcs[1] = {e_ref};
    uint64_t lens[1] = {(uint64_t)sz};
    for (uint32_t out = KERN_DTYPE_FP16; out <= KERN_DTYPE_BF16; out++) {
        ck_assert_int_eq(kern_decode_ref(&lay, e_ref, (size_t)sz, d, rs, out), (int64_t)rs);
        memset(de, 0xa5, rs);
        ck_assert_int_eq(kern_batch_decode_raw(a, &lay, de, NULL, 1, srcs, lens, out), 0);
        kern_batch_run_cpu(a);
        ck_assert_mem_eq(de, d, rs);
    }
    free(a);
    ck_assert_int_eq(kern_encode_batched_cpu(&lay, &rec, raw, e_cpu, (size_t)sz), -ENOTSUP);
    /* a tampered appendix: a slot out of order, then a count past the table */
    struct kern_block_hdr h;
    memcpy(&h, e_ref, sizeof(h));
    uint16_t s2 = 2;
    memcpy(e_cpu, e_ref, (size_t)sz);
    memcpy(e_cpu + (uint32_t)h.reserved + 2 * 1, &s2, 2);
    ck_assert_int_eq(kern_block_info(e_cpu, (size_t)sz, NULL, NULL), -EBADMSG);
    ck_assert_int_eq(kern_decode_cpu(&lay, e_cpu, (size_t)sz, de, rs, lay.dtype), -EBADMSG);
    memcpy(e_cpu, e_ref, (size_t)sz);
    h.reserved += 1ull << 32;
    memcpy(e_cpu, &h, sizeof(h));
    ck_assert_int_eq(kern_block_info(e_cpu, (size_t)sz, NULL, NULL), -EBADMSG);
    ck_assert_int_eq(kern_block_info(e_ref, (size_t)sz - 16, NULL, NULL), -EBADMSG);
    free(e_ref);
    free(e_cpu);
    free(e_plain);
    free(d);
    free(dp);
    free(de);
    free(raw);
}
END_TEST

/* ---- CUDA: the same bytes as the reference ------------------------------------------- */

/* test_encode_every_half's blocks on the device: its fp16 conversion instruction against
 * kern_h2f, every input. */
START_TEST(test_cuda_every_half)
{
    const uint32_t codec = 1 + (uint32_t)_i / 2;
    struct kern_layout lay;
    uint16_t *raw = every_half(&lay, _i % 2 ? KERN_DTYPE_BF16 : KERN_DTYPE_FP16);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    const int64_t sz = kern_encoded_size(&lay, &rec);
    const uint64_t rs = kern_raw_size(&lay);
    uint8_t *e_ref = malloc((size_t)sz), *e_gpu = malloc((size_t)sz);
    void *g_raw, *g_enc;
    ck_assert(e_ref && e_gpu);
    ck_assert_int_eq(kern_encode_ref(&lay, &rec, raw, e_ref, (size_t)sz, NULL), sz);
    ck_assert_int_eq(kern_cuda_alloc(&g_raw, rs), 0);
    ck_assert_int_eq(kern_cuda_alloc(&g_enc, (size_t)sz), 0);
    ck_assert_int_eq(kern_cuda_copy(g_raw, raw, rs, KERN_CUDA_H2D, NULL), 0);
    ck_assert_int_eq(kern_encode_cuda(&lay, &rec, g_raw, g_enc, (size_t)sz, NULL, NULL), sz);
    ck_assert_int_eq(kern_cuda_copy(e_gpu, g_enc, (size_t)sz, KERN_CUDA_D2H, NULL), 0);
    ck_assert_int_eq(kern_cuda_stream_sync(NULL), 0);
    kern_cuda_free(g_raw);
    kern_cuda_free(g_enc);
    ck_assert_mem_eq(e_gpu, e_ref, (size_t)sz);
    free(e_ref);
    free(e_gpu);
    free(raw);
}
END_TEST

START_TEST(test_cuda_matches_ref)
{
    uint32_t codec = (uint32_t)_i % NCODEC_V1;
    const struct shape *sh = &shapes[(uint32_t)_i / NCODEC_V1];
    struct kern_layout lay =
        layout(sh->layers, sh->heads, sh->dim, sh->tokens, sh->dtype, sh->k_only);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec == KERN_CODEC_RAW ? KERN_CODEC_Q8_0 : codec, 0);
    if (lay.layers > 1)
        rec.codec[0][0] = KERN_CODEC_RAW;
    uint16_t *raw = make_block(&lay, 300 + (uint64_t)_i);
    raw[2] = lay.dtype == KERN_DTYPE_FP16 ? 0x7c00 : 0x7f80;
    raw[9] = lay.dtype == KERN_DTYPE_FP16 ? 0x7e00 : 0x7fc0;
    int64_t sz = kern_encoded_size(&lay, &rec);
    uint64_t rs = kern_raw_size(&lay), nlh = (uint64_t)lay.layers * lay.heads;
    uint64_t nc = nlh * lay.head_dim;
    uint8_t *e_ref = malloc((size_t)sz), *e_gpu = malloc((size_t)sz);
    uint8_t *d_ref = malloc(rs), *d_gpu = malloc(rs);
    float *st_ref = malloc((2 * nc + nlh) * 4), *st_gpu = malloc((2 * nc + nlh) * 4);
    struct kern_key_stats ks = {st_ref, st_ref + nc, st_ref + 2 * nc};
    ck_assert_int_eq(kern_encode_ref(&lay, &rec, raw, e_ref, (size_t)sz, &ks), sz);
    for (int out = KERN_DTYPE_FP16; out <= KERN_DTYPE_BF16; out++) {
        void *g_raw, *g_enc, *g_dec, *g_st;
        ck_assert_int_eq(kern_cuda_alloc(&g_raw, rs), 0);
        ck_assert_int_eq(kern_cuda_alloc(&g_enc, (size_t)sz), 0);
        ck_assert_int_eq(kern_cuda_alloc(&g_dec, rs), 0);
        ck_assert_int_eq(kern_cuda_alloc(&g_st, (2 * nc + nlh) * 4), 0);
        struct kern_key_stats gs = {g_st, (float *)g_st + nc, (float *)g_st + 2 * nc};
        ck_assert_int_eq(kern_cuda_copy(g_raw, raw, rs, KERN_CUDA_H2D, NULL), 0);
        ck_assert_int_eq(kern_encode_cuda(&lay, &rec, g_raw, g_enc, (size_t)sz, &gs, NULL), sz);
        /* the format hint for fp16 out (the codec's kernel), none for bf16 (every round) */
        const uint32_t hint = out == KERN_DTYPE_FP16 ? 1u << codec : 0;
        ck_assert_int_eq(kern_decode_cuda(&lay, g_enc, (size_t)sz, g_dec, rs, out, hint, NULL),
                         (int64_t)rs);
        ck_assert_int_eq(kern_cuda_copy(e_gpu, g_enc, (size_t)sz, KERN_CUDA_D2H, NULL), 0);
        ck_assert_int_eq(kern_cuda_copy(d_gpu, g_dec, rs, KERN_CUDA_D2H, NULL), 0);
        ck_assert_int_eq(kern_cuda_copy(st_gpu, g_st, (2 * nc + nlh) * 4, KERN_CUDA_D2H, NULL),
                         0);
        ck_assert_int_eq(kern_cuda_stream_sync(NULL), 0);
        kern_cuda_free(g_raw);
        kern_cuda_free(g_enc);
        kern_cuda_free(g_dec);
        kern_cuda_free(g_st);
        ck_assert_mem_eq(e_gpu, e_ref, (size_t)sz);
        ck_assert_int_eq(kern_decode_ref(&lay, e_ref, (size_t)sz, d_ref, rs, out), (int64_t)rs);
        ck_assert_mem_eq(d_gpu, d_ref, rs);
        ck_assert_mem_eq(st_gpu, st_ref, 2 * nc * 4);
        for (uint64_t i = 0; i < nlh; i++)
            ck_assert_double_eq_tol(st_gpu[2 * nc + i], st_ref[2 * nc + i],
                                    1e-4 * fabs(st_ref[2 * nc + i]) + 1e-6);
    }
    free(e_ref);
    free(e_gpu);
    free(d_ref);
    free(d_gpu);
    free(st_ref);
    free(st_gpu);
    free(raw);
}
END_TEST

/* ---- edge inputs: the vectorised codecs against the reference, byte for byte ---------- */

/* Regression (signed zeros, tiny bf16): q4_1, q5_1 and KIVI stored -0 where the reference
 * keeps the first of +0/-0 as a group's min or max; per-head KIVI key ranges likewise; q8_0
 * on bf16 values below ~1.5e-36 gave other codes. Inputs mix those with NaN, ±Inf,
 * subnormals, huge bf16 and constant blocks, over odd shapes and both dtypes. */
static uint16_t edge_value(uint64_t *st, uint32_t dtype, int mode)
{
    uint64_t r = rng_next(st);
    float scale = mode == 0 ? 1.0f : ldexpf(1.0f, (int)(r % 30) - 20);
    float g = (float)((double)(rng_next(st) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    float x = g * 4.0f * scale;
    int k = (int)(rng_next(st) % 1000);
    if (mode == 4 && dtype == KERN_DTYPE_BF16)
        x = g * ldexpf(1.0f, -128 - (int)(r % 8));
    if (mode == 3) {
        x = fabsf(x);
        if (k < 200)
            x = (k & 1) ? -0.0f : 0.0f;
    }
    if (mode >= 1 && k < 20)
        x = 0.0f;
    if (mode >= 1 && k >= 20 && k < 40)
        x = -0.0f;
    if (mode >= 2 && k == 50)
        return dtype == KERN_DTYPE_FP16 ? 0x7e00 : 0x7fc0;
    if (mode >= 2 && k == 51)
        return dtype == KERN_DTYPE_FP16 ? 0x7c00 : 0x7f80;
    if (mode >= 2 && k == 52)
        return dtype == KERN_DTYPE_FP16 ? 0xfc00 : 0xff80;
    if (mode >= 2 && k == 53 && dtype == KERN_DTYPE_BF16)
        return 0x7f00;
    if (mode >= 1 && k >= 60 && k < 64)
        return (uint16_t)(rng_next(st) & 0x83ff);
    return dtype == KERN_DTYPE_FP16 ? kern_f2h(x) : kern_f2bf(x);
}

START_TEST(test_edge_inputs_match_reference)
{
    static const uint32_t dims[] = {32, 64, 96, 128, 40}, toks[] = {1, 7, 32, 33, 64};
    uint64_t st = 88172645463325252ull;
    for (int it = 0; it < 120; it++) {
        struct kern_layout lay = {1 + (uint32_t)(rng_next(&st) % 2),
                                  1 + (uint32_t)(rng_next(&st) % 4),
                                  dims[rng_next(&st) % 5],
                                  toks[rng_next(&st) % 5],
                                  (rng_next(&st) & 1) ? KERN_DTYPE_FP16 : KERN_DTYPE_BF16,
                                  (uint32_t)(rng_next(&st) % 4 == 0)};
        int mode = it % 5;
        uint64_t rs = kern_raw_size(&lay), nc, nl;
        uint16_t *raw = malloc(rs);
        ck_assert_ptr_nonnull(raw);
        for (uint64_t i = 0; i < rs / 2; i++)
            raw[i] = edge_value(&st, lay.dtype, mode);
        if (it % 17 == 0) /* constant magnitude, mixed signs */
            for (uint64_t i = 0; i < rs / 2; i++)
                raw[i] = (uint16_t)((raw[i] & 0x8000) |
                                    (lay.dtype == KERN_DTYPE_FP16 ? 0x3c00 : 0x3f80));
        nc = (uint64_t)lay.layers * lay.heads * lay.head_dim;
        nl = (uint64_t)lay.layers * lay.heads;
        for (int c = 0; c < NCODEC_V1; c++) {
            for (int stats = 0; stats < 2; stats++) {
                struct kern_recipe rec;
                kern_recipe_fill(&rec, c, c, (uint32_t)(it % 2));
                int64_t sz = kern_encoded_size(&lay, &rec);
                ck_assert_int_gt(sz, 0);
                uint8_t *e1 = malloc((size_t)sz), *e2 = malloc((size_t)sz);
                float *s1 = calloc(2 * nc + nl, sizeof(float)), *s2 = calloc(2 * nc + nl, sizeof(float));
                uint16_t *d1 = malloc(rs), *d2 = malloc(rs);
                ck_assert(e1 && e2 && s1 && s2 && d1 && d2);
                memset(e1, 0xaa, (size_t)sz);
                memset(e2, 0x55, (size_t)sz);
                struct kern_key_stats k1 = {s1, s1 + nc, s1 + 2 * nc}, k2 = {s2, s2 + nc, s2 + 2 * nc};
                int64_t r1 = kern_encode_ref(&lay, &rec, raw, e1, (size_t)sz, stats ? &k1 : NULL);
                int64_t r2 = kern_encode_cpu(&lay, &rec, raw, e2, (size_t)sz, stats ? &k2 : NULL);
                ck_assert_int_eq(r1, r2);
                ck_assert_msg(memcmp(e1, e2, (size_t)sz) == 0,
                              "it %d codec %d stats %d: encoded bytes differ", it, c, stats);
                if (stats) {
                    ck_assert_msg(memcmp(s1, s2, 2 * nc * sizeof(float)) == 0,
                                  "it %d codec %d: key min/max differ", it, c);
                    for (uint64_t q = 0; q < nl; q++)
                        ck_assert(fabsf(s1[2 * nc + q] - s2[2 * nc + q]) <=
                                  1e-5f * fabsf(s1[2 * nc + q]) + 1e-30f);
                }
                for (uint32_t od = KERN_DTYPE_FP16; od <= KERN_DTYPE_BF16; od++) {
                    ck_assert_int_eq(kern_decode_ref(&lay, e1, (size_t)sz, d1, rs, od), (int64_t)rs);
                    ck_assert_int_eq(kern_decode_cpu(&lay, e1, (size_t)sz, d2, rs, od), (int64_t)rs);
                    ck_assert_msg(memcmp(d1, d2, rs) == 0, "it %d codec %d: decode differs", it,
                                  c);
                }
                free(e1);
                free(e2);
                free(s1);
                free(s2);
                free(d1);
                free(d2);
            }
        }
        free(raw);
    }
}
END_TEST

/* Regression (codes past qmax): values k * 2^-24, k in [0, kmax], make the fp16 scale a
 * subnormal that rounds down by up to a third ((kmax / qmax) * 2^-24 to 2^-24), so codes
 * reach 1.5 * qmax before the clamp; the vectorised KIVI encoders clamp the bytes after
 * the pack, and dropping that clamp went unnoticed by every other case (tried). Every codec,
 * fp16 and bf16, the whole-section and the per-head paths, with and without statistics. */
/* A ggml group whose scale d is an fp32 subnormal (bf16 values below ~1.5e-36): d is stored
 * as fp16 0 and every code is 0 (kern_ggml_inv), the same bytes from the reference, the
 * batched and the AVX2 encoders; before, the reference's codes came from converting an
 * infinite product to an integer, which the device does otherwise (test_cuda_every_half). */
START_TEST(test_ggml_subnormal_d_codes_zero)
{
    float x[32];
    for (int j = 0; j < 32; j++)
        x[j] = ldexpf((float)(j % 7) - 3.0f, -130); /* bf16 subnormals, +-3 * 2^-130 */
    uint8_t q8[34];
    kern_q8_0_enc(x, 32, q8);
    for (int j = 0; j < 34; j++)
        ck_assert_msg(q8[j] == 0, "q8_0 byte %d is %#x", j, q8[j]);
    for (int bits = 4; bits <= 5; bits++) {
        uint8_t q[24];
        kern_qx_1_enc(x, 32, q, bits);
        uint16_t d, m;
        memcpy(&d, q, 2);
        memcpy(&m, q + 2, 2);
        ck_assert_uint_eq(d, 0);
        ck_assert_uint_eq(m, 0x8000); /* the min, -3 * 2^-130, as fp16 -0 */
        for (int j = 4; j < (bits == 5 ? 24 : 20); j++)
            ck_assert_msg(q[j] == 0, "q%d_1 byte %d is %#x", bits, j, q[j]);
    }
    /* the same group as a bf16 block through every encoder of the host */
    struct kern_layout lay = {1, 1, 32, 1, KERN_DTYPE_BF16, 0};
    uint16_t raw[64];
    for (int j = 0; j < 64; j++)
        raw[j] = kern_f2bf(x[j % 32]);
    for (uint32_t c = KERN_CODEC_Q8_0; c <= KERN_CODEC_Q5_1; c++) {
        struct kern_recipe rec;
        kern_recipe_fill(&rec, c, c, 0);
        int64_t sz = kern_encoded_size(&lay, &rec);
        uint8_t *e1 = malloc((size_t)sz), *e2 = malloc((size_t)sz), *e3 = malloc((size_t)sz);
        ck_assert(e1 && e2 && e3);
        ck_assert_int_eq(kern_encode_ref(&lay, &rec, raw, e1, (size_t)sz, NULL), sz);
        ck_assert_int_eq(kern_encode_cpu(&lay, &rec, raw, e2, (size_t)sz, NULL), sz);
        ck_assert_int_eq(kern_encode_batched_cpu(&lay, &rec, raw, e3, (size_t)sz), sz);
        ck_assert_mem_eq(e2, e1, (size_t)sz);
        ck_assert_mem_eq(e3, e1, (size_t)sz);
        free(e1);
        free(e2);
        free(e3);
    }
}
END_TEST

START_TEST(test_subnormal_scale_codes)
{
    static const struct kern_layout lays[] = {{1, 2, 64, 32, KERN_DTYPE_FP16, 0},
                                              {1, 2, 64, 37, KERN_DTYPE_BF16, 0},
                                              {1, 2, 40, 33, KERN_DTYPE_FP16, 0}};
    static const uint32_t kmax[] = {4, 5, 21, 22};
    uint64_t st = 12345;
    for (unsigned li = 0; li < 3; li++)
        for (unsigned ki = 0; ki < 4; ki++) {
            struct kern_layout lay = lays[li];
            uint64_t rs = kern_raw_size(&lay);
            uint16_t *raw = malloc(rs);
            ck_assert_ptr_nonnull(raw);
            for (uint64_t i = 0; i < rs / 2; i++) {
                float x = ldexpf((float)(rng_next(&st) % (kmax[ki] + 1)), -24);
                raw[i] = lay.dtype == KERN_DTYPE_FP16 ? kern_f2h(x) : kern_f2bf(x);
            }
            for (int c = 1; c < NCODEC_V1; c++)
                for (int stats = 0; stats < 2; stats++) {
                    struct kern_recipe rec;
                    kern_recipe_fill(&rec, c, c, 0);
                    int64_t sz = kern_encoded_size(&lay, &rec);
                    uint64_t nc = (uint64_t)lay.layers * lay.heads * lay.head_dim;
                    uint8_t *e1 = malloc((size_t)sz), *e2 = malloc((size_t)sz);
                    float *s = malloc((2 * nc + lay.layers * lay.heads) * sizeof(float));
                    ck_assert(e1 && e2 && s);
                    struct kern_key_stats ks = {s, s + nc, s + 2 * nc};
                    ck_assert_int_eq(kern_encode_ref(&lay, &rec, raw, e1, (size_t)sz, NULL), sz);
                    ck_assert_int_eq(
                        kern_encode_cpu(&lay, &rec, raw, e2, (size_t)sz, stats ? &ks : NULL), sz);
                    ck_assert_msg(memcmp(e1, e2, (size_t)sz) == 0,
                                  "%s %ux%u%s kmax %u stats %d: encoded bytes differ",
                                  kern_codec_name((uint32_t)c), lay.head_dim, lay.tokens,
                                  lay.dtype == KERN_DTYPE_BF16 ? " bf16" : "", kmax[ki], stats);
                    free(e1);
                    free(e2);
                    free(s);
                }
            free(raw);
        }
}
END_TEST

/* ---- expected bytes from a second implementation (tests/lib/kern_oracle.c) ------------- */

/* The oracle's own conversions against the hardware (F16C) and the format's definitions. */
START_TEST(test_oracle_scalars)
{
    uint64_t s = 5;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = oracle_h2f((uint16_t)h);
        if (f == f)
            ck_assert_uint_eq(oracle_f2h(f), h);
        ck_assert_uint_eq(oracle_f2h(f), f16c(f));
    }
    for (int it = 0; it < 200000; it++) {
        uint32_t u = (uint32_t)rng_next(&s);
        if (it % 2 == 0) /* the half range and its edges */
            u = (u & 0x81ffffffu) | (0x33000000u + ((u >> 8) % 0x14800000u));
        float f = kern_u2f(u);
        ck_assert_uint_eq(oracle_f2h(f), f16c(f));
        /* bf16: the upper half rounded to nearest even, by a wider computation */
        if (f == f && fabsf(f) < 3e38f) {
            uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
            double dl = fabs((double)f - (double)kern_u2f(lo)),
                   dh = fabs((double)kern_u2f(hi) - (double)f);
            uint16_t want = (uint16_t)((dl < dh || (dl == dh && !(lo & 0x10000u)) ? lo : hi) >> 16);
            ck_assert_uint_eq(oracle_f2bf(f), want);
        }
    }
    /* E4M3: 0x08 = 2^-6, 0x7e = 448, ties to even, saturation */
    ck_assert_float_eq(oracle_e4m3_value(0x08), 0.015625f);
    ck_assert_float_eq(oracle_e4m3_value(0x7e), 448.0f);
    ck_assert_float_eq(oracle_e4m3_value(0x01), 0.001953125f);
    ck_assert_uint_eq(oracle_e4m3(17.0f), 0x58);
    ck_assert_uint_eq(oracle_e4m3(19.0f), 0x5a);
    ck_assert_uint_eq(oracle_e4m3(-1000.0f), 0xfe);
    ck_assert_uint_eq(oracle_e4m3(-0.0f), 0x80);
}
END_TEST

/* Offset of the first byte where a and b differ, or -1. */
static long first_diff(const void *a, const void *b, size_t n)
{
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            return (long)i;
    return -1;
}

/* Both encoders (with and without key statistics, which take different paths) must give
 * the oracle's bytes and statistics; both decoders, and the oracle's, the same values from
 * the oracle's block, in either output dtype. */
static void oracle_check(const struct kern_layout *lay, const struct kern_recipe *rec,
                         const void *raw, const char *what)
{
    uint64_t rs = kern_raw_size(lay), nlh = (uint64_t)lay->layers * lay->heads;
    uint64_t nc = nlh * lay->head_dim;
    float *os = malloc((2 * nc + nlh) * 4), *ks = malloc((2 * nc + nlh) * 4);
    uint8_t *want = NULL;
    int64_t sz = oracle_encode(lay, rec, raw, &want, os, os + nc, os + 2 * nc);
    ck_assert_int_gt(sz, 0);
    ck_assert_int_eq(kern_encoded_size(lay, rec), sz);
    uint8_t *e = malloc((size_t)sz);
    uint8_t *d0 = malloc(rs), *d1 = malloc(rs);
    ck_assert(os && ks && e && d0 && d1);
    for (int v = 0; v < 4; v++) {
        int cpu = v & 1, stats = v >> 1;
        struct kern_key_stats k = {ks, ks + nc, ks + 2 * nc};
        memset(e, 0xa5, (size_t)sz);
        memset(ks, 0xa5, (2 * nc + nlh) * 4);
        int64_t r = cpu ? kern_encode_cpu(lay, rec, raw, e, (size_t)sz, stats ? &k : NULL)
                        : kern_encode_ref(lay, rec, raw, e, (size_t)sz, stats ? &k : NULL);
        ck_assert_int_eq(r, sz);
        long at = first_diff(e, want, (size_t)sz);
        ck_assert_msg(at < 0, "%s: %s encoder%s: byte %ld of %lld is 0x%02x, expected 0x%02x",
                      what, cpu ? "cpu" : "ref", stats ? " with statistics" : "", at,
                      (long long)sz, at < 0 ? 0 : e[at], at < 0 ? 0 : want[at]);
        if (!stats)
            continue;
        ck_assert_msg(memcmp(ks, os, 2 * nc * 4) == 0, "%s: %s: key min/max differ", what,
                      cpu ? "cpu" : "ref");
        for (uint64_t i = 0; i < nlh; i++)
            ck_assert_double_eq_tol(ks[2 * nc + i], os[2 * nc + i], 1e-5 * os[2 * nc + i] + 1e-30);
    }
    for (uint32_t od = KERN_DTYPE_FP16; od <= KERN_DTYPE_BF16; od++) {
        memset(d0, 0x5a, rs);
        oracle_decode(lay, rec, want, d0, od);
        for (int cpu = 0; cpu < 2; cpu++) {
            memset(d1, 0xa5, rs);
            int64_t r = cpu ? kern_decode_cpu(lay, want, (size_t)sz, d1, rs, od)
                            : kern_decode_ref(lay, want, (size_t)sz, d1, rs, od);
            ck_assert_int_eq(r, (int64_t)rs);
            long at = first_diff(d1, d0, rs);
            ck_assert_msg(at < 0, "%s: %s decoder to %s: element %ld differs", what,
                          cpu ? "cpu" : "ref", od == KERN_DTYPE_FP16 ? "fp16" : "bf16",
                          at / 2);
        }
    }
    free(os);
    free(ks);
    free(want);
    free(e);
    free(d0);
    free(d1);
}

/* Blocks whose groups land on rounding ties: mode 1 makes every q8_0 group's amax 127
 * (d = 1, halves are ties of roundf), mode 2 every group span [0, 15] (q4_1 and KIVI-4
 * with unit steps, halves are ties of +0.5 and floor), mode 3 every head's amax 448 with
 * the other values half-way between E4M3 codes (fp8 scale 1, ties to even); mode 4 the
 * edge values (NaN, Inf, signed zeros, subnormals, huge bf16). */
static void *tie_block(const struct kern_layout *lay, int mode, uint64_t seed)
{
    uint64_t n = kern_raw_size(lay) / 2, s = seed * 0x9e3779b97f4a7c15ull + 3;
    uint16_t *b = malloc(n * 2);
    ck_assert_ptr_nonnull(b);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t d = (uint32_t)(i % lay->head_dim);
        uint64_t r = rng_next(&s);
        float x;
        if (mode == 4) {
            b[i] = edge_value(&s, lay->dtype, 2 + (int)(r % 3));
            continue;
        }
        if (mode == 1)
            x = d % 32 == 0 ? (r & 1 ? 127.0f : -127.0f) : (float)((int)(r % 255) - 127) * 0.5f;
        else if (mode == 2)
            x = d % 32 == 0 ? 0.0f : d % 32 == 1 ? 15.0f : (float)(r % 31) * 0.5f;
        else if (i % ((uint64_t)lay->heads * lay->head_dim) == 0) /* token 0 of every row */
            x = 448.0f;
        else {
            uint8_t c = (uint8_t)(r % 0x7e);
            x = (oracle_e4m3_value(c) + oracle_e4m3_value((uint8_t)(c + 1))) * 0.5f;
            x = (r >> 8) & 1 ? -x : x;
        }
        b[i] = lay->dtype == KERN_DTYPE_BF16 ? kern_f2bf(x) : kern_f2h(x);
    }
    return b;
}

START_TEST(test_codecs_match_oracle)
{
    uint32_t codec = (uint32_t)_i % NCODEC_V1;
    const struct shape *sh = &shapes[(uint32_t)_i / NCODEC_V1];
    struct kern_layout lay =
        layout(sh->layers, sh->heads, sh->dim, sh->tokens, sh->dtype, sh->k_only);
    struct kern_recipe rec;
    char what[96];
    kern_recipe_fill(&rec, codec, codec, 0);
    for (int mode = 0; mode <= 4; mode++) {
        void *raw = mode ? tie_block(&lay, mode, 500 + (uint64_t)_i)
                         : make_block(&lay, 400 + (uint64_t)_i);
        snprintf(what, sizeof(what), "%s, %ux%ux%ux%u %s%s, data %d", kern_codec_name(codec),
                 lay.layers, lay.heads, lay.head_dim, lay.tokens,
                 lay.dtype == KERN_DTYPE_FP16 ? "fp16" : "bf16", lay.k_only ? " K-only" : "",
                 mode);
        oracle_check(&lay, &rec, raw, what);
        free(raw);
    }
}
END_TEST

/* Every codec on some layer, K and V different, raw layers with NaN/Inf. */
START_TEST(test_recipe_mixed_matches_oracle)
{
    struct kern_layout lay = layout(8, 2, 96, 33, (uint32_t)(_i ? KERN_DTYPE_BF16 : KERN_DTYPE_FP16), 0);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, KERN_CODEC_Q8_0, KERN_CODEC_Q8_0, 2);
    for (uint32_t l = 2; l < 8; l++) {
        rec.codec[l][0] = (uint8_t)(1 + (l - 2) % 6);
        rec.codec[l][1] = (uint8_t)(1 + (l + 1) % 6);
    }
    uint16_t *raw = make_block(&lay, 6 + (uint64_t)_i);
    raw[3] = lay.dtype == KERN_DTYPE_FP16 ? 0x7e01 : 0x7fc1;
    raw[4] = lay.dtype == KERN_DTYPE_FP16 ? 0xfc00 : 0xff80;
    oracle_check(&lay, &rec, raw, _i ? "mixed recipe bf16" : "mixed recipe fp16");
    free(raw);
}
END_TEST

/* The vectorised decoders write each group (fp8: each row, KIVI keys: each row after a
 * per-group table) straight into the caller's buffer. Every codec, fp16 and bf16 input, both
 * output dtypes, into destinations offset by 0, 16, 2 and 1 bytes from a 64-byte boundary, with
 * the bytes around the block untouched; the section payloads are random, so every code of
 * every table entry occurs (and scales the encoders never write: fp8 scales up to 2^115 take
 * the decoder's guarded path). Shapes: D a multiple of 32 (the whole-section decoders), T
 * not a multiple of 32 (a partial KIVI key group), and odd D (the per-head path). */
static const struct kern_layout dec_shapes[] = {
    {2, 3, 64, 37, KERN_DTYPE_FP16, 0},
    {1, 2, 128, 32, KERN_DTYPE_BF16, 0},
    {1, 1, 576, 7, KERN_DTYPE_FP16, 1},
    {2, 2, 40, 9, KERN_DTYPE_BF16, 0},
    /* 1.25 MiB of raw output, a partial KIVI key group: q8_0 is decoded with streaming
     * stores where the destination is 16-byte aligned (kern_avx2.c, KERN_NT_MIN_BYTES), and
     * so are KIVI sections by the AVX-512 decoders (kern_kivi512.c: whole 64-byte stores at
     * offset 0, 16-byte ones at 16) */
    {8, 8, 128, 40, KERN_DTYPE_FP16, 0},
};
#define NDEC_SHAPES (sizeof(dec_shapes) / sizeof(dec_shapes[0]))

/* The bytes of buf (rs + 128 of 0x5a) before and after the rs decoded at dst untouched. */
static void guard_untouched(const uint8_t *buf, const uint8_t *dst, size_t rs)
{
    for (const uint8_t *q = buf; q < dst; q++)
        ck_assert_uint_eq(*q, 0x5a);
    for (const uint8_t *q = dst + rs; q < buf + rs + 128; q++)
        ck_assert_uint_eq(*q, 0x5a);
}

/* A random finite fp16 of magnitude below 2^e, as the pair (d, m) or (scale, min) of a group. */
static uint16_t rand_half(uint64_t *s, int e)
{
    return kern_f2h(((float)(rng_next(s) % 20001) - 10000.0f) / 10000.0f * ldexpf(1.0f, e));
}

START_TEST(test_decode_random_payload)
{
    uint32_t codec = 1 + (uint32_t)_i % (NCODEC_V1 - 1);
    struct kern_layout lay = dec_shapes[(uint32_t)_i / (NCODEC_V1 - 1)];
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    int64_t sz = kern_encoded_size(&lay, &rec);
    uint64_t rs = kern_raw_size(&lay), s = 77 + (uint64_t)_i;
    uint8_t *e = malloc((size_t)sz), *d1 = malloc(rs + 64), *d2 = malloc(rs + 128);
    ck_assert(e && d1 && d2);
    void *raw = make_block(&lay, 5 + (uint64_t)_i);
    ck_assert_int_eq(kern_encode_ref(&lay, &rec, raw, e, (size_t)sz, NULL), sz);
    /* random codes; group scalars random but finite, as an encoder writes them */
    uint32_t kinds = lay.k_only ? 1 : 2, D = lay.head_dim, H = lay.heads, T = lay.tokens;
    uint32_t G = kern_ngroups(D);
    for (uint32_t l = 0; l < lay.layers; l++)
        for (uint32_t k = 0; k < kinds; k++) {
            struct kern_block_sect st;
            memcpy(&st, e + sizeof(struct kern_block_hdr) + (l * kinds + k) * sizeof(st),
                   sizeof(st));
            uint8_t *p = e + st.offset;
            int bits = kern_codec_bits(codec);
            for (uint32_t i = 0; i < st.bytes; i++)
                p[i] = (uint8_t)rng_next(&s);
            if (codec == KERN_CODEC_FP8) {
                for (uint32_t h = 0; h < H; h++) {
                    float sc = ldexpf(1.0f + (float)(rng_next(&s) % 1000) / 1000.0f,
                                      (int)(rng_next(&s) % 8 == 0 ? 100 + rng_next(&s) % 27
                                                                  : rng_next(&s) % 20) - 12);
                    memcpy(p + 4 * h, &sc, 4);
                }
                /* NaN codes (0x7f, 0xff) decode as the reference defines them */
            } else if (bits && k == 0) {
                uint64_t hb = kern_kivi_k_head_bytes(D, T, bits);
                for (uint32_t h = 0; h < H; h++)
                    for (uint32_t t0 = 0; t0 < T; t0 += 32) {
                        uint8_t *g = p + h * hb + (t0 / 32) * kern_kivi_k_group_bytes(D, 32, bits);
                        for (uint32_t c = 0; c < 2 * D; c++) {
                            uint16_t v = rand_half(&s, c < D ? 2 : 6);
                            memcpy(g + 2 * c, &v, 2);
                        }
                    }
            } else {
                uint32_t gb = bits ? kern_kivi_v_group_bytes(bits)
                                   : codec == KERN_CODEC_Q8_0 ? 34 : codec == KERN_CODEC_Q4_1 ? 20 : 24;
                for (uint64_t gi = 0; gi < (uint64_t)T * H * G; gi++)
                    for (int j = 0; j < (codec == KERN_CODEC_Q8_0 ? 1 : 2); j++) {
                        uint16_t v = rand_half(&s, j ? 6 : 2);
                        memcpy(p + gi * gb + 2 * j, &v, 2);
                    }
            }
        }
    for (uint32_t out = KERN_DTYPE_FP16; out <= KERN_DTYPE_BF16; out++) {
        memset(d1, 0xa5, rs);
        ck_assert_int_eq(kern_decode_ref(&lay, e, (size_t)sz, d1, rs, out), (int64_t)rs);
        static const unsigned offs[] = {0, 16, 2, 1};
        /* each offset with the FMA build, then without, then both again with the AVX-512
         * KIVI decoders off (kern_kivi512.c, where the CPU has them) */
        for (unsigned o = 0; o < 16; o++) {
            uint8_t *base = (uint8_t *)(((uintptr_t)d2 + 63) & ~(uintptr_t)63);
            uint8_t *dst = base + offs[o % 4];
            memset(d2, 0x5a, rs + 128);
            int was = kern_avx2_fma(o % 8 < 4), was5 = kern_rot_avx512(o < 8);
            ck_assert_int_eq(kern_decode_cpu(&lay, e, (size_t)sz, dst, rs, out), (int64_t)rs);
            kern_avx2_fma(was);
            kern_rot_avx512(was5);
            ck_assert_msg(memcmp(d1, dst, rs) == 0, "%s %ux%ux%ux%u%s in %s out %s dst +%u%s%s: "
                          "the decoded block differs from the reference's",
                          kern_codec_name(codec), lay.layers, H, D, T, lay.k_only ? " k-only" : "",
                          lay.dtype == KERN_DTYPE_BF16 ? "bf16" : "fp16",
                          out == KERN_DTYPE_BF16 ? "bf16" : "fp16", offs[o % 4],
                          o % 8 < 4 ? "" : " no fma", o < 8 ? "" : " no avx512");
            guard_untouched(d2, dst, rs);
        }
    }
    free(raw);
    free(e);
    free(d1);
    free(d2);
}
END_TEST

/* MERGE, LOWRANK and ROT decodes (LOWRANK's q8_0 values decoded with its keys, a recipe's own
 * q8_0 values too; ROT's KIVI values with its keys, a recipe's KIVI values of the keys' bits
 * too, and of other bits apart, layers whose rows per section are odd) against the
 * reference's, into destinations offset 0, 16, 2, 1, 32 and 48 bytes from a 64-byte boundary,
 * with the AVX-512 paths and without (the AVX2 ones with FMA and without), the bytes around
 * the block untouched: blocks just under KERN_NT_MIN_BYTES of raw output (stored through the
 * cache) and at or past it (streamed where the destination is 16-byte aligned: 64-byte stores at
 * offset 0, 16-byte ones at 16; kern_st512.h), head dims with a 32-channel tile
 * (96 = 64 + 32), a last tile of two tokens (30), two words of MERGE's map (40 tokens).
 * MERGE's layer 0 carries damaged maps (no run started, every token a run past the rows
 * the head holds, random bits): those tokens read row 0, as the reference defines. */
struct ext_dec_case {
    struct kern_layout lay;
    uint32_t kc, vc;
};
static const struct ext_dec_case ext_dec_cases[] = {
    {{7, 8, 128, 32, KERN_DTYPE_FP16, 0}, KERN_CODEC_MERGE, KERN_CODEC_MERGE},   /* 896 KiB */
    {{8, 8, 128, 32, KERN_DTYPE_FP16, 0}, KERN_CODEC_MERGE, KERN_CODEC_MERGE},   /* 1 MiB */
    {{13, 4, 128, 40, KERN_DTYPE_BF16, 0}, KERN_CODEC_MERGE, KERN_CODEC_MERGE},  /* 1040 KiB */
    {{7, 8, 128, 32, KERN_DTYPE_FP16, 0}, KERN_CODEC_LOWRANK, KERN_CODEC_LOWRANK},
    {{8, 8, 128, 32, KERN_DTYPE_FP16, 0}, KERN_CODEC_LOWRANK, KERN_CODEC_LOWRANK},
    {{12, 8, 96, 30, KERN_DTYPE_BF16, 0}, KERN_CODEC_LOWRANK, KERN_CODEC_LOWRANK}, /* 1080 KiB */
    {{8, 8, 128, 32, KERN_DTYPE_FP16, 0}, KERN_CODEC_LOWRANK, KERN_CODEC_Q8_0},
    {{8, 8, 128, 32, KERN_DTYPE_BF16, 0}, KERN_CODEC_LOWRANK, KERN_CODEC_KIVI4},
    {{16, 8, 128, 32, KERN_DTYPE_FP16, 1}, KERN_CODEC_LOWRANK, KERN_CODEC_LOWRANK}, /* K only */
    {{8, 8, 128, 32, KERN_DTYPE_FP16, 0}, KERN_CODEC_Q8_0, KERN_CODEC_Q8_0},
    /* ROT's keys with their KIVI values between the key rows (kern_rot512.c) */
    {{8, 8, 128, 32, KERN_DTYPE_FP16, 0}, KERN_CODEC_ROT4, KERN_CODEC_ROT4},     /* 1 MiB */
    {{7, 8, 128, 32, KERN_DTYPE_FP16, 0}, KERN_CODEC_ROT2, KERN_CODEC_ROT2},     /* 896 KiB */
    {{12, 5, 256, 33, KERN_DTYPE_BF16, 0}, KERN_CODEC_ROT2, KERN_CODEC_KIVI2},   /* odd rows */
    {{20, 8, 32, 63, KERN_DTYPE_FP16, 0}, KERN_CODEC_ROT4, KERN_CODEC_KIVI4},    /* 1260 KiB */
    {{17, 3, 32, 65, KERN_DTYPE_FP16, 0}, KERN_CODEC_ROT2, KERN_CODEC_ROT2},     /* odd rows */
    {{8, 8, 128, 32, KERN_DTYPE_BF16, 0}, KERN_CODEC_ROT4, KERN_CODEC_KIVI2},    /* apart */
};
#define NEXT_DEC_CASES (sizeof(ext_dec_cases) / sizeof(ext_dec_cases[0]))

START_TEST(test_decode_ext_offsets)
{
    const struct ext_dec_case *c = &ext_dec_cases[_i];
    const struct kern_layout lay = c->lay;
    const uint32_t T = lay.tokens, H = lay.heads, D = lay.head_dim;
    struct kern_recipe rec;
    kern_recipe_fill(&rec, c->kc, c->vc, 0);
    int64_t sz = kern_encoded_size(&lay, &rec);
    ck_assert_int_gt(sz, 0);
    uint64_t rs = kern_raw_size(&lay), s = 901 + (uint64_t)_i;
    uint8_t *e = malloc((size_t)sz), *d1 = malloc(rs), *d2 = malloc(rs + 128);
    ck_assert(e && d1 && d2);
    void *raw = make_block(&lay, 31 + (uint64_t)_i);
    ck_assert_int_eq(kern_encode_ref(&lay, &rec, raw, e, (size_t)sz, NULL), sz);
    if (c->kc == KERN_CODEC_MERGE) {
        struct kern_block_sect st;
        memcpy(&st, e + sizeof(struct kern_block_hdr), sizeof(st));
        const uint64_t hb = kern_merge_head_bytes(D, T), mb = kern_merge_map_bytes(T);
        for (uint32_t h = 0; h < H; h++) {
            uint8_t *map = e + st.offset + h * hb + 16;
            for (uint64_t b = 0; b < mb; b++)
                map[b] = h % 3 == 0 ? 0 : h % 3 == 1 ? 0xff : (uint8_t)rng_next(&s);
        }
    }
    for (uint32_t out = KERN_DTYPE_FP16; out <= KERN_DTYPE_BF16; out++) {
        memset(d1, 0xa5, rs);
        ck_assert_int_eq(kern_decode_ref(&lay, e, (size_t)sz, d1, rs, out), (int64_t)rs);
        static const unsigned offs[] = {0, 16, 2, 1, 32, 48};
        /* each offset with the AVX-512 paths, then the AVX2 ones with FMA, then without */
        for (unsigned o = 0; o < 18; o++) {
            uint8_t *base = (uint8_t *)(((uintptr_t)d2 + 63) & ~(uintptr_t)63);
            uint8_t *dst = base + offs[o % 6];
            memset(d2, 0x5a, rs + 128);
            int was = kern_avx2_fma(o < 12), was5 = kern_rot_avx512(o < 6);
            ck_assert_int_eq(kern_decode_cpu(&lay, e, (size_t)sz, dst, rs, out), (int64_t)rs);
            kern_avx2_fma(was);
            kern_rot_avx512(was5);
            ck_assert_msg(memcmp(d1, dst, rs) == 0,
                          "%s/%s %ux%ux%ux%u%s in %s out %s dst +%u%s%s: the decoded block "
                          "differs from the reference's",
                          kern_codec_name(c->kc), kern_codec_name(c->vc), lay.layers, H, D, T,
                          lay.k_only ? " k-only" : "",
                          lay.dtype == KERN_DTYPE_BF16 ? "bf16" : "fp16",
                          out == KERN_DTYPE_BF16 ? "bf16" : "fp16", offs[o % 6],
                          o < 6 ? "" : " no avx512", o < 12 ? "" : " no fma");
            guard_untouched(d2, dst, rs);
        }
    }
    free(raw);
    free(e);
    free(d1);
    free(d2);
}
END_TEST

/* Group scalars that are Inf or NaN (no encoder writes them, a corrupt or foreign block may
 * hold them): the vectorised decoder (the FMA build where the CPU has FMA) gives the
 * reference's halves, Inf, -Inf and 0 * Inf included; where a NaN scalar meets a NaN product
 * either operand's NaN may come out (x86 picks by operand position, which the compiler
 * chooses: the ASan build of the reference picked the other one), so two NaN halves count as
 * equal. Every codec with a per-group (d, m) or per-channel (scale, min), a partial KIVI key
 * group, fp16 and bf16 output, one layer's sections clean. */
static int half_is_nan(uint16_t h, uint32_t dtype)
{
    return dtype == KERN_DTYPE_BF16 ? (h & 0x7fff) > 0x7f80 : (h & 0x7fff) > 0x7c00;
}

START_TEST(test_decode_nonfinite_scalars)
{
    static const uint32_t codecs[] = {KERN_CODEC_Q4_1, KERN_CODEC_Q5_1, KERN_CODEC_KIVI2,
                                      KERN_CODEC_KIVI4};
    static const uint16_t bad[] = {0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x7dff, 0xffff};
    uint32_t codec = codecs[_i];
    struct kern_layout lay = {2, 2, 64, 37, KERN_DTYPE_FP16, 0};
    struct kern_recipe rec;
    kern_recipe_fill(&rec, codec, codec, 0);
    int64_t sz = kern_encoded_size(&lay, &rec);
    uint64_t rs = kern_raw_size(&lay), s = 99 + (uint64_t)_i;
    uint8_t *e = malloc((size_t)sz), *d1 = malloc(rs), *d2 = malloc(rs);
    void *raw = make_block(&lay, 3);
    ck_assert(e && d1 && d2 && raw);
    ck_assert_int_eq(kern_encode_ref(&lay, &rec, raw, e, (size_t)sz, NULL), sz);
    uint32_t D = lay.head_dim, H = lay.heads, T = lay.tokens;
    int bits = kern_codec_bits(codec);
    for (uint32_t k = 0; k < 2; k++) { /* layer 0's sections; layer 1 stays clean */
        struct kern_block_sect st;
        memcpy(&st, e + sizeof(struct kern_block_hdr) + k * sizeof(st), sizeof(st));
        uint8_t *p = e + st.offset;
        for (uint32_t i = 0; i < st.bytes; i++)
            p[i] = (uint8_t)rng_next(&s);
        if (bits && k == 0) {
            uint64_t hb = kern_kivi_k_head_bytes(D, T, bits);
            for (uint32_t h = 0; h < H; h++)
                for (uint32_t t0 = 0; t0 < T; t0 += 32)
                    for (uint32_t c = 0; c < 2 * D; c++) {
                        uint16_t v = rng_next(&s) % 4 == 0 ? bad[rng_next(&s) % 7]
                                                           : rand_half(&s, c < D ? 2 : 6);
                        memcpy(p + h * hb + (t0 / 32) * kern_kivi_k_group_bytes(D, 32, bits) +
                                   2 * c, &v, 2);
                    }
        } else {
            uint32_t gb = bits ? kern_kivi_v_group_bytes(bits) : codec == KERN_CODEC_Q4_1 ? 20 : 24;
            for (uint64_t gi = 0; gi < (uint64_t)T * H * kern_ngroups(D); gi++)
                for (int j = 0; j < 2; j++) {
                    uint16_t v = rng_next(&s) % 4 == 0 ? bad[rng_next(&s) % 7]
                                                       : rand_half(&s, j ? 6 : 2);
                    memcpy(p + gi * gb + 2 * j, &v, 2);
                }
        }
    }
    /* output dtype; the FMA build, then without; then both with the AVX-512 KIVI decoders off */
    for (uint32_t m = 0; m < 8; m++) {
        uint32_t out = m % 2 ? KERN_DTYPE_BF16 : KERN_DTYPE_FP16;
        ck_assert_int_eq(kern_decode_ref(&lay, e, (size_t)sz, d1, rs, out), (int64_t)rs);
        int was = kern_avx2_fma(m % 4 < 2), was5 = kern_rot_avx512(m < 4);
        ck_assert_int_eq(kern_decode_cpu(&lay, e, (size_t)sz, d2, rs, out), (int64_t)rs);
        kern_avx2_fma(was);
        kern_rot_avx512(was5);
        const uint16_t *h1 = (const uint16_t *)d1, *h2 = (const uint16_t *)d2;
        for (uint64_t i = 0; i < rs / 2; i++)
            ck_assert_msg(h1[i] == h2[i] || (half_is_nan(h1[i], out) && half_is_nan(h2[i], out)),
                          "%s out %s%s%s: element %llu is %04x, the reference's %04x",
                          kern_codec_name(codec), out == KERN_DTYPE_BF16 ? "bf16" : "fp16",
                          m % 4 < 2 ? "" : " no fma", m < 4 ? "" : " no avx512",
                          (unsigned long long)i, h2[i], h1[i]);
    }
    free(raw);
    free(e);
    free(d1);
    free(d2);
}
END_TEST

static Suite *kernels_suite(void)
{
    Suite *s = suite_create("kernels");
    TCase *tc = tcase_create("ggml");
    tcase_add_test(tc, test_ggml_hand_vectors);
    tcase_add_test(tc, test_ggml_independent);
    tcase_add_test(tc, test_f16_conversion);
    tcase_add_test(tc, test_value_l1);
    tcase_add_test(tc, test_e4m3);
    suite_add_tcase(s, tc);

    tc = tcase_create("cpu");
    tcase_set_timeout(tc, daemon_slow() * 120);
    tcase_add_loop_test(tc, test_codec_roundtrip, 0, (int)(NCODEC_V1 * NSHAPES));
    tcase_add_test(tc, test_encoded_sizes);
    tcase_add_test(tc, test_recipe_mixed);
    tcase_add_loop_test(tc, test_nonfinite, 0, 2 * (NCODEC_V1 - 1));
    tcase_add_loop_test(tc, test_key_stats, 0, (int)NSHAPES);
    tcase_add_test(tc, test_supports);
    tcase_add_test(tc, test_edge_inputs_match_reference);
    tcase_add_test(tc, test_subnormal_scale_codes);
    tcase_add_test(tc, test_ggml_subnormal_d_codes_zero);
    tcase_add_loop_test(tc, test_decode_nonfinite_scalars, 0, 4);
    tcase_add_loop_test(tc, test_decode_random_payload, 0, (int)((NCODEC_V1 - 1) * NDEC_SHAPES));
    tcase_add_loop_test(tc, test_decode_ext_offsets, 0, (int)NEXT_DEC_CASES);
    suite_add_tcase(s, tc);

    tc = tcase_create("cuda-emulation");
    tcase_add_loop_test(tc, test_cuda_indexing_matches_ref, 0, (int)(NCODEC_V1 * NEMUL));
    tcase_add_loop_test(tc, test_encode_every_half, 0, 2 * (NCODEC_V1 - 1));
    tcase_add_loop_test(tc, test_raw_heads_bit_exact, 0, 8);
    suite_add_tcase(s, tc);
    tc = tcase_create("oracle");
    tcase_set_timeout(tc, daemon_slow() * 120);
    tcase_add_test(tc, test_oracle_scalars);
    tcase_add_loop_test(tc, test_codecs_match_oracle, 0, (int)(NCODEC_V1 * NSHAPES));
    tcase_add_loop_test(tc, test_recipe_mixed_matches_oracle, 0, 2);
    suite_add_tcase(s, tc);
    if (!(kern_supports() & KERN_SUPPORT_CPU_AVX2))
        printf("SKIP: check_kernels: avx2: this CPU lacks AVX2+F16C, so kern_*_cpu is the "
               "reference and no vectorised code is tested\n");

    if (daemon_cuda_devices() > 0) { /* asked in a child: CUDA starts in the cases only */
        tc = tcase_create("cuda");
        tcase_set_timeout(tc, daemon_slow() * 120);
        tcase_add_loop_test(tc, test_cuda_matches_ref, 0, (int)(NCODEC_V1 * NSHAPES));
        tcase_add_loop_test(tc, test_cuda_every_half, 0, 2 * (NCODEC_V1 - 1));
        suite_add_tcase(s, tc);
    } else {
        printf("SKIP: check_kernels: cuda: %s\n",
               daemon_cuda_devices() < 0 ? "the CUDA probe died" : "no device");
    }
    return s;
}

int main(void)
{
    return daemon_suite_run(kernels_suite());
}
