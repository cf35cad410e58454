/* check_quant — quantize-in-place in the store without a socket: store_quantize() and its
 * refusals, the raw copy kept while a lookup pins the block, the pressure trigger before
 * eviction, namespace validation of the codec flags, counters and key summaries. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/engine.h"
#include "daemon/quant.h"
#include "daemon/store.h"
#include "kernels/kern.h"
#include "kernels/kern_fmt.h"
#include "tests/lib/layout.h"
#include "tiers/host.h"
#include "tiers/tier.h"
#include "tests/lib/daemon.h"
#include "tests/lib/store_fixture.h"

#define Q8                                                                                         \
    KVC_WIRE_QUANT_FLAGS(1u << KVC_WIRE_FORMAT_Q8_0, KVC_WIRE_FORMAT_Q8_0, KVC_WIRE_FORMAT_Q8_0, 0)
/* q8_0 then q4_1: a ladder of two codecs */
#define LADDER2                                                                                    \
    KVC_WIRE_QUANT_FLAGS(1u << KVC_WIRE_FORMAT_Q8_0 | 1u << KVC_WIRE_FORMAT_Q4_1,                  \
                         KVC_WIRE_FORMAT_Q8_0, KVC_WIRE_FORMAT_Q8_0, 0)

static struct store *s;
static struct quant *q;
static struct store_owner o;

static void setup(void)
{
    struct store_params p = store_fixture_params();
    p.quantize_inflight = 64;
    s = store_fixture_new(&p, &q);
    store_owner_init(&o);
}

static void teardown(void)
{
    store_fixture_free(s, &o); /* frees q */
    s = NULL;
    q = NULL;
}

static uint32_t ns_open(const char *model, uint32_t flags)
{
    return store_fixture_ns(s, model, 2, flags);
}

static struct kvc_wire_key key(uint32_t ns, uint32_t i)
{
    return (struct kvc_wire_key){.lo = 1000u * ns + i + 1, .hi = 7};
}

/* Smooth fp16 data of block i, deterministic. */
static void fill(uint16_t *p, size_t n, uint32_t seed)
{
    for (size_t j = 0; j < n; j++) {
        float f = sinf((float)(j * 0.37 + seed)) * 3.0f;
        _Float16 h = (_Float16)f;
        memcpy(&p[j], &h, 2);
    }
}

static uint8_t *slot(const struct kvc_wire_loc *l)
{
    return (uint8_t *)tier_host_base(s->arenas[l->arena_id].tier) + l->offset;
}

/* Puts one block of data under key(ns, i), chained to i - 1. Returns its block index. */
static uint32_t put(uint32_t ns, uint32_t i)
{
    struct kvc_wire_key k = key(ns, i), parent = i ? key(ns, i - 1) : (struct kvc_wire_key){0};
    struct kvc_wire_loc loc;
    uint64_t resv;
    uint8_t st;
    uint32_t dropped;
    ck_assert_int_eq(store_reserve(s, &o, ns, &parent, &k, 1, 1, &resv, &st, &loc), 1);
    fill((uint16_t *)slot(&loc), store_ns_get(s, ns)->block_bytes / 2, i);
    ck_assert_int_eq(store_commit(s, &o, resv, 1, 2, &dropped), 1);
    return index_find(&s->ix, (uint16_t)ns, &k);
}

static double rel_err(uint32_t ns, uint32_t i, const void *got)
{
    size_t n = store_ns_get(s, ns)->block_bytes / 2;
    uint16_t *want = malloc(n * 2);
    double e = 0, r = 0;
    fill(want, n, i);
    for (size_t j = 0; j < n; j++) {
        _Float16 a, b;
        memcpy(&a, &want[j], 2);
        memcpy(&b, (const uint8_t *)got + 2 * j, 2);
        e += ((double)a - (double)b) * ((double)a - (double)b);
        r += (double)a * (double)a;
    }
    free(want);
    return sqrt(e / r);
}

static struct kern_layout klay(uint32_t ns)
{
    const struct kvc_wire_layout *l = &store_ns_get(s, ns)->layout;
    return (struct kern_layout){l->layers, l->kv_heads, l->head_dim, l->block_tokens, l->dtype, 0};
}

/* Several encoding threads (host.quantize_threads): every job lands, each block decodes within
 * q8_0's bound, and the jobs land in the order they were queued whichever thread finished
 * first (a block placed on landing takes the slot an earlier job freed). */
START_TEST(test_threads)
{
    enum { N = 24 };
    struct store_params p = store_fixture_params();
    uint32_t idx[N];
    ck_assert_uint_eq(quant_threads(3), 3);
    ck_assert_uint_eq(quant_threads(1000), QUANT_THREADS_MAX);
    ck_assert_uint_ge(quant_threads(0), 1);
    ck_assert_uint_le(quant_threads(0), QUANT_THREADS_AUTO);
    teardown();
    p.quantize_inflight = 64;
    p.quantize_threads = 4;
    s = store_fixture_new(&p, &q);
    store_owner_init(&o);
    ck_assert_uint_eq(quant_nthreads(q), 4);
    uint32_t ns = ns_open("threads", Q8);
    for (uint32_t i = 0; i < N; i++)
        idx[i] = put(ns, i);
    for (uint32_t i = 0; i < N; i++)
        ck_assert_int_eq(store_quantize(s, idx[i]), 0);
    ck_assert_uint_eq(quant_inflight(q), N);
    ck_assert_int_eq(quant_drain(q), N);
    ck_assert_uint_eq(quant_inflight(q), 0);
    ck_assert_uint_eq(s->total.quantized_blocks, N);
    struct kern_layout kl = klay(ns);
    void *out = malloc(kern_raw_size(&kl));
    for (uint32_t i = 0; i < N; i++) {
        const struct block *b = &s->ix.blocks[idx[i]];
        ck_assert_uint_eq(b->format, KVC_WIRE_FORMAT_Q8_0);
        ck_assert_uint_eq(b->pins, 0);
        const void *src = (const uint8_t *)tier_host_base(s->arenas[b->arena].tier) + b->off;
        ck_assert_int_eq(
            kern_decode_cpu(&kl, src, b->len, out, kern_raw_size(&kl), KERN_DTYPE_FP16),
            (int64_t)kern_raw_size(&kl));
        ck_assert_double_lt(rel_err(ns, i, out), 0.02);
    }
    free(out);
}
END_TEST

/* Block i of namespace ns with its K and V rows alike within runs of `run` tokens (a run's
 * rows one smooth row; `run` 1: every token apart). Returns its block index. */
static uint32_t put_runs(uint32_t ns, uint32_t i, uint32_t run)
{
    struct kvc_wire_key k = key(ns, i), parent = i ? key(ns, i - 1) : (struct kvc_wire_key){0};
    struct kvc_wire_loc loc;
    struct kern_layout kl = klay(ns);
    uint64_t resv;
    uint8_t st;
    uint32_t dropped;
    ck_assert_int_eq(store_reserve(s, &o, ns, &parent, &k, 1, 1, &resv, &st, &loc), 1);
    uint16_t *p = (uint16_t *)slot(&loc);
    for (uint32_t l = 0; l < kl.layers; l++)
        for (uint32_t kind = 0; kind < 2; kind++)
            for (uint32_t t = 0; t < kl.tokens; t++)
                fill(p + kern_raw_index(&kl, l, kind, t, 0), (size_t)kl.heads * kl.head_dim,
                     1000 * i + 100 * l + 10 * kind + t / run);
    ck_assert_int_eq(store_commit(s, &o, resv, 1, 2, &dropped), 1);
    return index_find(&s->ix, (uint16_t)ns, &k);
}

/* A merge step (issue 30): the worker encodes first and asks the reference plan only where a
 * head holds all its rows. Runs of four tokens (rows under the 8 a 16-token head stores):
 * merge, not refused. Runs of two (exactly 8 rows, nothing forced: the plan asked, says 0):
 * merge. Every token apart (tokens forced): refused, the rung after merge (q4_1) instead. */
START_TEST(test_merge_step)
{
    uint32_t ns = ns_open(
        "merge", KVC_WIRE_QUANT_FLAGS(1u << KVC_WIRE_FORMAT_MERGE | 1u << KVC_WIRE_FORMAT_Q4_1,
                                      KVC_WIRE_FORMAT_MERGE, KVC_WIRE_FORMAT_MERGE, 0));
    static const uint32_t run[3] = {4, 2, 1};
    static const uint8_t want[3] = {KVC_WIRE_FORMAT_MERGE, KVC_WIRE_FORMAT_MERGE,
                                    KVC_WIRE_FORMAT_Q4_1};
    uint32_t idx[3];
    ck_assert_uint_eq(klay(ns).tokens, 16);
    for (uint32_t i = 0; i < 3; i++) {
        idx[i] = put_runs(ns, i, run[i]);
        ck_assert_int_eq(store_quantize(s, idx[i]), 0);
        ck_assert_int_eq(quant_drain(q), 1);
        ck_assert_uint_eq(s->ix.blocks[idx[i]].format, want[i]);
        ck_assert_uint_eq(s->total.merge_refused_blocks, i == 2);
    }
    /* each decodes to its data: a merged block's runs are exact (their rows alike) */
    struct kern_layout kl = klay(ns);
    uint16_t *out = malloc(kern_raw_size(&kl));
    for (uint32_t i = 0; i < 3; i++) {
        const struct block *b = &s->ix.blocks[idx[i]];
        const void *src = (const uint8_t *)tier_host_base(s->arenas[b->arena].tier) + b->off;
        ck_assert_int_eq(
            kern_decode_cpu(&kl, src, b->len, out, kern_raw_size(&kl), KERN_DTYPE_FP16),
            (int64_t)kern_raw_size(&kl));
        uint16_t *want_rows = malloc((size_t)kl.heads * kl.head_dim * 2);
        double e = 0, r = 0;
        for (uint32_t l = 0; l < kl.layers; l++)
            for (uint32_t kind = 0; kind < 2; kind++)
                for (uint32_t t = 0; t < kl.tokens; t++) {
                    fill(want_rows, (size_t)kl.heads * kl.head_dim,
                         1000 * i + 100 * l + 10 * kind + t / run[i]);
                    const uint16_t *got = out + kern_raw_index(&kl, l, kind, t, 0);
                    for (uint32_t j = 0; j < kl.heads * kl.head_dim; j++) {
                        double a = kern_h2f(want_rows[j]), d = a - kern_h2f(got[j]);
                        e += d * d;
                        r += a * a;
                    }
                }
        free(want_rows);
        ck_assert_double_lt(sqrt(e / r), i < 2 ? 1e-3 : 0.2);
    }
    free(out);
}
END_TEST

START_TEST(test_quantize_block)
{
    uint32_t ns = ns_open("q", Q8);
    uint32_t idx = put(ns, 0);
    uint64_t used = store_host_used(s), raw_len = s->ix.blocks[idx].len;
    ck_assert_int_eq(store_quantize(s, idx), 0);
    ck_assert_int_eq(store_quantize(s, idx), -EALREADY); /* queued */
    ck_assert_int_eq(quant_drain(q), 1);
    const struct block *b = &s->ix.blocks[idx];
    ck_assert_uint_eq(b->format, KVC_WIRE_FORMAT_Q8_0);
    ck_assert_uint_eq(b->pins, 0);
    ck_assert_uint_lt(b->len, raw_len);
    ck_assert_uint_lt(store_host_used(s), used);
    ck_assert_uint_eq(s->total.quantized_blocks, 1);
    ck_assert_uint_eq(s->total.quant_bytes_saved, raw_len - b->len);
    ck_assert_uint_eq(store_ns_get(s, ns)->bytes, b->len);
    float norm, amax;
    ck_assert_int_eq(quant_key_summary(q, idx, &norm, &amax), 0);
    ck_assert_float_gt(norm, 1.0f);
    ck_assert_float_le(amax, 3.01f);
    ck_assert_float_gt(amax, 2.9f);
    /* a lookup now gets the quantized location, which decodes within q8_0's bound */
    struct kvc_wire_key k = key(ns, 0);
    struct kvc_wire_loc loc;
    uint64_t lease;
    ck_assert_int_eq(engine_lookup(s, &o, ns, &k, 1, 3, &lease, &loc), 1);
    ck_assert_uint_eq(loc.format, KVC_WIRE_FORMAT_Q8_0);
    struct kern_layout kl = klay(ns);
    void *out = malloc(kern_raw_size(&kl));
    ck_assert_int_eq(
        kern_decode_cpu(&kl, slot(&loc), loc.length, out, kern_raw_size(&kl), KERN_DTYPE_FP16),
        (int64_t)kern_raw_size(&kl));
    ck_assert_double_lt(rel_err(ns, 0, out), 0.02);
    free(out);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    ck_assert_int_eq(store_quantize(s, idx), -EALREADY); /* not raw any more */
}
END_TEST

/* VATP through the daemon: two blocks with equal attention hints, one whose values are 1/16
 * of the other's; the quantize pass measures their value norms and the vatp key ranks the
 * small-valued block first, where H2O sees a tie. */
START_TEST(test_vatp_value_norm)
{
    uint32_t ns = ns_open("vatp", Q8);
    uint32_t big = put(ns, 0), small = put(ns, 1);
    struct kern_layout kl = klay(ns);
    uint64_t row = (uint64_t)kl.tokens * kl.heads * kl.head_dim;
    uint16_t *p = (uint16_t *)slot(&(struct kvc_wire_loc){.arena_id = s->ix.blocks[small].arena,
                                                          .offset = s->ix.blocks[small].off});
    for (uint32_t l = 0; l < kl.layers; l++)
        for (uint64_t i = 0; i < row; i++) { /* the V section of layer l, scaled by 1/16 */
            _Float16 h;
            memcpy(&h, &p[(2 * l + 1) * row + i], 2);
            h = (_Float16)((float)h / 16.0f);
            memcpy(&p[(2 * l + 1) * row + i], &h, 2);
        }
    struct kvc_wire_hint h[2] = {{.key = key(ns, 0), .score = 3.0f},
                                 {.key = key(ns, 1), .score = 3.0f}};
    ck_assert_int_eq(store_hint(s, ns, KVC_HINT_H2O, h, 2, 100), 2);
    ck_assert_int_eq(store_ns_policy_set(s, ns, POLICY_VATP, STORE_POLICY_SRC_ADMIN), 0);
    struct policy_block pb, ps;
    store_policy_block(s, big, &pb);
    ck_assert_float_eq(pb.value_norm, 0.0f); /* raw: not read by the pass yet */
    ck_assert_int_eq(store_quantize(s, big), 0);
    ck_assert_int_eq(store_quantize(s, small), 0);
    ck_assert_int_eq(quant_drain(q), 2);
    store_policy_block(s, big, &pb);
    store_policy_block(s, small, &ps);
    ck_assert_float_gt(pb.value_norm, 1.0f);
    ck_assert_float_lt(ps.value_norm, pb.value_norm / 15.0f);
    ck_assert_float_gt(ps.value_norm, pb.value_norm / 17.0f);
    struct policy_params pp = store_ns_get(s, ns)->pp;
    ps.flags = pb.flags = 0; /* the sink flag of depth 0 aside: the key itself */
    ps.depth = pb.depth = 1;
    ck_assert_double_eq(policy_key(POLICY_H2O, &ps, &pp), policy_key(POLICY_H2O, &pb, &pp));
    ck_assert_double_lt(policy_key(POLICY_VATP, &ps, &pp), policy_key(POLICY_VATP, &pb, &pp));
}
END_TEST

/* Per-head hints: each block's H2O mass is the sum of its head scores, its head concentration
 * is kept, and the namespace's profile sorts heads into FastGen's categories. */
START_TEST(test_head_profile)
{
    uint32_t ns = ns_open("heads", Q8); /* 2 layers x 4 kv heads */
    enum { NB = 6, LH = 8 };
    struct kvc_wire_key k[NB];
    float sc[NB][LH];
    uint8_t prof[LH];
    uint32_t idx[NB];
    for (uint32_t i = 0; i < NB; i++) {
        idx[i] = put(ns, i);
        k[i] = key(ns, i);
        for (uint32_t j = 0; j < LH; j++)
            sc[i][j] = 1.0f;                  /* heads 2..7: everywhere */
        sc[i][0] = i == 0 ? 10.0f : 0.0f;     /* head 0: the sink */
        sc[i][1] = i >= NB - 2 ? 4.0f : 0.0f; /* head 1: the last two blocks */
    }
    ck_assert_int_eq(store_head_profile(s, ns, prof), LH); /* nothing learnt: all full */
    ck_assert_uint_eq(prof[0], STORE_HEAD_UNKNOWN);
    ck_assert_int_eq(store_hint_heads(s, ns, KVC_HINT_H2O, k, &sc[0][0], NB, 4, 2, 100), -EINVAL);
    ck_assert_int_eq(store_hint_heads(s, ns, KVC_HINT_H2O, k, &sc[0][0], NB, 2, 8, 100), -EINVAL);
    ck_assert_int_eq(store_hint_heads(s, ns, 7, k, &sc[0][0], NB, 2, 4, 100), -EINVAL);
    ck_assert_int_eq(store_hint_heads(s, ns, KVC_HINT_H2O, k, &sc[0][0], NB, 2, 4, 100), NB);
    ck_assert_int_eq(store_head_profile(s, ns, prof), LH - 2);
    ck_assert_uint_eq(prof[0], STORE_HEAD_SINK);
    ck_assert_uint_eq(prof[1], STORE_HEAD_LOCAL);
    for (uint32_t j = 2; j < LH; j++)
        ck_assert_uint_eq(prof[j], STORE_HEAD_FULL);
    /* block 0: 10 + 6 x 1 = 16, mean 2, peak 10: concentration 5 (bf16 0x40a0) */
    ck_assert_float_eq(s->meta_x[idx[0]].hint, 16.0f);
    ck_assert_uint_eq(s->meta_x[idx[0]].hpeak, 0x40a0);
    ck_assert_float_eq(s->meta_x[idx[2]].hint, 6.0f);
    ck_assert_uint_eq(s->meta_x[idx[2]].hpeak, 0x3faa); /* 1 / (6 / 8) = 1.333 */
}
END_TEST

/* The profile follows the recent hints: a head that looked at the sink alone, with a mass
 * that a sum over all time would keep for 20,000 more calls, reads as a retrieval head a few
 * thousand calls after it starts to spread its attention (the masses halve every
 * STORE_HEAD_AGE_BLOCKS hinted blocks). */
START_TEST(test_head_profile_ages)
{
    uint32_t ns = ns_open("heads-age", Q8); /* 2 layers x 4 kv heads */
    enum { NB = 6, LH = 8 };
    struct kvc_wire_key k[NB];
    float sink[NB][LH], spread[NB][LH];
    uint8_t prof[LH];
    for (uint32_t i = 0; i < NB; i++) {
        put(ns, i);
        k[i] = key(ns, i);
        for (uint32_t j = 0; j < LH; j++)
            sink[i][j] = spread[i][j] = 1.0f;
        sink[i][0] = i == 0 ? 1000.0f : 0.0f;
    }
    for (int c = 0; c < 1000; c++)
        ck_assert_int_eq(store_hint_heads(s, ns, KVC_HINT_H2O, k, &sink[0][0], NB, 2, 4, 100), NB);
    ck_assert_int_eq(store_head_profile(s, ns, prof), LH - 1);
    ck_assert_uint_eq(prof[0], STORE_HEAD_SINK);
    /* summed for ever, head 0 would stay sink-only while 1e6 + c >= 0.9 (1e6 + 6 c) */
    for (int c = 0; c < 3000; c++)
        ck_assert_int_eq(store_hint_heads(s, ns, KVC_HINT_H2O, k, &spread[0][0], NB, 2, 4, 100),
                         NB);
    ck_assert_int_eq(store_head_profile(s, ns, prof), LH);
    ck_assert_uint_eq(prof[0], STORE_HEAD_FULL);
    const struct store_ns *sn = store_ns_get(s, ns);
    ck_assert_uint_lt(sn->head_seen, STORE_HEAD_AGE_BLOCKS);
    for (uint32_t j = 0; j < 3 * LH; j++)
        ck_assert_float_lt(sn->head_mass[j], 2.0f * NB * STORE_HEAD_AGE_BLOCKS);
}
END_TEST

/* Hints of pattern `full` (layer-major head indices that spread their attention; the rest
 * look at the sink only) on blocks 0..5 of a new namespace allowing `flags`' codecs; then
 * block `which` quantized, which must land in `format`. Returns its index, the heads
 * its encoding keeps raw in *mask. */
static uint32_t per_head_block_in(const char *model, const uint32_t *full, uint32_t nfull,
                                  uint8_t *mask, uint32_t flags, uint32_t which, uint8_t format)
{
    uint32_t ns = ns_open(model, flags), idx = 0;
    struct kvc_wire_key k[6];
    float sc[6][8];
    for (uint32_t i = 0; i < 6; i++) {
        uint32_t x = put(ns, i);
        idx = i == which ? x : idx;
        k[i] = key(ns, i);
        for (uint32_t j = 0; j < 8; j++)
            sc[i][j] = i == 0 ? 5.0f : 0.0f;
        for (uint32_t f = 0; f < nfull; f++)
            sc[i][full[f]] = 1.0f;
    }
    if (nfull)
        ck_assert_int_eq(store_hint_heads(s, ns, KVC_HINT_H2O, k, &sc[0][0], 6, 2, 4, 100), 6);
    ck_assert_int_eq(store_quantize(s, idx), 0);
    ck_assert_int_eq(quant_drain(q), 1);
    const struct block *b = &s->ix.blocks[idx];
    const uint8_t *enc = (const uint8_t *)tier_host_base(s->arenas[b->arena].tier) + b->off;
    ck_assert_uint_eq(b->format, format);
    int n = kern_block_raw_heads(enc, b->len, mask);
    ck_assert_int_eq(n, (int)nfull);
    /* decoded: the raw heads bit for bit, the others the codec's (some value differs) */
    struct kern_layout kl = klay(ns);
    uint64_t rs = kern_raw_size(&kl), row = (uint64_t)kl.heads * kl.head_dim;
    uint16_t *want = malloc(rs), *got = malloc(rs);
    fill(want, rs / 2, which);
    ck_assert_int_eq(kern_decode_cpu(&kl, enc, b->len, got, rs, KERN_DTYPE_FP16), (int64_t)rs);
    for (uint32_t l = 0; l < kl.layers; l++)
        for (uint32_t h = 0; h < kl.heads; h++) {
            bool same = true;
            for (uint32_t kv = 0; kv < 2; kv++)
                for (uint32_t t = 0; t < kl.tokens; t++) {
                    uint64_t i = ((uint64_t)(2 * l + kv) * kl.tokens + t) * row + h * kl.head_dim;
                    same = same && memcmp(got + i, want + i, 2 * kl.head_dim) == 0;
                }
            ck_assert_msg(same == (mask[l * kl.heads + h] != 0), "layer %u head %u", l, h);
        }
    free(want);
    free(got);
    return idx;
}

static uint32_t per_head_block(const char *model, const uint32_t *full, uint32_t nfull,
                               uint8_t *mask)
{
    return per_head_block_in(model, full, nfull, mask, Q8, 3, KVC_WIRE_FORMAT_Q8_0);
}

/* Per-head recipes: the retrieval heads the hints show are kept bit-exact in the quantized
 * block, the others quantized; other hints, other heads; no per-head hint, no raw head. */
START_TEST(test_per_head_recipe)
{
    static const uint32_t a[] = {0, 1}, b[] = {6, 7, 2};
    uint8_t ma[8], mb[8], mn[8];
    static const uint8_t wa[8] = {1, 1, 0, 0, 0, 0, 0, 0}, wb[8] = {0, 0, 1, 0, 0, 0, 1, 1};
    per_head_block("perhead-a", a, 2, ma);
    per_head_block("perhead-b", b, 3, mb);
    per_head_block("perhead-none", NULL, 0, mn);
    ck_assert_mem_eq(ma, wa, 8);
    ck_assert_mem_eq(mb, wb, 8);
    for (int j = 0; j < 8; j++)
        ck_assert_uint_eq(mn[j], 0);
}
END_TEST

/* host.head_step: with a second codec on the ladder, a block keeping its retrieval heads raw
 * takes that codec at once for the others (and is smaller than the first codec's per-head
 * block); not a sink block, not with the option off, not without raw heads. */
START_TEST(test_per_head_step)
{
    static const uint32_t full[] = {0, 5};
    static const uint8_t wmask[8] = {1, 0, 0, 0, 0, 1, 0, 0};
    uint8_t m[8];
    uint32_t a = per_head_block_in("step-on", full, 2, m, LADDER2, 3, KVC_WIRE_FORMAT_Q4_1);
    ck_assert_mem_eq(m, wmask, 8);
    ck_assert_uint_eq(s->total.head_stepped_blocks, 1);
    /* the sink block (depth 0) keeps the first codec for the sink-only heads that read it */
    per_head_block_in("step-sink", full, 2, m, LADDER2, 0, KVC_WIRE_FORMAT_Q8_0);
    ck_assert_mem_eq(m, wmask, 8);
    /* no per-head hints: the first codec, no raw head */
    per_head_block_in("step-none", NULL, 0, m, LADDER2, 3, KVC_WIRE_FORMAT_Q8_0);
    ck_assert_uint_eq(s->total.head_stepped_blocks, 1);
    s->p.head_step = false;
    uint32_t b = per_head_block_in("step-off", full, 2, m, LADDER2, 3, KVC_WIRE_FORMAT_Q8_0);
    ck_assert_mem_eq(m, wmask, 8);
    ck_assert_uint_eq(s->total.head_stepped_blocks, 1);
    /* q4_1 with two raw heads of eight is below q8_0 with the same two */
    ck_assert_uint_lt(s->ix.blocks[a].len, s->ix.blocks[b].len);
}
END_TEST

START_TEST(test_refusals)
{
    uint32_t plain = ns_open("plain", 0), qn = ns_open("q", Q8);
    uint32_t a = put(plain, 0), b = put(qn, 0);
    ck_assert_int_eq(store_quantize(s, a), -EPERM);
    ck_assert_int_eq(store_quantize(s, 999999), -ENOENT);
    struct kvc_wire_key k = key(qn, 0);
    struct kvc_wire_loc loc;
    uint64_t lease;
    ck_assert_int_eq(engine_lookup(s, &o, qn, &k, 1, 3, &lease, &loc), 1);
    ck_assert_int_eq(store_quantize(s, b), -EBUSY);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    ck_assert_uint_eq(s->total.quantized_blocks, 0);
}
END_TEST

/* A lookup that pins the block while it is being encoded keeps the raw copy: the result is
 * thrown away, the lease's slot stays valid and raw. */
START_TEST(test_lookup_during_encode)
{
    uint32_t ns = ns_open("q", Q8);
    uint32_t idx = put(ns, 0);
    uint64_t off = s->ix.blocks[idx].off;
    ck_assert_int_eq(store_quantize(s, idx), 0);
    struct kvc_wire_key k = key(ns, 0);
    struct kvc_wire_loc loc;
    uint64_t lease;
    ck_assert_int_eq(engine_lookup(s, &o, ns, &k, 1, 3, &lease, &loc), 1);
    ck_assert_uint_eq(loc.format, KVC_WIRE_FORMAT_RAW);
    ck_assert_uint_eq(loc.offset, off);
    ck_assert_int_eq(quant_drain(q), 1);
    ck_assert_uint_eq(s->ix.blocks[idx].format, KVC_WIRE_FORMAT_RAW);
    ck_assert_uint_eq(s->ix.blocks[idx].off, off);
    ck_assert_uint_eq(s->ix.blocks[idx].pins, 1);
    ck_assert_double_eq(rel_err(ns, 0, slot(&loc)), 0.0);
    ck_assert_int_eq(store_release(s, &o, lease), 0);
    ck_assert_uint_eq(s->total.quantized_blocks, 0);
    ck_assert_uint_eq(s->pins_now, 0);
}
END_TEST

/* Above the high watermark the trim quantizes the allowing namespace's blocks instead of
 * evicting them; a namespace that allows nothing never gets a lossy block. */
START_TEST(test_pressure)
{
    uint32_t plain = ns_open("plain", 0), qn = ns_open("q", Q8);
    uint32_t n = 0;
    uint64_t cap = store_host_capacity(s);
    while ((double)store_host_used(s) <= 0.92 * (double)cap) {
        put(n % 2 ? plain : qn, n / 2);
        n++;
    }
    int ev = engine_trim(s, 10);
    ck_assert_int_gt((int)quant_inflight(q), 0);
    quant_drain(q);
    ck_assert_uint_gt(s->total.quantized_blocks, 0);
    for (uint32_t i = 0; i < s->ix.nblocks; i++) {
        const struct block *b = &s->ix.blocks[i];
        if (b->state != BLOCK_STATE_COMMITTED)
            continue;
        if (b->ns == plain)
            ck_assert_uint_eq(b->format, KVC_WIRE_FORMAT_RAW);
    }
    /* half of the arena was the allowing namespace's: quantizing it (~0.53x) reaches the low
     * watermark without evicting all of the raw namespace */
    ck_assert_uint_lt(store_host_used(s), (uint64_t)(0.9 * (double)cap));
    ck_assert_int_lt(ev, (int)n / 2);
    ck_assert_uint_eq(s->pins_now, 0);
}
END_TEST

/* Puts block i of ns (fill's data for i), a root: the tests that drop each block after it. */
static uint32_t put_root(uint32_t ns, uint32_t i)
{
    struct kvc_wire_key k = key(ns, i), root = {0};
    struct kvc_wire_loc loc;
    uint64_t resv;
    uint8_t st;
    uint32_t dropped;
    ck_assert_int_eq(store_reserve(s, &o, ns, &root, &k, 1, 1, &resv, &st, &loc), 1);
    fill((uint16_t *)slot(&loc), store_ns_get(s, ns)->block_bytes / 2, i);
    ck_assert_int_eq(store_commit(s, &o, resv, 1, 2, &dropped), 1);
    return index_find(&s->ix, (uint16_t)ns, &k);
}

/* Where a writer of the arena points a block's last section: at its first (in the block, so
 * a reader that takes it reads and writes in bounds, only the wrong bytes). */
static uint32_t *last_sect_offset(uint8_t *blk, uint32_t *first)
{
    struct kern_block_hdr h;
    memcpy(&h, blk, sizeof(h));
    memcpy(first, blk + sizeof(h), sizeof(*first));
    return (uint32_t *)(blk + sizeof(h) + (h.nsect - 1) * sizeof(struct kern_block_sect));
}

/* A writer of the arena points a q8_0 block's last section at its first and back, over and
 * over, while the worker re-encodes the block one rung down (q8_0 to q4_1). The worker
 * decoded the block where it lay: the decoder checks the header and table and then reads
 * them again, so it took the rewritten offset (with a far one, it read past the arena: a
 * daemon crash any writer of the arena could cause; here, the first section's bytes as the
 * last's). It decodes a private copy now: every step either lands, within q4_1's bound, or
 * is refused (the copy's table is not the layout's) with the block as it was. The writer
 * is another process, as a client is. */
static pid_t race_writer(uint32_t *at, uint32_t good, uint32_t bad)
{
    pid_t pid = fork();
    if (pid == 0) {
        for (;;) {
            __atomic_store_n(at, bad, __ATOMIC_RELAXED);
            __atomic_store_n(at, good, __ATOMIC_RELAXED);
        }
    }
    return pid;
}

START_TEST(test_requantize_raced)
{
    enum { ROUNDS = 100 };
    /* 32 layers: the last section's offset is read again some 64 sections after the check */
    uint32_t ns = store_fixture_ns(s, "raced", 32, LADDER2), landed = 0, refused = 0;
    struct kern_layout kl = klay(ns);
    void *out = malloc(kern_raw_size(&kl));
    for (uint32_t i = 0; i < ROUNDS; i++) {
        uint32_t idx = put_root(ns, i), first;
        ck_assert_int_eq(store_quantize(s, idx), 0);
        ck_assert_int_eq(quant_drain(q), 1);
        const struct block *b = &s->ix.blocks[idx];
        ck_assert_uint_eq(b->format, KVC_WIRE_FORMAT_Q8_0);
        uint32_t *at =
            last_sect_offset((uint8_t *)tier_host_base(s->arenas[b->arena].tier) + b->off, &first);
        uint32_t good = *at;
        pid_t w = race_writer(at, good, first);
        ck_assert_int_gt(w, 0);
        ck_assert_int_eq(store_quantize_to(s, idx, KVC_WIRE_FORMAT_Q4_1), 0);
        ck_assert_int_eq(quant_drain(q), 1);
        kill(w, SIGKILL);
        waitpid(w, NULL, 0);
        b = &s->ix.blocks[idx];
        if (b->format == KVC_WIRE_FORMAT_Q8_0) {
            refused++;
            *at = good; /* the block as it was, for the decode below */
        } else {
            ck_assert_uint_eq(b->format, KVC_WIRE_FORMAT_Q4_1);
            landed++;
        }
        const void *src = (const uint8_t *)tier_host_base(s->arenas[b->arena].tier) + b->off;
        ck_assert_int_eq(
            kern_decode_cpu(&kl, src, b->len, out, kern_raw_size(&kl), KERN_DTYPE_FP16),
            (int64_t)kern_raw_size(&kl));
        ck_assert_double_lt(rel_err(ns, i, out), 0.12);
        ck_assert_uint_eq(b->pins, 0);
        ck_assert_int_eq(store_block_drop(s, idx), 0); /* room for the next */
    }
    printf("quant: re-encodes under a racing writer: %u landed, %u refused\n", landed, refused);
    ck_assert_uint_gt(refused, 0); /* the writer did race the worker */
    ck_assert_uint_gt(landed, 0);
    ck_assert_uint_eq(s->pins_now, 0);
    free(out);
}
END_TEST

/* A writer of the arena that points the last section of every encoded block it finds there
 * at its first, over and over: the worker encoded a raw block into its new arena slot and
 * read the table back from there section by section, so it wrote where the rewritten table
 * said (with a far offset, 4 GiB past the slot: a daemon crash, or worse; here, the last
 * section's bytes over the first's). It encodes into private memory now and the bytes go to
 * the slot once done: each block landed is, its table put right again, byte for byte the
 * block this layout and recipe encode to. The writer is another process, as a client is. */
static pid_t race_scanner(uint8_t *arena, uint64_t size)
{
    pid_t pid = fork();
    if (pid == 0) {
        for (;;)
            for (uint64_t off = 0; off + 4096 <= size; off += 4096) {
                struct kern_block_hdr h;
                uint32_t first;
                memcpy(&h, arena + off, sizeof(h));
                if (h.magic != KERN_BLOCK_MAGIC || h.nsect < 2 || h.nsect > 256)
                    continue;
                uint32_t *at = last_sect_offset(arena + off, &first);
                __atomic_store_n(at, first, __ATOMIC_RELAXED);
            }
    }
    return pid;
}

START_TEST(test_encode_into_arena_raced)
{
    enum { ROUNDS = 200 };
    uint32_t ns = store_fixture_ns(s, "scanned", 8, Q8), rewritten = 0;
    struct tier *t = s->arenas[store_ns_get(s, ns)->arena].tier;
    struct kern_layout kl = klay(ns);
    struct kern_recipe rec;
    kern_recipe_fill(&rec, KERN_CODEC_Q8_0, KERN_CODEC_Q8_0, 0);
    const int64_t n = kern_encoded_size(&kl, &rec);
    uint16_t *raw = malloc(kern_raw_size(&kl));
    uint8_t *want = malloc((size_t)n);
    for (uint32_t i = 0; i < ROUNDS; i++) {
        uint32_t idx = put_root(ns, i), first;
        fill(raw, kern_raw_size(&kl) / 2, i);
        pid_t w = race_scanner(tier_host_base(t), tier_host_size(t));
        ck_assert_int_gt(w, 0);
        ck_assert_int_eq(store_quantize(s, idx), 0);
        ck_assert_int_eq(quant_drain(q), 1);
        kill(w, SIGKILL);
        waitpid(w, NULL, 0);
        const struct block *b = &s->ix.blocks[idx];
        ck_assert_uint_eq(b->format, KVC_WIRE_FORMAT_Q8_0);
        ck_assert_uint_ge(b->len, (uint64_t)n);
        ck_assert_uint_eq(b->pins, 0);
        ck_assert_int_eq(kern_encode_cpu(&kl, &rec, raw, want, (size_t)n, NULL), n);
        uint8_t *got = (uint8_t *)tier_host_base(t) + b->off;
        uint32_t *at = last_sect_offset(got, &first), *want_at = last_sect_offset(want, &first);
        rewritten += *at != *want_at;
        *at = *want_at; /* the writer's last rewrite put right */
        ck_assert_msg(memcmp(got, want, (size_t)n) == 0, "block %u not as encoded", i);
        /* room for the next: the blocks are the namespace's own */
        ck_assert_int_eq(store_block_drop(s, idx), 0);
    }
    printf("quant: encodes into an arena a writer scans: %u of %u blocks rewritten after\n",
           rewritten, ROUNDS);
    ck_assert_uint_gt(rewritten, 0); /* the writer was there */
    ck_assert_uint_eq(s->pins_now, 0);
    free(raw);
    free(want);
}
END_TEST

START_TEST(test_ns_flags)
{
    uint32_t id;
    bool created;
    struct kvc_wire_layout l = layout_fp16("bad", 2, 1u << 7); /* unknown codec */
    ck_assert_int_eq(store_ns_open(s, &l, &id, &created), -EINVAL);
    l = layout_fp16("bad", 2, KVC_WIRE_QUANT_FLAGS(1u << 1, 2, 2, 0)); /* q4_1 not allowed */
    ck_assert_int_eq(store_ns_open(s, &l, &id, &created), -EINVAL);
    l = layout_fp16("bad", 2, KVC_WIRE_QUANT_FLAGS(1u << 1, 1, 1, 2)); /* every layer raw */
    ck_assert_int_eq(store_ns_open(s, &l, &id, &created), -EINVAL);
    l = layout_fp16("bad", 2, Q8);
    l.dtype = KVC_WIRE_DTYPE_FP32;
    ck_assert_int_eq(store_ns_open(s, &l, &id, &created), -EINVAL);
    l = layout_fp16("bad", 2, 1u << 24);
    ck_assert_int_eq(store_ns_open(s, &l, &id, &created), -EINVAL);
    /* the creator's setting stays; 0 or the same value opens it, another does not */
    uint32_t qn = ns_open("q", Q8);
    l = layout_fp16("q", 2, 0);
    ck_assert_int_eq(store_ns_open(s, &l, &id, &created), 0);
    ck_assert_uint_eq(id, qn);
    ck_assert_uint_eq(store_ns_get(s, qn)->layout.flags, Q8);
    l = layout_fp16("q", 2, KVC_WIRE_QUANT_FLAGS(1u << 6, 6, 6, 0));
    ck_assert_int_eq(store_ns_open(s, &l, &id, &created), -EEXIST);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("quant");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_quantize_block);
    tcase_add_test(tc, test_merge_step);
    tcase_add_test(tc, test_threads);
    tcase_add_test(tc, test_vatp_value_norm);
    tcase_add_test(tc, test_head_profile);
    tcase_add_test(tc, test_head_profile_ages);
    tcase_add_test(tc, test_per_head_recipe);
    tcase_add_test(tc, test_per_head_step);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_lookup_during_encode);
    tcase_add_test(tc, test_pressure);
    tcase_add_test(tc, test_ns_flags);
    tcase_add_test(tc, test_requantize_raced);
    tcase_add_test(tc, test_encode_into_arena_raced);
    suite_add_tcase(su, tc);
    return daemon_suite_run(su);
}
