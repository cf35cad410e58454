/*
 * kern_kivi512.c — the KIVI sections with AVX-512, for CPUs that have it: the decode of
 * KIVI2/KIVI4 keys and values and of ROT2/ROT4's values (plain KIVI value sections,
 * kern_codec_as), and the encode of KIVI2/KIVI4 keys and of their value groups.
 *
 * DESIGN
 * Decode: called from kern_avx2_dec_sect() (kern_avx2_dec.c) on the decoding thread, in place
 * of the AVX2 section decoders, for the same sections and with the same results: the
 * reference's q * scale + min (a multiplication, then an addition) rounded to the output
 * dtype.
 * Values: a group has at most 16 distinct outputs, computed once per group (2-bit: four
 * groups' four outputs in one register) as halves; every code then picks its half by a
 * 16-bit permute (vpermw), 32 halves, one group, a register. Keys: per 32-token group the
 * channels' tables first, in the caller's scratch, as the AVX2 decoder has them (2-bit: each
 * channel's four output halves, picked per row by three masked blends on the code bits;
 * 4-bit: each channel's scale and min as floats, the even channels of each 32 before the odd
 * ones, so the 16 code bytes of 32 channels widen to dwords and split by a mask and a shift;
 * the two halves' results are interleaved back by one permute). Outputs of 1 MiB or more are
 * streamed (kern_st512.h): with the arithmetic this short the decode is bound by its memory
 * traffic, a third of which the streaming stores save. The file is built with
 * -ffp-contract=off (Makefile): AVX-512F carries the FMA, and a product and a sum the
 * reference rounds twice must stay two roundings.
 * Encode: called from kern_avx2_enc_sect() (kern_avx2_enc.c). A value section sixteen
 * consecutive groups at a time with the groups in the lanes (kern_kivi512.h, ROT's key
 * encoder's groups): loaded by a transpose, sanitized as the reference loads them unless fp16
 * and clean; the last groups of a section (fewer than sixteen) stay with the AVX2 encoder. A
 * key section as the AVX2 encoder's kivi_k_sect(), 32 channels in two registers instead of
 * four, the codes narrowed by vpmovdb; the key statistics in the same order of sums.
 *
 * In use where kern_rot512_on() (kern_rot512.c) says so: the CPU has AVX-512 F, BW, VL, DQ
 * and F16C and KVC_NO_AVX512 is unset; the tests' kern_rot_avx512() switches this path
 * with ROT's. Elsewhere the AVX2 decoders run.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/kern_cpu.h"
#include "kernels/kern_fmt.h"
#include "kernels/kern_kivi512.h"
#include "kernels/kern_st512.h"

/* ---- values: [T][H][D / 32] groups (kern_kivi512.h) ---- */

K5I void kivi5_v_dec(int bits, uint32_t out, const int nt, const uint8_t *sect,
                     const struct kern_layout *lay, uint16_t *r)
{
    kivi5_v_groups(bits, out, nt, sect,
                   (uint64_t)lay->tokens * lay->heads * (lay->head_dim / KERN_GROUP), r);
}

/* ---- keys: per head, 32-token groups of scale[D], min[D] (fp16), then the packed rows ---- */

/* Even lanes of (a, b), then odd ones: channels 0, 2, .., 30, 1, 3, .., 31. */
#define KIVI5_EVEN _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
#define KIVI5_ODD _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31)

/* One row of a 4-bit key group, 32 channels at a time: sp/mp the channels' scales and mins
 * (even channels, then odd, per 32). */
K5I void kivi5_k4_row(const uint8_t *row, const float *sp, const float *mp, uint16_t *r, uint32_t D,
                      uint32_t out, const int nt)
{
    /* word 2i of the result from the even half (i), word 2i + 1 from the odd half (32 + i) */
    const __m512i mix =
        _mm512_setr_epi32(0x00200000, 0x00210001, 0x00220002, 0x00230003, 0x00240004, 0x00250005,
                          0x00260006, 0x00270007, 0x00280008, 0x00290009, 0x002a000a, 0x002b000b,
                          0x002c000c, 0x002d000d, 0x002e000e, 0x002f000f);
    for (uint32_t c = 0; c < D; c += 32) {
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + c / 2)));
        const __m512 fe = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(0xf)));
        const __m512 fo = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
        const __m512 ye =
            _mm512_add_ps(_mm512_mul_ps(fe, _mm512_loadu_ps(sp + c)), _mm512_loadu_ps(mp + c));
        const __m512 yo = _mm512_add_ps(_mm512_mul_ps(fo, _mm512_loadu_ps(sp + c + 16)),
                                        _mm512_loadu_ps(mp + c + 16));
        const __m512i he = _mm512_castsi256_si512(kern_half16_512(ye, out)),
                      ho = _mm512_castsi256_si512(kern_half16_512(yo, out));
        kern_st512(r + c, _mm512_permutex2var_epi16(he, mix, ho), nt);
    }
}

/* One row of a 2-bit key group, 32 channels at a time: tb the channels' four output halves
 * ([4][32] per 32 channels). Word k of 128-bit lane L (channel 8L + k of the 32) reads bits
 * 2k, 2k + 1 of the lane's code word, bytes 2L and 2L + 1; two tests make the masks. */
K5I void kivi5_k2_row(const uint8_t *row, const uint16_t *tb, uint16_t *r, uint32_t D, const int nt)
{
    const __m512i spread =
        _mm512_set_epi64((long long)0x0706070607060706ull, (long long)0x0706070607060706ull,
                         (long long)0x0504050405040504ull, (long long)0x0504050405040504ull,
                         (long long)0x0302030203020302ull, (long long)0x0302030203020302ull,
                         (long long)0x0100010001000100ull, (long long)0x0100010001000100ull);
    const __m512i b0 =
        _mm512_set4_epi64((long long)0x4000100004000100ull, (long long)0x0040001000040001ull,
                          (long long)0x4000100004000100ull, (long long)0x0040001000040001ull);
    const __m512i b1 = _mm512_add_epi16(b0, b0);
    for (uint32_t c = 0; c < D; c += 32, tb += 128) {
        uint64_t w;
        memcpy(&w, row + c / 4, 8);
        const __m512i v = _mm512_shuffle_epi8(_mm512_set1_epi64((long long)w), spread);
        const __mmask32 m0 = _mm512_test_epi16_mask(v, b0), m1 = _mm512_test_epi16_mask(v, b1);
        const __m512i lo =
            _mm512_mask_blend_epi16(m0, _mm512_loadu_si512(tb), _mm512_loadu_si512(tb + 32));
        const __m512i hi =
            _mm512_mask_blend_epi16(m0, _mm512_loadu_si512(tb + 64), _mm512_loadu_si512(tb + 96));
        kern_st512(r + c, _mm512_mask_blend_epi16(m1, lo, hi), nt);
    }
}

/* The key section in memory order of the raw rows (as the AVX2 decoder, for the same reason:
 * front to back streams; down a channel's column strides by H * D halves a row). scratch:
 * 2 * H * D floats, the tables of a group for every head. */
K5I void kivi5_k_dec(int bits, uint32_t out, const int nt, const uint8_t *sect,
                     const struct kern_layout *lay, uint16_t *raw, float *scratch)
{
    const uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens;
    const uint32_t rb = kern_kivi_row_bytes(D, bits);
    const uint64_t hb = kern_kivi_k_head_bytes(D, T, bits), HD = (uint64_t)H * D;
    const uint32_t fgb = kern_kivi_k_group_bytes(D, KERN_GROUP, bits);
    uint16_t *tab = (uint16_t *)scratch;       /* 2-bit: [H * D / 32][4][32] halves */
    float *scf = scratch, *mnf = scratch + HD; /* 4-bit: [H * D] each, even/odd per 32 */
    for (uint32_t t0 = 0; t0 < T; t0 += KERN_GROUP) {
        const uint32_t rows = T - t0 < KERN_GROUP ? T - t0 : KERN_GROUP;
        for (uint32_t h = 0; h < H; h++) {
            const uint8_t *g = sect + h * hb + (uint64_t)(t0 / KERN_GROUP) * fgb;
            for (uint32_t c = 0; c < D; c += 32) {
                const __m512 s0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + 2 * c)));
                const __m512 s1 =
                    _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + 2 * c + 32)));
                const __m512 m0 =
                    _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + 2 * D + 2 * c)));
                const __m512 m1 =
                    _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + 2 * D + 2 * c + 32)));
                const uint64_t ch = (uint64_t)h * D + c;
                if (bits == 4) {
                    _mm512_storeu_ps(scf + ch, _mm512_permutex2var_ps(s0, KIVI5_EVEN, s1));
                    _mm512_storeu_ps(scf + ch + 16, _mm512_permutex2var_ps(s0, KIVI5_ODD, s1));
                    _mm512_storeu_ps(mnf + ch, _mm512_permutex2var_ps(m0, KIVI5_EVEN, m1));
                    _mm512_storeu_ps(mnf + ch + 16, _mm512_permutex2var_ps(m0, KIVI5_ODD, m1));
                    continue;
                }
                for (int q = 0; q < 4; q++) {
                    const __m512 fq = _mm512_set1_ps((float)q);
                    const __m256i t0h =
                        kern_half16_512(_mm512_add_ps(_mm512_mul_ps(fq, s0), m0), out);
                    const __m256i t1h =
                        kern_half16_512(_mm512_add_ps(_mm512_mul_ps(fq, s1), m1), out);
                    _mm512_storeu_si512(tab + 4 * ch + 32 * q,
                                        _mm512_inserti64x4(_mm512_castsi256_si512(t0h), t1h, 1));
                }
            }
        }
        uint16_t *r = raw + (uint64_t)t0 * HD;
        for (uint32_t t = 0; t < rows; t++)
            for (uint32_t h = 0; h < H; h++, r += D) {
                const uint8_t *row =
                    sect + h * hb + (uint64_t)(t0 / KERN_GROUP) * fgb + 4 * D + (uint64_t)t * rb;
                if (bits == 2)
                    kivi5_k2_row(row, tab + 4 * (uint64_t)h * D, r, D, nt);
                else
                    kivi5_k4_row(row, scf + (uint64_t)h * D, mnf + (uint64_t)h * D, r, D, out, nt);
            }
    }
}

/* One section's loop for (bits, kind, output dtype, stores), each its own code. */
K5I void kivi5_dec(const int bits, const int is_v, const uint32_t out, const int nt,
                   const uint8_t *sect, const struct kern_layout *lay, uint16_t *raw,
                   float *scratch)
{
    if (is_v)
        kivi5_v_dec(bits, out, nt, sect, lay, raw);
    else
        kivi5_k_dec(bits, out, nt, sect, lay, raw, scratch);
}

#define KIVI5_NT(b, v, o)                                                                          \
    do {                                                                                           \
        if (nt == 2)                                                                               \
            kivi5_dec(b, v, o, 2, sect, lay, raw, scratch);                                        \
        else if (nt == 1)                                                                          \
            kivi5_dec(b, v, o, 1, sect, lay, raw, scratch);                                        \
        else                                                                                       \
            kivi5_dec(b, v, o, 0, sect, lay, raw, scratch);                                        \
    } while (0)
#define KIVI5_OUT(b, v)                                                                            \
    do {                                                                                           \
        if (out == KERN_DTYPE_BF16)                                                                \
            KIVI5_NT(b, v, KERN_DTYPE_BF16);                                                       \
        else                                                                                       \
            KIVI5_NT(b, v, KERN_DTYPE_FP16);                                                       \
    } while (0)

K5 int kern_kivi512_dec(int bits, int is_v, const uint8_t *sect, const struct kern_layout *lay,
                        void *raw, uint32_t out, float *scratch)
{
    if ((bits != 2 && bits != 4) || lay->head_dim % 32)
        return 0;
    /* every store is at a multiple of 64 bytes from raw (D % 32 == 0) */
    const int nt = kern_st512_mode(raw, lay);
    if (is_v && bits == 4)
        KIVI5_OUT(4, 1);
    else if (is_v)
        KIVI5_OUT(2, 1);
    else if (bits == 4)
        KIVI5_OUT(4, 0);
    else
        KIVI5_OUT(2, 0);
#undef KIVI5_OUT
#undef KIVI5_NT
    if (nt)
        _mm_sfence(); /* the streamed lines are ordered before whatever the caller does next */
    return 1;
}

/* ---- values' encode: sixteen consecutive groups at a time, the groups in the lanes ------ */

/* Whether any of the 512 raw fp16 values at r is NaN, Inf or past the fp16 range (a bf16
 * input always takes the sanitizing load): an unsigned max of the halves without their sign. */
K5I int kivi5_clean512(const uint16_t *r)
{
    __m512i acc = _mm512_setzero_si512();
    for (int i = 0; i < 16; i++)
        acc = _mm512_max_epu16(
            acc, _mm512_and_si512(_mm512_loadu_si512(r + 32 * i), _mm512_set1_epi16(0x7fff)));
    return _mm512_cmpgt_epu16_mask(acc, _mm512_set1_epi16(0x7bff)) == 0;
}

/* Groups 16 at a time (their 512 raw values at r, contiguous), prefetching the data `ahead`
 * halves on into L2 as the AVX2 encoder does (the next section). */
K5I void kivi5_v_enc(const int bits, const uint16_t *r, const uint32_t dtype, uint64_t n16,
                     uint8_t *blk, uint64_t ahead)
{
    const uint32_t gb = kern_kivi_v_group_bytes(bits);
    for (uint64_t i = 0; i < n16; i += 16, r += 512, blk += 16 * gb) {
        __m512 x[32];
        __m512i h[16];
        for (int k = 0; k < 16; k++)
            _mm_prefetch((const char *)(r + ahead + 32 * k), _MM_HINT_T1);
        if (dtype == KERN_DTYPE_FP16 && kivi5_clean512(r)) {
            kivi5_t16x16_halves(r, 32, h);
            kivi5_t16x16_halves(r + 16, 32, h + 8);
            kivi5_groups_enc16(NULL, h, blk, gb, bits);
        } else {
            kivi5_load_t16x16(r, 32, dtype, 0, x);
            kivi5_load_t16x16(r + 16, 32, dtype, 0, x + 16);
            kivi5_groups_enc16(x, NULL, blk, gb, bits);
        }
    }
}

K5 uint64_t kern_kivi512_enc_groups(int bits, const void *raw, uint32_t dtype, uint64_t n,
                                    uint8_t *blk)
{
    const uint64_t n16 = n / 16 * 16;
    if (bits == 4 && dtype == KERN_DTYPE_BF16)
        kivi5_v_enc(4, raw, KERN_DTYPE_BF16, n16, blk, 32 * n);
    else if (bits == 4)
        kivi5_v_enc(4, raw, KERN_DTYPE_FP16, n16, blk, 32 * n);
    else if (dtype == KERN_DTYPE_BF16)
        kivi5_v_enc(2, raw, KERN_DTYPE_BF16, n16, blk, 32 * n);
    else
        kivi5_v_enc(2, raw, KERN_DTYPE_FP16, n16, blk, 32 * n);
    return n16;
}

/* ---- keys' encode: per 32-token group and head, 32 channels at a time ------------------ */

/* Whether any of the n raw values at r (n a multiple of 32) needs sanitizing: NaN or Inf
 * (fp16), or a magnitude past the fp16 range (bf16); as the AVX2 encoder's test. */
K5I int kivi5_needs_sanitize(const uint16_t *r, uint32_t n, uint32_t dtype)
{
    const __m512i lim = _mm512_set1_epi16(dtype == KERN_DTYPE_BF16 ? 0x477f : 0x7bff);
    __m512i acc = _mm512_setzero_si512();
    for (uint32_t i = 0; i < n; i += 32)
        acc = _mm512_max_epu16(
            acc, _mm512_and_si512(_mm512_loadu_si512(r + i), _mm512_set1_epi16(0x7fff)));
    return _mm512_cmpgt_epu16_mask(acc, lim) != 0;
}

/* Sixteen raw values as floats, sanitized (kern_sanitize) where san. */
K5I __m512 kivi5_load16(const uint16_t *p, uint32_t dtype, int san)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)p);
    const __m512 f = dtype == KERN_DTYPE_BF16
                         ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16))
                         : _mm512_cvtph_ps(v);
    return san ? kivi5_sanitize16(f) : f;
}

/* A row's 32 values (a: channels 0-15, b: 16-31): their squares summed into the eight lanes
 * at ss in the AVX2 encoder's order, ((c0-7)^2 + (c8-15)^2) + ((c16-23)^2 + (c24-31)^2). */
K5I void kivi5_k_ss(__m512 a, __m512 b, float *ss)
{
    const __m512 a2 = _mm512_mul_ps(a, a), b2 = _mm512_mul_ps(b, b);
    const __m256 sa = _mm256_add_ps(_mm512_castps512_ps256(a2), _mm512_extractf32x8_ps(a2, 1));
    const __m256 sb = _mm256_add_ps(_mm512_castps512_ps256(b2), _mm512_extractf32x8_ps(b2, 1));
    _mm256_store_ps(ss, _mm256_add_ps(_mm256_load_ps(ss), _mm256_add_ps(sa, sb)));
}

/* v_hsum of kern_avx2.h: the same sums in the same order. */
K5I float kivi5_hsum8(__m256 v)
{
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* 32 channels' codes of one row (lo: channels 0-15, hi: 16-31) packed into 4 * bits bytes:
 * the truncation of (x - min) * id + 0.5 (at least 0 and far below 256, see v_kivi_code() of
 * kern_avx2_kivi.h), narrowed to bytes, clamped to qmax, and neighbours merged by
 * multiply-adds as v_kivi_pack32() does. */
K5I void kivi5_k_codes32(__m512 x0, __m512 x1, __m512 mn0, __m512 mn1, __m512 id0, __m512 id1,
                         int bits, uint8_t *dst)
{
    const __m512 half = _mm512_set1_ps(0.5f);
    const __m512i q0 =
        _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(x0, mn0), id0), half));
    const __m512i q1 =
        _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(x1, mn1), id1), half));
    __m256i p = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(q0)),
                                        _mm512_cvtepi32_epi8(q1), 1);
    p = _mm256_min_epu8(p, _mm256_set1_epi8((char)((1 << bits) - 1)));
    if (bits == 4) {
        __m256i w = _mm256_maddubs_epi16(p, _mm256_set1_epi16(0x1001));
        _mm_storeu_si128((__m128i *)dst, _mm256_cvtepi16_epi8(w));
    } else {
        __m256i w = _mm256_maddubs_epi16(p, _mm256_set1_epi16(0x0401));
        w = _mm256_madd_epi16(w, _mm256_set1_epi32(0x00100001));
        _mm_storel_epi64((__m128i *)dst, _mm256_cvtepi32_epi8(w));
    }
}

/* The AVX2 encoder's kivi_k_sect() (kern_avx2_enc.c) on 16 lanes: per group of 32 tokens and
 * per head, 32 channels at a time, the rows converted once into a 4 KiB buffer while their
 * ranges are taken in two registers, the channels' scale and min, then each row's codes from
 * the buffer; key statistics (kmin non-NULL) as there, in the same order. */
K5I void kivi5_k_enc(const int bits, const uint32_t dtype, const uint16_t *raw,
                     const struct kern_layout *lay, uint8_t *sect, float *kmin, float *kmax,
                     float *knorm)
{
    const uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens;
    const uint32_t rb = kern_kivi_row_bytes(D, bits);
    const uint64_t hb = kern_kivi_k_head_bytes(D, T, bits), HD = (uint64_t)H * D;
    const __m512 qmax = _mm512_set1_ps((float)((1 << bits) - 1)), zero = _mm512_setzero_ps();
    __attribute__((aligned(64))) float xb[KERN_GROUP][32];
    for (uint32_t t0 = 0; t0 < T; t0 += KERN_GROUP) {
        const uint32_t rows = T - t0 < KERN_GROUP ? T - t0 : KERN_GROUP;
        const uint32_t gb = kern_kivi_k_group_bytes(D, rows, bits);
        const uint64_t goff =
            (uint64_t)(t0 / KERN_GROUP) * kern_kivi_k_group_bytes(D, KERN_GROUP, bits);
        const uint16_t *rg = raw + (uint64_t)t0 * HD;
        int san = 0;
        for (uint32_t i = 0; i < rows * H && !san; i++)
            san = kivi5_needs_sanitize(rg + (uint64_t)i * D, D, dtype);
        for (uint32_t h = 0; h < H; h++) {
            uint8_t *g = sect + h * hb + goff;
            __attribute__((aligned(32))) float ssb[KERN_GROUP][8];
            if (kmin)
                for (uint32_t r = 0; r < rows; r++)
                    _mm256_store_ps(ssb[r], _mm256_setzero_ps());
            for (uint32_t c = 0; c < D; c += 32) {
                const uint16_t *p = rg + (uint64_t)h * D + c;
                /* the new value is the first operand of min/max: on a tie (+0 and -0) the
                 * earlier row's value stays, as in the reference */
                __m512 lo0 = kivi5_load16(p, dtype, san), lo1 = kivi5_load16(p + 16, dtype, san);
                __m512 hi0 = lo0, hi1 = lo1;
                _mm512_store_ps(&xb[0][0], lo0);
                _mm512_store_ps(&xb[0][16], lo1);
                if (kmin)
                    kivi5_k_ss(lo0, lo1, ssb[0]);
                for (uint32_t r = 1; r < rows; r++) {
                    p += HD;
                    const __m512 v0 = kivi5_load16(p, dtype, san),
                                 v1 = kivi5_load16(p + 16, dtype, san);
                    _mm512_store_ps(&xb[r][0], v0);
                    _mm512_store_ps(&xb[r][16], v1);
                    lo0 = _mm512_min_ps(v0, lo0);
                    hi0 = _mm512_max_ps(v0, hi0);
                    lo1 = _mm512_min_ps(v1, lo1);
                    hi1 = _mm512_max_ps(v1, hi1);
                    if (kmin)
                        kivi5_k_ss(v0, v1, ssb[r]);
                }
                if (kmin) {
                    /* the group's extremes fold into the block's (an earlier group's value
                     * stays on a tie) */
                    float *mn = kmin + (uint64_t)h * D + c, *mx = kmax + (uint64_t)h * D + c;
                    _mm512_storeu_ps(mn, _mm512_min_ps(lo0, _mm512_loadu_ps(mn)));
                    _mm512_storeu_ps(mn + 16, _mm512_min_ps(lo1, _mm512_loadu_ps(mn + 16)));
                    _mm512_storeu_ps(mx, _mm512_max_ps(hi0, _mm512_loadu_ps(mx)));
                    _mm512_storeu_ps(mx + 16, _mm512_max_ps(hi1, _mm512_loadu_ps(mx + 16)));
                }
                const int rne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
                const __m256i mh0 = _mm512_cvtps_ph(lo0, rne), mh1 = _mm512_cvtps_ph(lo1, rne);
                const __m256i sh0 = _mm512_cvtps_ph(_mm512_div_ps(_mm512_sub_ps(hi0, lo0), qmax),
                                                    rne),
                              sh1 = _mm512_cvtps_ph(_mm512_div_ps(_mm512_sub_ps(hi1, lo1), qmax),
                                                    rne);
                _mm256_storeu_si256((__m256i *)(g + 2 * c), sh0);
                _mm256_storeu_si256((__m256i *)(g + 2 * c + 32), sh1);
                _mm256_storeu_si256((__m256i *)(g + 2 * D + 2 * c), mh0);
                _mm256_storeu_si256((__m256i *)(g + 2 * D + 2 * c + 32), mh1);
                const __m512 sc0 = _mm512_cvtph_ps(sh0), sc1 = _mm512_cvtph_ps(sh1);
                const __m512 id0 = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(sc0, zero, _CMP_NEQ_UQ),
                                                       _mm512_set1_ps(1.0f), sc0),
                             id1 = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(sc1, zero, _CMP_NEQ_UQ),
                                                       _mm512_set1_ps(1.0f), sc1);
                const __m512 mf0 = _mm512_cvtph_ps(mh0), mf1 = _mm512_cvtph_ps(mh1);
                uint8_t *out = g + 4 * D + c * bits / 8;
                p = rg + (uint64_t)h * D + c;
                for (uint32_t r = 0; r < rows; r++, out += rb, p += HD) {
                    /* the next group (or section) into L2 while this one is coded */
                    _mm_prefetch((const char *)(p + (uint64_t)rows * HD), _MM_HINT_T1);
                    kivi5_k_codes32(_mm512_load_ps(&xb[r][0]), _mm512_load_ps(&xb[r][16]), mf0, mf1,
                                    id0, id1, bits, out);
                }
            }
            memset(g + 4 * D + (uint64_t)rows * rb, 0, gb - 4 * D - rows * rb);
            if (kmin)
                for (uint32_t r = 0; r < rows; r++)
                    knorm[h] += sqrtf(kivi5_hsum8(_mm256_load_ps(ssb[r])));
        }
    }
}

K5 int kern_kivi512_enc_k(int bits, const void *raw, const struct kern_layout *lay, uint8_t *sect,
                          float *kmin, float *kmax, float *knorm)
{
    if ((bits != 2 && bits != 4) || lay->head_dim % 32)
        return 0;
    const int bf = lay->dtype == KERN_DTYPE_BF16;
    if (bits == 4 && bf)
        kivi5_k_enc(4, KERN_DTYPE_BF16, raw, lay, sect, kmin, kmax, knorm);
    else if (bits == 4)
        kivi5_k_enc(4, KERN_DTYPE_FP16, raw, lay, sect, kmin, kmax, knorm);
    else if (bf)
        kivi5_k_enc(2, KERN_DTYPE_BF16, raw, lay, sect, kmin, kmax, knorm);
    else
        kivi5_k_enc(2, KERN_DTYPE_FP16, raw, lay, sect, kmin, kmax, knorm);
    return 1;
}
