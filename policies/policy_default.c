/*
 * policy_default.c — the composite default policy.
 *
 * DESIGN
 * The key estimates, in log2, the value of keeping a block: how likely it is reused soon
 * times what a miss would cost.
 *   - reuse: the decayed access count (LRFU, see policy_baseline.c): recency and frequency
 *     in one number, with ghost entries restoring the count of recently evicted keys, and
 *     the half-life chosen by measurement: policy_tune runs miniature caches with half-lives
 *     from LRU to LFU and the caller ranks with the winner's (the observed-interval rule of
 *     policy_params is the fallback), so no time constant is fitted to a workload;
 *   - prefix value: log2(1 + children) and log2(recompute cost by depth), as in
 *     policy_prefix.c; eviction itself only ever takes leaves;
 *   - hints: when a client reported attention mass (H2O) or an observation-window score
 *     (SnapKV), log2(1 + score) adds to the value — a hint can raise a block, never lower
 *     one a client did not describe;
 *   - partial blocks (fewer tokens than block_tokens) lose 5 (a factor 32): any longer prompt
 *     extends the block and so hashes to another key; only an identical prompt can hit it.
 * Sinks are not protected here: in a cache of many sequences block 0 is shared and kept by
 * its children and its count; for selection within one sequence policy_select keeps them.
 */
#include <math.h>

#include "policies/policy_internal.h"

double policy_default_key(const struct policy_block *b, const struct policy_params *p)
{
    double k = policy_decayed_log(b->freq > 0 ? b->freq : 1.0, b->last_access, p);
    k += log2(1.0 + (double)b->children) + log2(policy_prefix_cost(b, p));
    if (b->hint > 0)
        k += log2(1.0 + b->hint);
    if (b->snap > 0)
        k += log2(1.0 + b->snap);
    if (b->flags & POLICY_BLOCK_PARTIAL)
        k -= 5.0;
    return k;
}
