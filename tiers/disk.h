/*
 * disk.h — the disk tier: O_DIRECT files or block devices driven through io_uring.
 *
 * DESIGN
 * Follows memcached's extstore. Every path is cut into pages of page_size bytes; records
 * are appended to one open page at a time and a page is reused only once every record on it
 * is dead, with a new version drawn from one counter that only grows (persisted in the
 * record headers). A location is (page, version, offset): tier_loc.off is the global byte
 * offset of the record's data (path i owns [i*size, (i+1)*size)), tier_loc.cls the page
 * version, so a stale location fails one comparison.
 * A record is a 4 KiB self-describing header (magic, format version, page version,
 * namespace descriptor, key, parent key, depth, length, codec, XXH3 of the data, XXH3 of the
 * header) followed by the data rounded up to 4 KiB. Header and data are written, and read,
 * by one vectored request; since the header checksums the data, a record cut off anywhere
 * fails verification and is never served. The header checksum is seeded with a random
 * secret kept in a 4 KiB superblock at the start of each path, so stale block bytes (which
 * a client chose) can never be taken for a header when a reused page is walked. At start
 * the page chains are walked header by header (no manifest to keep in step), and every
 * reported record is verified again when read. A record allocated but never written is
 * taken back when freed if it is still the page's last, so no page keeps a hole that would
 * cut its chain.
 * A checkpoint (tier_disk_checkpoint) makes the start cost independent of the record count:
 * a sidecar file, written atomically from the caller's list of live records, holds them
 * (64 bytes each, namespace descriptors in a table) with every page's version and state,
 * where each page may still grow (the open page's fill, or its oldest write in flight), the
 * version counter, and an XXH3 seeded with the superblock secret. At start one header is
 * read per page (io_uring, batched): a page whose first header carries a version newer
 * than the checkpoint's counter was reused since, so its checkpointed records are dropped
 * and it is walked in full; any other live page keeps its checkpointed records and is
 * walked only from where it could have grown. A checkpoint that fails any check (checksum,
 * secret, geometry, length) is ignored and every page is walked as without one. Records
 * taken from a checkpoint are verified on every read like any other.
 * Paths are opened with O_NOFOLLOW, and one that holds neither a kvcd superblock nor zeros
 * in its first 4 KiB is refused unless cfg.format says FORCE, so a wrong path never
 * overwrites foreign data. A transfer that completes short (even 4 KiB aligned) is an I/O
 * error.
 * The daemon's host arena is registered as fixed buffers, so tier_disk_put/get move bytes
 * between arena slots and the device with no copy; the files are registered too. Completions
 * are signalled on an eventfd (tier_disk_fd) that the daemon's epoll loop watches; the loop
 * calls tier_disk_poll, which runs the callbacks. Writes are bounded by a token bucket and
 * refused with -EAGAIN when the queue is full, never stalled. Hashing (XXH3) and zstd run on
 * worker threads (cfg.workers): a write is encoded there before it is submitted (and, via
 * tier_disk_encode, before its record is allocated, so a compressed block takes only its
 * compressed size), a read is verified and decompressed there before its callback runs;
 * finished work comes back through the same eventfd. The header records the stored length,
 * the codec, the block's length in memory and its own (opaque) format.
 * The generic ops (tier.h) read and write raw bytes of a record's data area; offsets and
 * lengths that are not 4 KiB multiples use a bounce buffer (read-modify-write for writes,
 * done synchronously). They exist for the conformance suite and tools; the daemon uses
 * tier_disk_put and tier_disk_get. Owned by the daemon's loop thread.
 */
#ifndef KVC_TIER_DISK_H
#define KVC_TIER_DISK_H

#include <stdbool.h>
#include <stdint.h>

#include "tiers/disk_codec.h"
#include "tiers/tier.h"

#define TIER_DISK_ALIGN 4096u
#define TIER_DISK_HDR 4096u /* header bytes in front of every record */
#define TIER_DISK_SB 4096u  /* superblock at the start of every path, before its pages */
#define TIER_DISK_NS_BYTES 160u
#define TIER_DISK_MAX_PATHS 8u

/* What a record says about itself (the daemon's view of a block). */
struct tier_disk_meta {
    uint64_t key[2];
    uint64_t parent[2];
    uint32_t depth;
    uint32_t codec;                  /* enum tier_disk_codec of the stored bytes; set by the
                                        tier (found at start, chosen at encode) */
    uint64_t len;                    /* the block's bytes in memory */
    uint64_t stored;                 /* bytes on the device; set by the tier */
    uint32_t format;                 /* the block's own encoding (kvcd: the wire format,
                                        raw or quantized); opaque, checked on read */
    uint8_t ns[TIER_DISK_NS_BYTES];  /* opaque namespace descriptor, compared bytewise */
};

struct tier_disk_rec;
/* A record encoded by tier_disk_encode: status 0 and the record (write it with
 * tier_disk_rec_put or drop it with tier_disk_rec_free), or -ENOMEM and NULL. */
typedef void (*tier_disk_encoded_fn)(void *arg, struct tier_disk_rec *r, int status);

/* Called for every intact record found at start. Return 0 to keep it (the caller then owns
 * the location and frees it with ops->free), anything else to let the tier drop it. */
typedef int (*tier_disk_scan_fn)(void *arg, const struct tier_disk_meta *m,
                                 const struct tier_loc *loc);

/* What to do with a path that has no valid superblock of this format. */
enum tier_disk_format {
    TIER_DISK_FORMAT_AUTO = 0,  /* format a new or empty path (its first 4 KiB all zero) or
                                   one of an older kvcd; refuse anything else (-EEXIST) */
    TIER_DISK_FORMAT_NEVER = 1, /* use only a path kvcd formatted (-ENOENT, -EEXIST) */
    TIER_DISK_FORMAT_FORCE = 2, /* format whatever is there (its bytes are lost) */
};

/* One live record for a checkpoint: fills *m (key, parent, depth, len, format, ns; codec
 * and stored may be 0 when unknown) and *loc (as alloc handed it out) and returns 1; 0 at
 * the end; a negative errno abandons the checkpoint. */
typedef int (*tier_disk_ckpt_next_fn)(void *arg, struct tier_disk_meta *m,
                                      struct tier_loc *loc);

struct tier_disk_config {
    const char *paths[TIER_DISK_MAX_PATHS]; /* files (created and sized) or block devices */
    uint32_t npaths;
    uint64_t size;        /* bytes per path, rounded down to whole pages */
    uint64_t page_size;   /* multiple of 4 KiB, at least 64 KiB */
    uint32_t queue_depth; /* records on the device per direction (as fio's iodepth), 1..4096;
                             as many again may be hashing or waiting for a slot */
    uint64_t write_rate;  /* bytes per second written at most; 0: unbounded */
    tier_disk_scan_fn scan; /* NULL: start empty (records found are dropped) */
    void *scan_arg;
    void (*progress)(void *arg, uint64_t pages_done, uint64_t pages); /* during the scan */
    void *progress_arg;
    uint32_t workers;     /* threads hashing and compressing records; 0: 2 */
    uint32_t format;      /* enum tier_disk_format */
    const char *ckpt_path; /* the checkpoint file. NULL: paths[0] + ".ckpt" when paths[0] is
                              a regular file, none beside a block device; "": none */
};

struct tier_disk_stats {
    uint64_t capacity, used;        /* bytes; used = live record data */
    uint64_t pages, pages_free;
    uint64_t dead_bytes;            /* in closed pages: what compaction could reclaim */
    uint64_t reads_inflight, writes_inflight;
    uint64_t bytes_read, bytes_written;
    uint64_t reads, writes;
    uint64_t read_errors, write_errors, checksum_failures;
    uint64_t throttled, queue_full;
    uint64_t failed_paths;
    uint64_t records_found;         /* at start: kept by scan, in all */
    uint64_t records_ckpt;          /* at start: of them, taken from the checkpoint */
    uint64_t records_walked;        /* at start: of them, found walking page chains */
    uint64_t start_reads;           /* at start: reads of record headers (each a 4 KiB header,
                                       or a window of up to 1 MiB of a page's records) */
    uint64_t start_bytes;           /* at start: bytes those reads brought */
    uint64_t start_us;              /* at start: time to load the index */
    bool ckpt_loaded;               /* at start: a valid checkpoint was used */
    uint64_t ckpt_writes, ckpt_errors;
    uint64_t ckpt_records, ckpt_bytes, ckpt_us; /* the latest checkpoint written: until it
                                                   was on the device under its name */
    uint64_t ckpt_loop_us;          /* of it, the time on the calling thread (listing and
                                       writing; the fsync and rename run aside) */
    bool ckpt_stale;                /* records changed since the latest checkpoint */
    uint64_t short_io;              /* transfers that completed short (also I/O errors) */
    uint64_t codec_in, codec_out;   /* bytes given to zstd, and what was stored for them */
    uint64_t compressed, incompressible; /* records stored compressed / raw after trying */
    bool buffered;                  /* O_DIRECT refused by the file system */
    bool fixed_buffers;             /* the arena is registered */
};

/* Opens (creating and sizing files as needed) every path, sets up the ring and finds the
 * records (from a valid checkpoint plus the pages that changed since, or walking every
 * page). NULL on failure with *err: -EINVAL (config, or a path that is neither a file nor
 * a block device), -ENOSPC (a path smaller than one page), -ELOOP (a symbolic link),
 * -EEXIST (a path holding foreign data, see enum tier_disk_format), -ENOENT (a missing path
 * with TIER_DISK_FORMAT_NEVER), -errno of open/fallocate/io_uring_queue_init. */
struct tier *tier_disk_new(const struct tier_disk_config *cfg, int *err);

/* Registers [base, base+len) (the host arena) as fixed buffers: transfers from or to it use
 * no bounce copy and no per-request page pinning. 0 or -errno (then plain requests are used;
 * still zero-copy with O_DIRECT). */
int tier_disk_buffers_register(struct tier *t, void *base, uint64_t len);

/* The eventfd that becomes readable when completions are ready. Owned by the tier. */
int tier_disk_fd(const struct tier *t);
/* Reaps completions and runs their callbacks, then hands the kernel every request prepared
 * since the last call. Returns how many callbacks ran. */
int tier_disk_poll(struct tier *t);
/* Hands the kernel the requests that tier_disk_get/put and rec_put prepared: they are held
 * until this call or the next tier_disk_poll, so a burst of records (a prefix's promotions,
 * a batch of demotions) enters the kernel in one system call and adjacent records merge in
 * the block layer. A caller that issues requests outside tier_disk_poll's callbacks calls
 * this before it sleeps (the daemon: before every epoll_wait). */
void tier_disk_flush(struct tier *t);
/* Waits until nothing is in flight, running callbacks. */
void tier_disk_drain(struct tier *t);

/* Writes a whole record: the header from m and m->len bytes from src into loc (from alloc
 * with at least m->len bytes). done(arg, 0) once both are on the device; -EIO on an I/O
 * error (the path is then marked failed). Returns 0, -EINVAL (bad location or length),
 * -EAGAIN (write rate or queue depth reached: nothing was submitted, try later), -EIO (the
 * path failed earlier). */
int tier_disk_put(struct tier *t, const struct tier_loc *loc, const struct tier_disk_meta *m,
                  const void *src, tier_done_fn done, void *arg);

/* Encodes a record on a worker thread: hashes m->len bytes of src and, with level > 0,
 * compresses them with codec (TIER_DISK_CODEC_ZSTD or _ZSTD_PLANES), keeping the result
 * only if it saves at least 4 KiB on the device. src must stay unchanged until done runs;
 * done runs on the loop thread, from tier_disk_poll. The record counts as a write in flight
 * until it is written or freed. Returns 0, -EAGAIN (queue depth or write rate: nothing
 * queued), -EINVAL, -ENOMEM, -EIO (every path failed). */
int tier_disk_encode(struct tier *t, const struct tier_disk_meta *m, const void *src,
                     int codec, int level, tier_disk_encoded_fn done, void *arg);
/* The same, and peek(arg, bytes, m->len) runs on the worker before the hash: the caller reads
 * the block's bytes where the tier reads them anyway (kvcd measures a raw block's value norms
 * there): src, or the private copy a compressed write encodes. peek may touch those bytes and
 * what arg owns alone, never loop state; NULL: none. */
typedef void (*tier_disk_peek_fn)(void *arg, const void *src, uint64_t len);
int tier_disk_encode_peek(struct tier *t, const struct tier_disk_meta *m, const void *src,
                          int codec, int level, tier_disk_peek_fn peek, tier_disk_encoded_fn done,
                          void *arg);
/* Data bytes the record needs: what to alloc. */
uint64_t tier_disk_rec_len(const struct tier_disk_rec *r);
/* The record's metadata as it will be written (codec, stored, ...). */
const struct tier_disk_meta *tier_disk_rec_meta(const struct tier_disk_rec *r);
/* Writes an encoded record at loc (from alloc with tier_disk_rec_len bytes). Takes r in
 * every case. done(arg, 0 or -EIO) as tier_disk_put. Returns 0, -EINVAL, -EIO; never
 * -EAGAIN (the queue slot and write budget were taken by tier_disk_encode). */
int tier_disk_rec_put(struct tier *t, const struct tier_loc *loc, struct tier_disk_rec *r,
                      tier_done_fn done, void *arg);
void tier_disk_rec_free(struct tier *t, struct tier_disk_rec *r);

/* Whether a put of len data bytes could start now: 0, or -EAGAIN (queue depth or write rate
 * reached). Lets a caller skip the alloc of a record it cannot write yet. */
int tier_disk_put_ready(struct tier *t, uint64_t len);

/* Reads the record at loc into dst (dst_len >= the data rounded up to 4 KiB for the
 * zero-copy path; otherwise, and for a compressed record, a bounce buffer is used) and
 * verifies it: header checksum, version, and when `expect` is given its key, namespace,
 * length (in memory) and format, then the data's XXH3 (on a worker thread, which also
 * decompresses into dst). done(arg, 0), or -EBADMSG for any mismatch or a record that does
 * not decompress (counted), -EIO. Returns 0, -EINVAL, -EAGAIN. `expect` is copied. */
int tier_disk_get(struct tier *t, const struct tier_loc *loc, const struct tier_disk_meta *expect,
                  void *dst, uint64_t dst_len, tier_done_fn done, void *arg);

void tier_disk_stats_get(const struct tier *t, struct tier_disk_stats *st);

/* Whether an alloc of len bytes would succeed now (room on the open page or a free page). */
bool tier_disk_can_alloc(const struct tier *t, uint64_t len);
/* The page a live location lies on, or -1. */
int tier_disk_page_of(const struct tier *t, const struct tier_loc *loc);
/* The closed page with the smallest live fraction (live record bytes, headers included, over
 * the page size), if below below_pct percent: 0 and *page, or -ENOENT. For the compactor,
 * which moves the page's live records to the open page so the page can be reused. */
int tier_disk_compact_pick(const struct tier *t, uint32_t below_pct, uint32_t *page);

/* Writes the checkpoint of the records `next` lists (the caller's live records; each must
 * be on a live page under its current version, others are skipped) to a temporary file
 * beside cfg.ckpt_path: one sequential write through a 1 MiB buffer, on the calling (loop)
 * thread, with memory that does not grow with the record count. A helper thread then
 * fsyncs it, renames it over the previous one and fsyncs the directory, so the loop does
 * not wait for the device; tier_disk_checkpoint_wait gives that verdict. A checkpoint
 * still syncing is waited for first. Returns the records written, or -ENOENT (no checkpoint
 * path), -E2BIG (more than 65535 namespaces), -ENOMEM, -errno of open/write, or next's
 * error; the previous checkpoint is then untouched. */
int tier_disk_checkpoint(struct tier *t, tier_disk_ckpt_next_fn next, void *arg);
/* The verdict on the latest checkpoint's fsync and rename, given once: 0 (it is on the
 * device under its name, or none was pending), -errno of fsync/rename (the previous one
 * stays), or -EINPROGRESS while it runs and wait is false (wait: until it is done). */
int tier_disk_checkpoint_result(struct tier *t, bool wait);
/* Whether a checkpoint is worth writing: none is syncing, records were allocated, written or
 * freed since the last one written (or the start walked pages), and interval_ms passed since
 * the last try; or, at least a second after the last try and twenty times the loop time the
 * last one took, either none was tried since the start and records exist (the first one comes
 * soon after start), or every_bytes (0: never) of records were written since the last try. */
bool tier_disk_checkpoint_due(const struct tier *t, uint64_t interval_ms, uint64_t every_bytes);
/* The checkpoint file, or NULL when there is none. Owned by the tier. */
const char *tier_disk_checkpoint_path(const struct tier *t);

/* Bytes a record of len data bytes takes on the device. */
uint64_t tier_disk_record_bytes(uint64_t len);

#endif
