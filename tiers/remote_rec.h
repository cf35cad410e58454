/*
 * remote_rec.h — the records a block becomes in the remote tier (Redis Cluster values), and
 * the Redis keys they are stored under.
 *
 * DESIGN
 * A value must be able to prove what it is, since anything may sit under a key: a write cut
 * off by a failover, a part of an older write of the same block, a record of another layout
 * or of another kvcd version, or bytes some other program put there. A block is stored in
 * one or more parts: one larger than the part size (remote.part_size; 0 never splits) is cut
 * into parts of that size, the last one shorter, each its own value (remote_rec_geom). Every
 * part is a record: a fixed REMOTE_REC_HDR-byte header followed by the part's bytes. The
 * header's first REMOTE_REC_BLOCK_HDR bytes describe the block and the write, the same in
 * every part of one write: magic, record format version, header size, the namespace
 * fingerprint and descriptor (the layout, compared bytewise), the key, the parent key, the
 * depth in the prefix tree, the block's own format (opaque here), the codec of the stored
 * bytes, the block's length, the part size, the part count, and the XXH3 of the whole
 * block's bytes — which also names the write: a block put again with other bytes carries
 * another one. Then the part's own fields: its index, its length, the XXH3 of its bytes, and
 * last the XXH3 of the header before it.
 * Validation of a part takes the value's length from the network and the reader's
 * expectations (namespace, key, block length and the cut it computes itself, index) and
 * checks, in order (remote_rec_check_header): the magic; the version and header size (an
 * older kvcd's record is refused as such); the header checksum; the reserved bytes; the
 * lengths and the cut; the namespace, key and index; then the part's bytes
 * (remote_rec_check_data). A reader of a block in several parts requires the block headers
 * of all its parts to be bytewise equal (remote_rec_same_write): parts of two writes, or of
 * two blocks, never make one block. Only then may a byte of the data be used. Every length
 * and count is bounded before it is used; all integers are little-endian.
 * Keys: a block in one part is under "kvc2:" + 16 hex digits of the namespace fingerprint +
 * ":" + 32 hex digits of the block key; with no '{' the whole key is hashed, so blocks spread
 * over every slot. Part i of count is under that key + ":" + the part size + ":" + i, and a
 * hash tag that puts it in slot (slot of the block's key + i * 16384 / count) mod 16384: the
 * parts of one block take count different slots spread evenly over the slot space, so with
 * masters holding contiguous slot ranges (as redis-cli --cluster create gives them) they go
 * round the masters, and a read of the block is served by all of them at once. The part size
 * in the key keeps daemons set to different part sizes off each other's parts (they share
 * the blocks that fit in one value).
 * Pure functions: no I/O; the one state is the table of hash tags, built once (any thread).
 */
#ifndef KVC_TIER_REMOTE_REC_H
#define KVC_TIER_REMOTE_REC_H

#include <stddef.h>
#include <stdint.h>

#define REMOTE_REC_MAGIC 0x5243564bu /* "KVCR" */
#define REMOTE_REC_VERSION 2u        /* 1: 256-byte header, one value per block, "kvc1:" keys */
#define REMOTE_REC_HDR 384u
#define REMOTE_REC_BLOCK_HDR 248u /* the header bytes all parts of one write share */
#define REMOTE_REC_NS_BYTES 160u
#define REMOTE_REC_KEY_MAX 96u /* "kvc2:" 16 ':' 32 ':' size ':' index '{' tag '}', NUL: 78 */
#define REMOTE_REC_CODEC_RAW 0u
#define REMOTE_REC_PARTS_MAX 16384u     /* parts of one block at most */
#define REMOTE_REC_PART_MIN (64u << 10) /* the smallest part size */

/* What a record says about its block. */
struct remote_rec_meta {
    uint64_t key[2];    /* lo, hi */
    uint64_t parent[2]; /* all-zero: the first block of a prefix */
    uint32_t depth;
    uint32_t format;                 /* the block's own encoding (kvcd: the wire format); opaque */
    uint32_t codec;                  /* REMOTE_REC_CODEC_* of the stored bytes */
    uint64_t len;                    /* the block's bytes, all parts together */
    uint64_t data_xxh;               /* XXH3 of the block's bytes (remote_rec_hash, the checks) */
    uint8_t ns[REMOTE_REC_NS_BYTES]; /* opaque namespace descriptor */
};

/* How a block is cut: count parts of size bytes, the last one len - (count - 1) * size. */
struct remote_rec_geom {
    uint64_t len;
    uint64_t size;
    uint32_t count;
};

/* The cut of a block of len bytes with parts of part_size bytes (0: one part). 0, -EINVAL
 * (part_size neither 0 nor at least REMOTE_REC_PART_MIN), -EMSGSIZE (more than
 * REMOTE_REC_PARTS_MAX parts). */
int remote_rec_geom(uint64_t len, uint64_t part_size, struct remote_rec_geom *g);
/* Where part i (< g->count) starts in the block, and its length. */
uint64_t remote_rec_part_off(const struct remote_rec_geom *g, uint32_t i);
uint64_t remote_rec_part_len(const struct remote_rec_geom *g, uint32_t i);

/* The fingerprint of a namespace descriptor (XXH3-64 of its bytes). */
uint64_t remote_rec_ns_fp(const uint8_t ns[REMOTE_REC_NS_BYTES]);

/* Writes the Redis key of part index of a block cut as g (namespace fingerprint, key) into
 * buf (REMOTE_REC_KEY_MAX bytes), NUL terminated; returns its length. */
size_t remote_rec_key(char *buf, uint64_t ns_fp, const uint64_t key[2],
                      const struct remote_rec_geom *g, uint32_t index);

/* Turns buf, the n-byte Redis key of a whole block (NUL terminated, at most 64 bytes), into
 * the key of part index of the block cut as g (the same for a block in one part); returns its
 * length. remote_rec_key and sealed keys (remote_seal_key) share the parts' suffix. */
size_t remote_rec_key_named(char *buf, size_t n, const struct remote_rec_geom *g, uint32_t index);

/* Hashes a block of g->len bytes at data cut as g: part_xxh[i] gets the XXH3 of part i (count
 * entries), and the return value is the XXH3 of the whole block (for one part, the same).
 * Each part is hashed twice while it is in cache: the data is read from memory once. */
uint64_t remote_rec_hash(const struct remote_rec_geom *g, const void *data, uint64_t *part_xxh);

/* Writes the header of part index of the block m cut as g into hdr (REMOTE_REC_HDR bytes);
 * m->data_xxh is the block's XXH3 and part_xxh the part's (remote_rec_hash). */
void remote_rec_encode(uint8_t *hdr, const struct remote_rec_meta *m,
                       const struct remote_rec_geom *g, uint32_t index, uint64_t part_xxh);

/* Checks the first REMOTE_REC_HDR bytes of a value of vlen bytes read from the network under
 * the key of part index of the block want cut as g (g->len == want->len): it must be that
 * part's header, of a record whose namespace descriptor and key equal want's. On success
 * fills *got (every block field from the header) and *part_xxh, and returns 0; the part's
 * bytes follow the header, remote_rec_part_len(g, index) of them. Errors: -EPROTO (shorter
 * than a header, bad magic, or header checksum: not a record, or a torn one),
 * -EPROTONOSUPPORT (another record version or header size, reserved bytes set, an unknown
 * codec), -EMSGSIZE (a length or the cut disagrees with the value's or the reader's),
 * -ESTALE (another namespace layout, another key, another part). */
int remote_rec_check_header(const uint8_t *hdr, size_t vlen, const struct remote_rec_meta *want,
                            const struct remote_rec_geom *g, uint32_t index,
                            struct remote_rec_meta *got, uint64_t *part_xxh);
/* The part's len bytes at data against its header's checksum: 0 or -EBADMSG. */
int remote_rec_check_data(uint64_t part_xxh, const void *data, uint64_t len);
/* Whether two checked part headers are of the same write of the same block: 0 or -ESTALE. */
int remote_rec_same_write(const uint8_t *hdr_a, const uint8_t *hdr_b);

/* Both checks on a whole value of vlen bytes (header and part bytes). */
int remote_rec_check(const uint8_t *val, size_t vlen, const struct remote_rec_meta *want,
                     const struct remote_rec_geom *g, uint32_t index, struct remote_rec_meta *got);

/* The cluster slot of a Redis key (CRC16-XMODEM mod 16384, with hash tags). */
unsigned remote_rec_slot(const char *key, size_t len);

#endif
