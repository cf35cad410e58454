/*
 * kern_lowrank512.c — LOWRANK's key sections with AVX-512, for CPUs that have it: the decode's
 * product and the encode's projections of the factors.
 *
 * DESIGN
 * Both are sums with the channels d in the lanes, so sixteen lanes halve the instructions of
 * kern_lowrank.c's AVX2 loops without touching any sum's order. Decode: x^[t][d] =
 * sum_i (sigma_i u[t][i]) w[i][d], i in order from +0 as kern_lowrank_val, in tiles of four
 * tokens by 64 channels (16 accumulators of AVX-512's 32 registers), each term one fused
 * multiply-add (_mm512_fmadd_ps, KERN_FMA), from the scratch kern_lowrank.c fills (su =
 * sigma_i u[t][i] rounded once, wf = w as floats: its rows converted here, sixteen halves at
 * a time, kern_lowrank512_wf, 1-3 % of the decode against eight), rounded to the output's
 * halves as kern_store, a token's 32 channels one 64-byte store, streamed from 1 MiB of
 * output (kern_st512.h). Encode (T <= D): w_e[d] = sum_t u_e[t] x[t][d] / sigma_e with token
 * t in partial t % 8 as lr_project_ref, four factors at once, one class of tokens after
 * another, then kern_sum8_fold and the division. The subspace search and the Gram matrix
 * stay in kern_lowrank.c (their lanes are heads or classes of channels, eight of them).
 * AVX-512F brings the 512-bit FMA: the file is built with -ffp-contract=off (Makefile), so the
 * products and sums the reference rounds apart (the encode's) stay apart; the decode's fused
 * ones are written as such.
 *
 * Chosen at run time by kern_rot512_on() (kern_rot512.c: the CPU has AVX-512 F, BW, VL, DQ
 * and F16C, KVC_NO_AVX512 not set; read once), which the tests switch with kern_rot_avx512()
 * to run the AVX2 path too. Only head dims that are multiples of 16 come here.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/kern_avx2.h"
#include "kernels/kern_cpu.h"
#include "kernels/kern_ext.h"
#include "kernels/kern_st512.h"

#define K5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))
#define K5I __attribute__((always_inline)) K5 static inline

/* Tokens t0 .. t0 + NT - 1 by channels d .. d + 16 NV - 1 (every loop unrolled: the
 * accumulators must stay in registers). NV even: each token's 32 channels as one 64-byte
 * store by mode nt (kern_st512.h); NV 1 (D % 32 == 16): 32 bytes, through the cache. */
#define LR5_U _Pragma("GCC unroll 4")
#define LR5_TILE(NT, NV)                                                                           \
    do {                                                                                           \
        __m512 acc[NT][NV];                                                                        \
        LR5_U for (int a = 0; a < (NT); a++) LR5_U for (int b = 0; b < (NV); b++) acc[a][b] =     \
            _mm512_setzero_ps();                                                                   \
        for (uint32_t i = 0; i < rank; i++) {                                                      \
            const float *wi = wf + (uint64_t)i * D + d, *si = su + (uint64_t)t0 * rank + i;        \
            __m512 wv[NV];                                                                         \
            LR5_U for (int b = 0; b < (NV); b++) wv[b] = _mm512_loadu_ps(wi + 16 * b);            \
            LR5_U for (int a = 0; a < (NT); a++)                                                   \
            {                                                                                      \
                const __m512 s = _mm512_set1_ps(si[(uint64_t)a * rank]);                           \
                LR5_U for (int b = 0; b < (NV); b++) acc[a][b] =                                   \
                    _mm512_fmadd_ps(s, wv[b], acc[a][b]);                                          \
            }                                                                                      \
        }                                                                                          \
        LR5_U for (int a = 0; a < (NT); a++)                                                       \
        {                                                                                          \
            uint16_t *r = o + (uint64_t)(t0 + a) * stride + d;                                     \
            if ((NV) == 1)                                                                         \
                _mm256_storeu_si256((__m256i *)r, kern_half16_512(acc[a][0], out_dtype));          \
            else                                                                                   \
                LR5_U for (int b = 0; b + 1 < (NV); b += 2)                                        \
                    kern_st512_halves(r + 16 * b, acc[a][b], acc[a][b + 1], out_dtype, nt);        \
        }                                                                                          \
    } while (0)

K5I void lr5_rows(uint32_t rank, uint32_t T, uint32_t D, uint16_t *o, uint64_t stride,
                  uint32_t out_dtype, const float *su, const float *wf, const int nt)
{
    uint32_t t0 = 0;
    for (; t0 + 4 <= T; t0 += 4) {
        uint32_t d = 0;
        for (; d + 64 <= D; d += 64)
            LR5_TILE(4, 4);
        if (d + 32 <= D) {
            LR5_TILE(4, 2);
            d += 32;
        }
        if (d < D)
            LR5_TILE(4, 1);
    }
    for (; t0 < T; t0++) {
        uint32_t d = 0;
        for (; d + 64 <= D; d += 64)
            LR5_TILE(1, 4);
        if (d + 32 <= D) {
            LR5_TILE(1, 2);
            d += 32;
        }
        if (d < D)
            LR5_TILE(1, 1);
    }
}
#undef LR5_TILE
#undef LR5_U

K5 void kern_lowrank512_rows(uint32_t rank, uint32_t T, uint32_t D, uint16_t *o, uint64_t stride,
                             uint32_t out_dtype, const float *su, const float *wf, int nt)
{
    if (nt == 2)
        lr5_rows(rank, T, D, o, stride, out_dtype, su, wf, 2);
    else if (nt == 1)
        lr5_rows(rank, T, D, o, stride, out_dtype, su, wf, 1);
    else
        lr5_rows(rank, T, D, o, stride, out_dtype, su, wf, 0);
}

K5 void kern_lowrank512_wf(const uint8_t *w, uint32_t rank, uint32_t D, float *wf)
{
    for (uint64_t k = 0; k < (uint64_t)rank * D; k += 16)
        _mm512_storeu_ps(wf + k,
                         _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * k))));
}

K5 void kern_lowrank512_project(const float *x, uint32_t T, uint32_t D, const float *const *u,
                                const float *sig, uint32_t r, float *const *w)
{
    const __m512 z = _mm512_setzero_ps();
    const uint64_t step = 8ull * D;
    for (uint32_t e = 0; e < r; e += 4) {
        /* a chunk past r repeats its first factor; those rows are not stored */
        const uint32_t q1 = e + 1 < r ? e + 1 : e, q2 = e + 2 < r ? e + 2 : e,
                       q3 = e + 3 < r ? e + 3 : e;
        const float *u0 = u[e], *u1 = u[q1], *u2 = u[q2], *u3 = u[q3];
        for (uint32_t d = 0; d < D; d += 16) {
            __m512 part[8][4];
#pragma GCC unroll 8
            for (uint32_t c = 0; c < 8; c++) {
                __m512 a0 = z, a1 = z, a2 = z, a3 = z;
                const float *xp = x + (uint64_t)c * D + d;
                for (uint32_t t = c; t < T; t += 8, xp += step) {
                    const __m512 xv = _mm512_loadu_ps(xp);
                    a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_set1_ps(u0[t]), xv));
                    a1 = _mm512_add_ps(a1, _mm512_mul_ps(_mm512_set1_ps(u1[t]), xv));
                    a2 = _mm512_add_ps(a2, _mm512_mul_ps(_mm512_set1_ps(u2[t]), xv));
                    a3 = _mm512_add_ps(a3, _mm512_mul_ps(_mm512_set1_ps(u3[t]), xv));
                }
                part[c][0] = a0;
                part[c][1] = a1;
                part[c][2] = a2;
                part[c][3] = a3;
            }
            for (uint32_t q = 0; q < 4 && e + q < r; q++) {
                const __m512 f = _mm512_add_ps(
                    _mm512_add_ps(_mm512_add_ps(part[0][q], part[1][q]),
                                  _mm512_add_ps(part[2][q], part[3][q])),
                    _mm512_add_ps(_mm512_add_ps(part[4][q], part[5][q]),
                                  _mm512_add_ps(part[6][q], part[7][q])));
                const float sg = sig[e + q];
                _mm512_storeu_ps(w[e + q] + d,
                                 sg > 0.0f ? _mm512_div_ps(f, _mm512_set1_ps(sg)) : z);
            }
        }
    }
}

/* kern_sum8_fold of eight vectors at once (lane k: p[k]'s lanes folded), as kern_lowrank.c's
 * lr_fold8_lanes. */
K5I __m256 lr5_fold8_lanes(const __m256 *p)
{
    const __m256 q0 = _mm256_hadd_ps(_mm256_hadd_ps(p[0], p[1]), _mm256_hadd_ps(p[2], p[3]));
    const __m256 q1 = _mm256_hadd_ps(_mm256_hadd_ps(p[4], p[5]), _mm256_hadd_ps(p[6], p[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20),
                         _mm256_permute2f128_ps(q0, q1, 0x31));
}

K5 void kern_lowrank512_gram(const float *x, uint32_t n, uint32_t D, float *g)
{
    /* tiles of four rows i by eight rows j over the upper half: entry (i, j) sums channel k
     * in lane k % 8 of one half of a register (rows j in pairs, row i in both halves), and
     * g's rows are stored eight entries at a time (an entry left of the diagonal is g's value
     * too: a * b == b * a in the same order) */
    for (uint32_t i0 = 0; i0 < n; i0 += 4)
        for (uint32_t j0 = i0 & ~7u; j0 < n; j0 += 8) {
            const float *ai[4], *bj[8]; /* rows past n: an earlier row, not stored */
            for (uint32_t a = 0; a < 4; a++)
                ai[a] = x + (uint64_t)(i0 + a < n ? i0 + a : i0) * D;
            for (uint32_t b = 0; b < 8; b++)
                bj[b] = x + (uint64_t)(j0 + b < n ? j0 + b : j0) * D;
            __m512 acc[4][4];
#pragma GCC unroll 4
            for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++)
                    acc[a][b] = _mm512_setzero_ps();
#define LR5_STEP(LD)                                                                               \
    do {                                                                                           \
        __m512 bv[4];                                                                              \
        _Pragma("GCC unroll 4") for (int b = 0; b < 4; b++) bv[b] =                               \
            _mm512_insertf32x8(_mm512_castps256_ps512(LD(bj[2 * b])), LD(bj[2 * b + 1]), 1);       \
        _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++)                                        \
        {                                                                                          \
            const __m512 av = _mm512_broadcast_f32x8(LD(ai[a]));                                   \
            _Pragma("GCC unroll 4") for (int b = 0; b < 4; b++) acc[a][b] =                        \
                _mm512_add_ps(acc[a][b], _mm512_mul_ps(av, bv[b]));                                \
        }                                                                                          \
    } while (0)
#define LR5_FULL(r) _mm256_loadu_ps((r) + k)
#define LR5_TAIL(r) _mm256_maskz_loadu_ps((__mmask8)((1u << (D - k)) - 1), (r) + k)
            uint32_t k = 0;
            for (; k + 8 <= D; k += 8)
                LR5_STEP(LR5_FULL);
            if (k < D) /* past D: 0 * 0 into a sum that is never -0 */
                LR5_STEP(LR5_TAIL);
#undef LR5_STEP
#undef LR5_FULL
#undef LR5_TAIL
            const uint32_t m = n - j0 < 8 ? n - j0 : 8;
#pragma GCC unroll 4
            for (uint32_t a = 0; a < 4; a++) {
                if (i0 + a >= n)
                    break;
                __m256 h[8];
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++) {
                    h[2 * b] = _mm512_castps512_ps256(acc[a][b]);
                    h[2 * b + 1] = _mm512_extractf32x8_ps(acc[a][b], 1);
                }
                _mm256_mask_storeu_ps(g + (uint64_t)(i0 + a) * n + j0, (__mmask8)((1u << m) - 1),
                                      lr5_fold8_lanes(h));
            }
        }
    /* the lower half from the upper: g[i][j] = g[j][i] for j < i's first column of 8, blocks
     * of 8 x 8 by a transpose, the rows of a last partial block one entry at a time */
    const uint32_t nf = n & ~7u;
    for (uint32_t i0 = 8; i0 < nf; i0 += 8)
        for (uint32_t j0 = 0; j0 < i0; j0 += 8) {
            __m256 r[8];
            for (int q = 0; q < 8; q++)
                r[q] = _mm256_loadu_ps(g + (uint64_t)(j0 + q) * n + i0);
            v_tr8x8(r);
            for (int q = 0; q < 8; q++)
                _mm256_storeu_ps(g + (uint64_t)(i0 + q) * n + j0, r[q]);
        }
    for (uint32_t i = nf > 8 ? nf : 8; i < n; i++)
        for (uint32_t j = 0; j < (i & ~7u); j++)
            g[(uint64_t)i * n + j] = g[(uint64_t)j * n + i];
}

/* ---- the subspace search, eight heads in the lanes (kern_lowrank.c's layout: element k of
 * row e at [(e * n + k) * 8 + head]); a register holds two elements k, k + 1 of a row --- */

#define LR5_V(p, k) _mm512_loadu_ps((p) + (uint64_t)(k) * 8)
#define LR5_B(p, k) _mm512_broadcast_f32x8(_mm256_loadu_ps((p) + (uint64_t)(k) * 8))

K5 void kern_lowrank512_gv(const float *G, const float *V, float *Z, uint32_t n, uint32_t c)
{
    for (uint32_t e = 0; e < c; e += 4) {
        const float *v[4];
        float *z[4];
        for (uint32_t q = 0; q < 4; q++) { /* rows past c: row e again, the same values */
            const uint32_t eq = e + q < c ? e + q : e;
            v[q] = V + (uint64_t)eq * n * 8;
            z[q] = Z + (uint64_t)eq * n * 8;
        }
        uint32_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m512 acc[4][4];
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++)
                    acc[q][b] = _mm512_setzero_ps();
            for (uint32_t j = 0; j < n; j++) {
                const float *gj = G + ((uint64_t)j * n + i) * 8;
                __m512 gv[4];
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++)
                    gv[b] = LR5_V(gj, 2 * b);
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    const __m512 vb = LR5_B(v[q], j);
#pragma GCC unroll 4
                    for (int b = 0; b < 4; b++)
                        acc[q][b] = _mm512_add_ps(acc[q][b], _mm512_mul_ps(gv[b], vb));
                }
            }
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++)
                    _mm512_storeu_ps(z[q] + (uint64_t)(i + 2 * b) * 8, acc[q][b]);
        }
        for (; i < n; i++) /* the last n % 8 rows, one at a time */
            for (int q = 0; q < 4; q++) {
                __m256 acc = _mm256_setzero_ps();
                for (uint32_t j = 0; j < n; j++)
                    acc = _mm256_add_ps(
                        acc, _mm256_mul_ps(_mm256_loadu_ps(G + ((uint64_t)j * n + i) * 8),
                                           _mm256_loadu_ps(v[q] + (uint64_t)j * 8)));
                _mm256_storeu_ps(z[q] + (uint64_t)i * 8, acc);
            }
    }
}

/* kern_lowrank_dot per lane, n a multiple of 8: register r holds classes 2r and 2r + 1. */
K5I __m256 lr5_dot(const float *a, const float *b, uint32_t n)
{
    __m512 p0 = _mm512_setzero_ps(), p1 = p0, p2 = p0, p3 = p0;
    for (uint32_t k = 0; k < n; k += 8) {
        p0 = _mm512_add_ps(p0, _mm512_mul_ps(LR5_V(a, k), LR5_V(b, k)));
        p1 = _mm512_add_ps(p1, _mm512_mul_ps(LR5_V(a, k + 2), LR5_V(b, k + 2)));
        p2 = _mm512_add_ps(p2, _mm512_mul_ps(LR5_V(a, k + 4), LR5_V(b, k + 4)));
        p3 = _mm512_add_ps(p3, _mm512_mul_ps(LR5_V(a, k + 6), LR5_V(b, k + 6)));
    }
#define LR5_PAIR(p) _mm256_add_ps(_mm512_castps512_ps256(p), _mm512_extractf32x8_ps(p, 1))
    return _mm256_add_ps(_mm256_add_ps(LR5_PAIR(p0), LR5_PAIR(p1)),
                         _mm256_add_ps(LR5_PAIR(p2), LR5_PAIR(p3)));
#undef LR5_PAIR
}

/* kern_lowrank_dot per lane of two rows held in registers (nv of them, n = 2 nv). */
K5I __m256 lr5_dot_regs(const __m512 *a, const __m512 *b, const uint32_t nv)
{
    __m512 p[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
#pragma GCC unroll 32
    for (uint32_t k = 0; k < nv; k++)
        p[k & 3] = _mm512_add_ps(p[k & 3], _mm512_mul_ps(a[k], b[k]));
#define LR5_PAIR(q) _mm256_add_ps(_mm512_castps512_ps256(q), _mm512_extractf32x8_ps(q, 1))
    return _mm256_add_ps(_mm256_add_ps(LR5_PAIR(p[0]), LR5_PAIR(p[1])),
                         _mm256_add_ps(LR5_PAIR(p[2]), LR5_PAIR(p[3])));
#undef LR5_PAIR
}

/* kern_lowrank_orth with the column being made orthonormal held in nv registers (n = 2 nv):
 * each step of modified Gram-Schmidt is a dot and an update of that column, one after the
 * other, and through memory each would wait on the last one's stores. */
K5I void lr5_orth_regs(const float *Z, float *V, uint32_t c, const uint32_t nv)
{
    const uint32_t n = 2 * nv;
    const __m256 eps = _mm256_set1_ps(1e-12f), one = _mm256_set1_ps(1.0f);
    for (uint32_t e = 0; e < c; e++) {
        __m512 ve[16], vj[16];
#pragma GCC unroll 16
        for (uint32_t k = 0; k < nv; k++)
            ve[k] = LR5_V(Z + (uint64_t)e * n * 8, 2 * k);
        const __m256 nrm0 = lr5_dot_regs(ve, ve, nv);
        for (int pass = 0; pass < 2; pass++)
            for (uint32_t j = 0; j < e; j++) {
#pragma GCC unroll 16
                for (uint32_t k = 0; k < nv; k++)
                    vj[k] = LR5_V(V + (uint64_t)j * n * 8, 2 * k);
                const __m512 d = _mm512_broadcast_f32x8(lr5_dot_regs(vj, ve, nv));
#pragma GCC unroll 16
                for (uint32_t k = 0; k < nv; k++)
                    ve[k] = _mm512_sub_ps(ve[k], _mm512_mul_ps(d, vj[k]));
            }
        const __m256 nrm = lr5_dot_regs(ve, ve, nv);
        /* nrm > 1e-12 nrm0 ? 1 / sqrt(nrm) : 0 (NaN: 0) */
        const __m512 inv = _mm512_broadcast_f32x8(
            _mm256_and_ps(_mm256_cmp_ps(nrm, _mm256_mul_ps(eps, nrm0), _CMP_GT_OQ),
                          _mm256_div_ps(one, _mm256_sqrt_ps(nrm))));
#pragma GCC unroll 16
        for (uint32_t k = 0; k < nv; k++)
            _mm512_storeu_ps(V + ((uint64_t)e * n + 2 * k) * 8, _mm512_mul_ps(ve[k], inv));
    }
}

K5 void kern_lowrank512_orth(const float *Z, float *V, uint32_t n, uint32_t c)
{
    if (n == 32) {
        lr5_orth_regs(Z, V, c, 16);
        return;
    }
    if (n == 16) {
        lr5_orth_regs(Z, V, c, 8);
        return;
    }
    const __m256 eps = _mm256_set1_ps(1e-12f), one = _mm256_set1_ps(1.0f);
    for (uint32_t e = 0; e < c; e++) {
        float *ve = V + (uint64_t)e * n * 8;
        memcpy(ve, Z + (uint64_t)e * n * 8, (size_t)n * 8 * sizeof(float));
        const __m256 nrm0 = lr5_dot(ve, ve, n);
        for (int pass = 0; pass < 2; pass++)
            for (uint32_t j = 0; j < e; j++) {
                const float *vj = V + (uint64_t)j * n * 8;
                const __m512 d = _mm512_broadcast_f32x8(lr5_dot(vj, ve, n));
                for (uint32_t k = 0; k < n; k += 2)
                    _mm512_storeu_ps(ve + k * 8,
                                     _mm512_sub_ps(LR5_V(ve, k), _mm512_mul_ps(d, LR5_V(vj, k))));
            }
        const __m256 nrm = lr5_dot(ve, ve, n);
        const __m512 inv = _mm512_broadcast_f32x8(
            _mm256_and_ps(_mm256_cmp_ps(nrm, _mm256_mul_ps(eps, nrm0), _CMP_GT_OQ),
                          _mm256_div_ps(one, _mm256_sqrt_ps(nrm))));
        for (uint32_t k = 0; k < n; k += 2)
            _mm512_storeu_ps(ve + k * 8, _mm512_mul_ps(LR5_V(ve, k), inv));
    }
}
#undef LR5_V
#undef LR5_B
