/*
 * daemon.c — see daemon.h.
 */
#include <check.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/server.h"
#include "kernels/kern.h"
#include "tests/lib/daemon.h"

#define DAEMON_MAX_ARGS 64

static char daemon_base[96]; /* the suite's directory; empty before init */

uint64_t daemon_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void daemon_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ---- directories ----------------------------------------------------------------------- */

static int daemon_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void daemon_rm_tree(const char *dir)
{
    if (dir[0])
        nftw(dir, daemon_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int daemon_suite_init(const char *name)
{
    snprintf(daemon_base, sizeof(daemon_base), "/tmp/kvc-%.60s.XXXXXX", name);
    if (!mkdtemp(daemon_base)) {
        daemon_base[0] = 0;
        return -errno;
    }
    return 0;
}

void daemon_suite_fini(void)
{
    daemon_rm_tree(daemon_base);
    daemon_base[0] = 0;
}

int daemon_suite_run(struct Suite *s)
{
    SRunner *sr = srunner_create(s);
    int failed;
    fflush(stdout); /* lines printed while the suite was made, once, not from every fork */
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (daemon_base[0])
        daemon_suite_fini();
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

int daemon_dir_init(struct daemon *d)
{
    if (!d->dir[0]) {
        snprintf(d->dir, sizeof(d->dir), "%.100s/d.XXXXXX", daemon_base[0] ? daemon_base : "/tmp");
        if (!mkdtemp(d->dir)) {
            d->dir[0] = 0;
            return -errno;
        }
    }
    snprintf(d->sock, sizeof(d->sock), "%.180s/kvcd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%.180s/kvcd.log", d->dir);
    return 0;
}

int daemon_hold_start_lock(const struct daemon *d, char *lock)
{
    snprintf(lock, DAEMON_PATH_MAX + 8, "%s.lock", d->sock);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

int daemon_file_write(const struct daemon *d, const char *name, const char *text, char *path)
{
    FILE *f;
    int rc = 0;
    snprintf(path, DAEMON_PATH_MAX, "%.150s/%.40s", d->dir, name);
    f = fopen(path, "w");
    if (!f)
        return -errno;
    if (fputs(text, f) < 0)
        rc = -EIO;
    if (fclose(f) != 0 && rc == 0)
        rc = -errno;
    return rc;
}

/* ---- processes ------------------------------------------------------------------------- */

const char *daemon_bin(const char *name)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char paths[8][DAEMON_PATH_MAX + 64];
    static char names[8][32];
    static int n;
    const char *path = NULL;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n && !path; i++)
        if (strcmp(names[i], name) == 0)
            path = paths[i];
    if (!path && n < 8) {
        const char *dir = getenv("KVC_TEST_BIN_DIR");
        snprintf(paths[n], sizeof(paths[n]), "%.200s/%.31s", dir && *dir ? dir : KVC_BUILD_BIN,
                 name);
        snprintf(names[n], sizeof(names[n]), "%.31s", name);
        path = paths[n++];
    }
    pthread_mutex_unlock(&mu);
    return path ? path : "/nonexistent";
}

int daemon_slow(void)
{
    static int slow;
    if (!slow) {
        const char *e = getenv("KVC_TEST_SLOW");
        int f = e ? atoi(e) : 1;
        slow = (f >= 1 && f <= 100 ? f : 1) * DAEMON_SAN_SLOW;
    }
    return slow;
}

int daemon_ms(int ms)
{
    return ms * daemon_slow();
}

/* In the child: die with the test process (the process that forked, whichever thread),
 * and start with a clean signal state. */
pid_t daemon_fork(void)
{
    pid_t parent = getpid();
    pid_t pid;
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        sigset_t all;
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) /* the parent died before prctl */
            _exit(127);
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        signal(SIGPIPE, SIG_DFL);
    }
    return pid;
}

static int daemon_cuda_probe(void *arg)
{
    int n = kern_cuda_device_count();
    (void)arg;
    return n < 0 ? 0 : n > 100 ? 100 : n;
}

int daemon_cuda_devices(void)
{
    static int devices = -2;
    if (devices == -2) {
        pid_t pid = daemon_child_spawn(daemon_cuda_probe, NULL);
        devices = pid < 0 ? -1 : daemon_child_wait(pid, daemon_ms(60000), NULL);
    }
    return devices;
}

pid_t daemon_child_spawn(int (*fn)(void *), void *arg)
{
    pid_t pid = daemon_fork();
    if (pid < 0)
        return -errno;
    if (pid == 0)
        _exit(fn(arg));
    return pid;
}

int daemon_child_wait(pid_t pid, int timeout_ms, int *sig)
{
    uint64_t end = daemon_now_ms() + (uint64_t)timeout_ms;
    int st;
    if (sig)
        *sig = 0;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR)
            return -1;
        if (daemon_now_ms() >= end) {
            fprintf(stderr, "daemon: pid %d did not finish in %d ms; killing it\n", (int)pid,
                    timeout_ms);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        daemon_sleep_ms(5);
    }
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (sig && WIFSIGNALED(st))
        *sig = WTERMSIG(st);
    return -1;
}

/* Appends the strings of a NULL-terminated list to argv. */
static int daemon_args_add(const char **argv, int *n, const char *const *more)
{
    for (; more && *more; more++) {
        if (*n >= DAEMON_MAX_ARGS - 1)
            return -E2BIG;
        argv[(*n)++] = *more;
    }
    argv[*n] = NULL;
    return 0;
}

int daemon_spawn(const struct daemon *d, const char *const *args, pid_t *pid)
{
    const char *argv[DAEMON_MAX_ARGS];
    char sockopt[DAEMON_PATH_MAX + 32];
    int n = 0, rc;
    snprintf(sockopt, sizeof(sockopt), "server.socket=%s", d->sock);
    argv[n++] = DAEMON_KVCD;
    argv[n++] = "-o";
    argv[n++] = sockopt;
    /* The suites run again with the fast path off (tests/run-checks.sh): in the daemon too. */
    const char *nf = getenv("KVC_NO_FASTPATH");
    if (nf && *nf && strcmp(nf, "0") != 0) {
        argv[n++] = "-o";
        argv[n++] = "server.fast_path=no";
    }
    /* TSan runs suites again with the sockets on I/O threads (tests/run-checks.sh): before
     * the suite's own options, so a case that sets server.io_threads keeps its count.
     * Otherwise the loop alone (server.io_threads = 0), not the default's `auto`, whose
     * count follows the host's CPUs: the suites run alike on a 2-CPU and a 64-CPU host
     * (check_e2e_iothreads covers auto and the threads). */
    char ioopt[48];
    const char *iot = getenv("KVC_IO_THREADS");
    if (!iot || !*iot) {
        argv[n++] = "-o";
        argv[n++] = "server.io_threads=0";
    } else {
        char *end;
        unsigned long v = strtoul(iot, &end, 10);
        if (*end || v > 64) /* server.io_threads allows 64 */
            return -EINVAL;
        snprintf(ioopt, sizeof(ioopt), "server.io_threads=%lu", v);
        argv[n++] = "-o";
        argv[n++] = ioopt;
        /* every connection on them, however few are busy (no fallback to the loop) */
        argv[n++] = "-o";
        argv[n++] = "server.io_threads_min_active=1";
    }
    rc = daemon_args_add(argv, &n, args);
    if (rc)
        return rc;
    *pid = daemon_fork();
    if (*pid < 0)
        return -errno;
    if (*pid == 0) {
        int lfd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        int nfd = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (lfd < 0 || nfd < 0)
            _exit(126);
        dup2(nfd, 0);
        dup2(lfd, 1);
        dup2(lfd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return 0;
}

int daemon_wait_ready(const struct daemon *d, int timeout_ms)
{
    uint64_t end = daemon_now_ms() + (uint64_t)timeout_ms;
    int rc;
    for (;;) {
        kvc_client *c;
        rc = kvc_connect(d->sock, &c);
        if (rc == 0) {
            kvc_disconnect(c);
            return 0;
        }
        if (d->pid && waitpid(d->pid, NULL, WNOHANG) == d->pid)
            return -ECHILD;
        if (daemon_now_ms() >= end)
            return rc;
        daemon_sleep_ms(10);
    }
}

static void daemon_log_dump(const struct daemon *d)
{
    char buf[4096];
    FILE *f = fopen(d->log, "r");
    size_t n;
    if (!f)
        return;
    fprintf(stderr, "---- %s ----\n", d->log);
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        fwrite(buf, 1, n, stderr);
    fclose(f);
}

int daemon_start(struct daemon *d, const char *const *args)
{
    int rc = daemon_dir_init(d);
    if (rc)
        return rc;
    rc = daemon_spawn(d, args, &d->pid);
    if (rc)
        return rc;
    rc = daemon_wait_ready(d, daemon_ms(DAEMON_START_MS));
    if (rc) {
        fprintf(stderr, "daemon: kvcd did not come up (%s)\n", strerror(-rc));
        daemon_log_dump(d);
        if (rc == -ECHILD)
            d->pid = 0; /* already reaped */
    }
    return rc;
}

int daemon_stop(struct daemon *d)
{
    int rc, sig;
    if (!d->pid)
        return -1;
    kill(d->pid, SIGTERM);
    rc = daemon_child_wait(d->pid, daemon_ms(DAEMON_START_MS), &sig);
    d->pid = 0;
    if (rc != 0) {
        fprintf(stderr, "daemon: kvcd exit status %d (signal %d)\n", rc, sig);
        daemon_log_dump(d);
    }
    return rc;
}

bool daemon_alive(struct daemon *d)
{
    if (!d->pid)
        return false;
    if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
        d->pid = 0;
        return false;
    }
    return true;
}

void daemon_cleanup(struct daemon *d)
{
    if (d->pid) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
        d->pid = 0;
    }
    daemon_rm_tree(d->dir);
    d->dir[0] = 0;
}

/* Reads what is ready on fd into buf[*len..cap-1); closes and sets *fd = -1 at EOF. */
static void daemon_pipe_read(int *fd, char *buf, size_t cap, size_t *len)
{
    char scratch[4096];
    ssize_t n;
    if (buf && *len + 1 < cap)
        n = read(*fd, buf + *len, cap - 1 - *len);
    else
        n = read(*fd, scratch, sizeof(scratch));
    if (n > 0) {
        if (buf && *len + 1 < cap)
            *len += (size_t)n;
        return;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    close(*fd);
    *fd = -1;
}

int daemon_run(const char *const *argv, char *out, size_t outlen, char *err, size_t errlen,
               int timeout_ms)
{
    int po[2], pe[2];
    size_t no = 0, ne = 0;
    uint64_t end = daemon_now_ms() + (uint64_t)timeout_ms;
    pid_t pid;
    if (pipe2(po, O_CLOEXEC) < 0)
        return -1;
    if (pipe2(pe, O_CLOEXEC) < 0) {
        close(po[0]);
        close(po[1]);
        return -1;
    }
    pid = daemon_fork();
    if (pid == 0) {
        int nfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        dup2(nfd, 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    if (pid < 0) {
        close(po[0]);
        close(pe[0]);
        return -1;
    }
    while (po[0] >= 0 || pe[0] >= 0) {
        struct pollfd p[2] = {{.fd = po[0], .events = POLLIN}, {.fd = pe[0], .events = POLLIN}};
        uint64_t now = daemon_now_ms();
        if (now >= end)
            break;
        if (poll(p, 2, (int)(end - now)) <= 0)
            continue;
        if (po[0] >= 0 && p[0].revents)
            daemon_pipe_read(&po[0], out, outlen, &no);
        if (pe[0] >= 0 && p[1].revents)
            daemon_pipe_read(&pe[0], err, errlen, &ne);
    }
    if (po[0] >= 0)
        close(po[0]);
    if (pe[0] >= 0)
        close(pe[0]);
    if (out && outlen)
        out[no] = 0;
    if (err && errlen)
        err[ne] = 0;
    {
        uint64_t now = daemon_now_ms();
        return daemon_child_wait(pid, now < end ? (int)(end - now) : 1, NULL);
    }
}

int daemon_kvcctl(const struct daemon *d, char *out, size_t outlen, char *err, size_t errlen, ...)
{
    const char *argv[DAEMON_MAX_ARGS];
    int n = 0;
    va_list ap;
    const char *a;
    argv[n++] = DAEMON_KVCCTL;
    argv[n++] = "-s";
    argv[n++] = d->sock;
    va_start(ap, errlen);
    while ((a = va_arg(ap, const char *)) && n < DAEMON_MAX_ARGS - 1)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    return daemon_run(argv, out, outlen, err, errlen, daemon_ms(20000));
}

/* ---- blocks and keys ------------------------------------------------------------------- */

static uint64_t daemon_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t daemon_block_seed(const struct kvc_key *k)
{
    return daemon_mix(k->lo ^ daemon_mix(k->hi + 0x9e3779b97f4a7c15ull));
}

void daemon_block_fill(const struct kvc_key *k, void *buf, size_t len)
{
    uint64_t s = daemon_block_seed(k);
    uint8_t *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = daemon_mix(s + i);
        memcpy(p + i, &v, 8);
    }
    for (; i < len; i++)
        p[i] = (uint8_t)daemon_mix(s + i);
}

long daemon_block_check(const struct kvc_key *k, const void *buf, size_t len)
{
    uint64_t s = daemon_block_seed(k);
    const uint8_t *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = daemon_mix(s + i);
        if (memcmp(p + i, &v, 8) != 0)
            goto bad;
    }
    for (; i < len; i++)
        if (p[i] != (uint8_t)daemon_mix(s + i))
            return (long)i;
    return -1;
bad:
    for (size_t j = 0; j < 8; j++) {
        uint64_t v = daemon_mix(s + i);
        if (p[i + j] != ((const uint8_t *)&v)[j])
            return (long)(i + j);
    }
    return (long)i;
}

struct kvc_layout daemon_layout(const char *model_id, uint32_t block_tokens)
{
    return (struct kvc_layout){.model_id = model_id,
                               .layers = 2,
                               .kv_heads = 2,
                               .head_dim = 64,
                               .block_tokens = block_tokens,
                               .dtype = KVC_DTYPE_FP16,
                               .kv_kind = KVC_KV_KIND_KV};
}

void daemon_wire_layout(const struct kvc_layout *lay, struct kvc_wire_layout *out)
{
    memset(out, 0, sizeof(*out));
    memcpy(out->model_id, lay->model_id, strnlen(lay->model_id, sizeof(out->model_id) - 1));
    out->layers = lay->layers;
    out->kv_heads = lay->kv_heads;
    out->head_dim = lay->head_dim;
    out->block_tokens = lay->block_tokens;
    out->dtype = (uint8_t)lay->dtype;
    out->kv_kind = (uint8_t)lay->kv_kind;
}

int daemon_chain_keys(const kvc_ns *ns, uint32_t family, uint32_t variant, uint32_t shared,
                      uint32_t n, struct kvc_key *keys)
{
    uint32_t bt = kvc_ns_block_tokens(ns);
    size_t ntok = (size_t)n * bt;
    uint32_t *tok = malloc(ntok * sizeof(*tok));
    int rc;
    if (!tok)
        return -ENOMEM;
    for (size_t i = 0; i < ntok; i++) {
        uint64_t b = i / bt;
        uint64_t v = b < shared ? 0 : (uint64_t)variant + 1;
        tok[i] = (uint32_t)daemon_mix(((uint64_t)family << 40) ^ (v << 20) ^ i) & 0xffff;
    }
    rc = kvc_keys_from_tokens(ns, NULL, tok, ntok, NULL, 0, keys, n);
    free(tok);
    return rc == (int)n ? 0 : (rc < 0 ? rc : -EIO);
}

/* ---- a client round trip and counters ------------------------------------------------- */

int daemon_client_stat(kvc_client *c, uint32_t scope, const char *name, uint64_t *v)
{
    struct kvc_stat *s;
    size_t n;
    int rc = kvc_stats(c, scope, &s, &n);
    if (rc)
        return rc;
    rc = -ENOENT;
    for (size_t i = 0; i < n; i++)
        if (strcmp(s[i].name, name) == 0) {
            *v = s[i].value;
            rc = 0;
        }
    free(s);
    return rc;
}

int daemon_stat(const struct daemon *d, const char *name, uint64_t *v)
{
    kvc_client *c;
    int rc = kvc_connect(d->sock, &c);
    if (rc)
        return rc;
    rc = daemon_client_stat(c, 0, name, v);
    kvc_disconnect(c);
    return rc;
}

int daemon_log_count(const struct daemon *d, const char *needle)
{
    char *buf = malloc(1 << 20);
    FILE *f = buf ? fopen(d->log, "r") : NULL;
    size_t n = f ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    int count = 0;
    if (f)
        fclose(f);
    if (!buf)
        return 0;
    buf[n] = 0;
    for (const char *p = buf; (p = strstr(p, needle)); p++)
        count++;
    free(buf);
    return count;
}

int daemon_roundtrip(const struct daemon *d)
{
    static uint32_t calls;
    struct kvc_layout lay = daemon_layout("e2e-roundtrip", 16);
    struct kvc_key keys[3];
    void *blocks[3] = {NULL, NULL, NULL};
    kvc_client *c = NULL;
    kvc_ns *ns;
    size_t bb;
    int rc = kvc_connect(d->sock, &c);
    if (rc)
        goto out;
    rc = kvc_ns_open(c, &lay, &ns);
    if (rc)
        goto out;
    bb = kvc_ns_block_bytes(ns);
    calls++;
    rc = daemon_chain_keys(ns, (uint32_t)getpid() ^ (calls << 20), calls, 0, 3, keys);
    if (rc)
        goto out;
    for (int i = 0; i < 3; i++) {
        blocks[i] = malloc(bb);
        if (!blocks[i]) {
            rc = -ENOMEM;
            goto out;
        }
        daemon_block_fill(&keys[i], blocks[i], bb);
    }
    rc = kvc_put_prefix(ns, NULL, keys, 3, (const void *const *)blocks);
    if (rc != 3) {
        rc = rc < 0 ? rc : -EIO;
        goto out;
    }
    for (int i = 0; i < 3; i++)
        memset(blocks[i], 0, bb);
    rc = kvc_get_prefix(ns, keys, 3, blocks);
    if (rc != 3) {
        rc = rc < 0 ? rc : -EIO;
        goto out;
    }
    rc = 0;
    for (int i = 0; i < 3; i++)
        if (daemon_block_check(&keys[i], blocks[i], bb) >= 0)
            rc = -EILSEQ;
out:
    for (int i = 0; i < 3; i++)
        free(blocks[i]);
    kvc_disconnect(c);
    return rc;
}

/* ---- JSON (jansson) ------------------------------------------------------------------- */

bool daemon_json_valid(const char *s)
{
    json_error_t e;
    json_t *v = json_loads(s, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &e);
    json_decref(v);
    return v != NULL;
}

/* The first member `key` holding an unsigned integer, depth first in document order. */
static const json_t *daemon_json_find(const json_t *v, const char *key, int depth)
{
    const char *k;
    const json_t *m, *hit;
    size_t i;
    if (depth > 64)
        return NULL;
    if (json_is_object(v)) {
        json_object_foreach((json_t *)v, k, m)
        {
            if (strcmp(k, key) == 0 && json_is_integer(m) && json_integer_value(m) >= 0)
                return m;
            if ((hit = daemon_json_find(m, key, depth + 1)))
                return hit;
        }
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, m) if ((hit = daemon_json_find(m, key, depth + 1))) return hit;
    }
    return NULL;
}

int daemon_json_u64(const char *s, const char *key, uint64_t *v)
{
    /* One JSON value, or several in a row (JSON Lines): the first match in any. */
    size_t len = strlen(s), at = 0;
    while (at < len) {
        json_error_t e;
        json_t *doc;
        const json_t *hit;
        at += strspn(s + at, " \t\r\n");
        if (at == len)
            break;
        doc = json_loadb(s + at, len - at, JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, &e);
        if (!doc)
            return -ENOENT;
        hit = daemon_json_find(doc, key, 0);
        if (hit)
            *v = (uint64_t)json_integer_value(hit);
        json_decref(doc);
        if (hit)
            return 0;
        if (e.position <= 0)
            break;
        at += (size_t)e.position;
    }
    return -ENOENT;
}

void daemon_smooth_fill(const struct kvc_key *k, uint16_t *p, size_t n)
{
    uint64_t s = daemon_block_seed(k);
    double phase = (double)(s >> 11) * 0x1p-53 * 6.283185307179586;
    for (size_t j = 0; j < n; j++) {
        double noise = (double)(daemon_mix(s + j) >> 11) * 0x1p-52 - 1.0; /* [-1, 1) */
        _Float16 h = (_Float16)(sin((double)j * 0.37 + phase) * 3.0 + noise);
        memcpy(&p[j], &h, 2);
    }
}

double daemon_smooth_err(const struct kvc_key *k, const uint16_t *got, size_t n)
{
    uint16_t *want = malloc(n * 2);
    double e = 0, r = 0;
    if (!want)
        return INFINITY;
    daemon_smooth_fill(k, want, n);
    for (size_t j = 0; j < n; j++) {
        _Float16 a, b;
        memcpy(&a, &want[j], 2);
        memcpy(&b, &got[j], 2);
        e += ((double)a - (double)b) * ((double)a - (double)b);
        r += (double)a * (double)a;
    }
    free(want);
    return sqrt(e / r);
}

void daemon_server_params(struct server_params *vp, const char *sock, uint32_t mode,
                          uint32_t max_clients, const struct config *cfg, struct acl *acl)
{
    *vp = (struct server_params){.socket_path = sock,
                                 .socket_mode = mode,
                                 .max_clients = max_clients,
                                 .cfg = cfg,
                                 .acl = acl,
                                 .max_clients_per_uid = 8,
                                 .hello_timeout_ms = 5000,
                                 .idle_timeout_ms = 60000,
                                 .reservation_timeout_ms = 60000,
                                 .max_waits = 2,
                                 .max_namespaces_per_uid = 8,
                                 .client_pins = 4096,
                                 .uid_pins = 8192,
                                 .uid_leases = 64,
                                 .uid_reserved_share = 50};
}
