/*
 * check_fast.c — the shared index of the fast path (daemon/fast.c), alone: every block
 * published is found by a reader walking the table as libkvc does, at the load the store
 * sizes it for; the stash, moves, updates, removals, and a table too small for its keys.
 * Counts, not timings.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client/kvc_fast.h"
#include "daemon/fast.h"
#include "tests/lib/daemon.h"
#include "tests/lib/rng.h"

/* A reader's view, mapped from a read-only descriptor as a client maps it. */
struct fx_view {
    const uint8_t *map;
    uint64_t bytes;
    const struct kvc_fast_hdr *h;
};

static struct fx_view fx_map(const struct fast_index *fi)
{
    struct fx_view v;
    int fd = fast_index_fd_ro(fi);
    ck_assert_int_ge(fd, 0);
    v.bytes = fast_index_bytes(fi);
    v.map = mmap(NULL, v.bytes, PROT_READ, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(v.map, MAP_FAILED);
    close(fd);
    v.h = (const struct kvc_fast_hdr *)v.map;
    return v;
}

static void fx_unmap(struct fx_view *v)
{
    munmap((void *)v->map, v->bytes);
}

/* The reader's lookup (client/libkvc_fast.c kvc_fast_find, single-threaded): the entry of
 * (ns, k) in its two buckets, or in the stash when the header says it is used. */
static const struct kvc_fast_ent *fx_find(const struct fx_view *v, uint16_t ns, uint64_t lo,
                                          uint64_t hi)
{
    const struct kvc_fast_ent *ents = (const struct kvc_fast_ent *)(v->map + v->h->ents_off);
    uint32_t b[2];
    kvc_fast_buckets(v->h->seed, v->h->nbuckets, ns, lo, hi, &b[0], &b[1]);
    for (int i = 0; i < 2; i++)
        for (uint32_t w = 0; w < KVC_FAST_WAYS; w++) {
            const struct kvc_fast_ent *e = &ents[(uint64_t)b[i] * KVC_FAST_WAYS + w];
            ck_assert_uint_eq(e->seq & 1, 0);
            if (e->klo == lo && e->khi == hi && e->ns == ns)
                return e;
        }
    if (!v->h->stash_used)
        return NULL;
    const struct kvc_fast_ent *st = ents + (uint64_t)v->h->nbuckets * KVC_FAST_WAYS;
    for (uint32_t i = 0; i < v->h->nstash; i++)
        if (st[i].klo == lo && st[i].khi == hi && st[i].ns == ns)
            return &st[i];
    return NULL;
}

static uint64_t fx_rng = 0x9e3779b97f4a7c15ull;
static uint64_t fx_rand(void)
{
    return rng_next(&fx_rng);
}

#define MiB (1024ull * 1024)

/* An arena full of 4 KiB blocks (one per unit: the most it can hold), in an index sized for
 * that: every block found, none refused; half of them replaced by others, all found again. */
START_TEST(test_fast_full_arena_4k)
{
    const uint64_t arena = 256 * MiB, units = arena >> KVC_FAST_UNIT_SHIFT;
    int err;
    struct fast_index *fi = fast_index_new(0, arena, 4, units, 1, false, &err);
    ck_assert_ptr_nonnull(fi);
    struct fx_view v = fx_map(fi);
    struct kvc_wire_key *keys = calloc(units, sizeof(*keys));
    ck_assert_ptr_nonnull(keys);
    for (uint64_t u = 0; u < units; u++) {
        keys[u] = (struct kvc_wire_key){.lo = fx_rand() | 1, .hi = fx_rand()};
        fast_publish(fi, 1, &keys[u], u << KVC_FAST_UNIT_SHIFT, 4096, KVC_WIRE_FORMAT_RAW);
    }
    struct fast_index_stats st;
    fast_index_stats_get(fi, &st);
    ck_assert_uint_eq(st.published, units);
    ck_assert_uint_eq(st.full, 0);
    uint64_t found = 0;
    for (uint64_t u = 0; u < units; u++) {
        const struct kvc_fast_ent *e = fx_find(&v, 1, keys[u].lo, keys[u].hi);
        found += e && e->unit == u && KVC_FAST_FMT_FORMAT(e->fmt) == KVC_WIRE_FORMAT_RAW;
    }
    ck_assert_uint_eq(found, units);
    /* Half of them leave, others take their slots (in another namespace id). */
    for (uint64_t u = 0; u < units; u += 2) {
        fast_unpublish(fi, 1, &keys[u]);
        keys[u] = (struct kvc_wire_key){.lo = fx_rand() | 1, .hi = fx_rand()};
        fast_publish(fi, 2, &keys[u], u << KVC_FAST_UNIT_SHIFT, 4096, KVC_WIRE_FORMAT_RAW);
    }
    found = 0;
    for (uint64_t u = 0; u < units; u++)
        found += fx_find(&v, u % 2 ? 1 : 2, keys[u].lo, keys[u].hi) != NULL;
    ck_assert_uint_eq(found, units);
    fast_index_stats_get(fi, &st);
    ck_assert_uint_eq(st.published, units);
    ck_assert_uint_eq(st.full, 0);
    printf("check_fast: %llu blocks of 4 KiB in %llu buckets: %llu moves, %llu in the stash\n",
           (unsigned long long)units, (unsigned long long)v.h->nbuckets,
           (unsigned long long)st.moves, (unsigned long long)st.stash);
    fx_unmap(&v);
    free(keys);
    fast_index_free(fi);
}
END_TEST

/* Publishing a key again updates its one entry (a move, a quantization); removal takes it
 * out; a slot outside the arena or off a unit is never published. */
START_TEST(test_fast_update_remove)
{
    int err;
    struct fast_index *fi = fast_index_new(3, 16 * MiB, 4, 64, 1, false, &err);
    ck_assert_ptr_nonnull(fi);
    struct fx_view v = fx_map(fi);
    struct kvc_wire_key k = {.lo = 11, .hi = 12}, zero = {0, 0};
    fast_publish(fi, 1, &k, 8192, 16384, KVC_WIRE_FORMAT_RAW);
    const struct kvc_fast_ent *e = fx_find(&v, 1, 11, 12);
    ck_assert_ptr_nonnull(e);
    ck_assert_uint_eq(e->unit, 2);
    fast_publish(fi, 1, &k, 40960, 8192, KVC_WIRE_FORMAT_Q8_0);
    ck_assert_ptr_eq(fx_find(&v, 1, 11, 12), e);
    ck_assert_uint_eq(e->unit, 10);
    ck_assert_uint_eq(KVC_FAST_FMT_FORMAT(e->fmt), KVC_WIRE_FORMAT_Q8_0);
    ck_assert_uint_eq(KVC_FAST_FMT_UNITS(e->fmt), 2);
    ck_assert_ptr_null(fx_find(&v, 2, 11, 12)); /* another namespace's key is another key */
    struct fast_index_stats st;
    fast_index_stats_get(fi, &st);
    ck_assert_uint_eq(st.published, 1);
    fast_unpublish(fi, 1, &k);
    ck_assert_ptr_null(fx_find(&v, 1, 11, 12));
    fast_unpublish(fi, 1, &k); /* not there: nothing */
    fast_publish(fi, 1, &k, 16 * MiB, 4096, KVC_WIRE_FORMAT_RAW);
    fast_publish(fi, 1, &k, 4097, 4096, KVC_WIRE_FORMAT_RAW);
    fast_publish(fi, 1, &zero, 0, 4096, KVC_WIRE_FORMAT_RAW);
    fast_index_stats_get(fi, &st);
    ck_assert_uint_eq(st.published, 0);
    ck_assert_uint_eq(v.h->arena_id, 3);
    ck_assert_uint_eq(v.h->retired, 0);
    fast_index_retire(fi);
    ck_assert_uint_ne(v.h->retired, 0); /* readers see it through their mapping */
    fx_unmap(&v);
    fast_index_free(fi);
}
END_TEST

/* A table far too small for its keys (as keys chosen to collide would make one): the buckets
 * and the stash fill, the rest is refused and counted, and everything published is found;
 * freeing bucket room takes stash entries back. */
START_TEST(test_fast_overflow_stash)
{
    int err;
    struct fast_index *fi = fast_index_new(0, 64 * MiB, 4, 1, 1, false, &err);
    ck_assert_ptr_nonnull(fi);
    struct fx_view v = fx_map(fi);
    const uint32_t room = v.h->nbuckets * KVC_FAST_WAYS + v.h->nstash, n = room + 100;
    struct kvc_wire_key keys[512];
    ck_assert_uint_le(n, 512);
    for (uint32_t i = 0; i < n; i++) {
        keys[i] = (struct kvc_wire_key){.lo = fx_rand() | 1, .hi = i};
        fast_publish(fi, 1, &keys[i], (uint64_t)i << KVC_FAST_UNIT_SHIFT, 4096,
                     KVC_WIRE_FORMAT_RAW);
    }
    struct fast_index_stats st;
    fast_index_stats_get(fi, &st);
    ck_assert_uint_eq(st.published, room);
    ck_assert_uint_eq(st.full, n - room);
    ck_assert_uint_eq(st.stash, v.h->nstash);
    ck_assert_uint_ne(v.h->stash_used, 0);
    uint32_t found = 0;
    for (uint32_t i = 0; i < n; i++)
        found += fx_find(&v, 1, keys[i].lo, keys[i].hi) != NULL;
    ck_assert_uint_eq(found, room);
    /* Every key leaves: bucket removals draw the stash back, the stash empties. */
    for (uint32_t i = 0; i < n; i++)
        fast_unpublish(fi, 1, &keys[i]);
    fast_index_stats_get(fi, &st);
    ck_assert_uint_eq(st.published, 0);
    ck_assert_uint_eq(st.stash, 0);
    ck_assert_uint_eq(v.h->stash_used, 0);
    fx_unmap(&v);
    fast_index_free(fi);
}
END_TEST

/* Random churn at the sized load: at every step each published key is where a reader looks. */
START_TEST(test_fast_churn)
{
    const uint64_t cap = 20000;
    int err;
    struct fast_index *fi = fast_index_new(0, 1024 * MiB, 4, cap, 1, true, &err);
    ck_assert_ptr_nonnull(fi);
    struct fx_view v = fx_map(fi);
    struct kvc_wire_key *keys = calloc(cap, sizeof(*keys));
    bool *in = calloc(cap, sizeof(*in));
    uint64_t live = 0;
    for (int step = 0; step < 200000; step++) {
        uint64_t i = fx_rand() % cap;
        if (in[i]) {
            fast_unpublish(fi, 1, &keys[i]);
            live--;
        } else {
            keys[i] = (struct kvc_wire_key){.lo = fx_rand() | 1, .hi = fx_rand()};
            fast_publish(fi, 1, &keys[i], i << KVC_FAST_UNIT_SHIFT, 4096, KVC_WIRE_FORMAT_RAW);
            live++;
        }
        in[i] = !in[i];
    }
    uint64_t found = 0;
    for (uint64_t i = 0; i < cap; i++)
        if (in[i])
            found += fx_find(&v, 1, keys[i].lo, keys[i].hi) != NULL;
        else
            ck_assert_ptr_null(fx_find(&v, 1, keys[i].lo, keys[i].hi));
    struct fast_index_stats st;
    fast_index_stats_get(fi, &st);
    ck_assert_uint_eq(found, live);
    ck_assert_uint_eq(st.published, live);
    ck_assert_uint_eq(st.full, 0);
    fx_unmap(&v);
    free(keys);
    free(in);
    fast_index_free(fi);
}
END_TEST

static Suite *fast_suite(void)
{
    Suite *s = suite_create("fast");
    TCase *tc = tcase_create("index");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_fast_full_arena_4k);
    tcase_add_test(tc, test_fast_update_remove);
    tcase_add_test(tc, test_fast_overflow_stash);
    tcase_add_test(tc, test_fast_churn);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return daemon_suite_run(fast_suite());
}
