/*
 * disk_int.h — the disk tier's own types, shared by disk.c (pages, start), disk_rec.c
 * (records), disk_io.c (requests to the device), disk_walk.c and disk_ckpt.c (the index's
 * walk and checkpoint); nothing outside tiers/disk*.c includes it.
 *
 * DESIGN
 * One struct tier_disk per tier, owned by the daemon's loop thread (the worker pool's
 * queues excepted, under pool.mu). A page is FREE, OPEN (the one page records are appended
 * to) or FULL (closed; FREE again once its last record dies and no request touches it);
 * its version comes from next_version, which only grows, so (page, version) never names
 * two lives of a page.
 */
#ifndef KVC_TIER_DISK_INT_H
#define KVC_TIER_DISK_INT_H

#include <liburing.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "tiers/disk.h"

#define TIER_DISK_MAGIC 0x4b564344424c4b31ull /* "1KLBDCVK": kvcd block record */
#define TIER_DISK_VERSION 3u
#define TIER_DISK_SB_MAGIC 0x3142535344435653ull /* "SVCDSSB1": kvcd disk superblock */
#define TIER_DISK_MAX_BUFS 64u
#define TIER_DISK_WORKERS_MAX 16u
#define TIER_DISK_CKPT_SOON_NS 1000000000ull /* the soonest a checkpoint follows another */

enum tier_disk_page_state {
    TIER_DISK_PAGE_FREE = 0,
    TIER_DISK_PAGE_OPEN = 1, /* records are appended here */
    TIER_DISK_PAGE_FULL = 2, /* closed; freed when its last record dies */
};

struct tier_disk_page {
    uint32_t version;
    uint8_t state;
    uint32_t live;     /* records */
    uint32_t inflight; /* requests touching the page */
    uint64_t used;     /* append point, bytes from the page start */
    uint64_t live_bytes;
};

/* The on-device header, at the start of its 4 KiB. */
struct tier_disk_hdr {
    uint64_t magic;
    uint32_t format;
    uint32_t page_version;
    uint64_t len;       /* data bytes on the device (compressed, when codec says so) */
    uint64_t data_csum; /* XXH3-64 of len data bytes */
    uint64_t key[2];
    uint64_t parent[2];
    uint32_t depth;
    uint32_t codec; /* enum tier_disk_codec */
    uint8_t ns[TIER_DISK_NS_BYTES];
    uint64_t raw_len;      /* the block's bytes in memory (format 3) */
    uint32_t block_format; /* the block's own encoding, opaque to the tier (format 3) */
    uint32_t reserved;
    uint64_t hdr_csum; /* XXH3-64 of everything above, seeded with the path's secret */
};

/* The first 4 KiB of every path. The secret seeds every header checksum on the path, so
 * bytes a client wrote into a block (and that outlive their page) can never pass for a
 * header: forging one would need the secret, which never leaves the daemon. */
struct tier_disk_sb {
    uint64_t magic;
    uint32_t format;
    uint32_t reserved;
    uint64_t secret;
    uint64_t created_ns;
    uint64_t csum; /* XXH3-64 of everything above */
};

struct tier_disk_op;
struct tier_disk_ckpt_sync;

/* The worker threads: hashing and zstd never run on the loop thread (a 2 MiB zstd pass is
 * 3-7 ms; XXH3 of 256 KiB is about 50 us here). Finished ops go to `done` and the tier's
 * eventfd is written, so the loop's tier_disk_poll picks them up. */
struct tier_disk_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct tier_disk_op *todo, *todo_tail, *done;
    bool stop;
    uint32_t nthreads;
    pthread_t th[TIER_DISK_WORKERS_MAX];
    struct disk_codec *codec[TIER_DISK_WORKERS_MAX];
    int efd;
};

struct tier_disk_buf {
    uint8_t *base;
    uint64_t len;
};

struct tier_disk {
    struct tier base;
    struct tier_disk_config cfg;
    int fds[TIER_DISK_MAX_PATHS];
    bool failed[TIER_DISK_MAX_PATHS];
    bool locked[TIER_DISK_MAX_PATHS];  /* this tier holds the path's lock (one kvcd a path) */
    bool created[TIER_DISK_MAX_PATHS]; /* this start created the path's file */
    uint64_t secret[TIER_DISK_MAX_PATHS];
    uint32_t npaths;
    uint64_t path_size; /* bytes per path, whole pages */
    uint64_t pages_per_path;
    uint64_t npages;
    struct tier_disk_page *pages;
    uint32_t open_page; /* UINT32_MAX: none */
    uint32_t next_version;
    uint32_t rr; /* next path to open a page on */
    struct io_uring ring;
    bool ring_ok;
    bool fixed_files;
    int efd;
    uint32_t inflight;   /* ops */
    uint64_t last_alloc; /* data offset of the latest alloc (0: none) */
    bool last_alloc_put; /* whether a write to it was submitted */
    struct tier_disk_buf bufs[TIER_DISK_MAX_BUFS];
    uint32_t nbufs;
    double tokens; /* write budget, bytes */
    uint64_t last_refill_ns;
    uint32_t queued; /* ops with the workers (encode or verify) */
    /* Queue depth is what the device sees, as fio's iodepth: at most queue_depth records
     * of each direction are in io_uring. Hashing runs beside them, so an op is admitted
     * while fewer than twice that many are in flight; the ones ready for the device while
     * it is full wait here, oldest first ([0] reads, [1] writes). */
    uint32_t dev[2];
    struct tier_disk_op *waitq[2], *waitq_tail[2];
    /* Records prepared in the submission ring and not yet handed to the kernel: they go in
     * one io_uring_enter at the end of a poll or at tier_disk_flush, so records that are
     * next to each other on the device reach the block layer together and merge. */
    uint32_t unsubmitted;
    struct tier_disk_pool pool;
    bool pool_ok;
    struct tier_disk_stats st;
    struct tier_disk_op *puts; /* record writes at a location, in flight */
    /* Checkpoint (disk_ckpt.c). gen counts changes to the records (alloc, write, free). */
    char *ckpt_path;        /* owned; NULL: none */
    uint64_t gen, ckpt_gen; /* ckpt_gen: gen when the latest checkpoint was written */
    uint64_t ckpt_try_ns;   /* the latest attempt (or the start) */
    bool ckpt_tried;        /* one was attempted since the start */
    uint64_t ckpt_written;  /* st.bytes_written at the latest attempt */
    struct tier_disk_ckpt_sync *ckpt_sync; /* the latest one's fsync and rename, running */
};

static inline struct tier_disk *tier_disk_of(const struct tier *t)
{
    return (struct tier_disk *)t;
}

/* ---- shared between disk.c and disk_ckpt.c ---- */

uint64_t tier_disk_now_ns(void);
void *tier_disk_aligned(uint64_t len);
uint64_t tier_disk_page_base(const struct tier_disk *d, uint32_t page);
uint32_t tier_disk_page_path(const struct tier_disk *d, uint32_t page);
/* Byte offset inside its path of a global offset (past the superblock). */
uint64_t tier_disk_path_off(const struct tier_disk *d, uint64_t off);
/* The page of a live location (live page, same version, inside the page) or UINT32_MAX. */
uint32_t tier_disk_loc_page(const struct tier_disk *d, const struct tier_loc *loc);
/* Whether h, read at byte `at` of a page of path `path`, is an intact header of this format
 * whose record fits the page. */
bool tier_disk_hdr_ok(const struct tier_disk *d, uint32_t path, const struct tier_disk_hdr *h,
                      uint64_t at);
/* Offers one record found at start to cfg->scan and, when kept, counts it live on page p
 * (version ver, append point at least up to the record's end). Returns whether it was kept. */
bool tier_disk_found(struct tier_disk *d, uint32_t p, uint32_t ver, const struct tier_disk_meta *m,
                     const struct tier_loc *loc);
/* One page's chain to walk at start (disk_walk.c). */
struct tier_disk_walk {
    uint32_t page;
    uint32_t ver; /* in: the version its records must carry (0: whatever the first header
                     says); out: the chain's */
    uint64_t at;  /* in: where the chain starts (bytes into the page); out: where it ends */
};
/* Walks the chains of pages w[0..n) at once through the ring (many pages in flight, each
 * read a window of headers), offering every intact record of the page's version to
 * tier_disk_found, except those whose data offset is in skip[0..nskip) (sorted). 0, or
 * -errno of the ring (-ENOMEM): then the start fails. */
int tier_disk_walk(struct tier_disk *d, struct tier_disk_walk *w, size_t n, const uint64_t *skip,
                   size_t nskip);
/* Where each page may hold records the caller of a checkpoint does not know yet: the open
 * page's fill, or a page's oldest record write still in flight (UINT32_MAX: none). */
void tier_disk_pages_pending(const struct tier_disk *d, uint32_t *from);

/* disk_ckpt.c: finds the records of a valid checkpoint plus what was written since. 0 when
 * it was used; -errno when there is none or it was refused (then nothing was offered and
 * every page is still FREE: the caller walks every page). */
int tier_disk_ckpt_load(struct tier_disk *d);
/* Chooses the checkpoint file from cfg.ckpt_path and paths[0]; 0 or -ENOMEM. */
int tier_disk_ckpt_init(struct tier_disk *d, bool first_is_file);
/* Waits for a checkpoint's fsync and rename still running, at destroy. */
void tier_disk_ckpt_fini(struct tier_disk *d);

/* ---- shared by disk.c, disk_io.c and disk_rec.c ----------------------------------------- */

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
    uint64_t bytes; /* counted when done */
    void *buf;      /* aligned: the header (PUT/GET) or a bounce buffer */
    uint64_t buf_len;
    void *dst;           /* READ via bounce / GET: where the data goes */
    uint64_t skip;       /* READ via bounce: offset of the wanted bytes inside buf */
    uint64_t len;        /* READ: wanted bytes; GET: dst bytes */
    void *data_bounce;   /* GET/PUT: the data passed through buf_len-sized bounce */
    struct iovec iov[2]; /* PUT/GET: header and data, one request */
    bool has_expect;
    struct tier_disk_meta expect; /* GET: what the record must say; PUT: what it says */
    /* Worker stages (docs/design/disk.md): a PUT is hashed, and compressed when asked, before it
     * is submitted; a GET is hashed, and decompressed, after its read completed. */
    struct tier_disk_op *next;    /* worker queue / done list */
    uint8_t stage;                /* enum tier_disk_stage */
    bool on_dev;                  /* PUT/GET: holds one of the direction's device slots */
    void *io_data;                /* PUT/GET: the data part of the request, kept while the */
    uint64_t io_len, io_off;      /* op waits for a device slot */
    bool submit_at_loc;           /* PUT via tier_disk_put: submit at loc once encoded */
    int level;                    /* PUT: zstd level, 0: store raw */
    uint8_t codec_req;            /* PUT: codec to try */
    const void *src;              /* PUT: the block in memory (m.len bytes) */
    void *enc;                    /* PUT: compressed bytes, rounded up with zeros */
    const void *data;             /* PUT: what goes to the device (src, enc or data_bounce) */
    uint64_t data_csum;           /* PUT: XXH3 of the stored bytes */
    struct tier_loc loc;          /* PUT: the record */
    tier_disk_encoded_fn encoded; /* PUT via tier_disk_encode */
    tier_disk_peek_fn peek;       /* PUT via tier_disk_encode_peek: run before the hash */
    uint64_t tokens;              /* PUT via tier_disk_encode: budget taken at submission */
    uint64_t want, got;           /* bytes asked of the device, and bytes it transferred */
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

static inline uint64_t tier_disk_round(uint64_t len)
{
    return (len + TIER_DISK_ALIGN - 1) & ~(uint64_t)(TIER_DISK_ALIGN - 1);
}

/* disk.c: a record header's checksum (keyed by the path's secret); frees page p once it is
 * full, holds no record and no request touches it. */
uint64_t tier_disk_hdr_csum(const struct tier_disk *d, uint32_t path,
                            const struct tier_disk_hdr *h);
void tier_disk_page_maybe_free(struct tier_disk *d, uint32_t p);
/* disk_io.c: ops and their submission. buf_index: the registered buffer holding [p, p+len),
 * or -1. op_start takes a device slot of the op's direction or queues it; op_end finishes a
 * completed op. tier_disk_write and tier_disk_read are the tier interface's. */
int tier_disk_buf_index(const struct tier_disk *d, const void *p, uint64_t len);
struct tier_disk_op *tier_disk_op_new(struct tier_disk *d, uint8_t kind, uint32_t page,
                                      tier_done_fn done, void *arg);
void tier_disk_op_start(struct tier_disk *d, struct tier_disk_op *op);
void tier_disk_op_free(struct tier_disk_op *op);
uint32_t tier_disk_ops_max(const struct tier_disk *d);
int tier_disk_dev_submit(struct tier_disk *d, struct tier_disk_op *op);
void tier_disk_op_end(struct tier_disk *d, struct tier_disk_op *op);
int tier_disk_write(struct tier *t, const struct tier_loc *loc, uint64_t off, const void *src,
                    uint64_t len, tier_done_fn done, void *arg);
int tier_disk_read(struct tier *t, const struct tier_loc *loc, uint64_t off, void *dst,
                   uint64_t len, tier_done_fn done, void *arg);
/* disk_rec.c: the write bucket's size; the worker pool; queue hands an op to a worker stage;
 * encoded submits a PUT a worker encoded, get_verify ends a GET a worker verified. */
double tier_disk_burst(const struct tier_disk *d);
int tier_disk_pool_start(struct tier_disk *d);
void tier_disk_pool_stop(struct tier_disk *d);
void tier_disk_queue(struct tier_disk *d, struct tier_disk_op *op, uint8_t stage);
void tier_disk_encoded(struct tier_disk *d, struct tier_disk_op *op);
int tier_disk_get_verify(struct tier_disk *d, struct tier_disk_op *op);

#endif
