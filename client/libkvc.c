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
 * sends is checked against the mapping before it is turned into a pointer. Lookups and
 * reservations longer
 * than one message are split into chunks.
 * This file holds the transport, the connection and namespaces; the calls live by family:
 * libkvc_lease.c (lookups, leases, kvc_get_prefix), libkvc_put.c (reservations, commits,
 * kvc_put_prefix, kvc_flush), libkvc_admin.c (operator and inspection calls), libkvc_fast.c
 * (the shared index), libkvc_copy.c (arena copies), libkvc_gpu.c (devices).
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
#include "client/kvc_huge.h"
#include "client/kvc_proto.h"
#include "client/libkvc_internal.h"
#include "kernels/kern.h"
#include "kernels/kern_dev.h"

#define KVC_ARENA_POPULATE_MAX (2ull << 30)
/* kvci_arena_populate_max_set's: 0 the default, else 1 + the most bytes mapped populated. */
static uint64_t kvc_arena_populate_max;

void kvci_arena_populate_max_set(uint64_t bytes)
{
    kvc_arena_populate_max = bytes == UINT64_MAX ? 0 : bytes + 1;
}
/* How long kvc_disconnect waits for the commits in flight. */
#define KVC_DISCONNECT_WAIT_MS 2000

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
        /* A RELEASE that failed named a lease the daemon no longer had: gone either way,
         * and no put's failure (kvc_put_prefix reports what it finds kept here). */
        if (err && d->op != KVC_OP_RELEASE)
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

/* Sends the request in c->tx (header filled here with flags, KVC_MSG_F_*; payload of len
 * bytes) under a new request id. 0 or a transport error. Caller holds c->mu. */
static int kvc_send(kvc_client *c, uint16_t op, uint32_t len, uint32_t flags)
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
                              .len = len,
                              .flags = flags};
    do
        n = send(c->fd, c->tx, sizeof(*h) + len, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n < 0 ? kvc_fail(c, errno ? -errno : -EPIPE) : 0;
}

/* Reads the replies of requests sent without waiting: those already here (wait false), or
 * every one (wait true). 0, or the error that ended the connection. Caller holds c->mu. */
int kvci_defer_drain(kvc_client *c, bool wait)
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
int kvci_send_nowait(kvc_client *c, uint16_t op, uint32_t len, bool quiet, uint32_t expect,
                     uint64_t tag)
{
    if (c->ndefer == KVC_DEFER_MAX)
        return -EAGAIN; /* a caller that did not make room: nothing sent */
    /* A quiet COMMIT says so in its body (KVC_COMMIT_F_QUIET), any other in the header. */
    int rc = kvc_send(c, op, len, quiet && op != KVC_OP_COMMIT ? KVC_MSG_F_QUIET : 0);
    if (rc)
        return rc;
    c->defer[c->ndefer++] = (struct kvc_defer){
        .req_id = c->next_req, .op = op, .quiet = quiet, .expect = expect, .tag = tag};
    return 0;
}

/* Settles every request sent without waiting: a SYNC after them when the last is quiet (its
 * reply settles the quiet ones before it, their error replies come first), then the replies
 * still to come. Overwrites c->tx. 0, or the error that ended the connection. c->mu held. */
int kvci_defer_settle(kvc_client *c)
{
    int rc = 0;
    if (c->ndefer && c->defer[c->ndefer - 1].quiet) {
        struct kvc_sync_req *q = (struct kvc_sync_req *)((struct kvc_msg_hdr *)c->tx + 1);
        *q = (struct kvc_sync_req){0};
        rc = kvc_call(c, KVC_OP_SYNC, sizeof(*q), NULL);
    }
    return rc ? rc : kvci_defer_drain(c, true);
}

/* Room for one more request sent without waiting, before the caller builds it in c->tx: the
 * daemon never holds more than KVC_DEFER_MAX of them unread for this client. c->mu held. */
int kvci_defer_room(kvc_client *c)
{
    return c->ndefer < KVC_DEFER_MAX ? 0 : kvci_defer_settle(c);
}

int kvci_call(kvc_client *c, uint16_t op, uint32_t len, int *fd)
{
    const struct kvc_msg_hdr *r = (const struct kvc_msg_hdr *)c->rx;
    uint32_t id;
    int rc;
    if (fd)
        *fd = -1;
    rc = kvc_send(c, op, len, 0);
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
    c->features = p->features;
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
    case -EAGAIN:
        return "not yet (a commit whose parent block, reserved by this client, is not committed)";
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
    if (!q || q->allowed >= 1u << (KVC_CODEC_LOWRANK + 1) || (unsigned)q->k_codec > 15 ||
        (unsigned)q->v_codec > 15 || q->raw_layers > 0xffu)
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
    struct kvc_arena *mapped = NULL; /* mapped by this call */
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
        uint64_t most = kvc_arena_populate_max ? kvc_arena_populate_max - 1 : KVC_ARENA_POPULATE_MAX;
        int populate = p->arena_bytes <= most ? MAP_POPULATE : 0;
        /* At a 2 MiB boundary: the arena's huge pages then map as such (kvc_huge.h). */
        void *m = kvc_huge_map(fd, p->arena_bytes, PROT_READ | (w ? PROT_WRITE : 0), populate);
        if (m == MAP_FAILED) {
            rc = -errno;
            goto out;
        }
        a->base = m;
        a->size = p->arena_bytes;
        a->writable = w;
        mapped = a; /* registered with the device once the reply is read (it asks the daemon) */
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
    if (mapped && c->gpu_hooks)
        c->gpu_hooks->arena_mapped(c, mapped);
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
uint8_t *kvci_loc_ptr(const kvc_ns *ns, const struct kvc_wire_loc *l)
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
