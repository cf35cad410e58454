/*
 * remote_rec.c — the remote tier's record: header, key, slot, validation (remote_rec.h).
 */
#include "tiers/remote_rec.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <xxhash.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "records are little-endian");

/* The header's layout: byte offsets. */
enum {
    REMOTE_REC_O_MAGIC = 0,                  /* u32 */
    REMOTE_REC_O_VERSION = 4,                /* u16 */
    REMOTE_REC_O_HDRLEN = 6,                 /* u16 */
    REMOTE_REC_O_NSFP = 8,                   /* u64 */
    REMOTE_REC_O_KEY = 16,                   /* u64 lo, u64 hi */
    REMOTE_REC_O_PARENT = 32,                /* u64 lo, u64 hi */
    REMOTE_REC_O_DEPTH = 48,                 /* u32 */
    REMOTE_REC_O_FORMAT = 52,                /* u32 */
    REMOTE_REC_O_CODEC = 56,                 /* u32, then 4 bytes zero */
    REMOTE_REC_O_LEN = 64,                   /* u64 */
    REMOTE_REC_O_DCSUM = 72,                 /* u64 */
    REMOTE_REC_O_NS = 80,                    /* REMOTE_REC_NS_BYTES, then zeros */
    REMOTE_REC_O_HCSUM = REMOTE_REC_HDR - 8, /* u64: XXH3 of the bytes before it */
};
_Static_assert(REMOTE_REC_O_NS + REMOTE_REC_NS_BYTES <= REMOTE_REC_O_HCSUM, "header fits");

static void remote_rec_put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, sizeof(v));
}

static void remote_rec_put64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, sizeof(v));
}

static uint32_t remote_rec_get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static uint64_t remote_rec_get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

uint64_t remote_rec_ns_fp(const uint8_t ns[REMOTE_REC_NS_BYTES])
{
    return XXH3_64bits(ns, REMOTE_REC_NS_BYTES);
}

size_t remote_rec_key(char *buf, uint64_t ns_fp, const uint64_t key[2])
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    memcpy(buf, "kvc1:", 5);
    n = 5;
    for (int i = 15; i >= 0; i--)
        buf[n++] = hex[(ns_fp >> (i * 4)) & 0xf];
    buf[n++] = ':';
    for (int w = 1; w >= 0; w--)
        for (int i = 15; i >= 0; i--)
            buf[n++] = hex[(key[w] >> (i * 4)) & 0xf];
    buf[n] = '\0';
    return n;
}

void remote_rec_encode(uint8_t *hdr, const struct remote_rec_meta *m, const void *data)
{
    memset(hdr, 0, REMOTE_REC_HDR);
    remote_rec_put32(hdr + REMOTE_REC_O_MAGIC, REMOTE_REC_MAGIC);
    hdr[REMOTE_REC_O_VERSION] = (uint8_t)REMOTE_REC_VERSION;
    hdr[REMOTE_REC_O_VERSION + 1] = (uint8_t)(REMOTE_REC_VERSION >> 8);
    hdr[REMOTE_REC_O_HDRLEN] = (uint8_t)(REMOTE_REC_HDR & 0xff);
    hdr[REMOTE_REC_O_HDRLEN + 1] = (uint8_t)(REMOTE_REC_HDR >> 8);
    remote_rec_put64(hdr + REMOTE_REC_O_NSFP, remote_rec_ns_fp(m->ns));
    remote_rec_put64(hdr + REMOTE_REC_O_KEY, m->key[0]);
    remote_rec_put64(hdr + REMOTE_REC_O_KEY + 8, m->key[1]);
    remote_rec_put64(hdr + REMOTE_REC_O_PARENT, m->parent[0]);
    remote_rec_put64(hdr + REMOTE_REC_O_PARENT + 8, m->parent[1]);
    remote_rec_put32(hdr + REMOTE_REC_O_DEPTH, m->depth);
    remote_rec_put32(hdr + REMOTE_REC_O_FORMAT, m->format);
    remote_rec_put32(hdr + REMOTE_REC_O_CODEC, m->codec);
    remote_rec_put64(hdr + REMOTE_REC_O_LEN, m->len);
    remote_rec_put64(hdr + REMOTE_REC_O_DCSUM, XXH3_64bits(data, m->len));
    memcpy(hdr + REMOTE_REC_O_NS, m->ns, REMOTE_REC_NS_BYTES);
    remote_rec_put64(hdr + REMOTE_REC_O_HCSUM, XXH3_64bits(hdr, REMOTE_REC_O_HCSUM));
}

int remote_rec_check_header(const uint8_t *hdr, size_t vlen, const struct remote_rec_meta *want,
                            uint64_t max_len, struct remote_rec_meta *got)
{
    uint32_t version;
    if (!hdr || vlen < REMOTE_REC_HDR)
        return -EPROTO;
    if (remote_rec_get32(hdr + REMOTE_REC_O_MAGIC) != REMOTE_REC_MAGIC ||
        remote_rec_get64(hdr + REMOTE_REC_O_HCSUM) != XXH3_64bits(hdr, REMOTE_REC_O_HCSUM))
        return -EPROTO;
    version = (uint32_t)hdr[REMOTE_REC_O_VERSION] | (uint32_t)hdr[REMOTE_REC_O_VERSION + 1] << 8;
    if (version != REMOTE_REC_VERSION ||
        ((uint32_t)hdr[REMOTE_REC_O_HDRLEN] | (uint32_t)hdr[REMOTE_REC_O_HDRLEN + 1] << 8) !=
            REMOTE_REC_HDR)
        return -EPROTONOSUPPORT;
    memset(got, 0, sizeof(*got));
    got->len = remote_rec_get64(hdr + REMOTE_REC_O_LEN);
    if (got->len != vlen - REMOTE_REC_HDR || got->len > max_len)
        return -EMSGSIZE;
    got->key[0] = remote_rec_get64(hdr + REMOTE_REC_O_KEY);
    got->key[1] = remote_rec_get64(hdr + REMOTE_REC_O_KEY + 8);
    got->parent[0] = remote_rec_get64(hdr + REMOTE_REC_O_PARENT);
    got->parent[1] = remote_rec_get64(hdr + REMOTE_REC_O_PARENT + 8);
    got->depth = remote_rec_get32(hdr + REMOTE_REC_O_DEPTH);
    got->format = remote_rec_get32(hdr + REMOTE_REC_O_FORMAT);
    got->codec = remote_rec_get32(hdr + REMOTE_REC_O_CODEC);
    got->data_xxh = remote_rec_get64(hdr + REMOTE_REC_O_DCSUM);
    memcpy(got->ns, hdr + REMOTE_REC_O_NS, REMOTE_REC_NS_BYTES);
    if (memcmp(got->ns, want->ns, REMOTE_REC_NS_BYTES) != 0 ||
        remote_rec_get64(hdr + REMOTE_REC_O_NSFP) != remote_rec_ns_fp(want->ns) ||
        got->key[0] != want->key[0] || got->key[1] != want->key[1])
        return -ESTALE;
    if (got->codec != REMOTE_REC_CODEC_RAW)
        return -EPROTONOSUPPORT;
    return 0;
}

int remote_rec_check_data(const struct remote_rec_meta *got, const void *data)
{
    return XXH3_64bits(data, got->len) == got->data_xxh ? 0 : -EBADMSG;
}

int remote_rec_check(const uint8_t *val, size_t vlen, const struct remote_rec_meta *want,
                     uint64_t max_len, struct remote_rec_meta *got)
{
    int rc = remote_rec_check_header(val, vlen, want, max_len, got);
    return rc ? rc : remote_rec_check_data(got, val + REMOTE_REC_HDR);
}

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), the cluster's key hash. */
static uint16_t remote_rec_crc16(const char *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)((uint8_t)p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

unsigned remote_rec_slot(const char *key, size_t len)
{
    /* A hash tag: the bytes between the first '{' and the next '}', when not empty. */
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t o = (size_t)(open - key);
        const char *close = memchr(open + 1, '}', len - o - 1);
        if (close && close > open + 1)
            return remote_rec_crc16(open + 1, (size_t)(close - open - 1)) & 16383u;
    }
    return remote_rec_crc16(key, len) & 16383u;
}
