/*
 * check_e2e_adversary.c — hostile local clients of other uids against a daemon of its own
 * (docs/security.md).
 *
 * DESIGN
 * The daemon runs as this process's user (root: an admin); the victim (uid 65501, the only
 * writer of the restricted namespaces victim*), a reader of them (65503) and the attacker
 * (65502) are forked children that drop to those uids (setgroups, setresgid, setresuid)
 * before they connect, so the daemon sees them as SO_PEERCRED reports them. Each attack
 * class has a case: the attacker tries to get past one limit, the test checks that it was
 * refused or contained (the error, the counter, the log line), that the victim was served
 * with the right bytes meanwhile, and that once the clients are gone the daemon is alive
 * with every pin and reservation given back. The GPU pool and WAIT cases run the server in
 * this process (the fake device of tests/lib stands in for the GPU; disk reads that never
 * finish are made by flagging blocks as being read), with the same children.
 * Without root, every case prints a SKIP line and none is registered.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc.h"
#include "client/kvc_fast.h"
#include "client/kvc_proto.h"
#include "client/libkvc_internal.h"
#include "daemon/engine.h"
#include "daemon/acl.h"
#include "daemon/config.h"
#include "daemon/config_ns.h"
#include "daemon/log.h"
#include "daemon/loop.h"
#include "daemon/server.h"
#include "daemon/store.h"
#include "kernels/kern.h"
#include "tests/lib/daemon.h"
#include "tests/lib/fake_dev.h"
#include "tiers/gpu.h"

#define ADV_VICTIM 65501u
#define ADV_ATTACKER 65502u
#define ADV_READER 65503u
#define ADV_BT 16 /* tokens per block: 16 KiB blocks (daemon_layout) */

static struct daemon adv_d;

static void adv_msleep(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ---- children as other users ------------------------------------------------------------ */

struct adv_as {
    uint32_t uid;
    int (*fn)(void *);
    void *arg;
};

static int adv_as_run(void *p)
{
    const struct adv_as *a = p;
    if (setgroups(0, NULL) || setresgid(a->uid, a->uid, a->uid) ||
        setresuid(a->uid, a->uid, a->uid))
        return 120;
    return a->fn(a->arg);
}

static pid_t adv_spawn(uint32_t uid, int (*fn)(void *), void *arg)
{
    static struct adv_as as; /* copied into the child by fork */
    as = (struct adv_as){uid, fn, arg};
    pid_t pid = daemon_child_spawn(adv_as_run, &as);
    ck_assert_int_gt(pid, 0);
    return pid;
}

static int adv_run(uint32_t uid, int (*fn)(void *), void *arg)
{
    return daemon_child_wait(adv_spawn(uid, fn, arg), 60000, NULL);
}

/* A pair of pipes for a child that holds something while the parent checks. */
struct adv_sync {
    int up[2];   /* child -> parent: "holding" */
    int down[2]; /* parent -> child: "let go" */
};

static void adv_sync_init(struct adv_sync *s)
{
    ck_assert_int_eq(pipe(s->up), 0);
    ck_assert_int_eq(pipe(s->down), 0);
}

static void adv_sync_fini(struct adv_sync *s)
{
    close(s->up[0]);
    close(s->up[1]);
    close(s->down[0]);
    close(s->down[1]);
}

static void adv_signal(int fd, char v)
{
    (void)!write(fd, &v, 1);
}

/* The next byte from fd, or 0 after 60 s or at the end (the other side is gone). */
static char adv_await(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char v = 0;
    if (poll(&p, 1, 60000) != 1 || read(fd, &v, 1) != 1)
        return 0;
    return v;
}

/* ---- the daemon --------------------------------------------------------------------------- */

/* adv_d's directory (and the suite's above it) made reachable by every uid. */
static void adv_dir_open(void)
{
    char parent[DAEMON_PATH_MAX];
    ck_assert_int_eq(daemon_dir_init(&adv_d), 0);
    snprintf(parent, sizeof(parent), "%s", adv_d.dir);
    *strrchr(parent, '/') = 0;
    ck_assert_int_eq(chmod(parent, 0711), 0);
    ck_assert_int_eq(chmod(adv_d.dir, 0711), 0);
}

/* Starts kvcd with the access lists of the victim and the limits the cases use; `extra` is
 * more "-o", "key=value" pairs. Its directory and socket are reachable by every uid. */
static void adv_start(const char *const *extra)
{
    static const char ini[] = "[namespace.victim*]\n"
                              "read = 65503\n"
                              "write = 65501\n"
                              "host_size = 16m\n";
    const char *args[64] = {"-c", NULL, "-o", "server.socket_mode=0666", "-o", "host.size=32m",
                            "-o", "host.page_size=64k", "-o", "log.rate_limit=1000"};
    char path[DAEMON_PATH_MAX];
    int n = 10;
    adv_dir_open();
    ck_assert_int_eq(daemon_file_write(&adv_d, "kvcd.ini", ini, path), 0);
    args[1] = path;
    for (; extra && *extra && n < 62; extra++)
        args[n++] = *extra;
    args[n] = NULL;
    ck_assert_int_eq(daemon_start(&adv_d, args), 0);
}

static void adv_teardown(void)
{
    if (adv_d.pid)
        ck_assert_int_eq(daemon_stop(&adv_d), 0); /* a clean exit: ASan's leak check too */
    daemon_cleanup(&adv_d);
}

static uint64_t adv_stat(const char *name)
{
    uint64_t v = UINT64_MAX;
    ck_assert_int_eq(daemon_stat(&adv_d, name, &v), 0);
    return v;
}

static uint64_t adv_stat_or0(const char *name)
{
    uint64_t v = 0;
    return daemon_stat(&adv_d, name, &v) == 0 ? v : 0;
}

/* Once every child is gone: alive, and every pin and reservation given back. */
static void adv_check_clean(void)
{
    ck_assert(daemon_alive(&adv_d));
    for (int i = 0; i < 200 && (adv_stat("pins_now") || adv_stat("reserved_now")); i++)
        adv_msleep(10);
    ck_assert_uint_eq(adv_stat("pins_now"), 0);
    ck_assert_uint_eq(adv_stat("reserved_now"), 0);
    ck_assert_uint_eq(adv_stat("reserved_bytes_now"), 0);
    ck_assert_uint_eq(adv_stat("clients_now"), 1); /* the one asking */
    ck_assert_int_eq(daemon_roundtrip(&adv_d), 0);
}

/* ---- the victim ---------------------------------------------------------------------------- */

/* Keys of a chain of n blocks of ns, unique per (family, pid). */
static void adv_keys(const kvc_ns *ns, uint32_t family, uint32_t n, struct kvc_key *keys)
{
    ck_assert_int_eq(daemon_chain_keys(ns, family ^ ((uint32_t)getpid() << 8), 0, 0, n, keys), 0);
}

/* The same chain in every process. */
static void adv_keys_shared(const kvc_ns *ns, uint32_t family, uint32_t n, struct kvc_key *keys)
{
    ck_assert_int_eq(daemon_chain_keys(ns, 0x5a000000u + family, 0, 0, n, keys), 0);
}

/* Puts n blocks (each a function of its key) and gets them back byte for byte. 0 or a code. */
static int adv_roundtrip_ns(kvc_ns *ns, uint32_t family, uint32_t n)
{
    struct kvc_key keys[64];
    void *blocks[64];
    size_t bb = kvc_ns_block_bytes(ns);
    int rc = 0;
    if (n > 64)
        return 90;
    adv_keys(ns, family, n, keys);
    for (uint32_t i = 0; i < n; i++) {
        blocks[i] = malloc(bb);
        daemon_block_fill(&keys[i], blocks[i], bb);
    }
    if (kvc_put_prefix(ns, NULL, keys, n, (const void *const *)blocks) != (int)n)
        rc = 91;
    for (uint32_t i = 0; i < n; i++)
        memset(blocks[i], 0, bb);
    if (!rc && kvc_get_prefix(ns, keys, n, blocks) != (int)n)
        rc = 92;
    for (uint32_t i = 0; i < n && !rc; i++)
        if (daemon_block_check(&keys[i], blocks[i], bb) >= 0)
            rc = 93;
    for (uint32_t i = 0; i < n; i++)
        free(blocks[i]);
    return rc;
}

/* The victim (uid 65501): a fresh connection, its restricted namespace, 8 blocks out and
 * back. */
static int adv_victim(void *arg)
{
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    kvc_client *c;
    kvc_ns *ns;
    int rc;
    static uint32_t round;
    (void)arg;
    if ((rc = kvc_connect(adv_d.sock, &c)))
        return 80;
    if (kvc_ns_open(c, &lay, &ns)) {
        kvc_disconnect(c);
        return 81;
    }
    rc = adv_roundtrip_ns(ns, 0x7100 + round++, 8);
    kvc_disconnect(c);
    return rc;
}

static void adv_victim_served(void)
{
    ck_assert_int_eq(adv_run(ADV_VICTIM, adv_victim, NULL), 0);
}

/* ---- raw requests ----------------------------------------------------------------------- */

/* One request through a connected client's buffers (libkvc's transport): the reply status;
 * *rep and *rlen the payload. */
static int adv_call(kvc_client *c, uint16_t op, const void *body, uint32_t len, int *fd,
                    const void **rep, uint32_t *rlen)
{
    int rc;
    pthread_mutex_lock(&c->mu);
    memcpy(kvci_req(c), body, len);
    rc = kvci_call(c, op, len, fd);
    if (rep)
        *rep = kvci_rep(c, rlen);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- duplicate keys -------------------------------------------------------------------------- */

static int adv_dup_attacker(void *arg)
{
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    static struct kvc_key keys[KVC_PROTO_MAX_KEYS], dup[KVC_PROTO_MAX_KEYS];
    static float scores[KVC_PROTO_MAX_KEYS];
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    kvc_resv *r;
    size_t pos[4];
    struct kvc_budget b = {.budget = 4};
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 10;
    if (adv_roundtrip_ns(ns, 1, 4))
        return 11;
    adv_keys(ns, 1, 4, keys);
    for (uint32_t i = 0; i < KVC_PROTO_MAX_KEYS; i++)
        dup[i] = keys[0]; /* one cached block, 2048 times: 2048 pins by one message */
    if (kvc_lookup(ns, dup, KVC_PROTO_MAX_KEYS, 0, &l) != -EINVAL)
        return 12;
    if (kvc_reserve(ns, NULL, dup, KVC_PROTO_MAX_KEYS, &r) != -EINVAL)
        return 13;
    if (kvc_lookup_budget(ns, dup, 64, &b, pos, NULL, &l) != -EINVAL)
        return 14;
    if (kvc_hint(ns, KVC_HINT_ATTENTION, dup, scores, 64) != -EINVAL)
        return 15;
    dup[1] = keys[1];
    dup[2] = keys[0]; /* a repeat further in */
    if (kvc_lookup(ns, dup, 3, 0, &l) != -EINVAL)
        return 16;
    /* The distinct chain is served as ever on the same connection. */
    if (kvc_lookup(ns, keys, 4, 0, &l) != 4 || kvc_release(l))
        return 17;
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_duplicate_keys)
{
    adv_start(NULL);
    ck_assert_int_eq(adv_run(ADV_ATTACKER, adv_dup_attacker, NULL), 0);
    adv_victim_served();
    ck_assert_uint_ge(adv_stat("refused_duplicates"), 5);
    ck_assert_int_ge(daemon_log_count(&adv_d, "a key repeated within the batch"), 5);
    adv_check_clean();
}
END_TEST

/* ---- pins and leases ---------------------------------------------------------------------- */

#define ADV_CHAIN 64

struct adv_flood {
    struct adv_sync sync;
    int pins_refused, leases_refused, conn_refused;
};

/* Opens up to 4 connections and pins all it can (chains of 64 blocks), then single-block
 * leases, holding everything while the parent runs the victim. Reports through the pipe:
 * 'h' holding; the exit status says what was refused. */
static int adv_flood_attacker(void *arg)
{
    struct adv_flood *f = arg;
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    kvc_client *c[4];
    kvc_ns *ns[4];
    struct kvc_key keys[ADV_CHAIN];
    int edquot = 0, emfile = 0;
    uint64_t pins = 0;
    for (int k = 0; k < 4; k++)
        if (kvc_connect(adv_d.sock, &c[k]) || kvc_ns_open(c[k], &lay, &ns[k]))
            return 20;
    /* A chain of 64 cached blocks. */
    {
        static uint8_t blk[ADV_CHAIN][16384];
        const void *p[ADV_CHAIN];
        adv_keys(ns[0], 2, ADV_CHAIN, keys);
        for (int i = 0; i < ADV_CHAIN; i++)
            p[i] = blk[i];
        if (kvc_put_prefix(ns[0], NULL, keys, ADV_CHAIN, p) != ADV_CHAIN)
            return 21;
    }
    /* Pin floods: the whole chain again and again on every connection. */
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 1000; i++) {
            kvc_lease *l;
            int rc = kvc_lookup(ns[k], keys, ADV_CHAIN, 0, &l);
            if (rc == -EDQUOT) {
                edquot++;
                break;
            }
            if (rc == -EMFILE) {
                emfile++;
                break;
            }
            if (rc <= 0)
                return 22;
            pins += (uint64_t)rc;
        }
    /* quota.uid_pins = 512 over every connection, quota.client_pins = 256 each. */
    if (pins != 512 || edquot != 4)
        return 23;
    adv_signal(f->sync.up[1], 'h');
    if (adv_await(f->sync.down[0]) != 'g')
        return 24;
    for (int k = 0; k < 4; k++)
        kvc_disconnect(c[k]);
    /* Lease floods: one block a lease. server.max_leases = 32 per connection, quota.uid_leases
     * = 48 per uid. */
    for (int k = 0; k < 4; k++)
        if (kvc_connect(adv_d.sock, &c[k]) || kvc_ns_open(c[k], &lay, &ns[k]))
            return 25;
    int leases = 0;
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 1000; i++) {
            kvc_lease *l;
            int rc = kvc_lookup(ns[k], keys, 1, 0, &l);
            if (rc == -EMFILE) {
                emfile++;
                break;
            }
            if (rc != 1)
                return 26;
            leases++;
        }
    if (leases != 48 || emfile != 4)
        return 27;
    adv_signal(f->sync.up[1], 'h');
    if (adv_await(f->sync.down[0]) != 'g')
        return 28;
    return 0; /* exits holding everything: the daemon takes it all back */
}

START_TEST(test_pin_and_lease_flood)
{
    static const char *const extra[] = {
        "-o", "quota.client_pins=256", "-o", "quota.uid_pins=512", "-o", "server.max_leases=32",
        "-o", "quota.uid_leases=48", NULL};
    struct adv_flood f;
    adv_start(extra);
    adv_sync_init(&f.sync);
    pid_t a = adv_spawn(ADV_ATTACKER, adv_flood_attacker, &f);
    ck_assert_int_eq(adv_await(f.sync.up[0]), 'h');
    ck_assert_uint_eq(adv_stat("pins_now"), 512);
    adv_victim_served(); /* its pins are its own uid's */
    ck_assert_uint_ge(adv_stat("refused_pins"), 4);
    adv_signal(f.sync.down[1], 'g');
    ck_assert_int_eq(adv_await(f.sync.up[0]), 'h');
    ck_assert_uint_eq(adv_stat("pins_now"), 48);
    adv_victim_served();
    ck_assert_uint_ge(adv_stat("refused_leases"), 4);
    adv_signal(f.sync.down[1], 'g');
    ck_assert_int_eq(daemon_child_wait(a, 30000, NULL), 0);
    adv_sync_fini(&f.sync);
    ck_assert_int_ge(daemon_log_count(&adv_d, "quota.uid_pins reached"), 1);
    ck_assert_int_ge(daemon_log_count(&adv_d, "quota.uid_leases reached"), 1);
    adv_check_clean();
}
END_TEST

/* ---- connections ------------------------------------------------------------------------- */

static int adv_conn_attacker(void *arg)
{
    struct adv_sync *s = arg;
    kvc_client *c[64];
    int n = 0, rc = 0;
    while (n < 64 && (rc = kvc_connect(adv_d.sock, &c[n])) == 0)
        n++;
    if (n != 8 || rc != -EUSERS)
        return 30 + (n != 8);
    adv_signal(s->up[1], 'h');
    if (adv_await(s->down[0]) != 'g')
        return 33;
    /* One goes: one more comes in. */
    kvc_disconnect(c[--n]);
    adv_msleep(50);
    if (kvc_connect(adv_d.sock, &c[n]))
        return 34;
    n++;
    for (int i = 0; i < n; i++)
        kvc_disconnect(c[i]);
    return 0;
}

START_TEST(test_connection_flood)
{
    static const char *const extra[] = {"-o", "server.max_clients_per_uid=8", NULL};
    struct adv_sync s;
    adv_start(extra);
    adv_sync_init(&s);
    pid_t a = adv_spawn(ADV_ATTACKER, adv_conn_attacker, &s);
    ck_assert_int_eq(adv_await(s.up[0]), 'h');
    adv_victim_served();
    ck_assert_int_eq(daemon_roundtrip(&adv_d), 0); /* the admin too */
    ck_assert_uint_ge(adv_stat("refused_connections"), 1);
    ck_assert_int_ge(daemon_log_count(&adv_d, "max_clients_per_uid 8 reached"), 1);
    adv_signal(s.down[1], 'g');
    ck_assert_int_eq(daemon_child_wait(a, 30000, NULL), 0);
    adv_sync_fini(&s);
    adv_check_clean();
}
END_TEST

/* Idle: sockets that never say HELLO, then clients that say it and fall silent. */
static int adv_idle_attacker(void *arg)
{
    struct adv_sync *s = arg;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fds[8];
    kvc_client *c[8];
    snprintf(a.sun_path, sizeof(a.sun_path), "%.107s", adv_d.sock);
    for (int i = 0; i < 8; i++) {
        fds[i] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&a, sizeof(a)))
            return 40;
    }
    adv_signal(s->up[1], 'h');
    if (adv_await(s->down[0]) != 'g')
        return 41;
    /* Closed by now (server.hello_timeout), each with a notice saying why. */
    for (int i = 0; i < 8; i++) {
        struct kvc_msg_hdr h;
        ssize_t n = recv(fds[i], &h, sizeof(h), MSG_DONTWAIT);
        if (n != (ssize_t)sizeof(h) || h.req_id != 0 || h.status != -ETIMEDOUT)
            return 42;
        if (recv(fds[i], &h, sizeof(h), MSG_DONTWAIT) != 0) /* then the end */
            return 43;
        close(fds[i]);
    }
    for (int i = 0; i < 8; i++)
        if (kvc_connect(adv_d.sock, &c[i]))
            return 44;
    adv_signal(s->up[1], 'i');
    if (adv_await(s->down[0]) != 'g')
        return 45;
    /* Closed for idleness: the next call says so. */
    for (int i = 0; i < 8; i++) {
        struct kvc_stat *st;
        size_t n;
        if (kvc_stats(c[i], 0, &st, &n) != -ETIMEDOUT)
            return 46;
        kvc_disconnect(c[i]);
    }
    return 0;
}

START_TEST(test_idle_connections)
{
    static const char *const extra[] = {"-o", "server.max_clients_per_uid=8",
                                        "-o", "server.hello_timeout=200ms",
                                        "-o", "server.idle_timeout=1500ms", NULL};
    struct adv_sync s;
    adv_start(extra);
    adv_sync_init(&s);
    pid_t a = adv_spawn(ADV_ATTACKER, adv_idle_attacker, &s);
    ck_assert_int_eq(adv_await(s.up[0]), 'h');
    adv_victim_served();
    for (int i = 0; i < 300 && adv_stat("closed_hello_timeout") < 8; i++)
        adv_msleep(10);
    ck_assert_uint_eq(adv_stat("closed_hello_timeout"), 8);
    adv_signal(s.down[1], 'g');
    ck_assert_int_eq(adv_await(s.up[0]), 'i');
    for (int i = 0; i < 400 && adv_stat("closed_idle") < 8; i++) {
        adv_victim_served(); /* busy clients are never idle */
        adv_msleep(10);
    }
    ck_assert_uint_ge(adv_stat("closed_idle"), 8);
    adv_signal(s.down[1], 'g');
    ck_assert_int_eq(daemon_child_wait(a, 30000, NULL), 0);
    adv_sync_fini(&s);
    ck_assert_int_ge(daemon_log_count(&adv_d, "no HELLO within server.hello_timeout"), 8);
    adv_check_clean();
}
END_TEST

/* ---- reservations -------------------------------------------------------------------------- */

static int adv_hoard_attacker(void *arg)
{
    struct adv_sync *s = arg;
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    static struct kvc_key keys[KVC_PROTO_MAX_KEYS];
    kvc_client *c, *c2;
    kvc_ns *ns, *ns2;
    kvc_resv *r, *r2;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 50;
    adv_keys(ns, 3, KVC_PROTO_MAX_KEYS, keys); /* 32 MiB: the whole shared arena */
    int n = kvc_reserve(ns, NULL, keys, KVC_PROTO_MAX_KEYS, &r);
    /* quota.uid_reserved_share = 25: a quarter of 32 MiB is 512 blocks of 16 KiB */
    if (n != 512 || kvc_resv_status(r, 512) != KVC_SLOT_NOSPACE)
        return 51;
    if (kvc_connect(adv_d.sock, &c2) || kvc_ns_open(c2, &lay, &ns2))
        return 52;
    adv_keys(ns2, 4, 16, keys);
    if (kvc_reserve(ns2, NULL, keys, 16, &r2) != -EDQUOT) /* the uid's share, not the conn's */
        return 53;
    adv_signal(s->up[1], 'h');
    if (adv_await(s->down[0]) != 'g')
        return 54;
    /* server.reservation_timeout passed: the daemon aborted it. */
    if (kvc_commit(r, SIZE_MAX) != -ETIMEDOUT)
        return 55;
    if (adv_roundtrip_ns(ns, 5, 4)) /* the connection itself is fine */
        return 56;
    kvc_disconnect(c2);
    kvc_disconnect(c);
    return 0;
}

/* Another user of the shared arena (no access lists) puts and gets while the attacker
 * hoards. */
static int adv_bystander(void *arg)
{
    struct kvc_layout lay = daemon_layout("bystander-model", ADV_BT);
    kvc_client *c;
    kvc_ns *ns;
    int rc;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 60;
    rc = adv_roundtrip_ns(ns, 6, 64);
    kvc_disconnect(c);
    return rc;
}

START_TEST(test_reservation_hoarding)
{
    static const char *const extra[] = {"-o", "quota.uid_reserved_share=25",
                                        "-o", "server.reservation_timeout=1s", NULL};
    struct adv_sync s;
    adv_start(extra);
    adv_sync_init(&s);
    pid_t a = adv_spawn(ADV_ATTACKER, adv_hoard_attacker, &s);
    ck_assert_int_eq(adv_await(s.up[0]), 'h');
    ck_assert_uint_eq(adv_stat("reserved_now"), 512);
    ck_assert_int_eq(adv_run(ADV_READER, adv_bystander, NULL), 0);
    adv_victim_served();
    ck_assert_uint_ge(adv_stat("refused_reserve_share"), 2);
    /* The reservation expires while its client stays connected. */
    for (int i = 0; i < 400 && adv_stat("reserved_now"); i++)
        adv_msleep(10);
    ck_assert_uint_eq(adv_stat("reserved_now"), 0);
    ck_assert_uint_eq(adv_stat("expired_reservations"), 1);
    adv_signal(s.down[1], 'g');
    ck_assert_int_eq(daemon_child_wait(a, 30000, NULL), 0);
    adv_sync_fini(&s);
    ck_assert_int_ge(daemon_log_count(&adv_d, "aborted after server.reservation_timeout"), 1);
    adv_check_clean();
}
END_TEST

/* ---- namespaces ------------------------------------------------------------------------------ */

static int adv_ns_attacker(void *arg)
{
    struct adv_sync *s = arg;
    kvc_client *c;
    kvc_ns *ns[8];
    char name[32];
    int n = 0, rc = 0;
    kvc_lease *l;
    struct kvc_key k;
    uint64_t dropped;
    if (kvc_connect(adv_d.sock, &c))
        return 70;
    for (; n < 8; n++) {
        struct kvc_layout lay;
        snprintf(name, sizeof(name), "flood-%d", n);
        lay = daemon_layout(name, ADV_BT);
        if ((rc = kvc_ns_open(c, &lay, &ns[n])))
            break;
    }
    if (n != 4 || rc != -EDQUOT)
        return 71;
    if (kvc_ns_drop(c, kvc_ns_id(ns[0]), &dropped) != -EPERM) /* admins only */
        return 72;
    adv_signal(s->up[1], 'h');
    if (adv_await(s->down[0]) != 'g')
        return 73;
    /* flood-0 was dropped by an admin: its id is gone for this client, one more fits. */
    adv_keys(ns[0], 7, 1, &k);
    if (kvc_lookup(ns[0], &k, 1, 0, &l) != -ENOENT)
        return 74;
    struct kvc_layout lay = daemon_layout("flood-new", ADV_BT);
    if (kvc_ns_open(c, &lay, &ns[4]))
        return 75;
    kvc_disconnect(c);
    return 0;
}

/* The victim holds a lease on its namespace until told to let go. */
static int adv_victim_holding(void *arg)
{
    struct adv_sync *s = arg;
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    struct kvc_key keys[4];
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 76;
    if (adv_roundtrip_ns(ns, 8, 4))
        return 77;
    adv_keys(ns, 8, 4, keys);
    if (kvc_lookup(ns, keys, 4, 0, &l) != 4)
        return 78;
    adv_signal(s->up[1], 'h');
    if (adv_await(s->down[0]) != 'g')
        return 79;
    kvc_release(l);
    kvc_disconnect(c);
    return 0;
}

/* The id of model `name`, from kvcctl ns --json as the admin sees it. */
static uint32_t adv_ns_id(const char *name)
{
    static char out[65536];
    char needle[96];
    ck_assert_int_eq(daemon_kvcctl(&adv_d, out, sizeof(out), NULL, 0, "--json", "ns", NULL), 0);
    snprintf(needle, sizeof(needle), "\"model\": \"%s\"", name);
    char *at = strstr(out, needle);
    ck_assert_msg(at != NULL, "%s not in %s", name, out);
    while (at > out && strncmp(at, "{\"id\": ", 7) != 0)
        at--;
    return (uint32_t)strtoul(at + 7, NULL, 10);
}

START_TEST(test_namespace_flood)
{
    static const char *const extra[] = {"-o", "server.max_namespaces_per_uid=4", NULL};
    struct adv_sync s, v;
    char id[16], out[4096], err[4096];
    adv_start(extra);
    adv_sync_init(&s);
    adv_sync_init(&v);
    pid_t a = adv_spawn(ADV_ATTACKER, adv_ns_attacker, &s);
    ck_assert_int_eq(adv_await(s.up[0]), 'h');
    adv_victim_served(); /* its namespace is its uid's */
    ck_assert_uint_ge(adv_stat("refused_namespaces"), 1);
    /* The admin drops one of the attacker's. */
    snprintf(id, sizeof(id), "%u", adv_ns_id("flood-0"));
    ck_assert_int_eq(daemon_kvcctl(&adv_d, out, sizeof(out), err, sizeof(err), "ns", "drop", id,
                                   NULL),
                     0);
    ck_assert_msg(strstr(out, "dropped"), "%s", out);
    adv_signal(s.down[1], 'g');
    ck_assert_int_eq(daemon_child_wait(a, 30000, NULL), 0);
    /* A namespace with a lease on it stays. */
    pid_t b = adv_spawn(ADV_VICTIM, adv_victim_holding, &v);
    ck_assert_int_eq(adv_await(v.up[0]), 'h');
    snprintf(id, sizeof(id), "%u", adv_ns_id("victim-model"));
    ck_assert_int_eq(daemon_kvcctl(&adv_d, out, sizeof(out), err, sizeof(err), "ns", "drop", id,
                                   NULL),
                     1);
    ck_assert_msg(strstr(err, "in use"), "%s", err);
    adv_signal(v.down[1], 'g');
    ck_assert_int_eq(daemon_child_wait(b, 30000, NULL), 0);
    ck_assert_int_eq(daemon_kvcctl(&adv_d, out, sizeof(out), err, sizeof(err), "ns", "drop", id,
                                   NULL),
                     0);
    ck_assert_uint_eq(adv_stat("dropped_namespaces"), 2);
    adv_victim_served(); /* it creates it again */
    adv_sync_fini(&s);
    adv_sync_fini(&v);
    adv_check_clean();
}
END_TEST

/* ---- names ------------------------------------------------------------------------------------- */

/* The attacker looks for the victim's model id and counters in every inspection request. */
static int adv_names_attacker(void *arg)
{
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    kvc_client *c;
    kvc_ns *ns;
    char *text = NULL, pol[8192];
    struct kvc_client_info *ci;
    struct kvc_ns_info *nsi;
    size_t n;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 100;
    if (kvc_metrics(c, &text))
        return 101;
    if (strstr(text, "victim-model") || strstr(text, "uid=\"65501\"") ||
        !strstr(text, "attacker-model") || !strstr(text, "kvcd_lookups_total"))
        return 102;
    free(text);
    if (kvc_clients(c, &ci, &n) || n != 1 || ci[0].uid != ADV_ATTACKER || !ci[0].self)
        return 103;
    free(ci);
    if (kvc_policy_get(c, 0, pol, sizeof(pol)) || strstr(pol, "victim-model") ||
        !strstr(pol, "attacker-model"))
        return 104;
    if (kvc_ns_list(c, &nsi, &n))
        return 105;
    for (size_t i = 0; i < n; i++)
        if (strstr(nsi[i].model_id, "victim"))
            return 106;
    free(nsi);
    /* By id: every namespace the attacker cannot see is refused, none is shown. */
    int refused = 0;
    for (uint32_t id = 1; id < 8; id++) {
        struct kvc_stat *st;
        int rc = kvc_policy_get(c, id, pol, sizeof(pol));
        if (rc == -EACCES)
            refused++;
        else if (rc == 0 && id != kvc_ns_id(ns))
            return 107;
        rc = kvc_stats(c, id, &st, &n);
        if (rc == 0) {
            free(st);
            if (id != kvc_ns_id(ns))
                return 108;
        }
    }
    if (refused != 1)
        return 109;
    kvc_disconnect(c);
    return 0;
}

/* A reader of the victim's lists sees its namespace (the filter is the access check). */
static int adv_names_reader(void *arg)
{
    kvc_client *c;
    char *text = NULL;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_metrics(c, &text))
        return 110;
    int rc = strstr(text, "namespace=\"victim-model\"") ? 0 : 111;
    free(text);
    kvc_disconnect(c);
    return rc;
}

START_TEST(test_names_leak)
{
    struct adv_sync v;
    char out[1 << 16];
    adv_start(NULL);
    adv_sync_init(&v);
    pid_t b = adv_spawn(ADV_VICTIM, adv_victim_holding, &v); /* connected, a lease held */
    ck_assert_int_eq(adv_await(v.up[0]), 'h');
    ck_assert_int_eq(adv_run(ADV_ATTACKER, adv_names_attacker, NULL), 0);
    ck_assert_int_eq(adv_run(ADV_READER, adv_names_reader, NULL), 0);
    /* The admin sees everything. */
    ck_assert_int_eq(daemon_kvcctl(&adv_d, out, sizeof(out), NULL, 0, "metrics", NULL), 0);
    ck_assert(strstr(out, "namespace=\"victim-model\"") && strstr(out, "uid=\"65501\""));
    adv_signal(v.down[1], 'g');
    ck_assert_int_eq(daemon_child_wait(b, 30000, NULL), 0);
    adv_sync_fini(&v);
    adv_check_clean();
}
END_TEST

/* ---- holes ------------------------------------------------------------------------------------ */

/* Huge pages free here, in bytes (0: none reserved). */
static uint64_t adv_huge_free(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    unsigned long long nfree = 0, kb = 0;
    char line[128];
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f)) {
        sscanf(line, "HugePages_Free: %llu", &nfree);
        sscanf(line, "Hugepagesize: %llu kB", &kb);
    }
    fclose(f);
    return (uint64_t)nfree * kb * 1024;
}

/* The attacker takes the shared arena's read-write descriptor and punches holes in all of it,
 * both ways, over and over, while the bystander keeps putting; with huge pages it also takes
 * every free huge page, so that the daemon's next touch of a hole cannot be filled. */
static int adv_hole_attacker(void *arg)
{
    struct adv_sync *s = arg;
    struct kvc_ns_open_req q;
    const struct kvc_ns_open_rep *p;
    const void *rep;
    uint32_t len;
    kvc_client *c;
    int fd = -1;
    memset(&q, 0, sizeof(q));
    q.layout = (struct kvc_wire_layout){.layers = 2, .kv_heads = 2, .head_dim = 64,
                                        .block_tokens = ADV_BT, .dtype = KVC_WIRE_DTYPE_FP16,
                                        .kv_kind = KVC_WIRE_KV_KIND_KV};
    snprintf(q.layout.model_id, sizeof(q.layout.model_id), "attacker-model");
    if (kvc_connect(adv_d.sock, &c))
        return 120;
    if (adv_call(c, KVC_OP_NS_OPEN, &q, sizeof(q), &fd, &rep, &len) || fd < 0)
        return 121;
    p = rep;
    if (!(p->access & KVC_ACCESS_WRITE) || p->arena_id != 0)
        return 122;
    size_t size = p->arena_bytes;
    char *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return 123;
    if (adv_huge_free()) /* take the huge pages a hole would need */
        for (int i = 0; i < 4096; i++)
            if (mmap(NULL, 2u << 20, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE, -1, 0) ==
                MAP_FAILED)
                break;
    adv_signal(s->up[1], 'h');
    for (int round = 0; round < 200; round++) {
        if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)size))
            return 125;
        if (madvise(m, size, MADV_REMOVE))
            return 126;
        adv_msleep(5);
    }
    adv_signal(s->up[1], 'd');
    if (adv_await(s->down[0]) != 'g')
        return 127;
    kvc_disconnect(c);
    return 0;
}

/* The bystander's puts into the shared arena while holes are punched under them: every
 * request answered (the bytes are the attacker's to spoil, as any writer of that arena can).
 * On hugetlb with every free huge page taken, mapping the arena fails (ENOMEM: the kernel
 * reserves huge pages for a shared mapping): the one answer allowed besides success. */
#define ADV_HOLE_NOMAP 2 /* the bystander's exit status when it could not map the arena */
static int adv_hole_bystander(void *arg)
{
    const bool *huge = arg;
    struct kvc_layout lay = daemon_layout("bystander-model", ADV_BT);
    static uint8_t blk[64][16384];
    const void *ptrs[64];
    struct kvc_key keys[64];
    kvc_client *c;
    kvc_ns *ns;
    int rc = kvc_connect(adv_d.sock, &c);
    if (rc) {
        fprintf(stderr, "e2e_adversary: bystander: connect: %s\n", strerror(-rc));
        return 130;
    }
    if ((rc = kvc_ns_open(c, &lay, &ns))) {
        printf("e2e_adversary: holes: bystander's ns_open: %s\n", strerror(-rc));
        fflush(stdout);
        kvc_disconnect(c);
        return *huge && rc == -ENOMEM ? ADV_HOLE_NOMAP : 133;
    }
    for (int i = 0; i < 64; i++)
        ptrs[i] = blk[i];
    uint64_t put = 0, got = 0;
    for (uint32_t round = 0; round < 64; round++) { /* twice the arena: demotions */
        adv_keys(ns, 0x900 + round, 64, keys);
        if ((rc = kvc_put_prefix(ns, NULL, keys, 64, ptrs)) < 0)
            return 131;
        put += (uint64_t)rc;
        if ((rc = kvc_get_prefix(ns, keys, 64, (void *const *)ptrs)) < 0)
            return 132;
        got += (uint64_t)rc;
    }
    printf("e2e_adversary: holes (%s pages): the bystander put %llu blocks, got %llu back\n",
           *huge ? "huge" : "normal", (unsigned long long)put, (unsigned long long)got);
    fflush(stdout);
    kvc_disconnect(c);
    return 0;
}

static void adv_hole_case(bool huge)
{
    char disk[DAEMON_PATH_MAX + 32], diskopt[DAEMON_PATH_MAX + 64];
    const char *extra[] = {"-o", diskopt, "-o", "disk.capacity=64m", "-o", "disk.page=1m",
                           "-o", huge ? "host.hugepages=on" : "host.hugepages=off", NULL};
    struct adv_sync s;
    ck_assert_int_eq(daemon_dir_init(&adv_d), 0);
    snprintf(disk, sizeof(disk), "%s/disk", adv_d.dir);
    snprintf(diskopt, sizeof(diskopt), "disk.path=%s", disk);
    adv_start(extra);
    adv_sync_init(&s);
    pid_t a = adv_spawn(ADV_ATTACKER, adv_hole_attacker, &s);
    ck_assert_int_eq(adv_await(s.up[0]), 'h');
    /* While the holes come: another user of the shared arena, whose blocks the daemon moves
     * to disk (reading the arena), and the victim in its own arena, byte for byte. */
    pid_t b = adv_spawn(ADV_READER, adv_hole_bystander, &huge);
    for (int i = 0; i < 5; i++)
        adv_victim_served();
    int sig, brc = daemon_child_wait(b, 60000, &sig);
    /* On hugetlb, a touch of a hole with no huge page free kills the toucher (SIGBUS): the
     * bystander shares the attacker's arena (docs/security.md). Never the daemon. */
    ck_assert_msg(brc == 0 || (huge && (brc == ADV_HOLE_NOMAP || (brc == -1 && sig == SIGBUS))),
                  "bystander: %d, signal %d", brc, sig);
    printf("e2e_adversary: holes (%s pages): the shared arena's other client %s\n",
           huge ? "huge" : "normal",
           brc == 0 ? "was served" : brc == ADV_HOLE_NOMAP ? "could not map it (ENOMEM)"
                                                           : "died of SIGBUS");
    ck_assert_int_eq(adv_await(s.up[0]), 'd');
    ck_assert(daemon_alive(&adv_d));
    adv_signal(s.down[1], 'g');
    ck_assert_int_eq(daemon_child_wait(a, 30000, NULL), 0);
    adv_sync_fini(&s);
    printf("e2e_adversary: holes (%s pages): %llu arena faults survived, %llu blocks demoted\n",
           huge ? "huge" : "normal", (unsigned long long)adv_stat("arena_faults"),
           (unsigned long long)adv_stat("demoted_blocks"));
    adv_victim_served();
    adv_check_clean();
}

START_TEST(test_hole_punch)
{
    adv_hole_case(false);
}
END_TEST

START_TEST(test_hole_punch_hugetlb)
{
    adv_hole_case(true);
}
END_TEST

/* ---- the server in this process: the GPU pool (fake device) and WAITs ------------------------ */

struct adv_ip {
    struct config *cfg;
    struct loop *l;
    struct store *s;
    struct acl *acl;
    struct server *sv;
    pid_t child;
    int status;
    int ctl[2]; /* a child asks the server side for something: see adv_ip_on_ctl */
    int ack[2]; /* and hears back 'k' */
};

static struct adv_ip ip;

static void adv_ip_tick(void *arg)
{
    struct adv_ip *x = arg;
    int st;
    server_tick(x->sv);
    if (x->child > 0 && waitpid(x->child, &st, WNOHANG) == x->child) {
        x->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        x->child = 0;
    }
    if (x->child == 0 && server_clients(x->sv) == 0) /* its connections are closed too */
        loop_stop(x->l);
}

/* 'p': flag every committed block as being read from disk (its WAITs then wait); 'r': the
 * reads are done (flags cleared, waiting WAITs answered). The reply byte is 'k'. */
static void adv_ip_on_ctl(struct loop *l, int fd, uint32_t events, void *arg)
{
    struct adv_ip *x = arg;
    char v;
    (void)l;
    (void)events;
    if (read(fd, &v, 1) != 1)
        return;
    for (uint32_t i = 0; i < x->s->ix.nblocks; i++) {
        struct block *b = &x->s->ix.blocks[i];
        if (b->state != BLOCK_STATE_COMMITTED)
            continue;
        if (v == 'p')
            b->flags |= BLOCK_F_PROMOTING;
        else
            b->flags &= (uint8_t)~BLOCK_F_PROMOTING;
    }
    if (v == 'r' && x->s->on_ready)
        x->s->on_ready(x->s->on_ready_arg);
    adv_signal(x->ack[1], 'k');
}

static void adv_ip_start(uint64_t gpu_size)
{
    struct store_params sp = {.host_size = 16 << 20,
                              .host_page_size = 64 << 10,
                              .host_huge = 0,
                              .high_watermark = 0.95,
                              .low_watermark = 0.9,
                              .max_namespaces = 16,
                              .max_handles = 64,
                              .policy = POLICY_LRU,
                              .gpu_size = gpu_size,
                              .gpu_device = 0,
                              .gpu_page_size = 64 << 10,
                              .gpu_ops = &fake_dev_ops};
    char err[256];
    int rc = 0;
    memset(&ip, 0, sizeof(ip));
    log_setup(LOG_LEVEL_WARNING, 1000); /* the refusals' lines only */
    adv_dir_open();
    ip.cfg = config_new();
    ck_assert_int_eq(config_ns_set(ip.cfg, "victim*", "read", "65503", err, sizeof(err)), 0);
    ck_assert_int_eq(config_ns_set(ip.cfg, "victim*", "write", "65501", err, sizeof(err)), 0);
    ck_assert_int_eq(config_ns_set(ip.cfg, "victim*", "host_size", "4m", err, sizeof(err)), 0);
    fake_dev_reset(1);
    ip.s = store_new(&sp, &rc);
    ck_assert_msg(ip.s, "store_new: %d", rc);
    engine_attach(ip.s);
    ck_assert(gpu_size == 0 || ip.s->gpu);
    ip.acl = acl_new(ip.s, ip.cfg, &rc);
    ck_assert_ptr_nonnull(ip.acl);
    ip.l = loop_new(&rc);
    ck_assert_ptr_nonnull(ip.l);
    struct server_params vp;
    daemon_server_params(&vp, adv_d.sock, 0666, 64, ip.cfg, ip.acl);
    ip.sv = server_new(ip.l, ip.s, &vp, &rc);
    ck_assert_msg(ip.sv, "server_new: %d", rc);
    ck_assert_int_eq(pipe(ip.ctl), 0);
    ck_assert_int_eq(pipe(ip.ack), 0);
}

/* Runs fn as uid in a child while this process serves it. */
static int adv_ip_run(uint32_t uid, int (*fn)(void *), void *arg)
{
    ip.child = adv_spawn(uid, fn, arg);
    ip.status = -1;
    loop_run(ip.l, 20, adv_ip_tick, &ip);
    return ip.status;
}

static void adv_ip_stop(void)
{
    ck_assert_uint_eq(ip.s->pins_now, 0);
    ck_assert_uint_eq(ip.s->reserved_now, 0);
    server_free(ip.sv);
    acl_free(ip.acl);
    engine_stop(ip.s);
    store_free(ip.s);
    loop_free(ip.l);
    config_free(ip.cfg);
    close(ip.ctl[0]);
    close(ip.ctl[1]);
    close(ip.ack[0]);
    close(ip.ack[1]);
    ck_assert_int_eq(fake_dev.pools_live, 0);
    daemon_cleanup(&adv_d);
}

static int adv_gpu_attach(kvc_client *c, uint32_t flags, int *fd)
{
    struct kvc_gpu_attach_req q = {.flags = flags};
    int rc = adv_call(c, KVC_OP_GPU_ATTACH, &q, sizeof(q), fd, NULL, NULL);
    if (fd && *fd >= 0)
        close(*fd);
    return rc;
}

/* RESERVE (GPU flag) of n keys of ns; *tier the tier of the first slot. Commits. */
static int adv_gpu_reserve(kvc_client *c, kvc_ns *ns, uint32_t family, uint32_t n, int *tier)
{
    static uint8_t req[sizeof(struct kvc_reserve_req) + 64 * sizeof(struct kvc_wire_key)];
    struct kvc_reserve_req *q = (struct kvc_reserve_req *)req;
    struct kvc_key keys[64];
    const void *rep;
    uint32_t len;
    adv_keys_shared(ns, family, n, keys);
    memset(req, 0, sizeof(req));
    q->ns_id = kvc_ns_id(ns);
    q->flags = KVC_RESERVE_F_GPU;
    q->nkeys = n;
    memcpy(q + 1, keys, n * sizeof(keys[0]));
    int rc = adv_call(c, KVC_OP_RESERVE, req, (uint32_t)(sizeof(*q) + n * sizeof(keys[0])), NULL,
                      &rep, &len);
    if (rc)
        return rc;
    const struct kvc_reserve_rep *p = rep;
    const struct kvc_wire_slot_rep *sl = (const struct kvc_wire_slot_rep *)(p + 1);
    if (p->nreserved != n)
        return -EIO;
    *tier = sl[0].loc.tier;
    struct kvc_commit_req cq = {.resv_id = p->resv_id, .ncommit = UINT32_MAX};
    return adv_call(c, KVC_OP_COMMIT, &cq, sizeof(cq), NULL, NULL, NULL);
}

/* LOOKUP (GPU flag) of the chain; *tier of the first hit. Releases. */
static int adv_gpu_lookup(kvc_client *c, kvc_ns *ns, uint32_t family, uint32_t n, int *tier)
{
    static uint8_t req[sizeof(struct kvc_lookup_req) + 64 * sizeof(struct kvc_wire_key)];
    struct kvc_lookup_req *q = (struct kvc_lookup_req *)req;
    struct kvc_key keys[64];
    const void *rep;
    uint32_t len;
    adv_keys_shared(ns, family, n, keys);
    memset(req, 0, sizeof(req));
    q->ns_id = kvc_ns_id(ns);
    q->flags = KVC_LOOKUP_F_GPU;
    q->nkeys = n;
    memcpy(q + 1, keys, n * sizeof(keys[0]));
    int rc = adv_call(c, KVC_OP_LOOKUP, req, (uint32_t)(sizeof(*q) + n * sizeof(keys[0])), NULL,
                      &rep, &len);
    if (rc)
        return rc;
    const struct kvc_lookup_rep *p = rep;
    const struct kvc_wire_loc *loc = (const struct kvc_wire_loc *)(p + 1);
    if (p->nhit != n)
        return -EIO;
    *tier = loc[0].tier;
    uint8_t rel[sizeof(struct kvc_release_req) + 8];
    struct kvc_release_req *rq = (struct kvc_release_req *)rel;
    *rq = (struct kvc_release_req){.nleases = 1};
    memcpy(rq + 1, &p->lease_id, 8);
    return adv_call(c, KVC_OP_RELEASE, rel, sizeof(rel), NULL, NULL, NULL);
}

static uint64_t adv_client_stat(kvc_client *c, const char *name)
{
    uint64_t v = UINT64_MAX;
    daemon_client_stat(c, 0, name, &v);
    return v;
}

/* The victim: its restricted namespace never enters the pool, even when it asks; an open
 * namespace of its own does (the pool works). */
static int adv_gpu_victim(void *arg)
{
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    struct kvc_layout open_lay = daemon_layout("open-victim", ADV_BT);
    kvc_client *c;
    kvc_ns *ns, *ons;
    int fd = -1, tier = 0;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 140;
    if (adv_gpu_attach(c, 0, &fd) != -EACCES) /* holds only its private arena */
        return 141;
    if (kvc_ns_open(c, &open_lay, &ons) || adv_gpu_attach(c, 0, &fd) ||
        adv_gpu_attach(c, KVC_GPU_ATTACH_F_MAPPED, NULL))
        return 142;
    if (adv_gpu_reserve(c, ns, 1, 4, &tier) || tier != KVC_WIRE_TIER_HOST)
        return 143;
    if (adv_gpu_lookup(c, ns, 1, 4, &tier) || tier != KVC_WIRE_TIER_HOST)
        return 144;
    if (adv_client_stat(c, "gpu_used") != 0)
        return 145;
    if (adv_gpu_reserve(c, ons, 2, 4, &tier) || tier != KVC_WIRE_TIER_GPU)
        return 146;
    if (adv_client_stat(c, "gpu_used") != 4 * 16384)
        return 147;
    kvc_disconnect(c);
    return 0;
}

/* A reader of the victim's namespace asks for its blocks in the pool. */
static int adv_gpu_reader(void *arg)
{
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    struct kvc_layout open_lay = daemon_layout("reader-open", ADV_BT);
    kvc_client *c;
    kvc_ns *ns, *ons;
    int fd = -1, tier = 0;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 150;
    if (adv_gpu_attach(c, 0, &fd) != -EACCES) /* a read-only descriptor is not enough */
        return 151;
    if (kvc_ns_open(c, &open_lay, &ons) || adv_gpu_attach(c, 0, &fd) ||
        adv_gpu_attach(c, KVC_GPU_ATTACH_F_MAPPED, NULL))
        return 152;
    /* Mapped, it looks the victim's blocks up with the pool flag: host locations, and the
     * pool holds what it held (the victim's open namespace only). */
    if (adv_gpu_lookup(c, ns, 1, 4, &tier) || tier != KVC_WIRE_TIER_HOST)
        return 153;
    if (adv_client_stat(c, "gpu_used") != 4 * 16384)
        return 154;
    /* Its own open namespace does go to the pool. */
    if (adv_gpu_reserve(c, ons, 3, 2, &tier) || tier != KVC_WIRE_TIER_GPU)
        return 155;
    kvc_disconnect(c);
    return 0;
}

/* The attacker: no namespace, or only ones it cannot open: no pool. */
static int adv_gpu_attacker(void *arg)
{
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    kvc_client *c;
    kvc_ns *ns;
    int fd = -1;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c))
        return 160;
    if (adv_gpu_attach(c, 0, &fd) != -EACCES || fd >= 0)
        return 161;
    if (adv_gpu_attach(c, KVC_GPU_ATTACH_F_MAPPED, NULL) != -EACCES)
        return 162;
    if (kvc_ns_open(c, &lay, &ns) != -EACCES)
        return 163;
    if (adv_gpu_attach(c, 0, &fd) != -EACCES)
        return 164;
    /* libkvc answers "host copies" for a refused pool. */
    kvci_gpu_ops_set(&fake_dev_ops);
    fake_dev_reset(1);
    if (kvc_gpu_attach(c) != 0)
        return 165;
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_gpu_pool_access)
{
    adv_ip_start(8 << 20);
    ck_assert_int_eq(adv_ip_run(ADV_VICTIM, adv_gpu_victim, NULL), 0);
    ck_assert_int_eq(adv_ip_run(ADV_READER, adv_gpu_reader, NULL), 0);
    ck_assert_int_eq(adv_ip_run(ADV_ATTACKER, adv_gpu_attacker, NULL), 0);
    /* The pool never held a block of the restricted namespace. */
    uint32_t vid = 0;
    for (uint32_t i = 1; i < ip.s->nns; i++)
        if (ip.s->ns[i] && strcmp(ip.s->ns[i]->layout.model_id, "victim-model") == 0)
            vid = i;
    ck_assert_uint_ne(vid, 0);
    ck_assert_uint_eq(ip.s->ns[vid]->stats.gpu_promoted_blocks, 0);
    for (uint32_t i = 0; i < ip.s->ix.nblocks; i++)
        if (ip.s->ix.blocks[i].state != BLOCK_STATE_FREE && ip.s->ix.blocks[i].ns == vid)
            ck_assert_uint_ne(ip.s->ix.blocks[i].tier, KVC_WIRE_TIER_GPU);
    ck_assert_uint_ge(ip.s->total.refused_access, 5);
    adv_ip_stop();
}
END_TEST

/* WAITs: one pending per lease, server.max_waits (2 here) per connection. */
static int adv_wait_attacker(void *arg)
{
    struct adv_ip *x = arg;
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    kvc_client *c, *c2;
    kvc_ns *ns;
    kvc_lease *l[3];
    struct kvc_key keys[4];
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns) || adv_roundtrip_ns(ns, 1, 4))
        return 170;
    adv_keys(ns, 1, 4, keys);
    for (int i = 0; i < 3; i++)
        if (kvc_lookup(ns, keys, 4, 0, &l[i]) != 4)
            return 171;
    /* The server side now says every block is being read from disk. */
    adv_signal(x->ctl[1], 'p');
    if (adv_await(x->ack[0]) != 'k')
        return 172;
    /* Raw WAITs, pipelined: two wait, the third is refused, a second on a lease too. */
    struct kvc_wait_req w = {.timeout_ms = 60000};
    int sfd = c->fd;
    uint32_t ids[4];
    uint64_t lease_of[4] = {l[0]->ids[0], l[0]->ids[0], l[1]->ids[0], l[2]->ids[0]};
    for (int i = 0; i < 4; i++) {
        struct {
            struct kvc_msg_hdr h;
            struct kvc_wait_req q;
        } m = {.h = {.magic = KVC_PROTO_MAGIC,
                     .version = KVC_PROTO_VERSION,
                     .opcode = KVC_OP_WAIT,
                     .req_id = 1000u + (uint32_t)i,
                     .len = sizeof(w)},
               .q = w};
        m.q.lease_id = lease_of[i];
        ids[i] = m.h.req_id;
        if (send(sfd, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m))
            return 173;
    }
    /* Two refusals come back at once, the two WAITs stay. */
    int got[4] = {0, 0, 0, 0}, status[4] = {1, 1, 1, 1};
    for (int k = 0; k < 2; k++) {
        struct kvc_msg_hdr h;
        if (recv(sfd, &h, sizeof(h), 0) < (ssize_t)sizeof(h))
            return 174;
        for (int i = 0; i < 4; i++)
            if (h.req_id == ids[i]) {
                got[i] = 1;
                status[i] = h.status;
            }
    }
    if (!got[1] || status[1] != -EBUSY || !got[3] || status[3] != -EMFILE || got[0] || got[2])
        return 175;
    /* The reads end: both WAITs answered, every hit ready. */
    adv_signal(x->ctl[1], 'r');
    if (adv_await(x->ack[0]) != 'k')
        return 176;
    for (int k = 0; k < 2; k++) {
        struct {
            struct kvc_msg_hdr h;
            struct kvc_wait_rep p;
        } m;
        if (recv(sfd, &m, sizeof(m), 0) != (ssize_t)sizeof(m) || m.h.status != 0 ||
            (m.h.req_id != ids[0] && m.h.req_id != ids[2]) || m.p.nready != 4 || m.p.pending)
            return 177;
    }
    (void)c2;
    return 0;
}

START_TEST(test_wait_flood)
{
    adv_ip_start(0);
    loop_add(ip.l, ip.ctl[0], EPOLLIN, adv_ip_on_ctl, &ip);
    ck_assert_int_eq(adv_ip_run(ADV_ATTACKER, adv_wait_attacker, &ip), 0);
    ck_assert_uint_eq(ip.s->total.refused_waits, 2);
    /* The child left with its WAITs pending: nothing of them is left. */
    for (uint32_t i = 0; i < ip.s->ix.nblocks; i++)
        ip.s->ix.blocks[i].flags &= (uint8_t)~BLOCK_F_PROMOTING;
    loop_del(ip.l, ip.ctl[0]);
    adv_ip_stop();
}
END_TEST

/* ---- namespaces restored from disk ---------------------------------------------------------- */

/* issue 28 row 6 (docs/security.md said otherwise): a restricted namespace brought back from
 * the disk tier at start goes to its own arena, as when it was opened, so its blocks read
 * back from disk are never in arena 0, which every client maps. The victim puts a chain, the
 * daemon restarts, the victim reads it back (from disk), and the attacker, who maps arena 0
 * read-write, finds none of its bytes there. */
struct adv_rs {
    struct kvc_key keys[8]; /* the victim's chain, for the attacker to look for */
    uint64_t block_bytes;
};

static struct adv_rs *adv_rs;

static int adv_rs_victim(void *arg)
{
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    void *blocks[8];
    kvc_client *c;
    kvc_ns *ns;
    int rc = 0, want = arg ? 8 : 0;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 180;
    size_t bb = kvc_ns_block_bytes(ns);
    adv_keys_shared(ns, 0x2600, 8, adv_rs->keys);
    adv_rs->block_bytes = bb;
    for (int i = 0; i < 8; i++) {
        blocks[i] = malloc(bb);
        daemon_block_fill(&adv_rs->keys[i], blocks[i], bb);
    }
    if (!arg && kvc_put_prefix(ns, NULL, adv_rs->keys, 8, (const void *const *)blocks) != 8)
        rc = 181;
    /* Then 1.25 times its arena (16 MiB) of other chains: the first one goes to disk. */
    for (uint32_t f = 0; f < 20 && !arg && !rc; f++) {
        struct kvc_key fill[64];
        void *fb[64];
        adv_keys_shared(ns, 0x2700 + f, 64, fill);
        for (int i = 0; i < 64; i++) {
            fb[i] = malloc(bb);
            daemon_block_fill(&fill[i], fb[i], bb);
        }
        if (kvc_put_prefix(ns, NULL, fill, 64, (const void *const *)fb) != 64)
            rc = 186;
        for (int i = 0; i < 64; i++)
            free(fb[i]);
    }
    if (!rc && kvc_flush(c))
        rc = 182;
    for (int i = 0; i < 8 && arg; i++)
        memset(blocks[i], 0, bb);
    if (!rc && arg && kvc_get_prefix(ns, adv_rs->keys, 8, blocks) != want)
        rc = 183;
    for (int i = 0; i < 8 && !rc; i++)
        if (daemon_block_check(&adv_rs->keys[i], blocks[i], bb) >= 0)
            rc = 184;
    if (!rc && arg && ns->arena == 0)
        rc = 185;
    for (int i = 0; i < 8; i++)
        free(blocks[i]);
    kvc_disconnect(c);
    return rc;
}

/* Maps arena 0 (it opens a namespace without lists) and looks for the first 256 bytes of
 * each of the victim's blocks in all of it (finding its own there). */
static int adv_rs_attacker(void *arg)
{
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    uint8_t want[256];
    kvc_client *c;
    kvc_ns *ns;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns) || adv_roundtrip_ns(ns, 0x27, 4))
        return 190;
    const struct kvc_arena *a = &c->arenas[0];
    if (!a->base || !a->writable)
        return 191;
    uint8_t *blk = malloc(adv_rs->block_bytes);
    struct kvc_key own;
    adv_keys(ns, 0x27, 1, &own); /* the scan finds what is there: its own first block */
    daemon_block_fill(&own, blk, adv_rs->block_bytes);
    if (!memmem(a->base, a->size, blk, sizeof(want)))
        return 193;
    for (int i = 0; i < 8; i++) {
        daemon_block_fill(&adv_rs->keys[i], blk, adv_rs->block_bytes);
        memcpy(want, blk, sizeof(want));
        if (memmem(a->base, a->size, want, sizeof(want)))
            return 192;
    }
    free(blk);
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_restored_ns_arena)
{
    char o_disk[DAEMON_PATH_MAX + 32];
    adv_rs = mmap(NULL, sizeof(*adv_rs), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(adv_rs, MAP_FAILED);
    ck_assert_int_eq(daemon_dir_init(&adv_d), 0);
    snprintf(o_disk, sizeof(o_disk), "disk.path=%s/disk", adv_d.dir);
    const char *const extra[] = {"-o", o_disk, "-o", "disk.capacity=64m", "-o", "disk.admit_hits=0",
                                 NULL};
    adv_start(extra);
    ck_assert_int_eq(adv_run(ADV_VICTIM, adv_rs_victim, NULL), 0);
    for (int i = 0; i < 500 && adv_stat("demoted_blocks") < 8; i++)
        adv_msleep(10);
    ck_assert_uint_ge(adv_stat("demoted_blocks"), 8);
    ck_assert_int_eq(daemon_stop(&adv_d), 0);
    adv_start(extra);
    ck_assert_int_eq(adv_run(ADV_VICTIM, adv_rs_victim, (void *)1), 0);
    ck_assert_uint_ge(adv_stat("promoted_blocks"), 8); /* they came from disk */
    ck_assert_int_eq(adv_run(ADV_ATTACKER, adv_rs_attacker, NULL), 0);
    munmap(adv_rs, sizeof(*adv_rs));
    adv_check_clean();
}
END_TEST

/* ---- the fast path: the shared index ----------------------------------------------------- */

/* The victim's 4 blocks for the index cases: the same chain in every process. */
static int adv_ix_victim(void *arg)
{
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    struct kvc_key keys[4];
    void *blocks[4], *got[4];
    kvc_client *c;
    kvc_ns *ns;
    int rc = 0;
    size_t bb;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 220;
    bb = kvc_ns_block_bytes(ns);
    adv_keys_shared(ns, 0x1d00, 4, keys);
    for (int i = 0; i < 4; i++) {
        blocks[i] = malloc(bb);
        got[i] = calloc(1, bb);
        daemon_block_fill(&keys[i], blocks[i], bb);
    }
    if (arg && kvc_put_prefix(ns, NULL, keys, 4, (const void *const *)blocks) != 4)
        rc = 221;
    /* Twice: the second copy goes through the index, mapped by the first. */
    for (int r = 0; r < 2 && !rc; r++)
        if (kvc_get_prefix(ns, keys, 4, got) != 4)
            rc = 222;
    for (int i = 0; i < 4 && !rc; i++)
        if (daemon_block_check(&keys[i], got[i], bb) >= 0)
            rc = 223;
    for (int i = 0; i < 4; i++) {
        free(blocks[i]);
        free(got[i]);
    }
    kvc_disconnect(c);
    return rc;
}

/* The reader of the victim's namespace (issue 28 row 2): it holds the index of the victim's
 * arena, read-only, and tries every way to write it (reopening its descriptor read-write
 * through /proc, a writable shared mapping, making its mapping writable, writing, punching,
 * changing the mode). Had any worked, it would swap the entries of the first two keys so
 * the victim's copies of key 1 would be block 2's bytes. */
static int adv_ix_reader(void *arg)
{
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    struct kvc_fast_attach_req q = {.what = KVC_FAST_INDEX};
    const struct kvc_fast_attach_rep *p;
    uint32_t plen;
    char path[64];
    kvc_client *c;
    kvc_ns *ns;
    int fd = -1, rw;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 230;
    q.arena_id = ns->arena;
    if (q.arena_id == 0 ||
        adv_call(c, KVC_OP_FAST_ATTACH, &q, sizeof(q), &fd, (const void **)&p, &plen) || fd < 0 ||
        plen < sizeof(*p))
        return 231;
    size_t bytes = p->bytes;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    rw = open(path, O_RDWR | O_CLOEXEC);
    if (rw >= 0 || errno != EACCES)
        return 232; /* the inode is the daemon's, 0600 */
    if (mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) != MAP_FAILED)
        return 233;
    void *ro = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (ro == MAP_FAILED || mprotect(ro, bytes, PROT_READ | PROT_WRITE) == 0)
        return 234;
    if (write(fd, "x", 1) >= 0 ||
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == 0)
        return 235;
    if (fchmod(fd, 0666) == 0)
        return 236;
    munmap(ro, bytes);
    close(fd);
    kvc_disconnect(c);
    return 0;
}

/* The daemon's own user or root (an admin here) can reopen the index read-write, as they can
 * do anything to the daemon; even so the kernel refuses every writable mapping and write but
 * the daemon's own (F_SEAL_FUTURE_WRITE). */
static void adv_ix_sealed(void)
{
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    struct kvc_fast_attach_req q = {.what = KVC_FAST_INDEX, .arena_id = 0};
    const struct kvc_fast_attach_rep *p;
    uint32_t plen;
    char path[64];
    kvc_client *c;
    kvc_ns *ns;
    int fd = -1, rw;
    ck_assert_int_eq(kvc_connect(adv_d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    ck_assert_int_eq(adv_call(c, KVC_OP_FAST_ATTACH, &q, sizeof(q), &fd, (const void **)&p, &plen),
                     0);
    ck_assert_int_ge(fd, 0);
    size_t bytes = p->bytes;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    rw = open(path, O_RDWR | O_CLOEXEC);
    ck_assert_int_ge(rw, 0); /* root passes the mode */
    ck_assert_ptr_eq(mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0), MAP_FAILED);
    ck_assert_int_eq(errno, EPERM);
    ck_assert_int_eq(write(rw, "x", 1), -1);
    ck_assert_int_eq(errno, EPERM);
    ck_assert_int_eq(fallocate(rw, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), -1);
    ck_assert_int_eq(errno, EPERM);
    struct stat st;
    ck_assert_int_eq(fstat(rw, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0600);
    close(rw);
    close(fd);
    kvc_disconnect(c);
}

/* The address of the daemon's writable mapping of arena 0's index, from /proc/PID/maps. */
static uint64_t adv_ix_daemon_map(void)
{
    char path[64], line[512];
    unsigned long long lo = 0, hi;
    char perms[8];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)adv_d.pid);
    FILE *f = fopen(path, "re");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f)) {
        if (!strstr(line, "memfd:kvcd-index-0 ") ||
            sscanf(line, "%llx-%llx %7s", &lo, &hi, perms) != 3 || strcmp(perms, "rw-s") != 0) {
            lo = 0;
            continue;
        }
        break;
    }
    fclose(f);
    ck_assert_uint_ne(lo, 0);
    return lo;
}

/* Nothing the daemon decides is read back from the index's header: with arena_bytes, the
 * bucket count and the seed overwritten in the daemon's own mapping (through /proc/PID/mem, as
 * root: the only writer the kernel leaves), the daemon goes on publishing new blocks, and a
 * client that mapped the index before reads them through it. */
static void adv_ix_header_spoiled(void)
{
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    struct kvc_key keys[8];
    void *blocks[8];
    kvc_client *c;
    kvc_ns *ns;
    uint64_t fast0 = 0, fast1 = 0, dropped = 0;
    char path[64];
    ck_assert_int_eq(kvc_connect(adv_d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    ck_assert_int_eq(adv_roundtrip_ns(ns, 0x1e00, 4), 0); /* maps the index */
    ck_assert_int_eq(c->fast[0].state, 1);
    uint64_t hdr = adv_ix_daemon_map();
    snprintf(path, sizeof(path), "/proc/%d/mem", (int)adv_d.pid);
    int mem = open(path, O_RDWR | O_CLOEXEC);
    ck_assert_int_ge(mem, 0);
    struct kvc_fast_hdr bad;
    ck_assert_int_eq(pread(mem, &bad, sizeof(bad), (off_t)hdr), (ssize_t)sizeof(bad));
    ck_assert_uint_eq(bad.magic, KVC_FAST_MAGIC);
    bad.arena_bytes = 0;
    bad.nbuckets = 1;
    bad.seed ^= 0x5555;
    bad.ents_off = bad.gens_off = ~0ull;
    ck_assert_int_eq(pwrite(mem, &bad, sizeof(bad), (off_t)hdr), (ssize_t)sizeof(bad));
    close(mem);
    /* New blocks after that: every one published and copied through the index. */
    ck_assert_int_eq(daemon_client_stat(c, 0, "fast_hits", &fast0), 0);
    adv_keys(ns, 0x1f00, 8, keys);
    size_t bb = kvc_ns_block_bytes(ns);
    for (int i = 0; i < 8; i++) {
        blocks[i] = malloc(bb);
        daemon_block_fill(&keys[i], blocks[i], bb);
    }
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, keys, 8, (const void *const *)blocks), 8);
    ck_assert_int_eq(kvc_flush(c), 0); /* the put's commit answered: published */
    for (int i = 0; i < 8; i++)
        memset(blocks[i], 0, bb);
    ck_assert_int_eq(kvc_get_prefix(ns, keys, 8, blocks), 8);
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(daemon_block_check(&keys[i], blocks[i], bb), -1);
        free(blocks[i]);
    }
    for (int i = 0; i < 500 && fast1 < fast0 + 8; i++) {
        ck_assert_int_eq(daemon_client_stat(c, 0, "fast_hits", &fast1), 0);
        ck_assert_int_eq(daemon_client_stat(c, 0, "fast_dropped", &dropped), 0);
        fast1 += dropped;
        adv_msleep(10);
    }
    ck_assert_uint_eq(fast1 - fast0, 8);
    kvc_disconnect(c);
}

START_TEST(test_index_writes)
{
    adv_start(NULL);
    ck_assert_int_eq(adv_run(ADV_VICTIM, adv_ix_victim, (void *)1), 0);
    ck_assert_int_eq(adv_run(ADV_READER, adv_ix_reader, NULL), 0);
    ck_assert_int_eq(adv_run(ADV_VICTIM, adv_ix_victim, NULL), 0); /* its bytes, as put */
    adv_ix_sealed();
    adv_ix_header_spoiled();
    adv_check_clean();
}
END_TEST

/* ---- the fast path: what a ring can claim ------------------------------------------------- */

/* A connection whose only traffic is its hit ring (valid hits, a few a millisecond, never
 * more than half a ring unread: as libkvc writes them) for twice server.idle_timeout: it is
 * closed for idleness like any other, its hits counted meanwhile. */
static int adv_ring_idle(void *arg)
{
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    struct kvc_fast_hit tmpl[4];
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_stat *st;
    size_t n;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns) || adv_roundtrip_ns(ns, 0x20, 4))
        return 240;
    struct kvc_fast_ring *ring = c->ring;
    if (!ring || ring->head < 4)
        return 241;
    struct kvc_fast_hit *ents = (struct kvc_fast_hit *)(ring + 1);
    for (uint32_t i = 0; i < 4; i++)
        tmpl[i] = ents[(ring->head - 4 + i) % KVC_FAST_RING_ENTS];
    uint64_t end = daemon_now_ms() + 2500;
    while (daemon_now_ms() < end) {
        uint64_t head = ring->head;
        if (head - __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE) < KVC_FAST_RING_ENTS / 2) {
            for (uint32_t i = 0; i < 4; i++)
                ents[(head + i) % KVC_FAST_RING_ENTS] = tmpl[i];
            __atomic_store_n(&ring->head, head + 4, __ATOMIC_RELEASE);
        }
        adv_msleep(5);
    }
    if (kvc_stats(c, 0, &st, &n) != -ETIMEDOUT)
        return 242;
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_ring_idle)
{
    static const char *const extra[] = {"-o", "server.idle_timeout=1000ms", NULL};
    adv_start(extra);
    uint64_t closed = adv_stat("closed_idle");
    ck_assert_int_eq(adv_run(ADV_ATTACKER, adv_ring_idle, NULL), 0);
    ck_assert_uint_eq(adv_stat("closed_idle"), closed + 1);
    ck_assert_uint_gt(adv_stat("fast_hits"), 100); /* its ring was read all along */
    ck_assert_int_ge(daemon_log_count(&adv_d, "idle for server.idle_timeout"), 1);
    adv_check_clean();
}
END_TEST

/* Copy times made up (issue 28 row 6): ring entries and RELEASEs that each claim 2^32-1 us.
 * A connection is credited at most 64 us per us it has been connected (a minute of that
 * banked), the rest counted in load_refused_us. */
static int adv_load_liar(void *arg)
{
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    struct kvc_fast_hit tmpl[4];
    struct kvc_key keys[4];
    kvc_client *c;
    kvc_ns *ns;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns) || adv_roundtrip_ns(ns, 0x21, 4))
        return 250;
    adv_keys(ns, 0x21, 4, keys);
    struct kvc_fast_ring *ring = c->ring;
    if (!ring || ring->head < 4)
        return 251;
    struct kvc_fast_hit *ents = (struct kvc_fast_hit *)(ring + 1);
    for (uint32_t i = 0; i < 4; i++)
        tmpl[i] = ents[(ring->head - 4 + i) % KVC_FAST_RING_ENTS];
    tmpl[0].load_us = UINT32_MAX;
    for (int r = 0; r < 200; r++) {
        uint64_t head = ring->head;
        for (uint32_t i = 0; i < 64; i++)
            ents[(head + i) % KVC_FAST_RING_ENTS] = tmpl[i % 4];
        __atomic_store_n(&ring->head, head + 64, __ATOMIC_RELEASE);
        kvc_lease *l;
        if (kvc_lookup(ns, keys, 4, 0, &l) != 4)
            return 252;
        struct {
            struct kvc_release_req q;
            uint64_t id;
        } rel = {.q = {.nleases = 1, .load_us = UINT32_MAX}, .id = l->ids[0]};
        if (adv_call(c, KVC_OP_RELEASE, &rel, sizeof(rel), NULL, NULL, NULL))
            return 253;
        free(l); /* released above */
    }
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_load_us_bounded)
{
    adv_start(NULL);
    uint64_t t0 = daemon_now_ms();
    ck_assert_int_eq(adv_run(ADV_ATTACKER, adv_load_liar, NULL), 0);
    uint64_t ms = daemon_now_ms() - t0 + 1;
    uint64_t load = adv_stat("load_us"), refused = adv_stat("load_refused_us");
    printf("e2e_adversary: made-up copy times: load_us %llu (%llu ms of test), %llu refused\n",
           (unsigned long long)load, (unsigned long long)ms, (unsigned long long)refused);
    /* The attacker's one connection: 64 us per us it was connected, a millisecond's worth at
     * connect (with room to spare for the test's own timing). */
    ck_assert_uint_le(load, 64 * 1000 * (ms + 1) * 4);
    ck_assert_uint_gt(refused, 100ull * UINT32_MAX);
    adv_check_clean();
}
END_TEST

/* ---- the fast path: hit rings ----------------------------------------------------------- */

/* Ring flood (issue 28 row 4): ADV_RF_CONNS connections of the attacker each advance their
 * hit ring by a ring's worth of valid hits and send FAST_ATTACH SYNC, over and over, while
 * the victim times LOOKUPs of its restricted prefix; in the rounds between, the same
 * connections send plain LOOKUPs (and RELEASEs) of their blocks instead. The rounds
 * alternate (plain, flood, five times each) so the host's noise falls on both, and the
 * victim's p99 under the flood must stay within 2x of its p99 under the plain lookups, over
 * the same number of samples. */
#define ADV_RF_CONNS 8
#define ADV_RF_ROUNDS 10
#define ADV_RF_SAMPLES 900 /* per round, at most */
#define ADV_RF_ROUND_MS 4000
#define ADV_RF_KEYS 16

struct adv_rf {
    int ready;      /* children set up */
    int round;      /* running: 1..ADV_RF_ROUNDS (odd: plain, even: flood); -1: the end */
    int round_done; /* the last round the victim finished */
    int failed;     /* a child's step that went wrong */
    uint64_t msgs[ADV_RF_ROUNDS][ADV_RF_CONNS];
    uint32_t n[ADV_RF_ROUNDS];
    uint32_t lat_ns[ADV_RF_ROUNDS][ADV_RF_SAMPLES];
};

static struct adv_rf *adv_rf;
static int adv_rf_idx; /* the attacker's number, set before each spawn */

static uint64_t adv_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Until round r is announced (or the end). */
static int adv_rf_wait_round(int after)
{
    int r;
    while ((r = __atomic_load_n(&adv_rf->round, __ATOMIC_ACQUIRE)) >= 0 && r <= after)
        adv_msleep(1);
    return r;
}

static int adv_rf_attacker(void *arg)
{
    struct adv_rf *rf = adv_rf;
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    struct kvc_key keys[ADV_RF_KEYS];
    struct kvc_fast_hit tmpl[ADV_RF_KEYS];
    kvc_client *c;
    kvc_ns *ns;
    int idx = adv_rf_idx, r = 0;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 200;
    /* Its blocks, read once through the index: the ring's last entries are valid hits. */
    if (adv_roundtrip_ns(ns, 0x300 + (uint32_t)idx, ADV_RF_KEYS))
        return 201;
    adv_keys(ns, 0x300 + (uint32_t)idx, ADV_RF_KEYS, keys);
    struct kvc_fast_ring *ring = c->ring;
    if (!ring || ring->head < ADV_RF_KEYS)
        return 202;
    struct kvc_fast_hit *ents = (struct kvc_fast_hit *)(ring + 1);
    for (uint32_t i = 0; i < ADV_RF_KEYS; i++)
        tmpl[i] = ents[(ring->head - ADV_RF_KEYS + i) % KVC_FAST_RING_ENTS];
    if (tmpl[0].nkeys != ADV_RF_KEYS)
        return 203;
    __atomic_fetch_add(&rf->ready, 1, __ATOMIC_ACQ_REL);
    while ((r = adv_rf_wait_round(r)) > 0) {
        bool flood = (r & 1) == 0;
        while (__atomic_load_n(&rf->round_done, __ATOMIC_ACQUIRE) < r) {
            if (flood) {
                uint64_t head = ring->head;
                for (uint32_t i = 0; i < KVC_FAST_RING_ENTS; i++)
                    ents[(head + i) % KVC_FAST_RING_ENTS] = tmpl[i % ADV_RF_KEYS];
                __atomic_store_n(&ring->head, head + KVC_FAST_RING_ENTS, __ATOMIC_RELEASE);
                struct kvc_fast_attach_req q = {.what = KVC_FAST_SYNC};
                if (adv_call(c, KVC_OP_FAST_ATTACH, &q, sizeof(q), NULL, NULL, NULL))
                    return 204;
            } else {
                kvc_lease *l;
                if (kvc_lookup(ns, keys, ADV_RF_KEYS, 0, &l) != ADV_RF_KEYS || kvc_release(l))
                    return 205;
            }
            rf->msgs[r - 1][idx]++;
        }
    }
    kvc_disconnect(c);
    return 0;
}

/* Times LOOKUPs of its 8-block prefix in each round, and runs the rounds. */
static int adv_rf_victim(void *arg)
{
    struct adv_rf *rf = adv_rf;
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    struct kvc_key keys[8];
    kvc_client *c;
    kvc_ns *ns;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns) || adv_roundtrip_ns(ns, 0x7300, 8))
        return 210;
    adv_keys(ns, 0x7300, 8, keys);
    for (int i = 0; i < 60000 && __atomic_load_n(&rf->ready, __ATOMIC_ACQUIRE) < ADV_RF_CONNS; i++)
        adv_msleep(1);
    if (rf->ready < ADV_RF_CONNS)
        return 211;
    for (int r = 1; r <= ADV_RF_ROUNDS; r++) {
        __atomic_store_n(&rf->round, r, __ATOMIC_RELEASE);
        adv_msleep(100); /* the attackers under way */
        uint64_t end = daemon_now_ms() + ADV_RF_ROUND_MS;
        uint32_t n = 0;
        while (n < ADV_RF_SAMPLES && daemon_now_ms() < end) {
            kvc_lease *l;
            uint64_t t0 = adv_mono_ns();
            int h = kvc_lookup(ns, keys, 8, 0, &l);
            uint64_t t1 = adv_mono_ns();
            if (h != 8 || kvc_release(l))
                return 212;
            rf->lat_ns[r - 1][n++] = (uint32_t)(t1 - t0 > UINT32_MAX ? UINT32_MAX : t1 - t0);
        }
        rf->n[r - 1] = n;
        __atomic_store_n(&rf->round_done, r, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&rf->round, -1, __ATOMIC_RELEASE);
    kvc_disconnect(c);
    return 0;
}

static int adv_u32_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile of v[0..n) (sorted in place), in ms. */
static double adv_quantile_ms(uint32_t *v, uint32_t n, double q)
{
    qsort(v, n, sizeof(*v), adv_u32_cmp);
    uint32_t i = (uint32_t)(q * n + 0.999999);
    return v[i ? i - 1 : 0] / 1e6;
}

START_TEST(test_ring_flood)
{
    pid_t att[ADV_RF_CONNS], vic;
    adv_rf = mmap(NULL, sizeof(*adv_rf), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(adv_rf, MAP_FAILED);
    memset(adv_rf, 0, sizeof(*adv_rf));
    adv_start(NULL);
    for (int i = 0; i < ADV_RF_CONNS; i++) {
        adv_rf_idx = i;
        att[i] = adv_spawn(ADV_ATTACKER, adv_rf_attacker, NULL);
    }
    vic = adv_spawn(ADV_VICTIM, adv_rf_victim, NULL);
    ck_assert_int_eq(daemon_child_wait(vic, 120000, NULL), 0);
    for (int i = 0; i < ADV_RF_CONNS; i++)
        ck_assert_int_eq(daemon_child_wait(att[i], 30000, NULL), 0);
    /* The same number of samples of each kind: the fewest any round took, from every one. */
    uint32_t n = ADV_RF_SAMPLES;
    for (int r = 0; r < ADV_RF_ROUNDS; r++)
        n = adv_rf->n[r] < n ? adv_rf->n[r] : n;
    static uint32_t plain[ADV_RF_ROUNDS / 2 * ADV_RF_SAMPLES],
        flood[ADV_RF_ROUNDS / 2 * ADV_RF_SAMPLES];
    const uint32_t kinds = ADV_RF_ROUNDS / 2;
    uint64_t mplain = 0, mflood = 0;
    for (int r = 0; r < ADV_RF_ROUNDS; r++) {
        memcpy((r & 1 ? flood : plain) + (r / 2) * n, adv_rf->lat_ns[r], n * sizeof(uint32_t));
        for (int i = 0; i < ADV_RF_CONNS; i++)
            *(r & 1 ? &mflood : &mplain) += adv_rf->msgs[r][i];
    }
    double p50p = adv_quantile_ms(plain, kinds * n, 0.5),
           p99p = adv_quantile_ms(plain, kinds * n, 0.99);
    double p50f = adv_quantile_ms(flood, kinds * n, 0.5),
           p99f = adv_quantile_ms(flood, kinds * n, 0.99);
    printf("e2e_adversary: ring flood: victim LOOKUP p50 %.3f ms, p99 %.3f ms under %llu plain "
           "lookups; p50 %.3f ms, p99 %.3f ms under %llu ring floods of %u hits (%u samples "
           "each); fast_hits %llu, fast_dropped %llu\n",
           p50p, p99p, (unsigned long long)mplain, p50f, p99f, (unsigned long long)mflood,
           KVC_FAST_RING_ENTS, kinds * n, (unsigned long long)adv_stat("fast_hits"),
           (unsigned long long)adv_stat_or0("fast_dropped"));
    fflush(stdout);
    ck_assert_uint_ge(n, 200);
    ck_assert_msg(p99f <= 2 * p99p,
                  "victim p99 %.3f ms under the ring flood, %.3f ms under plain "
                  "lookups",
                  p99f, p99p);
    munmap(adv_rf, sizeof(*adv_rf));
    adv_check_clean();
}
END_TEST

/* ---- the reader's decode ------------------------------------------------------------------- */

/* A writer of the arena rewrites a quantized block's section table while a reader decodes
 * it: libkvc checked the table and then read it again from shared memory, so the second
 * read could send it past its buffers. It parses a private copy now: every decode either
 * succeeds or says the block is malformed, and nothing is read out of bounds (ASan). */
struct adv_race {
    uint8_t *shared;
    uint32_t *offset; /* of the last section, inside shared */
    uint32_t good;
};

/* The racing writer: another process (as an attacker is), flipping the section's offset in
 * the shared mapping until it is killed. */
static pid_t adv_race_writer(struct adv_race *r)
{
    pid_t pid = fork();
    if (pid == 0) {
        for (;;) {
            __atomic_store_n(r->offset, 0x7ffffff0u, __ATOMIC_RELAXED);
            __atomic_store_n(r->offset, r->good, __ATOMIC_RELAXED);
        }
    }
    return pid;
}

START_TEST(test_reader_private_copy)
{
    struct kern_layout kl = {.layers = 2, .heads = 2, .head_dim = 64, .tokens = 32,
                             .dtype = KERN_DTYPE_FP16};
    struct kern_recipe rec;
    struct kvc_ns ns;
    struct adv_race race;
    kern_recipe_fill(&rec, KERN_CODEC_Q8_0, KERN_CODEC_Q8_0, 0);
    uint64_t raw = kern_raw_size(&kl);
    int64_t enc = kern_encoded_size(&kl, &rec);
    ck_assert_int_gt(enc, 0);
    uint16_t *src = malloc(raw), *dst = malloc(raw);
    struct kvc_key k = {.lo = 1, .hi = 2};
    daemon_smooth_fill(&k, src, raw / 2);
    race.shared = mmap(NULL, (size_t)enc, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(race.shared != MAP_FAILED);
    ck_assert_int_eq(kern_encode_cpu(&kl, &rec, src, race.shared, (size_t)enc, NULL), enc);
    memset(&ns, 0, sizeof(ns));
    ns.block_bytes = raw;
    ns.layout = (struct kvc_wire_layout){.layers = 2, .kv_heads = 2, .head_dim = 64,
                                         .block_tokens = 32, .dtype = KVC_WIRE_DTYPE_FP16,
                                         .kv_kind = KVC_WIRE_KV_KIND_KV};
    kvc_lease *l = calloc(1, sizeof(*l) + sizeof(l->hits[0]));
    l->ns = &ns;
    l->n = 1;
    l->hits[0] = (struct kvc_hit){.data = race.shared, .len = (uint64_t)enc,
                                  .format = KVC_WIRE_FORMAT_Q8_0, .ready = true,
                                  .tier = KVC_WIRE_TIER_HOST};
    ck_assert_int_eq(kvc_lease_copy(l, 0, dst, raw), 0);
    ck_assert(daemon_smooth_err(&k, dst, raw / 2) < 0.01);
    race.offset = (uint32_t *)(race.shared + sizeof(struct kern_block_hdr) +
                               3 * sizeof(struct kern_block_sect));
    race.good = *race.offset;
    pid_t writer = adv_race_writer(&race);
    ck_assert_int_gt(writer, 0);
    int ok = 0, bad = 0;
    /* 20,000 decodes, and on until the writer has been seen (it may start late on a busy
     * machine), within a bounded time. */
    time_t until = time(NULL) + 30;
    for (int i = 0; i < 20000 || (bad == 0 && time(NULL) < until); i++) {
        int rc = kvc_lease_copy(l, 0, dst, raw);
        ck_assert_msg(rc == 0 || rc == -EBADMSG, "decode: %d", rc);
        rc == 0 ? ok++ : bad++;
    }
    kill(writer, SIGKILL);
    waitpid(writer, NULL, 0);
    printf("e2e_adversary: reader under a racing writer: %d decoded, %d refused\n", ok, bad);
    ck_assert_int_gt(bad, 0); /* the writer did race the reader */
    free(l);
    munmap(race.shared, (size_t)enc);
    free(src);
    free(dst);
}
END_TEST

/* ---- the suite ---------------------------------------------------------------------------------- */

/* One test case per attack, named after it, so that CK_RUN_CASE=test_NAME runs one. */
static void adv_case(Suite *s, const char *name, const TTest *t)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, NULL, adv_teardown);
    tcase_add_test(tc, t);
    suite_add_tcase(s, tc);
}

int main(void)
{
    /* fast: an attack on the fast path's shared memory, skipped in the run with the fast
     * path off (tests/run-checks.sh runs the suite again with KVC_NO_FASTPATH=1). */
    const struct {
        const char *name;
        const TTest *t;
        bool fast;
    } cases[] = {
        {"test_duplicate_keys", test_duplicate_keys, false},
        {"test_pin_and_lease_flood", test_pin_and_lease_flood, false},
        {"test_connection_flood", test_connection_flood, false},
        {"test_idle_connections", test_idle_connections, false},
        {"test_reservation_hoarding", test_reservation_hoarding, false},
        {"test_namespace_flood", test_namespace_flood, false},
        {"test_names_leak", test_names_leak, false},
        {"test_hole_punch", test_hole_punch, false},
        {"test_gpu_pool_access", test_gpu_pool_access, false},
        {"test_wait_flood", test_wait_flood, false},
        {"test_restored_ns_arena", test_restored_ns_arena, false},
        {"test_index_writes", test_index_writes, true},
        {"test_ring_idle", test_ring_idle, true},
        {"test_load_us_bounded", test_load_us_bounded, true},
        {"test_ring_flood", test_ring_flood, true},
    };
    Suite *s = suite_create("e2e_adversary");
    SRunner *sr;
    int failed;
    bool root = geteuid() == 0;
    const char *nf = getenv("KVC_NO_FASTPATH");
    bool nofast = nf && *nf && strcmp(nf, "0") != 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (!root)
            printf("SKIP: e2e_adversary: %s: not root (the clients run as other uids)\n",
                   cases[i].name);
        else if (cases[i].fast && nofast)
            printf("SKIP: e2e_adversary: %s: the fast path is off (KVC_NO_FASTPATH): the run "
                   "with it on has this case\n",
                   cases[i].name);
        else
            adv_case(s, cases[i].name, cases[i].t);
    }
    adv_case(s, "test_reader_private_copy", test_reader_private_copy); /* no other uid */
    if (!root)
        printf("SKIP: e2e_adversary: test_hole_punch_hugetlb: not root\n");
    else if (adv_huge_free() >= (64u << 20))
        adv_case(s, "test_hole_punch_hugetlb", test_hole_punch_hugetlb);
    else
        printf("SKIP: e2e_adversary: test_hole_punch_hugetlb: fewer than 64 MiB of huge "
               "pages free (HugePages_Free * Hugepagesize = %llu bytes)\n",
               (unsigned long long)adv_huge_free());
    fflush(stdout);
    if (daemon_suite_init("e2e-adversary"))
        return 1;
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    daemon_suite_fini();
    return failed ? 1 : 0;
}
