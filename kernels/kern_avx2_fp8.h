/*
 * kern_avx2_fp8.h — the fp8 family in AVX2: E4M3 codes with one fp32 scale per head and
 * section.
 *
 * DESIGN
 * The E4M3 code of eight floats without a blend (v_e4m3_enc_abs(), its bounds argued
 * there), equal to kern_e4m3_enc() for every value a section can hold; decode through the
 * reference's kern_e4m3_dec().
 */
#ifndef KVC_KERN_AVX2_FP8_H
#define KVC_KERN_AVX2_FP8_H

#include "kernels/kern_avx2.h"

/* kern_e4m3_enc() of eight finite floats with |v| < 464, without a blend: the normal-range
 * code cn = round-to-nearest-even of the bits to 3 mantissa bits, rebiased (arithmetic shift,
 * so it goes negative below 2^-8), and the subnormal code cs = rint(|v| * 512), read off the
 * bits of |v| + 2^14 (whose ulp is 2^-9, so the float add rounds exactly like rint), capped
 * at 8. Below 2^-6 cn <= cs (cn rounds |v| on a grid no coarser than cs's and is smaller by
 * construction), from 2^-6 up cs = 8 <= cn, so the code is max(cn, cs). */
/* The code of v, 0 <= v < 464 (sign bit clear), without the sign and without the clamp to
 * 0x7e: the fp8 section codes divide |x| <= amax by scale = RN(amax / 448), so their
 * quotients stay below 448 * 1.004 (a few ulps above 448, or 0.34% when a bf16 amax near
 * its smallest subnormal makes the scale an fp32 subnormal), far below 464 where the clamp
 * would matter. */
KT static inline __m256i v_e4m3_enc_abs(__m256 v)
{
    __m256i a = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
    __m256i r =
        _mm256_add_epi32(_mm256_add_epi32(a, odd), _mm256_set1_epi32(0x7ffff - (120 << 23)));
    __m256i cn = _mm256_srai_epi32(r, 20);
    __m256 s = _mm256_add_ps(v, _mm256_set1_ps(16384.0f));
    __m256i cs = _mm256_sub_epi32(_mm256_castps_si256(s), _mm256_set1_epi32(0x46800000));
    cs = _mm256_min_epi32(cs, _mm256_set1_epi32(8));
    return _mm256_max_epi32(cn, cs);
}

KT static inline __m256i v_e4m3_enc(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
    __m256i r =
        _mm256_add_epi32(_mm256_add_epi32(a, odd), _mm256_set1_epi32(0x7ffff - (120 << 23)));
    __m256i cn = _mm256_min_epi32(_mm256_srai_epi32(r, 20), _mm256_set1_epi32(0x7e));
    __m256 s = _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(16384.0f));
    __m256i cs = _mm256_sub_epi32(_mm256_castps_si256(s), _mm256_set1_epi32(0x46800000));
    cs = _mm256_min_epi32(cs, _mm256_set1_epi32(8));
    return _mm256_or_si256(_mm256_max_epi32(cn, cs), sign);
}

KT KERN_SOME static void fp8_enc(const float *x, const struct kern_layout *lay, uint32_t h,
                                 uint8_t *sect)
{
    uint32_t dim = lay->head_dim, H = lay->heads;
    uint64_t n = (uint64_t)lay->tokens * dim, i = 0;
    const __m256 sm = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8)
        m = _mm256_max_ps(m, _mm256_andnot_ps(sm, _mm256_loadu_ps(x + i)));
    float amax = v_hmax(m);
    for (; i < n; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float scale = kern_fp8_scale(amax);
    memcpy(sect + 4 * h, &scale, 4);
    __m256 vs = _mm256_set1_ps(scale);
    for (uint32_t t = 0; t < lay->tokens; t++) {
        const float *xr = x + (uint64_t)t * dim;
        uint8_t *q = sect + 4 * H + ((uint64_t)t * H + h) * dim;
        uint32_t d = 0;
        for (; d + 8 <= dim; d += 8)
            v_store8b(q + d, v_e4m3_enc(_mm256_div_ps(_mm256_loadu_ps(xr + d), vs)));
        for (; d < dim; d++)
            q[d] = kern_e4m3_enc(xr[d] / scale);
    }
}

KT KERN_SOME static void fp8_dec(const uint8_t *sect, const struct kern_layout *lay, uint32_t h,
                                 float *y)
{
    uint32_t dim = lay->head_dim, H = lay->heads;
    float scale;
    memcpy(&scale, sect + 4 * h, 4);
    __m256 vs = _mm256_set1_ps(scale), p120 = _mm256_set1_ps(1.329227995784916e36f);
    for (uint32_t t = 0; t < lay->tokens; t++) {
        const uint8_t *q = sect + 4 * H + ((uint64_t)t * H + h) * dim;
        float *yr = y + (uint64_t)t * dim;
        uint32_t d = 0;
        for (; d + 8 <= dim; d += 8) {
            __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + d)));
            __m256i u = _mm256_or_si256(
                _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x7f)), 20),
                _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24));
            __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(u), p120);
            _mm256_storeu_ps(yr + d, _mm256_mul_ps(f, vs));
        }
        for (; d < dim; d++)
            yr[d] = kern_e4m3_dec(q[d]) * scale;
    }
}

#endif
