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
        json_t *doc = json_pack(
            "{s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "pid",
            (json_int_t)pid, "socket", ctl_json_text(x->socket ? x->socket : kvc_default_socket()),
            "uptime_s", ctl_json_u64(ctl_stat(s, n, "uptime_s")), "clients",
            ctl_json_u64(ctl_stat(s, n, "clients_now")), "namespaces",
            ctl_json_u64(ctl_stat(s, n, "namespaces_now")), "blocks",
            ctl_json_u64(ctl_stat(s, n, "blocks_now")), "host_used",
            ctl_json_u64(ctl_stat(s, n, "host_used")), "host_capacity",
            ctl_json_u64(ctl_stat(s, n, "host_capacity")), "tokens_requested", ctl_json_u64(lt),
            "tokens_hit", ctl_json_u64(ht), "token_hit_ratio", ctl_json_fixed(ctl_ratio(ht, lt), 4),
            "load_us", ctl_json_u64(ctl_stat(s, n, "load_us")), "recompute_saved_est_us",
            ctl_json_u64(ctl_stat(s, n, "recompute_saved_est_us")), "host_faulted",
            ctl_json_u64(ctl_stat(s, n, "host_faulted")), "host_arenas_bytes",
            ctl_json_u64(ctl_stat(s, n, "host_arenas_bytes")));
        free(s);
        return ctl_json_print(doc);
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

/* Every counter of s, one line each. */
static void ctl_stats_print(const struct kvc_stat *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        printf("  %-28s %" PRIu64 "\n", s[i].name, s[i].value);
}

/* Every counter of s as an object {NAME: N}; NULL when out of memory. */
static json_t *ctl_stats_json(const struct kvc_stat *s, size_t n)
{
    json_t *o = json_object();
    for (size_t i = 0; i < n; i++)
        if (ctl_json_add(o, s[i].name, ctl_json_u64(s[i].value))) {
            json_decref(o);
            return NULL;
        }
    return o;
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
    json_t *doc = NULL, *list = NULL;
    bool ok = true;
    if (x->json) {
        list = json_array();
        doc = json_pack("{s:o, s:o}", "total", ctl_stats_json(s, n), "namespaces", list);
        list = doc ? list : NULL; /* json_pack took it, and let it go */
    } else {
        printf("total:\n");
        ctl_stats_print(s, n);
    }
    free(s);
    for (size_t i = 0; i < nns; i++) {
        rc = kvc_stats(x->c, ns[i].ns_id, &s, &n);
        if (rc) {
            fprintf(stderr, "kvcctl: stats of namespace %u: %s\n", ns[i].ns_id, kvc_strerror(rc));
            json_decref(doc);
            free(ns);
            return 1;
        }
        if (x->json) {
            ok &= json_array_append_new(list,
                                        json_pack("{s:I, s:o, s:o}", "id", (json_int_t)ns[i].ns_id,
                                                  "model", ctl_json_text(ns[i].model_id), "stats",
                                                  ctl_stats_json(s, n))) == 0;
        } else {
            printf("namespace %u (%s):\n", ns[i].ns_id, ns[i].model_id);
            ctl_stats_print(s, n);
        }
        free(s);
    }
    free(ns);
    if (x->json) {
        if (!ok) {
            json_decref(doc);
            doc = NULL;
        }
        return ctl_json_print(doc);
    }
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
    json_t *list = x->json ? json_array() : NULL;
    bool ok = true;
    if (!x->json)
        printf("%-5s %-8s %-6s %-6s %-16s %6s %5s %8s %12s %8s %7s %6s %7s %s\n", "ID", "PID",
               "UID", "GID", "NAME", "LEASES", "RESV", "PINS", "RESV_BYTES", "REQS", "HIT%", "ERRS",
               "REFUSED", "FLAGS");
    for (size_t i = 0; i < n; i++) {
        const struct kvc_client_info *o = &cl[i];
        if (x->json) {
            ok &= json_array_append_new(
                      list,
                      json_pack("{s:I, s:I, s:I, s:I, s:o, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o, "
                                "s:o, s:o, s:o, s:b, s:b}",
                                "id", (json_int_t)o->conn_id, "pid", (json_int_t)o->pid, "uid",
                                (json_int_t)o->uid, "gid", (json_int_t)o->gid, "name",
                                ctl_json_text(o->name), "leases", (json_int_t)o->leases,
                                "reservations", (json_int_t)o->reservations, "pins",
                                ctl_json_u64(o->pins), "reserved_bytes",
                                ctl_json_u64(o->reserved_bytes), "requests",
                                ctl_json_u64(o->requests), "lookup_tokens",
                                ctl_json_u64(o->lookup_tokens), "hit_tokens",
                                ctl_json_u64(o->hit_tokens), "bytes_in", ctl_json_u64(o->bytes_in),
                                "bytes_out", ctl_json_u64(o->bytes_out), "errors",
                                ctl_json_u64(o->errors), "refusals", ctl_json_u64(o->refusals),
                                "admin", (int)o->admin, "self", (int)o->self)) == 0;
        } else {
            printf("%-5u %-8u %-6u %-6u %-16.16s %6u %5u %8" PRIu64 " %12" PRIu64 " %8" PRIu64
                   " %6.1f%% %6" PRIu64 " %7" PRIu64 " %s%s\n",
                   o->conn_id, o->pid, o->uid, o->gid, o->name, o->leases, o->reservations, o->pins,
                   o->reserved_bytes, o->requests,
                   100.0 * ctl_ratio(o->hit_tokens, o->lookup_tokens), o->errors, o->refusals,
                   o->admin ? "admin" : "-", o->self ? ",self" : "");
        }
    }
    free(cl);
    if (x->json) {
        if (!ok) {
            json_decref(list);
            list = NULL;
        }
        return ctl_json_print(list);
    }
    return 0;
}

/* The labels of a sample, `a="x",b="y"` as the exposition writes them (values escaped with
 * \\, \" and \n), as an object {"a": "x", "b": "y"} of the values unescaped; NULL when out
 * of memory. l is changed (values are unescaped in place). */
static json_t *ctl_metric_labels(char *l)
{
    json_t *o = json_object();
    while (*l) {
        char *eq = strchr(l, '='), *v, *w;
        if (!eq || eq[1] != '"')
            break;
        *eq = 0;
        for (v = w = eq + 2; *v && *v != '"'; v++)
            *w++ = *v == '\\' && v[1] ? (*++v == 'n' ? '\n' : *v) : *v;
        if (ctl_json_add(o, l, json_stringn_nocheck(eq + 2, (size_t)(w - (eq + 2))))) {
            json_decref(o);
            return NULL;
        }
        l = v;
        if (*l == '"')
            l++;
        if (*l == ',')
            l++;
    }
    return o;
}

/* A sample's value: an integer or a real as the exposition wrote it, or a string where JSON
 * has no number for it (NaN, +Inf, -Inf). */
static json_t *ctl_metric_value(const char *v)
{
    char *end;
    bool digits = isdigit((unsigned char)v[v[0] == '-']);
    double d = strtod(v, &end);
    if (*end || !digits)
        return json_string(v);
    if (v[strspn(v + (v[0] == '-'), "0123456789") + (v[0] == '-')] == 0) {
        errno = 0;
        long long i = strtoll(v, &end, 10);
        if (errno == 0)
            return json_integer(i);
    }
    return json_real(d);
}

int ctl_metrics(struct ctl *x, int argc, char **argv)
{
    char *text;
    int rc;
    bool ok = true;
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
    /* Samples as {"name", "labels": {NAME: VALUE}, "value"}. */
    json_t *list = json_array();
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line && ok;
         line = strtok_r(NULL, "\n", &save)) {
        char *sp, *brace;
        if (line[0] == '#' || !(sp = strrchr(line, ' ')))
            continue;
        *sp = 0;
        brace = strchr(line, '{');
        if (brace) {
            *brace = 0;
            brace[strlen(brace + 1)] = 0; /* drop the closing brace */
        }
        ok = json_array_append_new(
                 list, json_pack("{s:o, s:o, s:o}", "name", ctl_json_text(line), "labels",
                                 brace ? ctl_metric_labels(brace + 1) : json_object(), "value",
                                 ctl_metric_value(sp + 1))) == 0;
    }
    free(text);
    if (!ok) {
        json_decref(list);
        list = NULL;
    }
    return ctl_json_print(list);
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
        json_t *doc = json_pack(
            "{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "token_hit_ratio",
            ctl_json_fixed(ctl_ratio(ht, lt), 4), "tokens_requested", ctl_json_u64(lt),
            "tokens_hit", ctl_json_u64(ht), "tokens_requested_per_s", ctl_json_fixed(dl, 1),
            "tokens_hit_per_s", ctl_json_fixed(dh, 1), "lookups_per_s",
            ctl_json_fixed(ctl_rate(a, b, "lookups"), 1), "bytes_in_per_s",
            ctl_json_fixed(ctl_rate(a, b, "bytes_in"), 0), "bytes_out_per_s",
            ctl_json_fixed(ctl_rate(a, b, "bytes_out"), 0), "evicted_per_s",
            ctl_json_fixed(ctl_rate(a, b, "evicted_blocks"), 1), "host_used",
            ctl_json_u64(ctl_stat(b->s, b->n, "host_used")), "host_capacity",
            ctl_json_u64(ctl_stat(b->s, b->n, "host_capacity")), "clients", ctl_json_u64(ncl));
        free(cl);
        return ctl_json_print(doc);
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
        rc = ctl_top_frame(x, &a, &b, tty);
        free(a.s);
        a = b;
        if (rc)
            break;
    }
    free(a.s);
    return rc;
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

/* The row's counters, in the order of keys (below): NULL where the tier has none. */
static void ctl_tier_values(const struct ctl_sample *cur, const struct ctl_tier_row *r,
                            uint64_t v[9], bool has[9])
{
    const char *names[] = {r->capacity, r->used,  r->blocks, r->pages, r->frag,
                           r->rinfl,    r->winfl, r->errors, r->csum};
    for (size_t i = 0; i < 9; i++) {
        has[i] = names[i] != NULL;
        v[i] = names[i] ? ctl_stat(cur->s, cur->n, names[i]) : 0;
        if (names[i] && i == 7 && r->errors2)
            v[i] += ctl_stat(cur->s, cur->n, r->errors2);
    }
}

/* The row as an object {tier, enabled, the counters (null where the tier has none), rates};
 * NULL when out of memory. */
static json_t *ctl_tier_json(const struct ctl_sample *a, const struct ctl_sample *b,
                             const struct ctl_tier_row *r)
{
    static const char *const keys[] = {
        "capacity",          "used",           "blocks",          "pages",
        "fragmentation_pct", "reads_inflight", "writes_inflight", "errors",
        "checksum_failures"};
    uint64_t v[9];
    bool has[9];
    int bad = 0;
    json_t *o = json_pack("{s:s, s:b}", "tier", r->tier, "enabled", 1);
    ctl_tier_values(b, r, v, has);
    for (size_t i = 0; i < 9; i++)
        bad |= ctl_json_add(o, keys[i], has[i] ? ctl_json_u64(v[i]) : json_null());
    bad |= ctl_json_add(o, "read_bytes_per_s",
                        r->rbytes ? ctl_json_fixed(ctl_rate(a, b, r->rbytes), 0) : json_null());
    bad |= ctl_json_add(o, "write_bytes_per_s",
                        r->wbytes ? ctl_json_fixed(ctl_rate(a, b, r->wbytes), 0) : json_null());
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static void ctl_tier_print(const struct ctl_sample *a, const struct ctl_sample *b,
                           const struct ctl_tier_row *r)
{
    const struct ctl_sample *cur = b;
    double rd = r->rbytes ? ctl_rate(a, b, r->rbytes) : -1;
    double wr = r->wbytes ? ctl_rate(a, b, r->wbytes) : -1;
    char cap[32] = "-", used[32] = "-", rs[32] = "-", ws[32] = "-";
    char cells[9][32];
    uint64_t v[9];
    bool has[9];
    ctl_tier_values(cur, r, v, has);
    for (size_t i = 0; i < 9; i++) {
        if (!has[i])
            snprintf(cells[i], sizeof(cells[i]), "-");
        else if (i == 4)
            snprintf(cells[i], sizeof(cells[i]), "%" PRIu64 "%%", v[i]);
        else
            snprintf(cells[i], sizeof(cells[i]), "%" PRIu64, v[i]);
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
/* json: the row as an object (NULL when out of memory); else printed, and NULL. */
static json_t *ctl_tiers_remote(bool json, const struct ctl_sample *a, const struct ctl_sample *b)
{
    bool on = false;
    for (size_t i = 0; i < b->n; i++)
        on |= strcmp(b->s[i].name, "remote_slots") == 0;
    if (!on) {
        if (json)
            return json_pack("{s:s, s:b}", "tier", "remote", "enabled", 0);
        printf("%-6s disabled\n", "remote");
        return NULL;
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
    if (json) {
        return json_pack("{s:s, s:b, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:b, s:o, s:o}",
                         "tier", "remote", "enabled", 1, "nodes", ctl_json_u64(nodes), "slots",
                         ctl_json_u64(slots), "inflight", ctl_json_u64(infl), "hits",
                         ctl_json_u64(hits), "misses", ctl_json_u64(misses), "bad_records",
                         ctl_json_u64(bad), "parts_missing", ctl_json_u64(pmiss), "parts_mixed",
                         ctl_json_u64(pmix), "errors", ctl_json_u64(errs), "degraded", deg ? 1 : 0,
                         "read_bytes_per_s", ctl_json_fixed(rd, 0), "write_bytes_per_s",
                         ctl_json_fixed(wr, 0));
    }
    char rs[32], ws[32];
    ctl_human(rs, sizeof(rs), rd, "/s");
    ctl_human(ws, sizeof(ws), wr, "/s");
    printf("%-6s nodes %" PRIu64 ", slots %" PRIu64 "/16384, in flight %" PRIu64
           ", read %s, write %s, hits %" PRIu64 ", misses %" PRIu64 ", bad records %" PRIu64
           ", parts missing %" PRIu64 ", mixed %" PRIu64 ", errors %" PRIu64 "%s\n",
           "remote", nodes, slots, infl, rs, ws, hits, misses, bad, pmiss, pmix, errs,
           deg ? ", DEGRADED" : "");
    return NULL;
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
        json_t *off = json_pack("{s:s, s:b}", "tier", "gpu", "enabled", 0);
        json_t *tiers = json_pack("[o, o, o, o]", has_gpu ? ctl_tier_json(&a, &b, &gpu) : off,
                                  ctl_tier_json(&a, &b, &host),
                                  has_disk ? ctl_tier_json(&a, &b, &disk)
                                           : json_pack("{s:s, s:b}", "tier", "disk", "enabled", 0),
                                  ctl_tiers_remote(true, &a, &b));
        if (has_gpu)
            json_decref(off);
        free(a.s);
        free(b.s);
        return ctl_json_print(
            json_pack("{s:o, s:o}", "interval_s", ctl_json_fixed(interval, 3), "tiers", tiers));
    } else {
        printf("%-5s %10s %10s %8s %6s %5s %5s %5s %12s %12s %6s %6s\n", "TIER", "CAPACITY", "USED",
               "BLOCKS", "PAGES", "FRAG", "RD_IF", "WR_IF", "READ", "WRITE", "ERRORS", "CSUM");
        if (has_gpu)
            ctl_tier_print(&a, &b, &gpu);
        else
            printf("%-5s disabled\n", "gpu");
        ctl_tier_print(&a, &b, &host);
        if (has_disk)
            ctl_tier_print(&a, &b, &disk);
        else
            printf("%-5s disabled\n", "disk");
        ctl_tiers_remote(false, &a, &b);
        printf("(rates %s)\n",
               interval > 0 ? "over the sampling interval" : "averaged since the daemon started");
    }
    free(a.s);
    free(b.s);
    return 0;
}
