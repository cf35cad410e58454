/*
 * kern_batch.h — the argument block of the batched device moves and the per-row work they
 * do, shared by the CUDA kernels (kern_pack.cu) and their CPU emulation (kern_pack.c, the
 * fake device of the tests). Internal to kernels/ and tests/lib.
 *
 * DESIGN
 * A load or put of a prefix is one kernel launch, whatever the number of blocks: a gather or
 * scatter between the engine's paged tensors and canonical blocks (pool slots, or device
 * staging of host blocks), or a decode of encoded blocks straight into the engine's tensors.
 * Everything the kernel needs besides the bytes it moves — per-layer K and V base pointers of
 * the layers moved, one pointer (and, for a decode, one length) per block, and the slice of
 * the engine's block table that the tokens touch — travels by value in the launch's
 * parameters (struct kern_batch: a header and up to KERN_BATCH_WORDS 8-byte words), so no
 * table is copied to the device before the launch, nothing is staged from pageable memory,
 * and no device scratch holds tables whose lifetime would have to be tracked. CUDA takes up
 * to 32 KiB of kernel parameters (CUDA 12.1 and later, Volta and later); a move whose tables
 * do not fit is split by the caller (kern_batch_pack/_decode answer -E2BIG).
 *
 * The work is cut into rows: one (block, layer, kind, token) each, all heads of one token of
 * one layer's K or V, H * head_dim elements — contiguous in the canonical block, and in the
 * engine's tensor too when its heads are packed. A warp works a step at a time, walking the
 * steps grid-stride: R = 2^rshift consecutive rows of one (block, layer, kind), R chosen by
 * the host as the largest power of two that divides the block's tokens with R rows in 2 KiB
 * (KERN_BATCH_STEP_BYTES), so a warp has a step's bytes in flight however small the rows: a
 * 2 KiB row (8 heads of 128 fp16) is a step, 512-byte rows go four to a step. The lanes
 * spread over the step's R * items chunks (a lane per 16-byte chunk, or per 8 decoded
 * elements), so a warp's stores are one coalesced run per head row. The CPU emulation runs
 * the very same step functions, the 32 lanes of a warp one after another (a decode step in
 * phases, every lane finishing one before any lane starts the next, as the lanes of a ROT row
 * exchange values in the middle). So the indexing the GPU runs — step decomposition, table
 * slice, layer range, the section walk of the encoded format, the access width, the split of
 * a step over the lanes, the lanes' exchange — is what the tests run here, on any machine,
 * against the scalar reference (kern_pack_ref, kern_decode_ref).
 *
 * Run steps: where the engine's heads and tokens are packed (kern_pack_contiguous: vLLM's
 * per-layer pages), a gather or scatter takes run steps instead (the header's run flag): R
 * tokens of one (block, layer, kind) that lie on one page, so that they are one contiguous
 * run on both sides (R divides the block's tokens, the page's and the first token's place in
 * its page; R rows in KERN_BATCH_RUN_BYTES); the step looks its page up once and its lanes
 * move the run's 16-byte chunks eight at a time, loads before stores, with no per-chunk
 * division, page lookup or head split. Strided layouts keep the row steps.
 *
 * Indexing is 32-bit: the step index, its decomposition into (block, layer, kind, first
 * token) by two 32-bit divisions (K, 1 or 2, by a shift), and the token's place in the
 * table slice, counted from off0, the offset of first_token inside the slice's first page
 * (computed once on the host): page = (off0 + j) / page_tokens, a shift when page_tokens is a
 * power of two. The host answers -E2BIG for a batch whose steps or tokens do not fit 32 bits
 * (KERN_BATCH_MAX_STEPS), and the splitters cut it into smaller batches, as for tables. A
 * step looks its first token's page up once; a token of the step past that page's end (R
 * does not divide page_tokens, or the step starts mid-page) looks up its own.
 *
 * Access width (pack): the host ORs every pointer, stride and row length once and picks the
 * widest of 16, 8, 4, 2, 1 bytes that divides them all; each lane moves up to four chunks
 * per step, loads before stores, so a warp has up to 2 KiB in flight. Decode: each lane
 * produces 8 consecutive elements of one head row (16 bytes of fp16/bf16) and stores them
 * with one 16-byte store where the engine's addresses allow it (vec16), else element by
 * element; the arithmetic is the reference's, per element, in the same order (kern_fmt.h),
 * so the output is bit-identical. A lane reads its piece's fields (a group's scale and min,
 * its codes, a head row's 16 bytes) with the widest loads their alignment allows, 16, 8, 4
 * or 2 bytes (ld.global.nc), and unpacks them from registers: sections start 16-byte
 * aligned in a block, so a field's alignment is the lowest set bit of the section address
 * and of the strides that lead to it ("the decoder's loads" below), the same for every lane
 * of a step: it depends on the block pointer, the section offset and the layout alone.
 * Device staging (256-byte steps, KVC_GPU_ALIGN in libkvc_gpu.c) and pool slots are aligned,
 * so the byte path (one-byte accesses) is taken only by a block at an odd address. The
 * emulation makes the same accesses, counts them by width, and faults on a misaligned one as
 * the device would, so the tests check the width arithmetic too. A value that depends on a
 * whole head row is computed once per row, not once per lane: a ROT key row (rotated by a
 * Walsh-Hadamard transform over its D channels) is decoded by the D / 8 lanes of the row
 * together, the transform's stages across them by shuffles, with kern_fwht's pairs and order
 * ("a decode step, phase by phase" below); a LOWRANK element is a sum over the rank of
 * (sigma_i * u[t][i]) * w[i][d], the first factor loaded and rounded once per lane for its 8
 * elements; a KIVI key step's lane keeps one column (head, 8 channels) through the step, its
 * scales and mins loaded once ("the KIVI key rounds" below), and so does a ROT key step's, its
 * means and signs once, the row's lanes still exchanging its transform ("the ROT key
 * rounds"), and so does a LOWRANK key or MERGE step's, its head's factors or bitmap worked out
 * once ("the LOWRANK and MERGE rounds"). No lane holds a row in local memory (it was 1 KiB a thread, a ROT row per lane;
 * what the decode kernel spills under the 64-register cap: docs/design/gpu.md). The block's
 * header, section descriptor and raw-head appendix are read and checked once per step: by
 * lane 0 and shuffled to the warp on the device, once per step for the warp in the emulation.
 */
#ifndef KVC_KERN_BATCH_H
#define KVC_KERN_BATCH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include "kernels/kern.h"
#include "kernels/kern_ext.h"
#include "kernels/kern_fmt.h"

/* 30 KiB of words: with the header, under CUDA's 32764-byte limit on kernel parameters. */
#define KERN_BATCH_WORDS 3840
/* The launch most calls take: a 2 KiB parameter block is cheaper to launch than 30 KiB. */
#define KERN_BATCH_SMALL_WORDS 224

enum kern_batch_op {
    KERN_BATCH_GATHER = 1,  /* engine -> canonical blocks */
    KERN_BATCH_SCATTER = 2, /* canonical blocks -> engine */
    KERN_BATCH_DECODE = 3,  /* encoded blocks -> engine */
};

struct kern_batch {
    uint32_t op;           /* enum kern_batch_op */
    uint32_t layers;       /* layers moved by this batch */
    uint32_t kinds;        /* 2: K and V, 1: K only */
    uint32_t block_tokens; /* tokens per block */
    uint32_t heads, head_dim;
    uint32_t elem_bytes; /* 1, 2 or 4 (decode: 2) */
    uint32_t nblocks;
    uint32_t page_tokens;
    uint32_t pt_shift; /* log2(page_tokens) when a power of two, else 32: divide */
    uint64_t page0;    /* the table slice in words[tab..] starts at this page of the sequence */
    uint32_t npages;
    uint32_t vec; /* pack: bytes per access; decode: 16 when every head row allows 16-byte
                     stores, else 2 */
    uint64_t page_stride, token_stride, head_stride;
    uint64_t first_token; /* sequence token of block 0's first token */
    /* decode: the encoded blocks' layout, the first layer of this batch inside them, and
     * the output dtype (enum kern_dtype) */
    struct kern_layout klay;
    uint32_t layer_first;
    uint32_t out_dtype;
    /* words: [K base x layers][V base x layers if kinds == 2][block x nblocks]
     *        [length x nblocks if decode][table slice: npages int32, two per word] */
    uint32_t nwords;
    /* steps: the kernel's work items, (block, layer, kind, R consecutive tokens) each, R =
     * 1 << rshift rows; groups = block_tokens / R steps per (block, layer, kind); items: a
     * token's chunks (pack) or 8-element pieces (decode), item_shift its log2 or 32 */
    uint32_t steps;
    uint32_t rshift, groups;
    uint32_t items, item_shift;
    /* offset of first_token inside the slice's first page: token j of the batch lies at
     * slice-relative token off0 + j (fits 32 bits, the host checks) */
    uint32_t off0;
    /* pack: 1 when every step's R rows are one contiguous run in the engine too (its heads
     * and tokens packed, R tokens on one page: kern_batch_pack_run_step), 0 the row steps */
    uint32_t run;
    /* decode: the column rounds the kernel has (KERN_BATCH_COLS_*, from kern_decode_batches'
     * codecs): KIVI and ROT where a block may hold ROT key sections or the caller does not
     * know; KIVI alone where KIVI but no ROT blocks may come (the kernel as it was before the
     * ROT key rounds, whose spills those rounds would have doubled); the LOWRANK and MERGE
     * rounds alone where LOWRANK or MERGE blocks may come and neither KIVI nor ROT ones; 0
     * where none may, the kernel without them, whose registers the other codecs' rounds
     * keep. A section whose rounds the kernel lacks takes the generic rounds: the same bytes,
     * slower. */
    uint32_t kivik;
};
#define KERN_BATCH_COLS_KIVI 1u /* the KIVI key rounds (kern_batch_kivik_lane) */
#define KERN_BATCH_COLS_ROT 2u  /* the ROT key rounds (kern_batch_rotk_rounds) */
#define KERN_BATCH_COLS_LRM 4u  /* the LOWRANK key and MERGE rounds (kern_batch_lrm_lane) */

/* A batch as the launch takes it: the header and its words (only nwords are used). */
struct kern_batch_args {
    struct kern_batch h;
    uint64_t w[KERN_BATCH_WORDS];
};

/* ---- word layout --------------------------------------------------------------------- */

/* Steps of a batch are counted in 32 bits: the host splits a batch with more (or whose
 * tokens reach past 32 bits from its slice's first page), so a grid-stride walk, step +
 * warps, never wraps either. */
#define KERN_BATCH_MAX_STEPS 0xfe000000u
/* Rows per step: R consecutive tokens of one (block, layer, kind), R * token bytes at most
 * this (a warp's 32 lanes x four 16-byte accesses). */
#define KERN_BATCH_STEP_BYTES 2048u
/* Lanes of a warp: the kernels' and the emulation's. */
#define KERN_BATCH_LANES 32u

KERN_HD uint32_t kern_batch_kv_words(const struct kern_batch *b)
{
    return b->layers * b->kinds;
}

KERN_HD uint32_t kern_batch_tab_word(const struct kern_batch *b)
{
    return kern_batch_kv_words(b) + b->nblocks * (b->op == KERN_BATCH_DECODE ? 2u : 1u);
}

KERN_HD uint64_t kern_batch_rows(const struct kern_batch *b)
{
    return (uint64_t)b->nblocks * b->layers * b->kinds * b->block_tokens;
}

/* Physical page of the slice's page pg (relative: 0 is the page first_token lies in). */
KERN_HD int32_t kern_batch_page(const struct kern_batch *b, const uint64_t *w, uint32_t pg)
{
    int32_t e;
    memcpy(&e, (const uint8_t *)(w + kern_batch_tab_word(b)) + 4ull * pg, 4);
    return e;
}

KERN_HD uint8_t *kern_batch_ptr(const uint64_t *w, uint32_t i)
{
    return (uint8_t *)(uintptr_t)w[i];
}

/* x / d where d == 1 << sh when sh < 32: a shift for the power-of-two divisors the host
 * found, a 32-bit division for the others. */
KERN_HD uint32_t kern_batch_div(uint32_t x, uint32_t d, uint32_t sh)
{
    return sh < 32 ? x >> sh : x / d;
}

/* Where step s works: block bi, layer l, kind k, tokens [t0, t0 + R). 32-bit arithmetic, K
 * (1 or 2) without a division. */
struct kern_batch_at {
    uint32_t bi, l, k, t0;
};

KERN_HD void kern_batch_step_at(const struct kern_batch *b, uint32_t s, struct kern_batch_at *at)
{
    const uint32_t x = s / b->groups, g = s - x * b->groups;
    const uint32_t y = x >> (b->kinds - 1);
    at->t0 = g << b->rshift;
    at->k = x - (y << (b->kinds - 1));
    at->bi = y / b->layers;
    at->l = y - at->bi * b->layers;
}

/* The engine side of one step: the layer's base, the slice-relative token of the step's
 * first token and its page, looked up once; token j of the step is then on that page while
 * slot0 + j < page_tokens (every token, where the host's R divides the page), else looked up
 * on its own. */
struct kern_batch_eng {
    uint8_t *base;
    uint32_t rel0, slot0;
    int32_t page0;
};

KERN_HD void kern_batch_eng_at(const struct kern_batch *b, const uint64_t *w,
                               const struct kern_batch_at *at, struct kern_batch_eng *e)
{
    e->base = kern_batch_ptr(w, at->k * b->layers + at->l);
    e->rel0 = b->off0 + at->bi * b->block_tokens + at->t0;
    const uint32_t pg = kern_batch_div(e->rel0, b->page_tokens, b->pt_shift);
    e->slot0 = e->rel0 - pg * b->page_tokens;
    e->page0 = kern_batch_page(b, w, pg);
}

/* Address of token j of a step whose first token is slice-relative token rel0, slot0 of
 * physical page page0, in the engine at base (pages of page_tokens, the table slice at tab);
 * NULL when the table has no page for it. */
KERN_HD uint8_t *kern_batch_tok(uint8_t *base, uint32_t rel0, uint32_t slot0, int32_t page0,
                                uint32_t page_tokens, uint32_t pt_shift, uint64_t page_stride,
                                uint64_t token_stride, const uint8_t *tab, uint32_t j)
{
    uint32_t slot = slot0 + j;
    int32_t page = page0;
    if (slot >= page_tokens) { /* the step crosses into a later page */
        const uint32_t rel = rel0 + j;
        const uint32_t pg = kern_batch_div(rel, page_tokens, pt_shift);
        slot = rel - pg * page_tokens;
        memcpy(&page, tab + 4ull * pg, 4);
    }
    if (page < 0)
        return 0;
    return base + (uint64_t)page * page_stride + (uint64_t)slot * token_stride;
}

/* Address of token j of the step in the engine, NULL when the table has no page for it. */
KERN_HD uint8_t *kern_batch_eng_tok(const struct kern_batch *b, const uint64_t *w,
                                    const struct kern_batch_eng *e, uint32_t j)
{
    return kern_batch_tok(e->base, e->rel0, e->slot0, e->page0, b->page_tokens, b->pt_shift,
                          b->page_stride, b->token_stride,
                          (const uint8_t *)(w + kern_batch_tab_word(b)), j);
}

/* ---- warp-uniform values ----------------------------------------------------------------
 * What every lane of a step needs alike (a block's header and section) is read by lane 0 of
 * the warp and handed to the others by a shuffle on the device; on the host (the emulation,
 * where one call of the decode step is the whole warp) the call reads it: the same arithmetic
 * on the same bytes. The kernels call the step functions with all 32 lanes of a warp on the
 * same step. */
#ifdef __CUDA_ARCH__
/* Does this lane read the warp's uniform values itself? */
KERN_HD int kern_batch_reader(uint32_t lane)
{
    return lane == 0;
}

KERN_HD uint32_t kern_batch_bcast(uint32_t v)
{
    return __shfl_sync(0xffffffffu, v, 0);
}
#else
KERN_HD int kern_batch_reader(uint32_t lane)
{
    (void)lane;
    return 1;
}

KERN_HD uint32_t kern_batch_bcast(uint32_t v)
{
    return v;
}
#endif

/* ---- accesses ------------------------------------------------------------------------- */

/* Moves of one access width: on the device typed loads (the host chose a width every
 * address divides), on the host memcpy (what the emulation means by the same access). */
#ifdef __CUDA_ARCH__
#define KERN_UNROLL _Pragma("unroll")
#define KERN_BATCH_LOAD(T, v, p) ((v) = *(const T *)(p))
#define KERN_BATCH_STORE(T, p, v) (*(T *)(p) = (v))
typedef uint4 kern_batch_v16;
#else
#define KERN_UNROLL
#define KERN_BATCH_LOAD(T, v, p) memcpy(&(v), (p), sizeof(T))
#define KERN_BATCH_STORE(T, p, v) memcpy((p), &(v), sizeof(T))
typedef struct {
    uint64_t a, b;
} kern_batch_v16;
#endif

/* kern_batch_pack_step_<T>: step s of a gather or scatter in accesses of sizeof(T) bytes (the
 * batch's vec), lane `lane` of `nlanes`. The step's R token rows are contiguous in the block;
 * its n = R * items chunks are spread over the lanes, chunk c being chunk cc of token
 * j = c / items, head cc / cph of it (cph chunks per head row; every chunk of the token when
 * the engine's heads are packed). Four chunks per lane in flight, loaded before they are
 * stored. A NULL block is not this batch's; a token without a page is left alone. */
#define KERN_BATCH_PACK_STEP_FN(name, T)                                                           \
    KERN_HD void name(const struct kern_batch *b, const uint64_t *w, uint32_t s, uint32_t lane,    \
                      uint32_t nlanes)                                                             \
    {                                                                                              \
        struct kern_batch_at at;                                                                   \
        kern_batch_step_at(b, s, &at);                                                             \
        const uint32_t K = b->kinds, L = b->layers, H = b->heads;                                  \
        uint8_t *blk = kern_batch_ptr(w, K * L + at.bi);                                           \
        if (!blk)                                                                                  \
            return;                                                                                \
        const uint64_t row = (uint64_t)b->head_dim * b->elem_bytes;                                \
        blk += (((uint64_t)at.l * K + at.k) * b->block_tokens + at.t0) * H * row;                  \
        struct kern_batch_eng e;                                                                   \
        kern_batch_eng_at(b, w, &at, &e);                                                          \
        const int gather = b->op == KERN_BATCH_GATHER;                                             \
        const int packed = H == 1 || b->head_stride == row;                                        \
        const uint64_t hs = b->head_stride;                                                        \
        const uint32_t items = b->items, cph = packed ? items : (uint32_t)(row / sizeof(T));       \
        const uint32_t n = items << b->rshift;                                                     \
        for (uint32_t c0 = lane; c0 < n; c0 += 4 * nlanes) {                                       \
            T v[4];                                                                                \
            uint8_t *to[4];                                                                        \
            KERN_UNROLL                                                                            \
            for (uint32_t u = 0; u < 4; u++) {                                                     \
                const uint32_t c = c0 + u * nlanes;                                                \
                to[u] = 0;                                                                         \
                if (c >= n)                                                                        \
                    continue;                                                                      \
                const uint32_t j = kern_batch_div(c, items, b->item_shift);                        \
                const uint32_t cc = c - j * items;                                                 \
                uint8_t *q = kern_batch_eng_tok(b, w, &e, j);                                      \
                if (!q)                                                                            \
                    continue;                                                                      \
                const uint32_t h = packed ? 0 : cc / cph;                                          \
                q += h * hs + (uint64_t)(cc - h * cph) * sizeof(T);                                \
                uint8_t *p = blk + (uint64_t)c * sizeof(T);                                        \
                to[u] = gather ? p : q;                                                            \
                KERN_BATCH_LOAD(T, v[u], gather ? q : p);                                          \
            }                                                                                      \
            KERN_UNROLL                                                                            \
            for (uint32_t u = 0; u < 4; u++)                                                       \
                if (to[u])                                                                         \
                    KERN_BATCH_STORE(T, to[u], v[u]);                                              \
        }                                                                                          \
    }

KERN_BATCH_PACK_STEP_FN(kern_batch_pack_step16, kern_batch_v16)
KERN_BATCH_PACK_STEP_FN(kern_batch_pack_step8, uint64_t)
KERN_BATCH_PACK_STEP_FN(kern_batch_pack_step4, uint32_t)
KERN_BATCH_PACK_STEP_FN(kern_batch_pack_step2, uint16_t)
KERN_BATCH_PACK_STEP_FN(kern_batch_pack_step1, uint8_t)

/* Rows per run step: R consecutive tokens of one (block, layer, kind) that lie in one
 * contiguous run of the engine's page, R * token bytes at most this (two rounds of a warp's
 * 32 lanes x eight 16-byte accesses). */
#define KERN_BATCH_RUN_BYTES 8192u

/* kern_batch_run_step_<T>: step s of a gather or scatter whose R rows are one contiguous run
 * on both sides (the batch's run flag: the engine's heads and tokens packed, the step's
 * tokens on one page, kern_batch_pack checks): the run's address in the engine is looked up
 * once, then lane `lane` of `nlanes` moves chunks lane, lane + nlanes, ... of it, eight in
 * flight, all loaded before any is stored. No division and no table lookup per chunk. A NULL
 * block is not this batch's; a run without a page is left alone. */
#define KERN_BATCH_RUN_STEP_FN(name, T)                                                            \
    KERN_HD void name(const struct kern_batch *b, const uint64_t *w, uint32_t s, uint32_t lane,    \
                      uint32_t nlanes)                                                             \
    {                                                                                              \
        struct kern_batch_at at;                                                                   \
        kern_batch_step_at(b, s, &at);                                                             \
        const uint32_t K = b->kinds, L = b->layers;                                                \
        uint8_t *blk = kern_batch_ptr(w, K * L + at.bi);                                           \
        if (!blk)                                                                                  \
            return;                                                                                \
        const uint64_t tok = (uint64_t)b->heads * b->head_dim * b->elem_bytes;                     \
        blk += (((uint64_t)at.l * K + at.k) * b->block_tokens + at.t0) * tok;                      \
        struct kern_batch_eng e;                                                                   \
        kern_batch_eng_at(b, w, &at, &e);                                                          \
        uint8_t *q = kern_batch_eng_tok(b, w, &e, 0);                                              \
        if (!q)                                                                                    \
            return;                                                                                \
        const int gather = b->op == KERN_BATCH_GATHER;                                             \
        const uint8_t *from = gather ? q : blk;                                                    \
        uint8_t *to = gather ? blk : q;                                                            \
        const uint32_t n = b->items << b->rshift;                                                  \
        for (uint32_t c0 = lane; c0 < n; c0 += 8 * nlanes) {                                       \
            T v[8];                                                                                \
            KERN_UNROLL                                                                            \
            for (uint32_t u = 0; u < 8; u++)                                                       \
                if (c0 + u * nlanes < n)                                                           \
                    KERN_BATCH_LOAD(T, v[u], from + (uint64_t)(c0 + u * nlanes) * sizeof(T));      \
            KERN_UNROLL                                                                            \
            for (uint32_t u = 0; u < 8; u++)                                                       \
                if (c0 + u * nlanes < n)                                                           \
                    KERN_BATCH_STORE(T, to + (uint64_t)(c0 + u * nlanes) * sizeof(T), v[u]);       \
        }                                                                                          \
    }

KERN_BATCH_RUN_STEP_FN(kern_batch_run_step16, kern_batch_v16)
KERN_BATCH_RUN_STEP_FN(kern_batch_run_step8, uint64_t)
KERN_BATCH_RUN_STEP_FN(kern_batch_run_step4, uint32_t)
KERN_BATCH_RUN_STEP_FN(kern_batch_run_step2, uint16_t)
KERN_BATCH_RUN_STEP_FN(kern_batch_run_step1, uint8_t)

/* Step s of a gather or scatter batch, lane `lane` of nlanes: a run step where the batch's
 * run flag says its rows are one run, else a row step. */
KERN_HD void kern_batch_pack_step(const struct kern_batch *b, const uint64_t *w, uint32_t s,
                                  uint32_t lane, uint32_t nlanes)
{
    if (b->run) {
        switch (b->vec) {
        case 16:
            kern_batch_run_step16(b, w, s, lane, nlanes);
            break;
        case 8:
            kern_batch_run_step8(b, w, s, lane, nlanes);
            break;
        case 4:
            kern_batch_run_step4(b, w, s, lane, nlanes);
            break;
        case 2:
            kern_batch_run_step2(b, w, s, lane, nlanes);
            break;
        default:
            kern_batch_run_step1(b, w, s, lane, nlanes);
            break;
        }
        return;
    }
    switch (b->vec) {
    case 16:
        kern_batch_pack_step16(b, w, s, lane, nlanes);
        break;
    case 8:
        kern_batch_pack_step8(b, w, s, lane, nlanes);
        break;
    case 4:
        kern_batch_pack_step4(b, w, s, lane, nlanes);
        break;
    case 2:
        kern_batch_pack_step2(b, w, s, lane, nlanes);
        break;
    default:
        kern_batch_pack_step1(b, w, s, lane, nlanes);
        break;
    }
}

/* ---- decode --------------------------------------------------------------------------- */

/* fp16 / bf16 bits of a decoded value: round to nearest even, NaN as kern_f2h/kern_f2bf.
 * On the device the conversion instruction (RNE, the same bits for every non-NaN input). */
KERN_HD uint16_t kern_batch_out(float x, uint32_t out)
{
#ifdef __CUDA_ARCH__
    if (x == x)
        return out == KERN_DTYPE_BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x))
                                      : __half_as_ushort(__float2half_rn(x));
#endif
    return out == KERN_DTYPE_BF16 ? kern_f2bf(x) : kern_f2h(x);
}

KERN_HD uint32_t kern_batch_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* ---- the decoder's loads -----------------------------------------------------------------
 * A lane reads its piece's fields (a group's scale and min, its 8 codes, a head row's 16
 * bytes of fp16) with the widest accesses their addresses allow, then unpacks them from
 * registers. What allows it is the format: sections start 16-byte aligned in a block
 * (kern_hdr_build), so a field's offset from a 16-aligned section start is a sum of the
 * section's strides times indices plus constants, and its alignment is the lowest bit set in
 * the section address and all those strides (kern_batch_wd): 2 for q8_0's codes (34-byte
 * groups), 4 for q4_1's and KIVI's, 8 for q5_1's, 16 for a raw, MERGE or LOWRANK row and
 * most KIVI-K scales (docs/design/gpu.md, "Decode loads"). The width depends on the
 * section's address and the layout alone, so it is the same for every lane of a step; a
 * block at an address not 16-byte aligned gets narrower accesses, down to one byte each (the
 * byte path), and the same values. */

/* Accesses by what they read (KERN_BATCH_LD_HDR: a block's header and section descriptor,
 * once per step; KERN_BATCH_LD_DATA: the pieces' fields) and width, log2: 1, 2, 4, 8 and 16
 * bytes. The emulation counts them; the tests check which path a step took. */
enum kern_batch_ld_what { KERN_BATCH_LD_HDR = 0, KERN_BATCH_LD_DATA = 1 };
#ifndef __CUDACC__
extern uint64_t kern_batch_ld_count[2][5];
#endif

/* The widest access, up to n bytes (n <= 16), at an address whose low bits are those of x
 * (the OR of an address and every stride that may be added to it): x's lowest set bit,
 * capped by n's, so that the accesses also tile the n bytes. */
KERN_HD uint32_t kern_batch_wd(uint32_t x, uint32_t n)
{
    x |= n;
    return x & (0u - x);
}

/* n bytes (n <= 16) at p into v[0..4), little-endian words (bytes past n are 0), in accesses
 * of w bytes (kern_batch_wd: p a multiple of w, w dividing n). On the device read-only loads
 * (ld.global.nc) of w bytes; the emulation makes the same accesses, and faults as the device
 * does on one whose address is not a multiple of its width. */
KERN_HD void kern_batch_ld_as(const uint8_t *p, uint32_t n, uint32_t w, uint32_t *v,
                              enum kern_batch_ld_what what)
{
    v[0] = v[1] = v[2] = v[3] = 0;
#ifndef __CUDACC__
    if ((uintptr_t)p & (w - 1))
        __builtin_trap();
    kern_batch_ld_count[what][w >= 16 ? 4 : w >= 8 ? 3 : w >= 4 ? 2 : w >= 2 ? 1 : 0] += n / w;
#else
    (void)what;
#endif
    if (w == 16) {
#ifdef __CUDA_ARCH__
        const uint4 x = __ldg((const uint4 *)p);
        v[0] = x.x;
        v[1] = x.y;
        v[2] = x.z;
        v[3] = x.w;
#else
        memcpy(v, p, 16);
#endif
    } else if (w == 8) {
        KERN_UNROLL
        for (uint32_t i = 0; i < 2; i++) {
            if (8 * i >= n)
                break;
#ifdef __CUDA_ARCH__
            const uint2 x = __ldg((const uint2 *)(p + 8 * i));
            v[2 * i] = x.x;
            v[2 * i + 1] = x.y;
#else
            memcpy(v + 2 * i, p + 8 * i, 8);
#endif
        }
    } else if (w == 4) {
        KERN_UNROLL
        for (uint32_t i = 0; i < 4; i++) {
            if (4 * i >= n)
                break;
#ifdef __CUDA_ARCH__
            v[i] = __ldg((const unsigned int *)(p + 4 * i));
#else
            memcpy(v + i, p + 4 * i, 4);
#endif
        }
    } else if (w == 2) {
        KERN_UNROLL
        for (uint32_t i = 0; i < 8; i++) {
            if (2 * i >= n)
                break;
#ifdef __CUDA_ARCH__
            const uint32_t x = __ldg((const unsigned short *)(p + 2 * i));
#else
            uint16_t x;
            memcpy(&x, p + 2 * i, 2);
#endif
            v[i >> 1] |= (uint32_t)x << (16 * (i & 1));
        }
    } else {
        KERN_UNROLL
        for (uint32_t i = 0; i < 16; i++) {
            if (i >= n)
                break;
#ifdef __CUDA_ARCH__
            const uint32_t x = __ldg(p + i);
#else
            const uint32_t x = p[i];
#endif
            v[i >> 2] |= x << (8 * (i & 3));
        }
    }
}

KERN_HD void kern_batch_ld(const uint8_t *p, uint32_t n, uint32_t w, uint32_t *v)
{
    kern_batch_ld_as(p, n, w, v, KERN_BATCH_LD_DATA);
}

/* n <= 4 bytes at p in accesses of w bytes (kern_batch_wd: p a multiple of w, w dividing n),
 * as one little-endian word (bytes past n 0): kern_batch_ld's accesses for a field of at most
 * a word, without its wider paths' registers. */
KERN_HD uint32_t kern_batch_ld_word(const uint8_t *p, uint32_t n, uint32_t w)
{
#ifndef __CUDACC__
    if ((uintptr_t)p & (w - 1))
        __builtin_trap();
    kern_batch_ld_count[KERN_BATCH_LD_DATA][w >= 4 ? 2 : w >= 2 ? 1 : 0] += n / w;
#endif
    uint32_t v = 0;
    KERN_UNROLL
    for (uint32_t i = 0; i < 4; i++) {
        if (i * w >= n)
            break;
        uint32_t x;
#ifdef __CUDA_ARCH__
        x = w >= 4   ? __ldg((const unsigned int *)p)
            : w == 2 ? (uint32_t)__ldg((const unsigned short *)(p + 2 * i))
                     : (uint32_t)__ldg(p + i);
#else
        if (w >= 4)
            memcpy(&x, p, 4);
        else if (w == 2) {
            uint16_t x2;
            memcpy(&x2, p + 2 * i, 2);
            x = x2;
        } else
            x = p[i];
#endif
        v |= x << (8 * i * w);
    }
    return v;
}

/* Byte j and 16-bit element j of words loaded by kern_batch_ld. */
KERN_HD uint32_t kern_batch_b8(const uint32_t *v, uint32_t j)
{
    return (v[j >> 2] >> (8 * (j & 3))) & 0xffu;
}

KERN_HD uint32_t kern_batch_e16(const uint32_t *v, uint32_t j)
{
    return (v[j >> 1] >> (16 * (j & 1))) & 0xffffu;
}

/* The 32-bit word at p (4 bytes; x as for kern_batch_wd) and the fp16 at p. */
KERN_HD uint32_t kern_batch_ld32(const uint8_t *p, uint32_t x)
{
    uint32_t v[4];
    kern_batch_ld(p, 4, kern_batch_wd(x, 4), v);
    return v[0];
}

KERN_HD float kern_batch_ldh(const uint8_t *p, uint32_t x)
{
    uint32_t v[4];
    kern_batch_ld(p, 2, kern_batch_wd(x, 2), v);
    return kern_h2f((uint16_t)v[0]);
}

KERN_HD uint32_t kern_batch_popc(uint32_t x)
{
#ifdef __CUDA_ARCH__
    return (uint32_t)__popc(x);
#else
    return (uint32_t)__builtin_popcount(x);
#endif
}

/* out-dtype bits of a value stored in the block's dtype: the bits themselves, or converted
 * as the reference does. */
KERN_HD uint16_t kern_batch_cvt(uint32_t v, uint32_t dtype, uint32_t out)
{
    if (out == dtype)
        return (uint16_t)v;
    const float f = dtype == KERN_DTYPE_BF16 ? kern_bf2f((uint16_t)v) : kern_h2f((uint16_t)v);
    return out == KERN_DTYPE_BF16 ? kern_f2bf(f) : kern_f2h(f);
}

/* What the decoder checks of a block's header: its first 24 bytes (magic; version, dtype
 * and kinds; layers, heads, head_dim, tokens), as 6 words in v[0..8) (a 16- and an 8-byte
 * access from an aligned block); and its reserved word (the raw-head appendix, at 40). */
typedef char kern_batch_hdr_at[offsetof(struct kern_block_hdr, tokens) == 20 &&
                                       offsetof(struct kern_block_hdr, reserved) == 40 &&
                                       sizeof(struct kern_block_hdr) == 48
                                   ? 1
                                   : -1];

KERN_HD void kern_batch_hdr_words(const uint8_t *src, uint32_t *v)
{
    const uint32_t a = (uint32_t)(uintptr_t)src;
    kern_batch_ld_as(src, 16, kern_batch_wd(a, 16), v, KERN_BATCH_LD_HDR);
    kern_batch_ld_as(src + 16, 8, kern_batch_wd(a, 8), v + 4, KERN_BATCH_LD_HDR);
}

KERN_HD uint64_t kern_batch_hdr_reserved(const uint8_t *src)
{
    uint32_t v[4];
    kern_batch_ld_as(src + 40, 8, kern_batch_wd((uint32_t)(uintptr_t)src, 8), v, KERN_BATCH_LD_HDR);
    return v[0] | (uint64_t)v[1] << 32;
}

/* Does the encoded block src (src_len bytes) describe `lay`, with section lk inside it?
 * Fills *s. The decoder's own check: a block that fails it decodes to zeros. */
KERN_HD int kern_batch_sect(const struct kern_layout *lay, const uint8_t *src, uint64_t src_len,
                            uint32_t lk, struct kern_block_sect *s)
{
    uint32_t hw[8];
    if (!src || src_len < kern_hdr_bytes(lay))
        return 0;
    /* struct kern_block_hdr's fields, little-endian */
    kern_batch_hdr_words(src, hw);
    if (hw[0] != KERN_BLOCK_MAGIC ||
        hw[1] != (KERN_BLOCK_VERSION | lay->dtype << 16 | kern_kinds(lay) << 24) ||
        hw[2] != lay->layers || hw[3] != lay->heads || hw[4] != lay->head_dim ||
        hw[5] != lay->tokens)
        return 0;
    uint32_t v[4];
    const uint8_t *sp = src + sizeof(struct kern_block_hdr) + lk * sizeof(*s);
    kern_batch_ld_as(sp, sizeof(*s), kern_batch_wd((uint32_t)(uintptr_t)sp, sizeof(*s)), v,
                     KERN_BATCH_LD_HDR);
    memcpy(s, v, sizeof(*s));
    /* a codec the layout cannot take (a ROT head_dim not a power of two in 8..256, LOWRANK
     * past its size) has size 0 there: refused, so its decoder never meets such a shape */
    if (s->codec >= KERN_CODEC_COUNT || s->bytes == 0 ||
        s->bytes != kern_sect_bytes(lay, s->codec, lk % kern_kinds(lay)) ||
        s->offset < kern_hdr_bytes(lay) || (uint64_t)s->offset + s->bytes > src_len)
        return 0;
    return 1;
}

/* Elements [d0, d0+n) (n <= 8) of token t, head h of a section (codec, sect: its payload, sa
 * its address's low bits) of kind k, as out-dtype bits: the reference's arithmetic, element
 * by element. Not ROT keys: the lanes of a row decode those together
 * (kern_batch_decode_step). */
KERN_HD void kern_batch_dec8(const struct kern_layout *lay, uint32_t codec, const uint8_t *sect,
                             uint32_t sa, uint32_t k, uint32_t t, uint32_t h, uint32_t d0,
                             uint32_t n, uint32_t out, uint16_t *y)
{
    const uint32_t H = lay->heads, D = lay->head_dim, T = lay->tokens;
    uint32_t v[4];
    codec = kern_codec_as(codec, k == 1 && !lay->k_only);
    const int bits = kern_codec_bits(codec);
    if (codec == KERN_CODEC_MERGE) {
        /* heads are 16-byte multiples: the map's words are 4-byte aligned where sect is */
        const uint8_t *head = sect + (uint64_t)h * kern_merge_head_bytes(D, T);
        const uint8_t *map = head + 16;
        const uint32_t mb = kern_merge_map_bytes(T);
        uint32_t r0 = 0;
        for (uint32_t i = 0; i < t >> 5; i++)
            r0 += kern_batch_popc(kern_batch_ld32(map + 4 * i, sa));
        uint32_t mw = kern_batch_ld32(map + 4 * (t >> 5), sa);
        mw &= (t & 31) == 31 ? 0xffffffffu : ((1u << ((t & 31) + 1)) - 1);
        r0 += kern_batch_popc(mw) - 1;
        const uint32_t r = r0 < kern_merge_rows(T) ? r0 : 0;
        const uint8_t *row = map + mb + 2ull * r * D + 2ull * d0;
        kern_batch_ld(row, 2 * n, kern_batch_wd(sa | mb | 2 * D, 2 * n), v);
        KERN_UNROLL
        for (uint32_t j = 0; j < 8; j++)
            if (j < n)
                y[j] = kern_batch_cvt(kern_batch_e16(v, j), lay->dtype, out);
        return;
    }
    if (codec == KERN_CODEC_LOWRANK) {
        /* x^[t][d] = sum_i (sigma_i * u[t][i]) * w[i][d] (kern_lowrank_val): the factor
         * sigma_i * u[t][i] is the same for the lane's 8 elements, so it is loaded and
         * rounded once per i, and each element's sum still adds the rank's terms in order,
         * each by one fused multiply-add as the reference's. Heads are 16-byte multiples;
         * sigma is fp32 at 16 + 4i, u fp16, w's rows 2D bytes after 16 + 4 cap + 2 T cap. */
        const uint32_t cap = kern_lowrank_cap(D, T);
        const uint8_t *head = sect + (uint64_t)h * kern_lowrank_head_bytes(D, T);
        const uint32_t r = kern_batch_ld32(head, sa);
        const uint32_t rank = r < cap ? r : cap;
        const uint8_t *u = kern_lowrank_u(head, cap) + 2ull * t * cap;
        const uint8_t *wr = kern_lowrank_w(head, cap, T) + 2ull * d0;
        const uint32_t ww = kern_batch_wd(sa | 4 * cap | 2 * T * cap | 2 * D, 2 * n);
        float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (uint32_t i = 0; i < rank; i++, wr += 2ull * D) {
            const float f = KERN_MUL(kern_u2f(kern_batch_ld32(head + 16 + 4 * i, sa)),
                                     kern_batch_ldh(u + 2 * i, sa));
            kern_batch_ld(wr, 2 * n, ww, v);
            KERN_UNROLL
            for (uint32_t j = 0; j < 8; j++)
                if (j < n)
                    acc[j] = KERN_FMA(f, kern_h2f((uint16_t)kern_batch_e16(v, j)), acc[j]);
        }
        KERN_UNROLL
        for (uint32_t j = 0; j < 8; j++)
            if (j < n)
                y[j] = kern_batch_out(acc[j], out);
        return;
    }
    if (codec == KERN_CODEC_RAW) {
        const uint8_t *src = sect + 2 * (((uint64_t)t * H + h) * D + d0);
        kern_batch_ld(src, 2 * n, kern_batch_wd(sa | 2 * D, 2 * n), v);
        KERN_UNROLL
        for (uint32_t j = 0; j < 8; j++)
            if (j < n)
                y[j] = kern_batch_cvt(kern_batch_e16(v, j), lay->dtype, out);
        return;
    }
    if (codec == KERN_CODEC_FP8) {
        const float scale = kern_u2f(kern_batch_ld32(sect + 4 * h, sa));
        const uint8_t *q = sect + 4 * H + ((uint64_t)t * H + h) * D + d0;
        kern_batch_ld(q, n, kern_batch_wd(sa | 4 * H | D, n), v);
        KERN_UNROLL
        for (uint32_t j = 0; j < 8; j++)
            if (j < n)
                y[j] = kern_batch_out(KERN_MUL(kern_e4m3_dec((uint8_t)kern_batch_b8(v, j)), scale),
                                      out);
        return;
    }
    if (bits && (k == 0 || lay->k_only)) {
        /* (no decode step reaches this branch: KIVI key steps take kern_batch_kivik_lane;
         * kept, as ptxas spilled more without it, docs/design/gpu.md "KIVI key rounds")
         * KIVI keys: per channel over groups of 32 tokens, [H][groups]; a group's scales,
         * mins and rows at 0, 2D and 4D + row * rb, heads and groups 4-byte multiples. The
         * piece's codes are its bits bytes from d0 * bits / 8 (d0 a multiple of 8) */
        const uint32_t rb = kern_kivi_row_bytes(D, bits);
        const uint32_t full_gb = kern_kivi_k_group_bytes(D, KERN_GROUP, bits);
        const uint32_t hb = kern_kivi_k_head_bytes(D, T, bits);
        const uint8_t *g = sect + (uint64_t)h * hb + (uint64_t)(t / KERN_GROUP) * full_gb;
        const uint8_t *codes = g + 4 * D + (uint64_t)(t % KERN_GROUP) * rb + d0 / 8 * bits;
        const uint32_t ga = sa | hb | full_gb;
        uint32_t sc[4], mn[4];
        kern_batch_ld(g + 2 * d0, 2 * n, kern_batch_wd(ga, 2 * n), sc);
        kern_batch_ld(g + 2 * D + 2 * d0, 2 * n, kern_batch_wd(ga | 2 * D, 2 * n), mn);
        const uint32_t cb = (n * (uint32_t)bits + 7) / 8;
        kern_batch_ld(codes, cb, kern_batch_wd(ga | 4 * D | rb | (uint32_t)bits, cb), v);
        KERN_UNROLL
        for (uint32_t j = 0; j < 8; j++)
            if (j < n)
                y[j] = kern_batch_out(kern_kivi_val((v[0] >> (bits * j)) & ((1u << bits) - 1),
                                                    kern_h2f((uint16_t)kern_batch_e16(sc, j)),
                                                    kern_h2f((uint16_t)kern_batch_e16(mn, j))),
                                      out);
        return;
    }
    /* ggml groups and KIVI values: [T][H][G] groups of 32 channels (gb bytes: scale, min,
     * codes); d0 is a multiple of 8, so the n elements lie in one group, whose bytes are all
     * there whatever n */
    const uint32_t G = kern_ngroups(D);
    const uint32_t gb = bits                       ? kern_kivi_v_group_bytes(bits)
                        : codec == KERN_CODEC_Q8_0 ? 34u
                        : codec == KERN_CODEC_Q4_1 ? 20u
                                                   : 24u;
    const uint32_t g = d0 / KERN_GROUP, e0 = d0 % KERN_GROUP;
    const uint8_t *blk = sect + (((uint64_t)t * H + h) * G + g) * gb;
    const uint32_t ga = sa | gb;
    if (codec == KERN_CODEC_Q8_0) {
        const float d = kern_batch_ldh(blk, ga);
        kern_batch_ld(blk + 2 + e0, 8, kern_batch_wd(ga | 2, 8), v);
        KERN_UNROLL
        for (uint32_t j = 0; j < 8; j++)
            if (j < n)
                y[j] = kern_batch_out(KERN_MUL((float)(int8_t)kern_batch_b8(v, j), d), out);
        return;
    }
    const uint32_t dm = kern_batch_ld32(blk, ga);
    const float d = kern_h2f((uint16_t)dm), m = kern_h2f((uint16_t)(dm >> 16));
    if (bits) {
        /* the piece's 8 codes: bits bytes at 4 + e0 / 8 * bits */
        kern_batch_ld(blk + 4 + e0 / 8 * bits, (uint32_t)bits,
                      kern_batch_wd(ga | 4 | (uint32_t)bits, (uint32_t)bits), v);
        const uint32_t c = v[0];
        KERN_UNROLL
        for (uint32_t j = 0; j < 8; j++)
            if (j < n)
                y[j] = kern_batch_out(kern_kivi_val((c >> (bits * j)) & ((1u << bits) - 1), d, m),
                                      out);
        return;
    }
    /* q4_1 / q5_1: element e's low nibble in byte e & 15 of qs (e < 16) or its high one, the
     * piece's 8 bytes from e0 & 15 */
    const int five = codec == KERN_CODEC_Q5_1;
    const uint32_t qo = five ? 8u : 4u;
    const uint32_t qh = five ? kern_batch_ld32(blk + 4, ga) : 0;
    kern_batch_ld(blk + qo + (e0 & 15), 8, kern_batch_wd(ga | qo, 8), v);
    KERN_UNROLL
    for (uint32_t j = 0; j < 8; j++) {
        if (j >= n)
            continue;
        const uint32_t e = e0 + j, qb = kern_batch_b8(v, j);
        uint32_t q = e < 16 ? (qb & 0xfu) : (qb >> 4);
        q |= ((qh >> e) & 1u) << 4;
        y[j] = kern_batch_out(KERN_ADD(KERN_MUL((float)q, d), m), out);
    }
}

/* What a decode step reads once from its block, whatever its rows: whether the block is an
 * encoded block of the layout with the step's section inside its length (ok), that section's
 * codec and offset, and the raw-head appendix (kern.h: its offset and count, 0 when absent or
 * out of bounds). */
struct kern_batch_src {
    uint32_t ok, codec, offset, rh, rcnt;
};

KERN_HD void kern_batch_src_at(const struct kern_layout *lay, const uint8_t *src, uint64_t src_len,
                               uint32_t lk, struct kern_batch_src *o)
{
    struct kern_block_sect s;
    o->ok = (uint32_t)kern_batch_sect(lay, src, src_len, lk, &s);
    if (!o->ok)
        return;
    o->codec = s.codec;
    o->offset = s.offset;
    const uint64_t r = kern_batch_hdr_reserved(src);
    o->rh = (uint32_t)r;
    o->rcnt = (uint32_t)(r >> 32);
    /* An appendix of no heads is none (kern_rawh_bytes is 0 there: its slot table would be
     * read from wherever the offset points, past the block's end too). */
    if (o->rh && (o->rcnt == 0 || o->rh + kern_rawh_bytes(lay, o->rcnt) > src_len))
        o->rh = 0;
}

/* ---- a decode step, phase by phase ------------------------------------------------------
 * A round of a step gives each of the warp's 32 lanes one item, a piece of 8 elements of a
 * head row; its phases are run by every lane before any lane starts the next: (1) each lane
 * locates its piece and decodes it (kern_batch_piece_dec), (2) the lanes of a ROT key row
 * transform it together (kern_batch_rot_xor, kern_batch_rot_pair), (3) each lane finishes
 * and stores its piece (kern_batch_piece_put). On the device a call of the step is one lane
 * (KERN_BATCH_WARP_NL = 1), the phases kept apart by the shuffles' warp-wide exchange; in the
 * emulation a call is the whole warp, each phase a loop over the 32 lanes, so the tests run
 * the lanes' exchange as the device does.
 *
 * ROT keys. Row (t, h) is D = 2^k rotated values (8 <= D <= 256) in KIVI value groups,
 * decoded as x = s .* (c * FWHT(y)) + mean (kern_rot_inv, then the channels' means). Its D / 8
 * pieces are D / 8 consecutive lanes of one round: a round's items start at a multiple of 32,
 * a token's items are H * D / 8, and D / 8 divides 32. So the row is decoded once per round:
 * each lane decodes its 8 rotated values and runs the Walsh-Hadamard stages of length 1, 2
 * and 4 over them (kern_fwht over 8: those pairs lie inside a piece); the stage of length 8m
 * (m = 1, 2, .., D / 16) pairs lane l with lane l ^ m, kern_fwht's pair (j, j + 8m), the lane
 * without bit m keeping a + b and the other a - b (a the lower lane's value). Same pairs, same
 * stage order, same operations as kern_fwht, so every value is the reference's bit for bit;
 * then each lane scales, signs and adds the means of its own 8 channels. kern_batch_sect
 * refuses a ROT section for any other D (its size is 0 there), so D / 8 lanes always fit a
 * warp. */
#ifdef __CUDA_ARCH__
#define KERN_BATCH_WARP_NL 1u /* lanes one call of a decode step runs: its own */
#else
#define KERN_BATCH_WARP_NL KERN_BATCH_LANES /* the emulation: the whole warp */
#endif
/* For each lane l (the i-th of this call's, from lane0) */
#define KERN_BATCH_FOR_LANES(i, l, lane0)                                                          \
    for (uint32_t i = 0, l = (lane0); i < KERN_BATCH_WARP_NL; i++, l++)

/* What a decode step knows for all its rounds: its place, block, section, engine side, and
 * for a ROT key section (rbits != 0) the seed, scale, groups and means. */
struct kern_batch_dstep {
    struct kern_batch_at at;
    struct kern_batch_src hs;
    struct kern_batch_eng e;
    const uint8_t *src;
    uint32_t lg; /* the layer in the encoded block */
    uint32_t rbits, rseed;
    float rscale;
    const uint8_t *rgroups, *rmeans;
};

/* The low bits of the section's and of the raw-head appendix's addresses: the widths of the
 * step's loads (kern_batch_wd), the same for every lane (recomputed where used: two registers
 * fewer held through the step). */
KERN_HD uint32_t kern_batch_dsa(const struct kern_batch_dstep *st)
{
    return (uint32_t)(uintptr_t)st->src + st->hs.offset;
}

KERN_HD uint32_t kern_batch_dra(const struct kern_batch_dstep *st)
{
    return (uint32_t)(uintptr_t)st->src + st->hs.rh;
}

/* One lane's piece in a round: where its elements go (NULL: nowhere: past the step, or a
 * token without a page), how many (<= 8), its head and first channel; y its output bits, or
 * (rot) x its values of a ROT key row in the middle of the warp's transform. */
struct kern_batch_piece {
    uint8_t *to;
    uint32_t n, h, d0, rot;
    float x[8];
    uint16_t y[8];
};

/* Phase 1: item c of the step (any c: one past the step's items is a piece with no place) */
KERN_HD void kern_batch_piece_dec(const struct kern_batch *b, const uint64_t *w,
                                  const struct kern_batch_dstep *st, uint32_t c,
                                  struct kern_batch_piece *p)
{
    const struct kern_layout *lay = &b->klay;
    const uint32_t T = b->block_tokens, H = b->heads, D = b->head_dim;
    const uint32_t O = (D + 7) / 8, items = b->items;
    p->to = 0;
    p->n = p->h = p->d0 = p->rot = 0;
    KERN_UNROLL
    for (uint32_t i = 0; i < 8; i++) {
        p->x[i] = 0.0f;
        p->y[i] = 0;
    }
    if (c >= items << b->rshift)
        return;
    const uint32_t j = kern_batch_div(c, items, b->item_shift), cc = c - j * items;
    uint8_t *eng = kern_batch_eng_tok(b, w, &st->e, j);
    if (!eng)
        return;
    const uint32_t t = st->at.t0 + j, h = cc / O, d0 = 8 * (cc - h * O);
    const uint32_t n = D - d0 < 8 ? D - d0 : 8;
    p->to = eng + (uint64_t)h * b->head_stride + 2ull * d0;
    p->n = n;
    p->h = h;
    p->d0 = d0;
    uint32_t slot = 0, v[4];
    if (st->hs.rh) {
        kern_batch_ld(st->src + st->hs.rh + 2 * ((uint64_t)st->lg * H + h), 2,
                      kern_batch_wd(kern_batch_dra(st), 2), v);
        slot = v[0];
    }
    if (slot && slot <= st->hs.rcnt) {
        /* the slot table and the heads are 16- and 2TD-byte multiples */
        const uint64_t hb = kern_rawh_head_bytes(lay);
        const uint8_t *row = st->src + st->hs.rh + kern_rawh_table_bytes(lay) +
                             (uint64_t)(slot - 1) * hb + ((uint64_t)st->at.k * T + t) * 2ull * D +
                             2ull * d0;
        kern_batch_ld(row, 2 * n, kern_batch_wd(kern_batch_dra(st) | (uint32_t)hb | 2 * D, 2 * n),
                      v);
        for (uint32_t i = 0; i < n; i++)
            p->y[i] = lay->dtype == b->out_dtype
                          ? (uint16_t)kern_batch_e16(v, i)
                          : kern_batch_out(lay->dtype == KERN_DTYPE_BF16
                                               ? kern_bf2f((uint16_t)kern_batch_e16(v, i))
                                               : kern_h2f((uint16_t)kern_batch_e16(v, i)),
                                           b->out_dtype);
    } else if (st->rbits) {
        /* this piece's 8 rotated values (one KIVI value group holds them: 8 divides 32) and
         * the transform's stages inside it; the groups start at a 16-byte multiple of the
         * section, a group is scale, min and 4 * bits bytes of codes, the piece's bits bytes
         * from 4 + (d0 % 32) / 8 * bits */
        const uint32_t rb = st->rbits, gb = kern_kivi_v_group_bytes((int)rb);
        const uint8_t *g =
            st->rgroups + (((uint64_t)t * H + h) * kern_ngroups(D) + d0 / KERN_GROUP) * gb;
        const uint32_t dm = kern_batch_ld32(g, kern_batch_dsa(st) | gb);
        const float sc = kern_h2f((uint16_t)dm), mn = kern_h2f((uint16_t)(dm >> 16));
        kern_batch_ld(g + 4 + d0 % KERN_GROUP / 8 * rb, rb,
                      kern_batch_wd(kern_batch_dsa(st) | gb | 4 | rb, rb), v);
        KERN_UNROLL
        for (uint32_t i = 0; i < 8; i++)
            p->x[i] = kern_kivi_val((v[0] >> (rb * i)) & ((1u << rb) - 1), sc, mn);
        kern_fwht(p->x, 8);
        p->rot = 1;
    } else if (st->hs.ok)
        kern_batch_dec8(lay, st->hs.codec, st->src + st->hs.offset, kern_batch_dsa(st), st->at.k, t,
                        h, d0, n, b->out_dtype, p->y);
}

/* Phase 2a: q[i] = the x of lane l ^ m, for each lane l of this call, as it was before the
 * stage: a shuffle on the device; in the emulation read from the warp's pieces before any
 * of them changes. */
KERN_HD void kern_batch_rot_xor(const struct kern_batch_piece *p, uint32_t m, float (*q)[8])
{
#ifdef __CUDA_ARCH__
    KERN_UNROLL
    for (uint32_t i = 0; i < 8; i++)
        q[0][i] = __shfl_xor_sync(0xffffffffu, p[0].x[i], m);
#else
    for (uint32_t l = 0; l < KERN_BATCH_LANES; l++)
        for (uint32_t i = 0; i < 8; i++)
            q[l][i] = p[l ^ m].x[i];
#endif
}

/* Phase 2b: the stage's butterflies on a lane's 8 values x with its partner's q: the lower
 * lane of the pair (upper == 0) keeps a + b, the upper one a - b, a the lower's value. */
KERN_HD void kern_batch_rot_pair(float *x, const float *q, uint32_t upper)
{
    KERN_UNROLL
    for (uint32_t i = 0; i < 8; i++)
        x[i] = upper ? KERN_SUB(q[i], x[i]) : KERN_ADD(x[i], q[i]);
}

/* Phase 3: a ROT piece's scale, signs and means (kern_rot_inv's last loop, then the mean),
 * and the store: one 16-byte access where the batch allows it, else element by element. */
KERN_HD void kern_batch_piece_put(const struct kern_batch *b, const struct kern_batch_dstep *st,
                                  struct kern_batch_piece *p)
{
    if (!p->to)
        return;
    if (p->rot) {
        /* the means, fp16 [H][D] at 16 in the section: the piece's 16 bytes */
        const uint8_t *mean = st->rmeans + 2ull * ((uint64_t)p->h * b->head_dim + p->d0);
        uint32_t mv[4];
        kern_batch_ld(mean, 16, kern_batch_wd(kern_batch_dsa(st) | 2 * b->head_dim, 16), mv);
        KERN_UNROLL
        for (uint32_t i = 0; i < 8; i++) {
            const float x = KERN_MUL(p->x[i], st->rscale);
            const float v = kern_rot_neg(st->rseed, p->h, p->d0 + i) ? -x : x;
            p->y[i] = kern_batch_out(KERN_ADD(v, kern_h2f((uint16_t)kern_batch_e16(mv, i))),
                                     b->out_dtype);
        }
    }
    if (b->vec == 16 && p->n == 8) {
        kern_batch_v16 v;
        memcpy(&v, p->y, 16);
        KERN_BATCH_STORE(kern_batch_v16, p->to, v);
    } else {
        KERN_UNROLL
        for (uint32_t i = 0; i < 8; i++)
            if (i < p->n)
                memcpy(p->to + 2 * i, &p->y[i], 2);
    }
}

/* ---- the fast rounds -------------------------------------------------------------------
 * Most sections a decode meets are token-major groups with nothing per row to exchange or
 * look up: q8_0, q4_1, q5_1, fp8, KIVI values, raw; no raw-head appendix; whole 8-element
 * pieces (head_dim a multiple of 8) stored as 16-byte accesses (vec16). A step of such a
 * section takes the fast rounds: its section's form, strides and load widths are worked out
 * once for the step (kern_batch_fast_at), and each piece is a few loads, the reference's
 * arithmetic per element and one 16-byte store — none of the generic piece's per-piece codec
 * dispatch, width arithmetic, raw-head and ROT checks, or lane exchange. Two pieces of a lane
 * are loaded before either is decoded and stored, so a warp has twice the loads in flight.
 * The loads are the generic path's, field by field and width by width (the tests count
 * them), and the output is bit for bit the same (the tests compare against the reference). */
enum kern_batch_fast_form {
    KERN_BATCH_FAST_NONE = 0,
    KERN_BATCH_FAST_RAW,
    KERN_BATCH_FAST_FP8,
    KERN_BATCH_FAST_Q8_0,
    KERN_BATCH_FAST_Q4_1, /* and q5_1: fast.qo says which */
    KERN_BATCH_FAST_KIVI_V,
};

/* What the fast rounds of a step know for every piece: the section's form and load widths,
 * and the batch's and the step's fields they use, gathered once per step. */
struct kern_batch_fast {
    uint32_t form;
    const uint8_t *sect;
    uint32_t o, osh; /* pieces per head row (head_dim / 8) and its log2, or 32 */
    uint32_t gb;     /* a group's bytes (token-major groups of 32 channels) */
    uint32_t bits;   /* KIVI values: bits per code */
    uint32_t qo;     /* q4_1 / q5_1: the codes' offset in a group (4 or 8) */
    uint32_t w0, w1; /* load widths: a group's scale (or fp8's) and its codes (raw: the row) */
    uint32_t same;   /* raw: the block's dtype is the output's (the bits themselves) */
    /* the batch's */
    uint32_t heads, head_dim, items, item_shift, nitems, dtype, out;
    uint32_t page_tokens, pt_shift, tab;
    uint64_t page_stride, token_stride, head_stride;
    /* the step's: its first token in the block, its engine side (kern_batch_eng) */
    uint32_t t0, rel0, slot0;
    int32_t page0;
    uint8_t *base;
};

/* The loaded fields of one piece: where it goes (NULL: nowhere), its scale word and codes. */
struct kern_batch_fpiece {
    uint8_t *to;
    uint32_t s, e0; /* e0: the piece's first channel in its group (q4_1, q5_1) */
    uint32_t v[4];
};

KERN_HD uint32_t kern_batch_log2_32(uint32_t x)
{
    if (x == 0 || (x & (x - 1)))
        return 32;
#ifdef __CUDA_ARCH__
    return (uint32_t)__ffs((int)x) - 1;
#else
    return (uint32_t)__builtin_ctz(x);
#endif
}

/* The fast form of a decode step's section, KERN_BATCH_FAST_NONE where the generic rounds
 * must run it; with it, what the rounds need. */
KERN_HD void kern_batch_fast_at(const struct kern_batch *b, const struct kern_batch_dstep *st,
                                struct kern_batch_fast *f)
{
    const struct kern_layout *lay = &b->klay;
    const uint32_t H = b->heads, D = b->head_dim;
    f->form = KERN_BATCH_FAST_NONE;
    if (!st->hs.ok || st->rbits || st->hs.rh || b->vec != 16 || D % 8)
        return;
    const uint32_t codec = kern_codec_as(st->hs.codec, st->at.k == 1 && !lay->k_only);
    const uint32_t sa = kern_batch_dsa(st);
    f->sect = st->src + st->hs.offset;
    f->o = D / 8;
    f->osh = kern_batch_log2_32(f->o);
    f->bits = (uint32_t)kern_codec_bits(codec);
    f->qo = 4;
    f->gb = 0;
    f->w0 = f->w1 = 1;
    f->same = lay->dtype == b->out_dtype;
    if (codec == KERN_CODEC_RAW) {
        f->form = KERN_BATCH_FAST_RAW;
        f->w1 = kern_batch_wd(sa | 2 * D, 16);
    } else if (codec == KERN_CODEC_FP8) {
        f->form = KERN_BATCH_FAST_FP8;
        f->w0 = kern_batch_wd(sa, 4);
        f->w1 = kern_batch_wd(sa | 4 * H | D, 8);
    } else if (codec == KERN_CODEC_Q8_0) {
        f->form = KERN_BATCH_FAST_Q8_0;
        f->gb = 34;
        f->w0 = kern_batch_wd(sa | f->gb, 2);
        f->w1 = kern_batch_wd(sa | f->gb | 2, 8);
    } else if (codec == KERN_CODEC_Q4_1 || codec == KERN_CODEC_Q5_1) {
        f->form = KERN_BATCH_FAST_Q4_1;
        f->qo = codec == KERN_CODEC_Q5_1 ? 8u : 4u;
        f->gb = codec == KERN_CODEC_Q5_1 ? 24u : 20u;
        f->w0 = kern_batch_wd(sa | f->gb, 4);
        f->w1 = kern_batch_wd(sa | f->gb | f->qo, 8);
    } else if (f->bits && st->at.k == 1 && !lay->k_only) {
        f->form = KERN_BATCH_FAST_KIVI_V;
        f->gb = kern_kivi_v_group_bytes((int)f->bits);
        f->w0 = kern_batch_wd(sa | f->gb, 4);
        f->w1 = kern_batch_wd(sa | f->gb | 4 | f->bits, f->bits);
    }
    f->heads = H;
    f->head_dim = D;
    f->items = b->items;
    f->item_shift = b->item_shift;
    f->nitems = b->items << b->rshift;
    f->dtype = lay->dtype;
    f->out = b->out_dtype;
    f->page_tokens = b->page_tokens;
    f->pt_shift = b->pt_shift;
    f->tab = kern_batch_tab_word(b);
    f->page_stride = b->page_stride;
    f->token_stride = b->token_stride;
    f->head_stride = b->head_stride;
    f->t0 = st->at.t0;
    f->rel0 = st->e.rel0;
    f->slot0 = st->e.slot0;
    f->page0 = st->e.page0;
    f->base = st->e.base;
}

/* Loads item c of the step (one past the step's items, or a token without a page: a piece
 * with no place). The engine's token as kern_batch_eng_tok finds it. */
KERN_HD void kern_batch_fast_load(const struct kern_batch_fast *f, const uint64_t *w, uint32_t c,
                                  struct kern_batch_fpiece *p)
{
    const uint32_t H = f->heads, D = f->head_dim, items = f->items;
    p->to = 0;
    if (c >= f->nitems)
        return;
    const uint32_t j = kern_batch_div(c, items, f->item_shift), cc = c - j * items;
    uint8_t *eng =
        kern_batch_tok(f->base, f->rel0, f->slot0, f->page0, f->page_tokens, f->pt_shift,
                       f->page_stride, f->token_stride, (const uint8_t *)(w + f->tab), j);
    if (!eng)
        return;
    const uint32_t h = kern_batch_div(cc, f->o, f->osh), d0 = 8 * (cc - h * f->o);
    const uint64_t th = (uint64_t)(f->t0 + j) * H + h;
    p->to = eng + (uint64_t)h * f->head_stride + 2ull * d0;
    if (f->form == KERN_BATCH_FAST_RAW) {
        kern_batch_ld(f->sect + 2 * (th * D + d0), 16, f->w1, p->v);
        return;
    }
    if (f->form == KERN_BATCH_FAST_FP8) {
        uint32_t s[4];
        kern_batch_ld(f->sect + 4 * h, 4, f->w0, s);
        p->s = s[0];
        kern_batch_ld(f->sect + 4 * H + th * D + d0, 8, f->w1, p->v);
        return;
    }
    /* token-major groups of 32 channels: the piece's 8 lie in group d0 / 32 */
    const uint8_t *g = f->sect + (th * kern_ngroups(D) + d0 / KERN_GROUP) * f->gb;
    const uint32_t e0 = d0 % KERN_GROUP;
    uint32_t s[4];
    p->e0 = e0;
    if (f->form == KERN_BATCH_FAST_Q8_0) {
        kern_batch_ld(g, 2, f->w0, s);
        p->s = s[0];
        kern_batch_ld(g + 2 + e0, 8, f->w1, p->v);
    } else if (f->form == KERN_BATCH_FAST_Q4_1) {
        kern_batch_ld(g, 4, f->w0, s);
        p->s = s[0];
        if (f->qo == 8) { /* q5_1: the high bits' word, kept in v[3] (8 bytes of codes) */
            kern_batch_ld(g + 4, 4, f->w0, s);
            kern_batch_ld(g + 8 + (e0 & 15), 8, f->w1, p->v);
            p->v[3] = s[0];
        } else {
            kern_batch_ld(g + 4 + (e0 & 15), 8, f->w1, p->v);
        }
    } else {
        kern_batch_ld(g, 4, f->w0, s);
        p->s = s[0];
        kern_batch_ld(g + 4 + e0 / 8 * f->bits, f->bits, f->w1, p->v);
    }
}

/* Decodes a loaded piece (the reference's arithmetic, element by element, as
 * kern_batch_dec8) and stores it as one 16-byte access. */
KERN_HD void kern_batch_fast_put(const struct kern_batch_fast *f, const struct kern_batch_fpiece *p)
{
    if (!p->to)
        return;
    const uint32_t out = f->out;
    uint32_t o[4];
    uint16_t y[8];
    if (f->form == KERN_BATCH_FAST_RAW && f->same) {
        o[0] = p->v[0];
        o[1] = p->v[1];
        o[2] = p->v[2];
        o[3] = p->v[3];
    } else {
        if (f->form == KERN_BATCH_FAST_RAW) {
            KERN_UNROLL
            for (uint32_t j = 0; j < 8; j++)
                y[j] = kern_batch_cvt(kern_batch_e16(p->v, j), f->dtype, out);
        } else if (f->form == KERN_BATCH_FAST_FP8) {
            const float scale = kern_u2f(p->s);
            KERN_UNROLL
            for (uint32_t j = 0; j < 8; j++)
                y[j] = kern_batch_out(
                    KERN_MUL(kern_e4m3_dec((uint8_t)kern_batch_b8(p->v, j)), scale), out);
        } else if (f->form == KERN_BATCH_FAST_Q8_0) {
            const float d = kern_h2f((uint16_t)p->s);
            KERN_UNROLL
            for (uint32_t j = 0; j < 8; j++)
                y[j] = kern_batch_out(KERN_MUL((float)(int8_t)kern_batch_b8(p->v, j), d), out);
        } else if (f->form == KERN_BATCH_FAST_Q4_1) {
            const float d = kern_h2f((uint16_t)p->s), m = kern_h2f((uint16_t)(p->s >> 16));
            const uint32_t e0 = p->e0, qh = f->qo == 8 ? p->v[3] : 0;
            KERN_UNROLL
            for (uint32_t j = 0; j < 8; j++) {
                const uint32_t e = e0 + j, qb = kern_batch_b8(p->v, j);
                uint32_t q = e < 16 ? (qb & 0xfu) : (qb >> 4);
                q |= ((qh >> e) & 1u) << 4;
                y[j] = kern_batch_out(KERN_ADD(KERN_MUL((float)q, d), m), out);
            }
        } else {
            const float d = kern_h2f((uint16_t)p->s), m = kern_h2f((uint16_t)(p->s >> 16));
            const uint32_t bits = f->bits, c = p->v[0];
            KERN_UNROLL
            for (uint32_t j = 0; j < 8; j++)
                y[j] = kern_batch_out(kern_kivi_val((c >> (bits * j)) & ((1u << bits) - 1), d, m),
                                      out);
        }
        KERN_UNROLL
        for (uint32_t j = 0; j < 4; j++)
            o[j] = (uint32_t)y[2 * j] | (uint32_t)y[2 * j + 1] << 16;
    }
    kern_batch_v16 v;
    memcpy(&v, o, 16);
    KERN_BATCH_STORE(kern_batch_v16, p->to, v);
}

/* ---- the KIVI key rounds -----------------------------------------------------------------
 * KIVI keys are channel-major: a head's tokens in groups of 32, each group the D channels'
 * fp16 scales and mins, then its rows of packed codes ([H][groups], kern_kivi_k_*). A step's R
 * tokens (R a power of two, t0 a multiple of R) lie in one group where R <= 32, in R / 32
 * whole groups otherwise, so the pieces of one column (head h, channels d0..d0+7) share their
 * 8 scales and mins over the step's tokens of a group. A lane of a KIVI key step keeps its
 * columns: lane l takes column l % cpr (cpr = min(items, 32) columns side by side, then
 * column + cpr, ...) and tokens l / cpr, + tpr, ... (tpr = 32 / cpr tokens side by side; lanes
 * from cpr * tpr on idle), so a round's lanes still store consecutive pieces of a token row.
 * Per column and group a lane loads the 8 scales and 8 mins once (the generic path's loads,
 * in the same widths) and converts them once; per piece it loads its bits bytes of codes,
 * two pieces loaded before either is decoded and stored, and computes the reference's
 * q * scale + min per element (kern_kivi_val). Where, load widths and strides are worked out
 * once per step and column: none of the generic piece's codec dispatch, per-piece width
 * arithmetic and raw-head lookup. Every KIVI key section takes these rounds, whatever its
 * shape: a raw head (the appendix) is a column whose pieces copy its rows, a last piece of
 * fewer than 8 channels (head_dim not a multiple of 8) and engine rows not 16-byte aligned
 * are stored element by element. The emulation runs each lane's share in turn (the lanes
 * exchange nothing). */
#ifndef __CUDACC__
extern uint64_t kern_batch_kivik_pieces; /* pieces the emulation stored by these rounds */
#endif

/* fp16 to float, the value kern_h2f gives: on the device the conversion instruction (exact
 * for every fp16 that is not a NaN) and kern_h2f for a NaN (its payload kept). */
KERN_HD float kern_batch_h2f(uint32_t h)
{
#ifdef __CUDA_ARCH__
    if ((h & 0x7c00u) != 0x7c00u || (h & 0x3ffu) == 0)
        return __half2float(__ushort_as_half((unsigned short)h));
#endif
    return kern_h2f((uint16_t)h);
}

/* The code bits of the step's section when it is a KIVI key section, else 0. */
KERN_HD uint32_t kern_batch_kivik_bits(const struct kern_batch *b,
                                       const struct kern_batch_dstep *st)
{
    if (!st->hs.ok || st->rbits || (st->at.k == 1 && !b->klay.k_only))
        return 0;
    return (uint32_t)kern_codec_bits(st->hs.codec);
}

/* Stores a piece's 8 out-dtype values y (n of them: one 16-byte access where the batch allows,
 * else element by element). */
KERN_HD void kern_batch_put8(const struct kern_batch *b, uint8_t *to, uint32_t n, const uint16_t *y)
{
    if (b->vec == 16 && n == 8) {
        uint32_t o[4];
        KERN_UNROLL
        for (uint32_t j = 0; j < 4; j++)
            o[j] = (uint32_t)y[2 * j] | (uint32_t)y[2 * j + 1] << 16;
        kern_batch_v16 v;
        memcpy(&v, o, 16);
        KERN_BATCH_STORE(kern_batch_v16, to, v);
    } else {
        KERN_UNROLL
        for (uint32_t j = 0; j < 8; j++)
            if (j < n)
                memcpy(to + 2 * j, &y[j], 2);
    }
}

/* kern_batch_put8, counted as a piece of the KIVI key rounds. */
KERN_HD void kern_batch_kivik_store(const struct kern_batch *b, uint8_t *to, uint32_t n,
                                    const uint16_t *y)
{
#ifndef __CUDACC__
    kern_batch_kivik_pieces++;
#endif
    kern_batch_put8(b, to, n, y);
}

/* A raw head's column of a KIVI key step (lane's tokens jl, jl + tpr, ... of the step's R):
 * its rows copied from row (the appendix's row of the step's first token, at the column's
 * channel), rw the loads' width. */
#ifdef __CUDA_ARCH__
__noinline__
#endif
    KERN_HD void
    kern_batch_kivik_raw(const struct kern_batch *b, const uint64_t *w, struct kern_batch_eng e,
                         const uint8_t *row, uint32_t rw, uint64_t hoff, uint32_t n, uint32_t jl,
                         uint32_t tpr)
{
    const uint32_t out = b->out_dtype, dtype = b->klay.dtype, R = 1u << b->rshift;
    for (uint32_t j = jl; j < R; j += tpr) {
        uint8_t *eng = kern_batch_eng_tok(b, w, &e, j);
        if (!eng)
            continue;
        uint32_t v[4];
        uint16_t y[8];
        kern_batch_ld(row + (uint64_t)j * 2 * b->head_dim, 2 * n, rw, v);
        KERN_UNROLL
        for (uint32_t i = 0; i < 8; i++) {
            const uint32_t x = kern_batch_e16(v, i);
            y[i] = dtype == out ? (uint16_t)x
                                : kern_batch_out(dtype == KERN_DTYPE_BF16 ? kern_bf2f((uint16_t)x)
                                                                          : kern_h2f((uint16_t)x),
                                                 out);
        }
        kern_batch_kivik_store(b, eng + hoff, n, y);
    }
}

/* Lane l's share of a KIVI key step (bits: its codes' width; st from kern_batch_dstep_at). */
KERN_HD void kern_batch_kivik_lane(const struct kern_batch *b, const uint64_t *w,
                                   const struct kern_batch_dstep *st, uint32_t bits, uint32_t l)
{
    const uint32_t D = b->head_dim, T = b->block_tokens, items = b->items;
    const uint32_t O = (D + 7) / 8;
    const uint32_t cpr = items < KERN_BATCH_LANES ? items : KERN_BATCH_LANES;
    const uint32_t tpr = KERN_BATCH_LANES / cpr;
    if (l >= cpr * tpr)
        return;
    const uint32_t jl = l / cpr;
    const uint32_t R = 1u << b->rshift; /* <= KERN_GROUP: the step's tokens are in one group */
    /* a group's scales, mins and rows at 0, 2D and 4D + row * rb; heads (hb) and groups (gb)
     * 4-byte multiples, a piece's codes its bits bytes from d0 / 8 * bits */
    const uint32_t rb = kern_kivi_row_bytes(D, (int)bits);
    const uint32_t gb = kern_kivi_k_group_bytes(D, KERN_GROUP, (int)bits);
    const uint32_t hb = kern_kivi_k_head_bytes(D, T, (int)bits);
    const uint32_t ga = kern_batch_dsa(st) | hb | gb;
    for (uint32_t cc = l - jl * cpr; cc < items; cc += cpr) {
        const uint32_t h = cc / O, d0 = 8 * (cc - h * O), n = D - d0 < 8 ? D - d0 : 8;
        const uint64_t hoff = (uint64_t)h * b->head_stride + 2ull * d0;
        if (st->hs.rh) {
            /* a raw head: its rows in the appendix (the slot table and the heads 16- and
             * 2TD-byte multiples) */
            uint32_t v[4];
            kern_batch_ld(st->src + st->hs.rh + 2 * ((uint64_t)st->lg * b->heads + h), 2,
                          kern_batch_wd(kern_batch_dra(st), 2), v);
            const uint32_t slot = v[0];
            if (slot && slot <= st->hs.rcnt) {
                const uint64_t rhb = kern_rawh_head_bytes(&b->klay);
                const uint8_t *row = st->src + st->hs.rh + kern_rawh_table_bytes(&b->klay) +
                                     (uint64_t)(slot - 1) * rhb +
                                     ((uint64_t)st->at.k * T + st->at.t0) * 2ull * D + 2ull * d0;
                kern_batch_kivik_raw(
                    b, w, st->e, row,
                    kern_batch_wd(kern_batch_dra(st) | (uint32_t)rhb | 2 * D, 2 * n), hoff, n, jl,
                    tpr);
                continue;
            }
        }
        const uint32_t cb = (n * bits + 7) / 8, cw = kern_batch_wd(ga | 4 * D | rb | bits, cb);
        const uint32_t t0 = st->at.t0;
        const uint8_t *g =
            st->src + st->hs.offset + (uint64_t)h * hb + (uint64_t)(t0 / KERN_GROUP) * gb;
        float sc[8], mn[8];
        uint32_t v[4];
        kern_batch_ld(g + 2 * d0, 2 * n, kern_batch_wd(ga, 2 * n), v);
        KERN_UNROLL
        for (uint32_t j = 0; j < 8; j++)
            sc[j] = kern_batch_h2f(kern_batch_e16(v, j));
        kern_batch_ld(g + 2 * D + 2 * d0, 2 * n, kern_batch_wd(ga | 2 * D, 2 * n), v);
        KERN_UNROLL
        for (uint32_t j = 0; j < 8; j++)
            mn[j] = kern_batch_h2f(kern_batch_e16(v, j));
        const uint8_t *codes = g + 4 * D + (uint64_t)(t0 % KERN_GROUP) * rb + d0 / 8 * bits;
        for (uint32_t j = jl; j < R; j += 2 * tpr) {
            uint8_t *to[2];
            uint32_t c[2];
            KERN_UNROLL
            for (uint32_t u = 0; u < 2; u++) {
                const uint32_t jj = j + u * tpr;
                to[u] = jj < R ? kern_batch_eng_tok(b, w, &st->e, jj) : 0;
                c[u] = to[u] ? kern_batch_ld_word(codes + (uint64_t)jj * rb, cb, cw) : 0;
            }
            KERN_UNROLL
            for (uint32_t u = 0; u < 2; u++) {
                if (!to[u])
                    continue;
                uint16_t y[8];
                KERN_UNROLL
                for (uint32_t i = 0; i < 8; i++)
                    y[i] = kern_batch_out(
                        kern_kivi_val((c[u] >> (bits * i)) & ((1u << bits) - 1), sc[i], mn[i]),
                        b->out_dtype);
                kern_batch_kivik_store(b, to[u] + hoff, n, y);
            }
        }
    }
}

/* ---- the ROT key rounds ------------------------------------------------------------------
 * A ROT key step in the KIVI key rounds' column mapping: lane l takes column l % cpr (cpr =
 * min(items, 32)), then + cpr, and tokens l / cpr, + tpr, ... (tpr = 32 / cpr; lanes from
 * cpr * tpr on idle). A row's D / 8 pieces stay D / 8 consecutive lanes whose offsets in the
 * row are their lane's low bits: D / 8 is a power of two dividing 32 and items = H * D / 8,
 * so it divides cpr. The exchange of the generic rounds (lane l with l ^ m, kern_fwht's pairs
 * and order) is thus unchanged, and so is every value. Per column and step a lane loads the
 * column's 8 means once (the generic path's 16-byte access) and converts them once, and
 * works the 8 channels' signs out once (kern_rot_neg: two hash rounds a channel, per piece in
 * the generic rounds); per piece it loads the token's group scale and min (4 bytes) and its
 * bits bytes of codes, two pieces loaded before either is decoded. The lanes exchange values,
 * so every lane runs the same rounds: ceil(items / cpr) column rounds and ceil(R / (2 tpr))
 * token rounds of two pieces, a lane without a column or token there (its whole row is alike:
 * same token, same head) exchanging zeros that no row uses. A raw head's column copies its
 * rows before the token rounds (kern_batch_kivik_raw) and then exchanges zeros. The
 * emulation runs the rounds phase by phase across the warp, as the generic rounds. */
#ifndef __CUDACC__
extern uint64_t kern_batch_rotk_pieces; /* pieces the emulation stored by these rounds */
#endif

/* A lane's column of a ROT key step: where its pieces go in an engine row (hoff), its group
 * in the step's first token (g: scale and min; codes from g + cbo), its 8 channels' means and
 * signs (bit i: channel d0 + i negated). rot 0: nothing for the token rounds (no column, or a
 * raw head's, already copied). */
struct kern_batch_rcol {
    const uint8_t *g;
    uint64_t hoff;
    uint32_t rot, neg, cbo;
    float mean[8];
};

/* Lane l's column in the column round starting at column c0. */
KERN_HD void kern_batch_rotk_col(const struct kern_batch *b, const uint64_t *w,
                                 const struct kern_batch_dstep *st, uint32_t l, uint32_t c0,
                                 uint32_t cpr, uint32_t tpr, struct kern_batch_rcol *c)
{
    const uint32_t D = b->head_dim, O = D / 8, jl = l / cpr, cc = c0 + (l - jl * cpr);
    c->rot = 0;
    if (l >= cpr * tpr || cc >= b->items)
        return;
    const uint32_t h = cc / O, d0 = 8 * (cc - h * O);
    c->hoff = (uint64_t)h * b->head_stride + 2ull * d0;
    if (st->hs.rh) {
        /* a raw head: its rows in the appendix (the slot table and the heads 16- and
         * 2TD-byte multiples), copied by the KIVI key rounds' raw column */
        uint32_t v[4];
        kern_batch_ld(st->src + st->hs.rh + 2 * ((uint64_t)st->lg * b->heads + h), 2,
                      kern_batch_wd(kern_batch_dra(st), 2), v);
        const uint32_t slot = v[0];
        if (slot && slot <= st->hs.rcnt) {
            const uint64_t rhb = kern_rawh_head_bytes(&b->klay);
            const uint8_t *row =
                st->src + st->hs.rh + kern_rawh_table_bytes(&b->klay) + (uint64_t)(slot - 1) * rhb +
                ((uint64_t)st->at.k * b->block_tokens + st->at.t0) * 2ull * D + 2ull * d0;
#ifndef __CUDACC__
            const uint64_t k0 = kern_batch_kivik_pieces; /* its stores count as this step's */
#endif
            kern_batch_kivik_raw(b, w, st->e, row,
                                 kern_batch_wd(kern_batch_dra(st) | (uint32_t)rhb | 2 * D, 16),
                                 c->hoff, 8, jl, tpr);
#ifndef __CUDACC__
            kern_batch_rotk_pieces += kern_batch_kivik_pieces - k0;
            kern_batch_kivik_pieces = k0;
#endif
            return;
        }
    }
    /* the groups: [T][H][G] of gb bytes from a 16-byte multiple of the section; a piece's
     * codes bits bytes at 4 + (d0 % 32) / 8 * bits; the means fp16 [H][D] at 16 */
    const uint32_t gb = kern_kivi_v_group_bytes((int)st->rbits);
    c->g = st->rgroups +
           (((uint64_t)st->at.t0 * b->heads + h) * kern_ngroups(D) + d0 / KERN_GROUP) * gb;
    c->cbo = 4 + d0 % KERN_GROUP / 8 * st->rbits;
    uint32_t v[4];
    kern_batch_ld(st->rmeans + 2ull * ((uint64_t)h * D + d0), 16,
                  kern_batch_wd(kern_batch_dsa(st) | 2 * D, 16), v);
    c->neg = 0;
    KERN_UNROLL
    for (uint32_t i = 0; i < 8; i++) {
        c->mean[i] = kern_batch_h2f(kern_batch_e16(v, i));
        c->neg |= kern_rot_neg(st->rseed, h, d0 + i) << i;
    }
    c->rot = 1;
}

/* Phase 2a of the ROT key rounds: q[i] = the x of lane l ^ m, as kern_batch_rot_xor. */
KERN_HD void kern_batch_rotk_xor(float (*x)[8], uint32_t m, float (*q)[8])
{
#ifdef __CUDA_ARCH__
    KERN_UNROLL
    for (uint32_t i = 0; i < 8; i++)
        q[0][i] = __shfl_xor_sync(0xffffffffu, x[0][i], m);
#else
    for (uint32_t l = 0; l < KERN_BATCH_LANES; l++)
        for (uint32_t i = 0; i < 8; i++)
            q[l][i] = x[l ^ m][i];
#endif
}

/* The ROT key rounds of a step (st from kern_batch_dstep_at, st->rbits set). */
KERN_HD void kern_batch_rotk_rounds(const struct kern_batch *b, const uint64_t *w,
                                    const struct kern_batch_dstep *st, uint32_t lane)
{
    const uint32_t O = b->head_dim / 8, items = b->items, R = 1u << b->rshift;
    const uint32_t cpr = items < KERN_BATCH_LANES ? items : KERN_BATCH_LANES;
    const uint32_t tpr = KERN_BATCH_LANES / cpr;
    const uint32_t rb = st->rbits, gb = kern_kivi_v_group_bytes((int)rb);
    /* a token's groups; the loads' widths as the generic rounds' */
    const uint64_t ts = (uint64_t)b->heads * kern_ngroups(b->head_dim) * gb;
    const uint32_t dw = kern_batch_wd(kern_batch_dsa(st) | gb, 4);
    const uint32_t cw = kern_batch_wd(kern_batch_dsa(st) | gb | 4 | rb, rb);
    struct kern_batch_rcol col[KERN_BATCH_WARP_NL];
    for (uint32_t c0 = 0; c0 < items; c0 += cpr) {
        KERN_BATCH_FOR_LANES(i, l, lane)
        kern_batch_rotk_col(b, w, st, l, c0, cpr, tpr, &col[i]);
        for (uint32_t j0 = 0; j0 < R; j0 += 2 * tpr) {
            uint8_t *to[2][KERN_BATCH_WARP_NL];
            uint32_t dm[2][KERN_BATCH_WARP_NL], cd[2][KERN_BATCH_WARP_NL];
            KERN_BATCH_FOR_LANES(i, l, lane)
            {
                KERN_UNROLL
                for (uint32_t u = 0; u < 2; u++) {
                    const uint32_t j = j0 + l / cpr + u * tpr;
                    to[u][i] = col[i].rot && j < R ? kern_batch_eng_tok(b, w, &st->e, j) : 0;
                    dm[u][i] = cd[u][i] = 0;
                    if (to[u][i]) {
                        const uint8_t *g = col[i].g + (uint64_t)j * ts;
                        dm[u][i] = kern_batch_ld_word(g, 4, dw);
                        cd[u][i] = kern_batch_ld_word(g + col[i].cbo, rb, cw);
                    }
                }
            }
            KERN_UNROLL
            for (uint32_t u = 0; u < 2; u++) {
                float x[KERN_BATCH_WARP_NL][8];
                KERN_BATCH_FOR_LANES(i, l, lane)
                {
                    const float sc = kern_batch_h2f(dm[u][i] & 0xffffu);
                    const float mn = kern_batch_h2f(dm[u][i] >> 16);
                    KERN_UNROLL
                    for (uint32_t e = 0; e < 8; e++)
                        x[i][e] =
                            to[u][i]
                                ? kern_kivi_val((cd[u][i] >> (rb * e)) & ((1u << rb) - 1), sc, mn)
                                : 0.0f;
                    kern_fwht(x[i], 8);
                }
                for (uint32_t m = 1; m < O; m <<= 1) {
                    float q[KERN_BATCH_WARP_NL][8];
                    kern_batch_rotk_xor(x, m, q);
                    KERN_BATCH_FOR_LANES(i, l, lane)
                    kern_batch_rot_pair(x[i], q[i], l & m);
                }
                KERN_BATCH_FOR_LANES(i, l, lane)
                {
                    if (!to[u][i])
                        continue;
                    uint16_t y[8];
                    KERN_UNROLL
                    for (uint32_t e = 0; e < 8; e++) {
                        const float v = KERN_MUL(x[i][e], st->rscale);
                        y[e] = kern_batch_out(
                            KERN_ADD((col[i].neg >> e) & 1u ? -v : v, col[i].mean[e]),
                            b->out_dtype);
                    }
#ifndef __CUDACC__
                    kern_batch_rotk_pieces++;
#endif
                    kern_batch_put8(b, to[u][i] + col[i].hoff, 8, y);
                }
            }
        }
    }
}

/* ---- the LOWRANK and MERGE rounds -------------------------------------------------------
 * A LOWRANK key element is x[t][d] = sum_i (sigma_i * u[t][i]) * w[i][d] over the head's rank
 * (kern_lowrank_val); a MERGE element is row r(t)'s, r(t) the run-start bits of the head's
 * bitmap up to t, less one. In the generic rounds every piece paid, besides the per-piece
 * codec dispatch and raw-head lookup, for each rank term nine software fp16 conversions
 * (kern_h2f: three cases, a subnormal's multiply) of its u and 8 w values, and a MERGE piece
 * for the bitmap's words again. Here a lane keeps a column (head h, channels d0..d0+7)
 * through the step, in the KIVI key rounds' mapping (lane l: column l % cpr, then + cpr;
 * tokens l / cpr, + tpr, ...). A LOWRANK column works out its head's rank, factor rows and
 * load widths once per step, and per token and rank term loads sigma_i, u[t][i] and the 16
 * bytes of w[i][d0..d0+7], converts them by the conversion instruction (one NaN test for the
 * 8 w values, kern_batch_h8_nan; a NaN's bits as kern_h2f makes them) and adds the 8
 * products, each element's sum taking the terms in order with the reference's roundings (a
 * fused multiply-add a term, KERN_FMA); its engine row is looked up after the sums. One token
 * at a time: two tokens sharing each w load held 8 more sums through the loop, and the kernel
 * spilled three times as much (docs/design/gpu.md). A MERGE column reads the bitmap once per
 * step (the step's tokens lie in one 32-token word: R <= 32 and t0 a multiple of R) and per token
 * counts its row with one popcount, loads the row's 16 bytes (two tokens loaded before
 * either is stored) and stores them. Raw heads (the appendix) are columns that copy their
 * rows (kern_batch_kivik_raw). The lanes exchange nothing: the emulation runs each lane's
 * share in turn. Only the kernel built with them (KERN_BATCH_COLS_LRM) runs them, so the
 * other kernels keep their registers. */
#ifndef __CUDACC__
extern uint64_t kern_batch_lrm_pieces; /* pieces the emulation stored by these rounds */
#endif

/* Does one of the 8 fp16 values in v[0..4) have a NaN's bits? A half is a NaN when its
 * magnitude is above 0x7c00; adding 0x3ff to the magnitude carries into bit 15 exactly then,
 * and the low half's sum (at most 0x83fe) never carries into the high half. */
KERN_HD uint32_t kern_batch_h8_nan(const uint32_t *v)
{
    uint32_t c = 0;
    KERN_UNROLL
    for (uint32_t j = 0; j < 4; j++)
        c |= (v[j] & 0x7fff7fffu) + 0x03ff03ffu;
    return c & 0x80008000u;
}

/* kern_h2f of a half whose bits are a NaN's: the sign, all exponent bits, the payload. */
KERN_HD float kern_batch_h2f_nan(uint32_t h)
{
    return kern_u2f((h & 0x8000u) << 16 | 0x7f800000u | (h & 0x3ffu) << 13);
}

/* fp16 to float, kern_h2f's value: on the device the conversion instruction (exact for every
 * fp16 but a NaN), a NaN's bits put together as kern_h2f does (no branch to its other
 * cases, so little code inlined where registers are short). */
KERN_HD float kern_batch_h2f1(uint32_t h)
{
#ifdef __CUDA_ARCH__
    const float x = __half2float(__ushort_as_half((unsigned short)h));
    return (h & 0x7fffu) > 0x7c00u ? kern_batch_h2f_nan(h) : x;
#else
    return kern_h2f((uint16_t)h);
#endif
}

/* fp16 to float, kern_h2f's value, for a value of 8 loaded together, nan their
 * kern_batch_h8_nan: on the device the conversion instruction alone where none of the 8 is a
 * NaN (one test for the 8), else kern_batch_h2f1. */
KERN_HD float kern_batch_h2f_if(uint32_t h, uint32_t nan)
{
#ifdef __CUDA_ARCH__
    if (!nan)
        return __half2float(__ushort_as_half((unsigned short)h));
#endif
    (void)nan;
    return kern_batch_h2f1(h);
}

/* Which of these rounds a step's section takes: 1 LOWRANK keys, 2 MERGE, 0 neither. */
KERN_HD uint32_t kern_batch_lrm_form(const struct kern_batch *b, const struct kern_batch_dstep *st)
{
    if (!st->hs.ok || st->rbits)
        return 0;
    const uint32_t c = kern_codec_as(st->hs.codec, st->at.k == 1 && !b->klay.k_only);
    return c == KERN_CODEC_LOWRANK ? 1u : c == KERN_CODEC_MERGE ? 2u : 0u;
}

/* kern_batch_put8, counted as a piece of these rounds. */
KERN_HD void kern_batch_lrm_store(const struct kern_batch *b, uint8_t *to, uint32_t n,
                                  const uint16_t *y)
{
#ifndef __CUDACC__
    kern_batch_lrm_pieces++;
#endif
    kern_batch_put8(b, to, n, y);
}

/* A MERGE column (head h from the section's head hd, channels d0..d0+n): the lane's tokens jl,
 * jl + tpr, ... of the step, two loaded before either is stored. The head's rows follow its
 * 16-byte header and bitmap; heads are 16-byte multiples, so the map's words are 4-byte
 * aligned where the section is, and a row's 16 bytes as aligned as the section, the map's
 * bytes and the row stride allow (a row stride of 2D: 4 bytes at T = 32). */
KERN_HD void kern_batch_merge_col(const struct kern_batch *b, const uint64_t *w,
                                  const struct kern_batch_dstep *st, const uint8_t *hd,
                                  uint32_t d0, uint32_t n, uint64_t hoff, uint32_t jl, uint32_t tpr)
{
    const uint32_t D = b->head_dim, T = b->block_tokens, R = 1u << b->rshift;
    const uint32_t sa = kern_batch_dsa(st), t0 = st->at.t0;
    const uint32_t mb = kern_merge_map_bytes(T), nrows = kern_merge_rows(T);
    const uint8_t *map = hd + 16;
    /* rows stored before the step's map word, and that word */
    uint32_t r0 = 0;
    for (uint32_t i = 0; i < t0 >> 5; i++)
        r0 += kern_batch_popc(kern_batch_ld32(map + 4 * i, sa));
    const uint32_t mw = kern_batch_ld32(map + 4 * (t0 >> 5), sa);
    const uint8_t *rows = map + mb + 2ull * d0;
    const uint32_t rw = kern_batch_wd(sa | mb | 2 * D, 2 * n);
    /* a whole piece in the output's dtype, stored by one 16-byte access */
    const uint32_t same = b->klay.dtype == b->out_dtype && b->vec == 16 && n == 8;
    for (uint32_t j = jl; j < R; j += 2 * tpr) {
        uint8_t *to[2];
        uint32_t v[2][4];
        KERN_UNROLL
        for (uint32_t u = 0; u < 2; u++) {
            const uint32_t jj = j + u * tpr, e = (t0 + jj) & 31;
            to[u] = jj < R ? kern_batch_eng_tok(b, w, &st->e, jj) : 0;
            if (!to[u])
                continue;
            /* the run-start bits up to the token's, less one: its row (kern_batch_dec8's) */
            const uint32_t r = r0 + kern_batch_popc(e == 31 ? mw : mw & ((2u << e) - 1)) - 1;
            kern_batch_ld(rows + 2ull * (r < nrows ? r : 0) * D, 2 * n, rw, v[u]);
        }
        KERN_UNROLL
        for (uint32_t u = 0; u < 2; u++) {
            if (!to[u])
                continue;
            if (same) { /* the row's bits are the output's: stored as loaded */
#ifndef __CUDACC__
                kern_batch_lrm_pieces++;
#endif
                kern_batch_v16 x;
                memcpy(&x, v[u], 16);
                KERN_BATCH_STORE(kern_batch_v16, to[u] + hoff, x);
                continue;
            }
            uint16_t y[8];
            KERN_UNROLL
            for (uint32_t i = 0; i < 8; i++)
                y[i] = kern_batch_cvt(kern_batch_e16(v[u], i), b->klay.dtype, b->out_dtype);
            kern_batch_lrm_store(b, to[u] + hoff, n, y);
        }
    }
}

/* A LOWRANK key column (head hd, channels d0..d0+n): the lane's tokens jl, jl + tpr, ....
 * Heads are 16-byte multiples: sigma fp32 at 16 + 4i, u fp16 [T][cap] after it, w fp16
 * [cap][D] after u; the loads' widths as the generic rounds' (kern_batch_dec8). */
KERN_HD void kern_batch_lowrank_col(const struct kern_batch *b, const uint64_t *w,
                                    const struct kern_batch_dstep *st, const uint8_t *hd,
                                    uint32_t d0, uint32_t n, uint64_t hoff, uint32_t jl,
                                    uint32_t tpr)
{
    const uint32_t D = b->head_dim, T = b->block_tokens, R = 1u << b->rshift;
    const uint32_t sa = kern_batch_dsa(st), cap = kern_lowrank_cap(D, T);
    const uint32_t r = kern_batch_ld32(hd, sa), rank = r < cap ? r : cap;
    const uint8_t *uf = kern_lowrank_u(hd, cap) + 2ull * st->at.t0 * cap;
    const uint8_t *wr = kern_lowrank_w(hd, cap, T) + 2ull * d0;
    const uint32_t ww = kern_batch_wd(sa | 4 * cap | 2 * T * cap | 2 * D, 2 * n);
    const uint32_t uw = kern_batch_wd(sa, 2);
    for (uint32_t j = jl; j < R; j += tpr) {
        const uint8_t *ut = uf + 2ull * j * cap;
        float a[8];
        KERN_UNROLL
        for (uint32_t e = 0; e < 8; e++)
            a[e] = 0.0f;
        const uint8_t *pw = wr, *ps = hd + 16, *pu = ut;
        for (uint32_t i = 0; i < rank; i++, pw += 2 * D, ps += 4, pu += 2) {
            uint32_t v[4];
            kern_batch_ld(pw, 2 * n, ww, v);
            const float f = KERN_MUL(kern_u2f(kern_batch_ld32(ps, sa)),
                                     kern_batch_h2f1(kern_batch_ld_word(pu, 2, uw)));
            const uint32_t nan = kern_batch_h8_nan(v);
            KERN_UNROLL
            for (uint32_t e = 0; e < 8; e++)
                a[e] = KERN_FMA(f, kern_batch_h2f_if(kern_batch_e16(v, e), nan), a[e]);
        }
        /* the engine row looked up after the sums (no registers held through them) */
        uint8_t *to = kern_batch_eng_tok(b, w, &st->e, j);
        if (to) {
            uint16_t y[8];
            KERN_UNROLL
            for (uint32_t e = 0; e < 8; e++)
                y[e] = kern_batch_out(a[e], b->out_dtype);
            kern_batch_lrm_store(b, to + hoff, n, y);
        }
    }
}

/* Lane l's share of a LOWRANK key or MERGE step (form: kern_batch_lrm_form's). */
KERN_HD void kern_batch_lrm_lane(const struct kern_batch *b, const uint64_t *w,
                                 const struct kern_batch_dstep *st, uint32_t form, uint32_t l)
{
    const uint32_t D = b->head_dim, T = b->block_tokens, items = b->items;
    const uint32_t O = (D + 7) / 8;
    const uint32_t cpr = items < KERN_BATCH_LANES ? items : KERN_BATCH_LANES;
    const uint32_t tpr = KERN_BATCH_LANES / cpr;
    if (l >= cpr * tpr)
        return;
    const uint32_t jl = l / cpr;
    const uint64_t hb = form == 2 ? kern_merge_head_bytes(D, T) : kern_lowrank_head_bytes(D, T);
    for (uint32_t cc = l - jl * cpr; cc < items; cc += cpr) {
        const uint32_t h = cc / O, d0 = 8 * (cc - h * O), n = D - d0 < 8 ? D - d0 : 8;
        const uint64_t hoff = (uint64_t)h * b->head_stride + 2ull * d0;
        if (st->hs.rh) {
            /* a raw head: its rows in the appendix (the slot table and the heads 16- and
             * 2TD-byte multiples), copied as the KIVI key rounds copy theirs */
            uint32_t v[4];
            kern_batch_ld(st->src + st->hs.rh + 2 * ((uint64_t)st->lg * b->heads + h), 2,
                          kern_batch_wd(kern_batch_dra(st), 2), v);
            const uint32_t slot = v[0];
            if (slot && slot <= st->hs.rcnt) {
                const uint64_t rhb = kern_rawh_head_bytes(&b->klay);
                const uint8_t *row = st->src + st->hs.rh + kern_rawh_table_bytes(&b->klay) +
                                     (uint64_t)(slot - 1) * rhb +
                                     ((uint64_t)st->at.k * T + st->at.t0) * 2ull * D + 2ull * d0;
#ifndef __CUDACC__
                const uint64_t k0 = kern_batch_kivik_pieces; /* counted as this step's */
#endif
                kern_batch_kivik_raw(
                    b, w, st->e, row,
                    kern_batch_wd(kern_batch_dra(st) | (uint32_t)rhb | 2 * D, 2 * n), hoff, n, jl,
                    tpr);
#ifndef __CUDACC__
                kern_batch_lrm_pieces += kern_batch_kivik_pieces - k0;
                kern_batch_kivik_pieces = k0;
#endif
                continue;
            }
        }
        const uint8_t *hd = st->src + st->hs.offset + (uint64_t)h * hb;
        if (form == 2)
            kern_batch_merge_col(b, w, st, hd, d0, n, hoff, jl, tpr);
        else
            kern_batch_lowrank_col(b, w, st, hd, d0, n, hoff, jl, tpr);
    }
}

/* What a decode step knows before its rounds (kern_batch_decode_step): 0 when its block is not
 * this batch's (a NULL block: the same for the whole warp). */
KERN_HD int kern_batch_dstep_at(const struct kern_batch *b, const uint64_t *w, uint32_t s,
                                uint32_t lane, struct kern_batch_dstep *st)
{
    const struct kern_layout *lay = &b->klay;
    const uint32_t K = b->kinds, L = b->layers, D = b->head_dim;
    memset(st, 0, sizeof(*st)); /* every field set, whichever way this returns */
    kern_batch_step_at(b, s, &st->at);
    st->src = kern_batch_ptr(w, K * L + st->at.bi);
    if (!st->src)
        return 0;
    const uint64_t src_len = w[K * L + b->nblocks + st->at.bi];
    st->lg = b->layer_first + st->at.l;
    struct kern_batch_src hs = {0, 0, 0, 0, 0};
    if (kern_batch_reader(lane))
        kern_batch_src_at(lay, st->src, src_len, st->lg * K + st->at.k, &hs);
    st->hs.ok = kern_batch_bcast(hs.ok);
    st->hs.codec = kern_batch_bcast(hs.codec);
    st->hs.offset = kern_batch_bcast(hs.offset);
    st->hs.rh = kern_batch_bcast(hs.rh);
    st->hs.rcnt = kern_batch_bcast(hs.rcnt);
    kern_batch_eng_at(b, w, &st->at, &st->e);
    st->rbits =
        st->hs.ok
            ? (uint32_t)kern_rot_bits(kern_codec_as(st->hs.codec, st->at.k == 1 && !lay->k_only))
            : 0;
    if (st->rbits) {
        const uint8_t *sect = st->src + st->hs.offset;
        st->rseed = kern_batch_ld32(sect, kern_batch_dsa(st)); /* kern_rot_get_seed */
        st->rscale = kern_rot_scale(D);
        st->rgroups = sect + kern_rot_groups_off(lay);
        st->rmeans = kern_rot_means(sect);
    }
    return 1;
}

/* The generic rounds of a decode step (st from kern_batch_dstep_at): every piece through
 * kern_batch_piece_dec, the lanes of a ROT key row exchanging its transform's stages. */
KERN_HD void kern_batch_decode_generic(const struct kern_batch *b, const uint64_t *w,
                                       const struct kern_batch_dstep *st, uint32_t lane)
{
    /* lanes per ROT row, the partners of its cross-lane stages; 1: no exchange */
    const uint32_t ro = st->rbits ? b->head_dim / 8 : 1;
    const uint32_t nit = b->items << b->rshift;
    struct kern_batch_piece p[KERN_BATCH_WARP_NL];
    for (uint32_t c0 = 0; c0 < nit; c0 += KERN_BATCH_LANES) {
        KERN_BATCH_FOR_LANES(i, l, lane)
        kern_batch_piece_dec(b, w, st, c0 + l, &p[i]);
        for (uint32_t m = 1; m < ro; m <<= 1) {
            float q[KERN_BATCH_WARP_NL][8];
            kern_batch_rot_xor(p, m, q);
            KERN_BATCH_FOR_LANES(i, l, lane)
            kern_batch_rot_pair(p[i].x, q[i], l & m);
        }
        KERN_BATCH_FOR_LANES(i, l, lane)
        kern_batch_piece_put(b, st, &p[i]);
    }
}

/* Step s of a decode batch: tokens [t0, t0 + R) of (block, layer, kind), every head, into the
 * engine; the step's R * items pieces of 8 elements of a head row are spread over the lanes,
 * a round of 32 at a time. The block's header and section are read once per step (lane 0 on
 * the device, handed to the warp). A block that is not an encoded block of the layout (or
 * whose section lies outside its length) decodes to zeros; a NULL block is not this batch's
 * and is left alone, as is a token without a page. On the device every lane of the warp
 * calls it with its lane (the ROT exchange needs all 32); the emulation calls it once per
 * step with lane 0 and runs the 32 lanes inside, phase by phase. A KIVI or ROT key section
 * takes its column rounds where the kernel has them (kivik: KERN_BATCH_COLS_*), and so does a
 * LOWRANK key or MERGE section (KERN_BATCH_COLS_LRM); a section of
 * a fast form the fast rounds, two pieces per lane loaded before either is decoded and
 * stored; any other the generic rounds. */
KERN_HD void kern_batch_decode_step(const struct kern_batch *b, const uint64_t *w, uint32_t s,
                                    uint32_t lane, uint32_t kivik)
{
    struct kern_batch_dstep st;
    struct kern_batch_fast f;
    if (!kern_batch_dstep_at(b, w, s, lane, &st))
        return;
    const uint32_t kbits = (kivik & KERN_BATCH_COLS_KIVI) ? kern_batch_kivik_bits(b, &st) : 0;
    if (kbits) {
        KERN_BATCH_FOR_LANES(i, l, lane)
        kern_batch_kivik_lane(b, w, &st, kbits, l);
        return;
    }
    if ((kivik & KERN_BATCH_COLS_ROT) && st.rbits) {
        kern_batch_rotk_rounds(b, w, &st, lane);
        return;
    }
    const uint32_t lrm = (kivik & KERN_BATCH_COLS_LRM) ? kern_batch_lrm_form(b, &st) : 0;
    if (lrm) {
        KERN_BATCH_FOR_LANES(i, l, lane)
        kern_batch_lrm_lane(b, w, &st, lrm, l);
        return;
    }
    kern_batch_fast_at(b, &st, &f);
    if (f.form == KERN_BATCH_FAST_NONE) {
        kern_batch_decode_generic(b, w, &st, lane);
        return;
    }
    for (uint32_t c0 = 0; c0 < f.nitems; c0 += 2 * KERN_BATCH_LANES) {
        struct kern_batch_fpiece q[2][KERN_BATCH_WARP_NL];
        KERN_BATCH_FOR_LANES(i, l, lane)
        {
            kern_batch_fast_load(&f, w, c0 + l, &q[0][i]);
            kern_batch_fast_load(&f, w, c0 + KERN_BATCH_LANES + l, &q[1][i]);
        }
        KERN_BATCH_FOR_LANES(i, l, lane)
        {
            kern_batch_fast_put(&f, &q[0][i]);
            kern_batch_fast_put(&f, &q[1][i]);
        }
    }
}

#endif
