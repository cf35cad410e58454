/*
 * disk.c — the disk tier; see disk.h for the design.
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

enum tier_disk_op_kind {
    TIER_DISK_OP_READ = 1,  /* raw bytes (generic op) */
    TIER_DISK_OP_WRITE = 2, /* raw bytes (generic op) */
    TIER_DISK_OP_PUT = 3,   /* header + data */
    TIER_DISK_OP_GET = 4,   /* header + data, verified */
};

struct tier_disk_op {
    tier_done_fn done;
    void *arg;
    uint8_t kind;
    uint8_t pending; /* requests not completed */
    int status;
    uint32_t page;
    uint32_t path;
    uint64_t bytes;   /* counted when done */
    void *buf;        /* aligned: the header (PUT/GET) or a bounce buffer */
    uint64_t buf_len;
    void *dst;        /* READ via bounce / GET: where the data goes */
    uint64_t skip;    /* READ via bounce: offset of the wanted bytes inside buf */
    uint64_t len;     /* READ: wanted bytes; GET: dst bytes */
    void *data_bounce; /* GET/PUT: the data passed through buf_len-sized bounce */
    struct iovec iov[2]; /* PUT/GET: header and data, one request */
    bool has_expect;
    struct tier_disk_meta expect; /* GET: what the record must say; PUT: what it says */
    /* Worker stages (docs/disk.md): a PUT is hashed, and compressed when asked, before it
     * is submitted; a GET is hashed, and decompressed, after its read completed. */
    struct tier_disk_op *next; /* worker queue / done list */
    uint8_t stage;             /* enum tier_disk_stage */
    bool on_dev;               /* PUT/GET: holds one of the direction's device slots */
    void *io_data;             /* PUT/GET: the data part of the request, kept while the */
    uint64_t io_len, io_off;   /* op waits for a device slot */
    bool submit_at_loc;        /* PUT via tier_disk_put: submit at loc once encoded */
    int level;                 /* PUT: zstd level, 0: store raw */
    uint8_t codec_req;         /* PUT: codec to try */
    const void *src;           /* PUT: the block in memory (m.len bytes) */
    void *enc;                 /* PUT: compressed bytes, rounded up with zeros */
    const void *data;          /* PUT: what goes to the device (src, enc or data_bounce) */
    uint64_t data_csum;        /* PUT: XXH3 of the stored bytes */
    struct tier_loc loc;       /* PUT: the record */
    tier_disk_encoded_fn encoded; /* PUT via tier_disk_encode */
    uint64_t tokens;           /* PUT via tier_disk_encode: budget taken at submission */
    uint64_t want, got;        /* bytes asked of the device, and bytes it transferred */
    /* PUT at a location: the list of record writes in flight (d->puts), which a checkpoint
     * asks where each page may still grow. */
    struct tier_disk_op *put_prev, *put_next;
    bool put_listed;
};

/* An encoded record handed to the caller between tier_disk_encode and tier_disk_rec_put. */
struct tier_disk_rec {
    struct tier_disk_op op;
};

enum tier_disk_stage {
    TIER_DISK_STAGE_IO = 0,     /* in io_uring, or not queued */
    TIER_DISK_STAGE_ENCODE = 1, /* PUT: hash (and compress) on a worker */
    TIER_DISK_STAGE_VERIFY = 2, /* GET: hash (and decompress) on a worker */
    TIER_DISK_STAGE_WAIT = 3,   /* PUT/GET: ready, waiting for a device slot */
};

static uint64_t tier_disk_round(uint64_t len)
{
    return (len + TIER_DISK_ALIGN - 1) & ~(uint64_t)(TIER_DISK_ALIGN - 1);
}

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

static uint64_t tier_disk_hdr_csum(const struct tier_disk *d, uint32_t path,
                                   const struct tier_disk_hdr *h)
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

static void tier_disk_page_maybe_free(struct tier_disk *d, uint32_t p)
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
    if (d->open_page != UINT32_MAX &&
        (d->failed[tier_disk_page_path(d, d->open_page)] ||
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
                             .off = tier_disk_page_base(d, d->open_page) + pg->used +
                                    TIER_DISK_HDR,
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

/* ---- submission ------------------------------------------------------------------------ */

/* Index of the registered buffer holding [p, p+len), or -1. */
static int tier_disk_buf_index(const struct tier_disk *d, const void *p, uint64_t len)
{
    const uint8_t *a = p;
    for (uint32_t i = 0; i < d->nbufs; i++)
        if (a >= d->bufs[i].base && len <= d->bufs[i].len &&
            (uint64_t)(a - d->bufs[i].base) <= d->bufs[i].len - len)
            return (int)i;
    return -1;
}

static struct io_uring_sqe *tier_disk_sqe(struct tier_disk *d)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
    if (!sqe) {
        io_uring_submit(&d->ring);
        sqe = io_uring_get_sqe(&d->ring);
    }
    return sqe;
}

/* Prepares one read or write of len bytes at global offset off from/to buf. */
static int tier_disk_prep(struct tier_disk *d, struct tier_disk_op *op, bool write, void *buf,
                          uint64_t len, uint64_t off)
{
    struct io_uring_sqe *sqe = tier_disk_sqe(d);
    uint32_t path = (uint32_t)(off / d->path_size);
    int fd = d->fixed_files ? (int)path : d->fds[path];
    int bi = tier_disk_buf_index(d, buf, len);
    uint64_t poff = tier_disk_path_off(d, off);
    if (!sqe)
        return -EAGAIN;
    if (bi >= 0 && write)
        io_uring_prep_write_fixed(sqe, fd, buf, (unsigned)len, poff, bi);
    else if (bi >= 0)
        io_uring_prep_read_fixed(sqe, fd, buf, (unsigned)len, poff, bi);
    else if (write)
        io_uring_prep_write(sqe, fd, buf, (unsigned)len, poff);
    else
        io_uring_prep_read(sqe, fd, buf, (unsigned)len, poff);
    if (d->fixed_files)
        sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, op);
    op->pending++;
    op->want += len;
    return 0;
}

/* Prepares one vectored request: the 4 KiB header at off and the data right behind it. The
 * data then travels without the registered buffer (the header is not inside it), which
 * costs a page pin per request but saves a second request per record (docs/disk.md). */
static int tier_disk_prep_record(struct tier_disk *d, struct tier_disk_op *op, bool write,
                                 void *data, uint64_t len, uint64_t off)
{
    struct io_uring_sqe *sqe = tier_disk_sqe(d);
    uint32_t path = (uint32_t)(off / d->path_size);
    int fd = d->fixed_files ? (int)path : d->fds[path];
    uint64_t poff = tier_disk_path_off(d, off);
    if (!sqe)
        return -EAGAIN;
    op->iov[0] = (struct iovec){.iov_base = op->buf, .iov_len = TIER_DISK_HDR};
    op->iov[1] = (struct iovec){.iov_base = data, .iov_len = len};
    if (write)
        io_uring_prep_writev(sqe, fd, op->iov, 2, poff);
    else
        io_uring_prep_readv(sqe, fd, op->iov, 2, poff);
    if (d->fixed_files)
        sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, op);
    op->pending++;
    op->want += TIER_DISK_HDR + len;
    return 0;
}

static struct tier_disk_op *tier_disk_op_new(struct tier_disk *d, uint8_t kind, uint32_t page,
                                             tier_done_fn done, void *arg)
{
    struct tier_disk_op *op = calloc(1, sizeof(*op));
    if (!op)
        return NULL;
    op->kind = kind;
    op->page = page;
    op->path = page == UINT32_MAX ? 0 : tier_disk_page_path(d, page);
    op->done = done;
    op->arg = arg;
    return op;
}

/* Hands every prepared request to the kernel. */
static void tier_disk_submit(struct tier_disk *d)
{
    io_uring_submit(&d->ring);
    d->unsubmitted = 0;
}

static void tier_disk_op_start(struct tier_disk *d, struct tier_disk_op *op)
{
    d->inflight++;
    d->pages[op->page].inflight++;
    if (op->kind == TIER_DISK_OP_READ || op->kind == TIER_DISK_OP_GET)
        d->st.reads_inflight++;
    else
        d->st.writes_inflight++;
}

static void tier_disk_op_free(struct tier_disk_op *op)
{
    free(op->buf);
    free(op->data_bounce);
    free(op->enc);
    free(op);
}

/* Ops admitted per direction: queue_depth on the device and as many again being hashed,
 * waiting for a device slot, or handed back encoded. */
static uint32_t tier_disk_ops_max(const struct tier_disk *d)
{
    return 2 * d->cfg.queue_depth;
}

static void tier_disk_op_end(struct tier_disk *d, struct tier_disk_op *op);

/* Puts a PUT or GET (header and data, one request) on the device, or in line for it when
 * queue_depth records of its direction are there already. 0 or -errno (nothing queued). */
static int tier_disk_dev_submit(struct tier_disk *d, struct tier_disk_op *op)
{
    bool write = op->kind == TIER_DISK_OP_PUT;
    int rc;
    if (d->dev[write] >= d->cfg.queue_depth) {
        op->stage = TIER_DISK_STAGE_WAIT;
        op->next = NULL;
        if (d->waitq_tail[write])
            d->waitq_tail[write]->next = op;
        else
            d->waitq[write] = op;
        d->waitq_tail[write] = op;
        return 0;
    }
    rc = tier_disk_prep_record(d, op, write, op->io_data, op->io_len, op->io_off);
    if (rc)
        return rc;
    op->stage = TIER_DISK_STAGE_IO;
    op->on_dev = true;
    d->dev[write]++;
    d->unsubmitted++;
    return 0;
}

/* A device slot of one direction came free: the oldest waiting op takes it. */
static void tier_disk_dev_pump(struct tier_disk *d, bool write)
{
    while (d->waitq[write] && d->dev[write] < d->cfg.queue_depth) {
        struct tier_disk_op *op = d->waitq[write];
        d->waitq[write] = op->next;
        if (!d->waitq[write])
            d->waitq_tail[write] = NULL;
        op->next = NULL;
        op->status = tier_disk_dev_submit(d, op);
        if (op->status)
            tier_disk_op_end(d, op); /* done sees the error */
    }
}

/* Sleeps until the eventfd says a completion (ring or worker) may be ready, at most 100 ms. */
static void tier_disk_wait(struct tier_disk *d)
{
    struct pollfd pfd = {.fd = d->efd, .events = POLLIN};
    if (d->unsubmitted)
        tier_disk_submit(d);
    if (poll(&pfd, 1, 100) < 0) {
        /* EINTR: the caller looks again */
    }
}

/* Room for one more op, reaping completions when the ring is full (generic ops only: they
 * have no -EAGAIN in their contract). */
static void tier_disk_wait_room(struct tier_disk *d)
{
    while ((d->st.reads_inflight >= tier_disk_ops_max(d) ||
            d->st.writes_inflight >= tier_disk_ops_max(d)) && d->inflight)
        if (tier_disk_poll(&d->base) == 0)
            tier_disk_wait(d);
}

static bool tier_disk_range_ok(const struct tier_loc *loc, uint64_t off, uint64_t len)
{
    return len != 0 && off < loc->len && len <= loc->len - off;
}

/* Synchronous read-modify-write of an unaligned range through a bounce buffer. */
static int tier_disk_rmw(struct tier_disk *d, uint32_t path, uint64_t off, const void *src,
                         uint64_t len)
{
    uint64_t a0 = off & ~(uint64_t)(TIER_DISK_ALIGN - 1);
    uint64_t a1 = tier_disk_round(off + len);
    uint8_t *b = tier_disk_aligned(a1 - a0);
    int rc = 0;
    if (!b)
        return -ENOMEM;
    if (pread(d->fds[path], b, a1 - a0, (off_t)tier_disk_path_off(d, a0)) != (ssize_t)(a1 - a0)) {
        rc = -EIO;
        goto out;
    }
    memcpy(b + (off - a0), src, len);
    if (pwrite(d->fds[path], b, a1 - a0, (off_t)tier_disk_path_off(d, a0)) !=
        (ssize_t)(a1 - a0))
        rc = -EIO;
out:
    free(b);
    return rc;
}

static int tier_disk_write(struct tier *t, const struct tier_loc *loc, uint64_t off,
                           const void *src, uint64_t len, tier_done_fn done, void *arg)
{
    struct tier_disk *d = tier_disk_of(t);
    uint32_t p = tier_disk_loc_page(d, loc);
    uint64_t at = loc->off + off;
    struct tier_disk_op *op;
    int rc;
    if (p == UINT32_MAX || !tier_disk_range_ok(loc, off, len))
        return -EINVAL;
    if (at % TIER_DISK_ALIGN || len % TIER_DISK_ALIGN) {
        rc = tier_disk_rmw(d, tier_disk_page_path(d, p), at, src, len);
        if (rc == 0) {
            d->st.bytes_written += len;
            d->st.writes++;
        } else {
            d->st.write_errors++;
        }
        done(arg, rc);
        return 0;
    }
    tier_disk_wait_room(d);
    op = tier_disk_op_new(d, TIER_DISK_OP_WRITE, p, done, arg);
    if (!op)
        return -ENOMEM;
    op->bytes = len;
    if ((uintptr_t)src % TIER_DISK_ALIGN && tier_disk_buf_index(d, src, len) < 0) {
        op->buf = tier_disk_aligned(len);
        if (!op->buf) {
            tier_disk_op_free(op);
            return -ENOMEM;
        }
        memcpy(op->buf, src, len);
        src = op->buf;
    }
    rc = tier_disk_prep(d, op, true, (void *)src, len, at);
    if (rc) {
        tier_disk_op_free(op);
        return rc;
    }
    tier_disk_op_start(d, op);
    tier_disk_submit(d);
    return 0;
}

static int tier_disk_read(struct tier *t, const struct tier_loc *loc, uint64_t off, void *dst,
                          uint64_t len, tier_done_fn done, void *arg)
{
    struct tier_disk *d = tier_disk_of(t);
    uint32_t p = tier_disk_loc_page(d, loc);
    uint64_t at = loc->off + off, a0, a1;
    struct tier_disk_op *op;
    int rc;
    if (p == UINT32_MAX || !tier_disk_range_ok(loc, off, len))
        return -EINVAL;
    tier_disk_wait_room(d);
    op = tier_disk_op_new(d, TIER_DISK_OP_READ, p, done, arg);
    if (!op)
        return -ENOMEM;
    op->bytes = len;
    a0 = at & ~(uint64_t)(TIER_DISK_ALIGN - 1);
    a1 = tier_disk_round(at + len);
    if (a0 != at || a1 != at + len ||
        ((uintptr_t)dst % TIER_DISK_ALIGN && tier_disk_buf_index(d, dst, len) < 0)) {
        op->buf = tier_disk_aligned(a1 - a0);
        if (!op->buf) {
            tier_disk_op_free(op);
            return -ENOMEM;
        }
        op->dst = dst;
        op->skip = at - a0;
        op->len = len;
        rc = tier_disk_prep(d, op, false, op->buf, a1 - a0, a0);
    } else {
        rc = tier_disk_prep(d, op, false, dst, len, at);
    }
    if (rc) {
        tier_disk_op_free(op);
        return rc;
    }
    tier_disk_op_start(d, op);
    tier_disk_submit(d);
    return 0;
}

/* ---- records --------------------------------------------------------------------------- */

/* The bucket holds a quarter second of writes, and at least one page. */
static double tier_disk_burst(const struct tier_disk *d)
{
    return (double)d->cfg.write_rate / 4 > (double)d->cfg.page_size
               ? (double)d->cfg.write_rate / 4
               : (double)d->cfg.page_size;
}

static void tier_disk_refill(struct tier_disk *d)
{
    uint64_t now = tier_disk_now_ns();
    double burst = tier_disk_burst(d);
    d->tokens += (double)(now - d->last_refill_ns) * 1e-9 * (double)d->cfg.write_rate;
    if (d->tokens > burst)
        d->tokens = burst;
    d->last_refill_ns = now;
}

static bool tier_disk_write_budget(struct tier_disk *d, uint64_t bytes)
{
    if (!d->cfg.write_rate)
        return true;
    tier_disk_refill(d);
    if (d->tokens < (double)bytes)
        return false;
    d->tokens -= (double)bytes;
    return true;
}

int tier_disk_put_ready(struct tier *t, uint64_t len)
{
    struct tier_disk *d = tier_disk_of(t);
    if (d->st.writes_inflight >= tier_disk_ops_max(d))
        return -EAGAIN;
    if (d->cfg.write_rate) {
        tier_disk_refill(d);
        if (d->tokens < (double)tier_disk_record_bytes(len))
            return -EAGAIN;
    }
    return 0;
}

/* ---- workers --------------------------------------------------------------------------- */

struct tier_disk_worker_arg {
    struct tier_disk *d;
    uint32_t i;
};

/* PUT: picks what goes to the device (the block itself, a bounce copy of it, or its zstd
 * form when that saves at least 4 KiB) and hashes it. Worker thread: touches the op, the
 * block's bytes and the immutable registered-buffer table only. */
static void tier_disk_work_encode(struct tier_disk *d, struct disk_codec *c, struct tier_disk_op *op)
{
    struct tier_disk_meta *m = &op->expect;
    uint64_t dlen = tier_disk_round(m->len);
    op->data = op->src;
    m->stored = m->len;
    m->codec = TIER_DISK_CODEC_RAW;
    if (op->level > 0 && c) {
        uint64_t cap = tier_disk_round(disk_codec_bound(m->len));
        op->enc = tier_disk_aligned(cap);
        if (op->enc) {
            long n = disk_codec_compress(c, (enum tier_disk_codec)op->codec_req, op->level,
                                         op->src, m->len, op->enc, cap);
            if (n > 0 && tier_disk_round((uint64_t)n) < dlen) {
                memset((uint8_t *)op->enc + n, 0, tier_disk_round((uint64_t)n) - (uint64_t)n);
                op->data = op->enc;
                m->stored = (uint64_t)n;
                m->codec = op->codec_req;
            } else {
                free(op->enc);
                op->enc = NULL;
            }
        }
    }
    /* Raw data leaves from the arena itself unless it is unaligned or its last 4 KiB would
     * reach past a registered buffer. */
    if (op->data == op->src &&
        ((uintptr_t)op->src % TIER_DISK_ALIGN ||
         (d->nbufs && tier_disk_buf_index(d, op->src, dlen) < 0 &&
          tier_disk_buf_index(d, op->src, 1) >= 0))) {
        op->data_bounce = tier_disk_aligned(dlen);
        if (!op->data_bounce) {
            op->status = -ENOMEM;
            return;
        }
        memset((uint8_t *)op->data_bounce + m->len, 0, dlen - m->len);
        memcpy(op->data_bounce, op->src, m->len);
        op->data = op->data_bounce;
    }
    op->data_csum = XXH3_64bits(op->data, m->stored);
}

/* GET, once the header checked out on the loop: the data's checksum, then the block. */
static void tier_disk_work_verify(struct disk_codec *c, struct tier_disk_op *op)
{
    const struct tier_disk_hdr *h = op->buf;
    const uint8_t *data = op->data_bounce ? op->data_bounce : op->dst;
    void *copy = NULL;
    int rc;
    if (XXH3_64bits(data, h->len) != h->data_csum) {
        op->status = -EBADMSG;
        return;
    }
    if (h->codec == TIER_DISK_CODEC_RAW) {
        if (op->data_bounce)
            memcpy(op->dst, op->data_bounce, h->len);
        return;
    }
    if (!op->data_bounce) { /* read straight into dst: decompress from a copy */
        copy = malloc(h->len);
        if (!copy) {
            op->status = -ENOMEM;
            return;
        }
        memcpy(copy, data, h->len);
        data = copy;
    }
    rc = c ? disk_codec_decompress(c, (enum tier_disk_codec)h->codec, data, h->len, op->dst,
                                   h->raw_len)
           : -ENOMEM;
    if (rc)
        op->status = rc == -ENOMEM ? -ENOMEM : -EBADMSG;
    free(copy);
}

static void *tier_disk_worker_main(void *arg)
{
    struct tier_disk_worker_arg *w = arg;
    struct tier_disk *d = w->d;
    struct tier_disk_pool *pl = &d->pool;
    struct disk_codec *c = pl->codec[w->i];
    free(w);
    pthread_mutex_lock(&pl->mu);
    for (;;) {
        struct tier_disk_op *op;
        while (!pl->todo && !pl->stop)
            pthread_cond_wait(&pl->cv, &pl->mu);
        if (!pl->todo)
            break;
        op = pl->todo;
        pl->todo = op->next;
        if (!pl->todo)
            pl->todo_tail = NULL;
        pthread_mutex_unlock(&pl->mu);
        if (op->stage == TIER_DISK_STAGE_ENCODE)
            tier_disk_work_encode(d, c, op);
        else
            tier_disk_work_verify(c, op);
        pthread_mutex_lock(&pl->mu);
        op->next = pl->done;
        pl->done = op;
        {
            uint64_t one = 1;
            ssize_t wr = write(d->efd, &one, sizeof(one));
            (void)wr; /* a full counter still wakes the loop */
        }
    }
    pthread_mutex_unlock(&pl->mu);
    return NULL;
}

static void tier_disk_queue(struct tier_disk *d, struct tier_disk_op *op, uint8_t stage)
{
    struct tier_disk_pool *pl = &d->pool;
    op->stage = stage;
    op->next = NULL;
    d->queued++;
    pthread_mutex_lock(&pl->mu);
    if (pl->todo_tail)
        pl->todo_tail->next = op;
    else
        pl->todo = op;
    pl->todo_tail = op;
    pthread_cond_signal(&pl->cv);
    pthread_mutex_unlock(&pl->mu);
}

static int tier_disk_pool_start(struct tier_disk *d)
{
    struct tier_disk_pool *pl = &d->pool;
    uint32_t n = d->cfg.workers ? d->cfg.workers : 2;
    if (n > TIER_DISK_WORKERS_MAX)
        n = TIER_DISK_WORKERS_MAX;
    pthread_mutex_init(&pl->mu, NULL);
    pthread_cond_init(&pl->cv, NULL);
    d->pool_ok = true;
    for (uint32_t i = 0; i < n; i++) {
        struct tier_disk_worker_arg *w = malloc(sizeof(*w));
        int rc;
        pl->codec[i] = disk_codec_new();
        if (!w || !pl->codec[i]) {
            free(w);
            disk_codec_free(pl->codec[i]);
            pl->codec[i] = NULL;
            return -ENOMEM;
        }
        *w = (struct tier_disk_worker_arg){.d = d, .i = i};
        rc = pthread_create(&pl->th[i], NULL, tier_disk_worker_main, w);
        if (rc) {
            free(w);
            disk_codec_free(pl->codec[i]);
            pl->codec[i] = NULL;
            return -rc;
        }
        pl->nthreads++;
    }
    return 0;
}

static void tier_disk_pool_stop(struct tier_disk *d)
{
    struct tier_disk_pool *pl = &d->pool;
    if (!d->pool_ok)
        return;
    pthread_mutex_lock(&pl->mu);
    pl->stop = true;
    pthread_cond_broadcast(&pl->cv);
    pthread_mutex_unlock(&pl->mu);
    for (uint32_t i = 0; i < pl->nthreads; i++) {
        pthread_join(pl->th[i], NULL);
        disk_codec_free(pl->codec[i]);
    }
    pthread_mutex_destroy(&pl->mu);
    pthread_cond_destroy(&pl->cv);
    d->pool_ok = false;
}

/* ---- record writes --------------------------------------------------------------------- */

/* A record write at a known location joins the list of writes in flight until op_end. */
static void tier_disk_put_list(struct tier_disk *d, struct tier_disk_op *op)
{
    op->put_prev = NULL;
    op->put_next = d->puts;
    if (d->puts)
        d->puts->put_prev = op;
    d->puts = op;
    op->put_listed = true;
}

void tier_disk_pages_pending(const struct tier_disk *d, uint32_t *from)
{
    for (uint64_t p = 0; p < d->npages; p++)
        from[p] = UINT32_MAX;
    if (d->open_page != UINT32_MAX)
        from[d->open_page] = (uint32_t)d->pages[d->open_page].used;
    /* A record allocated and not yet handed to tier_disk_put lies before the fill too. */
    if (d->last_alloc && !d->last_alloc_put) {
        uint32_t p = (uint32_t)((d->last_alloc - TIER_DISK_HDR) / d->cfg.page_size);
        uint32_t at = (uint32_t)(d->last_alloc - TIER_DISK_HDR - tier_disk_page_base(d, p));
        if (p < d->npages && at < from[p])
            from[p] = at;
    }
    for (const struct tier_disk_op *op = d->puts; op; op = op->put_next) {
        uint32_t at = (uint32_t)(op->loc.off - TIER_DISK_HDR - tier_disk_page_base(d, op->page));
        if (at < from[op->page])
            from[op->page] = at;
    }
}

/* Fills the header of an encoded PUT for its location and submits header and data. */
static int tier_disk_put_submit(struct tier_disk *d, struct tier_disk_op *op)
{
    const struct tier_disk_meta *m = &op->expect;
    struct tier_disk_hdr *h = op->buf;
    memset(op->buf, 0, TIER_DISK_HDR);
    *h = (struct tier_disk_hdr){.magic = TIER_DISK_MAGIC,
                                .format = TIER_DISK_VERSION,
                                .page_version = (uint32_t)op->loc.cls,
                                .len = m->stored,
                                .data_csum = op->data_csum,
                                .key = {m->key[0], m->key[1]},
                                .parent = {m->parent[0], m->parent[1]},
                                .depth = m->depth,
                                .codec = m->codec,
                                .raw_len = m->len,
                                .block_format = m->format};
    memcpy(h->ns, m->ns, sizeof(h->ns));
    h->hdr_csum = tier_disk_hdr_csum(d, op->path, h);
    op->io_data = (void *)op->data;
    op->io_len = tier_disk_round(m->stored);
    op->io_off = op->loc.off - TIER_DISK_HDR;
    return tier_disk_dev_submit(d, op);
}

/* A PUT back from its worker (loop thread). */
static void tier_disk_encoded(struct tier_disk *d, struct tier_disk_op *op)
{
    const struct tier_disk_meta *m = &op->expect;
    if (op->status == 0 && op->level > 0) {
        d->st.codec_in += m->len;
        d->st.codec_out += m->stored;
        if (m->codec != TIER_DISK_CODEC_RAW)
            d->st.compressed++;
        else
            d->st.incompressible++;
    }
    if (op->submit_at_loc) {
        if (op->status == 0)
            op->status = tier_disk_put_submit(d, op);
        if (op->status)
            tier_disk_op_end(d, op);
        return;
    }
    d->inflight--;
    if (op->status) {
        int st = op->status;
        d->st.writes_inflight--;
        if (d->cfg.write_rate)
            d->tokens += (double)op->tokens;
        op->encoded(op->arg, NULL, st);
        tier_disk_op_free(op);
        return;
    }
    op->encoded(op->arg, (struct tier_disk_rec *)op, 0);
}

int tier_disk_put(struct tier *t, const struct tier_loc *loc, const struct tier_disk_meta *m,
                  const void *src, tier_done_fn done, void *arg)
{
    struct tier_disk *d = tier_disk_of(t);
    uint32_t p = tier_disk_loc_page(d, loc);
    uint64_t dlen = tier_disk_round(m->len);
    struct tier_disk_op *op = NULL;
    if (p == UINT32_MAX || m->len == 0 || dlen > loc->len)
        return -EINVAL;
    if (d->failed[tier_disk_page_path(d, p)])
        return -EIO;
    if (d->st.writes_inflight >= tier_disk_ops_max(d)) {
        d->st.queue_full++;
        return -EAGAIN;
    }
    if (!tier_disk_write_budget(d, dlen + TIER_DISK_HDR)) {
        d->st.throttled++;
        return -EAGAIN;
    }
    op = tier_disk_op_new(d, TIER_DISK_OP_PUT, p, done, arg);
    if (!op)
        return -ENOMEM;
    op->bytes = dlen + TIER_DISK_HDR;
    op->buf = tier_disk_aligned(TIER_DISK_HDR);
    if (!op->buf) {
        tier_disk_op_free(op);
        return -ENOMEM;
    }
    op->expect = *m;
    op->src = src;
    op->loc = *loc;
    op->submit_at_loc = true;
    if (loc->off == d->last_alloc)
        d->last_alloc_put = true;
    tier_disk_put_list(d, op);
    d->inflight++;
    d->pages[p].inflight++;
    d->st.writes_inflight++;
    tier_disk_queue(d, op, TIER_DISK_STAGE_ENCODE);
    return 0;
}

int tier_disk_encode(struct tier *t, const struct tier_disk_meta *m, const void *src,
                     int codec, int level, tier_disk_encoded_fn done, void *arg)
{
    struct tier_disk *d = tier_disk_of(t);
    uint64_t rec = tier_disk_record_bytes(m->len);
    struct tier_disk_op *op;
    if (m->len == 0 || m->len > d->cfg.page_size - TIER_DISK_HDR ||
        (level > 0 && codec != TIER_DISK_CODEC_ZSTD && codec != TIER_DISK_CODEC_ZSTD_PLANES))
        return -EINVAL;
    if (d->st.writes_inflight >= tier_disk_ops_max(d)) {
        d->st.queue_full++;
        return -EAGAIN;
    }
    if (!tier_disk_write_budget(d, rec)) {
        d->st.throttled++;
        return -EAGAIN;
    }
    op = tier_disk_op_new(d, TIER_DISK_OP_PUT, UINT32_MAX, NULL, arg);
    if (!op)
        goto nomem;
    op->buf = tier_disk_aligned(TIER_DISK_HDR);
    if (!op->buf)
        goto nomem;
    op->expect = *m;
    op->src = src;
    op->level = level;
    op->codec_req = (uint8_t)codec;
    op->encoded = done;
    op->tokens = d->cfg.write_rate ? rec : 0;
    d->inflight++;
    d->st.writes_inflight++;
    tier_disk_queue(d, op, TIER_DISK_STAGE_ENCODE);
    return 0;
nomem:
    if (op)
        tier_disk_op_free(op);
    if (d->cfg.write_rate)
        d->tokens += (double)rec;
    return -ENOMEM;
}

uint64_t tier_disk_rec_len(const struct tier_disk_rec *r)
{
    return r->op.expect.stored;
}

const struct tier_disk_meta *tier_disk_rec_meta(const struct tier_disk_rec *r)
{
    return &r->op.expect;
}

void tier_disk_rec_free(struct tier *t, struct tier_disk_rec *r)
{
    struct tier_disk *d = tier_disk_of(t);
    if (!r)
        return;
    d->st.writes_inflight--;
    if (d->cfg.write_rate)
        d->tokens += (double)r->op.tokens;
    tier_disk_op_free(&r->op);
}

int tier_disk_rec_put(struct tier *t, const struct tier_loc *loc, struct tier_disk_rec *r,
                      tier_done_fn done, void *arg)
{
    struct tier_disk *d = tier_disk_of(t);
    struct tier_disk_op *op = &r->op;
    uint32_t p = tier_disk_loc_page(d, loc);
    uint64_t dlen = tier_disk_round(op->expect.stored);
    if (p == UINT32_MAX || dlen > loc->len) {
        tier_disk_rec_free(t, r);
        return -EINVAL;
    }
    if (d->failed[tier_disk_page_path(d, p)]) {
        tier_disk_rec_free(t, r);
        return -EIO;
    }
    /* The budget was taken for the raw record: give back what compression saved. */
    if (d->cfg.write_rate)
        d->tokens += (double)op->tokens - (double)(dlen + TIER_DISK_HDR);
    op->tokens = 0;
    op->page = p;
    op->path = tier_disk_page_path(d, p);
    op->loc = *loc;
    op->done = done;
    op->arg = arg;
    op->bytes = dlen + TIER_DISK_HDR;
    if (loc->off == d->last_alloc)
        d->last_alloc_put = true;
    tier_disk_put_list(d, op);
    d->inflight++;
    d->pages[p].inflight++;
    op->status = tier_disk_put_submit(d, op);
    if (op->status)
        tier_disk_op_end(d, op); /* done sees the error */
    return 0;
}

/* ---- record reads ---------------------------------------------------------------------- */

int tier_disk_get(struct tier *t, const struct tier_loc *loc, const struct tier_disk_meta *expect,
                  void *dst, uint64_t dst_len, tier_done_fn done, void *arg)
{
    struct tier_disk *d = tier_disk_of(t);
    uint32_t p = tier_disk_loc_page(d, loc);
    struct tier_disk_op *op;
    void *into = dst;
    int rc;
    if (p == UINT32_MAX || dst_len == 0 || (expect && expect->len > dst_len))
        return -EINVAL;
    if (d->st.reads_inflight >= tier_disk_ops_max(d)) {
        d->st.queue_full++;
        return -EAGAIN;
    }
    op = tier_disk_op_new(d, TIER_DISK_OP_GET, p, done, arg);
    if (!op)
        return -ENOMEM;
    op->bytes = loc->len + TIER_DISK_HDR;
    op->buf_len = loc->len;
    op->dst = dst;
    op->len = dst_len;
    if (expect) {
        op->has_expect = true;
        op->expect = *expect;
    }
    op->buf = tier_disk_aligned(TIER_DISK_HDR);
    if (!op->buf) {
        rc = -ENOMEM;
        goto fail;
    }
    /* A record smaller than the block is compressed: it is read aside and decompressed
     * into dst. */
    if ((uintptr_t)dst % TIER_DISK_ALIGN || dst_len < loc->len ||
        (expect && tier_disk_round(expect->len) != loc->len) ||
        (tier_disk_buf_index(d, dst, 1) >= 0 && tier_disk_buf_index(d, dst, loc->len) < 0)) {
        op->data_bounce = tier_disk_aligned(loc->len);
        if (!op->data_bounce) {
            rc = -ENOMEM;
            goto fail;
        }
        into = op->data_bounce;
    }
    op->io_data = into;
    op->io_len = loc->len;
    op->io_off = loc->off - TIER_DISK_HDR;
    rc = tier_disk_dev_submit(d, op);
    if (rc)
        goto fail;
    tier_disk_op_start(d, op);
    return 0;
fail:
    tier_disk_op_free(op);
    return rc;
}

/* Header checks of a GET (loop thread: they need the page table); 0 or -EBADMSG. The data
 * is checked by a worker next. */
static int tier_disk_get_verify(struct tier_disk *d, struct tier_disk_op *op)
{
    const struct tier_disk_hdr *h = op->buf;
    const struct tier_disk_page *pg = &d->pages[op->page];
    if (h->magic != TIER_DISK_MAGIC || h->format != TIER_DISK_VERSION ||
        h->hdr_csum != tier_disk_hdr_csum(d, op->path, h) || h->page_version != pg->version)
        return -EBADMSG;
    if (h->raw_len > op->len || tier_disk_round(h->len) > op->buf_len || h->len == 0)
        return -EBADMSG;
    if (h->codec == TIER_DISK_CODEC_RAW ? h->raw_len != h->len
                                        : h->codec != TIER_DISK_CODEC_ZSTD &&
                                              h->codec != TIER_DISK_CODEC_ZSTD_PLANES)
        return -EBADMSG;
    if (op->has_expect &&
        (h->raw_len != op->expect.len || h->key[0] != op->expect.key[0] ||
         h->key[1] != op->expect.key[1] || h->block_format != op->expect.format ||
         memcmp(h->ns, op->expect.ns, sizeof(h->ns)) != 0))
        return -EBADMSG;
    return 0;
}

static void tier_disk_op_end(struct tier_disk *d, struct tier_disk_op *op)
{
    struct tier_disk_page *pg = &d->pages[op->page];
    bool reading = op->kind == TIER_DISK_OP_READ || op->kind == TIER_DISK_OP_GET;
    if (op->put_listed) {
        if (op->put_prev)
            op->put_prev->put_next = op->put_next;
        else
            d->puts = op->put_next;
        if (op->put_next)
            op->put_next->put_prev = op->put_prev;
        op->put_listed = false;
        d->gen++;
    }
    d->inflight--;
    pg->inflight--;
    if (reading)
        d->st.reads_inflight--;
    else
        d->st.writes_inflight--;
    if (op->status == 0 && op->kind == TIER_DISK_OP_READ && op->dst)
        memcpy(op->dst, (uint8_t *)op->buf + op->skip, op->len);
    if (op->status == 0) {
        if (reading) {
            d->st.reads++;
            d->st.bytes_read += op->bytes;
        } else {
            d->st.writes++;
            d->st.bytes_written += op->bytes;
        }
    } else if (op->status == -EBADMSG) {
        d->st.checksum_failures++;
    } else if (reading) {
        d->st.read_errors++;
    } else {
        d->st.write_errors++;
        /* A write that fails leaves the path suspect: stop placing records there. */
        if (op->status == -EIO || op->status == -ENOSPC) {
            if (!d->failed[op->path])
                d->st.failed_paths++;
            d->failed[op->path] = true;
        }
    }
    tier_disk_page_maybe_free(d, op->page);
    op->done(op->arg, op->status);
    tier_disk_op_free(op);
}

int tier_disk_poll(struct tier *t)
{
    struct tier_disk *d = tier_disk_of(t);
    struct io_uring_cqe *cqe;
    struct tier_disk_op *done = NULL;
    uint64_t v;
    int n = 0;
    if (read(d->efd, &v, sizeof(v)) < 0) {
        /* Nothing signalled: completions may still be there (the eventfd is a hint). */
    }
    while (io_uring_peek_cqe(&d->ring, &cqe) == 0) {
        struct tier_disk_op *op = io_uring_cqe_get_data(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&d->ring, cqe);
        if (!op)
            continue;
        if (res < 0 && op->status == 0)
            op->status = res == -ENOSPC ? -ENOSPC : -EIO;
        else if (res > 0)
            op->got += (uint64_t)res;
        if (--op->pending)
            continue;
        /* A transfer that completed short is an error however it is aligned: the bytes
         * behind it were never read or written (a file cut short, a device that gave up). */
        if (op->status == 0 && op->got != op->want) {
            op->status = -EIO;
            d->st.short_io++;
        }
        if (op->on_dev) {
            bool write = op->kind == TIER_DISK_OP_PUT;
            op->on_dev = false;
            d->dev[write]--;
            tier_disk_dev_pump(d, write);
        }
        if (op->kind == TIER_DISK_OP_GET && op->status == 0) {
            op->status = tier_disk_get_verify(d, op);
            if (op->status == 0) {
                tier_disk_queue(d, op, TIER_DISK_STAGE_VERIFY);
                continue;
            }
        }
        tier_disk_op_end(d, op);
        n++;
    }
    if (d->queued) {
        pthread_mutex_lock(&d->pool.mu);
        done = d->pool.done;
        d->pool.done = NULL;
        pthread_mutex_unlock(&d->pool.mu);
    }
    while (done) {
        struct tier_disk_op *op = done;
        done = op->next;
        d->queued--;
        if (op->stage == TIER_DISK_STAGE_ENCODE)
            tier_disk_encoded(d, op);
        else
            tier_disk_op_end(d, op);
        n++;
    }
    if (d->unsubmitted)
        tier_disk_submit(d);
    return n;
}

void tier_disk_flush(struct tier *t)
{
    struct tier_disk *d = tier_disk_of(t);
    if (d->unsubmitted)
        tier_disk_submit(d);
}

void tier_disk_drain(struct tier *t)
{
    struct tier_disk *d = tier_disk_of(t);
    while (d->inflight)
        if (tier_disk_poll(t) == 0)
            tier_disk_wait(d);
}

int tier_disk_fd(const struct tier *t)
{
    return tier_disk_of(t)->efd;
}

int tier_disk_buffers_register(struct tier *t, void *base, uint64_t len)
{
    struct tier_disk *d = tier_disk_of(t);
    struct iovec iov[TIER_DISK_MAX_BUFS] = {{0}};
    const uint64_t chunk = 1ull << 30; /* the kernel's limit per fixed buffer */
    uint32_t n = 0;
    int rc;
    if (d->nbufs)
        return -EBUSY;
    for (uint64_t o = 0; o < len && n < TIER_DISK_MAX_BUFS; o += chunk, n++)
        iov[n] = (struct iovec){.iov_base = (uint8_t *)base + o,
                                .iov_len = len - o < chunk ? len - o : chunk};
    if (n * chunk < len)
        return -E2BIG;
    rc = io_uring_register_buffers(&d->ring, iov, n);
    if (rc < 0)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        d->bufs[i] = (struct tier_disk_buf){.base = iov[i].iov_base, .len = iov[i].iov_len};
    d->nbufs = n;
    d->st.fixed_buffers = true;
    return 0;
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

bool tier_disk_found(struct tier_disk *d, uint32_t p, uint32_t ver,
                     const struct tier_disk_meta *m, const struct tier_loc *loc)
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

/* Opens path i. The last component must not be a symbolic link (O_NOFOLLOW): a link planted
 * where the tier's file belongs would make the daemon write wherever it points. With
 * TIER_DISK_FORMAT_NEVER a missing file is not created. */
static int tier_disk_open_fd(struct tier_disk *d, uint32_t i)
{
    const char *path = d->cfg.paths[i];
    int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW |
                (d->cfg.format == TIER_DISK_FORMAT_NEVER ? 0 : O_CREAT);
    struct stat ls;
    int fd = open(path, flags | O_DIRECT, 0600);
    if (fd < 0 && errno == EINVAL) {
        fd = open(path, flags, 0600);
        if (fd >= 0) {
            fprintf(stderr, "kvcd: disk: %s: O_DIRECT refused by the file system; using BUFFERED "
                            "I/O (slower, and the page cache holds a second copy)\n",
                    path);
            d->st.buffered = true;
        }
    }
    if (fd >= 0) {
        d->fds[i] = fd;
        return 0;
    }
    if ((errno == ELOOP || errno == EMLINK) && lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode)) {
        fprintf(stderr, "kvcd: disk: %s is a symbolic link; refusing it (name the file or "
                        "device itself, e.g. the output of readlink -f)\n",
                path);
        return -ELOOP;
    }
    if (errno == ENOENT && d->cfg.format == TIER_DISK_FORMAT_NEVER)
        fprintf(stderr, "kvcd: disk: %s does not exist and disk.format is never; not "
                        "creating it\n",
                path);
    return -errno;
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
        fprintf(stderr, "kvcd: disk: %s holds %s; refusing to overwrite it (disk.format=force "
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
        cfg->page_size % TIER_DISK_ALIGN || cfg->page_size > (1u << 30) ||
        cfg->queue_depth == 0 || cfg->queue_depth > 4096 || cfg->format > TIER_DISK_FORMAT_FORCE)
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
    if (d)
        tier_disk_destroy(&d->base);
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
