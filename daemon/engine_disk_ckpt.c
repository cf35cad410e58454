/*
 * engine_disk_ckpt.c — checkpoints of the disk tier's index, from the daemon's side.
 *
 * DESIGN
 * The disk tier writes the checkpoint (tiers/disk_ckpt.c); this file only lists what the
 * daemon holds on disk: every committed block with a disk record (BLOCK_F_DISK: only on
 * disk, or clean in memory), with the
 * metadata that record carries (the same as the record's header: key, parent, depth, bytes
 * in memory, format, namespace layout). A block on its way to or from disk is not listed:
 * its write completed only if it is on disk now, and a record still being written is found
 * at the next start by walking the page from its oldest write in flight. Written from the
 * loop's tick every disk.checkpoint_interval when records changed, and at a clean stop
 * once every disk request has completed. Runs on the loop thread; memory does not grow
 * with the number of blocks (the tier streams the file).
 */
#include <errno.h>
#include <string.h>

#include "daemon/engine_disk.h"
#include "daemon/index.h"
#include "daemon/log.h"
#include "daemon/store.h"
#include "tiers/disk.h"

/* The disk tier, or NULL. */
static struct tier *engine_disk_ckpt_disk(const struct store *s)
{
    return s->disk ? s->arenas[STORE_ARENA_DISK].tier : NULL;
}

struct engine_disk_ckpt_iter {
    const struct store *s;
    uint32_t next; /* pool index to look at next */
};

/* tier_disk_ckpt_next_fn: the next block with a disk record. */
static int engine_disk_ckpt_next(void *arg, struct tier_disk_meta *m, struct tier_loc *loc)
{
    struct engine_disk_ckpt_iter *it = arg;
    const struct store *s = it->s;
    while (it->next < s->ix.nblocks) {
        const struct block *b = &s->ix.blocks[it->next++];
        /* Inclusive: a block only on disk and a clean block in memory both have a record
         * (a clean block is never quantized, so the record's format is the block's). */
        if (b->state != BLOCK_STATE_COMMITTED ||
            (b->flags & (BLOCK_F_DISK | BLOCK_F_LOST)) != BLOCK_F_DISK)
            continue;
        engine_disk_meta(s, b, m); /* what its record's header says */
        store_record_loc(s, b, loc);
        return 1;
    }
    return 0;
}

/* Logs the verdict of the latest checkpoint's fsync and rename, when there is one. */
static int engine_disk_ckpt_result(struct tier *disk, bool wait, enum log_level level)
{
    struct tier_disk_stats st;
    int rc = tier_disk_checkpoint_result(disk, wait);
    if (rc == -EINPROGRESS)
        return rc;
    if (rc) {
        log_warn("disk: checkpoint %s not written (%s); the previous one stays",
                 tier_disk_checkpoint_path(disk), strerror(-rc));
        return rc;
    }
    tier_disk_stats_get(disk, &st);
    if (st.ckpt_writes && !st.ckpt_stale)
        log_msg(level,
                "disk: checkpoint %s: %llu records, %llu KiB in %llu ms (%llu ms on the "
                "loop)",
                tier_disk_checkpoint_path(disk), (unsigned long long)st.ckpt_records,
                (unsigned long long)(st.ckpt_bytes >> 10), (unsigned long long)(st.ckpt_us / 1000),
                (unsigned long long)(st.ckpt_loop_us / 1000));
    return 0;
}

int engine_disk_checkpoint(struct store *s)
{
    struct tier *disk = engine_disk_ckpt_disk(s);
    struct engine_disk_ckpt_iter it = {.s = s};
    int rc;
    if (!disk || !tier_disk_checkpoint_path(disk))
        return -ENOENT;
    rc = tier_disk_checkpoint(disk, engine_disk_ckpt_next, &it);
    if (rc < 0)
        log_warn("disk: checkpoint %s not written (%s); the previous one stays",
                 tier_disk_checkpoint_path(disk), strerror(-rc));
    return rc;
}

void engine_disk_checkpoint_tick(struct store *s, uint64_t interval_ms, uint64_t every_bytes)
{
    struct tier *disk = engine_disk_ckpt_disk(s);
    if (!disk || !interval_ms)
        return;
    /* The previous one's fsync and rename ran on a helper thread: its verdict first. */
    engine_disk_ckpt_result(disk, false, LOG_LEVEL_DEBUG);
    if (tier_disk_checkpoint_due(disk, interval_ms, every_bytes))
        engine_disk_checkpoint(s);
}

int engine_disk_checkpoint_stop(struct store *s)
{
    struct tier *disk = engine_disk_ckpt_disk(s);
    int rc;
    if (!disk || !tier_disk_checkpoint_path(disk))
        return -ENOENT;
    /* Every write completes first, so each record it lists is on the device and no page
     * is left to walk at the next start but the open one's tail. */
    tier_disk_drain(disk);
    rc = engine_disk_checkpoint(s);
    if (rc >= 0)
        rc = engine_disk_ckpt_result(disk, true, LOG_LEVEL_INFO);
    return rc;
}

void engine_disk_checkpoint_started(const struct store *s)
{
    struct tier *disk = engine_disk_ckpt_disk(s);
    struct tier_disk_stats st;
    if (!disk)
        return;
    tier_disk_stats_get(disk, &st);
    if (st.ckpt_loaded)
        log_info("disk: index loaded in %llu ms: %llu records from the checkpoint %s, %llu "
                 "walked since, %llu header reads",
                 (unsigned long long)(st.start_us / 1000), (unsigned long long)st.records_ckpt,
                 tier_disk_checkpoint_path(disk), (unsigned long long)st.records_walked,
                 (unsigned long long)st.start_reads);
    else
        log_info("disk: index loaded in %llu ms without a checkpoint: %llu records walked, %llu "
                 "header reads (%llu MiB read)",
                 (unsigned long long)(st.start_us / 1000), (unsigned long long)st.records_walked,
                 (unsigned long long)st.start_reads, (unsigned long long)(st.start_bytes >> 20));
}

void engine_disk_checkpoint_stats(const struct store *s,
                                  void (*put)(void *arg, const char *name, uint64_t v), void *arg)
{
    struct tier *disk = engine_disk_ckpt_disk(s);
    struct tier_disk_stats st;
    if (!disk)
        return;
    tier_disk_stats_get(disk, &st);
    put(arg, "disk_checkpoint_writes", st.ckpt_writes);
    put(arg, "disk_checkpoint_errors", st.ckpt_errors);
    put(arg, "disk_checkpoint_records", st.ckpt_records);
    put(arg, "disk_checkpoint_bytes", st.ckpt_bytes);
    put(arg, "disk_checkpoint_us", st.ckpt_us);
    put(arg, "disk_checkpoint_loop_us", st.ckpt_loop_us);
    put(arg, "disk_checkpoint_stale", st.ckpt_stale);
    put(arg, "disk_start_checkpoint", st.ckpt_loaded);
    put(arg, "disk_start_records_checkpoint", st.records_ckpt);
    put(arg, "disk_start_records_walked", st.records_walked);
    put(arg, "disk_start_header_reads", st.start_reads);
    put(arg, "disk_start_read_bytes", st.start_bytes);
    put(arg, "disk_start_us", st.start_us);
    put(arg, "disk_short_io", st.short_io);
}
