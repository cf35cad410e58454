/*
 * policy_baseline.c — the cache baselines: LRU and LFU with exponential decay.
 *
 * DESIGN
 * LRU: the least recently accessed block goes first.
 *
 * LFU with decay (LRFU, Lee et al. 1999/2001) is the frequency-aware baseline. It was chosen
 * over S3-FIFO and ARC because it is a pure per-block key: S3-FIFO and ARC decide from queue
 * membership and queue sizes, state that a sample of block metadata does not carry, whereas
 * a decayed count needs one float per block and ranks the same in a sampled daemon and in an
 * exact simulator. Each access adds 1 to a count that halves every `half_life`; the key
 * log2(count) + last_access / half_life orders blocks by their count decayed to any common
 * `now`. With a half-life near the workload's reuse interval (policy_params adapts it) it
 * spans LFU (long half-life) and LRU (short one); ghost entries (policy_ghost_restore) give
 * back the count of a block evicted recently, the role ARC's and S3-FIFO's ghost lists play.
 */
#include "policies/policy_internal.h"

double policy_lru_key(const struct policy_block *b, const struct policy_params *p)
{
    (void)p;
    return (double)b->last_access;
}

double policy_lfu_key(const struct policy_block *b, const struct policy_params *p)
{
    return policy_decayed_log(b->freq > 0 ? b->freq : 1.0, b->last_access, p);
}
