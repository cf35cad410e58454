/*
 * remote_rec.h — the record a block becomes in the remote tier (a Redis Cluster value), and
 * the Redis key it is stored under.
 *
 * DESIGN
 * A value must be able to prove what it is, since anything may sit under a key: a write cut
 * off by a failover, a record of another layout or of another kvcd version, or bytes some
 * other program put there. A record is a fixed 256-byte header followed by the block's
 * bytes. The header holds a magic, the record format version, the namespace descriptor (the
 * layout, compared bytewise) and its fingerprint, the key, the parent key, the depth in the
 * prefix tree, the block's own format (opaque here), the codec of the stored bytes, the data
 * length, the XXH3 of the data and, last, the XXH3 of the header before it. Validation
 * (remote_rec_check) takes the value's length from the network and the caller's
 * expectations, and checks, in order: the value holds a header; the magic, version and
 * header checksum; the data length against the value's length and the caller's limit; the
 * namespace descriptor and key against what was asked; the data checksum. Only then may a
 * byte of the data be used. All integers are little-endian.
 * The Redis key is "kvc1:" + 16 hex digits of the namespace fingerprint + ":" + 32 hex digits
 * of the block key: different layouts never share a key, and with no '{' the whole key is
 * hashed, so blocks spread over every slot of the cluster.
 * Pure functions: no I/O, no state; any thread.
 */
#ifndef KVC_TIER_REMOTE_REC_H
#define KVC_TIER_REMOTE_REC_H

#include <stddef.h>
#include <stdint.h>

#define REMOTE_REC_MAGIC 0x5243564bu /* "KVCR" */
#define REMOTE_REC_VERSION 1u
#define REMOTE_REC_HDR 256u
#define REMOTE_REC_NS_BYTES 160u
#define REMOTE_REC_KEY_MAX 64u /* "kvc1:" 16 ':' 32, NUL: 55 */
#define REMOTE_REC_CODEC_RAW 0u

/* What a record says about its block. */
struct remote_rec_meta {
    uint64_t key[2];    /* lo, hi */
    uint64_t parent[2]; /* all-zero: the first block of a prefix */
    uint32_t depth;
    uint32_t format;                 /* the block's own encoding (kvcd: the wire format); opaque */
    uint32_t codec;                  /* REMOTE_REC_CODEC_* of the stored bytes */
    uint64_t len;                    /* data bytes after the header */
    uint64_t data_xxh;               /* the header's XXH3 of the data (set by the checks) */
    uint8_t ns[REMOTE_REC_NS_BYTES]; /* opaque namespace descriptor */
};

/* The fingerprint of a namespace descriptor (XXH3-64 of its bytes). */
uint64_t remote_rec_ns_fp(const uint8_t ns[REMOTE_REC_NS_BYTES]);

/* Writes the Redis key of (ns fingerprint, key) into buf (REMOTE_REC_KEY_MAX bytes), NUL
 * terminated; returns its length. */
size_t remote_rec_key(char *buf, uint64_t ns_fp, const uint64_t key[2]);

/* Writes the header of a record of m->len bytes at data into hdr (REMOTE_REC_HDR bytes):
 * hashes the data. */
void remote_rec_encode(uint8_t *hdr, const struct remote_rec_meta *m, const void *data);

/* Checks a value of vlen bytes read from the network: it must be a whole record whose
 * namespace descriptor and key equal want's and whose data is at most max_len bytes. On
 * success fills *got (every field from the header) and returns 0; the data is
 * val + REMOTE_REC_HDR, got->len bytes. Errors: -EPROTO (shorter than a header, bad magic,
 * or header checksum: not a record, or a torn one), -EPROTONOSUPPORT (another record
 * version), -EMSGSIZE (the header's length disagrees with the value's, or exceeds max_len),
 * -ESTALE (another namespace layout, or another key), -EBADMSG (data checksum). */
int remote_rec_check(const uint8_t *val, size_t vlen, const struct remote_rec_meta *want,
                     uint64_t max_len, struct remote_rec_meta *got);

/* The same checks in two steps, for a reader that lands the data straight in its place:
 * remote_rec_check_header on the first REMOTE_REC_HDR bytes of a value of vlen bytes (every
 * check but the data's, same errors), then remote_rec_check_data on the got->len data
 * bytes (0 or -EBADMSG). No byte of the data may be used before both passed. */
int remote_rec_check_header(const uint8_t *hdr, size_t vlen, const struct remote_rec_meta *want,
                            uint64_t max_len, struct remote_rec_meta *got);
int remote_rec_check_data(const struct remote_rec_meta *got, const void *data);

/* The cluster slot of a Redis key (CRC16-XMODEM mod 16384, with hash tags). */
unsigned remote_rec_slot(const char *key, size_t len);

#endif
