/*
 * kern_merge.c — MERGE: adjacent tokens whose keys (and values) lie within a cosine
 * threshold stored once; decode writes every token back, so engines see the block's shape
 * (kern_ext.h has the format and the arithmetic).
 *
 * DESIGN
 * A cold block of repetitive text (templates, padding, repeated tool output) holds runs of
 * near-identical KV rows; storing a run once halves such a block at worst-case fidelity
 * bounded by the threshold (token merging, as in CaM / D2O, applied at block level). The plan
 * (which tokens start a run) reads both K and V of a head, so the K and V sections of a layer
 * agree; each section then stores its runs' mean rows. The reference runs kern_ext.h's
 * functions as they are; the AVX2 version computes the same eight partial sums of the plan
 * in the eight lanes of a vector (channel c into lane c % 8, in order), and the means a
 * vector of channels at a time (tokens summed in order), so the bytes are the reference's.
 * It plans once per layer: the V section takes the runs from the K section's map, written
 * just before in the same encode (kern_ext_ctx.kmerge), and reads only V rows.
 */
#include <errno.h>
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern_cpu.h"
#include "kernels/kern_ext.h"

#define KT __attribute__((target("avx2,f16c")))
#define MRG_AHEAD 4 /* tokens prefetched ahead of the one judged (mrg_sect_pass) */

KT static inline __attribute__((always_inline)) __m256 mrg_load8(const struct kern_layout *lay,
                                                                 const uint8_t *raw, uint32_t t,
                                                                 uint32_t h, uint32_t c0,
                                                                 uint32_t n)
{
    float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const uint16_t *p = (const uint16_t *)raw + ((uint64_t)t * lay->heads + h) * lay->head_dim + c0;
    if (n == 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        __m256 x = lay->dtype == KERN_DTYPE_BF16
                       ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
                       : _mm256_cvtph_ps(v);
        x = _mm256_and_ps(x, _mm256_cmp_ps(x, x, _CMP_ORD_Q));
        x = _mm256_min_ps(x, _mm256_set1_ps(KERN_FP16_MAX));
        return _mm256_max_ps(x, _mm256_set1_ps(-KERN_FP16_MAX));
    }
    for (uint32_t j = 0; j < n; j++)
        f[j] = kern_ext_value(lay, raw, t, h, c0 + j);
    return _mm256_loadu_ps(f);
}

/* kern_merge_near with the partial sums in a vector's lanes (a lane past the row's end adds
 * 0 to its partial, which changes nothing). */
KT static int mrg_near_avx2(const struct kern_layout *lay, const uint8_t *raw, uint32_t h,
                            uint32_t t, uint32_t s, float lim)
{
    __m256 pd = _mm256_setzero_ps(), pn = _mm256_setzero_ps();
    float a[8], b[8];
    for (uint32_t c = 0; c < lay->head_dim; c += 8) {
        uint32_t n = lay->head_dim - c < 8 ? lay->head_dim - c : 8;
        __m256 x = mrg_load8(lay, raw, t, h, c, n), y = mrg_load8(lay, raw, s, h, c, n);
        __m256 d = _mm256_sub_ps(x, y);
        pd = _mm256_add_ps(pd, _mm256_mul_ps(d, d));
        pn = _mm256_add_ps(pn, _mm256_mul_ps(y, y));
    }
    _mm256_storeu_ps(a, pd);
    _mm256_storeu_ps(b, pn);
    return kern_sum8_fold(a) <= KERN_MUL(lim, kern_sum8_fold(b));
}

/* kern_merge_plan with mrg_near_avx2. */
KT static uint32_t mrg_plan_avx2(const struct kern_layout *lay, const uint8_t *rawk,
                                 const uint8_t *rawv, uint32_t h, float cos, uint32_t *map,
                                 uint64_t *forced)
{
    const uint32_t T = lay->tokens, R = kern_merge_rows(T);
    const float lim = kern_merge_lim(cos);
    uint32_t rows = 1, s = 0;
    memset(map, 0, kern_merge_map_bytes(T));
    map[0] = 1u;
    for (uint32_t t = 1; t < T; t++) {
        int join = mrg_near_avx2(lay, rawk, h, t, s, lim) &&
                   (!rawv || mrg_near_avx2(lay, rawv, h, t, s, lim));
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

/* Run [a, b) of head h's rows in `raw` as its mean, into row `out` of the dtype. */
static void mrg_mean_ref(const struct kern_layout *lay, const uint8_t *raw, uint32_t h, uint32_t a,
                         uint32_t b, uint8_t *out)
{
    for (uint32_t c = 0; c < lay->head_dim; c++) {
        float sum = 0.0f;
        for (uint32_t t = a; t < b; t++)
            sum = KERN_ADD(sum, kern_ext_value(lay, raw, t, h, c));
        kern_store(out, lay->dtype, c, KERN_DIV(sum, (float)(b - a)));
    }
}

KT static void mrg_mean_avx2(const struct kern_layout *lay, const uint8_t *raw, uint32_t h,
                             uint32_t a, uint32_t b, uint8_t *out)
{
    const __m256 n = _mm256_set1_ps((float)(b - a));
    float f[8];
    for (uint32_t c = 0; c < lay->head_dim; c += 8) {
        uint32_t m = lay->head_dim - c < 8 ? lay->head_dim - c : 8;
        __m256 sum = _mm256_setzero_ps();
        for (uint32_t t = a; t < b; t++)
            sum = _mm256_add_ps(sum, mrg_load8(lay, raw, t, h, c, m));
        _mm256_storeu_ps(f, _mm256_div_ps(sum, n));
        for (uint32_t j = 0; j < m; j++)
            kern_store(out, lay->dtype, c + j, f[j]);
    }
}

/* Eight means to the dtype, rounded to nearest even as kern_store (means are finite). */
KT static void mrg_store8(uint16_t *p, __m256 x, uint32_t dtype)
{
    if (dtype == KERN_DTYPE_FP16) {
        _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        return;
    }
    __m256i u = _mm256_castps_si256(x);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd),
                          16);
    _mm_storeu_si128((__m128i *)p,
                     _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)));
}

/* The eight partial sums of a row's squares (|x_s|^2's partials of kern_merge_near). */
KT static __m256 mrg_norm_avx2(const float *x, uint32_t dim)
{
    __m256 p = _mm256_setzero_ps();
    for (uint32_t c = 0; c < dim; c += 8) {
        __m256 v = _mm256_loadu_ps(x + c);
        p = _mm256_add_ps(p, _mm256_mul_ps(v, v));
    }
    return p;
}

/* The clean path's rows (mrg_clean: fp16, no Inf or NaN, D a multiple of 8) read straight
 * from the slab, F16C's floats exact and in range: the same values mrg_row_avx2 stores, so
 * the same sums, without the row's trip through a float buffer. */
KT static inline __attribute__((always_inline)) const uint16_t *
mrg_raw_row(const struct kern_layout *lay, const uint8_t *raw, uint32_t t, uint32_t h)
{
    return (const uint16_t *)raw + ((uint64_t)t * lay->heads + h) * lay->head_dim;
}

KT static inline __attribute__((always_inline)) __m256 mrg_h8(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* |x - s|^2 <= lim |s|^2 with kern_merge_near's sums; x (floats, or a clean row's halves
 * when half) and s padded to a multiple of 8. */
KT static inline __attribute__((always_inline)) int
mrg_within_any(const void *x, int half, const float *st, __m256 pn, uint32_t dim, float lim)
{
    __m256 pd = _mm256_setzero_ps();
    float a[8], b[8];
    for (uint32_t c = 0; c < dim; c += 8) {
        const __m256 v =
            half ? mrg_h8((const uint16_t *)x + c) : _mm256_loadu_ps((const float *)x + c);
        __m256 d = _mm256_sub_ps(v, _mm256_loadu_ps(st + c));
        pd = _mm256_add_ps(pd, _mm256_mul_ps(d, d));
    }
    _mm256_storeu_ps(a, pd);
    _mm256_storeu_ps(b, pn);
    return kern_sum8_fold(a) <= KERN_MUL(lim, kern_sum8_fold(b));
}

KT static int mrg_within(const float *x, const float *st, __m256 pn, uint32_t dim, float lim)
{
    return mrg_within_any(x, 0, st, pn, dim, lim);
}

/* mrg_within of a clean row. */
KT static int mrg_within_h(const uint16_t *x, const float *st, __m256 pn, uint32_t dim, float lim)
{
    return mrg_within_any(x, 1, st, pn, dim, lim);
}

KT static inline __attribute__((always_inline)) void mrg_row_avx2(const struct kern_layout *lay,
                                                                  const uint8_t *raw, uint32_t t,
                                                                  uint32_t h, float *x, int clean)
{
    if (clean) {
        /* clean slabs (mrg_clean): F16C's floats need no sanitizing */
        const uint16_t *p = mrg_raw_row(lay, raw, t, h);
        for (uint32_t c = 0; c < lay->head_dim; c += 8)
            _mm256_storeu_ps(x + c, mrg_h8(p + c));
        return;
    }
    for (uint32_t c = 0; c < lay->head_dim; c += 8)
        _mm256_storeu_ps(
            x + c, mrg_load8(lay, raw, t, h, c, lay->head_dim - c < 8 ? lay->head_dim - c : 8));
}

/* The clean path (fp16 slabs, D a multiple of 8) runs on the assumption that no row it
 * reads holds Inf or NaN, and checks each row it reads as it goes (exponent all ones into
 * *bad): a section where one does is done again the sanitizing way. Checking the rows used
 * instead of scanning the slabs first lets the slabs stream in under the arithmetic (a scan
 * before the pass waited on memory alone) and skips the V rows the K pass never reads. */
KT static inline __attribute__((always_inline)) void mrg_check(const uint16_t *r, uint32_t dim,
                                                               __m128i *bad)
{
    const __m128i ex = _mm_set1_epi16(0x7c00);
    for (uint32_t c = 0; c < dim; c += 8)
        *bad = _mm_or_si128(
            *bad,
            _mm_cmpeq_epi16(_mm_and_si128(_mm_loadu_si128((const __m128i *)(r + c)), ex), ex));
}

/* A run's first row of a clean slab into st (as floats); its partial norms returned. */
KT static __m256 mrg_start_h(const uint16_t *x, float *st, uint32_t dim)
{
    __m256 p = _mm256_setzero_ps();
    for (uint32_t c = 0; c < dim; c += 8) {
        const __m256 v = mrg_h8(x + c);
        _mm256_storeu_ps(st + c, v);
        p = _mm256_add_ps(p, _mm256_mul_ps(v, v));
    }
    return p;
}

/* A head's state in the fused pass: its rows, the open run's start a and row r, the run's
 * first rows (sk, sv) with their partial norms, and the running sum of `own`'s rows. */
struct mrg_state {
    uint32_t rows, a, r;
    __m256 nk, nv;
    float *sk, *sv, *sum;
    /* clean path: the open run's first row in `own` (borrowed from the slab for the pass);
     * its sum is written only once a second row joins (summed); the K pass's sv and nv only
     * once a K row of the run joins (vset) */
    const uint16_t *first;
    int summed, vset;
};

/* Token t of head h (t == T closes the last run): kern_merge_plan's join (rows and forced
 * count) and the running sums for the means, the token's rows loaded once. */
KT static inline __attribute__((always_inline)) void
mrg_step(const struct kern_ext_ctx *c, uint32_t h, uint32_t t, const uint8_t *own, uint8_t *head,
         struct mrg_state *st, float *xk, float *xv, float *mean, int clean, __m128i *bad)
{
    const struct kern_layout *lay = c->lay;
    const uint32_t T = lay->tokens, D = lay->head_dim, Dp = (D + 7) & ~7u, R = kern_merge_rows(T);
    const float lim = kern_merge_lim(c->rec->merge_cos);
    float *xo = own == c->rawk ? xk : xv, *sum = st->sum;
    uint32_t *map = (uint32_t *)(head + 16);
    uint8_t *row0 = head + 16 + kern_merge_map_bytes(T);
    int join = 0;
    /* clean: the rows are read from the slabs where used (xr: this section's), the V rows only
     * where K's test passes (the run's first V row too, the first time) */
    const uint16_t *xr = t < T && clean ? mrg_raw_row(lay, own, t, h) : NULL;
    if (xr)
        mrg_check(xr, D, bad);
    if (t < T && c->kmerge) { /* the K section's runs */
        const uint32_t *km =
            (const uint32_t *)(kern_merge_head((uint8_t *)(uintptr_t)c->kmerge, lay, h) + 16);
        if (!clean)
            mrg_row_avx2(lay, own, t, h, xo, clean);
        join = t > 0 && !(km[t >> 5] >> (t & 31) & 1u);
    } else if (t < T && clean) {
        /* the K row the plan judges: this section's own, but for a V section planned alone
         * (the layer's keys another codec), whose K rows are checked here as they are read */
        const uint16_t *xk_r = own == c->rawk ? xr : mrg_raw_row(lay, c->rawk, t, h);
        if (xk_r != xr)
            mrg_check(xk_r, D, bad);
        if (t > 0) {
            const uint16_t *xv_r = c->rawv ? mrg_raw_row(lay, c->rawv, t, h) : NULL;
            join = mrg_within_h(xk_r, st->sk, st->nk, D, lim);
            if (join && xv_r && !st->vset) {
                /* the run's first V row, read where a K row first joins it (the reference
                 * compares V rows only there) */
                const uint16_t *v0 = mrg_raw_row(lay, c->rawv, st->a, h);
                mrg_check(v0, D, bad);
                st->nv = mrg_start_h(v0, st->sv, D);
                st->vset = 1;
            }
            if (join && xv_r) {
                mrg_check(xv_r, D, bad);
                join = mrg_within_h(xv_r, st->sv, st->nv, D, lim);
            }
            if (!join && st->rows >= R)
                join = 1; /* forced: the head has no room for another row */
        }
    } else if (t < T) {
        mrg_row_avx2(lay, c->rawk, t, h, xk, clean);
        if (c->rawv)
            mrg_row_avx2(lay, c->rawv, t, h, xv, clean);
        if (t > 0) {
            join = mrg_within(xk, st->sk, st->nk, Dp, lim) &&
                   (!c->rawv || mrg_within(xv, st->sv, st->nv, Dp, lim));
            if (!join && st->rows >= R)
                join = 1; /* forced: the head has no room for another row */
        }
    }
    if (t > 0 && !join && clean && !st->summed) {
        /* a run of one row: fp16(0 + x) is x's half, but for -0 (0 + -0 = +0) */
        uint16_t *o = (uint16_t *)(row0 + 2ull * st->r * D);
        const __m128i nz = _mm_set1_epi16((short)0x8000);
        for (uint32_t d = 0; d < D; d += 8) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(st->first + d));
            _mm_storeu_si128((__m128i *)(o + d), _mm_andnot_si128(_mm_cmpeq_epi16(v, nz), v));
        }
        st->r++;
    } else if (t > 0 && !join) { /* the run [a, t) closes: its mean */
        const __m256 n = _mm256_set1_ps((float)(t - st->a));
        uint16_t *o = (uint16_t *)(row0 + 2ull * st->r * D);
        uint32_t d = 0;
        if (t - st->a == 1) /* a run of one row: x / 1 is x */
            for (; d + 8 <= D; d += 8)
                mrg_store8(o + d, _mm256_loadu_ps(sum + d), lay->dtype);
        for (; d + 8 <= D; d += 8)
            mrg_store8(o + d, _mm256_div_ps(_mm256_loadu_ps(sum + d), n), lay->dtype);
        for (; d < Dp; d += 8)
            _mm256_storeu_ps(mean + d, _mm256_div_ps(_mm256_loadu_ps(sum + d), n));
        for (uint32_t e = D & ~7u; e < D; e++)
            kern_store(o, lay->dtype, e, mean[e]);
        st->r++;
    }
    if (t == T)
        return;
    if (join && clean && !st->summed) { /* the run's second row: (0 + x_a) + x_t */
        for (uint32_t d = 0; d < D; d += 8)
            _mm256_storeu_ps(
                sum + d, _mm256_add_ps(_mm256_add_ps(_mm256_setzero_ps(), mrg_h8(st->first + d)),
                                       mrg_h8(xr + d)));
        st->summed = 1;
        return;
    }
    if (join && clean) {
        for (uint32_t d = 0; d < D; d += 8)
            _mm256_storeu_ps(sum + d, _mm256_add_ps(_mm256_loadu_ps(sum + d), mrg_h8(xr + d)));
        return;
    }
    if (join) {
        for (uint32_t d = 0; d < Dp; d += 8)
            _mm256_storeu_ps(sum + d,
                             _mm256_add_ps(_mm256_loadu_ps(sum + d), _mm256_loadu_ps(xo + d)));
        return;
    }
    if (t > 0) { /* a new run from t */
        st->rows++;
        map[t >> 5] |= 1u << (t & 31);
    }
    st->a = t;
    if (clean) {
        if (!c->kmerge) /* the K row the next tokens are compared with (V's: vset) */
            st->nk = mrg_start_h(mrg_raw_row(lay, c->rawk, t, h), st->sk, D);
        st->vset = 0;
        st->first = xr; /* the sum starts as 0 + x, as the reference's, if a row joins */
        st->summed = 0;
        return;
    }
    if (!c->kmerge) { /* the rows the next tokens are compared with */
        memcpy(st->sk, xk, Dp * sizeof(float));
        st->nk = mrg_norm_avx2(st->sk, Dp);
        if (c->rawv) {
            memcpy(st->sv, xv, Dp * sizeof(float));
            st->nv = mrg_norm_avx2(st->sv, Dp);
        }
    }
    /* the first row of a run: 0 + x, as the reference's sum starts */
    for (uint32_t d = 0; d < Dp; d += 8)
        _mm256_storeu_ps(sum + d, _mm256_add_ps(_mm256_setzero_ps(), _mm256_loadu_ps(xo + d)));
}

/* The whole section in one pass, token by token and the heads of a token in turn, so the
 * slabs are read in memory order (a head's rows alone are a stride of heads x dim apart).
 * buf: (3 + 3 H) Dp floats, st: H states. */
KT static __attribute__((always_inline)) inline int mrg_sect_pass(const struct kern_ext_ctx *c,
                                                                  const uint8_t *own, uint8_t *sect,
                                                                  float *buf, struct mrg_state *st,
                                                                  const int clean)
{
    const struct kern_layout *lay = c->lay;
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim, Dp = (D + 7) & ~7u;
    float *xk = buf, *xv = buf + Dp, *mean = buf + 2 * Dp;
    /* every float of buf is written before it is read (a run's rows and sum where it starts,
     * xk, xv and mean per token), so buf is not cleared; of a head's bytes only the prefix
     * and the map are cleared here, and the rows no run used after the pass */
    for (uint32_t h = 0; h < H; h++) {
        uint8_t *head = kern_merge_head(sect, lay, h);
        memset(head, 0, 16 + kern_merge_map_bytes(T));
        ((uint32_t *)(head + 16))[0] = 1u;
        st[h].rows = 1;
        st[h].a = st[h].r = 0;
        st[h].nk = st[h].nv = _mm256_setzero_ps();
        st[h].vset = 0;
        st[h].sk = buf + (3 + 3 * (size_t)h) * Dp;
        st[h].sv = st[h].sk + Dp;
        st[h].sum = st[h].sv + Dp;
    }
    __m128i bad = _mm_setzero_si128();
    /* the rows a few tokens ahead, V's too in the K pass (the V section reads them next): a
     * token's rows are 2 KiB for 8 heads of 128, and the hardware prefetcher stops at a page */
    const uint64_t tb = 2ull * H * D; /* a token's rows of a slab, in bytes */
    const uint8_t *pv = c->kmerge ? NULL : c->rawv;
    for (uint32_t t = 0; t <= T; t++) {
        if (t + MRG_AHEAD < T)
            for (uint64_t o = 0; o < tb; o += 64) {
                _mm_prefetch((const char *)own + (t + MRG_AHEAD) * tb + o, _MM_HINT_T0);
                if (pv)
                    _mm_prefetch((const char *)pv + (t + MRG_AHEAD) * tb + o, _MM_HINT_T0);
            }
        for (uint32_t h = 0; h < H; h++)
            mrg_step(c, h, t, own, kern_merge_head(sect, lay, h), &st[h], xk, xv, mean, clean,
                     &bad);
    }
    if (!_mm_testz_si128(bad, bad))
        return 0;
    for (uint32_t h = 0; h < H; h++) {
        uint8_t *head = kern_merge_head(sect, lay, h);
        memcpy(head, &st[h].rows, 4);
        const uint64_t used = 16 + kern_merge_map_bytes(T) + 2ull * st[h].r * D;
        memset(head + used, 0, kern_merge_head_bytes(D, T) - used);
    }
    return 1;
}

KT static void mrg_sect_fused(const struct kern_ext_ctx *c, const uint8_t *own, uint8_t *sect,
                              float *buf, struct mrg_state *st)
{
    const struct kern_layout *lay = c->lay;
    if (lay->dtype == KERN_DTYPE_FP16 && lay->head_dim % 8 == 0 &&
        mrg_sect_pass(c, own, sect, buf, st, 1))
        return;
    mrg_sect_pass(c, own, sect, buf, st, 0);
}

/* Head h of a MERGE section from the layer's slabs; `own` is this section's slab. */
static void mrg_head(int vec, const struct kern_ext_ctx *c, uint32_t h, const uint8_t *own,
                     uint8_t *head, uint64_t *forced)
{
    const struct kern_layout *lay = c->lay;
    const uint32_t T = lay->tokens, D = lay->head_dim;
    uint32_t *map = (uint32_t *)(head + 16), rows, a = 0, r = 0;
    uint8_t *row0 = head + 16 + kern_merge_map_bytes(T);
    memset(head, 0, kern_merge_head_bytes(D, T));
    rows = vec ? mrg_plan_avx2(lay, c->rawk, c->rawv, h, c->rec->merge_cos, map, forced)
               : kern_merge_plan(lay, c->rawk, c->rawv, h, c->rec->merge_cos, map, forced);
    memcpy(head, &rows, 4);
    for (uint32_t t = 1; t <= T; t++) {
        if (t < T && !(map[t >> 5] >> (t & 31) & 1u))
            continue;
        uint8_t *out = row0 + 2ull * r * D;
        if (vec)
            mrg_mean_avx2(lay, own, h, a, t, out);
        else
            mrg_mean_ref(lay, own, h, a, t, out);
        r++;
        a = t;
    }
}

int kern_merge_enc(const struct kern_cpu_ops *ops, int is_v, const struct kern_ext_ctx *c,
                   uint8_t *sect)
{
    const int vec = ops != &kern_ref_ops;
    const uint8_t *own = is_v ? c->rawv : c->rawk;
    if (vec && kern_rot512_on()) { /* with AVX-512 where the CPU has it (kern_merge512.c) */
        const int rc = kern_merge512_sect(c, own, sect);
        if (rc != 0)
            return rc < 0 ? rc : rc == 2; /* 2: with the key statistics */
    }
    if (vec) {
        const size_t H = c->lay->heads, Dp = (c->lay->head_dim + 7) & ~7u;
        struct mrg_state *st = aligned_alloc(32, H * sizeof(*st)); /* holds __m256 */
        float *buf = malloc((3 + 3 * H) * Dp * sizeof(float));
        int rc = st && buf ? 0 : -ENOMEM;
        if (!rc)
            mrg_sect_fused(c, own, sect, buf, st);
        free(buf);
        free(st);
        return rc;
    }
    for (uint32_t h = 0; h < c->lay->heads; h++)
        mrg_head(vec, c, h, own, kern_merge_head(sect, c->lay, h), NULL);
    return 0;
}

uint64_t kern_merge_count_forced(const struct kern_ext_ctx *c)
{
    uint32_t *map = malloc(kern_merge_map_bytes(c->lay->tokens));
    uint64_t forced = 0;
    if (!map)
        return UINT64_MAX;
    for (uint32_t h = 0; h < c->lay->heads; h++)
        kern_merge_plan(c->lay, c->rawk, c->rawv, h, c->rec->merge_cos, map, &forced);
    free(map);
    return forced;
}

/* A row of 2 dim bytes copied with AVX loads and stores (dim a multiple of 16). */
KT static void mrg_copy_rows_avx2(const struct kern_layout *lay, const uint8_t *sect, void *raw)
{
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim;
    const uint64_t hb = kern_merge_head_bytes(D, T), mb = kern_merge_map_bytes(T);
    const uint32_t R = kern_merge_rows(T);
    uint8_t *to = raw;
    for (uint32_t t = 0; t < T; t++) {
        /* the raw rows in memory order: every head of token t in turn */
        const uint8_t *head = sect;
        for (uint32_t h = 0; h < H; h++, head += hb, to += 2ull * D) {
            /* kern_merge_row_of's row: the set bits of the map up to t, minus one (a damaged
             * map that starts no row reads row 0) */
            uint32_t n = 0, w;
            for (uint32_t i = 0; i < t >> 5; i++) {
                memcpy(&w, head + 16 + 4 * i, 4);
                n += (uint32_t)__builtin_popcount(w);
            }
            memcpy(&w, head + 16 + 4 * (t >> 5), 4);
            w &= (t & 31) == 31 ? 0xffffffffu : ((1u << ((t & 31) + 1)) - 1);
            n += (uint32_t)__builtin_popcount(w);
            const uint32_t r = n - 1 < R ? n - 1 : 0;
            const uint8_t *row = head + 16 + mb + 2ull * r * D;
            for (uint32_t d = 0; d < 2 * D; d += 32)
                _mm256_storeu_si256((__m256i *)(to + d),
                                    _mm256_loadu_si256((const __m256i *)(row + d)));
        }
    }
}

int kern_merge_dec(const struct kern_cpu_ops *ops, const struct kern_layout *lay,
                   const uint8_t *sect, void *raw, uint32_t out_dtype)
{
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim;
    if (ops != &kern_ref_ops && out_dtype == lay->dtype && kern_rot512_on() &&
        kern_merge512_dec(lay, sect, raw))
        return 0;
    if (ops != &kern_ref_ops && out_dtype == lay->dtype && D % 16 == 0) {
        mrg_copy_rows_avx2(lay, sect, raw);
        return 0;
    }
    for (uint32_t h = 0; h < H; h++) {
        const uint8_t *head = kern_merge_head((uint8_t *)(uintptr_t)sect, lay, h);
        const uint8_t *map = head + 16, *row0 = map + kern_merge_map_bytes(T);
        uint32_t n = 0, w;
        for (uint32_t t = 0; t < T; t++) {
            memcpy(&w, map + 4 * (t >> 5), 4);
            n += w >> (t & 31) & 1u;
            /* kern_merge_row_of's row, n - 1 (a damaged map that starts no row reads row 0) */
            const uint32_t r = n - 1 < kern_merge_rows(T) ? n - 1 : 0;
            const uint8_t *row = row0 + 2ull * r * D;
            uint8_t *to = (uint8_t *)raw + 2 * (((uint64_t)t * H + h) * D);
            if (out_dtype == lay->dtype)
                memcpy(to, row, 2ull * D);
            else
                for (uint32_t d = 0; d < D; d++)
                    kern_store(to, out_dtype, d, kern_load(row, lay->dtype, d));
        }
    }
    return 0;
}
