/*
 * inproc.h — kvcd's server in the test's own process, for the suites that reach into it while
 * forked clients talk to it through the socket (check_e2e_gpu_fake: a GPU pool on the fake
 * device; check_e2e_adversary_pool: the pool, and WAITs on blocks being read): the store with
 * the engine attached, the ACL, a loop and the server, as kvcd's main sets them up.
 *
 * DESIGN
 * inproc_run() serves one child at a time: the loop runs until the child has exited and its
 * connections are closed, so every reply it was owed was sent and every pin it held was
 * dropped before the case looks at the store. Check assertions: for a case's own process
 * (or its fixture).
 */
#ifndef KVC_TESTS_INPROC_H
#define KVC_TESTS_INPROC_H

#include <sys/types.h>

struct acl;
struct config;
struct loop;
struct server;
struct store;
struct store_params;

struct inproc {
    struct config *cfg; /* owned: freed by inproc_stop */
    struct loop *l;
    struct store *s;
    struct acl *acl;
    struct server *sv;
    pid_t child; /* the client being served; 0 once it exited */
    int status;  /* its exit status, -1 if it did not exit */
};

/* Starts x over cfg (from config_new(); x owns it from now on) and store parameters sp, its
 * server on sock with mode and max_clients (daemon_server_params for the rest). */
void inproc_start(struct inproc *x, struct config *cfg, const struct store_params *sp,
                  const char *sock, unsigned mode, unsigned max_clients);
/* Serves until child (a daemon_child_spawn or adv_spawn pid) exited and every connection
 * closed: its exit status, -1 if it did not exit normally. */
int inproc_run(struct inproc *x, pid_t child);
/* Asserts that nothing is pinned or reserved, then frees what inproc_start made. */
void inproc_stop(struct inproc *x);

#endif
