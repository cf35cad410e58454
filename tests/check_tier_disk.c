/*
 * check_tier_disk.c — the disk tier: the conformance cases (as the host tier runs them),
 * then what only the disk promises: records survive a reopen, a flipped byte or a stale
 * location is refused, a torn record is never reported intact, the write rate is bounded,
 * block bytes shaped like a header are never taken for one, a record allocated and freed
 * unwritten leaves no hole, compressed records round trip byte-exact, survive a reopen and
 * refuse a flipped byte, and incompressible blocks are stored raw. The index checkpoint:
 * a restart takes its records plus what was written since (and not what a reused page
 * lost), and a torn, corrupt or foreign one is refused for the full walk. Hardening: a
 * symbolic link or foreign data as the path is refused, a short transfer is an error, a
 * path already open (by another tier, through a link, or listed twice) is refused.
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
#include "tests/lib/tier_conformance.h"
#include "tiers/disk.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024)

static char disk_dir[256];
static int disk_seq;
static bool disk_buffered; /* no directory here takes O_DIRECT: the tier runs buffered */

/* A directory on a file system that takes O_DIRECT (tmpfs before Linux 6.6 does not); when
 * none does, /tmp with buffered I/O, which the suite says (disk_dir_pick_any). */
static void disk_dir_pick(void)
{
    const char *cands[] = {getenv("KVC_TEST_DISK_DIR"), "/var/tmp", KVC_SRC_DIR "/build", "/tmp"};
    for (size_t i = 0; i < sizeof(cands) / sizeof(cands[0]); i++) {
        char probe[300];
        int fd;
        if (!cands[i])
            continue;
        snprintf(disk_dir, sizeof(disk_dir), "%s/kvcd-disk-test-%d", cands[i], (int)getpid());
        if (mkdir(disk_dir, 0700) < 0)
            continue;
        snprintf(probe, sizeof(probe), "%s/probe", disk_dir);
        fd = open(probe, O_RDWR | O_CREAT | O_DIRECT, 0600);
        if (fd >= 0) {
            close(fd);
            unlink(probe);
            return;
        }
        rmdir(disk_dir);
    }
    disk_dir[0] = 0;
}

/* The fallback of disk_dir_pick: a directory without O_DIRECT. 0, or -1. */
static int disk_dir_pick_any(void)
{
    snprintf(disk_dir, sizeof(disk_dir), "/tmp/kvcd-disk-test-%d", (int)getpid());
    if (mkdir(disk_dir, 0700) < 0) {
        disk_dir[0] = 0;
        return -1;
    }
    disk_buffered = true;
    return 0;
}

static void disk_path(char *buf, size_t len)
{
    snprintf(buf, len, "%s/t%d.kvc", disk_dir, disk_seq++);
}

struct found {
    int n;
    struct tier_disk_meta m[64];
    struct tier_loc loc[64];
};

static int found_cb(void *arg, const struct tier_disk_meta *m, const struct tier_loc *loc)
{
    struct found *f = arg;
    if (f->n >= 64)
        return 1;
    f->m[f->n] = *m;
    f->loc[f->n] = *loc;
    f->n++;
    return 0;
}

static struct tier *disk_open(const char *path, uint64_t size, uint64_t page, struct found *f)
{
    struct tier_disk_config cfg = {.paths = {path},
                                   .npaths = 1,
                                   .size = size,
                                   .page_size = page,
                                   .queue_depth = 32,
                                   .scan = f ? found_cb : NULL,
                                   .scan_arg = f};
    int err = 0;
    struct tier_disk_stats st;
    struct tier *t = tier_disk_new(&cfg, &err);
    ck_assert_msg(t != NULL, "tier_disk_new(%s): %s", path, strerror(-err));
    /* the tier never falls back to buffered I/O where the directory takes O_DIRECT */
    tier_disk_stats_get(t, &st);
    ck_assert_msg(st.buffered == disk_buffered, "%s: buffered I/O %d, expected %d", path,
                  st.buffered, disk_buffered);
    return t;
}

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

struct done {
    int calls, status;
};

static void done_cb(void *arg, int status)
{
    struct done *d = arg;
    d->calls++;
    d->status = status;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 9));
}

static struct tier_disk_meta meta(uint64_t k, uint64_t len)
{
    struct tier_disk_meta m = {.key = {k, ~k}, .parent = {k - 1, ~(k - 1)}, .depth = (uint32_t)k,
                               .len = len};
    snprintf((char *)m.ns, sizeof(m.ns), "model-%u", 7u);
    return m;
}

static int put(struct tier *t, const struct tier_loc *loc, const struct tier_disk_meta *m,
               const void *src)
{
    struct done d = {0, -1};
    int rc = tier_disk_put(t, loc, m, src, done_cb, &d);
    if (rc)
        return rc;
    tier_disk_drain(t);
    ck_assert_int_eq(d.calls, 1);
    return d.status;
}

static int get(struct tier *t, const struct tier_loc *loc, const struct tier_disk_meta *m,
               void *dst, uint64_t len)
{
    struct done d = {0, -1};
    int rc = tier_disk_get(t, loc, m, dst, len, done_cb, &d);
    if (rc)
        return rc;
    tier_disk_drain(t);
    ck_assert_int_eq(d.calls, 1);
    return d.status;
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
        struct tier_disk_meta m = meta((uint64_t)i + 1, len);
        fill(src, len, (unsigned)i);
        ck_assert_int_eq(t->ops->alloc(t, len, &loc[i]), 0);
        ck_assert_int_eq(put(t, &loc[i], &m, src), 0);
        memset(dst, 0, 256 * KiB);
        ck_assert_int_eq(get(t, &loc[i], &m, dst, 256 * KiB), 0);
        ck_assert_int_eq(memcmp(src, dst, len), 0);
    }
    /* One dead record: not found again. */
    t->ops->free(t, &loc[2]);
    tier_destroy(t);
    t = disk_open(path, 4 * MiB, 1 * MiB, &f);
    ck_assert_int_eq(f.n, 5); /* the freed record is still intact on the device */
    for (int i = 0; i < f.n; i++) {
        uint64_t k = f.m[i].key[0];
        struct tier_disk_meta m = meta(k, len);
        m.stored = len; /* raw: what the scan reports */
        ck_assert_int_eq(memcmp(&f.m[i], &m, sizeof(m)), 0);
        ck_assert_int_eq(get(t, &f.loc[i], &m, dst, 256 * KiB), 0);
        fill(src, len, (unsigned)(k - 1));
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
    struct tier_disk_meta m = meta(9, len), other = meta(10, len);
    struct tier_disk_stats st;
    struct tier_loc loc;
    struct tier *t;
    int fd;
    disk_path(path, sizeof(path));
    t = disk_open(path, 2 * MiB, 1 * MiB, NULL);
    fill(src, len, 3);
    ck_assert_int_eq(t->ops->alloc(t, len, &loc), 0);
    ck_assert_int_eq(put(t, &loc, &m, src), 0);
    /* the wrong key is refused */
    ck_assert_int_eq(get(t, &loc, &other, dst, len), -EBADMSG);
    /* flip one byte in the data behind the tier's back */
    fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint8_t b;
    ck_assert_int_eq(pread(fd, &b, 1, (off_t)(TIER_DISK_SB + loc.off) + 1000), 1);
    b ^= 0x40;
    ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)(TIER_DISK_SB + loc.off) + 1000), 1);
    fsync(fd);
    close(fd);
    ck_assert_int_eq(get(t, &loc, &m, dst, len), -EBADMSG);
    tier_disk_stats_get(t, &st);
    ck_assert_uint_eq(st.checksum_failures, 2);
    /* a stale location (the page reused under a new version) fails the cheap check */
    struct tier_loc stale = loc;
    stale.cls++;
    ck_assert_int_eq(get(t, &stale, &m, dst, len), -EINVAL);
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
    struct tier_disk_meta m1 = meta(1, len), m2 = meta(2, len);
    struct tier_loc l1, l2;
    struct found f = {0};
    struct tier *t;
    int fd;
    disk_path(path, sizeof(path));
    t = disk_open(path, 2 * MiB, 1 * MiB, NULL);
    fill(src, len, 1);
    ck_assert_int_eq(t->ops->alloc(t, len, &l1), 0);
    ck_assert_int_eq(put(t, &l1, &m1, src), 0);
    ck_assert_int_eq(t->ops->alloc(t, len, &l2), 0);
    ck_assert_int_eq(put(t, &l2, &m2, src), 0);
    tier_destroy(t);
    /* the second record's data cut off half way: its header is intact, its data is not */
    fd = open(path, O_RDWR);
    uint8_t *zero = calloc(1, len / 2);
    ck_assert_int_eq(pwrite(fd, zero, len / 2, (off_t)(TIER_DISK_SB + l2.off + len / 2)), (ssize_t)(len / 2));
    close(fd);
    free(zero);
    t = disk_open(path, 2 * MiB, 1 * MiB, &f);
    ck_assert_int_eq(f.n, 2);
    /* found by the scan, refused by the read: never served */
    ck_assert_int_eq(get(t, &f.loc[0], &f.m[0], dst, len), f.m[0].key[0] == 1 ? 0 : -EBADMSG);
    ck_assert_int_eq(get(t, &f.loc[1], &f.m[1], dst, len), f.m[1].key[0] == 1 ? 0 : -EBADMSG);
    tier_destroy(t);
    /* a torn header ends the page's chain */
    fd = open(path, O_RDWR);
    uint8_t junk[64];
    memset(junk, 0xa5, sizeof(junk));
    ck_assert_int_eq(pwrite(fd, junk, sizeof(junk), (off_t)(TIER_DISK_SB + l2.off - TIER_DISK_HDR + 40)), 64);
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

static void fresh_path(char *buf, size_t len);

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
    fresh_path(path, sizeof(path));
    cfg.paths[0] = path;
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_nonnull(t);
    /* small records over several pages, a page of large ones, then both mixed */
    for (int i = 0; i < SMALL; i++) {
        struct tier_disk_meta m = meta(++k, small);
        fill(src, small, (unsigned)k);
        ck_assert_int_eq(t->ops->alloc(t, small, &locs[k]), 0);
        ck_assert_int_eq(put(t, &locs[k], &m, src), 0);
    }
    for (int i = 0; i < LARGE + 40; i++) {
        uint64_t len = i < LARGE || i % 8 == 0 ? large : small;
        struct tier_disk_meta m = meta(++k, len);
        fill(src, len, (unsigned)k);
        ck_assert_int_eq(t->ops->alloc(t, len, &locs[k]), 0);
        ck_assert_int_eq(put(t, &locs[k], &m, src), 0);
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
        struct tier_disk_meta m = meta(k, wlen[k]);
        ck_assert_int_eq(get(t, &wl[k], &m, dst, large), 0);
        fill(src, wlen[k], (unsigned)k);
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
        struct tier_disk_meta m = meta(MAXK, wlen[MAXK]);
        ck_assert_uint_ne(wl[MAXK].len, 0);
        ck_assert_int_eq(get(t, &wl[MAXK], &m, dst, large), -EBADMSG);
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
    fill(arena, 4 * MiB, 5);
    /* The bucket holds one page (1 MiB) at start and refills at 1 MiB/s: puts are accepted
     * until the budget runs out, whatever the speed of this loop, and never beyond it. */
    uint64_t t0 = daemon_now_ms();
    for (int i = 0; i < 16 && !refused; i++) {
        struct tier_disk_meta m = meta((uint64_t)i + 1, len);
        d[i] = (struct done){0, -1};
        ck_assert_int_eq(t->ops->alloc(t, len, &loc[i]), 0);
        int rc = tier_disk_put(t, &loc[i], &m, arena + (uint64_t)(i % 8) * len, done_cb, &d[i]);
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
    ck_assert_msg((double)accepted * rec <= budget + rec, "%d records of %llu B in a budget of %.0f B",
                  accepted, (unsigned long long)rec, budget);
    ck_assert_msg(refused || budget >= 16.0 * rec, "no refusal within a budget of %.0f B", budget);
    tier_disk_stats_get(t, &st);
    ck_assert(st.fixed_buffers);
    ck_assert_uint_eq(st.writes, (uint64_t)accepted);
    ck_assert_uint_ge(st.throttled, (uint64_t)refused);
    /* read back into the arena (fixed buffers) */
    struct tier_disk_meta m0 = meta(1, len);
    ck_assert_int_eq(get(t, &loc[0], &m0, arena + 3 * MiB, len), 0);
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

static int found_has(const struct found *f, uint64_t k)
{
    for (int i = 0; i < f->n; i++)
        if (f->m[i].key[0] == k)
            return 1;
    return 0;
}

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
        *x = (struct forged_hdr){.magic = 0x4b564344424c4b31ull, .format = 3,
                                 .page_version = 3, .len = 4 * KiB, .raw_len = 4 * KiB,
                                 .key = {666, 0}, .depth = 0};
        x->data_csum = XXH3_64bits(src, 4 * KiB);
        x->hdr_csum = seed ? XXH3_64bits_withSeed(x, offsetof(struct forged_hdr, hdr_csum), 0)
                           : XXH3_64bits(x, offsetof(struct forged_hdr, hdr_csum));
    }
    struct tier_disk_meta ma = meta(1, 200 * KiB), mb = meta(2, 800 * KiB),
                          mc = meta(3, 1000 * KiB), md = meta(4, 56 * KiB);
    ck_assert_int_eq(put(t, &a, &ma, src), 0);
    ck_assert_int_eq(t->ops->alloc(t, 800 * KiB, &b), 0);
    ck_assert_int_eq(put(t, &b, &mb, src), 0);
    /* page 1 (version 2): C fills it */
    ck_assert_int_eq(t->ops->alloc(t, 1000 * KiB, &c), 0);
    ck_assert_uint_eq(c.cls, 2);
    ck_assert_int_eq(put(t, &c, &mc, src), 0);
    t->ops->free(t, &a);
    t->ops->free(t, &b);
    /* page 0 again, version 3: D, then the stale bytes of A */
    ck_assert_int_eq(t->ops->alloc(t, 56 * KiB, &dl), 0);
    ck_assert_uint_eq(dl.cls, 3);
    ck_assert_uint_eq(dl.off % MiB, 4 * KiB);
    ck_assert_int_eq(put(t, &dl, &md, src), 0);
    tier_destroy(t);
    t = disk_open(path, 2 * MiB, 1 * MiB, &f);
    ck_assert_int_eq(f.n, 2);
    ck_assert(found_has(&f, 3) && found_has(&f, 4));
    ck_assert(!found_has(&f, 666));
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
    struct tier_disk_meta ma = meta(1, len), mc = meta(3, len);
    fill(src, len, 5);
    disk_path(path, sizeof(path));
    t = disk_open(path, 2 * MiB, 1 * MiB, NULL);
    ck_assert_int_eq(t->ops->alloc(t, len, &a), 0);
    ck_assert_int_eq(put(t, &a, &ma, src), 0);
    ck_assert_int_eq(t->ops->alloc(t, len, &b), 0);
    t->ops->free(t, &b);
    ck_assert_int_eq(t->ops->alloc(t, len, &c), 0);
    ck_assert_uint_eq(c.off, b.off); /* the room came back */
    ck_assert_int_eq(put(t, &c, &mc, src), 0);
    ck_assert_int_eq(tier_disk_put_ready(t, len), 0);
    tier_destroy(t);
    t = disk_open(path, 2 * MiB, 1 * MiB, &f);
    ck_assert_int_eq(f.n, 2);
    ck_assert(found_has(&f, 1) && found_has(&f, 3));
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
static struct tier_loc put_encoded(struct tier *t, const struct tier_disk_meta *m,
                                   const void *src, int codec, int level, uint64_t *stored)
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
    ck_assert_int_eq(tier_disk_rec_put(t, &loc, e.r, done_cb, &d), 0);
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
    struct tier_disk_config cfg = {.paths = {path}, .npaths = 1, .size = 2 * MiB,
                                   .page_size = 1 * MiB, .queue_depth = 1};
    struct tier_loc loc[N];
    struct tier_disk_meta m[N];
    struct done d[N];
    struct tier *t;
    int err = 0;
    disk_path(path, sizeof(path));
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_nonnull(t);
    for (int i = 0; i < N; i++) {
        m[i] = meta((uint64_t)i + 40, len);
        fill(src + i * len, len, (unsigned)i + 40);
        ck_assert_int_eq(t->ops->alloc(t, len, &loc[i]), 0);
        d[i] = (struct done){0, -1};
    }
    ck_assert_int_eq(tier_disk_put(t, &loc[0], &m[0], src, done_cb, &d[0]), 0);
    ck_assert_int_eq(tier_disk_put(t, &loc[1], &m[1], src + len, done_cb, &d[1]), 0);
    ck_assert_int_eq(tier_disk_put(t, &loc[2], &m[2], src + 2 * len, done_cb, &d[2]), -EAGAIN);
    while (d[0].calls == 0 && d[1].calls == 0)
        tier_disk_drain(t);
    ck_assert_int_eq(tier_disk_put(t, &loc[2], &m[2], src + 2 * len, done_cb, &d[2]), 0);
    tier_disk_drain(t);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(d[i].calls, 1);
        ck_assert_int_eq(d[i].status, 0);
        d[i] = (struct done){0, -1};
    }
    /* reads the same way: two admitted, the third waits for room */
    ck_assert_int_eq(tier_disk_get(t, &loc[0], &m[0], dst, len, done_cb, &d[0]), 0);
    ck_assert_int_eq(tier_disk_get(t, &loc[1], &m[1], dst + len, len, done_cb, &d[1]), 0);
    ck_assert_int_eq(tier_disk_get(t, &loc[2], &m[2], dst + 2 * len, len, done_cb, &d[2]),
                     -EAGAIN);
    tier_disk_drain(t);
    ck_assert_int_eq(tier_disk_get(t, &loc[2], &m[2], dst + 2 * len, len, done_cb, &d[2]), 0);
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
    struct tier_disk_meta mz = meta(1, len), mp = meta(2, len), mr = meta(3, len);
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
    ck_assert_int_eq(get(t, &lz, &mz, dst, len), 0);
    fill_fp16(src, len, 1);
    ck_assert_int_eq(memcmp(src, dst, len), 0);
    /* the format is part of what a read checks */
    ck_assert_int_eq(get(t, &lp, &mz, dst, len), -EBADMSG);
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
        ck_assert_int_eq(get(t, &f.loc[i], m, dst, len), 0);
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
    ck_assert_int_eq(get(t, &lp, &mp, dst, len), -EBADMSG);
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

/* ---- checkpoint of the index ----------------------------------------------------------- */

/* A path of this test process alone (Check forks every test, so disk_path's counter starts
 * over in each), with nothing left there from a failed run. */
static void fresh_path(char *buf, size_t len)
{
    char cp[340];
    snprintf(buf, len, "%s/c%d-%d.kvc", disk_dir, (int)getpid(), disk_seq++);
    snprintf(cp, sizeof(cp), "%s.ckpt", buf);
    unlink(buf);
    unlink(cp);
}

/* Records a test keeps track of: what it wrote and where, live or not. */
struct ckpt_set {
    int n;
    struct tier_disk_meta m[256];
    struct tier_loc loc[256];
    bool live[256];
    int next; /* the checkpoint's cursor */
};

static int ckpt_next(void *arg, struct tier_disk_meta *m, struct tier_loc *loc)
{
    struct ckpt_set *c = arg;
    while (c->next < c->n && !c->live[c->next])
        c->next++;
    if (c->next == c->n)
        return 0;
    *m = c->m[c->next];
    *loc = c->loc[c->next];
    c->next++;
    return 1;
}

/* Writes a checkpoint and waits until it is on the device under its name. */
static int ckpt_write(struct tier *t, struct ckpt_set *c)
{
    int rc;
    c->next = 0;
    rc = tier_disk_checkpoint(t, ckpt_next, c);
    if (rc >= 0) {
        int w = tier_disk_checkpoint_result(t, true);
        if (w)
            rc = w;
    }
    return rc;
}

/* Allocates and writes record k (28 KiB: 8 records of 32 KiB per 256 KiB page); wait: whether
 * its write completes before returning (else it is left in flight). */
static int ckpt_add(struct tier *t, struct ckpt_set *c, uint64_t k, const uint8_t *src, bool wait,
                    struct done *d)
{
    const uint64_t len = 28 * KiB;
    int i = c->n++;
    c->m[i] = meta(k, len);
    c->m[i].stored = len;
    ck_assert_int_eq(t->ops->alloc(t, len, &c->loc[i]), 0);
    c->live[i] = true;
    *d = (struct done){0, -1};
    ck_assert_int_eq(tier_disk_put(t, &c->loc[i], &c->m[i], src, done_cb, d), 0);
    if (wait) {
        tier_disk_drain(t);
        ck_assert_int_eq(d->status, 0);
    }
    return i;
}

static void ckpt_free(struct tier *t, struct ckpt_set *c, int i)
{
    t->ops->free(t, &c->loc[i]);
    c->live[i] = false;
}

static int found_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The keys found, sorted. */
static void found_keys(const struct found *f, uint64_t *keys)
{
    for (int i = 0; i < f->n; i++)
        keys[i] = f->m[i].key[0];
    qsort(keys, (size_t)f->n, sizeof(*keys), found_cmp);
}

static struct tier *disk_open_ckpt(const char *path, uint64_t size, uint64_t page,
                                   struct found *f, struct tier_disk_stats *st)
{
    struct tier *t;
    f->n = 0;
    t = disk_open(path, size, page, f);
    tier_disk_stats_get(t, st);
    return t;
}

/* Every record found reads back intact, key and all. */
static void found_verify(struct tier *t, const struct found *f)
{
    uint8_t *dst = aligned_alloc(4096, 32 * KiB), *want = aligned_alloc(4096, 32 * KiB);
    for (int i = 0; i < f->n; i++) {
        struct tier_disk_meta m = meta(f->m[i].key[0], 28 * KiB);
        ck_assert_uint_eq(f->m[i].len, 28 * KiB);
        ck_assert_int_eq(memcmp(f->m[i].ns, m.ns, sizeof(m.ns)), 0);
        ck_assert_uint_eq(f->m[i].depth, m.depth);
        ck_assert_int_eq(get(t, &f->loc[i], &m, dst, 32 * KiB), 0);
        fill(want, 28 * KiB, (unsigned)f->m[i].key[0]);
        ck_assert_int_eq(memcmp(dst, want, 28 * KiB), 0);
    }
    free(dst);
    free(want);
}

static void ckpt_path_of(const char *path, char *buf, size_t len)
{
    snprintf(buf, len, "%s.ckpt", path);
}

/* Restart from a checkpoint plus what was written since: records written after it (on the
 * page open then, on pages opened later, and one in flight while it was written) are found;
 * records on a page reused after it are not; the result is the full walk's. */
START_TEST(test_checkpoint_restart_with_tail)
{
    char path[300], cp[320];
    uint8_t *src = aligned_alloc(4096, 32 * KiB);
    static struct ckpt_set c;
    struct tier_disk_stats st;
    struct found f = {0}, g = {0};
    uint64_t fk[64], gk[64];
    struct done d, inflight;
    struct tier *t;
    int k = 1, late;
    memset(&c, 0, sizeof(c));
    fresh_path(path, sizeof(path));
    ckpt_path_of(path, cp, sizeof(cp));
    t = disk_open(path, 4 * MiB, 256 * KiB, NULL); /* 16 pages of 8 records */
    for (int i = 0; i < 20; i++, k++) { /* pages 0, 1 full, 4 records on page 2 (open) */
        fill(src, 28 * KiB, (unsigned)k);
        ckpt_add(t, &c, (uint64_t)k, src, true, &d);
    }
    for (int i = 0; i < 8; i++) /* page 0 dies before the checkpoint */
        ckpt_free(t, &c, i);
    fill(src, 28 * KiB, (unsigned)k);
    late = ckpt_add(t, &c, (uint64_t)k++, src, false, &inflight); /* in flight, not listed */
    c.live[late] = false;
    ck_assert_int_eq(ckpt_write(t, &c), 12);
    tier_disk_drain(t);
    ck_assert_int_eq(inflight.status, 0);
    c.live[late] = true;
    tier_disk_stats_get(t, &st);
    ck_assert_uint_eq(st.ckpt_writes, 1);
    ck_assert_uint_eq(st.ckpt_records, 12);
    ck_assert_uint_gt(st.ckpt_bytes, 12 * 64);
    ck_assert_uint_lt(st.ckpt_bytes, 64 + 16 * 16 + 12 * 64 + 168 + 40 + 1);
    /* after it: page 1's records die and the page is reused; page 2 fills up (3 more);
     * pages 3 and 0 take new records */
    for (int i = 8; i < 16; i++)
        ckpt_free(t, &c, i);
    for (int i = 0; i < 27; i++, k++) {
        fill(src, 28 * KiB, (unsigned)k);
        ckpt_add(t, &c, (uint64_t)k, src, true, &d);
    }
    tier_destroy(t);
    /* with the checkpoint */
    t = disk_open_ckpt(path, 4 * MiB, 256 * KiB, &f, &st);
    ck_assert(st.ckpt_loaded);
    ck_assert_uint_eq(st.records_ckpt, 4); /* page 2's; page 1's are stale */
    ck_assert_uint_eq(st.records_walked, (uint64_t)f.n - 4);
    ck_assert_uint_eq(st.records_found, (uint64_t)f.n);
    /* one header per page, and the walks of what changed: far fewer than records + pages */
    ck_assert_uint_lt(st.start_reads, 16 + (uint64_t)f.n + 16);
    ck_assert_int_eq(f.n, 4 + 1 + 27);
    for (int i = 0; i < c.n; i++)
        ck_assert_msg(found_has(&f, c.m[i].key[0]) == (c.live[i] ? 1 : 0), "key %llu: %s",
                      (unsigned long long)c.m[i].key[0], c.live[i] ? "lost" : "stale but found");
    found_verify(t, &f);
    /* new pages get versions above every page found */
    struct tier_loc nl;
    ck_assert_int_eq(t->ops->alloc(t, 28 * KiB, &nl), 0);
    for (int i = 0; i < f.n; i++)
        ck_assert_uint_gt(nl.cls, f.loc[i].cls);
    t->ops->free(t, &nl);
    tier_destroy(t);
    /* the full walk finds the same */
    ck_assert_int_eq(unlink(cp), 0);
    t = disk_open_ckpt(path, 4 * MiB, 256 * KiB, &g, &st);
    ck_assert(!st.ckpt_loaded);
    ck_assert_uint_eq(st.records_walked, (uint64_t)g.n);
    ck_assert_int_eq(g.n, f.n);
    found_keys(&f, fk);
    found_keys(&g, gk);
    ck_assert_int_eq(memcmp(fk, gk, (size_t)f.n * sizeof(*fk)), 0);
    tier_destroy(t);
    unlink(path);
    free(src);
}
END_TEST

/* Writes 20 records and a checkpoint of the 12 live ones (page 0's 8 died before it);
 * returns what the full walk finds: all 20, page 0's dead records being intact. */
static int ckpt_fixture(const char *path, uint64_t *keys)
{
    uint8_t *src = aligned_alloc(4096, 32 * KiB);
    static struct ckpt_set c;
    struct tier_disk_stats st;
    struct found f;
    struct done d;
    struct tier *t;
    char cp[320];
    memset(&c, 0, sizeof(c));
    t = disk_open(path, 4 * MiB, 256 * KiB, NULL);
    for (int i = 0; i < 20; i++) {
        fill(src, 28 * KiB, (unsigned)i + 1);
        ckpt_add(t, &c, (uint64_t)i + 1, src, true, &d);
    }
    for (int i = 0; i < 8; i++)
        ckpt_free(t, &c, i);
    ck_assert_int_eq(ckpt_write(t, &c), 12);
    tier_destroy(t);
    /* what the walk finds, the checkpoint set aside */
    ckpt_path_of(path, cp, sizeof(cp));
    char aside[340];
    snprintf(aside, sizeof(aside), "%s.aside", cp);
    ck_assert_int_eq(rename(cp, aside), 0);
    t = disk_open_ckpt(path, 4 * MiB, 256 * KiB, &f, &st);
    ck_assert(!st.ckpt_loaded);
    found_keys(&f, keys);
    tier_destroy(t);
    ck_assert_int_eq(rename(aside, cp), 0);
    free(src);
    return f.n;
}

/* Opens path with its checkpoint damaged by damage(); the load must refuse it and walk. */
static void ckpt_damaged(const char *path, const uint64_t *walk, int nwalk,
                         void (*damage)(const char *cp))
{
    struct tier_disk_stats st;
    struct found f;
    uint64_t keys[64];
    char cp[320];
    struct tier *t;
    ckpt_path_of(path, cp, sizeof(cp));
    damage(cp);
    t = disk_open_ckpt(path, 4 * MiB, 256 * KiB, &f, &st);
    ck_assert(!st.ckpt_loaded);
    ck_assert_uint_eq(st.records_ckpt, 0);
    ck_assert_int_eq(f.n, nwalk);
    found_keys(&f, keys);
    ck_assert_int_eq(memcmp(keys, walk, (size_t)nwalk * sizeof(*keys)), 0);
    found_verify(t, &f);
    tier_destroy(t);
}

static off_t file_size(const char *p)
{
    struct stat st;
    ck_assert_int_eq(stat(p, &st), 0);
    return st.st_size;
}

static void damage_truncate_tail(const char *cp)
{
    ck_assert_int_eq(truncate(cp, file_size(cp) - 1), 0);
}

static void damage_truncate_half(const char *cp)
{
    ck_assert_int_eq(truncate(cp, file_size(cp) / 2), 0);
}

static void damage_flip(const char *cp)
{
    int fd = open(cp, O_RDWR);
    uint8_t b;
    off_t at = file_size(cp) - 40 - 64 + 20; /* inside the last record's key */
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, &b, 1, at), 1);
    b ^= 0x04;
    ck_assert_int_eq(pwrite(fd, &b, 1, at), 1);
    close(fd);
}

static void damage_empty(const char *cp)
{
    ck_assert_int_eq(truncate(cp, 0), 0);
}

/* A torn or corrupt checkpoint (cut anywhere, a flipped byte, empty) is ignored: the walk
 * runs and finds exactly what it finds without one. */
START_TEST(test_checkpoint_torn_falls_back)
{
    void (*damage[])(const char *) = {damage_truncate_tail, damage_truncate_half, damage_flip,
                                      damage_empty};
    for (size_t i = 0; i < sizeof(damage) / sizeof(damage[0]); i++) {
        char path[300], cp[320];
        uint64_t walk[64];
        struct tier_disk_stats st;
        struct found f;
        struct tier *t;
        int n;
        fresh_path(path, sizeof(path));
        ckpt_path_of(path, cp, sizeof(cp));
        n = ckpt_fixture(path, walk);
        ck_assert_int_eq(n, 20);
        /* intact, it is used: the 12 live ones, page 0 being known free */
        t = disk_open_ckpt(path, 4 * MiB, 256 * KiB, &f, &st);
        ck_assert(st.ckpt_loaded);
        ck_assert_uint_eq(st.records_ckpt, 12);
        ck_assert_uint_eq(st.records_walked, 0);
        ck_assert_int_eq(f.n, 12);
        tier_destroy(t);
        ckpt_damaged(path, walk, n, damage[i]);
        unlink(cp);
        unlink(path);
    }
}
END_TEST

/* A checkpoint of another disk (another superblock secret) or of another geometry (capacity,
 * page size) is refused; the walk runs. */
START_TEST(test_checkpoint_other_disk_refused)
{
    char a[300], b[300], ca[320], cb[320];
    uint64_t walk[64];
    struct tier_disk_stats st;
    struct found f;
    struct tier *t;
    int n;
    fresh_path(a, sizeof(a));
    fresh_path(b, sizeof(b));
    ckpt_path_of(a, ca, sizeof(ca));
    ckpt_path_of(b, cb, sizeof(cb));
    n = ckpt_fixture(a, walk);
    /* b: same geometry, its own secret, the records of a copied over (the pages look the
     * same), a's checkpoint beside it */
    t = disk_open(b, 4 * MiB, 256 * KiB, NULL);
    tier_destroy(t);
    {
        int fa = open(a, O_RDONLY), fb = open(b, O_RDWR);
        uint8_t *buf = malloc(4 * MiB);
        ck_assert_int_eq(pread(fa, buf, 4 * MiB, TIER_DISK_SB), (ssize_t)(4 * MiB));
        ck_assert_int_eq(pwrite(fb, buf, 4 * MiB, TIER_DISK_SB), (ssize_t)(4 * MiB));
        close(fa);
        close(fb);
        free(buf);
    }
    ck_assert_int_eq(link(ca, cb), 0);
    t = disk_open_ckpt(b, 4 * MiB, 256 * KiB, &f, &st);
    ck_assert(!st.ckpt_loaded);
    ck_assert_int_eq(f.n, 0); /* a's headers do not verify under b's secret either */
    tier_destroy(t);
    /* a with another capacity, then another page size */
    t = disk_open_ckpt(a, 2 * MiB, 256 * KiB, &f, &st);
    ck_assert(!st.ckpt_loaded);
    tier_destroy(t);
    t = disk_open_ckpt(a, 4 * MiB, 512 * KiB, &f, &st);
    ck_assert(!st.ckpt_loaded);
    tier_destroy(t);
    /* and as written, it is still good */
    t = disk_open_ckpt(a, 4 * MiB, 256 * KiB, &f, &st);
    ck_assert(st.ckpt_loaded);
    ck_assert_int_eq(n, 20);
    ck_assert_int_eq(f.n, 12);
    tier_destroy(t);
    unlink(ca);
    unlink(cb);
    unlink(a);
    unlink(b);
}
END_TEST

/* cfg.ckpt_path names the file; "" means none; the write is atomic: the previous checkpoint
 * stays whole when a new one fails. */
START_TEST(test_checkpoint_path_and_due)
{
    char path[300], named[320], dflt[320];
    static struct ckpt_set c;
    uint8_t *src = aligned_alloc(4096, 32 * KiB);
    struct tier_disk_config cfg = {.npaths = 1, .size = 4 * MiB, .page_size = 256 * KiB,
                                   .queue_depth = 8};
    struct tier_disk_stats st;
    struct found f = {0};
    struct done d;
    struct tier *t;
    int err = 0;
    memset(&c, 0, sizeof(c));
    fresh_path(path, sizeof(path));
    snprintf(named, sizeof(named), "%s.named", path);
    ckpt_path_of(path, dflt, sizeof(dflt));
    cfg.paths[0] = path;
    cfg.ckpt_path = "";
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_nonnull(t);
    ck_assert_ptr_null(tier_disk_checkpoint_path(t));
    ck_assert_int_eq(ckpt_write(t, &c), -ENOENT);
    ck_assert(!tier_disk_checkpoint_due(t, 0, 0));
    tier_destroy(t);
    cfg.ckpt_path = named;
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_nonnull(t);
    ck_assert_str_eq(tier_disk_checkpoint_path(t), named);
    ck_assert(tier_disk_checkpoint_due(t, 0, 0)); /* never written */
    /* the first one of a run comes a second after the start once there are records, not
     * after the interval */
    usleep(1100 * 1000);
    ck_assert(!tier_disk_checkpoint_due(t, 3600 * 1000, 0)); /* no record yet */
    fill(src, 28 * KiB, 1);
    ckpt_add(t, &c, 1, src, true, &d);
    ck_assert(tier_disk_checkpoint_due(t, 3600 * 1000, 0));
    ck_assert_int_eq(ckpt_write(t, &c), 1);
    ck_assert(!tier_disk_checkpoint_due(t, 0, 0)); /* nothing changed since */
    fill(src, 28 * KiB, 2);
    ckpt_add(t, &c, 2, src, true, &d);
    ck_assert(tier_disk_checkpoint_due(t, 0, 0));
    ck_assert(!tier_disk_checkpoint_due(t, 3600 * 1000, 0)); /* not yet */
    /* then one every every_bytes written, no sooner than a second after the last */
    ck_assert(!tier_disk_checkpoint_due(t, 3600 * 1000, 4 * KiB));
    usleep(1100 * 1000);
    ck_assert(tier_disk_checkpoint_due(t, 3600 * 1000, 4 * KiB));  /* 32 KiB written */
    ck_assert(!tier_disk_checkpoint_due(t, 3600 * 1000, 1 * MiB)); /* not that much */
    ck_assert(!tier_disk_checkpoint_due(t, 3600 * 1000, 0));
    /* a failing write (the temporary name is a directory) leaves the previous one whole */
    char tmp[340];
    snprintf(tmp, sizeof(tmp), "%s.tmp", named);
    ck_assert_int_eq(mkdir(tmp, 0700), 0);
    ck_assert_int_lt(ckpt_write(t, &c), 0);
    tier_disk_stats_get(t, &st);
    ck_assert_uint_eq(st.ckpt_errors, 1);
    ck_assert_uint_eq(st.ckpt_writes, 1);
    rmdir(tmp);
    tier_destroy(t);
    ck_assert_int_ne(access(dflt, F_OK), 0);
    cfg.scan = found_cb;
    cfg.scan_arg = &f;
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_nonnull(t);
    tier_disk_stats_get(t, &st);
    ck_assert(st.ckpt_loaded);
    ck_assert_uint_eq(st.records_ckpt, 1);
    ck_assert_uint_eq(st.records_walked, 1); /* the second, from the open page's fill */
    ck_assert_int_eq(f.n, 2);
    tier_destroy(t);
    unlink(named);
    unlink(path);
    free(src);
}
END_TEST

/* ---- hardening ------------------------------------------------------------------------- */

/* A symbolic link as the path is refused (a link planted there would make kvcd write through
 * it), and what it points to is untouched. */
START_TEST(test_symlink_refused)
{
    char target[300], link_path[300];
    struct tier_disk_config cfg = {.npaths = 1, .size = 2 * MiB, .page_size = 1 * MiB,
                                   .queue_depth = 8};
    struct tier *t;
    int err = 0, fd;
    fresh_path(target, sizeof(target));
    fresh_path(link_path, sizeof(link_path));
    fd = open(target, O_RDWR | O_CREAT, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "precious", 8), 8);
    close(fd);
    ck_assert_int_eq(symlink(target, link_path), 0);
    cfg.paths[0] = link_path;
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(err, -ELOOP);
    ck_assert_int_eq(file_size(target), 8);
    /* a dangling link is not followed to create a file either */
    unlink(target);
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(err, -ELOOP);
    ck_assert_int_ne(access(target, F_OK), 0);
    unlink(link_path);
}
END_TEST

/* XXH3 of a whole file, read through the page cache. */
static uint64_t file_hash(const char *path)
{
    XXH3_state_t *xs = XXH3_createState();
    char buf[65536];
    ssize_t n;
    uint64_t h;
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    XXH3_64bits_reset(xs);
    while ((n = read(fd, buf, sizeof(buf))) > 0)
        XXH3_64bits_update(xs, buf, (size_t)n);
    close(fd);
    h = XXH3_64bits_digest(xs);
    XXH3_freeState(xs);
    return h;
}

/* One tier per path: a second open of a path in use is refused (-EBUSY) before it reads or
 * writes anything, whether through the same name, a hard link, or the path listed twice; the
 * holder's pid is readable from its lock; once the first is gone the path opens, records
 * and all. */
START_TEST(test_second_open_refused)
{
    char path[300], hard[300];
    uint8_t *src = aligned_alloc(4096, 32 * KiB);
    struct tier_disk_config cfg = {
        .npaths = 1, .size = 2 * MiB, .page_size = 256 * KiB, .queue_depth = 8, .ckpt_path = ""};
    struct tier_disk_meta m = meta(5, 28 * KiB);
    struct flock fl = {.l_type = F_WRLCK,
                       .l_whence = SEEK_SET,
                       .l_start = (off_t)1 << 62,
                       .l_len = (off_t)1 << 32};
    struct found f = {0};
    struct tier_loc loc;
    struct tier *t, *t2;
    uint64_t h0;
    int err = 0, fd;
    fresh_path(path, sizeof(path));
    fresh_path(hard, sizeof(hard));
    t = disk_open(path, 2 * MiB, 256 * KiB, NULL);
    fill(src, 28 * KiB, 5);
    ck_assert_int_eq(t->ops->alloc(t, 28 * KiB, &loc), 0);
    ck_assert_int_eq(put(t, &loc, &m, src), 0);
    h0 = file_hash(path);
    cfg.paths[0] = path;
    t2 = tier_disk_new(&cfg, &err);
    ck_assert_ptr_null(t2);
    ck_assert_int_eq(err, -EBUSY);
    ck_assert_int_eq(link(path, hard), 0);
    cfg.paths[0] = hard;
    err = 0;
    t2 = tier_disk_new(&cfg, &err);
    ck_assert_ptr_null(t2);
    ck_assert_int_eq(err, -EBUSY);
    ck_assert_uint_eq(file_hash(path), h0); /* refused before anything was written */
    /* the holder's pid, where a refused daemon reads it */
    fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fcntl(fd, F_OFD_GETLK, &fl), 0);
    ck_assert_int_eq(fl.l_type, F_WRLCK);
    ck_assert_int_eq(fl.l_start - ((off_t)1 << 62), getpid());
    close(fd);
    tier_destroy(t);
    unlink(hard);
    /* the lock went with the tier; the record is there */
    cfg.paths[0] = path;
    cfg.scan = found_cb;
    cfg.scan_arg = &f;
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(f.n, 1);
    ck_assert_uint_eq(f.m[0].key[0], 5);
    tier_destroy(t);
    /* one path named twice */
    cfg.paths[1] = path;
    cfg.npaths = 2;
    f.n = 0;
    err = 0;
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(err, -EBUSY);
    ck_assert_int_eq(f.n, 0);
    unlink(path);
    free(src);
}
END_TEST

/* An existing file holding something else is refused (not overwritten, not resized) unless
 * format says FORCE; an empty or all-zero file is formatted; NEVER creates nothing and takes
 * only a kvcd disk. */
START_TEST(test_foreign_data_refused)
{
    char path[300], missing[300];
    struct tier_disk_config cfg = {.npaths = 1, .size = 2 * MiB, .page_size = 1 * MiB,
                                   .queue_depth = 8};
    const char text[] = "somebody's database\n";
    char back[sizeof(text)];
    struct tier *t;
    int err = 0, fd;
    fresh_path(path, sizeof(path));
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, sizeof(text)), (ssize_t)sizeof(text));
    close(fd);
    cfg.paths[0] = path;
    for (uint32_t f = TIER_DISK_FORMAT_AUTO; f <= TIER_DISK_FORMAT_NEVER; f++) {
        cfg.format = f;
        t = tier_disk_new(&cfg, &err);
        ck_assert_ptr_null(t);
        ck_assert_int_eq(err, -EEXIST);
        ck_assert_int_eq(file_size(path), (off_t)sizeof(text));
        fd = open(path, O_RDONLY);
        ck_assert_int_eq(read(fd, back, sizeof(back)), (ssize_t)sizeof(back));
        close(fd);
        ck_assert_int_eq(memcmp(back, text, sizeof(text)), 0);
    }
    cfg.format = TIER_DISK_FORMAT_FORCE;
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_nonnull(t);
    tier_destroy(t);
    /* now it is kvcd's: every mode opens it */
    for (uint32_t f = TIER_DISK_FORMAT_AUTO; f <= TIER_DISK_FORMAT_FORCE; f++) {
        cfg.format = f;
        t = tier_disk_new(&cfg, &err);
        ck_assert_ptr_nonnull(t);
        tier_destroy(t);
    }
    /* zeros (a file laid out but never given its superblock) count as empty */
    ck_assert_int_eq(truncate(path, 0), 0);
    ck_assert_int_eq(truncate(path, 64 * KiB), 0);
    cfg.format = TIER_DISK_FORMAT_NEVER;
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(err, -EEXIST);
    cfg.format = TIER_DISK_FORMAT_AUTO;
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_nonnull(t);
    tier_destroy(t);
    /* NEVER does not create a missing file */
    fresh_path(missing, sizeof(missing));
    cfg.paths[0] = missing;
    cfg.format = TIER_DISK_FORMAT_NEVER;
    t = tier_disk_new(&cfg, &err);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(err, -ENOENT);
    ck_assert_int_ne(access(missing, F_OK), 0);
    unlink(path);
}
END_TEST

/* A read that returns fewer bytes than asked, even a 4 KiB multiple (the file was cut short),
 * fails with -EIO and counts as a read error, through the record path and the generic one. */
START_TEST(test_short_read_is_error)
{
    char path[300];
    const uint64_t len = 64 * KiB;
    uint8_t *src = aligned_alloc(4096, len), *dst = aligned_alloc(4096, len);
    struct tier_disk_meta m = meta(5, len);
    struct tier_disk_stats st;
    struct tier_loc loc;
    struct done d = {0, -1};
    struct tier *t;
    fresh_path(path, sizeof(path));
    t = disk_open(path, 2 * MiB, 1 * MiB, NULL);
    fill(src, len, 5);
    ck_assert_int_eq(t->ops->alloc(t, len, &loc), 0);
    ck_assert_int_eq(put(t, &loc, &m, src), 0);
    ck_assert_int_eq(get(t, &loc, &m, dst, len), 0);
    /* the file now ends 32 KiB into the record's data */
    ck_assert_int_eq(truncate(path, (off_t)(TIER_DISK_SB + loc.off + 32 * KiB)), 0);
    ck_assert_int_eq(get(t, &loc, &m, dst, len), -EIO);
    ck_assert_int_eq(t->ops->read(t, &loc, 16 * KiB, dst, 32 * KiB, done_cb, &d), 0);
    tier_disk_drain(t);
    ck_assert_int_eq(d.calls, 1);
    ck_assert_int_eq(d.status, -EIO);
    tier_disk_stats_get(t, &st);
    ck_assert_uint_eq(st.read_errors, 2);
    ck_assert_uint_eq(st.short_io, 2);
    ck_assert_uint_eq(st.checksum_failures, 0);
    tier_destroy(t);
    unlink(path);
    free(src);
    free(dst);
}
END_TEST

/* A write the kernel cuts short (the file may not grow past RLIMIT_FSIZE) is an I/O error,
 * not a record on the device. Runs in the test's own process (Check forks). */
START_TEST(test_short_write_is_error)
{
    char path[300];
    const uint64_t len = 64 * KiB;
    uint8_t *src = aligned_alloc(4096, len);
    struct tier_disk_meta m = meta(6, len);
    struct tier_disk_stats st;
    struct rlimit rl;
    struct tier_loc loc;
    struct done d = {0, -1};
    struct tier *t;
    fresh_path(path, sizeof(path));
    t = disk_open(path, 2 * MiB, 1 * MiB, NULL);
    fill(src, len, 6);
    ck_assert_int_eq(t->ops->alloc(t, len, &loc), 0);
    /* the header and the first 32 KiB of data may be written, the rest may not */
    ck_assert_int_eq(truncate(path, (off_t)(TIER_DISK_SB + loc.off - TIER_DISK_HDR)), 0);
    signal(SIGXFSZ, SIG_IGN);
    rl.rlim_cur = rl.rlim_max = TIER_DISK_SB + loc.off + 32 * KiB;
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    ck_assert_int_eq(tier_disk_put(t, &loc, &m, src, done_cb, &d), 0);
    tier_disk_drain(t);
    ck_assert_int_eq(d.calls, 1);
    ck_assert_int_eq(d.status, -EIO);
    tier_disk_stats_get(t, &st);
    ck_assert_uint_eq(st.write_errors, 1);
    ck_assert_uint_eq(st.short_io, 1);
    ck_assert_uint_eq(st.writes, 0);
    tier_destroy(t);
    unlink(path);
    free(src);
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
    tcase_add_test(tc, test_device_queue_depth);
    tcase_add_test(tc, test_checkpoint_restart_with_tail);
    tcase_add_test(tc, test_checkpoint_torn_falls_back);
    tcase_add_test(tc, test_checkpoint_other_disk_refused);
    tcase_add_test(tc, test_checkpoint_path_and_due);
    tcase_add_test(tc, test_symlink_refused);
    tcase_add_test(tc, test_second_open_refused);
    tcase_add_test(tc, test_foreign_data_refused);
    tcase_add_test(tc, test_short_read_is_error);
    tcase_add_test(tc, test_short_write_is_error);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int failed;
    disk_dir_pick();
    if (!disk_dir[0]) {
        /* the O_DIRECT path is what the daemon runs on NVMe: a run that must test it fails */
        const char *req = getenv("KVC_REQUIRE_ODIRECT");
        if (req && strcmp(req, "1") == 0) {
            printf("tier_disk: no directory here takes O_DIRECT (KVC_REQUIRE_ODIRECT=1)\n");
            return 1;
        }
        if (disk_dir_pick_any() < 0) {
            printf("SKIP: tier_disk: all: no directory for the disk files\n");
            return 0;
        }
        printf("SKIP: tier_disk: O_DIRECT: no directory here takes it (set KVC_TEST_DISK_DIR); "
               "the cases run on the buffered fallback\n");
    }
    fflush(stdout);
    SRunner *sr = srunner_create(disk_suite());
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    rmdir(disk_dir);
    return failed ? 1 : 0;
}
