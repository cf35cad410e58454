/*
 * kvc_fast.h — the fast path's shared memory: a read-only index per host arena and a hit
 * ring per connection. Internal: shared by the daemon (daemon/fast.c) and libkvc.
 *
 * DESIGN
 * A hit through the socket costs a LOOKUP and a RELEASE round trip. The fast path lets a
 * client copy a hit out of an arena with no system call:
 *
 * - The index. The daemon publishes, per host arena, (namespace, key) → (offset, length,
 *   format, generation) of every committed block that sits ready in that arena. It is a
 *   cuckoo hash table: buckets of KVC_FAST_WAYS entries, a key in one of two buckets chosen
 *   by a seeded XXH3 of the key and the namespace (the seed is in the header), and a small
 *   stash behind them for the rare key whose two buckets are full. The daemon sizes it for
 *   every block the arena can hold at the smallest slot its namespaces use (at a load of at
 *   most 0.95, where a cuckoo table of 4-way buckets places every key) and makes room by
 *   moving entries to their other bucket; an entry being moved may be missed for a moment,
 *   which only sends that hit to the socket. Only the daemon writes it; clients map it
 *   read-only (the memfd is mode 0600 and sealed with F_SEAL_FUTURE_WRITE once the daemon
 *   mapped it: no other writable mapping can exist). Each entry is guarded by a sequence
 *   count, odd while the daemon rewrites it: a reader that sees it odd or changed across its
 *   read of the entry reads again.
 * - Growth. When a namespace with smaller blocks comes to an arena, the daemon makes a larger
 *   index (a new memfd), publishes every block there, and marks the old one retired; from
 *   then on it no longer keeps the old one (nor its generations) in step. A reader checks
 *   `retired` after its copy, with the generation, so what it copied through a retired
 *   index is never used; it then maps the new one (FAST_ATTACH INDEX again). Its old mapping
 *   stays valid (the reader unmaps it when it disconnects), so other threads reading through
 *   it never fault.
 * - Slot generations. After the entries, one 32-bit generation per granule of the arena:
 *   gen_units 4 KiB units, the smallest slot the arena's namespaces can take (a block's raw
 *   size or its smallest codec's, rounded to 4 KiB). Slots never overlap and none is
 *   smaller than a granule, so no two start in the same one: the generation of slot at
 *   unit u is gens[u / gen_units], and it costs a block of the smallest slot 4 bytes
 *   whatever its size (one per 4 KiB made a 64 KiB block pay 64). The host tier bumps the
 *   generation of a slot's granule before the slot is freed, so before it can be reused,
 *   and every move or quantization of a block frees its old slot. A reader checks that the
 *   generation equals the entry's before and after it copies; any change means the bytes
 *   it copied may belong to another block, and the copy is a miss (the client falls back
 *   to the socket). Generations only grow, so a granule shared by two slots after all (a
 *   slot smaller than the granule: the daemon then makes a new index of smaller granules
 *   before it publishes one) can only turn a reader's copy into a miss, never a stale copy
 *   into a hit. The daemon publishes an entry only once its bytes are complete (committed,
 *   not being read from disk): a commit's entries after the RESERVE a client sends right
 *   behind it, but before the daemon answers any other request (so after kvc_flush, or any
 *   call with a reply, a client finds its puts through the index); until then those blocks
 *   are hits through the socket.
 * - The hit ring. Hits taken through the index are written by the client into a ring in a
 *   memfd the daemon made for its connection (sealed against resizing) and read by the
 *   daemon a bounded step at a time: a few dozen entries before each request of that
 *   connection, the rest in round-robin passes between requests, and no ring faster than
 *   server.fast_ring_rate entries a second, so the policies see the hits without a round
 *   trip per hit and no client's ring costs the others more than its requests would. The
 *   daemon validates every entry (a namespace the connection opened with read access, a
 *   committed block of that key; its load_us within what the connection could have spent):
 *   a client can only lie about its own hits, boundedly. The daemon writes how far it has
 *   read (tail); a client whose ring is half full, or that disconnects, asks for room
 *   (FAST_ATTACH with KVC_FAST_SYNC): the daemon skips, counted (fast_dropped), the unread
 *   entries its rate does not cover and answers once it has read the rest; once its passes
 *   over the rings have spent their share of its time, it skips the rest too and answers at
 *   once, so that no client waits for the others' rings (the one thread reading them would
 *   otherwise pace every client of the host). Entries are not requests: they keep no
 *   connection from idling out.
 * - The bell. So that a pass costs what the rings with entries cost, not a look at every
 *   connection's ring (a cache miss each, in a page of its own: at 1,024 connections the
 *   loop's largest cost of its own), a client sets its connection's bit in its uid's bell
 *   after it advances its head, unless the daemon has still to read what it wrote before
 *   (kvc_fast_bell_ring), and a pass looks only at the rings whose bits it found set
 *   (clearing them) and at those it has not read empty. The bell is one memfd per
 *   uid (FAST_ATTACH BELL; the bit is in the ring's header), shared only by that uid's
 *   connections, which trust each other already (one can ptrace another): a client that sets
 *   bits at random costs the daemon at most a look at each of its uid's rings, as every pass
 *   cost before; one that clears them delays its own uid's hits until that connection's next
 *   request, its SYNC, or the sweep that looks at every ring every 100 ms. A
 *   connection without a bell (a client that predates it) has its ring looked at every pass.
 */
#ifndef KVC_FAST_H
#define KVC_FAST_H

#include <stdint.h>
#include <string.h>
#include <xxhash.h>

#include "client/kvc_proto.h"

#define KVC_FAST_MAGIC 0x5844494641564b43ull /* "CKVAFIDX" */
#define KVC_FAST_RING_MAGIC 0x474e495241564b43ull
#define KVC_FAST_VERSION 3u /* 3: generations per granule (gen_units), not per 4 KiB */
#define KVC_FAST_WAYS 4u       /* entries per bucket */
#define KVC_FAST_STASH 64u     /* entries behind the buckets, for keys whose buckets are full */
#define KVC_FAST_UNIT_SHIFT 12 /* entries name slots in 4 KiB units of the arena */

/* At offset 0 of an index mapping. Every offset is from the start of the mapping. */
struct kvc_fast_hdr {
    uint64_t magic;
    uint32_t version;
    uint32_t arena_id;
    uint64_t seed;        /* of the bucket hash */
    uint64_t arena_bytes; /* the arena this indexes */
    uint64_t ents_off;    /* struct kvc_fast_ent[nbuckets * KVC_FAST_WAYS + nstash] */
    uint64_t gens_off;    /* uint32_t[kvc_fast_ngens(arena_bytes, gen_units)] */
    uint64_t total;       /* bytes of the mapping */
    uint64_t ns_off;      /* uint64_t[nns]: kvc_fast_layout_id of namespace id i, 0 none */
    uint32_t nns;
    uint32_t nbuckets; /* >= 2 */
    uint32_t ways;     /* KVC_FAST_WAYS */
    uint32_t nstash;   /* KVC_FAST_STASH: entries after the buckets */
    /* Written by the daemon as it goes (read by clients, never by the daemon): */
    uint32_t stash_used; /* nonzero: the stash may hold entries (look there after a miss) */
    uint32_t retired;    /* nonzero: a newer index replaced this one (see Growth above) */
    /* Bytes from the arena's start the daemon has faulted in (all of it once its fault-in is
     * over, or without one), updated about once a second: a client pins (registers with a
     * device) only that part, so the pinning neither faults pages in at 4 KiB ahead of the
     * daemon's collapse nor makes the client's call wait for the rest. 0: not said (an index
     * from before the field: the bytes up to ns_off were zeros), pin the whole arena. */
    uint64_t faulted;
    uint32_t gen_units; /* 4 KiB units per generation (>= 1): slot at unit u has gens[u / it] */
    uint32_t pad0;
};
/* faulted came into bytes every index already had, zeroed (same version); gen_units changed
 * what gens_off holds: version 3. */
_Static_assert(sizeof(struct kvc_fast_hdr) <= 128, "fast index header within its first 128 B");

/* Generations an index of an arena of arena_bytes keeps at gen_units units each. */
static inline uint64_t kvc_fast_ngens(uint64_t arena_bytes, uint32_t gen_units)
{
    uint64_t units = (arena_bytes + (1u << KVC_FAST_UNIT_SHIFT) - 1) >> KVC_FAST_UNIT_SHIFT;
    return gen_units ? (units + gen_units - 1) / gen_units : 0;
}

/* One published block. klo = khi = 0: empty (no key is all zero). */
struct kvc_fast_ent {
    uint16_t seq; /* odd while the daemon rewrites the entry */
    uint16_t ns;
    uint32_t gen; /* its slot's generation when published */
    uint64_t klo, khi;
    uint32_t unit; /* offset in the arena >> KVC_FAST_UNIT_SHIFT (slots start on a unit) */
    uint32_t fmt;  /* KVC_WIRE_FORMAT_* in the low 8 bits; quantized: the slot's units above */
};
_Static_assert(sizeof(struct kvc_fast_ent) == 32, "fast index entry layout");
#define KVC_FAST_FMT(format, units) ((uint32_t)(format) | (uint32_t)(units) << 8)
#define KVC_FAST_FMT_FORMAT(fmt) ((fmt)&0xffu)
#define KVC_FAST_FMT_UNITS(fmt) ((fmt) >> 8)

/* The hit ring: a client writes ents[head % nents], then advances head (release); the
 * daemon reads up to head and stores tail. */
struct kvc_fast_hit {
    uint32_t ns;
    uint32_t block; /* a hint of the daemon's block index, or UINT32_MAX (it finds the key) */
    uint64_t klo, khi;
    uint16_t pos;     /* position of the key in its request (< KVC_LEASE_MAX_CHUNKS * 2048) */
    uint16_t nkeys;   /* on a request's first hit: the keys it served (a lookup); else 0 */
    uint32_t load_us; /* on a request's first hit: microseconds its copies took */
};
_Static_assert(sizeof(struct kvc_fast_hit) == 32, "fast ring entry layout");
struct kvc_fast_ring {
    uint64_t magic;
    uint32_t nents; /* a power of two */
    uint32_t bell;  /* the connection's bit in its uid's bell, once FAST_ATTACH BELL gave it */
    uint64_t head;  /* written by the client */
    uint64_t tail;  /* written by the daemon */
    uint64_t lost;  /* hits the client could not record (ring full, no drain) */
    uint64_t pad2[3];
    /* struct kvc_fast_hit ents[nents]; */
};
_Static_assert(sizeof(struct kvc_fast_ring) == 64, "fast ring header layout");
#define KVC_FAST_RING_ENTS 4096u

/* The bell: KVC_FAST_BELL_BITS bits, 64 to a word (bit b in word b / 64, 1 << b % 64), one per
 * connection of the uid that maps it (server.max_clients is at most that many). */
#define KVC_FAST_BELL_BITS 65536u
#define KVC_FAST_BELL_BYTES (KVC_FAST_BELL_BITS / 8u)

/* After ring r's head moved on from `was` (stored): sets the connection's bit unless the
 * daemon has still to read entries written before `was` (it looks at the ring until it has
 * read it empty) or the bit is set already. Most calls of a busy client stop at the first
 * test, without touching the bell, which the uid's other connections write too. The fence
 * orders the head before the looks at tail and bit, as the daemon's fences order its store
 * of tail and its clear of the bit before its look at the head: of each pair, one side sees
 * the other's store, so a ring the daemon read empty and stopped looking at has its bit
 * set again. */
static inline void kvc_fast_bell_ring(const struct kvc_fast_ring *r, uint64_t was, uint64_t *bell,
                                      uint32_t bit)
{
    uint64_t *w = bell + bit / 64, m = 1ull << (bit % 64);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&r->tail, __ATOMIC_RELAXED) != was)
        return;
    if (!(__atomic_load_n(w, __ATOMIC_RELAXED) & m))
        __atomic_fetch_or(w, m, __ATOMIC_RELAXED);
}

/* FAST_ATTACH: what = INDEX: arena_id's index (a read-only descriptor), for a connection
 * that holds that arena; RING: the connection's hit ring (read-write, made on the first
 * call); SYNC: answered once the connection's ring has been read, past what its rate
 * covers skipped (no descriptor); BELL (from a daemon whose HELLO says
 * KVC_HELLO_F_FAST_BELL, after RING): the bell of the connection's uid (read-write), its bit
 * written in the ring's header. */
#define KVC_FAST_INDEX 1u
#define KVC_FAST_RING 2u
#define KVC_FAST_SYNC 3u
#define KVC_FAST_BELL 4u
struct kvc_fast_attach_req {
    uint32_t what;
    uint32_t arena_id;
};
struct kvc_fast_attach_rep {
    uint64_t bytes; /* of the mapping whose descriptor is attached; 0 for SYNC */
    uint32_t what;
    uint32_t arena_id;
};

/* What the index's namespace table holds for a namespace: a hash of its model and shape
 * (the codec flags left out: a later opener may pass 0). Never 0. */
static inline uint64_t kvc_fast_layout_id(const struct kvc_wire_layout *l)
{
    struct kvc_wire_layout c;
    memset(&c, 0, sizeof(c));
    memcpy(c.model_id, l->model_id, sizeof(c.model_id));
    c.layers = l->layers;
    c.kv_heads = l->kv_heads;
    c.head_dim = l->head_dim;
    c.block_tokens = l->block_tokens;
    c.dtype = l->dtype;
    c.kv_kind = l->kv_kind;
    c.window_tokens = l->window_tokens;
    uint64_t h = XXH3_64bits(&c, sizeof(c));
    return h ? h : 1;
}

/* The two buckets of (ns, key), never the same: a seeded XXH3 of the two key words and the
 * namespace, each half mapped onto [0, nbuckets) by a multiply (nbuckets >= 2). */
static inline void kvc_fast_buckets(uint64_t seed, uint32_t nbuckets, uint32_t ns, uint64_t lo,
                                    uint64_t hi, uint32_t *b1, uint32_t *b2)
{
    uint64_t in[3] = {lo, hi, ns};
    uint64_t h = XXH3_64bits_withSeed(in, sizeof(in), seed);
    *b1 = (uint32_t)(((h & 0xffffffffu) * nbuckets) >> 32);
    *b2 = (uint32_t)(((h >> 32) * (nbuckets - 1)) >> 32);
    if (*b2 >= *b1)
        (*b2)++; /* uniform over the other nbuckets - 1 */
}

#endif
