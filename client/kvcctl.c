/*
 * kvcctl — inspect and steer a running kvcd through libkvc.
 *
 * DESIGN
 * One table of commands drives dispatch and `kvcctl help`. Every command that prints data
 * has a --json form. Exit codes: 0 ok, 1 the daemon refused or could not be reached,
 * 2 usage.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
};

static int ctl_connect(struct ctl *x)
{
    int rc = kvc_connect(x->socket, &x->c);
    if (rc) {
        fprintf(stderr, "kvcctl: cannot reach kvcd at %s: %s\n",
                x->socket ? x->socket : kvc_default_socket(), kvc_strerror(rc));
        return 1;
    }
    return 0;
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
    (void)argc;
    (void)argv;
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
               ", \"token_hit_ratio\": %.4f}\n",
               ctl_stat(s, n, "uptime_s"), ctl_stat(s, n, "clients_now"),
               ctl_stat(s, n, "namespaces_now"), ctl_stat(s, n, "blocks_now"),
               ctl_stat(s, n, "host_used"), ctl_stat(s, n, "host_capacity"), lt, ht,
               ctl_ratio(ht, lt));
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
        printf("tokens hit %" PRIu64 " of %" PRIu64 " requested (%.1f%%)\n", ht, lt,
               100.0 * ctl_ratio(ht, lt));
    }
    free(s);
    return 0;
}

/* One line per tier: capacity, use, and whether it is on (the gpu tier is off without a
 * pool or a device; its capacity is 0 then). */
static int ctl_tiers(struct ctl *x, int argc, char **argv)
{
    static const char *const tiers[] = {"host", "gpu"};
    struct kvc_stat *s;
    size_t n;
    int rc;
    (void)argc;
    (void)argv;
    if (ctl_connect(x))
        return 1;
    rc = kvc_stats(x->c, 0, &s, &n);
    if (rc) {
        fprintf(stderr, "kvcctl: stats: %s\n", kvc_strerror(rc));
        return 1;
    }
    if (x->json)
        printf("[");
    for (size_t i = 0; i < sizeof(tiers) / sizeof(tiers[0]); i++) {
        char cap[64], used[64];
        snprintf(cap, sizeof(cap), "%s_capacity", tiers[i]);
        snprintf(used, sizeof(used), "%s_used", tiers[i]);
        uint64_t c = ctl_stat(s, n, cap), u = ctl_stat(s, n, used);
        if (x->json)
            printf("%s{\"tier\": \"%s\", \"enabled\": %s, \"capacity\": %" PRIu64
                   ", \"used\": %" PRIu64 "}",
                   i ? ", " : "", tiers[i], c ? "true" : "false", c, u);
        else if (c)
            printf("%-5s %10.1f / %10.1f MiB (%.1f%%)\n", tiers[i], (double)u / 1048576.0,
                   (double)c / 1048576.0, 100.0 * ctl_ratio(u, c));
        else
            printf("%-5s disabled\n", tiers[i]);
    }
    if (x->json)
        printf("]\n");
    free(s);
    return 0;
}

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
    (void)argc;
    (void)argv;
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

static int ctl_ns(struct ctl *x, int argc, char **argv)
{
    struct kvc_ns_info *ns;
    size_t n;
    int rc;
    (void)argc;
    (void)argv;
    if (ctl_connect(x))
        return 1;
    rc = kvc_ns_list(x->c, &ns, &n);
    if (rc) {
        fprintf(stderr, "kvcctl: ns: %s\n", kvc_strerror(rc));
        return 1;
    }
    if (x->json)
        printf("[");
    else
        printf("%-4s %-32s %6s %5s %5s %6s %-8s %-4s %12s %8s %12s\n", "ID", "MODEL", "LAYERS",
               "HEADS", "DIM", "TOKENS", "DTYPE", "KIND", "BLOCK_BYTES", "BLOCKS", "BYTES");
    for (size_t i = 0; i < n; i++) {
        const struct kvc_ns_info *o = &ns[i];
        const char *kind = o->kv_kind == KVC_KV_KIND_KV ? "kv" : "k";
        if (x->json) {
            printf("%s{\"id\": %u, \"model\": ", i ? ", " : "", o->ns_id);
            ctl_json_str(o->model_id);
            printf(", \"layers\": %u, \"kv_heads\": %u, \"head_dim\": %u, \"block_tokens\": %u, "
                   "\"dtype\": \"%s\", \"kv_kind\": \"%s\", \"block_bytes\": %" PRIu64
                   ", \"blocks\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"arena\": %u}",
                   o->layers, o->kv_heads, o->head_dim, o->block_tokens,
                   ctl_dtype_name(o->dtype), kind, o->block_bytes, o->blocks, o->bytes,
                   o->arena_id);
        } else {
            printf("%-4u %-32s %6u %5u %5u %6u %-8s %-4s %12" PRIu64 " %8" PRIu64 " %12" PRIu64
                   "\n",
                   o->ns_id, o->model_id, o->layers, o->kv_heads, o->head_dim, o->block_tokens,
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
                                         {NULL, 0, NULL, 0}};
    struct kvc_ns_info *ns = NULL;
    size_t nns = 0, shown = 0;
    long want_ns = 0, limit = 1000;
    int opt, rc;
    bool first = true;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "n:l:", opts, NULL)) != -1) {
        char *end;
        switch (opt) {
        case 'n':
            want_ns = strtol(optarg, &end, 10);
            if (*end || want_ns <= 0) {
                fprintf(stderr, "kvcctl ls: --ns takes a namespace id\n");
                return 2;
            }
            break;
        case 'l':
            limit = strtol(optarg, &end, 10);
            if (*end || limit <= 0) {
                fprintf(stderr, "kvcctl ls: --limit takes a positive number\n");
                return 2;
            }
            break;
        default:
            return 2;
        }
    }
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
            for (size_t i = 0; i < n && shown < (size_t)limit; i++, shown++) {
                char key[33], parent[33];
                ctl_key(&b[i].key, key);
                ctl_key(&b[i].parent, parent);
                if (x->json)
                    printf("%s{\"ns\": %u, \"key\": \"%s\", \"parent\": \"%s\", \"depth\": %u, "
                           "\"bytes\": %" PRIu64 ", \"hits\": %u, \"pins\": %u, \"children\": %u, "
                           "\"last_access_ms\": %" PRIu64 ", \"tier\": \"host\"}",
                           first ? "" : ", ", ns[k].ns_id, key, parent, b[i].depth, b[i].bytes,
                           b[i].hits, b[i].pins, b[i].children, b[i].last_access_ms);
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

static int ctl_help(struct ctl *x, int argc, char **argv);

static const struct ctl_cmd ctl_cmds[] = {
    {"status", "", "daemon pid, uptime, clients, tier usage, token hit ratio", ctl_status},
    {"stats", "", "every counter, in total and per namespace", ctl_stats},
    {"tiers", "", "each tier: capacity and use, or disabled", ctl_tiers},
    {"ns", "", "namespaces: model, layout, block size, blocks cached", ctl_ns},
    {"ls", "[--ns ID] [--limit N]", "cached blocks with their metadata", ctl_ls},
    {"help", "", "this text", ctl_help},
};

static int ctl_help(struct ctl *x, int argc, char **argv)
{
    (void)x;
    (void)argc;
    (void)argv;
    printf("usage: kvcctl [-s SOCKET] [--json] COMMAND [ARGS]\n\n"
           "  -s, --socket PATH   kvcd's socket (default: $KVCD_SOCKET, else %s)\n"
           "  -j, --json          machine-readable output\n\ncommands:\n",
           kvc_default_socket());
    for (size_t i = 0; i < sizeof(ctl_cmds) / sizeof(ctl_cmds[0]); i++) {
        char head[64];
        snprintf(head, sizeof(head), "%s %s", ctl_cmds[i].name, ctl_cmds[i].args);
        printf("  %-28s %s\n", head, ctl_cmds[i].help);
    }
    printf("\nexit status: 0 ok, 1 daemon error or unreachable, 2 usage\n");
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
    /* Global options stop at the command name. */
    while ((opt = getopt_long(argc, argv, "+s:jh", opts, NULL)) != -1) {
        switch (opt) {
        case 's':
            x.socket = optarg;
            break;
        case 'j':
            x.json = true;
            break;
        case 'h':
            return ctl_help(&x, 0, NULL);
        default:
            ctl_help(&x, 0, NULL);
            return 2;
        }
    }
    if (optind >= argc) {
        ctl_help(&x, 0, NULL);
        return 2;
    }
    for (size_t i = 0; i < sizeof(ctl_cmds) / sizeof(ctl_cmds[0]); i++) {
        if (strcmp(argv[optind], ctl_cmds[i].name) == 0) {
            /* Allow --json after the command as well. */
            int sub_argc = argc - optind;
            char **sub_argv = argv + optind;
            for (int k = 1; k < sub_argc; k++)
                if (strcmp(sub_argv[k], "--json") == 0 || strcmp(sub_argv[k], "-j") == 0) {
                    x.json = true;
                    memmove(&sub_argv[k], &sub_argv[k + 1],
                            (size_t)(sub_argc - k - 1) * sizeof(char *));
                    sub_argc--;
                    k--;
                }
            rc = ctl_cmds[i].run(&x, sub_argc, sub_argv);
            kvc_disconnect(x.c);
            return rc;
        }
    }
    fprintf(stderr, "kvcctl: unknown command '%s' (try 'kvcctl help')\n", argv[optind]);
    return 2;
}
