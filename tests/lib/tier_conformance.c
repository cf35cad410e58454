/*
 * tier_conformance.c — tier-agnostic conformance cases (see tier_conformance.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/tier_conformance.h"

static struct tier_conformance tc_factories[TIER_CONFORMANCE_MAX];
static char tc_names[TIER_CONFORMANCE_MAX][64];
static int tc_count;

struct tc_done {
    int calls;
    int status;
};

static void tc_done_cb(void *arg, int status)
{
    struct tc_done *d = arg;
    d->calls++;
    d->status = status;
}

static struct tier *tc_new(const struct tier_conformance *f)
{
    struct tier *t = f->create(f->capacity, f->arg);
    ck_assert_msg(t != NULL, "%s: create(%llu) failed", f->name,
                  (unsigned long long)f->capacity);
    ck_assert_uint_ge(t->ops->capacity(t), f->capacity);
    ck_assert_uint_eq(t->ops->usage(t), 0);
    return t;
}

static void tc_del(const struct tier_conformance *f, struct tier *t)
{
    if (f->destroy)
        f->destroy(t, f->arg);
    else
        tier_destroy(t);
}

static void tc_drain(const struct tier_conformance *f, struct tier *t)
{
    if (f->drain)
        f->drain(t, f->arg);
}

/* Deterministic per-case bytes: xorshift, seeded so a failure repeats. */
static void tc_fill(void *buf, uint64_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    unsigned char *p = buf;
    for (uint64_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (unsigned char)(x >> 24);
    }
}

/* Write then read back len bytes at off inside loc; both complete exactly once with 0. */
static void tc_roundtrip(const struct tier_conformance *f, struct tier *t,
                         const struct tier_loc *loc, uint64_t off, uint64_t len, uint64_t seed)
{
    unsigned char *src = malloc(len), *dst = malloc(len);
    ck_assert_ptr_nonnull(src);
    ck_assert_ptr_nonnull(dst);
    tc_fill(src, len, seed);
    memset(dst, 0, len);
    struct tc_done w = {0, -1}, r = {0, -1};
    ck_assert_int_eq(t->ops->write(t, loc, off, src, len, tc_done_cb, &w), 0);
    tc_drain(f, t);
    ck_assert_int_eq(w.calls, 1);
    ck_assert_int_eq(w.status, 0);
    ck_assert_int_eq(t->ops->read(t, loc, off, dst, len, tc_done_cb, &r), 0);
    tc_drain(f, t);
    ck_assert_int_eq(r.calls, 1);
    ck_assert_int_eq(r.status, 0);
    ck_assert_msg(memcmp(src, dst, len) == 0, "%s: %llu bytes at %llu read back differ",
                  f->name, (unsigned long long)len, (unsigned long long)off);
    free(src);
    free(dst);
}

static void tc_check_bytes(const struct tier_conformance *f, struct tier *t,
                           const struct tier_loc *loc, uint64_t len, uint64_t seed)
{
    unsigned char *want = malloc(len), *got = malloc(len);
    ck_assert_ptr_nonnull(want);
    ck_assert_ptr_nonnull(got);
    tc_fill(want, len, seed);
    struct tc_done r = {0, -1};
    ck_assert_int_eq(t->ops->read(t, loc, 0, got, len, tc_done_cb, &r), 0);
    tc_drain(f, t);
    ck_assert_int_eq(r.calls, 1);
    ck_assert_msg(memcmp(want, got, len) == 0, "%s: block %llu+%llu was overwritten", f->name,
                  (unsigned long long)loc->off, (unsigned long long)len);
    free(want);
    free(got);
}

START_TEST(tc_accounting)
{
    const struct tier_conformance *f = &tc_factories[_i];
    struct tier *t = tc_new(f);
    struct tier_loc loc[4];
    uint64_t sum = 0;
    const uint64_t sizes[4] = {1, f->block, f->block - 1, 3 * 4096 + 5};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(t->ops->alloc(t, sizes[i], &loc[i]), 0);
        ck_assert_uint_ge(loc[i].len, sizes[i]);
        ck_assert_uint_le(loc[i].off + loc[i].len, t->ops->capacity(t));
        sum += loc[i].len;
        ck_assert_uint_eq(t->ops->usage(t), sum);
    }
    for (int i = 3; i >= 0; i--) {
        t->ops->free(t, &loc[i]);
        sum -= loc[i].len;
        ck_assert_uint_eq(t->ops->usage(t), sum);
    }
    ck_assert_uint_eq(t->ops->usage(t), 0);
    tc_del(f, t);
}
END_TEST

START_TEST(tc_read_after_write)
{
    const struct tier_conformance *f = &tc_factories[_i];
    struct tier *t = tc_new(f);
    const uint64_t sizes[] = {1, 100, 4095, 4096, 4097, 65536 + 123, f->block};
    enum { N = sizeof(sizes) / sizeof(sizes[0]) };
    struct tier_loc loc[N];
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(t->ops->alloc(t, sizes[i], &loc[i]), 0);
        tc_roundtrip(f, t, &loc[i], 0, sizes[i], 100 + (uint64_t)i);
    }
    /* all live at once: no write above reached into another block */
    for (int i = 0; i < N; i++)
        tc_check_bytes(f, t, &loc[i], sizes[i], 100 + (uint64_t)i);
    /* an inner range, and the very last byte of a slot */
    tc_roundtrip(f, t, &loc[N - 1], 17, sizes[N - 1] / 2, 7);
    tc_roundtrip(f, t, &loc[N - 1], loc[N - 1].len - 1, 1, 8);
    for (int i = 0; i < N; i++)
        t->ops->free(t, &loc[i]);
    ck_assert_uint_eq(t->ops->usage(t), 0);
    tc_del(f, t);
}
END_TEST

START_TEST(tc_whole_capacity)
{
    const struct tier_conformance *f = &tc_factories[_i];
    struct tier *t = tc_new(f);
    uint64_t cap = t->ops->capacity(t);
    struct tier_loc loc, other;
    ck_assert_int_eq(t->ops->alloc(t, cap, &loc), 0);
    ck_assert_uint_eq(loc.len, cap);
    ck_assert_int_eq(t->ops->alloc(t, 1, &other), -ENOSPC);
    tc_roundtrip(f, t, &loc, 0, cap, 42);
    t->ops->free(t, &loc);
    ck_assert_uint_eq(t->ops->usage(t), 0);
    /* the room is whole again */
    ck_assert_int_eq(t->ops->alloc(t, cap, &loc), 0);
    t->ops->free(t, &loc);
    tc_del(f, t);
}
END_TEST

START_TEST(tc_fill_to_enospc)
{
    const struct tier_conformance *f = &tc_factories[_i];
    struct tier *t = tc_new(f);
    uint64_t cap = t->ops->capacity(t);
    uint64_t max = cap / f->block + 1;
    struct tier_loc *loc = calloc(max, sizeof(*loc));
    ck_assert_ptr_nonnull(loc);
    uint64_t n = 0;
    int ret;
    while ((ret = t->ops->alloc(t, f->block, &loc[n])) == 0) {
        n++;
        ck_assert_uint_le(n, cap / f->block);
    }
    ck_assert_int_eq(ret, -ENOSPC);
    ck_assert_uint_ge(n, 1);
    ck_assert_uint_le(t->ops->usage(t), cap);
    /* a second refusal changes nothing */
    struct tier_loc spare;
    ck_assert_int_eq(t->ops->alloc(t, f->block, &spare), -ENOSPC);
    uint64_t full = t->ops->usage(t);
    /* free one in the middle: exactly its room comes back */
    t->ops->free(t, &loc[n / 2]);
    ck_assert_uint_eq(t->ops->usage(t), full - loc[n / 2].len);
    ck_assert_int_eq(t->ops->alloc(t, f->block, &loc[n / 2]), 0);
    ck_assert_uint_eq(t->ops->usage(t), full);
    ck_assert_int_eq(t->ops->alloc(t, f->block, &spare), -ENOSPC);
    /* the last block still holds its bytes when the tier is full */
    tc_roundtrip(f, t, &loc[n - 1], 0, f->block, 9);
    for (uint64_t i = 0; i < n; i++)
        t->ops->free(t, &loc[i]);
    ck_assert_uint_eq(t->ops->usage(t), 0);
    free(loc);
    tc_del(f, t);
}
END_TEST

START_TEST(tc_bad_alloc)
{
    const struct tier_conformance *f = &tc_factories[_i];
    struct tier *t = tc_new(f);
    uint64_t cap = t->ops->capacity(t);
    struct tier_loc loc;
    ck_assert_int_eq(t->ops->alloc(t, 0, &loc), -EINVAL);
    ck_assert_int_eq(t->ops->alloc(t, cap + 1, &loc), -EINVAL);
    ck_assert_int_eq(t->ops->alloc(t, UINT64_MAX, &loc), -EINVAL);
    ck_assert_int_eq(t->ops->alloc(t, UINT64_MAX - 4095, &loc), -EINVAL);
    ck_assert_uint_eq(t->ops->usage(t), 0);
    /* refusals leave the tier usable */
    ck_assert_int_eq(t->ops->alloc(t, f->block, &loc), 0);
    t->ops->free(t, &loc);
    ck_assert_uint_eq(t->ops->usage(t), 0);
    tc_del(f, t);
}
END_TEST

START_TEST(tc_out_of_bounds)
{
    const struct tier_conformance *f = &tc_factories[_i];
    struct tier *t = tc_new(f);
    uint64_t cap = t->ops->capacity(t);
    struct tier_loc loc;
    ck_assert_int_eq(t->ops->alloc(t, f->block, &loc), 0);
    uint64_t n = loc.len + 1;
    unsigned char *buf = calloc(1, n);
    ck_assert_ptr_nonnull(buf);
    struct tc_done d = {0, 0};
    const struct {
        uint64_t off, len;
    } bad[] = {
        {0, 0},                 /* zero length */
        {0, loc.len + 1},       /* one byte past the slot */
        {loc.len, 1},           /* starts at the end */
        {1, loc.len},           /* ends one past */
        {loc.len + 4096, 1},    /* far past */
        {1, UINT64_MAX},        /* off+len wraps */
        {UINT64_MAX, 2},        /* off+len wraps */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        /* buf holds loc.len + 1 bytes; longer lengths must be refused before any copy */
        uint64_t len = bad[i].len;
        ck_assert_msg(t->ops->write(t, &loc, bad[i].off, buf, len, tc_done_cb, &d) == -EINVAL,
                      "write off %llu len %llu accepted", (unsigned long long)bad[i].off,
                      (unsigned long long)len);
        ck_assert_msg(t->ops->read(t, &loc, bad[i].off, buf, len, tc_done_cb, &d) == -EINVAL,
                      "read off %llu len %llu accepted", (unsigned long long)bad[i].off,
                      (unsigned long long)len);
    }
    /* a forged location outside the tier */
    struct tier_loc forged = loc;
    forged.off = cap;
    forged.len = 4096;
    ck_assert_int_eq(t->ops->write(t, &forged, 0, buf, 1, tc_done_cb, &d), -EINVAL);
    ck_assert_int_eq(t->ops->read(t, &forged, 0, buf, 1, tc_done_cb, &d), -EINVAL);
    forged.off = cap - 4096;
    forged.len = 8192;
    ck_assert_int_eq(t->ops->write(t, &forged, 4096, buf, 1, tc_done_cb, &d), -EINVAL);
    ck_assert_int_eq(t->ops->read(t, &forged, 4096, buf, 1, tc_done_cb, &d), -EINVAL);
    forged.off = UINT64_MAX - 4095;
    forged.len = 8192;
    ck_assert_int_eq(t->ops->write(t, &forged, 0, buf, 1, tc_done_cb, &d), -EINVAL);
    ck_assert_int_eq(t->ops->read(t, &forged, 0, buf, 1, tc_done_cb, &d), -EINVAL);
    tc_drain(f, t);
    ck_assert_int_eq(d.calls, 0);
    /* the slot itself is still fine, up to its last byte */
    tc_roundtrip(f, t, &loc, 0, loc.len, 11);
    t->ops->free(t, &loc);
    free(buf);
    tc_del(f, t);
}
END_TEST

START_TEST(tc_done_once)
{
    const struct tier_conformance *f = &tc_factories[_i];
    struct tier *t = tc_new(f);
    struct tier_loc loc;
    ck_assert_int_eq(t->ops->alloc(t, f->block, &loc), 0);
    enum { OPS = 16 };
    struct tc_done d[OPS];
    unsigned char *buf = malloc(4096 * OPS);
    ck_assert_ptr_nonnull(buf);
    tc_fill(buf, 4096 * OPS, 3);
    uint64_t chunk = loc.len / OPS < 4096 ? loc.len / OPS : 4096;
    ck_assert_uint_ge(chunk, 1);
    /* several in flight at once, each with its own callback state */
    for (int i = 0; i < OPS; i++) {
        d[i] = (struct tc_done){0, -1};
        ck_assert_int_eq(t->ops->write(t, &loc, (uint64_t)i * chunk, buf + i * 4096, chunk,
                                       tc_done_cb, &d[i]),
                         0);
    }
    tc_drain(f, t);
    for (int i = 0; i < OPS; i++) {
        ck_assert_int_eq(d[i].calls, 1);
        ck_assert_int_eq(d[i].status, 0);
    }
    unsigned char *got = malloc(chunk);
    ck_assert_ptr_nonnull(got);
    for (int i = 0; i < OPS; i++) {
        d[i] = (struct tc_done){0, -1};
        ck_assert_int_eq(
            t->ops->read(t, &loc, (uint64_t)i * chunk, got, chunk, tc_done_cb, &d[i]), 0);
        tc_drain(f, t);
        ck_assert_int_eq(d[i].calls, 1);
        ck_assert_int_eq(d[i].status, 0);
        ck_assert_int_eq(memcmp(got, buf + i * 4096, chunk), 0);
    }
    /* draining again calls nothing twice */
    tc_drain(f, t);
    for (int i = 0; i < OPS; i++)
        ck_assert_int_eq(d[i].calls, 1);
    free(got);
    free(buf);
    t->ops->free(t, &loc);
    tc_del(f, t);
}
END_TEST

TCase *tier_conformance_tcase(const struct tier_conformance *f)
{
    if (tc_count >= TIER_CONFORMANCE_MAX || !f || !f->create || f->block == 0 ||
        f->capacity / f->block < 4) {
        /* a suite that registers no cases would pass them all: stop it here */
        fprintf(stderr, "tier_conformance: %s: %s\n", f && f->name ? f->name : "?",
                tc_count >= TIER_CONFORMANCE_MAX ? "factory table full"
                                                 : "factory without create, or capacity "
                                                   "below 4 blocks");
        exit(2);
    }
    int i = tc_count++;
    tc_factories[i] = *f;
    snprintf(tc_names[i], sizeof(tc_names[i]), "conformance:%s", f->name ? f->name : "?");
    TCase *tc = tcase_create(tc_names[i]);
    tcase_add_loop_test(tc, tc_accounting, i, i + 1);
    tcase_add_loop_test(tc, tc_read_after_write, i, i + 1);
    if (f->whole_slot)
        tcase_add_loop_test(tc, tc_whole_capacity, i, i + 1);
    tcase_add_loop_test(tc, tc_fill_to_enospc, i, i + 1);
    tcase_add_loop_test(tc, tc_bad_alloc, i, i + 1);
    tcase_add_loop_test(tc, tc_out_of_bounds, i, i + 1);
    tcase_add_loop_test(tc, tc_done_once, i, i + 1);
    return tc;
}
