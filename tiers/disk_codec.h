/*
 * disk_codec.h — lossless codecs of disk records: zstd, optionally over byte planes.
 *
 * DESIGN
 * KV blocks are arrays of 16-bit floats (fp16, bf16). Their high bytes (sign, exponent, top
 * of the mantissa) repeat a lot; their low bytes are close to noise. Plain zstd sees the two
 * interleaved and finds little (about 1.09x on normally distributed fp16); splitting the
 * block into a plane of high bytes and a plane of low bytes first lets it model the high
 * plane alone (docs/design/disk.md has the measured table). The codec ids are what a record
 * header stores: TIER_DISK_CODEC_RAW (0), _ZSTD (1), _ZSTD_PLANES (2). Pure functions, safe
 * from any thread; a context (struct disk_codec) is used by one thread at a time.
 */
#ifndef KVC_TIER_DISK_CODEC_H
#define KVC_TIER_DISK_CODEC_H

#include <stddef.h>
#include <stdint.h>

enum tier_disk_codec {
    TIER_DISK_CODEC_RAW = 0,
    TIER_DISK_CODEC_ZSTD = 1,
    TIER_DISK_CODEC_ZSTD_PLANES = 2, /* 16-bit elements split into high and low byte planes */
};

struct disk_codec;

struct disk_codec *disk_codec_new(void);
void disk_codec_free(struct disk_codec *c);

/* Bytes dst must hold to compress len bytes. */
size_t disk_codec_bound(size_t len);

/* Compresses len bytes of src into dst (cap bytes) with codec at level (1..19). Returns the
 * compressed size, or -ENOSPC when it would not be smaller than len (store raw then),
 * -EINVAL (codec), -ENOMEM. */
long disk_codec_compress(struct disk_codec *c, enum tier_disk_codec codec, int level,
                         const void *src, size_t len, void *dst, size_t cap);

/* Decompresses n bytes of src into exactly len bytes of dst. 0, or -EBADMSG (corrupt, or a
 * size other than len), -EINVAL, -ENOMEM. */
int disk_codec_decompress(struct disk_codec *c, enum tier_disk_codec codec, const void *src,
                          size_t n, void *dst, size_t len);

#endif
