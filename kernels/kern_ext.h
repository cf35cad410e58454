/*
 * kern_ext.h — the arithmetic of the transform codecs (ROT2/ROT4, MERGE, LOWRANK), shared by
 * the C reference, the AVX2 versions (kern_rot.c, kern_merge.c, kern_lowrank.c), the CUDA
 * encoder's units (kern_encb.h) and the batched decoder (kern_batch.h). Internal to kernels/.
 *
 * DESIGN
 * As kern_fmt.h: every function compiles as C and as __host__ __device__ C++, the float
 * operations single-rounded (KERN_MUL/ADD/SUB/DIV, sqrtf correctly rounded on both), so each
 * version gives the same bytes. Sums whose order a vectorised version would change are
 * defined in the order it takes: eight partial sums, element i into partial i % 8, then
 * ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)) (kern_sum8_*).
 *
 * ROT (QuaRot-style outlier spreading): a K section's head h in layer l is centred and
 * rotated per token. Centred: each channel's mean over the block's tokens (summed in token
 * order, divided by T, stored as fp16: mean^) is subtracted, x' = x - mean^, which takes the
 * constant offsets of outlier channels out (what KIVI's per-channel groups handle).
 * Rotated: y = c * H (s .* x'), H the Sylvester Hadamard matrix of order D (a power of two),
 * s a sign per channel from the section's seed (kern_rot_neg), c = 1 / sqrt(D) (an exact
 * power of two times a rounded sqrt 2): orthonormal up to rounding, its own inverse up to
 * the signs; H is applied as the in-place butterfly (kern_fwht: for len = 1, 2, ..., D / 2,
 * v[j] and v[j + len] become their sum and difference). The rotation spreads what varies
 * from token to token (massive activations) over all channels. The rows, clamped to the fp16
 * range, are quantized per token in KIVI's value groups (32 channels, fp16 scale and min,
 * b-bit codes). Decode: x = s .* (c * H y^) + mean^.
 * MERGE (token merging of cold blocks): per head, tokens are scanned in order; token t joins
 * the run that starts at token s when its key (and, K+V, its value) row is within the chord
 * of the cosine threshold of the run's first row — |x_t - x_s|^2 <= 2 (1 - cos) |x_s|^2,
 * which for rows of equal length is cos(x_t, x_s) >= cos — else it starts a run, while the
 * head has room for one (ceil(T / 2) rows); past that it joins the last run anyway (counted by
 * kern_merge_forced). K and V sections take the same runs (both are read to plan them) and
 * store each run once: the mean of its rows. Decode expands every token to its run's row.
 *
 * LOWRANK (keys per head as factors): K = U S W^T by the eigenvectors of the smaller Gram
 * matrix (K K^T when T <= D, else K^T K), Jacobi's method with a fixed order of rotations;
 * the rank r is the smallest whose eigenvalues hold `energy` of their sum, at most the room
 * R = ceil(min(T, D) / 4). Stored: sigma (fp32), u (fp16, unit columns), w (fp16, unit rows);
 * x^[t][d] = sum_i (sigma_i * u[t][i]) * w[i][d], summed over i in order from +0, each term
 * added by one fused multiply-add (KERN_FMA: acc = f_i * w[i][d] + acc rounded once, f_i =
 * sigma_i * u[t][i] rounded). The FMA is the decode's inner loop in every version (AVX2's
 * FMA build, AVX-512, the device); the encode never decodes, so only the decode has it.
 */
#ifndef KVC_KERN_EXT_H
#define KVC_KERN_EXT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kern.h"
#include "kernels/kern_fmt.h"

#define KERN_JACOBI_SWEEPS 12

/* Value (t, c) of head h of the (layer, kind) slab `raw` as a lossy codec sees it. */
KERN_HD float kern_ext_value(const struct kern_layout *lay, const uint8_t *raw, uint32_t t,
                             uint32_t h, uint32_t c)
{
    return kern_sanitize(
        kern_load(raw, lay->dtype, ((uint64_t)t * lay->heads + h) * lay->head_dim + c));
}

KERN_HD float kern_sum8_fold(const float *p)
{
    return KERN_ADD(KERN_ADD(KERN_ADD(p[0], p[1]), KERN_ADD(p[2], p[3])),
                    KERN_ADD(KERN_ADD(p[4], p[5]), KERN_ADD(p[6], p[7])));
}

/* ---- ROT ------------------------------------------------------------------------------- */

KERN_HD uint32_t kern_rot_mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
}

/* The seed a ROT K section of layer l stores: the recipe's, mixed with the layer. */
KERN_HD uint32_t kern_rot_sect_seed(uint32_t seed, uint32_t layer)
{
    return kern_rot_mix(seed ^ kern_rot_mix(0x632be5abu * (layer + 1u)));
}

/* 1 when channel j of head h takes the sign -1. */
KERN_HD uint32_t kern_rot_neg(uint32_t sseed, uint32_t h, uint32_t j)
{
    return kern_rot_mix(sseed ^ kern_rot_mix(h * 0x9e3779b1u + j + 1u)) & 1u;
}

/* 1 / sqrt(D) for D = 2^k: a power of two, times sqrt 2 rounded to float when k is odd. */
KERN_HD float kern_rot_scale(uint32_t dim)
{
    int k = 0;
    float p = 1.0f;
    while ((1u << k) < dim)
        k++;
    for (int i = 0; i < (k + 1) / 2; i++)
        p *= 0.5f;
    return (k & 1) ? KERN_MUL(1.41421354f, p) : p;
}

KERN_HD void kern_fwht(float *v, uint32_t dim)
{
    for (uint32_t len = 1; len < dim; len <<= 1)
        for (uint32_t i = 0; i < dim; i += 2 * len)
            for (uint32_t j = i; j < i + len; j++) {
                float a = v[j], b = v[j + len];
                v[j] = KERN_ADD(a, b);
                v[j + len] = KERN_SUB(a, b);
            }
}

/* y = clamp(c * H (s .* x)): one token's row of head h (x centred). */
KERN_HD void kern_rot_fwd(const float *x, float *y, uint32_t sseed, uint32_t h, uint32_t dim)
{
    const float c = kern_rot_scale(dim);
    for (uint32_t j = 0; j < dim; j++)
        y[j] = kern_rot_neg(sseed, h, j) ? -x[j] : x[j];
    kern_fwht(y, dim);
    for (uint32_t j = 0; j < dim; j++)
        y[j] = kern_sanitize(KERN_MUL(y[j], c));
}

/* In place: v = s .* (c * H v). */
KERN_HD void kern_rot_inv(float *v, uint32_t sseed, uint32_t h, uint32_t dim)
{
    const float c = kern_rot_scale(dim);
    kern_fwht(v, dim);
    for (uint32_t j = 0; j < dim; j++) {
        float x = KERN_MUL(v[j], c);
        v[j] = kern_rot_neg(sseed, h, j) ? -x : x;
    }
}

KERN_HD uint32_t kern_rot_get_seed(const uint8_t *sect)
{
    uint32_t s;
    memcpy(&s, sect, 4);
    return s;
}

/* The fp16 mean^ of channel c of head h over the T tokens of the slab (tokens in order). */
KERN_HD float kern_rot_mean(const struct kern_layout *lay, const uint8_t *raw, uint32_t h,
                            uint32_t c)
{
    float sum = 0.0f;
    for (uint32_t t = 0; t < lay->tokens; t++)
        sum = KERN_ADD(sum, kern_ext_value(lay, raw, t, h, c));
    return kern_h2f(kern_f2h(KERN_DIV(sum, (float)lay->tokens)));
}

/* Where a ROT K section's means and groups are. */
KERN_HD const uint8_t *kern_rot_means(const uint8_t *sect)
{
    return sect + KERN_ROT_PREFIX;
}

KERN_HD uint64_t kern_rot_groups_off(const struct kern_layout *lay)
{
    return KERN_ROT_PREFIX + kern_rot_mean_bytes(lay->heads, lay->head_dim);
}

/* ---- MERGE ----------------------------------------------------------------------------- */

KERN_HD float kern_merge_lim(float cos)
{
    if (!(cos > 0.0f) || cos > 1.0f) /* 0 (the default), NaN or out of range */
        cos = KERN_MERGE_COS_DEFAULT;
    return KERN_MUL(2.0f, KERN_SUB(1.0f, cos));
}

/* Whether row t of head h (slab raw) lies within the threshold of row s. */
KERN_HD int kern_merge_near(const struct kern_layout *lay, const uint8_t *raw, uint32_t h,
                            uint32_t t, uint32_t s, float lim)
{
    float pd[8] = {0, 0, 0, 0, 0, 0, 0, 0}, pn[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t c = 0; c < lay->head_dim; c++) {
        float a = kern_ext_value(lay, raw, t, h, c), b = kern_ext_value(lay, raw, s, h, c);
        float d = KERN_SUB(a, b);
        pd[c & 7] = KERN_ADD(pd[c & 7], KERN_MUL(d, d));
        pn[c & 7] = KERN_ADD(pn[c & 7], KERN_MUL(b, b));
    }
    return kern_sum8_fold(pd) <= KERN_MUL(lim, kern_sum8_fold(pn));
}

/* The runs of head h: the run-start bitmap into map (kern_merge_map_bytes), the rows used
 * returned, the tokens joined past the threshold added to *forced. rawk / rawv: the layer's
 * K and V slabs (rawv NULL for K-only layouts). */
KERN_HD uint32_t kern_merge_plan(const struct kern_layout *lay, const uint8_t *rawk,
                                 const uint8_t *rawv, uint32_t h, float cos, uint32_t *map,
                                 uint64_t *forced)
{
    const uint32_t T = lay->tokens, R = kern_merge_rows(T);
    const float lim = kern_merge_lim(cos);
    uint32_t rows = 1, s = 0;
    for (uint32_t w = 0; w < (T + 31) / 32; w++)
        map[w] = 0;
    map[0] = 1u;
    for (uint32_t t = 1; t < T; t++) {
        int join = kern_merge_near(lay, rawk, h, t, s, lim) &&
                   (!rawv || kern_merge_near(lay, rawv, h, t, s, lim));
        if (join)
            continue;
        if (rows < R) {
            s = t;
            rows++;
            map[t >> 5] |= 1u << (t & 31);
        } else if (forced) {
            (*forced)++;
        }
    }
    return rows;
}

/* The row of token t: set bits of map up to t, minus one. */
KERN_HD uint32_t kern_merge_row_of(const uint8_t *map, uint32_t t)
{
    uint32_t n = 0, w;
    for (uint32_t i = 0; i < t >> 5; i++) {
        memcpy(&w, map + 4 * i, 4);
        for (; w; w &= w - 1)
            n++;
    }
    memcpy(&w, map + 4 * (t >> 5), 4);
    w &= (t & 31) == 31 ? 0xffffffffu : ((1u << ((t & 31) + 1)) - 1);
    for (; w; w &= w - 1)
        n++;
    return n - 1;
}

/* Head h's bytes in a MERGE section. */
KERN_HD uint8_t *kern_merge_head(uint8_t *sect, const struct kern_layout *lay, uint32_t h)
{
    return sect + (uint64_t)h * kern_merge_head_bytes(lay->head_dim, lay->tokens);
}

/* ---- LOWRANK --------------------------------------------------------------------------- */

KERN_HD float kern_lowrank_keep(float energy)
{
    return energy > 0.0f && energy <= 1.0f ? energy : KERN_LOWRANK_ENERGY_DEFAULT;
}

/* Jacobi's method on the symmetric n x n matrix a (row-major; its diagonal ends as the
 * eigenvalues), v the eigenvectors as columns. Cyclic by rows, KERN_JACOBI_SWEEPS sweeps at
 * most; a rotation is skipped where |a_pq| is below 1e-9 of the geometric mean of the
 * diagonal pair, and a sweep that rotates nothing ends the method. */
KERN_HD void kern_jacobi(float *a, float *v, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n; j++)
            v[i * n + j] = i == j ? 1.0f : 0.0f;
    for (int sweep = 0; sweep < KERN_JACOBI_SWEEPS; sweep++) {
        int rotated = 0;
        for (uint32_t p = 0; p + 1 < n; p++)
            for (uint32_t q = p + 1; q < n; q++) {
                float apq = a[p * n + q], app = a[p * n + p], aqq = a[q * n + q];
                float g = KERN_MUL(1e-9f, sqrtf(fabsf(KERN_MUL(app, aqq))));
                if (fabsf(apq) <= g || apq == 0.0f)
                    continue;
                rotated = 1;
                float theta = KERN_DIV(KERN_SUB(aqq, app), KERN_MUL(2.0f, apq)), t;
                if (fabsf(theta) > 1e18f)
                    t = KERN_DIV(0.5f, theta);
                else
                    t = KERN_DIV(
                        theta >= 0.0f ? 1.0f : -1.0f,
                        KERN_ADD(fabsf(theta), sqrtf(KERN_ADD(KERN_MUL(theta, theta), 1.0f))));
                float c = KERN_DIV(1.0f, sqrtf(KERN_ADD(KERN_MUL(t, t), 1.0f)));
                float s = KERN_MUL(t, c);
                for (uint32_t k = 0; k < n; k++) {
                    float akp = a[k * n + p], akq = a[k * n + q];
                    a[k * n + p] = KERN_SUB(KERN_MUL(c, akp), KERN_MUL(s, akq));
                    a[k * n + q] = KERN_ADD(KERN_MUL(s, akp), KERN_MUL(c, akq));
                }
                for (uint32_t k = 0; k < n; k++) {
                    float apk = a[p * n + k], aqk = a[q * n + k];
                    a[p * n + k] = KERN_SUB(KERN_MUL(c, apk), KERN_MUL(s, aqk));
                    a[q * n + k] = KERN_ADD(KERN_MUL(s, apk), KERN_MUL(c, aqk));
                }
                for (uint32_t k = 0; k < n; k++) {
                    float vkp = v[k * n + p], vkq = v[k * n + q];
                    v[k * n + p] = KERN_SUB(KERN_MUL(c, vkp), KERN_MUL(s, vkq));
                    v[k * n + q] = KERN_ADD(KERN_MUL(s, vkp), KERN_MUL(c, vkq));
                }
            }
        if (!rotated)
            break;
    }
}

/* The eigenvalues of a (its diagonal) by value, largest first (ties: lower index first), into
 * ord[0..n); returns the rank whose eigenvalues hold `keep` of their (non-negative) sum, at
 * most cap; 0 for an all-zero matrix. */
KERN_HD uint32_t kern_lowrank_rank(const float *a, uint32_t n, float keep, uint32_t cap,
                                   uint32_t *ord)
{
    float total = 0.0f, cum = 0.0f;
    for (uint32_t i = 0; i < n; i++)
        ord[i] = i;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t best = i;
        for (uint32_t j = i + 1; j < n; j++) {
            float x = a[ord[j] * n + ord[j]], y = a[ord[best] * n + ord[best]];
            if (x > y || (x == y && ord[j] < ord[best]))
                best = j;
        }
        uint32_t tmp = ord[i];
        ord[i] = ord[best];
        ord[best] = tmp;
    }
    for (uint32_t i = 0; i < n; i++) {
        float e = a[ord[i] * n + ord[i]];
        total = KERN_ADD(total, e > 0.0f ? e : 0.0f);
    }
    if (!(total > 0.0f))
        return 0;
    const float want = KERN_MUL(keep, total);
    for (uint32_t r = 0; r < cap && r < n; r++) {
        float e = a[ord[r] * n + ord[r]];
        cum = KERN_ADD(cum, e > 0.0f ? e : 0.0f);
        if (cum >= want)
            return r + 1;
    }
    return cap < n ? cap : n;
}

/* The leading subspace of the Gram matrix g (n x n, symmetric) by subspace iteration, which
 * needs only the c = min(cap, n) vectors the format can store, not all n eigenvectors: start
 * from the columns of g with the c largest diagonal entries, then KERN_LOWRANK_ITERS times
 * V = orth(g V). The energy a unit vector v keeps is v . (g v) (|K^T v|^2 or |K v|^2), so the
 * rank chosen from those energies against the trace holds the recipe's share whether or not v
 * is an exact eigenvector; the reconstruction is the projection U U^T K (or K W W^T).
 * Workspace: V and Z = g V column by column in v (2 n c floats, c <= n / 2 for n >= 2);
 * g V sums over j in order (kern_lowrank_gv), so a version vectorised over i gives the same
 * bits. Results as kern_jacobi + kern_lowrank_rank left them: vector e in column e of v
 * (v[k * n + e]), its energy at g[e * n + e], ord by energy (kern_lowrank_pick). */
#define KERN_LOWRANK_ITERS 3

/* Z[e] = g V[e] for the c columns (column-major, n each): z[i] = sum_j g[j][i] v[j], in j
 * order from 0. */
KERN_HD void kern_lowrank_gv(const float *g, const float *V, float *Z, uint32_t n, uint32_t c)
{
    for (uint32_t e = 0; e < c; e++)
        for (uint32_t i = 0; i < n; i++) {
            float acc = 0.0f;
            for (uint32_t j = 0; j < n; j++)
                acc = KERN_ADD(acc, KERN_MUL(g[j * n + i], V[e * n + j]));
            Z[e * n + i] = acc;
        }
}

/* a . b in kern_sum8 order. */
KERN_HD float kern_lowrank_dot(const float *a, const float *b, uint32_t n)
{
    float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t k = 0; k < n; k++)
        p[k & 7] = KERN_ADD(p[k & 7], KERN_MUL(a[k], b[k]));
    return kern_sum8_fold(p);
}

/* Z's columns made orthonormal into V by modified Gram-Schmidt, each column twice (once is not
 * enough when columns are nearly parallel); a column left with under 1e-6 of its length (g of
 * rank < c) becomes zero and keeps no energy. */
KERN_HD void kern_lowrank_orth(const float *Z, float *V, uint32_t n, uint32_t c)
{
    for (uint32_t e = 0; e < c; e++) {
        float *ve = V + e * n;
        for (uint32_t k = 0; k < n; k++)
            ve[k] = Z[e * n + k];
        const float nrm0 = kern_lowrank_dot(ve, ve, n);
        for (int pass = 0; pass < 2; pass++)
            for (uint32_t j = 0; j < e; j++) {
                const float d = kern_lowrank_dot(V + j * n, ve, n);
                for (uint32_t k = 0; k < n; k++)
                    ve[k] = KERN_SUB(ve[k], KERN_MUL(d, V[j * n + k]));
            }
        const float nrm = kern_lowrank_dot(ve, ve, n);
        const float inv = nrm > KERN_MUL(1e-12f, nrm0) ? KERN_DIV(1.0f, sqrtf(nrm)) : 0.0f;
        for (uint32_t k = 0; k < n; k++)
            ve[k] = KERN_MUL(ve[k], inv);
    }
}

/* Start: Z = the columns of g with the c largest diagonal entries (ties: lower index), made
 * orthonormal into V; returns the trace (the energy of all of K). */
KERN_HD float kern_lowrank_start(const float *g, float *V, float *Z, uint32_t n, uint32_t c,
                                 uint32_t *ord)
{
    float total = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        const float e = g[i * n + i];
        total = KERN_ADD(total, e > 0.0f ? e : 0.0f);
        ord[i] = i;
    }
    for (uint32_t i = 0; i < c; i++) {
        uint32_t best = i;
        for (uint32_t j = i + 1; j < n; j++) {
            float x = g[ord[j] * n + ord[j]], y = g[ord[best] * n + ord[best]];
            if (x > y || (x == y && ord[j] < ord[best]))
                best = j;
        }
        const uint32_t tmp = ord[i];
        ord[i] = ord[best];
        ord[best] = tmp;
        for (uint32_t k = 0; k < n; k++)
            Z[i * n + k] = g[ord[i] * n + k];
    }
    kern_lowrank_orth(Z, V, n, c);
    return total;
}

/* End, after Z = g V: the energies, the vectors moved where kern_jacobi leaves them, ord by
 * energy (largest first, ties lower index first) and the rank that holds `keep` of `total`
 * (at most c; 0 when K is zero). Overwrites g. */
KERN_HD uint32_t kern_lowrank_pick(float *g, float *v, uint32_t n, uint32_t c, float keep,
                                   float total, uint32_t *ord)
{
    float *lam = g, *vc = g + c;
    for (uint32_t e = 0; e < c; e++) {
        const float l = kern_lowrank_dot(v + e * n, v + c * n + e * n, n);
        lam[e] = l > 0.0f ? l : 0.0f;
    }
    for (uint32_t k = 0; k < c * n; k++)
        vc[k] = v[k];
    for (uint32_t e = 0; e < c; e++)
        for (uint32_t k = 0; k < n; k++)
            v[k * n + e] = vc[e * n + k];
    for (uint32_t e = 0; e < c; e++) {
        ord[e] = e;
        g[e * n + e] = lam[e]; /* e * n + e >= e: lam[e] is read before it is overwritten */
    }
    for (uint32_t i = 0; i < c; i++) {
        uint32_t best = i;
        for (uint32_t j = i + 1; j < c; j++) {
            float x = g[ord[j] * n + ord[j]], y = g[ord[best] * n + ord[best]];
            if (x > y || (x == y && ord[j] < ord[best]))
                best = j;
        }
        const uint32_t tmp = ord[i];
        ord[i] = ord[best];
        ord[best] = tmp;
    }
    if (!(total > 0.0f))
        return 0;
    const float want = KERN_MUL(keep, total);
    float cum = 0.0f;
    for (uint32_t r = 0; r < c; r++) {
        cum = KERN_ADD(cum, g[ord[r] * n + ord[r]]);
        if (cum >= want)
            return r + 1;
    }
    return c;
}

/* The whole search, scalar (the reference and the CUDA unit); n == 1 is the 1 x 1 case. */
KERN_HD uint32_t kern_lowrank_eig(float *g, float *v, uint32_t n, uint32_t cap, float keep,
                                  uint32_t *ord)
{
    if (n < 2) {
        kern_jacobi(g, v, n);
        return kern_lowrank_rank(g, n, keep, cap, ord);
    }
    const uint32_t c = cap < n ? cap : n;
    float *V = v, *Z = v + c * n;
    const float total = kern_lowrank_start(g, V, Z, n, c, ord);
    for (int it = 0; it < KERN_LOWRANK_ITERS; it++) {
        kern_lowrank_gv(g, V, Z, n, c);
        kern_lowrank_orth(Z, V, n, c);
    }
    kern_lowrank_gv(g, V, Z, n, c);
    return kern_lowrank_pick(g, v, n, c, keep, total, ord);
}

/* The parts of head h's LOWRANK bytes. */
KERN_HD float kern_lowrank_sigma(const uint8_t *head, uint32_t i)
{
    float s;
    memcpy(&s, head + 16 + 4 * i, 4);
    return s;
}

KERN_HD const uint8_t *kern_lowrank_u(const uint8_t *head, uint32_t cap)
{
    return head + 16 + 4 * cap;
}

KERN_HD const uint8_t *kern_lowrank_w(const uint8_t *head, uint32_t cap, uint32_t tokens)
{
    return head + 16 + 4 * cap + 2ull * tokens * cap;
}

/* x^[t][d] of a LOWRANK head: each term fused into the sum (KERN_FMA). */
KERN_HD float kern_lowrank_val(const uint8_t *head, uint32_t rank, uint32_t cap, uint32_t tokens,
                               uint32_t dim, uint32_t t, uint32_t d)
{
    const uint8_t *u = kern_lowrank_u(head, cap), *w = kern_lowrank_w(head, cap, tokens);
    float acc = 0.0f;
    for (uint32_t i = 0; i < rank; i++)
        acc = KERN_FMA(KERN_MUL(kern_lowrank_sigma(head, i),
                                kern_get_h(u + 2 * ((uint64_t)t * cap + i))),
                       kern_get_h(w + 2 * ((uint64_t)i * dim + d)), acc);
    return acc;
}

KERN_HD uint32_t kern_lowrank_get_rank(const uint8_t *head, uint32_t cap)
{
    uint32_t r;
    memcpy(&r, head, 4);
    return r < cap ? r : cap;
}

#endif
