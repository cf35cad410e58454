/*
 * kern.h — KV block codecs: quantize, dequantize and key statistics, on CPU and CUDA.
 *
 * DESIGN
 * A block is the KV of `tokens` consecutive tokens in the namespace's canonical layout
 * [layer][k/v][token][head][dim] (K-only namespaces: [layer][token][head][dim]), fp16 or
 * bf16. Encoding turns it into a self-describing "encoded block": a header, a section table
 * with one section per (layer, kind), and the sections. A recipe picks the codec of every
 * section, so one block can mix precisions (layers 0-1 raw, the rest q8_0, say).
 *
 * Every operation exists three times with the same arguments: a scalar reference (*_ref),
 * a vectorised CPU version (*_cpu: AVX2+F16C, chosen at run time, the reference where the
 * CPU lacks them) and a CUDA twin (*_cuda: device pointers, one extra argument, the caller's
 * cudaStream_t passed as void *, stream-ordered, never synchronising). The three produce the
 * same bytes: codes, scales and decoded values are bit-identical (the format defines the
 * float operations, in order, without fused multiply-add); key statistics agree to rounding
 * (their sums may be taken in another order).
 *
 * Non-finite input: before a lossy codec (and the key statistics) sees a value, NaN becomes
 * 0 and values are clamped to the fp16 range [-65504, 65504] (so +-Inf saturates to
 * +-65504); this also keeps every fp16 scale finite for bf16 input. Raw sections are copied
 * bit for bit, NaN and Inf included. A decoded value can round to +-Inf in fp16 output only
 * when its group's range reaches the fp16 limit.
 *
 * Encoded block format (all little-endian; docs/kernels.md has the full description):
 *   struct kern_block_hdr                     48 bytes
 *   struct kern_block_sect[layers * kinds]    12 bytes each, order layer-major then K, V
 *   padding to 16 bytes, then the sections, each starting on a 16-byte boundary.
 * Section payload by codec, for a section of T tokens, H heads, D dims, G = ceil(D / 32):
 *   RAW    the input as given: [T][H][D] elements of the header's dtype
 *   Q8_0   [T][H][G] ggml block_q8_0 (34 B: fp16 d, int8 qs[32])
 *   Q4_1   [T][H][G] ggml block_q4_1 (20 B: fp16 d, fp16 m, qs[16]: byte j = element j low
 *          nibble, element j+16 high nibble)
 *   Q5_1   [T][H][G] ggml block_q5_1 (24 B: fp16 d, fp16 m, qh[4]: bit j = bit 4 of element
 *          j, qs[16] as q4_1)
 *   The last group of a row covers D % 32 values when D is not a multiple of 32: only those
 *   enter d/m, the slots past the tail hold code 0 and are ignored on decode.
 *   FP8    fp32 scale[H] (amax / 448 of the head's values in this section, 1 if all zero),
 *          then [T][H][D] OCP E4M3 (e4m3fn) codes, x = e4m3(code) * scale[h]
 *   Raw-head appendix (kern_recipe.raw_heads): the header's `reserved` holds its offset (low
 *          32 bits, the end of the last section) and its head count n (high 32); it is
 *          uint16 slot[layers * heads] (0: coded only, i: the i-th raw head, numbered in
 *          (layer, head) order), padded to 16, then per raw head its K (and V) rows,
 *          [kinds][tokens][head_dim] elements of the header's dtype; total_bytes covers it.
 *   ROT2, ROT4, MERGE, LOWRANK: kern_ext.h and docs/kernels.md (keys rotated by a randomized
 *          Hadamard transform then KIVI; adjacent tokens within a cosine threshold stored once;
 *          keys per head as rank-r factors).
 *   KIVI2, KIVI4 (b = 2 or 4 bits, Q = 2^b - 1; scale = fp16((max - min) / Q), min =
 *          fp16(min), q = clamp(floor((x - min) / scale + 0.5), 0, Q) computed with the fp16
 *          rounded min and scale as x * (1 / scale), x^ = q * scale + min; codes packed in
 *          rows: byte i holds element 2i (low nibble) and 2i+1 (4-bit), or elements 4i..4i+3
 *          at bits 0-1, 2-3, 4-5, 6-7 (2-bit).
 *          K sections, per channel over groups of 32 tokens: [H][ceil(T / 32) groups], a group
 *          of R = min(32, T - 32g) tokens = fp16 scale[D], fp16 min[D], then R rows of
 *          ceil(D * b / 8) bytes, the group padded to a multiple of 4 bytes.
 *          V sections, per token over groups of 32 channels: [T][H][G] groups of fp16 scale,
 *          fp16 min, 4 * b bytes of codes (slots past a tail hold 0).
 * K-only namespaces apply the K rules to their single kind.
 *
 * Thread safety: every function is reentrant; none keeps state besides the CPU feature
 * probe, which is idempotent.
 */
#ifndef KVC_KERN_H
#define KVC_KERN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of a raw block (same values as the client's dtype enum). */
enum kern_dtype {
    KERN_DTYPE_FP16 = 1,
    KERN_DTYPE_BF16 = 2,
};

enum kern_codec {
    KERN_CODEC_RAW = 0,      /* the input bytes, lossless */
    KERN_CODEC_Q8_0 = 1,     /* ggml q8_0, 8.5 bits/value */
    KERN_CODEC_Q4_1 = 2,     /* ggml q4_1, 5.0 bits/value */
    KERN_CODEC_Q5_1 = 3,     /* ggml q5_1, 6.0 bits/value */
    KERN_CODEC_KIVI2 = 4,    /* KIVI 2-bit: K per channel, V per token */
    KERN_CODEC_KIVI4 = 5,    /* KIVI 4-bit */
    KERN_CODEC_FP8 = 6,      /* E4M3 with an fp32 scale per (block, layer, kind, head) */
    KERN_CODEC_ROT2 = 7,     /* keys: randomized Hadamard rotation per head, then KIVI 2-bit;
                             values KIVI 2-bit (head_dim a power of two, 8..256) */
    KERN_CODEC_ROT4 = 8,     /* the same at 4 bits */
    KERN_CODEC_MERGE = 9,    /* adjacent tokens within a cosine threshold stored once (K and V) */
    KERN_CODEC_LOWRANK = 10, /* keys per head as rank-r factors (r by an energy threshold);
                                values q8_0 (min(tokens, head_dim) <= 64) */
    KERN_CODEC_COUNT
};

#define KERN_MAX_LAYERS 256
#define KERN_MAX_HEAD_DIM 1024
#define KERN_MAX_TOKENS 4096
#define KERN_MAX_HEADS 1024

/* The shape of one block. */
struct kern_layout {
    uint32_t layers;   /* 1..KERN_MAX_LAYERS */
    uint32_t heads;    /* kv heads, 1..KERN_MAX_HEADS */
    uint32_t head_dim; /* 1..KERN_MAX_HEAD_DIM; any value, tails handled */
    uint32_t tokens;   /* tokens per block, 1..KERN_MAX_TOKENS */
    uint32_t dtype;    /* enum kern_dtype of the raw block */
    uint32_t k_only;   /* 1: [layer][token][head][dim] (MLA latent); 0: K and V */
};

/* Which codec each (layer, kind) gets: codec[layer][0] for K, codec[layer][1] for V
 * (ignored for K-only layouts). A plain value; entries past `layers` are ignored. The
 * parameters after it only steer encoders (kern_recipe_fill sets them to 0, the defaults):
 * a block's size never depends on them and a decoder never needs them. */
struct kern_recipe {
    uint8_t codec[KERN_MAX_LAYERS][2];
    uint32_t seed;        /* ROT2/ROT4: the rotation's seed (per namespace); 0 is a seed too */
    float merge_cos;      /* MERGE: cosine threshold, 0: KERN_MERGE_COS_DEFAULT */
    float lowrank_energy; /* LOWRANK: share of the keys' energy kept, 0: the default */
    /* Per-head precision: raw_heads[layer * heads + head] != 0 keeps that head's K and V
     * bit-exact in a raw-head appendix after the sections (the sections still code every
     * head), NULL or all zero: none. Unlike the parameters above it changes the block's size.
     * The CPU encoders (kern_encode_ref, kern_encode_cpu) write it; kern_encode_cuda and
     * kern_encode_batched_cpu refuse it (-ENOTSUP); every decoder applies it. */
    const uint8_t *raw_heads;
};
#define KERN_MERGE_COS_DEFAULT 0.98f
#define KERN_LOWRANK_ENERGY_DEFAULT 0.99f

/* Key statistics, written by the encoders when the pointers are not NULL (all three or
 * none). Host memory for *_ref and *_cpu, device memory for *_cuda. Computed on the
 * sanitised values (see non-finite input above) of every K section, whatever its codec.
 *   kmin, kmax  [layer][head][head_dim] floats: per-channel key min and max over the tokens
 *   knorm       [layer][head] floats: the mean over tokens of the key's L2 norm */
struct kern_key_stats {
    float *kmin;
    float *kmax;
    float *knorm;
};

/* Encoded block header (48 bytes, at offset 0 of an encoded block). */
#define KERN_BLOCK_MAGIC 0x42514b4bu /* "KKQB" */
#define KERN_BLOCK_VERSION 1
struct kern_block_hdr {
    uint32_t magic;
    uint16_t version;
    uint8_t dtype; /* enum kern_dtype of the raw input (raw sections keep it) */
    uint8_t kinds; /* 1: K only, 2: K and V */
    uint32_t layers, heads, head_dim, tokens;
    uint32_t nsect;     /* layers * kinds */
    uint32_t hdr_bytes; /* header + section table, rounded up to 16 */
    uint64_t total_bytes;
    uint64_t reserved; /* 0 */
};
struct kern_block_sect {
    uint32_t offset; /* from the start of the encoded block, a multiple of 16 */
    uint32_t bytes;  /* payload bytes (without alignment padding) */
    uint8_t codec;   /* enum kern_codec */
    uint8_t pad[3];  /* 0 */
};

/* Codec name ("raw", "q8_0", "q4_1", "q5_1", "kivi2", "kivi4", "fp8") or "?". */
const char *kern_codec_name(enum kern_codec c);
/* The attention output's relative error with K and V in codec c, measured on synthetic KV
 * with outlier key channels (docs/kernels.md's table): 0 for raw, a large number for an
 * unknown codec. */
double kern_codec_attn_error(enum kern_codec c);
/* Codec by name; -EINVAL if unknown. */
int kern_codec_from_name(const char *name);

/* 0 if the layout is valid (see the bounds in struct kern_layout), else -EINVAL. */
int kern_layout_check(const struct kern_layout *lay);
/* Bytes of the raw block; 0 if the layout is invalid. */
uint64_t kern_raw_size(const struct kern_layout *lay);

/* Whether codec c can encode blocks of this layout (ROT2/ROT4: head_dim a power of two from
 * 8 to 256; LOWRANK: min(tokens, head_dim) <= 64; the others: any valid layout). */
int kern_codec_supports(const struct kern_layout *lay, enum kern_codec c);

/* The mean over (layer, head, token) of the value vector's L1 norm in raw block `src`
 * (kern_raw_size(lay) bytes), values sanitised as for a lossy codec: the signal of VATP.
 * 0 for K-only layouts or an invalid layout. */
double kern_value_l1(const struct kern_layout *lay, const void *src);

/* MERGE: tokens of block `src` (raw, lay) that recipe rec's MERGE sections would have to merge
 * beyond its cosine threshold because a head has more distinct runs than the codec stores
 * (ceil(tokens / 2)): 0 means every merge is within the threshold and the codec's error
 * bound holds. -EINVAL as kern_encoded_size. */
int64_t kern_merge_forced(const struct kern_layout *lay, const struct kern_recipe *rec,
                          const void *src);

/* MERGE: whether block `enc` (len bytes), which recipe rec's MERGE sections encoded from a
 * raw block, may have forced a token (kern_merge_forced() > 0 on that raw block): 1 where a
 * head of a MERGE section holds all the rows the codec stores (ceil(tokens / 2)), the only
 * state in which the plan forces one; 0 where every head ends under that, and then
 * kern_merge_forced() is 0. It reads the rows fields only, so a caller encodes first and runs
 * the reference plan only on a 1. -EINVAL as kern_encoded_size or NULL enc; -EBADMSG: enc is
 * not what lay and rec encode to (kern_block_info's checks, a size, layout or section codec
 * that differs, a head's rows 0 or past the codec's). */
int kern_merge_may_force(const struct kern_layout *lay, const struct kern_recipe *rec,
                         const void *enc, size_t len);

/* Fills a recipe: layers [0, raw_layers) raw, the others `k` for keys and `v` for values;
 * the encoder parameters 0 (their defaults). */
void kern_recipe_fill(struct kern_recipe *rec, enum kern_codec k, enum kern_codec v,
                      uint32_t raw_layers);

/* Bytes of the encoded block for this layout and recipe, so a caller can allocate the slot
 * before encoding. -EINVAL: invalid layout or unknown codec in the recipe's first layers. */
int64_t kern_encoded_size(const struct kern_layout *lay, const struct kern_recipe *rec);

/* Reads an encoded block's header (host memory): fills *lay and *rec (either may be NULL;
 * rec->raw_heads is set NULL: kern_block_raw_heads() reads the appendix).
 * Returns the encoded size. -EBADMSG: not an encoded block, a version this build does not
 * know, or a section table that disagrees with the layout; -EINVAL: NULL src. */
int64_t kern_block_info(const void *src, size_t src_len, struct kern_layout *lay,
                        struct kern_recipe *rec);
/* The raw heads of a (kern_block_info-valid) encoded block: out[layers * heads] set to 1 for
 * the heads kept raw, 0 for the others. Returns their count, -EBADMSG as kern_block_info. */
int kern_block_raw_heads(const void *src, size_t src_len, uint8_t *out);

/*
 * Encodes one raw block `src` (kern_raw_size(lay) bytes, borrowed for the call) into `dst`
 * (dst_cap bytes, at least kern_encoded_size()), and writes the key statistics when `stats`
 * is not NULL. `src` and `dst` must not overlap. Returns the encoded size.
 * -EINVAL: invalid layout or recipe, NULL src/dst, or a partial stats struct;
 * -ENOSPC: dst_cap too small; -ENOMEM: no scratch memory (CPU versions only).
 */
int64_t kern_encode_ref(const struct kern_layout *lay, const struct kern_recipe *rec,
                        const void *src, void *dst, size_t dst_cap,
                        const struct kern_key_stats *stats);
int64_t kern_encode_cpu(const struct kern_layout *lay, const struct kern_recipe *rec,
                        const void *src, void *dst, size_t dst_cap,
                        const struct kern_key_stats *stats);
/* CUDA twin: src, dst and the stats arrays are device memory; the work is queued on
 * `stream` (a cudaStream_t, NULL for the legacy default stream) and the return value only
 * says it was queued. -ENOTSUP: built without CUDA; -EIO: a CUDA error (one line on
 * stderr); the other errors as above, found before anything is queued. */
int64_t kern_encode_cuda(const struct kern_layout *lay, const struct kern_recipe *rec,
                         const void *src, void *dst, size_t dst_cap,
                         const struct kern_key_stats *stats, void *stream);

/* The CUDA encoder's work (its units, phases and threads, kern_encb.h) run on the CPU, one
 * thread after another: the kernel's indexing, tested against the reference. No key
 * statistics. Arguments and errors as kern_encode_ref. */
int64_t kern_encode_batched_cpu(const struct kern_layout *lay, const struct kern_recipe *rec,
                                const void *src, void *dst, size_t dst_cap);

/*
 * Decodes an encoded block `src` (src_len bytes) of layout `lay` into `dst`, the raw layout
 * with elements of `out_dtype` (fp16 or bf16, either from either). Returns the raw size.
 * -EINVAL: invalid layout, out_dtype, or NULL pointers; -EBADMSG: the header or section
 * table is not that of an encoded block of this layout, or points past src_len;
 * -ENOSPC: dst_cap smaller than the raw size; -ENOMEM: no scratch memory (CPU versions).
 */
int64_t kern_decode_ref(const struct kern_layout *lay, const void *src, size_t src_len,
                        void *dst, size_t dst_cap, enum kern_dtype out_dtype);
int64_t kern_decode_cpu(const struct kern_layout *lay, const void *src, size_t src_len,
                        void *dst, size_t dst_cap, enum kern_dtype out_dtype);
/* CUDA twin: device pointers, queued on `stream`. The header lives in device memory, so it
 * is checked there: a block whose header does not match `lay` or whose sections fall
 * outside src_len decodes to zeros (callers checksum blocks before they decode them).
 * -ENOTSUP: built without CUDA; -EIO: a CUDA error (one line on stderr). codecs: bit
 * 1 << c where the block may be of codec c (its format, the key codec), 0 when not known: a
 * hint that chooses the decode kernel (kern_decode_batches'), never the bytes. */
int64_t kern_decode_cuda(const struct kern_layout *lay, const void *src, size_t src_len,
                         void *dst, size_t dst_cap, enum kern_dtype out_dtype, uint32_t codecs,
                         void *stream);

/* What this build and machine can do: KERN_SUPPORT_* bits. */
#define KERN_SUPPORT_CPU_AVX2 0x1u   /* the CPU has AVX2+F16C: *_cpu is vectorised */
#define KERN_SUPPORT_CUDA_BUILT 0x2u /* built with CUDA: *_cuda are real */
unsigned kern_supports(void);

/* Number of CUDA devices visible; 0 when built without CUDA or when the driver finds none
 * (no error then: a host without a GPU is normal). */
int kern_cuda_device_count(void);

/* Test and benchmark helpers around the CUDA runtime, so that no C file needs its headers.
 * Each returns 0 or -ENOTSUP (no CUDA build) or -EIO (CUDA error, one line on stderr). */
int kern_cuda_alloc(void **dptr, size_t bytes); /* *dptr owned by the caller, kern_cuda_free */
void kern_cuda_free(void *dptr);                /* NULL is a no-op */
int kern_cuda_copy(void *dst, const void *src, size_t bytes, int kind, void *stream);
#define KERN_CUDA_H2D 1
#define KERN_CUDA_D2H 2
#define KERN_CUDA_D2D 3
int kern_cuda_stream_sync(void *stream);
/* Elapsed milliseconds of `fn` run `iters` times on the legacy default stream, measured
 * with CUDA events; returns a negative errno as above. */
double kern_cuda_time_ms(void (*fn)(void *arg), void *arg, int iters);

#ifdef __cplusplus
}
#endif

#endif
