/*
 * libkvc_admin.c — the operator calls of libkvc (kvc.h, "operating kvcd"): one request
 * body for all of them (struct kvc_admin_req) and, except CLIENTS, one reply shape
 * (struct kvc_text_rep); then the inspection calls any client may make (kvc_stats,
 * kvc_ns_list, kvc_ns_window, kvc_block_list), each a request of its own.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvc.h"
#include "client/kvc_proto.h"
#include "client/libkvc_internal.h"

/* Sends one admin request and checks the text reply. Caller holds c->mu. */
static int kvc_admin_call(kvc_client *c, uint16_t op, uint32_t scope, uint32_t tier,
                          uint64_t cursor, const char *key, const char *value,
                          const struct kvc_text_rep **rep)
{
    struct kvc_admin_req *q = (struct kvc_admin_req *)((struct kvc_msg_hdr *)c->tx + 1);
    const struct kvc_msg_hdr *h = (const struct kvc_msg_hdr *)c->rx;
    int rc;
    if ((key && strlen(key) >= sizeof(q->key)) || (value && strlen(value) >= sizeof(q->value)))
        return -EINVAL;
    memset(q, 0, sizeof(*q));
    q->scope = scope;
    q->tier = tier;
    q->cursor = cursor;
    if (key)
        memcpy(q->key, key, strlen(key));
    if (value)
        memcpy(q->value, value, strlen(value));
    rc = kvci_call(c, op, sizeof(*q), NULL);
    if (rc || !rep)
        return rc;
    *rep = (const struct kvc_text_rep *)(h + 1);
    if (h->len < sizeof(**rep) || h->len != sizeof(**rep) + (*rep)->len)
        return -EPROTO;
    return 0;
}

static void kvc_text_copy(const struct kvc_text_rep *p, char *buf, size_t len)
{
    size_t n;
    if (!buf || !len)
        return;
    n = p->len < len - 1 ? p->len : len - 1;
    memcpy(buf, p + 1, n);
    buf[n] = 0;
}

KVC_API int kvc_clients(kvc_client *c, struct kvc_client_info **out, size_t *n)
{
    uint32_t cursor = 0;
    int rc = 0;
    if (!c || !out || !n)
        return -EINVAL;
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&c->mu);
    do {
        const struct kvc_msg_hdr *h = (const struct kvc_msg_hdr *)c->rx;
        rc = kvc_admin_call(c, KVC_OP_CLIENTS, 0, 0, cursor, NULL, NULL, NULL);
        if (rc)
            break;
        const struct kvc_clients_rep *p = (const struct kvc_clients_rep *)(h + 1);
        const struct kvc_wire_client *w = (const struct kvc_wire_client *)(p + 1);
        if (h->len < sizeof(*p) || h->len != sizeof(*p) + (size_t)p->nclients * sizeof(*w) ||
            (p->next_cursor && p->next_cursor <= cursor)) {
            rc = -EPROTO;
            break;
        }
        struct kvc_client_info *grown = realloc(*out, (*n + p->nclients + 1) * sizeof(**out));
        if (!grown) {
            rc = -ENOMEM;
            break;
        }
        *out = grown;
        for (uint32_t i = 0; i < p->nclients; i++) {
            struct kvc_client_info *o = &(*out)[(*n)++];
            memset(o, 0, sizeof(*o));
            o->conn_id = w[i].conn_id;
            o->pid = w[i].pid;
            o->uid = w[i].uid;
            o->gid = w[i].gid;
            o->leases = w[i].leases;
            o->reservations = w[i].reservations;
            o->admin = !!(w[i].flags & KVC_CLIENT_F_ADMIN);
            o->self = !!(w[i].flags & KVC_CLIENT_F_SELF);
            o->pins = w[i].pins;
            o->reserved_bytes = w[i].reserved_bytes;
            o->requests = w[i].requests;
            o->lookup_tokens = w[i].lookup_tokens;
            o->hit_tokens = w[i].hit_tokens;
            o->bytes_in = w[i].bytes_in;
            o->bytes_out = w[i].bytes_out;
            o->errors = w[i].errors;
            o->refusals = w[i].refusals;
            o->connected_ms = w[i].connected_ms;
            memcpy(o->name, w[i].name, sizeof(o->name) - 1);
        }
        cursor = p->next_cursor;
    } while (cursor);
    pthread_mutex_unlock(&c->mu);
    if (rc) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

KVC_API int kvc_metrics(kvc_client *c, char **text)
{
    uint64_t cursor = 0;
    size_t len = 0;
    char *buf = NULL;
    int rc = 0;
    if (!c || !text)
        return -EINVAL;
    *text = NULL;
    pthread_mutex_lock(&c->mu);
    do {
        const struct kvc_text_rep *p;
        rc = kvc_admin_call(c, KVC_OP_METRICS, 0, 0, cursor, NULL, NULL, &p);
        if (rc)
            break;
        if (p->next_cursor && p->next_cursor <= cursor) {
            rc = -EPROTO;
            break;
        }
        char *grown = realloc(buf, len + p->len + 1);
        if (!grown) {
            rc = -ENOMEM;
            break;
        }
        buf = grown;
        memcpy(buf + len, p + 1, p->len);
        len += p->len;
        buf[len] = 0;
        cursor = p->next_cursor;
    } while (cursor);
    pthread_mutex_unlock(&c->mu);
    if (rc)
        free(buf);
    else
        *text = buf ? buf : strdup("");
    return rc ? rc : (*text ? 0 : -ENOMEM);
}

static int kvc_config_get_as(kvc_client *c, uint32_t as, const char *key, char *buf, size_t len)
{
    const struct kvc_text_rep *p;
    int rc;
    if (!c || !buf || !len)
        return -EINVAL;
    pthread_mutex_lock(&c->mu);
    rc = kvc_admin_call(c, KVC_OP_CONFIG_GET, 0, as, 0, key ? key : "", NULL, &p);
    if (rc == 0) {
        kvc_text_copy(p, buf, len);
        if (p->len >= len)
            rc = -ENOSPC;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

KVC_API int kvc_config_get(kvc_client *c, const char *key, char *buf, size_t len)
{
    return kvc_config_get_as(c, 0, key, buf, len);
}

KVC_API int kvc_config_get_json(kvc_client *c, const char *key, char *buf, size_t len)
{
    return kvc_config_get_as(c, KVC_CONFIG_GET_JSON, key, buf, len);
}

/* Requests whose reply carries a verdict and a reason. */
static int kvc_verdict(kvc_client *c, uint16_t op, uint32_t scope, const char *key,
                       const char *value, char *msg, size_t len, uint64_t *value_out)
{
    const struct kvc_text_rep *p;
    int rc;
    if (!c)
        return -EINVAL;
    if (msg && len)
        msg[0] = 0;
    pthread_mutex_lock(&c->mu);
    rc = kvc_admin_call(c, op, scope, 0, 0, key, value, &p);
    if (rc == 0) {
        kvc_text_copy(p, msg, len);
        rc = p->result > 0 ? -EPROTO : p->result;
        if (value_out)
            *value_out = p->value;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

KVC_API int kvc_config_set(kvc_client *c, const char *key, const char *value, char *msg, size_t len)
{
    if (!key || !value)
        return -EINVAL;
    return kvc_verdict(c, KVC_OP_CONFIG_SET, 0, key, value, msg, len, NULL);
}

KVC_API int kvc_reload(kvc_client *c, char *msg, size_t len)
{
    return kvc_verdict(c, KVC_OP_RELOAD, 0, NULL, NULL, msg, len, NULL);
}

KVC_API int kvc_policy_get(kvc_client *c, uint32_t scope, char *buf, size_t len)
{
    return kvc_verdict(c, KVC_OP_POLICY_GET, scope, NULL, NULL, buf, len, NULL);
}

KVC_API int kvc_policy_set(kvc_client *c, uint32_t scope, const char *name)
{
    if (!name)
        return -EINVAL;
    return kvc_verdict(c, KVC_OP_POLICY_SET, scope, NULL, name, NULL, 0, NULL);
}

KVC_API int kvc_evict(kvc_client *c, uint32_t ns_id, uint32_t tier, uint64_t *evicted)
{
    const struct kvc_text_rep *p;
    int rc;
    if (!c)
        return -EINVAL;
    pthread_mutex_lock(&c->mu);
    rc = kvc_admin_call(c, KVC_OP_EVICT, ns_id, tier, 0, NULL, NULL, &p);
    if (rc == 0 && evicted)
        *evicted = p->value;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

KVC_API int kvc_shutdown(kvc_client *c)
{
    return kvc_verdict(c, KVC_OP_SHUTDOWN, 0, NULL, NULL, NULL, 0, NULL);
}

KVC_API int kvc_ns_drop(kvc_client *c, uint32_t ns_id, uint64_t *dropped)
{
    uint64_t n = 0;
    int rc;
    if (!ns_id)
        return -EINVAL;
    rc = kvc_verdict(c, KVC_OP_NS_DROP, ns_id, NULL, NULL, NULL, 0, &n);
    if (dropped)
        *dropped = n;
    return rc;
}

/* ---- inspection ----------------------------------------------------------------------- */

KVC_API int kvc_stats(kvc_client *c, uint32_t scope, struct kvc_stat **out, size_t *n)
{
    uint32_t len;
    int rc;
    if (!c || !out || !n)
        return -EINVAL;
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&c->mu);
    struct kvc_stats_req *q = kvci_req(c);
    memset(q, 0, sizeof(*q));
    q->scope = scope;
    rc = kvci_call(c, KVC_OP_STATS, sizeof(*q), NULL);
    if (rc == 0) {
        const struct kvc_stats_rep *p = kvci_rep(c, &len);
        const struct kvc_wire_stat *w = (const struct kvc_wire_stat *)(p + 1);
        if (len < sizeof(*p) || len != sizeof(*p) + (size_t)p->nstats * sizeof(*w)) {
            rc = -EPROTO;
        } else if (p->nstats && !(*out = calloc(p->nstats, sizeof(**out)))) {
            rc = -ENOMEM;
        } else {
            for (uint32_t i = 0; i < p->nstats; i++) {
                memcpy((*out)[i].name, w[i].name, sizeof((*out)[i].name) - 1);
                (*out)[i].value = w[i].value;
            }
            *n = p->nstats;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

KVC_API int kvc_ns_list(kvc_client *c, struct kvc_ns_info **out, size_t *n)
{
    uint32_t cursor = 0, len;
    int rc = 0;
    if (!c || !out || !n)
        return -EINVAL;
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&c->mu);
    do {
        struct kvc_ns_list_req *q = kvci_req(c);
        memset(q, 0, sizeof(*q));
        q->cursor = cursor;
        rc = kvci_call(c, KVC_OP_NS_LIST, sizeof(*q), NULL);
        if (rc)
            break;
        const struct kvc_ns_list_rep *p = kvci_rep(c, &len);
        const struct kvc_wire_ns *w = (const struct kvc_wire_ns *)(p + 1);
        if (len < sizeof(*p) || len != sizeof(*p) + (size_t)p->nns * sizeof(*w) ||
            (p->next_cursor && p->next_cursor <= cursor)) {
            rc = -EPROTO;
            break;
        }
        struct kvc_ns_info *grown = realloc(*out, (*n + p->nns + 1) * sizeof(**out));
        if (!grown) {
            rc = -ENOMEM;
            break;
        }
        *out = grown;
        for (uint32_t i = 0; i < p->nns; i++) {
            struct kvc_ns_info *o = &(*out)[(*n)++];
            memset(o, 0, sizeof(*o));
            o->ns_id = w[i].ns_id;
            o->arena_id = w[i].arena_id;
            memcpy(o->model_id, w[i].layout.model_id, sizeof(o->model_id) - 1);
            o->layers = w[i].layout.layers;
            o->kv_heads = w[i].layout.kv_heads;
            o->head_dim = w[i].layout.head_dim;
            o->block_tokens = w[i].layout.block_tokens;
            o->dtype = (enum kvc_dtype)w[i].layout.dtype;
            o->kv_kind = (enum kvc_kv_kind)w[i].layout.kv_kind;
            o->block_bytes = w[i].block_bytes;
            o->blocks = w[i].blocks;
            o->bytes = w[i].bytes;
        }
        cursor = p->next_cursor;
    } while (cursor);
    pthread_mutex_unlock(&c->mu);
    if (rc) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

KVC_API int kvc_ns_window(kvc_client *c, uint32_t ns_id, uint32_t *window_tokens)
{
    uint32_t cursor = 0, len;
    int rc = -ENOENT;
    if (!c || !window_tokens)
        return -EINVAL;
    *window_tokens = 0;
    pthread_mutex_lock(&c->mu);
    do {
        struct kvc_ns_list_req *q = kvci_req(c);
        memset(q, 0, sizeof(*q));
        q->cursor = cursor;
        int r = kvci_call(c, KVC_OP_NS_LIST, sizeof(*q), NULL);
        if (r) {
            rc = r;
            break;
        }
        const struct kvc_ns_list_rep *p = kvci_rep(c, &len);
        const struct kvc_wire_ns *w = (const struct kvc_wire_ns *)(p + 1);
        if (len < sizeof(*p) || len != sizeof(*p) + (size_t)p->nns * sizeof(*w) ||
            (p->next_cursor && p->next_cursor <= cursor)) {
            rc = -EPROTO;
            break;
        }
        for (uint32_t i = 0; i < p->nns && rc == -ENOENT; i++)
            if (w[i].ns_id == ns_id) {
                *window_tokens = w[i].layout.window_tokens;
                rc = 0;
            }
        cursor = p->next_cursor;
    } while (cursor && rc == -ENOENT);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

KVC_API int kvc_block_list(kvc_client *c, uint32_t ns_id, uint64_t *cursor, uint32_t max,
                           struct kvc_block_info **out, size_t *n)
{
    uint32_t len;
    int rc;
    if (!c || !cursor || !out || !n || max == 0)
        return -EINVAL;
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&c->mu);
    /* kvcd walks a bounded part of its index per request: a page may end with none of the
     * namespace's blocks and more to come. Those are asked past here, so that a caller sees
     * an empty page only at the end. */
    for (;;) {
        struct kvc_block_list_req *q = kvci_req(c);
        memset(q, 0, sizeof(*q));
        q->ns_id = ns_id;
        q->max = max;
        q->cursor = *cursor;
        rc = kvci_call(c, KVC_OP_BLOCK_LIST, sizeof(*q), NULL);
        if (rc)
            break;
        const struct kvc_block_list_rep *p = kvci_rep(c, &len);
        if (len != sizeof(*p) || p->nblocks || !p->next_cursor || p->next_cursor <= *cursor)
            break; /* blocks, the end, or what the checks below refuse */
        *cursor = p->next_cursor;
    }
    if (rc == 0) {
        const struct kvc_block_list_rep *p = kvci_rep(c, &len);
        const struct kvc_wire_block *w = (const struct kvc_wire_block *)(p + 1);
        if (len < sizeof(*p) || len != sizeof(*p) + (size_t)p->nblocks * sizeof(*w) ||
            p->nblocks > max || (p->next_cursor && p->next_cursor <= *cursor)) {
            rc = -EPROTO;
        } else if (p->nblocks && !(*out = calloc(p->nblocks, sizeof(**out)))) {
            rc = -ENOMEM;
        } else {
            for (uint32_t i = 0; i < p->nblocks; i++) {
                struct kvc_block_info *o = &(*out)[i];
                o->key = (struct kvc_key){w[i].key.lo, w[i].key.hi};
                o->parent = (struct kvc_key){w[i].parent.lo, w[i].parent.hi};
                o->bytes = w[i].bytes;
                o->last_access_ms = w[i].last_access_ms;
                o->hits = w[i].hits;
                o->pins = w[i].pins;
                o->children = w[i].children;
                o->depth = w[i].depth;
                o->tier = w[i].tier;
                o->format = w[i].format;
                o->state = w[i].state;
                o->on_disk = (w[i].flags & KVC_WIRE_BLOCK_F_DISK) != 0;
            }
            *n = p->nblocks;
            *cursor = p->next_cursor;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}
