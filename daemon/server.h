/*
 * server.h — the control socket: accepts clients, decodes their requests, calls the store,
 * sends replies (with the arena descriptors on NS_OPEN).
 */
#ifndef KVC_SERVER_H
#define KVC_SERVER_H

#include <stddef.h>
#include <stdint.h>

struct loop;
struct store;
struct server;

struct server_params {
    const char *socket_path; /* "" or NULL: the default for this user */
    uint32_t socket_mode;
    const char *socket_group; /* "" or NULL: the daemon's group */
    uint32_t max_clients;
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
uint32_t server_clients(const struct server *sv);
/* Answers WAITs whose time ran out; called from the loop's tick. NULL is a no-op. */
void server_tick(struct server *sv);
const char *server_path(const struct server *sv);

#endif
