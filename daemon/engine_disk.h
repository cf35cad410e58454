/*
 * engine_disk.h — the tier engine: moves blocks between the host arena and the disk tier.
 *
 * DESIGN
 * The hierarchy is inclusive. A block keeps its place in the prefix tree whatever tier holds
 * it; where it is lives in struct block (daemon/index.h): its fastest copy (host arena, GPU
 * pool or disk) and, with BLOCK_F_DISK, a disk record. A block in memory with a record is
 * clean: its memory can go at no cost (it stays cached on disk), and it is never written
 * again while the record lives — a block is written to disk once per content.
 * Write-back: dirty blocks are written from the cold end of each arena's dirty list ahead
 * of need, so that free plus clean memory covers what the puts of the next second bring
 * (the put rate and the disk's write rate are measured; at least the band between the
 * watermarks, at most half the arena); they stay in memory and move to the clean list.
 * Pressure (an arena over its high watermark, or an allocation that finds no room): clean
 * blocks leave memory first; a dirty block the disk would take (admitted: hit at least
 * `admit_hits` times, or a parent) is never dropped — it is demoted (written, then freed)
 * and a put that finds no room meanwhile is refused (NOSPACE, counted) rather than a
 * cached block lost; a leaf the disk would not take is dropped as without a disk.
 * Promotion: a lookup hit on disk gets a fresh slot in its namespace's arena at once and
 * the block switches to it with BLOCK_F_PROMOTING; the lease names that slot without
 * KVC_LOC_F_READY, and WAIT answers when the read completed. The record stays (clean). A
 * read that fails verification frees the record and marks the block LOST: a miss for every
 * lookup, dropped once nothing hangs from it and nobody holds it. Disk full: the coldest
 * unpinned leaves only on disk are evicted until a record fits; a disk full of what it
 * cannot evict takes nothing more until it can (dirty leaves then go as without a disk).
 * Write-back writes a block's dirty ancestors first, so no record is an orphan after a
 * crash. Every move works on the block's own
 * arena. A block in motion (BLOCK_F_BUSY) is never freed or moved by any path
 * (store_block_idle). At start the disk's records are taken back into the index parents
 * first (by depth), each in a namespace opened, placed and bound to its configuration
 * section exactly as NS_OPEN does (engine_disk_params.ns_open); a record whose parent is
 * missing or whose namespace is refused is freed. Compaction: when fewer than a quarter of
 * the disk's pages are free, the page least live (under `compact_below` percent) has its
 * live records read, verified and appended to the open page; the block switches to the
 * copy when its write completed (it still has the record that was read, and no promotion
 * is reading it), then the old record dies and the page comes free. Compression: a record
 * is encoded on the disk tier's workers first (XXH3, and zstd at the namespace's level:
 * byte planes for raw fp16/bf16, plain zstd for quantized blocks) and allocated for its
 * encoded size; a read is verified and decompressed there too. Owned by the loop thread.
 */
#ifndef KVC_ENGINE_DISK_H
#define KVC_ENGINE_DISK_H

#include <stdbool.h>
#include <stdint.h>

#include "client/kvc_proto.h"

struct store;
struct store_owner;

struct engine_disk_params {
    const char *paths[8];
    uint32_t npaths;
    uint64_t size;
    uint64_t page_size;
    uint32_t queue_depth;
    uint64_t write_rate;
    uint32_t admit_hits;
    uint32_t compact_below; /* percent live under which a page is compacted; 0: never */
    int compress_level;     /* zstd level of records (0: raw), unless ns_level says */
    int (*ns_level)(void *arg, const char *model_id); /* a namespace's level, or -1 */
    void *ns_level_arg;
    uint32_t workers;       /* threads hashing and compressing records (0: 2) */
    void (*progress)(void *arg, uint64_t pages_done, uint64_t pages);
    void *progress_arg;
    uint32_t format;        /* enum tier_disk_format: a path without a kvcd superblock */
    const char *ckpt_path;  /* the index checkpoint (tier_disk_config.ckpt_path) */
    /* Opens the namespace of an adopted record as NS_OPEN does (arena, access list, quotas,
     * policy); NULL: store_ns_open. Non-zero refuses the record. */
    int (*ns_open)(void *arg, const struct kvc_wire_layout *l, uint32_t *ns_id, bool *created);
    void *ns_open_arg;
};

/* Opens the disk tier, registers the host arena with it and takes its blocks back into the
 * index. 0 or -errno (the store is unchanged then). */
int engine_disk_attach(struct store *s, const struct engine_disk_params *p);
/* Waits for the I/O in flight and closes the disk tier. No disk tier is a no-op. */
void engine_disk_free(struct store *s);
/* Registers host arena 0 with the disk tier's io_uring (fixed buffers) once it is faulted in;
 * until then transfers pin pages per request. Called at attach and on the tick; no-op
 * without a disk tier or once done. */
void engine_disk_buffers_register(struct store *s);
/* Reloadable: admission and write rate are read from here. */
void engine_disk_reload(struct store *s, uint32_t admit_hits);
/* Hits a block needs to be written to disk rather than dropped (disk.admit_hits). */
uint32_t engine_disk_admit_hits(const struct store *s);
/* Reloadable: the default zstd level; namespaces' own levels are asked again. */
void engine_disk_compress_set(struct store *s, int level);

/* The descriptor the loop watches, and what it calls when it is readable. */
int engine_disk_fd(const struct store *s);
void engine_disk_poll(struct store *s, uint64_t now);
/* Hands the disk the reads and writes prepared since the last call (tier_disk_flush): the
 * loop calls it before every wait. */
void engine_disk_flush(struct store *s);

/* Called by engine_lookup_flags with the run of committed hits, keys[0..hits) and the blocks
 * the lookup found for them, idxs[0..hits) (struct store_lookup_blocks; no key is looked up
 * again): starts the reads of hits on disk (queued behind the read queue when it is full)
 * and returns how many hits to hand out (fewer when a read cannot start — *short_of_room set
 * when memory had no room for it —, at a block gone since it was found, or with
 * KVC_LOOKUP_F_READY_ONLY). */
uint32_t engine_disk_lookup_prepare(struct store *s, uint16_t ns, const struct kvc_wire_key *keys,
                                    const uint32_t *idxs, uint32_t hits, uint32_t flags,
                                    uint64_t now, bool *short_of_room);

/* The engine under pressure and ahead of it (engine_trim, after commits, every poll): clean
 * blocks leave memory and dirty ones are demoted above the high watermark; write-back keeps
 * free plus clean memory at its target. Returns the number of blocks acted on. */
int engine_disk_trim(struct store *s, uint64_t now);

/* For the memory half (engine.c): whether the disk would take block idx (admitted and the
 * disk up); a clean idle block in memory gives its memory back (stays on disk). */
bool engine_disk_takes(const struct store *s, uint32_t idx);
/* Whether memory of host arena `arena` will come free without dropping anything: writes
 * of its blocks are in flight, or dirty blocks the disk would take are there to write. */
bool engine_disk_room_coming(struct store *s, uint32_t arena);
/* Starts writing dirty blocks of a host arena out (they stay, clean) until `bytes` are on
 * their way, past the usual target: a put waits for that room. */
void engine_disk_write_ahead(struct store *s, uint32_t arena, uint64_t bytes, uint64_t now);
void engine_disk_memory_drop(struct store *s, uint32_t idx);

/* For the policy engine (store_policy.c): starts the write of one host block to disk (0,
 * -EAGAIN: rate or queue limit, -EBUSY, -errno), and the host bytes whose writes are in
 * flight (they count as freed). */
int engine_disk_offload(struct store *s, uint32_t idx, uint64_t now);
uint64_t engine_disk_pending_bytes(const struct store *s);

/* State of a lease: hits, hits ready from the first, hits still being read. -ENOENT. */
int engine_disk_lease_state(struct store *s, struct store_owner *owner, uint64_t lease_id, uint32_t *nhit,
                        uint32_t *nready, uint32_t *pending);

/* The header a record of block b carries (key, parent, depth, bytes in memory, format,
 * namespace layout): for writes, and for the checkpoint's list of records. */
struct block;
struct tier_disk_meta;
void engine_disk_meta(const struct store *s, const struct block *b, struct tier_disk_meta *m);

/* engine_disk_ckpt.c: checkpoints of the disk index. engine_disk_checkpoint writes one now:
 * the records written, or -ENOENT (no disk tier or no checkpoint file), -errno (logged).
 * engine_disk_checkpoint_tick writes one when records changed and interval_ms passed (0:
 * never), and sooner: the first one once records exist, then one every every_bytes written
 * (tier_disk_checkpoint_due); engine_disk_checkpoint_stop waits for the disk's requests, then
 * writes one (at SIGTERM). */
int engine_disk_checkpoint(struct store *s);
void engine_disk_checkpoint_tick(struct store *s, uint64_t interval_ms, uint64_t every_bytes);
int engine_disk_checkpoint_stop(struct store *s);
/* Logs how the disk index was loaded at start (checkpoint, walk, time). */
void engine_disk_checkpoint_started(const struct store *s);
/* The checkpoint's gauges (disk_checkpoint_*, disk_start_*), for engine_disk_stats. */
void engine_disk_checkpoint_stats(const struct store *s,
                                  void (*put)(void *arg, const char *name, uint64_t v),
                                  void *arg);

/* Calls put(name, value) for every disk gauge (disk_capacity, disk_used, ...). */
void engine_disk_stats(const struct store *s, void (*put)(void *arg, const char *name, uint64_t v),
                   void *arg);

#endif
