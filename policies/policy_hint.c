/*
 * policy_hint.c — importance from signals: H2O, SnapKV, key-norm, VATP.
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
 * evicted on no evidence. Sinks are kept under all four, as in the papers.
 * VATP (Guo et al., arXiv 2406.12335): a token's importance is its attention times the L1
 * norm of its value vector, since a token with a small value adds little to the output
 * whatever its attention. Per block: the decayed H2O mass times the mean value L1 norm the
 * daemon measures where it reads the block (the quantize pass); the key is
 * log2(mass) + log2(norm) + hint_time / half_life, time-invariant as H2O's. An unknown norm
 * (0: the block was never read by the pass) counts as 1, so such a block ranks as under H2O.
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

double policy_vatp_key(const struct policy_block *b, const struct policy_params *p)
{
    double k = policy_h2o_key(b, p);
    if (k == POLICY_KEY_KEEP || !(b->value_norm > 0))
        return k;
    return k + log2((double)b->value_norm);
}
