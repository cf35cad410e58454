/*
 * kern_avx2.h — what the files of the vectorised CPU codecs share (kernels/kern_avx2*.c,
 * and kern_lowrank.c for the stores of raw halves): the target attributes, the lane helpers,
 * the loads and stores of raw halves, and the entry points each file gives the others.
 *
 * DESIGN
 * kern_avx2.c holds the design of the whole (bit-identical to kern_fmt.h's reference, no
 * FMA in the encoders). The group codecs of each family are in kern_avx2_ggml.h,
 * kern_avx2_kivi.h and kern_avx2_fp8.h, and everything the loops use is static (inline) in
 * these headers, so each file's loops inline the same helpers they did when the codecs were
 * one file: splitting them changed no instruction of the section walks. A family's
 * per-group and per-head entries that only the per-slice dispatch (kern_avx2.c) calls are
 * marked KERN_SOME: the other files compile them out.
 */
#ifndef KVC_KERN_AVX2_H
#define KVC_KERN_AVX2_H

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

/* A static function some of the files including these headers do not call. */
#define KERN_SOME __attribute__((unused))

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

/* The 8 x 8 matrix in r[0..7] (row i in r[i]) transposed in place. */
KT KERN_AI static inline void v_tr8x8(__m256 *r)
{
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* Decode's stores into the raw rows: ordinary, or (nt) non-temporal, 16 bytes at a time, for
 * an output too large to stay in this core's caches (see kern_avx2_dec_sect()); r is then 16-byte
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

static inline uint32_t block_bytes(uint32_t codec, int bits)
{
    if (bits)
        return kern_kivi_v_group_bytes(bits);
    return codec == KERN_CODEC_Q8_0 ? 34 : codec == KERN_CODEC_Q4_1 ? 20 : 24;
}

/* Whole sections in memory order (kern_avx2_enc.c, kern_avx2_dec.c): 1 when done, 0 for a
 * shape that goes per head. */
KT int kern_avx2_enc_sect(uint32_t codec, int is_v, const void *raw, const struct kern_layout *lay,
                          uint8_t *sect, float *scratch, float *kmin, float *kmax, float *knorm);
KT int kern_avx2_dec_sect(uint32_t codec, int is_v, const uint8_t *sect,
                          const struct kern_layout *lay, void *raw, uint32_t out, float *scratch);
/* Whether the decoders use their FMA build (kern_avx2_dec.c): set in kern_avx2_ops() where
 * the CPU has FMA, cleared and restored by the tests through kern_avx2_fma(). */
extern int kern_avx2_have_fma, kern_avx2_cpu_fma;

#endif
