/*
 * check_e2e_crash.c — clients killed with SIGKILL leave nothing held in the daemon.
 *
 * A writer reserves 8 slots, writes 3, tells the parent and blocks; a reader looks up a
 * cached chain (pinning it), tells the parent and blocks. Both are killed. The daemon must
 * then show no pins and no reservations (through `kvcctl stats --json`), never expose the
 * writer's uncommitted keys, and let a new client reserve them.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <unistd.h>

#include "tests/lib/daemon.h"

#define CR_KEYS 8

static struct daemon cr_d;
static int cr_pipe[2];

static int cr_open(kvc_client **c, kvc_ns **ns)
{
    struct kvc_layout lay = daemon_layout("e2e-crash", 16);
    int rc = kvc_connect(cr_d.sock, c);
    return rc ? rc : kvc_ns_open(*c, &lay, ns);
}

static void cr_keys(kvc_ns *ns, uint32_t family, struct kvc_key *keys)
{
    ck_assert_int_eq(daemon_chain_keys(ns, family, 0, 0, CR_KEYS, keys), 0);
}

/* Tells the parent it is ready, then blocks until killed. */
static int cr_ready_and_block(void)
{
    char one = 1;
    if (write(cr_pipe[1], &one, 1) != 1)
        return 3;
    for (;;)
        pause();
}

static int cr_writer(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    struct kvc_key keys[CR_KEYS];
    void *buf;
    (void)arg;
    if (cr_open(&c, &ns) || daemon_chain_keys(ns, 1, 0, 0, CR_KEYS, keys))
        return 2;
    if (kvc_reserve(ns, NULL, keys, CR_KEYS, &r) != CR_KEYS)
        return 2;
    buf = malloc(kvc_ns_block_bytes(ns));
    for (int i = 0; i < 3; i++) {
        daemon_block_fill(&keys[i], buf, kvc_ns_block_bytes(ns));
        if (kvc_resv_write(r, (size_t)i, buf, kvc_ns_block_bytes(ns)))
            return 2;
    }
    return cr_ready_and_block();
}

static int cr_reader(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_key keys[CR_KEYS];
    (void)arg;
    if (cr_open(&c, &ns) || daemon_chain_keys(ns, 2, 0, 0, CR_KEYS, keys))
        return 2;
    if (kvc_lookup(ns, keys, CR_KEYS, 0, &l) != CR_KEYS)
        return 2;
    return cr_ready_and_block();
}

/* Starts fn in a child, waits for its "ready" byte and kills it. */
static void cr_run_and_kill(int (*fn)(void *))
{
    struct pollfd p = {.fd = cr_pipe[0], .events = POLLIN};
    char one;
    int sig;
    pid_t pid = daemon_child_spawn(fn, NULL);
    ck_assert_int_gt(pid, 0);
    ck_assert_msg(poll(&p, 1, 30000) == 1, "child never got ready");
    ck_assert_int_eq(read(cr_pipe[0], &one, 1), 1);
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    ck_assert_int_eq(daemon_child_wait(pid, daemon_ms(10000), &sig), -1);
    ck_assert_int_eq(sig, SIGKILL);
}

/* Polls `kvcctl stats --json` until the gauges are all zero (the daemon sees the hangup
 * asynchronously); fails after 10 s with the last values. */
static void cr_expect_nothing_held(void)
{
    static char out[1 << 16];
    uint64_t pins = 1, resv = 1, bytes = 1, clients = 1;
    uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(10000);
    do {
        ck_assert_int_eq(daemon_kvcctl(&cr_d, out, sizeof(out), NULL, 0, "stats", "--json", NULL),
                         0);
        ck_assert(daemon_json_valid(out));
        ck_assert_int_eq(daemon_json_u64(out, "pins_now", &pins), 0);
        ck_assert_int_eq(daemon_json_u64(out, "reserved_now", &resv), 0);
        ck_assert_int_eq(daemon_json_u64(out, "reserved_bytes_now", &bytes), 0);
        ck_assert_int_eq(daemon_json_u64(out, "clients_now", &clients), 0);
        if (pins == 0 && resv == 0 && bytes == 0 && clients == 1)
            return;
        usleep(20000);
    } while (daemon_now_ms() < end);
    ck_abort_msg("still held after the kill: pins_now %llu reserved_now %llu "
                 "reserved_bytes_now %llu clients_now %llu",
                 (unsigned long long)pins, (unsigned long long)resv, (unsigned long long)bytes,
                 (unsigned long long)clients);
}

START_TEST(test_crash_killed_clients_leak_nothing)
{
    static const char *const args[] = {"-o", "host.size=32m", "-o", "host.page_size=64k", NULL};
    struct kvc_key wkeys[CR_KEYS], rkeys[CR_KEYS];
    void *blocks[CR_KEYS];
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    kvc_resv *r;
    uint64_t used0, used1;
    size_t bb;
    memset(&cr_d, 0, sizeof(cr_d));
    ck_assert_int_eq(pipe(cr_pipe), 0);
    ck_assert_int_eq(daemon_start(&cr_d, args), 0);
    ck_assert_int_eq(cr_open(&c, &ns), 0);
    bb = kvc_ns_block_bytes(ns);
    cr_keys(ns, 1, wkeys);
    cr_keys(ns, 2, rkeys);
    for (int i = 0; i < CR_KEYS; i++) {
        blocks[i] = malloc(bb);
        daemon_block_fill(&rkeys[i], blocks[i], bb);
    }
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, rkeys, CR_KEYS, (const void *const *)blocks),
                     CR_KEYS);
    ck_assert_int_eq(daemon_client_stat(c, 0, "host_used", &used0), 0);

    cr_run_and_kill(cr_writer);
    cr_run_and_kill(cr_reader);
    kvc_disconnect(c);
    cr_expect_nothing_held();

    ck_assert_int_eq(cr_open(&c, &ns), 0);
    ck_assert_int_eq(daemon_client_stat(c, 0, "host_used", &used1), 0);
    ck_assert_uint_eq(used1, used0); /* the writer's slots came back */
    /* The killed writer's keys are not visible, not even the three it wrote. */
    ck_assert_int_eq(kvc_lookup(ns, wkeys, CR_KEYS, 0, &l), 0);
    ck_assert_ptr_null(l);
    /* A new client can reserve them all, and what it commits is what is read. */
    ck_assert_int_eq(kvc_reserve(ns, NULL, wkeys, CR_KEYS, &r), CR_KEYS);
    for (int i = 0; i < CR_KEYS; i++) {
        ck_assert_int_eq(kvc_resv_status(r, (size_t)i), KVC_SLOT_RESERVED);
        daemon_block_fill(&wkeys[i], blocks[i], bb);
        ck_assert_int_eq(kvc_resv_write(r, (size_t)i, blocks[i], bb), 0);
    }
    ck_assert_int_eq(kvc_commit(r, SIZE_MAX), CR_KEYS);
    ck_assert_int_eq(kvc_lookup(ns, wkeys, CR_KEYS, 0, &l), CR_KEYS);
    for (int i = 0; i < CR_KEYS; i++)
        ck_assert_int_lt(daemon_block_check(&wkeys[i], kvc_lease_data(l, (size_t)i), bb), 0);
    kvc_release(l);
    /* The reader's chain is still there and intact. */
    ck_assert_int_eq(kvc_lookup(ns, rkeys, CR_KEYS, 0, &l), CR_KEYS);
    for (int i = 0; i < CR_KEYS; i++)
        ck_assert_int_lt(daemon_block_check(&rkeys[i], kvc_lease_data(l, (size_t)i), bb), 0);
    kvc_release(l);
    kvc_disconnect(c);
    for (int i = 0; i < CR_KEYS; i++)
        free(blocks[i]);
    close(cr_pipe[0]);
    close(cr_pipe[1]);
    ck_assert_int_eq(daemon_stop(&cr_d), 0);
    daemon_cleanup(&cr_d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_crash");
    TCase *tc = tcase_create("crash");
    tcase_set_timeout(tc, daemon_slow() * 120);
    tcase_add_test(tc, test_crash_killed_clients_leak_nothing);
    suite_add_tcase(s, tc);
    if (daemon_suite_init("e2e-crash"))
        return 1;
    return daemon_suite_run(s);
}
