/*
 * kern_oracle.c — see kern_oracle.h. Every formula below is the one docs/kernels.md states;
 * float operations are single-rounded in the order written (no FMA on this target).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/kern_oracle.h"

#define OR_GROUP 32

/* ---- scalars ----------------------------------------------------------------------------- */

float oracle_h2f(uint16_t h)
{
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    if (e == 31) {
        uint32_t u = (uint32_t)sign << 31 | 0x7f800000u | (uint32_t)m << 13;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    double v = e ? ldexp(1024.0 + m, e - 25) : ldexp((double)m, -24);
    return (float)(sign ? -v : v);
}

uint16_t oracle_f2h(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (isnan(f)) /* quieted, payload truncated (as F16C) */
        return (uint16_t)(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
    double a = fabs((double)f);
    if (a >= 65520.0) /* half-way past 65504 and beyond */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x1p-14) /* subnormal, in units of 2^-24; 1024 units is the smallest normal */
        return (uint16_t)(sign | (uint16_t)nearbyint(a * 0x1p24));
    int e;
    frexp(a, &e); /* a in [2^(e-1), 2^e) */
    int exp = e - 1;
    double q = nearbyint(ldexp(a, 10 - exp)); /* 11 significant bits, [1024, 2048] */
    if (q == 2048.0) {
        q = 1024.0;
        exp++;
    }
    return (uint16_t)(sign | (uint16_t)((exp + 15) << 10) | (uint16_t)((int)q - 1024));
}

uint16_t oracle_f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f))
        return (uint16_t)((u >> 16) | 0x40u);
    uint32_t hi = u >> 16, lo = u & 0xffffu;
    if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u)))
        hi++;
    return (uint16_t)hi;
}

float oracle_e4m3_value(uint8_t code)
{
    int e = (code >> 3) & 15, m = code & 7;
    double v = e ? ldexp(8.0 + m, e - 10) : ldexp((double)m, -9);
    return (float)(code & 0x80 ? -v : v);
}

uint8_t oracle_e4m3(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    int best = 0;
    double bd = a;
    if (a >= 448.0)
        return (uint8_t)(sign | 0x7e);
    for (int c = 1; c <= 0x7e; c++) { /* nearest magnitude, ties to the even code */
        double d = fabs((double)oracle_e4m3_value((uint8_t)c) - a);
        if (d < bd || (d == bd && (c & 1) == 0)) {
            best = c;
            bd = d;
        }
    }
    return (uint8_t)(sign | best);
}

/* ---- little helpers ------------------------------------------------------------------------ */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static float sanitize(float x)
{
    if (isnan(x))
        return 0.0f;
    return x > 65504.0f ? 65504.0f : x < -65504.0f ? -65504.0f : x;
}

static float load(const void *p, uint32_t dtype, uint64_t i)
{
    const uint8_t *b = (const uint8_t *)p + 2 * i;
    uint16_t v = get16(b);
    if (dtype == KERN_DTYPE_BF16) {
        uint32_t u = (uint32_t)v << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return oracle_h2f(v);
}

static void store(void *p, uint32_t dtype, uint64_t i, float x)
{
    put16((uint8_t *)p + 2 * i, dtype == KERN_DTYPE_BF16 ? oracle_f2bf(x) : oracle_f2h(x));
}

static uint64_t round16(uint64_t x)
{
    return (x + 15) & ~15ull;
}

static int bits_of(uint32_t codec)
{
    return codec == KERN_CODEC_KIVI2 ? 2 : codec == KERN_CODEC_KIVI4 ? 4 : 0;
}

static uint32_t kivi_row_bytes(uint32_t dim, int bits)
{
    return (dim * (uint32_t)bits + 7) / 8;
}

/* Bytes of K group of `rows` tokens, padded to 4. */
static uint32_t kivi_k_group(uint32_t dim, uint32_t rows, int bits)
{
    return (4 * dim + rows * kivi_row_bytes(dim, bits) + 3) / 4 * 4;
}

static uint32_t kivi_k_head(uint32_t dim, uint32_t tokens, int bits)
{
    uint32_t b = 0;
    for (uint32_t t0 = 0; t0 < tokens; t0 += OR_GROUP)
        b += kivi_k_group(dim, tokens - t0 < OR_GROUP ? tokens - t0 : OR_GROUP, bits);
    return b;
}

static uint64_t sect_bytes(const struct kern_layout *lay, uint32_t codec, int is_v)
{
    uint64_t T = lay->tokens, H = lay->heads, D = lay->head_dim, G = (D + 31) / 32;
    switch (codec) {
    case KERN_CODEC_RAW:
        return T * H * D * 2;
    case KERN_CODEC_Q8_0:
        return T * H * G * 34;
    case KERN_CODEC_Q4_1:
        return T * H * G * 20;
    case KERN_CODEC_Q5_1:
        return T * H * G * 24;
    case KERN_CODEC_FP8:
        return 4 * H + T * H * D;
    case KERN_CODEC_KIVI2:
    case KERN_CODEC_KIVI4:
        return is_v ? T * H * G * (4 + 4 * (uint64_t)bits_of(codec))
                    : H * kivi_k_head((uint32_t)D, (uint32_t)T, bits_of(codec));
    default:
        return 0;
    }
}

static int layout_ok(const struct kern_layout *l)
{
    return l->layers >= 1 && l->layers <= KERN_MAX_LAYERS && l->heads >= 1 &&
           l->heads <= KERN_MAX_HEADS && l->head_dim >= 1 && l->head_dim <= KERN_MAX_HEAD_DIM &&
           l->tokens >= 1 && l->tokens <= KERN_MAX_TOKENS && l->k_only <= 1 &&
           (l->dtype == KERN_DTYPE_FP16 || l->dtype == KERN_DTYPE_BF16);
}

/* Section offsets and sizes; the total size, or 0 when the recipe is not allowed. */
static uint64_t plan(const struct kern_layout *lay, const struct kern_recipe *rec,
                     uint64_t *off, uint64_t *bytes)
{
    uint32_t kinds = lay->k_only ? 1 : 2, n = 0;
    uint64_t at = round16(48 + 12ull * lay->layers * kinds);
    for (uint32_t l = 0; l < lay->layers; l++)
        for (uint32_t k = 0; k < kinds; k++, n++) {
            uint32_t c = rec->codec[l][k];
            if (c >= KERN_CODEC_COUNT)
                return 0;
            off[n] = at;
            bytes[n] = sect_bytes(lay, c, k == 1);
            at = round16(at + bytes[n]);
        }
    return at < 0xffffffffull ? at : 0;
}

/* ---- codecs ------------------------------------------------------------------------------ */

/* min and max of v[0..n): the first of equal values (+0 / -0) stays. */
static void range(const float *v, int n, float *mn, float *mx)
{
    *mn = *mx = v[0];
    for (int j = 1; j < n; j++) {
        if (v[j] < *mn)
            *mn = v[j];
        if (v[j] > *mx)
            *mx = v[j];
    }
}

static void q8_0_group(const float *v, int n, uint8_t *b)
{
    float amax = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(v[j]) > amax)
            amax = fabsf(v[j]);
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    put16(b, oracle_f2h(d));
    for (int j = 0; j < OR_GROUP; j++)
        b[2 + j] = j < n ? (uint8_t)(int8_t)roundf(v[j] * id) : 0;
}

static void qx_1_group(const float *v, int n, uint8_t *b, int bits)
{
    int qmax = (1 << bits) - 1, q[OR_GROUP];
    float mn, mx;
    range(v, n, &mn, &mx);
    float d = (mx - mn) / (float)qmax;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    put16(b, oracle_f2h(d));
    put16(b + 2, oracle_f2h(mn));
    for (int j = 0; j < OR_GROUP; j++) {
        q[j] = 0;
        if (j < n) {
            int c = (int)((v[j] - mn) * id + 0.5f);
            q[j] = c < qmax ? c : qmax;
        }
    }
    uint8_t *qs = b + (bits == 5 ? 8 : 4);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
    for (int j = 0; j < OR_GROUP; j++)
        qh |= (uint32_t)((q[j] >> 4) & 1) << j;
    if (bits == 5)
        put32(b + 4, qh);
}

/* KIVI: the fp16 scale and min of a range, and the code of x. */
struct kivi_p {
    uint16_t sc_h, mn_h;
    float sc, mn, id;
};

static struct kivi_p kivi_params(float mn, float mx, int bits)
{
    struct kivi_p p;
    p.sc_h = oracle_f2h((mx - mn) / (float)((1 << bits) - 1));
    p.mn_h = oracle_f2h(mn);
    p.sc = oracle_h2f(p.sc_h);
    p.mn = oracle_h2f(p.mn_h);
    p.id = p.sc != 0.0f ? 1.0f / p.sc : 0.0f;
    return p;
}

static uint32_t kivi_code(float x, const struct kivi_p *p, int bits)
{
    float t = floorf((x - p->mn) * p->id + 0.5f);
    float qmax = (float)((1 << bits) - 1);
    return t <= 0.0f ? 0 : t >= qmax ? (uint32_t)qmax : (uint32_t)t;
}

/* Element e of a packed row gets code c (the row starts zeroed). */
static void kivi_put(uint8_t *row, uint32_t e, uint32_t c, int bits)
{
    if (bits == 4)
        row[e / 2] = (uint8_t)(row[e / 2] | c << (4 * (e % 2)));
    else
        row[e / 4] = (uint8_t)(row[e / 4] | c << (2 * (e % 4)));
}

static uint32_t kivi_get(const uint8_t *row, uint32_t e, int bits)
{
    if (bits == 4)
        return (row[e / 2] >> (4 * (e % 2))) & 15u;
    return (row[e / 4] >> (2 * (e % 4))) & 3u;
}

/* Encodes section x[T][H][D] (sanitised floats) with codec into sect (zeroed). */
static void enc_sect(const struct kern_layout *lay, uint32_t codec, int is_v, const float *x,
                     uint8_t *sect)
{
    uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim, G = (D + 31) / 32;
    int bits = bits_of(codec);
    if (codec == KERN_CODEC_FP8) {
        for (uint32_t h = 0; h < H; h++) {
            float amax = 0.0f;
            for (uint32_t t = 0; t < T; t++)
                for (uint32_t d = 0; d < D; d++)
                    if (fabsf(x[((uint64_t)t * H + h) * D + d]) > amax)
                        amax = fabsf(x[((uint64_t)t * H + h) * D + d]);
            float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
            uint32_t su;
            memcpy(&su, &scale, 4);
            put32(sect + 4 * h, su);
            for (uint32_t t = 0; t < T; t++)
                for (uint32_t d = 0; d < D; d++) {
                    uint64_t i = ((uint64_t)t * H + h) * D + d;
                    sect[4 * H + i] = oracle_e4m3(x[i] / scale);
                }
        }
        return;
    }
    if (bits && !is_v) { /* KIVI keys: per channel over groups of 32 tokens */
        uint32_t rb = kivi_row_bytes(D, bits);
        for (uint32_t h = 0; h < H; h++) {
            uint8_t *g = sect + (uint64_t)h * kivi_k_head(D, T, bits);
            for (uint32_t t0 = 0; t0 < T; t0 += OR_GROUP) {
                uint32_t rows = T - t0 < OR_GROUP ? T - t0 : OR_GROUP;
                float col[OR_GROUP];
                for (uint32_t c = 0; c < D; c++) {
                    float mn, mx;
                    for (uint32_t r = 0; r < rows; r++)
                        col[r] = x[((uint64_t)(t0 + r) * H + h) * D + c];
                    range(col, (int)rows, &mn, &mx);
                    struct kivi_p p = kivi_params(mn, mx, bits);
                    put16(g + 2 * c, p.sc_h);
                    put16(g + 2 * D + 2 * c, p.mn_h);
                    for (uint32_t r = 0; r < rows; r++)
                        kivi_put(g + 4 * D + (uint64_t)r * rb, c, kivi_code(col[r], &p, bits),
                                 bits);
                }
                g += kivi_k_group(D, rows, bits);
            }
        }
        return;
    }
    uint32_t gb = bits ? 4 + 4 * (uint32_t)bits
                       : codec == KERN_CODEC_Q8_0 ? 34 : codec == KERN_CODEC_Q4_1 ? 20 : 24;
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < H; h++)
            for (uint32_t g = 0; g < G; g++) {
                const float *v = x + ((uint64_t)t * H + h) * D + 32 * g;
                int n = (int)(D - 32 * g < 32 ? D - 32 * g : 32);
                uint8_t *b = sect + (((uint64_t)t * H + h) * G + g) * gb;
                if (codec == KERN_CODEC_Q8_0) {
                    q8_0_group(v, n, b);
                } else if (!bits) {
                    qx_1_group(v, n, b, codec == KERN_CODEC_Q5_1 ? 5 : 4);
                } else { /* KIVI values: per token over groups of 32 channels */
                    float mn, mx;
                    range(v, n, &mn, &mx);
                    struct kivi_p p = kivi_params(mn, mx, bits);
                    put16(b, p.sc_h);
                    put16(b + 2, p.mn_h);
                    for (int j = 0; j < n; j++)
                        kivi_put(b + 4, (uint32_t)j, kivi_code(v[j], &p, bits), bits);
                }
            }
}

/* Decodes section sect into y[T][H][D]. */
static void dec_sect(const struct kern_layout *lay, uint32_t codec, int is_v, const uint8_t *sect,
                     float *y)
{
    uint32_t T = lay->tokens, H = lay->heads, D = lay->head_dim, G = (D + 31) / 32;
    int bits = bits_of(codec);
    if (codec == KERN_CODEC_FP8) {
        for (uint32_t h = 0; h < H; h++) {
            float scale;
            uint32_t su = (uint32_t)get16(sect + 4 * h) | (uint32_t)get16(sect + 4 * h + 2) << 16;
            memcpy(&scale, &su, 4);
            for (uint32_t t = 0; t < T; t++)
                for (uint32_t d = 0; d < D; d++) {
                    uint64_t i = ((uint64_t)t * H + h) * D + d;
                    y[i] = oracle_e4m3_value(sect[4 * H + i]) * scale;
                }
        }
        return;
    }
    if (bits && !is_v) {
        uint32_t rb = kivi_row_bytes(D, bits);
        for (uint32_t h = 0; h < H; h++) {
            const uint8_t *g = sect + (uint64_t)h * kivi_k_head(D, T, bits);
            for (uint32_t t0 = 0; t0 < T; t0 += OR_GROUP) {
                uint32_t rows = T - t0 < OR_GROUP ? T - t0 : OR_GROUP;
                for (uint32_t c = 0; c < D; c++) {
                    float sc = oracle_h2f(get16(g + 2 * c)), mn = oracle_h2f(get16(g + 2 * D + 2 * c));
                    for (uint32_t r = 0; r < rows; r++) {
                        uint32_t q = kivi_get(g + 4 * D + (uint64_t)r * rb, c, bits);
                        y[((uint64_t)(t0 + r) * H + h) * D + c] = (float)q * sc + mn;
                    }
                }
                g += kivi_k_group(D, rows, bits);
            }
        }
        return;
    }
    uint32_t gb = bits ? 4 + 4 * (uint32_t)bits
                       : codec == KERN_CODEC_Q8_0 ? 34 : codec == KERN_CODEC_Q4_1 ? 20 : 24;
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < H; h++)
            for (uint32_t g = 0; g < G; g++) {
                float *v = y + ((uint64_t)t * H + h) * D + 32 * g;
                int n = (int)(D - 32 * g < 32 ? D - 32 * g : 32);
                const uint8_t *b = sect + (((uint64_t)t * H + h) * G + g) * gb;
                if (codec == KERN_CODEC_Q8_0) {
                    float d = oracle_h2f(get16(b));
                    for (int j = 0; j < n; j++)
                        v[j] = (float)(int8_t)b[2 + j] * d;
                } else if (!bits) {
                    int b5 = codec == KERN_CODEC_Q5_1;
                    float d = oracle_h2f(get16(b)), m = oracle_h2f(get16(b + 2));
                    const uint8_t *qs = b + (b5 ? 8 : 4);
                    uint32_t qh = b5 ? (uint32_t)get16(b + 4) | (uint32_t)get16(b + 6) << 16 : 0;
                    for (int j = 0; j < n; j++) {
                        uint32_t q = j < 16 ? qs[j] & 15u : (uint32_t)qs[j - 16] >> 4;
                        q |= ((qh >> j) & 1u) << 4;
                        v[j] = (float)q * d + m;
                    }
                } else {
                    float sc = oracle_h2f(get16(b)), mn = oracle_h2f(get16(b + 2));
                    for (int j = 0; j < n; j++)
                        v[j] = (float)kivi_get(b + 4, (uint32_t)j, bits) * sc + mn;
                }
            }
}

/* ---- blocks ------------------------------------------------------------------------------ */

/* Raw element offset of (layer, kind, token 0, head 0, dim 0). */
static uint64_t sect_base(const struct kern_layout *lay, uint32_t l, uint32_t k)
{
    uint64_t kinds = lay->k_only ? 1 : 2;
    return ((uint64_t)l * kinds + k) * lay->tokens * lay->heads * lay->head_dim;
}

int64_t oracle_encode(const struct kern_layout *lay, const struct kern_recipe *rec,
                      const void *src, uint8_t **out, float *kmin, float *kmax, float *knorm)
{
    uint64_t off[2 * KERN_MAX_LAYERS], bytes[2 * KERN_MAX_LAYERS];
    if (!layout_ok(lay))
        return -1;
    uint64_t total = plan(lay, rec, off, bytes);
    if (!total)
        return -1;
    uint32_t kinds = lay->k_only ? 1 : 2, nsect = lay->layers * kinds;
    uint64_t n = (uint64_t)lay->tokens * lay->heads * lay->head_dim;
    uint8_t *b = calloc(1, total);
    float *x = malloc(n * sizeof(float));
    if (!b || !x) {
        free(b);
        free(x);
        return -1;
    }
    put32(b, KERN_BLOCK_MAGIC);
    put16(b + 4, KERN_BLOCK_VERSION);
    b[6] = (uint8_t)lay->dtype;
    b[7] = (uint8_t)kinds;
    put32(b + 8, lay->layers);
    put32(b + 12, lay->heads);
    put32(b + 16, lay->head_dim);
    put32(b + 20, lay->tokens);
    put32(b + 24, nsect);
    put32(b + 28, (uint32_t)off[0]);
    put32(b + 32, (uint32_t)total);
    put32(b + 36, (uint32_t)(total >> 32));
    for (uint32_t l = 0, s = 0; l < lay->layers; l++)
        for (uint32_t k = 0; k < kinds; k++, s++) {
            uint32_t c = rec->codec[l][k];
            uint8_t *e = b + 48 + 12 * s;
            put32(e, (uint32_t)off[s]);
            put32(e + 4, (uint32_t)bytes[s]);
            e[8] = (uint8_t)c;
            uint64_t base = sect_base(lay, l, k);
            if (c == KERN_CODEC_RAW)
                memcpy(b + off[s], (const uint8_t *)src + 2 * base, bytes[s]);
            if (c == KERN_CODEC_RAW && !(k == 0 && kmin))
                continue;
            for (uint64_t i = 0; i < n; i++)
                x[i] = sanitize(load(src, lay->dtype, base + i));
            if (k == 0 && kmin) {
                uint32_t H = lay->heads, D = lay->head_dim;
                for (uint32_t h = 0; h < H; h++) {
                    double norm = 0;
                    for (uint32_t t = 0; t < lay->tokens; t++) {
                        double ss = 0;
                        for (uint32_t d = 0; d < D; d++) {
                            float v = x[((uint64_t)t * H + h) * D + d];
                            uint64_t j = ((uint64_t)l * H + h) * D + d;
                            if (t == 0 || v < kmin[j])
                                kmin[j] = v;
                            if (t == 0 || v > kmax[j])
                                kmax[j] = v;
                            ss += (double)v * v;
                        }
                        norm += sqrt(ss);
                    }
                    knorm[(uint64_t)l * H + h] = (float)(norm / lay->tokens);
                }
            }
            if (c != KERN_CODEC_RAW)
                enc_sect(lay, c, k == 1, x, b + off[s]);
        }
    free(x);
    *out = b;
    return (int64_t)total;
}

void oracle_decode(const struct kern_layout *lay, const struct kern_recipe *rec,
                   const uint8_t *enc, void *dst, uint32_t out_dtype)
{
    uint64_t off[2 * KERN_MAX_LAYERS], bytes[2 * KERN_MAX_LAYERS];
    uint32_t kinds = lay->k_only ? 1 : 2;
    uint64_t n = (uint64_t)lay->tokens * lay->heads * lay->head_dim;
    float *y = malloc(n * sizeof(float));
    if (!y || !layout_ok(lay) || !plan(lay, rec, off, bytes)) {
        free(y);
        return;
    }
    for (uint32_t l = 0, s = 0; l < lay->layers; l++)
        for (uint32_t k = 0; k < kinds; k++, s++) {
            uint32_t c = rec->codec[l][k];
            uint64_t base = sect_base(lay, l, k);
            if (c == KERN_CODEC_RAW && out_dtype == lay->dtype) { /* bit for bit */
                memcpy((uint8_t *)dst + 2 * base, enc + off[s], 2 * n);
                continue;
            }
            if (c == KERN_CODEC_RAW) { /* NaN and Inf kept through a dtype change */
                for (uint64_t i = 0; i < n; i++)
                    store(dst, out_dtype, base + i, load(enc + off[s], lay->dtype, i));
                continue;
            }
            dec_sect(lay, c, k == 1, enc + off[s], y);
            for (uint64_t i = 0; i < n; i++)
                store(dst, out_dtype, base + i, y[i]);
        }
    free(y);
}
