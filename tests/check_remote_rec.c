/*
 * check_remote_rec.c — the remote tier's records (tiers/remote_rec.h): a block in one value
 * and a block cut into parts round-trip; every way a value from the network can be wrong is
 * refused with its own error — shorter than a header, truncated anywhere, longer than it
 * says, a flipped bit in the header or the data, another magic, version (a version 1 record
 * of an older kvcd), header size, reserved bytes, layout, key, codec, a length or a cut that
 * disagrees with the reader's — and a header's length fields are never trusted before the
 * header checksum. Parts: each is checked against its own index, cut and bytes; a part of
 * another block, another part of the same block, a part of another cut and a part of another
 * write of the same block (other bytes, or another parent) are refused; counts and lengths
 * forged to their limits are refused without overflow. Cuts: bounds of the part size and
 * count. Keys and slots: the key texts, the cluster's slot hash on its published test vector
 * and on hash tags, and part keys in evenly spaced, distinct slots (every slot reachable).
 * Sealed records (tiers/remote_seal.h): a part seals and opens back to its bytes; a flip of
 * any byte of the sealed header, of the data or of the tag, the part opened under another
 * key, block, index, cut, namespace or group, the bytes of another write under this header,
 * and an unsealed record are all refused; the key names are keyed and spread like the
 * unsealed ones; secret files are refused when others may read them, when too short, not
 * regular or missing.
 */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tiers/remote_rec.h"
#include "tiers/remote_seal.h"
#include "tests/lib/daemon.h"

#define LEN 4096u
#define PART (64u << 10)
#define BIG (3 * PART + 8000) /* four parts: three of PART, one of 8000 bytes */

static uint8_t *val;
static size_t vlen;
static struct remote_rec_meta meta;
static struct remote_rec_geom geom;

static void rec_meta(struct remote_rec_meta *m, uint64_t len)
{
    memset(m, 0, sizeof(*m));
    m->key[0] = 0x1122334455667788ull;
    m->key[1] = 0x99aabbccddeeff00ull;
    m->parent[0] = 7;
    m->parent[1] = 8;
    m->depth = 3;
    m->format = 0;
    m->codec = REMOTE_REC_CODEC_RAW;
    m->len = len;
    for (size_t i = 0; i < REMOTE_REC_NS_BYTES; i++)
        m->ns[i] = (uint8_t)(i * 7 + 1);
}

static void rec_setup(void)
{
    uint64_t part_xxh;
    rec_meta(&meta, LEN);
    ck_assert_int_eq(remote_rec_geom(LEN, 0, &geom), 0);
    vlen = REMOTE_REC_HDR + LEN;
    val = malloc(vlen + 64);
    ck_assert_ptr_nonnull(val);
    for (size_t i = 0; i < LEN; i++)
        val[REMOTE_REC_HDR + i] = (uint8_t)(i * 31 + 5);
    meta.data_xxh = remote_rec_hash(&geom, val + REMOTE_REC_HDR, &part_xxh);
    remote_rec_encode(val, &meta, &geom, 0, part_xxh);
}

static void rec_teardown(void)
{
    free(val);
}

/* Rewrites the header checksum after an edit, so the check under test is the one that
 * fires (a forger who knows the format can do this; the field checks must still hold). */
static void rec_reseal(uint8_t *hdr)
{
    uint64_t h = XXH3_64bits(hdr, REMOTE_REC_HDR - 8);
    memcpy(hdr + REMOTE_REC_HDR - 8, &h, 8);
}

static void rec_put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void rec_put64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

START_TEST(test_roundtrip)
{
    struct remote_rec_meta got;
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), 0);
    ck_assert_uint_eq(got.len, LEN);
    ck_assert_uint_eq(got.depth, 3);
    ck_assert_uint_eq(got.parent[0], 7);
    ck_assert_uint_eq(got.parent[1], 8);
    ck_assert_uint_eq(got.key[1], meta.key[1]);
    ck_assert_uint_eq(got.data_xxh, XXH3_64bits(val + REMOTE_REC_HDR, LEN));
    ck_assert_int_eq(memcmp(got.ns, meta.ns, REMOTE_REC_NS_BYTES), 0);
    /* The reader expects the block's exact length: a block of another size is not this one. */
    struct remote_rec_meta want = meta;
    struct remote_rec_geom g;
    want.len = LEN * 2;
    ck_assert_int_eq(remote_rec_geom(want.len, 0, &g), 0);
    ck_assert_int_eq(remote_rec_check(val, vlen, &want, &g, 0, &got), -EMSGSIZE);
    want.len = LEN - 1;
    ck_assert_int_eq(remote_rec_geom(want.len, 0, &g), 0);
    ck_assert_int_eq(remote_rec_check(val, vlen, &want, &g, 0, &got), -EMSGSIZE);
    /* A cut that does not match the length asked for is the caller's error, refused. */
    ck_assert_int_eq(remote_rec_check(val, vlen, &want, &geom, 0, &got), -EMSGSIZE);
    /* An index past the cut. */
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 1, &got), -EMSGSIZE);
}
END_TEST

START_TEST(test_truncated)
{
    struct remote_rec_meta got;
    ck_assert_int_eq(remote_rec_check(NULL, 0, &meta, &geom, 0, &got), -EPROTO);
    ck_assert_int_eq(remote_rec_check(val, 0, &meta, &geom, 0, &got), -EPROTO);
    for (size_t n = 1; n < vlen; n += (n < REMOTE_REC_HDR + 8 ? 1 : 97)) {
        int rc = remote_rec_check(val, n, &meta, &geom, 0, &got);
        ck_assert_msg(rc == (n < REMOTE_REC_HDR ? -EPROTO : -EMSGSIZE), "len %zu: %d", n, rc);
    }
    /* Longer than it says (a value with trailing bytes). */
    ck_assert_int_eq(remote_rec_check(val, vlen + 1, &meta, &geom, 0, &got), -EMSGSIZE);
}
END_TEST

START_TEST(test_bad_lengths)
{
    struct remote_rec_meta got;
    uint64_t lens[] = {0,         LEN - 1, LEN + 1, UINT64_MAX, UINT64_MAX - REMOTE_REC_HDR + 1,
                       1ull << 63};
    /* The block length (64), the part size (72) and the part length (256). */
    static const size_t at[] = {64, 72, 256};
    for (size_t f = 0; f < sizeof(at) / sizeof(at[0]); f++) {
        uint64_t keep;
        memcpy(&keep, val + at[f], 8);
        for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
            rec_put64(val + at[f], lens[i]);
            /* Not resealed: the header checksum refuses it before the length is read. */
            ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), -EPROTO);
            rec_reseal(val);
            ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), -EMSGSIZE);
        }
        rec_put64(val + at[f], keep);
        rec_reseal(val);
    }
    /* The part count (60): 0, 2, the most parts and past them. */
    uint32_t counts[] = {0, 2, REMOTE_REC_PARTS_MAX, REMOTE_REC_PARTS_MAX + 1, UINT32_MAX};
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
        rec_put32(val + 60, counts[i]);
        rec_reseal(val);
        ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), -EMSGSIZE);
    }
    rec_put32(val + 60, 1);
    rec_reseal(val);
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), 0);
}
END_TEST

START_TEST(test_bad_checksums)
{
    struct remote_rec_meta got;
    for (size_t i = 0; i < REMOTE_REC_HDR; i += 5) {
        val[i] ^= 0x10;
        /* The version and header size name their refusal; any other byte is a torn header. */
        int want = i >= 4 && i < 8 ? -EPROTONOSUPPORT : -EPROTO;
        ck_assert_msg(remote_rec_check(val, vlen, &meta, &geom, 0, &got) == want, "byte %zu", i);
        val[i] ^= 0x10;
    }
    for (size_t i = REMOTE_REC_HDR; i < vlen; i += 333) {
        val[i] ^= 0x01;
        ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), -EBADMSG);
        val[i] ^= 0x01;
    }
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), 0);
    /* One part: its checksum must be the block's (a header that says otherwise is forged). */
    val[80] ^= 1;
    rec_reseal(val);
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), -EPROTO);
}
END_TEST

START_TEST(test_other_layout_key_version)
{
    struct remote_rec_meta got, want = meta;
    want.ns[3] ^= 1; /* another layout */
    ck_assert_int_eq(remote_rec_check(val, vlen, &want, &geom, 0, &got), -ESTALE);
    want = meta;
    want.key[0] ^= 1; /* another key (a collision in the key text cannot serve it) */
    ck_assert_int_eq(remote_rec_check(val, vlen, &want, &geom, 0, &got), -ESTALE);
    /* A record of another version, or another header size, or an unknown codec, or
     * reserved bytes set. */
    val[4] = 3;
    rec_reseal(val);
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), -EPROTONOSUPPORT);
    val[4] = 2;
    val[6] = 0x81; /* a header of 385 bytes (384 is 0x0180) */
    rec_reseal(val);
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), -EPROTONOSUPPORT);
    val[6] = 0x80;
    val[56] = 1;
    rec_reseal(val);
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), -EPROTONOSUPPORT);
    val[56] = 0;
    val[300] = 1;
    rec_reseal(val);
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), -EPROTONOSUPPORT);
    val[300] = 0;
    val[252] = 1; /* the zero word after the index */
    rec_reseal(val);
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), -EPROTONOSUPPORT);
    val[252] = 0;
    val[0] ^= 0xff; /* magic */
    rec_reseal(val);
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), -EPROTO);
    val[0] ^= 0xff;
    rec_reseal(val);
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, &geom, 0, &got), 0);
}
END_TEST

/* A record as kvcd wrote it before parts (version 1: a 256-byte header, its checksum at 248)
 * is refused as another version, not taken for a torn one. */
START_TEST(test_version1_refused)
{
    struct remote_rec_meta got;
    size_t n = 256 + LEN;
    uint8_t *v1 = calloc(1, n);
    ck_assert_ptr_nonnull(v1);
    rec_put32(v1, REMOTE_REC_MAGIC);
    v1[4] = 1; /* version 1 */
    v1[7] = 1; /* header of 256 bytes */
    memcpy(v1 + 16, meta.key, 16);
    rec_put64(v1 + 64, LEN);
    memcpy(v1 + 80, meta.ns, REMOTE_REC_NS_BYTES);
    rec_put64(v1 + 248, XXH3_64bits(v1, 248));
    ck_assert_int_eq(remote_rec_check(v1, n, &meta, &geom, 0, &got), -EPROTONOSUPPORT);
    /* Even one too short for this version's header. */
    ck_assert_int_eq(remote_rec_check(v1, 300, &meta, &geom, 0, &got), -EPROTONOSUPPORT);
    free(v1);
}
END_TEST

START_TEST(test_garbage_values)
{
    struct remote_rec_meta got;
    uint64_t x = 88172645463325252ull;
    for (int round = 0; round < 200; round++) {
        size_t n = (size_t)(x % (vlen + 1));
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            val[i] = (uint8_t)x;
        }
        ck_assert_int_ne(remote_rec_check(val, n, &meta, &geom, 0, &got), 0);
    }
}
END_TEST

START_TEST(test_geom)
{
    struct remote_rec_geom g;
    ck_assert_int_eq(remote_rec_geom(LEN, 0, &g), 0); /* 0: never split */
    ck_assert_uint_eq(g.count, 1);
    ck_assert_uint_eq(g.size, LEN);
    ck_assert_int_eq(remote_rec_geom(PART, PART, &g), 0); /* fits: one part */
    ck_assert_uint_eq(g.count, 1);
    ck_assert_int_eq(remote_rec_geom(PART + 1, PART, &g), 0);
    ck_assert_uint_eq(g.count, 2);
    ck_assert_uint_eq(remote_rec_part_len(&g, 0), PART);
    ck_assert_uint_eq(remote_rec_part_len(&g, 1), 1);
    ck_assert_uint_eq(remote_rec_part_off(&g, 1), PART);
    ck_assert_int_eq(remote_rec_geom(BIG, PART, &g), 0);
    ck_assert_uint_eq(g.count, 4);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < g.count; i++) {
        ck_assert_uint_eq(remote_rec_part_off(&g, i), sum);
        sum += remote_rec_part_len(&g, i);
    }
    ck_assert_uint_eq(sum, BIG);
    ck_assert_uint_eq(remote_rec_part_len(&g, 3), 8000);
    /* Part sizes below the least are refused; so are more parts than the most. */
    ck_assert_int_eq(remote_rec_geom(BIG, PART - 1, &g), -EINVAL);
    ck_assert_int_eq(remote_rec_geom(BIG, 1, &g), -EINVAL);
    ck_assert_int_eq(remote_rec_geom(1ull << 30, REMOTE_REC_PART_MIN, &g), 0);
    ck_assert_uint_eq(g.count, REMOTE_REC_PARTS_MAX);
    ck_assert_int_eq(remote_rec_geom((1ull << 30) + 1, REMOTE_REC_PART_MIN, &g), -EMSGSIZE);
    ck_assert_int_eq(remote_rec_geom(UINT64_MAX, REMOTE_REC_PART_MIN, &g), -EMSGSIZE);
    ck_assert_int_eq(remote_rec_geom(UINT64_MAX, UINT64_MAX, &g), 0);
    ck_assert_uint_eq(g.count, 1);
}
END_TEST

/* A block of BIG bytes cut in parts of PART: every part's value. */
struct parts {
    struct remote_rec_meta m;
    struct remote_rec_geom g;
    uint8_t *block;
    uint8_t *val[4];
    size_t len[4];
};

static void parts_make(struct parts *p, uint8_t seed, uint64_t parent)
{
    uint64_t xxh[4];
    rec_meta(&p->m, BIG);
    p->m.parent[0] = parent;
    ck_assert_int_eq(remote_rec_geom(BIG, PART, &p->g), 0);
    ck_assert_uint_eq(p->g.count, 4);
    p->block = malloc(BIG);
    ck_assert_ptr_nonnull(p->block);
    for (size_t i = 0; i < BIG; i++)
        p->block[i] = (uint8_t)(i * 13 + seed);
    p->m.data_xxh = remote_rec_hash(&p->g, p->block, xxh);
    ck_assert_uint_eq(p->m.data_xxh, XXH3_64bits(p->block, BIG)); /* the whole block's */
    for (uint32_t i = 0; i < 4; i++) {
        uint64_t off = remote_rec_part_off(&p->g, i), len = remote_rec_part_len(&p->g, i);
        ck_assert_uint_eq(xxh[i], XXH3_64bits(p->block + off, len)); /* the part's own */
        p->len[i] = REMOTE_REC_HDR + len;
        p->val[i] = malloc(p->len[i]);
        ck_assert_ptr_nonnull(p->val[i]);
        remote_rec_encode(p->val[i], &p->m, &p->g, i, xxh[i]);
        memcpy(p->val[i] + REMOTE_REC_HDR, p->block + off, len);
    }
}

static void parts_free(struct parts *p)
{
    free(p->block);
    for (int i = 0; i < 4; i++)
        free(p->val[i]);
}

START_TEST(test_parts_roundtrip)
{
    struct parts a;
    struct remote_rec_meta got;
    uint8_t *back = malloc(BIG);
    ck_assert_ptr_nonnull(back);
    parts_make(&a, 1, 7);
    for (uint32_t i = 0; i < 4; i++) {
        ck_assert_int_eq(remote_rec_check(a.val[i], a.len[i], &a.m, &a.g, i, &got), 0);
        ck_assert_uint_eq(got.len, BIG);
        ck_assert_uint_eq(got.data_xxh, a.m.data_xxh);
        ck_assert_uint_eq(got.parent[0], 7);
        ck_assert_int_eq(remote_rec_same_write(a.val[0], a.val[i]), 0);
        memcpy(back + remote_rec_part_off(&a.g, i), a.val[i] + REMOTE_REC_HDR,
               a.len[i] - REMOTE_REC_HDR);
    }
    ck_assert_int_eq(memcmp(back, a.block, BIG), 0);
    free(back);
    parts_free(&a);
}
END_TEST

START_TEST(test_parts_refused)
{
    struct parts a, other, older, same, moved;
    struct remote_rec_meta got, want;
    struct remote_rec_geom g;
    uint64_t px;
    parts_make(&a, 1, 7);
    /* Another part of the same block under this part's key: a full-size one names another
     * index; the short last one has another length too. */
    ck_assert_int_eq(remote_rec_check(a.val[2], a.len[2], &a.m, &a.g, 1, &got), -ESTALE);
    ck_assert_int_eq(remote_rec_check(a.val[3], a.len[3], &a.m, &a.g, 1, &got), -EMSGSIZE);
    ck_assert_int_eq(remote_rec_check(a.val[1], a.len[1], &a.m, &a.g, 3, &got), -EMSGSIZE);
    /* The same part of another block (another key, same cut). */
    parts_make(&other, 1, 7);
    other.m.key[1] ^= 0x40;
    {
        uint64_t xxh[4];
        other.m.data_xxh = remote_rec_hash(&other.g, other.block, xxh);
        remote_rec_encode(other.val[1], &other.m, &other.g, 1, xxh[1]);
    }
    ck_assert_int_eq(remote_rec_check(other.val[1], other.len[1], &a.m, &a.g, 1, &got), -ESTALE);
    /* The block cut another way (parts of 96 KiB): the cut disagrees. */
    want = a.m;
    ck_assert_int_eq(remote_rec_geom(BIG, 96u << 10, &g), 0);
    ck_assert_int_eq(remote_rec_check(a.val[0], a.len[0], &want, &g, 0, &got), -EMSGSIZE);
    /* The block in one value, read where parts are expected, and the other way round. */
    ck_assert_int_eq(remote_rec_geom(BIG, 0, &g), 0);
    ck_assert_int_eq(remote_rec_check(a.val[0], a.len[0], &want, &g, 0, &got), -EMSGSIZE);
    /* An older write of the same block with other bytes: each part is valid alone, but its
     * block header names another write, so it never joins the new parts. */
    parts_make(&older, 2, 7);
    for (uint32_t i = 0; i < 4; i++) {
        ck_assert_int_eq(remote_rec_check(older.val[i], older.len[i], &a.m, &a.g, i, &got), 0);
        ck_assert_int_eq(remote_rec_same_write(a.val[0], older.val[i]), -ESTALE);
        if (i)
            ck_assert_int_eq(remote_rec_same_write(older.val[0], a.val[i]), -ESTALE);
    }
    /* The same bytes written again: the parts are interchangeable. */
    parts_make(&same, 1, 7);
    for (uint32_t i = 0; i < 4; i++)
        ck_assert_int_eq(remote_rec_same_write(a.val[0], same.val[i]), 0);
    /* The same bytes under another parent (the key of another prefix would differ; this is a
     * forged or buggy write): another write all the same. */
    parts_make(&moved, 1, 9);
    ck_assert_int_eq(remote_rec_same_write(a.val[0], moved.val[2]), -ESTALE);
    /* A part whose bytes were swapped with the other write's: its own checksum. */
    memcpy(a.val[1] + REMOTE_REC_HDR, older.val[1] + REMOTE_REC_HDR, a.len[1] - REMOTE_REC_HDR);
    ck_assert_int_eq(remote_rec_check_header(a.val[1], a.len[1], &a.m, &a.g, 1, &got, &px), 0);
    ck_assert_int_eq(
        remote_rec_check_data(px, a.val[1] + REMOTE_REC_HDR, a.len[1] - REMOTE_REC_HDR), -EBADMSG);
    /* Forged cuts (resealed): an index past the count, a count past the most. */
    rec_put32(a.val[2] + 248, 4);
    rec_reseal(a.val[2]);
    ck_assert_int_eq(remote_rec_check(a.val[2], a.len[2], &a.m, &a.g, 2, &got), -ESTALE);
    ck_assert_int_eq(remote_rec_check(a.val[2], a.len[2], &a.m, &a.g, 4, &got), -EMSGSIZE);
    rec_put32(a.val[2] + 248, 2);
    rec_put32(a.val[2] + 60, UINT32_MAX);
    rec_reseal(a.val[2]);
    ck_assert_int_eq(remote_rec_check(a.val[2], a.len[2], &a.m, &a.g, 2, &got), -EMSGSIZE);
    parts_free(&a);
    parts_free(&other);
    parts_free(&older);
    parts_free(&same);
    parts_free(&moved);
}
END_TEST

START_TEST(test_key_and_slot)
{
    char k[REMOTE_REC_KEY_MAX];
    uint64_t key[2] = {0x0123456789abcdefull, 0xfedcba9876543210ull};
    struct remote_rec_geom g;
    ck_assert_int_eq(remote_rec_geom(LEN, 0, &g), 0);
    size_t n = remote_rec_key(k, 0xdeadbeef00000001ull, key, &g, 0);
    ck_assert_str_eq(k, "kvc2:deadbeef00000001:fedcba98765432100123456789abcdef");
    ck_assert_uint_eq(n, strlen(k));
    /* The cluster specification's vector: CRC16 of "123456789" is 0x31c3. */
    ck_assert_uint_eq(remote_rec_slot("123456789", 9), 0x31c3u & 16383u);
    ck_assert_uint_eq(remote_rec_slot("{user1000}.following", 20), remote_rec_slot("user1000", 8));
    /* An empty first tag: the whole key is hashed (CRC16-XMODEM of "foo{}{bar}" is 0x20ab;
     * redis-cli CLUSTER KEYSLOT "foo{}{bar}" says 8363). */
    ck_assert_uint_eq(remote_rec_slot("foo{}{bar}", 10), 8363u);
    ck_assert_uint_ne(remote_rec_slot("foo{}{bar}", 10), remote_rec_slot("bar", 3));
    ck_assert_uint_eq(remote_rec_slot("foo{{bar}}zap", 13), remote_rec_slot("{bar", 4));
}
END_TEST

/* Part keys: the block's key, the part size and the index, in slots spaced evenly from the
 * block key's own; the longest key fits; every slot can be named. */
START_TEST(test_part_keys)
{
    char k[REMOTE_REC_KEY_MAX], base[REMOTE_REC_KEY_MAX];
    uint64_t key[2] = {0x0123456789abcdefull, 0xfedcba9876543210ull};
    struct remote_rec_geom g, one;
    ck_assert_int_eq(remote_rec_geom(LEN, 0, &one), 0);
    size_t bn = remote_rec_key(base, 0xdeadbeef00000001ull, key, &one, 0);
    unsigned b = remote_rec_slot(base, bn);
    ck_assert_int_eq(remote_rec_geom(BIG, PART, &g), 0);
    for (uint32_t i = 0; i < g.count; i++) {
        size_t n = remote_rec_key(k, 0xdeadbeef00000001ull, key, &g, i);
        char want[REMOTE_REC_KEY_MAX];
        int wn = snprintf(want, sizeof(want), "%s:%u:%u{", base, PART, i);
        ck_assert_int_eq(strncmp(k, want, (size_t)wn), 0);
        ck_assert_int_eq(k[n - 1], '}');
        ck_assert_uint_eq(remote_rec_slot(k, n), (b + i * 16384u / g.count) % 16384u);
    }
    /* The most parts: one in every slot, each slot once. */
    static uint8_t seen[16384];
    memset(seen, 0, sizeof(seen));
    ck_assert_int_eq(remote_rec_geom(1ull << 30, REMOTE_REC_PART_MIN, &g), 0);
    for (uint32_t i = 0; i < g.count; i++) {
        size_t n = remote_rec_key(k, UINT64_MAX, key, &g, i);
        ck_assert_uint_lt(n, REMOTE_REC_KEY_MAX);
        seen[remote_rec_slot(k, n)]++;
    }
    for (uint32_t s = 0; s < 16384; s++)
        ck_assert_msg(seen[s] == 1, "slot %u: %u parts", s, seen[s]);
    /* The longest key: a 1 GiB part size and the last index. */
    ck_assert_int_eq(remote_rec_geom(UINT64_MAX / 2, 1u << 30, &g), -EMSGSIZE);
    g = (struct remote_rec_geom){.len = 16384ull << 30, .size = 1u << 30, .count = 16384};
    ck_assert_uint_lt(remote_rec_key(k, UINT64_MAX, key, &g, 16383), REMOTE_REC_KEY_MAX);
}
END_TEST

/* ---- sealed records ---------------------------------------------------------------------- */

struct sealed {
    uint8_t hdr[REMOTE_REC_HDR];   /* the plaintext header */
    uint8_t shdr[REMOTE_SEAL_HDR]; /* as it travels */
    uint8_t tag[REMOTE_SEAL_TAG];
    uint8_t *ct; /* len bytes */
    uint8_t *pt;
    uint64_t len;
};

static void seal_keys(struct remote_seal *k, uint8_t master_byte, const uint8_t *group_secret,
                      const uint8_t *ns)
{
    uint8_t master[REMOTE_SEAL_KEY_BYTES], group[REMOTE_SEAL_KEY_BYTES];
    memset(master, master_byte, sizeof(master));
    remote_seal_group(master, group_secret, group);
    remote_seal_ns(group, ns, k);
}

/* Seals part index of the block m cut as g, bytes from seed. */
static void seal_part(struct sealed *x, const struct remote_seal *k, struct remote_rec_meta *m,
                      const struct remote_rec_geom *g, uint32_t index, uint8_t seed)
{
    uint64_t pxh[8];
    uint8_t nonce[24];
    uint8_t *block = malloc(g->len);
    ck_assert_ptr_nonnull(block);
    for (uint64_t i = 0; i < g->len; i++)
        block[i] = (uint8_t)(i * 13 + seed);
    ck_assert_uint_le(g->count, 8);
    m->data_xxh = remote_rec_hash(g, block, pxh);
    x->len = remote_rec_part_len(g, index);
    x->pt = malloc(x->len);
    x->ct = malloc(x->len);
    ck_assert(x->pt && x->ct);
    memcpy(x->pt, block + remote_rec_part_off(g, index), x->len);
    remote_rec_encode(x->hdr, m, g, index, pxh[index]);
    remote_seal_nonce(nonce);
    remote_seal_part(x->shdr, x->ct, x->tag, x->hdr, x->pt, x->len, k, m, g, index, nonce);
    free(block);
}

static void sealed_free(struct sealed *x)
{
    free(x->ct);
    free(x->pt);
}

/* Opens x as a reader expecting want (index) would: 0 and the bytes back, or the error. */
static int seal_open(const struct sealed *x, const struct remote_seal *k,
                     const struct remote_rec_meta *want, const struct remote_rec_geom *g,
                     uint32_t index)
{
    uint8_t hdr[REMOTE_REC_HDR], *data = malloc(x->len);
    size_t svlen = REMOTE_SEAL_HDR + x->len + REMOTE_SEAL_TAG;
    struct remote_rec_meta got;
    uint64_t pxh;
    int rc;
    ck_assert_ptr_nonnull(data);
    memcpy(data, x->ct, x->len);
    rc = remote_seal_open_header(x->shdr, svlen, k, want, g, index, hdr);
    if (!rc)
        rc = remote_rec_check_header(hdr, REMOTE_REC_HDR + remote_rec_part_len(g, index), want, g,
                                     index, &got, &pxh);
    if (!rc)
        rc = remote_seal_open_data(x->shdr, hdr, k, data, x->len, x->tag);
    if (!rc)
        rc = remote_rec_check_data(pxh, data, x->len);
    if (!rc)
        ck_assert_int_eq(memcmp(data, x->pt, x->len), 0);
    free(data);
    return rc;
}

START_TEST(test_sealed_roundtrip)
{
    struct remote_seal k;
    struct remote_rec_meta m;
    struct remote_rec_geom g;
    struct sealed x;
    rec_meta(&m, BIG);
    ck_assert_int_eq(remote_rec_geom(BIG, PART, &g), 0);
    seal_keys(&k, 1, NULL, m.ns);
    for (uint32_t i = 0; i < g.count; i++) {
        seal_part(&x, &k, &m, &g, i, 3);
        ck_assert_int_eq(seal_open(&x, &k, &m, &g, i), 0);
        /* The bytes in the value are not the block's. */
        ck_assert_int_ne(memcmp(x.ct, x.pt, x.len < 64 ? x.len : 64), 0);
        ck_assert_ptr_null(memmem(x.shdr, sizeof(x.shdr), m.ns, 32));
        sealed_free(&x);
    }
    /* In place, as the tier opens a part in its slot. */
    rec_meta(&m, LEN);
    ck_assert_int_eq(remote_rec_geom(LEN, 0, &g), 0);
    seal_part(&x, &k, &m, &g, 0, 9);
    uint8_t hdr[REMOTE_REC_HDR];
    ck_assert_int_eq(remote_seal_open_header(x.shdr, REMOTE_SEAL_HDR + LEN + REMOTE_SEAL_TAG, &k,
                                             &m, &g, 0, hdr),
                     0);
    ck_assert_int_eq(memcmp(hdr, x.hdr, REMOTE_REC_HDR), 0);
    ck_assert_int_eq(remote_seal_open_data(x.shdr, hdr, &k, x.ct, LEN, x.tag), 0);
    ck_assert_int_eq(memcmp(x.ct, x.pt, LEN), 0);
    sealed_free(&x);
}
END_TEST

/* Every byte of the sealed header flipped, a byte of the data, of the tag: refused, and the
 * header's fields are not trusted before it opens. */
START_TEST(test_sealed_flips_refused)
{
    struct remote_seal k;
    struct remote_rec_meta m;
    struct remote_rec_geom g;
    struct sealed x;
    rec_meta(&m, LEN);
    ck_assert_int_eq(remote_rec_geom(LEN, 0, &g), 0);
    seal_keys(&k, 1, NULL, m.ns);
    seal_part(&x, &k, &m, &g, 0, 5);
    for (size_t i = 0; i < REMOTE_SEAL_HDR; i++) {
        x.shdr[i] ^= 0x01;
        int rc = seal_open(&x, &k, &m, &g, 0);
        ck_assert_msg(rc == -EPROTO || rc == -EPROTONOSUPPORT || rc == -EKEYREJECTED,
                      "header byte %zu: %d", i, rc);
        x.shdr[i] ^= 0x01;
    }
    for (size_t i = 0; i < LEN; i += 97) {
        x.ct[i] ^= 0x80;
        ck_assert_int_eq(seal_open(&x, &k, &m, &g, 0), -EKEYREJECTED);
        x.ct[i] ^= 0x80;
    }
    for (size_t i = 0; i < REMOTE_SEAL_TAG; i++) {
        x.tag[i] ^= 0x04;
        ck_assert_int_eq(seal_open(&x, &k, &m, &g, 0), -EKEYREJECTED);
        x.tag[i] ^= 0x04;
    }
    ck_assert_int_eq(seal_open(&x, &k, &m, &g, 0), 0);
    /* Lengths: short of a sealed header and tag, or not this part's. */
    uint8_t hdr[REMOTE_REC_HDR];
    ck_assert_int_eq(remote_seal_open_header(x.shdr, REMOTE_SEAL_HDR, &k, &m, &g, 0, hdr), -EPROTO);
    ck_assert_int_eq(remote_seal_open_header(x.shdr, REMOTE_SEAL_HDR + LEN + REMOTE_SEAL_TAG - 1,
                                             &k, &m, &g, 0, hdr),
                     -EMSGSIZE);
    ck_assert_int_eq(remote_seal_open_header(x.shdr, 3, &k, &m, &g, 0, hdr), -EPROTO);
    ck_assert_int_eq(remote_seal_open_header(NULL, 0, &k, &m, &g, 0, hdr), -EPROTO);
    /* An unsealed record in a sealed tier: another version. */
    ck_assert_int_eq(remote_seal_open_header(val, REMOTE_SEAL_HDR + LEN + REMOTE_SEAL_TAG, &k,
                                             &meta, &geom, 0, hdr),
                     -EPROTONOSUPPORT);
    sealed_free(&x);
}
END_TEST

/* A sealed part read where it was not written: another key, another block, another part of
 * the block, another cut, another namespace, another group, another deployment; and the
 * bytes of another write of the same part under this one's header. */
START_TEST(test_sealed_elsewhere_refused)
{
    struct remote_seal k, other;
    struct remote_rec_meta m, w;
    struct remote_rec_geom g, g2;
    struct sealed x, y;
    uint8_t gs[REMOTE_SEAL_KEY_BYTES], zero[REMOTE_SEAL_KEY_BYTES] = {0};
    rec_meta(&m, BIG);
    ck_assert_int_eq(remote_rec_geom(BIG, PART, &g), 0);
    seal_keys(&k, 1, NULL, m.ns);
    seal_part(&x, &k, &m, &g, 1, 7);
    ck_assert_int_eq(seal_open(&x, &k, &m, &g, 1), 0);
    ck_assert_int_eq(seal_open(&x, &k, &m, &g, 2), -EKEYREJECTED); /* another part's place */
    w = m;
    w.key[0] ^= 1;
    ck_assert_int_eq(seal_open(&x, &k, &w, &g, 1), -EKEYREJECTED); /* another block */
    ck_assert_int_eq(remote_rec_geom(BIG, 2 * PART, &g2), 0);
    uint8_t hdr[REMOTE_REC_HDR];
    /* Another cut: the value is not of that part's length; with a length to match, the cut
     * is bound into the tag. */
    ck_assert_int_eq(remote_seal_open_header(x.shdr, REMOTE_SEAL_HDR + x.len + REMOTE_SEAL_TAG, &k,
                                             &m, &g2, 1, hdr),
                     -EMSGSIZE);
    ck_assert_int_eq(remote_seal_open_header(
                         x.shdr, REMOTE_SEAL_HDR + remote_rec_part_len(&g2, 1) + REMOTE_SEAL_TAG,
                         &k, &m, &g2, 1, hdr),
                     -EKEYREJECTED);
    w = m;
    w.ns[5] ^= 1;
    seal_keys(&other, 1, NULL, w.ns);
    ck_assert_int_eq(seal_open(&x, &other, &w, &g, 1), -EKEYREJECTED); /* another namespace */
    ck_assert_int_eq(seal_open(&x, &k, &w, &g, 1), -EKEYREJECTED);     /* its layout, our keys */
    memset(gs, 0x42, sizeof(gs));
    seal_keys(&other, 1, gs, m.ns);
    ck_assert_int_eq(seal_open(&x, &other, &m, &g, 1), -EKEYREJECTED); /* another group */
    seal_keys(&other, 1, zero, m.ns);
    ck_assert_int_eq(seal_open(&x, &other, &m, &g, 1), -EKEYREJECTED); /* a zero group secret */
    seal_keys(&other, 2, NULL, m.ns);
    ck_assert_int_eq(seal_open(&x, &other, &m, &g, 1), -EKEYREJECTED); /* another deployment */
    /* Another write of the same part (same bytes: same plaintext header, another nonce):
     * its data under this header does not open; whole, it does. */
    w = m;
    seal_part(&y, &k, &w, &g, 1, 7);
    ck_assert_int_eq(memcmp(x.hdr, y.hdr, REMOTE_REC_HDR), 0);
    ck_assert_int_eq(seal_open(&y, &k, &m, &g, 1), 0);
    memcpy(y.shdr, x.shdr, REMOTE_SEAL_HDR);
    ck_assert_int_eq(seal_open(&y, &k, &m, &g, 1), -EKEYREJECTED);
    sealed_free(&y);
    sealed_free(&x);
}
END_TEST

/* Sealed names: "kvc3:" and 32 hex digits, the same for the same keys, another for another
 * namespace, group or deployment, never the block key; parts spread as unsealed ones. */
START_TEST(test_sealed_keys)
{
    struct remote_seal k, other;
    struct remote_rec_meta m;
    struct remote_rec_geom one, g;
    char a[REMOTE_REC_KEY_MAX], b[REMOTE_REC_KEY_MAX], hex[33];
    uint8_t gs[REMOTE_SEAL_KEY_BYTES];
    rec_meta(&m, LEN);
    ck_assert_int_eq(remote_rec_geom(LEN, 0, &one), 0);
    seal_keys(&k, 1, NULL, m.ns);
    size_t n = remote_seal_key(a, &k, m.key, &one, 0);
    ck_assert_uint_eq(n, 37);
    ck_assert_int_eq(strncmp(a, "kvc3:", 5), 0);
    ck_assert_uint_eq(strspn(a + 5, "0123456789abcdef"), 32);
    ck_assert_uint_eq(remote_seal_key(b, &k, m.key, &one, 0), n);
    ck_assert_str_eq(a, b);
    snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)m.key[0]);
    ck_assert_ptr_null(strstr(a, hex));
    memset(gs, 0x42, sizeof(gs));
    seal_keys(&other, 1, gs, m.ns);
    remote_seal_key(b, &other, m.key, &one, 0);
    ck_assert_str_ne(a, b);
    seal_keys(&other, 2, NULL, m.ns);
    remote_seal_key(b, &other, m.key, &one, 0);
    ck_assert_str_ne(a, b);
    m.ns[0] ^= 1;
    seal_keys(&other, 1, NULL, m.ns);
    remote_seal_key(b, &other, m.key, &one, 0);
    ck_assert_str_ne(a, b);
    /* Parts: the block's name, then the unsealed parts' suffix, slots spaced evenly. */
    ck_assert_int_eq(remote_rec_geom(BIG, PART, &g), 0);
    unsigned base = remote_rec_slot(a, n);
    for (uint32_t i = 0; i < g.count; i++) {
        size_t pn = remote_seal_key(b, &k, m.key, &g, i);
        ck_assert_int_eq(strncmp(a, b, n), 0);
        ck_assert_uint_eq(remote_rec_slot(b, pn), (base + i * 16384u / g.count) % 16384u);
    }
}
END_TEST

/* Secret files: only kvcd's user (or root) may read them, 32 bytes at least. */
START_TEST(test_secret_files)
{
    char dir[] = "/tmp/kvcd-seal.XXXXXX", path[256], why[512];
    uint8_t key[REMOTE_SEAL_KEY_BYTES], key2[REMOTE_SEAL_KEY_BYTES];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/k", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "0123456789abcdef0123456789abcdef", 32), 32);
    close(fd);
    ck_assert_int_eq(remote_seal_secret_load(path, key, why, sizeof(why)), 0);
    ck_assert_int_eq(remote_seal_secret_load(path, key2, why, sizeof(why)), 0);
    ck_assert_int_eq(memcmp(key, key2, sizeof(key)), 0);
    ck_assert_int_eq(chmod(path, 0640), 0);
    ck_assert_int_eq(remote_seal_secret_load(path, key, why, sizeof(why)), -EPERM);
    ck_assert_ptr_nonnull(strstr(why, "chmod 0600"));
    ck_assert_int_eq(chmod(path, 0602), 0);
    ck_assert_int_eq(remote_seal_secret_load(path, key, why, sizeof(why)), -EPERM);
    ck_assert_int_eq(chmod(path, 0400), 0);
    ck_assert_int_eq(remote_seal_secret_load(path, key, why, sizeof(why)), 0);
    ck_assert_int_eq(truncate(path, 31), 0);
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(remote_seal_secret_load(path, key, why, sizeof(why)), -EMSGSIZE);
    ck_assert_int_eq(truncate(path, REMOTE_SEAL_SECRET_MAX + 1), 0);
    ck_assert_int_eq(remote_seal_secret_load(path, key, why, sizeof(why)), -EMSGSIZE);
    ck_assert_int_eq(remote_seal_secret_load(dir, key, why, sizeof(why)), -EINVAL);
    unlink(path);
    ck_assert_int_eq(remote_seal_secret_load(path, key, why, sizeof(why)), -ENOENT);
    ck_assert_ptr_nonnull(strstr(why, path));
    rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("remote_rec");
    TCase *tc = tcase_create("remote_rec");
    tcase_add_checked_fixture(tc, rec_setup, rec_teardown);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_truncated);
    tcase_add_test(tc, test_bad_lengths);
    tcase_add_test(tc, test_bad_checksums);
    tcase_add_test(tc, test_other_layout_key_version);
    tcase_add_test(tc, test_version1_refused);
    tcase_add_test(tc, test_garbage_values);
    tcase_add_test(tc, test_geom);
    tcase_add_test(tc, test_parts_roundtrip);
    tcase_add_test(tc, test_parts_refused);
    tcase_add_test(tc, test_key_and_slot);
    tcase_add_test(tc, test_part_keys);
    tcase_add_test(tc, test_sealed_roundtrip);
    tcase_add_test(tc, test_sealed_flips_refused);
    tcase_add_test(tc, test_sealed_elsewhere_refused);
    tcase_add_test(tc, test_sealed_keys);
    tcase_add_test(tc, test_secret_files);
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
