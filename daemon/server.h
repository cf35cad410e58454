/*
 * server.h — the control socket: accepts clients, decodes their requests, calls the store,
 * sends replies (with the arena descriptors on NS_OPEN).
 */
#ifndef KVC_SERVER_H
#define KVC_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <stdbool.h>

#include "client/kvc_proto.h"
#include "daemon/admin.h"

struct acl;
struct config;
struct loop;
struct store;
struct server;

struct server_params {
    const char *socket_path; /* "" or NULL: the default for this user */
    uint32_t socket_mode;
    const char *socket_group; /* "" or NULL: the daemon's group */
    uint32_t max_clients;
    uint32_t io_threads; /* threads that read and write the sockets (server_io.c); 0: the loop */
    /* Connections busy within SERVER_IO_WINDOW_MS from which the sockets go to the I/O
     * threads (back to the loop below half); 0: 2 × io_threads, 1: always. Reloadable. */
    uint32_t io_threads_min_active;
    /* Operators (issue 6). */
    bool adopt;                 /* serve adopt_fd (socket activation) instead of binding */
    int adopt_fd;               /* a listening SOCK_SEQPACKET socket, owned from now on */
    bool has_admin_gid;         /* server.admin_group names a group */
    uint32_t admin_gid;
    const struct config *cfg;   /* borrowed; CONFIG_GET and the quotas read it */
    struct acl *acl;            /* borrowed; NULL: no access lists or quotas */
    /* Limits (docs/security.md). Those "per uid" spare admins; 0 disables none of them. */
    uint32_t max_clients_per_uid;
    uint64_t hello_timeout_ms;       /* no HELLO by then: closed */
    uint64_t idle_timeout_ms;        /* no request for this long: closed */
    uint64_t reservation_timeout_ms; /* not committed by then: aborted */
    uint32_t max_waits;              /* pending WAITs per connection */
    uint32_t max_namespaces_per_uid; /* namespaces one uid may create */
    uint64_t client_pins;            /* lease pins per connection (0: no limit) */
    uint64_t uid_pins;               /* lease pins per uid */
    uint64_t uid_leases;             /* leases + reservations per uid */
    uint32_t uid_reserved_share;     /* percent of an arena one uid may hold reserved */
    uint32_t fast_ring_rate;         /* hit-ring entries read a second a connection (0: 65536) */
};

/* The path a configured value resolves to: the value itself, else $XDG_RUNTIME_DIR/kvcd.sock
 * for a user with XDG_RUNTIME_DIR, else /run/kvcd/kvcd.sock. 0 or -ENAMETOOLONG. */
int server_socket_path(const char *configured, char *out, size_t len);

/* Binds the socket (refusing when a live kvcd answers there, replacing a stale file) and
 * starts accepting on the loop. NULL and *err = -errno on failure (-EADDRINUSE: live). */
struct server *server_new(struct loop *l, struct store *s, const struct server_params *p,
                          int *err);
/* Closes every connection (their pins and reservations go back), the socket, and unlinks
 * the socket file. NULL is a no-op. */
void server_free(struct server *sv);
void server_reload(struct server *sv, const struct server_params *p);
/* Sets every namespace's policy from the configuration again: its [namespace.PATTERN]
 * section's `policy`, else cache.policy (after a reload; POLICY_SET overrides end). */
void server_ns_policies(struct server *sv);
uint32_t server_clients(const struct server *sv);
/* Answers WAITs whose time ran out; called from the loop's tick. NULL is a no-op. */
void server_tick(struct server *sv);
/* Runs again the RESERVEs that wait for the disk tier to make room (after disk completions;
 * the tick answers the ones whose disk.put_wait ran out). */
void server_retry(struct server *sv, uint64_t now);
const char *server_path(const struct server *sv);

void server_set_hooks(struct server *sv, const struct server_hooks *h);
/* Connections from id `cursor` on, at most max of them, as CLIENTS sends them; *next the id to
 * continue from, 0 at the end. self marks the asking connection; unless `all`, only the
 * connections of `uid` are listed. Returns the count. */
uint32_t server_clients_fill(const struct server *sv, uint32_t cursor, uint32_t self, bool all,
                             uint32_t uid, struct kvc_wire_client *out, uint32_t max,
                             uint32_t *next);
/* NS_DROP: refuses (-EBUSY) while a connection holds a lease or reservation on ns_id, else
 * drops it (store_ns_drop) and forgets it on every connection. *dropped: blocks dropped.
 * 0, -ENOENT, -EBUSY. */
int server_ns_drop(struct server *sv, uint32_t ns_id, uint64_t *dropped);

#endif
