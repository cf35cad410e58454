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
 * single-rounded sums in the same pairs, so the same bits). The AVX2 encode takes eight
 * tokens of a head at once with the tokens in the lanes, where every stage is between
 * whole vectors and the groups' extremes and parameters are lane-wise (it does the
 * quantization of those rows itself, the KIVI value groups' bytes). Where the CPU has AVX-512
 * (kern_rot512.c) the decode and the encode's blocks of sixteen tokens go there. Values are
 * plain KIVI sections (kern_codec_as); with AVX-512 they are decoded with the keys, between
 * their rows (kern_rot_dec_kv), else on their own.
 */
#include <errno.h>
#include <immintrin.h>
#include <math.h>
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
    const __m256 neg4 = _mm256_castsi256_ps(_mm256_setr_epi32(
        0, 0, 0, 0, (int)0x80000000, (int)0x80000000, (int)0x80000000, (int)0x80000000));
    for (uint32_t i = 0; i < dim; i += 8) {
        __m256 a = _mm256_loadu_ps(v + i);
        /* stride 1: (a0 + a1, a0 - a1): partner by a swap of neighbours, sign on the odd */
        __m256 p = _mm256_permute_ps(a, 0xb1);
        a = _mm256_add_ps(_mm256_xor_ps(a, neg1), p);
        /* an odd lane held -a1 + a0 = a0 - a1 exactly (negation is exact, addition
         * commutes): the reference's difference */
        p = _mm256_permute_ps(a, 0x4e);
        a = _mm256_add_ps(_mm256_xor_ps(a, neg2), p);
        /* stride 4: the halves swapped, the high half negated: lo + hi, -hi + lo = lo - hi */
        a = _mm256_add_ps(_mm256_xor_ps(a, neg4), _mm256_permute2f128_ps(a, a, 0x01));
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

/* kern_rot_mix on eight lanes. */
KT static inline __attribute__((always_inline)) __m256i rot_mix8(__m256i x)
{
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x85ebca6bu));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 13));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0xc2b2ae35u));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

/* The signs of head h's channels as a float mask of sign bits: 0x80000000 where -1
 * (kern_rot_neg eight channels at a time; dim is a multiple of 8). */
KT static void rot_signs(uint32_t *mask, uint32_t sseed, uint32_t h, uint32_t dim)
{
    const __m256i step = _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8),
                  seed = _mm256_set1_epi32((int)sseed);
    for (uint32_t j = 0; j < dim; j += 8) {
        __m256i k = _mm256_add_epi32(_mm256_set1_epi32((int)(h * 0x9e3779b1u + j)), step);
        k = rot_mix8(_mm256_xor_si256(seed, rot_mix8(k)));
        _mm256_storeu_si256((__m256i *)(mask + j), _mm256_slli_epi32(k, 31));
    }
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

/* ---- AVX2, fused: a (token, head) row at a time, from the raw rows to the groups --------- */

/* Eight raw halves as floats, sanitized as kern_ext_value (clean: fp16 halves known to be
 * finite, which F16C gives exactly and inside the fp16 range: nothing to sanitize). */
KT static inline __attribute__((always_inline)) __m256 rot_load8c(const uint16_t *p, uint32_t dtype,
                                                                  const int clean)
{
    if (clean)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m256 x = dtype == KERN_DTYPE_BF16
                   ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
                   : _mm256_cvtph_ps(v);
    return rot_sanitize(x);
}

KT static __m256 rot_load8(const uint16_t *p, uint32_t dtype)
{
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m256 x = dtype == KERN_DTYPE_BF16
                   ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
                   : _mm256_cvtph_ps(v);
    return rot_sanitize(x);
}

KT static void rot_store8(uint16_t *p, __m256 x, uint32_t dtype)
{
    if (dtype == KERN_DTYPE_FP16) {
        _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        return;
    }
    /* bf16, round to nearest even as kern_f2bf (decoded values are never NaN) */
    __m256i u = _mm256_castps_si256(x);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd),
                          16);
    __m128i lo = _mm256_castsi256_si128(u), hi = _mm256_extracti128_si256(u, 1);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(lo, hi));
}

/* Lane g of the result: the minimum (max 0) or maximum (max 1) of the four vectors of group g,
 * for four groups at once. min and max are exact, so any order of the comparisons gives the
 * reference's value, except which of +0 and -0 (rot_groups_enc redoes such a group). */
KT static inline __attribute__((always_inline)) __m128 rot_ext4(const __m256 *x, int max)
{
    __m256 m[4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++)
        m[g] = max ? _mm256_max_ps(_mm256_max_ps(x[4 * g], x[4 * g + 1]),
                                   _mm256_max_ps(x[4 * g + 2], x[4 * g + 3]))
                   : _mm256_min_ps(_mm256_min_ps(x[4 * g], x[4 * g + 1]),
                                   _mm256_min_ps(x[4 * g + 2], x[4 * g + 3]));
#define ROT_EXT(a, b) (max ? _mm256_max_ps((a), (b)) : _mm256_min_ps((a), (b)))
    /* [g0 g1 g0 g1 | ...] and [g2 g3 g2 g3 | ...], then [g0 g1 g2 g3 | g0 g1 g2 g3] */
    const __m256 t0 = ROT_EXT(_mm256_unpacklo_ps(m[0], m[1]), _mm256_unpackhi_ps(m[0], m[1]));
    const __m256 t1 = ROT_EXT(_mm256_unpacklo_ps(m[2], m[3]), _mm256_unpackhi_ps(m[2], m[3]));
    const __m256 u = ROT_EXT(_mm256_shuffle_ps(t0, t1, 0x44), _mm256_shuffle_ps(t0, t1, 0xee));
#undef ROT_EXT
    const __m128 lo = _mm256_castps256_ps128(u), hi = _mm256_extractf128_ps(u, 1);
    return max ? _mm_max_ps(lo, hi) : _mm_min_ps(lo, hi);
}

/* kern_kivi_v_enc of ng (1, 2 or 4) full groups of 32 (x: four vectors per group; group g to
 * o + g * gb), the four groups' parameters together: kern_kivi_params' min and
 * (max - min) / qmax to fp16 in one conversion (F16C rounds as kern_f2h), back to float,
 * 1 / scale unless 0 (vector divisions round as the scalar ones). Codes as v_kivi_code of
 * kern_avx2_kivi.h: the truncating conversion of (x - mnf) * id + 0.5, negatives saturated to
 * 0 by the byte packs and an unsigned byte min to qmax, which is the reference's
 * clamp(floor(t), 0, qmax) as long as |t| < 2^31: x is clamped to the fp16 range, so
 * |mn - mnf| <= 16, and id is 0 or at most 2^24 with (mx - mn) * id <= 1.5 qmax + 1, so
 * |t| < 2^29. A group whose minimum or maximum is zero (the reference keeps the first of +0
 * and -0; the tree keeps either) is encoded by the reference. */
KT static inline __attribute__((always_inline)) void
rot_groups_enc(const __m256 *x, const uint32_t ng, uint8_t *o, uint32_t gb, int bits)
{
    __m256 xs[16];
#pragma GCC unroll 16
    for (uint32_t j = 0; j < 16; j++)
        xs[j] = x[j < 4 * ng ? j : j % 4];
    const __m128 mn = rot_ext4(xs, 0), mx = rot_ext4(xs, 1);
    const __m128 qmax = _mm_set1_ps((float)((1 << bits) - 1));
    const __m128i h = _mm256_cvtps_ph(_mm256_set_m128(_mm_div_ps(_mm_sub_ps(mx, mn), qmax), mn),
                                      _MM_FROUND_TO_NEAREST_INT);
    const __m256 back = _mm256_cvtph_ps(h); /* mnf[4], scale[4] */
    const __m128 sc = _mm256_extractf128_ps(back, 1);
    const __m128 id =
        _mm_andnot_ps(_mm_cmpeq_ps(sc, _mm_setzero_ps()), _mm_div_ps(_mm_set1_ps(1.0f), sc));
    const __m256 idv = _mm256_castps128_ps256(id);
    /* the headers: scale then min, per group */
    uint32_t hdr[4];
    _mm_storeu_si128((__m128i *)hdr, _mm_unpacklo_epi16(_mm_unpackhi_epi64(h, h), h));
    const int zero = _mm_movemask_ps(
        _mm_or_ps(_mm_cmpeq_ps(mn, _mm_setzero_ps()), _mm_cmpeq_ps(mx, _mm_setzero_ps())));
    const __m256 half = _mm256_set1_ps(0.5f);
    const __m256i qb = _mm256_set1_epi8((char)((1 << bits) - 1));
#pragma GCC unroll 4
    for (uint32_t g = 0; g < ng; g++) {
        uint8_t *blk = o + (uint64_t)g * gb;
        if (zero >> g & 1) {
            float f[32];
            for (int j = 0; j < 4; j++)
                _mm256_storeu_ps(f + 8 * j, x[4 * g + j]);
            kern_kivi_v_enc(f, 32, blk, bits);
            continue;
        }
        memcpy(blk, &hdr[g], 4);
        const __m256i gi = _mm256_set1_epi32((int)g);
        const __m256 vm = _mm256_permutevar8x32_ps(back, gi),
                     vi = _mm256_permutevar8x32_ps(idv, gi);
        __m256i q[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            q[j] = _mm256_cvttps_epi32(
                _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(x[4 * g + j], vm), vi), half));
        /* 32 codes to bytes in order: the packs leave 4-byte runs q0[0-3] q1[0-3] q2[0-3]
         * q3[0-3] q0[4-7] ...; one dword permute puts them back */
        __m256i w = _mm256_packs_epi32(q[0], q[1]), z = _mm256_packs_epi32(q[2], q[3]);
        __m256i b = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(w, z),
                                                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        b = _mm256_min_epu8(b, qb);
        /* pairs: b[2i] + 16 b[2i+1] (4 bits); for 2 bits, b[2i] + 4 b[2i+1] then pairs again */
        __m256i p = _mm256_maddubs_epi16(b, _mm256_set1_epi16(bits == 4 ? 0x1001 : 0x0401));
        __m128i p8 = _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
        if (bits == 4) {
            _mm_storeu_si128((__m128i *)(blk + 4), p8);
            continue;
        }
        __m128i p4 = _mm_maddubs_epi16(p8, _mm_set1_epi16(0x1001));
        _mm_storel_epi64((__m128i *)(blk + 4), _mm_packus_epi16(p4, p4));
    }
}

/* kern_kivi_v_dec of a full group into four vectors: q * scale + min, in that order. */
KT static inline __attribute__((always_inline)) void rot_group_dec(const uint8_t *blk, __m256 *y,
                                                                   int bits)
{
    const __m128 sm =
        _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)blk[0] | (uint32_t)blk[1] << 8 |
                                             (uint32_t)blk[2] << 16 | (uint32_t)blk[3] << 24)));
    const __m256 sc = _mm256_broadcastss_ps(sm),
                 mn = _mm256_broadcastss_ps(_mm_shuffle_ps(sm, sm, 1));
    __m128i q0, q1; /* the 32 codes in order, as bytes */
    if (bits == 4) {
        const __m128i b = _mm_loadu_si128((const __m128i *)(blk + 4)), m4 = _mm_set1_epi8(0xf);
        const __m128i lo = _mm_and_si128(b, m4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m4);
        q0 = _mm_unpacklo_epi8(lo, hi);
        q1 = _mm_unpackhi_epi8(lo, hi);
    } else {
        const __m128i b = _mm_loadl_epi64((const __m128i *)(blk + 4)), m2 = _mm_set1_epi8(3);
        const __m128i c0 = _mm_and_si128(b, m2), c1 = _mm_and_si128(_mm_srli_epi16(b, 2), m2);
        const __m128i c2 = _mm_and_si128(_mm_srli_epi16(b, 4), m2);
        const __m128i c3 = _mm_and_si128(_mm_srli_epi16(b, 6), m2);
        const __m128i p01 = _mm_unpacklo_epi8(c0, c1), p23 = _mm_unpacklo_epi8(c2, c3);
        q0 = _mm_unpacklo_epi16(p01, p23);
        q1 = _mm_unpackhi_epi16(p01, p23);
    }
    y[0] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q0)), sc), mn);
    y[1] = _mm256_add_ps(
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q0, 8))), sc), mn);
    y[2] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q1)), sc), mn);
    y[3] = _mm256_add_ps(
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q1, 8))), sc), mn);
}

/* The butterfly's stages of strides 1 .. n / 2 on n vectors (the channels' stride), in
 * place: the reference's pairs, a sum and a difference each. */
KT static inline __attribute__((always_inline)) void rot_fwht_lanes(__m256 *v, const uint32_t n)
{
#pragma GCC unroll 4
    for (uint32_t len = 1; len < n; len <<= 1)
#pragma GCC unroll 8
        for (uint32_t i = 0; i < n; i += 2 * len)
#pragma GCC unroll 8
            for (uint32_t j = i; j < i + len; j++) {
                const __m256 a = v[j], b = v[j + len];
                v[j] = _mm256_add_ps(a, b);
                v[j + len] = _mm256_sub_ps(a, b);
            }
}

/* The butterfly of rot_fwht_avx2 on a row held in nv registers (dim = 8 nv <= 128): the
 * same stages, pairs and operations, without the row's trips through memory. Inlined with a
 * constant nv, the loops unroll and r[] stays in registers. */
KT static inline __attribute__((always_inline)) void rot_fwht_regs(__m256 *r, const uint32_t nv)
{
    const __m256 neg1 = _mm256_castsi256_ps(_mm256_setr_epi32(
        0, (int)0x80000000, 0, (int)0x80000000, 0, (int)0x80000000, 0, (int)0x80000000));
    const __m256 neg2 = _mm256_castsi256_ps(_mm256_setr_epi32(
        0, 0, (int)0x80000000, (int)0x80000000, 0, 0, (int)0x80000000, (int)0x80000000));
    const __m256 neg4 = _mm256_castsi256_ps(_mm256_setr_epi32(
        0, 0, 0, 0, (int)0x80000000, (int)0x80000000, (int)0x80000000, (int)0x80000000));
#pragma GCC unroll 16
    for (uint32_t i = 0; i < nv; i++) {
        __m256 a = r[i];
        a = _mm256_add_ps(_mm256_xor_ps(a, neg1), _mm256_permute_ps(a, 0xb1));
        a = _mm256_add_ps(_mm256_xor_ps(a, neg2), _mm256_permute_ps(a, 0x4e));
        r[i] = _mm256_add_ps(_mm256_xor_ps(a, neg4), _mm256_permute2f128_ps(a, a, 0x01));
    }
    rot_fwht_lanes(r, nv); /* strides of 8 channels and more: between the registers */
}

/* One (token, head) row of rot_enc_fused in registers: load, centre, sign, butterfly,
 * scale, groups. */
KT static inline __attribute__((always_inline)) void
rot_enc_row_regs(const uint16_t *r, uint32_t dtype, const uint32_t *m, const float *mu, __m256 c,
                 int bits, uint32_t gb, uint8_t *o, const uint32_t nv, const int clean,
                 const int small)
{
    __m256 x[16];
#pragma GCC unroll 16
    for (uint32_t j = 0; j < nv; j++)
        x[j] = _mm256_xor_ps(
            _mm256_sub_ps(rot_load8c(r + 8 * j, dtype, clean), _mm256_loadu_ps(mu + 8 * j)),
            _mm256_loadu_ps((const float *)m + 8 * j));
    rot_fwht_regs(x, nv);
#pragma GCC unroll 16
    for (uint32_t j = 0; j < nv; j++)
        x[j] = small ? _mm256_mul_ps(x[j], c) : rot_sanitize(_mm256_mul_ps(x[j], c));
    rot_groups_enc(x, nv / 4, o, gb, bits);
}

/* One row of rot_dec_fused in registers: groups, butterfly, then per channel y * cs + mean
 * (cs: c with the channel's sign, y * -c being -(y * c) exactly), stored. */
KT static inline __attribute__((always_inline)) void
rot_dec_row_regs(const uint8_t *g0, int bits, uint32_t gb, const float *cs, const float *mf,
                 uint16_t *o, uint32_t out_dtype, const uint32_t nv)
{
    __m256 y[16];
#pragma GCC unroll 4
    for (uint32_t g = 0; g < nv / 4; g++)
        rot_group_dec(g0 + (uint64_t)g * gb, y + 4 * g, bits);
    rot_fwht_regs(y, nv);
#pragma GCC unroll 16
    for (uint32_t j = 0; j < nv; j++)
        rot_store8(o + 8 * j,
                   _mm256_add_ps(_mm256_mul_ps(y[j], _mm256_loadu_ps(cs + 8 * j)),
                                 _mm256_loadu_ps(mf + 8 * j)),
                   out_dtype);
}

/* ---- AVX2, eight tokens of a head at a time: tokens in the lanes ------------------------ */

/* Eight tokens' 16 channels (halves at r, the tokens ts apart) as 16 vectors of floats, one
 * per channel, lane i token i, sanitized as kern_ext_value unless clean: an 8 x 8 transpose
 * of the halves in each 128-bit lane (channels 0-7 low, 8-15 high), then the conversion. */
KT static inline __attribute__((always_inline)) void
rot_load_t16(const uint16_t *r, uint64_t ts, uint32_t dtype, const int clean, __m256 *x)
{
    __m256i a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        a[i] = _mm256_loadu_si256((const __m256i *)(r + i * ts));
    /* pairs of tokens per channel, then quads, then all eight */
    const __m256i b0 = _mm256_unpacklo_epi16(a[0], a[1]), b1 = _mm256_unpackhi_epi16(a[0], a[1]);
    const __m256i b2 = _mm256_unpacklo_epi16(a[2], a[3]), b3 = _mm256_unpackhi_epi16(a[2], a[3]);
    const __m256i b4 = _mm256_unpacklo_epi16(a[4], a[5]), b5 = _mm256_unpackhi_epi16(a[4], a[5]);
    const __m256i b6 = _mm256_unpacklo_epi16(a[6], a[7]), b7 = _mm256_unpackhi_epi16(a[6], a[7]);
    const __m256i c0 = _mm256_unpacklo_epi32(b0, b2), c1 = _mm256_unpackhi_epi32(b0, b2);
    const __m256i c2 = _mm256_unpacklo_epi32(b4, b6), c3 = _mm256_unpackhi_epi32(b4, b6);
    const __m256i c4 = _mm256_unpacklo_epi32(b1, b3), c5 = _mm256_unpackhi_epi32(b1, b3);
    const __m256i c6 = _mm256_unpacklo_epi32(b5, b7), c7 = _mm256_unpackhi_epi32(b5, b7);
    const __m256i d[8] = {_mm256_unpacklo_epi64(c0, c2), _mm256_unpackhi_epi64(c0, c2),
                          _mm256_unpacklo_epi64(c1, c3), _mm256_unpackhi_epi64(c1, c3),
                          _mm256_unpacklo_epi64(c4, c6), _mm256_unpackhi_epi64(c4, c6),
                          _mm256_unpacklo_epi64(c5, c7), _mm256_unpackhi_epi64(c5, c7)};
#pragma GCC unroll 16
    for (int k = 0; k < 16; k++) {
        const __m128i v =
            k < 8 ? _mm256_castsi256_si128(d[k]) : _mm256_extracti128_si256(d[k % 8], 1);
        if (clean)
            x[k] = _mm256_cvtph_ps(v);
        else
            x[k] = rot_sanitize(dtype == KERN_DTYPE_BF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(
                                                               _mm256_cvtepu16_epi32(v), 16))
                                                         : _mm256_cvtph_ps(v));
    }
}

/* The group of 32 channels x[0..31] (lane i token i) to codes as bytes, four channels a
 * vector: B(a, b, c, d) holds in lane L, byte 4k + i, the code of the k-th of channels
 * a, b, c, d for token 4L + i (the packs' order), clamped to [0, qmax] as rot_groups_enc's. */
KT static inline __attribute__((always_inline)) __m256i
rot_codes4(const __m256 *x, int a, int b, int c, int d, __m256 vm, __m256 vi, __m256i qb)
{
    const __m256 half = _mm256_set1_ps(0.5f);
#define ROT_Q(j)                                                                                   \
    _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(x[j], vm), vi), half))
    const __m256i w = _mm256_packs_epi32(ROT_Q(a), ROT_Q(b)),
                  z = _mm256_packs_epi32(ROT_Q(c), ROT_Q(d));
#undef ROT_Q
    return _mm256_min_epu8(_mm256_packus_epi16(w, z), qb);
}

/* Eight tokens' groups g of head h (x: the group's 32 channels, lane i token i, scaled and
 * clamped) to their blocks at o[i] + g * gb: the parameters of the eight groups in one
 * vector each (kern_kivi_params lane by lane, as rot_groups_enc), the codes per channel,
 * bytes transposed back to token order. A group whose minimum or maximum is zero is encoded
 * by the reference (see rot_groups_enc). */
KT static inline __attribute__((always_inline)) void rot_groups_enc8(const __m256 *x,
                                                                     uint8_t *const *o, int bits)
{
    /* the extremes: min and max are exact, so their order is free but for the sign of a
     * zero, which is left to the reference below */
    __m256 mn = x[0], mx = x[0], mn1 = x[1], mx1 = x[1];
#pragma GCC unroll 16
    for (int j = 2; j < 32; j += 2) {
        mn = _mm256_min_ps(mn, x[j]);
        mx = _mm256_max_ps(mx, x[j]);
        mn1 = _mm256_min_ps(mn1, x[j + 1]);
        mx1 = _mm256_max_ps(mx1, x[j + 1]);
    }
    mn = _mm256_min_ps(mn, mn1);
    mx = _mm256_max_ps(mx, mx1);
    const __m256 qmax = _mm256_set1_ps((float)((1 << bits) - 1));
    const __m128i hmn = _mm256_cvtps_ph(mn, _MM_FROUND_TO_NEAREST_INT),
                  hsc = _mm256_cvtps_ph(_mm256_div_ps(_mm256_sub_ps(mx, mn), qmax),
                                        _MM_FROUND_TO_NEAREST_INT);
    const __m256 vm = _mm256_cvtph_ps(hmn), sc = _mm256_cvtph_ps(hsc);
    const __m256 vi = _mm256_andnot_ps(_mm256_cmp_ps(sc, _mm256_setzero_ps(), _CMP_EQ_OQ),
                                       _mm256_div_ps(_mm256_set1_ps(1.0f), sc));
    const int zero =
        _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(mn, _mm256_setzero_ps(), _CMP_EQ_OQ),
                                        _mm256_cmp_ps(mx, _mm256_setzero_ps(), _CMP_EQ_OQ)));
    /* the headers, scale then min: dword i of hdr token i */
    uint32_t hdr[8];
    _mm_storeu_si128((__m128i *)hdr, _mm_unpacklo_epi16(hsc, hmn));
    _mm_storeu_si128((__m128i *)(hdr + 4), _mm_unpackhi_epi16(hsc, hmn));
    const __m256i qb = _mm256_set1_epi8((char)((1 << bits) - 1));
    /* bytes 4k + i of a lane to dword i: token 4L + i's four code bytes */
    const __m256i tr = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4,
                                        8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m256i p[4];
    if (bits == 4) {
        /* p[k]: the code bytes 4k .. 4k + 3 (channels 8k .. 8k + 7), low nibble the even one */
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const int c = 8 * k;
            const __m256i lo = rot_codes4(x, c, c + 2, c + 4, c + 6, vm, vi, qb),
                          hi = rot_codes4(x, c + 1, c + 3, c + 5, c + 7, vm, vi, qb);
            p[k] = _mm256_shuffle_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), tr);
        }
        const __m256i e0 = _mm256_unpacklo_epi32(p[0], p[1]),
                      e1 = _mm256_unpackhi_epi32(p[0], p[1]);
        const __m256i e2 = _mm256_unpacklo_epi32(p[2], p[3]),
                      e3 = _mm256_unpackhi_epi32(p[2], p[3]);
        const __m256i f[4] = {_mm256_unpacklo_epi64(e0, e2), _mm256_unpackhi_epi64(e0, e2),
                              _mm256_unpacklo_epi64(e1, e3), _mm256_unpackhi_epi64(e1, e3)};
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            _mm_storeu_si128((__m128i *)(o[i] + 4), _mm256_castsi256_si128(f[i]));
            _mm_storeu_si128((__m128i *)(o[4 + i] + 4), _mm256_extracti128_si256(f[i], 1));
        }
    } else {
        /* p[k]: the code bytes 4k .. 4k + 3 (channels 16k .. 16k + 15), lowest bits first */
#pragma GCC unroll 2
        for (int k = 0; k < 2; k++) {
            const int c = 16 * k;
            const __m256i b0 = rot_codes4(x, c, c + 4, c + 8, c + 12, vm, vi, qb),
                          b1 = rot_codes4(x, c + 1, c + 5, c + 9, c + 13, vm, vi, qb),
                          b2 = rot_codes4(x, c + 2, c + 6, c + 10, c + 14, vm, vi, qb),
                          b3 = rot_codes4(x, c + 3, c + 7, c + 11, c + 15, vm, vi, qb);
            const __m256i v = _mm256_or_si256(
                _mm256_or_si256(b0, _mm256_slli_epi16(b1, 2)),
                _mm256_or_si256(_mm256_slli_epi16(b2, 4), _mm256_slli_epi16(b3, 6)));
            p[k] = _mm256_shuffle_epi8(v, tr);
        }
        /* token 4L + 2m in the low 8 bytes of f[m], 4L + 2m + 1 in the high */
        const __m256i f[2] = {_mm256_unpacklo_epi32(p[0], p[1]), _mm256_unpackhi_epi32(p[0], p[1])};
#pragma GCC unroll 2
        for (int m = 0; m < 2; m++) {
            const __m128i l0 = _mm256_castsi256_si128(f[m]), l1 = _mm256_extracti128_si256(f[m], 1);
            _mm_storel_epi64((__m128i *)(o[2 * m] + 4), l0);
            _mm_storel_epi64((__m128i *)(o[2 * m + 1] + 4), _mm_unpackhi_epi64(l0, l0));
            _mm_storel_epi64((__m128i *)(o[4 + 2 * m] + 4), l1);
            _mm_storel_epi64((__m128i *)(o[4 + 2 * m + 1] + 4), _mm_unpackhi_epi64(l1, l1));
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        memcpy(o[i], &hdr[i], 4);
    for (int i = 0; zero && i < 8; i++) {
        if (!(zero >> i & 1))
            continue;
        float f[32], lane[8];
        for (int j = 0; j < 32; j++) {
            _mm256_storeu_ps(lane, x[j]);
            f[j] = lane[i];
        }
        kern_kivi_v_enc(f, 32, o[i], bits);
    }
}

/* Eight tokens (t .. t + 7) of head h of rot_enc_fused, D channels (32, 64 or 128): the
 * tokens in the lanes, so every butterfly stage is between whole vectors and each group's
 * extremes and parameters are lane-wise, for eight rows at once. The rows go through buf:
 * loaded, centred, signed and the three smallest stages per 16 channels; the stages of 8 up
 * to D / 4 per column of D / 16 vectors; the last stage, the scale and the groups' extremes;
 * then the codes per group. Every lane does the reference's operations in its order. */
KT static inline __attribute__((always_inline)) void
rot_enc_tok8(const uint16_t *r, uint64_t ts, uint32_t dtype, const uint32_t *m, const float *mu,
             __m256 c, int bits, uint8_t *const *o, uint32_t gb, const uint32_t D, const int clean,
             const int small)
{
    __m256 buf[128];
    for (uint32_t j = 0; j < D; j += 16) {
        __m256 x[16];
        rot_load_t16(r + j, ts, dtype, clean, x);
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++)
            x[k] = _mm256_xor_ps(_mm256_sub_ps(x[k], _mm256_broadcast_ss(mu + j + k)),
                                 _mm256_broadcast_ss((const float *)m + j + k));
        rot_fwht_lanes(x, 8);
        rot_fwht_lanes(x + 8, 8);
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++)
            buf[j + k] = x[k];
    }
    /* the stages of strides 8 .. D / 2 per column of D / 8 vectors (channels i, i + 8, ...),
     * then the scale */
    for (uint32_t i = 0; i < 8; i++) {
        __m256 v[16];
#pragma GCC unroll 16
        for (uint32_t k = 0; k < D / 8; k++)
            v[k] = buf[i + 8 * k];
        rot_fwht_lanes(v, D / 8);
#pragma GCC unroll 16
        for (uint32_t k = 0; k < D / 8; k++)
            buf[i + 8 * k] = small ? _mm256_mul_ps(v[k], c) : rot_sanitize(_mm256_mul_ps(v[k], c));
    }
    for (uint32_t g = 0; g < D / 32; g++) {
        uint8_t *og[8];
        for (int i = 0; i < 8; i++)
            og[i] = o[i] + (uint64_t)g * gb;
        rot_groups_enc8(buf + 32 * g, og, bits);
    }
}

/* The sums over T tokens (ts halves apart, token order) of nv * 8 channels at r, each
 * value as kern_ext_value (clean: rot_load8c's). */
KT static inline __attribute__((always_inline)) void rot_sums(const uint16_t *r, uint64_t ts,
                                                              uint32_t T, uint32_t dtype,
                                                              __m256 *sum, const uint32_t nv,
                                                              const int clean)
{
#pragma GCC unroll 8
    for (uint32_t k = 0; k < nv; k++)
        sum[k] = _mm256_setzero_ps();
    for (uint32_t t = 0; t < T; t++, r += ts)
#pragma GCC unroll 8
        for (uint32_t k = 0; k < nv; k++)
            sum[k] = _mm256_add_ps(sum[k], rot_load8c(r + 8 * k, dtype, clean));
}

/* The channels' means of every head (kern_rot_mean: tokens summed in order), as fp16 into
 * the section and as the float they round to into mean[H][D]. */
KT static void rot_means_avx2(const struct kern_layout *lay, const uint8_t *rawk, uint8_t *out,
                              float *mean, int *clean, int *small)
{
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim;
    const __m256 n = _mm256_set1_ps((float)T);
    const uint16_t *raw = (const uint16_t *)rawk;
    /* fp16 rows with no Inf or NaN (exponent all ones) need no sanitizing: the unsigned
     * maximum of the magnitudes' halves (ordered as the magnitudes, Inf and NaN above every
     * finite one) says it, and gives amax, the largest magnitude */
    const int on512 = kern_rot512_on();
    uint16_t amax_h = 0;
    if (lay->dtype == KERN_DTYPE_FP16 && on512)
        amax_h = kern_rot512_amax(raw, (uint64_t)T * H * D);
    else if (lay->dtype == KERN_DTYPE_FP16) {
        __m256i mx = _mm256_setzero_si256();
        const __m256i mag = _mm256_set1_epi16(0x7fff);
        for (uint64_t i = 0; i + 16 <= (uint64_t)T * H * D; i += 16)
            mx = _mm256_max_epu16(
                mx, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(raw + i)), mag));
        __m128i m8 = _mm_max_epu16(_mm256_castsi256_si128(mx), _mm256_extracti128_si256(mx, 1));
        m8 = _mm_max_epu16(m8, _mm_srli_si128(m8, 8));
        m8 = _mm_max_epu16(m8, _mm_srli_si128(m8, 4));
        m8 = _mm_max_epu16(m8, _mm_srli_si128(m8, 2));
        amax_h = (uint16_t)_mm_extract_epi16(m8, 0);
    }
    *clean = lay->dtype == KERN_DTYPE_FP16 && (T * H * D) % 16 == 0 && amax_h < 0x7c00;
    /* small: no rotated value of a clean section reaches the fp16 range, so the sanitizing
     * after the scale changes nothing and is skipped. Centred values are at most 2 amax in
     * magnitude (a mean of values within amax, rounded to fp16, is within amax), and
     * |y_i| = c |sum_j +-x'_j| <= c D max|x'| = sqrt(D) 2 amax; the butterfly's roundings
     * (seven sums, then the scale) grow that by under 1e-6, far inside the 1.01 allowed */
    *small = *clean && (double)kern_h2f(amax_h) * 2.0 * sqrt((double)D) * 1.01 < KERN_FP16_MAX;
    /* summed in token order per channel, 64 channels (eight chains) at a time in registers;
     * 128 (eight chains of sixteen) with AVX-512 */
    if (on512) {
        kern_rot512_means(lay, rawk, out, mean, *clean);
        return;
    }
    for (uint32_t h = 0; h < H; h++)
        for (uint32_t j = 0; j < D; j += 64) {
            const uint32_t w = D - j < 64 ? D - j : 64; /* D >= 32, a multiple of 32 */
            __m256 sum[8];
            if (w == 64 && *clean)
                rot_sums(raw + (uint64_t)h * D + j, (uint64_t)H * D, T, lay->dtype, sum, 8, 1);
            else if (w == 64)
                rot_sums(raw + (uint64_t)h * D + j, (uint64_t)H * D, T, lay->dtype, sum, 8, 0);
            else if (*clean)
                rot_sums(raw + (uint64_t)h * D + j, (uint64_t)H * D, T, lay->dtype, sum, 4, 1);
            else
                rot_sums(raw + (uint64_t)h * D + j, (uint64_t)H * D, T, lay->dtype, sum, 4, 0);
            for (uint32_t k = 0; k < w; k += 8) {
                __m128i hv =
                    _mm256_cvtps_ph(_mm256_div_ps(sum[k / 8], n), _MM_FROUND_TO_NEAREST_INT);
                _mm_storeu_si128((__m128i *)(out + 2 * ((uint64_t)h * D + j + k)), hv);
                _mm256_storeu_ps(mean + (uint64_t)h * D + j + k, _mm256_cvtph_ps(hv));
            }
        }
}

/* Fused encode of the K section: every row loaded, signed, transformed, scaled, and its
 * groups encoded while it is in registers and L1: whole blocks of eight tokens a head at a
 * time with the tokens in the lanes (rot_enc_tok8; D of 32, 64 or 128), the tail of fewer
 * than eight tokens and other head sizes a row at a time. D >= 32 (a full group); smaller
 * heads take the unfused path. */
KT static void rot_enc_fused(const struct kern_layout *lay, const uint8_t *rawk,
                             const uint8_t *rawv, uint32_t sseed, int bits, uint8_t *sect,
                             uint32_t *mask)
{
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim, G = D / KERN_GROUP;
    const uint32_t gb = kern_kivi_v_group_bytes(bits);
    const __m256 c = _mm256_set1_ps(kern_rot_scale(D));
    float row[KERN_ROT_MAX_DIM] __attribute__((aligned(32)));
    float *mean = (float *)(mask + (uint64_t)H * D);
    uint8_t *out = sect + kern_rot_groups_off(lay);
    for (uint32_t h = 0; h < H; h++)
        if (kern_rot512_on() && D % 16 == 0)
            kern_rot512_signs(mask + (uint64_t)h * D, sseed, h, D);
        else
            rot_signs(mask + (uint64_t)h * D, sseed, h, D);
    int clean, small;
    rot_means_avx2(lay, rawk, sect + KERN_ROT_PREFIX, mean, &clean, &small);
    /* whole blocks of eight tokens with the tokens in the lanes, the rest a row at a time */
    uint32_t t0 = 0;
    if (kern_rot512_on()) /* whole blocks of sixteen tokens with AVX-512, where it has them */
        t0 = kern_rot512_enc_rows(lay, rawk, rawv, mask, mean, bits, out, clean, small);
    if (D == 32 || D == 64 || D == 128)
        for (; t0 + 8 <= T; t0 += 8)
            for (uint32_t h = 0; h < H; h++) {
                const uint64_t ts = (uint64_t)H * D;
                const uint16_t *r = (const uint16_t *)rawk + (uint64_t)t0 * ts + (uint64_t)h * D;
                uint8_t *o[8];
                for (uint32_t i = 0; i < 8; i++) {
                    o[i] = out + (((uint64_t)t0 + i) * H + h) * G * gb;
                    /* the V slab into L2, as below */
                    if (rawv)
                        for (uint32_t j = 0; j < D; j += 32)
                            _mm_prefetch((const char *)(rawv + 2 * (((uint64_t)t0 + i) * ts +
                                                                    (uint64_t)h * D + j)),
                                         _MM_HINT_T1);
                }
                const uint32_t *m = mask + (uint64_t)h * D;
                const float *mu = mean + (uint64_t)h * D;
                if (D == 128 && small)
                    rot_enc_tok8(r, ts, lay->dtype, m, mu, c, bits, o, gb, 128, 1, 1);
                else if (D == 128 && clean)
                    rot_enc_tok8(r, ts, lay->dtype, m, mu, c, bits, o, gb, 128, 1, 0);
                else if (D == 128)
                    rot_enc_tok8(r, ts, lay->dtype, m, mu, c, bits, o, gb, 128, 0, 0);
                else if (D == 64)
                    rot_enc_tok8(r, ts, lay->dtype, m, mu, c, bits, o, gb, 64, 0, 0);
                else
                    rot_enc_tok8(r, ts, lay->dtype, m, mu, c, bits, o, gb, 32, 0, 0);
            }
    for (uint32_t t = t0; t < T; t++)
        for (uint32_t h = 0; h < H; h++) {
            const uint16_t *r = (const uint16_t *)rawk + ((uint64_t)t * H + h) * D;
            /* the layer's V slab, which its KIVI encoder reads next, into L2 under this
             * section's arithmetic: a row's worth of it per row */
            if (rawv)
                for (uint32_t j = 0; j < D; j += 32)
                    _mm_prefetch((const char *)(rawv + 2 * (((uint64_t)t * H + h) * D + j)),
                                 _MM_HINT_T1);
            const uint32_t *m = mask + (uint64_t)h * D;
            const float *mu = mean + (uint64_t)h * D;
            uint8_t *o = out + ((uint64_t)t * H + h) * G * gb;
            if (D == 128 && small) {
                rot_enc_row_regs(r, lay->dtype, m, mu, c, bits, gb, o, 16, 1, 1);
                continue;
            }
            if (D == 128 && clean) {
                rot_enc_row_regs(r, lay->dtype, m, mu, c, bits, gb, o, 16, 1, 0);
                continue;
            }
            if (D == 128) {
                rot_enc_row_regs(r, lay->dtype, m, mu, c, bits, gb, o, 16, 0, 0);
                continue;
            }
            if (D == 64) {
                rot_enc_row_regs(r, lay->dtype, m, mu, c, bits, gb, o, 8, 0, 0);
                continue;
            }
            if (D == 32) {
                rot_enc_row_regs(r, lay->dtype, m, mu, c, bits, gb, o, 4, 0, 0);
                continue;
            }
            for (uint32_t j = 0; j < D; j += 8)
                _mm256_store_ps(row + j, _mm256_xor_ps(_mm256_sub_ps(rot_load8(r + j, lay->dtype),
                                                                     _mm256_loadu_ps(mu + j)),
                                                       _mm256_loadu_ps((const float *)m + j)));
            rot_fwht_avx2(row, D);
            for (uint32_t g = 0; g < G; g++) {
                __m256 x[4];
                for (int j = 0; j < 4; j++)
                    x[j] = rot_sanitize(_mm256_mul_ps(_mm256_load_ps(row + 32 * g + 8 * j), c));
                rot_groups_enc(x, 1, o + (uint64_t)g * gb, gb, bits);
            }
        }
}

KT static void rot_dec_fused(const struct kern_layout *lay, const uint8_t *sect, int bits,
                             void *raw, uint32_t out_dtype, uint32_t *mask)
{
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim, G = D / KERN_GROUP;
    const uint32_t gb = kern_kivi_v_group_bytes(bits), sseed = kern_rot_get_seed(sect);
    const __m256 c = _mm256_set1_ps(kern_rot_scale(D));
    float row[KERN_ROT_MAX_DIM] __attribute__((aligned(32)));
    const uint8_t *in = sect + kern_rot_groups_off(lay), *means = kern_rot_means(sect);
    /* per head and channel: c with the channel's sign, and the mean as a float */
    float *csa = (float *)mask, *mfa = csa + (uint64_t)H * D;
    for (uint32_t h = 0; h < H; h++) {
        rot_signs(mask + (uint64_t)h * D, sseed, h, D);
        for (uint32_t j = 0; j < D; j += 8) {
            const uint64_t k = (uint64_t)h * D + j;
            _mm256_storeu_ps(csa + k, _mm256_xor_ps(c, _mm256_loadu_ps(csa + k)));
            _mm256_storeu_ps(mfa + k,
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(means + 2 * k))));
        }
    }
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < H; h++) {
            const uint8_t *g0 = in + ((uint64_t)t * H + h) * G * gb;
            const float *cs = csa + (uint64_t)h * D, *mf = mfa + (uint64_t)h * D;
            uint16_t *o = (uint16_t *)raw + ((uint64_t)t * H + h) * D;
            if (D == 128) {
                rot_dec_row_regs(g0, bits, gb, cs, mf, o, out_dtype, 16);
                continue;
            }
            if (D == 64) {
                rot_dec_row_regs(g0, bits, gb, cs, mf, o, out_dtype, 8);
                continue;
            }
            if (D == 32) {
                rot_dec_row_regs(g0, bits, gb, cs, mf, o, out_dtype, 4);
                continue;
            }
            for (uint32_t g = 0; g < G; g++) {
                __m256 y[4];
                rot_group_dec(g0 + (uint64_t)g * gb, y, bits);
                for (int j = 0; j < 4; j++)
                    _mm256_store_ps(row + 32 * g + 8 * j, y[j]);
            }
            rot_fwht_avx2(row, D);
            for (uint32_t j = 0; j < D; j += 8)
                rot_store8(
                    o + j,
                    _mm256_add_ps(_mm256_mul_ps(_mm256_load_ps(row + j), _mm256_loadu_ps(cs + j)),
                                  _mm256_loadu_ps(mf + j)),
                    out_dtype);
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
    memset(sect, 0, KERN_ROT_PREFIX);
    memcpy(sect, &sseed, 4);
    memset(sect + KERN_ROT_PREFIX, 0, kern_rot_mean_bytes(H, D));
    if (vec && D >= KERN_GROUP) {
        uint32_t *m = malloc(2 * (size_t)H * D * sizeof(uint32_t));
        if (!m)
            return -ENOMEM;
        rot_enc_fused(lay, c->rawk, c->rawv, sseed, codec == KERN_CODEC_ROT2 ? 2 : 4, sect, m);
        free(m);
        return 0;
    }
    float *x = malloc(2 * (size_t)T * D * sizeof(float) + D * sizeof(uint32_t));
    if (!x)
        return -ENOMEM;
    float *y = x + (size_t)T * D;
    uint32_t *mask = (uint32_t *)(y + (size_t)T * D);
    for (uint32_t h = 0; h < H; h++) {
        ops->load(c->rawk + 2ull * h * D, lay->dtype, (uint64_t)H * D, T, D, x);
        for (uint32_t d = 0; d < D; d++) {
            float mu = kern_rot_mean(lay, c->rawk, h, d);
            kern_put_h(sect + KERN_ROT_PREFIX + 2ull * ((uint64_t)h * D + d), mu);
            for (uint32_t t = 0; t < T; t++)
                x[(uint64_t)t * D + d] = KERN_SUB(x[(uint64_t)t * D + d], mu);
        }
        if (vec)
            rot_fwd_avx2(x, y, T, D, sseed, h, mask);
        else
            rot_fwd_ref(x, y, T, D, sseed, h);
        ops->enc(kivi, 1, y, lay, h, sect + kern_rot_groups_off(lay));
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
    if (vec && D >= KERN_GROUP) {
        uint32_t *m = malloc(2 * (size_t)H * D * sizeof(uint32_t));
        if (!m)
            return -ENOMEM;
        const int bits = codec == KERN_CODEC_ROT2 ? 2 : 4;
        if (!kern_rot512_on() ||
            !kern_rot512_dec(lay, sect, bits, raw, out_dtype, (float *)m, NULL, NULL))
            rot_dec_fused(lay, sect, bits, raw, out_dtype, m);
        free(m);
        return 0;
    }
    float *y = malloc((size_t)T * D * sizeof(float) + D * sizeof(uint32_t));
    if (!y)
        return -ENOMEM;
    uint32_t *mask = (uint32_t *)(y + (size_t)T * D);
    for (uint32_t h = 0; h < H; h++) {
        ops->dec(kivi, 1, sect + kern_rot_groups_off(lay), lay, h, y);
        if (vec)
            rot_inv_avx2(y, T, D, sseed, h, mask);
        else
            rot_inv_ref(y, T, D, sseed, h);
        for (uint32_t d = 0; d < D; d++) {
            float mu = kern_get_h(kern_rot_means(sect) + 2ull * ((uint64_t)h * D + d));
            for (uint32_t t = 0; t < T; t++)
                y[(uint64_t)t * D + d] = KERN_ADD(y[(uint64_t)t * D + d], mu);
        }
        ops->store(y, T, D, (uint8_t *)raw + 2ull * h * D, out_dtype, (uint64_t)H * D);
    }
    free(y);
    return 0;
}

int kern_rot_dec_kv(const struct kern_cpu_ops *ops, uint32_t codec, const struct kern_layout *lay,
                    const uint8_t *ksect, const uint8_t *vsect, void *rawk, void *rawv,
                    uint32_t out_dtype)
{
    const uint32_t H = lay->heads, D = lay->head_dim;
    if (ops == &kern_ref_ops || !kern_rot512_on() || (D != 32 && D != 64 && D != 128 && D != 256))
        return 0;
    uint32_t *m = malloc(2 * (size_t)H * D * sizeof(uint32_t));
    if (!m)
        return -ENOMEM;
    kern_rot512_dec(lay, ksect, codec == KERN_CODEC_ROT2 ? 2 : 4, rawk, out_dtype, (float *)m,
                    vsect, rawv);
    free(m);
    return 1;
}
