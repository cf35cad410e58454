/*
 * kern_pack.cu — the CUDA twins of the batched moves (kern_batch.h): gather and scatter
 * between an engine's paged tensors and canonical blocks, decoding encoded blocks straight
 * into the engine's tensors, and batched device-to-device copies.
 *
 * DESIGN
 * One launch per batch, its tables by value in the kernel's parameters (a __grid_constant__
 * struct, so the kernel reads them in place; two sizes, 2 KiB for the usual call and 30 KiB
 * for large ones, because a launch copies its whole parameter block). A warp takes one step
 * (R consecutive rows of one block, layer and kind: kern_batch.h) at a time and walks the
 * steps grid-stride, in 32-bit indices, over a grid of at most 8 blocks of 256 threads per
 * multiprocessor (a persistent grid: the step count of a prefix is in the thousands). The
 * step functions are the ones the CPU emulation runs: a lane moves up to four 16-byte chunks
 * per step, loads before stores, so a warp has up to 2 KiB in flight, and its stores are one
 * coalesced run per head row (per token when the engine's heads are packed). Where the
 * engine's heads and tokens are packed (kern_pack_contiguous: vLLM's per-layer paged tensors)
 * the batch's steps are runs instead (kern_batch.h, "run steps"): up to 8 KiB of one page,
 * its address looked up once, each lane moving eight 16-byte chunks per round with all eight
 * loads before the stores, no per-chunk division or table lookup. A decode lane
 * produces 8 elements of a head row and stores them as one 16-byte access; lane 0 reads the
 * block's header and section once per step and shuffles them to the warp.
 *
 * The batched device-to-device copy (pool hits into one contiguous destination) merges
 * pieces that continue each other, then gives each piece a row of thread blocks
 * (blockIdx.y) whose threads stride over its 16-byte chunks four at a time; one piece left
 * after merging is a cudaMemcpyAsync, which is what the caller compares against anyway.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern_batch.h"
#include "kernels/kern_pack.h"

#define KERN_BATCH_THREADS 256
#define KERN_BATCH_BLOCKS_PER_SM 8
#define KERN_COPY_SMALL 64
#define KERN_DECODE_MINB 4

static int pack_fail(const char *what, cudaError_t e)
{
    fprintf(stderr, "kern_pack: %s failed (%s)\n", what, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return -EIO;
}

/* Multiprocessors of the calling thread's current device (asked once per device). */
static int pack_sms(void)
{
    static int sms[64];
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 80;
    }
    if (dev >= 0 && dev < 64 && sms[dev] > 0)
        return sms[dev];
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        n = 80;
    }
    if (dev >= 0 && dev < 64)
        sms[dev] = n;
    return n;
}

template <int W> struct batch_params {
    struct kern_batch h;
    uint64_t w[W];
};
/* CUDA's limit on a kernel's parameters (12.1 and later, Volta and later). */
static_assert(sizeof(batch_params<KERN_BATCH_WORDS>) <= 32764, "batch tables too large");
/* steps + warps of the largest grid stay within 32 bits */
static_assert(KERN_BATCH_MAX_STEPS <= 0xffffffffu - (1u << 24), "step count too large");

/* Gathers and scatters, and decodes: two kernels, so that each gets the registers of its own
 * work (one kernel holding both would run at the occupancy of the larger). A warp walks the
 * steps grid-stride, all its lanes on the same step (the step functions' shuffles need the
 * whole warp); the host keeps steps + warps within 32 bits. */
template <int W, int V, int RUN>
__global__ void __launch_bounds__(KERN_BATCH_THREADS, 4)
    kern_pack_kernel(const __grid_constant__ batch_params<W> p)
{
    const uint32_t lane = threadIdx.x & 31;
    const uint32_t nw = (gridDim.x * blockDim.x) >> 5;
    const uint32_t steps = p.h.steps;
    for (uint32_t s = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; s < steps; s += nw) {
        if (RUN && V == 16)
            kern_batch_run_step16(&p.h, p.w, s, lane, KERN_BATCH_LANES);
        else if (RUN && V == 8)
            kern_batch_run_step8(&p.h, p.w, s, lane, KERN_BATCH_LANES);
        else if (RUN && V == 4)
            kern_batch_run_step4(&p.h, p.w, s, lane, KERN_BATCH_LANES);
        else if (RUN && V == 2)
            kern_batch_run_step2(&p.h, p.w, s, lane, KERN_BATCH_LANES);
        else if (RUN)
            kern_batch_run_step1(&p.h, p.w, s, lane, KERN_BATCH_LANES);
        else if (V == 16)
            kern_batch_pack_step16(&p.h, p.w, s, lane, KERN_BATCH_LANES);
        else if (V == 8)
            kern_batch_pack_step8(&p.h, p.w, s, lane, KERN_BATCH_LANES);
        else if (V == 4)
            kern_batch_pack_step4(&p.h, p.w, s, lane, KERN_BATCH_LANES);
        else if (V == 2)
            kern_batch_pack_step2(&p.h, p.w, s, lane, KERN_BATCH_LANES);
        else
            kern_batch_pack_step1(&p.h, p.w, s, lane, KERN_BATCH_LANES);
    }
}

/* The decode kernel, at KERN_DECODE_MINB resident blocks of 256 threads per multiprocessor
 * (64 registers: the generic rounds of kern_batch.h spill a little there). Measured on the
 * H200 against 3 and 2 blocks (80 and 96 registers, less or no spill): a 32-block q8_0
 * prefix into paged tensors at 0.49, 0.41 and 0.31 of a D2D copy (docs/design/gpu.md).
 * KIVIK: the column rounds it has (KERN_BATCH_COLS_*, struct kern_batch's kivik): built with
 * none, with the KIVI key rounds, with the KIVI and ROT key rounds, and with the LOWRANK and
 * MERGE rounds, each rounds' registers kept from the kernels that do not need them (ptxas,
 * sm_90: 120, 136, 208 and 168 bytes of stack frame). */
template <int W, int KIVIK>
__global__ void __launch_bounds__(KERN_BATCH_THREADS, KERN_DECODE_MINB)
    kern_decode_kernel(const __grid_constant__ batch_params<W> p)
{
    const uint32_t lane = threadIdx.x & 31;
    const uint32_t nw = (gridDim.x * blockDim.x) >> 5;
    const uint32_t steps = p.h.steps;
    for (uint32_t s = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; s < steps; s += nw)
        kern_batch_decode_step(&p.h, p.w, s, lane, KIVIK);
}

/* A batch of the LOWRANK and MERGE hint: their kernel where the batch's tables fit the small
 * parameter block, kernel 0 (those sections by the generic rounds, the same bytes) for the
 * large one. Built for both, the fourth kernel's code took the device bundle past its 60 MiB
 * (each binary links it: 8.8 MB of kern_pack.cu.o against 6.9). */
template <int W>
static void decode_lrm_launch(const batch_params<W> &p, dim3 g, dim3 t, cudaStream_t s)
{
    if constexpr (W == KERN_BATCH_SMALL_WORDS)
        kern_decode_kernel<W, KERN_BATCH_COLS_LRM><<<g, t, 0, s>>>(p);
    else
        kern_decode_kernel<W, 0><<<g, t, 0, s>>>(p);
}

/* A gather or scatter in the batch's access width, its run steps or its row steps. */
template <int W, int RUN>
static void pack_launch(const batch_params<W> &p, dim3 g, dim3 t, cudaStream_t s)
{
    if (p.h.vec == 16)
        kern_pack_kernel<W, 16, RUN><<<g, t, 0, s>>>(p);
    else if (p.h.vec == 8)
        kern_pack_kernel<W, 8, RUN><<<g, t, 0, s>>>(p);
    else if (p.h.vec == 4)
        kern_pack_kernel<W, 4, RUN><<<g, t, 0, s>>>(p);
    else if (p.h.vec == 2)
        kern_pack_kernel<W, 2, RUN><<<g, t, 0, s>>>(p);
    else
        kern_pack_kernel<W, 1, RUN><<<g, t, 0, s>>>(p);
}

template <int W> static int batch_launch(const struct kern_batch_args *a, cudaStream_t s)
{
    static batch_params<W> p; /* 30 KiB: not on the caller's stack; filled under the lock */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    const uint64_t steps = a->h.steps;
    if (steps == 0)
        return 0;
    uint64_t grid = (steps + KERN_BATCH_THREADS / 32 - 1) / (KERN_BATCH_THREADS / 32);
    uint64_t cap = (uint64_t)pack_sms() * KERN_BATCH_BLOCKS_PER_SM;
    if (grid > cap)
        grid = cap;
    pthread_mutex_lock(&mu);
    p.h = a->h;
    memcpy(p.w, a->w, (size_t)a->h.nwords * sizeof(uint64_t));
    const dim3 g((unsigned)grid), t(KERN_BATCH_THREADS);
    /* four decode kernels: the KIVI and ROT key rounds, the KIVI key rounds alone, the
     * LOWRANK and MERGE rounds, none */
    if (p.h.op == KERN_BATCH_DECODE && (p.h.kivik & KERN_BATCH_COLS_ROT))
        kern_decode_kernel<W, KERN_BATCH_COLS_KIVI | KERN_BATCH_COLS_ROT><<<g, t, 0, s>>>(p);
    else if (p.h.op == KERN_BATCH_DECODE && (p.h.kivik & KERN_BATCH_COLS_KIVI))
        kern_decode_kernel<W, KERN_BATCH_COLS_KIVI><<<g, t, 0, s>>>(p);
    else if (p.h.op == KERN_BATCH_DECODE && (p.h.kivik & KERN_BATCH_COLS_LRM))
        decode_lrm_launch<W>(p, g, t, s);
    else if (p.h.op == KERN_BATCH_DECODE)
        kern_decode_kernel<W, 0><<<g, t, 0, s>>>(p);
    else if (p.h.run)
        pack_launch<W, 1>(p, g, t, s);
    else
        pack_launch<W, 0>(p, g, t, s);
    cudaError_t e = cudaGetLastError();
    pthread_mutex_unlock(&mu);
    return e == cudaSuccess ? 0 : pack_fail("batch launch", e);
}

extern "C" int kern_batch_cuda(const struct kern_batch_args *a, void *stream)
{
    if (!a || a->h.nwords > KERN_BATCH_WORDS)
        return -EINVAL;
    if (a->h.nwords <= KERN_BATCH_SMALL_WORDS)
        return batch_launch<KERN_BATCH_SMALL_WORDS>(a, (cudaStream_t)stream);
    return batch_launch<KERN_BATCH_WORDS>(a, (cudaStream_t)stream);
}

static int batch_run_cuda(const struct kern_batch_args *a, void *stream)
{
    return kern_batch_cuda(a, stream);
}

extern "C" int kern_pack_cuda(const struct kern_pack_layout *lay,
                              const struct kern_pack_engine *eng, uint64_t first_token,
                              uint32_t nblocks, void *const *blocks, int dir, void *stream)
{
    if ((dir != KERN_PACK_GATHER && dir != KERN_PACK_SCATTER) || (nblocks && !blocks))
        return -EINVAL;
    struct kern_batch_args *a = (struct kern_batch_args *)malloc(sizeof(*a));
    if (!a)
        return -ENOMEM;
    int rc =
        kern_pack_batches(a, lay, eng, first_token, nblocks, blocks, dir, batch_run_cuda, stream);
    free(a);
    return rc;
}

extern "C" int kern_pack_decode_cuda(const struct kern_layout *klay, uint32_t layer_first,
                                     uint32_t layer_count, const struct kern_pack_engine *eng,
                                     uint64_t first_token, uint32_t nblocks, const void *const *src,
                                     const uint64_t *src_len, uint32_t out_dtype,
                                     uint32_t codecs, void *stream)
{
    struct kern_batch_args *a = (struct kern_batch_args *)malloc(sizeof(*a));
    if (!a)
        return -ENOMEM;
    int rc = kern_decode_check(klay, layer_first, layer_count, eng, first_token, nblocks, src,
                               src_len, out_dtype);
    if (rc == 0)
        rc = kern_decode_batches(a, klay, layer_first, layer_count, eng, first_token, nblocks, src,
                                 src_len, out_dtype, codecs, batch_run_cuda, stream);
    free(a);
    return rc;
}

/* ---- batched device-to-device copies ---------------------------------------------------- */

struct copy_piece {
    uint64_t dst, src, len;
};

template <int N> struct copy_params {
    uint32_t n;
    uint32_t vec;
    struct copy_piece p[N];
};
static_assert(sizeof(copy_params<KERN_COPY_BATCH_MAX>) <= 32764, "copy tables too large");

template <typename T, int N>
__global__ void __launch_bounds__(KERN_BATCH_THREADS)
    kern_copy_kernel(const __grid_constant__ copy_params<N> a)
{
    const struct copy_piece &pc = a.p[blockIdx.y];
    const uint64_t nch = pc.len / sizeof(T);
    const T *src = (const T *)(uintptr_t)pc.src;
    T *dst = (T *)(uintptr_t)pc.dst;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t c0 = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; c0 < nch;
         c0 += 4 * stride) {
        T v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (c0 + u * stride < nch)
                v[u] = src[c0 + u * stride];
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (c0 + u * stride < nch)
                dst[c0 + u * stride] = v[u];
    }
}

template <typename T, int N>
static void copy_launch(const copy_params<N> &a, uint64_t maxlen, cudaStream_t s)
{
    uint64_t per_block = (uint64_t)KERN_BATCH_THREADS * 4 * sizeof(T);
    uint64_t gx = (maxlen + per_block - 1) / per_block;
    uint64_t cap = ((uint64_t)pack_sms() * KERN_BATCH_BLOCKS_PER_SM + a.n - 1) / a.n;
    if (gx > cap)
        gx = cap;
    if (gx == 0)
        gx = 1;
    kern_copy_kernel<T, N><<<dim3((unsigned)gx, a.n), KERN_BATCH_THREADS, 0, s>>>(a);
}

template <int N> static int copy_run(const struct copy_piece *pc, uint32_t n, cudaStream_t s)
{
    static copy_params<N> a; /* large: not on the caller's stack; filled under the lock */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    uint64_t bits = 0, maxlen = 0;
    for (uint32_t i = 0; i < n; i++) {
        bits |= pc[i].dst | pc[i].src | pc[i].len;
        maxlen = pc[i].len > maxlen ? pc[i].len : maxlen;
    }
    pthread_mutex_lock(&mu);
    a.n = n;
    memcpy(a.p, pc, n * sizeof(*pc));
    if ((bits & 15) == 0)
        copy_launch<uint4, N>(a, maxlen, s);
    else if ((bits & 7) == 0)
        copy_launch<uint2, N>(a, maxlen, s);
    else if ((bits & 3) == 0)
        copy_launch<uint32_t, N>(a, maxlen, s);
    else
        copy_launch<uint8_t, N>(a, maxlen, s);
    cudaError_t e = cudaGetLastError();
    pthread_mutex_unlock(&mu);
    return e == cudaSuccess ? 0 : pack_fail("copy launch", e);
}

extern "C" int kern_copy_batch_cuda(void *const *dst, const void *const *src, const uint64_t *len,
                                    uint32_t n, void *stream)
{
    if (n > KERN_COPY_BATCH_MAX || (n && (!dst || !src || !len)))
        return -EINVAL;
    struct copy_piece *pc = (struct copy_piece *)malloc((n ? n : 1) * sizeof(*pc));
    uint32_t m = 0;
    int rc = 0;
    if (!pc)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        if (len[i] == 0)
            continue;
        uint64_t d = (uint64_t)(uintptr_t)dst[i], sr = (uint64_t)(uintptr_t)src[i];
        if (m && pc[m - 1].dst + pc[m - 1].len == d && pc[m - 1].src + pc[m - 1].len == sr) {
            pc[m - 1].len += len[i]; /* continues the piece before */
            continue;
        }
        pc[m++] = (struct copy_piece){d, sr, len[i]};
    }
    if (m == 1) {
        cudaError_t e =
            cudaMemcpyAsync((void *)(uintptr_t)pc[0].dst, (const void *)(uintptr_t)pc[0].src,
                            pc[0].len, cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
        rc = e == cudaSuccess ? 0 : pack_fail("cudaMemcpyAsync", e);
    } else if (m > 1 && m <= KERN_COPY_SMALL) {
        rc = copy_run<KERN_COPY_SMALL>(pc, m, (cudaStream_t)stream);
    } else if (m > 1) {
        rc = copy_run<KERN_COPY_BATCH_MAX>(pc, m, (cudaStream_t)stream);
    }
    free(pc);
    return rc;
}
