/*
 * kern_cuda.cu — the CUDA twins of the block codecs, and the few runtime calls the tests and
 * benchmarks need.
 *
 * DESIGN
 * One thread block per (layer, kind, head) slice, the unit the CPU driver walks too. Each
 * thread runs the reference's per-group functions from kern_fmt.h (compiled for the device,
 * with the float operations pinned to single roundings), so the GPU writes the reference's
 * bytes: ggml groups and KIVI value groups one per thread, KIVI key groups one packed code
 * byte column per thread, fp8 one element per thread after a block-wide amax. The header is
 * built on the device by the same function the host uses, so nothing is copied from host
 * memory and nothing synchronises: the caller's stream orders everything. The decoder reads
 * the header from device memory and checks its own section against the layout before it
 * touches it; a mismatch decodes that slice to zeros rather than read out of bounds.
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/kern.h"
#include "kernels/kern_batch.h"
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

__global__ void kern_hdr_kernel(struct kern_layout lay, struct kern_recipe rec, uint8_t *dst)
{
    if (threadIdx.x == 0)
        kern_hdr_build(&lay, &rec, dst);
}

__device__ static uint32_t ggml_bytes(uint32_t codec, int bits)
{
    if (bits)
        return kern_kivi_v_group_bytes(bits);
    return codec == KERN_CODEC_Q8_0 ? 34 : codec == KERN_CODEC_Q4_1 ? 20 : 24;
}

__global__ void kern_enc_kernel(struct kern_layout lay, const uint8_t *src, uint8_t *dst,
                                struct kern_key_stats st)
{
    __shared__ float red[KERN_CUDA_THREADS];
    const uint32_t H = lay.heads, D = lay.head_dim, T = lay.tokens, kinds = kern_kinds(&lay);
    const uint32_t h = blockIdx.x % H, lk = blockIdx.x / H, k = lk % kinds, l = lk / kinds;
    const uint32_t tid = threadIdx.x, nt = blockDim.x;
    struct kern_block_sect s;
    memcpy(&s, dst + sizeof(struct kern_block_hdr) + lk * sizeof(s), sizeof(s));
    uint8_t *sect = dst + s.offset;
    const uint8_t *raw = src + 2 * kern_raw_index(&lay, l, k, 0, h);
    const uint64_t stride = (uint64_t)H * D;
    const uint32_t codec = s.codec;
    const int bits = kern_codec_bits(codec);

    if (h == 0) { /* alignment padding after the section */
        uint32_t end = (s.offset + s.bytes + KERN_ALIGN - 1) & ~(KERN_ALIGN - 1);
        for (uint32_t i = s.offset + s.bytes + tid; i < end; i += nt)
            dst[i] = 0;
    }

    if (k == 0 && st.kmin) {
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
        __syncthreads();
    }

    if (codec == KERN_CODEC_RAW) {
        for (uint64_t i = tid; i < (uint64_t)T * D; i += nt) {
            uint64_t t = i / D, d = i % D;
            const uint8_t *from = raw + 2 * (t * stride + d);
            uint8_t *to = sect + 2 * ((t * H + h) * D + d);
            to[0] = from[0];
            to[1] = from[1];
        }
    } else if (codec == KERN_CODEC_FP8) {
        float amax = 0.0f;
        for (uint64_t i = tid; i < (uint64_t)T * D; i += nt) {
            float a = fabsf(dev_value(raw, lay.dtype, stride, (uint32_t)(i / D), (uint32_t)(i % D)));
            amax = a > amax ? a : amax;
        }
        red[tid] = amax;
        __syncthreads();
        for (uint32_t w = nt / 2; w > 0; w /= 2) {
            if (tid < w)
                red[tid] = red[tid + w] > red[tid] ? red[tid + w] : red[tid];
            __syncthreads();
        }
        float scale = kern_fp8_scale(red[0]);
        if (tid == 0)
            memcpy(sect + 4 * h, &scale, 4);
        uint8_t *q = sect + 4 * H;
        for (uint64_t i = tid; i < (uint64_t)T * D; i += nt) {
            uint64_t t = i / D, d = i % D;
            float v = dev_value(raw, lay.dtype, stride, (uint32_t)t, (uint32_t)d);
            q[(t * H + h) * D + d] = kern_e4m3_enc(KERN_DIV(v, scale));
        }
    } else if (bits && k == 0) {
        const uint32_t rb = kern_kivi_row_bytes(D, bits), per = 8 / (uint32_t)bits;
        const uint32_t full_gb = kern_kivi_k_group_bytes(D, KERN_GROUP, bits);
        uint8_t *hb = sect + (uint64_t)h * kern_kivi_k_head_bytes(D, T, bits);
        for (uint32_t t0 = 0; t0 < T; t0 += KERN_GROUP) {
            uint32_t rows = T - t0 < KERN_GROUP ? T - t0 : KERN_GROUP;
            uint32_t gb = kern_kivi_k_group_bytes(D, rows, bits);
            uint8_t *g = hb + (uint64_t)(t0 / KERN_GROUP) * full_gb;
            for (uint32_t i = 4 * D + rows * rb + tid; i < gb; i += nt)
                g[i] = 0;
            for (uint32_t cb = tid; cb < rb; cb += nt) {
                float mnf[4], id[4];
                uint32_t nc = D - cb * per < per ? D - cb * per : per;
                for (uint32_t j = 0; j < nc; j++) {
                    uint32_t c = cb * per + j;
                    float mn = dev_value(raw, lay.dtype, stride, t0, c), mx = mn;
                    for (uint32_t r = 1; r < rows; r++) {
                        float v = dev_value(raw, lay.dtype, stride, t0 + r, c);
                        mn = v < mn ? v : mn;
                        mx = v > mx ? v : mx;
                    }
                    uint16_t mn_h, sc_h;
                    kern_kivi_params(mn, mx, bits, &mn_h, &sc_h, &mnf[j], &id[j]);
                    memcpy(g + 2 * c, &sc_h, 2);
                    memcpy(g + 2 * D + 2 * c, &mn_h, 2);
                }
                for (uint32_t r = 0; r < rows; r++) {
                    uint32_t byte = 0;
                    for (uint32_t j = 0; j < nc; j++) {
                        float v = dev_value(raw, lay.dtype, stride, t0 + r, cb * per + j);
                        byte |= kern_kivi_code(v, mnf[j], id[j], bits) << (j * bits);
                    }
                    g[4 * D + (uint64_t)r * rb + cb] = (uint8_t)byte;
                }
            }
        }
    } else {
        const uint32_t G = kern_ngroups(D), gb = ggml_bytes(codec, bits);
        for (uint64_t u = tid; u < (uint64_t)T * G; u += nt) {
            uint32_t t = (uint32_t)(u / G), g = (uint32_t)(u % G);
            int n = (int)(D - g * KERN_GROUP < KERN_GROUP ? D - g * KERN_GROUP : KERN_GROUP);
            float x[KERN_GROUP];
            for (int j = 0; j < n; j++)
                x[j] = dev_value(raw, lay.dtype, stride, t, g * KERN_GROUP + j);
            uint8_t *blk = sect + (((uint64_t)t * H + h) * G + g) * gb;
            if (bits)
                kern_kivi_v_enc(x, n, blk, bits);
            else if (codec == KERN_CODEC_Q8_0)
                kern_q8_0_enc(x, n, blk);
            else
                kern_qx_1_enc(x, n, blk, codec == KERN_CODEC_Q5_1 ? 5 : 4);
        }
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
    uint32_t blocks = lay->layers * kern_kinds(lay) * lay->heads;
    kern_hdr_kernel<<<1, 1, 0, s>>>(*lay, *rec, (uint8_t *)dst);
    kern_enc_kernel<<<blocks, KERN_CUDA_THREADS, 0, s>>>(*lay, (const uint8_t *)src,
                                                         (uint8_t *)dst, st);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return cuda_fail("encode launch", e);
    return sz;
}

/* The decoder is the batched one (kern_pack.cu, kern_batch.h): this block as the only block
 * of a batch whose "engine" is the raw block itself. */
extern "C" int64_t kern_decode_cuda(const struct kern_layout *lay, const void *src,
                                    size_t src_len, void *dst, size_t dst_cap,
                                    enum kern_dtype out_dtype, void *stream)
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
