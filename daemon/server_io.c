/*
 * server_io.c — the server's I/O threads (server.io_threads > 0): the connections' socket
 * work off the loop thread, as Redis's threaded I/O and memcached's workers do it.
 *
 * DESIGN
 * Each I/O thread has its own epoll set and a share of the connections (round robin at
 * accept). It reads a connection's datagrams (recvmsg: at most SERVER_IO_BATCH a turn,
 * descriptors a client sent closed and the connection dropped, truncated datagrams refused
 * the same way as on the loop) and hands them to the loop thread; it sends the replies the
 * loop thread queued for it (sendmsg, with the descriptor of NS_OPEN, GPU_ATTACH and
 * FAST_ATTACH), and closes the socket when the loop thread says so. Everything else — the
 * protocol's validation (proto_decode), the access rules and limits, the store, the index,
 * the policies, the hit rings — stays on the loop thread, which still owns struct conn and
 * struct server alone: the store takes no lock, and what a request sees is what it saw
 * with one thread.
 *
 * Order. The thread reads one batch of a connection, then not again until the loop thread
 * has handled that batch's last request and asked for more (SERVER_IO_REARM); the socket is
 * watched edge-triggered, and an edge while the batch is away (or a batch cut short by its
 * limits) is remembered and read on REARM — no epoll_ctl a request. So at most one batch of
 * a connection is on its way, a later request never overtakes an earlier one, a client
 * cannot queue more than SERVER_IO_BATCH requests (SERVER_IO_BATCH_BYTES and one) in the
 * daemon (the rest waits in its socket, as it does with one thread), and replies leave in
 * the order the loop thread queued them (one FIFO per thread).
 *
 * Hand-over. Two lists per thread under one mutex: `out` (loop → thread: replies, ADD,
 * REARM, SHUT, STOP) and `in` (thread → loop: requests, CLOSE, GONE), each with an eventfd
 * that is written only when the other side may sleep (the list went from idle to busy), so
 * a busy daemon pays one wakeup per batch, not per message. The messages that can be
 * pending at most once per connection live in struct server_ioc, so posting them cannot
 * fail.
 *
 * Lifetime. The descriptor is closed by the I/O thread alone, on SHUT, which the loop thread
 * posts from server_conn_close after every reply of the connection: nothing reads or writes
 * a closed (or reused) descriptor. The thread answers GONE, its last word on that socket;
 * the loop thread frees the server_ioc then. A failed send (EAGAIN: a client that does not
 * read its replies) or read posts CLOSE, and the loop thread closes the connection as it
 * would have itself; after a read that saw the hang-up (a client that shut down its side)
 * the replies queued before SHUT are still sent, after a failed send none is. At stop
 * (server_io_stop) every connection is closed first, then each thread is told to STOP
 * behind the SHUTs, joined, and what it left is freed.
 * The I/O threads never log (the loop thread logs the reasons CLOSE carries).
 *
 * Fallback (Redis 7 turns its I/O threads off the same way). With one client the threads
 * only add two wakeups a request, so they take sockets only while the daemon is busy: the
 * loop thread counts the connections with a request in windows of SERVER_IO_WINDOW_MS
 * (server_io_note); from server.io_threads_min_active of them (0: twice the threads) the
 * sockets go to the I/O threads, below half as many they come back, each at its next
 * request. To a thread: server_on_conn, before any read, unwatches the socket (loop_del)
 * and posts ADD — the requests read so far are handled and their replies are in the socket
 * (datagrams are read whole: nothing is half read), and the thread reads what follows. Back:
 * where a batch ends and the loop would post REARM, it posts RELEASE; the thread unwatches
 * the socket, reads no more, and answers RELEASED behind every reply posted before. A reply
 * the loop posted after RELEASE (a WAIT's answer, a notice) may not be sent yet, so then it
 * asks again; otherwise the loop watches the socket level-triggered (what waits in it is
 * read at once), sends its replies itself and frees the server_ioc, which the thread no
 * longer references. A close meanwhile posts SHUT behind RELEASE as always. So each socket
 * is read by one thread at a time, and its replies leave in order across every hand-over.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/acl.h"
#include "daemon/loop.h"
#include "daemon/server_int.h"

/* Requests read from one connection a turn (as the loop thread reads them itself), and the
 * bytes after which a turn stops early: what one connection holds in the daemon's memory on
 * its way to the loop thread is at most this plus one request (KVC_PROTO_MAX_MSG). */
#define SERVER_IO_BATCH 8
#define SERVER_IO_BATCH_BYTES (16u * 1024u)

enum server_io_kind {
    SERVER_IO_REQ,      /* thread → loop: a request datagram */
    SERVER_IO_CLOSE,    /* thread → loop: the socket ended or failed (err, why) */
    SERVER_IO_GONE,     /* thread → loop: the descriptor is closed; the server_ioc may go */
    SERVER_IO_REPLY,    /* loop → thread: send a reply (and fd) */
    SERVER_IO_ADD,      /* loop → thread: watch a new connection */
    SERVER_IO_REARM,    /* loop → thread: its batch is handled, read on */
    SERVER_IO_SHUT,     /* loop → thread: close the socket */
    SERVER_IO_STOP,     /* loop → thread: leave (after everything posted before) */
    SERVER_IO_RELEASE,  /* loop → thread: its batch is handled; read no more, unwatch it */
    SERVER_IO_RELEASED, /* thread → loop: unwatched, every reply before RELEASE sent */
};

/* REQ: the last of the batch read (the loop thread re-arms after it) ... */
#define SERVER_IO_F_LAST 1u
/* ... and the socket had nothing more then (its queued requests are answered). */
#define SERVER_IO_F_DRAINED 2u

struct server_io_msg {
    struct server_io_msg *next;
    struct server_ioc *ioc;
    uint8_t kind;
    uint8_t flags;   /* REQ: SERVER_IO_F_* */
    int fd;          /* REPLY: a descriptor to pass, owned by the message; -1 none */
    int err;         /* CLOSE: the errno of a failed read or send, 0 none */
    const char *why; /* CLOSE: a static reason for the log, NULL a plain disconnect */
    uint32_t len;    /* REQ, REPLY: bytes in the buffer */
};

/* A REQ or REPLY and its bytes. */
struct server_io_buf {
    struct server_io_msg m;
    uint64_t data[];
};

/* A connection's socket on its I/O thread. */
struct server_ioc {
    struct conn *c;       /* loop thread: the connection; NULL once it closed */
    struct server_io *io; /* set at creation */
    int fd;               /* set at creation; closed by the I/O thread on SHUT */
    bool leaving;         /* loop thread: RELEASE posted, RELEASED not yet delivered */
    bool resent;          /* loop thread: a reply was posted after that RELEASE */
    bool dead;            /* I/O thread: CLOSE posted, nothing more is read */
    bool mute;            /* I/O thread: a send failed, nothing more is sent */
    bool away;            /* I/O thread: a batch is with the loop thread (until REARM) */
    bool more;            /* I/O thread: the socket may hold requests not read yet */
    bool unwatched;       /* I/O thread: RELEASE taken, the socket is not read (until ADD) */
    struct server_io_msg add, rearm, shut, close, gone, release, released;
};

struct server_io {
    struct server *sv; /* the loop thread's; the I/O thread never touches it */
    pthread_t thread;
    bool started;
    int epfd; /* the thread's epoll set: its sockets and `wake` */
    int wake; /* eventfd: `out` has messages */
    int back; /* eventfd, watched by the loop: `in` has messages */
    pthread_mutex_t lock;
    struct server_io_msg *out, **out_tail; /* under lock */
    bool out_signaled;                     /* under lock: `wake` written, not yet taken */
    struct server_io_msg *in, **in_tail;   /* under lock */
    bool in_signaled;                      /* under lock: `back` written, not yet taken */
    struct server_io_msg stop;
    uint64_t rx[SERVER_BUF / 8]; /* the thread's receive buffer */
};

static void server_io_wake(int fd)
{
    uint64_t one = 1;
    (void)!write(fd, &one, sizeof(one));
}

/* Loop thread: queues m for the I/O thread. */
static void server_io_post(struct server_io *io, struct server_io_msg *m)
{
    bool wake;
    m->next = NULL;
    pthread_mutex_lock(&io->lock);
    *io->out_tail = m;
    io->out_tail = &m->next;
    wake = !io->out_signaled;
    io->out_signaled = true;
    pthread_mutex_unlock(&io->lock);
    if (wake)
        server_io_wake(io->wake);
}

/* I/O thread: hands the list head..*tail to the loop thread. */
static void server_io_give(struct server_io *io, struct server_io_msg *head,
                           struct server_io_msg **tail)
{
    bool wake;
    if (!head)
        return;
    pthread_mutex_lock(&io->lock);
    *io->in_tail = head;
    io->in_tail = tail;
    wake = !io->in_signaled;
    io->in_signaled = true;
    pthread_mutex_unlock(&io->lock);
    if (wake)
        server_io_wake(io->back);
}

struct server_io_batch {
    struct server_io_msg *head, **tail;
};

static void server_io_batch_add(struct server_io_batch *b, struct server_io_msg *m)
{
    m->next = NULL;
    *b->tail = m;
    b->tail = &m->next;
}

/* I/O thread: the socket failed or ended; the loop thread closes the connection. */
static void server_io_dead(struct server_ioc *ioc, struct server_io_batch *b, int err,
                           const char *why)
{
    if (ioc->dead)
        return;
    ioc->dead = true;
    ioc->close.err = err;
    ioc->close.why = why;
    server_io_batch_add(b, &ioc->close);
}

static int server_io_watch(struct server_ioc *ioc)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.ptr = ioc};
    return epoll_ctl(ioc->io->epfd, EPOLL_CTL_ADD, ioc->fd, &ev) < 0 ? -errno : 0;
}

/* I/O thread: one batch of a readable (or hung up) connection's requests, unless one is
 * away already. */
static void server_io_read(struct server_io *io, struct server_ioc *ioc, struct server_io_batch *b)
{
    struct server_io_buf *last = NULL;
    bool drained = false;
    size_t bytes = 0;
    if (ioc->dead || ioc->unwatched)
        return;
    if (ioc->away) {
        ioc->more = true;
        return;
    }
    ioc->more = false;
    for (int k = 0; k < SERVER_IO_BATCH && bytes < SERVER_IO_BATCH_BYTES; k++) {
        const char *why = NULL;
        ssize_t n = server_recv(ioc->fd, io->rx, &why);
        if (n == -EINTR) { /* read again: no edge would come for it */
            k--;
            continue;
        }
        if (n == -EAGAIN) {
            drained = true;
            break;
        }
        if (n <= 0) {
            server_io_dead(ioc, b, why || n == 0 ? 0 : (int)-n, why);
            return;
        }
        last = malloc(sizeof(*last) + (size_t)n);
        if (!last) {
            server_io_dead(ioc, b, ENOMEM, "out of memory");
            return;
        }
        memset(&last->m, 0, sizeof(last->m));
        last->m.ioc = ioc;
        last->m.kind = SERVER_IO_REQ;
        last->m.fd = -1;
        last->m.len = (uint32_t)n;
        memcpy(last->data, io->rx, (size_t)n);
        server_io_batch_add(b, &last->m);
        bytes += (size_t)n;
    }
    if (last) { /* the loop thread asks for more once it handled this one */
        last->m.flags = SERVER_IO_F_LAST | (drained ? SERVER_IO_F_DRAINED : 0);
        ioc->away = true;
        ioc->more = !drained; /* no edge comes for what is there already */
    }
}

/* I/O thread: one message from the loop thread. Returns true on STOP. */
static bool server_io_do(struct server_io *io, struct server_io_msg *m, struct server_io_batch *b)
{
    struct server_ioc *ioc = m->ioc;
    int rc;
    switch (m->kind) {
    case SERVER_IO_REPLY: {
        struct server_io_buf *r = (struct server_io_buf *)m;
        /* Sent after a hang-up too: a client that shut down its side of the socket still
         * reads the replies to what it sent before (as from the loop thread). */
        rc = ioc->mute ? 0 : server_sendmsg(ioc->fd, r->data, m->len, m->fd);
        if (rc) {
            /* As server_handle: a full socket is a client that does not read, another
             * failure (EPIPE: it went) a plain disconnect. */
            if (rc == -EAGAIN || rc == -EWOULDBLOCK)
                server_io_dead(ioc, b, 0, "client does not read its replies");
            else
                server_io_dead(ioc, b, 0, NULL);
            ioc->mute = true; /* a later one would leave a gap */
        }
        if (m->fd >= 0)
            close(m->fd);
        free(r);
        return false;
    }
    case SERVER_IO_ADD:
        ioc->unwatched = false; /* back after a RELEASE the loop thread could not take */
        rc = server_io_watch(ioc);
        if (rc)
            server_io_dead(ioc, b, -rc, NULL);
        else
            server_io_read(io, ioc, b); /* what came before the watch gave no edge */
        return false;
    case SERVER_IO_REARM:
        ioc->away = false;
        if (ioc->more)
            server_io_read(io, ioc, b);
        return false;
    case SERVER_IO_RELEASE:
        /* No batch is away (the loop thread posts RELEASE in place of a REARM) and none is
         * read from now on: unwatched, the socket gives this thread no event after this
         * (EPOLL_CTL_DEL takes it off the ready list too), and the replies posted before
         * RELEASE are in the socket already. RELEASED is the thread's last word on ioc
         * unless the loop thread posts again. */
        ioc->away = false;
        ioc->unwatched = true;
        epoll_ctl(io->epfd, EPOLL_CTL_DEL, ioc->fd, NULL);
        server_io_batch_add(b, &ioc->released);
        return false;
    case SERVER_IO_SHUT:
        epoll_ctl(io->epfd, EPOLL_CTL_DEL, ioc->fd, NULL);
        close(ioc->fd);
        server_io_batch_add(b, &ioc->gone); /* the last message about ioc */
        return false;
    default: /* SERVER_IO_STOP */
        return true;
    }
}

static void *server_io_main(void *arg)
{
    struct server_io *io = arg;
    struct epoll_event evs[64];
    bool stop = false;
    while (!stop) {
        struct server_io_batch b = {.head = NULL, .tail = &b.head};
        struct server_io_msg *take;
        int n;
        pthread_mutex_lock(&io->lock);
        take = io->out;
        io->out = NULL;
        io->out_tail = &io->out;
        if (!take)
            io->out_signaled = false; /* the next post wakes the wait below */
        pthread_mutex_unlock(&io->lock);
        for (struct server_io_msg *m = take, *next; m && !stop; m = next) {
            next = m->next;
            stop = server_io_do(io, m, &b);
        }
        if (!stop) {
            /* Sleep only when there was nothing to do: messages may be on their way. */
            n = epoll_wait(io->epfd, evs, 64, take ? 0 : -1);
            for (int i = 0; i < n; i++) {
                if (evs[i].data.ptr) /* `wake` (edge-triggered, never read) has none */
                    server_io_read(io, evs[i].data.ptr, &b);
            }
        }
        server_io_give(io, b.head, b.tail);
    }
    return NULL;
}

/* ---- the loop thread's side ------------------------------------------------------------- */

static void server_io_deliver(struct server *sv, struct server_io_msg *m)
{
    struct server_ioc *ioc = m->ioc;
    struct conn *c = ioc->c;
    switch (m->kind) {
    case SERVER_IO_REQ: {
        struct server_io_buf *r = (struct server_io_buf *)m;
        uint8_t flags = m->flags;
        if (c) {
            server_io_note(sv, c);
            memcpy(sv->rx, r->data, m->len);
            if (!server_handle(sv, c, m->len) && (flags & SERVER_IO_F_LAST)) {
                if (flags & SERVER_IO_F_DRAINED)
                    server_trim_due(sv);
                if (sv->io_on) {
                    server_io_post(ioc->io, &ioc->rearm);
                } else { /* few connections are busy: the socket goes back to the loop */
                    ioc->leaving = true;
                    ioc->resent = false;
                    server_io_post(ioc->io, &ioc->release);
                }
            }
        }
        free(r);
        break;
    }
    case SERVER_IO_RELEASED:
        if (!c) /* closed meanwhile: SHUT is behind RELEASE, GONE frees ioc */
            break;
        if (ioc->resent) { /* that reply may not be sent yet: ask again behind it */
            ioc->resent = false;
            server_io_post(ioc->io, &ioc->release);
            break;
        }
        /* Every reply is in the socket and the thread holds no request nor any reference
         * to ioc: the loop thread reads and writes the socket from here on, level-triggered,
         * so what waits in it already is read at once. */
        if (loop_add(sv->loop, ioc->fd, EPOLLIN, server_on_conn, c) == 0) {
            c->ioc = NULL;
            free(ioc);
            sv->store->total.io_to_loop++;
        } else { /* stays with its thread */
            ioc->leaving = false;
            server_io_post(ioc->io, &ioc->add);
        }
        break;
    case SERVER_IO_CLOSE:
        if (c) /* as server_on_conn would have */
            server_conn_close(sv, c, m->why ? m->why : m->err ? strerror(m->err) : NULL);
        break;
    case SERVER_IO_GONE:
        free(ioc);
        break;
    default:
        break;
    }
}

static struct server_io_msg *server_io_take(struct server_io *io)
{
    struct server_io_msg *take;
    pthread_mutex_lock(&io->lock);
    take = io->in;
    io->in = NULL;
    io->in_tail = &io->in;
    io->in_signaled = false;
    pthread_mutex_unlock(&io->lock);
    return take;
}

static void server_io_on_back(struct loop *l, int fd, uint32_t events, void *arg)
{
    struct server_io *io = arg;
    (void)l;
    (void)fd;
    (void)events;
    for (struct server_io_msg *m = server_io_take(io), *next; m; m = next) {
        next = m->next;
        server_io_deliver(io->sv, m);
    }
}

/* Counts c among the connections busy in this window and, when a window ends, decides from
 * the one that ended where sockets go: to the I/O threads from io_threads_min_active busy
 * connections on, back to the loop below half as many (a window with nothing counts 0). */
void server_io_note(struct server *sv, struct conn *c)
{
    uint64_t now = loop_now_ms(sv->loop);
    if (!sv->nio)
        return;
    if (now - sv->io_window_ms >= SERVER_IO_WINDOW_MS) {
        uint32_t on = sv->lim.io_threads_min_active ? sv->lim.io_threads_min_active : 2 * sv->nio;
        uint32_t n = now - sv->io_window_ms >= 2 * SERVER_IO_WINDOW_MS ? 0 : sv->io_active;
        if (n >= on)
            sv->io_on = true;
        else if (n < on / 2)
            sv->io_on = false;
        sv->io_window_ms = now;
        sv->io_epoch++;
        sv->io_active = 0;
    }
    if (c->io_epoch != sv->io_epoch) {
        c->io_epoch = sv->io_epoch;
        sv->io_active++;
    }
}

int server_io_attach(struct server *sv, struct conn *c, bool on_loop)
{
    struct server_io *io = sv->io[sv->io_next++ % sv->nio];
    struct server_ioc *ioc = calloc(1, sizeof(*ioc));
    if (!ioc)
        return -ENOMEM;
    /* The loop thread reads no more of it (nothing is half read: a datagram is read whole),
     * its replies so far are in the socket, and the thread reads what follows. */
    if (on_loop) {
        loop_del(sv->loop, c->fd);
        sv->store->total.io_to_threads++;
    }
    ioc->c = c;
    ioc->io = io;
    ioc->fd = c->fd;
    ioc->add = (struct server_io_msg){.ioc = ioc, .kind = SERVER_IO_ADD, .fd = -1};
    ioc->rearm = (struct server_io_msg){.ioc = ioc, .kind = SERVER_IO_REARM, .fd = -1};
    ioc->shut = (struct server_io_msg){.ioc = ioc, .kind = SERVER_IO_SHUT, .fd = -1};
    ioc->close = (struct server_io_msg){.ioc = ioc, .kind = SERVER_IO_CLOSE, .fd = -1};
    ioc->gone = (struct server_io_msg){.ioc = ioc, .kind = SERVER_IO_GONE, .fd = -1};
    ioc->release = (struct server_io_msg){.ioc = ioc, .kind = SERVER_IO_RELEASE, .fd = -1};
    ioc->released = (struct server_io_msg){.ioc = ioc, .kind = SERVER_IO_RELEASED, .fd = -1};
    c->ioc = ioc;
    server_io_post(io, &ioc->add);
    return 0;
}

int server_io_send(struct conn *c, const void *buf, size_t len, int fd)
{
    struct server_io_buf *r = malloc(sizeof(*r) + len);
    if (!r)
        return -ENOMEM;
    memset(&r->m, 0, sizeof(r->m));
    r->m.ioc = c->ioc;
    r->m.kind = SERVER_IO_REPLY;
    r->m.len = (uint32_t)len;
    r->m.fd = -1;
    /* The caller may close its descriptor as soon as this returns: the message owns a copy. */
    if (fd >= 0 && (r->m.fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        int rc = -errno;
        free(r);
        return rc;
    }
    memcpy(r->data, buf, len);
    if (c->ioc->leaving)
        c->ioc->resent = true;
    server_io_post(c->ioc->io, &r->m);
    return 0;
}

void server_io_close(struct conn *c)
{
    struct server_ioc *ioc = c->ioc;
    ioc->c = NULL; /* what the thread still hands over about it is dropped */
    c->ioc = NULL;
    server_io_post(ioc->io, &ioc->shut);
}

static void server_io_free(struct server *sv, struct server_io *io)
{
    if (io->started) {
        pthread_join(io->thread, NULL);
        /* Everything it posted: requests of closed connections, their GONEs. */
        for (struct server_io_msg *m = server_io_take(io), *next; m; m = next) {
            next = m->next;
            server_io_deliver(sv, m);
        }
    }
    if (io->back >= 0) {
        loop_del(sv->loop, io->back);
        close(io->back);
    }
    if (io->wake >= 0)
        close(io->wake);
    if (io->epfd >= 0)
        close(io->epfd);
    pthread_mutex_destroy(&io->lock);
    free(io);
}

int server_io_start(struct server *sv, uint32_t n)
{
    sigset_t all, old;
    int rc = 0;
    if (!n)
        return 0;
    sv->io = calloc(n, sizeof(*sv->io));
    if (!sv->io)
        return -ENOMEM;
    sigfillset(&all);
    for (uint32_t i = 0; i < n && !rc; i++) {
        struct server_io *io = calloc(1, sizeof(*io));
        /* Edge-triggered: every write is an edge, and the count is never read (2^64 writes
         * would be needed to fill it). */
        struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.ptr = NULL};
        char name[16];
        if (!io) {
            rc = -ENOMEM;
            break;
        }
        pthread_mutex_init(&io->lock, NULL);
        io->sv = sv;
        io->out_tail = &io->out;
        io->in_tail = &io->in;
        io->stop = (struct server_io_msg){.kind = SERVER_IO_STOP, .fd = -1};
        io->epfd = epoll_create1(EPOLL_CLOEXEC);
        io->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        io->back = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        sv->io[sv->nio++] = io;
        if (io->epfd < 0 || io->wake < 0 || io->back < 0 ||
            epoll_ctl(io->epfd, EPOLL_CTL_ADD, io->wake, &ev) < 0) {
            rc = -errno;
            break;
        }
        rc = loop_add(sv->loop, io->back, EPOLLIN | EPOLLET, server_io_on_back, io);
        if (rc) {
            close(io->back); /* not watched: server_io_free must not loop_del it */
            io->back = -1;
            break;
        }
        /* Signals stay with the loop thread's signalfd. */
        pthread_sigmask(SIG_SETMASK, &all, &old);
        rc = -pthread_create(&io->thread, NULL, server_io_main, io);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc)
            break;
        io->started = true;
        snprintf(name, sizeof(name), "kvcd-io%u", i % 100u); /* 64 at most */
        pthread_setname_np(io->thread, name);
    }
    if (rc)
        server_io_stop(sv);
    return rc;
}

void server_io_stop(struct server *sv)
{
    for (uint32_t i = 0; i < sv->nio; i++)
        if (sv->io[i]->started)
            server_io_post(sv->io[i], &sv->io[i]->stop);
    for (uint32_t i = 0; i < sv->nio; i++)
        server_io_free(sv, sv->io[i]);
    free(sv->io);
    sv->io = NULL;
    sv->nio = 0;
}
