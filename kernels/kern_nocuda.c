/*
 * kern_nocuda.c — the CUDA twins of a build without CUDA (make CUDA=0): each says -ENOTSUP,
 * so callers link the same symbols either way and ask kern_supports() what is real.
 */
#include <errno.h>

#include "kernels/kern.h"

#if !KVC_CUDA
int64_t kern_encode_cuda(const struct kern_layout *lay, const struct kern_recipe *rec,
                         const void *src, void *dst, size_t dst_cap,
                         const struct kern_key_stats *stats, void *stream)
{
    (void)lay, (void)rec, (void)src, (void)dst, (void)dst_cap, (void)stats, (void)stream;
    return -ENOTSUP;
}

int64_t kern_decode_cuda(const struct kern_layout *lay, const void *src, size_t src_len,
                         void *dst, size_t dst_cap, enum kern_dtype out_dtype, uint32_t codecs,
                         void *stream)
{
    (void)lay, (void)src, (void)src_len, (void)dst, (void)dst_cap, (void)out_dtype, (void)stream;
    (void)codecs;
    return -ENOTSUP;
}

int kern_cuda_device_count(void)
{
    return 0;
}

int kern_cuda_alloc(void **dptr, size_t bytes)
{
    (void)bytes;
    if (dptr)
        *dptr = NULL;
    return -ENOTSUP;
}

void kern_cuda_free(void *dptr)
{
    (void)dptr;
}

int kern_cuda_copy(void *dst, const void *src, size_t bytes, int kind, void *stream)
{
    (void)dst, (void)src, (void)bytes, (void)kind, (void)stream;
    return -ENOTSUP;
}

int kern_cuda_stream_sync(void *stream)
{
    (void)stream;
    return -ENOTSUP;
}

double kern_cuda_time_ms(void (*fn)(void *arg), void *arg, int iters)
{
    (void)fn, (void)arg, (void)iters;
    return -ENOTSUP;
}
#else
/* The real twins are in kern_cuda.cu. */
extern int kern_nocuda_unused;
#endif
