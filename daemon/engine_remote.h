/*
 * engine_remote.h — the tier engine: moves blocks between the host arenas and the remote tier
 * (a Redis Cluster shared by the kvcd of several hosts; tiers/remote.h).
 *
 * DESIGN
 * Off unless remote.nodes is set: no thread, no connection, no hook, nothing changes.
 * Write-behind: a committed block in the namespace's raw format (admitted: at commit with
 * remote.min_hits = 0, else when its hits reach that number) goes on a bounded queue of
 * (namespace, key); the engine starts the writes it has room for (remote.max_inflight) after
 * commits and on every tick, pinning the block while the worker reads its slot (a pinned
 * block is never moved, quantized or freed). A full queue or a degraded tier drops the
 * write (counted): the remote tier is a cache. BLOCK_F_REMOTE marks a block the remote tier
 * has (written, or read from it), so it is not written again.
 * Lookup falls through gpu → host → disk → remote: past the local run, each following key
 * not in the negative cache gets a fresh host slot and a block in the index (committed,
 * PROMOTING, so not ready; a lookup's WAIT answers when it lands, as for disk promotions),
 * and a GET of its record goes to the worker. A record that lands must be the block asked
 * for: valid (remote_rec_check), in the raw format of the namespace's block size, and the
 * child of the key before it in the lookup (or of a block the index has, for the first);
 * else it is refused and counted. A block whose GET misses or is refused is LOST: its slot
 * goes back, it lets go of its parent (so a chain of misses unwinds whatever order the
 * replies come in), it leaves the index once nothing hangs from it (so a put of its key can
 * proceed while the lookup's lease still holds the entry) and the pool when that lease
 * goes; its key enters the negative cache (remote.negative_ttl) so that a run of lookups
 * of a prefix nobody stored asks the cluster once.
 * Faults: while the tier is degraded (its circuit breaker open) lookups stop at the local
 * run and writes are dropped; state changes and errors are logged at a limited rate.
 * Namespaces: [namespace.PATTERN] remote = no keeps a namespace out, and one whose section
 * has read or write lists stays out unless it says yes (asked once per namespace, again
 * after a reload). A sealed tier (remote.seal, tiers/remote_seal.h): each namespace's keys
 * are derived when it is first asked for and passed with each read and write; a value that
 * does not open under them is refused (remote_seal_refused) and a miss. Owned by the loop
 * thread.
 */
#ifndef KVC_ENGINE_REMOTE_H
#define KVC_ENGINE_REMOTE_H

#include <stdbool.h>
#include <stdint.h>

#include "client/kvc_proto.h"
#include "tiers/remote.h"

struct store;
struct store_lookup_blocks;

struct engine_remote_params {
    struct tier_remote_config tier;
    uint32_t admit_hits;      /* 0: every raw block at commit */
    uint64_t negative_ttl_ms; /* 0: no negative cache */
    uint32_t queue;           /* blocks waiting for their write at most */
    /* Whether a namespace of this model id and layout descriptor uses the remote tier: 1,
     * with its keys in *seal when the tier is sealed (tier.sealed); 0 when it stays out.
     * NULL: every namespace, unsealed. */
    int (*ns_seal)(void *arg, const char *model_id, const uint8_t ns[REMOTE_REC_NS_BYTES],
                   struct remote_seal *seal);
    void *ns_seal_arg;
};

/* Starts the remote tier's worker. 0 or -errno (logged by the caller). */
int engine_remote_attach(struct store *s, const struct engine_remote_params *p);
/* Stops the worker, finishing what it holds. No remote tier is a no-op. */
void engine_remote_free(struct store *s);
/* Reloadable: admission and the negative cache's time; namespaces are asked again. */
void engine_remote_reload(struct store *s, uint32_t admit_hits, uint64_t negative_ttl_ms);

int engine_remote_fd(const struct store *s);
void engine_remote_poll(struct store *s, uint64_t now);
/* Starts queued writes (after commits, every tick) and logs the tier's state changes. */
void engine_remote_pump(struct store *s, uint64_t now);

/* Called by engine_lookup_flags when the local run of a lookup ends at `hits` < n, with the
 * blocks the lookup found (lb: the run's, and the key it stopped at): starts reads of the
 * following keys from the remote tier and returns the new number of hits (the ones read
 * count, not ready; with KVC_LOOKUP_F_READY_ONLY they are read but not counted). Each key
 * past the run is found in the index once, and its block (or INDEX_NONE) joins lb for the
 * lease. tier[] gets 0 for them (not a local tier). */
uint32_t engine_remote_lookup_prepare(struct store *s, uint16_t ns, const struct kvc_wire_key *keys,
                                      struct store_lookup_blocks *lb, uint32_t hits, uint32_t n,
                                      uint32_t flags, uint64_t now, uint8_t *tier);
/* Called by engine_lookup_kind for a KV_WINDOW or STATE lookup of keys[0..lb->n) (base:
 * keys[0]'s position in the prompt; lb: their blocks as the lookup found them, each key not
 * looked up yet found here once, each read's fresh block put in) whose local answer ends at
 * end < n: the longest prefix e in
 * (end, n] whose span (a window: its blocks, a state: keys[e-1]) has no key known missing
 * (negative cache), lost or being written, and whose keys not here (at least one) the tier
 * can read now, gets those reads into fresh slots (roots, not ready until they land;
 * fetched[i] = 1 for each), and *first, *count become its span: 1. Keys below the span are
 * read too, as many as the keys known missing above it (at most 32): the cluster holds less
 * than the prompt, and a lookup asked again finds them. 0 (the span stays) when there is no
 * such prefix, or the tier is off for the namespace, degraded or busy. */
int engine_remote_span_prepare(struct store *s, uint16_t ns_id, const struct kvc_wire_key *keys,
                               struct store_lookup_blocks *lb, uint32_t base, uint32_t end,
                               uint64_t now, uint32_t *first, uint32_t *count, uint8_t *fetched);
/* After a lookup pinned its hits, idxs[0..hits) (its lease's blocks): admits blocks whose
 * hits reached remote.min_hits. */
void engine_remote_lookup_done(struct store *s, const uint32_t *idxs, uint32_t hits, uint64_t now);

/* Calls put(name, value) for every remote gauge and counter (remote_*). Nothing without a
 * remote tier. */
void engine_remote_stats(const struct store *s,
                         void (*put)(void *arg, const char *name, uint64_t v), void *arg);

#endif
