/*
 * adversary.c — see adversary.h.
 */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc.h"
#include "client/libkvc_internal.h"
#include "tests/lib/adversary.h"
#include "tests/lib/daemon.h"

struct daemon adv_d;

void adv_msleep(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

uint64_t adv_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int adv_u32_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

double adv_quantile_ms(uint32_t *v, uint32_t n, double q)
{
    qsort(v, n, sizeof(*v), adv_u32_cmp);
    uint32_t i = (uint32_t)(q * n + 0.999999);
    return v[i ? i - 1 : 0] / 1e6;
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

pid_t adv_spawn(uint32_t uid, int (*fn)(void *), void *arg)
{
    static struct adv_as as; /* copied into the child by fork */
    as = (struct adv_as){uid, fn, arg};
    pid_t pid = daemon_child_spawn(adv_as_run, &as);
    ck_assert_int_gt(pid, 0);
    return pid;
}

int adv_run(uint32_t uid, int (*fn)(void *), void *arg)
{
    return daemon_child_wait(adv_spawn(uid, fn, arg), 60000, NULL);
}

void adv_sync_init(struct adv_sync *s)
{
    ck_assert_int_eq(pipe(s->up), 0);
    ck_assert_int_eq(pipe(s->down), 0);
}

void adv_sync_fini(struct adv_sync *s)
{
    close(s->up[0]);
    close(s->up[1]);
    close(s->down[0]);
    close(s->down[1]);
}

void adv_signal(int fd, char v)
{
    (void)!write(fd, &v, 1);
}

/* The next byte from fd, or 0 after 60 s or at the end (the other side is gone). */
char adv_await(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char v = 0;
    if (poll(&p, 1, 60000) != 1 || read(fd, &v, 1) != 1)
        return 0;
    return v;
}

/* ---- the daemon --------------------------------------------------------------------------- */

/* adv_d's directory (and the suite's above it) made reachable by every uid. */
void adv_dir_open(void)
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
void adv_start(const char *const *extra)
{
    static const char ini[] = "[namespace.victim*]\n"
                              "read = 65503\n"
                              "write = 65501\n"
                              "host_size = 16m\n";
    const char *args[64] = {"-c", NULL,
                            "-o", "server.socket_mode=0666",
                            "-o", "host.size=32m",
                            "-o", "host.page_size=64k",
                            "-o", "log.rate_limit=1000"};
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

void adv_teardown(void)
{
    if (adv_d.pid)
        ck_assert_int_eq(daemon_stop(&adv_d), 0); /* a clean exit: ASan's leak check too */
    daemon_cleanup(&adv_d);
}

uint64_t adv_stat(const char *name)
{
    uint64_t v = UINT64_MAX;
    ck_assert_int_eq(daemon_stat(&adv_d, name, &v), 0);
    return v;
}

uint64_t adv_stat_or0(const char *name)
{
    uint64_t v = 0;
    return daemon_stat(&adv_d, name, &v) == 0 ? v : 0;
}

/* Once every child is gone: alive, and every pin, reservation and connection given back.
 * Each adv_stat is a connection of its own, whose hang-up reaches the daemon a moment after
 * the call returns (through an I/O thread too): the next one may still count it, so the
 * count of connections is read until it is the asker's alone, within a bound. */
void adv_check_clean(void)
{
    uint64_t conns = 0;
    ck_assert(daemon_alive(&adv_d));
    for (int i = 0; i < 200 && (adv_stat("pins_now") || adv_stat("reserved_now")); i++)
        adv_msleep(10);
    ck_assert_uint_eq(adv_stat("pins_now"), 0);
    ck_assert_uint_eq(adv_stat("reserved_now"), 0);
    ck_assert_uint_eq(adv_stat("reserved_bytes_now"), 0);
    for (int i = 0; i < daemon_ms(2000) / 10 && (conns = adv_stat("clients_now")) != 1; i++)
        adv_msleep(10);
    ck_assert_uint_eq(conns, 1); /* the one asking */
    ck_assert_int_eq(daemon_roundtrip(&adv_d), 0);
}

/* ---- the victim ---------------------------------------------------------------------------- */

/* Keys of a chain of n blocks of ns, unique per (family, pid). */
void adv_keys(const kvc_ns *ns, uint32_t family, uint32_t n, struct kvc_key *keys)
{
    ck_assert_int_eq(daemon_chain_keys(ns, family ^ ((uint32_t)getpid() << 8), 0, 0, n, keys), 0);
}

/* The same chain in every process. */
void adv_keys_shared(const kvc_ns *ns, uint32_t family, uint32_t n, struct kvc_key *keys)
{
    ck_assert_int_eq(daemon_chain_keys(ns, 0x5a000000u + family, 0, 0, n, keys), 0);
}

/* Puts n blocks (each a function of its key) and gets them back byte for byte. 0 or a code. */
int adv_roundtrip_ns(kvc_ns *ns, uint32_t family, uint32_t n)
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
int adv_victim(void *arg)
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

void adv_victim_served(void)
{
    ck_assert_int_eq(adv_run(ADV_VICTIM, adv_victim, NULL), 0);
}

/* ---- raw requests ----------------------------------------------------------------------- */

/* One request through a connected client's buffers (libkvc's transport): the reply status;
 * *rep and *rlen the payload. */
int adv_call(kvc_client *c, uint16_t op, const void *body, uint32_t len, int *fd, const void **rep,
             uint32_t *rlen)
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

void adv_case(Suite *s, const char *name, const TTest *t)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, NULL, adv_teardown);
    tcase_add_test(tc, t);
    suite_add_tcase(s, tc);
}

void adv_cases_add(Suite *s, const char *suite, const struct adv_case *cases, size_t n)
{
    bool root = geteuid() == 0;
    const char *nf = getenv("KVC_NO_FASTPATH");
    bool nofast = nf && *nf && strcmp(nf, "0") != 0;
    for (size_t i = 0; i < n; i++) {
        if (!root)
            printf("SKIP: %s: %s: not root (the clients run as other uids)\n", suite,
                   cases[i].name);
        else if (cases[i].fast && nofast)
            printf("SKIP: %s: %s: the fast path is off (KVC_NO_FASTPATH): the run "
                   "with it on has this case\n",
                   suite, cases[i].name);
        else
            adv_case(s, cases[i].name, cases[i].t);
    }
}

int adv_suite_run(Suite *s, const char *dir)
{
    SRunner *sr;
    int failed;
    fflush(stdout);
    if (daemon_suite_init(dir))
        return 1;
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    daemon_suite_fini();
    return failed ? 1 : 0;
}

/* ---- alternating rounds ------------------------------------------------------------------ */

struct adv_rounds *adv_rounds_new(uint32_t rounds, uint32_t samples, uint32_t conns,
                                  uint32_t round_ms)
{
    ck_assert(rounds % 2 == 0 && rounds <= ADV_ROUNDS_MAX);
    ck_assert(samples <= ADV_ROUNDS_SAMPLES_MAX && conns <= ADV_ROUNDS_CONNS_MAX);
    struct adv_rounds *rr =
        mmap(NULL, sizeof(*rr), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(rr, MAP_FAILED);
    memset(rr, 0, sizeof(*rr));
    rr->rounds = rounds;
    rr->samples = samples;
    rr->conns = conns;
    rr->round_ms = round_ms;
    return rr;
}

void adv_rounds_free(struct adv_rounds *rr)
{
    munmap(rr, sizeof(*rr));
}

int adv_rounds_wait(const struct adv_rounds *rr, int after)
{
    int r;
    while ((r = __atomic_load_n(&rr->round, __ATOMIC_ACQUIRE)) >= 0 && r <= after)
        adv_msleep(1);
    return r;
}

int adv_rounds_victim(struct adv_rounds *rr, kvc_ns *ns, const struct kvc_key *keys, size_t n)
{
    for (int i = 0; i < 60000 && __atomic_load_n(&rr->ready, __ATOMIC_ACQUIRE) < (int)rr->conns;
         i++)
        adv_msleep(1);
    if (rr->ready < (int)rr->conns)
        return 1;
    for (int r = 1; r <= (int)rr->rounds; r++) {
        __atomic_store_n(&rr->round, r, __ATOMIC_RELEASE);
        adv_msleep(100); /* the attackers under way */
        uint64_t end = daemon_now_ms() + rr->round_ms;
        uint32_t k = 0;
        while (k < rr->samples && daemon_now_ms() < end) {
            kvc_lease *l;
            uint64_t t0 = adv_mono_ns();
            int h = kvc_lookup(ns, keys, n, 0, &l);
            uint64_t t1 = adv_mono_ns();
            if (h != (int)n || kvc_release(l))
                return 2;
            rr->lat_ns[r - 1][k++] = (uint32_t)(t1 - t0 > UINT32_MAX ? UINT32_MAX : t1 - t0);
        }
        rr->n[r - 1] = k;
        __atomic_store_n(&rr->round_done, r, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&rr->round, -1, __ATOMIC_RELEASE);
    return 0;
}

void adv_rounds_sum(struct adv_rounds *rr, struct adv_rounds_sum *out)
{
    static uint32_t plain[ADV_ROUNDS_MAX / 2 * ADV_ROUNDS_SAMPLES_MAX],
        flood[ADV_ROUNDS_MAX / 2 * ADV_ROUNDS_SAMPLES_MAX];
    uint32_t n = rr->samples, kinds = rr->rounds / 2;
    memset(out, 0, sizeof(*out));
    for (uint32_t r = 0; r < rr->rounds; r++)
        n = rr->n[r] < n ? rr->n[r] : n;
    for (uint32_t r = 0; r < rr->rounds; r++) {
        memcpy((r & 1 ? flood : plain) + (r / 2) * n, rr->lat_ns[r], n * sizeof(uint32_t));
        for (uint32_t i = 0; i < rr->conns; i++)
            *(r & 1 ? &out->mflood : &out->mplain) += rr->msgs[r][i];
    }
    out->n = n;
    out->samples = kinds * n;
    out->p50p = adv_quantile_ms(plain, kinds * n, 0.5);
    out->p99p = adv_quantile_ms(plain, kinds * n, 0.99);
    out->p50f = adv_quantile_ms(flood, kinds * n, 0.5);
    out->p99f = adv_quantile_ms(flood, kinds * n, 0.99);
}
