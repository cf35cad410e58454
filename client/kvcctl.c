/*
 * kvcctl — inspect and steer a running kvcd through libkvc.
 *
 * DESIGN
 * One table of commands drives dispatch, `kvcctl help` and each command's --help. Every
 * command that prints data has a --json form. Exit codes: 0 ok, 1 an error (the daemon
 * refused, could not be reached, or has nothing that matches), 2 usage (kvcctl's own
 * arguments: one line saying which and why, never silence). Every error is one line on
 * stderr naming its cause. This file holds the table, the global options and the helpers
 * every command uses (client/kvcctl.h); the commands live by family: kvcctl_watch.c
 * (status, stats, clients, metrics, top, tiers), kvcctl_blocks.c (ns, ls, show) and
 * kvcctl_admin.c (policy, config, reload, evict, flush, shutdown).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc.h"
#include "client/kvcctl.h"

/* Why a connect to path failed with rc, in words a newcomer can act on, into buf. A refused
 * connection is a stale socket only when path is a socket; a permission denied is the socket's
 * mode only when every directory above it may be entered. */
static const char *ctl_connect_why(const char *path, int rc, char *buf, size_t len)
{
    struct stat st;
    if (rc == -ENOENT || rc == -ENOTDIR)
        return "no socket there (kvcd not running, or -s / $KVCD_SOCKET name another path)";
    if (rc == -ENAMETOOLONG)
        return "the path is longer than a Unix socket's 107 bytes (use a shorter one)";
    if (rc == -ECONNREFUSED && stat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
        snprintf(buf, len, "not a socket but a %s (-s / $KVCD_SOCKET name kvcd's socket file)",
                 S_ISDIR(st.st_mode)   ? "directory"
                 : S_ISREG(st.st_mode) ? "regular file"
                                       : "special file");
        return buf;
    }
    if (rc == -ECONNREFUSED)
        return "nothing listens there (a stale socket: kvcd is not running)";
    if (rc == -EACCES) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s", path);
        for (char *slash = strchr(dir + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
            *slash = 0;
            if (access(dir, X_OK) != 0 && errno == EACCES) {
                snprintf(buf, len,
                         "permission denied: this user may not enter the directory %s (its "
                         "mode or owner)",
                         dir);
                return buf;
            }
            *slash = '/';
        }
        return "permission denied (the socket's group or mode: server.socket_group, "
               "server.socket_mode)";
    }
    return kvc_strerror(rc);
}

/* The pid of the kvcd that holds path's start lock (PATH.lock, taken before the arena is made
 * and held while kvcd runs; its socket comes last), or 0. Read from /proc/locks, so that the
 * check takes no lock itself: a starting kvcd that met one would refuse to start. */
static pid_t ctl_lock_holder(const char *path)
{
    char lock[PATH_MAX], line[256];
    struct stat st;
    pid_t pid = 0;
    FILE *f;
    snprintf(lock, sizeof(lock), "%s.lock", path);
    if (stat(lock, &st) != 0 || !(f = fopen("/proc/locks", "re")))
        return 0;
    while (!pid && fgets(line, sizeof(line), f)) {
        unsigned maj, min;
        unsigned long ino;
        int p;
        if (sscanf(line, "%*d: FLOCK %*s %*s %d %x:%x:%lu", &p, &maj, &min, &ino) == 4 &&
            ino == st.st_ino && maj == major(st.st_dev) && min == minor(st.st_dev))
            pid = p;
    }
    fclose(f);
    return pid;
}

int ctl_connect(struct ctl *x)
{
    const char *path = x->socket ? x->socket : kvc_default_socket();
    char why[PATH_MAX + 128];
    int rc = kvc_connect(x->socket, &x->c);
    /* A kvcd that is starting (`kvcd & kvcctl status`) is waited for, up to 10 s. */
    for (int i = 0; (rc == -ENOENT || rc == -ECONNREFUSED) && ctl_lock_holder(path); i++) {
        if (i == 200) {
            snprintf(why, sizeof(why),
                     "kvcd (pid %d) is still starting: its socket is not bound yet (its log says "
                     "how far it got)",
                     (int)ctl_lock_holder(path));
            fprintf(stderr, "kvcctl: cannot reach kvcd at %s: %s\n", path, why);
            return 1;
        }
        usleep(50000);
        rc = kvc_connect(x->socket, &x->c);
    }
    if (rc) {
        fprintf(stderr, "kvcctl: cannot reach kvcd at %s: %s\n", path,
                ctl_connect_why(path, rc, why, sizeof(why)));
        return 1;
    }
    return 0;
}

/* A usage error of command cmd: one line on stderr, exit status 2. */
__attribute__((format(printf, 2, 3))) int ctl_bad(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "kvcctl %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (kvcctl %s --help)\n", cmd);
    return 2;
}

/* After getopt_long (opterr 0, optstring starting with ':') returned '?' or ':'. */
int ctl_bad_option(const char *cmd, char **argv, int opt)
{
    const char *arg = argv[optind - 1];
    if (opt == ':')
        return ctl_bad(cmd, "%s needs a value", arg);
    if (optopt && strncmp(arg, "--", 2) != 0)
        return ctl_bad(cmd, "unknown option -%c", optopt);
    return ctl_bad(cmd, "unknown option %s", arg);
}

/* Reals are written with 15 significant digits: a value rounded to the decimals a field
 * promises (ctl_json_fixed) prints as exactly those digits. */
#define CTL_JSON_FLAGS (JSON_ENCODE_ANY | JSON_REAL_PRECISION(15))

int ctl_json_print(json_t *doc)
{
    char *text = doc ? json_dumps(doc, CTL_JSON_FLAGS) : NULL;
    json_decref(doc);
    if (!text) {
        fprintf(stderr, "kvcctl: cannot write JSON (out of memory)\n");
        return 1;
    }
    printf("%s\n", text);
    free(text);
    return 0;
}

json_t *ctl_json_text(const char *s)
{
    return json_stringn_nocheck(s, strlen(s));
}

json_t *ctl_json_u64(uint64_t v)
{
    return v <= INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v);
}

json_t *ctl_json_fixed(double v, int decimals)
{
    double scale = 1;
    for (int i = 0; i < decimals; i++)
        scale *= 10;
    if (!isfinite(v))
        return json_null();
    if (decimals == 0 && fabs(v) < 9.2e18)
        return json_integer((json_int_t)llround(v));
    return json_real(round(v * scale) / scale);
}

int ctl_json_add(json_t *obj, const char *key, json_t *v)
{
    return obj && json_object_set_new(obj, key, v) == 0 ? 0 : -1;
}

/* Prints a refusal on one line and returns the exit status (1): msg, the cause (the
 * daemon's reason, or what kvcctl knows the errno means here), else kvc_strerror. */
int ctl_fail(const char *what, int rc, const char *msg)
{
    if (msg && *msg)
        fprintf(stderr, "kvcctl: %s: %s\n", what, msg);
    else if (rc == -EPERM)
        fprintf(stderr,
                "kvcctl: %s: not permitted (admin requests need root, kvcd's user or "
                "its server.admin_group)\n",
                what);
    else
        fprintf(stderr, "kvcctl: %s: %s\n", what, kvc_strerror(rc));
    return 1;
}

uint32_t ctl_parse_ns(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    return *end || v <= 0 || v > 65535 ? 0 : (uint32_t)v;
}

static int ctl_help(struct ctl *x, int argc, char **argv);

static const struct ctl_cmd ctl_cmds[] = {
    {"status", "", "daemon pid, uptime, clients, tier usage, token hit ratio", ctl_status,
     "--json: one object {pid, socket, uptime_s, clients, namespaces, blocks, host_used,\n"
     "host_capacity, tokens_requested, tokens_hit, token_hit_ratio, load_us,\n"
     "recompute_saved_est_us}."},
    {"stats", "", "every counter, in total and per namespace", ctl_stats,
     "--json: {\"total\": {NAME: N}, \"namespaces\": [{id, model, stats: {NAME: N}}]}."},
    {"ns", "[drop ID]",
     "namespaces: model, layout, block size, blocks cached; drop one and its blocks (admin)",
     ctl_ns,
     "drop ID: every block of namespace ID in every tier, then the namespace (admin);\n"
     "refused while a client holds a lease or reservation on it."},
    {"ls", "[--ns ID] [--tier T] [--codec C] [--prefix HEX] [--limit N]",
     "cached blocks with their metadata", ctl_ls,
     "  --ns ID       blocks of namespace ID (kvcctl ns)\n"
     "  --tier T      gpu, host or disk\n"
     "  --codec C     raw, q8_0, q4_1, q5_1, kivi2, kivi4 or fp8\n"
     "  --prefix HEX  keys starting with these hex digits (1 to 32)\n"
     "  --limit N     at most N rows (default 1000)\n"
     "A filter outside those values is a usage error (exit 2)."},
    {"show", "KEY", "one block: metadata and where it lives (KEY or a unique prefix)", ctl_show,
     "KEY: 32 hex digits, or a prefix that one cached key starts with. A prefix more keys\n"
     "start with is an error (exit 1) naming two of them; none, an error too."},
    {"top", "[--interval S] [--count N]",
     "live view each second: hit ratio, throughput, tier usage, clients", ctl_top,
     "  --interval S  seconds between frames, 0.05 to 3600 (default 1)\n"
     "  --count N     frames, then exit; 0: until interrupted (the default on a terminal;\n"
     "                otherwise 1)\n"
     "--json writes one JSON object per frame and line (JSON Lines): {token_hit_ratio,\n"
     "tokens_requested, tokens_hit, tokens_requested_per_s, tokens_hit_per_s, lookups_per_s,\n"
     "bytes_in_per_s, bytes_out_per_s, evicted_per_s, host_used, host_capacity, clients}."},
    {"clients", "", "connected clients: pid, uid, pins, reservations, counters", ctl_clients, NULL},
    {"tiers", "[--interval S]",
     "per tier: capacity, used, blocks, pages, fragmentation, I/O, bytes/s, errors; the "
     "remote tier's nodes, slots, hits and state",
     ctl_tiers,
     "  --interval S  seconds between the two samples rates come from, 0 to 3600\n"
     "                (default 1; 0: averages since the daemon started)"},
    {"policy", "[get] [--ns ID] | set [--ns ID] NAME",
     "the default and each namespace's policy (set: admin)", ctl_policy,
     "NAME: lru, lfu, prefix, streaming, h2o, snapkv, keynorm, quest, default, vatp; with --ns,\n"
     "inherit follows the default again. A set lasts until the next reload."},
    {"config", "get [KEY] | set KEY VALUE",
     "options of the running daemon (set: admin, reloadable options)", ctl_config,
     "KEY: SECTION.NAME (kvcctl config get lists them). --json values are typed: numbers,\n"
     "sizes in bytes, durations in milliseconds, true/false, strings; an option shown to\n"
     "admins only is null. A set of an option that cannot change while kvcd runs is refused\n"
     "(exit 1) with the daemon's reason."},
    {"reload", "", "reload the config file and wait for the verdict (admin)", ctl_reload, NULL},
    {"evict", "--ns ID | --tier T | --all", "evict unpinned blocks (admin)", ctl_evict,
     "  --ns ID   every unpinned block of namespace ID\n"
     "  --tier T  host, disk or all\n"
     "  --all     every unpinned block"},
    {"flush", "", "evict every unpinned block (admin)", ctl_flush, NULL},
    {"metrics", "", "counters in the Prometheus text format", ctl_metrics,
     "--json: [{\"name\", \"labels\": {NAME: VALUE}, \"value\"}], one per sample."},
    {"shutdown", "", "stop the daemon (admin)", ctl_shutdown, NULL},
    {"help", "[COMMAND]", "this text, or one command's", ctl_help, NULL},
};

static const struct ctl_cmd *ctl_cmd_find(const char *name)
{
    for (size_t i = 0; i < sizeof(ctl_cmds) / sizeof(ctl_cmds[0]); i++)
        if (strcmp(name, ctl_cmds[i].name) == 0)
            return &ctl_cmds[i];
    return NULL;
}

/* `kvcctl CMD --help`, `kvcctl help CMD`. */
static void ctl_cmd_usage(const struct ctl_cmd *c)
{
    printf("usage: kvcctl [-s SOCKET] [--json] %s%s%s\n\n%s.\n", c->name, *c->args ? " " : "",
           c->args, c->help);
    if (c->detail)
        printf("\n%s\n", c->detail);
    printf("\nexit status: 0 ok, 1 error (one line on stderr says why), 2 usage\n");
}

static int ctl_help(struct ctl *x, int argc, char **argv)
{
    (void)x;
    if (argc == 2) {
        const struct ctl_cmd *c = ctl_cmd_find(argv[1]);
        if (!c)
            return ctl_bad("help", "no command '%s'", argv[1]);
        ctl_cmd_usage(c);
        return 0;
    }
    if (argc > 2)
        return ctl_bad("help", "takes at most one COMMAND");
    printf("usage: kvcctl [-s SOCKET] [--json] COMMAND [ARGS]\n\n"
           "  -s, --socket PATH   kvcd's socket (default: $KVCD_SOCKET, else %s)\n"
           "  -j, --json          machine-readable output\n\ncommands (kvcctl COMMAND --help "
           "for one):\n",
           kvc_default_socket());
    for (size_t i = 0; i < sizeof(ctl_cmds) / sizeof(ctl_cmds[0]); i++) {
        char head[64];
        snprintf(head, sizeof(head), "%s %s", ctl_cmds[i].name, ctl_cmds[i].args);
        if (strlen(head) > 28)
            printf("  %s\n  %-28s %s\n", head, "", ctl_cmds[i].help);
        else
            printf("  %-28s %s\n", head, ctl_cmds[i].help);
    }
    printf("\nexit status: 0 ok, 1 error (one line on stderr says why), 2 usage\n");
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    struct ctl x = {0};
    int opt, rc;
    opterr = 0; /* usage errors are reported by kvcctl, one line each */
    /* Global options stop at the command name. */
    while ((opt = getopt_long(argc, argv, "+:s:jh", opts, NULL)) != -1) {
        switch (opt) {
        case 's':
            x.socket = optarg;
            break;
        case 'j':
            x.json = true;
            break;
        case 'h':
            return ctl_help(&x, 1, NULL);
        case ':':
            fprintf(stderr, "kvcctl: %s needs a value (kvcctl help)\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "kvcctl: unknown option %s (kvcctl help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "kvcctl: no command given (kvcctl help lists them)\n");
        return 2;
    }
    const struct ctl_cmd *cmd = ctl_cmd_find(argv[optind]);
    if (!cmd) {
        fprintf(stderr, "kvcctl: unknown command '%s' (kvcctl help lists them)\n", argv[optind]);
        return 2;
    }
    /* --help anywhere after the command; --json after it as well as before. */
    int sub_argc = argc - optind;
    char **sub_argv = argv + optind;
    for (int k = 1; k < sub_argc; k++) {
        if (strcmp(sub_argv[k], "--help") == 0 || strcmp(sub_argv[k], "-h") == 0) {
            ctl_cmd_usage(cmd);
            return 0;
        }
        if (strcmp(sub_argv[k], "--json") == 0 || strcmp(sub_argv[k], "-j") == 0) {
            x.json = true;
            memmove(&sub_argv[k], &sub_argv[k + 1], (size_t)(sub_argc - k - 1) * sizeof(char *));
            sub_argc--;
            k--;
        }
    }
    rc = cmd->run(&x, sub_argc, sub_argv);
    kvc_disconnect(x.c);
    return rc;
}
