/*
 * kern_q8512.c — q8_0 sections decoded with AVX-512, for CPUs that have it: the q8_0 codec's
 * sections and LOWRANK's values (q8_0 sections, kern_codec_as).
 *
 * DESIGN
 * Called from kern_avx2_dec_sect() (kern_avx2_dec.c) on the decoding thread, in place of the
 * AVX2 loop, for the same sections and with the same results: each code times its group's
 * scale (kern_q8_0_dec: one product, exact before its rounding to float), rounded to the
 * output dtype as kern_store. A group's 32 codes are two registers of sixteen products and
 * one 64-byte store, streamed from 1 MiB of output (kern_st512.h); the AVX2 loop spends
 * twice the instructions on 8-wide conversions and 16-byte stores, and LOWRANK's decode,
 * whose keys take the arithmetic, spent a third of its time there. The file is built with
 * -ffp-contract=off (Makefile) as the other AVX-512 codecs, though a product alone has
 * nothing to fuse.
 *
 * In use where kern_rot512_on() (kern_rot512.c) says so: the CPU has AVX-512 F, BW, VL, DQ
 * and F16C and KVC_NO_AVX512 is unset; the tests' kern_rot_avx512() switches it with the
 * other AVX-512 paths. Elsewhere the AVX2 decoder runs.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/kern_cpu.h"
#include "kernels/kern_fmt.h"
#include "kernels/kern_st512.h"

#define K5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))
#define K5I __attribute__((always_inline)) K5 static inline

/* n groups of 34 bytes (fp16 scale d, 32 codes) into 32 halves each, front to back. */
K5I void q85_dec(const uint8_t *blk, uint64_t n, uint16_t *r, uint32_t out, const int nt)
{
    for (uint64_t i = 0; i < n; i++, blk += 34, r += 32) {
        uint16_t dh;
        memcpy(&dh, blk, 2);
        const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)dh));
        const __m512 lo =
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2))));
        const __m512 hi =
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18))));
        kern_st512_halves(r, _mm512_mul_ps(lo, d), _mm512_mul_ps(hi, d), out, nt);
    }
}

K5 void kern_q8512_groups(const uint8_t *blk, uint64_t n, void *raw, uint32_t out, int nt)
{
#define Q85_NT(o)                                                                                  \
    do {                                                                                           \
        if (nt == 2)                                                                               \
            q85_dec(blk, n, raw, o, 2);                                                            \
        else if (nt == 1)                                                                          \
            q85_dec(blk, n, raw, o, 1);                                                            \
        else                                                                                       \
            q85_dec(blk, n, raw, o, 0);                                                            \
    } while (0)
    if (out == KERN_DTYPE_BF16)
        Q85_NT(KERN_DTYPE_BF16);
    else
        Q85_NT(KERN_DTYPE_FP16);
#undef Q85_NT
}

K5 int kern_q8512_dec(const uint8_t *sect, const struct kern_layout *lay, void *raw, uint32_t out)
{
    if (lay->head_dim % 32)
        return 0;
    /* every store is at a multiple of 64 bytes from raw (D % 32 == 0) */
    const int nt = kern_st512_mode(raw, lay);
    kern_q8512_groups(sect, (uint64_t)lay->tokens * lay->heads * (lay->head_dim / 32), raw, out,
                      nt);
    if (nt)
        _mm_sfence(); /* the streamed lines are ordered before whatever the caller does next */
    return 1;
}
