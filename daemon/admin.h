/*
 * admin.h — the operator requests: CLIENTS, METRICS, CONFIG_GET/SET, RELOAD, POLICY_GET/SET,
 * EVICT, SHUTDOWN, NS_DROP (see kvc_proto.h). The server has checked that admin-only ones
 * come from an admin before calling here; the open ones show a peer that is not an admin
 * only what the access lists let it see.
 */
#ifndef KVC_ADMIN_H
#define KVC_ADMIN_H

#include <stddef.h>
#include <stdint.h>

struct acl;
struct acl_peer;
struct config;
struct proto_req;
struct server;
struct server_hooks;
struct store;

struct admin_ctx {
    struct server *sv;
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
