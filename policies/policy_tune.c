/*
 * policy_tune.c — choosing the decay half-life by miniature simulation.
 *
 * DESIGN
 * The default key is LRFU: log2(decayed count) + last_access / h. The half-life h spans LRU
 * (small h: recency decides) to LFU (large h: counts decide), and which end wins depends on
 * the workload *and on the capacity*: on the conversation trace at 1k blocks a half-life of
 * ~25 cache turnovers is best, at 10k about one, at 100k anything is LRU. Setting h to the
 * mean observed reuse interval (policy_params_observe_reuse) is a guess; the intervals a
 * cache observes are cut off by its own size. So the tuner measures instead.
 *
 * It runs POLICY_TUNE_CANDIDATES miniature caches (Waldspurger et al., "Cache Modeling and
 * Optimization using Miniature Simulations", ATC '17), each an LRFU over block keys with
 * one half-life, on a spatially sampled stream: a key is simulated when its hash falls under
 * rate R = m / capacity, with mini capacity m = min(capacity, POLICY_TUNE_MINI). A sampled
 * stream of rate R through a cache of R x capacity has about the full cache's hit ratio.
 * Candidate half-lives are multiples of the cache's characteristic time (the time in which
 * the stream references `capacity` blocks, measured over the last 16 turnovers and followed
 * when it moves by more than 10 %): 1/4096 (LRU: one turnover outweighs any count), then
 * 1/4, 1, 4, 16 and 64 turnovers (towards LFU), so no time constant of a trace or clock unit
 * is built in. Hit counts halve every 16 x m sampled references so the choice follows phase
 * changes. The current candidate stays until another's hits lead its own by more than
 * POLICY_TUNE_MARGIN standard errors of that lead: the lead is a sum over the references only
 * one of the two hit (the rest cancel), so its standard error is the square root of their
 * count, kept decayed alike per pair. Without the margin the choice flipped whenever two
 * near-tied counts crossed, which the order of a few lookups decides. The half-life used
 * sits at the vertex of the parabola through the current candidate and its neighbours (hits
 * against log2 h, at most half a step; at either end of the grid the parabola of the last
 * three), so near-tied neighbours a factor 4 apart give the half-life between them whichever
 * is ahead: the half-life is a continuous function of the hit counts.
 *
 * Keys only: one record per sampled key (count and last access per candidate), a history
 * of POLICY_TUNE_HISTORY x m records so a count survives eviction from the mini caches (the
 * ghost), recycled by a clock hand. No I/O, no clock, no locks: the caller owns the state
 * (the daemon holds one per namespace, calls policy_tune_access() on every block a lookup
 * names, in prefix order, and copies policy_tune_half_life() into its policy_params with
 * adapt = 0 before ranking).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "policies/policy.h"

#define POLICY_TUNE_NONE UINT32_MAX

struct policy_tune_rec {
    uint64_t key;
    uint32_t depth;
    uint32_t pos[POLICY_TUNE_CANDIDATES]; /* heap position per mini; NONE = not cached */
    float freq[POLICY_TUNE_CANDIDATES];   /* decayed count as of last */
    uint64_t last;
};

static uint64_t policy_tune_hash(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dULL;
    x ^= x >> 33;
    return x;
}

static double policy_tune_key(const struct policy_tune *t, const struct policy_tune_rec *r,
                              int c)
{
    double f = r->freq[c] > 1e-30f ? r->freq[c] : 1e-30;
    return log2(f) + (double)r->last / t->h[c];
}

/* Heap order of mini c: lower key first, then the deeper block, then the older record. */
static int policy_tune_less(const struct policy_tune *t, int c, uint32_t a, uint32_t b)
{
    double ka = t->hkey[c][a], kb = t->hkey[c][b];
    if (ka != kb)
        return ka < kb;
    if (t->rec[a].depth != t->rec[b].depth)
        return t->rec[a].depth > t->rec[b].depth;
    return a < b;
}

static void policy_tune_set(struct policy_tune *t, int c, uint32_t i, uint32_t r)
{
    t->heap[c][i] = r;
    t->rec[r].pos[c] = i;
}

static void policy_tune_up(struct policy_tune *t, int c, uint32_t i)
{
    uint32_t r = t->heap[c][i];
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!policy_tune_less(t, c, r, t->heap[c][p]))
            break;
        policy_tune_set(t, c, i, t->heap[c][p]);
        i = p;
    }
    policy_tune_set(t, c, i, r);
}

static void policy_tune_down(struct policy_tune *t, int c, uint32_t i)
{
    uint32_t r = t->heap[c][i], n = t->n[c];
    for (;;) {
        uint32_t k = 2 * i + 1;
        if (k >= n)
            break;
        if (k + 1 < n && policy_tune_less(t, c, t->heap[c][k + 1], t->heap[c][k]))
            k++;
        if (!policy_tune_less(t, c, t->heap[c][k], r))
            break;
        policy_tune_set(t, c, i, t->heap[c][k]);
        i = k;
    }
    policy_tune_set(t, c, i, r);
}

static void policy_tune_pop(struct policy_tune *t, int c)
{
    uint32_t r = t->heap[c][0];
    t->rec[r].pos[c] = POLICY_TUNE_NONE;
    if (--t->n[c] == 0)
        return;
    policy_tune_set(t, c, 0, t->heap[c][t->n[c]]);
    policy_tune_down(t, c, 0);
}

/* Index slot of `key`, or the empty slot where it would go. */
static uint32_t policy_tune_slot(const struct policy_tune *t, uint64_t key)
{
    uint32_t mask = t->icap - 1, h = (uint32_t)policy_tune_hash(key ^ 0x9e3779b97f4a7c15ULL);
    for (h &= mask;; h = (h + 1) & mask)
        if (t->idx[h] == POLICY_TUNE_NONE || t->rec[t->idx[h]].key == key)
            return h;
}

/* Removes record r from the index (backward-shift deletion keeps probe chains intact). */
static void policy_tune_unindex(struct policy_tune *t, uint32_t r)
{
    uint32_t mask = t->icap - 1, i = policy_tune_slot(t, t->rec[r].key);
    t->idx[i] = POLICY_TUNE_NONE;
    for (uint32_t j = (i + 1) & mask; t->idx[j] != POLICY_TUNE_NONE; j = (j + 1) & mask) {
        uint32_t home =
            (uint32_t)policy_tune_hash(t->rec[t->idx[j]].key ^ 0x9e3779b97f4a7c15ULL) & mask;
        /* j's entry may move to i when its home is not cyclically within (i, j]. */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            t->idx[i] = t->idx[j];
            t->idx[j] = POLICY_TUNE_NONE;
            i = j;
        }
    }
}

/* A free record: a new one while the history has room, else the clock hand's next record
 * that no mini cache holds. */
static uint32_t policy_tune_alloc(struct policy_tune *t)
{
    if (t->nrec < t->rcap)
        return t->nrec++;
    for (;;) {
        uint32_t r = t->hand;
        t->hand = (t->hand + 1) % t->rcap;
        int cached = 0;
        for (int c = 0; c < POLICY_TUNE_CANDIDATES; c++)
            cached |= t->rec[r].pos[c] != POLICY_TUNE_NONE;
        if (!cached) {
            policy_tune_unindex(t, r);
            return r;
        }
    }
}

static void policy_tune_rekey(struct policy_tune *t)
{
    for (int c = 0; c < POLICY_TUNE_CANDIDATES; c++) {
        t->h[c] = t->tc * (c == 0 ? 1.0 / 4096.0 : exp2(2.0 * (c - 2)));
        for (uint32_t i = 0; i < t->n[c]; i++)
            t->hkey[c][t->heap[c][i]] = policy_tune_key(t, &t->rec[t->heap[c][i]], c);
        for (uint32_t i = t->n[c] / 2; i-- > 0;)
            policy_tune_down(t, c, i);
    }
}

int policy_tune_init(struct policy_tune *t, uint64_t capacity)
{
    memset(t, 0, sizeof(*t));
    if (capacity == 0)
        return -EINVAL;
    t->capacity = capacity;
    t->m = capacity < POLICY_TUNE_MINI ? (uint32_t)capacity : POLICY_TUNE_MINI;
    t->rate = (double)t->m / (double)capacity;
    t->rcap = t->m * POLICY_TUNE_HISTORY + 1;
    for (t->icap = 16; t->icap < 2 * t->rcap; t->icap *= 2)
        ;
    t->rec = calloc(t->rcap, sizeof(*t->rec));
    t->idx = malloc(t->icap * sizeof(*t->idx));
    int ok = t->rec && t->idx;
    for (int c = 0; c < POLICY_TUNE_CANDIDATES; c++) {
        t->heap[c] = malloc(((size_t)t->m + 1) * sizeof(**t->heap));
        t->hkey[c] = malloc(t->rcap * sizeof(**t->hkey));
        ok = ok && t->heap[c] && t->hkey[c];
    }
    if (!ok) {
        policy_tune_free(t);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < t->icap; i++)
        t->idx[i] = POLICY_TUNE_NONE;
    t->best = 0;
    return 0;
}

void policy_tune_free(struct policy_tune *t)
{
    free(t->rec);
    free(t->idx);
    for (int c = 0; c < POLICY_TUNE_CANDIDATES; c++) {
        free(t->heap[c]);
        free(t->hkey[c]);
    }
    memset(t, 0, sizeof(*t));
}

void policy_tune_access(struct policy_tune *t, uint64_t key, uint32_t depth, uint64_t now)
{
    if (!t->rec)
        return;
    /* Characteristic time: how long the stream takes to reference `capacity` blocks,
     * measured since t0; the candidates follow it when it moves by more than 10 %. Every
     * 16 turnovers the measure restarts from one turnover at the current estimate, so it
     * follows the load of the last turnovers, not the average since the start (an early
     * estimate, taken while clients were still starting, stayed for whole runs). */
    if (t->refs == 0)
        t->t0 = now;
    t->refs++;
    if (now > t->t0 && t->refs >= 64) {
        double tc = (double)(now - t->t0) * (double)t->capacity / (double)t->refs;
        if (t->tc == 0 || fabs(tc - t->tc) > POLICY_TUNE_TC_MOVE * t->tc) {
            t->tc = tc;
            policy_tune_rekey(t);
        }
    }
    if (t->tc > 0 && t->refs >= 16 * t->capacity && (double)now > t->tc) {
        t->refs = t->capacity;
        t->t0 = now - (uint64_t)t->tc;
    }
    if (t->tc == 0)
        return;
    if ((double)(policy_tune_hash(key) >> 11) * 0x1p-53 >= t->rate)
        return;

    uint32_t s = policy_tune_slot(t, key), r = t->idx[s];
    if (r == POLICY_TUNE_NONE) {
        r = policy_tune_alloc(t);
        s = policy_tune_slot(t, key); /* the alloc may have shifted the index */
        t->idx[s] = r;
        struct policy_tune_rec *x = &t->rec[r];
        x->key = key;
        x->last = now;
        for (int c = 0; c < POLICY_TUNE_CANDIDATES; c++) {
            x->pos[c] = POLICY_TUNE_NONE;
            x->freq[c] = 0;
        }
    }
    struct policy_tune_rec *x = &t->rec[r];
    x->depth = depth;
    for (int c = 0; c < POLICY_TUNE_CANDIDATES; c++)
        for (int d = c + 1; d < POLICY_TUNE_CANDIDATES; d++)
            if ((x->pos[c] == POLICY_TUNE_NONE) != (x->pos[d] == POLICY_TUNE_NONE))
                t->split[c][d] += 1.0;
    for (int c = 0; c < POLICY_TUNE_CANDIDATES; c++) {
        double f = x->freq[c] > 0 ? x->freq[c] * exp2(-(double)(now - x->last) / t->h[c]) : 0;
        x->freq[c] = (float)(f + 1.0);
    }
    x->last = now;
    for (int c = 0; c < POLICY_TUNE_CANDIDATES; c++) {
        t->hkey[c][r] = policy_tune_key(t, x, c);
        if (x->pos[c] != POLICY_TUNE_NONE) {
            t->hits[c] += 1.0;
            policy_tune_up(t, c, x->pos[c]);
            policy_tune_down(t, c, x->pos[c]);
            continue;
        }
        uint32_t i = t->n[c]++;
        t->heap[c][i] = r;
        x->pos[c] = i;
        policy_tune_up(t, c, i);
        if (t->n[c] > t->m)
            policy_tune_pop(t, c);
    }
    /* Forget old hit counts so the choice follows the workload. */
    if (++t->sampled % (16ull * t->m) == 0)
        for (int c = 0; c < POLICY_TUNE_CANDIDATES; c++) {
            t->hits[c] *= 0.5;
            for (int d = c + 1; d < POLICY_TUNE_CANDIDATES; d++)
                t->split[c][d] *= 0.5;
        }
    /* The leader (ties to the shorter half-life) replaces the current candidate only by a
     * margin. */
    int top = 0;
    for (int c = 1; c < POLICY_TUNE_CANDIDATES; c++)
        if (t->hits[c] > t->hits[top] * (1.0 + 1e-9))
            top = c;
    if (top != t->best) {
        int a = top < t->best ? top : t->best, b = top ^ t->best ^ a;
        if (t->hits[top] - t->hits[t->best] > POLICY_TUNE_MARGIN * sqrt(t->split[a][b]))
            t->best = top;
    }
}

double policy_tune_half_life(const struct policy_tune *t)
{
    int b = t->best;
    if (!t->rec || t->tc == 0)
        return 0;
    /* Between grid points: the vertex of the parabola through three neighbouring candidates
     * (hits against log2 of the half-life, a factor 4 apart), centred on the current one or,
     * at an end of the grid, on its neighbour, and kept within half a step of the current
     * one and inside the grid. Two candidates nearly tied put it between them, whichever is
     * ahead, so noise in the hit counts does not swing the half-life by a factor of 4; at the
     * last candidate too (there it jumped from twice the one before to four times it). The
     * LRU candidate (c = 0) is off the grid: not interpolated, nor a point of a parabola. */
    if (b >= 1) {
        int k = b < 2 ? 2 : b > POLICY_TUNE_CANDIDATES - 2 ? POLICY_TUNE_CANDIDATES - 2 : b;
        double l = t->hits[k - 1], m = t->hits[k], r = t->hits[k + 1];
        double den = l - 2.0 * m + r;
        if (den < 0) {
            double d = (l - r) / (2.0 * den), lo = b - k - 0.5, hi = b - k + 0.5;
            lo = lo < 1 - k ? 1 - k : lo;
            hi = hi > POLICY_TUNE_CANDIDATES - 1 - k ? POLICY_TUNE_CANDIDATES - 1 - k : hi;
            d = d < lo ? lo : d > hi ? hi : d;
            return t->h[k] * exp2(2.0 * d);
        }
    }
    return t->h[b];
}
