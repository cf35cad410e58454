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
 * the check. The V section's rows, which the plan does not read, are checked where they are
 * written instead of where they are read: a section row (a run's halves, or its mean) is
 * finite exactly where the rows of its run are, and there are half as many (or fewer). The
 * plan's sums keep kern_merge_near's order: channel c into partial c % 8, a 16-lane square's
 * low half added before its high half, folded as kern_sum8_fold; lim |s|^2 is folded once
 * per run (the same float each time). The K distances of two heads of a token share their
 * instructions: head h's eight partials in a vector's low half, h + 1's in its high half,
 * each lane's sum in the same order, one fold for both. A run's first V row is read (and
 * its norm taken) only where a K row first joins the run, as the reference compares V rows
 * only there: where tokens stay apart the K pass reads no V row. The means are channel-wise
 * sums of the tokens in order, so their lanes are free. The bytes are the reference's.
 * AVX-512F brings the 512-bit FMA: the file is built with -ffp-contract=off (Makefile), so
 * products and sums stay apart.
 *
 * Key statistics (encode with statistics, the daemon's call): the K pass takes them from
 * the registers its distances load, in the order of kern_avx2_enc.c's statistics pass, so
 * the same floats, instead of that pass reading the K slab once more before it.
 *
 * Memory: the pass walks the slabs in memory order (token by token, the heads of a token in
 * turn) and prefetches the rows four tokens ahead: a token's rows of every head are 2 KiB for
 * the common 8 x 128, so a 4 KiB page holds two tokens, and the hardware prefetcher stops at
 * a page. The K pass prefetches the V rows too (the V section reads them next). A run's row
 * of the section is prefetched for writing where the run starts: the stores of a closing run
 * otherwise missed, filled the store queue and stalled the pass (12.2 GB/s against 10.6).
 *
 * Decode (kern_merge512_dec, any dtype the block's own): each token's row is its run's stored
 * row, copied 64 bytes at a time in memory order and streamed from 1 MiB of output
 * (kern_st512.h); the row index is kept per head as the map is walked, and each head's rows
 * are prefetched two ahead (the eight heads' rows are read at once, and the loads' misses
 * held half the decode's time).
 *
 * Chosen at run time by kern_rot512_on() (kern_rot512.c: the CPU has AVX-512 F, BW, VL, DQ
 * and F16C, KVC_NO_AVX512 not set; read once), which the tests switch with kern_rot_avx512()
 * to run the AVX2 path too. Only fp16 slabs with head dims that are multiples of 32 come here
 * to be encoded; decode takes head dims that are multiples of 32.
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
#define M5_DEC_AHEAD 2 /* rows prefetched ahead of the one decoded (kern_merge512_dec) */

/* A head's state: rows started, the open run's first token a and its row r, the runs' first
 * rows (sk, sv: floats) with lim |s|^2 (lk, lv; sv and lv only once a K row of the run
 * joins: vset), the running sum and the open run's first row in `own` (the sum is written
 * only once a second row joins: summed). */
struct m5_state {
    uint32_t rows, a, r;
    int summed, vset;
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

K5I __m512 m5_h16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* Two rows' eight lanes side by side: [a's channels c..c+7, b's c..c+7] (lo2) and the same
 * of c+8..c+15 (hi2), a and b sixteen channels each. */
K5I __m512 m5_lo2(__m512 a, __m512 b)
{
    return _mm512_shuffle_f32x4(a, b, 0x44);
}

K5I __m512 m5_hi2(__m512 a, __m512 b)
{
    return _mm512_shuffle_f32x4(a, b, 0xee);
}

/* kern_sum8_fold of both halves' eight partials at once: lane 0 holds the low half's,
 * lane 8 the high half's (lane i adds lane i ^ 1, then i ^ 2, then i ^ 4). */
K5I __m512 m5_fold2(__m512 p)
{
    p = _mm512_add_ps(p, _mm512_permute_ps(p, 0xb1));
    p = _mm512_add_ps(p, _mm512_permute_ps(p, 0x4e));
    return _mm512_add_ps(p, _mm512_shuffle_f32x4(p, p, 0xb1));
}

/* v_hsum (kern_avx2.h) of both halves at once, in its order: ((s0 + s4) + (s2 + s6)) +
 * ((s1 + s5) + (s3 + s7)) into lanes 0 and 8 (lane i adds i ^ 4, then i ^ 2, then i ^ 1). */
K5I __m512 m5_hsum2(__m512 s)
{
    s = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, 0xb1));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4e));
    return _mm512_add_ps(s, _mm512_permute_ps(s, 0xb1));
}

/* Key statistics wanted from the K pass: the layer's kmin, kmax ([H][D]) and knorm ([H]). */
struct m5_stats {
    float *kmin, *kmax, *knorm;
};

/* Token t's K rows of heads h and h + 1 (xa, xb; the same row twice for a last odd head, one
 * == 0) read once for what the K pass takes from them: the plan's distances to their runs'
 * first rows (sa, sb; where dist) into d[0], d[1], with the two rows' partial sums in the
 * halves of one vector (m5_lo2/m5_hi2: channel c into lane c % 8 of its half, in order, as
 * kern_merge_near) and folded together; and the key statistics (where ks) as stats_rows of
 * kern_avx2_enc.c takes them: the new value the first operand of min and max (on a tie the
 * earlier row's stays), a row's squares per 32 channels ((v0^2 + v1^2) + (v2^2 + v3^2), eight
 * channels each) summed from 0, v_hsum, sqrtf, added to knorm in token order. */
K5I void m5_pair(const uint16_t *xa, const uint16_t *xb, const float *sa, const float *sb,
                 uint32_t h, uint32_t D, const int dist, const struct m5_stats *ks, int one,
                 float *d)
{
    __m512 p = _mm512_setzero_ps(), ss = _mm512_setzero_ps();
    for (uint32_t c = 0; c < D; c += 32) {
        __m512 a0, a1, b0, b1;
        m5_load(xa + c, &a0, &a1);
        m5_load(xb + c, &b0, &b1);
        if (dist) {
            const __m512 da0 = _mm512_sub_ps(a0, _mm512_loadu_ps(sa + c)),
                         da1 = _mm512_sub_ps(a1, _mm512_loadu_ps(sa + c + 16)),
                         db0 = _mm512_sub_ps(b0, _mm512_loadu_ps(sb + c)),
                         db1 = _mm512_sub_ps(b1, _mm512_loadu_ps(sb + c + 16));
            const __m512 qa0 = _mm512_mul_ps(da0, da0), qa1 = _mm512_mul_ps(da1, da1),
                         qb0 = _mm512_mul_ps(db0, db0), qb1 = _mm512_mul_ps(db1, db1);
            p = _mm512_add_ps(p, m5_lo2(qa0, qb0));
            p = _mm512_add_ps(p, m5_hi2(qa0, qb0));
            p = _mm512_add_ps(p, m5_lo2(qa1, qb1));
            p = _mm512_add_ps(p, m5_hi2(qa1, qb1));
        }
        if (ks) {
            float *mn = ks->kmin + (uint64_t)h * D + c, *mx = ks->kmax + (uint64_t)h * D + c;
            _mm512_storeu_ps(mn, _mm512_min_ps(a0, _mm512_loadu_ps(mn)));
            _mm512_storeu_ps(mn + 16, _mm512_min_ps(a1, _mm512_loadu_ps(mn + 16)));
            _mm512_storeu_ps(mx, _mm512_max_ps(a0, _mm512_loadu_ps(mx)));
            _mm512_storeu_ps(mx + 16, _mm512_max_ps(a1, _mm512_loadu_ps(mx + 16)));
            if (!one) {
                mn += D;
                mx += D;
                _mm512_storeu_ps(mn, _mm512_min_ps(b0, _mm512_loadu_ps(mn)));
                _mm512_storeu_ps(mn + 16, _mm512_min_ps(b1, _mm512_loadu_ps(mn + 16)));
                _mm512_storeu_ps(mx, _mm512_max_ps(b0, _mm512_loadu_ps(mx)));
                _mm512_storeu_ps(mx + 16, _mm512_max_ps(b1, _mm512_loadu_ps(mx + 16)));
            }
            const __m512 sa0 = _mm512_mul_ps(a0, a0), sa1 = _mm512_mul_ps(a1, a1),
                         sb0 = _mm512_mul_ps(b0, b0), sb1 = _mm512_mul_ps(b1, b1);
            const __m512 sq = _mm512_add_ps(_mm512_add_ps(m5_lo2(sa0, sb0), m5_hi2(sa0, sb0)),
                                            _mm512_add_ps(m5_lo2(sa1, sb1), m5_hi2(sa1, sb1)));
            ss = _mm512_add_ps(ss, sq);
        }
    }
    if (dist) {
        p = m5_fold2(p);
        d[0] = _mm512_cvtss_f32(p);
        d[1] = _mm_cvtss_f32(_mm512_extractf32x4_ps(p, 2));
    }
    if (ks) {
        ss = m5_hsum2(ss);
        ks->knorm[h] += sqrtf(_mm512_cvtss_f32(ss));
        if (!one)
            ks->knorm[h + 1] += sqrtf(_mm_cvtss_f32(_mm512_extractf32x4_ps(ss, 2)));
    }
}

/* The open run [a, t) of a head into its row r of the section: a run of one row as its
 * halves (fp16(0 + x) is x's half, but for -0: 0 + -0 = +0), a longer one as its sum's mean.
 * chk: the row is checked for Inf or NaN (a written row is finite exactly where the rows of
 * its run are), for the passes that sum rows their plan did not read. */
K5I void m5_close(struct m5_state *st, uint16_t *row0, uint32_t t, uint32_t D, const int chk,
                  __m512i *bad, __mmask16 *nfm)
{
    uint16_t *o = row0 + (uint64_t)st->r * D;
    if (!st->summed) {
        for (uint32_t d = 0; d < D; d += 32) {
            const __m512i v = _mm512_loadu_si512(st->first + d);
            const __mmask32 nz = _mm512_cmpeq_epi16_mask(v, _mm512_set1_epi16(-32768));
            if (chk)
                *bad = _mm512_max_epu16(*bad, _mm512_and_si512(v, _mm512_set1_epi16(0x7fff)));
            _mm512_storeu_si512(o + d, _mm512_maskz_mov_epi16(~nz, v));
        }
    } else {
        const __m512 n = _mm512_set1_ps((float)(t - st->a));
        for (uint32_t d = 0; d < D; d += 16) {
            const __m512 m = _mm512_div_ps(_mm512_loadu_ps(st->sum + d), n);
            if (chk) /* QNaN, +Inf, -Inf, SNaN */
                *nfm |= _mm512_fpclass_ps_mask(m, 0x99);
            _mm256_storeu_si256((__m256i *)(o + d),
                                _mm512_cvtps_ph(m, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
    }
    st->r++;
}

/* Row xr joins the open run: the sum starts as (0 + x_a) + x_t, as the reference's, when it
 * is the second row. */
K5I void m5_join(struct m5_state *st, const uint16_t *xr, uint32_t D)
{
    if (!st->summed) {
        for (uint32_t d = 0; d < D; d += 16)
            _mm512_storeu_ps(st->sum + d, _mm512_add_ps(_mm512_add_ps(_mm512_setzero_ps(),
                                                                      m5_h16(st->first + d)),
                                                        m5_h16(xr + d)));
        st->summed = 1;
        return;
    }
    for (uint32_t d = 0; d < D; d += 16)
        _mm512_storeu_ps(st->sum + d, _mm512_add_ps(_mm512_loadu_ps(st->sum + d), m5_h16(xr + d)));
}

/* A run opens at token t (row xr of `own`) into row r of the section (row0). Its row is
 * prefetched for writing, written where the run closes: its lines owned by then (a store
 * that misses waits in the store queue, and a queue full of them stalls). */
K5I void m5_open(struct m5_state *st, uint32_t *map, uint16_t *row0, uint32_t t, const uint16_t *xr,
                 uint32_t D)
{
    if (t > 0) {
        st->rows++;
        map[t >> 5] |= 1u << (t & 31);
    }
    st->a = t;
    for (uint32_t d = 0; d < 2 * D; d += 64)
        _mm_prefetch((const char *)(row0 + (uint64_t)st->r * D) + d, _MM_HINT_ET0);
    st->first = xr; /* the sum starts as 0 + x, as the reference's, if a row joins */
    st->summed = 0;
}

/* The section in one pass, token by token and the heads of a token in turn (the slabs in
 * memory order), with a pass of its own for each kind of section (plan: the plan made here,
 * a K section or a V section planned alone; else a V section that takes the K section's
 * runs, c->kmerge). 0 where a row it read holds Inf or NaN. buf: 3 H D floats. */
K5I int m5_pass(const struct kern_ext_ctx *c, const uint8_t *own, uint8_t *sect, float *buf,
                struct m5_state *st, const int plan, const struct m5_stats *ks)
{
    const struct kern_layout *lay = c->lay;
    const uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim, R = kern_merge_rows(T);
    const uint64_t rs = (uint64_t)H * D; /* halves from a token's row to the next */
    const float lim = kern_merge_lim(c->rec->merge_cos);
    const uint16_t *rk = (const uint16_t *)c->rawk, *rv = (const uint16_t *)c->rawv;
    /* rows this pass sums that its plan did not read, so checked where written: the V
     * section's (a V row is read by the plan only where its K row joins) */
    const int chk = own != c->rawk;
    const uint64_t hb = kern_merge_head_bytes(D, T), mb = kern_merge_map_bytes(T);
    /* every float of buf is written before it is read (a run's rows and sum where it starts);
     * of a head's bytes only the prefix and the map are cleared here, and the rows no run
     * used after the pass */
    for (uint32_t h = 0; h < H; h++) {
        uint8_t *head = sect + h * hb;
        memset(head, 0, 16 + mb);
        ((uint32_t *)(head + 16))[0] = 1u;
        memset(&st[h], 0, sizeof(st[h]));
        st[h].rows = 1;
        st[h].sk = buf + 3 * (size_t)h * D;
        st[h].sv = st[h].sk + D;
        st[h].sum = st[h].sv + D;
    }
    if (ks) { /* stats_init of kern_avx2_enc.c (H D a multiple of 32) */
        for (uint64_t i = 0; i < rs; i += 16) {
            _mm512_storeu_ps(ks->kmin + i, _mm512_set1_ps(3.402823466e38f));
            _mm512_storeu_ps(ks->kmax + i, _mm512_set1_ps(-3.402823466e38f));
        }
        for (uint32_t h = 0; h < H; h++)
            ks->knorm[h] = 0.0f;
    }
    const uint64_t tb = 2 * rs; /* a token's rows of a slab, in bytes */
    const uint8_t *pv = plan ? c->rawv : NULL;
    __m512i bad = _mm512_setzero_si512(); /* the checked rows' magnitudes' bits, maximum */
    __mmask16 nfm = 0;                    /* a checked mean not finite */
    int nf = 0;                           /* a distance or a norm not finite */
    float dk[2] = {0.0f, 0.0f};
    for (uint32_t t = 0; t <= T; t++) {
        if (t + M5_AHEAD < T)
            for (uint64_t o = 0; o < tb; o += 64) {
                _mm_prefetch((const char *)own + (t + M5_AHEAD) * tb + o, _MM_HINT_T0);
                if (pv)
                    _mm_prefetch((const char *)pv + (t + M5_AHEAD) * tb + o, _MM_HINT_T0);
            }
        const uint64_t at = t * rs; /* the token's rows in a slab */
        const uint16_t *xo = (const uint16_t *)own + at;
        if (!plan) { /* the K section's runs */
            for (uint32_t h = 0; h < H; h++) {
                uint8_t *head = sect + h * hb;
                uint16_t *row0 = (uint16_t *)(head + 16 + mb);
                const uint32_t *km = (const uint32_t *)(c->kmerge + h * hb + 16);
                const int join = t > 0 && t < T && !(km[t >> 5] >> (t & 31) & 1u);
                if (t > 0 && !join)
                    m5_close(&st[h], row0, t, D, chk, &bad, &nfm);
                if (t == T)
                    continue;
                if (join)
                    m5_join(&st[h], xo + h * D, D);
                else
                    m5_open(&st[h], (uint32_t *)(head + 16), row0, t, xo + h * D, D);
            }
            continue;
        }
        for (uint32_t h = 0; h < H; h += 2) {
            uint8_t *head = sect + h * hb;
            const uint32_t n = H - h < 2 ? 1 : 2, hn = h + n - 1; /* heads h and hn */
            /* the plan's K distances of both (from token 1), the key statistics of both */
            if (t < T && t > 0)
                m5_pair(rk + at + h * D, rk + at + hn * D, st[h].sk, st[hn].sk, h, D, 1, ks, n == 1,
                        dk);
            else if (t < T && ks)
                m5_pair(rk + at + h * D, rk + at + hn * D, st[h].sk, st[hn].sk, h, D, 0, ks, n == 1,
                        dk);
            for (uint32_t i = 0; i < n; i++, head += hb) {
                struct m5_state *s = &st[h + i];
                uint16_t *row0 = (uint16_t *)(head + 16 + mb);
                int join = 0;
                if (t < T && t > 0) {
                    nf |= !(dk[i] <= FLT_MAX);
                    join = dk[i] <= s->lk;
                    if (join && rv && !s->vset) {
                        /* the run's first V row, read where a K row first joins it (the
                         * reference compares V rows only there); one with Inf or NaN makes
                         * the distance below not finite */
                        s->lv = KERN_MUL(lim, m5_start(rv + s->a * rs + (h + i) * D, s->sv, D));
                        s->vset = 1;
                    }
                    if (join && rv) {
                        const float dv = m5_dist(rv + at + (h + i) * D, s->sv, D);
                        nf |= !(dv <= FLT_MAX);
                        join = dv <= s->lv;
                    }
                    if (!join && s->rows >= R)
                        join = 1; /* forced: the head has no room for another row */
                }
                if (t > 0 && !join)
                    m5_close(s, row0, t, D, chk, &bad, &nfm);
                if (t == T)
                    continue;
                if (join) {
                    m5_join(s, xo + (h + i) * D, D);
                    continue;
                }
                m5_open(s, (uint32_t *)(head + 16), row0, t, xo + (h + i) * D, D);
                /* the rows the next tokens are compared with */
                const float nk = m5_start(rk + at + (h + i) * D, s->sk, D);
                nf |= !(nk <= FLT_MAX);
                s->lk = KERN_MUL(lim, nk);
                s->vset = 0;
            }
        }
    }
    if (nf || nfm || _mm512_cmpge_epu16_mask(bad, _mm512_set1_epi16(0x7c00)))
        return 0;
    if (ks) /* stats_done */
        for (uint32_t h = 0; h < H; h++)
            ks->knorm[h] = ks->knorm[h] / (float)T;
    for (uint32_t h = 0; h < H; h++) {
        uint8_t *head = sect + h * hb;
        memcpy(head, &st[h].rows, 4);
        const uint64_t used = 16 + mb + 2ull * st[h].r * D;
        memset(head + used, 0, hb - used);
    }
    return 1;
}

K5 static int m5_sect(const struct kern_ext_ctx *c, const uint8_t *own, uint8_t *sect, float *buf,
                      struct m5_state *st, const struct m5_stats *ks)
{
    if (c->kmerge)
        return m5_pass(c, own, sect, buf, st, 0, NULL);
    if (ks)
        return m5_pass(c, own, sect, buf, st, 1, ks);
    return m5_pass(c, own, sect, buf, st, 1, NULL);
}

int kern_merge512_sect(const struct kern_ext_ctx *c, const uint8_t *own, uint8_t *sect)
{
    const struct kern_layout *lay = c->lay;
    if (lay->dtype != KERN_DTYPE_FP16 || lay->head_dim % 32 != 0)
        return 0;
    const size_t H = lay->heads;
    const struct m5_stats ks = {c->kmin, c->kmax, c->knorm};
    struct m5_state *st = malloc(H * sizeof(*st) + 3 * H * lay->head_dim * sizeof(float));
    if (!st)
        return -ENOMEM;
    const int stats = c->kmin && own == c->rawk && !c->kmerge;
    const int rc = m5_sect(c, own, sect, (float *)(st + H), st, stats ? &ks : NULL);
    free(st);
    return rc && stats ? 2 : rc;
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
