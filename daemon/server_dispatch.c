/*
 * server_dispatch.c — the server's requests: one handler per opcode, each filling its reply's
 * payload, and server_handle, which validates a datagram (proto.c), applies the limits and
 * the access lists, calls the handler and sends the reply.
 *
 * DESIGN
 * Loop thread only. A handler returns its reply's length or -errno, or SERVER_DEFERRED
 * when the reply waits (a WAIT on reads in flight, a RESERVE waiting for room, a LOOKUP
 * waiting for room or for the GPU pool's move slots: they sit on the server's waits or
 * pending list, answered from the tick or server_retry). The per-client counters are the
 * store's counters' delta over the request (server_stats_delta).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon/acl.h"
#include "daemon/admin.h"
#include "daemon/config.h"
#include "daemon/config_ns.h"
#include "daemon/engine.h"
#include "daemon/engine_disk.h"
#include "daemon/engine_gpu.h"
#include "daemon/engine_remote.h"
#include "daemon/fast.h"
#include "daemon/log.h"
#include "daemon/loop.h"
#include "daemon/proto.h"
#include "daemon/server.h"
#include "daemon/server_int.h"
#include "daemon/store.h"
#include "tiers/gpu.h"
#include "tiers/host.h"

/* ---- handlers: each fills the reply payload and returns its length, or -errno ---------- */

static int server_on_hello(struct server *sv, struct conn *c, const struct proto_req *r)
{
    const struct kvc_hello_req *q = r->body;
    struct kvc_hello_rep *p = (struct kvc_hello_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    if (q->min_version > KVC_PROTO_VERSION || q->max_version < KVC_PROTO_VERSION ||
        q->min_version > q->max_version)
        return -EPROTO;
    c->hello = true;
    memcpy(c->name, q->client_name, sizeof(c->name));
    c->name[sizeof(c->name) - 1] = 0;
    *p = (struct kvc_hello_rep){.version = KVC_PROTO_VERSION,
                                .features = KVC_HELLO_F_QUIET | KVC_HELLO_F_FAST_BELL,
                                .daemon_pid = (uint32_t)getpid(),
                                .peer_pid = (uint32_t)c->cred.pid,
                                .peer_uid = c->cred.uid,
                                .peer_gid = c->cred.gid,
                                .max_keys = KVC_PROTO_MAX_KEYS,
                                .max_msg = KVC_PROTO_MAX_MSG,
                                .conn_id = c->id};
    return sizeof(*p);
}

/* A namespace's policy and precision ladder from its [namespace.PATTERN] section, else the
 * defaults. */
static void server_ns_policy(struct server *sv, uint32_t id)
{
    const struct store_ns *ns = store_ns_get(sv->store, id);
    const struct config_ns *cn =
        ns && sv->cfg ? config_ns_match(&sv->cfg->ns, ns->layout.model_id, NULL) : NULL;
    if (!ns)
        return;
    if (cn && cn->policy >= 0)
        store_ns_policy_set(sv->store, id, cn->policy, STORE_POLICY_SRC_CONFIG);
    else
        store_ns_policy_set(sv->store, id, -1, STORE_POLICY_SRC_DEFAULT);
    store_ns_ladder_set(sv->store, id, cn ? cn->lossy_weight : 0.0, cn ? cn->max_error : 0.0);
}

void server_ns_policies(struct server *sv)
{
    for (uint32_t i = 1; i < sv->store->nns; i++)
        if (sv->store->ns[i])
            server_ns_policy(sv, i);
}

static int server_on_ns_open(struct server *sv, struct conn *c, const struct proto_req *r,
                             int *send_fd, bool *fd_owned)
{
    const struct kvc_ns_open_req *q = r->body;
    struct kvc_ns_open_rep *p = (struct kvc_ns_open_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    uint32_t id, acc = KVC_ACCESS_READ | KVC_ACCESS_WRITE;
    bool created, exists = false;
    int rc;
    bool named = memchr(q->layout.model_id, 0, sizeof(q->layout.model_id)) != NULL;
    /* Refused before anything logs or matches the id: a newline in it would break lines. */
    if (named && !store_model_id_ok(q->layout.model_id)) {
        log_limited(LOG_LEVEL_WARNING,
                    "server: client %u: NS_OPEN refused (model id holds a control character)",
                    c->id);
        return -EINVAL;
    }
    for (uint32_t i = 1; named && i < sv->store->nns && !exists; i++)
        exists =
            sv->store->ns[i] && strcmp(sv->store->ns[i]->layout.model_id, q->layout.model_id) == 0;
    if (sv->acl && named) {
        acc = acl_access_model(sv->acl, &c->peer, q->layout.model_id);
        if (!acc || (!exists && !(acc & KVC_ACCESS_WRITE))) {
            log_limited(LOG_LEVEL_WARNING, "server: client %u (uid %u): NS_OPEN '%s' refused (%s)",
                        c->id, (unsigned)c->cred.uid, q->layout.model_id,
                        acc ? "creating a namespace needs write access" : "not in its access list");
            return -EACCES;
        }
    }
    if (named && !exists && !c->peer.admin) {
        uint32_t mine = 0;
        for (uint32_t i = 1; i < sv->store->nns; i++)
            mine += sv->store->ns[i] && sv->ns_uid[i] == c->cred.uid;
        if (mine >= sv->lim.max_namespaces_per_uid)
            return server_refuse(c, &sv->store->total.refused_namespaces, -EDQUOT,
                                 "NS_OPEN: server.max_namespaces_per_uid reached");
    }
    /* Placed in its section's arena and bound to its lists at creation, or not created. */
    rc = sv->acl ? acl_ns_open(sv->acl, &q->layout, &id, &created)
                 : store_ns_open(sv->store, &q->layout, &id, &created);
    if (rc == -EXDEV)
        log_limited(LOG_LEVEL_ERROR, "acl: namespace '%.*s' is not in its section's arena; refused",
                    (int)sizeof(q->layout.model_id), q->layout.model_id);
    if (rc) {
        if (rc == -EINVAL) {
            const char *why;
            uint64_t bb;
            store_layout_check(&q->layout, store_host_capacity(sv->store), &bb, &why);
            log_limited(LOG_LEVEL_WARNING, "server: client %u: NS_OPEN refused (%s)", c->id,
                        why ? why : "invalid layout");
        } else if (rc == -EEXIST) {
            log_limited(LOG_LEVEL_WARNING,
                        "server: client %u: NS_OPEN '%.*s' refused (exists with another layout)",
                        c->id, (int)sizeof(q->layout.model_id), q->layout.model_id);
        }
        return rc;
    }
    if (created) {
        server_ns_policy(sv, id);
        sv->ns_uid[id] = c->cred.uid;
    }
    if (!c->ns_open && !(c->ns_open = calloc((sv->store->nns + 7) / 8, 1)))
        return -ENOMEM;
    c->ns_open[id / 8] |= (uint8_t)(1u << (id % 8));
    const struct store_ns *ns = store_ns_get(sv->store, id);
    struct tier *t = store_ns_tier(sv->store, ns);
    if (created)
        log_info("store: namespace %u '%s' created (%llu bytes per block)", id, ns->layout.model_id,
                 (unsigned long long)ns->block_bytes);
    *p = (struct kvc_ns_open_rep){.ns_id = id,
                                  .arena_id = ns->arena,
                                  .block_bytes = ns->block_bytes,
                                  .arena_bytes = tier_host_size(t),
                                  .access = acc,
                                  .created = created};
    if (!(c->arenas_sent & (1u << ns->arena))) {
        /* Readers get a read-only descriptor of their own: the kernel enforces the list. */
        int fd = acc & KVC_ACCESS_WRITE ? tier_host_fd(t) : tier_host_fd_ro(t);
        if (fd < 0)
            return fd;
        *send_fd = fd;
        *fd_owned = !(acc & KVC_ACCESS_WRITE);
    }
    return sizeof(*p);
}

/* 0 when the peer has the `need` access (KVC_ACCESS_*) to namespace ns_id, or when no such
 * namespace exists (the store answers -ENOENT for it); else -EACCES. */
static int server_ns_allowed(const struct server *sv, const struct conn *c, uint32_t ns_id,
                             uint32_t need)
{
    if (!sv->acl || !store_ns_get(sv->store, ns_id))
        return 0;
    return (acl_access(sv->acl, &c->peer, ns_id) & need) == need ? 0 : -EACCES;
}

static bool server_may_wait(struct server *sv, const struct conn *c, uint32_t ns_id, uint64_t now);
static bool server_wait_left(const struct server *sv, const struct conn *c, uint64_t now);

/* 0 when this connection opened namespace ns_id (NS_OPEN), else -ENOENT: a client names only
 * namespaces it opened, so an id that was dropped and reused never reaches the old one's
 * clients (whose layout and access differ). */
static int server_ns_opened(const struct conn *c, uint32_t ns_id)
{
    return c->ns_open && ns_id < c->sv->store->nns && (c->ns_open[ns_id / 8] >> (ns_id % 8)) & 1
               ? 0
               : -ENOENT;
}

/* Both checks a request on a namespace passes first. */
int server_ns_use(const struct server *sv, const struct conn *c, uint32_t ns_id, uint32_t need)
{
    int rc = server_ns_opened(c, ns_id);
    return rc ? rc : server_ns_allowed(sv, c, ns_id, need);
}

/* Cuts *n to the pins this connection (quota.client_pins) and its uid (quota.uid_pins) may
 * still take. 0, or -EDQUOT when there is no room at all. */
static int server_pins_room(struct server *sv, struct conn *c, uint32_t *n)
{
    uint64_t room = UINT64_MAX;
    if (sv->lim.client_pins)
        room = c->owner.pins >= sv->lim.client_pins ? 0 : sv->lim.client_pins - c->owner.pins;
    if (!c->peer.admin) {
        uint64_t ur = c->u->pins >= sv->lim.uid_pins ? 0 : sv->lim.uid_pins - c->u->pins;
        room = ur < room ? ur : room;
    }
    if (room == 0)
        return server_refuse(c, &sv->store->total.refused_pins, -EDQUOT,
                             "lookup refused: quota.client_pins or quota.uid_pins reached");
    if (room < *n) {
        *n = (uint32_t)room;
        server_refuse(c, &sv->store->total.refused_pins, -EDQUOT,
                      "lookup cut short: quota.client_pins or quota.uid_pins reached");
    }
    return 0;
}

/* A new lease or reservation: its uid's limit (the connection's is the store's, -EMFILE). */
static int server_handles_room(struct server *sv, struct conn *c)
{
    if (!c->peer.admin && c->u->handles >= sv->lim.uid_leases)
        return server_refuse(c, &sv->store->total.refused_leases, -EMFILE,
                             "quota.uid_leases reached");
    return 0;
}

/* A store answer of -EMFILE is server.max_leases: counted and logged like the uid's. */
static int server_store_rc(struct server *sv, struct conn *c, int rc)
{
    if (rc == -EMFILE)
        return server_refuse(c, &sv->store->total.refused_leases, rc, "server.max_leases reached");
    return rc;
}

static int server_on_lookup(struct server *sv, struct conn *c, const struct proto_req *r,
                            uint64_t now, bool may_wait)
{
    const struct kvc_lookup_req *q = r->body;
    struct kvc_lookup_rep *p = (struct kvc_lookup_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    uint64_t lease;
    uint32_t n = r->ntail;
    int arc = server_ns_use(sv, c, q->ns_id, KVC_ACCESS_READ);
    if (arc)
        return arc;
    arc = server_handles_room(sv, c);
    if (arc == 0)
        arc = server_pins_room(sv, c, &n);
    if (arc)
        return arc;
    if (sv->acl && store_ns_get(sv->store, q->ns_id)) {
        uint32_t want = n;
        int qrc = acl_quota_lookup(sv->acl, &c->owner, q->ns_id, &n);
        if (qrc)
            return qrc;
        if (n < want)
            sv->store->total.refused_quota++;
    }
    /* Cut short because memory had no room for its reads from disk while blocks are being
     * written out: it waits for that room like a put (the reads it started go on). Cut short
     * at the pool's bound of moves in flight (a client that cannot read the pool): it waits
     * for them to land, each landing asking again, so it is answered the whole prefix. Both
     * within disk.put_wait, one waiting request per connection; the engine then pins and
     * counts nothing: a lookup's hits are counted once, when it is answered. A lookup that
     * asked not to wait (READY_ONLY, NOWAIT) never does. */
    bool wait_ok = may_wait && !(q->flags & (KVC_LOOKUP_F_READY_ONLY | KVC_LOOKUP_F_NOWAIT));
    bool defer = wait_ok && server_may_wait(sv, c, q->ns_id, now);
    bool defer_moves = wait_ok && !c->owner.gpu && sv->store->gpu && server_wait_left(sv, c, now);
    c->owner.lookup_short = false;
    uint32_t first = 0;
    int hits = engine_lookup_kind(sv->store, &c->owner, q->ns_id, r->tail, n, q->base,
                                  q->flags | (defer ? ENGINE_LOOKUP_F_DEFER : 0) |
                                      (defer_moves ? ENGINE_LOOKUP_F_DEFER_MOVES : 0),
                                  now, &lease, &first, (struct kvc_wire_loc *)(p + 1));
    if (hits == -EAGAIN && (defer || defer_moves))
        return SERVER_DEFERRED;
    if (hits < 0)
        return server_store_rc(sv, c, hits);
    *p = (struct kvc_lookup_rep){.nhit = (uint32_t)hits, .first = first, .lease_id = lease};
    return (int)(sizeof(*p) + (size_t)hits * sizeof(struct kvc_wire_loc));
}

static int server_on_hint(struct server *sv, struct conn *c, const struct proto_req *r,
                          uint64_t now)
{
    const struct kvc_hint_req *q = r->body;
    struct kvc_hint_rep *p = (struct kvc_hint_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    int arc = server_ns_use(sv, c, q->ns_id, KVC_ACCESS_READ);
    if (arc)
        return arc;
    int n = store_hint(sv->store, q->ns_id, q->kind, r->tail, r->ntail, now);
    if (n < 0)
        return n;
    *p = (struct kvc_hint_rep){.applied = (uint32_t)n};
    return sizeof(*p);
}

static int server_on_hint_heads(struct server *sv, struct conn *c, const struct proto_req *r,
                                uint64_t now)
{
    const struct kvc_hint_heads_req *q = r->body;
    struct kvc_hint_rep *p = (struct kvc_hint_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    int arc = server_ns_use(sv, c, q->ns_id, KVC_ACCESS_READ);
    if (arc)
        return arc;
    int n = store_hint_heads(sv->store, q->ns_id, q->kind, r->tail, r->tail2, r->ntail, q->layers,
                             q->heads, now);
    if (n < 0)
        return n;
    *p = (struct kvc_hint_rep){.applied = (uint32_t)n};
    return sizeof(*p);
}

static int server_on_lookup_budget(struct server *sv, struct conn *c, const struct proto_req *r,
                                   uint64_t now)
{
    const struct kvc_lookup_budget_req *q = r->body;
    struct kvc_lookup_budget_rep *p =
        (struct kvc_lookup_budget_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    struct kvc_wire_sel *sel = (struct kvc_wire_sel *)(p + 1);
    uint32_t n = r->ntail, nprefix, pos[KVC_PROTO_MAX_KEYS];
    struct kvc_wire_loc locs[KVC_PROTO_MAX_KEYS];
    uint64_t lease;
    uint32_t most = q->budget < n ? q->budget : n; /* pins it can take */
    uint32_t sinks = q->sinks, lh = 0;
    uint8_t prof[KVC_PROTO_MAX_HINT_HEADS];
    int arc = server_ns_use(sv, c, q->ns_id, KVC_ACCESS_READ);
    if (arc)
        return arc;
    if (q->flags & KVC_BUDGET_F_HEADS) {
        /* Per-head budgets: the selection is what a full head keeps, with the sinks (at least
         * the first block) and the window the sink-only and local heads keep among it. */
        const struct store_ns *ns = store_ns_get(sv->store, q->ns_id);
        uint32_t full = 0;
        arc =
            store_head_budget(sv->store, q->ns_id, q->budget, q->sinks, q->recent, n, prof, &full);
        if (arc)
            return server_store_rc(sv, c, arc);
        lh = ns->layout.layers * ns->layout.kv_heads;
        most = full < n ? full : n;
        sinks = sinks ? sinks : 1;
    }
    arc = server_handles_room(sv, c);
    if (arc == 0)
        arc = server_pins_room(sv, c, &most);
    if (arc)
        return arc;
    if (sv->acl && store_ns_get(sv->store, q->ns_id)) {
        int qrc = acl_quota_lookup(sv->acl, &c->owner, q->ns_id, &most);
        if (qrc)
            return qrc;
    }
    int nsel =
        store_lookup_budget(sv->store, &c->owner, q->ns_id, r->tail, n, most,
                            q->policy == KVC_POLICY_NS ? -1 : (int)q->policy, sinks, q->recent,
                            r->tail2, r->ntail2, now, &lease, &nprefix, pos, locs);
    if (nsel < 0)
        return server_store_rc(sv, c, nsel);
    for (int i = 0; i < nsel; i++)
        sel[i] = (struct kvc_wire_sel){.pos = pos[i], .loc = locs[i]};
    *p = (struct kvc_lookup_budget_rep){
        .nsel = (uint32_t)nsel, .nprefix = nprefix, .lease_id = lease};
    memcpy(sel + nsel, prof, lh);
    return (int)(sizeof(*p) + (size_t)nsel * sizeof(*sel) + lh);
}

/* Fills a WAIT reply for lease_id; SERVER_DEFERRED if reads are in flight and wait is set. */
int server_wait_fill(struct server *sv, struct conn *c, uint64_t lease_id, bool wait)
{
    struct kvc_wait_rep *p = (struct kvc_wait_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    uint32_t nhit, nready, pending;
    int rc = engine_disk_lease_state(sv->store, &c->owner, lease_id, &nhit, &nready, &pending);
    if (rc)
        return rc;
    if (pending && wait)
        return SERVER_DEFERRED;
    *p = (struct kvc_wait_rep){.nhit = nhit, .nready = nready, .pending = pending};
    return sizeof(*p);
}

static int server_on_wait(struct server *sv, struct conn *c, const struct proto_req *r,
                          uint64_t now)
{
    const struct kvc_wait_req *q = r->body;
    struct server_wait *w;
    int rc = server_wait_fill(sv, c, q->lease_id, q->timeout_ms != 0);
    if (rc != SERVER_DEFERRED)
        return rc;
    if (c->nwaits >= sv->lim.max_waits)
        return server_refuse(c, &sv->store->total.refused_waits, -EMFILE,
                             "WAIT refused: server.max_waits pending");
    for (w = sv->waits; w; w = w->next)
        if (w->c == c && w->lease_id == q->lease_id)
            return server_refuse(c, &sv->store->total.refused_waits, -EBUSY,
                                 "WAIT refused: one is pending on that lease");
    w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    *w = (struct server_wait){.c = c,
                              .req_id = r->hdr->req_id,
                              .lease_id = q->lease_id,
                              .deadline_ms = now + q->timeout_ms,
                              .next = sv->waits};
    if (!sv->waits || w->deadline_ms < sv->waits_deadline)
        sv->waits_deadline = w->deadline_ms;
    sv->waits = w;
    c->nwaits++;
    return SERVER_DEFERRED;
}

/* Adds us of copy time that c reports for namespace ns, as far as c's credit goes (the
 * rest is counted in load_refused_us): a client cannot drive the daemon's load_us past what
 * its connections could have spent. */
void server_load_add(struct server *sv, struct conn *c, struct store_ns *ns, uint64_t us,
                     uint64_t now)
{
    if (now > c->load_ms) {
        uint64_t add = (now - c->load_ms) * 1000 * SERVER_LOAD_PARALLEL;
        c->load_credit_us = add >= SERVER_LOAD_BANK_US - c->load_credit_us
                                ? SERVER_LOAD_BANK_US
                                : c->load_credit_us + add;
        c->load_ms = now;
    }
    uint64_t ok = us < c->load_credit_us ? us : c->load_credit_us;
    c->load_credit_us -= ok;
    ns->stats.load_us += ok;
    sv->store->total.load_us += ok;
    if (us > ok)
        sv->store->total.load_refused_us += us - ok;
}

static int server_on_release(struct server *sv, struct conn *c, const struct proto_req *r,
                             uint64_t now)
{
    struct kvc_release_rep *p = (struct kvc_release_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    const struct kvc_release_req *q = r->body;
    const uint64_t *ids = r->tail;
    uint32_t done = 0;
    int rc = 0;
    struct store_ns *ns = store_ns_get(sv->store, store_lease_ns(&c->owner, ids[0]));
    for (uint32_t i = 0; i < r->ntail; i++) {
        if (engine_release(sv->store, &c->owner, ids[i], now) == 0)
            done++;
        else
            rc = -ENOENT;
    }
    if (ns && done && q->load_us) /* the copy time of leases it held */
        server_load_add(sv, c, ns, q->load_us, loop_now_ms(sv->loop));
    if (rc)
        return rc; /* the known ones were released; the reply says some were not */
    *p = (struct kvc_release_rep){.released = done};
    return sizeof(*p);
}

/* Whether a RESERVE cut short should wait: a key found no room (before any other reason),
 * the disk tier is writing (or can write) blocks of that arena out, and disk.put_wait has
 * not run out for it. */
static bool server_reserve_may_wait(struct server *sv, const struct conn *c, uint32_t ns_id,
                                    uint32_t want, uint64_t now)
{
    const struct store_ns *ns = store_ns_get(sv->store, ns_id);
    uint32_t i = 0;
    if (!ns || !sv->cfg || !sv->cfg->disk_put_wait)
        return false;
    while (i < want && (sv->st[i] == KVC_WIRE_SLOT_PRESENT || sv->st[i] == KVC_WIRE_SLOT_RESERVED))
        i++;
    if (i == want || sv->st[i] != KVC_WIRE_SLOT_NOSPACE)
        return false;
    return server_may_wait(sv, c, ns_id, now);
}

/* Whether a request of c may wait (again): disk.put_wait is set and has not run out for it. */
static bool server_wait_left(const struct server *sv, const struct conn *c, uint64_t now)
{
    if (!sv->cfg || !sv->cfg->disk_put_wait)
        return false;
    return !(sv->retrying && sv->retrying->c == c && now >= sv->retrying->deadline_ms);
}

/* Whether a request of c that found no room in ns_id's arena may wait for it: disk.put_wait
 * has not run out for it, and the disk tier is making room there. */
static bool server_may_wait(struct server *sv, const struct conn *c, uint32_t ns_id, uint64_t now)
{
    const struct store_ns *ns = store_ns_get(sv->store, ns_id);
    return ns && server_wait_left(sv, c, now) && engine_room_coming(sv->store, ns->arena);
}

/* The end of reservation id on this connection: forgets its deadline. For an id the store no
 * longer knows (rc -ENOENT) that the daemon aborted when it expired: -ETIMEDOUT. */
static int server_resv_end(struct conn *c, uint64_t id, int rc)
{
    for (uint32_t i = 0; i < c->nresv; i++)
        if (c->resv[i].id == id) {
            c->resv[i] = c->resv[--c->nresv];
            break;
        }
    if (rc == -ENOENT)
        for (uint32_t i = 0; i < SERVER_EXPIRED_KEEP && i < c->nexpired; i++)
            if (c->expired[i] == id) {
                c->expired[i] = 0;
                return -ETIMEDOUT;
            }
    return rc;
}

/* Cuts *n to the slots of ns's block size the peer's uid may still reserve in ns's arena
 * (quota.uid_reserved_share of it). 0, or -EDQUOT when none. */
static int server_reserve_room(struct server *sv, struct conn *c, const struct store_ns *ns,
                               uint32_t *n)
{
    struct store *s = sv->store;
    uint64_t cap, used = 0, room;
    if (c->peer.admin)
        return 0;
    cap = tier_host_size(store_ns_tier(s, ns)) * sv->lim.uid_reserved_share / 100;
    for (const struct conn *x = sv->conns; x; x = x->next) {
        if (x->u != c->u)
            continue;
        for (uint32_t i = 0; i < x->owner.nhandles; i++) {
            const struct store_handle *h = x->owner.handles[i];
            const struct store_ns *hn;
            if (!h || h->kind != STORE_HANDLE_RESV || !(hn = store_ns_get(s, h->ns)) ||
                hn->arena != ns->arena)
                continue;
            used += (uint64_t)h->n * hn->block_bytes;
        }
    }
    room = used >= cap ? 0 : (cap - used) / ns->block_bytes;
    if (room == 0)
        return server_refuse(c, &s->total.refused_reserve_share, -EDQUOT,
                             "RESERVE refused: quota.uid_reserved_share of the arena reached");
    if (room < *n) {
        *n = (uint32_t)room;
        server_refuse(c, &s->total.refused_reserve_share, -EDQUOT,
                      "RESERVE cut short: quota.uid_reserved_share of the arena reached");
    }
    return 0;
}

/* The counters a RESERVE moves. A try the server defers (its slots aborted, the request run
 * again later) leaves them as they were, so each key is counted once, with the answer its
 * client gets, however many times the request waited. */
#define SERVER_RESV_STATS(X)                                                                       \
    X(reserves)                                                                                    \
    X(reserve_keys)                                                                                \
    X(reserved_blocks)                                                                             \
    X(dedup_blocks)                                                                                \
    X(busy_blocks) X(nospace_blocks) X(skipped_parent_blocks) X(skipped_parent_busy_blocks)        \
        X(skipped_busy_blocks) X(skipped_nospace_blocks) X(skipped_failed_blocks)                  \
            X(aborted_blocks)

struct server_resv_stats {
#define SERVER_RESV_FIELD(f) uint64_t f;
    SERVER_RESV_STATS(SERVER_RESV_FIELD)
#undef SERVER_RESV_FIELD
};

static void server_resv_stats_save(struct server_resv_stats *to, const struct stats *from)
{
#define SERVER_RESV_SAVE(f) to->f = from->f;
    SERVER_RESV_STATS(SERVER_RESV_SAVE)
#undef SERVER_RESV_SAVE
}

static void server_resv_stats_restore(struct stats *to, const struct server_resv_stats *from)
{
#define SERVER_RESV_RESTORE(f) to->f = from->f;
    SERVER_RESV_STATS(SERVER_RESV_RESTORE)
#undef SERVER_RESV_RESTORE
}

/* Whether a new RESERVE of c into ns's arena goes behind an earlier one of its uid that waits
 * there for room coming: it joins the wait list without taking room, and runs when the
 * waiting ones run (a landing serves a uid's waiting requests in arrival order:
 * server_retry_held). Room that frees between landings (a reservation given back, a block a
 * ladder step took out) so goes to the put that has waited longest, not to the newest of
 * its tenant's clients: with several clients each newer put took it, and an older put's
 * blocks were committed (and seen by the others' lookups) only after the newer ones. Only
 * its own uid's requests: another tenant's never wait behind them. Not a connection that
 * has one waiting already (it may not wait twice: it runs now). Host slots only: a
 * reservation in the GPU pool (KVC_RESERVE_F_GPU from an attached client) takes other room,
 * and neither waits behind the other. */
static bool server_reserve_behind(struct server *sv, const struct conn *c,
                                  const struct store_ns *ns, uint64_t now)
{
    bool behind = false;
    if (!ns || !c->u || c->owner.gpu || (sv->retrying && sv->retrying->c == c) ||
        !server_wait_left(sv, c, now))
        return false;
    for (const struct server_pending *p = sv->pending; p; p = p->next) {
        const struct kvc_msg_hdr *h = (const struct kvc_msg_hdr *)p->msg;
        const struct kvc_reserve_req *pq = (const struct kvc_reserve_req *)(h + 1);
        const struct store_ns *pn;
        if (p->c == c)
            return false;
        if (behind || !p->c || p->c->u != c->u || h->opcode != KVC_OP_RESERVE || p->writing ||
            ((pq->flags & KVC_RESERVE_F_GPU) && p->c->gpu_mapped))
            continue;
        pn = store_ns_get(sv->store, pq->ns_id);
        behind = pn && pn->arena == ns->arena;
    }
    return behind && engine_room_coming(sv->store, ns->arena);
}

/* Whether a RESERVE of c waits for another client of its uid to commit a key of the chain: the
 * first key not committed is a slot that client's reservation holds (store_reserve would
 * answer BUSY there and SKIPPED for the rest). Answered now, the chain's tail past that key
 * is never stored, though c has the bytes: with several clients starting on one prefix (a
 * shared system prompt, the first requests after a start) every one but the writer lost its
 * own continuation so, and got through its requests while the writer wrote, so that more
 * requests than clients overlapped one put. It waits (holding nothing, as a RESERVE that
 * waits for room) until that client commits or aborts (server_retry_writing), then runs again
 * and finds the key PRESENT (or free to reserve). Only a writer of its own uid: another
 * tenant's reservation never holds a put back, and a client's own (a chained reservation) is
 * answered BUSY as before. Bounded by disk.put_wait, after which it is answered as before.
 * Asked only once store_reserve answered BUSY, so a RESERVE that finds no key being written
 * pays nothing for it. */
static bool server_reserve_writing(struct server *sv, const struct conn *c,
                                   const struct kvc_reserve_req *q, const struct proto_req *r,
                                   uint32_t want, uint64_t now)
{
    uint32_t idx;
    if (!c->u || !server_wait_left(sv, c, now))
        return false;
    idx = store_reserve_writing(sv->store, q->ns_id, r->tail, want);
    if (idx == INDEX_NONE)
        return false;
    for (struct conn *w = sv->conns; w; w = w->next)
        if (w != c && w->u == c->u && store_resv_holds(sv->store, &w->owner, idx)) {
            /* what server_retry_writing checks before running it again */
            sv->defer_writing_idx = idx;
            sv->defer_writing_ns = q->ns_id;
            return true;
        }
    return false;
}

static int server_on_reserve(struct server *sv, struct conn *c, const struct proto_req *r,
                             uint64_t now, bool may_wait)
{
    const struct kvc_reserve_req *q = r->body;
    struct kvc_reserve_rep *p = (struct kvc_reserve_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    struct kvc_wire_slot_rep *slots = (struct kvc_wire_slot_rep *)(p + 1);
    uint64_t resv;
    uint32_t want = r->ntail;
    const struct store_ns *ns = store_ns_get(sv->store, q->ns_id);
    int arc = server_ns_use(sv, c, q->ns_id, KVC_ACCESS_WRITE);
    if (arc == 0)
        arc = server_handles_room(sv, c);
    if (arc == 0 && ns)
        arc = server_reserve_room(sv, c, ns, &want);
    if (arc)
        return arc;
    if (may_wait && server_reserve_behind(sv, c, ns, now)) {
        sv->store->total.put_waits_queued++;
        return SERVER_DEFERRED;
    }
    if (sv->acl && ns) {
        uint32_t asked = want;
        int qrc = acl_quota_reserve(sv->acl, &c->owner, q->ns_id, &want, now);
        if (qrc)
            return qrc;
        if (want < asked)
            sv->store->total.refused_quota++;
    }
    if (c->nresv == c->capresv) {
        uint32_t ncap = c->capresv ? c->capresv * 2 : 8;
        struct server_resv *nr = realloc(c->resv, ncap * sizeof(*nr));
        if (!nr)
            return -ENOMEM;
        c->resv = nr;
        c->capresv = ncap;
    }
    /* Room made here is made while the client waits: counted, so that a trim that falls
     * behind the puts (server_trim_due, the tick) shows. */
    uint64_t ev0 = sv->store->total.evicted_blocks + sv->store->total.demoted_clean;
    struct server_resv_stats tot0, ns0 = {0};
    server_resv_stats_save(&tot0, &sv->store->total);
    if (ns)
        server_resv_stats_save(&ns0, &ns->stats);
    int n = store_reserve(sv->store, &c->owner, q->ns_id, &q->parent, r->tail, want, now, &resv,
                          sv->st, sv->locs);
    uint64_t ev = sv->store->total.evicted_blocks + sv->store->total.demoted_clean - ev0;
    if (ev && ns) {
        sv->store->total.reserve_evictions += ev;
        store_ns_get(sv->store, q->ns_id)->stats.reserve_evictions += ev;
    }
    if (n < 0)
        return server_store_rc(sv, c, n);
    if (may_wait && server_reserve_may_wait(sv, c, q->ns_id, want, now)) {
        /* Slots it got are given back: the whole chain waits, runs again, and gets them in
         * one piece (a chain cut at NOSPACE loses its tail for good). */
        if (resv)
            store_abort(sv->store, &c->owner, resv);
        server_resv_stats_restore(&sv->store->total, &tot0);
        if (ns)
            server_resv_stats_restore(&store_ns_get(sv->store, q->ns_id)->stats, &ns0);
        return SERVER_DEFERRED;
    }
    if (may_wait && memchr(sv->st, KVC_WIRE_SLOT_BUSY, want) &&
        server_reserve_writing(sv, c, q, r, want, now)) {
        /* What it reserved before the BUSY key goes back (in a chain nothing: the writer's
         * reservation holds every key up to it), and the request runs again. */
        if (resv)
            store_abort(sv->store, &c->owner, resv);
        server_resv_stats_restore(&sv->store->total, &tot0);
        if (ns)
            server_resv_stats_restore(&store_ns_get(sv->store, q->ns_id)->stats, &ns0);
        if (!(sv->retrying && sv->retrying->c == c))
            sv->store->total.put_waits_writing++; /* once a request, however often it waits */
        sv->defer_writing = true;
        return SERVER_DEFERRED;
    }
    if (sv->retrying && sv->retrying->c == c && (uint32_t)n < want &&
        memchr(sv->st, KVC_WIRE_SLOT_NOSPACE, want)) /* not a key found PRESENT after the wait */
        sv->store->total.put_wait_timeouts++;
    if (resv)
        c->resv[c->nresv++] =
            (struct server_resv){.id = resv, .deadline_ms = now + sv->lim.reservation_timeout_ms};
    for (uint32_t i = want; i < r->ntail; i++)
        sv->st[i] = KVC_WIRE_SLOT_NOSPACE; /* cut by a quota */
    if (want < r->ntail && ns) {
        /* Counted as keys of the request too, so that every key asked for has its verdict. */
        struct store_ns *sn = store_ns_get(sv->store, q->ns_id);
        sn->stats.reserve_keys += r->ntail - want;
        sn->stats.quota_cut_blocks += r->ntail - want;
        sv->store->total.reserve_keys += r->ntail - want;
        sv->store->total.quota_cut_blocks += r->ntail - want;
    }
    *p = (struct kvc_reserve_rep){.resv_id = resv, .nkeys = r->ntail, .nreserved = (uint32_t)n};
    for (uint32_t i = 0; i < r->ntail; i++) {
        memset(&slots[i], 0, sizeof(slots[i]));
        slots[i].status = sv->st[i];
        if (sv->st[i] == KVC_WIRE_SLOT_RESERVED)
            slots[i].loc = sv->locs[i];
    }
    return (int)(sizeof(*p) + (size_t)r->ntail * sizeof(*slots));
}

static int server_on_commit(struct server *sv, struct conn *c, const struct proto_req *r,
                            uint64_t now)
{
    const struct kvc_commit_req *q = r->body;
    struct kvc_commit_rep *p = (struct kvc_commit_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    uint32_t dropped = 0;
    int n = store_commit(sv->store, &c->owner, q->resv_id, q->ncommit, now, &dropped);
    /* Its parent is a slot of another of the client's reservations, not committed yet: the
     * reservation stays, deadline and all, for a COMMIT once that one is; a quiet COMMIT's
     * sender does not wait for the answer, so nobody would send that one: it is aborted. */
    if (n == -EAGAIN && !(q->flags & KVC_COMMIT_F_QUIET))
        return n;
    if (n == -EAGAIN)
        store_abort(sv->store, &c->owner, q->resv_id);
    n = server_resv_end(c, q->resv_id, n);
    if (n < 0)
        return n;
    *p = (struct kvc_commit_rep){.committed = (uint32_t)n, .dropped = dropped};
    return sizeof(*p);
}

static int server_stat_put(struct kvc_wire_stat *out, uint32_t *n, const char *name, uint64_t v)
{
    memset(&out[*n], 0, sizeof(out[*n]));
    snprintf(out[*n].name, sizeof(out[*n].name), "%s", name);
    out[*n].value = v;
    (*n)++;
    return 0;
}

struct server_stat_ctx {
    struct kvc_wire_stat *out;
    uint32_t *n;
};

static void server_stat_cb(void *arg, const char *name, uint64_t v)
{
    struct server_stat_ctx *x = arg;
    server_stat_put(x->out, x->n, name, v);
}

static int server_on_stats(struct server *sv, struct conn *c, const struct proto_req *r,
                           uint64_t now)
{
    const struct kvc_stats_req *q = r->body;
    struct kvc_stats_rep *p = (struct kvc_stats_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    struct kvc_wire_stat *out = (struct kvc_wire_stat *)(p + 1);
    struct store *s = sv->store;
    const struct stats *st = &s->total;
    uint32_t n = 0;
    uint64_t blocks = 0, bytes = 0, nns = 0;
    if (q->scope) {
        const struct store_ns *ns = store_ns_get(s, q->scope);
        if (!ns)
            return -ENOENT;
        if (!(acl_access(sv->acl, &c->peer, q->scope) & KVC_ACCESS_READ))
            return -EACCES;
        st = &ns->stats;
        blocks = ns->blocks;
        bytes = ns->bytes;
    } else {
        for (uint32_t i = 1; i < s->nns; i++)
            if (s->ns[i]) {
                blocks += s->ns[i]->blocks;
                bytes += s->ns[i]->bytes;
                nns++;
            }
    }
#define SERVER_STAT_COUNTER(name, help) server_stat_put(out, &n, #name, st->name);
    STATS_COUNTERS(SERVER_STAT_COUNTER)
#undef SERVER_STAT_COUNTER
    server_stat_put(out, &n, "blocks_now", blocks);
    server_stat_put(out, &n, "bytes_now", bytes);
    /* What the hits saved: their tokens at the engines' prefill rate, beside the time the
     * clients reported copying them (load_us). */
    server_stat_put(
        out, &n, "recompute_saved_est_us",
        (uint64_t)((double)st->hit_tokens * 1e6 /
                   (double)(s->p.recompute_tokens_per_s ? s->p.recompute_tokens_per_s : 1)));
    if (!q->scope) {
        server_stat_put(out, &n, "pins_now", s->pins_now);
        server_stat_put(out, &n, "reserved_now", s->reserved_now);
        server_stat_put(out, &n, "reserved_bytes_now", s->reserved_bytes_now);
        server_stat_put(out, &n, "clients_now", sv->nclients);
        server_stat_put(out, &n, "namespaces_now", nns);
        server_stat_put(out, &n, "host_capacity", store_host_capacity(s));
        server_stat_put(out, &n, "host_used", store_host_used(s));
        uint64_t faulted, arenas;
        store_host_faulted(s, &faulted, &arenas);
        server_stat_put(out, &n, "host_faulted", faulted);
        server_stat_put(out, &n, "host_arenas_bytes", arenas);
        server_stat_put(out, &n, "host_collapsed", store_host_collapsed(s));
        server_stat_put(out, &n, "gpu_capacity", store_gpu_capacity(s));
        server_stat_put(out, &n, "gpu_used", store_gpu_used(s));
        server_stat_put(out, &n, "uptime_s", now / 1000);
        server_stat_put(out, &n, "log_suppressed", log_suppressed());
        uint64_t fpub, ffull;
        store_fast_stats(s, &fpub, &ffull);
        server_stat_put(out, &n, "fast_index_blocks", fpub);
        server_stat_put(out, &n, "fast_index_full", ffull);
        engine_disk_stats(s, server_stat_cb, &(struct server_stat_ctx){out, &n});
        engine_remote_stats(s, server_stat_cb, &(struct server_stat_ctx){out, &n});
        engine_gpu_stats(s, server_stat_cb, &(struct server_stat_ctx){out, &n});
    }
    *p = (struct kvc_stats_rep){.nstats = n};
    return (int)(sizeof(*p) + n * sizeof(*out));
}

static int server_on_ns_list(struct server *sv, struct conn *c, const struct proto_req *r)
{
    const struct kvc_ns_list_req *q = r->body;
    struct kvc_ns_list_rep *p = (struct kvc_ns_list_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    struct kvc_wire_ns *out = (struct kvc_wire_ns *)(p + 1);
    const uint32_t max =
        (KVC_PROTO_MAX_MSG - sizeof(struct kvc_msg_hdr) - sizeof(*p)) / sizeof(*out);
    struct store *s = sv->store;
    uint32_t n = 0, i = q->cursor ? q->cursor : 1;
    for (; i < s->nns && n < max; i++) {
        const struct store_ns *ns = s->ns[i];
        if (!ns || !acl_access(sv->acl, &c->peer, i))
            continue;
        out[n] = (struct kvc_wire_ns){.ns_id = ns->id,
                                      .arena_id = ns->arena,
                                      .layout = ns->layout,
                                      .block_bytes = ns->block_bytes,
                                      .blocks = ns->blocks,
                                      .bytes = ns->bytes};
        n++;
    }
    *p = (struct kvc_ns_list_rep){.nns = n, .next_cursor = i < s->nns ? i : 0};
    return (int)(sizeof(*p) + n * sizeof(*out));
}

/* Index entries one BLOCK_LIST walks at most (64 KiB of them, about what a LOOKUP of 8 keys
 * costs): a page ends there with the blocks it found, none maybe, and the cursor to go on
 * from. Walking until `max` blocks of the namespace were found walked the whole index for a
 * namespace with few blocks, every tenant's entries (8 connections listing an empty
 * namespace over 256 K entries took another tenant's LOOKUP p99 from 0.7 to 17.5 ms). */
#define SERVER_BLOCK_LIST_WALK 1024u

static int server_on_block_list(struct server *sv, struct conn *c, const struct proto_req *r)
{
    const struct kvc_block_list_req *q = r->body;
    struct kvc_block_list_rep *p = (struct kvc_block_list_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    struct kvc_wire_block *out = (struct kvc_wire_block *)(p + 1);
    const uint32_t fit =
        (KVC_PROTO_MAX_MSG - sizeof(struct kvc_msg_hdr) - sizeof(*p)) / sizeof(*out);
    uint32_t max = q->max < fit ? q->max : fit;
    const struct index *ix = &sv->store->ix;
    uint64_t i = q->cursor, end = q->cursor + SERVER_BLOCK_LIST_WALK;
    uint32_t n = 0;
    if (!store_ns_get(sv->store, q->ns_id))
        return -ENOENT;
    if (!(acl_access(sv->acl, &c->peer, q->ns_id) & KVC_ACCESS_READ))
        return -EACCES;
    if (end > ix->nblocks || end < q->cursor)
        end = ix->nblocks;
    for (; i < end && n < max; i++) {
        const struct block *b = &ix->blocks[i];
        if (b->state != BLOCK_STATE_COMMITTED || b->ns != q->ns_id)
            continue;
        out[n++] =
            (struct kvc_wire_block){.key = b->key,
                                    .parent = index_parent_key(ix, b),
                                    .bytes = b->len,
                                    .last_access_ms = b->last_access,
                                    .hits = b->hits,
                                    .pins = b->pins,
                                    .children = b->children,
                                    .depth = b->depth,
                                    .tier = b->tier,
                                    .format = b->format,
                                    .state = 1,
                                    .flags = (b->flags & BLOCK_F_DISK) ? KVC_WIRE_BLOCK_F_DISK : 0};
    }
    *p = (struct kvc_block_list_rep){.nblocks = n, .next_cursor = i < ix->nblocks ? i : 0};
    return (int)(sizeof(*p) + n * sizeof(*out));
}

/* The GPU pool's handle (first call), or the client's word that it mapped it. */
static int server_on_gpu_attach(struct server *sv, struct conn *c, const struct proto_req *r,
                                int *send_fd)
{
    const struct kvc_gpu_attach_req *q = r->body;
    struct kvc_gpu_attach_rep *p = (struct kvc_gpu_attach_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    const struct kern_dev_pool *pool;
    if (!sv->store->gpu)
        return -ENODEV;
    /* The pool holds blocks of the shared arena only (namespaces without access lists):
     * its handle goes to a client that already holds that arena read-write. */
    if (!c->peer.admin && !(c->arenas_rw & 1u)) {
        log_limited(LOG_LEVEL_WARNING,
                    "server: client %u (uid %u): GPU_ATTACH refused (it holds no read-write "
                    "descriptor of the shared arena: open a namespace without access lists "
                    "first)",
                    c->id, (unsigned)c->cred.uid);
        return -EACCES;
    }
    if ((q->flags & KVC_GPU_ATTACH_F_MAPPED) && !c->gpu_handle)
        return -EINVAL; /* mapped what? */
    pool = tier_gpu_pool(sv->store->gpu);
    memset(p, 0, sizeof(*p));
    p->arena_id = STORE_ARENA_GPU;
    p->handle = pool->handle;
    p->pool_bytes = pool->size; /* the whole allocation: an importer maps all of it */
    memcpy(p->uuid, pool->uuid, sizeof(p->uuid));
    memcpy(p->legacy, pool->legacy, sizeof(p->legacy));
    if (q->flags & KVC_GPU_ATTACH_F_MAPPED)
        c->gpu_mapped = true;
    else if (pool->handle == KVC_GPU_HANDLE_FD)
        *send_fd = pool->fd;
    c->gpu_handle = true;
    return sizeof(*p);
}

/* ---- dispatch -------------------------------------------------------------------------- */

/* Errors by kind, in the totals (the per-client delta picks them up too). */
static void server_count(struct server *sv, int rc)
{
    struct stats *t = &sv->store->total;
    t->requests++;
    switch (rc) {
    case -EACCES:
        t->refused_access++;
        break;
    case -EPERM:
        t->refused_admin++;
        break;
    case -EDQUOT:
        t->refused_quota++;
        break;
    case -ENOSPC:
        t->errors_nospace++;
        break;
    case -EPROTO:
    case -EBADMSG:
    case -EOPNOTSUPP:
    case -EINVAL:
    case -E2BIG:
        t->errors_proto++;
        break;
    default:
        if (rc < 0)
            t->errors_other++;
        break;
    }
}

/* Adds what one request changed in the totals to the client's own counters. */
void server_stats_delta(struct stats *st, const struct stats *before, const struct stats *after)
{
#define SERVER_STAT_DELTA(name, help) st->name += after->name - before->name;
    STATS_COUNTERS(SERVER_STAT_DELTA)
#undef SERVER_STAT_DELTA
}

/* Whether a RESERVE waits for another client's commit. */
static bool server_pending_writing(const struct server *sv)
{
    for (const struct server_pending *p = sv->pending; p; p = p->next)
        if (p->writing)
            return true;
    return false;
}

static void server_pending_push(struct server *sv, struct server_pending *p)
{
    struct server_pending **w = &sv->pending;
    while (*w)
        w = &(*w)->next;
    p->next = NULL;
    *w = p;
}

/* Keeps the RESERVE in sv->rx (n bytes) of c to run again when the disk made room. */
static int server_pending_add(struct server *sv, struct conn *c, size_t n, uint64_t now)
{
    struct server_pending *p;
    bool writing = sv->defer_writing; /* what it waits for: a commit, or room */
    sv->defer_writing = false;
    if (sv->retrying && sv->retrying->c == c) {
        sv->retry_again = true; /* waits on, with its first deadline */
        sv->retrying->writing = writing;
        sv->retrying->writing_idx = sv->defer_writing_idx;
        sv->retrying->writing_ns = sv->defer_writing_ns;
        return 0;
    }
    /* One waiting request per connection (a client that pipelines more is answered at
     * once): what a client can make the daemon hold stays one message. */
    for (const struct server_pending *x = sv->pending; x; x = x->next)
        if (x->c == c)
            return -EBUSY;
    p = malloc(sizeof(*p) + n);
    if (!p)
        return -ENOMEM;
    p->c = c;
    p->deadline_ms = now + sv->cfg->disk_put_wait;
    p->len = n;
    p->writing = writing;
    p->writing_idx = sv->defer_writing_idx;
    p->writing_ns = sv->defer_writing_ns;
    memcpy(p->msg, sv->rx, n);
    server_pending_push(sv, p);
    sv->store->total.put_waits++;
    return 0;
}

void server_retry(struct server *sv, uint64_t now)
{
    server_retry_held(sv, now, false);
}

/* Runs waiting request p again (sv->retrying while it runs): true when it waits on (p is
 * the caller's still), false when it was answered or its connection closed (p freed). */
static bool server_pending_rerun(struct server *sv, struct server_pending *p)
{
    bool closed;
    sv->retrying = p;
    sv->retry_again = false;
    memcpy(sv->rx, p->msg, p->len);
    closed = server_handle(sv, p->c, p->len);
    sv->retrying = NULL;
    if (closed || !p->c || !sv->retry_again) {
        free(p);
        return false;
    }
    return true;
}

/* p waits on behind the requests of this pass (pending_took, where a close finds it). */
static void server_pending_took_add(struct server *sv, struct server_pending *p)
{
    struct server_pending **w = &sv->pending_took;
    while (*w)
        w = &(*w)->next;
    p->next = NULL;
    *w = p;
}

/* The end of a pass: what pending_took holds back on the list, in order. */
static void server_pending_took_end(struct server *sv)
{
    while (sv->pending_took) {
        struct server_pending *p = sv->pending_took;
        sv->pending_took = p->next;
        server_pending_push(sv, p);
    }
}

void server_retry_held(struct server *sv, uint64_t now, bool hold)
{
    (void)now;
    if (!sv || !sv->pending)
        return;
    /* In arrival order; each runs once per call (a deferral goes back on the list). One that
     * started moves of the pool and waits on goes behind the others that wait: the slots the
     * next landing frees go first to a lookup that got none this time, so a long prefix (or
     * a client's many connections) cannot take every slot, landing after landing, while
     * another tenant's lookup waits out disk.put_wait behind it. With hold
     * (server_on_room: a quantize landing freed a slot or two) a uid's requests stop at the
     * first of them that waits on: the later ones of that uid wait behind it, in order,
     * without running (they would take slots, give them back and wait again); every other
     * uid's run as before, so one tenant's waiting put never holds back another's. */
    const struct server_uid *held[SERVER_RETRY_HELD];
    uint32_t nheld = 0;
    sv->pending_run = sv->pending;
    sv->pending = NULL;
    while (sv->pending_run) {
        struct server_pending *p = sv->pending_run;
        const uint64_t moves0 = engine_gpu_moves_started(sv->store);
        bool behind = false;
        sv->pending_run = p->next;
        for (uint32_t i = 0; i < nheld && !behind; i++)
            behind = p->c && p->c->u == held[i];
        if (behind) {
            server_pending_push(sv, p);
            continue;
        }
        if (!server_pending_rerun(sv, p))
            continue;
        if (engine_gpu_moves_started(sv->store) != moves0) {
            server_pending_took_add(sv, p);
        } else {
            server_pending_push(sv, p);
            /* (past that many uids, the rest run as before; one that waits for a commit
             * holds back nothing) */
            if (hold && !p->writing && nheld < SERVER_RETRY_HELD)
                held[nheld++] = p->c->u;
        }
    }
    server_pending_took_end(sv);
}

void server_retry_writing(struct server *sv, uint64_t now)
{
    (void)now;
    sv->writing_due = false;
    if (!sv->pending)
        return;
    sv->pending_run = sv->pending;
    sv->pending = NULL;
    while (sv->pending_run) {
        struct server_pending *p = sv->pending_run;
        sv->pending_run = p->next;
        /* Still reserved: another client's COMMIT or ABORT. Runs again once that slot is
         * committed or gone, so a COMMIT costs each waiting RESERVE one look, not a run (and
         * the tick still answers one whose disk.put_wait ran out). */
        if (!p->writing || store_block_reserved(sv->store, p->writing_idx, p->writing_ns)) {
            server_pending_push(sv, p);
            continue;
        }
        if (server_pending_rerun(sv, p)) /* waits on, behind the ones not run */
            server_pending_took_add(sv, p);
    }
    server_pending_took_end(sv);
}

/* Takes out of c's counters what ring reads during its request added (each drain counted
 * them for its own connection already). */
static void server_fast_excl_take(struct server *sv, struct conn *c)
{
    if (!sv->fast_excl_any)
        return;
#define SERVER_STAT_EXCL(name, help) c->st.name -= sv->fast_excl.name;
    STATS_COUNTERS(SERVER_STAT_EXCL)
#undef SERVER_STAT_EXCL
    memset(&sv->fast_excl, 0, sizeof(sv->fast_excl));
    sv->fast_excl_any = false;
}

/* The loop's pause after a lookup's reply (server_handle): its policy work. */
static void server_post_flush(void *arg)
{
    store_post_flush(arg);
}

/* Handles one request; returns true if the connection was closed (c is gone). */
bool server_handle(struct server *sv, struct conn *c, size_t n)
{
    struct proto_req r;
    const char *why;
    uint64_t now = loop_now_ms(sv->loop);
    int send_fd = -1;
    bool send_fd_owned = false;
    struct stats before = sv->store->total;
    store_post_flush(sv->store); /* an earlier request's lookup, whose pause has not come */
    if (sv->fast_excl_any) { /* drains outside a request (tick, close) */
        memset(&sv->fast_excl, 0, sizeof(sv->fast_excl));
        sv->fast_excl_any = false;
    }
    sv->fast_evict_passed = false; /* rings written since the last request: an eviction reads */
    int rc = proto_decode(sv->rx, n, &r, &why);
    if (rc == -EPROTO) {
        server_conn_close(sv, c, why);
        return true;
    }
    /* A commit's publications before any request but the RESERVE of a stream of puts (which
     * reads nothing of the index; struct store's pub_defer). */
    if (rc || r.hdr->opcode != KVC_OP_RESERVE)
        store_pub_flush(sv->store, NULL, NULL);
    c->t_last = now;
    /* Its latest hits through the index before this request; the passes read the rest (a
     * SYNC's answer waits for them anyway). */
    if (rc || r.hdr->opcode != KVC_OP_FAST_ATTACH ||
        ((const struct kvc_fast_attach_req *)r.body)->what != KVC_FAST_SYNC)
        server_fast_drain(sv, c, now, SERVER_FAST_REQ);
    if (r.dup_key)
        sv->store->total.refused_duplicates++;
    if (rc == 0 && !c->hello && r.hdr->opcode != KVC_OP_HELLO) {
        rc = -EPROTO;
        why = "request before HELLO";
    }
    if (rc == 0 && proto_op_admin(r.hdr->opcode) && !c->peer.admin) {
        rc = -EPERM;
        why = "admin request from a peer that is not root, the daemon's user or in its "
              "admin group";
    }
    if (rc == 0) {
        switch (r.hdr->opcode) {
        case KVC_OP_HELLO:
            rc = server_on_hello(sv, c, &r);
            break;
        case KVC_OP_NS_OPEN:
            rc = server_on_ns_open(sv, c, &r, &send_fd, &send_fd_owned);
            break;
        case KVC_OP_LOOKUP: {
            const struct kvc_lookup_req *q = r.body;
            c->owner.gpu = c->gpu_mapped && (q->flags & KVC_LOOKUP_F_GPU) &&
                           !acl_ns_restricted(sv->acl, q->ns_id);
            rc = server_on_lookup(sv, c, &r, now, true);
            if (rc == SERVER_DEFERRED && server_pending_add(sv, c, n, now) == 0) {
                engine_trim(sv->store, now); /* the write-back that makes its room */
                return false;
            }
            if (rc == SERVER_DEFERRED) /* cannot wait (memory, one already waits): now */
                rc = server_on_lookup(sv, c, &r, now, false);
            break;
        }
        case KVC_OP_RELEASE:
            rc = server_on_release(sv, c, &r, now);
            break;
        case KVC_OP_RESERVE: {
            const struct kvc_reserve_req *q = r.body;
            c->owner.gpu = c->gpu_mapped && (q->flags & KVC_RESERVE_F_GPU) &&
                           !acl_ns_restricted(sv->acl, q->ns_id);
            rc = server_on_reserve(sv, c, &r, now, true);
            if (rc == SERVER_DEFERRED && server_pending_add(sv, c, n, now) == 0) {
                engine_trim(sv->store, now); /* the write-back that makes its room */
                return false;
            }
            if (rc == SERVER_DEFERRED) /* cannot wait (memory, one already waits): now */
                rc = server_on_reserve(sv, c, &r, now, false);
            break;
        }
        case KVC_OP_COMMIT:
            rc = server_on_commit(sv, c, &r, now);
            break;
        case KVC_OP_ABORT: {
            uint64_t id = ((const struct kvc_abort_req *)r.body)->resv_id;
            rc = server_resv_end(c, id, store_abort(sv->store, &c->owner, id));
            break;
        }
        case KVC_OP_STATS:
            rc = server_on_stats(sv, c, &r, now);
            break;
        case KVC_OP_NS_LIST:
            rc = server_on_ns_list(sv, c, &r);
            break;
        case KVC_OP_BLOCK_LIST:
            rc = server_on_block_list(sv, c, &r);
            break;
        case KVC_OP_CLIENTS ... KVC_OP_NS_DROP: {
            static const struct admin_server_ops server_admin_ops = {.clients = server_clients,
                                                                     .clients_fill =
                                                                         server_clients_fill,
                                                                     .ns_drop = server_ns_drop};
            struct admin_ctx ax = {.sv = sv,
                                   .server = &server_admin_ops,
                                   .store = sv->store,
                                   .cfg = sv->cfg,
                                   .hooks = &sv->hooks,
                                   .acl = sv->acl,
                                   .peer = &c->peer,
                                   .uid = c->cred.uid,
                                   .conn_id = c->id,
                                   .now = now};
            rc = admin_handle(&ax, &r, (struct kvc_msg_hdr *)sv->tx + 1,
                              KVC_PROTO_MAX_MSG - sizeof(struct kvc_msg_hdr));
            break;
        }
        case KVC_OP_GPU_ATTACH:
            rc = server_on_gpu_attach(sv, c, &r, &send_fd);
            break;
        case KVC_OP_HINT:
            rc = server_on_hint(sv, c, &r, now);
            break;
        case KVC_OP_HINT_HEADS:
            rc = server_on_hint_heads(sv, c, &r, now);
            break;
        case KVC_OP_FAST_ATTACH:
            rc = server_on_fast_attach(sv, c, &r, now, &send_fd, &send_fd_owned);
            if (rc == SERVER_DEFERRED) { /* SYNC: answered once its ring is read */
                server_count(sv, 0);
                server_stats_delta(&c->st, &before, &sv->store->total);
                server_fast_excl_take(sv, c);
                return false;
            }
            break;
        case KVC_OP_SYNC:
            rc = 0; /* every request before it has been handled: that is the answer */
            break;
        case KVC_OP_LOOKUP_BUDGET:
            c->owner.gpu = false; /* host locations only */
            rc = server_on_lookup_budget(sv, c, &r, now);
            break;
        case KVC_OP_WAIT:
            rc = server_on_wait(sv, c, &r, now);
            if (rc == SERVER_DEFERRED)
                return false;
            break;
        default:
            rc = -EOPNOTSUPP;
            break;
        }
    } else {
        log_limited(LOG_LEVEL_WARNING, "server: client %u: %s refused (%s)", c->id,
                    proto_op_name(r.hdr->opcode), why ? why : strerror(-rc));
    }
    server_uid_sync(c);
    server_count(sv, rc);
    server_stats_delta(&c->st, &before, &sv->store->total);
    server_fast_excl_take(sv, c);
    /* Quiet requests are answered only when they fail: a COMMIT says so in its body, a
     * RELEASE in its header (proto_decode refuses the header flag on other requests). */
    bool quiet = rc >= 0 && r.hdr &&
                 ((r.hdr->opcode == KVC_OP_COMMIT &&
                   (((const struct kvc_commit_req *)r.body)->flags & KVC_COMMIT_F_QUIET)) ||
                  (r.hdr->flags & KVC_MSG_F_QUIET));
    if (rc < 0) {
        sv->store->total.errors++;
        c->st.errors++;
        server_reply_init(sv, r.hdr, rc, 0);
    } else {
        server_reply_init(sv, r.hdr, 0, (uint32_t)rc);
    }
    rc = quiet ? 0 : server_send(sv, c, send_fd);
    /* A lookup's policy work (struct store, post_defer), once its reply is on its way and the
     * loop has slept a moment: the reply's reader, woken onto this CPU as a reader of a Unix
     * socket often is, runs first instead of waiting for the work (the default policy's
     * tuner: hundreds of microseconds for a long prefix). Everything that reads the policy
     * state in between applies it first: the next request (above), a fast-ring hit, a trim. */
    if (rc == 0 && !quiet && sv->store->post_ns && sv->store->post_nkey >= SERVER_POST_PAUSE_KEYS)
        loop_pause(sv->loop, SERVER_POST_PAUSE_US, server_post_flush, sv->store);
    else
        store_post_flush(sv->store);
    if (send_fd_owned)
        close(send_fd);
    if (rc == 0 && send_fd >= 0 && r.hdr->opcode == KVC_OP_NS_OPEN) {
        const struct kvc_ns_open_rep *p =
            (const struct kvc_ns_open_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
        c->arenas_sent |= 1u << p->arena_id;
        if (!send_fd_owned) /* the tier's own descriptor: the read-write one */
            c->arenas_rw |= 1u << p->arena_id;
    }
    /* A commit can take the arena over its high watermark. Evicting down to the low one
     * frees hundreds of blocks at once: done once the connection's queued requests are
     * answered (server_on_conn), it runs while the client copies its next blocks, and a
     * RESERVE sent right behind a commit that needs no reply is not kept waiting for it. A
     * reservation takes its slots at once: the trim after it runs while the client writes
     * them (yielding to its COMMIT), so that the next RESERVE of a stream of puts into a full
     * arena finds room made instead of evicting for it while the client waits. */
    if (r.hdr && (r.hdr->opcode == KVC_OP_COMMIT || r.hdr->opcode == KVC_OP_RESERVE))
        sv->trim_due = true;
    /* Its keys are committed (or free) now: the RESERVEs that wait for them run again, with
     * the trim, once the connection's requests are answered. */
    if (r.hdr && (r.hdr->opcode == KVC_OP_COMMIT || r.hdr->opcode == KVC_OP_ABORT) &&
        server_pending_writing(sv))
        sv->writing_due = true;
    if (rc == -EAGAIN || rc == -EWOULDBLOCK)
        server_conn_close(sv, c, "client does not read its replies");
    else if (rc)
        server_conn_close(sv, c, NULL);
    return rc != 0;
}
