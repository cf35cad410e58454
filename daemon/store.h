/*
 * store.h — the cache proper: namespaces, blocks, leases, reservations and eviction.
 *
 * DESIGN
 * The store knows nothing of sockets: the server decodes a request and calls one store
 * function with an owner (one per connection) and the time. That keeps every rule of the
 * cache testable without a daemon.
 *
 * Invariants (checked by tests/check_store.c):
 * - A committed block's parent is committed (or it is a root): the cached blocks form a
 *   prefix tree. Eviction takes only leaves (children == 0), unpinned; no path drops a
 *   block with children, so a block's parent index (struct block.parent) keeps naming its
 *   parent while it is cached.
 * - Reserved blocks are in the map (so a second writer sees "busy") but never visible to
 *   lookups, never in the LRU list, and belong to exactly one reservation of one owner.
 *   A reservation pins the parent of its first slot, so the chain it will attach to cannot
 *   be evicted before it commits. That parent is committed, or a slot another reservation
 *   of the same owner holds (a chunk reserved while the chunk before it still commits);
 *   never another owner's slot (that RESERVE skips every key, as under an absent parent).
 *   A reservation whose parent is still reserved cannot commit (-EAGAIN, nothing done), so
 *   the first invariant holds; when the parent's slot is dropped instead (its reservation
 *   aborted, committed short, expired, or its owner gone) every slot hanging from it is
 *   dropped with it (store_resv_orphans_end), and the reservation stays empty until its
 *   owner commits it (nothing committed, every slot dropped) or aborts it.
 * - Everything an owner holds (leases with their pins, reservations with their slots) is
 *   reachable from the owner and given back by store_owner_fini(): a client that dies
 *   leaks nothing and its uncommitted blocks are never seen.
 * - Lookups touch the hits from the last to the first, so a parent is always more recent
 *   than its children and the cold end of the LRU list holds leaves.
 * Owned by the loop thread.
 */
#ifndef KVC_STORE_H
#define KVC_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "client/kvc_proto.h"
#include "daemon/index.h"
#include "daemon/stats.h"
#include "policies/policy.h"

struct tier;
struct tier_loc;
struct engine_core;
struct engine_disk;
struct engine_remote;
struct engine_gpu;
struct gpu_reg;
struct kern_dev_ops;
struct kern_layout;
struct kern_recipe;
struct fast_index;

#define STORE_MAX_ARENAS 16
/* The largest block (struct block keeps 32-bit lengths; a disk record adds a header). */
#define STORE_BLOCK_MAX (1ull << 30)
/* A disk record's offset is kept in units of this (tiers/disk.h: TIER_DISK_ALIGN). */
#define STORE_RECORD_ALIGN 4096u
/* arenas[STORE_ARENA_DISK] holds the disk tier and the LRU list of blocks on it. */
#define STORE_ARENA_DISK STORE_MAX_ARENAS
/* arenas[STORE_ARENA_GPU] holds the GPU tier (when there is one) and its LRU list. */
#define STORE_ARENA_GPU (STORE_MAX_ARENAS + 1)
/* Bytes of each host arena faulted in before store_new (store_arena_add) returns when the
 * rest is faulted in the background (store_params.host_prefault_threads). */
#define STORE_PREFAULT_FIRST (64ull << 20)

struct store_params {
    uint64_t host_size;
    uint64_t host_page_size;
    int host_huge; /* enum tier_host_huge */
    bool host_prefault;
    uint32_t host_prefault_threads; /* 0: every page before store_new returns */
    bool host_collapse; /* host.thp_collapse: the arenas and the shared index on 2 MiB pages
                           by collapse where the host gives shared memory none (kvc_huge.h) */
    double high_watermark;
    double low_watermark;
    uint32_t max_namespaces;
    uint32_t max_handles; /* leases + reservations per owner */
    enum policy_kind policy;
    uint64_t recompute_tokens_per_s; /* to estimate the recompute time hits save */
    double ghosts; /* evicted blocks remembered, x a namespace's capacity in blocks; 0: none */
    /* The GPU tier (tiers/gpu.c): off when gpu_size is 0. Blocks go to the pool when a
     * client that mapped it puts them, or is served them while the pool is below the high
     * watermark; they come back to their host arena above it (the same watermarks), or
     * when a client that cannot read the pool looks them up. */
    uint64_t gpu_size;
    int gpu_device;
    uint64_t gpu_page_size;             /* 0: 2 MiB */
    const struct kern_dev_ops *gpu_ops; /* NULL: kern_dev_cuda(); tests pass a fake */
    uint64_t gpu_reg_chunk; /* host bytes registered with the device at once (0:
                               GPU_REG_CHUNK, daemon/gpu_reg.h; tests set less) */
    uint32_t quantize_inflight;         /* quantize-in-place jobs the trim may queue (0: none) */
    uint32_t quantize_threads;          /* encoding threads (0: one per CPU, quant_threads) */
    bool head_step;                     /* host.head_step (store_head_step) */
    bool fast_path;                     /* each host arena gets a shared index (daemon/fast.h) */
};

/* A binary heap of block indexes by policy key, lowest first (store_policy.c). */
struct store_heap {
    struct store_heap_ent *a;
    uint32_t n, cap;
    uint8_t rung; /* 0: a namespace's leaf heap (position in store_meta.hpos); k + 1: its
                     rung k heap (store_meta.rpos) */
};

struct store_ns {
    uint32_t id;
    uint32_t arena;
    uint64_t serial; /* unique for the store's life: an id is reused after a drop, this not */
    struct kvc_wire_layout layout;
    uint64_t block_bytes;
    uint64_t blocks; /* committed now */
    uint64_t bytes;
    struct stats stats;
    /* Its policy (store_policy.c): the kind in use, where it came from, the parameters it
     * ranks with and, under POLICY_DEFAULT, the tuner that chooses their half-life. */
    uint8_t policy;     /* enum policy_kind */
    uint8_t policy_src; /* enum store_policy_src */
    struct policy_params pp;
    struct policy_tune *tune;
    /* Per-head hint mass (HINT_HEADS, store_hint_heads): [3][layers * kv_heads] floats, the
     * mass each head put on sink blocks, on the last blocks of each hinted run and on all;
     * NULL until the first per-head hint. store_head_profile() reads categories from it.
     * Aged as TinyLFU ages its counters: every STORE_HEAD_AGE_BLOCKS hinted blocks all of it
     * and head_seen are halved, so the profile follows the recent hints (and the floats keep
     * their precision) whatever the namespace's age. */
    float *head_mass;
    uint32_t head_seen; /* blocks hinted since the last halving */
    /* Under any policy but LRU, its evictable blocks (in its arena's memory, no cached child,
     * not lost) in a binary heap by policy_key, lowest first (store_policy.c), keyed with
     * half-life heap_hl. Pinned or moving blocks stay in it and are skipped. */
    struct store_heap heap;
    double heap_hl;
    bool heap_stale; /* its policy changed: rebuilt by store_heap_rebuild_stale */
    /* The precision ladder (store_policy.c, policies/policy_ladder.c), when its creator
     * allowed codecs: rung 0 raw, rung k > 0 format rung_format[k] (each smaller than the
     * one before). rung_bytes: what its committed blocks in its arena hold at each rung;
     * rung_moving / rung_coming: quantize jobs in flight, the bytes leaving rung k and the
     * encoded bytes arriving at it. rheap[k] (k < rungs - 1): the blocks that may step down
     * from rung k (inner blocks too; none pinned or clean; sinks that are leaves, which leave
     * instead), by policy_key like `heap`. */
    uint8_t rungs; /* 0: no ladder */
    uint8_t rung_format[POLICY_LADDER_RUNGS];
    uint64_t rung_bytes[POLICY_LADDER_RUNGS];
    uint64_t rung_moving[POLICY_LADDER_RUNGS];
    uint64_t rung_coming[POLICY_LADDER_RUNGS];
    struct store_heap rheap[POLICY_LADDER_RUNGS];
    struct policy_ladder ladder;
    double lossy_weight; /* the ladder's (0: the most hits the codecs give) */
    double max_error;    /* codecs whose error bound exceeds it are off the ladder (0: none) */
    /* Merge steps of the ladder since the last verdict and how many merge refused (its KV
     * had more runs than merge stores). After STORE_MERGE_WINDOW steps with at least
     * STORE_MERGE_REFUSED_PCT % refused, merge is off the ladder (merge_off: the rungs are
     * set up again without it, so the rung before it is what blocks leave from, or where
     * steps past it go) until merge_retry more blocks were committed in the namespace
     * (merge_off_at: its committed_blocks then): KV with no runs of alike tokens, on which
     * every merge step is an encode and the plan's pass spent for nothing. merge_retry
     * starts at STORE_MERGE_RETRY and doubles with each try that goes off again (up to
     * STORE_MERGE_RETRY_MAX), back to the start after a window merge took. */
    uint32_t merge_steps, merge_refusals;
    bool merge_off;
    uint64_t merge_off_at;
    uint64_t merge_retry;
};
#define STORE_MERGE_WINDOW 256u
#define STORE_MERGE_REFUSED_PCT 90u
#define STORE_MERGE_RETRY 65536u
#define STORE_MERGE_RETRY_MAX (1ull << 24)

/* Where a namespace's policy comes from. */
enum store_policy_src {
    STORE_POLICY_SRC_DEFAULT = 0, /* follows store_params.policy (cache.policy) */
    STORE_POLICY_SRC_CONFIG = 1,  /* its [namespace.PATTERN] section's `policy` */
    STORE_POLICY_SRC_ADMIN = 2,   /* POLICY_SET for this namespace (until the next reload) */
};

/* What the policies know of a block beyond struct block, in side tables by block index
 * (struct block is at its size budget). store_meta, 8 bytes, what every policy but LRU ranks
 * and keeps its heaps with: grown with the block pool. store.rpos, 4 bytes, a block's place in
 * its rung's heap (the ladder): allocated the first time a block enters one, so a cache
 * without codecs spends nothing on it. store_meta_x, 20 bytes, what only client hints and the
 * quantize pass give a block: allocated the first time any block gets one, so a cache without
 * hints or codecs spends nothing on it. Valid while committed. */
struct store_meta {
    float freq;    /* decayed access count as of last_access (policy_touch) */
    uint32_t hpos; /* 1 + its position in its namespace's heap; 0: not in it */
};
_Static_assert(sizeof(struct store_meta) == 8, "the policy side table is 8 bytes a block");
struct store_meta_x {
    float hint;      /* H2O attention mass as of hint_t (policy_hint) */
    float snap;      /* SnapKV observation-window score */
    uint32_t hint_t; /* when `hint` was set, ms since start >> STORE_META_TSHIFT */
    uint32_t quest;  /* 1 + index into store.qsum: the block's key min/max; 0 none */
    uint16_t vnorm;  /* bf16 mean value L1 norm (quant.c, VATP); 0: not measured */
    uint16_t hpeak;  /* bf16 head concentration of its last HINT_HEADS: the largest (layer,
                        head) score over their mean (1: spread evenly, layers * heads: one head);
                        0: none */
};
_Static_assert(sizeof(struct store_meta_x) == 20, "the hint and codec side table is 20 bytes");
#define STORE_META_TSHIFT 4 /* 16 ms: 2^32 ticks last 2.2 years */

/* A block's disk record, by block index: kept only by a daemon with a disk tier, grown by
 * store_record_reserve before a record is written. 12 bytes, so a daemon without one spends
 * nothing on records. */
struct store_rec {
    uint32_t doff; /* its offset in 4 KiB units (STORE_RECORD_ALIGN) */
    uint32_t ver;  /* its page's version (tier_loc.cls) */
    uint32_t len;  /* its bytes */
};

/* A lease or a reservation: what an owner holds by id. */
enum store_handle_kind { STORE_HANDLE_LEASE = 1, STORE_HANDLE_RESV = 2 };
struct store_handle {
    uint64_t id; /* generation << 32 | slot */
    uint8_t kind;
    bool gpu; /* LEASE: looked up by an owner that reads the pool (its host hits are promoted
                 once it is released: engine_release) */
    uint16_t ns;
    uint32_t parent_pin; /* RESV: the pinned parent block (committed, or reserved by another
                            reservation of the same owner), or INDEX_NONE */
    uint32_t n;          /* blocks[] entries */
    uint32_t dropped;    /* RESV: slots dropped before its end: the reservation its parent
                            belonged to ended without committing that parent */
    bool orphan;         /* RESV: its parent's slot was just dropped; its own slots go next
                            (store_resv_orphans_end) */
    uint32_t blocks[];   /* LEASE: pinned hits in order; RESV: reserved slots in order */
};

/* One per connection. */
struct store_owner {
    struct store_handle **handles; /* by slot; NULL free */
    uint32_t nhandles;             /* capacity of handles[] */
    uint32_t live;
    uint32_t gen;
    uint64_t pins;     /* block pins held through leases */
    uint32_t orphans;  /* reservations marked orphan whose slots are not dropped yet */
    bool gpu;          /* this request may get GPU locations (set by the server per request) */
    bool lookup_short; /* the last lookup stopped at a block that found no room to be read
                          into (set by the engine) */
};

/* Every committed block is on exactly one list: that of b->arena. A host arena (and the
 * GPU pool) keeps two: dirty blocks (lru_*) and clean ones (clean_*: a valid copy is on
 * disk, so their memory can go at no cost); eviction takes the clean list first. The disk
 * "arena" keeps only lru_*: blocks whose one copy is on disk. Both are most recent first. */
struct store_arena {
    struct tier *tier;
    uint32_t lru_head, lru_tail;
    uint32_t clean_head, clean_tail;
    uint64_t clean_bytes; /* memory held by the clean list */
    /* Host arenas: the bytes a slot generation and a slot-owner map entry cover, the
     * smallest slot the arena hands out (store.c store_arena_gran); the map's entries. */
    uint64_t gran;
    uint64_t owner_n;
};

struct store {
    struct store_params p;
    struct index ix;
    struct store_arena arenas[STORE_MAX_ARENAS + 2];
    uint32_t narenas;    /* host arenas */
    uint64_t ns_serials; /* namespaces created so far (store_ns.serial) */
    /* The engine's (daemon/engine.h): where a reservation finds room (NULL: the arena's
     * allocator, no eviction), the disk tier's state, the quantize worker. */
    int (*room)(struct store *s, struct store_ns *ns, bool gpu, uint64_t now, struct tier_loc *loc);
    /* The engine core's services for the tier engines (daemon/engine_core.h; engine_attach). */
    const struct engine_core *core;
    struct engine_disk *disk;     /* the disk tier engine (daemon/engine_disk.h); NULL: none */
    struct engine_remote *remote; /* the remote tier engine (engine_remote.h); NULL: none */
    /* Called for every block a commit makes visible (the remote tier's write-behind). */
    void (*on_commit)(struct store *s, uint32_t idx, uint64_t now);
    void (*on_ready)(void *arg); /* a read from disk completed (set by the server) */
    void *on_ready_arg;
    /* Before the engine evicts: the hits clients took through the shared index and have not
     * reported yet are read, so the policies rank with them (set by the server). */
    void (*on_evict)(void *arg);
    void *on_evict_arg;
    /* Whether a request waits for the loop (set by the server): a trim past its first
     * actions stops there and goes on after it (engine.c's engine_trim_spent). */
    bool (*trim_yield)(void *arg);
    void *trim_yield_arg;
    int trim_yield_next; /* the trim's action count at which it asks next */
    struct store_ns **ns; /* by id; [0] unused */
    uint32_t nns;
    struct stats total;
    uint64_t pins_now;
    uint64_t reserved_now, reserved_bytes_now;
    struct tier *gpu;             /* arenas[STORE_ARENA_GPU].tier, or NULL: no GPU tier */
    struct engine_gpu *gpu_moves; /* the pool's moves in flight (daemon/engine_gpu.h) */
    uint32_t gpu_unregistered;    /* host arenas the device could not register (pageable) */
    struct gpu_reg *gpu_reg;      /* their registration (daemon/gpu_reg.h); NULL: none yet */
    struct quant *quant;          /* quantize-in-place worker (daemon/quant.h), or NULL */
    uint32_t *keysum;             /* by block index: bf16 key L2 norm << 16 | bf16 key absmax of a
                            quantized block (written by quant.c, read by the policies) */
    uint32_t nkeysum;
    /* Policy metadata (store_policy.c): per block index, and the Quest summaries (per
     * channel key min then max over a block, summed over its layers and heads: 2 * dim
     * floats each) that the quantize pass computed. */
    struct store_meta *meta;
    uint32_t nmeta;
    struct store_meta_x *meta_x; /* NULL until a block gets a hint or a codec's signals */
    uint32_t nmeta_x;
    /* The rung above << STORE_RPOS_SHIFT | 1 + its position in that rung's heap; 0: in none.
     * NULL until a block enters a rung heap. */
    uint32_t *rpos;
    uint32_t nrpos;
    struct store_rec *rec; /* disk records (BLOCK_F_DISK) by block index; NULL: none yet */
    uint32_t nrec;
    float **qsum;
    uint32_t *qdim;
    uint32_t nqsum, qcap, *qfree, nqfree;
    uint64_t rng; /* xorshift state of the eviction sample's random probes */
    /* Ghosts (store_policy.c): what the policies knew of recently evicted blocks. */
    struct store_ghost *ghost;
    uint32_t nghost;    /* entries, a power of two (sets of STORE_GHOST_WAYS) */
    uint32_t ghost_cap; /* the most entries the table may have (0: not computed yet) */
    uint32_t ghost_seq; /* evictions noted so far (wraps) */
    uint64_t ghost_salt;
    bool heap_defer; /* store_ns_policy_set leaves the heap rebuild to its caller */
    /* The fast path's shared index of each host arena (NULL: off), kept in step by
     * store_fast_sync, sized for every block the arena can hold, with a slot generation per
     * granule (replaced when a namespace with smaller blocks comes to it, or a smaller slot
     * is cut: store_arena.gran). */
    struct fast_index *fast[STORE_MAX_ARENAS];
    uint64_t fast_full_before; /* fast_full of indexes replaced by larger ones */
    bool fast_keep;            /* store_touch: its unlink and push leave the index entry alone */
    /* Which block's slot starts in each granule of a host arena (store_arena.gran: the
     * smallest slot it hands out, so no two start in one), 1 + the index of the committed
     * block there, 0 none (kept by the LRU link and unlink; store_slot_owner). The ladder and
     * compaction empty a whole slab with it. NULL until the first of them asks (a cache with
     * one slot size and no codecs never does), and again when the granule is lowered. */
    uint32_t *owner[STORE_MAX_ARENAS];
    /* Bytes the reservation being made still wants (store_reserve): the room a ladder makes
     * at once when a put finds its arena full, so a chain waits for its room once. */
    uint64_t room_want;
    /* The last engine_trim stopped at its time budget above the low watermark: the next one
     * (the server runs it after the next batch of requests) goes on from there. */
    bool trim_more;
    /* Room is coming in an arena: a quantize job landed (set by the server, which runs the
     * puts that wait for room again). */
    void (*on_room)(void *arg);
    void *on_room_arg;
    /* What the last lookup tells the policies (store_lease_pin: its hits' accesses, and its
     * keys for the default policy's tuner), kept here when post_defer is set (the server sets
     * it) and applied by store_post_flush once the lookup's reply has gone out: the same work
     * in the same order, before any later request, timer or fast-ring hit reads the policy
     * state (a newer lookup or a fast hit applies it first). The hits are pinned by the
     * lease meanwhile; the keys are copied (the request buffer is reused). Loop thread. */
    bool post_defer;
    uint32_t post_ns; /* 0: nothing kept */
    uint32_t post_nhit, post_nkey;
    uint64_t post_now, post_serial;
    uint32_t *post_idx;             /* KVC_PROTO_MAX_KEYS; allocated at the first deferral */
    struct kvc_wire_key *post_keys; /* the same */
    /* The shared-index entries a commit left for later, when pub_defer is set (the server
     * sets it): block indexes, published by store_pub_flush — before any request but a
     * RESERVE, and when the loop has nothing to read (before the trim, yielding to requests)
     * — so that the RESERVE a client sends right behind its quiet COMMIT is answered before
     * the commit's publications (at a million blocks each is a few cache misses: ~20 us for
     * 64). A block not yet published is a hit through the socket for a moment, never a wrong
     * one; each is checked when it is published (only a block still committed and ready in a
     * host arena is, whatever it became meanwhile). Loop thread. */
    bool pub_defer;
    bool pub_queue; /* store_resv_end: store_lru_push_head queues instead of publishing */
    uint32_t *pub_q;
    uint32_t pub_head, pub_n, pub_cap;
};

/* Creates the store and its host arena. On failure NULL and *err = -errno. */
struct store *store_new(const struct store_params *p, int *err);
void store_free(struct store *s); /* NULL is a no-op */

/* Applies the reloadable parameters (watermarks, policy, max_handles). */
void store_reload(struct store *s, const struct store_params *p);

/* Whether a (NUL-terminated) model id is free of control characters: an id is printed in
 * kvcctl's tables, logs and metric labels, where a newline or tab would break lines. */
bool store_model_id_ok(const char *id);

/* Checks a layout and computes its block size. 0 or -EINVAL (with a reason in *why). */
int store_layout_check(const struct kvc_wire_layout *l, uint64_t arena_bytes, uint64_t *block_bytes,
                       const char **why);

/* Opens or creates the namespace of l->model_id. -EEXIST when it exists with another layout,
 * -ENOSPC when the namespace table is full, -EINVAL for a bad layout. */
int store_ns_open(struct store *s, const struct kvc_wire_layout *l, uint32_t *ns_id, bool *created);
/* The same, a namespace created here placed in host arena `arena` from the start (an
 * existing one stays where it was created): placement is all or nothing. -ENOENT for an
 * arena that does not exist, -EINVAL when the block does not fit it. */
int store_ns_open_in(struct store *s, const struct kvc_wire_layout *l, uint32_t arena,
                     uint32_t *ns_id, bool *created);
/* Removes a namespace that holds nothing (no block, no reserved slot). 0, -ENOENT, -EBUSY. */
int store_ns_close(struct store *s, uint32_t ns_id);
struct store_ns *store_ns_get(const struct store *s, uint32_t ns_id);
struct tier *store_ns_tier(const struct store *s, const struct store_ns *ns);

void store_owner_init(struct store_owner *o);
/* Releases every lease and aborts every reservation of o. */
void store_owner_fini(struct store *s, struct store_owner *o);

/* The blocks of one LOOKUP's keys, each found in the index once, by store_lookup_run (and the
 * remote step for the keys past the run), or for a window's or a state's span when a step
 * first asks for it (store_lookup_block), and handed to every later step: the disk and
 * remote steps, the lease. idx[i] is keys[i]'s block, INDEX_NONE, or STORE_LOOKUP_UNSEEN
 * (not looked up yet), for i < n. A step that follows one that may make room (a block not
 * pinned then may go) checks a handle with index_handle_ok before it uses it. */
struct store_lookup_blocks {
    uint32_t n;
    uint32_t idx[KVC_PROTO_MAX_KEYS];
};
#define STORE_LOOKUP_UNSEEN (INDEX_NONE - 1) /* never a block's index: no handle is ok */

/* The run of committed, readable blocks of keys[0..n) from the first (at most
 * KVC_PROTO_MAX_KEYS): the hits a lookup may hand out before the engine moves any. With lb,
 * the blocks of the run and of the key it stops at (lb->n: the run, plus one when it stops
 * at a key), each found once. */
uint32_t store_lookup_run(struct store *s, uint32_t ns_id, const struct kvc_wire_key *keys,
                          uint32_t n, struct store_lookup_blocks *lb);
/* The same run over blocks found already, idx[0..n) (each checked with index_handle_ok): no
 * key is looked up again. */
uint32_t store_lookup_run_found(struct store *s, uint32_t ns_id, const struct kvc_wire_key *keys,
                                uint32_t n, const uint32_t *idx);
/* Starts lb for keys[0..n) (at most KVC_PROTO_MAX_KEYS), none of them looked up yet. */
void store_lookup_blocks_init(struct store_lookup_blocks *lb, uint32_t n);
/* keys[i]'s block in lb (i < lb->n), found in the index the first time a step asks for it. */
uint32_t store_lookup_block(struct store *s, uint32_t ns_id, const struct kvc_wire_key *keys,
                            struct store_lookup_blocks *lb, uint32_t i);
/* The span of keys[0..lb->n) a lookup of namespace ns_id answers with, judged over the
 * blocks of lb (each key looked up once, when first needed; a handle checked with
 * index_handle_ok): keys[first..first+count), returned as first with *count set. KV and
 * K_ONLY: the run of committed blocks from keys[0] (store_lookup_run_found); KV_WINDOW: the
 * window of the longest prefix whose window is cached (base: the position of keys[0] in the
 * prompt, kvc_lookup_req.base); STATE: the state of the longest prefix that has one (count 0
 * or 1). Cached means committed and not lost; with STORE_SPAN_READY in mode, also in memory
 * now and readable by the client (a pool block only with STORE_SPAN_GPU). */
#define STORE_SPAN_READY 0x1u
#define STORE_SPAN_GPU 0x2u
uint32_t store_lookup_span(struct store *s, uint32_t ns_id, const struct kvc_wire_key *keys,
                           struct store_lookup_blocks *lb, uint32_t base, unsigned mode,
                           uint32_t *count);
/* Blocks the window of a prefix ending at keys[e] needs (w: the window in blocks; base:
 * keys[0]'s position in the prompt): its last w, or all of a shorter prefix. */
static inline uint32_t store_window_need(uint32_t w, uint32_t base, uint32_t e)
{
    return (uint64_t)base + e < w ? base + e : w;
}
/* Pins keys[0..hits), whose blocks are idx[0..hits) (struct store_lookup_blocks), under a new
 * lease of o (*lease_id, 0 if no hit), fills locs[0..hits) from where each block is now and
 * counts the lookup of n keys (tier[i]: where hit i was found, for the per-tier counters).
 * The hits end at the first handle that no longer names its key's block. Returns the hits,
 * or -ENOENT (ns), -EMFILE, -ENOMEM. The engine's lookup (daemon/engine.h) calls it once the
 * hits are where they can be read. */
int store_lease_pin(struct store *s, struct store_owner *o, uint32_t ns_id,
                    const struct kvc_wire_key *keys, const uint32_t *idx, uint32_t n, uint32_t hits,
                    const uint8_t *tier, uint64_t now, uint64_t *lease_id,
                    struct kvc_wire_loc *locs);

/* Namespace of a lease of o, or 0 if o holds no such lease. */
uint32_t store_lease_ns(struct store_owner *o, uint64_t lease_id);

/* Drops a lease. 0 or -ENOENT. */
int store_release(struct store *s, struct store_owner *o, uint64_t lease_id);

/* Reserves slots for the absent keys of the chain parent → keys[0..n). The parent is
 * committed, or a slot o holds in another reservation (the new one then commits after it:
 * store_commit); under any other parent (absent, another owner's slot) every key is
 * SKIPPED. Fills st[i] (enum kvc_wire_slot) and locs[i] (for RESERVED), *resv_id (0 if
 * none). Returns the number reserved, or -ENOENT (ns), -EMFILE, -ENOMEM. */
int store_reserve(struct store *s, struct store_owner *o, uint32_t ns_id,
                  const struct kvc_wire_key *parent, const struct kvc_wire_key *keys, uint32_t n,
                  uint64_t now, uint64_t *resv_id, uint8_t *st, struct kvc_wire_loc *locs);

/* The block of the first key of keys[0..n) in ns_id that is not committed, when a reservation
 * holds it (another's: store_reserve would answer BUSY there and skip the rest of the chain);
 * INDEX_NONE when the first such key is absent or the chain is all committed. Looks at map
 * entries only, up to that key; takes nothing. store_resv_holds: whether a reservation of o
 * holds block idx. */
uint32_t store_reserve_writing(struct store *s, uint32_t ns_id, const struct kvc_wire_key *keys,
                               uint32_t n);
bool store_resv_holds(const struct store *s, struct store_owner *o, uint32_t idx);
/* Whether block idx is a reserved slot of namespace ns_id (any owner's): a block entry reused
 * since for another reservation of that namespace answers true as well, which only delays
 * whoever asks until that one ends. */
bool store_block_reserved(const struct store *s, uint32_t idx, uint32_t ns_id);

/* Commits the first ncommit slots of a reservation and frees the rest. Returns the number
 * committed (and *dropped: the rest, with the slots an orphaned reservation lost before),
 * -ENOENT, or -EAGAIN when ncommit > 0 and the chain's parent is a slot of another of o's
 * reservations not committed yet: nothing is done, the reservation stays o's (commit that
 * one first). Evicts nothing: the caller runs engine_trim() once the client has its reply,
 * so eviction is not on the client's path. */
int store_commit(struct store *s, struct store_owner *o, uint64_t resv_id, uint32_t ncommit,
                 uint64_t now, uint32_t *dropped);
int store_abort(struct store *s, struct store_owner *o, uint64_t resv_id);

/* For the tier engine (daemon/engine.c, engine_disk.c), which decides where blocks live
 * and moves them. A block's list follows its arena and its BLOCK_F_DISK flag: change either
 * only while it is unlinked. */
void store_lru_unlink(struct store *s, uint32_t idx);
void store_lru_push_head(struct store *s, uint32_t idx);
/* Whether any path may free, move, quantize or evict block idx now: committed, unpinned,
 * not lost and not in motion (BLOCK_F_BUSY). Every such path asks this. */
bool store_block_idle(const struct store *s, uint32_t idx);
/* Removes a block from map, list and pool and frees every copy (memory slot, disk record).
 * -EBUSY (nothing done) for a committed block in motion (BLOCK_F_BUSY). */
int store_block_drop(struct store *s, uint32_t idx);
/* What a drop of committed block idx touches besides the block (its map slot, shared-index
 * bucket, list neighbours, parent, policy entry and ghost set), asked for at once: in a tier
 * past the caches each is a miss of its own, and a drop would wait on them one by one. A
 * hint: nothing changes. */
void store_drop_prefetch(struct store *s, uint32_t idx);
/* A block's disk record (BLOCK_F_DISK): its location, and freeing it (clears the flag; the
 * block must be unlinked, or on a list that does not depend on the flag). */
void store_record_loc(const struct store *s, const struct block *b, struct tier_loc *l);
void store_record_free(struct store *s, uint32_t idx);
/* Room for block idx's record in store.rec, made before its record is written or adopted (so
 * that setting it cannot fail). 0 or -ENOMEM. store_record_set: block idx's record is at l
 * (sets it and BLOCK_F_DISK; b unlinked when the flag changes: it picks the list). */
int store_record_reserve(struct store *s, uint32_t idx);
void store_record_set(struct store *s, uint32_t idx, const struct tier_loc *l);
struct store_handle *store_handle_get(struct store_owner *o, uint64_t id, uint8_t kind);

/* The committed block whose slot starts at offset off of host arena `arena`, or INDEX_NONE. */
uint32_t store_slot_owner(struct store *s, uint32_t arena, uint64_t off);
/* Block idx's slot as its arena's owner map has it: set (on) or cleared; for code that moves
 * a linked block to another slot of the same arena (quant.c). */
void store_slot_own(struct store *s, uint32_t idx, bool on);
/* The fast path (daemon/fast.h): publishes block idx in its arena's index when it is
 * committed and ready there, or takes it out. Called wherever a block's list, location,
 * format or readiness changes (the LRU link and unlink call it). */
void store_fast_sync(struct store *s, uint32_t idx);
/* A hit a client took through the index (its hit ring): block idx (or whatever block holds
 * key in ns_id) counts as a LOOKUP's hit would, and nkeys > 0 (on a request's first hit)
 * counts a lookup of that many keys. Call it for a request's hits from the last to the first,
 * as LOOKUP touches them. 0, or -ENOENT when no committed block of that key is cached (the
 * entry was stale or made up). store_fast_ref then feeds the namespace's tuner the request's
 * hits in prefix order (pos: the key's position in its request). */
int store_fast_hit(struct store *s, uint32_t ns_id, uint32_t idx, const struct kvc_wire_key *key,
                   uint32_t nkeys, uint64_t now);
void store_fast_ref(struct store *s, uint32_t ns_id, const struct kvc_wire_key *key, uint32_t pos,
                    uint64_t now);

/* The fast path's indexes: blocks published now, and publications refused so far because
 * the block found no room (its hits take the socket; keys chosen to collide). */
void store_fast_stats(const struct store *s, uint64_t *published, uint64_t *full);

/* Gauges for STATS (see STATS_GAUGES). */
uint64_t store_host_used(const struct store *s);
uint64_t store_host_capacity(const struct store *s);
/* Bytes of the host arenas faulted in so far, and in all (every arena; the capacity above is
 * arena 0's). */
void store_host_faulted(const struct store *s, uint64_t *faulted, uint64_t *total);
/* Bytes of the host arenas made 2 MiB pages by collapse (store_params.host_collapse). */
/* Tells the clients, in each arena's shared index, how much of it is faulted in (so they
 * pin only that part: kvc_fast_hdr.faulted). Loop thread, from its tick. */
void store_fast_faulted_publish(struct store *s);
/* Logs what the registration of the host arenas with the device refused or finished since
 * the last call (daemon/gpu_reg.h). Loop thread, from its tick. */
void store_gpu_reg_tick(struct store *s);
uint64_t store_host_collapsed(const struct store *s);
uint64_t store_gpu_used(const struct store *s);     /* 0 without a GPU tier */
uint64_t store_gpu_capacity(const struct store *s); /* 0 without a GPU tier */

/* Adds a host arena of `size` bytes (same page size and huge-page choice as arena 0) for
 * the namespaces of one access list. *id its number. 0, -ENOSPC (STORE_MAX_ARENAS), -errno. */
int store_arena_add(struct store *s, uint64_t size, uint32_t *id);
/* ---- policies (store_policy.c) -------------------------------------------------------- */

/* Sets the policy of a namespace: kind >= 0 from src, or kind < 0 to follow the store's
 * default again. 0, -ENOENT (namespace), -EINVAL (kind). */
int store_ns_policy_set(struct store *s, uint32_t ns_id, int kind, enum store_policy_src src);
/* The policy view of committed block idx (metadata, flags, key norm when known). */
void store_policy_block(const struct store *s, uint32_t idx, struct policy_block *pb);
/* Metadata hooks of the store: a block committed, hit, dropped (loop thread). */
/* A hit on a block stored in a lossy codec: counted in total and by codec. */
void store_stat_lossy_hit(struct store *s, struct store_ns *ns, uint32_t format);
void store_meta_commit(struct store *s, uint32_t idx, uint64_t now);
void store_meta_hit(struct store *s, uint32_t idx, uint64_t now);
void store_meta_drop(struct store *s, uint32_t idx);
/* store_drop_prefetch's part here: idx's policy entry and rung position, its ghost's set. */
void store_meta_prefetch(const struct store *s, uint32_t idx);
/* The namespace heap: store_heap_sync puts idx in its namespace's heap, moves it or takes it
 * out, as its state asks (called wherever a block's list, children, flags, format, hits or
 * hints change); store_heap_remove takes it out. */
void store_heap_sync(struct store *s, uint32_t idx);
void store_heap_remove(struct store *s, uint32_t idx);
/* The first (at most max) blocks of ns's heap in policy order for which ok(s, idx, arg)
 * holds, among its first STORE_HEAP_SCAN entries, into out; returns how many. Rekeys the
 * heap first if the half-life moved by more than 5 %. store_heap_victim: the first of them,
 * preferring size class cls among the first 16 (cls < 0: any); INDEX_NONE if none. */
#define STORE_HEAP_SCAN 256
uint32_t store_heap_first(struct store *s, struct store_ns *ns,
                          bool (*ok)(const struct store *s, uint32_t idx, void *arg), void *arg,
                          uint32_t *out, uint32_t max);
uint32_t store_heap_victim(struct store *s, struct store_ns *ns,
                           bool (*ok)(const struct store *s, uint32_t idx, void *arg), void *arg,
                           int cls);
/* The blocks ns's heap gives next (the root's children and theirs) on their way into the
 * cache: a trim takes victim after victim from the heap's top, each a random block of the
 * pool. A hint: nothing changes. */
void store_heap_ahead(const struct store *s, const struct store_ns *ns);
/* Rebuilds the heaps of the namespaces marked heap_stale (their policy changed; emptied
 * under LRU), in one pass over the blocks. store_ns_policy_set calls it unless heap_defer
 * is set (store_reload sets every namespace's policy first, then rebuilds once). */
void store_heap_rebuild_stale(struct store *s);
void store_heap_free(struct store_ns *ns);
/* ---- what a block costs in a format (store_policy.c) ----
 * Quantization's bookkeeping, on the store's side (quant.c carries the jobs out): the
 * kernel layout of ns's blocks; the format of ns's first lossy rung (its recipe's key codec,
 * or its value codec when keys stay raw); the recipe of ns's blocks in `format`. */
void store_ns_kern_layout(const struct store_ns *ns, struct kern_layout *lay);
uint8_t store_ns_first_format(const struct store_ns *ns);
void store_ns_kern_recipe(const struct store_ns *ns, uint8_t format, struct kern_recipe *rec);
/* Bytes of a block of namespace ns held as `format`: its block size for
 * KVC_WIRE_FORMAT_RAW, the encoded size for the format of the namespace's recipe; -EINVAL
 * for a format the namespace does not produce. (The disk tier records a block's format and
 * restores it as it was.) */
int64_t store_format_bytes(const struct store_ns *ns, uint8_t format);

/* ---- the precision ladder (store_policy.c) ----
 * store_ladder_setup: the namespace's rungs from the codecs its creator allowed (the
 * recipe's first, then every smaller one by encoded size), without those above max_error;
 * called at creation and when its lossy_weight or max_error change. store_ladder_account:
 * block idx enters (+1) or leaves (-1) its rung's bytes (the LRU link and unlink call it).
 * store_ladder_rung: the rung of a format (the last for a lossy format off the ladder).
 * store_ladder_pick: policy_ladder_pick over the namespace's rungs, with quantize jobs in
 * flight counted where they go; returns the rung, *out as policy_ladder_pick, -1 if
 * nothing can move. store_ladder_first: the coldest block that may step down from rung k
 * (INDEX_NONE if none); on rung 0 it may be a sink (depth 0, a leaf), which leaves instead. store_ladder_hit / _ghost: what the targets learn from. */
void store_ladder_setup(struct store *s, struct store_ns *ns);
/* A namespace's ladder weight and fidelity budget (its [namespace.PATTERN] section): its rungs
 * set up again when they change. 0 or -ENOENT. */
int store_ns_ladder_set(struct store *s, uint32_t ns_id, double lossy_weight, double max_error);
void store_ladder_account(struct store *s, uint32_t idx, int sign);
uint32_t store_ladder_rung(const struct store_ns *ns, uint32_t format);
int store_ladder_pick(struct store *s, struct store_ns *ns, int *out);
uint32_t store_ladder_first(struct store *s, struct store_ns *ns, uint32_t rung);
/* The rung block v of rung k comes to rest on when it steps down now: k + 1, or further
 * while the rung it reaches stays over its target with it and it would be the block that
 * rung gives next (every block when the target is 0, else its coldest). kvcsim's ladder,
 * which steps instantly, takes such a block down again at once; one job straight to that
 * rung saves the worker the intermediate encode and the tier the intermediate slot. */
uint32_t store_ladder_dest(struct store *s, struct store_ns *ns, uint32_t v, uint32_t k);
void store_ladder_free(struct store_ns *ns);
/* A pin taken on a block, or given back: a pinned block is out of its namespace's heap. */
void store_block_pin(struct store *s, uint32_t idx);
void store_block_unpin(struct store *s, uint32_t idx);
/* Tests: NULL when every heap holds exactly the blocks it should, in heap order, with their
 * positions right; else what is wrong. */
const char *store_heap_check(const struct store *s);
/* A committed block leaves the cache for good (evicted): what the policy knew of it is
 * remembered as a ghost, given back by store_meta_commit when the key comes back soon. */
void store_ghost_note(struct store *s, uint32_t idx);
/* Publishes what commits left for later (struct store's pub_defer), in order; with yield, asks
 * it every few blocks and stops when it says so (a request is waiting). True when none is
 * left. */
bool store_pub_flush(struct store *s, bool (*yield)(void *arg), void *arg);
/* Applies the policy work a lookup left (see struct store's post_defer); no-op when none. */
void store_post_flush(struct store *s);
/* Feeds the namespace's tuner one referenced key (lookup or commit) in prefix order. */
void store_meta_ref(struct store *s, struct store_ns *ns, const struct kvc_wire_key *k,
                    uint32_t depth, uint64_t now);
/* The block's mean value L1 norm (VATP's signal), measured where the daemon reads the block's
 * bytes anyway: the quantize pass, or the encode of a raw block's disk record. */
void store_meta_vnorm_set(struct store *s, uint32_t idx, float vnorm);
/* Whether idx has a value norm (store_meta_vnorm_set with one > 0). */
bool store_meta_vnorm_known(const struct store *s, uint32_t idx);
/* Takes kmin/kmax (2 * dim floats, malloc'd; owned from here) as the Quest summary of idx. */
void store_meta_quest_set(struct store *s, uint32_t idx, float *kminmax, uint32_t dim);
void store_meta_free(struct store *s);

/* Client hints: per key a score of `kind` (KVC_HINT_*): H2O attention mass added to the
 * block's decayed mass, or its SnapKV score. Returns the number of committed blocks that
 * took one, or -ENOENT (namespace), -EINVAL (kind). */
int store_hint(struct store *s, uint32_t ns_id, uint32_t kind, const struct kvc_wire_hint *h,
               uint32_t n, uint64_t now);
/* Per-head hints (HINT_HEADS): score[n][layers * heads]. Each block takes the sum of its
 * scores as store_hint would and keeps its head concentration (store_meta.hpeak); the
 * namespace's head_mass learns where each head looks. -EINVAL when layers/heads are not the
 * namespace's layers/kv_heads or the kind is unknown; -ENOMEM. */
int store_hint_heads(struct store *s, uint32_t ns_id, uint32_t kind,
                     const struct kvc_wire_key *keys, const float *score, uint32_t n,
                     uint32_t layers, uint32_t heads, uint64_t now);

/* FastGen's head categories (Ge et al., arXiv 2310.01801), learnt from per-head hints. */
enum store_head_kind {
    STORE_HEAD_UNKNOWN = 0, /* no per-head hint mass yet: treated as FULL */
    STORE_HEAD_SINK = 1,    /* >= STORE_HEAD_RECOVER of its mass on sink blocks */
    STORE_HEAD_LOCAL = 2,   /* >= STORE_HEAD_RECOVER on sinks plus the most recent blocks */
    STORE_HEAD_FULL = 3,    /* spreads its attention: a retrieval head */
};
#define STORE_HEAD_RECOVER 0.9
#define STORE_HEAD_AGE_BLOCKS 4096
/* The namespace's head categories, out[layers * kv_heads] (layer-major). Returns the count
 * of FULL heads (UNKNOWN counted as FULL), -ENOENT for an unknown namespace. */
int store_head_profile(const struct store *s, uint32_t ns_id, uint8_t *out);
/* The heads the quantize pass keeps raw (bit-exact) inside a lossy block: out[layers *
 * kv_heads] = 1 for the FULL heads of a learnt profile when they are at most half of all
 * (more, and the block would be mostly raw: none then). Returns their count. The ladder
 * chooses its rungs by the codecs' sizes without them; a step takes the block's real size.
 * The quantize pass applies them only without a disk tier and outside whole-slab steps
 * (both size blocks by their format). */
int store_head_raw(const struct store *s, uint32_t ns_id, uint8_t *out);
/* The format block idx steps into instead of `format` when it keeps retrieval heads raw
 * (host.head_step): a raw block of a namespace whose ladder has a second codec, outside the
 * sinks, takes that codec at once for its sink-only and local heads (which put next to no
 * attention on such a block) while its retrieval heads stay raw; `format` otherwise. */
uint8_t store_head_step(const struct store *s, uint32_t idx, uint8_t format);

/* Per-head budgets for a budgeted lookup: *full_budget gets the blocks each full (or not yet
 * profiled) head may keep when every (layer, kv head) has `budget` on average, sink-only heads
 * keep max(sinks, 1) blocks and local heads those plus `recent` (each charged at most
 * `budget`, on the request's n keys): budget x layers x kv_heads head-blocks, the bytes of
 * `budget` whole blocks. prof (layers * kv_heads bytes) gets the categories. -ENOENT,
 * -EINVAL (budget 0, or layers * kv_heads 0 or above KVC_PROTO_MAX_HINT_HEADS). */
int store_head_budget(const struct store *s, uint32_t ns_id, uint32_t budget, uint32_t sinks,
                      uint32_t recent, uint32_t n, uint8_t *prof, uint32_t *full_budget);

/* Budgeted lookup: of the longest run of committed blocks of keys[0..n) in memory, selects
 * at most `budget` with policy `kind` (< 0: the namespace's) by policy_select (sinks and
 * recent window first; Quest with q[dim] when given), pins them under one lease and fills
 * pos[] (ascending positions) and locs[]. *nprefix: the run's length. Returns the number
 * selected, or -ENOENT (namespace), -EINVAL (kind, or dim not the namespace's head_dim),
 * -EMFILE, -ENOMEM. */
int store_lookup_budget(struct store *s, struct store_owner *o, uint32_t ns_id,
                        const struct kvc_wire_key *keys, uint32_t n, uint32_t budget, int kind,
                        uint32_t sinks, uint32_t recent, const float *q, uint32_t dim, uint64_t now,
                        uint64_t *lease_id, uint32_t *nprefix, uint32_t *pos,
                        struct kvc_wire_loc *locs);

/* Whether any namespace ranks with a policy other than LRU (then engine_trim runs the
 * policy engine instead of the original quantize-demote-drop order). */
bool store_policy_engine(const struct store *s);

/* A lookup stops at a block pinned this many times (counted as pin_saturated): lookups are
 * the only pins without another bound, so the 32-bit count can never wrap. */
#define STORE_PIN_MAX (UINT32_MAX / 2)

/* Drops namespace ns_id: every unpinned committed block of it, in every tier, then the
 * namespace itself, whose id is free again. *dropped gets the blocks dropped. 0, -ENOENT, or
 * -EBUSY when blocks remain (pinned, reserved, moving, being quantized): the namespace stays,
 * without the blocks that could go. */
int store_ns_drop(struct store *s, uint32_t ns_id, uint64_t *dropped);

/* For store_policy.c. */
int store_handle_new(struct store *s, struct store_owner *o, uint8_t kind, uint16_t ns, uint32_t n,
                     struct store_handle **out);
void store_loc_fill(const struct block *b, struct kvc_wire_loc *loc);
void store_touch(struct store *s, uint32_t idx, uint64_t now);

#endif
