/*
 * kern_st512.h — decoded values into the raw rows with AVX-512: rounded to the output
 * dtype, and 64 bytes stored or streamed (internal). The AVX-512 decoders (kern_kivi512.c,
 * kern_merge512.c, kern_lowrank512.c, kern_q8512.c) share it.
 *
 * DESIGN
 * A decode into at least KERN_NT_MIN_BYTES of raw output (kern_cpu.h) whose arithmetic is
 * short is bound by its memory traffic, and a third of that traffic is the read for
 * ownership of each destination line: non-temporal stores skip it. A 64-byte store streams
 * whole where the destination is 64-byte aligned and as four 16-byte stores where it is
 * 16-byte aligned (the write-combining buffer still fills the line); at any other alignment
 * the decoder stores through the cache. The decoders call kern_st512() with a mode that is
 * a constant after inlining and end a streamed decode with _mm_sfence(), so the streamed
 * lines are ordered before whatever the caller does next.
 */
#ifndef KVC_KERN_ST512_H
#define KVC_KERN_ST512_H

#include <immintrin.h>
#include <stdint.h>

#include "kernels/kern_cpu.h"

#define KERN_ST512_AI                                                                              \
    __attribute__((always_inline,                                                                  \
                   target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c"))) static inline

/* How kern_st512() writes a section of a block of layout lay decoded at raw, every store a
 * multiple of 64 bytes from raw: 0 stored, 1 streamed 16 bytes at a time, 2 streamed whole. */
static inline int kern_st512_mode(const void *raw, const struct kern_layout *lay)
{
    const uintptr_t a = (uintptr_t)raw;
    if (kern_raw_size(lay) < KERN_NT_MIN_BYTES)
        return 0;
    return (a & 63) == 0 ? 2 : (a & 15) == 0 ? 1 : 0;
}

/* Sixteen floats as halves of dtype, rounded as kern_store: fp16 by F16C (kern_f2h's
 * rounding), bf16 to nearest even with NaN kept quiet as kern_f2bf (a section's bytes are
 * not trusted to decode to numbers). */
KERN_ST512_AI __m256i kern_half16_512(__m512 x, uint32_t dtype)
{
    if (dtype == KERN_DTYPE_FP16)
        return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i u = _mm512_castps_si512(x), hi = _mm512_srli_epi32(u, 16);
    const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i rn = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    rn = _mm512_mask_mov_epi32(rn, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),
                               _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(rn);
}

/* v into the 64 bytes at r, by mode nt (kern_st512_mode()). */
KERN_ST512_AI void kern_st512(void *r, __m512i v, const int nt)
{
    if (nt == 2) {
        _mm512_stream_si512(r, v);
    } else if (nt == 1) {
        __m128i *q = r;
        _mm_stream_si128(q, _mm512_castsi512_si128(v));
        _mm_stream_si128(q + 1, _mm512_extracti32x4_epi32(v, 1));
        _mm_stream_si128(q + 2, _mm512_extracti32x4_epi32(v, 2));
        _mm_stream_si128(q + 3, _mm512_extracti32x4_epi32(v, 3));
    } else {
        _mm512_storeu_si512(r, v);
    }
}

/* 32 floats as halves of dtype (kern_half16_512()) into the 64 bytes at r, lo's first, by
 * mode nt: whole (mode 2), or from the two 32-byte registers as they are (mode 1: four
 * 16-byte stores take two extracts from them, a merge and three from one 64-byte one). */
KERN_ST512_AI void kern_st512_halves(void *r, __m512 lo, __m512 hi, uint32_t dtype, const int nt)
{
    const __m256i a = kern_half16_512(lo, dtype), b = kern_half16_512(hi, dtype);
    if (nt == 2) {
        _mm512_stream_si512(r, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
    } else if (nt == 1) {
        __m128i *q = r;
        _mm_stream_si128(q, _mm256_castsi256_si128(a));
        _mm_stream_si128(q + 1, _mm256_extracti128_si256(a, 1));
        _mm_stream_si128(q + 2, _mm256_castsi256_si128(b));
        _mm_stream_si128(q + 3, _mm256_extracti128_si256(b, 1));
    } else {
        _mm256_storeu_si256((__m256i *)r, a);
        _mm256_storeu_si256((__m256i *)r + 1, b);
    }
}

#undef KERN_ST512_AI
#endif
