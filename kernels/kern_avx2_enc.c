/*
 * kern_avx2_enc.c — the AVX2 encoders of whole sections, walked in memory order, with the
 * key statistics gathered on the way.
 *
 * DESIGN
 * Called by kern.c through the ops table (enc_sect) on the thread that encodes the block.
 * One pass front to back over the raw rows [T][H][D] and the section, the next section
 * prefetched into L2; the group codecs come from the family headers, inlined into one loop
 * per codec and dtype. A section with a value that needs sanitising (one unsigned max over
 * the raw halves finds it) is redone the reference's way. No FMA (see kern_avx2.c).
 */
#include "kernels/kern_avx2.h"
#include "kernels/kern_avx2_fp8.h"
#include "kernels/kern_avx2_ggml.h"
#include "kernels/kern_avx2_kivi.h"

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
#define V_REDUCE8(OP, m, out)                                                                      \
    do {                                                                                           \
        __m256 t0_ = OP(_mm256_unpacklo_ps(m[0], m[1]), _mm256_unpackhi_ps(m[0], m[1]));           \
        __m256 t1_ = OP(_mm256_unpacklo_ps(m[2], m[3]), _mm256_unpackhi_ps(m[2], m[3]));           \
        __m256 t2_ = OP(_mm256_unpacklo_ps(m[4], m[5]), _mm256_unpackhi_ps(m[4], m[5]));           \
        __m256 t3_ = OP(_mm256_unpacklo_ps(m[6], m[7]), _mm256_unpackhi_ps(m[6], m[7]));           \
        __m256 u0_ = OP(_mm256_shuffle_ps(t0_, t1_, 0x44), _mm256_shuffle_ps(t0_, t1_, 0xee));     \
        __m256 u1_ = OP(_mm256_shuffle_ps(t2_, t3_, 0x44), _mm256_shuffle_ps(t2_, t3_, 0xee));     \
        out = OP(_mm256_permute2f128_ps(u0_, u1_, 0x20), _mm256_permute2f128_ps(u0_, u1_, 0x31));  \
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
KT __attribute__((always_inline)) static inline void
enc8_groups(uint32_t codec, int bits, const uint16_t *r, uint32_t dtype, uint8_t *blk, uint32_t gb,
            uint64_t ahead, const float *xf, int fsrc)
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
            v[i] =
                san ? v_load8(r + 32 * g + 8 * i, dtype) : v_load8_fast(r + 32 * g + 8 * i, dtype);
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
    if (bits) /* KIVI: the fp16 scale is 0 or normal in fp32 */
        id = _mm256_andnot_ps(_mm256_cmp_ps(d, zero, _CMP_EQ_OQ), id);
    else /* kern_ggml_inv: 0 where d is 0 or an fp32 subnormal */
        id = _mm256_and_ps(
            _mm256_cmp_ps(d, _mm256_set1_ps(KERN_FP32_MIN_NORMAL), _CMP_GE_OQ), id);
    _mm256_store_ps(idv, id);
    __attribute__((aligned(16))) uint16_t dhs[8], mhs[8];
    _mm_store_si128((__m128i *)dhs, dh);
    _mm_store_si128((__m128i *)mhs, mh);
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
         * x - mn >= 0; with a subnormal d the reciprocal is 0 (kern_ggml_inv), the codes 0. */
        KERN_UNROLL
        for (int i = 0; i < 4; i++)
            q[i] = _mm256_cvttps_epi32(
                _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + 8 * i), vm), vid),
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
}

/* n consecutive full groups of one row-wise codec, eight at a time. */
KT static void enc_groups(uint32_t codec, int bits, const uint16_t *r, uint32_t dtype, uint64_t n,
                          uint8_t *blk)
{
    uint32_t gb = block_bytes(codec, bits);
    uint64_t i = 0;
    /* enc8_groups is inlined into one loop per (codec, dtype), so the compiler drops every
     * per-vector branch on them. */
#define ENC_GROUPS_LOOP(C, B, D)                                                                   \
    for (; i + 8 <= n; i += 8, r += 256, blk += 8 * gb)                                            \
    enc8_groups(C, B, r, D, blk, gb, 32 * n, NULL, 0)
#define ENC_GROUPS_DTYPE(C, B)                                                                     \
    do {                                                                                           \
        if (dtype == KERN_DTYPE_BF16)                                                              \
            ENC_GROUPS_LOOP(C, B, KERN_DTYPE_BF16);                                                \
        else                                                                                       \
            ENC_GROUPS_LOOP(C, B, KERN_DTYPE_FP16);                                                \
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
#define ENC_GROUPS_F_LOOP(C)                                                                       \
    for (; i + 8 <= n; i += 8, xf += 256, blk += 8 * gb)                                           \
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
                    ss = _mm256_add_ps(ss, _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(v[0], v[0]),
                                                                       _mm256_mul_ps(v[1], v[1])),
                                                         _mm256_add_ps(_mm256_mul_ps(v[2], v[2]),
                                                                       _mm256_mul_ps(v[3], v[3]))));
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
        __m128i m =
            _mm_max_epu16(_mm256_castsi256_si128(acc[h]), _mm256_extracti128_si256(acc[h], 1));
        uint16_t mx =
            (uint16_t)~_mm_extract_epi16(_mm_minpos_epu16(_mm_xor_si128(m, _mm_set1_epi32(-1))), 0);
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
kivi_k_sect(int bits, uint32_t dtype, const void *raw, const struct kern_layout *lay, uint8_t *sect,
            float *kmin, float *kmax, float *knorm)
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
                    lo[i] = hi[i] =
                        san ? v_load8(p + 8 * i, dtype) : v_load8_fast(p + 8 * i, dtype);
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
                        _mm256_storeu_ps(mn + 8 * i,
                                         _mm256_min_ps(lo[i], _mm256_loadu_ps(mn + 8 * i)));
                        _mm256_storeu_ps(mx + 8 * i,
                                         _mm256_max_ps(hi[i], _mm256_loadu_ps(mx + 8 * i)));
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
KT __attribute__((always_inline)) static inline int stats_rows(const uint16_t *raw,
                                                               const struct kern_layout *lay,
                                                               uint32_t dtype, float *kmin,
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
stats_enc_rows(uint32_t codec, const uint16_t *raw, const struct kern_layout *lay, uint32_t dtype,
               uint8_t *sect, float *xf, float *kmin, float *kmax, float *knorm)
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

KT int kern_avx2_enc_sect(uint32_t codec, int is_v, const void *raw, const struct kern_layout *lay,
                          uint8_t *sect, float *scratch, float *kmin, float *kmax, float *knorm)
{
    uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens, G = D / 32;
    int bits = kern_codec_bits(codec);
    const uint16_t *r = raw;
    if (D % 32)
        return 0;
    if (kmin && bits && !is_v) {
        /* KIVI keys take the statistics in their own range pass */
        stats_init(lay, kmin, kmax, knorm);
        if (kern_rot512_on()) /* with AVX-512 where the CPU has it (kern_kivi512.c; it
                                 takes every KIVI key section with D % 32 == 0) */
            kern_kivi512_enc_k(bits, raw, lay, sect, kmin, kmax, knorm);
        else if (bits == 4 && lay->dtype == KERN_DTYPE_BF16)
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
                    m = _mm256_max_ps(
                        m, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v_load8(r + c, lay->dtype)));
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
                    _mm256_storeu_si256((__m256i *)(q + c),
                                        v_pack_bytes(e[0], e[1], e[2], e[3], 0));
                }
            }
        }
        return 1;
    }
    if (bits && !is_v) {
        if (kern_rot512_on()) /* with AVX-512 where the CPU has it (kern_kivi512.c; it
                                 takes every KIVI key section with D % 32 == 0) */
            kern_kivi512_enc_k(bits, raw, lay, sect, NULL, NULL, NULL);
        else if (bits == 4 && lay->dtype == KERN_DTYPE_BF16)
            kivi_k_sect(4, KERN_DTYPE_BF16, raw, lay, sect, NULL, NULL, NULL);
        else if (bits == 4)
            kivi_k_sect(4, KERN_DTYPE_FP16, raw, lay, sect, NULL, NULL, NULL);
        else if (lay->dtype == KERN_DTYPE_BF16)
            kivi_k_sect(2, KERN_DTYPE_BF16, raw, lay, sect, NULL, NULL, NULL);
        else
            kivi_k_sect(2, KERN_DTYPE_FP16, raw, lay, sect, NULL, NULL, NULL);
        return 1;
    }
    /* row-wise codecs: groups in the same order as the rows; KIVI's sixteen at a time with
     * AVX-512 where the CPU has it (kern_kivi512.c), the rest here */
    uint64_t n = (uint64_t)T * H * G, done = 0;
    if (bits && kern_rot512_on())
        done = kern_kivi512_enc_groups(bits, r, lay->dtype, n, sect);
    enc_groups(codec, bits, r + 32 * done, lay->dtype, n - done,
               sect + done * block_bytes(codec, bits));
    return 1;
}
