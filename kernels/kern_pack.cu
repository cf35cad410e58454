/*
 * kern_pack.cu — the CUDA twin of kern_pack_cpu (see kern_pack.h).
 *
 * DESIGN
 * One thread block per (block, layer, kind, token): it moves that token's heads*head_dim
 * elements, head rows apart in the engine and back to back in the canonical block. The
 * widest access that every address and stride of the thread block allows (16, 4 or 1
 * bytes) is chosen once per thread block, so a uniform branch, and the copy is bit-exact
 * whatever the element type. The block table is read on the device; the host checked the
 * shape, the engine owns the table's contents (an entry below zero skips the token).
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>

#include "kernels/kern_pack.h"

#define KERN_PACK_THREADS 128

struct pack_args {
    struct kern_pack_layout lay;
    uint32_t page_tokens;
    uint64_t page_stride, token_stride, head_stride;
    uint64_t first_token;
    void *const *k, *const *v, *const *blocks;
    const int32_t *table;
    int gather;
};

template <typename T>
__device__ static void pack_rows(char *eng, char *blk, uint64_t head_stride, uint32_t heads,
                                 uint64_t row, int gather)
{
    const uint64_t per_row = row / sizeof(T), n = per_row * heads;
    for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) {
        uint64_t h = i / per_row, j = i % per_row;
        T *e = (T *)(eng + h * head_stride) + j;
        T *c = (T *)(blk + h * row) + j;
        if (gather)
            *c = *e;
        else
            *e = *c;
    }
}

__global__ void kern_pack_kernel(struct pack_args a)
{
    const struct kern_pack_layout &L = a.lay;
    uint64_t x = blockIdx.x;
    const uint32_t t = x % L.block_tokens;
    x /= L.block_tokens;
    const uint32_t k = x % L.kinds;
    x /= L.kinds;
    const uint32_t l = x % L.layers;
    const uint64_t b = x / L.layers;
    const uint64_t p = a.first_token + b * L.block_tokens + t;
    const int32_t page = a.table[p / a.page_tokens];
    if (page < 0)
        return;
    const uint64_t row = (uint64_t)L.head_dim * L.elem_bytes;
    char *eng = (char *)(k ? a.v[l] : a.k[l]) + (uint64_t)page * a.page_stride +
                (p % a.page_tokens) * a.token_stride;
    char *blk = (char *)a.blocks[b] + ((((uint64_t)l * L.kinds + k) * L.block_tokens + t) *
                                       L.heads) * row;
    const uint64_t bits = (uint64_t)(uintptr_t)eng | (uint64_t)(uintptr_t)blk | row |
                          (L.heads > 1 ? a.head_stride : 0);
    if ((bits & 15) == 0)
        pack_rows<uint4>(eng, blk, a.head_stride, L.heads, row, a.gather);
    else if ((bits & 3) == 0)
        pack_rows<uint32_t>(eng, blk, a.head_stride, L.heads, row, a.gather);
    else
        pack_rows<uint8_t>(eng, blk, a.head_stride, L.heads, row, a.gather);
}

int kern_pack_cuda(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                   uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir,
                   void *stream)
{
    int rc = kern_pack_check(lay, eng, first_token, nblocks, 0);
    if (rc)
        return rc;
    if ((dir != KERN_PACK_GATHER && dir != KERN_PACK_SCATTER) || (nblocks && !blocks))
        return -EINVAL;
    if (nblocks == 0)
        return 0;
    uint64_t grid = (uint64_t)nblocks * lay->layers * lay->kinds * lay->block_tokens;
    if (grid > 0x7fffffffull)
        return -EINVAL;
    struct pack_args a;
    a.lay = *lay;
    a.page_tokens = eng->page_tokens;
    a.page_stride = eng->page_stride;
    a.token_stride = eng->token_stride;
    a.head_stride = eng->head_stride;
    a.first_token = first_token;
    a.k = eng->k;
    a.v = eng->v;
    a.blocks = blocks;
    a.table = eng->block_table;
    a.gather = dir == KERN_PACK_GATHER;
    kern_pack_kernel<<<(unsigned)grid, KERN_PACK_THREADS, 0, (cudaStream_t)stream>>>(a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "kern_pack: launch failed (%s)\n", cudaGetErrorString(e));
        return -EIO;
    }
    return 0;
}
