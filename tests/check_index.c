/* check_index — the block pool and the (namespace, key) map. */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/index.h"
#include "tests/lib/daemon.h"

static struct kvc_wire_key key_of(uint64_t i)
{
    return (struct kvc_wire_key){.lo = i * 0x9e3779b97f4a7c15ull + 1, .hi = i};
}

static uint32_t add(struct index *ix, uint16_t ns, uint64_t k)
{
    uint32_t idx;
    ck_assert_int_eq(index_block_new(ix, &idx), 0);
    ix->blocks[idx].ns = ns;
    ix->blocks[idx].key = key_of(k);
    ix->blocks[idx].state = BLOCK_STATE_COMMITTED;
    ck_assert_int_eq(index_insert(ix, idx), 0);
    return idx;
}

START_TEST(test_insert_find_remove)
{
    struct index ix;
    ck_assert_int_eq(index_init(&ix, 16), 0);
    uint32_t a = add(&ix, 1, 7), b = add(&ix, 2, 7);
    struct kvc_wire_key k7 = key_of(7), k8 = key_of(8);
    ck_assert_uint_eq(index_find(&ix, 1, &k7), a);
    ck_assert_uint_eq(index_find(&ix, 2, &k7), b); /* namespaces never mix */
    ck_assert_uint_eq(index_find(&ix, 3, &k7), INDEX_NONE);
    ck_assert_uint_eq(index_find(&ix, 1, &k8), INDEX_NONE);
    ck_assert_int_eq(index_insert(&ix, a), -EEXIST);
    ck_assert_int_eq(index_remove(&ix, a), 0);
    ck_assert_int_eq(index_remove(&ix, a), -ENOENT);
    ck_assert_uint_eq(index_find(&ix, 1, &k7), INDEX_NONE);
    ck_assert_uint_eq(index_find(&ix, 2, &k7), b);
    index_fini(&ix);
}
END_TEST

/* Many entries with growth of pool and map, random removals (backward-shift deletion must
 * keep every remaining key findable), pool reuse. */
START_TEST(test_random_against_model)
{
    enum { N = 50000 };
    struct index ix;
    uint32_t *where = malloc(N * sizeof(*where));
    unsigned seed = 12345;
    ck_assert_int_eq(index_init(&ix, 8), 0);
    for (uint32_t i = 0; i < N; i++)
        where[i] = INDEX_NONE;
    for (int step = 0; step < 200000; step++) {
        uint32_t k = (uint32_t)rand_r(&seed) % N;
        if (where[k] == INDEX_NONE) {
            where[k] = add(&ix, (uint16_t)(k % 3 + 1), k);
        } else if (rand_r(&seed) % 2) {
            ck_assert_int_eq(index_remove(&ix, where[k]), 0);
            index_block_delete(&ix, where[k]);
            where[k] = INDEX_NONE;
        }
        if (step % 20000 == 0)
            for (uint32_t j = 0; j < N; j++) {
                struct kvc_wire_key kj = key_of(j);
                ck_assert_uint_eq(index_find(&ix, (uint16_t)(j % 3 + 1), &kj), where[j]);
            }
    }
    uint32_t live = 0;
    for (uint32_t j = 0; j < N; j++)
        live += where[j] != INDEX_NONE;
    ck_assert_uint_eq(ix.live, live);
    ck_assert_uint_eq(ix.used, live);
    ck_assert_uint_le(ix.nblocks, N); /* freed entries were reused */
    index_fini(&ix);
    free(where);
}
END_TEST

/* A probe compares only the blocks whose slot tag matches the key's: a miss reads almost
 * none (without the tags every entry a probe walks past is read: about 1.3 per miss at the
 * map's load), a hit about one. From a pool of 64, so the slots' split between index and tag
 * changes with every doubling on the way. */
START_TEST(test_probe_reads_matching_blocks_only)
{
    enum { N = 200000 };
    struct index ix;
    ck_assert_int_eq(index_init(&ix, 64), 0);
    for (uint32_t i = 0; i < N; i++)
        add(&ix, 1, i);
    uint64_t r0 = ix.reads;
    for (uint32_t i = 0; i < N; i++) {
        struct kvc_wire_key k = key_of(N + i);
        ck_assert_uint_eq(index_find(&ix, 1, &k), INDEX_NONE);
    }
    uint64_t miss_reads = ix.reads - r0;
    r0 = ix.reads;
    for (uint32_t i = 0; i < N; i++) {
        struct kvc_wire_key k = key_of(i);
        ck_assert_uint_eq(index_find(&ix, 1, &k), i);
    }
    uint64_t hit_reads = ix.reads - r0;
    printf("index: blocks read per probe at %d blocks: %.4f a miss, %.4f a hit (%u tag bits)\n",
           N, (double)miss_reads / N, (double)hit_reads / N, 32 - ix.ibits);
    ck_assert_uint_le(miss_reads, N / 100);
    ck_assert_uint_ge(hit_reads, N);
    ck_assert_uint_le(hit_reads, N + N / 100);
    index_fini(&ix);
}
END_TEST

/* index_reserve: the map sized once for what is coming, so filling a pool of that many
 * blocks rebuilds it no more (each rebuild is O(entries) on the daemon's loop), every block
 * still found; without it the same fill rebuilds it at every doubling. */
/* A lookup's probes a few keys ahead (index_ahead_find) resolve every key as index_find
 * does — present and absent keys, runs longer than its ring of hashes, a key asked out of
 * order — and count one find a key resolved, none for the keys only looked ahead at. */
START_TEST(test_ahead_matches_find)
{
    enum { N = 4000, Q = 300 };
    struct index ix;
    struct kvc_wire_key q[Q];
    unsigned seed = 777;
    ck_assert_int_eq(index_init(&ix, 64), 0);
    for (uint64_t k = 0; k < N; k += 2)
        add(&ix, 1, k); /* even keys present, odd ones absent */
    for (uint32_t n = 1; n <= Q; n = n * 3 + 1) {
        for (uint32_t i = 0; i < n; i++)
            q[i] = key_of((uint64_t)rand_r(&seed) % N);
        struct index_ahead a;
        uint64_t finds0 = ix.finds;
        uint32_t upto = n > 5 ? n - 5 : n; /* a caller that stops early (a miss ends a run) */
        index_ahead_init(&a, &ix, 1, q, n);
        for (uint32_t i = 0; i < upto; i++) {
            uint32_t want = index_find(&ix, 1, &q[i]);
            ck_assert_uint_eq(index_ahead_find(&a, &ix, i), want);
            ck_assert_uint_eq(want == INDEX_NONE, q[i].hi % 2 == 1);
        }
        ck_assert_uint_eq(ix.finds - finds0, 2ull * upto);
        if (n > INDEX_AHEAD_RING + 2) /* long out of the ring: asked again, still right */
            ck_assert_uint_eq(index_ahead_find(&a, &ix, 0), index_find(&ix, 1, &q[0]));
        struct kvc_wire_key other = q[0]; /* the same key in another namespace: a miss */
        index_ahead_init(&a, &ix, 2, &other, 1);
        ck_assert_uint_eq(index_ahead_find(&a, &ix, 0), INDEX_NONE);
    }
    index_fini(&ix);
}
END_TEST

/* Whether the mapping holding p is marked for huge pages ("hg" in its smaps VmFlags); -1
 * when the kernel has no transparent huge pages or the file cannot be read. */
static int vma_huge(const void *p)
{
    char line[512];
    uintptr_t at = (uintptr_t)p, lo = 0, hi = 0;
    int in = 0, huge = -1;
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return -1;
    bool never = fgets(line, sizeof(line), f) && strstr(line, "[never]");
    fclose(f);
    if (never || !(f = fopen("/proc/self/smaps", "r")))
        return -1;
    while (fgets(line, sizeof(line), f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            lo = a;
            hi = b;
            in = at >= lo && at < hi;
        } else if (in && !strncmp(line, "VmFlags:", 8)) {
            huge = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(f);
    return huge;
}

/* A reservation sizes the pool of blocks too (no copy of it on the loop as it fills) and
 * puts the map's slots on huge pages, marked before any of them is used: at a million blocks
 * every probe reads a random page of them. The pool stays on small pages (a huge page is
 * resident whole once touched: the daemon's bytes a block). */
START_TEST(test_reserve_pool_and_huge_map)
{
    enum { N = 1u << 20 };
    struct index ix;
    ck_assert_int_eq(index_init(&ix, 64), 0);
    add(&ix, 1, 1);
    ck_assert_int_eq(index_reserve(&ix, N), 0);
    ck_assert_uint_ge(ix.cap, N);
    struct kvc_wire_key k = key_of(1);
    ck_assert_uint_eq(index_find(&ix, 1, &k), 0); /* the block already there, kept */
    for (uint32_t i = 2; i < 5000; i++)
        add(&ix, 1, i);
    ck_assert_uint_eq(ix.cap, N); /* no doubling on the way */
    int hs = vma_huge((const uint8_t *)ix.slots + (4u << 20));
    if (hs < 0)
        printf("index: no transparent huge pages here: the map's mark not checked\n");
    else
        ck_assert_msg(hs == 1, "the map's slots not marked for huge pages");
    index_fini(&ix);
}
END_TEST

START_TEST(test_reserve_no_rebuilds)
{
    enum { N = 300000 };
    struct index ix, grown;
    ck_assert_int_eq(index_init(&ix, 4096), 0);
    ck_assert_int_eq(index_init(&grown, 4096), 0);
    ck_assert_int_eq(index_reserve(&ix, N), 0);
    ck_assert_uint_eq(ix.rebuilds, 1);
    ck_assert_int_eq(index_reserve(&ix, N / 2), 0); /* never shrinks, nothing to do */
    ck_assert_uint_eq(ix.rebuilds, 1);
    for (uint32_t i = 0; i < N; i++) {
        add(&ix, 1, i);
        add(&grown, 1, i);
    }
    ck_assert_uint_eq(ix.rebuilds, 1);
    ck_assert_uint_ge(grown.rebuilds, 7); /* 8,192 slots doubled to 524,288, tags narrowed */
    for (uint32_t i = 0; i < N; i++) {
        struct kvc_wire_key k = key_of(i), miss = key_of(N + i);
        ck_assert_uint_eq(index_find(&ix, 1, &k), i);
        ck_assert_uint_eq(index_find(&ix, 1, &miss), INDEX_NONE);
    }
    ck_assert_uint_eq(ix.nslots, grown.nslots);
    ck_assert_uint_eq(ix.ibits, grown.ibits);
    printf("index: %d blocks after a reservation: %llu rebuild, %llu without one\n", N,
           (unsigned long long)ix.rebuilds, (unsigned long long)grown.rebuilds);
    index_fini(&ix);
    index_fini(&grown);
}
END_TEST

/* The budget in the design: at most 128 bytes of metadata per block at a million blocks. */
START_TEST(test_metadata_per_block)
{
    enum { N = 1000000 };
    struct index ix;
    ck_assert_int_eq(index_init(&ix, 1024), 0);
    for (uint32_t i = 0; i < N; i++)
        add(&ix, 1, i);
    double per = ((double)ix.cap * sizeof(struct block) + (double)ix.nslots * sizeof(uint32_t)) / N;
    /* The pool doubles, so allow its slack: what is used per block stays within budget. */
    double used = ((double)ix.nblocks * sizeof(struct block) + (double)ix.nslots * sizeof(uint32_t)) / N;
    printf("index: %.1f bytes per block used, %.1f allocated, at %d blocks\n", used, per, N);
    ck_assert(used <= 128.0);
    index_fini(&ix);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("index");
    TCase *tc = tcase_create("index");
    tcase_set_timeout(tc, daemon_slow() * 60);
    tcase_add_test(tc, test_insert_find_remove);
    tcase_add_test(tc, test_random_against_model);
    tcase_add_test(tc, test_probe_reads_matching_blocks_only);
    tcase_add_test(tc, test_metadata_per_block);
    tcase_add_test(tc, test_ahead_matches_find);
    tcase_add_test(tc, test_reserve_no_rebuilds);
    tcase_add_test(tc, test_reserve_pool_and_huge_map);
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
