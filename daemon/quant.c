/*
 * quant.c — quantize-in-place on worker threads.
 *
 * DESIGN
 * The loop thread owns the store; the workers (host.quantize_threads of them, one by default,
 * 0 for one per CPU up to 4, sharing one queue) only touch bytes. Results land in the order the jobs
 * were queued (a sequence number per job; one finished before an earlier one waits in
 * `held`), so a job placed on landing finds the slot an earlier one freed, as with one worker.
 * More than one: a put that waits for the precision ladder's room waits for the encodes, and
 * with several clients one thread fell behind them (docs/policies.md). store_quantize() (loop)
 * checks the block (committed, raw, unpinned, in a namespace that allows a codec),
 * allocates the encoded slot in the block's arena, pins the block (eviction, flushes and
 * quotas skip pinned blocks, so its raw slot stays put) and queues a job. The worker reads
 * the raw slot, writes the encoded slot (kern_encode_cpu, with the key statistics) and
 * queues the result; an eventfd wakes the loop, which applies it. If the block holds only
 * the job's pin, its location becomes the encoded slot (format = the recipe's K codec, or
 * the V codec when K stays raw), the raw slot is freed and the counters move. If a lookup
 * pinned it meanwhile, a client may be reading the raw slot through its lease: the encoded
 * slot is freed instead and the block stays raw (a later trim may try again). So a lookup
 * that arrives during the encode always gets the raw copy, and no slot a lease points at is
 * ever freed.
 *
 * A step further down the precision ladder (store_quantize_to into a smaller codec) decodes
 * the lossy block to full precision on the worker and encodes it again. A slab's worth at
 * once (store_quantize_slab: the ladder found no free slot of the smaller size) encodes into
 * private memory; when the last job of the group is done and every block is still the
 * jobs' alone, the raw slots are freed (the slab empties, its pages take any size) and each
 * block gets its smaller slot and bytes; otherwise nothing changes. The jobs' raw bytes count
 * as room coming (quant_pending_bytes, engine_room_coming), and a landing job wakes the puts
 * that wait for it (store.on_room).
 *
 * Trigger: while every namespace ranks with lru, engine_trim() calls quant_pressure() (below);
 * once one has another policy, the policy engine (engine_policy_trim) chooses the blocks to
 * quantize with policy_decide and calls store_quantize() itself, or, for a namespace with a
 * precision ladder, the ladder's steps (engine.c) choose them. quant_pressure() runs
 * first. For each arena above its high watermark it queues the coldest unpinned raw blocks
 * of namespaces that allow a codec, counting each queued raw slot as freed already, until
 * the arena would be at its low watermark or store_params.quantize_inflight jobs of that
 * arena are in flight; engine_trim() then evicts only what quantization does not cover.
 * Namespaces allow no codec unless their creator asked (layout.flags at NS_OPEN), so by
 * default nothing is ever lossy.
 *
 * Key statistics: the encode pass computes per-(layer, head) key min/max per channel and
 * mean key norm; a summary per quantized block (mean key norm over layers and heads,
 * largest |key|, bf16 each) is kept in a side table by block index (struct block is at its
 * size budget), read with quant_key_summary() by the policies.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/loop.h"
#include "daemon/quant.h"
#include "daemon/store.h"
#include "kernels/kern.h"
#include "tiers/host.h"
#include "tiers/slab.h"
#include "tiers/tier.h"

#define QUANT_WALK 4096 /* LRU entries the trigger looks at per arena */
#define QUANT_NO_ROOM_TRIES 16 /* blocks of a namespace with no room for their encoded slot */
#define QUANT_NO_ROOM_NS 8     /* namespaces a walk keeps that count for */

_Static_assert(KVC_WIRE_FORMAT_Q8_0 == KERN_CODEC_Q8_0 && KVC_WIRE_FORMAT_FP8 == KERN_CODEC_FP8 &&
                   KVC_WIRE_FORMAT_COUNT == KERN_CODEC_COUNT,
               "wire formats are kern codecs");

struct quant_job {
    struct quant_job *next;
    uint64_t seq; /* queue order: jobs land in it (quant_poll) */
    uint32_t idx;
    uint32_t arena;
    uint8_t format;
    uint8_t src_format;         /* RAW, or the lossy format the block is re-encoded from */
    uint8_t from_rung, to_rung; /* on its namespace's ladder (0, 0 without one) */
    struct tier_loc raw, enc;
    const void *src;
    void *dst;
    struct kern_layout lay;
    struct kern_recipe rec;
    int64_t rc;
    struct quant_group *group; /* a whole slab's step down (store_quantize_slab), or NULL */
    bool later;                /* encoded into private memory, its slot taken when it lands
                                  (store_quantize_later) */
    float key_norm, key_absmax;
    float value_norm;   /* VATP: mean value L1 norm of the raw block */
    uint8_t *raw_heads; /* rec.raw_heads: the namespace's retrieval heads (store_head_raw) */
    float *quest;       /* per channel key min then max, summed over (layer, head): 2 * head_dim */
    /* MERGE: a block with more runs than the codec stores (kern_merge_forced) goes to the
     * rung after it instead (alt_format, alt_rec; 0: none, the step fails and the block
     * goes), smaller, so it fits the slot allocated */
    uint8_t alt_format;
    bool alt_used;
    bool refused;
    int64_t alt_len;
    struct kern_recipe alt_rec;
};

/* The jobs of one slab's blocks: encoded into private memory, placed together once the last
 * one is done, after their raw slots (the whole slab) are freed. */
struct quant_group {
    uint32_t left; /* jobs not done yet */
    uint32_t n;
    struct quant_job *job[];
};

struct quant {
    struct store *s;
    struct loop *loop;
    int efd;
    pthread_t th[QUANT_THREADS_MAX];
    uint32_t nthreads; /* started */
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* todo or stop */
    pthread_cond_t done_cv; /* a result is ready */
    struct quant_job *todo, *todo_tail, *done;
    bool stop;
    uint32_t inflight;      /* loop thread only */
    uint64_t seq_next;      /* loop thread: the next job's seq */
    uint64_t seq_land;      /* loop thread: the seq of the next job to land */
    struct quant_job *held; /* loop thread: done before an earlier job, by seq */
    uint64_t pending[STORE_MAX_ARENAS];
    /* Jobs of each arena in flight: store_params.quantize_inflight bounds each arena's, not
     * all together (one tenant's jobs at the cap held every other arena's ladder) */
    uint32_t inflight_arena[STORE_MAX_ARENAS];
};

/* ---- worker -------------------------------------------------------------------------- */

/* A job's scratch for a block, on 64-byte lines: malloc puts one this large 16 bytes past a
 * page, which splits every line the decoder and encoder stream out across two (13 % of a
 * LOWRANK decode: docs/kernels.md). NULL: no memory. */
static void *quant_buf(uint64_t len)
{
    return aligned_alloc(64, len ? (len + 63) & ~(uint64_t)63 : 64);
}

static void quant_encode(struct quant_job *j)
{
    const struct kern_layout *lay = &j->lay;
    size_t nlh = (size_t)lay->layers * lay->heads, n = nlh * lay->head_dim;
    float *buf = malloc((2 * n + nlh) * sizeof(float));
    struct kern_key_stats ks = {buf, buf + n, buf + 2 * n};
    void *raw = NULL, *priv = NULL, *mine = NULL, *dst = j->dst;
    const void *src = j->src;
    if (!j->later && !j->group) {
        /* The encoder reads back what it wrote (the section table, MERGE's K runs for its V
         * section), and an arena slot is mapped by every writer of the arena, who could
         * change those in between and send it past the slot: it encodes into private
         * memory, copied to the slot once done (a job placed on landing has its own). */
        mine = dst = quant_buf(j->enc.len);
        if (!mine) {
            j->rc = -ENOMEM;
            goto out;
        }
    }
    if (j->src_format != KVC_WIRE_FORMAT_RAW) {
        /* One rung further down: decoded to full precision, encoded again. Writers of the
         * arena can change the block's bytes while we read them, and the decoder checks its
         * header and section table and then reads them again: it decodes a private copy, as
         * libkvc does (a table rewritten between the two reads sent it past its buffers). */
        uint64_t rb = kern_raw_size(lay);
        raw = quant_buf(rb);
        priv = quant_buf(j->raw.len);
        if (priv)
            memcpy(priv, j->src, j->raw.len);
        j->rc = raw && priv
                    ? kern_decode_cpu(lay, priv, j->raw.len, raw, rb, (enum kern_dtype)lay->dtype)
                    : -ENOMEM;
        if (j->rc < 0)
            goto out;
        src = raw;
    }
    if (j->format == KVC_WIRE_FORMAT_MERGE) {
        /* Encoded first: the plan forces a token only in a head that holds all its rows, so
         * where no head of the block does (kern_merge_may_force 0: run-structured blocks,
         * the codec's case) the encode stands without the reference plan, whose scalar pass
         * cost ~10 encodes (docs/kernels.md); anything else asks the plan itself. */
        j->rc = kern_encode_cpu(lay, &j->rec, src, dst, j->enc.len, buf ? &ks : NULL);
        if (j->rc < 0)
            goto out;
        int64_t f = kern_merge_may_force(lay, &j->rec, dst, (size_t)j->rc);
        if (f != 0)
            f = kern_merge_forced(lay, &j->rec, src);
        if (f != 0) {
            j->refused = true;
            if (f < 0 || !j->alt_format) {
                j->rc = f < 0 ? f : -ERANGE;
                goto out;
            }
            j->alt_used = true;
            j->rc = kern_encode_cpu(lay, &j->alt_rec, src, dst, j->enc.len, buf ? &ks : NULL);
        }
        if (j->rc < 0 || !buf)
            goto out;
        goto stats;
    }
    j->rc = kern_encode_cpu(lay, &j->rec, src, dst, j->enc.len, buf ? &ks : NULL);
    if (j->rc < 0 || !buf)
        goto out;
stats:;
    double norm = 0;
    float amax = 0.0f;
    for (size_t i = 0; i < nlh; i++)
        norm += ks.knorm[i];
    for (size_t i = 0; i < n; i++) {
        amax = fmaxf(amax, fabsf(ks.kmin[i]));
        amax = fmaxf(amax, fabsf(ks.kmax[i]));
    }
    j->key_norm = (float)(norm / (double)nlh);
    j->value_norm = (float)kern_value_l1(lay, src);
    j->key_absmax = amax;
    /* Quest's summary for budgeted reads (store_policy.c): the bound of a query against the
     * sum over layers and heads is the sum of their bounds' channel terms' upper envelope. */
    j->quest = calloc(2 * (size_t)lay->head_dim, sizeof(float));
    if (j->quest)
        for (size_t i = 0; i < nlh; i++)
            for (uint32_t d = 0; d < lay->head_dim; d++) {
                j->quest[d] += ks.kmin[i * lay->head_dim + d];
                j->quest[lay->head_dim + d] += ks.kmax[i * lay->head_dim + d];
            }
out:
    if (mine && j->rc >= 0)
        memcpy(j->dst, mine, (size_t)j->rc);
    free(mine);
    free(priv);
    free(raw);
    free(buf);
}

static void *quant_main(void *arg)
{
    struct quant *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->todo && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        if (!q->todo)
            break;
        struct quant_job *j = q->todo;
        q->todo = j->next;
        if (!q->todo)
            q->todo_tail = NULL;
        pthread_mutex_unlock(&q->mu);
        quant_encode(j);
        pthread_mutex_lock(&q->mu);
        j->next = q->done;
        q->done = j;
        pthread_cond_broadcast(&q->done_cv);
        if (q->efd >= 0) {
            uint64_t one = 1;
            ssize_t w = write(q->efd, &one, sizeof(one));
            (void)w; /* a full counter still wakes the loop */
        }
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* ---- loop side ----------------------------------------------------------------------- */

static uint16_t quant_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* A job is done: what counted it in flight. */
static void quant_settle(struct quant *q, struct quant_job *j)
{
    struct store *s = q->s;
    struct block *b = &s->ix.blocks[j->idx];
    struct store_ns *ns = s->ns[b->ns];
    b->flags &= (uint8_t)~BLOCK_F_QUANTIZING;
    q->inflight--;
    q->inflight_arena[j->arena]--;
    q->pending[j->arena] -= j->raw.len;
    if (ns->rung_moving[j->from_rung] >= j->raw.len)
        ns->rung_moving[j->from_rung] -= j->raw.len;
    else
        ns->rung_moving[j->from_rung] = 0; /* the ladder was set up again meanwhile */
    if (ns->rung_coming[j->to_rung] >= j->enc.len)
        ns->rung_coming[j->to_rung] -= j->enc.len;
    else
        ns->rung_coming[j->to_rung] = 0;
}

/* Whether the result of j may replace the block's bytes: encoded, and nobody but the job
 * holds the block (a lease taken meanwhile may be reading the old slot). */
static bool quant_usable(const struct store *s, const struct quant_job *j)
{
    const struct block *b = &s->ix.blocks[j->idx];
    return j->rc >= 0 && b->pins == 1 && b->state == BLOCK_STATE_COMMITTED &&
           b->off == j->raw.off && b->arena == j->arena;
}

/* The block takes its encoded slot j->enc (written); its old slot is freed unless done. */
static void quant_place(struct quant *q, struct quant_job *j, bool raw_freed)
{
    struct store *s = q->s;
    struct block *b = &s->ix.blocks[j->idx];
    struct store_ns *ns = s->ns[b->ns];
    struct tier *t = s->arenas[j->arena].tier;
    store_ladder_account(s, j->idx, -1);
    store_slot_own(s, j->idx, false);
    b->off = j->enc.off;
    b->len = j->enc.len;
    b->cls = (uint8_t)j->enc.cls;
    b->format = j->format;
    store_ladder_account(s, j->idx, +1);
    store_slot_own(s, j->idx, true);
    if (j->idx >= s->nkeysum) { /* struct block has no room left: a side table by index */
        uint32_t n = q->s->nkeysum ? q->s->nkeysum : 1024;
        while (n <= j->idx)
            n *= 2;
        uint32_t *ns_ = realloc(q->s->keysum, (size_t)n * sizeof(*ns_));
        if (ns_) {
            memset(ns_ + q->s->nkeysum, 0, (size_t)(n - q->s->nkeysum) * sizeof(*ns_));
            q->s->keysum = ns_;
            q->s->nkeysum = n;
        }
    }
    if (j->idx < q->s->nkeysum)
        q->s->keysum[j->idx] = (uint32_t)quant_bf16(j->key_norm) << 16 | quant_bf16(j->key_absmax);
    ns->bytes = ns->bytes - j->raw.len + j->enc.len;
    store_meta_vnorm_set(s, j->idx, j->value_norm);
    if (j->quest) {
        store_meta_quest_set(s, j->idx, j->quest, j->lay.head_dim);
        j->quest = NULL;
    }
    store_block_unpin(s, j->idx); /* back in its heaps: its format and key norm are part */
    s->pins_now--;                /* of its key */
    store_fast_sync(s, j->idx);   /* the new slot, before the old one is freed */
    if (!raw_freed)
        t->ops->free(t, &j->raw);
    if (j->src_format != KVC_WIRE_FORMAT_RAW) {
        s->total.requantized_blocks++;
        ns->stats.requantized_blocks++;
    } else {
        s->total.quantized_blocks++;
        ns->stats.quantized_blocks++;
    }
    s->total.quant_bytes_saved += j->raw.len - j->enc.len;
    ns->stats.quant_bytes_saved += j->raw.len - j->enc.len;
}

/* A job encoded into private memory takes a slot of its size now and the block moves there
 * (quant_place). False when no slot is free: nothing changed. */
static bool quant_place_private(struct quant *q, struct quant_job *j, bool raw_freed)
{
    struct tier *t = q->s->arenas[j->arena].tier;
    struct tier_loc loc;
    if (t->ops->alloc(t, j->enc.len, &loc))
        return false;
    memcpy((uint8_t *)tier_host_base(t) + loc.off, j->dst, j->enc.len);
    j->enc = loc;
    quant_place(q, j, raw_freed);
    return true;
}

static void quant_job_free(struct quant_job *j)
{
    if (j->group || j->later)
        free(j->dst); /* private memory */
    free(j->quest);
    free(j->raw_heads);
    free(j);
}

/* A merge step the plan refused (more runs than merge stores): counted; where the rung after
 * merge was encoded instead, the job carries that format and size; where none is, the block
 * is marked (merge_refused: no step, slab step or trigger takes it to merge again). */
static void quant_refused(struct store *s, struct quant_job *j)
{
    struct store_ns *ns = s->ns[s->ix.blocks[j->idx].ns];
    if (j->format == KVC_WIRE_FORMAT_MERGE && j->to_rung && ns->rungs >= 2 && !ns->merge_off) {
        ns->merge_steps++;
        ns->merge_refusals += j->refused;
    }
    if (j->refused) {
        s->total.merge_refused_blocks++;
        ns->stats.merge_refused_blocks++;
    }
    if (j->refused && j->rc == -ERANGE) /* marked before it is unpinned (its heaps) */
        s->ix.blocks[j->idx].merge_refused = 1;
    if (j->alt_used && j->rc >= 0) {
        j->format = j->alt_format;
        j->enc.len = (uint64_t)j->rc;
    }
}

/* After a refused merge with no rung after it, unpinned: merge, the last rung, cannot take
 * the block, so it leaves, as past the last rung (else the ladder picks it again at once,
 * and again, while the arena stays full). */
static void quant_refused_leave(struct store *s, const struct quant_job *j)
{
    if (j->rc == -ERANGE && j->refused && !s->ix.blocks[j->idx].children &&
        store_block_idle(s, j->idx))
        (void)store_block_drop(s, j->idx);
}

/* After STORE_MERGE_WINDOW merge steps of ns's ladder, nearly all refused: merge goes off its
 * ladder (the rungs set up again without it) for the next merge_retry blocks committed
 * (store.h: STORE_MERGE_RETRY, doubling with each try that goes off again). Called once the job that counted the last step is applied (the rungs change between jobs,
 * as kvcctl's ladder settings change them). */
static void quant_merge_verdict(struct store *s, struct store_ns *ns)
{
    if (ns->merge_steps < STORE_MERGE_WINDOW)
        return;
    bool off = (uint64_t)ns->merge_refusals * 100u >=
               (uint64_t)ns->merge_steps * STORE_MERGE_REFUSED_PCT;
    ns->merge_steps = ns->merge_refusals = 0;
    if (!off) {
        ns->merge_retry = 0; /* merge takes this KV: a later verdict waits the least again */
        return;
    }
    /* the first time, or each try that goes off again waits twice as long */
    ns->merge_retry = !ns->merge_retry                      ? STORE_MERGE_RETRY
                      : ns->merge_retry < STORE_MERGE_RETRY_MAX ? 2 * ns->merge_retry
                                                                : STORE_MERGE_RETRY_MAX;
    ns->merge_off = true;
    ns->merge_off_at = ns->stats.committed_blocks;
    s->total.merge_off++;
    ns->stats.merge_off++;
    log_limited(LOG_LEVEL_INFO,
                "quant: namespace %u: merge refused at least %u %% of %u steps (no runs of alike "
                "tokens): off its ladder for the next %" PRIu64 " blocks",
                ns->id, STORE_MERGE_REFUSED_PCT, STORE_MERGE_WINDOW, ns->merge_retry);
    store_ladder_setup(s, ns);
}

static void quant_apply(struct quant *q, struct quant_job *j)
{
    struct store *s = q->s;
    struct tier *t = s->arenas[j->arena].tier;
    uint32_t ns_id = s->ix.blocks[j->idx].ns;
    bool usable;
    quant_settle(q, j);
    quant_refused(s, j);
    usable = quant_usable(s, j);
    if (usable && !j->later) {
        quant_place(q, j, false);
    } else if (!usable || !quant_place_private(q, j, false)) {
        /* Not usable, or (placed on landing) the jobs that were to free its slot freed none:
         * the block stays as it was. */
        store_block_unpin(s, j->idx);
        s->pins_now--;
        if (usable)
            s->total.ladder_missed++;
        if (j->rc < 0 && j->rc != -ERANGE)
            log_limited(LOG_LEVEL_WARNING, "quant: block %u not quantized (%s)", j->idx,
                        strerror((int)-j->rc));
        if (!j->later)
            t->ops->free(t, &j->enc);
        quant_refused_leave(s, j);
    }
    quant_job_free(j);
    if (store_ns_get(s, ns_id))
        quant_merge_verdict(s, store_ns_get(s, ns_id));
}

/* The last job of a slab's group is done. If every block is still the job's alone and the
 * slab holds nothing else, the raw slots are freed (the slab empties: its pages can serve
 * any size) and each block gets a slot of its smaller size, with the bytes the worker wrote
 * in private memory. Else nothing changes: the blocks stay as they were. */
static void quant_group_apply(struct quant *q, struct quant_group *g)
{
    struct store *s = q->s;
    uint32_t arena = g->job[0]->arena;
    struct tier *t = s->arenas[arena].tier;
    uint64_t start, slot;
    uint32_t nslots, used, ns_id = s->ix.blocks[g->job[0]->idx].ns;
    bool ok = true;
    for (uint32_t i = 0; i < g->n; i++) {
        quant_settle(q, g->job[i]);
        quant_refused(s, g->job[i]);
        ok = ok && quant_usable(s, g->job[i]);
    }
    ok = ok &&
         slab_span(tier_host_slab(t), g->job[0]->raw.off, &start, &slot, &nslots, &used) == 0 &&
         used == g->n;
    if (!ok) {
        for (uint32_t i = 0; i < g->n; i++) {
            store_block_unpin(s, g->job[i]->idx);
            s->pins_now--;
        }
        for (uint32_t i = 0; i < g->n; i++)
            quant_refused_leave(s, g->job[i]);
        goto out;
    }
    for (uint32_t i = 0; i < g->n; i++)
        t->ops->free(t, &g->job[i]->raw);
    for (uint32_t i = 0; i < g->n; i++) {
        struct quant_job *j = g->job[i];
        struct block *b = &s->ix.blocks[j->idx];
        if (quant_place_private(q, j, true))
            continue;
        /* No slot even in the pages the slab gave back (another size took them between
         * its runs): the block's bytes are gone, as after an arena fault; it is a miss from
         * now on and goes once nothing hangs from it. */
        log_limited(LOG_LEVEL_WARNING, "quant: block %u lost: no slot for its encoded copy",
                    j->idx);
        b->flags |= BLOCK_F_LOST;
        store_block_unpin(s, j->idx);
        s->pins_now--;
        store_fast_sync(s, j->idx);
        if (!b->children && !b->pins)
            (void)store_block_drop(s, j->idx);
    }
out:
    for (uint32_t i = 0; i < g->n; i++)
        quant_job_free(g->job[i]);
    free(g);
    if (store_ns_get(s, ns_id)) /* a group's blocks are of one namespace */
        quant_merge_verdict(s, store_ns_get(s, ns_id));
}

int quant_poll(struct quant *q)
{
    struct quant_job *j;
    int n = 0;
    pthread_mutex_lock(&q->mu);
    j = q->done;
    q->done = NULL;
    pthread_mutex_unlock(&q->mu);
    /* In the order they were queued, whichever thread finished first: a job placed when it
     * lands takes the slot an earlier one freed. A job done before an earlier one waits in
     * `held` (sorted by seq) until that one is done. */
    while (j) {
        struct quant_job *next = j->next, **at = &q->held;
        while (*at && (*at)->seq < j->seq)
            at = &(*at)->next;
        j->next = *at;
        *at = j;
        j = next;
    }
    while (q->held && q->held->seq == q->seq_land) {
        j = q->held;
        q->held = j->next;
        q->seq_land++;
        if (!j->group)
            quant_apply(q, j);
        else if (--j->group->left == 0)
            quant_group_apply(q, j->group);
        n++;
    }
    if (n && q->s->on_room)
        q->s->on_room(q->s->on_room_arg); /* puts that wait for the room the jobs freed */
    return n;
}

int quant_drain(struct quant *q)
{
    int n = 0;
    while (q->inflight) {
        pthread_mutex_lock(&q->mu);
        while (!q->done)
            pthread_cond_wait(&q->done_cv, &q->mu);
        pthread_mutex_unlock(&q->mu);
        n += quant_poll(q);
    }
    return n;
}

static void quant_on_event(struct loop *l, int fd, uint32_t events, void *arg)
{
    uint64_t v;
    (void)l;
    (void)events;
    while (read(fd, &v, sizeof(v)) == sizeof(v))
        ;
    quant_poll(arg);
}

static float quant_f32(uint16_t bf)
{
    uint32_t u = (uint32_t)bf << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int quant_key_summary(const struct quant *q, uint32_t idx, float *norm, float *absmax)
{
    const struct block *b;
    if (!q || idx >= q->s->ix.nblocks || idx >= q->s->nkeysum)
        return -ENOENT;
    b = &q->s->ix.blocks[idx];
    if (b->state != BLOCK_STATE_COMMITTED || b->format == KVC_WIRE_FORMAT_RAW)
        return -ENOENT;
    *norm = quant_f32((uint16_t)(q->s->keysum[idx] >> 16));
    *absmax = quant_f32((uint16_t)q->s->keysum[idx]);
    return 0;
}

uint32_t quant_inflight(const struct quant *q)
{
    return q ? q->inflight : 0;
}

uint32_t quant_inflight_in(const struct quant *q, uint32_t arena)
{
    return q && arena < STORE_MAX_ARENAS ? q->inflight_arena[arena] : 0;
}

uint64_t quant_pending_bytes(const struct quant *q, uint32_t arena)
{
    return q && arena < STORE_MAX_ARENAS ? q->pending[arena] : 0;
}

int store_quantize(struct store *s, uint32_t idx)
{
    if (idx >= s->ix.nblocks || s->ix.blocks[idx].state != BLOCK_STATE_COMMITTED)
        return -ENOENT;
    const struct store_ns *ns = s->ns[s->ix.blocks[idx].ns];
    if (s->ix.blocks[idx].format != KVC_WIRE_FORMAT_RAW)
        return -EALREADY;
    return store_quantize_to(s, idx, store_ns_first_format(ns));
}

/* A job for block idx into `format`, its encoded slot allocated now (private memory when
 * `private_dst`: store_quantize_slab). Nothing else changes until quant_job_queue. */
static int quant_job_make(struct store *s, uint32_t idx, uint8_t format, bool private_dst,
                          struct quant_job **out)
{
    struct quant_job *j;
    int rc;
    if (!s->quant)
        return -ENODEV;
    if (idx >= s->ix.nblocks || s->ix.blocks[idx].state != BLOCK_STATE_COMMITTED)
        return -ENOENT;
    struct block *b = &s->ix.blocks[idx];
    struct store_ns *ns = s->ns[b->ns];
    uint32_t f = ns->layout.flags;
    if (b->flags & BLOCK_F_QUANTIZING)
        return -EALREADY;
    if (b->pins)
        return -EBUSY;
    if (!KVC_WIRE_QUANT_ALLOWED(f) || format == KVC_WIRE_FORMAT_RAW ||
        format >= KVC_WIRE_FORMAT_COUNT || !(KVC_WIRE_QUANT_ALLOWED(f) & (1u << format)) ||
        (ns->max_error > 0 && kern_codec_attn_error((enum kern_codec)format) > ns->max_error))
        return -EPERM; /* not allowed, or beyond the namespace's fidelity budget */
    /* Only a block in a host arena, not one in motion, and not a clean one: its disk
     * record holds its raw bytes (dropping its memory copy costs nothing instead). */
    if (b->tier != KVC_WIRE_TIER_HOST || (b->flags & (BLOCK_F_BUSY | BLOCK_F_LOST | BLOCK_F_DISK)))
        return -EBUSY;
    j = calloc(1, sizeof(*j));
    if (!j)
        return -ENOMEM;
    store_ns_kern_layout(ns, &j->lay);
    store_ns_kern_recipe(ns, format, &j->rec);
    /* Per-head precision: the retrieval heads stay raw (store_head_raw). Not with a disk
     * tier (its records are sized by format: engine_disk_block_bytes) nor in a whole-slab
     * step (its pages are planned at the format's size). */
    if (ns->head_mass && !s->disk && !private_dst) {
        j->raw_heads = malloc((size_t)ns->layout.layers * ns->layout.kv_heads);
        if (j->raw_heads && store_head_raw(s, b->ns, j->raw_heads) > 0) {
            /* The heads kept raw are the ones attention reads from this block: the rest may
             * take the ladder's second codec at once (store_head_step). */
            uint8_t to = store_head_step(s, idx, format);
            if (to != format) {
                format = to;
                store_ns_kern_recipe(ns, format, &j->rec);
                s->total.head_stepped_blocks++;
            }
            j->rec.raw_heads = j->raw_heads;
        }
    }
    j->format = format;
    j->src_format = b->format;
    int64_t eb = kern_encoded_size(&j->lay, &j->rec);
    struct tier *t = s->arenas[b->arena].tier;
    if (eb < 0) {
        rc = (int)eb;
        goto fail;
    }
    if ((uint64_t)eb >= b->len) { /* nothing to gain (or not a step down) */
        rc = -ENOSPC;
        goto fail;
    }
    if (private_dst) {
        j->enc = (struct tier_loc){.arena = b->arena, .len = (uint64_t)eb};
        j->dst = quant_buf(eb);
        rc = j->dst ? 0 : -ENOMEM;
    } else {
        rc = t->ops->alloc(t, (uint64_t)eb, &j->enc);
        j->dst = (uint8_t *)tier_host_base(t) + j->enc.off;
    }
    if (rc)
        goto fail;
    j->idx = idx;
    j->arena = b->arena;
    j->raw = (struct tier_loc){.arena = b->arena, .cls = b->cls, .off = b->off, .len = b->len};
    j->src = (const uint8_t *)tier_host_base(t) + b->off;
    if (ns->rungs >= 2 && b->arena == ns->arena) {
        j->from_rung = (uint8_t)store_ladder_rung(ns, b->format);
        j->to_rung = (uint8_t)store_ladder_rung(ns, format);
        if (format == KVC_WIRE_FORMAT_MERGE && j->to_rung + 1u < ns->rungs &&
            ns->rung_format[j->to_rung] == KVC_WIRE_FORMAT_MERGE) {
            j->alt_format = ns->rung_format[j->to_rung + 1];
            store_ns_kern_recipe(ns, j->alt_format, &j->alt_rec);
        }
    }
    *out = j;
    return 0;
fail:
    free(j->raw_heads);
    free(j);
    return rc;
}

/* The block is the job's until it lands: pinned, counted in flight, its raw slot as freed. */
static void quant_job_queue(struct quant *q, struct quant_job *j)
{
    struct store *s = q->s;
    struct block *b = &s->ix.blocks[j->idx];
    struct store_ns *ns = s->ns[b->ns];
    ns->rung_moving[j->from_rung] += j->raw.len;
    ns->rung_coming[j->to_rung] += j->enc.len;
    store_block_pin(s, j->idx);
    s->pins_now++;
    b->flags |= BLOCK_F_QUANTIZING;
    q->inflight++;
    q->inflight_arena[b->arena]++;
    q->pending[b->arena] += b->len;
    j->seq = q->seq_next++;
    pthread_mutex_lock(&q->mu);
    if (q->todo_tail)
        q->todo_tail->next = j;
    else
        q->todo = j;
    q->todo_tail = j;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

int store_quantize_to(struct store *s, uint32_t idx, uint8_t format)
{
    struct quant_job *j;
    int rc = quant_job_make(s, idx, format, false, &j);
    if (rc == 0)
        quant_job_queue(s->quant, j);
    return rc;
}

int store_quantize_later(struct store *s, uint32_t idx, uint8_t format)
{
    struct quant_job *j;
    int rc = quant_job_make(s, idx, format, true, &j);
    if (rc)
        return rc;
    j->later = true;
    quant_job_queue(s->quant, j);
    return 0;
}

int store_quantize_slab(struct store *s, const uint32_t *idx, uint32_t n, uint8_t format)
{
    struct quant_group *g;
    int rc = 0;
    if (!n)
        return -EINVAL;
    g = calloc(1, sizeof(*g) + n * sizeof(g->job[0]));
    if (!g)
        return -ENOMEM;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        rc = quant_job_make(s, idx[i], format, true, &g->job[i]);
        if (rc == 0) {
            g->job[i]->group = g;
            g->n++;
        }
    }
    if (rc) {
        for (uint32_t i = 0; i < g->n; i++)
            quant_job_free(g->job[i]);
        free(g);
        return rc;
    }
    g->left = n;
    for (uint32_t i = 0; i < n; i++)
        quant_job_queue(s->quant, g->job[i]);
    return 0;
}

/* The namespaces a walk found no room for (QUANT_NO_ROOM_TRIES blocks each): the rest of
 * their blocks are passed over, the others' still tried (another slot size may have room). */
struct quant_full {
    uint32_t ns[QUANT_NO_ROOM_NS], fails[QUANT_NO_ROOM_NS], n;
};

/* Whether ns is one of them; with `fail`, one more of its blocks found no room. */
static bool quant_full_ns(struct quant_full *f, uint32_t ns, bool fail)
{
    uint32_t k = 0;
    while (k < f->n && f->ns[k] != ns)
        k++;
    if (k == f->n) {
        if (!fail || f->n == QUANT_NO_ROOM_NS)
            return false; /* not seen, or no room to track it: tried as before */
        f->ns[f->n] = ns;
        f->fails[f->n++] = 0;
    }
    if (fail)
        f->fails[k]++;
    return f->fails[k] >= QUANT_NO_ROOM_TRIES;
}

int quant_pressure(struct quant *q, uint64_t now, int (*no_room)(struct store *s, uint32_t idx))
{
    struct store *s;
    int n = 0;
    (void)now;
    if (!q)
        return 0;
    s = q->s;
    for (uint32_t a = 0; a < s->narenas; a++) {
        struct tier *t = s->arenas[a].tier;
        double cap = (double)t->ops->capacity(t);
        uint32_t walked = 0;
        struct quant_full full = {.n = 0};
        if ((double)(t->ops->usage(t) - q->pending[a]) <= s->p.high_watermark * cap)
            continue;
        for (uint32_t i = s->arenas[a].lru_tail; i != INDEX_NONE && walked < QUANT_WALK &&
                                                 q->inflight_arena[a] < s->p.quantize_inflight;
             walked++) {
            uint32_t prev = s->ix.blocks[i].lru_prev;
            if ((double)(t->ops->usage(t) - q->pending[a]) <= s->p.low_watermark * cap)
                break;
            const struct block *b = &s->ix.blocks[i];
            const struct store_ns *ns = s->ns[b->ns];
            /* A namespace that keeps a precision ladder steps by it (engine_ladder_evict:
             * its order, its rungs, its sinks raw), not by this walk of the LRU's tail. */
            bool ladder = ns->rungs >= 2 && ns->policy != POLICY_LRU;
            if (!b->pins && b->format == KVC_WIRE_FORMAT_RAW && !ladder && !b->merge_refused &&
                KVC_WIRE_QUANT_ALLOWED(ns->layout.flags) && !quant_full_ns(&full, b->ns, false)) {
                int rc = store_quantize(s, i);
                if (rc == 0) {
                    n++;
                } else if (rc == -ENOSPC &&
                           store_format_bytes(ns, store_ns_first_format(ns)) < (int64_t)b->len) {
                    /* no slot of the encoded size (not a codec that saves nothing): its slab
                     * whole, or none (prev may be one of the slab's blocks now: each is
                     * pinned, and skipped) */
                    s->total.quant_no_room++;
                    s->ns[b->ns]->stats.quant_no_room++;
                    int m = no_room ? no_room(s, i) : 0;
                    n += m;
                    if (m <= 0)
                        (void)quant_full_ns(&full, b->ns, true);
                }
            }
            i = prev;
        }
    }
    return n;
}

/* ---- life cycle ---------------------------------------------------------------------- */

uint32_t quant_nthreads(const struct quant *q)
{
    return q ? q->nthreads : 0;
}

uint32_t quant_threads(uint32_t want)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (want == 0)
        want = cpus > QUANT_THREADS_AUTO ? QUANT_THREADS_AUTO : cpus > 1 ? (uint32_t)cpus : 1;
    return want > QUANT_THREADS_MAX ? QUANT_THREADS_MAX : want;
}

struct quant *quant_new(struct loop *l, struct store *s, int *err)
{
    struct quant *q = calloc(1, sizeof(*q));
    int rc = -ENOMEM;
    if (!q)
        goto fail;
    q->s = s;
    q->loop = l;
    q->efd = -1;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    pthread_cond_init(&q->done_cv, NULL);
    if (l) {
        q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (q->efd < 0) {
            rc = -errno;
            goto fail;
        }
        rc = loop_add(l, q->efd, EPOLLIN, quant_on_event, q);
        if (rc)
            goto fail;
    }
    for (uint32_t i = 0; i < quant_threads(s->p.quantize_threads); i++) {
        rc = -pthread_create(&q->th[i], NULL, quant_main, q);
        if (rc)
            goto fail;
        q->nthreads++;
    }
    s->quant = q;
    return q;
fail:
    quant_free(q);
    *err = rc;
    return NULL;
}

void quant_free(struct quant *q)
{
    if (!q)
        return;
    if (q->nthreads) {
        quant_drain(q);
        pthread_mutex_lock(&q->mu);
        q->stop = true;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        for (uint32_t i = 0; i < q->nthreads; i++)
            pthread_join(q->th[i], NULL);
    }
    if (q->efd >= 0) {
        if (q->loop)
            loop_del(q->loop, q->efd);
        close(q->efd);
    }
    if (q->s && q->s->quant == q)
        q->s->quant = NULL;
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    pthread_cond_destroy(&q->done_cv);
    free(q->s->keysum);
    q->s->keysum = NULL;
    q->s->nkeysum = 0;
    free(q);
}
