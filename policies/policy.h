/*
 * policy.h — eviction / tiering / precision policies as pure functions.
 *
 * DESIGN
 * A policy sees an array of candidate blocks (a sample of the coldest unpinned leaves the
 * daemon collected, or every block in the simulator) and orders it: the first entry is the
 * one to act on first. It does no I/O, takes no lock and reads no clock: `now` is passed in,
 * so the daemon and the simulator run the same code and tests are table-driven.
 *
 * Every ranking policy is a *key*: policy_key() maps one block to a number, lower = act on it
 * first. Keys are time-invariant — a key changes only when the block's metadata changes (an
 * access, a hint, a child added or dropped), never because the clock moved — so a caller may
 * keep blocks in a heap ordered by key and get exactly the order policy_rank() would give at
 * any `now`. Decay is written in log space for that reason: a count decaying with half-life h
 * compares as log2(count) + last_access / h.
 *
 * Three entry points build on the key:
 *   policy_rank()   orders candidates (the daemon's eviction order);
 *   policy_decide() turns a ranked array and a pressure description into actions
 *                   (keep / quantize / offload / drop), enforcing the safety properties;
 *   policy_select() picks at most N blocks of one prefix for a budgeted read.
 * policy_touch() and policy_hint() are the metadata updates the caller applies on an access
 * or a client hint; policy_params_observe_reuse() adapts the decay half-life to the workload.
 */
#ifndef KVC_POLICY_H
#define KVC_POLICY_H

#include <stddef.h>
#include <stdint.h>

enum policy_kind {
    POLICY_LRU = 0,
    POLICY_LFU,       /* frequency with exponential decay (LRFU) */
    POLICY_PREFIX,    /* leaves first, shared prefixes protected, recompute cost by depth */
    POLICY_STREAMING, /* StreamingLLM: sinks kept, recency on the rest */
    POLICY_H2O,       /* heavy hitters: accumulated attention mass from client hints */
    POLICY_SNAPKV,    /* observation-window scores reported at prefill end */
    POLICY_KEYNORM,   /* low mean key L2 norm = important */
    POLICY_QUEST,     /* query-aware bound from per-channel key min/max (budgeted reads) */
    POLICY_DEFAULT,   /* composite: recency, decayed frequency, prefix value, hints */
    POLICY_VATP,      /* value-aware: H2O attention mass x mean value L1 norm */
    POLICY_KIND_COUNT
};

enum policy_block_flag {
    POLICY_BLOCK_PINNED = 1u << 0,    /* a client holds a lease: never act on it */
    POLICY_BLOCK_SINK = 1u << 1,      /* first block(s) of a sequence (attention sinks) */
    POLICY_BLOCK_PARTIAL = 1u << 2,   /* fewer tokens than the namespace's block_tokens */
    POLICY_BLOCK_QUANTIZED = 1u << 3, /* already stored in a lossy codec */
    POLICY_BLOCK_ON_DISK = 1u << 4,   /* lives in the disk tier */
};

/* What a policy may know of a block. The first six fields are the daemon's original view. */
struct policy_block {
    uint32_t id;          /* the caller's handle; policies never interpret it */
    uint32_t hits;        /* lookups that hit this block */
    uint64_t last_access; /* ms, same clock as `now` */
    uint64_t bytes;       /* room freed by evicting it */
    uint32_t depth;       /* position in its prefix: 0 for the first block */
    uint32_t children;    /* cached blocks whose parent it is */
    uint32_t flags;       /* enum policy_block_flag */
    float freq;           /* decayed access count as of last_access (policy_touch keeps it) */
    float hint;           /* H2O: accumulated attention mass as of hint_time (decays) */
    float snap;           /* SnapKV: pooled observation-window score, set once at prefill */
    float key_norm;       /* mean key L2 norm, computed by the daemon at commit; 0 = unknown */
    float value_norm;     /* mean value L1 norm per (token, layer, head), from the daemon's
                             quantize pass (VATP); 0 = unknown */
    uint64_t hint_time;   /* when `hint` was last updated */
};

/* Tunables shared by all policies; policy_params_init() gives the defaults. */
struct policy_params {
    double half_life;   /* decay half-life of freq and hint, in `now` units (> 0) */
    uint32_t sinks;     /* leading blocks treated as attention sinks */
    uint32_t recent;    /* trailing blocks of a prefix always kept by policy_select() */
    double depth_cost;  /* extra recompute cost per block of depth, relative to block 0 */
    double reuse_ewma;  /* running mean of the reuse interval; 0 = no sample yet */
    uint64_t reuse_n;   /* samples behind reuse_ewma */
    int adapt;          /* 1: half_life follows observed reuse intervals */
};

void policy_params_init(struct policy_params *p);
/* Feeds one observed reuse interval (a hit, or a miss on a recently evicted key); with
 * p->adapt the half-life becomes the mean of the intervals seen. */
void policy_params_observe_reuse(struct policy_params *p, uint64_t interval);

/* Policy by name ("lru"); -1 if unknown. */
int policy_from_name(const char *name);
const char *policy_name(enum policy_kind k);

/* Eviction key of one block under policy k: lower = act first. Pinned blocks and blocks
 * with cached children are not ordered here (policy_rank puts them last). */
double policy_key(enum policy_kind k, const struct policy_block *b,
                  const struct policy_params *p);

/* Orders b[0..n) in place: b[0] is the block to evict first. Blocks that may not be evicted
 * (pinned, or with cached children) sort after all others. Uses default params. */
void policy_rank(enum policy_kind k, struct policy_block *b, size_t n, uint64_t now);
/* Same, with explicit params. */
void policy_rank_params(enum policy_kind k, struct policy_block *b, size_t n, uint64_t now,
                        const struct policy_params *p);

/* A new block committed at `now`: freq 1, no hits yet. */
void policy_commit(struct policy_block *b, uint64_t now);
/* A lookup hit at `now`: hits, decayed freq, last_access. */
void policy_touch(struct policy_block *b, uint64_t now, const struct policy_params *p);
/* A client hint at `now`: attention mass added to the decayed H2O score. */
void policy_hint(struct policy_block *b, float mass, uint64_t now,
                 const struct policy_params *p);
/* Restores the frequency of a key evicted at `evicted_at` with decayed count `freq` and seen
 * again at `now` (ghost entry): freq carries over, decayed, plus this access. */
void policy_ghost_restore(struct policy_block *b, float freq, uint64_t evicted_at, uint64_t now,
                          const struct policy_params *p);

/* ---- precision ladder (policy_ladder.c) --------------------------------------------- */

/* A fast tier's split of its bytes between raw and each lossy rung, learnt from hits on
 * lossy blocks and from ghosts. Rung 0 is raw; rungs 1.. are the allowed codecs, most
 * precise first (policy_ladder_next). */
#define POLICY_LADDER_RUNGS 6
struct policy_ladder {
    uint32_t rungs;                   /* raw plus the allowed codecs */
    double below[POLICY_LADDER_RUNGS]; /* share of the tier rungs 0..k may hold (last: 1) */
    double lossy_weight;              /* what a lossy hit costs against a miss (0: nothing) */
    double step;                      /* one block's share of the tier */
};

void policy_ladder_init(struct policy_ladder *l, uint32_t rungs, double lossy_weight,
                        double capacity_blocks);
/* The rung whose coldest block frees the next room: *out = 0, one step down (a rung over
 * its target); *out = 1, out of the tier (every rung within its target: the last non-empty
 * one gives). bytes[k]: what rung k holds (in the unit of capacity); ready[k]: rung k has a
 * block it may act on. -1 when none has. */
int policy_ladder_pick(const struct policy_ladder *l, const double *bytes, double capacity,
                       const int *ready, int *out);
/* A hit on a block at rung `rung` (nothing for 0); a miss on a block dropped recently. */
void policy_ladder_hit(struct policy_ladder *l, uint32_t rung);
void policy_ladder_ghost_hit(struct policy_ladder *l);

/* ---- half-life tuning (policy_tune.c) ------------------------------------------------ */

/* Miniature LRFU caches, one per candidate half-life, over a hash-sampled key stream; the
 * half-life of the one with the most hits is the recommendation. Keys only, pure state
 * (the caller owns it, one per cache/namespace). */
#define POLICY_TUNE_CANDIDATES 6
#define POLICY_TUNE_MINI 4096  /* mini cache capacity at most (sampling rate = mini / cap) */
#define POLICY_TUNE_HISTORY 16 /* key history kept, as a multiple of the mini capacity */
#define POLICY_TUNE_TC_MOVE 0.10 /* relative change of the turnover time that rekeys */
/* Hysteresis: a candidate replaces the current one when its hits lead by more than this many
 * standard errors of the lead (the square root of the references only one of the two hit). */
#define POLICY_TUNE_MARGIN 2.0

struct policy_tune_rec;
struct policy_tune {
    uint64_t capacity;  /* the real cache's capacity, in blocks */
    uint32_t m;         /* mini cache capacity */
    double rate;        /* key sampling rate m / capacity */
    double tc;          /* characteristic time: `now` units per `capacity` references */
    uint64_t t0, refs, sampled;
    double h[POLICY_TUNE_CANDIDATES];    /* candidate half-lives */
    double hits[POLICY_TUNE_CANDIDATES]; /* decayed hit counts of each mini cache */
    /* decayed count of the references that mini c hit and mini d missed, or the reverse */
    double split[POLICY_TUNE_CANDIDATES][POLICY_TUNE_CANDIDATES];
    int best;
    struct policy_tune_rec *rec;         /* key history */
    uint32_t rcap, nrec, hand;
    uint32_t *idx, icap;                 /* key -> record, open addressing */
    uint32_t *heap[POLICY_TUNE_CANDIDATES];
    uint32_t n[POLICY_TUNE_CANDIDATES];
    double *hkey[POLICY_TUNE_CANDIDATES];
};

/* 0, -EINVAL (capacity 0) or -ENOMEM. */
int policy_tune_init(struct policy_tune *t, uint64_t capacity);
void policy_tune_free(struct policy_tune *t);
/* One block reference (a lookup hit or miss, or a commit), in prefix order. */
void policy_tune_access(struct policy_tune *t, uint64_t key, uint32_t depth, uint64_t now);
/* The half-life to rank with (policy_params.half_life, adapt off); 0 = no advice yet. */
double policy_tune_half_life(const struct policy_tune *t);

/* ---- actions ------------------------------------------------------------------------ */

enum policy_action_kind {
    POLICY_ACTION_KEEP = 0,
    POLICY_ACTION_QUANTIZE, /* store in a lossy codec in the same tier */
    POLICY_ACTION_OFFLOAD,  /* move to the disk tier */
    POLICY_ACTION_DROP,     /* free it */
};

/* Codecs, from most to least precise (attention error on keys with outlier channels,
 * docs/kernels.md). RAW is the namespace dtype. The numbers are the policies' own. */
enum policy_codec {
    POLICY_CODEC_RAW = 0,
    POLICY_CODEC_Q8,      /* q8_0: 34 B / 32 values */
    POLICY_CODEC_FP8,     /* e4m3 */
    POLICY_CODEC_Q5,      /* q5_1: 24 B / 32 values */
    POLICY_CODEC_ROT4,    /* rotated keys, KIVI 4 bit */
    POLICY_CODEC_KIVI4,   /* keys per channel, values per token, 4 bit */
    POLICY_CODEC_MERGE,   /* adjacent similar tokens stored once: half a block */
    POLICY_CODEC_LOWRANK, /* low-rank keys, q8_0 values */
    POLICY_CODEC_Q4,      /* q4_1: 20 B / 32 values */
    POLICY_CODEC_ROT2,    /* rotated keys, KIVI 2 bit */
    POLICY_CODEC_KIVI2,   /* 2 bit */
    POLICY_CODEC_COUNT
};
#define POLICY_MAX_LAYERS 256

/* Size of a codec relative to fp16 RAW. */
double policy_codec_ratio(enum policy_codec c);
/* The next rung below cur among the codecs mask allows (1u << POLICY_CODEC_*), smaller than
 * cur, largest first, the more precise of equal sizes first: q8_0, fp8, merge, lowrank,
 * q5_1, rot4, kivi4, q4_1, rot2, kivi2; RAW when none is left (the
 * next step is out of the tier). From RAW: the first allowed. */
enum policy_codec policy_ladder_next(uint32_t codecs, enum policy_codec cur);
const char *policy_codec_name(enum policy_codec c);

/* What the tier engine can do now. */
struct policy_pressure {
    uint64_t bytes_to_free; /* stop once this much is freed */
    uint32_t actions;       /* mask of 1u << POLICY_ACTION_*: which actions are available */
    uint32_t codecs;        /* mask of 1u << POLICY_CODEC_* the namespace allows; RAW always */
    uint32_t layers;        /* layers of the namespace; 0 = unknown (one codec for all) */
    const uint8_t *layer_codec; /* borrowed: per-layer codec plan (PyramidKV-style); NULL =
                                   the most precise allowed lossy codec on every layer */
    uint32_t offload_min_hits; /* hits a leaf needs to be offloaded rather than dropped (the
                                  daemon's disk.admit_hits); a block with cached children
                                  cannot be dropped, so it may always be offloaded */
    double miss_cost;       /* cost of recomputing block 0, in the unit of disk_cost */
    double disk_cost;       /* cost of reading one block back from disk */
};

struct policy_action {
    uint32_t id;              /* policy_block.id */
    uint8_t action;           /* enum policy_action_kind */
    uint8_t codec;            /* QUANTIZE: the codec of layers without a plan entry */
    uint64_t bytes_freed;     /* room this action frees in the pressured tier */
    const uint8_t *layer_codec; /* QUANTIZE: per-layer plan (borrowed from the pressure) */
};

/* Ranks b[0..n) with policy k and chooses an action per block until bytes_to_free is met.
 * out[] receives one entry per block that was acted on, in order; returns their count.
 * Never acts on a pinned block, never drops a block with cached children, never quantizes
 * where pressure->codecs allows no lossy codec (or a layer plan names a disallowed codec),
 * never quantizes a sink block. */
size_t policy_decide(enum policy_kind k, struct policy_block *b, size_t n, uint64_t now,
                     const struct policy_params *p, const struct policy_pressure *pr,
                     struct policy_action *out);
/* Bytes a block of `bytes` takes after quantizing with the pressure's plan; 0 if no lossy
 * plan is allowed. */
uint64_t policy_quantized_bytes(const struct policy_pressure *pr, uint64_t bytes);

/* ---- budgeted reads ----------------------------------------------------------------- */

/* A client query for Quest: q[dim]; per block i, kmin[i*dim..] and kmax[i*dim..] (the
 * per-channel key minimum and maximum over the block, summed over the heads/layers the
 * caller wants folded into one vector). */
struct policy_query {
    const float *q;
    const float *kmin;
    const float *kmax;
    uint32_t dim;
};

/* Quest's upper bound of q·k over a block: sum_i max(q_i * kmax_i, q_i * kmin_i). */
double policy_quest_bound(const float *q, const float *kmin, const float *kmax, uint32_t dim);

/* Budgeted read: b[0..n) are the blocks of one prefix in position order. Writes at most
 * `budget` positions (indices into b) to pos[], ascending, and returns their count. The
 * first p->sinks and the last p->recent positions are always chosen first (sinks before
 * the window when the budget is smaller); the rest by the policy's importance: Quest by
 * the bound for q (falls back to key-norm without a query), H2O by decayed attention, SnapKV
 * by its score, key-norm by low norm, the others by their eviction key. */
size_t policy_select(enum policy_kind k, const struct policy_block *b, size_t n, size_t budget,
                     uint64_t now, const struct policy_params *p, const struct policy_query *q,
                     uint32_t *pos);

#endif
