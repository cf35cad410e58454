/*
 * kern_encb.h — the encode kernel's work, unit by unit and thread by thread, shared by the
 * CUDA kernel (kern_cuda.cu) and its CPU emulation (kern_encode_batched_cpu, kern.c).
 * Internal to kernels/.
 *
 * DESIGN
 * One launch encodes a block: its sections are cut into units, one thread block each, all
 * in one grid, found by a search of the section table the launch carries by value (struct
 * kern_enc_args: each section's codec, offset and first unit), plus a last unit that writes
 * the header and zeroes the sections' alignment padding. Units by codec:
 *  - token-major codecs (q8_0, q4_1, q5_1, KIVI values): KERN_ENC_GROUPS (256) consecutive groups
 *    of the section's [T][H][G] groups, so a unit's output is one contiguous run. A thread
 *    encodes a group at a time — its 32 values read as four 16-byte loads where the layout
 *    allows, the reference's group function into registers, the bytes into shared memory —
 *    and then the block writes the run out with 16-byte stores (phase 2). Whole groups (head_dim
 *    a multiple of 32, aligned input) take kern_enc_tm_fast: each codec's function inlined with
 *    the group's size a constant, so no byte of a group goes through local memory;
 *  - raw: KERN_ENC_RAW_BYTES of the section, copied 16 bytes a thread;
 *  - fp8: one head of the section: the amax of its T x D values (phase 0, a max per thread,
 *    8 values a load where aligned), the block's amax in two folds of 16 (phases 1, 2: max is
 *    order-free), the second storing the scale, the codes (phase 3, 8-byte stores);
 *  - KIVI keys: one 32-token group of one head, in columns of 8 channels (a token's 16 bytes
 *    of the head): each column's min and max over a slice of tokens in registers (phase 0),
 *    the slices folded in token order and the fp16 scale and min a thread per channel
 *    (phase 1), the codes a thread per (token, column), one 2- or 4-byte store (phase 2).
 *  - ROT keys: one head: its channels' means, a thread per channel (phase 0; the section's
 *    first unit writes its seed), then rounds of 4096 / D token rows in shared memory: load,
 *    centre, sign and the transform's stages inside an 8-value chunk by a thread, each later
 *    stage a phase (a thread per pair), the KIVI value groups a thread each
 *    (kern_enc_rot_round);
 *  - MERGE: one head of the section, and of the layer's V section where both are MERGE (the
 *    plan, which reads K and V, once for both; kern_enc_merge_kv): the plan
 *    (kern_enc_merge_plan) where T <= 64 and the rows fit by pairs: every pair s < t judged
 *    at once, a thread two tokens against one s over the head's rows staged in shared
 *    memory, K then V, then thread 0 walks the scan on the decisions; else in rounds, 32
 *    tokens judged against the run's first at once, 8 threads a token, then thread 0 takes
 *    the first that starts a run; each run's first token, then the map and each run's mean,
 *    a thread per (row, channel);
 *  - LOWRANK keys: one head: the head's bytes cleared and its keys staged in shared memory
 *    where they fit, the Gram matrix, a thread per entry, the subspace search phase by phase
 *    (kern_enc_lr_search: Z = g V a thread per element, Gram-Schmidt by the 8 lanes that own
 *    kern_sum8's partial sums, the column in registers, the dots folded by shuffles), the
 *    keys staged again where they fit, the factors, a thread per (factor, element).
 * A unit's phase count is a function of the launch's arguments (kern_enc_phases), the same
 * for all its threads: the kernel loops over it with a barrier after each phase.
 * ROT and LOWRANK values are KIVI and q8_0 sections (kern_codec_as). The arithmetic is the
 * reference's group functions (kern_fmt.h, kern_ext.h), so the bytes are the reference's. A
 * phase ends where the CUDA kernel has a __syncthreads(); the emulation runs every thread's
 * phase 0, then every thread's phase 1, and so on, over the same functions. No thread reads
 * in a phase what another writes in it.
 */
#ifndef KVC_KERN_ENCB_H
#define KVC_KERN_ENCB_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kern.h"
#include "kernels/kern_batch.h"
#include "kernels/kern_ext.h"
#include "kernels/kern_fmt.h"

#define KERN_ENC_THREADS 256
#define KERN_ENC_GROUPS 256      /* groups per token-major unit: one a thread */
#define KERN_ENC_RAW_BYTES 32768 /* bytes per raw unit */
#define KERN_ENC_MAX_SECT (2 * KERN_MAX_LAYERS)
#define KERN_ENC_ROT_VALS 4096 /* ROT: the values of a round (kern_enc_rot_round) */

/* A function the device calls rather than inlines (its own register allocation). */
#ifdef __CUDACC__
#define KERN_ENC_CALLED static __host__ __device__ __noinline__
#else
#define KERN_ENC_CALLED static inline
#endif

struct kern_enc_sect {
    uint32_t offset; /* from the block's start */
    uint32_t bytes;  /* payload */
    uint32_t unit0;  /* its first unit */
    uint32_t codec;
};

/* What the launch carries by value. */
struct kern_enc_args {
    struct kern_layout lay;
    struct kern_recipe rec;
    uint32_t nsect;
    uint32_t nunits;  /* the sections' units; unit nunits writes the header */
    uint32_t aligned; /* every group of 32 values starts 16-byte aligned in the input */
    uint32_t pad;
    struct kern_enc_sect s[KERN_ENC_MAX_SECT];
};

/* A thread block's shared memory. */
struct kern_enc_smem {
    union {
        uint8_t out[KERN_ENC_GROUPS * 34];        /* a token-major unit's output run */
        uint32_t starts[KERN_MAX_TOKENS / 2 + 2]; /* MERGE: each run's first token */
        float gram[2 * KERN_LOWRANK_MAX_N * KERN_LOWRANK_MAX_N]; /* LOWRANK: Gram, vectors */
        float rot[KERN_ENC_ROT_VALS];                            /* ROT: a round's rows */
        float mpart[4 * KERN_ENC_THREADS];                       /* MERGE: a round's partial sums */
    } u;
    float red[KERN_ENC_THREADS];        /* fp8: each thread's amax; LOWRANK: sigma */
    float mnf[KERN_MAX_HEAD_DIM];       /* KIVI keys: each channel's fp16 min, as float */
    float id[KERN_MAX_HEAD_DIM];        /* and 1 / scale; fp8: the first fold's amaxes */
    uint32_t map[KERN_MAX_TOKENS / 32]; /* MERGE: the run-start bitmap */
    uint32_t ord[KERN_LOWRANK_MAX_N];   /* LOWRANK: eigenvalues by size */
    float lr[80];                       /* LOWRANK: the trace (48), energies (64..) */
    uint32_t nrows;                     /* MERGE: rows; LOWRANK: rank */
    uint32_t mst[2];                    /* MERGE: the run's first token, the next token */
};

KERN_HD uint32_t kern_enc_group_bytes(uint32_t codec)
{ /* codec: as kern_codec_as gives it */
    int bits = kern_codec_bits(codec);
    if (bits)
        return kern_kivi_v_group_bytes(bits);
    return codec == KERN_CODEC_Q8_0 ? 34u : codec == KERN_CODEC_Q4_1 ? 20u : 24u;
}

KERN_HD uint32_t kern_enc_units(const struct kern_layout *lay, uint32_t codec, int is_v)
{
    const uint64_t T = lay->tokens, H = lay->heads, D = lay->head_dim;
    codec = kern_codec_as(codec, is_v);
    if (kern_rot_bits(codec))
        return (uint32_t)H;
    if (codec == KERN_CODEC_MERGE || codec == KERN_CODEC_LOWRANK)
        return (uint32_t)H;
    if (codec == KERN_CODEC_RAW)
        return (uint32_t)((T * H * D * 2 + KERN_ENC_RAW_BYTES - 1) / KERN_ENC_RAW_BYTES);
    if (codec == KERN_CODEC_FP8)
        return (uint32_t)H;
    if (kern_codec_bits(codec) && !is_v)
        return (uint32_t)(H * ((T + KERN_GROUP - 1) / KERN_GROUP));
    return (uint32_t)((T * H * kern_ngroups((uint32_t)D) + KERN_ENC_GROUPS - 1) / KERN_ENC_GROUPS);
}

/* Whether section (l, k)'s units are its layer's K section's: a MERGE V section beside a MERGE
 * K section, whose units plan each head once for both (kern_enc_merge_plan) and write both
 * sections' rows. */
KERN_HD int kern_enc_merge_kv(const struct kern_recipe *rec, uint32_t l, uint32_t k)
{
    return k == 1 && rec->codec[l][0] == KERN_CODEC_MERGE && rec->codec[l][1] == KERN_CODEC_MERGE;
}

/* Fills a from a layout and recipe that kern_encoded_size() accepted; src is the input (its
 * address decides the load width). Returns the encoded size. */
KERN_HD uint64_t kern_enc_args_fill(struct kern_enc_args *a, const struct kern_layout *lay,
                                    const struct kern_recipe *rec, const void *src)
{
    const uint32_t kinds = kern_kinds(lay);
    uint64_t off = kern_hdr_bytes(lay);
    uint32_t units = 0;
    memset(a, 0, sizeof(*a));
    a->lay = *lay;
    a->rec.seed = rec->seed;
    a->rec.merge_cos = rec->merge_cos;
    a->rec.lowrank_energy = rec->lowrank_energy;
    for (uint32_t l = 0; l < lay->layers; l++) {
        a->rec.codec[l][0] = rec->codec[l][0];
        a->rec.codec[l][1] = rec->codec[l][1];
        for (uint32_t k = 0; k < kinds; k++) {
            struct kern_enc_sect *s = &a->s[l * kinds + k];
            s->codec = rec->codec[l][k];
            s->offset = (uint32_t)off;
            s->bytes = (uint32_t)kern_sect_bytes(lay, s->codec, k == 1);
            s->unit0 = units;
            if (!kern_enc_merge_kv(rec, l, k)) /* else no units: the K section's */
                units += kern_enc_units(lay, s->codec, k == 1);
            off = (off + s->bytes + KERN_ALIGN - 1) & ~(uint64_t)(KERN_ALIGN - 1);
        }
    }
    a->nsect = lay->layers * kinds;
    a->nunits = units;
    a->aligned = (((uint64_t)(uintptr_t)src | (2ull * lay->head_dim)) & 15) == 0;
    return off;
}

/* The section of unit u (u < a->nunits): the last whose first unit is at most u, so a
 * section with no units (kern_enc_merge_kv) is never one, as the next section starts at its
 * unit0 and has units (only a MERGE V section has none, after a K section). */
KERN_HD uint32_t kern_enc_sect_of(const struct kern_enc_args *a, uint32_t u)
{
    uint32_t lo = 0, hi = a->nsect - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (a->s[mid].unit0 <= u)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* A raw value as a lossy codec sees it: kern_sanitize(kern_load()) of its bits. On the device
 * fp16 by the conversion instruction, which is exact as kern_h2f is (normal, subnormal, -0,
 * infinity) and differs only in a NaN's payload, which kern_sanitize makes 0 either way: the
 * same float for every one of the 65,536 inputs (check_kernels test_cuda_every_half). */
KERN_HD float kern_enc_in(uint16_t v, uint32_t dtype)
{
#ifdef __CUDA_ARCH__
    if (dtype != KERN_DTYPE_BF16)
        return kern_sanitize(__half2float(__ushort_as_half(v)));
#endif
    return kern_sanitize(kern_load(&v, dtype, 0));
}

/* Value (t, c) of head h of the (layer, kind) slab `raw` as a lossy codec sees it. */
KERN_HD float kern_enc_value(const struct kern_layout *lay, const uint8_t *raw, uint32_t t,
                             uint32_t h, uint32_t c)
{
    uint16_t v;
    memcpy(&v, raw + 2 * (((uint64_t)t * lay->heads + h) * lay->head_dim + c), 2);
    return kern_enc_in(v, lay->dtype);
}

/* ---- token-major units: groups of 32 values of one token and head ----------------------- */

/* Bytes [b, gb) of a group's encoding blk to o: 4-byte stores from o + b (4-byte aligned), a
 * 2-byte tail. b and gb are constants where it is called, so blk stays in registers. */
KERN_HD void kern_enc_tm_put_from(uint8_t *o, const uint8_t *blk, uint32_t b, uint32_t gb)
{
    KERN_UNROLL
    for (uint32_t k = 0; k < 9; k++)
        if (b + 4 * k + 4 <= gb) {
            const uint8_t *c = blk + b + 4 * k;
            const uint32_t w =
                c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24;
            KERN_BATCH_STORE(uint32_t, o + b + 4 * k, w);
        }
    if ((gb - b) & 2) {
        const uint16_t w = (uint16_t)(blk[gb - 2] | blk[gb - 1] << 8);
        KERN_BATCH_STORE(uint16_t, o + gb - 2, w);
    }
}

/* A group's encoding (gb bytes, even) into the unit's shared-memory run at o, which is 2-byte
 * aligned (every group size is even): where o is not 4-byte aligned, its first 2 bytes by a
 * 2-byte store; then 4-byte stores and a 2-byte tail. */
KERN_HD void kern_enc_tm_put(uint8_t *o, const uint8_t *blk, uint32_t gb)
{
    if ((uintptr_t)o & 2) {
        const uint16_t w = (uint16_t)(blk[0] | blk[1] << 8);
        KERN_BATCH_STORE(uint16_t, o, w);
        kern_enc_tm_put_from(o, blk, 2, gb);
    } else {
        kern_enc_tm_put_from(o, blk, 0, gb);
    }
}

/* A whole group (32 values, loaded as q) encoded by the reference's group function into o:
 * each codec a case of its own, so n, bits and the group's size are constants and the group
 * never leaves registers. */
KERN_HD void kern_enc_tm_whole(uint32_t codec, uint32_t dtype, const kern_batch_v16 *q, uint8_t *o)
{
    uint16_t v[KERN_GROUP];
    float x[KERN_GROUP];
    memcpy(v, q, sizeof(v));
    KERN_UNROLL
    for (int j = 0; j < KERN_GROUP; j++)
        x[j] = kern_enc_in(v[j], dtype);
    if (codec == KERN_CODEC_Q8_0) {
        uint8_t blk[34];
        kern_q8_0_enc(x, KERN_GROUP, blk);
        kern_enc_tm_put(o, blk, sizeof(blk));
    } else if (codec == KERN_CODEC_Q4_1) {
        uint8_t blk[20];
        kern_qx_1_enc(x, KERN_GROUP, blk, 4);
        kern_enc_tm_put(o, blk, sizeof(blk));
    } else if (codec == KERN_CODEC_Q5_1) {
        uint8_t blk[24];
        kern_qx_1_enc(x, KERN_GROUP, blk, 5);
        kern_enc_tm_put(o, blk, sizeof(blk));
    } else if (kern_codec_bits(codec) == 2) { /* KIVI values */
        uint8_t blk[12];
        kern_kivi_v_enc(x, KERN_GROUP, blk, 2);
        kern_enc_tm_put(o, blk, sizeof(blk));
    } else {
        uint8_t blk[20];
        kern_kivi_v_enc(x, KERN_GROUP, blk, 4);
        kern_enc_tm_put(o, blk, sizeof(blk));
    }
}

/* The whole groups of a unit (head_dim a multiple of 32, a->aligned): group i of the unit
 * (the section's group u0 + i of [T][H][G]) starts 64 i bytes after p, the unit's first, and
 * is read as four 16-byte loads. A call on the device, not inlined: its registers are
 * allocated apart from the rest of the kernel's (inlined, ptxas spilled the kernel at 64). */
KERN_ENC_CALLED void kern_enc_tm_fast(uint32_t codec, uint32_t dtype, const uint8_t *p,
                                      uint8_t *out, uint32_t gb, uint32_t ng, uint32_t tid,
                                      uint32_t nt)
{
    for (uint32_t i = tid; i < ng; i += nt) {
        kern_batch_v16 q[4];
        KERN_UNROLL
        for (int j = 0; j < 4; j++)
            KERN_BATCH_LOAD(kern_batch_v16, q[j], p + 2 * KERN_GROUP * (uint64_t)i + 16 * j);
        kern_enc_tm_whole(codec, dtype, q, out + i * gb);
    }
}

/* Phase 1 of a token-major unit: each thread encodes groups i = tid, tid + nt, ... of the
 * unit into the shared-memory run: whole groups by kern_enc_tm_fast where head_dim is a
 * multiple of 32 and the input aligned, else group by group, the tail groups element by
 * element. */
KERN_HD void kern_enc_tm_phase1(const struct kern_enc_args *a, const struct kern_enc_sect *s,
                                uint32_t unit, const uint8_t *raw, struct kern_enc_smem *sm,
                                uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t H = lay->heads, D = lay->head_dim, G = kern_ngroups(D);
    const uint64_t total = (uint64_t)lay->tokens * H * G, u0 = (uint64_t)unit * KERN_ENC_GROUPS;
    const uint32_t ng = (uint32_t)(total - u0 < KERN_ENC_GROUPS ? total - u0 : KERN_ENC_GROUPS);
    const uint32_t codec = s->codec, gb = kern_enc_group_bytes(codec);
    const int bits = kern_codec_bits(codec);
    if (a->aligned && D % KERN_GROUP == 0) {
        kern_enc_tm_fast(codec, lay->dtype, raw + 2 * KERN_GROUP * u0, sm->u.out, gb, ng, tid, nt);
        return;
    }
    for (uint32_t i = tid; i < ng; i += nt) {
        const uint64_t u = u0 + i;
        const uint32_t t = (uint32_t)(u / ((uint64_t)H * G));
        const uint32_t rem = (uint32_t)(u % ((uint64_t)H * G)), h = rem / G, g = rem % G;
        const int n = (int)(D - g * KERN_GROUP < KERN_GROUP ? D - g * KERN_GROUP : KERN_GROUP);
        const uint8_t *p = raw + 2 * (((uint64_t)t * H + h) * D + (uint64_t)g * KERN_GROUP);
        uint16_t v[KERN_GROUP];
        float x[KERN_GROUP];
        if (a->aligned && n == KERN_GROUP) {
            kern_batch_v16 q[4];
            KERN_UNROLL
            for (int j = 0; j < 4; j++)
                KERN_BATCH_LOAD(kern_batch_v16, q[j], p + 16 * j);
            memcpy(v, q, sizeof(v));
        } else {
            KERN_UNROLL
            for (int j = 0; j < KERN_GROUP; j++)
                v[j] = j < n ? (uint16_t)kern_batch_u16(p + 2 * j) : 0;
        }
        KERN_UNROLL
        for (int j = 0; j < KERN_GROUP; j++)
            x[j] = j < n ? kern_enc_in(v[j], lay->dtype) : 0.0f;
        uint8_t blk[34];
        if (bits)
            kern_kivi_v_enc(x, n, blk, bits);
        else if (codec == KERN_CODEC_Q8_0)
            kern_q8_0_enc(x, n, blk);
        else
            kern_qx_1_enc(x, n, blk, codec == KERN_CODEC_Q5_1 ? 5 : 4);
        memcpy(sm->u.out + (uint64_t)i * gb, blk, gb);
    }
}

/* The unit's run out of shared memory: 16 bytes a thread (the run starts 16-byte aligned:
 * sections do, and KERN_ENC_GROUPS groups are a multiple of 16 bytes), the tail by bytes. */
KERN_HD void kern_enc_tm_phase2(const struct kern_enc_args *a, const struct kern_enc_sect *s,
                                uint32_t unit, uint8_t *dst, const struct kern_enc_smem *sm,
                                uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint64_t total = (uint64_t)lay->tokens * lay->heads * kern_ngroups(lay->head_dim);
    const uint64_t u0 = (uint64_t)unit * KERN_ENC_GROUPS;
    const uint32_t ng = (uint32_t)(total - u0 < KERN_ENC_GROUPS ? total - u0 : KERN_ENC_GROUPS);
    const uint32_t bytes = ng * kern_enc_group_bytes(s->codec);
    uint8_t *to = dst + s->offset + u0 * kern_enc_group_bytes(s->codec);
    for (uint32_t i = tid; i < bytes / 16; i += nt) {
        kern_batch_v16 v;
        memcpy(&v, sm->u.out + 16 * i, 16);
        KERN_BATCH_STORE(kern_batch_v16, to + 16 * i, v);
    }
    for (uint32_t i = bytes / 16 * 16 + tid; i < bytes; i += nt)
        to[i] = sm->u.out[i];
}

/* ---- raw units ------------------------------------------------------------------------ */

KERN_HD void kern_enc_raw(const struct kern_enc_sect *s, uint32_t unit, const uint8_t *raw,
                          uint8_t *dst, uint32_t tid, uint32_t nt)
{
    const uint64_t from = (uint64_t)unit * KERN_ENC_RAW_BYTES;
    const uint64_t n = s->bytes - from < KERN_ENC_RAW_BYTES ? s->bytes - from : KERN_ENC_RAW_BYTES;
    const uint8_t *p = raw + from;
    uint8_t *q = dst + s->offset + from;
    if ((((uint64_t)(uintptr_t)p | (uint64_t)(uintptr_t)q) & 15) == 0) {
        for (uint64_t i = tid; i < n / 16; i += nt) {
            kern_batch_v16 v;
            KERN_BATCH_LOAD(kern_batch_v16, v, p + 16 * i);
            KERN_BATCH_STORE(kern_batch_v16, q + 16 * i, v);
        }
        for (uint64_t i = n / 16 * 16 + tid; i < n; i += nt)
            q[i] = p[i];
    } else {
        for (uint64_t i = tid; i < n; i += nt)
            q[i] = p[i];
    }
}

/* ---- fp8 units: one head ------------------------------------------------------------------ */

/* fp8 phases: the amax of each thread's values (0), the amaxes of KERN_ENC_FP8_FOLD threads
 * each by one of the first KERN_ENC_THREADS / KERN_ENC_FP8_FOLD threads (1), their amax and
 * the scale by thread 0 (2), the codes (3). max is order-free on the sanitised (finite,
 * fabsf: non-negative) values, so any order of folds gives the reference's amax. */
#define KERN_ENC_FP8_FOLD 16
#if KERN_ENC_FP8_FOLD * KERN_ENC_FP8_FOLD != KERN_ENC_THREADS
#error "fp8's two folds take KERN_ENC_FP8_FOLD^2 == KERN_ENC_THREADS amaxes"
#endif

/* The 8 values of head h at token t from channel d0 (d0 + 8 <= D), as floats: one 16-byte
 * load where the block allows (a->aligned, d0 a multiple of 8), else element by element. */
KERN_HD void kern_enc_load8(const struct kern_enc_args *a, const uint8_t *raw, uint32_t t,
                            uint32_t h, uint32_t d0, float *x)
{
    const struct kern_layout *lay = &a->lay;
    const uint8_t *p = raw + 2 * (((uint64_t)t * lay->heads + h) * lay->head_dim + d0);
    uint16_t v[8];
    if (a->aligned && (d0 & 7) == 0) {
        kern_batch_v16 q;
        KERN_BATCH_LOAD(kern_batch_v16, q, p);
        memcpy(v, &q, sizeof(v));
    } else {
        KERN_UNROLL
        for (int j = 0; j < 8; j++)
            v[j] = (uint16_t)kern_batch_u16(p + 2 * j);
    }
    KERN_UNROLL
    for (int j = 0; j < 8; j++)
        x[j] = kern_enc_in(v[j], lay->dtype);
}

KERN_HD void kern_enc_fp8_phase1(const struct kern_enc_args *a, uint32_t h, const uint8_t *raw,
                                 struct kern_enc_smem *sm, uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t D = lay->head_dim, n = lay->tokens * D;
    float amax = 0.0f;
    if ((D & 7) == 0) { /* 8 values of one token a step */
        for (uint32_t i = tid; i < n / 8; i += nt) {
            float x[8];
            kern_enc_load8(a, raw, i / (D / 8), h, i % (D / 8) * 8, x);
            KERN_UNROLL
            for (int j = 0; j < 8; j++) {
                float v = fabsf(x[j]);
                amax = v > amax ? v : amax;
            }
        }
    } else {
        for (uint32_t i = tid; i < n; i += nt) {
            float v = fabsf(kern_enc_value(lay, raw, i / D, h, i % D));
            amax = v > amax ? v : amax;
        }
    }
    sm->red[tid] = amax;
}

/* Fold phase `step` (1 or 2): in 1, thread t < KERN_ENC_FP8_FOLD takes the max of threads
 * t * KERN_ENC_FP8_FOLD .. + KERN_ENC_FP8_FOLD - 1's amaxes (into sm->id[t]); in 2 thread 0
 * takes the max of those and stores the scale. */
KERN_HD void kern_enc_fp8_fold(const struct kern_enc_sect *s, uint32_t h, uint8_t *dst,
                               struct kern_enc_smem *sm, int step, uint32_t tid)
{
    if (tid >= (step == 1 ? KERN_ENC_FP8_FOLD : 1u))
        return;
    const float *in = step == 1 ? sm->red + KERN_ENC_FP8_FOLD * tid : sm->id;
    float amax = 0.0f;
    KERN_UNROLL
    for (int j = 0; j < KERN_ENC_FP8_FOLD; j++)
        amax = in[j] > amax ? in[j] : amax;
    if (step == 1) {
        sm->id[tid] = amax;
    } else {
        float scale = kern_fp8_scale(amax);
        sm->mnf[0] = scale;
        memcpy(dst + s->offset + 4 * h, &scale, 4);
    }
}

KERN_HD void kern_enc_fp8_phase3(const struct kern_enc_args *a, const struct kern_enc_sect *s,
                                 uint32_t h, const uint8_t *raw, uint8_t *dst,
                                 const struct kern_enc_smem *sm, uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t H = lay->heads, D = lay->head_dim, n = lay->tokens * D;
    const float scale = sm->mnf[0];
    uint8_t *q = dst + s->offset + 4 * H;
    if ((D & 7) == 0) { /* 8 codes a step, one 8-byte store where they are 8-byte aligned */
        for (uint32_t i = tid; i < n / 8; i += nt) {
            const uint32_t t = i / (D / 8), d0 = i % (D / 8) * 8;
            uint8_t *o = q + ((uint64_t)t * H + h) * D + d0;
            float x[8];
            uint8_t c[8];
            kern_enc_load8(a, raw, t, h, d0, x);
            KERN_UNROLL
            for (int j = 0; j < 8; j++)
                c[j] = kern_e4m3_enc(KERN_DIV(x[j], scale));
            if (((uintptr_t)o & 7) == 0) {
                uint64_t w;
                memcpy(&w, c, 8);
                KERN_BATCH_STORE(uint64_t, o, w);
            } else {
                for (int j = 0; j < 8; j++)
                    o[j] = c[j];
            }
        }
        return;
    }
    for (uint32_t i = tid; i < n; i += nt) {
        uint32_t t = i / D, d = i % D;
        q[((uint64_t)t * H + h) * D + d] =
            kern_e4m3_enc(KERN_DIV(kern_enc_value(lay, raw, t, h, d), scale));
    }
}

/* ---- KIVI key units: one 32-token group of one head ---------------------------------------- */

/* A KIVI key group is channel-major (each channel's min and max over the group's tokens, then
 * the codes row by row), its input token-major. The unit works in columns of 8 channels, a
 * token's 16 bytes of the head, so a row's columns are consecutive threads and a warp's loads
 * one run of the token's row:
 *  - phase 0: a thread per (column, slice of consecutive tokens) takes its 8 channels' min and
 *    max over the slice in registers, one 16-byte load a token, into shared memory;
 *  - phase 1: a thread per channel folds the slices in token order and stores the fp16 scale
 *    and min (kern_kivi_params) to the group, the floats it quantizes by to shared memory;
 *  - phase 2: a thread per (token, column) loads its 8 values again and stores their codes as
 *    one word (bits bytes: 4-bit columns start 4-byte aligned, 2-bit ones 2-byte aligned).
 * The reference's min is the first value, in token order, that no later one is strictly below
 * (max likewise): a slice's is its own range's, and the fold keeps the earlier slice's on a
 * tie, so the result is the reference's, -0 against +0 included. A column's 8 partials, and
 * in phase 2 its 8 mins and reciprocals, move through shared memory 16 bytes at a time where
 * the addresses allow (the shared block starts aligned in practice; the union is not declared
 * so: a 16-byte member made the kernel spill at 64 registers). Phases 0 and 2 are calls on
 * the device: inlined, the kernel spilled at 64 registers, and so it did where the calls held
 * the group's layout in registers of their own rather than reading it through a. */

/* Columns of a head: 8 channels each, the last one D % 8 where D is not a multiple of 8. */
KERN_HD uint32_t kern_enc_kk_cols(uint32_t D)
{
    return (D + 7) / 8;
}

/* Tokens per slice in phase 0 (*per) and the slices that hold any (*ns): as many slices as
 * the threads allow beside the columns, so ns * D <= 8 * nt floats of each of min and max. */
KERN_HD void kern_enc_kk_slices(uint32_t D, uint32_t rows, uint32_t nt, uint32_t *per, uint32_t *ns)
{
    const uint32_t cols = kern_enc_kk_cols(D), s = nt / cols ? nt / cols : 1;
    *per = (rows + s - 1) / s;
    *ns = (rows + *per - 1) / *per;
}

#if 2 * 8 * KERN_ENC_THREADS > KERN_ENC_ROT_VALS
#error "KIVI keys' slice partials (min and max, ns * D <= 8 * threads each) live in u.rot"
#endif

KERN_HD uint8_t *kern_enc_kk_group(const struct kern_enc_args *a, const struct kern_enc_sect *s,
                                   uint32_t unit, uint8_t *dst, uint32_t *h, uint32_t *t0,
                                   uint32_t *rows)
{
    const struct kern_layout *lay = &a->lay;
    const int bits = kern_codec_bits(s->codec);
    const uint32_t ngr = (lay->tokens + KERN_GROUP - 1) / KERN_GROUP, gi = unit % ngr;
    *h = unit / ngr;
    *t0 = gi * KERN_GROUP;
    *rows = lay->tokens - *t0 < KERN_GROUP ? lay->tokens - *t0 : KERN_GROUP;
    return dst + s->offset +
           (uint64_t)*h * kern_kivi_k_head_bytes(lay->head_dim, lay->tokens, bits) +
           (uint64_t)gi * kern_kivi_k_group_bytes(lay->head_dim, KERN_GROUP, bits);
}

/* Column j of head h at token t as floats (x[k] = 0 past head_dim); returns its channels.
 * One 16-byte load where the block is aligned (then every column is whole). */
KERN_HD uint32_t kern_enc_kk_load(const struct kern_enc_args *a, const uint8_t *raw, uint32_t t,
                                  uint32_t h, uint32_t j, float *x)
{
    const uint32_t D = a->lay.head_dim, d0 = 8 * j, n = D - d0 < 8 ? D - d0 : 8;
    if (n == 8) {
        kern_enc_load8(a, raw, t, h, d0, x);
        return 8;
    }
    KERN_UNROLL
    for (uint32_t k = 0; k < 8; k++)
        x[k] = k < n ? kern_enc_value(&a->lay, raw, t, h, d0 + k) : 0.0f;
    return n;
}

KERN_ENC_CALLED void kern_enc_kk_phase0(const struct kern_enc_args *a,
                                        const struct kern_enc_sect *s, uint32_t unit,
                                        const uint8_t *raw, uint8_t *dst, struct kern_enc_smem *sm,
                                        uint32_t tid, uint32_t nt)
{
    const uint32_t D = a->lay.head_dim, cols = kern_enc_kk_cols(D);
    uint32_t h, t0, rows, per, ns;
    kern_enc_kk_group(a, s, unit, dst, &h, &t0, &rows);
    kern_enc_kk_slices(D, rows, nt, &per, &ns);
    float *pmn = sm->u.rot, *pmx = sm->u.rot + ns * D;
    for (uint32_t w = tid; w < cols * ns; w += nt) {
        const uint32_t j = w % cols, sl = w / cols, r0 = sl * per;
        const uint32_t r1 = rows < r0 + per ? rows : r0 + per;
        float mn[8], mx[8];
        const uint32_t n = kern_enc_kk_load(a, raw, t0 + r0, h, j, mn);
        KERN_UNROLL
        for (int k = 0; k < 8; k++)
            mx[k] = mn[k];
        for (uint32_t r = r0 + 1; r < r1; r++) {
            float x[8];
            kern_enc_kk_load(a, raw, t0 + r, h, j, x);
            KERN_UNROLL
            for (int k = 0; k < 8; k++) {
                mn[k] = x[k] < mn[k] ? x[k] : mn[k];
                mx[k] = x[k] > mx[k] ? x[k] : mx[k];
            }
        }
        float *on = pmn + sl * D + 8 * j, *ox = pmx + sl * D + 8 * j;
        if (n == 8 && (((uintptr_t)on | (uintptr_t)ox) & 15) == 0) {
            kern_batch_v16 q[4];
            memcpy(q, mn, 32);
            memcpy(q + 2, mx, 32);
            KERN_BATCH_STORE(kern_batch_v16, on, q[0]);
            KERN_BATCH_STORE(kern_batch_v16, on + 4, q[1]);
            KERN_BATCH_STORE(kern_batch_v16, ox, q[2]);
            KERN_BATCH_STORE(kern_batch_v16, ox + 4, q[3]);
        } else {
            KERN_UNROLL
            for (uint32_t k = 0; k < 8; k++)
                if (k < n) {
                    on[k] = mn[k];
                    ox[k] = mx[k];
                }
        }
    }
}

KERN_HD void kern_enc_kk_phase1(const struct kern_enc_args *a, const struct kern_enc_sect *s,
                                uint32_t unit, uint8_t *dst, struct kern_enc_smem *sm, uint32_t tid,
                                uint32_t nt)
{
    const int bits = kern_codec_bits(s->codec);
    const uint32_t D = a->lay.head_dim;
    uint32_t h, t0, rows, per, ns;
    uint8_t *g = kern_enc_kk_group(a, s, unit, dst, &h, &t0, &rows);
    kern_enc_kk_slices(D, rows, nt, &per, &ns);
    const float *pmn = sm->u.rot, *pmx = sm->u.rot + ns * D;
    for (uint32_t c = tid; c < D; c += nt) {
        float mn = pmn[c], mx = pmx[c];
        for (uint32_t sl = 1; sl < ns; sl++) {
            const float vn = pmn[sl * D + c], vx = pmx[sl * D + c];
            mn = vn < mn ? vn : mn;
            mx = vx > mx ? vx : mx;
        }
        uint16_t mn_h, sc_h;
        kern_kivi_params(mn, mx, bits, &mn_h, &sc_h, &sm->mnf[c], &sm->id[c]);
        KERN_BATCH_STORE(uint16_t, g + 2 * c, sc_h);
        KERN_BATCH_STORE(uint16_t, g + 2 * D + 2 * c, mn_h);
    }
}

KERN_ENC_CALLED void kern_enc_kk_phase2(const struct kern_enc_args *a,
                                        const struct kern_enc_sect *s, uint32_t unit,
                                        const uint8_t *raw, uint8_t *dst,
                                        const struct kern_enc_smem *sm, uint32_t tid, uint32_t nt)
{
    const int bits = kern_codec_bits(s->codec);
    const uint32_t D = a->lay.head_dim, rb = kern_kivi_row_bytes(D, bits);
    const uint32_t cols = kern_enc_kk_cols(D);
    uint32_t h, t0, rows;
    uint8_t *g = kern_enc_kk_group(a, s, unit, dst, &h, &t0, &rows);
    const uint32_t gb = kern_kivi_k_group_bytes(D, rows, bits);
    for (uint32_t w = tid; w < rows * cols; w += nt) {
        const uint32_t r = w / cols, j = w % cols;
        float x[8];
        const uint32_t n = kern_enc_kk_load(a, raw, t0 + r, h, j, x);
        const float *cm = sm->mnf + 8 * j, *ci = sm->id + 8 * j;
        float m8[8], i8[8];
        if (n == 8 && (((uintptr_t)cm | (uintptr_t)ci) & 15) == 0) {
            kern_batch_v16 q[4];
            KERN_UNROLL
            for (int k = 0; k < 2; k++) {
                KERN_BATCH_LOAD(kern_batch_v16, q[k], cm + 4 * k);
                KERN_BATCH_LOAD(kern_batch_v16, q[2 + k], ci + 4 * k);
            }
            memcpy(m8, q, 32);
            memcpy(i8, q + 2, 32);
        } else {
            KERN_UNROLL
            for (uint32_t k = 0; k < 8; k++) {
                m8[k] = k < n ? cm[k] : 0.0f;
                i8[k] = k < n ? ci[k] : 0.0f;
            }
        }
        uint32_t word = 0;
        KERN_UNROLL
        for (uint32_t k = 0; k < 8; k++)
            if (k < n)
                word |= kern_kivi_code(x[k], m8[k], i8[k], bits) << (k * (uint32_t)bits);
        uint8_t *o = g + 4 * D + r * rb + j * (uint32_t)bits;
        if (n == 8 && bits == 4 && ((uintptr_t)o & 3) == 0) {
            KERN_BATCH_STORE(uint32_t, o, word);
        } else if (n == 8 && bits == 2 && ((uintptr_t)o & 1) == 0) {
            const uint16_t w2 = (uint16_t)word;
            KERN_BATCH_STORE(uint16_t, o, w2);
        } else {
            for (uint32_t b = 0; b < (n * (uint32_t)bits + 7) / 8; b++)
                o[b] = (uint8_t)(word >> (8 * b));
        }
    }
    for (uint32_t i = 4 * D + rows * rb + tid; i < gb; i += nt)
        g[i] = 0;
}

/* ---- ROT key units: one head ------------------------------------------------------------------ */

KERN_HD void kern_enc_rot_phase1(const struct kern_enc_args *a, const struct kern_enc_sect *s,
                                 uint32_t h, uint32_t layer, const uint8_t *raw, uint8_t *dst,
                                 struct kern_enc_smem *sm, uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t D = lay->head_dim, sseed = kern_rot_sect_seed(a->rec.seed, layer);
    uint8_t *p = dst + s->offset;
    if (h == 0 && tid == 0) {
        memcpy(p, &sseed, 4);
        for (int i = 4; i < KERN_ROT_PREFIX; i++)
            p[i] = 0;
        for (uint64_t i = 2ull * lay->heads * D; i < kern_rot_mean_bytes(lay->heads, D); i++)
            p[KERN_ROT_PREFIX + i] = 0;
    }
    for (uint32_t c = tid; c < D; c += nt) {
        sm->mnf[c] = kern_rot_mean(lay, raw, h, c);
        kern_put_h(p + KERN_ROT_PREFIX + 2ull * ((uint64_t)h * D + c), sm->mnf[c]);
    }
}

/* ROT rows are rotated KERN_ENC_ROT_VALS values at a time (a round: KERN_ENC_ROT_VALS / D
 * whole token rows) in shared memory. A round's phases: load (1), cross stages (xs), encode
 * (1). Load: a thread takes a chunk of L = 8 values of a row — centred, signed — and runs the
 * transform's stages of length 1, 2, 4 on it in registers (kern_fwht over L: those pairs lie
 * inside the chunk); then each stage of length L, 2L, .. D / 2 is a phase, a thread
 * per pair (j, j + len), in place (a pair is one thread's alone); encode: a thread per KIVI
 * value group, scaled and clamped as kern_rot_fwd does. These are kern_fwht's pairs and
 * operations, each stage complete before the next starts, so every value is the reference's. */
KERN_HD uint32_t kern_enc_log2(uint32_t x)
{
    uint32_t k = 0;
    while ((1u << k) < x)
        k++;
    return k;
}

/* Phases per round: load, the cross stages, encode. */
#define KERN_ENC_ROT_CHUNK 8 /* a thread's values in a ROT round's load (head_dim >= 8) */

KERN_HD uint32_t kern_enc_rot_round_phases(uint32_t D)
{
    return 2 + kern_enc_log2(D) - kern_enc_log2(KERN_ENC_ROT_CHUNK);
}

KERN_HD uint32_t kern_enc_rot_phases(const struct kern_layout *lay)
{
    const uint32_t rpr = KERN_ENC_ROT_VALS / lay->head_dim;
    return 1 + (lay->tokens + rpr - 1) / rpr * kern_enc_rot_round_phases(lay->head_dim);
}

KERN_HD void kern_enc_rot_round(const struct kern_enc_args *a, const struct kern_enc_sect *s,
                                uint32_t h, uint32_t layer, const uint8_t *raw, uint8_t *dst,
                                struct kern_enc_smem *sm, uint32_t ph, uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const int bits = kern_rot_bits(s->codec);
    const uint32_t H = lay->heads, D = lay->head_dim, G = kern_ngroups(D), ld = kern_enc_log2(D);
    const uint32_t L = KERN_ENC_ROT_CHUNK, rp = kern_enc_rot_round_phases(D);
    const uint32_t rpr = KERN_ENC_ROT_VALS / D, round = ph / rp, step = ph % rp;
    const uint32_t t0 = round * rpr, rows = lay->tokens - t0 < rpr ? lay->tokens - t0 : rpr;
    const uint32_t sseed = kern_rot_sect_seed(a->rec.seed, layer);
    float *buf = sm->u.rot;
    if (step == 0) { /* load: a chunk of L values a thread, stages 1 .. L / 2 */
        for (uint32_t q = tid; q < rows * D / L; q += nt) {
            const uint32_t t = t0 + q * L / D, c0 = q * L % D;
            float y[KERN_ENC_ROT_CHUNK];
            kern_enc_load8(a, raw, t, h, c0, y);
            KERN_UNROLL
            for (uint32_t j = 0; j < L; j++) {
                const float x = KERN_SUB(y[j], sm->mnf[c0 + j]);
                y[j] = kern_rot_neg(sseed, h, c0 + j) ? -x : x;
            }
            kern_fwht(y, L);
            KERN_UNROLL
            for (uint32_t j = 0; j < L; j++)
                buf[q * L + j] = y[j];
        }
    } else if (step < rp - 1) { /* the stage of length L << (step - 1) */
        const uint32_t ll = kern_enc_log2(L) + step - 1, len = 1u << ll;
        for (uint32_t p = tid; p < rows * D / 2; p += nt) {
            const uint32_t r = p >> (ld - 1), pp = p & (D / 2 - 1);
            const uint32_t j = r * D + (pp >> ll << (ll + 1)) + (pp & (len - 1));
            const float x = buf[j], y = buf[j + len];
            buf[j] = KERN_ADD(x, y);
            buf[j + len] = KERN_SUB(x, y);
        }
    } else { /* encode: a KIVI value group a thread */
        const uint32_t gb = kern_kivi_v_group_bytes(bits);
        const float c = kern_rot_scale(D);
        uint8_t *out = dst + s->offset + kern_rot_groups_off(lay);
        for (uint32_t i = tid; i < rows * G; i += nt) {
            const uint32_t r = i / G, g = i % G;
            const int n = (int)(D - g * KERN_GROUP < KERN_GROUP ? D - g * KERN_GROUP : KERN_GROUP);
            const float *row = buf + r * D + g * KERN_GROUP;
            float y[KERN_GROUP];
            KERN_UNROLL
            for (int j = 0; j < KERN_GROUP; j++)
                y[j] = j < n ? kern_sanitize(KERN_MUL(row[j], c)) : 0.0f;
            uint8_t blk[4 + 4 * 4];
            kern_kivi_v_enc(y, n, blk, bits);
            memcpy(out + (((uint64_t)(t0 + r) * H + h) * G + g) * gb, blk, gb);
        }
    }
}

/* ---- MERGE units: one head of a section ------------------------------------------------------ */

/* MERGE's plan (kern_merge_plan) across the thread block, two ways.
 *
 * Rounds (any T). The scan's state — the run's first token s, the rows so far, the next token
 * to judge — is in shared memory. A round judges KERN_ENC_MERGE_WIN tokens from the next one
 * against s at once (eval phase): 8 threads a token, thread m summing the channels c = m mod 8
 * in order — kern_merge_near's partial sums p[c & 7] of |x_t - x_s|^2 and |x_s|^2, K and V —;
 * then thread 0 folds them token by token (kern_sum8_fold and the comparison of
 * kern_merge_near, so each decision is the reference's) up to the first token that does not
 * join: it starts a run (s, a row, its bit), and the next round starts after it; with none,
 * after the window (decide phase). The tokens judged past a new run's start are judged again
 * against it, so every decision is the serial scan's. Once the head has its ceil(T / 2) rows
 * the map cannot change (the scan only counts tokens joined past the threshold, which the
 * device does not report), and the rounds left do nothing. Rounds: at most one per row past
 * the first, plus one per window without a new run.
 *
 * Pairs (kern_enc_merge_paired: T <= KERN_ENC_MERGE_PAIR_T and the head's rows of one kind fit
 * in shared memory beside the T x T decisions). Where most tokens start runs, the rounds take
 * about T / 2 of them, each judging 32 tokens to use one, with two barriers and a thread's
 * serial fold between. Instead, every pair s < t is judged at once: the head's K rows staged
 * as floats (rows of D | 1 floats: the pair phase's threads read rows t, t + 1, .. at one
 * channel, an odd stride apart, so in different banks, while row s is one address, a
 * broadcast), then a thread per two pairs (t1, s), (t2, s), s-major, runs kern_merge_near's
 * loop over the staged values — the same partial sums in the same order and kern_sum8_fold —
 * into bytes near[t][s]; the same for V, and-ed in. Then thread 0 walks the scan on the
 * bytes (a test a token) and the runs and rows follow as after the rounds. Phases: 2 a
 * kind, the walk, the runs, the rows: 7 for K+V against the rounds' 3 + 2 (T / 2 - 1 +
 * ceil((T - 1) / 32)), 35 at T = 32. */
#define KERN_ENC_MERGE_WIN (KERN_ENC_THREADS / 8)
#define KERN_ENC_MERGE_PAIR_T 64
#define KERN_ENC_MERGE_FLOATS (2 * KERN_LOWRANK_MAX_N * KERN_LOWRANK_MAX_N) /* u.gram's */

KERN_HD uint32_t kern_enc_merge_rounds(const struct kern_layout *lay)
{
    const uint32_t T = lay->tokens;
    return kern_merge_rows(T) - 1 + (T - 1 + KERN_ENC_MERGE_WIN - 1) / KERN_ENC_MERGE_WIN;
}

/* Whether head rows are judged by pairs (else by rounds). */
KERN_HD int kern_enc_merge_paired(const struct kern_layout *lay)
{
    const uint32_t T = lay->tokens;
    return T <= KERN_ENC_MERGE_PAIR_T &&
           T * (lay->head_dim | 1u) + (T * T + 3) / 4 <= KERN_ENC_MERGE_FLOATS;
}

KERN_HD uint32_t kern_enc_merge_phases(const struct kern_layout *lay)
{
    if (kern_enc_merge_paired(lay)) /* (stage, pairs) a kind, walk, runs, rows */
        return 2 * kern_kinds(lay) + 3;
    return 3 + 2 * kern_enc_merge_rounds(lay); /* start, (eval, decide) x rounds, runs, rows */
}

KERN_HD uint32_t kern_enc_ctz(uint32_t x)
{ /* x != 0 */
    return kern_batch_popc((x & (0u - x)) - 1u);
}

/* Pairs: the head's rows of one kind into shared memory, rows of D | 1 floats. */
KERN_HD void kern_enc_merge_stage(const struct kern_enc_args *a, const uint8_t *raw, uint32_t h,
                                  struct kern_enc_smem *sm, uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t T = lay->tokens, D = lay->head_dim, ds = D | 1u;
    float *x = sm->u.gram;
    if ((D & 7) == 0) {
        for (uint32_t q = tid; q < T * D / 8; q += nt) {
            const uint32_t t = q / (D / 8), d0 = q % (D / 8) * 8;
            float v[8];
            kern_enc_load8(a, raw, t, h, d0, v);
            for (uint32_t j = 0; j < 8; j++)
                x[t * ds + d0 + j] = v[j];
        }
        return;
    }
    for (uint32_t q = tid; q < T * D; q += nt)
        x[q / D * ds + q % D] = kern_enc_value(lay, raw, q / D, h, q % D);
}

/* Pairs: kern_merge_near's step at channel c0 + j (j = c & 7) for rows t1 and t2 against s. */
KERN_HD void kern_enc_merge_step(const float *x1, const float *x2, const float *xs, uint32_t c0,
                                 uint32_t j, float *pd1, float *pd2, float *pn)
{
    const float y = xs[c0 + j], d1 = KERN_SUB(x1[c0 + j], y), d2 = KERN_SUB(x2[c0 + j], y);
    pd1[j] = KERN_ADD(pd1[j], KERN_MUL(d1, d1));
    pd2[j] = KERN_ADD(pd2[j], KERN_MUL(d2, d2));
    pn[j] = KERN_ADD(pn[j], KERN_MUL(y, y));
}

/* Pairs: near[t][s] for every s < t of the staged kind (kind 0 stores it, kind 1 ands it in).
 * A thread judges two tokens against one s, t1 = s + 1 + b and t2 = t1 + hs (hs = ceil((T - 1 -
 * s) / 2); t2 = T or past: t1 alone), which share row s's loads and its |x_s|^2 sums; the
 * threads' b consecutive for one s, so their rows t1 (and t2) are consecutive: an odd stride
 * apart. Units in the order s = 0: b = 0 .. hs - 1, then s = 1, ..: T^2 / 4 of them. */
KERN_ENC_CALLED void kern_enc_merge_pairs(const struct kern_enc_args *a, struct kern_enc_smem *sm,
                                          uint32_t kind, uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t T = lay->tokens, D = lay->head_dim, ds = D | 1u;
    const float lim = kern_merge_lim(a->rec.merge_cos);
    const float *x = sm->u.gram;
    uint8_t *near = (uint8_t *)(sm->u.gram + T * ds);
    uint32_t s = 0, u0 = 0; /* units before row s's: u0 */
    for (uint32_t u = tid; u < T * T / 4; u += nt) {
        while (u >= u0 + (T - s) / 2) {
            u0 += (T - s) / 2;
            s++;
        }
        const uint32_t hs = (T - s) / 2, t1 = s + 1 + (u - u0), two = t1 + hs < T;
        const uint32_t t2 = two ? t1 + hs : t1;
        const float *x1 = x + t1 * ds, *x2 = x + t2 * ds, *xs = x + s * ds;
        float pd1[8] = {0, 0, 0, 0, 0, 0, 0, 0}, pd2[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        float pn[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        uint32_t c0 = 0;
        for (; c0 + 8 <= D; c0 += 8) {
            KERN_UNROLL
            for (uint32_t j = 0; j < 8; j++)
                kern_enc_merge_step(x1, x2, xs, c0, j, pd1, pd2, pn);
        }
        KERN_UNROLL
        for (uint32_t j = 0; j < 8; j++)
            if (c0 + j < D)
                kern_enc_merge_step(x1, x2, xs, c0, j, pd1, pd2, pn);
        const float thr = KERN_MUL(lim, kern_sum8_fold(pn));
        const uint8_t n1 = kern_sum8_fold(pd1) <= thr, n2 = kern_sum8_fold(pd2) <= thr;
        near[t1 * T + s] = kind ? (uint8_t)(near[t1 * T + s] & n1) : n1;
        if (two)
            near[t2 * T + s] = kind ? (uint8_t)(near[t2 * T + s] & n2) : n2;
    }
}

/* Pairs: thread 0 walks the scan on the decisions (kern_merge_plan's loop). */
KERN_HD void kern_enc_merge_walk(const struct kern_layout *lay, struct kern_enc_smem *sm)
{
    const uint32_t T = lay->tokens, R = kern_merge_rows(T), ds = lay->head_dim | 1u;
    const uint8_t *near = (const uint8_t *)(sm->u.gram + T * ds);
    uint32_t s = 0, rows = 1;
    for (uint32_t t = 1; t < T && rows < R; t++) {
        if (near[t * T + s])
            continue;
        s = t;
        rows++;
        sm->map[t >> 5] |= 1u << (t & 31);
    }
    sm->nrows = rows;
}

/* Each run's first token, in order, from the map (thread 0). */
KERN_HD void kern_enc_merge_runs(uint32_t T, struct kern_enc_smem *sm)
{
    uint32_t r = 0;
    for (uint32_t w = 0; w < (T + 31) / 32; w++)
        for (uint32_t b = sm->map[w]; b; b &= b - 1)
            sm->u.starts[r++] = 32 * w + kern_enc_ctz(b);
    sm->u.starts[r] = T;
}

/* sv: the layer's MERGE V section where this unit writes it too (kern_enc_merge_kv), or NULL. */
KERN_HD void kern_enc_merge_plan(const struct kern_enc_args *a, const struct kern_enc_sect *s,
                                 const struct kern_enc_sect *sv, uint32_t h, const uint8_t *rawk,
                                 const uint8_t *rawv, uint8_t *dst, struct kern_enc_smem *sm,
                                 uint32_t ph, uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t T = lay->tokens, R = kern_merge_rows(T);
    const int paired = kern_enc_merge_paired(lay);
    if (ph == 0) { /* the head's bytes cleared; the scan at token 1, run 0 from token 0 */
        const uint64_t hb = kern_merge_head_bytes(lay->head_dim, T);
        uint8_t *head = dst + s->offset + (uint64_t)h * hb;
        uint8_t *headv = sv ? dst + sv->offset + (uint64_t)h * hb : NULL;
        for (uint64_t i = tid; i < hb; i += nt) {
            head[i] = 0;
            if (headv)
                headv[i] = 0;
        }
        for (uint32_t w = tid; w < (T + 31) / 32; w += nt)
            sm->map[w] = w == 0 ? 1u : 0u;
        if (tid == 0) {
            sm->nrows = 1;
            sm->mst[0] = 0; /* s */
            sm->mst[1] = 1; /* the next token */
        }
        if (paired)
            kern_enc_merge_stage(a, rawk, h, sm, tid, nt);
        return;
    }
    if (paired) { /* K pairs, [V stage, V pairs], walk, runs */
        const uint32_t walk = 2 * kern_kinds(lay);
        if (ph < walk && (ph & 1))
            kern_enc_merge_pairs(a, sm, ph / 2, tid, nt);
        else if (ph < walk)
            kern_enc_merge_stage(a, rawv, h, sm, tid, nt);
        else if (tid == 0 && ph == walk)
            kern_enc_merge_walk(lay, sm);
        else if (tid == 0)
            kern_enc_merge_runs(T, sm);
        return;
    }
    const int last = ph == 2 * kern_enc_merge_rounds(lay) + 1;
    if (tid != 0 && (last || !(ph & 1)))
        return; /* the decide and runs phases are thread 0's, which writes the scan's state */
    const uint32_t run = sm->mst[0], next = sm->mst[1];
    if (last) { /* each run's first token, in order */
        kern_enc_merge_runs(T, sm);
        return;
    }
    if (next >= T || sm->nrows >= R)
        return; /* the plan is complete */
    const float lim = kern_merge_lim(a->rec.merge_cos);
    float *part = sm->u.mpart; /* [token][K d, K n, V d, V n][m] */
    if (ph & 1) {              /* eval: thread m's partial sums of token next + tid / 8 */
        const uint32_t i = tid / 8, m = tid % 8, t = next + i;
        if (i >= KERN_ENC_MERGE_WIN || t >= T)
            return;
        for (uint32_t k = 0; k < (rawv ? 2u : 1u); k++) {
            const uint8_t *raw = k ? rawv : rawk;
            float pd = 0.0f, pn = 0.0f;
            for (uint32_t c = m; c < lay->head_dim; c += 8) {
                const float x = kern_enc_value(lay, raw, t, h, c);
                const float y = kern_enc_value(lay, raw, run, h, c);
                const float d = KERN_SUB(x, y);
                pd = KERN_ADD(pd, KERN_MUL(d, d));
                pn = KERN_ADD(pn, KERN_MUL(y, y));
            }
            part[(4 * i + 2 * k) * 8 + m] = pd;
            part[(4 * i + 2 * k + 1) * 8 + m] = pn;
        }
        return;
    }
    /* decide */
    const uint32_t n = T - next < KERN_ENC_MERGE_WIN ? T - next : KERN_ENC_MERGE_WIN;
    for (uint32_t i = 0; i < n; i++) {
        const float *p = part + 32 * i;
        const int join = kern_sum8_fold(p) <= KERN_MUL(lim, kern_sum8_fold(p + 8)) &&
                         (!rawv || kern_sum8_fold(p + 16) <= KERN_MUL(lim, kern_sum8_fold(p + 24)));
        if (!join) {
            const uint32_t t = next + i;
            sm->mst[0] = t;
            sm->mst[1] = t + 1;
            sm->nrows++;
            sm->map[t >> 5] |= 1u << (t & 31);
            return;
        }
    }
    sm->mst[1] = next + n;
}

KERN_HD void kern_enc_merge_phase2(const struct kern_enc_args *a, const struct kern_enc_sect *s,
                                   uint32_t h, const uint8_t *own, uint8_t *dst,
                                   const struct kern_enc_smem *sm, uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t T = lay->tokens, D = lay->head_dim;
    uint8_t *head = dst + s->offset + (uint64_t)h * kern_merge_head_bytes(D, T);
    uint8_t *row0 = head + 16 + kern_merge_map_bytes(T);
    if (tid == 0)
        memcpy(head, &sm->nrows, 4);
    for (uint32_t i = tid; i < (T + 31) / 32; i += nt)
        memcpy(head + 16 + 4 * i, &sm->map[i], 4);
    /* 32-bit indices: rows * D <= KERN_MAX_TOKENS / 2 * KERN_MAX_HEAD_DIM */
    for (uint32_t i = tid; i < sm->nrows * D; i += nt) {
        const uint32_t r = i / D, c = i % D;
        const uint32_t t0 = sm->u.starts[r], t1 = sm->u.starts[r + 1];
        float sum = 0.0f;
        uint32_t t = t0;
        for (; t + 8 <= t1; t += 8) { /* 8 loads in flight, then the sum in token order */
            float x[8];
            KERN_UNROLL
            for (uint32_t j = 0; j < 8; j++)
                x[j] = kern_enc_value(lay, own, t + j, h, c);
            KERN_UNROLL
            for (uint32_t j = 0; j < 8; j++)
                sum = KERN_ADD(sum, x[j]);
        }
        for (; t < t1; t++)
            sum = KERN_ADD(sum, kern_enc_value(lay, own, t, h, c));
        kern_store(row0 + 2ull * r * D, lay->dtype, c, KERN_DIV(sum, (float)(t1 - t0)));
    }
}

/* ---- LOWRANK key units: one head ------------------------------------------------------------ */

/* LOWRANK's first phases: the head's bytes cleared and, where it fits beside the Gram matrix,
 * the head's keys staged in shared memory as floats, rows of D + 1 (the Gram phase's threads
 * read rows j, j + 1, .. at one channel: a stride of D + 1 floats falls in different banks);
 * then the Gram matrix, a thread per entry, from the staged keys or from global memory. */
KERN_HD uint32_t kern_enc_lr_staged(const struct kern_layout *lay)
{
    const uint32_t T = lay->tokens, D = lay->head_dim, n = T <= D ? T : D;
    return (uint64_t)T * (D + 1) <= 2ull * KERN_LOWRANK_MAX_N * KERN_LOWRANK_MAX_N - n * n;
}

/* The factors' keys: staged again after the search, past the vectors in columns (n x n
 * floats from gram + n^2), where they fit. The search overwrites the first staging. */
KERN_HD uint32_t kern_enc_lr_fstaged(const struct kern_layout *lay)
{
    const uint32_t T = lay->tokens, D = lay->head_dim, n = T <= D ? T : D;
    return n >= 2 &&
           (uint64_t)T * (D + 1) <= 2ull * KERN_LOWRANK_MAX_N * KERN_LOWRANK_MAX_N - 2ull * n * n;
}

/* The head's keys into k, rows of D + 1 floats. */
KERN_HD void kern_enc_lr_keys(const struct kern_enc_args *a, uint32_t h, const uint8_t *raw,
                              float *k, uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t T = lay->tokens, D = lay->head_dim;
    if ((D & 7) == 0) {
        for (uint32_t q = tid; q < T * D / 8; q += nt) {
            const uint32_t t = q / (D / 8), d0 = q % (D / 8) * 8;
            float x[8];
            kern_enc_load8(a, raw, t, h, d0, x);
            for (uint32_t j = 0; j < 8; j++)
                k[t * (D + 1) + d0 + j] = x[j];
        }
        return;
    }
    for (uint32_t q = tid; q < T * D; q += nt)
        k[q / D * (D + 1) + q % D] = kern_enc_value(lay, raw, q / D, h, q % D);
}

KERN_HD void kern_enc_lr_stage(const struct kern_enc_args *a, const struct kern_enc_sect *s,
                               uint32_t h, const uint8_t *raw, uint8_t *dst,
                               struct kern_enc_smem *sm, uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t T = lay->tokens, D = lay->head_dim, n = T <= D ? T : D;
    const uint64_t hb = kern_lowrank_head_bytes(D, T);
    uint8_t *head = dst + s->offset + (uint64_t)h * hb;
    for (uint64_t i = tid; i < hb; i += nt)
        head[i] = 0;
    if (kern_enc_lr_staged(lay))
        kern_enc_lr_keys(a, h, raw, sm->u.gram + n * n, tid, nt);
}

/* Key (i, c) of the Gram sums: K[i][c] (T <= D: rows are tokens) or K[c][i]; from the staged
 * keys k (rows of D + 1) or, with k NULL, from global memory. */
KERN_HD float kern_enc_lr_key(const struct kern_layout *lay, const uint8_t *raw, const float *k,
                              uint32_t h, uint32_t i, uint32_t c)
{
    const uint32_t T = lay->tokens, D = lay->head_dim, t = T <= D ? i : c, d = T <= D ? c : i;
    return k ? k[t * (D + 1) + d] : kern_enc_value(lay, raw, t, h, d);
}

KERN_ENC_CALLED void kern_enc_lr_phase1(const struct kern_enc_args *a, uint32_t h,
                                        const uint8_t *raw, struct kern_enc_smem *sm, uint32_t tid,
                                        uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t T = lay->tokens, D = lay->head_dim, n = T <= D ? T : D, m = T <= D ? D : T;
    const float *k = kern_enc_lr_staged(lay) ? sm->u.gram + n * n : NULL;
    for (uint32_t e = tid; e < n * n; e += nt) {
        const uint32_t i = e / n, j = e % n;
        float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        uint32_t c0 = 0;
        /* eight channels a step, p[c & 7] by a constant index: registers, not a stack array */
        for (; c0 + 8 <= m; c0 += 8) {
            KERN_UNROLL
            for (uint32_t j8 = 0; j8 < 8; j8++)
                p[j8] = KERN_ADD(p[j8], KERN_MUL(kern_enc_lr_key(lay, raw, k, h, i, c0 + j8),
                                                 kern_enc_lr_key(lay, raw, k, h, j, c0 + j8)));
        }
        KERN_UNROLL
        for (uint32_t j8 = 0; j8 < 8; j8++)
            if (c0 + j8 < m)
                p[j8] = KERN_ADD(p[j8], KERN_MUL(kern_enc_lr_key(lay, raw, k, h, i, c0 + j8),
                                                 kern_enc_lr_key(lay, raw, k, h, j, c0 + j8)));
        sm->u.gram[e] = kern_sum8_fold(p);
    }
}

/* LOWRANK's search (kern_lowrank_eig, subspace iteration) across the thread block, phase by
 * phase, each value computed by the reference's expression in the reference's order:
 *  - start: the trace (thread 0, in order) and the c largest diagonal entries, each thread i
 *    placing entry i at its rank (value first, ties lower index first: a strict order on
 *    finite values, so the selection sort's first c places), then Z = those columns;
 *  - Z = g V: a thread per (column, element), each sum over j in order;
 *  - orth (modified Gram-Schmidt, twice): the sums are kern_sum8's, eight partial sums over
 *    the elements k = m mod 8. Thread m < 8 owns those elements of every column, so a column
 *    needs no other thread's elements, only the eight partials: a step per projection, in
 *    which the 8 threads fold the partials of the last step by shuffles (in kern_sum8_fold's
 *    order, the reference's dot), and thread m subtracts its elements' projection and
 *    computes its partial of the next dot. The column being made is in the threads'
 *    registers, stored into V when it is scaled. A column e takes 2e + 1 steps (the first
 *    also loads Z's column and finishes the column before it), c^2 + 1 for the c columns.
 *    The 8 threads are a warp: a Gram-Schmidt is one phase of the block (kern_enc_lr_orth_all);
 *  - pick: each energy v . Z (a thread per column), the vectors copied aside, then moved into
 *    columns (a thread per element) while thread 0 orders the c energies and takes the rank.
 * n < 2 (one token or one channel) is kern_lowrank_eig's 1 x 1 case, by thread 0. */
KERN_HD uint32_t kern_enc_lr_cols(const struct kern_layout *lay)
{
    const uint32_t T = lay->tokens, D = lay->head_dim, n = T <= D ? T : D;
    const uint32_t cap = kern_lowrank_cap(D, T);
    return cap < n ? cap : n;
}

KERN_HD uint32_t kern_enc_lr_phases(const struct kern_layout *lay)
{
    const uint32_t T = lay->tokens, D = lay->head_dim, n = T <= D ? T : D;
    if (n < 2)
        return 4; /* stage, Gram, the 1 x 1 search, factors */
    /* stage, Gram, start x2, orth, (gv, orth) x3, gv, pick x2, factors */
    return 4 + 1 + KERN_LOWRANK_ITERS * 2 + 4;
}

/* The 1 x 1 search by thread 0 (n < 2). */
KERN_HD void kern_enc_lr_eig1(const struct kern_enc_args *a, const struct kern_enc_sect *s,
                              uint32_t h, uint8_t *dst, struct kern_enc_smem *sm, uint32_t tid)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t T = lay->tokens, D = lay->head_dim, n = T <= D ? T : D;
    if (tid != 0)
        return;
    float *g = sm->u.gram, *v = sm->u.gram + n * n;
    uint8_t *head = dst + s->offset + (uint64_t)h * kern_lowrank_head_bytes(D, T);
    sm->nrows = kern_lowrank_eig(g, v, n, kern_lowrank_cap(D, T),
                                 kern_lowrank_keep(a->rec.lowrank_energy), sm->ord);
    memcpy(head, &sm->nrows, 4);
    for (uint32_t i = 0; i < sm->nrows; i++) {
        float e = g[sm->ord[i] * n + sm->ord[i]];
        sm->red[i] = sqrtf(e > 0.0f ? e : 0.0f);
        memcpy(head + 16 + 4 * i, &sm->red[i], 4);
    }
}

/* A lane of a Gram-Schmidt (thread m < 8 of warp 0): the column's elements k = m + 8 i in
 * registers, this lane's partial sums of the dots to come (kern_sum8's partial m), and their
 * sums over the 8 lanes. */
struct kern_enc_lr_lane {
    float x[KERN_LOWRANK_MAX_N / 8];
    float pd, pn,
        pn0; /* partials: the next projection's dot; |v|^2 after the projections, before */
    float fd, fn, fn0; /* their sums over the lanes: kern_sum8_fold of the 8 partials */
};

/* Lane m's partial (elements k = m mod 8, in order) of y . v, y in shared memory (or, NULL,
 * v itself), v the lane's registers. */
KERN_HD float kern_enc_lr_part(const float *y, const float *x, uint32_t n, uint32_t m)
{
    float p = 0.0f;
    KERN_UNROLL
    for (uint32_t i = 0; i < KERN_LOWRANK_MAX_N / 8; i++)
        if (m + 8 * i < n)
            p = KERN_ADD(p, KERN_MUL(y ? y[m + 8 * i] : x[i], x[i]));
    return p;
}

/* Step (e, st) of lane m: column e's projection st - 1 (on V_j, j = (st - 1) mod e), with the
 * dot L->fd the step's fold gave; st = 0 loads column e from Z, after column e - 1 is scaled by
 * its norm (L->fn, L->fn0) and stored. Each lane reads and writes only its own elements of V
 * and Z, so lanes meet only in the folds. */
KERN_HD void kern_enc_lr_orth_step(struct kern_enc_smem *sm, uint32_t n, uint32_t c, uint32_t e,
                                   uint32_t st, uint32_t m, struct kern_enc_lr_lane *L)
{
    float *V = sm->u.gram + n * n, *Z = V + c * n;
    if (st == 0) {
        if (e > 0) { /* column e - 1's norm and scale */
            const float inv =
                L->fn > KERN_MUL(1e-12f, L->fn0) ? KERN_DIV(1.0f, sqrtf(L->fn)) : 0.0f;
            KERN_UNROLL
            for (uint32_t i = 0; i < KERN_LOWRANK_MAX_N / 8; i++)
                if (m + 8 * i < n)
                    V[(e - 1) * n + m + 8 * i] = KERN_MUL(L->x[i], inv);
        }
        if (e == c)
            return;
        KERN_UNROLL
        for (uint32_t i = 0; i < KERN_LOWRANK_MAX_N / 8; i++)
            if (m + 8 * i < n)
                L->x[i] = Z[e * n + m + 8 * i];
        L->pn0 = kern_enc_lr_part(NULL, L->x, n, m);
        if (e == 0)
            L->pn = L->pn0; /* no projections: the norm after is the norm before */
        else
            L->pd = kern_enc_lr_part(V, L->x, n, m); /* the first projection's, on V_0 */
        return;
    }
    const float *vj = V + ((st - 1) % e) * n;
    KERN_UNROLL
    for (uint32_t i = 0; i < KERN_LOWRANK_MAX_N / 8; i++)
        if (m + 8 * i < n)
            L->x[i] = KERN_SUB(L->x[i], KERN_MUL(L->fd, vj[m + 8 * i]));
    if (st < 2 * e)
        L->pd = kern_enc_lr_part(V + (st % e) * n, L->x, n, m);
    else
        L->pn = kern_enc_lr_part(NULL, L->x, n, m);
}

#ifdef __CUDA_ARCH__
/* The sum of the 8 lanes' p, as kern_sum8_fold adds them: lane m adds lane m ^ 1's, then
 * m ^ 2's, then m ^ 4's. Lane 0 adds ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)); the
 * others the same sums with operands swapped, which IEEE addition gives bit for bit. */
static __device__ float kern_enc_lr_fold(float p)
{
    p = KERN_ADD(p, __shfl_xor_sync(0xffu, p, 1, 8));
    p = KERN_ADD(p, __shfl_xor_sync(0xffu, p, 2, 8));
    return KERN_ADD(p, __shfl_xor_sync(0xffu, p, 4, 8));
}
#else
/* The emulation of the warp's fold: each round, every lane adds the value lane m ^ r had
 * when the round began (a shuffle reads the other lane's register as it was). */
static inline void kern_enc_lr_fold8(const struct kern_enc_lr_lane *L, size_t in, size_t out)
{
    float v[8], w[8];
    for (uint32_t m = 0; m < 8; m++)
        memcpy(&v[m], (const char *)&L[m] + in, sizeof(float));
    for (uint32_t r = 1; r < 8; r <<= 1) {
        for (uint32_t m = 0; m < 8; m++)
            w[m] = KERN_ADD(v[m], v[m ^ r]);
        memcpy(v, w, sizeof(v));
    }
    for (uint32_t m = 0; m < 8; m++)
        memcpy((char *)&L[m] + out, &v[m], sizeof(float));
}
#endif

/* A whole Gram-Schmidt, one phase of the block: its c^2 + 1 steps by threads 0..7, which are
 * one warp. A step first folds the partials the last step left (the dot, or at a column's
 * start its norms) by shuffles, then each lane does its part. Lanes share no shared memory in
 * it (kern_enc_lr_orth_step), so no barrier between steps: the shuffles order them. The
 * emulation runs each step's fold over the 8 lanes' values, then every lane's step, as the
 * warp does. */
KERN_ENC_CALLED void kern_enc_lr_orth_all(struct kern_enc_smem *sm, uint32_t n, uint32_t c,
                                          uint32_t tid)
{
    uint32_t e = 0, st = 0;
#ifdef __CUDA_ARCH__
    struct kern_enc_lr_lane L;
    if (tid >= 8)
        return;
    memset(&L, 0, sizeof(L));
    for (uint32_t q = 0; q <= c * c; q++) {
        if (st == 0 && e > 0) {
            L.fn = kern_enc_lr_fold(L.pn);
            L.fn0 = kern_enc_lr_fold(L.pn0);
        } else if (st > 0) {
            L.fd = kern_enc_lr_fold(L.pd);
        }
        kern_enc_lr_orth_step(sm, n, c, e, st, tid, &L);
        if (++st == 2 * e + 1) {
            e++;
            st = 0;
        }
    }
#else
    struct kern_enc_lr_lane L[8];
    if (tid != 0)
        return;
    memset(L, 0, sizeof(L));
    for (uint32_t q = 0; q <= c * c; q++) {
        if (st == 0 && e > 0) {
            kern_enc_lr_fold8(L, offsetof(struct kern_enc_lr_lane, pn),
                              offsetof(struct kern_enc_lr_lane, fn));
            kern_enc_lr_fold8(L, offsetof(struct kern_enc_lr_lane, pn0),
                              offsetof(struct kern_enc_lr_lane, fn0));
        } else if (st > 0) {
            kern_enc_lr_fold8(L, offsetof(struct kern_enc_lr_lane, pd),
                              offsetof(struct kern_enc_lr_lane, fd));
        }
        for (uint32_t m = 0; m < 8; m++)
            kern_enc_lr_orth_step(sm, n, c, e, st, m, &L[m]);
        if (++st == 2 * e + 1) {
            e++;
            st = 0;
        }
    }
#endif
}

KERN_HD void kern_enc_lr_search(const struct kern_enc_args *a, const struct kern_enc_sect *s,
                                uint32_t h, const uint8_t *raw, uint8_t *dst,
                                struct kern_enc_smem *sm, uint32_t ph, uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t T = lay->tokens, D = lay->head_dim, n = T <= D ? T : D;
    const uint32_t c = kern_enc_lr_cols(lay);
    float *g = sm->u.gram, *V = g + n * n, *Z = V + c * n;
    if (ph == 1) { /* start: the trace, the c largest diagonal entries in order */
        if (tid == 0) {
            float total = 0.0f;
            for (uint32_t i = 0; i < n; i++) {
                const float e = g[i * n + i];
                total = KERN_ADD(total, e > 0.0f ? e : 0.0f);
            }
            sm->lr[48] = total;
        }
        for (uint32_t i = tid; i < n; i += nt) {
            const float x = g[i * n + i];
            uint32_t r = 0;
            for (uint32_t j = 0; j < n; j++) {
                const float y = g[j * n + j];
                r += y > x || (y == x && j < i);
            }
            if (r < c)
                sm->ord[r] = i;
        }
        return;
    }
    if (ph == 2) {
        for (uint32_t q = tid; q < c * n; q += nt)
            Z[q] = g[sm->ord[q / n] * n + q % n];
        return;
    }
    if (ph == 3 || (ph > 3 && ph < 4 + 2 * KERN_LOWRANK_ITERS && ph % 2 == 1)) {
        kern_enc_lr_orth_all(sm, n, c, tid);
        return;
    }
    if (ph < 5 + 2 * KERN_LOWRANK_ITERS) { /* phases 4, 6, 8, 10: Z = g V */
        for (uint32_t r = tid; r < c * n; r += nt) {
            const uint32_t e = r / n, i = r % n;
            float acc = 0.0f;
            for (uint32_t j = 0; j < n; j++)
                acc = KERN_ADD(acc, KERN_MUL(g[j * n + i], V[e * n + j]));
            Z[r] = acc;
        }
        return;
    }
    const uint32_t q = ph - (5 + 2 * KERN_LOWRANK_ITERS);
    float *lam = sm->lr + 64, *vc = g;
    if (q == 0) { /* the energies; the vectors aside */
        for (uint32_t e = tid; e < c; e += nt) {
            const float l = kern_lowrank_dot(V + e * n, Z + e * n, n);
            lam[e] = l > 0.0f ? l : 0.0f;
        }
        for (uint32_t k = tid; k < c * n; k += nt)
            vc[k] = V[k];
        return;
    }
    /* q == 1: the vectors into columns; thread 0 orders the energies and takes the rank; the
     * keys staged again for the factors, past the columns (kern_enc_lr_fstaged) */
    for (uint32_t r = tid; r < c * n; r += nt)
        V[(r % n) * n + r / n] = vc[r];
    if (kern_enc_lr_fstaged(lay))
        kern_enc_lr_keys(a, h, raw, g + 2 * n * n, tid, nt);
    if (tid != 0)
        return;
    uint32_t *ord = sm->ord, rank = c;
    for (uint32_t e = 0; e < c; e++)
        ord[e] = e;
    for (uint32_t i = 0; i < c; i++) {
        uint32_t best = i;
        for (uint32_t j = i + 1; j < c; j++) {
            float x = lam[ord[j]], y = lam[ord[best]];
            if (x > y || (x == y && ord[j] < ord[best]))
                best = j;
        }
        const uint32_t tmp = ord[i];
        ord[i] = ord[best];
        ord[best] = tmp;
    }
    const float total = sm->lr[48];
    if (!(total > 0.0f)) {
        rank = 0;
    } else {
        const float want = KERN_MUL(kern_lowrank_keep(a->rec.lowrank_energy), total);
        float cum = 0.0f;
        for (uint32_t r = 0; r < c; r++) {
            cum = KERN_ADD(cum, lam[ord[r]]);
            if (cum >= want) {
                rank = r + 1;
                break;
            }
        }
    }
    uint8_t *head = dst + s->offset + (uint64_t)h * kern_lowrank_head_bytes(D, T);
    sm->nrows = rank;
    memcpy(head, &sm->nrows, 4);
    for (uint32_t i = 0; i < rank; i++) {
        const float e = lam[ord[i]];
        sm->red[i] = sqrtf(e > 0.0f ? e : 0.0f);
        memcpy(head + 16 + 4 * i, &sm->red[i], 4);
    }
}

/* Key (t, d) for the factors: from the keys staged again (kern_enc_lr_fstaged; rows of D + 1)
 * or, with kx NULL, from global memory. */
KERN_HD float kern_enc_lr_fkey(const struct kern_layout *lay, const uint8_t *raw, const float *kx,
                               uint32_t h, uint32_t t, uint32_t d)
{
    return kx ? kx[t * (lay->head_dim + 1) + d] : kern_enc_value(lay, raw, t, h, d);
}

KERN_ENC_CALLED void kern_enc_lr_phase3(const struct kern_enc_args *a,
                                        const struct kern_enc_sect *s, uint32_t h,
                                        const uint8_t *raw, uint8_t *dst,
                                        const struct kern_enc_smem *sm, uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t T = lay->tokens, D = lay->head_dim, n = T <= D ? T : D;
    const uint32_t cap = kern_lowrank_cap(D, T);
    const float *v = sm->u.gram + n * n;
    const float *kx = kern_enc_lr_fstaged(lay) ? sm->u.gram + 2 * n * n : NULL;
    uint8_t *head = dst + s->offset + (uint64_t)h * kern_lowrank_head_bytes(D, T);
    uint8_t *uo = head + 16 + 4 * cap, *wo = uo + 2ull * T * cap;
    for (uint64_t q = tid; q < (uint64_t)sm->nrows * (T + D); q += nt) {
        const uint32_t i = (uint32_t)(q / (T + D)), k = (uint32_t)(q % (T + D));
        const uint32_t e = sm->ord[i];
        const float sigma = sm->red[i];
        float val;
        if (k < T && T <= D) {
            val = v[k * n + e]; /* u = the eigenvector */
        } else if (k >= T && T > D) {
            val = v[(k - T) * n + e]; /* w = the eigenvector */
        } else if (k >= T) {          /* w[d] = sum_t u[t] x[t][d] / sigma */
            const uint32_t d = k - T;
            float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            uint32_t t0 = 0;
            /* eight terms a step, p[t & 7] by a constant index (registers), 8 loads in flight */
            for (; t0 + 8 <= T; t0 += 8) {
                KERN_UNROLL
                for (uint32_t j = 0; j < 8; j++)
                    p[j] = KERN_ADD(p[j], KERN_MUL(v[(t0 + j) * n + e],
                                                   kern_enc_lr_fkey(lay, raw, kx, h, t0 + j, d)));
            }
            KERN_UNROLL
            for (uint32_t j = 0; j < 8; j++)
                if (t0 + j < T)
                    p[j] = KERN_ADD(p[j], KERN_MUL(v[(t0 + j) * n + e],
                                                   kern_enc_lr_fkey(lay, raw, kx, h, t0 + j, d)));
            val = sigma > 0.0f ? KERN_DIV(kern_sum8_fold(p), sigma) : 0.0f;
        } else { /* u[t] = sum_d x[t][d] w[d] / sigma */
            float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            uint32_t d0 = 0;
            for (; d0 + 8 <= D; d0 += 8) {
                KERN_UNROLL
                for (uint32_t j = 0; j < 8; j++)
                    p[j] = KERN_ADD(p[j], KERN_MUL(kern_enc_lr_fkey(lay, raw, kx, h, k, d0 + j),
                                                   v[(d0 + j) * n + e]));
            }
            KERN_UNROLL
            for (uint32_t j = 0; j < 8; j++)
                if (d0 + j < D)
                    p[j] = KERN_ADD(p[j], KERN_MUL(kern_enc_lr_fkey(lay, raw, kx, h, k, d0 + j),
                                                   v[(d0 + j) * n + e]));
            val = sigma > 0.0f ? KERN_DIV(kern_sum8_fold(p), sigma) : 0.0f;
        }
        if (k < T)
            kern_put_h(uo + 2 * ((uint64_t)k * cap + i), kern_sanitize(val));
        else
            kern_put_h(wo + 2 * ((uint64_t)i * D + (k - T)), kern_sanitize(val));
    }
}

/* ---- the header unit ------------------------------------------------------------------------ */

/* kern_hdr_build's bytes, the work spread: thread i writes section i's table entry (its
 * offset, size and codec, which kern_enc_args_fill worked out by kern_hdr_build's own
 * recurrence) and zeroes its padding; thread 0 the header and the table's padding. One thread
 * walking the table took a few thousand dependent instructions for 64 sections, beside groups
 * of about a thousand a thread. */
KERN_HD void kern_enc_hdr(const struct kern_enc_args *a, uint8_t *dst, uint32_t tid, uint32_t nt)
{
    const struct kern_layout *lay = &a->lay;
    const uint32_t hb = kern_hdr_bytes(lay), tbl = (uint32_t)sizeof(struct kern_block_hdr);
    if (tid == 0) {
        const struct kern_enc_sect *last = &a->s[a->nsect - 1];
        struct kern_block_hdr h;
        memset(&h, 0, sizeof(h));
        h.magic = KERN_BLOCK_MAGIC;
        h.version = KERN_BLOCK_VERSION;
        h.dtype = (uint8_t)lay->dtype;
        h.kinds = (uint8_t)kern_kinds(lay);
        h.layers = lay->layers;
        h.heads = lay->heads;
        h.head_dim = lay->head_dim;
        h.tokens = lay->tokens;
        h.nsect = a->nsect;
        h.hdr_bytes = hb;
        h.total_bytes =
            (last->offset + (uint64_t)last->bytes + KERN_ALIGN - 1) & ~(uint64_t)(KERN_ALIGN - 1);
        memcpy(dst, &h, sizeof(h));
        for (uint32_t b = tbl + a->nsect * (uint32_t)sizeof(struct kern_block_sect); b < hb; b++)
            dst[b] = 0;
    }
    for (uint32_t i = tid; i < a->nsect; i += nt) {
        const struct kern_enc_sect *s = &a->s[i];
        struct kern_block_sect e;
        memset(&e, 0, sizeof(e));
        e.offset = s->offset;
        e.bytes = s->bytes;
        e.codec = (uint8_t)s->codec;
        memcpy(dst + tbl + i * sizeof(e), &e, sizeof(e));
        uint32_t end = (s->offset + s->bytes + KERN_ALIGN - 1) & ~(KERN_ALIGN - 1);
        for (uint32_t b = s->offset + s->bytes; b < end; b++)
            dst[b] = 0;
    }
}

/* Phase `phase` of MERGE unit `unit` (head) of section si. Called, not inlined: its
 * pointers to two sections and two slabs are not the kernel's other units' registers. */
KERN_ENC_CALLED void kern_enc_merge_unit(const struct kern_enc_args *a, uint32_t si, uint32_t unit,
                                         int phase, const uint8_t *src, uint8_t *dst,
                                         struct kern_enc_smem *sm, uint32_t tid, uint32_t nt)
{
    const uint32_t kinds = kern_kinds(&a->lay), l = si / kinds, k = si % kinds;
    const struct kern_enc_sect *s = &a->s[si];
    const uint8_t *rawk = src + 2 * kern_raw_index(&a->lay, l, 0, 0, 0);
    const uint8_t *rawv = kinds == 2 ? src + 2 * kern_raw_index(&a->lay, l, 1, 0, 0) : NULL;
    /* the layer's V section, where its units are this one's */
    const struct kern_enc_sect *sv =
        k == 0 && kinds == 2 && kern_enc_merge_kv(&a->rec, l, 1) ? &a->s[si + 1] : NULL;
    if ((uint32_t)phase + 1 < kern_enc_merge_phases(&a->lay)) {
        kern_enc_merge_plan(a, s, sv, unit, rawk, rawv, dst, sm, (uint32_t)phase, tid, nt);
        return;
    }
    kern_enc_merge_phase2(a, s, unit, k ? rawv : rawk, dst, sm, tid, nt);
    if (sv)
        kern_enc_merge_phase2(a, sv, unit, rawv, dst, sm, tid, nt);
}

/* ---- one unit, one phase ------------------------------------------------------------------- */

/* The phases of unit u: the same for every thread of its block (a function of the launch's
 * arguments alone), so the kernel's loop of phases and barriers is uniform. */
KERN_HD uint32_t kern_enc_phases(const struct kern_enc_args *a, uint32_t u)
{
    if (u >= a->nunits)
        return 1;
    const uint32_t si = kern_enc_sect_of(a, u), kinds = kern_kinds(&a->lay);
    const uint32_t codec = kern_codec_as(a->s[si].codec, si % kinds == 1);
    if (kern_rot_bits(codec))
        return kern_enc_rot_phases(&a->lay);
    if (codec == KERN_CODEC_LOWRANK)
        return kern_enc_lr_phases(&a->lay);
    if (codec == KERN_CODEC_FP8)
        return 4; /* amax, two folds, codes */
    if (codec == KERN_CODEC_RAW)
        return 1;
    if (codec == KERN_CODEC_MERGE)
        return kern_enc_merge_phases(&a->lay);
    if (kern_codec_bits(codec) && si % kinds == 0)
        return 3; /* KIVI keys: slices, channels, codes */
    return 2;     /* token-major */
}

/* Phase `phase` (0..kern_enc_phases(a, u) - 1) of unit u for thread tid of nt: what the kernel runs
 * between two barriers. src is the raw block, dst the encoded one. */
KERN_HD void kern_enc_unit(const struct kern_enc_args *a, uint32_t u, int phase, const uint8_t *src,
                           uint8_t *dst, struct kern_enc_smem *sm, uint32_t tid, uint32_t nt)
{
    if (u >= a->nunits) {
        if (phase == 0)
            kern_enc_hdr(a, dst, tid, nt);
        return;
    }
    const uint32_t si = kern_enc_sect_of(a, u), kinds = kern_kinds(&a->lay);
    const struct kern_enc_sect *s0 = &a->s[si];
    const uint32_t unit = u - s0->unit0, l = si / kinds, k = si % kinds;
    const uint8_t *raw = src + 2 * kern_raw_index(&a->lay, l, k, 0, 0);
    /* the plain codec a ROT or LOWRANK value section is */
    struct kern_enc_sect sv = *s0;
    sv.codec = kern_codec_as(s0->codec, k == 1);
    const struct kern_enc_sect *s = &sv;
    if (kern_rot_bits(s->codec)) {
        if (phase == 0)
            kern_enc_rot_phase1(a, s, unit, l, raw, dst, sm, tid, nt);
        else
            kern_enc_rot_round(a, s, unit, l, raw, dst, sm, (uint32_t)phase - 1, tid, nt);
    } else if (s->codec == KERN_CODEC_MERGE) {
        kern_enc_merge_unit(a, si, unit, phase, src, dst, sm, tid, nt);
    } else if (s->codec == KERN_CODEC_LOWRANK) {
        const uint32_t last = kern_enc_lr_phases(&a->lay) - 1, n1 = last == 3;
        if (phase == 0)
            kern_enc_lr_stage(a, s, unit, raw, dst, sm, tid, nt);
        else if (phase == 1)
            kern_enc_lr_phase1(a, unit, raw, sm, tid, nt);
        else if ((uint32_t)phase == last)
            kern_enc_lr_phase3(a, s, unit, raw, dst, sm, tid, nt);
        else if (n1)
            kern_enc_lr_eig1(a, s, unit, dst, sm, tid);
        else
            kern_enc_lr_search(a, s, unit, raw, dst, sm, (uint32_t)phase - 1, tid, nt);
    } else if (s->codec == KERN_CODEC_RAW) {
        if (phase == 0)
            kern_enc_raw(s, unit, raw, dst, tid, nt);
    } else if (s->codec == KERN_CODEC_FP8) {
        if (phase == 0)
            kern_enc_fp8_phase1(a, unit, raw, sm, tid, nt);
        else if (phase <= 2)
            kern_enc_fp8_fold(s, unit, dst, sm, phase, tid);
        else
            kern_enc_fp8_phase3(a, s, unit, raw, dst, sm, tid, nt);
    } else if (kern_codec_bits(s->codec) && k == 0) {
        if (phase == 0)
            kern_enc_kk_phase0(a, s, unit, raw, dst, sm, tid, nt);
        else if (phase == 1)
            kern_enc_kk_phase1(a, s, unit, dst, sm, tid, nt);
        else
            kern_enc_kk_phase2(a, s, unit, raw, dst, sm, tid, nt);
    } else {
        if (phase == 0)
            kern_enc_tm_phase1(a, s, unit, raw, sm, tid, nt);
        else if (phase == 1)
            kern_enc_tm_phase2(a, s, unit, dst, sm, tid, nt);
    }
}

#endif
