/*
 * kern_kivi512.h — KIVI value groups with AVX-512 (internal): their decode, which KIVI's value
 * sections (kern_kivi512.c) and ROT's values between its key rows (kern_rot512.c) share, and
 * their encode sixteen groups at a time with the groups in the lanes, which ROT's key encoder
 * (kern_rot512.c, a group per token) and KIVI's value encoder (kern_kivi512.c, sixteen
 * consecutive groups) share.
 *
 * DESIGN
 * Decode: a group has at most 16 distinct outputs, computed once per group as halves; every
 * code picks its half by a 16-bit permute (kern_kivi512.c has the whole story).
 * Encode:
 * Sixteen groups' 32 values are 32 registers, lane i group i (clean fp16: 16 registers of
 * halves, each value converted where it is used, so the floats do not spill, and the
 * extremes taken on the halves as integers ordered as their values): every group's
 * extremes, parameters and codes are lane-wise, with no reduction across lanes; the
 * reference's operations per lane, in its order (the including file is built with
 * -ffp-contract=off).
 * The codes go back to each group's bytes by packs and in-lane shuffles.
 */
#ifndef KVC_KERN_KIVI512_H
#define KVC_KERN_KIVI512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kern_fmt.h"
#include "kernels/kern_st512.h"

#define K5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))
#define K5I __attribute__((always_inline)) K5 static inline

/* kern_sanitize on sixteen lanes: NaN to 0, clamped to the fp16 range. */
K5I __m512 kivi5_sanitize16(__m512 x)
{
    x = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, x, _CMP_ORD_Q), x);
    x = _mm512_min_ps(x, _mm512_set1_ps(KERN_FP16_MAX));
    return _mm512_max_ps(x, _mm512_set1_ps(-KERN_FP16_MAX));
}

/* ---- value groups' decode: [T][H][D / 32] groups of fp16 scale, fp16 min, 4 * bits bytes
 * of codes ---- */

/* A 4-bit group's sixteen outputs as halves (entries 0-15 of a vpermw table). */
K5I __m512i kivi5_tab4(const uint8_t *blk, uint32_t out)
{
    uint32_t w;
    memcpy(&w, blk, 4);
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)w));
    const __m512 sc = _mm512_broadcastss_ps(f), mn = _mm512_broadcastss_ps(_mm_movehdup_ps(f));
    const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_castsi256_si512(kern_half16_512(_mm512_add_ps(_mm512_mul_ps(q, sc), mn), out));
}

/* KIVI-4 group: byte i holds element 2i (low nibble) and 2i + 1 (high nibble). Each byte
 * widened to a dword and or-ed with itself shifted up by 12 has the element 2i code in the low
 * word's low nibble and the 2i + 1 code in the high word's; one and leaves the 32 indices. */
K5I void kivi5_v4_group(const uint8_t *blk, __m512i tab, uint16_t *r, const int nt)
{
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 4)));
    const __m512i idx = _mm512_and_si512(_mm512_or_si512(b, _mm512_slli_epi32(b, 12)),
                                         _mm512_set1_epi32(0x000f000f));
    kern_st512(r, _mm512_permutexvar_epi16(idx, tab), nt);
}

/* Four 2-bit groups' four outputs each as halves: entry 4g + q is group g's output q. */
K5I __m512i kivi5_tab2x4(const uint8_t *b0, const uint8_t *b1, const uint8_t *b2, const uint8_t *b3,
                         uint32_t out)
{
    uint32_t w[4];
    memcpy(&w[0], b0, 4);
    memcpy(&w[1], b1, 4);
    memcpy(&w[2], b2, 4);
    memcpy(&w[3], b3, 4);
    /* scale, min of group 0, of group 1, ... */
    const __m512 f = _mm512_castps256_ps512(
        _mm256_cvtph_ps(_mm_setr_epi32((int)w[0], (int)w[1], (int)w[2], (int)w[3])));
    const __m512 sc =
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6), f);
    const __m512 mn =
        _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7), f);
    const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    return _mm512_castsi256_si512(kern_half16_512(_mm512_add_ps(_mm512_mul_ps(q, sc), mn), out));
}

/* KIVI-2 group g (0-3) of a kivi5_tab2x4() table: byte i holds elements 4i .. 4i + 3 at bits
 * 0-1, 2-3, 4-5, 6-7. The eight code bytes in every 128-bit lane; word k of lane L (element
 * 8L + k) takes byte 2L + k / 4 by a shuffle, shifts it down by 2 (k % 4), keeps two bits and
 * adds the group's table offset. */
K5I void kivi5_v2_group(const uint8_t *blk, int g, __m512i tab, uint16_t *r, const int nt)
{
    const __m512i place =
        _mm512_set_epi64((long long)0x8007800780078007ull, (long long)0x8006800680068006ull,
                         (long long)0x8005800580058005ull, (long long)0x8004800480048004ull,
                         (long long)0x8003800380038003ull, (long long)0x8002800280028002ull,
                         (long long)0x8001800180018001ull, (long long)0x8000800080008000ull);
    const __m512i sh = _mm512_set1_epi64((long long)0x0006000400020000ull);
    uint64_t c;
    memcpy(&c, blk + 4, 8);
    __m512i v = _mm512_shuffle_epi8(_mm512_set1_epi64((long long)c), place);
    v = _mm512_srlv_epi16(v, sh);
    /* (v & 3) | 4g */
    const __m512i idx =
        _mm512_ternarylogic_epi32(v, _mm512_set1_epi16(3), _mm512_set1_epi16((short)(4 * g)), 0xea);
    kern_st512(r, _mm512_permutexvar_epi16(idx, tab), nt);
}

/* n value groups at blk (bits 2 or 4) decoded into their 32 n halves at r, stored by mode nt
 * (kern_st512.h), without the fence: KIVI's value sections (kern_kivi512.c) and ROT's values
 * between its key rows (kern_rot512.c). */
K5I void kivi5_v_groups(const int bits, const uint32_t out, const int nt, const uint8_t *blk,
                        const uint64_t n, uint16_t *r)
{
    const uint32_t gb = kern_kivi_v_group_bytes(bits);
    uint64_t i = 0;
    if (bits == 4) {
        for (; i < n; i++, blk += gb, r += 32)
            kivi5_v4_group(blk, kivi5_tab4(blk, out), r, nt);
        return;
    }
    for (; i + 4 <= n; i += 4, blk += 4 * gb, r += 128) {
        const __m512i tab = kivi5_tab2x4(blk, blk + gb, blk + 2 * gb, blk + 3 * gb, out);
        kivi5_v2_group(blk, 0, tab, r, nt);
        kivi5_v2_group(blk + gb, 1, tab, r + 32, nt);
        kivi5_v2_group(blk + 2 * gb, 2, tab, r + 64, nt);
        kivi5_v2_group(blk + 3 * gb, 3, tab, r + 96, nt);
    }
    for (; i < n; i++, blk += gb, r += 32)
        kivi5_v2_group(blk, 0, kivi5_tab2x4(blk, blk, blk, blk, out), r, nt);
}

/* ---- value groups' encode ---- */

/* Sixteen rows' 16 halves (ROT: tokens' channels; KIVI values: groups' elements; at r, the
 * rows ts apart) transposed into 8 registers: tokens i and i + 8 share a register; the 8 x 8
 * transposes of the halves in each 128-bit lane leave channel k of tokens 0-7 and 8-15 in
 * lanes 0 and 2 (8 + k: 1 and 3) of d[k]. */
K5I void kivi5_t16x16_halves(const uint16_t *r, uint64_t ts, __m512i *d)
{
    __m512i a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(r + i * ts))),
            _mm256_loadu_si256((const __m256i *)(r + (i + 8) * ts)), 1);
    const __m512i b0 = _mm512_unpacklo_epi16(a[0], a[1]), b1 = _mm512_unpackhi_epi16(a[0], a[1]);
    const __m512i b2 = _mm512_unpacklo_epi16(a[2], a[3]), b3 = _mm512_unpackhi_epi16(a[2], a[3]);
    const __m512i b4 = _mm512_unpacklo_epi16(a[4], a[5]), b5 = _mm512_unpackhi_epi16(a[4], a[5]);
    const __m512i b6 = _mm512_unpacklo_epi16(a[6], a[7]), b7 = _mm512_unpackhi_epi16(a[6], a[7]);
    const __m512i c0 = _mm512_unpacklo_epi32(b0, b2), c1 = _mm512_unpackhi_epi32(b0, b2);
    const __m512i c2 = _mm512_unpacklo_epi32(b4, b6), c3 = _mm512_unpackhi_epi32(b4, b6);
    const __m512i c4 = _mm512_unpacklo_epi32(b1, b3), c5 = _mm512_unpackhi_epi32(b1, b3);
    const __m512i c6 = _mm512_unpacklo_epi32(b5, b7), c7 = _mm512_unpackhi_epi32(b5, b7);
    d[0] = _mm512_unpacklo_epi64(c0, c2);
    d[1] = _mm512_unpackhi_epi64(c0, c2);
    d[2] = _mm512_unpacklo_epi64(c1, c3);
    d[3] = _mm512_unpackhi_epi64(c1, c3);
    d[4] = _mm512_unpacklo_epi64(c4, c6);
    d[5] = _mm512_unpackhi_epi64(c4, c6);
    d[6] = _mm512_unpacklo_epi64(c5, c7);
    d[7] = _mm512_unpackhi_epi64(c5, c7);
}

/* Channel k (0-15) of kivi5_t16x16_halves()'s registers: its sixteen tokens' halves. */
K5I __m256i kivi5_t16_chan(const __m512i *d, const int k)
{
    return _mm512_castsi512_si256(k < 8 ? _mm512_shuffle_i64x2(d[k], d[k], 0x08)
                                        : _mm512_shuffle_i64x2(d[k % 8], d[k % 8], 0x0d));
}

/* The same rows as 16 registers of floats, one per channel, lane i token i, sanitized as
 * kern_ext_value unless clean (fp16 input with no NaN, Inf or value past the range). */
K5I void kivi5_load_t16x16(const uint16_t *r, uint64_t ts, uint32_t dtype, const int clean,
                           __m512 *x)
{
    __m512i d[8];
    kivi5_t16x16_halves(r, ts, d);
#pragma GCC unroll 16
    for (int k = 0; k < 16; k++) {
        const __m256i v = kivi5_t16_chan(d, k);
        if (clean)
            x[k] = _mm512_cvtph_ps(v);
        else
            x[k] = kivi5_sanitize16(
                dtype == KERN_DTYPE_BF16
                    ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16))
                    : _mm512_cvtph_ps(v));
    }
}

/* Value j (0-31) of sixteen groups: x[j], or with h (clean fp16 halves, the 2 x 8 registers
 * of kivi5_t16x16_halves() for values 0-15 and 16-31) converted where it is used, which
 * keeps 16 registers live instead of 32 (the 32 floats and the constants spilled). */
K5I __m512 kivi5_x(const __m512 *x, const __m512i *h, const int j)
{
    return h ? _mm512_cvtph_ps(kivi5_t16_chan(h + 8 * (j / 16), j % 16)) : x[j];
}

/* Finite halves as 16-bit integers in the order of their values (the magnitude's bits
 * inverted where the sign is set: -0 below +0), and back: its own inverse. */
K5I __m512i kivi5_hkey(__m512i h)
{
    /* h ^ (sign ? 0x7fff : 0) */
    return _mm512_ternarylogic_epi32(h, _mm512_srai_epi16(h, 15), _mm512_set1_epi16(0x7fff), 0x78);
}

/* The codes of channels a, b, c, d (lane i token i) as bytes: in 128-bit lane L, byte 4k + i
 * the code of the k-th channel for token 4L + i, clamped to [0, qmax] (as kern_rot.c's
 * rot_codes4: the truncation of (x - min) * id + 0.5, the packs' saturation, a byte min). */
K5I __m512i kivi5_codes16(const __m512 *x, const __m512i *h, int a, int b, int c, int d, __m512 vm,
                          __m512 vi, __m512i qb)
{
    const __m512 half = _mm512_set1_ps(0.5f);
#define KIVI5_Q(j)                                                                                 \
    _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(kivi5_x(x, h, j), vm), vi), half))
    const __m512i w = _mm512_packs_epi32(KIVI5_Q(a), KIVI5_Q(b)),
                  z = _mm512_packs_epi32(KIVI5_Q(c), KIVI5_Q(d));
#undef KIVI5_Q
    return _mm512_min_epu8(_mm512_packus_epi16(w, z), qb);
}

/* Sixteen tokens' group (x: its 32 channels, lane i token i, scaled and clamped; or h, as
 * kivi5_x) to their blocks at o0 + i * os: kern_rot.c's rot_groups_enc8 on sixteen lanes, the
 * parameters lane-wise
 * (kern_kivi_params: min, (max - min) / qmax to fp16 and back, 1 / scale unless 0), the
 * codes per channel, the bytes put back in token order per 128-bit lane (tokens 4L .. 4L + 3).
 * A group whose minimum or maximum is zero is encoded by the reference (the lanes' minimum
 * keeps either of +0 and -0, the reference the first). */
K5I void kivi5_groups_enc16(const __m512 *x, const __m512i *h, uint8_t *o0, const uint64_t os,
                            const int bits)
{
    /* lane i's block: o0 + i * os (a base and a stride: an array of sixteen pointers went
     * through the stack, two memory operations a store) */
#define KIVI5_O(i) (o0 + (uint64_t)(i) * os)
    __m512 mn, mx;
    if (h) {
        /* the extremes of the halves as 16-bit integers, each register's halves as they lie
         * (lanes 0-7 value k, 8-15 value 8 + k of tokens 0-7, 16-31 the same of tokens 8-15),
         * folded into token order at the end: kivi5_hkey orders finite halves as their values
         * (the extremes of exact values in any order; -0 below +0, and a zero extreme goes to
         * the reference), with no conversion to floats and on the integer pipes */
        __m512i kn = kivi5_hkey(h[0]), kx = kn;
#pragma GCC unroll 16
        for (int k = 1; k < 16; k++) {
            const __m512i y = kivi5_hkey(h[k]);
            kn = _mm512_min_epi16(kn, y);
            kx = _mm512_max_epi16(kx, y);
        }
        kn = _mm512_min_epi16(kn, _mm512_shuffle_i64x2(kn, kn, 0xb1));
        kx = _mm512_max_epi16(kx, _mm512_shuffle_i64x2(kx, kx, 0xb1));
        mn = _mm512_cvtph_ps(_mm512_castsi512_si256(kivi5_hkey(_mm512_shuffle_i64x2(kn, kn, 0x08))));
        mx = _mm512_cvtph_ps(_mm512_castsi512_si256(kivi5_hkey(_mm512_shuffle_i64x2(kx, kx, 0x08))));
    } else {
        __m512 mn1 = x[1], mx1 = x[1];
        mn = x[0];
        mx = x[0];
#pragma GCC unroll 16
        for (int j = 2; j < 32; j += 2) {
            mn = _mm512_min_ps(mn, x[j]);
            mx = _mm512_max_ps(mx, x[j]);
            mn1 = _mm512_min_ps(mn1, x[j + 1]);
            mx1 = _mm512_max_ps(mx1, x[j + 1]);
        }
        mn = _mm512_min_ps(mn, mn1);
        mx = _mm512_max_ps(mx, mx1);
    }
    const __m512 qmax = _mm512_set1_ps((float)((1 << bits) - 1)), zero = _mm512_setzero_ps();
    const __m256i hmn = _mm512_cvtps_ph(mn, _MM_FROUND_TO_NEAREST_INT),
                  hsc = _mm512_cvtps_ph(_mm512_div_ps(_mm512_sub_ps(mx, mn), qmax),
                                        _MM_FROUND_TO_NEAREST_INT);
    const __m512 vm = _mm512_cvtph_ps(hmn), sc = _mm512_cvtph_ps(hsc);
    const __m512 vi =
        _mm512_maskz_div_ps(_mm512_cmp_ps_mask(sc, zero, _CMP_NEQ_UQ), _mm512_set1_ps(1.0f), sc);
    const unsigned zm =
        _mm512_cmp_ps_mask(mn, zero, _CMP_EQ_OQ) | _mm512_cmp_ps_mask(mx, zero, _CMP_EQ_OQ);
    /* the headers, scale then min: dword i of hdr token i */
    uint32_t hdr[16];
    _mm512_storeu_si512(hdr, _mm512_or_si512(_mm512_cvtepu16_epi32(hsc),
                                             _mm512_slli_epi32(_mm512_cvtepu16_epi32(hmn), 16)));
    const __m512i qb = _mm512_set1_epi8((char)((1 << bits) - 1));
    const __m512i tr =
        _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    if (bits == 4) {
        __m512i p[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const int c = 8 * k;
            const __m512i lo = kivi5_codes16(x, h, c, c + 2, c + 4, c + 6, vm, vi, qb),
                          hi = kivi5_codes16(x, h, c + 1, c + 3, c + 5, c + 7, vm, vi, qb);
            p[k] = _mm512_shuffle_epi8(_mm512_or_si512(lo, _mm512_slli_epi16(hi, 4)), tr);
        }
        const __m512i e0 = _mm512_unpacklo_epi32(p[0], p[1]),
                      e1 = _mm512_unpackhi_epi32(p[0], p[1]);
        const __m512i e2 = _mm512_unpacklo_epi32(p[2], p[3]),
                      e3 = _mm512_unpackhi_epi32(p[2], p[3]);
        const __m512i f[4] = {_mm512_unpacklo_epi64(e0, e2), _mm512_unpackhi_epi64(e0, e2),
                              _mm512_unpacklo_epi64(e1, e3), _mm512_unpackhi_epi64(e1, e3)};
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            _mm_storeu_si128((__m128i *)(KIVI5_O(i) + 4), _mm512_castsi512_si128(f[i]));
            _mm_storeu_si128((__m128i *)(KIVI5_O(4 + i) + 4), _mm512_extracti32x4_epi32(f[i], 1));
            _mm_storeu_si128((__m128i *)(KIVI5_O(8 + i) + 4), _mm512_extracti32x4_epi32(f[i], 2));
            _mm_storeu_si128((__m128i *)(KIVI5_O(12 + i) + 4), _mm512_extracti32x4_epi32(f[i], 3));
        }
    } else {
        __m512i p[2];
#pragma GCC unroll 2
        for (int k = 0; k < 2; k++) {
            const int c = 16 * k;
            const __m512i b0 = kivi5_codes16(x, h, c, c + 4, c + 8, c + 12, vm, vi, qb),
                          b1 = kivi5_codes16(x, h, c + 1, c + 5, c + 9, c + 13, vm, vi, qb),
                          b2 = kivi5_codes16(x, h, c + 2, c + 6, c + 10, c + 14, vm, vi, qb),
                          b3 = kivi5_codes16(x, h, c + 3, c + 7, c + 11, c + 15, vm, vi, qb);
            const __m512i v = _mm512_or_si512(
                _mm512_or_si512(b0, _mm512_slli_epi16(b1, 2)),
                _mm512_or_si512(_mm512_slli_epi16(b2, 4), _mm512_slli_epi16(b3, 6)));
            p[k] = _mm512_shuffle_epi8(v, tr);
        }
        /* token 4L + 2m in the low 8 bytes of lane L of f[m], 4L + 2m + 1 in the high */
        const __m512i f[2] = {_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1])};
        /* (the lanes by name: extracti32x4 takes an immediate, which an unrolled loop gives
         * only when optimized) */
#pragma GCC unroll 2
        for (int m = 0; m < 2; m++) {
            const __m128i l[4] = {_mm512_castsi512_si128(f[m]), _mm512_extracti32x4_epi32(f[m], 1),
                                  _mm512_extracti32x4_epi32(f[m], 2),
                                  _mm512_extracti32x4_epi32(f[m], 3)};
#pragma GCC unroll 4
            for (int L = 0; L < 4; L++) {
                _mm_storel_epi64((__m128i *)(KIVI5_O(4 * L + 2 * m) + 4), l[L]);
                _mm_storel_epi64((__m128i *)(KIVI5_O(4 * L + 2 * m + 1) + 4),
                                 _mm_unpackhi_epi64(l[L], l[L]));
            }
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        memcpy(KIVI5_O(i), &hdr[i], 4);
    for (int i = 0; zm && i < 16; i++) {
        if (!(zm >> i & 1))
            continue;
        float f[32], lane[16];
        for (int j = 0; j < 32; j++) {
            _mm512_storeu_ps(lane, kivi5_x(x, h, j));
            f[j] = lane[i];
        }
        kern_kivi_v_enc(f, 32, KIVI5_O(i), bits);
    }
}
#undef KIVI5_O


#endif
