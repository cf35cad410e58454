/*
 * server_int.h — what the server's files share (server.c: the socket and connections,
 * server_dispatch.c: the requests' handlers and dispatch, server_fast.c: the fast path's hit
 * rings); nothing outside daemon/server*.c includes it.
 *
 * DESIGN
 * One struct server, its connections (struct conn) and the waits and pending requests that
 * hang off them, all owned by the loop thread (see server.c); with server.io_threads the
 * sockets' reads and writes run on I/O threads that touch none of them (server_io.c). The helpers declared below
 * are the ones a file calls in another; each file keeps the rest to itself.
 */
#ifndef KVC_SERVER_INT_H
#define KVC_SERVER_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "client/kvc_fast.h"
#include "client/kvc_proto.h"
#include "daemon/proto.h"
#include "daemon/server.h"
#include "daemon/stats.h"
#include "daemon/store.h"

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
/* How long the loop sleeps at most, when nothing is ready, before a lookup's policy work
 * (server_handle, loop_pause): long enough for the reply's reader to take the CPU. Only a
 * lookup of SERVER_POST_PAUSE_KEYS keys or more pauses: a shorter one's work (under 20 us
 * with the default policy's tuner) costs its reader less than the loop's sleep and wake. */
#define SERVER_POST_PAUSE_US 50u
#define SERVER_POST_PAUSE_KEYS 64u

/* The pass after a batch of requests runs at most once per SERVER_FAST_AFTER_US unless a SYNC
 * waits or the last one left entries to read: when it visited every connection, a thousand of
 * them visited after each batch took 40 % of the loop's time (bench_scale's clients). Hits wait that much longer to be counted; an eviction still reads every ring
 * first (server_fast_evict), so none ranks without the hits taken before it. */
#define SERVER_FAST_AFTER_US 1000u
/* A pass looks only at the rings that may hold entries (client/kvc_fast.h, the bell): those of
 * connections whose bit it found set, that it left unread, whose SYNC waits, or that have no
 * bell. Every SERVER_FAST_SWEEP_US the pass after a batch also looks at every other ring, for
 * the hits of a client whose bit another client of its uid cleared (or that never set it). */
#define SERVER_FAST_SWEEP_US 100000u
/* Copy time a connection may report (load_us): at most SERVER_LOAD_PARALLEL microseconds per
 * microsecond it has been connected (as many threads copying all the time), a minute of that
 * banked at most. */
#define SERVER_LOAD_PARALLEL 64u
#define SERVER_LOAD_BANK_US (SERVER_LOAD_PARALLEL * 60ull * 1000000)

/* The connections of one uid and what they hold together. */
struct server_uid {
    uint32_t uid;
    uint32_t nconns;
    uint64_t pins;          /* lease pins */
    uint64_t handles;       /* leases + reservations */
    struct fast_bell *bell; /* its connections' bell (FAST_ATTACH BELL), NULL until asked */
    struct server_uid *next;
};

/* An open reservation and when it expires. */
struct server_resv {
    uint64_t id;
    uint64_t deadline_ms;
};

/* Reservations the daemon aborted, remembered so that COMMIT/ABORT of them say so. */
#define SERVER_EXPIRED_KEEP 64

struct server_io;  /* an I/O thread (server_io.c) */
struct server_ioc; /* a connection's socket there */

struct conn {
    int fd;
    /* server.io_threads > 0: the I/O thread that reads fd, sends the replies and closes it
     * (server_io.c); NULL: the loop thread does. */
    struct server_ioc *ioc;
    uint32_t io_epoch; /* the last window it had a request in (server_io_note) */
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
    /* On sv->fast_active: its ring may hold entries (a pass looks at it). */
    bool fa_on;
    struct conn *fa_prev, *fa_next;
    bool belled; /* holds bit bell_bit of u->bell */
    uint32_t bell_bit;
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
/* Uids whose waiting requests server_retry_held holds behind their first that waits on, at
 * most. */
#define SERVER_RETRY_HELD 16

struct server_pending {
    struct conn *c;
    uint64_t deadline_ms;
    size_t len;
    bool writing; /* a RESERVE that waits for another client's commit (server_reserve_writing) */
    uint32_t writing_idx; /* the reserved block it waits for, in namespace writing_ns */
    uint32_t writing_ns;
    struct server_pending *next;
    uint64_t msg[]; /* the request as received */
};

struct server {
    struct loop *loop;
    struct server_wait *waits;
    struct server_pending *pending;
    struct server_pending *pending_run; /* taken off `pending` by server_retry() */
    struct server_pending *pending_took; /* of those, the ones that started pool moves */
    struct server_pending *retrying;    /* the one running again now, or NULL */
    bool retry_again;                   /* it deferred again: back on `pending` */
    bool defer_writing;                 /* the RESERVE just deferred waits for a commit */
    uint32_t defer_writing_idx;         /* the block it waits for (server_pending's) */
    uint32_t defer_writing_ns;
    bool writing_due;                   /* a COMMIT or ABORT came: run the ones waiting */
    uint64_t waits_deadline;            /* earliest deadline among waits (tick skips until then) */
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
    bool fast_evict_passed;   /* server_fast_evict ran since the last request or batch began */
    struct conn *fast_active; /* the connections whose rings a pass looks at (fa_next) */
    struct conn *fast_next;   /* the one of them server_fast_pass reads first next time */
    uint64_t fast_sweep_us;   /* when a pass last looked at every ring */
    bool fast_in_pass;
    uint64_t fast_after_us;       /* when the last pass after a batch ran (server_fast_after) */
    bool fast_after_due;          /* it left entries to read: the next one runs at once */
    bool fast_sync_any;           /* a SYNC may wait for its ring to be read */
    uint64_t fast_window_us;      /* when the passes' current time window began */
    uint64_t fast_window_busy_us; /* their time in it */
    struct stats fast_excl;       /* counted by drains since fast_excl_any was last cleared */
    bool fast_excl_any;
    bool trim_due; /* a commit wants engine_trim once its connection's requests are answered */
    struct server_io **io; /* server.io_threads I/O threads (server_io.c), nio of them */
    uint32_t nio;
    uint32_t io_next; /* the one the next connection goes to */
    /* Where sockets go (server_io_note): the I/O threads while io_on, else the loop. */
    bool io_on;
    uint64_t io_window_ms; /* when the current window began */
    uint32_t io_epoch;     /* the current window's number */
    uint32_t io_active;    /* connections with a request in it */
};

/* server.c */
void server_uid_sync(struct conn *c);
int server_refuse(const struct conn *c, uint64_t *counter, int rc, const char *what);
void server_trim_due(struct server *sv);
void server_conn_close(struct server *sv, struct conn *c, const char *why);
/* Reads one request datagram of fd into rx (KVC_PROTO_MAX_MSG bytes), without blocking:
 * its length, 0 when the client hung up, -errno when the read failed (-EAGAIN: nothing
 * there, -EINTR), or -EPROTO with *why set when the client must be dropped (it sent
 * descriptors, which are closed, or more than the protocol allows). Loop and I/O threads. */
ssize_t server_recv(int fd, void *rx, const char **why);
int server_send(struct server *sv, struct conn *c, int fd);
/* Sends len bytes of buf on sock without blocking, with descriptor fd (SCM_RIGHTS) when
 * fd >= 0: 0 or -errno (-EAGAIN: the client's socket is full). Loop and I/O threads. */
int server_sendmsg(int sock, const void *buf, size_t len, int fd);
void *server_reply_init(struct server *sv, const struct kvc_msg_hdr *req, int status, uint32_t len);
void server_on_conn(struct loop *l, int fd, uint32_t events, void *arg);
/* server_dispatch.c */
int server_ns_use(const struct server *sv, const struct conn *c, uint32_t ns_id, uint32_t need);
int server_wait_fill(struct server *sv, struct conn *c, uint64_t lease_id, bool wait);
void server_load_add(struct server *sv, struct conn *c, struct store_ns *ns, uint64_t us,
                     uint64_t now);
void server_stats_delta(struct stats *st, const struct stats *before, const struct stats *after);
bool server_handle(struct server *sv, struct conn *c, size_t n);
/* server_io.c (loop thread side) */
/* Starts n I/O threads (0: none, the loop thread does the sockets). 0 or -errno. */
int server_io_start(struct server *sv, uint32_t n);
/* After every connection closed: stops and joins them, frees what they left. */
void server_io_stop(struct server *sv);
/* Windows in which the busy connections are counted (server_io_note). */
#define SERVER_IO_WINDOW_MS 100u
/* c has a request to handle: counts it, and decides at each window's end whether sockets go
 * to the I/O threads (server.io_threads_min_active). */
void server_io_note(struct server *sv, struct conn *c);
/* Hands c's socket to an I/O thread (round robin); on_loop: the loop thread watches it now
 * and stops. 0 or -ENOMEM (then nothing changed). */
int server_io_attach(struct server *sv, struct conn *c, bool on_loop);
/* Queues a reply of len bytes (and a copy of fd unless -1) on c's I/O thread. A failed
 * send closes the connection later, from the loop. 0 or -ENOMEM, -EMFILE. */
int server_io_send(struct conn *c, const void *buf, size_t len, int fd);
/* c closes: its I/O thread closes the socket after the replies queued before. */
void server_io_close(struct conn *c);
/* server_fast.c */
uint32_t server_fast_drain(struct server *sv, struct conn *c, uint64_t now, uint32_t max);
/* Puts c on the rings a pass looks at / takes it off (and gives its bit back). */
void server_fast_active_add(struct server *sv, struct conn *c);
void server_fast_conn_fini(struct server *sv, struct conn *c);
int server_fast_after(void *arg);
void server_fast_evict(void *arg);
int server_on_fast_attach(struct server *sv, struct conn *c, const struct proto_req *r,
                          uint64_t now, int *send_fd, bool *fd_owned);

/* server_retry; with hold (a quantize landing: server_on_room), a uid's requests stop at the
 * first of them that waits on, the later ones of that uid waiting behind it unrun. */
void server_retry_held(struct server *sv, uint64_t now, bool hold);
/* The RESERVEs that wait for another client's commit (server_reserve_writing) run again, in
 * arrival order; the others wait on untouched. */
void server_retry_writing(struct server *sv, uint64_t now);

#endif
