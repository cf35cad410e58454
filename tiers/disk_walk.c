/*
 * disk_walk.c — the disk tier's walk of page chains at start, at the drive's read speed.
 *
 * DESIGN
 * A start without a checkpoint (a crash before the first one, a refused one) finds its
 * records by following every page's chain of record headers; a start with one follows the
 * chains of the pages written since. A page's chain is sequential (a header says where the
 * next one is), so one synchronous 4 KiB read per record ran at the device's depth-1 latency:
 * 0.1 ms a record, 4-5 s for 43,000 records of 16 KiB, hours for a full multi-TB drive. Here
 * many pages are walked at once, each by a cursor with its own buffer, through the tier's
 * io_uring (nothing else uses it yet): up to TIER_DISK_WALK_CURSORS reads in flight, each
 * a window of TIER_DISK_WALK_WINDOW bytes from the next header on, so a window of small
 * records yields dozens of headers per read and the drive streams. Where records are larger
 * (fewer than TIER_DISK_WALK_MIN_PER_WINDOW headers would fit a window) a cursor reads the
 * next header alone: the data between headers is never read, and the cursors in flight keep
 * the device busy. Where the two meet: a read of a window costs the drive about its bytes,
 * one of a header about one I/O; at 16 KiB blocks (20 KiB records) both took the same time
 * here (0.8-1.3 s against 1.0 s for 43,000 records), and a drive's bandwidth over its 4 KiB
 * IOPS is 8-24 KiB, so at 32 KiB records and more reading headers alone wins. The first read
 * of a page is its first header alone, so an empty page costs 4 KiB. Records
 * are offered to the scan callback as their window lands (the daemon sorts them by depth
 * before it takes them back), never twice, and a header is taken only if it verifies (its
 * checksum, seeded with the path's secret, its page version) exactly as before. Runs on the
 * loop thread, before the tier is handed out.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/disk_int.h"

#define TIER_DISK_WALK_CURSORS 32u       /* pages walked at once (reads in flight) */
#define TIER_DISK_WALK_WINDOW (1u << 20) /* bytes one read brings, at most */
#define TIER_DISK_WALK_MIN_PER_WINDOW 32u /* headers a window must hold to be read whole */

struct tier_disk_walk_cursor {
    uint8_t *buf;    /* TIER_DISK_WALK_WINDOW bytes, aligned */
    size_t task;     /* index into the tasks; SIZE_MAX: idle */
    uint64_t buf_at; /* page offset of buf[0] */
    uint64_t want;   /* bytes of the read in flight */
    uint64_t last;   /* bytes of the latest record of this page (0: none yet) */
    bool busy;       /* a read is in flight */
};

static bool tier_disk_walk_skip(const uint64_t *skip, size_t n, uint64_t off)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (skip[mid] == off)
            return true;
        if (skip[mid] < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

/* Offers the records whose headers lie in the cursor's window (got bytes of it valid),
 * following the chain. Returns true while the chain goes on past the window (the next read
 * starts at w->at), false once it has ended (w->at is its end). */
static bool tier_disk_walk_parse(struct tier_disk *d, struct tier_disk_walk *w,
                                 struct tier_disk_walk_cursor *c, uint64_t got,
                                 const uint64_t *skip, size_t nskip)
{
    uint32_t path = tier_disk_page_path(d, w->page);
    uint64_t base = tier_disk_page_base(d, w->page);
    while (w->at + TIER_DISK_HDR <= d->cfg.page_size) {
        const struct tier_disk_hdr *h;
        struct tier_disk_meta m;
        struct tier_loc loc;
        if (w->at < c->buf_at || w->at + TIER_DISK_HDR > c->buf_at + got)
            return got == c->want; /* past the window: read on, unless the read came short */
        h = (const struct tier_disk_hdr *)(c->buf + (w->at - c->buf_at));
        if (!tier_disk_hdr_ok(d, path, h, w->at))
            return false;
        /* A header of another version ends the chain: it belongs to another life of the
         * page (stale bytes behind the records of this one). */
        if (w->ver == 0)
            w->ver = h->page_version;
        else if (h->page_version != w->ver)
            return false;
        m = (struct tier_disk_meta){.key = {h->key[0], h->key[1]},
                                    .parent = {h->parent[0], h->parent[1]},
                                    .depth = h->depth,
                                    .codec = h->codec,
                                    .len = h->raw_len,
                                    .stored = h->len,
                                    .format = h->block_format};
        memcpy(m.ns, h->ns, sizeof(m.ns));
        loc = (struct tier_loc){.arena = path,
                                .cls = w->ver,
                                .off = base + w->at + TIER_DISK_HDR,
                                .len = tier_disk_record_bytes(h->len) - TIER_DISK_HDR};
        if (!tier_disk_walk_skip(skip, nskip, loc.off) &&
            tier_disk_found(d, w->page, w->ver, &m, &loc))
            d->st.records_walked++;
        c->last = tier_disk_record_bytes(h->len);
        w->at += c->last;
    }
    return false;
}

/* Prepares the cursor's next read: the page's first header alone (most pages of a new or
 * sparse disk hold none: no window is read for them), then a window from w->at, or the next
 * header alone when the page's records are large. */
static void tier_disk_walk_read(struct tier_disk *d, const struct tier_disk_walk *w,
                                struct tier_disk_walk_cursor *c, uint32_t k,
                                struct io_uring_sqe *sqe)
{
    uint64_t room = d->cfg.page_size - w->at;
    uint64_t want = !c->last || c->last * TIER_DISK_WALK_MIN_PER_WINDOW > TIER_DISK_WALK_WINDOW
                        ? TIER_DISK_HDR
                        : TIER_DISK_WALK_WINDOW;
    c->want = want < room ? want : room;
    c->buf_at = w->at;
    c->busy = true;
    io_uring_prep_read(sqe, d->fds[tier_disk_page_path(d, w->page)], c->buf, (unsigned)c->want,
                       tier_disk_path_off(d, tier_disk_page_base(d, w->page) + w->at));
    io_uring_sqe_set_data64(sqe, k);
    d->st.start_reads++;
}

int tier_disk_walk(struct tier_disk *d, struct tier_disk_walk *w, size_t n, const uint64_t *skip,
                   size_t nskip)
{
    uint32_t ncur = d->ring.sq.ring_entries < TIER_DISK_WALK_CURSORS ? d->ring.sq.ring_entries
                                                                     : TIER_DISK_WALK_CURSORS;
    struct tier_disk_walk_cursor cur[TIER_DISK_WALK_CURSORS];
    size_t next = 0, done = 0, next_progress = 0;
    uint32_t inflight = 0;
    int rc = 0;
    if (n < ncur)
        ncur = (uint32_t)n;
    memset(cur, 0, sizeof(cur));
    for (uint32_t k = 0; k < ncur; k++) {
        cur[k].task = SIZE_MAX;
        cur[k].buf = tier_disk_aligned(TIER_DISK_WALK_WINDOW);
        if (!cur[k].buf) {
            rc = -ENOMEM;
            goto out;
        }
    }
    while (done < n) {
        struct io_uring_cqe *cqe;
        uint32_t prepared = 0;
        /* Every idle cursor takes the next page; every cursor without a read gets one. */
        for (uint32_t k = 0; k < ncur; k++) {
            struct io_uring_sqe *sqe;
            if (cur[k].busy)
                continue;
            while (cur[k].task == SIZE_MAX && next < n) {
                struct tier_disk_walk *t = &w[next];
                if (t->at + TIER_DISK_HDR > d->cfg.page_size) {
                    next++, done++; /* nothing to read: the chain ends where it starts */
                    continue;
                }
                cur[k].task = next++;
                cur[k].last = 0;
            }
            if (cur[k].task == SIZE_MAX)
                continue;
            sqe = io_uring_get_sqe(&d->ring);
            if (!sqe)
                break; /* the ring holds at least ncur entries: not seen */
            tier_disk_walk_read(d, &w[cur[k].task], &cur[k], k, sqe);
            prepared++;
        }
        if (prepared) {
            int s;
            do
                s = io_uring_submit(&d->ring);
            while (s == -EINTR || s == -EAGAIN);
            if (s < 0 || (uint32_t)s != prepared) {
                /* Reads the kernel did not take stay in the ring; none is waited for. */
                rc = s < 0 ? s : -EIO;
                goto out_inflight;
            }
            inflight += prepared;
        }
        if (d->cfg.progress && done >= next_progress) {
            d->cfg.progress(d->cfg.progress_arg, done, n);
            next_progress = done + 64;
        }
        if (!inflight)
            continue; /* only empty tasks were left */
        rc = io_uring_wait_cqe(&d->ring, &cqe);
        if (rc == -EINTR || rc == -EAGAIN) {
            rc = 0;
            continue;
        }
        if (rc < 0)
            goto out_inflight;
        do {
            uint32_t k = (uint32_t)io_uring_cqe_get_data64(cqe);
            struct tier_disk_walk_cursor *c = &cur[k];
            struct tier_disk_walk *t = &w[c->task];
            uint64_t got = cqe->res > 0 ? (uint64_t)cqe->res & ~(uint64_t)(TIER_DISK_ALIGN - 1) : 0;
            io_uring_cqe_seen(&d->ring, cqe);
            inflight--;
            c->busy = false;
            d->st.start_bytes += cqe->res > 0 ? (uint64_t)cqe->res : 0;
            if (!tier_disk_walk_parse(d, t, c, got, skip, nskip)) {
                c->task = SIZE_MAX; /* this chain has ended: the cursor takes another page */
                done++;
            }
        } while (io_uring_peek_cqe(&d->ring, &cqe) == 0);
    }
out:
    for (uint32_t k = 0; k < ncur; k++)
        free(cur[k].buf);
    return rc;
out_inflight:
    /* Reads may still land in the buffers: they are not freed (never seen). */
    fprintf(stderr, "kvcd: disk: the walk of the record headers failed (%s)\n", strerror(-rc));
    return rc;
}
