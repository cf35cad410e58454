/*
 * kvcctl — inspect and steer a running kvcd through libkvc.
 *
 * DESIGN
 * One table of commands drives dispatch, `kvcctl help` and each command's --help. Every
 * command that prints data has a --json form. Exit codes: 0 ok, 1 an error (the daemon
 * refused, could not be reached, or has nothing that matches), 2 usage (kvcctl's own
 * arguments: one line saying which and why, never silence). Every error is one line on
 * stderr naming its cause.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc.h"

struct ctl {
    const char *socket;
    bool json;
    kvc_client *c;
};

struct ctl_cmd {
    const char *name;
    const char *args;
    const char *help;
    int (*run)(struct ctl *x, int argc, char **argv);
    const char *detail; /* options and output forms, for `kvcctl CMD --help`; may be NULL */
};

static int ctl_connect(struct ctl *x)
{
    const char *path = x->socket ? x->socket : kvc_default_socket();
    int rc = kvc_connect(x->socket, &x->c);
    if (rc) {
        fprintf(stderr, "kvcctl: cannot reach kvcd at %s: %s\n", path,
                rc == -ENOENT ? "no socket there (kvcd not running, or -s / $KVCD_SOCKET name "
                                "another path)"
                : rc == -ECONNREFUSED ? "nothing listens there (a stale socket: kvcd is not "
                                        "running)"
                : rc == -EACCES       ? "permission denied (the socket's group or mode: "
                                        "server.socket_group, server.socket_mode)"
                                      : kvc_strerror(rc));
        return 1;
    }
    return 0;
}

/* A usage error of command cmd: one line on stderr, exit status 2. */
__attribute__((format(printf, 2, 3))) static int ctl_bad(const char *cmd, const char *fmt, ...)
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
static int ctl_bad_option(const char *cmd, char **argv, int opt)
{
    const char *arg = argv[optind - 1];
    if (opt == ':')
        return ctl_bad(cmd, "%s needs a value", arg);
    if (optopt && strncmp(arg, "--", 2) != 0)
        return ctl_bad(cmd, "unknown option -%c", optopt);
    return ctl_bad(cmd, "unknown option %s", arg);
}

/* Whether s is 1 to 32 hex digits (a key or a prefix of one). */
static bool ctl_hex(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 32)
        return false;
    for (; *s; s++)
        if (!isxdigit((unsigned char)*s))
            return false;
    return true;
}

/* Width of a MODEL column: the longest id of the table (at least `min`). */
static int ctl_model_width(const struct kvc_ns_info *ns, size_t n, int min)
{
    size_t w = (size_t)min;
    for (size_t i = 0; i < n; i++)
        w = strlen(ns[i].model_id) > w ? strlen(ns[i].model_id) : w;
    return (int)w;
}

static const char *ctl_dtype_name(enum kvc_dtype d)
{
    switch (d) {
    case KVC_DTYPE_FP16:
        return "fp16";
    case KVC_DTYPE_BF16:
        return "bf16";
    case KVC_DTYPE_FP32:
        return "fp32";
    case KVC_DTYPE_FP8_E4M3:
        return "fp8_e4m3";
    case KVC_DTYPE_INT8:
        return "int8";
    default:
        return "?";
    }
}

/* Names of the wire tier and format numbers (kvc_proto.h KVC_WIRE_TIER_*, *_FORMAT_*). */
static const char *ctl_tier_name(uint8_t t)
{
    return t == 1 ? "host" : t == 2 ? "disk" : t == 3 ? "gpu" : "?";
}

static const char *ctl_codec_name(uint8_t f)
{
    static const char *const names[] = {"raw", "q8_0", "q4_1", "q5_1", "kivi2", "kivi4", "fp8"};
    return f < sizeof(names) / sizeof(names[0]) ? names[f] : "?";
}

static uint64_t ctl_stat(const struct kvc_stat *s, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s[i].name, name) == 0)
            return s[i].value;
    return 0;
}

static void ctl_json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    }
    putchar('"');
}

static void ctl_key(const struct kvc_key *k, char out[33])
{
    snprintf(out, 33, "%016" PRIx64 "%016" PRIx64, k->hi, k->lo);
}

static double ctl_ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0.0;
}

/* ---- commands --------------------------------------------------------------------------- */

static int ctl_status(struct ctl *x, int argc, char **argv)
{
    struct kvc_stat *s;
    size_t n;
    uint32_t pid;
    int rc;
    if (argc != 1)
        return ctl_bad(argv[0], "takes no arguments ('%s')", argv[1]);
    if (ctl_connect(x))
        return 1;
    rc = kvc_stats(x->c, 0, &s, &n);
    if (rc) {
        fprintf(stderr, "kvcctl: stats: %s\n", kvc_strerror(rc));
        return 1;
    }
    kvc_peer_info(x->c, &pid, NULL, NULL);
    uint64_t lt = ctl_stat(s, n, "lookup_tokens"), ht = ctl_stat(s, n, "hit_tokens");
    if (x->json) {
        printf("{\"pid\": %u, \"socket\": ", pid);
        ctl_json_str(x->socket ? x->socket : kvc_default_socket());
        printf(", \"uptime_s\": %" PRIu64 ", \"clients\": %" PRIu64 ", \"namespaces\": %" PRIu64
               ", \"blocks\": %" PRIu64 ", \"host_used\": %" PRIu64 ", \"host_capacity\": %" PRIu64
               ", \"tokens_requested\": %" PRIu64 ", \"tokens_hit\": %" PRIu64
               ", \"token_hit_ratio\": %.4f, \"load_us\": %" PRIu64
               ", \"recompute_saved_est_us\": %" PRIu64 ", \"host_faulted\": %" PRIu64
               ", \"host_arenas_bytes\": %" PRIu64 "}\n",
               ctl_stat(s, n, "uptime_s"), ctl_stat(s, n, "clients_now"),
               ctl_stat(s, n, "namespaces_now"), ctl_stat(s, n, "blocks_now"),
               ctl_stat(s, n, "host_used"), ctl_stat(s, n, "host_capacity"), lt, ht,
               ctl_ratio(ht, lt), ctl_stat(s, n, "load_us"),
               ctl_stat(s, n, "recompute_saved_est_us"), ctl_stat(s, n, "host_faulted"),
               ctl_stat(s, n, "host_arenas_bytes"));
    } else {
        printf("kvcd pid %u on %s, up %" PRIu64 " s\n", pid,
               x->socket ? x->socket : kvc_default_socket(), ctl_stat(s, n, "uptime_s"));
        printf("clients %" PRIu64 ", namespaces %" PRIu64 ", blocks %" PRIu64 "\n",
               ctl_stat(s, n, "clients_now"), ctl_stat(s, n, "namespaces_now"),
               ctl_stat(s, n, "blocks_now"));
        printf("host tier %.1f / %.1f MiB (%.1f%%)\n",
               (double)ctl_stat(s, n, "host_used") / 1048576.0,
               (double)ctl_stat(s, n, "host_capacity") / 1048576.0,
               100.0 * ctl_ratio(ctl_stat(s, n, "host_used"), ctl_stat(s, n, "host_capacity")));
        uint64_t hf = ctl_stat(s, n, "host_faulted"), ha = ctl_stat(s, n, "host_arenas_bytes");
        if (hf < ha)
            printf("host arenas faulted in: %.1f / %.1f MiB (%.1f%%, the rest in the "
                   "background)\n",
                   (double)hf / 1048576.0, (double)ha / 1048576.0, 100.0 * ctl_ratio(hf, ha));
        printf("tokens hit %" PRIu64 " of %" PRIu64 " requested (%.1f%%)\n", ht, lt,
               100.0 * ctl_ratio(ht, lt));
        printf("hits loaded in %.1f ms (as clients report) vs ~%.1f ms to recompute them "
               "(cache.recompute_tokens_per_s)\n",
               (double)ctl_stat(s, n, "load_us") / 1000.0,
               (double)ctl_stat(s, n, "recompute_saved_est_us") / 1000.0);
    }
    free(s);
    return 0;
}

/* One line per tier: capacity, use, and whether it is on (the gpu tier is off without a
 * pool or a device; its capacity is 0 then). */
static void ctl_stats_print(const struct kvc_stat *s, size_t n, bool json)
{
    for (size_t i = 0; i < n; i++) {
        if (json) {
            printf("%s\"%s\": %" PRIu64, i ? ", " : "", s[i].name, s[i].value);
        } else {
            printf("  %-28s %" PRIu64 "\n", s[i].name, s[i].value);
        }
    }
}

static int ctl_stats(struct ctl *x, int argc, char **argv)
{
    struct kvc_stat *s;
    struct kvc_ns_info *ns = NULL;
    size_t n, nns = 0;
    int rc;
    if (argc != 1)
        return ctl_bad(argv[0], "takes no arguments ('%s')", argv[1]);
    if (ctl_connect(x))
        return 1;
    rc = kvc_stats(x->c, 0, &s, &n);
    if (rc == 0)
        rc = kvc_ns_list(x->c, &ns, &nns);
    if (rc) {
        fprintf(stderr, "kvcctl: stats: %s\n", kvc_strerror(rc));
        free(s);
        return 1;
    }
    if (x->json) {
        printf("{\"total\": {");
        ctl_stats_print(s, n, true);
        printf("}, \"namespaces\": [");
    } else {
        printf("total:\n");
        ctl_stats_print(s, n, false);
    }
    free(s);
    for (size_t i = 0; i < nns; i++) {
        rc = kvc_stats(x->c, ns[i].ns_id, &s, &n);
        if (rc) {
            fprintf(stderr, "kvcctl: stats of namespace %u: %s\n", ns[i].ns_id,
                    kvc_strerror(rc));
            free(ns);
            return 1;
        }
        if (x->json) {
            printf("%s{\"id\": %u, \"model\": ", i ? ", " : "", ns[i].ns_id);
            ctl_json_str(ns[i].model_id);
            printf(", \"stats\": {");
            ctl_stats_print(s, n, true);
            printf("}}");
        } else {
            printf("namespace %u (%s):\n", ns[i].ns_id, ns[i].model_id);
            ctl_stats_print(s, n, false);
        }
        free(s);
    }
    if (x->json)
        printf("]}\n");
    free(ns);
    return 0;
}

static int ctl_fail(const char *what, int rc, const char *msg);
static uint32_t ctl_parse_ns(const char *s);

/* ns drop ID (admin). */
static int ctl_ns_drop(struct ctl *x, int argc, char **argv)
{
    uint32_t id = argc == 3 ? ctl_parse_ns(argv[2]) : 0;
    uint64_t n = 0;
    int rc;
    if (!id)
        return ctl_bad("ns", "drop takes one namespace id (a number from kvcctl ns)");
    if (ctl_connect(x))
        return 1;
    rc = kvc_ns_drop(x->c, id, &n);
    if (rc)
        return ctl_fail("ns drop", rc,
                        rc == -ENOENT  ? "no such namespace"
                        : rc == -EBUSY ? "in use: a client holds a lease or reservation on it, "
                                         "or a block of it is moving (try again)"
                                       : NULL);
    if (x->json)
        printf("{\"dropped\": %u, \"blocks\": %" PRIu64 "}\n", id, n);
    else
        printf("namespace %u dropped with its %" PRIu64 " blocks\n", id, n);
    return 0;
}

/* A namespace's kind as ns, ls and show print it. */
static const char *ctl_kind_name(enum kvc_kv_kind k)
{
    return k == KVC_KV_KIND_KV          ? "kv"
           : k == KVC_KV_KIND_K_ONLY    ? "k"
           : k == KVC_KV_KIND_KV_WINDOW ? "kv_window"
           : k == KVC_KV_KIND_STATE     ? "state"
                                        : "?";
}

static int ctl_ns(struct ctl *x, int argc, char **argv)
{
    struct kvc_ns_info *ns;
    size_t n;
    int rc;
    if (argc >= 2 && strcmp(argv[1], "drop") == 0)
        return ctl_ns_drop(x, argc, argv);
    if (argc != 1)
        return ctl_bad("ns", "takes no arguments, or drop ID ('%s')", argv[1]);
    if (ctl_connect(x))
        return 1;
    rc = kvc_ns_list(x->c, &ns, &n);
    if (rc) {
        fprintf(stderr, "kvcctl: ns: %s\n", kvc_strerror(rc));
        return 1;
    }
    int mw = ctl_model_width(ns, n, 32);
    if (x->json)
        printf("[");
    else
        printf("%-4s %-*s %6s %5s %5s %6s %-8s %-4s %12s %8s %12s\n", "ID", mw, "MODEL", "LAYERS",
               "HEADS", "DIM", "TOKENS", "DTYPE", "KIND", "BLOCK_BYTES", "BLOCKS", "BYTES");
    for (size_t i = 0; i < n; i++) {
        const struct kvc_ns_info *o = &ns[i];
        const char *kind = ctl_kind_name(o->kv_kind);
        uint32_t window = 0;
        char kbuf[24];
        if (o->kv_kind == KVC_KV_KIND_KV_WINDOW && kvc_ns_window(x->c, o->ns_id, &window) == 0) {
            snprintf(kbuf, sizeof(kbuf), "kv_window:%u", window);
            kind = x->json ? kind : kbuf;
        }
        if (x->json) {
            printf("%s{\"id\": %u, \"model\": ", i ? ", " : "", o->ns_id);
            ctl_json_str(o->model_id);
            printf(", \"layers\": %u, \"kv_heads\": %u, \"head_dim\": %u, \"block_tokens\": %u, "
                   "\"dtype\": \"%s\", \"kv_kind\": \"%s\", \"window_tokens\": %u, "
                   "\"block_bytes\": %" PRIu64 ", \"blocks\": %" PRIu64 ", \"bytes\": %" PRIu64
                   ", \"arena\": %u}",
                   o->layers, o->kv_heads, o->head_dim, o->block_tokens, ctl_dtype_name(o->dtype),
                   kind, window, o->block_bytes, o->blocks, o->bytes, o->arena_id);
        } else {
            printf("%-4u %-*s %6u %5u %5u %6u %-8s %-4s %12" PRIu64 " %8" PRIu64 " %12" PRIu64 "\n",
                   o->ns_id, mw, o->model_id, o->layers, o->kv_heads, o->head_dim, o->block_tokens,
                   ctl_dtype_name(o->dtype), kind, o->block_bytes, o->blocks, o->bytes);
        }
    }
    if (x->json)
        printf("]\n");
    free(ns);
    return 0;
}

static int ctl_ls(struct ctl *x, int argc, char **argv)
{
    static const struct option opts[] = {{"ns", required_argument, NULL, 'n'},
                                         {"limit", required_argument, NULL, 'l'},
                                         {"tier", required_argument, NULL, 't'},
                                         {"codec", required_argument, NULL, 'c'},
                                         {"prefix", required_argument, NULL, 'p'},
                                         {NULL, 0, NULL, 0}};
    struct kvc_ns_info *ns = NULL;
    size_t nns = 0, shown = 0;
    long want_ns = 0, limit = 1000;
    const char *want_tier = NULL, *want_codec = NULL, *want_prefix = NULL;
    int opt, rc;
    bool first = true;
    optind = 1;
    while ((opt = getopt_long(argc, argv, ":n:l:t:c:p:", opts, NULL)) != -1) {
        char *end;
        switch (opt) {
        case 't':
            want_tier = optarg;
            if (strcmp(optarg, "gpu") && strcmp(optarg, "host") && strcmp(optarg, "disk"))
                return ctl_bad("ls", "--tier takes gpu, host or disk, not '%s'", optarg);
            break;
        case 'c': {
            bool known = false;
            want_codec = optarg;
            for (uint8_t f = 0; strcmp(ctl_codec_name(f), "?") != 0; f++)
                known |= strcmp(optarg, ctl_codec_name(f)) == 0;
            if (!known)
                return ctl_bad("ls",
                               "--codec takes raw, q8_0, q4_1, q5_1, kivi2, kivi4 or fp8, not "
                               "'%s'",
                               optarg);
            break;
        }
        case 'p':
            want_prefix = optarg;
            if (!ctl_hex(optarg))
                return ctl_bad("ls", "--prefix takes 1 to 32 hex digits of a key, not '%s'",
                               optarg);
            break;
        case 'n':
            want_ns = strtol(optarg, &end, 10);
            if (*end || want_ns <= 0 || want_ns > 65535)
                return ctl_bad("ls",
                               "--ns takes a namespace id (a number from kvcctl ns), not "
                               "'%s'",
                               optarg);
            break;
        case 'l':
            limit = strtol(optarg, &end, 10);
            if (*end || limit <= 0)
                return ctl_bad("ls", "--limit takes a number above 0, not '%s'", optarg);
            break;
        default:
            return ctl_bad_option("ls", argv, opt);
        }
    }
    if (optind != argc)
        return ctl_bad("ls", "takes options only ('%s')", argv[optind]);
    if (ctl_connect(x))
        return 1;
    rc = kvc_ns_list(x->c, &ns, &nns);
    if (rc) {
        fprintf(stderr, "kvcctl: ls: %s\n", kvc_strerror(rc));
        return 1;
    }
    if (x->json)
        printf("[");
    else
        printf("%-4s %-32s %-32s %5s %10s %6s %5s %5s %10s\n", "NS", "KEY", "PARENT", "DEPTH",
               "BYTES", "HITS", "PINS", "CHILD", "LAST_MS");
    for (size_t k = 0; k < nns && shown < (size_t)limit; k++) {
        uint64_t cursor = 0;
        if (want_ns && ns[k].ns_id != (uint32_t)want_ns)
            continue;
        do {
            struct kvc_block_info *b;
            size_t n;
            rc = kvc_block_list(x->c, ns[k].ns_id, &cursor, 512, &b, &n);
            if (rc) {
                fprintf(stderr, "kvcctl: ls: %s\n", kvc_strerror(rc));
                free(ns);
                return 1;
            }
            for (size_t i = 0; i < n && shown < (size_t)limit; i++) {
                char key[33], parent[33];
                ctl_key(&b[i].key, key);
                ctl_key(&b[i].parent, parent);
                if ((want_tier && strcmp(want_tier, ctl_tier_name(b[i].tier)) != 0) ||
                    (want_codec && strcmp(want_codec, ctl_codec_name(b[i].format)) != 0) ||
                    (want_prefix && strncasecmp(key, want_prefix, strlen(want_prefix)) != 0))
                    continue;
                shown++;
                if (x->json)
                    printf("%s{\"ns\": %u, \"kind\": \"%s\", \"key\": \"%s\", \"parent\": "
                           "\"%s\", \"depth\": %u, "
                           "\"bytes\": %" PRIu64 ", \"hits\": %u, \"pins\": %u, \"children\": %u, "
                           "\"last_access_ms\": %" PRIu64 ", \"tier\": \"%s\", \"codec\": \"%s\"}",
                           first ? "" : ", ", ns[k].ns_id, ctl_kind_name(ns[k].kv_kind), key,
                           parent, b[i].depth, b[i].bytes, b[i].hits, b[i].pins, b[i].children,
                           b[i].last_access_ms, ctl_tier_name(b[i].tier),
                           ctl_codec_name(b[i].format));
                else
                    printf("%-4u %-32s %-32s %5u %10" PRIu64 " %6u %5u %5u %10" PRIu64 "\n",
                           ns[k].ns_id, key, parent, b[i].depth, b[i].bytes, b[i].hits,
                           b[i].pins, b[i].children, b[i].last_access_ms);
                first = false;
            }
            free(b);
        } while (cursor && shown < (size_t)limit);
    }
    if (x->json)
        printf("]\n");
    free(ns);
    return 0;
}

/* Prints a refusal on one line and returns the exit status (1): msg, the cause (the
 * daemon's reason, or what kvcctl knows the errno means here), else kvc_strerror. */
static int ctl_fail(const char *what, int rc, const char *msg)
{
    if (msg && *msg)
        fprintf(stderr, "kvcctl: %s: %s\n", what, msg);
    else if (rc == -EPERM)
        fprintf(stderr, "kvcctl: %s: not permitted (admin requests need root, kvcd's user or "
                        "its server.admin_group)\n", what);
    else
        fprintf(stderr, "kvcctl: %s: %s\n", what, kvc_strerror(rc));
    return 1;
}

static uint32_t ctl_parse_ns(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    return *end || v <= 0 || v > 65535 ? 0 : (uint32_t)v;
}

/* show KEY: the block whose key is KEY, or the one key that starts with KEY. A prefix that
 * more keys start with is refused (exit 1) once a second is seen, not listed. */
static int ctl_show(struct ctl *x, int argc, char **argv)
{
    struct kvc_ns_info *ns = NULL;
    struct kvc_block_info one = {0};
    size_t nns = 0, one_ns = 0, klen;
    char first[33] = "", second[33] = "";
    int rc, found = 0;
    if (argc != 2)
        return ctl_bad("show", "takes one KEY (32 hex digits, or a prefix of them)");
    if (!ctl_hex(argv[1]))
        return ctl_bad("show", "KEY is 1 to 32 hex digits, not '%s'", argv[1]);
    klen = strlen(argv[1]);
    if (ctl_connect(x))
        return 1;
    rc = kvc_ns_list(x->c, &ns, &nns);
    if (rc)
        return ctl_fail("show", rc, NULL);
    for (size_t k = 0; k < nns && found < 2; k++) {
        uint64_t cursor = 0;
        do {
            struct kvc_block_info *b;
            size_t n;
            rc = kvc_block_list(x->c, ns[k].ns_id, &cursor, 512, &b, &n);
            if (rc) {
                free(ns);
                return ctl_fail("show", rc, NULL);
            }
            for (size_t i = 0; i < n && found < 2; i++) {
                char key[33];
                ctl_key(&b[i].key, key);
                if (strncasecmp(key, argv[1], klen) != 0)
                    continue;
                if (found++ == 0) {
                    one = b[i];
                    one_ns = k;
                    memcpy(first, key, sizeof(first));
                } else {
                    memcpy(second, key, sizeof(second));
                }
            }
            free(b);
        } while (cursor && found < 2 && !(found && klen == 32));
    }
    if (found != 1) {
        if (found)
            fprintf(stderr,
                    "kvcctl show: %s is ambiguous: keys %s and %s (at least) start "
                    "with it; give more digits\n",
                    argv[1], first, second);
        else
            fprintf(stderr, "kvcctl show: no cached block has a key %s %s\n",
                    klen == 32 ? "equal to" : "starting with", argv[1]);
        free(ns);
        return 1;
    }
    const struct kvc_ns_info *o = &ns[one_ns];
    char parent[33];
    ctl_key(&one.parent, parent);
    if (x->json) {
        printf("[{\"ns\": %u, \"model\": ", o->ns_id);
        ctl_json_str(o->model_id);
        printf(", \"kind\": \"%s\", \"key\": \"%s\", \"parent\": \"%s\", \"depth\": %u, "
               "\"bytes\": %" PRIu64
               ", \"tokens\": %u, \"hits\": %u, \"pins\": %u, \"children\": %u, "
               "\"last_access_ms\": %" PRIu64 ", \"tier\": \"%s\", \"arena\": %u, "
               "\"codec\": \"%s\"}]\n",
               ctl_kind_name(o->kv_kind), first, parent, one.depth, one.bytes, o->block_tokens, one.hits, one.pins,
               one.children, one.last_access_ms, ctl_tier_name(one.tier), o->arena_id,
               ctl_codec_name(one.format));
    } else {
        printf("key          %s\nparent       %s\nnamespace    %u (%s, %s)\n"
               "depth        %u (tokens %u..%u of its prefix)\nbytes        %" PRIu64
               "\nhits         %u\npins         %u\nchildren     %u\n"
               "last access  %" PRIu64 " ms after start\nlives in     %s tier, "
               "arena %u, codec %s\n",
               first, parent, o->ns_id, o->model_id, ctl_kind_name(o->kv_kind), one.depth,
               one.depth * o->block_tokens,
               (one.depth + 1) * o->block_tokens - 1, one.bytes, one.hits, one.pins, one.children,
               one.last_access_ms, ctl_tier_name(one.tier), o->arena_id,
               ctl_codec_name(one.format));
    }
    free(ns);
    return 0;
}

static int ctl_clients(struct ctl *x, int argc, char **argv)
{
    struct kvc_client_info *cl;
    size_t n;
    int rc;
    if (argc != 1)
        return ctl_bad(argv[0], "takes no arguments ('%s')", argv[1]);
    if (ctl_connect(x))
        return 1;
    rc = kvc_clients(x->c, &cl, &n);
    if (rc)
        return ctl_fail("clients", rc, NULL);
    if (x->json)
        printf("[");
    else
        printf("%-5s %-8s %-6s %-6s %-16s %6s %5s %8s %12s %8s %7s %6s %7s %s\n", "ID", "PID",
               "UID", "GID", "NAME", "LEASES", "RESV", "PINS", "RESV_BYTES", "REQS", "HIT%",
               "ERRS", "REFUSED", "FLAGS");
    for (size_t i = 0; i < n; i++) {
        const struct kvc_client_info *o = &cl[i];
        if (x->json) {
            printf("%s{\"id\": %u, \"pid\": %u, \"uid\": %u, \"gid\": %u, \"name\": ", i ? ", " : "",
                   o->conn_id, o->pid, o->uid, o->gid);
            ctl_json_str(o->name);
            printf(", \"leases\": %u, \"reservations\": %u, \"pins\": %" PRIu64
                   ", \"reserved_bytes\": %" PRIu64 ", \"requests\": %" PRIu64
                   ", \"lookup_tokens\": %" PRIu64 ", \"hit_tokens\": %" PRIu64
                   ", \"bytes_in\": %" PRIu64 ", \"bytes_out\": %" PRIu64 ", \"errors\": %" PRIu64
                   ", \"refusals\": %" PRIu64 ", \"admin\": %s, \"self\": %s}",
                   o->leases, o->reservations, o->pins, o->reserved_bytes, o->requests,
                   o->lookup_tokens, o->hit_tokens, o->bytes_in, o->bytes_out, o->errors,
                   o->refusals, o->admin ? "true" : "false", o->self ? "true" : "false");
        } else {
            printf("%-5u %-8u %-6u %-6u %-16.16s %6u %5u %8" PRIu64 " %12" PRIu64 " %8" PRIu64
                   " %6.1f%% %6" PRIu64 " %7" PRIu64 " %s%s\n",
                   o->conn_id, o->pid, o->uid, o->gid, o->name, o->leases, o->reservations,
                   o->pins, o->reserved_bytes, o->requests,
                   100.0 * ctl_ratio(o->hit_tokens, o->lookup_tokens), o->errors, o->refusals,
                   o->admin ? "admin" : "-", o->self ? ",self" : "");
        }
    }
    if (x->json)
        printf("]\n");
    free(cl);
    return 0;
}

/* policy [get] [--ns ID] | policy set [--ns ID] NAME: the default (cache.policy) and each
 * namespace's policy, or one namespace's. */
static int ctl_policy(struct ctl *x, int argc, char **argv)
{
    char text[65536];
    const char *pos[3] = {argv[0], NULL, NULL};
    uint32_t ns = 0;
    int npos = 1, rc;
    bool set;
    /* --ns ID anywhere after "policy" */
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (strcmp(argv[i], "--ns") == 0 && i + 1 < argc)
            v = argv[++i];
        else if (strncmp(argv[i], "--ns=", 5) == 0)
            v = argv[i] + 5;
        if (v && !(ns = ctl_parse_ns(v)))
            return ctl_bad("policy",
                           "--ns takes a namespace id (a number from kvcctl ns), not "
                           "'%s'",
                           v);
        if (!v && npos == 3) {
            npos++;
            break;
        }
        if (!v)
            pos[npos++] = argv[i];
    }
    argc = npos;
    argv = (char **)pos;
    set = argc == 3 && strcmp(argv[1], "set") == 0;
    if (!set && !(argc == 1 || (argc == 2 && strcmp(argv[1], "get") == 0)))
        return ctl_bad("policy", "takes [get] [--ns ID] or set [--ns ID] NAME");
    if (ctl_connect(x))
        return 1;
    if (set && (rc = kvc_policy_set(x->c, ns, argv[2])))
        return ctl_fail("policy set", rc,
                        rc == -EINVAL   ? "unknown policy name"
                        : rc == -ENOENT ? "no such namespace"
                                        : NULL);
    rc = kvc_policy_get(x->c, ns, text, sizeof(text));
    if (rc)
        return ctl_fail("policy", rc, rc == -ENOENT ? "no such namespace" : NULL);
    if (ns) {
        if (x->json)
            printf("{\"ns\": %u, \"policy\": \"%s\"}\n", ns, text);
        else
            printf("%s\n", text);
        return 0;
    }
    /* The default on the first line, then "ID MODEL POLICY SOURCE [LADDER]" per namespace
     * (LADDER: "-" or "codec:share,..." of its precision ladder; older daemons omit it). */
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    if (x->json)
        printf("{\"policy\": \"%s\", \"namespaces\": [", line ? line : "");
    else
        printf("default policy: %s\n", line ? line : "");
    int k = 0, mw = 40;
    /* the MODEL column as wide as the longest id */
    for (const char *l = line ? save : NULL; l && *l; /* the lines strtok_r has not cut yet */
         l += strcspn(l, "\n") + (l[strcspn(l, "\n")] ? 1 : 0)) {
        unsigned id;
        int a = 0, b = 0;
        if (sscanf(l, "%u %n%*s%n", &id, &a, &b) >= 1 && b - a > mw)
            mw = b - a;
    }
    while ((line = strtok_r(NULL, "\n", &save))) {
        char model[160], pol[32], src[16], lad[160] = "-";
        unsigned id;
        if (sscanf(line, "%u %159s %31s %15s %159s", &id, model, pol, src, lad) < 4)
            continue;
        if (x->json) {
            printf("%s{\"ns\": %u, \"model\": ", k ? ", " : "", id);
            ctl_json_str(model);
            printf(", \"policy\": \"%s\", \"source\": \"%s\", \"ladder\": {", pol, src);
            /* "raw:0.05,q8_0:0.95" -> {"raw": 0.05, "q8_0": 0.95} */
            char *s2 = NULL;
            int r = 0;
            for (char *t = strcmp(lad, "-") ? strtok_r(lad, ",", &s2) : NULL; t;
                 t = strtok_r(NULL, ",", &s2)) {
                char *colon = strchr(t, ':');
                if (!colon)
                    continue;
                *colon = 0;
                printf("%s", r++ ? ", " : "");
                ctl_json_str(t);
                printf(": %.2f", strtod(colon + 1, NULL));
            }
            printf("}}");
        } else {
            if (!k)
                printf("%-5s %-*s %-10s %-7s %s\n", "NS", mw, "MODEL", "POLICY", "FROM",
                       "LADDER (share of its bytes by codec)");
            printf("%-5u %-*s %-10s %-7s %s\n", id, mw, model, pol, src, lad);
        }
        k++;
    }
    if (x->json)
        printf("]}\n");
    return 0;
}

/* Edit distance of a and b (for "did you mean"), capped at 99. */
static int ctl_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    int row[128];
    if (la >= 127 || lb >= 127)
        return 99;
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            best = up + 1 < best ? up + 1 : best;
            best = row[j - 1] + 1 < best ? row[j - 1] + 1 : best;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb];
}

/* The option of the daemon's list nearest to key, into out (empty if none is near). */
static void ctl_config_nearest(struct ctl *x, const char *key, char *out, size_t len)
{
    static char all[65536];
    int best = 5;
    out[0] = 0;
    if (kvc_config_get(x->c, NULL, all, sizeof(all)))
        return;
    for (char *save = NULL, *line = strtok_r(all, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *eq = strstr(line, " = ");
        if (!eq)
            continue;
        *eq = 0;
        int d = ctl_distance(key, line);
        if (d < best) {
            best = d;
            snprintf(out, len, "%s", line);
        }
    }
}

static int ctl_config(struct ctl *x, int argc, char **argv)
{
    static char buf[65536];
    char msg[512], near[128], why[320];
    int rc;
    bool get = argc >= 2 && argc <= 3 && strcmp(argv[1], "get") == 0;
    bool set = argc == 4 && strcmp(argv[1], "set") == 0;
    if (!get && !set)
        return ctl_bad("config", "takes get [SECTION.KEY] or set SECTION.KEY VALUE");
    if (ctl_connect(x))
        return 1;
    if (set) {
        rc = kvc_config_set(x->c, argv[2], argv[3], msg, sizeof(msg));
        if (rc)
            return ctl_fail("config set", rc, msg);
        if (x->json) {
            printf("{\"applied\": true, \"key\": ");
            ctl_json_str(argv[2]);
            printf(", \"value\": ");
            ctl_json_str(argv[3]);
            printf("}\n");
        } else {
            printf("%s\n", msg);
        }
        return 0;
    }
    /* --json: the daemon writes the values typed (numbers, booleans, strings). */
    rc = x->json ? kvc_config_get_json(x->c, argc == 3 ? argv[2] : NULL, buf, sizeof(buf))
                 : kvc_config_get(x->c, argc == 3 ? argv[2] : NULL, buf, sizeof(buf));
    if (rc == -ENOENT && argc == 3) {
        ctl_config_nearest(x, argv[2], near, sizeof(near));
        snprintf(why, sizeof(why), "no option named %.100s%s%s%s (kvcctl config get lists them)",
                 argv[2], near[0] ? "; did you mean " : "", near, near[0] ? "?" : "");
        return ctl_fail("config get", rc, why);
    }
    if (rc == -EACCES && argc == 3) {
        snprintf(why, sizeof(why),
                 "%.100s is shown to admins only (root, kvcd's user or its "
                 "server.admin_group)",
                 argv[2]);
        return ctl_fail("config get", rc, why);
    }
    if (rc)
        return ctl_fail("config get", rc, NULL);
    if (!x->json) {
        printf("%s%s", buf, argc == 3 ? "\n" : "");
        return 0;
    }
    if (argc == 3) {
        printf("{");
        ctl_json_str(argv[2]);
        printf(": %s}\n", buf);
        return 0;
    }
    fputs(buf, stdout); /* one object, already JSON */
    return 0;
}

static int ctl_reload(struct ctl *x, int argc, char **argv)
{
    char msg[512];
    int rc;
    if (argc != 1)
        return ctl_bad(argv[0], "takes no arguments ('%s')", argv[1]);
    if (ctl_connect(x))
        return 1;
    rc = kvc_reload(x->c, msg, sizeof(msg));
    if (x->json) {
        printf("{\"applied\": %s, \"message\": ", rc ? "false" : "true");
        ctl_json_str(msg);
        printf("}\n");
    }
    if (rc)
        return ctl_fail("reload refused", rc, msg);
    if (!x->json)
        printf("%s\n", msg);
    return 0;
}

/* evict --ns ID | --tier T | --all; flush = evict --all. */
static int ctl_evict_run(struct ctl *x, const char *what, uint32_t ns, uint32_t tier)
{
    uint64_t n = 0;
    int rc;
    if (ctl_connect(x))
        return 1;
    rc = kvc_evict(x->c, ns, tier, &n);
    if (rc)
        return ctl_fail(what, rc, rc == -ENOENT ? "no such namespace" : NULL);
    if (x->json)
        printf("{\"evicted_blocks\": %" PRIu64 "}\n", n);
    else
        printf("evicted %" PRIu64 " blocks (pinned blocks and their parents stay)\n", n);
    return 0;
}

static int ctl_parse_tier(const char *s, uint32_t *tier)
{
    if (strcmp(s, "all") == 0)
        *tier = 0;
    else if (strcmp(s, "host") == 0)
        *tier = 1;
    else if (strcmp(s, "disk") == 0)
        *tier = 2;
    else
        return -1;
    return 0;
}

static int ctl_evict(struct ctl *x, int argc, char **argv)
{
    static const struct option opts[] = {{"ns", required_argument, NULL, 'n'},
                                         {"tier", required_argument, NULL, 't'},
                                         {"all", no_argument, NULL, 'a'},
                                         {NULL, 0, NULL, 0}};
    uint32_t ns = 0, tier = 0;
    bool any = false;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, ":n:t:a", opts, NULL)) != -1) {
        any = true;
        if (opt == 'n' && !(ns = ctl_parse_ns(optarg)))
            return ctl_bad("evict",
                           "--ns takes a namespace id (a number from kvcctl ns), not "
                           "'%s'",
                           optarg);
        if (opt == 't' && ctl_parse_tier(optarg, &tier))
            return ctl_bad("evict", "--tier takes host, disk or all, not '%s'", optarg);
        if (opt == '?' || opt == ':')
            return ctl_bad_option("evict", argv, opt);
    }
    if (!any || optind != argc)
        return ctl_bad("evict", "say what: --ns ID, --tier T or --all");
    return ctl_evict_run(x, "evict", ns, tier);
}

static int ctl_flush(struct ctl *x, int argc, char **argv)
{
    if (argc != 1)
        return ctl_bad("flush", "takes no arguments (see kvcctl evict)");
    (void)argv;
    return ctl_evict_run(x, "flush", 0, 0);
}

static int ctl_shutdown(struct ctl *x, int argc, char **argv)
{
    int rc;
    if (argc != 1)
        return ctl_bad(argv[0], "takes no arguments ('%s')", argv[1]);
    if (ctl_connect(x))
        return 1;
    rc = kvc_shutdown(x->c);
    if (rc)
        return ctl_fail("shutdown", rc, NULL);
    if (x->json)
        printf("{\"stopping\": true}\n");
    else
        printf("kvcd is stopping\n");
    return 0;
}

/* The labels of a sample, `a="x",b="y"` as the exposition writes them (values escaped with
 * \\, \" and \n), as a JSON object {"a": "x", "b": "y"}. */
static void ctl_metric_labels(const char *l)
{
    bool first = true;
    putchar('{');
    while (*l) {
        const char *eq = strchr(l, '=');
        if (!eq || eq[1] != '"')
            break;
        printf("%s\"%.*s\": \"", first ? "" : ", ", (int)(eq - l), l);
        for (l = eq + 2; *l && *l != '"'; l++) {
            if (*l == '\\' && l[1]) {
                l++;
                if (*l == 'n')
                    fputs("\\n", stdout);
                else
                    printf("\\%c", *l);
            } else if ((unsigned char)*l < 0x20) {
                printf("\\u%04x", *l);
            } else {
                putchar(*l);
            }
        }
        putchar('"');
        first = false;
        if (*l == '"')
            l++;
        if (*l == ',')
            l++;
    }
    putchar('}');
}

static int ctl_metrics(struct ctl *x, int argc, char **argv)
{
    char *text;
    int rc;
    bool first = true;
    if (argc != 1)
        return ctl_bad(argv[0], "takes no arguments ('%s')", argv[1]);
    if (ctl_connect(x))
        return 1;
    rc = kvc_metrics(x->c, &text);
    if (rc)
        return ctl_fail("metrics", rc, NULL);
    if (!x->json) {
        fputs(text, stdout);
        free(text);
        return 0;
    }
    /* Samples as {"name", "labels": {NAME: VALUE}, "value"}; a value JSON has no number for
     * (NaN, +Inf, -Inf) is a string. */
    printf("[");
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *sp, *brace;
        if (line[0] == '#' || !(sp = strrchr(line, ' ')))
            continue;
        *sp = 0;
        brace = strchr(line, '{');
        if (brace)
            *brace = 0;
        printf("%s{\"name\": \"%s\", \"labels\": ", first ? "" : ", ", line);
        if (brace) {
            brace[strlen(brace + 1)] = 0; /* drop the closing brace */
            ctl_metric_labels(brace + 1);
        } else {
            printf("{}");
        }
        char *end;
        (void)strtod(sp + 1, &end);
        if (*end || !isdigit((unsigned char)sp[1 + (sp[1] == '-')]))
            printf(", \"value\": \"%s\"}", sp + 1);
        else
            printf(", \"value\": %s}", sp + 1);
        first = false;
    }
    printf("]\n");
    free(text);
    return 0;
}

/* ---- top ---------------------------------------------------------------------------------- */

struct ctl_sample {
    struct kvc_stat *s;
    size_t n;
    double t;
};

static double ctl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double ctl_rate(const struct ctl_sample *a, const struct ctl_sample *b, const char *name)
{
    double dt = b->t - a->t;
    return dt > 0 ? (double)(ctl_stat(b->s, b->n, name) - ctl_stat(a->s, a->n, name)) / dt : 0;
}

static int ctl_top_frame(struct ctl *x, const struct ctl_sample *a, const struct ctl_sample *b,
                         bool tty)
{
    struct kvc_client_info *cl = NULL;
    size_t ncl = 0;
    uint64_t lt = ctl_stat(b->s, b->n, "lookup_tokens"), ht = ctl_stat(b->s, b->n, "hit_tokens");
    double dl = ctl_rate(a, b, "lookup_tokens"), dh = ctl_rate(a, b, "hit_tokens");
    if (kvc_clients(x->c, &cl, &ncl))
        ncl = 0;
    if (x->json) {
        printf("{\"token_hit_ratio\": %.4f, \"tokens_requested\": %" PRIu64 ", \"tokens_hit\": %" PRIu64
               ", \"tokens_requested_per_s\": %.1f, \"tokens_hit_per_s\": %.1f, \"lookups_per_s\": %.1f"
               ", \"bytes_in_per_s\": %.0f, \"bytes_out_per_s\": %.0f, \"evicted_per_s\": %.1f"
               ", \"host_used\": %" PRIu64 ", \"host_capacity\": %" PRIu64 ", \"clients\": %zu}\n",
               ctl_ratio(ht, lt), lt, ht, dl, dh, ctl_rate(a, b, "lookups"),
               ctl_rate(a, b, "bytes_in"), ctl_rate(a, b, "bytes_out"),
               ctl_rate(a, b, "evicted_blocks"), ctl_stat(b->s, b->n, "host_used"),
               ctl_stat(b->s, b->n, "host_capacity"), ncl);
        free(cl);
        return 0;
    }
    if (tty)
        printf("\033[H\033[2J");
    printf("kvcd  up %" PRIu64 " s   clients %zu   namespaces %" PRIu64 "   blocks %" PRIu64 "\n",
           ctl_stat(b->s, b->n, "uptime_s"), ncl, ctl_stat(b->s, b->n, "namespaces_now"),
           ctl_stat(b->s, b->n, "blocks_now"));
    printf("hit ratio  %.1f%% of %" PRIu64 " tokens requested (now %.1f%% of %.0f tokens/s)\n",
           100.0 * ctl_ratio(ht, lt), lt, 100.0 * (dl > 0 ? dh / dl : 0.0), dl);
    printf("lookups/s  %.1f   reserves/s %.1f   committed blocks/s %.1f   evicted blocks/s %.1f\n",
           ctl_rate(a, b, "lookups"), ctl_rate(a, b, "reserves"),
           ctl_rate(a, b, "committed_blocks"), ctl_rate(a, b, "evicted_blocks"));
    printf("MiB/s in   %.1f   MiB/s out %.1f\n", ctl_rate(a, b, "bytes_in") / 1048576.0,
           ctl_rate(a, b, "bytes_out") / 1048576.0);
    printf("host tier  %.1f / %.1f MiB (%.1f%%)   pins %" PRIu64 "   reserved %" PRIu64 "\n\n",
           (double)ctl_stat(b->s, b->n, "host_used") / 1048576.0,
           (double)ctl_stat(b->s, b->n, "host_capacity") / 1048576.0,
           100.0 * ctl_ratio(ctl_stat(b->s, b->n, "host_used"),
                             ctl_stat(b->s, b->n, "host_capacity")),
           ctl_stat(b->s, b->n, "pins_now"), ctl_stat(b->s, b->n, "reserved_now"));
    printf("%-5s %-8s %-6s %-16s %8s %5s %8s %7s\n", "ID", "PID", "UID", "NAME", "PINS", "RESV",
           "REQS", "HIT%");
    for (size_t i = 0; i < ncl; i++)
        printf("%-5u %-8u %-6u %-16.16s %8" PRIu64 " %5u %8" PRIu64 " %6.1f%%\n", cl[i].conn_id,
               cl[i].pid, cl[i].uid, cl[i].name, cl[i].pins, cl[i].reservations, cl[i].requests,
               100.0 * ctl_ratio(cl[i].hit_tokens, cl[i].lookup_tokens));
    fflush(stdout);
    free(cl);
    return 0;
}

static int ctl_top(struct ctl *x, int argc, char **argv)
{
    static const struct option opts[] = {{"count", required_argument, NULL, 'n'},
                                         {"interval", required_argument, NULL, 'i'},
                                         {NULL, 0, NULL, 0}};
    struct ctl_sample a = {0}, b = {0};
    bool tty = isatty(STDOUT_FILENO) && !x->json;
    long count = tty ? 0 : 1;
    double interval = 1.0;
    int opt, rc = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, ":n:i:", opts, NULL)) != -1) {
        char *end;
        if (opt == 'n') {
            count = strtol(optarg, &end, 10);
            if (*end || !*optarg || count < 0)
                return ctl_bad("top",
                               "--count takes a whole number of frames, 0 for until "
                               "interrupted, not '%s'",
                               optarg);
        } else if (opt == 'i') {
            interval = strtod(optarg, &end);
            if (*end || !*optarg || !(interval >= 0.05 && interval <= 3600))
                return ctl_bad("top", "--interval takes seconds from 0.05 to 3600, not '%s'",
                               optarg);
        } else {
            return ctl_bad_option("top", argv, opt);
        }
    }
    if (optind != argc)
        return ctl_bad("top", "takes options only ('%s')", argv[optind]);
    if (ctl_connect(x))
        return 1;
    if ((rc = kvc_stats(x->c, 0, &a.s, &a.n)))
        return ctl_fail("top", rc, NULL);
    a.t = ctl_now();
    /* count 0: until interrupted (a terminal); otherwise that many frames, one per interval. */
    for (long i = 0; count == 0 || i < count; i++) {
        usleep((useconds_t)(interval * 1e6));
        rc = kvc_stats(x->c, 0, &b.s, &b.n);
        if (rc) {
            free(a.s);
            return ctl_fail("top", rc, NULL);
        }
        b.t = ctl_now();
        ctl_top_frame(x, &a, &b, tty);
        free(a.s);
        a = b;
    }
    free(a.s);
    return 0;
}

/* ---- tiers ------------------------------------------------------------------------------- */

static void ctl_human(char *out, size_t len, double v, const char *suffix)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(out, len, u ? "%.1f %s%s" : "%.0f %s%s", v, units[u], suffix);
}

/* One row: a NULL name of a counter prints "-" (text) or null (JSON). */
struct ctl_tier_row {
    const char *tier;
    const char *capacity, *used, *blocks, *pages, *frag, *rinfl, *winfl, *rbytes, *wbytes,
        *errors, *csum;
    const char *errors2;
};

static void ctl_tier_print(struct ctl *x, const struct ctl_sample *a, const struct ctl_sample *b,
                           const struct ctl_tier_row *r, bool first)
{
    const struct ctl_sample *cur = b;
    const char *names[] = {r->capacity, r->used, r->blocks, r->pages, r->frag, r->rinfl,
                           r->winfl, r->errors, r->csum};
    const char *keys[] = {"capacity", "used", "blocks", "pages", "fragmentation_pct",
                          "reads_inflight", "writes_inflight", "errors", "checksum_failures"};
    double rd = r->rbytes ? ctl_rate(a, b, r->rbytes) : -1;
    double wr = r->wbytes ? ctl_rate(a, b, r->wbytes) : -1;
    char cap[32] = "-", used[32] = "-", rs[32] = "-", ws[32] = "-";
    char cells[9][32];
    if (x->json) {
        printf("%s{\"tier\": \"%s\", \"enabled\": true", first ? "" : ", ", r->tier);
        for (size_t i = 0; i < 9; i++) {
            uint64_t v = names[i] ? ctl_stat(cur->s, cur->n, names[i]) : 0;
            if (names[i] && i == 7 && r->errors2)
                v += ctl_stat(cur->s, cur->n, r->errors2);
            if (names[i])
                printf(", \"%s\": %" PRIu64, keys[i], v);
            else
                printf(", \"%s\": null", keys[i]);
        }
        if (rd >= 0)
            printf(", \"read_bytes_per_s\": %.0f, \"write_bytes_per_s\": %.0f}", rd, wr);
        else
            printf(", \"read_bytes_per_s\": null, \"write_bytes_per_s\": null}");
        return;
    }
    for (size_t i = 0; i < 9; i++) {
        uint64_t v = names[i] ? ctl_stat(cur->s, cur->n, names[i]) : 0;
        if (names[i] && i == 7 && r->errors2)
            v += ctl_stat(cur->s, cur->n, r->errors2);
        if (!names[i])
            snprintf(cells[i], sizeof(cells[i]), "-");
        else if (i == 4)
            snprintf(cells[i], sizeof(cells[i]), "%" PRIu64 "%%", v);
        else
            snprintf(cells[i], sizeof(cells[i]), "%" PRIu64, v);
    }
    if (r->capacity)
        ctl_human(cap, sizeof(cap), (double)ctl_stat(cur->s, cur->n, r->capacity), "");
    if (r->used)
        ctl_human(used, sizeof(used), (double)ctl_stat(cur->s, cur->n, r->used), "");
    if (rd >= 0) {
        ctl_human(rs, sizeof(rs), rd, "/s");
        ctl_human(ws, sizeof(ws), wr, "/s");
    }
    printf("%-5s %10s %10s %8s %6s %5s %5s %5s %12s %12s %6s %6s\n", r->tier, cap, used,
           cells[2], cells[3], cells[4], cells[5], cells[6], rs, ws, cells[7], cells[8]);
}

/* host blocks: committed blocks that are neither on disk nor on the GPU. */
static void ctl_tiers_host_blocks(struct ctl_sample *b)
{
    uint64_t v = ctl_stat(b->s, b->n, "blocks_now");
    uint64_t off = ctl_stat(b->s, b->n, "disk_blocks") + ctl_stat(b->s, b->n, "gpu_blocks");
    for (size_t i = 0; i < b->n; i++)
        if (strcmp(b->s[i].name, "host_blocks") == 0)
            return;
    struct kvc_stat *ns = realloc(b->s, (b->n + 1) * sizeof(*ns));
    if (!ns)
        return;
    b->s = ns;
    memset(&ns[b->n], 0, sizeof(ns[b->n]));
    snprintf(ns[b->n].name, sizeof(ns[b->n].name), "host_blocks");
    ns[b->n].value = v > off ? v - off : 0;
    b->n++;
}

/* The remote tier (remote.nodes): its own row, since it has no capacity of its own (the
 * cluster's maxmemory is) but nodes, slots covered and a degraded state. */
static void ctl_tiers_remote(struct ctl *x, const struct ctl_sample *a, const struct ctl_sample *b)
{
    bool on = false;
    for (size_t i = 0; i < b->n; i++)
        on |= strcmp(b->s[i].name, "remote_slots") == 0;
    if (!on) {
        if (x->json)
            printf(", {\"tier\": \"remote\", \"enabled\": false}");
        else
            printf("%-6s disabled\n", "remote");
        return;
    }
    uint64_t nodes = ctl_stat(b->s, b->n, "remote_nodes"), slots = ctl_stat(b->s, b->n, "remote_slots");
    uint64_t infl = ctl_stat(b->s, b->n, "remote_inflight");
    uint64_t hits = ctl_stat(b->s, b->n, "remote_hit_blocks");
    uint64_t misses = ctl_stat(b->s, b->n, "remote_miss_blocks");
    uint64_t bad = ctl_stat(b->s, b->n, "remote_bad_records");
    uint64_t pmiss = ctl_stat(b->s, b->n, "remote_part_missing");
    uint64_t pmix = ctl_stat(b->s, b->n, "remote_part_mixed");
    uint64_t errs = ctl_stat(b->s, b->n, "remote_errors");
    uint64_t deg = ctl_stat(b->s, b->n, "remote_degraded");
    double rd = ctl_rate(a, b, "remote_bytes_read"), wr = ctl_rate(a, b, "remote_bytes_written");
    if (x->json) {
        printf(", {\"tier\": \"remote\", \"enabled\": true, \"nodes\": %" PRIu64
               ", \"slots\": %" PRIu64 ", \"inflight\": %" PRIu64 ", \"hits\": %" PRIu64
               ", \"misses\": %" PRIu64 ", \"bad_records\": %" PRIu64
               ", \"parts_missing\": %" PRIu64 ", \"parts_mixed\": %" PRIu64
               ", \"errors\": %" PRIu64
               ", \"degraded\": %s, \"read_bytes_per_s\": %.0f, \"write_bytes_per_s\": %.0f}",
               nodes, slots, infl, hits, misses, bad, pmiss, pmix, errs, deg ? "true" : "false",
               rd, wr);
        return;
    }
    char rs[32], ws[32];
    ctl_human(rs, sizeof(rs), rd, "/s");
    ctl_human(ws, sizeof(ws), wr, "/s");
    printf("%-6s nodes %" PRIu64 ", slots %" PRIu64 "/16384, in flight %" PRIu64
           ", read %s, write %s, hits %" PRIu64 ", misses %" PRIu64 ", bad records %" PRIu64
           ", parts missing %" PRIu64 ", mixed %" PRIu64 ", errors %" PRIu64 "%s\n",
           "remote", nodes, slots, infl, rs, ws, hits, misses, bad, pmiss, pmix, errs,
           deg ? ", DEGRADED" : "");
}

static int ctl_tiers(struct ctl *x, int argc, char **argv)
{
    static const struct option opts[] = {{"interval", required_argument, NULL, 'i'},
                                         {NULL, 0, NULL, 0}};
    static const struct ctl_tier_row gpu = {"gpu", "gpu_capacity", "gpu_used", "gpu_blocks",
                                            NULL, NULL, NULL, NULL, "gpu_bytes_read",
                                            "gpu_bytes_written", "gpu_errors", NULL, NULL};
    static const struct ctl_tier_row host = {"host", "host_capacity", "host_used",
                                             "host_blocks", NULL, NULL, NULL, NULL, "bytes_out",
                                             "bytes_in", NULL, NULL, NULL};
    static const struct ctl_tier_row disk = {
        "disk", "disk_capacity", "disk_used", "disk_blocks", "disk_pages",
        "disk_fragmentation_pct", "disk_reads_inflight", "disk_writes_inflight",
        "disk_bytes_read", "disk_bytes_written", "disk_read_errors", "disk_checksum_failures",
        "disk_write_errors"};
    struct ctl_sample a = {0}, b = {0};
    double interval = 1.0;
    bool has_gpu, has_disk;
    int opt, rc;
    optind = 1;
    while ((opt = getopt_long(argc, argv, ":i:", opts, NULL)) != -1) {
        char *end;
        if (opt != 'i')
            return ctl_bad_option("tiers", argv, opt);
        interval = strtod(optarg, &end);
        if (*end || !*optarg || !(interval >= 0 && interval <= 3600))
            return ctl_bad("tiers",
                           "--interval takes seconds from 0 to 3600 (0: averages "
                           "since the daemon started), not '%s'",
                           optarg);
    }
    if (optind != argc)
        return ctl_bad("tiers", "takes options only ('%s')", argv[optind]);
    if (ctl_connect(x))
        return 1;
    if ((rc = kvc_stats(x->c, 0, &b.s, &b.n)))
        return ctl_fail("tiers", rc, NULL);
    b.t = ctl_now();
    if (interval > 0) {
        /* Rates between two samples `interval` seconds apart. */
        a = b;
        usleep((useconds_t)(interval * 1e6));
        if ((rc = kvc_stats(x->c, 0, &b.s, &b.n))) {
            free(a.s);
            return ctl_fail("tiers", rc, NULL);
        }
        b.t = ctl_now();
    } else {
        /* --interval 0: averages since the daemon started (counters from zero). */
        a.n = 0;
        a.t = b.t - (double)(ctl_stat(b.s, b.n, "uptime_s") ? ctl_stat(b.s, b.n, "uptime_s") : 1);
    }
    ctl_tiers_host_blocks(&b);
    has_gpu = ctl_stat(b.s, b.n, "gpu_capacity") > 0;
    has_disk = ctl_stat(b.s, b.n, "disk_capacity") > 0;
    if (x->json) {
        printf("{\"interval_s\": %.3f, \"tiers\": [", interval);
        if (has_gpu)
            ctl_tier_print(x, &a, &b, &gpu, true);
        else
            printf("{\"tier\": \"gpu\", \"enabled\": false}");
        printf(", ");
        ctl_tier_print(x, &a, &b, &host, true);
        if (has_disk)
            ctl_tier_print(x, &a, &b, &disk, false);
        else
            printf(", {\"tier\": \"disk\", \"enabled\": false}");
        ctl_tiers_remote(x, &a, &b);
        printf("]}\n");
    } else {
        printf("%-5s %10s %10s %8s %6s %5s %5s %5s %12s %12s %6s %6s\n", "TIER", "CAPACITY",
               "USED", "BLOCKS", "PAGES", "FRAG", "RD_IF", "WR_IF", "READ", "WRITE", "ERRORS",
               "CSUM");
        if (has_gpu)
            ctl_tier_print(x, &a, &b, &gpu, true);
        else
            printf("%-5s disabled\n", "gpu");
        ctl_tier_print(x, &a, &b, &host, true);
        if (has_disk)
            ctl_tier_print(x, &a, &b, &disk, false);
        else
            printf("%-5s disabled\n", "disk");
        ctl_tiers_remote(x, &a, &b);
        printf("(rates %s)\n", interval > 0 ? "over the sampling interval"
                                             : "averaged since the daemon started");
    }
    free(a.s);
    free(b.s);
    return 0;
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
     "NAME: lru, lfu, prefix, streaming, h2o, snapkv, keynorm, quest, default; with --ns,\n"
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
