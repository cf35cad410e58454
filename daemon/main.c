/*
 * main.c — kvcd: arguments, configuration, start, signals, reload, stop.
 *
 * DESIGN
 * One thread runs the loop. Signals are blocked and read from a signalfd, so handlers never
 * run: SIGTERM/SIGINT stop the loop (a second one exits at once), SIGHUP reloads. Reload
 * builds a complete new configuration (file + the same -o overrides), validates it and
 * checks that only reloadable options changed; then it is applied whole, or refused with
 * one log line and the running configuration untouched.
 * Start: the socket path is claimed first (a lock beside it, then a connect), before any
 * memory is touched, so a second kvcd learns at once that the path is taken whatever
 * host.size says; the arenas' first pages are faulted in, the socket serves, and the rest
 * of the arenas is faulted in by threads in the background (tiers/host.c), its progress in
 * the systemd status, `kvcctl status` and the STATS gauge host_faulted.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/acl.h"
#include "daemon/config.h"
#include "daemon/config_ns.h"
#include "daemon/engine.h"
#include "daemon/engine_disk.h"
#include "daemon/engine_gpu.h"
#include "daemon/engine_remote.h"
#include "daemon/remote_keys.h"
#include "daemon/log.h"
#include "daemon/loop.h"
#include "daemon/notify.h"
#include "daemon/quant.h"
#include "daemon/server.h"
#include "daemon/store.h"
#include "tiers/disk.h"
#include "tiers/host.h"

#define KVCD_VERSION "0.1.0"

struct kvcd {
    const char *config_path;
    char **overrides; /* "section.key=value", borrowed from argv */
    int noverrides;
    struct config *cfg;
    struct loop *loop;
    struct store *store;
    struct server *server;
    int sigfd;
    int stopping;
    struct acl *acl;
    bool adopt; /* socket activation: serve adopt_fd */
    int adopt_fd;
    struct remote_keys *rkeys; /* the remote tier's secrets (remote.nodes set); owned */
    int lock_fd;               /* the socket path's lock (kvcd_claim_socket), or -1 */
    char lock_path[128];
    bool faulted; /* every host arena is faulted in (or prefault is off) */
};

static void kvcd_usage(FILE *f)
{
    fprintf(f, "usage: kvcd [-c FILE] [-o SECTION.KEY=VALUE]... [--check-config | --print-config | "
               "--print-man]\n"
               "\n"
               "  -c, --config FILE    read FILE (default: built-in defaults only)\n"
               "  -o SECTION.KEY=VAL   override one option (repeatable)\n"
               "      --check-config   validate the configuration and exit\n"
               "      --print-config   print the effective configuration as an ini file\n"
               "      --print-man      print the option table as troff (kvcd.ini(5))\n"
               "  -V, --version        print the version\n"
               "  -h, --help           this text\n");
}

/* Builds a configuration from the file and the overrides. NULL with a message on stderr. */
static struct config *kvcd_config_build(const struct kvcd *d, char *err, size_t errlen)
{
    struct config *c = config_new();
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (d->config_path && config_load_file(c, d->config_path, err, errlen))
        goto fail;
    for (int i = 0; i < d->noverrides; i++) {
        char key[128];
        const char *eq = strchr(d->overrides[i], '=');
        if (!eq || (size_t)(eq - d->overrides[i]) >= sizeof(key)) {
            snprintf(err, errlen, "-o %s: expected SECTION.KEY=VALUE", d->overrides[i]);
            goto fail;
        }
        memcpy(key, d->overrides[i], (size_t)(eq - d->overrides[i]));
        key[eq - d->overrides[i]] = 0;
        if (config_set(c, key, eq + 1, err, errlen))
            goto fail;
    }
    if (config_validate(c, err, errlen))
        goto fail;
    if (*c->server_admin_group && !getgrnam(c->server_admin_group)) {
        snprintf(err, errlen, "server.admin_group: no group '%s' on this host",
                 c->server_admin_group);
        goto fail;
    }
    return c;
fail:
    config_free(c);
    return NULL;
}

/* Whether `path` names a file kvcd can create or use: it exists (a regular file or a block
 * device; `file_only`: a regular file), or its directory does. 0, or -1 with the reason. */
static int kvcd_path_check(const char *opt, const char *path, bool file_only, char *err,
                           size_t errlen)
{
    struct stat st;
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    if (stat(path, &st) == 0) {
        if (S_ISREG(st.st_mode) || (!file_only && S_ISBLK(st.st_mode)))
            return 0;
        snprintf(err, errlen, "%s: %.200s is neither a regular file%s", opt, path,
                 file_only ? "" : " nor a block device");
        return -1;
    }
    if (errno != ENOENT) {
        snprintf(err, errlen, "%s: %.200s: %s", opt, path, strerror(errno));
        return -1;
    }
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else
        snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
    if (stat(dir, &st) < 0) {
        snprintf(err, errlen, "%s: %.200s cannot be created: its directory %.200s %s", opt, path,
                 dir, errno == ENOENT || errno == ENOTDIR ? "does not exist" : strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s: %.200s cannot be created: %.200s is not a directory", opt, path,
                 dir);
        return -1;
    }
    return 0;
}

/* The disk tier's files, checked where the configuration cannot: each disk.path and the
 * checkpoint file must exist or be creatable in an existing directory (a typo there would
 * otherwise show only when kvcd starts). 0, or -1 with err. */
static int kvcd_paths_check(const struct config *c, char *err, size_t errlen)
{
    char *list, *save = NULL;
    int rc = 0;
    if (!c->disk_path[0])
        return 0;
    list = strdup(c->disk_path);
    if (!list) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (char *p = strtok_r(list, ",", &save); p && rc == 0; p = strtok_r(NULL, ",", &save))
        rc = kvcd_path_check("disk.path", p, false, err, errlen);
    free(list);
    if (rc == 0 && c->disk_checkpoint_interval && c->disk_checkpoint_path[0])
        rc = kvcd_path_check("disk.checkpoint_path", c->disk_checkpoint_path, true, err, errlen);
    return rc;
}

/* host.prefault_threads, 0 meaning one per CPU (at most 8). */
static uint32_t kvcd_prefault_threads(const struct config *c)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (c->host_prefault_threads)
        return (uint32_t)c->host_prefault_threads;
    return n < 1 ? 1 : n > 8 ? 8 : (uint32_t)n;
}

/* server.io_threads, auto resolved for the CPUs the daemon may run on. */
static uint32_t kvcd_io_threads(const struct config *c)
{
    cpu_set_t set;
    if (c->server_io_threads >= 0)
        return (uint32_t)c->server_io_threads;
    return config_io_threads_auto(sched_getaffinity(0, sizeof(set), &set) == 0
                                      ? CPU_COUNT(&set)
                                      : sysconf(_SC_NPROCESSORS_ONLN));
}

static void kvcd_store_params(const struct config *c, struct store_params *p)
{
    static const int huge[] = {[CONFIG_HUGEPAGES_AUTO] = TIER_HOST_HUGE_AUTO,
                               [CONFIG_HUGEPAGES_ON] = TIER_HOST_HUGE_ON,
                               [CONFIG_HUGEPAGES_OFF] = TIER_HOST_HUGE_OFF};
    *p = (struct store_params){.host_size = c->host_size,
                               .host_page_size = c->host_page_size,
                               .host_huge = huge[c->host_hugepages],
                               .host_prefault = c->host_prefault,
                               .host_prefault_threads = kvcd_prefault_threads(c),
                               .host_collapse = c->host_thp_collapse,
                               .high_watermark = c->host_high_watermark,
                               .low_watermark = c->host_low_watermark,
                               .max_namespaces = (uint32_t)c->server_max_namespaces,
                               .max_handles = (uint32_t)c->server_max_leases,
                               .policy = (enum policy_kind)c->cache_policy,
                               .recompute_tokens_per_s = (uint64_t)c->cache_recompute_tokens_per_s,
                               .ghosts = c->cache_ghosts,
                               .quantize_inflight = (uint32_t)c->host_quantize_inflight,
                               .quantize_threads = (uint32_t)c->host_quantize_threads,
                               .head_step = c->host_head_step,
                               .fast_path = c->server_fast_path,
                               .gpu_size = c->gpu_pool_size,
                               .gpu_device = (int)c->gpu_device,
                               .gpu_page_size = c->gpu_pool_page_size};
}

static void kvcd_server_params(const struct kvcd *d, const struct config *c,
                               struct server_params *p)
{
    struct group *g = *c->server_admin_group ? getgrnam(c->server_admin_group) : NULL;
    *p =
        (struct server_params){.socket_path = c->server_socket,
                               .socket_mode = c->server_socket_mode,
                               .socket_group = c->server_socket_group,
                               .max_clients = (uint32_t)c->server_max_clients,
                               .io_threads = kvcd_io_threads(c),
                               .io_threads_min_active = (uint32_t)c->server_io_threads_min_active,
                               .adopt = d->adopt,
                               .adopt_fd = d->adopt_fd,
                               .has_admin_gid = g != NULL,
                               .admin_gid = g ? g->gr_gid : 0,
                               .cfg = c,
                               .acl = d->acl,
                               .max_clients_per_uid = (uint32_t)c->server_max_clients_per_uid,
                               .hello_timeout_ms = c->server_hello_timeout,
                               .idle_timeout_ms = c->server_idle_timeout,
                               .reservation_timeout_ms = c->server_reservation_timeout,
                               .max_waits = (uint32_t)c->server_max_waits,
                               .max_namespaces_per_uid = (uint32_t)c->server_max_namespaces_per_uid,
                               .client_pins = (uint64_t)c->quota_client_pins,
                               .uid_pins = (uint64_t)c->quota_uid_pins,
                               .uid_leases = (uint64_t)c->quota_uid_leases,
                               .uid_reserved_share = (uint32_t)c->quota_uid_reserved_share,
                               .fast_ring_rate = (uint32_t)c->server_fast_ring_rate};
}

/* Checks of the places kvcd will use, made before anything slow (pre-faulting the arena
 * takes about a second per GiB) and by --check-config, so that a start that cannot succeed
 * fails at once and leaves nothing behind. */

/* Each disk.path (existing or creatable: kvcd_paths_check) on a file system with room for
 * disk.capacity beyond what its file already holds, so that a start that cannot size it
 * fails before it creates anything. 0, or -ENOSPC (or -errno) with the cause in err. */
static int kvcd_check_disk(const struct config *c, char *err, size_t len)
{
    char *list = strdup(c->disk_path), *save = NULL;
    int rc = list ? 0 : -ENOMEM;
    for (char *p = list ? strtok_r(list, ",", &save) : NULL; p && !rc;
         p = strtok_r(NULL, ",", &save)) {
        char dir[4096];
        struct stat st;
        struct statvfs fs;
        uint64_t have = 0, need = c->disk_capacity + TIER_DISK_SB;
        const char *slash = strrchr(p, '/');
        snprintf(dir, sizeof(dir), "%.*s", slash ? (slash == p ? 1 : (int)(slash - p)) : 1,
                 slash ? p : ".");
        if (stat(p, &st) == 0) {
            if (!S_ISREG(st.st_mode))
                continue; /* a block device: its size bounds the tier */
            have = (uint64_t)st.st_blocks * 512;
        } else if (access(dir, W_OK | X_OK) < 0) {
            rc = -errno;
            snprintf(err, len, "disk.path %.200s: cannot create it in %.200s (%s)", p, dir,
                     strerror(errno));
            break;
        }
        if (need > have && statvfs(dir, &fs) == 0 &&
            (uint64_t)fs.f_bavail * fs.f_frsize < need - have) {
            snprintf(err, len,
                     "disk.path %.200s: its file system has %llu MiB free, disk.capacity needs "
                     "%llu MiB more there (lower disk.capacity or free space)",
                     p, (unsigned long long)((uint64_t)fs.f_bavail * fs.f_frsize >> 20),
                     (unsigned long long)((need - have + (1u << 20) - 1) >> 20));
            rc = -ENOSPC;
        }
    }
    free(list);
    return rc;
}

/* The socket path: not served by another kvcd. 0, or -EADDRINUSE with the cause in err
 * (a stale socket file is left for the server to replace). */
static int kvcd_check_socket(const struct config *c, char *err, size_t len)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    char path[sizeof(a.sun_path)];
    int fd, rc = 0;
    if (server_socket_path(c->server_socket, path, sizeof(path)) < 0) {
        snprintf(err, len, "server.socket: the path is longer than %zu bytes", sizeof(path) - 1);
        return -ENAMETOOLONG;
    }
    memcpy(a.sun_path, path, sizeof(path));
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
        snprintf(err, len, "another kvcd is serving %s; not starting", path);
        rc = -EADDRINUSE;
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

/* The directory of the socket path exists and this user may make the socket there, or an
 * error that says what to change: a bind at the end of the start would fail, after the
 * arena was made. 0, or -errno with the cause in err. */
static int kvcd_check_socket_dir(const struct config *c, const char *path, char *err, size_t len)
{
    char dir[108];
    char *slash;
    snprintf(dir, sizeof(dir), "%s", path);
    slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else
        slash[slash == dir] = 0; /* "/x.sock": the root */
    if (access(dir, W_OK | X_OK) == 0)
        return 0;
    int rc = -errno;
    if (rc == -ENOENT)
        snprintf(err, len,
                 "cannot listen on %s: the directory %s does not exist (make it, or set "
                 "server.socket%s)",
                 path, dir,
                 !c->server_socket[0] && geteuid() != 0
                     ? "; a user's default is $XDG_RUNTIME_DIR/kvcd.sock, and XDG_RUNTIME_DIR "
                       "is unset"
                     : "");
    else
        snprintf(err, len,
                 "cannot listen on %s: this user may not make a file in %s (%s; set "
                 "server.socket to a directory it may write)",
                 path, dir, strerror(-rc));
    return rc;
}

/* Claims the socket path for this process before anything slow: a connect (a kvcd serving
 * it), then a lock on PATH.lock, held until exit (a kvcd still starting, not yet listening,
 * holds it too). 0, or -EADDRINUSE with the cause in err. Where the lock file can be neither
 * made nor opened (a directory only the socket's owner may write) the connect alone decides. */
static int kvcd_claim_socket(struct kvcd *d, char *err, size_t len)
{
    char path[108];
    int rc = kvcd_check_socket(d->cfg, err, len);
    if (rc)
        return rc;
    if (server_socket_path(d->cfg->server_socket, path, sizeof(path)) < 0)
        return 0; /* kvcd_check_socket said so already */
    if (strncmp(path, "/run/kvcd/", 10) == 0)
        mkdir("/run/kvcd", 0755);
    rc = kvcd_check_socket_dir(d->cfg, path, err, len);
    if (rc)
        return rc;
    snprintf(d->lock_path, sizeof(d->lock_path), "%s.lock", path);
    d->lock_fd = open(d->lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (d->lock_fd < 0)
        d->lock_fd = open(d->lock_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (d->lock_fd < 0) {
        d->lock_path[0] = 0;
        return 0;
    }
    if (flock(d->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        rc = errno == EWOULDBLOCK ? -EADDRINUSE : 0;
        if (rc)
            snprintf(err, len,
                     "another kvcd is starting or serving %s (it holds %s); not "
                     "starting",
                     path, d->lock_path);
        close(d->lock_fd);
        d->lock_fd = -1;
        d->lock_path[0] = 0;
    }
    return rc;
}

/* Lets the socket path go at exit: the lock file is removed while still held, so no kvcd
 * can take a lock on a file that is no longer the path's. */
static void kvcd_release_socket(struct kvcd *d)
{
    if (d->lock_fd < 0)
        return;
    if (d->lock_path[0])
        unlink(d->lock_path);
    close(d->lock_fd);
    d->lock_fd = -1;
}

/* Applies a complete, validated configuration whose changes are all reloadable, or refuses
 * it (-EROFS, reason in msg) leaving everything as it was. Takes next either way. */
static int kvcd_apply(struct kvcd *d, struct config *next, char *msg, size_t len)
{
    struct config *old = d->cfg;
    struct store_params sp;
    struct server_params vp;
    int rc = config_check_reload(d->cfg, next, msg, len);
    if (rc) {
        config_free(next);
        return rc;
    }
    d->cfg = next;
    log_setup((enum log_level)d->cfg->log_level, (uint32_t)d->cfg->log_rate_limit);
    kvcd_store_params(d->cfg, &sp);
    store_reload(d->store, &sp);
    if (d->acl)
        acl_reload(d->acl, d->cfg);
    engine_disk_reload(d->store, (uint32_t)d->cfg->disk_admit_hits);
    engine_disk_compress_set(d->store, (int)d->cfg->disk_compress);
    engine_remote_reload(d->store, (uint32_t)d->cfg->remote_min_hits, d->cfg->remote_negative_ttl);
    kvcd_server_params(d, d->cfg, &vp);
    server_reload(d->server, &vp);
    server_ns_policies(d->server);
    config_free(old);
    return 0;
}

/* The reload of SIGHUP and RELOAD: file and -o overrides again, all or nothing. */
static int kvcd_reload_verdict(void *arg, char *msg, size_t len)
{
    struct kvcd *d = arg;
    char err[512];
    struct config *next;
    int rc;
    notify_reloading();
    next = kvcd_config_build(d, err, sizeof(err));
    rc = next ? kvcd_apply(d, next, err, sizeof(err)) : -EINVAL;
    if (rc) {
        log_err("config: reload refused (%s); the running configuration is unchanged", err);
        snprintf(msg, len, "%s", err);
        notify_ready("serving; the last reload was refused (see the log)");
    } else {
        log_info("config: reloaded");
        snprintf(msg, len, "configuration reloaded");
        notify_ready("serving; configuration reloaded");
    }
    return rc;
}

static void kvcd_reload(struct kvcd *d)
{
    char msg[512];
    kvcd_reload_verdict(d, msg, sizeof(msg));
}

/* CONFIG_SET: the running configuration with one option changed, checked like a reload.
 * Holds until the next reload, which rereads the file. */
static int kvcd_config_set_hook(void *arg, const char *key, const char *value, char *msg,
                                size_t len)
{
    struct kvcd *d = arg;
    struct config *next = config_dup(d->cfg);
    int rc;
    if (!next)
        return -ENOMEM;
    rc = config_set(next, key, value, msg, len);
    if (rc == 0)
        rc = config_validate(next, msg, len);
    if (rc) {
        config_free(next);
        return rc;
    }
    rc = kvcd_apply(d, next, msg, len);
    if (rc == 0) {
        log_info("config: %s set to '%s' by an admin (until the next reload)", key, value);
        snprintf(msg, len, "%s = %s", key, value);
    }
    return rc;
}

static void kvcd_shutdown_hook(void *arg)
{
    struct kvcd *d = arg;
    d->stopping++;
    notify_stopping();
    loop_stop(d->loop);
}

static void kvcd_on_signal(struct loop *l, int fd, uint32_t events, void *arg)
{
    struct kvcd *d = arg;
    struct signalfd_siginfo si;
    (void)events;
    while (read(fd, &si, sizeof(si)) == sizeof(si)) {
        switch (si.ssi_signo) {
        case SIGTERM:
        case SIGINT:
            if (d->stopping++) {
                log_warn("kvcd: second stop signal, exiting at once");
                _exit(1);
            }
            log_info("kvcd: stopping (signal %u from pid %u)", si.ssi_signo, si.ssi_pid);
            notify_stopping();
            loop_stop(l);
            break;
        case SIGHUP:
            kvcd_reload(d);
            break;
        default:
            break;
        }
    }
}

/* While the arenas are faulted in: the systemd status says how far; once they are, one log
 * line with the rate, and the disk tier registers arena 0 with io_uring (pinning it). */
static void kvcd_fault_tick(struct kvcd *d)
{
    uint64_t faulted, total, ns = 0, collapsed = 0;
    uint32_t threads = 0;
    bool done = true;
    char status[192];
    if (d->faulted)
        return;
    for (uint32_t a = 0; a < d->store->narenas; a++) {
        struct tier_host_fault_stats st;
        done &= tier_host_fault_done(d->store->arenas[a].tier, &st);
        ns = st.ns > ns ? st.ns : ns;
        threads = st.threads > threads ? st.threads : threads;
        collapsed += st.collapsed;
    }
    store_host_faulted(d->store, &faulted, &total);
    if (!done) {
        snprintf(status, sizeof(status),
                 "serving %s, host tier %llu MiB, %llu MiB faulted in (%.0f%%)",
                 server_path(d->server), (unsigned long long)(total >> 20),
                 (unsigned long long)(faulted >> 20), 100.0 * (double)faulted / (double)total);
        notify_status(status);
        return;
    }
    d->faulted = true;
    if (d->cfg->host_prefault && threads)
        log_info("host: %llu MiB faulted in within %.1f s of the start (%.2f GB/s, %u threads "
                 "in the background; %llu MiB made 2 MiB pages by collapse)",
                 (unsigned long long)(total >> 20), (double)ns / 1e9,
                 ns ? (double)total / (double)ns : 0.0, threads,
                 (unsigned long long)(collapsed >> 20));
    engine_disk_buffers_register(d->store);
    snprintf(status, sizeof(status), "serving %s, host tier %llu MiB", server_path(d->server),
             (unsigned long long)(store_host_capacity(d->store) >> 20));
    notify_status(status);
}

static void kvcd_tick(void *arg)
{
    struct kvcd *d = arg;
    kvcd_fault_tick(d);
    store_fast_faulted_publish(d->store); /* arenas added later are faulted in after the rest */
    store_gpu_reg_tick(d->store);
    engine_trim(d->store, loop_now_ms(d->loop));
    notify_watchdog(loop_now_ms(d->loop));
    server_tick(d->server);
    engine_disk_checkpoint_tick(d->store, d->cfg->disk_checkpoint_interval,
                                d->cfg->disk_checkpoint_bytes);
}

/* While the disk index loads, systemd is asked for more start time (no-op without it). */
static void kvcd_disk_progress(void *arg, uint64_t done, uint64_t pages)
{
    char status[96];
    (void)arg;
    snprintf(status, sizeof(status), "loading the disk index (%llu/%llu pages)",
             (unsigned long long)done, (unsigned long long)pages);
    notify_extend_timeout(30000000);
    notify_status(status);
}

static void kvcd_before_wait(void *arg)
{
    struct kvcd *d = arg;
    engine_disk_flush(d->store);
}

static void kvcd_on_disk(struct loop *l, int fd, uint32_t events, void *arg)
{
    struct kvcd *d = arg;
    (void)fd;
    (void)events;
    engine_disk_poll(d->store, loop_now_ms(l));
    server_retry(d->server, loop_now_ms(l)); /* puts that wait for room */
}

/* A copy between the pool and a host arena may have landed (engine_gpu.h). */
static void kvcd_on_gpu(struct loop *l, int fd, uint32_t events, void *arg)
{
    struct kvcd *d = arg;
    (void)fd;
    (void)events;
    engine_gpu_poll(d->store, loop_now_ms(l));
    server_retry(d->server, loop_now_ms(l)); /* a promotion gave back a host slot */
}

static void kvcd_on_remote(struct loop *l, int fd, uint32_t events, void *arg)
{
    struct kvcd *d = arg;
    (void)fd;
    (void)events;
    engine_remote_poll(d->store, loop_now_ms(l));
}

/* Whether namespaces of model_id use the remote tier ([namespace.PATTERN] remote), and
 * their keys in a sealed tier. */
static int kvcd_remote_ns(void *arg, const char *model_id, const uint8_t ns[REMOTE_REC_NS_BYTES],
                          struct remote_seal *seal)
{
    const struct kvcd *d = arg;
    return remote_keys_ns(d->rkeys, d->cfg, model_id, ns, seal);
}

/* Starts the remote tier of remote.nodes. 0 or -errno, logged. */
static int kvcd_remote_attach(struct kvcd *d)
{
    const struct config *c = d->cfg;
    struct engine_remote_params rp = {
        .tier = {.nodes = c->remote_nodes,
                 .user = c->remote_user,
                 .password = remote_keys_password(d->rkeys),
                 .sealed = remote_keys_sealed(d->rkeys),
                 .seal_threads = (uint32_t)c->remote_seal_threads,
                 .connect_timeout_ms = (uint32_t)c->remote_connect_timeout,
                 .timeout_ms = (uint32_t)c->remote_timeout,
                 .max_inflight = (uint32_t)c->remote_max_inflight,
                 .batch = (uint32_t)c->remote_batch,
                 .part_size = c->remote_part_size,
                 .backoff_min_ms = (uint32_t)c->remote_backoff_min,
                 .backoff_max_ms = (uint32_t)c->remote_backoff_max},
        .admit_hits = (uint32_t)c->remote_min_hits,
        .negative_ttl_ms = c->remote_negative_ttl,
        .queue = (uint32_t)c->remote_queue,
        .ns_seal = kvcd_remote_ns,
        .ns_seal_arg = d};
    int rc = engine_remote_attach(d->store, &rp);
    if (rc) {
        log_err("remote: cannot start the remote tier on %s (%s)", c->remote_nodes, strerror(-rc));
        return rc;
    }
    if (remote_keys_sealed(d->rkeys))
        log_info("remote: tier on %s, records sealed", c->remote_nodes);
    else
        log_warn("remote: tier on %s, records NOT sealed (remote.seal = no): anyone who can "
                 "reach the cluster can read them or plant blocks; restricted namespaces stay "
                 "out",
                 c->remote_nodes);
    return loop_add(d->loop, engine_remote_fd(d->store), EPOLLIN, kvcd_on_remote, d);
}

/* A namespace's disk_compress from its [namespace.PATTERN] section, or -1. */
static int kvcd_disk_level(void *arg, const char *model_id)
{
    const struct kvcd *d = arg;
    return config_ns_disk_compress(&d->cfg->ns, model_id);
}

/* A namespace of a record found on disk at start: placed and bound to its section as
 * NS_OPEN does; refused (the record is dropped) when it cannot be. */
static int kvcd_disk_ns_open(void *arg, const struct kvc_wire_layout *l, uint32_t *ns_id,
                             bool *created)
{
    struct kvcd *d = arg;
    int rc = acl_ns_open(d->acl, l, ns_id, created);
    if (rc && rc != -EEXIST)
        log_limited(LOG_LEVEL_WARNING, "disk: records of namespace '%.*s' dropped (%s)",
                    (int)sizeof(l->model_id), l->model_id, strerror(-rc));
    return rc;
}

/* Opens the disk tier of disk.path (comma-separated). 0 or -errno, logged. */
static int kvcd_disk_attach(struct kvcd *d)
{
    static const uint32_t format[] = {[CONFIG_DISK_FORMAT_AUTO] = TIER_DISK_FORMAT_AUTO,
                                      [CONFIG_DISK_FORMAT_NEVER] = TIER_DISK_FORMAT_NEVER,
                                      [CONFIG_DISK_FORMAT_FORCE] = TIER_DISK_FORMAT_FORCE};
    const struct config *c = d->cfg;
    struct engine_disk_params tp = {.size = c->disk_capacity,
                                    .page_size = c->disk_page,
                                    .queue_depth = (uint32_t)c->disk_queue_depth,
                                    .write_rate = c->disk_write_rate,
                                    .admit_hits = (uint32_t)c->disk_admit_hits,
                                    .compact_below = (uint32_t)c->disk_compact_below,
                                    .compress_level = (int)c->disk_compress,
                                    .ns_level = kvcd_disk_level,
                                    .ns_level_arg = d,
                                    .ns_open = kvcd_disk_ns_open,
                                    .ns_open_arg = d,
                                    .workers = (uint32_t)c->disk_workers,
                                    .progress = kvcd_disk_progress,
                                    .format = format[c->disk_format],
                                    .ckpt_path = !c->disk_checkpoint_interval ? ""
                                                 : *c->disk_checkpoint_path
                                                     ? c->disk_checkpoint_path
                                                     : NULL};
    char *list = strdup(c->disk_path), *save = NULL;
    int rc = -ENOMEM;
    if (!list)
        goto out;
    for (char *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        if (tp.npaths == sizeof(tp.paths) / sizeof(tp.paths[0])) {
            rc = -E2BIG;
            log_err("disk: more than %u paths in disk.path", tp.npaths);
            goto out;
        }
        tp.paths[tp.npaths++] = p;
    }
    rc = engine_disk_attach(d->store, &tp);
    if (rc) {
        log_err("disk: cannot open the disk tier on %s (%s)", c->disk_path, strerror(-rc));
        goto out;
    }
    engine_disk_checkpoint_started(d->store);
    rc = loop_add(d->loop, engine_disk_fd(d->store), EPOLLIN, kvcd_on_disk, d);
    if (rc == 0)
        loop_before_wait(d->loop, kvcd_before_wait, d);
out:
    free(list);
    return rc;
}

/* Whether the host gives transparent huge pages to shared memory that asks for them (the
 * arena and the shared index do): shmem_enabled is advise, within_size, always or force
 * (never and deny give none). */
static bool kvcd_shmem_thp(void)
{
    char buf[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");
    if (!f)
        return false;
    bool ok = fgets(buf, sizeof(buf), f) != NULL;
    fclose(f);
    return ok && (strstr(buf, "[advise]") || strstr(buf, "[within_size]") ||
                  strstr(buf, "[always]") || strstr(buf, "[force]"));
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"config", required_argument, NULL, 'c'},
                                         {"check-config", no_argument, NULL, 'C'},
                                         {"print-config", no_argument, NULL, 'P'},
                                         {"version", no_argument, NULL, 'V'},
                                         {"print-man", no_argument, NULL, 'M'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    struct kvcd d = {.sigfd = -1, .lock_fd = -1};
    struct store_params sp;
    struct server_params vp;
    char err[512];
    int check = 0, print = 0, opt, rc = 1;
    sigset_t mask;

    d.overrides = calloc((size_t)argc, sizeof(char *));
    if (!d.overrides)
        return 1;
    while ((opt = getopt_long(argc, argv, "c:o:Vh", opts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            d.config_path = optarg;
            break;
        case 'o':
            d.overrides[d.noverrides++] = optarg;
            break;
        case 'C':
            check = 1;
            break;
        case 'M':
            free(d.overrides);
            return config_print_man(stdout) ? 1 : 0;
        case 'P':
            print = 1;
            break;
        case 'V':
            printf("kvcd %s\n", KVCD_VERSION);
            free(d.overrides);
            return 0;
        case 'h':
            kvcd_usage(stdout);
            free(d.overrides);
            return 0;
        default:
            kvcd_usage(stderr);
            free(d.overrides);
            return 2;
        }
    }
    if (optind != argc) {
        kvcd_usage(stderr);
        free(d.overrides);
        return 2;
    }
    d.cfg = kvcd_config_build(&d, err, sizeof(err));
    if (!d.cfg) {
        fprintf(stderr, "kvcd: %s\n", err);
        goto out;
    }
    if (!print && kvcd_paths_check(d.cfg, err, sizeof(err))) {
        fprintf(stderr, "kvcd: %s\n", err);
        goto out;
    }
    /* The remote tier's secrets before anything slow: a key file that cannot be read stops
     * the start at once (and fails --check-config). */
    if (d.cfg->remote_nodes[0]) {
        d.rkeys = remote_keys_load(d.cfg, &rc, err, sizeof(err));
        if (!d.rkeys) {
            fprintf(stderr, "kvcd: remote: %s\n", err);
            rc = 1;
            goto out;
        }
    }
    if (!print && d.cfg->disk_path[0] && kvcd_check_disk(d.cfg, err, sizeof(err))) {
        fprintf(stderr, "kvcd: disk: %s\n", err);
        rc = 1;
        goto out;
    }
    if (check) {
        printf("kvcd: configuration OK\n");
        rc = 0;
        goto out;
    }
    if (print) {
        rc = config_print(d.cfg, stdout) ? 1 : 0;
        goto out;
    }
    log_setup((enum log_level)d.cfg->log_level, (uint32_t)d.cfg->log_rate_limit);

    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    d.sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    d.loop = loop_new(&rc);
    if (d.sigfd < 0 || !d.loop) {
        log_err("kvcd: cannot set up the event loop (%s)", strerror(errno));
        rc = 1;
        goto out;
    }
    loop_add(d.loop, d.sigfd, EPOLLIN, kvcd_on_signal, &d);

    rc = notify_listen_fd(&d.adopt_fd);
    if (rc < 0) {
        rc = 1;
        goto out;
    }
    d.adopt = rc == 1;
    if (!d.adopt && kvcd_claim_socket(&d, err, sizeof(err))) {
        log_err("server: %s", err);
        rc = 1;
        goto out;
    }
    kvcd_store_params(d.cfg, &sp);
    /* Only the arena's first pages are faulted in before kvcd serves; but the GPU pool
     * registers the arena with the device, which faults it all in: ask systemd for the time
     * then (1 s per GiB is ample), so a big host tier does not trip the start timeout. */
    if (sp.gpu_size)
        notify_extend_timeout(((sp.host_size >> 30) + 30) * 1000000ull);
    d.store = store_new(&sp, &rc);
    if (d.store)
        engine_attach(d.store);
    if (!d.store) {
        log_err("host: cannot create the arena of %llu bytes (%s)",
                (unsigned long long)sp.host_size, strerror(-rc));
        rc = 1;
        goto out;
    }
    struct tier_host_fault_stats fst;
    (void)tier_host_fault_done(d.store->arenas[0].tier, &fst);
    log_info("host: arena of %llu MiB ready (memory pages: %s; host.page_size, the "
             "allocator's unit: %llu KiB; %llu MiB faulted in, the rest by %u threads while "
             "kvcd serves)",
             (unsigned long long)(store_host_capacity(d.store) >> 20),
             tier_host_hugetlb(d.store->arenas[0].tier) ? "hugetlb"
             : kvcd_shmem_thp()
                 ? "transparent huge pages where the kernel has them free (shmem THP)"
             : fst.collapsed
                 ? "2 MiB, transparent huge pages made by collapse (host.thp_collapse; shmem "
                   "THP is off here)"
                 : "4 KiB: shmem THP is off here and host.thp_collapse is off or refused "
                   "(Linux 6.1 or later); reserve hugetlb pages or set "
                   "transparent_hugepage/shmem_enabled to advise (docs/configuration.md)",
             (unsigned long long)(sp.host_page_size >> 10),
             (unsigned long long)(tier_host_faulted(d.store->arenas[0].tier) >> 20),
             sp.host_prefault ? sp.host_prefault_threads : 0);
    if (engine_gpu_fd(d.store) >= 0 &&
        (rc = loop_add(d.loop, engine_gpu_fd(d.store), EPOLLIN, kvcd_on_gpu, &d)) != 0) {
        log_err("gpu: cannot watch the pool's copies (%s)", strerror(-rc));
        rc = 1;
        goto out;
    }
    if (!quant_new(d.loop, d.store, &rc)) {
        log_err("quant: cannot start the quantize-in-place worker (%s)", strerror(-rc));
        rc = 1;
        goto out;
    }

    d.acl = acl_new(d.store, d.cfg, &rc);
    if (!d.acl) {
        rc = 1;
        goto out;
    }
    if (d.cfg->disk_path[0] && kvcd_disk_attach(&d)) {
        rc = 1;
        goto out;
    }
    if (d.cfg->remote_nodes[0] && kvcd_remote_attach(&d)) {
        rc = 1;
        goto out;
    }
    kvcd_server_params(&d, d.cfg, &vp);
    if (d.cfg->server_io_threads < 0)
        log_info("server: %u I/O threads (server.io_threads = auto)", vp.io_threads);
    d.server = server_new(d.loop, d.store, &vp, &rc);
    if (!d.server) {
        char path[108];
        server_socket_path(vp.socket_path, path, sizeof(path));
        if (rc == -EADDRINUSE)
            log_err("server: another kvcd is serving %s; not starting", path);
        else
            log_err("server: cannot listen on %s (%s)", path, strerror(-rc));
        rc = 1;
        goto out;
    }
    server_set_hooks(d.server, &(struct server_hooks){.arg = &d,
                                                      .reload = kvcd_reload_verdict,
                                                      .config_set = kvcd_config_set_hook,
                                                      .shutdown = kvcd_shutdown_hook});
    log_info("kvcd %s: ready on %s (pid %d%s)", KVCD_VERSION, server_path(d.server), (int)getpid(),
             d.adopt ? ", socket from systemd" : "");
    {
        char status[160];
        uint64_t wd = notify_watchdog_period_ms();
        snprintf(status, sizeof(status), "serving %s, host tier %llu MiB", server_path(d.server),
                 (unsigned long long)(store_host_capacity(d.store) >> 20));
        notify_ready(status);
        kvcd_fault_tick(&d); /* the status with the fault-in's progress */
        notify_watchdog(loop_now_ms(d.loop));
        rc = loop_run(d.loop, wd && wd < 1000 ? (int)wd : 1000, kvcd_tick, &d);
    }
    /* The loop no longer reads signals: a second stop signal now ends kvcd at once (the
     * previous checkpoint stays whole), while this one drains the disk and writes one. */
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigprocmask(SIG_UNBLOCK, &mask, NULL);
    engine_disk_checkpoint_stop(d.store);
    if (rc)
        log_err("kvcd: event loop failed (%s)", strerror(-rc));
    rc = rc ? 1 : 0;
    log_info("kvcd: stopped");
out:
    server_free(d.server);
    acl_free(d.acl);
    if (d.store)
        engine_stop(d.store); /* the quantize worker before the loop it watches goes */
    store_free(d.store);
    loop_free(d.loop);
    if (d.sigfd >= 0)
        close(d.sigfd);
    remote_keys_free(d.rkeys);
    kvcd_release_socket(&d);
    config_free(d.cfg);
    free(d.overrides);
    return rc;
}
