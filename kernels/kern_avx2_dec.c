/*
 * kern_avx2_dec.c — the AVX2 decoders of whole sections: straight into the caller's raw rows,
 * front to back, built twice (without and with FMA).
 *
 * DESIGN
 * Called by kern.c through the ops table (dec_sect) on the thread that decodes the block.
 * A group with at most 16 distinct outputs looks them up by vpshufb; KIVI keys make their
 * per-channel tables per 32-token group first; q8_0 outputs of 1 MiB or more are written with
 * streaming stores. The FMA build gives the reference's bits because q * d + m has an exact
 * product (see dec_sect_fma()); kern_avx2_have_fma picks the build.
 */
#include "kernels/kern_avx2.h"
#include "kernels/kern_avx2_fp8.h"
#include "kernels/kern_avx2_ggml.h"
#include "kernels/kern_avx2_kivi.h"

/* ---- decode straight into the raw rows ---------------------------------------------- */

/* A group of 32 values with 2^b codes (b <= 4) has at most 16 distinct outputs: they are
 * computed once per group, with the reference's operations (q * d, then + m, then the
 * rounding to the output dtype), and every value is then a byte-table lookup (vpshufb) of its
 * output's low and high byte. That replaces the per-value widen, convert, multiply, add and
 * rounding by two shuffles and an interleave, and gives the same halves by construction. */

/* The halves of out(q * d + m) for q = 0..15 split into a low-byte and a high-byte table of
 * 16 entries each, repeated in both lanes (vpshufb looks up within a lane). */
KT KERN_AI static inline void v_tab16(__m256 vd, __m256 vm, uint32_t out, __m256i *lo, __m256i *hi)
{
    const __m256 q0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 q1 = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0,
                                           2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    __m128i h0 = v_half8(_mm256_add_ps(_mm256_mul_ps(q0, vd), vm), out);
    __m128i h1 = v_half8(_mm256_add_ps(_mm256_mul_ps(q1, vd), vm), out);
    __m256i x = _mm256_shuffle_epi8(_mm256_set_m128i(h1, h0), split);
    *lo = _mm256_permute4x64_epi64(x, 0x88);
    *hi = _mm256_permute4x64_epi64(x, 0xdd);
}

/* 32 codes (lane 0: elements 0-15, lane 1: elements 16-31; each < 16) through the tables
 * into the 32 halves at r. */
KT KERN_AI static inline void v_lut32(uint16_t *r, __m256i idx, __m256i lo, __m256i hi, int nt)
{
    __m256i l = _mm256_shuffle_epi8(lo, idx), h = _mm256_shuffle_epi8(hi, idx);
    __m256i u0 = _mm256_unpacklo_epi8(l, h), u1 = _mm256_unpackhi_epi8(l, h);
    v_st32(r, _mm256_permute2x128_si256(u0, u1, 0x20), nt);
    v_st32(r + 16, _mm256_permute2x128_si256(u0, u1, 0x31), nt);
}

/* q4_1: element j is the low nibble of qs[j], element j + 16 its high nibble. */
KT KERN_AI static inline void q4_1_dec32_to(const uint8_t *blk, uint16_t *r, uint32_t out, int nt)
{
    __m256 vd, vm;
    __m256i lo, hi;
    v_dm(blk, &vd, &vm);
    v_tab16(vd, vm, out, &lo, &hi);
    __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 4));
    __m256i idx =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(0x0f));
    v_lut32(r, idx, lo, hi, nt);
}

/* KIVI-4 values: byte i holds element 2i (low nibble) and 2i + 1 (high nibble). */
KT KERN_AI static inline void kivi4_v_dec32_to(const uint8_t *blk, uint16_t *r, uint32_t out,
                                               int nt)
{
    __m256 vd, vm;
    __m256i lo, hi;
    v_dm(blk, &vd, &vm);
    v_tab16(vd, vm, out, &lo, &hi);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i c = _mm_loadu_si128((const __m128i *)(blk + 4));
    __m128i e = _mm_and_si128(c, m4), o = _mm_and_si128(_mm_srli_epi16(c, 4), m4);
    v_lut32(r, _mm256_set_m128i(_mm_unpackhi_epi8(e, o), _mm_unpacklo_epi8(e, o)), lo, hi, nt);
}

/* KIVI-2 values: byte i holds elements 4i..4i+3 at bits 0-1, 2-3, 4-5, 6-7. The codes are
 * not shifted down: element 4i + 1 (4i + 3) is looked up as (byte & 0x0c), that is 4 * code,
 * and the table holds output q at entries q and 4q. Bytes and their high nibbles are first
 * interleaved, so one shuffle places each element's byte. */
KT KERN_AI static inline void kivi2_v_dec32_to(const uint8_t *blk, uint16_t *r, uint32_t out,
                                               int nt)
{
    const __m256 q0 = _mm256_setr_ps(0, 1, 2, 3, 0, 0, 0, 0);
    const __m256i tlo = _mm256_setr_epi8(0, 2, 4, 6, 2, 0, 0, 0, 4, 0, 0, 0, 6, 0, 0, 0, 0, 2, 4, 6,
                                         2, 0, 0, 0, 4, 0, 0, 0, 6, 0, 0, 0);
    const __m256i place = _mm256_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9,
                                           9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    const __m256i mask = _mm256_set1_epi16(0x0c03);
    __m256 vd, vm;
    v_dm(blk, &vd, &vm);
    __m128i h = v_half8(_mm256_add_ps(_mm256_mul_ps(q0, vd), vm), out);
    __m256i hh = _mm256_broadcastsi128_si256(h);
    __m256i lo = _mm256_shuffle_epi8(hh, tlo);
    __m256i hi = _mm256_shuffle_epi8(hh, _mm256_add_epi8(tlo, _mm256_set1_epi8(1)));
    __m128i c = _mm_loadl_epi64((const __m128i *)(blk + 4));
    __m128i x = _mm_unpacklo_epi8(c, _mm_srli_epi16(c, 4)); /* b0, b0 >> 4, b1, ... */
    __m256i idx =
        _mm256_and_si256(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(x), place), mask);
    v_lut32(r, idx, lo, hi, nt);
}

/* Two consecutive groups of q4_1 or KIVI-4 values (blk and blk + gb into r and r + 32) share
 * their table work: the 32 outputs of both are rounded by four conversions, and both groups'
 * tables sit in one register, group A in the low lane and group B in the high lane, which is
 * how vpshufb looks up anyway; the codes of A and B are split together. The same operations
 * per value as the one-group form, so the same halves. */
KT KERN_AI static inline void tab16_dec2x32_to(uint32_t codec, const uint8_t *blk, uint32_t gb,
                                               uint16_t *r, uint32_t out, int nt)
{
    const __m256 q0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 q1 = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0,
                                           2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    uint32_t wa, wb;
    memcpy(&wa, blk, 4);
    memcpy(&wb, blk + gb, 4);
    __m128 f =
        _mm_cvtph_ps(_mm_unpacklo_epi32(_mm_cvtsi32_si128((int)wa), _mm_cvtsi32_si128((int)wb)));
    __m256 da = _mm256_broadcastss_ps(f), ma = _mm256_broadcastss_ps(_mm_movehdup_ps(f));
    __m128 fb = _mm_movehl_ps(f, f);
    __m256 db = _mm256_broadcastss_ps(fb), mb = _mm256_broadcastss_ps(_mm_movehdup_ps(fb));
    /* lane 0: group A's outputs, lane 1: group B's; 0-7 in x0, 8-15 in x1 */
    __m256i x0 = _mm256_set_m128i(v_half8(_mm256_add_ps(_mm256_mul_ps(q0, db), mb), out),
                                  v_half8(_mm256_add_ps(_mm256_mul_ps(q0, da), ma), out));
    __m256i x1 = _mm256_set_m128i(v_half8(_mm256_add_ps(_mm256_mul_ps(q1, db), mb), out),
                                  v_half8(_mm256_add_ps(_mm256_mul_ps(q1, da), ma), out));
    x0 = _mm256_shuffle_epi8(x0, split); /* per lane: low bytes of 0-7, high bytes of 0-7 */
    x1 = _mm256_shuffle_epi8(x1, split);
    __m256i lo = _mm256_unpacklo_epi64(x0, x1), hi = _mm256_unpackhi_epi64(x0, x1);
    /* codes: idx[0] holds elements 0-15 of A (lane 0) and of B (lane 1), idx[1] 16-31 */
    __m256i c = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(blk + gb + 4)),
                                 _mm_loadu_si128((const __m128i *)(blk + 4)));
    __m256i idx[2];
    if (codec == KERN_CODEC_Q4_1) { /* element j: low nibble of byte j, j + 16: its high */
        idx[0] = _mm256_and_si256(c, lo4);
        idx[1] = _mm256_and_si256(_mm256_srli_epi16(c, 4), lo4);
    } else { /* KIVI-4: byte i holds elements 2i (low nibble) and 2i + 1 */
        __m256i e = _mm256_and_si256(c, lo4), o = _mm256_and_si256(_mm256_srli_epi16(c, 4), lo4);
        idx[0] = _mm256_unpacklo_epi8(e, o);
        idx[1] = _mm256_unpackhi_epi8(e, o);
    }
    KERN_UNROLL
    for (int k = 0; k < 2; k++) {
        __m256i l = _mm256_shuffle_epi8(lo, idx[k]), h = _mm256_shuffle_epi8(hi, idx[k]);
        __m256i u0 = _mm256_unpacklo_epi8(l, h), u1 = _mm256_unpackhi_epi8(l, h);
        v_st32(r + 16 * k, _mm256_permute2x128_si256(u0, u1, 0x20), nt);
        v_st32(r + 32 + 16 * k, _mm256_permute2x128_si256(u0, u1, 0x31), nt);
    }
}

/* q5_1 has 32 outputs per group, as many as values: computed directly. */
KT KERN_AI static inline void q5_1_dec32_to(const uint8_t *blk, uint16_t *r, uint32_t out, int nt)
{
    __m256 y[4];
    qx_1_dec32v(blk, y, 5);
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        v_st16(r + 8 * i, v_half8(y[i], out), nt);
}

KT KERN_AI static inline void q8_0_dec32_to(const uint8_t *blk, uint16_t *r, uint32_t out, int nt)
{
    __m256 y[4];
    q8_0_dec32v(blk, y);
    KERN_UNROLL
    for (int i = 0; i < 4; i++)
        v_st16(r + 8 * i, v_half8(y[i], out), nt);
}

/* A full group of a row-wise codec into its 32 raw halves. */
KT KERN_AI static inline void dec32_to(uint32_t codec, int bits, const uint8_t *blk, uint16_t *r,
                                       uint32_t out, int nt)
{
    if (bits == 4)
        kivi4_v_dec32_to(blk, r, out, nt);
    else if (bits == 2)
        kivi2_v_dec32_to(blk, r, out, nt);
    else if (codec == KERN_CODEC_Q8_0)
        q8_0_dec32_to(blk, r, out, nt);
    else if (codec == KERN_CODEC_Q5_1)
        q5_1_dec32_to(blk, r, out, nt);
    else
        q4_1_dec32_to(blk, r, out, nt);
}

/* KIVI key section decode, row by row in memory order (the raw rows are written front to
 * back, as the row-wise codecs write them; going down each channel's column instead strides
 * by H * D halves per row, which streams badly). Per group of 32 tokens the channels' tables
 * are made first, in `scratch` (2 * H * D floats): for 2-bit keys each channel's four
 * outputs out(q * scale + min), q = 0..3, as halves, so a row's 16 channels are picked from
 * them by two blends on the code bits; for 4-bit keys each channel's scale and min as floats,
 * and each eight codes of a row come out of one 32-bit word by a shift per lane, are
 * converted, multiplied and added (fused in the FMA build). */
KT __attribute__((always_inline)) static inline void kivi_k_dec_sect(int bits, uint32_t out, int nt,
                                                                     const uint8_t *sect,
                                                                     const struct kern_layout *lay,
                                                                     void *raw, float *scratch)
{
    uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens;
    uint32_t rb = kern_kivi_row_bytes(D, bits);
    uint64_t hb = kern_kivi_k_head_bytes(D, T, bits), HD = (uint64_t)H * D;
    uint32_t fgb = kern_kivi_k_group_bytes(D, KERN_GROUP, bits);
    uint16_t *tab = (uint16_t *)scratch;       /* 2-bit: [H * D / 16][4][16] halves */
    float *scf = scratch, *mnf = scratch + HD; /* 4-bit: [H * D] each */
    /* channel j of 16 reads bits 2j, 2j + 1 of a 32-bit code word: each 16-bit lane gets
     * the half word that holds them */
    const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2,
                                            3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    const __m256i b0 = _mm256_setr_epi16(1, 4, 16, 64, 256, 1024, 4096, 16384, 1, 4, 16, 64, 256,
                                         1024, 4096, 16384);
    const __m256i b1 = _mm256_add_epi16(b0, b0);
    for (uint32_t t0 = 0; t0 < T; t0 += KERN_GROUP) {
        uint32_t rows = T - t0 < KERN_GROUP ? T - t0 : KERN_GROUP;
        for (uint32_t h = 0; h < H; h++) {
            const uint8_t *g = sect + h * hb + (uint64_t)(t0 / KERN_GROUP) * fgb;
            for (uint32_t c = 0; c < D; c += 16) {
                __m256 sc[2], mn[2];
                KERN_UNROLL
                for (int i = 0; i < 2; i++) {
                    sc[i] =
                        _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 2 * (c + 8 * i))));
                    mn[i] = _mm256_cvtph_ps(
                        _mm_loadu_si128((const __m128i *)(g + 2 * D + 2 * (c + 8 * i))));
                }
                uint64_t ch = (uint64_t)h * D + c;
                if (bits == 4) {
                    KERN_UNROLL
                    for (int i = 0; i < 2; i++) {
                        _mm256_storeu_ps(scf + ch + 8 * i, sc[i]);
                        _mm256_storeu_ps(mnf + ch + 8 * i, mn[i]);
                    }
                    continue;
                }
                KERN_UNROLL
                for (int q = 0; q < 4; q++) {
                    __m256 fq = _mm256_set1_ps((float)q);
                    __m128i t0h = v_half8(_mm256_add_ps(_mm256_mul_ps(fq, sc[0]), mn[0]), out);
                    __m128i t1h = v_half8(_mm256_add_ps(_mm256_mul_ps(fq, sc[1]), mn[1]), out);
                    _mm256_storeu_si256((__m256i *)(tab + 4 * ch + 16 * q),
                                        _mm256_set_m128i(t1h, t0h));
                }
            }
        }
        uint16_t *r = (uint16_t *)raw + (uint64_t)t0 * HD;
        for (uint32_t t = 0; t < rows; t++) {
            for (uint32_t h = 0; h < H; h++, r += D) {
                const uint8_t *row =
                    sect + h * hb + (uint64_t)(t0 / KERN_GROUP) * fgb + 4 * D + (uint64_t)t * rb;
                if (bits == 2) {
                    const uint16_t *tb = tab + 4 * (uint64_t)h * D;
                    for (uint32_t c = 0; c < D; c += 16, tb += 64) {
                        uint32_t w;
                        memcpy(&w, row + c / 4, 4);
                        __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)w), spread);
                        __m256i m0 = _mm256_cmpeq_epi16(_mm256_and_si256(v, b0), b0);
                        __m256i m1 = _mm256_cmpeq_epi16(_mm256_and_si256(v, b1), b1);
                        __m256i lo =
                            _mm256_blendv_epi8(_mm256_loadu_si256((const __m256i *)tb),
                                               _mm256_loadu_si256((const __m256i *)(tb + 16)), m0);
                        __m256i hi =
                            _mm256_blendv_epi8(_mm256_loadu_si256((const __m256i *)(tb + 32)),
                                               _mm256_loadu_si256((const __m256i *)(tb + 48)), m0);
                        v_st32(r + c, _mm256_blendv_epi8(lo, hi, m1), nt);
                    }
                    continue;
                }
                const float *sp = scf + (uint64_t)h * D, *mp = mnf + (uint64_t)h * D;
                for (uint32_t c = 0; c < D; c += 32) {
                    KERN_UNROLL
                    for (int i = 0; i < 4; i++) {
                        /* eight codes from one 32-bit word, by a variable shift per lane */
                        __m256 f = v_kivi_unpack8(row, c + 8 * i, 4);
                        f = _mm256_add_ps(_mm256_mul_ps(f, _mm256_loadu_ps(sp + c + 8 * i)),
                                          _mm256_loadu_ps(mp + c + 8 * i));
                        v_st16(r + c + 8 * i, v_half8(f, out), nt);
                    }
                }
            }
        }
    }
}

/* fp8 section decode. A code's bits placed at 20-26 (sign at 31) are the float e4m3(code) *
 * 2^-120 exactly, so e4m3(code) * scale is that float times scale * 2^120 (one rounding of
 * the same real product), as long as scale * 2^120 is finite: the encoder's scales are at
 * most 65504 / 448; a head whose scale is larger (not written by an encoder) takes the
 * reference's two multiplications. Sixteen codes are placed into the top bytes of two vectors
 * by one shuffle each, then shifted down arithmetically (the sign lands on bit 31). */
KT __attribute__((always_inline)) static inline void
fp8_dec_sect(const uint8_t *sect, const struct kern_layout *lay, void *raw, uint32_t out, int nt)
{
    uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens;
    const __m256 p120 = _mm256_set1_ps(1.329227995784916e36f);
    const __m256i top0 =
        _mm256_setr_epi8(-1, -1, -1, 0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1, 4,
                         -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7);
    const __m256i top1 = _mm256_add_epi8(top0, _mm256_set1_epi32(0x08000000));
    const __m256i bits = _mm256_set1_epi32((int)0x87f00000u);
    const uint8_t *q = sect + 4 * H;
    uint16_t *r = raw;
    for (uint32_t t = 0; t < T; t++) {
        for (uint32_t h = 0; h < H; h++, r += D, q += D) {
            float scale;
            memcpy(&scale, sect + 4 * h, 4);
            if (fabsf(scale) >= 256.0f && fabsf(scale) <= 3.402823466e38f) {
                __m256 vs = _mm256_set1_ps(scale);
                for (uint32_t c = 0; c < D; c += 8) {
                    __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + c)));
                    __m256i u = _mm256_or_si256(
                        _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x7f)), 20),
                        _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x80)), 24));
                    __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(u), p120);
                    v_st16(r + c, v_half8(_mm256_mul_ps(f, vs), out), nt);
                }
                continue;
            }
            __m256 vs = _mm256_mul_ps(_mm256_set1_ps(scale), p120);
            for (uint32_t c = 0; c < D; c += 16) {
                __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q + c)));
                __m256i u0 =
                    _mm256_and_si256(_mm256_srai_epi32(_mm256_shuffle_epi8(b, top0), 4), bits);
                __m256i u1 =
                    _mm256_and_si256(_mm256_srai_epi32(_mm256_shuffle_epi8(b, top1), 4), bits);
                __m128i h0 = v_half8(_mm256_mul_ps(_mm256_castsi256_ps(u0), vs), out);
                __m128i h1 = v_half8(_mm256_mul_ps(_mm256_castsi256_ps(u1), vs), out);
                v_st32(r + c, _mm256_set_m128i(h1, h0), nt);
            }
        }
    }
}

/* One section, stores ordinary or non-temporal (nt constant after inlining). */
KT __attribute__((always_inline)) static inline void
dec_sect_nt(uint32_t codec, int bits, int is_v, const uint8_t *sect, const struct kern_layout *lay,
            void *raw, uint32_t out, float *scratch, int nt)
{
    uint32_t D = lay->head_dim, H = lay->heads, T = lay->tokens, G = D / 32;
    uint16_t *r = raw;
    if (codec == KERN_CODEC_FP8) {
        if (out == KERN_DTYPE_BF16)
            fp8_dec_sect(sect, lay, raw, KERN_DTYPE_BF16, nt);
        else
            fp8_dec_sect(sect, lay, raw, KERN_DTYPE_FP16, nt);
        return;
    }
    if (bits && !is_v) {
        if (bits == 4 && out == KERN_DTYPE_BF16)
            kivi_k_dec_sect(4, KERN_DTYPE_BF16, nt, sect, lay, raw, scratch);
        else if (bits == 4)
            kivi_k_dec_sect(4, KERN_DTYPE_FP16, nt, sect, lay, raw, scratch);
        else if (out == KERN_DTYPE_BF16)
            kivi_k_dec_sect(2, KERN_DTYPE_BF16, nt, sect, lay, raw, scratch);
        else
            kivi_k_dec_sect(2, KERN_DTYPE_FP16, nt, sect, lay, raw, scratch);
        return;
    }
    uint32_t gb = block_bytes(codec, bits);
    const uint8_t *blk = sect;
    uint64_t n = (uint64_t)T * H * G;
    /* one loop per (codec, output dtype), each group straight into its raw halves */
#define DEC_LOOP(C, B, OUT)                                                                        \
    do {                                                                                           \
        uint64_t i = 0;                                                                            \
        if ((C) == KERN_CODEC_Q4_1 || (B) == 4) /* two groups per table pass */                    \
            for (; i + 2 <= n; i += 2, blk += 2 * gb, r += 64)                                     \
                tab16_dec2x32_to(C, blk, gb, r, OUT, nt);                                          \
        for (; i < n; i++, blk += gb, r += 32)                                                     \
            dec32_to(C, B, blk, r, OUT, nt);                                                       \
    } while (0)
#define DEC_OUT(C, B)                                                                              \
    do {                                                                                           \
        if (out == KERN_DTYPE_BF16)                                                                \
            DEC_LOOP(C, B, KERN_DTYPE_BF16);                                                       \
        else                                                                                       \
            DEC_LOOP(C, B, KERN_DTYPE_FP16);                                                       \
    } while (0)
    if (bits == 4)
        DEC_OUT(KERN_CODEC_KIVI4, 4);
    else if (bits == 2)
        DEC_OUT(KERN_CODEC_KIVI2, 2);
    else if (codec == KERN_CODEC_Q8_0)
        DEC_OUT(KERN_CODEC_Q8_0, 0);
    else if (codec == KERN_CODEC_Q5_1)
        DEC_OUT(KERN_CODEC_Q5_1, 0);
    else
        DEC_OUT(KERN_CODEC_Q4_1, 0);
#undef DEC_OUT
#undef DEC_LOOP
}

/* The section decoders without FMA, for CPUs without it (and the tests, kern_avx2_fma()). */
KT __attribute__((noinline)) static void dec_sect_plain(uint32_t codec, int bits, int is_v,
                                                        const uint8_t *sect,
                                                        const struct kern_layout *lay, void *raw,
                                                        uint32_t out, float *scratch, int nt)
{
    if (nt) /* q8_0 only: see KERN_NT_MIN_BYTES */
        dec_sect_nt(KERN_CODEC_Q8_0, 0, is_v, sect, lay, raw, out, scratch, 1);
    else
        dec_sect_nt(codec, bits, is_v, sect, lay, raw, out, scratch, 0);
}

/* The same decoders built with FMA, so the compiler fuses each q * d + m (q * scale + min)
 * into one instruction: the product is exact in fp32 (q < 2^5 times an fp16 value), so the
 * fused form rounds once where the reference rounds once too, and the results are the same
 * bits, Inf and NaN scalars included, except which NaN comes out where two meet (a NaN
 * scalar and a NaN product, e.g. 0 * Inf + NaN): x86 returns one operand's NaN by its
 * position in the instruction, which the compiler chooses in either build. Only decode has
 * FMA: every multiply and add of the encoders must round twice, as the reference's. */
KTF __attribute__((noinline)) static void dec_sect_fma(uint32_t codec, int bits, int is_v,
                                                       const uint8_t *sect,
                                                       const struct kern_layout *lay, void *raw,
                                                       uint32_t out, float *scratch, int nt)
{
    if (nt) /* q8_0 only: see KERN_NT_MIN_BYTES */
        dec_sect_nt(KERN_CODEC_Q8_0, 0, is_v, sect, lay, raw, out, scratch, 1);
    else
        dec_sect_nt(codec, bits, is_v, sect, lay, raw, out, scratch, 0);
}

/* Whether the decoders use their FMA build: set with `have` in kern_avx2_ops() (the CPU has
 * FMA), cleared and restored by the tests through kern_avx2_fma(). */
int kern_avx2_have_fma, kern_avx2_cpu_fma;

KT int kern_avx2_dec_sect(uint32_t codec, int is_v, const uint8_t *sect,
                          const struct kern_layout *lay, void *raw, uint32_t out, float *scratch)
{
    int bits = kern_codec_bits(codec);
    if (lay->head_dim % 32)
        return 0;
    /* a section starts 64-byte aligned relative to the block (D % 32 == 0), so every store
     * is 16-byte aligned when the section is */
    /* KIVI and q8_0 sections with AVX-512, where the CPU has it (kern_kivi512.c, kern_q8512.c) */
    if (bits && kern_rot512_on() && kern_kivi512_dec(bits, is_v, sect, lay, raw, out, scratch))
        return 1;
    if (codec == KERN_CODEC_Q8_0 && kern_rot512_on() && kern_q8512_dec(sect, lay, raw, out))
        return 1;
    int nt = codec == KERN_CODEC_Q8_0 && kern_raw_size(lay) >= KERN_NT_MIN_BYTES &&
             ((uintptr_t)raw & 15) == 0;
    if (__atomic_load_n(&kern_avx2_have_fma, __ATOMIC_RELAXED))
        dec_sect_fma(codec, bits, is_v, sect, lay, raw, out, scratch, nt);
    else
        dec_sect_plain(codec, bits, is_v, sect, lay, raw, out, scratch, nt);
    if (nt)
        _mm_sfence(); /* the streamed lines are ordered before whatever the caller does next */
    return 1;
}

int kern_avx2_fma(int on)
{
    (void)kern_avx2_ops();
    int was = __atomic_load_n(&kern_avx2_have_fma, __ATOMIC_RELAXED);
    __atomic_store_n(&kern_avx2_have_fma,
                     on && __atomic_load_n(&kern_avx2_cpu_fma, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    return was;
}
