/*
 * fast.h — the daemon's side of the fast path (client/kvc_fast.h): the shared index of one
 * host arena, a connection's hit ring, and the bell of a uid's rings.
 *
 * DESIGN
 * The index lives in a memfd of mode 0600, mapped read-write by the daemon and then sealed
 * against any other writable mapping (F_SEAL_FUTURE_WRITE), handed out read-only; nothing
 * the daemon relies on is read back from its header (fast.c keeps its own copies).
 * The store keeps it in step with its blocks (store_fast_sync): a block is published when
 * it is committed and ready in a host arena, taken out when it leaves. The slot
 * generations after the entries (one per granule of the arena's smallest slot) are bumped by
 * the host tier when it frees a slot (tier_host_gens_set), which is what makes a stale entry
 * harmless: a reader checks them
 * around its copy. The table is a cuckoo hash with a stash (client/kvc_fast.h), sized by
 * the store for every block its arena can hold (fast_index_capacity); a key that finds no
 * room even so (keys chosen to collide) is left unpublished, counted: its hits take the
 * socket. A larger index replaces a smaller one whole (store_fast_resize): the old one is
 * retired (fast_index_retire) and freed, its readers move. Owned by the loop thread;
 * readers in other processes never block it.
 */
#ifndef KVC_FAST_DAEMON_H
#define KVC_FAST_DAEMON_H

#include <stdbool.h>
#include <stdint.h>

#include "client/kvc_fast.h"
#include "client/kvc_proto.h"

struct fast_index;

struct fast_index_stats {
    uint64_t published; /* entries in use */
    uint64_t full;      /* publications refused: no room in the key's buckets nor the stash */
    uint64_t stash;     /* entries in the stash now */
    uint64_t moves;     /* entries moved to their other bucket to make room */
};

/* The load a table is sized for (every block its arena can hold): a 4-way cuckoo table
 * places every key up to about 0.97, and the watermarks keep an arena below full. */
#define FAST_INDEX_LOAD 0.95

/* An index for arena arena_id of arena_bytes, with room for namespace ids below nns and
 * `capacity` blocks (at FAST_INDEX_LOAD), a slot generation per gen_units 4 KiB units (>= 1:
 * the smallest slot the arena can hand out, so that no two slots share one); with collapse,
 * on 2 MiB pages where the host gives shared memory none (client/kvc_huge.h). NULL and
 * *err = -errno on failure. */
struct fast_index *fast_index_new(uint32_t arena_id, uint64_t arena_bytes, uint32_t nns,
                                  uint64_t capacity, uint32_t gen_units, bool collapse, int *err);
/* The blocks it was sized for. */
uint64_t fast_index_capacity(const struct fast_index *fi);
/* Tells its readers how many bytes from the arena's start are faulted in (kvc_fast_hdr). */
void fast_index_faulted_set(struct fast_index *fi, uint64_t bytes);
/* Tells its readers that a newer index replaced it (they check after every copy). */
void fast_index_retire(struct fast_index *fi);
void fast_index_free(struct fast_index *fi); /* NULL is a no-op */
/* The slot generations, for the host tier to bump (a slot at unit u has gens[u / gen_units]),
 * and the units each covers. */
uint32_t *fast_index_gens(struct fast_index *fi);
uint32_t fast_index_gen_units(const struct fast_index *fi);
/* A new read-only descriptor of the index (the caller closes it), or -errno. */
int fast_index_fd_ro(const struct fast_index *fi);
uint64_t fast_index_bytes(const struct fast_index *fi);
void fast_index_stats_get(const struct fast_index *fi, struct fast_index_stats *st);
/* Whether a publication ever found no room (stats' full): until then every block published
 * has its entry, so republishing an unchanged block (a touch) would find it as it is. */
bool fast_index_lost_any(const struct fast_index *fi);

/* Publishes (or updates) the block of namespace ns under key k at off, stored in format in a
 * slot of len bytes; its generation is the slot's now. */
void fast_publish(struct fast_index *fi, uint16_t ns, const struct kvc_wire_key *k, uint64_t off,
                  uint64_t len, uint8_t format);
/* Asks for the cache lines a publication or removal of (ns, k) at off will touch, so that a
 * batch's misses overlap: in a large index each of them is a cache miss. */
void fast_prefetch(struct fast_index *fi, uint16_t ns, const struct kvc_wire_key *k, uint64_t off);
/* Takes (ns, k) out of the index; nothing if it is not there. */
void fast_unpublish(struct fast_index *fi, uint16_t ns, const struct kvc_wire_key *k);
/* Namespace id ns now holds layout l (NULL: none), so a client that opened another one under
 * the same id never reads it through the index. */
void fast_ns_set(struct fast_index *fi, uint32_t ns, const struct kvc_wire_layout *l);

struct fast_ring;
/* A new ring; *fd its read-write descriptor (the caller sends it; it stays the ring's). */
struct fast_ring *fast_ring_new(int *fd, int *err);
void fast_ring_free(struct fast_ring *r); /* NULL is a no-op */
/* The ring's allowance: how many entries may still be read from it. It grows by `rate` a
 * second (fast_ring_refill, at most a ring's worth banked; a new ring starts full) and each
 * entry read takes one. */
void fast_ring_refill(struct fast_ring *r, uint64_t now_ms, uint32_t rate);
uint32_t fast_ring_allowance(const struct fast_ring *r);
/* Entries written and not read yet as the client's head says (at most a ring's worth; a
 * head moved backwards counts 1, for fast_ring_take to find): for scheduling only. */
uint32_t fast_ring_unread(const struct fast_ring *r);
/* Copies the unread entries, at most max and at most the allowance, into out and marks them
 * read. Entries the client overwrote before they were read are skipped, and *lied says the
 * client's head had moved more than a ring's worth ahead or backwards. */
uint32_t fast_ring_take(struct fast_ring *r, struct kvc_fast_hit *out, uint32_t max, bool *lied);
/* Marks read, unseen, the unread entries beyond the newest `keep` and beyond what the
 * allowance covers (the oldest go): how many. The client asks for room (FAST_ATTACH SYNC)
 * when half its ring is unread; keep = 0 empties it. */
uint32_t fast_ring_shed(struct fast_ring *r, uint32_t keep, bool *lied);
/* Writes the connection's bit in its uid's bell into the ring's header, for the client. */
void fast_ring_bell_set(struct fast_ring *r, uint32_t bit);

/* A uid's bell (client/kvc_fast.h): KVC_FAST_BELL_BITS bits in a memfd the uid's connections
 * map read-write, one per connection that asked for one; a client sets its bit after it
 * writes to its ring. Nothing read from it is trusted beyond "look at this ring": a bit no
 * connection holds is ignored, and the words past the highest bit given out are never read. */
struct fast_bell;
struct fast_bell *fast_bell_new(int *err); /* NULL and *err = -errno on failure */
void fast_bell_free(struct fast_bell *b);  /* NULL is a no-op */
/* Its read-write descriptor (it stays the bell's) and the bytes to map. */
int fast_bell_fd(const struct fast_bell *b);
uint64_t fast_bell_bytes(const struct fast_bell *b);
/* The lowest free bit, now owner's (cleared), or -ENOSPC / -ENOMEM. */
int fast_bell_bit_take(struct fast_bell *b, void *owner);
/* Gives bit back (cleared); its owner is no longer called. */
void fast_bell_bit_put(struct fast_bell *b, uint32_t bit);
/* Clears every bit set since the last call and calls fn(owner, arg) for each one that has an
 * owner. The caller reads the rings after a fence (fast_bell_fence) once all its bells are
 * collected: a client that sets its bit after that clear wrote its head before it, or sees
 * the bit clear and sets it again. */
void fast_bell_collect(struct fast_bell *b, void (*fn)(void *owner, void *arg), void *arg);
void fast_bell_fence(void);

#endif
