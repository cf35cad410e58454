/*
 * sim.c — trace-driven cache simulator.
 *
 * DESIGN
 * A trace is a list of requests, each a path of block ids from the root of the prefix tree.
 * The simulated clock ticks once per request (timestamps only order the requests), so ties
 * within a request are broken by policy_rank's rule: the deeper block first.
 *
 * Cache model, exact ordering: every unpinned fast-tier block sits in a binary heap ordered
 * by policy_key() (ties: deeper, then lower id — policy_rank's order), so the block acted on
 * is the one policy_rank() would put first among all blocks, not a sample. policy_decide()
 * on that block chooses the action: quantize (takes codec ratio of the room, stays in the
 * heap), offload (to a disk tier with its own capacity and heap), drop (leaves only), or
 * keep (an inner block: parked until its last child goes). A block is only cached while its
 * parent is (inserting walks the path, and eviction takes leaves), as in the daemon. Blocks
 * of the request being served are pinned. A key that was evicted recently (within
 * ghost_factor × capacity evictions) gets its decayed count back (policy_ghost_restore), and
 * every hit and ghost hit feeds the half-life (policy_params_observe_reuse). Keys depend on
 * the half-life, so when it moves by more than 5 % the heaps are rebuilt. Under `default`
 * (or with tune = 1) the half-life comes from policy_tune, fed every block reference, and
 * is set after each request.
 *
 * Belady MIN: references flattened in order; each cached block keyed by its next use in a
 * max-heap; on a miss the block is inserted and the farthest next use evicted (the block
 * itself when its own next use is farthest: MIN bypasses). O(n log n). It ignores the prefix
 * invariant, but a parent's next use never comes after its child's, so it keeps it anyway.
 */
#include <errno.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvcreplay_trace.h"
#include "kernels/kern.h"
#include "policies/policy.h"
#include "tests/lib/sim.h"

/* ---- trace ------------------------------------------------------------------------- */

struct sim_map {
    uint64_t *key;
    uint32_t *val;
    size_t cap, n;
};

static uint64_t sim_hash(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static int sim_map_grow(struct sim_map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint64_t *k = malloc(cap * sizeof(*k));
    uint32_t *v = malloc(cap * sizeof(*v));
    if (!k || !v) {
        free(k);
        free(v);
        return -ENOMEM;
    }
    for (size_t i = 0; i < cap; i++)
        v[i] = UINT32_MAX;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->val[i] == UINT32_MAX)
            continue;
        size_t h = sim_hash(m->key[i]) & (cap - 1);
        while (v[h] != UINT32_MAX)
            h = (h + 1) & (cap - 1);
        k[h] = m->key[i];
        v[h] = m->val[i];
    }
    free(m->key);
    free(m->val);
    m->key = k;
    m->val = v;
    m->cap = cap;
    return 0;
}

/* Dense id of `key`, assigning the next one when new; UINT32_MAX on -ENOMEM. */
static uint32_t sim_map_get(struct sim_map *m, uint64_t key)
{
    if ((m->n + 1) * 2 > m->cap && sim_map_grow(m) < 0)
        return UINT32_MAX;
    size_t h = sim_hash(key) & (m->cap - 1);
    while (m->val[h] != UINT32_MAX) {
        if (m->key[h] == key)
            return m->val[h];
        h = (h + 1) & (m->cap - 1);
    }
    m->key[h] = key;
    m->val[h] = (uint32_t)m->n++;
    return m->val[h];
}

int sim_trace_parse(struct sim_trace *t, const char *text, size_t len)
{
    struct sim_map map = { 0 };
    struct replay_req q = {0};
    size_t rcap = 0, icap = 0;
    int rc = 0;
    const char *p = text, *end = text + len;
    char err[160];

    memset(t, 0, sizeof(*t));
    q.ids = malloc(REPLAY_MAX_BLOCKS * sizeof(*q.ids));
    if (!q.ids)
        return -ENOMEM;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        if (replay_line_blank(p, (size_t)(eol - p))) {
            p = eol + 1;
            continue;
        }
        /* The one reader of the format (client/kvcreplay_trace.c): kvcreplay reads the
         * same lines the same way. */
        rc = replay_line_parse(p, (size_t)(eol - p), &q, err, sizeof(err));
        if (rc)
            goto out;
        if (t->nreq == rcap) {
            rcap = rcap ? rcap * 2 : 1024;
            struct sim_req *nr = realloc(t->req, rcap * sizeof(*nr));
            if (!nr) {
                rc = -ENOMEM;
                goto out;
            }
            t->req = nr;
        }
        struct sim_req *r = &t->req[t->nreq];
        r->ts = (uint64_t)q.ts; /* ms: fractions dropped */
        r->input_len = (uint32_t)q.input_len;
        r->off = (uint32_t)t->nref;
        r->len = 0;
        for (uint32_t j = 0; j < q.n; j++) {
            if (t->nref == icap) {
                icap = icap ? icap * 2 : 65536;
                uint32_t *ni = realloc(t->ids, icap * sizeof(*ni));
                if (!ni) {
                    rc = -ENOMEM;
                    goto out;
                }
                t->ids = ni;
            }
            uint32_t id = sim_map_get(&map, q.ids[j]);
            if (id == UINT32_MAX) {
                rc = -ENOMEM;
                goto out;
            }
            t->ids[t->nref++] = id;
            r->len++;
        }
        if (r->input_len == 0)
            r->input_len = r->len * SIM_BLOCK_TOKENS;
        t->nreq++;
        p = eol + 1;
    }
    t->nblocks = (uint32_t)map.n;
out:
    free(q.ids);
    free(map.key);
    free(map.val);
    if (rc < 0)
        sim_trace_free(t);
    return rc;
}

int sim_trace_load(struct sim_trace *t, const char *path)
{
    int rc = 0;
    char *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    if (fseek(f, 0, SEEK_END) < 0) {
        rc = -errno;
        goto out;
    }
    long n = ftell(f);
    if (n < 0) {
        rc = -errno;
        goto out;
    }
    rewind(f);
    buf = malloc((size_t)n + 1);
    if (!buf) {
        rc = -ENOMEM;
        goto out;
    }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        rc = -EIO;
        goto out;
    }
    rc = sim_trace_parse(t, buf, (size_t)n);
out:
    free(buf);
    fclose(f);
    return rc;
}

void sim_trace_free(struct sim_trace *t)
{
    free(t->req);
    free(t->ids);
    memset(t, 0, sizeof(*t));
}

int sim_policy_from_name(const char *name)
{
    if (!name)
        return -1;
    if (strcmp(name, "min") == 0)
        return SIM_POLICY_MIN;
    if (strcmp(name, "inf") == 0 || strcmp(name, "infinite") == 0)
        return SIM_POLICY_INFINITE;
    return policy_from_name(name);
}

const char *sim_policy_name(int policy)
{
    if (policy == SIM_POLICY_MIN)
        return "min";
    if (policy == SIM_POLICY_INFINITE)
        return "inf";
    return policy_name((enum policy_kind)policy);
}

void sim_config_init(struct sim_config *c)
{
    memset(c, 0, sizeof(*c));
    c->policy = POLICY_LRU;
    c->capacity = 1000;
    c->ghost_factor = 8.0;
    c->adapt = 1;
    c->half_life = 64.0;
    c->tune = -1;
}

static uint32_t sim_block_tokens(const struct sim_req *r, uint32_t j)
{
    uint64_t start = (uint64_t)j * SIM_BLOCK_TOKENS;
    if (r->input_len <= start)
        return SIM_BLOCK_TOKENS; /* inconsistent length: count the block as full */
    uint64_t left = r->input_len - start;
    return left < SIM_BLOCK_TOKENS ? (uint32_t)left : SIM_BLOCK_TOKENS;
}

/* ---- heaps ------------------------------------------------------------------------- */

/* Indexed min-heap over dense ids by (key, deeper first, lower id). */
struct sim_heap {
    uint32_t *a;
    uint32_t n;
    uint32_t *pos; /* UINT32_MAX = not in this heap */
    const double *key;
    const struct policy_block *blk;
};

static int sim_heap_less(const struct sim_heap *h, uint32_t x, uint32_t y)
{
    if (h->key[x] != h->key[y])
        return h->key[x] < h->key[y];
    if (h->blk[x].depth != h->blk[y].depth)
        return h->blk[x].depth > h->blk[y].depth;
    return x < y;
}

static void sim_heap_set(struct sim_heap *h, uint32_t i, uint32_t x)
{
    h->a[i] = x;
    h->pos[x] = i;
}

static void sim_heap_up(struct sim_heap *h, uint32_t i)
{
    uint32_t x = h->a[i];
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!sim_heap_less(h, x, h->a[p]))
            break;
        sim_heap_set(h, i, h->a[p]);
        i = p;
    }
    sim_heap_set(h, i, x);
}

static void sim_heap_down(struct sim_heap *h, uint32_t i)
{
    uint32_t x = h->a[i];
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && sim_heap_less(h, h->a[c + 1], h->a[c]))
            c++;
        if (!sim_heap_less(h, h->a[c], x))
            break;
        sim_heap_set(h, i, h->a[c]);
        i = c;
    }
    sim_heap_set(h, i, x);
}

static void sim_heap_push(struct sim_heap *h, uint32_t x)
{
    if (h->pos[x] != UINT32_MAX) {
        sim_heap_up(h, h->pos[x]);
        sim_heap_down(h, h->pos[x]);
        return;
    }
    h->a[h->n] = x;
    h->pos[x] = h->n;
    sim_heap_up(h, h->n++);
}

static void sim_heap_remove(struct sim_heap *h, uint32_t x)
{
    uint32_t i = h->pos[x];
    if (i == UINT32_MAX)
        return;
    h->pos[x] = UINT32_MAX;
    h->n--;
    if (i == h->n)
        return;
    uint32_t y = h->a[h->n];
    sim_heap_set(h, i, y);
    sim_heap_up(h, i);
    sim_heap_down(h, h->pos[y]);
}

static void sim_heap_rebuild(struct sim_heap *h)
{
    for (uint32_t i = h->n / 2; i-- > 0;)
        sim_heap_down(h, i);
}

/* ---- policy-driven cache ------------------------------------------------------------ */

enum sim_where { SIM_NONE = 0, SIM_FULL, SIM_QUANT, SIM_DISK };

struct sim_state {
    const struct sim_trace *t;
    const struct sim_config *c;
    struct sim_result *r;
    struct policy_params p;
    struct policy_block *blk;
    double *key;
    uint32_t *parent;
    uint8_t *where;
    uint8_t *pinned;
    uint32_t *writer;    /* the request still writing the block (c->procs > 1), else UINT32_MAX */
    uint64_t *ghost_seq; /* eviction sequence + 1 when last evicted; 0 = never */
    float *ghost_freq;
    uint64_t *ghost_time;
    struct sim_heap host, disk;
    double used;          /* fast-tier room in use, in blocks */
    uint64_t disk_used;
    uint64_t evictions;
    double keyed_half_life; /* the half-life the heap keys were computed with */
    /* The precision ladder (c->ladder): a heap per lossy rung, by policy key (rung 0, raw,
     * is `host`); rung[x] is a block's codec, rung_of[codec] its rung, room[k] what rung k
     * holds (in blocks). */
    uint8_t *rung;
    uint8_t rung_of[POLICY_CODEC_COUNT];
    uint8_t codec_at[POLICY_LADDER_RUNGS];
    struct sim_heap lossy[POLICY_LADDER_RUNGS];
    double room[POLICY_LADDER_RUNGS];
    struct policy_ladder ladder;
    struct policy_tune tune;
    int tuning;
};

#define SIM_BLOCK_BYTES (1u << 20)

static double sim_room(const struct sim_state *s, uint32_t x)
{
    if (s->where[x] != SIM_QUANT)
        return 1.0;
    double r = s->c->codec_room[s->rung[x]];
    return r > 0 ? r : policy_codec_ratio((enum policy_codec)s->rung[x]);
}

/* The heap a cached, unpinned block waits in. */
static struct sim_heap *sim_heap_of(struct sim_state *s, uint32_t x)
{
    if (s->where[x] == SIM_DISK)
        return &s->disk;
    if (s->where[x] == SIM_QUANT && s->c->ladder)
        return &s->lossy[s->rung_of[s->rung[x]]];
    return &s->host;
}

/* The rung a fast-tier block counts in (0: raw). */
static uint32_t sim_rung(const struct sim_state *s, uint32_t x)
{
    return s->where[x] == SIM_QUANT ? s->rung_of[s->rung[x]] : 0;
}

/* x leaves the fast tier: its room, and its rung's. */
static void sim_leave_fast(struct sim_state *s, uint32_t x)
{
    s->used -= sim_room(s, x);
    s->room[sim_rung(s, x)] -= sim_room(s, x);
}

/* x enters the fast tier at codec c (RAW: full precision). */
static void sim_enter_fast(struct sim_state *s, uint32_t x, enum policy_codec c)
{
    s->rung[x] = (uint8_t)c;
    s->where[x] = c == POLICY_CODEC_RAW ? SIM_FULL : SIM_QUANT;
    s->used += sim_room(s, x);
    s->room[sim_rung(s, x)] += sim_room(s, x);
}

static void sim_rekey(struct sim_state *s, uint32_t x)
{
    s->key[x] = policy_key((enum policy_kind)s->c->policy, &s->blk[x], &s->p);
}

static void sim_maybe_rebuild(struct sim_state *s)
{
    if (fabs(s->p.half_life - s->keyed_half_life) <= 0.05 * s->keyed_half_life)
        return;
    s->keyed_half_life = s->p.half_life;
    for (uint32_t i = 0; i < s->host.n; i++)
        sim_rekey(s, s->host.a[i]);
    for (uint32_t i = 0; i < s->disk.n; i++)
        sim_rekey(s, s->disk.a[i]);
    for (uint32_t k = 1; k < s->ladder.rungs; k++) {
        for (uint32_t i = 0; i < s->lossy[k].n; i++)
            sim_rekey(s, s->lossy[k].a[i]);
        sim_heap_rebuild(&s->lossy[k]);
    }
    sim_heap_rebuild(&s->host);
    sim_heap_rebuild(&s->disk);
}

/* A block left the cache altogether. */
static void sim_forget(struct sim_state *s, uint32_t x)
{
    s->where[x] = SIM_NONE;
    s->evictions++;
    s->ghost_seq[x] = s->evictions;
    s->ghost_freq[x] = s->blk[x].freq;
    s->ghost_time[x] = s->blk[x].last_access;
    uint32_t par = s->parent[x];
    if (par != UINT32_MAX && s->where[par] != SIM_NONE) {
        s->blk[par].children--;
        sim_rekey(s, par);
        if (s->pinned[par])
            return;
        sim_heap_push(sim_heap_of(s, par), par);
    }
}

/* Makes room for one block on disk; 0 when there is room, -ENOSPC if none can be made. */
static int sim_disk_room(struct sim_state *s)
{
    while (s->disk_used >= s->c->disk_blocks) {
        if (s->disk.n == 0)
            return -ENOSPC;
        uint32_t x = s->disk.a[0];
        sim_heap_remove(&s->disk, x);
        if (s->blk[x].children > 0)
            continue; /* parked until its last child goes (sim_forget pushes it back) */
        s->disk_used--;
        sim_forget(s, x);
    }
    return 0;
}

/* x leaves the fast tier: to disk when the policy chose to offload it and the disk admits
 * it (its rung stays: it comes back as it left), else dropped, as the daemon's engine drops a
 * block the disk would not take. */
static void sim_out(struct sim_state *s, uint32_t x, int offload)
{
    sim_leave_fast(s, x);
    if (offload && !(s->blk[x].hits < s->c->admit_hits && !s->blk[x].children)) {
        s->where[x] = SIM_DISK;
        s->disk_used++;
        s->r->disk_writes++;
        sim_heap_push(&s->disk, x);
        return;
    }
    sim_forget(s, x);
}

/* Frees fast-tier room until `need` more fits; -ENOSPC when only pinned blocks remain. */
static int sim_host_room_victim(struct sim_state *s, double need, uint64_t now)
{
    struct policy_pressure pr = {
        .bytes_to_free = 1,
        .codecs = s->c->codec ? 1u << s->c->codec : 0,
        .miss_cost = 1.0,
        .disk_cost = 0.1,
    };
    while (s->used + need > s->c->capacity + 1e-9) {
        if (s->host.n == 0)
            return -ENOSPC;
        uint32_t x = s->host.a[0];
        struct policy_block b = s->blk[x];
        struct policy_action a;
        b.bytes = (uint64_t)(SIM_BLOCK_BYTES * sim_room(s, x));
        b.flags &= ~(POLICY_BLOCK_QUANTIZED | POLICY_BLOCK_ON_DISK);
        if (s->where[x] == SIM_QUANT)
            b.flags |= POLICY_BLOCK_QUANTIZED;
        pr.actions = 1u << POLICY_ACTION_DROP;
        if (s->c->codec)
            pr.actions |= 1u << POLICY_ACTION_QUANTIZE;
        if (s->c->disk_blocks && sim_disk_room(s) == 0) {
            pr.actions |= 1u << POLICY_ACTION_OFFLOAD;
            pr.offload_min_hits = s->c->admit_hits;
        }
        size_t m = policy_decide((enum policy_kind)s->c->policy, &b, 1, now, &s->p, &pr, &a);
        sim_heap_remove(&s->host, x);
        if (m == 0)
            continue; /* an inner block nothing applies to: parked until a leaf */
        switch (a.action) {
        case POLICY_ACTION_QUANTIZE:
            sim_leave_fast(s, x);
            sim_enter_fast(s, x, (enum policy_codec)s->c->codec);
            s->blk[x].flags |= POLICY_BLOCK_QUANTIZED;
            sim_heap_push(&s->host, x);
            break;
        default:
            sim_out(s, x, a.action == POLICY_ACTION_OFFLOAD);
            break;
        }
    }
    return 0;
}

/* Takes x (the first of `from`) out of the fast tier as the policy decides: to disk, dropped,
 * or parked while it has children (pushed back by sim_forget when the last one goes). */
static void sim_ladder_out(struct sim_state *s, uint32_t x, struct sim_heap *from, uint64_t now)
{
    struct policy_pressure pr = {.bytes_to_free = 1,
                                 .actions = 1u << POLICY_ACTION_DROP,
                                 .miss_cost = 1.0,
                                 .disk_cost = 0.1};
    struct policy_block b = s->blk[x];
    struct policy_action a;
    b.bytes = (uint64_t)(SIM_BLOCK_BYTES * sim_room(s, x));
    if (s->c->disk_blocks && sim_disk_room(s) == 0) {
        pr.actions |= 1u << POLICY_ACTION_OFFLOAD;
        pr.offload_min_hits = s->c->admit_hits;
    }
    sim_heap_remove(from, x);
    if (policy_decide((enum policy_kind)s->c->policy, &b, 1, now, &s->p, &pr, &a) == 0)
        return; /* an inner block: parked until a leaf */
    sim_out(s, x, a.action == POLICY_ACTION_OFFLOAD);
}

/* The fast tier under the precision ladder (policy_ladder.c): each step takes the coldest
 * block of the rung policy_ladder_pick names one codec down, or out of the tier. Sinks and
 * partial blocks never quantize: at the raw order's head they go out as without a ladder. */
static int sim_host_room_ladder(struct sim_state *s, double need, uint64_t now)
{
    double cap = s->c->capacity;
    while (s->used + need > cap + 1e-9) {
        int ready[POLICY_LADDER_RUNGS] = {s->host.n > 0};
        for (uint32_t k = 1; k < s->ladder.rungs; k++)
            ready[k] = s->lossy[k].n > 0;
        int out, k = policy_ladder_pick(&s->ladder, s->room, cap, ready, &out);
        if (k < 0)
            return -ENOSPC;
        struct sim_heap *h = k ? &s->lossy[k] : &s->host;
        uint32_t x = h->a[0];
        if (out || (uint32_t)k + 1 == s->ladder.rungs ||
            (k == 0 && (s->blk[x].flags & (POLICY_BLOCK_SINK | POLICY_BLOCK_PARTIAL)))) {
            sim_ladder_out(s, x, h, now);
            continue;
        }
        sim_heap_remove(h, x);
        sim_leave_fast(s, x);
        sim_enter_fast(s, x, (enum policy_codec)s->codec_at[k + 1]);
        s->blk[x].flags |= POLICY_BLOCK_QUANTIZED;
        s->r->ladder_steps++;
        sim_heap_push(&s->lossy[k + 1], x);
    }
    return 0;
}

static int sim_host_room(struct sim_state *s, double need, uint64_t now)
{
    return s->c->ladder ? sim_host_room_ladder(s, need, now) : sim_host_room_victim(s, need, now);
}

/* Request q is done with x: unpinned unless q wrote it and its commit is still to come
 * (`commit`: it comes now). */
static void sim_unpin(struct sim_state *s, uint32_t x, uint32_t q, bool commit)
{
    if (s->writer && s->writer[x] == q) {
        if (!commit)
            return;
        s->writer[x] = UINT32_MAX;
    }
    if (!s->pinned[x])
        return;
    s->pinned[x] = 0;
    if (s->where[x] == SIM_NONE)
        return;
    sim_rekey(s, x);
    sim_heap_push(sim_heap_of(s, x), x);
}

static int sim_policy_run(struct sim_state *s)
{
    const struct sim_trace *t = s->t;
    uint64_t ghost_window = (uint64_t)(s->c->ghost_factor * s->c->capacity);

    for (size_t qi = 0; qi < t->nreq; qi++) {
        const struct sim_req *rq = &t->req[qi];
        const uint32_t *ids = t->ids + rq->off;
        uint64_t now = qi + 1;
        uint32_t j = 0, parent = UINT32_MAX;
        int prefix = 1;

        for (j = 0; j < rq->len; j++) {
            uint32_t x = ids[j], tok = sim_block_tokens(rq, j);
            s->r->refs++;
            s->r->tokens += tok;
            if (s->tuning)
                policy_tune_access(&s->tune, x, j, now);
            if (s->writer && s->writer[x] != UINT32_MAX && s->writer[x] != qi) {
                /* Another client's put of it is not committed yet: a miss. The rest of this
                 * request hangs from it: the daemon holds this client's RESERVE until that
                 * put commits, then the key is PRESENT and the chain goes on below it
                 * (server_reserve_writing: clients of one user, as kvcreplay's are). */
                s->r->busy++;
                prefix = 0;
                parent = x;
                continue;
            }
            if (s->where[x] == SIM_NONE) {
                prefix = 0;
                /* Cached only below a cached parent (the request's previous block). */
                if (j > 0 && (parent == UINT32_MAX || s->where[parent] == SIM_NONE)) {
                    parent = UINT32_MAX;
                    continue;
                }
                if (sim_host_room(s, 1.0, now) < 0 ||
                    (j > 0 && s->where[parent] == SIM_NONE)) {
                    parent = UINT32_MAX;
                    continue;
                }
                memset(&s->blk[x], 0, sizeof(s->blk[x]));
                s->blk[x].id = x;
                s->blk[x].depth = j;
                s->blk[x].bytes = SIM_BLOCK_BYTES;
                policy_commit(&s->blk[x], now);
                if (tok < SIM_BLOCK_TOKENS)
                    s->blk[x].flags |= POLICY_BLOCK_PARTIAL;
                if (j == 0)
                    s->blk[x].flags |= POLICY_BLOCK_SINK;
                if (s->ghost_seq[x] && s->evictions - s->ghost_seq[x] < ghost_window) {
                    s->r->ghost_hits++;
                    if (s->c->ladder)
                        policy_ladder_ghost_hit(&s->ladder);
                    policy_params_observe_reuse(&s->p, now - s->ghost_time[x]);
                    policy_ghost_restore(&s->blk[x], s->ghost_freq[x], s->ghost_time[x], now,
                                         &s->p);
                }
                sim_enter_fast(s, x, POLICY_CODEC_RAW);
                if (s->writer)
                    s->writer[x] = (uint32_t)qi;
                s->parent[x] = j > 0 ? parent : UINT32_MAX;
                if (j > 0) {
                    s->blk[parent].children++;
                    sim_rekey(s, parent);
                }
            } else {
                if (s->where[x] == SIM_FULL)
                    s->r->hits_full++;
                else if (s->where[x] == SIM_QUANT) {
                    s->r->hits_lossy++;
                    s->r->hits_codec[s->rung[x]]++;
                    if (s->c->ladder)
                        policy_ladder_hit(&s->ladder, s->rung_of[s->rung[x]]);
                }
                else
                    s->r->hits_disk++;
                s->r->token_hits += tok;
                if (prefix)
                    s->r->prefix_hits++;
                policy_params_observe_reuse(&s->p, now - s->blk[x].last_access);
                policy_touch(&s->blk[x], now, &s->p);
                if (s->where[x] == SIM_DISK) {
                    /* Promoted into the fast tier before it is served. */
                    sim_heap_remove(&s->disk, x);
                    s->disk_used--;
                    s->pinned[x] = 1;
                    if (sim_host_room(s, 1.0, now) == 0) {
                        /* As it left: raw, or at its rung under the ladder. */
                        sim_enter_fast(s, x, s->c->ladder ? (enum policy_codec)s->rung[x]
                                                          : POLICY_CODEC_RAW);
                    } else {
                        s->disk_used++;
                    }
                }
                sim_heap_remove(&s->host, x);
                sim_heap_remove(&s->disk, x);
                for (uint32_t k = 1; k < s->ladder.rungs; k++)
                    sim_heap_remove(&s->lossy[k], x);
            }
            s->pinned[x] = 1;
            sim_rekey(s, x);
            parent = x;
        }
        /* Unpin: the request's blocks become candidates again; with several clients the
         * ones it wrote only once procs - 1 more requests have looked up (their commit). */
        for (j = 0; j < rq->len; j++)
            sim_unpin(s, ids[j], (uint32_t)qi, false);
        if (s->writer && qi + 1 >= s->c->procs) {
            const struct sim_req *done = &t->req[qi + 1 - s->c->procs];
            for (j = 0; j < done->len; j++)
                sim_unpin(s, t->ids[done->off + j], (uint32_t)(qi + 1 - s->c->procs), true);
        }
        if (s->tuning && policy_tune_half_life(&s->tune) > 0)
            s->p.half_life = policy_tune_half_life(&s->tune);
        sim_maybe_rebuild(s);
    }
    s->r->half_life = s->p.half_life;
    s->r->evictions = s->evictions;
    s->r->raw_share = s->c->ladder ? s->ladder.below[0] : 1.0;
    return 0;
}

/* ---- oracle and infinite cache ------------------------------------------------------- */

struct sim_min_ent {
    uint64_t next;
    uint32_t id;
};

static void sim_min_push(struct sim_min_ent *h, size_t *n, struct sim_min_ent e)
{
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2].next < e.next) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

static struct sim_min_ent sim_min_pop(struct sim_min_ent *h, size_t *n)
{
    struct sim_min_ent top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && h[c + 1].next > h[c].next)
            c++;
        if (h[c].next <= x.next)
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = x;
    return top;
}

static int sim_oracle_run(const struct sim_trace *t, const struct sim_config *c,
                          struct sim_result *r)
{
    int rc = 0;
    int inf = c->policy == SIM_POLICY_INFINITE;
    uint64_t cap = inf ? UINT64_MAX : (uint64_t)c->capacity;
    uint64_t *next = malloc(t->nref * sizeof(*next));
    uint64_t *last = malloc((size_t)t->nblocks * sizeof(*last));
    uint64_t *cur = calloc(t->nblocks ? t->nblocks : 1, sizeof(*cur)); /* 0 = not cached */
    struct sim_min_ent *h = malloc((t->nref + 1) * sizeof(*h));
    size_t hn = 0, cached = 0;

    if (!next || !last || !cur || !h) {
        rc = -ENOMEM;
        goto out;
    }
    for (uint32_t b = 0; b < t->nblocks; b++)
        last[b] = UINT64_MAX;
    for (size_t i = t->nref; i-- > 0;) {
        next[i] = last[t->ids[i]];
        last[t->ids[i]] = i;
    }
    for (size_t qi = 0, i = 0; qi < t->nreq; qi++) {
        const struct sim_req *rq = &t->req[qi];
        int prefix = 1;
        for (uint32_t j = 0; j < rq->len; j++, i++) {
            uint32_t x = t->ids[i], tok = sim_block_tokens(rq, j);
            r->refs++;
            r->tokens += tok;
            if (cur[x]) {
                r->hits_full++;
                r->token_hits += tok;
                if (prefix)
                    r->prefix_hits++;
            } else {
                prefix = 0;
                cached++;
            }
            /* next use + 1 so that 0 stays "not cached"; UINT64_MAX = never again */
            cur[x] = next[i] == UINT64_MAX ? UINT64_MAX : next[i] + 1;
            if (inf)
                continue;
            sim_min_push(h, &hn, (struct sim_min_ent){ cur[x], x });
            while (cached > cap) {
                struct sim_min_ent e = sim_min_pop(h, &hn);
                if (cur[e.id] != e.next)
                    continue; /* stale entry */
                cur[e.id] = 0;
                cached--;
            }
        }
    }
out:
    free(next);
    free(last);
    free(cur);
    free(h);
    return rc;
}

int sim_run(const struct sim_trace *t, const struct sim_config *c, struct sim_result *r)
{
    int rc = 0;
    struct sim_state s = { .t = t, .c = c, .r = r };
    size_t nb = t->nblocks ? t->nblocks : 1;

    memset(r, 0, sizeof(*r));
    if (c->policy == SIM_POLICY_MIN || c->policy == SIM_POLICY_INFINITE)
        return sim_oracle_run(t, c, r);
    if (c->policy < 0 || c->policy >= POLICY_KIND_COUNT || !(c->capacity >= 1.0))
        return -EINVAL;
    policy_params_init(&s.p);
    s.p.adapt = c->adapt;
    s.tuning = c->tune > 0 || (c->tune < 0 && c->policy == POLICY_DEFAULT);
    if (s.tuning) {
        s.p.adapt = 0;
        rc = policy_tune_init(&s.tune, (uint64_t)c->capacity);
        if (rc < 0)
            return rc;
    }
    s.p.half_life = c->half_life; /* requests, until reuse intervals are observed */
    s.keyed_half_life = s.p.half_life;
    {
        uint32_t rungs = 1;
        s.codec_at[0] = POLICY_CODEC_RAW;
        /* The rungs: each allowed codec smaller than the rung above, largest first (the
         * more precise of equal sizes), by what it costs (codec_room) or its ratio, the
         * smallest always last, as the daemon's store_ladder_setup takes them by their
         * encoded size. */
        double last = 1.0;
        for (;;) {
            int pick = -1;
            double best = 0;
            for (int k = 1; k < POLICY_CODEC_COUNT; k++) {
                double room = c->codec_room[k] > 0 ? c->codec_room[k]
                                                   : policy_codec_ratio((enum policy_codec)k);
                if ((c->ladder & (1u << k)) && room < last && room > best) {
                    best = room;
                    pick = k;
                }
            }
            if (pick < 0)
                break;
            if (rungs == POLICY_LADDER_RUNGS) /* the smallest stays last (store_ladder_setup) */
                rungs--;
            s.rung_of[pick] = (uint8_t)rungs;
            s.codec_at[rungs++] = (uint8_t)pick;
            last = best;
        }
        policy_ladder_init(&s.ladder, rungs, c->lossy_weight, c->capacity);
        r->rungs = rungs;
        memcpy(r->rung_codec, s.codec_at, sizeof(r->rung_codec));
    }
    s.blk = calloc(nb, sizeof(*s.blk));
    s.key = calloc(nb, sizeof(*s.key));
    s.parent = malloc(nb * sizeof(*s.parent));
    s.where = calloc(nb, 1);
    s.pinned = calloc(nb, 1);
    s.ghost_seq = calloc(nb, sizeof(*s.ghost_seq));
    s.ghost_freq = calloc(nb, sizeof(*s.ghost_freq));
    s.ghost_time = calloc(nb, sizeof(*s.ghost_time));
    s.host.a = malloc(nb * sizeof(uint32_t));
    s.host.pos = malloc(nb * sizeof(uint32_t));
    s.disk.a = malloc(nb * sizeof(uint32_t));
    s.disk.pos = malloc(nb * sizeof(uint32_t));
    s.rung = calloc(nb, 1);
    if (c->procs > 1) {
        s.writer = malloc(nb * sizeof(*s.writer));
        if (!s.writer) {
            rc = -ENOMEM;
            goto out;
        }
        for (size_t i = 0; i < nb; i++)
            s.writer[i] = UINT32_MAX;
    }
    for (uint32_t k = 1; k < s.ladder.rungs; k++) {
        s.lossy[k].a = malloc(nb * sizeof(uint32_t));
        s.lossy[k].pos = malloc(nb * sizeof(uint32_t));
        if (!s.lossy[k].a || !s.lossy[k].pos) {
            rc = -ENOMEM;
            goto out;
        }
        for (size_t i = 0; i < nb; i++)
            s.lossy[k].pos[i] = UINT32_MAX;
        s.lossy[k].key = s.key;
        s.lossy[k].blk = s.blk;
    }
    if (!s.rung || !s.blk || !s.key || !s.parent || !s.where || !s.pinned || !s.ghost_seq ||
        !s.ghost_freq || !s.ghost_time || !s.host.a || !s.host.pos || !s.disk.a ||
        !s.disk.pos) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < nb; i++) {
        s.host.pos[i] = UINT32_MAX;
        s.disk.pos[i] = UINT32_MAX;
        s.parent[i] = UINT32_MAX;
    }
    s.host.key = s.disk.key = s.key;
    s.host.blk = s.disk.blk = s.blk;
    rc = sim_policy_run(&s);
out:
    if (s.tuning)
        policy_tune_free(&s.tune);
    free(s.blk);
    free(s.key);
    free(s.parent);
    free(s.where);
    free(s.pinned);
    free(s.writer);
    free(s.ghost_seq);
    free(s.ghost_freq);
    free(s.ghost_time);
    free(s.host.a);
    free(s.host.pos);
    free(s.disk.a);
    free(s.disk.pos);
    free(s.rung);
    for (uint32_t k = 1; k < POLICY_LADDER_RUNGS; k++) {
        free(s.lossy[k].a);
        free(s.lossy[k].pos);
    }
    return rc;
}

int sim_kern_codec(enum policy_codec c)
{
    static const int map[POLICY_CODEC_COUNT] = {
        [POLICY_CODEC_RAW] = KERN_CODEC_RAW,     [POLICY_CODEC_Q8] = KERN_CODEC_Q8_0,
        [POLICY_CODEC_FP8] = KERN_CODEC_FP8,     [POLICY_CODEC_KIVI4] = KERN_CODEC_KIVI4,
        [POLICY_CODEC_Q4] = KERN_CODEC_Q4_1,     [POLICY_CODEC_KIVI2] = KERN_CODEC_KIVI2,
        [POLICY_CODEC_ROT4] = KERN_CODEC_ROT4,   [POLICY_CODEC_ROT2] = KERN_CODEC_ROT2,
        [POLICY_CODEC_MERGE] = KERN_CODEC_MERGE, [POLICY_CODEC_LOWRANK] = KERN_CODEC_LOWRANK,
        [POLICY_CODEC_Q5] = KERN_CODEC_Q5_1,
    };
    return (unsigned)c < POLICY_CODEC_COUNT ? map[c] : -1;
}
