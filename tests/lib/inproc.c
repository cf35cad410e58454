/*
 * inproc.c — see inproc.h.
 */
#include <check.h>
#include <string.h>
#include <sys/wait.h>

#include "daemon/acl.h"
#include "daemon/config.h"
#include "daemon/engine.h"
#include "daemon/loop.h"
#include "daemon/server.h"
#include "daemon/store.h"
#include "tests/lib/daemon.h"
#include "tests/lib/inproc.h"

void inproc_start(struct inproc *x, struct config *cfg, const struct store_params *sp,
                  const char *sock, unsigned mode, unsigned max_clients)
{
    struct server_params vp;
    int rc = 0;
    memset(x, 0, sizeof(*x));
    x->cfg = cfg;
    ck_assert_ptr_nonnull(x->cfg);
    x->s = store_new(sp, &rc);
    ck_assert_msg(x->s, "store_new: %d", rc);
    engine_attach(x->s);
    x->acl = acl_new(x->s, x->cfg, &rc);
    ck_assert_ptr_nonnull(x->acl);
    x->l = loop_new(&rc);
    ck_assert_ptr_nonnull(x->l);
    daemon_server_params(&vp, sock, mode, max_clients, x->cfg, x->acl);
    x->sv = server_new(x->l, x->s, &vp, &rc);
    ck_assert_msg(x->sv, "server_new: %d", rc);
}

static void inproc_tick(void *arg)
{
    struct inproc *x = arg;
    int st;
    server_tick(x->sv);
    if (x->child > 0 && waitpid(x->child, &st, WNOHANG) == x->child) {
        x->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        x->child = 0;
    }
    if (x->child == 0 && server_clients(x->sv) == 0) /* its connections are closed too */
        loop_stop(x->l);
}

int inproc_run(struct inproc *x, pid_t child)
{
    ck_assert_int_gt(child, 0);
    x->child = child;
    x->status = -1;
    loop_run(x->l, 20, inproc_tick, x);
    return x->status;
}

void inproc_stop(struct inproc *x)
{
    ck_assert_uint_eq(x->s->pins_now, 0);
    ck_assert_uint_eq(x->s->reserved_now, 0);
    server_free(x->sv);
    acl_free(x->acl);
    engine_stop(x->s);
    store_free(x->s);
    loop_free(x->l);
    config_free(x->cfg);
    memset(x, 0, sizeof(*x));
}
