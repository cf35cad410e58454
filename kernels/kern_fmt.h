/*
 * kern_fmt.h — the encoded block format and the per-group codec arithmetic, shared by the
 * C reference, the AVX2 version and the CUDA twin (internal to kernels/).
 *
 * DESIGN
 * Bit-identical results across CPU and GPU come from running the same arithmetic: every
 * function here compiles as C on the host and as __host__ __device__ C++ under nvcc. The
 * float operations go through KERN_MUL/ADD/SUB/DIV, which are correctly rounded single
 * operations on the device (__fmul_rn and friends cannot be fused into an FMA) and plain
 * operators on the host, where the reference is built without FMA. Where the format
 * defines a product and a sum as one fused operation (LOWRANK's decode, kern_ext.h), it is
 * KERN_FMA(a, b, c) = a * b + c rounded once: __fmaf_rn on the device, C99's fmaf on the
 * host, correctly rounded whatever the flags (the FMA instruction where the target has it,
 * else libm's, which glibc computes exactly in software). fp16 and bf16 conversions round to
 * nearest even exactly as F16C's vcvtps2ph does.
 */
#ifndef KVC_KERN_FMT_H
#define KVC_KERN_FMT_H

#include <stdint.h>
#include <math.h>
#include <string.h>

#include "kernels/kern.h"

#ifdef __CUDACC__
#define KERN_HD static __host__ __device__ __forceinline__
#else
#define KERN_HD static inline
#endif

#if defined(__CUDA_ARCH__)
#define KERN_MUL(a, b) __fmul_rn((a), (b))
#define KERN_ADD(a, b) __fadd_rn((a), (b))
#define KERN_SUB(a, b) __fsub_rn((a), (b))
#define KERN_DIV(a, b) __fdiv_rn((a), (b))
#define KERN_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#else
#define KERN_MUL(a, b) ((a) * (b))
#define KERN_ADD(a, b) ((a) + (b))
#define KERN_SUB(a, b) ((a) - (b))
#define KERN_DIV(a, b) ((a) / (b))
#define KERN_FMA(a, b, c) fmaf((a), (b), (c))
#endif

#define KERN_GROUP 32         /* values per ggml / KIVI-V group, tokens per KIVI-K group */
#define KERN_FP16_MAX 65504.0f
#define KERN_FP8_MAX 448.0f
#define KERN_ALIGN 16u

/* ---- scalar conversions ------------------------------------------------------------ */

KERN_HD uint32_t kern_f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

KERN_HD float kern_u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

KERN_HD float kern_h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    if (e == 0x1f)
        return kern_u2f(sign | 0x7f800000u | (m << 13));
    if (e != 0)
        return kern_u2f(sign | ((e + 112) << 23) | (m << 13));
    /* subnormal: m * 2^-24, exact in fp32 */
    return kern_u2f(sign) + (sign ? -1.0f : 1.0f) * (float)m * (1.0f / 16777216.0f);
}

KERN_HD uint16_t kern_f2h(float f)
{
    uint32_t x = kern_f2u(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: quieted, payload truncated, as F16C */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520 rounds past the largest half */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* normal half: round the mantissa to 10 bits, rebias */
        uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    uint32_t e = ax >> 23;
    if (e < 102) /* below half the smallest subnormal: rounds to zero */
        return (uint16_t)sign;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* value in units of 2^-24 is m >> shift */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

KERN_HD float kern_bf2f(uint16_t b)
{
    return kern_u2f((uint32_t)b << 16);
}

KERN_HD uint16_t kern_f2bf(float f)
{
    uint32_t x = kern_f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* The value a lossy codec sees: NaN -> 0, clamped to the fp16 range. */
KERN_HD float kern_sanitize(float x)
{
    if (x != x)
        return 0.0f;
    if (x > KERN_FP16_MAX)
        return KERN_FP16_MAX;
    if (x < -KERN_FP16_MAX)
        return -KERN_FP16_MAX;
    return x;
}

/* Element i of a raw fp16/bf16 array, as float (not sanitised). */
KERN_HD float kern_load(const void *p, uint32_t dtype, uint64_t i)
{
    uint16_t v;
    memcpy(&v, (const uint8_t *)p + 2 * i, 2);
    return dtype == KERN_DTYPE_BF16 ? kern_bf2f(v) : kern_h2f(v);
}

KERN_HD void kern_store(void *p, uint32_t dtype, uint64_t i, float x)
{
    uint16_t v = dtype == KERN_DTYPE_BF16 ? kern_f2bf(x) : kern_f2h(x);
    memcpy((uint8_t *)p + 2 * i, &v, 2);
}

KERN_HD void kern_put_h(uint8_t *p, float x)
{
    uint16_t h = kern_f2h(x);
    memcpy(p, &h, 2);
}

KERN_HD float kern_get_h(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kern_h2f(h);
}

/* ---- fp8 E4M3 (e4m3fn: no infinities, 0x7f NaN, max 448) ---------------------------- */

/* x finite; |x| >= 448 saturates to +-448. */
KERN_HD uint8_t kern_e4m3_enc(float x)
{
    uint32_t u = kern_f2u(x);
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t a = u & 0x7fffffffu;
    uint32_t code;
    if (a >= 0x43e00000u) { /* 448 */
        code = 0x7e;
    } else if (a < 0x3c800000u) { /* below 2^-6: subnormal steps of 2^-9, exact product */
        code = (uint32_t)rintf(kern_u2f(a) * 512.0f);
    } else {
        uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
        code = (r >> 20) - (120u << 3);
        if (code > 0x7e)
            code = 0x7e;
    }
    return (uint8_t)(sign | code);
}

/* Exact: the code's bits placed into an fp32 and scaled by 2^(127-7). */
KERN_HD float kern_e4m3_dec(uint8_t c)
{
    uint32_t u = ((uint32_t)(c & 0x7fu) << 20) | ((uint32_t)(c & 0x80u) << 24);
    return kern_u2f(u) * 1.329227995784916e36f; /* 2^120 */
}

KERN_HD float kern_fp8_scale(float amax)
{
    return amax > 0.0f ? KERN_DIV(amax, KERN_FP8_MAX) : 1.0f;
}

/* ---- ggml groups: x[0..n) sanitised floats, n <= 32 -------------------------------- */

#define KERN_FP32_MIN_NORMAL 1.17549435e-38f

/* The reciprocal a ggml group's codes are computed with: 1 / d, or 0 where d (>= 0) is 0 or
 * an fp32 subnormal (bf16 groups whose values all lie below ~1.5e-36). Such a d is stored as
 * fp16 0, so the group decodes to its min (q4_1, q5_1) or to zeros (q8_0) whatever the codes;
 * the codes are then 0, as a reciprocal of a subnormal d could be infinite, and converting an
 * infinite or NaN product to an integer is undefined (the CPU kept the low byte of INT_MIN,
 * the device saturates). */
KERN_HD float kern_ggml_inv(float d)
{
    return d >= KERN_FP32_MIN_NORMAL ? KERN_DIV(1.0f, d) : 0.0f;
}

KERN_HD void kern_q8_0_enc(const float *x, int n, uint8_t *blk)
{
    float amax = 0.0f;
    for (int j = 0; j < n; j++) {
        float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    float d = KERN_DIV(amax, 127.0f);
    float id = kern_ggml_inv(d);
    kern_put_h(blk, d);
    for (int j = 0; j < KERN_GROUP; j++)
        blk[2 + j] = j < n ? (uint8_t)(int8_t)roundf(KERN_MUL(x[j], id)) : 0;
}

KERN_HD void kern_q8_0_dec(const uint8_t *blk, int n, float *y)
{
    float d = kern_get_h(blk);
    for (int j = 0; j < n; j++)
        y[j] = KERN_MUL((float)(int8_t)blk[2 + j], d);
}

/* q4_1 (bits 4, 20-byte block) and q5_1 (bits 5, 24-byte block) share their arithmetic. */
KERN_HD void kern_qx_1_enc(const float *x, int n, uint8_t *blk, int bits)
{
    float mn = 3.402823466e38f, mx = -3.402823466e38f;
    for (int j = 0; j < n; j++) {
        mn = x[j] < mn ? x[j] : mn;
        mx = x[j] > mx ? x[j] : mx;
    }
    int qmax = (1 << bits) - 1;
    float d = KERN_DIV(KERN_SUB(mx, mn), (float)qmax);
    float id = kern_ggml_inv(d);
    uint8_t *qs = blk + (bits == 5 ? 8 : 4);
    uint32_t qh = 0;
    kern_put_h(blk, d);
    kern_put_h(blk + 2, mn);
    for (int j = 0; j < KERN_GROUP / 2; j++) {
        uint32_t q[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            int e = j + k * KERN_GROUP / 2;
            if (e < n) {
                int v = (int)KERN_ADD(KERN_MUL(KERN_SUB(x[e], mn), id), 0.5f);
                q[k] = (uint32_t)(v < qmax ? v : qmax);
            }
            qh |= ((q[k] >> 4) & 1u) << e;
        }
        qs[j] = (uint8_t)((q[0] & 0xfu) | ((q[1] & 0xfu) << 4));
    }
    if (bits == 5)
        memcpy(blk + 4, &qh, 4);
}

KERN_HD void kern_qx_1_dec(const uint8_t *blk, int n, float *y, int bits)
{
    float d = kern_get_h(blk), m = kern_get_h(blk + 2);
    const uint8_t *qs = blk + (bits == 5 ? 8 : 4);
    uint32_t qh = 0;
    if (bits == 5)
        memcpy(&qh, blk + 4, 4);
    for (int e = 0; e < n; e++) {
        int j = e & 15;
        uint32_t q = e < 16 ? (qs[j] & 0xfu) : (qs[j] >> 4);
        q |= ((qh >> e) & 1u) << 4;
        y[e] = KERN_ADD(KERN_MUL((float)q, d), m);
    }
}

/* ---- KIVI ---------------------------------------------------------------------------- */

/* Stored (fp16) min and scale of a range, and the reciprocal used to quantize. */
KERN_HD void kern_kivi_params(float mn, float mx, int bits, uint16_t *mn_h, uint16_t *sc_h,
                              float *mnf, float *id)
{
    float qmax = (float)((1 << bits) - 1);
    *mn_h = kern_f2h(mn);
    *sc_h = kern_f2h(KERN_DIV(KERN_SUB(mx, mn), qmax));
    *mnf = kern_h2f(*mn_h);
    float sc = kern_h2f(*sc_h);
    *id = sc != 0.0f ? KERN_DIV(1.0f, sc) : 0.0f;
}

KERN_HD uint32_t kern_kivi_code(float x, float mnf, float id, int bits)
{
    float t = floorf(KERN_ADD(KERN_MUL(KERN_SUB(x, mnf), id), 0.5f));
    float qmax = (float)((1 << bits) - 1);
    t = t > 0.0f ? t : 0.0f;
    t = t < qmax ? t : qmax;
    return (uint32_t)t;
}

KERN_HD float kern_kivi_val(uint32_t q, float sc, float mnf)
{
    return KERN_ADD(KERN_MUL((float)q, sc), mnf);
}

/* Code of element e in a packed row. */
KERN_HD uint32_t kern_kivi_get(const uint8_t *row, uint32_t e, int bits)
{
    if (bits == 4)
        return (row[e >> 1] >> ((e & 1u) * 4)) & 0xfu;
    return (row[e >> 2] >> ((e & 3u) * 2)) & 0x3u;
}

KERN_HD uint32_t kern_kivi_row_bytes(uint32_t dim, int bits)
{
    return (dim * (uint32_t)bits + 7) / 8;
}

/* V group: fp16 scale, fp16 min, 4 * bits bytes of codes. */
KERN_HD uint32_t kern_kivi_v_group_bytes(int bits)
{
    return 4 + 4 * (uint32_t)bits;
}

KERN_HD void kern_kivi_v_enc(const float *x, int n, uint8_t *blk, int bits)
{
    float mn = 3.402823466e38f, mx = -3.402823466e38f;
    for (int j = 0; j < n; j++) {
        mn = x[j] < mn ? x[j] : mn;
        mx = x[j] > mx ? x[j] : mx;
    }
    uint16_t mn_h, sc_h;
    float mnf, id;
    kern_kivi_params(mn, mx, bits, &mn_h, &sc_h, &mnf, &id);
    memcpy(blk, &sc_h, 2);
    memcpy(blk + 2, &mn_h, 2);
    uint8_t *q = blk + 4;
    memset(q, 0, 4 * (size_t)bits);
    for (int j = 0; j < n; j++) {
        uint32_t c = kern_kivi_code(x[j], mnf, id, bits);
        if (bits == 4)
            q[j >> 1] = (uint8_t)(q[j >> 1] | (c << ((j & 1) * 4)));
        else
            q[j >> 2] = (uint8_t)(q[j >> 2] | (c << ((j & 3) * 2)));
    }
}

KERN_HD void kern_kivi_v_dec(const uint8_t *blk, int n, float *y, int bits)
{
    float sc = kern_get_h(blk), mnf = kern_get_h(blk + 2);
    for (int j = 0; j < n; j++)
        y[j] = kern_kivi_val(kern_kivi_get(blk + 4, (uint32_t)j, bits), sc, mnf);
}

/* K group g of a head: scale[D], min[D], then `rows` packed rows; padded to 4 bytes. */
KERN_HD uint32_t kern_kivi_k_group_bytes(uint32_t dim, uint32_t rows, int bits)
{
    uint32_t b = 4 * dim + rows * kern_kivi_row_bytes(dim, bits);
    return (b + 3) & ~3u;
}

KERN_HD uint32_t kern_kivi_k_head_bytes(uint32_t dim, uint32_t tokens, int bits)
{
    uint32_t full = tokens / KERN_GROUP, rest = tokens % KERN_GROUP;
    uint32_t b = full * kern_kivi_k_group_bytes(dim, KERN_GROUP, bits);
    if (rest)
        b += kern_kivi_k_group_bytes(dim, rest, bits);
    return b;
}

KERN_HD int kern_codec_bits(uint32_t codec)
{
    return codec == KERN_CODEC_KIVI2 ? 2 : codec == KERN_CODEC_KIVI4 ? 4 : 0;
}

/* ---- the transform codecs' shapes (their arithmetic: kern_ext.h) ----------------------- */

#define KERN_ROT_PREFIX 16    /* ROT K section: u32 seed, 12 bytes 0, then [T][H][G] KIVI groups */
#define KERN_ROT_MAX_DIM 256  /* the rotated rows of a unit (KERN_ROT_ROWS) fit its shared memory */
#define KERN_ROT_ROWS 32      /* (token, head) rows per unit of the CUDA encoder */
#define KERN_LOWRANK_MAX_N 64 /* min(tokens, head_dim): the Gram matrix fits the same */

KERN_HD int kern_rot_bits(uint32_t codec)
{
    return codec == KERN_CODEC_ROT2 ? 2 : codec == KERN_CODEC_ROT4 ? 4 : 0;
}

KERN_HD int kern_rot_dim_ok(uint32_t dim)
{
    return dim >= 8 && dim <= KERN_ROT_MAX_DIM && (dim & (dim - 1)) == 0;
}

/* ROT K: the per-channel means of each head over the block's tokens, fp16 [H][D], padded to
 * 16 bytes; the [T][H][G] groups follow. */
KERN_HD uint64_t kern_rot_mean_bytes(uint32_t heads, uint32_t dim)
{
    return (2ull * heads * dim + 15) & ~15ull;
}

/* The codec whose layout a section of `codec` has where a transform codec stores it plainly:
 * ROT values are KIVI values, LOWRANK values q8_0; every other section is its own codec. */
KERN_HD uint32_t kern_codec_as(uint32_t codec, int is_v)
{
    if (is_v && codec == KERN_CODEC_ROT2)
        return KERN_CODEC_KIVI2;
    if (is_v && codec == KERN_CODEC_ROT4)
        return KERN_CODEC_KIVI4;
    if (is_v && codec == KERN_CODEC_LOWRANK)
        return KERN_CODEC_Q8_0;
    return codec;
}

/* A section whose bytes the transform codecs' own code writes and reads (ROT keys, MERGE,
 * LOWRANK keys); the others take the plain codecs' paths under kern_codec_as(). */
KERN_HD int kern_codec_ext(uint32_t codec, int is_v)
{
    uint32_t c = kern_codec_as(codec, is_v);
    return c == KERN_CODEC_ROT2 || c == KERN_CODEC_ROT4 || c == KERN_CODEC_MERGE ||
           c == KERN_CODEC_LOWRANK;
}

/* MERGE: per head 16 bytes (u32 rows used, 12 bytes 0), the run-start bitmap (bit t of
 * word t / 32: token t starts a stored row), then ceil(T / 2) rows of D values of the
 * block's dtype; the head padded to 16 bytes. */
KERN_HD uint32_t kern_merge_rows(uint32_t tokens)
{
    return (tokens + 1) / 2;
}

KERN_HD uint32_t kern_merge_map_bytes(uint32_t tokens)
{
    return 4 * ((tokens + 31) / 32);
}

KERN_HD uint64_t kern_merge_head_bytes(uint32_t dim, uint32_t tokens)
{
    uint64_t b = 16 + kern_merge_map_bytes(tokens) + 2ull * kern_merge_rows(tokens) * dim;
    return (b + 15) & ~15ull;
}

/* LOWRANK keys: per head 16 bytes (u32 rank r, 12 bytes 0), fp32 sigma[R], fp16 u[T][R],
 * fp16 w[R][D], padded to 16 bytes; R = ceil(min(T, D) / 4) the rank it has room for. */
KERN_HD uint32_t kern_lowrank_cap(uint32_t dim, uint32_t tokens)
{
    uint32_t n = tokens < dim ? tokens : dim;
    return (n + 3) / 4;
}

KERN_HD uint64_t kern_lowrank_head_bytes(uint32_t dim, uint32_t tokens)
{
    uint64_t r = kern_lowrank_cap(dim, tokens);
    uint64_t b = 16 + 4 * r + 2 * r * ((uint64_t)tokens + dim);
    return (b + 15) & ~15ull;
}

/* ---- sections and header ------------------------------------------------------------- */

KERN_HD uint32_t kern_ngroups(uint32_t dim)
{
    return (dim + KERN_GROUP - 1) / KERN_GROUP;
}

/* Payload bytes of one section; 0 for an unknown codec. */
KERN_HD uint64_t kern_sect_bytes(const struct kern_layout *lay, uint32_t codec, int is_v)
{
    uint64_t th = (uint64_t)lay->tokens * lay->heads;
    uint64_t g = th * kern_ngroups(lay->head_dim);
    switch (codec) {
    case KERN_CODEC_RAW:
        return th * lay->head_dim * 2;
    case KERN_CODEC_Q8_0:
        return g * 34;
    case KERN_CODEC_Q4_1:
        return g * 20;
    case KERN_CODEC_Q5_1:
        return g * 24;
    case KERN_CODEC_FP8:
        return 4ull * lay->heads + th * lay->head_dim;
    case KERN_CODEC_KIVI2:
    case KERN_CODEC_KIVI4:
        if (is_v)
            return g * kern_kivi_v_group_bytes(kern_codec_bits(codec));
        return (uint64_t)lay->heads *
               kern_kivi_k_head_bytes(lay->head_dim, lay->tokens, kern_codec_bits(codec));
    case KERN_CODEC_ROT2:
    case KERN_CODEC_ROT4:
        if (!kern_rot_dim_ok(lay->head_dim))
            return 0;
        /* keys: the seed, then the rotated rows in KIVI value groups (per token) */
        return (is_v ? 0 : KERN_ROT_PREFIX + kern_rot_mean_bytes(lay->heads, lay->head_dim)) +
               g * kern_kivi_v_group_bytes(kern_rot_bits(codec));
    case KERN_CODEC_MERGE:
        return (uint64_t)lay->heads * kern_merge_head_bytes(lay->head_dim, lay->tokens);
    case KERN_CODEC_LOWRANK:
        if ((lay->tokens < lay->head_dim ? lay->tokens : lay->head_dim) > KERN_LOWRANK_MAX_N)
            return 0;
        if (is_v)
            return g * 34;
        return (uint64_t)lay->heads * kern_lowrank_head_bytes(lay->head_dim, lay->tokens);
    default:
        return 0;
    }
}

KERN_HD uint32_t kern_kinds(const struct kern_layout *lay)
{
    return lay->k_only ? 1 : 2;
}

KERN_HD uint32_t kern_hdr_bytes(const struct kern_layout *lay)
{
    uint32_t b = (uint32_t)sizeof(struct kern_block_hdr) +
                 lay->layers * kern_kinds(lay) * (uint32_t)sizeof(struct kern_block_sect);
    return (b + KERN_ALIGN - 1) & ~(KERN_ALIGN - 1);
}

/*
 * Builds the header and section table into out (kern_hdr_bytes() bytes) when out is not
 * NULL; returns the encoded size, 0 for an unknown codec or a block of 4 GiB or more.
 * The layout must have passed kern_layout_check().
 */
KERN_HD uint64_t kern_hdr_build(const struct kern_layout *lay, const struct kern_recipe *rec,
                                uint8_t *out)
{
    uint32_t kinds = kern_kinds(lay);
    uint64_t off = kern_hdr_bytes(lay);
    for (uint32_t l = 0; l < lay->layers; l++) {
        for (uint32_t k = 0; k < kinds; k++) {
            uint32_t codec = rec->codec[l][k];
            uint64_t b = kern_sect_bytes(lay, codec, k == 1);
            if (codec >= KERN_CODEC_COUNT || b == 0)
                return 0;
            if (out) {
                struct kern_block_sect s;
                memset(&s, 0, sizeof(s));
                s.offset = (uint32_t)off;
                s.bytes = (uint32_t)b;
                s.codec = (uint8_t)codec;
                memcpy(out + sizeof(struct kern_block_hdr) + (l * kinds + k) * sizeof(s), &s,
                       sizeof(s));
            }
            off = (off + b + KERN_ALIGN - 1) & ~(uint64_t)(KERN_ALIGN - 1);
            if (off >= 0xffffffffull)
                return 0;
        }
    }
    if (out) {
        struct kern_block_hdr h;
        memset(&h, 0, sizeof(h));
        h.magic = KERN_BLOCK_MAGIC;
        h.version = KERN_BLOCK_VERSION;
        h.dtype = (uint8_t)lay->dtype;
        h.kinds = (uint8_t)kinds;
        h.layers = lay->layers;
        h.heads = lay->heads;
        h.head_dim = lay->head_dim;
        h.tokens = lay->tokens;
        h.nsect = lay->layers * kinds;
        h.hdr_bytes = kern_hdr_bytes(lay);
        h.total_bytes = off;
        memcpy(out, &h, sizeof(h));
        memset(out + sizeof(h) + h.nsect * sizeof(struct kern_block_sect), 0,
               h.hdr_bytes - sizeof(h) - h.nsect * sizeof(struct kern_block_sect));
    }
    return off;
}

/* Raw-head appendix (kern.h): bytes of its slot table, and of one raw head's rows. */
KERN_HD uint64_t kern_rawh_table_bytes(const struct kern_layout *lay)
{
    return (2ull * lay->layers * lay->heads + KERN_ALIGN - 1) & ~(uint64_t)(KERN_ALIGN - 1);
}

KERN_HD uint64_t kern_rawh_head_bytes(const struct kern_layout *lay)
{
    return 2ull * kern_kinds(lay) * lay->tokens * lay->head_dim;
}

/* Heads a recipe keeps raw (host memory). */
static inline uint32_t kern_rawh_count(const struct kern_layout *lay, const struct kern_recipe *rec)
{
    uint32_t n = 0;
    if (rec->raw_heads)
        for (uint64_t i = 0; i < (uint64_t)lay->layers * lay->heads; i++)
            n += rec->raw_heads[i] != 0;
    return n;
}

/* Bytes of an appendix of n raw heads (0 for none), a multiple of 16. */
KERN_HD uint64_t kern_rawh_bytes(const struct kern_layout *lay, uint32_t n)
{
    if (!n)
        return 0;
    return kern_rawh_table_bytes(lay) +
           ((n * kern_rawh_head_bytes(lay) + KERN_ALIGN - 1) & ~(uint64_t)(KERN_ALIGN - 1));
}

/* Element offset of (layer, kind, token, head, 0) in the raw block. */
KERN_HD uint64_t kern_raw_index(const struct kern_layout *lay, uint32_t l, uint32_t k,
                                uint32_t t, uint32_t h)
{
    uint64_t kinds = kern_kinds(lay);
    return (((uint64_t)l * kinds + k) * lay->tokens + t) * lay->heads * lay->head_dim +
           (uint64_t)h * lay->head_dim;
}

#endif
