/*
 * acl.c — see acl.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/acl.h"
#include "daemon/config.h"
#include "daemon/config_ns.h"
#include "daemon/engine.h"
#include "daemon/log.h"
#include "daemon/store.h"

#define ACL_NONE UINT32_MAX

struct acl {
    struct store *s;
    const struct config *cfg;
    uint32_t *section_arena; /* by section index: its arena (0: the shared one) */
    uint32_t *ns_section;    /* by namespace id: its section, or ACL_NONE */
    uint32_t nns;
};

struct acl *acl_new(struct store *s, const struct config *c, int *err)
{
    struct acl *a = calloc(1, sizeof(*a));
    int rc = -ENOMEM;
    if (!a)
        goto fail;
    a->s = s;
    a->cfg = c;
    a->nns = s->nns;
    a->ns_section = malloc(a->nns * sizeof(*a->ns_section));
    a->section_arena = calloc(c->ns.n + 1, sizeof(*a->section_arena));
    if (!a->ns_section || !a->section_arena)
        goto fail;
    for (uint32_t i = 0; i < a->nns; i++)
        a->ns_section[i] = ACL_NONE;
    for (size_t i = 0; i < c->ns.n; i++) {
        const struct config_ns *r = &c->ns.sec[i];
        uint64_t size = r->host_size;
        size_t j;
        if (!r->has_read && !r->has_write)
            continue; /* quotas only: the shared arena */
        for (j = 0; j < i; j++)
            if (config_ns_same_lists(&c->ns.sec[j], r) && a->section_arena[j])
                break;
        if (j < i) {
            a->section_arena[i] = a->section_arena[j];
            continue;
        }
        /* The largest host_size among the sections sharing these lists. */
        for (j = i + 1; j < c->ns.n; j++)
            if (config_ns_same_lists(&c->ns.sec[j], r) && c->ns.sec[j].host_size > size)
                size = c->ns.sec[j].host_size;
        rc = store_arena_add(s, size, &a->section_arena[i]);
        if (rc) {
            log_err("acl: cannot create the arena of [namespace.%s] (%s)", r->pattern,
                    strerror(-rc));
            goto fail;
        }
        log_info("acl: [namespace.%s] has a private arena %u of %llu MiB", r->pattern,
                 a->section_arena[i], (unsigned long long)(size >> 20));
    }
    return a;
fail:
    acl_free(a);
    *err = rc;
    return NULL;
}

void acl_free(struct acl *a)
{
    if (!a)
        return;
    free(a->ns_section);
    free(a->section_arena);
    free(a);
}

void acl_reload(struct acl *a, const struct config *c)
{
    a->cfg = c;
}

bool acl_is_admin(uint32_t uid, uint32_t gid, const uint32_t *groups, uint32_t ngroups,
                  bool has_admin_gid, uint32_t admin_gid)
{
    if (uid == 0 || uid == (uint32_t)geteuid())
        return true;
    if (!has_admin_gid)
        return false;
    if (gid == admin_gid)
        return true;
    for (uint32_t i = 0; i < ngroups; i++)
        if (groups[i] == admin_gid)
            return true;
    return false;
}

static uint32_t acl_rule_access(const struct config_ns *r, const struct acl_peer *p)
{
    uint32_t acc = 0;
    if (!r || p->admin || (!r->has_read && !r->has_write))
        return KVC_ACCESS_READ | KVC_ACCESS_WRITE;
    if (r->has_write && config_ns_ids_has(&r->write, p->uid, p->gid, p->groups, p->ngroups))
        acc |= KVC_ACCESS_READ | KVC_ACCESS_WRITE;
    if (r->has_read && config_ns_ids_has(&r->read, p->uid, p->gid, p->groups, p->ngroups))
        acc |= KVC_ACCESS_READ;
    return acc;
}

uint32_t acl_access_model(const struct acl *a, const struct acl_peer *p, const char *model_id)
{
    return acl_rule_access(a ? config_ns_match(&a->cfg->ns, model_id, NULL) : NULL, p);
}

static const struct config_ns *acl_ns_rule(const struct acl *a, uint32_t ns_id)
{
    const struct store_ns *ns;
    if (!a || ns_id >= a->nns)
        return NULL;
    if (a->ns_section[ns_id] != ACL_NONE)
        return &a->cfg->ns.sec[a->ns_section[ns_id]];
    /* Not bound (a namespace the disk tier brought back at start): its section by model id,
     * so that its lists hold all the same. */
    ns = store_ns_get(a->s, ns_id);
    return ns ? config_ns_match(&a->cfg->ns, ns->layout.model_id, NULL) : NULL;
}

uint32_t acl_access(const struct acl *a, const struct acl_peer *p, uint32_t ns_id)
{
    return acl_rule_access(acl_ns_rule(a, ns_id), p);
}

uint32_t acl_ns_arena(const struct acl *a, const char *model_id)
{
    size_t idx;
    if (!a || !config_ns_match(&a->cfg->ns, model_id, &idx))
        return 0;
    return a->section_arena[idx];
}

int acl_ns_bind(struct acl *a, uint32_t ns_id)
{
    const struct store_ns *ns = store_ns_get(a->s, ns_id);
    size_t idx;
    if (!ns || ns_id >= a->nns)
        return -ENOENT;
    if (!config_ns_match(&a->cfg->ns, ns->layout.model_id, &idx)) {
        a->ns_section[ns_id] = ACL_NONE;
        return ns->arena == 0 ? 0 : -EXDEV;
    }
    /* Placed by store_ns_open_in in the section's arena when it was created; a namespace
     * found elsewhere would be served from memory its list does not protect. */
    if (ns->arena != a->section_arena[idx])
        return -EXDEV;
    a->ns_section[ns_id] = (uint32_t)idx;
    return 0;
}

int acl_ns_open(struct acl *a, const struct kvc_wire_layout *l, uint32_t *ns_id, bool *created)
{
    char model[sizeof(l->model_id) + 1];
    int rc;
    memcpy(model, l->model_id, sizeof(l->model_id));
    model[sizeof(l->model_id)] = 0;
    rc = store_ns_open_in(a->s, l, acl_ns_arena(a, model), ns_id, created);
    if (rc)
        return rc;
    rc = acl_ns_bind(a, *ns_id);
    if (rc && *created)
        store_ns_close(a->s, *ns_id); /* all or nothing: it never existed */
    return rc;
}

void acl_ns_unbind(struct acl *a, uint32_t ns_id)
{
    if (a && ns_id < a->nns)
        a->ns_section[ns_id] = ACL_NONE;
}

bool acl_ns_restricted(const struct acl *a, uint32_t ns_id)
{
    const struct config_ns *r = acl_ns_rule(a, ns_id);
    return r && (r->has_read || r->has_write);
}

void acl_owner_reserved(const struct store *s, const struct store_owner *o, uint32_t *nresv,
                        uint64_t *bytes)
{
    *nresv = 0;
    *bytes = 0;
    for (uint32_t i = 0; i < o->nhandles; i++) {
        const struct store_handle *h = o->handles[i];
        const struct store_ns *ns;
        if (!h || h->kind != STORE_HANDLE_RESV)
            continue;
        ns = store_ns_get(s, h->ns);
        (*nresv)++;
        *bytes += ns ? (uint64_t)h->n * ns->block_bytes : 0;
    }
}

/* Cuts *n to `room`; -EDQUOT when there is none. */
static int acl_cut(uint32_t *n, uint64_t used, uint64_t limit, uint64_t per)
{
    uint64_t room;
    if (!limit)
        return 0;
    room = used >= limit ? 0 : (limit - used) / (per ? per : 1);
    if (room == 0)
        return -EDQUOT;
    if (room < *n)
        *n = (uint32_t)room;
    return 0;
}

int acl_quota_lookup(struct acl *a, const struct store_owner *o, uint32_t ns_id, uint32_t *n)
{
    const struct config_ns *r = acl_ns_rule(a, ns_id);
    const struct store_ns *ns = store_ns_get(a->s, ns_id);
    int rc = acl_cut(n, o->pins, (uint64_t)a->cfg->quota_client_pins, 1);
    if (rc == 0 && r && ns)
        rc = acl_cut(n, ns->stats.pins - ns->stats.unpins, r->max_pins, 1);
    return rc;
}

int acl_quota_reserve(struct acl *a, const struct store_owner *o, uint32_t ns_id, uint32_t *n,
                      uint64_t now)
{
    const struct config_ns *r = acl_ns_rule(a, ns_id);
    const struct store_ns *ns = store_ns_get(a->s, ns_id);
    uint32_t nresv;
    uint64_t bytes;
    int rc;
    if (!ns)
        return 0; /* the store answers -ENOENT */
    acl_owner_reserved(a->s, o, &nresv, &bytes);
    if (a->cfg->quota_client_reservations && nresv >= (uint64_t)a->cfg->quota_client_reservations)
        return -EDQUOT;
    rc = acl_cut(n, bytes, a->cfg->quota_client_reserved_bytes, ns->block_bytes);
    if (rc || !r)
        return rc;
    uint64_t ns_resv = ns->stats.reserved_blocks - ns->stats.committed_blocks -
                       ns->stats.aborted_blocks;
    rc = acl_cut(n, ns_resv, r->max_reservations, 1);
    if (rc || !r->max_bytes)
        return rc;
    /* Room for the new blocks inside max_bytes: the namespace's own coldest blocks go. */
    uint64_t want = (uint64_t)*n * ns->block_bytes + ns_resv * ns->block_bytes;
    uint64_t keep = r->max_bytes > want ? r->max_bytes - want : 0;
    if (ns->bytes > keep)
        engine_evict_where(a->s, ns_id, UINT32_MAX, keep, false, now);
    return acl_cut(n, ns->bytes + ns_resv * ns->block_bytes, r->max_bytes, ns->block_bytes);
}
