/*
 * kern_avx2_kivi.h — the KIVI family in AVX2: values quantized per token in groups of 32
 * (kivi_v_*), keys per channel over 32-token groups (kivi_k_*), 2 or 4 bits.
 *
 * DESIGN
 * The reference's arithmetic of kern_fmt.h, eight lanes at a time (see kern_avx2.c): codes
 * by a truncating conversion whose bound is argued at v_kivi_code(), packed by saturating
 * byte packs. Keys take eight channels a vector, so a head whose size is not a multiple of
 * eight ends in the reference's scalar code.
 */
#ifndef KVC_KERN_AVX2_KIVI_H
#define KVC_KERN_AVX2_KIVI_H

#include "kernels/kern_avx2.h"
#include "kernels/kern_avx2_ggml.h"

/* kern_kivi_code() without its clamp, which v_kivi_pack32() applies to the bytes: the
 * truncating conversion of t = (x - mnf) * id + 0.5 equals floor(t) for t >= 0 and is 0 for
 * -1 < t < 0, and t stays far inside the int32 range, so clamping the truncation to
 * [0, qmax] (the byte pack saturates negatives to 0, then an unsigned byte min) gives the
 * reference's clamp(floor(t), 0, qmax). The bound: x >= mn and mnf = fp16(mn) is mn itself
 * unless |mn| < 2^-14 (a bf16 input below the fp16 normals), where |mn - mnf| <= 2^-25; id
 * is 0 or 1/scale with scale >= 2^-24 and (mx - mn) / scale <= 1.5 * qmax (fp16 rounding of
 * (mx - mn) / qmax), so -0.5 <= t <= 1.5 * qmax + 1. t is never NaN: x and mnf are finite
 * and 0 <= id <= 2^24. */
KT static inline __m256i v_kivi_code(__m256 x, __m256 mnf, __m256 id)
{
    __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(x, mnf), id), _mm256_set1_ps(0.5f));
    return _mm256_cvttps_epi32(t);
}

/* 32 codes from v_kivi_code() as bytes in element order (v_pack_bytes(), unsigned: negatives
 * already 0) -> clamped to qmax -> 4 * bits packed bytes: multiply-adds merge the neighbours
 * of each pair (and, 2-bit, of each pair of pairs) into one byte. */
KT static inline void v_kivi_pack32(__m256i p, int bits, uint8_t *dst)
{
    p = _mm256_min_epu8(p, _mm256_set1_epi8((char)((1 << bits) - 1)));
    if (bits == 4) {
        __m256i w = _mm256_maddubs_epi16(p, _mm256_set1_epi16(0x1001));
        w = _mm256_packus_epi16(w, w);
        w = _mm256_permute4x64_epi64(w, 0x08);
        _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(w));
    } else {
        __m256i w = _mm256_maddubs_epi16(p, _mm256_set1_epi16(0x0401));
        w = _mm256_madd_epi16(w, _mm256_set1_epi32(0x00100001));
        v_store8b(dst, w);
    }
}

/* Eight codes of a packed row starting at element e (a multiple of 8) as floats. */
KT KERN_AI static inline __m256 v_kivi_unpack8(const uint8_t *row, uint32_t e, int bits)
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

KT static inline void kivi_v_enc32v(const __m256 v[4], uint8_t *blk, int bits)
{
    float mn = v_hmin(_mm256_min_ps(_mm256_min_ps(v[0], v[1]), _mm256_min_ps(v[2], v[3])));
    float mx = v_hmax(_mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3])));
    if (mn == 0.0f || mx == 0.0f) {
        float x[32];
        KERN_UNROLL
        for (int i = 0; i < 4; i++)
            _mm256_storeu_ps(x + 8 * i, v[i]);
        zero_extremes_fix(x, &mn, &mx);
    }
    uint16_t mn_h, sc_h;
    float mnf, id;
    kern_kivi_params(mn, mx, bits, &mn_h, &sc_h, &mnf, &id);
    memcpy(blk, &sc_h, 2);
    memcpy(blk + 2, &mn_h, 2);
    __m256 vm = _mm256_set1_ps(mnf), vid = _mm256_set1_ps(id);
    __m256i q[4];
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        q[i] = v_kivi_code(v[i], vm, vid);
    v_kivi_pack32(v_pack_bytes(q[0], q[1], q[2], q[3], 0), bits, blk + 4);
}

KT KERN_SOME static void kivi_v_enc32(const float *x, uint8_t *blk, int bits)
{
    __m256 v[4];
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        v[i] = _mm256_loadu_ps(x + 8 * i);
    kivi_v_enc32v(v, blk, bits);
}

KT KERN_AI static inline void kivi_v_dec32v(const uint8_t *blk, __m256 y[4], int bits)
{
    __m256 sc, mn;
    v_dm(blk, &sc, &mn);
    KERN_UNROLL
    for (uint32_t i = 0; i < 4; i++) {
        __m256 f = v_kivi_unpack8(blk + 4, 8 * i, bits);
        y[i] = _mm256_add_ps(_mm256_mul_ps(f, sc), mn);
    }
}

KT KERN_SOME static void kivi_v_dec32(const uint8_t *blk, float *y, int bits)
{
    __m256 v[4];
    kivi_v_dec32v(blk, v, bits);
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        _mm256_storeu_ps(y + 8 * i, v[i]);
}

KT KERN_SOME static void kivi_k_enc(const float *x, const struct kern_layout *lay, uint32_t h,
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
                mn = _mm256_min_ps(v, mn); /* the earlier of equal values stays */
                mx = _mm256_max_ps(v, mx);
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
                KERN_UNROLL
                for (int i = 0; i < 4; i++)
                    q[i] = v_kivi_code(_mm256_loadu_ps(xr + c + 8 * i),
                                       _mm256_loadu_ps(mnf_a + c + 8 * i),
                                       _mm256_loadu_ps(id_a + c + 8 * i));
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

KT KERN_SOME static void kivi_k_dec(const uint8_t *sect, const struct kern_layout *lay, uint32_t h,
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

#endif
