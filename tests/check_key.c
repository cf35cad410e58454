/* check_key — chained keys: fixed vectors (the same on every machine and run), chaining,
 * namespace salt, extra bytes. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t's fields */
#include <xxhash.h>

#include "client/kvc.h"
#include "client/libkvc_internal.h"
#include "tests/lib/daemon.h"
#include "tests/lib/layout.h"

static struct kvc_wire_layout layout(const char *model, uint32_t block_tokens)
{
    struct kvc_wire_layout l = layout_fp16(model, 32, 0); /* fp16 K and V, 128 channels */
    l.kv_heads = 8;
    l.block_tokens = block_tokens;
    return l;
}

/* Vectors computed once by this implementation and frozen: a change here breaks every
 * engine's cache hits across versions, so it must be deliberate (and bump the salt tag). */
START_TEST(test_fixed_vectors)
{
    struct kvc_wire_layout l = layout("meta-llama/Llama-3-8B@main", 4);
    uint32_t tok[8] = {128000, 9906, 11, 1917, 0, 1, 2, 3};
    struct kvc_key k[2];
    uint64_t salt = kvc_layout_salt(&l);
    kvc_key_chain(salt, NULL, tok, 8, 4, NULL, 0, k, 2);
    printf("salt %016llx k0 %016llx%016llx k1 %016llx%016llx\n", (unsigned long long)salt,
           (unsigned long long)k[0].hi, (unsigned long long)k[0].lo, (unsigned long long)k[1].hi,
           (unsigned long long)k[1].lo);
    ck_assert_uint_eq(salt, 0xb6c3811ff1954c84ull);
    ck_assert_uint_eq(k[0].hi, 0x1bf68cb7e0cfd64aull);
    ck_assert_uint_eq(k[0].lo, 0x68d877458d24aeacull);
    ck_assert_uint_eq(k[1].hi, 0x3aedc6d23ec1b168ull);
    ck_assert_uint_eq(k[1].lo, 0x08f2cdc3e4df3370ull);
}
END_TEST

START_TEST(test_chaining_and_salt)
{
    struct kvc_wire_layout a = layout("m", 4), b = layout("m", 4), c = layout("m2", 4);
    uint32_t tok[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    struct kvc_key k[3], k2[3], part[1], cont[2];
    b.dtype = KVC_WIRE_DTYPE_BF16;
    kvc_key_chain(kvc_layout_salt(&a), NULL, tok, 12, 4, NULL, 0, k, 3);
    /* Continuing from the first key gives the same chain. */
    kvc_key_chain(kvc_layout_salt(&a), NULL, tok, 4, 4, NULL, 0, part, 1);
    kvc_key_chain(kvc_layout_salt(&a), &part[0], tok + 4, 8, 4, NULL, 0, cont, 2);
    ck_assert(memcmp(&k[1], &cont[0], sizeof(k[1])) == 0);
    ck_assert(memcmp(&k[2], &cont[1], sizeof(k[2])) == 0);
    /* Same tokens at a different position (another parent) give another key. */
    kvc_key_chain(kvc_layout_salt(&a), NULL, tok + 4, 4, 4, NULL, 0, k2, 1);
    ck_assert(memcmp(&k[1], &k2[0], sizeof(k2[0])) != 0);
    /* Another dtype or model: other keys. */
    kvc_key_chain(kvc_layout_salt(&b), NULL, tok, 4, 4, NULL, 0, k2, 1);
    ck_assert(memcmp(&k[0], &k2[0], sizeof(k2[0])) != 0);
    kvc_key_chain(kvc_layout_salt(&c), NULL, tok, 4, 4, NULL, 0, k2, 1);
    ck_assert(memcmp(&k[0], &k2[0], sizeof(k2[0])) != 0);
    /* Extra bytes (adapter, tenant) change the key. */
    kvc_key_chain(kvc_layout_salt(&a), NULL, tok, 4, 4, "lora-7", 6, k2, 1);
    ck_assert(memcmp(&k[0], &k2[0], sizeof(k2[0])) != 0);
    /* Never all-zero (that means "no parent"). */
    for (int i = 0; i < 3; i++)
        ck_assert((k[i].lo | k[i].hi) != 0);
}
END_TEST

/* Blocks longer than the internal buffer (256 tokens) hash all their tokens. */
START_TEST(test_long_blocks)
{
    struct kvc_wire_layout l = layout("m", 512);
    static uint32_t tok[512];
    struct kvc_key a, b;
    for (int i = 0; i < 512; i++)
        tok[i] = (uint32_t)i;
    kvc_key_chain(kvc_layout_salt(&l), NULL, tok, 512, 512, NULL, 0, &a, 1);
    tok[511] = 7;
    kvc_key_chain(kvc_layout_salt(&l), NULL, tok, 512, 512, NULL, 0, &b, 1);
    ck_assert(memcmp(&a, &b, sizeof(a)) != 0);
}
END_TEST

/* Fills 32 KiB of the stack below the caller with copies of an XXH3 state whose seed is
 * the salt, whose external secret is NULL and whose own secret is garbage, laid out so that
 * a state at any 64-byte aligned address of the stretch congruent to `shift` reads so: what
 * an uninitialised state of the next call finds when an earlier call left its seed there. */
static __attribute__((noinline)) unsigned key_stack_scribble(uint64_t salt, unsigned shift)
{
    _Alignas(64) volatile unsigned char junk[32768];
    XXH3_state_t fake;
    const size_t sz = sizeof(fake);
    memset(&fake, 0xa5, sz);
    fake.seed = salt;
    fake.extSecret = NULL;
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = ((const unsigned char *)&fake)[(i + sz - (shift * 64) % sz) % sz];
    return junk[salt % sizeof(junk)];
}

/* Regression: keys were derived from a stack state whose seed field was never initialised;
 * when it happened to equal the salt the secret was not derived and keys varied from call
 * to call (lost hits, seen in the engine's end-to-end suite). */
START_TEST(test_key_chain_dirty_stack)
{
    struct kvc_wire_layout l = layout("m", 64);
    uint64_t salt = kvc_layout_salt(&l);
    static uint32_t tok[64 * 4];
    struct kvc_key want[4], got[4];
    for (size_t i = 0; i < sizeof(tok) / sizeof(tok[0]); i++)
        tok[i] = (uint32_t)(i * 2654435761u);
    kvc_key_chain(salt, NULL, tok, 256, 64, NULL, 0, want, 4);
    for (unsigned shift = 0; shift < sizeof(XXH3_state_t) / 64; shift++) {
        key_stack_scribble(salt, shift);
        kvc_key_chain(salt, NULL, tok, 256, 64, NULL, 0, got, 4);
        ck_assert_msg(memcmp(want, got, sizeof(want)) == 0, "shift %u: other keys", shift);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("key");
    TCase *tc = tcase_create("key");
    tcase_add_test(tc, test_fixed_vectors);
    tcase_add_test(tc, test_chaining_and_salt);
    tcase_add_test(tc, test_long_blocks);
    tcase_add_test(tc, test_key_chain_dirty_stack);
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
