/*
 * check_e2e_iothreads.c — kvcd with server.io_threads (server_io.c): I/O threads read the
 * requests and send the replies, the loop thread runs them.
 *
 * Against a real daemon with two I/O threads: it runs them (its threads are named); many
 * client processes put and get at once, each block checked byte for byte, on the socket
 * path and the fast path; requests a raw client pipelines are answered in order, one with a
 * lying length among them refused with EBADMSG on a connection that stays usable; clients
 * killed (or gone) with requests and reservations in flight give everything back;
 * server.max_clients counts their connections as before; a daemon
 * stopped under busy connections exits cleanly (the ASan build's leak check and the TSan
 * build's race check included: both fail the stop's status).
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/kvc_proto.h"
#include "tests/lib/daemon.h"

#define IO_BB 4096 /* daemon_layout(.., 4): 4 tokens of 1 KiB */
#define IO_PROCS 8
#define IO_ROUNDS 40
#define IO_CHAIN 4
#define IO_HOT 16 /* chains the parent puts first, that every child reads */

static struct daemon io_d;

static void io_setup(void)
{
    static const char *const args[] = {"-o", "host.size=64m",       "-o", "host.page_size=64k",
                                       "-o", "server.io_threads=2", NULL};
    memset(&io_d, 0, sizeof(io_d));
    ck_assert_int_eq(daemon_start(&io_d, args), 0);
}

static void io_teardown(void)
{
    if (io_d.pid) {
        ck_assert_msg(daemon_alive(&io_d), "kvcd died");
        ck_assert_int_eq(daemon_roundtrip(&io_d), 0);
        ck_assert_int_eq(daemon_stop(&io_d), 0);
    }
    daemon_cleanup(&io_d);
}

static struct kvc_key io_key(uint64_t who, uint64_t i)
{
    return (struct kvc_key){.lo = 0x10d0000000000000ull ^ (who << 32) ^ i,
                            .hi = 0x7e57ull * (who + 1) + i * 0x9e3779b97f4a7c15ull};
}

/* The parent's hot chain h. */
static void io_hot_keys(uint64_t h, struct kvc_key *k)
{
    for (int j = 0; j < IO_CHAIN; j++)
        k[j] = io_key(999, h * IO_CHAIN + (uint64_t)j);
}

/* Puts the chain keys[0..n) with bytes from daemon_block_fill. Blocks written or -errno. */
static int io_put(kvc_ns *ns, const struct kvc_key *k, int n)
{
    static uint8_t buf[IO_CHAIN][IO_BB];
    void *p[IO_CHAIN];
    for (int j = 0; j < n; j++) {
        daemon_block_fill(&k[j], buf[j], IO_BB);
        p[j] = buf[j];
    }
    return kvc_put_prefix(ns, NULL, k, (size_t)n, (const void *const *)p);
}

/* Gets the chain and checks every byte: the blocks found, or -1 for a wrong byte. */
static int io_get_check(kvc_ns *ns, const struct kvc_key *k, int n)
{
    static uint8_t buf[IO_CHAIN][IO_BB];
    void *p[IO_CHAIN];
    for (int j = 0; j < n; j++)
        p[j] = buf[j];
    int got = kvc_get_prefix(ns, k, (size_t)n, p);
    for (int j = 0; j < got; j++)
        if (daemon_block_check(&k[j], buf[j], IO_BB) >= 0)
            return -1;
    return got;
}

/* The daemon's threads named kvcd-io*. */
static int io_threads_running(pid_t pid)
{
    char path[300], comm[32];
    int n = 0;
    struct dirent *e;
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid, e->d_name);
        FILE *f = fopen(path, "re");
        if (f && fgets(comm, sizeof(comm), f) && strncmp(comm, "kvcd-io", 7) == 0)
            n++;
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    return n;
}

/* A child: two connections used in turn; half the children through the socket alone. */
static int io_child(void *arg)
{
    int id = (int)(intptr_t)arg;
    struct kvc_layout lay = daemon_layout("e2e-iothreads", 4);
    kvc_client *c[2] = {NULL, NULL};
    kvc_ns *ns[2] = {NULL, NULL};
    int rc = 1;
    if (id % 2)
        setenv("KVC_NO_FASTPATH", "1", 1);
    for (int i = 0; i < 2; i++)
        if (kvc_connect(io_d.sock, &c[i]) || kvc_ns_open(c[i], &lay, &ns[i])) {
            fprintf(stderr, "child %d: cannot connect\n", id);
            goto out;
        }
    for (int r = 0; r < IO_ROUNDS; r++) {
        kvc_ns *n = ns[r % 2];
        struct kvc_key k[IO_CHAIN], hot[IO_CHAIN];
        for (int j = 0; j < IO_CHAIN; j++)
            k[j] = io_key((uint64_t)id, (uint64_t)r * IO_CHAIN + (uint64_t)j);
        int w = io_put(n, k, IO_CHAIN);
        if (w != IO_CHAIN) {
            fprintf(stderr, "child %d round %d: put %d\n", id, r, w);
            goto out;
        }
        /* Its own chain, on the other connection: the commit is seen there too only once
         * this one's requests are handled, so read it back on this one. */
        int g = io_get_check(n, k, IO_CHAIN);
        io_hot_keys((uint64_t)(r + id) % IO_HOT, hot);
        int gh = io_get_check(ns[(r + 1) % 2], hot, IO_CHAIN);
        if (g != IO_CHAIN || gh != IO_CHAIN) {
            fprintf(stderr, "child %d round %d: got %d of its own, %d of a hot chain\n", id, r, g,
                    gh);
            goto out;
        }
    }
    rc = 0;
out:
    for (int i = 0; i < 2; i++)
        kvc_disconnect(c[i]);
    return rc;
}

START_TEST(test_iothreads_many_clients)
{
    struct kvc_layout lay = daemon_layout("e2e-iothreads", 4);
    kvc_client *c;
    kvc_ns *ns;
    pid_t pids[IO_PROCS];
    uint64_t v;
    ck_assert_int_eq(io_threads_running(io_d.pid), 2);
    ck_assert_int_eq(kvc_connect(io_d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    for (uint64_t h = 0; h < IO_HOT; h++) {
        struct kvc_key k[IO_CHAIN];
        io_hot_keys(h, k);
        ck_assert_int_eq(io_put(ns, k, IO_CHAIN), IO_CHAIN);
    }
    ck_assert_int_eq(kvc_flush(c), 0);
    for (int i = 0; i < IO_PROCS; i++) {
        pids[i] = daemon_child_spawn(io_child, (void *)(intptr_t)i);
        ck_assert_int_gt(pids[i], 0);
    }
    for (int i = 0; i < IO_PROCS; i++)
        ck_assert_msg(daemon_child_wait(pids[i], daemon_ms(120000), NULL) == 0, "child %d failed",
                      i);
    /* Everything every child put is there, byte for byte. */
    for (int id = 0; id < IO_PROCS; id++)
        for (int r = 0; r < IO_ROUNDS; r++) {
            struct kvc_key k[IO_CHAIN];
            for (int j = 0; j < IO_CHAIN; j++)
                k[j] = io_key((uint64_t)id, (uint64_t)r * IO_CHAIN + (uint64_t)j);
            ck_assert_int_eq(io_get_check(ns, k, IO_CHAIN), IO_CHAIN);
        }
    ck_assert_int_eq(daemon_client_stat(c, 0, "blocks_now", &v), 0);
    ck_assert_uint_eq(v, (IO_HOT + IO_PROCS * IO_ROUNDS) * IO_CHAIN);
    ck_assert_int_eq(daemon_client_stat(c, 0, "errors", &v), 0);
    ck_assert_uint_eq(v, 0);
    kvc_disconnect(c);
}
END_TEST

/* ---- a raw client ------------------------------------------------------------------------ */

static uint64_t io_rx[(KVC_PROTO_MAX_MSG + 64) / 8];

static int io_raw_connect(void)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_uint_lt(strlen(io_d.sock), sizeof(a.sun_path));
    memcpy(a.sun_path, io_d.sock, strlen(io_d.sock) + 1);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* Sends op with req_id, a header claiming `len` and n payload bytes. */
static void io_raw_send(int fd, uint16_t op, uint32_t req_id, uint32_t len, const void *body,
                        size_t n)
{
    uint64_t tx[64];
    struct kvc_msg_hdr *h = (struct kvc_msg_hdr *)tx;
    *h = (struct kvc_msg_hdr){.magic = KVC_PROTO_MAGIC,
                              .version = KVC_PROTO_VERSION,
                              .opcode = op,
                              .req_id = req_id,
                              .len = len};
    ck_assert_uint_le(n, sizeof(tx) - sizeof(*h));
    memcpy(h + 1, body, n);
    ck_assert_int_eq(send(fd, tx, sizeof(*h) + n, MSG_NOSIGNAL), (ssize_t)(sizeof(*h) + n));
}

/* The next reply's header (10 s at most). */
static const struct kvc_msg_hdr *io_raw_reply(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, daemon_ms(10000)), 1);
    ssize_t n = recv(fd, io_rx, sizeof(io_rx), MSG_DONTWAIT);
    ck_assert_int_ge(n, (ssize_t)sizeof(struct kvc_msg_hdr));
    return (const struct kvc_msg_hdr *)io_rx;
}

static void io_raw_hello(int fd)
{
    struct kvc_hello_req q = {.min_version = 1, .max_version = 1};
    io_raw_send(fd, KVC_OP_HELLO, 1, sizeof(q), &q, sizeof(q));
    ck_assert_int_eq(io_raw_reply(fd)->status, 0);
}

START_TEST(test_iothreads_pipelined_order)
{
    struct kvc_sync_req y = {0};
    struct kvc_stats_req q = {0};
    enum { N = 120, BAD = 57 };
    int fd = io_raw_connect();
    io_raw_hello(fd);
    /* Many batches' worth sent before reading any reply (SYNCs: small replies, so that the
     * client's socket holds them all), one STATS among them with a length that does not
     * match its datagram. */
    for (uint32_t i = 2; i < 2 + N; i++) {
        if (i == BAD)
            io_raw_send(fd, KVC_OP_STATS, i, 1000, &q, sizeof(q));
        else
            io_raw_send(fd, KVC_OP_SYNC, i, sizeof(y), &y, sizeof(y));
    }
    for (uint32_t i = 2; i < 2 + N; i++) {
        const struct kvc_msg_hdr *h = io_raw_reply(fd);
        ck_assert_uint_eq(h->req_id, i); /* in the order sent */
        ck_assert_uint_eq(h->opcode, i == BAD ? KVC_OP_STATS : KVC_OP_SYNC);
        ck_assert_int_eq(h->status, i == BAD ? -EBADMSG : 0);
    }
    io_raw_send(fd, KVC_OP_STATS, 9999, sizeof(q), &q, sizeof(q)); /* still served */
    const struct kvc_msg_hdr *last = io_raw_reply(fd);
    ck_assert_uint_eq(last->req_id, 9999);
    ck_assert_int_eq(last->status, 0);
    ck_assert_int_ge(daemon_log_count(&io_d, "payload length does not match the datagram"), 1);
    close(fd);
}
END_TEST

/* A child that puts and gets in a loop, holding a reservation between them, until killed. */
static int io_busy_child(void *arg)
{
    struct kvc_layout lay = daemon_layout("e2e-iothreads", 4);
    uint64_t id = (uint64_t)(intptr_t)arg;
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    if (kvc_connect(io_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 1;
    for (uint64_t i = 0;; i++) {
        struct kvc_key k[IO_CHAIN];
        for (int j = 0; j < IO_CHAIN; j++)
            k[j] = io_key(100 + id, i * IO_CHAIN + (uint64_t)j);
        if (io_put(ns, k, 2) < 0 || io_get_check(ns, k, 2) < 0)
            return 2; /* the daemon stopped (test_iothreads_stop_busy) */
        if (kvc_reserve(ns, &k[1], k + 2, 2, &r) == 0)
            kvc_abort(r);
    }
}

START_TEST(test_iothreads_killed_clients)
{
    uint64_t v, end;
    for (int round = 0; round < 6; round++) {
        pid_t pids[4];
        for (int i = 0; i < 4; i++)
            ck_assert_int_gt(
                pids[i] = daemon_child_spawn(io_busy_child, (void *)(intptr_t)(round * 4 + i)), 0);
        usleep((useconds_t)(30000 + 20000 * round));
        for (int i = 0; i < 4; i++)
            kill(pids[i], SIGKILL);
        for (int i = 0; i < 4; i++)
            daemon_child_wait(pids[i], daemon_ms(10000), NULL);
        /* A raw client that pipelines requests and leaves before reading the replies. */
        int fd = io_raw_connect();
        struct kvc_sync_req y = {0};
        io_raw_hello(fd);
        for (uint32_t i = 0; i < 16; i++)
            io_raw_send(fd, KVC_OP_SYNC, 10 + i, sizeof(y), &y, sizeof(y));
        close(fd);
    }
    /* Every connection went, and with it every pin and reservation. */
    end = daemon_now_ms() + (uint64_t)daemon_ms(10000);
    do
        ck_assert_int_eq(daemon_stat(&io_d, "clients_now", &v), 0);
    while (v != 1 && daemon_now_ms() < end);
    ck_assert_uint_eq(v, 1); /* the asking one */
    ck_assert_int_eq(daemon_stat(&io_d, "pins_now", &v), 0);
    ck_assert_uint_eq(v, 0);
    ck_assert_int_eq(daemon_stat(&io_d, "reserved_now", &v), 0);
    ck_assert_uint_eq(v, 0);
}
END_TEST

START_TEST(test_iothreads_stop_busy)
{
    pid_t pids[6];
    uint64_t v;
    for (int i = 0; i < 6; i++)
        ck_assert_int_gt(pids[i] = daemon_child_spawn(io_busy_child, (void *)(intptr_t)(50 + i)),
                         0);
    /* Every client connected and busy. */
    uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(20000);
    do
        ck_assert_int_eq(daemon_stat(&io_d, "clients_now", &v), 0);
    while (v < 7 && daemon_now_ms() < end);
    ck_assert_uint_ge(v, 7);
    usleep(200000);
    /* The stop closes them all, joins the I/O threads and exits 0 (ASan, TSan: clean). */
    ck_assert_int_eq(daemon_stop(&io_d), 0);
    for (int i = 0; i < 6; i++) {
        int st = daemon_child_wait(pids[i], daemon_ms(20000), NULL);
        ck_assert_msg(st == 2, "client %d: %d (it should see the daemon go)", i, st);
    }
}
END_TEST

/* server.max_clients counts the connections of the I/O threads as the loop's: the third of
 * two is refused with EUSERS; once one goes, another comes in. */
START_TEST(test_iothreads_max_clients)
{
    static const char *const args[] = {"-o", "host.size=32m",       "-o", "server.max_clients=2",
                                       "-o", "server.io_threads=2", NULL};
    kvc_client *c[3];
    uint64_t end;
    int rc;
    ck_assert_int_eq(daemon_stop(&io_d), 0);
    daemon_cleanup(&io_d);
    memset(&io_d, 0, sizeof(io_d));
    ck_assert_int_eq(daemon_start(&io_d, args), 0);
    ck_assert_int_eq(kvc_connect(io_d.sock, &c[0]), 0);
    /* daemon_start's probe connection may not be given back yet (its hang-up goes through an
     * I/O thread to the loop): the second slot frees once it is */
    end = daemon_now_ms() + (uint64_t)daemon_ms(10000);
    while ((rc = kvc_connect(io_d.sock, &c[1])) == -EUSERS && daemon_now_ms() < end)
        usleep(10000);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(kvc_connect(io_d.sock, &c[2]), -EUSERS);
    kvc_disconnect(c[1]);
    /* Its I/O thread sees the hang-up, the loop closes it: then there is room again. */
    end = daemon_now_ms() + (uint64_t)daemon_ms(10000);
    while ((rc = kvc_connect(io_d.sock, &c[1])) == -EUSERS && daemon_now_ms() < end)
        usleep(10000);
    ck_assert_int_eq(rc, 0);
    kvc_disconnect(c[0]);
    kvc_disconnect(c[1]);
    ck_assert_int_ge(daemon_log_count(&io_d, "max_clients 2 reached"), 1);
    /* stopped here: the teardown's round trip could find both slots not yet given back */
    ck_assert_int_eq(daemon_stop(&io_d), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_iothreads");
    TCase *tc = tcase_create("iothreads");
    tcase_set_timeout(tc, daemon_slow() * 180);
    tcase_add_checked_fixture(tc, io_setup, io_teardown);
    tcase_add_test(tc, test_iothreads_many_clients);
    tcase_add_test(tc, test_iothreads_pipelined_order);
    tcase_add_test(tc, test_iothreads_killed_clients);
    tcase_add_test(tc, test_iothreads_stop_busy);
    tcase_add_test(tc, test_iothreads_max_clients);
    suite_add_tcase(s, tc);
    if (daemon_suite_init("e2e-iothreads"))
        return 1;
    return daemon_suite_run(s);
}
