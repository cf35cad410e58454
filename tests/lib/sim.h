/*
 * sim.h — trace-driven cache simulator over the policies/ library (kvcsim, bench_sim and
 * check_sim share it).
 */
#ifndef KVC_SIM_H
#define KVC_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "policies/policy.h"

#define SIM_BLOCK_TOKENS 512

struct sim_req {
    uint64_t ts;        /* ms from the trace start */
    uint32_t input_len; /* prompt tokens */
    uint32_t off, len;  /* its blocks: sim_trace.ids[off .. off+len) */
};

struct sim_trace {
    struct sim_req *req;
    size_t nreq;
    uint32_t *ids; /* dense block ids, 0 .. nblocks-1, in reference order */
    size_t nref;
    uint32_t nblocks;
};

/* Parses Mooncake JSONL text (timestamp, input_length, hash_ids per line). 0 or -errno:
 * -EINVAL on a malformed line, -ENOMEM. */
int sim_trace_parse(struct sim_trace *t, const char *text, size_t len);
int sim_trace_load(struct sim_trace *t, const char *path);
void sim_trace_free(struct sim_trace *t);

/* Not policies: the offline oracle and the unbounded cache. */
#define SIM_POLICY_MIN 1000
#define SIM_POLICY_INFINITE 1001

/* Name -> policy_kind, SIM_POLICY_MIN ("min"), SIM_POLICY_INFINITE ("inf"); -1 unknown. */
int sim_policy_from_name(const char *name);

/* The kernel codec (enum kern_codec) of a ladder rung's policy codec, whose error bounds and
 * sizes the simulator's ladder is judged by; -1 for no such codec. */
int sim_kern_codec(enum policy_codec c);
const char *sim_policy_name(int policy);

struct sim_config {
    int policy;           /* enum policy_kind, SIM_POLICY_MIN or SIM_POLICY_INFINITE */
    double capacity;      /* fast-tier room, in full-precision blocks */
    int codec;            /* enum policy_codec allowed for quantizing; 0 = none */
    uint64_t disk_blocks; /* disk-tier capacity in blocks; 0 = no disk tier */
    double ghost_factor;  /* ghost entries kept, as a multiple of capacity */
    int adapt;            /* 1: the decay half-life follows observed reuse intervals */
    double half_life;     /* initial (or, without adapt, fixed) half-life in requests */
    int tune;             /* 1: half-life from policy_tune (miniature simulations); the
                             default policy's setting, sim_config_init leaves it -1 = auto */
    uint32_t admit_hits;  /* the daemon's disk admission: a leaf hit fewer times than this
                             is dropped where the policy would offload it (0: all admitted) */
    uint32_t ladder;      /* codecs (1u << POLICY_CODEC_*) of the precision ladder
                             (policy_ladder.c); 0: none (then `codec` quantizes victims) */
    double lossy_weight;  /* the ladder's cost of a lossy hit against a miss */
    uint32_t procs;       /* clients replaying in turn (kvcreplay -p): a request's new blocks
                             hold their room raw and pinned, and are nobody's hit, until the
                             next procs - 1 requests have looked up (0 or 1: at once); a
                             request that meets one misses it and goes on below it */
    double codec_room[POLICY_CODEC_COUNT]; /* room a block in codec c takes, in raw blocks
                                              (what the store's slots cost, kvcsim --layout);
                                              0: policy_codec_ratio(c) */
};

void sim_config_init(struct sim_config *c);

struct sim_result {
    uint64_t refs;        /* block references */
    uint64_t hits_full;   /* hits at full precision in the fast tier */
    uint64_t hits_lossy;  /* hits on a quantized block */
    uint64_t hits_disk;   /* hits served from the disk tier */
    uint64_t prefix_hits; /* hits before each request's first miss */
    uint64_t tokens;      /* tokens referenced */
    uint64_t token_hits;  /* tokens of blocks hit */
    uint64_t disk_writes; /* blocks written to disk */
    double half_life;     /* final decay half-life (requests) */
    uint64_t hits_codec[POLICY_CODEC_COUNT]; /* lossy hits by the codec that served them */
    uint64_t ladder_steps;  /* steps down the ladder (quantizations, raw to a codec or down) */
    double raw_share;       /* the ladder's final raw share (1 without one) */
    uint64_t busy;          /* references to a block another request was still writing */
    uint64_t evictions;     /* blocks that left the cache (the fast tier, or disk with one) */
    uint64_t ghost_hits;    /* misses on a block evicted within the ghost window */
    uint32_t rungs;         /* the ladder's rungs (raw included), their codecs by rung */
    uint8_t rung_codec[POLICY_LADDER_RUNGS];
};

static inline double sim_ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0.0;
}

/* Replays t under c. 0 or -ENOMEM / -EINVAL. */
int sim_run(const struct sim_trace *t, const struct sim_config *c, struct sim_result *r);

#endif
