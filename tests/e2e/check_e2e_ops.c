/*
 * check_e2e_ops.c — operating kvcd end to end: every kvcctl command against the real daemon
 * (text and --json), reload accepted and refused, the systemd notify protocol on our own
 * NOTIFY_SOCKET, access lists under another uid (setpriv, root only), quotas, the
 * [namespace.*] configuration, `make install DESTDIR=...` and `systemd-analyze verify`.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/kvc.h"
#include "client/libkvc_internal.h"
#include "daemon/config.h"
#include "daemon/config_ns.h"
#include "tests/lib/daemon.h"
#include "tests/lib/ops_util.h"

#define BLOCK_TOKENS 4

static struct kvc_layout ops_layout(const char *model)
{
    return (struct kvc_layout){.model_id = model,
                               .layers = 2,
                               .kv_heads = 2,
                               .head_dim = 64,
                               .block_tokens = BLOCK_TOKENS,
                               .dtype = KVC_DTYPE_FP16,
                               .kv_kind = KVC_KV_KIND_KV};
}

/* Stores a chain of n blocks (tokens seed, seed+1, ...) in namespace model of kind (a
 * state namespace: the state of the whole prefix alone, under keys[n-1]); keys out. */
static int ops_put_kind(const char *sock, const char *model, enum kvc_kv_kind kind, uint32_t seed,
                        size_t n, struct kvc_key *keys)
{
    kvc_client *c;
    kvc_ns *ns;
    uint32_t tok[256];
    const void *blocks[64];
    static char data[64][2 * 2 * 2 * 64 * BLOCK_TOKENS * 2];
    struct kvc_layout l = ops_layout(model);
    int rc;
    l.kv_kind = kind;
    for (size_t i = 0; i < n * BLOCK_TOKENS; i++)
        tok[i] = seed + (uint32_t)i;
    for (size_t i = 0; i < n; i++)
        blocks[i] = data[i];
    rc = kvc_connect(sock, &c);
    if (rc)
        return rc;
    rc = kvc_ns_open(c, &l, &ns);
    if (rc == 0)
        rc = kvc_keys_from_tokens(ns, NULL, tok, n * BLOCK_TOKENS, NULL, 0, keys, n);
    if (rc >= 0 && kind == KVC_KV_KIND_STATE)
        rc = kvc_put_prefix(ns, NULL, &keys[n - 1], 1, blocks) == 1 ? (int)n : -EIO;
    else if (rc >= 0)
        rc = kvc_put_prefix(ns, NULL, keys, n, blocks);
    kvc_disconnect(c);
    return rc;
}

static int ops_put(const char *sock, const char *model, uint32_t seed, size_t n,
                   struct kvc_key *keys)
{
    return ops_put_kind(sock, model, KVC_KV_KIND_KV, seed, n, keys);
}

/* ---- every kvcctl command, text and --json ------------------------------------------- */

START_TEST(test_kvcctl_commands)
{
    struct ops_daemon d;
    static char out[1 << 17];
    struct kvc_key keys[8];
    char key[33], cmdkey[9];
    ck_assert_int_eq(ops_daemon_start(&d, NULL, NULL), 0);
    ck_assert_int_eq(ops_put(d.sock, "ops/model-a", 1, 8, keys), 8);
    snprintf(key, sizeof(key), "%016llx%016llx", (unsigned long long)keys[0].hi,
             (unsigned long long)keys[0].lo);
    snprintf(cmdkey, sizeof(cmdkey), "%.8s", key);

    static const struct {
        const char *args[6];
        int rc;
        const char *text; /* in the text output */
        const char *json; /* in the --json output (NULL: no json form) */
    } cases[] = {
        {{"status", NULL}, 0, "tokens hit", "\"token_hit_ratio\""},
        {{"stats", NULL}, 0, "committed_blocks", "\"namespaces\": [{"},
        {{"ns", NULL}, 0, "ops/model-a", "\"model\": \"ops/model-a\""},
        {{"ls", "--ns", "1", NULL}, 0, "DEPTH", "\"tier\": \"host\""},
        {{"ls", "--tier", "host", "--codec", "raw", NULL}, 0, "LAST_MS", "\"codec\": \"raw\""},
        {{"show", "KEY", NULL}, 0, "lives in     host tier", "\"depth\": 0"},
        {{"top", "--count", "1", "--interval", "0.1", NULL}, 0, "hit ratio", "\"lookups_per_s\""},
        {{"clients", NULL}, 0, "self", "\"self\": true"},
        {{"policy", "get", NULL}, 0, "default policy: default", "{\"policy\": \"default\""},
        {{"policy", "set", "lfu", NULL}, 0, "lfu", "\"lfu\""},
        {{"policy", "set", "nonesuch", NULL}, 1, "unknown policy", NULL},
        {{"config", "get", "host.size", NULL}, 0, "32m", "{\"host.size\": 33554432}"},
        {{"config", "get", NULL}, 0, "quota.client_pins = 262144", "\"log.level\": \"info\""},
        {{"config", "get", "host.nonesuch", NULL}, 1, "no option named host.nonesuch", NULL},
        {{"config", "set", "log.level", "debug", NULL}, 0, "log.level = debug", "\"applied\": true"},
        {{"config", "set", "host.size", "64m", NULL}, 1, "cannot change on reload", NULL},
        {{"reload", NULL}, 0, "configuration reloaded", "\"applied\": true"},
        {{"metrics", NULL}, 0, "# TYPE kvcd_hit_tokens_total counter", "\"name\": \"kvcd_blocks\""},
        {{"evict", "--ns", "1", NULL}, 0, "evicted", "\"evicted_blocks\""},
        {{"evict", "--ns", "99", NULL}, 1, "no such namespace", NULL},
        {{"evict", NULL}, 2, "say what", NULL},
        {{"flush", NULL}, 0, "evicted 0 blocks", "\"evicted_blocks\": 0"},
        {{"help", NULL}, 0, "metrics", NULL},
        {{"nonesuch", NULL}, 2, "unknown command", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int json = 0; json <= (cases[i].json ? 1 : 0); json++) {
            const char *args[10];
            int n = 0;
            if (json)
                args[n++] = "--json";
            for (int k = 0; cases[i].args[k]; k++)
                args[n++] = strcmp(cases[i].args[k], "KEY") == 0 ? cmdkey : cases[i].args[k];
            args[n] = NULL;
            if (i == 18 && json) /* the namespace was emptied by the text run: refill */
                ck_assert_int_eq(ops_put(d.sock, "ops/model-a", 1, 8, keys), 8);
            int rc = ops_kvcctl(&d, out, sizeof(out), args);
            ck_assert_msg(rc == cases[i].rc, "kvcctl %s%s: rc %d, want %d: %s",
                          json ? "--json " : "", cases[i].args[0], rc, cases[i].rc, out);
            const char *want = json ? cases[i].json : cases[i].text;
            ck_assert_msg(strstr(out, want), "kvcctl %s%s %s: '%s' not in: %.2000s",
                          json ? "--json " : "", cases[i].args[0],
                          cases[i].args[1] ? cases[i].args[1] : "", want, out);
            if (json && cases[i].rc == 0)
                ck_assert_msg(out[0] == '{' || out[0] == '[', "json: %.200s", out);
        }
    }
    /* The prometheus text: every sample line is "name[{labels}] value". */
    const char *m[] = {"metrics", NULL};
    ck_assert_int_eq(ops_kvcctl(&d, out, sizeof(out), m), 0);
    for (char *save = NULL, *line = strtok_r(out, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') {
            ck_assert(strncmp(line, "# HELP kvcd_", 12) == 0 ||
                      strncmp(line, "# TYPE kvcd_", 12) == 0);
            continue;
        }
        ck_assert_msg(strncmp(line, "kvcd_", 5) == 0 && strrchr(line, ' '), "%s", line);
    }
    /* shutdown last: the daemon exits 0 on its own. */
    const char *sd[] = {"shutdown", NULL};
    ck_assert_int_eq(ops_kvcctl(&d, out, sizeof(out), sd), 0);
    int status;
    ck_assert_int_eq(waitpid(d.pid, &status, 0), d.pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    d.pid = 0;
    ops_daemon_stop(&d);
}
END_TEST

/* ---- reload accepted and refused -------------------------------------------------------- */

static void ops_write(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

START_TEST(test_reload_verdicts)
{
    struct ops_daemon d;
    char out[4096], path[] = "/tmp/kvcd-ops-cfg.XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ops_write(path, "[log]\nlevel = info\n");
    const char *args[] = {"-c", path, NULL};
    ck_assert_int_eq(ops_daemon_start(&d, args, NULL), 0);
    const char *reload[] = {"reload", NULL}, *get[] = {"config", "get", "log.level", NULL};

    ops_write(path, "[log]\nlevel = debug\n[quota]\nclient_pins = 7\n");
    ck_assert_int_eq(ops_kvcctl(&d, out, sizeof(out), reload), 0);
    ck_assert_int_eq(ops_kvcctl(&d, out, sizeof(out), get), 0);
    ck_assert_str_eq(out, "debug\n");

    /* Refused: a non-reloadable option changed; the old configuration stays. */
    ops_write(path, "[log]\nlevel = warning\n[server]\nmax_namespaces = 100\n");
    ck_assert_int_eq(ops_kvcctl(&d, out, sizeof(out), reload), 1);
    ck_assert_msg(strstr(out, "server.max_namespaces cannot change on reload"), "%s", out);
    ck_assert_int_eq(ops_kvcctl(&d, out, sizeof(out), get), 0);
    ck_assert_str_eq(out, "debug\n");

    /* Refused: the file does not parse; the reason names the line. */
    ops_write(path, "[log]\nlevle = info\n");
    ck_assert_int_eq(ops_kvcctl(&d, out, sizeof(out), reload), 1);
    ck_assert_msg(strstr(out, ":2: unknown key 'levle'"), "%s", out);
    const char *jreload[] = {"--json", "reload", NULL};
    ck_assert_int_eq(ops_kvcctl(&d, out, sizeof(out), jreload), 1);
    ck_assert_msg(strstr(out, "\"applied\": false"), "%s", out);

    ck_assert_int_eq(ops_daemon_stop(&d), 0);
    unlink(path);
}
END_TEST

/* ---- notify protocol ---------------------------------------------------------------------- */

/* Next datagram on the notify socket, or "" after the socket's receive timeout. */
static void ops_notify_next(int fd, char *buf, size_t len)
{
    ssize_t n = recv(fd, buf, len - 1, 0);
    buf[n > 0 ? n : 0] = 0;
}

START_TEST(test_notify_protocol)
{
    struct ops_daemon d;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    /* Keep-alives come every 200 ms; the wait is for a daemon slowed down by the host. */
    struct timeval tv = {daemon_ms(20000) / 1000, 0};
    char env_sock[160], msg[512], out[512];
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    snprintf(a.sun_path, sizeof(a.sun_path), "/tmp/kvcd-notify-%d", (int)getpid());
    unlink(a.sun_path);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    snprintf(env_sock, sizeof(env_sock), "NOTIFY_SOCKET=%s", a.sun_path);
    const char *env[] = {env_sock, "WATCHDOG_USEC=400000", NULL};
    ck_assert_int_eq(ops_daemon_start(&d, NULL, env), 0);

    /* Ready first: without a GPU pool the start faults in only the arena's first pages and
     * needs no more start time from systemd (the rest is faulted in while it serves). */
    ops_notify_next(fd, msg, sizeof(msg));
    ck_assert_msg(strncmp(msg, "READY=1\nSTATUS=serving ", 23) == 0, "first: %s", msg);
    /* Keep-alives at half of WatchdogSec (200 ms here); between them only the status of the
     * arena's fault-in, which goes on in the background ("serving …"). */
    for (int dogs = 0; dogs < 2;) {
        ops_notify_next(fd, msg, sizeof(msg));
        if (strcmp(msg, "WATCHDOG=1") == 0)
            dogs++;
        else
            ck_assert_msg(strncmp(msg, "STATUS=serving ", 15) == 0, "keep-alive: %s", msg);
    }

    /* A reload: RELOADING=1 with MONOTONIC_USEC, then READY=1 (keep-alives may interleave). */
    const char *reload[] = {"reload", NULL};
    ck_assert_int_eq(ops_kvcctl(&d, out, sizeof(out), reload), 0);
    do
        ops_notify_next(fd, msg, sizeof(msg));
    while (strcmp(msg, "WATCHDOG=1") == 0 || strncmp(msg, "STATUS=serving ", 15) == 0);
    ck_assert_msg(strncmp(msg, "RELOADING=1\n", 12) == 0 && strstr(msg, "MONOTONIC_USEC="), "%s",
                  msg);
    do
        ops_notify_next(fd, msg, sizeof(msg));
    while (strcmp(msg, "WATCHDOG=1") == 0 || strncmp(msg, "STATUS=serving ", 15) == 0);
    ck_assert_msg(strncmp(msg, "READY=1\nSTATUS=serving; configuration reloaded", 46) == 0, "%s",
                  msg);

    kill(d.pid, SIGTERM);
    do
        ops_notify_next(fd, msg, sizeof(msg));
    while (strcmp(msg, "WATCHDOG=1") == 0 || strncmp(msg, "STATUS=serving ", 15) == 0);
    ck_assert_msg(strncmp(msg, "STOPPING=1", 10) == 0, "%s", msg);
    ck_assert_int_eq(ops_daemon_wait(&d), 0); /* no second SIGTERM: that one exits at once */
    close(fd);
    unlink(a.sun_path);
}
END_TEST

/* ---- socket activation -------------------------------------------------------------------- */

START_TEST(test_socket_activation)
{
    /* A listening socket as fd 3 with LISTEN_FDS=1 and LISTEN_PID=<the daemon>: kvcd adopts
     * it. The child sets LISTEN_PID itself after fork, as systemd does. */
    char dir[] = "/tmp/kvcd-act.XXXXXX", path[64], sockopt[160];
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/act.sock", dir);
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    int ls = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    ck_assert_int_eq(bind(ls, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(listen(ls, 16), 0);
    /* server.socket points elsewhere: the adopted socket must win. */
    snprintf(sockopt, sizeof(sockopt), "server.socket=%s/unused.sock", dir);
    const char *kvcd = daemon_bin("kvcd"); /* before the fork: it takes a lock */
    pid_t pid = daemon_fork();
    if (pid == 0) {
        char pidenv[32];
        dup2(ls, 3);
        snprintf(pidenv, sizeof(pidenv), "%d", (int)getpid());
        setenv("LISTEN_PID", pidenv, 1);
        setenv("LISTEN_FDS", "1", 1);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 2);
        execl(kvcd, "kvcd", "-o", sockopt, "-o", "host.size=16m", "-o",
              "host.prefault=no", (char *)NULL);
        _exit(127);
    }
    close(ls);
    kvc_client *c = NULL;
    int rc = -1;
    uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(DAEMON_START_MS);
    while (rc && daemon_now_ms() < end) {
        rc = kvc_connect(path, &c);
        if (rc)
            usleep(10000);
    }
    ck_assert_int_eq(rc, 0);
    kvc_disconnect(c);
    ck_assert_int_ne(access(dir, F_OK), -1);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    kill(pid, SIGTERM);
    ck_assert_int_eq(daemon_child_wait(pid, daemon_ms(DAEMON_START_MS), NULL), 0);
    /* The socket file belongs to systemd (the test): kvcd leaves it. */
    ck_assert_int_eq(stat(path, &st), 0);
    unlink(path);
    rmdir(dir);
}
END_TEST

/* ---- quotas ------------------------------------------------------------------------------- */

START_TEST(test_quotas)
{
    struct ops_daemon d;
    char cfg[] = "/tmp/kvcd-ops-cfg.XXXXXX";
    struct kvc_key keys[8], more[8];
    int fd = mkstemp(cfg);
    close(fd);
    /* One block here is 2*2*2*64*4*2 = 4 KiB; the namespace keeps at most 4 of them. */
    ops_write(cfg, "[quota]\nclient_pins = 2\nclient_reservations = 1\n"
                   "[namespace.ops/q*]\nmax_bytes = 16k\n");
    const char *args[] = {"-c", cfg, NULL};
    ck_assert_int_eq(ops_daemon_start(&d, args, NULL), 0);
    /* max_bytes: a chain of 8 is cut to the 4 blocks that fit. */
    ck_assert_int_eq(ops_put(d.sock, "ops/q1", 100, 8, keys), 4);
    /* Another chain: the namespace evicts its own coldest blocks to take it. */
    ck_assert_int_eq(ops_put(d.sock, "ops/q1", 5000, 4, more), 4);

    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l1, *l2;
    kvc_resv *r1, *r2;
    struct kvc_layout lay = ops_layout("ops/q1");
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    /* client_pins = 2: a lookup of 4 cached blocks pins 2; the next is refused. */
    ck_assert_int_eq(kvc_lookup(ns, more, 4, 0, &l1), 2);
    ck_assert_int_eq(kvc_lookup(ns, more, 4, 0, &l2), -EDQUOT);
    ck_assert_int_eq(kvc_release(l1), 0);
    /* client_reservations = 1. */
    ck_assert_int_eq(kvc_reserve(ns, NULL, &keys[6], 1, &r1), 1);
    ck_assert_int_eq(kvc_reserve(ns, NULL, &keys[7], 1, &r2), -EDQUOT);
    ck_assert_int_eq(kvc_abort(r1), 0);

    struct kvc_stat *st;
    size_t n;
    uint64_t quota = 0, evq = 0, bytes = 0;
    ck_assert_int_eq(kvc_stats(c, 0, &st, &n), 0);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(st[i].name, "refused_quota") == 0)
            quota = st[i].value;
        if (strcmp(st[i].name, "evicted_quota_blocks") == 0)
            evq = st[i].value;
        if (strcmp(st[i].name, "bytes_now") == 0)
            bytes = st[i].value;
    }
    free(st);
    ck_assert_uint_ge(quota, 3);
    ck_assert_uint_eq(evq, 5); /* 4 for the second chain, 1 for the reservation */
    ck_assert_uint_le(bytes, 16384);
    kvc_disconnect(c);
    ck_assert_int_eq(ops_daemon_stop(&d), 0);
    unlink(cfg);
}
END_TEST

/* ---- access lists under another uid ------------------------------------------------------- */

/* The child half, run as nobody through setpriv: exit codes name the failed check. */
static int ops_acl_child(const char *sock)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    kvc_resv *r;
    struct kvc_key keys[4];
    struct kvc_layout ro = ops_layout("ops/shared"), priv = ops_layout("ops/private"),
                      fresh = ops_layout("ops/shared-new");
    struct kvc_ns_info *info;
    size_t n;
    char msg[256];
    uint32_t tok[4 * BLOCK_TOKENS];
    if (kvc_connect(sock, &c))
        return 10;
    if (kvc_reload(c, msg, sizeof(msg)) != -EPERM)
        return 11; /* not an admin */
    if (kvc_evict(c, 0, 0, NULL) != -EPERM)
        return 12;
    if (kvc_ns_open(c, &priv, &ns) != -EACCES)
        return 13; /* not in its list */
    if (kvc_ns_open(c, &fresh, &ns) != -EACCES)
        return 14; /* may read shared-*, not create */
    if (kvc_ns_open(c, &ro, &ns))
        return 15;
    if (c->arenas[ns->arena].writable || ns->arena == 0)
        return 16; /* a private, read-only mapping */
    for (uint32_t i = 0; i < 4 * BLOCK_TOKENS; i++)
        tok[i] = 1 + i;
    kvc_keys_from_tokens(ns, NULL, tok, 4 * BLOCK_TOKENS, NULL, 0, keys, 4);
    if (kvc_lookup(ns, keys, 4, 0, &l) != 4)
        return 17; /* reads work */
    kvc_release(l);
    if (kvc_reserve(ns, NULL, keys, 4, &r) != -EACCES)
        return 18; /* writes do not */
    if (kvc_ns_list(c, &info, &n) || n != 2)
        return 19; /* the private namespaces are not even listed */
    for (size_t i = 0; i < n; i++)
        if (strncmp(info[i].model_id, "ops/shared", 10) != 0)
            return 19;
    free(info);
    if (kvc_block_list(c, 1, &(uint64_t){0}, 16, (struct kvc_block_info **)&info, &n) !=
        -EACCES)
        return 20; /* namespace 1 is ops/private */
    /* States: the same lists. A private state namespace is not opened, a shared one is
     * read (the state of the whole prefix, at its last key) and not written. */
    struct kvc_layout sp = ops_layout("ops/state-private"), ss = ops_layout("ops/shared-state");
    sp.kv_kind = ss.kv_kind = KVC_KV_KIND_STATE;
    if (kvc_ns_open(c, &sp, &ns) != -EACCES)
        return 21;
    if (kvc_ns_open(c, &ss, &ns))
        return 22;
    kvc_keys_from_tokens(ns, NULL, tok, 4 * BLOCK_TOKENS, NULL, 0, keys, 4);
    if (kvc_lookup(ns, keys, 4, 0, &l) != 1 || kvc_lease_first(l) != 3)
        return 23;
    kvc_release(l);
    if (kvc_reserve(ns, NULL, keys, 4, &r) != -EACCES)
        return 24;
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_access_lists)
{
    struct ops_daemon d;
    char cfg[] = "/tmp/kvcd-ops-cfg.XXXXXX", out[4096];
    struct kvc_key keys[4];
    if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0)
        return; /* registered only as root with setpriv: see main */
    int fd = mkstemp(cfg);
    close(fd);
    chmod(cfg, 0644);
    ops_write(cfg, "[server]\nsocket_mode = 0666\n"
                   "[namespace.ops/private]\nwrite = root\nhost_size = 4m\n"
                   "[namespace.ops/shared*]\nread = 65534\nwrite = root\nhost_size = 4m\n"
                   "[namespace.ops/state-private]\nwrite = root\nhost_size = 4m\n");
    const char *args[] = {"-c", cfg, NULL};
    ck_assert_int_eq(ops_daemon_start(&d, args, NULL), 0);
    ck_assert_int_eq(ops_put(d.sock, "ops/private", 1, 4, keys), 4);
    ck_assert_int_eq(ops_put(d.sock, "ops/shared", 1, 4, keys), 4);
    ck_assert_int_eq(ops_put_kind(d.sock, "ops/state-private", KVC_KV_KIND_STATE, 1, 4, keys), 4);
    ck_assert_int_eq(ops_put_kind(d.sock, "ops/shared-state", KVC_KV_KIND_STATE, 1, 4, keys), 4);
    snprintf(out, sizeof(out),
             "setpriv --reuid=65534 --regid=65534 --clear-groups /proc/%d/exe --acl-child %s",
             (int)getpid(), d.sock);
    int status = system(out);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child check %d failed",
                  WEXITSTATUS(status));
    /* Refusals are counted, in total and for the client. */
    const char *stats[] = {"stats", NULL};
    ck_assert_int_eq(ops_kvcctl(&d, out, sizeof(out), stats), 0);
    ck_assert_msg(strstr(out, "refused_access               6") &&
                      strstr(out, "refused_admin                2"),
                  "%s", out);
    ck_assert_int_eq(ops_daemon_stop(&d), 0);
    unlink(cfg);
}
END_TEST

/* ---- [namespace.*] configuration ---------------------------------------------------------- */

START_TEST(test_namespace_sections)
{
    char err[256];
    struct config *c = config_new(), *d;
    static const char good[] = "[namespace.llama-*]\nread = 65534 @0 *\nwrite = root\n"
                               "max_bytes = 1g\nmax_pins = 10\n";
    ck_assert_int_eq(config_load_buffer(c, "t.ini", good, strlen(good), err, sizeof(err)), 0);
    ck_assert_uint_eq(c->ns.n, 1);
    ck_assert(c->ns.sec[0].read.anyone);
    ck_assert_uint_eq(c->ns.sec[0].read.uids[0], 65534);
    ck_assert_uint_eq(c->ns.sec[0].read.gids[0], 0);
    ck_assert_uint_eq(c->ns.sec[0].write.uids[0], 0);
    ck_assert_uint_eq(c->ns.sec[0].max_bytes, 1ull << 30);
    ck_assert_ptr_nonnull(config_ns_match(&c->ns, "llama-3", NULL));
    ck_assert_ptr_null(config_ns_match(&c->ns, "mistral", NULL));
    /* Quotas reload; lists do not. */
    d = config_dup(c);
    ck_assert_ptr_nonnull(d);
    d->ns.sec[0].max_pins = 20;
    ck_assert_int_eq(config_check_reload(c, d, err, sizeof(err)), 0);
    d->ns.sec[0].write.uids[0] = 1;
    ck_assert_int_eq(config_check_reload(c, d, err, sizeof(err)), -EROFS);
    ck_assert_msg(strstr(err, "[namespace.llama-*]"), "%s", err);
    config_free(d);
    /* The printed configuration loads back with the section. */
    char *text;
    size_t len;
    FILE *f = open_memstream(&text, &len);
    ck_assert_int_eq(config_print(c, f), 0);
    fclose(f);
    d = config_new();
    ck_assert_int_eq(config_load_buffer(d, "p.ini", text, len, err, sizeof(err)), 0);
    ck_assert_uint_eq(d->ns.n, 1);
    ck_assert_uint_eq(d->ns.sec[0].max_pins, 10);
    free(text);
    config_free(d);
    config_free(c);

    static const struct {
        const char *text, *err;
    } bad[] = {
        {"[namespace.x]\nread = no-such-user-kvcd\n", "t.ini:2: unknown user 'no-such-user-kvcd'"},
        {"[namespace.x]\nread = @no-such-group-kvcd\n", "unknown group"},
        {"[namespace.x]\nreed = root\n", "t.ini:2: unknown key 'reed' in [namespace.x]"},
        {"[namespace.x]\nmax_pins = 1\nmax_pins = 2\n", "duplicate key 'max_pins'"},
        {"[namespace.x]\nmax_bytes = lots\n", "not a number or size"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        c = config_new();
        ck_assert_int_eq(
            config_load_buffer(c, "t.ini", bad[i].text, strlen(bad[i].text), err, sizeof(err)),
            -EINVAL);
        ck_assert_msg(strstr(err, bad[i].err), "got '%s', want '%s'", err, bad[i].err);
        config_free(c);
    }
}
END_TEST

/* ---- make install and systemd-analyze verify ---------------------------------------------- */

static const char *ops_build_dir(char *buf, size_t len)
{
    snprintf(buf, len, "%s", KVC_BUILD_BIN);
    *strrchr(buf, '/') = 0; /* .../build or .../build/asan */
    return buf;
}

START_TEST(test_make_install)
{
    char dir[] = "/tmp/kvcd-inst.XXXXXX", cmd[1024], build[512];
    static const char *const files[] = {
        "/usr/bin/kvcd", "/usr/bin/kvcctl", "/usr/lib/libkvc.so.1", "/usr/lib/libkvc.so",
        "/usr/lib/libkvc.a", "/usr/include/kvc.h", "/usr/lib/pkgconfig/libkvc.pc",
        "/etc/kvcd/kvcd.ini", "/usr/lib/systemd/system/kvcd.service",
        "/usr/lib/systemd/system/kvcd.socket", "/usr/lib/sysusers.d/kvcd.conf",
        "/usr/lib/tmpfiles.d/kvcd.conf", "/usr/share/man/man8/kvcd.8",
        "/usr/share/man/man8/kvcctl.8", "/usr/share/man/man5/kvcd.ini.5",
        "/usr/share/man/man3/libkvc.3",
        "/usr/share/kvcd/systemd/kvcd.service.d/remote.conf"};
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ops_build_dir(build, sizeof(build));
    snprintf(cmd, sizeof(cmd),
             "make -s -C %s BUILD=%s SAN=%d CUDA=%d install PREFIX=/usr DESTDIR=%s >/dev/null",
             KVC_SRC_DIR, build, strstr(build, "asan") ? 1 : 0, KVC_CUDA, dir);
    ck_assert_int_eq(system(cmd), 0);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char p[512];
        snprintf(p, sizeof(p), "%s%s", dir, files[i]);
        ck_assert_msg(access(p, F_OK) == 0, "%s not installed", files[i]);
    }
    /* The soname and the unit's paths. */
    snprintf(cmd, sizeof(cmd),
             "readelf -d %s/usr/lib/libkvc.so.1 | grep -q 'SONAME.*libkvc.so.1' && "
             "grep -q '^ExecStart=/usr/bin/kvcd -c /etc/kvcd/kvcd.ini$' "
             "%s/usr/lib/systemd/system/kvcd.service && "
             "grep -q '^libdir=/usr/lib$' %s/usr/lib/pkgconfig/libkvc.pc",
             dir, dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof(cmd),
             "make -s -C %s BUILD=%s SAN=%d CUDA=%d uninstall PREFIX=/usr DESTDIR=%s && "
             "test ! -e %s/usr/bin/kvcd && test -e %s/etc/kvcd/kvcd.ini && rm -rf %s",
             KVC_SRC_DIR, build, strstr(build, "asan") ? 1 : 0, KVC_CUDA, dir, dir, dir, dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_units_verify)
{
    char dir[] = "/tmp/kvcd-units.XXXXXX", cmd[1024], build[512];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ops_build_dir(build, sizeof(build));
    /* Installed under a prefix (no DESTDIR) so that the units' ExecStart paths exist. */
    snprintf(cmd, sizeof(cmd),
             "make -s -C %s BUILD=%s SAN=%d CUDA=%d install PREFIX=%s >/dev/null && "
             "SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no "
             "%s/lib/systemd/system/kvcd.service %s/lib/systemd/system/kvcd.socket && "
             "rm -rf %s",
             KVC_SRC_DIR, build, strstr(build, "asan") ? 1 : 0, KVC_CUDA, dir, dir, dir, dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(int argc, char **argv)
{
    Suite *s;
    TCase *tc;
    if (argc == 3 && strcmp(argv[1], "--acl-child") == 0)
        return ops_acl_child(argv[2]);
    s = suite_create("e2e_ops");
    tc = tcase_create("ops");
    signal(SIGPIPE, SIG_IGN);
    tcase_set_timeout(tc, daemon_slow() * 120);
    tcase_add_test(tc, test_kvcctl_commands);
    tcase_add_test(tc, test_reload_verdicts);
    tcase_add_test(tc, test_notify_protocol);
    tcase_add_test(tc, test_socket_activation);
    tcase_add_test(tc, test_quotas);
    tcase_add_test(tc, test_namespace_sections);
    if (geteuid() == 0 && access("/usr/bin/setpriv", X_OK) == 0)
        tcase_add_test(tc, test_access_lists);
    else
        printf("SKIP: e2e_ops: access_lists: needs root and setpriv to run a client as "
               "nobody\n");
    tcase_add_test(tc, test_make_install);
    if (system("command -v systemd-analyze >/dev/null 2>&1") == 0)
        tcase_add_test(tc, test_units_verify);
    else
        printf("SKIP: e2e_ops: units_verify: systemd-analyze not installed\n");
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
