/*
 * kern_pack.h — gather and scatter between an engine's paged KV tensors and kvcd's canonical
 * block layout, on the CPU and as a CUDA twin.
 *
 * DESIGN
 * kvcd stores a block as [layer][k/v][token][head][dim] (K only for MLA namespaces).
 * Engines keep per-layer K and V tensors in their own pages: vLLM's
 * [num_pages][page_tokens][heads][dim] per layer with a block table mapping the sequence's
 * n-th page to a physical page, or one contiguous [tokens][heads][dim] tensor per layer (a
 * block table of 0, 1, 2, ... with page_tokens = all tokens). One description covers both:
 * per-layer base pointers, a block table, page_tokens, and byte strides for page, token and
 * head (head_dim elements are contiguous). Token p of the sequence lives at
 *     base[layer] + table[p / page_tokens] * page_stride + (p % page_tokens) * token_stride
 *                 + head * head_stride
 * kvcd's blocks and the engine's pages need not have the same number of tokens.
 * gather copies engine → blocks (a put), scatter blocks → engine (a load). Both are pure
 * copies: bit-exact, any element size.
 */
#ifndef KVC_KERN_PACK_H
#define KVC_KERN_PACK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KERN_PACK_MAX_LAYERS 4096

struct kern_pack_layout {
    uint32_t layers;
    uint32_t kinds; /* 2: K and V; 1: K only */
    uint32_t block_tokens;
    uint32_t heads;
    uint32_t head_dim;
    uint32_t elem_bytes; /* 1, 2 or 4 */
};

struct kern_pack_engine {
    void *const *k;             /* [layers] K base per layer */
    void *const *v;             /* [layers] V base per layer; NULL when kinds == 1 */
    const int32_t *block_table; /* physical page of each page_tokens-run of the sequence */
    uint32_t table_len;         /* entries in block_table */
    uint32_t page_tokens;
    uint64_t page_stride, token_stride, head_stride; /* bytes */
};

enum kern_pack_dir {
    KERN_PACK_GATHER = 1,  /* engine → canonical blocks */
    KERN_PACK_SCATTER = 2, /* canonical blocks → engine */
};

/* Bytes of one canonical block. */
uint64_t kern_pack_block_bytes(const struct kern_pack_layout *lay);

/* Checks a layout and an engine description against the run of nblocks blocks starting at
 * sequence token first_token: every table entry used is in range and non-negative, strides
 * hold a head's row. 0 or -EINVAL. Host-side: reads block_table, so for the CUDA twin it
 * checks only what does not need the table (pass a host copy to check that too). */
int kern_pack_check(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                    uint64_t first_token, uint32_t nblocks, int check_table);

/* Scalar reference: one element at a time, the definition the others are tested against. */
int kern_pack_ref(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                  uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir);

/* CPU version: one head row (head_dim elements) per memcpy. Host pointers. 0 or -EINVAL. */
int kern_pack_cpu(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                  uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir);

/* CUDA twin: eng->k, eng->v, eng->block_table and blocks are DEVICE arrays (of device
 * pointers for k, v and blocks); queued on stream (a cudaStream_t). -EINVAL, -ENOTSUP
 * (built without CUDA), -EIO (CUDA error, one line on stderr). */
int kern_pack_cuda(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                   uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir,
                   void *stream);

#ifdef __cplusplus
}
#endif
#endif
