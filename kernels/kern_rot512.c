/*
 * kern_rot512.c — ROT2/ROT4's K sections with AVX-512, for CPUs that have it: the decode, and
 * the encode's whole blocks of sixteen tokens.
 *
 * DESIGN
 * Decode: the same rows, operations and order as rot_dec_fused() of kern_rot.c (AVX2), on
 * sixteen lanes: a (token, head) row of D channels (32 .. 256) is D / 16 registers; a group's
 * codes find their values (q * scale + min, computed once per group) by a permute, which also
 * lays them out for the butterfly: the group's even channels in one register, its odd ones in
 * the next, so the stage of stride 1 is between the two; the stages of strides 2, 4, 8 and 16
 * each exchange a lane bit with the pair's register bit (two shuffles, an addition and a
 * subtraction for two registers: the reference's a + b and a - b), which leaves the channels
 * in order, and those of 32 and more are between registers; then y * (c with the channel's
 * sign) + mean per channel, stored as fp16 or bf16. Two rows are decoded side by side: a
 * row's steps form one long chain, and the core overlaps two. A layer whose values are KIVI
 * groups of the keys' bits (ROT's own values, kern_rot_dec_kv) has them decoded with each
 * pair of key rows, in slices between the rows' stages (kern_kivi512.h's group decode, the
 * same bytes as KIVI's value sections): the keys' decode is bound by its chains, and the
 * values' independent work fills their gaps where one after the other the two add up;
 * there, from KERN_NT_MIN_BYTES of output, both are streamed (kern_st512.h). Encode:
 * rot_enc_tok8() of kern_rot.c with sixteen tokens in the lanes instead of eight (every
 * butterfly stage between
 * whole registers, the groups' extremes and parameters lane-wise; the groups' code in
 * kern_kivi512.h, shared with KIVI's value encoder), for the blocks of sixteen tokens a
 * section has; kern_rot.c computes the means and signs first (with the Inf/NaN scan, here on
 * 512-bit registers: kern_rot512_amax, kern_rot512_signs, kern_rot512_means, the same sums in
 * token order as its AVX2 pass) and encodes the rest. The target has no separate FMA flag, but AVX-512F
 * brings the 512-bit FMA: the file is built with -ffp-contract=off (Makefile), so a product
 * and a sum the reference rounds twice stay two roundings (check_codecs fails without it).
 *
 * Chosen at run time (kern_rot512_on): the CPU has AVX-512 F, BW, VL, DQ and F16C, and
 * KVC_NO_AVX512 is not set in the environment (read once); the tests switch it with
 * kern_rot_avx512() to run the AVX2 path too. Elsewhere kern_rot.c's AVX2 path runs. The same
 * probe and switch govern kern_kivi512.c (KIVI sections, ROT's values among them).
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern_cpu.h"
#include "kernels/kern_ext.h"
#include "kernels/kern_kivi512.h"
#include "kernels/kern_st512.h"

/* -1: not probed yet; else whether this CPU has the features (cpu) and whether the AVX-512
 * path is in use (on: cpu, unless KVC_NO_AVX512 or the tests turned it off). */
static int rot512_cpu = -1, rot512_use = -1;

static void rot512_probe(void)
{
    if (__atomic_load_n(&rot512_cpu, __ATOMIC_RELAXED) >= 0)
        return;
    /* idempotent: racing first callers store the same answers */
    __builtin_cpu_init();
    const int cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                    __builtin_cpu_supports("f16c");
    const char *e = getenv("KVC_NO_AVX512");
    const int off = e && *e && strcmp(e, "0") != 0;
    __atomic_store_n(&rot512_use, cpu && !off, __ATOMIC_RELAXED);
    __atomic_store_n(&rot512_cpu, cpu, __ATOMIC_RELAXED);
}

int kern_rot512_on(void)
{
    rot512_probe();
    return __atomic_load_n(&rot512_use, __ATOMIC_RELAXED);
}

int kern_rot_avx512(int on)
{
    rot512_probe();
    const int was = __atomic_load_n(&rot512_use, __ATOMIC_RELAXED);
    __atomic_store_n(&rot512_use, on && __atomic_load_n(&rot512_cpu, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
    return was;
}

/* kern_rot_mix on sixteen lanes. */
K5I __m512i rot_mix16(__m512i x)
{
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)0x85ebca6bu));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 13));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)0xc2b2ae35u));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

/* Channels j .. j + 15 of head h: c with the sign of kern_rot_neg. */
K5I __m512 rot_csign16(__m512 c, uint32_t sseed, uint32_t h, uint32_t j)
{
    const __m512i step = _mm512_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
    __m512i k = _mm512_add_epi32(_mm512_set1_epi32((int)(h * 0x9e3779b1u + j)), step);
    k = rot_mix16(_mm512_xor_si512(_mm512_set1_epi32((int)sseed), rot_mix16(k)));
    return _mm512_xor_ps(c, _mm512_castsi512_ps(_mm512_slli_epi32(k, 31)));
}

/* The butterfly's stages of strides 1 .. n / 2 on n registers, the reference's pairs. */
K5I void rot_fwht_regs16(__m512 *v, const uint32_t n)
{
#pragma GCC unroll 4
    for (uint32_t len = 1; len < n; len <<= 1)
#pragma GCC unroll 8
        for (uint32_t i = 0; i < n; i += 2 * len)
#pragma GCC unroll 8
            for (uint32_t j = i; j < i + len; j++) {
                const __m512 a = v[j], b = v[j + len];
                v[j] = _mm512_add_ps(a, b);
                v[j + len] = _mm512_sub_ps(a, b);
            }
}

/* kern_kivi_v_dec of a full group into two registers, the group's even channels in e (channel
 * 2i in lane i) and its odd ones in o: the layout rot_fwht16 starts from. A group has at most
 * 16 distinct values, q * scale + min for q = 0 .. qmax (the reference's multiply and add, in
 * that order): they are computed once into a register and every code looks its value up with
 * a permute, which reads the low four bits of its lane. A code's bits are shifted down into
 * the low bits of its lane (4-bit codes: a byte a lane, the even channel's code in its low
 * nibble; 2-bit: eight even channels' codes a dword, four bits apart, with a table that
 * repeats every four entries, so the next codes' bits above them select the same value). */
K5I void rot_group_dec16(const uint8_t *blk, __m512 *e, __m512 *o, const int bits)
{
    uint32_t hdr;
    memcpy(&hdr, blk, 4);
    const __m128 sm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)hdr));
    const __m512 sc = _mm512_broadcastss_ps(sm),
                 mn = _mm512_broadcastss_ps(_mm_shuffle_ps(sm, sm, 1));
    const __m512 q = bits == 4
                         ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                         : _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    const __m512 tab = _mm512_add_ps(_mm512_mul_ps(q, sc), mn);
    if (bits == 4) {
        const __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 4)));
        *e = _mm512_permutexvar_ps(z, tab);
        *o = _mm512_permutexvar_ps(_mm512_srli_epi32(z, 4), tab);
    } else {
        uint64_t w;
        memcpy(&w, blk + 4, 8);
        const __m512i i = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        const __m512i sh =
            _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
        const __m512i z = _mm512_srlv_epi32(
            _mm512_permutexvar_epi32(i, _mm512_castsi128_si512(_mm_cvtsi64_si128((long long)w))),
            sh);
        *e = _mm512_permutexvar_ps(z, tab);
        *o = _mm512_permutexvar_ps(_mm512_srli_epi32(z, 2), tab);
    }
}

/* One butterfly stage on the channel bit in lane bit lb of a and b, the pair's other register
 * (a: the register bit 0, b: 1), exchanging the two bits: x gathers both registers' lanes
 * whose lane bit lb is 0, y those where it is 1, lane bit lb of x and y now the register bit;
 * then a = x + y, b = x - y, the reference's a + b and a - b for the stage's bit, which is the
 * pair's register bit afterwards. Two shuffles and two operations for two registers' stage.
 * Lane bits 2 and 3 (the 128-bit lanes) take the same unmasked vshuff32x4 pair (0x88, 0xdd;
 * a masked one costs more on the add pipes): x = a's lanes 0 and 2 then b's, which exchanges
 * lane bit 2 with the register bit and moves lane bit 3 down to bit 2 and the old register
 * bit up to bit 3. Called for lane bit 2 and then again for the channel bit that moved down,
 * the two calls leave the two channel bits in lane bits 2 and 3 in order. */
K5I void rot_xstage16(__m512 *a, __m512 *b, const int lb)
{
    __m512 x, y;
    if (lb == 0) { /* lanes 1 apart */
        x = _mm512_mask_permute_ps(*a, 0xaaaa, *b, 0xa0);
        y = _mm512_mask_permute_ps(*b, 0x5555, *a, 0xf5);
    } else if (lb == 1) { /* 2 apart */
        x = _mm512_shuffle_ps(*a, *b, 0x44);
        y = _mm512_shuffle_ps(*a, *b, 0xee);
    } else { /* 4 or 8 apart: the 128-bit lanes, lane bits 2 and 3 (rot_fwht16) */
        x = _mm512_shuffle_f32x4(*a, *b, 0x88);
        y = _mm512_shuffle_f32x4(*a, *b, 0xdd);
    }
    *a = _mm512_add_ps(x, y);
    *b = _mm512_sub_ps(x, y);
}

/* The values beside a pair of key rows (kern_rot_dec_kv): ng KIVI groups at blk into r
 * (kern_kivi512.h's group decode), in eight slices between the key rows' steps (rot_fwht16,
 * rot_dec_row16), so the core finds independent work beside each step of the rows' chains.
 * 2-bit slices keep whole fours of groups (one table for four). */
struct rot_vals {
    const uint8_t *blk; /* NULL: none */
    uint16_t *r;
    uint32_t ng, out;
    int bits, nt;
};

K5I void rot_vals_slice(const struct rot_vals *v, const uint32_t slice)
{
    if (!v->blk)
        return;
    const uint32_t u = v->bits == 4 ? 1 : 4, gb = kern_kivi_v_group_bytes(v->bits);
    const uint32_t lo = v->ng * slice / 8 / u * u,
                   hi = slice == 7 ? v->ng : v->ng * (slice + 1) / 8 / u * u;
    if (hi > lo)
        kivi5_v_groups(v->bits, v->out, v->nt, v->blk + (uint64_t)lo * gb, hi - lo,
                       v->r + (uint64_t)lo * 32);
}

/* The butterfly on nr rows of D = 16 nv channels (r[k * 16 ..], the rows side by side so
 * that each step's independent work is together) as rot_group_dec16 leaves them: register
 * 2g + b holds channels 32g + 2i + b (lane i). Stage 1 (channel bit 0) is between the pair's
 * two registers; the stages of channel bits 1 .. 4, in lane bits 0 .. 3, exchange each with
 * the pair's register bit (rot_xstage16), which leaves channel bit k in lane bit k: register j
 * then holds channels 16j .. 16j + 15 in order, and the stages of 32 and more are between
 * registers. Every stage's pairs and operations are the reference's (kern_fwht), in its
 * order of stages. Each stage runs over every register pair of every row before the next
 * (the pairs' chains are independent until the stage of 32), with a slice of the values
 * (vals) after each, so the core's window holds independent work at every step. */
K5I void rot_fwht16(__m512 *r, const uint32_t nv, const uint32_t nr, const struct rot_vals *vals)
{
#pragma GCC unroll 8
    for (uint32_t i = 0; i < nv; i += 2)
#pragma GCC unroll 4
        for (uint32_t k = 0; k < nr; k++) {
            __m512 *v = r + 16 * k;
            const __m512 a = v[i], b = v[i + 1];
            v[i] = _mm512_add_ps(a, b);
            v[i + 1] = _mm512_sub_ps(a, b);
        }
    rot_vals_slice(vals, 1);
#pragma GCC unroll 4
    for (int lb = 0; lb < 4; lb++) {
#pragma GCC unroll 8
        for (uint32_t i = 0; i < nv; i += 2)
#pragma GCC unroll 4
            for (uint32_t k = 0; k < nr; k++)
                rot_xstage16(r + 16 * k + i, r + 16 * k + i + 1, lb);
        rot_vals_slice(vals, 2 + lb);
    }
    rot_vals_slice(vals, 6);
    /* the stages of 32 channels and more: registers 2, 4, ... apart */
#pragma GCC unroll 4
    for (uint32_t len = 2; len < nv; len <<= 1)
#pragma GCC unroll 8
        for (uint32_t i = 0; i < nv; i += 2 * len)
#pragma GCC unroll 8
            for (uint32_t j = i; j < i + len; j++)
#pragma GCC unroll 4
                for (uint32_t k = 0; k < nr; k++) {
                    __m512 *v = r + 16 * k;
                    const __m512 a = v[j], b = v[j + len];
                    v[j] = _mm512_add_ps(a, b);
                    v[j + len] = _mm512_sub_ps(a, b);
                }
}

/* Sixteen floats to fp16 (F16C's rounding is kern_f2h's) or bf16 (round to nearest even as
 * kern_f2bf; decoded values are never NaN). */
K5I void rot_store16(uint16_t *p, __m512 x, uint32_t dtype)
{
    if (dtype == KERN_DTYPE_FP16) {
        _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        return;
    }
    __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd),
                          16);
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(u));
}

/* nr rows side by side (rows k = 0 .. nr - 1: groups at g0[k], the head's c with signs and
 * means at cs[k] and mf[k], out at o[k]): groups, butterfly, y * cs + mean per channel,
 * stored, or 64 bytes at a time by mode nt (kern_st512.h). */
K5I void rot_dec_row16(const uint8_t *const *g0, const int bits, uint32_t gb,
                       const float *const *cs, const float *const *mf, uint16_t *const *o,
                       uint32_t out_dtype, const uint32_t nv, const uint32_t nr, const int nt,
                       const struct rot_vals *vals)
{
    __m512 y[4 * 16];
#pragma GCC unroll 8
    for (uint32_t g = 0; g < nv / 2; g++)
#pragma GCC unroll 4
        for (uint32_t k = 0; k < nr; k++)
            rot_group_dec16(g0[k] + (uint64_t)g * gb, y + 16 * k + 2 * g, y + 16 * k + 2 * g + 1,
                            bits);
    rot_vals_slice(vals, 0);
    rot_fwht16(y, nv, nr, vals);
    if (nt) {
#pragma GCC unroll 8
        for (uint32_t j = 0; j < nv; j += 2)
#pragma GCC unroll 4
            for (uint32_t k = 0; k < nr; k++) {
                const __m512 a = _mm512_add_ps(
                    _mm512_mul_ps(y[16 * k + j], _mm512_loadu_ps(cs[k] + 16 * j)),
                    _mm512_loadu_ps(mf[k] + 16 * j));
                const __m512 b = _mm512_add_ps(
                    _mm512_mul_ps(y[16 * k + j + 1], _mm512_loadu_ps(cs[k] + 16 * j + 16)),
                    _mm512_loadu_ps(mf[k] + 16 * j + 16));
                kern_st512_halves(o[k] + 16 * j, a, b, out_dtype, nt);
            }
        rot_vals_slice(vals, 7);
        return;
    }
#pragma GCC unroll 16
    for (uint32_t j = 0; j < nv; j++)
#pragma GCC unroll 4
        for (uint32_t k = 0; k < nr; k++)
            rot_store16(o[k] + 16 * j,
                        _mm512_add_ps(_mm512_mul_ps(y[16 * k + j], _mm512_loadu_ps(cs[k] + 16 * j)),
                                      _mm512_loadu_ps(mf[k] + 16 * j)),
                        out_dtype);
    rot_vals_slice(vals, 7);
}

/* Rows of D (nv = D / 16) channels, every (token, head) in memory order, ROT_DEC_ROWS at a
 * time: each row's chain of dependent steps is long (groups, seven stages, the output), and
 * rows side by side give the core independent work to overlap with it. With vin (the layer's
 * value section, KIVI groups of the keys' bits), each pair of key rows decodes the same rows'
 * values into rawv, in slices between its steps (rot_vals_slice): after the pair, the values
 * ran apart and added their time to the keys' (measured: 10.2 µs against 9.0 for two layers
 * of the benchmark's block in cache). Both stored by mode nt (kern_st512.h). */
#define ROT_DEC_ROWS 2
K5I void rot_dec_rows16(const struct kern_layout *lay, const uint8_t *in, const int bits,
                        uint16_t *raw, const uint32_t out_dtype, const float *csa,
                        const float *mfa, const uint32_t nv, const uint8_t *vin, uint16_t *rawv,
                        const int nt)
{
    const uint32_t T = lay->tokens, H = lay->heads, D = 16 * nv, G = D / KERN_GROUP;
    const uint32_t gb = kern_kivi_v_group_bytes(bits); /* the keys' groups and the values' */
    const uint64_t n = (uint64_t)T * H;
    uint64_t row = 0;
    uint32_t h0 = 0; /* the head of row */
    for (; row + ROT_DEC_ROWS <= n; row += ROT_DEC_ROWS) {
        const uint8_t *g0[ROT_DEC_ROWS];
        const float *cs[ROT_DEC_ROWS], *mf[ROT_DEC_ROWS];
        uint16_t *o[ROT_DEC_ROWS];
        for (uint32_t k = 0; k < ROT_DEC_ROWS; k++) {
            g0[k] = in + (row + k) * G * gb;
            cs[k] = csa + (uint64_t)h0 * D;
            mf[k] = mfa + (uint64_t)h0 * D;
            o[k] = raw + (row + k) * D;
            h0 = h0 + 1 == H ? 0 : h0 + 1;
        }
        const struct rot_vals vals = {vin ? vin + row * G * gb : NULL, vin ? rawv + row * D : NULL,
                                      ROT_DEC_ROWS * G, out_dtype, bits, nt};
        rot_dec_row16(g0, bits, gb, cs, mf, o, out_dtype, nv, ROT_DEC_ROWS, nt, &vals);
    }
    for (; row < n; row++) {
        const uint8_t *g0 = in + row * G * gb;
        const float *cs = csa + (uint64_t)h0 * D, *mf = mfa + (uint64_t)h0 * D;
        uint16_t *o = raw + row * D;
        const struct rot_vals vals = {vin ? vin + row * G * gb : NULL, vin ? rawv + row * D : NULL,
                                      G, out_dtype, bits, nt};
        rot_dec_row16(&g0, bits, gb, &cs, &mf, &o, out_dtype, nv, 1, nt, &vals);
        h0 = h0 + 1 == H ? 0 : h0 + 1;
    }
}

K5 int kern_rot512_dec(const struct kern_layout *lay, const uint8_t *sect, int bits, void *raw,
                       uint32_t out_dtype, float *scratch, const uint8_t *vsect, void *rawv)
{
    const uint32_t H = lay->heads, D = lay->head_dim;
    if (D != 32 && D != 64 && D != 128 && D != 256)
        return 0;
    const uint32_t sseed = kern_rot_get_seed(sect);
    const __m512 c = _mm512_set1_ps(kern_rot_scale(D));
    const uint8_t *in = sect + kern_rot_groups_off(lay), *means = kern_rot_means(sect);
    /* per head and channel: c with the channel's sign, and the mean as a float */
    float *csa = scratch, *mfa = scratch + (uint64_t)H * D;
    for (uint32_t h = 0; h < H; h++)
        for (uint32_t j = 0; j < D; j += 16) {
            const uint64_t k = (uint64_t)h * D + j;
            _mm512_storeu_ps(csa + k, rot_csign16(c, sseed, h, j));
            _mm512_storeu_ps(mfa + k,
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(means + 2 * k))));
        }
    /* with the values, streamed from KERN_NT_MIN_BYTES of output (every store a multiple of 64
     * bytes from raw and from rawv, D % 32 == 0, and the two a section's rows apart): measured,
     * the keys' stores streamed too gain where the values' go beside them and lose alone */
    const int nt = vsect ? kern_st512_mode(raw, lay) : 0;
    /* every (bits, D) its own loop: the group decode, the row and the values' groups unrolled
     * for it (the values as KIVI's of the keys' bits) */
#define ROT_OUT(b, nv)                                                                             \
    rot_dec_rows16(lay, in, (b), raw, out_dtype, csa, mfa, (nv), vsect, rawv, nt)
    const uint32_t nv = D / 16;
    if (bits == 4 && nv == 8)
        ROT_OUT(4, 8);
    else if (bits == 4 && nv == 4)
        ROT_OUT(4, 4);
    else if (bits == 4 && nv == 2)
        ROT_OUT(4, 2);
    else if (bits == 4)
        ROT_OUT(4, 16);
    else if (nv == 8)
        ROT_OUT(2, 8);
    else if (nv == 4)
        ROT_OUT(2, 4);
    else if (nv == 2)
        ROT_OUT(2, 2);
    else
        ROT_OUT(2, 16);
#undef ROT_OUT
    if (nt)
        _mm_sfence(); /* the streamed lines are ordered before whatever the caller does next */
    return 1;
}

/* ---- encode: the first pass (the scan, the signs, the channels' means) ----------------- */

K5 void kern_rot512_signs(uint32_t *mask, uint32_t sseed, uint32_t h, uint32_t dim)
{
    const __m512i step = _mm512_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16),
                  seed = _mm512_set1_epi32((int)sseed);
    for (uint32_t j = 0; j < dim; j += 16) {
        __m512i k = _mm512_add_epi32(_mm512_set1_epi32((int)(h * 0x9e3779b1u + j)), step);
        k = rot_mix16(_mm512_xor_si512(seed, rot_mix16(k)));
        _mm512_storeu_si512(mask + j, _mm512_slli_epi32(k, 31));
    }
}

K5 uint16_t kern_rot512_amax(const uint16_t *raw, uint64_t n)
{
    const __m512i mag = _mm512_set1_epi16(0x7fff);
    __m512i mx = _mm512_setzero_si512(), m1 = mx, m2 = mx, m3 = mx; /* four chains */
    uint64_t i = 0;
    for (; i + 128 <= n; i += 128) {
        mx = _mm512_max_epu16(mx, _mm512_and_si512(_mm512_loadu_si512(raw + i), mag));
        m1 = _mm512_max_epu16(m1, _mm512_and_si512(_mm512_loadu_si512(raw + i + 32), mag));
        m2 = _mm512_max_epu16(m2, _mm512_and_si512(_mm512_loadu_si512(raw + i + 64), mag));
        m3 = _mm512_max_epu16(m3, _mm512_and_si512(_mm512_loadu_si512(raw + i + 96), mag));
    }
    mx = _mm512_max_epu16(_mm512_max_epu16(mx, m1), _mm512_max_epu16(m2, m3));
    for (; i + 32 <= n; i += 32)
        mx = _mm512_max_epu16(mx, _mm512_and_si512(_mm512_loadu_si512(raw + i), mag));
    __m256i m = _mm256_max_epu16(_mm512_castsi512_si256(mx), _mm512_extracti64x4_epi64(mx, 1));
    if (i + 16 <= n)
        m = _mm256_max_epu16(m, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(raw + i)),
                                                 _mm512_castsi512_si256(mag)));
    __m128i m8 = _mm_max_epu16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    m8 = _mm_max_epu16(m8, _mm_srli_si128(m8, 8));
    m8 = _mm_max_epu16(m8, _mm_srli_si128(m8, 4));
    m8 = _mm_max_epu16(m8, _mm_srli_si128(m8, 2));
    return (uint16_t)_mm_extract_epi16(m8, 0);
}

/* The sums over T tokens (ts halves apart, token order) of 16 nv channels at r, each value as
 * kern_ext_value (clean: fp16 known finite, nothing to sanitize). */
K5I void rot_sums16(const uint16_t *r, uint64_t ts, uint32_t T, uint32_t dtype, __m512 *sum,
                    const uint32_t nv, const int clean)
{
#pragma GCC unroll 8
    for (uint32_t k = 0; k < nv; k++)
        sum[k] = _mm512_setzero_ps();
    for (uint32_t t = 0; t < T; t++, r += ts)
#pragma GCC unroll 8
        for (uint32_t k = 0; k < nv; k++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(r + 16 * k));
            __m512 x;
            if (clean)
                x = _mm512_cvtph_ps(v);
            else
                x = kivi5_sanitize16(
                    dtype == KERN_DTYPE_BF16
                        ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16))
                        : _mm512_cvtph_ps(v));
            sum[k] = _mm512_add_ps(sum[k], x);
        }
}

K5 void kern_rot512_means(const struct kern_layout *lay, const uint8_t *rawk, uint8_t *out,
                          float *mean, int clean)
{
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim;
    const __m512 n = _mm512_set1_ps((float)T);
    const uint16_t *raw = (const uint16_t *)rawk;
    const uint64_t ts = (uint64_t)H * D;
    for (uint32_t h = 0; h < H; h++)
        for (uint32_t j = 0; j < D; j += 128) {
            const uint32_t w = D - j < 128 ? D - j : 128; /* D a multiple of 32 */
            const uint16_t *r = raw + (uint64_t)h * D + j;
            __m512 sum[8];
            if (w == 128 && clean)
                rot_sums16(r, ts, T, lay->dtype, sum, 8, 1);
            else if (w == 128)
                rot_sums16(r, ts, T, lay->dtype, sum, 8, 0);
            else if (w == 64 && clean)
                rot_sums16(r, ts, T, lay->dtype, sum, 4, 1);
            else if (w == 64)
                rot_sums16(r, ts, T, lay->dtype, sum, 4, 0);
            else if (clean)
                rot_sums16(r, ts, T, lay->dtype, sum, 2, 1);
            else
                rot_sums16(r, ts, T, lay->dtype, sum, 2, 0);
            for (uint32_t k = 0; k < w; k += 16) {
                const __m256i hv =
                    _mm512_cvtps_ph(_mm512_div_ps(sum[k / 16], n), _MM_FROUND_TO_NEAREST_INT);
                _mm256_storeu_si256((__m256i *)(out + 2 * ((uint64_t)h * D + j + k)), hv);
                _mm512_storeu_ps(mean + (uint64_t)h * D + j + k, _mm512_cvtph_ps(hv));
            }
        }
}

/* ---- encode: sixteen tokens of a head at a time, the tokens in the lanes ---------------- */

/* Sixteen tokens of a head, D channels (32, 64 or 128): kern_rot.c's rot_enc_tok8 on
 * sixteen lanes. The rows go through buf: loaded, centred, signed and the three smallest
 * stages per 16 channels; the stages of 8 up to D / 2 per column of D / 8 registers with the
 * scale; then the groups. Every lane does the reference's operations in its order. */
K5I void rot_enc_tok16(const uint16_t *r, uint64_t ts, uint32_t dtype, const uint32_t *m,
                       const float *mu, __m512 c, int bits, uint8_t *o, uint64_t os, uint32_t gb,
                       const uint32_t D, const int clean, const int small)
{
    __m512 buf[128];
    for (uint32_t j = 0; j < D; j += 16) {
        __m512 x[16];
        kivi5_load_t16x16(r + j, ts, dtype, clean, x);
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++)
            x[k] = _mm512_xor_ps(_mm512_sub_ps(x[k], _mm512_set1_ps(mu[j + k])),
                                 _mm512_castsi512_ps(_mm512_set1_epi32((int)m[j + k])));
        rot_fwht_regs16(x, 8);
        rot_fwht_regs16(x + 8, 8);
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++)
            buf[j + k] = x[k];
    }
    for (uint32_t i = 0; i < 8; i++) {
        __m512 v[16];
#pragma GCC unroll 16
        for (uint32_t k = 0; k < D / 8; k++)
            v[k] = buf[i + 8 * k];
        rot_fwht_regs16(v, D / 8);
#pragma GCC unroll 16
        for (uint32_t k = 0; k < D / 8; k++)
            buf[i + 8 * k] =
                small ? _mm512_mul_ps(v[k], c) : kivi5_sanitize16(_mm512_mul_ps(v[k], c));
    }
    for (uint32_t g = 0; g < D / 32; g++)
        kivi5_groups_enc16(buf + 32 * g, NULL, o + (uint64_t)g * gb, os, bits);
}

K5I void rot_enc_blocks16(const struct kern_layout *lay, const uint8_t *rawk, const uint8_t *rawv,
                          const uint32_t *mask, const float *mean, const int bits, uint8_t *out,
                          uint32_t T16, const uint32_t D, const int clean, const int small)
{
    const uint32_t H = lay->heads, G = D / KERN_GROUP;
    const uint32_t gb = kern_kivi_v_group_bytes(bits);
    const __m512 c = _mm512_set1_ps(kern_rot_scale(D));
    const uint64_t ts = (uint64_t)H * D;
    for (uint32_t t0 = 0; t0 < T16; t0 += 16)
        for (uint32_t h = 0; h < H; h++) {
            const uint16_t *r = (const uint16_t *)rawk + (uint64_t)t0 * ts + (uint64_t)h * D;
            for (uint32_t i = 0; i < 16; i++) {
                /* the V slab into L2, as kern_rot.c's encode does */
                if (rawv)
                    for (uint32_t j = 0; j < D; j += 32)
                        _mm_prefetch((const char *)(rawv + 2 * (((uint64_t)t0 + i) * ts +
                                                                (uint64_t)h * D + j)),
                                     _MM_HINT_T1);
            }
            /* token t0 + i's groups of head h: o + i * H * G * gb */
            uint8_t *o = out + ((uint64_t)t0 * H + h) * G * gb;
            rot_enc_tok16(r, ts, lay->dtype, mask + (uint64_t)h * D, mean + (uint64_t)h * D, c,
                          bits, o, (uint64_t)H * G * gb, gb, D, clean, small);
        }
}

K5 uint32_t kern_rot512_enc_rows(const struct kern_layout *lay, const uint8_t *rawk,
                                 const uint8_t *rawv, const uint32_t *mask, const float *mean,
                                 int bits, uint8_t *out, int clean, int small)
{
    const uint32_t D = lay->head_dim, T16 = lay->tokens / 16 * 16;
    if (T16 == 0 || (D != 32 && D != 64 && D != 128))
        return 0;
#define ROT_ENC(b, d, cl, sm)                                                                      \
    rot_enc_blocks16(lay, rawk, rawv, mask, mean, (b), out, T16, (d), (cl), (sm))
    if (bits == 4 && D == 128 && small)
        ROT_ENC(4, 128, 1, 1);
    else if (bits == 4 && D == 128 && clean)
        ROT_ENC(4, 128, 1, 0);
    else if (bits == 4 && D == 128)
        ROT_ENC(4, 128, 0, 0);
    else if (bits == 4 && D == 64)
        ROT_ENC(4, 64, 0, 0);
    else if (bits == 4)
        ROT_ENC(4, 32, 0, 0);
    else if (D == 128 && small)
        ROT_ENC(2, 128, 1, 1);
    else if (D == 128 && clean)
        ROT_ENC(2, 128, 1, 0);
    else if (D == 128)
        ROT_ENC(2, 128, 0, 0);
    else if (D == 64)
        ROT_ENC(2, 64, 0, 0);
    else
        ROT_ENC(2, 32, 0, 0);
#undef ROT_ENC
    return T16;
}
