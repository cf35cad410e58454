/*
 * admin.h — the operator requests: CLIENTS, METRICS, CONFIG_GET/SET, RELOAD, POLICY_GET/SET,
 * EVICT, SHUTDOWN (see kvc_proto.h). The server has checked that admin-only ones come from
 * an admin before calling here.
 */
#ifndef KVC_ADMIN_H
#define KVC_ADMIN_H

#include <stddef.h>
#include <stdint.h>

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
    uint32_t conn_id; /* the asking connection */
    uint64_t now;
};

/* Fills the reply payload at out (cap bytes) and returns its length, or -errno. */
int admin_handle(const struct admin_ctx *x, const struct proto_req *r, void *out, size_t cap);

/* The whole Prometheus text exposition of the daemon's counters into a malloc'd buffer
 * (*len bytes, NUL-terminated). 0 or -ENOMEM. */
int admin_metrics_render(const struct admin_ctx *x, char **text, size_t *len);

#endif
