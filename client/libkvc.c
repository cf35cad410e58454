/*
 * libkvc.c — the client library (see kvc.h for the API contract).
 *
 * DESIGN
 * One kvc_client is one SOCK_SEQPACKET connection. Calls take the client's mutex for the
 * whole round trip, so replies arrive in request order and are matched by request id.
 * One request is sent without waiting for its reply: kvc_put_prefix's COMMIT, quiet (the
 * daemon answers it only if it fails). It sits in c->defer until a later reply settles it:
 * its own error reply, or the reply to any later request, which the daemon sends only after
 * handling the commit (it handles a connection's requests in order). A failure is kept in
 * the client until kvc_put_prefix or kvc_flush reports it, so no call has to wait for a
 * commit and none is lost; kvc_flush sends SYNC to settle what is in flight. So a put is one
 * round trip (the RESERVE of the whole prefix), and the commit rides ahead of the next
 * request, handled in the daemon's same wake-up.
 * Arenas arrive as descriptors on the NS_OPEN reply and are mapped once; arenas up to
 * KVC_ARENA_POPULATE_MAX with MAP_POPULATE, so the first copies do not fault page by page.
 * Larger ones are mapped as they are touched: populating hundreds of GiB would take as long
 * as the daemon's own fault-in (which goes on in the background after it starts serving) and
 * cost every client process page tables for the whole arena. Every location the daemon
 * sends is checked against the mapping before it is turned into a pointer. Lookups and reservations longer
 * than one message are split into chunks.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc.h"
#include "client/kvc_fast.h"
#include "client/kvc_proto.h"
#include "client/libkvc_internal.h"
#include "kernels/kern.h"
#include "kernels/kern_dev.h"

#define KVC_LEASE_MAX_CHUNKS 8
#define KVC_ARENA_POPULATE_MAX (2ull << 30)
/* How long kvc_disconnect waits for the commits in flight. */
#define KVC_DISCONNECT_WAIT_MS 2000
/* How long kvc_lookup waits for reads from disk before giving up on them. */
#define KVC_LOOKUP_WAIT_MS 60000u

/* ---- transport ------------------------------------------------------------------------ */

/* Sends tx (header + len payload) and waits for the matching reply in rx. Returns the reply
 * status (0 or -errno from the daemon) or a transport error; *fd receives an attached
 * descriptor (or -1) when fd is not NULL. Caller holds c->mu. */
static int kvc_call(kvc_client *c, uint16_t op, uint32_t len, int *fd)
{
    return kvci_call(c, op, len, fd);
}

/* A request sent without waiting for its reply has failed (err): the first such error is
 * kept for kvc_put_prefix() or kvc_flush() to report, with the call that sent it. */
static void kvc_defer_fail(kvc_client *c, const struct kvc_defer *d, int err)
{
    if (c->defer_err)
        return;
    c->defer_err = err;
    c->defer_err_tag = d->tag;
    c->defer_err_blocks = d->expect;
}

/* If r answers a request sent without waiting, takes its verdict (kept if it failed) and
 * forgets the request: true. Else false. */
static bool kvc_defer_take(kvc_client *c, const struct kvc_msg_hdr *r)
{
    /* The daemon handles a connection's requests in order: a reply to a later request
     * means every earlier one was handled, and one that sent no reply (a quiet commit,
     * KVC_COMMIT_F_QUIET) succeeded. */
    while (c->ndefer && c->defer[0].quiet && (int32_t)(r->req_id - c->defer[0].req_id) > 0) {
        memmove(&c->defer[0], &c->defer[1], (c->ndefer - 1) * sizeof(c->defer[0]));
        c->ndefer--;
    }
    for (uint32_t i = 0; i < c->ndefer; i++) {
        struct kvc_defer *d = &c->defer[i];
        if (d->req_id != r->req_id || d->op != r->opcode)
            continue;
        int err = r->status;
        if (err == 0 && d->op == KVC_OP_COMMIT) {
            const struct kvc_commit_rep *p = (const struct kvc_commit_rep *)(r + 1);
            if (r->len != sizeof(*p) || p->committed != d->expect)
                err = -EPROTO;
        }
        if (err)
            kvc_defer_fail(c, d, err);
        memmove(d, d + 1, (c->ndefer - i - 1) * sizeof(*d));
        c->ndefer--;
        return true;
    }
    return false;
}

/* After the connection failed: the notice the daemon left before closing it (kvc_proto.h),
 * as its status, or 0. A close with our request unread flags the socket with ECONNRESET,
 * which the first read returns before the queued notice; replies to requests sent without
 * waiting may come before it too. */
static int kvc_notice(kvc_client *c)
{
    const struct kvc_msg_hdr *r = (const struct kvc_msg_hdr *)c->rx;
    for (int i = 0; i < 2 + KVC_DEFER_MAX; i++) {
        ssize_t m = recv(c->fd, c->rx, KVC_PROTO_MAX_MSG, MSG_DONTWAIT);
        if (m >= (ssize_t)sizeof(*r) && r->magic == KVC_PROTO_MAGIC && r->req_id == 0 &&
            r->status < 0)
            return r->status;
        if (m >= (ssize_t)sizeof(*r) && r->magic == KVC_PROTO_MAGIC &&
            (size_t)m == sizeof(*r) + r->len && kvc_defer_take(c, r))
            continue;
        if (m >= 0 || (errno != ECONNRESET && errno != EPIPE))
            break;
    }
    return 0;
}

/* The connection ended (rc: why): it is dead from now on. A reply that will never come to a
 * request sent without waiting counts as that request's failure. Returns rc. */
static int kvc_dead(kvc_client *c, int rc)
{
    __atomic_store_n(&c->dead, true, __ATOMIC_RELAXED); /* read without mu */
    if (c->ndefer)
        kvc_defer_fail(c, &c->defer[0], rc);
    c->ndefer = 0;
    return rc;
}

/* kvc_dead for a transport error e (negative errno), reported as the daemon's notice if it
 * left one. */
static int kvc_fail(kvc_client *c, int e)
{
    int notice = e == -ECONNRESET || e == -EPIPE ? kvc_notice(c) : 0;
    return kvc_dead(c, notice                                            ? notice
                       : e == -ECONNRESET || e == -EPIPE || e == -EPROTO ? e
                                                                         : -EPIPE);
}

/* Reads one message into c->rx. A descriptor riding along goes to *fd if fd is not NULL and
 * *fd < 0, else it is closed. Returns the message's length; -EAGAIN when nowait and none is
 * there; -ETIMEDOUT when a blocking read ran past SO_RCVTIMEO (kvc_disconnect); or a
 * transport error (-ECONNRESET at the end of the stream, -EPROTO for a malformed message).
 * Caller holds c->mu. (Polling the socket for 20-60 us before blocking, to spare this CPU a
 * wake-up, was tried in issue 16 on a 2-vCPU VM: the fastest RESERVE round trips after a
 * 16 MiB copy stayed at 30-40 us, the medians moved within the noise, and with two clients
 * one gained what the other lost, so it was left out; docs/performance.md.) */
static ssize_t kvc_recv_one(kvc_client *c, int *fd, bool nowait)
{
    const struct kvc_msg_hdr *r = (const struct kvc_msg_hdr *)c->rx;
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov;
    struct msghdr msg;
    ssize_t n;
    for (;;) {
        iov = (struct iovec){.iov_base = c->rx, .iov_len = KVC_PROTO_MAX_MSG};
        msg = (struct msghdr){.msg_iov = &iov,
                              .msg_iovlen = 1,
                              .msg_control = ctl.buf,
                              .msg_controllen = sizeof(ctl.buf)};
        n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC | (nowait ? MSG_DONTWAIT : 0));
        if (n >= 0)
            break;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        return nowait ? -EAGAIN : -ETIMEDOUT;
    }
    if (n == 0)
        return -ECONNRESET;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
            cm->cmsg_len == CMSG_LEN(sizeof(int))) {
            int got;
            memcpy(&got, CMSG_DATA(cm), sizeof(int));
            if (fd && *fd < 0)
                *fd = got;
            else
                close(got);
        }
    }
    if ((size_t)n < sizeof(*r) || r->magic != KVC_PROTO_MAGIC || r->len != (size_t)n - sizeof(*r) ||
        (msg.msg_flags & MSG_TRUNC))
        return -EPROTO;
    return n;
}

/* Sends the request in c->tx (header filled here, payload of len bytes) under a new request
 * id. 0 or a transport error. Caller holds c->mu. */
static int kvc_send(kvc_client *c, uint16_t op, uint32_t len)
{
    struct kvc_msg_hdr *h = (struct kvc_msg_hdr *)c->tx;
    ssize_t n;
    if (c->dead)
        return -EPIPE;
    if (++c->next_req == 0)
        c->next_req = 1; /* request id 0 is the daemon's notice */
    *h = (struct kvc_msg_hdr){.magic = KVC_PROTO_MAGIC,
                              .version = KVC_PROTO_VERSION,
                              .opcode = op,
                              .req_id = c->next_req,
                              .len = len};
    do
        n = send(c->fd, c->tx, sizeof(*h) + len, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n < 0 ? kvc_fail(c, errno ? -errno : -EPIPE) : 0;
}

/* Reads the replies of requests sent without waiting: those already here (wait false), or
 * every one (wait true). 0, or the error that ended the connection. Caller holds c->mu. */
static int kvc_defer_drain(kvc_client *c, bool wait)
{
    const struct kvc_msg_hdr *r = (const struct kvc_msg_hdr *)c->rx;
    while (c->ndefer) {
        ssize_t n = kvc_recv_one(c, NULL, !wait);
        if (n == -EAGAIN)
            return 0;
        if (n < 0)
            return kvc_fail(c, (int)n);
        if (r->req_id == 0 && r->status < 0) /* a notice: the daemon closes the connection */
            return kvc_dead(c, r->status);
        kvc_defer_take(c, r); /* else a reply to an earlier, abandoned request */
    }
    return 0;
}

/* Sends the request in c->tx and returns without its reply, which a later call reads
 * (kvc_defer_take): quiet if the daemon answers only a failure, expect what a COMMIT's reply
 * must say (blocks committed), tag the kvc_put_prefix call that sent it. The caller made room
 * (kvc_defer_room) before it built the request. 0 or a transport error. c->mu held. */
static int kvc_send_nowait(kvc_client *c, uint16_t op, uint32_t len, bool quiet, uint32_t expect,
                           uint64_t tag)
{
    if (c->ndefer == KVC_DEFER_MAX)
        return -EAGAIN; /* a caller that did not make room: nothing sent */
    int rc = kvc_send(c, op, len);
    if (rc)
        return rc;
    c->defer[c->ndefer++] = (struct kvc_defer){
        .req_id = c->next_req, .op = op, .quiet = quiet, .expect = expect, .tag = tag};
    return 0;
}

/* Settles every request sent without waiting: a SYNC after them when the last is quiet (its
 * reply settles the quiet ones before it, their error replies come first), then the replies
 * still to come. Overwrites c->tx. 0, or the error that ended the connection. c->mu held. */
static int kvc_defer_settle(kvc_client *c)
{
    int rc = 0;
    if (c->ndefer && c->defer[c->ndefer - 1].quiet) {
        struct kvc_sync_req *q = (struct kvc_sync_req *)((struct kvc_msg_hdr *)c->tx + 1);
        *q = (struct kvc_sync_req){0};
        rc = kvc_call(c, KVC_OP_SYNC, sizeof(*q), NULL);
    }
    return rc ? rc : kvc_defer_drain(c, true);
}

/* Room for one more request sent without waiting, before the caller builds it in c->tx: the
 * daemon never holds more than KVC_DEFER_MAX of them unread for this client. c->mu held. */
static int kvc_defer_room(kvc_client *c)
{
    return c->ndefer < KVC_DEFER_MAX ? 0 : kvc_defer_settle(c);
}

int kvci_call(kvc_client *c, uint16_t op, uint32_t len, int *fd)
{
    const struct kvc_msg_hdr *r = (const struct kvc_msg_hdr *)c->rx;
    uint32_t id;
    int rc;
    if (fd)
        *fd = -1;
    rc = kvc_send(c, op, len);
    if (rc)
        return rc;
    id = c->next_req;
    for (;;) {
        ssize_t n = kvc_recv_one(c, fd, false);
        if (n < 0 || (r->req_id == 0 && r->status < 0)) {
            /* The end of the connection, or a notice: the daemon closes it (kvc_proto.h). */
            rc = n < 0 ? kvc_fail(c, (int)n) : kvc_dead(c, r->status);
            if (fd && *fd >= 0) {
                close(*fd);
                *fd = -1;
            }
            return rc;
        }
        /* The reply to a request sent without waiting (earlier, so it comes first), or to an
         * earlier, abandoned one; or ours, which also says the quiet ones before it are done. */
        kvc_defer_take(c, r);
        if (r->req_id == id && r->opcode == op)
            return r->status;
        if (fd && *fd >= 0) {
            close(*fd);
            *fd = -1;
        }
    }
}

static void *kvc_req(kvc_client *c)
{
    return (struct kvc_msg_hdr *)c->tx + 1;
}

static const void *kvc_rep(const kvc_client *c, uint32_t *len)
{
    const struct kvc_msg_hdr *r = (const struct kvc_msg_hdr *)c->rx;
    *len = r->len;
    return r + 1;
}

void *kvci_req(kvc_client *c)
{
    return kvc_req(c);
}

const void *kvci_rep(const kvc_client *c, uint32_t *len)
{
    return kvc_rep(c, len);
}

/* ---- connection ----------------------------------------------------------------------- */

KVC_API const char *kvc_default_socket(void)
{
    static __thread char path[108];
    const char *env = getenv("KVCD_SOCKET");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (env && *env)
        snprintf(path, sizeof(path), "%s", env);
    else if (geteuid() != 0 && xdg && *xdg)
        snprintf(path, sizeof(path), "%s/kvcd.sock", xdg);
    else
        snprintf(path, sizeof(path), "/run/kvcd/kvcd.sock");
    return path;
}

KVC_API int kvc_connect(const char *path, kvc_client **out)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    kvc_client *c;
    int rc;
    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!path)
        path = kvc_default_socket();
    if (strlen(path) >= sizeof(a.sun_path))
        return -ENAMETOOLONG;
    memcpy(a.sun_path, path, strlen(path) + 1);
    c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->tx = malloc(KVC_PROTO_MAX_MSG);
    c->rx = malloc(KVC_PROTO_MAX_MSG);
    const char *nf = getenv("KVC_NO_FASTPATH");
    c->fast_off = nf && *nf && strcmp(nf, "0") != 0;
    pthread_mutex_init(&c->mu, NULL);
    c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (!c->tx || !c->rx || c->fd < 0) {
        rc = c->fd < 0 ? -errno : -ENOMEM;
        goto fail;
    }
    if (connect(c->fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        rc = -errno;
        goto fail;
    }
    struct kvc_hello_req *q = kvc_req(c);
    memset(q, 0, sizeof(*q));
    q->min_version = KVC_PROTO_VERSION;
    q->max_version = KVC_PROTO_VERSION;
    snprintf(q->client_name, sizeof(q->client_name), "libkvc");
    rc = kvc_call(c, KVC_OP_HELLO, sizeof(*q), NULL);
    if (rc)
        goto fail;
    uint32_t len;
    const struct kvc_hello_rep *p = kvc_rep(c, &len);
    if (len != sizeof(*p) || p->version != KVC_PROTO_VERSION) {
        rc = -EPROTO;
        goto fail;
    }
    c->daemon_pid = p->daemon_pid;
    c->uid = p->peer_uid;
    c->gid = p->peer_gid;
    c->conn_id = p->conn_id;
    *out = c;
    return 0;
fail:
    kvc_disconnect(c);
    return rc;
}

KVC_API void kvc_disconnect(kvc_client *c)
{
    if (!c)
        return;
    if ((c->ndefer || kvci_fast_unread(c)) && !c->dead && c->fd >= 0) {
        /* Commits in flight land anyway (the daemon handles what the connection sent before
         * its end); waiting for them, at most KVC_DISCONNECT_WAIT_MS, makes them visible to
         * every client by the time this returns. The hits still in the ring are read then
         * too, so they count for the policies. */
        struct timeval tv = {.tv_sec = KVC_DISCONNECT_WAIT_MS / 1000,
                             .tv_usec = (KVC_DISCONNECT_WAIT_MS % 1000) * 1000};
        if (setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0) {
            if (c->ndefer)
                kvc_flush(c);
            kvci_fast_flush(c);
        }
    }
    if (c->gpu_hooks)
        c->gpu_hooks->fini(c); /* before the arenas it registered are unmapped */
    if (c->fd >= 0)
        close(c->fd);
    kvci_fast_fini(c);
    for (int i = 0; i < KVC_MAX_ARENAS; i++)
        if (c->arenas[i].base)
            munmap(c->arenas[i].base, c->arenas[i].size);
    while (c->ns) {
        kvc_ns *n = c->ns;
        c->ns = n->next;
        free(n);
    }
    pthread_mutex_destroy(&c->mu);
    free(c->tx);
    free(c->rx);
    free(c);
}

KVC_API int kvc_peer_info(const kvc_client *c, uint32_t *daemon_pid, uint32_t *uid, uint32_t *gid)
{
    if (!c)
        return -EINVAL;
    if (daemon_pid)
        *daemon_pid = c->daemon_pid;
    if (uid)
        *uid = c->uid;
    if (gid)
        *gid = c->gid;
    return 0;
}

KVC_API const char *kvc_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
    case -ENOENT:
        return "not found (no daemon at the socket path, or unknown namespace)";
    case -ECONNREFUSED:
        return "no daemon listening at the socket path";
    case -EPIPE:
    case -ECONNRESET:
        return "connection to kvcd lost";
    case -EPROTO:
        return "protocol error (version mismatch or malformed message)";
    case -EEXIST:
        return "model id exists with a different layout";
    case -ENOSPC:
        return "no room in the cache (everything pinned) or table full";
    case -EMFILE:
        return "too many open leases or reservations on this connection";
    case -E2BIG:
        return "too many keys in one request";
    case -EUSERS:
        return "kvcd refused the connection (server.max_clients or max_clients_per_uid)";
    case -ETIMEDOUT:
        return "timed out (a reservation older than server.reservation_timeout, or a connection "
               "closed for idleness)";
    case -EDQUOT:
        return "over a quota (pins, reservations, reserved share or namespaces)";
    case -EACCES:
        return "not allowed by the namespace's access list";
    case -EPERM:
        return "admin request refused (not root, kvcd's user or its admin group)";
    case -EROFS:
        return "the option cannot change while kvcd runs (restart kvcd to apply it)";
    case -EBUSY:
        return "in use (pinned, reserved or moving blocks, or a WAIT already pending)";
    default:
        return err < 0 ? strerror(-err) : "unknown error";
    }
}

/* ---- namespaces ----------------------------------------------------------------------- */

static const uint32_t kvc_dtype_ok[] = {KVC_DTYPE_FP16, KVC_DTYPE_BF16, KVC_DTYPE_FP32,
                                        KVC_DTYPE_FP8_E4M3, KVC_DTYPE_INT8};

static int kvc_ns_open_flags(kvc_client *c, const struct kvc_layout *layout, uint32_t flags,
                             uint32_t window, kvc_ns **out);

KVC_API int kvc_ns_open(kvc_client *c, const struct kvc_layout *layout, kvc_ns **out)
{
    return kvc_ns_open_flags(c, layout, 0, 0, out);
}

KVC_API int kvc_ns_open_window(kvc_client *c, const struct kvc_layout *layout,
                               uint32_t window_tokens, kvc_ns **out)
{
    if (!layout || layout->kv_kind != KVC_KV_KIND_KV_WINDOW || window_tokens == 0)
        return -EINVAL;
    return kvc_ns_open_flags(c, layout, 0, window_tokens, out);
}

KVC_API int kvc_ns_open_quant(kvc_client *c, const struct kvc_layout *layout,
                              const struct kvc_quant *q, kvc_ns **out)
{
    if (!q || q->allowed > 0xffu || (unsigned)q->k_codec > 15 || (unsigned)q->v_codec > 15 ||
        q->raw_layers > 0xffu)
        return -EINVAL;
    return kvc_ns_open_flags(
        c, layout, KVC_WIRE_QUANT_FLAGS(q->allowed, q->k_codec, q->v_codec, q->raw_layers), 0, out);
}

static int kvc_ns_open_flags(kvc_client *c, const struct kvc_layout *layout, uint32_t flags,
                             uint32_t window, kvc_ns **out)
{
    struct kvc_ns_open_req *q;
    struct kvc_wire_layout wl;
    kvc_ns *ns = NULL;
    int fd = -1, rc;
    bool dtype_ok = false;
    if (!c || !layout || !out || !layout->model_id)
        return -EINVAL;
    *out = NULL;
    if (strlen(layout->model_id) == 0 || strlen(layout->model_id) >= KVC_PROTO_MODEL_ID_MAX)
        return -EINVAL;
    for (size_t i = 0; i < sizeof(kvc_dtype_ok) / sizeof(kvc_dtype_ok[0]); i++)
        dtype_ok |= layout->dtype == kvc_dtype_ok[i];
    if (!dtype_ok || layout->kv_kind < KVC_KV_KIND_KV || layout->kv_kind > KVC_KV_KIND_STATE ||
        (layout->kv_kind == KVC_KV_KIND_KV_WINDOW) != (window != 0) || window > UINT16_MAX)
        return -EINVAL;
    memset(&wl, 0, sizeof(wl));
    memcpy(wl.model_id, layout->model_id, strlen(layout->model_id));
    wl.layers = layout->layers;
    wl.kv_heads = layout->kv_heads;
    wl.head_dim = layout->head_dim;
    wl.block_tokens = layout->block_tokens;
    wl.dtype = (uint8_t)layout->dtype;
    wl.kv_kind = (uint8_t)layout->kv_kind;
    wl.window_tokens = (uint16_t)window;
    wl.flags = flags;

    pthread_mutex_lock(&c->mu);
    q = kvc_req(c);
    q->layout = wl;
    rc = kvc_call(c, KVC_OP_NS_OPEN, sizeof(*q), &fd);
    if (rc)
        goto out;
    uint32_t len;
    const struct kvc_ns_open_rep *p = kvc_rep(c, &len);
    if (len != sizeof(*p) || p->arena_id >= KVC_MAX_ARENAS || p->block_bytes == 0 ||
        p->block_bytes > p->arena_bytes || p->arena_bytes > SIZE_MAX) {
        rc = -EPROTO;
        goto out;
    }
    struct kvc_arena *a = &c->arenas[p->arena_id];
    if (fd >= 0 && !a->base) {
        bool w = p->access & KVC_ACCESS_WRITE;
        int populate = p->arena_bytes <= KVC_ARENA_POPULATE_MAX ? MAP_POPULATE : 0;
        void *m = mmap(NULL, p->arena_bytes, PROT_READ | (w ? PROT_WRITE : 0),
                       MAP_SHARED | populate, fd, 0);
        if (m == MAP_FAILED) {
            rc = -errno;
            goto out;
        }
        a->base = m;
        a->size = p->arena_bytes;
        a->writable = w;
    }
    if (!a->base || a->size != p->arena_bytes) {
        rc = -EPROTO; /* the daemon owes us this arena's descriptor */
        goto out;
    }
    for (ns = c->ns; ns && ns->id != p->ns_id; ns = ns->next)
        ;
    if (!ns) {
        ns = calloc(1, sizeof(*ns));
        if (!ns) {
            rc = -ENOMEM;
            goto out;
        }
        ns->c = c;
        ns->id = p->ns_id;
        ns->arena = p->arena_id;
        ns->block_bytes = p->block_bytes;
        ns->block_tokens = wl.block_tokens;
        ns->layout = wl;
        ns->salt = kvc_layout_salt(&wl);
        ns->fast_lay = kvc_fast_layout_id(&wl);
        ns->next = c->ns;
        c->ns = ns;
    }
    *out = ns;
out:
    if (fd >= 0)
        close(fd); /* the mapping keeps the arena */
    pthread_mutex_unlock(&c->mu);
    return rc;
}

KVC_API int kvc_ns_kind(const kvc_ns *ns)
{
    return ns ? ns->layout.kv_kind : -EINVAL;
}

KVC_API uint32_t kvc_ns_window_tokens(const kvc_ns *ns)
{
    return ns ? ns->layout.window_tokens : 0;
}

KVC_API size_t kvc_ns_block_bytes(const kvc_ns *ns)
{
    return ns ? (size_t)ns->block_bytes : 0;
}

KVC_API uint32_t kvc_ns_block_tokens(const kvc_ns *ns)
{
    return ns ? ns->block_tokens : 0;
}

KVC_API uint32_t kvc_ns_id(const kvc_ns *ns)
{
    return ns ? ns->id : 0;
}

/* Turns a daemon location into a pointer after checking it lies inside the mapping. */
static uint8_t *kvc_loc_ptr(const kvc_ns *ns, const struct kvc_wire_loc *l)
{
    const struct kvc_arena *a;
    const kvc_client *c = ns->c;
    if (l->tier == KVC_WIRE_TIER_GPU) {
        if (!c->gpu_base || l->arena_id != c->gpu_arena || l->length < ns->block_bytes ||
            l->offset > c->gpu_size || ns->block_bytes > c->gpu_size - l->offset)
            return NULL;
        return c->gpu_base + l->offset;
    }
    if (l->tier != KVC_WIRE_TIER_HOST || l->arena_id >= KVC_MAX_ARENAS)
        return NULL;
    a = &ns->c->arenas[l->arena_id];
    /* a raw block fills block_bytes; a quantized one is its (smaller) stored length */
    uint64_t need = l->format == KVC_WIRE_FORMAT_RAW ? ns->block_bytes : l->length;
    if (!a->base || l->length < need || need == 0 || l->offset > a->size ||
        need > a->size - l->offset)
        return NULL;
    return a->base + l->offset;
}

/* ---- reading -------------------------------------------------------------------------- */

static void kvc_kern_layout(const kvc_ns *ns, struct kern_layout *kl)
{
    *kl = (struct kern_layout){.layers = ns->layout.layers,
                               .heads = ns->layout.kv_heads,
                               .head_dim = ns->layout.head_dim,
                               .tokens = ns->layout.block_tokens,
                               .dtype = ns->layout.dtype,
                               .k_only = ns->layout.kv_kind == KVC_WIRE_KV_KIND_K_ONLY};
}

static uint64_t kvc_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Adds the time of one copy out of the arena to the lease (several threads may copy from
 * one lease; the lease is otherwise read-only to them, hence the cast and the atomic). */
static void kvc_lease_account(const kvc_lease *l, uint64_t t0)
{
    __atomic_fetch_add(&((kvc_lease *)l)->load_ns, kvc_mono_ns() - t0, __ATOMIC_RELAXED);
}

static int kvc_release_ids(kvc_client *c, const uint64_t *ids, size_t n, uint64_t load_ns)
{
    struct kvc_release_req *q = kvc_req(c);
    uint64_t us = load_ns / 1000;
    memset(q, 0, sizeof(*q));
    q->nleases = (uint32_t)n;
    q->load_us = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
    memcpy(q + 1, ids, n * sizeof(uint64_t));
    return kvc_call(c, KVC_OP_RELEASE, (uint32_t)(sizeof(*q) + n * sizeof(uint64_t)), NULL);
}

/* WAIT on one lease; fills *rep. Caller holds c->mu. */
static int kvc_wait_id(kvc_client *c, uint64_t id, uint32_t timeout_ms, struct kvc_wait_rep *rep)
{
    struct kvc_wait_req *q = kvc_req(c);
    uint32_t len;
    int rc;
    *q = (struct kvc_wait_req){.lease_id = id, .timeout_ms = timeout_ms};
    rc = kvc_call(c, KVC_OP_WAIT, sizeof(*q), NULL);
    if (rc)
        return rc;
    const struct kvc_wait_rep *p = kvc_rep(c, &len);
    if (len != sizeof(*p) || p->nready > p->nhit)
        return -EPROTO;
    *rep = *p;
    return 0;
}

/* Waits for the hits of l still being read; trims l to the leading ready hits once no read
 * is left. Returns the leading ready hits. Caller holds c->mu. */
static int kvc_lease_wait_locked(kvc_lease *l, uint32_t timeout_ms)
{
    kvc_client *c = l->ns->c;
    size_t ready = 0, first = 0;
    bool pending = false;
    for (size_t k = 0; k < l->nids; k++) {
        struct kvc_wait_rep rep;
        size_t nk = 0;
        bool any = false;
        for (size_t i = first; i < l->n && l->hits[i].chunk == k; i++, nk++)
            any |= !l->hits[i].ready;
        if (any) {
            int rc = kvc_wait_id(c, l->ids[k], timeout_ms, &rep);
            if (rc)
                return rc;
            for (size_t i = 0; i < nk; i++)
                l->hits[first + i].ready = i < rep.nready;
            if (rep.pending)
                pending = true;
        }
        first += nk;
    }
    while (ready < l->n && l->hits[ready].ready)
        ready++;
    /* A read that failed (checksum, I/O) ends the prefix: what follows is a miss. */
    if (!pending)
        l->n = ready;
    return (int)ready;
}

/* Tries of a window's or a state's lookup whose reads failed, the last of the local tiers. */
#define KVC_LOOKUP_SPAN_TRIES 4

KVC_API int kvc_lookup(kvc_ns *ns, const struct kvc_key *keys, size_t n, unsigned flags,
                       kvc_lease **out)
{
    kvc_client *c;
    kvc_lease *l;
    int rc = 0;
    if (!ns || !out || (!keys && n) ||
        (flags & ~(KVC_LOOKUP_READY_ONLY | KVC_LOOKUP_NOWAIT | KVC_LOOKUP_GPU)))
        return -EINVAL;
    *out = NULL;
    if (n == 0)
        return 0;
    if (n > (size_t)KVC_LEASE_MAX_CHUNKS * KVC_PROTO_MAX_KEYS)
        return -E2BIG;
    /* A window's or a state's span is found over every key at once: one request. */
    bool span = ns->layout.kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW ||
                ns->layout.kv_kind == KVC_WIRE_KV_KIND_STATE;
    uint32_t tries = 0, local = 0; /* KVC_LOOKUP_F_LOCAL on the last try of a span */
    bool window = ns->layout.kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW;
    size_t w = window ? kvc_wire_window_blocks(&ns->layout) : 1, end;
    c = ns->c;
    l = calloc(1, sizeof(*l) + n * sizeof(l->hits[0]));
    if (!l)
        return -ENOMEM;
    l->ns = ns;
    pthread_mutex_lock(&c->mu);
again:
    end = n;
    for (size_t done = 0; done < n;) {
        uint32_t chunk = n - done > KVC_PROTO_MAX_KEYS ? KVC_PROTO_MAX_KEYS : (uint32_t)(n - done);
        size_t at = done;
        struct kvc_lookup_req *q = kvc_req(c);
        uint32_t len;
        if (span) {
            /* A window's or a state's span is searched from the end: keys[at..end), the
             * last ones whose prefixes are not judged yet; a window's judged where all its
             * blocks are among them (base: their position). */
            at = end > KVC_PROTO_MAX_KEYS ? end - KVC_PROTO_MAX_KEYS : 0;
            chunk = (uint32_t)(end - at);
        }
        memset(q, 0, sizeof(*q));
        q->ns_id = ns->id;
        q->nkeys = chunk;
        q->base = window ? (uint32_t)at : 0;
        q->flags = (flags & KVC_LOOKUP_READY_ONLY) ? KVC_LOOKUP_F_READY_ONLY : 0;
        if ((flags & KVC_LOOKUP_GPU) && c->gpu_base) /* else host locations only */
            q->flags |= KVC_LOOKUP_F_GPU;
        q->flags |= local;
        memcpy(q + 1, keys + at, chunk * sizeof(struct kvc_key));
        rc = kvc_call(c, KVC_OP_LOOKUP, (uint32_t)(sizeof(*q) + chunk * sizeof(struct kvc_key)),
                      NULL);
        if (rc)
            break;
        const struct kvc_lookup_rep *p = kvc_rep(c, &len);
        if (len < sizeof(*p) || p->nhit > chunk ||
            len != sizeof(*p) + (size_t)p->nhit * sizeof(struct kvc_wire_loc) ||
            (p->nhit > 0) != (p->lease_id != 0) || (p->first && !span) ||
            p->first > chunk - p->nhit) {
            rc = -EPROTO;
            break;
        }
        l->first = at + p->first;
        if (p->lease_id)
            l->ids[l->nids++] = p->lease_id;
        const struct kvc_wire_loc *locs = (const struct kvc_wire_loc *)(p + 1);
        for (uint32_t i = 0; i < p->nhit; i++) {
            uint8_t *ptr = kvc_loc_ptr(ns, &locs[i]);
            if (!ptr) {
                rc = -EPROTO;
                break;
            }
            if (locs[i].format >= KVC_WIRE_FORMAT_COUNT) {
                rc = -EPROTO;
                break;
            }
            l->hits[l->n++] = (struct kvc_hit){
                .data = ptr,
                .len = locs[i].format == KVC_WIRE_FORMAT_RAW ? ns->block_bytes : locs[i].length,
                .format = locs[i].format,
                .tier = locs[i].tier,
                .chunk = (uint32_t)(l->nids - 1),
                .ready = (locs[i].flags & KVC_LOC_F_READY) != 0};
        }
        if (span && !rc && !p->nhit && at > 0) {
            /* None there: the prefixes left end before at + w (a window reaching before
             * keys[at]) or at at (a state); w <= KVC_PROTO_MAX_WINDOW_BLOCKS, so each
             * request moves the end back by more than half a request. */
            end = at + w - 1;
            continue;
        }
        if (rc || p->nhit < chunk || span)
            break;
        done += chunk;
    }
    /* Unless asked not to, hits read from disk are waited for here, so that every hit
     * handed out is readable. */
    if (rc == 0 && !(flags & KVC_LOOKUP_NOWAIT) && l->n) {
        size_t asked = l->n;
        int r = kvc_lease_wait_locked(l, KVC_LOOKUP_WAIT_MS);
        if (r < 0) {
            rc = r;
        } else if (span && l->n < asked) {
            /* A read of a window's or a state's span failed (not in the remote tier after
             * all, a record refused, a checksum): what is left is no prefix's span. Asked
             * again: the daemon knows those keys missing now and answers a shorter prefix;
             * the last try of the local tiers alone. */
            if (!c->dead)
                kvc_release_ids(c, l->ids, l->nids, 0);
            l->n = l->nids = l->first = 0;
            if (!local) {
                local = ++tries < KVC_LOOKUP_SPAN_TRIES ? 0 : KVC_LOOKUP_F_LOCAL;
                goto again;
            }
        }
    }
    if ((rc || l->n == 0) && l->nids && !c->dead)
        kvc_release_ids(c, l->ids, l->nids, 0);
    pthread_mutex_unlock(&c->mu);
    if (rc || l->n == 0) {
        free(l);
        return rc;
    }
    *out = l;
    return (int)l->n;
}

KVC_API int kvc_hint(kvc_ns *ns, unsigned kind, const struct kvc_key *keys, const float *scores,
                     size_t n)
{
    kvc_client *c;
    uint32_t len;
    int rc;
    if (!ns || (kind != KVC_HINT_ATTENTION && kind != KVC_HINT_SNAPKV) ||
        (n && (!keys || !scores)) || n > KVC_HINT_MAX)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!(scores[i] >= 0) || scores[i] > 3.4e38f)
            return -EINVAL;
    if (n == 0)
        return 0;
    c = ns->c;
    pthread_mutex_lock(&c->mu);
    struct kvc_hint_req *q = kvc_req(c);
    struct kvc_wire_hint *h = (struct kvc_wire_hint *)(q + 1);
    *q = (struct kvc_hint_req){.ns_id = ns->id,
                               .kind = kind == KVC_HINT_ATTENTION ? KVC_HINT_H2O : KVC_HINT_SNAPKV,
                               .nhints = (uint32_t)n};
    for (size_t i = 0; i < n; i++) {
        memcpy(&h[i].key, &keys[i], sizeof(h[i].key));
        h[i].score = scores[i];
        h[i].pad = 0;
    }
    rc = kvc_call(c, KVC_OP_HINT, (uint32_t)(sizeof(*q) + n * sizeof(*h)), NULL);
    if (rc == 0) {
        const struct kvc_hint_rep *p = kvc_rep(c, &len);
        rc = len == sizeof(*p) && p->applied <= n ? (int)p->applied : -EPROTO;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Policy numbers of LOOKUP_BUDGET: the daemon's order (kvcctl policy). */
static const char *const kvc_policy_names[] = {"lru",    "lfu",     "prefix", "streaming", "h2o",
                                               "snapkv", "keynorm", "quest",  "default"};

KVC_API int kvc_lookup_budget(kvc_ns *ns, const struct kvc_key *keys, size_t n,
                              const struct kvc_budget *b, size_t *pos, size_t *nprefix,
                              kvc_lease **out)
{
    kvc_client *c;
    kvc_lease *l = NULL;
    uint32_t policy = KVC_POLICY_NS, len;
    int rc;
    if (out)
        *out = NULL;
    if (nprefix)
        *nprefix = 0;
    if (!ns || !b || !out || !pos || (!keys && n) || b->budget == 0 || n > KVC_PROTO_MAX_KEYS ||
        (b->query_dim && (!b->query || b->query_dim != ns->layout.head_dim)))
        return -EINVAL;
    if (b->policy) {
        for (policy = 0; policy < sizeof(kvc_policy_names) / sizeof(kvc_policy_names[0]); policy++)
            if (strcmp(b->policy, kvc_policy_names[policy]) == 0)
                break;
        if (policy == sizeof(kvc_policy_names) / sizeof(kvc_policy_names[0]))
            return -EINVAL;
    }
    if (n == 0)
        return 0;
    c = ns->c;
    pthread_mutex_lock(&c->mu);
    struct kvc_lookup_budget_req *q = kvc_req(c);
    *q = (struct kvc_lookup_budget_req){
        .ns_id = ns->id,
        .nkeys = (uint32_t)n,
        .budget = b->budget > KVC_PROTO_MAX_KEYS ? KVC_PROTO_MAX_KEYS : (uint32_t)b->budget,
        .policy = policy,
        .qdim = (uint32_t)b->query_dim,
        .sinks = b->sinks,
        .recent = b->recent};
    memcpy(q + 1, keys, n * sizeof(struct kvc_wire_key));
    if (b->query_dim)
        memcpy((struct kvc_wire_key *)(q + 1) + n, b->query, b->query_dim * sizeof(float));
    rc = kvc_call(
        c, KVC_OP_LOOKUP_BUDGET,
        (uint32_t)(sizeof(*q) + n * sizeof(struct kvc_wire_key) + b->query_dim * sizeof(float)),
        NULL);
    if (rc)
        goto out;
    const struct kvc_lookup_budget_rep *p = kvc_rep(c, &len);
    const struct kvc_wire_sel *sel = (const struct kvc_wire_sel *)(p + 1);
    if (len < sizeof(*p) || p->nsel > b->budget || p->nsel > p->nprefix || p->nprefix > n ||
        len != sizeof(*p) + (size_t)p->nsel * sizeof(*sel) || (p->nsel > 0) != (p->lease_id != 0)) {
        rc = -EPROTO;
        goto out;
    }
    if (nprefix)
        *nprefix = p->nprefix;
    if (p->nsel == 0)
        goto out;
    l = calloc(1, sizeof(*l) + p->nsel * sizeof(l->hits[0]));
    if (!l) {
        kvc_release_ids(c, &p->lease_id, 1, 0);
        rc = -ENOMEM;
        goto out;
    }
    l->ns = ns;
    l->ids[l->nids++] = p->lease_id;
    for (uint32_t i = 0; i < p->nsel; i++) {
        uint8_t *ptr = kvc_loc_ptr(ns, &sel[i].loc);
        if (!ptr || sel[i].loc.format >= KVC_WIRE_FORMAT_COUNT || sel[i].pos >= p->nprefix ||
            (i && sel[i].pos <= sel[i - 1].pos)) {
            rc = -EPROTO;
            break;
        }
        pos[i] = sel[i].pos;
        l->hits[l->n++] = (struct kvc_hit){
            .data = ptr,
            .len = sel[i].loc.format == KVC_WIRE_FORMAT_RAW ? ns->block_bytes : sel[i].loc.length,
            .format = sel[i].loc.format,
            .tier = sel[i].loc.tier,
            .chunk = 0,
            .ready = (sel[i].loc.flags & KVC_LOC_F_READY) != 0};
    }
    if (rc) {
        kvc_release_ids(c, l->ids, l->nids, 0);
        free(l);
        l = NULL;
        goto out;
    }
    *out = l;
    rc = (int)l->n;
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}

KVC_API int kvc_lease_ready(const kvc_lease *l)
{
    size_t i = 0;
    if (!l)
        return -EINVAL;
    while (i < l->n && l->hits[i].ready)
        i++;
    return (int)i;
}

KVC_API int kvc_lease_wait(kvc_lease *l, unsigned timeout_ms)
{
    kvc_client *c;
    int rc;
    if (!l)
        return -EINVAL;
    c = l->ns->c;
    pthread_mutex_lock(&c->mu);
    rc = kvc_lease_wait_locked(l, timeout_ms);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

KVC_API size_t kvc_lease_count(const kvc_lease *l)
{
    return l ? l->n : 0;
}

KVC_API size_t kvc_lease_first(const kvc_lease *l)
{
    return l ? l->first : 0;
}

KVC_API const void *kvc_lease_data(const kvc_lease *l, size_t i)
{
    return l && i < l->n ? l->hits[i].data : NULL;
}

KVC_API int kvc_lease_copy(const kvc_lease *l, size_t i, void *dst, size_t len)
{
    if (!l || !dst)
        return -EINVAL;
    if (i >= l->n)
        return -ERANGE;
    if (len < l->ns->block_bytes)
        return -EINVAL;
    uint64_t t0 = kvc_mono_ns();
    if (l->hits[i].tier == KVC_WIRE_TIER_GPU && l->hits[i].format == KVC_WIRE_FORMAT_RAW) {
        int grc =
            l->ns->c->gpu_hooks->copy_sync(l->ns->c, dst, l->hits[i].data, l->ns->block_bytes);
        kvc_lease_account(l, t0);
        return grc;
    }
    if (l->hits[i].format == KVC_WIRE_FORMAT_RAW) {
        kvci_copy_from_arena(dst, l->hits[i].data, l->ns->block_bytes);
        kvc_lease_account(l, t0);
        return 0;
    }
    /* Writers of the arena can change these bytes while we read them: the header and
     * section table are checked and then used, so they are parsed from a private copy. */
    struct kern_layout kl;
    size_t n = l->hits[i].len;
    void *priv = malloc(n ? n : 1);
    if (!priv)
        return -ENOMEM;
    memcpy(priv, l->hits[i].data, n);
    kvc_kern_layout(l->ns, &kl);
    int64_t rc = kern_decode_cpu(&kl, priv, n, dst, len, (enum kern_dtype)kl.dtype);
    free(priv);
    kvc_lease_account(l, t0);
    return rc < 0 ? (int)rc : 0;
}

KVC_API int kvc_lease_stored(const kvc_lease *l, size_t i, const void **data, size_t *len)
{
    if (!l || !data || !len)
        return -EINVAL;
    if (i >= l->n)
        return -ERANGE;
    *data = l->hits[i].data;
    *len = l->hits[i].len;
    if (l->hits[i].format != KVC_WIRE_FORMAT_RAW) {
        int64_t n = kern_block_info(l->hits[i].data, l->hits[i].len, NULL, NULL);
        if (n > 0)
            *len = (size_t)n;
    }
    return l->hits[i].format;
}

KVC_API int kvc_lease_copy_cuda(const kvc_lease *l, size_t i, void *dst_dev, size_t len,
                                void *stream)
{
    struct kern_layout kl;
    void *scratch = NULL;
    int rc;
    if (!l || !dst_dev)
        return -EINVAL;
    if (i >= l->n)
        return -ERANGE;
    if (len < l->ns->block_bytes)
        return -EINVAL;
    /* A raw hit from an attached client is queued and tracked on the lease (kvc_release
     * waits for it); a pool hit is device memory, so the copy is device to device. The
     * lease's record of queued work is the only state that changes. */
    if (l->hits[i].format == KVC_WIRE_FORMAT_RAW && l->ns->c->gpu_hooks)
        return l->ns->c->gpu_hooks->lease_copy(
            (kvc_lease *)l, i, dst_dev,
            l->hits[i].tier == KVC_WIRE_TIER_GPU ? KERN_DEV_COPY_D2D : KERN_DEV_COPY_H2D, stream);
    if (l->ns->c->gpu_hooks && l->hits[i].tier != KVC_WIRE_TIER_GPU)
        return l->ns->c->gpu_hooks->lease_decode((kvc_lease *)l, i, dst_dev, stream);
    if (l->hits[i].tier == KVC_WIRE_TIER_GPU)
        return -ENOTSUP; /* only an attached client has pool hits */
    if (!(kern_supports() & KERN_SUPPORT_CUDA_BUILT))
        return -ENOTSUP;
    if (l->hits[i].format == KVC_WIRE_FORMAT_RAW) {
        /* Nothing tracks it on the lease: it has landed before the call returns. */
        rc = kern_cuda_copy(dst_dev, l->hits[i].data, l->ns->block_bytes, KERN_CUDA_H2D, stream);
        return rc ? rc : kern_cuda_stream_sync(stream);
    }
    /* the stored (2-4x smaller) block crosses PCIe, the GPU dequantizes it */
    size_t n = l->hits[i].len;
    kvc_kern_layout(l->ns, &kl);
    rc = kern_cuda_alloc(&scratch, n);
    if (rc)
        goto out;
    rc = kern_cuda_copy(scratch, l->hits[i].data, n, KERN_CUDA_H2D, stream);
    if (rc)
        goto out;
    int64_t d = kern_decode_cuda(&kl, scratch, n, dst_dev, len, (enum kern_dtype)kl.dtype, stream);
    rc = d < 0 ? (int)d : kern_cuda_stream_sync(stream);
out:
    kern_cuda_free(scratch);
    return rc;
}

KVC_API int kvc_release(kvc_lease *l)
{
    kvc_client *c;
    int rc;
    if (!l)
        return 0;
    c = l->ns->c;
    int wrc = 0;
    if (l->gpu.nev || l->gpu.scratch || l->gpu.err) /* copies out of the pins first */
        wrc = c->gpu_hooks->wait(c, &l->gpu);
    pthread_mutex_lock(&c->mu);
    rc = l->nids
             ? kvc_release_ids(c, l->ids, l->nids, __atomic_load_n(&l->load_ns, __ATOMIC_RELAXED))
             : 0;
    pthread_mutex_unlock(&c->mu);
    free(l);
    return wrc ? wrc : rc;
}

/* ---- writing -------------------------------------------------------------------------- */

KVC_API int kvc_reserve(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                        size_t n, kvc_resv **out)
{
    return kvci_reserve_flags(ns, parent, keys, n, 0, out);
}

/* ABORT of reservation id. Caller holds c->mu. */
static int kvc_abort_id(kvc_client *c, uint64_t id)
{
    struct kvc_abort_req *q = kvc_req(c);
    q->resv_id = id;
    return kvc_call(c, KVC_OP_ABORT, sizeof(*q), NULL);
}

/* kvci_reserve_flags with c->mu held by the caller; *out NULL on error. */
static int kvc_reserve_locked(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                              size_t n, uint32_t flags, kvc_resv **out)
{
    kvc_client *c = ns->c;
    kvc_resv *r;
    uint32_t len;
    int rc;
    *out = NULL;
    r = calloc(1, sizeof(*r) + n * sizeof(r->slots[0]));
    if (!r)
        return -ENOMEM;
    r->ns = ns;
    r->n = n;
    struct kvc_reserve_req *q = kvc_req(c);
    memset(q, 0, sizeof(*q));
    q->ns_id = ns->id;
    q->flags = c->gpu_base ? flags & KVC_RESERVE_F_GPU : 0;
    q->nkeys = (uint32_t)n;
    if (parent) {
        q->parent.lo = parent->lo;
        q->parent.hi = parent->hi;
    }
    memcpy(q + 1, keys, n * sizeof(struct kvc_key));
    rc = kvc_call(c, KVC_OP_RESERVE, (uint32_t)(sizeof(*q) + n * sizeof(struct kvc_key)), NULL);
    if (rc)
        goto out;
    const struct kvc_reserve_rep *p = kvc_rep(c, &len);
    const struct kvc_wire_slot_rep *slots = (const struct kvc_wire_slot_rep *)(p + 1);
    if (len < sizeof(*p) || p->nkeys != n ||
        len != sizeof(*p) + n * sizeof(struct kvc_wire_slot_rep) || p->nreserved > n ||
        (p->nreserved > 0) != (p->resv_id != 0)) {
        rc = -EPROTO;
        goto out;
    }
    r->id = p->resv_id;
    for (size_t i = 0; i < n; i++) {
        r->slots[i].status = slots[i].status;
        if (slots[i].status < KVC_SLOT_PRESENT || slots[i].status > KVC_SLOT_NOSPACE) {
            rc = -EPROTO;
            break;
        }
        if (slots[i].status == KVC_SLOT_RESERVED) {
            r->slots[i].tier = slots[i].loc.tier;
            if ((slots[i].loc.tier == KVC_WIRE_TIER_HOST && !c->arenas[ns->arena].writable) ||
                (slots[i].loc.tier == KVC_WIRE_TIER_GPU && !(q->flags & KVC_RESERVE_F_GPU)) ||
                !(r->slots[i].data = kvc_loc_ptr(ns, &slots[i].loc))) {
                rc = -EPROTO;
                break;
            }
            r->nreserved++;
        }
    }
    if (rc == 0 && r->nreserved != p->nreserved)
        rc = -EPROTO;
    if (rc && r->id && !c->dead)
        kvc_abort_id(c, r->id);
out:
    if (rc) {
        free(r);
        return rc;
    }
    *out = r;
    return (int)r->nreserved;
}

int kvci_reserve_flags(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                       size_t n, uint32_t flags, kvc_resv **out)
{
    int rc;
    if (!ns || !out || !keys || n == 0)
        return -EINVAL;
    *out = NULL;
    if (n > KVC_PROTO_MAX_KEYS)
        return -E2BIG;
    pthread_mutex_lock(&ns->c->mu);
    rc = kvc_reserve_locked(ns, parent, keys, n, flags, out);
    pthread_mutex_unlock(&ns->c->mu);
    return rc;
}

KVC_API int kvc_resv_status(const kvc_resv *r, size_t i)
{
    if (!r)
        return -EINVAL;
    return i < r->n ? r->slots[i].status : -ERANGE;
}

KVC_API void *kvc_resv_data(kvc_resv *r, size_t i)
{
    return r && i < r->n ? r->slots[i].data : NULL;
}

KVC_API int kvc_resv_write(kvc_resv *r, size_t i, const void *src, size_t len)
{
    if (!r || !src)
        return -EINVAL;
    if (i >= r->n)
        return -ERANGE;
    if (!r->slots[i].data || len != r->ns->block_bytes)
        return -EINVAL;
    if (r->slots[i].tier == KVC_WIRE_TIER_GPU) {
        int rc = r->ns->c->gpu_hooks->copy_sync(r->ns->c, r->slots[i].data, src, len);
        return rc ? rc : kvci_resv_layers_mark(r, i, 1, 0, r->ns->layout.layers);
    }
    kvci_copy_to_arena(r->slots[i].data, src, len);
    return kvci_resv_layers_mark(r, i, 1, 0, r->ns->layout.layers);
}

/* ---- layer-wise puts ---------------------------------------------------------------------
 * A slot may be written layer by layer (kvc_resv_gather_layers). Nothing is tracked until a
 * gather writes only some layers of a slot; from then on each slot of the reservation has a
 * bitmap of the layers written, and kvc_commit() refuses (-EBUSY, nothing done) to publish a
 * slot some of whose layers were written and others not: its bytes would mix this put's
 * layers with whatever the slot held before. */

int kvci_resv_layers_mark(kvc_resv *r, size_t first, size_t n, uint32_t lf, uint32_t lc)
{
    kvc_client *c = r->ns->c;
    const uint32_t layers = r->ns->layout.layers;
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    if (!r->layer_bits && lc < layers) {
        r->layer_words = (layers + 63) / 64;
        r->layer_bits = calloc(r->n ? r->n : 1, r->layer_words * sizeof(uint64_t));
        if (!r->layer_bits)
            rc = -ENOMEM;
    }
    for (size_t j = first; rc == 0 && r->layer_bits && j < first + n; j++) {
        if (!r->slots[j].data)
            continue;
        uint64_t *bits = r->layer_bits + j * r->layer_words;
        for (uint32_t x = lf; x < lf + lc; x++)
            bits[x / 64] |= 1ull << (x % 64);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* 1 when a slot among the first n reserved ones has some layers written and not all. */
static int kvc_resv_partial(kvc_resv *r, size_t n)
{
    const uint32_t layers = r->ns->layout.layers;
    int partial = 0;
    pthread_mutex_lock(&r->ns->c->mu);
    for (size_t j = 0, k = 0; r->layer_bits && j < r->n && k < n && !partial; j++) {
        if (!r->slots[j].data)
            continue;
        k++;
        const uint64_t *bits = r->layer_bits + j * r->layer_words;
        uint32_t set = 0;
        for (uint32_t w = 0; w < r->layer_words; w++)
            set += (uint32_t)__builtin_popcountll(bits[w]);
        partial = set != 0 && set != layers;
    }
    pthread_mutex_unlock(&r->ns->c->mu);
    return partial;
}

KVC_API int kvc_commit(kvc_resv *r, size_t n)
{
    kvc_client *c;
    uint32_t len;
    int rc;
    if (!r)
        return -EINVAL;
    c = r->ns->c;
    if (kvc_resv_partial(r, n))
        return -EBUSY; /* a slot written layer by layer, not all its layers yet */
    if (r->gpu.nev || r->gpu.scratch || r->gpu.err) {
        /* The bytes land before commit; a copy or kernel that faulted publishes nothing. */
        int wrc = c->gpu_hooks->wait(c, &r->gpu);
        if (wrc) {
            kvc_abort(r);
            return wrc;
        }
    }
    if (!r->id) {
        free(r->layer_bits);
        free(r);
        return 0;
    }
    pthread_mutex_lock(&c->mu);
    struct kvc_commit_req *q = kvc_req(c);
    memset(q, 0, sizeof(*q));
    q->resv_id = r->id;
    q->ncommit = n >= UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    rc = kvc_call(c, KVC_OP_COMMIT, sizeof(*q), NULL);
    if (rc == 0) {
        const struct kvc_commit_rep *p = kvc_rep(c, &len);
        rc = len == sizeof(*p) ? (int)p->committed : -EPROTO;
    }
    pthread_mutex_unlock(&c->mu);
    free(r->layer_bits);
    free(r);
    return rc;
}

KVC_API int kvc_abort(kvc_resv *r)
{
    kvc_client *c;
    int rc = 0;
    if (!r)
        return 0;
    if (r->gpu.nev || r->gpu.scratch || r->gpu.err)
        r->ns->c->gpu_hooks->wait(r->ns->c, &r->gpu);
    if (r->id) {
        c = r->ns->c;
        pthread_mutex_lock(&c->mu);
        rc = kvc_abort_id(c, r->id);
        pthread_mutex_unlock(&c->mu);
    }
    free(r->layer_bits);
    free(r);
    return rc;
}

/* ---- whole prefixes ------------------------------------------------------------------- */

KVC_API int kvc_get_prefix(kvc_ns *ns, const struct kvc_key *keys, size_t n, void *const *dst)
{
    kvc_lease *l;
    int hits;
    size_t fast;
    if ((!dst && n) || !ns || (!keys && n))
        return -EINVAL;
    if (n > (size_t)KVC_LEASE_MAX_CHUNKS * KVC_PROTO_MAX_KEYS)
        return -E2BIG;
    if (ns->layout.kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW ||
        ns->layout.kv_kind == KVC_WIRE_KV_KIND_STATE) {
        /* A span, not a run from keys[0]: the daemon finds it (no shared-index walk). */
        hits = kvc_lookup(ns, keys, n, 0, &l);
        if (hits <= 0)
            return hits;
        size_t first = l->first;
        for (int i = 0; i < hits; i++)
            if (kvc_lease_copy(l, (size_t)i, dst[first + i], l->ns->block_bytes) < 0) {
                hits = i;
                break;
            }
        kvc_release(l);
        return hits ? (int)(first + (size_t)hits) : 0;
    }
    /* The leading hits through the shared index, the rest (if any) through the socket. */
    fast = kvci_fast_get(ns, keys, n, dst);
    if (fast == n)
        return (int)fast;
    hits = kvc_lookup(ns, keys + fast, n - fast, 0, &l);
    if (hits <= 0)
        return fast ? (int)fast : hits;
    for (int i = 0; i < hits; i++) /* each copy adds its time to the lease */
        if (kvc_lease_copy(l, (size_t)i, dst[fast + i], l->ns->block_bytes) < 0) {
            hits = i; /* what could not be decoded is a miss */
            break;
        }
    kvc_release(l);
    return (int)fast + hits;
}

/* The failure kept from a request sent without waiting, cleared: 0 if none. c->mu held. */
static int kvc_defer_err_take(kvc_client *c)
{
    int err = c->defer_err;
    c->defer_err = 0;
    return err;
}

/*
 * A put is a RESERVE round trip for the whole prefix (one per KVC_PROTO_MAX_KEYS keys), the
 * copies, and a COMMIT whose reply no one waits for here: the next call on the client reads
 * it (the daemon answers a connection in order, so it comes before that call's own reply).
 * The daemon also handles the connection's requests in order, so every later request of
 * this client finds the blocks committed, and a chunk's RESERVE can hang from the chunk
 * before it. A failed commit is kept (kvc_defer_fail) and reported by the next put or
 * kvc_flush(): a put reports one of an earlier call before it does anything (it stores
 * nothing then), and one of its own earlier chunk (read with the next chunk's RESERVE) by
 * returning the blocks stored before that chunk.
 */
KVC_API int kvc_put_prefix(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                           size_t n, const void *const *blocks)
{
    kvc_client *c;
    uint64_t tag;
    int written = 0, rc;
    if (!ns || (!keys && n) || (!blocks && n))
        return -EINVAL;
    c = ns->c;
    pthread_mutex_lock(&c->mu);
    kvc_defer_drain(c, false); /* replies already here: a failure among them is reported now */
    rc = kvc_defer_err_take(c);
    tag = ++c->put_calls;
    pthread_mutex_unlock(&c->mu);
    if (rc)
        return rc;
    /* One reservation per chunk; a chunk is committed before the next one hangs from it. */
    for (size_t done = 0; done < n;) {
        size_t chunk = n - done > KVC_PROTO_MAX_KEYS ? KVC_PROTO_MAX_KEYS : n - done;
        const struct kvc_key *par = done ? &keys[done - 1] : parent;
        kvc_resv *r;
        pthread_mutex_lock(&c->mu);
        rc = kvc_reserve_locked(ns, par, keys + done, chunk, 0, &r);
        /* The RESERVE's reply came after those of the commits before it: one of them failed
         * (this call's previous chunk, or, before this call stored anything, an earlier
         * call's)? */
        if (c->defer_err && (c->defer_err_tag == tag || written == 0)) {
            if (c->defer_err_tag == tag)
                written -= (int)c->defer_err_blocks;
            int err = kvc_defer_err_take(c);
            if (r && r->id && !c->dead)
                kvc_abort_id(c, r->id);
            pthread_mutex_unlock(&c->mu);
            free(r);
            return written > 0 ? written : err;
        }
        pthread_mutex_unlock(&c->mu);
        if (rc < 0)
            return written ? written : rc;
        for (size_t i = 0; i < chunk; i++)
            if (r->slots[i].status == KVC_SLOT_RESERVED)
                kvci_copy_to_arena(r->slots[i].data, blocks[done + i], ns->block_bytes);
        bool complete = r->slots[chunk - 1].status == KVC_SLOT_PRESENT ||
                        r->slots[chunk - 1].status == KVC_SLOT_RESERVED;
        if (r->id) {
            pthread_mutex_lock(&c->mu);
            rc = kvc_defer_room(c);
            if (rc == 0) {
                struct kvc_commit_req *q = kvc_req(c);
                *q = (struct kvc_commit_req){
                    .resv_id = r->id, .ncommit = UINT32_MAX, .flags = KVC_COMMIT_F_QUIET};
                rc = kvc_send_nowait(c, KVC_OP_COMMIT, sizeof(*q), true, (uint32_t)r->nreserved,
                                     tag);
            }
            pthread_mutex_unlock(&c->mu);
            if (rc < 0) {
                free(r);
                return written ? written : rc;
            }
            written += (int)r->nreserved;
        }
        free(r);
        if (!complete)
            break; /* busy elsewhere or no room: the rest has no cached parent */
        done += chunk;
    }
    return written;
}

KVC_API int kvc_flush(kvc_client *c)
{
    int rc;
    if (!c)
        return -EINVAL;
    pthread_mutex_lock(&c->mu);
    rc = kvc_defer_settle(c);
    int err = kvc_defer_err_take(c);
    pthread_mutex_unlock(&c->mu);
    return err ? err : rc;
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
    struct kvc_stats_req *q = kvc_req(c);
    memset(q, 0, sizeof(*q));
    q->scope = scope;
    rc = kvc_call(c, KVC_OP_STATS, sizeof(*q), NULL);
    if (rc == 0) {
        const struct kvc_stats_rep *p = kvc_rep(c, &len);
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
        struct kvc_ns_list_req *q = kvc_req(c);
        memset(q, 0, sizeof(*q));
        q->cursor = cursor;
        rc = kvc_call(c, KVC_OP_NS_LIST, sizeof(*q), NULL);
        if (rc)
            break;
        const struct kvc_ns_list_rep *p = kvc_rep(c, &len);
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
        struct kvc_ns_list_req *q = kvc_req(c);
        memset(q, 0, sizeof(*q));
        q->cursor = cursor;
        int r = kvc_call(c, KVC_OP_NS_LIST, sizeof(*q), NULL);
        if (r) {
            rc = r;
            break;
        }
        const struct kvc_ns_list_rep *p = kvc_rep(c, &len);
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
    struct kvc_block_list_req *q = kvc_req(c);
    memset(q, 0, sizeof(*q));
    q->ns_id = ns_id;
    q->max = max;
    q->cursor = *cursor;
    rc = kvc_call(c, KVC_OP_BLOCK_LIST, sizeof(*q), NULL);
    if (rc == 0) {
        const struct kvc_block_list_rep *p = kvc_rep(c, &len);
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
