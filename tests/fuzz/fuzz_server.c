/* libFuzzer target: the server and the store behind it, driven through real connections.
 *
 * DESIGN
 * Each input builds a fresh store (a small host arena, the engine attached), a server on a
 * socket in a private directory, and up to FZ_NCONN client connections, then reads itself as a
 * sequence of operations: one byte picks the connection and the request (budgeted lookups,
 * per-head or not, and per-head hints among them), the next ones its arguments (keys from a
 * small space so hits, dedup and eviction happen; lease and reservation ids of this connection,
 * of another one, released ones or made up; counts and flags), and one byte may spoil the
 * datagram (short, long, wrong magic, version, length, opcode). After each send this thread
 * runs the loop until the connection has an answer or the server closed it, the client side
 * being registered on the same loop. At the end every connection is closed and the store must
 * hold nothing for anyone: no pin, no reservation, no reserved block, each namespace's block
 * count equal to its committed blocks in the index, every committed block found under its key,
 * its parent cached, its child count right. The fast path is on: FAST_ATTACH hands out hit
 * rings (mapped here, then filled with entries made of real blocks of the store, of namespaces
 * and blocks of nobody, with made-up counts and copy times, and heads moved on, backwards or
 * far ahead), their uid's bell (mapped here; its bits set as libkvc sets them, or any word
 * written with anything, or all of them set or cleared) and indexes (mapped read-only; a writable mapping must be refused). At the end the
 * daemon must have counted no more ring entries than it could have read, credited no more copy
 * time than its connections could have spent, and every entry of arena 0's index must name a
 * committed block at that place. Run with `make fuzz` (clang, ASan+UBSan); with
 * FUZZ_SERVER_IO_THREADS=2 the sockets are read and written by I/O threads (fuzz-smoke runs
 * it both ways). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/kvc_fast.h"
#include "client/kvc_proto.h"
#include "daemon/config.h"
#include "daemon/engine.h"
#include "daemon/index.h"
#include "daemon/log.h"
#include "daemon/loop.h"
#include "daemon/server.h"
#include "daemon/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define FZ_NCONN 4
#define FZ_MAX_OPS 96
#define FZ_NKEYS 12 /* key space of a chain: hits and dedup are frequent */
#define FZ_NIDS 32  /* remembered lease and reservation ids per connection */
#define FZ_NLAYOUTS 5
#define FZ_MAX_TICKS 8 /* ms the loop may run for one request (a WAIT that stays pending) */

enum fz_op {
    FZ_OP_HELLO,
    FZ_OP_NS_OPEN,
    FZ_OP_LOOKUP,
    FZ_OP_RESERVE,
    FZ_OP_COMMIT,
    FZ_OP_ABORT,
    FZ_OP_RELEASE,
    FZ_OP_WAIT,
    FZ_OP_HINT,
    FZ_OP_STATS,
    FZ_OP_RECONNECT,
    FZ_OP_PUT,  /* RESERVE then COMMIT of the same chain: fills the cache quickly */
    FZ_OP_FAST, /* FAST_ATTACH (ring, index, SYNC), or entries written into the ring */
    FZ_OP_COUNT
};

struct fz_conn {
    int fd;                   /* -1: not connected */
    uint32_t ns[FZ_NLAYOUTS]; /* ns id learned per layout, 0: none */
    uint64_t leases[FZ_NIDS], resvs[FZ_NIDS];
    uint32_t nleases, nresvs; /* ring positions (ids stay after release: stale ids) */
    uint32_t answered;        /* replies seen for the request in flight */
    uint64_t last_resv;
    struct kvc_fast_ring *ring; /* this connection's hit ring, mapped; NULL: none */
    uint64_t *bell;             /* its uid's bell, mapped; NULL: none */
};

struct fz {
    const uint8_t *p, *end;
    struct loop *l;
    struct store *s;
    struct server *sv;
    struct config *cfg;
    struct fz_conn c[FZ_NCONN];
    uint32_t req_id;
    int ticks;
    int max_ticks;        /* of this fz_serve: FZ_MAX_TICKS, or 1 after a quiet COMMIT (no reply) */
    const uint8_t *index; /* arena 0's index, mapped read-only on the first INDEX reply */
    uint64_t index_bytes;
    uint64_t ring_heads; /* ring entries written, heads moved ahead and back, as claimed */
    uint64_t conns_made; /* connections opened, for the copy time they may claim */
    uint64_t t0_ms;
};

static char fz_dir[64];
static int fz_verbose; /* FUZZ_SERVER_VERBOSE=1: one line per reply (replaying a finding) */
/* FUZZ_SERVER_NO_ZERO_KEY=1: no all-zero key inside a chain, so that a run goes past the
 * finding in tests/fuzz/crashes/server-zero-key-in-chain while it stands. */
static int fz_no_zero_key;
/* FUZZ_SERVER_IO_THREADS=N: the server's sockets on N I/O threads (server_io.c), replies
 * reaching this thread's loop through them. */
static uint32_t fz_io_threads;
static char fz_sock[108];
static uint8_t fz_msg[KVC_PROTO_MAX_MSG + 64] __attribute__((aligned(8)));
static uint8_t fz_rep[KVC_PROTO_MAX_MSG + 64] __attribute__((aligned(8)));

static void fz_fail(const char *what, unsigned long long a, unsigned long long b)
{
    fprintf(stderr, "fuzz_server: invariant broken: %s (%llu, %llu)\n", what, a, b);
    abort();
}

static uint8_t fz_u8(struct fz *f)
{
    return f->p < f->end ? *f->p++ : 0;
}

static uint32_t fz_u32(struct fz *f)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)fz_u8(f) << (8 * i);
    return v;
}

/* Keys of chain position k in one of two families; index 0xff of the space: all-zero. */
static struct kvc_wire_key fz_key(uint32_t fam, uint32_t k)
{
    struct kvc_wire_key key = {.lo = 0x9e3779b97f4a7c15ull * (k + 1) + fam,
                               .hi = 0xc2b2ae3d27d4eb4full ^ (uint64_t)fam << 8};
    return key;
}

static void fz_layout(uint32_t i, struct kvc_wire_layout *w)
{
    memset(w, 0, sizeof(*w));
    switch (i) {
    case 0: /* 1 KiB blocks */
        *w = (struct kvc_wire_layout){.layers = 2,
                                      .kv_heads = 2,
                                      .head_dim = 16,
                                      .block_tokens = 4,
                                      .dtype = KVC_WIRE_DTYPE_FP16,
                                      .kv_kind = KVC_WIRE_KV_KIND_KV};
        strcpy(w->model_id, "fz-small");
        break;
    case 1: /* 32 KiB blocks: the arena fills after a few dozen */
        *w = (struct kvc_wire_layout){.layers = 4,
                                      .kv_heads = 4,
                                      .head_dim = 32,
                                      .block_tokens = 16,
                                      .dtype = KVC_WIRE_DTYPE_FP16,
                                      .kv_kind = KVC_WIRE_KV_KIND_KV};
        strcpy(w->model_id, "fz-big");
        break;
    case 2: /* the first model id with another layout: refused */
        *w = (struct kvc_wire_layout){.layers = 3,
                                      .kv_heads = 2,
                                      .head_dim = 16,
                                      .block_tokens = 4,
                                      .dtype = KVC_WIRE_DTYPE_FP16,
                                      .kv_kind = KVC_WIRE_KV_KIND_KV};
        strcpy(w->model_id, "fz-small");
        break;
    case 3: /* K-only, fp32, quantized blocks allowed */
        *w = (struct kvc_wire_layout){.layers = 2,
                                      .kv_heads = 1,
                                      .head_dim = 64,
                                      .block_tokens = 8,
                                      .dtype = KVC_WIRE_DTYPE_FP32,
                                      .kv_kind = KVC_WIRE_KV_KIND_K_ONLY,
                                      .flags = KVC_WIRE_QUANT_FLAGS(0x3, 1, 1, 0)};
        strcpy(w->model_id, "fz-latent");
        break;
    default: /* malformed: no NUL in the model id, no layers */
        memset(w->model_id, 'x', sizeof(w->model_id));
        w->head_dim = 16;
        w->block_tokens = 4;
        w->dtype = KVC_WIRE_DTYPE_BF16;
        w->kv_kind = KVC_WIRE_KV_KIND_KV;
        break;
    }
}

static void fz_on_client(struct loop *l, int fd, uint32_t events, void *arg)
{
    (void)fd;
    (void)events;
    (void)arg;
    loop_stop(l);
}

static void fz_tick(void *arg)
{
    struct fz *f = arg;
    engine_trim(f->s, loop_now_ms(f->l));
    server_tick(f->sv);
    if (++f->ticks >= f->max_ticks)
        loop_stop(f->l);
}

/* Runs the loop until fd is readable (or closed) or FZ_MAX_TICKS ms passed. */
static void fz_serve(struct fz *f, int fd)
{
    f->ticks = 0;
    if (!f->max_ticks)
        f->max_ticks = FZ_MAX_TICKS;
    if (fd >= 0 && loop_add(f->l, fd, EPOLLIN, fz_on_client, f) == 0) {
        loop_run(f->l, 1, fz_tick, f);
        loop_del(f->l, fd);
    } else {
        loop_run(f->l, 1, fz_tick, f);
    }
}

static void fz_remember(uint64_t *ring, uint32_t *n, uint64_t id)
{
    if (id)
        ring[(*n)++ % FZ_NIDS] = id;
}

static void fz_close(struct fz_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    memset(c->ns, 0, sizeof(c->ns));
    if (c->ring)
        munmap(c->ring, sizeof(*c->ring) + KVC_FAST_RING_ENTS * sizeof(struct kvc_fast_hit));
    c->ring = NULL;
    if (c->bell)
        munmap(c->bell, KVC_FAST_BELL_BYTES);
    c->bell = NULL;
}

/* A FAST_ATTACH reply's descriptor: the ring is kept mapped, the index mapped once (and a
 * writable mapping of it must fail). */
static void fz_fast_fd(struct fz *f, struct fz_conn *c, const struct kvc_fast_attach_rep *p, int fd)
{
    if (p->what == KVC_FAST_RING && !c->ring &&
        p->bytes == sizeof(*c->ring) + KVC_FAST_RING_ENTS * sizeof(struct kvc_fast_hit)) {
        void *m = mmap(NULL, p->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED)
            fz_fail("hit ring not mappable read-write", errno, p->bytes);
        c->ring = m;
    } else if (p->what == KVC_FAST_BELL && !c->bell && p->bytes == KVC_FAST_BELL_BYTES) {
        void *m = mmap(NULL, p->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED)
            fz_fail("bell not mappable read-write", errno, p->bytes);
        c->bell = m;
    } else if (p->what == KVC_FAST_INDEX && p->bytes) {
        if (mmap(NULL, p->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) != MAP_FAILED)
            fz_fail("index mapped writable", p->arena_id, p->bytes);
        if (p->arena_id == 0 && !f->index) {
            void *m = mmap(NULL, p->bytes, PROT_READ, MAP_SHARED, fd, 0);
            if (m == MAP_FAILED)
                fz_fail("index not mappable", errno, p->bytes);
            f->index = m;
            f->index_bytes = p->bytes;
        }
    }
}

/* Reads every reply waiting on c (closing the descriptors NS_OPEN and FAST_ATTACH attach,
 * after mapping FAST_ATTACH's); notes the lease and reservation ids they carry. A closed
 * connection is closed here too. */
static void fz_drain(struct fz *f, struct fz_conn *c, uint32_t layout)
{
    while (c->fd >= 0) {
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(4 * sizeof(int))];
        } ctl;
        struct iovec iov = {.iov_base = fz_rep, .iov_len = sizeof(fz_rep)};
        struct msghdr mh = {.msg_iov = &iov,
                            .msg_iovlen = 1,
                            .msg_control = ctl.buf,
                            .msg_controllen = sizeof(ctl.buf)};
        ssize_t n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        if (n <= 0) {
            fz_close(c);
            return;
        }
        const struct kvc_msg_hdr *rh = (const struct kvc_msg_hdr *)fz_rep;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
                size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                int fds[4];
                memcpy(fds, CMSG_DATA(cm), nfd * sizeof(int));
                for (size_t i = 0; i < nfd; i++) {
                    if (i == 0 && (size_t)n >= sizeof(*rh) + sizeof(struct kvc_fast_attach_rep) &&
                        rh->opcode == KVC_OP_FAST_ATTACH && rh->status == 0)
                        fz_fast_fd(f, c, (const struct kvc_fast_attach_rep *)(rh + 1), fds[i]);
                    close(fds[i]);
                }
            }
        c->answered++;
        if ((size_t)n < sizeof(struct kvc_msg_hdr))
            continue;
        const struct kvc_msg_hdr *h = (const struct kvc_msg_hdr *)fz_rep;
        const uint8_t *pl = fz_rep + sizeof(*h);
        size_t len = (size_t)n - sizeof(*h);
        if (fz_verbose)
            fprintf(stderr, "fuzz_server: fd %d reply op %u req %u status %d len %zu %08x %08x\n",
                    c->fd, h->opcode, h->req_id, h->status, len,
                    len >= 4 ? *(const uint32_t *)pl : 0,
                    len >= 12 ? *(const uint32_t *)(pl + 8) : 0);
        if (h->status != 0)
            continue;
        if (h->opcode == KVC_OP_NS_OPEN && len >= sizeof(struct kvc_ns_open_rep) &&
            layout < FZ_NLAYOUTS)
            c->ns[layout] = ((const struct kvc_ns_open_rep *)pl)->ns_id;
        else if (h->opcode == KVC_OP_LOOKUP && len >= sizeof(struct kvc_lookup_rep))
            fz_remember(c->leases, &c->nleases, ((const struct kvc_lookup_rep *)pl)->lease_id);
        else if (h->opcode == KVC_OP_LOOKUP_BUDGET && len >= sizeof(struct kvc_lookup_budget_rep)) {
            const struct kvc_lookup_budget_rep *bp = (const struct kvc_lookup_budget_rep *)pl;
            /* The reply holds its selection (and with F_HEADS the profile) and no more. */
            if (len < sizeof(*bp) + (size_t)bp->nsel * sizeof(struct kvc_wire_sel) ||
                len - sizeof(*bp) - (size_t)bp->nsel * sizeof(struct kvc_wire_sel) >
                    KVC_PROTO_MAX_HINT_HEADS ||
                bp->nsel > bp->nprefix || (bp->nsel > 0) != (bp->lease_id != 0))
                fz_fail("budgeted lookup reply", len, bp->nsel);
            fz_remember(c->leases, &c->nleases, bp->lease_id);
        } else if (h->opcode == KVC_OP_RESERVE && len >= sizeof(struct kvc_reserve_rep)) {
            c->last_resv = ((const struct kvc_reserve_rep *)pl)->resv_id;
            fz_remember(c->resvs, &c->nresvs, c->last_resv);
        }
    }
}

static int fz_connect(struct fz *f, struct fz_conn *c)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return -errno;
    strcpy(a.sun_path, fz_sock);
    if (connect(c->fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        int rc = -errno;
        fz_close(c);
        return rc;
    }
    memset(c->ns, 0, sizeof(c->ns));
    f->conns_made++;
    return 0;
}

/* A lease or reservation id: this connection's, another's, stale, or made up. */
static uint64_t fz_pick_id(struct fz *f, const struct fz_conn *c, bool lease)
{
    uint8_t b = fz_u8(f);
    const struct fz_conn *o = &f->c[(b >> 5) & (FZ_NCONN - 1)];
    switch (b & 7) {
    case 0:
        return 0;
    case 1:
        return ((uint64_t)fz_u8(f) << 32) | fz_u8(f); /* made up: generation, slot */
    case 2:
        o = c;
        /* fallthrough */
    default: {
        const uint64_t *ring = lease ? o->leases : o->resvs;
        uint32_t n = lease ? o->nleases : o->nresvs;
        if (!n)
            return lease ? 0 : c->last_resv;
        return ring[(n - 1 - ((b >> 3) & 3)) % FZ_NIDS];
    }
    }
}

static uint32_t fz_pick_ns(struct fz *f, const struct fz_conn *c, uint32_t *layout)
{
    uint8_t b = fz_u8(f);
    *layout = b % FZ_NLAYOUTS;
    if ((b & 0xe0) == 0xe0)
        return b & 0x1f; /* a namespace this connection may not have opened */
    return c->ns[*layout];
}

/* Keys of a chain: from position `first`, n of them, in family `fam`. */
static uint32_t fz_keys(struct fz *f, struct kvc_wire_key *out, uint32_t max)
{
    uint8_t b = fz_u8(f), m = fz_u8(f);
    uint32_t fam = b >> 6, first = (b >> 3) & 7, n = (m % max) + (m >= 0xf8 ? 0 : 1);
    if (n > max)
        n = max;
    for (uint32_t i = 0; i < n; i++)
        out[i] = fz_key(fam, (first + i) % FZ_NKEYS);
    if (m == 0xff && n && !fz_no_zero_key)
        memset(&out[n / 2], 0, sizeof(out[0])); /* an all-zero key in the chain */
    return n;
}

/* Sends a request of len payload bytes (already in fz_msg after the header), spoiled as the
 * next byte says, then serves until an answer. */
static void fz_send(struct fz *f, struct fz_conn *c, uint16_t op, size_t len, uint32_t layout)
{
    struct kvc_msg_hdr *h = (struct kvc_msg_hdr *)fz_msg;
    uint8_t bad = fz_u8(f);
    size_t total = sizeof(*h) + len;
    *h = (struct kvc_msg_hdr){.magic = KVC_PROTO_MAGIC,
                              .version = KVC_PROTO_VERSION,
                              .opcode = op,
                              .req_id = ++f->req_id,
                              .len = (uint32_t)len};
    if (bad >= 0xe8) {
        switch (bad & 7) {
        case 0:
            total -= (bad >> 3) & 7 ? ((bad >> 3) & 7) : 1;
            break;
        case 1:
            memset(fz_msg + total, 0xa5, 8);
            total += 1 + ((bad >> 3) & 7);
            break;
        case 2:
            h->version++;
            break;
        case 3:
            h->magic ^= 1u << (bad & 31);
            break;
        case 4:
            h->len += (bad & 8) ? 1 : (uint32_t)-1;
            break;
        case 5:
            h->opcode = (uint16_t)(bad & 0x3f);
            break;
        case 6:
            h->status = -EIO;
            break;
        default:
            h->flags = 0xffffffffu;
            break;
        }
    }
    if (c->fd < 0)
        return;
    c->answered = 0;
    if (send(c->fd, fz_msg, total, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
        fz_drain(f, c, layout);
        if (c->fd >= 0 && errno != EAGAIN)
            fz_close(c);
        return;
    }
    /* A quiet COMMIT that succeeds sends nothing back: one tick is enough for the server to
     * handle it (its error reply, if any, is read with the next reply). */
    f->max_ticks = op == KVC_OP_COMMIT && total == sizeof(*h) + sizeof(struct kvc_commit_req) &&
                           (((const struct kvc_commit_req *)(h + 1))->flags & KVC_COMMIT_F_QUIET)
                       ? 1
                       : FZ_MAX_TICKS;
    fz_serve(f, c->fd);
    f->max_ticks = FZ_MAX_TICKS;
    fz_drain(f, c, layout);
}

/* Writes up to 47 entries into c's hit ring, as the next bytes say: real blocks of the store
 * (their namespace, index and key, or one of them off by one), or made-up ones; positions,
 * counts and copy times as given; then moves the head on by as many, or also far ahead, or
 * backwards. */
static void fz_ring_write(struct fz *f, struct fz_conn *c)
{
    struct kvc_fast_ring *r = c->ring;
    struct kvc_fast_hit *e = (struct kvc_fast_hit *)(r + 1);
    uint32_t n = fz_u8(f) % 48, nb = f->s->ix.nblocks;
    uint64_t head = r->head, was = head;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t b = fz_u8(f);
        struct kvc_fast_hit h = {0};
        if ((b & 3) != 3 && nb) {
            uint32_t idx = fz_u8(f) % nb;
            const struct block *bl = &f->s->ix.blocks[idx];
            h = (struct kvc_fast_hit){
                .ns = bl->ns, .block = idx, .klo = bl->key.lo, .khi = bl->key.hi};
            if (b & 4)
                h.block ^= 1;
            if (b & 8)
                h.klo ^= 1;
        } else {
            struct kvc_wire_key k = fz_key(b >> 6, fz_u8(f) % FZ_NKEYS);
            h = (struct kvc_fast_hit){.ns = fz_u8(f), .block = fz_u32(f), .klo = k.lo, .khi = k.hi};
        }
        h.pos = (b & 0x10) ? fz_u8(f) : (uint16_t)i;
        h.nkeys = (i == 0 || (b & 0x20)) ? ((b & 0x40) ? 0xffff : (uint16_t)(n - i)) : 0;
        h.load_us = (b & 0x80) ? fz_u32(f) : fz_u8(f);
        e[(head + i) % KVC_FAST_RING_ENTS] = h;
    }
    head += n;
    switch (fz_u8(f) & 7) {
    case 5:
        head += fz_u32(f); /* past what was written: entries overwritten, or a lie */
        break;
    case 6:
        head -= fz_u8(f) % 64; /* backwards */
        break;
    case 7:
        head = (uint64_t)fz_u32(f) << 32;
        break;
    default:
        break;
    }
    /* What the daemon may count from this move: at most a ring's worth, and one lie. */
    f->ring_heads +=
        (head > was ? (head - was < KVC_FAST_RING_ENTS ? head - was : KVC_FAST_RING_ENTS) : 0) + 1;
    __atomic_store_n(&r->head, head, __ATOMIC_RELEASE);
    if (c->bell) {
        uint8_t b = fz_u8(f);
        switch (b & 3) {
        case 0: /* as libkvc does, with the bit the daemon wrote (or a client overwrote) */
            kvc_fast_bell_ring(r, was, c->bell,
                               __atomic_load_n(&r->bell, __ATOMIC_RELAXED) % KVC_FAST_BELL_BITS);
            break;
        case 1:
            c->bell[fz_u32(f) % (KVC_FAST_BELL_BITS / 64)] = ((uint64_t)fz_u32(f) << 32) | b;
            break;
        default: /* all set, or all cleared */
            memset(c->bell, (b & 3) == 2 ? 0xff : 0, KVC_FAST_BELL_BYTES);
            break;
        }
    }
}

/* LOOKUP_BUDGET (the LOOKUP op with fl & 0xc0 == 0x40): with or without per-head budgets
 * (KVC_BUDGET_F_HEADS, whose reply carries the namespace's head profile) or unknown flags, a
 * budget of 0 or more, the namespace's policy, one by number or an unknown one, sinks and a
 * recent window, and a query of the layout's head_dim floats (Quest) or of another length. */
static void fz_budget(struct fz *f, struct fz_conn *c, uint8_t fl)
{
    struct kvc_lookup_budget_req *q =
        (struct kvc_lookup_budget_req *)(fz_msg + sizeof(struct kvc_msg_hdr));
    struct kvc_wire_layout w;
    uint32_t layout, pol = fz_u8(f), shape = fz_u8(f);
    uint32_t flags = (fl & 0x20) ? fz_u32(f) : (fl & KVC_BUDGET_F_HEADS);
    uint32_t ns_id = fz_pick_ns(f, c, &layout), budget = fz_u8(f) % 8;
    *q = (struct kvc_lookup_budget_req){.ns_id = ns_id,
                                        .flags = flags,
                                        .budget = budget,
                                        .policy = pol == 0xff ? KVC_POLICY_NS : pol % 12,
                                        .sinks = shape & 3,
                                        .recent = (shape >> 2) & 3};
    if (shape & 0x80)
        q->sinks = q->recent = UINT32_MAX; /* more than any prefix: the policy clamps */
    fz_layout(layout, &w);
    q->nkeys = fz_keys(f, (struct kvc_wire_key *)(q + 1), 2 * FZ_NKEYS);
    q->qdim = (fl & 2) ? w.head_dim : (fl & 4) ? (shape >> 4) % 5 : 0;
    float *v = (float *)((struct kvc_wire_key *)(q + 1) + q->nkeys);
    for (uint32_t i = 0; i < q->qdim; i++)
        v[i] = (fl & 0x10) && i == 0 ? __builtin_inff() : (float)(int8_t)fz_u8(f) / 8.0f;
    fz_send(f, c, KVC_OP_LOOKUP_BUDGET,
            sizeof(*q) + q->nkeys * sizeof(struct kvc_wire_key) + q->qdim * sizeof(float),
            FZ_NLAYOUTS);
}

static void fz_op(struct fz *f)
{
    uint8_t b = fz_u8(f);
    struct fz_conn *c = &f->c[b & (FZ_NCONN - 1)];
    enum fz_op op = (enum fz_op)((b >> 2) % FZ_OP_COUNT);
    uint8_t *pl = fz_msg + sizeof(struct kvc_msg_hdr);
    uint32_t layout = FZ_NLAYOUTS;
    if (c->fd < 0 && op != FZ_OP_RECONNECT && fz_connect(f, c))
        return;
    switch (op) {
    case FZ_OP_HELLO: {
        struct kvc_hello_req *q = (struct kvc_hello_req *)pl;
        uint8_t v = fz_u8(f);
        *q = (struct kvc_hello_req){.min_version = (uint16_t)(v & 3),
                                    .max_version = (uint16_t)((v >> 2) & 3),
                                    .flags = (v & 0x80) ? fz_u32(f) : 0};
        memcpy(q->client_name, "fuzz-server", 12);
        fz_send(f, c, KVC_OP_HELLO, sizeof(*q), layout);
        break;
    }
    case FZ_OP_NS_OPEN: {
        struct kvc_ns_open_req *q = (struct kvc_ns_open_req *)pl;
        layout = fz_u8(f) % FZ_NLAYOUTS;
        fz_layout(layout, &q->layout);
        fz_send(f, c, KVC_OP_NS_OPEN, sizeof(*q), layout);
        break;
    }
    case FZ_OP_LOOKUP: {
        struct kvc_lookup_req *q = (struct kvc_lookup_req *)pl;
        uint8_t fl = fz_u8(f);
        if ((fl & 0xc0) == 0x40) {
            fz_budget(f, c, fl);
            break;
        }
        *q = (struct kvc_lookup_req){.ns_id = fz_pick_ns(f, c, &layout),
                                     .flags = (fl & 0x80) ? fl : (fl & KVC_LOOKUP_F_READY_ONLY)};
        q->nkeys = fz_keys(f, (struct kvc_wire_key *)(q + 1), 2 * FZ_NKEYS);
        fz_send(f, c, KVC_OP_LOOKUP, sizeof(*q) + q->nkeys * sizeof(struct kvc_wire_key),
                FZ_NLAYOUTS);
        break;
    }
    case FZ_OP_PUT:
    case FZ_OP_RESERVE: {
        struct kvc_reserve_req *q = (struct kvc_reserve_req *)pl;
        uint8_t fl = fz_u8(f);
        *q = (struct kvc_reserve_req){.ns_id = fz_pick_ns(f, c, &layout),
                                      .flags = (fl & 0x80) ? fl : 0};
        q->nkeys = fz_keys(f, (struct kvc_wire_key *)(q + 1), FZ_NKEYS);
        /* The parent: none, the key before the chain (as a writer would say), or another. */
        if (fl & 0x40) {
            const struct kvc_wire_key *k = (const struct kvc_wire_key *)(q + 1);
            q->parent =
                fz_key((uint32_t)(k->lo - 0x9e3779b97f4a7c15ull) & 3, (fl & 0x3f) % FZ_NKEYS);
        }
        fz_send(f, c, KVC_OP_RESERVE, sizeof(*q) + q->nkeys * sizeof(struct kvc_wire_key),
                FZ_NLAYOUTS);
        if (op == FZ_OP_PUT && c->fd >= 0 && c->last_resv) {
            struct kvc_commit_req *cq = (struct kvc_commit_req *)pl;
            /* As kvc_put_prefix sends it: quiet, answered only if it fails. */
            *cq = (struct kvc_commit_req){.resv_id = c->last_resv,
                                          .ncommit = UINT32_MAX,
                                          .flags = (fl & 0x20) ? KVC_COMMIT_F_QUIET : 0};
            c->last_resv = 0;
            fz_send(f, c, KVC_OP_COMMIT, sizeof(*cq), FZ_NLAYOUTS);
        }
        break;
    }
    case FZ_OP_COMMIT: {
        struct kvc_commit_req *q = (struct kvc_commit_req *)pl;
        uint8_t n = fz_u8(f);
        *q = (struct kvc_commit_req){.resv_id = fz_pick_id(f, c, false),
                                     .ncommit = n >= 0xf0 ? UINT32_MAX : n % (FZ_NKEYS + 2),
                                     .flags = (n & 0x20) ? KVC_COMMIT_F_QUIET : 0};
        fz_send(f, c, KVC_OP_COMMIT, sizeof(*q), FZ_NLAYOUTS);
        break;
    }
    case FZ_OP_ABORT: {
        struct kvc_abort_req *q = (struct kvc_abort_req *)pl;
        q->resv_id = fz_pick_id(f, c, false);
        fz_send(f, c, KVC_OP_ABORT, sizeof(*q), FZ_NLAYOUTS);
        break;
    }
    case FZ_OP_RELEASE: {
        struct kvc_release_req *q = (struct kvc_release_req *)pl;
        uint64_t *ids = (uint64_t *)(q + 1);
        uint8_t n = fz_u8(f) % 5;
        *q = (struct kvc_release_req){.nleases = n, .load_us = fz_u8(f)};
        for (uint32_t i = 0; i < n; i++)
            ids[i] = fz_pick_id(f, c, true);
        fz_send(f, c, KVC_OP_RELEASE, sizeof(*q) + n * sizeof(uint64_t), FZ_NLAYOUTS);
        break;
    }
    case FZ_OP_WAIT: {
        struct kvc_wait_req *q = (struct kvc_wait_req *)pl;
        *q = (struct kvc_wait_req){.lease_id = fz_pick_id(f, c, true), .timeout_ms = fz_u8(f) % 4};
        fz_send(f, c, KVC_OP_WAIT, sizeof(*q), FZ_NLAYOUTS);
        break;
    }
    case FZ_OP_HINT: {
        struct kvc_hint_req *q = (struct kvc_hint_req *)pl;
        struct kvc_wire_key keys[FZ_NKEYS];
        struct kvc_wire_hint *hs = (struct kvc_wire_hint *)(q + 1);
        uint8_t kind = fz_u8(f);
        *q = (struct kvc_hint_req){.ns_id = fz_pick_ns(f, c, &layout), .kind = kind % 4};
        q->nhints = fz_keys(f, keys, FZ_NKEYS);
        if (kind & 0x40) { /* HINT_HEADS: the layout's shape, or another; scores after keys */
            struct kvc_hint_heads_req *hq = (struct kvc_hint_heads_req *)pl;
            struct kvc_wire_layout w;
            uint8_t sh = fz_u8(f);
            uint32_t n = q->nhints, ns_id = q->ns_id;
            fz_layout(layout, &w);
            *hq = (struct kvc_hint_heads_req){.ns_id = ns_id,
                                              .kind = kind % 4,
                                              .nhints = n,
                                              .layers = (sh & 1) ? w.layers : sh % 5,
                                              .heads = (sh & 1) ? w.kv_heads : (sh >> 4) % 5};
            memcpy(hq + 1, keys, n * sizeof(keys[0]));
            float *sc = (float *)((struct kvc_wire_key *)(hq + 1) + n);
            uint64_t nf = (uint64_t)n * hq->layers * hq->heads;
            if (nf > 4096)
                nf = 4096; /* a length that does not match: refused */
            for (uint64_t i = 0; i < nf; i++)
                sc[i] = (kind & 0x80) && i == 0 ? -1.0f : (float)fz_u8(f) / 16.0f;
            fz_send(f, c, KVC_OP_HINT_HEADS,
                    (uint32_t)(sizeof(*hq) + n * sizeof(keys[0]) + nf * sizeof(float)),
                    FZ_NLAYOUTS);
            break;
        }
        for (uint32_t i = 0; i < q->nhints; i++) {
            uint32_t raw = (kind & 0x80) ? fz_u32(f) : 0;
            memset(&hs[i], 0, sizeof(hs[i]));
            hs[i].key = keys[i];
            if (raw)
                memcpy(&hs[i].score, &raw, sizeof(raw)); /* NaN, inf, negative, ... */
            else
                hs[i].score = (float)fz_u8(f) / 16.0f;
        }
        fz_send(f, c, KVC_OP_HINT, sizeof(*q) + q->nhints * sizeof(*hs), FZ_NLAYOUTS);
        break;
    }
    case FZ_OP_STATS: {
        struct kvc_stats_req *q = (struct kvc_stats_req *)pl;
        uint8_t sc = fz_u8(f);
        *q = (struct kvc_stats_req){.scope = sc % 8};
        if (sc & 0x80) /* SYNC instead, the same body as its flags and pad (0 or refused) */
            fz_send(f, c, KVC_OP_SYNC, sizeof(struct kvc_sync_req), FZ_NLAYOUTS);
        else
            fz_send(f, c, KVC_OP_STATS, sizeof(*q), FZ_NLAYOUTS);
        break;
    }
    case FZ_OP_FAST: {
        struct kvc_fast_attach_req *q = (struct kvc_fast_attach_req *)pl;
        uint8_t k = fz_u8(f);
        static const uint32_t what[] = {KVC_FAST_RING, KVC_FAST_INDEX, KVC_FAST_SYNC};
        if ((k & 3) == 3 && c->ring) {
            fz_ring_write(f, c);
            f->max_ticks = 1; /* a pass or two over the rings; nothing is answered */
            fz_serve(f, -1);
            f->max_ticks = FZ_MAX_TICKS;
            break;
        }
        *q = (struct kvc_fast_attach_req){.what = (k & 0x80) ? fz_u8(f) % 5 : what[k % 3],
                                          .arena_id = (k & 0x40) ? (k >> 2) & 3 : 0};
        fz_send(f, c, KVC_OP_FAST_ATTACH, sizeof(*q), FZ_NLAYOUTS);
        break;
    }
    case FZ_OP_RECONNECT:
    default:
        fz_close(c);
        if (fz_u8(f) & 1) {
            /* Let the server see the close before the next one connects. */
            fz_serve(f, -1);
            fz_connect(f, c);
        }
        break;
    }
}

static void fz_check(struct fz *f)
{
    struct store *s = f->s;
    uint64_t *blocks = calloc(s->nns + 1, sizeof(*blocks));
    uint32_t live = 0;
    if (s->pins_now != 0)
        fz_fail("pins_now after every connection closed", s->pins_now, 0);
    if (s->reserved_now != 0 || s->reserved_bytes_now != 0)
        fz_fail("reserved after every connection closed", s->reserved_now, s->reserved_bytes_now);
    for (uint32_t i = 0; i < s->ix.nblocks; i++) {
        const struct block *b = &s->ix.blocks[i];
        if (b->state == BLOCK_STATE_FREE)
            continue;
        live++;
        if (b->state != BLOCK_STATE_COMMITTED)
            fz_fail("block left reserved", i, b->state);
        if (b->pins)
            fz_fail("block left pinned", i, b->pins);
        if (b->ns == 0 || b->ns >= s->nns || !s->ns[b->ns])
            fz_fail("block of no namespace", i, b->ns);
        blocks[b->ns]++;
        if (index_find(&s->ix, b->ns, &b->key) != i)
            fz_fail("committed block not found under its key", i, b->ns);
        uint32_t children = 0;
        for (uint32_t j = 0; j < s->ix.nblocks; j++) {
            const struct block *o = &s->ix.blocks[j];
            if (o->state == BLOCK_STATE_COMMITTED && o->parent == i)
                children++;
        }
        if (children != b->children)
            fz_fail("child count", b->children, children);
        if (b->parent != INDEX_NONE) {
            uint32_t p = b->parent;
            if (p >= s->ix.nblocks || s->ix.blocks[p].state != BLOCK_STATE_COMMITTED ||
                s->ix.blocks[p].ns != b->ns)
                fz_fail("cached block whose parent is not", i, p);
        }
    }
    if (live != s->ix.live)
        fz_fail("index live count", s->ix.live, live);
    /* Rings: no more entries counted than could be read, no more copy time credited than
     * the connections could have spent (64 us per us each, a millisecond's worth at start). */
    uint64_t counted = s->total.fast_hits + s->total.fast_refused + s->total.fast_dropped;
    if (fz_verbose)
        fprintf(stderr,
                "fuzz_server: rings: %llu hits, %llu refused, %llu dropped of %llu "
                "claimed; load_us %llu\n",
                (unsigned long long)s->total.fast_hits, (unsigned long long)s->total.fast_refused,
                (unsigned long long)s->total.fast_dropped, (unsigned long long)f->ring_heads,
                (unsigned long long)s->total.load_us);
    if (counted > f->ring_heads)
        fz_fail("ring entries counted past those written", counted, f->ring_heads);
    uint64_t spend = 64000 * (loop_now_ms(f->l) + 2) * (f->conns_made + 1);
    if (s->total.load_us > spend)
        fz_fail("copy time credited past what could be spent", s->total.load_us, spend);
    /* Arena 0's index (unless a larger one replaced it): every entry names a committed block
     * of the store, in arena 0, where the entry says, and sits in one of its two buckets or
     * the stash. */
    if (f->index && !((const struct kvc_fast_hdr *)f->index)->retired) {
        const struct kvc_fast_hdr *h = (const struct kvc_fast_hdr *)f->index;
        const struct kvc_fast_ent *e = (const struct kvc_fast_ent *)(f->index + h->ents_off);
        uint64_t nb = (uint64_t)h->nbuckets * KVC_FAST_WAYS;
        for (uint64_t i = 0; i < nb + h->nstash; i++) {
            if (!(e[i].klo | e[i].khi))
                continue;
            struct kvc_wire_key k = {.lo = e[i].klo, .hi = e[i].khi};
            uint32_t idx = index_find(&s->ix, e[i].ns, &k), b1, b2;
            const struct block *b = idx != INDEX_NONE ? &s->ix.blocks[idx] : NULL;
            if (e[i].seq & 1)
                fz_fail("index entry left half written", i, e[i].seq);
            if (!b || b->state != BLOCK_STATE_COMMITTED)
                fz_fail("index entry of no committed block", i, e[i].ns);
            if (b->arena != 0 || b->off != (uint64_t)e[i].unit << KVC_FAST_UNIT_SHIFT ||
                b->format != KVC_FAST_FMT_FORMAT(e[i].fmt))
                fz_fail("index entry elsewhere than its block", e[i].unit, b->off);
            kvc_fast_buckets(h->seed, h->nbuckets, e[i].ns, e[i].klo, e[i].khi, &b1, &b2);
            if (i < nb && i / KVC_FAST_WAYS != b1 && i / KVC_FAST_WAYS != b2)
                fz_fail("index entry outside its buckets", i, b1);
        }
    }
    for (uint32_t n = 1; n < s->nns; n++)
        if (s->ns[n] && s->ns[n]->blocks != blocks[n])
            fz_fail("namespace block count", s->ns[n]->blocks, blocks[n]);
    free(blocks);
}

static void fz_dir_remove(void)
{
    unlink(fz_sock);
    rmdir(fz_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_verbose = getenv("FUZZ_SERVER_VERBOSE") != NULL;
    fz_no_zero_key = getenv("FUZZ_SERVER_NO_ZERO_KEY") != NULL;
    if (getenv("FUZZ_SERVER_IO_THREADS"))
        fz_io_threads = (uint32_t)strtoul(getenv("FUZZ_SERVER_IO_THREADS"), NULL, 10) % 65;
    log_setup(fz_verbose ? LOG_LEVEL_DEBUG : LOG_LEVEL_ERROR, 10);
    snprintf(fz_dir, sizeof(fz_dir), "/tmp/kvcd-fuzz-server.XXXXXX");
    if (!mkdtemp(fz_dir))
        abort();
    snprintf(fz_sock, sizeof(fz_sock), "%s/kvcd.sock", fz_dir);
    atexit(fz_dir_remove);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct store_params sp = {.host_size = 2 << 20,
                              .host_page_size = 64 << 10,
                              .host_huge = 0,
                              .high_watermark = 0.9,
                              .low_watermark = 0.8,
                              .max_namespaces = 8,
                              .max_handles = 16,
                              .fast_path = true,
                              .policy = POLICY_LRU};
    struct fz f = {.p = data, .end = data + size};
    int rc = 0;
    for (int i = 0; i < FZ_NCONN; i++)
        f.c[i].fd = -1;
    if (size && (data[0] & 1))
        sp.policy = POLICY_DEFAULT;
    f.cfg = config_new();
    f.s = store_new(&sp, &rc);
    f.l = loop_new(&rc);
    if (!f.cfg || !f.s || !f.l)
        abort();
    engine_attach(f.s);
    struct server_params vp = {.socket_path = fz_sock,
                               .socket_mode = 0600,
                               .max_clients = 8,
                               .io_threads = fz_io_threads,
                               .cfg = f.cfg,
                               .max_clients_per_uid = 8,
                               .hello_timeout_ms = 5000,
                               .idle_timeout_ms = 60000,
                               .reservation_timeout_ms = 60000,
                               .max_waits = 2,
                               .max_namespaces_per_uid = 4,
                               .client_pins = 64,
                               .uid_pins = 128,
                               .uid_leases = 24,
                               .uid_reserved_share = 75};
    f.sv = server_new(f.l, f.s, &vp, &rc);
    if (!f.sv) {
        fprintf(stderr, "fuzz_server: server_new: %d\n", rc);
        abort();
    }
    for (int n = 0; n < FZ_MAX_OPS && f.p < f.end; n++)
        fz_op(&f);
    for (int i = 0; i < FZ_NCONN; i++)
        fz_close(&f.c[i]);
    for (int i = 0; i < 100 && server_clients(f.sv) > 0; i++)
        fz_serve(&f, -1);
    if (server_clients(f.sv) > 0)
        fz_fail("connections the server never saw close", server_clients(f.sv), 0);
    fz_check(&f);
    if (f.index)
        munmap((void *)f.index, f.index_bytes);
    server_free(f.sv);
    engine_stop(f.s);
    store_free(f.s);
    loop_free(f.l);
    config_free(f.cfg);
    return 0;
}
