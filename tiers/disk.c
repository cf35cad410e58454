/*
 * disk.c — the disk tier; see disk.h for the design. This file: pages and their allocation,
 * and the tier's start and stop (paths, superblocks, the lock, the index walk); the records
 * are in disk_rec.c, the requests to the device in disk_io.c, the checkpoint in disk_ckpt.c
 * (disk_int.h holds what they share).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "tiers/disk.h"
#include "tiers/disk_codec.h"
#include "tiers/disk_int.h"

uint64_t tier_disk_record_bytes(uint64_t len)
{
    return TIER_DISK_HDR + tier_disk_round(len);
}

uint64_t tier_disk_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void *tier_disk_aligned(uint64_t len)
{
    void *p = NULL;
    if (posix_memalign(&p, TIER_DISK_ALIGN, len ? len : TIER_DISK_ALIGN))
        return NULL;
    return p;
}

uint64_t tier_disk_hdr_csum(const struct tier_disk *d, uint32_t path, const struct tier_disk_hdr *h)
{
    return XXH3_64bits_withSeed(h, offsetof(struct tier_disk_hdr, hdr_csum), d->secret[path]);
}

/* ---- pages ----------------------------------------------------------------------------- */

uint64_t tier_disk_page_base(const struct tier_disk *d, uint32_t page)
{
    return (uint64_t)page * d->cfg.page_size;
}

uint32_t tier_disk_page_path(const struct tier_disk *d, uint32_t page)
{
    return (uint32_t)(page / d->pages_per_path);
}

/* Byte offset inside its path of a global offset (past the superblock). */
uint64_t tier_disk_path_off(const struct tier_disk *d, uint64_t off)
{
    return TIER_DISK_SB + off % d->path_size;
}

void tier_disk_page_maybe_free(struct tier_disk *d, uint32_t p)
{
    struct tier_disk_page *pg = &d->pages[p];
    if (pg->state == TIER_DISK_PAGE_FULL && pg->live == 0 && pg->inflight == 0) {
        pg->state = TIER_DISK_PAGE_FREE;
        pg->used = 0;
        d->st.pages_free++;
    }
}

/* Opens a free page on a healthy path, round robin over paths. */
static int tier_disk_page_open(struct tier_disk *d)
{
    for (uint32_t k = 0; k < d->npaths; k++) {
        uint32_t path = (d->rr + k) % d->npaths;
        if (d->failed[path])
            continue;
        for (uint64_t i = 0; i < d->pages_per_path; i++) {
            uint32_t p = (uint32_t)(path * d->pages_per_path + i);
            struct tier_disk_page *pg = &d->pages[p];
            if (pg->state != TIER_DISK_PAGE_FREE || pg->inflight)
                continue;
            pg->state = TIER_DISK_PAGE_OPEN;
            pg->version = ++d->next_version;
            pg->used = 0;
            pg->live = 0;
            pg->live_bytes = 0;
            d->st.pages_free--;
            d->open_page = p;
            d->rr = path + 1;
            return 0;
        }
    }
    return -ENOSPC;
}

static void tier_disk_page_close(struct tier_disk *d)
{
    if (d->open_page == UINT32_MAX)
        return;
    d->pages[d->open_page].state = TIER_DISK_PAGE_FULL;
    tier_disk_page_maybe_free(d, d->open_page);
    d->open_page = UINT32_MAX;
}

static int tier_disk_alloc(struct tier *t, uint64_t len, struct tier_loc *loc)
{
    struct tier_disk *d = tier_disk_of(t);
    uint64_t rec;
    struct tier_disk_page *pg;
    int rc;
    if (len == 0 || len > d->cfg.page_size - TIER_DISK_HDR)
        return -EINVAL;
    rec = tier_disk_record_bytes(len);
    if (d->open_page != UINT32_MAX && (d->failed[tier_disk_page_path(d, d->open_page)] ||
                                       d->pages[d->open_page].used + rec > d->cfg.page_size))
        tier_disk_page_close(d);
    if (d->open_page == UINT32_MAX) {
        rc = tier_disk_page_open(d);
        if (rc)
            return rc;
    }
    pg = &d->pages[d->open_page];
    *loc = (struct tier_loc){.arena = tier_disk_page_path(d, d->open_page),
                             .cls = pg->version,
                             .off = tier_disk_page_base(d, d->open_page) + pg->used + TIER_DISK_HDR,
                             .len = rec - TIER_DISK_HDR};
    pg->used += rec;
    pg->live++;
    pg->live_bytes += loc->len;
    d->st.used += loc->len;
    d->last_alloc = loc->off;
    d->last_alloc_put = false;
    d->gen++;
    return 0;
}

/* The page of a location the tier handed out and has not seen freed (live page, same
 * version, inside the page), or UINT32_MAX. */
uint32_t tier_disk_loc_page(const struct tier_disk *d, const struct tier_loc *loc)
{
    uint64_t p;
    if (loc->off < TIER_DISK_HDR || loc->len == 0 || loc->len % TIER_DISK_ALIGN ||
        loc->off % TIER_DISK_ALIGN)
        return UINT32_MAX;
    p = (loc->off - TIER_DISK_HDR) / d->cfg.page_size;
    if (p >= d->npages || d->pages[p].state == TIER_DISK_PAGE_FREE ||
        d->pages[p].version != loc->cls)
        return UINT32_MAX;
    if (loc->len > d->cfg.page_size ||
        loc->off + loc->len > tier_disk_page_base(d, (uint32_t)p) + d->cfg.page_size)
        return UINT32_MAX;
    return (uint32_t)p;
}

static void tier_disk_free(struct tier *t, const struct tier_loc *loc)
{
    struct tier_disk *d = tier_disk_of(t);
    uint32_t p = tier_disk_loc_page(d, loc);
    struct tier_disk_page *pg;
    if (p == UINT32_MAX)
        return;
    pg = &d->pages[p];
    if (pg->live == 0)
        return;
    /* The latest record of the open page, never written: take the room back, so the page
     * keeps no hole that would end its chain at the next start (records behind a hole are
     * not found). */
    if (p == d->open_page && loc->off == d->last_alloc && !d->last_alloc_put &&
        loc->off + loc->len == tier_disk_page_base(d, p) + pg->used) {
        pg->used -= loc->len + TIER_DISK_HDR;
        d->last_alloc = 0;
    }
    pg->live--;
    d->gen++;
    pg->live_bytes -= loc->len < pg->live_bytes ? loc->len : pg->live_bytes;
    d->st.used -= loc->len < d->st.used ? loc->len : d->st.used;
    tier_disk_page_maybe_free(d, p);
}

/* ---- start ----------------------------------------------------------------------------- */

bool tier_disk_hdr_ok(const struct tier_disk *d, uint32_t path, const struct tier_disk_hdr *h,
                      uint64_t at)
{
    return h->magic == TIER_DISK_MAGIC && h->format == TIER_DISK_VERSION &&
           h->hdr_csum == tier_disk_hdr_csum(d, path, h) && h->len != 0 &&
           h->len <= d->cfg.page_size - TIER_DISK_HDR &&
           at + tier_disk_record_bytes(h->len) <= d->cfg.page_size && h->raw_len != 0 &&
           (h->codec != TIER_DISK_CODEC_RAW || h->raw_len == h->len);
}

bool tier_disk_found(struct tier_disk *d, uint32_t p, uint32_t ver, const struct tier_disk_meta *m,
                     const struct tier_loc *loc)
{
    struct tier_disk_page *pg = &d->pages[p];
    uint64_t end = loc->off + loc->len - tier_disk_page_base(d, p);
    if (!d->cfg.scan)
        return false;
    /* The page must look live while the callback decides. */
    pg->state = TIER_DISK_PAGE_FULL;
    pg->version = ver;
    if (d->cfg.scan(d->cfg.scan_arg, m, loc) != 0)
        return false;
    pg->live++;
    pg->live_bytes += loc->len;
    if (pg->used < end)
        pg->used = end;
    d->st.used += loc->len;
    d->st.records_found++;
    return true;
}

/* Walks the record chain of every page (no checkpoint, or one that was refused). */
static int tier_disk_scan(struct tier_disk *d)
{
    struct tier_disk_walk *w = calloc(d->npages, sizeof(*w));
    uint32_t maxv = 0;
    int rc;
    if (!w)
        return -ENOMEM;
    for (uint32_t p = 0; p < d->npages; p++)
        w[p] = (struct tier_disk_walk){.page = p};
    rc = tier_disk_walk(d, w, d->npages, NULL, 0);
    for (uint32_t p = 0; p < d->npages && rc == 0; p++) {
        struct tier_disk_page *pg = &d->pages[p];
        /* Every page opened later gets a newer version than any record left anywhere. */
        if (w[p].ver > maxv)
            maxv = w[p].ver;
        if (pg->live) {
            pg->state = TIER_DISK_PAGE_FULL;
            pg->version = w[p].ver;
            pg->used = w[p].at;
        } else {
            pg->state = TIER_DISK_PAGE_FREE;
            pg->version = 0;
            pg->used = 0;
            d->st.pages_free++;
        }
    }
    d->next_version = maxv;
    free(w);
    return rc;
}

/* What the first 4 KiB of a path hold. */
enum tier_disk_sb_kind {
    TIER_DISK_SB_CURRENT = 0, /* a kvcd superblock of this format */
    TIER_DISK_SB_EMPTY = 1,   /* zeros (a new file, a fresh or discarded device) */
    TIER_DISK_SB_KVCD = 2,    /* a kvcd superblock of another format, or a torn one */
    TIER_DISK_SB_FOREIGN = 3, /* anything else: someone's data */
};

/* Reads the superblock of path i (bytes past the end of a short file read as zeros). */
static int tier_disk_sb_read(struct tier_disk *d, uint32_t i, enum tier_disk_sb_kind *kind)
{
    struct tier_disk_sb *sb = tier_disk_aligned(TIER_DISK_SB);
    const uint8_t *b = (const uint8_t *)sb;
    ssize_t n;
    if (!sb)
        return -ENOMEM;
    memset(sb, 0, TIER_DISK_SB);
    n = pread(d->fds[i], sb, TIER_DISK_SB, 0);
    if (n < 0) {
        int rc = -errno;
        free(sb);
        return rc;
    }
    if (sb->magic == TIER_DISK_SB_MAGIC && sb->format == TIER_DISK_VERSION &&
        sb->csum == XXH3_64bits(sb, offsetof(struct tier_disk_sb, csum))) {
        *kind = TIER_DISK_SB_CURRENT;
        d->secret[i] = sb->secret;
    } else if (sb->magic == TIER_DISK_SB_MAGIC) {
        *kind = TIER_DISK_SB_KVCD;
    } else {
        *kind = TIER_DISK_SB_EMPTY;
        for (uint32_t k = 0; k < TIER_DISK_SB; k++)
            if (b[k]) {
                *kind = TIER_DISK_SB_FOREIGN;
                break;
            }
    }
    free(sb);
    return 0;
}

/* Writes a new superblock with a fresh secret on path i: whatever records it held can no
 * longer verify. 0 or -errno. */
static int tier_disk_sb_write(struct tier_disk *d, uint32_t i)
{
    struct tier_disk_sb *sb = tier_disk_aligned(TIER_DISK_SB);
    int rc = 0;
    if (!sb)
        return -ENOMEM;
    memset(sb, 0, TIER_DISK_SB);
    sb->magic = TIER_DISK_SB_MAGIC;
    sb->format = TIER_DISK_VERSION;
    if (getrandom(&sb->secret, sizeof(sb->secret), 0) != sizeof(sb->secret))
        sb->secret = tier_disk_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)sb;
    sb->created_ns = tier_disk_now_ns();
    sb->csum = XXH3_64bits(sb, offsetof(struct tier_disk_sb, csum));
    if (pwrite(d->fds[i], sb, TIER_DISK_SB, 0) != TIER_DISK_SB || fdatasync(d->fds[i]) < 0)
        rc = -EIO;
    else
        d->secret[i] = sb->secret;
    free(sb);
    return rc;
}

/* open(2) with O_DIRECT, or without it where the file system refuses it (*buffered). */
static int tier_disk_open_direct(const char *path, int flags, bool *buffered)
{
    int fd = open(path, flags | O_DIRECT, 0600);
    if (fd < 0 && errno == EINVAL) {
        fd = open(path, flags, 0600);
        if (fd < 0 && errno == EEXIST && (flags & O_EXCL)) {
            /* Some file systems create the file, then refuse O_DIRECT: it is this start's. */
            fd = open(path, flags & ~(O_CREAT | O_EXCL), 0600);
        }
        *buffered = fd >= 0;
    }
    return fd;
}

/* Opens path i. The last component must not be a symbolic link (O_NOFOLLOW): a link planted
 * where the tier's file belongs would make the daemon write wherever it points. With
 * TIER_DISK_FORMAT_NEVER a missing file is not created. A file this start creates (O_EXCL
 * tells) is marked, so that a start that fails removes it (tier_disk_new). */
static int tier_disk_open_fd(struct tier_disk *d, uint32_t i)
{
    const char *path = d->cfg.paths[i];
    int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW;
    bool buffered = false;
    struct stat ls;
    int fd = -1;
    if (d->cfg.format != TIER_DISK_FORMAT_NEVER) {
        fd = tier_disk_open_direct(path, flags | O_CREAT | O_EXCL, &buffered);
        d->created[i] = fd >= 0;
    }
    if (fd < 0 && (errno == EEXIST || d->cfg.format == TIER_DISK_FORMAT_NEVER))
        fd = tier_disk_open_direct(path, flags, &buffered);
    if (fd >= 0) {
        if (buffered) {
            fprintf(stderr,
                    "kvcd: disk: %s: O_DIRECT refused by the file system; using BUFFERED "
                    "I/O (slower, and the page cache holds a second copy)\n",
                    path);
            d->st.buffered = true;
        }
        d->fds[i] = fd;
        return 0;
    }
    if ((errno == ELOOP || errno == EMLINK) && lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode)) {
        fprintf(stderr,
                "kvcd: disk: %s is a symbolic link; refusing it (name the file or "
                "device itself, e.g. the output of readlink -f)\n",
                path);
        return -ELOOP;
    }
    if (errno == ENOENT && d->cfg.format == TIER_DISK_FORMAT_NEVER)
        fprintf(stderr,
                "kvcd: disk: %s does not exist and disk.format is never; not "
                "creating it\n",
                path);
    return -errno;
}

/* Removes the files this start created (a start that failed): they hold nothing but a
 * superblock. Only while the name still leads to the file this tier opened. */
static void tier_disk_uncreate(struct tier_disk *d)
{
    for (uint32_t i = 0; i < d->npaths; i++) {
        struct stat a, b;
        if (d->created[i] && d->fds[i] >= 0 && fstat(d->fds[i], &a) == 0 &&
            lstat(d->cfg.paths[i], &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
            unlink(d->cfg.paths[i]);
    }
}

/* One kvcd per path. An OFD write lock on byte 0 of the path is held for as long as the
 * descriptor is open (the ring's registered copy included), so it goes with the process
 * however it ends and never goes stale. F_OFD_GETLK reports no pid for OFD locks, so the
 * holder also locks one byte at TIER_DISK_LOCK_PID + its pid: a refused daemon reads the pid
 * from the offset of that lock. Both lie far past the end of any file or device: locks are
 * ranges, not bytes, and nothing is written there. */
#define TIER_DISK_LOCK_PID ((off_t)1 << 62)
#define TIER_DISK_LOCK_PIDS ((off_t)1 << 32)
#define TIER_DISK_LOCK_WAIT_MS 10000u

/* The pid that holds path i's lock (as its own pid namespace numbers it), or 0. */
static pid_t tier_disk_lock_holder(const struct tier_disk *d, uint32_t i)
{
    struct flock fl = {.l_type = F_WRLCK,
                       .l_whence = SEEK_SET,
                       .l_start = TIER_DISK_LOCK_PID,
                       .l_len = TIER_DISK_LOCK_PIDS};
    if (fcntl(d->fds[i], F_OFD_GETLK, &fl) < 0 || fl.l_type == F_UNLCK ||
        fl.l_start < TIER_DISK_LOCK_PID || fl.l_start - TIER_DISK_LOCK_PID > INT32_MAX)
        return 0;
    return (pid_t)(fl.l_start - TIER_DISK_LOCK_PID);
}

/* Whether pid runs (signal 0 reaches it, or it exists and refuses us). */
static bool tier_disk_pid_alive(pid_t pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

/* Takes path i's lock before anything is read or written there: 0, -EBUSY (another kvcd, or
 * this one through another path naming the same file, holds it), or -errno. A holder that has
 * exited may hold it a little longer: the kernel lets go of a killed daemon's io_uring, and
 * the descriptors registered with it, after the process is gone. So a lock whose holder is
 * dead (or unknown) is tried again for up to TIER_DISK_LOCK_WAIT_MS. */
static int tier_disk_lock(struct tier_disk *d, uint32_t i)
{
    const char *path = d->cfg.paths[i];
    uint64_t until = tier_disk_now_ns() + TIER_DISK_LOCK_WAIT_MS * 1000000ull;
    pid_t holder;
    int rc;
    for (;;) {
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
        if (fcntl(d->fds[i], F_OFD_SETLK, &fl) == 0) {
            d->locked[i] = true;
            fl.l_start = TIER_DISK_LOCK_PID + getpid();
            if (fcntl(d->fds[i], F_OFD_SETLK, &fl) == 0)
                return 0;
        }
        rc = -errno;
        if (rc != -EAGAIN && rc != -EACCES) {
            fprintf(stderr,
                    "kvcd: disk: %s: cannot lock it (%s); refusing to use it "
                    "unlocked\n",
                    path, strerror(-rc));
            return rc;
        }
        holder = tier_disk_lock_holder(d, i);
        if (holder == getpid() || tier_disk_pid_alive(holder) || tier_disk_now_ns() >= until)
            break;
        usleep(10000);
    }
    if (holder == getpid())
        fprintf(stderr,
                "kvcd: disk: %s names a file this kvcd already uses (listed twice in "
                "disk.path?)\n",
                path);
    else if (tier_disk_pid_alive(holder))
        fprintf(stderr,
                "kvcd: disk: %s is in use by another kvcd (pid %d); refusing to start on "
                "it (one daemon per disk file)\n",
                path, (int)holder);
    else
        fprintf(stderr,
                "kvcd: disk: %s is still locked %u s after its holder (pid %d) is "
                "gone; refusing to start on it (one daemon per disk file)\n",
                path, TIER_DISK_LOCK_WAIT_MS / 1000, (int)holder);
    return -EBUSY;
}

/* Gives path i's lock back. Explicitly: the ring's registered copy of the descriptor is let go
 * asynchronously after io_uring_queue_exit, and with it the lock, so a tier opened right after
 * this one was destroyed (a restart in one process) could find it still held. */
static void tier_disk_unlock(struct tier_disk *d, uint32_t i)
{
    struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    fcntl(d->fds[i], F_OFD_SETLK, &fl);
    fl.l_start = TIER_DISK_LOCK_PID;
    fl.l_len = TIER_DISK_LOCK_PIDS;
    fcntl(d->fds[i], F_OFD_SETLK, &fl);
}

/* Whether path i may be used as it is, formatted, or not at all (cfg.format). */
static int tier_disk_sb_load(struct tier_disk *d, uint32_t i, enum tier_disk_sb_kind kind)
{
    const char *path = d->cfg.paths[i];
    if (kind == TIER_DISK_SB_CURRENT)
        return 0;
    if (d->cfg.format == TIER_DISK_FORMAT_NEVER ||
        (kind == TIER_DISK_SB_FOREIGN && d->cfg.format != TIER_DISK_FORMAT_FORCE)) {
        fprintf(stderr,
                "kvcd: disk: %s holds %s; refusing to overwrite it (disk.format=force "
                "formats it, losing what it holds)\n",
                path,
                kind == TIER_DISK_SB_FOREIGN ? "data that is not a kvcd disk tier"
                                             : "no kvcd disk tier of this format");
        return -EEXIST;
    }
    return tier_disk_sb_write(d, i);
}

static int tier_disk_open_path(struct tier_disk *d, uint32_t i, uint64_t *size, bool *is_file)
{
    struct stat st;
    enum tier_disk_sb_kind kind = TIER_DISK_SB_FOREIGN;
    int rc = tier_disk_open_fd(d, i);
    if (rc == 0)
        rc = tier_disk_lock(d, i);
    if (rc)
        return rc;
    if (fstat(d->fds[i], &st) < 0)
        return -errno;
    *is_file = S_ISREG(st.st_mode);
    if (!S_ISBLK(st.st_mode) && !S_ISREG(st.st_mode))
        return -EINVAL;
    /* What the path holds is decided before anything is written, sizing included. */
    rc = tier_disk_sb_read(d, i, &kind);
    if (rc == 0)
        rc = tier_disk_sb_load(d, i, kind);
    if (rc)
        return rc;
    if (S_ISBLK(st.st_mode)) {
        uint64_t bytes = 0;
        if (ioctl(d->fds[i], BLKGETSIZE64, &bytes) < 0)
            return -errno;
        if (bytes <= TIER_DISK_SB)
            return -ENOSPC;
        bytes -= TIER_DISK_SB;
        *size = d->cfg.size && d->cfg.size < bytes ? d->cfg.size : bytes;
        return 0;
    }
    *size = d->cfg.size;
    if ((uint64_t)st.st_size < d->cfg.size + TIER_DISK_SB) {
        rc = posix_fallocate(d->fds[i], 0, (off_t)(d->cfg.size + TIER_DISK_SB));
        if (rc == EOPNOTSUPP || rc == EINVAL)
            rc = ftruncate(d->fds[i], (off_t)(d->cfg.size + TIER_DISK_SB)) < 0 ? errno : 0;
        if (rc)
            return -rc;
    }
    return 0;
}

static void tier_disk_destroy(struct tier *t)
{
    struct tier_disk *d = tier_disk_of(t);
    if (d->ring_ok) {
        tier_disk_drain(t);
        io_uring_queue_exit(&d->ring);
    }
    tier_disk_pool_stop(d);
    if (d->efd >= 0)
        close(d->efd);
    for (uint32_t i = 0; i < TIER_DISK_MAX_PATHS; i++)
        if (d->fds[i] >= 0) {
            if (d->locked[i])
                tier_disk_unlock(d, i);
            close(d->fds[i]);
        }
    tier_disk_ckpt_fini(d);
    free(d->pages);
    free(d->ckpt_path);
    free(d);
}

static uint64_t tier_disk_capacity(const struct tier *t)
{
    return tier_disk_of(t)->st.capacity;
}

static uint64_t tier_disk_usage(const struct tier *t)
{
    return tier_disk_of(t)->st.used;
}

static const struct tier_ops tier_disk_ops = {
    .name = "disk",
    .alloc = tier_disk_alloc,
    .free = tier_disk_free,
    .read = tier_disk_read,
    .write = tier_disk_write,
    .capacity = tier_disk_capacity,
    .usage = tier_disk_usage,
    .destroy = tier_disk_destroy,
};

struct tier *tier_disk_new(const struct tier_disk_config *cfg, int *err)
{
    struct tier_disk *d = calloc(1, sizeof(*d));
    uint64_t size = UINT64_MAX, t0 = tier_disk_now_ns();
    bool first_is_file = false;
    int rc = -ENOMEM;
    if (!d)
        goto fail;
    d->base.ops = &tier_disk_ops;
    d->efd = -1;
    for (uint32_t i = 0; i < TIER_DISK_MAX_PATHS; i++)
        d->fds[i] = -1;
    d->cfg = *cfg;
    d->open_page = UINT32_MAX;
    rc = -EINVAL;
    if (cfg->npaths == 0 || cfg->npaths > TIER_DISK_MAX_PATHS || cfg->page_size < (64u << 10) ||
        cfg->page_size % TIER_DISK_ALIGN || cfg->page_size > (1u << 30) || cfg->queue_depth == 0 ||
        cfg->queue_depth > 4096 || cfg->format > TIER_DISK_FORMAT_FORCE)
        goto fail;
    d->npaths = cfg->npaths;
    for (uint32_t i = 0; i < d->npaths; i++) {
        uint64_t s = 0;
        bool is_file = false;
        rc = tier_disk_open_path(d, i, &s, &is_file);
        if (rc)
            goto fail;
        if (i == 0)
            first_is_file = is_file;
        if (s < size)
            size = s;
    }
    /* Every path gets the same number of pages, so page p lives on path p / pages_per_path. */
    d->pages_per_path = size / cfg->page_size;
    rc = -ENOSPC;
    if (d->pages_per_path == 0 || d->pages_per_path * d->npaths > UINT32_MAX / 2)
        goto fail;
    d->path_size = d->pages_per_path * cfg->page_size;
    d->npages = d->pages_per_path * d->npaths;
    d->st.capacity = d->path_size * d->npaths;
    d->st.pages = d->npages;
    d->pages = calloc(d->npages, sizeof(*d->pages));
    rc = -ENOMEM;
    if (!d->pages)
        goto fail;
    /* Reads and writes have queue_depth requests each, so a burst of demotions never keeps
     * a lookup's reads waiting; two entries per request (header and data). */
    rc = io_uring_queue_init(cfg->queue_depth * 4, &d->ring, 0);
    if (rc < 0)
        goto fail;
    d->ring_ok = true;
    d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (d->efd < 0) {
        rc = -errno;
        goto fail;
    }
    rc = io_uring_register_eventfd(&d->ring, d->efd);
    if (rc < 0)
        goto fail;
    d->fixed_files = io_uring_register_files(&d->ring, d->fds, d->npaths) == 0;
    rc = tier_disk_pool_start(d);
    if (rc)
        goto fail;
    d->last_refill_ns = tier_disk_now_ns();
    d->tokens = tier_disk_burst(d);
    rc = tier_disk_ckpt_init(d, first_is_file);
    if (rc)
        goto fail;
    /* A valid checkpoint plus the pages written since, or else every page's chain. */
    if (tier_disk_ckpt_load(d) == 0) {
        d->st.ckpt_loaded = true;
    } else {
        rc = tier_disk_scan(d);
        if (rc)
            goto fail;
    }
    /* Nothing changed yet; a start that walked records has a checkpoint to catch up. */
    d->ckpt_gen = d->st.records_walked || !d->st.ckpt_loaded ? UINT64_MAX : d->gen;
    d->ckpt_try_ns = tier_disk_now_ns();
    d->st.start_us = (d->ckpt_try_ns - t0) / 1000;
    return &d->base;
fail:
    if (d) {
        tier_disk_uncreate(d);
        tier_disk_destroy(&d->base);
    }
    *err = rc;
    return NULL;
}

bool tier_disk_can_alloc(const struct tier *t, uint64_t len)
{
    const struct tier_disk *d = tier_disk_of(t);
    uint64_t rec = tier_disk_record_bytes(len);
    if (d->open_page != UINT32_MAX && !d->failed[tier_disk_page_path(d, d->open_page)] &&
        d->pages[d->open_page].used + rec <= d->cfg.page_size)
        return true;
    for (uint32_t p = 0; p < d->npages; p++)
        if (d->pages[p].state == TIER_DISK_PAGE_FREE && !d->pages[p].inflight &&
            !d->failed[tier_disk_page_path(d, p)])
            return true;
    return false;
}

int tier_disk_page_of(const struct tier *t, const struct tier_loc *loc)
{
    uint32_t p = tier_disk_loc_page(tier_disk_of(t), loc);
    return p == UINT32_MAX ? -1 : (int)p;
}

int tier_disk_compact_pick(const struct tier *t, uint32_t below_pct, uint32_t *page)
{
    const struct tier_disk *d = tier_disk_of(t);
    uint64_t best_num = 1, best_den = 0;
    for (uint32_t p = 0; p < d->npages; p++) {
        const struct tier_disk_page *pg = &d->pages[p];
        uint64_t live;
        if (pg->state != TIER_DISK_PAGE_FULL || pg->live == 0 || pg->used == 0 ||
            d->failed[tier_disk_page_path(d, p)])
            continue;
        live = pg->live_bytes + (uint64_t)pg->live * TIER_DISK_HDR;
        /* live/used below the threshold (of the whole page, so a page closed early by a
         * record that did not fit still counts its tail as reclaimable) */
        if (live * 100 >= (uint64_t)below_pct * d->cfg.page_size)
            continue;
        if (best_den == 0 || live * best_den < best_num * d->cfg.page_size) {
            best_num = live;
            best_den = d->cfg.page_size;
            *page = p;
        }
    }
    return best_den ? 0 : -ENOENT;
}

void tier_disk_stats_get(const struct tier *t, struct tier_disk_stats *st)
{
    const struct tier_disk *d = tier_disk_of(t);
    *st = d->st;
    st->ckpt_stale = d->ckpt_path && (d->gen != d->ckpt_gen || d->ckpt_sync);
    st->dead_bytes = 0;
    for (uint64_t p = 0; p < d->npages; p++)
        if (d->pages[p].state == TIER_DISK_PAGE_FULL)
            st->dead_bytes += d->pages[p].used - d->pages[p].live_bytes -
                              (uint64_t)d->pages[p].live * TIER_DISK_HDR;
}
