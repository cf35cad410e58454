/*
 * check_e2e_garbage.c — kvcd survives hostile clients on raw sockets.
 *
 * Each case abuses one connection; the fixture then checks the daemon is still running,
 * that a fresh client completes a put/get round trip, and that it stops cleanly (the ASan
 * build's leak check included). Unreadable headers must close the connection; readable
 * ones with a bad payload get an error reply on a connection that stays usable. Every case
 * runs twice: on the loop thread's sockets, and with server.io_threads = 2 (server_io.c reads
 * and writes them: the same answers).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/kvc_proto.h"
#include "tests/lib/daemon.h"

static struct daemon gb_d;
static uint64_t gb_rx[(KVC_PROTO_MAX_MSG + 64) / 8];

static void gb_setup(void)
{
    static const char *const args[] = {"-o", "host.size=32m", "-o", "host.page_size=64k", NULL};
    memset(&gb_d, 0, sizeof(gb_d));
    ck_assert_int_eq(daemon_start(&gb_d, args), 0);
}

static void gb_setup_io(void)
{
    static const char *const args[] = {"-o", "host.size=32m",
                                       "-o", "host.page_size=64k",
                                       "-o", "server.io_threads=2",
                                       "-o", "server.io_threads_min_active=1",
                                       NULL};
    memset(&gb_d, 0, sizeof(gb_d));
    ck_assert_int_eq(daemon_start(&gb_d, args), 0);
}

static void gb_teardown(void)
{
    ck_assert_msg(daemon_alive(&gb_d), "kvcd died");
    ck_assert_int_eq(daemon_roundtrip(&gb_d), 0);
    ck_assert_int_eq(daemon_stop(&gb_d), 0);
    daemon_cleanup(&gb_d);
}

static int gb_connect(void)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    strcpy(a.sun_path, gb_d.sock);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* Sends a header for op with `len` in it and `n` payload bytes. */
static ssize_t gb_send(int fd, uint16_t op, uint32_t len, const void *payload, size_t n)
{
    static uint64_t tx[(KVC_PROTO_MAX_MSG + 64) / 8];
    struct kvc_msg_hdr *h = (struct kvc_msg_hdr *)tx;
    *h = (struct kvc_msg_hdr){.magic = KVC_PROTO_MAGIC,
                              .version = KVC_PROTO_VERSION,
                              .opcode = op,
                              .req_id = 77,
                              .len = len};
    memcpy(h + 1, payload, n);
    return send(fd, tx, sizeof(*h) + n, MSG_NOSIGNAL);
}

/* Next datagram: its length, 0 at EOF, -1 on timeout or error. */
static ssize_t gb_recv(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) != 1)
        return -1;
    return recv(fd, gb_rx, sizeof(gb_rx), MSG_DONTWAIT);
}

/* The status of the next reply, which must answer opcode op. */
static int gb_reply_status(int fd, uint16_t op)
{
    const struct kvc_msg_hdr *h = (const struct kvc_msg_hdr *)gb_rx;
    ssize_t n = gb_recv(fd, 10000);
    ck_assert_int_ge(n, (ssize_t)sizeof(*h));
    ck_assert_uint_eq(h->magic, KVC_PROTO_MAGIC);
    ck_assert_uint_eq(h->opcode, op);
    ck_assert_uint_eq(h->req_id, 77);
    return h->status;
}

static void gb_expect_closed(int fd)
{
    ssize_t n;
    /* Error replies may come first; the connection must end. */
    while ((n = gb_recv(fd, 10000)) > 0)
        ;
    ck_assert_msg(n == 0, "the daemon kept the connection open");
}

static void gb_hello(int fd)
{
    struct kvc_hello_req q = {.min_version = 1, .max_version = 1};
    ck_assert_int_eq(gb_send(fd, KVC_OP_HELLO, sizeof(q), &q, sizeof(q)), sizeof(q) + 24);
    ck_assert_int_eq(gb_reply_status(fd, KVC_OP_HELLO), 0);
}

static void gb_stats_ok(int fd)
{
    struct kvc_stats_req q = {0};
    ck_assert_int_gt(gb_send(fd, KVC_OP_STATS, sizeof(q), &q, sizeof(q)), 0);
    ck_assert_int_eq(gb_reply_status(fd, KVC_OP_STATS), 0);
}

START_TEST(test_garbage_random_bytes)
{
    static uint8_t buf[4096];
    uint64_t x = 0x1234567887654321ull;
    for (int it = 0; it < 40; it++) {
        int fd = gb_connect();
        size_t n = 1 + (size_t)(x % sizeof(buf));
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[i] = (uint8_t)x;
        }
        if (it % 2 && n >= 24) {
            /* A readable header over random fields and payload. */
            struct kvc_msg_hdr h = {.magic = KVC_PROTO_MAGIC, .version = KVC_PROTO_VERSION};
            memcpy(buf, &h, 8);
        }
        if (it % 4 == 3)
            gb_hello(fd);
        ck_assert_int_eq(send(fd, buf, n, MSG_NOSIGNAL), (ssize_t)n);
        if (it % 2 == 0)
            gb_expect_closed(fd);
        close(fd);
    }
}
END_TEST

START_TEST(test_garbage_truncated_header)
{
    struct kvc_msg_hdr h = {.magic = KVC_PROTO_MAGIC, .version = KVC_PROTO_VERSION,
                            .opcode = KVC_OP_HELLO};
    int fd = gb_connect();
    ck_assert_int_eq(send(fd, &h, 10, MSG_NOSIGNAL), 10);
    gb_expect_closed(fd);
    close(fd);
    fd = gb_connect();
    ck_assert_int_eq(send(fd, "", 0, MSG_NOSIGNAL), 0); /* an empty datagram */
    gb_expect_closed(fd);
    close(fd);
}
END_TEST

START_TEST(test_garbage_lying_length)
{
    struct kvc_stats_req q = {0};
    int fd = gb_connect();
    gb_hello(fd);
    ck_assert_int_gt(gb_send(fd, KVC_OP_STATS, 1000, &q, sizeof(q)), 0);
    ck_assert_int_eq(gb_reply_status(fd, KVC_OP_STATS), -EBADMSG);
    ck_assert_int_gt(gb_send(fd, KVC_OP_STATS, 2, &q, sizeof(q)), 0);
    ck_assert_int_eq(gb_reply_status(fd, KVC_OP_STATS), -EBADMSG);
    ck_assert_int_gt(gb_send(fd, KVC_OP_STATS, 4, &q, 4), 0); /* honest but short */
    ck_assert_int_eq(gb_reply_status(fd, KVC_OP_STATS), -EBADMSG);
    gb_stats_ok(fd); /* the connection still serves */
    close(fd);
}
END_TEST

START_TEST(test_garbage_huge_counts)
{
    uint64_t body[8] = {0};
    struct kvc_lookup_req *lq = (struct kvc_lookup_req *)body;
    struct kvc_reserve_req *rq = (struct kvc_reserve_req *)body;
    struct kvc_release_req *eq = (struct kvc_release_req *)body;
    int fd = gb_connect();
    gb_hello(fd);
    lq->ns_id = 1;
    lq->nkeys = UINT32_MAX;
    ck_assert_int_gt(gb_send(fd, KVC_OP_LOOKUP, sizeof(*lq), lq, sizeof(*lq)), 0);
    ck_assert_int_eq(gb_reply_status(fd, KVC_OP_LOOKUP), -E2BIG);
    lq->nkeys = KVC_PROTO_MAX_KEYS; /* allowed, but only one key follows */
    ck_assert_int_gt(gb_send(fd, KVC_OP_LOOKUP, sizeof(*lq) + 16, lq, sizeof(*lq) + 16), 0);
    ck_assert_int_eq(gb_reply_status(fd, KVC_OP_LOOKUP), -EBADMSG);
    lq->nkeys = 0x10000001; /* count * 16 wraps to 16 in 32 bits */
    ck_assert_int_gt(gb_send(fd, KVC_OP_LOOKUP, sizeof(*lq) + 16, lq, sizeof(*lq) + 16), 0);
    ck_assert_int_eq(gb_reply_status(fd, KVC_OP_LOOKUP), -E2BIG);
    memset(body, 0, sizeof(body));
    rq->ns_id = 1;
    rq->nkeys = UINT32_MAX;
    ck_assert_int_gt(gb_send(fd, KVC_OP_RESERVE, sizeof(*rq), rq, sizeof(*rq)), 0);
    ck_assert_int_eq(gb_reply_status(fd, KVC_OP_RESERVE), -E2BIG);
    memset(body, 0, sizeof(body));
    eq->nleases = UINT32_MAX;
    ck_assert_int_gt(gb_send(fd, KVC_OP_RELEASE, sizeof(*eq), eq, sizeof(*eq)), 0);
    ck_assert_int_eq(gb_reply_status(fd, KVC_OP_RELEASE), -E2BIG);
    /* A well-formed lookup of a namespace that does not exist (its key not all-zero, which
     * is refused as a key: it means "no parent"). */
    memset(body, 0, sizeof(body));
    lq->ns_id = 4000;
    lq->nkeys = 1;
    ((struct kvc_wire_key *)(lq + 1))->lo = 1;
    ck_assert_int_gt(gb_send(fd, KVC_OP_LOOKUP, sizeof(*lq) + 16, lq, sizeof(*lq) + 16), 0);
    ck_assert_int_eq(gb_reply_status(fd, KVC_OP_LOOKUP), -ENOENT);
    gb_stats_ok(fd);
    close(fd);
}
END_TEST

START_TEST(test_garbage_bad_opcodes)
{
    uint64_t body[4] = {0};
    int fd = gb_connect();
    gb_hello(fd);
    ck_assert_int_gt(gb_send(fd, 0, 8, body, 8), 0);
    ck_assert_int_eq(gb_reply_status(fd, 0), -EOPNOTSUPP);
    ck_assert_int_gt(gb_send(fd, 999, 8, body, 8), 0);
    ck_assert_int_eq(gb_reply_status(fd, 999), -EOPNOTSUPP);
    ck_assert_int_gt(gb_send(fd, KVC_OP_MAX, 0, body, 0), 0);
    ck_assert_int_eq(gb_reply_status(fd, KVC_OP_MAX), -EOPNOTSUPP);
    gb_stats_ok(fd);
    close(fd);
}
END_TEST

START_TEST(test_garbage_before_hello)
{
    struct kvc_stats_req q = {0};
    uint64_t body[8] = {0};
    struct kvc_lookup_req *lq = (struct kvc_lookup_req *)body;
    int fd = gb_connect();
    ck_assert_int_gt(gb_send(fd, KVC_OP_STATS, sizeof(q), &q, sizeof(q)), 0);
    ck_assert_int_eq(gb_reply_status(fd, KVC_OP_STATS), -EPROTO);
    lq->ns_id = 1;
    lq->nkeys = 1;
    ((struct kvc_wire_key *)(lq + 1))->lo = 1; /* well-formed but for the missing HELLO */
    ck_assert_int_gt(gb_send(fd, KVC_OP_LOOKUP, sizeof(*lq) + 16, lq, sizeof(*lq) + 16), 0);
    ck_assert_int_eq(gb_reply_status(fd, KVC_OP_LOOKUP), -EPROTO);
    /* A HELLO with an impossible version range is refused too. */
    {
        struct kvc_hello_req h = {.min_version = 5, .max_version = 9};
        ck_assert_int_gt(gb_send(fd, KVC_OP_HELLO, sizeof(h), &h, sizeof(h)), 0);
        ck_assert_int_eq(gb_reply_status(fd, KVC_OP_HELLO), -EPROTO);
        ck_assert_int_gt(gb_send(fd, KVC_OP_STATS, sizeof(q), &q, sizeof(q)), 0);
        ck_assert_int_eq(gb_reply_status(fd, KVC_OP_STATS), -EPROTO);
    }
    gb_hello(fd);
    gb_stats_ok(fd);
    close(fd);
}
END_TEST

START_TEST(test_garbage_descriptor)
{
    struct kvc_msg_hdr h = {.magic = KVC_PROTO_MAGIC, .version = KVC_PROTO_VERSION,
                            .opcode = KVC_OP_HELLO, .req_id = 77,
                            .len = sizeof(struct kvc_hello_req)};
    char buf[sizeof(h) + sizeof(struct kvc_hello_req)];
    struct kvc_hello_req q = {.min_version = 1, .max_version = 1};
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
                         .msg_controllen = sizeof(ctl.b)};
    struct cmsghdr *cm;
    struct pollfd p;
    int pfd[2], fd = gb_connect();
    char c;
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), &q, sizeof(q));
    ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
    memset(&ctl, 0, sizeof(ctl));
    cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &pfd[1], sizeof(int));
    ck_assert_int_eq(sendmsg(fd, &msg, MSG_NOSIGNAL), (ssize_t)sizeof(buf));
    gb_expect_closed(fd);
    close(fd);
    /* The daemon closed the descriptor it got: the pipe reads EOF once ours is closed. */
    close(pfd[1]);
    p = (struct pollfd){.fd = pfd[0], .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 10000), 1);
    ck_assert_int_eq(read(pfd[0], &c, 1), 0);
    close(pfd[0]);
}
END_TEST

START_TEST(test_garbage_oversized_datagram)
{
    size_t n = 200 * 1024;
    int sz = 1 << 20, fd = gb_connect();
    uint8_t *buf = calloc(1, n);
    struct kvc_msg_hdr h = {.magic = KVC_PROTO_MAGIC, .version = KVC_PROTO_VERSION,
                            .opcode = KVC_OP_STATS, .len = (uint32_t)(n - sizeof(h))};
    ck_assert_ptr_nonnull(buf);
    memcpy(buf, &h, sizeof(h));
    ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz)), 0);
    gb_hello(fd);
    ck_assert_int_eq(send(fd, buf, n, MSG_NOSIGNAL), (ssize_t)n);
    gb_expect_closed(fd);
    close(fd);
    free(buf);
}
END_TEST

START_TEST(test_garbage_never_reads_replies)
{
    struct kvc_stats_req q = {0};
    uint64_t clients = 0, end;
    int fd = gb_connect(), sent = 0, closed = 0;
    gb_hello(fd);
    end = daemon_now_ms() + (uint64_t)daemon_ms(20000);
    while (!closed && daemon_now_ms() < end) {
        ssize_t n = gb_send(fd, KVC_OP_STATS, sizeof(q), &q, sizeof(q));
        if (n > 0) {
            sent++;
        } else if (errno == EAGAIN) {
            usleep(1000);
        } else {
            closed = 1; /* EPIPE / ECONNRESET: the daemon dropped us */
        }
        if (sent % 64 == 0) {
            struct pollfd p = {.fd = fd, .events = 0};
            poll(&p, 1, 0);
            if (p.revents & POLLHUP)
                closed = 1;
        }
    }
    ck_assert_msg(closed, "the daemon kept a client that never reads (%d requests)", sent);
    /* Meanwhile others are served, and the dropped one is counted out. */
    ck_assert_int_eq(daemon_roundtrip(&gb_d), 0);
    end = daemon_now_ms() + (uint64_t)daemon_ms(10000);
    do
        ck_assert_int_eq(daemon_stat(&gb_d, "clients_now", &clients), 0);
    while (clients != 1 && daemon_now_ms() < end);
    ck_assert_uint_eq(clients, 1);
    close(fd);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_garbage");
    for (int io = 0; io < 2; io++) {
        TCase *tc = tcase_create(io ? "garbage_io_threads" : "garbage");
        tcase_set_timeout(tc, daemon_slow() * 60);
        tcase_add_checked_fixture(tc, io ? gb_setup_io : gb_setup, gb_teardown);
        tcase_add_test(tc, test_garbage_random_bytes);
        tcase_add_test(tc, test_garbage_truncated_header);
        tcase_add_test(tc, test_garbage_lying_length);
        tcase_add_test(tc, test_garbage_huge_counts);
        tcase_add_test(tc, test_garbage_bad_opcodes);
        tcase_add_test(tc, test_garbage_before_hello);
        tcase_add_test(tc, test_garbage_descriptor);
        tcase_add_test(tc, test_garbage_oversized_datagram);
        tcase_add_test(tc, test_garbage_never_reads_replies);
        suite_add_tcase(s, tc);
    }
    if (daemon_suite_init("e2e-garbage"))
        return 1;
    return daemon_suite_run(s);
}
