/*
 * engine_disk.c — the tier engine; see engine_disk.h for the design.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine_core.h"
#include "daemon/engine_disk.h"
#include "daemon/log.h"
#include "daemon/quant.h"
#include "daemon/store.h"
#include "kernels/kern.h"
#include "tiers/disk.h"
#include "tiers/host.h"
#include "tiers/tier.h"

/* Blocks looked at from the cold end of a dirty list per write-back pass. */
#define ENGINE_DISK_WALK 4096
/* Compaction moves in flight at most: it shares the write queue and rate with demotion. */
#define ENGINE_DISK_COMPACT_INFLIGHT 2
/* Rate estimates: sampled at most this often, averaged with this weight for a new sample. */
#define ENGINE_DISK_RATE_MS 100
#define ENGINE_DISK_RATE_ALPHA 0.3

#define ENGINE_DISK_STAT_ADD(s, nsp, field, v)                                                     \
    do {                                                                                           \
        (s)->total.field += (v);                                                                   \
        (nsp)->stats.field += (v);                                                                 \
    } while (0)

struct engine_disk {
    bool bufs_done; /* engine_disk_buffers_register ran (registered or refused) */
    struct tier *disk;
    uint32_t admit_hits;
    uint32_t npaths;
    bool down;          /* every path failed: nothing more can be written */
    bool stuck;         /* the disk is full of what it cannot evict (parents of blocks
                                in memory): dirty leaves go as without a disk until it is not */
    uint64_t stuck_len; /* the record that found no room */
    uint64_t moves;     /* writes and reads in flight */
    uint64_t writing[STORE_MAX_ARENAS + 2]; /* memory bytes of each arena being written */
    uint64_t freeing[STORE_MAX_ARENAS + 2]; /* of those, demotions: freed once written */
    uint64_t demote_cancelled;
    uint64_t disk_full;     /* writes that found no room even after eviction */
    uint32_t compact_below; /* percent of a page still live under which it is compacted */
    uint32_t compact_page;  /* the page being emptied; UINT32_MAX: none */
    uint32_t compacting;    /* compaction moves in flight */
    uint32_t compact_idx[ENGINE_DISK_COMPACT_INFLIGHT]; /* their blocks; INDEX_NONE: free */
    uint64_t compacted_pages, compacted_blocks, compacted_bytes, compact_aborted;
    int compress_level;                               /* disk.compress: zstd level, 0 raw */
    int (*ns_level)(void *arg, const char *model_id); /* a namespace's level, or -1 */
    void *ns_level_arg;
    int16_t *levels; /* by namespace id: its level, -1 the default, INT16_MIN unknown */
    uint32_t nlevels;
    /* What the write-back target follows: committed bytes per second (puts) and bytes the
     * disk wrote per second, both smoothed. */
    uint64_t rate_ms, rate_in, rate_written;
    double put_bps, write_bps;
    /* Promotions whose read waits for a slot in the disk's read queue (a lookup hands out
     * every hit at once; WAIT answers when all are read), oldest first. */
    struct engine_disk_move *rq_head, *rq_tail;
    uint64_t reads_queued;
    /* Puts that wait for write-back (engine_disk_write_ahead): by host arena, the bytes its
     * puts asked to be written that no write of it has started yet; how many arenas have
     * some; the one whose turn it is to start the next write while any has. */
    uint64_t need[STORE_MAX_ARENAS];
    uint32_t needy, turn;
};

static void engine_disk_compact(struct store *s);

enum engine_disk_move_kind {
    ENGINE_DISK_MOVE_WRITE = 1,   /* a memory block to disk; it stays in memory, clean */
    ENGINE_DISK_MOVE_PROMOTE = 2, /* a disk block into a fresh memory slot */
    ENGINE_DISK_MOVE_COMPACT = 3, /* a record to another page */
};

/* One copy in flight; owned by the disk tier's callback until it runs. */
struct engine_disk_move {
    struct store *s;
    uint32_t idx;
    uint8_t kind;
    bool demote;             /* WRITE: free the memory copy once written (pressure) */
    uint32_t arena;          /* WRITE: the arena it is written from */
    struct tier_loc host;    /* WRITE: the slot being copied; PROMOTE: the new slot;
                             COMPACT: the new record */
    struct tier_loc disk;    /* WRITE: the new record; PROMOTE, COMPACT: the record read */
    struct kvc_wire_key key; /* COMPACT: the block, to know it is still the same one */
    uint16_t ns;
    void *buf;                     /* COMPACT: the record's bytes between read and write */
    struct engine_disk_move *next; /* PROMOTE: in the read queue */
    uint64_t now;                  /* WRITE: when it started (to pick disk victims) */
    /* WRITE of a raw block with no value norm yet: its layout, and the mean value L1 norm
     * the encode worker measures (engine_disk_peek) while it reads the bytes to hash them,
     * applied on the loop once the record is encoded (VATP's signal, as the quantize pass
     * measures it; a block that never met that pass would have none). */
    bool peek;
    struct kern_layout lay;
    float vnorm;
};

/* ---- a block's locations ---------------------------------------------------------------- */

/* The memory tier (host arena or GPU pool) holding block b, which is in memory. */
static struct tier *engine_disk_mem(const struct store *s, const struct block *b)
{
    return s->arenas[b->arena].tier;
}

_Static_assert(STORE_RECORD_ALIGN == TIER_DISK_ALIGN, "record offsets in the tier's units");

/* Bytes of block b in memory: its namespace's block size, or the encoded size of its
 * quantized format. */
static uint64_t engine_disk_block_bytes(const struct store *s, const struct block *b)
{
    const struct store_ns *ns = s->ns[b->ns];
    int64_t n = store_format_bytes(ns, b->format);
    return n > 0 ? (uint64_t)n : ns->block_bytes;
}

void engine_disk_meta(const struct store *s, const struct block *b, struct tier_disk_meta *m)
{
    const struct store_ns *ns = s->ns[b->ns];
    struct kvc_wire_key parent = index_parent_key(&s->ix, b);
    memset(m, 0, sizeof(*m));
    m->key[0] = b->key.lo;
    m->key[1] = b->key.hi;
    m->parent[0] = parent.lo;
    m->parent[1] = parent.hi;
    m->depth = b->depth;
    m->len = engine_disk_block_bytes(s, b);
    m->format = b->format;
    _Static_assert(sizeof(ns->layout) <= sizeof(m->ns), "layout fits a record header");
    memcpy(m->ns, &ns->layout, sizeof(ns->layout));
}

/* A clean block in memory gives its memory back and stays cached on disk: no write. */
static void engine_disk_memory_release(struct store *s, uint32_t idx)
{
    struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    struct tier *t = engine_disk_mem(s, b);
    struct tier_loc loc = {.arena = b->arena, .cls = b->cls, .off = b->off, .len = b->len};
    store_lru_unlink(s, idx);
    t->ops->free(t, &loc);
    ns->bytes = ns->bytes - b->len + s->rec[idx].len;
    b->tier = KVC_WIRE_TIER_DISK;
    b->arena = STORE_ARENA_DISK;
    b->off = (uint64_t)s->rec[idx].doff * TIER_DISK_ALIGN;
    b->len = s->rec[idx].len;
    b->cls = 0;
    store_lru_push_head(s, idx);
}

void engine_disk_memory_drop(struct store *s, uint32_t idx)
{
    const struct block *b = &s->ix.blocks[idx];
    if (!store_block_idle(s, idx) || b->tier == KVC_WIRE_TIER_DISK || !(b->flags & BLOCK_F_DISK))
        return;
    ENGINE_DISK_STAT_ADD(s, s->ns[b->ns], demoted_clean, 1);
    engine_disk_memory_release(s, idx);
}

bool engine_disk_takes(const struct store *s, uint32_t idx)
{
    const struct engine_disk *ed = s->disk;
    const struct block *b = &s->ix.blocks[idx];
    if (!ed || ed->down || ed->stuck)
        return false;
    return !ed->admit_hits || b->hits >= ed->admit_hits || b->children;
}

/* The zstd level of namespace ns_id's blocks on disk: its section's disk_compress, else
 * disk.compress. Looked up once per namespace (and again after a reload). */
static int engine_disk_level(struct store *s, uint16_t ns_id)
{
    struct engine_disk *ed = s->disk;
    if (ns_id >= ed->nlevels) {
        uint32_t n = ed->nlevels ? ed->nlevels : 64;
        int16_t *v;
        while (n <= ns_id)
            n *= 2;
        v = realloc(ed->levels, n * sizeof(*v));
        if (!v)
            return ed->compress_level;
        for (uint32_t i = ed->nlevels; i < n; i++)
            v[i] = INT16_MIN;
        ed->levels = v;
        ed->nlevels = n;
    }
    if (ed->levels[ns_id] == INT16_MIN) {
        int l = ed->ns_level ? ed->ns_level(ed->ns_level_arg, s->ns[ns_id]->layout.model_id) : -1;
        ed->levels[ns_id] = (int16_t)(l >= 0 && l <= 19 ? l : -1);
    }
    return ed->levels[ns_id] >= 0 ? ed->levels[ns_id] : ed->compress_level;
}

/* Byte planes for raw 16-bit floats (docs/design/disk.md: 1.18x vs 1.09x on fp16), plain zstd for
 * anything else (quantized blocks are bytes already). */
static int engine_disk_codec(const struct store *s, const struct block *b)
{
    uint8_t dt = s->ns[b->ns]->layout.dtype;
    return b->format == KVC_WIRE_FORMAT_RAW &&
                   (dt == KVC_WIRE_DTYPE_FP16 || dt == KVC_WIRE_DTYPE_BF16)
               ? TIER_DISK_CODEC_ZSTD_PLANES
               : TIER_DISK_CODEC_ZSTD;
}

static void engine_disk_ready(struct store *s)
{
    if (s->on_ready)
        s->on_ready(s->on_ready_arg);
}

/* ---- room on disk ------------------------------------------------------------------------ */

/* Frees one record to make room: the coldest block whose only copy is on disk (a leaf).
 * The records of clean blocks in memory are not taken: forgetting one frees no page until
 * the rest of its page dies, and makes its block dirty, to be written again — on a disk
 * smaller than what memory holds clean that turns into a loop of writes. false when nothing
 * can go. */
static bool engine_disk_disk_evict_one(struct store *s, uint64_t now)
{
    uint32_t v = s->core->victim(s, STORE_ARENA_DISK, -1, now);
    if (v == INDEX_NONE)
        return false;
    ENGINE_DISK_STAT_ADD(s, s->ns[s->ix.blocks[v].ns], disk_evicted_blocks, 1);
    s->core->evict(s, v);
    return true;
}

/* Room for len bytes on disk, evicting there. 0 or -ENOSPC / -EIO. */
static int engine_disk_disk_alloc(struct store *s, uint64_t len, uint64_t now, struct tier_loc *loc)
{
    struct engine_disk *ed = s->disk;
    for (int k = 0; k < 4096; k++) {
        int rc = ed->disk->ops->alloc(ed->disk, len, loc);
        if (rc != -ENOSPC)
            return rc;
        if (!engine_disk_disk_evict_one(s, now))
            break;
    }
    ed->disk_full++;
    return -ENOSPC;
}

/* ---- writing to disk --------------------------------------------------------------------- */

static void engine_disk_write_end(struct store *s, struct engine_disk_move *mv)
{
    struct engine_disk *ed = s->disk;
    ed->moves--;
    ed->writing[mv->arena] -= mv->host.len;
    if (mv->demote)
        ed->freeing[mv->arena] -= mv->host.len;
    s->ix.blocks[mv->idx].flags &= (uint8_t)~BLOCK_F_DEMOTING;
    free(mv);
}

static void engine_disk_write_done(void *arg, int status)
{
    struct engine_disk_move *mv = arg;
    struct store *s = mv->s;
    struct engine_disk *ed = s->disk;
    uint32_t idx = mv->idx;
    struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    bool demote = mv->demote;
    if (status) {
        log_limited(LOG_LEVEL_WARNING, "disk: write of a block failed (%s); it stays in memory",
                    strerror(-status));
        ENGINE_DISK_STAT_ADD(s, ns, disk_io_errors, 1);
        ed->disk->ops->free(ed->disk, &mv->disk);
        engine_disk_write_end(s, mv);
        return;
    }
    /* DEMOTING kept it in place (no free, move or quantize): the record is its bytes. */
    store_lru_unlink(s, idx);
    store_record_set(s, idx, &mv->disk);
    store_lru_push_head(s, idx);
    ENGINE_DISK_STAT_ADD(s, ns, demoted_blocks, 1);
    engine_disk_write_end(s, mv);
    if (demote) {
        if (store_block_idle(s, idx))
            engine_disk_memory_release(s, idx);
        else
            ed->demote_cancelled++; /* taken by a lookup meanwhile: it stays, clean */
    }
}

/* Encode worker: the block's value norm from the bytes it is about to hash. Touches the
 * bytes and mv's own peek fields only. */
static void engine_disk_peek(void *arg, const void *src, uint64_t len)
{
    struct engine_disk_move *mv = arg;
    if (len >= kern_raw_size(&mv->lay))
        mv->vnorm = (float)kern_value_l1(&mv->lay, src);
}

/* The record of a write is encoded (hashed, compressed): now its size is known, the record
 * is allocated and written. */
static void engine_disk_write_encoded(void *arg, struct tier_disk_rec *r, int status)
{
    struct engine_disk_move *mv = arg;
    struct store *s = mv->s;
    struct engine_disk *ed = s->disk;
    if (status) {
        engine_disk_write_end(s, mv);
        return;
    }
    /* DEMOTING kept the block in place and raw while the worker read it. */
    if (mv->peek && mv->vnorm > 0)
        store_meta_vnorm_set(s, mv->idx, mv->vnorm);
    if (engine_disk_disk_alloc(s, tier_disk_rec_len(r), mv->now, &mv->disk)) {
        tier_disk_rec_free(ed->disk, r);
        engine_disk_write_end(s, mv);
        return;
    }
    if (tier_disk_rec_put(ed->disk, &mv->disk, r, engine_disk_write_done, mv)) {
        ed->disk->ops->free(ed->disk, &mv->disk);
        engine_disk_write_end(s, mv);
    }
}

/* ---- the write queue's turns ------------------------------------------------------------ */

/* The disk's write queue (disk.queue_depth) and write budget (disk.write_rate) are one for
 * every host arena. While a put waits for write-back in some arena they go to the arenas
 * whose puts wait, a write at a time in turn; the write-back of other arenas (ahead of need,
 * or demotion over the high watermark) waits meanwhile. Taken by whoever asked first, one
 * arena whose puts come as fast as the disk writes (arena 0, shared by every tenant) kept
 * every write, and a private arena's puts waited out disk.put_wait, one after another. */

static void engine_disk_need_set(struct engine_disk *ed, uint32_t a, uint64_t bytes)
{
    if (!ed->need[a] && bytes)
        ed->needy++;
    else if (ed->need[a] && !bytes)
        ed->needy--;
    ed->need[a] = bytes;
}

/* Whether a write of arena a waits for the turn of an arena whose puts wait. */
static bool engine_disk_yields(const struct engine_disk *ed, uint32_t a)
{
    if (!ed->needy)
        return false;
    if (a >= STORE_MAX_ARENAS || !ed->need[a])
        return true;
    return ed->turn != a && ed->need[ed->turn];
}

/* The turn goes to the next arena after a whose puts wait (a itself when it is the only
 * one). false when there is none. */
static bool engine_disk_turn_next(struct store *s, uint32_t a)
{
    struct engine_disk *ed = s->disk;
    for (uint32_t k = 1; k <= s->narenas; k++) {
        uint32_t n = (a + k) % s->narenas;
        if (ed->need[n]) {
            ed->turn = n;
            return true;
        }
    }
    return false;
}

/* A write of arena a started, len bytes: its puts wait for that much less, and the turn goes
 * on. */
static void engine_disk_need_started(struct store *s, uint32_t a, uint64_t len)
{
    struct engine_disk *ed = s->disk;
    if (!ed->needy || a >= STORE_MAX_ARENAS)
        return;
    engine_disk_need_set(ed, a, ed->need[a] > len ? ed->need[a] - len : 0);
    engine_disk_turn_next(s, a);
}

/* Starts writing block idx (in a host arena, dirty) to disk; with `demote` its memory goes
 * once the write completed. 0, -EAGAIN (rate or queue limit: later), -ENOSPC (nothing on
 * disk can make room), -EBUSY, -errno. */
static int engine_disk_write_one(struct store *s, uint32_t idx, bool demote, uint64_t now)
{
    struct engine_disk *ed = s->disk;
    struct block *b = &s->ix.blocks[idx];
    struct tier *host = engine_disk_mem(s, b);
    struct tier_disk_meta m;
    struct engine_disk_move *mv;
    int rc;
    if (b->state != BLOCK_STATE_COMMITTED || b->tier != KVC_WIRE_TIER_HOST ||
        (b->flags & (BLOCK_F_DISK | BLOCK_F_BUSY | BLOCK_F_LOST)))
        return -EBUSY;
    if (engine_disk_yields(ed, b->arena))
        return -EAGAIN; /* another arena's turn */
    engine_disk_meta(s, b, &m);
    rc = tier_disk_put_ready(ed->disk, m.len);
    if (rc)
        return rc;
    if (!tier_disk_can_alloc(ed->disk, m.len) &&
        s->core->victim(s, STORE_ARENA_DISK, -1, now) == INDEX_NONE) {
        ed->disk_full++;
        ed->stuck = true;
        ed->stuck_len = m.len;
        return -ENOSPC; /* nothing on disk can make room: not worth encoding */
    }
    rc = store_record_reserve(s, idx); /* its record's room, so the write's end cannot fail */
    if (rc)
        return rc;
    mv = calloc(1, sizeof(*mv));
    if (!mv)
        return -ENOMEM;
    mv->s = s;
    mv->idx = idx;
    mv->kind = ENGINE_DISK_MOVE_WRITE;
    mv->demote = demote;
    mv->arena = b->arena;
    mv->now = now;
    mv->host = (struct tier_loc){.arena = b->arena, .cls = b->cls, .off = b->off, .len = b->len};
    /* A norm is worth its pass and its 20 bytes of side table (store_meta_x) where the
     * namespace ranks with it, or once that table exists anyway (hints, codecs). */
    if (b->format == KVC_WIRE_FORMAT_RAW && !store_meta_vnorm_known(s, idx) &&
        (s->ns[b->ns]->policy == POLICY_VATP || s->meta_x) &&
        (s->ns[b->ns]->layout.kv_kind == KVC_WIRE_KV_KIND_KV ||
         s->ns[b->ns]->layout.kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW)) {
        store_ns_kern_layout(s->ns[b->ns], &mv->lay);
        mv->peek = !mv->lay.k_only && kern_layout_check(&mv->lay) == 0;
    }
    rc = tier_disk_encode_peek(ed->disk, &m, (uint8_t *)tier_host_base(host) + b->off,
                               engine_disk_codec(s, b), engine_disk_level(s, b->ns),
                               mv->peek ? engine_disk_peek : NULL, engine_disk_write_encoded, mv);
    if (rc) {
        free(mv);
        return rc;
    }
    b->flags |= BLOCK_F_DEMOTING;
    ed->moves++;
    ed->writing[mv->arena] += mv->host.len;
    if (demote)
        ed->freeing[mv->arena] += mv->host.len;
    engine_disk_need_started(s, mv->arena, mv->host.len);
    return 0;
}

/* Starts the writes of the dirty ancestors of block idx that are in memory, the root-most
 * first; *started counts their bytes. 0, or -EAGAIN / -ENOSPC (the disk says wait: idx waits
 * with them). */
static int engine_disk_write_ancestors(struct store *s, uint32_t idx, uint64_t now,
                                       uint64_t *started)
{
    uint32_t anc[64], n = 0;
    const struct block *b = &s->ix.blocks[idx];
    while (n < sizeof(anc) / sizeof(anc[0]) && b->parent != INDEX_NONE) {
        uint32_t p = b->parent;
        b = &s->ix.blocks[p];
        if (b->flags & (BLOCK_F_DISK | BLOCK_F_DEMOTING))
            break; /* on disk, or on its way: so are the ones above it */
        if (b->tier != KVC_WIRE_TIER_HOST || (b->flags & (BLOCK_F_BUSY | BLOCK_F_LOST)))
            break;
        anc[n++] = p;
    }
    while (n-- > 0) {
        uint64_t len = s->ix.blocks[anc[n]].len;
        int rc = engine_disk_write_one(s, anc[n], false, now);
        if (rc == -EAGAIN || rc == -ENOSPC)
            return rc;
        if (rc == 0)
            *started += len;
    }
    return 0;
}

/* Writes dirty blocks of arena a from its cold end until `bytes` are on their way (or the
 * disk's queue, rate or turns say wait). With `demote` (the arena is over its high watermark
 * and has no clean block left) their memory goes once written, and a leaf the disk would not
 * take is dropped. An arena that runs out of blocks it can write before the disk said wait
 * has no more turns to ask for: what its puts asked for is forgotten (a put that still
 * waits asks again when it runs again). Returns the blocks acted on. */
static int engine_disk_write_back(struct store *s, uint32_t a, uint64_t bytes, bool demote,
                                  uint64_t now)
{
    struct engine_disk *ed = s->disk;
    uint32_t walked = 0, i = s->arenas[a].lru_tail;
    uint64_t started = 0;
    int acted = 0;
    bool wait = false;
    while (i != INDEX_NONE && walked++ < ENGINE_DISK_WALK && started < bytes) {
        struct block *b = &s->ix.blocks[i];
        uint32_t prev = b->lru_prev;
        int rc;
        if (b->tier != KVC_WIRE_TIER_HOST || (b->flags & (BLOCK_F_BUSY | BLOCK_F_LOST))) {
            i = prev;
            continue;
        }
        if (!engine_disk_takes(s, i)) {
            /* Not admitted (or the disk is down): under pressure it goes as without one. */
            if (demote && !b->children && store_block_idle(s, i)) {
                ENGINE_DISK_STAT_ADD(s, s->ns[b->ns], demote_dropped, 1);
                started += b->len;
                s->core->evict(s, i);
                acted++;
            }
            i = prev;
            continue;
        }
        uint64_t len = b->len;
        /* Its dirty ancestors first: a record whose parent is only in memory is an orphan
         * after a crash (dropped at the next start), and shared prefixes, hit often, would
         * otherwise stay dirty while their cold leaves go to disk. */
        rc = engine_disk_write_ancestors(s, i, now, &started);
        if (rc == 0)
            rc = engine_disk_write_one(s, i, demote, now);
        if (rc == -EAGAIN || rc == -ENOSPC) {
            wait = true;
            break; /* the next poll or tick goes on */
        }
        if (rc == 0) {
            started += len;
            acted++;
        }
        i = prev;
    }
    if (!wait && started < bytes && a < STORE_MAX_ARENAS && ed->need[a])
        engine_disk_need_set(ed, a, 0);
    return acted;
}

void engine_disk_write_ahead(struct store *s, uint32_t arena, uint64_t bytes, uint64_t now)
{
    struct engine_disk *ed = s->disk;
    if (!ed || arena >= s->narenas || bytes <= ed->writing[arena])
        return;
    /* A put waits for these writes: its arena has turns until they started. */
    if (bytes - ed->writing[arena] > ed->need[arena])
        engine_disk_need_set(ed, arena, bytes - ed->writing[arena]);
    engine_disk_write_back(s, arena, bytes - ed->writing[arena], false, now);
}

/* The writes that puts wait for, a block at a time in turn between their arenas, until the
 * disk says wait (even for puts that gave up meanwhile: written ahead, the blocks stay in
 * memory, clean). Returns the blocks acted on. */
static int engine_disk_write_turns(struct store *s, uint64_t now)
{
    struct engine_disk *ed = s->disk;
    int acted = 0;
    while (ed->needy) {
        uint32_t a = ed->turn;
        uint64_t moves = ed->moves;
        if (!ed->need[a]) {
            if (!engine_disk_turn_next(s, a))
                break;
            continue;
        }
        acted += engine_disk_write_back(s, a, 1, false, now);
        if (ed->moves == moves && ed->need[a])
            break; /* the disk says wait */
    }
    return acted;
}

/* Smoothed put and disk write rates, from the totals. */
static void engine_disk_rates(struct store *s, uint64_t now)
{
    struct engine_disk *ed = s->disk;
    struct tier_disk_stats st;
    double dt;
    if (now < ed->rate_ms + ENGINE_DISK_RATE_MS)
        return;
    tier_disk_stats_get(ed->disk, &st);
    dt = (double)(now - ed->rate_ms) / 1000.0;
    if (ed->rate_ms && dt > 0) {
        double put = (double)(s->total.bytes_in - ed->rate_in) / dt;
        double wr = (double)(st.bytes_written - ed->rate_written) / dt;
        ed->put_bps += ENGINE_DISK_RATE_ALPHA * (put - ed->put_bps);
        ed->write_bps += ENGINE_DISK_RATE_ALPHA * (wr - ed->write_bps);
    }
    ed->rate_ms = now;
    ed->rate_in = s->total.bytes_in;
    ed->rate_written = st.bytes_written;
    ed->down = ed->npaths && st.failed_paths >= ed->npaths;
}

/* Memory an arena should have free or clean (droppable at no cost) so that puts find room
 * without waiting for a write: what the puts of the next second (plus the time the disk
 * needs for the writes already queued) bring, at least the band between the watermarks,
 * at most half the arena. */
static uint64_t engine_disk_room_target(const struct store *s, uint32_t a)
{
    const struct engine_disk *ed = s->disk;
    const struct tier *t = s->arenas[a].tier;
    double cap = (double)t->ops->capacity(t);
    double horizon = 1.0, want;
    uint64_t queued = 0;
    for (uint32_t k = 0; k < STORE_MAX_ARENAS + 2; k++)
        queued += ed->writing[k];
    if (ed->write_bps > 1.0)
        horizon += (double)queued / ed->write_bps;
    want = ed->put_bps * horizon;
    if (want < (1.0 - s->p.low_watermark) * cap)
        want = (1.0 - s->p.low_watermark) * cap;
    if (want > cap / 2)
        want = cap / 2;
    return (uint64_t)want;
}

/* a - b, or 0 (pending bytes are a part of the used ones; never trust that blindly). */
static uint64_t engine_disk_sub(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

int engine_disk_trim(struct store *s, uint64_t now)
{
    struct engine_disk *ed = s->disk;
    int acted = 0;
    engine_disk_rates(s, now);
    /* A full disk takes records again once it has room or can make some. */
    if (ed->stuck && (tier_disk_can_alloc(ed->disk, ed->stuck_len) ||
                      s->core->victim(s, STORE_ARENA_DISK, -1, now) != INDEX_NONE))
        ed->stuck = false;
    engine_disk_compact(s);
    /* Quantize first where a namespace allows it (the raw slots its jobs will free count as
     * free already). */
    quant_pressure(s->quant, now, NULL);
    /* What puts wait for first. */
    acted += engine_disk_write_turns(s, now);
    for (uint32_t a = 0; a < s->narenas; a++) {
        struct tier *t = s->arenas[a].tier;
        double cap = (double)t->ops->capacity(t);
        uint64_t pend = quant_pending_bytes(s->quant, a) + ed->freeing[a];
        uint64_t used = t->ops->usage(t), room, want;
        /* Over the high watermark: clean blocks leave memory (they stay on disk) and leaves
         * the disk would not take are dropped, down to the low watermark — or, where the
         * victim's namespace keeps a precision ladder, the ladder steps instead (a block one
         * rung down, or its coldest leaf out: engine_ladder_evict), as a put's allocation
         * does; if that is not enough, dirty blocks are demoted (written, then freed). */
        if ((double)engine_disk_sub(used, pend) > s->p.high_watermark * cap) {
            for (;;) {
                double low = s->p.low_watermark * cap;
                pend = quant_pending_bytes(s->quant, a) + ed->freeing[a];
                used = t->ops->usage(t);
                if ((double)engine_disk_sub(used, pend) <= low)
                    break;
                uint32_t v = s->core->victim(s, a, -1, now);
                if (v == INDEX_NONE)
                    break;
                enum engine_ladder_r r =
                    s->core->ladder_evict(s, a, v, (uint64_t)((double)used - low) + 1, now);
                acted++;
                if (r == ENGINE_LADDER_NONE)
                    s->core->evict(s, v);
                else if (r != ENGINE_LADDER_FREED)
                    break; /* room comes with the jobs in flight; the next trim goes on */
            }
            pend = quant_pending_bytes(s->quant, a) + ed->freeing[a];
            used = t->ops->usage(t);
            if ((double)engine_disk_sub(used, pend) > s->p.low_watermark * cap)
                acted += engine_disk_write_back(
                    s, a,
                    (uint64_t)((double)engine_disk_sub(used, pend) - s->p.low_watermark * cap),
                    true, now);
        }
        /* Ahead of need: dirty blocks are written (they stay in memory, clean) until the
         * free and clean memory reaches the target. */
        used = t->ops->usage(t);
        room = engine_disk_sub((uint64_t)cap, used) + s->arenas[a].clean_bytes + ed->writing[a];
        want = engine_disk_room_target(s, a);
        if (room < want)
            acted += engine_disk_write_back(s, a, want - room, false, now);
    }
    return acted;
}

bool engine_disk_room_coming(struct store *s, uint32_t arena)
{
    const struct engine_disk *ed = s->disk;
    uint32_t k = 0;
    if (!ed || ed->down || arena >= STORE_MAX_ARENAS)
        return false;
    if (ed->writing[arena])
        return true;
    /* Nothing in flight: a dirty block the disk would take makes room once written. */
    for (uint32_t i = s->arenas[arena].lru_tail; i != INDEX_NONE && k < 256;
         i = s->ix.blocks[i].lru_prev, k++)
        if (s->ix.blocks[i].tier == KVC_WIRE_TIER_HOST &&
            !(s->ix.blocks[i].flags & (BLOCK_F_BUSY | BLOCK_F_LOST)) && engine_disk_takes(s, i))
            /* ... and the disk has room for it, or can make some. */
            return tier_disk_can_alloc(ed->disk, s->ix.blocks[i].len) ||
                   s->core->victim(s, STORE_ARENA_DISK, -1, 0) != INDEX_NONE;
    return false;
}

/* For the policy engine (engine_policy_trim) and a precision ladder's step out of memory: a
 * block chosen to go to disk. Refused for now (-EAGAIN), the arena's room waits for a write:
 * it has turns (engine_disk_yields) until one of that size started, as a put's does. */
int engine_disk_offload(struct store *s, uint32_t idx, uint64_t now)
{
    struct engine_disk *ed = s->disk;
    const struct block *b = &s->ix.blocks[idx];
    int rc;
    if (!ed)
        return -ENODEV;
    if (!store_block_idle(s, idx) || b->tier != KVC_WIRE_TIER_HOST)
        return -EBUSY;
    if (b->flags & BLOCK_F_DISK) {
        engine_disk_memory_drop(s, idx);
        return 0;
    }
    rc = engine_disk_write_one(s, idx, true, now);
    if (rc == -EAGAIN && b->arena < s->narenas && ed->need[b->arena] < b->len)
        engine_disk_need_set(ed, b->arena, b->len);
    return rc;
}

uint64_t engine_disk_pending_bytes(const struct store *s)
{
    uint64_t n = 0;
    if (s->disk)
        for (uint32_t a = 0; a < STORE_MAX_ARENAS + 2; a++)
            n += s->disk->freeing[a];
    return n;
}

/* ---- compaction ------------------------------------------------------------------------ */

/* Whether the block of a compaction move still has the record that was read. */
static bool engine_disk_compact_same(const struct store *s, const struct engine_disk_move *mv)
{
    const struct block *b = &s->ix.blocks[mv->idx];
    struct tier_loc l;
    if (b->state != BLOCK_STATE_COMMITTED || b->key.lo != mv->key.lo || b->key.hi != mv->key.hi ||
        b->ns != mv->ns || (b->flags & (BLOCK_F_LOST | BLOCK_F_DISK)) != BLOCK_F_DISK)
        return false;
    store_record_loc(s, b, &l);
    return l.off == mv->disk.off && l.cls == mv->disk.cls;
}

static void engine_disk_compact_end(struct store *s, struct engine_disk_move *mv, bool moved)
{
    struct engine_disk *ed = s->disk;
    for (uint32_t k = 0; k < ENGINE_DISK_COMPACT_INFLIGHT; k++)
        if (ed->compact_idx[k] == mv->idx) {
            ed->compact_idx[k] = INDEX_NONE;
            break;
        }
    ed->compacting--;
    if (moved) {
        ed->compacted_blocks++;
        ed->compacted_bytes += mv->disk.len;
    } else {
        ed->compact_aborted++;
    }
    free(mv->buf);
    free(mv);
}

static void engine_disk_compact_write_done(void *arg, int status)
{
    struct engine_disk_move *mv = arg;
    struct store *s = mv->s;
    struct engine_disk *ed = s->disk;
    struct block *b = &s->ix.blocks[mv->idx];
    /* Not while a promotion reads the old record: it must stay valid until that ends. */
    bool moved = status == 0 && engine_disk_compact_same(s, mv) && !(b->flags & BLOCK_F_PROMOTING);
    if (moved) {
        /* The new record is complete: the block switches to it, the old one dies. */
        if (b->tier == KVC_WIRE_TIER_DISK) {
            s->ns[b->ns]->bytes = s->ns[b->ns]->bytes - b->len + mv->host.len;
            b->off = mv->host.off;
            b->len = (uint32_t)mv->host.len;
        }
        store_record_set(s, mv->idx, &mv->host);
        ed->disk->ops->free(ed->disk, &mv->disk);
    } else {
        ed->disk->ops->free(ed->disk, &mv->host);
    }
    engine_disk_compact_end(s, mv, moved);
}

static void engine_disk_compact_encoded(void *arg, struct tier_disk_rec *r, int status)
{
    struct engine_disk_move *mv = arg;
    struct store *s = mv->s;
    struct engine_disk *ed = s->disk;
    if (status || !engine_disk_compact_same(s, mv) ||
        ed->disk->ops->alloc(ed->disk, tier_disk_rec_len(r), &mv->host)) {
        tier_disk_rec_free(ed->disk, r);
        engine_disk_compact_end(s, mv, false);
        return;
    }
    if (tier_disk_rec_put(ed->disk, &mv->host, r, engine_disk_compact_write_done, mv)) {
        ed->disk->ops->free(ed->disk, &mv->host);
        engine_disk_compact_end(s, mv, false);
    }
}

static void engine_disk_compact_read_done(void *arg, int status)
{
    struct engine_disk_move *mv = arg;
    struct store *s = mv->s;
    struct engine_disk *ed = s->disk;
    const struct block *b = &s->ix.blocks[mv->idx];
    struct tier_disk_meta m;
    /* A record that fails verification is left to the next promotion, which marks it lost. */
    if (status || !engine_disk_compact_same(s, mv))
        goto abort;
    /* Encoded again (at the namespace's level now) from the block read back. */
    engine_disk_meta(s, b, &m);
    if (tier_disk_encode(ed->disk, &m, mv->buf, engine_disk_codec(s, b),
                         engine_disk_level(s, b->ns), engine_disk_compact_encoded, mv))
        goto abort;
    return;
abort:
    engine_disk_compact_end(s, mv, false);
}

/* Starts moving one record off the page being compacted. 0 or -errno. */
static int engine_disk_compact_one(struct store *s, uint32_t idx)
{
    struct engine_disk *ed = s->disk;
    struct block *b = &s->ix.blocks[idx];
    struct tier_disk_meta m;
    struct engine_disk_move *mv;
    int rc;
    engine_disk_meta(s, b, &m);
    /* No read whose copy could not be written now. */
    rc = tier_disk_put_ready(ed->disk, m.len);
    if (rc)
        return rc;
    if (!tier_disk_can_alloc(ed->disk, m.len))
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
    mv->kind = ENGINE_DISK_MOVE_COMPACT;
    mv->key = b->key;
    mv->ns = b->ns;
    store_record_loc(s, b, &mv->disk);
    rc = tier_disk_get(ed->disk, &mv->disk, &m, mv->buf, (m.len + 4095) & ~4095ull,
                       engine_disk_compact_read_done, mv);
    if (rc) {
        free(mv->buf);
        free(mv);
        return rc;
    }
    ed->compacting++;
    for (uint32_t k = 0; k < ENGINE_DISK_COMPACT_INFLIGHT; k++)
        if (ed->compact_idx[k] == INDEX_NONE) {
            ed->compact_idx[k] = idx;
            break;
        }
    return 0;
}

/* Empties pages mostly dead once the disk runs short of free pages (less than a quarter):
 * their live records — of blocks only on disk and of clean blocks in memory — are read,
 * verified and appended to the open page, and the block switches to the copy once it is
 * on the device. One page at a time, bounded by the write queue and rate shared with
 * write-back. */
static void engine_disk_compact(struct store *s)
{
    struct engine_disk *ed = s->disk;
    uint32_t left = 0;
    bool stop = false;
    if (!ed->compact_below)
        return;
    if (ed->compact_page == UINT32_MAX) {
        struct tier_disk_stats st;
        if (ed->compacting)
            return;
        tier_disk_stats_get(ed->disk, &st);
        if (st.pages_free * 4 >= st.pages ||
            tier_disk_compact_pick(ed->disk, ed->compact_below, &ed->compact_page))
            return;
    }
    /* Records live on the disk list and on the clean lists of memory. */
    for (uint32_t a = 0; a < STORE_MAX_ARENAS + 2 && !stop; a++) {
        uint32_t i = a == STORE_ARENA_DISK ? s->arenas[a].lru_tail : s->arenas[a].clean_tail;
        while (i != INDEX_NONE) {
            const struct block *b = &s->ix.blocks[i];
            uint32_t prev = b->lru_prev;
            struct tier_loc loc;
            bool busy = false;
            if ((b->flags & (BLOCK_F_DISK | BLOCK_F_LOST)) == BLOCK_F_DISK &&
                !(b->flags & BLOCK_F_PROMOTING)) {
                store_record_loc(s, b, &loc);
                if (tier_disk_page_of(ed->disk, &loc) == (int)ed->compact_page) {
                    left++;
                    for (uint32_t k = 0; k < ENGINE_DISK_COMPACT_INFLIGHT; k++)
                        busy |= ed->compact_idx[k] == i;
                    if (!busy && ed->compacting < ENGINE_DISK_COMPACT_INFLIGHT &&
                        engine_disk_compact_one(s, i) == -EAGAIN) {
                        stop = true;
                        break;
                    }
                }
            }
            i = prev;
        }
    }
    if (left == 0 && ed->compacting == 0) {
        ed->compacted_pages++;
        ed->compact_page = UINT32_MAX;
    }
}

/* ---- promotion ------------------------------------------------------------------------- */

static void engine_disk_promote_done(void *arg, int status)
{
    struct engine_disk_move *mv = arg;
    struct store *s = mv->s;
    struct engine_disk *ed = s->disk;
    uint32_t idx = mv->idx;
    struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    ed->moves--;
    b->flags &= (uint8_t)~BLOCK_F_PROMOTING;
    if (status == 0) {
        /* Inclusive: the record stays, so the block is clean in memory. */
        ENGINE_DISK_STAT_ADD(s, ns, promoted_blocks, 1);
        store_fast_sync(s, idx); /* ready now */
    } else {
        struct tier *host = engine_disk_mem(s, b);
        if (status == -EBADMSG) {
            ENGINE_DISK_STAT_ADD(s, ns, checksum_failures, 1);
            log_limited(LOG_LEVEL_WARNING,
                        "disk: block %016llx%016llx failed verification; dropped",
                        (unsigned long long)b->key.hi, (unsigned long long)b->key.lo);
        } else {
            ENGINE_DISK_STAT_ADD(s, ns, disk_io_errors, 1);
            log_limited(LOG_LEVEL_WARNING, "disk: read of a block failed (%s); dropped",
                        strerror(-status));
        }
        /* No copy is left: a miss from now on; it goes once free of pins and children. */
        store_lru_unlink(s, idx);
        host->ops->free(host, &mv->host);
        store_record_free(s, idx);
        b->flags |= BLOCK_F_LOST;
        b->tier = 0;
        b->arena = STORE_ARENA_DISK;
        ns->bytes -= b->len;
        b->len = 0;
        store_lru_push_head(s, idx);
        if (!b->pins && !b->children)
            (void)store_block_drop(s, idx);
    }
    free(mv);
    engine_disk_ready(s);
}

/* A host slot of len bytes in ns's arena, evicting as engine_alloc does (a quantized block
 * comes back into a slot of its encoded size). */
static int engine_disk_host_alloc(struct store *s, struct store_ns *ns, uint64_t len, uint64_t now,
                                  struct tier_loc *loc)
{
    struct tier *t = s->arenas[ns->arena].tier;
    int cls = tier_host_class(t, len);
    if (len == ns->block_bytes)
        return s->core->alloc(s, ns, now, loc);
    for (;;) {
        int rc = t->ops->alloc(t, len, loc);
        uint32_t v;
        if (rc != -ENOSPC)
            return rc;
        v = s->core->victim(s, ns->arena, cls, now);
        if (v == INDEX_NONE)
            return -ENOSPC;
        s->core->evict(s, v);
    }
}

static int engine_disk_promote(struct store *s, uint32_t idx, uint64_t now)
{
    struct engine_disk *ed = s->disk;
    struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    struct tier *host = s->arenas[ns->arena].tier;
    struct tier_disk_meta m;
    struct engine_disk_move *mv = calloc(1, sizeof(*mv));
    int rc;
    if (!mv)
        return -ENOMEM;
    rc = engine_disk_host_alloc(s, ns, engine_disk_block_bytes(s, b), now, &mv->host);
    if (rc) {
        free(mv);
        return rc;
    }
    b = &s->ix.blocks[idx];
    engine_disk_meta(s, b, &m);
    mv->s = s;
    mv->idx = idx;
    mv->kind = ENGINE_DISK_MOVE_PROMOTE;
    store_record_loc(s, b, &mv->disk);
    rc = tier_disk_get(ed->disk, &mv->disk, &m, (uint8_t *)tier_host_base(host) + mv->host.off,
                       mv->host.len, engine_disk_promote_done, mv);
    if (rc == -EAGAIN) {
        /* The read queue is full: this read starts when one ends (engine_disk_read_pump). */
        if (ed->rq_tail)
            ed->rq_tail->next = mv;
        else
            ed->rq_head = mv;
        ed->rq_tail = mv;
        ed->reads_queued++;
        rc = 0;
    }
    if (rc) {
        host->ops->free(host, &mv->host);
        free(mv);
        return rc;
    }
    /* It lives in its namespace's arena from now on (the lease names the new slot, not
     * ready until the read completed); its record stays: clean. */
    store_lru_unlink(s, idx);
    ns->bytes = ns->bytes - b->len + mv->host.len;
    b->tier = KVC_WIRE_TIER_HOST;
    b->arena = (uint8_t)ns->arena;
    b->off = mv->host.off;
    b->len = (uint32_t)mv->host.len;
    b->cls = (uint8_t)mv->host.cls;
    b->flags |= BLOCK_F_PROMOTING;
    store_lru_push_head(s, idx);
    ed->moves++;
    return 0;
}

/* Starts the queued promotions the read queue has room for now. */
static void engine_disk_read_pump(struct store *s)
{
    struct engine_disk *ed = s->disk;
    while (ed->rq_head) {
        struct engine_disk_move *mv = ed->rq_head;
        const struct block *b = &s->ix.blocks[mv->idx];
        struct tier *host = s->arenas[b->arena].tier;
        struct tier_disk_meta m;
        int rc;
        engine_disk_meta(s, b, &m);
        rc = tier_disk_get(ed->disk, &mv->disk, &m, (uint8_t *)tier_host_base(host) + mv->host.off,
                           mv->host.len, engine_disk_promote_done, mv);
        if (rc == -EAGAIN)
            break;
        ed->rq_head = mv->next;
        if (!ed->rq_head)
            ed->rq_tail = NULL;
        mv->next = NULL;
        if (rc)
            engine_disk_promote_done(mv, rc); /* the block is lost like on a failed read */
    }
}

uint32_t engine_disk_lookup_prepare(struct store *s, uint16_t ns, const struct kvc_wire_key *keys,
                                    const uint32_t *idxs, uint32_t hits, uint32_t flags,
                                    uint64_t now, bool *short_of_room)
{
    uint32_t usable;
    /* Hold every hit while slots are found for the ones on disk, so making room cannot
     * evict an earlier hit of this very lookup; the hits end at one gone since it was found. */
    for (uint32_t i = 0; i < hits; i++) {
        if (!index_handle_ok(&s->ix, idxs[i], ns, &keys[i])) {
            hits = i;
            break;
        }
        store_block_pin(s, idxs[i]);
    }
    usable = hits;
    for (uint32_t i = 0; i < hits; i++) {
        uint32_t idx = idxs[i];
        const struct block *b = &s->ix.blocks[idx];
        if (b->tier == KVC_WIRE_TIER_DISK && !(b->flags & BLOCK_F_BUSY)) {
            int rc = engine_disk_promote(s, idx, now);
            if (rc) {
                if (rc == -ENOSPC)
                    *short_of_room = true;
                else
                    log_limited(LOG_LEVEL_WARNING,
                                "disk: a read from disk cannot start (%s); "
                                "the lookup stops at that block",
                                strerror(-rc));
                usable = i;
                break;
            }
        }
    }
    if (flags & KVC_LOOKUP_F_READY_ONLY)
        for (uint32_t i = 0; i < usable; i++)
            if (s->ix.blocks[idxs[i]].flags & BLOCK_F_PROMOTING) {
                usable = i;
                break;
            }
    for (uint32_t i = 0; i < hits; i++)
        store_block_unpin(s, idxs[i]);
    return usable;
}

int engine_disk_lease_state(struct store *s, struct store_owner *owner, uint64_t lease_id,
                            uint32_t *nhit, uint32_t *nready, uint32_t *pending)
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

struct engine_disk_found {
    struct tier_disk_meta m;
    struct tier_loc loc;
};

struct engine_disk_scan {
    struct engine_disk_found *v;
    size_t n, cap;
};

static int engine_disk_scan_cb(void *arg, const struct tier_disk_meta *m,
                               const struct tier_loc *loc)
{
    struct engine_disk_scan *sc = arg;
    if (sc->n == sc->cap) {
        size_t ncap = sc->cap ? sc->cap * 2 : 1024;
        struct engine_disk_found *nv = realloc(sc->v, ncap * sizeof(*nv));
        if (!nv)
            return 1;
        sc->v = nv;
        sc->cap = ncap;
    }
    sc->v[sc->n++] = (struct engine_disk_found){.m = *m, .loc = *loc};
    return 0;
}

static int engine_disk_found_cmp(const void *a, const void *b)
{
    const struct engine_disk_found *x = a, *y = b;
    return x->m.depth < y->m.depth ? -1 : x->m.depth > y->m.depth;
}

/* Takes one record back into the index, in a namespace opened (placed and bound to its
 * section) as NS_OPEN opens it. 0, or -errno when it cannot be (then freed). */
/* The namespace of the last record adopted: records come in runs of one namespace, and
 * opening it (placement, access list) once per run instead of once per record is most of a
 * start's CPU at hundreds of thousands of records. */
struct engine_disk_adopt_ns {
    bool valid;
    int rc;
    uint32_t id;
    uint8_t ns[TIER_DISK_NS_BYTES];
};

static int engine_disk_adopt(struct store *s, const struct engine_disk_params *p,
                             const struct engine_disk_found *f, struct engine_disk_adopt_ns *last)
{
    struct kvc_wire_layout l;
    struct kvc_wire_key key = {f->m.key[0], f->m.key[1]};
    struct kvc_wire_key parent = {f->m.parent[0], f->m.parent[1]};
    struct store_ns *ns;
    uint32_t ns_id, idx, p_idx = INDEX_NONE;
    bool created;
    int rc;
    memcpy(&l, f->m.ns, sizeof(l));
    if (last->valid && memcmp(last->ns, f->m.ns, sizeof(last->ns)) == 0) {
        rc = last->rc;
        ns_id = last->id;
    } else {
        rc = p->ns_open ? p->ns_open(p->ns_open_arg, &l, &ns_id, &created)
                        : store_ns_open(s, &l, &ns_id, &created);
        memcpy(last->ns, f->m.ns, sizeof(last->ns));
        last->rc = rc;
        last->id = rc ? 0 : ns_id;
        last->valid = true;
    }
    if (rc)
        return rc;
    ns = s->ns[ns_id];
    /* (a 32-bit field: checked whole, not as the byte struct block keeps) */
    int64_t want = f->m.format < KVC_WIRE_FORMAT_COUNT
                       ? store_format_bytes(ns, (uint8_t)f->m.format)
                       : -EINVAL;
    if (want <= 0 || f->m.len != (uint64_t)want)
        return -EINVAL; /* not a block this namespace holds (its recipe changed?) */
    if (f->loc.len > UINT32_MAX || f->loc.off / TIER_DISK_ALIGN > UINT32_MAX)
        return -EFBIG;
    if (index_key_is_zero(&key))
        return -EINVAL; /* all-zero means "no parent", never a block */
    if (index_find(&s->ix, (uint16_t)ns_id, &key) != INDEX_NONE)
        return -EEXIST;
    if (!index_key_is_zero(&parent)) {
        p_idx = index_find(&s->ix, (uint16_t)ns_id, &parent);
        if (p_idx == INDEX_NONE || s->ix.blocks[p_idx].depth + 1 != f->m.depth)
            return -ENOENT; /* orphan: its parent's write never completed */
    } else if (f->m.depth != 0) {
        return -EINVAL;
    }
    rc = index_block_new(&s->ix, &idx);
    if (rc)
        return rc;
    struct block *b = &s->ix.blocks[idx];
    b->key = key;
    b->parent = p_idx;
    b->depth = f->m.depth;
    b->ns = (uint16_t)ns_id;
    b->state = BLOCK_STATE_COMMITTED;
    b->format = (uint8_t)f->m.format;
    b->tier = KVC_WIRE_TIER_DISK;
    b->arena = STORE_ARENA_DISK;
    b->off = f->loc.off;
    b->len = (uint32_t)f->loc.len;
    rc = store_record_reserve(s, idx);
    if (!rc) {
        store_record_set(s, idx, &f->loc);
        rc = index_insert(&s->ix, idx);
    }
    if (rc) {
        index_block_delete(&s->ix, idx);
        return rc;
    }
    if (p_idx != INDEX_NONE && !s->ix.blocks[p_idx].children++)
        store_heap_sync(s, p_idx); /* no longer a leaf */
    ns->blocks++;
    ns->bytes += b->len;
    store_lru_push_head(s, idx);
    return 0;
}

int engine_disk_attach(struct store *s, const struct engine_disk_params *p)
{
    struct engine_disk_scan sc = {0};
    struct tier_disk_config dc = {.npaths = p->npaths,
                                  .size = p->size,
                                  .page_size = p->page_size,
                                  .queue_depth = p->queue_depth,
                                  .write_rate = p->write_rate,
                                  .scan = engine_disk_scan_cb,
                                  .scan_arg = &sc,
                                  .progress = p->progress,
                                  .progress_arg = p->progress_arg,
                                  .workers = p->workers,
                                  .format = p->format,
                                  .ckpt_path = p->ckpt_path};
    struct tier_disk_stats st;
    struct engine_disk_adopt_ns last = {.valid = false};
    struct engine_disk *ed = calloc(1, sizeof(*ed));
    size_t adopted = 0;
    int rc = -ENOMEM;
    if (!ed)
        goto out;
    if (p->npaths == 0 || p->npaths > TIER_DISK_MAX_PATHS) {
        rc = -EINVAL;
        goto out;
    }
    for (uint32_t i = 0; i < p->npaths; i++)
        dc.paths[i] = p->paths[i];
    ed->admit_hits = p->admit_hits;
    ed->npaths = p->npaths;
    ed->compact_below = p->compact_below;
    ed->compress_level = p->compress_level;
    ed->ns_level = p->ns_level;
    ed->ns_level_arg = p->ns_level_arg;
    ed->compact_page = UINT32_MAX;
    for (uint32_t k = 0; k < ENGINE_DISK_COMPACT_INFLIGHT; k++)
        ed->compact_idx[k] = INDEX_NONE;
    ed->disk = tier_disk_new(&dc, &rc);
    if (!ed->disk)
        goto out;
    tier_disk_stats_get(ed->disk, &st);
    /* A record's offset is kept in 4 KiB units in 32 bits (struct block's budget). */
    if (st.capacity > (uint64_t)UINT32_MAX * TIER_DISK_ALIGN) {
        log_err("disk: %llu GiB in all is more than the 16 TiB one daemon can address",
                (unsigned long long)(st.capacity >> 30));
        rc = -EFBIG;
        goto out;
    }
    if (st.buffered)
        log_warn("disk: O_DIRECT is not supported on %s: BUFFERED I/O in use (counted as "
                 "disk_buffered)",
                 p->paths[0]);
    s->disk = ed;
    engine_disk_buffers_register(s);
    s->arenas[STORE_ARENA_DISK].tier = ed->disk;
    /* Parents first, so every block finds its parent already back. */
    if (sc.n)
        qsort(sc.v, sc.n, sizeof(*sc.v), engine_disk_found_cmp);
    for (size_t i = 0; i < sc.n; i++) {
        if (engine_disk_adopt(s, p, &sc.v[i], &last) == 0)
            adopted++;
        else
            ed->disk->ops->free(ed->disk, &sc.v[i].loc);
    }
    log_info("disk: %llu MiB on %u path(s), %zu blocks taken back, %zu records dropped",
             (unsigned long long)(st.capacity >> 20), p->npaths, adopted, sc.n - adopted);
    rc = 0;
out:
    free(sc.v);
    if (rc && ed) {
        tier_destroy(ed->disk);
        free(ed);
    }
    return rc;
}

void engine_disk_buffers_register(struct store *s)
{
    struct engine_disk *ed = s->disk;
    int rc;
    /* Registering pins every page, faulting in those not yet: not while the arena is still
     * being faulted in the background, or the start would wait for all of it. */
    if (!ed || ed->bufs_done || !tier_host_fault_done(s->arenas[0].tier, NULL))
        return;
    ed->bufs_done = true;
    rc = tier_disk_buffers_register(ed->disk, tier_host_base(s->arenas[0].tier),
                                    tier_host_size(s->arenas[0].tier));
    if (rc)
        log_warn("disk: cannot register the host arena with io_uring (%s); transfers pin "
                 "pages per request",
                 strerror(-rc));
}

void engine_disk_free(struct store *s)
{
    struct engine_disk *ed = s->disk;
    if (!ed)
        return;
    do {
        tier_disk_drain(ed->disk);
        engine_disk_read_pump(s);
    } while (ed->rq_head);
    tier_disk_drain(ed->disk);
    tier_destroy(ed->disk);
    s->arenas[STORE_ARENA_DISK].tier = NULL;
    s->disk = NULL;
    free(ed->levels);
    free(ed);
}

void engine_disk_compress_set(struct store *s, int level)
{
    struct engine_disk *ed = s->disk;
    if (!ed)
        return;
    ed->compress_level = level;
    for (uint32_t i = 0; i < ed->nlevels; i++)
        ed->levels[i] = INT16_MIN; /* the sections may have changed too */
}

void engine_disk_reload(struct store *s, uint32_t admit_hits)
{
    if (s->disk)
        s->disk->admit_hits = admit_hits;
}

uint32_t engine_disk_admit_hits(const struct store *s)
{
    return s->disk ? s->disk->admit_hits : 0;
}

int engine_disk_fd(const struct store *s)
{
    return s->disk ? tier_disk_fd(s->disk->disk) : -1;
}

void engine_disk_poll(struct store *s, uint64_t now)
{
    if (!s->disk)
        return;
    tier_disk_poll(s->disk->disk);
    /* Completed reads free read slots: the queued promotions go on. */
    engine_disk_read_pump(s);
    /* Completed writes free queue slots and memory: the next write-backs may start. */
    engine_disk_trim(s, now);
}

void engine_disk_flush(struct store *s)
{
    if (s->disk)
        tier_disk_flush(s->disk->disk);
}

void engine_disk_stats(const struct store *s, void (*put)(void *arg, const char *name, uint64_t v),
                       void *arg)
{
    struct tier_disk_stats st;
    const struct engine_disk *ed = s->disk;
    uint64_t closed, blocks = 0, records = 0, clean = 0, writing = 0;
    if (!ed)
        return;
    tier_disk_stats_get(ed->disk, &st);
    closed = st.used + st.dead_bytes;
    for (uint32_t i = s->arenas[STORE_ARENA_DISK].lru_head; i != INDEX_NONE;
         i = s->ix.blocks[i].lru_next)
        blocks += s->ix.blocks[i].tier == KVC_WIRE_TIER_DISK;
    for (uint32_t a = 0; a < STORE_MAX_ARENAS + 2; a++) {
        if (a == STORE_ARENA_DISK)
            continue;
        clean += s->arenas[a].clean_bytes;
        for (uint32_t i = s->arenas[a].clean_head; i != INDEX_NONE; i = s->ix.blocks[i].lru_next)
            records++;
        writing += ed->writing[a];
    }
    put(arg, "disk_blocks", blocks);
    put(arg, "disk_records", blocks + records);
    put(arg, "disk_clean_blocks", records);
    put(arg, "disk_clean_bytes", clean);
    put(arg, "disk_writing_bytes", writing);
    put(arg, "disk_put_rate", (uint64_t)ed->put_bps);
    put(arg, "disk_write_rate", (uint64_t)ed->write_bps);
    put(arg, "disk_reads_queued", ed->reads_queued);
    put(arg, "disk_stuck", ed->stuck);
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
    put(arg, "disk_full", ed->disk_full);
    put(arg, "disk_failed_paths", st.failed_paths);
    put(arg, "disk_buffered", st.buffered);
    put(arg, "disk_fixed_buffers", st.fixed_buffers);
    put(arg, "disk_records_found", st.records_found);
    put(arg, "disk_demote_cancelled", ed->demote_cancelled);
    put(arg, "disk_moves_inflight", ed->moves + ed->compacting);
    put(arg, "disk_compacted_pages", ed->compacted_pages);
    put(arg, "disk_compacted_blocks", ed->compacted_blocks);
    put(arg, "disk_compacted_bytes", ed->compacted_bytes);
    put(arg, "disk_compact_aborted", ed->compact_aborted);
    put(arg, "disk_compress_in", st.codec_in);
    put(arg, "disk_compress_out", st.codec_out);
    put(arg, "disk_compress_ratio_pct", st.codec_out ? st.codec_in * 100 / st.codec_out : 0);
    put(arg, "disk_compressed_records", st.compressed);
    put(arg, "disk_incompressible_records", st.incompressible);
    engine_disk_checkpoint_stats(s, put, arg);
}
