/*
 * check_remote_rec.c — the remote tier's record (tiers/remote_rec.h): a record round-trips;
 * every way a value from the network can be wrong is refused with its own error — shorter
 * than a header, truncated anywhere, longer than it says, a flipped bit in the header or the
 * data, another magic, version, layout or key, a length over the caller's limit — and a
 * header's length field is never trusted before the header checksum. Keys and slots: the key
 * text, and the cluster's slot hash on its published test vector and on hash tags.
 */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "tiers/remote_rec.h"

#define LEN 4096u

static uint8_t *val;
static size_t vlen;
static struct remote_rec_meta meta;

static void rec_setup(void)
{
    memset(&meta, 0, sizeof(meta));
    meta.key[0] = 0x1122334455667788ull;
    meta.key[1] = 0x99aabbccddeeff00ull;
    meta.parent[0] = 7;
    meta.parent[1] = 8;
    meta.depth = 3;
    meta.format = 0;
    meta.codec = REMOTE_REC_CODEC_RAW;
    meta.len = LEN;
    for (size_t i = 0; i < REMOTE_REC_NS_BYTES; i++)
        meta.ns[i] = (uint8_t)(i * 7 + 1);
    vlen = REMOTE_REC_HDR + LEN;
    val = malloc(vlen + 64);
    ck_assert_ptr_nonnull(val);
    for (size_t i = 0; i < LEN; i++)
        val[REMOTE_REC_HDR + i] = (uint8_t)(i * 31 + 5);
    remote_rec_encode(val, &meta, val + REMOTE_REC_HDR);
}

static void rec_teardown(void)
{
    free(val);
}

/* Rewrites the header checksum after an edit, so the check under test is the one that
 * fires (a forger who knows the format can do this; the field checks must still hold). */
static void rec_reseal(void)
{
    uint64_t h = XXH3_64bits(val, REMOTE_REC_HDR - 8);
    memcpy(val + REMOTE_REC_HDR - 8, &h, 8);
}

START_TEST(test_roundtrip)
{
    struct remote_rec_meta got;
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, LEN, &got), 0);
    ck_assert_uint_eq(got.len, LEN);
    ck_assert_uint_eq(got.depth, 3);
    ck_assert_uint_eq(got.parent[0], 7);
    ck_assert_uint_eq(got.parent[1], 8);
    ck_assert_uint_eq(got.key[1], meta.key[1]);
    ck_assert_int_eq(memcmp(got.ns, meta.ns, REMOTE_REC_NS_BYTES), 0);
    /* A bigger limit is fine; a smaller one is not. */
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, LEN * 2, &got), 0);
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, LEN - 1, &got), -EMSGSIZE);
}
END_TEST

START_TEST(test_truncated)
{
    struct remote_rec_meta got;
    ck_assert_int_eq(remote_rec_check(NULL, 0, &meta, LEN, &got), -EPROTO);
    ck_assert_int_eq(remote_rec_check(val, 0, &meta, LEN, &got), -EPROTO);
    for (size_t n = 1; n < vlen; n += (n < REMOTE_REC_HDR + 8 ? 1 : 97)) {
        int rc = remote_rec_check(val, n, &meta, LEN, &got);
        ck_assert_msg(rc == (n < REMOTE_REC_HDR ? -EPROTO : -EMSGSIZE), "len %zu: %d", n, rc);
    }
    /* Longer than it says (a value with trailing bytes). */
    ck_assert_int_eq(remote_rec_check(val, vlen + 1, &meta, LEN + 1, &got), -EMSGSIZE);
}
END_TEST

START_TEST(test_bad_lengths)
{
    struct remote_rec_meta got;
    uint64_t lens[] = {0,         LEN - 1, LEN + 1, UINT64_MAX, UINT64_MAX - REMOTE_REC_HDR + 1,
                       1ull << 63};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        memcpy(val + 64, &lens[i], 8);
        /* Not resealed: the header checksum refuses it before the length is read. */
        ck_assert_int_eq(remote_rec_check(val, vlen, &meta, UINT64_MAX, &got), -EPROTO);
        rec_reseal();
        ck_assert_int_eq(remote_rec_check(val, vlen, &meta, UINT64_MAX, &got), -EMSGSIZE);
    }
}
END_TEST

START_TEST(test_bad_checksums)
{
    struct remote_rec_meta got;
    for (size_t i = 0; i < REMOTE_REC_HDR; i += 5) {
        val[i] ^= 0x10;
        ck_assert_msg(remote_rec_check(val, vlen, &meta, LEN, &got) == -EPROTO, "byte %zu", i);
        val[i] ^= 0x10;
    }
    for (size_t i = REMOTE_REC_HDR; i < vlen; i += 333) {
        val[i] ^= 0x01;
        ck_assert_int_eq(remote_rec_check(val, vlen, &meta, LEN, &got), -EBADMSG);
        val[i] ^= 0x01;
    }
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, LEN, &got), 0);
}
END_TEST

START_TEST(test_other_layout_key_version)
{
    struct remote_rec_meta got, want = meta;
    want.ns[3] ^= 1; /* another layout */
    ck_assert_int_eq(remote_rec_check(val, vlen, &want, LEN, &got), -ESTALE);
    want = meta;
    want.key[0] ^= 1; /* another key (a collision in the key text cannot serve it) */
    ck_assert_int_eq(remote_rec_check(val, vlen, &want, LEN, &got), -ESTALE);
    /* A record of another version, or another header size, or an unknown codec. */
    val[4] = 2;
    rec_reseal();
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, LEN, &got), -EPROTONOSUPPORT);
    val[4] = 1;
    val[6] = 1; /* a header of 257 bytes (256 is 0x0100: bytes 6 and 7 read 0, 1) */
    rec_reseal();
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, LEN, &got), -EPROTONOSUPPORT);
    val[6] = 0;
    val[7] = 2;
    rec_reseal();
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, LEN, &got), -EPROTONOSUPPORT);
    val[7] = 1;
    val[56] = 1;
    rec_reseal();
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, LEN, &got), -EPROTONOSUPPORT);
    val[56] = 0;
    val[0] ^= 0xff; /* magic */
    rec_reseal();
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, LEN, &got), -EPROTO);
    val[0] ^= 0xff;
    rec_reseal();
    ck_assert_int_eq(remote_rec_check(val, vlen, &meta, LEN, &got), 0);
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
        ck_assert_int_ne(remote_rec_check(val, n, &meta, LEN, &got), 0);
    }
}
END_TEST

START_TEST(test_key_and_slot)
{
    char k[REMOTE_REC_KEY_MAX];
    uint64_t key[2] = {0x0123456789abcdefull, 0xfedcba9876543210ull};
    size_t n = remote_rec_key(k, 0xdeadbeef00000001ull, key);
    ck_assert_str_eq(k, "kvc1:deadbeef00000001:fedcba98765432100123456789abcdef");
    ck_assert_uint_eq(n, strlen(k));
    ck_assert_uint_lt(n, REMOTE_REC_KEY_MAX);
    /* The cluster specification's vector: CRC16 of "123456789" is 0x31c3. */
    ck_assert_uint_eq(remote_rec_slot("123456789", 9), 0x31c3u & 16383u);
    ck_assert_uint_eq(remote_rec_slot("{user1000}.following", 20), remote_rec_slot("user1000", 8));
    ck_assert_uint_eq(remote_rec_slot("foo{}{bar}", 10), remote_rec_slot("foo{}{bar}", 10));
    ck_assert_uint_ne(remote_rec_slot("foo{}{bar}", 10), remote_rec_slot("bar", 3));
    ck_assert_uint_eq(remote_rec_slot("foo{{bar}}zap", 13), remote_rec_slot("{bar", 4));
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
    tcase_add_test(tc, test_garbage_values);
    tcase_add_test(tc, test_key_and_slot);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
