/*
 * config_ns.c — see config_ns.h.
 */
#include <errno.h>
#include <fnmatch.h>
#include <grp.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/config_ns.h"
#include "daemon/config_parse.h"
#include "policies/policy.h"

enum config_ns_key {
#define CONFIG_NS_ENUM(key, reload, help) CONFIG_NS_KEY_##key,
    CONFIG_NS_KEYS(CONFIG_NS_ENUM)
#undef CONFIG_NS_ENUM
        CONFIG_NS_KEY_COUNT
};

static const struct {
    const char *name;
    bool reloadable;
    const char *help;
} config_ns_keys[] = {
#define CONFIG_NS_ROW(key, reload, help) {#key, reload, help},
    CONFIG_NS_KEYS(CONFIG_NS_ROW)
#undef CONFIG_NS_ROW
};

static int config_ns_why(char *why, size_t len, const char *msg, const char *arg)
{
    snprintf(why, len, "%s '%s'", msg, arg);
    return -EINVAL;
}

static int config_ns_parse_id(const char *tok, bool group, uint32_t *id)
{
    char *end;
    unsigned long v = strtoul(tok, &end, 10);
    if (*tok && !*end && v < UINT32_MAX) {
        *id = (uint32_t)v;
        return 0;
    }
    if (group) {
        struct group *g = getgrnam(tok);
        if (!g)
            return -ENOENT;
        *id = g->gr_gid;
    } else {
        struct passwd *pw = getpwnam(tok);
        if (!pw)
            return -ENOENT;
        *id = pw->pw_uid;
    }
    return 0;
}

/* "alice 1001 @video @44 *": users, @groups, anyone. Commas separate as well as spaces. */
static int config_ns_parse_ids(const char *value, struct config_ns_ids *l, char *why,
                               size_t whylen)
{
    char buf[sizeof(l->text)];
    char *save = NULL;
    memset(l, 0, sizeof(*l));
    if (strlen(value) >= sizeof(buf))
        return config_ns_why(why, whylen, "list too long", value);
    snprintf(buf, sizeof(buf), "%s", value);
    snprintf(l->text, sizeof(l->text), "%s", value);
    for (char *t = strtok_r(buf, " ,\t", &save); t; t = strtok_r(NULL, " ,\t", &save)) {
        bool group = t[0] == '@';
        uint32_t id;
        if (strcmp(t, "*") == 0) {
            l->anyone = true;
            continue;
        }
        if ((group ? l->ngids : l->nuids) == CONFIG_NS_IDS_MAX)
            return config_ns_why(why, whylen, "more than 16 users or groups in", value);
        if (config_ns_parse_id(group ? t + 1 : t, group, &id))
            return config_ns_why(why, whylen, group ? "unknown group" : "unknown user",
                                 group ? t + 1 : t);
        if (group)
            l->gids[l->ngids++] = id;
        else
            l->uids[l->nuids++] = id;
    }
    return 0;
}

int config_ns_set(struct config_ns_table *t, const char *pattern, const char *key,
                  const char *value, char *why, size_t whylen)
{
    struct config_ns *ns = NULL;
    int k = -1;
    uint64_t v = 0;
    for (int i = 0; i < CONFIG_NS_KEY_COUNT; i++)
        if (strcmp(config_ns_keys[i].name, key) == 0)
            k = i;
    if (k < 0) {
        snprintf(why, whylen,
                 "unknown key '%s' in [namespace.%s] (keys: read write host_size max_bytes "
                 "max_pins max_reservations policy disk_compress remote remote_key_file "
                 "lossy_weight max_error)",
                 key, pattern);
        return -EINVAL;
    }
    if (!*pattern || strlen(pattern) > CONFIG_NS_PATTERN_MAX)
        return config_ns_why(why, whylen, "namespace pattern empty or longer than 40 bytes",
                             pattern);
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->sec[i].pattern, pattern) == 0)
            ns = &t->sec[i];
    if (!ns) {
        struct config_ns *grown = realloc(t->sec, (t->n + 1) * sizeof(*grown));
        if (!grown)
            return -ENOMEM;
        t->sec = grown;
        ns = &t->sec[t->n++];
        memset(ns, 0, sizeof(*ns));
        snprintf(ns->pattern, sizeof(ns->pattern), "%s", pattern);
        ns->host_size = CONFIG_NS_HOST_SIZE_DEFAULT;
        ns->policy = -1;
        ns->disk_compress = -1;
        ns->remote = -1;
    }
    if (ns->set_mask & (1u << k)) {
        snprintf(why, whylen, "duplicate key '%s' in [namespace.%s]", key, pattern);
        return -EINVAL;
    }
    if (k == CONFIG_NS_KEY_policy) {
        ns->policy = policy_from_name(value);
        if (ns->policy < 0)
            return config_ns_why(why, whylen,
                                 "unknown policy (lru lfu prefix streaming h2o snapkv keynorm "
                                 "quest default vatp):",
                                 value);
    } else if (k == CONFIG_NS_KEY_read || k == CONFIG_NS_KEY_write) {
        int rc = config_ns_parse_ids(value, k == CONFIG_NS_KEY_read ? &ns->read : &ns->write,
                                     why, whylen);
        if (rc)
            return rc;
        if (k == CONFIG_NS_KEY_read)
            ns->has_read = true;
        else
            ns->has_write = true;
    } else if (k == CONFIG_NS_KEY_disk_compress) {
        char *end;
        long lv = strtol(value, &end, 10);
        if (!*value || *end || lv < 0 || lv > 19)
            return config_ns_why(why, whylen, "disk_compress is a zstd level 0..19, not", value);
        ns->disk_compress = (int)lv;
    } else if (k == CONFIG_NS_KEY_lossy_weight || k == CONFIG_NS_KEY_max_error) {
        char *end;
        double d = strtod(value, &end);
        if (!*value || *end || !(d >= 0) || d > 1e6)
            return config_ns_why(why, whylen,
                                 k == CONFIG_NS_KEY_max_error
                                     ? "max_error is a number >= 0 (0: any codec), not"
                                     : "lossy_weight is a number >= 0, not",
                                 value);
        if (k == CONFIG_NS_KEY_max_error)
            ns->max_error = d;
        else
            ns->lossy_weight = d;
    } else if (k == CONFIG_NS_KEY_remote) {
        if (!strcmp(value, "yes") || !strcmp(value, "true") || !strcmp(value, "on") ||
            !strcmp(value, "1"))
            ns->remote = 1;
        else if (!strcmp(value, "no") || !strcmp(value, "false") || !strcmp(value, "off") ||
                 !strcmp(value, "0"))
            ns->remote = 0;
        else
            return config_ns_why(why, whylen, "remote is yes or no, not", value);
    } else if (k == CONFIG_NS_KEY_remote_key_file) {
        if (!*value || value[0] != '/' || strlen(value) >= sizeof(ns->remote_key_file))
            return config_ns_why(why, whylen,
                                 "remote_key_file is an absolute path of at most 127 bytes, not",
                                 value);
        snprintf(ns->remote_key_file, sizeof(ns->remote_key_file), "%s", value);
    } else {
        int rc = k == CONFIG_NS_KEY_max_pins || k == CONFIG_NS_KEY_max_reservations
                     ? (*value && strspn(value, "0123456789") == strlen(value) &&
                                strlen(value) < 16
                            ? (v = strtoull(value, NULL, 10), 0)
                            : -EINVAL)
                     : config_parse_size(value, &v);
        if (rc)
            return config_ns_why(why, whylen, "not a number or size:", value);
        if (k == CONFIG_NS_KEY_host_size) {
            if (v < (1u << 20) || v > (1ull << 42))
                return config_ns_why(why, whylen, "host_size out of 1m .. 4t:", value);
            ns->host_size = v;
        } else if (k == CONFIG_NS_KEY_max_bytes) {
            ns->max_bytes = v;
        } else if (k == CONFIG_NS_KEY_max_pins) {
            ns->max_pins = v;
        } else {
            ns->max_reservations = v;
        }
    }
    ns->set_mask |= 1u << k;
    return 0;
}

int config_ns_copy(struct config_ns_table *dst, const struct config_ns_table *src)
{
    dst->sec = NULL;
    dst->n = 0;
    if (!src->n)
        return 0;
    dst->sec = malloc(src->n * sizeof(*dst->sec));
    if (!dst->sec)
        return -ENOMEM;
    memcpy(dst->sec, src->sec, src->n * sizeof(*dst->sec));
    dst->n = src->n;
    return 0;
}

void config_ns_clear(struct config_ns_table *t)
{
    free(t->sec);
    t->sec = NULL;
    t->n = 0;
}

void config_ns_print(const struct config_ns_table *t, FILE *f)
{
    fputs("\n# [namespace.PATTERN] sections (none by default): access lists and quotas for\n"
          "# the namespaces whose model id matches PATTERN (a shell glob); the first\n"
          "# matching section applies. A namespace no section matches is open to anyone who\n"
          "# can open the socket. Users are names or uids, @groups names or gids, * anyone.\n"
          "# A section with a read or write list gets a private host arena (shared by the\n"
          "# sections with the same lists): a client maps only the arenas it may use, and\n"
          "# read-only where it may only read. Keys (+: reloadable):\n",
          f);
    for (int i = 0; i < CONFIG_NS_KEY_COUNT; i++)
        fprintf(f, "# %c %-16s %s\n", config_ns_keys[i].reloadable ? '+' : ' ',
                config_ns_keys[i].name, config_ns_keys[i].help);
    fputs("# Example:\n#   [namespace.llama-3-*]\n#   read = @inference\n#   write = vllm\n"
          "#   host_size = 4g\n#   max_bytes = 3g\n",
          f);
    for (size_t i = 0; i < t->n; i++) {
        const struct config_ns *ns = &t->sec[i];
        fprintf(f, "\n[namespace.%s]\n", ns->pattern);
        if (ns->has_read)
            fprintf(f, "read = %s\n", ns->read.text);
        if (ns->has_write)
            fprintf(f, "write = %s\n", ns->write.text);
        fprintf(f, "host_size = %llum\n", (unsigned long long)(ns->host_size >> 20));
        fprintf(f, "max_bytes = %llu\n", (unsigned long long)ns->max_bytes);
        fprintf(f, "max_pins = %llu\n", (unsigned long long)ns->max_pins);
        fprintf(f, "max_reservations = %llu\n", (unsigned long long)ns->max_reservations);
        if (ns->policy >= 0)
            fprintf(f, "policy = %s\n", policy_name((enum policy_kind)ns->policy));
        if (ns->set_mask & (1u << CONFIG_NS_KEY_lossy_weight))
            fprintf(f, "lossy_weight = %g\n", ns->lossy_weight);
        if (ns->set_mask & (1u << CONFIG_NS_KEY_max_error))
            fprintf(f, "max_error = %g\n", ns->max_error);
        if (ns->disk_compress >= 0)
            fprintf(f, "disk_compress = %d\n", ns->disk_compress);
        if (ns->remote >= 0)
            fprintf(f, "remote = %s\n", ns->remote ? "yes" : "no");
        if (ns->remote_key_file[0])
            fprintf(f, "remote_key_file = %s\n", ns->remote_key_file);
    }
}

static bool config_ns_ids_equal(const struct config_ns_ids *a, const struct config_ns_ids *b)
{
    return a->anyone == b->anyone && a->nuids == b->nuids && a->ngids == b->ngids &&
           memcmp(a->uids, b->uids, a->nuids * sizeof(a->uids[0])) == 0 &&
           memcmp(a->gids, b->gids, a->ngids * sizeof(a->gids[0])) == 0;
}

bool config_ns_same_lists(const struct config_ns *a, const struct config_ns *b)
{
    return a->has_read == b->has_read && a->has_write == b->has_write &&
           config_ns_ids_equal(&a->read, &b->read) && config_ns_ids_equal(&a->write, &b->write);
}

int config_ns_check_reload(const struct config_ns_table *cur, const struct config_ns_table *next,
                           char *err, size_t errlen)
{
    if (cur->n != next->n) {
        snprintf(err, errlen,
                 "[namespace.*] sections cannot be added or removed on reload (%zu -> %zu); "
                 "restart kvcd to apply it",
                 cur->n, next->n);
        return -EROFS;
    }
    for (size_t i = 0; i < cur->n; i++) {
        const struct config_ns *a = &cur->sec[i], *b = &next->sec[i];
        if (strcmp(a->pattern, b->pattern) != 0 || !config_ns_same_lists(a, b) ||
            a->host_size != b->host_size || strcmp(a->remote_key_file, b->remote_key_file) != 0) {
            snprintf(err, errlen,
                     "[namespace.%s]: pattern, read, write, host_size and remote_key_file "
                     "cannot change on reload; restart kvcd to apply it",
                     a->pattern);
            return -EROFS;
        }
    }
    return 0;
}

const struct config_ns *config_ns_match(const struct config_ns_table *t, const char *model_id,
                                        size_t *idx)
{
    for (size_t i = 0; i < t->n; i++)
        if (fnmatch(t->sec[i].pattern, model_id, 0) == 0) {
            if (idx)
                *idx = i;
            return &t->sec[i];
        }
    return NULL;
}

bool config_ns_restricted(const struct config_ns *ns)
{
    return (ns->has_read && !ns->read.anyone) || (ns->has_write && !ns->write.anyone);
}

bool config_ns_remote(const struct config_ns_table *t, bool sealed, const char *model_id)
{
    const struct config_ns *ns = config_ns_match(t, model_id, NULL);
    if (!ns)
        return true;
    if (config_ns_restricted(ns))
        return ns->remote == 1 && sealed;
    return ns->remote != 0;
}

int config_ns_disk_compress(const struct config_ns_table *t, const char *model_id)
{
    const struct config_ns *ns = config_ns_match(t, model_id, NULL);
    return ns ? ns->disk_compress : -1;
}

bool config_ns_ids_has(const struct config_ns_ids *l, uint32_t uid, uint32_t gid,
                       const uint32_t *groups, size_t ngroups)
{
    if (l->anyone)
        return true;
    for (uint32_t i = 0; i < l->nuids; i++)
        if (l->uids[i] == uid)
            return true;
    for (uint32_t i = 0; i < l->ngids; i++) {
        if (l->gids[i] == gid)
            return true;
        for (size_t k = 0; k < ngroups; k++)
            if (l->gids[i] == groups[k])
                return true;
    }
    return false;
}
