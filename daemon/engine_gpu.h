/*
 * engine_gpu.h — the tier engine: moves blocks between the host arenas and the GPU pool,
 * off the loop thread's critical path.
 *
 * DESIGN
 * A move never waits for its copy. It takes a slot on the other side, queues the copy on
 * the gpu tier's private stream (tiers/gpu.h: an event is recorded after it) and returns;
 * the loop completes it when the tier says the copy has landed (engine_gpu_poll, called
 * when tier_gpu_fd() is readable; engine_gpu_refresh on every tick and trim through
 * engine_trim, and before lookups).
 * The host arenas are registered with the device once (store.c), so the copies are DMA
 * from and into locked pages and the host thread is not held for them either; an arena
 * that cannot be registered is logged once and copied through pageable memory (the driver
 * stages it: correct, but the call itself then lasts about as long as the copy).
 * Until a move completes the block is BLOCK_F_GPU_MOVING (part of BLOCK_F_BUSY), so no path
 * frees, evicts, quantizes, writes back, flushes or drops it (store_block_idle), and its
 * source slot is never freed or reused under the copy:
 * - Promotion (host → pool; the release of a pool-mapped client's lease that hit the block,
 *   engine_release: not at its lookup, when that client is about to copy the same bytes over
 *   the same link): the block stays where it is, readable and ready in its host slot, and
 *   lookups keep getting that slot. When the copy has landed and nothing pins the block, it
 *   switches to the pool slot and its host slot goes (its generation bumped: the fast path
 *   sees the move); while it is pinned (another lease) it waits, the pool slot held, and
 *   switches at a later poll once the pins are gone.
 * - Demotion (pool → host; the trim above the pool's high watermark, or the lookup of a
 *   client that cannot read the pool): the block switches at once to its new host slot,
 *   marked PROMOTING, so a lookup names that slot not ready and WAIT answers when the copy
 *   has landed (as for a read from disk); the pool slot stays until then.
 * A failed copy leaves the block where it was and frees the destination (logged at a
 * limited rate, counted as gpu_move_failures). For a demotion whose not-ready slot leases
 * hold, the block reads as LOST to them (WAIT stops there: the client drops it from its
 * hits, as for a failed disk read) and goes back to the pool once unpinned. A block whose
 * host page is lost under a copy (engine_arena_fault marks it LOST) is treated the same way:
 * a demotion goes back to the pool, a promotion is dropped (its source is gone).
 * At most ENGINE_GPU_INFLIGHT moves are in flight; beyond, lookups serve blocks where they
 * are (a client that cannot read the pool is answered the prefix up to there, or its lookup
 * waits for moves to land, ENGINE_LOOKUP_F_DEFER_MOVES, and starts the next ones as slots
 * free) and the trim waits for the next round. engine_gpu_stop waits for the copies in flight
 * (the one wait on the loop thread, at shutdown) and settles every move before the arenas
 * they touch go. Owned by the loop thread.
 */
#ifndef KVC_ENGINE_GPU_H
#define KVC_ENGINE_GPU_H

#include <stdbool.h>
#include <stdint.h>

struct store;
struct tier_loc;

#define ENGINE_GPU_INFLIGHT 64

/* A slot in the pool if it stays at or below the high watermark (the pool never evicts to
 * make room: it demotes in engine_trim). 0, -ENODEV (no pool), -ENOSPC. */
int engine_gpu_alloc(struct store *s, uint64_t len, struct tier_loc *loc);

/* Starts moving an unpinned, idle, raw committed block between its namespace's host arena
 * and the pool (to_gpu: into the pool). 0 when the move started (a demotion has switched
 * the block to its host slot, not ready); -EBUSY (the block cannot move now), -EAGAIN
 * (ENGINE_GPU_INFLIGHT moves in flight), -ENOSPC (no room on the other side), -errno; the
 * block is unchanged on failure. */
int engine_gpu_move(struct store *s, uint32_t idx, bool to_gpu, uint64_t now);

/* Whether copies between the pool and the host arenas are in flight: their landing frees
 * move slots and runs the loop's handler of engine_gpu_fd (where waiting requests are asked
 * again). false without a pool. */
bool engine_gpu_landing(const struct store *s);

/* The moves started since the pool's first, out of it or into it (a running count: a
 * caller compares two readings to learn whether moves started in between). 0 without one. */
uint64_t engine_gpu_moves_started(const struct store *s);

/* Demotes the pool's blocks in policy order towards the low watermark (counting the bytes
 * of demotions in flight as gone). A block that cannot start moving is evicted if it is a
 * leaf or clean. Returns the blocks acted on. */
int engine_gpu_demote(struct store *s, uint64_t now);

/* Completes the moves whose copies have landed, and those that waited for their pins to
 * go. Never waits. Answers WAITs (store.on_ready) when a demotion landed: the loop's handler
 * of engine_gpu_fd calls it. engine_gpu_refresh does the same from inside other work (a
 * lookup, a trim, which may run within a request): it leaves the WAITs to that handler,
 * making the descriptor readable for it. */
void engine_gpu_poll(struct store *s, uint64_t now);
void engine_gpu_refresh(struct store *s);
/* The descriptor the loop watches (tier_gpu_fd), or -1 without a pool. */
int engine_gpu_fd(const struct store *s);
/* Waits for the copies in flight and settles every move (pins are ignored: the daemon is
 * stopping). Before the store and its arenas go. No pool is a no-op. */
void engine_gpu_stop(struct store *s);

/* Calls put(name, value) for the pool moves' gauges and counters: gpu_moves_inflight,
 * gpu_moves_waiting (landed, waiting for pins), gpu_move_waits (waits for a copy on the loop
 * thread), gpu_move_queries, gpu_arenas_registered (host arenas registered whole),
 * gpu_host_registered_bytes, gpu_host_register_pending_bytes (waiting for the fault-in:
 * daemon/gpu_reg.h). Nothing without a pool. */
void engine_gpu_stats(const struct store *s, void (*put)(void *arg, const char *name, uint64_t v),
                      void *arg);

#endif
