/*
 * tiering.c — the tier engine; see tiering.h for the design.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"
#include "daemon/quant.h"
#include "daemon/store.h"
#include "daemon/tiering.h"
#include "tiers/disk.h"
#include "tiers/host.h"
#include "tiers/tier.h"

/* Blocks looked at from the cold end per demotion pass. */
#define TIERING_WALK 4096
/* Compaction moves in flight at most: it shares the write queue and rate with demotion. */
#define TIERING_COMPACT_INFLIGHT 2

#define TIERING_STAT_ADD(s, nsp, field, v)                                                     \
    do {                                                                                       \
        (s)->total.field += (v);                                                               \
        (nsp)->stats.field += (v);                                                             \
    } while (0)

struct tiering {
    struct tier *disk;
    uint32_t admit_hits;
    uint64_t demoting_bytes; /* host bytes whose write is in flight */
    uint64_t moves;          /* in flight */
    uint64_t demote_cancelled;
    uint64_t disk_full;      /* demotions that found no room even after eviction */
    uint32_t compact_below;  /* percent of a page still live under which it is compacted */
    uint32_t compact_page;   /* the page being emptied; UINT32_MAX: none */
    uint32_t compacting;     /* compaction moves in flight */
    uint32_t compact_idx[TIERING_COMPACT_INFLIGHT]; /* their blocks; INDEX_NONE: free */
    uint64_t compacted_pages, compacted_blocks, compacted_bytes, compact_aborted;
    int compress_level;      /* disk.compress: zstd level, 0 raw */
    int (*ns_level)(void *arg, const char *model_id); /* a namespace's own level, or -1 */
    void *ns_level_arg;
    int16_t *levels;         /* by namespace id: its level, -1 the default, INT16_MIN unknown */
    uint32_t nlevels;
};

static void tiering_compact(struct store *s);

enum tiering_move_kind {
    TIERING_MOVE_DEMOTE = 1,
    TIERING_MOVE_PROMOTE = 2,
    TIERING_MOVE_COMPACT = 3,
};

/* One copy in flight; owned by the disk tier's callback until it runs. */
struct tiering_move {
    struct store *s;
    uint32_t idx;
    uint8_t kind;
    struct tier_loc host; /* DEMOTE: the slot being copied; PROMOTE: the new slot;
                             COMPACT: the new record */
    struct tier_loc disk; /* DEMOTE: the new record; PROMOTE, COMPACT: the record read */
    struct kvc_wire_key key; /* COMPACT: the block, to know it is still the same one */
    uint16_t ns;
    void *buf;               /* COMPACT: the record's bytes between read and write */
    uint64_t now;            /* DEMOTE: when it started (to pick disk victims) */
};

static struct tier *tiering_host(const struct store *s, const struct block *b)
{
    (void)b;
    return s->arenas[0].tier;
}

/* Bytes of block b in memory: its namespace's block size, or the encoded size of its
 * quantized format. */
static uint64_t tiering_block_bytes(const struct store *s, const struct block *b)
{
    const struct store_ns *ns = s->ns[b->ns];
    int64_t n = quant_format_bytes(ns, b->format);
    return n > 0 ? (uint64_t)n : ns->block_bytes;
}

static void tiering_meta(const struct store *s, const struct block *b, struct tier_disk_meta *m)
{
    const struct store_ns *ns = s->ns[b->ns];
    memset(m, 0, sizeof(*m));
    m->key[0] = b->key.lo;
    m->key[1] = b->key.hi;
    m->parent[0] = b->parent.lo;
    m->parent[1] = b->parent.hi;
    m->depth = b->depth;
    m->len = tiering_block_bytes(s, b);
    m->format = b->format;
    _Static_assert(sizeof(ns->layout) <= sizeof(m->ns), "layout fits a record header");
    memcpy(m->ns, &ns->layout, sizeof(ns->layout));
}

static void tiering_block_set(struct store *s, uint32_t idx, uint8_t tier, uint32_t arena,
                              const struct tier_loc *loc)
{
    struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    ns->bytes = ns->bytes - b->len + loc->len;
    b->tier = tier;
    b->arena = (uint8_t)arena;
    b->off = loc->off;
    b->len = loc->len;
    if (tier == KVC_WIRE_TIER_DISK) {
        b->ver = (uint32_t)loc->cls;
        b->cls = 0;
    } else {
        b->cls = (uint8_t)loc->cls;
        b->ver = 0;
    }
}

/* The zstd level of namespace ns_id's blocks on disk: its section's disk_compress, else
 * disk.compress. Looked up once per namespace (and again after a reload). */
static int tiering_level(struct store *s, uint16_t ns_id)
{
    struct tiering *tg = s->tiering;
    if (ns_id >= tg->nlevels) {
        uint32_t n = tg->nlevels ? tg->nlevels : 64;
        int16_t *v;
        while (n <= ns_id)
            n *= 2;
        v = realloc(tg->levels, n * sizeof(*v));
        if (!v)
            return tg->compress_level;
        for (uint32_t i = tg->nlevels; i < n; i++)
            v[i] = INT16_MIN;
        tg->levels = v;
        tg->nlevels = n;
    }
    if (tg->levels[ns_id] == INT16_MIN) {
        int l = tg->ns_level ? tg->ns_level(tg->ns_level_arg, s->ns[ns_id]->layout.model_id) : -1;
        tg->levels[ns_id] = (int16_t)(l >= 0 && l <= 19 ? l : -1);
    }
    return tg->levels[ns_id] >= 0 ? tg->levels[ns_id] : tg->compress_level;
}

/* Byte planes for raw 16-bit floats (docs/disk.md: 1.18x vs 1.09x on fp16), plain zstd for
 * anything else (quantized blocks are bytes already). */
static int tiering_codec(const struct store *s, const struct block *b)
{
    uint8_t dt = s->ns[b->ns]->layout.dtype;
    return b->format == KVC_WIRE_FORMAT_RAW &&
                   (dt == KVC_WIRE_DTYPE_FP16 || dt == KVC_WIRE_DTYPE_BF16)
               ? TIER_DISK_CODEC_ZSTD_PLANES
               : TIER_DISK_CODEC_ZSTD;
}

static void tiering_ready(struct store *s)
{
    if (s->on_ready)
        s->on_ready(s->on_ready_arg);
}

/* ---- demotion -------------------------------------------------------------------------- */

static void tiering_demote_done(void *arg, int status)
{
    struct tiering_move *mv = arg;
    struct store *s = mv->s;
    struct tiering *tg = s->tiering;
    struct block *b = &s->ix.blocks[mv->idx];
    struct store_ns *ns = s->ns[b->ns];
    struct tier *host = tiering_host(s, b);
    tg->moves--;
    tg->demoting_bytes -= mv->host.len;
    b->flags &= (uint8_t)~BLOCK_F_DEMOTING;
    if (status) {
        log_limited(LOG_LEVEL_WARNING, "disk: write of a block failed (%s); it stays in memory",
                    strerror(-status));
        TIERING_STAT_ADD(s, ns, disk_io_errors, 1);
        tg->disk->ops->free(tg->disk, &mv->disk);
    } else if (b->pins) {
        /* Taken by a lookup while it was written: it stays in memory. */
        tg->demote_cancelled++;
        tg->disk->ops->free(tg->disk, &mv->disk);
    } else {
        store_lru_unlink(s, mv->idx);
        host->ops->free(host, &mv->host);
        tiering_block_set(s, mv->idx, KVC_WIRE_TIER_DISK, STORE_ARENA_DISK, &mv->disk);
        store_lru_push_head(s, mv->idx);
        TIERING_STAT_ADD(s, ns, demoted_blocks, 1);
    }
    free(mv);
}

/* Room for len bytes on disk, evicting unpinned leaves there. 0 or -ENOSPC / -EIO. */
static int tiering_disk_alloc(struct store *s, uint64_t len, uint64_t now, struct tier_loc *loc)
{
    struct tiering *tg = s->tiering;
    for (int k = 0; k < 4096; k++) {
        int rc = tg->disk->ops->alloc(tg->disk, len, loc);
        uint32_t v;
        if (rc != -ENOSPC)
            return rc;
        v = store_victim(s, STORE_ARENA_DISK, -1, now);
        if (v == INDEX_NONE)
            break;
        TIERING_STAT_ADD(s, s->ns[s->ix.blocks[v].ns], disk_evicted_blocks, 1);
        store_evict(s, v);
    }
    tg->disk_full++;
    return -ENOSPC;
}

/* A demotion that ends before its write: the block stays in memory. */
static void tiering_demote_abandon(struct store *s, struct tiering_move *mv)
{
    struct tiering *tg = s->tiering;
    tg->moves--;
    tg->demoting_bytes -= mv->host.len;
    s->ix.blocks[mv->idx].flags &= (uint8_t)~BLOCK_F_DEMOTING;
    free(mv);
}

/* The record of a demotion is encoded (hashed, compressed): now its size is known, the
 * record is allocated and written. */
static void tiering_demote_encoded(void *arg, struct tier_disk_rec *r, int status)
{
    struct tiering_move *mv = arg;
    struct store *s = mv->s;
    struct tiering *tg = s->tiering;
    uint32_t idx = mv->idx;
    int rc;
    if (status) {
        tiering_demote_abandon(s, mv);
        return;
    }
    if (s->ix.blocks[idx].pins) { /* taken by a lookup meanwhile: it stays in memory */
        tg->demote_cancelled++;
        tier_disk_rec_free(tg->disk, r);
        tiering_demote_abandon(s, mv);
        return;
    }
    rc = tiering_disk_alloc(s, tier_disk_rec_len(r), mv->now, &mv->disk);
    if (rc) {
        const struct block *b = &s->ix.blocks[idx];
        tier_disk_rec_free(tg->disk, r);
        tiering_demote_abandon(s, mv);
        if (!b->children && !b->pins) { /* the disk cannot take it: dropped as without one */
            TIERING_STAT_ADD(s, s->ns[b->ns], demote_dropped, 1);
            store_evict(s, idx);
        }
        return;
    }
    if (tier_disk_rec_put(tg->disk, &mv->disk, r, tiering_demote_done, mv)) {
        tg->disk->ops->free(tg->disk, &mv->disk);
        tiering_demote_abandon(s, mv);
    }
}

/* Starts the encoding of one host block for disk. 0, -EAGAIN (try later), or another
 * -errno (drop). */
static int tiering_demote_one(struct store *s, uint32_t idx, uint64_t now)
{
    struct tiering *tg = s->tiering;
    struct block *b = &s->ix.blocks[idx];
    struct tier *host = tiering_host(s, b);
    struct tier_disk_meta m;
    struct tiering_move *mv;
    int rc;
    tiering_meta(s, b, &m);
    rc = tier_disk_put_ready(tg->disk, m.len);
    if (rc)
        return rc;
    if (!tier_disk_can_alloc(tg->disk, m.len) &&
        store_victim(s, STORE_ARENA_DISK, -1, now) == INDEX_NONE) {
        tg->disk_full++;
        return -ENOSPC; /* nothing on disk can make room: not worth encoding */
    }
    mv = calloc(1, sizeof(*mv));
    if (!mv)
        return -ENOMEM;
    mv->s = s;
    mv->idx = idx;
    mv->kind = TIERING_MOVE_DEMOTE;
    mv->now = now;
    mv->host = (struct tier_loc){.arena = b->arena, .cls = b->cls, .off = b->off, .len = b->len};
    rc = tier_disk_encode(tg->disk, &m, (uint8_t *)tier_host_base(host) + b->off,
                          tiering_codec(s, b), tiering_level(s, b->ns), tiering_demote_encoded,
                          mv);
    if (rc) {
        free(mv);
        return rc;
    }
    b = &s->ix.blocks[idx];
    b->flags |= BLOCK_F_DEMOTING;
    tg->moves++;
    tg->demoting_bytes += mv->host.len;
    return 0;
}

int tiering_demote(struct store *s, uint64_t now)
{
    struct tiering *tg = s->tiering;
    int acted = 0;
    tiering_compact(s);
    for (uint32_t a = 0; a < s->narenas; a++) {
        struct tier *t = s->arenas[a].tier;
        double cap = (double)t->ops->capacity(t);
        uint32_t walked = 0, i;
        if ((double)t->ops->usage(t) <= s->p.high_watermark * cap)
            continue;
        i = s->arenas[a].lru_tail;
        while (i != INDEX_NONE && walked++ < TIERING_WALK &&
               (double)(t->ops->usage(t) - tg->demoting_bytes) > s->p.low_watermark * cap) {
            struct block *b = &s->ix.blocks[i];
            uint32_t prev = b->lru_prev;
            int rc = -ENOSPC;
            if (b->pins || (b->flags & BLOCK_F_MOVING)) {
                i = prev;
                continue;
            }
            if (b->hits >= tg->admit_hits || b->children)
                rc = tiering_demote_one(s, i, now);
            if (rc == -EAGAIN)
                break; /* rate or queue limit: the next tick goes on */
            if (rc && !s->ix.blocks[i].children) {
                /* Not admitted, or the disk cannot take it: dropped as without a disk. */
                TIERING_STAT_ADD(s, s->ns[s->ix.blocks[i].ns], demote_dropped, 1);
                store_evict(s, i);
            }
            acted++;
            i = prev;
        }
    }
    return acted;
}

/* One block chosen by the policy engine (store_policy.c): its write to disk starts. 0,
 * -EAGAIN (rate or queue limit: later), -EBUSY (pinned or moving), another -errno. */
int tiering_offload(struct store *s, uint32_t idx, uint64_t now)
{
    const struct block *b = &s->ix.blocks[idx];
    if (!s->tiering)
        return -ENODEV;
    if (b->pins || (b->flags & BLOCK_F_MOVING) || b->tier != KVC_WIRE_TIER_HOST)
        return -EBUSY;
    return tiering_demote_one(s, idx, now);
}

uint64_t tiering_pending_bytes(const struct store *s)
{
    return s->tiering ? s->tiering->demoting_bytes : 0;
}

/* ---- compaction ------------------------------------------------------------------------ */

/* Whether the block of a compaction move is still on disk at the record that was read. */
static bool tiering_compact_same(const struct store *s, const struct tiering_move *mv)
{
    const struct block *b = &s->ix.blocks[mv->idx];
    return b->key.lo == mv->key.lo && b->key.hi == mv->key.hi && b->ns == mv->ns &&
           b->tier == KVC_WIRE_TIER_DISK && !(b->flags & (BLOCK_F_MOVING | BLOCK_F_LOST)) &&
           b->off == mv->disk.off && b->ver == (uint32_t)mv->disk.cls;
}

static void tiering_compact_end(struct store *s, struct tiering_move *mv, bool moved)
{
    struct tiering *tg = s->tiering;
    for (uint32_t k = 0; k < TIERING_COMPACT_INFLIGHT; k++)
        if (tg->compact_idx[k] == mv->idx) {
            tg->compact_idx[k] = INDEX_NONE;
            break;
        }
    tg->compacting--;
    if (moved) {
        tg->compacted_blocks++;
        tg->compacted_bytes += mv->disk.len;
    } else {
        tg->compact_aborted++;
    }
    free(mv->buf);
    free(mv);
}

static void tiering_compact_write_done(void *arg, int status)
{
    struct tiering_move *mv = arg;
    struct store *s = mv->s;
    struct tiering *tg = s->tiering;
    bool moved = status == 0 && tiering_compact_same(s, mv);
    if (moved) {
        /* The new record is complete: the index switches to it, the old one dies. */
        tiering_block_set(s, mv->idx, KVC_WIRE_TIER_DISK, STORE_ARENA_DISK, &mv->host);
        tg->disk->ops->free(tg->disk, &mv->disk);
    } else {
        tg->disk->ops->free(tg->disk, &mv->host);
    }
    tiering_compact_end(s, mv, moved);
}

static void tiering_compact_encoded(void *arg, struct tier_disk_rec *r, int status)
{
    struct tiering_move *mv = arg;
    struct store *s = mv->s;
    struct tiering *tg = s->tiering;
    if (status || !tiering_compact_same(s, mv) ||
        tg->disk->ops->alloc(tg->disk, tier_disk_rec_len(r), &mv->host)) {
        tier_disk_rec_free(tg->disk, r);
        tiering_compact_end(s, mv, false);
        return;
    }
    if (tier_disk_rec_put(tg->disk, &mv->host, r, tiering_compact_write_done, mv)) {
        tg->disk->ops->free(tg->disk, &mv->host);
        tiering_compact_end(s, mv, false);
    }
}

static void tiering_compact_read_done(void *arg, int status)
{
    struct tiering_move *mv = arg;
    struct store *s = mv->s;
    struct tiering *tg = s->tiering;
    const struct block *b = &s->ix.blocks[mv->idx];
    struct tier_disk_meta m;
    /* A record that fails verification is left to the next promotion, which marks it lost. */
    if (status || !tiering_compact_same(s, mv))
        goto abort;
    /* Encoded again (at the namespace's level now) from the block read back. */
    tiering_meta(s, b, &m);
    if (tier_disk_encode(tg->disk, &m, mv->buf, tiering_codec(s, b), tiering_level(s, b->ns),
                         tiering_compact_encoded, mv))
        goto abort;
    return;
abort:
    tiering_compact_end(s, mv, false);
}

/* Starts moving one record off the page being compacted. 0 or -errno. */
static int tiering_compact_one(struct store *s, uint32_t idx)
{
    struct tiering *tg = s->tiering;
    struct block *b = &s->ix.blocks[idx];
    struct tier_disk_meta m;
    struct tiering_move *mv;
    int rc;
    tiering_meta(s, b, &m);
    /* No read whose copy could not be written now. */
    rc = tier_disk_put_ready(tg->disk, m.len);
    if (rc)
        return rc;
    if (!tier_disk_can_alloc(tg->disk, m.len))
        return -EAGAIN;
    mv = calloc(1, sizeof(*mv));
    if (!mv)
        return -ENOMEM;
    mv->buf = aligned_alloc(4096, (m.len + 4095) & ~4095ull);
    if (!mv->buf) {
        free(mv);
        return -ENOMEM;
    }
    mv->s = s;
    mv->idx = idx;
    mv->kind = TIERING_MOVE_COMPACT;
    mv->key = b->key;
    mv->ns = b->ns;
    mv->disk = (struct tier_loc){.arena = 0, .cls = b->ver, .off = b->off, .len = b->len};
    rc = tier_disk_get(tg->disk, &mv->disk, &m, mv->buf, (m.len + 4095) & ~4095ull,
                       tiering_compact_read_done, mv);
    if (rc) {
        free(mv->buf);
        free(mv);
        return rc;
    }
    tg->compacting++;
    for (uint32_t k = 0; k < TIERING_COMPACT_INFLIGHT; k++)
        if (tg->compact_idx[k] == INDEX_NONE) {
            tg->compact_idx[k] = idx;
            break;
        }
    return 0;
}

/* Empties pages mostly dead once the disk runs short of free pages (less than a quarter):
 * their live records are read, verified and appended to the open page, and the index
 * switches to the copy once it is on the device. One page at a time, bounded by the write
 * queue and rate shared with demotion. */
static void tiering_compact(struct store *s)
{
    struct tiering *tg = s->tiering;
    uint32_t i, left = 0;
    if (!tg->compact_below)
        return;
    if (tg->compact_page == UINT32_MAX) {
        struct tier_disk_stats st;
        if (tg->compacting)
            return;
        tier_disk_stats_get(tg->disk, &st);
        if (st.pages_free * 4 >= st.pages ||
            tier_disk_compact_pick(tg->disk, tg->compact_below, &tg->compact_page))
            return;
    }
    for (i = s->arenas[STORE_ARENA_DISK].lru_tail; i != INDEX_NONE;) {
        const struct block *b = &s->ix.blocks[i];
        uint32_t prev = b->lru_prev;
        struct tier_loc loc = {.cls = b->ver, .off = b->off, .len = b->len};
        bool busy = false;
        if (b->tier == KVC_WIRE_TIER_DISK && !(b->flags & (BLOCK_F_MOVING | BLOCK_F_LOST)) &&
            tier_disk_page_of(tg->disk, &loc) == (int)tg->compact_page) {
            left++;
            for (uint32_t k = 0; k < TIERING_COMPACT_INFLIGHT; k++)
                busy |= tg->compact_idx[k] == i;
            if (!busy && tg->compacting < TIERING_COMPACT_INFLIGHT &&
                tiering_compact_one(s, i) == -EAGAIN)
                break;
        }
        i = prev;
    }
    if (left == 0 && tg->compacting == 0) {
        tg->compacted_pages++;
        tg->compact_page = UINT32_MAX;
    }
}

/* ---- promotion ------------------------------------------------------------------------- */

static void tiering_promote_done(void *arg, int status)
{
    struct tiering_move *mv = arg;
    struct store *s = mv->s;
    struct tiering *tg = s->tiering;
    struct block *b = &s->ix.blocks[mv->idx];
    struct store_ns *ns = s->ns[b->ns];
    struct tier *host = tiering_host(s, b);
    tg->moves--;
    b->flags &= (uint8_t)~BLOCK_F_PROMOTING;
    tg->disk->ops->free(tg->disk, &mv->disk);
    if (status == 0) {
        TIERING_STAT_ADD(s, ns, promoted_blocks, 1);
    } else {
        if (status == -EBADMSG) {
            TIERING_STAT_ADD(s, ns, checksum_failures, 1);
            log_limited(LOG_LEVEL_WARNING,
                        "disk: block %016llx%016llx failed verification; dropped",
                        (unsigned long long)b->key.hi, (unsigned long long)b->key.lo);
        } else {
            TIERING_STAT_ADD(s, ns, disk_io_errors, 1);
            log_limited(LOG_LEVEL_WARNING, "disk: read of a block failed (%s); dropped",
                        strerror(-status));
        }
        /* No copy is left: a miss from now on; it goes once free of pins and children. */
        store_lru_unlink(s, mv->idx);
        host->ops->free(host, &mv->host);
        b->flags |= BLOCK_F_LOST;
        b->tier = 0;
        b->arena = STORE_ARENA_DISK;
        ns->bytes -= b->len;
        b->len = 0;
        store_lru_push_head(s, mv->idx);
        if (!b->pins && !b->children)
            store_block_drop(s, mv->idx);
    }
    free(mv);
    tiering_ready(s);
}

/* A host slot of len bytes in ns's arena, evicting as store_alloc does (a quantized block
 * comes back into a slot of its encoded size). */
static int tiering_host_alloc(struct store *s, struct store_ns *ns, uint64_t len, uint64_t now,
                              struct tier_loc *loc)
{
    struct tier *t = s->arenas[ns->arena].tier;
    int cls = tier_host_class(t, len);
    if (len == ns->block_bytes)
        return store_alloc(s, ns, now, loc);
    for (;;) {
        int rc = t->ops->alloc(t, len, loc);
        uint32_t v;
        if (rc != -ENOSPC)
            return rc;
        v = store_victim(s, ns->arena, cls, now);
        if (v == INDEX_NONE)
            return -ENOSPC;
        store_evict(s, v);
    }
}

static int tiering_promote(struct store *s, uint32_t idx, uint64_t now)
{
    struct tiering *tg = s->tiering;
    struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    struct tier *host = tiering_host(s, b);
    struct tier_disk_meta m;
    struct tiering_move *mv = calloc(1, sizeof(*mv));
    int rc;
    if (!mv)
        return -ENOMEM;
    rc = tiering_host_alloc(s, ns, tiering_block_bytes(s, b), now, &mv->host);
    if (rc) {
        free(mv);
        return rc;
    }
    b = &s->ix.blocks[idx];
    tiering_meta(s, b, &m);
    mv->s = s;
    mv->idx = idx;
    mv->kind = TIERING_MOVE_PROMOTE;
    mv->disk = (struct tier_loc){.arena = 0, .cls = b->ver, .off = b->off, .len = b->len};
    rc = tier_disk_get(tg->disk, &mv->disk, &m, (uint8_t *)tier_host_base(host) + mv->host.off,
                       mv->host.len, tiering_promote_done, mv);
    if (rc) {
        host->ops->free(host, &mv->host);
        free(mv);
        return rc;
    }
    store_lru_unlink(s, idx);
    tiering_block_set(s, idx, KVC_WIRE_TIER_HOST, ns->arena, &mv->host);
    b->flags |= BLOCK_F_PROMOTING;
    store_lru_push_head(s, idx);
    tg->moves++;
    return 0;
}

uint32_t tiering_lookup_prepare(struct store *s, uint16_t ns, const struct kvc_wire_key *keys,
                                uint32_t hits, uint32_t flags, uint64_t now)
{
    uint32_t usable = hits;
    /* Hold every hit while slots are found for the ones on disk, so making room cannot
     * evict an earlier hit of this very lookup. */
    for (uint32_t i = 0; i < hits; i++)
        s->ix.blocks[index_find(&s->ix, ns, &keys[i])].pins++;
    for (uint32_t i = 0; i < hits; i++) {
        uint32_t idx = index_find(&s->ix, ns, &keys[i]);
        const struct block *b = &s->ix.blocks[idx];
        if (b->tier == KVC_WIRE_TIER_DISK && !(b->flags & BLOCK_F_MOVING) &&
            tiering_promote(s, idx, now)) {
            usable = i;
            break;
        }
    }
    if (flags & KVC_LOOKUP_F_READY_ONLY)
        for (uint32_t i = 0; i < usable; i++)
            if (s->ix.blocks[index_find(&s->ix, ns, &keys[i])].flags & BLOCK_F_PROMOTING) {
                usable = i;
                break;
            }
    for (uint32_t i = 0; i < hits; i++)
        s->ix.blocks[index_find(&s->ix, ns, &keys[i])].pins--;
    return usable;
}

int tiering_lease_state(struct store *s, struct store_owner *owner, uint64_t lease_id, uint32_t *nhit,
                        uint32_t *nready, uint32_t *pending)
{
    struct store_handle *h = store_handle_get(owner, lease_id, STORE_HANDLE_LEASE);
    bool stop = false;
    if (!h)
        return -ENOENT;
    *nhit = h->n;
    *nready = 0;
    *pending = 0;
    for (uint32_t i = 0; i < h->n; i++) {
        const struct block *b = &s->ix.blocks[h->blocks[i]];
        if (b->flags & BLOCK_F_PROMOTING)
            (*pending)++;
        if (stop || (b->flags & (BLOCK_F_PROMOTING | BLOCK_F_LOST)))
            stop = true;
        else
            (*nready)++;
    }
    return 0;
}

/* ---- start and stop -------------------------------------------------------------------- */

struct tiering_found {
    struct tier_disk_meta m;
    struct tier_loc loc;
};

struct tiering_scan {
    struct tiering_found *v;
    size_t n, cap;
};

static int tiering_scan_cb(void *arg, const struct tier_disk_meta *m, const struct tier_loc *loc)
{
    struct tiering_scan *sc = arg;
    if (sc->n == sc->cap) {
        size_t ncap = sc->cap ? sc->cap * 2 : 1024;
        struct tiering_found *nv = realloc(sc->v, ncap * sizeof(*nv));
        if (!nv)
            return 1;
        sc->v = nv;
        sc->cap = ncap;
    }
    sc->v[sc->n++] = (struct tiering_found){.m = *m, .loc = *loc};
    return 0;
}

static int tiering_found_cmp(const void *a, const void *b)
{
    const struct tiering_found *x = a, *y = b;
    return x->m.depth < y->m.depth ? -1 : x->m.depth > y->m.depth;
}

/* Takes one record back into the index. 0, or -errno when it cannot be (then freed). */
static int tiering_adopt(struct store *s, const struct tiering_found *f)
{
    struct kvc_wire_layout l;
    struct kvc_wire_key key = {f->m.key[0], f->m.key[1]};
    struct kvc_wire_key parent = {f->m.parent[0], f->m.parent[1]};
    struct store_ns *ns;
    uint32_t ns_id, idx, p = INDEX_NONE;
    bool created;
    int rc;
    memcpy(&l, f->m.ns, sizeof(l));
    rc = store_ns_open(s, &l, &ns_id, &created);
    if (rc)
        return rc;
    ns = s->ns[ns_id];
    int64_t want = quant_format_bytes(ns, (uint8_t)f->m.format);
    if (want <= 0 || f->m.len != (uint64_t)want)
        return -EINVAL; /* not a block this namespace holds (its recipe changed?) */
    if (index_find(&s->ix, (uint16_t)ns_id, &key) != INDEX_NONE)
        return -EEXIST;
    if (!index_key_is_zero(&parent)) {
        p = index_find(&s->ix, (uint16_t)ns_id, &parent);
        if (p == INDEX_NONE || s->ix.blocks[p].depth + 1 != f->m.depth)
            return -ENOENT; /* orphan: its parent's write never completed */
    } else if (f->m.depth != 0) {
        return -EINVAL;
    }
    rc = index_block_new(&s->ix, &idx);
    if (rc)
        return rc;
    struct block *b = &s->ix.blocks[idx];
    b->key = key;
    b->parent = parent;
    b->depth = f->m.depth;
    b->ns = (uint16_t)ns_id;
    b->state = BLOCK_STATE_COMMITTED;
    b->format = (uint8_t)f->m.format;
    b->owner_slot = INDEX_NONE;
    b->tier = KVC_WIRE_TIER_DISK;
    b->arena = STORE_ARENA_DISK;
    b->off = f->loc.off;
    b->len = f->loc.len;
    b->ver = (uint32_t)f->loc.cls;
    rc = index_insert(&s->ix, idx);
    if (rc) {
        index_block_delete(&s->ix, idx);
        return rc;
    }
    if (p != INDEX_NONE)
        s->ix.blocks[p].children++;
    ns->blocks++;
    ns->bytes += b->len;
    store_lru_push_head(s, idx);
    return 0;
}

int tiering_attach(struct store *s, const struct tiering_params *p)
{
    struct tiering_scan sc = {0};
    struct tier_disk_config dc = {.npaths = p->npaths,
                                  .size = p->size,
                                  .page_size = p->page_size,
                                  .queue_depth = p->queue_depth,
                                  .write_rate = p->write_rate,
                                  .scan = tiering_scan_cb,
                                  .scan_arg = &sc,
                                  .progress = p->progress,
                                  .progress_arg = p->progress_arg,
                                  .workers = p->workers,
                                  .format = p->format,
                                  .ckpt_path = p->ckpt_path};
    struct tier_disk_stats st;
    struct tiering *tg = calloc(1, sizeof(*tg));
    size_t adopted = 0;
    int rc = -ENOMEM;
    if (!tg)
        goto out;
    if (p->npaths == 0 || p->npaths > TIER_DISK_MAX_PATHS) {
        rc = -EINVAL;
        goto out;
    }
    for (uint32_t i = 0; i < p->npaths; i++)
        dc.paths[i] = p->paths[i];
    tg->admit_hits = p->admit_hits;
    tg->compact_below = p->compact_below;
    tg->compress_level = p->compress_level;
    tg->ns_level = p->ns_level;
    tg->ns_level_arg = p->ns_level_arg;
    tg->compact_page = UINT32_MAX;
    for (uint32_t k = 0; k < TIERING_COMPACT_INFLIGHT; k++)
        tg->compact_idx[k] = INDEX_NONE;
    tg->disk = tier_disk_new(&dc, &rc);
    if (!tg->disk)
        goto out;
    tier_disk_stats_get(tg->disk, &st);
    if (st.buffered)
        log_warn("disk: O_DIRECT is not supported on %s: BUFFERED I/O in use (counted as "
                 "disk_buffered)",
                 p->paths[0]);
    rc = tier_disk_buffers_register(tg->disk, tier_host_base(s->arenas[0].tier),
                                    tier_host_size(s->arenas[0].tier));
    if (rc)
        log_warn("disk: cannot register the host arena with io_uring (%s); transfers pin "
                 "pages per request",
                 strerror(-rc));
    s->tiering = tg;
    s->arenas[STORE_ARENA_DISK].tier = tg->disk;
    s->arenas[STORE_ARENA_DISK].lru_head = s->arenas[STORE_ARENA_DISK].lru_tail = INDEX_NONE;
    /* Parents first, so every block finds its parent already back. */
    if (sc.n)
        qsort(sc.v, sc.n, sizeof(*sc.v), tiering_found_cmp);
    for (size_t i = 0; i < sc.n; i++) {
        if (tiering_adopt(s, &sc.v[i]) == 0)
            adopted++;
        else
            tg->disk->ops->free(tg->disk, &sc.v[i].loc);
    }
    log_info("disk: %llu MiB on %u path(s), %zu blocks taken back, %zu records dropped",
             (unsigned long long)(st.capacity >> 20), p->npaths, adopted, sc.n - adopted);
    rc = 0;
out:
    free(sc.v);
    if (rc && tg) {
        tier_destroy(tg->disk);
        free(tg);
    }
    return rc;
}

void tiering_free(struct store *s)
{
    struct tiering *tg = s->tiering;
    if (!tg)
        return;
    tier_disk_drain(tg->disk);
    tier_destroy(tg->disk);
    s->arenas[STORE_ARENA_DISK].tier = NULL;
    s->tiering = NULL;
    free(tg->levels);
    free(tg);
}

void tiering_compress_set(struct store *s, int level)
{
    struct tiering *tg = s->tiering;
    if (!tg)
        return;
    tg->compress_level = level;
    for (uint32_t i = 0; i < tg->nlevels; i++)
        tg->levels[i] = INT16_MIN; /* the sections may have changed too */
}

void tiering_reload(struct store *s, uint32_t admit_hits)
{
    if (s->tiering)
        s->tiering->admit_hits = admit_hits;
}

uint32_t tiering_admit_hits(const struct store *s)
{
    return s->tiering ? s->tiering->admit_hits : 0;
}

int tiering_fd(const struct store *s)
{
    return s->tiering ? tier_disk_fd(s->tiering->disk) : -1;
}

void tiering_poll(struct store *s, uint64_t now)
{
    if (!s->tiering)
        return;
    tier_disk_poll(s->tiering->disk);
    /* Room freed by completed writes may let the next demotions start. */
    tiering_demote(s, now);
}

void tiering_flush(struct store *s)
{
    if (s->tiering)
        tier_disk_flush(s->tiering->disk);
}

void tiering_stats(const struct store *s, void (*put)(void *arg, const char *name, uint64_t v),
                   void *arg)
{
    struct tier_disk_stats st;
    const struct tiering *tg = s->tiering;
    uint64_t closed, blocks = 0;
    if (!tg)
        return;
    tier_disk_stats_get(tg->disk, &st);
    closed = st.used + st.dead_bytes;
    for (uint32_t i = s->arenas[STORE_ARENA_DISK].lru_head; i != INDEX_NONE;
         i = s->ix.blocks[i].lru_next)
        blocks += s->ix.blocks[i].tier == KVC_WIRE_TIER_DISK;
    put(arg, "disk_blocks", blocks);
    put(arg, "disk_capacity", st.capacity);
    put(arg, "disk_used", st.used);
    put(arg, "disk_pages", st.pages);
    put(arg, "disk_pages_free", st.pages_free);
    put(arg, "disk_dead_bytes", st.dead_bytes);
    put(arg, "disk_fragmentation_pct", closed ? st.dead_bytes * 100 / closed : 0);
    put(arg, "disk_reads_inflight", st.reads_inflight);
    put(arg, "disk_writes_inflight", st.writes_inflight);
    put(arg, "disk_reads", st.reads);
    put(arg, "disk_writes", st.writes);
    put(arg, "disk_bytes_read", st.bytes_read);
    put(arg, "disk_bytes_written", st.bytes_written);
    put(arg, "disk_read_errors", st.read_errors);
    put(arg, "disk_write_errors", st.write_errors);
    put(arg, "disk_checksum_failures", st.checksum_failures);
    put(arg, "disk_throttled", st.throttled + st.queue_full);
    put(arg, "disk_full", tg->disk_full);
    put(arg, "disk_failed_paths", st.failed_paths);
    put(arg, "disk_buffered", st.buffered);
    put(arg, "disk_fixed_buffers", st.fixed_buffers);
    put(arg, "disk_records_found", st.records_found);
    put(arg, "disk_demote_cancelled", tg->demote_cancelled);
    put(arg, "disk_moves_inflight", tg->moves + tg->compacting);
    put(arg, "disk_compacted_pages", tg->compacted_pages);
    put(arg, "disk_compacted_blocks", tg->compacted_blocks);
    put(arg, "disk_compacted_bytes", tg->compacted_bytes);
    put(arg, "disk_compact_aborted", tg->compact_aborted);
    put(arg, "disk_compress_in", st.codec_in);
    put(arg, "disk_compress_out", st.codec_out);
    put(arg, "disk_compress_ratio_pct", st.codec_out ? st.codec_in * 100 / st.codec_out : 0);
    put(arg, "disk_compressed_records", st.compressed);
    put(arg, "disk_incompressible_records", st.incompressible);
    tiering_checkpoint_stats(s, put, arg);
}
