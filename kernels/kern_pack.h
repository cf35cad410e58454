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

struct kern_layout;

#define KERN_PACK_MAX_LAYERS 4096
/* Pieces of one device-to-device copy batch (one kernel), blocks of one decode into raw
 * blocks. */
#define KERN_COPY_BATCH_MAX 1024
/* Pieces of one host-to-device or device-to-host copy batch (one cudaMemcpyBatchAsync): a
 * 16k-token prefix of 2 MiB blocks moved section by section into paged tensors is about
 * 1,000 blocks x 64 (layer, kind) sections. */
#define KERN_DMA_BATCH_MAX 65536

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

/* 1 when a (block, layer, kind) section's rows are contiguous in the engine as they are in
 * the block wherever they share a page: the heads of a token packed (or one head) and the
 * tokens of a page packed (token_stride = heads x head_dim x elem_bytes): vLLM's per-layer
 * [num_pages, page_tokens, heads, dim] tensors and the flash-attn [2, num_pages, ...] form.
 * Such moves go as whole runs (kern_batch.h's run steps, kern_pack_runs' pieces). */
int kern_pack_contiguous(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng);

/* The pieces of a gather or scatter over a contiguous engine layout (kern_pack_contiguous):
 * for each block j whose blocks[j] is not NULL (its bytes from the canonical offset of lay's
 * first layer, as kern_batch_pack takes them), each layer and kind of lay and each page its
 * tokens touch, one piece of the page's tokens: eptr[i] the engine's address, bptr[i] the
 * block's, len[i] bytes; a piece that continues the one before on both sides joins it (pages
 * physically next to each other). With eptr NULL (blocks may be NULL then: every block) it
 * only counts, an upper bound of what it fills. Answers the number of pieces; -ENOTSUP when
 * the layout is not contiguous or a piece would be shorter than min_len bytes (the caller
 * takes the staged path), -EINVAL as kern_pack_check, -E2BIG past max pieces. Host arrays;
 * block_table is read. */
int64_t kern_pack_runs(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                       uint64_t first_token, uint32_t nblocks, void *const *blocks,
                       uint64_t min_len, void **eptr, void **bptr, uint64_t *len, uint64_t max);

/* Scalar reference: one element at a time, the definition the others are tested against. */
int kern_pack_ref(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                  uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir);

/* CPU version: one head row (head_dim elements) per memcpy. Host pointers. 0 or -EINVAL. */
int kern_pack_cpu(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                  uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir);

/* CUDA twin: eng->k, eng->v, eng->block_table and blocks are HOST arrays (read before the
 * call returns; k, v and blocks hold device pointers), the tensors and blocks device memory;
 * queued on stream (a cudaStream_t) as one kernel per KERN_BATCH_WORDS of tables (one for
 * any prefix an engine loads in practice). -EINVAL, -ENOTSUP (built without CUDA), -EIO (CUDA
 * error, one line on stderr). */
int kern_pack_cuda(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                   uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir,
                   void *stream);
/* kern_pack_cpu through the batches the CUDA twin launches (kern_batch.h), run row by row on
 * the CPU: the kernel's indexing, tested here against the reference. Host pointers. */
int kern_pack_batched_cpu(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                          uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir);

/* ---- decoding straight into the engine's tensors -----------------------------------------
 * Encoded blocks (kern.h) src[0..nblocks) of layout klay, src_len[j] bytes each, decoded for
 * layers [layer_first, layer_first + layer_count) into the engine's paged tensors as out_dtype
 * (fp16 or bf16): eng->k[i] and eng->v[i] are the bases of layer layer_first + i (the
 * engine's other layers are not touched), its elements 2 bytes. Block j covers sequence
 * tokens [first_token + j * klay->tokens, ...), as kern_pack_* do. 0, -EINVAL (shape, range,
 * table, dtype), -EBADMSG (ref and cpu: a block that is not an encoded block of klay, or whose
 * section table points outside src_len; the CUDA twin and the batches write zeros for such a
 * block's rows instead, as kern_decode_cuda does), -ENOMEM. */
int kern_pack_decode_ref(const struct kern_layout *klay, uint32_t layer_first, uint32_t layer_count,
                         const struct kern_pack_engine *eng, uint64_t first_token, uint32_t nblocks,
                         const void *const *src, const uint64_t *src_len, uint32_t out_dtype);
/* The batches of the CUDA twin, run on the CPU (host pointers). */
int kern_pack_decode_cpu(const struct kern_layout *klay, uint32_t layer_first, uint32_t layer_count,
                         const struct kern_pack_engine *eng, uint64_t first_token, uint32_t nblocks,
                         const void *const *src, const uint64_t *src_len, uint32_t out_dtype);
/* CUDA twin: host arrays of device pointers, queued on stream, one kernel per batch; codecs
 * as kern_decode_batches' (0: not known). */
int kern_pack_decode_cuda(const struct kern_layout *klay, uint32_t layer_first,
                          uint32_t layer_count, const struct kern_pack_engine *eng,
                          uint64_t first_token, uint32_t nblocks, const void *const *src,
                          const uint64_t *src_len, uint32_t out_dtype, uint32_t codecs,
                          void *stream);

/* ---- batches (kern_batch.h): what one kernel launch moves ---------------------------------
 * The caller fills one with a builder and queues it (kern_batch_cuda, or the device table's
 * batch op), or runs it on the CPU. A builder answers -E2BIG when the tables of nblocks
 * blocks do not fit one launch (fewer blocks, or fewer layers, do), -EINVAL as kern_pack_check
 * for a bad shape or table. */
struct kern_batch_args;
/* -E2BIG also for a batch whose steps or tokens do not fit the kernel's 32-bit indices
 * (kern_batch.h); the splitters below cut those too.
 * A gather or scatter: blocks[j] points at the first byte of block j this batch moves (the
 * canonical offset of the batch's first layer), lay->layers the layers it moves, eng->k and
 * eng->v their bases. */
int kern_batch_pack(struct kern_batch_args *a, const struct kern_pack_layout *lay,
                    const struct kern_pack_engine *eng, uint64_t first_token, uint32_t nblocks,
                    void *const *blocks, uint64_t block_off, int dir);
/* Cuts a gather or scatter of whole blocks (layers [0, lay->layers) of blocks[j], eng's k and
 * v for those layers) into batches that fit, built in *a, and hands each to run(a, arg):
 * one call for any shape that fits one launch. The first error of a builder or of run. */
int kern_pack_batches(struct kern_batch_args *a, const struct kern_pack_layout *lay,
                      const struct kern_pack_engine *eng, uint64_t first_token, uint32_t nblocks,
                      void *const *blocks, int dir,
                      int (*run)(const struct kern_batch_args *a, void *arg), void *arg);
/* The arguments of a decode checked as kern_pack_decode_ref does (not the blocks). */
int kern_decode_check(const struct kern_layout *klay, uint32_t layer_first, uint32_t layer_count,
                      const struct kern_pack_engine *eng, uint64_t first_token, uint32_t nblocks,
                      const void *const *src, const uint64_t *src_len, uint32_t out_dtype);
/* The column rounds (struct kern_batch's kivik) of the decode kernel for blocks of the codecs
 * in a hint (kern_decode_batches' codecs). */
uint32_t kern_decode_cols(uint32_t codecs);
/* The same for a decode (arguments as kern_pack_decode_ref). codecs: bit 1 << c set where a
 * block may be of codec c (a block's format is its key codec), 0 when the caller does not
 * know; only a hint, it chooses the decode kernel (struct kern_batch's kivik): with the KIVI
 * and ROT key rounds where ROT2/ROT4 are among them or codecs is 0, with the KIVI key rounds
 * alone where KIVI2/KIVI4 are and ROT not, with the LOWRANK and MERGE rounds where LOWRANK or
 * MERGE are and neither KIVI nor ROT, without any else; each decodes every block to the same
 * bytes (a section whose rounds the kernel lacks takes the generic rounds). A LOWRANK/MERGE
 * hint's batches take as few blocks as their tables need to fit the small parameter block
 * (KERN_BATCH_SMALL_WORDS), for which alone that kernel is built. */
int kern_decode_batches(struct kern_batch_args *a, const struct kern_layout *klay,
                        uint32_t layer_first, uint32_t layer_count,
                        const struct kern_pack_engine *eng, uint64_t first_token, uint32_t nblocks,
                        const void *const *src, const uint64_t *src_len, uint32_t out_dtype,
                        uint32_t codecs, int (*run)(const struct kern_batch_args *a, void *arg),
                        void *arg);
/* A decode, arguments as kern_pack_decode_ref. */
int kern_batch_decode(struct kern_batch_args *a, const struct kern_layout *klay,
                      uint32_t layer_first, uint32_t layer_count,
                      const struct kern_pack_engine *eng, uint64_t first_token, uint32_t nblocks,
                      const void *const *src, const uint64_t *src_len, uint32_t out_dtype);
/* A decode of nblocks (at most KERN_COPY_BATCH_MAX) whole blocks into raw blocks: block j
 * into dst + pos[j] * raw size (pos NULL: j), as kern_decode_* write one. */
int kern_batch_decode_raw(struct kern_batch_args *a, const struct kern_layout *klay, void *dst,
                          const uint32_t *pos, uint32_t nblocks, const void *const *src,
                          const uint64_t *src_len, uint32_t out_dtype);
/* Runs a batch on the CPU, one step after another, the 32 lanes of a warp in turn: the
 * kernel's indexing and its split of a step over the lanes. */
void kern_batch_run_cpu(const struct kern_batch_args *a);
/* Rows of a batch ((block, layer, kind, token); the kernel's steps take R of them each), and
 * the pointers it dereferences: the K and V bases,
 * then the blocks (for the fake device's checks). */
uint64_t kern_batch_nrows(const struct kern_batch_args *a);
uint32_t kern_batch_nptrs(const struct kern_batch_args *a);
const void *kern_batch_ptr_at(const struct kern_batch_args *a, uint32_t i, uint64_t *len);
/* Queues a batch as one kernel on stream. -ENOTSUP without CUDA, -EIO. */
int kern_batch_cuda(const struct kern_batch_args *a, void *stream);
/* Copies n pieces of device memory (dst[i] <- src[i], len[i] bytes) as one kernel on stream
 * (pieces that continue each other first merged; one piece left: cudaMemcpyAsync). Host
 * arrays; at most KERN_COPY_BATCH_MAX pieces. -EINVAL, -ENOTSUP without CUDA, -EIO. */
int kern_copy_batch_cuda(void *const *dst, const void *const *src, const uint64_t *len, uint32_t n,
                         void *stream);

#ifdef __cplusplus
}
#endif
#endif
