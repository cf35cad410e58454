/*
 * disk_io.c — the disk tier's requests to the device: io_uring submission and completion,
 * the raw read and write of the tier interface.
 *
 * DESIGN
 * Loop thread only. An op is one tier request: one or two SQEs (a record's header and data
 * in one vectored request), registered buffers where the memory is one of them, a bounce
 * buffer otherwise. Each direction has its device slots (ops_max in flight): an op past
 * them waits in the stage queue (TIER_DISK_STAGE_WAIT) and dev_pump submits it as a slot
 * frees. tier_disk_poll reaps completions and ends each op (tier_disk_op_end): a GET goes
 * to a worker to be verified (disk_rec.c), everything else calls its done callback.
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

/* ---- submission ------------------------------------------------------------------------ */

/* Index of the registered buffer holding [p, p+len), or -1. */
int tier_disk_buf_index(const struct tier_disk *d, const void *p, uint64_t len)
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
 * costs a page pin per request but saves a second request per record (docs/design/disk.md). */
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

struct tier_disk_op *tier_disk_op_new(struct tier_disk *d, uint8_t kind, uint32_t page,
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

void tier_disk_op_start(struct tier_disk *d, struct tier_disk_op *op)
{
    d->inflight++;
    d->pages[op->page].inflight++;
    if (op->kind == TIER_DISK_OP_READ || op->kind == TIER_DISK_OP_GET)
        d->st.reads_inflight++;
    else
        d->st.writes_inflight++;
}

void tier_disk_op_free(struct tier_disk_op *op)
{
    free(op->buf);
    free(op->data_bounce);
    free(op->enc);
    free(op);
}

/* Ops admitted per direction: queue_depth on the device and as many again being hashed,
 * waiting for a device slot, or handed back encoded. */
uint32_t tier_disk_ops_max(const struct tier_disk *d)
{
    return 2 * d->cfg.queue_depth;
}

/* Puts a PUT or GET (header and data, one request) on the device, or in line for it when
 * queue_depth records of its direction are there already. 0 or -errno (nothing queued). */
int tier_disk_dev_submit(struct tier_disk *d, struct tier_disk_op *op)
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
            d->st.writes_inflight >= tier_disk_ops_max(d)) &&
           d->inflight)
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
    if (pwrite(d->fds[path], b, a1 - a0, (off_t)tier_disk_path_off(d, a0)) != (ssize_t)(a1 - a0))
        rc = -EIO;
out:
    free(b);
    return rc;
}

int tier_disk_write(struct tier *t, const struct tier_loc *loc, uint64_t off, const void *src,
                    uint64_t len, tier_done_fn done, void *arg)
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

int tier_disk_read(struct tier *t, const struct tier_loc *loc, uint64_t off, void *dst,
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

void tier_disk_op_end(struct tier_disk *d, struct tier_disk_op *op)
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
