/*
 * kern_avx2.c — the vectorised CPU codecs (AVX2 + F16C), chosen at run time.
 *
 * DESIGN
 * Each function computes exactly the float operations of the reference in kern_fmt.h, eight
 * lanes at a time, so codes, scales and decoded values are bit-identical: divisions stay
 * divisions, roundf() is emulated (truncate, then step away from zero when the remainder is
 * >= 0.5), and FMA is deliberately not enabled in the target so the compiler cannot fuse a
 * multiply and an add the reference rounds twice. Full 32-value groups (and 8-channel runs
 * for KIVI keys) take the vector path; a tail calls the reference's scalar group code.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/kern_cpu.h"
#include "kernels/kern_fmt.h"

#define KT __attribute__((target("avx2,f16c")))

KT static inline __m256 v_sanitize(__m256 x)
{
    x = _mm256_and_ps(x, _mm256_cmp_ps(x, x, _CMP_ORD_Q));
    x = _mm256_min_ps(x, _mm256_set1_ps(KERN_FP16_MAX));
    return _mm256_max_ps(x, _mm256_set1_ps(-KERN_FP16_MAX));
}

KT static inline float v_hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

KT static inline float v_hmin(__m256 v)
{
    __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    m = _mm_min_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

KT static inline float v_hsum(__m256 v)
{
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* roundf(): half away from zero, exactly. */
KT static inline __m256 v_roundf(__m256 x)
{
    const __m256 sm = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_andnot_ps(sm, _mm256_sub_ps(x, t));
    __m256 ge = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 step = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(x, sm));
    return _mm256_add_ps(t, _mm256_and_ps(ge, step));
}

/* Four vectors of int32 in [-128, 255] -> 32 bytes in element order. */
KT static inline __m256i v_pack_bytes(__m256i a, __m256i b, __m256i c, __m256i d, int sgn)
{
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i p = sgn ? _mm256_packs_epi16(ab, cd) : _mm256_packus_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Eight int32 in [0, 255] -> 8 bytes. */
KT static inline void v_store8b(uint8_t *dst, __m256i c)
{
    __m256i p = _mm256_packus_epi32(c, c);
    p = _mm256_packus_epi16(p, p);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
    _mm_storel_epi64((__m128i *)dst, _mm256_castsi256_si128(p));
}

/* ---- load, store, statistics --------------------------------------------------------- */

KT static inline __m256 v_load8(const uint16_t *r, uint32_t dtype)
{
    __m128i v = _mm_loadu_si128((const __m128i *)r);
    __m256 f = dtype == KERN_DTYPE_BF16
                   ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
                   : _mm256_cvtph_ps(v);
    return v_sanitize(f);
}

KT static inline void v_store8(uint16_t *r, __m256 v, uint32_t dtype)
{
    __m128i h;
    if (dtype == KERN_DTYPE_BF16) {
        __m256i u = _mm256_castps_si256(v);
        __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        __m256i rn = _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
        rn = _mm256_srli_epi32(rn, 16);
        __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
        __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        rn = _mm256_blendv_epi8(rn, nan, isnan);
        __m256i p = _mm256_packus_epi32(rn, rn);
        h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
    } else {
        h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    _mm_storeu_si128((__m128i *)r, h);
}

KT static void avx_load(const void *src, uint32_t dtype, uint64_t stride, uint32_t tokens,
                        uint32_t dim, float *x)
{
    for (uint32_t t = 0; t < tokens; t++) {
        const uint16_t *r = (const uint16_t *)src + t * stride;
        float *o = x + (uint64_t)t * dim;
        uint32_t d = 0;
        for (; d + 8 <= dim; d += 8)
            _mm256_storeu_ps(o + d, v_load8(r + d, dtype));
        for (; d < dim; d++)
            o[d] = kern_sanitize(kern_load(r, dtype, d));
    }
}

KT static void avx_store(const float *y, uint32_t tokens, uint32_t dim, void *dst,
                         uint32_t dtype, uint64_t stride)
{
    for (uint32_t t = 0; t < tokens; t++) {
        uint16_t *r = (uint16_t *)dst + t * stride;
        const float *in = y + (uint64_t)t * dim;
        uint32_t d = 0;
        for (; d + 8 <= dim; d += 8)
            v_store8(r + d, _mm256_loadu_ps(in + d), dtype);
        for (; d < dim; d++)
            kern_store(r, dtype, d, in[d]);
    }
}

KT static void avx_stats(const float *x, uint32_t tokens, uint32_t dim, float *kmin,
                         float *kmax, float *knorm)
{
    float norm = 0.0f;
    memcpy(kmin, x, dim * sizeof(float));
    memcpy(kmax, x, dim * sizeof(float));
    for (uint32_t t = 0; t < tokens; t++) {
        const float *r = x + (uint64_t)t * dim;
        __m256 ss = _mm256_setzero_ps();
        uint32_t d = 0;
        for (; d + 8 <= dim; d += 8) {
            __m256 v = _mm256_loadu_ps(r + d);
            _mm256_storeu_ps(kmin + d, _mm256_min_ps(v, _mm256_loadu_ps(kmin + d)));
            _mm256_storeu_ps(kmax + d, _mm256_max_ps(v, _mm256_loadu_ps(kmax + d)));
            ss = _mm256_add_ps(ss, _mm256_mul_ps(v, v));
        }
        float s = v_hsum(ss);
        for (; d < dim; d++) {
            kmin[d] = r[d] < kmin[d] ? r[d] : kmin[d];
            kmax[d] = r[d] > kmax[d] ? r[d] : kmax[d];
            s += r[d] * r[d];
        }
        norm += sqrtf(s);
    }
    *knorm = norm / (float)tokens;
}

/* ---- ggml groups --------------------------------------------------------------------- */

KT static void q8_0_enc32(const float *x, uint8_t *blk)
{
    const __m256 sm = _mm256_set1_ps(-0.0f);
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sm, v[i]));
    }
    float d = v_hmax(m) / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    kern_put_h(blk, d);
    __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; i++)
        q[i] = _mm256_cvttps_epi32(v_roundf(_mm256_mul_ps(v[i], vid)));
    _mm256_storeu_si256((__m256i *)(blk + 2), v_pack_bytes(q[0], q[1], q[2], q[3], 1));
}

KT static void q8_0_dec32(const uint8_t *blk, float *y)
{
    __m256 vd = _mm256_set1_ps(kern_get_h(blk));
    for (int i = 0; i < 4; i++) {
        __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * i)));
        _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(w), vd));
    }
}

KT static void qx_1_enc32(const float *x, uint8_t *blk, int bits)
{
    __m256 v[4], mn, mx;
    for (int i = 0; i < 4; i++)
        v[i] = _mm256_loadu_ps(x + 8 * i);
    mn = _mm256_min_ps(_mm256_min_ps(v[0], v[1]), _mm256_min_ps(v[2], v[3]));
    mx = _mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3]));
    float fmn = v_hmin(mn), fmx = v_hmax(mx);
    int qmax = (1 << bits) - 1;
    float d = (fmx - fmn) / (float)qmax;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    kern_put_h(blk, d);
    kern_put_h(blk + 2, fmn);
    __m256 vmn = _mm256_set1_ps(fmn), vid = _mm256_set1_ps(id), half = _mm256_set1_ps(0.5f);
    __m256i q[4];
    for (int i = 0; i < 4; i++) {
        __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v[i], vmn), vid), half);
        q[i] = _mm256_min_epi32(_mm256_cvttps_epi32(t), _mm256_set1_epi32(qmax));
    }
    __m256i p = v_pack_bytes(q[0], q[1], q[2], q[3], 0);
    const __m128i lo4 = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(_mm256_castsi256_si128(p), lo4);
    __m128i hi = _mm_and_si128(_mm256_extracti128_si256(p, 1), lo4);
    __m128i qs = _mm_or_si128(lo, _mm_slli_epi16(hi, 4));
    if (bits == 5) {
        uint32_t qh = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(p, 3));
        memcpy(blk + 4, &qh, 4);
        _mm_storeu_si128((__m128i *)(blk + 8), qs);
    } else {
        _mm_storeu_si128((__m128i *)(blk + 4), qs);
    }
}

KT static void qx_1_dec32(const uint8_t *blk, float *y, int bits)
{
    __m256 vd = _mm256_set1_ps(kern_get_h(blk)), vm = _mm256_set1_ps(kern_get_h(blk + 2));
    __m128i qs = _mm_loadu_si128((const __m128i *)(blk + (bits == 5 ? 8 : 4)));
    const __m128i lo4 = _mm_set1_epi8(0x0f);
    __m256i e = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), lo4), _mm_and_si128(qs, lo4));
    if (bits == 5) {
        uint32_t qh;
        memcpy(&qh, blk + 4, 4);
        __m256i b = _mm256_shuffle_epi8(
            _mm256_set1_epi32((int)qh),
            _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2,
                             2, 3, 3, 3, 3, 3, 3, 3, 3));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        b = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
        e = _mm256_or_si256(e, _mm256_and_si256(b, _mm256_set1_epi8(0x10)));
    }
    __m128i e0 = _mm256_castsi256_si128(e), e1 = _mm256_extracti128_si256(e, 1);
    __m128i part[4] = {e0, _mm_srli_si128(e0, 8), e1, _mm_srli_si128(e1, 8)};
    for (int i = 0; i < 4; i++) {
        __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part[i]));
        _mm256_storeu_ps(y + 8 * i, _mm256_add_ps(_mm256_mul_ps(f, vd), vm));
    }
}

/* ---- KIVI ---------------------------------------------------------------------------- */

KT static inline __m256i v_kivi_code(__m256 x, __m256 mnf, __m256 id, float qmax)
{
    __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(x, mnf), id), _mm256_set1_ps(0.5f));
    t = _mm256_round_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    t = _mm256_max_ps(t, _mm256_setzero_ps());
    t = _mm256_min_ps(t, _mm256_set1_ps(qmax));
    return _mm256_cvttps_epi32(t);
}

/* 32 codes (bytes in element order) -> 4 * bits packed bytes. */
KT static inline void v_kivi_pack32(__m256i p, int bits, uint8_t *dst)
{
    if (bits == 4) {
        __m256i w = _mm256_or_si256(_mm256_and_si256(p, _mm256_set1_epi16(0x000f)),
                                    _mm256_and_si256(_mm256_srli_epi16(p, 4),
                                                     _mm256_set1_epi16(0x00f0)));
        w = _mm256_packus_epi16(w, w);
        w = _mm256_permute4x64_epi64(w, 0x08);
        _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(w));
    } else {
        __m256i m3 = _mm256_set1_epi32(3);
        __m256i w = _mm256_and_si256(p, m3);
        w = _mm256_or_si256(w, _mm256_and_si256(_mm256_srli_epi32(p, 6), _mm256_slli_epi32(m3, 2)));
        w = _mm256_or_si256(w, _mm256_and_si256(_mm256_srli_epi32(p, 12), _mm256_slli_epi32(m3, 4)));
        w = _mm256_or_si256(w, _mm256_and_si256(_mm256_srli_epi32(p, 18), _mm256_slli_epi32(m3, 6)));
        v_store8b(dst, w);
    }
}

/* Eight codes of a packed row starting at element e (a multiple of 8) as floats. */
KT static inline __m256 v_kivi_unpack8(const uint8_t *row, uint32_t e, int bits)
{
    __m256i v;
    if (bits == 4) {
        uint32_t w;
        memcpy(&w, row + e / 2, 4);
        v = _mm256_srlv_epi32(_mm256_set1_epi32((int)w),
                              _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
        v = _mm256_and_si256(v, _mm256_set1_epi32(0xf));
    } else {
        uint16_t w;
        memcpy(&w, row + e / 4, 2);
        v = _mm256_srlv_epi32(_mm256_set1_epi32(w), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
        v = _mm256_and_si256(v, _mm256_set1_epi32(3));
    }
    return _mm256_cvtepi32_ps(v);
}

KT static void kivi_v_enc32(const float *x, uint8_t *blk, int bits)
{
    __m256 v[4];
    for (int i = 0; i < 4; i++)
        v[i] = _mm256_loadu_ps(x + 8 * i);
    float mn = v_hmin(_mm256_min_ps(_mm256_min_ps(v[0], v[1]), _mm256_min_ps(v[2], v[3])));
    float mx = v_hmax(_mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3])));
    uint16_t mn_h, sc_h;
    float mnf, id, qmax = (float)((1 << bits) - 1);
    kern_kivi_params(mn, mx, bits, &mn_h, &sc_h, &mnf, &id);
    memcpy(blk, &sc_h, 2);
    memcpy(blk + 2, &mn_h, 2);
    __m256 vm = _mm256_set1_ps(mnf), vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; i++)
        q[i] = v_kivi_code(v[i], vm, vid, qmax);
    v_kivi_pack32(v_pack_bytes(q[0], q[1], q[2], q[3], 0), bits, blk + 4);
}

KT static void kivi_v_dec32(const uint8_t *blk, float *y, int bits)
{
    __m256 sc = _mm256_set1_ps(kern_get_h(blk)), mn = _mm256_set1_ps(kern_get_h(blk + 2));
    for (uint32_t i = 0; i < 4; i++) {
        __m256 f = v_kivi_unpack8(blk + 4, 8 * i, bits);
        _mm256_storeu_ps(y + 8 * i, _mm256_add_ps(_mm256_mul_ps(f, sc), mn));
    }
}

KT static void kivi_k_enc(const float *x, const struct kern_layout *lay, uint32_t h,
                          uint8_t *sect, int bits)
{
    uint32_t dim = lay->head_dim, rb = kern_kivi_row_bytes(dim, bits);
    float mnf_a[KERN_MAX_HEAD_DIM], id_a[KERN_MAX_HEAD_DIM], qmax = (float)((1 << bits) - 1);
    uint8_t *g = sect + (uint64_t)h * kern_kivi_k_head_bytes(dim, lay->tokens, bits);
    for (uint32_t t0 = 0; t0 < lay->tokens; t0 += KERN_GROUP) {
        uint32_t rows = lay->tokens - t0 < KERN_GROUP ? lay->tokens - t0 : KERN_GROUP;
        uint32_t gb = kern_kivi_k_group_bytes(dim, rows, bits);
        const float *xg = x + (uint64_t)t0 * dim;
        uint8_t *codes = g + 4 * dim;
        uint32_t c = 0;
        for (; c + 8 <= dim; c += 8) {
            __m256 mn = _mm256_loadu_ps(xg + c), mx = mn;
            for (uint32_t r = 1; r < rows; r++) {
                __m256 v = _mm256_loadu_ps(xg + (uint64_t)r * dim + c);
                mn = _mm256_min_ps(mn, v);
                mx = _mm256_max_ps(mx, v);
            }
            const int rne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            __m128i mn_h = _mm256_cvtps_ph(mn, rne);
            __m128i sc_h =
                _mm256_cvtps_ph(_mm256_div_ps(_mm256_sub_ps(mx, mn), _mm256_set1_ps(qmax)), rne);
            _mm_storeu_si128((__m128i *)(g + 2 * c), sc_h);
            _mm_storeu_si128((__m128i *)(g + 2 * dim + 2 * c), mn_h);
            __m256 sc = _mm256_cvtph_ps(sc_h);
            __m256 id = _mm256_div_ps(_mm256_set1_ps(1.0f), sc);
            id = _mm256_andnot_ps(_mm256_cmp_ps(sc, _mm256_setzero_ps(), _CMP_EQ_OQ), id);
            _mm256_storeu_ps(mnf_a + c, _mm256_cvtph_ps(mn_h));
            _mm256_storeu_ps(id_a + c, id);
        }
        for (; c < dim; c++) {
            float mn = xg[c], mx = mn;
            for (uint32_t r = 1; r < rows; r++) {
                float v = xg[(uint64_t)r * dim + c];
                mn = v < mn ? v : mn;
                mx = v > mx ? v : mx;
            }
            uint16_t mn_h, sc_h;
            kern_kivi_params(mn, mx, bits, &mn_h, &sc_h, &mnf_a[c], &id_a[c]);
            memcpy(g + 2 * c, &sc_h, 2);
            memcpy(g + 2 * dim + 2 * c, &mn_h, 2);
        }
        memset(codes + (uint64_t)rows * rb, 0, gb - 4 * dim - rows * rb);
        for (uint32_t r = 0; r < rows; r++) {
            const float *xr = xg + (uint64_t)r * dim;
            uint8_t *row = codes + (uint64_t)r * rb;
            c = 0;
            for (; c + 32 <= dim; c += 32) {
                __m256i q[4];
                for (int i = 0; i < 4; i++)
                    q[i] = v_kivi_code(_mm256_loadu_ps(xr + c + 8 * i),
                                       _mm256_loadu_ps(mnf_a + c + 8 * i),
                                       _mm256_loadu_ps(id_a + c + 8 * i), qmax);
                v_kivi_pack32(v_pack_bytes(q[0], q[1], q[2], q[3], 0), bits, row + c * bits / 8);
            }
            if (c < dim)
                memset(row + c * bits / 8, 0, rb - c * bits / 8);
            for (; c < dim; c++) {
                uint32_t q = kern_kivi_code(xr[c], mnf_a[c], id_a[c], bits);
                if (bits == 4)
                    row[c >> 1] = (uint8_t)(row[c >> 1] | (q << ((c & 1) * 4)));
                else
                    row[c >> 2] = (uint8_t)(row[c >> 2] | (q << ((c & 3) * 2)));
            }
        }
        g += gb;
    }
}

KT static void kivi_k_dec(const uint8_t *sect, const struct kern_layout *lay, uint32_t h,
                          float *y, int bits)
{
    uint32_t dim = lay->head_dim, rb = kern_kivi_row_bytes(dim, bits);
    const uint8_t *g = sect + (uint64_t)h * kern_kivi_k_head_bytes(dim, lay->tokens, bits);
    for (uint32_t t0 = 0; t0 < lay->tokens; t0 += KERN_GROUP) {
        uint32_t rows = lay->tokens - t0 < KERN_GROUP ? lay->tokens - t0 : KERN_GROUP;
        for (uint32_t r = 0; r < rows; r++) {
            const uint8_t *row = g + 4 * dim + (uint64_t)r * rb;
            float *yr = y + (uint64_t)(t0 + r) * dim;
            uint32_t c = 0;
            for (; c + 8 <= dim; c += 8) {
                __m256 sc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 2 * c)));
                __m256 mn =
                    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 2 * dim + 2 * c)));
                __m256 f = v_kivi_unpack8(row, c, bits);
                _mm256_storeu_ps(yr + c, _mm256_add_ps(_mm256_mul_ps(f, sc), mn));
            }
            for (; c < dim; c++)
                yr[c] = kern_kivi_val(kern_kivi_get(row, c, bits), kern_get_h(g + 2 * c),
                                      kern_get_h(g + 2 * dim + 2 * c));
        }
        g += kern_kivi_k_group_bytes(dim, rows, bits);
    }
}

/* ---- fp8 ----------------------------------------------------------------------------- */

KT static inline __m256i v_e4m3_enc(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(a, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7ffff)));
    __m256i cn = _mm256_sub_epi32(_mm256_srli_epi32(r, 20), _mm256_set1_epi32(120 << 3));
    cn = _mm256_min_epi32(cn, _mm256_set1_epi32(0x7e));
    __m256 af = _mm256_castsi256_ps(a);
    __m256 s = _mm256_round_ps(_mm256_mul_ps(af, _mm256_set1_ps(512.0f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i cs = _mm256_cvttps_epi32(s);
    __m256i sub = _mm256_castps_si256(_mm256_cmp_ps(af, _mm256_set1_ps(0.015625f), _CMP_LT_OQ));
    return _mm256_or_si256(_mm256_blendv_epi8(cn, cs, sub), sign);
}

KT static void fp8_enc(const float *x, const struct kern_layout *lay, uint32_t h, uint8_t *sect)
{
    uint32_t dim = lay->head_dim, H = lay->heads;
    uint64_t n = (uint64_t)lay->tokens * dim, i = 0;
    const __m256 sm = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8)
        m = _mm256_max_ps(m, _mm256_andnot_ps(sm, _mm256_loadu_ps(x + i)));
    float amax = v_hmax(m);
    for (; i < n; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float scale = kern_fp8_scale(amax);
    memcpy(sect + 4 * h, &scale, 4);
    __m256 vs = _mm256_set1_ps(scale);
    for (uint32_t t = 0; t < lay->tokens; t++) {
        const float *xr = x + (uint64_t)t * dim;
        uint8_t *q = sect + 4 * H + ((uint64_t)t * H + h) * dim;
        uint32_t d = 0;
        for (; d + 8 <= dim; d += 8)
            v_store8b(q + d, v_e4m3_enc(_mm256_div_ps(_mm256_loadu_ps(xr + d), vs)));
        for (; d < dim; d++)
            q[d] = kern_e4m3_enc(xr[d] / scale);
    }
}

KT static void fp8_dec(const uint8_t *sect, const struct kern_layout *lay, uint32_t h, float *y)
{
    uint32_t dim = lay->head_dim, H = lay->heads;
    float scale;
    memcpy(&scale, sect + 4 * h, 4);
    __m256 vs = _mm256_set1_ps(scale), p120 = _mm256_set1_ps(1.329227995784916e36f);
    for (uint32_t t = 0; t < lay->tokens; t++) {
        const uint8_t *q = sect + 4 * H + ((uint64_t)t * H + h) * dim;
        float *yr = y + (uint64_t)t * dim;
        uint32_t d = 0;
        for (; d + 8 <= dim; d += 8) {
            __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + d)));
            __m256i u = _mm256_or_si256(
                _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x7f)), 20),
                _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24));
            __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(u), p120);
            _mm256_storeu_ps(yr + d, _mm256_mul_ps(f, vs));
        }
        for (; d < dim; d++)
            yr[d] = kern_e4m3_dec(q[d]) * scale;
    }
}

/* ---- per-slice dispatch -------------------------------------------------------------- */

static uint32_t block_bytes(uint32_t codec, int bits)
{
    if (bits)
        return kern_kivi_v_group_bytes(bits);
    return codec == KERN_CODEC_Q8_0 ? 34 : codec == KERN_CODEC_Q4_1 ? 20 : 24;
}

static void group_enc(uint32_t codec, int bits, const float *x, int n, uint8_t *blk)
{
    if (bits)
        kern_kivi_v_enc(x, n, blk, bits);
    else if (codec == KERN_CODEC_Q8_0)
        kern_q8_0_enc(x, n, blk);
    else
        kern_qx_1_enc(x, n, blk, codec == KERN_CODEC_Q5_1 ? 5 : 4);
}

static void group_dec(uint32_t codec, int bits, const uint8_t *blk, int n, float *y)
{
    if (bits)
        kern_kivi_v_dec(blk, n, y, bits);
    else if (codec == KERN_CODEC_Q8_0)
        kern_q8_0_dec(blk, n, y);
    else
        kern_qx_1_dec(blk, n, y, codec == KERN_CODEC_Q5_1 ? 5 : 4);
}

KT static void avx_enc(uint32_t codec, int is_v, const float *x, const struct kern_layout *lay,
                       uint32_t h, uint8_t *sect)
{
    uint32_t dim = lay->head_dim, H = lay->heads, G = kern_ngroups(dim), full = dim / 32;
    int bits = kern_codec_bits(codec);
    if (codec == KERN_CODEC_FP8) {
        fp8_enc(x, lay, h, sect);
        return;
    }
    if (bits && !is_v) {
        kivi_k_enc(x, lay, h, sect, bits);
        return;
    }
    uint32_t gb = block_bytes(codec, bits);
    for (uint32_t t = 0; t < lay->tokens; t++) {
        for (uint32_t g = 0; g < full; g++) {
            const float *xg = x + (uint64_t)t * dim + g * 32;
            uint8_t *blk = sect + (((uint64_t)t * H + h) * G + g) * gb;
            if (bits)
                kivi_v_enc32(xg, blk, bits);
            else if (codec == KERN_CODEC_Q8_0)
                q8_0_enc32(xg, blk);
            else
                qx_1_enc32(xg, blk, codec == KERN_CODEC_Q5_1 ? 5 : 4);
        }
        if (full < G) /* the partial last group: the reference's scalar group code */
            group_enc(codec, bits, x + (uint64_t)t * dim + full * 32, (int)(dim - full * 32),
                      sect + (((uint64_t)t * H + h) * G + full) * gb);
    }
}

KT static void avx_dec(uint32_t codec, int is_v, const uint8_t *sect,
                       const struct kern_layout *lay, uint32_t h, float *y)
{
    uint32_t dim = lay->head_dim, H = lay->heads, G = kern_ngroups(dim), full = dim / 32;
    int bits = kern_codec_bits(codec);
    if (codec == KERN_CODEC_FP8) {
        fp8_dec(sect, lay, h, y);
        return;
    }
    if (bits && !is_v) {
        kivi_k_dec(sect, lay, h, y, bits);
        return;
    }
    uint32_t gb = block_bytes(codec, bits);
    for (uint32_t t = 0; t < lay->tokens; t++) {
        for (uint32_t g = 0; g < full; g++) {
            float *yg = y + (uint64_t)t * dim + g * 32;
            const uint8_t *blk = sect + (((uint64_t)t * H + h) * G + g) * gb;
            if (bits)
                kivi_v_dec32(blk, yg, bits);
            else if (codec == KERN_CODEC_Q8_0)
                q8_0_dec32(blk, yg);
            else
                qx_1_dec32(blk, yg, codec == KERN_CODEC_Q5_1 ? 5 : 4);
        }
        if (full < G)
            group_dec(codec, bits, sect + (((uint64_t)t * H + h) * G + full) * gb,
                      (int)(dim - full * 32), y + (uint64_t)t * dim + full * 32);
    }
}

/* Row-wise codecs straight from the raw rows: each 32-value group is converted into a
 * 32-float buffer that stays in L1, instead of a pass through the slice scratch. */
KT static int avx_enc_raw(uint32_t codec, int is_v, const void *raw,
                          const struct kern_layout *lay, uint32_t h, uint8_t *sect)
{
    uint32_t dim = lay->head_dim, H = lay->heads, G = kern_ngroups(dim), full = dim / 32;
    int bits = kern_codec_bits(codec);
    uint64_t stride = (uint64_t)H * dim;
    float x[32];
    if (codec == KERN_CODEC_FP8 || (bits && !is_v))
        return 0;
    uint32_t gb = block_bytes(codec, bits);
    for (uint32_t t = 0; t < lay->tokens; t++) {
        const uint16_t *r = (const uint16_t *)raw + t * stride;
        uint8_t *blk = sect + ((uint64_t)t * H + h) * G * gb;
        for (uint32_t g = 0; g < full; g++, blk += gb) {
            for (int i = 0; i < 4; i++)
                _mm256_storeu_ps(x + 8 * i, v_load8(r + g * 32 + 8 * i, lay->dtype));
            if (bits)
                kivi_v_enc32(x, blk, bits);
            else if (codec == KERN_CODEC_Q8_0)
                q8_0_enc32(x, blk);
            else
                qx_1_enc32(x, blk, codec == KERN_CODEC_Q5_1 ? 5 : 4);
        }
        if (full < G) {
            int n = (int)(dim - full * 32);
            for (int j = 0; j < n; j++)
                x[j] = kern_sanitize(kern_load(r, lay->dtype, full * 32 + (uint32_t)j));
            group_enc(codec, bits, x, n, blk);
        }
    }
    return 1;
}

KT static int avx_dec_raw(uint32_t codec, int is_v, const uint8_t *sect,
                          const struct kern_layout *lay, uint32_t h, void *raw, uint32_t out)
{
    uint32_t dim = lay->head_dim, H = lay->heads, G = kern_ngroups(dim), full = dim / 32;
    int bits = kern_codec_bits(codec);
    uint64_t stride = (uint64_t)H * dim;
    float y[32];
    if (codec == KERN_CODEC_FP8 || (bits && !is_v))
        return 0;
    uint32_t gb = block_bytes(codec, bits);
    for (uint32_t t = 0; t < lay->tokens; t++) {
        uint16_t *r = (uint16_t *)raw + t * stride;
        const uint8_t *blk = sect + ((uint64_t)t * H + h) * G * gb;
        for (uint32_t g = 0; g < full; g++, blk += gb) {
            if (bits)
                kivi_v_dec32(blk, y, bits);
            else if (codec == KERN_CODEC_Q8_0)
                q8_0_dec32(blk, y);
            else
                qx_1_dec32(blk, y, codec == KERN_CODEC_Q5_1 ? 5 : 4);
            for (int i = 0; i < 4; i++)
                v_store8(r + g * 32 + 8 * i, _mm256_loadu_ps(y + 8 * i), out);
        }
        if (full < G) {
            int n = (int)(dim - full * 32);
            group_dec(codec, bits, blk, n, y);
            for (int j = 0; j < n; j++)
                kern_store(r, out, full * 32 + (uint32_t)j, y[j]);
        }
    }
    return 1;
}

static const struct kern_cpu_ops avx2_ops = {
    .load = avx_load,
    .store = avx_store,
    .stats = avx_stats,
    .enc = avx_enc,
    .dec = avx_dec,
    .enc_raw = avx_enc_raw,
    .dec_raw = avx_dec_raw,
};

const struct kern_cpu_ops *kern_avx2_ops(void)
{
    static int have = -1;
    int h = __atomic_load_n(&have, __ATOMIC_RELAXED);
    if (h < 0) { /* idempotent: racing first callers store the same answer */
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
        __atomic_store_n(&have, h, __ATOMIC_RELAXED);
    }
    return h ? &avx2_ops : NULL;
}
