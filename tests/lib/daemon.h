/*
 * daemon.h — helpers for the end-to-end suites: a real kvcd on a private socket, kvcctl runs,
 * child processes, deterministic block bytes and a tiny JSON reader.
 *
 * DESIGN
 * Each suite calls daemon_suite_init() once in main(): it makes one temporary directory for
 * the whole run (every daemon gets a mkdtemp directory inside it) and daemon_suite_run()
 * (which ends every suite's main()) removes it after the cases ran, so even a case killed by
 * Check's timeout leaves no directory behind. Every process a test starts (kvcd, kvcctl,
 * client children) comes from daemon_fork() and gets PR_SET_PDEATHSIG = SIGKILL, so a test
 * process that dies takes them along. All waits have a deadline, scaled by daemon_slow(); on
 * expiry the waited-for process is killed and the wait reports failure.
 * The binaries are those of the build the test belongs to (KVC_BUILD_BIN), so the ASan
 * suites drive the ASan daemon, whose leak check turns a leak into a non-zero exit status
 * that daemon_stop() reports.
 */
#ifndef KVC_TESTS_DAEMON_H
#define KVC_TESTS_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "client/kvc.h"

/* Deadlines. Every wait of the tests has one, generous, and multiplied by daemon_slow(). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DAEMON_SAN_SLOW 4 /* the ASan+UBSan and TSan builds run several times slower */
#else
#define DAEMON_SAN_SLOW 1
#endif
#define DAEMON_START_MS 20000 /* kvcd up and answering, or stopped after SIGTERM */

/* DAEMON_SAN_SLOW times $KVC_TEST_SLOW (1..100, default 1: a host more loaded than usual).
 * Check timeouts are set as daemon_slow() * seconds. */
int daemon_slow(void);
/* ms * daemon_slow(): the deadline of a wait of `ms` in a plain build on an idle host. */
int daemon_ms(int ms);

/* fork() for every process a test starts (kvcd, kvcctl, clients): the child gets
 * PR_SET_PDEATHSIG = SIGKILL, an empty signal mask and the default SIGPIPE action, so it
 * dies with the test process that started it, even one that fails an assertion and exits
 * in Check's fork mode. Returns as fork() (stdio is flushed first). */
pid_t daemon_fork(void);

/* CUDA devices visible here, asked in a child process (daemon_fork) so that the caller never
 * initialises CUDA: a CUDA context does not survive fork(), and Check forks every case from
 * main(), as e2e cases fork their clients. For the registration of device cases in main().
 * The count (0 without CUDA or a device), or -1 when the probe died (print it as a skip). */
int daemon_cuda_devices(void);

/* The path of one of the build's programs ("kvcd", "kvcctl", "kvcreplay"):
 * $KVC_TEST_BIN_DIR/name when that is set (a bundle of the binaries moved to another host:
 * etc/device-check.sh), else the build's own bin directory (KVC_BUILD_BIN). Static storage. */
const char *daemon_bin(const char *name);
#define DAEMON_KVCD daemon_bin("kvcd")
#define DAEMON_KVCCTL daemon_bin("kvcctl")
#define DAEMON_PATH_MAX 200

struct daemon {
    pid_t pid;                  /* kvcd's pid; 0 when not running */
    char dir[DAEMON_PATH_MAX];  /* private directory (mkdtemp) */
    char sock[DAEMON_PATH_MAX]; /* dir/kvcd.sock */
    char log[DAEMON_PATH_MAX];  /* dir/kvcd.log: kvcd's stderr */
};

/* Once per suite process, around srunner_run_all(). */
int daemon_suite_init(const char *name);
void daemon_suite_fini(void);
/* A suite's main() ends with it: runs every case of s (CK_NORMAL; CK_RUN_SUITE and
 * CK_RUN_CASE pick as usual), frees the runner, then daemon_suite_fini() if daemon_suite_init()
 * ran. The process's exit status: EXIT_SUCCESS when no case failed, else EXIT_FAILURE. */
struct Suite;
int daemon_suite_run(struct Suite *s);

/* Makes d->dir (if still empty) and fills sock and log. 0 or -errno. */
int daemon_dir_init(struct daemon *d);
/* Takes d->sock's start lock (SOCK.lock, flock) as a kvcd that has not bound its socket yet
 * holds it (daemon_dir_init first); its path goes to lock (DAEMON_PATH_MAX + 8). The locked
 * descriptor (close it to let go), or -errno. */
int daemon_hold_start_lock(const struct daemon *d, char *lock);
/* Writes `text` into d->dir/name; the full path goes to path (DAEMON_PATH_MAX). */
int daemon_file_write(const struct daemon *d, const char *name, const char *text, char *path);

/* Starts kvcd with "-o server.socket=SOCK" and `args` (NULL-terminated, may be NULL) and
 * waits until it answers a HELLO. 0, or -errno with the daemon's log on stderr. */
int daemon_start(struct daemon *d, const char *const *args);
/* Starts kvcd like daemon_start but does not wait; the pid goes to *pid (not to d). */
int daemon_spawn(const struct daemon *d, const char *const *args, pid_t *pid);
/* SIGTERM and wait: kvcd's exit status (0..255), or -1 if it died of a signal or did not
 * stop in time (then it was killed). d->pid becomes 0. */
int daemon_stop(struct daemon *d);
/* Kills a running kvcd (SIGKILL) and removes d->dir with its files. */
void daemon_cleanup(struct daemon *d);
/* Whether kvcd is still running (it is our child: waitpid WNOHANG). */
bool daemon_alive(struct daemon *d);
/* Waits up to timeout_ms for kvcd to answer a HELLO. */
int daemon_wait_ready(const struct daemon *d, int timeout_ms);

/* Runs argv[0] (a path) with argv; stdout into out, stderr into err (each NUL-terminated,
 * either may be NULL). Exit status, or -1 for a signal or a timeout (then it was killed). */
int daemon_run(const char *const *argv, char *out, size_t outlen, char *err, size_t errlen,
               int timeout_ms);
/* kvcctl -s d->sock ARGS... (NULL-terminated), as daemon_run with a 20 s limit (scaled). */
int daemon_kvcctl(const struct daemon *d, char *out, size_t outlen, char *err, size_t errlen, ...)
    __attribute__((sentinel));

/* Forks a child that runs fn(arg) and _exit()s with its return value. Pid or -errno. */
pid_t daemon_child_spawn(int (*fn)(void *), void *arg);
/* Waits up to timeout_ms: exit status, -1 for a signal or a timeout (then it was killed).
 * *sig (may be NULL) gets the terminating signal, 0 if none. */
int daemon_child_wait(pid_t pid, int timeout_ms, int *sig);

/* Block bytes as a function of the key alone, so any process can check any block. */
void daemon_block_fill(const struct kvc_key *k, void *buf, size_t len);
/* -1 if buf is the block of k, else the offset of the first wrong byte. */
long daemon_block_check(const struct kvc_key *k, const void *buf, size_t len);
/* fp16 values of a block for the lossy codecs, n of them: a sine of amplitude 3 whose phase,
 * and a uniform [-1, 1) term on every element, come from the whole key (both words, mixed),
 * so q8_0 keeps them within 1 % RMS while another key's block is ~40 % off; and the
 * relative RMS error of got against them. */
void daemon_smooth_fill(const struct kvc_key *k, uint16_t *p, size_t n);
double daemon_smooth_err(const struct kvc_key *k, const uint16_t *got, size_t n);
/* The layout the suites use: `block_tokens` tokens of 1 KiB each (2 layers, K and V, 2 heads
 * of 64 fp16) — 16 tokens make a 16 KiB block. */
struct kvc_layout daemon_layout(const char *model_id, uint32_t block_tokens);
/* lay as NS_OPEN carries it (what kvc_ns_open sends; no window, no flags), for the suites
 * that speak the protocol themselves. */
struct kvc_wire_layout;
void daemon_wire_layout(const struct kvc_layout *lay, struct kvc_wire_layout *out);

struct config;
struct acl;
struct server_params;
/* The server limits of the suites that serve from their own process (check_e2e_gpu_fake,
 * check_e2e_adversary_pool: a store, its access lists and a server on sock, the kvcd defaults
 * for the per-uid limits, two WAITs a connection). */
void daemon_server_params(struct server_params *vp, const char *sock, uint32_t mode,
                          uint32_t max_clients, const struct config *cfg, struct acl *acl);
/* Keys of a chain of n blocks: the first `shared` blocks' tokens depend on `family` alone,
 * the rest on (family, variant) too, so chains of one family share a prefix. */
int daemon_chain_keys(const kvc_ns *ns, uint32_t family, uint32_t variant, uint32_t shared,
                      uint32_t n, struct kvc_key *keys);

/* A fresh client puts a 3-block chain (unique per call), gets it back and checks every byte.
 * 0 or a negative errno / -EILSEQ for wrong bytes. */
int daemon_roundtrip(const struct daemon *d);
/* One global counter through a fresh client. */
int daemon_stat(const struct daemon *d, const char *name, uint64_t *v);
/* How many times needle stands in the first MiB of d's log (0 when it cannot be read). */
int daemon_log_count(const struct daemon *d, const char *needle);
/* The same from a connected client. */
int daemon_client_stat(kvc_client *c, uint32_t scope, const char *name, uint64_t *v);

/* Whether s holds exactly one well-formed JSON value (and white space). */
bool daemon_json_valid(const char *s);
/* The first `"key": <unsigned integer>` in s. 0 or -ENOENT. */
int daemon_json_u64(const char *s, const char *key, uint64_t *v);

/* Milliseconds of CLOCK_MONOTONIC. */
uint64_t daemon_now_ms(void);

#endif
