/*
 * kern.c — block codec driver and the scalar reference.
 *
 * DESIGN
 * The driver validates, writes the header (kern_fmt.h builds it, the same code the CUDA
 * twin runs) and walks the sections; per (layer, kind, head) slice it loads the values into
 * a float scratch, folds them into the key statistics when it is a K slice, and hands them
 * to the codec. The reference codecs here are the definition of the format: straight loops
 * over the per-group functions of kern_fmt.h, in the order the format states.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern.h"
#include "kernels/kern_cpu.h"
#include "kernels/kern_encb.h"
#include "kernels/kern_ext.h"
#include "kernels/kern_fmt.h"

static const char *const kern_codec_names[KERN_CODEC_COUNT] = {
    [KERN_CODEC_RAW] = "raw",     [KERN_CODEC_Q8_0] = "q8_0",       [KERN_CODEC_Q4_1] = "q4_1",
    [KERN_CODEC_Q5_1] = "q5_1",   [KERN_CODEC_KIVI2] = "kivi2",     [KERN_CODEC_KIVI4] = "kivi4",
    [KERN_CODEC_FP8] = "fp8",     [KERN_CODEC_ROT2] = "rot2",       [KERN_CODEC_ROT4] = "rot4",
    [KERN_CODEC_MERGE] = "merge", [KERN_CODEC_LOWRANK] = "lowrank",
};

/* Attention relative error of each codec, K and V both in it, on the synthetic KV of
 * docs/kernels.md (outlier key channels; mean over seeds 1-3): what a namespace's fidelity
 * budget is compared with. MERGE and LOWRANK on that Gaussian KV are their worst case (no
 * runs to merge, no low rank to keep); the daemon keeps a merge only where no token joins
 * past the threshold (kern_merge_forced). */
static const double kern_codec_attn[KERN_CODEC_COUNT] = {
    [KERN_CODEC_RAW] = 0.0,      [KERN_CODEC_Q8_0] = 0.0281,    [KERN_CODEC_Q4_1] = 0.2845,
    [KERN_CODEC_Q5_1] = 0.1349,  [KERN_CODEC_KIVI2] = 0.6200,   [KERN_CODEC_KIVI4] = 0.1143,
    [KERN_CODEC_FP8] = 0.0678,   [KERN_CODEC_ROT2] = 0.6260,    [KERN_CODEC_ROT4] = 0.1145,
    [KERN_CODEC_MERGE] = 0.6173, [KERN_CODEC_LOWRANK] = 0.6401,
};

double kern_codec_attn_error(enum kern_codec c)
{
    return (unsigned)c < KERN_CODEC_COUNT ? kern_codec_attn[c] : 1e9;
}

const char *kern_codec_name(enum kern_codec c)
{
    return (unsigned)c < KERN_CODEC_COUNT ? kern_codec_names[c] : "?";
}

int kern_codec_from_name(const char *name)
{
    for (int i = 0; name && i < KERN_CODEC_COUNT; i++)
        if (strcmp(name, kern_codec_names[i]) == 0)
            return i;
    return -EINVAL;
}

int kern_layout_check(const struct kern_layout *lay)
{
    if (!lay || lay->layers < 1 || lay->layers > KERN_MAX_LAYERS || lay->heads < 1 ||
        lay->heads > KERN_MAX_HEADS || lay->head_dim < 1 || lay->head_dim > KERN_MAX_HEAD_DIM ||
        lay->tokens < 1 || lay->tokens > KERN_MAX_TOKENS || lay->k_only > 1 ||
        (lay->dtype != KERN_DTYPE_FP16 && lay->dtype != KERN_DTYPE_BF16))
        return -EINVAL;
    return 0;
}

uint64_t kern_raw_size(const struct kern_layout *lay)
{
    if (kern_layout_check(lay) < 0)
        return 0;
    return (uint64_t)lay->layers * kern_kinds(lay) * lay->tokens * lay->heads * lay->head_dim * 2;
}

/* |x| of n raw fp16/bf16 values as kern_sanitize sees them (NaN 0, the rest clamped to the
 * fp16 range), summed. On the quantize worker's path for every block it encodes, so without a
 * branch per value: the magnitude's bits moved into a float (fp16 rebiased by a multiply by
 * 2^112, exact for subnormals too), NaN masked, infinity and bf16's larger values clamped; eight
 * partial sums in float (the result is kept as a bf16), added in double per row. */
static double kern_abs_sum(const uint8_t *v, uint64_t n, uint32_t dtype)
{
    float acc[8] = {0};
    uint64_t i = 0;
    uint32_t nan = dtype == KERN_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
    uint32_t sh = dtype == KERN_DTYPE_BF16 ? 16 : 13;
    float scale = dtype == KERN_DTYPE_BF16 ? 1.0f : 0x1p112f;
    for (; i + 8 <= n; i += 8)
        for (uint32_t j = 0; j < 8; j++) {
            uint16_t h;
            memcpy(&h, v + 2 * (i + j), 2);
            uint32_t m = h & 0x7fffu;
            float x = kern_u2f(m << sh) * scale;
            x = x > KERN_FP16_MAX ? KERN_FP16_MAX : x;
            acc[j] += m > nan ? 0.0f : x;
        }
    double sum = 0.0;
    for (; i < n; i++)
        sum += fabsf(kern_sanitize(kern_load(v, dtype, i)));
    for (uint32_t j = 0; j < 8; j++)
        sum += acc[j];
    return sum;
}

double kern_value_l1(const struct kern_layout *lay, const void *src)
{
    if (!src || lay->k_only || kern_layout_check(lay) < 0)
        return 0.0;
    uint64_t row = (uint64_t)lay->tokens * lay->heads * lay->head_dim;
    double sum = 0.0;
    for (uint32_t l = 0; l < lay->layers; l++) {
        uint64_t base = (2 * (uint64_t)l + 1) * row; /* [layer][k/v][token][head][dim] */
        sum += kern_abs_sum((const uint8_t *)src + 2 * base, row, lay->dtype);
    }
    return sum / ((double)lay->layers * lay->heads * lay->tokens);
}

int kern_codec_supports(const struct kern_layout *lay, enum kern_codec c)
{
    if (kern_layout_check(lay) < 0 || (unsigned)c >= KERN_CODEC_COUNT)
        return 0;
    return kern_sect_bytes(lay, c, 0) > 0 && (lay->k_only || kern_sect_bytes(lay, c, 1) > 0);
}

void kern_recipe_fill(struct kern_recipe *rec, enum kern_codec k, enum kern_codec v,
                      uint32_t raw_layers)
{
    rec->seed = 0;
    rec->merge_cos = 0.0f;
    rec->lowrank_energy = 0.0f;
    rec->raw_heads = NULL;
    for (uint32_t l = 0; l < KERN_MAX_LAYERS; l++) {
        rec->codec[l][0] = (uint8_t)(l < raw_layers ? KERN_CODEC_RAW : k);
        rec->codec[l][1] = (uint8_t)(l < raw_layers ? KERN_CODEC_RAW : v);
    }
}

int64_t kern_encoded_size(const struct kern_layout *lay, const struct kern_recipe *rec)
{
    if (kern_layout_check(lay) < 0 || !rec)
        return -EINVAL;
    uint64_t n = kern_hdr_build(lay, rec, NULL);
    if (!n)
        return -EINVAL;
    n += kern_rawh_bytes(lay, kern_rawh_count(lay, rec));
    return n < 0xffffffffull ? (int64_t)n : -EINVAL;
}

/* The appendix of a block whose header h passed the section checks (base: the end of the
 * sections): 0 and *n = 0 without one, else its offset and head count; -EBADMSG when it is
 * not the one an encoder writes. */
static int64_t rawh_check(const struct kern_block_hdr *h, const struct kern_layout *l,
                          uint64_t base, const uint8_t *src, size_t src_len, uint32_t *n)
{
    uint32_t off = (uint32_t)h->reserved, cnt = (uint32_t)(h->reserved >> 32), next = 1;
    uint64_t lh = (uint64_t)l->layers * l->heads;
    *n = 0;
    if (!h->reserved)
        return h->total_bytes == base ? 0 : -EBADMSG;
    if (off != base || cnt == 0 || cnt > lh || h->total_bytes != base + kern_rawh_bytes(l, cnt) ||
        h->total_bytes > src_len)
        return -EBADMSG;
    for (uint64_t i = 0; i < lh; i++) { /* slots number the raw heads 1..cnt in order */
        uint16_t s;
        memcpy(&s, src + off + 2 * i, 2);
        if (s && s != next++)
            return -EBADMSG;
    }
    if (next != cnt + 1)
        return -EBADMSG;
    *n = cnt;
    return off;
}

int64_t kern_block_info(const void *src, size_t src_len, struct kern_layout *lay,
                        struct kern_recipe *rec)
{
    struct kern_block_hdr h;
    struct kern_layout l;
    struct kern_recipe r;
    uint8_t *expect = NULL;
    int64_t ret = -EBADMSG;

    if (!src)
        return -EINVAL;
    if (src_len < sizeof(h))
        goto out;
    memcpy(&h, src, sizeof(h));
    if (h.magic != KERN_BLOCK_MAGIC || h.version != KERN_BLOCK_VERSION ||
        (h.kinds != 1 && h.kinds != 2))
        goto out;
    memset(&l, 0, sizeof(l));
    l.layers = h.layers;
    l.heads = h.heads;
    l.head_dim = h.head_dim;
    l.tokens = h.tokens;
    l.dtype = h.dtype;
    l.k_only = h.kinds == 1;
    if (kern_layout_check(&l) < 0 || h.nsect != l.layers * h.kinds ||
        h.hdr_bytes != kern_hdr_bytes(&l) || src_len < h.hdr_bytes)
        goto out;
    memset(&r, 0, sizeof(r));
    for (uint32_t i = 0; i < h.nsect; i++) {
        struct kern_block_sect s;
        memcpy(&s, (const uint8_t *)src + sizeof(h) + i * sizeof(s), sizeof(s));
        r.codec[i / h.kinds][i % h.kinds] = s.codec;
    }
    /* the table must be exactly the one the recipe gives: nothing else is ever written */
    expect = malloc(h.hdr_bytes);
    if (!expect) {
        ret = -ENOMEM;
        goto out;
    }
    if (kern_hdr_build(&l, &r, NULL) == 0)
        goto out;
    uint64_t total = kern_hdr_build(&l, &r, expect);
    uint32_t nraw;
    struct kern_block_hdr eh;
    memcpy(&eh, expect, sizeof(eh)); /* the appendix's fields are checked by rawh_check */
    eh.reserved = h.reserved;
    eh.total_bytes = h.total_bytes;
    memcpy(expect, &eh, sizeof(eh));
    if (memcmp(expect, src, h.hdr_bytes) != 0 || total > src_len ||
        rawh_check(&h, &l, total, src, src_len, &nraw) < 0)
        goto out;
    total = h.total_bytes;
    if (lay)
        *lay = l;
    r.raw_heads = NULL;
    if (rec)
        *rec = r;
    ret = (int64_t)total;
out:
    free(expect);
    return ret;
}

/* ---- reference operations ------------------------------------------------------------ */

static void ref_load(const void *src, uint32_t dtype, uint64_t stride, uint32_t tokens,
                     uint32_t dim, float *x)
{
    for (uint32_t t = 0; t < tokens; t++)
        for (uint32_t d = 0; d < dim; d++)
            x[(uint64_t)t * dim + d] = kern_sanitize(kern_load(src, dtype, t * stride + d));
}

static void ref_store(const float *y, uint32_t tokens, uint32_t dim, void *dst, uint32_t dtype,
                      uint64_t stride)
{
    for (uint32_t t = 0; t < tokens; t++)
        for (uint32_t d = 0; d < dim; d++)
            kern_store(dst, dtype, t * stride + d, y[(uint64_t)t * dim + d]);
}

static void ref_stats(const float *x, uint32_t tokens, uint32_t dim, float *kmin, float *kmax,
                      float *knorm)
{
    float norm = 0.0f;
    for (uint32_t d = 0; d < dim; d++) {
        kmin[d] = x[d];
        kmax[d] = x[d];
    }
    for (uint32_t t = 0; t < tokens; t++) {
        const float *r = x + (uint64_t)t * dim;
        float ss = 0.0f;
        for (uint32_t d = 0; d < dim; d++) {
            kmin[d] = r[d] < kmin[d] ? r[d] : kmin[d];
            kmax[d] = r[d] > kmax[d] ? r[d] : kmax[d];
            ss += r[d] * r[d];
        }
        norm += sqrtf(ss);
    }
    *knorm = norm / (float)tokens;
}

static uint32_t ggml_block_bytes(uint32_t codec)
{
    return codec == KERN_CODEC_Q8_0 ? 34 : codec == KERN_CODEC_Q4_1 ? 20 : 24;
}

static void ref_kivi_k_enc(const float *x, const struct kern_layout *lay, uint32_t h, uint8_t *sect,
                           int bits)
{
    uint32_t dim = lay->head_dim, rb = kern_kivi_row_bytes(dim, bits);
    uint8_t *g = sect + (uint64_t)h * kern_kivi_k_head_bytes(dim, lay->tokens, bits);
    for (uint32_t t0 = 0; t0 < lay->tokens; t0 += KERN_GROUP) {
        uint32_t rows = lay->tokens - t0 < KERN_GROUP ? lay->tokens - t0 : KERN_GROUP;
        uint32_t gb = kern_kivi_k_group_bytes(dim, rows, bits);
        uint8_t *codes = g + 4 * dim;
        memset(codes, 0, gb - 4 * dim);
        for (uint32_t c = 0; c < dim; c++) {
            float mn = x[(uint64_t)t0 * dim + c], mx = mn;
            for (uint32_t r = 1; r < rows; r++) {
                float v = x[(uint64_t)(t0 + r) * dim + c];
                mn = v < mn ? v : mn;
                mx = v > mx ? v : mx;
            }
            uint16_t mn_h, sc_h;
            float mnf, id;
            kern_kivi_params(mn, mx, bits, &mn_h, &sc_h, &mnf, &id);
            memcpy(g + 2 * c, &sc_h, 2);
            memcpy(g + 2 * dim + 2 * c, &mn_h, 2);
            for (uint32_t r = 0; r < rows; r++) {
                uint32_t q = kern_kivi_code(x[(uint64_t)(t0 + r) * dim + c], mnf, id, bits);
                uint8_t *row = codes + (uint64_t)r * rb;
                if (bits == 4)
                    row[c >> 1] = (uint8_t)(row[c >> 1] | (q << ((c & 1) * 4)));
                else
                    row[c >> 2] = (uint8_t)(row[c >> 2] | (q << ((c & 3) * 2)));
            }
        }
        g += gb;
    }
}

static void ref_kivi_k_dec(const uint8_t *sect, const struct kern_layout *lay, uint32_t h, float *y,
                           int bits)
{
    uint32_t dim = lay->head_dim, rb = kern_kivi_row_bytes(dim, bits);
    const uint8_t *g = sect + (uint64_t)h * kern_kivi_k_head_bytes(dim, lay->tokens, bits);
    for (uint32_t t0 = 0; t0 < lay->tokens; t0 += KERN_GROUP) {
        uint32_t rows = lay->tokens - t0 < KERN_GROUP ? lay->tokens - t0 : KERN_GROUP;
        for (uint32_t c = 0; c < dim; c++) {
            float sc = kern_get_h(g + 2 * c), mnf = kern_get_h(g + 2 * dim + 2 * c);
            for (uint32_t r = 0; r < rows; r++) {
                uint32_t q = kern_kivi_get(g + 4 * dim + (uint64_t)r * rb, c, bits);
                y[(uint64_t)(t0 + r) * dim + c] = kern_kivi_val(q, sc, mnf);
            }
        }
        g += kern_kivi_k_group_bytes(dim, rows, bits);
    }
}

void kern_ref_enc(uint32_t codec, int is_v, const float *x, const struct kern_layout *lay,
                  uint32_t h, uint8_t *sect)
{
    uint32_t dim = lay->head_dim, H = lay->heads, G = kern_ngroups(dim);
    int bits = kern_codec_bits(codec);

    if (codec == KERN_CODEC_FP8) {
        float amax = 0.0f;
        for (uint64_t i = 0; i < (uint64_t)lay->tokens * dim; i++)
            amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        float scale = kern_fp8_scale(amax);
        memcpy(sect + 4 * h, &scale, 4);
        uint8_t *q = sect + 4 * H;
        for (uint32_t t = 0; t < lay->tokens; t++)
            for (uint32_t d = 0; d < dim; d++)
                q[((uint64_t)t * H + h) * dim + d] =
                    kern_e4m3_enc(KERN_DIV(x[(uint64_t)t * dim + d], scale));
        return;
    }
    if (bits && !is_v) {
        ref_kivi_k_enc(x, lay, h, sect, bits);
        return;
    }
    uint32_t gb = bits ? kern_kivi_v_group_bytes(bits) : ggml_block_bytes(codec);
    for (uint32_t t = 0; t < lay->tokens; t++) {
        for (uint32_t g = 0; g < G; g++) {
            const float *xg = x + (uint64_t)t * dim + g * KERN_GROUP;
            int n = (int)(dim - g * KERN_GROUP < KERN_GROUP ? dim - g * KERN_GROUP : KERN_GROUP);
            uint8_t *blk = sect + (((uint64_t)t * H + h) * G + g) * gb;
            if (bits)
                kern_kivi_v_enc(xg, n, blk, bits);
            else if (codec == KERN_CODEC_Q8_0)
                kern_q8_0_enc(xg, n, blk);
            else
                kern_qx_1_enc(xg, n, blk, codec == KERN_CODEC_Q5_1 ? 5 : 4);
        }
    }
}

void kern_ref_dec(uint32_t codec, int is_v, const uint8_t *sect, const struct kern_layout *lay,
                  uint32_t h, float *y)
{
    uint32_t dim = lay->head_dim, H = lay->heads, G = kern_ngroups(dim);
    int bits = kern_codec_bits(codec);

    if (codec == KERN_CODEC_FP8) {
        float scale;
        memcpy(&scale, sect + 4 * h, 4);
        const uint8_t *q = sect + 4 * H;
        for (uint32_t t = 0; t < lay->tokens; t++)
            for (uint32_t d = 0; d < dim; d++)
                y[(uint64_t)t * dim + d] =
                    KERN_MUL(kern_e4m3_dec(q[((uint64_t)t * H + h) * dim + d]), scale);
        return;
    }
    if (bits && !is_v) {
        ref_kivi_k_dec(sect, lay, h, y, bits);
        return;
    }
    uint32_t gb = bits ? kern_kivi_v_group_bytes(bits) : ggml_block_bytes(codec);
    for (uint32_t t = 0; t < lay->tokens; t++) {
        for (uint32_t g = 0; g < G; g++) {
            float *yg = y + (uint64_t)t * dim + g * KERN_GROUP;
            int n = (int)(dim - g * KERN_GROUP < KERN_GROUP ? dim - g * KERN_GROUP : KERN_GROUP);
            const uint8_t *blk = sect + (((uint64_t)t * H + h) * G + g) * gb;
            if (bits)
                kern_kivi_v_dec(blk, n, yg, bits);
            else if (codec == KERN_CODEC_Q8_0)
                kern_q8_0_dec(blk, n, yg);
            else
                kern_qx_1_dec(blk, n, yg, codec == KERN_CODEC_Q5_1 ? 5 : 4);
        }
    }
}

const struct kern_cpu_ops kern_ref_ops = {
    .load = ref_load,
    .store = ref_store,
    .stats = ref_stats,
    .enc = kern_ref_enc,
    .dec = kern_ref_dec,
};

/* ---- driver -------------------------------------------------------------------------- */

/* A transform codec's section (kern_codec_ext) of layer l; lst: the layer's key statistics
 * asked of a MERGE K section's pass, or NULL. 1 where the pass took them, 0, or -errno. */
static int kern_ext_enc(const struct kern_cpu_ops *ops, uint32_t codec, int is_v,
                        const struct kern_layout *lay, const struct kern_recipe *rec, uint32_t l,
                        const void *src, uint8_t *sect, const uint8_t *kmerge,
                        const struct kern_key_stats *lst)
{
    const struct kern_ext_ctx c = {
        .lay = lay,
        .rec = rec,
        .layer = l,
        .rawk = (const uint8_t *)src + 2 * kern_raw_index(lay, l, 0, 0, 0),
        .rawv = lay->k_only ? NULL : (const uint8_t *)src + 2 * kern_raw_index(lay, l, 1, 0, 0),
        .kmerge = kmerge,
        .kmin = lst ? lst->kmin : NULL,
        .kmax = lst ? lst->kmax : NULL,
        .knorm = lst ? lst->knorm : NULL,
    };
    if (codec == KERN_CODEC_MERGE)
        return kern_merge_enc(ops, is_v, &c, sect);
    if (codec == KERN_CODEC_LOWRANK)
        return kern_lowrank_enc(ops, &c, sect);
    return kern_rot_enc(ops, codec, &c, sect);
}

static int kern_ext_dec(const struct kern_cpu_ops *ops, uint32_t codec,
                        const struct kern_layout *lay, const uint8_t *sect, void *raw,
                        uint32_t out_dtype)
{
    if (codec == KERN_CODEC_MERGE)
        return kern_merge_dec(ops, lay, sect, raw, out_dtype);
    if (codec == KERN_CODEC_LOWRANK)
        return kern_lowrank_dec(ops, lay, sect, raw, out_dtype);
    return kern_rot_dec(ops, codec, lay, sect, raw, out_dtype);
}

int kern_block_raw_heads(const void *src, size_t src_len, uint8_t *out)
{
    struct kern_layout l;
    struct kern_block_hdr h;
    int64_t sz = kern_block_info(src, src_len, &l, NULL);
    if (sz < 0)
        return (int)sz;
    memcpy(&h, src, sizeof(h));
    uint64_t lh = (uint64_t)l.layers * l.heads;
    for (uint64_t i = 0; i < lh; i++) {
        uint16_t s = 0;
        if (h.reserved)
            memcpy(&s, (const uint8_t *)src + (uint32_t)h.reserved + 2 * i, 2);
        out[i] = s != 0;
    }
    return (int)(h.reserved >> 32);
}

/* Writes the raw-head appendix of rec into the encoded block dst (its sections written). */
static void rawh_write(const struct kern_layout *lay, const struct kern_recipe *rec,
                       const void *src, uint8_t *dst)
{
    uint32_t n = kern_rawh_count(lay, rec), kinds = kern_kinds(lay), slot = 0;
    struct kern_block_hdr h;
    if (!n)
        return;
    memcpy(&h, dst, sizeof(h));
    uint64_t off = h.total_bytes, tab = kern_rawh_table_bytes(lay);
    uint64_t hb = kern_rawh_head_bytes(lay), rowb = 2ull * lay->head_dim;
    memset(dst + off, 0, kern_rawh_bytes(lay, n));
    for (uint32_t l = 0; l < lay->layers; l++)
        for (uint32_t hd = 0; hd < lay->heads; hd++) {
            if (!rec->raw_heads[(uint64_t)l * lay->heads + hd])
                continue;
            uint16_t s = (uint16_t)++slot;
            memcpy(dst + off + 2 * ((uint64_t)l * lay->heads + hd), &s, 2);
            uint8_t *rows = dst + off + tab + (uint64_t)(slot - 1) * hb;
            for (uint32_t k = 0; k < kinds; k++)
                for (uint32_t t = 0; t < lay->tokens; t++)
                    memcpy(rows + ((uint64_t)k * lay->tokens + t) * rowb,
                           (const uint8_t *)src + 2 * kern_raw_index(lay, l, k, t, hd), rowb);
        }
    h.reserved = (uint64_t)n << 32 | (uint32_t)off;
    h.total_bytes = off + kern_rawh_bytes(lay, n);
    memcpy(dst, &h, sizeof(h));
}

/* Overwrites the raw heads of the decoded block dst with the appendix's bytes. */
static void rawh_apply(const struct kern_layout *lay, const uint8_t *src, void *dst,
                       enum kern_dtype out_dtype)
{
    struct kern_block_hdr h;
    memcpy(&h, src, sizeof(h));
    if (!h.reserved)
        return;
    uint64_t off = (uint32_t)h.reserved, tab = kern_rawh_table_bytes(lay);
    uint64_t hb = kern_rawh_head_bytes(lay), D = lay->head_dim;
    for (uint32_t l = 0; l < lay->layers; l++)
        for (uint32_t hd = 0; hd < lay->heads; hd++) {
            uint16_t s;
            memcpy(&s, src + off + 2 * ((uint64_t)l * lay->heads + hd), 2);
            if (!s)
                continue;
            const uint8_t *rows = src + off + tab + (uint64_t)(s - 1) * hb;
            for (uint32_t k = 0; k < kern_kinds(lay); k++)
                for (uint32_t t = 0; t < lay->tokens; t++) {
                    const uint8_t *from = rows + ((uint64_t)k * lay->tokens + t) * 2 * D;
                    uint64_t to = kern_raw_index(lay, l, k, t, hd);
                    if (out_dtype == lay->dtype)
                        memcpy((uint8_t *)dst + 2 * to, from, 2 * D);
                    else /* as raw sections: NaN and Inf kept */
                        for (uint64_t d = 0; d < D; d++)
                            kern_store(dst, out_dtype, to + d, kern_load(from, lay->dtype, d));
                }
        }
}

int64_t kern_merge_forced(const struct kern_layout *lay, const struct kern_recipe *rec,
                          const void *src)
{
    int64_t n = kern_encoded_size(lay, rec);
    uint64_t forced = 0;
    if (n < 0)
        return n;
    if (!src)
        return -EINVAL;
    for (uint32_t l = 0; l < lay->layers; l++) {
        if (rec->codec[l][0] != KERN_CODEC_MERGE &&
            (lay->k_only || rec->codec[l][1] != KERN_CODEC_MERGE))
            continue;
        const struct kern_ext_ctx c = {
            .lay = lay,
            .rec = rec,
            .layer = l,
            .rawk = (const uint8_t *)src + 2 * kern_raw_index(lay, l, 0, 0, 0),
            .rawv = lay->k_only ? NULL : (const uint8_t *)src + 2 * kern_raw_index(lay, l, 1, 0, 0),
        };
        uint64_t f = kern_merge_count_forced(&c);
        if (f == UINT64_MAX)
            return -ENOMEM;
        forced += f;
    }
    return (int64_t)forced;
}

int kern_merge_may_force(const struct kern_layout *lay, const struct kern_recipe *rec,
                         const void *enc, size_t len)
{
    struct kern_layout el;
    struct kern_recipe er;
    const int64_t n = kern_encoded_size(lay, rec);
    if (n < 0)
        return (int)n;
    if (!enc)
        return -EINVAL;
    /* the table checked against the layout, every section inside the block (kern_block_info
     * rebuilds it), and the block the one this layout and recipe encode to */
    const int64_t got = kern_block_info(enc, len, &el, &er);
    if (got < 0)
        return (int)got;
    if (got != n || el.layers != lay->layers || el.heads != lay->heads ||
        el.head_dim != lay->head_dim || el.tokens != lay->tokens || el.dtype != lay->dtype ||
        el.k_only != lay->k_only)
        return -EBADMSG;
    const uint32_t kinds = kern_kinds(lay), R = kern_merge_rows(lay->tokens);
    const uint64_t hb = kern_merge_head_bytes(lay->head_dim, lay->tokens);
    for (uint32_t l = 0; l < lay->layers; l++)
        for (uint32_t k = 0; k < kinds; k++) {
            struct kern_block_sect s;
            if (er.codec[l][k] != rec->codec[l][k])
                return -EBADMSG;
            if (er.codec[l][k] != KERN_CODEC_MERGE)
                continue;
            memcpy(&s,
                   (const uint8_t *)enc + sizeof(struct kern_block_hdr) +
                       (l * kinds + k) * sizeof(s),
                   sizeof(s));
            /* kern_block_info checked the table, but enc may be memory others write (the
             * quantize worker's arena slot): the section read again here is checked again */
            if (s.offset > len || len - s.offset < (uint64_t)lay->heads * hb)
                return -EBADMSG;
            for (uint32_t h = 0; h < lay->heads; h++) {
                uint32_t rows;
                memcpy(&rows, (const uint8_t *)enc + s.offset + h * hb, 4);
                if (rows == 0 || rows > R)
                    return -EBADMSG;
                /* the plan counts a token forced only while the head holds R rows: a head
                 * whose rows end under R forced none */
                if (rows == R)
                    return 1;
            }
        }
    return 0;
}

/* The key statistics of a transform codec's K section (raw: its [T][H][D] rows) into the
 * layer's lst: in one pass in memory order where the ops have it (a RAW section's statistics
 * pass: it writes nothing to the section), else head by head. x: the driver's scratch. */
static void ext_stats(const struct kern_cpu_ops *ops, const struct kern_layout *lay,
                      const uint8_t *raw, uint8_t *sect, float *x, const struct kern_key_stats *lst)
{
    const uint32_t H = lay->heads, D = lay->head_dim;
    if (ops->enc_sect &&
        ops->enc_sect(KERN_CODEC_RAW, 0, raw, lay, sect, x, lst->kmin, lst->kmax, lst->knorm))
        return;
    for (uint32_t h = 0; h < H; h++) {
        ops->load(raw + 2ull * h * D, lay->dtype, (uint64_t)H * D, lay->tokens, D, x);
        ops->stats(x, lay->tokens, D, lst->kmin + (uint64_t)h * D, lst->kmax + (uint64_t)h * D,
                   lst->knorm + h);
    }
}

static int64_t encode_with(const struct kern_cpu_ops *ops, const struct kern_layout *lay,
                           const struct kern_recipe *rec, const void *src, void *dst,
                           size_t dst_cap, const struct kern_key_stats *st)
{
    float *x = NULL;
    int64_t ret = kern_encoded_size(lay, rec);
    int want_stats = st && (st->kmin || st->kmax || st->knorm);

    if (ret < 0)
        goto out;
    if (!src || !dst || (want_stats && !(st->kmin && st->kmax && st->knorm))) {
        ret = -EINVAL;
        goto out;
    }
    if ((uint64_t)ret > dst_cap) {
        ret = -ENOSPC;
        goto out;
    }
    size_t nx = (size_t)lay->tokens * lay->head_dim;
    if (nx < 4 * (size_t)lay->heads * lay->head_dim)
        nx = 4 * (size_t)lay->heads * lay->head_dim;
    x = malloc(nx * sizeof(float));
    if (!x) {
        ret = -ENOMEM;
        goto out;
    }
    uint8_t *out = dst;
    uint32_t kinds = kern_kinds(lay), H = lay->heads, D = lay->head_dim;
    uint64_t stride = (uint64_t)H * D;
    kern_hdr_build(lay, rec, out);
    for (uint32_t l = 0; l < lay->layers; l++) {
        const uint8_t *kmerge = NULL; /* this layer's MERGE K section, once written */
        for (uint32_t k = 0; k < kinds; k++) {
            struct kern_block_sect s;
            memcpy(&s, out + sizeof(struct kern_block_hdr) + (l * kinds + k) * sizeof(s),
                   sizeof(s));
            uint8_t *sect = out + s.offset;
            uint32_t end = (s.offset + s.bytes + KERN_ALIGN - 1) & ~(KERN_ALIGN - 1);
            memset(sect + s.bytes, 0, end - s.offset - s.bytes);
            const uint8_t *raw = (const uint8_t *)src + 2 * kern_raw_index(lay, l, k, 0, 0);
            int stats_here = want_stats && k == 0;
            /* a transform codec's section, or the plain codec a section of it is */
            const uint32_t codec = kern_codec_as(s.codec, k == 1);
            if (codec == KERN_CODEC_RAW)
                memcpy(sect, raw, s.bytes);
            if (codec == KERN_CODEC_RAW && !stats_here)
                continue;
            if (kern_codec_ext(s.codec, k == 1)) {
                /* MERGE's K pass takes the statistics on its way where it can (the AVX-512
                 * pass, kern_merge512.c), else they follow it; the other codecs' come first */
                const struct kern_key_stats lst = {
                    stats_here ? st->kmin + (uint64_t)l * H * D : NULL,
                    stats_here ? st->kmax + (uint64_t)l * H * D : NULL,
                    stats_here ? st->knorm + (uint64_t)l * H : NULL,
                };
                const int in_pass = stats_here && codec == KERN_CODEC_MERGE;
                if (stats_here && !in_pass)
                    ext_stats(ops, lay, raw, sect, x, &lst);
                int rc = kern_ext_enc(ops, codec, k == 1, lay, rec, l, src, sect,
                                      k == 1 ? kmerge : NULL, in_pass ? &lst : NULL);
                if (rc < 0) {
                    ret = rc;
                    goto out;
                }
                if (in_pass && rc == 0)
                    ext_stats(ops, lay, raw, sect, x, &lst);
                if (k == 0 && codec == KERN_CODEC_MERGE)
                    kmerge = sect;
                continue;
            }
            uint64_t lhd = (uint64_t)l * H * D;
            if (ops->enc_sect &&
                ops->enc_sect(codec, k == 1, raw, lay, sect, x, stats_here ? st->kmin + lhd : NULL,
                              stats_here ? st->kmax + lhd : NULL,
                              stats_here ? st->knorm + (uint64_t)l * H : NULL))
                continue;
            for (uint32_t h = 0; h < H; h++) {
                if (!stats_here && ops->enc_raw &&
                    ops->enc_raw(codec, k == 1, raw + 2ull * h * D, lay, h, sect))
                    continue;
                ops->load(raw + 2ull * h * D, lay->dtype, stride, lay->tokens, D, x);
                if (stats_here) {
                    uint64_t lh = (uint64_t)l * H + h;
                    ops->stats(x, lay->tokens, D, st->kmin + lh * D, st->kmax + lh * D,
                               st->knorm + lh);
                }
                if (codec != KERN_CODEC_RAW)
                    ops->enc(codec, k == 1, x, lay, h, sect);
            }
        }
    }
    rawh_write(lay, rec, src, out);
out:
    free(x);
    return ret;
}

/* The first bytes of section i of the encoded block `in` (its table checked by
 * kern_block_info), asked for while the section before it decodes: a decoder's first reads
 * of a section otherwise wait on memory a line at a time before the hardware prefetcher
 * follows (LOWRANK's factors, MERGE's rows of eight heads at once). */
#define KERN_DEC_PREFETCH_BYTES 4096u
static void dec_prefetch_next(const uint8_t *in, uint32_t i)
{
    struct kern_block_sect s;
    memcpy(&s, in + sizeof(struct kern_block_hdr) + i * sizeof(s), sizeof(s));
    const uint32_t n = s.bytes < KERN_DEC_PREFETCH_BYTES ? s.bytes : KERN_DEC_PREFETCH_BYTES;
    for (uint32_t b = 0; b < n; b += 64)
        __builtin_prefetch(in + s.offset + b);
}

/* Layer l's sections where its keys are LOWRANK and its values q8_0 (LOWRANK's own, or a
 * recipe's), decoded together by kern_lowrank_dec_kv(): 1 done, 0 not taken, -ENOMEM. */
static int dec_lowrank_layer(const struct kern_cpu_ops *ops, const struct kern_layout *lay,
                             const uint8_t *in, uint32_t l, void *dst, uint32_t out_dtype)
{
    struct kern_block_sect s[2];
    if (lay->k_only)
        return 0;
    memcpy(s, in + sizeof(struct kern_block_hdr) + 2 * l * sizeof(s[0]), sizeof(s));
    if (s[0].codec != KERN_CODEC_LOWRANK || kern_codec_as(s[1].codec, 1) != KERN_CODEC_Q8_0)
        return 0;
    /* the next layer's two sections, asked for while this one decodes: the table is the one
     * kern_hdr_build() gives (kern_block_info), sections in order inside the block */
    const uint8_t *next = NULL;
    uint64_t nb = 0;
    if (l + 1 < lay->layers) {
        struct kern_block_sect t[2];
        memcpy(t, in + sizeof(struct kern_block_hdr) + 2 * (l + 1) * sizeof(t[0]), sizeof(t));
        dec_prefetch_next(in, 2 * (l + 1));
        next = in + t[0].offset;
        nb = (uint64_t)t[1].offset + t[1].bytes - t[0].offset;
    }
    return kern_lowrank_dec_kv(ops, lay, in + s[0].offset, in + s[1].offset,
                               (uint8_t *)dst + 2 * kern_raw_index(lay, l, 0, 0, 0),
                               (uint8_t *)dst + 2 * kern_raw_index(lay, l, 1, 0, 0), out_dtype,
                               next, nb);
}

/* Layer l's sections where its keys are ROT2/ROT4 and its values KIVI value groups of the same
 * bits (ROT's own, or a recipe's KIVI), decoded together by kern_rot_dec_kv(): 1 done, 0 not
 * taken, -ENOMEM. */
static int dec_rot_layer(const struct kern_cpu_ops *ops, const struct kern_layout *lay,
                         const uint8_t *in, uint32_t l, void *dst, uint32_t out_dtype)
{
    struct kern_block_sect s[2];
    if (lay->k_only)
        return 0;
    memcpy(s, in + sizeof(struct kern_block_hdr) + 2 * l * sizeof(s[0]), sizeof(s));
    const uint32_t kivi = s[0].codec == KERN_CODEC_ROT2   ? KERN_CODEC_KIVI2
                          : s[0].codec == KERN_CODEC_ROT4 ? KERN_CODEC_KIVI4
                                                          : KERN_CODEC_COUNT;
    if (kivi == KERN_CODEC_COUNT || kern_codec_as(s[1].codec, 1) != kivi)
        return 0;
    if (l + 1 < lay->layers)
        dec_prefetch_next(in, 2 * (l + 1));
    return kern_rot_dec_kv(ops, s[0].codec, lay, in + s[0].offset, in + s[1].offset,
                           (uint8_t *)dst + 2 * kern_raw_index(lay, l, 0, 0, 0),
                           (uint8_t *)dst + 2 * kern_raw_index(lay, l, 1, 0, 0), out_dtype);
}

static int64_t decode_with(const struct kern_cpu_ops *ops, const struct kern_layout *lay,
                           const void *src, size_t src_len, void *dst, size_t dst_cap,
                           enum kern_dtype out_dtype)
{
    struct kern_layout bl;
    float *y = NULL;
    int64_t ret;

    if (kern_layout_check(lay) < 0 || !src || !dst ||
        (out_dtype != KERN_DTYPE_FP16 && out_dtype != KERN_DTYPE_BF16)) {
        ret = -EINVAL;
        goto out;
    }
    ret = kern_block_info(src, src_len, &bl, NULL);
    if (ret < 0)
        goto out;
    if (bl.layers != lay->layers || bl.heads != lay->heads || bl.head_dim != lay->head_dim ||
        bl.tokens != lay->tokens || bl.k_only != lay->k_only || bl.dtype != lay->dtype) {
        ret = -EBADMSG;
        goto out;
    }
    ret = (int64_t)kern_raw_size(lay);
    if ((uint64_t)ret > dst_cap) {
        ret = -ENOSPC;
        goto out;
    }
    size_t ny = (size_t)lay->tokens * lay->head_dim;
    if (ny < 2 * (size_t)lay->heads * lay->head_dim)
        ny = 2 * (size_t)lay->heads * lay->head_dim;
    y = malloc(ny * sizeof(float));
    if (!y) {
        ret = -ENOMEM;
        goto out;
    }
    const uint8_t *in = src;
    uint32_t kinds = kern_kinds(lay), H = lay->heads, D = lay->head_dim;
    uint64_t stride = (uint64_t)H * D;
    for (uint32_t l = 0; l < lay->layers; l++) {
        int both = dec_lowrank_layer(ops, lay, in, l, dst, out_dtype);
        if (both == 0)
            both = dec_rot_layer(ops, lay, in, l, dst, out_dtype);
        if (both < 0) {
            ret = both;
            goto out;
        }
        for (uint32_t k = 0; k < kinds && !both; k++) {
            struct kern_block_sect s;
            memcpy(&s, in + sizeof(struct kern_block_hdr) + (l * kinds + k) * sizeof(s), sizeof(s));
            const uint8_t *sect = in + s.offset;
            if (l * kinds + k + 1 < lay->layers * kinds)
                dec_prefetch_next(in, l * kinds + k + 1);
            uint64_t base = kern_raw_index(lay, l, k, 0, 0);
            uint8_t *raw = (uint8_t *)dst + 2 * base;
            const uint32_t codec = kern_codec_as(s.codec, k == 1);
            if (codec == KERN_CODEC_RAW && lay->dtype == out_dtype) {
                memcpy(raw, sect, s.bytes);
            } else if (codec == KERN_CODEC_RAW) {
                /* a dtype change keeps NaN and Inf: raw sections are never sanitised */
                for (uint64_t i = 0; i < (uint64_t)lay->tokens * stride; i++)
                    kern_store(raw, out_dtype, i, kern_load(sect, lay->dtype, i));
            } else if (kern_codec_ext(s.codec, k == 1)) {
                int rc = kern_ext_dec(ops, codec, lay, sect, raw, out_dtype);
                if (rc < 0) {
                    ret = rc;
                    goto out;
                }
            } else if (!ops->dec_sect ||
                       !ops->dec_sect(codec, k == 1, sect, lay, raw, out_dtype, y)) {
                for (uint32_t h = 0; h < H; h++) {
                    if (ops->dec_raw &&
                        ops->dec_raw(codec, k == 1, sect, lay, h, raw + 2ull * h * D, out_dtype))
                        continue;
                    ops->dec(codec, k == 1, sect, lay, h, y);
                    ops->store(y, lay->tokens, D, raw + 2ull * h * D, out_dtype, stride);
                }
            }
        }
    }
    rawh_apply(lay, in, dst, out_dtype);
out:
    free(y);
    return ret;
}

int64_t kern_encode_ref(const struct kern_layout *lay, const struct kern_recipe *rec,
                        const void *src, void *dst, size_t dst_cap,
                        const struct kern_key_stats *stats)
{
    return encode_with(&kern_ref_ops, lay, rec, src, dst, dst_cap, stats);
}

int64_t kern_decode_ref(const struct kern_layout *lay, const void *src, size_t src_len, void *dst,
                        size_t dst_cap, enum kern_dtype out_dtype)
{
    return decode_with(&kern_ref_ops, lay, src, src_len, dst, dst_cap, out_dtype);
}

static const struct kern_cpu_ops *cpu_ops(void)
{
    const struct kern_cpu_ops *o = kern_avx2_ops();
    return o ? o : &kern_ref_ops;
}

int64_t kern_encode_cpu(const struct kern_layout *lay, const struct kern_recipe *rec,
                        const void *src, void *dst, size_t dst_cap,
                        const struct kern_key_stats *stats)
{
    return encode_with(cpu_ops(), lay, rec, src, dst, dst_cap, stats);
}

int64_t kern_decode_cpu(const struct kern_layout *lay, const void *src, size_t src_len, void *dst,
                        size_t dst_cap, enum kern_dtype out_dtype)
{
    return decode_with(cpu_ops(), lay, src, src_len, dst, dst_cap, out_dtype);
}

/* The CUDA encoder's units and phases (kern_encb.h), every thread of a unit in turn. */
int64_t kern_encode_batched_cpu(const struct kern_layout *lay, const struct kern_recipe *rec,
                                const void *src, void *dst, size_t dst_cap)
{
    int64_t sz = kern_encoded_size(lay, rec);
    if (sz < 0)
        return sz;
    if (!src || !dst)
        return -EINVAL;
    if (kern_rawh_count(lay, rec))
        return -ENOTSUP; /* the CUDA encoder's units write no raw-head appendix */
    if ((uint64_t)sz > dst_cap)
        return -ENOSPC;
    struct kern_enc_args *a = malloc(sizeof(*a));
    struct kern_enc_smem *sm = malloc(sizeof(*sm));
    if (!a || !sm) {
        free(a);
        free(sm);
        return -ENOMEM;
    }
    kern_enc_args_fill(a, lay, rec, src);
    for (uint32_t u = 0; u <= a->nunits; u++)
        for (int ph = 0; ph < (int)kern_enc_phases(a, u); ph++)
            for (uint32_t t = 0; t < KERN_ENC_THREADS; t++)
                kern_enc_unit(a, u, ph, src, dst, sm, t, KERN_ENC_THREADS);
    free(a);
    free(sm);
    return sz;
}

unsigned kern_supports(void)
{
    unsigned s = 0;
    if (kern_avx2_ops())
        s |= KERN_SUPPORT_CPU_AVX2;
    if (KVC_CUDA)
        s |= KERN_SUPPORT_CUDA_BUILT;
    return s;
}
