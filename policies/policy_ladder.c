/*
 * policy_ladder.c — the precision ladder: how a fast tier splits its bytes between full
 * precision and the lossy codecs a namespace allows, learnt online.
 *
 * DESIGN
 * A block steps down one rung at a time: raw (rung 0), then each allowed codec from the
 * most to the least precise (policy_ladder_next), then out of the tier (to disk, or
 * dropped). The tier keeps one order by policy key per rung. To free room it acts on the
 * coldest block of one rung: one step down, or out from the last. policy_ladder_pick says
 * which rung, from targets `below[k]`: the share of the tier's bytes that rungs 0..k may
 * hold. The first rung whose cumulative bytes exceed its target gives one step down; when
 * none does, the coldest block of the last non-empty rung leaves the tier (a raw block under
 * a raw target of 1 goes out as without a ladder, never through every codec on its way).
 * The targets move the way ARC moves its split between recency and frequency: a hit on a
 * block at rung j is a hit a larger share for rungs above j would have served at better
 * precision, and raises every below[k], k < j, by lossy_weight steps; a miss on a block
 * dropped recently (a ghost) is a hit more compression would have kept, and lowers every
 * target by one step. lossy_weight states what a lossy hit costs against a miss: 0 sends
 * every block that may be smaller to the last rung before anything leaves (the most hits
 * the allowed codecs give); a large weight keeps blocks raw unless misses pay for it. One
 * number per namespace; nothing fitted to a trace. A step is one block's share of the tier.
 * Pure state: no I/O, no clock; the caller owns one per tier and namespace.
 */
#include "policies/policy.h"

void policy_ladder_init(struct policy_ladder *l, uint32_t rungs, double lossy_weight,
                        double capacity_blocks)
{
    l->rungs = rungs < 1 ? 1 : rungs > POLICY_LADDER_RUNGS ? POLICY_LADDER_RUNGS : rungs;
    l->lossy_weight = lossy_weight > 0 ? lossy_weight : 0.0;
    l->step = capacity_blocks >= 1.0 ? 1.0 / capacity_blocks : 1.0;
    for (uint32_t k = 0; k < POLICY_LADDER_RUNGS; k++)
        l->below[k] = k + 1 >= l->rungs ? 1.0 : (double)(k + 1) / (double)l->rungs;
}

int policy_ladder_pick(const struct policy_ladder *l, const double *bytes, double capacity,
                       const int *ready, int *out)
{
    double cum = 0;
    *out = 0;
    for (uint32_t k = 0; k + 1 < l->rungs; k++) {
        cum += bytes[k];
        if (ready[k] && cum > l->below[k] * capacity)
            return (int)k;
    }
    *out = 1;
    for (uint32_t k = l->rungs; k-- > 0;)
        if (ready[k])
            return (int)k;
    return -1;
}

void policy_ladder_hit(struct policy_ladder *l, uint32_t rung)
{
    for (uint32_t k = 0; k < rung && k + 1 < l->rungs; k++) {
        double s = l->below[k] + l->lossy_weight * l->step;
        l->below[k] = s > 1.0 ? 1.0 : s;
    }
}

void policy_ladder_ghost_hit(struct policy_ladder *l)
{
    for (uint32_t k = 0; k + 1 < l->rungs; k++) {
        double s = l->below[k] - l->step;
        l->below[k] = s < 0.0 ? 0.0 : s;
    }
}

enum policy_codec policy_ladder_next(uint32_t codecs, enum policy_codec cur)
{
    /* Rungs by size, largest first: what a step down costs least in fidelity; of equal
     * sizes the more precise (a rotated 4-bit key before a plain one). */
    static const enum policy_codec order[] = {
        POLICY_CODEC_Q8,   POLICY_CODEC_FP8,  POLICY_CODEC_MERGE, POLICY_CODEC_LOWRANK,
        POLICY_CODEC_Q5,   POLICY_CODEC_ROT4, POLICY_CODEC_KIVI4, POLICY_CODEC_Q4,
        POLICY_CODEC_ROT2, POLICY_CODEC_KIVI2};
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
        if ((codecs & (1u << order[i])) && policy_codec_ratio(order[i]) < policy_codec_ratio(cur))
            return order[i];
    return POLICY_CODEC_RAW;
}
