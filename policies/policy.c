/*
 * policy.c — policy table and ranking.
 *
 * DESIGN
 * LRU: the least recently accessed block goes first; ties go to the deeper block (its
 * prefix is longer, so fewer requests share it) and then to the lower id, so the order is
 * total and the daemon and the simulator agree exactly.
 */
#include <stdlib.h>
#include <string.h>

#include "policies/policy.h"

static const char *const policy_names[POLICY_KIND_COUNT] = {
    [POLICY_LRU] = "lru",
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

static int policy_lru_cmp(const void *pa, const void *pb)
{
    const struct policy_block *a = pa, *b = pb;
    if (a->last_access != b->last_access)
        return a->last_access < b->last_access ? -1 : 1;
    if (a->depth != b->depth)
        return a->depth > b->depth ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

void policy_rank(enum policy_kind k, struct policy_block *b, size_t n, uint64_t now)
{
    (void)now;
    switch (k) {
    case POLICY_LRU:
    default:
        qsort(b, n, sizeof(*b), policy_lru_cmp);
        break;
    }
}
