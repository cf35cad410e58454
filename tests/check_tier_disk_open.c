/*
 * check_tier_disk_open.c — the disk tier at open. The index checkpoint: a restart takes its
 * records plus what was written since (and not what a reused page lost), and a torn, corrupt
 * or foreign one is refused for the full walk; its path and when one is due. Hardening: a
 * symbolic link or foreign data as the path is refused, a short transfer is an error, a path
 * already open (by another tier, through a link, or listed twice) is refused. The records
 * themselves (reopen, checksums, the walk, compression) are check_tier_disk's.
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
#include "tiers/disk.h"

/* ---- checkpoint of the index ----------------------------------------------------------- */

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
    c->m[i] = disk_meta(k, len);
    c->m[i].stored = len;
    ck_assert_int_eq(t->ops->alloc(t, len, &c->loc[i]), 0);
    c->live[i] = true;
    *d = (struct done){0, -1};
    ck_assert_int_eq(tier_disk_put(t, &c->loc[i], &c->m[i], src, disk_done_cb, d), 0);
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

static struct tier *disk_open_ckpt(const char *path, uint64_t size, uint64_t page, struct found *f,
                                   struct tier_disk_stats *st)
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
        struct tier_disk_meta m = disk_meta(f->m[i].key[0], 28 * KiB);
        ck_assert_uint_eq(f->m[i].len, 28 * KiB);
        ck_assert_int_eq(memcmp(f->m[i].ns, m.ns, sizeof(m.ns)), 0);
        ck_assert_uint_eq(f->m[i].depth, m.depth);
        ck_assert_int_eq(disk_get(t, &f->loc[i], &m, dst, 32 * KiB), 0);
        disk_fill(want, 28 * KiB, (unsigned)f->m[i].key[0]);
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
    disk_fresh_path(path, sizeof(path));
    ckpt_path_of(path, cp, sizeof(cp));
    t = disk_open(path, 4 * MiB, 256 * KiB, NULL); /* 16 pages of 8 records */
    for (int i = 0; i < 20; i++, k++) {            /* pages 0, 1 full, 4 records on page 2 (open) */
        disk_fill(src, 28 * KiB, (unsigned)k);
        ckpt_add(t, &c, (uint64_t)k, src, true, &d);
    }
    for (int i = 0; i < 8; i++) /* page 0 dies before the checkpoint */
        ckpt_free(t, &c, i);
    disk_fill(src, 28 * KiB, (unsigned)k);
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
        disk_fill(src, 28 * KiB, (unsigned)k);
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
        ck_assert_msg(disk_found_has(&f, c.m[i].key[0]) == (c.live[i] ? 1 : 0), "key %llu: %s",
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
        disk_fill(src, 28 * KiB, (unsigned)i + 1);
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
        disk_fresh_path(path, sizeof(path));
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
    disk_fresh_path(a, sizeof(a));
    disk_fresh_path(b, sizeof(b));
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
    struct tier_disk_config cfg = {
        .npaths = 1, .size = 4 * MiB, .page_size = 256 * KiB, .queue_depth = 8};
    struct tier_disk_stats st;
    struct found f = {0};
    struct done d;
    struct tier *t;
    int err = 0;
    memset(&c, 0, sizeof(c));
    disk_fresh_path(path, sizeof(path));
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
    disk_fill(src, 28 * KiB, 1);
    ckpt_add(t, &c, 1, src, true, &d);
    ck_assert(tier_disk_checkpoint_due(t, 3600 * 1000, 0));
    ck_assert_int_eq(ckpt_write(t, &c), 1);
    ck_assert(!tier_disk_checkpoint_due(t, 0, 0)); /* nothing changed since */
    disk_fill(src, 28 * KiB, 2);
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
    cfg.scan = disk_found_cb;
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
    struct tier_disk_config cfg = {
        .npaths = 1, .size = 2 * MiB, .page_size = 1 * MiB, .queue_depth = 8};
    struct tier *t;
    int err = 0, fd;
    disk_fresh_path(target, sizeof(target));
    disk_fresh_path(link_path, sizeof(link_path));
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
    struct tier_disk_meta m = disk_meta(5, 28 * KiB);
    struct flock fl = {.l_type = F_WRLCK,
                       .l_whence = SEEK_SET,
                       .l_start = (off_t)1 << 62,
                       .l_len = (off_t)1 << 32};
    struct found f = {0};
    struct tier_loc loc;
    struct tier *t, *t2;
    uint64_t h0;
    int err = 0, fd;
    disk_fresh_path(path, sizeof(path));
    disk_fresh_path(hard, sizeof(hard));
    t = disk_open(path, 2 * MiB, 256 * KiB, NULL);
    disk_fill(src, 28 * KiB, 5);
    ck_assert_int_eq(t->ops->alloc(t, 28 * KiB, &loc), 0);
    ck_assert_int_eq(disk_put(t, &loc, &m, src), 0);
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
    cfg.scan = disk_found_cb;
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
    struct tier_disk_config cfg = {
        .npaths = 1, .size = 2 * MiB, .page_size = 1 * MiB, .queue_depth = 8};
    const char text[] = "somebody's database\n";
    char back[sizeof(text)];
    struct tier *t;
    int err = 0, fd;
    disk_fresh_path(path, sizeof(path));
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
    disk_fresh_path(missing, sizeof(missing));
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
    struct tier_disk_meta m = disk_meta(5, len);
    struct tier_disk_stats st;
    struct tier_loc loc;
    struct done d = {0, -1};
    struct tier *t;
    disk_fresh_path(path, sizeof(path));
    t = disk_open(path, 2 * MiB, 1 * MiB, NULL);
    disk_fill(src, len, 5);
    ck_assert_int_eq(t->ops->alloc(t, len, &loc), 0);
    ck_assert_int_eq(disk_put(t, &loc, &m, src), 0);
    ck_assert_int_eq(disk_get(t, &loc, &m, dst, len), 0);
    /* the file now ends 32 KiB into the record's data */
    ck_assert_int_eq(truncate(path, (off_t)(TIER_DISK_SB + loc.off + 32 * KiB)), 0);
    ck_assert_int_eq(disk_get(t, &loc, &m, dst, len), -EIO);
    ck_assert_int_eq(t->ops->read(t, &loc, 16 * KiB, dst, 32 * KiB, disk_done_cb, &d), 0);
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
    struct tier_disk_meta m = disk_meta(6, len);
    struct tier_disk_stats st;
    struct rlimit rl;
    struct tier_loc loc;
    struct done d = {0, -1};
    struct tier *t;
    disk_fresh_path(path, sizeof(path));
    t = disk_open(path, 2 * MiB, 1 * MiB, NULL);
    disk_fill(src, len, 6);
    ck_assert_int_eq(t->ops->alloc(t, len, &loc), 0);
    /* the header and the first 32 KiB of data may be written, the rest may not */
    ck_assert_int_eq(truncate(path, (off_t)(TIER_DISK_SB + loc.off - TIER_DISK_HDR)), 0);
    signal(SIGXFSZ, SIG_IGN);
    rl.rlim_cur = rl.rlim_max = TIER_DISK_SB + loc.off + 32 * KiB;
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    ck_assert_int_eq(tier_disk_put(t, &loc, &m, src, disk_done_cb, &d), 0);
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
    Suite *s = suite_create("tier_disk_open");
    TCase *tc = tcase_create("disk");
    tcase_set_timeout(tc, daemon_slow() * 30);
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
    return disk_suite_run(disk_suite(), "tier_disk_open");
}
