/*
 * admin.c — see admin.h.
 *
 * DESIGN
 * Runs on the loop thread like every handler. Nothing here blocks: a reload parses one
 * small file; METRICS renders the whole text for every page it serves (a few KiB per
 * namespace and client; scrapes are rare) so that no state is kept between pages.
 * Metric names follow the Prometheus conventions (`promtool check metrics` passes them):
 * counters end in _total, bytes in _bytes, times are seconds (the load_us counter is
 * exposed as kvcd_load_seconds_total), the daemon totals have no labels, per-namespace and
 * per-client families carry them.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/acl.h"
#include "daemon/admin.h"
#include "daemon/config.h"
#include "daemon/engine.h"
#include "daemon/engine_disk.h"
#include "daemon/engine_gpu.h"
#include "daemon/engine_remote.h"
#include "daemon/log.h"
#include "daemon/proto.h"
#include "daemon/stats.h"
#include "daemon/store.h"
#include "kernels/kern.h"
#include "tiers/host.h"
#include "tiers/tier.h"

/* Whether the asker may see namespace i (the check NS_LIST uses). */
static bool admin_ns_visible(const struct admin_ctx *x, uint32_t i)
{
    return !x->peer || acl_access(x->acl, x->peer, i) != 0;
}

static bool admin_all(const struct admin_ctx *x)
{
    return !x->peer || x->peer->admin;
}

static int admin_text(void *out, size_t cap, int32_t result, uint64_t value, uint64_t next,
                      const char *text, size_t len)
{
    struct kvc_text_rep *p = out;
    if (len > KVC_PROTO_TEXT_MAX || sizeof(*p) + len > cap)
        len = cap - sizeof(*p) < KVC_PROTO_TEXT_MAX ? cap - sizeof(*p) : KVC_PROTO_TEXT_MAX;
    *p = (struct kvc_text_rep){
        .result = result, .len = (uint32_t)len, .value = value, .next_cursor = next};
    if (text && len)
        memcpy(p + 1, text, len);
    return (int)(sizeof(*p) + len);
}

/* A label value: backslash, quote and newline escaped. */
static void admin_label(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            fprintf(f, "\\%c", *s);
        else if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
}

/* One remote tier value (engine_remote_stats): counters end in _total, the rest are gauges. */
static void admin_metric_remote(void *arg, const char *name, uint64_t v)
{
    static const char *const gauges[] = {"remote_nodes", "remote_slots", "remote_inflight",
                                         "remote_degraded", "remote_queue"};
    bool gauge = false;
    for (size_t i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++)
        gauge |= strcmp(name, gauges[i]) == 0;
    fprintf(arg, "# TYPE kvcd_%s%s %s\nkvcd_%s%s %" PRIu64 "\n", name, gauge ? "" : "_total",
            gauge ? "gauge" : "counter", name, gauge ? "" : "_total", v);
}

/* One value of the pool's moves (engine_gpu_stats): waits and queries are counters. */
static void admin_metric_gpu(void *arg, const char *name, uint64_t v)
{
    bool gauge = strcmp(name, "gpu_move_waits") != 0 && strcmp(name, "gpu_move_queries") != 0;
    fprintf(arg, "# TYPE kvcd_%s%s %s\nkvcd_%s%s %" PRIu64 "\n", name, gauge ? "" : "_total",
            gauge ? "gauge" : "counter", name, gauge ? "" : "_total", v);
}

/* The metric name of counter `name` into out: a microsecond counter (name_us) becomes
 * name_seconds (Prometheus names times in base units); returns whether it did. */
static bool admin_metric_name(const char *name, char *out, size_t len)
{
    size_t n = strlen(name);
    bool us = n > 3 && strcmp(name + n - 3, "_us") == 0;
    snprintf(out, len, "%.*s%s", (int)(us ? n - 3 : n), name, us ? "_seconds" : "");
    return us;
}

/* The length of a counter's help to print: a microsecond counter's without its " (us)". */
static int admin_help_len(const char *help, bool us)
{
    size_t n = strlen(help);
    return (int)(us && n > 5 && strcmp(help + n - 5, " (us)") == 0 ? n - 5 : n);
}

/* A counter's sample value and newline: microseconds as seconds when us. */
static void admin_counter_value(FILE *f, uint64_t v, bool us)
{
    if (us)
        fprintf(f, "%" PRIu64 ".%06" PRIu64 "\n", v / 1000000, v % 1000000);
    else
        fprintf(f, "%" PRIu64 "\n", v);
}

int admin_metrics_render(const struct admin_ctx *x, char **text, size_t *len)
{
    const struct store *s = x->store;
    const struct stats *t = &s->total;
    struct kvc_wire_client *cl = NULL;
    uint32_t ncl = 0, next = 0;
    uint64_t blocks = 0, bytes = 0, nns = 0;
    FILE *f = open_memstream(text, len);
    if (!f)
        return -ENOMEM;
    cl = calloc(4096, sizeof(*cl));
    if (cl)
        ncl = x->server->clients_fill(x->sv, 0, x->conn_id, admin_all(x), x->uid, cl, 4096, &next);
    for (uint32_t i = 1; i < s->nns; i++)
        if (s->ns[i]) {
            blocks += s->ns[i]->blocks;
            bytes += s->ns[i]->bytes;
            nns++;
        }
        /* Daemon totals, then the same family per namespace. A counter of microseconds (its
     * name ends in _us) is exposed in seconds under the name ending in _seconds. */
#define ADMIN_COUNTER(name, help)                                                                  \
    {                                                                                              \
        char mn[64];                                                                               \
        bool us = admin_metric_name(#name, mn, sizeof(mn));                                        \
        fprintf(f, "# HELP kvcd_%s_total %.*s\n# TYPE kvcd_%s_total counter\nkvcd_%s_total ", mn,  \
                admin_help_len(help, us), help, mn, mn);                                           \
        admin_counter_value(f, t->name, us);                                                       \
        fprintf(f,                                                                                 \
                "# HELP kvcd_namespace_%s_total %.*s, per namespace\n"                             \
                "# TYPE kvcd_namespace_%s_total counter\n",                                        \
                mn, admin_help_len(help, us), help, mn);                                           \
        for (uint32_t i = 1; i < s->nns; i++)                                                      \
            if (s->ns[i] && admin_ns_visible(x, i)) {                                              \
                fprintf(f, "kvcd_namespace_%s_total{namespace=\"", mn);                            \
                admin_label(f, s->ns[i]->layout.model_id);                                         \
                fputs("\"} ", f);                                                                  \
                admin_counter_value(f, s->ns[i]->stats.name, us);                                  \
            }                                                                                      \
    }
    STATS_COUNTERS(ADMIN_COUNTER)
#undef ADMIN_COUNTER
#define ADMIN_GAUGE(name, help, v)                                                             \
    fprintf(f, "# HELP kvcd_" name " " help "\n# TYPE kvcd_" name " gauge\nkvcd_" name          \
               " %" PRIu64 "\n",                                                               \
            (uint64_t)(v))
    ADMIN_GAUGE("blocks", "committed blocks cached", blocks);
    ADMIN_GAUGE("cached_bytes", "bytes held by committed blocks", bytes);
    ADMIN_GAUGE("pins", "block pins held now", s->pins_now);
    ADMIN_GAUGE("reserved_blocks", "slots reserved and not yet committed", s->reserved_now);
    ADMIN_GAUGE("reserved_bytes", "bytes of those slots", s->reserved_bytes_now);
    ADMIN_GAUGE("clients", "connected clients", x->server->clients(x->sv));
    ADMIN_GAUGE("namespaces", "namespaces", nns);
    ADMIN_GAUGE("uptime_seconds", "seconds since start", x->now / 1000);
    ADMIN_GAUGE("log_suppressed_lines", "log lines dropped by the rate limit", log_suppressed());
    uint64_t faulted, arenas;
    store_host_faulted(s, &faulted, &arenas);
    ADMIN_GAUGE("host_faulted_bytes", "bytes of the host arenas faulted in", faulted);
    ADMIN_GAUGE("host_arenas_bytes", "bytes of every host arena together", arenas);
    ADMIN_GAUGE("host_collapsed_bytes", "bytes of the host arenas made 2 MiB pages by collapse",
                store_host_collapsed(s));
    uint64_t fpub, ffull;
    store_fast_stats(s, &fpub, &ffull);
    ADMIN_GAUGE("fast_index_blocks", "blocks published in the arenas' shared indexes", fpub);
    ADMIN_GAUGE("fast_index_full", "blocks left out of a full index set (hits take the socket)",
                ffull);
#undef ADMIN_GAUGE
    fprintf(f, "# HELP kvcd_token_hit_ratio tokens hit / tokens requested by lookups "
               "(kvcd_hit_tokens_total / kvcd_lookup_tokens_total)\n"
               "# TYPE kvcd_token_hit_ratio gauge\nkvcd_token_hit_ratio %.6f\n",
            t->lookup_tokens ? (double)t->hit_tokens / (double)t->lookup_tokens : 0.0);
    fputs("# HELP kvcd_tier_capacity_bytes bytes of each tier arena\n"
          "# TYPE kvcd_tier_capacity_bytes gauge\n",
          f);
    for (uint32_t a = 0; a < s->narenas; a++) {
        const struct tier *tt = s->arenas[a].tier;
        fprintf(f, "kvcd_tier_capacity_bytes{tier=\"host\",arena=\"%u\"} %" PRIu64 "\n", a,
                (uint64_t)tt->ops->capacity(tt));
    }
    fputs("# HELP kvcd_tier_used_bytes bytes of each tier arena in slots\n"
          "# TYPE kvcd_tier_used_bytes gauge\n",
          f);
    for (uint32_t a = 0; a < s->narenas; a++) {
        const struct tier *tt = s->arenas[a].tier;
        fprintf(f, "kvcd_tier_used_bytes{tier=\"host\",arena=\"%u\"} %" PRIu64 "\n", a,
                (uint64_t)tt->ops->usage(tt));
    }
    engine_remote_stats(s, admin_metric_remote, f);
    engine_gpu_stats(s, admin_metric_gpu, f);
    /* Per client: labelled by connection id, pid, uid and the name it gave. suffix: "" for a
     * gauge, "_total" for a counter. */
#define ADMIN_CLIENT(field, type, suffix, help)                                                    \
    fprintf(f, "# HELP kvcd_client_" #field suffix " " help "\n# TYPE kvcd_client_" #field suffix  \
               " " type "\n");                                                                     \
    for (uint32_t i = 0; i < ncl; i++) {                                                           \
        fprintf(f, "kvcd_client_" #field suffix "{conn=\"%u\",pid=\"%u\",uid=\"%u\",name=\"",      \
                cl[i].conn_id, cl[i].pid, cl[i].uid);                                              \
        admin_label(f, cl[i].name);                                                                \
        fprintf(f, "\"} %" PRIu64 "\n", (uint64_t)cl[i].field);                                    \
    }
    ADMIN_CLIENT(pins, "gauge", "", "block pins this client holds")
    ADMIN_CLIENT(reservations, "gauge", "", "reservations this client holds open")
    ADMIN_CLIENT(reserved_bytes, "gauge", "", "bytes of its reserved slots")
    ADMIN_CLIENT(requests, "counter", "_total", "requests from this client")
    ADMIN_CLIENT(lookup_tokens, "counter", "_total", "tokens this client asked for")
    ADMIN_CLIENT(hit_tokens, "counter", "_total", "tokens this client found cached")
    ADMIN_CLIENT(bytes_in, "counter", "_total", "bytes this client committed")
    ADMIN_CLIENT(bytes_out, "counter", "_total", "bytes handed to this client as hits")
    ADMIN_CLIENT(errors, "counter", "_total", "requests of this client answered with an error")
    ADMIN_CLIENT(refusals, "counter", "_total",
                 "requests of this client refused (access, admin, quota, limits)")
#undef ADMIN_CLIENT
    free(cl);
    return fclose(f) ? -ENOMEM : 0;
}

static int admin_metrics(const struct admin_ctx *x, const struct kvc_admin_req *q, void *out,
                         size_t cap)
{
    char *text;
    size_t len, page = cap - sizeof(struct kvc_text_rep);
    int rc = admin_metrics_render(x, &text, &len);
    if (rc)
        return rc;
    if (page > KVC_PROTO_TEXT_MAX)
        page = KVC_PROTO_TEXT_MAX;
    if (q->cursor >= len) {
        rc = admin_text(out, cap, 0, len, 0, NULL, 0);
    } else {
        /* Pages end at a newline so that each is whole lines. */
        size_t n = len - q->cursor;
        if (n > page) {
            n = page;
            while (n > 0 && text[q->cursor + n - 1] != '\n')
                n--;
        }
        rc = admin_text(out, cap, 0, len, q->cursor + n < len ? q->cursor + n : 0,
                        text + q->cursor, n);
    }
    free(text);
    return rc;
}

/* Whether the asker may see an option's value: options naming paths, cluster nodes and users
 * or groups are for admins (config_option_access); a secret is never shown (config_get). */
static bool admin_config_visible(const struct admin_ctx *x, const struct config_option *o)
{
    return config_option_access(o) == CONFIG_ACCESS_ANYONE || admin_all(x);
}

static int admin_config_get(const struct admin_ctx *x, const struct kvc_admin_req *q, void *out,
                            size_t cap)
{
    char buf[512];
    bool json = q->tier == KVC_CONFIG_GET_JSON;
    if (q->tier > KVC_CONFIG_GET_JSON)
        return -EINVAL;
    if (q->key[0]) {
        const struct config_option *o = config_option_find(q->key);
        int rc;
        if (!o)
            return -ENOENT;
        if (!admin_config_visible(x, o))
            return -EACCES;
        rc = json ? config_get_json(x->cfg, o, buf, sizeof(buf))
                  : config_get(x->cfg, q->key, buf, sizeof(buf));
        if (rc)
            return rc;
        return admin_text(out, cap, 0, 0, 0, buf, strlen(buf));
    }
    /* No key: every option the asker may see, "section.name = value" a line, with its
     * reloadability; the others "(admin only)". */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return -ENOMEM;
    for (size_t i = 0; json && i < config_noptions; i++) {
        /* {"section.name": value, ...}; an option the asker may not see is null */
        const struct config_option *o = &config_options[i];
        if (!admin_config_visible(x, o) || config_get_json(x->cfg, o, buf, sizeof(buf)))
            snprintf(buf, sizeof(buf), "null");
        fprintf(f, "%s\"%s.%s\": %s", i ? ", " : "{", o->section, o->name, buf);
    }
    if (json)
        fputs("}\n", f);
    for (size_t i = 0; !json && i < config_noptions; i++) {
        char key[128];
        snprintf(key, sizeof(key), "%s.%s", config_options[i].section, config_options[i].name);
        if (!admin_config_visible(x, &config_options[i]))
            fprintf(f, "%s = (admin only)\n", key);
        else if (config_get(x->cfg, key, buf, sizeof(buf)) == 0)
            fprintf(f, "%s = %s%s\n", key, buf, config_options[i].reloadable ? "" : "\t(restart)");
    }
    fclose(f);
    int rc = text ? admin_text(out, cap, 0, 0, 0, text, len) : -ENOMEM;
    free(text);
    return rc;
}

/* POLICY_GET/SET: scope 0 is the default (cache.policy) and GET lists every namespace's;
 * scope N is namespace N ("inherit" follows the default again). */
static int admin_policy(const struct admin_ctx *x, bool set, const struct kvc_admin_req *q,
                        void *out, size_t cap)
{
    static const char *const src[] = {[STORE_POLICY_SRC_DEFAULT] = "default",
                                      [STORE_POLICY_SRC_CONFIG] = "config",
                                      [STORE_POLICY_SRC_ADMIN] = "admin"};
    struct store *s = x->store;
    struct store_ns *ns = q->scope ? store_ns_get(s, q->scope) : NULL;
    char *text = NULL;
    size_t len = 0;
    int rc;
    if (q->scope && !ns)
        return -ENOENT;
    if (q->scope && !admin_ns_visible(x, q->scope))
        return -EACCES;
    if (set) {
        int k = q->scope && strcmp(q->value, "inherit") == 0 ? -1 : policy_from_name(q->value);
        if (k < 0 && !(q->scope && strcmp(q->value, "inherit") == 0))
            return -EINVAL;
        if (q->scope) {
            store_ns_policy_set(s, q->scope, k, STORE_POLICY_SRC_ADMIN);
            log_info("admin: namespace %u '%s' policy set to %s (until the next reload)",
                     q->scope, ns->layout.model_id, policy_name(ns->policy));
        } else {
            struct store_params p = s->p;
            p.policy = (enum policy_kind)k;
            store_reload(s, &p); /* namespaces that follow the default follow it */
            log_info("admin: default policy set to %s (until the next reload)", q->value);
        }
    }
    if (q->scope) {
        const char *name = policy_name(ns->policy);
        return admin_text(out, cap, 0, 0, 0, name, strlen(name));
    }
    /* The default on the first line, then "ID MODEL POLICY SOURCE LADDER" per namespace:
     * LADDER is "-", or each rung's codec and share of the namespace's bytes in its arena
     * ("raw:0.05,q8_0:0.80,q4_1:0.15"). */
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return -ENOMEM;
    fprintf(f, "%s\n", policy_name(s->p.policy));
    for (uint32_t i = 1; i < s->nns; i++) {
        const struct store_ns *n = s->ns[i];
        double total = 0;
        if (!n || !admin_ns_visible(x, i))
            continue;
        fprintf(f, "%u %s %s %s ", i, n->layout.model_id, policy_name(n->policy),
                src[n->policy_src % 3]);
        for (uint32_t k = 0; k < n->rungs; k++)
            total += (double)n->rung_bytes[k];
        for (uint32_t k = 0; k < n->rungs; k++)
            fprintf(f, "%s%s:%.2f", k ? "," : "", kern_codec_name((enum kern_codec)n->rung_format[k]),
                    total > 0 ? (double)n->rung_bytes[k] / total : 0.0);
        fprintf(f, "%s\n", n->rungs < 2 ? "-" : "");
    }
    if (fclose(f) || !text) {
        free(text);
        return -ENOMEM;
    }
    rc = admin_text(out, cap, 0, 0, 0, text, len);
    free(text);
    return rc;
}

int admin_handle(const struct admin_ctx *x, const struct proto_req *r, void *out, size_t cap)
{
    const struct kvc_admin_req *q = r->body;
    char msg[512] = "";
    int rc;
    switch (r->hdr->opcode) {
    case KVC_OP_CLIENTS: {
        struct kvc_clients_rep *p = out;
        uint32_t max = (uint32_t)((cap - sizeof(*p)) / sizeof(struct kvc_wire_client)), next;
        uint32_t n = x->server->clients_fill(x->sv, (uint32_t)q->cursor, x->conn_id, admin_all(x),
                                             x->uid, (struct kvc_wire_client *)(p + 1), max, &next);
        *p = (struct kvc_clients_rep){.nclients = n, .next_cursor = next};
        return (int)(sizeof(*p) + n * sizeof(struct kvc_wire_client));
    }
    case KVC_OP_METRICS:
        return admin_metrics(x, q, out, cap);
    case KVC_OP_CONFIG_GET:
        return admin_config_get(x, q, out, cap);
    case KVC_OP_CONFIG_SET:
        if (!x->hooks->config_set)
            return -EOPNOTSUPP;
        rc = x->hooks->config_set(x->hooks->arg, q->key, q->value, msg, sizeof(msg));
        return admin_text(out, cap, rc, 0, 0, msg, strlen(msg));
    case KVC_OP_RELOAD:
        if (!x->hooks->reload)
            return -EOPNOTSUPP;
        rc = x->hooks->reload(x->hooks->arg, msg, sizeof(msg));
        return admin_text(out, cap, rc, 0, 0, msg, strlen(msg));
    case KVC_OP_POLICY_GET:
    case KVC_OP_POLICY_SET:
        return admin_policy(x, r->hdr->opcode == KVC_OP_POLICY_SET, q, out, cap);
    case KVC_OP_EVICT: {
        int n;
        if (q->tier && q->tier != KVC_WIRE_TIER_HOST)
            return -EOPNOTSUPP;
        if (q->scope && !store_ns_get(x->store, q->scope))
            return -ENOENT;
        if (q->tier) { /* the host arenas only: blocks on disk stay */
            n = 0;
            for (uint32_t a = 0; a < x->store->narenas; a++)
                n += engine_evict_where(x->store, q->scope, a, 0, true, x->now);
        } else {
            n = engine_evict_where(x->store, q->scope, UINT32_MAX, 0, true, x->now);
            /* Records freed on disk must not come back from an older checkpoint. */
            if (n)
                engine_disk_checkpoint(x->store);
        }
        log_info("admin: evicted %d blocks (namespace %u, tier %s)", n, q->scope,
                 q->tier ? "host" : "all");
        return admin_text(out, cap, 0, (uint64_t)n, 0, NULL, 0);
    }
    case KVC_OP_NS_DROP: {
        uint64_t n = 0;
        if (!q->scope)
            return -EINVAL;
        rc = x->server->ns_drop(x->sv, q->scope, &n);
        if (rc == -EBUSY) {
            static const char busy[] = "a client holds a lease or reservation on it, or a "
                                       "block of it is moving";
            log_info("admin: namespace %u not dropped (%s); %llu of its blocks dropped",
                     q->scope, busy, (unsigned long long)n);
            return admin_text(out, cap, rc, n, 0, busy, sizeof(busy) - 1);
        }
        if (rc)
            return rc;
        log_info("admin: namespace %u dropped with its %llu blocks", q->scope,
                 (unsigned long long)n);
        return admin_text(out, cap, 0, n, 0, NULL, 0);
    }
    case KVC_OP_SHUTDOWN:
        if (!x->hooks->shutdown)
            return -EOPNOTSUPP;
        log_info("admin: shutdown requested by client %u", x->conn_id);
        x->hooks->shutdown(x->hooks->arg);
        return admin_text(out, cap, 0, 0, 0, NULL, 0);
    default:
        return -EOPNOTSUPP;
    }
}
