/*
 * policy_select.c — budgeted reads: at most N blocks of one prefix, chosen by a policy.
 *
 * DESIGN
 * An engine running with a sparse KV asks for "this prefix, at most N blocks". The sinks
 * (first params.sinks blocks) and the recent window (last params.recent) are always taken
 * first — StreamingLLM's finding, and every selection paper keeps them; the rest of the
 * budget goes to the most important middle blocks, by the policy's signal:
 *   Quest (Tang et al., arXiv 2406.10774): with a client query q and per-block per-channel
 *     key min/max, sum_i max(q_i * max_i, q_i * min_i) bounds q·k from above for every key
 *     of the block, so the blocks with the largest bound hold the largest possible scores;
 *     without a query it falls back to key-norm;
 *   H2O, SnapKV, key-norm: their scores (importance = the eviction key, higher = keep);
 *   the others: their eviction key (recent / frequent first).
 * Ties go to the later position. The result is sorted by position, ready to gather.
 */
#include <stdlib.h>

#include "policies/policy_internal.h"

double policy_quest_bound(const float *q, const float *kmin, const float *kmax, uint32_t dim)
{
    double s = 0;
    for (uint32_t i = 0; i < dim; i++) {
        double a = (double)q[i] * kmax[i], c = (double)q[i] * kmin[i];
        s += a > c ? a : c;
    }
    return s;
}

struct policy_select_ent {
    double score;
    uint32_t pos;
};

static int policy_select_cmp(const void *pa, const void *pb)
{
    const struct policy_select_ent *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    return a->pos > b->pos ? -1 : a->pos < b->pos;
}

static int policy_select_pos_cmp(const void *pa, const void *pb)
{
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    return a < b ? -1 : a > b;
}

static double policy_select_score(enum policy_kind k, const struct policy_block *b, size_t i,
                                  const struct policy_params *p, const struct policy_query *q)
{
    struct policy_block x = b[i];
    x.flags &= ~POLICY_BLOCK_SINK; /* sinks are handled by position here */
    x.depth = UINT32_MAX;
    if (k == POLICY_QUEST && q && q->q && q->kmin && q->kmax && q->dim)
        return policy_quest_bound(q->q, q->kmin + i * q->dim, q->kmax + i * q->dim, q->dim);
    if (k == POLICY_QUEST)
        k = POLICY_KEYNORM;
    return policy_key(k, &x, p);
}

size_t policy_select(enum policy_kind k, const struct policy_block *b, size_t n, size_t budget,
                     uint64_t now, const struct policy_params *p, const struct policy_query *q,
                     uint32_t *pos)
{
    size_t m = 0;
    (void)now;
    if (budget > n)
        budget = n;
    size_t sinks = p->sinks < n ? p->sinks : n;
    size_t recent = p->recent < n - sinks ? p->recent : n - sinks;

    for (size_t i = 0; i < sinks && m < budget; i++)
        pos[m++] = (uint32_t)i;
    for (size_t i = 0; i < recent && m < budget; i++)
        pos[m++] = (uint32_t)(n - 1 - i);
    size_t lo = sinks, hi = n - recent;
    if (m < budget && hi > lo) {
        struct policy_select_ent *e = malloc((hi - lo) * sizeof(*e));
        if (e) {
            for (size_t i = lo; i < hi; i++) {
                e[i - lo].pos = (uint32_t)i;
                e[i - lo].score = policy_select_score(k, b, i, p, q);
            }
            qsort(e, hi - lo, sizeof(*e), policy_select_cmp);
            for (size_t i = 0; i < hi - lo && m < budget; i++)
                pos[m++] = e[i].pos;
            free(e);
        } else {
            /* No memory to rank: the newest middle blocks, StreamingLLM's choice. */
            for (size_t i = hi; i > lo && m < budget; i--)
                pos[m++] = (uint32_t)(i - 1);
        }
    }
    qsort(pos, m, sizeof(*pos), policy_select_pos_cmp);
    return m;
}
