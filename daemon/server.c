/*
 * server.c — see server.h.
 *
 * DESIGN
 * One SOCK_SEQPACKET socket; every datagram is one request and gets one reply, in order
 * (a COMMIT with KVC_COMMIT_F_QUIET only when it fails: kvc_put_prefix does not wait for it).
 * The trim a commit may call for runs once the connection's queued requests are answered, so
 * the RESERVE a client sends right behind its commit does not wait for the eviction.
 * The loop thread owns everything here. A connection carries its peer credentials
 * (SO_PEERCRED, taken at accept) and a store_owner holding its leases and reservations,
 * so closing the connection — for any reason — gives all of them back.
 * Replies never block the loop: they are sent with MSG_DONTWAIT, and a client whose socket
 * buffer is full (it sends without reading) is disconnected.
 * Garbage (no readable header) closes the connection with one rate-limited log line; a bad
 * field gets an error reply. Requests before HELLO are refused.
 *
 * Limits (docs/security.md): every resource a client can hold is bounded per connection
 * and, for clients that are not admins, per uid — connections, leases, pins, reserved bytes
 * as a share of an arena, namespaces created — and in time: a HELLO timeout, an idle
 * timeout, a reservation lifetime. The per-uid sums (struct server_uid) follow each
 * connection's owner after every request (server_uid_sync), so checking one costs O(1).
 * A refusal is an error reply with its own errno, one rate-limited log line and a counter.
 * Before closing a connection on its own the server sends a notice (request id 0) saying
 * why. The loop's tick (server_tick) enforces the timeouts and takes the host arenas'
 * faults (tiers/host.h).
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
#include "daemon/store.h"
#include "tiers/gpu.h"
#include "tiers/host.h"

#define SERVER_BUF (KVC_PROTO_MAX_MSG + 64)
/* A handler's answer that there is no reply yet (WAIT on reads in flight). */
#define SERVER_DEFERRED (-EINPROGRESS)
/* Hit rings (client/kvc_fast.h) are read a bounded step at a time: at most SERVER_FAST_REQ
 * entries of a connection's own ring before each of its requests but SYNC (so that its own
 * requests see its latest hits); the rest in a pass over the rings after each batch of
 * requests, SERVER_FAST_CHUNK of one ring at a time round robin, SERVER_FAST_PASS_ALL
 * entries and SERVER_FAST_PASS_US microseconds in all (give or take a chunk, whatever an
 * entry costs on this host), and no ring faster than server.fast_ring_rate entries a second
 * (docs/security.md). A closing connection has SERVER_FAST_CLOSE read. */
#define SERVER_FAST_REQ 64u
#define SERVER_FAST_CHUNK 16u
#define SERVER_FAST_PASS_ALL 512u
#define SERVER_FAST_PASS_US 200u
/* ... and the passes together take at most SERVER_FAST_SHARE_US of every
 * SERVER_FAST_WINDOW_US of the loop's time, so that rings never keep the daemon busy
 * (a busy daemon is scheduled late, and its clients wait for it). */
#define SERVER_FAST_WINDOW_US 100000u
#define SERVER_FAST_SHARE_US 25000u
#define SERVER_FAST_CLOSE 256u
/* The pass after a batch of requests runs at most once per SERVER_FAST_AFTER_US unless a SYNC
 * waits or the last one left entries to read: it visits every connection, and with a
 * thousand of them visiting after each batch took 40 % of the loop's time (bench_scale's
 * clients). Hits wait that much longer to be counted; an eviction still reads every ring
 * first (server_fast_evict), so none ranks without the hits taken before it. */
#define SERVER_FAST_AFTER_US 1000u
/* Copy time a connection may report (load_us): at most SERVER_LOAD_PARALLEL microseconds per
 * microsecond it has been connected (as many threads copying all the time), a minute of that
 * banked at most. */
#define SERVER_LOAD_PARALLEL 64u
#define SERVER_LOAD_BANK_US (SERVER_LOAD_PARALLEL * 60ull * 1000000)

/* The connections of one uid and what they hold together. */
struct server_uid {
    uint32_t uid;
    uint32_t nconns;
    uint64_t pins;    /* lease pins */
    uint64_t handles; /* leases + reservations */
    struct server_uid *next;
};

/* An open reservation and when it expires. */
struct server_resv {
    uint64_t id;
    uint64_t deadline_ms;
};

/* Reservations the daemon aborted, remembered so that COMMIT/ABORT of them say so. */
#define SERVER_EXPIRED_KEEP 64

struct conn {
    int fd;
    uint32_t id;
    struct ucred cred;
    bool hello;
    uint32_t arenas_sent; /* bit a: arena a's descriptor was handed over */
    uint32_t arenas_rw;   /* bit a: ... read-write */
    bool gpu_handle;      /* GPU_ATTACH: the pool's handle was sent */
    bool gpu_mapped;      /* GPU_ATTACH with F_MAPPED: may be given GPU locations */
    struct store_owner owner;
    struct server *sv;
    struct conn *prev, *next;
    /* Operators (issue 6): what the access rules see, and this client's own counters. */
    struct acl_peer peer;
    struct stats st;
    char name[32];
    uint64_t t_connect;
    /* Limits. */
    struct server_uid *u;
    uint64_t t_last;          /* the last request */
    uint64_t synced_pins;     /* owner.pins as last added to u */
    uint32_t synced_handles;  /* owner.live as last added to u */
    uint32_t nwaits;          /* WAITs pending */
    uint8_t *ns_open;         /* bit n: namespace n was opened here; NULL: none yet */
    struct server_resv *resv; /* open reservations, by age */
    uint32_t nresv, capresv;
    uint64_t expired[SERVER_EXPIRED_KEEP]; /* ring of aborted reservation ids */
    uint32_t nexpired;
    struct fast_ring *ring; /* FAST_ATTACH: the hits it took through the shared index */
    /* Copy time it may still report (load_us of RELEASE and of its ring), refilled at
     * SERVER_LOAD_PARALLEL microseconds per microsecond since load_ms. */
    uint64_t load_credit_us;
    uint64_t load_ms;
    bool sync_wait;    /* a FAST_ATTACH SYNC waits until its ring is read */
    uint32_t sync_req; /* its request id */
};

/* A WAIT answered when its lease's reads from disk end or its time runs out. */
struct server_wait {
    struct conn *c;
    uint32_t req_id;
    uint64_t lease_id;
    uint64_t deadline_ms;
    struct server_wait *next;
};

/* A RESERVE that found no room while the disk tier was still writing dirty blocks out (a
 * put must not drop what the disk can take, nor fail while room is coming), or a LOOKUP
 * whose reads from disk found no slot for the same reason: it runs again when disk work
 * completes, until it gets its room or disk.put_wait runs out (then it is answered with
 * what there is: NOSPACE slots, fewer hits). */
struct server_pending {
    struct conn *c;
    uint64_t deadline_ms;
    size_t len;
    struct server_pending *next;
    uint64_t msg[]; /* the request as received */
};

struct server {
    struct loop *loop;
    struct server_wait *waits;
    struct server_pending *pending;
    struct server_pending *pending_run; /* taken off `pending` by server_retry() */
    struct server_pending *retrying;    /* the one running again now, or NULL */
    bool retry_again;                   /* it deferred again: back on `pending` */
    uint64_t waits_deadline; /* earliest deadline among waits (tick skips until then) */
    struct store *store;
    int fd;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    uint32_t max_clients;
    struct server_params lim; /* the limits (fields of server_params), reloadable */
    struct server_uid *uids;
    uint32_t *ns_uid; /* by namespace id: the uid that created it, UINT32_MAX none */
    uint32_t nclients;
    uint32_t next_id;
    struct conn *conns;
    uint64_t rx[SERVER_BUF / 8]; /* aligned receive buffer */
    uint64_t tx[SERVER_BUF / 8]; /* reply buffer */
    uint8_t st[KVC_PROTO_MAX_KEYS];
    struct kvc_wire_loc locs[KVC_PROTO_MAX_KEYS];
    bool adopted; /* the socket came from systemd: it owns the file */
    bool has_admin_gid;
    uint32_t admin_gid;
    const struct config *cfg;
    struct acl *acl;
    struct server_hooks hooks;
    struct kvc_fast_hit fast_hits[KVC_FAST_RING_ENTS]; /* a hit ring's entries, being read */
    bool fast_evict_passed; /* server_fast_evict ran since the last request or batch began */
    struct conn *fast_next; /* the ring server_fast_pass reads first next time */
    bool fast_in_pass;
    uint64_t fast_after_us; /* when the last pass after a batch ran (server_fast_after) */
    bool fast_after_due;    /* it left entries to read: the next one runs at once */
    bool fast_sync_any;     /* a SYNC may wait for its ring to be read */
    uint64_t fast_window_us;      /* when the passes' current time window began */
    uint64_t fast_window_busy_us; /* their time in it */
    struct stats fast_excl; /* counted by drains since fast_excl_any was last cleared */
    bool fast_excl_any;
    bool trim_due; /* a commit wants engine_trim once its connection's requests are answered */
};

int server_socket_path(const char *configured, char *out, size_t len)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n;
    if (configured && *configured)
        n = snprintf(out, len, "%s", configured);
    else if (geteuid() != 0 && xdg && *xdg)
        n = snprintf(out, len, "%s/kvcd.sock", xdg);
    else
        n = snprintf(out, len, "/run/kvcd/kvcd.sock");
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static void server_limits_set(struct server *sv, const struct server_params *p)
{
    sv->lim = *p;
    sv->lim.cfg = NULL;
    sv->lim.acl = NULL;
    sv->lim.socket_path = sv->lim.socket_group = NULL;
    if (!sv->lim.fast_ring_rate)
        sv->lim.fast_ring_rate = 65536; /* server.fast_ring_rate's default */
}

/* ---- per-uid accounting ------------------------------------------------------------------ */

static struct server_uid *server_uid_get(struct server *sv, uint32_t uid)
{
    struct server_uid *u;
    for (u = sv->uids; u; u = u->next)
        if (u->uid == uid)
            return u;
    u = calloc(1, sizeof(*u));
    if (!u)
        return NULL;
    u->uid = uid;
    u->next = sv->uids;
    sv->uids = u;
    return u;
}

static void server_uid_put(struct server *sv, struct server_uid *u)
{
    if (--u->nconns)
        return;
    for (struct server_uid **p = &sv->uids; *p; p = &(*p)->next)
        if (*p == u) {
            *p = u->next;
            break;
        }
    free(u);
}

/* Adds what the connection's owner gained or gave back since the last call to its uid. */
static void server_uid_sync(struct conn *c)
{
    c->u->pins += c->owner.pins - c->synced_pins;
    c->u->handles += (uint64_t)c->owner.live - c->synced_handles;
    c->synced_pins = c->owner.pins;
    c->synced_handles = c->owner.live;
}

/* A limit refused a request: its counter (in total, so the client's delta sees it too) and
 * one rate-limited line. Returns rc. */
static int server_refuse(const struct conn *c, uint64_t *counter, int rc, const char *what)
{
    (*counter)++;
    log_limited(LOG_LEVEL_WARNING, "server: client %u (uid %u): %s (%s)", c->id,
                (unsigned)c->cred.uid, what, strerror(-rc));
    return rc;
}

/* Tells a client why the daemon is about to close its connection: a reply with request id 0
 * and the status (kvc_proto.h, "Notices"). Best effort. */
static void server_notice(int fd, int status)
{
    struct kvc_msg_hdr h = {.magic = KVC_PROTO_MAGIC,
                            .version = KVC_PROTO_VERSION,
                            .opcode = KVC_OP_HELLO,
                            .status = status};
    (void)!send(fd, &h, sizeof(h), MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* ---- connections ----------------------------------------------------------------------- */

/* The trim a commit asked for (server_handle), now that no request of the connection waits
 * for an answer (or on the tick). */
static void server_trim_due(struct server *sv)
{
    if (!sv->trim_due)
        return;
    sv->trim_due = false;
    engine_trim(sv->store, loop_now_ms(sv->loop));
}

static uint32_t server_fast_drain(struct server *sv, struct conn *c, uint64_t now, uint32_t max);

static void server_conn_close(struct server *sv, struct conn *c, const char *why)
{
    /* The hits it took before it went, as far as one pass goes; the rest are not read
     * (libkvc's kvc_disconnect has them read first). */
    if (c->ring) {
        server_fast_drain(sv, c, loop_now_ms(sv->loop), SERVER_FAST_CLOSE);
        sv->store->total.fast_dropped += fast_ring_unread(c->ring);
    }
    if (sv->fast_next == c)
        sv->fast_next = c->next;
    if (why)
        log_limited(LOG_LEVEL_WARNING, "server: closing client %u (pid %d, uid %u): %s", c->id,
                    (int)c->cred.pid, (unsigned)c->cred.uid, why);
    else
        log_debug("server: client %u (pid %d) disconnected", c->id, (int)c->cred.pid);
    loop_del(sv->loop, c->fd);
    close(c->fd);
    for (int l = 0; l < 2; l++)
        for (struct server_pending **w = l ? &sv->pending_run : &sv->pending; *w;) {
            struct server_pending *x = *w;
            if (x->c == c) {
                *w = x->next;
                free(x);
            } else {
                w = &x->next;
            }
        }
    if (sv->retrying && sv->retrying->c == c)
        sv->retrying->c = NULL; /* server_retry frees it */
    for (struct server_wait **w = &sv->waits; *w;) {
        struct server_wait *x = *w;
        if (x->c == c) {
            *w = x->next;
            free(x);
        } else {
            w = &x->next;
        }
    }
    store_owner_fini(sv->store, &c->owner);
    server_uid_sync(c);
    server_uid_put(sv, c->u);
    fast_ring_free(c->ring);
    free(c->ns_open);
    free(c->resv);
    if (c->prev)
        c->prev->next = c->next;
    else
        sv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    sv->nclients--;
    free(c);
}

/* Sends the reply in sv->tx (header filled by the caller), with an optional descriptor. */
static int server_send(struct server *sv, struct conn *c, int fd)
{
    struct kvc_msg_hdr *h = (struct kvc_msg_hdr *)sv->tx;
    struct iovec iov = {.iov_base = sv->tx, .iov_len = sizeof(*h) + h->len};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        struct cmsghdr *cm;
        memset(&ctl, 0, sizeof(ctl));
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof(ctl.buf);
        cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
        h->flags |= KVC_MSG_F_FD;
    }
    if (sendmsg(c->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        return -errno;
    return 0;
}

static void *server_reply_init(struct server *sv, const struct kvc_msg_hdr *req, int status,
                               uint32_t len)
{
    struct kvc_msg_hdr *h = (struct kvc_msg_hdr *)sv->tx;
    *h = (struct kvc_msg_hdr){.magic = KVC_PROTO_MAGIC,
                              .version = KVC_PROTO_VERSION,
                              .opcode = req->opcode,
                              .req_id = req->req_id,
                              .len = len,
                              .status = status};
    return h + 1;
}

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
    const struct config_ns *cn = ns && sv->cfg ? config_ns_match(sv->cfg, ns->layout.model_id, NULL)
                                               : NULL;
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
        exists = sv->store->ns[i] &&
                 strcmp(sv->store->ns[i]->layout.model_id, q->layout.model_id) == 0;
    if (sv->acl && named) {
        acc = acl_access_model(sv->acl, &c->peer, q->layout.model_id);
        if (!acc || (!exists && !(acc & KVC_ACCESS_WRITE))) {
            log_limited(LOG_LEVEL_WARNING,
                        "server: client %u (uid %u): NS_OPEN '%s' refused (%s)", c->id,
                        (unsigned)c->cred.uid, q->layout.model_id,
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
        log_info("store: namespace %u '%s' created (%llu bytes per block)", id,
                 ns->layout.model_id, (unsigned long long)ns->block_bytes);
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

static bool server_may_wait(struct server *sv, const struct conn *c, uint32_t ns_id,
                            uint64_t now);

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
static int server_ns_use(const struct server *sv, const struct conn *c, uint32_t ns_id,
                         uint32_t need)
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
        return server_refuse(c, &sv->store->total.refused_leases, rc,
                             "server.max_leases reached");
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
     * written out: it waits for that room like a put (the reads it started go on). The engine
     * then pins and counts nothing: a lookup's hits are counted once, when it is answered. */
    bool defer =
        may_wait && !(q->flags & KVC_LOOKUP_F_READY_ONLY) && server_may_wait(sv, c, q->ns_id, now);
    c->owner.lookup_short = false;
    uint32_t first = 0;
    int hits = engine_lookup_kind(sv->store, &c->owner, q->ns_id, r->tail, n, q->base,
                                  q->flags | (defer ? ENGINE_LOOKUP_F_DEFER : 0), now, &lease,
                                  &first, (struct kvc_wire_loc *)(p + 1));
    if (hits == -EAGAIN && defer)
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
    int arc = server_ns_use(sv, c, q->ns_id, KVC_ACCESS_READ);
    if (arc)
        return arc;
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
    int nsel = store_lookup_budget(sv->store, &c->owner, q->ns_id, r->tail, n, most,
                                   q->policy == KVC_POLICY_NS ? -1 : (int)q->policy, q->sinks,
                                   q->recent, r->tail2, r->ntail2, now, &lease, &nprefix, pos,
                                   locs);
    if (nsel < 0)
        return server_store_rc(sv, c, nsel);
    for (int i = 0; i < nsel; i++)
        sel[i] = (struct kvc_wire_sel){.pos = pos[i], .loc = locs[i]};
    *p = (struct kvc_lookup_budget_rep){.nsel = (uint32_t)nsel, .nprefix = nprefix,
                                        .lease_id = lease};
    return (int)(sizeof(*p) + (size_t)nsel * sizeof(*sel));
}

/* Fills a WAIT reply for lease_id; SERVER_DEFERRED if reads are in flight and wait is set. */
static int server_wait_fill(struct server *sv, struct conn *c, uint64_t lease_id, bool wait)
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

static int server_send(struct server *sv, struct conn *c, int fd);
static void *server_reply_init(struct server *sv, const struct kvc_msg_hdr *req, int status,
                               uint32_t len);

/* Answers the WAITs whose reads ended or whose time ran out; notes the next deadline. */
static void server_waits_check(struct server *sv, uint64_t now)
{
    uint64_t next = UINT64_MAX;
    for (struct server_wait **w = &sv->waits; *w;) {
        struct server_wait *x = *w;
        struct kvc_msg_hdr req = {.opcode = KVC_OP_WAIT, .req_id = x->req_id};
        int rc = server_wait_fill(sv, x->c, x->lease_id, now < x->deadline_ms);
        if (rc == SERVER_DEFERRED) {
            if (x->deadline_ms < next)
                next = x->deadline_ms;
            w = &x->next;
            continue;
        }
        server_reply_init(sv, &req, rc < 0 ? rc : 0, rc < 0 ? 0 : (uint32_t)rc);
        /* A client that does not read is dropped at its next request. */
        server_send(sv, x->c, -1);
        x->c->nwaits--;
        *w = x->next;
        free(x);
    }
    sv->waits_deadline = next;
}

static void server_on_ready(void *arg)
{
    struct server *sv = arg;
    server_waits_check(sv, loop_now_ms(sv->loop));
}

/* Quantize jobs landed: the puts that wait for the room they freed run again. */
static void server_on_room(void *arg)
{
    struct server *sv = arg;
    server_retry(sv, loop_now_ms(sv->loop));
}

/* Reservations of c past their deadline: aborted, remembered, counted, logged. */
static void server_resv_expire(struct server *sv, struct conn *c, uint64_t now)
{
    for (uint32_t i = 0; i < c->nresv;) {
        uint64_t id = c->resv[i].id;
        const struct store_handle *h;
        if (c->resv[i].deadline_ms > now) {
            i++;
            continue;
        }
        c->resv[i] = c->resv[--c->nresv];
        h = store_handle_get(&c->owner, id, STORE_HANDLE_RESV);
        if (!h)
            continue;
        struct store_ns *ns = store_ns_get(sv->store, h->ns);
        store_abort(sv->store, &c->owner, id);
        c->expired[c->nexpired++ % SERVER_EXPIRED_KEEP] = id;
        sv->store->total.expired_reservations++;
        c->st.expired_reservations++;
        if (ns)
            ns->stats.expired_reservations++;
        log_limited(LOG_LEVEL_WARNING,
                    "server: client %u (uid %u): reservation aborted after "
                    "server.reservation_timeout (its COMMIT will fail with ETIMEDOUT)",
                    c->id, (unsigned)c->cred.uid);
    }
    server_uid_sync(c);
}

/* Takes the faults of the host arenas (a client punched a hole under the daemon, see
 * tiers/host.h): the blocks there go, the pages stay quarantined until they hold memory. */
static void server_arena_faults(struct server *sv)
{
    struct store *s = sv->store;
    for (uint32_t a = 0; a < s->narenas; a++) {
        struct tier *t = s->arenas[a].tier;
        uint64_t offs[64], unit = tier_host_fault_unit(t);
        uint32_t n = tier_host_faults_take(t, offs, 64);
        for (uint32_t i = 0; i < n; i++) {
            uint32_t nb = engine_arena_fault(s, a, offs[i], unit);
            s->total.arena_faults++;
            log_limited(LOG_LEVEL_WARNING,
                        "host: arena %u lost the page at %llu under the daemon (a writer "
                        "punched a hole); %u blocks there dropped, the page quarantined",
                        a, (unsigned long long)offs[i], nb);
        }
        tier_host_repair(t);
    }
}

void server_tick(struct server *sv)
{
    uint64_t now;
    if (!sv)
        return;
    now = loop_now_ms(sv->loop);
    for (struct conn *c = sv->conns, *next; c; c = next) {
        next = c->next;
        if (!c->hello && now > c->t_connect && now - c->t_connect >= sv->lim.hello_timeout_ms) {
            sv->store->total.closed_hello_timeout++;
            server_notice(c->fd, -ETIMEDOUT);
            server_conn_close(sv, c, "no HELLO within server.hello_timeout");
            continue;
        }
        if (now > c->t_last && now - c->t_last >= sv->lim.idle_timeout_ms) {
            sv->store->total.closed_idle++;
            server_notice(c->fd, -ETIMEDOUT);
            server_conn_close(sv, c, "idle for server.idle_timeout");
            continue;
        }
        if (c->nresv)
            server_resv_expire(sv, c, now);
    }
    if (sv->waits && now >= sv->waits_deadline)
        server_waits_check(sv, now);
    /* After the checks above: a request run again here is newer than their `now`. */
    if (sv->pending)
        server_retry(sv, now); /* answers the ones whose time ran out */
    server_trim_due(sv);
    server_arena_faults(sv);
}

/* Adds us of copy time that c reports for namespace ns, as far as c's credit goes (the
 * rest is counted in load_refused_us): a client cannot drive the daemon's load_us past what
 * its connections could have spent. */
static void server_load_add(struct server *sv, struct conn *c, struct store_ns *ns, uint64_t us,
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

static int server_on_release(struct server *sv, struct conn *c, const struct proto_req *r)
{
    struct kvc_release_rep *p = (struct kvc_release_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    const struct kvc_release_req *q = r->body;
    const uint64_t *ids = r->tail;
    uint32_t done = 0;
    int rc = 0;
    struct store_ns *ns = store_ns_get(sv->store, store_lease_ns(&c->owner, ids[0]));
    for (uint32_t i = 0; i < r->ntail; i++) {
        if (store_release(sv->store, &c->owner, ids[i]) == 0)
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

/* Whether a request of c that found no room in ns_id's arena may wait for it: disk.put_wait
 * has not run out for it, and the disk tier is making room there. */
static bool server_may_wait(struct server *sv, const struct conn *c, uint32_t ns_id,
                            uint64_t now)
{
    const struct store_ns *ns = store_ns_get(sv->store, ns_id);
    if (!ns || !sv->cfg || !sv->cfg->disk_put_wait)
        return false;
    if (sv->retrying && sv->retrying->c == c && now >= sv->retrying->deadline_ms)
        return false; /* waited long enough */
    return engine_room_coming(sv->store, ns->arena);
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
    X(reserves) X(reserve_keys) X(reserved_blocks) X(dedup_blocks) X(busy_blocks)                  \
    X(nospace_blocks) X(skipped_parent_blocks) X(skipped_parent_busy_blocks)                       \
    X(skipped_busy_blocks) X(skipped_nospace_blocks) X(skipped_failed_blocks) X(aborted_blocks)

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
    int n = store_reserve(sv->store, &c->owner, q->ns_id, &q->parent, r->tail, want, now,
                          &resv, sv->st, sv->locs);
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
    if (sv->retrying && sv->retrying->c == c && (uint32_t)n < want)
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
    int n = server_resv_end(c, q->resv_id,
                            store_commit(sv->store, &c->owner, q->resv_id, q->ncommit, now,
                                         &dropped));
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
    server_stat_put(out, &n, "recompute_saved_est_us",
                    (uint64_t)((double)st->hit_tokens * 1e6 /
                               (double)(s->p.recompute_tokens_per_s ? s->p.recompute_tokens_per_s
                                                                    : 1)));
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
    const uint32_t max = (KVC_PROTO_MAX_MSG - sizeof(struct kvc_msg_hdr) - sizeof(*p)) /
                         sizeof(*out);
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

static int server_on_block_list(struct server *sv, struct conn *c, const struct proto_req *r)
{
    const struct kvc_block_list_req *q = r->body;
    struct kvc_block_list_rep *p =
        (struct kvc_block_list_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    struct kvc_wire_block *out = (struct kvc_wire_block *)(p + 1);
    const uint32_t fit = (KVC_PROTO_MAX_MSG - sizeof(struct kvc_msg_hdr) - sizeof(*p)) /
                         sizeof(*out);
    uint32_t max = q->max < fit ? q->max : fit;
    const struct index *ix = &sv->store->ix;
    uint64_t i = q->cursor;
    uint32_t n = 0;
    if (!store_ns_get(sv->store, q->ns_id))
        return -ENOENT;
    if (!(acl_access(sv->acl, &c->peer, q->ns_id) & KVC_ACCESS_READ))
        return -EACCES;
    for (; i < ix->nblocks && n < max; i++) {
        const struct block *b = &ix->blocks[i];
        if (b->state != BLOCK_STATE_COMMITTED || b->ns != q->ns_id)
            continue;
        out[n++] = (struct kvc_wire_block){.key = b->key,
                                           .parent = b->parent,
                                           .bytes = b->len,
                                           .last_access_ms = b->last_access,
                                           .hits = b->hits,
                                           .pins = b->pins,
                                           .children = b->children,
                                           .depth = b->depth,
                                           .tier = b->tier,
                                           .format = b->format,
                                           .state = 1,
                                           .flags = (b->flags & BLOCK_F_DISK)
                                                        ? KVC_WIRE_BLOCK_F_DISK
                                                        : 0};
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

/* ---- the fast path (client/kvc_fast.h) ------------------------------------------------ */

/* Counts at most max of the hits c took through the shared index (fewer when its allowance,
 * server.fast_ring_rate, is spent), as LOOKUP would: each entry must name a cached block of
 * a namespace c opened and may read; the rest are refused (counted). The entries read. */
static void server_stats_delta(struct stats *st, const struct stats *before,
                               const struct stats *after);

static uint32_t server_fast_drain(struct server *sv, struct conn *c, uint64_t now, uint32_t max)
{
    struct kvc_fast_hit *h = sv->fast_hits;
    struct stats before;
    uint32_t n;
    bool lied;
    if (!c->ring || !fast_ring_unread(c->ring))
        return 0;
    before = sv->store->total;
    fast_ring_refill(c->ring, now, (uint32_t)sv->lim.fast_ring_rate);
    n = fast_ring_take(c->ring, h, max, &lied);
    if (lied) /* a head moved backwards or past a ring's worth: one lie */
        sv->store->total.fast_refused++;
    /* Hits through the index are not requests: they keep no connection from idling out. */
    for (uint32_t first = 0, end; first < n; first = end) {
        /* A request's hits: from one with nkeys set to the next one. */
        for (end = first + 1; end < n && !h[end].nkeys; end++)
            ;
        /* Touched last to first, as LOOKUP does; the tuner sees them in prefix order. */
        for (uint32_t i = end; i-- > first;) {
            struct kvc_wire_key k = {.lo = h[i].klo, .hi = h[i].khi};
            if (server_ns_use(sv, c, h[i].ns, KVC_ACCESS_READ) ||
                store_fast_hit(sv->store, h[i].ns, h[i].block, &k, h[i].nkeys, now)) {
                sv->store->total.fast_refused++;
                h[i].pos = UINT16_MAX; /* not fed to the tuner */
                continue;
            }
            if (h[i].nkeys && h[i].load_us) /* as RELEASE reports a lease's copy time */
                server_load_add(sv, c, store_ns_get(sv->store, h[i].ns), h[i].load_us, now);
        }
        for (uint32_t i = first; i < end; i++)
            if (h[i].pos != UINT16_MAX) {
                struct kvc_wire_key k = {.lo = h[i].klo, .hi = h[i].khi};
                store_fast_ref(sv->store, h[i].ns, &k, h[i].pos, now);
            }
    }
    /* Counted as this connection's, and kept out of the request being handled, if any
     * (server_handle gives a connection the totals' change over its request). */
    server_stats_delta(&c->st, &before, &sv->store->total);
    server_stats_delta(&sv->fast_excl, &before, &sv->store->total);
    sv->fast_excl_any = true;
    return n;
}

/* Answers c's FAST_ATTACH SYNC: its ring has been read. Outside any request's handling
 * (the reply is built in sv->tx). */
static void server_fast_synced(struct server *sv, struct conn *c)
{
    struct kvc_msg_hdr req = {.opcode = KVC_OP_FAST_ATTACH, .req_id = c->sync_req};
    struct kvc_fast_attach_rep *p = server_reply_init(sv, &req, 0, sizeof(*p));
    *p = (struct kvc_fast_attach_rep){.what = KVC_FAST_SYNC};
    c->sync_wait = false;
    server_send(sv, c, -1); /* a client that does not read is dropped at its next request */
}

static uint64_t server_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* One pass over the connections' rings: rounds of at most SERVER_FAST_CHUNK entries of each
 * ring, round robin from where the last pass stopped, until `budget` entries are read or
 * SERVER_FAST_PASS_US went by; then, with `reply`, the SYNCs whose rings are read are
 * answered. Returns in how many ms a ring will have entries it may be read for (0: now), or
 * -1 when no ring has unread entries. */
static int server_fast_pass(struct server *sv, uint32_t budget, bool reply)
{
    uint64_t now = loop_now_ms(sv->loop), rate = sv->lim.fast_ring_rate;
    uint64_t t0 = server_mono_us(), end = t0 + SERVER_FAST_PASS_US;
    int again = -1, rest = 0;
    if (!sv->conns || sv->fast_in_pass)
        return -1;
    sv->fast_in_pass = true;
    /* The passes' share of the loop's time: when they took it all in this window, they read
     * nothing until the next one (the loop may sleep till then). */
    if (t0 - sv->fast_window_us >= SERVER_FAST_WINDOW_US) {
        sv->fast_window_us = t0;
        sv->fast_window_busy_us = 0;
    }
    if (sv->fast_window_busy_us >= SERVER_FAST_SHARE_US) {
        budget = 0;
        rest = (int)((sv->fast_window_us + SERVER_FAST_WINDOW_US - t0 + 999) / 1000);
    }
    for (bool more = true; more && budget && server_mono_us() < end;) {
        struct conn *start = sv->fast_next ? sv->fast_next : sv->conns, *c = start;
        more = false;
        do {
            struct conn *next = c->next ? c->next : sv->conns;
            if (c->ring && fast_ring_unread(c->ring)) {
                uint32_t n = server_fast_drain(
                    sv, c, now, budget < SERVER_FAST_CHUNK ? budget : SERVER_FAST_CHUNK);
                budget -= n;
                more = more || n > 0;
                sv->fast_next = next;
                if (!budget || server_mono_us() >= end)
                    break;
            }
            c = next;
        } while (c != start);
    }
    /* Left unread for want of budget or time (the next pass reads on at once), or of
     * allowance (once the rate has given a chunk's worth). An eviction's pass (no `reply`)
     * wants none of that: the pass after the batch computes it. */
    bool waiting = false;
    for (struct conn *c = reply ? sv->conns : NULL; c; c = c->next) {
        if (!c->ring)
            continue;
        if (fast_ring_unread(c->ring)) {
            int ms = fast_ring_allowance(c->ring)
                         ? rest
                         : (int)((SERVER_FAST_CHUNK * 1000 + rate - 1) / rate);
            again = again < 0 || ms < again ? ms : again;
        } else if (c->sync_wait) {
            /* Read; answered once its rate allows it another entry, so that a client over
             * its rate waits for it rather than spin through SYNCs. */
            fast_ring_refill(c->ring, now, (uint32_t)rate);
            if (!fast_ring_allowance(c->ring)) {
                int ms = (int)((1000 + rate - 1) / rate);
                again = again < 0 || ms < again ? ms : again;
            } else {
                server_fast_synced(sv, c);
            }
        }
        waiting = waiting || c->sync_wait;
    }
    if (reply)
        sv->fast_sync_any = waiting;
    sv->fast_window_busy_us += server_mono_us() - t0;
    sv->fast_in_pass = false;
    return again;
}

/* After every batch of requests (loop_after): a pass over the rings. */
static int server_fast_after(void *arg)
{
    struct server *sv = arg;
    uint64_t t = server_mono_us();
    int again;
    sv->fast_evict_passed = false;
    if (!sv->fast_sync_any && !sv->fast_after_due && t - sv->fast_after_us < SERVER_FAST_AFTER_US) {
        again = (int)((sv->fast_after_us + SERVER_FAST_AFTER_US - t + 999) / 1000);
    } else {
        sv->fast_after_us = t;
        again = server_fast_pass(sv, SERVER_FAST_PASS_ALL, true);
        sv->fast_after_due = again == 0;
    }
    /* An eviction left half done at its time budget goes on between batches of requests,
     * so none waits behind all of it. */
    if (sv->store->trim_more) {
        engine_trim(sv->store, loop_now_ms(sv->loop));
        if (sv->store->trim_more)
            again = 0;
    }
    return again;
}

/* Before the engine evicts (store.on_evict): a pass, so that the hits clients took through
 * the index before this request count for the blocks they keep using; once per request
 * handled (or batch) however many evictions it makes. (Once per loop millisecond, as this
 * was, skipped the pass for a request that came in the millisecond of an earlier one.) */
static void server_fast_evict(void *arg)
{
    struct server *sv = arg;
    if (sv->fast_evict_passed)
        return;
    sv->fast_evict_passed = true;
    (void)server_fast_pass(sv, SERVER_FAST_PASS_ALL, false);
}

static int server_on_fast_attach(struct server *sv, struct conn *c, const struct proto_req *r,
                                 uint64_t now, int *send_fd, bool *fd_owned)
{
    const struct kvc_fast_attach_req *q = r->body;
    struct kvc_fast_attach_rep *p = (struct kvc_fast_attach_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    int rc = 0;
    *p = (struct kvc_fast_attach_rep){.what = q->what, .arena_id = q->arena_id};
    if (q->what == KVC_FAST_SYNC) {
        /* The client needs room (half its ring is unread, or it is leaving). What its
         * allowance covers is read in the passes, and the answer waits for that (and for
         * the rate to allow one entry more); the rest goes unread now, counted: no more
         * work than the rate. */
        bool lied;
        if (!c->ring || c->sync_wait)
            return sizeof(*p); /* nothing to read, or one SYNC waits already */
        fast_ring_refill(c->ring, now, (uint32_t)sv->lim.fast_ring_rate);
        sv->store->total.fast_dropped += fast_ring_shed(c->ring, &lied);
        sv->store->total.fast_refused += lied;
        if (!fast_ring_unread(c->ring) && fast_ring_allowance(c->ring))
            return sizeof(*p);
        c->sync_wait = true;
        sv->fast_sync_any = true;
        c->sync_req = r->hdr->req_id;
        return SERVER_DEFERRED;
    }
    if (!sv->store->fast[0])
        return -EOPNOTSUPP; /* server.fast_path = no */
    if (q->what == KVC_FAST_INDEX) {
        /* The index names where every block of the arena is: for a holder of the arena. */
        if (q->arena_id >= sv->store->narenas || !(c->arenas_sent & (1u << q->arena_id)))
            return -EACCES;
        int fd = fast_index_fd_ro(sv->store->fast[q->arena_id]);
        if (fd < 0)
            return fd;
        *send_fd = fd;
        *fd_owned = true;
        p->bytes = fast_index_bytes(sv->store->fast[q->arena_id]);
        return sizeof(*p);
    }
    if (c->ring)
        return -EEXIST; /* one per connection */
    if (!(c->ring = fast_ring_new(send_fd, &rc)))
        return rc; /* the descriptor stays the ring's */
    p->bytes = sizeof(struct kvc_fast_ring) + KVC_FAST_RING_ENTS * sizeof(struct kvc_fast_hit);
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
static void server_stats_delta(struct stats *st, const struct stats *before,
                               const struct stats *after)
{
#define SERVER_STAT_DELTA(name, help) st->name += after->name - before->name;
    STATS_COUNTERS(SERVER_STAT_DELTA)
#undef SERVER_STAT_DELTA
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
    if (sv->retrying && sv->retrying->c == c) {
        sv->retry_again = true; /* waits on, with its first deadline */
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
    memcpy(p->msg, sv->rx, n);
    server_pending_push(sv, p);
    sv->store->total.put_waits++;
    return 0;
}

static bool server_handle(struct server *sv, struct conn *c, size_t n);

void server_retry(struct server *sv, uint64_t now)
{
    (void)now;
    if (!sv || !sv->pending)
        return;
    /* In arrival order; each runs once per call (a deferral goes back on the list). */
    sv->pending_run = sv->pending;
    sv->pending = NULL;
    while (sv->pending_run) {
        struct server_pending *p = sv->pending_run;
        bool closed;
        sv->pending_run = p->next;
        sv->retrying = p;
        sv->retry_again = false;
        memcpy(sv->rx, p->msg, p->len);
        closed = server_handle(sv, p->c, p->len);
        sv->retrying = NULL;
        if (!closed && p->c && sv->retry_again)
            server_pending_push(sv, p);
        else
            free(p);
    }
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

/* Handles one request; returns true if the connection was closed (c is gone). */
static bool server_handle(struct server *sv, struct conn *c, size_t n)
{
    struct proto_req r;
    const char *why;
    uint64_t now = loop_now_ms(sv->loop);
    int send_fd = -1;
    bool send_fd_owned = false;
    struct stats before = sv->store->total;
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
            rc = server_on_release(sv, c, &r);
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
            struct admin_ctx ax = {.sv = sv,
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
    bool quiet = rc >= 0 && r.hdr && r.hdr->opcode == KVC_OP_COMMIT &&
                 (((const struct kvc_commit_req *)r.body)->flags & KVC_COMMIT_F_QUIET);
    if (rc < 0) {
        sv->store->total.errors++;
        c->st.errors++;
        server_reply_init(sv, r.hdr, rc, 0);
    } else {
        server_reply_init(sv, r.hdr, 0, (uint32_t)rc);
    }
    rc = quiet ? 0 : server_send(sv, c, send_fd);
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
     * RESERVE sent right behind a commit that needs no reply is not kept waiting for it. */
    if (r.hdr && r.hdr->opcode == KVC_OP_COMMIT)
        sv->trim_due = true;
    if (rc == -EAGAIN || rc == -EWOULDBLOCK)
        server_conn_close(sv, c, "client does not read its replies");
    else if (rc)
        server_conn_close(sv, c, NULL);
    return rc != 0;
}

static void server_on_conn(struct loop *l, int fd, uint32_t events, void *arg)
{
    struct conn *c = arg;
    struct server *sv = c->sv;
    (void)l;
    (void)fd;
    if (events & EPOLLIN) {
        /* A few requests per wakeup, so one busy client cannot starve the others. */
        for (int k = 0; k < 8; k++) {
            union {
                char buf[CMSG_SPACE(sizeof(int) * 8)];
                struct cmsghdr align;
            } ctl;
            struct iovec iov = {.iov_base = sv->rx, .iov_len = KVC_PROTO_MAX_MSG};
            struct msghdr msg = {.msg_iov = &iov,
                                 .msg_iovlen = 1,
                                 .msg_control = ctl.buf,
                                 .msg_controllen = sizeof(ctl.buf)};
            ssize_t n = recvmsg(c->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
                server_trim_due(sv);
                return;
            }
            if (n <= 0) {
                server_conn_close(sv, c, n < 0 ? strerror(errno) : NULL);
                return;
            }
            if (msg.msg_controllen) {
                /* Clients send no descriptors: close whatever came and drop the client. */
                for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
                    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
                        for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                            int pfd;
                            memcpy(&pfd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                            close(pfd);
                        }
                server_conn_close(sv, c, "client sent a descriptor");
                return;
            }
            if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
                server_conn_close(sv, c, "message larger than the protocol allows");
                return;
            }
            if (server_handle(sv, c, (size_t)n))
                return;
        }
        return;
    }
    if (events & (EPOLLHUP | EPOLLERR))
        server_conn_close(sv, c, NULL);
}

/* Credentials the access rules use: uid, gid and the supplementary groups (SO_PEERGROUPS,
 * Linux 4.13; without it only the primary group counts). */
static void server_peer_init(const struct server *sv, int cfd, struct conn *c)
{
    gid_t groups[ACL_GROUPS_MAX];
    socklen_t gl = sizeof(groups);
    c->peer.uid = c->cred.uid;
    c->peer.gid = c->cred.gid;
    c->peer.ngroups = 0;
    if (getsockopt(cfd, SOL_SOCKET, SO_PEERGROUPS, groups, &gl) == 0)
        for (size_t i = 0; i < gl / sizeof(gid_t) && i < ACL_GROUPS_MAX; i++)
            c->peer.groups[c->peer.ngroups++] = groups[i];
    c->peer.admin = acl_is_admin(c->peer.uid, c->peer.gid, c->peer.groups, c->peer.ngroups,
                                 sv->has_admin_gid, sv->admin_gid);
}

static void server_on_accept(struct loop *l, int fd, uint32_t events, void *arg)
{
    struct server *sv = arg;
    (void)events;
    for (;;) {
        int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        socklen_t cl = sizeof(struct ucred);
        struct conn *c;
        if (cfd < 0) {
            if (errno != EAGAIN && errno != EINTR)
                log_limited(LOG_LEVEL_WARNING, "server: accept failed (%s)", strerror(errno));
            return;
        }
        if (sv->nclients >= sv->max_clients) {
            sv->store->total.refused_connections++;
            log_limited(LOG_LEVEL_WARNING, "server: refusing a client (max_clients %u reached)",
                        sv->max_clients);
            server_notice(cfd, -EUSERS);
            close(cfd);
            continue;
        }
        c = calloc(1, sizeof(*c));
        if (!c) {
            close(cfd);
            continue;
        }
        c->fd = cfd;
        c->sv = sv;
        getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &c->cred, &cl);
        server_peer_init(sv, cfd, c);
        c->u = server_uid_get(sv, c->cred.uid);
        if (c->u && !c->peer.admin && c->u->nconns >= sv->lim.max_clients_per_uid) {
            sv->store->total.refused_connections++;
            log_limited(LOG_LEVEL_WARNING,
                        "server: refusing a client of uid %u (max_clients_per_uid %u reached)",
                        (unsigned)c->cred.uid, sv->lim.max_clients_per_uid);
            server_notice(cfd, -EUSERS);
            close(cfd);
            free(c);
            continue;
        }
        if (!c->u || loop_add(l, cfd, EPOLLIN, server_on_conn, c)) {
            if (c->u && !c->u->nconns) {
                c->u->nconns = 1; /* so that the put frees the entry made for it */
                server_uid_put(sv, c->u);
            }
            close(cfd);
            free(c);
            continue;
        }
        c->u->nconns++;
        c->id = ++sv->next_id;
        c->t_connect = c->t_last = c->load_ms = loop_now_ms(l);
        c->load_credit_us = 1000 * SERVER_LOAD_PARALLEL; /* a millisecond's worth */
        store_owner_init(&c->owner);
        c->next = sv->conns;
        if (sv->conns)
            sv->conns->prev = c;
        sv->conns = c;
        sv->nclients++;
        log_debug("server: client %u connected (pid %d, uid %u)", c->id, (int)c->cred.pid,
                  (unsigned)c->cred.uid);
    }
}

/* ---- socket ---------------------------------------------------------------------------- */

/* -EADDRINUSE if a live daemon answers at path; else removes a stale socket file. */
static int server_claim_path(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    struct stat st;
    int fd, rc = 0;
    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISSOCK(st.st_mode))
        return -EEXIST;
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
        rc = -EADDRINUSE;
    else if (errno == ECONNREFUSED || errno == ENOENT)
        rc = unlink(path) < 0 && errno != ENOENT ? -errno : 0;
    else
        rc = -errno;
    close(fd);
    return rc;
}

struct server *server_new(struct loop *l, struct store *s, const struct server_params *p,
                          int *err)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    struct server *sv = calloc(1, sizeof(*sv));
    char tmpdir[sizeof(a.sun_path) + 16] = "", tmp[sizeof(tmpdir) + 4] = "";
    int rc = -ENOMEM, n;
    if (!sv)
        goto fail;
    sv->fd = -1;
    sv->loop = l;
    sv->store = s;
    sv->max_clients = p->max_clients;
    sv->has_admin_gid = p->has_admin_gid;
    sv->admin_gid = p->admin_gid;
    sv->cfg = p->cfg;
    sv->acl = p->acl;
    server_limits_set(sv, p);
    sv->ns_uid = malloc(s->nns * sizeof(*sv->ns_uid));
    if (!sv->ns_uid)
        goto fail;
    for (uint32_t i = 0; i < s->nns; i++)
        sv->ns_uid[i] = UINT32_MAX;
    /* Reads from disk that complete answer the WAITs at once (the tick only their time). */
    s->on_ready = server_on_ready;
    s->on_ready_arg = sv;
    s->on_room = server_on_room;
    s->on_room_arg = sv;
    s->on_evict = server_fast_evict;
    s->on_evict_arg = sv;
    loop_after(l, server_fast_after, sv);
    if (p->adopt) {
        struct sockaddr_un got = {0};
        socklen_t gl = sizeof(got);
        sv->adopted = true;
        sv->fd = p->adopt_fd;
        if (getsockname(sv->fd, (struct sockaddr *)&got, &gl) == 0 && got.sun_path[0])
            snprintf(sv->path, sizeof(sv->path), "%s", got.sun_path);
        fcntl(sv->fd, F_SETFL, fcntl(sv->fd, F_GETFL) | O_NONBLOCK);
        rc = loop_add(l, sv->fd, EPOLLIN, server_on_accept, sv);
        if (rc)
            goto fail;
        return sv;
    }
    rc = server_socket_path(p->socket_path, sv->path, sizeof(sv->path));
    if (rc)
        goto fail;
    if (strncmp(sv->path, "/run/kvcd/", 10) == 0)
        mkdir("/run/kvcd", 0755);
    rc = server_claim_path(sv->path);
    if (rc)
        goto fail;
    sv->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (sv->fd < 0) {
        rc = -errno;
        goto fail;
    }
    /* Bind inside a private directory (0700, beside the path) under a umask that leaves the
     * socket 0600, give it its group and mode there, listen, then rename it into place:
     * nobody else can connect before the mode is set (a connection made in that window
     * would outlive the chmod), and a client that sees the file can always connect. When
     * the directory's name does not fit in sun_path, bind in place under the same umask and
     * listen only after the chmod. */
    {
        const char *slash = strrchr(sv->path, '/');
        int dl = slash ? (int)(slash - sv->path) : 1;
        n = snprintf(tmpdir, sizeof(tmpdir), "%.*s/.kvcd.XXXXXX", dl,
                     slash ? sv->path : ".");
        if (n > 0 && (size_t)n + 3 <= sizeof(a.sun_path) - 1 && mkdtemp(tmpdir)) {
            snprintf(tmp, sizeof(tmp), "%s/s", tmpdir);
        } else {
            tmpdir[0] = 0;
            snprintf(tmp, sizeof(tmp), "%s", sv->path);
        }
    }
    memcpy(a.sun_path, tmp, strlen(tmp) + 1);
    {
        mode_t old = umask(0177);
        int b = bind(sv->fd, (struct sockaddr *)&a, sizeof(a));
        rc = b < 0 ? -errno : 0;
        umask(old);
        if (rc)
            goto fail;
    }
    if (p->socket_group && *p->socket_group) {
        struct group *g = getgrnam(p->socket_group);
        if (!g) {
            log_err("server: socket group '%s' not found", p->socket_group);
            rc = -ENOENT;
            goto fail_unlink;
        }
        if (chown(tmp, (uid_t)-1, g->gr_gid) < 0) {
            rc = -errno;
            goto fail_unlink;
        }
    }
    if (chmod(tmp, p->socket_mode) < 0 || listen(sv->fd, 128) < 0) {
        rc = -errno;
        goto fail_unlink;
    }
    if (strcmp(tmp, sv->path) != 0 && rename(tmp, sv->path) < 0) {
        rc = -errno;
        goto fail_unlink;
    }
    if (tmpdir[0]) {
        rmdir(tmpdir);
        tmpdir[0] = 0;
    }
    rc = loop_add(l, sv->fd, EPOLLIN, server_on_accept, sv);
    if (rc) {
        unlink(sv->path);
        goto fail;
    }
    return sv;
fail_unlink:
    unlink(tmp);
fail:
    if (tmpdir[0])
        rmdir(tmpdir);
    s->on_ready = NULL;
    s->on_room = NULL;
    s->on_evict = NULL;
    loop_after(l, NULL, NULL);
    if (sv && sv->fd >= 0)
        close(sv->fd);
    if (sv)
        free(sv->ns_uid);
    free(sv);
    *err = rc;
    return NULL;
}

void server_free(struct server *sv)
{
    if (!sv)
        return;
    while (sv->conns)
        server_conn_close(sv, sv->conns, NULL);
    sv->store->on_ready = NULL;
    sv->store->on_room = NULL;
    sv->store->on_evict = NULL;
    loop_after(sv->loop, NULL, NULL);
    loop_del(sv->loop, sv->fd);
    close(sv->fd);
    if (!sv->adopted)
        unlink(sv->path);
    free(sv->ns_uid);
    free(sv);
}

void server_reload(struct server *sv, const struct server_params *p)
{
    server_limits_set(sv, p);
    sv->max_clients = p->max_clients;
    sv->has_admin_gid = p->has_admin_gid;
    sv->admin_gid = p->admin_gid;
    sv->cfg = p->cfg;
    /* Who is an admin follows the new admin_group from the next request on. */
    for (struct conn *c = sv->conns; c; c = c->next)
        c->peer.admin = acl_is_admin(c->peer.uid, c->peer.gid, c->peer.groups,
                                     c->peer.ngroups, sv->has_admin_gid, sv->admin_gid);
}

void server_set_hooks(struct server *sv, const struct server_hooks *h)
{
    sv->hooks = *h;
}

uint32_t server_clients_fill(const struct server *sv, uint32_t cursor, uint32_t self, bool all,
                             uint32_t uid, struct kvc_wire_client *out, uint32_t max,
                             uint32_t *next)
{
    uint32_t n = 0;
    *next = 0;
    /* The list is newest first; ids grow, so walk it whole and keep ids >= cursor in order. */
    for (uint32_t want = cursor ? cursor : 1;;) {
        const struct conn *best = NULL;
        for (const struct conn *c = sv->conns; c; c = c->next)
            if (c->id >= want && (all || c->cred.uid == uid) && (!best || c->id < best->id))
                best = c;
        if (!best)
            break;
        if (n == max) {
            *next = best->id;
            break;
        }
        struct kvc_wire_client *w = &out[n++];
        uint32_t nresv;
        uint64_t rbytes;
        acl_owner_reserved(sv->store, &best->owner, &nresv, &rbytes);
        memset(w, 0, sizeof(*w));
        w->conn_id = best->id;
        w->pid = (uint32_t)best->cred.pid;
        w->uid = best->cred.uid;
        w->gid = best->cred.gid;
        w->leases = best->owner.live - nresv;
        w->reservations = nresv;
        w->flags = (best->peer.admin ? KVC_CLIENT_F_ADMIN : 0) |
                   (best->id == self ? KVC_CLIENT_F_SELF : 0);
        w->pins = best->owner.pins;
        w->reserved_bytes = rbytes;
        w->requests = best->st.requests;
        w->lookup_tokens = best->st.lookup_tokens;
        w->hit_tokens = best->st.hit_tokens;
        w->bytes_in = best->st.bytes_in;
        w->bytes_out = best->st.bytes_out;
        w->errors = best->st.errors;
        /* EDQUOT refusals (pins, shares, namespaces) are in refused_quota already. */
        w->refusals = best->st.refused_access + best->st.refused_admin + best->st.refused_quota +
                      best->st.refused_leases + best->st.refused_waits +
                      best->st.refused_duplicates;
        w->connected_ms = best->t_connect;
        memcpy(w->name, best->name, sizeof(w->name));
        want = best->id + 1;
    }
    return n;
}

uint32_t server_clients(const struct server *sv)
{
    return sv->nclients;
}

int server_ns_drop(struct server *sv, uint32_t ns_id, uint64_t *dropped)
{
    int rc;
    *dropped = 0;
    if (!store_ns_get(sv->store, ns_id))
        return -ENOENT;
    for (const struct conn *c = sv->conns; c; c = c->next)
        for (uint32_t i = 0; i < c->owner.nhandles; i++)
            if (c->owner.handles[i] && c->owner.handles[i]->ns == ns_id)
                return -EBUSY;
    rc = store_ns_drop(sv->store, ns_id, dropped);
    if (rc)
        return rc;
    /* Its id may name another namespace from now on: nobody has that one open yet. */
    for (struct conn *c = sv->conns; c; c = c->next)
        if (c->ns_open)
            c->ns_open[ns_id / 8] &= (uint8_t)~(1u << (ns_id % 8));
    sv->ns_uid[ns_id] = UINT32_MAX;
    acl_ns_unbind(sv->acl, ns_id);
    sv->store->total.dropped_namespaces++;
    /* Its records must not come back at the next start from an older checkpoint. */
    if (*dropped)
        engine_disk_checkpoint(sv->store);
    return 0;
}

const char *server_path(const struct server *sv)
{
    return sv->path;
}
