/*
 * policy_decide.c — from a ranking to actions: keep, quantize, offload, drop.
 *
 * DESIGN
 * The candidates are ranked with the policy; walking from the first, each block gets the
 * cheapest action that frees room, until bytes_to_free is met. What a future miss costs
 * decides between them:
 *   - quantize (lossy hit instead of a miss; costs precision, not a recompute): for a full
 *     precision, non-sink block, when the namespace allows a lossy codec and the block has
 *     shown reuse (hits or a carried-over count above one access) — quantizing a block that
 *     was never reused spends work on what is most likely dead;
 *   - offload (a disk read instead of a recompute): when a disk tier is available, the
 *     block has the hits the pressure's admission asks for (offload_min_hits: the daemon's
 *     disk.admit_hits, 0 by default as measured in docs/disk.md; 1 spends SSD writes only on
 *     blocks hit before, as Dynamo's KVBM does) or has cached children, and reading it back
 *     is cheaper than recomputing it (disk_cost < miss_cost * recompute-cost-by-depth);
 *   - drop: a leaf (no cached children) otherwise;
 *   - keep: an inner block no other action applies to.
 * Properties that hold for every policy, whatever the ranking: a pinned block is never acted
 * on; a block with cached children is never dropped; nothing is quantized where the pressure
 * allows no lossy codec or the layer plan names a codec the namespace does not allow; a sink
 * block is never quantized (sinks draw attention out of proportion: IntactKV, KVQuant).
 */
#include "policies/policy_internal.h"

/* At head_dim 128 and 32 tokens a block (the daemon measures its own layout's). */
static const double policy_codec_ratios[POLICY_CODEC_COUNT] = {
    [POLICY_CODEC_RAW] = 1.0,
    [POLICY_CODEC_Q8] = 34.0 / 64.0,
    [POLICY_CODEC_FP8] = 0.5,
    [POLICY_CODEC_Q5] = 24.0 / 64.0,
    [POLICY_CODEC_ROT4] = 0.25 + 0.0625,
    [POLICY_CODEC_KIVI4] = 0.25 + 0.0625,
    [POLICY_CODEC_MERGE] = 0.5,
    [POLICY_CODEC_LOWRANK] = 0.425,
    [POLICY_CODEC_Q4] = 20.0 / 64.0,
    [POLICY_CODEC_ROT2] = 0.125 + 0.0625,
    [POLICY_CODEC_KIVI2] = 0.125 + 0.0625,
};
static const char *const policy_codec_names[POLICY_CODEC_COUNT] = {
    [POLICY_CODEC_RAW] = "raw",         [POLICY_CODEC_Q8] = "q8_0",
    [POLICY_CODEC_FP8] = "fp8",         [POLICY_CODEC_ROT4] = "rot4",
    [POLICY_CODEC_KIVI4] = "kivi4",     [POLICY_CODEC_MERGE] = "merge",
    [POLICY_CODEC_LOWRANK] = "lowrank", [POLICY_CODEC_Q4] = "q4_1",
    [POLICY_CODEC_ROT2] = "rot2",       [POLICY_CODEC_KIVI2] = "kivi2",
    [POLICY_CODEC_Q5] = "q5_1",
};

double policy_codec_ratio(enum policy_codec c)
{
    return (unsigned)c < POLICY_CODEC_COUNT ? policy_codec_ratios[c] : 1.0;
}

const char *policy_codec_name(enum policy_codec c)
{
    return (unsigned)c < POLICY_CODEC_COUNT ? policy_codec_names[c] : "?";
}

/* The most precise lossy codec the namespace allows; RAW if none. */
static enum policy_codec policy_decide_codec(const struct policy_pressure *pr)
{
    for (int c = POLICY_CODEC_RAW + 1; c < POLICY_CODEC_COUNT; c++)
        if (pr->codecs & (1u << c))
            return (enum policy_codec)c;
    return POLICY_CODEC_RAW;
}

/* 1 when the layer plan only names allowed codecs and at least one is lossy. */
static int policy_decide_plan_ok(const struct policy_pressure *pr)
{
    int lossy = 0;
    if (pr->layers > POLICY_MAX_LAYERS)
        return 0;
    for (uint32_t l = 0; l < pr->layers; l++) {
        uint8_t c = pr->layer_codec[l];
        if (c >= POLICY_CODEC_COUNT)
            return 0;
        if (c != POLICY_CODEC_RAW && !(pr->codecs & (1u << c)))
            return 0;
        lossy |= c != POLICY_CODEC_RAW;
    }
    return lossy;
}

uint64_t policy_quantized_bytes(const struct policy_pressure *pr, uint64_t bytes)
{
    if (pr->layer_codec && pr->layers) {
        if (!policy_decide_plan_ok(pr))
            return 0;
        double r = 0;
        for (uint32_t l = 0; l < pr->layers; l++)
            r += policy_codec_ratio(pr->layer_codec[l]);
        return (uint64_t)((double)bytes * r / (double)pr->layers + 0.5);
    }
    enum policy_codec c = policy_decide_codec(pr);
    if (c == POLICY_CODEC_RAW)
        return 0;
    return (uint64_t)((double)bytes * policy_codec_ratio(c) + 0.5);
}

static int policy_decide_reused(const struct policy_block *b)
{
    return b->hits > 0 || b->freq > 1.5f;
}

size_t policy_decide(enum policy_kind k, struct policy_block *b, size_t n, uint64_t now,
                     const struct policy_params *p, const struct policy_pressure *pr,
                     struct policy_action *out)
{
    size_t m = 0;
    uint64_t freed = 0;
    uint64_t (*qbytes)(const struct policy_pressure *, uint64_t) = policy_quantized_bytes;

    policy_rank_params(k, b, n, now, p);
    for (size_t i = 0; i < n && freed < pr->bytes_to_free; i++) {
        const struct policy_block *x = &b[i];
        struct policy_action a = { .id = x->id, .action = POLICY_ACTION_KEEP };
        int sink = (x->flags & POLICY_BLOCK_SINK) != 0;
        uint64_t qb = qbytes(pr, x->bytes);
        double miss = pr->miss_cost * policy_prefix_cost(x, p);

        if (x->flags & POLICY_BLOCK_PINNED)
            continue;
        if ((pr->actions & (1u << POLICY_ACTION_QUANTIZE)) && qb > 0 && qb < x->bytes &&
            !sink && !(x->flags & (POLICY_BLOCK_QUANTIZED | POLICY_BLOCK_ON_DISK)) &&
            !(x->flags & POLICY_BLOCK_PARTIAL) && policy_decide_reused(x)) {
            a.action = POLICY_ACTION_QUANTIZE;
            a.codec = (uint8_t)policy_decide_codec(pr);
            a.layer_codec = pr->layers ? pr->layer_codec : NULL;
            a.bytes_freed = x->bytes - qb;
        } else if ((pr->actions & (1u << POLICY_ACTION_OFFLOAD)) &&
                   !(x->flags & POLICY_BLOCK_ON_DISK) &&
                   (x->hits >= pr->offload_min_hits || x->children > 0) &&
                   pr->disk_cost < miss) {
            a.action = POLICY_ACTION_OFFLOAD;
            a.bytes_freed = x->bytes;
        } else if ((pr->actions & (1u << POLICY_ACTION_DROP)) && x->children == 0) {
            a.action = POLICY_ACTION_DROP;
            a.bytes_freed = x->bytes;
        } else {
            continue;
        }
        freed += a.bytes_freed;
        out[m++] = a;
    }
    return m;
}
