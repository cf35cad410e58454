/*
 * kern_cpu.h — the CPU codec operations behind kern_encode_*() / kern_decode_*() (internal).
 *
 * DESIGN
 * One driver (kern.c) walks the sections of a block; per (layer, kind, head) slice it calls
 * these operations, which exist as the scalar reference (kern.c) and as AVX2+F16C (kern_avx2.c).
 * A slice is loaded into a float scratch of [tokens][head_dim] (sanitised), so the codecs see
 * contiguous rows whatever the raw dtype, and the slice stays in L1/L2 while it is encoded.
 */
#ifndef KVC_KERN_CPU_H
#define KVC_KERN_CPU_H

#include <stdint.h>

#include "kernels/kern.h"

struct kern_cpu_ops {
    /* raw rows (stride `stride` elements) -> x[tokens][dim], sanitised */
    void (*load)(const void *src, uint32_t dtype, uint64_t stride, uint32_t tokens,
                 uint32_t dim, float *x);
    /* y[tokens][dim] -> raw rows of dtype */
    void (*store)(const float *y, uint32_t tokens, uint32_t dim, void *dst, uint32_t dtype,
                  uint64_t stride);
    /* per-channel min/max into kmin/kmax[dim], mean row L2 norm into *knorm */
    void (*stats)(const float *x, uint32_t tokens, uint32_t dim, float *kmin, float *kmax,
                  float *knorm);
    /* slice of head h into its section; codec is not RAW */
    void (*enc)(uint32_t codec, int is_v, const float *x, const struct kern_layout *lay,
                uint32_t h, uint8_t *sect);
    void (*dec)(uint32_t codec, int is_v, const uint8_t *sect, const struct kern_layout *lay,
                uint32_t h, float *y);
    /* Optional fused forms that read (write) the raw rows of head h directly, skipping the
     * float scratch; they return 0 for a codec they do not fuse, which then takes the path
     * above. Results are the same bytes either way. */
    int (*enc_raw)(uint32_t codec, int is_v, const void *raw, const struct kern_layout *lay,
                   uint32_t h, uint8_t *sect);
    int (*dec_raw)(uint32_t codec, int is_v, const uint8_t *sect, const struct kern_layout *lay,
                   uint32_t h, void *raw, uint32_t out_dtype);
    /* Optional whole-section forms, walking section (l, k) in memory order: `raw` is its
     * [T][H][D] rows, `scratch` 4 * H * D floats, kmin/kmax/knorm the layer's statistics
     * ([H][D], [H]) or NULL; enc_sect also takes codec RAW (statistics only, the driver
     * copies the bytes). They return 0 for a shape or codec they do not handle. */
    int (*enc_sect)(uint32_t codec, int is_v, const void *raw, const struct kern_layout *lay,
                    uint8_t *sect, float *scratch, float *kmin, float *kmax, float *knorm);
    /* dec_sect's scratch: 2 * H * D floats (per-group channel tables) */
    int (*dec_sect)(uint32_t codec, int is_v, const uint8_t *sect,
                    const struct kern_layout *lay, void *raw, uint32_t out_dtype,
                    float *scratch);
};

extern const struct kern_cpu_ops kern_ref_ops;
/* NULL when the CPU lacks AVX2 or F16C. */
const struct kern_cpu_ops *kern_avx2_ops(void);
/* Tests: let the AVX2 section decoders use their FMA build (on, the default where the CPU has
 * FMA) or not (0); returns the previous setting. Not thread-safe against running decodes. */
int kern_avx2_fma(int on);

/* The transform codecs (ROT2/ROT4 kern_rot.c, MERGE kern_merge.c, LOWRANK kern_lowrank.c):
 * whole sections, with the CPU path's ops for loads, stores and the plain codecs they build
 * on (ops == &kern_ref_ops: the reference; else the AVX2 versions of their own work). Their
 * encoders see the layer's K and V slabs ([T][H][D] each, rawv NULL for K-only layouts). 0 or
 * -ENOMEM. */
struct kern_ext_ctx {
    const struct kern_layout *lay;
    const struct kern_recipe *rec;
    uint32_t layer;
    const uint8_t *rawk, *rawv;
    const uint8_t *kmerge; /* MERGE's V section: the layer's MERGE K section, already written
                              (its runs are the V section's), or NULL to plan them again */
    /* MERGE's K section: the layer's key statistics ([H][D], [H]), as kern_avx2_enc_sect()
     * gives them, wanted from its pass, or NULL (kern_merge_enc returns 1 where it took them) */
    float *kmin, *kmax, *knorm;
};
int kern_rot_enc(const struct kern_cpu_ops *ops, uint32_t codec, const struct kern_ext_ctx *c,
                 uint8_t *sect);
int kern_rot_dec(const struct kern_cpu_ops *ops, uint32_t codec, const struct kern_layout *lay,
                 const uint8_t *sect, void *raw, uint32_t out_dtype);
/* Blocks decoded into at least this many raw bytes are written with non-temporal stores by
 * the decoders whose arithmetic is short enough for the memory traffic to bound them: the
 * output cannot stay in this core's L2 anyway, and the usual reader (a copy to the GPU,
 * another process) reads it once. The stores skip the read for ownership of every
 * destination line, a third of a decode's memory traffic: q8_0 (kern_avx2_dec.c, +25% out of
 * cache on the Zen 3 host), and with AVX-512 KIVI, MERGE and LOWRANK (kern_st512.h; +35%
 * kivi4 on the Zen 5 host). The other AVX2 decoders are bound by their arithmetic there and
 * were no faster streaming (q4_1 a little slower), so they, and smaller blocks, write
 * through the cache. */
#define KERN_NT_MIN_BYTES (1u << 20)

/* ROT's K sections with AVX-512 (kern_rot512.c): kern_rot512_on() says whether that path,
 * and LOWRANK's, KIVI's and MERGE's (kern_lowrank512.c, kern_kivi512.c, kern_merge512.c), is
 * in use (the CPU has AVX-512 F, BW, VL, DQ and F16C and the environment has no
 * KVC_NO_AVX512 set to other than 0; read once);
 * kern_rot512_dec() decodes a section and returns 1, or 0 for a head size it does not take
 * (then the AVX2 path); with vsect (the layer's value section, KIVI value groups of the keys'
 * bits) the values too, into rawv, between the key rows, streamed as kern_st512_mode() says.
 * scratch: 2 * H * D floats. */
int kern_rot512_on(void);
int kern_rot512_dec(const struct kern_layout *lay, const uint8_t *sect, int bits, void *raw,
                    uint32_t out_dtype, float *scratch, const uint8_t *vsect, void *rawv);
/* ROT's K-section encode's first pass with AVX-512: kern_rot512_amax, the unsigned maximum of
 * the magnitudes' halves of raw[0 .. n) (fp16; n rounded down to a multiple of 16), and
 * kern_rot512_means, every head's channels' means (kern_rot_mean: tokens summed in order) as
 * fp16 into out and as the float they round to into mean[H][D] (D a multiple of 32; clean:
 * fp16 known finite), the same bytes as kern_rot.c's AVX2 pass. */
uint16_t kern_rot512_amax(const uint16_t *raw, uint64_t n);
void kern_rot512_means(const struct kern_layout *lay, const uint8_t *rawk, uint8_t *out,
                       float *mean, int clean);
/* kern_rot.c's rot_signs sixteen channels at a time (dim a multiple of 16): head h's signs as
 * a float mask of sign bits, 0x80000000 where kern_rot_neg says -1. */
void kern_rot512_signs(uint32_t *mask, uint32_t sseed, uint32_t h, uint32_t dim);
/* ROT's K-section encode of whole blocks of 16 tokens with AVX-512 (D of 32, 64 or 128): the
 * rows' groups into out (the section's groups), from the heads' signs (mask: sign bits,
 * [H][D]) and means ([H][D]) kern_rot.c computed; clean and small as there. Returns the
 * tokens done (a multiple of 16; 0 for other shapes): the caller encodes the rest. */
uint32_t kern_rot512_enc_rows(const struct kern_layout *lay, const uint8_t *rawk,
                              const uint8_t *rawv, const uint32_t *mask, const float *mean,
                              int bits, uint8_t *out, int clean, int small);
/* KIVI2/KIVI4 sections (and ROT's values, KIVI sections) decoded with AVX-512
 * (kern_kivi512.c), where kern_rot512_on(): the same bytes as kern_avx2_dec_sect() into the
 * raw rows, streamed as kern_st512_mode() says (kern_st512.h); 1, or 0 for a
 * shape it does not take (D not a multiple of 32). scratch: 2 * H * D floats. */
int kern_kivi512_dec(int bits, int is_v, const uint8_t *sect, const struct kern_layout *lay,
                     void *raw, uint32_t out_dtype, float *scratch);
/* q8_0 sections (the codec's and LOWRANK's values) decoded with AVX-512 (kern_q8512.c), where
 * kern_rot512_on(): the same bytes as kern_avx2_dec_sect() into the section's raw rows,
 * streamed as kern_st512_mode() says (kern_st512.h); 1, or 0 for a shape it does not take
 * (D not a multiple of 32). */
int kern_q8512_dec(const uint8_t *sect, const struct kern_layout *lay, void *raw,
                   uint32_t out_dtype);
/* kern_q8512_groups: n q8_0 groups at blk into the 32 n halves at raw, stored by mode nt
 * (kern_st512.h; raw 64-byte aligned for 2, 16-byte for 1), without the fence. */
void kern_q8512_groups(const uint8_t *blk, uint64_t n, void *raw, uint32_t out_dtype, int nt);
/* KIVI value groups encoded with AVX-512 (kern_kivi512.c), where kern_rot512_on(): the first
 * n / 16 * 16 of the n groups whose raw values (dtype) are contiguous at raw, into blk, the
 * same bytes as the AVX2 encoder; returns how many it did (the caller encodes the rest). */
uint64_t kern_kivi512_enc_groups(int bits, const void *raw, uint32_t dtype, uint64_t n,
                                 uint8_t *blk);
/* A KIVI key section encoded with AVX-512 (kern_kivi512.c), where kern_rot512_on(): raw its
 * [T][H][D] rows (D a multiple of 32), with the key statistics into kmin/kmax/knorm as
 * kern_avx2_enc_sect() takes them (initialised and finished by the caller) unless kmin is
 * NULL; the same bytes as the AVX2 encoder. 1, or 0 for a shape it does not take. */
int kern_kivi512_enc_k(int bits, const void *raw, const struct kern_layout *lay, uint8_t *sect,
                       float *kmin, float *kmax, float *knorm);
/* Tests: use the AVX-512 ROT, KIVI, LOWRANK and MERGE paths (kern_rot512.c, kern_kivi512.c,
 * kern_lowrank512.c, kern_merge512.c; on, the default where the CPU has them) or the AVX2
 * ones (0); returns the previous setting. Not thread-safe against running codecs. */
int kern_rot_avx512(int on);
/* MERGE's section: 0, or 1 where it took the key statistics c->kmin asks for (else the
 * caller computes them), or -ENOMEM. */
int kern_merge_enc(const struct kern_cpu_ops *ops, int is_v, const struct kern_ext_ctx *c,
                   uint8_t *sect);
int kern_merge_dec(const struct kern_cpu_ops *ops, const struct kern_layout *lay,
                   const uint8_t *sect, void *raw, uint32_t out_dtype);
/* A MERGE section encoded with AVX-512 (kern_merge512.c), where kern_rot512_on(): own the
 * section's slab (c->rawk or c->rawv). 1: done, the same bytes as kern_merge.c's; 2: done,
 * and the key statistics too (a K section, own c->rawk without c->kmerge, where c->kmin is
 * not NULL: into c->kmin, c->kmax, c->knorm, the same floats as kern_avx2_enc_sect()); 0: not
 * done (statistics neither), a shape it does not take (fp16 with D a multiple of 32 only) or
 * a row it read holds Inf or NaN (the caller encodes the section its own way); -ENOMEM. */
int kern_merge512_sect(const struct kern_ext_ctx *c, const uint8_t *own, uint8_t *sect);
/* A MERGE section decoded with AVX-512 (kern_merge512.c), where kern_rot512_on(), into raw
 * rows of the block's own dtype: kern_merge_dec()'s bytes, streamed as kern_st512_mode() says
 * (kern_st512.h). 1, or 0 for a shape it does not take (D not a multiple of 32). */
int kern_merge512_dec(const struct kern_layout *lay, const uint8_t *sect, void *raw);
/* Tokens a layer's MERGE plan joins past the threshold (UINT64_MAX: no memory). */
uint64_t kern_merge_count_forced(const struct kern_ext_ctx *c);
/* LOWRANK's key sections with AVX-512 (kern_lowrank512.c), where kern_rot512_on() says so.
 * kern_lowrank512_rows (D a multiple of 16): a head's decoded rows (T tokens at o + t *
 * stride halves of out_dtype) from su (T x rank: sigma_i u[t][i]) and wf (rank x D: w as
 * floats), stored by mode nt (kern_st512.h; 0 where D % 32 != 0). kern_lowrank512_project
 * (D a multiple of 16): the r factors' rows w[i] (D floats) from their columns u[i] (T
 * floats, T <= D) and sigmas, as lr_project_ref. */
void kern_lowrank512_rows(uint32_t rank, uint32_t T, uint32_t D, uint16_t *o, uint64_t stride,
                          uint32_t out_dtype, const float *su, const float *wf, int nt);
/* kern_lowrank512_wf (D a multiple of 16): a head's factor rows w (rank x D halves) as the
 * floats wf that kern_lowrank512_rows reads. */
void kern_lowrank512_wf(const uint8_t *w, uint32_t rank, uint32_t D, float *wf);
/* kern_lowrank512_gram: g = K K^T (n = T <= D rows of x), every sum as lr_gram_ref. */
void kern_lowrank512_gram(const float *x, uint32_t n, uint32_t D, float *g);
/* The search's kern_lowrank_gv and kern_lowrank_orth with eight heads in the lanes (layout of
 * kern_lowrank.c's lr_gv_lanes, lr_orth_lanes); orth needs n a multiple of 8. */
void kern_lowrank512_gv(const float *G, const float *V, float *Z, uint32_t n, uint32_t c);
void kern_lowrank512_orth(const float *Z, float *V, uint32_t n, uint32_t c);
void kern_lowrank512_project(const float *x, uint32_t T, uint32_t D, const float *const *u,
                             const float *sig, uint32_t r, float *const *w);
int kern_lowrank_enc(const struct kern_cpu_ops *ops, const struct kern_ext_ctx *c, uint8_t *sect);
int kern_lowrank_dec(const struct kern_cpu_ops *ops, const struct kern_layout *lay,
                     const uint8_t *sect, void *raw, uint32_t out_dtype);
/* A layer's ROT2/ROT4 (codec) key section and its value section, KIVI value groups of the same
 * bits (ROT's values, or a recipe's KIVI2/KIVI4), decoded together with AVX-512
 * (kern_rot512_dec): 1, 0 where not taken (the sections then decode one at a time), -ENOMEM. */
int kern_rot_dec_kv(const struct kern_cpu_ops *ops, uint32_t codec, const struct kern_layout *lay,
                    const uint8_t *ksect, const uint8_t *vsect, void *rawk, void *rawv,
                    uint32_t out_dtype);
/* A layer's LOWRANK key section and its q8_0 value section (LOWRANK's values, or a recipe's
 * q8_0) decoded together where the rows are streamed with AVX-512 (kern_st512.h): 1, 0 where
 * not taken (the sections then decode one at a time), -ENOMEM. next, next_bytes: the bytes
 * the caller decodes next (the next layer's sections; NULL, 0: none), prefetched a share
 * after each tile of keys. */
int kern_lowrank_dec_kv(const struct kern_cpu_ops *ops, const struct kern_layout *lay,
                        const uint8_t *ksect, const uint8_t *vsect, void *rawk, void *rawv,
                        uint32_t out_dtype, const uint8_t *next, uint64_t next_bytes);

/* Reference pieces the AVX2 version reuses for tails. */
void kern_ref_enc(uint32_t codec, int is_v, const float *x, const struct kern_layout *lay,
                  uint32_t h, uint8_t *sect);
void kern_ref_dec(uint32_t codec, int is_v, const uint8_t *sect, const struct kern_layout *lay,
                  uint32_t h, float *y);

#endif
