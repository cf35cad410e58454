/*
 * adversary.h — what the adversary suites (check_e2e_adversary, check_e2e_adversary_fast,
 * check_e2e_adversary_pool) share: children that run as other uids, a daemon of the suite's
 * own with the victim's access lists, the victim's round trip, and the check that a daemon
 * is clean once the attack is over (docs/security.md).
 *
 * DESIGN
 * The daemon runs as this process's user (root: an admin); the victim (uid 65501, the only
 * writer of the restricted namespaces victim*), a reader of them (65503) and the attacker
 * (65502) are forked children that drop to those uids (setgroups, setresgid, setresuid)
 * before they connect, so the daemon sees them as SO_PEERCRED reports them. Each attack
 * class has a case: the attacker tries to get past one limit, the test checks that it was
 * refused or contained (the error, the counter, the log line), that the victim was served
 * with the right bytes meanwhile, and that once the clients are gone the daemon is alive
 * with every pin and reservation given back. Each case is a TCase of its own (named after
 * it, so that CK_RUN_CASE=test_NAME runs one) whose teardown stops the daemon and asserts a
 * clean exit (ASan's leak check too). Without root, every case that needs other uids prints
 * a SKIP line and is not registered.
 */
#ifndef KVC_TESTS_ADVERSARY_H
#define KVC_TESTS_ADVERSARY_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "client/kvc.h"
#include "tests/lib/daemon.h"

#define ADV_VICTIM 65501u
#define ADV_ATTACKER 65502u
#define ADV_READER 65503u
#define ADV_BT 16 /* tokens per block: 16 KiB blocks (daemon_layout) */

/* The daemon of the case (adv_start), stopped by the case's teardown. */
extern struct daemon adv_d;

void adv_msleep(int ms);
/* CLOCK_MONOTONIC in ns. */
uint64_t adv_mono_ns(void);
/* The q-quantile of v[0..n) (sorted in place: latencies in ns), in ms. */
double adv_quantile_ms(uint32_t *v, uint32_t n, double q);

/* ---- children as other users */
/* fn(arg) in a child (daemon_child_spawn) that first drops to uid (group uid, no groups). */
pid_t adv_spawn(uint32_t uid, int (*fn)(void *), void *arg);
/* adv_spawn and its exit status (daemon_child_wait, 60 s). */
int adv_run(uint32_t uid, int (*fn)(void *), void *arg);

/* A pair of pipes for a child that holds something while the parent checks. */
struct adv_sync {
    int up[2];   /* child -> parent: "holding" */
    int down[2]; /* parent -> child: "let go" */
};
void adv_sync_init(struct adv_sync *s);
void adv_sync_fini(struct adv_sync *s);
void adv_signal(int fd, char v);
/* The next byte from fd, or 0 after 60 s or at the end (the other side is gone). */
char adv_await(int fd);

/* ---- the daemon */
/* adv_d's directory (and the suite's above it) made reachable by every uid. */
void adv_dir_open(void);
/* Starts kvcd with the access lists of the victim and the limits the cases use; `extra` is
 * more "-o", "key=value" pairs. Its directory and socket are reachable by every uid. */
void adv_start(const char *const *extra);
/* The case's teardown: a clean stop of adv_d, and its directory removed. */
void adv_teardown(void);
/* A counter of adv_d's STATS (asserted present), or 0 where it is absent. */
uint64_t adv_stat(const char *name);
uint64_t adv_stat_or0(const char *name);
/* Once every child is gone: alive, and every pin and reservation given back. */
void adv_check_clean(void);

/* ---- the victim */
/* Keys of a chain of n blocks of ns, unique per (family, pid). */
void adv_keys(const kvc_ns *ns, uint32_t family, uint32_t n, struct kvc_key *keys);
/* The same chain in every process. */
void adv_keys_shared(const kvc_ns *ns, uint32_t family, uint32_t n, struct kvc_key *keys);
/* Puts n blocks (each a function of its key) and gets them back byte for byte. 0 or a code. */
int adv_roundtrip_ns(kvc_ns *ns, uint32_t family, uint32_t n);
/* The victim (uid 65501): a fresh connection, its restricted namespace, 8 blocks out and
 * back. A child's function: 0 or a code. */
int adv_victim(void *arg);
/* adv_victim run as the victim, asserted to succeed. */
void adv_victim_served(void);

/* ---- raw requests */
/* One request through a connected client's buffers (libkvc's transport): the reply status;
 * *rep and *rlen the payload. */
int adv_call(kvc_client *c, uint16_t op, const void *body, uint32_t len, int *fd, const void **rep,
             uint32_t *rlen);

/* ---- the suite */
/* One attack of a suite's table; fast: an attack on the fast path's shared memory, skipped
 * in the run with the fast path off (tests/run-checks.sh runs such suites again with
 * KVC_NO_FASTPATH=1). */
struct adv_case {
    const char *name;
    const TTest *t;
    bool fast;
};
/* One TCase named after the case, with adv_teardown. */
void adv_case(Suite *s, const char *name, const TTest *t);
/* adv_case for each of cases[n] that can run here, a SKIP line (naming `suite`) for the
 * others: not root, or a fast case with the fast path off. */
void adv_cases_add(Suite *s, const char *suite, const struct adv_case *cases, size_t n);
/* Runs the suite between daemon_suite_init(dir) and daemon_suite_fini(): main()'s status. */
int adv_suite_run(Suite *s, const char *dir);

/* ---- a victim's LOOKUPs timed in alternating rounds: odd rounds the attackers send plain
 * lookups, even ones the flood under test; the same number of samples of each kind is
 * compared (test_ring_flood, test_block_list_flood). In shared memory, for the children. */
#define ADV_ROUNDS_MAX 10
#define ADV_ROUNDS_SAMPLES_MAX 1500
#define ADV_ROUNDS_CONNS_MAX 8
struct adv_rounds {
    int ready;      /* attackers set up */
    int round;      /* running: 1..rounds (odd: plain, even: flood); -1: the end */
    int round_done; /* the last round the victim finished */
    uint32_t rounds, samples, conns, round_ms;
    uint64_t msgs[ADV_ROUNDS_MAX][ADV_ROUNDS_CONNS_MAX]; /* each attacker's, by round */
    uint32_t n[ADV_ROUNDS_MAX];
    uint32_t lat_ns[ADV_ROUNDS_MAX][ADV_ROUNDS_SAMPLES_MAX];
};
/* rounds (even), samples at most a round, attacker connections, a round's length. */
struct adv_rounds *adv_rounds_new(uint32_t rounds, uint32_t samples, uint32_t conns,
                                  uint32_t round_ms);
void adv_rounds_free(struct adv_rounds *rr);
/* An attacker: until a round after `after` is announced; -1 at the end. */
int adv_rounds_wait(const struct adv_rounds *rr, int after);
/* The victim: once every attacker is ready, runs the rounds, timing LOOKUPs of keys[0..n) on
 * ns. 0, 1 when the attackers were not ready in 60 s, 2 when a lookup did not hit them all. */
int adv_rounds_victim(struct adv_rounds *rr, kvc_ns *ns, const struct kvc_key *keys, size_t n);
/* The victim's latencies: the fewest samples any round took (n), from each round; p50 and
 * p99 in ms and the attackers' messages, plain rounds and flood rounds apart. */
struct adv_rounds_sum {
    uint32_t n, samples; /* samples: n times the rounds of one kind */
    uint64_t mplain, mflood;
    double p50p, p99p, p50f, p99f;
};
void adv_rounds_sum(struct adv_rounds *rr, struct adv_rounds_sum *out);

#endif
