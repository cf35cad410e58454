/*
 * kern_cuda.cu — the CUDA twins of the block codecs, and the few runtime calls the tests and
 * benchmarks need.
 *
 * DESIGN
 * Encode: one launch per block, one thread block per unit of kern_encb.h (a run of 256
 * groups of a token-major section, 32 KiB of a raw one, a head of an fp8 one, a 32-token
 * group of one head of KIVI keys) plus one that writes the header and the sections' padding;
 * the section table travels by value in the launch. Threads run the reference's per-group
 * functions from kern_fmt.h (compiled for the device, the float operations pinned to single
 * roundings), read their 32 values with 16-byte loads and write a unit's output as one run of
 * 16-byte stores out of shared memory, so the GPU writes the reference's bytes at memory
 * speed. The key statistics, only when asked, are a second kernel (a thread block per layer
 * and head). Nothing is copied from host memory and nothing synchronises: the caller's
 * stream orders everything.
 * Decode: the batched decoder of kern_pack.cu (kern_batch.h), this block as a batch of one
 * whose engine is the raw block itself; it checks the device-resident header and section
 * table against the layout before it reads a section, and decodes a block that does not
 * match to zeros rather than read out of bounds.
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/kern.h"
#include "kernels/kern_batch.h"
#include "kernels/kern_encb.h"
#include "kernels/kern_fmt.h"
#include "kernels/kern_pack.h"

#define KERN_CUDA_THREADS 128

static int cuda_fail(const char *what, cudaError_t e)
{
    fprintf(stderr, "kern: %s failed (%s)\n", what, cudaGetErrorString(e));
    return -EIO;
}

__device__ static float dev_value(const uint8_t *raw, uint32_t dtype, uint64_t stride, uint32_t t,
                                  uint32_t d)
{
    return kern_sanitize(kern_load(raw, dtype, (uint64_t)t * stride + d));
}

/* Key statistics of one (layer, head) of the K kind: per channel min and max over the tokens
 * (a thread per channel), and the mean over tokens of the key's L2 norm. Only when asked. */
__global__ void kern_stats_kernel(struct kern_layout lay, const uint8_t *src,
                                  struct kern_key_stats st)
{
    __shared__ float red[KERN_CUDA_THREADS];
    const uint32_t H = lay.heads, D = lay.head_dim, T = lay.tokens;
    const uint32_t h = blockIdx.x % H, l = blockIdx.x / H;
    const uint32_t tid = threadIdx.x, nt = blockDim.x;
    const uint8_t *raw = src + 2 * kern_raw_index(&lay, l, 0, 0, h);
    const uint64_t stride = (uint64_t)H * D;
    float *kmin = st.kmin + ((uint64_t)l * H + h) * D, *kmax = st.kmax + ((uint64_t)l * H + h) * D;
    for (uint32_t c = tid; c < D; c += nt) {
        float mn = dev_value(raw, lay.dtype, stride, 0, c), mx = mn;
        for (uint32_t t = 1; t < T; t++) {
            float v = dev_value(raw, lay.dtype, stride, t, c);
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        kmin[c] = mn;
        kmax[c] = mx;
    }
    float part = 0.0f;
    for (uint32_t t = tid; t < T; t += nt) {
        float ss = 0.0f;
        for (uint32_t d = 0; d < D; d++) {
            float v = dev_value(raw, lay.dtype, stride, t, d);
            ss = KERN_ADD(ss, KERN_MUL(v, v));
        }
        part = KERN_ADD(part, sqrtf(ss));
    }
    red[tid] = part;
    __syncthreads();
    if (tid == 0) {
        float sum = 0.0f;
        for (uint32_t i = 0; i < nt; i++)
            sum = KERN_ADD(sum, red[i]);
        st.knorm[(uint64_t)l * H + h] = KERN_DIV(sum, (float)T);
    }
}

static_assert(sizeof(struct kern_enc_args) <= 32764, "encode tables too large");

/* One unit of kern_encb.h per thread block; its phases apart by barriers. */
__global__ void __launch_bounds__(KERN_ENC_THREADS, 4)
    kern_enc_kernel(const __grid_constant__ struct kern_enc_args a, const uint8_t *src,
                    uint8_t *dst)
{
    __shared__ struct kern_enc_smem sm;
    const int np = (int)kern_enc_phases(&a, blockIdx.x);
    for (int ph = 0; ph < np; ph++) {
        kern_enc_unit(&a, blockIdx.x, ph, src, dst, &sm, threadIdx.x, blockDim.x);
        __syncthreads();
    }
}

extern "C" int64_t kern_encode_cuda(const struct kern_layout *lay, const struct kern_recipe *rec,
                                    const void *src, void *dst, size_t dst_cap,
                                    const struct kern_key_stats *stats, void *stream)
{
    struct kern_key_stats st = {NULL, NULL, NULL};
    int64_t sz = kern_encoded_size(lay, rec);
    if (sz < 0)
        return sz;
    if (kern_rawh_count(lay, rec))
        return -ENOTSUP; /* no raw-head appendix on the device (kern.h) */
    if (stats && (stats->kmin || stats->kmax || stats->knorm)) {
        if (!stats->kmin || !stats->kmax || !stats->knorm)
            return -EINVAL;
        st = *stats;
    }
    if (!src || !dst)
        return -EINVAL;
    if ((uint64_t)sz > dst_cap)
        return -ENOSPC;
    cudaStream_t s = (cudaStream_t)stream;
    struct kern_enc_args *a = (struct kern_enc_args *)malloc(sizeof(*a));
    if (!a)
        return -ENOMEM;
    kern_enc_args_fill(a, lay, rec, src);
    kern_enc_kernel<<<a->nunits + 1, KERN_ENC_THREADS, 0, s>>>(*a, (const uint8_t *)src,
                                                                (uint8_t *)dst);
    free(a);
    if (st.kmin)
        kern_stats_kernel<<<lay->layers * lay->heads, KERN_CUDA_THREADS, 0, s>>>(
            *lay, (const uint8_t *)src, st);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return cuda_fail("encode launch", e);
    return sz;
}

extern "C" int64_t kern_decode_cuda(const struct kern_layout *lay, const void *src,
                                    size_t src_len, void *dst, size_t dst_cap,
                                    enum kern_dtype out_dtype, uint32_t codecs,
                                    void *stream)
{
    if (kern_layout_check(lay) < 0 || !src || !dst ||
        (out_dtype != KERN_DTYPE_FP16 && out_dtype != KERN_DTYPE_BF16))
        return -EINVAL;
    uint64_t rs = kern_raw_size(lay);
    if (rs > dst_cap)
        return -ENOSPC;
    struct kern_batch_args *a = (struct kern_batch_args *)malloc(sizeof(*a));
    if (!a)
        return -ENOMEM;
    const void *srcs[1] = {src};
    const uint64_t lens[1] = {src_len};
    int rc = kern_batch_decode_raw(a, lay, dst, NULL, 1, srcs, lens, out_dtype);
    /* one block: the ROT key rounds ran slower than the generic rounds here on the H200 (rot2
     * 219 against 253 GB/s), where a prefix into paged tensors gained by them (476 -> 532):
     * a ROT block takes the kernel of the KIVI rounds alone, as before them */
    a->h.kivik = kern_decode_cols(codecs) & ~KERN_BATCH_COLS_ROT;
    if (rc == 0)
        rc = kern_batch_cuda(a, stream);
    free(a);
    return rc ? rc : (int64_t)rs;
}

extern "C" int kern_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: a normal host, not an error */
        return 0;
    }
    return n;
}

extern "C" int kern_cuda_alloc(void **dptr, size_t bytes)
{
    cudaError_t e = cudaMalloc(dptr, bytes);
    if (e != cudaSuccess) {
        *dptr = NULL;
        return cuda_fail("cudaMalloc", e);
    }
    return 0;
}

extern "C" void kern_cuda_free(void *dptr)
{
    if (dptr)
        cudaFree(dptr);
}

extern "C" int kern_cuda_copy(void *dst, const void *src, size_t bytes, int kind, void *stream)
{
    cudaMemcpyKind k = kind == KERN_CUDA_H2D   ? cudaMemcpyHostToDevice
                       : kind == KERN_CUDA_D2H ? cudaMemcpyDeviceToHost
                                               : cudaMemcpyDeviceToDevice;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, k, (cudaStream_t)stream);
    return e == cudaSuccess ? 0 : cuda_fail("cudaMemcpyAsync", e);
}

extern "C" int kern_cuda_stream_sync(void *stream)
{
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    return e == cudaSuccess ? 0 : cuda_fail("cudaStreamSynchronize", e);
}

extern "C" double kern_cuda_time_ms(void (*fn)(void *arg), void *arg, int iters)
{
    cudaEvent_t a = NULL, b = NULL;
    float ms = 0.0f;
    double ret = -EIO;
    cudaError_t e = cudaEventCreate(&a);
    if (e == cudaSuccess)
        e = cudaEventCreate(&b);
    if (e == cudaSuccess)
        e = cudaEventRecord(a, 0);
    for (int i = 0; e == cudaSuccess && i < iters; i++)
        fn(arg);
    if (e == cudaSuccess)
        e = cudaEventRecord(b, 0);
    if (e == cudaSuccess)
        e = cudaEventSynchronize(b);
    if (e == cudaSuccess)
        e = cudaEventElapsedTime(&ms, a, b);
    if (e == cudaSuccess)
        ret = ms;
    else
        cuda_fail("event timing", e);
    if (a)
        cudaEventDestroy(a);
    if (b)
        cudaEventDestroy(b);
    return ret;
}
