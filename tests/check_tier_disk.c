/*
 * check_tier_disk.c — the disk tier's records: the conformance cases (as the host tier runs
 * them), then what only the disk promises: records survive a reopen, a flipped byte or a
 * stale location is refused, a torn record is never reported intact, the start-up walk finds
 * every record, the write rate is bounded, block bytes shaped like a header are never taken
 * for one, a record allocated and freed unwritten leaves no hole, compressed records round
 * trip byte-exact, survive a reopen and refuse a flipped byte, incompressible blocks are
 * stored raw, and the queue depth bounds the records on the device. The index checkpoint
 * and the hardening of the path are check_tier_disk_open's.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "tests/lib/daemon.h"
#include "tests/lib/disk_fixture.h"
#include "tests/lib/tier_conformance.h"
#include "tiers/disk.h"

/* One record per 128 KiB page at `block` bytes, so freeing any block frees its page. */
static struct tier *factory(uint64_t capacity, void *arg)
{
    char path[300];
    (void)arg;
    disk_path(path, sizeof(path));
    struct tier *t = disk_open(path, capacity, 128 * KiB, NULL);
    unlink(path); /* the descriptor keeps it */
    return t;
}

static void drain(struct tier *t, void *arg)
{
    (void)arg;
    tier_disk_drain(t);
}

START_TEST(test_record_roundtrip_and_reopen)
{
    char path[300];
    const uint64_t len = 200 * KiB + 3;
    uint8_t *src = aligned_alloc(4096, 256 * KiB), *dst = aligned_alloc(4096, 256 * KiB);
    struct tier_loc loc[5];
    struct found f = {0};
    struct tier *t;
    disk_path(path, sizeof(path));
    t = disk_open(path, 4 * MiB, 1 * MiB, NULL);
    for (int i = 0; i < 5; i++) {
        struct tier_disk_meta m = disk_meta((uint64_t)i + 1, len);
        disk_fill(src, len, (unsigned)i);
        ck_assert_int_eq(t->ops->alloc(t, len, &loc[i]), 0);
        ck_assert_int_eq(disk_put(t, &loc[i], &m, src), 0);
        memset(dst, 0, 256 * KiB);
        ck_assert_int_eq(disk_get(t, &loc[i], &m, dst, 256 * KiB), 0);
        ck_assert_int_eq(memcmp(src, dst, len), 0);
    }
    /* One dead record: not found again. */
    t->ops->free(t, &loc[2]);
    tier_destroy(t);
    t = disk_open(path, 4 * MiB, 1 * MiB, &f);
    ck_assert_int_eq(f.n, 5); /* the freed record is still intact on the device */
    for (int i = 0; i < f.n; i++) {
        uint64_t k = f.m[i].key[0];
        struct tier_disk_meta m = disk_meta(k, len);
        m.stored = len; /* raw: what the scan reports */
        ck_assert_int_eq(memcmp(&f.m[i], &m, sizeof(m)), 0);
        ck_assert_int_eq(disk_get(t, &f.loc[i], &m, dst, 256 * KiB), 0);
        disk_fill(src, len, (unsigned)(k - 1));
        ck_assert_int_eq(memcmp(src, dst, len), 0);
    }
    /* New records get newer page versions than anything found. */
    struct tier_loc nl;
    ck_assert_int_eq(t->ops->alloc(t, len, &nl), 0);
    for (int i = 0; i < f.n; i++)
        ck_assert_uint_gt(nl.cls, f.loc[i].cls);
    tier_destroy(t);
    unlink(path);
    free(src);
    free(dst);
}
END_TEST

START_TEST(test_checksum_flip)
{
    char path[300];
    const uint64_t len = 64 * KiB;
    uint8_t *src = aligned_alloc(4096, len), *dst = aligned_alloc(4096, len);
    struct tier_disk_meta m = disk_meta(9, len), other = disk_meta(10, len);
    struct tier_disk_stats st;
    struct tier_loc loc;
    struct tier *t;
    int fd;
    disk_path(path, sizeof(path));
    t = disk_open(path, 2 * MiB, 1 * MiB, NULL);
    disk_fill(src, len, 3);
    ck_assert_int_eq(t->ops->alloc(t, len, &loc), 0);
    ck_assert_int_eq(disk_put(t, &loc, &m, src), 0);
    /* the wrong key is refused */
    ck_assert_int_eq(disk_get(t, &loc, &other, dst, len), -EBADMSG);
    /* flip one byte in the data behind the tier's back */
    fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint8_t b;
    ck_assert_int_eq(pread(fd, &b, 1, (off_t)(TIER_DISK_SB + loc.off) + 1000), 1);
    b ^= 0x40;
    ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)(TIER_DISK_SB + loc.off) + 1000), 1);
    fsync(fd);
    close(fd);
    ck_assert_int_eq(disk_get(t, &loc, &m, dst, len), -EBADMSG);
    tier_disk_stats_get(t, &st);
    ck_assert_uint_eq(st.checksum_failures, 2);
    /* a stale location (the page reused under a new version) fails the cheap check */
    struct tier_loc stale = loc;
    stale.cls++;
    ck_assert_int_eq(disk_get(t, &stale, &m, dst, len), -EINVAL);
    tier_destroy(t);
    unlink(path);
    free(src);
    free(dst);
}
END_TEST

START_TEST(test_torn_record_not_found)
{
    char path[300];
    const uint64_t len = 64 * KiB;
    uint8_t *src = aligned_alloc(4096, len), *dst = aligned_alloc(4096, len);
    struct tier_disk_meta m1 = disk_meta(1, len), m2 = disk_meta(2, len);
    struct tier_loc l1, l2;
    struct found f = {0};
    struct tier *t;
    int fd;
    disk_path(path, sizeof(path));
    t = disk_open(path, 2 * MiB, 1 * MiB, NULL);
    disk_fill(src, len, 1);
    ck_assert_int_eq(t->ops->alloc(t, len, &l1), 0);
    ck_assert_int_eq(disk_put(t, &l1, &m1, src), 0);
    ck_assert_int_eq(t->ops->alloc(t, len, &l2), 0);
    ck_assert_int_eq(disk_put(t, &l2, &m2, src), 0);
    tier_destroy(t);
    /* the second record's data cut off half way: its header is intact, its data is not */
    fd = open(path, O_RDWR);
    uint8_t *zero = calloc(1, len / 2);
    ck_assert_int_eq(pwrite(fd, zero, len / 2, (off_t)(TIER_DISK_SB + l2.off + len / 2)),
                     (ssize_t)(len / 2));
    close(fd);
    free(zero);
    t = disk_open(path, 2 * MiB, 1 * MiB, &f);
    ck_assert_int_eq(f.n, 2);
    /* found by the scan, refused by the read: never served */
    ck_assert_int_eq(disk_get(t, &f.loc[0], &f.m[0], dst, len), f.m[0].key[0] == 1 ? 0 : -EBADMSG);
    ck_assert_int_eq(disk_get(t, &f.loc[1], &f.m[1], dst, len), f.m[1].key[0] == 1 ? 0 : -EBADMSG);
    tier_destroy(t);
    /* a torn header ends the page's chain */
    fd = open(path, O_RDWR);
    uint8_t junk[64];
    memset(junk, 0xa5, sizeof(junk));
    ck_assert_int_eq(
        pwrite(fd, junk, sizeof(junk), (off_t)(TIER_DISK_SB + l2.off - TIER_DISK_HDR + 40)), 64);
    close(fd);
    f.n = 0;
    t = disk_open(path, 2 * MiB, 1 * MiB, &f);
    ck_assert_int_eq(f.n, 1);
    ck_assert_uint_eq(f.m[0].key[0], 1);
    tier_destroy(t);
    unlink(path);
    free(src);
    free(dst);
}
END_TEST

/* Every record found by a walk, by key (keys 1..max). */
struct walk_found {
    uint64_t max, n, dup;
    struct tier_loc *loc; /* [key]; len 0: not found */
    uint64_t *len;        /* [key]: the record's length in memory */
};

static int walk_found_cb(void *arg, const struct tier_disk_meta *m, const struct tier_loc *loc)
{
    struct walk_found *w = arg;
    uint64_t k = m->key[0];
    if (k == 0 || k > w->max || m->key[1] != ~k || m->depth != (uint32_t)k)
        return 1;
    if (w->loc[k].len)
        w->dup++;
    w->loc[k] = *loc;
    w->len[k] = m->len;
    w->n++;
    return 0;
}

/* A start without a checkpoint walks every page's chain through windows of headers (small
 * records, many per read, chains crossing windows) or header by header (large records), many
 * pages at once: every committed record is found once, at its location, with its metadata,
 * in far fewer reads than records; a torn header ends its page's chain there (the records
 * behind it on that page are not found, every other page's are); a record whose data is torn
 * is found and then refused when read. */
START_TEST(test_walk_finds_every_record)
{
    enum { SMALL = 900, LARGE = 6, MAXK = SMALL + LARGE + 40 };
    char path[300];
    const uint64_t small = 12 * KiB + 5, large = 1536 * KiB;
    uint8_t *src = aligned_alloc(4096, large), *dst = aligned_alloc(4096, large);
    struct tier_disk_config cfg = {
        .npaths = 1, .size = 64 * MiB, .page_size = 4 * MiB, .queue_depth = 8, .ckpt_path = ""};
    static struct tier_loc locs[MAXK + 1], wl[MAXK + 1];
    static uint64_t wlen[MAXK + 1];
    struct walk_found w = {.max = MAXK, .loc = wl, .len = wlen};
    struct tier_disk_stats st;
    uint64_t k = 0, torn_key;
    struct tier *t;
    int err = 0, fd;
    disk_fresh_path(path, sizeof(path));
    cfg.paths[0] = path;
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_nonnull(t);
    /* small records over several pages, a page of large ones, then both mixed */
    for (int i = 0; i < SMALL; i++) {
        struct tier_disk_meta m = disk_meta(++k, small);
        disk_fill(src, small, (unsigned)k);
        ck_assert_int_eq(t->ops->alloc(t, small, &locs[k]), 0);
        ck_assert_int_eq(disk_put(t, &locs[k], &m, src), 0);
    }
    for (int i = 0; i < LARGE + 40; i++) {
        uint64_t len = i < LARGE || i % 8 == 0 ? large : small;
        struct tier_disk_meta m = disk_meta(++k, len);
        disk_fill(src, len, (unsigned)k);
        ck_assert_int_eq(t->ops->alloc(t, len, &locs[k]), 0);
        ck_assert_int_eq(disk_put(t, &locs[k], &m, src), 0);
    }
    ck_assert_uint_eq(k, MAXK);
    tier_destroy(t);
    cfg.scan = walk_found_cb;
    cfg.scan_arg = &w;
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_nonnull(t);
    tier_disk_stats_get(t, &st);
    ck_assert(!st.ckpt_loaded);
    ck_assert_uint_eq(w.n, MAXK);
    ck_assert_uint_eq(w.dup, 0);
    ck_assert_uint_eq(st.records_walked, MAXK);
    for (k = 1; k <= MAXK; k++) {
        ck_assert_uint_eq(wl[k].off, locs[k].off);
        ck_assert_uint_eq(wl[k].len, locs[k].len);
        ck_assert_uint_eq(wl[k].cls, locs[k].cls);
    }
    /* windows: the small records' headers came dozens to a read */
    ck_assert_uint_lt(st.start_reads, MAXK / 4);
    ck_assert_uint_gt(st.start_bytes, 0);
    /* each reads back intact from where the walk found it */
    for (k = 1; k <= MAXK; k += 37) {
        struct tier_disk_meta m = disk_meta(k, wlen[k]);
        ck_assert_int_eq(disk_get(t, &wl[k], &m, dst, large), 0);
        disk_fill(src, wlen[k], (unsigned)k);
        ck_assert_int_eq(memcmp(src, dst, wlen[k]), 0);
    }
    tier_destroy(t);
    /* a torn header in the middle of the second page: its chain ends there */
    torn_key = 0;
    for (k = 1; k <= MAXK && !torn_key; k++)
        if (locs[k].off / (4 * MiB) == 1 && locs[k].off % (4 * MiB) > 2 * MiB)
            torn_key = k;
    ck_assert_uint_gt(torn_key, 0);
    fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint8_t junk[64];
    memset(junk, 0xa5, sizeof(junk));
    ck_assert_int_eq(pwrite(fd, junk, sizeof(junk),
                            (off_t)(TIER_DISK_SB + locs[torn_key].off - TIER_DISK_HDR + 40)),
                     64);
    /* and the data of the last small record torn: found, then refused when read */
    ck_assert_int_eq(pwrite(fd, junk, sizeof(junk), (off_t)(TIER_DISK_SB + locs[MAXK].off + 100)),
                     64);
    close(fd);
    memset(wl, 0, sizeof(wl));
    w.n = w.dup = 0;
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_nonnull(t);
    for (k = 1; k <= MAXK; k++) {
        bool lost = locs[k].off / (4 * MiB) == 1 && locs[k].off >= locs[torn_key].off;
        ck_assert_msg((wl[k].len != 0) == !lost, "record %llu: found %d, torn behind %llu",
                      (unsigned long long)k, wl[k].len != 0, (unsigned long long)torn_key);
    }
    {
        struct tier_disk_meta m = disk_meta(MAXK, wlen[MAXK]);
        ck_assert_uint_ne(wl[MAXK].len, 0);
        ck_assert_int_eq(disk_get(t, &wl[MAXK], &m, dst, large), -EBADMSG);
    }
    tier_destroy(t);
    unlink(path);
    free(src);
    free(dst);
}
END_TEST

START_TEST(test_fixed_buffers_and_rate)
{
    char path[300];
    const uint64_t len = 256 * KiB, rec = tier_disk_record_bytes(len);
    uint8_t *arena = aligned_alloc(4096, 4 * MiB);
    struct tier_disk_config cfg = {.paths = {path},
                                   .npaths = 1,
                                   .size = 8 * MiB,
                                   .page_size = 1 * MiB,
                                   .queue_depth = 32, /* refusals come from the rate alone */
                                   .write_rate = 1 * MiB};
    struct tier_disk_stats st;
    struct tier_loc loc[16];
    struct done d[16];
    int err, accepted = 0, refused = 0;
    struct tier *t;
    disk_path(path, sizeof(path));
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(tier_disk_buffers_register(t, arena, 4 * MiB), 0);
    disk_fill(arena, 4 * MiB, 5);
    /* The bucket holds one page (1 MiB) at start and refills at 1 MiB/s: puts are accepted
     * until the budget runs out, whatever the speed of this loop, and never beyond it. */
    uint64_t t0 = daemon_now_ms();
    for (int i = 0; i < 16 && !refused; i++) {
        struct tier_disk_meta m = disk_meta((uint64_t)i + 1, len);
        d[i] = (struct done){0, -1};
        ck_assert_int_eq(t->ops->alloc(t, len, &loc[i]), 0);
        int rc =
            tier_disk_put(t, &loc[i], &m, arena + (uint64_t)(i % 8) * len, disk_done_cb, &d[i]);
        if (rc == 0) {
            accepted++;
        } else {
            ck_assert_int_eq(rc, -EAGAIN);
            refused++;
            t->ops->free(t, &loc[i]);
        }
    }
    double budget = 1.0 * MiB + (double)(daemon_now_ms() - t0 + 1) * 1e-3 * MiB;
    tier_disk_drain(t);
    ck_assert_int_ge(accepted, 1);
    ck_assert_msg((double)accepted * rec <= budget + rec,
                  "%d records of %llu B in a budget of %.0f B", accepted, (unsigned long long)rec,
                  budget);
    ck_assert_msg(refused || budget >= 16.0 * rec, "no refusal within a budget of %.0f B", budget);
    tier_disk_stats_get(t, &st);
    ck_assert(st.fixed_buffers);
    ck_assert_uint_eq(st.writes, (uint64_t)accepted);
    ck_assert_uint_ge(st.throttled, (uint64_t)refused);
    /* read back into the arena (fixed buffers) */
    struct tier_disk_meta m0 = disk_meta(1, len);
    ck_assert_int_eq(disk_get(t, &loc[0], &m0, arena + 3 * MiB, len), 0);
    ck_assert_int_eq(memcmp(arena, arena + 3 * MiB, len), 0);
    tier_destroy(t);
    unlink(path);
    free(arena);
}
END_TEST

START_TEST(test_pages_reclaimed)
{
    char path[300];
    const uint64_t len = 100 * KiB;
    struct tier_disk_stats st;
    struct tier_loc loc[64];
    struct tier *t;
    int n = 0;
    disk_path(path, sizeof(path));
    t = disk_open(path, 2 * MiB, 512 * KiB, NULL);
    while (n < 64 && t->ops->alloc(t, len, &loc[n]) == 0)
        n++;
    ck_assert_int_eq(n, 4 * 4); /* 4 pages of 4 records of 104 KiB */
    tier_disk_stats_get(t, &st);
    ck_assert_uint_eq(st.pages_free, 0);
    /* half of every page dead: nothing comes back, the dead bytes are counted */
    for (int i = 0; i < n; i += 2)
        t->ops->free(t, &loc[i]);
    struct tier_loc x;
    ck_assert_int_eq(t->ops->alloc(t, len, &x), -ENOSPC);
    tier_disk_stats_get(t, &st);
    ck_assert_uint_ge(st.dead_bytes, 3 * 2 * (len + 4 * KiB) - 8 * KiB);
    /* the rest of page 0 dies: it is free again */
    t->ops->free(t, &loc[1]);
    t->ops->free(t, &loc[3]);
    tier_disk_stats_get(t, &st);
    ck_assert_uint_eq(st.pages_free, 1);
    ck_assert_int_eq(t->ops->alloc(t, len, &x), 0);
    tier_destroy(t);
    unlink(path);
}
END_TEST

/* The record header as the device holds it (disk.c), rebuilt the way a client could. */
struct forged_hdr {
    uint64_t magic;
    uint32_t format, page_version;
    uint64_t len, data_csum, key[2], parent[2];
    uint32_t depth, codec;
    uint8_t ns[TIER_DISK_NS_BYTES];
    uint64_t raw_len;
    uint32_t block_format, reserved;
    uint64_t hdr_csum;
};

/* A client writes a perfect header (right magic, format, version to come, checksum as
 * anyone could compute it) into its block; the page is reused and the new chain ends right
 * where those bytes lie. The start-up walk must not take them for a record. */
START_TEST(test_forged_header_in_stale_page)
{
    char path[300];
    uint8_t *src = aligned_alloc(4096, MiB);
    struct tier_loc a, b, c, dl;
    struct found f = {0};
    struct tier *t;
    struct forged_hdr *h;
    memset(src, 0x11, MiB);
    disk_path(path, sizeof(path));
    t = disk_open(path, 2 * MiB, 1 * MiB, NULL);
    /* page 0 (version 1): A, 200 KiB at data offset 4 KiB; its bytes at 56 KiB lie at page
     * offset 60 KiB, where the next header goes once D (56 KiB) is the page's first record */
    ck_assert_int_eq(t->ops->alloc(t, 200 * KiB, &a), 0);
    h = (struct forged_hdr *)(src + 56 * KiB);
    for (int seed = 0; seed < 2; seed++) {
        struct forged_hdr *x = seed ? (struct forged_hdr *)(src + 120 * KiB) : h;
        memset(x, 0, sizeof(*x));
        *x = (struct forged_hdr){.magic = 0x4b564344424c4b31ull,
                                 .format = 3,
                                 .page_version = 3,
                                 .len = 4 * KiB,
                                 .raw_len = 4 * KiB,
                                 .key = {666, 0},
                                 .depth = 0};
        x->data_csum = XXH3_64bits(src, 4 * KiB);
        x->hdr_csum = seed ? XXH3_64bits_withSeed(x, offsetof(struct forged_hdr, hdr_csum), 0)
                           : XXH3_64bits(x, offsetof(struct forged_hdr, hdr_csum));
    }
    struct tier_disk_meta ma = disk_meta(1, 200 * KiB), mb = disk_meta(2, 800 * KiB),
                          mc = disk_meta(3, 1000 * KiB), md = disk_meta(4, 56 * KiB);
    ck_assert_int_eq(disk_put(t, &a, &ma, src), 0);
    ck_assert_int_eq(t->ops->alloc(t, 800 * KiB, &b), 0);
    ck_assert_int_eq(disk_put(t, &b, &mb, src), 0);
    /* page 1 (version 2): C fills it */
    ck_assert_int_eq(t->ops->alloc(t, 1000 * KiB, &c), 0);
    ck_assert_uint_eq(c.cls, 2);
    ck_assert_int_eq(disk_put(t, &c, &mc, src), 0);
    t->ops->free(t, &a);
    t->ops->free(t, &b);
    /* page 0 again, version 3: D, then the stale bytes of A */
    ck_assert_int_eq(t->ops->alloc(t, 56 * KiB, &dl), 0);
    ck_assert_uint_eq(dl.cls, 3);
    ck_assert_uint_eq(dl.off % MiB, 4 * KiB);
    ck_assert_int_eq(disk_put(t, &dl, &md, src), 0);
    tier_destroy(t);
    t = disk_open(path, 2 * MiB, 1 * MiB, &f);
    ck_assert_int_eq(f.n, 2);
    ck_assert(disk_found_has(&f, 3) && disk_found_has(&f, 4));
    ck_assert(!disk_found_has(&f, 666));
    tier_destroy(t);
    unlink(path);
    free(src);
}
END_TEST

/* A record allocated, never written, then freed (the write could not start) gives its
 * room back, so the records after it are found at the next start. */
START_TEST(test_unwritten_record_leaves_no_hole)
{
    char path[300];
    const uint64_t len = 64 * KiB;
    uint8_t *src = aligned_alloc(4096, len);
    struct tier_loc a, b, c;
    struct found f = {0};
    struct tier *t;
    struct tier_disk_meta ma = disk_meta(1, len), mc = disk_meta(3, len);
    disk_fill(src, len, 5);
    disk_path(path, sizeof(path));
    t = disk_open(path, 2 * MiB, 1 * MiB, NULL);
    ck_assert_int_eq(t->ops->alloc(t, len, &a), 0);
    ck_assert_int_eq(disk_put(t, &a, &ma, src), 0);
    ck_assert_int_eq(t->ops->alloc(t, len, &b), 0);
    t->ops->free(t, &b);
    ck_assert_int_eq(t->ops->alloc(t, len, &c), 0);
    ck_assert_uint_eq(c.off, b.off); /* the room came back */
    ck_assert_int_eq(disk_put(t, &c, &mc, src), 0);
    ck_assert_int_eq(tier_disk_put_ready(t, len), 0);
    tier_destroy(t);
    t = disk_open(path, 2 * MiB, 1 * MiB, &f);
    ck_assert_int_eq(f.n, 2);
    ck_assert(disk_found_has(&f, 1) && disk_found_has(&f, 3));
    tier_destroy(t);
    unlink(path);
    free(src);
}
END_TEST

struct enc {
    int calls, status;
    struct tier_disk_rec *r;
};

static void enc_cb(void *arg, struct tier_disk_rec *r, int status)
{
    struct enc *e = arg;
    e->calls++;
    e->status = status;
    e->r = r;
}

/* Encodes (level, codec), allocates for the encoded size and writes; the location. */
static struct tier_loc put_encoded(struct tier *t, const struct tier_disk_meta *m, const void *src,
                                   int codec, int level, uint64_t *stored)
{
    struct enc e = {0, -1, NULL};
    struct tier_loc loc;
    ck_assert_int_eq(tier_disk_encode(t, m, src, codec, level, enc_cb, &e), 0);
    tier_disk_drain(t);
    ck_assert_int_eq(e.calls, 1);
    ck_assert_int_eq(e.status, 0);
    *stored = tier_disk_rec_len(e.r);
    ck_assert_int_eq(t->ops->alloc(t, *stored, &loc), 0);
    struct done d = {0, -1};
    ck_assert_int_eq(tier_disk_rec_put(t, &loc, e.r, disk_done_cb, &d), 0);
    tier_disk_drain(t);
    ck_assert_int_eq(d.calls, 1);
    ck_assert_int_eq(d.status, 0);
    return loc;
}

/* fp16 values in [1, 2): the high bytes repeat, the low bytes are noise. */
static void fill_fp16(uint8_t *p, size_t n, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i += 2) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
        if (i + 1 < n)
            p[i + 1] = (uint8_t)(0x3c | ((x >> 8) & 3));
    }
}

static void fill_random(uint8_t *p, size_t n, unsigned seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)(x >> 24);
    }
}

/* queue_depth bounds the records on the device; as many again are admitted (they wait for
 * a slot or hash), and the one after that is -EAGAIN. All of them complete, in any case. */
START_TEST(test_device_queue_depth)
{
    char path[300];
    const uint64_t len = 64 * KiB;
    enum { N = 3 };
    uint8_t *src = aligned_alloc(4096, N * len), *dst = aligned_alloc(4096, N * len);
    struct tier_disk_config cfg = {
        .paths = {path}, .npaths = 1, .size = 2 * MiB, .page_size = 1 * MiB, .queue_depth = 1};
    struct tier_loc loc[N];
    struct tier_disk_meta m[N];
    struct done d[N];
    struct tier *t;
    int err = 0;
    disk_path(path, sizeof(path));
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_nonnull(t);
    for (int i = 0; i < N; i++) {
        m[i] = disk_meta((uint64_t)i + 40, len);
        disk_fill(src + i * len, len, (unsigned)i + 40);
        ck_assert_int_eq(t->ops->alloc(t, len, &loc[i]), 0);
        d[i] = (struct done){0, -1};
    }
    ck_assert_int_eq(tier_disk_put(t, &loc[0], &m[0], src, disk_done_cb, &d[0]), 0);
    ck_assert_int_eq(tier_disk_put(t, &loc[1], &m[1], src + len, disk_done_cb, &d[1]), 0);
    ck_assert_int_eq(tier_disk_put(t, &loc[2], &m[2], src + 2 * len, disk_done_cb, &d[2]), -EAGAIN);
    while (d[0].calls == 0 && d[1].calls == 0)
        tier_disk_drain(t);
    ck_assert_int_eq(tier_disk_put(t, &loc[2], &m[2], src + 2 * len, disk_done_cb, &d[2]), 0);
    tier_disk_drain(t);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(d[i].calls, 1);
        ck_assert_int_eq(d[i].status, 0);
        d[i] = (struct done){0, -1};
    }
    /* reads the same way: two admitted, the third waits for room */
    ck_assert_int_eq(tier_disk_get(t, &loc[0], &m[0], dst, len, disk_done_cb, &d[0]), 0);
    ck_assert_int_eq(tier_disk_get(t, &loc[1], &m[1], dst + len, len, disk_done_cb, &d[1]), 0);
    ck_assert_int_eq(tier_disk_get(t, &loc[2], &m[2], dst + 2 * len, len, disk_done_cb, &d[2]),
                     -EAGAIN);
    tier_disk_drain(t);
    ck_assert_int_eq(tier_disk_get(t, &loc[2], &m[2], dst + 2 * len, len, disk_done_cb, &d[2]), 0);
    tier_disk_drain(t);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(d[i].calls, 1);
        ck_assert_int_eq(d[i].status, 0);
    }
    ck_assert_int_eq(memcmp(src, dst, N * len), 0);
    tier_destroy(t);
    unlink(path);
    free(src);
    free(dst);
}
END_TEST

START_TEST(test_compressed_roundtrip_reopen_flip)
{
    char path[300];
    const uint64_t len = 256 * KiB;
    uint8_t *src = aligned_alloc(4096, len), *dst = aligned_alloc(4096, len);
    struct tier_disk_stats st;
    struct tier_loc lz, lp, lr;
    uint64_t sz, sp, sr;
    struct found f = {0};
    struct tier *t;
    int fd;
    disk_path(path, sizeof(path));
    t = disk_open(path, 4 * MiB, 1 * MiB, NULL);
    struct tier_disk_meta mz = disk_meta(1, len), mp = disk_meta(2, len), mr = disk_meta(3, len);
    mp.format = 1; /* a quantized block, say: carried and checked, opaque to the tier */
    fill_fp16(src, len, 1);
    lz = put_encoded(t, &mz, src, TIER_DISK_CODEC_ZSTD, 1, &sz);
    fill_fp16(src, len, 2);
    lp = put_encoded(t, &mp, src, TIER_DISK_CODEC_ZSTD_PLANES, 1, &sp);
    fill_random(src, len, 3); /* zstd cannot shrink it: stored raw */
    lr = put_encoded(t, &mr, src, TIER_DISK_CODEC_ZSTD_PLANES, 3, &sr);
    ck_assert_uint_lt(sz, len * 9 / 10);
    ck_assert_uint_lt(sp, sz); /* planes beat plain zstd on 16-bit floats */
    ck_assert_uint_eq(sr, len);
    ck_assert_uint_eq(lr.len, len);
    tier_disk_stats_get(t, &st);
    ck_assert_uint_eq(st.compressed, 2);
    ck_assert_uint_eq(st.incompressible, 1);
    ck_assert_uint_eq(st.codec_in, 3 * len);
    ck_assert_uint_eq(st.codec_out, sz + sp + sr);
    /* byte-exact back, into a slot of the block's size */
    memset(dst, 0, len);
    ck_assert_int_eq(disk_get(t, &lz, &mz, dst, len), 0);
    fill_fp16(src, len, 1);
    ck_assert_int_eq(memcmp(src, dst, len), 0);
    /* the format is part of what a read checks */
    ck_assert_int_eq(disk_get(t, &lp, &mz, dst, len), -EBADMSG);
    tier_destroy(t);
    /* found again, with what they are */
    t = disk_open(path, 4 * MiB, 1 * MiB, &f);
    ck_assert_int_eq(f.n, 3);
    for (int i = 0; i < f.n; i++) {
        const struct tier_disk_meta *m = &f.m[i];
        uint64_t k = m->key[0];
        ck_assert_uint_eq(m->len, len);
        ck_assert_uint_eq(m->codec, k == 1   ? TIER_DISK_CODEC_ZSTD
                                    : k == 2 ? TIER_DISK_CODEC_ZSTD_PLANES
                                             : TIER_DISK_CODEC_RAW);
        ck_assert_uint_eq(m->stored, k == 1 ? sz : k == 2 ? sp : sr);
        ck_assert_uint_eq(m->format, k == 2 ? 1 : 0);
        ck_assert_uint_eq(f.loc[i].len, (m->stored + 4095) / 4096 * 4096);
        memset(dst, 0, len);
        ck_assert_int_eq(disk_get(t, &f.loc[i], m, dst, len), 0);
        if (k == 3)
            fill_random(src, len, 3);
        else
            fill_fp16(src, len, (unsigned)k);
        ck_assert_int_eq(memcmp(src, dst, len), 0);
    }
    /* a flipped byte inside the compressed data of the planes record: refused */
    fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint8_t b;
    ck_assert_int_eq(pread(fd, &b, 1, (off_t)(TIER_DISK_SB + lp.off) + sp / 2), 1);
    b ^= 0x10;
    ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)(TIER_DISK_SB + lp.off) + sp / 2), 1);
    fsync(fd);
    close(fd);
    ck_assert_int_eq(disk_get(t, &lp, &mp, dst, len), -EBADMSG);
    tier_disk_stats_get(t, &st);
    ck_assert_uint_eq(st.checksum_failures, 1);
    /* a record that is dropped after encoding gives back its queue slot */
    struct enc e = {0, -1, NULL};
    ck_assert_int_eq(tier_disk_encode(t, &mz, src, TIER_DISK_CODEC_ZSTD, 1, enc_cb, &e), 0);
    tier_disk_drain(t);
    tier_disk_rec_free(t, e.r);
    tier_disk_stats_get(t, &st);
    ck_assert_uint_eq(st.writes_inflight, 0);
    tier_destroy(t);
    unlink(path);
    free(src);
    free(dst);
}
END_TEST

/* The peek stands in for a writer of the block's arena: it rewrites the block once the
 * encode has started (on the worker, where the tier reads it). */
struct scribble {
    struct enc e; /* first: the encode's callback takes the same argument */
    uint8_t *block;
    uint64_t len;
};

static void scribble_peek(void *arg, const void *src, uint64_t len)
{
    struct scribble *w = arg;
    (void)src;
    (void)len;
    fill_random(w->block, w->len, 99);
}

START_TEST(test_encode_under_writer)
{
    char path[300];
    const uint64_t len = 256 * KiB;
    uint8_t *src = aligned_alloc(4096, len), *want = aligned_alloc(4096, len),
            *dst = aligned_alloc(4096, len);
    const int codec[3] = {TIER_DISK_CODEC_ZSTD, TIER_DISK_CODEC_ZSTD_PLANES,
                          TIER_DISK_CODEC_ZSTD_PLANES};
    struct tier *t;
    disk_path(path, sizeof(path));
    t = disk_open(path, 4 * MiB, 1 * MiB, NULL);
    for (int i = 0; i < 3; i++) {
        /* compressible twice, then random (stored raw: what is hashed is what is written) */
        struct tier_disk_meta m = disk_meta(10 + (uint64_t)i, len);
        struct scribble w = {{0, -1, NULL}, src, len};
        struct done d = {0, -1};
        struct tier_loc loc;
        if (i < 2)
            fill_fp16(src, len, 7);
        else
            fill_random(src, len, 7);
        memcpy(want, src, len);
        ck_assert_int_eq(
            tier_disk_encode_peek(t, &m, src, codec[i], 1, scribble_peek, enc_cb, &w), 0);
        tier_disk_drain(t);
        ck_assert_int_eq(w.e.calls, 1);
        ck_assert_int_eq(w.e.status, 0);
        ck_assert_int_eq(t->ops->alloc(t, tier_disk_rec_len(w.e.r), &loc), 0);
        ck_assert_int_eq(tier_disk_rec_put(t, &loc, w.e.r, disk_done_cb, &d), 0);
        tier_disk_drain(t);
        ck_assert_int_eq(d.status, 0);
        /* the record is the block as the encode began: whole, verified, not the writer's */
        memset(dst, 0, len);
        ck_assert_int_eq(disk_get(t, &loc, &m, dst, len), 0);
        ck_assert_int_eq(memcmp(dst, want, len), 0);
    }
    tier_destroy(t);
    unlink(path);
    free(src);
    free(want);
    free(dst);
}
END_TEST

static Suite *disk_suite(void)
{
    Suite *s = suite_create("tier_disk");
    static const struct tier_conformance conf = {
        .name = "disk",
        .capacity = 4 * MiB,
        .block = 124 * KiB,
        .whole_slot = false,
        .create = factory,
        .drain = drain,
    };
    TCase *tc = tier_conformance_tcase(&conf);
    tcase_set_timeout(tc, daemon_slow() * 30);
    suite_add_tcase(s, tc);
    tc = tcase_create("disk");
    tcase_set_timeout(tc, daemon_slow() * 30);
    tcase_add_test(tc, test_record_roundtrip_and_reopen);
    tcase_add_test(tc, test_checksum_flip);
    tcase_add_test(tc, test_torn_record_not_found);
    tcase_add_test(tc, test_walk_finds_every_record);
    tcase_add_test(tc, test_fixed_buffers_and_rate);
    tcase_add_test(tc, test_pages_reclaimed);
    tcase_add_test(tc, test_forged_header_in_stale_page);
    tcase_add_test(tc, test_unwritten_record_leaves_no_hole);
    tcase_add_test(tc, test_compressed_roundtrip_reopen_flip);
    tcase_add_test(tc, test_encode_under_writer);
    tcase_add_test(tc, test_device_queue_depth);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return disk_suite_run(disk_suite(), "tier_disk");
}
