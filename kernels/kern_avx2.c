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
 * first of +0 and -0), a q8_0 group whose d is an fp32 subnormal, a section with a value
 * that needs sanitising (found by one unsigned max over the raw halves). Sections whose
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
#include <immintrin.h>
#include <string.h>

#include "kernels/kern_cpu.h"
#include "kernels/kern_fmt.h"

#define KT __attribute__((target("avx2,f16c")))
/* The decoders' second build, with FMA (see dec_sect_fma()). Nothing else has it: GCC
 * contracts a multiply and an add into an FMA wherever the target allows it. */
#define KTF __attribute__((target("avx2,f16c,fma")))
/* The short fixed loops over the four vectors of a group (or the eight groups of a chunk)
 * must become straight code with their arrays in registers; -O2 alone keeps some as loops
 * over stack arrays. */
#define KERN_UNROLL _Pragma("GCC unroll 8")
/* Small helpers of the decode loops must be inlined: called, their vectors go through the
 * stack (the profile showed the q4_1 decode loop waiting on those reloads). */
#define KERN_AI __attribute__((always_inline))

KT static inline __m256 v_sanitize(__m256 x)
{
    x = _mm256_and_ps(x, _mm256_cmp_ps(x, x, _CMP_ORD_Q));
    x = _mm256_min_ps(x, _mm256_set1_ps(KERN_FP16_MAX));
    return _mm256_max_ps(x, _mm256_set1_ps(-KERN_FP16_MAX));
}

KT static inline float v_hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

KT static inline float v_hmin(__m256 v)
{
    __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    m = _mm_min_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

KT static inline float v_hsum(__m256 v)
{
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* roundf(): half away from zero, exactly, for every finite x, as trunc(x + copysign(c, x))
 * with c = 0.5 - 2^-25, the largest float below 0.5: when frac(|x|) >= 0.5 the sum reaches
 * the next integer (at |x| < 1 the sum 1 - 2^-25 is a tie that rounds to the even 1.0), and
 * when frac(|x|) < 0.5 it stays at least one ulp of x below it, which no rounding of the
 * sum crosses. The truncation is the caller's cvttps. */
KT static inline __m256 v_roundf_pre(__m256 x)
{
    const __m256 c = _mm256_set1_ps(0.49999997f);
    return _mm256_add_ps(x, _mm256_or_ps(c, _mm256_and_ps(x, _mm256_set1_ps(-0.0f))));
}

/* Four vectors of int32 in [-128, 255] -> 32 bytes in element order. */
KT static inline __m256i v_pack_bytes(__m256i a, __m256i b, __m256i c, __m256i d, int sgn)
{
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i p = sgn ? _mm256_packs_epi16(ab, cd) : _mm256_packus_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Eight int32 in [0, 255] -> 8 bytes. */
KT static inline void v_store8b(uint8_t *dst, __m256i c)
{
    __m256i p = _mm256_packus_epi32(c, c);
    p = _mm256_packus_epi16(p, p);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
    _mm_storel_epi64((__m128i *)dst, _mm256_castsi256_si128(p));
}

/* ---- load, store, statistics --------------------------------------------------------- */

KT static inline __m256 v_load8(const uint16_t *r, uint32_t dtype)
{
    __m128i v = _mm_loadu_si128((const __m128i *)r);
    __m256 f = dtype == KERN_DTYPE_BF16
                   ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
                   : _mm256_cvtph_ps(v);
    return v_sanitize(f);
}

/* Eight floats as eight halves of dtype, rounded as kern_store() rounds them. */
KT KERN_AI static inline __m128i v_half8(__m256 v, uint32_t dtype)
{
    if (dtype == KERN_DTYPE_BF16) {
        __m256i u = _mm256_castps_si256(v);
        __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        __m256i rn = _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
        rn = _mm256_srli_epi32(rn, 16);
        __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
        __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        rn = _mm256_blendv_epi8(rn, nan, isnan);
        __m256i p = _mm256_packus_epi32(rn, rn);
        return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
    }
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

KT KERN_AI static inline void v_store8(uint16_t *r, __m256 v, uint32_t dtype)
{
    _mm_storeu_si128((__m128i *)r, v_half8(v, dtype));
}

/* Decode's stores into the raw rows: ordinary, or (nt) non-temporal, 16 bytes at a time, for
 * an output too large to stay in this core's caches (see avx_dec_sect()); r is then 16-byte
 * aligned. nt is a constant in every loop that calls these. */
KT KERN_AI static inline void v_st16(uint16_t *r, __m128i v, int nt)
{
    if (nt)
        _mm_stream_si128((__m128i *)r, v);
    else
        _mm_storeu_si128((__m128i *)r, v);
}

KT KERN_AI static inline void v_st32(uint16_t *r, __m256i v, int nt)
{
    if (nt) {
        _mm_stream_si128((__m128i *)r, _mm256_castsi256_si128(v));
        _mm_stream_si128((__m128i *)r + 1, _mm256_extracti128_si256(v, 1));
    } else {
        _mm256_storeu_si256((__m256i *)r, v);
    }
}

/* A group's leading fp16 pair (d and m; KIVI's scale and min) as two broadcast floats. */
KT KERN_AI static inline void v_dm(const uint8_t *blk, __m256 *vd, __m256 *vm)
{
    uint32_t w;
    memcpy(&w, blk, 4);
    __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)w));
    *vd = _mm256_broadcastss_ps(f);
    *vm = _mm256_broadcastss_ps(_mm_movehdup_ps(f));
}

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

KT static void avx_store(const float *y, uint32_t tokens, uint32_t dim, void *dst,
                         uint32_t dtype, uint64_t stride)
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

KT static void avx_stats(const float *x, uint32_t tokens, uint32_t dim, float *kmin,
                         float *kmax, float *knorm)
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

/* ---- ggml groups --------------------------------------------------------------------- */

/* F16C's scalar conversion: the same rounding as kern_put_h, without its branches. */
KT static inline void v_put_h(uint8_t *p, float x)
{
    uint16_t h = (uint16_t)_mm_extract_epi16(
        _mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 0);
    memcpy(p, &h, 2);
}

KT static inline void q8_0_enc32v(const __m256 v[4], uint8_t *blk)
{
    const __m256 sm = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sm, v[0]), _mm256_andnot_ps(sm, v[1])),
                             _mm256_max_ps(_mm256_andnot_ps(sm, v[2]), _mm256_andnot_ps(sm, v[3])));
    float d = v_hmax(m) / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (d != 0.0f && d < 1.17549435e-38f) {
        /* an fp32-subnormal d (bf16 input below ~1.5e-36) loses the bound |x / d| <= 127,
         * and the reference's out-of-range float-to-int8 conversions keep the low byte where
         * the vector pack would saturate: take the reference's code for such a group (its
         * stored d is fp16 0 either way) */
        float x[32];
        KERN_UNROLL
        for (int i = 0; i < 4; i++)
            _mm256_storeu_ps(x + 8 * i, v[i]);
        kern_q8_0_enc(x, KERN_GROUP, blk);
        return;
    }
    v_put_h(blk, d);
    __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        q[i] = _mm256_cvttps_epi32(v_roundf_pre(_mm256_mul_ps(v[i], vid)));
    _mm256_storeu_si256((__m256i *)(blk + 2), v_pack_bytes(q[0], q[1], q[2], q[3], 1));
}

KT static void q8_0_enc32(const float *x, uint8_t *blk)
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

KT static void q8_0_dec32(const uint8_t *blk, float *y)
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
KT static void zero_extremes_fix(const float *x, float *mn, float *mx)
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
    float id = d != 0.0f ? 1.0f / d : 0.0f;
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

KT static void qx_1_enc32(const float *x, uint8_t *blk, int bits)
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
        __m256i b = _mm256_shuffle_epi8(
            _mm256_set1_epi32((int)qh),
            _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2,
                             2, 3, 3, 3, 3, 3, 3, 3, 3));
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

KT static void qx_1_dec32(const uint8_t *blk, float *y, int bits)
{
    __m256 v[4];
    qx_1_dec32v(blk, v, bits);
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        _mm256_storeu_ps(y + 8 * i, v[i]);
}

/* ---- KIVI ---------------------------------------------------------------------------- */

/* kern_kivi_code() without its clamp, which v_kivi_pack32() applies to the bytes: the
 * truncating conversion of t = (x - mnf) * id + 0.5 equals floor(t) for t >= 0 and is 0 for
 * -1 < t < 0, and t stays far inside the int32 range, so clamping the truncation to
 * [0, qmax] (the byte pack saturates negatives to 0, then an unsigned byte min) gives the
 * reference's clamp(floor(t), 0, qmax). The bound: x >= mn and mnf = fp16(mn) is mn itself
 * unless |mn| < 2^-14 (a bf16 input below the fp16 normals), where |mn - mnf| <= 2^-25; id
 * is 0 or 1/scale with scale >= 2^-24 and (mx - mn) / scale <= 1.5 * qmax (fp16 rounding of
 * (mx - mn) / qmax), so -0.5 <= t <= 1.5 * qmax + 1. t is never NaN: x and mnf are finite
 * and 0 <= id <= 2^24. */
KT static inline __m256i v_kivi_code(__m256 x, __m256 mnf, __m256 id)
{
    __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(x, mnf), id), _mm256_set1_ps(0.5f));
    return _mm256_cvttps_epi32(t);
}

/* 32 codes from v_kivi_code() as bytes in element order (v_pack_bytes(), unsigned: negatives
 * already 0) -> clamped to qmax -> 4 * bits packed bytes: multiply-adds merge the neighbours
 * of each pair (and, 2-bit, of each pair of pairs) into one byte. */
KT static inline void v_kivi_pack32(__m256i p, int bits, uint8_t *dst)
{
    p = _mm256_min_epu8(p, _mm256_set1_epi8((char)((1 << bits) - 1)));
    if (bits == 4) {
        __m256i w = _mm256_maddubs_epi16(p, _mm256_set1_epi16(0x1001));
        w = _mm256_packus_epi16(w, w);
        w = _mm256_permute4x64_epi64(w, 0x08);
        _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(w));
    } else {
        __m256i w = _mm256_maddubs_epi16(p, _mm256_set1_epi16(0x0401));
        w = _mm256_madd_epi16(w, _mm256_set1_epi32(0x00100001));
        v_store8b(dst, w);
    }
}

/* Eight codes of a packed row starting at element e (a multiple of 8) as floats. */
KT KERN_AI static inline __m256 v_kivi_unpack8(const uint8_t *row, uint32_t e, int bits)
{
    __m256i v;
    if (bits == 4) {
        uint32_t w;
        memcpy(&w, row + e / 2, 4);
        v = _mm256_srlv_epi32(_mm256_set1_epi32((int)w),
                              _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
        v = _mm256_and_si256(v, _mm256_set1_epi32(0xf));
    } else {
        uint16_t w;
        memcpy(&w, row + e / 4, 2);
        v = _mm256_srlv_epi32(_mm256_set1_epi32(w), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
        v = _mm256_and_si256(v, _mm256_set1_epi32(3));
    }
    return _mm256_cvtepi32_ps(v);
}

KT static inline void kivi_v_enc32v(const __m256 v[4], uint8_t *blk, int bits)
{
    float mn = v_hmin(_mm256_min_ps(_mm256_min_ps(v[0], v[1]), _mm256_min_ps(v[2], v[3])));
    float mx = v_hmax(_mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3])));
    if (mn == 0.0f || mx == 0.0f) {
        float x[32];
        KERN_UNROLL
        for (int i = 0; i < 4; i++)
            _mm256_storeu_ps(x + 8 * i, v[i]);
        zero_extremes_fix(x, &mn, &mx);
    }
    uint16_t mn_h, sc_h;
    float mnf, id;
    kern_kivi_params(mn, mx, bits, &mn_h, &sc_h, &mnf, &id);
    memcpy(blk, &sc_h, 2);
    memcpy(blk + 2, &mn_h, 2);
    __m256 vm = _mm256_set1_ps(mnf), vid = _mm256_set1_ps(id);
    __m256i q[4];
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        q[i] = v_kivi_code(v[i], vm, vid);
    v_kivi_pack32(v_pack_bytes(q[0], q[1], q[2], q[3], 0), bits, blk + 4);
}

KT static void kivi_v_enc32(const float *x, uint8_t *blk, int bits)
{
    __m256 v[4];
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        v[i] = _mm256_loadu_ps(x + 8 * i);
    kivi_v_enc32v(v, blk, bits);
}

KT KERN_AI static inline void kivi_v_dec32v(const uint8_t *blk, __m256 y[4], int bits)
{
    __m256 sc, mn;
    v_dm(blk, &sc, &mn);
    KERN_UNROLL
    for (uint32_t i = 0; i < 4; i++) {
        __m256 f = v_kivi_unpack8(blk + 4, 8 * i, bits);
        y[i] = _mm256_add_ps(_mm256_mul_ps(f, sc), mn);
    }
}

KT static void kivi_v_dec32(const uint8_t *blk, float *y, int bits)
{
    __m256 v[4];
    kivi_v_dec32v(blk, v, bits);
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        _mm256_storeu_ps(y + 8 * i, v[i]);
}

KT static void kivi_k_enc(const float *x, const struct kern_layout *lay, uint32_t h,
                          uint8_t *sect, int bits)
{
    uint32_t dim = lay->head_dim, rb = kern_kivi_row_bytes(dim, bits);
    float mnf_a[KERN_MAX_HEAD_DIM], id_a[KERN_MAX_HEAD_DIM], qmax = (float)((1 << bits) - 1);
    uint8_t *g = sect + (uint64_t)h * kern_kivi_k_head_bytes(dim, lay->tokens, bits);
    for (uint32_t t0 = 0; t0 < lay->tokens; t0 += KERN_GROUP) {
        uint32_t rows = lay->tokens - t0 < KERN_GROUP ? lay->tokens - t0 : KERN_GROUP;
        uint32_t gb = kern_kivi_k_group_bytes(dim, rows, bits);
        const float *xg = x + (uint64_t)t0 * dim;
        uint8_t *codes = g + 4 * dim;
        uint32_t c = 0;
        for (; c + 8 <= dim; c += 8) {
            __m256 mn = _mm256_loadu_ps(xg + c), mx = mn;
            for (uint32_t r = 1; r < rows; r++) {
                __m256 v = _mm256_loadu_ps(xg + (uint64_t)r * dim + c);
                mn = _mm256_min_ps(v, mn); /* the earlier of equal values stays */
                mx = _mm256_max_ps(v, mx);
            }
            const int rne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            __m128i mn_h = _mm256_cvtps_ph(mn, rne);
            __m128i sc_h =
                _mm256_cvtps_ph(_mm256_div_ps(_mm256_sub_ps(mx, mn), _mm256_set1_ps(qmax)), rne);
            _mm_storeu_si128((__m128i *)(g + 2 * c), sc_h);
            _mm_storeu_si128((__m128i *)(g + 2 * dim + 2 * c), mn_h);
            __m256 sc = _mm256_cvtph_ps(sc_h);
            __m256 id = _mm256_div_ps(_mm256_set1_ps(1.0f), sc);
            id = _mm256_andnot_ps(_mm256_cmp_ps(sc, _mm256_setzero_ps(), _CMP_EQ_OQ), id);
            _mm256_storeu_ps(mnf_a + c, _mm256_cvtph_ps(mn_h));
            _mm256_storeu_ps(id_a + c, id);
        }
        for (; c < dim; c++) {
            float mn = xg[c], mx = mn;
            for (uint32_t r = 1; r < rows; r++) {
                float v = xg[(uint64_t)r * dim + c];
                mn = v < mn ? v : mn;
                mx = v > mx ? v : mx;
            }
            uint16_t mn_h, sc_h;
            kern_kivi_params(mn, mx, bits, &mn_h, &sc_h, &mnf_a[c], &id_a[c]);
            memcpy(g + 2 * c, &sc_h, 2);
            memcpy(g + 2 * dim + 2 * c, &mn_h, 2);
        }
        memset(codes + (uint64_t)rows * rb, 0, gb - 4 * dim - rows * rb);
        for (uint32_t r = 0; r < rows; r++) {
            const float *xr = xg + (uint64_t)r * dim;
            uint8_t *row = codes + (uint64_t)r * rb;
            c = 0;
            for (; c + 32 <= dim; c += 32) {
                __m256i q[4];
                KERN_UNROLL
                for (int i = 0; i < 4; i++)
                    q[i] = v_kivi_code(_mm256_loadu_ps(xr + c + 8 * i),
                                       _mm256_loadu_ps(mnf_a + c + 8 * i),
                                       _mm256_loadu_ps(id_a + c + 8 * i));
                v_kivi_pack32(v_pack_bytes(q[0], q[1], q[2], q[3], 0), bits, row + c * bits / 8);
            }
            if (c < dim)
                memset(row + c * bits / 8, 0, rb - c * bits / 8);
            for (; c < dim; c++) {
                uint32_t q = kern_kivi_code(xr[c], mnf_a[c], id_a[c], bits);
                if (bits == 4)
                    row[c >> 1] = (uint8_t)(row[c >> 1] | (q << ((c & 1) * 4)));
                else
                    row[c >> 2] = (uint8_t)(row[c >> 2] | (q << ((c & 3) * 2)));
            }
        }
        g += gb;
    }
}

KT static void kivi_k_dec(const uint8_t *sect, const struct kern_layout *lay, uint32_t h,
                          float *y, int bits)
{
    uint32_t dim = lay->head_dim, rb = kern_kivi_row_bytes(dim, bits);
    const uint8_t *g = sect + (uint64_t)h * kern_kivi_k_head_bytes(dim, lay->tokens, bits);
    for (uint32_t t0 = 0; t0 < lay->tokens; t0 += KERN_GROUP) {
        uint32_t rows = lay->tokens - t0 < KERN_GROUP ? lay->tokens - t0 : KERN_GROUP;
        for (uint32_t r = 0; r < rows; r++) {
            const uint8_t *row = g + 4 * dim + (uint64_t)r * rb;
            float *yr = y + (uint64_t)(t0 + r) * dim;
            uint32_t c = 0;
            for (; c + 8 <= dim; c += 8) {
                __m256 sc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 2 * c)));
                __m256 mn =
                    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 2 * dim + 2 * c)));
                __m256 f = v_kivi_unpack8(row, c, bits);
                _mm256_storeu_ps(yr + c, _mm256_add_ps(_mm256_mul_ps(f, sc), mn));
            }
            for (; c < dim; c++)
                yr[c] = kern_kivi_val(kern_kivi_get(row, c, bits), kern_get_h(g + 2 * c),
                                      kern_get_h(g + 2 * dim + 2 * c));
        }
        g += kern_kivi_k_group_bytes(dim, rows, bits);
    }
}

/* ---- fp8 ----------------------------------------------------------------------------- */

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
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(a, odd),
                                 _mm256_set1_epi32(0x7ffff - (120 << 23)));
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
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(a, odd),
                                 _mm256_set1_epi32(0x7ffff - (120 << 23)));
    __m256i cn = _mm256_min_epi32(_mm256_srai_epi32(r, 20), _mm256_set1_epi32(0x7e));
    __m256 s = _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(16384.0f));
    __m256i cs = _mm256_sub_epi32(_mm256_castps_si256(s), _mm256_set1_epi32(0x46800000));
    cs = _mm256_min_epi32(cs, _mm256_set1_epi32(8));
    return _mm256_or_si256(_mm256_max_epi32(cn, cs), sign);
}

KT static void fp8_enc(const float *x, const struct kern_layout *lay, uint32_t h, uint8_t *sect)
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

KT static void fp8_dec(const uint8_t *sect, const struct kern_layout *lay, uint32_t h, float *y)
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

/* ---- decode straight into the raw rows ---------------------------------------------- */

/* A group of 32 values with 2^b codes (b <= 4) has at most 16 distinct outputs: they are
 * computed once per group, with the reference's operations (q * d, then + m, then the
 * rounding to the output dtype), and every value is then a byte-table lookup (vpshufb) of its
 * output's low and high byte. That replaces the per-value widen, convert, multiply, add and
 * rounding by two shuffles and an interleave, and gives the same halves by construction. */

/* The halves of out(q * d + m) for q = 0..15 split into a low-byte and a high-byte table of
 * 16 entries each, repeated in both lanes (vpshufb looks up within a lane). */
KT KERN_AI static inline void v_tab16(__m256 vd, __m256 vm, uint32_t out, __m256i *lo,
                                      __m256i *hi)
{
    const __m256 q0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 q1 = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    __m128i h0 = v_half8(_mm256_add_ps(_mm256_mul_ps(q0, vd), vm), out);
    __m128i h1 = v_half8(_mm256_add_ps(_mm256_mul_ps(q1, vd), vm), out);
    __m256i x = _mm256_shuffle_epi8(_mm256_set_m128i(h1, h0), split);
    *lo = _mm256_permute4x64_epi64(x, 0x88);
    *hi = _mm256_permute4x64_epi64(x, 0xdd);
}

/* 32 codes (lane 0: elements 0-15, lane 1: elements 16-31; each < 16) through the tables
 * into the 32 halves at r. */
KT KERN_AI static inline void v_lut32(uint16_t *r, __m256i idx, __m256i lo, __m256i hi, int nt)
{
    __m256i l = _mm256_shuffle_epi8(lo, idx), h = _mm256_shuffle_epi8(hi, idx);
    __m256i u0 = _mm256_unpacklo_epi8(l, h), u1 = _mm256_unpackhi_epi8(l, h);
    v_st32(r, _mm256_permute2x128_si256(u0, u1, 0x20), nt);
    v_st32(r + 16, _mm256_permute2x128_si256(u0, u1, 0x31), nt);
}

/* q4_1: element j is the low nibble of qs[j], element j + 16 its high nibble. */
KT KERN_AI static inline void q4_1_dec32_to(const uint8_t *blk, uint16_t *r, uint32_t out,
                                                        int nt)
{
    __m256 vd, vm;
    __m256i lo, hi;
    v_dm(blk, &vd, &vm);
    v_tab16(vd, vm, out, &lo, &hi);
    __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 4));
    __m256i idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs),
                                   _mm256_set1_epi8(0x0f));
    v_lut32(r, idx, lo, hi, nt);
}

/* KIVI-4 values: byte i holds element 2i (low nibble) and 2i + 1 (high nibble). */
KT KERN_AI static inline void kivi4_v_dec32_to(const uint8_t *blk, uint16_t *r, uint32_t out,
                                                           int nt)
{
    __m256 vd, vm;
    __m256i lo, hi;
    v_dm(blk, &vd, &vm);
    v_tab16(vd, vm, out, &lo, &hi);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i c = _mm_loadu_si128((const __m128i *)(blk + 4));
    __m128i e = _mm_and_si128(c, m4), o = _mm_and_si128(_mm_srli_epi16(c, 4), m4);
    v_lut32(r, _mm256_set_m128i(_mm_unpackhi_epi8(e, o), _mm_unpacklo_epi8(e, o)), lo, hi, nt);
}

/* KIVI-2 values: byte i holds elements 4i..4i+3 at bits 0-1, 2-3, 4-5, 6-7. The codes are
 * not shifted down: element 4i + 1 (4i + 3) is looked up as (byte & 0x0c), that is 4 * code,
 * and the table holds output q at entries q and 4q. Bytes and their high nibbles are first
 * interleaved, so one shuffle places each element's byte. */
KT KERN_AI static inline void kivi2_v_dec32_to(const uint8_t *blk, uint16_t *r, uint32_t out,
                                                           int nt)
{
    const __m256 q0 = _mm256_setr_ps(0, 1, 2, 3, 0, 0, 0, 0);
    const __m256i tlo = _mm256_setr_epi8(0, 2, 4, 6, 2, 0, 0, 0, 4, 0, 0, 0, 6, 0, 0, 0,
                                         0, 2, 4, 6, 2, 0, 0, 0, 4, 0, 0, 0, 6, 0, 0, 0);
    const __m256i place = _mm256_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7,
                                           8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14,
                                           15, 15);
    const __m256i mask = _mm256_set1_epi16(0x0c03);
    __m256 vd, vm;
    v_dm(blk, &vd, &vm);
    __m128i h = v_half8(_mm256_add_ps(_mm256_mul_ps(q0, vd), vm), out);
    __m256i hh = _mm256_broadcastsi128_si256(h);
    __m256i lo = _mm256_shuffle_epi8(hh, tlo);
    __m256i hi = _mm256_shuffle_epi8(hh, _mm256_add_epi8(tlo, _mm256_set1_epi8(1)));
    __m128i c = _mm_loadl_epi64((const __m128i *)(blk + 4));
    __m128i x = _mm_unpacklo_epi8(c, _mm_srli_epi16(c, 4)); /* b0, b0 >> 4, b1, ... */
    __m256i idx = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(x), place),
                                   mask);
    v_lut32(r, idx, lo, hi, nt);
}

/* Two consecutive groups of q4_1 or KIVI-4 values (blk and blk + gb into r and r + 32) share
 * their table work: the 32 outputs of both are rounded by four conversions, and both groups'
 * tables sit in one register, group A in the low lane and group B in the high lane, which is
 * how vpshufb looks up anyway; the codes of A and B are split together. The same operations
 * per value as the one-group form, so the same halves. */
KT KERN_AI static inline void tab16_dec2x32_to(uint32_t codec, const uint8_t *blk, uint32_t gb,
                                               uint16_t *r, uint32_t out, int nt)
{
    const __m256 q0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 q1 = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    uint32_t wa, wb;
    memcpy(&wa, blk, 4);
    memcpy(&wb, blk + gb, 4);
    __m128 f = _mm_cvtph_ps(
        _mm_unpacklo_epi32(_mm_cvtsi32_si128((int)wa), _mm_cvtsi32_si128((int)wb)));
    __m256 da = _mm256_broadcastss_ps(f), ma = _mm256_broadcastss_ps(_mm_movehdup_ps(f));
    __m128 fb = _mm_movehl_ps(f, f);
    __m256 db = _mm256_broadcastss_ps(fb), mb = _mm256_broadcastss_ps(_mm_movehdup_ps(fb));
    /* lane 0: group A's outputs, lane 1: group B's; 0-7 in x0, 8-15 in x1 */
    __m256i x0 = _mm256_set_m128i(v_half8(_mm256_add_ps(_mm256_mul_ps(q0, db), mb), out),
                                  v_half8(_mm256_add_ps(_mm256_mul_ps(q0, da), ma), out));
    __m256i x1 = _mm256_set_m128i(v_half8(_mm256_add_ps(_mm256_mul_ps(q1, db), mb), out),
                                  v_half8(_mm256_add_ps(_mm256_mul_ps(q1, da), ma), out));
    x0 = _mm256_shuffle_epi8(x0, split); /* per lane: low bytes of 0-7, high bytes of 0-7 */
    x1 = _mm256_shuffle_epi8(x1, split);
    __m256i lo = _mm256_unpacklo_epi64(x0, x1), hi = _mm256_unpackhi_epi64(x0, x1);
    /* codes: idx[0] holds elements 0-15 of A (lane 0) and of B (lane 1), idx[1] 16-31 */
    __m256i c = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(blk + gb + 4)),
                                 _mm_loadu_si128((const __m128i *)(blk + 4)));
    __m256i idx[2];
    if (codec == KERN_CODEC_Q4_1) { /* element j: low nibble of byte j, j + 16: its high */
        idx[0] = _mm256_and_si256(c, lo4);
        idx[1] = _mm256_and_si256(_mm256_srli_epi16(c, 4), lo4);
    } else { /* KIVI-4: byte i holds elements 2i (low nibble) and 2i + 1 */
        __m256i e = _mm256_and_si256(c, lo4), o = _mm256_and_si256(_mm256_srli_epi16(c, 4), lo4);
        idx[0] = _mm256_unpacklo_epi8(e, o);
        idx[1] = _mm256_unpackhi_epi8(e, o);
    }
    KERN_UNROLL
    for (int k = 0; k < 2; k++) {
        __m256i l = _mm256_shuffle_epi8(lo, idx[k]), h = _mm256_shuffle_epi8(hi, idx[k]);
        __m256i u0 = _mm256_unpacklo_epi8(l, h), u1 = _mm256_unpackhi_epi8(l, h);
        v_st32(r + 16 * k, _mm256_permute2x128_si256(u0, u1, 0x20), nt);
        v_st32(r + 32 + 16 * k, _mm256_permute2x128_si256(u0, u1, 0x31), nt);
    }
}

/* q5_1 has 32 outputs per group, as many as values: computed directly. */
KT KERN_AI static inline void q5_1_dec32_to(const uint8_t *blk, uint16_t *r, uint32_t out,
                                                        int nt)
{
    __m256 y[4];
    qx_1_dec32v(blk, y, 5);
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        v_st16(r + 8 * i, v_half8(y[i], out), nt);
}

KT KERN_AI static inline void q8_0_dec32_to(const uint8_t *blk, uint16_t *r, uint32_t out,
                                                        int nt)
{
    __m256 y[4];
    q8_0_dec32v(blk, y);
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        v_st16(r + 8 * i, v_half8(y[i], out), nt);
}

/* A full group of a row-wise codec into its 32 raw halves. */
KT KERN_AI static inline void dec32_to(uint32_t codec, int bits, const uint8_t *blk,
                                       uint16_t *r, uint32_t out, int nt)
{
    if (bits == 4)
        kivi4_v_dec32_to(blk, r, out, nt);
    else if (bits == 2)
        kivi2_v_dec32_to(blk, r, out, nt);
    else if (codec == KERN_CODEC_Q8_0)
        q8_0_dec32_to(blk, r, out, nt);
    else if (codec == KERN_CODEC_Q5_1)
        q5_1_dec32_to(blk, r, out, nt);
    else
        q4_1_dec32_to(blk, r, out, nt);
}

/* ---- per-slice dispatch -------------------------------------------------------------- */

static uint32_t block_bytes(uint32_t codec, int bits)
{
    if (bits)
        return kern_kivi_v_group_bytes(bits);
    return codec == KERN_CODEC_Q8_0 ? 34 : codec == KERN_CODEC_Q4_1 ? 20 : 24;
}

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

KT static void avx_dec(uint32_t codec, int is_v, const uint8_t *sect,
                       const struct kern_layout *lay, uint32_t h, float *y)
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
KT static int avx_enc_raw(uint32_t codec, int is_v, const void *raw,
                          const struct kern_layout *lay, uint32_t h, uint8_t *sect)
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

/* ---- whole sections in memory order ------------------------------------------------- */

/* A section's raw rows [T][H][D] and, for row-wise codecs, its encoded groups [T][H][G] are
 * both in (token, head) order, so walking the section once front to back streams both; the
 * per-head walks above jump by H * D elements per token, which the hardware prefetcher
 * follows badly (the profile showed most of the encode time stalled on those loads). These
 * take D % 32 == 0 (every head size in use: 64, 96, 128, 256, 576); other shapes return 0
 * and go per head. */

/* Key statistics of one sanitised row of head h: min/max per channel, the row's L2 norm
 * added to knorm[h]. */
KT static inline void v_stat8(__m256 v, float *kmin, float *kmax, __m256 *ss)
{
    _mm256_storeu_ps(kmin, _mm256_min_ps(v, _mm256_loadu_ps(kmin)));
    _mm256_storeu_ps(kmax, _mm256_max_ps(v, _mm256_loadu_ps(kmax)));
    *ss = _mm256_add_ps(*ss, _mm256_mul_ps(v, v));
}

KT static void stats_init(const struct kern_layout *lay, float *kmin, float *kmax, float *knorm)
{
    uint64_t n = (uint64_t)lay->heads * lay->head_dim, i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(kmin + i, _mm256_set1_ps(3.402823466e38f));
        _mm256_storeu_ps(kmax + i, _mm256_set1_ps(-3.402823466e38f));
    }
    for (; i < n; i++) {
        kmin[i] = 3.402823466e38f;
        kmax[i] = -3.402823466e38f;
    }
    for (uint32_t h = 0; h < lay->heads; h++)
        knorm[h] = 0.0f;
}

KT static void stats_done(const struct kern_layout *lay, float *knorm)
{
    for (uint32_t h = 0; h < lay->heads; h++)
        knorm[h] = knorm[h] / (float)lay->tokens;
}

/* Lane i of the result is the max (min) over the eight lanes of m[i]. */
#define V_REDUCE8(OP, m, out)                                                                  \
    do {                                                                                       \
        __m256 t0_ = OP(_mm256_unpacklo_ps(m[0], m[1]), _mm256_unpackhi_ps(m[0], m[1]));      \
        __m256 t1_ = OP(_mm256_unpacklo_ps(m[2], m[3]), _mm256_unpackhi_ps(m[2], m[3]));      \
        __m256 t2_ = OP(_mm256_unpacklo_ps(m[4], m[5]), _mm256_unpackhi_ps(m[4], m[5]));      \
        __m256 t3_ = OP(_mm256_unpacklo_ps(m[6], m[7]), _mm256_unpackhi_ps(m[6], m[7]));      \
        __m256 u0_ = OP(_mm256_shuffle_ps(t0_, t1_, 0x44), _mm256_shuffle_ps(t0_, t1_, 0xee)); \
        __m256 u1_ = OP(_mm256_shuffle_ps(t2_, t3_, 0x44), _mm256_shuffle_ps(t2_, t3_, 0xee)); \
        out = OP(_mm256_permute2f128_ps(u0_, u1_, 0x20), _mm256_permute2f128_ps(u0_, u1_, 0x31)); \
    } while (0)

/* Whether any of the 256 raw values at r needs sanitising: NaN or Inf (fp16), or a
 * magnitude past the fp16 range (bf16). An unsigned max of the raw halves without their
 * sign, 16 at a time (their order is that of the magnitudes, NaN above Inf), then one
 * compare. */
KT static inline int v_needs_sanitize(const uint16_t *r, uint32_t n, uint32_t dtype)
{
    const __m256i abs = _mm256_set1_epi16(0x7fff);
    const __m256i lim = _mm256_set1_epi16(dtype == KERN_DTYPE_BF16 ? 0x477f : 0x7bff);
    __m256i acc = _mm256_setzero_si256();
    for (uint32_t i = 0; i < n / 16; i++) {
        __m256i v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(r + 16 * i)), abs);
        acc = _mm256_max_epu16(acc, v);
    }
    acc = _mm256_cmpgt_epi16(acc, lim); /* acc <= 0x7fff: the signed compare is right */
    return !_mm256_testz_si256(acc, acc);
}

KT static inline int v_needs_sanitize256(const uint16_t *r, uint32_t dtype)
{
    return v_needs_sanitize(r, 256, dtype);
}

KT static inline __m256 v_load8_fast(const uint16_t *r, uint32_t dtype)
{
    __m128i v = _mm_loadu_si128((const __m128i *)r);
    return dtype == KERN_DTYPE_BF16
               ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
               : _mm256_cvtph_ps(v);
}

/* Eight consecutive 32-value groups (256 raw values) of a row-wise codec: the group scalars
 * (amax or min/max, then d, 1/d and their fp16 forms) are computed for the eight groups in
 * one vector, so each division is done once per eight groups and no horizontal reduction
 * stands between a group's load and its codes. The arithmetic per lane is the reference's.
 * The values come from the raw halves r, or (fsrc, a constant after inlining) from the
 * sanitised floats xf of the statistics pass (stats_enc_rows()). */
KT __attribute__((always_inline)) static inline void enc8_groups(uint32_t codec, int bits,
                                                                  const uint16_t *r,
                                                                  uint32_t dtype, uint8_t *blk,
                                                                  uint32_t gb, uint64_t ahead,
                                                                  const float *xf, int fsrc)
{
    const int rne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m256 sm = _mm256_set1_ps(-0.0f);
    __attribute__((aligned(32))) float buf_[256], idv[8], mnv[8];
    float *buf = fsrc ? (float *)xf : buf_;
    __m256 ma[8], mi[8], vmx, vmn;
    int san = fsrc ? 0 : v_needs_sanitize256(r, dtype);
    if (!fsrc) {
        KERN_UNROLL
        for (int i = 0; i < 8; i++)
            _mm_prefetch((const char *)(r + ahead + 32 * i), _MM_HINT_T1);
    }
    KERN_UNROLL
    for (int g = 0; g < 8; g++) {
        __m256 v[4];
        KERN_UNROLL
        for (int i = 0; i < 4; i++) {
            if (fsrc) {
                v[i] = _mm256_loadu_ps(xf + 32 * g + 8 * i);
                continue;
            }
            v[i] = san ? v_load8(r + 32 * g + 8 * i, dtype) : v_load8_fast(r + 32 * g + 8 * i, dtype);
            _mm256_store_ps(buf + 32 * g + 8 * i, v[i]);
        }
        if (codec == KERN_CODEC_Q8_0) {
            ma[g] = _mm256_max_ps(
                _mm256_max_ps(_mm256_andnot_ps(sm, v[0]), _mm256_andnot_ps(sm, v[1])),
                _mm256_max_ps(_mm256_andnot_ps(sm, v[2]), _mm256_andnot_ps(sm, v[3])));
        } else {
            ma[g] = _mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3]));
            mi[g] = _mm256_min_ps(_mm256_min_ps(v[0], v[1]), _mm256_min_ps(v[2], v[3]));
        }
    }
    V_REDUCE8(_mm256_max_ps, ma, vmx);
    __m256 d, id, zero = _mm256_setzero_ps();
    __m128i dh, mh = _mm_setzero_si128();
    if (codec == KERN_CODEC_Q8_0) {
        d = _mm256_div_ps(vmx, _mm256_set1_ps(127.0f));
        dh = _mm256_cvtps_ph(d, rne);
    } else {
        V_REDUCE8(_mm256_min_ps, mi, vmn);
        int zx = _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(vmn, zero, _CMP_EQ_OQ),
                                                   _mm256_cmp_ps(vmx, zero, _CMP_EQ_OQ)));
        if (__builtin_expect(zx != 0, 0)) {
            __attribute__((aligned(32))) float a[8], b[8];
            _mm256_store_ps(a, vmn);
            _mm256_store_ps(b, vmx);
            for (int g = 0; g < 8; g++)
                if (zx & (1 << g))
                    zero_extremes_fix(buf + 32 * g, &a[g], &b[g]);
            vmn = _mm256_load_ps(a);
            vmx = _mm256_load_ps(b);
        }
        float qmax = (float)((1 << (bits ? bits : codec == KERN_CODEC_Q5_1 ? 5 : 4)) - 1);
        d = _mm256_div_ps(_mm256_sub_ps(vmx, vmn), _mm256_set1_ps(qmax));
        dh = _mm256_cvtps_ph(d, rne);
        mh = _mm256_cvtps_ph(vmn, rne);
        if (bits) { /* KIVI: codes use the fp16-rounded scale and min */
            d = _mm256_cvtph_ps(dh);
            vmn = _mm256_cvtph_ps(mh);
        }
        _mm256_store_ps(mnv, vmn);
    }
    id = _mm256_div_ps(_mm256_set1_ps(1.0f), d);
    id = _mm256_andnot_ps(_mm256_cmp_ps(d, zero, _CMP_EQ_OQ), id);
    _mm256_store_ps(idv, id);
    __attribute__((aligned(16))) uint16_t dhs[8], mhs[8];
    _mm_store_si128((__m128i *)dhs, dh);
    _mm_store_si128((__m128i *)mhs, mh);
    int tiny = 0;
    uint8_t *blk0 = blk;
    if (!bits) /* q8_0, q4_1, q5_1: see q8_0_enc32v(), and the q4_1/q5_1 codes below */
        tiny = _mm256_movemask_ps(_mm256_and_ps(
            _mm256_cmp_ps(d, _mm256_set1_ps(1.17549435e-38f), _CMP_LT_OQ),
            _mm256_cmp_ps(d, zero, _CMP_NEQ_OQ)));
    for (int g = 0; g < 8; g++, blk += gb) {
        __m256 vid = _mm256_broadcast_ss(idv + g);
        const float *x = buf + 32 * g;
        __m256i q[4];
        if (codec == KERN_CODEC_Q8_0) {
            memcpy(blk, dhs + g, 2);
            KERN_UNROLL
            for (int i = 0; i < 4; i++)
                q[i] = _mm256_cvttps_epi32(
                    v_roundf_pre(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), vid)));
            _mm256_storeu_si256((__m256i *)(blk + 2), v_pack_bytes(q[0], q[1], q[2], q[3], 1));
            continue;
        }
        __m256 vm = _mm256_broadcast_ss(mnv + g);
        if (bits) {
            memcpy(blk, dhs + g, 2);
            memcpy(blk + 2, mhs + g, 2);
            KERN_UNROLL
            for (int i = 0; i < 4; i++)
                q[i] = v_kivi_code(_mm256_loadu_ps(x + 8 * i), vm, vid);
            v_kivi_pack32(v_pack_bytes(q[0], q[1], q[2], q[3], 0), bits, blk + 4);
            continue;
        }
        int b = codec == KERN_CODEC_Q5_1 ? 5 : 4;
        memcpy(blk, dhs + g, 2);
        memcpy(blk + 2, mhs + g, 2);
        /* No clamp to qmax: with a normal fp32 d, (x - mn) * (1 / d) + 0.5 stays below
         * qmax + 1 (a few ulps over qmax + 0.5), so the truncation never exceeds qmax, and
         * x - mn >= 0; a group with a subnormal d takes the reference's code below. */
        KERN_UNROLL
        for (int i = 0; i < 4; i++)
            q[i] = _mm256_cvttps_epi32(_mm256_add_ps(
                _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + 8 * i), vm), vid),
                _mm256_set1_ps(0.5f)));
        __m256i p = v_pack_bytes(q[0], q[1], q[2], q[3], 0);
        __m128i lo = _mm256_castsi256_si128(p), hi = _mm256_extracti128_si256(p, 1);
        if (b == 5) { /* bit 4 goes to qh, not into the nibbles */
            lo = _mm_and_si128(lo, _mm_set1_epi8(0x0f));
            hi = _mm_and_si128(hi, _mm_set1_epi8(0x0f));
        }
        __m128i qs = _mm_or_si128(lo, _mm_slli_epi16(hi, 4));
        if (b == 5) {
            uint32_t qh = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(p, 3));
            memcpy(blk + 4, &qh, 4);
            _mm_storeu_si128((__m128i *)(blk + 8), qs);
        } else {
            _mm_storeu_si128((__m128i *)(blk + 4), qs);
        }
    }
    for (int g = 0; tiny && g < 8; g++) {
        if (!(tiny & (1 << g)))
            continue;
        if (codec == KERN_CODEC_Q8_0)
            kern_q8_0_enc(buf + 32 * g, KERN_GROUP, blk0 + g * gb);
        else
            kern_qx_1_enc(buf + 32 * g, KERN_GROUP, blk0 + g * gb,
                          codec == KERN_CODEC_Q5_1 ? 5 : 4);
    }
}

/* n consecutive full groups of one row-wise codec, eight at a time. */
KT static void enc_groups(uint32_t codec, int bits, const uint16_t *r, uint32_t dtype,
                          uint64_t n, uint8_t *blk)
{
    uint32_t gb = block_bytes(codec, bits);
    uint64_t i = 0;
    /* enc8_groups is inlined into one loop per (codec, dtype), so the compiler drops every
     * per-vector branch on them. */
#define ENC_GROUPS_LOOP(C, B, D)                                                               \
    for (; i + 8 <= n; i += 8, r += 256, blk += 8 * gb)                                        \
        enc8_groups(C, B, r, D, blk, gb, 32 * n, NULL, 0)
#define ENC_GROUPS_DTYPE(C, B)                                                                 \
    do {                                                                                       \
        if (dtype == KERN_DTYPE_BF16)                                                          \
            ENC_GROUPS_LOOP(C, B, KERN_DTYPE_BF16);                                            \
        else                                                                                   \
            ENC_GROUPS_LOOP(C, B, KERN_DTYPE_FP16);                                            \
    } while (0)
    if (codec == KERN_CODEC_Q8_0)
        ENC_GROUPS_DTYPE(KERN_CODEC_Q8_0, 0);
    else if (codec == KERN_CODEC_Q4_1)
        ENC_GROUPS_DTYPE(KERN_CODEC_Q4_1, 0);
    else if (codec == KERN_CODEC_Q5_1)
        ENC_GROUPS_DTYPE(KERN_CODEC_Q5_1, 0);
    else if (bits == 4)
        ENC_GROUPS_DTYPE(codec, 4);
    else
        ENC_GROUPS_DTYPE(codec, 2);
#undef ENC_GROUPS_DTYPE
#undef ENC_GROUPS_LOOP
    for (; i < n; i++, r += 32, blk += gb) {
        __m256 v[4];
        KERN_UNROLL
        for (int j = 0; j < 4; j++)
            v[j] = v_load8(r + 8 * j, dtype);
        if (bits)
            kivi_v_enc32v(v, blk, bits);
        else if (codec == KERN_CODEC_Q8_0)
            q8_0_enc32v(v, blk);
        else
            qx_1_enc32v(v, blk, codec == KERN_CODEC_Q5_1 ? 5 : 4);
    }
}

/* n consecutive full groups of q8_0, q4_1 or q5_1 from sanitised floats, eight at a time. */
KT static void enc_groups_f(uint32_t codec, const float *xf, uint64_t n, uint8_t *blk)
{
    uint32_t gb = block_bytes(codec, 0);
    uint64_t i = 0;
#define ENC_GROUPS_F_LOOP(C)                                                                   \
    for (; i + 8 <= n; i += 8, xf += 256, blk += 8 * gb)                                       \
        enc8_groups(C, 0, NULL, KERN_DTYPE_FP16, blk, gb, 0, xf, 1)
    if (codec == KERN_CODEC_Q8_0)
        ENC_GROUPS_F_LOOP(KERN_CODEC_Q8_0);
    else if (codec == KERN_CODEC_Q4_1)
        ENC_GROUPS_F_LOOP(KERN_CODEC_Q4_1);
    else
        ENC_GROUPS_F_LOOP(KERN_CODEC_Q5_1);
#undef ENC_GROUPS_F_LOOP
    for (; i < n; i++, xf += 32, blk += gb) {
        __m256 v[4];
        KERN_UNROLL
        for (int j = 0; j < 4; j++)
            v[j] = _mm256_loadu_ps(xf + 8 * j);
        if (codec == KERN_CODEC_Q8_0)
            q8_0_enc32v(v, blk);
        else
            qx_1_enc32v(v, blk, codec == KERN_CODEC_Q5_1 ? 5 : 4);
    }
}

/* The codes of an fp8 section (no value needs sanitising), one loop per dtype. The sign
 * of each code is bit 15 of the raw value (the division by a positive scale keeps it), so
 * the codes are made from |x| and the signs are packed straight from the raw high bytes. */
KT __attribute__((always_inline)) static inline void
fp8_codes(const uint16_t *raw, const struct kern_layout *lay, uint8_t *sect, const float *scale,
          uint32_t dtype, int st, float *kmin, float *kmax, float *knorm)
{
    uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens;
    const uint16_t *r = raw;
    uint8_t *q = sect + 4 * H;
    uint64_t next = (uint64_t)T * H * D;
    const __m256 sm = _mm256_set1_ps(-0.0f);
    for (uint32_t t = 0; t < T; t++) {
        for (uint32_t h = 0; h < H; h++, r += D, q += D) {
            __m256 vs = _mm256_set1_ps(scale[h]), ss = _mm256_setzero_ps();
            for (uint32_t c = 0; c < D; c += 32) {
                __m256i e[4];
                __m256 v[4];
                /* the next section into L2 while this one is coded */
                _mm_prefetch((const char *)(r + next + c), _MM_HINT_T1);
                KERN_UNROLL
                for (int i = 0; i < 4; i++) {
                    v[i] = v_load8_fast(r + c + 8 * i, dtype);
                    e[i] = v_e4m3_enc_abs(_mm256_div_ps(_mm256_andnot_ps(sm, v[i]), vs));
                }
                if (st) {
                    /* key statistics from the same registers, in stats_rows()' order: the
                     * new value first in min/max, the row's squares summed per 32 channels */
                    float *mn = kmin + (uint64_t)h * D + c, *mx = kmax + (uint64_t)h * D + c;
                    KERN_UNROLL
                    for (int i = 0; i < 4; i++) {
                        __m256 a = _mm256_loadu_ps(mn + 8 * i), b = _mm256_loadu_ps(mx + 8 * i);
                        _mm256_storeu_ps(mn + 8 * i, _mm256_min_ps(v[i], a));
                        _mm256_storeu_ps(mx + 8 * i, _mm256_max_ps(v[i], b));
                    }
                    ss = _mm256_add_ps(ss, _mm256_add_ps(
                        _mm256_add_ps(_mm256_mul_ps(v[0], v[0]), _mm256_mul_ps(v[1], v[1])),
                        _mm256_add_ps(_mm256_mul_ps(v[2], v[2]), _mm256_mul_ps(v[3], v[3]))));
                }
                __m256i s0 = _mm256_srai_epi16(_mm256_loadu_si256((const __m256i *)(r + c)), 8);
                __m256i s1 =
                    _mm256_srai_epi16(_mm256_loadu_si256((const __m256i *)(r + c + 16)), 8);
                __m256i sg = _mm256_permute4x64_epi64(_mm256_packs_epi16(s0, s1), 0xd8);
                __m256i p = v_pack_bytes(e[0], e[1], e[2], e[3], 0);
                p = _mm256_or_si256(p, _mm256_and_si256(sg, _mm256_set1_epi8((char)0x80)));
                _mm256_storeu_si256((__m256i *)(q + c), p);
            }
            if (st)
                knorm[h] += sqrtf(v_hsum(ss));
        }
    }
}

/* fp8 section without statistics, when no value needs sanitising (else 0, and the caller
 * takes the general path). Pass 1 takes each head's amax on the raw halves as integers: with
 * the sign cleared, fp16 and bf16 bit patterns order like their magnitudes, so one and plus
 * one unsigned max per 16 values finds both the amax and any value that needs sanitising
 * (NaN or Inf in fp16; in bf16 also anything past 65504), the same test as
 * v_needs_sanitize(). Pass 2 converts and codes; the section is still in L2 from pass 1. */
KT static int fp8_sect_fast(const uint16_t *raw, const struct kern_layout *lay, uint8_t *sect,
                            float *scratch, float *kmin, float *kmax, float *knorm)
{
    uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens, dtype = lay->dtype;
    __m256i *acc = (__m256i *)(((uintptr_t)scratch + 31) & ~(uintptr_t)31);
    float *scale = (float *)(acc + H);
    const __m256i abs = _mm256_set1_epi16(0x7fff);
    const uint16_t *r = raw;
    for (uint32_t h = 0; h < H; h++)
        acc[h] = _mm256_setzero_si256();
    for (uint32_t t = 0; t < T; t++) {
        for (uint32_t h = 0; h < H; h++, r += D) {
            __m256i m0 = acc[h], m1 = _mm256_setzero_si256();
            uint32_t c = 0;
            for (; c + 32 <= D; c += 32) {
                __m256i a0 = _mm256_loadu_si256((const __m256i *)(r + c));
                __m256i a1 = _mm256_loadu_si256((const __m256i *)(r + c + 16));
                m0 = _mm256_max_epu16(m0, _mm256_and_si256(a0, abs));
                m1 = _mm256_max_epu16(m1, _mm256_and_si256(a1, abs));
            }
            acc[h] = _mm256_max_epu16(m0, m1);
        }
    }
    for (uint32_t h = 0; h < H; h++) {
        /* horizontal unsigned max as minpos of the complement */
        __m128i m = _mm_max_epu16(_mm256_castsi256_si128(acc[h]),
                                  _mm256_extracti128_si256(acc[h], 1));
        uint16_t mx = (uint16_t)~_mm_extract_epi16(_mm_minpos_epu16(_mm_xor_si128(
                                                        m, _mm_set1_epi32(-1))), 0);
        float amax;
        if (dtype == KERN_DTYPE_FP16) {
            if (mx > 0x7bff)
                return 0;
            amax = kern_h2f(mx);
        } else {
            if (mx > 0x477f) /* past 65504: the codes would need the clamp */
                return 0;
            amax = kern_bf2f(mx);
        }
        scale[h] = kern_fp8_scale(amax);
        memcpy(sect + 4 * h, &scale[h], 4);
    }
    if (kmin && dtype == KERN_DTYPE_BF16)
        fp8_codes(raw, lay, sect, scale, KERN_DTYPE_BF16, 1, kmin, kmax, knorm);
    else if (kmin)
        fp8_codes(raw, lay, sect, scale, KERN_DTYPE_FP16, 1, kmin, kmax, knorm);
    else if (dtype == KERN_DTYPE_BF16)
        fp8_codes(raw, lay, sect, scale, KERN_DTYPE_BF16, 0, NULL, NULL, NULL);
    else
        fp8_codes(raw, lay, sect, scale, KERN_DTYPE_FP16, 0, NULL, NULL, NULL);
    return 1;
}

/* A row's 32 values: their squares summed into the eight lanes at ss (the order of the
 * statistics pass, stats_rows()). */
KT KERN_AI static inline void kivi_k_ss(const __m256 v[4], float *ss)
{
    __m256 sq = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(v[0], v[0]), _mm256_mul_ps(v[1], v[1])),
                              _mm256_add_ps(_mm256_mul_ps(v[2], v[2]), _mm256_mul_ps(v[3], v[3])));
    _mm256_store_ps(ss, _mm256_add_ps(_mm256_load_ps(ss), sq));
}

/* KIVI key section. Per group of 32 tokens and per head, 32 channels at a time: the rows
 * of those channels are converted once into a 4 KiB buffer while their ranges are taken in
 * registers, the 32 channels' scale and min follow, and the codes of each row come from the
 * buffer. Inlined once per (bits, dtype), so the loops carry no branch on them. */
KT __attribute__((always_inline)) static inline void
kivi_k_sect(int bits, uint32_t dtype, const void *raw, const struct kern_layout *lay,
            uint8_t *sect, float *kmin, float *kmax, float *knorm)
{
    const int rne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens;
    uint32_t rb = kern_kivi_row_bytes(D, bits);
    uint64_t hb = kern_kivi_k_head_bytes(D, T, bits), HD = (uint64_t)H * D;
    float qmax = (float)((1 << bits) - 1);
    __attribute__((aligned(32))) float xb[KERN_GROUP][32];
    for (uint32_t t0 = 0; t0 < T; t0 += KERN_GROUP) {
        uint32_t rows = T - t0 < KERN_GROUP ? T - t0 : KERN_GROUP;
        uint32_t gb = kern_kivi_k_group_bytes(D, rows, bits);
        uint64_t goff = (uint64_t)(t0 / KERN_GROUP) * kern_kivi_k_group_bytes(D, KERN_GROUP, bits);
        const uint16_t *rg = (const uint16_t *)raw + (uint64_t)t0 * HD;
        /* one sanitise check for the group (the reference's test, on the raw halves) */
        int san = 0;
        for (uint32_t i = 0; i < rows * H && !san; i++)
            san = v_needs_sanitize(rg + (uint64_t)i * D, D, dtype);
        for (uint32_t h = 0; h < H; h++) {
            uint8_t *g = sect + h * hb + goff;
            __attribute__((aligned(32))) float ssb[KERN_GROUP][8];
            if (kmin)
                for (uint32_t r = 0; r < rows; r++)
                    _mm256_store_ps(ssb[r], _mm256_setzero_ps());
            for (uint32_t c = 0; c < D; c += 32) {
                const uint16_t *p = rg + (uint64_t)h * D + c;
                __m256 lo[4], hi[4], mnf[4], id[4];
                /* the new value is the first operand of min/max: on a tie (+0 and -0) the
                 * earlier row's value stays, as in the reference */
                KERN_UNROLL
                for (int i = 0; i < 4; i++) {
                    lo[i] = hi[i] = san ? v_load8(p + 8 * i, dtype) : v_load8_fast(p + 8 * i, dtype);
                    _mm256_store_ps(&xb[0][8 * i], lo[i]);
                }
                if (kmin) /* each row's sum of squares over these 32 channels into ssb */
                    kivi_k_ss(lo, ssb[0]);
                for (uint32_t r = 1; r < rows; r++) {
                    __m256 v[4];
                    p += HD;
                    KERN_UNROLL
                    for (int i = 0; i < 4; i++) {
                        v[i] = san ? v_load8(p + 8 * i, dtype) : v_load8_fast(p + 8 * i, dtype);
                        _mm256_store_ps(&xb[r][8 * i], v[i]);
                        lo[i] = _mm256_min_ps(v[i], lo[i]);
                        hi[i] = _mm256_max_ps(v[i], hi[i]);
                    }
                    if (kmin)
                        kivi_k_ss(v, ssb[r]);
                }
                if (kmin) {
                    /* statistics: the group's extremes fold into the block's (an earlier
                     * group's value stays on a tie) */
                    float *mn = kmin + (uint64_t)h * D + c, *mx = kmax + (uint64_t)h * D + c;
                    KERN_UNROLL
                    for (int i = 0; i < 4; i++) {
                        _mm256_storeu_ps(mn + 8 * i, _mm256_min_ps(lo[i], _mm256_loadu_ps(mn + 8 * i)));
                        _mm256_storeu_ps(mx + 8 * i, _mm256_max_ps(hi[i], _mm256_loadu_ps(mx + 8 * i)));
                    }
                }
                KERN_UNROLL
                for (int i = 0; i < 4; i++) {
                    __m128i mn_h = _mm256_cvtps_ph(lo[i], rne);
                    __m128i sc_h = _mm256_cvtps_ph(
                        _mm256_div_ps(_mm256_sub_ps(hi[i], lo[i]), _mm256_set1_ps(qmax)), rne);
                    _mm_storeu_si128((__m128i *)(g + 2 * (c + 8 * i)), sc_h);
                    _mm_storeu_si128((__m128i *)(g + 2 * D + 2 * (c + 8 * i)), mn_h);
                    __m256 sc = _mm256_cvtph_ps(sc_h);
                    id[i] = _mm256_andnot_ps(_mm256_cmp_ps(sc, _mm256_setzero_ps(), _CMP_EQ_OQ),
                                             _mm256_div_ps(_mm256_set1_ps(1.0f), sc));
                    mnf[i] = _mm256_cvtph_ps(mn_h);
                }
                uint8_t *out = g + 4 * D + c * bits / 8;
                p = rg + (uint64_t)h * D + c;
                for (uint32_t r = 0; r < rows; r++, out += rb, p += HD) {
                    __m256i q[4];
                    /* the next group (or section) into L2 while this one is coded */
                    _mm_prefetch((const char *)(p + (uint64_t)rows * HD), _MM_HINT_T1);
                    KERN_UNROLL
                    for (int i = 0; i < 4; i++)
                        q[i] = v_kivi_code(_mm256_load_ps(&xb[r][8 * i]), mnf[i], id[i]);
                    v_kivi_pack32(v_pack_bytes(q[0], q[1], q[2], q[3], 0), bits, out);
                }
            }
            memset(g + 4 * D + (uint64_t)rows * rb, 0, gb - 4 * D - rows * rb);
            if (kmin)
                for (uint32_t r = 0; r < rows; r++)
                    knorm[h] += sqrtf(v_hsum(_mm256_load_ps(ssb[r])));
        }
    }
}

/* Key statistics of a section in one pass of their own (it stays in L2 for the codes);
 * returns whether any value needed sanitising. Per block of 32 tokens and per head, 32
 * channels at a time down the rows: the channel extremes stay in registers (the new value
 * is the first operand of min/max, so on a tie the earlier row's value stays, as in the
 * reference) and each row's sum of squares collects in a small buffer. */
KT __attribute__((always_inline)) static inline int
stats_rows(const uint16_t *raw, const struct kern_layout *lay, uint32_t dtype, float *kmin,
           float *kmax, float *knorm)
{
    uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens;
    uint64_t HD = (uint64_t)H * D;
    __attribute__((aligned(32))) float ssb[KERN_GROUP][8];
    int dirty = 0;
    stats_init(lay, kmin, kmax, knorm);
    for (uint32_t t0 = 0; t0 < T; t0 += KERN_GROUP) {
        uint32_t rows = T - t0 < KERN_GROUP ? T - t0 : KERN_GROUP;
        const uint16_t *rg = raw + (uint64_t)t0 * HD;
        int san = 0;
        for (uint32_t i = 0; i < rows * H && !san; i++)
            san = v_needs_sanitize(rg + (uint64_t)i * D, D, dtype);
        dirty |= san;
        for (uint32_t h = 0; h < H; h++) {
            for (uint32_t r = 0; r < rows; r++)
                _mm256_store_ps(ssb[r], _mm256_setzero_ps());
            for (uint32_t c = 0; c < D; c += 32) {
                float *mn = kmin + (uint64_t)h * D + c, *mx = kmax + (uint64_t)h * D + c;
                const uint16_t *p = rg + (uint64_t)h * D + c;
                __m256 lo[4], hi[4];
                KERN_UNROLL
                for (int i = 0; i < 4; i++) {
                    lo[i] = _mm256_loadu_ps(mn + 8 * i);
                    hi[i] = _mm256_loadu_ps(mx + 8 * i);
                }
                for (uint32_t r = 0; r < rows; r++, p += HD) {
                    __m256 v[4];
                    KERN_UNROLL
                    for (int i = 0; i < 4; i++) {
                        v[i] = san ? v_load8(p + 8 * i, dtype) : v_load8_fast(p + 8 * i, dtype);
                        lo[i] = _mm256_min_ps(v[i], lo[i]);
                        hi[i] = _mm256_max_ps(v[i], hi[i]);
                    }
                    __m256 sq = _mm256_add_ps(
                        _mm256_add_ps(_mm256_mul_ps(v[0], v[0]), _mm256_mul_ps(v[1], v[1])),
                        _mm256_add_ps(_mm256_mul_ps(v[2], v[2]), _mm256_mul_ps(v[3], v[3])));
                    _mm256_store_ps(ssb[r], _mm256_add_ps(_mm256_load_ps(ssb[r]), sq));
                }
                KERN_UNROLL
                for (int i = 0; i < 4; i++) {
                    _mm256_storeu_ps(mn + 8 * i, lo[i]);
                    _mm256_storeu_ps(mx + 8 * i, hi[i]);
                }
            }
            for (uint32_t r = 0; r < rows; r++)
                knorm[h] += sqrtf(v_hsum(_mm256_load_ps(ssb[r])));
        }
    }
    stats_done(lay, knorm);
    return dirty;
}

/* Rows per chunk of stats_enc_rows(): the driver's scratch holds 4 * H * D floats. */
#define STATS_ENC_ROWS 4

/* A K section of q8_0, q4_1 or q5_1 with key statistics, in chunks of STATS_ENC_ROWS tokens:
 * the statistics pass of stats_rows() (same order of every min, max and sum, so the same
 * results) also stores the sanitised floats of the chunk in xf, and the codec codes the chunk
 * from them while they are in L1. Before, the statistics were a pass of their own and the
 * encoder converted and checked every value a second time. */
KT __attribute__((always_inline)) static inline void
stats_enc_rows(uint32_t codec, const uint16_t *raw, const struct kern_layout *lay,
               uint32_t dtype, uint8_t *sect, float *xf, float *kmin, float *kmax, float *knorm)
{
    uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens, G = D / 32;
    uint64_t HD = (uint64_t)H * D, next = (uint64_t)T * HD;
    uint32_t gb = block_bytes(codec, 0);
    __attribute__((aligned(32))) float ssb[STATS_ENC_ROWS][8];
    stats_init(lay, kmin, kmax, knorm);
    for (uint32_t t0 = 0; t0 < T; t0 += STATS_ENC_ROWS) {
        uint32_t rows = T - t0 < STATS_ENC_ROWS ? T - t0 : STATS_ENC_ROWS;
        const uint16_t *rg = raw + (uint64_t)t0 * HD;
        int san = 0;
        for (uint32_t i = 0; i < rows * H && !san; i++)
            san = v_needs_sanitize(rg + (uint64_t)i * D, D, dtype);
        for (uint32_t h = 0; h < H; h++) {
            for (uint32_t r = 0; r < rows; r++)
                _mm256_store_ps(ssb[r], _mm256_setzero_ps());
            for (uint32_t c = 0; c < D; c += 32) {
                float *mn = kmin + (uint64_t)h * D + c, *mx = kmax + (uint64_t)h * D + c;
                const uint16_t *p = rg + (uint64_t)h * D + c;
                float *xo = xf + (uint64_t)h * D + c;
                __m256 lo[4], hi[4];
                KERN_UNROLL
                for (int i = 0; i < 4; i++) {
                    lo[i] = _mm256_loadu_ps(mn + 8 * i);
                    hi[i] = _mm256_loadu_ps(mx + 8 * i);
                }
                for (uint32_t r = 0; r < rows; r++, p += HD, xo += HD) {
                    __m256 v[4];
                    /* the next section into L2 while this one is coded */
                    _mm_prefetch((const char *)(p + next), _MM_HINT_T1);
                    KERN_UNROLL
                    for (int i = 0; i < 4; i++) {
                        v[i] = san ? v_load8(p + 8 * i, dtype) : v_load8_fast(p + 8 * i, dtype);
                        _mm256_storeu_ps(xo + 8 * i, v[i]);
                        lo[i] = _mm256_min_ps(v[i], lo[i]);
                        hi[i] = _mm256_max_ps(v[i], hi[i]);
                    }
                    __m256 sq = _mm256_add_ps(
                        _mm256_add_ps(_mm256_mul_ps(v[0], v[0]), _mm256_mul_ps(v[1], v[1])),
                        _mm256_add_ps(_mm256_mul_ps(v[2], v[2]), _mm256_mul_ps(v[3], v[3])));
                    _mm256_store_ps(ssb[r], _mm256_add_ps(_mm256_load_ps(ssb[r]), sq));
                }
                KERN_UNROLL
                for (int i = 0; i < 4; i++) {
                    _mm256_storeu_ps(mn + 8 * i, lo[i]);
                    _mm256_storeu_ps(mx + 8 * i, hi[i]);
                }
            }
            for (uint32_t r = 0; r < rows; r++)
                knorm[h] += sqrtf(v_hsum(_mm256_load_ps(ssb[r])));
        }
        enc_groups_f(codec, xf, (uint64_t)rows * H * G, sect + (uint64_t)t0 * H * G * gb);
    }
    stats_done(lay, knorm);
}

KT static int avx_enc_sect(uint32_t codec, int is_v, const void *raw,
                           const struct kern_layout *lay, uint8_t *sect, float *scratch,
                           float *kmin, float *kmax, float *knorm)
{
    uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens, G = D / 32;
    int bits = kern_codec_bits(codec);
    const uint16_t *r = raw;
    if (D % 32)
        return 0;
    if (kmin && bits && !is_v) {
        /* KIVI keys take the statistics in their own range pass */
        stats_init(lay, kmin, kmax, knorm);
        if (bits == 4 && lay->dtype == KERN_DTYPE_BF16)
            kivi_k_sect(4, KERN_DTYPE_BF16, raw, lay, sect, kmin, kmax, knorm);
        else if (bits == 4)
            kivi_k_sect(4, KERN_DTYPE_FP16, raw, lay, sect, kmin, kmax, knorm);
        else if (lay->dtype == KERN_DTYPE_BF16)
            kivi_k_sect(2, KERN_DTYPE_BF16, raw, lay, sect, kmin, kmax, knorm);
        else
            kivi_k_sect(2, KERN_DTYPE_FP16, raw, lay, sect, kmin, kmax, knorm);
        stats_done(lay, knorm);
        return 1;
    }
    if (kmin && !bits && codec != KERN_CODEC_RAW && codec != KERN_CODEC_FP8) {
        if (lay->dtype == KERN_DTYPE_BF16)
            stats_enc_rows(codec, raw, lay, KERN_DTYPE_BF16, sect, scratch, kmin, kmax, knorm);
        else
            stats_enc_rows(codec, raw, lay, KERN_DTYPE_FP16, sect, scratch, kmin, kmax, knorm);
        return 1;
    }
    if (kmin && codec == KERN_CODEC_FP8) {
        /* the codes pass takes the statistics too, when no value needs sanitising (the
         * integer amax pass finds that first and writes nothing then) */
        stats_init(lay, kmin, kmax, knorm);
        if (fp8_sect_fast(raw, lay, sect, scratch, kmin, kmax, knorm)) {
            stats_done(lay, knorm);
            return 1;
        }
    }
    if (kmin) {
        /* the statistics first; then the codec runs as without them */
        if (lay->dtype == KERN_DTYPE_BF16)
            stats_rows(raw, lay, KERN_DTYPE_BF16, kmin, kmax, knorm);
        else
            stats_rows(raw, lay, KERN_DTYPE_FP16, kmin, kmax, knorm);
        if (codec == KERN_CODEC_RAW)
            return 1;
    }
    if (codec == KERN_CODEC_FP8 && !kmin &&
        fp8_sect_fast(raw, lay, sect, scratch, NULL, NULL, NULL))
        return 1;
    if (codec == KERN_CODEC_FP8) {
        /* some value needs sanitising: the head amax, then the codes, per row as needed */
        float *amax = scratch;
        for (uint32_t h = 0; h < H; h++)
            amax[h] = 0.0f;
        for (uint32_t t = 0; t < T; t++) {
            for (uint32_t h = 0; h < H; h++, r += D) {
                __m256 m = _mm256_setzero_ps();
                for (uint32_t c = 0; c < D; c += 8)
                    m = _mm256_max_ps(m, _mm256_andnot_ps(_mm256_set1_ps(-0.0f),
                                                          v_load8(r + c, lay->dtype)));
                float a = v_hmax(m);
                amax[h] = a > amax[h] ? a : amax[h];
            }
        }
        for (uint32_t h = 0; h < H; h++) {
            float sc = kern_fp8_scale(amax[h]);
            memcpy(sect + 4 * h, &sc, 4);
            scratch[h] = sc;
        }
        r = raw;
        uint8_t *q = sect + 4 * H;
        for (uint32_t t = 0; t < T; t++) {
            for (uint32_t h = 0; h < H; h++, r += D, q += D) {
                __m256 vs = _mm256_set1_ps(scratch[h]);
                for (uint32_t c = 0; c < D; c += 32) {
                    __m256i e[4];
                    KERN_UNROLL
                    for (int i = 0; i < 4; i++)
                        e[i] = v_e4m3_enc(_mm256_div_ps(v_load8(r + c + 8 * i, lay->dtype), vs));
                    _mm256_storeu_si256((__m256i *)(q + c), v_pack_bytes(e[0], e[1], e[2], e[3], 0));
                }
            }
        }
        return 1;
    }
    if (bits && !is_v) {
        if (bits == 4 && lay->dtype == KERN_DTYPE_BF16)
            kivi_k_sect(4, KERN_DTYPE_BF16, raw, lay, sect, NULL, NULL, NULL);
        else if (bits == 4)
            kivi_k_sect(4, KERN_DTYPE_FP16, raw, lay, sect, NULL, NULL, NULL);
        else if (lay->dtype == KERN_DTYPE_BF16)
            kivi_k_sect(2, KERN_DTYPE_BF16, raw, lay, sect, NULL, NULL, NULL);
        else
            kivi_k_sect(2, KERN_DTYPE_FP16, raw, lay, sect, NULL, NULL, NULL);
        return 1;
    }
    /* row-wise codecs: groups in the same order as the rows */
    enc_groups(codec, bits, r, lay->dtype, (uint64_t)T * H * G, sect);
    return 1;
}

/* KIVI key section decode, row by row in memory order (the raw rows are written front to
 * back, as the row-wise codecs write them; going down each channel's column instead strides
 * by H * D halves per row, which streams badly). Per group of 32 tokens the channels' tables
 * are made first, in `scratch` (2 * H * D floats): for 2-bit keys each channel's four
 * outputs out(q * scale + min), q = 0..3, as halves, so a row's 16 channels are picked from
 * them by two blends on the code bits; for 4-bit keys each channel's scale and min as floats,
 * and each eight codes of a row come out of one 32-bit word by a shift per lane, are
 * converted, multiplied and added (fused in the FMA build). */
KT __attribute__((always_inline)) static inline void
kivi_k_dec_sect(int bits, uint32_t out, int nt, const uint8_t *sect,
                const struct kern_layout *lay, void *raw, float *scratch)
{
    uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens;
    uint32_t rb = kern_kivi_row_bytes(D, bits);
    uint64_t hb = kern_kivi_k_head_bytes(D, T, bits), HD = (uint64_t)H * D;
    uint32_t fgb = kern_kivi_k_group_bytes(D, KERN_GROUP, bits);
    uint16_t *tab = (uint16_t *)scratch; /* 2-bit: [H * D / 16][4][16] halves */
    float *scf = scratch, *mnf = scratch + HD; /* 4-bit: [H * D] each */
    /* channel j of 16 reads bits 2j, 2j + 1 of a 32-bit code word: each 16-bit lane gets
     * the half word that holds them */
    const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                            2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    const __m256i b0 = _mm256_setr_epi16(1, 4, 16, 64, 256, 1024, 4096, 16384, 1, 4, 16, 64,
                                         256, 1024, 4096, 16384);
    const __m256i b1 = _mm256_add_epi16(b0, b0);
    for (uint32_t t0 = 0; t0 < T; t0 += KERN_GROUP) {
        uint32_t rows = T - t0 < KERN_GROUP ? T - t0 : KERN_GROUP;
        for (uint32_t h = 0; h < H; h++) {
            const uint8_t *g = sect + h * hb + (uint64_t)(t0 / KERN_GROUP) * fgb;
            for (uint32_t c = 0; c < D; c += 16) {
                __m256 sc[2], mn[2];
                KERN_UNROLL
                for (int i = 0; i < 2; i++) {
                    sc[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 2 * (c + 8 * i))));
                    mn[i] = _mm256_cvtph_ps(
                        _mm_loadu_si128((const __m128i *)(g + 2 * D + 2 * (c + 8 * i))));
                }
                uint64_t ch = (uint64_t)h * D + c;
                if (bits == 4) {
                    KERN_UNROLL
                    for (int i = 0; i < 2; i++) {
                        _mm256_storeu_ps(scf + ch + 8 * i, sc[i]);
                        _mm256_storeu_ps(mnf + ch + 8 * i, mn[i]);
                    }
                    continue;
                }
                KERN_UNROLL
                for (int q = 0; q < 4; q++) {
                    __m256 fq = _mm256_set1_ps((float)q);
                    __m128i t0h = v_half8(_mm256_add_ps(_mm256_mul_ps(fq, sc[0]), mn[0]), out);
                    __m128i t1h = v_half8(_mm256_add_ps(_mm256_mul_ps(fq, sc[1]), mn[1]), out);
                    _mm256_storeu_si256((__m256i *)(tab + 4 * ch + 16 * q),
                                        _mm256_set_m128i(t1h, t0h));
                }
            }
        }
        uint16_t *r = (uint16_t *)raw + (uint64_t)t0 * HD;
        for (uint32_t t = 0; t < rows; t++) {
            for (uint32_t h = 0; h < H; h++, r += D) {
                const uint8_t *row = sect + h * hb + (uint64_t)(t0 / KERN_GROUP) * fgb + 4 * D +
                                     (uint64_t)t * rb;
                if (bits == 2) {
                    const uint16_t *tb = tab + 4 * (uint64_t)h * D;
                    for (uint32_t c = 0; c < D; c += 16, tb += 64) {
                        uint32_t w;
                        memcpy(&w, row + c / 4, 4);
                        __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)w), spread);
                        __m256i m0 = _mm256_cmpeq_epi16(_mm256_and_si256(v, b0), b0);
                        __m256i m1 = _mm256_cmpeq_epi16(_mm256_and_si256(v, b1), b1);
                        __m256i lo = _mm256_blendv_epi8(_mm256_loadu_si256((const __m256i *)tb),
                                                        _mm256_loadu_si256((const __m256i *)(tb + 16)), m0);
                        __m256i hi = _mm256_blendv_epi8(_mm256_loadu_si256((const __m256i *)(tb + 32)),
                                                        _mm256_loadu_si256((const __m256i *)(tb + 48)), m0);
                        v_st32(r + c, _mm256_blendv_epi8(lo, hi, m1), nt);
                    }
                    continue;
                }
                const float *sp = scf + (uint64_t)h * D, *mp = mnf + (uint64_t)h * D;
                for (uint32_t c = 0; c < D; c += 32) {
                    KERN_UNROLL
                    for (int i = 0; i < 4; i++) {
                        /* eight codes from one 32-bit word, by a variable shift per lane */
                        __m256 f = v_kivi_unpack8(row, c + 8 * i, 4);
                        f = _mm256_add_ps(_mm256_mul_ps(f, _mm256_loadu_ps(sp + c + 8 * i)),
                                          _mm256_loadu_ps(mp + c + 8 * i));
                        v_st16(r + c + 8 * i, v_half8(f, out), nt);
                    }
                }
            }
        }
    }
}

/* fp8 section decode. A code's bits placed at 20-26 (sign at 31) are the float e4m3(code) *
 * 2^-120 exactly, so e4m3(code) * scale is that float times scale * 2^120 (one rounding of
 * the same real product), as long as scale * 2^120 is finite: the encoder's scales are at
 * most 65504 / 448; a head whose scale is larger (not written by an encoder) takes the
 * reference's two multiplications. Sixteen codes are placed into the top bytes of two vectors
 * by one shuffle each, then shifted down arithmetically (the sign lands on bit 31). */
KT __attribute__((always_inline)) static inline void
fp8_dec_sect(const uint8_t *sect, const struct kern_layout *lay, void *raw, uint32_t out, int nt)
{
    uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens;
    const __m256 p120 = _mm256_set1_ps(1.329227995784916e36f);
    const __m256i top0 = _mm256_setr_epi8(-1, -1, -1, 0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3,
                                          -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7);
    const __m256i top1 = _mm256_add_epi8(top0, _mm256_set1_epi32(0x08000000));
    const __m256i bits = _mm256_set1_epi32((int)0x87f00000u);
    const uint8_t *q = sect + 4 * H;
    uint16_t *r = raw;
    for (uint32_t t = 0; t < T; t++) {
        for (uint32_t h = 0; h < H; h++, r += D, q += D) {
            float scale;
            memcpy(&scale, sect + 4 * h, 4);
            if (fabsf(scale) >= 256.0f && fabsf(scale) <= 3.402823466e38f) {
                __m256 vs = _mm256_set1_ps(scale);
                for (uint32_t c = 0; c < D; c += 8) {
                    __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + c)));
                    __m256i u = _mm256_or_si256(
                        _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x7f)), 20),
                        _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x80)), 24));
                    __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(u), p120);
                    v_st16(r + c, v_half8(_mm256_mul_ps(f, vs), out), nt);
                }
                continue;
            }
            __m256 vs = _mm256_mul_ps(_mm256_set1_ps(scale), p120);
            for (uint32_t c = 0; c < D; c += 16) {
                __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q + c)));
                __m256i u0 = _mm256_and_si256(_mm256_srai_epi32(_mm256_shuffle_epi8(b, top0), 4), bits);
                __m256i u1 = _mm256_and_si256(_mm256_srai_epi32(_mm256_shuffle_epi8(b, top1), 4), bits);
                __m128i h0 = v_half8(_mm256_mul_ps(_mm256_castsi256_ps(u0), vs), out);
                __m128i h1 = v_half8(_mm256_mul_ps(_mm256_castsi256_ps(u1), vs), out);
                v_st32(r + c, _mm256_set_m128i(h1, h0), nt);
            }
        }
    }
}

/* q8_0 blocks decoded into at least this many bytes are written with non-temporal stores:
 * they cannot stay in this core's L2 anyway, and the usual reader (a copy to the GPU, another
 * process) reads them once. The stores skip the read for ownership of every destination line,
 * a third of a decode's memory traffic, and q8_0 decode, the cheapest to compute, is bound by
 * that traffic (+25% out of cache on the Zen 3 host). The other codecs are bound by their
 * arithmetic there and were no faster streaming (q4_1 a little slower), so they, and smaller
 * blocks, write through the cache. */
#define KERN_NT_MIN_BYTES (1u << 20)

/* One section, stores ordinary or non-temporal (nt constant after inlining). */
KT __attribute__((always_inline)) static inline void
dec_sect_nt(uint32_t codec, int bits, int is_v, const uint8_t *sect,
            const struct kern_layout *lay, void *raw, uint32_t out, float *scratch, int nt)
{
    uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens, G = D / 32;
    uint16_t *r = raw;
    if (codec == KERN_CODEC_FP8) {
        if (out == KERN_DTYPE_BF16)
            fp8_dec_sect(sect, lay, raw, KERN_DTYPE_BF16, nt);
        else
            fp8_dec_sect(sect, lay, raw, KERN_DTYPE_FP16, nt);
        return;
    }
    if (bits && !is_v) {
        if (bits == 4 && out == KERN_DTYPE_BF16)
            kivi_k_dec_sect(4, KERN_DTYPE_BF16, nt, sect, lay, raw, scratch);
        else if (bits == 4)
            kivi_k_dec_sect(4, KERN_DTYPE_FP16, nt, sect, lay, raw, scratch);
        else if (out == KERN_DTYPE_BF16)
            kivi_k_dec_sect(2, KERN_DTYPE_BF16, nt, sect, lay, raw, scratch);
        else
            kivi_k_dec_sect(2, KERN_DTYPE_FP16, nt, sect, lay, raw, scratch);
        return;
    }
    uint32_t gb = block_bytes(codec, bits);
    const uint8_t *blk = sect;
    uint64_t n = (uint64_t)T * H * G;
    /* one loop per (codec, output dtype), each group straight into its raw halves */
#define DEC_LOOP(C, B, OUT)                                                                    \
    do {                                                                                       \
        uint64_t i = 0;                                                                        \
        if ((C) == KERN_CODEC_Q4_1 || (B) == 4) /* two groups per table pass */               \
            for (; i + 2 <= n; i += 2, blk += 2 * gb, r += 64)                                 \
                tab16_dec2x32_to(C, blk, gb, r, OUT, nt);                                      \
        for (; i < n; i++, blk += gb, r += 32)                                                 \
            dec32_to(C, B, blk, r, OUT, nt);                                                   \
    } while (0)
#define DEC_OUT(C, B)                                                                          \
    do {                                                                                       \
        if (out == KERN_DTYPE_BF16)                                                            \
            DEC_LOOP(C, B, KERN_DTYPE_BF16);                                                   \
        else                                                                                   \
            DEC_LOOP(C, B, KERN_DTYPE_FP16);                                                   \
    } while (0)
    if (bits == 4)
        DEC_OUT(KERN_CODEC_KIVI4, 4);
    else if (bits == 2)
        DEC_OUT(KERN_CODEC_KIVI2, 2);
    else if (codec == KERN_CODEC_Q8_0)
        DEC_OUT(KERN_CODEC_Q8_0, 0);
    else if (codec == KERN_CODEC_Q5_1)
        DEC_OUT(KERN_CODEC_Q5_1, 0);
    else
        DEC_OUT(KERN_CODEC_Q4_1, 0);
#undef DEC_OUT
#undef DEC_LOOP
}

/* The section decoders without FMA, for CPUs without it (and the tests, kern_avx2_fma()). */
KT __attribute__((noinline)) static void
dec_sect_plain(uint32_t codec, int bits, int is_v, const uint8_t *sect,
               const struct kern_layout *lay, void *raw, uint32_t out, float *scratch, int nt)
{
    if (nt) /* q8_0 only: see KERN_NT_MIN_BYTES */
        dec_sect_nt(KERN_CODEC_Q8_0, 0, is_v, sect, lay, raw, out, scratch, 1);
    else
        dec_sect_nt(codec, bits, is_v, sect, lay, raw, out, scratch, 0);
}

/* The same decoders built with FMA, so the compiler fuses each q * d + m (q * scale + min)
 * into one instruction: the product is exact in fp32 (q < 2^5 times an fp16 value), so the
 * fused form rounds once where the reference rounds once too, and the results are the same
 * bits, Inf and NaN scalars included, except which NaN comes out where two meet (a NaN
 * scalar and a NaN product, e.g. 0 * Inf + NaN): x86 returns one operand's NaN by its
 * position in the instruction, which the compiler chooses in either build. Only decode has
 * FMA: every multiply and add of the encoders must round twice, as the reference's. */
KTF __attribute__((noinline)) static void
dec_sect_fma(uint32_t codec, int bits, int is_v, const uint8_t *sect,
             const struct kern_layout *lay, void *raw, uint32_t out, float *scratch, int nt)
{
    if (nt) /* q8_0 only: see KERN_NT_MIN_BYTES */
        dec_sect_nt(KERN_CODEC_Q8_0, 0, is_v, sect, lay, raw, out, scratch, 1);
    else
        dec_sect_nt(codec, bits, is_v, sect, lay, raw, out, scratch, 0);
}

/* Whether the decoders use their FMA build: set with `have` in kern_avx2_ops() (the CPU has
 * FMA), cleared and restored by the tests through kern_avx2_fma(). */
static int avx_have_fma, avx_cpu_fma;

KT static int avx_dec_sect(uint32_t codec, int is_v, const uint8_t *sect,
                           const struct kern_layout *lay, void *raw, uint32_t out,
                           float *scratch)
{
    int bits = kern_codec_bits(codec);
    if (lay->head_dim % 32)
        return 0;
    /* a section starts 64-byte aligned relative to the block (D % 32 == 0), so every store
     * is 16-byte aligned when the section is */
    int nt = codec == KERN_CODEC_Q8_0 && kern_raw_size(lay) >= KERN_NT_MIN_BYTES &&
             ((uintptr_t)raw & 15) == 0;
    if (__atomic_load_n(&avx_have_fma, __ATOMIC_RELAXED))
        dec_sect_fma(codec, bits, is_v, sect, lay, raw, out, scratch, nt);
    else
        dec_sect_plain(codec, bits, is_v, sect, lay, raw, out, scratch, nt);
    if (nt)
        _mm_sfence(); /* the streamed lines are ordered before whatever the caller does next */
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
    .enc_sect = avx_enc_sect,
    .dec_sect = avx_dec_sect,
};

const struct kern_cpu_ops *kern_avx2_ops(void)
{
    static int have = -1;
    int h = __atomic_load_n(&have, __ATOMIC_RELAXED);
    if (h < 0) { /* idempotent: racing first callers store the same answer */
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
        __atomic_store_n(&avx_cpu_fma, h && __builtin_cpu_supports("fma"), __ATOMIC_RELAXED);
        __atomic_store_n(&avx_have_fma, h && __builtin_cpu_supports("fma"), __ATOMIC_RELAXED);
        __atomic_store_n(&have, h, __ATOMIC_RELAXED);
    }
    return h ? &avx2_ops : NULL;
}

int kern_avx2_fma(int on)
{
    (void)kern_avx2_ops();
    int was = __atomic_load_n(&avx_have_fma, __ATOMIC_RELAXED);
    __atomic_store_n(&avx_have_fma, on && __atomic_load_n(&avx_cpu_fma, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
    return was;
}
