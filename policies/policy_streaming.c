/*
 * policy_streaming.c — StreamingLLM (Xiao et al., arXiv 2309.17453) at block granularity.
 *
 * DESIGN
 * StreamingLLM keeps the first tokens (attention sinks) and a window of the most recent
 * ones. In block form: the sink blocks (flag SINK, or depth < params.sinks) are never
 * ranked for eviction before anything else, the rest go by recency; for budgeted reads
 * policy_select keeps the sinks and the last `recent` blocks and takes nothing from the
 * middle unless the budget allows (the middle is demoted first).
 */
#include "policies/policy_internal.h"

static int policy_streaming_is_sink(const struct policy_block *b, const struct policy_params *p)
{
    return (b->flags & POLICY_BLOCK_SINK) || b->depth < p->sinks;
}

double policy_streaming_key(const struct policy_block *b, const struct policy_params *p)
{
    if (policy_streaming_is_sink(b, p))
        return POLICY_KEY_KEEP;
    return (double)b->last_access;
}
