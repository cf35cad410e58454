/*
 * check_e2e_quant — quantize-in-place end to end: a small arena under pressure quantizes the
 * blocks of a namespace that allows q8_0, a client reads them back dequantized (within the
 * codec's error bound) and as stored, and a namespace that allows nothing never holds a lossy
 * block (its hits are raw and bit-exact); the precision ladder through the daemon; and the
 * puts that wait for its jobs, served as they land.
 */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/loop.h"
#include "daemon/quant.h"
#include "daemon/server.h"
#include "daemon/store.h"
#include "tests/lib/adversary.h"
#include "tests/lib/daemon.h"
#include "tests/lib/inproc.h"
#include "tiers/host.h"
#include "tiers/slab.h"
#include "tiers/tier.h"

#define QE_BLOCKS                                                                                  \
    125 /* per namespace; the 16 MiB arena holds 256 raw 64 KiB blocks: over
                         the high watermark of 0.95 (set below; the default is 0.99) */

/* lru: the fixed order (quantize the coldest first); under the policy engine the blocks here,
 * each the first of its prefix (a sink) and never hit, would be dropped, not quantized. */
static const char *const qe_args[] = {
    "-o", "host.size=16m",           "-o", "host.page_size=64k",
    "-o", "cache.policy=lru",        "-o", "host.high_watermark=0.95",
    "-o", "host.low_watermark=0.90", NULL};

START_TEST(test_quant_under_pressure)
{
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *nq, *nr;
    struct kvc_layout lq = daemon_layout("e2e-quant", 64), lr = daemon_layout("e2e-raw", 64);
    struct kvc_quant qq = {
        .allowed = 1u << KVC_CODEC_Q8_0, .k_codec = KVC_CODEC_Q8_0, .v_codec = KVC_CODEC_Q8_0};
    static struct kvc_key kq[QE_BLOCKS], kr[QE_BLOCKS];
    uint64_t v = 0;
    char out[65536], err[4096];
    ck_assert_int_eq(daemon_start(&d, qe_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open_quant(c, &lq, &qq, &nq), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lr, &nr), 0);
    size_t bb = kvc_ns_block_bytes(nq), n = bb / 2;
    uint16_t *buf = malloc(bb);
    for (int i = 0; i < QE_BLOCKS; i++) {
        ck_assert_int_eq(daemon_chain_keys(nq, (uint32_t)i, 0, 0, 1, &kq[i]), 0);
        ck_assert_int_eq(daemon_chain_keys(nr, (uint32_t)i, 0, 0, 1, &kr[i]), 0);
        for (int w = 0; w < 2; w++) {
            const void *blk = buf;
            daemon_smooth_fill(w ? &kr[i] : &kq[i], buf, n);
            ck_assert_int_ge(kvc_put_prefix(w ? nr : nq, NULL, w ? &kr[i] : &kq[i], 1, &blk), 0);
        }
    }
    /* The worker runs beside the loop: wait until a quantized block is there to be hit. A
     * block quantized early may have been evicted by a later trim of the puts above (it is
     * the coldest), so "quantized_blocks > 0" alone can come before the last jobs landed;
     * with the puts over nothing presses on the arena, so what is quantized now stays. */
    for (uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(10000); daemon_now_ms() < end;) {
        int seen = 0;
        for (int i = 0; i < QE_BLOCKS && !seen; i++) {
            kvc_lease *l;
            const void *data;
            size_t len;
            if (kvc_lookup(nq, &kq[i], 1, KVC_LOOKUP_READY_ONLY, &l) == 1) {
                seen = kvc_lease_stored(l, 0, &data, &len) == KVC_CODEC_Q8_0;
                kvc_release(l);
            }
        }
        if (seen)
            break;
        usleep(20000);
    }
    ck_assert_int_eq(daemon_stat(&d, "quantized_blocks", &v), 0);
    ck_assert_uint_gt(v, 0);
    ck_assert_int_eq(daemon_stat(&d, "quant_bytes_saved", &v), 0);
    ck_assert_uint_gt(v, 0);
    uint64_t lossy0 = 0, q80 = 0; /* the waiting above hit some too */
    ck_assert_int_eq(daemon_stat(&d, "hit_blocks_lossy", &lossy0), 0);
    ck_assert_int_eq(daemon_stat(&d, "hit_blocks_q8_0", &q80), 0);
    int lossy = 0, raw_checked = 0;
    for (int i = 0; i < QE_BLOCKS; i++) {
        kvc_lease *l;
        const void *data;
        size_t len;
        int h = kvc_lookup(nq, &kq[i], 1, 0, &l);
        ck_assert_int_ge(h, 0); /* a quantized hit is a valid location */
        if (h == 1) {
            int f = kvc_lease_stored(l, 0, &data, &len);
            ck_assert_int_ge(f, 0);
            ck_assert_int_eq(kvc_lease_copy(l, 0, buf, bb), 0);
            if (f == KVC_CODEC_Q8_0) {
                lossy++;
                ck_assert_uint_lt(len, bb);
                ck_assert_double_lt(daemon_smooth_err(&kq[i], buf, n), 0.02);
            } else {
                ck_assert_int_eq(f, KVC_CODEC_RAW);
                ck_assert_double_eq(daemon_smooth_err(&kq[i], buf, n), 0.0);
            }
            kvc_release(l);
        }
        if (kvc_lookup(nr, &kr[i], 1, 0, &l) == 1) { /* an eviction may take raw blocks */
            ck_assert_int_eq(kvc_lease_stored(l, 0, &data, &len), KVC_CODEC_RAW);
            ck_assert_uint_eq(len, bb);
            ck_assert_int_eq(kvc_lease_copy(l, 0, buf, bb), 0);
            ck_assert_double_eq(daemon_smooth_err(&kr[i], buf, n), 0.0);
            kvc_release(l);
            raw_checked++;
        }
    }
    ck_assert_int_gt(lossy, 0);
    ck_assert_int_gt(raw_checked, 0);
    /* the daemon counted the same lossy hits, by codec */
    ck_assert_int_eq(daemon_stat(&d, "hit_blocks_lossy", &v), 0);
    ck_assert_uint_eq(v - lossy0, (uint64_t)lossy);
    ck_assert_int_eq(daemon_stat(&d, "hit_blocks_q8_0", &v), 0);
    ck_assert_uint_eq(v - q80, (uint64_t)lossy);
    ck_assert_int_eq(daemon_stat(&d, "hit_blocks_q4_1", &v), 0);
    ck_assert_uint_eq(v, 0);
    /* kvcctl ls names the codec of each block: every q8_0 row is of the q8_0 namespace (rows
     * carry the namespace id, not the model) */
    ck_assert_int_eq(daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "ls", "--json",
                                   "--codec", "q8_0", NULL),
                     0);
    ck_assert(daemon_json_valid(out));
    char ns_q[32], ns_r[32];
    snprintf(ns_q, sizeof(ns_q), "{\"ns\": %u,", kvc_ns_id(nq));
    snprintf(ns_r, sizeof(ns_r), "{\"ns\": %u,", kvc_ns_id(nr));
    int rows = 0, rows_q = 0, rows_codec = 0;
    for (const char *p = out; (p = strstr(p, "{\"ns\": ")); p++)
        rows++;
    for (const char *p = out; (p = strstr(p, ns_q)); p++)
        rows_q++;
    for (const char *p = out; (p = strstr(p, "\"codec\": \"q8_0\"")); p++)
        rows_codec++;
    ck_assert_int_gt(rows, 0);
    ck_assert_int_eq(rows_q, rows);
    ck_assert_int_eq(rows_codec, rows);
    ck_assert_ptr_null(strstr(out, ns_r));
    free(buf);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* The lru trigger in an arena whose pages are all cut for raw blocks (64 KiB pages, four
 * 16 KiB raw slots each): a quantization often finds no slot of q4_1's size (evicting raw
 * blocks frees raw slots only), so the block's slab is quantized whole, empties, and its
 * pages take the smaller slots (quant_no_room, quant_slab_steps). 4,000 blocks put in chains
 * of 16 through an arena of 1,024 raw slots, nothing hit: the slab steps happen, and every
 * block still cached reads back raw and exact or q4_1 within its bound (the encoded blocks
 * placed in the emptied slabs are the right ones). */
#define QS_CHAINS 250
#define QS_LEN 16

static const char *const qs_args[] = {"-o", "host.size=16m", "-o", "host.page_size=64k", "-o",
                                      "cache.policy=lru", NULL};

START_TEST(test_lru_quant_whole_slabs)
{
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_layout lq = daemon_layout("e2e-quant-slabs", 16); /* 16 KiB blocks */
    struct kvc_quant qq = {
        .allowed = 1u << KVC_CODEC_Q4_1, .k_codec = KVC_CODEC_Q4_1, .v_codec = KVC_CODEC_Q4_1};
    static struct kvc_key k[QS_CHAINS][QS_LEN];
    uint64_t quantized = 0, no_room = 0, slabs = 0, evicted = 0;
    ck_assert_int_eq(daemon_start(&d, qs_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open_quant(c, &lq, &qq, &ns), 0);
    size_t bb = kvc_ns_block_bytes(ns), n = bb / 2;
    ck_assert_uint_eq(bb, 16384);
    uint16_t *buf = malloc(QS_LEN * bb);
    ck_assert_ptr_nonnull(buf);
    for (uint32_t i = 0; i < QS_CHAINS; i++) {
        const void *blk[QS_LEN];
        ck_assert_int_eq(daemon_chain_keys(ns, i, 0, 0, QS_LEN, k[i]), 0);
        for (int j = 0; j < QS_LEN; j++) {
            daemon_smooth_fill(&k[i][j], buf + (size_t)j * n, n);
            blk[j] = buf + (size_t)j * n;
        }
        ck_assert_int_ge(kvc_put_prefix(ns, NULL, k[i], QS_LEN, blk), 0);
        kvc_flush(c);
    }
    ck_assert_int_eq(daemon_stat(&d, "quantized_blocks", &quantized), 0);
    ck_assert_int_eq(daemon_stat(&d, "quant_no_room", &no_room), 0);
    ck_assert_int_eq(daemon_stat(&d, "quant_slab_steps", &slabs), 0);
    ck_assert_int_eq(daemon_stat(&d, "evicted_blocks", &evicted), 0);
    printf("e2e_quant: lru over full raw slabs: %llu of %d blocks quantized, %llu slabs whole "
           "(%llu found no slot), %llu evicted\n",
           (unsigned long long)quantized, QS_CHAINS * QS_LEN, (unsigned long long)slabs,
           (unsigned long long)no_room, (unsigned long long)evicted);
    fflush(stdout);
    ck_assert_uint_gt(no_room, 0);
    ck_assert_uint_gt(slabs, 0);
    /* The arena holds 1,024 raw blocks; of the ~3,000 put past it at least an eighth are
     * quantized before they leave (1,608-1,798 of 4,000 here), not a handful. */
    ck_assert_uint_ge(quantized, QS_CHAINS * QS_LEN / 8);
    int lossy = 0, cached = 0;
    for (uint32_t i = 0; i < QS_CHAINS; i++)
        for (int j = 0; j < QS_LEN; j++) {
            kvc_lease *l;
            const void *data;
            size_t len;
            if (kvc_lookup(ns, &k[i][j], 1, 0, &l) != 1)
                continue;
            int f = kvc_lease_stored(l, 0, &data, &len);
            ck_assert_int_eq(kvc_lease_copy(l, 0, buf, bb), 0);
            cached++;
            if (f == KVC_CODEC_Q4_1) {
                lossy++;
                ck_assert_double_lt(daemon_smooth_err(&k[i][j], buf, n), 0.12);
            } else {
                ck_assert_int_eq(f, KVC_CODEC_RAW);
                ck_assert_double_eq(daemon_smooth_err(&k[i][j], buf, n), 0.0);
            }
            kvc_release(l);
        }
    printf("e2e_quant: lru over full raw slabs: %d blocks cached (%d q4_1), the arena holds "
           "1,024 raw\n", cached, lossy);
    ck_assert_int_gt(lossy, 0);
    free(buf);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* The precision ladder end to end: under the default policy a namespace that allows q8_0
 * and q4_1 holds an arena a third too small for its chains by stepping blocks down (raw, then
 * q8_0, then q4_1 re-encoded from it) while a client keeps asking for some chains again; the
 * client's lossy hits decode within their codec's bound (q8_0 0.02, q4_1 0.12), raw hits and
 * sinks are exact, and the daemon counts the steps and the hits by codec. */
#define QL_CHAINS 160
#define QL_LEN 4

static const char *const ql_args[] = {"-o", "host.size=16m", "-o", "host.page_size=256k", NULL};

/* Puts QL_CHAINS chains of QL_LEN smooth blocks (keys into k) three times over, a third of
 * them looked up (and so hit) before each later put: the ladder's hits. */
static void ql_rounds(kvc_ns *ns, struct kvc_key k[QL_CHAINS][QL_LEN], uint16_t *buf, size_t n)
{
    for (int round = 0; round < 3; round++)
        for (int ch = 0; ch < QL_CHAINS; ch++) {
            const void *blk[QL_LEN];
            if (round == 0)
                ck_assert_int_eq(daemon_chain_keys(ns, (uint32_t)ch, 0, 0, QL_LEN, k[ch]), 0);
            /* a third of the chains come back: hits, which the ladder keeps (lossy) */
            if (round > 0 && ch % 3)
                continue;
            if (round > 0) {
                kvc_lease *l;
                int h = kvc_lookup(ns, k[ch], QL_LEN, 0, &l);
                ck_assert_int_ge(h, 0);
                if (h)
                    kvc_release(l);
            }
            for (int i = 0; i < QL_LEN; i++) {
                daemon_smooth_fill(&k[ch][i], buf + (size_t)i * n, n);
                blk[i] = buf + (size_t)i * n;
            }
            ck_assert_int_ge(kvc_put_prefix(ns, NULL, k[ch], QL_LEN, blk), 0);
        }
}

/* Looks every chain up (waiting for disk reads) and checks each hit: a sink (and any raw
 * hit) exact, a lossy one q8_0 or q4_1, smaller than raw, within its codec's bound. Counts
 * hits by codec into by_codec; with whole, every block of every chain must be a hit. */
static int ql_verify(kvc_ns *ns, struct kvc_key k[QL_CHAINS][QL_LEN], uint16_t *buf, size_t bb,
                     int *by_codec, bool whole)
{
    int hits = 0;
    for (int ch = 0; ch < QL_CHAINS; ch++) {
        kvc_lease *l;
        int h = kvc_lookup(ns, k[ch], QL_LEN, 0, &l);
        ck_assert_int_ge(h, 0);
        if (whole)
            ck_assert_msg(h == QL_LEN, "chain %d: %d of %d blocks", ch, h, QL_LEN);
        for (int i = 0; i < h; i++) {
            const void *data;
            size_t len;
            int f = kvc_lease_stored(l, (size_t)i, &data, &len);
            ck_assert_int_ge(f, 0);
            ck_assert_int_eq(kvc_lease_copy(l, (size_t)i, buf, bb), 0);
            double e = daemon_smooth_err(&k[ch][i], buf, bb / 2);
            if (f == KVC_CODEC_RAW || i == 0) {
                ck_assert_int_eq(f, KVC_CODEC_RAW); /* a sink stays raw */
                ck_assert_double_eq(e, 0.0);
            } else {
                ck_assert_msg(f == KVC_CODEC_Q8_0 || f == KVC_CODEC_Q4_1, "codec %d", f);
                ck_assert_uint_lt(len, bb);
                ck_assert_double_lt(e, f == KVC_CODEC_Q8_0 ? 0.02 : 0.12);
            }
            by_codec[f]++;
            hits++;
        }
        if (h)
            kvc_release(l);
    }
    return hits;
}

/* Starts kvcd with args and opens `model` allowing q8_0 (the recipe) and q4_1: the ladder's
 * namespace. */
static kvc_ns *ql_open(struct daemon *d, const char *const *args, const char *model, kvc_client **c)
{
    struct kvc_layout lay = daemon_layout(model, 64);
    struct kvc_quant qq = {.allowed = 1u << KVC_CODEC_Q8_0 | 1u << KVC_CODEC_Q4_1,
                           .k_codec = KVC_CODEC_Q8_0,
                           .v_codec = KVC_CODEC_Q8_0};
    kvc_ns *ns = NULL;
    ck_assert_int_eq(daemon_start(d, args), 0);
    ck_assert_int_eq(kvc_connect(d->sock, c), 0);
    ck_assert_int_eq(kvc_ns_open_quant(*c, &lay, &qq, &ns), 0);
    return ns;
}

START_TEST(test_ladder_end_to_end)
{
    struct daemon d = {0};
    kvc_client *c;
    static struct kvc_key k[QL_CHAINS][QL_LEN];
    int by_codec[KVC_CODEC_KIVI4 + 8] = {0}, hits = 0;
    uint64_t v = 0, lossy0 = 0;
    kvc_ns *ns = ql_open(&d, ql_args, "e2e-ladder", &c);
    size_t bb = kvc_ns_block_bytes(ns);
    uint16_t *buf = malloc(bb * QL_LEN);
    ck_assert_ptr_nonnull(buf);
    ql_rounds(ns, k, buf, bb / 2);
    ck_assert_int_eq(daemon_stat(&d, "hit_blocks_lossy", &lossy0), 0);
    hits = ql_verify(ns, k, buf, bb, by_codec, false);
    printf("e2e_quant: ladder: %d hits, raw %d, q8_0 %d, q4_1 %d\n", hits, by_codec[KVC_CODEC_RAW],
           by_codec[KVC_CODEC_Q8_0], by_codec[KVC_CODEC_Q4_1]);
    uint64_t steps = 0, evicted = 0, waits = 0, timeouts = 0;
    daemon_stat(&d, "ladder_steps", &steps);
    daemon_stat(&d, "evicted_blocks", &evicted);
    daemon_stat(&d, "put_waits", &waits);
    daemon_stat(&d, "put_wait_timeouts", &timeouts);
    ck_assert_msg(by_codec[KVC_CODEC_Q8_0] + by_codec[KVC_CODEC_Q4_1] > 0,
                  "no lossy hit: %d hits, %llu ladder steps, %llu evicted, %llu put waits "
                  "(%llu timed out)",
                  hits, (unsigned long long)steps, (unsigned long long)evicted,
                  (unsigned long long)waits, (unsigned long long)timeouts);
    ck_assert_int_eq(daemon_stat(&d, "ladder_steps", &v), 0);
    ck_assert_uint_gt(v, 0);
    /* a block over its rung's target goes straight to the rung it rests on
     * (store_ladder_dest): raw blocks are encoded once, not raw -> q8_0 -> q4_1 */
    ck_assert_int_eq(daemon_stat(&d, "quantized_blocks", &v), 0);
    ck_assert_uint_gt(v, 0);
    ck_assert_int_eq(daemon_stat(&d, "hit_blocks_lossy", &v), 0);
    ck_assert_uint_eq(v - lossy0, (uint64_t)(by_codec[KVC_CODEC_Q8_0] + by_codec[KVC_CODEC_Q4_1]));
    /* kvcctl policy shows the namespace's rungs and the share of its bytes on each */
    char out[8192], err[1024];
    ck_assert_int_eq(
        daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "--json", "policy", NULL), 0);
    ck_assert(daemon_json_valid(out));
    ck_assert_msg(strstr(out, "\"ladder\": {\"raw\": ") && strstr(out, "\"q8_0\": ") &&
                      strstr(out, "\"q4_1\": "),
                  "%s", out);
    free(buf);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* The ladder over a disk tier: the same chains through a 16 MiB arena above a disk that holds
 * them all. The arena's trim steps the ladder as a put's allocation does (blocks step down
 * instead of every cold block leaving memory), what leaves memory is kept on disk, raw or in
 * the codec it had; every block of every chain is a hit afterwards, each within its codec's
 * bound; blocks did step down the ladder. */
START_TEST(test_ladder_with_disk)
{
    struct daemon d = {0};
    kvc_client *c;
    static struct kvc_key k[QL_CHAINS][QL_LEN];
    int by_codec[KVC_CODEC_KIVI4 + 8] = {0};
    uint64_t steps = 0, disk_blocks = 0, disk_reads = 0, clean_out = 0;
    char path[DAEMON_PATH_MAX + 16], o_path[DAEMON_PATH_MAX + 32];
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    snprintf(path, sizeof(path), "%.190s/disk.kvc", d.dir);
    snprintf(o_path, sizeof(o_path), "disk.path=%s", path);
    const char *const args[] = {"-o", "host.size=16m", "-o", "host.page_size=256k",
                                "-o", o_path,          "-o", "disk.capacity=128m",
                                "-o", "disk.page=4m",  "-o", "disk.admit_hits=0",
                                NULL};
    kvc_ns *ns = ql_open(&d, args, "e2e-ladder-disk", &c);
    size_t bb = kvc_ns_block_bytes(ns);
    uint16_t *buf = malloc(bb * QL_LEN);
    ck_assert_ptr_nonnull(buf);
    ql_rounds(ns, k, buf, bb / 2);
    ck_assert_int_eq(daemon_stat(&d, "ladder_steps", &steps), 0);
    int hits = ql_verify(ns, k, buf, bb, by_codec, true);
    ck_assert_int_eq(daemon_stat(&d, "disk_blocks", &disk_blocks), 0);
    ck_assert_int_eq(daemon_stat(&d, "promoted_blocks", &disk_reads), 0);
    ck_assert_int_eq(daemon_stat(&d, "demoted_clean", &clean_out), 0);
    printf("e2e_quant: ladder over disk: %d hits, raw %d, q8_0 %d, q4_1 %d; %llu ladder steps, "
           "%llu blocks on disk, %llu read back, %llu clean copies out of memory\n",
           hits, by_codec[KVC_CODEC_RAW], by_codec[KVC_CODEC_Q8_0], by_codec[KVC_CODEC_Q4_1],
           (unsigned long long)steps, (unsigned long long)disk_blocks,
           (unsigned long long)disk_reads, (unsigned long long)clean_out);
    /* The disk tier's trim steps the ladder rather than dropping clean copies from memory:
     * steps were 0.34-0.95 of the clean copies dropped in runs here (normal, ASan and TSan
     * builds; 0.56 in a run with no lossy hit left), 0.003-0.05 with the trim's ladder call
     * removed (the put path's steps alone: mutation ladder-not-in-disk-trim). */
    ck_assert_uint_gt(steps * 10, clean_out);
    /* Lossy blocks were made (steps > 0) and every lossy hit is within its bound (ql_verify);
     * how many are still lossy when looked up varies: 0 to 262 of the 640 checked hits in
     * runs of make check (a block written back raw before its step keeps that raw record, and
     * the lookups here read it back once the lossy copy left memory), so no count is asserted.
     * Runs with no lossy hit at all (about 1 in 6) are an open question for the ladder over a
     * disk tier, reported with the precision ladder's issue. */
    ck_assert_uint_gt(disk_blocks, 0);
    ck_assert_uint_gt(disk_reads, 0); /* some hits came back from disk */
    free(buf);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* A lossy hit scattered into a vLLM-style paged engine (host pages, shuffled): the engine
 * holds what kvc_lease_copy decodes, checked by gathering the pages back into a raw
 * namespace of the same layout and comparing the bytes. */
START_TEST(test_scatter_lossy)
{
    enum { LAYERS = 2, HEADS = 2, DIM = 64, TOK = 64, PAGE = 16, NPAGES = TOK / PAGE };
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *nq, *nr;
    struct kvc_layout lq = daemon_layout("e2e-scatter", TOK), lr = daemon_layout("e2e-gather", TOK);
    struct kvc_quant qq = {
        .allowed = 1u << KVC_CODEC_Q8_0, .k_codec = KVC_CODEC_Q8_0, .v_codec = KVC_CODEC_Q8_0};
    static struct kvc_key kq[QE_BLOCKS];
    void *k[LAYERS], *v[LAYERS];
    int32_t table[NPAGES];
    int scattered = 0;
    ck_assert_int_eq(daemon_start(&d, qe_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open_quant(c, &lq, &qq, &nq), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lr, &nr), 0);
    size_t bb = kvc_ns_block_bytes(nq), n = bb / 2;
    ck_assert_uint_eq(bb, (size_t)LAYERS * 2 * TOK * HEADS * DIM * 2);
    uint16_t *buf = malloc(bb), *want = malloc(bb);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ptr_nonnull(want);
    for (int i = 0; i < NPAGES; i++)
        table[i] = (i * 3 + 1) % NPAGES;
    for (int l = 0; l < LAYERS; l++) {
        k[l] = calloc(1, (size_t)TOK * HEADS * DIM * 2);
        v[l] = calloc(1, (size_t)TOK * HEADS * DIM * 2);
        ck_assert(k[l] && v[l]);
    }
    struct kvc_paged_kv kv = {.k = k,
                              .v = v,
                              .block_table = table,
                              .table_len = NPAGES,
                              .page_tokens = PAGE,
                              .page_stride = (uint64_t)PAGE * HEADS * DIM * 2,
                              .token_stride = HEADS * DIM * 2,
                              .head_stride = DIM * 2};
    for (int i = 0; i < QE_BLOCKS * 2; i++) { /* twice the arena: the coldest are quantized */
        const void *blk = buf;
        if (i < QE_BLOCKS)
            ck_assert_int_eq(daemon_chain_keys(nq, (uint32_t)i, 0, 0, 1, &kq[i]), 0);
        struct kvc_key kk;
        ck_assert_int_eq(daemon_chain_keys(nq, (uint32_t)i, 0, 0, 1, &kk), 0);
        daemon_smooth_fill(&kk, buf, n);
        ck_assert_int_ge(kvc_put_prefix(nq, NULL, &kk, 1, &blk), 0);
    }
    for (uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(10000);
         daemon_now_ms() < end && scattered < 4;) {
        for (int i = 0; i < QE_BLOCKS && scattered < 4; i++) {
            kvc_lease *l, *lg;
            kvc_resv *r;
            const void *data;
            size_t len;
            struct kvc_key kg;
            if (kvc_lookup(nq, &kq[i], 1, KVC_LOOKUP_READY_ONLY, &l) != 1)
                continue;
            if (kvc_lease_stored(l, 0, &data, &len) != KVC_CODEC_Q8_0) {
                kvc_release(l);
                continue;
            }
            ck_assert_int_eq(kvc_lease_copy(l, 0, want, bb), 0);
            ck_assert_double_lt(daemon_smooth_err(&kq[i], want, n), 0.02);
            ck_assert_int_eq(kvc_lease_scatter(l, 0, 1, &kv, 0, NULL, NULL), 1);
            ck_assert_int_eq(kvc_release(l), 0);
            /* the pages back into a raw block: the decoded bytes, in place */
            ck_assert_int_eq(daemon_chain_keys(nr, 90000u + (uint32_t)i, 0, 0, 1, &kg), 0);
            /* The arena is full of nq's blocks, whose ladder makes room by quantizing: a
             * reservation waits for those jobs up to disk.put_wait, and on a loaded host the
             * jobs may take longer (1 run in 12 beside three others here): asked again. */
            int got;
            for (uint64_t rend = daemon_now_ms() + (uint64_t)daemon_ms(10000);
                 (got = kvc_reserve(nr, NULL, &kg, 1, &r)) == 0 && daemon_now_ms() < rend;) {
                kvc_abort(r); /* set even at zero slots */
                usleep(10000);
            }
            ck_assert_int_eq(got, 1);
            ck_assert_int_eq(kvc_resv_gather(r, 0, 1, &kv, 0, NULL, NULL), 1);
            ck_assert_int_eq(kvc_commit(r, SIZE_MAX), 1);
            ck_assert_int_eq(kvc_lookup(nr, &kg, 1, 0, &lg), 1);
            ck_assert(memcmp(kvc_lease_data(lg, 0), want, bb) == 0);
            ck_assert_int_eq(kvc_release(lg), 0);
            scattered++;
        }
        if (scattered < 4)
            usleep(20000);
    }
    ck_assert_int_ge(scattered, 1);
    for (int l = 0; l < LAYERS; l++) {
        free(k[l]);
        free(v[l]);
    }
    free(buf);
    free(want);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* The puts that wait for the ladder's quantize jobs, served as the jobs land. The server runs
 * in this process (tests/lib/inproc.h) so that the case decides when the jobs land, and
 * nothing else runs the waiting requests (no tick) until one was answered. An arena full of
 * a ladder namespace's blocks; a client puts RQ_BIG blocks and waits for the jobs its ladder
 * steps queued; then a second client puts a chain as long as the room those steps left free
 * (plus `extra` blocks). The jobs land; the case records which keys the first landing that
 * answers a waiting request answers. */
#define RQ_LEN 4  /* blocks of each filler chain */
#define RQ_BIG 20 /* the long chain: with the small one, within quota.uid_reserved_share (50 %) */
#define RQ_UID 65501u
#define RQ_OTHER_UID 65502u

static struct {
    struct inproc ip;
    struct stats since;
    pid_t pid[2]; /* 65501's client, 65502's: -1 not started, 0 exited */
    int rc[2];
    uint64_t end_ms;   /* the verdict by then, or none */
    bool decided;      /* the first waiting request was answered (or nothing was) */
    bool at_landing;   /* ... by a landing */
    uint64_t keys;     /* the keys answered then (reserve_keys) */
    uint32_t landings; /* landings before the verdict */
    uint32_t uid[2];   /* the clients' uids */
    int len[2];        /* their chains' lengths */
    int extra;         /* the second's blocks past the free room */
} rq;

/* Slots for a 64 KiB block free in arena 0 now: in its class's slabs and free pages. */
static int rq_free_slots(struct store *s)
{
    struct tier *t = s->arenas[0].tier;
    struct slab_stats st;
    slab_stats_get(tier_host_slab(t), &st);
    return (int)(slab_class_free_slots(tier_host_slab(t), tier_host_class(t, 64u << 10)) +
                 st.pages_free);
}

/* The filler (arg: how many chains): RQ_LEN-block chains of a namespace that allows q8_0
 * (a ladder of two rungs: raw, q8_0), as many as the arena holds. */
static int rq_fill(void *arg)
{
    const int chains = *(const int *)arg;
    struct kvc_layout lay = daemon_layout("e2e-rq-fill", 64);
    struct kvc_quant qq = {
        .allowed = 1u << KVC_CODEC_Q8_0, .k_codec = KVC_CODEC_Q8_0, .v_codec = KVC_CODEC_Q8_0};
    struct kvc_key k[RQ_LEN];
    kvc_client *c;
    kvc_ns *ns;
    if (kvc_connect(adv_d.sock, &c) || kvc_ns_open_quant(c, &lay, &qq, &ns))
        return 10;
    size_t bb = kvc_ns_block_bytes(ns), n = bb / 2;
    uint16_t *buf = malloc(bb * RQ_LEN);
    if (!buf)
        return 11;
    for (int ch = 0; ch < chains; ch++) {
        const void *blk[RQ_LEN];
        if (daemon_chain_keys(ns, (uint32_t)ch, 0, 0, RQ_LEN, k))
            return 12;
        for (int i = 0; i < RQ_LEN; i++) {
            daemon_smooth_fill(&k[i], buf + (size_t)i * n, n);
            blk[i] = buf + (size_t)i * n;
        }
        if (kvc_put_prefix(ns, NULL, k, RQ_LEN, blk) != RQ_LEN)
            return 13;
    }
    free(buf);
    kvc_disconnect(c);
    return 0;
}

/* A client (arg: rq.len[i], its chain's length): puts one chain of its own namespace. The
 * second (small) put must get every block and read back their bytes; the long one is
 * answered, with what fitted. */
static int rq_put(void *arg)
{
    const int len = *(const int *)arg;
    const bool small = arg == &rq.len[1];
    struct kvc_layout lay = daemon_layout(small ? "e2e-rq-small" : "e2e-rq-big", 64);
    struct kvc_key k[RQ_BIG];
    void *blk[RQ_BIG];
    kvc_client *c;
    kvc_ns *ns;
    int rc = 0, got;
    if (len < 1 || len > RQ_BIG || kvc_connect(adv_d.sock, &c) || kvc_ns_open(c, &lay, &ns) ||
        daemon_chain_keys(ns, (uint32_t)getuid(), 0, 0, (uint32_t)len, k))
        return 20;
    size_t bb = kvc_ns_block_bytes(ns);
    for (int i = 0; i < len; i++) {
        blk[i] = malloc(bb);
        if (!blk[i])
            return 21;
        daemon_block_fill(&k[i], blk[i], bb);
    }
    got = kvc_put_prefix(ns, NULL, k, (size_t)len, (const void *const *)blk);
    if (got < 0 || (small && got != len))
        rc = 22;
    for (int i = 0; i < len; i++)
        memset(blk[i], 0, bb);
    if (rc == 0 && small && kvc_get_prefix(ns, k, (size_t)len, blk) != len)
        rc = 23;
    for (int i = 0; i < len && rc == 0 && small; i++)
        if (daemon_block_check(&k[i], blk[i], bb) != -1)
            rc = 24;
    for (int i = 0; i < len; i++)
        free(blk[i]);
    kvc_disconnect(c);
    return rc;
}

static void rq_tick(void *arg)
{
    struct inproc *x = &rq.ip;
    const struct stats *t = &x->s->total;
    const uint64_t waits = t->put_waits - rq.since.put_waits;
    int st, running = 0;
    (void)arg;
    for (int i = 0; i < 2; i++) {
        if (rq.pid[i] > 0 && waitpid(rq.pid[i], &st, WNOHANG) == rq.pid[i]) {
            rq.rc[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            rq.pid[i] = 0;
        }
        /* The small put comes once the long one waits, as long as the room its ladder steps
         * left free (the blocks they took out of the arena; the jobs' copies are placed
         * when they land) and `extra` blocks. */
        if (rq.pid[i] < 0 && waits >= (uint64_t)i) {
            if (i == 1)
                rq.len[1] = rq_free_slots(x->s) + rq.extra;
            rq.pid[i] = adv_spawn(rq.uid[i], rq_put, &rq.len[i]);
        }
        running += rq.pid[i] != 0;
    }
    if (!rq.decided) {
        if (waits >= 2 && quant_inflight(x->s->quant)) {
            /* Both wait: the jobs done so far land (server_on_room runs the waiting
             * requests), and nothing else runs them. */
            const uint64_t keys0 = t->reserve_keys, reserves0 = t->reserves;
            if (quant_poll(x->s->quant) > 0) {
                rq.landings++;
                if (t->reserves != reserves0) {
                    rq.decided = rq.at_landing = true;
                    rq.keys = t->reserve_keys - keys0;
                }
            }
            return;
        }
        if (waits < 2 && rq.pid[0] != 0 && rq.pid[1] != 0 && daemon_now_ms() < rq.end_ms)
            return; /* the small put does not wait yet */
        /* No job in flight with both waiting, a client gone, or out of time: the tick
         * answers them from now on, and the verdict is that no landing did. */
        rq.decided = true;
    }
    quant_poll(x->s->quant);
    server_tick(x->sv);
    if (!running && server_clients(x->sv) == 0 && !quant_inflight(x->s->quant))
        loop_stop(x->l);
}

/* Fills the arena, then runs the two clients (uids uid0, uid1; the second's chain `extra`
 * blocks past the free room) to the end, the verdict in rq. */
static void rq_run(uint32_t uid0, uint32_t uid1, int extra)
{
    struct store_params sp = {.host_size = 4 << 20,
                              .host_page_size = 64 << 10,
                              .high_watermark = 1.0,
                              .low_watermark = 0.99,
                              .max_namespaces = 8,
                              .max_handles = 64,
                              .policy = POLICY_DEFAULT,
                              .quantize_inflight = 8,
                              .quantize_threads = 1};
    struct config *cfg = config_new();
    int rc = 0, chains;
    memset(&rq, 0, sizeof(rq));
    log_setup(LOG_LEVEL_WARNING, 1000);
    adv_dir_open(); /* adv_d: the directory and the socket's path, reachable by every uid */
    ck_assert_ptr_nonnull(cfg);
    cfg->disk_put_wait = (uint64_t)daemon_ms(2000);
    inproc_start(&rq.ip, cfg, &sp, adv_d.sock, 0666, 16);
    ck_assert_ptr_nonnull(quant_new(NULL, rq.ip.s, &rc)); /* its landings: quant_poll here */
    const struct tier *tier = rq.ip.s->arenas[0].tier;
    chains = (int)(tier->ops->capacity(tier) / ((64u << 10) * RQ_LEN));
    ck_assert_int_eq(inproc_run(&rq.ip, daemon_child_spawn(rq_fill, &chains)), 0);
    ck_assert_uint_eq(quant_inflight(rq.ip.s->quant), 0);
    ck_assert_uint_eq(tier->ops->usage(tier), tier->ops->capacity(tier)); /* full */

    rq.since = rq.ip.s->total;
    rq.pid[0] = rq.pid[1] = -1;
    rq.rc[0] = rq.rc[1] = -1;
    rq.end_ms = daemon_now_ms() + (uint64_t)daemon_ms(20000);
    rq.uid[0] = uid0;
    rq.uid[1] = uid1;
    rq.len[0] = RQ_BIG;
    rq.extra = extra;
    loop_run(rq.ip.l, 20, rq_tick, NULL);
    const struct stats *t = &rq.ip.s->total;
    printf("e2e_quant: landing (uids %u, %u): %d and %d blocks; %u landings, the first answer "
           "%s with %llu keys; put waits %llu (queued %llu), timed out %llu, ladder steps "
           "%llu\n",
           uid0, uid1, rq.len[0], rq.len[1], rq.landings,
           rq.at_landing ? "at a landing" : "not at a landing", (unsigned long long)rq.keys,
           (unsigned long long)(t->put_waits - rq.since.put_waits),
           (unsigned long long)(t->put_waits_queued - rq.since.put_waits_queued),
           (unsigned long long)(t->put_wait_timeouts - rq.since.put_wait_timeouts),
           (unsigned long long)(t->ladder_steps - rq.since.ladder_steps));
    ck_assert_int_eq(rq.rc[0], 0);
    ck_assert_int_eq(rq.rc[1], 0);
    ck_assert_int_lt(rq.len[1], RQ_BIG / 2);
}

static void rq_stop(void)
{
    inproc_stop(&rq.ip);
    daemon_cleanup(&adv_d);
}

/* Another uid's put that a landing made room for is served at that landing while the long
 * put still waits (server_on_room holds each uid's requests behind its own first that still
 * does not fit): its keys alone are the first answered, at a landing. With every uid's
 * requests held behind the first that waits on, it waits until the long put is answered, or
 * for the tick. */
START_TEST(test_landing_serves_other_uid)
{
    rq_run(RQ_UID, RQ_OTHER_UID, 1); /* one block past the free room: it waits too */
    const struct stats *t = &rq.ip.s->total;
    ck_assert_uint_ge(t->put_waits - rq.since.put_waits, 2);               /* both waited */
    ck_assert_uint_eq(t->put_waits_queued - rq.since.put_waits_queued, 0); /* on its own */
    ck_assert_msg(rq.at_landing && rq.keys == (uint64_t)rq.len[1],
                  "the small put of another uid (%d blocks) was not served at a landing while "
                  "the long one (%d) waited (first answer %s, %llu keys)",
                  rq.len[1], RQ_BIG, rq.at_landing ? "at a landing" : "not at a landing",
                  (unsigned long long)rq.keys);
    rq_stop();
}
END_TEST

/* A new put of the same uid goes behind the one that waits (server_reserve_behind), even
 * though the room free now would hold it: the long put is answered first, at a landing, and
 * the new one after it, every block. Before, the new put took the free room at once and was
 * answered while the older one waited on. Another uid's put is never queued (above). */
START_TEST(test_put_behind_own_uid)
{
    rq_run(RQ_UID, RQ_UID, 0); /* as long as the free room: it would fit now */
    const struct stats *t = &rq.ip.s->total;
    ck_assert_uint_eq(t->put_waits_queued - rq.since.put_waits_queued, 1);
    ck_assert_msg(rq.at_landing && rq.keys >= RQ_BIG,
                  "the new put (%d blocks) was answered before the one of its uid that waited "
                  "(%d): first answer %s, %llu keys",
                  rq.len[1], RQ_BIG, rq.at_landing ? "at a landing" : "not at a landing",
                  (unsigned long long)rq.keys);
    rq_stop();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_quant");
    TCase *tc = tcase_create("quant");
    tcase_set_timeout(tc, daemon_slow() * 120);
    tcase_add_test(tc, test_quant_under_pressure);
    tcase_add_test(tc, test_lru_quant_whole_slabs);
    tcase_add_test(tc, test_ladder_end_to_end);
    tcase_add_test(tc, test_ladder_with_disk);
    tcase_add_test(tc, test_scatter_lossy);
    suite_add_tcase(s, tc);
    if (geteuid() == 0) {
        TCase *tl = tcase_create("landing");
        tcase_set_timeout(tl, daemon_slow() * 60);
        tcase_add_test(tl, test_landing_serves_other_uid);
        tcase_add_test(tl, test_put_behind_own_uid);
        suite_add_tcase(s, tl);
    } else {
        printf("SKIP: e2e_quant: test_landing_serves_other_uid, test_put_behind_own_uid: not "
               "root (clients of other uids)\n");
    }
    if (daemon_suite_init("e2e-quant"))
        return 1;
    return daemon_suite_run(s);
}
