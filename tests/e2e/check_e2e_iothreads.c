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
 * build's race check included: both fail the stop's status). Those cases keep every socket
 * on the I/O threads (server.io_threads_min_active = 1).
 *
 * The fallback (server.io_threads_min_active = 8): a lone client stays on the loop thread;
 * then, in cycles, eight busy clients come (the sockets go to the I/O threads) and are
 * killed, at staggered points of the hand-over (the sockets go back to the loop), while a
 * raw client pipelines runs of requests on one connection and, on fresh ones, a NS_OPEN
 * among them: every reply comes in the order sent, NS_OPEN's with its arena's descriptor,
 * every block byte for byte, and both hand-overs happen in every cycle (io_to_threads,
 * io_to_loop); at the end nothing is held.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/kvc_proto.h"
#include "daemon/config.h"
#include "tests/lib/daemon.h"

#define IO_BB 4096 /* daemon_layout(.., 4): 4 tokens of 1 KiB */
#define IO_PROCS 8
#define IO_ROUNDS 40
#define IO_CHAIN 4
#define IO_HOT 16 /* chains the parent puts first, that every child reads */

static struct daemon io_d;

static void io_setup(void)
{
    static const char *const args[] = {
        "-o", "host.size=64m",       "-o", "host.page_size=64k",
        "-o", "server.io_threads=2", "-o", "server.io_threads_min_active=1",
        NULL};
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

/* Sends op with req_id, a header claiming `len` and n payload bytes. 0 or -1. */
static int io_send_msg(int fd, uint16_t op, uint32_t req_id, uint32_t len, const void *body,
                       size_t n)
{
    uint64_t tx[64];
    struct kvc_msg_hdr *h = (struct kvc_msg_hdr *)tx;
    if (n > sizeof(tx) - sizeof(*h))
        return -1;
    *h = (struct kvc_msg_hdr){.magic = KVC_PROTO_MAGIC,
                              .version = KVC_PROTO_VERSION,
                              .opcode = op,
                              .req_id = req_id,
                              .len = len};
    memcpy(h + 1, body, n);
    return send(fd, tx, sizeof(*h) + n, MSG_NOSIGNAL) == (ssize_t)(sizeof(*h) + n) ? 0 : -1;
}

/* The same, in the test's process: a failure fails the case. */
static void io_raw_send(int fd, uint16_t op, uint32_t req_id, uint32_t len, const void *body,
                        size_t n)
{
    ck_assert_int_eq(io_send_msg(fd, op, req_id, len, body, n), 0);
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
    static const char *const args[] = {
        "-o", "host.size=32m",       "-o", "server.max_clients=2",
        "-o", "server.io_threads=2", "-o", "server.io_threads_min_active=1",
        NULL};
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

/* ---- the fallback to the loop thread ------------------------------------------------------ */

#define IO_FB_MIN_ACTIVE "8"
#define IO_FB_BUSY 8   /* busy clients: the sockets go to the I/O threads */
#define IO_FB_CYCLES 4 /* loop → threads → loop */
#define IO_FB_PIPE 24  /* requests of a run: three of the I/O threads' batches */

/* Shared with the children (MAP_SHARED). */
struct io_fb_shared {
    volatile int stop; /* the stream child leaves */
    volatile int bad;  /* a child saw a wrong byte, order or descriptor: what (line) */
};
static struct io_fb_shared *io_fb;

static void io_fb_setup(void)
{
    static const char *const args[] = {
        "-o", "host.size=64m",       "-o", "host.page_size=64k",
        "-o", "server.io_threads=2", "-o", "server.io_threads_min_active=" IO_FB_MIN_ACTIVE,
        NULL};
    memset(&io_d, 0, sizeof(io_d));
    ck_assert_int_eq(daemon_start(&io_d, args), 0);
    io_fb = mmap(NULL, sizeof(*io_fb), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(io_fb, MAP_FAILED);
    memset((void *)io_fb, 0, sizeof(*io_fb));
}

static void io_fb_teardown(void)
{
    io_teardown();
    munmap((void *)io_fb, sizeof(*io_fb));
}

#define IO_FB_BAD()                                                                                \
    do {                                                                                           \
        io_fb->bad = __LINE__;                                                                     \
        goto out;                                                                                  \
    } while (0)

/* The children's raw requests (no Check asserts in a child): 0 or -1. */
static int io_q_connect(void)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    memcpy(a.sun_path, io_d.sock, strlen(io_d.sock) + 1);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* The next reply (10 s at most) into rx, and the descriptor it carried (-1 none). */
static int io_q_reply(int fd, uint64_t *rx, size_t cap, int *rfd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = rx, .iov_len = cap};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    *rfd = -1;
    if (poll(&p, 1, daemon_ms(10000)) != 1)
        return -1;
    ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < (ssize_t)sizeof(struct kvc_msg_hdr))
        return -1;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
            memcpy(rfd, CMSG_DATA(cm), sizeof(int));
    return 0;
}

/* Sends ops[i] with req_id first + i, all before reading a reply, then checks each reply's
 * id, opcode, status and descriptor (an NS_OPEN's: its arena, of the size it says; no other
 * reply carries one). 0 or -1. */
static int io_q_run(int fd, const uint16_t *ops, int n, uint32_t first)
{
    static uint64_t rx[(KVC_PROTO_MAX_MSG + 64) / 8];
    struct kvc_sync_req y = {0};
    struct kvc_hello_req hq = {.min_version = 1, .max_version = 1};
    struct kvc_ns_open_req oq;
    struct kvc_layout lay = daemon_layout("e2e-iothreads", 4);
    memset(&oq, 0, sizeof(oq));
    daemon_wire_layout(&lay, &oq.layout);
    for (int i = 0; i < n; i++) {
        int rc = ops[i] == KVC_OP_HELLO
                     ? io_send_msg(fd, ops[i], first + i, sizeof(hq), &hq, sizeof(hq))
                 : ops[i] == KVC_OP_NS_OPEN
                     ? io_send_msg(fd, ops[i], first + i, sizeof(oq), &oq, sizeof(oq))
                     : io_send_msg(fd, ops[i], first + i, sizeof(y), &y, sizeof(y));
        if (rc)
            return -1;
    }
    for (int i = 0; i < n; i++) {
        const struct kvc_msg_hdr *h = (const struct kvc_msg_hdr *)rx;
        struct stat st;
        int rfd, ok;
        if (io_q_reply(fd, rx, sizeof(rx), &rfd))
            return -1;
        ok = h->req_id == first + (uint32_t)i && h->opcode == ops[i] && h->status >= 0;
        if (ops[i] == KVC_OP_NS_OPEN) {
            const struct kvc_ns_open_rep *r = (const void *)(h + 1);
            ok = ok && (h->flags & KVC_MSG_F_FD) && rfd >= 0 && fstat(rfd, &st) == 0 &&
                 (uint64_t)st.st_size == r->arena_bytes;
        } else {
            ok = ok && rfd < 0;
        }
        if (rfd >= 0)
            close(rfd);
        if (!ok)
            return -1;
    }
    return 0;
}

/* Pipelines runs of IO_FB_PIPE requests on one connection until told to stop, and every
 * 150 ms a fresh connection's HELLO, ten SYNCs, NS_OPEN and ten SYNCs at once (not more
 * often: a window of 100 ms with 4 busy connections or more keeps the I/O threads on). */
static int io_fb_stream_child(void *arg)
{
    uint16_t run[IO_FB_PIPE], fresh[22];
    uint32_t id = 2;
    uint64_t fresh_ms = 0;
    int fd = io_q_connect(), rc = 1;
    (void)arg;
    for (int i = 0; i < IO_FB_PIPE; i++)
        run[i] = KVC_OP_SYNC;
    for (int i = 0; i < 22; i++)
        fresh[i] = i == 0 ? KVC_OP_HELLO : i == 11 ? KVC_OP_NS_OPEN : KVC_OP_SYNC;
    if (fd < 0 || io_q_run(fd, fresh, 1, 1)) /* its HELLO */
        IO_FB_BAD();
    for (; !io_fb->stop; id += IO_FB_PIPE) {
        if (io_q_run(fd, run, IO_FB_PIPE, id))
            IO_FB_BAD();
        if (daemon_now_ms() - fresh_ms >= 150) {
            int f = io_q_connect();
            fresh_ms = daemon_now_ms();
            int bad = f < 0 || io_q_run(f, fresh, 22, 1);
            if (f >= 0)
                close(f);
            if (bad)
                IO_FB_BAD();
        }
    }
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    return rc;
}

/* Puts and gets (each block checked) until killed; half of them on the socket alone. */
static int io_fb_busy_child(void *arg)
{
    struct kvc_layout lay = daemon_layout("e2e-iothreads", 4);
    uint64_t id = (uint64_t)(intptr_t)arg;
    kvc_client *c;
    kvc_ns *ns;
    if (id % 2)
        setenv("KVC_NO_FASTPATH", "1", 1);
    if (kvc_connect(io_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 1;
    for (uint64_t i = 0;; i++) {
        struct kvc_key k[IO_CHAIN];
        for (int j = 0; j < IO_CHAIN; j++)
            k[j] = io_key(200 + id, i * IO_CHAIN + (uint64_t)j);
        if (io_put(ns, k, IO_CHAIN) != IO_CHAIN || io_get_check(ns, k, IO_CHAIN) != IO_CHAIN)
            IO_FB_BAD();
    }
out:
    return 2;
}

static uint64_t io_fb_stat(kvc_client *c, const char *name)
{
    uint64_t v = 0;
    ck_assert_int_eq(daemon_client_stat(c, 0, name, &v), 0);
    return v;
}

START_TEST(test_iothreads_fallback_switches)
{
    struct kvc_layout lay = daemon_layout("e2e-iothreads", 4);
    struct kvc_key k[IO_CHAIN];
    kvc_client *c;
    kvc_ns *ns;
    uint64_t end;
    pid_t stream;
    ck_assert_int_eq(kvc_connect(io_d.sock, &c), 0);
    ck_assert_int_gt(stream = daemon_child_spawn(io_fb_stream_child, NULL), 0);
    /* Two busy connections (and the fresh ones): the loop thread keeps every socket. */
    usleep((useconds_t)daemon_ms(400) * 1000);
    ck_assert_uint_eq(io_fb_stat(c, "io_to_threads"), 0);
    for (int cycle = 0; cycle < IO_FB_CYCLES; cycle++) {
        uint64_t t0 = io_fb_stat(c, "io_to_threads"), l0 = io_fb_stat(c, "io_to_loop");
        pid_t pids[IO_FB_BUSY];
        for (int i = 0; i < IO_FB_BUSY; i++)
            ck_assert_int_gt(
                pids[i] = daemon_child_spawn(io_fb_busy_child, (void *)(intptr_t)(cycle * 16 + i)),
                0);
        /* Busy: the stream's connection (and this one) go to the I/O threads... */
        end = daemon_now_ms() + (uint64_t)daemon_ms(30000);
        while (io_fb_stat(c, "io_to_threads") == t0 && daemon_now_ms() < end)
            usleep(20000);
        ck_assert_uint_gt(io_fb_stat(c, "io_to_threads"), t0);
        /* ... and the busy ones die at a different point of that each cycle. */
        usleep((useconds_t)(cycle * 40000));
        for (int i = 0; i < IO_FB_BUSY; i++)
            kill(pids[i], SIGKILL);
        for (int i = 0; i < IO_FB_BUSY; i++)
            daemon_child_wait(pids[i], daemon_ms(10000), NULL);
        /* Light again: back to the loop thread. */
        end = daemon_now_ms() + (uint64_t)daemon_ms(30000);
        while (io_fb_stat(c, "io_to_loop") == l0 && daemon_now_ms() < end)
            usleep(20000);
        ck_assert_uint_gt(io_fb_stat(c, "io_to_loop"), l0);
        ck_assert_msg(!io_fb->bad, "a client saw a wrong reply or byte (line %d)", io_fb->bad);
    }
    io_fb->stop = 1;
    ck_assert_int_eq(daemon_child_wait(stream, daemon_ms(30000), NULL), 0);
    ck_assert_msg(!io_fb->bad, "a client saw a wrong reply or byte (line %d)", io_fb->bad);
    /* This connection, on whichever side it is now, still reads and writes blocks. */
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    for (int j = 0; j < IO_CHAIN; j++)
        k[j] = io_key(777, (uint64_t)j);
    ck_assert_int_eq(io_put(ns, k, IO_CHAIN), IO_CHAIN);
    ck_assert_int_eq(io_get_check(ns, k, IO_CHAIN), IO_CHAIN);
    /* Every killed client gave everything back. */
    end = daemon_now_ms() + (uint64_t)daemon_ms(10000);
    while (io_fb_stat(c, "clients_now") != 1 && daemon_now_ms() < end)
        usleep(10000);
    ck_assert_uint_eq(io_fb_stat(c, "clients_now"), 1);
    ck_assert_uint_eq(io_fb_stat(c, "pins_now"), 0);
    ck_assert_uint_eq(io_fb_stat(c, "reserved_now"), 0);
    ck_assert_uint_eq(io_fb_stat(c, "errors"), 0);
    kvc_disconnect(c);
}
END_TEST

/* server.io_threads = auto, the default: the daemon runs as many I/O threads as
 * config_io_threads_auto gives for the CPUs it may run on (this process's: it inherits
 * them), and says so in its log once. Named here: the suites' daemons run the loop alone
 * (or KVC_IO_THREADS) unless a case says otherwise (tests/lib/daemon.c); check_config checks
 * that auto is the default. */
START_TEST(test_iothreads_auto)
{
    static const char *const args[] = {"-o", "host.size=16m", "-o", "server.io_threads=auto", NULL};
    struct daemon d = {0};
    cpu_set_t set;
    int want;
    ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
    want = (int)config_io_threads_auto(CPU_COUNT(&set));
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(daemon_roundtrip(&d), 0);
    printf("e2e_iothreads: %d CPUs: %d I/O threads\n", CPU_COUNT(&set), io_threads_running(d.pid));
    ck_assert_int_eq(io_threads_running(d.pid), want);
    ck_assert_int_eq(daemon_log_count(&d, "(server.io_threads = auto)"), 1);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
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
    tc = tcase_create("fallback");
    tcase_set_timeout(tc, daemon_slow() * 240);
    tcase_add_checked_fixture(tc, io_fb_setup, io_fb_teardown);
    tcase_add_test(tc, test_iothreads_fallback_switches);
    suite_add_tcase(s, tc);
    tc = tcase_create("auto");
    tcase_set_timeout(tc, daemon_slow() * 60);
    tcase_add_test(tc, test_iothreads_auto);
    suite_add_tcase(s, tc);
    if (daemon_suite_init("e2e-iothreads"))
        return 1;
    return daemon_suite_run(s);
}
