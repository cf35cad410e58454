/*
 * check_e2e_kinds.c — namespaces of every kind of layer of a hybrid model (kv, k_only,
 * kv_window, state) against the real kvcd through libkvc: a sliding-window lookup returns
 * exactly the window's blocks of the longest prefix whose window is cached; a state lookup
 * returns the state of the longest prefix that has one, never a state taken at another
 * boundary; chains whose parent is gone are roots there; get_prefix places a span's blocks;
 * every kind round-trips through the host and disk tiers and a restart byte for byte, the
 * kind and window coming back with the namespace from its disk records; a state namespace
 * takes no codec and no paged scatter; and the adversary's cases: the kind and the window
 * are part of the layout (another under the same model id is EEXIST, before and after a
 * restart), and a state stored in one namespace is never served from another.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/kvc.h"
#include "tests/lib/daemon.h"
#include "tests/lib/kinds.h"

#define BT 4   /* tokens per block */
#define WIN 10 /* window tokens: 3 blocks */

static struct daemon d;

static const char *host_args[] = {"-o", "host.size=32m",      "-o", "host.prefault=no",
                                  "-o", "host.hugepages=off", NULL};

static void setup(void)
{
    memset(&d, 0, sizeof(d));
}

static void teardown(void)
{
    daemon_cleanup(&d);
}

static struct kvc_layout lay(const char *model, enum kvc_kv_kind kind, uint32_t heads, uint32_t dim)
{
    return (struct kvc_layout){.model_id = model,
                               .layers = 2,
                               .kv_heads = heads,
                               .head_dim = dim,
                               .block_tokens = BT,
                               .dtype = KVC_DTYPE_FP16,
                               .kv_kind = kind};
}

static kvc_ns *open_kind(kvc_client *c, const char *model, enum kvc_kv_kind kind)
{
    return kinds_open(c, lay(model, kind, 2, 64), kind, WIN);
}

static void keys_of(struct kvc_key *k, uint32_t n, uint64_t salt)
{
    for (uint32_t i = 0; i < n; i++)
        k[i] = (struct kvc_key){.lo = salt * 1000 + i + 1, .hi = 0x6b696e6473ull ^ salt};
}

START_TEST(test_window_lookup_is_exactly_the_window)
{
    kvc_client *c = NULL;
    struct kvc_key k[12];
    ck_assert_int_eq(daemon_start(&d, host_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    kvc_ns *ns = open_kind(c, "kinds/swa", KVC_KV_KIND_KV_WINDOW);
    ck_assert_int_eq(kvc_ns_kind(ns), KVC_KV_KIND_KV_WINDOW);
    ck_assert_uint_eq(kvc_ns_window_tokens(ns), WIN);
    keys_of(k, 12, 1);
    /* Blocks 0..1 and 4..11 cached; 2 and 3 never were (or went). */
    int idx[] = {0, 1, 4, 5, 6, 7, 8, 9, 10, 11};
    kinds_put_roots(ns, k, idx, 10);
    ck_assert_int_eq(kvc_flush(c), 0);
    /* The window is 3 blocks: a prefix e needs blocks [e-3, e) (all of them when shorter). */
    kinds_expect(ns, k, 1, 0, 1);
    kinds_expect(ns, k, 2, 0, 2);
    kinds_expect(ns, k, 3, 0, 2);  /* e = 3 needs block 2: the longest is e = 2 */
    kinds_expect(ns, k, 6, 0, 2);  /* e = 4..6 need block 2 or 3 */
    kinds_expect(ns, k, 7, 4, 3);  /* e = 7: blocks 4..6, the blocks before gone */
    kinds_expect(ns, k, 12, 9, 3); /* the longest prefix: its window only */
    /* get_prefix puts a span's blocks where they go and answers the prefix's length. */
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *bufs = calloc(12, bb);
    void *dst[12];
    for (int i = 0; i < 12; i++)
        dst[i] = bufs + (size_t)i * bb;
    ck_assert_int_eq(kvc_get_prefix(ns, k, 12, dst), 12);
    for (int i = 9; i < 12; i++)
        ck_assert(daemon_block_check(&k[i], dst[i], bb) < 0);
    for (size_t i = 0; i < 9 * bb; i++)
        ck_assert_msg(bufs[i] == 0, "get_prefix wrote outside the window");
    free(bufs);
    /* A chain put after a block that is gone is a root (the window's older blocks may be
     * gone), not refused as an orphan. */
    struct kvc_key more[2];
    keys_of(more, 2, 2);
    uint8_t *b2 = malloc(2 * bb);
    daemon_block_fill(&more[0], b2, bb);
    daemon_block_fill(&more[1], b2 + bb, bb);
    const void *ps[2] = {b2, b2 + bb};
    ck_assert_int_eq(kvc_put_prefix(ns, &k[2], more, 2, ps), 2);
    free(b2);
    kvc_disconnect(c);
}
END_TEST

/* Longer prompts than one request: libkvc searches from the end, a window's requests
 * overlapping by the window (base: where each starts), so a window straddling two requests,
 * one far back, the short prompt's window at the start and a state far back are found as a
 * lookup of fewer keys finds them. */
START_TEST(test_long_prompts_searched_from_the_end)
{
    enum { N = 5000 };
    kvc_client *c = NULL;
    struct kvc_key *k = calloc(N, sizeof(*k));
    ck_assert_int_eq(daemon_start(&d, host_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    kvc_ns *w = open_kind(c, "kinds/long-swa", KVC_KV_KIND_KV_WINDOW);
    kvc_ns *st = open_kind(c, "kinds/long-state", KVC_KV_KIND_STATE);
    keys_of(k, N, 9);
    kinds_put_roots(w, k, (const int[]){0, 1}, 2);
    kinds_put_roots(st, k, (const int[]){1000}, 1);
    ck_assert_int_eq(kvc_flush(c), 0);
    kinds_expect(w, k, N, 0, 2);     /* down to the first request: the prefix 2 */
    kinds_expect(st, k, N, 1000, 1); /* the third request from the end */
    /* Blocks 2951..2953: the first request (keys 2952..4999) holds two of them only. */
    kinds_put_roots(w, k, (const int[]){2951, 2952, 2953}, 3);
    ck_assert_int_eq(kvc_flush(c), 0);
    kinds_expect(w, k, N, 2951, 3);
    /* And one in the last request, past the others. */
    kinds_put_roots(w, k, (const int[]){4990, 4991, 4992}, 3);
    ck_assert_int_eq(kvc_flush(c), 0);
    kinds_expect(w, k, N, 4990, 3);
    kinds_expect(w, k, 4992, 2951, 3); /* prefix 4992 needs 4989: the one before */
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    free(k);
}
END_TEST

START_TEST(test_state_lookup_never_crosses_a_boundary)
{
    kvc_client *c = NULL;
    struct kvc_key k[10];
    ck_assert_int_eq(daemon_start(&d, host_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    kvc_ns *ns = open_kind(c, "kinds/mamba", KVC_KV_KIND_STATE);
    /* One state per layer: 2 layers x 2 x 64 fp16, no token dimension. */
    ck_assert_uint_eq(kvc_ns_block_bytes(ns), 2 * 2 * 64 * 2);
    keys_of(k, 10, 3);
    int idx[] = {3, 7}; /* states taken at the end of blocks 3 and 7 */
    kinds_put_roots(ns, k, idx, 2);
    ck_assert_int_eq(kvc_flush(c), 0);
    for (uint32_t n = 1; n <= 10; n++) {
        int want = n >= 8 ? 7 : n >= 4 ? 3 : -1;
        if (want < 0)
            kinds_expect(ns, k, n, 0, 0);
        else
            kinds_expect(ns, k, n, (size_t)want, 1);
    }
    /* Another prompt sharing no key: no state, whatever its length. */
    struct kvc_key other[10];
    keys_of(other, 10, 4);
    kinds_expect(ns, other, 10, 0, 0);
    /* get_prefix: the state lands in dst[e-1], the answer is e. */
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *bufs = calloc(10, bb);
    void *dst[10];
    for (int i = 0; i < 10; i++)
        dst[i] = bufs + (size_t)i * bb;
    ck_assert_int_eq(kvc_get_prefix(ns, k, 6, dst), 4);
    ck_assert(daemon_block_check(&k[3], dst[3], bb) < 0);
    free(bufs);
    /* No codec for states, and no paged scatter (a state has no tokens). */
    struct kvc_layout sl = lay("kinds/mamba-q", KVC_KV_KIND_STATE, 2, 64);
    struct kvc_quant q = {.allowed = 1u << KVC_CODEC_Q8_0, .k_codec = KVC_CODEC_Q8_0};
    kvc_ns *qns = NULL;
    ck_assert_int_eq(kvc_ns_open_quant(c, &sl, &q, &qns), -EINVAL);
    kvc_lease *l = NULL;
    ck_assert_int_eq(kvc_lookup(ns, k, 10, 0, &l), 1);
    uint8_t page[2 * BT * 2 * 64 * 2];
    void *kk[2] = {page, page}, *vv[2] = {page, page};
    int32_t table[1] = {0};
    struct kvc_paged_kv kv = {.k = kk,
                              .v = vv,
                              .block_table = table,
                              .table_len = 1,
                              .page_tokens = BT,
                              .page_stride = sizeof(page),
                              .token_stride = 2 * 64 * 2,
                              .head_stride = 64 * 2};
    ck_assert_int_eq(kvc_lease_scatter(l, 0, 1, &kv, 0, NULL, NULL), -EINVAL);
    kvc_release(l);
    kvc_disconnect(c);
}
END_TEST

/* Under memory pressure the blocks behind a window go before the window itself: a window
 * lookup touches its window only, and window blocks are leaves (a chain would keep every
 * block of the prompt as the parent of the next). */
START_TEST(test_blocks_behind_the_window_go_first)
{
    const char *args[] = {"-o", "host.size=16m", "-o", "host.prefault=no", "-o",
                          "host.hugepages=off", "-o", "host.high_watermark=0.6", "-o",
                          "host.low_watermark=0.4", "-o", "cache.policy=lru", NULL};
    kvc_client *c = NULL;
    struct kvc_key wk[20], kk[64];
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    struct kvc_layout l = lay("kinds/press-swa", KVC_KV_KIND_KV_WINDOW, 8, 128);
    l.layers = 8;
    l.block_tokens = 8; /* 256 KiB blocks */
    kvc_ns *w = NULL, *kv = NULL;
    ck_assert_int_eq(kvc_ns_open_window(c, &l, 16, &w), 0); /* a 2-block window */
    l = lay("kinds/press-kv", KVC_KV_KIND_KV, 8, 128);
    l.layers = 8;
    l.block_tokens = 8;
    ck_assert_int_eq(kvc_ns_open(c, &l, &kv), 0);
    size_t bb = kvc_ns_block_bytes(w);
    uint8_t *buf = malloc(20 * bb);
    const void *p[20];
    keys_of(wk, 20, 7);
    for (int i = 0; i < 20; i++) {
        daemon_block_fill(&wk[i], buf + (size_t)i * bb, bb);
        p[i] = buf + (size_t)i * bb;
    }
    ck_assert_int_eq(kvc_put_prefix(w, NULL, wk, 20, p), 20); /* one chain, as an engine does */
    ck_assert_int_eq(kvc_flush(c), 0);
    /* Recorded as leaves too (what the disk records and a restart take back). */
    static char out[65536], err[1024], nsid[16];
    snprintf(nsid, sizeof(nsid), "%u", kvc_ns_id(w));
    ck_assert_int_eq(
        daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "--json", "ls", "--ns", nsid, NULL),
        0);
    ck_assert_ptr_nonnull(strstr(out, "\"parent\": \"00000000000000000000000000000000\""));
    ck_assert_msg(strstr(out, "\"depth\": 1,") == NULL && strstr(out, "\"children\": 1,") == NULL,
                  "window blocks chained: %s", out);
    for (int i = 1; i < 20; i++) {
        char par[64];
        snprintf(par, sizeof(par), "\"parent\": \"%016llx%016llx\"",
                 (unsigned long long)wk[i - 1].hi, (unsigned long long)wk[i - 1].lo);
        ck_assert_msg(strstr(out, par) == NULL, "block %d hangs from block %d", i, i - 1);
    }
    keys_of(kk, 64, 8);
    for (int j = 0; j < 64; j += 4) { /* 16 MiB of other prompts while this one is in use */
        for (int i = 0; i < 4; i++)
            daemon_block_fill(&kk[j + i], buf + (size_t)i * bb, bb);
        ck_assert_int_eq(kvc_put_prefix(kv, NULL, &kk[j], 4, p), 4);
        ck_assert_int_eq(kvc_flush(c), 0);
        kinds_expect(w, wk, 20, 18, 2);
    }
    uint64_t evicted = 0;
    ck_assert_int_eq(daemon_client_stat(c, 0, "evicted_blocks", &evicted), 0);
    ck_assert_msg(evicted >= 18, "only %llu evictions", (unsigned long long)evicted);
    /* The blocks behind the window went (they were never looked at again). */
    kvc_lease *lease = NULL;
    ck_assert_int_eq(kvc_lookup(w, wk, 2, 0, &lease), 0);
    free(buf);
    kvc_disconnect(c);
}
END_TEST

/* The kind, the window and the shape are the layout: under one model id there is one. */
START_TEST(test_kind_and_window_are_the_layout)
{
    kvc_client *c = NULL;
    kvc_ns *ns = NULL;
    struct kvc_key k[4];
    ck_assert_int_eq(daemon_start(&d, host_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    kvc_ns *st = open_kind(c, "kinds/adv", KVC_KV_KIND_STATE);
    keys_of(k, 4, 5);
    int idx[] = {1};
    kinds_put_roots(st, k, idx, 1);
    ck_assert_int_eq(kvc_flush(c), 0);
    struct kvc_layout l = lay("kinds/adv", KVC_KV_KIND_KV, 2, 64);
    ck_assert_int_eq(kvc_ns_open(c, &l, &ns), -EEXIST);
    l.kv_kind = KVC_KV_KIND_K_ONLY;
    ck_assert_int_eq(kvc_ns_open(c, &l, &ns), -EEXIST);
    l = lay("kinds/adv", KVC_KV_KIND_STATE, 1, 128); /* the same bytes, another shape */
    ck_assert_int_eq(kvc_ns_open(c, &l, &ns), -EEXIST);
    l = lay("kinds/adv-w", KVC_KV_KIND_KV_WINDOW, 2, 64);
    ck_assert_int_eq(kvc_ns_open(c, &l, &ns), -EINVAL); /* a window needs its size */
    ck_assert_int_eq(kvc_ns_open_window(c, &l, 0, &ns), -EINVAL);
    ck_assert_int_eq(kvc_ns_open_window(c, &l, WIN, &ns), 0);
    ck_assert_int_eq(kvc_ns_open_window(c, &l, WIN + 4, &ns), -EEXIST);
    /* A state of another layout under the same keys: none of its bytes is served. */
    kvc_ns *st2 = NULL;
    l = lay("kinds/adv-other", KVC_KV_KIND_STATE, 1, 128);
    ck_assert_int_eq(kvc_ns_open(c, &l, &st2), 0);
    ck_assert_uint_eq(kvc_ns_block_bytes(st2), kvc_ns_block_bytes(st));
    kinds_expect(st2, k, 4, 0, 0);
    kvc_ns *kvns = open_kind(c, "kinds/adv-kv", KVC_KV_KIND_KV);
    kinds_expect(kvns, k, 4, 0, 0);
    kinds_expect(st, k, 4, 1, 1);
    /* A layout a client makes up on the wire is refused by the daemon too (the library
     * checks first): an unknown kind, a window on a kind that has none. */
    l = lay("kinds/adv-bad", (enum kvc_kv_kind)5, 2, 64);
    ck_assert_int_eq(kvc_ns_open(c, &l, &ns), -EINVAL);
    kvc_disconnect(c);
}
END_TEST

/* kvcctl shows the kinds: ns (with the window), ls and show. */
START_TEST(test_kvcctl_shows_kinds)
{
    kvc_client *c = NULL;
    struct kvc_key k[2];
    static char out[16384], err[4096];
    ck_assert_int_eq(daemon_start(&d, host_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    kvc_ns *w = open_kind(c, "kinds/ctl-swa", KVC_KV_KIND_KV_WINDOW);
    kvc_ns *s = open_kind(c, "kinds/ctl-state", KVC_KV_KIND_STATE);
    keys_of(k, 2, 6);
    int idx[] = {0};
    kinds_put_roots(w, k, idx, 1);
    int idx2[] = {1};
    kinds_put_roots(s, k, idx2, 1);
    ck_assert_int_eq(kvc_flush(c), 0);
    ck_assert_int_eq(daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "--json", "ns", NULL),
                     0);
    ck_assert_msg(daemon_json_valid(out), "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "\"kv_kind\": \"kv_window\", \"window_tokens\": 10"));
    ck_assert_ptr_nonnull(strstr(out, "\"kv_kind\": \"state\", \"window_tokens\": 0"));
    ck_assert_int_eq(daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "ns", NULL), 0);
    ck_assert_ptr_nonnull(strstr(out, "kv_window:10"));
    ck_assert_int_eq(daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "--json", "ls", NULL),
                     0);
    ck_assert_msg(daemon_json_valid(out), "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "\"kind\": \"kv_window\""));
    ck_assert_ptr_nonnull(strstr(out, "\"kind\": \"state\""));
    char key[33];
    snprintf(key, sizeof(key), "%016llx%016llx", (unsigned long long)k[1].hi,
             (unsigned long long)k[1].lo);
    ck_assert_int_eq(daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "show", key, NULL), 0);
    ck_assert_ptr_nonnull(strstr(out, "kinds/ctl-state, state"));
    kvc_disconnect(c);
}
END_TEST

/* Every kind through the disk tier and a restart: blocks pushed out of a small arena come
 * back from disk byte for byte, and after SIGTERM the namespaces come back from the
 * records with their kind and window (another window is EEXIST; the same layout opens and
 * finds its blocks, with its kind's lookup). */
#define NB 96
static const enum kvc_kv_kind kinds[] = {KVC_KV_KIND_KV, KVC_KV_KIND_K_ONLY, KVC_KV_KIND_KV_WINDOW,
                                         KVC_KV_KIND_STATE};
static const char *const kind_models[] = {"kinds/disk-kv", "kinds/disk-k", "kinds/disk-swa",
                                          "kinds/disk-state"};

static kvc_ns *open_big(kvc_client *c, int i)
{
    struct kvc_layout l = lay(kind_models[i], kinds[i], 8, 128);
    l.layers = 8; /* 256 KiB blocks of KV (128 KiB K-only, 16 KiB a state) */
    kvc_ns *ns = NULL;
    int rc = kinds[i] == KVC_KV_KIND_KV_WINDOW ? kvc_ns_open_window(c, &l, 2 * BT, &ns)
                                               : kvc_ns_open(c, &l, &ns);
    ck_assert_msg(rc == 0, "%s: %s", kind_models[i], kvc_strerror(rc));
    return ns;
}

static int found_all(kvc_ns *ns, const struct kvc_key *k, int i, bool *found)
{
    int got = 0;
    size_t bb = kvc_ns_block_bytes(ns);
    for (int j = 0; j < NB; j++) {
        kvc_lease *l = NULL;
        /* One key at a time: each kind's own lookup answers a one-block prefix with it. */
        int h = kvc_lookup(ns, &k[j], 1, 0, &l);
        ck_assert_int_ge(h, 0);
        if (h) {
            ck_assert_msg(daemon_block_check(&k[j], kvc_lease_data(l, 0), bb) < 0,
                          "%s block %d: wrong bytes", kind_models[i], j);
            got++;
            kvc_release(l);
        }
        found[j] = h > 0;
    }
    return got;
}

START_TEST(test_every_kind_through_disk_and_restart)
{
    char dpath[DAEMON_PATH_MAX + 16], o_path[DAEMON_PATH_MAX + 32];
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    snprintf(dpath, sizeof(dpath), "%s/disk.kvc", d.dir);
    snprintf(o_path, sizeof(o_path), "disk.path=%s", dpath);
    const char *args[] = {"-o", "host.size=16m",
                          "-o", "host.page_size=256k",
                          "-o", "host.prefault=no",
                          "-o", "host.hugepages=off",
                          "-o", o_path,
                          "-o", "disk.capacity=256m",
                          "-o", "disk.page=1m",
                          "-o", "disk.write_rate=0",
                          "-o", "cache.policy=lru",
                          "-o", "host.high_watermark=0.6",
                          "-o", "host.low_watermark=0.4",
                          NULL};
    kvc_client *c = NULL;
    struct kvc_key k[4][NB];
    bool found[4][NB];
    static const int order[] = {3, 1, 2, 0}; /* the oldest go to disk first */
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    for (int o = 0; o < 4; o++) {
        int i = order[o];
        kvc_ns *ns = open_big(c, i);
        size_t bb = kvc_ns_block_bytes(ns);
        uint8_t *buf = malloc(bb);
        keys_of(k[i], NB, 100 + (uint64_t)i);
        for (int j = 0; j < NB; j++) {
            const void *p = buf;
            daemon_block_fill(&k[i][j], buf, bb);
            /* 0 when no room came in time (the disk behind on a loaded host): a miss later */
            ck_assert_int_ge(kvc_put_prefix(ns, NULL, &k[i][j], 1, &p), 0);
            ck_assert_int_eq(kvc_flush(c), 0);
        }
        free(buf);
    }
    /* Each kind's blocks, some in memory, some back from disk: every byte right. */
    for (int i = 0; i < 4; i++) {
        kvc_ns *ns = open_big(c, i);
        ck_assert_int_gt(found_all(ns, k[i], i, found[i]), 0);
    }
    uint64_t demoted = 0;
    ck_assert_int_eq(daemon_client_stat(c, 0, "demoted_blocks", &demoted), 0);
    ck_assert_msg(demoted > 0, "nothing went to disk");
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    /* The namespaces came back from the records with their kind and window. */
    struct kvc_ns_info *info = NULL;
    size_t nns = 0;
    ck_assert_int_eq(kvc_ns_list(c, &info, &nns), 0);
    int seen = 0;
    for (size_t j = 0; j < nns; j++)
        for (int i = 0; i < 4; i++)
            if (strcmp(info[j].model_id, kind_models[i]) == 0) {
                uint32_t w = 99;
                ck_assert_int_eq(info[j].kv_kind, kinds[i]);
                ck_assert_int_eq(kvc_ns_window(c, info[j].ns_id, &w), 0);
                ck_assert_uint_eq(w, kinds[i] == KVC_KV_KIND_KV_WINDOW ? 2 * BT : 0);
                seen++;
            }
    free(info);
    ck_assert_int_eq(seen, 4);
    struct kvc_layout wl = lay(kind_models[2], KVC_KV_KIND_KV_WINDOW, 8, 128);
    wl.layers = 8;
    kvc_ns *bad = NULL;
    ck_assert_int_eq(kvc_ns_open_window(c, &wl, 3 * BT, &bad), -EEXIST);
    for (int i = 0; i < 4; i++) {
        kvc_ns *ns = open_big(c, i);
        ck_assert_msg(found_all(ns, k[i], i, found[i]) > 0, "%s: nothing after the restart",
                      kind_models[i]);
    }
    /* The window's lookup after the restart: for the last pair of blocks that came back, the
     * prefix ending there has exactly that 2-block window. */
    int j = NB - 1;
    while (j > 0 && !(found[2][j] && found[2][j - 1]))
        j--;
    ck_assert_msg(j > 0, "no two consecutive window blocks came back");
    kvc_ns *w = open_big(c, 2);
    kvc_lease *l = NULL;
    ck_assert_int_eq(kvc_lookup(w, k[2], (size_t)j + 1, 0, &l), 2);
    ck_assert_uint_eq(kvc_lease_first(l), (size_t)j - 1);
    kvc_release(l);
    kvc_disconnect(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_kinds");
    TCase *tc = tcase_create("kinds");
    if (daemon_suite_init("e2e_kinds"))
        return 1;
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, daemon_slow() * 60);
    tcase_add_test(tc, test_window_lookup_is_exactly_the_window);
    tcase_add_test(tc, test_state_lookup_never_crosses_a_boundary);
    tcase_add_test(tc, test_long_prompts_searched_from_the_end);
    tcase_add_test(tc, test_kind_and_window_are_the_layout);
    tcase_add_test(tc, test_kvcctl_shows_kinds);
    tcase_add_test(tc, test_blocks_behind_the_window_go_first);
    tcase_add_test(tc, test_every_kind_through_disk_and_restart);
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
