/*
 * kvcctl_admin.c — kvcctl's commands that change the daemon: policy, config, reload,
 * evict, flush, shutdown (the reading forms of policy and config too).
 *
 * DESIGN
 * The daemon decides who may (admin requests: root, its user or server.admin_group) and
 * says why it refused; kvcctl turns an errno it knows the meaning of here into that meaning
 * and prints the daemon's own reason where it sent one (config set, reload).
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

/* policy [get] [--ns ID] | policy set [--ns ID] NAME: the default (cache.policy) and each
 * namespace's policy, or one namespace's. */
int ctl_policy(struct ctl *x, int argc, char **argv)
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
            return ctl_json_print(
                json_pack("{s:I, s:o}", "ns", (json_int_t)ns, "policy", ctl_json_text(text)));
        printf("%s\n", text);
        return 0;
    }
    /* The default on the first line, then "ID MODEL POLICY SOURCE [LADDER]" per namespace
     * (LADDER: "-" or "codec:share,..." of its precision ladder; older daemons omit it). */
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    json_t *doc = NULL, *list = NULL;
    bool ok = true;
    if (x->json) {
        list = json_array();
        doc =
            json_pack("{s:o, s:o}", "policy", ctl_json_text(line ? line : ""), "namespaces", list);
        list = doc ? list : NULL; /* json_pack took it, and let it go */
    } else {
        printf("default policy: %s\n", line ? line : "");
    }
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
            json_t *ladder = json_object();
            /* "raw:0.05,q8_0:0.95" -> {"raw": 0.05, "q8_0": 0.95} */
            char *s2 = NULL;
            for (char *t = strcmp(lad, "-") ? strtok_r(lad, ",", &s2) : NULL; t;
                 t = strtok_r(NULL, ",", &s2)) {
                char *colon = strchr(t, ':');
                if (!colon)
                    continue;
                *colon = 0;
                ok &= ctl_json_add(ladder, t, ctl_json_fixed(strtod(colon + 1, NULL), 2)) == 0;
            }
            ok &= json_array_append_new(
                      list, json_pack("{s:I, s:o, s:o, s:o, s:o}", "ns", (json_int_t)id, "model",
                                      ctl_json_text(model), "policy", ctl_json_text(pol), "source",
                                      ctl_json_text(src), "ladder", ladder)) == 0;
        } else {
            if (!k)
                printf("%-5s %-*s %-10s %-7s %s\n", "NS", mw, "MODEL", "POLICY", "FROM",
                       "LADDER (share of its bytes by codec)");
            printf("%-5u %-*s %-10s %-7s %s\n", id, mw, model, pol, src, lad);
        }
        k++;
    }
    if (x->json) {
        if (!ok) {
            json_decref(doc);
            doc = NULL;
        }
        return ctl_json_print(doc);
    }
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

int ctl_config(struct ctl *x, int argc, char **argv)
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
        if (x->json)
            return ctl_json_print(json_pack("{s:b, s:o, s:o}", "applied", 1, "key",
                                            ctl_json_text(argv[2]), "value",
                                            ctl_json_text(argv[3])));
        printf("%s\n", msg);
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
    /* The daemon's JSON: one object of every option, or one option's value. */
    json_error_t err;
    json_t *v = json_loads(buf, JSON_DECODE_ANY, &err);
    if (!v) {
        snprintf(why, sizeof(why), "the daemon's answer is not JSON (%.200s)", err.text);
        return ctl_fail("config get", -EPROTO, why);
    }
    if (argc == 3)
        return ctl_json_print(json_pack("{s:o}", argv[2], v));
    return ctl_json_print(v);
}

int ctl_reload(struct ctl *x, int argc, char **argv)
{
    char msg[512];
    int rc;
    if (argc != 1)
        return ctl_bad(argv[0], "takes no arguments ('%s')", argv[1]);
    if (ctl_connect(x))
        return 1;
    rc = kvc_reload(x->c, msg, sizeof(msg));
    if (x->json && ctl_json_print(json_pack("{s:b, s:o}", "applied", rc ? 0 : 1, "message",
                                            ctl_json_text(msg))))
        return 1;
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
        return ctl_json_print(json_pack("{s:o}", "evicted_blocks", ctl_json_u64(n)));
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

int ctl_evict(struct ctl *x, int argc, char **argv)
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

int ctl_flush(struct ctl *x, int argc, char **argv)
{
    if (argc != 1)
        return ctl_bad("flush", "takes no arguments (see kvcctl evict)");
    (void)argv;
    return ctl_evict_run(x, "flush", 0, 0);
}

int ctl_shutdown(struct ctl *x, int argc, char **argv)
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
        return ctl_json_print(json_pack("{s:b}", "stopping", 1));
    printf("kvcd is stopping\n");
    return 0;
}
