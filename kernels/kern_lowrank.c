/*
 * kern_lowrank.c — LOWRANK: each head's keys as rank-r factors, r the smallest rank that
 * holds the recipe's share of their energy (kern_ext.h has the format and the arithmetic).
 * Values are q8_0 sections (kern_codec_as), decoded here only beside their keys
 * (kern_lowrank_dec_kv).
 *
 * DESIGN
 * Keys of a head span few directions (their spectrum decays fast: Loki, Palu, "Eigen
 * Attention"), so a block's K, T x D, is close to a rank-r product. The factors come from the
 * leading subspace of the smaller Gram matrix (T x T or D x D, at most 64 x 64: a real block
 * has 16-32 tokens) by subspace iteration on the R vectors the format can hold
 * (kern_lowrank_eig: a full eigendecomposition by Jacobi sweeps cost O(n^3) per sweep for
 * n - R vectors nobody stores). The reference runs kern_ext.h as it is. The AVX2 version
 * takes the heads eight at a time: each head's Gram matrix (its upper half in tiles of 2 x 4
 * rows, eight entries' sums in registers), then the search with the eight heads in the lanes
 * of a vector (each lane the reference's scalar code: MGS's chains of dependent dots overlap
 * across heads instead of waiting), then each head's factors (four projections at a time);
 * it decodes every head's factors first, then the rows as a blocked product (4 tokens x 16
 * channels in registers) four tokens at a time across the heads, stored straight to the raw
 * halves in memory order. Every sum keeps the order kern_ext.h defines, so all give the same
 * bytes. Where the CPU has AVX-512 (kern_rot512_on()), kern_lowrank512.c takes the Gram
 * matrix, the search's products and orthogonalisation, the projections and the decode's
 * product; from 1 MiB of output its rows are streamed, and a layer whose values are q8_0 has
 * them decoded between the key tiles (kern_lowrank_dec_kv, kern_q8512.c), the next layer's
 * sections prefetched meanwhile.
 */
#include <errno.h>
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern_avx2.h"
#include "kernels/kern_cpu.h"
#include "kernels/kern_ext.h"
#include "kernels/kern_st512.h"

/* ---- reference ---------------------------------------------------------------------------- */

/* g[n][n] = K K^T (T <= D: n = T, sum over channels) or K^T K (n = D, sum over tokens). */
static void lr_gram_ref(const float *x, uint32_t T, uint32_t D, float *g)
{
    const int by_tok = T <= D;
    const uint32_t n = by_tok ? T : D, m = by_tok ? D : T;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n; j++) {
            float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (uint32_t k = 0; k < m; k++) {
                float a = by_tok ? x[(uint64_t)i * D + k] : x[(uint64_t)k * D + i];
                float b = by_tok ? x[(uint64_t)j * D + k] : x[(uint64_t)k * D + j];
                p[k & 7] = KERN_ADD(p[k & 7], KERN_MUL(a, b));
            }
            g[i * n + j] = kern_sum8_fold(p);
        }
}

/* The projection of factor e: T <= D: w[d] = sum_t u[t] x[t][d] / sigma (u = column e of v);
 * else u[t] = sum_d x[t][d] w[d] / sigma (w = column e of v). */
static void lr_project_ref(const float *x, uint32_t T, uint32_t D, const float *v, uint32_t e,
                           float sigma, float *u, float *w)
{
    const uint32_t n = T <= D ? T : D;
    if (T <= D) {
        for (uint32_t t = 0; t < T; t++)
            u[t] = v[t * n + e];
        for (uint32_t d = 0; d < D; d++) {
            float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (uint32_t t = 0; t < T; t++)
                p[t & 7] = KERN_ADD(p[t & 7], KERN_MUL(u[t], x[(uint64_t)t * D + d]));
            w[d] = sigma > 0.0f ? KERN_DIV(kern_sum8_fold(p), sigma) : 0.0f;
        }
    } else {
        for (uint32_t d = 0; d < D; d++)
            w[d] = v[d * n + e];
        for (uint32_t t = 0; t < T; t++) {
            float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (uint32_t d = 0; d < D; d++)
                p[d & 7] = KERN_ADD(p[d & 7], KERN_MUL(x[(uint64_t)t * D + d], w[d]));
            u[t] = sigma > 0.0f ? KERN_DIV(kern_sum8_fold(p), sigma) : 0.0f;
        }
    }
}

/* ---- AVX2: the same sums, a vector at a time -------------------------------------------- */

KT static inline __attribute__((always_inline)) __m256 lr_load(const float *p, uint32_t n)
{
    if (n >= 8)
        return _mm256_loadu_ps(p);
    float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    memcpy(f, p, n * sizeof(float));
    return _mm256_loadu_ps(f);
}

KT static inline __attribute__((always_inline)) void lr_store(float *p, __m256 v, uint32_t n)
{
    float f[8];
    if (n >= 8) {
        _mm256_storeu_ps(p, v);
        return;
    }
    _mm256_storeu_ps(f, v);
    memcpy(p, f, n * sizeof(float));
}

/* Eight vectors of partial sums (one per class k % 8) folded lane by lane as kern_sum8_fold. */
KT static __m256 lr_fold8(const __m256 *p)
{
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3])),
                         _mm256_add_ps(_mm256_add_ps(p[4], p[5]), _mm256_add_ps(p[6], p[7])));
}

/* kern_sum8_fold of eight vectors at once: lane k of the result folds p[k]'s lanes, as
 * ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). */
KT static __m256 lr_fold8_lanes(const __m256 *p)
{
    __m256 q0 = _mm256_hadd_ps(_mm256_hadd_ps(p[0], p[1]), _mm256_hadd_ps(p[2], p[3]));
    __m256 q1 = _mm256_hadd_ps(_mm256_hadd_ps(p[4], p[5]), _mm256_hadd_ps(p[6], p[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20),
                         _mm256_permute2f128_ps(q0, q1, 0x31));
}

/* g = K K^T (T <= D): tiles of two rows i by four rows j, the eight entries' sums in eight
 * vectors (channel k in lane k % 8), so a step loads six vectors for eight products; the
 * tiles cover the upper half and g's symmetry (a * b == b * a, the same order) the rest. */
KT static void lr_gram_tok_avx2(const float *x, uint32_t n, uint32_t D, float *g)
{
    const uint32_t dv = D & ~7u;
    float f[8];
    for (uint32_t i0 = 0; i0 < n; i0 += 2)
        for (uint32_t j0 = i0 & ~3u; j0 < n; j0 += 4) {
            /* rows past n: row i0 or j0 again, their entries not stored */
            const float *a0 = x + (uint64_t)i0 * D,
                        *a1 = x + (uint64_t)(i0 + 1 < n ? i0 + 1 : i0) * D;
            const float *b0 = x + (uint64_t)j0 * D;
            const float *b1 = x + (uint64_t)(j0 + 1 < n ? j0 + 1 : j0) * D;
            const float *b2 = x + (uint64_t)(j0 + 2 < n ? j0 + 2 : j0) * D;
            const float *b3 = x + (uint64_t)(j0 + 3 < n ? j0 + 3 : j0) * D;
            __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0, q0 = p0, q1 = p0, q2 = p0,
                   q3 = p0;
            uint32_t k = 0;
#define LR_STEP(LD)                                                                                \
    do {                                                                                           \
        const __m256 u0 = LD(a0), u1 = LD(a1), c0 = LD(b0), c1 = LD(b1), c2 = LD(b2), c3 = LD(b3); \
        p0 = _mm256_add_ps(p0, _mm256_mul_ps(u0, c0));                                             \
        p1 = _mm256_add_ps(p1, _mm256_mul_ps(u0, c1));                                             \
        p2 = _mm256_add_ps(p2, _mm256_mul_ps(u0, c2));                                             \
        p3 = _mm256_add_ps(p3, _mm256_mul_ps(u0, c3));                                             \
        q0 = _mm256_add_ps(q0, _mm256_mul_ps(u1, c0));                                             \
        q1 = _mm256_add_ps(q1, _mm256_mul_ps(u1, c1));                                             \
        q2 = _mm256_add_ps(q2, _mm256_mul_ps(u1, c2));                                             \
        q3 = _mm256_add_ps(q3, _mm256_mul_ps(u1, c3));                                             \
    } while (0)
#define LR_FULL(r) _mm256_loadu_ps((r) + k)
#define LR_TAIL(r) lr_load((r) + k, D - k)
            for (; k < dv; k += 8)
                LR_STEP(LR_FULL);
            if (k < D) /* the tail's lanes past D: 0 * 0 added to a sum that is never -0 */
                LR_STEP(LR_TAIL);
#undef LR_FULL
#undef LR_TAIL
#undef LR_STEP
            const __m256 p[8] = {p0, p1, p2, p3, q0, q1, q2, q3};
            _mm256_storeu_ps(f, lr_fold8_lanes(p));
            for (uint32_t r = 0; r < 2 && i0 + r < n; r++)
                for (uint32_t c = 0; c < 4 && j0 + c < n; c++) {
                    const uint32_t i = i0 + r, j = j0 + c;
                    if (j >= i)
                        g[i * n + j] = g[j * n + i] = f[r * 4 + c];
                }
        }
}

KT static void lr_gram_avx2(const float *x, uint32_t T, uint32_t D, float *g)
{
    if (T <= D) {
        lr_gram_tok_avx2(x, T, D, g);
        return;
    }
    /* sum over tokens: token k into partial vector k % 8, eight entries j at a time */
    const uint32_t n = D;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n; j += 8) {
            __m256 p[8];
            for (int c = 0; c < 8; c++)
                p[c] = _mm256_setzero_ps();
            for (uint32_t k = 0; k < T; k++) {
                __m256 a = _mm256_set1_ps(x[(uint64_t)k * D + i]);
                p[k & 7] = _mm256_add_ps(p[k & 7],
                                         _mm256_mul_ps(a, lr_load(x + (uint64_t)k * D + j, n - j)));
            }
            lr_store(g + i * n + j, lr_fold8(p), n - j);
        }
}

/* lr_project_ref's u for T > D, w the factor's row (column e of v): token t's dot with w in
 * kern_sum8 order (channel d in lane d % 8), then the fold and the division. */
KT static void lr_project_dim_avx2(const float *x, uint32_t T, uint32_t D, const float *w,
                                   float sigma, float *u)
{
    float f[8];
    for (uint32_t t = 0; t < T; t++) {
        __m256 p = _mm256_setzero_ps();
        for (uint32_t d = 0; d < D; d += 8)
            p = _mm256_add_ps(p, _mm256_mul_ps(lr_load(x + (uint64_t)t * D + d, D - d),
                                               lr_load(w + d, D - d)));
        _mm256_storeu_ps(f, p);
        u[t] = sigma > 0.0f ? KERN_DIV(kern_sum8_fold(f), sigma) : 0.0f;
    }
}

/* lr_project_ref's w for every factor (T <= D; u[i] factor i's column of v, sig[i] its
 * sigma, w[i] its row out): channels d in the lanes; for four factors at once, partial c of
 * each (tokens c, c + 8, ... in order) is summed one class after another (four live sums:
 * AVX2 has 16 registers, eight classes of four factors would spill), kept aside, then folded
 * as kern_sum8_fold. A step loads one vector of x for four products. */
KT static void lr_project_tok_avx2(const float *x, uint32_t T, uint32_t D, const float *const *u,
                                   const float *sig, uint32_t r, float *const *w)
{
    const __m256 z = _mm256_setzero_ps();
    const uint64_t step = 8ull * D;
    for (uint32_t e = 0; e < r; e += 4) {
        /* a chunk past r repeats its first factor; those rows are not stored */
        const uint32_t q1 = e + 1 < r ? e + 1 : e, q2 = e + 2 < r ? e + 2 : e,
                       q3 = e + 3 < r ? e + 3 : e;
        const float *u0 = u[e], *u1 = u[q1], *u2 = u[q2], *u3 = u[q3];
        for (uint32_t d = 0; d < D; d += 8) {
            const uint32_t m = D - d < 8 ? D - d : 8;
            __m256 part[8][4];
            for (uint32_t c = 0; c < 8; c++) {
                __m256 a0 = z, a1 = z, a2 = z, a3 = z;
                const float *xp = x + (uint64_t)c * D + d;
#define LR_TERM(LD)                                                                                \
    do {                                                                                           \
        const __m256 xv = LD;                                                                      \
        a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_broadcast_ss(u0 + t), xv));                    \
        a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_broadcast_ss(u1 + t), xv));                    \
        a2 = _mm256_add_ps(a2, _mm256_mul_ps(_mm256_broadcast_ss(u2 + t), xv));                    \
        a3 = _mm256_add_ps(a3, _mm256_mul_ps(_mm256_broadcast_ss(u3 + t), xv));                    \
    } while (0)
                if (m == 8)
                    for (uint32_t t = c; t < T; t += 8, xp += step)
                        LR_TERM(_mm256_loadu_ps(xp));
                else
                    for (uint32_t t = c; t < T; t += 8, xp += step)
                        LR_TERM(lr_load(xp, m));
#undef LR_TERM
                part[c][0] = a0;
                part[c][1] = a1;
                part[c][2] = a2;
                part[c][3] = a3;
            }
            for (uint32_t q = 0; q < 4 && e + q < r; q++) {
                const __m256 f = _mm256_add_ps(
                    _mm256_add_ps(_mm256_add_ps(part[0][q], part[1][q]),
                                  _mm256_add_ps(part[2][q], part[3][q])),
                    _mm256_add_ps(_mm256_add_ps(part[4][q], part[5][q]),
                                  _mm256_add_ps(part[6][q], part[7][q])));
                const float sg = sig[e + q];
                lr_store(w[e + q] + d, sg > 0.0f ? _mm256_div_ps(f, _mm256_set1_ps(sg)) : z, m);
            }
        }
    }
}

/* ---- AVX2: the subspace search, eight heads at once ---------------------------------------- */

/* The search (kern_lowrank_start, _gv, _orth, _pick) is chains of dependent sums: a dot of
 * modified Gram-Schmidt, then its update, then the next dot. One head a vector at a time
 * waits on every chain (a dot of 32 values is four adds in a row and a fold); with eight
 * heads in the lanes of a vector, each lane runs the reference's scalar code, every sum in its
 * order (sqrt and division are correctly rounded in both), and the lanes' work is throughput,
 * not latency. A matrix in lanes: element k of row e at [(e * n + k) * 8 + lane]. */
#define LR_LANES 8

/* Into lanes: dst[k] lane l = src[l][k], k < n. */
KT static void lr_to_lanes(const float *const *src, uint32_t n, float *dst)
{
    uint32_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 r[8];
        for (int l = 0; l < 8; l++)
            r[l] = _mm256_loadu_ps(src[l] + k);
        v_tr8x8(r);
        for (int q = 0; q < 8; q++)
            _mm256_storeu_ps(dst + (k + q) * 8, r[q]);
    }
    for (; k < n; k++)
        for (int l = 0; l < 8; l++)
            dst[k * 8 + l] = src[l][k];
}

/* Out of lanes: dst[l][k] = src[k] lane l, k < n. */
KT static void lr_from_lanes(const float *src, uint32_t n, float *const *dst)
{
    uint32_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 r[8];
        for (int q = 0; q < 8; q++)
            r[q] = _mm256_loadu_ps(src + (k + q) * 8);
        v_tr8x8(r);
        for (int l = 0; l < 8; l++)
            _mm256_storeu_ps(dst[l] + k, r[l]);
    }
    for (; k < n; k++)
        for (int l = 0; l < 8; l++)
            dst[l][k] = src[k * 8 + l];
}

#define LR_V(p, k) _mm256_loadu_ps((p) + (uint64_t)(k) * 8)

/* kern_lowrank_dot per lane: a and b rows of n in lanes. */
KT static __m256 lr_dot_lanes(const float *a, const float *b, uint32_t n)
{
    __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0, p4 = p0, p5 = p0, p6 = p0,
           p7 = p0;
    uint32_t k = 0;
#define LR_ACC(P, C) P = _mm256_add_ps(P, _mm256_mul_ps(LR_V(a, k + C), LR_V(b, k + C)))
    for (; k + 8 <= n; k += 8) {
        LR_ACC(p0, 0);
        LR_ACC(p1, 1);
        LR_ACC(p2, 2);
        LR_ACC(p3, 3);
        LR_ACC(p4, 4);
        LR_ACC(p5, 5);
        LR_ACC(p6, 6);
        LR_ACC(p7, 7);
    }
    /* the last n % 8: classes 0 .. n % 8 - 1 take one more term each */
    if (k + 0 < n)
        LR_ACC(p0, 0);
    if (k + 1 < n)
        LR_ACC(p1, 1);
    if (k + 2 < n)
        LR_ACC(p2, 2);
    if (k + 3 < n)
        LR_ACC(p3, 3);
    if (k + 4 < n)
        LR_ACC(p4, 4);
    if (k + 5 < n)
        LR_ACC(p5, 5);
    if (k + 6 < n)
        LR_ACC(p6, 6);
#undef LR_ACC
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(p0, p1), _mm256_add_ps(p2, p3)),
                         _mm256_add_ps(_mm256_add_ps(p4, p5), _mm256_add_ps(p6, p7)));
}

/* kern_lowrank_gv per lane: Z[e][i] = sum_j G[j][i] V[e][j], j in order from +0; tiles of two
 * columns e by four rows i (six loads for eight products). */
KT static void lr_gv_lanes(const float *G, const float *V, float *Z, uint32_t n, uint32_t c)
{
    for (uint32_t e = 0; e < c; e += 2) {
        const uint32_t e1 = e + 1 < c ? e + 1 : e;
        const float *v0 = V + (uint64_t)e * n * 8, *v1 = V + (uint64_t)e1 * n * 8;
        float *z0 = Z + (uint64_t)e * n * 8, *z1 = Z + (uint64_t)e1 * n * 8;
        uint32_t i = 0;
        for (; i + 4 <= n; i += 4) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0,
                   b3 = a0;
            for (uint32_t j = 0; j < n; j++) {
                const float *gj = G + ((uint64_t)j * n + i) * 8;
                const __m256 x0 = LR_V(v0, j), x1 = LR_V(v1, j);
                const __m256 g0 = LR_V(gj, 0), g1 = LR_V(gj, 1), g2 = LR_V(gj, 2),
                             g3 = LR_V(gj, 3);
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(g0, x0));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(g1, x0));
                a2 = _mm256_add_ps(a2, _mm256_mul_ps(g2, x0));
                a3 = _mm256_add_ps(a3, _mm256_mul_ps(g3, x0));
                b0 = _mm256_add_ps(b0, _mm256_mul_ps(g0, x1));
                b1 = _mm256_add_ps(b1, _mm256_mul_ps(g1, x1));
                b2 = _mm256_add_ps(b2, _mm256_mul_ps(g2, x1));
                b3 = _mm256_add_ps(b3, _mm256_mul_ps(g3, x1));
            }
            _mm256_storeu_ps(z0 + (i + 0) * 8, a0);
            _mm256_storeu_ps(z0 + (i + 1) * 8, a1);
            _mm256_storeu_ps(z0 + (i + 2) * 8, a2);
            _mm256_storeu_ps(z0 + (i + 3) * 8, a3);
            _mm256_storeu_ps(z1 + (i + 0) * 8, b0);
            _mm256_storeu_ps(z1 + (i + 1) * 8, b1);
            _mm256_storeu_ps(z1 + (i + 2) * 8, b2);
            _mm256_storeu_ps(z1 + (i + 3) * 8, b3);
        }
        for (; i < n; i++) {
            __m256 a0 = _mm256_setzero_ps(), b0 = a0;
            for (uint32_t j = 0; j < n; j++) {
                const __m256 g0 = LR_V(G, (uint64_t)j * n + i);
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(g0, LR_V(v0, j)));
                b0 = _mm256_add_ps(b0, _mm256_mul_ps(g0, LR_V(v1, j)));
            }
            _mm256_storeu_ps(z0 + i * 8, a0);
            _mm256_storeu_ps(z1 + i * 8, b0);
        }
    }
}

/* kern_lowrank_orth per lane. */
KT static void lr_orth_lanes(const float *Z, float *V, uint32_t n, uint32_t c)
{
    const __m256 eps = _mm256_set1_ps(1e-12f), one = _mm256_set1_ps(1.0f);
    for (uint32_t e = 0; e < c; e++) {
        float *ve = V + (uint64_t)e * n * 8;
        memcpy(ve, Z + (uint64_t)e * n * 8, (size_t)n * 8 * sizeof(float));
        const __m256 nrm0 = lr_dot_lanes(ve, ve, n);
        for (int pass = 0; pass < 2; pass++)
            for (uint32_t j = 0; j < e; j++) {
                const float *vj = V + (uint64_t)j * n * 8;
                const __m256 d = lr_dot_lanes(vj, ve, n);
                for (uint32_t k = 0; k < n; k++)
                    _mm256_storeu_ps(ve + k * 8,
                                     _mm256_sub_ps(LR_V(ve, k), _mm256_mul_ps(d, LR_V(vj, k))));
            }
        const __m256 nrm = lr_dot_lanes(ve, ve, n);
        /* nrm > 1e-12 nrm0 ? 1 / sqrt(nrm) : 0 (NaN: 0) */
        const __m256 inv =
            _mm256_and_ps(_mm256_cmp_ps(nrm, _mm256_mul_ps(eps, nrm0), _CMP_GT_OQ),
                          _mm256_div_ps(one, _mm256_sqrt_ps(nrm)));
        for (uint32_t k = 0; k < n; k++)
            _mm256_storeu_ps(ve + k * 8, _mm256_mul_ps(LR_V(ve, k), inv));
    }
}

/* kern_put_h(o + k * stride, kern_sanitize(a[k])) for k < n, eight at a time (F16C rounds
 * to nearest even as kern_f2h; NaN becomes 0 and the rest is clamped to +-KERN_FP16_MAX,
 * as kern_sanitize). */
KT static void lr_put_h_avx2(uint8_t *o, uint64_t stride, const float *a, uint32_t n)
{
    const __m256 hi = _mm256_set1_ps(KERN_FP16_MAX), lo = _mm256_set1_ps(-KERN_FP16_MAX);
    for (uint32_t k = 0; k < n; k += 8) {
        const uint32_t m = n - k < 8 ? n - k : 8;
        __m256 v = lr_load(a + k, m);
        v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
        v = _mm256_max_ps(_mm256_min_ps(v, hi), lo);
        uint16_t hv[8];
        _mm_storeu_si128((__m128i *)hv, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        if (stride == 2 && m == 8) {
            memcpy(o + 2ull * k, hv, 16);
            continue;
        }
        for (uint32_t j = 0; j < m; j++)
            memcpy(o + (uint64_t)(k + j) * stride, &hv[j], 2);
    }
}

/* Head h of a LOWRANK section decoded straight into its raw rows (o: row t at o + t * stride
 * halves, dtype out_dtype). su (T x rank) and wf (rank x D) scratch: sigma_i * u[t][i] and the
 * w rows as floats, found once per head (lr_factors_avx2; wide: wf by kern_lowrank512_wf);
 * then (lr_rows_avx2) a blocked product in registers: tiles of four tokens by 16 channels
 * (eight accumulators), each summed over i in order from +0 by fused multiply-adds as
 * kern_lowrank_val, rounded to halves as kern_store. Odd widths (D not a multiple of 16) a
 * vector or a lane at a time. The product needs the FMA instruction (KTF); a CPU without it
 * (kern_avx2_have_fma clear: the tests clear it too) takes lr_rows_nofma, the reference's
 * element by element. */
KT static void lr_factors_avx2(const uint8_t *head, uint32_t rank, uint32_t cap, uint32_t T,
                               uint32_t D, float *su, float *wf, int wide)
{
    const uint8_t *u = kern_lowrank_u(head, cap), *w = kern_lowrank_w(head, cap, T);
    /* su[t][i] = sigma_i * u[t][i]: row t of u is cap halves in a row, eight at a time */
    for (uint32_t i = 0; i < rank; i += 8) {
        const uint32_t m = rank - i < 8 ? rank - i : 8;
        float sg[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (m < 8)
            memcpy(sg, head + 16 + 4 * i, 4 * m);
        /* eight sigmas loaded as they are: through sg, the vector load waited on the copy's
         * four-byte stores (no forwarding from several stores) */
        const __m256 sv = m == 8 ? _mm256_loadu_ps((const float *)(head + 16 + 4 * i))
                                 : _mm256_loadu_ps(sg);
        if (m == 8) { /* straight from u to su: no bounce through the stack */
            for (uint32_t t = 0; t < T; t++)
                _mm256_storeu_ps(
                    su + (uint64_t)t * rank + i,
                    _mm256_mul_ps(sv, _mm256_cvtph_ps(_mm_loadu_si128(
                                          (const __m128i *)(u + 2 * ((uint64_t)t * cap + i))))));
            continue;
        }
        for (uint32_t t = 0; t < T; t++) {
            uint16_t hv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            memcpy(hv, u + 2 * ((uint64_t)t * cap + i), 2 * m);
            float f[8];
            _mm256_storeu_ps(
                f, _mm256_mul_ps(sv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hv))));
            memcpy(su + (uint64_t)t * rank + i, f, 4 * m);
        }
    }
    if (wide) { /* D a multiple of 16: kern_lowrank512.c, sixteen at a time */
        kern_lowrank512_wf(w, rank, D, wf);
        return;
    }
    for (uint32_t i = 0; i < rank; i++) {
        const uint8_t *wr = w + 2ull * i * D;
        uint32_t d = 0;
        for (; d + 8 <= D; d += 8)
            _mm256_storeu_ps(wf + (uint64_t)i * D + d,
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wr + 2 * d))));
        for (; d < D; d++)
            wf[(uint64_t)i * D + d] = kern_get_h(wr + 2 * d);
    }
}

KTF static void lr_rows_avx2(uint32_t rank, uint32_t T, uint32_t D, uint16_t *o, uint64_t stride,
                             uint32_t out_dtype, const float *su, const float *wf)
{
    uint32_t t = 0;
    if (D % 16 == 0)
        for (; t + 4 <= T; t += 4)
            for (uint32_t d = 0; d < D; d += 16) {
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0,
                       e0 = a0, e1 = a0;
                for (uint32_t i = 0; i < rank; i++) {
                    const float *wi = wf + (uint64_t)i * D + d, *si = su + (uint64_t)t * rank + i;
                    const __m256 w0 = _mm256_loadu_ps(wi), w1 = _mm256_loadu_ps(wi + 8);
                    __m256 s = _mm256_broadcast_ss(si);
                    a0 = _mm256_fmadd_ps(s, w0, a0);
                    a1 = _mm256_fmadd_ps(s, w1, a1);
                    s = _mm256_broadcast_ss(si + rank);
                    b0 = _mm256_fmadd_ps(s, w0, b0);
                    b1 = _mm256_fmadd_ps(s, w1, b1);
                    s = _mm256_broadcast_ss(si + 2 * rank);
                    c0 = _mm256_fmadd_ps(s, w0, c0);
                    c1 = _mm256_fmadd_ps(s, w1, c1);
                    s = _mm256_broadcast_ss(si + 3 * rank);
                    e0 = _mm256_fmadd_ps(s, w0, e0);
                    e1 = _mm256_fmadd_ps(s, w1, e1);
                }
                uint16_t *r = o + (uint64_t)t * stride + d;
                v_store8(r, a0, out_dtype);
                v_store8(r + 8, a1, out_dtype);
                v_store8(r + stride, b0, out_dtype);
                v_store8(r + stride + 8, b1, out_dtype);
                v_store8(r + 2 * stride, c0, out_dtype);
                v_store8(r + 2 * stride + 8, c1, out_dtype);
                v_store8(r + 3 * stride, e0, out_dtype);
                v_store8(r + 3 * stride + 8, e1, out_dtype);
            }
    for (; t < T; t++) {
        uint32_t d = 0;
        for (; d + 8 <= D; d += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (uint32_t i = 0; i < rank; i++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(su[(uint64_t)t * rank + i]),
                                      _mm256_loadu_ps(wf + (uint64_t)i * D + d), acc);
            v_store8(o + (uint64_t)t * stride + d, acc, out_dtype);
        }
        for (; d < D; d++) {
            float acc = 0.0f;
            for (uint32_t i = 0; i < rank; i++)
                acc = KERN_FMA(su[(uint64_t)t * rank + i], wf[(uint64_t)i * D + d], acc);
            kern_store(o + (uint64_t)t * stride, out_dtype, d, acc);
        }
    }
}

static void lr_rows_nofma(uint32_t rank, uint32_t T, uint32_t D, uint16_t *o, uint64_t stride,
                          uint32_t out_dtype, const float *su, const float *wf)
{
    for (uint32_t t = 0; t < T; t++) {
        const float *st = su + (uint64_t)t * rank;
        for (uint32_t d = 0; d < D; d++) {
            float acc = 0.0f;
            for (uint32_t i = 0; i < rank; i++)
                acc = KERN_FMA(st[i], wf[(uint64_t)i * D + d], acc);
            kern_store(o + (uint64_t)t * stride, out_dtype, d, acc);
        }
    }
}

static void lr_rows_ref(const uint8_t *head, uint32_t rank, uint32_t cap, uint32_t T, uint32_t D,
                        float *y)
{
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t d = 0; d < D; d++)
            y[(uint64_t)t * D + d] = kern_lowrank_val(head, rank, cap, T, D, t, d);
}

/* ---- the section ------------------------------------------------------------------------- */

/* A group of up to eight heads h0 .. h0 + nh - 1 of the section (n >= 2): each head's keys
 * and Gram matrix, the search with the heads in lanes (lanes past nh repeat head h0), then
 * each head's rank, sigmas and factors. x: 8 heads' keys (T x D each); g: 8 Gram matrices;
 * G, V, Z: the lanes' Gram matrix, vectors and products; vh: 8 heads' vectors (c x n each,
 * vector e's row at e * n); w: the factors' rows (cap x D). */
struct lr_work {
    float *x, *g, *G, *V, *Z, *vh, *w;
};

/* What the AVX-512 file takes (kern_lowrank512.c), where kern_rot512_on(): the Gram matrix
 * K K^T (T <= D), the factors' projections (T <= D, D a multiple of 16) and parts of the
 * search. */
enum lr_wide {
    LR_WIDE_GRAM = 1,
    LR_WIDE_PROJECT = 2,
    LR_WIDE_GV = 4,   /* the search's products g V */
    LR_WIDE_ORTH = 8, /* its orthogonalisation (n a multiple of 8) */
};

KT static void lr_enc_group_avx2(const struct kern_cpu_ops *ops, const struct kern_ext_ctx *cx,
                                 uint8_t *sect, uint32_t h0, uint32_t nh, const struct lr_work *ws,
                                 int wide)
{
    const struct kern_layout *lay = cx->lay;
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim;
    const uint32_t n = T <= D ? T : D, cap = kern_lowrank_cap(D, T), c = cap < n ? cap : n;
    const uint64_t hb = kern_lowrank_head_bytes(D, T), xs = (uint64_t)T * D, gs = (uint64_t)n * n;
    const float keep = kern_lowrank_keep(cx->rec->lowrank_energy);
    const float *src[LR_LANES];
    float *dst[LR_LANES], total[LR_LANES], lam[16 * LR_LANES];
    uint32_t ord[LR_LANES][64];
    for (uint32_t l = 0; l < LR_LANES; l++) {
        const float *g = ws->g + (l < nh ? l : 0) * gs;
        if (l < nh) {
            ops->load(cx->rawk + 2ull * (h0 + l) * D, lay->dtype, (uint64_t)H * D, T, D,
                      ws->x + l * xs);
            if (wide & LR_WIDE_GRAM)
                kern_lowrank512_gram(ws->x + l * xs, T, D, ws->g + l * gs);
            else
                lr_gram_avx2(ws->x + l * xs, T, D, ws->g + l * gs);
        }
        /* kern_lowrank_start's trace and its c columns of g with the largest diagonal (the
         * same selection, the diagonal's values kept beside ord: dv[j] = g's ord[j]-th) */
        float dv[64];
        total[l] = 0.0f;
        for (uint32_t i = 0; i < n; i++) {
            const float e = dv[i] = g[i * n + i];
            total[l] = KERN_ADD(total[l], e > 0.0f ? e : 0.0f);
            ord[l][i] = i;
        }
        for (uint32_t i = 0; i < c; i++) {
            uint32_t best = i, bo = ord[l][i];
            float bv = dv[i];
            for (uint32_t j = i + 1; j < n; j++)
                if (dv[j] > bv || (dv[j] == bv && ord[l][j] < bo)) {
                    best = j;
                    bv = dv[j];
                    bo = ord[l][j];
                }
            ord[l][best] = ord[l][i];
            ord[l][i] = bo;
            dv[best] = dv[i];
            dv[i] = bv;
        }
    }
    for (uint32_t j = 0; j < n; j++) {
        for (uint32_t l = 0; l < LR_LANES; l++)
            src[l] = ws->g + (l < nh ? l : 0) * gs + j * n;
        lr_to_lanes(src, n, ws->G + (uint64_t)j * n * 8);
    }
    for (uint32_t i = 0; i < c; i++) {
        for (uint32_t l = 0; l < LR_LANES; l++)
            src[l] = ws->g + (l < nh ? l : 0) * gs + ord[l][i] * n;
        lr_to_lanes(src, n, ws->Z + (uint64_t)i * n * 8);
    }
#define LR_GV() (wide & LR_WIDE_GV ? kern_lowrank512_gv : lr_gv_lanes)(ws->G, ws->V, ws->Z, n, c)
#define LR_ORTH() (wide & LR_WIDE_ORTH ? kern_lowrank512_orth : lr_orth_lanes)(ws->Z, ws->V, n, c)
    LR_ORTH();
    for (int it = 0; it < KERN_LOWRANK_ITERS; it++) {
        LR_GV();
        LR_ORTH();
    }
    LR_GV();
#undef LR_GV
#undef LR_ORTH
    /* kern_lowrank_pick: each vector's energy v . (g v), then the vectors out of the lanes */
    for (uint32_t e = 0; e < c; e++) {
        const __m256 l = lr_dot_lanes(ws->V + (uint64_t)e * n * 8, ws->Z + (uint64_t)e * n * 8, n);
        _mm256_storeu_ps(lam + e * 8,
                         _mm256_and_ps(_mm256_cmp_ps(l, _mm256_setzero_ps(), _CMP_GT_OQ), l));
        for (uint32_t k = 0; k < LR_LANES; k++)
            dst[k] = ws->vh + ((uint64_t)k * c + e) * n;
        lr_from_lanes(ws->V + (uint64_t)e * n * 8, n, dst);
    }
    for (uint32_t l = 0; l < nh; l++) {
        uint8_t *head = sect + (h0 + l) * hb;
        uint32_t *o = ord[l], r = c;
        const float *x = ws->x + l * xs, *vh = ws->vh + (uint64_t)l * c * n;
        memset(head, 0, hb);
        for (uint32_t e = 0; e < c; e++)
            o[e] = e;
        for (uint32_t i = 0; i < c; i++) {
            uint32_t best = i;
            for (uint32_t j = i + 1; j < c; j++) {
                float a = lam[o[j] * 8 + l], b = lam[o[best] * 8 + l];
                if (a > b || (a == b && o[j] < o[best]))
                    best = j;
            }
            const uint32_t tmp = o[i];
            o[i] = o[best];
            o[best] = tmp;
        }
        if (!(total[l] > 0.0f))
            r = 0;
        else {
            const float want = KERN_MUL(keep, total[l]);
            float cum = 0.0f;
            for (uint32_t i = 0; i < c; i++) {
                cum = KERN_ADD(cum, lam[o[i] * 8 + l]);
                if (cum >= want) {
                    r = i + 1;
                    break;
                }
            }
        }
        memcpy(head, &r, 4);
        uint8_t *uo = head + 16 + 4 * cap, *wo = uo + 2ull * T * cap;
        float sig[16];
        for (uint32_t i = 0; i < r; i++) {
            sig[i] = sqrtf(lam[o[i] * 8 + l]); /* lam >= +0: kern_lowrank_pick clamped it */
            memcpy(head + 16 + 4 * i, &sig[i], 4);
        }
        /* the factor's vector: u (T <= D) or w (else) as it is, the other projected */
        if (T <= D) {
            const float *uc[16];
            float *wr[16];
            for (uint32_t i = 0; i < r; i++) {
                uc[i] = vh + (uint64_t)o[i] * n;
                wr[i] = ws->w + (uint64_t)i * D;
            }
            if (wide & LR_WIDE_PROJECT)
                kern_lowrank512_project(x, T, D, uc, sig, r, wr);
            else
                lr_project_tok_avx2(x, T, D, uc, sig, r, wr);
            for (uint32_t i = 0; i < r; i++) {
                lr_put_h_avx2(uo + 2ull * i, 2ull * cap, vh + (uint64_t)o[i] * n, T);
                lr_put_h_avx2(wo + 2ull * i * D, 2, ws->w + (uint64_t)i * D, D);
            }
        } else
            for (uint32_t i = 0; i < r; i++) {
                lr_project_dim_avx2(x, T, D, vh + (uint64_t)o[i] * n, sig[i], ws->w);
                lr_put_h_avx2(uo + 2ull * i, 2ull * cap, ws->w, T);
                lr_put_h_avx2(wo + 2ull * i * D, 2, vh + (uint64_t)o[i] * n, D);
            }
    }
}

static int lr_enc_avx2(const struct kern_cpu_ops *ops, const struct kern_ext_ctx *cx,
                       uint8_t *sect)
{
    const struct kern_layout *lay = cx->lay;
    const uint32_t T = lay->tokens, D = lay->head_dim;
    const uint32_t n = T <= D ? T : D, cap = kern_lowrank_cap(D, T), c = cap < n ? cap : n;
    const size_t xs = (size_t)T * D, gs = (size_t)n * n, vs = (size_t)c * n;
    const size_t ws_w = (size_t)cap * (T > D ? T : D);
    int wide = 0;
    if (kern_rot512_on())
        wide = LR_WIDE_GV | (n % 8 == 0 ? LR_WIDE_ORTH : 0) |
               (T <= D ? LR_WIDE_GRAM | (D % 16 == 0 ? LR_WIDE_PROJECT : 0) : 0);
    struct lr_work ws;
    ws.x = malloc((LR_LANES * (xs + 2 * gs + 3 * vs) + ws_w) * sizeof(float));
    if (!ws.x)
        return -ENOMEM;
    ws.g = ws.x + LR_LANES * xs;
    ws.G = ws.g + LR_LANES * gs;
    ws.V = ws.G + LR_LANES * gs;
    ws.Z = ws.V + LR_LANES * vs;
    ws.vh = ws.Z + LR_LANES * vs;
    ws.w = ws.vh + LR_LANES * vs;
    for (uint32_t h0 = 0; h0 < lay->heads; h0 += LR_LANES)
        lr_enc_group_avx2(ops, cx, sect, h0,
                          lay->heads - h0 < LR_LANES ? lay->heads - h0 : LR_LANES, &ws, wide);
    free(ws.x);
    return 0;
}

int kern_lowrank_enc(const struct kern_cpu_ops *ops, const struct kern_ext_ctx *c, uint8_t *sect)
{
    const struct kern_layout *lay = c->lay;
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim;
    const uint32_t n = T <= D ? T : D, cap = kern_lowrank_cap(D, T);
    const uint64_t hb = kern_lowrank_head_bytes(D, T);
    const float keep = kern_lowrank_keep(c->rec->lowrank_energy);
    if (ops != &kern_ref_ops && n >= 2) /* n == 1: the reference's 1 x 1 case, no search */
        return lr_enc_avx2(ops, c, sect);
    float *x = malloc(((size_t)T * D + 2 * (size_t)n * n + T + D) * sizeof(float) +
                      n * sizeof(uint32_t));
    if (!x)
        return -ENOMEM;
    float *g = x + (size_t)T * D, *v = g + (size_t)n * n, *u = v + (size_t)n * n, *w = u + T;
    uint32_t *ord = (uint32_t *)(w + D);
    for (uint32_t h = 0; h < H; h++) {
        uint8_t *head = sect + h * hb;
        memset(head, 0, hb);
        ops->load(c->rawk + 2ull * h * D, lay->dtype, (uint64_t)H * D, T, D, x);
        lr_gram_ref(x, T, D, g);
        uint32_t r = kern_lowrank_eig(g, v, n, cap, keep, ord);
        memcpy(head, &r, 4);
        uint8_t *uo = head + 16 + 4 * cap, *wo = uo + 2ull * T * cap;
        for (uint32_t i = 0; i < r; i++) {
            float e = g[ord[i] * n + ord[i]];
            float sigma = sqrtf(e > 0.0f ? e : 0.0f);
            memcpy(head + 16 + 4 * i, &sigma, 4);
            lr_project_ref(x, T, D, v, ord[i], sigma, u, w);
            for (uint32_t t = 0; t < T; t++)
                kern_put_h(uo + 2 * ((uint64_t)t * cap + i), kern_sanitize(u[t]));
            for (uint32_t d = 0; d < D; d++)
                kern_put_h(wo + 2 * ((uint64_t)i * D + d), kern_sanitize(w[d]));
        }
    }
    free(x);
    return 0;
}

/* The AVX2 / AVX-512 decode: every head's factors first (each head's bytes prefetched
 * LR_DEC_AHEAD heads ahead: the factors are the section's first read, and read one head at
 * a time they waited on memory a line at a time), then the rows four tokens at a time across
 * the heads, so the stores run through memory in order (a head at a time they are 2 D bytes
 * every 2 H D: through the cache each line waits on its read for ownership, +17 % out of
 * cache; streamed, a line split between two heads' rows is written in two pieces). Stores by
 * mode nt (kern_st512.h) where wide (kern_lowrank512.c). With vsect, the layer's q8_0 value
 * section is decoded into rawv in as many slices as there are tiles of keys, one after each
 * (its bytes asked for before the tile): the keys' product keeps the vector units busy and
 * leaves the memory idle, the values' decode the other way round, and interleaved each runs
 * while the other waits. pre: pre_bytes the caller reads next (the next layer's sections),
 * asked for a share after each tile, so that layer's factors and value groups are read
 * from the cache (perf put the factors' time on their cold reads; the gain is within the
 * shared host's noise: docs/kernels.md, issue 30). f: H fs floats, rk: H ranks. */
#define LR_DEC_AHEAD 2
static void lr_dec_rows(const uint8_t *sect, const struct kern_layout *lay, void *raw,
                        uint32_t out_dtype, float *f, uint32_t *rk, int wide, int nt,
                        const uint8_t *vsect, uint16_t *rawv, const uint8_t *pre,
                        uint64_t pre_bytes)
{
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim;
    const uint32_t cap = kern_lowrank_cap(D, T), tiles = (T + 3) / 4;
    const uint64_t hb = kern_lowrank_head_bytes(D, T), fs = (uint64_t)cap * (T + D);
    const uint64_t stride = (uint64_t)H * D;
    const uint64_t ng = (uint64_t)T * H * (D / 32), steps = (uint64_t)H * tiles;
    const int fma = __atomic_load_n(&kern_avx2_have_fma, __ATOMIC_RELAXED);
    for (uint64_t b = 0; b < hb * (H < LR_DEC_AHEAD ? H : LR_DEC_AHEAD); b += 64)
        _mm_prefetch((const char *)sect + b, _MM_HINT_T0);
    for (uint32_t h = 0; h < H; h++) {
        const uint8_t *head = sect + h * hb;
        if (h + LR_DEC_AHEAD < H)
            for (uint64_t b = 0; b < hb; b += 64)
                _mm_prefetch((const char *)head + LR_DEC_AHEAD * hb + b, _MM_HINT_T0);
        rk[h] = kern_lowrank_get_rank(head, cap);
        lr_factors_avx2(head, rk[h], cap, T, D, f + h * fs, f + h * fs + (uint64_t)rk[h] * T,
                        wide);
    }
    /* pre's bytes asked for a share a step, from the first tile on */
    const uint64_t pstep = (pre_bytes + 64 * steps - 1) / (64 * steps) * 64;
    uint64_t pb = 0;
    uint64_t g = 0; /* value groups decoded */
    for (uint32_t i = 0; i < tiles; i++)
        for (uint32_t h = 0; h < H; h++) {
            const uint32_t t0 = 4 * i, n = T - t0 < 4 ? T - t0 : 4;
            const float *su = f + h * fs + (uint64_t)t0 * rk[h],
                        *wf = f + h * fs + (uint64_t)rk[h] * T;
            uint16_t *o = (uint16_t *)raw + t0 * stride + (uint64_t)h * D;
            /* the values' groups [g, e) after this tile (step i H + h of steps) */
            const uint64_t e = vsect ? ng * ((uint64_t)i * H + h + 1) / steps : 0;
            for (uint64_t b = 34 * g; b < 34 * e; b += 64)
                _mm_prefetch((const char *)vsect + b, _MM_HINT_T0);
            for (const uint64_t pe = pre_bytes - pb < pstep ? pre_bytes : pb + pstep; pb < pe;
                 pb += 64)
                _mm_prefetch((const char *)pre + pb, _MM_HINT_T0);
            if (wide)
                kern_lowrank512_rows(rk[h], n, D, o, stride, out_dtype, su, wf, nt);
            else if (fma)
                lr_rows_avx2(rk[h], n, D, o, stride, out_dtype, su, wf);
            else
                lr_rows_nofma(rk[h], n, D, o, stride, out_dtype, su, wf);
            if (vsect) {
                kern_q8512_groups(vsect + 34 * g, e - g, rawv + 32 * g, out_dtype, nt);
                g = e;
            }
        }
    if (nt)
        _mm_sfence(); /* the streamed lines are ordered before whatever the caller does next */
}

int kern_lowrank_dec_kv(const struct kern_cpu_ops *ops, const struct kern_layout *lay,
                        const uint8_t *ksect, const uint8_t *vsect, void *rawk, void *rawv,
                        uint32_t out_dtype, const uint8_t *next, uint64_t next_bytes)
{
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim;
    /* every store a multiple of 64 bytes from rawk or rawv (D % 32 == 0) */
    const int nt = D % 32 == 0 ? kern_st512_mode(rawk, lay) : 0;
    if (ops == &kern_ref_ops || !kern_rot512_on() || !nt || kern_st512_mode(rawv, lay) != nt)
        return 0;
    const uint64_t fs = (uint64_t)kern_lowrank_cap(D, T) * (T + D);
    float *f = malloc((size_t)H * fs * sizeof(float) + (size_t)H * sizeof(uint32_t));
    if (!f)
        return -ENOMEM;
    lr_dec_rows(ksect, lay, rawk, out_dtype, f, (uint32_t *)(f + (size_t)H * fs), 1, nt, vsect,
                rawv, next, next_bytes);
    free(f);
    return 1;
}

int kern_lowrank_dec(const struct kern_cpu_ops *ops, const struct kern_layout *lay,
                     const uint8_t *sect, void *raw, uint32_t out_dtype)
{
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim;
    const uint32_t cap = kern_lowrank_cap(D, T);
    const uint64_t hb = kern_lowrank_head_bytes(D, T), fs = (uint64_t)cap * (T + D);
    if (ops != &kern_ref_ops) {
        const int wide = D % 16 == 0 && kern_rot512_on(); /* kern_lowrank512.c */
        /* streamed where every store is at a multiple of 64 bytes from raw (kern_st512.h) */
        const int nt = wide && D % 32 == 0 ? kern_st512_mode(raw, lay) : 0;
        float *f = malloc((size_t)H * fs * sizeof(float) + (size_t)H * sizeof(uint32_t));
        if (!f)
            return -ENOMEM;
        lr_dec_rows(sect, lay, raw, out_dtype, f, (uint32_t *)(f + (size_t)H * fs), wide, nt,
                    NULL, NULL, NULL, 0);
        free(f);
        return 0;
    }
    float *y = malloc((size_t)T * D * sizeof(float));
    if (!y)
        return -ENOMEM;
    for (uint32_t h = 0; h < H; h++) {
        const uint8_t *head = sect + h * hb;
        lr_rows_ref(head, kern_lowrank_get_rank(head, cap), cap, T, D, y);
        ops->store(y, T, D, (uint8_t *)raw + 2ull * h * D, out_dtype, (uint64_t)H * D);
    }
    free(y);
    return 0;
}
