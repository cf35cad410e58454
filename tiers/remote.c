/*
 * remote.c — the remote tier's worker: cluster routing, pipelined batches of block parts on
 * every master at once, circuit breaker (tiers/remote.h).
 */
#include "tiers/remote.h"
#include "tiers/remote_pool.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define REMOTE_SLOTS 16384
#define REMOTE_NO_NODE 0xffffu
#define REMOTE_BATCH_BYTES (256ull << 20) /* data bytes one batch moves at most */
#define REMOTE_CMD_MAX 160                /* [ASKING] SET key $len, or GET key: the text */
#define REMOTE_LINE_MAX 512               /* the longest reply line taken (errors) */
#define REMOTE_IOV 64                     /* iovecs per sendmsg */
#define REMOTE_DIRECT (16u << 10) /* data left at least this: recv straight into its place */

#define remote_container_of(ptr, type, member)                                                     \
    ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

enum remote_op { REMOTE_OP_GET = 1, REMOTE_OP_PUT = 2 };

struct remote_req;

/* One value of a block: its command, its reply, its place in the block. */
struct remote_part {
    struct remote_part *next; /* a round's list, then its node's (worker) */
    struct remote_req *req;   /* its block */
    uint32_t index;
    uint8_t klen;
    uint8_t clen;      /* bytes of cmd */
    uint8_t redirects; /* MOVED and ASK followed */
    bool asking;       /* this round: sent behind ASKING */
    uint16_t slot;
    int ask;      /* node to send to behind ASKING next round, or -1 */
    int status;   /* once replied */
    uint64_t xxh; /* PUT: of its bytes; GET: from its header */
    char key[REMOTE_REC_KEY_MAX];
    char cmd[REMOTE_CMD_MAX];    /* the command's text before the value (this round) */
    uint8_t hdr[REMOTE_REC_HDR]; /* PUT: the encoded header; GET: the header read (opened) */
    /* A sealed tier: the header as it travels, and the tag after the part's bytes. */
    uint8_t sealed[REMOTE_SEAL_HDR];
    uint8_t tag[REMOTE_SEAL_TAG];
    struct remote_job open_job; /* a sealed GET: its bytes opened on the pool */
    int open_status;
};

/* A block: its parts, and what the caller is told once the last of them is done. */
struct remote_req {
    struct remote_req *next; /* the queue, a batch, the done list */
    uint8_t op;              /* enum remote_op */
    bool encoded;            /* PUT: every part's header made (worker) */
    bool mixed;              /* GET: parts of different writes (worker) */
    uint32_t missing;        /* GET: parts not there (worker) */
    uint32_t left;           /* parts without a reply yet (worker) */
    int status;
    struct remote_rec_meta meta; /* PUT: the record's; GET: wanted, then the record's */
    struct remote_rec_geom geom;
    uint8_t *buf;       /* GET: destination; PUT: the data (only read) */
    uint8_t *ct;        /* PUT in a sealed tier: the parts' bytes sealed (worker; owned) */
    uint64_t *part_xxh; /* PUT: scratch for the parts' hashes (geom.count), in this block */
    bool sealed;
    bool sealing;               /* PUT: its seal job is on the pool (worker) */
    struct remote_job seal_job; /* PUT: hashed and sealed on the pool */
    struct remote_seal seal;    /* a sealed tier: the namespace's keys (wiped at free) */
    tier_remote_done_fn done;
    void *arg;
    struct remote_part parts[]; /* geom.count */
};

/* Where a connection's reader is in the reply to its current part. */
enum remote_rx {
    REMOTE_RX_ASKING, /* ASKING's +OK */
    REMOTE_RX_LINE,   /* the reply's first line */
    REMOTE_RX_HDR,    /* a GET's value: the part's header, into part->hdr */
    REMOTE_RX_DATA,   /* then its bytes, into their place in the block */
    REMOTE_RX_TAG,    /* a sealed tier: then the tag of its bytes */
    REMOTE_RX_CRLF,   /* then the CRLF that closes the value */
    REMOTE_RX_SKIP,   /* a value that is not the part: read to its end and dropped */
};

struct remote_node {
    char host[64];
    int port;
    redisContext *c; /* worker's; NULL: not connected */
    /* This round (worker): its parts in the order they go out; tx is the first not wholly
     * sent (tx_off bytes of its command are), rx the first not answered. */
    struct remote_part *head, *tail, *tx, *rx;
    uint64_t tx_off;
    uint8_t rx_state; /* enum remote_rx */
    int rx_status;    /* SKIP: the part's status when dropped */
    uint64_t rx_left; /* HDR, DATA, CRLF, SKIP: bytes still to come */
    uint64_t rx_vlen; /* the value's length */
    uint8_t crlf[2];
    bool drained; /* the last read took all the socket had: wait for poll */
    bool failed;
    uint64_t moved_ms;      /* when a byte last moved (timeouts) */
    size_t rpos, rlen;      /* rbuf[rpos, rlen): read, not yet parsed (worker) */
    uint8_t rbuf[64 << 10]; /* reply bytes as they come, when not read into their place */
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
    /* The caller's own: plug depth and the requests it holds. */
    uint32_t plugged;
    struct remote_req *p_head, *p_tail;
    /* The worker's own. */
    struct remote_node nodes[TIER_REMOTE_MAX_NODES];
    uint32_t nnodes, nseeds;
    uint16_t slot_node[REMOTE_SLOTS];
    uint16_t map_new[REMOTE_SLOTS]; /* the map being read from CLUSTER SLOTS */
    struct remote_pool *pool;       /* a sealed tier's CPU threads (NULL: the worker seals) */
    uint32_t jobs;                  /* submitted to the pool, not collected (worker) */
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

/* ---- blocks and parts (worker) ---------------------------------------------------------- */

/* A block done: its status counted, onto the done list (the caller signals the eventfd).
 * Nothing of q may be touched after this: the caller's thread may free it at once. */
static void remote_req_finish(struct tier_remote *t, struct remote_req *q, int status)
{
    uint64_t ok = 0;
    for (uint32_t i = 0; i < q->geom.count; i++)
        ok += q->parts[i].status == 0;
    free(q->ct); /* the sealed bytes are sent (or never will be) */
    q->ct = NULL;
    q->status = status;
    q->next = NULL;
    pthread_mutex_lock(&t->mu);
    if (q->op == REMOTE_OP_GET)
        t->st.parts_read += ok;
    else
        t->st.parts_written += ok;
    if (status == 0 && q->op == REMOTE_OP_GET) {
        t->st.hits++;
        t->st.bytes_read += q->meta.len;
    } else if (status == 0) {
        t->st.puts_ok++;
        t->st.bytes_written += q->meta.len;
    } else if (status == -ENOENT) {
        t->st.misses++;
        t->st.part_missing += q->missing && q->missing < q->geom.count;
    } else if (status == -EIO || (status == -EAGAIN && !t->stop)) {
        t->st.errors++;
    } else if (status != -ECANCELED) {
        t->st.bad_records++;
        t->st.part_mixed += q->mixed;
        t->st.seal_refused += status == -EKEYREJECTED;
    }
    if (t->d_tail)
        t->d_tail->next = q;
    else
        t->d_head = q;
    t->d_tail = q;
    pthread_mutex_unlock(&t->mu);
}

/* The block's status from its parts': a network error; else a part refused; else a part
 * missing (all of them: a plain miss); else, for a GET of several parts, they must all be
 * of one write. */
static int remote_req_settle(struct remote_req *q)
{
    int net = 0, bad = 0;
    for (uint32_t i = 0; i < q->geom.count; i++) {
        int s = q->parts[i].status;
        if (s == -EIO || s == -EAGAIN || s == -ECANCELED)
            net = net ? net : s;
        else if (s == -ENOENT)
            q->missing++;
        else if (s)
            bad = bad ? bad : s;
    }
    if (net || bad)
        return net ? net : bad;
    if (q->missing)
        return -ENOENT;
    for (uint32_t i = 1; q->op == REMOTE_OP_GET && i < q->geom.count; i++)
        if (remote_rec_same_write(q->parts[0].hdr, q->parts[i].hdr)) {
            q->mixed = true;
            return -ESTALE;
        }
    return 0;
}

/* A part answered (or failed): the block is done with its last part (and, a PUT, once
 * the pool no longer seals it). */
static void remote_part_done(struct tier_remote *t, struct remote_part *p, int status)
{
    struct remote_req *q = p->req;
    p->status = status;
    if (--q->left == 0 && !q->sealing)
        remote_req_finish(t, q, remote_req_settle(q));
}

/* A PUT's headers, when its first part is about to go out: the block is hashed (every part
 * and the whole), and every part's header says so; in a sealed tier each part is sealed into
 * q->ct (allocated when the batch started: remote_round). */
static void remote_req_encode(struct remote_req *q)
{
    q->meta.data_xxh = remote_rec_hash(&q->geom, q->buf, q->part_xxh);
    for (uint32_t i = 0; i < q->geom.count; i++) {
        struct remote_part *p = &q->parts[i];
        uint64_t off = remote_rec_part_off(&q->geom, i);
        p->xxh = q->part_xxh[i];
        remote_rec_encode(p->hdr, &q->meta, &q->geom, i, q->part_xxh[i]);
        if (q->sealed) {
            uint8_t nonce[24];
            remote_seal_nonce(nonce);
            remote_seal_part(p->sealed, q->ct + off, p->tag, p->hdr, q->buf + off,
                             remote_rec_part_len(&q->geom, i), &q->seal, &q->meta, &q->geom, i,
                             nonce);
        }
    }
    q->encoded = true;
}

/* The pool's jobs: a PUT's block sealed, a sealed GET's part opened in place. */
static void remote_seal_run(struct remote_job *j)
{
    remote_req_encode(remote_container_of(j, struct remote_req, seal_job));
}

/* A sealed part's bytes, in their place as ciphertext with their tag: opened in place (the
 * tag checked before a byte is decrypted), then checked against the plaintext's checksum,
 * as an unsealed part's bytes are. */
static int remote_part_open(struct remote_part *p)
{
    struct remote_req *q = p->req;
    uint8_t *at = q->buf + remote_rec_part_off(&q->geom, p->index);
    uint64_t len = remote_rec_part_len(&q->geom, p->index);
    int rc = remote_seal_open_data(p->sealed, p->hdr, &q->seal, at, len, p->tag);
    return rc ? rc : remote_rec_check_data(p->xxh, at, len);
}

static void remote_open_run(struct remote_job *j)
{
    struct remote_part *p = remote_container_of(j, struct remote_part, open_job);
    p->open_status = remote_part_open(p);
}

/* Finished jobs back from the pool: a sealed block may go out (or, all its parts failed
 * meanwhile, be done); an opened part is answered. */
static void remote_jobs_collect(struct tier_remote *t)
{
    struct remote_job *j = remote_pool_collect(t->pool), *next;
    for (; j; j = next) {
        next = j->next;
        t->jobs--;
        if (j->run == remote_seal_run) {
            struct remote_req *q = remote_container_of(j, struct remote_req, seal_job);
            q->sealing = false;
            if (q->left == 0)
                remote_req_finish(t, q, remote_req_settle(q));
        } else {
            struct remote_part *p = remote_container_of(j, struct remote_part, open_job);
            remote_part_done(t, p, p->open_status);
        }
    }
}

/* Whether p's command may go out: a PUT's block sealed (a sealed tier with a pool). */
static bool remote_part_ready(const struct remote_part *p)
{
    return !p->req->sealing;
}

/* The bytes of p's value: its header as it travels, its bytes, a sealed part's tag. */
static uint64_t remote_part_vlen(const struct remote_req *q, uint32_t index)
{
    uint64_t len = remote_rec_part_len(&q->geom, index);
    return q->sealed ? REMOTE_SEAL_HDR + len + REMOTE_SEAL_TAG : REMOTE_REC_HDR + len;
}

/* The text of p's command before its value: [ASKING] GET key, or [ASKING] SET key $len. */
static void remote_part_cmd(struct remote_part *p)
{
    const struct remote_req *q = p->req;
    int n = 0;
    if (p->asking)
        n = snprintf(p->cmd, sizeof(p->cmd), "*1\r\n$6\r\nASKING\r\n");
    if (q->op == REMOTE_OP_GET)
        n += snprintf(p->cmd + n, sizeof(p->cmd) - (size_t)n, "*2\r\n$3\r\nGET\r\n$%u\r\n%s\r\n",
                      p->klen, p->key);
    else
        n += snprintf(p->cmd + n, sizeof(p->cmd) - (size_t)n,
                      "*3\r\n$3\r\nSET\r\n$%u\r\n%s\r\n$%llu\r\n", p->klen, p->key,
                      (unsigned long long)remote_part_vlen(q, p->index));
    p->clen = (uint8_t)n;
}

static uint64_t remote_part_cmd_len(const struct remote_part *p)
{
    const struct remote_req *q = p->req;
    return p->clen + (q->op == REMOTE_OP_PUT ? remote_part_vlen(q, p->index) + 2 : 0);
}

/* The iovecs of p's command past its first skip bytes (at most 5). A PUT's value goes out
 * from its header and the block's own memory (sealed: its sealed copy, then the tag). */
static int remote_part_iov(struct remote_part *p, struct iovec *iov, uint64_t skip)
{
    struct remote_req *q = p->req;
    struct iovec seg[5];
    int nseg = 0, n = 0;
    seg[nseg++] = (struct iovec){p->cmd, p->clen};
    if (q->op == REMOTE_OP_PUT) {
        uint64_t off = remote_rec_part_off(&q->geom, p->index);
        if (!q->encoded)
            remote_req_encode(q);
        seg[nseg++] = q->sealed ? (struct iovec){p->sealed, REMOTE_SEAL_HDR}
                                : (struct iovec){p->hdr, REMOTE_REC_HDR};
        seg[nseg++] = (struct iovec){(q->sealed ? q->ct : q->buf) + off,
                                     remote_rec_part_len(&q->geom, p->index)};
        if (q->sealed)
            seg[nseg++] = (struct iovec){p->tag, REMOTE_SEAL_TAG};
        seg[nseg++] = (struct iovec){(void *)"\r\n", 2};
    }
    for (int i = 0; i < nseg; i++) {
        if (skip >= seg[i].iov_len) {
            skip -= seg[i].iov_len;
            continue;
        }
        iov[n++] = (struct iovec){(uint8_t *)seg[i].iov_base + skip, seg[i].iov_len - skip};
        skip = 0;
    }
    return n;
}

/* ---- one connection's commands and replies (worker) ---------------------------------------
 * Nothing here blocks: each call moves what the socket takes or has, and the next resumes
 * where it stopped (the send cursor, the reader's state), so one thread keeps every master
 * busy at once. A GET's value lands straight in its place (the header first, checked, then
 * the bytes read from the socket into the block's slot and checked before anyone is told),
 * where hiredis would copy it into its buffer and again into a reply object. */

/* Sends what the socket takes of n's commands. 0, or -1 (connection lost). A send that
 * took less than it was given found the socket full: the next one waits for poll. */
static int remote_tx(struct remote_node *n)
{
    while (n->tx && remote_part_ready(n->tx)) {
        struct iovec iov[REMOTE_IOV];
        struct msghdr mh = {.msg_iov = iov};
        uint64_t skip = n->tx_off, given = 0;
        int cnt = 0;
        for (struct remote_part *p = n->tx; p && remote_part_ready(p) && cnt <= REMOTE_IOV - 5;
             p = p->next) {
            cnt += remote_part_iov(p, iov + cnt, skip);
            skip = 0;
        }
        for (int i = 0; i < cnt; i++)
            given += iov[i].iov_len;
        mh.msg_iovlen = (size_t)cnt;
        ssize_t w = sendmsg(n->c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        n->moved_ms = remote_now_ms();
        for (uint64_t sent = (uint64_t)w; sent && n->tx;) {
            uint64_t rest = remote_part_cmd_len(n->tx) - n->tx_off;
            if (sent < rest) {
                n->tx_off += sent;
                sent = 0;
            } else {
                sent -= rest;
                n->tx = n->tx->next;
                n->tx_off = 0;
            }
        }
        if ((uint64_t)w < given)
            return 0;
    }
    return 0;
}

/* More reply bytes into n's buffer: 1, 0 (none for now), -1 (connection lost). A read
 * that did not fill what it could take drained the socket: the next one waits for poll. */
static int remote_rx_fill(struct remote_node *n)
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
        r = recv(n->c->fd, n->rbuf + n->rlen, sizeof(n->rbuf) - n->rlen, MSG_DONTWAIT);
    while (r < 0 && errno == EINTR);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    if (r <= 0)
        return -1;
    n->drained = n->rlen + (size_t)r < sizeof(n->rbuf);
    n->rlen += (size_t)r;
    n->moved_ms = remote_now_ms();
    return 1;
}

/* p (n's current part) is answered: the reader moves to the next part, then p's block hears
 * of it (which may end the block: nothing of p is touched after). */
static void remote_rx_answered(struct tier_remote *t, struct remote_node *n, struct remote_part *p,
                               int status)
{
    n->rx = p->next;
    n->rx_state = n->rx && n->rx->asking ? REMOTE_RX_ASKING : REMOTE_RX_LINE;
    remote_part_done(t, p, status);
}

/* The rest of the value (left bytes, with its CRLF) to read and drop; then the part gets
 * status. */
static void remote_rx_skip(struct remote_node *n, uint64_t left, int status)
{
    n->rx_state = REMOTE_RX_SKIP;
    n->rx_left = left;
    n->rx_status = status;
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

/* The first line of the reply to p. 0, or -1 (the stream is not what was asked for).
 * Redirected parts go onto *again; *bad is set when the cluster refused. */
static int remote_rx_line(struct tier_remote *t, struct remote_node *n, struct remote_part *p,
                          const char *line, struct remote_part **again, bool *bad)
{
    bool get = p->req->op == REMOTE_OP_GET;
    if (line[0] == '-') {
        const char *err = line + 1;
        bool moved = strncmp(err, "MOVED ", 6) == 0, ask = strncmp(err, "ASK ", 4) == 0;
        int node = (moved || ask) ? remote_redirect_node(t, err) : -1;
        if (node >= 0 && p->redirects < REMOTE_REDIRECTS_MAX) {
            p->redirects++;
            pthread_mutex_lock(&t->mu);
            if (moved)
                t->st.moved++;
            else
                t->st.asked++;
            pthread_mutex_unlock(&t->mu);
            if (moved) {
                t->slot_node[p->slot] = (uint16_t)node;
                t->map_ok = false; /* refreshed after this batch */
            } else {
                p->ask = node;
            }
            n->rx = p->next;
            n->rx_state = n->rx && n->rx->asking ? REMOTE_RX_ASKING : REMOTE_RX_LINE;
            p->next = *again;
            *again = p;
            return 0;
        }
        remote_error(t, "%s:%d: %s", n->host, n->port, err);
        *bad = true;
        remote_rx_answered(t, n, p, strncmp(err, "TRYAGAIN", 8) == 0 ? -EAGAIN : -EIO);
        return 0;
    }
    if (line[0] == '+' || line[0] == ':') { /* SET's +OK (anything else simple is wrong) */
        bool ok = !get && line[0] == '+';
        *bad |= !ok;
        remote_rx_answered(t, n, p, ok ? 0 : -EIO);
        return 0;
    }
    if (line[0] != '$')
        return -1; /* an array or garbage */
    char *end;
    long long vlen = strtoll(line + 1, &end, 10);
    if (*end || end == line + 1 || vlen < -1)
        return -1;
    if (vlen == -1) {
        remote_rx_answered(t, n, p, get ? -ENOENT : -EIO);
        return 0;
    }
    n->rx_vlen = (uint64_t)vlen;
    if (!get) {
        *bad = true;
        remote_rx_skip(n, n->rx_vlen + 2, -EIO);
    } else if (n->rx_vlen < (p->req->sealed ? REMOTE_SEAL_HDR + REMOTE_SEAL_TAG : REMOTE_REC_HDR)) {
        remote_rx_skip(n, n->rx_vlen + 2, -EPROTO);
    } else {
        n->rx_state = REMOTE_RX_HDR;
        n->rx_left = p->req->sealed ? REMOTE_SEAL_HDR : REMOTE_REC_HDR;
    }
    return 0;
}

/* p's header has come: opened (a sealed tier) and checked before any of its bytes may
 * land. */
static void remote_rx_header(struct remote_node *n, struct remote_part *p)
{
    struct remote_req *q = p->req;
    struct remote_rec_meta got;
    uint64_t hlen = q->sealed ? REMOTE_SEAL_HDR : REMOTE_REC_HDR, vlen = n->rx_vlen;
    int v = 0;
    if (q->sealed) {
        v = remote_seal_open_header(p->sealed, n->rx_vlen, &q->seal, &q->meta, &q->geom, p->index,
                                    p->hdr);
        vlen = REMOTE_REC_HDR + remote_rec_part_len(&q->geom, p->index); /* its length checked */
    }
    if (!v)
        v = remote_rec_check_header(p->hdr, vlen, &q->meta, &q->geom, p->index, &got, &p->xxh);
    if (v) {
        remote_rx_skip(n, n->rx_vlen - hlen + 2, v);
        return;
    }
    if (p->index == 0)
        q->meta = got; /* what the record says (the fields checked are equal) */
    n->rx_state = REMOTE_RX_DATA;
    n->rx_left = remote_rec_part_len(&q->geom, p->index);
}

/* Reads and parses what has come of n's replies. 0 (nothing more for now, or every part
 * answered), -1 (connection lost, or the stream out of step: nothing more on it is
 * trusted). */
static int remote_rx(struct tier_remote *t, struct remote_node *n, struct remote_part **again,
                     bool *bad)
{
    while (n->rx) {
        struct remote_part *p = n->rx;
        struct remote_req *q = p->req;
        size_t avail = n->rlen - n->rpos, take;
        uint8_t *at;
        int rc;
        if (n->rx_state == REMOTE_RX_ASKING || n->rx_state == REMOTE_RX_LINE) {
            char line[REMOTE_LINE_MAX + 1];
            const uint8_t *s = n->rbuf + n->rpos, *nl = memchr(s, '\n', avail);
            if (!nl) {
                if (avail > REMOTE_LINE_MAX)
                    return -1; /* no reply line is that long */
                if (n->drained)
                    return 0;
                if ((rc = remote_rx_fill(n)) <= 0)
                    return rc;
                continue;
            }
            size_t l = (size_t)(nl - s);
            if (l == 0 || s[l - 1] != '\r' || l > REMOTE_LINE_MAX)
                return -1;
            memcpy(line, s, l - 1);
            line[l - 1] = '\0';
            n->rpos += l + 1;
            if (n->rx_state == REMOTE_RX_LINE) {
                if (remote_rx_line(t, n, p, line, again, bad))
                    return -1;
            } else if (line[0] == '+') {
                n->rx_state = REMOTE_RX_LINE; /* ASKING's +OK */
            } else {
                return -1;
            }
            continue;
        }
        if (!avail && n->drained)
            return 0;
        if (n->rx_state == REMOTE_RX_DATA && !avail && n->rx_left >= REMOTE_DIRECT) {
            /* Straight from the socket into the part's place. */
            at = q->buf + remote_rec_part_off(&q->geom, p->index) +
                 remote_rec_part_len(&q->geom, p->index) - n->rx_left;
            ssize_t r = recv(n->c->fd, at, n->rx_left, MSG_DONTWAIT);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return 0;
            if (r <= 0)
                return -1;
            n->drained = (uint64_t)r < n->rx_left;
            n->rx_left -= (uint64_t)r;
            n->moved_ms = remote_now_ms();
        } else if (n->rx_left) {
            if (!avail) {
                if ((rc = remote_rx_fill(n)) <= 0)
                    return rc;
                continue;
            }
            take = avail < n->rx_left ? avail : (size_t)n->rx_left;
            if (n->rx_state == REMOTE_RX_HDR)
                at = q->sealed ? p->sealed + REMOTE_SEAL_HDR - n->rx_left
                               : p->hdr + REMOTE_REC_HDR - n->rx_left;
            else if (n->rx_state == REMOTE_RX_TAG)
                at = p->tag + REMOTE_SEAL_TAG - n->rx_left;
            else if (n->rx_state == REMOTE_RX_DATA)
                at = q->buf + remote_rec_part_off(&q->geom, p->index) +
                     remote_rec_part_len(&q->geom, p->index) - n->rx_left;
            else if (n->rx_state == REMOTE_RX_CRLF)
                at = n->crlf + 2 - n->rx_left;
            else
                at = NULL; /* SKIP */
            if (at)
                memcpy(at, n->rbuf + n->rpos, take);
            n->rpos += take;
            n->rx_left -= take;
        }
        if (n->rx_left)
            continue;
        if (n->rx_state == REMOTE_RX_HDR) {
            remote_rx_header(n, p);
        } else if (n->rx_state == REMOTE_RX_DATA && q->sealed) {
            n->rx_state = REMOTE_RX_TAG;
            n->rx_left = REMOTE_SEAL_TAG;
        } else if (n->rx_state == REMOTE_RX_DATA || n->rx_state == REMOTE_RX_TAG) {
            n->rx_state = REMOTE_RX_CRLF;
            n->rx_left = 2;
        } else if (n->rx_state == REMOTE_RX_CRLF) {
            if (n->crlf[0] != '\r' || n->crlf[1] != '\n')
                return -1;
            if (q->sealed && t->pool) {
                /* Opened on the pool; the reader goes on to the next reply meanwhile. */
                n->rx = p->next;
                n->rx_state = n->rx && n->rx->asking ? REMOTE_RX_ASKING : REMOTE_RX_LINE;
                p->open_job.run = remote_open_run;
                t->jobs++;
                remote_pool_submit(t->pool, &p->open_job);
                continue;
            }
            rc = q->sealed ? remote_part_open(p)
                           : remote_rec_check_data(p->xxh,
                                                   q->buf + remote_rec_part_off(&q->geom, p->index),
                                                   remote_rec_part_len(&q->geom, p->index));
            remote_rx_answered(t, n, p, rc);
        } else { /* SKIP */
            remote_rx_answered(t, n, p, n->rx_status);
        }
    }
    return 0;
}

/* n failed: its parts not answered fail with -EIO, its connection closes. */
static void remote_node_fail(struct tier_remote *t, struct remote_node *n, const char *why)
{
    remote_error(t, "%s:%d: %s", n->host, n->port, why);
    n->failed = true;
    while (n->rx) {
        struct remote_part *p = n->rx;
        n->rx = p->next;
        remote_part_done(t, p, -EIO);
    }
    n->tx = NULL;
}

/* ---- batches (worker) --------------------------------------------------------------------- */

/* Sends the parts on list (a round) to their masters and reads the replies, every master at
 * once; redirected parts come back on *again. Returns whether any node failed or refused. */
static bool remote_round(struct tier_remote *t, struct remote_part *list,
                         struct remote_part **again)
{
    bool bad = false;
    struct remote_part *next;
    *again = NULL;
    for (struct remote_part *p = list; p; p = next) {
        int node = p->ask >= 0 ? p->ask : t->slot_node[p->slot];
        struct remote_req *q = p->req;
        next = p->next;
        p->next = NULL;
        /* A sealed PUT's room for its sealed bytes, held while its batch runs. */
        if (q->op == REMOTE_OP_PUT && q->sealed && !q->ct &&
            !(q->ct = malloc(q->geom.len ? q->geom.len : 1))) {
            remote_error(t, "no memory to seal a block of %llu bytes",
                         (unsigned long long)q->geom.len);
            remote_part_done(t, p, -ENOMEM);
            continue;
        }
        /* sealing first: while it is set, q->encoded is the pool's to write. */
        if (q->op == REMOTE_OP_PUT && q->sealed && t->pool && !q->sealing && !q->encoded) {
            q->sealing = true; /* its parts wait for the pool before they go out */
            q->seal_job.run = remote_seal_run;
            t->jobs++;
            remote_pool_submit(t->pool, &q->seal_job);
        }
        if (node == REMOTE_NO_NODE || node < 0) {
            remote_error(t, "slot %u has no master in the map", p->slot);
            bad = true;
            remote_part_done(t, p, -EIO);
            continue;
        }
        p->asking = p->ask >= 0;
        p->ask = -1;
        remote_part_cmd(p);
        struct remote_node *n = &t->nodes[node];
        if (n->tail)
            n->tail->next = p;
        else
            n->head = p;
        n->tail = p;
    }
    uint64_t now = remote_now_ms();
    for (uint32_t i = 0; i < t->nnodes; i++) {
        struct remote_node *n = &t->nodes[i];
        n->failed = false;
        n->tx = n->rx = n->head;
        n->tx_off = 0;
        n->moved_ms = now;
        if (n->head)
            n->rx_state = n->head->asking ? REMOTE_RX_ASKING : REMOTE_RX_LINE;
        if (n->head && remote_node_connect(t, i))
            remote_node_fail(t, n, "cannot connect");
    }
    for (;;) {
        struct pollfd pfd[TIER_REMOTE_MAX_NODES + 1];
        uint32_t at[TIER_REMOTE_MAX_NODES];
        uint64_t wait = t->cfg.timeout_ms;
        nfds_t k = 0;
        now = remote_now_ms();
        for (uint32_t i = 0; i < t->nnodes; i++) {
            struct remote_node *n = &t->nodes[i];
            if (n->failed || (!n->tx && !n->rx))
                continue;
            if (n->tx && n->rx == n->tx && !remote_part_ready(n->tx))
                n->moved_ms = now; /* waiting for the pool, not for the network */
            if (now - n->moved_ms >= t->cfg.timeout_ms) {
                remote_node_fail(t, n, "timed out");
                continue;
            }
            if (n->moved_ms + t->cfg.timeout_ms - now < wait)
                wait = n->moved_ms + t->cfg.timeout_ms - now;
            pfd[k] = (struct pollfd){
                .fd = n->c->fd,
                .events = (short)((n->tx && remote_part_ready(n->tx) ? POLLOUT : 0) | POLLIN)};
            at[k++] = i;
        }
        if (!k && !t->jobs)
            break;
        nfds_t nk = k; /* the nodes; then the pool's fd while it holds jobs */
        if (t->jobs)
            pfd[k++] = (struct pollfd){.fd = remote_pool_fd(t->pool), .events = POLLIN};
        if (poll(pfd, k, (int)wait) < 0 && errno != EINTR) {
            for (nfds_t j = 0; j < nk; j++)
                remote_node_fail(t, &t->nodes[at[j]], strerror(errno));
            while (t->jobs) { /* what the pool holds must come back before the round ends */
                struct pollfd pp = {.fd = remote_pool_fd(t->pool), .events = POLLIN};
                (void)poll(&pp, 1, 100);
                remote_jobs_collect(t);
            }
            break;
        }
        if (nk < k && (pfd[nk].revents & POLLIN))
            remote_jobs_collect(t);
        k = nk;
        for (nfds_t j = 0; j < k; j++) {
            struct remote_node *n = &t->nodes[at[j]];
            short ev = pfd[j].revents;
            if (ev & POLLNVAL)
                remote_node_fail(t, n, "connection closed");
            else if ((ev & (POLLOUT | POLLERR | POLLHUP)) && n->tx && remote_tx(n))
                remote_node_fail(t, n, strerror(errno ? errno : EPIPE));
            n->drained = false;
            if (!n->failed && (ev & (POLLIN | POLLERR | POLLHUP)) && remote_rx(t, n, again, &bad))
                remote_node_fail(t, n, "connection lost, or a reply out of step");
        }
    }
    for (uint32_t i = 0; i < t->nnodes; i++) {
        struct remote_node *n = &t->nodes[i];
        bool used = n->head != NULL;
        n->head = n->tail = n->tx = n->rx = NULL;
        if (n->failed) {
            bad = true;
            remote_node_close(n);
        } else if (used && n->rpos != n->rlen) {
            remote_node_close(n); /* bytes nobody asked for: out of step */
        }
    }
    return bad;
}

/* A batch: the parts of its blocks, in rounds until no part is redirected. */
static void remote_batch(struct tier_remote *t, struct remote_req *reqs)
{
    struct remote_part *list = NULL, **tail = &list;
    bool bad = false;
    pthread_mutex_lock(&t->mu);
    t->st.batches++;
    pthread_mutex_unlock(&t->mu);
    if (!t->map_ok && remote_map_refresh(t) != 0) {
        for (struct remote_req *q = reqs, *next; q; q = next) {
            next = q->next;
            remote_req_finish(t, q, -EIO);
        }
        remote_breaker(t, false);
        return;
    }
    for (struct remote_req *q = reqs; q; q = q->next)
        for (uint32_t i = 0; i < q->geom.count; i++) {
            *tail = &q->parts[i];
            tail = &q->parts[i].next;
        }
    *tail = NULL;
    while (list) {
        struct remote_part *again;
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
        /* A batch: whole blocks, up to cfg.batch parts and REMOTE_BATCH_BYTES of data (the
         * first block whatever its size). */
        struct remote_req *list = t->q_head, *last = list;
        uint64_t bytes = last->meta.len, parts = last->geom.count;
        while (last->next && parts + last->next->geom.count <= t->cfg.batch &&
               bytes + last->next->meta.len <= REMOTE_BATCH_BYTES) {
            last = last->next;
            parts += last->geom.count;
            bytes += last->meta.len;
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
                remote_req_finish(t, q, -EAGAIN);
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
        remote_req_finish(t, q, -ECANCELED);
        pthread_mutex_lock(&t->mu);
    }
    t->q_tail = NULL;
    pthread_mutex_unlock(&t->mu);
    remote_signal(t);
    return NULL;
}

/* ---- the caller's side ------------------------------------------------------------------ */

/* A request's memory, its keys wiped first. */
static void remote_req_free(struct remote_req *q)
{
    if (q->sealed)
        remote_seal_wipe(&q->seal, sizeof(q->seal));
    free(q->ct);
    free(q);
}

static int remote_submit(struct tier_remote *t, struct remote_req *q)
{
    pthread_mutex_lock(&t->mu);
    if (t->degraded || t->stop || t->inflight >= t->cfg.max_inflight) {
        t->st.fast_fails += t->degraded;
        pthread_mutex_unlock(&t->mu);
        remote_req_free(q);
        return -EAGAIN;
    }
    if (q->op == REMOTE_OP_GET)
        t->st.gets++;
    else
        t->st.puts++;
    t->inflight++;
    q->next = NULL;
    if (t->plugged) { /* held until the last unplug (the caller's own list) */
        pthread_mutex_unlock(&t->mu);
        if (t->p_tail)
            t->p_tail->next = q;
        else
            t->p_head = q;
        t->p_tail = q;
        return 0;
    }
    if (t->q_tail)
        t->q_tail->next = q;
    else
        t->q_head = q;
    t->q_tail = q;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

void tier_remote_plug(struct tier_remote *t)
{
    t->plugged++;
}

void tier_remote_unplug(struct tier_remote *t)
{
    if (!t->plugged || --t->plugged || !t->p_head)
        return;
    pthread_mutex_lock(&t->mu);
    if (t->q_tail)
        t->q_tail->next = t->p_head;
    else
        t->q_head = t->p_head;
    t->q_tail = t->p_tail;
    t->p_head = t->p_tail = NULL;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* A block's request with its parts (and a PUT's scratch for their hashes), in one
 * allocation. */
static struct remote_req *remote_req_new(const struct tier_remote *t,
                                         const struct remote_rec_meta *m,
                                         const struct remote_seal *seal, uint8_t op, void *buf,
                                         tier_remote_done_fn done, void *arg, int *err)
{
    struct remote_rec_geom g;
    struct remote_req *q;
    uint64_t fp = remote_rec_ns_fp(m->ns);
    size_t size;
    if (t->cfg.sealed != (seal != NULL)) {
        *err = -EINVAL;
        return NULL;
    }
    *err = remote_rec_geom(m->len, t->cfg.part_size, &g);
    if (*err)
        return NULL;
    size = sizeof(*q) + g.count * sizeof(q->parts[0]) +
           (op == REMOTE_OP_PUT ? g.count * sizeof(uint64_t) : 0);
    q = malloc(size);
    if (!q) {
        *err = -ENOMEM;
        return NULL;
    }
    memset(q, 0, sizeof(*q));
    q->op = op;
    q->meta = *m;
    q->sealed = seal != NULL;
    if (seal)
        q->seal = *seal;
    q->geom = g;
    q->left = g.count;
    q->buf = buf;
    q->part_xxh = op == REMOTE_OP_PUT ? (uint64_t *)(q->parts + g.count) : NULL;
    q->done = done;
    q->arg = arg;
    for (uint32_t i = 0; i < g.count; i++) {
        struct remote_part *p = &q->parts[i];
        p->next = NULL;
        p->req = q;
        p->index = i;
        p->redirects = 0;
        p->asking = false;
        p->ask = -1;
        p->status = 1; /* no reply yet */
        p->klen = (uint8_t)(seal ? remote_seal_key(p->key, seal, m->key, &g, i)
                                 : remote_rec_key(p->key, fp, m->key, &g, i));
        p->slot = (uint16_t)remote_rec_slot(p->key, p->klen);
    }
    return q;
}

int tier_remote_get(struct tier_remote *t, const struct remote_rec_meta *want,
                    const struct remote_seal *seal, void *dst, tier_remote_done_fn done, void *arg)
{
    int rc;
    struct remote_req *q = remote_req_new(t, want, seal, REMOTE_OP_GET, dst, done, arg, &rc);
    return q ? remote_submit(t, q) : rc;
}

int tier_remote_put(struct tier_remote *t, const struct remote_rec_meta *m,
                    const struct remote_seal *seal, const void *src, tier_remote_done_fn done,
                    void *arg)
{
    int rc;
    struct remote_req *q =
        remote_req_new(t, m, seal, REMOTE_OP_PUT, (void *)src /* only read */, done, arg, &rc);
    return q ? remote_submit(t, q) : rc;
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
        remote_req_free(q);
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
    if (t->cfg.part_size && t->cfg.part_size < REMOTE_REC_PART_MIN) {
        rc = -EINVAL;
        goto fail;
    }
    if (t->cfg.sealed && (rc = remote_seal_init()) != 0)
        goto fail;
    if (t->cfg.sealed && t->cfg.seal_threads &&
        !(t->pool = remote_pool_new(t->cfg.seal_threads, &rc)))
        goto fail;
    rc = -ENOMEM;
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
        remote_pool_free(t->pool);
        if (t->efd >= 0)
            close(t->efd);
        free(t->user);
        if (t->password)
            remote_seal_wipe(t->password, strlen(t->password));
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
    t->plugged = 1;
    tier_remote_unplug(t); /* held requests are cancelled with the rest */
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thr, NULL);
    remote_pool_free(t->pool); /* every round ended with nothing on it */
    tier_remote_poll(t);       /* their callbacks release what the requests held */
    for (uint32_t i = 0; i < t->nnodes; i++)
        remote_node_close(&t->nodes[i]);
    close(t->efd);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t->user);
    remote_seal_wipe(t->password, strlen(t->password));
    free(t->password);
    free(t);
}
