/*
 * policy_prefix.c — prefix-aware ranking.
 *
 * DESIGN
 * Only leaves of the prefix tree are ever evicted (policy_rank puts blocks with cached
 * children last, and the daemon samples leaves), so a shared prefix outlives every branch
 * hanging from it. Among the rest the key is recency (in half-lives) plus two values:
 *   log2(1 + children): a block several prefixes branch from serves each of them, and
 *     matters once a block with children can be demoted (quantized or offloaded);
 *   log2(recompute cost): recomputing block d attends over d earlier blocks, so its cost
 *     grows with depth: 1 + depth_cost * depth relative to block 0 (depth_cost = the share
 *     of attention in a block's prefill at depth 1; 0 = cost flat).
 */
#include <math.h>

#include "policies/policy_internal.h"

double policy_prefix_cost(const struct policy_block *b, const struct policy_params *p)
{
    return 1.0 + p->depth_cost * (double)b->depth;
}

double policy_prefix_key(const struct policy_block *b, const struct policy_params *p)
{
    return (double)b->last_access / p->half_life + log2(1.0 + (double)b->children) +
           log2(policy_prefix_cost(b, p));
}
