/*
 * check_slab.c — the size-class slab allocator, alone.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/slab.h"
#include "tests/lib/daemon.h"
#include "tests/lib/rng.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024)

static struct slab_stats stats_of(const struct slab *s)
{
    struct slab_stats st;
    slab_stats_get(s, &st);
    return st;
}

START_TEST(test_new_bad_args)
{
    ck_assert_ptr_null(slab_new(0, 4096));
    ck_assert_ptr_null(slab_new(1 * MiB, 0));
    ck_assert_ptr_null(slab_new(1 * MiB, 2048));
    ck_assert_ptr_null(slab_new(1 * MiB, 12288));
    ck_assert_ptr_null(slab_new(1 * MiB, 2 * MiB)); /* not one whole page */
    slab_free(NULL);
    struct slab *s = slab_new(5 * MiB + 123, 2 * MiB);
    ck_assert_ptr_nonnull(s);
    struct slab_stats st = stats_of(s);
    ck_assert_uint_eq(st.capacity, 4 * MiB); /* whole pages only */
    ck_assert_uint_eq(st.pages, 2);
    ck_assert_uint_eq(st.pages_free, 2);
    ck_assert_uint_eq(st.used, 0);
    ck_assert_uint_eq(st.classes, 0);
    ck_assert_uint_eq(st.slabs, 0);
    slab_free(s);
}
END_TEST

START_TEST(test_classes)
{
    struct slab *s = slab_new(4 * MiB, 64 * KiB);
    int a = slab_class_get(s, 1);
    ck_assert_int_ge(a, 0);
    ck_assert_uint_eq(slab_class_slot(s, a), 4096);
    ck_assert_int_eq(slab_class_get(s, 4096), a);
    int b = slab_class_get(s, 4097);
    ck_assert_int_ge(b, 0);
    ck_assert_int_ne(a, b);
    ck_assert_uint_eq(slab_class_slot(s, b), 8192);
    ck_assert_int_eq(slab_class_get(s, 8192), b);
    ck_assert_int_eq(slab_class_get(s, 1), a);
    ck_assert_int_eq(slab_class_get(s, 0), -EINVAL);
    ck_assert_int_eq(slab_class_get(s, 4 * MiB + 1), -EINVAL);
    ck_assert_int_eq(slab_class_get(s, UINT64_MAX), -EINVAL);
    ck_assert_uint_eq(slab_class_slot(s, -1), 0);
    ck_assert_uint_eq(slab_class_slot(s, 99), 0);
    /* the whole range is one valid slot */
    int w = slab_class_get(s, 4 * MiB);
    ck_assert_int_ge(w, 0);
    ck_assert_uint_eq(slab_class_slot(s, w), 4 * MiB);
    ck_assert_uint_eq(stats_of(s).classes, 3);
    /* the table fills at SLAB_MAX_CLASSES; existing classes still resolve */
    for (uint64_t k = 3; k < SLAB_MAX_CLASSES; k++) /* 4 MiB is the 3rd class */
        ck_assert_int_ge(slab_class_get(s, k * 4096), 0);
    ck_assert_uint_eq(stats_of(s).classes, SLAB_MAX_CLASSES);
    ck_assert_int_eq(slab_class_get(s, SLAB_MAX_CLASSES * 4096), -ENOSPC);
    ck_assert_int_eq(slab_class_get(s, 4096), a);
    uint64_t off, slot;
    int cls;
    ck_assert_int_eq(slab_alloc(s, SLAB_MAX_CLASSES * 4096, &off, &slot, &cls), -ENOSPC);
    ck_assert_uint_eq(stats_of(s).used, 0);
    slab_free(s);
}
END_TEST

START_TEST(test_slots_per_slab)
{
    /* 12 KiB on 2 MiB pages: one page holds 170 slots and wastes 8 KiB (< 1/8) */
    struct slab *s = slab_new(8 * MiB, 2 * MiB);
    uint64_t off, slot;
    int cls;
    ck_assert_int_eq(slab_alloc(s, 12 * KiB, &off, &slot, &cls), 0);
    ck_assert_uint_eq(off, 0);
    ck_assert_uint_eq(slot, 12 * KiB);
    ck_assert_uint_eq(slab_class_free_slots(s, cls), 169);
    ck_assert_uint_eq(stats_of(s).pages_free, 3);
    ck_assert_uint_eq(stats_of(s).slabs, 1);
    /* the rest of the slab fills before a second one is carved */
    for (int i = 1; i < 170; i++) {
        ck_assert_int_eq(slab_alloc(s, 10 * KiB, &off, &slot, &cls), 0);
        ck_assert_uint_eq(off, (uint64_t)i * 12 * KiB);
    }
    ck_assert_uint_eq(slab_class_free_slots(s, cls), 0);
    ck_assert_uint_eq(stats_of(s).slabs, 1);
    ck_assert_int_eq(slab_alloc(s, 12 * KiB, &off, &slot, &cls), 0);
    ck_assert_uint_eq(off, 2 * MiB);
    ck_assert_uint_eq(stats_of(s).slabs, 2);
    ck_assert_uint_eq(stats_of(s).used, 171 * 12 * KiB);
    slab_free(s);
}
END_TEST

/* slab_slot_cost (what kvcsim charges a block, docs/replay.md) is what the allocator
 * spends: pages taken over slots given, once its slabs are full, for small, odd and large
 * slots on small and large pages; 0 for bad arguments. */
START_TEST(test_slot_cost)
{
    static const uint64_t pages[] = {4 * KiB, 256 * KiB, 2 * MiB};
    static const uint64_t lens[] = {1,        4 * KiB,  20560,     24 * KiB + 1,
                                    36 * KiB, 64 * KiB, 700 * KiB, 3 * MiB};
    for (size_t p = 0; p < sizeof(pages) / sizeof(pages[0]); p++)
        for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
            struct slab *s = slab_new(64 * MiB, pages[p]);
            uint64_t off, slot, n = 0;
            int cls;
            ck_assert_ptr_nonnull(s);
            ck_assert_int_eq(slab_alloc(s, lens[l], &off, &slot, &cls), 0);
            n = 1 + slab_class_free_slots(s, cls); /* one slab, full */
            for (uint64_t i = 1; i < n; i++)
                ck_assert_int_eq(slab_alloc(s, lens[l], &off, &slot, &cls), 0);
            struct slab_stats st = stats_of(s);
            double spent = (double)((st.pages - st.pages_free) * pages[p]) / (double)n;
            ck_assert_msg(slab_slot_cost(pages[p], lens[l]) == spent,
                          "len %llu on %llu pages: cost %.1f, spent %.1f",
                          (unsigned long long)lens[l], (unsigned long long)pages[p],
                          slab_slot_cost(pages[p], lens[l]), spent);
            slab_free(s);
        }
    ck_assert(slab_slot_cost(256 * KiB, 0) == 0);
    ck_assert(slab_slot_cost(3 * KiB, 4 * KiB) == 0);
    ck_assert(slab_slot_cost(3 * 4 * KiB, 4 * KiB) == 0);
    ck_assert(slab_slot_cost(256 * KiB, 36 * KiB) == 256.0 * KiB / 7);
}
END_TEST

START_TEST(test_big_slot_runs)
{
    /* 3 MiB on 2 MiB pages: 2 pages would waste 1 MiB of 4, so slabs are 3 pages, 2 slots */
    struct slab *s = slab_new(12 * MiB, 2 * MiB);
    uint64_t off[5], slot;
    int cls;
    ck_assert_int_eq(slab_alloc(s, 3 * MiB, &off[0], &slot, &cls), 0);
    ck_assert_uint_eq(slot, 3 * MiB);
    ck_assert_uint_eq(off[0], 0);
    ck_assert_uint_eq(stats_of(s).pages_free, 3);
    ck_assert_uint_eq(slab_class_free_slots(s, cls), 1);
    for (int i = 1; i < 4; i++) {
        ck_assert_int_eq(slab_alloc(s, 3 * MiB - 100, &off[i], &slot, &cls), 0);
        ck_assert_uint_eq(off[i], (uint64_t)i * 3 * MiB);
    }
    ck_assert_uint_eq(stats_of(s).pages_free, 0);
    ck_assert_uint_eq(stats_of(s).slabs, 2);
    ck_assert_uint_eq(stats_of(s).used, 12 * MiB);
    ck_assert_int_eq(slab_alloc(s, 3 * MiB, &off[4], &slot, &cls), -ENOSPC);
    ck_assert_int_eq(slab_alloc(s, 4096, &off[4], &slot, &cls), -ENOSPC);
    /* an offset inside a 3 MiB slot, on a page boundary, is not a slot start */
    ck_assert_int_eq(slab_release(s, 2 * MiB), -EINVAL);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(slab_release(s, off[i]), 0);
    ck_assert_uint_eq(stats_of(s).pages_free, 6);
    slab_free(s);

    /* 5 MiB on 2 MiB pages: 3 pages waste 1/6, 4 pages 3/8, 5 pages hold 2 slots exactly */
    s = slab_new(10 * MiB, 2 * MiB);
    ck_assert_int_eq(slab_alloc(s, 5 * MiB, &off[0], &slot, &cls), 0);
    ck_assert_uint_eq(stats_of(s).pages_free, 0);
    ck_assert_int_eq(slab_alloc(s, 5 * MiB, &off[1], &slot, &cls), 0);
    ck_assert_uint_eq(off[1], 5 * MiB);
    ck_assert_int_eq(slab_release(s, off[0]), 0);
    ck_assert_int_eq(slab_release(s, off[1]), 0);
    slab_free(s);

    /* a slot bigger than the ideal run still fits a small range: 3 MiB in 4 MiB */
    s = slab_new(4 * MiB, 2 * MiB);
    ck_assert_int_eq(slab_alloc(s, 3 * MiB, &off[0], &slot, &cls), 0);
    ck_assert_int_eq(slab_alloc(s, 3 * MiB, &off[1], &slot, &cls), -ENOSPC);
    ck_assert_int_eq(slab_release(s, off[0]), 0);
    slab_free(s);
}
END_TEST

START_TEST(test_pages_move_between_classes)
{
    struct slab *s = slab_new(1 * MiB, 64 * KiB); /* 16 pages */
    uint64_t off[256], slot;
    int cls;
    for (int i = 0; i < 16; i++)
        ck_assert_int_eq(slab_alloc(s, 64 * KiB, &off[i], &slot, &cls), 0);
    ck_assert_uint_eq(stats_of(s).pages_free, 0);
    ck_assert_int_eq(slab_alloc(s, 4096, &off[16], &slot, &cls), -ENOSPC);
    /* one empty slab: its page serves the small class at once */
    ck_assert_int_eq(slab_release(s, off[5]), 0);
    ck_assert_uint_eq(stats_of(s).pages_free, 1);
    ck_assert_int_eq(slab_alloc(s, 4096, &off[16], &slot, &cls), 0);
    ck_assert_uint_eq(off[16], 5 * 64 * KiB);
    ck_assert_int_eq(slab_release(s, off[16]), 0);
    for (int i = 0; i < 16; i++)
        if (i != 5)
            ck_assert_int_eq(slab_release(s, off[i]), 0);
    struct slab_stats st = stats_of(s);
    ck_assert_uint_eq(st.pages_free, 16);
    ck_assert_uint_eq(st.slabs, 0);
    ck_assert_uint_eq(st.used, 0);
    /* all of it now for 4 KiB slots */
    for (int i = 0; i < 256; i++)
        ck_assert_int_eq(slab_alloc(s, 4096, &off[i], &slot, &cls), 0);
    ck_assert_int_eq(slab_alloc(s, 4096, &slot, &slot, &cls), -ENOSPC);
    ck_assert_uint_eq(stats_of(s).slabs, 16);
    ck_assert_uint_eq(stats_of(s).used, 1 * MiB);
    for (int i = 0; i < 256; i++)
        ck_assert_int_eq(slab_release(s, off[i]), 0);
    ck_assert_uint_eq(stats_of(s).pages_free, 16);
    slab_free(s);
}
END_TEST

START_TEST(test_run_first_fit)
{
    /* runs need contiguous pages: 16 one-page slabs, free every other one, then a 2-page
     * class finds no run until two neighbours are free */
    struct slab *s = slab_new(1 * MiB, 64 * KiB);
    uint64_t off[16], big, slot;
    int cls;
    for (int i = 0; i < 16; i++)
        ck_assert_int_eq(slab_alloc(s, 64 * KiB, &off[i], &slot, &cls), 0);
    for (int i = 0; i < 16; i += 2)
        ck_assert_int_eq(slab_release(s, off[i]), 0);
    ck_assert_uint_eq(stats_of(s).pages_free, 8);
    ck_assert_int_eq(slab_alloc(s, 128 * KiB, &big, &slot, &cls), -ENOSPC);
    ck_assert_int_eq(slab_release(s, off[9]), 0); /* pages 8, 9, 10 free */
    ck_assert_int_eq(slab_alloc(s, 128 * KiB, &big, &slot, &cls), 0);
    ck_assert_uint_eq(big, 8 * 64 * KiB);
    ck_assert_int_eq(slab_release(s, big), 0);
    for (int i = 1; i < 16; i += 2)
        if (i != 9)
            ck_assert_int_eq(slab_release(s, off[i]), 0);
    ck_assert_uint_eq(stats_of(s).pages_free, 16);
    slab_free(s);
}
END_TEST

START_TEST(test_bad_release)
{
    struct slab *s = slab_new(1 * MiB, 64 * KiB);
    uint64_t a, b, slot;
    int cls;
    /* 24 KiB on 64 KiB pages: 2-page slabs of 5 slots, the last 8 KiB unused */
    ck_assert_int_eq(slab_alloc(s, 24 * KiB, &a, &slot, &cls), 0);
    ck_assert_int_eq(slab_alloc(s, 24 * KiB, &b, &slot, &cls), 0);
    ck_assert_uint_eq(slab_class_free_slots(s, cls), 3);
    ck_assert_uint_eq(stats_of(s).pages_free, 14);
    struct slab_stats before = stats_of(s);
    const uint64_t bad[] = {
        a + 4096,           /* inside a slot */
        b - 1,              /* inside the previous slot */
        2 * 24 * KiB,       /* a free slot of a live slab */
        4 * 24 * KiB,       /* the last slot, free */
        5 * 24 * KiB,       /* the slab's unusable tail */
        128 * KiB,          /* a free page */
        1 * MiB - 4096,     /* last free page */
        1 * MiB,            /* the end */
        UINT64_MAX,
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(slab_release(s, bad[i]) == -EINVAL, "release %llu accepted",
                      (unsigned long long)bad[i]);
    struct slab_stats after = stats_of(s);
    ck_assert_mem_eq(&before, &after, sizeof(before));
    ck_assert_uint_eq(slab_class_free_slots(s, cls), 3);
    /* double free: the second release is refused, whether or not the slab survived */
    ck_assert_int_eq(slab_release(s, a), 0);
    ck_assert_int_eq(slab_release(s, a), -EINVAL);
    ck_assert_uint_eq(stats_of(s).used, 24 * KiB);
    ck_assert_int_eq(slab_release(s, b), 0);
    ck_assert_uint_eq(stats_of(s).slabs, 0);
    ck_assert_int_eq(slab_release(s, b), -EINVAL);
    ck_assert_int_eq(slab_release(s, a), -EINVAL);
    after = stats_of(s);
    ck_assert_uint_eq(after.used, 0);
    ck_assert_uint_eq(after.pages_free, 16);
    /* the allocator still works after every refusal */
    ck_assert_int_eq(slab_alloc(s, 24 * KiB, &a, &slot, &cls), 0);
    ck_assert_uint_eq(a, 0);
    ck_assert_int_eq(slab_release(s, a), 0);
    slab_free(s);
}
END_TEST

START_TEST(test_one_slot_slab_double_free)
{
    /* a slab with a single slot is full and empty in one step */
    struct slab *s = slab_new(4 * MiB, 2 * MiB);
    uint64_t a, b, slot;
    int cls;
    ck_assert_int_eq(slab_alloc(s, 4 * MiB, &a, &slot, &cls), 0);
    ck_assert_uint_eq(slab_class_free_slots(s, cls), 0);
    ck_assert_int_eq(slab_release(s, a), 0);
    ck_assert_int_eq(slab_release(s, a), -EINVAL);
    ck_assert_uint_eq(slab_class_free_slots(s, cls), 0);
    ck_assert_int_eq(slab_alloc(s, 2 * MiB, &a, &slot, &cls), 0);
    ck_assert_int_eq(slab_alloc(s, 2 * MiB, &b, &slot, &cls), 0);
    ck_assert_int_eq(slab_release(s, b), 0);
    ck_assert_int_eq(slab_release(s, a), 0);
    ck_assert_uint_eq(stats_of(s).pages_free, 2);
    ck_assert_uint_eq(stats_of(s).slabs, 0);
    slab_free(s);
}
END_TEST

struct model_slot {
    uint64_t off, slot, len;
};

static uint64_t rnd_state;

static uint64_t rnd(void)
{
    return rng_next(&rnd_state);
}

/* Thousands of random allocs and frees of mixed sizes against a model: the live slots and
 * a map of the 4 KiB units they cover (so an overlap is caught at once). */
static void model_run(uint64_t capacity, uint64_t page, uint64_t seed, int ops)
{
    static const uint64_t sizes[] = {1,        4096,     5000,    12 * KiB, 64 * KiB,
                                     100 * KiB, 256 * KiB, 1 * MiB, 3 * MiB};
    enum { NSIZES = sizeof(sizes) / sizeof(sizes[0]), MAXLIVE = 4096 };
    struct slab *s = slab_new(capacity, page);
    ck_assert_ptr_nonnull(s);
    struct model_slot *live = calloc(MAXLIVE, sizeof(*live));
    ck_assert_ptr_nonnull(live);
    /* per 4 KiB unit: 0 free, 1 inside a live slot, 2 the start of one */
    unsigned char *owned = calloc(capacity / 4096, 1);
    ck_assert_ptr_nonnull(owned);
    int n = 0;
    uint64_t used = 0, enospc = 0;
    rnd_state = seed;
    for (int op = 0; op < ops; op++) {
        uint64_t r = rnd();
        /* phases that mostly fill and mostly drain, so both ENOSPC and empty slabs occur */
        bool filling = (op / 1000) % 2 == 0;
        bool do_alloc = n == 0 || (n < MAXLIVE && r % 100 < (filling ? 75u : 30u));
        if (do_alloc) {
            /* a few sizes dominate at a time, as namespaces do */
            uint64_t len = sizes[(r >> 8) % (r % 3 == 0 ? NSIZES : 4)];
            uint64_t off, slot;
            int cls;
            int ret = slab_alloc(s, len, &off, &slot, &cls);
            if (ret == -ENOSPC) {
                /* refused only when its class has no free slot left */
                enospc++;
                int c = slab_class_get(s, len);
                ck_assert_int_ge(c, 0);
                ck_assert_uint_eq(slab_class_free_slots(s, c), 0);
                continue;
            }
            ck_assert_int_eq(ret, 0);
            ck_assert_uint_eq(slot, (len + 4095) & ~4095ull);
            ck_assert_uint_eq(slab_class_slot(s, cls), slot);
            ck_assert_uint_le(off + slot, capacity);
            ck_assert_uint_eq(off % 4096, 0);
            for (uint64_t b = off / 4096; b < (off + slot) / 4096; b++) {
                ck_assert_msg(!owned[b], "op %d: [%llu,+%llu) overlaps a live slot", op,
                              (unsigned long long)off, (unsigned long long)slot);
                owned[b] = 1;
            }
            owned[off / 4096] = 2; /* a slot start */
            live[n++] = (struct model_slot){off, slot, len};
            used += slot;
        } else {
            int i = (int)((r >> 16) % (uint64_t)n);
            if (r % 7 == 0 && live[i].slot > 4096) /* a wrong offset first: refused */
                ck_assert_int_eq(slab_release(s, live[i].off + 4096), -EINVAL);
            ck_assert_int_eq(slab_release(s, live[i].off), 0);
            memset(owned + live[i].off / 4096, 0, live[i].slot / 4096);
            if (r % 11 == 0) /* double free: refused */
                ck_assert_int_eq(slab_release(s, live[i].off), -EINVAL);
            used -= live[i].slot;
            live[i] = live[--n];
            if (r % 13 == 0) { /* any offset that starts no live slot: refused */
                uint64_t bad = (rnd() % capacity) & ~4095ull;
                if (owned[bad / 4096] != 2) /* free, or inside a live slot */
                    ck_assert_int_eq(slab_release(s, bad), -EINVAL);
            }
        }
        struct slab_stats st = stats_of(s);
        ck_assert_uint_eq(st.used, used);
        ck_assert_uint_le(st.pages_free, st.pages);
    }
    ck_assert_uint_gt(enospc, 0);
    while (n > 0) {
        ck_assert_int_eq(slab_release(s, live[n - 1].off), 0);
        used -= live[--n].slot;
    }
    struct slab_stats st = stats_of(s);
    ck_assert_uint_eq(st.used, 0);
    ck_assert_uint_eq(st.pages_free, st.pages);
    ck_assert_uint_eq(st.slabs, 0);
    free(owned);
    free(live);
    slab_free(s);
}

START_TEST(test_random_model)
{
    static const struct {
        uint64_t capacity, page;
    } cfg[] = {
        {32 * MiB, 2 * MiB},
        {16 * MiB, 64 * KiB},
        {8 * MiB, 4 * KiB},
    };
    model_run(cfg[_i].capacity, cfg[_i].page, 0x1234567ull + (uint64_t)_i * 77, 20000);
}
END_TEST

static Suite *slab_suite(void)
{
    Suite *s = suite_create("slab");
    TCase *tc = tcase_create("slab");
    tcase_add_test(tc, test_new_bad_args);
    tcase_add_test(tc, test_classes);
    tcase_add_test(tc, test_slots_per_slab);
    tcase_add_test(tc, test_big_slot_runs);
    tcase_add_test(tc, test_slot_cost);
    tcase_add_test(tc, test_pages_move_between_classes);
    tcase_add_test(tc, test_run_first_fit);
    tcase_add_test(tc, test_bad_release);
    tcase_add_test(tc, test_one_slot_slab_double_free);
    tcase_add_loop_test(tc, test_random_model, 0, 3);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return daemon_suite_run(slab_suite());
}
