/*
 * server.c — see server.h. This file: the socket, connections (accept, peer credentials,
 * reading, replies, closing), the per-uid accounting and the tick's timeouts; the requests'
 * handlers and their dispatch are in server_dispatch.c, the fast path's hit rings in
 * server_fast.c (server_int.h holds what they share).
 *
 * DESIGN
 * One SOCK_SEQPACKET socket; every datagram is one request and gets one reply, in order
 * (a COMMIT with KVC_COMMIT_F_QUIET, and a RELEASE with KVC_MSG_F_QUIET in its header, only
 * when it fails: kvc_put_prefix and kvc_release do not wait for them).
 * The trim a commit may call for runs once the connection's queued requests are answered, so
 * the RESERVE a client sends right behind its commit does not wait for the eviction; and a
 * trim stops for any request that comes while it runs (store.trim_yield, every 16 actions)
 * and goes on after it.
 * The loop thread owns everything here; with server.io_threads > 0 the connections' sockets
 * are read, written and closed by I/O threads (server_io.c) while enough connections are
 * busy (server.io_threads_min_active; else the loop does it, as without them), and the rest
 * stays here.
 * A connection carries its peer credentials (SO_PEERCRED, taken at accept) and a store_owner
 * holding its leases and reservations, so closing the connection — for any reason — gives all
 * of them back.
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
#include "daemon/server_int.h"
#include "daemon/store.h"
#include "tiers/gpu.h"
#include "tiers/host.h"

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
    fast_bell_free(u->bell);
    free(u);
}

/* Adds what the connection's owner gained or gave back since the last call to its uid. */
void server_uid_sync(struct conn *c)
{
    c->u->pins += c->owner.pins - c->synced_pins;
    c->u->handles += (uint64_t)c->owner.live - c->synced_handles;
    c->synced_pins = c->owner.pins;
    c->synced_handles = c->owner.live;
}

/* A limit refused a request: its counter (in total, so the client's delta sees it too) and
 * one rate-limited line. Returns rc. */
int server_refuse(const struct conn *c, uint64_t *counter, int rc, const char *what)
{
    (*counter)++;
    log_limited(LOG_LEVEL_WARNING, "server: client %u (uid %u): %s (%s)", c->id,
                (unsigned)c->cred.uid, what, strerror(-rc));
    return rc;
}

/* Tells a client why the daemon is about to close its connection: a reply with request id 0
 * and the status (kvc_proto.h, "Notices"). Best effort. c: the connection (behind the replies
 * queued for it), or NULL for fd, a socket not yet a connection. */
static void server_notice(struct conn *c, int fd, int status)
{
    struct kvc_msg_hdr h = {.magic = KVC_PROTO_MAGIC,
                            .version = KVC_PROTO_VERSION,
                            .opcode = KVC_OP_HELLO,
                            .status = status};
    if (c && c->ioc)
        (void)server_io_send(c, &h, sizeof(h), -1);
    else
        (void)!send(c ? c->fd : fd, &h, sizeof(h), MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* ---- connections ----------------------------------------------------------------------- */

static bool server_trim_yield(void *arg);

/* The trim a commit asked for (server_handle), now that no request of the connection waits
 * for an answer (or on the tick). */
void server_trim_due(struct server *sv)
{
    if (sv->writing_due)
        server_retry_writing(sv, loop_now_ms(sv->loop));
    /* The commits' publications first (struct store's pub_defer), stopping for a request as
     * the trim does: what is left goes before the next request but a RESERVE, or here. */
    if (!store_pub_flush(sv->store, server_trim_yield, sv))
        return;
    if (!sv->trim_due)
        return;
    sv->trim_due = false;
    engine_trim(sv->store, loop_now_ms(sv->loop));
}

/* store.trim_yield: a request (or any other event of the loop) is waiting. */
static bool server_trim_yield(void *arg)
{
    struct server *sv = arg;
    return loop_input_ready(sv->loop);
}

void server_conn_close(struct server *sv, struct conn *c, const char *why)
{
    /* The hits it took before it went, as far as one pass goes; the rest are not read
     * (libkvc's kvc_disconnect has them read first). */
    if (c->ring) {
        server_fast_drain(sv, c, loop_now_ms(sv->loop), SERVER_FAST_CLOSE);
        sv->store->total.fast_dropped += fast_ring_unread(c->ring);
    }
    server_fast_conn_fini(sv, c);
    if (why)
        log_limited(LOG_LEVEL_WARNING, "server: closing client %u (pid %d, uid %u): %s", c->id,
                    (int)c->cred.pid, (unsigned)c->cred.uid, why);
    else
        log_debug("server: client %u (pid %d) disconnected", c->id, (int)c->cred.pid);
    if (c->ioc) {
        server_io_close(c);
    } else {
        loop_del(sv->loop, c->fd);
        close(c->fd);
    }
    for (int l = 0; l < 3; l++)
        for (struct server_pending **w = l == 2 ? &sv->pending_took
                                         : l   ? &sv->pending_run
                                               : &sv->pending;
             *w;) {
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

/* Sends the reply in sv->tx (header filled by the caller), with an optional descriptor; with
 * I/O threads, queues it for c's thread (a send that fails there closes c later). */
int server_send(struct server *sv, struct conn *c, int fd)
{
    struct kvc_msg_hdr *h = (struct kvc_msg_hdr *)sv->tx;
    if (c->ioc) {
        if (fd >= 0)
            h->flags |= KVC_MSG_F_FD;
        return server_io_send(c, sv->tx, sizeof(*h) + h->len, fd);
    }
    if (fd >= 0)
        h->flags |= KVC_MSG_F_FD;
    return server_sendmsg(c->fd, sv->tx, sizeof(*h) + h->len, fd);
}

int server_sendmsg(int sock, const void *buf, size_t len, int fd)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
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
    }
    if (sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        return -errno;
    return 0;
}

void *server_reply_init(struct server *sv, const struct kvc_msg_hdr *req, int status, uint32_t len)
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

/* Quantize jobs landed: the puts that wait for the room they freed run again, in arrival
 * order, each uid's until one of its own still does not fit. A landing frees a slot or two
 * and that oldest put's ladder steps already asked for its whole chain's room, so the same
 * uid's ones behind it would only take slots, give them back and wait again: a RESERVE
 * handled on the loop's CPU each time, which the quantize worker needs to make the room.
 * Other uids' requests run as always (one tenant's waiting put never holds back another's).
 * The tick and the disk's and the pool's completions still run every waiting request
 * (deadlines, room of their own). */
static void server_on_room(void *arg)
{
    struct server *sv = arg;
    server_retry_held(sv, loop_now_ms(sv->loop), true);
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
            server_notice(c, -1, -ETIMEDOUT);
            server_conn_close(sv, c, "no HELLO within server.hello_timeout");
            continue;
        }
        if (now > c->t_last && now - c->t_last >= sv->lim.idle_timeout_ms) {
            sv->store->total.closed_idle++;
            server_notice(c, -1, -ETIMEDOUT);
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
    store_pub_flush(sv->store, NULL, NULL); /* all of them, however busy the loop */
    server_trim_due(sv);
    server_arena_faults(sv);
}

ssize_t server_recv(int fd, void *rx, const char **why)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * 8)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = rx, .iov_len = KVC_PROTO_MAX_MSG};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0)
        return -errno;
    /* Descriptors first: a datagram of no bytes can carry them too (it reads as 0, like a
     * hang-up), and what it put in the daemon's table must be closed all the same. */
    if (msg.msg_controllen) {
        /* Clients send no descriptors: close whatever came and drop the client. */
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
                for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                    int pfd;
                    memcpy(&pfd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                    close(pfd);
                }
        *why = "client sent a descriptor";
        return -EPROTO;
    }
    if (n == 0)
        return 0;
    if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
        *why = "message larger than the protocol allows";
        return -EPROTO;
    }
    return n;
}

void server_on_conn(struct loop *l, int fd, uint32_t events, void *arg)
{
    struct conn *c = arg;
    struct server *sv = c->sv;
    (void)l;
    (void)fd;
    /* Busy enough for the I/O threads (server_io_note): it goes there before a read. */
    if (sv->io_on && server_io_attach(sv, c, true) == 0)
        return;
    if (events & EPOLLIN) {
        /* A few requests per wakeup, so one busy client cannot starve the others. */
        for (int k = 0; k < 8; k++) {
            const char *why = NULL;
            ssize_t n = server_recv(c->fd, sv->rx, &why);
            if (n == -EAGAIN || n == -EINTR) {
                server_trim_due(sv);
                return;
            }
            if (n <= 0) {
                server_conn_close(sv, c, why ? why : n < 0 ? strerror((int)-n) : NULL);
                return;
            }
            server_io_note(sv, c);
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
            server_notice(NULL, cfd, -EUSERS);
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
            server_notice(NULL, cfd, -EUSERS);
            close(cfd);
            free(c);
            continue;
        }
        if (!c->u || (sv->io_on ? server_io_attach(sv, c, false)
                                : loop_add(l, cfd, EPOLLIN, server_on_conn, c))) {
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
    rc = server_io_start(sv, p->io_threads);
    if (rc)
        goto fail;
    sv->io_on = sv->nio && sv->lim.io_threads_min_active == 1;
    rc = -ENOMEM;
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
    s->trim_yield = server_trim_yield;
    s->trim_yield_arg = sv;
    s->post_defer = true; /* server_handle applies a lookup's policy work after its reply */
    s->pub_defer = true;  /* and a commit's publications after the RESERVE behind it */
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
    s->trim_yield = NULL;
    s->post_defer = false;
    s->pub_defer = false;
    loop_after(l, NULL, NULL);
    if (sv && sv->fd >= 0)
        close(sv->fd);
    if (sv) {
        server_io_stop(sv);
        free(sv->ns_uid);
    }
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
    server_io_stop(sv); /* after the SHUTs the closes posted */
    sv->store->on_ready = NULL;
    sv->store->on_room = NULL;
    sv->store->on_evict = NULL;
    sv->store->trim_yield = NULL;
    store_post_flush(sv->store);
    sv->store->post_defer = false;
    store_pub_flush(sv->store, NULL, NULL);
    sv->store->pub_defer = false;
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
