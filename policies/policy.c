/*
 * policy.c — policy table, parameters, metadata updates and ranking.
 *
 * DESIGN
 * The ranking order is total so the daemon and the simulator agree exactly: blocks that may
 * be evicted (unpinned leaves of the prefix tree) first, then the policy key ascending, then
 * the deeper block (its prefix is longer, so fewer requests share it), then the lower id.
 * Under LRU that is "least recently accessed first" as before.
 *
 * The decay half-life adapts when asked: every hit and every miss on a recently evicted key
 * is a reuse interval, and the half-life becomes the mean of those intervals (a running
 * mean over the last ~4096). A count then loses half its weight over one mean reuse
 * interval of this workload, whatever the clock unit or the trace. The arithmetic mean, not
 * the geometric one: the intervals a cache can observe are cut off by its own size, and the
 * long tail is what frequency has to bridge.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "policies/policy.h"
#include "policies/policy_internal.h"

static const char *const policy_names[POLICY_KIND_COUNT] = {
    [POLICY_LRU] = "lru",         [POLICY_LFU] = "lfu",
    [POLICY_PREFIX] = "prefix",   [POLICY_STREAMING] = "streaming",
    [POLICY_H2O] = "h2o",         [POLICY_SNAPKV] = "snapkv",
    [POLICY_KEYNORM] = "keynorm", [POLICY_QUEST] = "quest",
    [POLICY_DEFAULT] = "default", [POLICY_VATP] = "vatp",
};

int policy_from_name(const char *name)
{
    for (int k = 0; k < POLICY_KIND_COUNT; k++)
        if (name && strcmp(name, policy_names[k]) == 0)
            return k;
    return -1;
}

const char *policy_name(enum policy_kind k)
{
    return (unsigned)k < POLICY_KIND_COUNT ? policy_names[k] : "?";
}

void policy_params_init(struct policy_params *p)
{
    memset(p, 0, sizeof(*p));
    p->half_life = 60000.0; /* one minute of ms until reuse intervals are observed */
    p->sinks = 1;
    p->recent = 2;
    p->depth_cost = 0.0;
    p->adapt = 1;
}

void policy_params_observe_reuse(struct policy_params *p, uint64_t interval)
{
    double l = (double)interval;
    /* A plain mean for the first samples, then a window of about 4096 intervals. */
    double w = p->reuse_n < 4096 ? 1.0 / (double)(p->reuse_n + 1) : 1.0 / 4096.0;
    p->reuse_ewma += w * (l - p->reuse_ewma);
    p->reuse_n++;
    if (p->adapt && p->reuse_n >= 16)
        p->half_life = fmax(1.0, p->reuse_ewma);
}

double policy_decayed_log(double count, uint64_t at, const struct policy_params *p)
{
    return log2(count > 1e-30 ? count : 1e-30) + (double)at / p->half_life;
}

static double policy_decay(double count, uint64_t from, uint64_t to,
                           const struct policy_params *p)
{
    if (to <= from)
        return count;
    return count * exp2(-(double)(to - from) / p->half_life);
}

void policy_commit(struct policy_block *b, uint64_t now)
{
    b->freq = 1.0f;
    b->hits = 0;
    b->last_access = now;
}

void policy_touch(struct policy_block *b, uint64_t now, const struct policy_params *p)
{
    double f = b->freq > 0 ? policy_decay(b->freq, b->last_access, now, p) : 0.0;
    b->freq = (float)(f + 1.0);
    b->hits++;
    if (now > b->last_access)
        b->last_access = now;
}

void policy_hint(struct policy_block *b, float mass, uint64_t now,
                 const struct policy_params *p)
{
    double h = policy_decay(b->hint, b->hint_time, now, p);
    h += mass > 0 ? mass : 0;
    /* saturated, not infinite: a mass at FLT_MAX still decays (an infinite one never would) */
    b->hint = h < FLT_MAX ? (float)h : FLT_MAX;
    if (now > b->hint_time)
        b->hint_time = now;
}

void policy_ghost_restore(struct policy_block *b, float freq, uint64_t evicted_at, uint64_t now,
                          const struct policy_params *p)
{
    double f = policy_decay(freq, evicted_at, now, p);
    b->freq = (float)(f + (b->freq > 0 ? b->freq : 1.0));
    if (now > b->last_access)
        b->last_access = now;
}

double policy_key(enum policy_kind k, const struct policy_block *b,
                  const struct policy_params *p)
{
    switch (k) {
    case POLICY_LFU:
        return policy_lfu_key(b, p);
    case POLICY_PREFIX:
        return policy_prefix_key(b, p);
    case POLICY_STREAMING:
        return policy_streaming_key(b, p);
    case POLICY_H2O:
        return policy_h2o_key(b, p);
    case POLICY_SNAPKV:
        return policy_snapkv_key(b, p);
    case POLICY_KEYNORM:
    case POLICY_QUEST: /* no query at eviction time: Quest's summaries rank like key-norm */
        return policy_keynorm_key(b, p);
    case POLICY_DEFAULT:
        return policy_default_key(b, p);
    case POLICY_VATP:
        return policy_vatp_key(b, p);
    case POLICY_LRU:
    default:
        return policy_lru_key(b, p);
    }
}

struct policy_sort_ent {
    double key;
    int blocked;
    struct policy_block b;
};

static int policy_sort_cmp(const void *pa, const void *pb)
{
    const struct policy_sort_ent *a = pa, *b = pb;
    if (a->blocked != b->blocked)
        return a->blocked - b->blocked;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    if (a->b.depth != b->b.depth)
        return a->b.depth > b->b.depth ? -1 : 1;
    return a->b.id < b->b.id ? -1 : a->b.id > b->b.id;
}

void policy_rank_params(enum policy_kind k, struct policy_block *b, size_t n, uint64_t now,
                        const struct policy_params *p)
{
    (void)now;
    if (n < 2)
        return;
    struct policy_sort_ent *e = malloc(n * sizeof(*e));
    if (!e) {
        /* No memory for the keys: fall back to an in-place insertion sort by key. */
        for (size_t i = 1; i < n; i++) {
            struct policy_block t = b[i];
            size_t j = i;
            while (j > 0 && policy_key(k, &b[j - 1], p) > policy_key(k, &t, p)) {
                b[j] = b[j - 1];
                j--;
            }
            b[j] = t;
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        e[i].b = b[i];
        e[i].blocked = (b[i].flags & POLICY_BLOCK_PINNED) || b[i].children > 0;
        e[i].key = policy_key(k, &b[i], p);
    }
    qsort(e, n, sizeof(*e), policy_sort_cmp);
    for (size_t i = 0; i < n; i++)
        b[i] = e[i].b;
    free(e);
}

void policy_rank(enum policy_kind k, struct policy_block *b, size_t n, uint64_t now)
{
    struct policy_params p;
    policy_params_init(&p);
    policy_rank_params(k, b, n, now, &p);
}
