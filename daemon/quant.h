/*
 * quant.h — quantize-in-place: a worker thread encodes committed raw blocks into smaller
 * slots of the same arena (the mechanism; when to use it belongs to the eviction policy).
 * The design is at the top of quant.c.
 */
#ifndef KVC_QUANT_H
#define KVC_QUANT_H

#include <stdint.h>

struct loop;
struct quant;
struct store;
struct store_ns;

/* Jobs queued at once by the pressure trigger when the store's params do not say. */
#define QUANT_INFLIGHT_DEFAULT 8
/* Encoding threads: at most QUANT_THREADS_MAX; host.quantize_threads = 0 takes one per
 * online CPU, at most QUANT_THREADS_AUTO. */
#define QUANT_THREADS_MAX 16
#define QUANT_THREADS_AUTO 4
/* The threads quant_new starts for host.quantize_threads = want. */
uint32_t quant_threads(uint32_t want);
/* The encoding threads q runs. */
uint32_t quant_nthreads(const struct quant *q);

/* Starts the worker and attaches it to the store (s->quant). With a loop, completions come
 * back through an eventfd the loop watches; without one (tests) quant_drain() applies them.
 * NULL and *err = -errno on failure. */
struct quant *quant_new(struct loop *l, struct store *s, int *err);
/* Waits for the jobs in flight, applies them, stops the worker, detaches. NULL: no-op. */
void quant_free(struct quant *q);

/*
 * Queues block `idx` for quantization into its namespace's recipe. Loop thread. The block is
 * pinned until the result is applied; the encoded slot is allocated now.
 * 0 queued; -ENOENT no such committed block; -EALREADY not raw, or queued already;
 * -EBUSY pinned (a client may be reading it); -EPERM its namespace allows no codec;
 * -ENOSPC no room for the encoded slot; -ENODEV no worker (quant_new not called);
 * -EBUSY also for a block not in a host arena, or moving to or from disk.
 */
int store_quantize(struct store *s, uint32_t idx);
/* The same into `format` (one of the namespace's allowed codecs, smaller than what the block
 * holds now): a raw block is encoded, a lossy one decoded and encoded again on the worker.
 * -EPERM for a format the namespace does not allow, -ENOSPC when it would not be smaller or
 * no slot is free for it, the others as store_quantize. */
int store_quantize_to(struct store *s, uint32_t idx, uint8_t format);
/* The same when no slot of the smaller size is free now: the worker encodes into private
 * memory and the slot is taken when the job lands (jobs land in the order they were queued,
 * so one queued after a job that frees such a slot finds it); if none is free then, the
 * block stays as it was (counted as ladder_missed). */
int store_quantize_later(struct store *s, uint32_t idx, uint8_t format);
/* Every block of one slab, idx[0..n), into `format` at once, when no slot of the smaller
 * size is free: the worker encodes into private memory; once the last is done, if the blocks
 * are still the jobs' alone and the slab holds nothing else, the raw slots are freed (the
 * slab's pages go back to the arena) and each block gets its smaller slot. How the ladder
 * moves memory from one size to another (a slab allocator's pages stay with their size
 * otherwise). All or nothing at queue time; the errors as store_quantize_to. */
int store_quantize_slab(struct store *s, const uint32_t *idx, uint32_t n, uint8_t format);

/* Pressure trigger, called by engine_trim() before it evicts: for every arena above its high
 * watermark, queues the coldest unpinned raw blocks of namespaces that allow a codec until
 * the arena would be at its low watermark once they are done, or `inflight` jobs of that arena
 * are queued.
 * A block whose encoded slot finds no room (every page of the arena cut for other sizes, as
 * a full arena of raw blocks has them) is handed to no_room when given, which may step its
 * whole slab down (engine.c: the slab empties and its pages take the smaller slots) and
 * returns the jobs it queued; after QUANT_NO_ROOM_TRIES such blocks of a namespace the walk
 * passes over that namespace's other blocks (they would find no room either; another
 * namespace's slot size may). Returns the number queued. */
int quant_pressure(struct quant *q, uint64_t now, int (*no_room)(struct store *s, uint32_t idx));

/* Bytes the queued jobs will free in arena a (their raw slots). */
uint64_t quant_pending_bytes(const struct quant *q, uint32_t arena);

/* Applies the results that are ready (the loop's eventfd handler does this). Returns the
 * number applied. */
int quant_poll(struct quant *q);
/* Waits until no job is in flight, applying results. Returns the number applied. */
int quant_drain(struct quant *q);

/* Key summary of quantized block idx from its encode pass: mean key L2 norm over layers and
 * heads, largest |key| (bf16 precision). 0, or -ENOENT (no such quantized block). */
int quant_key_summary(const struct quant *q, uint32_t idx, float *norm, float *absmax);

/* Jobs queued and not yet applied. */
uint32_t quant_inflight(const struct quant *q);
/* Those of host arena `arena`: what store_params.quantize_inflight bounds. The worker serves
 * every arena, and arenas are the tenants' (daemon/acl.c): with one bound for all of them, a
 * tenant that kept its own arena's jobs at the bound kept every other arena's precision
 * ladder from stepping (its puts answered NOSPACE). */
uint32_t quant_inflight_in(const struct quant *q, uint32_t arena);

#endif
