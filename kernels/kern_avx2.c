/*
 * kern_avx2.c — the vectorised CPU codecs (AVX2 + F16C), chosen at run time.
 *
 * DESIGN
 * Each function computes exactly the float operations of the reference in kern_fmt.h, eight
 * lanes at a time, so codes, scales and decoded values are bit-identical: divisions stay
 * divisions, roundf() is emulated (truncate, then step away from zero when the remainder is
 * >= 0.5), and FMA is deliberately not enabled in the target so the compiler cannot fuse a
 * multiply and an add the reference rounds twice. Full 32-value groups (and 8-channel runs
 * for KIVI keys) take the vector path; a tail calls the reference's scalar group code.
 *
 * Where a vector shortcut could differ from the reference only in a rare case, that case is
 * detected and redone the reference's way: a group extreme of zero (the reference keeps the
 * first of +0 and -0), a section with a value that needs sanitising (found by one unsigned
 * max over the raw halves). Sections whose
 * head size is a multiple of 32 (all in use) are walked in memory order with the next
 * section prefetched into L2 (enc_sect/dec_sect); other shapes go per head.
 *
 * Decode writes straight into the caller's raw rows, front to back (q8_0 blocks of 1 MiB or
 * more with streaming stores). A group with at most 16 distinct outputs (q4_1, KIVI values)
 * computes them once and looks every value up by vpshufb, two groups per table pass; KIVI
 * keys make per-channel tables per 32-token group first. The section decoders are built a
 * second time with FMA, used where the CPU has it: q * d + m has an exact product, so the
 * fused form gives the reference's bits (see dec_sect_fma()). Encoders never have FMA.
 */
#include "kernels/kern_avx2.h"
#include "kernels/kern_avx2_fp8.h"
#include "kernels/kern_avx2_ggml.h"
#include "kernels/kern_avx2_kivi.h"

KT static void avx_load(const void *src, uint32_t dtype, uint64_t stride, uint32_t tokens,
                        uint32_t dim, float *x)
{
    for (uint32_t t = 0; t < tokens; t++) {
        const uint16_t *r = (const uint16_t *)src + t * stride;
        float *o = x + (uint64_t)t * dim;
        uint32_t d = 0;
        for (; d + 8 <= dim; d += 8)
            _mm256_storeu_ps(o + d, v_load8(r + d, dtype));
        for (; d < dim; d++)
            o[d] = kern_sanitize(kern_load(r, dtype, d));
    }
}

KT static void avx_store(const float *y, uint32_t tokens, uint32_t dim, void *dst, uint32_t dtype,
                         uint64_t stride)
{
    for (uint32_t t = 0; t < tokens; t++) {
        uint16_t *r = (uint16_t *)dst + t * stride;
        const float *in = y + (uint64_t)t * dim;
        uint32_t d = 0;
        for (; d + 8 <= dim; d += 8)
            v_store8(r + d, _mm256_loadu_ps(in + d), dtype);
        for (; d < dim; d++)
            kern_store(r, dtype, d, in[d]);
    }
}

KT static void avx_stats(const float *x, uint32_t tokens, uint32_t dim, float *kmin, float *kmax,
                         float *knorm)
{
    float norm = 0.0f;
    memcpy(kmin, x, dim * sizeof(float));
    memcpy(kmax, x, dim * sizeof(float));
    for (uint32_t t = 0; t < tokens; t++) {
        const float *r = x + (uint64_t)t * dim;
        __m256 ss = _mm256_setzero_ps();
        uint32_t d = 0;
        for (; d + 8 <= dim; d += 8) {
            __m256 v = _mm256_loadu_ps(r + d);
            _mm256_storeu_ps(kmin + d, _mm256_min_ps(v, _mm256_loadu_ps(kmin + d)));
            _mm256_storeu_ps(kmax + d, _mm256_max_ps(v, _mm256_loadu_ps(kmax + d)));
            ss = _mm256_add_ps(ss, _mm256_mul_ps(v, v));
        }
        float s = v_hsum(ss);
        for (; d < dim; d++) {
            kmin[d] = r[d] < kmin[d] ? r[d] : kmin[d];
            kmax[d] = r[d] > kmax[d] ? r[d] : kmax[d];
            s += r[d] * r[d];
        }
        norm += sqrtf(s);
    }
    *knorm = norm / (float)tokens;
}

/* ---- per-slice dispatch -------------------------------------------------------------- */

static void group_enc(uint32_t codec, int bits, const float *x, int n, uint8_t *blk)
{
    if (bits)
        kern_kivi_v_enc(x, n, blk, bits);
    else if (codec == KERN_CODEC_Q8_0)
        kern_q8_0_enc(x, n, blk);
    else
        kern_qx_1_enc(x, n, blk, codec == KERN_CODEC_Q5_1 ? 5 : 4);
}

static void group_dec(uint32_t codec, int bits, const uint8_t *blk, int n, float *y)
{
    if (bits)
        kern_kivi_v_dec(blk, n, y, bits);
    else if (codec == KERN_CODEC_Q8_0)
        kern_q8_0_dec(blk, n, y);
    else
        kern_qx_1_dec(blk, n, y, codec == KERN_CODEC_Q5_1 ? 5 : 4);
}

KT static void avx_enc(uint32_t codec, int is_v, const float *x, const struct kern_layout *lay,
                       uint32_t h, uint8_t *sect)
{
    uint32_t dim = lay->head_dim, H = lay->heads, G = kern_ngroups(dim), full = dim / 32;
    int bits = kern_codec_bits(codec);
    if (codec == KERN_CODEC_FP8) {
        fp8_enc(x, lay, h, sect);
        return;
    }
    if (bits && !is_v) {
        kivi_k_enc(x, lay, h, sect, bits);
        return;
    }
    uint32_t gb = block_bytes(codec, bits);
    for (uint32_t t = 0; t < lay->tokens; t++) {
        for (uint32_t g = 0; g < full; g++) {
            const float *xg = x + (uint64_t)t * dim + g * 32;
            uint8_t *blk = sect + (((uint64_t)t * H + h) * G + g) * gb;
            if (bits)
                kivi_v_enc32(xg, blk, bits);
            else if (codec == KERN_CODEC_Q8_0)
                q8_0_enc32(xg, blk);
            else
                qx_1_enc32(xg, blk, codec == KERN_CODEC_Q5_1 ? 5 : 4);
        }
        if (full < G) /* the partial last group: the reference's scalar group code */
            group_enc(codec, bits, x + (uint64_t)t * dim + full * 32, (int)(dim - full * 32),
                      sect + (((uint64_t)t * H + h) * G + full) * gb);
    }
}

KT static void avx_dec(uint32_t codec, int is_v, const uint8_t *sect, const struct kern_layout *lay,
                       uint32_t h, float *y)
{
    uint32_t dim = lay->head_dim, H = lay->heads, G = kern_ngroups(dim), full = dim / 32;
    int bits = kern_codec_bits(codec);
    if (codec == KERN_CODEC_FP8) {
        fp8_dec(sect, lay, h, y);
        return;
    }
    if (bits && !is_v) {
        kivi_k_dec(sect, lay, h, y, bits);
        return;
    }
    uint32_t gb = block_bytes(codec, bits);
    for (uint32_t t = 0; t < lay->tokens; t++) {
        for (uint32_t g = 0; g < full; g++) {
            float *yg = y + (uint64_t)t * dim + g * 32;
            const uint8_t *blk = sect + (((uint64_t)t * H + h) * G + g) * gb;
            if (bits)
                kivi_v_dec32(blk, yg, bits);
            else if (codec == KERN_CODEC_Q8_0)
                q8_0_dec32(blk, yg);
            else
                qx_1_dec32(blk, yg, codec == KERN_CODEC_Q5_1 ? 5 : 4);
        }
        if (full < G)
            group_dec(codec, bits, sect + (((uint64_t)t * H + h) * G + full) * gb,
                      (int)(dim - full * 32), y + (uint64_t)t * dim + full * 32);
    }
}

/* Row-wise codecs straight from the raw rows: each 32-value group is converted into a
 * 32-float buffer that stays in L1, instead of a pass through the slice scratch. */
KT static int avx_enc_raw(uint32_t codec, int is_v, const void *raw, const struct kern_layout *lay,
                          uint32_t h, uint8_t *sect)
{
    uint32_t dim = lay->head_dim, H = lay->heads, G = kern_ngroups(dim), full = dim / 32;
    int bits = kern_codec_bits(codec);
    uint64_t stride = (uint64_t)H * dim;
    float x[32];
    if (codec == KERN_CODEC_FP8 || (bits && !is_v))
        return 0;
    uint32_t gb = block_bytes(codec, bits);
    for (uint32_t t = 0; t < lay->tokens; t++) {
        const uint16_t *r = (const uint16_t *)raw + t * stride;
        uint8_t *blk = sect + ((uint64_t)t * H + h) * G * gb;
        for (uint32_t g = 0; g < full; g++, blk += gb) {
            KERN_UNROLL
            for (int i = 0; i < 4; i++)
                _mm256_storeu_ps(x + 8 * i, v_load8(r + g * 32 + 8 * i, lay->dtype));
            if (bits)
                kivi_v_enc32(x, blk, bits);
            else if (codec == KERN_CODEC_Q8_0)
                q8_0_enc32(x, blk);
            else
                qx_1_enc32(x, blk, codec == KERN_CODEC_Q5_1 ? 5 : 4);
        }
        if (full < G) {
            int n = (int)(dim - full * 32);
            for (int j = 0; j < n; j++)
                x[j] = kern_sanitize(kern_load(r, lay->dtype, full * 32 + (uint32_t)j));
            group_enc(codec, bits, x, n, blk);
        }
    }
    return 1;
}

KT static int avx_dec_raw(uint32_t codec, int is_v, const uint8_t *sect,
                          const struct kern_layout *lay, uint32_t h, void *raw, uint32_t out)
{
    uint32_t dim = lay->head_dim, H = lay->heads, G = kern_ngroups(dim), full = dim / 32;
    int bits = kern_codec_bits(codec);
    uint64_t stride = (uint64_t)H * dim;
    float y[32];
    if (codec == KERN_CODEC_FP8 || (bits && !is_v))
        return 0;
    uint32_t gb = block_bytes(codec, bits);
    for (uint32_t t = 0; t < lay->tokens; t++) {
        uint16_t *r = (uint16_t *)raw + t * stride;
        const uint8_t *blk = sect + ((uint64_t)t * H + h) * G * gb;
        for (uint32_t g = 0; g < full; g++, blk += gb) {
            if (bits)
                kivi_v_dec32(blk, y, bits);
            else if (codec == KERN_CODEC_Q8_0)
                q8_0_dec32(blk, y);
            else
                qx_1_dec32(blk, y, codec == KERN_CODEC_Q5_1 ? 5 : 4);
            KERN_UNROLL
            for (int i = 0; i < 4; i++)
                v_store8(r + g * 32 + 8 * i, _mm256_loadu_ps(y + 8 * i), out);
        }
        if (full < G) {
            int n = (int)(dim - full * 32);
            group_dec(codec, bits, blk, n, y);
            for (int j = 0; j < n; j++)
                kern_store(r, out, full * 32 + (uint32_t)j, y[j]);
        }
    }
    return 1;
}

static const struct kern_cpu_ops avx2_ops = {
    .load = avx_load,
    .store = avx_store,
    .stats = avx_stats,
    .enc = avx_enc,
    .dec = avx_dec,
    .enc_raw = avx_enc_raw,
    .dec_raw = avx_dec_raw,
    .enc_sect = kern_avx2_enc_sect,
    .dec_sect = kern_avx2_dec_sect,
};

const struct kern_cpu_ops *kern_avx2_ops(void)
{
    static int have = -1;
    int h = __atomic_load_n(&have, __ATOMIC_RELAXED);
    if (h < 0) { /* idempotent: racing first callers store the same answer */
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
        __atomic_store_n(&kern_avx2_cpu_fma, h && __builtin_cpu_supports("fma"), __ATOMIC_RELAXED);
        __atomic_store_n(&kern_avx2_have_fma, h && __builtin_cpu_supports("fma"), __ATOMIC_RELAXED);
        __atomic_store_n(&have, h, __ATOMIC_RELAXED);
    }
    return h ? &avx2_ops : NULL;
}
