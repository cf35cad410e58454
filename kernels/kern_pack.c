/*
 * kern_pack.c — gather/scatter on the CPU: the scalar reference and the row-wise version
 * (see kern_pack.h), and the CUDA twin's stand-in in a build without CUDA.
 */
#include <errno.h>
#include <string.h>

#include "kernels/kern_pack.h"

uint64_t kern_pack_block_bytes(const struct kern_pack_layout *lay)
{
    return (uint64_t)lay->layers * lay->kinds * lay->block_tokens * lay->heads * lay->head_dim *
           lay->elem_bytes;
}

int kern_pack_check(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                    uint64_t first_token, uint32_t nblocks, int check_table)
{
    uint64_t row;
    if (!lay || !eng || lay->layers == 0 || lay->layers > KERN_PACK_MAX_LAYERS ||
        (lay->kinds != 1 && lay->kinds != 2) || lay->block_tokens == 0 || lay->heads == 0 ||
        lay->head_dim == 0 || (lay->elem_bytes != 1 && lay->elem_bytes != 2 && lay->elem_bytes != 4))
        return -EINVAL;
    if (!eng->k || (lay->kinds == 2 && !eng->v) || !eng->block_table || eng->page_tokens == 0)
        return -EINVAL;
    row = (uint64_t)lay->head_dim * lay->elem_bytes;
    /* A head row must not overlap the next head, nor the heads the next token. */
    if (lay->heads > 1 && eng->head_stride < row)
        return -EINVAL;
    if (eng->token_stride < (uint64_t)(lay->heads - 1) * eng->head_stride + row)
        return -EINVAL;
    uint64_t end = first_token + (uint64_t)nblocks * lay->block_tokens;
    if (nblocks && (end - 1) / eng->page_tokens >= eng->table_len)
        return -EINVAL;
    if (check_table)
        for (uint64_t pg = first_token / eng->page_tokens; nblocks && pg <= (end - 1) / eng->page_tokens;
             pg++)
            if (eng->block_table[pg] < 0)
                return -EINVAL;
    return 0;
}

/* Address of (layer, kind, sequence token p, head) in the engine's tensors. */
static char *kern_pack_engine_at(const struct kern_pack_engine *eng, uint32_t l, uint32_t k,
                                 uint64_t p, uint32_t h)
{
    char *base = (char *)(k ? eng->v[l] : eng->k[l]);
    uint64_t page = (uint64_t)eng->block_table[p / eng->page_tokens];
    return base + page * eng->page_stride + (p % eng->page_tokens) * eng->token_stride +
           (uint64_t)h * eng->head_stride;
}

int kern_pack_ref(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                  uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir)
{
    int rc = kern_pack_check(lay, eng, first_token, nblocks, 1);
    if (rc)
        return rc;
    if ((dir != KERN_PACK_GATHER && dir != KERN_PACK_SCATTER) || (nblocks && !blocks))
        return -EINVAL;
    const uint32_t E = lay->elem_bytes;
    for (uint32_t b = 0; b < nblocks; b++) {
        char *blk = blocks[b];
        uint64_t i = 0; /* canonical element index */
        for (uint32_t l = 0; l < lay->layers; l++)
            for (uint32_t k = 0; k < lay->kinds; k++)
                for (uint32_t t = 0; t < lay->block_tokens; t++)
                    for (uint32_t h = 0; h < lay->heads; h++)
                        for (uint32_t d = 0; d < lay->head_dim; d++, i++) {
                            uint64_t p = first_token + (uint64_t)b * lay->block_tokens + t;
                            char *e = kern_pack_engine_at(eng, l, k, p, h) + (uint64_t)d * E;
                            if (dir == KERN_PACK_GATHER)
                                memcpy(blk + i * E, e, E);
                            else
                                memcpy(e, blk + i * E, E);
                        }
    }
    return 0;
}

int kern_pack_cpu(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                  uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir)
{
    int rc = kern_pack_check(lay, eng, first_token, nblocks, 1);
    if (rc)
        return rc;
    if ((dir != KERN_PACK_GATHER && dir != KERN_PACK_SCATTER) || (nblocks && !blocks))
        return -EINVAL;
    const uint64_t row = (uint64_t)lay->head_dim * lay->elem_bytes;
    for (uint32_t b = 0; b < nblocks; b++) {
        char *out = blocks[b];
        for (uint32_t l = 0; l < lay->layers; l++)
            for (uint32_t k = 0; k < lay->kinds; k++)
                for (uint32_t t = 0; t < lay->block_tokens; t++) {
                    uint64_t p = first_token + (uint64_t)b * lay->block_tokens + t;
                    char *e = kern_pack_engine_at(eng, l, k, p, 0);
                    /* Heads packed back to back in the engine too: one copy for the token. */
                    if (eng->head_stride == row) {
                        if (dir == KERN_PACK_GATHER)
                            memcpy(out, e, row * lay->heads);
                        else
                            memcpy(e, out, row * lay->heads);
                        out += row * lay->heads;
                        continue;
                    }
                    for (uint32_t h = 0; h < lay->heads; h++, out += row, e += eng->head_stride) {
                        if (dir == KERN_PACK_GATHER)
                            memcpy(out, e, row);
                        else
                            memcpy(e, out, row);
                    }
                }
    }
    return 0;
}

#if !KVC_CUDA
int kern_pack_cuda(const struct kern_pack_layout *lay, const struct kern_pack_engine *eng,
                   uint64_t first_token, uint32_t nblocks, void *const *blocks, int dir,
                   void *stream)
{
    (void)lay, (void)eng, (void)first_token, (void)nblocks, (void)blocks, (void)dir, (void)stream;
    return -ENOTSUP;
}
#endif
