/*
 * admin.h — the operator requests: CLIENTS, METRICS, CONFIG_GET/SET, RELOAD, POLICY_GET/SET,
 * EVICT, SHUTDOWN, NS_DROP (see kvc_proto.h). The server has checked that admin-only ones
 * come from an admin before calling here; the open ones show a peer that is not an admin
 * only what the access lists let it see.
 */
#ifndef KVC_ADMIN_H
#define KVC_ADMIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct acl;
struct acl_peer;
struct config;
struct kvc_wire_client;
struct proto_req;
struct server;
struct server_hooks;
struct store;

/* What the admin requests call back into the daemon for (main.c, through server_set_hooks). */
struct server_hooks {
    void *arg;
    /* RELOAD: the same all-or-nothing reload as SIGHUP. 0 applied, or -errno and a reason. */
    int (*reload)(void *arg, char *msg, size_t len);
    /* CONFIG_SET: the running configuration with one option changed, checked like a reload. */
    int (*config_set)(void *arg, const char *key, const char *value, char *msg, size_t len);
    /* SHUTDOWN: stop the loop after this reply. */
    void (*shutdown)(void *arg);
};

/* The server's own services that CLIENTS, METRICS and NS_DROP use (server.h says what each
 * does), handed down by the server: admin sits below it and calls nothing above. */
struct admin_server_ops {
    uint32_t (*clients)(const struct server *sv);
    uint32_t (*clients_fill)(const struct server *sv, uint32_t cursor, uint32_t self, bool all,
                             uint32_t uid, struct kvc_wire_client *out, uint32_t max,
                             uint32_t *next);
    int (*ns_drop)(struct server *sv, uint32_t ns_id, uint64_t *dropped);
};

struct admin_ctx {
    struct server *sv;
    const struct admin_server_ops *server;
    struct store *store;
    const struct config *cfg;
    const struct server_hooks *hooks;
    const struct acl *acl;       /* NULL: no access lists */
    const struct acl_peer *peer; /* who asks: what it may see (NULL: everything) */
    uint32_t uid;                /* its uid: the connections CLIENTS and METRICS show it */
    uint32_t conn_id;            /* the asking connection */
    uint64_t now;
};

/* Fills the reply payload at out (cap bytes) and returns its length, or -errno. */
int admin_handle(const struct admin_ctx *x, const struct proto_req *r, void *out, size_t cap);

/* The whole Prometheus text exposition of the daemon's counters into a malloc'd buffer
 * (*len bytes, NUL-terminated): the totals, and the namespaces and connections the asker may
 * see (an admin all of them; another peer the namespaces NS_LIST shows it and its uid's
 * connections). 0 or -ENOMEM. */
int admin_metrics_render(const struct admin_ctx *x, char **text, size_t *len);

#endif
