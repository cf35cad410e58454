/*
 * engine_remote.c — write-behind to the remote tier, reads from it at lookup, the negative
 * cache (daemon/engine_remote.h).
 */
#include "daemon/engine_remote.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "daemon/engine_core.h"
#include "daemon/index.h"
#include "daemon/log.h"
#include "daemon/store.h"
#include "tiers/host.h"
#include "tiers/tier.h"

#define ENGINE_REMOTE_NEG 4096u /* negative cache entries (direct-mapped) */
#define ENGINE_REMOTE_NS_ON 1
#define ENGINE_REMOTE_NS_OFF 2

struct engine_remote_neg {
    uint64_t lo, hi;
    uint64_t until; /* ms; 0: empty */
    uint16_t ns;
};

struct engine_remote_wq {
    struct kvc_wire_key key;
    uint16_t ns;
};

/* The engine's counters, declared once. */
#define ENGINE_REMOTE_COUNTERS(X)                                                                  \
    X(remote_hit_blocks, "blocks read from the remote tier into memory")                           \
    X(remote_miss_blocks, "blocks looked for in the remote tier and not there")                    \
    X(remote_bad_records, "values refused: torn, another layout or version, wrong block")          \
    X(remote_seal_refused, "values refused because they did not open under the namespace's keys")  \
    X(remote_negative_hits, "lookups stopped by the negative cache (no cluster request)")          \
    X(remote_written_blocks, "blocks written to the remote tier")                                  \
    X(remote_put_dropped, "admitted blocks not written: queue full, tier degraded, moved")         \
    X(remote_io_errors, "remote reads or writes failed by the network or the cluster")

struct engine_remote {
    struct tier_remote *t;
    struct engine_remote_params p;
    struct engine_remote_wq *wq; /* ring of p.queue entries */
    uint32_t wq_head, wq_n;
    struct engine_remote_neg neg[ENGINE_REMOTE_NEG];
    /* By namespace id: 0 not asked yet, ENGINE_REMOTE_NS_*; asked of the namespace whose
     * serial is ns_serial (an id dropped and reused is asked again). */
    uint8_t ns_on[65536];
    uint64_t ns_serial[65536];
    struct remote_seal **seal; /* a sealed tier: by namespace id, its keys once asked; owned */
    uint32_t fetching, writing;
    bool was_degraded;
#define ENGINE_REMOTE_FIELD(name, help) uint64_t name;
    ENGINE_REMOTE_COUNTERS(ENGINE_REMOTE_FIELD)
#undef ENGINE_REMOTE_FIELD
};

struct engine_remote_op {
    struct store *s;
    uint32_t idx;
    bool first;   /* a read: the lookup's first key (its parent comes from the record) */
    bool root;    /* a read of a window's or a state's block: kept as a root, no chain */
    uint64_t now; /* a read: when its lookup came */
};

/* ---- namespaces, negative cache -------------------------------------------------------- */

/* A namespace's layout descriptor in a record header. */
static void engine_remote_ns_desc(const struct store_ns *ns, uint8_t desc[REMOTE_REC_NS_BYTES])
{
    _Static_assert(sizeof(ns->layout) <= REMOTE_REC_NS_BYTES, "layout fits a record header");
    memset(desc, 0, REMOTE_REC_NS_BYTES);
    memcpy(desc, &ns->layout, sizeof(ns->layout));
}

static bool engine_remote_ns_on(struct store *s, uint16_t ns_id)
{
    struct engine_remote *er = s->remote;
    const struct store_ns *ns = s->ns[ns_id];
    if (!er->ns_on[ns_id] || er->ns_serial[ns_id] != ns->serial) {
        uint8_t desc[REMOTE_REC_NS_BYTES];
        struct remote_seal k;
        int on = 1;
        engine_remote_ns_desc(ns, desc);
        memset(&k, 0, sizeof(k));
        if (er->p.ns_seal)
            on = er->p.ns_seal(er->p.ns_seal_arg, ns->layout.model_id, desc, &k);
        if (er->seal) {
            if (on && !er->seal[ns_id])
                er->seal[ns_id] = malloc(sizeof(*er->seal[ns_id]));
            if (on && !er->seal[ns_id]) {
                remote_seal_wipe(&k, sizeof(k));
                return false; /* no memory: asked again next time */
            }
            if (er->seal[ns_id])
                *er->seal[ns_id] = k; /* off: the keys of the id's former namespace go */
        }
        remote_seal_wipe(&k, sizeof(k));
        er->ns_on[ns_id] = on ? ENGINE_REMOTE_NS_ON : ENGINE_REMOTE_NS_OFF;
        er->ns_serial[ns_id] = ns->serial;
    }
    return er->ns_on[ns_id] == ENGINE_REMOTE_NS_ON;
}

/* The keys a read or write of namespace ns_id passes (NULL in an unsealed tier). */
static const struct remote_seal *engine_remote_seal(const struct engine_remote *er, uint16_t ns_id)
{
    return er->seal ? er->seal[ns_id] : NULL;
}

static struct engine_remote_neg *engine_remote_neg_at(struct engine_remote *er, uint16_t ns,
                                                      const struct kvc_wire_key *k)
{
    uint64_t h = (k->lo ^ (k->hi * 0x9e3779b97f4a7c15ull) ^ ns) * 0xff51afd7ed558ccdull;
    return &er->neg[(h >> 32) & (ENGINE_REMOTE_NEG - 1)];
}

static bool engine_remote_neg_has(struct engine_remote *er, uint16_t ns,
                                  const struct kvc_wire_key *k, uint64_t now)
{
    const struct engine_remote_neg *e = engine_remote_neg_at(er, ns, k);
    return e->until > now && e->ns == ns && e->lo == k->lo && e->hi == k->hi;
}

static void engine_remote_neg_add(struct engine_remote *er, uint16_t ns,
                                  const struct kvc_wire_key *k, uint64_t now)
{
    if (!er->p.negative_ttl_ms)
        return;
    *engine_remote_neg_at(er, ns, k) = (struct engine_remote_neg){
        .lo = k->lo, .hi = k->hi, .ns = ns, .until = now + er->p.negative_ttl_ms};
}

static void engine_remote_meta(const struct store *s, const struct block *b,
                               struct remote_rec_meta *m)
{
    const struct store_ns *ns = s->ns[b->ns];
    struct kvc_wire_key parent = index_parent_key(&s->ix, b);
    memset(m, 0, sizeof(*m));
    m->key[0] = b->key.lo;
    m->key[1] = b->key.hi;
    m->parent[0] = parent.lo;
    m->parent[1] = parent.hi;
    m->depth = b->depth;
    m->format = b->format;
    m->codec = REMOTE_REC_CODEC_RAW;
    m->len = ns->block_bytes;
    engine_remote_ns_desc(ns, m->ns);
}

/* ---- write-behind ---------------------------------------------------------------------- */

static void engine_remote_admit(struct store *s, uint32_t idx)
{
    struct engine_remote *er = s->remote;
    const struct block *b = &s->ix.blocks[idx];
    if ((b->flags & BLOCK_F_REMOTE) || b->format != KVC_WIRE_FORMAT_RAW ||
        !engine_remote_ns_on(s, b->ns))
        return;
    if (er->wq_n == er->p.queue) {
        er->remote_put_dropped++;
        return;
    }
    er->wq[(er->wq_head + er->wq_n++) % er->p.queue] =
        (struct engine_remote_wq){.key = b->key, .ns = b->ns};
}

/* The store's hook: a block committed. */
static void engine_remote_on_commit(struct store *s, uint32_t idx, uint64_t now)
{
    (void)now;
    if (s->remote->p.admit_hits == 0)
        engine_remote_admit(s, idx);
}

void engine_remote_lookup_done(struct store *s, const uint32_t *idxs, uint32_t hits, uint64_t now)
{
    struct engine_remote *er = s->remote;
    (void)now;
    if (!er || !er->p.admit_hits)
        return;
    for (uint32_t i = 0; i < hits; i++) /* pinned by the lease: each still its key's block */
        if (s->ix.blocks[idxs[i]].hits == er->p.admit_hits)
            engine_remote_admit(s, idxs[i]);
}

static void engine_remote_put_done(void *arg, int status, const struct remote_rec_meta *got)
{
    struct engine_remote_op *op = arg;
    struct store *s = op->s;
    struct engine_remote *er = s->remote;
    struct block *b = &s->ix.blocks[op->idx];
    (void)got;
    er->writing--;
    if (status == 0) {
        er->remote_written_blocks++;
    } else {
        b->flags &= (uint8_t)~BLOCK_F_REMOTE; /* may be written again later */
        if (status != -ECANCELED && status != -EAGAIN)
            er->remote_io_errors++;
        er->remote_put_dropped++;
    }
    store_block_unpin(s, op->idx);
    if ((b->flags & BLOCK_F_LOST) && !b->pins && !b->children)
        (void)store_block_drop(s, op->idx);
    free(op);
}

/* Starts one queued write. 0, 1 (nothing to do for that entry), -EAGAIN (try later). */
static int engine_remote_write_one(struct store *s, const struct engine_remote_wq *e)
{
    struct engine_remote *er = s->remote;
    uint32_t idx = index_find(&s->ix, e->ns, &e->key);
    struct remote_rec_meta m;
    struct engine_remote_op *op;
    struct block *b;
    int rc;
    if (idx == INDEX_NONE)
        return 1;
    b = &s->ix.blocks[idx];
    if (b->state != BLOCK_STATE_COMMITTED || (b->flags & (BLOCK_F_BUSY | BLOCK_F_LOST)) ||
        (b->flags & BLOCK_F_REMOTE) || b->tier != KVC_WIRE_TIER_HOST ||
        b->format != KVC_WIRE_FORMAT_RAW || b->len < s->ns[b->ns]->block_bytes ||
        !engine_remote_ns_on(s, b->ns)) {
        if (!(b->flags & BLOCK_F_REMOTE))
            er->remote_put_dropped++; /* moved to the GPU, quantized, being moved, lost */
        return 1;
    }
    op = malloc(sizeof(*op));
    if (!op)
        return -EAGAIN;
    *op = (struct engine_remote_op){.s = s, .idx = idx};
    engine_remote_meta(s, b, &m);
    rc = tier_remote_put(er->t, &m, engine_remote_seal(er, b->ns),
                         (const uint8_t *)tier_host_base(s->arenas[b->arena].tier) + b->off,
                         engine_remote_put_done, op);
    if (rc) {
        free(op);
        if (rc == -EAGAIN || rc == -ENOMEM)
            return -EAGAIN;
        er->remote_put_dropped++; /* a block the tier cannot take: not tried again */
        return 1;
    }
    store_block_pin(s, idx); /* the worker reads its slot until the write is done */
    b->flags |= BLOCK_F_REMOTE;
    er->writing++;
    return 0;
}

void engine_remote_pump(struct store *s, uint64_t now)
{
    struct engine_remote *er = s->remote;
    struct tier_remote_stats st;
    bool degraded;
    (void)now;
    if (!er)
        return;
    degraded = tier_remote_degraded(er->t);
    if (degraded != er->was_degraded) {
        tier_remote_stats(er->t, &st);
        if (degraded)
            log_warn("remote: degraded, local tiers keep serving (%s)", st.last_error);
        else
            log_info("remote: back (%llu masters, %llu slots covered)",
                     (unsigned long long)st.nodes, (unsigned long long)st.slots);
        er->was_degraded = degraded;
    }
    if (degraded) { /* a cache: writes that cannot go now are dropped */
        er->remote_put_dropped += er->wq_n;
        er->wq_n = 0;
        return;
    }
    tier_remote_plug(er->t); /* the writes started here go out in one batch */
    while (er->wq_n && er->writing < er->p.tier.max_inflight / 2 + 1) {
        int rc = engine_remote_write_one(s, &er->wq[er->wq_head]);
        if (rc == -EAGAIN)
            break;
        er->wq_head = (er->wq_head + 1) % er->p.queue;
        er->wq_n--;
    }
    tier_remote_unplug(er->t);
}

/* ---- reads at lookup ------------------------------------------------------------------- */

/* A lost block that nothing hangs from leaves the index at once (a put of its key can
 * proceed while a lease still holds the entry), and the pool when nobody holds it. */
static void engine_remote_lost_release(struct store *s, uint32_t idx)
{
    struct block *b = &s->ix.blocks[idx];
    if (!(b->flags & BLOCK_F_LOST) || b->children)
        return;
    if (!b->pins)
        (void)store_block_drop(s, idx);
    else
        (void)index_remove(&s->ix, idx); /* -ENOENT when already out; dropped at unpin */
}

/* A read that did not give the block: it is lost (a miss for every lookup), its slot goes
 * back, and it lets go of its parent (the block before it in its lookup: it holds one of
 * its children), so that a chain of misses leaves the index whatever order the replies
 * come in. */
static void engine_remote_fetch_fail(struct store *s, uint32_t idx)
{
    struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    struct tier *host = s->arenas[b->arena].tier;
    struct tier_loc loc = {.arena = b->arena, .cls = b->cls, .off = b->off, .len = b->len};
    if (b->parent != INDEX_NONE) {
        uint32_t p = b->parent;
        b->parent = INDEX_NONE;
        b->depth = 0;
        if (s->ix.blocks[p].children && !--s->ix.blocks[p].children) {
            store_heap_sync(s, p); /* a leaf now */
            engine_remote_lost_release(s, p);
        }
        b = &s->ix.blocks[idx];
    }
    store_lru_unlink(s, idx);
    host->ops->free(host, &loc);
    b->flags |= BLOCK_F_LOST;
    b->tier = 0;
    b->arena = STORE_ARENA_DISK;
    ns->bytes -= b->len;
    b->len = 0;
    store_lru_push_head(s, idx);
    engine_remote_lost_release(s, idx);
}

/* Whether a record that landed is the block that was asked for, and links a lookup's
 * first block to its parent. 0 or -errno. */
static int engine_remote_fetch_fits(struct store *s, uint32_t idx,
                                    const struct engine_remote_op *op,
                                    const struct remote_rec_meta *got)
{
    struct block *b = &s->ix.blocks[idx];
    const struct store_ns *ns = s->ns[b->ns];
    struct kvc_wire_key parent = {got->parent[0], got->parent[1]};
    uint32_t p;
    if (got->format != KVC_WIRE_FORMAT_RAW || got->len != ns->block_bytes)
        return -EMSGSIZE;
    /* A window's block or a state is named by its key alone (the record's layout, checked
     * with it, says which kind and window): whatever chain it was written in, it is a root
     * here, as the window's blocks and the states whose parent is not cached are. */
    if (op->root)
        return 0;
    if (!op->first) {
        struct kvc_wire_key want = index_parent_key(&s->ix, b);
        if (parent.lo != want.lo || parent.hi != want.hi)
            return -ESTALE;
        p = b->parent;
        if (p == INDEX_NONE || (s->ix.blocks[p].flags & BLOCK_F_LOST))
            return -ENOLINK; /* its parent's read failed */
        return got->depth == s->ix.blocks[p].depth + 1 ? 0 : -ESTALE;
    }
    if (index_key_is_zero(&parent))
        return got->depth == 0 ? 0 : -ESTALE;
    p = index_find(&s->ix, b->ns, &parent);
    if (p == INDEX_NONE || s->ix.blocks[p].state != BLOCK_STATE_COMMITTED ||
        (s->ix.blocks[p].flags & BLOCK_F_LOST))
        return -ENOLINK; /* an orphan here: never cached */
    if (got->depth != s->ix.blocks[p].depth + 1)
        return -ESTALE;
    b->parent = p;
    b->depth = got->depth;
    if (!s->ix.blocks[p].children++)
        store_heap_sync(s, p);
    store_heap_sync(s, idx); /* its depth is known now */
    return 0;
}

static void engine_remote_fetch_done(void *arg, int status, const struct remote_rec_meta *got)
{
    struct engine_remote_op *op = arg;
    struct store *s = op->s;
    struct engine_remote *er = s->remote;
    uint32_t idx = op->idx;
    struct block *b = &s->ix.blocks[idx];
    er->fetching--;
    b->flags &= (uint8_t)~BLOCK_F_PROMOTING;
    if (status == 0)
        status = engine_remote_fetch_fits(s, idx, op, got);
    if (status == 0) {
        b->flags |= BLOCK_F_REMOTE; /* clean: the remote tier has it */
        er->remote_hit_blocks++;
        store_fast_sync(s, idx); /* ready: into the arena's shared index */
    } else {
        if (status == -ENOENT || status == -ENOLINK) {
            er->remote_miss_blocks++;
        } else if (status == -EIO || status == -EAGAIN || status == -ECANCELED) {
            er->remote_io_errors += status != -ECANCELED;
        } else {
            er->remote_bad_records++;
            er->remote_seal_refused += status == -EKEYREJECTED;
            log_limited(
                LOG_LEVEL_WARNING, "remote: value of block %016llx%016llx refused (%s); a miss",
                (unsigned long long)b->key.hi, (unsigned long long)b->key.lo, strerror(-status));
        }
        if (status != -ECANCELED && status != -EIO && status != -EAGAIN)
            engine_remote_neg_add(er, b->ns, &b->key, op->now);
        engine_remote_fetch_fail(s, idx);
    }
    free(op);
    if (s->on_ready)
        s->on_ready(s->on_ready_arg);
}

/* A block for keys[i] in a fresh slot, reading from the remote tier (its index to *out): the
 * child of keys[i-1], whose block the caller found (parent), or with root (a window's or a
 * state's block; parent unused) a root. 0 or -errno. */
static int engine_remote_fetch(struct store *s, struct store_ns *ns,
                               const struct kvc_wire_key *keys, uint32_t i, bool root,
                               uint32_t parent, uint64_t now, uint32_t *out)
{
    struct engine_remote *er = s->remote;
    struct engine_remote_op *op;
    struct remote_rec_meta m;
    struct tier_loc loc;
    struct block *b;
    uint32_t idx, p = INDEX_NONE;
    int rc;
    if (i > 0 && !root) {
        p = parent;
        if (!index_handle_ok(&s->ix, p, (uint16_t)ns->id, &keys[i - 1]))
            return -ENOENT;
    }
    op = malloc(sizeof(*op));
    if (!op)
        return -ENOMEM;
    rc = s->core->alloc(s, ns, now, &loc);
    if (rc)
        goto fail_op;
    rc = index_block_new(&s->ix, &idx);
    if (rc)
        goto fail_slot;
    b = &s->ix.blocks[idx];
    b->key = keys[i];
    if (p != INDEX_NONE) {
        b->parent = p;
        b->depth = s->ix.blocks[p].depth + 1;
    }
    b->ns = (uint16_t)ns->id;
    b->state = BLOCK_STATE_COMMITTED;
    b->format = KVC_WIRE_FORMAT_RAW;
    b->tier = KVC_WIRE_TIER_HOST;
    b->arena = (uint8_t)ns->arena;
    b->off = loc.off;
    b->len = (uint32_t)loc.len;
    b->cls = (uint8_t)loc.cls;
    b->last_access = now;
    b->flags = BLOCK_F_PROMOTING;
    rc = index_insert(&s->ix, idx);
    if (rc) {
        index_block_delete(&s->ix, idx);
        goto fail_slot;
    }
    engine_remote_meta(s, b, &m);
    *op = (struct engine_remote_op){
        .s = s, .idx = idx, .first = p == INDEX_NONE, .root = root, .now = now};
    rc = tier_remote_get(er->t, &m, engine_remote_seal(er, b->ns),
                         (uint8_t *)tier_host_base(s->arenas[ns->arena].tier) + loc.off,
                         engine_remote_fetch_done, op);
    if (rc) {
        index_remove(&s->ix, idx);
        index_block_delete(&s->ix, idx);
        goto fail_slot;
    }
    if (p != INDEX_NONE && !s->ix.blocks[p].children++)
        store_heap_sync(s, p);
    ns->blocks++;
    ns->bytes += b->len;
    store_meta_commit(s, idx, now); /* before the push: the policy heap keys with it */
    store_lru_push_head(s, idx);
    er->fetching++;
    if (out)
        *out = idx;
    return 0;
fail_slot:
    s->arenas[ns->arena].tier->ops->free(s->arenas[ns->arena].tier, &loc);
fail_op:
    free(op);
    return rc;
}

uint32_t engine_remote_lookup_prepare(struct store *s, uint16_t ns_id,
                                      const struct kvc_wire_key *keys,
                                      struct store_lookup_blocks *lb, uint32_t hits, uint32_t n,
                                      uint32_t flags, uint64_t now, uint8_t *tier)
{
    struct engine_remote *er = s->remote;
    struct store_ns *ns = s->ns[ns_id];
    uint32_t end = hits;
    if (!er || hits >= n || !engine_remote_ns_on(s, ns_id) || tier_remote_degraded(er->t))
        return hits;
    /* The run's blocks, as the lookup found them, unless one has gone since (then no read
     * starts: the run ends before it). */
    for (uint32_t i = 0; i < hits; i++)
        if (!index_handle_ok(&s->ix, lb->idx[i], ns_id, &keys[i]))
            return i;
    /* Hold the local hits while slots are found, so making room cannot evict them. */
    for (uint32_t i = 0; i < hits; i++)
        store_block_pin(s, lb->idx[i]);
    tier_remote_plug(er->t); /* the lookup's reads go out in one batch */
    for (uint32_t i = hits; i < n && i < KVC_PROTO_MAX_KEYS; i++) {
        if (er->fetching >= er->p.tier.max_inflight / 2 + 1)
            break;
        /* Each key past the run found once: the run's end was, by store_lookup_run. */
        if (i == lb->n)
            lb->idx[lb->n++] = index_find(&s->ix, ns_id, &keys[i]);
        if (lb->idx[i] != INDEX_NONE)
            break; /* reserved, or lost: not a hit */
        if (engine_remote_neg_has(er, ns_id, &keys[i], now)) {
            er->remote_negative_hits++;
            break;
        }
        if (engine_remote_fetch(s, ns, keys, i, false, i ? lb->idx[i - 1] : INDEX_NONE, now,
                                &lb->idx[i]))
            break;
        tier[i] = 0;
        end = i + 1;
    }
    tier_remote_unplug(er->t);
    for (uint32_t i = 0; i < hits; i++)
        store_block_unpin(s, lb->idx[i]);
    return (flags & KVC_LOOKUP_F_READY_ONLY) ? hits : end;
}

/* ---- reads of a window's or a state's span -------------------------------------------- */

#define ENGINE_REMOTE_KEY_LOCAL 0   /* committed here (ready or on its way) */
#define ENGINE_REMOTE_KEY_FETCH 1   /* not here: the remote tier may have it */
#define ENGINE_REMOTE_KEY_NONE 2    /* known missing (negative cache), lost, or being written */
#define ENGINE_REMOTE_SPAN_MORE 32u /* speculative reads past a span's own, at most */

int engine_remote_span_prepare(struct store *s, uint16_t ns_id, const struct kvc_wire_key *keys,
                               struct store_lookup_blocks *lb, uint32_t base, uint32_t end,
                               uint64_t now, uint32_t *first, uint32_t *count, uint8_t *fetched)
{
    struct engine_remote *er = s->remote;
    struct store_ns *ns = s->ns[ns_id];
    bool window = ns->layout.kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW;
    uint32_t w = window ? kvc_wire_window_blocks(&ns->layout) : 1;
    uint8_t st[KVC_PROTO_MAX_KEYS];
    /* none_ps[i], fetch_ps[i]: keys of each status among keys[lo..i) */
    uint16_t none_ps[KVC_PROTO_MAX_KEYS + 1], fetch_ps[KVC_PROTO_MAX_KEYS + 1];
    uint32_t n = lb->n, lo, e, need = 0, budget, half, more, started = 0;
    bool neg = false;
    if (!er || end >= n || n > KVC_PROTO_MAX_KEYS || !engine_remote_ns_on(s, ns_id) ||
        tier_remote_degraded(er->t))
        return 0;
    /* Reads a lookup may start: half the tier's requests, as for a run (a whole window even
     * past that, within what the tier takes). */
    half = er->p.tier.max_inflight / 2 + 1;
    budget = er->fetching < half ? half - er->fetching : 0;
    if (window && budget < w && er->p.tier.max_inflight > er->fetching + er->writing)
        budget = er->p.tier.max_inflight - er->fetching - er->writing < w
                     ? er->p.tier.max_inflight - er->fetching - er->writing
                     : w;
    if (!budget)
        return 0;
    /* Every key a prefix longer than end may need. */
    lo = end + 1 > w ? end + 1 - w : 0;
    none_ps[lo] = fetch_ps[lo] = 0;
    for (uint32_t i = lo; i < n; i++) {
        /* As the lookup found it (nothing since has made room), or found now, once. */
        uint32_t idx = store_lookup_block(s, ns_id, keys, lb, i);
        if (idx != INDEX_NONE)
            st[i] = s->ix.blocks[idx].state == BLOCK_STATE_COMMITTED &&
                            !(s->ix.blocks[idx].flags & BLOCK_F_LOST)
                        ? ENGINE_REMOTE_KEY_LOCAL
                        : ENGINE_REMOTE_KEY_NONE;
        else if (engine_remote_neg_has(er, ns_id, &keys[i], now))
            st[i] = ENGINE_REMOTE_KEY_NONE, neg = true;
        else
            st[i] = ENGINE_REMOTE_KEY_FETCH;
        none_ps[i + 1] = (uint16_t)(none_ps[i] + (st[i] == ENGINE_REMOTE_KEY_NONE));
        fetch_ps[i + 1] = (uint16_t)(fetch_ps[i] + (st[i] == ENGINE_REMOTE_KEY_FETCH));
    }
    if (neg)
        er->remote_negative_hits++;
    /* The longest prefix e whose span (a window: its last blocks; a state: its last key) has
     * no key known to be missing and something to read, within the budget. */
    for (e = n; e > end; e--) {
        need = window ? store_window_need(w, base, e) : 1;
        if (need > e)
            continue; /* its window reaches before keys[0]: not judged here */
        if (none_ps[e] == none_ps[e - need] && fetch_ps[e] != fetch_ps[e - need] &&
            (uint32_t)(fetch_ps[e] - fetch_ps[e - need]) <= budget)
            break;
    }
    if (e == end)
        return 0;
    /* Past the span's own reads, as many keys below it as the keys known missing above it
     * (the cluster holds less than the prompt: the next candidates are read at once, so a
     * lookup asked again finds them), within the budget. */
    more = none_ps[n] - none_ps[e - need];
    if (more > ENGINE_REMOTE_SPAN_MORE)
        more = ENGINE_REMOTE_SPAN_MORE;
    tier_remote_plug(er->t); /* the lookup's reads go out in one batch */
    for (uint32_t i = e - need; i < e; i++) {
        if (st[i] != ENGINE_REMOTE_KEY_FETCH)
            continue;
        if (engine_remote_fetch(s, ns, keys, i, true, INDEX_NONE, now, &lb->idx[i]))
            break;
        fetched[i] = 1;
        started++;
    }
    for (uint32_t i = e - need; i-- > lo && more && started < budget;) {
        if (st[i] != ENGINE_REMOTE_KEY_FETCH)
            continue;
        if (engine_remote_fetch(s, ns, keys, i, true, INDEX_NONE, now, &lb->idx[i]))
            break;
        more--;
        started++;
    }
    tier_remote_unplug(er->t);
    if (started < (uint32_t)(fetch_ps[e] - fetch_ps[e - need]))
        return 0; /* some reads did not start: the span is not whole (the rest land anyway) */
    *first = e - need;
    *count = need;
    return 1;
}

/* ---- life cycle ------------------------------------------------------------------------ */

int engine_remote_attach(struct store *s, const struct engine_remote_params *p)
{
    struct engine_remote *er = calloc(1, sizeof(*er));
    int rc = -ENOMEM;
    if (!er)
        return -ENOMEM;
    er->p = *p;
    if (!er->p.queue)
        er->p.queue = 4096;
    er->wq = calloc(er->p.queue, sizeof(*er->wq));
    if (!er->wq)
        goto fail;
    if (p->tier.sealed && !(er->seal = calloc(65536, sizeof(*er->seal))))
        goto fail;
    er->t = tier_remote_new(&p->tier, &rc);
    if (!er->t)
        goto fail;
    er->p.tier.max_inflight = p->tier.max_inflight ? p->tier.max_inflight : 256;
    s->remote = er;
    s->on_commit = engine_remote_on_commit;
    return 0;
fail:
    free(er->seal);
    free(er->wq);
    free(er);
    return rc;
}

/* Every namespace's keys forgotten (wiped): they are derived again when next asked. */
static void engine_remote_seal_clear(struct engine_remote *er)
{
    for (uint32_t i = 0; er->seal && i < 65536; i++)
        if (er->seal[i]) {
            remote_seal_wipe(er->seal[i], sizeof(*er->seal[i]));
            free(er->seal[i]);
            er->seal[i] = NULL;
        }
}

void engine_remote_free(struct store *s)
{
    struct engine_remote *er = s->remote;
    if (!er)
        return;
    tier_remote_free(er->t); /* runs the last callbacks: pins and slots go back */
    s->on_commit = NULL;
    s->remote = NULL;
    engine_remote_seal_clear(er);
    free(er->seal);
    free(er->wq);
    free(er);
}

void engine_remote_reload(struct store *s, uint32_t admit_hits, uint64_t negative_ttl_ms)
{
    struct engine_remote *er = s->remote;
    if (!er)
        return;
    er->p.admit_hits = admit_hits;
    er->p.negative_ttl_ms = negative_ttl_ms;
    memset(er->ns_on, 0, sizeof(er->ns_on));
    engine_remote_seal_clear(er);
}

int engine_remote_fd(const struct store *s)
{
    return s->remote ? tier_remote_fd(s->remote->t) : -1;
}

void engine_remote_poll(struct store *s, uint64_t now)
{
    if (!s->remote)
        return;
    tier_remote_poll(s->remote->t);
    engine_remote_pump(s, now);
}

void engine_remote_stats(const struct store *s,
                         void (*put)(void *arg, const char *name, uint64_t v), void *arg)
{
    const struct engine_remote *er = s->remote;
    struct tier_remote_stats st;
    if (!er)
        return;
    tier_remote_stats(er->t, &st);
    put(arg, "remote_nodes", st.nodes);
    put(arg, "remote_slots", st.slots);
    put(arg, "remote_inflight", st.inflight);
    put(arg, "remote_degraded", st.degraded);
    put(arg, "remote_queue", er->wq_n);
    put(arg, "remote_gets", st.gets);
    put(arg, "remote_puts", st.puts);
    put(arg, "remote_bytes_read", st.bytes_read);
    put(arg, "remote_bytes_written", st.bytes_written);
    put(arg, "remote_errors", st.errors);
    put(arg, "remote_fast_fails", st.fast_fails);
    put(arg, "remote_moved", st.moved);
    put(arg, "remote_asked", st.asked);
    put(arg, "remote_refreshes", st.refreshes);
    put(arg, "remote_connects", st.connects);
    put(arg, "remote_trips", st.trips);
    put(arg, "remote_batches", st.batches);
    put(arg, "remote_parts_read", st.parts_read);
    put(arg, "remote_parts_written", st.parts_written);
    put(arg, "remote_part_missing", st.part_missing);
    put(arg, "remote_part_mixed", st.part_mixed);
    put(arg, "remote_sealed", er->seal != NULL);
#define ENGINE_REMOTE_PUT(name, help) put(arg, #name, er->name);
    ENGINE_REMOTE_COUNTERS(ENGINE_REMOTE_PUT)
#undef ENGINE_REMOTE_PUT
}
