/*
 * libkvc_internal.h — libkvc's private structures. Not installed.
 */
#ifndef KVC_LIBKVC_INTERNAL_H
#define KVC_LIBKVC_INTERNAL_H

#include <endian.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/kvc.h"
#include "client/kvc_proto.h"

#define KVC_MAX_ARENAS 16

#define KVC_GPU_WORK_STREAMS 4

/* Device work queued on a lease or reservation (libkvc_gpu.c); all zero while there is none.
 * One event per stream the work went to, recorded again after each call on that stream (the
 * latest record covers the earlier work: stream order), so calls queue one after another
 * without waiting; the device scratch that work reads, borrowed from the client's pool; and
 * the first error a call met after queueing (a wait it could not avoid), kept for the
 * release or commit. Changed under the client's mutex. */
struct kvc_gpu_work {
    void *ev[KVC_GPU_WORK_STREAMS];
    void *stream[KVC_GPU_WORK_STREAMS];
    uint32_t nev;
    int err;
    void *scratch; /* struct kvc_gpu_scratch list, borrowed until the events are waited for */
};

/* Set by kvc_gpu_attach() (libkvc_gpu.c) so that a program that never calls the GPU API
 * links no CUDA code: libkvc.c reaches it only through these. */
struct kvc_arena;

struct kvc_gpu_hooks {
    /* Waits for every event of a lease's or reservation's queued device work, gives its
     * scratch and events back to the client's pools and clears it; the work's first error
     * (a faulted copy or kernel), which the caller must not publish over. Takes the client's
     * mutex itself: call it without. */
    int (*wait)(kvc_client *c, struct kvc_gpu_work *w);
    /* Copies len bytes (any pair of host/device pointers); they have landed on return. */
    int (*copy_sync)(kvc_client *c, void *dst, const void *src, uint64_t len);
    /* Queues the copy of raw hit i into dst (kind: enum kern_dev_copy) on stream, tracked
     * on the lease so that kvc_release() waits for it. */
    int (*lease_copy)(kvc_lease *l, size_t i, void *dst, int kind, void *stream);
    /* Queues quantized host hit i, dequantized, into device memory dst on stream: its stored
     * bytes cross to a pooled device scratch and a kernel decodes them there; tracked on the
     * lease like lease_copy (no allocation, free or wait once the pool has grown). */
    int (*lease_decode)(kvc_lease *l, size_t i, void *dst, void *stream);
    /* Registers arena a, mapped after the attach (a namespace opened since), for DMA as the
     * attach registered the ones mapped before it. Caller holds c->mu. */
    void (*arena_mapped)(kvc_client *c, struct kvc_arena *a);
    /* Unmaps the pool and unregisters the arenas (kvc_disconnect). */
    void (*fini)(kvc_client *c);
};

struct kvc_arena {
    uint8_t *base; /* mapping, or NULL */
    uint64_t size;
    bool writable;
};

/* An arena's shared index as this client maps it (libkvc_fast.c). state: 0 not tried, 1
 * mapped (the fields are set before state, which is read with acquire), -1 not available. */
/* One mapped index of an arena; never changed once published in kvc_fastmap.view, and never
 * unmapped before kvc_disconnect, so a reader that loaded the pointer may use it for as long
 * as its call lasts. */
struct kvc_fastview {
    const uint8_t *map;
    uint64_t bytes;
    const struct kvc_fast_hdr *hdr;
    uint64_t seed;
    uint32_t nbuckets, nns;
    uint64_t units;
    uint32_t gen_units; /* the header's, checked nonzero and its gens within the mapping */
    const uint64_t *nslay;
    const struct kvc_fast_ent *ents;  /* the buckets */
    const struct kvc_fast_ent *stash; /* KVC_FAST_STASH entries */
    const uint32_t *gens;
    struct kvc_fastview *older; /* the views this one replaced (their index was retired) */
};
struct kvc_fastmap {
    int state;                 /* 0 not tried yet, 1 view mapped, -1 off for this arena */
    struct kvc_fastview *view; /* the latest index, read with acquire without mu */
};

/* A request sent without waiting for its reply (kvc_put_prefix's COMMIT). */
#define KVC_DEFER_MAX 16
struct kvc_defer {
    uint32_t req_id;
    uint16_t op;
    bool quiet;      /* the daemon answers only a failure */
    uint32_t expect; /* COMMIT: the blocks its reply must say were committed */
    uint64_t tag;    /* the kvc_put_prefix call that sent it (kvc_client.put_calls) */
};

struct kvc_client {
    int fd;
    pthread_mutex_t mu; /* serialises round trips and the structures below */
    uint32_t next_req;
    bool dead;
    uint32_t daemon_pid, uid, gid, conn_id;
    uint16_t features; /* the daemon's, from HELLO (KVC_HELLO_F_*) */
    struct kvc_arena arenas[KVC_MAX_ARENAS];
    struct kvc_ns *ns; /* list of open namespaces, owned */
    uint64_t *tx;      /* request buffer, KVC_PROTO_MAX_MSG bytes */
    uint64_t *rx;      /* reply buffer */
    /* Requests in flight whose replies no call waits for, oldest first: the daemon answers a
     * connection in order, so the next call that reads the socket reads them first. The
     * first failure among them is kept (err, and the put call and blocks it concerned) until
     * kvc_put_prefix() or kvc_flush() reports it. All under mu. */
    struct kvc_defer defer[KVC_DEFER_MAX];
    uint32_t ndefer;
    int defer_err;
    uint64_t defer_err_tag;
    uint32_t defer_err_blocks;
    uint64_t put_calls;
    /* GPU state (libkvc_gpu.c), all zero until kvc_gpu_attach() */
    const struct kvc_gpu_hooks *gpu_hooks;
    void *gpu; /* struct kvc_gpu, owned */
    uint32_t gpu_arena;
    uint8_t *gpu_base; /* this process's mapping of the pool (a device address) */
    uint64_t gpu_size;
    /* The fast path (libkvc_fast.c): off by KVC_NO_FASTPATH=1 or when the daemon has none. */
    bool fast_off;
    struct kvc_fastmap fast[KVC_MAX_ARENAS];
    struct kvc_fast_ring *ring; /* the hit ring, written under mu */
    uint64_t ring_bytes;
    uint64_t *bell;    /* its uid's bell (a daemon with KVC_HELLO_F_FAST_BELL), or NULL */
    uint32_t bell_bit; /* the ring's bit in it */
};

struct kvc_ns {
    kvc_client *c;
    uint32_t id;
    uint32_t arena;
    uint64_t block_bytes;
    uint32_t block_tokens;
    uint64_t salt;
    uint64_t fast_lay; /* kvc_fast_layout_id of layout: checked against the index's table */
    struct kvc_wire_layout layout;
    struct kvc_ns *next;
};

struct kvc_hit {
    const uint8_t *data;
    uint64_t len;   /* raw: the block size; quantized: the slot (>= the encoded size) */
    uint8_t format; /* KVC_WIRE_FORMAT_* */
    uint32_t chunk; /* index into kvc_lease.ids of the lease holding it */
    bool ready;     /* in memory now (else being read from disk: WAIT) */
    uint8_t tier;   /* KVC_WIRE_TIER_*: data is a device pointer for GPU */
};

struct kvc_lease {
    kvc_ns *ns;
    uint64_t load_ns; /* time spent copying hits out, reported at release */
    size_t first;     /* position in the looked-up keys of hit 0 (KV_WINDOW, STATE) */
    size_t n;
    size_t nids;
    uint64_t ids[8];         /* one per chunk of KVC_PROTO_MAX_KEYS */
    struct kvc_gpu_work gpu; /* device work queued on this lease; waited for before release */
    struct kvc_hit hits[];   /* n */
};

struct kvc_resv {
    kvc_ns *ns;
    uint64_t id; /* 0: nothing reserved */
    size_t n;
    size_t nreserved;
    struct kvc_gpu_work gpu; /* device work queued here; waited for before commit/abort */
    /* Layers written per slot, once a gather wrote only some layers of a slot: n bitmaps of
     * layer_words words (kvci_resv_layers_mark). NULL until then. Under the client's mutex. */
    uint64_t *layer_bits;
    uint32_t layer_words;
    struct {
        uint8_t status;
        uint8_t tier; /* KVC_WIRE_TIER_* of data */
        uint8_t *data;
    } slots[]; /* n */
};

/* One round trip: request in c->tx (payload of len bytes), reply in c->rx. The reply status
 * or a transport error. Caller holds c->mu. (kvci_: kept out of the kvc_* exports.) */
int kvci_call(kvc_client *c, uint16_t op, uint32_t len, int *fd);
/* The longest lookup: this many chunks of KVC_PROTO_MAX_KEYS keys (one lease id each). */
#define KVC_LEASE_MAX_CHUNKS 8
/* Requests sent without waiting for their replies (libkvc.c's DESIGN), c->mu held:
 * kvci_defer_room makes room for one more before the caller builds it in c->tx;
 * kvci_send_nowait sends it (quiet: the daemon answers only a failure; expect: the blocks a
 * COMMIT's reply must say were committed; tag: the kvc_put_prefix call); kvci_defer_drain
 * reads the replies that have come (wait: all of them); kvci_defer_settle settles every
 * one (a SYNC after a quiet last). 0 or the error that ended the connection. */
int kvci_defer_room(kvc_client *c);
int kvci_send_nowait(kvc_client *c, uint16_t op, uint32_t len, bool quiet, uint32_t expect,
                     uint64_t tag);
int kvci_defer_drain(kvc_client *c, bool wait);
int kvci_defer_settle(kvc_client *c);
/* A daemon location as a pointer into this client's mapping of its arena (or the GPU pool),
 * after checking the block lies inside it; NULL when it does not. */
uint8_t *kvci_loc_ptr(const kvc_ns *ns, const struct kvc_wire_loc *l);
/* The request payload buffer, and the reply payload with its length (libkvc_gpu.c). */
void *kvci_req(kvc_client *c);
const void *kvci_rep(const kvc_client *c, uint32_t *len);
/* Records that layers [lf, lf+lc) of the reserved slots among [first, first+n) were written
 * (a whole slot: lf 0, lc all). Bitmaps start at the first partial write. 0 or -ENOMEM. */
int kvci_resv_layers_mark(kvc_resv *r, size_t first, size_t n, uint32_t lf, uint32_t lc);
/* kvc_reserve with RESERVE flags (KVC_RESERVE_F_GPU). */
int kvci_reserve_flags(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                       size_t n, uint32_t flags, kvc_resv **out);
/* Tests install a fake device table here before kvc_gpu_attach() (NULL: the build's own). */
struct kern_dev_ops;
void kvci_gpu_ops_set(const struct kern_dev_ops *ops);
const struct kern_dev_ops *kvci_gpu_ops_get(void);
/* Tests set the most device scratch a GPU call stages through at once (bytes; 0: the
 * default, KVC_GPU_STAGE_CAP in libkvc_gpu.c), read at kvc_gpu_attach(). */
void kvci_gpu_stage_cap_set(uint64_t bytes);
/* Tests set the largest arena mapped with MAP_POPULATE (UINT64_MAX: the default,
 * KVC_ARENA_POPULATE_MAX in libkvc.c; 0: none), read at each arena's mapping. */
void kvci_arena_populate_max_set(uint64_t bytes);
/* Tests set the bytes of host arena registered with the device at once (0: the default,
 * KVC_GPU_REG_CHUNK in libkvc_gpu.c), read at kvc_gpu_attach(). */
void kvci_gpu_reg_chunk_set(uint64_t bytes);
/* 1 when this process attached with the build's own CUDA table (CUDA may have started in it;
 * a child it forks must not use CUDA then). */
int kvci_gpu_cuda_used(void);

/* The fast path: copies the leading run of keys[0..n) it can serve from the shared index
 * into dst[] and returns how many (0 when it is off or the first key is not there). */
size_t kvci_fast_get(kvc_ns *ns, const struct kvc_key *keys, size_t n, void *const *dst);
/* Resolves one key through the index (benchmarks): 1 with where its stored bytes are now
 * (valid until the daemon reuses the slot: copy them, then check), 0 when not there. */
int kvci_fast_resolve(kvc_ns *ns, const struct kvc_key *k, const void **data, size_t *len);
/* Tells the daemon the hit ring has entries (kvc_fast_bell_ring), after head moved on from
 * `was`. */
void kvci_fast_bell(kvc_client *c, uint64_t was);
/* Whether the hit ring holds hits the daemon has not read yet. */
bool kvci_fast_unread(const kvc_client *c);
/* Asks the daemon to read the ring (FAST_ATTACH SYNC, answered once it did) so that the hits
 * in it count: kvc_disconnect, before it closes. */
void kvci_fast_flush(kvc_client *c);
/* Unmaps the indexes and the hit ring (kvc_disconnect). */
void kvci_fast_fini(kvc_client *c);
/* Bytes from arena a's start the daemon has faulted in (kvc_fast_hdr.faulted; its index
 * mapped now if it was not), or UINT64_MAX where nothing says (no index: pin it all). c->mu
 * held. */
uint64_t kvci_fast_faulted(kvc_client *c, uint32_t a);

/* Copies a block into an arena slot for a put (libkvc_copy.c): of KVCI_STREAM_MIN bytes or
 * more with non-temporal stores, fenced, so the bytes are in memory before the commit that
 * publishes them is sent; else memcpy. */
#define KVCI_STREAM_MIN (32u << 10)
void kvci_copy_to_arena(void *dst, const void *src, size_t len);
/* Copies a hit's bytes out of an arena slot into the caller's memory (libkvc_copy.c): at the
 * speed of an aligned memcpy whatever the destination's alignment (a copy of KVCI_ALIGN_MIN
 * bytes or more not 64-byte aligned on both sides aligns its destination first); else
 * memcpy. */
#define KVCI_ALIGN_MIN (1u << 10)
void kvci_copy_from_arena(void *dst, const void *src, size_t len);

uint64_t kvc_layout_salt(const struct kvc_wire_layout *l);
void kvc_key_chain(uint64_t salt, const struct kvc_key *parent, const uint32_t *tokens,
                   size_t ntokens, uint32_t block_tokens, const void *extra, size_t extra_len,
                   struct kvc_key *keys, size_t nkeys);

#endif
