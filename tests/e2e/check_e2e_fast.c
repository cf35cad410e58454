/*
 * check_e2e_fast — the fast path (client/kvc_fast.h) against a real kvcd: copies through the
 * shared index with no round trip, counted by the daemon as hits; readers hammering hot
 * blocks while another process forces eviction and slot reuse never get another block's
 * bytes; a stopped or killed reader never holds the daemon; a client that writes lies into
 * its hit ring is refused entry by entry; the index cannot be written by a client; a
 * namespace id dropped and reused for another layout is not read through a stale index;
 * an arena full of 4 KiB blocks has every block in the index, which grew when the namespace
 * of small blocks came (its readers moving to the larger one); and with the fast path off
 * (daemon option or KVC_NO_FASTPATH) everything still works.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client/kvc_fast.h"
#include "client/libkvc_internal.h"
#include "tests/lib/daemon.h"

#define FP_BLOCKS 16

static const char *const fp_args[] = {"-o", "host.size=16m", "-o", "host.page_size=64k", "-o",
                                      "cache.policy=lru", NULL};

/* Puts a chain of n blocks of family f; keys to k. */
static void fp_put(kvc_ns *ns, uint32_t f, uint32_t n, struct kvc_key *k)
{
    size_t bb = kvc_ns_block_bytes(ns);
    const void *blk[FP_BLOCKS * 4];
    ck_assert_uint_le(n, FP_BLOCKS * 4);
    ck_assert_int_eq(daemon_chain_keys(ns, f, 0, n, n, k), 0);
    for (uint32_t i = 0; i < n; i++) {
        void *b = malloc(bb);
        daemon_block_fill(&k[i], b, bb);
        blk[i] = b;
    }
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, k, n, blk), (int)n);
    for (uint32_t i = 0; i < n; i++)
        free((void *)blk[i]);
}

/* get_prefix of k[0..n) into fresh buffers, every byte checked; the hits. */
static int fp_get_check(kvc_ns *ns, const struct kvc_key *k, uint32_t n)
{
    size_t bb = kvc_ns_block_bytes(ns);
    void *dst[FP_BLOCKS * 4];
    for (uint32_t i = 0; i < n; i++)
        dst[i] = calloc(1, bb);
    int h = kvc_get_prefix(ns, k, n, dst);
    for (int i = 0; i < h; i++)
        ck_assert_int_eq(daemon_block_check(&k[i], dst[i], bb), -1);
    for (uint32_t i = 0; i < n; i++)
        free(dst[i]);
    return h;
}

/* Fills the rest of w's arena with newer chains of 64 KiB blocks from family `first` on
 * (keys to fill), as far as its free room goes. */
static void fp_fill_arena(kvc_client *w, kvc_ns *wns, uint32_t first, struct kvc_key *fill)
{
    uint64_t room = 0, used = 0;
    ck_assert_int_eq(daemon_client_stat(w, 0, "host_capacity", &room), 0);
    for (uint32_t f = 0;; f++) {
        ck_assert_int_eq(daemon_client_stat(w, 0, "host_used", &used), 0);
        uint64_t left = (room - used) / (64u << 10);
        if (!left)
            break;
        fp_put(wns, first + f, left < 64 ? (uint32_t)left : 64, fill);
        ck_assert_int_eq(kvc_flush(w), 0);
    }
}

/* Fills the rest of w's arena (family `first` on, evicting nothing), then reads hot[0..4)
 * through ns's fast path and at once puts 4 new blocks (family `first` + 100) that must evict
 * 4: the blocks just read must stay (their hits read before the eviction chose). */
static void fp_read_then_evict(kvc_client *w, kvc_ns *wns, kvc_ns *ns, uint32_t first,
                               const struct kvc_key *hot, struct kvc_key *fill,
                               struct kvc_key *more)
{
    uint64_t evicted = 0;
    fp_fill_arena(w, wns, first, fill);
    ck_assert_int_eq(daemon_client_stat(w, 0, "evicted_blocks", &evicted), 0);
    ck_assert_uint_eq(evicted, 0);
    ck_assert_int_eq(fp_get_check(ns, hot, 4), 4);
    fp_put(wns, first + 100, 4, more);
    ck_assert_int_eq(kvc_flush(w), 0);
    ck_assert_int_eq(daemon_client_stat(w, 0, "evicted_blocks", &evicted), 0);
    ck_assert_uint_ge(evicted, 4);
    kvc_lease *l;
    ck_assert_int_eq(kvc_lookup(wns, hot, 4, 0, &l), 4);
    kvc_release(l);
}

/* The client's fast_hits and fast_dropped once their sum reaches `want` (the daemon reads
 * the rings in passes after the requests, within milliseconds), or after 10 s. */
static void fp_settle(kvc_client *c, uint64_t want, uint64_t *fast, uint64_t *dropped)
{
    for (int i = 0; i < 1000; i++) {
        ck_assert_int_eq(daemon_client_stat(c, 0, "fast_hits", fast), 0);
        ck_assert_int_eq(daemon_client_stat(c, 0, "fast_dropped", dropped), 0);
        if (*fast + *dropped >= want)
            return;
        usleep(10000);
    }
}

START_TEST(test_fast_hits_counted)
{
    struct daemon d = {0};
    kvc_client *c, *c2;
    kvc_ns *ns, *ns2;
    struct kvc_layout lay = daemon_layout("e2e-fast", 16);
    struct kvc_key k[FP_BLOCKS];
    uint64_t fast = 0, hits = 0, lookups = 0;
    ck_assert_int_eq(daemon_start(&d, fp_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fp_put(ns, 1, FP_BLOCKS, k);
    ck_assert_int_eq(fp_get_check(ns, k, FP_BLOCKS), FP_BLOCKS);
    ck_assert_int_eq(fp_get_check(ns, k, 5), 5);
    /* Read by the daemon before this client's next request: the STATS below. */
    ck_assert_int_eq(daemon_client_stat(c, 0, "fast_hits", &fast), 0);
    ck_assert_uint_eq(fast, FP_BLOCKS + 5);
    ck_assert_int_eq(daemon_client_stat(c, 0, "hit_blocks", &hits), 0);
    ck_assert_uint_eq(hits, FP_BLOCKS + 5);
    ck_assert_int_eq(daemon_client_stat(c, 0, "lookups", &lookups), 0);
    ck_assert_uint_eq(lookups, 2);
    ck_assert_int_eq(daemon_client_stat(c, 0, "fast_index_blocks", &hits), 0);
    ck_assert_uint_eq(hits, FP_BLOCKS);
    /* A longer prefix: the index serves the 16 it has, the socket finds no more. */
    struct kvc_key k2[FP_BLOCKS + 4];
    ck_assert_int_eq(daemon_chain_keys(ns, 1, 0, FP_BLOCKS + 4, FP_BLOCKS + 4, k2), 0);
    ck_assert_int_eq(fp_get_check(ns, k2, FP_BLOCKS + 4), FP_BLOCKS);
    ck_assert_int_eq(daemon_client_stat(c, 0, "miss_blocks", &hits), 0);
    ck_assert_uint_eq(hits, 4);
    /* Off in the client: the same answers through the socket, no fast hit added. */
    setenv("KVC_NO_FASTPATH", "1", 1);
    ck_assert_int_eq(kvc_connect(d.sock, &c2), 0);
    unsetenv("KVC_NO_FASTPATH");
    ck_assert_int_eq(kvc_ns_open(c2, &lay, &ns2), 0);
    ck_assert_int_eq(fp_get_check(ns2, k, FP_BLOCKS), FP_BLOCKS);
    ck_assert_int_eq(daemon_client_stat(c2, 0, "fast_hits", &fast), 0);
    ck_assert_uint_eq(fast, 2 * FP_BLOCKS + 5);
    kvc_disconnect(c2);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* How many of keys[0..n) a reader finds through the index now (kvci_fast_resolve). */
static uint32_t fp_index_count(kvc_ns *ns, const struct kvc_key *keys, uint32_t n)
{
    uint32_t found = 0;
    for (uint32_t i = 0; i < n; i++) {
        const void *data;
        size_t len;
        found += kvci_fast_resolve(ns, &keys[i], &data, &len) == 1;
    }
    return found;
}

/* A commit's entries in the shared index are in place once any later request but a RESERVE
 * is answered: the daemon publishes them after the RESERVE a client sends behind its quiet
 * COMMIT (struct store's pub_defer), but before anything else it handles. A put of 64 blocks,
 * kvc_flush (its SYNC handled in the same wake-up as the COMMIT), and every block is found
 * through the index at once, round after round. */
START_TEST(test_fast_published_before_next_answer)
{
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_layout lay = daemon_layout("e2e-fast-pub", 16);
    struct kvc_key k[FP_BLOCKS * 4];
    ck_assert_int_eq(daemon_start(&d, fp_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    for (uint32_t r = 0; r < 40; r++) {
        fp_put(ns, 200 + r, FP_BLOCKS * 4, k);
        ck_assert_int_eq(kvc_flush(c), 0);
        ck_assert_uint_eq(fp_index_count(ns, k, FP_BLOCKS * 4), FP_BLOCKS * 4);
    }
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* The cached prefix of keys[0..n), through the socket (a lookup, released at once). */
static uint32_t fp_cached(kvc_ns *ns, const struct kvc_key *keys, uint32_t n)
{
    kvc_lease *l = NULL;
    int h = kvc_lookup(ns, keys, n, 0, &l);
    ck_assert_int_ge(h, 0);
    if (l)
        ck_assert_int_eq(kvc_release(l), 0);
    return (uint32_t)h;
}

/* Every block of an arena full of 4 KiB blocks is in the shared index (counted: a reader
 * finds each one the socket finds), and the index grew for them: it was sized for the 64 KiB
 * blocks of the namespace there first, whose client moves to the new index on its next get
 * and still copies its blocks through it. */
/* One LOOKUP of n keys asks the daemon's index at most n times (issue 31: each key is
 * resolved once and its block handed to every later step): the stat lookup_index_finds
 * around single socket lookups (fast path off, so every key reaches the daemon), all hits,
 * and hits then misses; of a window's or a state's span too, whose keys are judged, read
 * and pinned with the blocks found once. */
static uint64_t fp_lookup_finds(kvc_client *c, kvc_ns *ns, const struct kvc_key *k, uint32_t n,
                                unsigned flags, int want)
{
    uint64_t f0 = 0, f1 = 0, l0 = 0, l1 = 0;
    kvc_lease *l = NULL;
    ck_assert_int_eq(daemon_client_stat(c, 0, "lookup_index_finds", &f0), 0);
    ck_assert_int_eq(daemon_client_stat(c, 0, "lookups", &l0), 0);
    ck_assert_int_eq(kvc_lookup(ns, k, n, flags, &l), want);
    kvc_release(l);
    ck_assert_int_eq(daemon_client_stat(c, 0, "lookup_index_finds", &f1), 0);
    ck_assert_int_eq(daemon_client_stat(c, 0, "lookups", &l1), 0);
    ck_assert_uint_eq(l1 - l0, 1); /* one LOOKUP of n keys, counted */
    printf("e2e_fast: a LOOKUP of %u keys (kind %d, flags %u, %d hits): %llu index "
           "resolutions\n",
           n, kvc_ns_kind(ns), flags, want, (unsigned long long)(f1 - f0));
    return f1 - f0;
}

/* Process pid's mappings of a shared index ("kvcd-index-<arena>" memfds): 1 when there is one
 * and each carries the advice for transparent huge pages ("hg" in its smaps VmFlags), 0 when
 * one lacks it, -1 when there is none. */
static int fp_index_advised(pid_t pid)
{
    char path[64], line[512];
    snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
    FILE *f = fopen(path, "r");
    int found = -1;
    bool in = false;
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2)
            in = strstr(line, "memfd:kvcd-index-") != NULL;
        else if (in && strncmp(line, "VmFlags:", 8) == 0)
            found = (found != 0 && strstr(line, " hg") != NULL) ? 1 : 0;
    }
    fclose(f);
    return found;
}

/* The shared index is advised for huge pages in the daemon and in every reader before it is
 * faulted in: at a million blocks a hit's bucket and generation are random reads into tens of
 * MiB, each a page walk that misses on 4 KiB pages. Whether the host then gives huge pages
 * is its shmem setting's to say (docs/performance.md); the advice is what kvcd owes. */
START_TEST(test_fast_index_huge_advice)
{
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_layout lay = daemon_layout("e2e-huge", 16);
    struct kvc_key k[FP_BLOCKS];
    uint64_t fast = 0;
    ck_assert_int_eq(daemon_start(&d, fp_args), 0);
    ck_assert_int_eq(fp_index_advised(getpid()), -1);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fp_put(ns, 1, FP_BLOCKS, k);
    ck_assert_int_eq(fp_get_check(ns, k, FP_BLOCKS), FP_BLOCKS);
    ck_assert_int_eq(daemon_client_stat(c, 0, "fast_hits", &fast), 0);
    ck_assert_uint_eq(fast, FP_BLOCKS); /* read through the index, so it is mapped here */
    ck_assert_int_eq(fp_index_advised(getpid()), 1);
    ck_assert_int_eq(fp_index_advised(d.pid), 1);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* Process pid's mappings of memfds named `name`*: the start of the largest, its size and
 * ShmemPmdMapped bytes; false when there is none. */
static bool fp_mapping(pid_t pid, const char *name, uint64_t *start, uint64_t *bytes,
                       uint64_t *pmd)
{
    char path[64], line[512], want[96];
    unsigned long lo, hi;
    unsigned long long kb;
    bool in = false, found = false;
    snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
    snprintf(want, sizeof(want), "memfd:%s", name);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
            in = strstr(line, want) != NULL && (!found || hi - lo > *bytes);
            if (in) {
                found = true;
                *start = lo;
                *bytes = hi - lo;
                *pmd = 0;
            }
        } else if (in && sscanf(line, "ShmemPmdMapped: %llu kB", &kb) == 1) {
            *pmd = (uint64_t)kb * 1024;
        }
    }
    fclose(f);
    return found;
}

/* The arena and the shared index are mapped at 2 MiB boundaries by the daemon and by the
 * client, so that the 2 MiB pages the daemon made by collapse (host_collapsed; the host's
 * shmem THP setting aside) are mapped huge in both: a hit then takes no 4 KiB page walk. */
START_TEST(test_arena_and_index_on_huge_pages)
{
    static const char *const args[] = {"-o", "host.size=256m", "-o", "host.page_size=64k", "-o",
                                       "host.hugepages=off", NULL};
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    /* 4 KiB blocks: an index of 2 MiB and more (a 32-byte entry per 4 KiB of 256 MiB) */
    struct kvc_layout lay = daemon_layout("e2e-huge-map", 4);
    struct kvc_key k[FP_BLOCKS];
    uint64_t collapsed = 0, start, bytes, pmd;
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    /* The arena mapped once it is all faulted in (and collapsed): a mapping made earlier maps
     * each 2 MiB huge only when it touches it again after its collapse. */
    uint64_t faulted = 0, total = 1;
    for (int i = 0; i < 3000 && faulted < total; i++) {
        ck_assert_int_eq(daemon_client_stat(c, 0, "host_faulted", &faulted), 0);
        ck_assert_int_eq(daemon_client_stat(c, 0, "host_arenas_bytes", &total), 0);
        usleep(10000);
    }
    ck_assert_uint_eq(faulted, total);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fp_put(ns, 3, FP_BLOCKS, k);
    ck_assert_int_eq(fp_get_check(ns, k, FP_BLOCKS), FP_BLOCKS);
    ck_assert_int_eq(daemon_client_stat(c, 0, "host_collapsed", &collapsed), 0);
    printf("e2e_fast: %llu MiB of the arena made 2 MiB pages by collapse\n",
           (unsigned long long)(collapsed >> 20));
    const pid_t pids[] = {getpid(), d.pid};
    for (int i = 0; i < 2; i++) {
        ck_assert(fp_mapping(pids[i], "kvcd-host-0", &start, &bytes, &pmd));
        ck_assert_uint_eq(bytes, 256ull << 20);
        ck_assert_uint_eq(start % (2u << 20), 0);
        ck_assert_uint_ge(pmd, collapsed); /* the client maps it populated */
        ck_assert(fp_mapping(pids[i], "kvcd-index-0", &start, &bytes, &pmd));
        ck_assert_uint_ge(bytes, 2u << 20);
        ck_assert_uint_eq(start % (2u << 20), 0);
        if (collapsed)
            ck_assert_uint_ge(pmd, 2u << 20);
    }
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

START_TEST(test_lookup_resolves_once)
{
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_layout lay = daemon_layout("e2e-resolve", 16);
    struct kvc_key k[FP_BLOCKS + 4];
    ck_assert_int_eq(daemon_start(&d, fp_args), 0);
    setenv("KVC_NO_FASTPATH", "1", 1);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    unsetenv("KVC_NO_FASTPATH");
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fp_put(ns, 1, FP_BLOCKS, k);
    ck_assert_int_eq(daemon_chain_keys(ns, 1, 0, FP_BLOCKS + 4, FP_BLOCKS + 4, k), 0);
    ck_assert_uint_le(fp_lookup_finds(c, ns, k, FP_BLOCKS, 0, FP_BLOCKS), FP_BLOCKS);
    ck_assert_uint_le(fp_lookup_finds(c, ns, k, FP_BLOCKS + 4, 0, FP_BLOCKS), FP_BLOCKS + 4);
    ck_assert_uint_le(fp_lookup_finds(c, ns, k + FP_BLOCKS, 4, 0, 0), 4);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

START_TEST(test_fast_full_arena_4k)
{
    static const char *const args[] = {"-o", "host.size=64m",    "-o", "host.page_size=64k",
                                       "-o", "cache.policy=lru", NULL};
    enum { CHAINS = 288, LEN = 64 }; /* 18432 blocks of 4 KiB: more than the arena holds */
    struct daemon d = {0};
    kvc_client *c, *c2;
    kvc_ns *big, *small;
    struct kvc_layout lbig = daemon_layout("e2e-fast-64k", 64),
                      lsmall = daemon_layout("e2e-fast-4k", 4);
    struct kvc_key kb[16], *ks = calloc((size_t)CHAINS * LEN, sizeof(*ks));
    uint64_t fast0, fast1, dropped, blocks, pub, full;
    ck_assert_ptr_nonnull(ks);
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lbig, &big), 0);
    ck_assert_uint_eq(kvc_ns_block_bytes(big), 64 << 10);
    fp_put(big, 1, 16, kb);
    ck_assert_int_eq(fp_get_check(big, kb, 16), 16); /* through the first index */
    const struct kvc_fastview *first = c->fast[0].view;
    ck_assert_ptr_nonnull(first);
    fp_settle(c, 16, &fast0, &dropped);
    ck_assert_uint_eq(fast0, 16);

    /* The 4 KiB namespace: the arena can now hold 16 times as many blocks. */
    ck_assert_int_eq(kvc_connect(d.sock, &c2), 0);
    ck_assert_int_eq(kvc_ns_open(c2, &lsmall, &small), 0);
    ck_assert_uint_eq(kvc_ns_block_bytes(small), 4 << 10);
    ck_assert_uint_ne(first->hdr->retired, 0);
    ck_assert_int_eq(fp_get_check(big, kb, 16), 16); /* moved to the new index */
    ck_assert_ptr_ne(c->fast[0].view, first);
    ck_assert_uint_eq(c->fast[0].view->hdr->retired, 0);
    fp_settle(c, 32, &fast1, &dropped);
    ck_assert_uint_eq(fast1 + dropped, 32);
    ck_assert_uint_ge(fast1, 16 + 15); /* the first block may take the socket once */

    /* Fill the arena (and past it: the cold chains go) with 4 KiB blocks. */
    size_t bb = kvc_ns_block_bytes(small);
    void **blk = calloc(LEN, sizeof(*blk));
    for (uint32_t i = 0; i < LEN; i++)
        blk[i] = malloc(bb);
    for (uint32_t ch = 0; ch < CHAINS; ch++) {
        struct kvc_key *k = ks + (size_t)ch * LEN;
        ck_assert_int_eq(daemon_chain_keys(small, 100 + ch, 0, LEN, LEN, k), 0);
        for (uint32_t i = 0; i < LEN; i++)
            daemon_block_fill(&k[i], blk[i], bb);
        int rc = kvc_put_prefix(small, NULL, k, LEN, (const void *const *)blk);
        ck_assert_int_ge(rc, 0);
    }
    ck_assert_int_eq(kvc_flush(c2), 0);
    uint32_t cached = 0, found = 0;
    for (uint32_t ch = 0; ch < CHAINS; ch++) {
        cached += fp_cached(small, ks + (size_t)ch * LEN, LEN);
        found += fp_index_count(small, ks + (size_t)ch * LEN, LEN);
    }
    uint32_t bcached = fp_cached(big, kb, 16), bfound = fp_index_count(big, kb, 16);
    ck_assert_int_eq(daemon_client_stat(c2, 0, "blocks_now", &blocks), 0);
    ck_assert_int_eq(daemon_client_stat(c2, 0, "fast_index_blocks", &pub), 0);
    ck_assert_int_eq(daemon_client_stat(c2, 0, "fast_index_full", &full), 0);
    printf("e2e_fast: arena of 4 KiB blocks: %u cached, %u found through the index; %u/%u of "
           "the 64 KiB ones; %llu blocks, %llu published, %llu refused\n",
           cached, found, bfound, bcached, (unsigned long long)blocks, (unsigned long long)pub,
           (unsigned long long)full);
    ck_assert_uint_ge(cached, (64u << 20) / bb * 9 / 10); /* the arena is full */
    ck_assert_uint_eq(found, cached);
    ck_assert_uint_eq(bfound, bcached);
    ck_assert_uint_eq(blocks, cached + bcached);
    ck_assert_uint_eq(pub, blocks);
    ck_assert_uint_eq(full, 0);
    /* and copied through it, byte for byte */
    ck_assert_int_eq(daemon_client_stat(c2, 0, "fast_hits", &fast0), 0);
    uint32_t got = 0;
    for (uint32_t ch = 0; ch < CHAINS; ch += 16)
        got += (uint32_t)fp_get_check(small, ks + (size_t)ch * LEN, 32);
    fp_settle(c2, fast0 + got, &fast1, &dropped);
    ck_assert_uint_eq(fast1 - fast0, got);
    for (uint32_t i = 0; i < LEN; i++)
        free(blk[i]);
    free(blk);
    free(ks);
    kvc_disconnect(c2);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* Window and state namespaces never take the shared index: their blocks are there (any
 * ready block is), but a run from keys[0] is no window's and no state's answer. get_prefix
 * asks the daemon for their span; the index walk itself declines them. */
START_TEST(test_fast_refuses_spans)
{
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *w, *st;
    struct kvc_layout lw = daemon_layout("e2e-fast-swa", 16), ls = daemon_layout("e2e-fast-st", 16);
    struct kvc_key k[8];
    uint64_t fast = 1;
    ls.kv_kind = KVC_KV_KIND_STATE;
    lw.kv_kind = KVC_KV_KIND_KV_WINDOW;
    ck_assert_int_eq(daemon_start(&d, fp_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open_window(c, &lw, 40, &w), 0); /* 3 blocks */
    ck_assert_int_eq(kvc_ns_open(c, &ls, &st), 0);
    size_t bb = kvc_ns_block_bytes(w), sb = kvc_ns_block_bytes(st);
    uint8_t *buf = malloc(bb), *bufs = calloc(8, bb);
    void *dst[8], *got[8];
    for (uint32_t i = 0; i < 8; i++) {
        const void *p = buf;
        k[i] = (struct kvc_key){.lo = 0x5157a + i, .hi = 77};
        daemon_block_fill(&k[i], buf, bb);
        ck_assert_int_eq(kvc_put_prefix(w, NULL, &k[i], 1, &p), 1); /* all 8 cached */
        if (i == 0 || i == 2) {
            daemon_block_fill(&k[i], buf, sb);
            ck_assert_int_eq(kvc_put_prefix(st, NULL, &k[i], 1, &p), 1);
        }
        dst[i] = bufs + (size_t)i * bb;
    }
    ck_assert_int_eq(kvc_flush(c), 0);
    /* The window of prefix 8 (blocks 5..7), nothing before it, though 0..4 are cached. */
    ck_assert_int_eq(kvc_get_prefix(w, k, 8, dst), 8);
    for (uint32_t i = 5; i < 8; i++)
        ck_assert_int_eq(daemon_block_check(&k[i], dst[i], bb), -1);
    for (size_t i = 0; i < 5 * bb; i++)
        ck_assert_msg(bufs[i] == 0, "get_prefix wrote before the window");
    /* The state of prefix 3 (at k[2]), not k[0]'s. */
    memset(bufs, 0, 8 * bb);
    ck_assert_int_eq(kvc_get_prefix(st, k, 4, dst), 3);
    ck_assert_int_eq(daemon_block_check(&k[2], dst[2], sb), -1);
    for (size_t i = 0; i < 2 * bb; i++)
        ck_assert_msg(bufs[i] == 0, "get_prefix wrote another boundary's state");
    /* The index walk declines both kinds (k[0] is in the index for each). */
    for (uint32_t i = 0; i < 8; i++)
        got[i] = bufs + (size_t)i * bb;
    ck_assert_uint_eq(kvci_fast_get(w, k, 8, got), 0);
    ck_assert_uint_eq(kvci_fast_get(st, k, 4, got), 0);
    ck_assert_int_eq(daemon_client_stat(c, 0, "fast_hits", &fast), 0);
    ck_assert_uint_eq(fast, 0);
    free(buf);
    free(bufs);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* A window's and a state's LOOKUP resolve each key once too (issue 31): the span is judged,
 * its reads started and its blocks pinned with the blocks found first. Socket lookups (fast
 * path off): a whole window, one behind a gap, ready-only ones, a state at the far end. */
START_TEST(test_span_lookup_resolves_once)
{
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *w, *st;
    struct kvc_layout lw = daemon_layout("e2e-span-swa", 16), ls = daemon_layout("e2e-span-st", 16);
    struct kvc_key k[10];
    ls.kv_kind = KVC_KV_KIND_STATE;
    lw.kv_kind = KVC_KV_KIND_KV_WINDOW;
    ck_assert_int_eq(daemon_start(&d, fp_args), 0);
    setenv("KVC_NO_FASTPATH", "1", 1);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    unsetenv("KVC_NO_FASTPATH");
    ck_assert_int_eq(kvc_ns_open_window(c, &lw, 40, &w), 0); /* 3 blocks */
    ck_assert_int_eq(kvc_ns_open(c, &ls, &st), 0);
    uint8_t *buf = malloc(kvc_ns_block_bytes(w));
    ck_assert_ptr_nonnull(buf);
    for (uint32_t i = 0; i < 10; i++) {
        const void *p = buf;
        k[i] = (struct kvc_key){.lo = 0x59a7 + i, .hi = 31};
        if (i == 8)
            continue; /* never stored: a gap */
        daemon_block_fill(&k[i], buf, kvc_ns_block_bytes(w));
        ck_assert_int_eq(kvc_put_prefix(w, NULL, &k[i], 1, &p), 1);
        if (i == 0) {
            daemon_block_fill(&k[i], buf, kvc_ns_block_bytes(st));
            ck_assert_int_eq(kvc_put_prefix(st, NULL, &k[i], 1, &p), 1);
        }
    }
    ck_assert_int_eq(kvc_flush(c), 0);
    ck_assert_uint_le(fp_lookup_finds(c, w, k, 8, 0, 3), 8);
    ck_assert_uint_le(fp_lookup_finds(c, w, k, 8, KVC_LOOKUP_READY_ONLY, 3), 8);
    ck_assert_uint_le(fp_lookup_finds(c, w, k, 10, 0, 3), 10); /* k[9]'s window has k[8] */
    ck_assert_uint_le(fp_lookup_finds(c, st, k, 6, 0, 1), 6);  /* the state of prefix 1 */
    ck_assert_uint_le(fp_lookup_finds(c, st, k, 6, KVC_LOOKUP_READY_ONLY, 1), 6);
    ck_assert_uint_le(fp_lookup_finds(c, st, k + 1, 4, 0, 0), 4);
    free(buf);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* A client that leaves with hits still unread in its ring (fewer than half a ring: it never
 * asked for room) has them read before its connection closes: every one counts. */
START_TEST(test_fast_hits_counted_at_disconnect)
{
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_layout lay = daemon_layout("e2e-fast-bye", 16);
    struct kvc_key k[FP_BLOCKS];
    uint64_t fast0 = 0, fast = 0, dropped = 0;
    ck_assert_int_eq(daemon_start(&d, fp_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fp_put(ns, 3, FP_BLOCKS, k);
    ck_assert_int_eq(fp_get_check(ns, k, FP_BLOCKS), FP_BLOCKS);
    ck_assert_int_eq(daemon_client_stat(c, 0, "fast_hits", &fast0), 0); /* those 16 read */
    for (int r = 0; r < 120; r++) /* 1,920 hits, then straight out */
        ck_assert_int_eq(fp_get_check(ns, k, FP_BLOCKS), FP_BLOCKS);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stat(&d, "fast_hits", &fast), 0);
    ck_assert_int_eq(daemon_stat(&d, "fast_dropped", &dropped), 0);
    ck_assert_uint_eq(fast - fast0, 120 * FP_BLOCKS);
    ck_assert_uint_eq(dropped, 0);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

START_TEST(test_fast_off_in_daemon)
{
    static const char *const args[] = {"-o", "host.size=16m", "-o", "server.fast_path=no",
                                       NULL};
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_layout lay = daemon_layout("e2e-fast-off", 16);
    struct kvc_key k[FP_BLOCKS];
    uint64_t fast = 1, hits = 0;
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fp_put(ns, 2, FP_BLOCKS, k);
    ck_assert_int_eq(fp_get_check(ns, k, FP_BLOCKS), FP_BLOCKS);
    ck_assert_int_eq(fp_get_check(ns, k, FP_BLOCKS), FP_BLOCKS);
    ck_assert_int_eq(daemon_client_stat(c, 0, "fast_hits", &fast), 0);
    ck_assert_uint_eq(fast, 0);
    ck_assert_int_eq(daemon_client_stat(c, 0, "hit_blocks", &hits), 0);
    ck_assert_uint_eq(hits, 2 * FP_BLOCKS);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* Hits through the index reach the policy before anything is evicted: under LRU, the blocks
 * one client reads that way (and never asks the daemon anything else) stay while the ones
 * never read go when another client's puts need room. The daemon reads the reader's ring
 * before it evicts, well within its 1 s tick. */
START_TEST(test_fast_hits_keep_blocks)
{
    struct daemon d = {0};
    kvc_client *c, *w;
    kvc_ns *ns, *wns;
    struct kvc_layout lay = daemon_layout("e2e-fast-lru", 64); /* 64 KiB blocks */
    struct kvc_key hot[4], cold[4], fill[64];
    uint64_t fast = 0;
    ck_assert_int_eq(daemon_start(&d, fp_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &w), 0);
    ck_assert_int_eq(kvc_ns_open(w, &lay, &wns), 0);
    fp_put(wns, 10, 4, hot);
    fp_put(wns, 11, 4, cold);
    ck_assert_int_eq(fp_get_check(ns, hot, 4), 4); /* maps the index: one round trip */
    /* 16 MiB hold 256 blocks: 5 rounds of 60 push the cold ones out; the hot ones are read
     * through the index between rounds, as a shared system prompt would be. */
    for (uint32_t r = 0; r < 5; r++) {
        fp_put(wns, 100 + r, 60, fill);
        ck_assert_int_eq(fp_get_check(ns, hot, 4), 4);
    }
    ck_assert_int_eq(fp_get_check(ns, cold, 4), 0);
    ck_assert_int_eq(fp_get_check(ns, hot, 4), 4);
    ck_assert_int_eq(daemon_client_stat(c, 0, "fast_hits", &fast), 0);
    ck_assert_uint_eq(fast, 4 * 7);
    /* Each client's own counters: the reader's hits are its own, though the daemon read
     * most of them while it served the writer's puts. */
    struct kvc_client_info *ci;
    size_t nci;
    ck_assert_int_eq(kvc_clients(c, &ci, &nci), 0);
    int seen = 0;
    for (size_t i = 0; i < nci; i++) {
        if (ci[i].pid != (uint32_t)getpid())
            continue;
        ck_assert_uint_eq(ci[i].hit_tokens, ci[i].self ? 4 * 7 * 64 : 0);
        seen++;
    }
    ck_assert_int_eq(seen, 2);
    free(ci);
    kvc_disconnect(w);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* The same at the tightest: the arena exactly full, a reader's hits through the index
 * written to its ring just before another client's RESERVE must evict, with no wake-up of
 * the daemon in between. The eviction reads the rings first, so the blocks just read are
 * the newest and others go. */
START_TEST(test_fast_hits_before_eviction)
{
    static const char *const args[] = {
        "-o", "host.size=16m",           "-o", "host.page_size=64k",      "-o", "cache.policy=lru",
        "-o", "host.high_watermark=1.0", "-o", "host.low_watermark=0.99", NULL};
    struct daemon d = {0};
    kvc_client *c, *w;
    kvc_ns *ns, *wns;
    struct kvc_layout lay = daemon_layout("e2e-fast-evict", 64); /* 64 KiB blocks */
    struct kvc_key hot[4], fill[64], more[4];
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &w), 0);
    ck_assert_int_eq(kvc_ns_open(w, &lay, &wns), 0);
    fp_put(wns, 12, 4, hot);
    ck_assert_int_eq(fp_get_check(ns, hot, 4), 4); /* maps the index */
    fp_read_then_evict(w, wns, ns, 200, hot, fill, more);
    kvc_disconnect(w);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* The same among many idle connections (issue 32): a pass looks only at the rings whose bit
 * in their uid's bell is set (client/kvc_fast.h), not at every ring. FP_IDLE_CONNS
 * connections with rings hold nothing unread; the reader's ring was read empty (it left the
 * rings a pass looks at), then it reads through the index and at once a put must evict: its
 * bit has the eviction's pass read its hits first, so the blocks it just read stay, and its
 * hits are all counted by passes alone (no request of its own reads them). A reader whose
 * bit were never looked at would have its hits read only at the 100 ms sweep, after the
 * eviction took them. */
#define FP_IDLE_CONNS 256
START_TEST(test_fast_bell_many_idle)
{
    static const char *const args[] = {
        "-o", "host.size=16m",           "-o", "host.page_size=64k",
        "-o", "cache.policy=lru",        "-o", "host.high_watermark=1.0",
        "-o", "host.low_watermark=0.99", "-o", "server.max_clients_per_uid=512",
        NULL};
    struct daemon d = {0};
    static kvc_client *idle[FP_IDLE_CONNS];
    kvc_client *c, *w;
    kvc_ns *ns, *wns, *ins;
    struct kvc_layout lay = daemon_layout("e2e-fast-bell", 64); /* 64 KiB blocks */
    struct kvc_key hot[4], fill[64], more[4];
    uint64_t fast0 = 0, fast = 0;
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &w), 0);
    ck_assert_int_eq(kvc_ns_open(w, &lay, &wns), 0);
    fp_put(wns, 13, 4, hot);
    for (int i = 0; i < FP_IDLE_CONNS; i++) {
        ck_assert_int_eq(kvc_connect(d.sock, &idle[i]), 0);
        ck_assert_int_eq(kvc_ns_open(idle[i], &lay, &ins), 0);
        ck_assert_int_eq(fp_get_check(ins, hot, 1), 1); /* maps its ring and its bell */
        ck_assert_ptr_nonnull(idle[i]->bell);
    }
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    ck_assert_int_eq(fp_get_check(ns, hot, 4), 4); /* maps the index, the ring and the bell */
    ck_assert_ptr_nonnull(c->bell);
    /* Every ring read (passes after the writer's requests), then found empty by a pass. */
    for (int i = 0; i < 1000 && fast0 < FP_IDLE_CONNS + 4; i++) {
        usleep(2000);
        ck_assert_int_eq(daemon_client_stat(w, 0, "fast_hits", &fast0), 0);
    }
    ck_assert_uint_eq(fast0, FP_IDLE_CONNS + 4);
    usleep(5000);
    fp_read_then_evict(w, wns, ns, 400, hot, fill, more);
    ck_assert_int_eq(daemon_client_stat(w, 0, "fast_hits", &fast), 0);
    ck_assert_uint_eq(fast, fast0 + 4);
    for (int i = 0; i < FP_IDLE_CONNS; i++)
        kvc_disconnect(idle[i]);
    kvc_disconnect(w);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* A SYNC waiting for its ring and an eviction in the same batch of requests: the eviction's
 * pass reads the ring empty, and the SYNC is still answered by the pass after the batch (a
 * ring with a bell that a pass reads empty leaves the rings the passes look at, but not while
 * its SYNC waits: the waiting client would never be answered). The daemon is stopped while
 * the SYNC and then the put that must evict are sent, so that it reads them together. */
static void fp_ring_fill(kvc_client *c, uint32_t n);

struct fp_sync_put {
    kvc_client *c;
    kvc_ns *ns;
    const struct kvc_key *k;
    const void *const *blk;
    int rc;
    bool done;
};

/* SIGSTOPs the daemon and waits until it is stopped (state T in /proc/PID/stat), so that
 * what is sent from then on is read by it together. */
static void fp_daemon_stop_now(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    ck_assert_int_eq(kill(pid, SIGSTOP), 0);
    for (int i = 0; i < 2000; i++) {
        FILE *f = fopen(path, "re");
        ck_assert_ptr_nonnull(f);
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *p = strrchr(buf, ')');
        if (p && p[1] == ' ' && p[2] == 'T')
            return;
        usleep(1000);
    }
    ck_abort_msg("the daemon did not stop");
}

static void *fp_sync_run(void *arg)
{
    struct fp_sync_put *x = arg;
    kvci_fast_flush(x->c); /* the SYNC libkvc sends when half its ring is unread */
    __atomic_store_n(&x->done, true, __ATOMIC_RELEASE);
    return NULL;
}

static void *fp_put_run(void *arg)
{
    struct fp_sync_put *x = arg;
    x->rc = kvc_put_prefix(x->ns, NULL, x->k, 4, x->blk);
    __atomic_store_n(&x->done, true, __ATOMIC_RELEASE);
    return NULL;
}

START_TEST(test_fast_sync_with_eviction)
{
    static const char *const args[] = {
        "-o", "host.size=16m",           "-o", "host.page_size=64k",      "-o", "cache.policy=lru",
        "-o", "host.high_watermark=1.0", "-o", "host.low_watermark=0.99", NULL};
    struct daemon d = {0};
    kvc_client *c, *w;
    kvc_ns *ns, *wns;
    struct kvc_layout lay = daemon_layout("e2e-fast-sync-evict", 64); /* 64 KiB blocks */
    struct kvc_key hot[4], fill[64], more[4];
    uint64_t evicted = 0, fast = 0, dropped = 0;
    const void *blk[4];
    pthread_t ts, tp;
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &w), 0);
    ck_assert_int_eq(kvc_ns_open(w, &lay, &wns), 0);
    fp_put(wns, 14, 4, hot);
    ck_assert_int_eq(fp_get_check(ns, hot, 4), 4); /* maps the index, the ring, the bell */
    fp_fill_arena(w, wns, 600, fill);
    ck_assert_int_eq(daemon_chain_keys(wns, 700, 0, 4, 4, more), 0);
    for (int i = 0; i < 4; i++) {
        void *b = malloc(64u << 10);
        daemon_block_fill(&more[i], b, 64u << 10);
        blk[i] = b;
    }
    struct fp_sync_put xs = {.c = c}, xp = {.ns = wns, .k = more, .blk = blk};
    fp_daemon_stop_now(d.pid);
    fp_ring_fill(c, 100);
    ck_assert_int_eq(pthread_create(&ts, NULL, fp_sync_run, &xs), 0);
    usleep(20000);
    ck_assert_int_eq(pthread_create(&tp, NULL, fp_put_run, &xp), 0);
    usleep(20000);
    ck_assert_int_eq(kill(d.pid, SIGCONT), 0);
    for (int i = 0; i < daemon_ms(5000) / 10 && !__atomic_load_n(&xs.done, __ATOMIC_ACQUIRE); i++)
        usleep(10000);
    ck_assert_msg(__atomic_load_n(&xs.done, __ATOMIC_ACQUIRE), "the SYNC was never answered");
    pthread_join(ts, NULL);
    pthread_join(tp, NULL);
    ck_assert_int_eq(xp.rc, 4);
    ck_assert_int_eq(kvc_flush(w), 0);
    ck_assert_int_eq(daemon_client_stat(w, 0, "evicted_blocks", &evicted), 0);
    ck_assert_uint_ge(evicted, 4);
    fp_settle(w, 104, &fast, &dropped);
    ck_assert_uint_eq(fast + dropped, 104);
    for (int i = 0; i < 4; i++)
        free((void *)blk[i]);
    kvc_disconnect(w);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* Threads of one client copy a cached prefix through the index over and over while the
 * daemon reads their hits (each drain touches the blocks): no copy falls back to the socket,
 * since a touch leaves a block's index entry in place. */
struct fp_thread {
    kvc_ns *ns;
    const struct kvc_key *k;
    long hits;
};

static void *fp_thread_run(void *arg)
{
    struct fp_thread *t = arg;
    size_t bb = kvc_ns_block_bytes(t->ns);
    void *dst[FP_BLOCKS];
    for (int i = 0; i < FP_BLOCKS; i++)
        dst[i] = malloc(bb);
    for (int r = 0; r < 1000; r++) {
        int h = kvc_get_prefix(t->ns, t->k, FP_BLOCKS, dst);
        if (h != FP_BLOCKS || daemon_block_check(&t->k[r % FP_BLOCKS], dst[r % FP_BLOCKS], bb) != -1)
            break;
        t->hits += h;
    }
    for (int i = 0; i < FP_BLOCKS; i++)
        free(dst[i]);
    return NULL;
}

START_TEST(test_fast_threads_never_fall_back)
{
    /* Within the ring's rate every hit is counted (the default, 65536 a second, is less than
     * these threads take: test_fast_ring_rate), read or, once the passes over the rings have
     * spent their share of the loop (test_fast_sync_waits_for_others), dropped. */
    static const char *const args[] = {
        "-o", "host.size=16m", "-o", "host.page_size=64k", "-o", "server.fast_ring_rate=16777216",
        NULL};
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_layout lay = daemon_layout("e2e-fast-threads", 16);
    struct kvc_key k[FP_BLOCKS];
    struct fp_thread t[4];
    pthread_t tid[4];
    uint64_t fast = 0, dropped = 0, lookups0 = 0, lookups = 0, hits = 0;
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fp_put(ns, 50, FP_BLOCKS, k);
    ck_assert_int_eq(fp_get_check(ns, k, FP_BLOCKS), FP_BLOCKS); /* maps index and ring */
    ck_assert_int_eq(daemon_client_stat(c, 0, "lookups", &lookups0), 0);
    for (int i = 0; i < 4; i++) {
        t[i] = (struct fp_thread){.ns = ns, .k = k};
        ck_assert_int_eq(pthread_create(&tid[i], NULL, fp_thread_run, &t[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(tid[i], NULL);
        ck_assert_int_eq(t[i].hits, 1000 * FP_BLOCKS);
    }
    fp_settle(c, (uint64_t)(4 * 1000 + 1) * FP_BLOCKS, &fast, &dropped);
    ck_assert_uint_eq(fast + dropped, (uint64_t)(4 * 1000 + 1) * FP_BLOCKS);
    ck_assert_uint_gt(fast, 0);
    /* None through the socket: every hit counted is a fast one, a lookup at most per get. */
    ck_assert_int_eq(daemon_client_stat(c, 0, "hit_blocks", &hits), 0);
    ck_assert_uint_eq(hits, fast);
    ck_assert_int_eq(daemon_client_stat(c, 0, "lookups", &lookups), 0);
    ck_assert_uint_le(lookups - lookups0, 4 * 1000);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* server.fast_ring_rate: a client that hits faster than its ring is read (1,000 a second
 * here) gets every hit served, and the daemon counts what it read and drops the rest,
 * counted: never more than the rate allows, whatever the client writes. */
START_TEST(test_fast_ring_rate)
{
    static const char *const args[] = {
        "-o", "host.size=16m", "-o", "host.page_size=64k", "-o", "server.fast_ring_rate=1000",
        NULL};
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_layout lay = daemon_layout("e2e-fast-rate", 16);
    struct kvc_key k[FP_BLOCKS];
    uint64_t fast = 0, dropped = 0, t0, t1;
    const int rounds = 1000;
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fp_put(ns, 60, FP_BLOCKS, k);
    t0 = daemon_now_ms();
    for (int r = 0; r < rounds; r++)
        ck_assert_int_eq(fp_get_check(ns, k, FP_BLOCKS), FP_BLOCKS);
    t1 = daemon_now_ms();
    fp_settle(c, (uint64_t)rounds * FP_BLOCKS, &fast, &dropped);
    printf("e2e_fast: ring rate 1000/s: %llu hits in %llu ms: %llu counted, %llu dropped\n",
           (unsigned long long)rounds * FP_BLOCKS, (unsigned long long)(t1 - t0),
           (unsigned long long)fast, (unsigned long long)dropped);
    ck_assert_uint_eq(fast + dropped, (uint64_t)rounds * FP_BLOCKS);
    ck_assert_uint_gt(dropped, 0);
    /* A ring's worth banked, then the rate, over the time the hits took and the settling. */
    ck_assert_uint_le(fast, KVC_FAST_RING_ENTS + (daemon_now_ms() - t0 + 1000));
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* Reading a ring is kept off the requests' path: a client with 2,000 hits unread in its
 * ring (valid ones, written straight into it) has at most 64 of them read before its next
 * request is answered; the passes between requests read the rest. */
START_TEST(test_fast_ring_steps)
{
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_layout lay = daemon_layout("e2e-fast-steps", 16);
    struct kvc_key k[4];
    uint64_t fast0 = 0, fast = 0, dropped = 0;
    ck_assert_int_eq(daemon_start(&d, fp_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fp_put(ns, 4, 4, k);
    ck_assert_int_eq(fp_get_check(ns, k, 4), 4);
    /* No pass of the rings pending when the entries land: the pass after a batch runs at
     * most once a millisecond and sets a timer when it skips, so a request made past that
     * millisecond has its pass run at once, finding nothing, and leaves no timer behind.
     * Its reply leaves before that pass runs (at once from an I/O thread: KVC_IO_THREADS),
     * so the second wait lets the pass end before the entries land, or it reads them. */
    ck_assert_int_eq(daemon_client_stat(c, 0, "fast_hits", &fast0), 0);
    usleep((useconds_t)daemon_ms(20) * 1000);
    ck_assert_int_eq(daemon_client_stat(c, 0, "fast_hits", &fast0), 0);
    usleep((useconds_t)daemon_ms(20) * 1000);
    struct kvc_fast_ring *r = c->ring;
    struct kvc_fast_hit *e = (struct kvc_fast_hit *)(r + 1), t[4];
    for (int i = 0; i < 4; i++)
        t[i] = e[(r->head - 4 + i) % KVC_FAST_RING_ENTS];
    uint64_t head = r->head;
    for (uint32_t i = 0; i < 2000; i++)
        e[(head + i) % KVC_FAST_RING_ENTS] = t[i % 4];
    __atomic_store_n(&r->head, head + 2000, __ATOMIC_RELEASE);
    kvci_fast_bell(c, head); /* as libkvc does after it writes */
    ck_assert_int_eq(daemon_client_stat(c, 0, "fast_hits", &fast), 0);
    ck_assert_uint_le(fast - fast0, 64);
    fp_settle(c, fast0 + 2000, &fast, &dropped);
    ck_assert_uint_eq(fast - fast0, 2000);
    ck_assert_uint_eq(dropped, 0);
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* Fills c's ring with n valid hits (its last 4 entries, from a get of 4 blocks, repeated)
 * behind the daemon's back, as a client that takes hits faster than they are read. */
static void fp_ring_fill(kvc_client *c, uint32_t n)
{
    struct kvc_fast_ring *r = c->ring;
    struct kvc_fast_hit *e = (struct kvc_fast_hit *)(r + 1), t[4];
    ck_assert_ptr_nonnull(r);
    for (int i = 0; i < 4; i++)
        t[i] = e[(r->head - 4 + i) % KVC_FAST_RING_ENTS];
    uint64_t head = r->head;
    for (uint32_t i = 0; i < n; i++)
        e[(head + i) % KVC_FAST_RING_ENTS] = t[i % 4];
    __atomic_store_n(&r->head, head + n, __ATOMIC_RELEASE);
    kvci_fast_bell(c, head);
}

/* A client over its rate never waits for it: 1,000 SYNCs, each after half a ring of hits
 * written past its allowance (1,000 a second here), are answered at once, the excess
 * dropped, counted; every hit is counted once, read or dropped. (An answer held until the
 * rate allowed one entry more cost a millisecond of the loop's timer a SYNC: 32 fast gets of
 * 64 blocks each paid it once, the p99 of bench_scale's hit64_fast at 1.2 ms.) */
START_TEST(test_fast_sync_over_rate_no_wait)
{
    static const char *const args[] = {
        "-o", "host.size=16m", "-o", "host.page_size=64k", "-o", "server.fast_ring_rate=1000",
        NULL};
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_layout lay = daemon_layout("e2e-fast-over-rate", 16);
    struct kvc_key k[4];
    uint64_t fast0 = 0, drop0 = 0, fast = 0, dropped = 0;
    const int syncs = 1000;
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fp_put(ns, 7, 4, k);
    ck_assert_int_eq(fp_get_check(ns, k, 4), 4); /* maps the index and the ring */
    fp_settle(c, 4, &fast0, &drop0);
    uint64_t t0 = daemon_now_ms();
    for (int i = 0; i < syncs; i++) {
        fp_ring_fill(c, KVC_FAST_RING_ENTS / 2);
        kvci_fast_flush(c); /* the SYNC libkvc sends when half its ring is unread */
    }
    uint64_t ms = daemon_now_ms() - t0;
    uint64_t all = fast0 + drop0 + (uint64_t)syncs * (KVC_FAST_RING_ENTS / 2);
    fp_settle(c, all, &fast, &dropped);
    printf("e2e_fast: %d SYNCs over the rate in %llu ms: %llu hits counted, %llu dropped\n",
           syncs, (unsigned long long)ms, (unsigned long long)(fast - fast0),
           (unsigned long long)(dropped - drop0));
    ck_assert_uint_eq(fast + dropped, all);
    ck_assert_uint_gt(dropped - drop0, 0);
    ck_assert_uint_lt(ms, (uint64_t)daemon_ms(500)); /* a millisecond's wait each: >= 1,000 */
    kvc_disconnect(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* A client that asks for room (SYNC) waits for no other client's ring: FP_SYNC_CONNS
 * connections hold 4,000 unread hits each (under their rate), more than the loop's share
 * for the rings (a quarter of each 100 ms) reads in a window, and a last one asks for room
 * for its own 2,000 (the round robin, 16 entries of each ring at a time, comes to its last
 * ones after 512,000 of the others'). Its answer came once the share was spent, its unread entries skipped
 * and counted in fast_dropped; it did not wait, window after window, until the round robin
 * had come to all of its entries (every client of a host then copied its hits at the pace
 * of that quarter of one thread: bench_scale's clients_16_get1_fast at 0.08 of 16 cores).
 * Every hit written is counted once in the end, read or dropped. */
#define FP_SYNC_CONNS 256
START_TEST(test_fast_sync_waits_for_others)
{
    static const char *const args[] = {
        "-o", "host.size=16m", "-o", "host.page_size=64k", "-o", "server.max_clients_per_uid=512",
        NULL};
    struct daemon d = {0};
    static kvc_client *c[FP_SYNC_CONNS + 1];
    kvc_ns *ns[FP_SYNC_CONNS + 1];
    struct kvc_layout lay = daemon_layout("e2e-fast-sync", 16);
    struct kvc_key k[4];
    uint64_t fast0 = 0, drop0 = 0, fast = 0, dropped = 0;
    const uint32_t per = 2000, others = 4000, n = FP_SYNC_CONNS + 1;
    ck_assert_int_eq(daemon_start(&d, args), 0);
    for (uint32_t i = 0; i < n; i++) {
        ck_assert_int_eq(kvc_connect(d.sock, &c[i]), 0);
        ck_assert_int_eq(kvc_ns_open(c[i], &lay, &ns[i]), 0);
        if (i == 0)
            fp_put(ns[0], 5, 4, k);
        ck_assert_int_eq(fp_get_check(ns[i], k, 4), 4); /* maps its ring */
    }
    fp_settle(c[0], (uint64_t)n * 4, &fast0, &drop0);
    ck_assert_uint_eq(fast0, (uint64_t)n * 4);
    for (uint32_t i = 0; i < n; i++)
        fp_ring_fill(c[i], i < FP_SYNC_CONNS ? others : per);
    kvci_fast_flush(c[FP_SYNC_CONNS]); /* SYNC, as libkvc sends it when half its ring is unread */
    ck_assert_int_eq(daemon_client_stat(c[FP_SYNC_CONNS], 0, "fast_dropped", &dropped), 0);
    printf("e2e_fast: a SYNC among %d rings of %u unread hits: %llu of its own dropped\n",
           FP_SYNC_CONNS, per, (unsigned long long)(dropped - drop0));
    ck_assert_uint_gt(dropped - drop0, 0);
    ck_assert_uint_le(dropped - drop0, per);
    /* The others leave (their unread hits read or dropped, counted, as they go: a sanitizer
     * build reads a million entries too slowly to wait for them), c[0] stays to ask. */
    uint64_t all = fast0 + drop0 + (uint64_t)FP_SYNC_CONNS * others + per;
    for (uint32_t i = 1; i < n; i++)
        kvc_disconnect(c[i]);
    fp_settle(c[0], all, &fast, &dropped);
    ck_assert_uint_eq(fast + dropped, all);
    kvc_disconnect(c[0]);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* ---- torture: readers against eviction and slot reuse --------------------------------- */

struct fp_torture {
    const struct daemon *d;
    uint32_t family;
    int seconds;
    bool lossy;    /* a namespace that allows q8_0, smooth blocks checked within its bound */
    bool readback; /* the writer also reads back chains it put 8 to 15 chains ago */
};

static int fp_torture_open(const struct fp_torture *t, kvc_client **c, kvc_ns **ns)
{
    struct kvc_layout lay = daemon_layout(t->lossy ? "e2e-fast-lossy" : "e2e-fast-torture", 64);
    struct kvc_quant q = {.allowed = 1u << KVC_CODEC_Q8_0,
                          .k_codec = KVC_CODEC_Q8_0,
                          .v_codec = KVC_CODEC_Q8_0};
    if (kvc_connect(t->d->sock, c))
        return -1;
    return t->lossy ? kvc_ns_open_quant(*c, &lay, &q, ns) : kvc_ns_open(*c, &lay, ns);
}

static void fp_torture_fill(const struct fp_torture *t, const struct kvc_key *k, void *b,
                            size_t bb)
{
    if (t->lossy)
        daemon_smooth_fill(k, b, bb / 2);
    else
        daemon_block_fill(k, b, bb);
}

/* get_prefix of k[0..n): every hit is the block of its key (bit-exact, or within q8_0's
 * bound; another key's block is ~40 % off). The hits, or -1 after a message. */
static int fp_torture_get(const struct fp_torture *t, kvc_ns *ns, const struct kvc_key *k,
                          uint32_t n, void **dst)
{
    size_t bb = kvc_ns_block_bytes(ns);
    int h = kvc_get_prefix(ns, k, n, dst);
    for (int i = 0; i < h; i++) {
        if (t->lossy ? daemon_smooth_err(&k[i], dst[i], bb / 2) < 0.02
                     : daemon_block_check(&k[i], dst[i], bb) == -1)
            continue;
        fprintf(stderr, "e2e_fast: torture: hit %d is not the block of its key\n", i);
        return -1;
    }
    return h;
}

/* Reads its hot prefix (and re-puts it when it was evicted) in a tight loop, every hit
 * checked. */
static int fp_reader(void *arg)
{
    struct fp_torture *t = arg;
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key k[8];
    void *dst[8];
    const void *blk[8];
    uint64_t end = daemon_now_ms() + (uint64_t)t->seconds * 1000;
    long rounds = 0;
    if (fp_torture_open(t, &c, &ns) || daemon_chain_keys(ns, t->family, 0, 8, 8, k))
        return 2;
    size_t bb = kvc_ns_block_bytes(ns);
    for (int i = 0; i < 8; i++) {
        dst[i] = malloc(bb);
        blk[i] = malloc(bb);
        fp_torture_fill(t, &k[i], (void *)blk[i], bb);
    }
    while (daemon_now_ms() < end) {
        int h = fp_torture_get(t, ns, k, 8, dst);
        if (h < 0)
            return 1;
        if (h < 8)
            (void)kvc_put_prefix(ns, NULL, k, 8, blk); /* may find no room: fine */
        rounds++;
    }
    for (int i = 0; i < 8; i++) {
        free(dst[i]);
        free((void *)blk[i]);
    }
    kvc_disconnect(c);
    return rounds > 0 ? 0 : 4;
}

/* Puts new chains as fast as it can: the arena (16 MiB, 256 blocks of 64 KiB) turns over
 * constantly. With readback, it also gets an older chain (8 to 15 chains back: 256 to 480
 * blocks, out of memory by then, on disk where a disk tier holds it) after each put, every hit
 * checked, so blocks are read back from disk while the readers copy. */
static int fp_writer(void *arg)
{
    struct fp_torture *t = arg;
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key k[32];
    uint64_t end = daemon_now_ms() + (uint64_t)t->seconds * 1000;
    if (fp_torture_open(t, &c, &ns))
        return 2;
    size_t bb = kvc_ns_block_bytes(ns);
    const void *blk[32];
    void *dst[32];
    for (int i = 0; i < 32; i++) {
        blk[i] = malloc(bb);
        dst[i] = malloc(bb);
    }
    /* With readback, at least 24 chains (16 read back) however slow the host, in 30 s more. */
    for (uint32_t f = 1000;
         daemon_now_ms() < end || (t->readback && f < 1024 && daemon_now_ms() < end + 30000); f++) {
        if (daemon_chain_keys(ns, f, 0, 32, 32, k))
            return 3;
        for (int i = 0; i < 32; i++)
            fp_torture_fill(t, &k[i], (void *)blk[i], bb);
        (void)kvc_put_prefix(ns, NULL, k, 32, blk);
        if (t->readback && f >= 1008) {
            if (daemon_chain_keys(ns, f - 8 - f % 8, 0, 32, 32, k))
                return 3;
            if (fp_torture_get(t, ns, k, 32, dst) < 0)
                return 5;
        }
    }
    for (int i = 0; i < 32; i++) {
        free((void *)blk[i]);
        free(dst[i]);
    }
    kvc_disconnect(c);
    return 0;
}

/* Three readers and a writer for `secs`; every reader exits 0 (no wrong byte). */
static void fp_torture_run(struct daemon *d, bool lossy, bool readback, int secs)
{
    struct fp_torture rd[3], wr;
    pid_t pr[3], pw;
    for (int i = 0; i < 3; i++) {
        rd[i] = (struct fp_torture){.d = d, .family = (uint32_t)i, .seconds = secs, .lossy = lossy};
        pr[i] = daemon_child_spawn(fp_reader, &rd[i]);
        ck_assert_int_gt(pr[i], 0);
    }
    wr = (struct fp_torture){
        .d = d, .family = 0, .seconds = secs, .lossy = lossy, .readback = readback};
    pw = daemon_child_spawn(fp_writer, &wr);
    ck_assert_int_gt(pw, 0);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(daemon_child_wait(pr[i], daemon_ms(secs * 1000 + 30000), NULL), 0);
    ck_assert_int_eq(daemon_child_wait(pw, daemon_ms(secs * 1000 + 60000), NULL), 0);
}

START_TEST(test_fast_torture)
{
    static const char *const args[] = {"-o", "host.size=16m", "-o", "host.page_size=64k", "-o",
                                       "host.high_watermark=0.9", "-o", "host.low_watermark=0.5",
                                       NULL};
    struct daemon d = {0};
    uint64_t fast = 0, evicted = 0;
    ck_assert_int_eq(daemon_start(&d, args), 0);
    fp_torture_run(&d, false, false, 4);
    ck_assert_int_eq(daemon_stat(&d, "fast_hits", &fast), 0);
    ck_assert_int_eq(daemon_stat(&d, "evicted_blocks", &evicted), 0);
    fprintf(stderr, "e2e_fast: torture: %llu fast hits, %llu evictions\n",
            (unsigned long long)fast, (unsigned long long)evicted);
    ck_assert_uint_gt(fast, 0);
    ck_assert_uint_gt(evicted, 0);
    ck_assert_int_eq(daemon_roundtrip(&d), 0);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* The same with blocks quantized in place and written to and read back from a disk tier
 * (the writer reads back chains that left memory): every move frees a slot that readers may
 * be copying, and promotions take slots that readers were copying from. */
START_TEST(test_fast_torture_moves)
{
    struct daemon d = {0};
    char o_disk[DAEMON_PATH_MAX + 32];
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    snprintf(o_disk, sizeof(o_disk), "disk.path=%s/disk", d.dir);
    const char *const args[] = {"-o", "host.size=16m", "-o", "host.page_size=64k", "-o",
                                "host.high_watermark=0.9", "-o", "host.low_watermark=0.6", "-o",
                                "cache.policy=lru", "-o", o_disk, "-o", "disk.capacity=64m",
                                NULL};
    uint64_t fast = 0, quant = 0, promoted = 0, demoted = 0;
    ck_assert_int_eq(daemon_start(&d, args), 0);
    fp_torture_run(&d, true, true, 5);
    ck_assert_int_eq(daemon_stat(&d, "fast_hits", &fast), 0);
    ck_assert_int_eq(daemon_stat(&d, "quantized_blocks", &quant), 0);
    ck_assert_int_eq(daemon_stat(&d, "demoted_blocks", &demoted), 0);
    ck_assert_int_eq(daemon_stat(&d, "promoted_blocks", &promoted), 0);
    fprintf(stderr,
            "e2e_fast: torture with moves: %llu fast hits, %llu quantized, %llu demoted, %llu "
            "promoted\n",
            (unsigned long long)fast, (unsigned long long)quant, (unsigned long long)demoted,
            (unsigned long long)promoted);
    ck_assert_uint_gt(fast, 0);
    ck_assert_uint_gt(quant, 0);
    ck_assert_uint_gt(demoted, 0);
    ck_assert_uint_gt(promoted, 0);
    ck_assert_int_eq(daemon_roundtrip(&d), 0);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* A reader stopped (SIGSTOP) or killed in its copy loop holds nothing the daemon waits for:
 * while it is stopped, puts of twice the arena evict its blocks and reuse their slots (a
 * daemon that waited for readers would keep them, or fail the puts). */
START_TEST(test_fast_stopped_reader)
{
    struct daemon d = {0};
    struct fp_torture rd = {.family = 7, .seconds = 30};
    struct kvc_layout lay = daemon_layout("e2e-fast-torture", 64);
    struct kvc_key hot[8], fill[FP_BLOCKS * 4];
    uint64_t ev0 = 0, ev1 = 0;
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l = NULL;
    int sig = 0;
    ck_assert_int_eq(daemon_start(&d, fp_args), 0);
    rd.d = &d;
    pid_t p = daemon_child_spawn(fp_reader, &rd);
    ck_assert_int_gt(p, 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    ck_assert_int_eq(daemon_chain_keys(ns, rd.family, 0, 8, 8, hot), 0);
    /* Its prefix cached and read through the index, then stopped in its loop. */
    for (int i = 0; i < 500 && kvc_lookup(ns, hot, 8, 0, &l) != 8; i++) {
        kvc_release(l);
        l = NULL;
        usleep(10000);
    }
    ck_assert_ptr_nonnull(l);
    kvc_release(l);
    ck_assert_int_eq(kvc_flush(c), 0); /* our pins gone for every connection's view */
    usleep(200000);
    /* Stopped in its copy through the index, which pins nothing. A get that fell back to the
     * socket (a block being moved) holds its lease's pins until its release, stopped or not:
     * such a stop is let go on and taken again a moment later. */
    uint64_t pins = 1;
    for (int i = 0; i < 200 && pins; i++) {
        ck_assert_int_eq(kill(p, SIGSTOP), 0);
        ck_assert_int_eq(daemon_stat(&d, "pins_now", &pins), 0);
        if (pins) {
            ck_assert_int_eq(kill(p, SIGCONT), 0);
            usleep(1000 + 100 * (useconds_t)i);
        }
    }
    ck_assert_uint_eq(pins, 0);
    /* The hits it wrote to its ring before the stop are read by the daemon's passes: they
     * touch its blocks, so they are counted before the puts (fast_hits stops moving), not
     * in the middle of them. */
    uint64_t fh = 0, fh0 = UINT64_MAX;
    for (int i = 0; i < 100 && fh != fh0; i++) {
        fh0 = fh;
        usleep(20000);
        ck_assert_int_eq(daemon_stat(&d, "fast_hits", &fh), 0);
    }
    ck_assert_int_eq(daemon_stat(&d, "evicted_blocks", &ev0), 0);
    /* 512 blocks of 64 KiB through a 16 MiB arena (256 of them), under LRU. */
    for (uint32_t r = 0; r < 8; r++)
        fp_put(ns, 0x700 + r, FP_BLOCKS * 4, fill);
    ck_assert_int_eq(daemon_stat(&d, "evicted_blocks", &ev1), 0);
    ck_assert_uint_gt(ev1 - ev0, 256);
    ck_assert_int_eq(kvc_lookup(ns, hot, 8, 0, &l), 0); /* its blocks went */
    kvc_disconnect(c);
    for (int i = 0; i < 20; i++) /* puts and hits go on around it */
        ck_assert_int_eq(daemon_roundtrip(&d), 0);
    ck_assert_int_eq(kill(p, SIGKILL), 0);
    daemon_child_wait(p, daemon_ms(5000), &sig);
    ck_assert_int_eq(sig, SIGKILL);
    ck_assert_int_eq(daemon_roundtrip(&d), 0);
    ck_assert(daemon_alive(&d));
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* A client writes made-up hits into its ring: other namespaces, blocks that do not exist,
 * a head far ahead. Each is refused and counted; nothing else moves. The index it was given
 * cannot be made writable. */
START_TEST(test_fast_ring_lies)
{
    struct daemon d = {0};
    kvc_client *c, *v;
    kvc_ns *ns, *vns;
    struct kvc_layout lay = daemon_layout("e2e-fast-liar", 16);
    struct kvc_layout vlay = daemon_layout("e2e-fast-victim", 16);
    struct kvc_key k[4], vk[4];
    uint64_t refused = 0, hits = 0, vhits = 0;
    ck_assert_int_eq(daemon_start(&d, fp_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &v), 0);
    ck_assert_int_eq(kvc_ns_open(v, &vlay, &vns), 0);
    fp_put(vns, 21, 4, vk);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fp_put(ns, 20, 4, k);
    ck_assert_int_eq(fp_get_check(ns, k, 4), 4); /* maps the index and the ring */
    ck_assert_ptr_nonnull(c->ring);
    ck_assert_int_eq(c->fast[0].state, 1); /* no access lists: everything in arena 0 */
    ck_assert_int_eq(daemon_client_stat(c, kvc_ns_id(vns), "hit_blocks", &vhits), 0);
    struct kvc_fast_ring *r = c->ring;
    struct kvc_fast_hit *e = (struct kvc_fast_hit *)(r + 1);
    uint64_t head = r->head;
    /* a namespace it never opened; a block index past the pool; a key of nothing; ns 0 */
    e[head++ % KVC_FAST_RING_ENTS] =
        (struct kvc_fast_hit){.ns = kvc_ns_id(vns), .block = 0, .klo = vk[0].lo, .khi = vk[0].hi,
                              .nkeys = 1};
    e[head++ % KVC_FAST_RING_ENTS] = (struct kvc_fast_hit){
        .ns = kvc_ns_id(ns), .block = 0x7fffffff, .klo = 1, .khi = 2, .nkeys = 1};
    e[head++ % KVC_FAST_RING_ENTS] =
        (struct kvc_fast_hit){.ns = 0, .block = 0, .klo = k[0].lo, .khi = k[0].hi, .nkeys = 9};
    e[head++ % KVC_FAST_RING_ENTS] =
        (struct kvc_fast_hit){.ns = 65535, .block = 1, .klo = 0, .khi = 0, .nkeys = 0};
    __atomic_store_n(&r->head, head, __ATOMIC_RELEASE);
    ck_assert_int_eq(daemon_client_stat(c, 0, "fast_refused", &refused), 0);
    ck_assert_uint_eq(refused, 4);
    /* the victim's namespace took no hit from it */
    ck_assert_int_eq(daemon_client_stat(v, kvc_ns_id(vns), "hit_blocks", &hits), 0);
    ck_assert_uint_eq(hits, vhits);
    /* a head far ahead: at most a ring's worth is read, all garbage (zeros: ns 0) */
    __atomic_store_n(&r->head, head + (1ull << 40), __ATOMIC_RELEASE);
    ck_assert_int_eq(daemon_client_stat(c, 0, "fast_refused", &refused), 0);
    ck_assert_uint_le(refused, 4 + KVC_FAST_RING_ENTS);
    ck_assert_int_eq(daemon_roundtrip(&d), 0);
    /* the index is read-only for clients */
    struct kvc_fastview *m = c->fast[0].view;
    ck_assert_int_eq(mprotect((void *)m->map, m->bytes, PROT_READ | PROT_WRITE), -1);
    ck_assert_int_eq(errno, EACCES);
    kvc_disconnect(c);
    kvc_disconnect(v);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* A namespace dropped and its id given to another layout: a client still holding the old
 * one finds nothing of the new one through the index. */
START_TEST(test_fast_ns_reused)
{
    struct daemon d = {0};
    kvc_client *a, *b;
    kvc_ns *na, *nb;
    struct kvc_layout la = daemon_layout("e2e-fast-a", 16), lb = daemon_layout("e2e-fast-b", 16);
    struct kvc_key k[4];
    char out[4096], err[4096], id[16];
    ck_assert_int_eq(daemon_start(&d, fp_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &a), 0);
    ck_assert_int_eq(kvc_ns_open(a, &la, &na), 0);
    fp_put(na, 30, 4, k);
    ck_assert_int_eq(fp_get_check(na, k, 4), 4);
    snprintf(id, sizeof(id), "%u", kvc_ns_id(na));
    ck_assert_int_eq(daemon_kvcctl(&d, out, sizeof(out), err, sizeof(err), "ns", "drop", id,
                                   NULL),
                     0);
    ck_assert_int_eq(kvc_connect(d.sock, &b), 0);
    ck_assert_int_eq(kvc_ns_open(b, &lb, &nb), 0);
    ck_assert_uint_eq(kvc_ns_id(nb), kvc_ns_id(na)); /* the id came back */
    /* the same keys under the new namespace */
    size_t bb = kvc_ns_block_bytes(nb);
    const void *blk[4];
    for (int i = 0; i < 4; i++) {
        void *x = malloc(bb);
        memset(x, 0xab, bb);
        blk[i] = x;
    }
    ck_assert_int_eq(kvc_put_prefix(nb, NULL, k, 4, blk), 4);
    for (int i = 0; i < 4; i++)
        free((void *)blk[i]);
    void *dst[4];
    for (int i = 0; i < 4; i++)
        dst[i] = calloc(1, bb);
    ck_assert_int_le(kvc_get_prefix(na, k, 4, dst), 0);
    for (int i = 0; i < 4; i++)
        free(dst[i]);
    kvc_disconnect(a);
    kvc_disconnect(b);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* The daemon dies while a client only copies through the index: within a ring's worth of
 * hits the client asks the daemon to read its ring, finds the connection dead and says so,
 * instead of serving an orphaned index for ever. */
START_TEST(test_fast_daemon_gone)
{
    struct daemon d = {0};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_layout lay = daemon_layout("e2e-fast-gone", 16);
    struct kvc_key k[FP_BLOCKS];
    int rc = 0, i;
    ck_assert_int_eq(daemon_start(&d, fp_args), 0);
    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    fp_put(ns, 40, FP_BLOCKS, k);
    ck_assert_int_eq(fp_get_check(ns, k, FP_BLOCKS), FP_BLOCKS);
    ck_assert_int_eq(kill(d.pid, SIGKILL), 0);
    daemon_child_wait(d.pid, daemon_ms(5000), NULL);
    d.pid = 0;
    for (i = 0; i < (int)(2 * KVC_FAST_RING_ENTS / FP_BLOCKS) && rc >= 0; i++)
        rc = fp_get_check(ns, k, FP_BLOCKS);
    ck_assert_int_lt(rc, 0);
    kvc_disconnect(c);
    daemon_cleanup(&d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_fast");
    TCase *tc = tcase_create("fast");
    /* The long cases, whose threads and tiers the others share: the TSan run with I/O
     * threads leaves them out (CK_EXCLUDE_TAGS=long, tests/run-checks.sh). */
    TCase *tl = tcase_create("fast_long");
    if (daemon_suite_init("e2e_fast"))
        return 1;
    tcase_set_timeout(tc, daemon_slow() * 120);
    tcase_set_timeout(tl, daemon_slow() * 120);
    tcase_set_tags(tl, "long");
    tcase_add_test(tc, test_fast_hits_counted);
    tcase_add_test(tc, test_fast_published_before_next_answer);
    tcase_add_test(tc, test_fast_index_huge_advice);
    tcase_add_test(tc, test_arena_and_index_on_huge_pages);
    tcase_add_test(tc, test_lookup_resolves_once);
    tcase_add_test(tc, test_fast_hits_counted_at_disconnect);
    tcase_add_test(tc, test_fast_off_in_daemon);
    tcase_add_test(tc, test_fast_hits_keep_blocks);
    tcase_add_test(tc, test_fast_hits_before_eviction);
    tcase_add_test(tc, test_fast_bell_many_idle);
    tcase_add_test(tc, test_fast_sync_with_eviction);
    tcase_add_test(tc, test_fast_threads_never_fall_back);
    tcase_add_test(tl, test_fast_ring_rate);
    tcase_add_test(tl, test_fast_sync_over_rate_no_wait);
    tcase_add_test(tc, test_fast_ring_steps);
    tcase_add_test(tc, test_fast_sync_waits_for_others);
    tcase_add_test(tc, test_fast_torture);
    tcase_add_test(tl, test_fast_torture_moves);
    tcase_add_test(tc, test_fast_stopped_reader);
    tcase_add_test(tc, test_fast_ring_lies);
    tcase_add_test(tc, test_fast_ns_reused);
    tcase_add_test(tc, test_fast_daemon_gone);
    tcase_add_test(tc, test_fast_full_arena_4k);
    tcase_add_test(tc, test_fast_refuses_spans);
    tcase_add_test(tc, test_span_lookup_resolves_once);
    suite_add_tcase(s, tc);
    suite_add_tcase(s, tl);
    return daemon_suite_run(s);
}
