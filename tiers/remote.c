/*
 * remote.c — the remote tier's worker: cluster routing, pipelined batches, circuit breaker
 * (tiers/remote.h).
 */
#include "tiers/remote.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define REMOTE_SLOTS 16384
#define REMOTE_NO_NODE 0xffffu
#define REMOTE_BATCH_BYTES (256ull << 20) /* data bytes one batch moves at most */

enum remote_op { REMOTE_OP_GET = 1, REMOTE_OP_PUT = 2 };

struct remote_req {
    struct remote_req *next;
    uint8_t op; /* enum remote_op */
    uint8_t klen;
    uint8_t redirects;
    uint16_t slot;
    int ask; /* node index to send to behind ASKING, or -1 */
    int status;
    char key[REMOTE_REC_KEY_MAX];
    struct remote_rec_meta meta; /* PUT: the record's; GET: wanted, then the record's */
    uint8_t hdr[REMOTE_REC_HDR]; /* PUT: the encoded header */
    void *buf;                   /* GET: destination; PUT: the data (const) */
    uint64_t cap;                /* GET: destination bytes */
    tier_remote_done_fn done;
    void *arg;
};

struct remote_node {
    char host[64];
    int port;
    redisContext *c;                /* worker's; NULL: not connected */
    struct remote_req *head, *tail; /* this round's requests (worker) */
    bool failed;                    /* this round (worker) */
    size_t rpos, rlen;              /* rbuf[rpos, rlen): read, not yet parsed (worker) */
    uint8_t rbuf[64 << 10];         /* replies as they come (remote_reply) */
};

struct tier_remote {
    struct tier_remote_config cfg;
    char *user, *password;
    int efd;
    pthread_t thr;
    bool started;
    /* Under mu: the queue, the done list, the stats, the breaker's state as others see it. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct remote_req *q_head, *q_tail;
    struct remote_req *d_head, *d_tail;
    uint32_t inflight;
    bool stop;
    bool degraded;
    struct tier_remote_stats st;
    /* The worker's own. */
    struct remote_node nodes[TIER_REMOTE_MAX_NODES];
    uint32_t nnodes, nseeds;
    uint16_t slot_node[REMOTE_SLOTS];
    uint16_t map_new[REMOTE_SLOTS]; /* the map being read from CLUSTER SLOTS */
    bool map_ok;
    uint64_t retry_at;   /* ms: degraded until then */
    uint64_t backoff_ms; /* the next backoff */
};

static uint64_t remote_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static struct timeval remote_tv(uint32_t ms)
{
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (long)(ms % 1000) * 1000};
}

/* ---- nodes and connections (worker) ------------------------------------------------- */

/* The index of host:port, added when new; -1 when the table is full or the name too long. */
static int remote_node_get(struct tier_remote *t, const char *host, size_t hlen, int port)
{
    for (uint32_t i = 0; i < t->nnodes; i++)
        if (t->nodes[i].port == port && strlen(t->nodes[i].host) == hlen &&
            memcmp(t->nodes[i].host, host, hlen) == 0)
            return (int)i;
    if (t->nnodes == TIER_REMOTE_MAX_NODES || hlen == 0 || hlen >= sizeof(t->nodes[0].host) ||
        port <= 0 || port > 65535)
        return -1;
    memcpy(t->nodes[t->nnodes].host, host, hlen);
    t->nodes[t->nnodes].host[hlen] = '\0';
    t->nodes[t->nnodes].port = port;
    return (int)t->nnodes++;
}

/* Notes the latest failure (for the daemon's log): "what (why)". */
__attribute__((format(printf, 2, 3))) static void remote_error(struct tier_remote *t,
                                                               const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&t->mu);
    snprintf(t->st.last_error, sizeof(t->st.last_error), "%.*s", (int)sizeof(t->st.last_error) - 1,
             buf);
    pthread_mutex_unlock(&t->mu);
}

static void remote_node_close(struct remote_node *n)
{
    if (n->c)
        redisFree(n->c);
    n->c = NULL;
    n->rpos = n->rlen = 0; /* what was buffered belonged to that connection */
}

/* One reply of a simple command on n's connection (AUTH, CLUSTER ...). NULL on error (the
 * connection is closed then). */
static redisReply *remote_node_command(struct tier_remote *t, struct remote_node *n, int argc,
                                       const char **argv)
{
    redisReply *r = redisCommandArgv(n->c, argc, argv, NULL);
    if (!r) {
        remote_error(t, "%s:%d: %s", n->host, n->port, n->c->errstr);
        remote_node_close(n);
    }
    return r;
}

/* Connects node i when it is not. 0 or -EIO. */
static int remote_node_connect(struct tier_remote *t, uint32_t i)
{
    struct remote_node *n = &t->nodes[i];
    if (n->c)
        return 0;
    n->c = redisConnectWithTimeout(n->host, n->port, remote_tv(t->cfg.connect_timeout_ms));
    if (!n->c || n->c->err) {
        remote_error(t, "%s:%d: cannot connect (%s)", n->host, n->port,
                     n->c ? n->c->errstr : "out of memory");
        remote_node_close(n);
        return -EIO;
    }
    redisSetTimeout(n->c, remote_tv(t->cfg.timeout_ms));
    redisEnableKeepAlive(n->c);
    pthread_mutex_lock(&t->mu);
    t->st.connects++;
    pthread_mutex_unlock(&t->mu);
    if (t->password[0]) {
        const char *argv[3] = {"AUTH", t->user[0] ? t->user : t->password, t->password};
        redisReply *r = remote_node_command(t, n, t->user[0] ? 3 : 2, argv);
        bool ok = r && r->type == REDIS_REPLY_STATUS;
        if (r && !ok)
            remote_error(t, "%s:%d: AUTH refused (%s)", n->host, n->port,
                         r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        if (r)
            freeReplyObject(r);
        if (!ok) {
            remote_node_close(n);
            return -EIO;
        }
    }
    return 0;
}

/* ---- slot map (worker) --------------------------------------------------------------- */

/* Loads the slot map from node i: CLUSTER INFO must say cluster_state:ok, then CLUSTER
 * SLOTS. 0, -EIO (no answer), -EAGAIN (the cluster is not serving), -EPROTO. */
static int remote_map_from(struct tier_remote *t, uint32_t i)
{
    uint16_t *map = t->map_new;
    const char *info[2] = {"CLUSTER", "INFO"}, *slots[2] = {"CLUSTER", "SLOTS"};
    redisReply *r;
    int rc = 0;
    if (remote_node_connect(t, i))
        return -EIO;
    r = remote_node_command(t, &t->nodes[i], 2, info);
    if (!r)
        return -EIO;
    if (r->type != REDIS_REPLY_STRING || !strstr(r->str, "cluster_state:ok")) {
        remote_error(t, "%s:%d: %s", t->nodes[i].host, t->nodes[i].port,
                     r->type == REDIS_REPLY_ERROR ? r->str : "cluster_state is not ok");
        freeReplyObject(r);
        return -EAGAIN;
    }
    freeReplyObject(r);
    r = remote_node_command(t, &t->nodes[i], 2, slots);
    if (!r)
        return -EIO;
    for (uint32_t s = 0; s < REMOTE_SLOTS; s++)
        map[s] = REMOTE_NO_NODE;
    if (r->type != REDIS_REPLY_ARRAY) {
        rc = -EPROTO;
        goto out;
    }
    /* Each entry: start, end, then the master [host, port, id, ...], then replicas. */
    for (size_t e = 0; e < r->elements; e++) {
        const redisReply *x = r->element[e], *m;
        const char *host;
        size_t hlen;
        int node;
        if (x->type != REDIS_REPLY_ARRAY || x->elements < 3 ||
            x->element[0]->type != REDIS_REPLY_INTEGER ||
            x->element[1]->type != REDIS_REPLY_INTEGER ||
            x->element[2]->type != REDIS_REPLY_ARRAY || x->element[2]->elements < 2)
            continue;
        m = x->element[2];
        if (m->element[0]->type != REDIS_REPLY_STRING || m->element[1]->type != REDIS_REPLY_INTEGER)
            continue;
        host = m->element[0]->str;
        hlen = m->element[0]->len;
        if (hlen == 0 || (hlen == 1 && host[0] == '?')) { /* "the node you asked" */
            host = t->nodes[i].host;
            hlen = strlen(host);
        }
        node = remote_node_get(t, host, hlen,
                               m->element[1]->integer > 0 && m->element[1]->integer < 65536
                                   ? (int)m->element[1]->integer
                                   : 0);
        if (node < 0)
            continue;
        /* Every number from the network is bounded before it drives a loop. */
        long long lo = x->element[0]->integer, hi = x->element[1]->integer;
        lo = lo < 0 ? 0 : lo;
        hi = hi >= REMOTE_SLOTS ? REMOTE_SLOTS - 1 : hi;
        for (long long s = lo; s <= hi; s++)
            map[s] = (uint16_t)node;
    }
    memcpy(t->slot_node, map, sizeof(t->slot_node));
    t->map_ok = true;
out:
    freeReplyObject(r);
    return rc;
}

/* A fresh slot map from the first node that gives one: connected nodes first, then the
 * others in order (seeds are first). 0 or the last error. */
static int remote_map_refresh(struct tier_remote *t)
{
    int rc = -EIO;
    for (int pass = 0; pass < 2 && rc; pass++)
        for (uint32_t i = 0; i < t->nnodes && rc; i++)
            if ((pass == 0) == (t->nodes[i].c != NULL))
                rc = remote_map_from(t, i);
    uint64_t covered = 0;
    bool used[TIER_REMOTE_MAX_NODES] = {false};
    uint64_t masters = 0;
    for (uint32_t s = 0; s < REMOTE_SLOTS; s++)
        if (t->slot_node[s] != REMOTE_NO_NODE) {
            covered++;
            if (!used[t->slot_node[s]]) {
                used[t->slot_node[s]] = true;
                masters++;
            }
        }
    pthread_mutex_lock(&t->mu);
    if (rc == 0)
        t->st.refreshes++;
    t->st.slots = t->map_ok ? covered : 0;
    t->st.nodes = t->map_ok ? masters : 0;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* ---- the breaker (worker) --------------------------------------------------------------- */

static void remote_breaker(struct tier_remote *t, bool ok)
{
    pthread_mutex_lock(&t->mu);
    if (ok) {
        t->degraded = false;
        t->backoff_ms = t->cfg.backoff_min_ms;
    } else {
        if (!t->degraded)
            t->st.trips++;
        t->degraded = true;
        t->retry_at = remote_now_ms() + t->backoff_ms;
        t->backoff_ms =
            t->backoff_ms * 2 > t->cfg.backoff_max_ms ? t->cfg.backoff_max_ms : t->backoff_ms * 2;
        t->map_ok = false; /* the next attempt starts from a fresh map */
    }
    t->st.degraded = t->degraded;
    pthread_mutex_unlock(&t->mu);
    if (!ok)
        for (uint32_t i = 0; i < t->nnodes; i++)
            remote_node_close(&t->nodes[i]);
}

/* ---- batches (worker) ----------------------------------------------------------------- */

/* Appends the command of q to connection c: GET key, or SET key <header + data> written
 * straight into the output buffer (no intermediate copy of the record). */
static int remote_append(redisContext *c, const struct remote_req *q)
{
    char pre[160];
    int n;
    if (q->ask >= 0 && redisAppendFormattedCommand(c, "*1\r\n$6\r\nASKING\r\n", 16) != REDIS_OK)
        return -1;
    if (q->op == REMOTE_OP_GET) {
        n = snprintf(pre, sizeof(pre), "*2\r\n$3\r\nGET\r\n$%u\r\n%s\r\n", q->klen, q->key);
        return redisAppendFormattedCommand(c, pre, (size_t)n) == REDIS_OK ? 0 : -1;
    }
    n = snprintf(pre, sizeof(pre), "*3\r\n$3\r\nSET\r\n$%u\r\n%s\r\n$%llu\r\n", q->klen, q->key,
                 (unsigned long long)(REMOTE_REC_HDR + q->meta.len));
    if (redisAppendFormattedCommand(c, pre, (size_t)n) != REDIS_OK ||
        redisAppendFormattedCommand(c, (const char *)q->hdr, REMOTE_REC_HDR) != REDIS_OK ||
        redisAppendFormattedCommand(c, q->buf, q->meta.len) != REDIS_OK ||
        redisAppendFormattedCommand(c, "\r\n", 2) != REDIS_OK)
        return -1;
    return 0;
}

/* Parses "MOVED 3999 127.0.0.1:6381" or "ASK ...": the node's index, or -1. */
static int remote_redirect_node(struct tier_remote *t, const char *err)
{
    const char *sp = strchr(err, ' '), *addr, *colon;
    if (!sp || !(addr = strchr(sp + 1, ' ')))
        return -1;
    addr++;
    colon = strrchr(addr, ':');
    if (!colon)
        return -1;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || port <= 0 || port > 65535)
        return -1;
    return remote_node_get(t, addr, (size_t)(colon - addr), (int)port);
}

/* A request done: onto the done list (the caller signals the eventfd). */
static void remote_finish(struct tier_remote *t, struct remote_req *q, int status)
{
    q->status = status;
    q->next = NULL;
    pthread_mutex_lock(&t->mu);
    if (status == 0 && q->op == REMOTE_OP_GET) {
        t->st.hits++;
        t->st.bytes_read += q->meta.len;
    } else if (status == 0) {
        t->st.puts_ok++;
        t->st.bytes_written += q->meta.len;
    } else if (status == -ENOENT) {
        t->st.misses++;
    } else if (status == -EIO || (status == -EAGAIN && !t->stop)) {
        t->st.errors++;
    } else if (status != -ECANCELED) {
        t->st.bad_records++;
    }
    if (t->d_tail)
        t->d_tail->next = q;
    else
        t->d_head = q;
    t->d_tail = q;
    pthread_mutex_unlock(&t->mu);
}

/* ---- replies (worker) ------------------------------------------------------------------
 * Replies to a batch are read here rather than by hiredis: a GET's value lands straight in
 * its destination (the header first, checked, then the data read from the socket into the
 * slot and checked before anyone is told), where hiredis would copy it into its buffer and
 * again into a reply object. Commands still go out through hiredis' output buffer; its
 * reader is used only for the simple commands of remote_node_command, between batches. */

/* At least one more byte in n's buffer. 0 or -1 (connection lost, timeout). */
static int remote_rb_fill(struct remote_node *n)
{
    ssize_t r;
    if (n->rpos == n->rlen) {
        n->rpos = n->rlen = 0;
    } else if (n->rlen == sizeof(n->rbuf)) {
        memmove(n->rbuf, n->rbuf + n->rpos, n->rlen - n->rpos);
        n->rlen -= n->rpos;
        n->rpos = 0;
    }
    do
        r = recv(n->c->fd, n->rbuf + n->rlen, sizeof(n->rbuf) - n->rlen, 0);
    while (r < 0 && errno == EINTR);
    if (r <= 0)
        return -1;
    n->rlen += (size_t)r;
    return 0;
}

/* One reply line without its CRLF, NUL-terminated, into out (cap bytes). 0 or -1. */
static int remote_rb_line(struct remote_node *n, char *out, size_t cap)
{
    for (;;) {
        const uint8_t *s = n->rbuf + n->rpos;
        size_t avail = n->rlen - n->rpos;
        const uint8_t *nl = memchr(s, '\n', avail);
        if (nl) {
            size_t l = (size_t)(nl - s);
            if (l == 0 || s[l - 1] != '\r' || l > cap)
                return -1;
            memcpy(out, s, l - 1);
            out[l - 1] = '\0';
            n->rpos += l + 1;
            return 0;
        }
        if (avail > cap)
            return -1; /* no reply line is that long */
        if (remote_rb_fill(n))
            return -1;
    }
}

/* Exactly len bytes of the stream into dst, or dropped (dst NULL). Large reads go from the
 * socket straight into dst. 0 or -1. */
static int remote_rb_read(struct remote_node *n, uint8_t *dst, uint64_t len)
{
    while (len) {
        size_t avail = n->rlen - n->rpos;
        if (avail) {
            size_t take = avail < len ? avail : (size_t)len;
            if (dst) {
                memcpy(dst, n->rbuf + n->rpos, take);
                dst += take;
            }
            n->rpos += take;
            len -= take;
        } else if (dst && len >= sizeof(n->rbuf) / 2) {
            ssize_t r;
            do
                r = recv(n->c->fd, dst, len, 0);
            while (r < 0 && errno == EINTR);
            if (r <= 0)
                return -1;
            dst += r;
            len -= (uint64_t)r;
        } else if (remote_rb_fill(n)) {
            return -1;
        }
    }
    return 0;
}

/* A GET's bulk value of vlen bytes (the stream is past "$vlen\r\n"): the header into
 * q->hdr, checked; the data into q->buf, checked; the closing CRLF. A value that is not the
 * record is still read to its end (dropped) so the stream stays in step. The request's
 * status, or REMOTE_RB_LOST when the connection failed. */
#define REMOTE_RB_LOST 1
static int remote_get_value(struct remote_node *n, struct remote_req *q, uint64_t vlen)
{
    struct remote_rec_meta got;
    uint8_t crlf[2];
    int v;
    if (vlen < REMOTE_REC_HDR)
        return remote_rb_read(n, NULL, vlen + 2) ? REMOTE_RB_LOST : -EPROTO;
    if (remote_rb_read(n, q->hdr, REMOTE_REC_HDR))
        return REMOTE_RB_LOST;
    v = remote_rec_check_header(q->hdr, vlen, &q->meta, q->cap, &got);
    if (v)
        return remote_rb_read(n, NULL, vlen - REMOTE_REC_HDR + 2) ? REMOTE_RB_LOST : v;
    if (remote_rb_read(n, q->buf, got.len) || remote_rb_read(n, crlf, 2))
        return REMOTE_RB_LOST;
    if (crlf[0] != '\r' || crlf[1] != '\n')
        return REMOTE_RB_LOST; /* out of step: nothing more on this connection is trusted */
    v = remote_rec_check_data(&got, q->buf);
    if (v == 0)
        q->meta = got;
    return v;
}

/* One reply to q: 0 done (finished), 1 redirected (q goes round again), -1 connection lost
 * (q not finished). *bad set when the cluster refused. */
static int remote_reply(struct tier_remote *t, struct remote_node *n, struct remote_req *q,
                        bool *bad)
{
    char line[512];
    if (q->ask >= 0) { /* ASKING's +OK */
        if (remote_rb_line(n, line, sizeof(line)) || line[0] != '+')
            return -1;
        q->ask = -1;
    }
    if (remote_rb_line(n, line, sizeof(line)))
        return -1;
    if (line[0] == '-') {
        const char *err = line + 1;
        bool moved = strncmp(err, "MOVED ", 6) == 0, ask = strncmp(err, "ASK ", 4) == 0;
        int node = (moved || ask) ? remote_redirect_node(t, err) : -1;
        if (node >= 0 && q->redirects < REMOTE_REDIRECTS_MAX) {
            q->redirects++;
            pthread_mutex_lock(&t->mu);
            if (moved)
                t->st.moved++;
            else
                t->st.asked++;
            pthread_mutex_unlock(&t->mu);
            if (moved) {
                t->slot_node[q->slot] = (uint16_t)node;
                t->map_ok = false; /* refreshed after this batch */
            } else {
                q->ask = node;
            }
            return 1;
        }
        remote_error(t, "%s:%d: %s", n->host, n->port, err);
        *bad = true;
        remote_finish(t, q, strncmp(err, "TRYAGAIN", 8) == 0 ? -EAGAIN : -EIO);
        return 0;
    }
    if (line[0] == '+' || line[0] == ':') { /* SET's +OK (anything else simple is wrong) */
        bool ok = q->op == REMOTE_OP_PUT && line[0] == '+';
        if (!ok)
            *bad = true;
        remote_finish(t, q, ok ? 0 : -EIO);
        return 0;
    }
    if (line[0] != '$')
        return -1; /* an array or garbage: the stream is not what was asked for */
    char *end;
    long long vlen = strtoll(line + 1, &end, 10);
    if (*end || end == line + 1 || vlen < -1)
        return -1;
    if (vlen == -1) {
        remote_finish(t, q, q->op == REMOTE_OP_GET ? -ENOENT : -EIO);
        return 0;
    }
    if (q->op != REMOTE_OP_GET) {
        *bad = true;
        if (remote_rb_read(n, NULL, (uint64_t)vlen + 2))
            return -1;
        remote_finish(t, q, -EIO);
        return 0;
    }
    int v = remote_get_value(n, q, (uint64_t)vlen);
    if (v == REMOTE_RB_LOST)
        return -1;
    remote_finish(t, q, v);
    return 0;
}

/* Sends the requests on list (a round), reads the replies; redirected ones come back on
 * *again. Returns whether any node failed or refused. */
static bool remote_round(struct tier_remote *t, struct remote_req *list, struct remote_req **again)
{
    bool bad = false;
    struct remote_req *next;
    *again = NULL;
    for (struct remote_req *q = list; q; q = next) {
        int node = q->ask >= 0 ? q->ask : t->slot_node[q->slot];
        next = q->next;
        q->next = NULL;
        if (node == REMOTE_NO_NODE || node < 0) {
            remote_error(t, "slot %u has no master in the map", q->slot);
            bad = true;
            remote_finish(t, q, -EIO);
            continue;
        }
        struct remote_node *n = &t->nodes[node];
        if (n->tail)
            n->tail->next = q;
        else
            n->head = q;
        n->tail = q;
    }
    /* Write every node's share, then read: the nodes work at once. */
    for (uint32_t i = 0; i < t->nnodes; i++) {
        struct remote_node *n = &t->nodes[i];
        int done = 0;
        n->failed = false;
        if (!n->head)
            continue;
        if (remote_node_connect(t, i)) {
            n->failed = true;
            continue;
        }
        for (struct remote_req *q = n->head; q && !n->failed; q = q->next)
            if (remote_append(n->c, q))
                n->failed = true;
        while (!n->failed && !done)
            if (redisBufferWrite(n->c, &done) != REDIS_OK)
                n->failed = true;
        if (n->failed)
            remote_error(t, "%s:%d: %s", n->host, n->port, n->c->errstr);
    }
    for (uint32_t i = 0; i < t->nnodes; i++) {
        struct remote_node *n = &t->nodes[i];
        struct remote_req *q = n->head;
        n->head = n->tail = NULL;
        while (q) {
            next = q->next;
            q->next = NULL;
            int rc = n->failed ? -1 : remote_reply(t, n, q, &bad);
            if (rc < 0 && !n->failed) {
                remote_error(t, "%s:%d: %s", n->host, n->port, n->c->errstr);
                n->failed = true;
            }
            if (rc < 0) {
                remote_finish(t, q, -EIO);
            } else if (rc == 1) {
                q->next = *again;
                *again = q;
            }
            q = next;
        }
        if (n->failed) {
            bad = true;
            remote_node_close(n);
        }
    }
    return bad;
}

static void remote_batch(struct tier_remote *t, struct remote_req *list)
{
    bool bad = false;
    if (!t->map_ok && remote_map_refresh(t) != 0) {
        for (struct remote_req *q = list, *next; q; q = next) {
            next = q->next;
            remote_finish(t, q, -EIO);
        }
        remote_breaker(t, false);
        return;
    }
    for (struct remote_req *q = list; q; q = q->next)
        if (q->op == REMOTE_OP_PUT)
            remote_rec_encode(q->hdr, &q->meta, q->buf);
    while (list) {
        struct remote_req *again;
        bad |= remote_round(t, list, &again);
        list = again;
    }
    if (!t->map_ok && !bad)
        bad = remote_map_refresh(t) != 0; /* after MOVED */
    remote_breaker(t, !bad);
}

static void remote_signal(struct tier_remote *t)
{
    uint64_t one = 1;
    ssize_t w = write(t->efd, &one, sizeof(one));
    (void)w; /* the counter cannot overflow in practice; a full one is still readable */
}

static void *remote_main(void *arg)
{
    struct tier_remote *t = arg;
    /* The map at once, so the tier's state says from the start whether the cluster is
     * there (a cluster that is not makes a degraded tier, probed on its backoff). */
    remote_breaker(t, remote_map_refresh(t) == 0);
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        uint64_t now = remote_now_ms();
        if (t->degraded && now >= t->retry_at) {
            /* Half-open: probe with a fresh slot map before any request goes out. */
            pthread_mutex_unlock(&t->mu);
            bool ok = remote_map_refresh(t) == 0;
            remote_breaker(t, ok);
            pthread_mutex_lock(&t->mu);
            continue;
        }
        if (!t->q_head) {
            struct timespec ts;
            uint64_t wait = t->degraded ? t->retry_at - now : 1000;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += (time_t)(wait / 1000);
            ts.tv_nsec += (long)(wait % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&t->cv, &t->mu, &ts);
            continue;
        }
        /* A batch: up to cfg.batch requests and REMOTE_BATCH_BYTES of data. */
        struct remote_req *list = t->q_head, *last = list;
        uint64_t bytes = last->op == REMOTE_OP_PUT ? last->meta.len : last->cap;
        for (uint32_t n = 1; n < t->cfg.batch && last->next; n++) {
            uint64_t b = last->next->op == REMOTE_OP_PUT ? last->next->meta.len : last->next->cap;
            if (bytes + b > REMOTE_BATCH_BYTES)
                break;
            bytes += b;
            last = last->next;
        }
        t->q_head = last->next;
        if (!t->q_head)
            t->q_tail = NULL;
        last->next = NULL;
        bool degraded = t->degraded;
        pthread_mutex_unlock(&t->mu);
        if (degraded) {
            for (struct remote_req *q = list, *next; q; q = next) {
                next = q->next;
                remote_finish(t, q, -EAGAIN);
            }
        } else {
            remote_batch(t, list);
        }
        remote_signal(t);
        pthread_mutex_lock(&t->mu);
    }
    /* Stopping: what was not started is cancelled. */
    while (t->q_head) {
        struct remote_req *q = t->q_head;
        t->q_head = q->next;
        pthread_mutex_unlock(&t->mu);
        remote_finish(t, q, -ECANCELED);
        pthread_mutex_lock(&t->mu);
    }
    t->q_tail = NULL;
    pthread_mutex_unlock(&t->mu);
    remote_signal(t);
    return NULL;
}

/* ---- the caller's side ------------------------------------------------------------------ */

static int remote_submit(struct tier_remote *t, struct remote_req *q)
{
    pthread_mutex_lock(&t->mu);
    if (t->degraded || t->stop || t->inflight >= t->cfg.max_inflight) {
        t->st.fast_fails += t->degraded;
        pthread_mutex_unlock(&t->mu);
        free(q);
        return -EAGAIN;
    }
    if (q->op == REMOTE_OP_GET)
        t->st.gets++;
    else
        t->st.puts++;
    t->inflight++;
    q->next = NULL;
    if (t->q_tail)
        t->q_tail->next = q;
    else
        t->q_head = q;
    t->q_tail = q;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

static struct remote_req *remote_req_new(const struct remote_rec_meta *m, uint8_t op,
                                         tier_remote_done_fn done, void *arg)
{
    struct remote_req *q = malloc(sizeof(*q));
    if (!q)
        return NULL;
    memset(q, 0, offsetof(struct remote_req, hdr));
    q->op = op;
    q->ask = -1;
    q->meta = *m;
    q->klen = (uint8_t)remote_rec_key(q->key, remote_rec_ns_fp(m->ns), m->key);
    q->slot = (uint16_t)remote_rec_slot(q->key, q->klen);
    q->done = done;
    q->arg = arg;
    return q;
}

int tier_remote_get(struct tier_remote *t, const struct remote_rec_meta *want, void *dst,
                    uint64_t cap, tier_remote_done_fn done, void *arg)
{
    struct remote_req *q = remote_req_new(want, REMOTE_OP_GET, done, arg);
    if (!q)
        return -ENOMEM;
    q->buf = dst;
    q->cap = cap;
    return remote_submit(t, q);
}

int tier_remote_put(struct tier_remote *t, const struct remote_rec_meta *m, const void *src,
                    tier_remote_done_fn done, void *arg)
{
    struct remote_req *q = remote_req_new(m, REMOTE_OP_PUT, done, arg);
    if (!q)
        return -ENOMEM;
    q->buf = (void *)src; /* only read */
    return remote_submit(t, q);
}

int tier_remote_fd(const struct tier_remote *t)
{
    return t->efd;
}

int tier_remote_poll(struct tier_remote *t)
{
    uint64_t v;
    int n = 0;
    struct remote_req *q;
    if (read(t->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        return 0;
    pthread_mutex_lock(&t->mu);
    q = t->d_head;
    t->d_head = t->d_tail = NULL;
    pthread_mutex_unlock(&t->mu);
    while (q) {
        struct remote_req *next = q->next;
        pthread_mutex_lock(&t->mu);
        t->inflight--;
        pthread_mutex_unlock(&t->mu);
        q->done(q->arg, q->status, &q->meta);
        free(q);
        n++;
        q = next;
    }
    return n;
}

bool tier_remote_degraded(const struct tier_remote *t)
{
    struct tier_remote *m = (struct tier_remote *)t; /* the mutex only */
    bool d;
    pthread_mutex_lock(&m->mu);
    d = m->degraded;
    pthread_mutex_unlock(&m->mu);
    return d;
}

void tier_remote_stats(const struct tier_remote *t, struct tier_remote_stats *st)
{
    struct tier_remote *m = (struct tier_remote *)t; /* the mutex only */
    pthread_mutex_lock(&m->mu);
    *st = m->st;
    st->inflight = m->inflight;
    st->degraded = m->degraded;
    pthread_mutex_unlock(&m->mu);
}

/* Parses "host:port,host:port" into the node table (the seeds). */
static int remote_seeds(struct tier_remote *t, const char *list)
{
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ','), *colon;
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char *stop;
        long port;
        while (len && *p == ' ') {
            p++;
            len--;
        }
        colon = memrchr(p, ':', len);
        if (!colon)
            return -EINVAL;
        port = strtol(colon + 1, &stop, 10);
        if (stop != p + len || port <= 0 || port > 65535 ||
            remote_node_get(t, p, (size_t)(colon - p), (int)port) < 0)
            return -EINVAL;
        p += len;
        if (*p == ',')
            p++;
    }
    t->nseeds = t->nnodes;
    return t->nnodes ? 0 : -EINVAL;
}

struct tier_remote *tier_remote_new(const struct tier_remote_config *cfg, int *err)
{
    struct tier_remote *t = calloc(1, sizeof(*t));
    int rc = -ENOMEM;
    if (!t)
        goto fail;
    t->efd = -1;
    t->cfg = *cfg;
    if (!t->cfg.max_inflight)
        t->cfg.max_inflight = 256;
    if (!t->cfg.batch)
        t->cfg.batch = 64;
    if (!t->cfg.backoff_min_ms)
        t->cfg.backoff_min_ms = 100;
    if (t->cfg.backoff_max_ms < t->cfg.backoff_min_ms)
        t->cfg.backoff_max_ms = t->cfg.backoff_min_ms;
    t->backoff_ms = t->cfg.backoff_min_ms;
    t->user = strdup(cfg->user ? cfg->user : "");
    t->password = strdup(cfg->password ? cfg->password : "");
    if (!t->user || !t->password)
        goto fail;
    for (uint32_t s = 0; s < REMOTE_SLOTS; s++)
        t->slot_node[s] = REMOTE_NO_NODE;
    rc = cfg->nodes ? remote_seeds(t, cfg->nodes) : -EINVAL;
    if (rc)
        goto fail;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->efd < 0) {
        rc = -errno;
        goto fail_sync;
    }
    rc = -pthread_create(&t->thr, NULL, remote_main, t);
    if (rc)
        goto fail_sync;
    t->started = true;
    return t;
fail_sync:
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
fail:
    if (t) {
        if (t->efd >= 0)
            close(t->efd);
        free(t->user);
        free(t->password);
        free(t);
    }
    *err = rc;
    return NULL;
}

void tier_remote_free(struct tier_remote *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thr, NULL);
    tier_remote_poll(t); /* their callbacks release what the requests held */
    for (uint32_t i = 0; i < t->nnodes; i++)
        remote_node_close(&t->nodes[i]);
    close(t->efd);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t->user);
    free(t->password);
    free(t);
}
