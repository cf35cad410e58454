/*
 * check_tier_disk.c — the disk tier: the conformance cases (as the host tier runs them),
 * then what only the disk promises: records survive a reopen, a flipped byte or a stale
 * location is refused, a torn record is never reported intact, the write rate is bounded,
 * block bytes shaped like a header are never taken for one, a record allocated and freed
 * unwritten leaves no hole, compressed records round trip byte-exact, survive a reopen and
 * refuse a flipped byte, and incompressible blocks are stored raw.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    tcase_add_test(tc, test_fixed_buffers_and_rate);
    tcase_add_test(tc, test_pages_reclaimed);
    tcase_add_test(tc, test_forged_header_in_stale_page);
    tcase_add_test(tc, test_unwritten_record_leaves_no_hole);
    tcase_add_test(tc, test_compressed_roundtrip_reopen_flip);
    tcase_add_test(tc, test_device_queue_depth);
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
