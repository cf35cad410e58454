/*
 * disk_ckpt.c — the checkpoint of the disk tier's index; see disk.h for the design.
 *
 * DESIGN
 * File: a 64-byte head (geometry, the version counter, the open page, a tag of the
 * superblock secrets), one 16-byte entry per page (version, state, fill, and from where it
 * may hold records the checkpoint does not list), then a stream of entries — a namespace
 * descriptor (168 bytes) the first time a record uses it, a record (64 bytes) naming it by
 * index — and a 40-byte tail (counts, length, XXH3-64 of everything before it seeded with
 * the secret of path 0). It is written in one pass through a 1 MiB buffer, so memory stays
 * flat whatever the record count; it is read twice: once to check all of it (nothing is
 * offered to the caller before the checksum held), once to offer the records.
 * Trust rule at start, per page, from its first header (read for every page at once through
 * io_uring) and its checkpoint entry: a header version above the checkpoint's counter means
 * the page was reused since: its checkpointed records are dropped and its chain walked in
 * full. Otherwise a page the checkpoint saw live keeps its records (each is verified again
 * when read, so a record overwritten by a later life whose first header never landed is a
 * checksum failure, never wrong bytes) and is walked from where it could have grown. A
 * page the checkpoint saw free stays free. Runs on the loop thread (at tier_disk_new and on
 * tier_disk_checkpoint).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "tiers/disk.h"
#include "tiers/disk_int.h"

#define TIER_DISK_CKPT_MAGIC 0x31504b434443564bull /* "KVCDCKP1" */
#define TIER_DISK_CKPT_VERSION 1u
#define TIER_DISK_CKPT_BUF (1u << 20)
#define TIER_DISK_CKPT_MAX_NS 65535u
/* systemd's start timeout is extended again after this many checkpoint bytes read. */
#define TIER_DISK_CKPT_PROGRESS (64ull << 20)

enum tier_disk_ckpt_tag {
    TIER_DISK_CKPT_TAG_REC = 1,
    TIER_DISK_CKPT_TAG_NS = 2,
    TIER_DISK_CKPT_TAG_END = 3,
};

struct tier_disk_ckpt_head {
    uint64_t magic;
    uint32_t version;      /* TIER_DISK_CKPT_VERSION */
    uint32_t disk_version; /* TIER_DISK_VERSION of the records it names */
    uint64_t secret_tag;   /* of the superblocks' secrets: another disk, another tag */
    uint64_t page_size;
    uint64_t pages_per_path;
    uint32_t npaths;
    uint32_t next_version; /* the version counter when it was written */
    uint32_t open_page;    /* UINT32_MAX: none */
    uint32_t reserved;
    uint64_t written_s;    /* CLOCK_REALTIME seconds, for the log */
};

struct tier_disk_ckpt_page {
    uint32_t version;
    uint32_t state; /* enum tier_disk_page_state */
    uint32_t used;  /* fill, bytes */
    uint32_t from;  /* records may lie from here on that the list does not name (the open
                       page's fill, the oldest write in flight); UINT32_MAX: none */
};

/* Every entry starts with its tag byte. */
struct tier_disk_ckpt_rec {
    uint8_t tag;
    uint8_t codec;
    uint16_t ns; /* index into the namespaces met so far */
    uint32_t depth;
    uint64_t key[2];
    uint64_t parent[2];
    uint32_t page;
    uint32_t off;     /* of the data, from the page start */
    uint32_t loc_len; /* data bytes on the device, whole 4 KiB */
    uint32_t len;     /* the block's bytes in memory */
    uint32_t stored;  /* as the caller gave it (0: unknown) */
    uint32_t format;
};

struct tier_disk_ckpt_ns {
    uint8_t tag;
    uint8_t reserved;
    uint16_t index; /* the next index: namespaces are numbered as they come */
    uint32_t reserved2;
    uint8_t ns[TIER_DISK_NS_BYTES];
};

struct tier_disk_ckpt_tail {
    uint8_t tag;
    uint8_t reserved[7];
    uint64_t records;
    uint64_t namespaces;
    uint64_t bytes; /* of the file before csum */
    uint64_t csum;  /* XXH3-64 of the bytes before it, seeded with path 0's secret */
};

_Static_assert(sizeof(struct tier_disk_ckpt_head) == 64, "head layout");
_Static_assert(sizeof(struct tier_disk_ckpt_page) == 16, "page layout");
_Static_assert(sizeof(struct tier_disk_ckpt_rec) == 64, "record layout");
_Static_assert(sizeof(struct tier_disk_ckpt_ns) == 168, "namespace layout");
_Static_assert(sizeof(struct tier_disk_ckpt_tail) == 40, "tail layout");

static uint64_t tier_disk_ckpt_tag(const struct tier_disk *d)
{
    return XXH3_64bits_withSeed(d->secret, d->npaths * sizeof(d->secret[0]),
                                TIER_DISK_CKPT_MAGIC);
}

int tier_disk_ckpt_init(struct tier_disk *d, bool first_is_file)
{
    const char *p = d->cfg.ckpt_path;
    if (p && !*p)
        return 0;
    /* Nothing sits next to a block device that survives a reboot (/dev is a tmpfs): a
     * device's checkpoint needs a path named for it. */
    if (!p && !first_is_file)
        return 0;
    if (p)
        d->ckpt_path = strdup(p);
    else if (asprintf(&d->ckpt_path, "%s.ckpt", d->cfg.paths[0]) < 0)
        d->ckpt_path = NULL;
    return d->ckpt_path ? 0 : -ENOMEM;
}

const char *tier_disk_checkpoint_path(const struct tier *t)
{
    return tier_disk_of(t)->ckpt_path;
}

/* ---- the sync thread -------------------------------------------------------------------- */

/* The durable half of a checkpoint, off the loop: fsync of the file (the bulk of the time on
 * most devices: 150 ms for 6.5 MB here, against 33 ms to write it), rename over the previous
 * one, fsync of the directory. Owned by the thread until `done`, then by the loop. */
struct tier_disk_ckpt_sync {
    pthread_t th;
    int fd;
    char *tmp;        /* owned */
    const char *path; /* the tier's ckpt_path */
    uint64_t gen, records, bytes, t0, end_ns;
    int rc;
    bool thread; /* runs on its own thread (else it ran inline) */
    int done;    /* atomic */
};

/* fsync of the directory holding path, so the rename is on the device too. */
static int tier_disk_ckpt_dir_sync(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    int fd, rc = 0;
    if (!dir)
        return -ENOMEM;
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) < 0)
        rc = -errno;
    if (fd >= 0)
        close(fd);
    free(dir);
    return rc;
}

static void *tier_disk_ckpt_sync_main(void *arg)
{
    struct tier_disk_ckpt_sync *y = arg;
    int rc = fsync(y->fd) < 0 ? -errno : 0;
    /* Written once, read at the next start: no reason to keep it in the page cache. */
    if (rc == 0)
        posix_fadvise(y->fd, 0, 0, POSIX_FADV_DONTNEED);
    if (close(y->fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(y->tmp, y->path) < 0)
        rc = -errno;
    if (rc)
        unlink(y->tmp);
    else
        rc = tier_disk_ckpt_dir_sync(y->path);
    y->rc = rc;
    y->end_ns = tier_disk_now_ns();
    __atomic_store_n(&y->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Collects the verdict of the sync in flight: 0 or its -errno; -EINPROGRESS when it is still
 * running and wait is false; 0 when there is none. */
static int tier_disk_ckpt_reap(struct tier_disk *d, bool wait)
{
    struct tier_disk_ckpt_sync *y = d->ckpt_sync;
    int rc;
    if (!y)
        return 0;
    if (!wait && !__atomic_load_n(&y->done, __ATOMIC_ACQUIRE))
        return -EINPROGRESS;
    if (y->thread)
        pthread_join(y->th, NULL);
    rc = y->rc;
    if (rc == 0) {
        d->ckpt_gen = y->gen;
        d->st.ckpt_writes++;
        d->st.ckpt_records = y->records;
        d->st.ckpt_bytes = y->bytes;
        d->st.ckpt_us = (y->end_ns - y->t0) / 1000;
    } else {
        d->st.ckpt_errors++;
    }
    free(y->tmp);
    free(y);
    d->ckpt_sync = NULL;
    return rc;
}

void tier_disk_ckpt_fini(struct tier_disk *d)
{
    tier_disk_ckpt_reap(d, true);
}

int tier_disk_checkpoint_result(struct tier *t, bool wait)
{
    return tier_disk_ckpt_reap(tier_disk_of(t), wait);
}

bool tier_disk_checkpoint_due(const struct tier *t, uint64_t interval_ms, uint64_t every_bytes)
{
    const struct tier_disk *d = tier_disk_of(t);
    uint64_t since, gap;
    if (!d->ckpt_path || d->ckpt_sync || d->gen == d->ckpt_gen)
        return false;
    since = tier_disk_now_ns() - d->ckpt_try_ns;
    if (since >= interval_ms * 1000000ull)
        return true;
    /* Sooner than the interval, no more than once a second and for at most 1/20 of the
     * caller's time (a checkpoint lists every record on its thread): the first one of this
     * run once there are records (a crash before it would walk every page written), and one
     * every every_bytes written (what a crash leaves to walk). */
    gap = d->st.ckpt_loop_us * 20 * 1000;
    if (since < TIER_DISK_CKPT_SOON_NS || since < gap)
        return false;
    if (!d->ckpt_tried && d->st.used)
        return true;
    return every_bytes && d->st.bytes_written - d->ckpt_written >= every_bytes;
}

/* ---- writing --------------------------------------------------------------------------- */

struct tier_disk_ckpt_out {
    int fd;
    uint8_t *buf; /* TIER_DISK_CKPT_BUF bytes */
    size_t len;
    uint64_t total;
    XXH3_state_t *xs;
    int err;
};

static void tier_disk_ckpt_flush(struct tier_disk_ckpt_out *o)
{
    size_t done = 0;
    while (!o->err && done < o->len) {
        ssize_t n = write(o->fd, o->buf + done, o->len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            o->err = n < 0 ? -errno : -EIO;
        else
            done += (size_t)n;
    }
    o->len = 0;
}

/* Appends n bytes; hash: whether they count in the checksum (all but the checksum). */
static void tier_disk_ckpt_put(struct tier_disk_ckpt_out *o, const void *p, size_t n, bool hash)
{
    const uint8_t *b = p;
    if (hash)
        XXH3_64bits_update(o->xs, p, n);
    o->total += n;
    while (n) {
        size_t k = TIER_DISK_CKPT_BUF - o->len < n ? TIER_DISK_CKPT_BUF - o->len : n;
        memcpy(o->buf + o->len, b, k);
        o->len += k;
        b += k;
        n -= k;
        if (o->len == TIER_DISK_CKPT_BUF)
            tier_disk_ckpt_flush(o);
    }
}

/* Namespace descriptors met so far: open addressing over their XXH3, so a record costs one
 * hash of 160 bytes and no descriptor is written twice. */
struct tier_disk_ckpt_nstab {
    uint8_t (*desc)[TIER_DISK_NS_BYTES];
    uint32_t n, cap_desc;
    uint32_t *slot; /* index + 1; 0 empty */
    uint32_t nslots;
};

static int tier_disk_ckpt_ns_grow(struct tier_disk_ckpt_nstab *t)
{
    uint32_t ns = t->nslots ? t->nslots * 2 : 64;
    uint32_t *slot = calloc(ns, sizeof(*slot));
    if (!slot)
        return -ENOMEM;
    for (uint32_t i = 0; i < t->n; i++) {
        uint32_t h = (uint32_t)XXH3_64bits(t->desc[i], TIER_DISK_NS_BYTES) & (ns - 1);
        while (slot[h])
            h = (h + 1) & (ns - 1);
        slot[h] = i + 1;
    }
    free(t->slot);
    t->slot = slot;
    t->nslots = ns;
    return 0;
}

/* The index of descriptor ns, written to o when new. -E2BIG past 65535, -ENOMEM. */
static int tier_disk_ckpt_ns_index(struct tier_disk_ckpt_nstab *t, struct tier_disk_ckpt_out *o,
                                   const uint8_t *ns)
{
    uint32_t h;
    struct tier_disk_ckpt_ns e = {.tag = TIER_DISK_CKPT_TAG_NS};
    if ((t->n + 1) * 2 > t->nslots && tier_disk_ckpt_ns_grow(t))
        return -ENOMEM;
    h = (uint32_t)XXH3_64bits(ns, TIER_DISK_NS_BYTES) & (t->nslots - 1);
    for (; t->slot[h]; h = (h + 1) & (t->nslots - 1))
        if (memcmp(t->desc[t->slot[h] - 1], ns, TIER_DISK_NS_BYTES) == 0)
            return (int)(t->slot[h] - 1);
    if (t->n == TIER_DISK_CKPT_MAX_NS)
        return -E2BIG;
    if (t->n == t->cap_desc) {
        uint32_t nc = t->cap_desc ? t->cap_desc * 2 : 16;
        void *nd = realloc(t->desc, (size_t)nc * TIER_DISK_NS_BYTES);
        if (!nd)
            return -ENOMEM;
        t->desc = nd;
        t->cap_desc = nc;
    }
    memcpy(t->desc[t->n], ns, TIER_DISK_NS_BYTES);
    t->slot[h] = t->n + 1;
    e.index = (uint16_t)t->n;
    memcpy(e.ns, ns, sizeof(e.ns));
    tier_disk_ckpt_put(o, &e, sizeof(e), true);
    return (int)t->n++;
}

int tier_disk_checkpoint(struct tier *t, tier_disk_ckpt_next_fn next, void *arg)
{
    struct tier_disk *d = tier_disk_of(t);
    struct tier_disk_ckpt_out o = {.fd = -1};
    struct tier_disk_ckpt_nstab nt = {0};
    struct tier_disk_ckpt_head head;
    struct tier_disk_ckpt_tail tail = {.tag = TIER_DISK_CKPT_TAG_END};
    uint32_t *from = NULL;
    char *tmp = NULL;
    uint64_t t0 = tier_disk_now_ns(), records = 0, gen = d->gen;
    struct tier_disk_ckpt_sync *y = NULL;
    int rc;
    if (!d->ckpt_path)
        return -ENOENT;
    /* One at a time: the previous one is on the device and named before this one starts. */
    tier_disk_ckpt_reap(d, true);
    d->ckpt_try_ns = t0;
    d->ckpt_tried = true;
    d->ckpt_written = d->st.bytes_written;
    rc = -ENOMEM;
    if (asprintf(&tmp, "%s.tmp", d->ckpt_path) < 0) {
        tmp = NULL;
        goto out;
    }
    o.buf = malloc(TIER_DISK_CKPT_BUF);
    o.xs = XXH3_createState();
    from = malloc(d->npages * sizeof(*from));
    if (!o.buf || !o.xs || !from)
        goto out;
    XXH3_64bits_reset_withSeed(o.xs, d->secret[0]);
    /* A fresh file (O_EXCL, no link followed): a link or a hard link planted under the
     * temporary name is replaced, never written through. */
    if (unlink(tmp) < 0 && errno != ENOENT) {
        rc = -errno;
        goto out;
    }
    o.fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (o.fd < 0) {
        rc = -errno;
        goto out;
    }
    head = (struct tier_disk_ckpt_head){.magic = TIER_DISK_CKPT_MAGIC,
                                        .version = TIER_DISK_CKPT_VERSION,
                                        .disk_version = TIER_DISK_VERSION,
                                        .secret_tag = tier_disk_ckpt_tag(d),
                                        .page_size = d->cfg.page_size,
                                        .pages_per_path = d->pages_per_path,
                                        .npaths = d->npaths,
                                        .next_version = d->next_version,
                                        .open_page = d->open_page,
                                        .written_s = (uint64_t)time(NULL)};
    tier_disk_ckpt_put(&o, &head, sizeof(head), true);
    tier_disk_pages_pending(d, from);
    for (uint32_t p = 0; p < d->npages; p++) {
        const struct tier_disk_page *pg = &d->pages[p];
        struct tier_disk_ckpt_page e = {.from = UINT32_MAX};
        if (pg->state != TIER_DISK_PAGE_FREE)
            e = (struct tier_disk_ckpt_page){.version = pg->version,
                                             .state = pg->state,
                                             .used = (uint32_t)pg->used,
                                             .from = from[p]};
        tier_disk_ckpt_put(&o, &e, sizeof(e), true);
    }
    for (;;) {
        struct tier_disk_meta m;
        struct tier_loc loc;
        struct tier_disk_ckpt_rec r;
        uint32_t p;
        int ns;
        memset(&m, 0, sizeof(m));
        memset(&loc, 0, sizeof(loc));
        rc = next(arg, &m, &loc);
        if (rc < 0)
            goto out;
        if (rc == 0)
            break;
        /* Only what the tier itself would hand out: a live page under its version. */
        p = tier_disk_loc_page(d, &loc);
        if (p == UINT32_MAX || m.len == 0 || m.len > UINT32_MAX || m.stored > UINT32_MAX ||
            m.codec > UINT8_MAX)
            continue;
        ns = tier_disk_ckpt_ns_index(&nt, &o, m.ns);
        if (ns < 0) {
            rc = ns;
            goto out;
        }
        r = (struct tier_disk_ckpt_rec){.tag = TIER_DISK_CKPT_TAG_REC,
                                        .codec = (uint8_t)m.codec,
                                        .ns = (uint16_t)ns,
                                        .depth = m.depth,
                                        .key = {m.key[0], m.key[1]},
                                        .parent = {m.parent[0], m.parent[1]},
                                        .page = p,
                                        .off = (uint32_t)(loc.off - tier_disk_page_base(d, p)),
                                        .loc_len = (uint32_t)loc.len,
                                        .len = (uint32_t)m.len,
                                        .stored = (uint32_t)m.stored,
                                        .format = m.format};
        tier_disk_ckpt_put(&o, &r, sizeof(r), true);
        records++;
    }
    tail.records = records;
    tail.namespaces = nt.n;
    tail.bytes = o.total + offsetof(struct tier_disk_ckpt_tail, csum);
    tier_disk_ckpt_put(&o, &tail, offsetof(struct tier_disk_ckpt_tail, csum), true);
    tail.csum = XXH3_64bits_digest(o.xs);
    tier_disk_ckpt_put(&o, &tail.csum, sizeof(tail.csum), false);
    tier_disk_ckpt_flush(&o);
    rc = o.err;
    if (rc)
        goto out;
    y = calloc(1, sizeof(*y));
    if (!y) {
        rc = -ENOMEM;
        goto out;
    }
    *y = (struct tier_disk_ckpt_sync){.fd = o.fd, .tmp = tmp, .path = d->ckpt_path,
                                      .gen = gen, .records = records, .bytes = o.total,
                                      .t0 = t0};
    o.fd = -1;
    tmp = NULL;
    d->ckpt_sync = y;
    d->st.ckpt_loop_us = (tier_disk_now_ns() - t0) / 1000;
    y->thread = pthread_create(&y->th, NULL, tier_disk_ckpt_sync_main, y) == 0;
    if (!y->thread) {
        /* No thread: the loop waits for the device this once. */
        tier_disk_ckpt_sync_main(y);
        rc = tier_disk_ckpt_reap(d, true);
        if (rc)
            goto out;
    }
    rc = (int)(records > INT32_MAX ? INT32_MAX : records);
out:
    if (rc < 0 && !y) { /* a sync's failure is counted when reaped */
        d->st.ckpt_errors++;
        if (o.fd >= 0)
            close(o.fd);
        if (tmp)
            unlink(tmp);
    }
    XXH3_freeState(o.xs);
    free(o.buf);
    free(from);
    free(nt.desc);
    free(nt.slot);
    free(tmp);
    return rc;
}

/* ---- reading --------------------------------------------------------------------------- */

struct tier_disk_ckpt_in {
    struct tier_disk *d;
    int fd;
    uint8_t *buf; /* TIER_DISK_CKPT_BUF bytes */
    size_t len, pos;
    uint64_t total, size, next_progress;
    XXH3_state_t *xs;
    bool hashing;     /* the first pass */
    uint32_t pass;    /* 0 or 1, for the progress figure */
};

/* Takes n bytes; -EBADMSG at the end of the file, -errno of read. */
static int tier_disk_ckpt_get(struct tier_disk_ckpt_in *in, void *dst, size_t n, bool hash)
{
    uint8_t *b = dst;
    while (n) {
        size_t k;
        if (in->pos == in->len) {
            ssize_t r = read(in->fd, in->buf, TIER_DISK_CKPT_BUF);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0)
                return -errno;
            if (r == 0)
                return -EBADMSG;
            in->len = (size_t)r;
            in->pos = 0;
            if (in->total >= in->next_progress && in->d->cfg.progress && in->size) {
                /* Pages done, as a share of this pass over the file (half the load each). */
                uint64_t done = (uint64_t)((double)in->d->npages *
                                           ((double)in->total / (double)in->size + in->pass) / 2);
                in->d->cfg.progress(in->d->cfg.progress_arg, done, in->d->npages);
                in->next_progress = in->total + TIER_DISK_CKPT_PROGRESS;
            }
        }
        k = in->len - in->pos < n ? in->len - in->pos : n;
        memcpy(b, in->buf + in->pos, k);
        if (hash && in->hashing)
            XXH3_64bits_update(in->xs, b, k);
        in->pos += k;
        in->total += k;
        b += k;
        n -= k;
    }
    return 0;
}

/* What the load knows about the checkpoint and each page. */
struct tier_disk_ckpt_load {
    struct tier_disk_ckpt_head head;
    struct tier_disk_ckpt_page *pages;     /* npages */
    uint8_t (*ns)[TIER_DISK_NS_BYTES];     /* the namespace table (second pass) */
    uint32_t nns;
    uint32_t *first;                       /* per page: its first header's version, 0 none */
    uint8_t *keep;                         /* per page: its checkpointed records hold */
    uint64_t *skip;                        /* data offsets offered from the checkpoint on
                                              pages walked from `from` */
    size_t nskip, cap_skip;
    uint64_t records, namespaces;
};

static bool tier_disk_ckpt_rec_ok(const struct tier_disk *d, const struct tier_disk_ckpt_load *l,
                                  const struct tier_disk_ckpt_rec *r, uint32_t nns)
{
    return r->ns < nns && r->page < d->npages &&
           l->pages[r->page].state != TIER_DISK_PAGE_FREE && r->off >= TIER_DISK_HDR &&
           r->off % TIER_DISK_ALIGN == 0 && r->loc_len && r->loc_len % TIER_DISK_ALIGN == 0 &&
           (uint64_t)r->off + r->loc_len <= d->cfg.page_size && r->len != 0;
}

/* One pass over the entries after the page table. check: the first pass, which hashes and
 * checks everything and offers nothing; else the second, which offers the records of pages
 * kept. 0, or -EBADMSG with *why. */
static int tier_disk_ckpt_entries(struct tier_disk *d, struct tier_disk_ckpt_in *in,
                                  struct tier_disk_ckpt_load *l, bool check, const char **why)
{
    uint64_t records = 0;
    uint32_t nns = 0;
    for (;;) {
        union {
            uint8_t tag;
            struct tier_disk_ckpt_rec rec;
            struct tier_disk_ckpt_ns ns;
            struct tier_disk_ckpt_tail tail;
        } e;
        int rc = tier_disk_ckpt_get(in, &e, 8, true);
        if (rc)
            goto short_read;
        if (e.tag == TIER_DISK_CKPT_TAG_NS) {
            if (tier_disk_ckpt_get(in, (uint8_t *)&e + 8, sizeof(e.ns) - 8, true))
                goto short_read;
            if (e.ns.index != nns || nns == TIER_DISK_CKPT_MAX_NS)
                goto malformed;
            if (!check)
                memcpy(l->ns[nns], e.ns.ns, TIER_DISK_NS_BYTES);
            nns++;
        } else if (e.tag == TIER_DISK_CKPT_TAG_REC) {
            const struct tier_disk_ckpt_rec *r = &e.rec;
            if (tier_disk_ckpt_get(in, (uint8_t *)&e + 8, sizeof(e.rec) - 8, true))
                goto short_read;
            if (!tier_disk_ckpt_rec_ok(d, l, r, nns))
                goto malformed;
            records++;
            if (!check && l->keep[r->page]) {
                const struct tier_disk_ckpt_page *cp = &l->pages[r->page];
                struct tier_disk_meta m = {.key = {r->key[0], r->key[1]},
                                           .parent = {r->parent[0], r->parent[1]},
                                           .depth = r->depth,
                                           .codec = r->codec,
                                           .len = r->len,
                                           .stored = r->stored,
                                           .format = r->format};
                struct tier_loc loc = {.arena = tier_disk_page_path(d, r->page),
                                       .cls = cp->version,
                                       .off = tier_disk_page_base(d, r->page) + r->off,
                                       .len = r->loc_len};
                memcpy(m.ns, l->ns[r->ns], sizeof(m.ns));
                /* The walk from `from` must not offer it a second time. */
                if (cp->from != UINT32_MAX && r->off - TIER_DISK_HDR >= cp->from) {
                    if (l->nskip == l->cap_skip) {
                        size_t nc = l->cap_skip ? l->cap_skip * 2 : 256;
                        uint64_t *ns = realloc(l->skip, nc * sizeof(*ns));
                        if (!ns)
                            return -ENOMEM;
                        l->skip = ns;
                        l->cap_skip = nc;
                    }
                    l->skip[l->nskip++] = loc.off;
                }
                if (tier_disk_found(d, r->page, cp->version, &m, &loc))
                    d->st.records_ckpt++;
            }
        } else if (e.tag == TIER_DISK_CKPT_TAG_END) {
            uint64_t csum;
            if (tier_disk_ckpt_get(in, (uint8_t *)&e + 8,
                                   offsetof(struct tier_disk_ckpt_tail, csum) - 8, true) ||
                tier_disk_ckpt_get(in, &csum, sizeof(csum), false))
                goto short_read;
            if (e.tail.records != records || e.tail.namespaces != nns ||
                e.tail.bytes != in->total - sizeof(csum) || in->total != in->size)
                goto malformed;
            if (check && csum != XXH3_64bits_digest(in->xs)) {
                *why = "bad checksum";
                return -EBADMSG;
            }
            l->records = records;
            l->namespaces = nns;
            return 0;
        } else {
            goto malformed;
        }
    }
short_read:
    *why = "truncated";
    return -EBADMSG;
malformed:
    *why = check ? "malformed" : "changed while read";
    return -EBADMSG;
}

/* Reads the head and page table and checks them against this tier. */
static int tier_disk_ckpt_head_read(struct tier_disk *d, struct tier_disk_ckpt_in *in,
                                    struct tier_disk_ckpt_load *l, const char **why)
{
    struct tier_disk_ckpt_head *h = &l->head;
    if (tier_disk_ckpt_get(in, h, sizeof(*h), true)) {
        *why = "truncated";
        return -EBADMSG;
    }
    if (h->magic != TIER_DISK_CKPT_MAGIC || h->version != TIER_DISK_CKPT_VERSION ||
        h->disk_version != TIER_DISK_VERSION) {
        *why = "not a checkpoint of this format";
        return -EBADMSG;
    }
    if (h->secret_tag != tier_disk_ckpt_tag(d)) {
        *why = "written for another disk tier (superblock secret)";
        return -EBADMSG;
    }
    if (h->page_size != d->cfg.page_size || h->pages_per_path != d->pages_per_path ||
        h->npaths != d->npaths) {
        *why = "written for another geometry (paths, capacity or page size)";
        return -EBADMSG;
    }
    if (h->open_page != UINT32_MAX && h->open_page >= d->npages) {
        *why = "malformed";
        return -EBADMSG;
    }
    for (uint32_t p = 0; p < d->npages; p++) {
        struct tier_disk_ckpt_page *cp = &l->pages[p];
        if (tier_disk_ckpt_get(in, cp, sizeof(*cp), true)) {
            *why = "truncated";
            return -EBADMSG;
        }
        if (cp->state > TIER_DISK_PAGE_FULL || cp->version > h->next_version ||
            cp->used > d->cfg.page_size ||
            (cp->from != UINT32_MAX && cp->from > d->cfg.page_size) ||
            (cp->state != TIER_DISK_PAGE_FREE && cp->version == 0)) {
            *why = "malformed";
            return -EBADMSG;
        }
    }
    return 0;
}

/* The first header of every page, read at once through io_uring (a batch at a time, as deep
 * as the ring): first[p] is its version, or 0 where there is no intact header. These reads
 * carry small integers, not ops, as their data: each batch is reaped here before the next,
 * and nothing else uses the ring yet. */
static int tier_disk_ckpt_heads(struct tier_disk *d, uint32_t *first)
{
    uint32_t batch = d->ring.sq.ring_entries < 256 ? d->ring.sq.ring_entries : 256;
    struct io_uring_sqe *sqes[256];
    uint8_t *buf = tier_disk_aligned((uint64_t)batch * TIER_DISK_HDR);
    uint64_t next_progress = 0;
    int rc = 0;
    if (!buf)
        return -ENOMEM;
    for (uint64_t p0 = 0; p0 < d->npages && rc == 0; p0 += batch) {
        uint32_t n = d->npages - p0 < batch ? (uint32_t)(d->npages - p0) : batch;
        uint32_t prepared = 0, submitted = 0, got = 0;
        if (d->cfg.progress && p0 >= next_progress) {
            d->cfg.progress(d->cfg.progress_arg, p0, d->npages);
            next_progress = p0 + 4096;
        }
        for (; prepared < n; prepared++) {
            uint32_t p = (uint32_t)(p0 + prepared);
            struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
            if (!sqe)
                break; /* the ring is empty and n fits it: not seen */
            io_uring_prep_read(sqe, d->fds[tier_disk_page_path(d, p)],
                               buf + (uint64_t)prepared * TIER_DISK_HDR, TIER_DISK_HDR,
                               tier_disk_path_off(d, tier_disk_page_base(d, p)));
            io_uring_sqe_set_data64(sqe, prepared);
            sqes[prepared] = sqe;
        }
        while (submitted < prepared) {
            int k = io_uring_submit(&d->ring);
            if (k == -EINTR || k == -EAGAIN)
                continue;
            if (k <= 0) {
                /* The kernel took none of the rest: they become no-ops without data, which
                 * tier_disk_poll skips whenever they are submitted. */
                for (uint32_t i = submitted; i < prepared; i++) {
                    io_uring_prep_nop(sqes[i]);
                    io_uring_sqe_set_data(sqes[i], NULL);
                }
                rc = k < 0 ? k : -EIO;
                break;
            }
            submitted += (uint32_t)k;
        }
        while (got < submitted) {
            struct io_uring_cqe *cqe;
            const struct tier_disk_hdr *h;
            uint32_t k, p;
            int w = io_uring_wait_cqe(&d->ring, &cqe);
            if (w == -EINTR || w == -EAGAIN)
                continue;
            if (w < 0)
                return w; /* reads may still land in buf: it is not freed (never seen) */
            k = (uint32_t)io_uring_cqe_get_data64(cqe);
            p = (uint32_t)(p0 + k);
            h = (const struct tier_disk_hdr *)(buf + (uint64_t)k * TIER_DISK_HDR);
            first[p] = cqe->res == (int)TIER_DISK_HDR &&
                               tier_disk_hdr_ok(d, tier_disk_page_path(d, p), h, 0)
                           ? h->page_version
                           : 0;
            io_uring_cqe_seen(&d->ring, cqe);
            got++;
        }
        d->st.start_reads += submitted;
        if (rc == 0 && prepared < n)
            rc = -EAGAIN;
    }
    free(buf);
    return rc;
}

static void tier_disk_ckpt_load_free(struct tier_disk_ckpt_load *l)
{
    free(l->pages);
    free(l->ns);
    free(l->first);
    free(l->keep);
    free(l->skip);
}

static int tier_disk_skip_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Second half of the load, once the checkpoint checked out: offers its records, walks what
 * changed since, and settles every page. Cannot fail any more: a read error while offering
 * costs the records not offered yet (logged), never a wrong one. */
static void tier_disk_ckpt_apply(struct tier_disk *d, struct tier_disk_ckpt_in *in,
                                 struct tier_disk_ckpt_load *l)
{
    uint32_t maxv = l->head.next_version, *at = NULL;
    struct tier_disk_walk *w = NULL;
    const char *why = NULL;
    size_t nw = 0;
    int rc;
    for (uint32_t p = 0; p < d->npages; p++) {
        /* A first header newer than the checkpoint's counter: the page was reused since,
         * and whatever the checkpoint says about it is stale. */
        l->keep[p] = l->first[p] <= l->head.next_version &&
                     l->pages[p].state != TIER_DISK_PAGE_FREE;
        if (l->first[p] > maxv)
            maxv = l->first[p];
    }
    in->hashing = false;
    in->pass = 1;
    in->next_progress = 0;
    rc = lseek(in->fd, (off_t)(sizeof(l->head) + d->npages * sizeof(*l->pages)), SEEK_SET) < 0
             ? -errno
             : 0;
    in->pos = in->len = 0;
    in->total = sizeof(l->head) + d->npages * sizeof(*l->pages);
    if (rc == 0)
        rc = tier_disk_ckpt_entries(d, in, l, false, &why);
    if (rc)
        fprintf(stderr, "kvcd: disk: checkpoint %s: read failed half way (%s); the records "
                        "not taken yet are lost\n",
                d->ckpt_path, why ? why : strerror(-rc));
    if (l->nskip)
        qsort(l->skip, l->nskip, sizeof(*l->skip), tier_disk_skip_cmp);
    /* The pages to walk: reused since (in full), or live and possibly grown since (from
     * `from`). All at once, through the ring. */
    w = calloc(d->npages, sizeof(*w));
    at = calloc(d->npages, sizeof(*at));
    if (w && at) {
        for (uint32_t p = 0; p < d->npages; p++) {
            const struct tier_disk_ckpt_page *cp = &l->pages[p];
            at[p] = UINT32_MAX;
            if (l->first[p] > l->head.next_version)
                w[nw] = (struct tier_disk_walk){.page = p};
            else if (l->keep[p] && cp->from != UINT32_MAX)
                w[nw] = (struct tier_disk_walk){.page = p, .ver = cp->version, .at = cp->from};
            else
                continue;
            at[p] = (uint32_t)nw++;
        }
        rc = tier_disk_walk(d, w, nw, l->skip, l->nskip);
    } else {
        rc = -ENOMEM;
    }
    if (rc)
        fprintf(stderr,
                "kvcd: disk: checkpoint %s: the walk of the pages written since failed "
                "(%s); records written after it may be lost\n",
                d->ckpt_path, strerror(-rc));
    for (uint32_t p = 0; p < d->npages; p++) {
        struct tier_disk_page *pg = &d->pages[p];
        const struct tier_disk_ckpt_page *cp = &l->pages[p];
        const struct tier_disk_walk *wp = rc == 0 && at[p] != UINT32_MAX ? &w[at[p]] : NULL;
        uint32_t ver = 0;
        uint64_t end = 0;
        if (l->first[p] > l->head.next_version) {
            ver = wp ? wp->ver : 0;
            end = wp ? wp->at : 0;
        } else if (l->keep[p]) {
            ver = cp->version;
            end = cp->used;
            if (wp && wp->at > end)
                end = wp->at;
        }
        if (ver > maxv)
            maxv = ver;
        if (pg->live) {
            pg->state = TIER_DISK_PAGE_FULL;
            pg->version = ver;
            if (pg->used < end)
                pg->used = end;
        } else {
            pg->state = TIER_DISK_PAGE_FREE;
            pg->version = 0;
            pg->used = 0;
            d->st.pages_free++;
        }
    }
    free(w);
    free(at);
    d->next_version = maxv;
}

int tier_disk_ckpt_load(struct tier_disk *d)
{
    struct tier_disk_ckpt_load l = {0};
    struct tier_disk_ckpt_in in = {.d = d, .fd = -1};
    const char *why = NULL;
    struct stat st;
    int rc = -ENOENT;
    if (!d->ckpt_path || !d->cfg.scan)
        return -ENOENT;
    in.fd = open(d->ckpt_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in.fd < 0) {
        rc = -errno;
        if (rc != -ENOENT)
            why = strerror(-rc);
        goto out;
    }
    rc = -ENOMEM;
    in.buf = malloc(TIER_DISK_CKPT_BUF);
    in.xs = XXH3_createState();
    l.pages = malloc(d->npages * sizeof(*l.pages));
    l.first = calloc(d->npages, sizeof(*l.first));
    l.keep = calloc(d->npages, 1);
    if (!in.buf || !in.xs || !l.pages || !l.first || !l.keep) {
        why = "out of memory";
        goto out;
    }
    if (fstat(in.fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        rc = -EINVAL;
        why = "not a regular file";
        goto out;
    }
    in.size = (uint64_t)st.st_size;
    XXH3_64bits_reset_withSeed(in.xs, d->secret[0]);
    in.hashing = true;
    /* First pass: all of it checks out before anything is offered. */
    rc = tier_disk_ckpt_head_read(d, &in, &l, &why);
    if (rc == 0)
        rc = tier_disk_ckpt_entries(d, &in, &l, true, &why);
    if (rc)
        goto out;
    l.ns = malloc(((size_t)l.namespaces + 1) * TIER_DISK_NS_BYTES);
    if (!l.ns) {
        rc = -ENOMEM;
        why = "out of memory";
        goto out;
    }
    rc = tier_disk_ckpt_heads(d, l.first);
    if (rc) {
        why = "reading the pages' first headers failed";
        goto out;
    }
    tier_disk_ckpt_apply(d, &in, &l);
out:
    if (why)
        fprintf(stderr, "kvcd: disk: checkpoint %s ignored (%s); walking every page\n",
                d->ckpt_path, why);
    if (in.fd >= 0)
        close(in.fd);
    XXH3_freeState(in.xs);
    free(in.buf);
    tier_disk_ckpt_load_free(&l);
    return rc;
}
