/*
 * kern_merge512.c — MERGE's sections with AVX-512, for CPUs that have it: kern_merge.c's clean
 * path (fp16 slabs, no Inf or NaN) on 512-bit vectors.
 *
 * DESIGN
 * kern_merge.c's AVX2 pass spent its time on instructions more than on memory (a block cycled
 * in L2 ran 10.5 GB/s, one from DRAM 7.9): per row a separate Inf/NaN check, then the plan's
 * distance, then the running sum, each eight halves at a time. Here a row is read 32 halves
 * at a time, sums and means take sixteen channels per instruction, and the rows the plan
 * reads need no check of their own: a distance or a norm is finite exactly where its rows
 * are (the squares of finite halves sum far below FLT_MAX), so one compare per row stands for
 * the check; the V section's rows, which the plan does not read, are checked as before. The
 * plan's sums keep kern_merge_near's order: channel c into partial c % 8, a 16-lane square's
 * low half added before its high half, folded as kern_sum8_fold; lim |s|^2 is folded once
 * per run (the same float each time). The means are channel-wise sums of the tokens in
 * order, so their lanes are free. The bytes are the reference's. AVX-512F brings the 512-bit
 * FMA: the file is built with -ffp-contract=off (Makefile), so products and sums stay apart.
 *
 * Memory: the pass walks the slabs in memory order (token by token, the heads of a token in
 * turn) and prefetches the rows four tokens ahead: a token's rows of every head are 2 KiB for
 * the common 8 x 128, so a 4 KiB page holds two tokens, and the hardware prefetcher stops at
 * a page. The K pass prefetches the V rows too (the V section reads them next). A run's row
 * of the section is prefetched for writing where the run starts: the stores of a closing run
 * otherwise missed, filled the store queue and stalled the pass (12.2 GB/s against 10.6).
 *
 * Chosen at run time by kern_rot512_on() (kern_rot512.c: the CPU has AVX-512 F, BW, VL, DQ
 * and F16C, KVC_NO_AVX512 not set; read once), which the tests switch with kern_rot_avx512()
 * to run the AVX2 path too. Only fp16 slabs with head dims that are multiples of 32 come here.
 */
#include <errno.h>
#include <float.h>
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern_cpu.h"
#include "kernels/kern_ext.h"
#include "kernels/kern_st512.h"

#define K5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))
#define K5I __attribute__((always_inline)) K5 static inline

#define M5_AHEAD 4 /* tokens prefetched ahead of the one judged */
#ifndef M5_DEC_AHEAD
#define M5_DEC_AHEAD 2 /* rows prefetched ahead of the one decoded */
#endif

/* A head's state: rows started, the open run's first token a and its row r, the runs' first
 * rows (sk, sv: floats) with lim |s|^2 (lk, lv), the running sum and the open run's first
 * row in `own` (the sum is written only once a second row joins: summed). */
struct m5_state {
    uint32_t rows, a, r;
    int summed;
    float lk, lv;
    float *sk, *sv, *sum;
    const uint16_t *first;
};

/* 32 halves as floats (F16C's, exact): channels c..c+15 and c+16..c+31. */
K5I void m5_load(const uint16_t *p, __m512 *lo, __m512 *hi)
{
    const __m256i *v = (const __m256i *)p;
    *lo = _mm512_cvtph_ps(_mm256_loadu_si256(v));
    *hi = _mm512_cvtph_ps(_mm256_loadu_si256(v + 1));
}

/* Sixteen squares into the eight partials of channels c % 8: the low half (channels c..c+7)
 * then the high half (c+8..c+15), as kern_merge_near adds them. */
K5I __m256 m5_acc(__m256 p, __m512 q)
{
    p = _mm256_add_ps(p, _mm512_castps512_ps256(q));
    return _mm256_add_ps(p, _mm512_extractf32x8_ps(q, 1));
}

/* kern_sum8_fold of the eight partials in a vector. */
K5I float m5_fold(__m256 p)
{
    const __m128 a = _mm256_castps256_ps128(p), b = _mm256_extractf128_ps(p, 1);
    /* (p0 + p1) + (p2 + p3) and (p4 + p5) + (p6 + p7), then their sum */
    const __m128 s = _mm_hadd_ps(_mm_hadd_ps(a, a), _mm_hadd_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehl_ps(s, s)));
}

/* |x - s|^2 of a row (kern_merge_near's partial sums, folded). Not finite exactly where x
 * or s holds Inf or NaN: the finite squares of a head's halves sum far below FLT_MAX. */
K5I float m5_dist(const uint16_t *x, const float *s, uint32_t D)
{
    __m256 p = _mm256_setzero_ps();
    for (uint32_t c = 0; c < D; c += 32) {
        __m512 lo, hi;
        m5_load(x + c, &lo, &hi);
        const __m512 d0 = _mm512_sub_ps(lo, _mm512_loadu_ps(s + c));
        const __m512 d1 = _mm512_sub_ps(hi, _mm512_loadu_ps(s + c + 16));
        p = m5_acc(p, _mm512_mul_ps(d0, d0));
        p = m5_acc(p, _mm512_mul_ps(d1, d1));
    }
    return m5_fold(p);
}

/* A run's first row into s as floats; |s|^2 (the plan's partials, folded) returned, not
 * finite exactly where the row holds Inf or NaN (as m5_dist). */
K5I float m5_start(const uint16_t *x, float *s, uint32_t D)
{
    __m256 p = _mm256_setzero_ps();
    for (uint32_t c = 0; c < D; c += 32) {
        __m512 lo, hi;
        m5_load(x + c, &lo, &hi);
        _mm512_storeu_ps(s + c, lo);
        _mm512_storeu_ps(s + c + 16, hi);
        p = m5_acc(p, _mm512_mul_ps(lo, lo));
        p = m5_acc(p, _mm512_mul_ps(hi, hi));
    }
    return m5_fold(p);
}

/* The check alone, for rows no distance or start reads (the V section's). */
K5I void m5_check(const uint16_t *x, uint32_t D, __m512i *bad)
{
    for (uint32_t c = 0; c < D; c += 32)
        *bad = _mm512_max_epu16(
            *bad, _mm512_and_si512(_mm512_loadu_si512(x + c), _mm512_set1_epi16(0x7fff)));
}

K5I __m512 m5_h16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* Token t of head h (t == T closes the last run), as kern_merge.c's mrg_step on a clean
 * slab: the plan's join (rows and forced tokens), the run's sum and its mean. */
K5I void m5_step(const struct kern_ext_ctx *c, uint32_t h, uint32_t t, const uint8_t *own,
                 uint8_t *head, struct m5_state *st, float lim, __m512i *bad, int *nf)
{
    const struct kern_layout *lay = c->lay;
    const uint32_t T = lay->tokens, D = lay->head_dim, R = kern_merge_rows(T);
    const uint64_t rs = (uint64_t)lay->heads * D; /* halves from a token's row to the next */
    const uint64_t at = t * rs + (uint64_t)h * D; /* the token's row in a slab */
    const uint16_t *xr = t < T ? (const uint16_t *)own + at : NULL;
    uint32_t *map = (uint32_t *)(head + 16);
    uint16_t *row0 = (uint16_t *)(head + 16 + kern_merge_map_bytes(T));
    int join = 0;
    if (t < T && c->kmerge) { /* the K section's runs */
        const uint32_t *km =
            (const uint32_t *)(kern_merge_head((uint8_t *)(uintptr_t)c->kmerge, lay, h) + 16);
        m5_check(xr, D, bad);
        join = t > 0 && !(km[t >> 5] >> (t & 31) & 1u);
    } else if (t < T && t > 0) {
        const float dk = m5_dist((const uint16_t *)c->rawk + at, st->sk, D);
        *nf |= !(dk <= FLT_MAX);
        join = dk <= st->lk;
        if (join && c->rawv) {
            const float dv = m5_dist((const uint16_t *)c->rawv + at, st->sv, D);
            *nf |= !(dv <= FLT_MAX);
            join = dv <= st->lv;
        }
        if (!join && st->rows >= R)
            join = 1; /* forced: the head has no room for another row */
        if (own != c->rawk)
            m5_check(xr, D, bad); /* a V section planned alone: a forced row unread so far */
    }
    if (t > 0 && !join) { /* the run [a, t) closes into row r */
        uint16_t *o = row0 + (uint64_t)st->r * D;
        if (!st->summed) { /* one row: fp16(0 + x) is x's half, but for -0 (0 + -0 = +0) */
            for (uint32_t d = 0; d < D; d += 32) {
                const __m512i v = _mm512_loadu_si512(st->first + d);
                const __mmask32 nz = _mm512_cmpeq_epi16_mask(v, _mm512_set1_epi16(-32768));
                _mm512_storeu_si512(o + d, _mm512_maskz_mov_epi16(~nz, v));
            }
        } else {
            const __m512 n = _mm512_set1_ps((float)(t - st->a));
            for (uint32_t d = 0; d < D; d += 16)
                _mm256_storeu_si256(
                    (__m256i *)(o + d),
                    _mm512_cvtps_ph(_mm512_div_ps(_mm512_loadu_ps(st->sum + d), n),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        st->r++;
    }
    if (t == T)
        return;
    if (join && !st->summed) { /* the run's second row: (0 + x_a) + x_t */
        for (uint32_t d = 0; d < D; d += 16)
            _mm512_storeu_ps(st->sum + d,
                             _mm512_add_ps(_mm512_add_ps(_mm512_setzero_ps(), m5_h16(st->first + d)),
                                           m5_h16(xr + d)));
        st->summed = 1;
        return;
    }
    if (join) {
        for (uint32_t d = 0; d < D; d += 16)
            _mm512_storeu_ps(st->sum + d,
                             _mm512_add_ps(_mm512_loadu_ps(st->sum + d), m5_h16(xr + d)));
        return;
    }
    if (t > 0) { /* a new run from t */
        st->rows++;
        map[t >> 5] |= 1u << (t & 31);
    }
    st->a = t;
    /* the run's row of the section, written where the run closes: its lines owned by then
     * (a store that misses waits in the store queue, and a queue full of them stalls) */
    for (uint32_t d = 0; d < 2 * D; d += 64)
        _mm_prefetch((const char *)(row0 + (uint64_t)st->r * D) + d, _MM_HINT_ET0);
    if (!c->kmerge) { /* the rows the next tokens are compared with */
        const float nk = m5_start((const uint16_t *)c->rawk + at, st->sk, D);
        *nf |= !(nk <= FLT_MAX);
        st->lk = KERN_MUL(lim, nk);
        if (c->rawv) {
            const float nv = m5_start((const uint16_t *)c->rawv + at, st->sv, D);
            *nf |= !(nv <= FLT_MAX);
            st->lv = KERN_MUL(lim, nv);
        }
    }
    st->first = xr; /* the sum starts as 0 + x, as the reference's, if a row joins */
    st->summed = 0;
}

/* The section in one pass; 0 where a row it read holds Inf or NaN. buf: 3 H D floats. */
K5 static int m5_sect(const struct kern_ext_ctx *c, const uint8_t *own, uint8_t *sect, float *buf,
                      struct m5_state *st)
{
    const struct kern_layout *lay = c->lay;
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim;
    const float lim = kern_merge_lim(c->rec->merge_cos);
    /* every float of buf is written before it is read (a run's rows and sum where it starts);
     * of a head's bytes only the prefix and the map are cleared here, and the rows no run
     * used after the pass */
    for (uint32_t h = 0; h < H; h++) {
        uint8_t *head = kern_merge_head(sect, lay, h);
        memset(head, 0, 16 + kern_merge_map_bytes(T));
        ((uint32_t *)(head + 16))[0] = 1u;
        memset(&st[h], 0, sizeof(st[h]));
        st[h].rows = 1;
        st[h].sk = buf + 3 * (size_t)h * D;
        st[h].sv = st[h].sk + D;
        st[h].sum = st[h].sv + D;
    }
    const uint64_t tb = 2ull * H * D; /* a token's rows of a slab, in bytes */
    const uint8_t *pv = c->kmerge ? NULL : c->rawv;
    __m512i bad = _mm512_setzero_si512(); /* the checked rows' magnitudes' bits, maximum */
    int nf = 0;                           /* a distance or a norm not finite */
    for (uint32_t t = 0; t <= T; t++) {
        if (t + M5_AHEAD < T)
            for (uint64_t o = 0; o < tb; o += 64) {
                _mm_prefetch((const char *)own + (t + M5_AHEAD) * tb + o, _MM_HINT_T0);
                if (pv)
                    _mm_prefetch((const char *)pv + (t + M5_AHEAD) * tb + o, _MM_HINT_T0);
            }
        for (uint32_t h = 0; h < H; h++)
            m5_step(c, h, t, own, kern_merge_head(sect, lay, h), &st[h], lim, &bad, &nf);
    }
    if (nf || _mm512_cmpge_epu16_mask(bad, _mm512_set1_epi16(0x7c00)))
        return 0;
    for (uint32_t h = 0; h < H; h++) {
        uint8_t *head = kern_merge_head(sect, lay, h);
        memcpy(head, &st[h].rows, 4);
        const uint64_t used = 16 + kern_merge_map_bytes(T) + 2ull * st[h].r * D;
        memset(head + used, 0, kern_merge_head_bytes(D, T) - used);
    }
    return 1;
}

int kern_merge512_sect(const struct kern_ext_ctx *c, const uint8_t *own, uint8_t *sect)
{
    const struct kern_layout *lay = c->lay;
    if (lay->dtype != KERN_DTYPE_FP16 || lay->head_dim % 32 != 0)
        return 0;
    const size_t H = lay->heads;
    struct m5_state *st = malloc(H * sizeof(*st) + 3 * H * lay->head_dim * sizeof(float));
    if (!st)
        return -ENOMEM;
    const int rc = m5_sect(c, own, sect, (float *)(st + H), st);
    free(st);
    return rc;
}

/* ---- decode ------------------------------------------------------------------------------ */

/* The section's stored rows back into its slab, in memory order (token by token, the heads of
 * a token in turn), each token's row its run's (kern_merge_dec's row); n: H counts of the rows
 * a head's map has started so far. Stores by mode nt (kern_st512.h). */
K5I void m5_dec(const struct kern_layout *lay, const uint8_t *sect, uint16_t *to, uint32_t *n,
                const int nt)
{
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim, R = kern_merge_rows(T);
    const uint64_t hb = kern_merge_head_bytes(D, T), mb = kern_merge_map_bytes(T);
    memset(n, 0, H * sizeof(*n));
    for (uint32_t t = 0; t < T; t++) {
        const uint8_t *head = sect;
        for (uint32_t h = 0; h < H; h++, head += hb, to += D) {
            uint32_t w;
            memcpy(&w, head + 16 + 4 * (t >> 5), 4);
            n[h] += w >> (t & 31) & 1u;
            /* kern_merge_row_of's row, n - 1 (a damaged map that starts no row reads row 0) */
            const uint32_t r = n[h] - 1 < R ? n[h] - 1 : 0;
            const uint16_t *row = (const uint16_t *)(head + 16 + mb) + (uint64_t)r * D;
            for (uint32_t d = 0; d < D; d += 32) {
                _mm_prefetch((const char *)(row + d + M5_DEC_AHEAD * D), _MM_HINT_T0);
                kern_st512(to + d, _mm512_loadu_si512(row + d), nt);
            }
        }
    }
}

K5 int kern_merge512_dec(const struct kern_layout *lay, const uint8_t *sect, void *raw)
{
    if (lay->head_dim % 32 != 0)
        return 0;
    uint32_t n[KERN_MAX_HEADS];
    /* every store is at a multiple of 64 bytes from raw (D % 32 == 0) */
    const int nt = kern_st512_mode(raw, lay);
    if (nt == 2)
        m5_dec(lay, sect, raw, n, 2);
    else if (nt == 1)
        m5_dec(lay, sect, raw, n, 1);
    else
        m5_dec(lay, sect, raw, n, 0);
    if (nt)
        _mm_sfence(); /* the streamed lines are ordered before whatever the caller does next */
    return 1;
}
