/*
 * kern_pack.c — gather/scatter on the CPU: the scalar reference and the row-wise version
 * (see kern_pack.h); the batches of the CUDA twins (kern_batch.h: built here, run here row
 * by row for the emulation and the fake device); decoding into the engine's tensors; and the
 * CUDA twins' stand-ins in a build without CUDA.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern.h"
#include "kernels/kern_batch.h"
#include "kernels/kern_pack.h"

/* The emulated decoder's loads by what and width (kern_batch_ld_as), for the tests. */
uint64_t kern_batch_ld_count[2][5];
uint64_t kern_batch_kivik_pieces;
uint64_t kern_batch_rotk_pieces;
uint64_t kern_batch_lrm_pieces;

uint64_t kern_pack_block_bytes(const struct kern_pack_layout *lay)
{
    return (uint64_t)lay->layers * lay->kinds * lay->block_tokens * lay->heads * lay->head_dim *
           lay->elem_bytes;
}

int kern_pack_check(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                    uint64_t first_token, uint32_t nblocks, int check_table)
{
    uint64_t row;
    if (!lay || !eng || lay->layers == 0 || lay->layers > KERN_PACK_MAX_LAYERS ||
        (lay->kinds != 1 && lay->kinds != 2) || lay->block_tokens == 0 || lay->heads == 0 ||
        lay->head_dim == 0 ||
        (lay->elem_bytes != 1 && lay->elem_bytes != 2 && lay->elem_bytes != 4))
        return -EINVAL;
    if (!eng->k || (lay->kinds == 2 && !eng->v) || !eng->block_table || eng->page_tokens == 0)
        return -EINVAL;
    row = (uint64_t)lay->head_dim * lay->elem_bytes;
    /* A head row must not overlap the next head, nor the heads the next token. */
    if (lay->heads > 1 && eng->head_stride < row)
        return -EINVAL;
    if (eng->token_stride < (uint64_t)(lay->heads - 1) * eng->head_stride + row)
        return -EINVAL;
    uint64_t end = first_token + (uint64_t)nblocks * lay->block_tokens;
    if (nblocks && (end - 1) / eng->page_tokens >= eng->table_len)
        return -EINVAL;
    if (check_table)
        for (uint64_t pg = first_token / eng->page_tokens;
             nblocks && pg <= (end - 1) / eng->page_tokens; pg++)
            if (eng->block_table[pg] < 0)
                return -EINVAL;
    return 0;
}

int kern_pack_contiguous(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng)
{
    const uint64_t row = (uint64_t)lay->head_dim * lay->elem_bytes;
    /* the heads of a token back to back, and the tokens of a page back to back */
    return (lay->heads == 1 || eng->head_stride == row) && eng->token_stride == row * lay->heads;
}

/* Address of (layer, kind, sequence token p, head) in the engine's tensors. */
static char *kern_pack_engine_at(const struct kern_pack_engine *eng, uint32_t l, uint32_t k,
                                 uint64_t p, uint32_t h)
{
    char *base = (char *)(k ? eng->v[l] : eng->k[l]);
    uint64_t page = (uint64_t)eng->block_table[p / eng->page_tokens];
    return base + page * eng->page_stride + (p % eng->page_tokens) * eng->token_stride +
           (uint64_t)h * eng->head_stride;
}

int kern_pack_ref(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                  uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir)
{
    int rc = kern_pack_check(lay, eng, first_token, nblocks, 1);
    if (rc)
        return rc;
    if ((dir != KERN_PACK_GATHER && dir != KERN_PACK_SCATTER) || (nblocks && !blocks))
        return -EINVAL;
    const uint32_t E = lay->elem_bytes;
    for (uint32_t b = 0; b < nblocks; b++) {
        char *blk = blocks[b];
        uint64_t i = 0; /* canonical element index */
        for (uint32_t l = 0; l < lay->layers; l++)
            for (uint32_t k = 0; k < lay->kinds; k++)
                for (uint32_t t = 0; t < lay->block_tokens; t++)
                    for (uint32_t h = 0; h < lay->heads; h++)
                        for (uint32_t d = 0; d < lay->head_dim; d++, i++) {
                            uint64_t p = first_token + (uint64_t)b * lay->block_tokens + t;
                            char *e = kern_pack_engine_at(eng, l, k, p, h) + (uint64_t)d * E;
                            if (dir == KERN_PACK_GATHER)
                                memcpy(blk + i * E, e, E);
                            else
                                memcpy(e, blk + i * E, E);
                        }
    }
    return 0;
}

int kern_pack_cpu(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                  uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir)
{
    int rc = kern_pack_check(lay, eng, first_token, nblocks, 1);
    if (rc)
        return rc;
    if ((dir != KERN_PACK_GATHER && dir != KERN_PACK_SCATTER) || (nblocks && !blocks))
        return -EINVAL;
    const uint64_t row = (uint64_t)lay->head_dim * lay->elem_bytes;
    for (uint32_t b = 0; b < nblocks; b++) {
        char *out = blocks[b];
        for (uint32_t l = 0; l < lay->layers; l++)
            for (uint32_t k = 0; k < lay->kinds; k++)
                for (uint32_t t = 0; t < lay->block_tokens; t++) {
                    uint64_t p = first_token + (uint64_t)b * lay->block_tokens + t;
                    char *e = kern_pack_engine_at(eng, l, k, p, 0);
                    /* Heads packed back to back in the engine too: one copy for the token. */
                    if (eng->head_stride == row) {
                        if (dir == KERN_PACK_GATHER)
                            memcpy(out, e, row * lay->heads);
                        else
                            memcpy(e, out, row * lay->heads);
                        out += row * lay->heads;
                        continue;
                    }
                    for (uint32_t h = 0; h < lay->heads; h++, out += row, e += eng->head_stride) {
                        if (dir == KERN_PACK_GATHER)
                            memcpy(out, e, row);
                        else
                            memcpy(e, out, row);
                    }
                }
    }
    return 0;
}

int64_t kern_pack_runs(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                       uint64_t first_token, uint32_t nblocks, void *const *blocks,
                       uint64_t min_len, void **eptr, void **bptr, uint64_t *len, uint64_t max)
{
    int rc = kern_pack_check(lay, eng, first_token, nblocks, 1);
    if (rc)
        return rc;
    if (!kern_pack_contiguous(lay, eng))
        return -ENOTSUP;
    if (eptr && (!blocks || !bptr || !len))
        return -EINVAL;
    const uint64_t tok = (uint64_t)lay->heads * lay->head_dim * lay->elem_bytes;
    const uint32_t T = lay->block_tokens, pt = eng->page_tokens;
    uint64_t n = 0;
    for (uint32_t j = 0; j < nblocks; j++) {
        if (blocks && !blocks[j])
            continue; /* not this call's block */
        const uint64_t t0 = first_token + (uint64_t)j * T;
        for (uint32_t l = 0; l < lay->layers; l++)
            for (uint32_t k = 0; k < lay->kinds; k++) {
                uint8_t *base = (uint8_t *)(k ? eng->v[l] : eng->k[l]);
                const uint64_t sect = ((uint64_t)l * lay->kinds + k) * T * tok;
                for (uint64_t a = t0; a < t0 + T;) {
                    const uint64_t pg = a / pt, slot = a - pg * pt;
                    const uint64_t b = t0 + T < (pg + 1) * pt ? t0 + T : (pg + 1) * pt;
                    const uint64_t bytes = (b - a) * tok;
                    if (bytes < min_len)
                        return -ENOTSUP; /* too short a DMA: the caller stages */
                    if (eptr) {
                        uint8_t *e = base + (uint64_t)eng->block_table[pg] * eng->page_stride +
                                     slot * eng->token_stride;
                        uint8_t *bl = (uint8_t *)blocks[j] + sect + (a - t0) * tok;
                        if (n && (uint8_t *)eptr[n - 1] + len[n - 1] == e &&
                            (uint8_t *)bptr[n - 1] + len[n - 1] == bl) {
                            len[n - 1] += bytes; /* continues the piece before on both sides */
                        } else {
                            if (n == max)
                                return -E2BIG;
                            eptr[n] = e;
                            bptr[n] = bl;
                            len[n++] = bytes;
                        }
                    } else {
                        n++;
                    }
                    a = b;
                }
            }
    }
    return (int64_t)n;
}

/* ---- batches ------------------------------------------------------------------------ */

/* The pages the tokens of nblocks blocks from first_token touch: [*page0, *page0 + *npages). */
static void kern_batch_pages(const struct kern_pack_engine *eng, uint32_t block_tokens,
                             uint64_t first_token, uint32_t nblocks, uint64_t *page0,
                             uint32_t *npages)
{
    uint64_t end = first_token + (uint64_t)nblocks * block_tokens;
    *page0 = first_token / eng->page_tokens;
    *npages = nblocks ? (uint32_t)((end - 1) / eng->page_tokens - *page0 + 1) : 0;
}

/* log2(x) when x is a power of two, else 32 (the kernel divides). */
static uint32_t kern_batch_log2(uint64_t x)
{
    return x && (x & (x - 1)) == 0 ? (uint32_t)__builtin_ctzll(x) : 32;
}

/* Rows per step and the step count: R = 2^rshift consecutive tokens of one (block, layer,
 * kind) per warp step, the largest power of two that divides the block's tokens with R token
 * rows (tok_bytes each) in KERN_BATCH_STEP_BYTES; items per token row. -E2BIG when the steps
 * do not fit the kernel's 32-bit count (the callers split the batch). */
static int kern_batch_steps_set(struct kern_batch *b, uint64_t tok_bytes, uint64_t items)
{
    if (items > UINT32_MAX)
        return -EINVAL; /* a token row of more than 4 G accesses: no engine has one */
    uint32_t r = 0;
    while (r < 31 && (b->block_tokens & ((2u << r) - 1)) == 0 &&
           (tok_bytes << (r + 1)) <= KERN_BATCH_STEP_BYTES)
        r++;
    uint64_t steps = (uint64_t)b->nblocks * b->layers * b->kinds * (b->block_tokens >> r);
    if (steps > KERN_BATCH_MAX_STEPS)
        return -E2BIG;
    b->rshift = r;
    b->groups = b->block_tokens >> r;
    b->steps = (uint32_t)steps;
    b->items = (uint32_t)items;
    b->item_shift = kern_batch_log2(items);
    return 0;
}

/* A decode step holds at most KERN_GROUP rows, so that a KIVI key step's tokens lie in one
 * group and share its channels' scales and mins (kern_batch_kivik_lane): only rows of 64 bytes
 * or less (head_dim x heads <= 32) made more in 2 KiB. -E2BIG when the steps do not fit. */
static int kern_batch_decode_group(struct kern_batch *b)
{
    if ((1u << b->rshift) <= KERN_GROUP)
        return 0;
    const uint32_t r = (uint32_t)__builtin_ctz(KERN_GROUP);
    const uint64_t steps = (uint64_t)b->steps << (b->rshift - r);
    if (steps > KERN_BATCH_MAX_STEPS)
        return -E2BIG;
    b->steps = (uint32_t)steps;
    b->rshift = r;
    b->groups = b->block_tokens >> r;
    return 0;
}

/* A decode step reads and checks its block's header and section before its rounds (lane 0,
 * then a shuffle: a few hundred instructions of the warp's, about the cost of its pieces
 * when a step is one 2 KiB token row). Where a batch has steps to spare — more than
 * KERN_BATCH_DECODE_SPARE, about two per warp of a large GPU's grid (132 multiprocessors x
 * 32 warps) — its steps take more rows, up to KERN_BATCH_DECODE_STEP_BYTES of output each,
 * so that the read is paid for more pieces; a small batch keeps its steps, and with them its
 * warps. R stays a power of two dividing the block's tokens. */
#define KERN_BATCH_DECODE_SPARE 8192u
#define KERN_BATCH_DECODE_STEP_BYTES 8192u

static void kern_batch_decode_widen(struct kern_batch *b, uint64_t tok_bytes)
{
    uint32_t r = b->rshift;
    while ((2u << r) <= KERN_GROUP && (b->block_tokens & ((2u << r) - 1)) == 0 &&
           (tok_bytes << (r + 1)) <= KERN_BATCH_DECODE_STEP_BYTES &&
           b->steps / 2 >= KERN_BATCH_DECODE_SPARE) {
        r++;
        b->steps /= 2;
    }
    b->rshift = r;
    b->groups = b->block_tokens >> r;
}

/* The header and the K/V, block and table words shared by both kinds of batch. blocks[j] +
 * block_off is block j's first byte; lens (decode only) its length. */
static int kern_batch_fill(struct kern_batch_args *a, uint32_t op,
                           const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                           uint64_t first_token, uint32_t nblocks, const void *const *blocks,
                           uint64_t block_off, const uint64_t *lens)
{
    struct kern_batch *b = &a->h;
    uint64_t page0;
    uint32_t npages;
    kern_batch_pages(eng, lay->block_tokens, first_token, nblocks, &page0, &npages);
    uint64_t kv = (uint64_t)lay->layers * lay->kinds;
    uint64_t words = kv + (uint64_t)nblocks * (lens ? 2 : 1) + (npages + 1ull) / 2;
    /* the kernel's slice-relative token indices are 32-bit */
    uint64_t rel_end =
        first_token - page0 * eng->page_tokens + (uint64_t)nblocks * lay->block_tokens;
    if (words > KERN_BATCH_WORDS || rel_end > UINT32_MAX)
        return -E2BIG;
    memset(b, 0, sizeof(*b));
    b->op = op;
    b->layers = lay->layers;
    b->kinds = lay->kinds;
    b->block_tokens = lay->block_tokens;
    b->heads = lay->heads;
    b->head_dim = lay->head_dim;
    b->elem_bytes = lay->elem_bytes;
    b->nblocks = nblocks;
    b->page_tokens = eng->page_tokens;
    b->pt_shift = kern_batch_log2(eng->page_tokens);
    b->page0 = page0;
    b->off0 = (uint32_t)(first_token - page0 * eng->page_tokens);
    b->npages = npages;
    b->page_stride = eng->page_stride;
    b->token_stride = eng->token_stride;
    b->head_stride = eng->head_stride;
    b->first_token = first_token;
    b->nwords = (uint32_t)words;
    uint64_t *w = a->w;
    for (uint32_t l = 0; l < lay->layers; l++) {
        w[l] = (uint64_t)(uintptr_t)eng->k[l];
        if (lay->kinds == 2)
            w[lay->layers + l] = (uint64_t)(uintptr_t)eng->v[l];
    }
    for (uint32_t j = 0; j < nblocks; j++) {
        /* NULL: a block this batch does not move */
        w[kv + j] = blocks[j] ? (uint64_t)(uintptr_t)blocks[j] + block_off : 0;
        if (lens)
            w[kv + nblocks + j] = blocks[j] ? lens[j] : 0;
    }
    uint32_t tab = (uint32_t)(kv + (uint64_t)nblocks * (lens ? 2 : 1));
    if (npages & 1)
        w[tab + npages / 2] = 0; /* the last word's unused half */
    memcpy((uint8_t *)(w + tab), eng->block_table + page0, (size_t)npages * 4);
    /* Bits every address the kernel forms is a sum of: their lowest set bit bounds the
     * access width. */
    uint64_t bits = lay->heads > 1 ? eng->head_stride : 0;
    bits |= eng->token_stride | (npages > 1 ? eng->page_stride : 0);
    for (uint32_t i = 0; i < kv; i++)
        bits |= w[i];
    b->vec = (uint32_t)bits; /* finished by the callers */
    return 0;
}

int kern_batch_pack(struct kern_batch_args *a, const struct kern_pack_layout *lay,
                    const struct kern_pack_engine *eng, uint64_t first_token, uint32_t nblocks,
                    void *const *blocks, uint64_t block_off, int dir)
{
    int rc = kern_pack_check(lay, eng, first_token, nblocks, 1);
    if (rc)
        return rc;
    if ((dir != KERN_PACK_GATHER && dir != KERN_PACK_SCATTER) || (nblocks && !blocks))
        return -EINVAL;
    rc = kern_batch_fill(a, dir == KERN_PACK_GATHER ? KERN_BATCH_GATHER : KERN_BATCH_SCATTER, lay,
                         eng, first_token, nblocks, (const void *const *)blocks, block_off, NULL);
    if (rc)
        return rc;
    uint64_t bits = a->h.vec | ((uint64_t)lay->head_dim * lay->elem_bytes);
    uint32_t kv = lay->layers * lay->kinds;
    for (uint32_t j = 0; j < nblocks; j++)
        bits |= a->w[kv + j];
    uint32_t vec = 16;
    while (vec > 1 && (bits & (vec - 1)))
        vec >>= 1;
    a->h.vec = vec;
    uint64_t tok = (uint64_t)lay->heads * lay->head_dim * lay->elem_bytes;
    rc = kern_batch_steps_set(&a->h, tok, tok / vec);
    if (rc || !kern_pack_contiguous(lay, eng))
        return rc;
    /* Runs: R tokens of a step one contiguous run in the engine as in the block, R the
     * largest power of two dividing the block's tokens, the page's and the offset of
     * first_token in its page (so a step never crosses a page), with R rows in
     * KERN_BATCH_RUN_BYTES. */
    uint32_t r = 0;
    const uint64_t m = (uint64_t)lay->block_tokens | eng->page_tokens | a->h.off0;
    while (r < 31 && (m & ((2ull << r) - 1)) == 0 && (tok << (r + 1)) <= KERN_BATCH_RUN_BYTES)
        r++;
    const uint64_t steps = (uint64_t)nblocks * lay->layers * lay->kinds * (lay->block_tokens >> r);
    if (steps > KERN_BATCH_MAX_STEPS)
        return -E2BIG;
    a->h.run = 1;
    a->h.rshift = r;
    a->h.groups = lay->block_tokens >> r;
    a->h.steps = (uint32_t)steps;
    return 0;
}

/* The engine side of a decode as a pack layout (2-byte elements), for kern_pack_check. */
static struct kern_pack_layout kern_decode_lay(const struct kern_layout *klay, uint32_t layers)
{
    return (struct kern_pack_layout){.layers = layers,
                                     .kinds = kern_kinds(klay),
                                     .block_tokens = klay->tokens,
                                     .heads = klay->heads,
                                     .head_dim = klay->head_dim,
                                     .elem_bytes = 2};
}

/* The arguments of a decode of nblocks blocks, checked (not the blocks themselves). */
int kern_decode_check(const struct kern_layout *klay, uint32_t layer_first, uint32_t layer_count,
                      const struct kern_pack_engine *eng, uint64_t first_token, uint32_t nblocks,
                      const void *const *src, const uint64_t *src_len, uint32_t out_dtype)
{
    if (!klay || kern_layout_check(klay) < 0 || layer_count == 0 || layer_first >= klay->layers ||
        layer_count > klay->layers - layer_first ||
        (out_dtype != KERN_DTYPE_FP16 && out_dtype != KERN_DTYPE_BF16) ||
        (nblocks && (!src || !src_len)))
        return -EINVAL;
    struct kern_pack_layout lay = kern_decode_lay(klay, layer_count);
    return kern_pack_check(&lay, eng, first_token, nblocks, 1);
}

int kern_batch_decode(struct kern_batch_args *a, const struct kern_layout *klay,
                      uint32_t layer_first, uint32_t layer_count,
                      const struct kern_pack_engine *eng, uint64_t first_token, uint32_t nblocks,
                      const void *const *src, const uint64_t *src_len, uint32_t out_dtype)
{
    int rc = kern_decode_check(klay, layer_first, layer_count, eng, first_token, nblocks, src,
                               src_len, out_dtype);
    if (rc)
        return rc;
    struct kern_pack_layout lay = kern_decode_lay(klay, layer_count);
    rc = kern_batch_fill(a, KERN_BATCH_DECODE, &lay, eng, first_token, nblocks, src, 0, src_len);
    if (rc)
        return rc;
    a->h.klay = *klay;
    a->h.layer_first = layer_first;
    a->h.out_dtype = out_dtype;
    a->h.vec = (a->h.vec & 15) == 0 ? 16 : 2;
    a->h.kivik = KERN_BATCH_COLS_KIVI | KERN_BATCH_COLS_ROT;
    const uint64_t tok = 2ull * klay->heads * klay->head_dim;
    rc = kern_batch_steps_set(&a->h, tok, (klay->head_dim + 7) / 8 * (uint64_t)klay->heads);
    if (rc == 0)
        rc = kern_batch_decode_group(&a->h);
    if (rc == 0)
        kern_batch_decode_widen(&a->h, tok);
    return rc;
}

int kern_batch_decode_raw(struct kern_batch_args *a, const struct kern_layout *klay, void *dst,
                          const uint32_t *pos, uint32_t nblocks, const void *const *src,
                          const uint64_t *src_len, uint32_t out_dtype)
{
    /* Raw blocks back to back are an engine: one page per block, the table the positions. */
    void *k[KERN_MAX_LAYERS], *v[KERN_MAX_LAYERS];
    int32_t tab[KERN_COPY_BATCH_MAX];
    if (!klay || kern_layout_check(klay) < 0 || !dst || nblocks > KERN_COPY_BATCH_MAX)
        return -EINVAL;
    uint64_t rs = kern_raw_size(klay);
    for (uint32_t l = 0; l < klay->layers; l++) {
        k[l] = (uint8_t *)dst + 2 * kern_raw_index(klay, l, 0, 0, 0);
        v[l] = klay->k_only ? NULL : (uint8_t *)dst + 2 * kern_raw_index(klay, l, 1, 0, 0);
    }
    for (uint32_t j = 0; j < nblocks; j++) {
        if (pos && pos[j] > INT32_MAX)
            return -EINVAL;
        tab[j] = (int32_t)(pos ? pos[j] : j);
    }
    struct kern_pack_engine eng = {.k = k,
                                   .v = klay->k_only ? NULL : v,
                                   .block_table = tab,
                                   .table_len = nblocks ? nblocks : 1,
                                   .page_tokens = klay->tokens,
                                   .page_stride = rs,
                                   .token_stride = 2ull * klay->heads * klay->head_dim,
                                   .head_stride = 2ull * klay->head_dim};
    if (nblocks == 0)
        tab[0] = 0;
    return kern_batch_decode(a, klay, 0, klay->layers, &eng, 0, nblocks, src, src_len, out_dtype);
}

void kern_batch_run_cpu(const struct kern_batch_args *a)
{
    /* a warp's lanes one after another: each does its share of the step, as on the device;
     * a decode step runs the warp's lanes itself, phase by phase (its ROT rows are
     * transformed across the lanes) */
    for (uint32_t s = 0; s < a->h.steps; s++) {
        if (a->h.op == KERN_BATCH_DECODE) {
            kern_batch_decode_step(&a->h, a->w, s, 0, a->h.kivik);
            continue;
        }
        for (uint32_t lane = 0; lane < KERN_BATCH_LANES; lane++)
            kern_batch_pack_step(&a->h, a->w, s, lane, KERN_BATCH_LANES);
    }
}

uint64_t kern_batch_nrows(const struct kern_batch_args *a)
{
    return kern_batch_rows(&a->h);
}

uint32_t kern_batch_nptrs(const struct kern_batch_args *a)
{
    return kern_batch_kv_words(&a->h) + a->h.nblocks;
}

const void *kern_batch_ptr_at(const struct kern_batch_args *a, uint32_t i, uint64_t *len)
{
    const struct kern_batch *b = &a->h;
    uint32_t kv = kern_batch_kv_words(b);
    if (i < kv) {
        *len = 1; /* a tensor's base: its extent is the engine's */
    } else if (b->op == KERN_BATCH_DECODE) {
        *len = a->w[kv + b->nblocks + (i - kv)];
    } else {
        *len = (uint64_t)b->layers * b->kinds * b->block_tokens * b->heads * b->head_dim *
               b->elem_bytes;
    }
    return (const void *)(uintptr_t)a->w[i];
}

/* Layers per batch: their K and V bases take at most a quarter of the words. */
static uint32_t kern_batch_layers_max(uint32_t kinds)
{
    return KERN_BATCH_WORDS / 4 / kinds;
}

int kern_pack_batches(struct kern_batch_args *a, const struct kern_pack_layout *lay,
                      const struct kern_pack_engine *eng, uint64_t first_token, uint32_t nblocks,
                      void *const *blocks, int dir,
                      int (*run)(const struct kern_batch_args *a, void *arg), void *arg)
{
    int rc = kern_pack_check(lay, eng, first_token, nblocks, 1);
    if (rc || nblocks == 0)
        return rc;
    const uint64_t lbytes = kern_pack_block_bytes(lay) / lay->layers;
    const uint32_t lmax = kern_batch_layers_max(lay->kinds);
    for (uint32_t l0 = 0; l0 < lay->layers; l0 += lmax) {
        struct kern_pack_layout sub = *lay;
        struct kern_pack_engine se = *eng;
        sub.layers = lay->layers - l0 < lmax ? lay->layers - l0 : lmax;
        se.k = eng->k + l0;
        se.v = eng->v ? eng->v + l0 : NULL;
        for (uint32_t j = 0; j < nblocks;) {
            uint32_t nb = nblocks - j;
            uint64_t tok = first_token + (uint64_t)j * lay->block_tokens;
            while ((rc = kern_batch_pack(a, &sub, &se, tok, nb, blocks + j, l0 * lbytes, dir)) ==
                       -E2BIG &&
                   nb > 1)
                nb = (nb + 1) / 2;
            if (rc == 0)
                rc = run(a, arg);
            if (rc)
                return rc;
            j += nb;
        }
    }
    return 0;
}

/* The column rounds a batch's kernel has (struct kern_batch's kivik) for blocks of the codecs
 * in the hint: KIVI and ROT where ROT blocks may come or the caller does not know, the KIVI
 * key rounds alone where KIVI blocks may but ROT ones may not, the LOWRANK and MERGE rounds
 * where those may and neither KIVI nor ROT (a kernel of their own: the others' registers
 * unchanged), none else. */
uint32_t kern_decode_cols(uint32_t codecs)
{
    const uint32_t kivi = 1u << KERN_CODEC_KIVI2 | 1u << KERN_CODEC_KIVI4;
    const uint32_t rot = 1u << KERN_CODEC_ROT2 | 1u << KERN_CODEC_ROT4;
    const uint32_t lrm = 1u << KERN_CODEC_LOWRANK | 1u << KERN_CODEC_MERGE;
    if (codecs == 0 || (codecs & rot))
        return KERN_BATCH_COLS_KIVI | KERN_BATCH_COLS_ROT;
    if (codecs & kivi)
        return KERN_BATCH_COLS_KIVI;
    return codecs & lrm ? KERN_BATCH_COLS_LRM : 0;
}

int kern_decode_batches(struct kern_batch_args *a, const struct kern_layout *klay,
                        uint32_t layer_first, uint32_t layer_count,
                        const struct kern_pack_engine *eng, uint64_t first_token, uint32_t nblocks,
                        const void *const *src, const uint64_t *src_len, uint32_t out_dtype,
                        uint32_t codecs, int (*run)(const struct kern_batch_args *a, void *arg),
                        void *arg)
{
    int rc = 0;
    /* the LOWRANK and MERGE rounds are built for the small parameter block alone
     * (kern_pack.cu): such a batch takes fewer blocks until its tables fit it, where one
     * block's do */
    const uint32_t cols = kern_decode_cols(codecs);
    const uint32_t small = cols == KERN_BATCH_COLS_LRM ? KERN_BATCH_SMALL_WORDS : UINT32_MAX;
    for (uint32_t j = 0; j < nblocks;) {
        uint32_t nb = nblocks - j;
        uint64_t tok = first_token + (uint64_t)j * (klay ? klay->tokens : 0);
        while (((rc = kern_batch_decode(a, klay, layer_first, layer_count, eng, tok, nb, src + j,
                                        src_len + j, out_dtype)) == -E2BIG ||
                (rc == 0 && a->h.nwords > small)) &&
               nb > 1)
            nb = (nb + 1) / 2;
        a->h.kivik = cols;
        if (rc == 0)
            rc = run(a, arg);
        if (rc)
            return rc;
        j += nb;
    }
    return 0;
}

static int kern_batch_run_cpu_cb(const struct kern_batch_args *a, void *arg)
{
    (void)arg;
    kern_batch_run_cpu(a);
    return 0;
}

int kern_pack_batched_cpu(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                          uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir)
{
    struct kern_batch_args *a = malloc(sizeof(*a));
    if (!a)
        return -ENOMEM;
    int rc = (dir != KERN_PACK_GATHER && dir != KERN_PACK_SCATTER) || (nblocks && !blocks)
                 ? -EINVAL
                 : kern_pack_batches(a, lay, eng, first_token, nblocks, blocks, dir,
                                     kern_batch_run_cpu_cb, NULL);
    free(a);
    return rc;
}

/* Every block of a decode, checked as the reference decoder checks it. */
static int kern_decode_blocks_ok(const struct kern_layout *klay, uint32_t nblocks,
                                 const void *const *src, const uint64_t *src_len)
{
    for (uint32_t j = 0; j < nblocks; j++) {
        struct kern_layout bl;
        if (kern_block_info(src[j], src_len[j], &bl, NULL) < 0 || bl.layers != klay->layers ||
            bl.heads != klay->heads || bl.head_dim != klay->head_dim || bl.tokens != klay->tokens ||
            bl.k_only != klay->k_only || bl.dtype != klay->dtype)
            return -EBADMSG;
    }
    return 0;
}

int kern_pack_decode_cpu(const struct kern_layout *klay, uint32_t layer_first, uint32_t layer_count,
                         const struct kern_pack_engine *eng, uint64_t first_token, uint32_t nblocks,
                         const void *const *src, const uint64_t *src_len, uint32_t out_dtype)
{
    struct kern_batch_args *a = malloc(sizeof(*a));
    int rc;
    if (!a)
        return -ENOMEM;
    /* the arguments first (as the reference), then the blocks */
    rc = kern_decode_check(klay, layer_first, layer_count, eng, first_token, nblocks, src, src_len,
                           out_dtype);
    if (rc == 0)
        rc = kern_decode_blocks_ok(klay, nblocks, src, src_len);
    if (rc == 0)
        rc = kern_decode_batches(a, klay, layer_first, layer_count, eng, first_token, nblocks, src,
                                 src_len, out_dtype, 0, kern_batch_run_cpu_cb, NULL);
    free(a);
    return rc;
}

int kern_pack_decode_ref(const struct kern_layout *klay, uint32_t layer_first, uint32_t layer_count,
                         const struct kern_pack_engine *eng, uint64_t first_token, uint32_t nblocks,
                         const void *const *src, const uint64_t *src_len, uint32_t out_dtype)
{
    int rc = kern_decode_check(klay, layer_first, layer_count, eng, first_token, nblocks, src,
                               src_len, out_dtype);
    if (rc)
        return rc;
    struct kern_pack_layout lay = kern_decode_lay(klay, layer_count);
    rc = kern_decode_blocks_ok(klay, nblocks, src, src_len);
    if (rc)
        return rc;
    /* Decoded whole with the reference decoder, the layers scattered by the reference pack. */
    uint64_t rs = kern_raw_size(klay), lbytes = rs / klay->layers;
    uint8_t *raw = malloc(rs ? rs : 1);
    if (!raw)
        return -ENOMEM;
    for (uint32_t j = 0; j < nblocks && rc == 0; j++) {
        int64_t d = kern_decode_ref(klay, src[j], src_len[j], raw, rs, (enum kern_dtype)out_dtype);
        if (d < 0) {
            rc = (int)d;
            break;
        }
        void *blk = raw + (uint64_t)layer_first * lbytes;
        rc = kern_pack_ref(&lay, eng, first_token + (uint64_t)j * klay->tokens, 1, &blk,
                           KERN_PACK_SCATTER);
    }
    free(raw);
    return rc;
}

#if !KVC_CUDA
int kern_pack_cuda(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                   uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir,
                   void *stream)
{
    (void)lay, (void)eng, (void)first_token, (void)nblocks, (void)blocks, (void)dir, (void)stream;
    return -ENOTSUP;
}

int kern_pack_decode_cuda(const struct kern_layout *klay, uint32_t layer_first,
                          uint32_t layer_count, const struct kern_pack_engine *eng,
                          uint64_t first_token, uint32_t nblocks, const void *const *src,
                          const uint64_t *src_len, uint32_t out_dtype, uint32_t codecs,
                          void *stream)
{
    (void)klay, (void)layer_first, (void)layer_count, (void)eng, (void)first_token;
    (void)nblocks, (void)src, (void)src_len, (void)out_dtype, (void)codecs, (void)stream;
    return -ENOTSUP;
}

int kern_batch_cuda(const struct kern_batch_args *a, void *stream)
{
    (void)a, (void)stream;
    return -ENOTSUP;
}

int kern_copy_batch_cuda(void *const *dst, const void *const *src, const uint64_t *len, uint32_t n,
                         void *stream)
{
    (void)dst, (void)src, (void)len, (void)n, (void)stream;
    return -ENOTSUP;
}
#endif
