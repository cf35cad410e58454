/*
 * policy_hint.c — importance from signals: H2O, SnapKV, key-norm.
 *
 * DESIGN
 * H2O (Zhang et al., arXiv 2306.14048): heavy hitters are the tokens with the largest
 * accumulated attention; the client reports per-block attention mass (summed over the
 * block's tokens, layers and heads) with policy_hint(), which decays it with the shared
 * half-life, so the key log2(mass) + hint_time / half_life is time-invariant. A block with
 * no hint ranks as mass 2^-30 at its last access: by recency, below every heavy hitter.
 * SnapKV (Li et al., arXiv 2404.14469): the attention of the last prompt queries (the
 * observation window), pooled and summed per block, is reported once at prefill end into
 * `snap`; the key is that score, ties by recency through policy_rank.
 * Key-norm (Devoto et al., arXiv 2406.11430): keys with a low L2 norm draw the most
 * attention; the daemon computes the mean key norm at commit, no client help needed. A high
 * norm is evicted first; an unknown norm (0) ranks with the important blocks rather than be
 * evicted on no evidence. Sinks are kept under all three, as in the papers.
 */
#include <math.h>

#include "policies/policy_internal.h"

static int policy_hint_is_sink(const struct policy_block *b, const struct policy_params *p)
{
    return (b->flags & POLICY_BLOCK_SINK) || b->depth < p->sinks;
}

double policy_h2o_key(const struct policy_block *b, const struct policy_params *p)
{
    if (policy_hint_is_sink(b, p))
        return POLICY_KEY_KEEP;
    if (b->hint > 0)
        return policy_decayed_log(b->hint, b->hint_time, p);
    return policy_decayed_log(0x1p-30, b->last_access, p);
}

double policy_snapkv_key(const struct policy_block *b, const struct policy_params *p)
{
    if (policy_hint_is_sink(b, p))
        return POLICY_KEY_KEEP;
    return (double)b->snap;
}

double policy_keynorm_key(const struct policy_block *b, const struct policy_params *p)
{
    if (policy_hint_is_sink(b, p))
        return POLICY_KEY_KEEP;
    return b->key_norm > 0 ? -(double)b->key_norm : 0.0;
}
