/*
 * kvcctl_watch.c — kvcctl's commands that read the daemon's counters: status, stats,
 * clients, metrics, top, tiers.
 *
 * DESIGN
 * Counters come from STATS as (name, value) pairs and are found by name, so a counter a
 * daemon does not have reads 0 and an older daemon still answers. Rates (top, tiers) are the
 * difference of two samples over the time between them, taken here with CLOCK_MONOTONIC.
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
#include "client/kvcctl.h"

static uint64_t ctl_stat(const struct kvc_stat *s, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s[i].name, name) == 0)
            return s[i].value;
    return 0;
}

static double ctl_ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0.0;
}

int ctl_status(struct ctl *x, int argc, char **argv)
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
               ", \"recompute_saved_est_us\": %" PRIu64 "}\n",
               ctl_stat(s, n, "uptime_s"), ctl_stat(s, n, "clients_now"),
               ctl_stat(s, n, "namespaces_now"), ctl_stat(s, n, "blocks_now"),
               ctl_stat(s, n, "host_used"), ctl_stat(s, n, "host_capacity"), lt, ht,
               ctl_ratio(ht, lt), ctl_stat(s, n, "load_us"),
               ctl_stat(s, n, "recompute_saved_est_us"));
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

int ctl_stats(struct ctl *x, int argc, char **argv)
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
            fprintf(stderr, "kvcctl: stats of namespace %u: %s\n", ns[i].ns_id, kvc_strerror(rc));
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

int ctl_clients(struct ctl *x, int argc, char **argv)
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
               "UID", "GID", "NAME", "LEASES", "RESV", "PINS", "RESV_BYTES", "REQS", "HIT%", "ERRS",
               "REFUSED", "FLAGS");
    for (size_t i = 0; i < n; i++) {
        const struct kvc_client_info *o = &cl[i];
        if (x->json) {
            printf("%s{\"id\": %u, \"pid\": %u, \"uid\": %u, \"gid\": %u, \"name\": ",
                   i ? ", " : "", o->conn_id, o->pid, o->uid, o->gid);
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
                   o->conn_id, o->pid, o->uid, o->gid, o->name, o->leases, o->reservations, o->pins,
                   o->reserved_bytes, o->requests,
                   100.0 * ctl_ratio(o->hit_tokens, o->lookup_tokens), o->errors, o->refusals,
                   o->admin ? "admin" : "-", o->self ? ",self" : "");
        }
    }
    if (x->json)
        printf("]\n");
    free(cl);
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

int ctl_metrics(struct ctl *x, int argc, char **argv)
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
        printf("{\"token_hit_ratio\": %.4f, \"tokens_requested\": %" PRIu64
               ", \"tokens_hit\": %" PRIu64 ", \"tokens_requested_per_s\": %.1f, "
                                            "\"tokens_hit_per_s\": %.1f, \"lookups_per_s\": %.1f"
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
           100.0 *
               ctl_ratio(ctl_stat(b->s, b->n, "host_used"), ctl_stat(b->s, b->n, "host_capacity")),
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

int ctl_top(struct ctl *x, int argc, char **argv)
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
    const char *capacity, *used, *blocks, *pages, *frag, *rinfl, *winfl, *rbytes, *wbytes, *errors,
        *csum;
    const char *errors2;
};

static void ctl_tier_print(struct ctl *x, const struct ctl_sample *a, const struct ctl_sample *b,
                           const struct ctl_tier_row *r, bool first)
{
    const struct ctl_sample *cur = b;
    const char *names[] = {r->capacity, r->used,  r->blocks, r->pages, r->frag,
                           r->rinfl,    r->winfl, r->errors, r->csum};
    const char *keys[] = {"capacity",          "used",           "blocks",          "pages",
                          "fragmentation_pct", "reads_inflight", "writes_inflight", "errors",
                          "checksum_failures"};
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
    printf("%-5s %10s %10s %8s %6s %5s %5s %5s %12s %12s %6s %6s\n", r->tier, cap, used, cells[2],
           cells[3], cells[4], cells[5], cells[6], rs, ws, cells[7], cells[8]);
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
    uint64_t nodes = ctl_stat(b->s, b->n, "remote_nodes"),
             slots = ctl_stat(b->s, b->n, "remote_slots");
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
               nodes, slots, infl, hits, misses, bad, pmiss, pmix, errs, deg ? "true" : "false", rd,
               wr);
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

int ctl_tiers(struct ctl *x, int argc, char **argv)
{
    static const struct option opts[] = {{"interval", required_argument, NULL, 'i'},
                                         {NULL, 0, NULL, 0}};
    static const struct ctl_tier_row gpu = {
        "gpu", "gpu_capacity",   "gpu_used",          "gpu_blocks", NULL, NULL, NULL,
        NULL,  "gpu_bytes_read", "gpu_bytes_written", "gpu_errors", NULL, NULL};
    static const struct ctl_tier_row host = {
        "host", "host_capacity", "host_used", "host_blocks", NULL, NULL, NULL,
        NULL,   "bytes_out",     "bytes_in",  NULL,          NULL, NULL};
    static const struct ctl_tier_row disk = {"disk",
                                             "disk_capacity",
                                             "disk_used",
                                             "disk_blocks",
                                             "disk_pages",
                                             "disk_fragmentation_pct",
                                             "disk_reads_inflight",
                                             "disk_writes_inflight",
                                             "disk_bytes_read",
                                             "disk_bytes_written",
                                             "disk_read_errors",
                                             "disk_checksum_failures",
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
        printf("%-5s %10s %10s %8s %6s %5s %5s %5s %12s %12s %6s %6s\n", "TIER", "CAPACITY", "USED",
               "BLOCKS", "PAGES", "FRAG", "RD_IF", "WR_IF", "READ", "WRITE", "ERRORS", "CSUM");
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
        printf("(rates %s)\n",
               interval > 0 ? "over the sampling interval" : "averaged since the daemon started");
    }
    free(a.s);
    free(b.s);
    return 0;
}
