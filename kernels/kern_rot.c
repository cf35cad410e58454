/*
 * kern_rot.c — ROT2/ROT4: keys rotated by a randomized Hadamard transform per head, then
 * 2/4-bit per token in KIVI's value groups (kern_ext.h has the format and the arithmetic).
 *
 * DESIGN
 * A few channels of a key carry most of its magnitude in real models (KIVI, KVQuant); a
 * per-channel quantizer spends its range on them. An orthonormal rotation spreads every
 * outlier over all channels of the head (QuaRot, SpinQuant), so a per-token quantizer's
 * groups lose their stretched ranges: the same bits cost less error; the rotation is fixed
 * per namespace (its seed) and undone on decode. The section is KIVI value groups of the
 * rotated rows behind a 16-byte prefix with the section's seed, so the KIVI encoders and
 * decoders of the CPU path in use (the reference's or the AVX2 ones) do the quantization:
 * only the rotation is here, scalar (the reference) and AVX2 (the butterfly's
 * strides of 8 and more as whole-vector adds, the three below inside a vector; the same
 * single-rounded sums in the same pairs, so the same bits). Values are plain KIVI sections
 * (kern_codec_as) and never come here.
 */
#include <errno.h>
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern_cpu.h"
#include "kernels/kern_ext.h"

#define KT __attribute__((target("avx2,f16c")))

/* y[T][D] = the rotated rows x[T][D] of head h (reference). */
static void rot_fwd_ref(const float *x, float *y, uint32_t tokens, uint32_t dim, uint32_t sseed,
                        uint32_t h)
{
    for (uint32_t t = 0; t < tokens; t++)
        kern_rot_fwd(x + (uint64_t)t * dim, y + (uint64_t)t * dim, sseed, h, dim);
}

static void rot_inv_ref(float *y, uint32_t tokens, uint32_t dim, uint32_t sseed, uint32_t h)
{
    for (uint32_t t = 0; t < tokens; t++)
        kern_rot_inv(y + (uint64_t)t * dim, sseed, h, dim);
}

/* The butterfly on one row of dim (a power of two >= 8) floats, in place. Stages of stride
 * 1, 2, 4 inside each vector of 8, then the strides of 8 and more between vectors: every
 * stage's pairs and operations are the reference's. */
KT static void rot_fwht_avx2(float *v, uint32_t dim)
{
    const __m256 neg1 = _mm256_castsi256_ps(_mm256_setr_epi32(
        0, (int)0x80000000, 0, (int)0x80000000, 0, (int)0x80000000, 0, (int)0x80000000));
    const __m256 neg2 = _mm256_castsi256_ps(_mm256_setr_epi32(
        0, 0, (int)0x80000000, (int)0x80000000, 0, 0, (int)0x80000000, (int)0x80000000));
    for (uint32_t i = 0; i < dim; i += 8) {
        __m256 a = _mm256_loadu_ps(v + i);
        /* stride 1: (a0 + a1, a0 - a1): partner by a swap of neighbours, sign on the odd */
        __m256 p = _mm256_permute_ps(a, 0xb1);
        a = _mm256_add_ps(_mm256_xor_ps(a, neg1), p);
        /* an odd lane held -a1 + a0 = a0 - a1 exactly (negation is exact, addition
         * commutes): the reference's difference */
        p = _mm256_permute_ps(a, 0x4e);
        a = _mm256_add_ps(_mm256_xor_ps(a, neg2), p);
        /* stride 4: the halves of the vector */
        __m256 lo = _mm256_permute2f128_ps(a, a, 0x00), hi = _mm256_permute2f128_ps(a, a, 0x11);
        __m256 sum = _mm256_add_ps(lo, hi), dif = _mm256_sub_ps(lo, hi);
        a = _mm256_permute2f128_ps(sum, dif, 0x20);
        _mm256_storeu_ps(v + i, a);
    }
    for (uint32_t len = 8; len < dim; len <<= 1)
        for (uint32_t i = 0; i < dim; i += 2 * len)
            for (uint32_t j = i; j < i + len; j += 8) {
                __m256 a = _mm256_loadu_ps(v + j), b = _mm256_loadu_ps(v + j + len);
                _mm256_storeu_ps(v + j, _mm256_add_ps(a, b));
                _mm256_storeu_ps(v + j + len, _mm256_sub_ps(a, b));
            }
}

/* The signs of head h's channels as a float mask of sign bits: 0x80000000 where -1. */
static void rot_signs(uint32_t *mask, uint32_t sseed, uint32_t h, uint32_t dim)
{
    for (uint32_t j = 0; j < dim; j++)
        mask[j] = kern_rot_neg(sseed, h, j) ? 0x80000000u : 0u;
}

KT static __m256 rot_sanitize(__m256 x)
{
    x = _mm256_and_ps(x, _mm256_cmp_ps(x, x, _CMP_ORD_Q));
    x = _mm256_min_ps(x, _mm256_set1_ps(KERN_FP16_MAX));
    return _mm256_max_ps(x, _mm256_set1_ps(-KERN_FP16_MAX));
}

KT static void rot_fwd_avx2(const float *x, float *y, uint32_t tokens, uint32_t dim, uint32_t sseed,
                            uint32_t h, uint32_t *mask)
{
    const __m256 c = _mm256_set1_ps(kern_rot_scale(dim));
    rot_signs(mask, sseed, h, dim);
    for (uint32_t t = 0; t < tokens; t++) {
        const float *xr = x + (uint64_t)t * dim;
        float *yr = y + (uint64_t)t * dim;
        for (uint32_t j = 0; j < dim; j += 8)
            _mm256_storeu_ps(yr + j, _mm256_xor_ps(_mm256_loadu_ps(xr + j),
                                                   _mm256_loadu_ps((const float *)mask + j)));
        rot_fwht_avx2(yr, dim);
        for (uint32_t j = 0; j < dim; j += 8)
            _mm256_storeu_ps(yr + j, rot_sanitize(_mm256_mul_ps(_mm256_loadu_ps(yr + j), c)));
    }
}

KT static void rot_inv_avx2(float *y, uint32_t tokens, uint32_t dim, uint32_t sseed, uint32_t h,
                            uint32_t *mask)
{
    const __m256 c = _mm256_set1_ps(kern_rot_scale(dim));
    rot_signs(mask, sseed, h, dim);
    for (uint32_t t = 0; t < tokens; t++) {
        float *yr = y + (uint64_t)t * dim;
        rot_fwht_avx2(yr, dim);
        for (uint32_t j = 0; j < dim; j += 8)
            _mm256_storeu_ps(yr + j, _mm256_xor_ps(_mm256_mul_ps(_mm256_loadu_ps(yr + j), c),
                                                   _mm256_loadu_ps((const float *)mask + j)));
    }
}

int kern_rot_enc(const struct kern_cpu_ops *ops, uint32_t codec, const struct kern_ext_ctx *c,
                 uint8_t *sect)
{
    const struct kern_layout *lay = c->lay;
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim;
    const uint32_t kivi = codec == KERN_CODEC_ROT2 ? KERN_CODEC_KIVI2 : KERN_CODEC_KIVI4;
    const uint32_t sseed = kern_rot_sect_seed(c->rec->seed, c->layer);
    const int vec = ops != &kern_ref_ops;
    float *x = malloc(2 * (size_t)T * D * sizeof(float) + D * sizeof(uint32_t));
    if (!x)
        return -ENOMEM;
    float *y = x + (size_t)T * D;
    uint32_t *mask = (uint32_t *)(y + (size_t)T * D);
    memset(sect, 0, KERN_ROT_PREFIX);
    memcpy(sect, &sseed, 4);
    for (uint32_t h = 0; h < H; h++) {
        ops->load(c->rawk + 2ull * h * D, lay->dtype, (uint64_t)H * D, T, D, x);
        if (vec)
            rot_fwd_avx2(x, y, T, D, sseed, h, mask);
        else
            rot_fwd_ref(x, y, T, D, sseed, h);
        ops->enc(kivi, 1, y, lay, h, sect + KERN_ROT_PREFIX);
    }
    free(x);
    return 0;
}

int kern_rot_dec(const struct kern_cpu_ops *ops, uint32_t codec, const struct kern_layout *lay,
                 const uint8_t *sect, void *raw, uint32_t out_dtype)
{
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim;
    const uint32_t kivi = codec == KERN_CODEC_ROT2 ? KERN_CODEC_KIVI2 : KERN_CODEC_KIVI4;
    const uint32_t sseed = kern_rot_get_seed(sect);
    const int vec = ops != &kern_ref_ops;
    float *y = malloc((size_t)T * D * sizeof(float) + D * sizeof(uint32_t));
    if (!y)
        return -ENOMEM;
    uint32_t *mask = (uint32_t *)(y + (size_t)T * D);
    for (uint32_t h = 0; h < H; h++) {
        ops->dec(kivi, 1, sect + KERN_ROT_PREFIX, lay, h, y);
        if (vec)
            rot_inv_avx2(y, T, D, sseed, h, mask);
        else
            rot_inv_ref(y, T, D, sseed, h);
        ops->store(y, T, D, (uint8_t *)raw + 2ull * h * D, out_dtype, (uint64_t)H * D);
    }
    free(y);
    return 0;
}
