/*
 * check_e2e_put.c — kvc_put_prefix with one round trip (issue 16): the commit is sent quiet
 * (KVC_COMMIT_F_QUIET) and not waited for. What kvc_put_prefix promises, against a real kvcd:
 *
 * - the client that put sees its blocks at once, through the socket and the shared index;
 * - another process sees them once the putter's kvc_flush() returned 0, and after its
 *   kvc_disconnect();
 * - a commit that fails (its reservation outlived server.reservation_timeout) is reported,
 *   once, by the next kvc_put_prefix() (which then stores nothing) or kvc_flush(), and
 *   calls in between keep it; one failing inside a put of several chunks is that put's own
 *   answer;
 * - a connection closed with a commit error reply unread, or with a commit still unread by
 *   the daemon, leaks no reservation, pin or slot: the daemon handles the commit a client
 *   sent before it closed, and drops a reservation nobody committed;
 * - blocks large enough to be copied with non-temporal stores read back the same elsewhere;
 * - SYNC and the COMMIT flags are checked like every other field;
 * - every key of a RESERVE is counted once by its fate, a skipped key by why it was skipped;
 * - a reservation may hang from a block its own client reserved and has not committed (a
 *   prompt's next chunk, issue 26): it commits after that block (EAGAIN before, still the
 *   client's), goes with it when that one is aborted or its client dies, and a put whose
 *   quiet commit comes too early is aborted and reported; another process never hangs from
 *   it (every key skipped) and reads the chain, byte for byte, once both are committed.
 *
 * A put is made to take longer than the reservation timeout by a source block in a page
 * that is not readable yet: the copy faults, and the SIGSEGV handler sleeps (or stops the
 * daemon) before it makes the page readable and lets the copy go on.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc_proto.h"
#include "tests/lib/daemon.h"

#define PT_N 8
/* Blocks of 4 KiB: a chain longer than one RESERVE (2048 keys) is 8 MiB. */
#define PT_TOKENS 4
#define PT_LONG (KVC_PROTO_MAX_KEYS + 4)

static const char *const pt_args[] = {"-o", "host.size=32m", "-o", "host.page_size=64k", NULL};
/* Reservations expire after 100 ms (the tick that aborts them runs every second). */
static const char *const pt_args_expire[] = {"-o", "host.size=32m", "-o", "host.page_size=64k",
                                             "-o", "server.reservation_timeout=100ms", NULL};

static struct daemon pt_d;

/* ---- a put that stalls in its copy --------------------------------------------------- */

static uint8_t *pt_slow;       /* PROT_NONE until the handler has run */
static size_t pt_slow_len;
static int pt_slow_ms;         /* the handler sleeps this long, */
static pid_t pt_slow_stop;     /* or stops this process (the daemon), if not 0 */
static volatile sig_atomic_t pt_slow_hits;

static void pt_on_segv(int sig, siginfo_t *si, void *uc)
{
    uint8_t *a = si->si_addr;
    (void)uc;
    if (!pt_slow || a < pt_slow || a >= pt_slow + pt_slow_len) {
        signal(sig, SIG_DFL); /* a real fault: crash on return */
        return;
    }
    if (pt_slow_stop) {
        kill(pt_slow_stop, SIGSTOP);
    } else {
        struct timespec ts = {.tv_sec = pt_slow_ms / 1000,
                              .tv_nsec = (long)(pt_slow_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
    }
    mprotect(pt_slow, pt_slow_len, PROT_READ | PROT_WRITE);
    pt_slow_hits++;
}

/* A block of len bytes holding k's bytes, whose first read faults into pt_on_segv. */
static void *pt_slow_block(const struct kvc_key *k, size_t len)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = pt_on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    ck_assert_int_eq(sigaction(SIGSEGV, &sa, NULL), 0);
    pt_slow_len = (len + 4095) & ~(size_t)4095;
    pt_slow = mmap(NULL, pt_slow_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(pt_slow, MAP_FAILED);
    daemon_block_fill(k, pt_slow, len);
    ck_assert_int_eq(mprotect(pt_slow, pt_slow_len, PROT_NONE), 0);
    pt_slow_hits = 0;
    return pt_slow;
}

static void pt_slow_done(void)
{
    munmap(pt_slow, pt_slow_len);
    pt_slow = NULL;
}

/* ---- helpers ------------------------------------------------------------------------- */

static void pt_start(const char *const *args)
{
    memset(&pt_d, 0, sizeof(pt_d));
    ck_assert_int_eq(daemon_start(&pt_d, args), 0);
}

static void pt_stop(void)
{
    ck_assert_int_eq(daemon_stop(&pt_d), 0);
    daemon_cleanup(&pt_d);
}

static void pt_open(kvc_client **c, kvc_ns **ns)
{
    struct kvc_layout lay = daemon_layout("e2e-put", PT_TOKENS);
    ck_assert_int_eq(kvc_connect(pt_d.sock, c), 0);
    ck_assert_int_eq(kvc_ns_open(*c, &lay, ns), 0);
}

/* n blocks holding the bytes of keys[i]; free with pt_blocks_free. */
static void **pt_blocks(const kvc_ns *ns, const struct kvc_key *keys, size_t n)
{
    size_t bb = kvc_ns_block_bytes(ns);
    void **b = calloc(n, sizeof(*b));
    ck_assert_ptr_nonnull(b);
    for (size_t i = 0; i < n; i++) {
        b[i] = malloc(bb);
        ck_assert_ptr_nonnull(b[i]);
        daemon_block_fill(&keys[i], b[i], bb);
    }
    return b;
}

static void pt_blocks_free(void **b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(b[i]);
    free(b);
}

/* Hits of a lookup of keys[0..n) on ns, every byte checked. */
static int pt_hits(kvc_ns *ns, const struct kvc_key *keys, size_t n)
{
    size_t bb = kvc_ns_block_bytes(ns);
    kvc_lease *l = NULL;
    int h = kvc_lookup(ns, keys, n, 0, &l);
    ck_assert_int_ge(h, 0);
    for (int i = 0; i < h; i++)
        ck_assert_int_eq(daemon_block_check(&keys[i], kvc_lease_data(l, (size_t)i), bb), -1);
    kvc_release(l);
    return h;
}

/* Hits of kvc_get_prefix (the shared index first), every byte checked. */
static int pt_get(kvc_ns *ns, const struct kvc_key *keys, size_t n)
{
    size_t bb = kvc_ns_block_bytes(ns);
    void **dst = calloc(n, sizeof(*dst));
    for (size_t i = 0; i < n; i++)
        dst[i] = calloc(1, bb);
    int h = kvc_get_prefix(ns, keys, n, dst);
    for (int i = 0; i < h; i++)
        ck_assert_int_eq(daemon_block_check(&keys[i], dst[i], bb), -1);
    pt_blocks_free(dst, n);
    return h;
}

static uint64_t pt_stat(kvc_client *c, const char *name)
{
    uint64_t v = UINT64_MAX;
    ck_assert_int_eq(daemon_client_stat(c, 0, name, &v), 0);
    return v;
}

/* Waits until the daemon counts `want` clients; false after 10 s. */
static bool pt_wait_clients(kvc_client *c, uint64_t want)
{
    uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(10000);
    while (daemon_now_ms() < end) {
        if (pt_stat(c, "clients_now") == want)
            return true;
        usleep(10000);
    }
    return false;
}

/* Nothing held in the daemon, and the pages of the slots handed out came back. */
static void pt_expect_nothing_held(kvc_client *c)
{
    ck_assert_uint_eq(pt_stat(c, "reserved_now"), 0);
    ck_assert_uint_eq(pt_stat(c, "reserved_bytes_now"), 0);
    ck_assert_uint_eq(pt_stat(c, "pins_now"), 0);
}

/* ---- cases --------------------------------------------------------------------------- */

START_TEST(test_put_seen_by_self_at_once)
{
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key k[PT_N];
    pt_start(pt_args);
    pt_open(&c, &ns);
    ck_assert_int_eq(daemon_chain_keys(ns, 1, 0, PT_N, PT_N, k), 0);
    void **b = pt_blocks(ns, k, PT_N);
    /* Each check right after its put, no flush: the daemon handles a connection in order. */
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, k, PT_N / 2, (const void *const *)b), PT_N / 2);
    ck_assert_int_eq(pt_hits(ns, k, PT_N), PT_N / 2);
    ck_assert_int_eq(kvc_put_prefix(ns, &k[PT_N / 2 - 1], k + PT_N / 2, PT_N / 2,
                                    (const void *const *)(b + PT_N / 2)),
                     PT_N / 2);
    ck_assert_int_eq(pt_get(ns, k, PT_N), PT_N);
    /* A put of what is cached stores nothing and sends no commit. */
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, k, PT_N, (const void *const *)b), 0);
    ck_assert_int_eq(kvc_flush(c), 0);
    ck_assert_uint_eq(pt_stat(c, "blocks_now"), PT_N);
    pt_expect_nothing_held(c);
    pt_blocks_free(b, PT_N);
    kvc_disconnect(c);
    pt_stop();
}
END_TEST

START_TEST(test_put_flush_without_puts)
{
    kvc_client *c;
    kvc_ns *ns;
    pt_start(pt_args);
    ck_assert_int_eq(kvc_flush(NULL), -EINVAL);
    pt_open(&c, &ns);
    ck_assert_int_eq(kvc_flush(c), 0);
    ck_assert_int_eq(kvc_flush(c), 0);
    kvc_disconnect(c);
    pt_stop();
}
END_TEST

START_TEST(test_put_large_blocks_read_elsewhere)
{
    /* Blocks from KVCI_STREAM_MIN (32 KiB) up are copied into the arena with non-temporal
     * stores (client/libkvc_copy.c): another client reads the same bytes after the flush. */
    static const uint32_t tokens[] = {33, 64, 256};
    pt_start(pt_args);
    for (size_t t = 0; t < sizeof(tokens) / sizeof(tokens[0]); t++) {
        char model[32];
        snprintf(model, sizeof(model), "e2e-put-large-%u", tokens[t]);
        struct kvc_layout lay = daemon_layout(model, tokens[t]);
        kvc_client *c, *o;
        kvc_ns *ns, *ons;
        struct kvc_key k[PT_N];
        ck_assert_int_eq(kvc_connect(pt_d.sock, &c), 0);
        ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
        ck_assert_int_eq(kvc_connect(pt_d.sock, &o), 0);
        ck_assert_int_eq(kvc_ns_open(o, &lay, &ons), 0);
        ck_assert_uint_ge(kvc_ns_block_bytes(ns), 32u << 10);
        ck_assert_int_eq(daemon_chain_keys(ns, 9, 0, PT_N, PT_N, k), 0);
        void **b = pt_blocks(ns, k, PT_N);
        ck_assert_int_eq(kvc_put_prefix(ns, NULL, k, PT_N, (const void *const *)b), PT_N);
        ck_assert_int_eq(kvc_flush(c), 0);
        ck_assert_int_eq(pt_get(ons, k, PT_N), PT_N);
        ck_assert_int_eq(pt_hits(ons, k, PT_N), PT_N);
        pt_blocks_free(b, PT_N);
        kvc_disconnect(o);
        kvc_disconnect(c);
    }
    pt_stop();
}
END_TEST

/* A child that puts a chain (family 2), then flushes or disconnects as told, says so on
 * pipe `done` and waits (connected, when it flushed) until `go` says it may leave. */
struct pt_putter {
    int done[2], go[2];
    bool disconnect; /* instead of kvc_flush */
};

static int pt_putter_run(void *arg)
{
    struct pt_putter *p = arg;
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_layout lay = daemon_layout("e2e-put", PT_TOKENS);
    struct kvc_key k[PT_N];
    char byte = 'x';
    if (kvc_connect(pt_d.sock, &c) || kvc_ns_open(c, &lay, &ns) ||
        daemon_chain_keys(ns, 2, 0, PT_N, PT_N, k))
        return 10;
    size_t bb = kvc_ns_block_bytes(ns);
    const void *b[PT_N];
    for (int i = 0; i < PT_N; i++) {
        void *x = malloc(bb);
        daemon_block_fill(&k[i], x, bb);
        b[i] = x;
    }
    if (kvc_put_prefix(ns, NULL, k, PT_N, b) != PT_N)
        return 11;
    if (p->disconnect)
        kvc_disconnect(c);
    else if (kvc_flush(c) != 0)
        return 12;
    if (write(p->done[1], &byte, 1) != 1 || read(p->go[0], &byte, 1) != 1)
        return 13;
    if (!p->disconnect)
        kvc_disconnect(c);
    return 0;
}

static void pt_other_process_case(bool disconnect)
{
    struct pt_putter p = {.disconnect = disconnect};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key k[PT_N];
    char byte;
    pt_start(pt_args);
    pt_open(&c, &ns);
    ck_assert_int_eq(daemon_chain_keys(ns, 2, 0, PT_N, PT_N, k), 0);
    ck_assert_int_eq(pipe(p.done), 0);
    ck_assert_int_eq(pipe(p.go), 0);
    pid_t pid = daemon_child_spawn(pt_putter_run, &p);
    ck_assert_int_gt(pid, 0);
    ck_assert_int_eq(read(p.done[0], &byte, 1), 1);
    /* Before the putter's connection ends: flush alone made the blocks visible. */
    ck_assert_int_eq(pt_hits(ns, k, PT_N), PT_N);
    ck_assert_int_eq(pt_get(ns, k, PT_N), PT_N);
    ck_assert_int_eq(write(p.go[1], "g", 1), 1);
    ck_assert_int_eq(daemon_child_wait(pid, daemon_ms(20000), NULL), 0);
    ck_assert(pt_wait_clients(c, 1));
    pt_expect_nothing_held(c);
    kvc_disconnect(c);
    pt_stop();
}

START_TEST(test_put_flush_makes_it_visible_to_others)
{
    pt_other_process_case(false);
}
END_TEST

START_TEST(test_put_disconnect_makes_it_visible_to_others)
{
    pt_other_process_case(true);
}
END_TEST

/* A put of PT_N blocks of family f whose commit reaches the daemon after the reservation
 * expired: it counts its blocks, stores none. */
static void pt_put_expiring(kvc_ns *ns, uint32_t f, struct kvc_key *k)
{
    ck_assert_int_eq(daemon_chain_keys(ns, f, 0, PT_N, PT_N, k), 0);
    void **b = pt_blocks(ns, k, PT_N);
    free(b[0]);
    b[0] = pt_slow_block(&k[0], kvc_ns_block_bytes(ns));
    pt_slow_ms = daemon_ms(2500); /* past 100 ms and the tick after it */
    pt_slow_stop = 0;
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, k, PT_N, (const void *const *)b), PT_N);
    ck_assert_int_eq(pt_slow_hits, 1);
    b[0] = NULL;
    pt_slow_done();
    pt_blocks_free(b, PT_N);
}

START_TEST(test_put_commit_error_reported_by_next_put)
{
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key k[PT_N], k2[PT_N];
    kvc_resv *r;
    pt_start(pt_args_expire);
    pt_open(&c, &ns);
    pt_put_expiring(ns, 3, k);
    /* Calls that are not puts read the error reply and keep it. */
    ck_assert_uint_ge(pt_stat(c, "expired_reservations"), 1);
    ck_assert_int_eq(pt_hits(ns, k, PT_N), 0);
    ck_assert_int_eq(pt_get(ns, k, PT_N), 0);
    ck_assert_int_eq(daemon_chain_keys(ns, 4, 0, PT_N, PT_N, k2), 0);
    ck_assert_int_eq(kvc_reserve(ns, NULL, k2, 1, &r), 1);
    ck_assert_int_eq(kvc_abort(r), 0);
    /* The next put reports it and stores nothing. */
    void **b2 = pt_blocks(ns, k2, PT_N);
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, k2, PT_N, (const void *const *)b2), -ETIMEDOUT);
    ck_assert_int_eq(pt_hits(ns, k2, PT_N), 0);
    /* Reported once: the same put again stores everything. */
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, k2, PT_N, (const void *const *)b2), PT_N);
    ck_assert_int_eq(kvc_flush(c), 0);
    ck_assert_int_eq(pt_hits(ns, k2, PT_N), PT_N);
    pt_expect_nothing_held(c);
    pt_blocks_free(b2, PT_N);
    kvc_disconnect(c);
    pt_stop();
}
END_TEST

START_TEST(test_put_commit_error_reported_by_flush)
{
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key k[PT_N];
    pt_start(pt_args_expire);
    pt_open(&c, &ns);
    pt_put_expiring(ns, 5, k);
    ck_assert_int_eq(kvc_flush(c), -ETIMEDOUT);
    ck_assert_int_eq(kvc_flush(c), 0);
    ck_assert_int_eq(pt_hits(ns, k, PT_N), 0);
    /* Put again (no error kept any more): stored. */
    void **b = pt_blocks(ns, k, PT_N);
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, k, PT_N, (const void *const *)b), PT_N);
    ck_assert_int_eq(kvc_flush(c), 0);
    ck_assert_int_eq(pt_hits(ns, k, PT_N), PT_N);
    pt_expect_nothing_held(c);
    pt_blocks_free(b, PT_N);
    kvc_disconnect(c);
    pt_stop();
}
END_TEST

START_TEST(test_put_commit_error_of_its_own_chunk)
{
    /* A put longer than one RESERVE: its first chunk's commit fails, which the second
     * chunk's RESERVE reply brings back; the put answers it itself (nothing stored). */
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key *k = calloc(PT_LONG, sizeof(*k));
    pt_start(pt_args_expire);
    pt_open(&c, &ns);
    ck_assert_int_eq(daemon_chain_keys(ns, 6, 0, PT_LONG, PT_LONG, k), 0);
    void **b = pt_blocks(ns, k, PT_LONG);
    void *first = b[0];
    b[0] = pt_slow_block(&k[0], kvc_ns_block_bytes(ns));
    pt_slow_ms = daemon_ms(2500);
    pt_slow_stop = 0;
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, k, PT_LONG, (const void *const *)b), -ETIMEDOUT);
    pt_slow_done();
    b[0] = first;
    ck_assert_int_eq(kvc_flush(c), 0); /* answered by the put: not kept */
    ck_assert_int_eq(pt_hits(ns, k, PT_LONG), 0);
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, k, PT_LONG, (const void *const *)b), PT_LONG);
    ck_assert_int_eq(kvc_flush(c), 0);
    ck_assert_int_eq(pt_hits(ns, k, PT_LONG), PT_LONG);
    pt_expect_nothing_held(c);
    pt_blocks_free(b, PT_LONG);
    free(k);
    kvc_disconnect(c);
    pt_stop();
}
END_TEST

/* A child's put (family f) whose commit reply, or commit, is left unread when the process
 * ends without kvc_disconnect (the kernel closes its socket). stop: the daemon is stopped
 * during the copy, so the commit is still in its socket when the child is gone. */
struct pt_closer {
    uint32_t f;
    bool stop;
};

static int pt_closer_run(void *arg)
{
    const struct pt_closer *x = arg;
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_layout lay = daemon_layout("e2e-put", PT_TOKENS);
    struct kvc_key k[PT_N];
    if (kvc_connect(pt_d.sock, &c) || kvc_ns_open(c, &lay, &ns) ||
        daemon_chain_keys(ns, x->f, 0, PT_N, PT_N, k))
        return 20;
    size_t bb = kvc_ns_block_bytes(ns);
    const void *b[PT_N];
    for (int i = 1; i < PT_N; i++) {
        void *m = malloc(bb);
        daemon_block_fill(&k[i], m, bb);
        b[i] = m;
    }
    b[0] = pt_slow_block(&k[0], bb);
    pt_slow_ms = daemon_ms(2500);
    pt_slow_stop = x->stop ? pt_d.pid : 0;
    if (kvc_put_prefix(ns, NULL, k, PT_N, b) != PT_N || pt_slow_hits != 1)
        return 21;
    if (!x->stop)
        usleep((useconds_t)daemon_ms(300) * 1000); /* the error reply is in our socket */
    _exit(0); /* no kvc_disconnect: nothing read, nothing flushed */
}

static void pt_closer_case(bool stop)
{
    struct pt_closer x = {.f = stop ? 8 : 7, .stop = stop};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key k[PT_N];
    int sig;
    /* Stopped, the daemon must not expire the reservation on the tick it may run first
     * when it goes on. */
    pt_start(stop ? pt_args : pt_args_expire);
    pt_open(&c, &ns);
    ck_assert_int_eq(daemon_chain_keys(ns, x.f, 0, PT_N, PT_N, k), 0);
    uint64_t used = pt_stat(c, "host_used");
    pid_t pid = daemon_child_spawn(pt_closer_run, &x);
    ck_assert_int_gt(pid, 0);
    ck_assert_int_eq(daemon_child_wait(pid, daemon_ms(30000), &sig), 0);
    if (stop)
        ck_assert_int_eq(kill(pt_d.pid, SIGCONT), 0);
    ck_assert(pt_wait_clients(c, 1));
    pt_expect_nothing_held(c);
    if (stop) {
        /* The commit it sent before it went was handled: the blocks are there. */
        ck_assert_int_eq(pt_hits(ns, k, PT_N), PT_N);
        ck_assert_uint_eq(pt_stat(c, "host_used"), used + PT_N * kvc_ns_block_bytes(ns));
    } else {
        /* The reservation expired: its slots came back, nothing is visible. */
        ck_assert_int_eq(pt_hits(ns, k, PT_N), 0);
        ck_assert_uint_eq(pt_stat(c, "host_used"), used);
    }
    ck_assert_int_eq(daemon_roundtrip(&pt_d), 0);
    kvc_disconnect(c);
    pt_stop();
}

START_TEST(test_put_closed_with_error_reply_unread)
{
    pt_closer_case(false);
}
END_TEST

START_TEST(test_put_closed_with_commit_unread)
{
    pt_closer_case(true);
}
END_TEST

/* ---- the protocol's edge -------------------------------------------------------------- */

static uint32_t pt_raw_id;

/* Sends one request with header flags on a raw connection, reads nothing. */
static void pt_raw_send(int fd, uint16_t op, uint32_t flags, const void *body, uint32_t blen)
{
    uint64_t buf[64];
    struct kvc_msg_hdr *h = (struct kvc_msg_hdr *)buf;
    ck_assert_uint_le(blen, sizeof(buf) - sizeof(*h));
    *h = (struct kvc_msg_hdr){.magic = KVC_PROTO_MAGIC,
                              .version = KVC_PROTO_VERSION,
                              .opcode = op,
                              .req_id = ++pt_raw_id,
                              .len = blen,
                              .flags = flags};
    memcpy(h + 1, body, blen);
    ck_assert_int_eq(send(fd, buf, sizeof(*h) + blen, 0), (ssize_t)(sizeof(*h) + blen));
}

/* One request with header flags on a raw connection: the next datagram must be its reply
 * (so none came for a quiet request sent before it); its status, its payload (at most
 * rlen bytes) into rep when not NULL, its length in *len. */
static int pt_raw_flags(int fd, uint16_t op, uint32_t flags, const void *body, uint32_t blen,
                        void *rep, uint32_t rlen, uint32_t *len)
{
    uint64_t buf[64];
    struct kvc_msg_hdr *h = (struct kvc_msg_hdr *)buf;
    pt_raw_send(fd, op, flags, body, blen);
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    ck_assert_int_ge(n, (ssize_t)sizeof(*h));
    ck_assert_uint_eq(h->req_id, pt_raw_id);
    ck_assert_uint_eq(h->opcode, op);
    *len = h->len;
    if (rep)
        memcpy(rep, h + 1, h->len < rlen ? h->len : rlen);
    return h->status;
}

/* One request on a raw connection after HELLO; the reply's status, its length in *len. */
static int pt_raw(int fd, uint16_t op, const void *body, uint32_t blen, uint32_t *len)
{
    return pt_raw_flags(fd, op, 0, body, blen, NULL, 0, len);
}

/* A raw connection to pt_d, not yet greeted. */
static int pt_raw_connect(void)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_uint_lt(strlen(pt_d.sock), sizeof(a.sun_path));
    memcpy(a.sun_path, pt_d.sock, strlen(pt_d.sock) + 1);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

START_TEST(test_put_sync_and_commit_flags_checked)
{
    struct kvc_hello_req hello = {.min_version = KVC_PROTO_VERSION,
                                  .max_version = KVC_PROTO_VERSION};
    struct kvc_sync_req sync = {0};
    struct kvc_commit_req commit = {.resv_id = 12345, .ncommit = 1};
    uint32_t len;
    pt_start(pt_args);
    int fd = pt_raw_connect();
    ck_assert_int_eq(pt_raw(fd, KVC_OP_HELLO, &hello, sizeof(hello), &len), 0);
    ck_assert_int_eq(pt_raw(fd, KVC_OP_SYNC, &sync, sizeof(sync), &len), 0);
    ck_assert_uint_eq(len, 0);
    sync.flags = 1;
    ck_assert_int_eq(pt_raw(fd, KVC_OP_SYNC, &sync, sizeof(sync), &len), -EINVAL);
    sync = (struct kvc_sync_req){.pad = 1};
    ck_assert_int_eq(pt_raw(fd, KVC_OP_SYNC, &sync, sizeof(sync), &len), -EINVAL);
    ck_assert_int_eq(pt_raw(fd, KVC_OP_SYNC, &sync, 4, &len), -EBADMSG);
    commit.flags = 0x2;
    ck_assert_int_eq(pt_raw(fd, KVC_OP_COMMIT, &commit, sizeof(commit), &len), -EINVAL);
    /* A quiet commit that fails still answers, with its error. */
    commit.flags = KVC_COMMIT_F_QUIET;
    ck_assert_int_eq(pt_raw(fd, KVC_OP_COMMIT, &commit, sizeof(commit), &len), -ENOENT);
    close(fd);
    ck_assert_int_eq(daemon_roundtrip(&pt_d), 0);
    pt_stop();
}
END_TEST

/* A RELEASE with KVC_MSG_F_QUIET is answered only when it fails (the daemon says in HELLO
 * that it takes the flag): on a raw connection, the next datagram after a quiet release is
 * the reply to the request after it, and the lease is gone (released again: -ENOENT,
 * answered though quiet). The flag on any other request is refused. */
START_TEST(test_release_quiet_answers_only_failures)
{
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key k[3];
    struct kvc_hello_req hello = {.min_version = KVC_PROTO_VERSION,
                                  .max_version = KVC_PROTO_VERSION};
    struct kvc_hello_rep hrep = {0};
    struct kvc_ns_open_rep orep = {0};
    struct kvc_sync_req sync = {0};
    uint32_t len;
    pt_start(pt_args);
    pt_open(&c, &ns);
    ck_assert_int_eq(daemon_chain_keys(ns, 1, 0, 3, 3, k), 0);
    void **b = pt_blocks(ns, k, 3);
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, k, 3, (const void *const *)b), 3);
    ck_assert_int_eq(kvc_flush(c), 0);

    int fd = pt_raw_connect();
    ck_assert_int_eq(pt_raw_flags(fd, KVC_OP_HELLO, 0, &hello, sizeof(hello), &hrep,
                                  sizeof(hrep), &len),
                     0);
    ck_assert_uint_eq(len, sizeof(hrep));
    ck_assert_uint_eq(hrep.features & KVC_HELLO_F_QUIET, KVC_HELLO_F_QUIET);
    struct kvc_ns_open_req oq;
    struct kvc_layout lay = daemon_layout("e2e-put", PT_TOKENS);
    memset(&oq, 0, sizeof(oq));
    snprintf(oq.layout.model_id, sizeof(oq.layout.model_id), "%s", lay.model_id);
    oq.layout.layers = lay.layers;
    oq.layout.kv_heads = lay.kv_heads;
    oq.layout.head_dim = lay.head_dim;
    oq.layout.block_tokens = lay.block_tokens;
    oq.layout.dtype = (uint8_t)lay.dtype;
    oq.layout.kv_kind = (uint8_t)lay.kv_kind;
    ck_assert_int_eq(
        pt_raw_flags(fd, KVC_OP_NS_OPEN, 0, &oq, sizeof(oq), &orep, sizeof(orep), &len), 0);
    ck_assert_uint_eq(orep.ns_id, kvc_ns_id(ns));

    struct {
        struct kvc_lookup_req q;
        struct kvc_key keys[3];
    } lq = {.q = {.ns_id = orep.ns_id, .nkeys = 3}};
    memcpy(lq.keys, k, sizeof(k));
    struct {
        struct kvc_lookup_rep p;
        struct kvc_wire_loc locs[3];
    } lp = {0};
    /* the flag on a request that is always answered: refused, nothing pinned */
    ck_assert_int_eq(
        pt_raw_flags(fd, KVC_OP_LOOKUP, KVC_MSG_F_QUIET, &lq, sizeof(lq), NULL, 0, &len),
        -EINVAL);
    ck_assert_int_eq(pt_raw_flags(fd, KVC_OP_SYNC, 0x4, &sync, sizeof(sync), NULL, 0, &len),
                     -EINVAL);
    ck_assert_uint_eq(pt_stat(c, "pins_now"), 0);
    ck_assert_int_eq(pt_raw_flags(fd, KVC_OP_LOOKUP, 0, &lq, sizeof(lq), &lp, sizeof(lp), &len),
                     0);
    ck_assert_uint_eq(lp.p.nhit, 3);
    ck_assert_uint_ne(lp.p.lease_id, 0);
    ck_assert_uint_eq(pt_stat(c, "pins_now"), 3);

    struct {
        struct kvc_release_req q;
        uint64_t id;
    } rq = {.q = {.nleases = 1}, .id = lp.p.lease_id};
    pt_raw_send(fd, KVC_OP_RELEASE, KVC_MSG_F_QUIET, &rq, sizeof(rq));
    /* the next datagram is SYNC's: the quiet release sent none */
    ck_assert_int_eq(pt_raw(fd, KVC_OP_SYNC, &sync, sizeof(sync), &len), 0);
    ck_assert_uint_eq(pt_stat(c, "pins_now"), 0);
    /* failing, it answers */
    ck_assert_int_eq(
        pt_raw_flags(fd, KVC_OP_RELEASE, KVC_MSG_F_QUIET, &rq, sizeof(rq), NULL, 0, &len),
        -ENOENT);
    close(fd);
    pt_blocks_free(b, 3);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_roundtrip(&pt_d), 0);
    pt_stop();
}
END_TEST

/* kvc_release does not wait for the daemon (it sends the RELEASE quiet): it returns while
 * the daemon is stopped; the connection's next request, answered once the daemon runs
 * again, sees the pins gone. */
START_TEST(test_release_does_not_wait)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l = NULL;
    struct kvc_key k[4];
    pt_start(pt_args);
    pt_open(&c, &ns);
    ck_assert_int_eq(daemon_chain_keys(ns, 1, 0, 4, 4, k), 0);
    void **b = pt_blocks(ns, k, 4);
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, k, 4, (const void *const *)b), 4);
    for (int round = 0; round < 3; round++) { /* more than once: the quiet ones settle */
        ck_assert_int_eq(kvc_lookup(ns, k, 4, 0, &l), 4);
        ck_assert_uint_eq(pt_stat(c, "pins_now"), 4);
        ck_assert_int_eq(kill(pt_d.pid, SIGSTOP), 0);
        ck_assert_int_eq(kvc_release(l), 0); /* would block until SIGCONT if it waited */
        ck_assert_int_eq(kill(pt_d.pid, SIGCONT), 0);
        ck_assert_uint_eq(pt_stat(c, "pins_now"), 0);
    }
    /* many in a row (more than the requests libkvc keeps unanswered), then a flush */
    for (int i = 0; i < 40; i++) {
        ck_assert_int_eq(kvc_lookup(ns, k, 4, 0, &l), 4);
        ck_assert_int_eq(kvc_release(l), 0);
    }
    ck_assert_int_eq(kvc_flush(c), 0);
    pt_expect_nothing_held(c);
    pt_blocks_free(b, 4);
    kvc_disconnect(c);
    pt_stop();
}
END_TEST

/* ---- every key of a RESERVE is counted by its fate ------------------------------------ */

/* The counters of a key's fate at RESERVE (docs: kvcctl stats). */
static const char *const pt_fates[] = {"reserved_blocks",
                                       "dedup_blocks",
                                       "busy_blocks",
                                       "nospace_blocks",
                                       "quota_cut_blocks",
                                       "skipped_parent_blocks",
                                       "skipped_parent_busy_blocks",
                                       "skipped_busy_blocks",
                                       "skipped_nospace_blocks",
                                       "skipped_failed_blocks",
                                       "reserve_keys",
                                       NULL};
enum { PT_FATES = 11 };

static void pt_fates_get(kvc_client *c, uint64_t *v)
{
    for (int i = 0; pt_fates[i]; i++)
        v[i] = pt_stat(c, pt_fates[i]);
}

/* What the client saw, by status (enum kvc_slot), added to tally[]. */
static void pt_tally(const kvc_resv *r, size_t n, uint64_t *tally)
{
    for (size_t i = 0; i < n; i++) {
        int st = kvc_resv_status(r, i);
        ck_assert(st >= KVC_SLOT_PRESENT && st <= KVC_SLOT_NOSPACE);
        tally[st]++;
    }
}

/* A reservation of keys[0..n) under parent, tallied; returned for commit or abort. */
static kvc_resv *pt_reserve(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                            size_t n, uint64_t *tally)
{
    kvc_resv *r = NULL;
    ck_assert_int_ge(kvc_reserve(ns, parent, keys, n, &r), 0);
    ck_assert_ptr_nonnull(r);
    pt_tally(r, n, tally);
    return r;
}

/* Every key a RESERVE names is counted once by what became of it: reserved, already there,
 * busy, no room, cut by a quota, or skipped, and a skipped key by why (a parent not cached, a
 * parent still being written, behind a busy key, behind a key that found no room). The
 * counters add up to reserve_keys, and match the statuses the client got. */
START_TEST(test_put_every_key_counted)
{
    /* disk.put_wait = 0: the key another client writes is BUSY at once, not waited for */
    static const char *const args[] = {"-o", "host.size=16m", "-o", "host.page_size=64k",
                                       "-o", "disk.put_wait=0", NULL};
    enum {
        F_RESV,
        F_DEDUP,
        F_BUSY,
        F_NOSPACE,
        F_QUOTA,
        F_PARENT,
        F_PARENT_BUSY,
        F_SK_BUSY,
        F_SK_NOSPACE,
        F_SK_FAILED,
        F_KEYS
    };
    static struct kvc_key big[3][KVC_PROTO_MAX_KEYS];
    uint64_t v0[PT_FATES], v1[PT_FATES], tally[8] = {0}, asked = 0, skipped_nospace = 0;
    struct kvc_key a[4], b[4], p[1], orphan[3], q[12];
    kvc_client *c, *c2;
    kvc_ns *ns, *ns2;
    kvc_resv *ra, *rb, *rp, *rbig[3];
    char msg[256];
    pt_start(args);
    pt_open(&c, &ns);
    pt_open(&c2, &ns2);
    ck_assert_int_eq(daemon_chain_keys(ns, 1, 0, 4, 4, a), 0);
    ck_assert_int_eq(daemon_chain_keys(ns, 2, 0, 4, 4, b), 0);
    ck_assert_int_eq(daemon_chain_keys(ns, 3, 0, 1, 1, p), 0);
    ck_assert_int_eq(daemon_chain_keys(ns, 4, 0, 3, 3, orphan), 0);
    ck_assert_int_eq(daemon_chain_keys(ns, 5, 0, 12, 12, q), 0);
    pt_fates_get(c, v0);
    /* a: two committed, then the same chain again: two there, two new */
    rb = pt_reserve(ns, NULL, a, 2, tally);
    ck_assert_int_eq(kvc_commit(rb, SIZE_MAX), 2);
    ra = pt_reserve(ns, NULL, a, 4, tally);
    ck_assert_int_eq(kvc_commit(ra, SIZE_MAX), 2);
    asked += 6;
    /* a parent that was never cached (or was evicted): every key skipped */
    ra = pt_reserve(ns, &b[3], orphan, 3, tally);
    ck_assert_int_eq(kvc_resv_status(ra, 0), KVC_SLOT_SKIPPED);
    kvc_abort(ra);
    asked += 3;
    /* a parent another client is still writing */
    rp = pt_reserve(ns2, NULL, p, 1, tally);
    ra = pt_reserve(ns, &p[0], orphan, 2, tally);
    kvc_abort(ra);
    asked += 3;
    /* behind a key another client is writing: busy, then skipped */
    rb = pt_reserve(ns2, NULL, b, 2, tally);
    ra = pt_reserve(ns, NULL, b, 4, tally);
    ck_assert_int_eq(kvc_resv_status(ra, 0), KVC_SLOT_BUSY);
    kvc_abort(ra);
    kvc_abort(rb);
    kvc_abort(rp);
    asked += 6;
    /* no room: every slot of the arena reserved and held, then a key finds none and the rest
     * of its chain is skipped */
    for (int i = 0; i < 3; i++) {
        uint64_t t[8] = {0};
        ck_assert_int_eq(daemon_chain_keys(ns, 10 + (uint32_t)i, 0, KVC_PROTO_MAX_KEYS,
                                           KVC_PROTO_MAX_KEYS, big[i]),
                         0);
        rbig[i] = pt_reserve(ns, NULL, big[i], KVC_PROTO_MAX_KEYS, t);
        for (int k = 0; k < 8; k++)
            tally[k] += t[k];
        if (t[KVC_SLOT_NOSPACE])
            skipped_nospace += t[KVC_SLOT_SKIPPED];
        asked += KVC_PROTO_MAX_KEYS;
    }
    ck_assert_uint_gt(tally[KVC_SLOT_NOSPACE], 0);
    ck_assert_uint_gt(skipped_nospace, 0);
    for (int i = 0; i < 3; i++)
        kvc_abort(rbig[i]);
    /* a quota cuts the request: the keys past it come back NOSPACE */
    ck_assert_int_eq(kvc_config_set(c, "quota.client_reserved_bytes", "32k", msg, sizeof(msg)), 0);
    ra = pt_reserve(ns, NULL, q, 12, tally);
    ck_assert_int_eq(kvc_resv_status(ra, 11), KVC_SLOT_NOSPACE);
    kvc_abort(ra);
    asked += 12;
    pt_fates_get(c, v1);
    for (int i = 0; i < PT_FATES; i++)
        v1[i] -= v0[i];
    ck_assert_uint_eq(v1[F_KEYS], asked);
    ck_assert_uint_eq(v1[F_RESV], tally[KVC_SLOT_RESERVED]);
    ck_assert_uint_eq(v1[F_DEDUP], tally[KVC_SLOT_PRESENT]);
    ck_assert_uint_eq(v1[F_BUSY], tally[KVC_SLOT_BUSY]);
    ck_assert_uint_eq(v1[F_NOSPACE] + v1[F_QUOTA], tally[KVC_SLOT_NOSPACE]);
    ck_assert_uint_eq(v1[F_PARENT] + v1[F_PARENT_BUSY] + v1[F_SK_BUSY] + v1[F_SK_NOSPACE] +
                          v1[F_SK_FAILED],
                      tally[KVC_SLOT_SKIPPED]);
    ck_assert_uint_eq(v1[F_DEDUP], 2);
    ck_assert_uint_eq(v1[F_PARENT], 3);
    ck_assert_uint_eq(v1[F_PARENT_BUSY], 2);
    ck_assert_uint_eq(v1[F_BUSY], 1);
    ck_assert_uint_eq(v1[F_SK_BUSY], 3);
    ck_assert_uint_eq(v1[F_SK_NOSPACE], skipped_nospace);
    ck_assert_uint_eq(v1[F_QUOTA], 4);
    ck_assert_uint_eq(v1[F_SK_FAILED], 0);
    /* every key counted once */
    uint64_t sum = 0;
    for (int i = 0; i < F_KEYS; i++)
        sum += v1[i];
    ck_assert_uint_eq(sum, v1[F_KEYS]);
    kvc_disconnect(c2);
    kvc_disconnect(c);
    pt_stop();
}
END_TEST

/* ---- a chain under the client's own reservation (issue 26) --------------------------- */

#define PT_CHAIN_FAMILY 40

struct pt_other {
    int done[2], go[2];
    bool die; /* reserve a chain under its own reservation and exit without committing */
};

/* Hits of keys[0..n) on ns checked byte for byte, or -1 (a child cannot ck_assert). */
static int pt_child_hits(kvc_ns *ns, const struct kvc_key *keys, size_t n)
{
    kvc_lease *l = NULL;
    int h = kvc_lookup(ns, keys, n, 0, &l);
    for (int i = 0; i < h; i++)
        if (daemon_block_check(&keys[i], kvc_lease_data(l, (size_t)i), kvc_ns_block_bytes(ns)) !=
            -1)
            h = -1;
    kvc_release(l);
    return h;
}

/* The other process: under the first process's reserved block it gets no slot (every key
 * skipped) and sees nothing; once told both reservations are committed, it reads the chain.
 * With `die`, it holds a chain of its own (a chunk under its first chunk) and exits. */
static int pt_other_run(void *arg)
{
    struct pt_other *p = arg;
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r = NULL, *r2 = NULL;
    struct kvc_layout lay = daemon_layout("e2e-put", PT_TOKENS);
    struct kvc_key k[8];
    char byte = 'x';
    if (kvc_connect(pt_d.sock, &c) || kvc_ns_open(c, &lay, &ns) ||
        daemon_chain_keys(ns, PT_CHAIN_FAMILY + (p->die ? 3 : 0), 0, 8, 8, k))
        return 10;
    if (p->die) {
        if (kvc_reserve(ns, NULL, k, 4, &r) != 4 || kvc_reserve(ns, &k[3], k + 4, 4, &r2) != 4)
            return 11;
        if (write(p->done[1], &byte, 1) != 1 || read(p->go[0], &byte, 1) != 1)
            return 12;
        _exit(0); /* holding both: the daemon sees the connection end */
    }
    if (read(p->go[0], &byte, 1) != 1)
        return 13;
    if (kvc_reserve(ns, &k[3], k + 4, 4, &r) != 0)
        return 14;
    for (int i = 0; i < 4; i++)
        if (kvc_resv_status(r, (size_t)i) != KVC_SLOT_SKIPPED)
            return 15;
    kvc_abort(r);
    if (pt_child_hits(ns, k, 8) != 0)
        return 16;
    if (write(p->done[1], &byte, 1) != 1 || read(p->go[0], &byte, 1) != 1)
        return 17;
    if (pt_child_hits(ns, k, 8) != 8)
        return 18;
    kvc_disconnect(c);
    return 0;
}

/* Wakes the stopped daemon once the caller's next request is queued behind its commit. */
static int pt_cont_later(void *arg)
{
    (void)arg;
    usleep((useconds_t)daemon_ms(100) * 1000);
    return kill(pt_d.pid, SIGCONT) ? 1 : 0;
}

/* A commit's shared-index entries are published after the RESERVE behind it but before any
 * other request is answered. The daemon stopped during the put's copy, so that its quiet
 * COMMIT and the STATS after it wait in the socket together and are handled in one wake-up:
 * the STATS answer counts the commit's blocks in the index. */
START_TEST(test_put_published_before_next_answer)
{
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key k[PT_N];
    int sig;
    pt_start(pt_args);
    pt_open(&c, &ns);
    ck_assert_int_eq(daemon_chain_keys(ns, 9500, 0, PT_N, PT_N, k), 0);
    void **b = pt_blocks(ns, k, PT_N);
    free(b[0]);
    b[0] = pt_slow_block(&k[0], kvc_ns_block_bytes(ns));
    pt_slow_stop = pt_d.pid;
    uint64_t before = pt_stat(c, "fast_index_blocks");
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, k, PT_N, (const void *const *)b), PT_N);
    ck_assert_int_eq(pt_slow_hits, 1); /* the daemon is stopped, the COMMIT queued */
    pid_t pid = daemon_child_spawn(pt_cont_later, NULL);
    ck_assert_int_gt(pid, 0);
    ck_assert_uint_eq(pt_stat(c, "fast_index_blocks"), before + PT_N);
    ck_assert_int_eq(daemon_child_wait(pid, daemon_ms(30000), &sig), 0);
    pt_slow_stop = 0;
    b[0] = NULL;
    pt_slow_done();
    pt_blocks_free(b, PT_N);
    ck_assert_int_eq(pt_hits(ns, k, PT_N), PT_N);
    kvc_disconnect(c);
    pt_stop();
}
END_TEST

/* A reservation takes its slots at once: the trim it calls for runs while the client writes
 * them, before anything is committed. A stream of puts into a full arena otherwise finds it
 * full at every RESERVE and evicts for it while the client waits. */
static const char *const pt_args_trim[] = {"-o", "host.size=32m",          "-o",
                                           "host.page_size=64k",       "-o",
                                           "host.high_watermark=0.9", "-o",
                                           "host.low_watermark=0.5",  NULL};

START_TEST(test_put_trim_while_writing)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    struct kvc_key k[PT_N];
    pt_start(pt_args_trim);
    pt_open(&c, &ns);
    size_t bb = kvc_ns_block_bytes(ns);
    uint64_t cap = pt_stat(c, "host_capacity");
    void **b = NULL;
    /* Up to 80 % of the arena, below the high watermark: nothing evicted. */
    uint32_t family = 0;
    while (pt_stat(c, "host_used") + PT_N * bb < cap * 8 / 10) {
        ck_assert_int_eq(daemon_chain_keys(ns, 9000 + family++, 0, 0, PT_N, k), 0);
        b = pt_blocks(ns, k, PT_N);
        ck_assert_int_eq(kvc_put_prefix(ns, NULL, k, PT_N, (const void *const *)b), PT_N);
        pt_blocks_free(b, PT_N);
    }
    ck_assert_int_eq(kvc_flush(c), 0);
    ck_assert_uint_eq(pt_stat(c, "evicted_blocks"), 0);
    uint64_t used = pt_stat(c, "host_used"), slot = used / pt_stat(c, "blocks_now");
    /* Slots past the high watermark, held open: the trim evicts down to the low one. */
    uint32_t n = (uint32_t)((cap * 9 / 10 - used) / slot) + 4;
    ck_assert_uint_le(n, KVC_PROTO_MAX_KEYS);
    struct kvc_key *rk = calloc(n, sizeof(*rk));
    ck_assert_int_eq(daemon_chain_keys(ns, 8999, 0, 0, n, rk), 0);
    ck_assert_int_eq(kvc_reserve(ns, NULL, rk, n, &r), (int)n);
    ck_assert_uint_gt(used + n * slot, cap * 9 / 10); /* past it, by the arithmetic */
    /* No request, no commit: the trim runs now (waiting for the once-a-second tick's own
     * trim instead, 50 ms would see nothing evicted 19 times in 20). */
    usleep((useconds_t)daemon_ms(50) * 1000);
    ck_assert_uint_gt(pt_stat(c, "evicted_blocks"), 0);
    uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(5000);
    while (pt_stat(c, "host_used") > cap / 2 + (64 << 10) && daemon_now_ms() < end)
        usleep(10000);
    ck_assert_uint_le(pt_stat(c, "host_used"), cap / 2 + (64 << 10));
    ck_assert_uint_eq(pt_stat(c, "reserve_evictions"), 0);
    /* The slots held through it are the reservation's still. */
    b = pt_blocks(ns, rk, n);
    for (uint32_t i = 0; i < n; i++)
        ck_assert_int_eq(kvc_resv_write(r, i, b[i], bb), 0);
    ck_assert_int_eq(kvc_commit(r, SIZE_MAX), (int)n);
    ck_assert_int_eq(pt_hits(ns, rk, n), (int)n);
    pt_blocks_free(b, n);
    free(rk);
    pt_expect_nothing_held(c);
    kvc_disconnect(c);
    pt_stop();
}
END_TEST

START_TEST(test_chunk_reserved_under_own_uncommitted_chunk)
{
    struct pt_other p = {0};
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r1, *r2;
    struct kvc_key k[8];
    char byte;
    pt_start(pt_args);
    pt_open(&c, &ns);
    size_t bb = kvc_ns_block_bytes(ns);
    ck_assert_int_eq(daemon_chain_keys(ns, PT_CHAIN_FAMILY, 0, 8, 8, k), 0);
    void **b = pt_blocks(ns, k, 8);
    ck_assert_int_eq(pipe(p.done), 0);
    ck_assert_int_eq(pipe(p.go), 0);
    pid_t pid = daemon_child_spawn(pt_other_run, &p);
    ck_assert_int_gt(pid, 0);
    ck_assert_int_eq(kvc_reserve(ns, NULL, k, 4, &r1), 4);
    ck_assert_int_eq(kvc_reserve(ns, &k[3], k + 4, 4, &r2), 4); /* under r1's last slot */
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(kvc_resv_write(r1, (size_t)i, b[i], bb), 0);
        ck_assert_int_eq(kvc_resv_write(r2, (size_t)i, b[4 + i], bb), 0);
    }
    ck_assert_uint_eq(pt_stat(c, "reserved_chained_blocks"), 4);
    ck_assert_int_eq(kvc_commit(r2, SIZE_MAX), -EAGAIN); /* before its parent: still ours */
    ck_assert_uint_eq(pt_stat(c, "commit_parent_busy"), 1);
    ck_assert_uint_eq(pt_stat(c, "reserved_now"), 8);
    ck_assert_int_eq(write(p.go[1], "g", 1), 1);
    ck_assert_int_eq(read(p.done[0], &byte, 1), 1); /* the other was refused */
    ck_assert_uint_eq(pt_stat(c, "skipped_parent_busy_blocks"), 4);
    ck_assert_uint_eq(pt_stat(c, "reserved_chained_blocks"), 4);
    ck_assert_int_eq(kvc_commit(r1, SIZE_MAX), 4);
    ck_assert_int_eq(kvc_commit(r2, SIZE_MAX), 4);
    ck_assert_int_eq(write(p.go[1], "g", 1), 1);
    ck_assert_int_eq(daemon_child_wait(pid, daemon_ms(20000), NULL), 0);
    ck_assert(pt_wait_clients(c, 1));
    pt_expect_nothing_held(c);

    /* The parent's reservation aborted: its child's slots go with it, and committing the
     * child commits nothing. */
    struct kvc_key k2[8];
    ck_assert_int_eq(daemon_chain_keys(ns, PT_CHAIN_FAMILY + 1, 0, 8, 8, k2), 0);
    ck_assert_int_eq(kvc_reserve(ns, NULL, k2, 4, &r1), 4);
    ck_assert_int_eq(kvc_reserve(ns, &k2[3], k2 + 4, 4, &r2), 4);
    ck_assert_int_eq(kvc_abort(r1), 0);
    pt_expect_nothing_held(c);
    ck_assert_int_eq(kvc_commit(r2, SIZE_MAX), 0);
    ck_assert_int_eq(pt_hits(ns, k2, 8), 0);

    /* A put under a block of a reservation not committed yet: its quiet commit comes first,
     * so the daemon aborts it; the put reports EAGAIN and stored nothing. */
    struct kvc_key k3[8];
    ck_assert_int_eq(daemon_chain_keys(ns, PT_CHAIN_FAMILY + 2, 0, 8, 8, k3), 0);
    void **b3 = pt_blocks(ns, k3, 8);
    ck_assert_int_eq(kvc_reserve(ns, NULL, k3, 4, &r1), 4);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(kvc_resv_write(r1, (size_t)i, b3[i], bb), 0);
    ck_assert_int_eq(kvc_put_prefix(ns, &k3[3], k3 + 4, 4, (const void *const *)(b3 + 4)), 4);
    ck_assert_int_eq(kvc_flush(c), -EAGAIN);
    ck_assert_uint_eq(pt_stat(c, "reserved_now"), 4); /* r1's */
    ck_assert_int_eq(kvc_commit(r1, SIZE_MAX), 4);
    ck_assert_int_eq(pt_hits(ns, k3, 8), 4);
    ck_assert_int_eq(kvc_put_prefix(ns, &k3[3], k3 + 4, 4, (const void *const *)(b3 + 4)), 4);
    ck_assert_int_eq(kvc_flush(c), 0);
    ck_assert_int_eq(pt_hits(ns, k3, 8), 8);
    pt_blocks_free(b3, 8);

    /* A client dies holding a chain: nothing stays reserved or pinned, its keys are free. */
    struct pt_other d = {.die = true};
    struct kvc_key k4[8];
    ck_assert_int_eq(daemon_chain_keys(ns, PT_CHAIN_FAMILY + 3, 0, 8, 8, k4), 0);
    ck_assert_int_eq(pipe(d.done), 0);
    ck_assert_int_eq(pipe(d.go), 0);
    pid = daemon_child_spawn(pt_other_run, &d);
    ck_assert_int_gt(pid, 0);
    ck_assert_int_eq(read(d.done[0], &byte, 1), 1);
    ck_assert_uint_eq(pt_stat(c, "reserved_now"), 8);
    ck_assert_uint_eq(pt_stat(c, "pins_now"), 1); /* its first chunk's last block */
    ck_assert_int_eq(write(d.go[1], "g", 1), 1);
    ck_assert_int_eq(daemon_child_wait(pid, daemon_ms(20000), NULL), 0);
    ck_assert(pt_wait_clients(c, 1));
    pt_expect_nothing_held(c);
    ck_assert_int_eq(kvc_reserve(ns, NULL, k4, 8, &r1), 8);
    ck_assert_int_eq(kvc_abort(r1), 0);
    for (int i = 0; i < 2; i++) {
        close(p.done[i]);
        close(p.go[i]);
        close(d.done[i]);
        close(d.go[i]);
    }
    pt_blocks_free(b, 8);
    kvc_disconnect(c);
    pt_stop();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_put");
    TCase *tc = tcase_create("put");
    tcase_set_timeout(tc, daemon_slow() * 90);
    tcase_add_test(tc, test_put_seen_by_self_at_once);
    tcase_add_test(tc, test_put_flush_without_puts);
    tcase_add_test(tc, test_put_large_blocks_read_elsewhere);
    tcase_add_test(tc, test_put_flush_makes_it_visible_to_others);
    tcase_add_test(tc, test_put_disconnect_makes_it_visible_to_others);
    tcase_add_test(tc, test_put_commit_error_reported_by_next_put);
    tcase_add_test(tc, test_put_commit_error_reported_by_flush);
    tcase_add_test(tc, test_put_commit_error_of_its_own_chunk);
    tcase_add_test(tc, test_put_closed_with_error_reply_unread);
    tcase_add_test(tc, test_put_closed_with_commit_unread);
    tcase_add_test(tc, test_put_sync_and_commit_flags_checked);
    tcase_add_test(tc, test_release_quiet_answers_only_failures);
    tcase_add_test(tc, test_release_does_not_wait);
    tcase_add_test(tc, test_put_every_key_counted);
    tcase_add_test(tc, test_chunk_reserved_under_own_uncommitted_chunk);
    tcase_add_test(tc, test_put_trim_while_writing);
    if (getenv("KVC_NO_FASTPATH")) /* no shared index in the daemon to count */
        printf("SKIP: e2e_put: test_put_published_before_next_answer: the fast path is off\n");
    else
        tcase_add_test(tc, test_put_published_before_next_answer);
    suite_add_tcase(s, tc);
    if (daemon_suite_init("e2e-put"))
        return 1;
    return daemon_suite_run(s);
}
