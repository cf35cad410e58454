/*
 * check_e2e_dedup.c — the reservation rules seen by two clients of one daemon.
 *
 * - A second writer of a chain sees BUSY for the first key and SKIPPED after it (with
 *   disk.put_wait = 0); once the first writer commits, lookups hit and a new RESERVE sees
 *   PRESENT. With a wait, the second writer's RESERVE waits for the first one's commit (or
 *   abort) and then stores the rest of its chain.
 * - A chain hanging from an uncached parent is SKIPPED whole.
 * - ABORT gives every slot back (host_used and reserved_now return to before).
 * - COMMIT of the first n keeps exactly n, the rest are freed and can be reserved again.
 */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/lib/daemon.h"

#define DD_N 4

static struct daemon dd_d;
static kvc_client *dd_c[2];
static kvc_ns *dd_ns[2];
static size_t dd_bb;
static void *dd_buf;

static void dd_start(const char *const *args)
{
    struct kvc_layout lay = daemon_layout("e2e-dedup", 16);
    memset(&dd_d, 0, sizeof(dd_d));
    ck_assert_int_eq(daemon_start(&dd_d, args), 0);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(kvc_connect(dd_d.sock, &dd_c[i]), 0);
        ck_assert_int_eq(kvc_ns_open(dd_c[i], &lay, &dd_ns[i]), 0);
    }
    dd_bb = kvc_ns_block_bytes(dd_ns[0]);
    dd_buf = malloc(dd_bb);
}

static void dd_setup(void)
{
    /* disk.put_wait = 0: a second writer is answered BUSY at once (with a wait, it waits for
     * the first writer's commit: test_dedup_second_writer_waits). */
    static const char *const args[] = {"-o", "host.size=32m",   "-o", "host.page_size=64k",
                                       "-o", "disk.put_wait=0", NULL};
    dd_start(args);
}

/* A wait longer than any run of the test takes to commit, however slow the build. */
static void dd_setup_wait(void)
{
    static const char *const args[] = {"-o", "host.size=32m",     "-o", "host.page_size=64k",
                                       "-o", "disk.put_wait=60s", NULL};
    dd_start(args);
}

static void dd_teardown(void)
{
    for (int i = 0; i < 2; i++)
        kvc_disconnect(dd_c[i]);
    free(dd_buf);
    ck_assert_int_eq(daemon_stop(&dd_d), 0);
    daemon_cleanup(&dd_d);
}

static uint64_t dd_stat(const char *name)
{
    uint64_t v = 0;
    ck_assert_int_eq(daemon_client_stat(dd_c[0], 0, name, &v), 0);
    return v;
}

static void dd_write_all(kvc_resv *r, const struct kvc_key *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (kvc_resv_status(r, i) == KVC_SLOT_RESERVED) {
            daemon_block_fill(&keys[i], dd_buf, dd_bb);
            ck_assert_int_eq(kvc_resv_write(r, i, dd_buf, dd_bb), 0);
        }
}

static void dd_expect_hits(kvc_ns *ns, const struct kvc_key *keys, size_t n, int want)
{
    kvc_lease *l;
    ck_assert_int_eq(kvc_lookup(ns, keys, n, 0, &l), want);
    for (int i = 0; i < want; i++)
        ck_assert_int_lt(daemon_block_check(&keys[i], kvc_lease_data(l, (size_t)i), dd_bb), 0);
    kvc_release(l);
}

START_TEST(test_dedup_second_writer_busy)
{
    struct kvc_key k[DD_N];
    kvc_resv *a, *b;
    ck_assert_int_eq(daemon_chain_keys(dd_ns[0], 1, 0, 0, DD_N, k), 0);
    ck_assert_int_eq(kvc_reserve(dd_ns[0], NULL, k, DD_N, &a), DD_N);
    ck_assert_int_eq(kvc_reserve(dd_ns[1], NULL, k, DD_N, &b), 0);
    ck_assert_int_eq(kvc_resv_status(b, 0), KVC_SLOT_BUSY);
    for (size_t i = 1; i < DD_N; i++)
        ck_assert_int_eq(kvc_resv_status(b, i), KVC_SLOT_SKIPPED);
    ck_assert_ptr_null(kvc_resv_data(b, 0));
    ck_assert_int_eq(kvc_abort(b), 0);
    /* Not visible before the commit. */
    dd_expect_hits(dd_ns[1], k, DD_N, 0);
    dd_write_all(a, k, DD_N);
    ck_assert_int_eq(kvc_commit(a, SIZE_MAX), DD_N);
    dd_expect_hits(dd_ns[1], k, DD_N, DD_N);
    ck_assert_int_eq(kvc_reserve(dd_ns[1], NULL, k, DD_N, &b), 0);
    for (size_t i = 0; i < DD_N; i++)
        ck_assert_int_eq(kvc_resv_status(b, i), KVC_SLOT_PRESENT);
    ck_assert_int_eq(kvc_abort(b), 0);
    ck_assert_uint_eq(dd_stat("blocks_now"), DD_N);
}
END_TEST

START_TEST(test_dedup_busy_in_the_middle)
{
    /* Writer A holds keys 2..3 of a chain whose 0..1 are cached: B sees PRESENT, PRESENT,
     * BUSY, SKIPPED. */
    struct kvc_key k[DD_N];
    kvc_resv *a, *b;
    ck_assert_int_eq(daemon_chain_keys(dd_ns[0], 2, 0, 0, DD_N, k), 0);
    ck_assert_int_eq(kvc_reserve(dd_ns[0], NULL, k, 2, &a), 2);
    dd_write_all(a, k, 2);
    ck_assert_int_eq(kvc_commit(a, SIZE_MAX), 2);
    ck_assert_int_eq(kvc_reserve(dd_ns[0], &k[1], k + 2, 2, &a), 2);
    ck_assert_int_eq(kvc_reserve(dd_ns[1], NULL, k, DD_N, &b), 0);
    ck_assert_int_eq(kvc_resv_status(b, 0), KVC_SLOT_PRESENT);
    ck_assert_int_eq(kvc_resv_status(b, 1), KVC_SLOT_PRESENT);
    ck_assert_int_eq(kvc_resv_status(b, 2), KVC_SLOT_BUSY);
    ck_assert_int_eq(kvc_resv_status(b, 3), KVC_SLOT_SKIPPED);
    ck_assert_int_eq(kvc_abort(b), 0);
    dd_write_all(a, k + 2, 2);
    ck_assert_int_eq(kvc_commit(a, SIZE_MAX), 2);
    dd_expect_hits(dd_ns[1], k, DD_N, DD_N);
}
END_TEST

START_TEST(test_dedup_uncached_parent_skips_all)
{
    struct kvc_key k[DD_N + 1];
    kvc_resv *r;
    uint64_t used = dd_stat("host_used");
    ck_assert_int_eq(daemon_chain_keys(dd_ns[0], 3, 0, 0, DD_N + 1, k), 0);
    ck_assert_int_eq(kvc_reserve(dd_ns[0], &k[0], k + 1, DD_N, &r), 0);
    for (size_t i = 0; i < DD_N; i++)
        ck_assert_int_eq(kvc_resv_status(r, i), KVC_SLOT_SKIPPED);
    ck_assert_int_eq(kvc_commit(r, SIZE_MAX), 0);
    dd_expect_hits(dd_ns[0], k + 1, DD_N, 0);
    ck_assert_uint_eq(dd_stat("host_used"), used);
    ck_assert_uint_eq(dd_stat("reserved_now"), 0);
    ck_assert_uint_eq(dd_stat("blocks_now"), 0);
}
END_TEST

START_TEST(test_dedup_abort_frees_slots)
{
    struct kvc_key k[DD_N];
    kvc_resv *r;
    uint64_t used = dd_stat("host_used");
    ck_assert_int_eq(daemon_chain_keys(dd_ns[0], 4, 0, 0, DD_N, k), 0);
    ck_assert_int_eq(kvc_reserve(dd_ns[0], NULL, k, DD_N, &r), DD_N);
    ck_assert_uint_eq(dd_stat("reserved_now"), DD_N);
    ck_assert_uint_eq(dd_stat("reserved_bytes_now"), DD_N * dd_bb);
    ck_assert_uint_gt(dd_stat("host_used"), used);
    dd_write_all(r, k, DD_N);
    ck_assert_int_eq(kvc_abort(r), 0);
    ck_assert_uint_eq(dd_stat("host_used"), used);
    ck_assert_uint_eq(dd_stat("reserved_now"), 0);
    ck_assert_uint_eq(dd_stat("reserved_bytes_now"), 0);
    ck_assert_uint_eq(dd_stat("pins_now"), 0);
    dd_expect_hits(dd_ns[1], k, DD_N, 0);
    /* And the keys are free for anyone. */
    ck_assert_int_eq(kvc_reserve(dd_ns[1], NULL, k, DD_N, &r), DD_N);
    ck_assert_int_eq(kvc_abort(r), 0);
}
END_TEST

START_TEST(test_dedup_commit_first_n)
{
    struct kvc_key k[DD_N + 1];
    kvc_resv *r;
    uint64_t used = dd_stat("host_used");
    ck_assert_int_eq(daemon_chain_keys(dd_ns[0], 5, 0, 0, DD_N + 1, k), 0);
    ck_assert_int_eq(kvc_reserve(dd_ns[0], NULL, k, DD_N + 1, &r), DD_N + 1);
    dd_write_all(r, k, DD_N + 1);
    ck_assert_int_eq(kvc_commit(r, 2), 2);
    ck_assert_uint_eq(dd_stat("blocks_now"), 2);
    ck_assert_uint_eq(dd_stat("reserved_now"), 0);
    ck_assert_uint_eq(dd_stat("host_used"), used + 2 * dd_bb);
    dd_expect_hits(dd_ns[1], k, DD_N + 1, 2);
    ck_assert_int_eq(kvc_reserve(dd_ns[1], NULL, k, DD_N + 1, &r), DD_N - 1);
    ck_assert_int_eq(kvc_resv_status(r, 0), KVC_SLOT_PRESENT);
    ck_assert_int_eq(kvc_resv_status(r, 1), KVC_SLOT_PRESENT);
    for (size_t i = 2; i < DD_N + 1; i++)
        ck_assert_int_eq(kvc_resv_status(r, i), KVC_SLOT_RESERVED);
    ck_assert_int_eq(kvc_abort(r), 0);
    ck_assert_uint_eq(dd_stat("blocks_now"), 2);
}
END_TEST

/* The second writer's RESERVE, sent from a thread of its own: it waits in the daemon. */
struct dd_waiter {
    const struct kvc_key *keys;
    int rc;
    kvc_resv *r;
};

static void *dd_waiter_run(void *arg)
{
    struct dd_waiter *w = arg;
    w->rc = kvc_reserve(dd_ns[1], NULL, w->keys, DD_N, &w->r);
    return NULL;
}

/* Until the daemon counts `want` RESERVEs waiting for a writer (the thread's one arrived). */
static void dd_wait_waiting(uint64_t want)
{
    uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(20000);
    while (dd_stat("put_waits_writing") < want && daemon_now_ms() < end)
        usleep(1000);
    ck_assert_uint_eq(dd_stat("put_waits_writing"), want);
}

/* Two clients of one uid start on the same chain: the second one's RESERVE, whose first key
 * the first one is writing, waits for that commit and then reserves the rest of its chain
 * (PRESENT, PRESENT, RESERVED, RESERVED) instead of BUSY and SKIPPED, which left the tail it
 * had computed unstored. Holding nothing while it waits. A writer that aborts frees its keys:
 * the waiting RESERVE then takes the whole chain. Counted in put_waits_writing; nothing BUSY. */
START_TEST(test_dedup_second_writer_waits)
{
    struct kvc_key k[DD_N], k2[DD_N];
    kvc_resv *a;
    pthread_t th;
    struct dd_waiter w = {.keys = k};
    ck_assert_int_eq(daemon_chain_keys(dd_ns[0], 6, 0, 0, DD_N, k), 0);
    ck_assert_int_eq(kvc_reserve(dd_ns[0], NULL, k, 2, &a), 2);
    ck_assert_int_eq(pthread_create(&th, NULL, dd_waiter_run, &w), 0);
    dd_wait_waiting(1);
    ck_assert_uint_eq(dd_stat("reserved_now"), 2); /* the waiting one holds nothing */
    dd_write_all(a, k, 2);
    ck_assert_int_eq(kvc_commit(a, SIZE_MAX), 2);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_int_eq(w.rc, DD_N - 2);
    ck_assert_int_eq(kvc_resv_status(w.r, 0), KVC_SLOT_PRESENT);
    ck_assert_int_eq(kvc_resv_status(w.r, 1), KVC_SLOT_PRESENT);
    ck_assert_int_eq(kvc_resv_status(w.r, 2), KVC_SLOT_RESERVED);
    ck_assert_int_eq(kvc_resv_status(w.r, 3), KVC_SLOT_RESERVED);
    dd_write_all(w.r, k, DD_N);
    ck_assert_int_eq(kvc_commit(w.r, SIZE_MAX), DD_N - 2);
    dd_expect_hits(dd_ns[0], k, DD_N, DD_N);
    /* The writer aborts instead: the waiting RESERVE gets every key. */
    ck_assert_int_eq(daemon_chain_keys(dd_ns[0], 7, 0, 0, DD_N, k2), 0);
    w = (struct dd_waiter){.keys = k2};
    ck_assert_int_eq(kvc_reserve(dd_ns[0], NULL, k2, DD_N, &a), DD_N);
    ck_assert_int_eq(pthread_create(&th, NULL, dd_waiter_run, &w), 0);
    dd_wait_waiting(2);
    ck_assert_int_eq(kvc_abort(a), 0);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_int_eq(w.rc, DD_N);
    dd_write_all(w.r, k2, DD_N);
    ck_assert_int_eq(kvc_commit(w.r, SIZE_MAX), DD_N);
    dd_expect_hits(dd_ns[0], k2, DD_N, DD_N);
    ck_assert_uint_eq(dd_stat("busy_blocks"), 0);
    ck_assert_uint_eq(dd_stat("skipped_busy_blocks"), 0);
    ck_assert_uint_eq(dd_stat("put_wait_timeouts"), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_dedup");
    TCase *tc = tcase_create("dedup");
    tcase_set_timeout(tc, daemon_slow() * 60);
    tcase_add_checked_fixture(tc, dd_setup, dd_teardown);
    tcase_add_test(tc, test_dedup_second_writer_busy);
    tcase_add_test(tc, test_dedup_busy_in_the_middle);
    tcase_add_test(tc, test_dedup_uncached_parent_skips_all);
    tcase_add_test(tc, test_dedup_abort_frees_slots);
    tcase_add_test(tc, test_dedup_commit_first_n);
    suite_add_tcase(s, tc);
    tc = tcase_create("wait");
    tcase_set_timeout(tc, daemon_slow() * 60);
    tcase_add_checked_fixture(tc, dd_setup_wait, dd_teardown);
    tcase_add_test(tc, test_dedup_second_writer_waits);
    suite_add_tcase(s, tc);
    if (daemon_suite_init("e2e-dedup"))
        return 1;
    return daemon_suite_run(s);
}
