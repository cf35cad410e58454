/*
 * check_e2e_kvcctl.c — kvcctl's commands against a real kvcd, in text and JSON, and its
 * exit codes (0 ok, 1 error, 2 usage): every rough edge a newcomer met (issue 29) as a case,
 * each error one line naming its cause; JSON outputs typed; the Prometheus exposition
 * linted by promtool (a SKIP without it); model ids with control characters refused.
 */
#include <check.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "tests/lib/daemon.h"

#define CT_OUT (1 << 17)

static struct daemon ct_d;
static char ct_out[CT_OUT], ct_err[CT_OUT];

static void ct_setup(void)
{
    static const char *const args[] = {"-o", "host.size=32m", "-o", "host.page_size=64k", NULL};
    memset(&ct_d, 0, sizeof(ct_d));
    ck_assert_int_eq(daemon_start(&ct_d, args), 0);
    ck_assert_int_eq(daemon_roundtrip(&ct_d), 0); /* one namespace with 3 blocks */
}

static void ct_teardown(void)
{
    ck_assert_int_eq(daemon_stop(&ct_d), 0);
    daemon_cleanup(&ct_d);
}

static uint64_t ct_json_u64(const char *key)
{
    uint64_t v = 0;
    ck_assert_msg(daemon_json_u64(ct_out, key, &v) == 0, "no \"%s\" in %s", key, ct_out);
    return v;
}

START_TEST(test_kvcctl_json_validator)
{
    /* The validator itself must be able to say no. */
    ck_assert(daemon_json_valid("{\"a\": [1, 2.5e3, -0, \"x\\n\", true, null], \"b\": {}}\n"));
    ck_assert(!daemon_json_valid("{\"a\": 1,}"));
    ck_assert(!daemon_json_valid("{\"a\" 1}"));
    ck_assert(!daemon_json_valid("[1, 2"));
    ck_assert(!daemon_json_valid("[01]"));
    ck_assert(!daemon_json_valid("{} {}"));
    ck_assert(!daemon_json_valid(""));
}
END_TEST

START_TEST(test_kvcctl_status)
{
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "status", NULL), 0);
    ck_assert_msg(strstr(ct_out, "kvcd pid") && strstr(ct_out, "host tier"), "%s", ct_out);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "--json", "status", NULL),
                     0);
    ck_assert_msg(daemon_json_valid(ct_out), "not JSON: %s", ct_out);
    ck_assert_uint_eq(ct_json_u64("pid"), (uint64_t)ct_d.pid);
    ck_assert_uint_eq(ct_json_u64("namespaces"), 1);
    ck_assert_uint_eq(ct_json_u64("blocks"), 3);
    ck_assert_uint_eq(ct_json_u64("clients"), 1);
    ck_assert_uint_ge(ct_json_u64("host_capacity"), 16u << 20);
    ck_assert_uint_ge(ct_json_u64("host_used"), 3 * 16384);
}
END_TEST

START_TEST(test_kvcctl_stats)
{
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "stats", NULL), 0);
    ck_assert_msg(strstr(ct_out, "total:") && strstr(ct_out, "committed_blocks") &&
                      strstr(ct_out, "e2e-roundtrip"),
                  "%s", ct_out);
    /* --json after the command works as well as before it. */
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "stats", "--json", NULL),
                     0);
    ck_assert_msg(daemon_json_valid(ct_out), "not JSON: %s", ct_out);
    ck_assert_uint_eq(ct_json_u64("committed_blocks"), 3);
    ck_assert_uint_eq(ct_json_u64("blocks_now"), 3);
    ck_assert_uint_eq(ct_json_u64("pins_now"), 0);
    ck_assert_uint_eq(ct_json_u64("reserved_now"), 0);
    ck_assert_ptr_nonnull(strstr(ct_out, "\"model\": \"e2e-roundtrip\""));
}
END_TEST

START_TEST(test_kvcctl_ns)
{
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ns", NULL), 0);
    ck_assert_msg(strstr(ct_out, "MODEL") && strstr(ct_out, "e2e-roundtrip") &&
                      strstr(ct_out, "fp16"),
                  "%s", ct_out);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "-j", "ns", NULL), 0);
    ck_assert_msg(daemon_json_valid(ct_out), "not JSON: %s", ct_out);
    ck_assert_uint_eq(ct_json_u64("id"), 1);
    ck_assert_uint_eq(ct_json_u64("layers"), 2);
    ck_assert_uint_eq(ct_json_u64("block_tokens"), 16);
    ck_assert_uint_eq(ct_json_u64("block_bytes"), 16384);
    ck_assert_uint_eq(ct_json_u64("blocks"), 3);
    ck_assert_ptr_nonnull(strstr(ct_out, "\"dtype\": \"fp16\""));
}
END_TEST

static size_t ct_count(const char *s, const char *what)
{
    size_t n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

START_TEST(test_kvcctl_ls)
{
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ls", NULL), 0);
    ck_assert_msg(strstr(ct_out, "KEY") && strstr(ct_out, "PARENT"), "%s", ct_out);
    ck_assert_uint_eq(ct_count(ct_out, "\n"), 4); /* header and 3 blocks */
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ls", "--json", NULL), 0);
    ck_assert_msg(daemon_json_valid(ct_out), "not JSON: %s", ct_out);
    ck_assert_uint_eq(ct_count(ct_out, "\"key\""), 3);
    ck_assert_uint_eq(ct_count(ct_out, "\"depth\": 0"), 1);
    ck_assert_uint_eq(ct_count(ct_out, "\"depth\": 2"), 1);
    ck_assert_uint_eq(ct_count(ct_out, "\"parent\": \"00000000000000000000000000000000\""), 1);
    ck_assert_int_eq(
        daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ls", "--json", "--limit", "2", NULL),
        0);
    ck_assert(daemon_json_valid(ct_out));
    ck_assert_uint_eq(ct_count(ct_out, "\"key\""), 2);
    ck_assert_int_eq(
        daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ls", "--json", "--ns", "7", NULL), 0);
    ck_assert(daemon_json_valid(ct_out));
    ck_assert_uint_eq(ct_count(ct_out, "\"key\""), 0);
}
END_TEST

/* kvc_get_prefix reports its copy time at release; the daemon adds it up beside the
 * recompute time the hits saved at cache.recompute_tokens_per_s (default 8000). */
START_TEST(test_load_vs_recompute_counters)
{
    uint64_t load0, load1, hit0, hit1, saved;
    ck_assert_int_eq(daemon_stat(&ct_d, "load_us", &load0), 0);
    ck_assert_int_eq(daemon_stat(&ct_d, "hit_tokens", &hit0), 0);
    for (int i = 0; i < 20; i++) /* 20 gets: each copy counts a microsecond at least */
        ck_assert_int_eq(daemon_roundtrip(&ct_d), 0);
    ck_assert_int_eq(daemon_stat(&ct_d, "load_us", &load1), 0);
    ck_assert_int_eq(daemon_stat(&ct_d, "hit_tokens", &hit1), 0);
    ck_assert_int_eq(daemon_stat(&ct_d, "recompute_saved_est_us", &saved), 0);
    ck_assert_uint_eq(hit1 - hit0, 20 * 3 * 16);
    ck_assert_uint_gt(load1, load0);
    ck_assert_uint_eq(saved, hit1 * 1000000 / 8000);
}
END_TEST

/* kvcctl tiers: no GPU stats and no disk here (rows say disabled), then a daemon with a
 * disk tier, in text and JSON, rates since start and between two samples. */
START_TEST(test_kvcctl_tiers)
{
    struct daemon dd;
    char opt[DAEMON_PATH_MAX + 32];
    ck_assert_int_eq(
        daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "tiers", "--interval", "0.2", NULL),
        0);
    ck_assert_msg(strstr(ct_out, "TIER") && strstr(ct_out, "gpu   disabled") &&
                      strstr(ct_out, "\nhost ") && strstr(ct_out, "disk  disabled"),
                  "%s", ct_out);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "--json", "tiers",
                                   "--interval", "0", NULL),
                     0);
    ck_assert_msg(daemon_json_valid(ct_out), "not JSON: %s", ct_out);
    ck_assert_msg(strstr(ct_out, "{\"tier\": \"gpu\", \"enabled\": false}"), "%s", ct_out);
    ck_assert_uint_ge(ct_json_u64("capacity"), 16u << 20); /* the host row comes first */
    ck_assert_uint_eq(ct_json_u64("blocks"), 3);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "tiers", "--bogus", NULL),
                     2);

    memset(&dd, 0, sizeof(dd));
    snprintf(opt, sizeof(opt), "disk.path=%s/disk.kvc", ct_d.dir);
    const char *const args[] = {"-o", "host.size=16m",    "-o", "host.page_size=64k", "-o", opt,
                                "-o", "disk.capacity=8m", "-o", "disk.page=1m",       NULL};
    ck_assert_int_eq(daemon_start(&dd, args), 0);
    ck_assert_int_eq(
        daemon_kvcctl(&dd, ct_out, CT_OUT, ct_err, CT_OUT, "tiers", "--interval", "0.1", NULL), 0);
    ck_assert_msg(strstr(ct_out, "\ndisk ") && strstr(ct_out, "8.0 MiB") &&
                      !strstr(ct_out, "disk  disabled"),
                  "%s", ct_out);
    ck_assert_int_eq(daemon_kvcctl(&dd, ct_out, CT_OUT, ct_err, CT_OUT, "tiers", "--json", NULL),
                     0);
    ck_assert_msg(daemon_json_valid(ct_out), "not JSON: %s", ct_out);
    const char *drow = strstr(ct_out, "\"tier\": \"disk\"");
    ck_assert_msg(drow && strstr(drow, "\"capacity\": 8388608") && strstr(drow, "\"pages\": 8") &&
                      strstr(drow, "\"checksum_failures\": 0") &&
                      strstr(drow, "\"write_bytes_per_s\": "),
                  "%s", ct_out);
    ck_assert_int_eq(daemon_stop(&dd), 0);
    daemon_cleanup(&dd);
}
END_TEST

START_TEST(test_kvcctl_exit_codes)
{
    struct daemon none = {0};
    static const char *const cmds[] = {"status", "stats", "ns", "ls"};
    ck_assert_int_eq(daemon_dir_init(&none), 0); /* an empty directory: nobody listens */
    for (size_t i = 0; i < 4; i++) {
        ck_assert_int_eq(daemon_kvcctl(&none, ct_out, CT_OUT, ct_err, CT_OUT, cmds[i], NULL), 1);
        ck_assert_msg(strstr(ct_err, "cannot reach kvcd"), "%s: %s", cmds[i], ct_err);
        ck_assert_int_eq(
            daemon_kvcctl(&none, ct_out, CT_OUT, ct_err, CT_OUT, "--json", cmds[i], NULL), 1);
    }
    daemon_cleanup(&none);
    /* Usage errors, with the daemon there. */
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, NULL), 2);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "frobnicate", NULL), 2);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "--bogus", "stats", NULL),
                     2);
    ck_assert_int_eq(
        daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ls", "--limit", "x", NULL), 2);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ls", "--ns", "0", NULL),
                     2);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "help", NULL), 0);
    ck_assert_ptr_nonnull(strstr(ct_out, "usage: kvcctl"));
}
END_TEST

/* kvcctl -s PATH status (as uid, through setpriv, when uid is not 0): exit 1 and one line
 * on stderr holding cause. */
static void ct_connect_says(const char *path, unsigned uid, const char *cause)
{
    char ids[32];
    snprintf(ids, sizeof(ids), "%u", uid);
    const char *plain[] = {DAEMON_KVCCTL, "-s", path, "status", NULL};
    const char *as_uid[] = {"/usr/bin/setpriv", "--reuid", ids,  "--regid", ids, "--clear-groups",
                            DAEMON_KVCCTL,      "-s",      path, "status",  NULL};
    int rc = daemon_run(uid ? as_uid : plain, ct_out, CT_OUT, ct_err, CT_OUT, daemon_ms(20000));
    ck_assert_msg(rc == 1, "kvcctl -s %s: exit %d\n%s", path, rc, ct_err);
    ck_assert_msg(ct_count(ct_err, "\n") == 1, "not one line: '%s'", ct_err);
    ck_assert_msg(strstr(ct_err, cause), "kvcctl -s %s: '%s' does not say '%s'", path, ct_err,
                  cause);
}

/* kvcctl's "cannot reach kvcd" names the real cause: a directory or a plain file given as the
 * socket was called "a stale socket", a socket directory the user may not enter was blamed
 * on the socket's mode, a path too long for a socket address said "File name too long". */
START_TEST(test_kvcctl_connect_errors_named)
{
    char path[2 * DAEMON_PATH_MAX], name[128], cmd[3 * DAEMON_PATH_MAX];
    ct_connect_says(ct_d.dir, 0, "not a socket but a directory");
    ck_assert_int_eq(daemon_file_write(&ct_d, "plain", "x\n", path), 0);
    ct_connect_says(path, 0, "not a socket but a regular file");
    snprintf(path, sizeof(path), "%s/nothing.sock", ct_d.dir);
    ct_connect_says(path, 0, "no socket there (kvcd not running");
    memset(name, 'x', 120);
    name[120] = 0;
    snprintf(path, sizeof(path), "%s/%s", ct_d.dir, name);
    ct_connect_says(path, 0, "longer than a Unix socket's 107 bytes");
    /* A stale socket: bound, then nobody listens. */
    snprintf(path, sizeof(path), "%s/stale.sock", ct_d.dir);
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 -c 'import socket; socket.socket(socket.AF_UNIX, "
             "socket.SOCK_SEQPACKET).bind(\"%s\")'",
             path);
    const char *sh[] = {"/bin/sh", "-c", cmd, NULL};
    ck_assert_int_eq(daemon_run(sh, ct_out, CT_OUT, ct_err, CT_OUT, daemon_ms(20000)), 0);
    ct_connect_says(path, 0, "nothing listens there (a stale socket");
    if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
        printf("SKIP: e2e_kvcctl: test_kvcctl_connect_errors_named: permissions need root and "
               "setpriv\n");
        return;
    }
    /* Another user: first the private directory (0700) stops it, then the socket's mode. */
    char parent[DAEMON_PATH_MAX];
    snprintf(parent, sizeof(parent), "%s", ct_d.dir);
    *strrchr(parent, '/') = 0;
    ck_assert_int_eq(chmod(parent, 0711), 0);
    ct_connect_says(ct_d.sock, 65502, "may not enter the directory");
    ck_assert_int_eq(chmod(ct_d.dir, 0711), 0);
    ct_connect_says(ct_d.sock, 65502, "permission denied (the socket's group or mode");
}
END_TEST

/* Whether a process holds the flock on `lock`, as kvcctl reads it (/proc/locks: taking the
 * lock to see would stop a starting kvcd). */
static bool ct_lock_held(const char *lock)
{
    char line[256];
    struct stat st;
    bool held = false;
    FILE *f;
    if (stat(lock, &st) != 0 || !(f = fopen("/proc/locks", "re")))
        return false;
    while (!held && fgets(line, sizeof(line), f)) {
        unsigned maj, min;
        unsigned long ino;
        held = sscanf(line, "%*d: FLOCK %*s %*s %*d %x:%x:%lu", &maj, &min, &ino) == 3 &&
               ino == st.st_ino && maj == major(st.st_dev) && min == minor(st.st_dev);
    }
    fclose(f);
    return held;
}

/* `kvcd & kvcctl status`, as docs/getting-started.md has it: kvcctl waits for a kvcd that
 * holds its socket's start lock but has not bound the socket yet (it said "no socket there
 * (kvcd not running ...)"), and after 10 s says that kvcd is still starting, naming its pid. */
START_TEST(test_kvcctl_waits_for_a_starting_kvcd)
{
    static const char *const args[] = {"-o", "host.size=1g", NULL};
    struct daemon d = {0};
    char lock[DAEMON_PATH_MAX + 8], want[64];
    pid_t pid;
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    /* This process as a kvcd that never gets to bind. */
    int fd = daemon_hold_start_lock(&d, lock);
    ck_assert_int_ge(fd, 0);
    uint64_t t0 = daemon_now_ms();
    ck_assert_int_eq(daemon_kvcctl(&d, ct_out, CT_OUT, ct_err, CT_OUT, "status", NULL), 1);
    ck_assert_uint_ge(daemon_now_ms() - t0, 9000);
    snprintf(want, sizeof(want), "kvcd (pid %d) is still starting", (int)getpid());
    ck_assert_msg(strstr(ct_err, want), "'%s' does not say '%s'", ct_err, want);
    close(fd);
    unlink(lock);
    /* A real start: kvcctl runs once kvcd holds its lock (not merely created the file: kvcd
     * opens it, then locks it), while it makes its arena. */
    ck_assert_int_eq(daemon_spawn(&d, args, &pid), 0);
    while (!ct_lock_held(lock) && daemon_now_ms() - t0 < (uint64_t)daemon_ms(30000))
        usleep(1000);
    ck_assert_int_eq(daemon_kvcctl(&d, ct_out, CT_OUT, ct_err, CT_OUT, "status", NULL), 0);
    d.pid = pid;
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* kvcctl ARGS... (NULL-terminated, at most 8) against ct_d; checks the exit status, and for a
 * failure that stderr is one line holding `cause`. */
static void ct_expect(int want, const char *cause, const char *a0, const char *a1, const char *a2,
                      const char *a3)
{
    int rc = daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, a0, a1, a2, a3, NULL);
    ck_assert_msg(rc == want, "kvcctl %s %s %s %s: exit %d, not %d\n%s%s", a0, a1 ? a1 : "",
                  a2 ? a2 : "", a3 ? a3 : "", rc, want, ct_out, ct_err);
    if (want == 0)
        return;
    ck_assert_msg(ct_count(ct_err, "\n") == 1 && ct_err[strlen(ct_err) - 1] == '\n',
                  "kvcctl %s %s: not one line: '%s'", a0, a1 ? a1 : "", ct_err);
    ck_assert_msg(strstr(ct_err, cause), "kvcctl %s %s %s: '%s' does not say '%s'", a0,
                  a1 ? a1 : "", a2 ? a2 : "", ct_err, cause);
}

/* Puts a chain of n blocks in namespace model; 0. */
static void ct_put_chain(const char *model, uint32_t n)
{
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_layout lay = daemon_layout(model, 16);
    struct kvc_key keys[64];
    static uint8_t buf[64][16384];
    const void *blocks[64];
    ck_assert_uint_le(n, 64);
    ck_assert_int_eq(kvc_connect(ct_d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    ck_assert_uint_eq(kvc_ns_block_bytes(ns), sizeof(buf[0]));
    ck_assert_int_eq(daemon_chain_keys(ns, 7, 0, 0, n, keys), 0);
    for (uint32_t i = 0; i < n; i++) {
        daemon_block_fill(&keys[i], buf[i], sizeof(buf[i]));
        blocks[i] = buf[i];
    }
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, keys, n, blocks), (int)n);
    ck_assert_int_eq(kvc_flush(c), 0);
    kvc_disconnect(c);
}

/* `kvcctl show` of a prefix two keys start with: refused at once, naming two of them, the
 * blocks not listed; of a whole key: that block. (It printed every match and exited 0.) */
START_TEST(test_kvcctl_show_ambiguous_prefix)
{
    char keys[40][33], pre[2] = "", full[33];
    size_t nk = 0;
    ct_put_chain("e2e-show", 20); /* 23 keys: two share a first digit */
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "ls", "--json", NULL), 0);
    for (const char *p = strstr(ct_out, "\"key\": \""); p && nk < 40;
         p = strstr(p + 1, "\"key\": \""))
        snprintf(keys[nk++], sizeof(keys[0]), "%.32s", p + 8);
    ck_assert_uint_eq(nk, 23);
    for (size_t i = 0; i < nk && !pre[0]; i++)
        for (size_t j = i + 1; j < nk; j++)
            if (keys[i][0] == keys[j][0])
                pre[0] = keys[i][0];
    ck_assert(pre[0]);
    ct_expect(1, "is ambiguous", "show", pre, NULL, NULL);
    ck_assert_str_eq(ct_out, "");
    snprintf(full, sizeof(full), "%s", keys[5]);
    ct_expect(0, NULL, "show", full, NULL, NULL);
    ck_assert_ptr_nonnull(strstr(ct_out, full));
    ck_assert_uint_eq(ct_count(ct_out, "key          "), 1);
    ct_expect(1, "no cached block has a key equal to", "show", "0123456789abcdef0123456789abcdef",
              NULL, NULL);
    ct_expect(2, "hex digits", "show", "zz", NULL, NULL);
}
END_TEST

/* Usage errors say which argument and why (they exited 2 in silence, or listed nothing and
 * exited 0); --help works per command; errors name their real cause. */
START_TEST(test_kvcctl_usage_errors_named)
{
    ct_expect(2, "--count", "top", "--count", "-1", NULL);
    ct_expect(2, "--interval", "tiers", "--interval", "x", NULL);
    ct_expect(2, "--interval", "top", "--interval", "0", NULL);
    ct_expect(2, "--tier takes gpu, host or disk, not 'ssd'", "ls", "--tier", "ssd", NULL);
    ct_expect(2, "--codec", "ls", "--codec", "zzz", NULL);
    ct_expect(2, "--prefix", "ls", "--prefix", "xyz", NULL);
    ct_expect(2, "unknown option --bogus", "ls", "--bogus", NULL, NULL);
    ct_expect(2, "--ns needs a value", "ls", "--ns", NULL, NULL);
    ct_expect(2, "takes no arguments", "status", "extra", NULL, NULL);
    ct_expect(2, "unknown command", "frobnicate", NULL, NULL, NULL);
    static const char *const cmds[] = {"ls",     "show",  "top", "tiers",  "config",
                                       "policy", "evict", "ns",  "status", "metrics"};
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        char want[64];
        ct_expect(0, NULL, cmds[i], "--help", NULL, NULL);
        snprintf(want, sizeof(want), "usage: kvcctl [-s SOCKET] [--json] %s", cmds[i]);
        ck_assert_msg(strstr(ct_out, want), "%s --help: %s", cmds[i], ct_out);
        ct_expect(0, NULL, "help", cmds[i], NULL, NULL);
        ck_assert(strstr(ct_out, want));
    }
    ct_expect(1, "no option named nope.key", "config", "get", "nope.key", NULL);
    ck_assert_ptr_null(strstr(ct_err, "no daemon"));
    ct_expect(1, "did you mean host.size?", "config", "get", "host.siz", NULL);
    /* a restart-only option, asked by root: not a permission error */
    ct_expect(1, "host.size cannot change", "config", "set", "host.size", "64m");
    ck_assert_ptr_null(strstr(ct_err, "not root"));
    ck_assert_ptr_null(strstr(ct_err, "not permitted"));
    kvc_client *c;
    char msg[256];
    ck_assert_int_eq(kvc_connect(ct_d.sock, &c), 0);
    ck_assert_int_eq(kvc_config_set(c, "host.size", "64m", msg, sizeof(msg)), -EROFS);
    kvc_disconnect(c);
}
END_TEST

/* JSON: config values typed, metric labels an object, top one object per line. */
START_TEST(test_kvcctl_json_typed)
{
    ct_expect(0, NULL, "--json", "config", "get", NULL);
    ck_assert_msg(daemon_json_valid(ct_out), "not JSON: %s", ct_out);
    ck_assert_msg(strstr(ct_out, "\"host.size\": 33554432,") &&
                      strstr(ct_out, "\"host.page_size\": 65536,") &&
                      strstr(ct_out, "\"cache.policy\": \"default\"") &&
                      (strstr(ct_out, "\"host.prefault\": true") ||
                       strstr(ct_out, "\"host.prefault\": false")) &&
                      strstr(ct_out, "\"server.hello_timeout\": 5000,"),
                  "%s", ct_out);
    ct_expect(0, NULL, "--json", "config", "get", "host.size");
    ck_assert_str_eq(ct_out, "{\"host.size\": 33554432}\n");
    ct_expect(0, NULL, "--json", "metrics", NULL, NULL);
    ck_assert_msg(daemon_json_valid(ct_out), "not JSON: %.2000s", ct_out);
    ck_assert_msg(strstr(ct_out, "\"labels\": {\"namespace\": \"e2e-roundtrip\"}"), "%.3000s",
                  ct_out);
    ck_assert_ptr_nonnull(strstr(ct_out, "\"labels\": {}"));
    ct_expect(0, NULL, "--json", "top", "--count", "2");
    ck_assert_uint_eq(ct_count(ct_out, "\n"), 2);
    char *nl = strchr(ct_out, '\n');
    *nl = 0;
    ck_assert_msg(daemon_json_valid(ct_out) && daemon_json_valid(nl + 1), "%s", ct_out);
}
END_TEST

/* ---- the --json outputs' shapes --------------------------------------------------------
 * Every --json output, as its layout and types: ct_shape() writes a value as its type (int,
 * real, str, bool, null), an object as its keys in order with their shapes, a list as the
 * distinct shapes of its items (sorted, joined by |), and the objects that map names to
 * values (stats' counters, metric labels, config get's options) as {*:the distinct shapes of
 * their values}. The expected shapes below were taken from kvcctl's hand-written JSON before
 * kvcctl wrote it with jansson, so a change of a key, its order or a value's type fails here.
 * ct_layout_same() checks the text itself is laid out as jansson lays it out (", " and ": "
 * between members, one line per document), numbers aside (a %.4f ratio and a real jansson
 * writes differ in digits only). */

static int ct_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool ct_is_map(const char *key)
{
    static const char *const maps[] = {"total", "stats", "labels", "*"};
    for (size_t i = 0; key && i < sizeof(maps) / sizeof(maps[0]); i++)
        if (strcmp(key, maps[i]) == 0)
            return true;
    return false;
}

/* The distinct strings of parts[0..n) sorted, joined by | into out; frees parts. */
static void ct_join(char **parts, size_t n, char *out, size_t cap)
{
    size_t len = 0;
    qsort(parts, n, sizeof(parts[0]), ct_cmp_str);
    out[0] = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || strcmp(parts[i], parts[i - 1]) != 0)
            len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, "%s%s", len ? "|" : "",
                                    parts[i]);
    }
    for (size_t i = 0; i < n; i++)
        free(parts[i]);
    free(parts);
    ck_assert_uint_lt(len, cap);
}

/* The shape of v (the value of key, NULL at the top) into out. */
static void ct_shape(const json_t *v, const char *key, char *out, size_t cap)
{
    char sub[4096];
    size_t len = 0, n = 0;
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *m;
        if (ct_is_map(key)) {
            char **parts = calloc(json_object_size(v) + 1, sizeof(char *));
            json_object_foreach((json_t *)v, k, m)
            {
                ct_shape(m, k, sub, sizeof(sub));
                parts[n++] = strdup(sub);
            }
            ct_join(parts, n, sub, sizeof(sub));
            len = (size_t)snprintf(out, cap, "{*:%s}", sub);
            break;
        }
        len = (size_t)snprintf(out, cap, "{");
        json_object_foreach((json_t *)v, k, m)
        {
            ct_shape(m, k, sub, sizeof(sub));
            len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, "%s%s:%s", n++ ? "," : "",
                                    k, sub);
        }
        len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, "}");
        break;
    }
    case JSON_ARRAY: {
        char **parts = calloc(json_array_size(v) + 1, sizeof(char *));
        for (size_t i = 0; i < json_array_size(v); i++) {
            ct_shape(json_array_get(v, i), NULL, sub, sizeof(sub));
            parts[n++] = strdup(sub);
        }
        ct_join(parts, n, sub, sizeof(sub));
        len = (size_t)snprintf(out, cap, "[%s]", sub);
        break;
    }
    case JSON_STRING:
        len = (size_t)snprintf(out, cap, "str");
        break;
    case JSON_INTEGER:
        len = (size_t)snprintf(out, cap, "int");
        break;
    case JSON_REAL:
        len = (size_t)snprintf(out, cap, "real");
        break;
    case JSON_TRUE:
    case JSON_FALSE:
        len = (size_t)snprintf(out, cap, "bool");
        break;
    case JSON_NULL:
        len = (size_t)snprintf(out, cap, "null");
        break;
    }
    ck_assert_uint_lt(len, cap);
}

/* s with every number outside strings written as I (integer) or R (real), into out. */
static void ct_numbers_out(const char *s, char *out, size_t cap)
{
    size_t o = 0;
    bool in_str = false;
    for (; *s && o + 1 < cap; s++) {
        if (in_str) {
            out[o++] = *s;
            if (*s == '\\' && s[1])
                out[o++] = *++s;
            else if (*s == '"')
                in_str = false;
        } else if (*s == '-' || (*s >= '0' && *s <= '9')) {
            bool real = false;
            for (; *s && strchr("-+.eE0123456789", *s); s++)
                real |= *s == '.' || *s == 'e' || *s == 'E';
            out[o++] = real ? 'R' : 'I';
            s--;
        } else {
            in_str = *s == '"';
            out[o++] = *s;
        }
    }
    out[o] = 0;
}

/* Whether text (one JSON document and a newline) is laid out as jansson writes doc. */
static bool ct_layout_same(const char *text, const json_t *doc)
{
    static char a[CT_OUT], b[CT_OUT];
    char *dump = json_dumps(doc, JSON_ENCODE_ANY);
    bool same;
    ck_assert_ptr_nonnull(dump);
    ct_numbers_out(text, a, sizeof(a));
    ct_numbers_out(dump, b, sizeof(b) - 1);
    strcat(b, "\n");
    same = strcmp(a, b) == 0;
    if (!same)
        fprintf(stderr, "kvcctl wrote:\n%s\njansson writes:\n%s\n", a, b);
    free(dump);
    return same;
}

/* Runs kvcctl --json ARGS against d; checks each line of its output is a JSON document laid
 * out as jansson writes it, whose shape (the `root` key: "*" for a map) is want. */
static void ct_json_shape(const struct daemon *d, const char *root, const char *want,
                          const char *a0, const char *a1, const char *a2, const char *a3)
{
    static char got[1 << 14];
    int rc = daemon_kvcctl(d, ct_out, CT_OUT, ct_err, CT_OUT, "--json", a0, a1, a2, a3, NULL);
    ck_assert_msg(rc == 0, "kvcctl --json %s: exit %d: %s", a0, rc, ct_err);
    for (char *line = ct_out, *nl; *line; line = nl + 1) {
        json_error_t err;
        nl = strchr(line, '\n');
        ck_assert_msg(nl, "kvcctl --json %s: no newline after %s", a0, line);
        *nl = 0;
        json_t *doc = json_loads(line, JSON_DECODE_ANY, &err);
        ck_assert_msg(doc, "kvcctl --json %s: not JSON (%s): %s", a0, err.text, line);
        *nl = '\n';
        char save = nl[1];
        nl[1] = 0;
        ck_assert_msg(ct_layout_same(line, doc), "kvcctl --json %s %s: layout differs", a0,
                      a1 ? a1 : "");
        nl[1] = save;
        ct_shape(doc, root, got, sizeof(got));
        ck_assert_msg(strcmp(got, want) == 0, "kvcctl --json %s %s:\n got  %s\n want %s", a0,
                      a1 ? a1 : "", got, want);
        json_decref(doc);
    }
}

START_TEST(test_kvcctl_json_shapes)
{
    struct daemon dd;
    char opt[DAEMON_PATH_MAX + 32], key[33];
    ct_json_shape(&ct_d, NULL,
                  "{pid:int,socket:str,uptime_s:int,clients:int,namespaces:int,blocks:int,"
                  "host_used:int,host_capacity:int,tokens_requested:int,tokens_hit:int,"
                  "token_hit_ratio:real,load_us:int,recompute_saved_est_us:int,host_faulted:int,"
                  "host_arenas_bytes:int}",
                  "status", NULL, NULL, NULL);
    ct_json_shape(&ct_d, NULL, "{total:{*:int},namespaces:[{id:int,model:str,stats:{*:int}}]}",
                  "stats", NULL, NULL, NULL);
    ct_json_shape(&ct_d, NULL,
                  "[{id:int,model:str,layers:int,kv_heads:int,head_dim:int,block_tokens:int,"
                  "dtype:str,kv_kind:str,window_tokens:int,block_bytes:int,blocks:int,bytes:int,"
                  "arena:int}]",
                  "ns", NULL, NULL, NULL);
    ct_json_shape(&ct_d, NULL,
                  "[{ns:int,kind:str,key:str,parent:str,depth:int,bytes:int,hits:int,pins:int,"
                  "children:int,last_access_ms:int,tier:str,codec:str}]",
                  "ls", NULL, NULL, NULL);
    ct_json_shape(&ct_d, NULL, "[]", "ls", "--ns", "7", NULL);
    ck_assert_int_eq(daemon_kvcctl(&ct_d, ct_out, CT_OUT, ct_err, CT_OUT, "--json", "ls", NULL), 0);
    snprintf(key, sizeof(key), "%.32s", strstr(ct_out, "\"key\": \"") + 8);
    ct_json_shape(&ct_d, NULL,
                  "[{ns:int,model:str,kind:str,key:str,parent:str,depth:int,bytes:int,tokens:int,"
                  "hits:int,pins:int,children:int,last_access_ms:int,tier:str,arena:int,"
                  "codec:str}]",
                  "show", key, NULL, NULL);
    ct_json_shape(&ct_d, NULL,
                  "[{id:int,pid:int,uid:int,gid:int,name:str,leases:int,reservations:int,"
                  "pins:int,reserved_bytes:int,requests:int,lookup_tokens:int,hit_tokens:int,"
                  "bytes_in:int,bytes_out:int,errors:int,refusals:int,admin:bool,self:bool}]",
                  "clients", NULL, NULL, NULL);
    ct_json_shape(&ct_d, NULL,
                  "{policy:str,namespaces:[{ns:int,model:str,policy:str,source:str,"
                  "ladder:{}}]}",
                  "policy", NULL, NULL, NULL);
    ct_json_shape(&ct_d, NULL, "{ns:int,policy:str}", "policy", "--ns", "1", NULL);
    ct_json_shape(&ct_d, "*", "{*:bool|int|real|str}", "config", "get", NULL, NULL);
    ct_json_shape(&ct_d, NULL, "{host.size:int}", "config", "get", "host.size", NULL);
    ct_json_shape(&ct_d, NULL, "{applied:bool,key:str,value:str}", "config", "set", "cache.policy",
                  "lru");
    ct_json_shape(&ct_d, NULL,
                  "[{name:str,labels:{*:str},value:int}|{name:str,labels:{*:str},value:real}|"
                  "{name:str,labels:{*:},value:int}|{name:str,labels:{*:},value:real}]",
                  "metrics", NULL, NULL, NULL);
    ct_json_shape(&ct_d, NULL,
                  "{token_hit_ratio:real,tokens_requested:int,tokens_hit:int,"
                  "tokens_requested_per_s:real,tokens_hit_per_s:real,lookups_per_s:real,"
                  "bytes_in_per_s:int,bytes_out_per_s:int,evicted_per_s:real,host_used:int,"
                  "host_capacity:int,clients:int}",
                  "top", "--count", "2", "--interval=0.05");
    ct_json_shape(&ct_d, NULL,
                  "{interval_s:real,tiers:[{tier:str,enabled:bool,capacity:int,used:int,"
                  "blocks:int,pages:null,fragmentation_pct:null,reads_inflight:null,"
                  "writes_inflight:null,errors:null,checksum_failures:null,"
                  "read_bytes_per_s:int,write_bytes_per_s:int}|{tier:str,enabled:bool}]}",
                  "tiers", "--interval", "0.05", NULL);
    ct_json_shape(&ct_d, NULL, "{evicted_blocks:int}", "evict", "--ns", "1", NULL);
    ct_json_shape(&ct_d, NULL, "{dropped:int,blocks:int}", "ns", "drop", "1", NULL);

    memset(&dd, 0, sizeof(dd));
    snprintf(opt, sizeof(opt), "disk.path=%s/disk.kvc", ct_d.dir);
    const char *const args[] = {"-o", "host.size=16m",    "-o", "host.page_size=64k", "-o", opt,
                                "-o", "disk.capacity=8m", "-o", "disk.page=1m",       NULL};
    ck_assert_int_eq(daemon_start(&dd, args), 0);
    ck_assert_int_eq(daemon_roundtrip(&dd), 0);
    ct_json_shape(&dd, NULL,
                  "{interval_s:real,tiers:[{tier:str,enabled:bool,capacity:int,used:int,"
                  "blocks:int,pages:int,fragmentation_pct:int,reads_inflight:int,"
                  "writes_inflight:int,errors:int,checksum_failures:int,read_bytes_per_s:int,"
                  "write_bytes_per_s:int}|{tier:str,enabled:bool,capacity:int,used:int,"
                  "blocks:int,pages:null,fragmentation_pct:null,reads_inflight:null,"
                  "writes_inflight:null,errors:null,checksum_failures:null,"
                  "read_bytes_per_s:int,write_bytes_per_s:int}|{tier:str,enabled:bool}]}",
                  "tiers", "--interval", "0", NULL);
    ct_json_shape(&dd, NULL, "{applied:bool,message:str}", "reload", NULL, NULL, NULL);
    ct_json_shape(&dd, NULL, "{stopping:bool}", "shutdown", NULL, NULL, NULL);
    ck_assert_int_eq(daemon_child_wait(dd.pid, daemon_ms(30000), NULL), 0); /* exits 0 itself */
    dd.pid = 0;
    daemon_cleanup(&dd);
}
END_TEST

/* Whether every line of ct_out that is not empty has the length of the first. */
static bool ct_rows_aligned(void)
{
    size_t first = strcspn(ct_out, "\n");
    for (const char *p = ct_out; *p; p += strcspn(p, "\n") + (p[strcspn(p, "\n")] != 0))
        if (strcspn(p, "\n") != first)
            return false;
    return true;
}

/* A real Hugging Face id with a revision (77 characters) keeps the ns table's columns. */
START_TEST(test_kvcctl_long_model_id_columns)
{
    static const char id[] =
        "meta-llama/Meta-Llama-3.1-70B-Instruct@0e9e39f249a16976918f6564b8830bc894c89659";
    ct_put_chain(id, 2);
    ct_expect(0, NULL, "ns", NULL, NULL, NULL);
    ck_assert_ptr_nonnull(strstr(ct_out, id));
    ck_assert_msg(ct_rows_aligned(), "rows of different widths:\n%s", ct_out);
    /* policy: every row's POLICY column starts where its header does */
    ct_expect(0, NULL, "policy", NULL, NULL, NULL);
    const char *head = strstr(ct_out, "NS ");
    ck_assert_ptr_nonnull(head);
    size_t col = (size_t)(strstr(head, "POLICY") - head), rows = 0;
    for (const char *p = strchr(head, '\n') + 1; *p; p = strchr(p, '\n') + 1, rows++)
        ck_assert_msg(strlen(p) > col && p[col - 1] == ' ' && p[col] != ' ' &&
                          strncmp(p + col, "default", 7) == 0,
                      "a row out of its columns:\n%s", ct_out);
    ck_assert_uint_eq(rows, 2);
}
END_TEST

/* Ids with a newline or tab are refused at NS_OPEN (EINVAL), and nothing of them shows. */
START_TEST(test_ns_open_control_characters_refused)
{
    static const char *const bad[] = {"evil\nkvcd_fake_total 1", "tab\there", "bell\a", "del\x7f"};
    kvc_client *c;
    kvc_ns *ns;
    ck_assert_int_eq(kvc_connect(ct_d.sock, &c), 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct kvc_layout lay = daemon_layout(bad[i], 16);
        ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), -EINVAL);
    }
    kvc_disconnect(c);
    ct_expect(0, NULL, "--json", "ns", NULL, NULL);
    ck_assert_uint_eq(ct_count(ct_out, "\"id\""), 1); /* e2e-roundtrip alone */
    FILE *f = fopen(ct_d.log, "re");
    char line[512];
    bool said = false;
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f))
        said |= strstr(line, "model id holds a control character") != NULL;
    fclose(f);
    ck_assert(said);
}
END_TEST

/* `promtool check metrics` (Debian's prometheus) passes the exposition: counters end in
 * _total, times in seconds (seven kvcd_client_* counters and kvcd_load_us_total failed). */
START_TEST(test_metrics_promtool)
{
    char cmd[1200];
    ct_put_chain("e2e-prom", 3);
    snprintf(cmd, sizeof(cmd),
             "'%s' -s '%s' metrics > '%s/m.prom' && promtool check metrics < '%s/m.prom' 2>&1",
             DAEMON_KVCCTL, ct_d.sock, ct_d.dir, ct_d.dir);
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    int rc = daemon_run(argv, ct_out, CT_OUT, ct_err, CT_OUT, daemon_ms(60000));
    ck_assert_msg(rc == 0, "promtool: exit %d\n%s%s", rc, ct_out, ct_err);
    snprintf(cmd, sizeof(cmd),
             "grep -c '^kvcd_client_requests_total{\\|^kvcd_load_seconds_total ' "
             "'%s/m.prom'",
             ct_d.dir);
    rc = daemon_run(argv, ct_out, CT_OUT, ct_err, CT_OUT, daemon_ms(60000));
    ck_assert_int_eq(rc, 0);
    ck_assert_int_ge(atoi(ct_out), 2);
}
END_TEST

static bool ct_have_promtool(void)
{
    const char *argv[] = {"/bin/sh", "-c", "command -v promtool", NULL};
    return daemon_run(argv, ct_out, CT_OUT, ct_err, CT_OUT, 10000) == 0;
}

int main(void)
{
    Suite *s = suite_create("e2e_kvcctl");
    TCase *tc = tcase_create("kvcctl");
    tcase_set_timeout(tc, daemon_slow() * 60);
    tcase_add_checked_fixture(tc, ct_setup, ct_teardown);
    tcase_add_test(tc, test_kvcctl_json_validator);
    tcase_add_test(tc, test_kvcctl_status);
    tcase_add_test(tc, test_kvcctl_tiers);
    tcase_add_test(tc, test_kvcctl_stats);
    tcase_add_test(tc, test_kvcctl_ns);
    tcase_add_test(tc, test_kvcctl_ls);
    tcase_add_test(tc, test_kvcctl_exit_codes);
    tcase_add_test(tc, test_kvcctl_connect_errors_named);
    tcase_add_test(tc, test_kvcctl_waits_for_a_starting_kvcd);
    tcase_add_test(tc, test_load_vs_recompute_counters);
    tcase_add_test(tc, test_kvcctl_show_ambiguous_prefix);
    tcase_add_test(tc, test_kvcctl_usage_errors_named);
    tcase_add_test(tc, test_kvcctl_json_typed);
    tcase_add_test(tc, test_kvcctl_json_shapes);
    tcase_add_test(tc, test_kvcctl_long_model_id_columns);
    tcase_add_test(tc, test_ns_open_control_characters_refused);
    if (ct_have_promtool())
        tcase_add_test(tc, test_metrics_promtool);
    else
        printf("SKIP: e2e_kvcctl: test_metrics_promtool: promtool not installed (Debian's "
               "prometheus package, etc/install-deps.sh test)\n");
    suite_add_tcase(s, tc);
    if (daemon_suite_init("e2e-kvcctl"))
        return 1;
    return daemon_suite_run(s);
}
