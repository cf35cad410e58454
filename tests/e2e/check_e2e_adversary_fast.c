/*
 * check_e2e_adversary_fast.c — hostile local clients of other uids against the fast path's
 * shared memory (docs/security.md): writes to the shared index, rings that claim to be idle
 * or report a load they did not have, a flood of hit rings against the victim's latency, and
 * a writer of the arena racing a reader's decode of a quantized block. The fast-path cases
 * are skipped in the run with the fast path off (KVC_NO_FASTPATH=1), and without root (the
 * clients run as other uids); the reader's decode runs as any user. The children, the daemon
 * and the victim are tests/lib/adversary.h's.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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
#include "daemon/server.h"
#include "daemon/store.h"
#include "kernels/kern.h"
#include "tests/lib/adversary.h"
#include "tests/lib/daemon.h"
#include "tests/lib/fake_dev.h"
#include "tiers/gpu.h"
/* ---- the fast path: the shared index ----------------------------------------------------- */

/* The victim's 4 blocks for the index cases: the same chain in every process. */
static int adv_ix_victim(void *arg)
{
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    struct kvc_key keys[4];
    void *blocks[4], *got[4];
    kvc_client *c;
    kvc_ns *ns;
    int rc = 0;
    size_t bb;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 220;
    bb = kvc_ns_block_bytes(ns);
    adv_keys_shared(ns, 0x1d00, 4, keys);
    for (int i = 0; i < 4; i++) {
        blocks[i] = malloc(bb);
        got[i] = calloc(1, bb);
        daemon_block_fill(&keys[i], blocks[i], bb);
    }
    if (arg && kvc_put_prefix(ns, NULL, keys, 4, (const void *const *)blocks) != 4)
        rc = 221;
    /* Twice: the second copy goes through the index, mapped by the first. */
    for (int r = 0; r < 2 && !rc; r++)
        if (kvc_get_prefix(ns, keys, 4, got) != 4)
            rc = 222;
    for (int i = 0; i < 4 && !rc; i++)
        if (daemon_block_check(&keys[i], got[i], bb) >= 0)
            rc = 223;
    for (int i = 0; i < 4; i++) {
        free(blocks[i]);
        free(got[i]);
    }
    kvc_disconnect(c);
    return rc;
}

/* The reader of the victim's namespace (issue 28 row 2): it holds the index of the victim's
 * arena, read-only, and tries every way to write it (reopening its descriptor read-write
 * through /proc, a writable shared mapping, making its mapping writable, writing, punching,
 * changing the mode). Had any worked, it would swap the entries of the first two keys so
 * the victim's copies of key 1 would be block 2's bytes. */
static int adv_ix_reader(void *arg)
{
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    struct kvc_fast_attach_req q = {.what = KVC_FAST_INDEX};
    const struct kvc_fast_attach_rep *p;
    uint32_t plen;
    char path[64];
    kvc_client *c;
    kvc_ns *ns;
    int fd = -1, rw;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 230;
    q.arena_id = ns->arena;
    if (q.arena_id == 0 ||
        adv_call(c, KVC_OP_FAST_ATTACH, &q, sizeof(q), &fd, (const void **)&p, &plen) || fd < 0 ||
        plen < sizeof(*p))
        return 231;
    size_t bytes = p->bytes;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    rw = open(path, O_RDWR | O_CLOEXEC);
    if (rw >= 0 || errno != EACCES)
        return 232; /* the inode is the daemon's, 0600 */
    if (mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) != MAP_FAILED)
        return 233;
    void *ro = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (ro == MAP_FAILED || mprotect(ro, bytes, PROT_READ | PROT_WRITE) == 0)
        return 234;
    if (write(fd, "x", 1) >= 0 ||
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == 0)
        return 235;
    if (fchmod(fd, 0666) == 0)
        return 236;
    munmap(ro, bytes);
    close(fd);
    kvc_disconnect(c);
    return 0;
}

/* The daemon's own user or root (an admin here) can reopen the index read-write, as they can
 * do anything to the daemon; even so the kernel refuses every writable mapping and write but
 * the daemon's own (F_SEAL_FUTURE_WRITE). */
static void adv_ix_sealed(void)
{
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    struct kvc_fast_attach_req q = {.what = KVC_FAST_INDEX, .arena_id = 0};
    const struct kvc_fast_attach_rep *p;
    uint32_t plen;
    char path[64];
    kvc_client *c;
    kvc_ns *ns;
    int fd = -1, rw;
    ck_assert_int_eq(kvc_connect(adv_d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    ck_assert_int_eq(adv_call(c, KVC_OP_FAST_ATTACH, &q, sizeof(q), &fd, (const void **)&p, &plen),
                     0);
    ck_assert_int_ge(fd, 0);
    size_t bytes = p->bytes;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    rw = open(path, O_RDWR | O_CLOEXEC);
    ck_assert_int_ge(rw, 0); /* root passes the mode */
    ck_assert_ptr_eq(mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0), MAP_FAILED);
    ck_assert_int_eq(errno, EPERM);
    ck_assert_int_eq(write(rw, "x", 1), -1);
    ck_assert_int_eq(errno, EPERM);
    ck_assert_int_eq(fallocate(rw, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), -1);
    ck_assert_int_eq(errno, EPERM);
    struct stat st;
    ck_assert_int_eq(fstat(rw, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0600);
    close(rw);
    close(fd);
    kvc_disconnect(c);
}

/* The address of the daemon's writable mapping of arena 0's index, from /proc/PID/maps. */
static uint64_t adv_ix_daemon_map(void)
{
    char path[64], line[512];
    unsigned long long lo = 0, hi;
    char perms[8];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)adv_d.pid);
    FILE *f = fopen(path, "re");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f)) {
        if (!strstr(line, "memfd:kvcd-index-0 ") ||
            sscanf(line, "%llx-%llx %7s", &lo, &hi, perms) != 3 || strcmp(perms, "rw-s") != 0) {
            lo = 0;
            continue;
        }
        break;
    }
    fclose(f);
    ck_assert_uint_ne(lo, 0);
    return lo;
}

/* Nothing the daemon decides is read back from the index's header: with arena_bytes, the
 * bucket count and the seed overwritten in the daemon's own mapping (through /proc/PID/mem, as
 * root: the only writer the kernel leaves), the daemon goes on publishing new blocks, and a
 * client that mapped the index before reads them through it. */
static void adv_ix_header_spoiled(void)
{
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    struct kvc_key keys[8];
    void *blocks[8];
    kvc_client *c;
    kvc_ns *ns;
    uint64_t fast0 = 0, fast1 = 0, dropped = 0;
    char path[64];
    ck_assert_int_eq(kvc_connect(adv_d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    ck_assert_int_eq(adv_roundtrip_ns(ns, 0x1e00, 4), 0); /* maps the index */
    ck_assert_int_eq(c->fast[0].state, 1);
    uint64_t hdr = adv_ix_daemon_map();
    snprintf(path, sizeof(path), "/proc/%d/mem", (int)adv_d.pid);
    int mem = open(path, O_RDWR | O_CLOEXEC);
    ck_assert_int_ge(mem, 0);
    struct kvc_fast_hdr bad;
    ck_assert_int_eq(pread(mem, &bad, sizeof(bad), (off_t)hdr), (ssize_t)sizeof(bad));
    ck_assert_uint_eq(bad.magic, KVC_FAST_MAGIC);
    bad.arena_bytes = 0;
    bad.nbuckets = 1;
    bad.seed ^= 0x5555;
    bad.ents_off = bad.gens_off = ~0ull;
    ck_assert_int_eq(pwrite(mem, &bad, sizeof(bad), (off_t)hdr), (ssize_t)sizeof(bad));
    close(mem);
    /* New blocks after that: every one published and copied through the index. */
    ck_assert_int_eq(daemon_client_stat(c, 0, "fast_hits", &fast0), 0);
    adv_keys(ns, 0x1f00, 8, keys);
    size_t bb = kvc_ns_block_bytes(ns);
    for (int i = 0; i < 8; i++) {
        blocks[i] = malloc(bb);
        daemon_block_fill(&keys[i], blocks[i], bb);
    }
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, keys, 8, (const void *const *)blocks), 8);
    ck_assert_int_eq(kvc_flush(c), 0); /* the put's commit answered: published */
    for (int i = 0; i < 8; i++)
        memset(blocks[i], 0, bb);
    ck_assert_int_eq(kvc_get_prefix(ns, keys, 8, blocks), 8);
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(daemon_block_check(&keys[i], blocks[i], bb), -1);
        free(blocks[i]);
    }
    for (int i = 0; i < 500 && fast1 < fast0 + 8; i++) {
        ck_assert_int_eq(daemon_client_stat(c, 0, "fast_hits", &fast1), 0);
        ck_assert_int_eq(daemon_client_stat(c, 0, "fast_dropped", &dropped), 0);
        fast1 += dropped;
        adv_msleep(10);
    }
    ck_assert_uint_eq(fast1 - fast0, 8);
    kvc_disconnect(c);
}

START_TEST(test_index_writes)
{
    adv_start(NULL);
    ck_assert_int_eq(adv_run(ADV_VICTIM, adv_ix_victim, (void *)1), 0);
    ck_assert_int_eq(adv_run(ADV_READER, adv_ix_reader, NULL), 0);
    ck_assert_int_eq(adv_run(ADV_VICTIM, adv_ix_victim, NULL), 0); /* its bytes, as put */
    adv_ix_sealed();
    adv_ix_header_spoiled();
    adv_check_clean();
}
END_TEST

/* ---- the fast path: what a ring can claim ------------------------------------------------- */

/* A connection whose only traffic is its hit ring (valid hits, a few a millisecond, never
 * more than half a ring unread: as libkvc writes them) for twice server.idle_timeout: it is
 * closed for idleness like any other, its hits counted meanwhile. */
static int adv_ring_idle(void *arg)
{
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    struct kvc_fast_hit tmpl[4];
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_stat *st;
    size_t n;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns) || adv_roundtrip_ns(ns, 0x20, 4))
        return 240;
    struct kvc_fast_ring *ring = c->ring;
    if (!ring || ring->head < 4)
        return 241;
    struct kvc_fast_hit *ents = (struct kvc_fast_hit *)(ring + 1);
    for (uint32_t i = 0; i < 4; i++)
        tmpl[i] = ents[(ring->head - 4 + i) % KVC_FAST_RING_ENTS];
    uint64_t end = daemon_now_ms() + 2500;
    while (daemon_now_ms() < end) {
        uint64_t head = ring->head;
        if (head - __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE) < KVC_FAST_RING_ENTS / 2) {
            for (uint32_t i = 0; i < 4; i++)
                ents[(head + i) % KVC_FAST_RING_ENTS] = tmpl[i];
            __atomic_store_n(&ring->head, head + 4, __ATOMIC_RELEASE);
        }
        adv_msleep(5);
    }
    if (kvc_stats(c, 0, &st, &n) != -ETIMEDOUT)
        return 242;
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_ring_idle)
{
    static const char *const extra[] = {"-o", "server.idle_timeout=1000ms", NULL};
    adv_start(extra);
    uint64_t closed = adv_stat("closed_idle");
    ck_assert_int_eq(adv_run(ADV_ATTACKER, adv_ring_idle, NULL), 0);
    ck_assert_uint_eq(adv_stat("closed_idle"), closed + 1);
    ck_assert_uint_gt(adv_stat("fast_hits"), 100); /* its ring was read all along */
    ck_assert_int_ge(daemon_log_count(&adv_d, "idle for server.idle_timeout"), 1);
    adv_check_clean();
}
END_TEST

/* Copy times made up (issue 28 row 6): ring entries and RELEASEs that each claim 2^32-1 us.
 * A connection is credited at most 64 us per us it has been connected (a minute of that
 * banked), the rest counted in load_refused_us. */
static int adv_load_liar(void *arg)
{
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    struct kvc_fast_hit tmpl[4];
    struct kvc_key keys[4];
    kvc_client *c;
    kvc_ns *ns;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns) || adv_roundtrip_ns(ns, 0x21, 4))
        return 250;
    adv_keys(ns, 0x21, 4, keys);
    struct kvc_fast_ring *ring = c->ring;
    if (!ring || ring->head < 4)
        return 251;
    struct kvc_fast_hit *ents = (struct kvc_fast_hit *)(ring + 1);
    for (uint32_t i = 0; i < 4; i++)
        tmpl[i] = ents[(ring->head - 4 + i) % KVC_FAST_RING_ENTS];
    tmpl[0].load_us = UINT32_MAX;
    for (int r = 0; r < 200; r++) {
        uint64_t head = ring->head;
        for (uint32_t i = 0; i < 64; i++)
            ents[(head + i) % KVC_FAST_RING_ENTS] = tmpl[i % 4];
        __atomic_store_n(&ring->head, head + 64, __ATOMIC_RELEASE);
        kvc_lease *l;
        if (kvc_lookup(ns, keys, 4, 0, &l) != 4)
            return 252;
        struct {
            struct kvc_release_req q;
            uint64_t id;
        } rel = {.q = {.nleases = 1, .load_us = UINT32_MAX}, .id = l->ids[0]};
        if (adv_call(c, KVC_OP_RELEASE, &rel, sizeof(rel), NULL, NULL, NULL))
            return 253;
        free(l); /* released above */
    }
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_load_us_bounded)
{
    adv_start(NULL);
    uint64_t t0 = daemon_now_ms();
    ck_assert_int_eq(adv_run(ADV_ATTACKER, adv_load_liar, NULL), 0);
    uint64_t ms = daemon_now_ms() - t0 + 1;
    uint64_t load = adv_stat("load_us"), refused = adv_stat("load_refused_us");
    printf("e2e_adversary: made-up copy times: load_us %llu (%llu ms of test), %llu refused\n",
           (unsigned long long)load, (unsigned long long)ms, (unsigned long long)refused);
    /* The attacker's one connection: 64 us per us it was connected, a millisecond's worth at
     * connect (with room to spare for the test's own timing). */
    ck_assert_uint_le(load, 64 * 1000 * (ms + 1) * 4);
    ck_assert_uint_gt(refused, 100ull * UINT32_MAX);
    adv_check_clean();
}
END_TEST

/* ---- the fast path: hit rings ----------------------------------------------------------- */

/* Ring flood (issue 28 row 4): ADV_RF_CONNS connections of the attacker each advance their
 * hit ring by a ring's worth of valid hits and send FAST_ATTACH SYNC, over and over, while
 * the victim times LOOKUPs of its restricted prefix; in the rounds between, the same
 * connections send plain LOOKUPs (and RELEASEs) of their blocks instead. The rounds
 * alternate (plain, flood, five times each) so the host's noise falls on both, and the
 * victim's p99 under the flood must stay within 2x of its p99 under the plain lookups, over
 * the same number of samples. */
#define ADV_RF_CONNS 8
#define ADV_RF_ROUNDS 10
#define ADV_RF_SAMPLES 900 /* per round, at most */
#define ADV_RF_ROUND_MS 4000
#define ADV_RF_KEYS 16

static struct adv_rounds *adv_rf; /* the rounds (tests/lib/adversary.h) */
static int adv_rf_idx;            /* the attacker's number, set before each spawn */

static int adv_rf_attacker(void *arg)
{
    struct adv_rounds *rf = adv_rf;
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    struct kvc_key keys[ADV_RF_KEYS];
    struct kvc_fast_hit tmpl[ADV_RF_KEYS];
    kvc_client *c;
    kvc_ns *ns;
    int idx = adv_rf_idx, r = 0;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns))
        return 200;
    /* Its blocks, read once through the index: the ring's last entries are valid hits. */
    if (adv_roundtrip_ns(ns, 0x300 + (uint32_t)idx, ADV_RF_KEYS))
        return 201;
    adv_keys(ns, 0x300 + (uint32_t)idx, ADV_RF_KEYS, keys);
    struct kvc_fast_ring *ring = c->ring;
    if (!ring || ring->head < ADV_RF_KEYS)
        return 202;
    struct kvc_fast_hit *ents = (struct kvc_fast_hit *)(ring + 1);
    for (uint32_t i = 0; i < ADV_RF_KEYS; i++)
        tmpl[i] = ents[(ring->head - ADV_RF_KEYS + i) % KVC_FAST_RING_ENTS];
    if (tmpl[0].nkeys != ADV_RF_KEYS)
        return 203;
    __atomic_fetch_add(&rf->ready, 1, __ATOMIC_ACQ_REL);
    while ((r = adv_rounds_wait(rf, r)) > 0) {
        bool flood = (r & 1) == 0;
        while (__atomic_load_n(&rf->round_done, __ATOMIC_ACQUIRE) < r) {
            if (flood) {
                uint64_t head = ring->head;
                for (uint32_t i = 0; i < KVC_FAST_RING_ENTS; i++)
                    ents[(head + i) % KVC_FAST_RING_ENTS] = tmpl[i % ADV_RF_KEYS];
                __atomic_store_n(&ring->head, head + KVC_FAST_RING_ENTS, __ATOMIC_RELEASE);
                struct kvc_fast_attach_req q = {.what = KVC_FAST_SYNC};
                if (adv_call(c, KVC_OP_FAST_ATTACH, &q, sizeof(q), NULL, NULL, NULL))
                    return 204;
            } else {
                kvc_lease *l;
                if (kvc_lookup(ns, keys, ADV_RF_KEYS, 0, &l) != ADV_RF_KEYS || kvc_release(l))
                    return 205;
            }
            rf->msgs[r - 1][idx]++;
        }
    }
    kvc_disconnect(c);
    return 0;
}

/* Times LOOKUPs of its 8-block prefix in each round, and runs the rounds. */
static int adv_rf_victim(void *arg)
{
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    struct kvc_key keys[8];
    kvc_client *c;
    kvc_ns *ns;
    (void)arg;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns) || adv_roundtrip_ns(ns, 0x7300, 8))
        return 210;
    adv_keys(ns, 0x7300, 8, keys);
    int rc = adv_rounds_victim(adv_rf, ns, keys, 8);
    if (rc)
        return 210 + rc; /* 211: the attackers not ready, 212: a lookup failed */
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_ring_flood)
{
    pid_t att[ADV_RF_CONNS], vic;
    struct adv_rounds_sum sum;
    adv_rf = adv_rounds_new(ADV_RF_ROUNDS, ADV_RF_SAMPLES, ADV_RF_CONNS, ADV_RF_ROUND_MS);
    adv_start(NULL);
    for (int i = 0; i < ADV_RF_CONNS; i++) {
        adv_rf_idx = i;
        att[i] = adv_spawn(ADV_ATTACKER, adv_rf_attacker, NULL);
    }
    vic = adv_spawn(ADV_VICTIM, adv_rf_victim, NULL);
    ck_assert_int_eq(daemon_child_wait(vic, 120000, NULL), 0);
    for (int i = 0; i < ADV_RF_CONNS; i++)
        ck_assert_int_eq(daemon_child_wait(att[i], 30000, NULL), 0);
    /* The same number of samples of each kind: the fewest any round took, from every one. */
    adv_rounds_sum(adv_rf, &sum);
    printf("e2e_adversary: ring flood: victim LOOKUP p50 %.3f ms, p99 %.3f ms under %llu plain "
           "lookups; p50 %.3f ms, p99 %.3f ms under %llu ring floods of %u hits (%u samples "
           "each); fast_hits %llu, fast_dropped %llu\n",
           sum.p50p, sum.p99p, (unsigned long long)sum.mplain, sum.p50f, sum.p99f,
           (unsigned long long)sum.mflood, KVC_FAST_RING_ENTS, sum.samples,
           (unsigned long long)adv_stat("fast_hits"),
           (unsigned long long)adv_stat_or0("fast_dropped"));
    fflush(stdout);
    ck_assert_uint_ge(sum.n, 200);
    ck_assert_msg(sum.p99f <= 2 * sum.p99p,
                  "victim p99 %.3f ms under the ring flood, %.3f ms under plain "
                  "lookups",
                  sum.p99f, sum.p99p);
    adv_rounds_free(adv_rf);
    adv_check_clean();
}
END_TEST

/* ---- the reader's decode ------------------------------------------------------------------- */

/* A writer of the arena rewrites a quantized block's section table while a reader decodes
 * it: libkvc checked the table and then read it again from shared memory, so the second
 * read could send it past its buffers. It parses a private copy now: every decode either
 * succeeds or says the block is malformed, and nothing is read out of bounds (ASan). */
struct adv_race {
    uint8_t *shared;
    uint32_t *offset; /* of the last section, inside shared */
    uint32_t good;
};

/* The racing writer: another process (as an attacker is), flipping the section's offset in
 * the shared mapping until it is killed. */
static pid_t adv_race_writer(struct adv_race *r)
{
    pid_t pid = fork();
    if (pid == 0) {
        for (;;) {
            __atomic_store_n(r->offset, 0x7ffffff0u, __ATOMIC_RELAXED);
            __atomic_store_n(r->offset, r->good, __ATOMIC_RELAXED);
        }
    }
    return pid;
}

START_TEST(test_reader_private_copy)
{
    struct kern_layout kl = {
        .layers = 2, .heads = 2, .head_dim = 64, .tokens = 32, .dtype = KERN_DTYPE_FP16};
    struct kern_recipe rec;
    struct kvc_ns ns;
    struct adv_race race;
    kern_recipe_fill(&rec, KERN_CODEC_Q8_0, KERN_CODEC_Q8_0, 0);
    uint64_t raw = kern_raw_size(&kl);
    int64_t enc = kern_encoded_size(&kl, &rec);
    ck_assert_int_gt(enc, 0);
    uint16_t *src = malloc(raw), *dst = malloc(raw);
    struct kvc_key k = {.lo = 1, .hi = 2};
    daemon_smooth_fill(&k, src, raw / 2);
    race.shared =
        mmap(NULL, (size_t)enc, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(race.shared != MAP_FAILED);
    ck_assert_int_eq(kern_encode_cpu(&kl, &rec, src, race.shared, (size_t)enc, NULL), enc);
    memset(&ns, 0, sizeof(ns));
    ns.block_bytes = raw;
    ns.layout = (struct kvc_wire_layout){.layers = 2,
                                         .kv_heads = 2,
                                         .head_dim = 64,
                                         .block_tokens = 32,
                                         .dtype = KVC_WIRE_DTYPE_FP16,
                                         .kv_kind = KVC_WIRE_KV_KIND_KV};
    kvc_lease *l = calloc(1, sizeof(*l) + sizeof(l->hits[0]));
    l->ns = &ns;
    l->n = 1;
    l->hits[0] = (struct kvc_hit){.data = race.shared,
                                  .len = (uint64_t)enc,
                                  .format = KVC_WIRE_FORMAT_Q8_0,
                                  .ready = true,
                                  .tier = KVC_WIRE_TIER_HOST};
    ck_assert_int_eq(kvc_lease_copy(l, 0, dst, raw), 0);
    ck_assert(daemon_smooth_err(&k, dst, raw / 2) < 0.01);
    race.offset = (uint32_t *)(race.shared + sizeof(struct kern_block_hdr) +
                               3 * sizeof(struct kern_block_sect));
    race.good = *race.offset;
    pid_t writer = adv_race_writer(&race);
    ck_assert_int_gt(writer, 0);
    int ok = 0, bad = 0;
    /* 20,000 decodes, and on until the writer has been seen (it may start late on a busy
     * machine), within a bounded time. */
    time_t until = time(NULL) + 30;
    for (int i = 0; i < 20000 || (bad == 0 && time(NULL) < until); i++) {
        int rc = kvc_lease_copy(l, 0, dst, raw);
        ck_assert_msg(rc == 0 || rc == -EBADMSG, "decode: %d", rc);
        rc == 0 ? ok++ : bad++;
    }
    kill(writer, SIGKILL);
    waitpid(writer, NULL, 0);
    printf("e2e_adversary: reader under a racing writer: %d decoded, %d refused\n", ok, bad);
    ck_assert_int_gt(bad, 0); /* the writer did race the reader */
    free(l);
    munmap(race.shared, (size_t)enc);
    free(src);
    free(dst);
}
END_TEST

/* ---- the fast path: the bell ------------------------------------------------------------ */

/* Hostile bells (issue 32): a pass looks only at the rings whose bit in their uid's bell is
 * set (client/kvc_fast.h). The attacker (another uid) sets every bit of its bell and clears
 * them, over and over, writes garbage into its ring and the bell's number in the ring's
 * header, and asks for a second bell and for one without a ring (refused). A client of the
 * victim's own uid clears every bit of their bell all along (it can: one uid is one trust
 * domain). The victim's hits through the index, its connection making no request meanwhile,
 * are all counted, and nothing else is: the daemon's sweep reads a ring whose bit was
 * cleared, and the attacker's bell reaches no other uid's ring. */
#define ADV_BELL_ROUNDS 40

static bool adv_bell_stop(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) == 1;
}

static int adv_bell_attacker(void *arg)
{
    struct adv_sync *sy = arg;
    struct kvc_layout lay = daemon_layout("attacker-model", ADV_BT);
    struct kvc_fast_attach_req q = {.what = KVC_FAST_BELL};
    kvc_client *c[3];
    kvc_ns *ns;
    for (int i = 0; i < 2; i++)
        if (kvc_connect(adv_d.sock, &c[i]) || kvc_ns_open(c[i], &lay, &ns) ||
            adv_roundtrip_ns(ns, 0x30 + (uint32_t)i, 4))
            return 160;
    if (!c[0]->bell || !c[1]->bell || c[0]->bell_bit == c[1]->bell_bit)
        return 161;
    if (adv_call(c[0], KVC_OP_FAST_ATTACH, &q, sizeof(q), NULL, NULL, NULL) != -EEXIST)
        return 162; /* one bell per connection */
    if (kvc_connect(adv_d.sock, &c[2]) ||
        adv_call(c[2], KVC_OP_FAST_ATTACH, &q, sizeof(q), NULL, NULL, NULL) != -ENOENT)
        return 163; /* a bell is for a ring */
    adv_signal(sy->up[1], 'r');
    uint64_t *bell = c[0]->bell;
    struct kvc_fast_ring *r = c[0]->ring;
    struct kvc_fast_hit *e = (struct kvc_fast_hit *)(r + 1);
    for (uint64_t round = 0; !adv_bell_stop(sy->down[0]); round++) {
        for (uint32_t w = 0; w < KVC_FAST_BELL_BITS / 64; w++)
            __atomic_store_n(&bell[w], round & 1 ? 0 : ~0ull, __ATOMIC_RELAXED);
        __atomic_store_n(&r->bell, (uint32_t)(round * 2654435761u), __ATOMIC_RELAXED);
        uint64_t head = r->head;
        for (uint32_t i = 0; i < 16; i++)
            e[(head + i) % KVC_FAST_RING_ENTS] = (struct kvc_fast_hit){.ns = (uint32_t)round,
                                                                       .block = (uint32_t)i,
                                                                       .klo = round,
                                                                       .khi = ~round,
                                                                       .nkeys = 1};
        __atomic_store_n(&r->head, round % 7 == 6 ? head - 3 : head + 16, __ATOMIC_RELEASE);
        usleep(200);
    }
    for (int i = 0; i < 3; i++)
        kvc_disconnect(c[i]);
    return 0;
}

/* Of the victim's uid: clears every bit of the uid's bell, all along. */
static int adv_bell_clearer(void *arg)
{
    struct adv_sync *sy = arg;
    struct kvc_layout lay = daemon_layout("clearer-model", ADV_BT);
    kvc_client *c;
    kvc_ns *ns;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns) || adv_roundtrip_ns(ns, 0x31, 4))
        return 170;
    if (!c->bell)
        return 171;
    adv_signal(sy->up[1], 'r');
    while (!adv_bell_stop(sy->down[0])) {
        for (uint32_t w = 0; w < KVC_FAST_BELL_BITS / 64; w++)
            __atomic_store_n(&c->bell[w], 0, __ATOMIC_RELAXED);
        usleep(50);
    }
    kvc_disconnect(c);
    return 0;
}

/* Its prefix out and back, then ADV_BELL_ROUNDS gets of it through the index with no other
 * request; says how many hits its ring took, and holds its connection until told. */
static int adv_bell_victim(void *arg)
{
    struct adv_sync *sy = arg;
    struct kvc_layout lay = daemon_layout("victim-model", ADV_BT);
    struct kvc_key keys[8];
    void *got[8];
    kvc_client *c;
    kvc_ns *ns;
    int rc = 0;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns) || adv_roundtrip_ns(ns, 0x32, 8))
        return 180;
    if (!c->bell || !c->ring)
        return 181;
    adv_keys(ns, 0x32, 8, keys);
    for (int i = 0; i < 8; i++)
        got[i] = malloc(kvc_ns_block_bytes(ns));
    for (int r = 0; r < ADV_BELL_ROUNDS && !rc; r++) {
        if (kvc_get_prefix(ns, keys, 8, got) != 8)
            rc = 182;
        adv_msleep(1);
    }
    for (int i = 0; i < 8 && !rc; i++)
        if (daemon_block_check(&keys[i], got[i], kvc_ns_block_bytes(ns)) >= 0)
            rc = 183;
    uint64_t took = c->ring->head;
    if (!rc && c->ring->lost)
        rc = 184;
    if ((size_t)write(sy->up[1], &took, sizeof(took)) != sizeof(took))
        rc = 185;
    adv_await(sy->down[0]);
    kvc_disconnect(c);
    for (int i = 0; i < 8; i++)
        free(got[i]);
    return rc;
}

START_TEST(test_bell_hostile)
{
    struct adv_sync a, cl, v;
    uint64_t took = 0, fast = 0, prev = UINT64_MAX;
    adv_start(NULL);
    adv_sync_init(&a);
    adv_sync_init(&cl);
    adv_sync_init(&v);
    pid_t pa = adv_spawn(ADV_ATTACKER, adv_bell_attacker, &a);
    ck_assert_int_eq(adv_await(a.up[0]), 'r');
    pid_t pc = adv_spawn(ADV_VICTIM, adv_bell_clearer, &cl);
    ck_assert_int_eq(adv_await(cl.up[0]), 'r');
    /* Their own round trips' hits counted, before the victim's. */
    for (int i = 0; i < 100 && (fast = adv_stat("fast_hits")) != prev; i++) {
        prev = fast;
        adv_msleep(150);
    }
    uint64_t refused0 = adv_stat("fast_refused");
    pid_t pv = adv_spawn(ADV_VICTIM, adv_bell_victim, &v);
    struct pollfd p = {.fd = v.up[0], .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 60000), 1);
    ck_assert_int_eq(read(v.up[0], &took, sizeof(took)), (ssize_t)sizeof(took));
    ck_assert_uint_ge(took, 8 * (ADV_BELL_ROUNDS + 1));
    /* Counted by the passes (the sweep's, its bit cleared), while it holds its connection. */
    uint64_t want = prev + took;
    for (int i = 0; i < daemon_ms(5000) / 10 && (fast = adv_stat("fast_hits")) < want; i++)
        adv_msleep(10);
    printf("e2e_adversary: bells set and cleared: %llu of the victim's %llu hits counted, "
           "%llu entries refused\n",
           (unsigned long long)(fast - prev), (unsigned long long)took,
           (unsigned long long)(adv_stat("fast_refused") - refused0));
    ck_assert_uint_eq(fast, want);
    ck_assert_uint_gt(adv_stat("fast_refused"), refused0); /* the attacker's garbage */
    adv_signal(v.down[1], 'x');
    adv_signal(a.down[1], 'x');
    adv_signal(cl.down[1], 'x');
    ck_assert_int_eq(daemon_child_wait(pv, 60000, NULL), 0);
    ck_assert_int_eq(daemon_child_wait(pa, 60000, NULL), 0);
    ck_assert_int_eq(daemon_child_wait(pc, 60000, NULL), 0);
    ck_assert_uint_eq(adv_stat("fast_hits"), want);
    adv_sync_fini(&a);
    adv_sync_fini(&cl);
    adv_sync_fini(&v);
    adv_check_clean();
}
END_TEST

/* Another uid's bell and ring (the daemon's memfds, 0600, its own): while the victim holds
 * both, the attacker reaches for every descriptor the daemon has, through /proc (reading
 * the list, opening each read-write and read-only) and pidfd_getfd; every way is refused,
 * so the only bell it can ring is its own uid's (test_bell_hostile). */
static int adv_bell_reacher(void *arg)
{
    char path[64];
    int got = 0;
    (void)arg;
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)adv_d.pid);
    DIR *d = opendir(path);
    if (d || errno != EACCES)
        return 190; /* the daemon's descriptor list is not another user's to read */
    for (int fd = 0; fd < 4096; fd++) {
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)adv_d.pid, fd);
        int a = open(path, O_RDWR | O_CLOEXEC), b = open(path, O_RDONLY | O_CLOEXEC);
        got += (a >= 0) + (b >= 0);
        if (a >= 0)
            close(a);
        if (b >= 0)
            close(b);
    }
    if (got)
        return 191;
    int pfd = (int)syscall(SYS_pidfd_open, adv_d.pid, 0);
    for (int fd = 0; pfd >= 0 && fd < 4096; fd++) {
        int x = (int)syscall(SYS_pidfd_getfd, pfd, fd, 0);
        if (x >= 0) {
            close(x);
            got++;
        }
    }
    if (pfd >= 0)
        close(pfd);
    return got ? 192 : 0;
}

START_TEST(test_bell_other_uid)
{
    struct adv_sync v;
    uint64_t took;
    adv_start(NULL);
    adv_sync_init(&v);
    pid_t pv = adv_spawn(ADV_VICTIM, adv_bell_victim, &v);
    struct pollfd p = {.fd = v.up[0], .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 60000), 1);
    ck_assert_int_eq(read(v.up[0], &took, sizeof(took)), (ssize_t)sizeof(took));
    ck_assert_int_eq(adv_run(ADV_ATTACKER, adv_bell_reacher, NULL), 0);
    adv_signal(v.down[1], 'x');
    ck_assert_int_eq(daemon_child_wait(pv, 60000, NULL), 0);
    adv_sync_fini(&v);
    adv_check_clean();
}
END_TEST

/* ---- the suite ---------------------------------------------------------------------------------- */

int main(void)
{
    const struct adv_case cases[] = {
        {"test_index_writes", test_index_writes, true},
        {"test_ring_idle", test_ring_idle, true},
        {"test_load_us_bounded", test_load_us_bounded, true},
        {"test_ring_flood", test_ring_flood, true},
        {"test_bell_hostile", test_bell_hostile, true},
        {"test_bell_other_uid", test_bell_other_uid, true},
    };
    Suite *s = suite_create("e2e_adversary_fast");
    adv_cases_add(s, "e2e_adversary_fast", cases, sizeof(cases) / sizeof(cases[0]));
    adv_case(s, "test_reader_private_copy", test_reader_private_copy); /* no other uid */
    return adv_suite_run(s, "e2e-adversary-fast");
}
