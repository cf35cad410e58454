/*
 * config_ns.h — per-namespace sections of the configuration: access lists and quotas.
 *
 * DESIGN
 * The main option table (config.h) has one row per option; namespaces are open-ended, so
 * they get a second, small table, CONFIG_NS_KEYS, that holds for every section
 * [namespace.PATTERN]. PATTERN is a shell glob (fnmatch) on the model id; a namespace takes
 * the first section, in file order, whose pattern matches, and none if no pattern does
 * (then anyone who can open the socket may read and write it, with the global quotas).
 *
 *   [namespace.llama-3-70b*]
 *   read = @inference 1001        ; users (name or uid) and @groups (name or gid); * anyone
 *   write = vllm @trainers        ; writers may read too
 *   host_size = 4g                ; the private arena of this access list
 *   max_bytes = 3g                ; committed bytes; past it the namespace evicts its own
 *   max_pins = 100000             ; blocks pinned at once, all clients together
 *   max_reservations = 4096       ; reserved slots at once, all clients together
 *   policy = h2o                  ; the namespaces' policy (else cache.policy)
 *   disk_compress = 1             ; zstd level of its blocks on disk (0: raw)
 *   remote = no                   ; kept out of the remote tier (remote.nodes); a section
 *                                 ; with read or write lists is out unless it says yes
 *   remote_key_file = /etc/kvcd/g ; its records sealed under this group's secret too
 *   lossy_weight = 2              ; the precision ladder keeps more raw (docs/policies.md)
 *   max_error = 0.05              ; only codecs whose attention error is at most 5 %
 *
 * A section with a read or write list gets a private host arena: namespaces whose sections
 * have the same two lists share it, and a client receives only the arenas of namespaces it
 * may use (read-only descriptors where it may only read), so the kernel enforces the lists.
 * Names resolve when the file is read, so --check-config catches an unknown user. Access
 * lists and host_size are fixed at start (the arenas are); quotas are reloadable.
 * Owned by the loop thread, like the rest of struct config.
 */
#ifndef KVC_CONFIG_NS_H
#define KVC_CONFIG_NS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* X(key, reloadable, help) */
#define CONFIG_NS_KEYS(X)                                                                      \
    X(read, 0, "users and @groups that may read (names or ids; * anyone)")                     \
    X(write, 0, "users and @groups that may write, and read")                                 \
    X(host_size, 0, "bytes of the private arena of these lists (64m)")                        \
    X(max_bytes, 1, "committed bytes; past it the namespace evicts its own")                  \
    X(max_pins, 1, "blocks pinned at once, all clients together")                             \
    X(max_reservations, 1, "slots reserved at once, all clients together")                    \
    X(policy, 1, "policy of these namespaces (a cache.policy name)")                          \
    X(disk_compress, 1, "zstd level of its disk blocks (0 raw; disk.compress)")             \
    X(remote, 1, "yes or no: to the remote tier (no by default with lists)")     \
    X(remote_key_file, 0, "its group's secret: its remote records sealed under it too")        \
    X(lossy_weight, 1, "its ladder: a lossy hit's cost against a miss (0)")                   \
    X(max_error, 1, "attention error its codecs may cause (0 any; kernels.md)")

#define CONFIG_NS_PATTERN_MAX 40 /* inih keeps section names under 50 bytes */
#define CONFIG_NS_IDS_MAX 16
#define CONFIG_NS_HOST_SIZE_DEFAULT (64ull << 20)

struct config_ns_ids {
    bool anyone;
    uint32_t nuids, ngids;
    uint32_t uids[CONFIG_NS_IDS_MAX];
    uint32_t gids[CONFIG_NS_IDS_MAX];
    char text[192]; /* as written, for printing */
};

struct config_ns {
    char pattern[CONFIG_NS_PATTERN_MAX + 1];
    uint32_t set_mask; /* keys set in the file, to refuse duplicates */
    bool has_read, has_write;
    struct config_ns_ids read, write;
    uint64_t host_size;
    uint64_t max_bytes, max_pins, max_reservations;
    int policy; /* enum policy_kind, or -1: cache.policy */
    int disk_compress; /* -1: disk.compress */
    int remote;        /* -1: not set (yes unless restricted), 0 no, 1 yes */
    char remote_key_file[128]; /* "" none: the deployment's key alone */
    double lossy_weight; /* the precision ladder's (0: the most hits) */
    double max_error;    /* lossy codecs above this attention error are not used (0: any) */
};

/* The sections of one configuration, in file order (struct config's ns). sec is owned by the
 * table: config_ns_clear frees it. This file knows nothing of struct config: the option
 * table (config.c) sits above it and hands it the table (no circle, tests/check_layers.py). */
struct config_ns_table {
    struct config_ns *sec;
    size_t n;
};

/* Sets one key of section [namespace.PATTERN] (created on first use). 0, -EINVAL with a
 * reason in why (unknown key, unknown user, bad size, duplicate), -ENOMEM. */
int config_ns_set(struct config_ns_table *t, const char *pattern, const char *key,
                  const char *value, char *why, size_t whylen);
/* Deep copy of src's sections into dst (whose own are not freed). 0 or -ENOMEM. */
int config_ns_copy(struct config_ns_table *dst, const struct config_ns_table *src);
void config_ns_clear(struct config_ns_table *t);
/* The sections as ini text, preceded by a commented description of the section. */
void config_ns_print(const struct config_ns_table *t, FILE *f);
/* 0 when next differs from cur only in reloadable keys; else -EPERM naming the first. */
int config_ns_check_reload(const struct config_ns_table *cur, const struct config_ns_table *next,
                           char *err, size_t errlen);

/* The first section matching model_id, or NULL; *idx its index when not NULL. */
const struct config_ns *config_ns_match(const struct config_ns_table *t, const char *model_id,
                                        size_t *idx);
/* The disk_compress level of the first section matching model_id, or -1 (none set). */
int config_ns_disk_compress(const struct config_ns_table *t, const char *model_id);
/* Whether namespaces of model_id use the remote tier: their section's `remote`; when it is
 * not set, yes unless the section restricts who may read or write (config_ns_restricted). A
 * restricted section never does in an unsealed tier (sealed false: remote.seal = no). */
bool config_ns_remote(const struct config_ns_table *t, bool sealed, const char *model_id);
/* Whether a section has a read or write list that is not everyone. */
bool config_ns_restricted(const struct config_ns *ns);
/* Whether a peer (uid, primary gid, supplementary groups) is in a list. */
bool config_ns_ids_has(const struct config_ns_ids *l, uint32_t uid, uint32_t gid,
                       const uint32_t *groups, size_t ngroups);
/* Whether two sections have the same two access lists (then they share an arena). */
bool config_ns_same_lists(const struct config_ns *a, const struct config_ns *b);

#endif
