/*
 * engine.h — the tier engine: where each block lives and every move between tiers.
 *
 * DESIGN
 * One owner of movement. The store (daemon/store.h) keeps what is: namespaces, the index,
 * leases, reservations, each arena's lists and a block's locations (struct block in
 * daemon/index.h). The engine decides and carries out what changes where a block is:
 * which block gives up its memory (victims), eviction, the room a reservation gets (the
 * store asks through store.room), trimming above the watermarks, moves between a host
 * arena and the GPU pool (engine_gpu.c: asynchronous copies the loop completes),
 * quantize-in-place (daemon/quant.c carries the jobs out), and the disk tier's moves
 * (engine_disk.c: write-back, demotion, promotion, compaction, adoption at start).
 * Policies (policies/) are pure functions it calls with block metadata.
 * A block's state machine is in its flags (index.h): committed, pinned, BUSY (being
 * written, read, quantized, copied to or from the pool), LOST, clean (BLOCK_F_DISK) or
 * dirty, and which list it is on;
 * every path that frees, moves, quantizes or evicts asks store_block_idle() first, so a
 * block in motion is never freed by a policy, a quota, an operator or a namespace drop.
 * ONE RESOLUTION PER KEY. A LOOKUP finds each of its keys in the index once: store_lookup_run
 * fills a struct store_lookup_blocks with the run's blocks and the key it stops at, the
 * remote step adds the keys past the run (and the blocks it reads for them), and every later
 * step (the GPU moves, the disk and remote steps, the lease) takes those handles. A step
 * after one that may make room checks a handle with index_handle_ok (still its key's
 * committed block) and ends the hits before one that went. A window's or a state's lookup
 * (engine_lookup_kind) finds its keys when a step first asks for one (store_lookup_block:
 * a state's span from the last key back stops at the first it finds) and hands the same
 * handles to the remote step, the disk and pool steps of READY_ONLY, the span judged again
 * and the lease. The stat lookup_index_finds counts a lookup's finds, of every kind: at
 * most one per key asked for (tests: e2e_fast, e2e_disk, e2e_remote).
 * LAYERS. The daemon's files point down, never up: main → server → admin → acl → engine
 * (engine.c) → engine_disk, engine_gpu, engine_remote → quant → store (store.c,
 * store_policy.c) → index, fast, stats.h → log; config (with config_ns), loop, notify,
 * proto and remote_keys beside them, config itself in three layers (config → config_ns →
 * config_parse: the option table hands the namespace sections their table, and both read
 * values with config_parse's parsers); tiers/, policies/ and kernels/ below them all. A file
 * includes and calls only files below its own. tests/check_layers.py (a suite of make
 * check) reads the includes and the calls the linker resolves and fails on any circle (it
 * allows none). The tier
 * engines reach the core's room and eviction through struct engine_core (engine_core.h),
 * passed down in the store, and admin the server's clients through struct
 * admin_server_ops (admin.h), passed down in its context: neither calls up.
 * Owned by the loop thread.
 */
#ifndef KVC_ENGINE_H
#define KVC_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "client/kvc_proto.h"
#include "daemon/engine_core.h"

struct store;
struct store_ns;
struct store_owner;
struct tier_loc;

/* Makes the store find room through the engine (eviction, the GPU pool). Once, after
 * store_new(). */
void engine_attach(struct store *s);
/* Settles the pool's moves and stops the quantize worker and the disk tier (waiting for
 * their work in flight). Before store_free(). */
void engine_stop(struct store *s);

/* Longest committed prefix of keys[0..n): GPU moves and reads from disk as needed, then the
 * hits pinned under a new lease (*lease_id, 0 if none) with their locations in locs, and
 * counted (lookups, hits, misses: once per answered LOOKUP). With KVC_LOOKUP_F_* flags: hits
 * on disk start a read into a fresh host slot, and pool blocks a client cannot read a copy
 * into one (their locs lack KVC_LOC_F_READY); READY_ONLY stops the hits at the first such
 * block. With ENGINE_LOOKUP_F_DEFER (the caller waits for room rather than answer a lookup
 * cut short for lack of it): a lookup cut short so returns -EAGAIN before anything is pinned
 * or counted (the reads it started go on), and is asked again later. With
 * ENGINE_LOOKUP_F_DEFER_MOVES the same for a lookup of a client that cannot read the pool cut
 * short because the pool's moves are all in flight (engine_gpu_move's -EAGAIN) while copies
 * are on their way to free them (engine_gpu_landing): the moves it started go on, and a
 * later try starts the next ones as slots free. Returns hits, or -ENOENT (ns), -EMFILE (too
 * many handles), -ENOMEM, -EAGAIN (ENGINE_LOOKUP_F_DEFER, ENGINE_LOOKUP_F_DEFER_MOVES). */
#define ENGINE_LOOKUP_F_DEFER 0x80000000u
#define ENGINE_LOOKUP_F_DEFER_MOVES 0x20000000u
int engine_lookup(struct store *s, struct store_owner *o, uint32_t ns_id,
                  const struct kvc_wire_key *keys, uint32_t n, uint64_t now, uint64_t *lease_id,
                  struct kvc_wire_loc *locs);
int engine_lookup_flags(struct store *s, struct store_owner *o, uint32_t ns_id,
                        const struct kvc_wire_key *keys, uint32_t n, uint32_t flags, uint64_t now,
                        uint64_t *lease_id, struct kvc_wire_loc *locs);

/* Releases lease lease_id of o (store_release), then starts the promotions into the pool of
 * its host-tier hits when it was looked up by an owner that reads the pool (as many as
 * ENGINE_GPU_INFLIGHT allows; a block another lease still pins stays until a later
 * release). A lookup starts none: its client is copying those very bytes from the host slots
 * over the same link, and a promotion that landed would wait for the lease's pins anyway.
 * 0 or -ENOENT (no such lease). */
int engine_release(struct store *s, struct store_owner *o, uint64_t lease_id, uint64_t now);

/* A LOOKUP of any kind: engine_lookup_flags for KV and K_ONLY (base must be 0); for
 * KV_WINDOW and STATE, over the span of keys[0..n) the kind answers with (store_lookup_span;
 * base: keys[0]'s position in the prompt, KV_WINDOW only), extended past the local tiers'
 * answer by the remote tier (engine_remote_span_prepare) unless KVC_LOOKUP_F_LOCAL, the span
 * in memory now with KVC_LOOKUP_F_READY_ONLY. The hits are keys[*first..*first + hits), all
 * of the span or none. Errors as engine_lookup_flags, and -EINVAL (base on another kind). */
int engine_lookup_kind(struct store *s, struct store_owner *o, uint32_t ns_id,
                       const struct kvc_wire_key *keys, uint32_t n, uint32_t base, uint32_t flags,
                       uint64_t now, uint64_t *lease_id, uint32_t *first,
                       struct kvc_wire_loc *locs);

/* Works the arenas down under pressure and ahead of it (after commits, on every tick and
 * disk completion): the GPU pool to its host arenas, quantize-in-place, the disk tier's
 * write-back and demotion, or eviction in policy order. Returns blocks acted on. */
int engine_trim(struct store *s, uint64_t now);
/* Whether room is coming in host arena `arena` without anything more being evicted: quantize
 * jobs in flight there (the precision ladder's steps), or the disk tier writing blocks out
 * (engine_disk_room_coming). A put that found no room may wait for it. */
bool engine_room_coming(struct store *s, uint32_t arena);

/* A victim in one arena's lists: with a disk tier a memory arena gives a clean block first
 * (only its memory goes), then only a leaf the disk would not take; otherwise an unpinned
 * leaf in policy order. Under LRU that order is the cold end's; under any other policy it is
 * exact, the first acceptable leaf of the namespace's heap (store_policy.c), the namespace
 * being that of the coldest evictable leaf. INDEX_NONE when nothing can go now. Evicting
 * (engine_evict) leaves a ghost of the block under a policy other than LRU. */
uint32_t engine_victim(struct store *s, uint32_t arena, int cls, uint64_t now);
/* Frees the room of a victim: a clean block in memory gives up its memory and stays cached
 * on disk; anything else is dropped (counted as evicted). Nothing for a block in motion. */
void engine_evict(struct store *s, uint32_t idx);
/* enum engine_ladder_r: what a step of a namespace's precision ladder did (engine_core.h). */
/* Instead of evicting victim v of host arena `arena`: when v's namespace keeps a precision
 * ladder there, its ladder steps (store_ladder_pick's rung goes one rung down, or its coldest
 * leaf out) until the room coming in the arena covers `need` bytes or a block left. NONE:
 * evict v as without a ladder. engine_alloc and the disk tier's trim both make room so. */
enum engine_ladder_r engine_ladder_evict(struct store *s, uint32_t arena, uint32_t v, uint64_t need,
                                         uint64_t now);
/* A slot of ns's block size in its arena, evicting victims. 0, -ENOSPC (nothing can go:
 * with a disk tier, dirty blocks wait for their write), -errno. */
int engine_alloc(struct store *s, struct store_ns *ns, uint64_t now, struct tier_loc *loc);

/* Evicts unpinned idle leaves, coldest first: of namespace ns_id (0: every one) in arena
 * `arena` (UINT32_MAX: every one, the disk included), until that namespace holds at most
 * keep_bytes (ignored for ns_id 0) or nothing more can go. Counted as flushed (an
 * operator's) or as quota evictions. Blocks in motion are skipped. Returns the number. */
int engine_evict_where(struct store *s, uint32_t ns_id, uint32_t arena, uint64_t keep_bytes,
                       bool flush, uint64_t now);

/* The policy engine for arena a, when namespaces there rank with a policy other than LRU:
 * policy_decide's actions (quantize, offload, drop) on a sample. Returns blocks acted on. */
int engine_policy_trim(struct store *s, uint32_t a, uint64_t now);

/* Host arena `arena` lost [off, off + len) under the daemon's mapping (a client punched a
 * hole in it; see tiers/host.h): the blocks there are evicted, or marked lost (never served
 * again) where they cannot go now. Returns the number of blocks affected. */
uint32_t engine_arena_fault(struct store *s, uint32_t arena, uint64_t off, uint64_t len);

#endif
