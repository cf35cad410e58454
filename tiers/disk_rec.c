/*
 * disk_rec.c — the disk tier's records: the write budget, the worker pool that hashes,
 * compresses and verifies them, record writes (tier_disk_put, tier_disk_encode and
 * tier_disk_rec_put) and reads (tier_disk_get).
 *
 * DESIGN
 * A record is a 4 KiB header (key, length, checksums, page version) and the block's bytes,
 * stored raw or compressed. Hashing and compression run on the workers, never on the loop:
 * a PUT is encoded before it is submitted, a GET verified after its read completed, and a
 * record that fails its checks is an error for its caller, never bytes. Writes are bounded
 * by a token bucket (disk.write_rate) so the drive keeps room for reads.
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

/* ---- records --------------------------------------------------------------------------- */

/* The bucket holds a quarter second of writes, and at least one page. */
double tier_disk_burst(const struct tier_disk *d)
{
    return (double)d->cfg.write_rate / 4 > (double)d->cfg.page_size ? (double)d->cfg.write_rate / 4
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
 * form when that saves at least 4 KiB) and hashes it, after the caller's peek at the bytes.
 * Worker thread: touches the op, the block's bytes, the immutable registered-buffer table
 * and what the peek's argument owns only. */
static void tier_disk_work_encode(struct tier_disk *d, struct disk_codec *c,
                                  struct tier_disk_op *op)
{
    struct tier_disk_meta *m = &op->expect;
    uint64_t dlen = tier_disk_round(m->len);
    const void *in = op->src;
    if (op->level > 0 && c) {
        /* A block in a host arena can change under us (every writer of the arena maps it),
         * and zstd wants its input unchanged while it runs: it compresses a private copy,
         * which is also what is hashed and written should it stay raw. */
        op->data_bounce = tier_disk_aligned(dlen);
        if (!op->data_bounce) {
            op->status = -ENOMEM;
            return;
        }
        memset((uint8_t *)op->data_bounce + m->len, 0, dlen - m->len);
        memcpy(op->data_bounce, op->src, m->len);
        in = op->data_bounce;
    }
    if (op->peek)
        op->peek(op->arg, in, m->len);
    op->data = in;
    m->stored = m->len;
    m->codec = TIER_DISK_CODEC_RAW;
    if (op->level > 0 && c) {
        uint64_t cap = tier_disk_round(disk_codec_bound(m->len));
        op->enc = tier_disk_aligned(cap);
        if (op->enc) {
            long n = disk_codec_compress(c, (enum tier_disk_codec)op->codec_req, op->level, in,
                                         m->len, op->enc, cap);
            if (n > 0 && tier_disk_round((uint64_t)n) < dlen) {
                memset((uint8_t *)op->enc + n, 0, tier_disk_round((uint64_t)n) - (uint64_t)n);
                op->data = op->enc;
                m->stored = (uint64_t)n;
                m->codec = op->codec_req;
                free(op->data_bounce);
                op->data_bounce = NULL;
            } else {
                free(op->enc);
                op->enc = NULL;
            }
        }
    }
    /* Raw data leaves from the arena itself unless it is unaligned or its last 4 KiB would
     * reach past a registered buffer. */
    if (op->data == op->src && ((uintptr_t)op->src % TIER_DISK_ALIGN ||
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

void tier_disk_queue(struct tier_disk *d, struct tier_disk_op *op, uint8_t stage)
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

int tier_disk_pool_start(struct tier_disk *d)
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

void tier_disk_pool_stop(struct tier_disk *d)
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
void tier_disk_encoded(struct tier_disk *d, struct tier_disk_op *op)
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

int tier_disk_encode(struct tier *t, const struct tier_disk_meta *m, const void *src, int codec,
                     int level, tier_disk_encoded_fn done, void *arg)
{
    return tier_disk_encode_peek(t, m, src, codec, level, NULL, done, arg);
}

int tier_disk_encode_peek(struct tier *t, const struct tier_disk_meta *m, const void *src,
                          int codec, int level, tier_disk_peek_fn peek, tier_disk_encoded_fn done,
                          void *arg)
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
    op->peek = peek;
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
int tier_disk_get_verify(struct tier_disk *d, struct tier_disk_op *op)
{
    const struct tier_disk_hdr *h = op->buf;
    const struct tier_disk_page *pg = &d->pages[op->page];
    if (h->magic != TIER_DISK_MAGIC || h->format != TIER_DISK_VERSION ||
        h->hdr_csum != tier_disk_hdr_csum(d, op->path, h) || h->page_version != pg->version)
        return -EBADMSG;
    if (h->raw_len > op->len || tier_disk_round(h->len) > op->buf_len || h->len == 0)
        return -EBADMSG;
    if (h->codec == TIER_DISK_CODEC_RAW
            ? h->raw_len != h->len
            : h->codec != TIER_DISK_CODEC_ZSTD && h->codec != TIER_DISK_CODEC_ZSTD_PLANES)
        return -EBADMSG;
    if (op->has_expect && (h->raw_len != op->expect.len || h->key[0] != op->expect.key[0] ||
                           h->key[1] != op->expect.key[1] || h->block_format != op->expect.format ||
                           memcmp(h->ns, op->expect.ns, sizeof(h->ns)) != 0))
        return -EBADMSG;
    return 0;
}
