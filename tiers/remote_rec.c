/*
 * remote_rec.c — the remote tier's records: header, cut, keys, slots, validation
 * (remote_rec.h).
 */
#include "tiers/remote_rec.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "records are little-endian");

#define REMOTE_REC_SLOTS 16384u
#define REMOTE_REC_TAG_MAX 4 /* characters of a hash tag: 36^4 names cover every slot */

/* The header's layout: byte offsets. The block's fields come first, the same in every part
 * of one write ([0, REMOTE_REC_BLOCK_HDR)); then the part's own. */
enum {
    REMOTE_REC_O_MAGIC = 0,                  /* u32 */
    REMOTE_REC_O_VERSION = 4,                /* u16 */
    REMOTE_REC_O_HDRLEN = 6,                 /* u16 */
    REMOTE_REC_O_NSFP = 8,                   /* u64 */
    REMOTE_REC_O_KEY = 16,                   /* u64 lo, u64 hi */
    REMOTE_REC_O_PARENT = 32,                /* u64 lo, u64 hi */
    REMOTE_REC_O_DEPTH = 48,                 /* u32 */
    REMOTE_REC_O_FORMAT = 52,                /* u32 */
    REMOTE_REC_O_CODEC = 56,                 /* u32 */
    REMOTE_REC_O_COUNT = 60,                 /* u32: parts */
    REMOTE_REC_O_LEN = 64,                   /* u64: the block's bytes */
    REMOTE_REC_O_SIZE = 72,                  /* u64: bytes of every part but the last */
    REMOTE_REC_O_BLOCK_XXH = 80,             /* u64: XXH3 of the block's bytes */
    REMOTE_REC_O_NS = 88,                    /* REMOTE_REC_NS_BYTES */
    REMOTE_REC_O_INDEX = 248,                /* u32, then 4 bytes zero */
    REMOTE_REC_O_PART_LEN = 256,             /* u64 */
    REMOTE_REC_O_PART_XXH = 264,             /* u64: XXH3 of the part's bytes */
    REMOTE_REC_O_RESERVED = 272,             /* zeros up to the checksum */
    REMOTE_REC_O_HCSUM = REMOTE_REC_HDR - 8, /* u64: XXH3 of the bytes before it */
};
_Static_assert(REMOTE_REC_O_NS + REMOTE_REC_NS_BYTES == REMOTE_REC_BLOCK_HDR, "block fields");
_Static_assert(REMOTE_REC_O_INDEX == REMOTE_REC_BLOCK_HDR, "part fields follow");
_Static_assert(REMOTE_REC_O_RESERVED <= REMOTE_REC_O_HCSUM, "header fits");
_Static_assert((uint64_t)REMOTE_REC_PARTS_MAX *REMOTE_REC_PART_MIN >= (1ull << 30),
               "a block of the store's largest size (1 GiB) can be cut");

static void remote_rec_put16(uint8_t *p, uint16_t v)
{
    memcpy(p, &v, sizeof(v));
}

static void remote_rec_put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, sizeof(v));
}

static void remote_rec_put64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, sizeof(v));
}

static uint16_t remote_rec_get16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof(v));
    return v;
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

/* ---- the cut ---------------------------------------------------------------------------- */

int remote_rec_geom(uint64_t len, uint64_t part_size, struct remote_rec_geom *g)
{
    uint64_t count;
    if (part_size && part_size < REMOTE_REC_PART_MIN)
        return -EINVAL;
    if (!part_size || len <= part_size) {
        *g = (struct remote_rec_geom){.len = len, .size = len, .count = 1};
        return 0;
    }
    count = len / part_size + (len % part_size != 0);
    if (count > REMOTE_REC_PARTS_MAX)
        return -EMSGSIZE;
    *g = (struct remote_rec_geom){.len = len, .size = part_size, .count = (uint32_t)count};
    return 0;
}

uint64_t remote_rec_part_off(const struct remote_rec_geom *g, uint32_t i)
{
    return (uint64_t)i * g->size;
}

uint64_t remote_rec_part_len(const struct remote_rec_geom *g, uint32_t i)
{
    uint64_t off = remote_rec_part_off(g, i);
    return g->len - off < g->size ? g->len - off : g->size;
}

/* ---- keys and slots -------------------------------------------------------------------- */

uint64_t remote_rec_ns_fp(const uint8_t ns[REMOTE_REC_NS_BYTES])
{
    return XXH3_64bits(ns, REMOTE_REC_NS_BYTES);
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
            return remote_rec_crc16(open + 1, (size_t)(close - open - 1)) & (REMOTE_REC_SLOTS - 1);
    }
    return remote_rec_crc16(key, len) & (REMOTE_REC_SLOTS - 1);
}

/* For every slot, the first name of 0, 1, ..., z, 10, ... (lowercase base 36) that hashes
 * to it: a fixed table, so every kvcd names the same part keys. */
static char remote_rec_tags[REMOTE_REC_SLOTS][REMOTE_REC_TAG_MAX + 1];
static pthread_once_t remote_rec_tags_once = PTHREAD_ONCE_INIT;

static void remote_rec_tags_build(void)
{
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    uint32_t left = REMOTE_REC_SLOTS;
    for (uint32_t v = 0; left; v++) {
        char s[REMOTE_REC_TAG_MAX + 1], r[REMOTE_REC_TAG_MAX + 1];
        size_t n = 0;
        uint32_t x = v;
        do {
            r[n++] = digits[x % 36];
            x /= 36;
        } while (x && n < REMOTE_REC_TAG_MAX);
        for (size_t i = 0; i < n; i++)
            s[i] = r[n - 1 - i];
        s[n] = '\0';
        unsigned slot = remote_rec_crc16(s, n) & (REMOTE_REC_SLOTS - 1);
        if (!remote_rec_tags[slot][0]) {
            memcpy(remote_rec_tags[slot], s, n + 1);
            left--;
        }
    }
}

size_t remote_rec_key_named(char *buf, size_t n, const struct remote_rec_geom *g, uint32_t index)
{
    if (g->count > 1) {
        unsigned base = remote_rec_slot(buf, n);
        unsigned slot =
            (unsigned)((base + (uint64_t)index * REMOTE_REC_SLOTS / g->count) % REMOTE_REC_SLOTS);
        pthread_once(&remote_rec_tags_once, remote_rec_tags_build);
        n += (size_t)snprintf(buf + n, REMOTE_REC_KEY_MAX - n, ":%llu:%u{%s}",
                              (unsigned long long)g->size, index, remote_rec_tags[slot]);
    }
    return n;
}

size_t remote_rec_key(char *buf, uint64_t ns_fp, const uint64_t key[2],
                      const struct remote_rec_geom *g, uint32_t index)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    memcpy(buf, "kvc2:", 5);
    n = 5;
    for (int i = 15; i >= 0; i--)
        buf[n++] = hex[(ns_fp >> (i * 4)) & 0xf];
    buf[n++] = ':';
    for (int w = 1; w >= 0; w--)
        for (int i = 15; i >= 0; i--)
            buf[n++] = hex[(key[w] >> (i * 4)) & 0xf];
    buf[n] = '\0';
    return remote_rec_key_named(buf, n, g, index);
}

/* ---- hashing and encoding ---------------------------------------------------------------- */

uint64_t remote_rec_hash(const struct remote_rec_geom *g, const void *data, uint64_t *part_xxh)
{
    XXH3_state_t st;
    if (g->count == 1)
        return part_xxh[0] = XXH3_64bits(data, g->len);
    XXH3_64bits_reset(&st);
    for (uint32_t i = 0; i < g->count; i++) {
        const uint8_t *p = (const uint8_t *)data + remote_rec_part_off(g, i);
        uint64_t len = remote_rec_part_len(g, i);
        part_xxh[i] = XXH3_64bits(p, len);
        XXH3_64bits_update(&st, p, len);
    }
    return XXH3_64bits_digest(&st);
}

void remote_rec_encode(uint8_t *hdr, const struct remote_rec_meta *m,
                       const struct remote_rec_geom *g, uint32_t index, uint64_t part_xxh)
{
    memset(hdr, 0, REMOTE_REC_HDR);
    remote_rec_put32(hdr + REMOTE_REC_O_MAGIC, REMOTE_REC_MAGIC);
    remote_rec_put16(hdr + REMOTE_REC_O_VERSION, (uint16_t)REMOTE_REC_VERSION);
    remote_rec_put16(hdr + REMOTE_REC_O_HDRLEN, (uint16_t)REMOTE_REC_HDR);
    remote_rec_put64(hdr + REMOTE_REC_O_NSFP, remote_rec_ns_fp(m->ns));
    remote_rec_put64(hdr + REMOTE_REC_O_KEY, m->key[0]);
    remote_rec_put64(hdr + REMOTE_REC_O_KEY + 8, m->key[1]);
    remote_rec_put64(hdr + REMOTE_REC_O_PARENT, m->parent[0]);
    remote_rec_put64(hdr + REMOTE_REC_O_PARENT + 8, m->parent[1]);
    remote_rec_put32(hdr + REMOTE_REC_O_DEPTH, m->depth);
    remote_rec_put32(hdr + REMOTE_REC_O_FORMAT, m->format);
    remote_rec_put32(hdr + REMOTE_REC_O_CODEC, m->codec);
    remote_rec_put32(hdr + REMOTE_REC_O_COUNT, g->count);
    remote_rec_put64(hdr + REMOTE_REC_O_LEN, g->len);
    remote_rec_put64(hdr + REMOTE_REC_O_SIZE, g->size);
    remote_rec_put64(hdr + REMOTE_REC_O_BLOCK_XXH, m->data_xxh);
    memcpy(hdr + REMOTE_REC_O_NS, m->ns, REMOTE_REC_NS_BYTES);
    remote_rec_put32(hdr + REMOTE_REC_O_INDEX, index);
    remote_rec_put64(hdr + REMOTE_REC_O_PART_LEN, remote_rec_part_len(g, index));
    remote_rec_put64(hdr + REMOTE_REC_O_PART_XXH, part_xxh);
    remote_rec_put64(hdr + REMOTE_REC_O_HCSUM, XXH3_64bits(hdr, REMOTE_REC_O_HCSUM));
}

/* ---- validation ------------------------------------------------------------------------- */

int remote_rec_check_header(const uint8_t *hdr, size_t vlen, const struct remote_rec_meta *want,
                            const struct remote_rec_geom *g, uint32_t index,
                            struct remote_rec_meta *got, uint64_t *part_xxh)
{
    static const uint8_t zero[REMOTE_REC_O_HCSUM - REMOTE_REC_O_RESERVED];
    /* The version and header size are read before the checksum only to name the refusal:
     * an older kvcd's record is not a torn one. No length is used before the checksum. */
    if (!hdr || vlen < REMOTE_REC_O_HDRLEN + 2 ||
        remote_rec_get32(hdr + REMOTE_REC_O_MAGIC) != REMOTE_REC_MAGIC)
        return -EPROTO;
    if (remote_rec_get16(hdr + REMOTE_REC_O_VERSION) != REMOTE_REC_VERSION ||
        remote_rec_get16(hdr + REMOTE_REC_O_HDRLEN) != REMOTE_REC_HDR)
        return -EPROTONOSUPPORT;
    if (vlen < REMOTE_REC_HDR ||
        remote_rec_get64(hdr + REMOTE_REC_O_HCSUM) != XXH3_64bits(hdr, REMOTE_REC_O_HCSUM))
        return -EPROTO;
    if (memcmp(hdr + REMOTE_REC_O_RESERVED, zero, sizeof(zero)) != 0 ||
        remote_rec_get32(hdr + REMOTE_REC_O_INDEX + 4) != 0)
        return -EPROTONOSUPPORT;
    memset(got, 0, sizeof(*got));
    got->len = remote_rec_get64(hdr + REMOTE_REC_O_LEN);
    *part_xxh = remote_rec_get64(hdr + REMOTE_REC_O_PART_XXH);
    /* The reader computed the cut from the block length it expects; the record must have
     * exactly that cut, and this part exactly its length (bounded by the value's). */
    if (g->len != want->len || index >= g->count || got->len != g->len ||
        remote_rec_get64(hdr + REMOTE_REC_O_SIZE) != g->size ||
        remote_rec_get32(hdr + REMOTE_REC_O_COUNT) != g->count ||
        remote_rec_get64(hdr + REMOTE_REC_O_PART_LEN) != remote_rec_part_len(g, index) ||
        vlen - REMOTE_REC_HDR != remote_rec_part_len(g, index))
        return -EMSGSIZE;
    got->key[0] = remote_rec_get64(hdr + REMOTE_REC_O_KEY);
    got->key[1] = remote_rec_get64(hdr + REMOTE_REC_O_KEY + 8);
    got->parent[0] = remote_rec_get64(hdr + REMOTE_REC_O_PARENT);
    got->parent[1] = remote_rec_get64(hdr + REMOTE_REC_O_PARENT + 8);
    got->depth = remote_rec_get32(hdr + REMOTE_REC_O_DEPTH);
    got->format = remote_rec_get32(hdr + REMOTE_REC_O_FORMAT);
    got->codec = remote_rec_get32(hdr + REMOTE_REC_O_CODEC);
    got->data_xxh = remote_rec_get64(hdr + REMOTE_REC_O_BLOCK_XXH);
    memcpy(got->ns, hdr + REMOTE_REC_O_NS, REMOTE_REC_NS_BYTES);
    if (memcmp(got->ns, want->ns, REMOTE_REC_NS_BYTES) != 0 ||
        remote_rec_get64(hdr + REMOTE_REC_O_NSFP) != remote_rec_ns_fp(want->ns) ||
        got->key[0] != want->key[0] || got->key[1] != want->key[1] ||
        remote_rec_get32(hdr + REMOTE_REC_O_INDEX) != index)
        return -ESTALE;
    if (got->codec != REMOTE_REC_CODEC_RAW)
        return -EPROTONOSUPPORT;
    /* One part: its checksum is the block's. */
    if (g->count == 1 && *part_xxh != got->data_xxh)
        return -EPROTO;
    return 0;
}

int remote_rec_check_data(uint64_t part_xxh, const void *data, uint64_t len)
{
    return XXH3_64bits(data, len) == part_xxh ? 0 : -EBADMSG;
}

int remote_rec_same_write(const uint8_t *hdr_a, const uint8_t *hdr_b)
{
    return memcmp(hdr_a, hdr_b, REMOTE_REC_BLOCK_HDR) == 0 ? 0 : -ESTALE;
}

int remote_rec_check(const uint8_t *val, size_t vlen, const struct remote_rec_meta *want,
                     const struct remote_rec_geom *g, uint32_t index, struct remote_rec_meta *got)
{
    uint64_t part_xxh;
    int rc = remote_rec_check_header(val, vlen, want, g, index, got, &part_xxh);
    return rc ? rc : remote_rec_check_data(part_xxh, val + REMOTE_REC_HDR, vlen - REMOTE_REC_HDR);
}
