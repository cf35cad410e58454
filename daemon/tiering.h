/*
 * tiering.h — the tier engine: moves blocks between the host arena and the disk tier.
 *
 * DESIGN
 * A block keeps its place in the prefix tree whatever tier holds it; only its location
 * changes. Demotion: when a host arena crosses its high watermark, the coldest unpinned
 * blocks (LRU tail) are written to disk — a block hit at least `admit_hits` times, or one
 * with children (a parent must stay cached somewhere) — and their host slots are freed
 * only once the write completed; a leaf that is not admitted is dropped as before. A block
 * pinned while its write runs stays in memory and the disk copy is given back. Promotion:
 * a lookup hit on disk gets a fresh host slot at once and the block switches to it with
 * BLOCK_F_PROMOTING; the lease names that slot without KVC_LOC_F_READY, and WAIT answers
 * when the read completed. A read that fails verification marks the block LOST: a miss for
 * every lookup, dropped once nothing hangs from it and nobody holds it. When the disk is
 * full, unpinned leaves on disk are evicted (LRU) until a record fits. At start the disk's
 * records are taken back into the index parents first (by depth); a record whose parent is
 * missing or whose namespace conflicts is freed. Compaction: when fewer than a quarter of
 * the disk's pages are free, the page least live (under `compact_below` percent) has its
 * live records read, verified and appended to the open page; the index switches to the
 * copy when its write completed (the block is still the same one at the same record),
 * then the old record dies and the page comes free. Compression: a record is encoded on the
 * disk tier's workers first (XXH3, and zstd at the namespace's level: byte planes for raw
 * fp16/bf16, plain zstd for quantized blocks) and allocated for its encoded size when that
 * is done; a read is verified and decompressed there too. A quantized block goes to disk as
 * it is (the record carries its format and length) and comes back the same. Owned by the
 * loop thread.
 */
#ifndef KVC_TIERING_H
#define KVC_TIERING_H

#include <stdint.h>

#include "client/kvc_proto.h"

struct store;
struct store_owner;

struct tiering_params {
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
};

/* Opens the disk tier, registers the host arena with it and takes its blocks back into the
 * index. 0 or -errno (the store is unchanged then). */
int tiering_attach(struct store *s, const struct tiering_params *p);
/* Waits for the I/O in flight and closes the disk tier. NULL tiering is a no-op. */
void tiering_free(struct store *s);
/* Reloadable: admission and write rate are read from here. */
void tiering_reload(struct store *s, uint32_t admit_hits);
/* Hits a block needs to be written to disk rather than dropped (disk.admit_hits). */
uint32_t tiering_admit_hits(const struct store *s);
/* Reloadable: the default zstd level; namespaces' own levels are asked again. */
void tiering_compress_set(struct store *s, int level);

/* The descriptor the loop watches, and what it calls when it is readable. */
int tiering_fd(const struct store *s);
void tiering_poll(struct store *s, uint64_t now);
/* Hands the disk the reads and writes prepared since the last call (tier_disk_flush): the
 * loop calls it before every wait. */
void tiering_flush(struct store *s);

/* Called by store_lookup_flags with the run of committed hits: starts the reads of hits on
 * disk and returns how many hits to hand out (fewer when a read cannot start, or with
 * KVC_LOOKUP_F_READY_ONLY). */
uint32_t tiering_lookup_prepare(struct store *s, uint16_t ns, const struct kvc_wire_key *keys,
                                uint32_t hits, uint32_t flags, uint64_t now);

/* Starts demotions (or drops) while a host arena is above its high watermark. Returns the
 * number of blocks acted on. */
int tiering_demote(struct store *s, uint64_t now);

/* For the policy engine (store_policy.c): starts the write of one host block to disk (0,
 * -EAGAIN: rate or queue limit, -EBUSY, -errno), and the host bytes whose writes are in
 * flight (they count as freed). */
int tiering_offload(struct store *s, uint32_t idx, uint64_t now);
uint64_t tiering_pending_bytes(const struct store *s);

/* State of a lease: hits, hits ready from the first, hits still being read. -ENOENT. */
int tiering_lease_state(struct store *s, struct store_owner *owner, uint64_t lease_id, uint32_t *nhit,
                        uint32_t *nready, uint32_t *pending);

/* tiering_ckpt.c: checkpoints of the disk index. tiering_checkpoint writes one now: the
 * records written, or -ENOENT (no disk tier or no checkpoint file), -errno (logged).
 * tiering_checkpoint_tick writes one when records changed and interval_ms passed (0: never);
 * tiering_checkpoint_stop waits for the disk's requests, then writes one (at SIGTERM). */
int tiering_checkpoint(struct store *s);
void tiering_checkpoint_tick(struct store *s, uint64_t interval_ms);
int tiering_checkpoint_stop(struct store *s);
/* Logs how the disk index was loaded at start (checkpoint, walk, time). */
void tiering_checkpoint_started(const struct store *s);
/* The checkpoint's gauges (disk_checkpoint_*, disk_start_*), for tiering_stats. */
void tiering_checkpoint_stats(const struct store *s,
                              void (*put)(void *arg, const char *name, uint64_t v), void *arg);

/* Calls put(name, value) for every disk gauge (disk_capacity, disk_used, ...). */
void tiering_stats(const struct store *s, void (*put)(void *arg, const char *name, uint64_t v),
                   void *arg);

#endif
