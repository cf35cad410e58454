/* check_proto — the daemon's request decoder: every shape accepted, every malformed or
 * truncated variant refused with the right class of error, a key repeated within a batch
 * refused, and a mutation loop that throws 200k corrupted messages at it (under ASan in make
 * check). */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvc_fast.h"
#include "daemon/proto.h"
#include "policies/policy.h"
#include "tests/lib/daemon.h"

static uint64_t buf[(KVC_PROTO_MAX_MSG + 64) / 8];

static size_t msg(uint16_t op, const void *body, size_t blen, const void *tail, size_t tlen)
{
    struct kvc_msg_hdr *h = (struct kvc_msg_hdr *)buf;
    *h = (struct kvc_msg_hdr){.magic = KVC_PROTO_MAGIC,
                              .version = KVC_PROTO_VERSION,
                              .opcode = op,
                              .req_id = 7,
                              .len = (uint32_t)(blen + tlen)};
    memcpy(h + 1, body, blen);
    if (tlen)
        memcpy((char *)(h + 1) + blen, tail, tlen);
    return sizeof(*h) + blen + tlen;
}

static int decode(size_t n)
{
    struct proto_req r;
    const char *why;
    return proto_decode(buf, n, &r, &why);
}

static struct kvc_wire_key keys[KVC_PROTO_MAX_KEYS + 1];

/* Distinct keys, as a chain has: a repeated key is refused (test_duplicate_keys). */
static void keys_init(void)
{
    for (uint32_t i = 0; i <= KVC_PROTO_MAX_KEYS; i++)
        keys[i] = (struct kvc_wire_key){.lo = 0x9e3779b97f4a7c15ull * (i + 1), .hi = i};
}

static size_t lookup_msg(uint32_t nkeys, uint32_t ntail)
{
    struct kvc_lookup_req q = {.ns_id = 1, .nkeys = nkeys};
    return msg(KVC_OP_LOOKUP, &q, sizeof(q), keys, ntail * sizeof(keys[0]));
}

START_TEST(test_every_opcode_accepted)
{
    struct proto_req r;
    const char *why;
    struct kvc_hello_req hello = {.min_version = 1, .max_version = 1};
    struct kvc_ns_open_req nso;
    struct kvc_reserve_req res = {.ns_id = 1, .nkeys = 3};
    struct kvc_release_req rel = {.nleases = 2};
    uint64_t ids[2] = {1, 2};
    struct kvc_commit_req com = {.resv_id = 5, .ncommit = 1};
    struct kvc_abort_req ab = {.resv_id = 5};
    struct kvc_stats_req sta = {.scope = 0};
    struct kvc_ns_list_req nsl = {.cursor = 0};
    struct kvc_block_list_req bl = {.ns_id = 1, .max = 10};
    memset(&nso, 0, sizeof(nso));
    ck_assert_int_eq(decode(msg(KVC_OP_HELLO, &hello, sizeof(hello), NULL, 0)), 0);
    ck_assert_int_eq(decode(msg(KVC_OP_NS_OPEN, &nso, sizeof(nso), NULL, 0)), 0);
    ck_assert_int_eq(proto_decode(buf, lookup_msg(5, 5), &r, &why), 0);
    ck_assert_uint_eq(r.ntail, 5);
    ck_assert_ptr_eq(r.tail, (char *)buf + sizeof(struct kvc_msg_hdr) + sizeof(struct kvc_lookup_req));
    ck_assert_int_eq(decode(msg(KVC_OP_RESERVE, &res, sizeof(res), keys, 3 * sizeof(keys[0]))), 0);
    ck_assert_int_eq(decode(msg(KVC_OP_RELEASE, &rel, sizeof(rel), ids, sizeof(ids))), 0);
    ck_assert_int_eq(decode(msg(KVC_OP_COMMIT, &com, sizeof(com), NULL, 0)), 0);
    ck_assert_int_eq(decode(msg(KVC_OP_ABORT, &ab, sizeof(ab), NULL, 0)), 0);
    ck_assert_int_eq(decode(msg(KVC_OP_STATS, &sta, sizeof(sta), NULL, 0)), 0);
    ck_assert_int_eq(decode(msg(KVC_OP_NS_LIST, &nsl, sizeof(nsl), NULL, 0)), 0);
    ck_assert_int_eq(decode(msg(KVC_OP_BLOCK_LIST, &bl, sizeof(bl), NULL, 0)), 0);
    ck_assert_int_eq(decode(lookup_msg(KVC_PROTO_MAX_KEYS, KVC_PROTO_MAX_KEYS)), 0);
}
END_TEST

START_TEST(test_garbage_closes)
{
    struct kvc_msg_hdr *h = (struct kvc_msg_hdr *)buf;
    size_t n = lookup_msg(1, 1);
    ck_assert_int_eq(decode(0), -EPROTO);
    ck_assert_int_eq(decode(sizeof(*h) - 1), -EPROTO); /* truncated header */
    h->magic ^= 1;
    ck_assert_int_eq(decode(n), -EPROTO);
    n = lookup_msg(1, 1);
    h->version = 2;
    ck_assert_int_eq(decode(n), -EPROTO);
}
END_TEST

START_TEST(test_bad_payload_replies)
{
    struct kvc_msg_hdr *h = (struct kvc_msg_hdr *)buf;
    size_t n = lookup_msg(4, 4);
    ck_assert_int_eq(decode(n - 1), -EBADMSG);  /* truncated payload */
    h->len += 16;
    ck_assert_int_eq(decode(n), -EBADMSG); /* header claims more than arrived */
    ck_assert_int_eq(decode(lookup_msg(4, 3)), -EBADMSG); /* count says 4, 3 present */
    ck_assert_int_eq(decode(lookup_msg(3, 4)), -EBADMSG); /* trailing bytes */
    ck_assert_int_eq(decode(lookup_msg(0, 0)), -EINVAL);
    ck_assert_int_eq(decode(lookup_msg(KVC_PROTO_MAX_KEYS + 1, 1)), -E2BIG);
    ck_assert_int_eq(decode(lookup_msg(UINT32_MAX, 1)), -E2BIG);
    n = lookup_msg(1, 1);
    ((struct kvc_lookup_req *)(h + 1))->flags = 0x80; /* a flag no daemon knows */
    ck_assert_int_eq(decode(n), -EINVAL);
    /* The lookup's flag word is the engine's too (its own bits, ENGINE_LOOKUP_F_DEFER,
     * _WHOLE and _DEFER_MOVES, at the top): every bit past the wire's four is refused, so a
     * client never sets the daemon's own; the four (NOWAIT among them) are taken. */
    for (uint32_t bit = 0; bit < 32; bit++) {
        n = lookup_msg(1, 1);
        ((struct kvc_lookup_req *)(h + 1))->flags = 1u << bit;
        ck_assert_int_eq(decode(n), bit < 4 ? 0 : -EINVAL);
    }
    ck_assert_uint_eq(KVC_LOOKUP_F_READY_ONLY | KVC_LOOKUP_F_GPU | KVC_LOOKUP_F_LOCAL |
                          KVC_LOOKUP_F_NOWAIT,
                      0xfu);
    n = lookup_msg(1, 1);
    h->status = -5;
    ck_assert_int_eq(decode(n), -EINVAL);
    n = lookup_msg(1, 1);
    h->opcode = 0;
    ck_assert_int_eq(decode(n), -EOPNOTSUPP);
    h->opcode = 999;
    ck_assert_int_eq(decode(n), -EOPNOTSUPP);
    struct kvc_commit_req com = {.resv_id = 1};
    ck_assert_int_eq(decode(msg(KVC_OP_COMMIT, &com, sizeof(com) - 4, NULL, 0)), -EBADMSG);
    struct kvc_block_list_req bl = {.ns_id = 1, .max = 0};
    ck_assert_int_eq(decode(msg(KVC_OP_BLOCK_LIST, &bl, sizeof(bl), NULL, 0)), -EINVAL);
}
END_TEST

/* HINT: a batch of (key, score); kind, pad and every score checked. */
static struct kvc_wire_hint hints[KVC_PROTO_MAX_KEYS + 1];

static size_t hint_msg(uint32_t kind, uint32_t nhints, uint32_t ntail)
{
    struct kvc_hint_req q = {.ns_id = 1, .kind = kind, .nhints = nhints};
    return msg(KVC_OP_HINT, &q, sizeof(q), hints, ntail * sizeof(hints[0]));
}

START_TEST(test_hint)
{
    struct proto_req r;
    const char *why;
    memset(hints, 0, sizeof(hints));
    for (int i = 0; i <= (int)KVC_PROTO_MAX_KEYS; i++)
        hints[i].key = keys[i];
    for (int i = 0; i < 4; i++)
        hints[i].score = (float)i;
    ck_assert_int_eq(proto_decode(buf, hint_msg(KVC_HINT_H2O, 4, 4), &r, &why), 0);
    ck_assert_uint_eq(r.ntail, 4);
    ck_assert_int_eq(decode(hint_msg(KVC_HINT_SNAPKV, 4, 4)), 0);
    ck_assert_int_eq(decode(hint_msg(KVC_HINT_H2O, KVC_PROTO_MAX_KEYS, KVC_PROTO_MAX_KEYS)), 0);
    ck_assert_int_eq(decode(hint_msg(0, 4, 4)), -EINVAL);          /* unknown kind */
    ck_assert_int_eq(decode(hint_msg(3, 4, 4)), -EINVAL);
    ck_assert_int_eq(decode(hint_msg(KVC_HINT_H2O, 0, 0)), -EINVAL); /* empty */
    ck_assert_int_eq(decode(hint_msg(KVC_HINT_H2O, 5, 4)), -EBADMSG); /* count past the tail */
    ck_assert_int_eq(decode(hint_msg(KVC_HINT_H2O, 3, 4)), -EBADMSG);
    ck_assert_int_eq(decode(hint_msg(KVC_HINT_H2O, KVC_PROTO_MAX_KEYS + 1, 1)), -E2BIG);
    hints[2].score = -1.0f;
    ck_assert_int_eq(decode(hint_msg(KVC_HINT_H2O, 4, 4)), -EINVAL); /* negative score */
    hints[2].score = __builtin_nanf("");
    ck_assert_int_eq(decode(hint_msg(KVC_HINT_H2O, 4, 4)), -EINVAL); /* NaN */
    hints[2].score = __builtin_inff();
    ck_assert_int_eq(decode(hint_msg(KVC_HINT_H2O, 4, 4)), -EINVAL); /* inf */
    hints[2].score = 1.0f;
    hints[3].pad = 1;
    ck_assert_int_eq(decode(hint_msg(KVC_HINT_H2O, 4, 4)), -EINVAL); /* reserved */
    hints[3].pad = 0;
    struct kvc_hint_req q = {.ns_id = 1, .kind = KVC_HINT_H2O, .nhints = 1, .pad = 1};
    ck_assert_int_eq(decode(msg(KVC_OP_HINT, &q, sizeof(q), hints, sizeof(hints[0]))), -EINVAL);
    ck_assert_int_eq(decode(msg(KVC_OP_HINT, &q, sizeof(q) - 4, NULL, 0)), -EBADMSG);
}
END_TEST

/* HINT_HEADS: keys, then nhints * layers * heads floats; every count validated. */
static size_t hint_heads_msg(const struct kvc_hint_heads_req *q, uint32_t nkeys, uint64_t nf,
                             const float *v)
{
    static uint8_t tail[KVC_PROTO_MAX_MSG];
    memcpy(tail, keys, nkeys * sizeof(keys[0]));
    memcpy(tail + nkeys * sizeof(keys[0]), v, nf * sizeof(float));
    return msg(KVC_OP_HINT_HEADS, q, sizeof(*q), tail,
               nkeys * sizeof(keys[0]) + nf * sizeof(float));
}

START_TEST(test_hint_heads)
{
    struct proto_req r;
    const char *why;
    static float v[4096];
    struct kvc_hint_heads_req q = {
        .ns_id = 1, .kind = KVC_HINT_H2O, .nhints = 3, .layers = 2, .heads = 4};
    for (int i = 0; i < 4096; i++)
        v[i] = (float)(i % 7);
    ck_assert_int_eq(proto_decode(buf, hint_heads_msg(&q, 3, 24, v), &r, &why), 0);
    ck_assert_uint_eq(r.ntail, 3);
    ck_assert_uint_eq(r.ntail2, 24);
    ck_assert_ptr_eq(r.tail2, (const char *)r.tail + 3 * sizeof(keys[0]));
    ck_assert(memcmp(r.tail2, v, 24 * sizeof(float)) == 0);
    /* lengths: a float short, a float over, a key short */
    ck_assert_int_eq(decode(hint_heads_msg(&q, 3, 23, v)), -EBADMSG);
    ck_assert_int_eq(decode(hint_heads_msg(&q, 3, 25, v)), -EBADMSG);
    ck_assert_int_eq(decode(hint_heads_msg(&q, 2, 24, v)), -EBADMSG);
    ck_assert_int_eq(decode(msg(KVC_OP_HINT_HEADS, &q, sizeof(q) - 4, NULL, 0)), -EBADMSG);
    /* counts: none, zero heads or layers, over the bounds, a product that wraps 32 bits */
    q.nhints = 0;
    ck_assert_int_eq(decode(hint_heads_msg(&q, 0, 0, v)), -EINVAL);
    q.nhints = 1;
    q.heads = 0;
    ck_assert_int_eq(decode(hint_heads_msg(&q, 1, 0, v)), -EINVAL);
    q.heads = 4;
    q.layers = 0;
    ck_assert_int_eq(decode(hint_heads_msg(&q, 1, 0, v)), -EINVAL);
    q.layers = KVC_PROTO_MAX_HINT_HEADS / 4 + 1;
    ck_assert_int_eq(decode(hint_heads_msg(&q, 1, 0, v)), -E2BIG);
    q.layers = 0x10000;
    q.heads = 0x10000; /* 2^32: zero in 32 bits */
    ck_assert_int_eq(decode(hint_heads_msg(&q, 1, 0, v)), -E2BIG);
    q.layers = 2;
    q.heads = 4;
    q.nhints = KVC_PROTO_MAX_KEYS + 1;
    ck_assert_int_eq(decode(hint_heads_msg(&q, 1, 8, v)), -E2BIG);
    q.nhints = 1;
    /* scores, kind, reserved field, keys */
    v[5] = -1.0f;
    ck_assert_int_eq(decode(hint_heads_msg(&q, 1, 8, v)), -EINVAL);
    v[5] = __builtin_nanf("");
    ck_assert_int_eq(decode(hint_heads_msg(&q, 1, 8, v)), -EINVAL);
    v[5] = __builtin_inff();
    ck_assert_int_eq(decode(hint_heads_msg(&q, 1, 8, v)), -EINVAL);
    v[5] = 3.0e38f; /* finite, but summed into the head masses it would make them infinite */
    ck_assert_int_eq(decode(hint_heads_msg(&q, 1, 8, v)), -EINVAL);
    v[5] = nextafterf(KVC_PROTO_MAX_HINT_SCORE, 2e9f);
    ck_assert_int_eq(decode(hint_heads_msg(&q, 1, 8, v)), -EINVAL);
    v[5] = KVC_PROTO_MAX_HINT_SCORE;
    ck_assert_int_eq(decode(hint_heads_msg(&q, 1, 8, v)), 0);
    v[5] = 1.0f;
    ck_assert_int_eq(decode(hint_heads_msg(&q, 1, 8, v)), 0);
    q.kind = 3;
    ck_assert_int_eq(decode(hint_heads_msg(&q, 1, 8, v)), -EINVAL);
    q.kind = KVC_HINT_SNAPKV;
    q.pad = 1;
    ck_assert_int_eq(decode(hint_heads_msg(&q, 1, 8, v)), -EINVAL);
    q.pad = 0;
    q.nhints = 2;
    keys[1] = keys[0];
    ck_assert_int_eq(decode(hint_heads_msg(&q, 2, 16, v)), -EINVAL); /* repeated key */
    keys_init();
}
END_TEST

/* LOOKUP_BUDGET: keys, then qdim floats; both counts bound the length exactly. */
static size_t budget_msg(const struct kvc_lookup_budget_req *q, uint32_t nkeys, uint32_t nq,
                         const float *v)
{
    static uint8_t tail[KVC_PROTO_MAX_MSG];
    memcpy(tail, keys, nkeys * sizeof(keys[0]));
    if (nq)
        memcpy(tail + nkeys * sizeof(keys[0]), v, nq * sizeof(float));
    return msg(KVC_OP_LOOKUP_BUDGET, q, sizeof(*q), tail, nkeys * sizeof(keys[0]) + nq * sizeof(float));
}

START_TEST(test_lookup_budget)
{
    struct proto_req r;
    const char *why;
    static float v[KVC_PROTO_MAX_QDIM + 1];
    struct kvc_lookup_budget_req q = {.ns_id = 1, .nkeys = 6, .budget = 3,
                                      .policy = KVC_POLICY_NS, .sinks = 1, .recent = 2};
    for (int i = 0; i < 8; i++)
        v[i] = (float)i - 3.5f;
    ck_assert_int_eq(proto_decode(buf, budget_msg(&q, 6, 0, v), &r, &why), 0);
    ck_assert_uint_eq(r.ntail, 6);
    ck_assert_ptr_null(r.tail2);
    q.qdim = 8;
    q.policy = POLICY_QUEST;
    ck_assert_int_eq(proto_decode(buf, budget_msg(&q, 6, 8, v), &r, &why), 0);
    ck_assert_uint_eq(r.ntail2, 8);
    ck_assert(memcmp(r.tail2, v, 8 * sizeof(float)) == 0);
    ck_assert_ptr_eq(r.tail2, (const char *)r.tail + 6 * sizeof(keys[0]));
    ck_assert_int_eq(decode(budget_msg(&q, 6, 7, v)), -EBADMSG); /* query shorter */
    ck_assert_int_eq(decode(budget_msg(&q, 6, 9, v)), -EBADMSG); /* longer */
    ck_assert_int_eq(decode(budget_msg(&q, 5, 8, v)), -EBADMSG); /* a key missing */
    v[3] = __builtin_nanf("");
    ck_assert_int_eq(decode(budget_msg(&q, 6, 8, v)), -EINVAL); /* non-finite query */
    v[3] = 0.5f;
    q.qdim = KVC_PROTO_MAX_QDIM + 1;
    ck_assert_int_eq(decode(budget_msg(&q, 6, 8, v)), -E2BIG);
    q.qdim = 0;
    q.nkeys = KVC_PROTO_MAX_KEYS + 1;
    ck_assert_int_eq(decode(budget_msg(&q, 6, 0, v)), -E2BIG);
    q.nkeys = 0;
    ck_assert_int_eq(decode(budget_msg(&q, 0, 0, v)), -EINVAL); /* empty */
    q.nkeys = 6;
    q.budget = 0;
    ck_assert_int_eq(decode(budget_msg(&q, 6, 0, v)), -EINVAL);
    q.budget = 3;
    q.policy = POLICY_KIND_COUNT;
    ck_assert_int_eq(decode(budget_msg(&q, 6, 0, v)), -EINVAL); /* unknown policy */
    q.policy = KVC_POLICY_NS;
    q.flags = KVC_BUDGET_F_HEADS; /* per-head budgets */
    ck_assert_int_eq(decode(budget_msg(&q, 6, 0, v)), 0);
    q.flags = 2;
    ck_assert_int_eq(decode(budget_msg(&q, 6, 0, v)), -EINVAL); /* reserved */
    q.flags = KVC_BUDGET_F_HEADS | 4;
    ck_assert_int_eq(decode(budget_msg(&q, 6, 0, v)), -EINVAL);
    q.flags = 0;
    ck_assert_int_eq(decode(msg(KVC_OP_LOOKUP_BUDGET, &q, sizeof(q) - 8, NULL, 0)), -EBADMSG);
    /* the largest request fits in a message */
    q.nkeys = KVC_PROTO_MAX_KEYS;
    q.qdim = KVC_PROTO_MAX_QDIM;
    memset(v, 0, sizeof(v));
    ck_assert_int_eq(decode(budget_msg(&q, KVC_PROTO_MAX_KEYS, KVC_PROTO_MAX_QDIM, v)), 0);
}
END_TEST

/* Regression (fuzz_server, tests/fuzz/crashes/server-zero-key-in-chain): an all-zero key, which
 * means "no parent", is refused as a block's key in every batch of keys; one half zero is a
 * key like any other. */
START_TEST(test_zero_key_refused)
{
    struct proto_req r;
    const char *why;
    struct kvc_reserve_req res = {.ns_id = 1, .nkeys = 3};
    struct kvc_lookup_budget_req bq = {.ns_id = 1, .nkeys = 3, .budget = 2,
                                       .policy = KVC_POLICY_NS};
    struct kvc_wire_key saved = keys[1];
    keys[1] = (struct kvc_wire_key){.lo = 0, .hi = 0};
    ck_assert_int_eq(proto_decode(buf, lookup_msg(3, 3), &r, &why), -EINVAL);
    ck_assert_str_eq(why, "an all-zero key (it means no parent)");
    ck_assert_int_eq(decode(msg(KVC_OP_RESERVE, &res, sizeof(res), keys, 3 * sizeof(keys[0]))),
                     -EINVAL);
    ck_assert_int_eq(decode(msg(KVC_OP_LOOKUP_BUDGET, &bq, sizeof(bq), keys, 3 * sizeof(keys[0]))),
                     -EINVAL);
    memset(hints, 0, sizeof(hints));
    for (int i = 0; i < 3; i++)
        hints[i].key = keys[i];
    ck_assert_int_eq(proto_decode(buf, hint_msg(KVC_HINT_H2O, 3, 3), &r, &why), -EINVAL);
    ck_assert_int_eq(decode(lookup_msg(1, 1)), 0); /* keys[0] alone is fine */
    keys[1] = (struct kvc_wire_key){.lo = 0, .hi = 5};
    ck_assert_int_eq(decode(lookup_msg(3, 3)), 0);
    keys[1] = saved;
    ck_assert_int_eq(decode(lookup_msg(3, 3)), 0);
}
END_TEST

/* A batch naming one key twice is refused (the pin flood that repeated one key 2048 times in
 * one LOOKUP); keys that differ in one half only are distinct. */
START_TEST(test_duplicate_keys)
{
    struct proto_req r;
    const char *why;
    struct kvc_reserve_req res = {.ns_id = 1, .nkeys = 5};
    struct kvc_lookup_budget_req bq = {.ns_id = 1, .nkeys = 5, .budget = 2,
                                       .policy = KVC_POLICY_NS};
    struct kvc_wire_key saved = keys[3];
    ck_assert_int_eq(proto_decode(buf, lookup_msg(5, 5), &r, &why), 0);
    ck_assert(!r.dup_key);
    keys[3] = keys[1];
    ck_assert_int_eq(proto_decode(buf, lookup_msg(5, 5), &r, &why), -EINVAL);
    ck_assert(r.dup_key);
    ck_assert_str_eq(why, "a key repeated within the batch");
    ck_assert_int_eq(decode(msg(KVC_OP_RESERVE, &res, sizeof(res), keys, 5 * sizeof(keys[0]))),
                     -EINVAL);
    ck_assert_int_eq(decode(msg(KVC_OP_LOOKUP_BUDGET, &bq, sizeof(bq), keys, 5 * sizeof(keys[0]))),
                     -EINVAL);
    memset(hints, 0, sizeof(hints));
    for (int i = 0; i < 5; i++)
        hints[i].key = keys[i];
    ck_assert_int_eq(proto_decode(buf, hint_msg(KVC_HINT_H2O, 5, 5), &r, &why), -EINVAL);
    ck_assert(r.dup_key);
    keys[3] = saved;
    /* The same key 2048 times, the largest batch, the hashed path (more than 8 keys). */
    for (uint32_t i = 0; i < KVC_PROTO_MAX_KEYS; i++)
        keys[i] = keys[KVC_PROTO_MAX_KEYS];
    ck_assert_int_eq(decode(lookup_msg(KVC_PROTO_MAX_KEYS, KVC_PROTO_MAX_KEYS)), -EINVAL);
    keys_init();
    ck_assert_int_eq(decode(lookup_msg(KVC_PROTO_MAX_KEYS, KVC_PROTO_MAX_KEYS)), 0);
    keys[KVC_PROTO_MAX_KEYS - 1] = keys[0]; /* the last repeats the first */
    ck_assert_int_eq(decode(lookup_msg(KVC_PROTO_MAX_KEYS, KVC_PROTO_MAX_KEYS)), -EINVAL);
    keys_init();
    /* Equal low halves, or equal high halves, are different keys. */
    for (uint32_t i = 0; i < 64; i++)
        keys[i] = (struct kvc_wire_key){.lo = i < 32 ? 7 : i, .hi = i < 32 ? i : 7};
    ck_assert(!proto_keys_repeat(keys, 64, sizeof(keys[0])));
    ck_assert_int_eq(decode(lookup_msg(64, 64)), 0);
    ck_assert(!proto_keys_repeat(keys, 1, sizeof(keys[0])));
    ck_assert(!proto_keys_repeat(keys, 0, sizeof(keys[0])));
    keys[40] = keys[33];
    ck_assert(proto_keys_repeat(keys, 64, sizeof(keys[0])));
    ck_assert(proto_keys_repeat(keys, 41, sizeof(keys[0])));
    ck_assert(!proto_keys_repeat(keys, 40, sizeof(keys[0])));
    keys_init();
    /* RELEASE may name a lease twice (the second is simply not found): not a key batch. */
    uint64_t ids[2] = {5, 5};
    struct kvc_release_req rel = {.nleases = 2};
    ck_assert_int_eq(decode(msg(KVC_OP_RELEASE, &rel, sizeof(rel), ids, sizeof(ids))), 0);
}
END_TEST

/* NS_DROP: an admin request with the shared admin body. */
START_TEST(test_ns_drop)
{
    struct kvc_admin_req q;
    memset(&q, 0, sizeof(q));
    q.scope = 3;
    ck_assert_int_eq(decode(msg(KVC_OP_NS_DROP, &q, sizeof(q), NULL, 0)), 0);
    ck_assert_int_eq(proto_op_admin(KVC_OP_NS_DROP), 1);
    ck_assert_str_eq(proto_op_name(KVC_OP_NS_DROP), "NS_DROP");
    ck_assert_int_eq(decode(msg(KVC_OP_NS_DROP, &q, sizeof(q) - 8, NULL, 0)), -EBADMSG);
    memset(q.key, 'k', sizeof(q.key));
    ck_assert_int_eq(decode(msg(KVC_OP_NS_DROP, &q, sizeof(q), NULL, 0)), -EINVAL);
}
END_TEST

START_TEST(test_fast_attach)
{
    struct kvc_fast_attach_req q = {.what = KVC_FAST_INDEX, .arena_id = 3};
    ck_assert_int_eq(decode(msg(KVC_OP_FAST_ATTACH, &q, sizeof(q), NULL, 0)), 0);
    ck_assert_int_eq(proto_op_admin(KVC_OP_FAST_ATTACH), 0);
    ck_assert_str_eq(proto_op_name(KVC_OP_FAST_ATTACH), "FAST_ATTACH");
    ck_assert_int_eq(decode(msg(KVC_OP_FAST_ATTACH, &q, sizeof(q) - 4, NULL, 0)), -EBADMSG);
    struct {
        struct kvc_fast_attach_req q;
        uint64_t extra;
    } longer = {q, 0};
    ck_assert_int_eq(decode(msg(KVC_OP_FAST_ATTACH, &longer, sizeof(longer), NULL, 0)),
                     -EBADMSG);
    q = (struct kvc_fast_attach_req){.what = KVC_FAST_RING};
    ck_assert_int_eq(decode(msg(KVC_OP_FAST_ATTACH, &q, sizeof(q), NULL, 0)), 0);
    q.arena_id = 1; /* the ring and SYNC name no arena */
    ck_assert_int_eq(decode(msg(KVC_OP_FAST_ATTACH, &q, sizeof(q), NULL, 0)), -EINVAL);
    q = (struct kvc_fast_attach_req){.what = KVC_FAST_SYNC, .arena_id = 2};
    ck_assert_int_eq(decode(msg(KVC_OP_FAST_ATTACH, &q, sizeof(q), NULL, 0)), -EINVAL);
    q = (struct kvc_fast_attach_req){.what = KVC_FAST_BELL}; /* the ring's uid's bell */
    ck_assert_int_eq(decode(msg(KVC_OP_FAST_ATTACH, &q, sizeof(q), NULL, 0)), 0);
    q.arena_id = 1;
    ck_assert_int_eq(decode(msg(KVC_OP_FAST_ATTACH, &q, sizeof(q), NULL, 0)), -EINVAL);
    q = (struct kvc_fast_attach_req){.what = 0};
    ck_assert_int_eq(decode(msg(KVC_OP_FAST_ATTACH, &q, sizeof(q), NULL, 0)), -EINVAL);
    q.what = KVC_FAST_BELL + 1;
    ck_assert_int_eq(decode(msg(KVC_OP_FAST_ATTACH, &q, sizeof(q), NULL, 0)), -EINVAL);
}
END_TEST

START_TEST(test_sync_and_quiet_commit)
{
    struct kvc_sync_req q = {0};
    struct kvc_commit_req com = {.resv_id = 9, .ncommit = 1, .flags = KVC_COMMIT_F_QUIET};
    ck_assert_int_eq(decode(msg(KVC_OP_SYNC, &q, sizeof(q), NULL, 0)), 0);
    ck_assert_int_eq(proto_op_admin(KVC_OP_SYNC), 0);
    ck_assert_str_eq(proto_op_name(KVC_OP_SYNC), "SYNC");
    ck_assert_int_eq(decode(msg(KVC_OP_SYNC, &q, sizeof(q) - 4, NULL, 0)), -EBADMSG);
    ck_assert_int_eq(decode(msg(KVC_OP_SYNC, &q, 0, NULL, 0)), -EBADMSG);
    q.flags = 1;
    ck_assert_int_eq(decode(msg(KVC_OP_SYNC, &q, sizeof(q), NULL, 0)), -EINVAL);
    q = (struct kvc_sync_req){.pad = 1};
    ck_assert_int_eq(decode(msg(KVC_OP_SYNC, &q, sizeof(q), NULL, 0)), -EINVAL);
    ck_assert_int_eq(decode(msg(KVC_OP_COMMIT, &com, sizeof(com), NULL, 0)), 0);
    com.flags = ~KVC_COMMIT_F_QUIET;
    ck_assert_int_eq(decode(msg(KVC_OP_COMMIT, &com, sizeof(com), NULL, 0)), -EINVAL);
    com.flags = 0x2;
    ck_assert_int_eq(decode(msg(KVC_OP_COMMIT, &com, sizeof(com), NULL, 0)), -EINVAL);
}
END_TEST

/* KVC_MSG_F_QUIET in a request header: a RELEASE may carry it, no other request, and no
 * other header flag is taken. */
static int decode_flags(size_t n, uint32_t flags)
{
    memcpy((char *)buf + offsetof(struct kvc_msg_hdr, flags), &flags, sizeof(flags));
    return decode(n);
}

START_TEST(test_quiet_release_flag)
{
    struct kvc_release_req rel = {.nleases = 1};
    const uint64_t id = 5;
    struct kvc_sync_req sq = {0};
    struct kvc_commit_req com = {.resv_id = 9, .ncommit = 1};
    keys_init();
    ck_assert_int_eq(decode_flags(lookup_msg(1, 1), 0), 0);
    ck_assert_int_eq(decode_flags(msg(KVC_OP_RELEASE, &rel, sizeof(rel), &id, 8), 0), 0);
    ck_assert_int_eq(decode_flags(msg(KVC_OP_RELEASE, &rel, sizeof(rel), &id, 8), KVC_MSG_F_QUIET),
                     0);
    ck_assert_int_eq(decode_flags(msg(KVC_OP_RELEASE, &rel, sizeof(rel), &id, 8), KVC_MSG_F_FD),
                     -EINVAL);
    ck_assert_int_eq(
        decode_flags(msg(KVC_OP_RELEASE, &rel, sizeof(rel), &id, 8), KVC_MSG_F_QUIET | 0x4),
        -EINVAL);
    ck_assert_int_eq(decode_flags(msg(KVC_OP_SYNC, &sq, sizeof(sq), NULL, 0), KVC_MSG_F_QUIET),
                     -EINVAL);
    ck_assert_int_eq(decode_flags(msg(KVC_OP_COMMIT, &com, sizeof(com), NULL, 0), KVC_MSG_F_QUIET),
                     -EINVAL);
    ck_assert_int_eq(decode_flags(lookup_msg(1, 1), KVC_MSG_F_QUIET), -EINVAL);
}
END_TEST

START_TEST(test_mutations_never_crash)
{
    unsigned seed = 2024;
    int counts[6] = {0};
    for (int iter = 0; iter < 200000; iter++) {
        size_t n = lookup_msg(1 + (uint32_t)rand_r(&seed) % 8, 1 + (uint32_t)rand_r(&seed) % 8);
        int flips = 1 + rand_r(&seed) % 4;
        for (int f = 0; f < flips; f++) {
            size_t at = (size_t)rand_r(&seed) % (n + 8);
            ((uint8_t *)buf)[at] = (uint8_t)rand_r(&seed);
        }
        if (rand_r(&seed) % 4 == 0)
            n = (size_t)rand_r(&seed) % (n + 16);
        int rc = decode(n);
        switch (rc) {
        case 0: counts[0]++; break;
        case -EPROTO: counts[1]++; break;
        case -EBADMSG: counts[2]++; break;
        case -EINVAL: counts[3]++; break;
        case -E2BIG: counts[4]++; break;
        case -EOPNOTSUPP: counts[5]++; break;
        default:
            ck_abort_msg("unexpected result %d", rc);
        }
        if (rc == 0) {
            struct proto_req r;
            const char *why;
            proto_decode(buf, n, &r, &why);
            /* Whatever was accepted lies inside what arrived. */
            ck_assert_uint_le(sizeof(struct kvc_msg_hdr) + r.hdr->len, n);
        }
    }
    for (int i = 1; i < 6; i++)
        ck_assert_int_gt(counts[i], 0); /* every refusal path was exercised */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("proto");
    TCase *tc = tcase_create("proto");
    keys_init();
    tcase_set_timeout(tc, daemon_slow() * 60);
    tcase_add_test(tc, test_every_opcode_accepted);
    tcase_add_test(tc, test_garbage_closes);
    tcase_add_test(tc, test_bad_payload_replies);
    tcase_add_test(tc, test_hint);
    tcase_add_test(tc, test_lookup_budget);
    tcase_add_test(tc, test_duplicate_keys);
    tcase_add_test(tc, test_zero_key_refused);
    tcase_add_test(tc, test_ns_drop);
    tcase_add_test(tc, test_fast_attach);
    tcase_add_test(tc, test_hint_heads);
    tcase_add_test(tc, test_sync_and_quiet_commit);
    tcase_add_test(tc, test_quiet_release_flag);
    tcase_add_test(tc, test_mutations_never_crash);
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
