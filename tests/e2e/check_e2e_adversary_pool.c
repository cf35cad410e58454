/*
 * check_e2e_adversary_pool.c — hostile local clients of other uids against a server run in
 * this process (docs/security.md): the GPU pool (the fake device of tests/lib stands in for
 * the GPU) attached, reserved and looked up by a client the namespace's access lists do not
 * name, and a flood of WAITs on disk reads that never finish (made by flagging blocks as
 * being read), the quantize worker kept at its bound by the attacker's jobs while the
 * victim's precision ladder needs a step, and the disk's writes taken by the attacker's puts
 * into arena 0 while the victim's puts wait for write-back of its own arena (a kvcd of the
 * suite's, adv_start, with a disk tier). The victim and the other uids' children are
 * tests/lib/adversary.h's. Without root, every case prints a SKIP line and none is
 * registered.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc.h"
#include "client/kvc_fast.h"
#include "client/kvc_proto.h"
#include "client/libkvc_internal.h"
#include "daemon/engine.h"
#include "daemon/acl.h"
#include "daemon/config.h"
#include "daemon/config_ns.h"
#include "daemon/log.h"
#include "daemon/loop.h"
#include "daemon/quant.h"
#include "daemon/server.h"
#include "daemon/store.h"
#include "kernels/kern.h"
#include "tests/lib/adversary.h"
#include "tests/lib/daemon.h"
#include "tests/lib/fake_dev.h"
#include "tests/lib/inproc.h"
#include "tiers/gpu.h"
/* ---- the server in this process: the GPU pool (fake device) and WAITs ------------------------ */

struct adv_ip {
    struct inproc srv;
    int ctl[2]; /* a child asks the server side for something: see adv_ip_on_ctl */
    int ack[2]; /* and hears back 'k' */
};

static struct adv_ip ip;

/* 'p': flag every committed block as being read from disk (its WAITs then wait); 'r': the
 * reads are done (flags cleared, waiting WAITs answered). The reply byte is 'k'. */
static void adv_ip_on_ctl(struct loop *l, int fd, uint32_t events, void *arg)
{
    struct adv_ip *x = arg;
    char v;
    (void)l;
    (void)events;
    if (read(fd, &v, 1) != 1)
        return;
    for (uint32_t i = 0; i < x->srv.s->ix.nblocks; i++) {
        struct block *b = &x->srv.s->ix.blocks[i];
        if (b->state != BLOCK_STATE_COMMITTED)
            continue;
        if (v == 'p')
            b->flags |= BLOCK_F_PROMOTING;
        else
            b->flags &= (uint8_t)~BLOCK_F_PROMOTING;
    }
    if (v == 'r' && x->srv.s->on_ready)
        x->srv.s->on_ready(x->srv.s->on_ready_arg);
    adv_signal(x->ack[1], 'k');
}

static void adv_ip_start(uint64_t gpu_size)
{
    struct store_params sp = {.host_size = 16 << 20,
                              .host_page_size = 64 << 10,
                              .host_huge = 0,
                              .high_watermark = 0.95,
                              .low_watermark = 0.9,
                              .max_namespaces = 16,
                              .max_handles = 64,
                              .policy = POLICY_LRU,
                              .gpu_size = gpu_size,
                              .gpu_device = 0,
                              .gpu_page_size = 64 << 10,
                              .gpu_ops = &fake_dev_ops};
    struct config *cfg = config_new();
    char err[256];
    memset(&ip, 0, sizeof(ip));
    log_setup(LOG_LEVEL_WARNING, 1000); /* the refusals' lines only */
    adv_dir_open();
    ck_assert_ptr_nonnull(cfg);
    ck_assert_int_eq(config_ns_set(&cfg->ns, "victim*", "read", "65503", err, sizeof(err)), 0);
    ck_assert_int_eq(config_ns_set(&cfg->ns, "victim*", "write", "65501", err, sizeof(err)), 0);
    ck_assert_int_eq(config_ns_set(&cfg->ns, "victim*", "host_size", "4m", err, sizeof(err)), 0);
    fake_dev_reset(1);
    inproc_start(&ip.srv, cfg, &sp, adv_d.sock, 0666, 64);
    ck_assert(gpu_size == 0 || ip.srv.s->gpu);
    ck_assert_int_eq(pipe(ip.ctl), 0);
    ck_assert_int_eq(pipe(ip.ack), 0);
}

/* Runs fn as uid in a child while this process serves it. */
static int adv_ip_run(uint32_t uid, int (*fn)(void *), void *arg)
{
    return inproc_run(&ip.srv, adv_spawn(uid, fn, arg));
}

static void adv_ip_stop(void)
{
    inproc_stop(&ip.srv);
    close(ip.ctl[0]);
    close(ip.ctl[1]);
    close(ip.ack[0]);
    close(ip.ack[1]);
    ck_assert_int_eq(fake_dev.pools_live, 0);
    daemon_cleanup(&adv_d);
}

static int adv_gpu_attach(kvc_client *c, uint32_t flags, int *fd)
{
    struct kvc_gpu_attach_req q = {.flags = flags};
    int rc = adv_call(c, KVC_OP_GPU_ATTACH, &q, sizeof(q), fd, NULL, NULL);
    if (fd && *fd >= 0)
        close(*fd);
    return rc;
}

/* A RESERVE or LOOKUP (op; its request's header of hdr bytes opens with ns_id, flags and
 * nkeys, the rest zero) of n keys of family in ns; the reply to *rep. */
_Static_assert(offsetof(struct kvc_reserve_req, nkeys) == 8 &&
                   offsetof(struct kvc_lookup_req, nkeys) == 8 &&
                   sizeof(struct kvc_lookup_req) <= sizeof(struct kvc_reserve_req),
               "RESERVE and LOOKUP open alike");
static int adv_keys_call(kvc_client *c, kvc_ns *ns, uint16_t op, size_t hdr, uint32_t flags,
                         uint32_t family, uint32_t n, const void **rep)
{
    static uint8_t req[sizeof(struct kvc_reserve_req) + 64 * sizeof(struct kvc_wire_key)];
    const uint32_t head[3] = {kvc_ns_id(ns), flags, n};
    struct kvc_key keys[64];
    uint32_t len;
    adv_keys_shared(ns, family, n, keys);
    memset(req, 0, sizeof(req));
    memcpy(req, head, sizeof(head));
    memcpy(req + hdr, keys, n * sizeof(keys[0]));
    return adv_call(c, op, req, (uint32_t)(hdr + n * sizeof(keys[0])), NULL, rep, &len);
}

/* RESERVE (GPU flag) of n keys of ns; *tier the tier of the first slot. Commits. */
static int adv_gpu_reserve(kvc_client *c, kvc_ns *ns, uint32_t family, uint32_t n, int *tier)
{
    const void *rep;
    int rc = adv_keys_call(c, ns, KVC_OP_RESERVE, sizeof(struct kvc_reserve_req), KVC_RESERVE_F_GPU,
                           family, n, &rep);
    if (rc)
        return rc;
    const struct kvc_reserve_rep *p = rep;
    const struct kvc_wire_slot_rep *sl = (const struct kvc_wire_slot_rep *)(p + 1);
    if (p->nreserved != n)
        return -EIO;
    *tier = sl[0].loc.tier;
    struct kvc_commit_req cq = {.resv_id = p->resv_id, .ncommit = UINT32_MAX};
    return adv_call(c, KVC_OP_COMMIT, &cq, sizeof(cq), NULL, NULL, NULL);
}

/* LOOKUP (GPU flag) of the chain; *tier of the first hit. Releases. */
static int adv_gpu_lookup(kvc_client *c, kvc_ns *ns, uint32_t family, uint32_t n, int *tier)
{
    const void *rep;
    int rc = adv_keys_call(c, ns, KVC_OP_LOOKUP, sizeof(struct kvc_lookup_req), KVC_LOOKUP_F_GPU,
                           family, n, &rep);
    if (rc)
        return rc;
    const struct kvc_lookup_rep *p = rep;
    const struct kvc_wire_loc *loc = (const struct kvc_wire_loc *)(p + 1);
    if (p->nhit != n)
        return -EIO;
    *tier = loc[0].tier;
    uint8_t rel[sizeof(struct kvc_release_req) + 8];
    struct kvc_release_req *rq = (struct kvc_release_req *)rel;
    *rq = (struct kvc_release_req){.nleases = 1};
    memcpy(rq + 1, &p->lease_id, 8);
    return adv_call(c, KVC_OP_RELEASE, rel, sizeof(rel), NULL, NULL, NULL);
}

static uint64_t adv_client_stat(kvc_client *c, const char *name)
{
    uint64_t v = UINT64_MAX;
    daemon_client_stat(c, 0, name, &v);
    return v;
}

/* The victim: its restricted namespace never enters the pool, even when it asks; an open
 * namespace of its own does (the pool works). */
static int adv_gpu_victim(void *arg)
{
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    struct kvc_layout open_lay = daemon_layout("open-victim", ADV_BT);
    kvc_client *c;
    kvc_ns *ns, *ons;
    int fd = -1, tier = 0;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 140;
    if (adv_gpu_attach(c, 0, &fd) != -EACCES) /* holds only its private arena */
        return 141;
    if (kvc_ns_open(c, &open_lay, &ons) || adv_gpu_attach(c, 0, &fd) ||
        adv_gpu_attach(c, KVC_GPU_ATTACH_F_MAPPED, NULL))
        return 142;
    if (adv_gpu_reserve(c, ns, 1, 4, &tier) || tier != KVC_WIRE_TIER_HOST)
        return 143;
    if (adv_gpu_lookup(c, ns, 1, 4, &tier) || tier != KVC_WIRE_TIER_HOST)
        return 144;
    if (adv_client_stat(c, "gpu_used") != 0)
        return 145;
    if (adv_gpu_reserve(c, ons, 2, 4, &tier) || tier != KVC_WIRE_TIER_GPU)
        return 146;
    if (adv_client_stat(c, "gpu_used") != 4 * 16384)
        return 147;
    kvc_disconnect(c);
    return 0;
}

/* A reader of the victim's namespace asks for its blocks in the pool. */
static int adv_gpu_reader(void *arg)
{
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    struct kvc_layout open_lay = daemon_layout("reader-open", ADV_BT);
    kvc_client *c;
    kvc_ns *ns, *ons;
    int fd = -1, tier = 0;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 150;
    if (adv_gpu_attach(c, 0, &fd) != -EACCES) /* a read-only descriptor is not enough */
        return 151;
    if (kvc_ns_open(c, &open_lay, &ons) || adv_gpu_attach(c, 0, &fd) ||
        adv_gpu_attach(c, KVC_GPU_ATTACH_F_MAPPED, NULL))
        return 152;
    /* Mapped, it looks the victim's blocks up with the pool flag: host locations, and the
     * pool holds what it held (the victim's open namespace only). */
    if (adv_gpu_lookup(c, ns, 1, 4, &tier) || tier != KVC_WIRE_TIER_HOST)
        return 153;
    if (adv_client_stat(c, "gpu_used") != 4 * 16384)
        return 154;
    /* Its own open namespace does go to the pool. */
    if (adv_gpu_reserve(c, ons, 3, 2, &tier) || tier != KVC_WIRE_TIER_GPU)
        return 155;
    kvc_disconnect(c);
    return 0;
}

/* The attacker: no namespace, or only ones it cannot open: no pool. */
static int adv_gpu_attacker(void *arg)
{
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    kvc_client *c;
    kvc_ns *ns;
    int fd = -1;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c))
        return 160;
    if (adv_gpu_attach(c, 0, &fd) != -EACCES || fd >= 0)
        return 161;
    if (adv_gpu_attach(c, KVC_GPU_ATTACH_F_MAPPED, NULL) != -EACCES)
        return 162;
    if (kvc_ns_open(c, &lay, &ns) != -EACCES)
        return 163;
    if (adv_gpu_attach(c, 0, &fd) != -EACCES)
        return 164;
    /* libkvc answers "host copies" for a refused pool. */
    kvci_gpu_ops_set(&fake_dev_ops);
    fake_dev_reset(1);
    if (kvc_gpu_attach(c) != 0)
        return 165;
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_gpu_pool_access)
{
    adv_ip_start(8 << 20);
    ck_assert_int_eq(adv_ip_run(ADV_VICTIM, adv_gpu_victim, NULL), 0);
    ck_assert_int_eq(adv_ip_run(ADV_READER, adv_gpu_reader, NULL), 0);
    ck_assert_int_eq(adv_ip_run(ADV_ATTACKER, adv_gpu_attacker, NULL), 0);
    /* The pool never held a block of the restricted namespace. */
    uint32_t vid = 0;
    for (uint32_t i = 1; i < ip.srv.s->nns; i++)
        if (ip.srv.s->ns[i] && strcmp(ip.srv.s->ns[i]->layout.model_id, "victim-model") == 0)
            vid = i;
    ck_assert_uint_ne(vid, 0);
    ck_assert_uint_eq(ip.srv.s->ns[vid]->stats.gpu_promoted_blocks, 0);
    for (uint32_t i = 0; i < ip.srv.s->ix.nblocks; i++)
        if (ip.srv.s->ix.blocks[i].state != BLOCK_STATE_FREE && ip.srv.s->ix.blocks[i].ns == vid)
            ck_assert_uint_ne(ip.srv.s->ix.blocks[i].tier, KVC_WIRE_TIER_GPU);
    ck_assert_uint_ge(ip.srv.s->total.refused_access, 5);
    adv_ip_stop();
}
END_TEST

/* WAITs: one pending per lease, server.max_waits (2 here) per connection. */
static int adv_wait_attacker(void *arg)
{
    struct adv_ip *x = arg;
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    kvc_client *c, *c2;
    kvc_ns *ns;
    kvc_lease *l[3];
    struct kvc_key keys[4];
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns) || adv_roundtrip_ns(ns, 1, 4))
        return 170;
    adv_keys(ns, 1, 4, keys);
    for (int i = 0; i < 3; i++)
        if (kvc_lookup(ns, keys, 4, 0, &l[i]) != 4)
            return 171;
    /* The server side now says every block is being read from disk. */
    adv_signal(x->ctl[1], 'p');
    if (adv_await(x->ack[0]) != 'k')
        return 172;
    /* Raw WAITs, pipelined: two wait, the third is refused, a second on a lease too. */
    struct kvc_wait_req w = {.timeout_ms = 60000};
    int sfd = c->fd;
    uint32_t ids[4];
    uint64_t lease_of[4] = {l[0]->ids[0], l[0]->ids[0], l[1]->ids[0], l[2]->ids[0]};
    for (int i = 0; i < 4; i++) {
        struct {
            struct kvc_msg_hdr h;
            struct kvc_wait_req q;
        } m = {.h = {.magic = KVC_PROTO_MAGIC,
                     .version = KVC_PROTO_VERSION,
                     .opcode = KVC_OP_WAIT,
                     .req_id = 1000u + (uint32_t)i,
                     .len = sizeof(w)},
               .q = w};
        m.q.lease_id = lease_of[i];
        ids[i] = m.h.req_id;
        if (send(sfd, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m))
            return 173;
    }
    /* Two refusals come back at once, the two WAITs stay. */
    int got[4] = {0, 0, 0, 0}, status[4] = {1, 1, 1, 1};
    for (int k = 0; k < 2; k++) {
        struct kvc_msg_hdr h;
        if (recv(sfd, &h, sizeof(h), 0) < (ssize_t)sizeof(h))
            return 174;
        for (int i = 0; i < 4; i++)
            if (h.req_id == ids[i]) {
                got[i] = 1;
                status[i] = h.status;
            }
    }
    if (!got[1] || status[1] != -EBUSY || !got[3] || status[3] != -EMFILE || got[0] || got[2])
        return 175;
    /* The reads end: both WAITs answered, every hit ready. */
    adv_signal(x->ctl[1], 'r');
    if (adv_await(x->ack[0]) != 'k')
        return 176;
    for (int k = 0; k < 2; k++) {
        struct {
            struct kvc_msg_hdr h;
            struct kvc_wait_rep p;
        } m;
        if (recv(sfd, &m, sizeof(m), 0) != (ssize_t)sizeof(m) || m.h.status != 0 ||
            (m.h.req_id != ids[0] && m.h.req_id != ids[2]) || m.p.nready != 4 || m.p.pending)
            return 177;
    }
    (void)c2;
    return 0;
}

START_TEST(test_wait_flood)
{
    adv_ip_start(0);
    loop_add(ip.srv.l, ip.ctl[0], EPOLLIN, adv_ip_on_ctl, &ip);
    ck_assert_int_eq(adv_ip_run(ADV_ATTACKER, adv_wait_attacker, &ip), 0);
    ck_assert_uint_eq(ip.srv.s->total.refused_waits, 2);
    /* The child left with its WAITs pending: nothing of them is left. */
    for (uint32_t i = 0; i < ip.srv.s->ix.nblocks; i++)
        ip.srv.s->ix.blocks[i].flags &= (uint8_t)~BLOCK_F_PROMOTING;
    loop_del(ip.srv.l, ip.ctl[0]);
    adv_ip_stop();
}
END_TEST

/* ---- the quantize worker: another tenant's jobs and the victim's ladder ------------------------ */

/* The worker and its cap (host.quantize_inflight) serve every arena. The cap counted every
 * arena's jobs together, and a precision ladder's step waits while the cap is reached, its
 * put answered NOSPACE when no job of its own arena is coming: the attacker, filling its own
 * arena and putting on, kept the victim's ladder (in its private arena) from ever making
 * room. Here the attacker's jobs are held in flight (this process lands them, quant_poll,
 * only once the victim's put waits): the victim's put into its full arena must queue steps
 * of its own ladder, wait for them, and be served. */
#define QW_LEN 4  /* blocks of a filler chain */
#define QW_BIG 20 /* the attacker's last chain: more steps than the cap */
#define QW_INFLIGHT 8

static struct {
    uint64_t waits0; /* put_waits before the victim's put */
    pid_t victim;
    int rc;
} qw;

/* Fills the arena of model's namespace (one allowing q8_0: under the default policy a
 * ladder raw, q8_0) with `chains` chains of raw blocks; then puts one chain of `last` blocks
 * (fill with daemon_block_fill), which must all be served (with `check`) and read back. */
struct qw_put {
    const char *model;
    int chains, last;
    bool check;
};

static int qw_put(void *arg)
{
    const struct qw_put *a = arg;
    struct kvc_layout lay = daemon_layout(a->model, 64);
    struct kvc_quant qq = {
        .allowed = 1u << KVC_CODEC_Q8_0, .k_codec = KVC_CODEC_Q8_0, .v_codec = KVC_CODEC_Q8_0};
    struct kvc_key k[QW_BIG];
    void *blk[QW_BIG];
    kvc_client *c;
    kvc_ns *ns;
    int rc = 0, got;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open_quant(c, &lay, &qq, &ns))
        return 160;
    size_t bb = kvc_ns_block_bytes(ns);
    for (int i = 0; i < QW_BIG; i++)
        if (!(blk[i] = malloc(bb)))
            return 161;
    for (int ch = 0; ch < a->chains; ch++) {
        if (daemon_chain_keys(ns, (uint32_t)ch, 0, 0, QW_LEN, k))
            return 162;
        for (int i = 0; i < QW_LEN; i++)
            daemon_smooth_fill(&k[i], blk[i], bb / 2);
        if (kvc_put_prefix(ns, NULL, k, QW_LEN, (const void *const *)blk) != QW_LEN)
            return 163;
    }
    if (a->last && daemon_chain_keys(ns, 100000u, 0, 0, (uint32_t)a->last, k))
        return 164;
    for (int i = 0; i < a->last; i++)
        daemon_block_fill(&k[i], blk[i], bb);
    if (a->last) {
        got = kvc_put_prefix(ns, NULL, k, (size_t)a->last, (const void *const *)blk);
        if (a->check && got != a->last)
            rc = 165; /* NOSPACE: its ladder made no room */
    }
    for (int i = 0; i < a->last && rc == 0 && a->check; i++)
        memset(blk[i], 0, bb);
    if (rc == 0 && a->check && kvc_get_prefix(ns, k, (size_t)a->last, blk) != a->last)
        rc = 166;
    for (int i = 0; i < a->last && rc == 0 && a->check; i++)
        if (daemon_block_check(&k[i], blk[i], bb) != -1)
            rc = 167;
    for (int i = 0; i < QW_BIG; i++)
        free(blk[i]);
    kvc_disconnect(c);
    return rc;
}

/* The victim's phase: the jobs land (all of them, the attacker's first) only once its put
 * waits. */
static void qw_tick(void *arg)
{
    struct inproc *x = arg;
    int st;
    if (qw.victim > 0 && waitpid(qw.victim, &st, WNOHANG) == qw.victim) {
        qw.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        qw.victim = 0;
    }
    if (x->s->total.put_waits > qw.waits0)
        quant_poll(x->s->quant);
    server_tick(x->sv);
    if (qw.victim == 0 && server_clients(x->sv) == 0) {
        quant_drain(x->s->quant);
        loop_stop(x->l);
    }
}

START_TEST(test_quant_worker_other_arena)
{
    struct store_params sp = {.host_size = 4 << 20,
                              .host_page_size = 64 << 10,
                              .high_watermark = 1.0,
                              .low_watermark = 0.99,
                              .max_namespaces = 16,
                              .max_handles = 64,
                              .policy = POLICY_DEFAULT,
                              .quantize_inflight = QW_INFLIGHT,
                              .quantize_threads = 1};
    struct config *cfg = config_new();
    char err[256];
    int rc = 0;
    memset(&ip, 0, sizeof(ip));
    memset(&qw, 0, sizeof(qw));
    log_setup(LOG_LEVEL_WARNING, 1000);
    adv_dir_open();
    ck_assert_ptr_nonnull(cfg);
    ck_assert_int_eq(config_ns_set(&cfg->ns, "victim*", "read", "65503", err, sizeof(err)), 0);
    ck_assert_int_eq(config_ns_set(&cfg->ns, "victim*", "write", "65501", err, sizeof(err)), 0);
    ck_assert_int_eq(config_ns_set(&cfg->ns, "victim*", "host_size", "4m", err, sizeof(err)), 0);
    cfg->disk_put_wait = (uint64_t)daemon_ms(2000);
    inproc_start(&ip.srv, cfg, &sp, adv_d.sock, 0666, 64);
    ck_assert_ptr_nonnull(quant_new(NULL, ip.srv.s, &rc)); /* landings: quant_poll here */
    struct store *s = ip.srv.s;
    const uint32_t va = acl_ns_arena(ip.srv.acl, "victim-ladder");
    ck_assert_uint_ne(va, 0);
    const struct tier *vt = s->arenas[va].tier, *at = s->arenas[0].tier;
    const uint64_t chunk = (uint64_t)QW_LEN << 16; /* QW_LEN blocks of 64 KiB */

    /* The victim fills its private arena, raw; nothing quantized yet. */
    struct qw_put v = {"victim-ladder", (int)(vt->ops->capacity(vt) / chunk), 0, true};
    ck_assert_int_eq(adv_ip_run(ADV_VICTIM, qw_put, &v), 0);
    ck_assert_uint_eq(vt->ops->usage(vt), vt->ops->capacity(vt));
    ck_assert_uint_eq(quant_inflight(s->quant), 0);

    /* The attacker fills arena 0 and puts on: its ladder's steps fill the worker's cap, and
     * its put waits for them (they do not land in this phase). */
    struct qw_put a = {"attacker-ladder", (int)(at->ops->capacity(at) / chunk), QW_BIG, false};
    ck_assert_int_eq(adv_ip_run(ADV_ATTACKER, qw_put, &a), 0);
    ck_assert_uint_ge(quant_inflight(s->quant), QW_INFLIGHT);
    ck_assert_uint_eq(quant_pending_bytes(s->quant, va), 0);

    /* The victim puts one more chain into its full arena: its own ladder makes the room. */
    struct qw_put v2 = {"victim-ladder", 0, QW_LEN, true};
    qw.waits0 = s->total.put_waits;
    qw.rc = -1;
    qw.victim = adv_spawn(ADV_VICTIM, qw_put, &v2);
    loop_run(ip.srv.l, 20, qw_tick, &ip.srv);
    printf("e2e_adversary_pool: the victim's put behind %u of the attacker's quantize jobs: "
           "exit %d; put waits %llu, ladder steps %llu\n",
           QW_INFLIGHT, qw.rc, (unsigned long long)(s->total.put_waits - qw.waits0),
           (unsigned long long)s->total.ladder_steps);
    ck_assert_msg(qw.rc == 0,
                  "the victim's put was not served while another arena's jobs filled the "
                  "quantize worker (exit %d: 165 NOSPACE)",
                  qw.rc);
    inproc_stop(&ip.srv);
    daemon_cleanup(&adv_d);
}
END_TEST

/* ---- the disk's write queue: another arena's flood and the victim's write-back ------------------ */

/* The disk's write queue (disk.queue_depth) and write budget (disk.write_rate) serve every
 * host arena. Write-back took them arena by arena, arena 0 first, each until the disk said
 * wait: the attacker, putting on into arena 0 (the shared one) as fast as the disk writes,
 * kept arena 0 short of its room target, so arena 0 took every write the disk would start
 * and the victim's private arena got none. The victim's puts into its arena, full of blocks
 * only in memory, waited out disk.put_wait and were answered NOSPACE, one after another, for
 * as long as the attacker put. Here the victim puts 1.25 times its arena while the attacker
 * floods: every put must be served, and its first and last chains read back byte for byte. */
#define DF_LEN 16    /* blocks of a chain: 256 KiB */
#define DF_CHAINS 80 /* the victim's: 20 MiB into its 16 MiB arena */
#define DF_FLOOD 140 /* the attacker's chains before the victim starts: past arena 0's room */

/* The attacker: chains of fresh keys into arena 0 until told to stop (or 120 s). */
static int df_attacker(void *arg)
{
    struct adv_sync *y = arg;
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    struct kvc_key k[DF_LEN];
    const void *blk[DF_LEN];
    kvc_client *c;
    kvc_ns *ns;
    uint64_t t0 = adv_mono_ns();
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 180;
    void *buf = malloc(kvc_ns_block_bytes(ns));
    if (!buf)
        return 181;
    memset(buf, 0xa5, kvc_ns_block_bytes(ns));
    for (int i = 0; i < DF_LEN; i++)
        blk[i] = buf;
    for (uint32_t ch = 0; adv_mono_ns() - t0 < 120ull * 1000000000ull; ch++) {
        struct pollfd p = {.fd = y->down[0], .events = POLLIN};
        if (ch == DF_FLOOD)
            adv_signal(y->up[1], 'f');
        if (ch > DF_FLOOD && poll(&p, 1, 0) == 1)
            break;
        adv_keys(ns, 0x7300 + ch, DF_LEN, k);
        (void)kvc_put_prefix(ns, NULL, k, DF_LEN, blk); /* NOSPACE or not: it puts on */
    }
    free(buf);
    kvc_disconnect(c);
    return 0;
}

/* The victim: DF_CHAINS chains into its private arena, each served whole; then its first
 * chain (written back to disk by then) and its last read back. */
static int df_victim(void *arg)
{
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    struct kvc_key k[DF_LEN];
    void *blk[DF_LEN];
    kvc_client *c;
    kvc_ns *ns;
    int rc = 0, served = 0;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 190;
    size_t bb = kvc_ns_block_bytes(ns);
    for (int i = 0; i < DF_LEN; i++)
        if (!(blk[i] = malloc(bb)))
            return 191;
    for (int ch = 0; ch < DF_CHAINS && rc == 0; ch++) {
        adv_keys(ns, 0x7200 + (uint32_t)ch, DF_LEN, k);
        for (int i = 0; i < DF_LEN; i++)
            daemon_block_fill(&k[i], blk[i], bb);
        if (kvc_put_prefix(ns, NULL, k, DF_LEN, (const void *const *)blk) != DF_LEN)
            rc = 192; /* NOSPACE: no write-back of its arena within disk.put_wait */
        else
            served++;
    }
    printf("e2e_adversary_pool: the victim's puts while arena 0 floods the disk: %d of %d "
           "chains served\n",
           served, DF_CHAINS);
    fflush(stdout);
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        adv_keys(ns, 0x7200 + (pass ? DF_CHAINS - 1u : 0u), DF_LEN, k);
        for (int i = 0; i < DF_LEN; i++)
            memset(blk[i], 0, bb);
        if (kvc_get_prefix(ns, k, DF_LEN, blk) != DF_LEN)
            rc = 193;
        for (int i = 0; i < DF_LEN && rc == 0; i++)
            if (daemon_block_check(&k[i], blk[i], bb) != -1)
                rc = 194;
    }
    for (int i = 0; i < DF_LEN; i++)
        free(blk[i]);
    kvc_disconnect(c);
    return rc;
}

START_TEST(test_disk_writes_other_arena)
{
    char o_disk[DAEMON_PATH_MAX + 32], o_wait[48];
    /* One write on the device (two admitted) and 8 MiB/s: the disk, not the clients, is what
     * the arenas share. Arena 0 (32 MiB) keeps a fifth of itself free or clean
     * (low_watermark), more than the eighth a put may not fill with blocks only in memory,
     * so the attacker putting on keeps it short of room, always. */
    const char *const extra[] = {"-o", o_disk,
                                 "-o", "disk.capacity=256m",
                                 "-o", "disk.page=1m",
                                 "-o", "disk.queue_depth=1",
                                 "-o", "disk.write_rate=8m",
                                 "-o", o_wait,
                                 "-o", "host.low_watermark=0.8",
                                 "-o", "cache.policy=lru",
                                 NULL};
    struct adv_sync y;
    ck_assert_int_eq(daemon_dir_init(&adv_d), 0);
    snprintf(o_disk, sizeof(o_disk), "disk.path=%s/disk", adv_d.dir);
    snprintf(o_wait, sizeof(o_wait), "disk.put_wait=%dms", daemon_ms(2000)); /* bounded */
    adv_start(extra);
    adv_sync_init(&y);
    pid_t a = adv_spawn(ADV_ATTACKER, df_attacker, &y);
    ck_assert_int_gt(a, 0);
    ck_assert_int_eq(adv_await(y.up[0]), 'f');
    const uint64_t timeouts0 = adv_stat("put_wait_timeouts");
    int vrc = adv_run(ADV_VICTIM, df_victim, NULL);
    const uint64_t timeouts = adv_stat("put_wait_timeouts") - timeouts0;
    adv_signal(y.down[1], 'g');
    ck_assert_int_eq(daemon_child_wait(a, daemon_ms(30000), NULL), 0);
    adv_sync_fini(&y);
    printf("e2e_adversary_pool: the victim's write-back behind arena 0's flood: exit %d; put "
           "wait timeouts meanwhile %llu, blocks written to disk %llu\n",
           vrc, (unsigned long long)timeouts, (unsigned long long)adv_stat("demoted_blocks"));
    ck_assert_msg(vrc == 0,
                  "the victim's puts were not served while arena 0 took the disk's writes "
                  "(exit %d: 192 NOSPACE, 193/194 read back)",
                  vrc);
    adv_check_clean();
}
END_TEST

/* ---- the suite ---------------------------------------------------------------------------------- */

int main(void)
{
    const struct adv_case cases[] = {
        {"test_gpu_pool_access", test_gpu_pool_access, false},
        {"test_wait_flood", test_wait_flood, false},
        {"test_quant_worker_other_arena", test_quant_worker_other_arena, false},
        {"test_disk_writes_other_arena", test_disk_writes_other_arena, false},
    };
    Suite *s = suite_create("e2e_adversary_pool");
    adv_cases_add(s, "e2e_adversary_pool", cases, sizeof(cases) / sizeof(cases[0]));
    return adv_suite_run(s, "e2e-adversary-pool");
}
