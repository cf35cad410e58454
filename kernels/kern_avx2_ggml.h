/*
 * kern_avx2_ggml.h — the ggml family's groups in AVX2 (q8_0, q4_1, q5_1): 32 values to a
 * block and back, four vectors at a time.
 *
 * DESIGN
 * The reference's float operations of kern_fmt.h, eight lanes at a time (see kern_avx2.c):
 * scales through F16C with the reference's rounding, roundf() emulated, a group extreme of
 * zero redone the reference's way (zero_extremes_fix), the reciprocal of kern_ggml_inv. The vector forms (..._enc32v,
 * ..._dec32v) are what the section walks inline; the array forms serve the per-slice path.
 */
#ifndef KVC_KERN_AVX2_GGML_H
#define KVC_KERN_AVX2_GGML_H

#include "kernels/kern_avx2.h"

/* F16C's scalar conversion: the same rounding as kern_put_h, without its branches. */
KT static inline void v_put_h(uint8_t *p, float x)
{
    uint16_t h = (uint16_t)_mm_extract_epi16(
        _mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 0);
    memcpy(p, &h, 2);
}

/* Not inlined: a call from each encode loop, as GCC compiled it when the codecs were one
 * file (inlined into enc_groups the loop grew by a third, for no gain measured). */
KT KERN_SOME __attribute__((noinline)) static void q8_0_enc32v(const __m256 v[4], uint8_t *blk)
{
    const __m256 sm = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sm, v[0]), _mm256_andnot_ps(sm, v[1])),
                             _mm256_max_ps(_mm256_andnot_ps(sm, v[2]), _mm256_andnot_ps(sm, v[3])));
    float d = v_hmax(m) / 127.0f;
    float id = kern_ggml_inv(d);
    v_put_h(blk, d);
    __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        q[i] = _mm256_cvttps_epi32(v_roundf_pre(_mm256_mul_ps(v[i], vid)));
    _mm256_storeu_si256((__m256i *)(blk + 2), v_pack_bytes(q[0], q[1], q[2], q[3], 1));
}

KT KERN_SOME static void q8_0_enc32(const float *x, uint8_t *blk)
{
    __m256 v[4];
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        v[i] = _mm256_loadu_ps(x + 8 * i);
    q8_0_enc32v(v, blk);
}

KT KERN_AI static inline void q8_0_dec32v(const uint8_t *blk, __m256 y[4])
{
    __m256 vd, vm_unused;
    v_dm(blk, &vd, &vm_unused);
    KERN_UNROLL
    for (int i = 0; i < 4; i++) {
        __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * i)));
        y[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(w), vd);
    }
}

KT KERN_SOME static void q8_0_dec32(const uint8_t *blk, float *y)
{
    __m256 v[4];
    q8_0_dec32v(blk, v);
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        _mm256_storeu_ps(y + 8 * i, v[i]);
}

/* The reference takes a group's min and max in element order, keeping the first of equal
 * values; a vector reduction may return either zero when both +0 and -0 are there. Only a
 * zero extreme can differ, so the group's extremes are redone in order when one is zero. */
KT KERN_SOME static void zero_extremes_fix(const float *x, float *mn, float *mx)
{
    float a = 3.402823466e38f, b = -3.402823466e38f;
    for (int j = 0; j < KERN_GROUP; j++) {
        a = x[j] < a ? x[j] : a;
        b = x[j] > b ? x[j] : b;
    }
    *mn = a;
    *mx = b;
}

KT static inline void qx_1_enc32v(const __m256 v[4], uint8_t *blk, int bits)
{
    __m256 mn, mx;
    mn = _mm256_min_ps(_mm256_min_ps(v[0], v[1]), _mm256_min_ps(v[2], v[3]));
    mx = _mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3]));
    float fmn = v_hmin(mn), fmx = v_hmax(mx);
    if (fmn == 0.0f || fmx == 0.0f) {
        float x[32];
        KERN_UNROLL
        for (int i = 0; i < 4; i++)
            _mm256_storeu_ps(x + 8 * i, v[i]);
        zero_extremes_fix(x, &fmn, &fmx);
    }
    int qmax = (1 << bits) - 1;
    float d = (fmx - fmn) / (float)qmax;
    float id = kern_ggml_inv(d);
    v_put_h(blk, d);
    v_put_h(blk + 2, fmn);
    __m256 vmn = _mm256_set1_ps(fmn), vid = _mm256_set1_ps(id), half = _mm256_set1_ps(0.5f);
    __m256i q[4];
    KERN_UNROLL
    for (int i = 0; i < 4; i++) {
        __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v[i], vmn), vid), half);
        q[i] = _mm256_min_epi32(_mm256_cvttps_epi32(t), _mm256_set1_epi32(qmax));
    }
    __m256i p = v_pack_bytes(q[0], q[1], q[2], q[3], 0);
    const __m128i lo4 = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(_mm256_castsi256_si128(p), lo4);
    __m128i hi = _mm_and_si128(_mm256_extracti128_si256(p, 1), lo4);
    __m128i qs = _mm_or_si128(lo, _mm_slli_epi16(hi, 4));
    if (bits == 5) {
        uint32_t qh = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(p, 3));
        memcpy(blk + 4, &qh, 4);
        _mm_storeu_si128((__m128i *)(blk + 8), qs);
    } else {
        _mm_storeu_si128((__m128i *)(blk + 4), qs);
    }
}

KT KERN_SOME static void qx_1_enc32(const float *x, uint8_t *blk, int bits)
{
    __m256 v[4];
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        v[i] = _mm256_loadu_ps(x + 8 * i);
    qx_1_enc32v(v, blk, bits);
}

KT KERN_AI static inline void qx_1_dec32v(const uint8_t *blk, __m256 y[4], int bits)
{
    __m256 vd, vm;
    v_dm(blk, &vd, &vm);
    __m128i qs = _mm_loadu_si128((const __m128i *)(blk + (bits == 5 ? 8 : 4)));
    const __m128i lo4 = _mm_set1_epi8(0x0f);
    __m256i e = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), lo4), _mm_and_si128(qs, lo4));
    if (bits == 5) {
        uint32_t qh;
        memcpy(&qh, blk + 4, 4);
        __m256i b =
            _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2,
                                                 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        b = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
        e = _mm256_or_si256(e, _mm256_and_si256(b, _mm256_set1_epi8(0x10)));
    }
    __m128i e0 = _mm256_castsi256_si128(e), e1 = _mm256_extracti128_si256(e, 1);
    __m128i part[4] = {e0, _mm_srli_si128(e0, 8), e1, _mm_srli_si128(e1, 8)};
    KERN_UNROLL
    for (int i = 0; i < 4; i++) {
        __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part[i]));
        y[i] = _mm256_add_ps(_mm256_mul_ps(f, vd), vm);
    }
}

KT KERN_SOME static void qx_1_dec32(const uint8_t *blk, float *y, int bits)
{
    __m256 v[4];
    qx_1_dec32v(blk, v, bits);
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        _mm256_storeu_ps(y + 8 * i, v[i]);
}

#endif
