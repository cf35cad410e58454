/*
 * disk_codec.c — lossless codecs of disk records; see disk_codec.h for the design.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "tiers/disk_codec.h"

struct disk_codec {
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    uint8_t *planes; /* scratch: the block as two planes */
    size_t planes_len;
};

struct disk_codec *disk_codec_new(void)
{
    struct disk_codec *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->cctx = ZSTD_createCCtx();
    c->dctx = ZSTD_createDCtx();
    if (!c->cctx || !c->dctx) {
        disk_codec_free(c);
        return NULL;
    }
    return c;
}

void disk_codec_free(struct disk_codec *c)
{
    if (!c)
        return;
    ZSTD_freeCCtx(c->cctx);
    ZSTD_freeDCtx(c->dctx);
    free(c->planes);
    free(c);
}

size_t disk_codec_bound(size_t len)
{
    return ZSTD_compressBound(len);
}

static int disk_codec_scratch(struct disk_codec *c, size_t len)
{
    if (c->planes_len >= len)
        return 0;
    uint8_t *p = realloc(c->planes, len);
    if (!p)
        return -ENOMEM;
    c->planes = p;
    c->planes_len = len;
    return 0;
}

/* Low bytes of every 16-bit element first, then the high bytes; an odd tail byte last. */
static void disk_codec_split(const uint8_t *src, size_t len, uint8_t *dst)
{
    size_t n = len / 2;
    for (size_t i = 0; i < n; i++) {
        dst[i] = src[2 * i];
        dst[n + i] = src[2 * i + 1];
    }
    if (len & 1)
        dst[len - 1] = src[len - 1];
}

static void disk_codec_join(const uint8_t *src, size_t len, uint8_t *dst)
{
    size_t n = len / 2;
    for (size_t i = 0; i < n; i++) {
        dst[2 * i] = src[i];
        dst[2 * i + 1] = src[n + i];
    }
    if (len & 1)
        dst[len - 1] = src[len - 1];
}

long disk_codec_compress(struct disk_codec *c, enum tier_disk_codec codec, int level,
                         const void *src, size_t len, void *dst, size_t cap)
{
    const void *in = src;
    size_t r;
    if (codec != TIER_DISK_CODEC_ZSTD && codec != TIER_DISK_CODEC_ZSTD_PLANES)
        return -EINVAL;
    if (codec == TIER_DISK_CODEC_ZSTD_PLANES) {
        if (disk_codec_scratch(c, len))
            return -ENOMEM;
        disk_codec_split(src, len, c->planes);
        in = c->planes;
    }
    r = ZSTD_compressCCtx(c->cctx, dst, cap, in, len, level);
    if (ZSTD_isError(r) || r >= len)
        return -ENOSPC;
    return (long)r;
}

int disk_codec_decompress(struct disk_codec *c, enum tier_disk_codec codec, const void *src,
                          size_t n, void *dst, size_t len)
{
    void *out = dst;
    size_t r;
    if (codec != TIER_DISK_CODEC_ZSTD && codec != TIER_DISK_CODEC_ZSTD_PLANES)
        return -EINVAL;
    if (codec == TIER_DISK_CODEC_ZSTD_PLANES) {
        if (disk_codec_scratch(c, len))
            return -ENOMEM;
        out = c->planes;
    }
    r = ZSTD_decompressDCtx(c->dctx, out, len, src, n);
    if (ZSTD_isError(r) || r != len)
        return -EBADMSG;
    if (codec == TIER_DISK_CODEC_ZSTD_PLANES)
        disk_codec_join(c->planes, len, dst);
    return 0;
}
