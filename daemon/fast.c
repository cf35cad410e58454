/*
 * fast.c — the shared index of a host arena and the hit rings (daemon/fast.h).
 */
#include "daemon/fast.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/kvc_huge.h"

/* Everything the daemon decides about an index is kept here, privately: the shared header
 * is written once for the clients (and its two running fields, stash_used and retired, are
 * only ever written) and never read back. The entries and generations are read back (to find
 * a key, to publish a slot's generation), but only the daemon can have written them: the
 * memfd is sealed against every writable mapping but this one. */
struct fast_index {
    int fd;
    uint8_t *map;
    uint64_t bytes;
    uint64_t arena_bytes;
    uint64_t units;     /* 4 KiB units of the arena */
    uint32_t gen_units; /* units a generation covers (kvc_fast_hdr.gen_units) */
    uint64_t capacity;
    struct kvc_fast_hdr *hdr;
    struct kvc_fast_ent *ents;  /* nbuckets * KVC_FAST_WAYS, then the stash */
    struct kvc_fast_ent *stash; /* KVC_FAST_STASH */
    uint32_t *gens;
    uint64_t *nslay;
    uint32_t nns;
    uint32_t nbuckets;
    uint64_t seed;
    uint32_t stash_used; /* entries in the stash (the header's copy is for the readers) */
    uint64_t published, full, moves;
};

/* A connection's ring. The client owns head and the entries and may write anything there;
 * tail and the allowance are ours. */
struct fast_ring {
    int fd;
    struct kvc_fast_ring *r;
    struct kvc_fast_hit *ents;
    uint64_t bytes;
    uint64_t tail;        /* ours: the copy in the ring is for the client to read */
    uint64_t allow_milli; /* entries the ring may still be read for, in thousandths */
    uint64_t allow_ms;    /* when allow_milli was last refilled */
};

/* A uid's bell. The words are the clients' to write; what the daemon keeps of its own is
 * which bits it gave out, to whom, and how far they reach. */
struct fast_bell {
    int fd;
    uint64_t *words; /* shared: KVC_FAST_BELL_BITS / 64 */
    uint64_t used[KVC_FAST_BELL_BITS / 64];
    void **owner;    /* [cap]: the owner of each bit given out, NULL once given back */
    uint32_t cap;    /* entries of owner */
    uint32_t nwords; /* words up to the highest bit given out: the only ones read */
};

static uint64_t fast_round64(uint64_t x)
{
    return (x + 63) & ~(uint64_t)63;
}

/* A memfd of `bytes`, its owner's alone (mode 0600: no other user can open it again through
 * /proc, as the arenas are), sealed against resizing and mapped read-write into *map. With
 * `ro`, also sealed against any later writable mapping or write (F_SEAL_FUTURE_WRITE): the
 * mapping made here stays the only writable one, whoever gets a descriptor, root included.
 * The fd, or -errno. */
static int fast_memfd(const char *name, uint64_t bytes, bool ro, void **map)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    int rc = 0;
    *map = MAP_FAILED;
    if (fd < 0)
        return -errno;
    if (fchmod(fd, 0600) < 0 || ftruncate(fd, (off_t)bytes) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
        rc = -errno;
        goto out;
    }
    *map = kvc_huge_map(fd, bytes, PROT_READ | PROT_WRITE, 0); /* at 2 MiB: kvc_huge.h */
    if (*map == MAP_FAILED) {
        rc = -errno;
        goto out;
    }
    if (fcntl(fd, F_ADD_SEALS, (ro ? F_SEAL_FUTURE_WRITE : 0) | F_SEAL_SEAL) < 0)
        rc = -errno;
out:
    if (rc < 0) {
        if (*map != MAP_FAILED)
            munmap(*map, bytes);
        close(fd);
        return rc;
    }
    return fd;
}

struct fast_index *fast_index_new(uint32_t arena_id, uint64_t arena_bytes, uint32_t nns,
                                  uint64_t capacity, uint32_t gen_units, bool collapse, int *err)
{
    struct fast_index *fi = calloc(1, sizeof(*fi));
    uint64_t units = (arena_bytes + (1u << KVC_FAST_UNIT_SHIFT) - 1) >> KVC_FAST_UNIT_SHIFT;
    void *map;
    char name[32];
    if (!fi) {
        *err = -ENOMEM;
        return NULL;
    }
    if (gen_units == 0) {
        free(fi);
        *err = -EINVAL;
        return NULL;
    }
    /* Every block there can be: no more than one per unit. */
    if (capacity > units)
        capacity = units;
    uint64_t nb = (uint64_t)((double)capacity / FAST_INDEX_LOAD / KVC_FAST_WAYS) + 2;
    if (nb > UINT32_MAX) {
        free(fi);
        *err = -EFBIG;
        return NULL;
    }
    uint64_t ns_off = fast_round64(sizeof(struct kvc_fast_hdr));
    uint64_t ents_off = fast_round64(ns_off + (uint64_t)nns * sizeof(uint64_t));
    uint64_t nents = nb * KVC_FAST_WAYS + KVC_FAST_STASH;
    uint64_t gens_off = fast_round64(ents_off + nents * sizeof(struct kvc_fast_ent));
    uint64_t ngens = kvc_fast_ngens(arena_bytes, gen_units);
    uint64_t bytes = (gens_off + ngens * sizeof(uint32_t) + 4095) & ~(uint64_t)4095;
    snprintf(name, sizeof(name), "kvcd-index-%u", arena_id);
    fi->fd = fast_memfd(name, bytes, true, &map);
    if (fi->fd < 0) {
        *err = fi->fd;
        free(fi);
        return NULL;
    }
    /* Before anything touches it: the pages the daemon faults in, and its readers' mappings of
     * them, are then huge where the host allows it for shared memory (kvc_fast_map says why). */
    (void)madvise(map, bytes, MADV_HUGEPAGE);
    /* Where the host's setting gives shared memory none: each whole 2 MiB made one huge page
     * now (the index is still zeros), until the kernel refuses one. */
    for (uint64_t o = 0; collapse && o + KVC_HUGE_BYTES <= bytes; o += KVC_HUGE_BYTES)
        collapse = kvc_huge_collapse((uint8_t *)map + o) == 0;
    if (getrandom(&fi->seed, sizeof(fi->seed), 0) != sizeof(fi->seed))
        fi->seed = (uint64_t)(uintptr_t)fi ^ 0x9e3779b97f4a7c15ull;
    fi->map = map;
    fi->bytes = bytes;
    fi->arena_bytes = arena_bytes;
    fi->units = arena_bytes >> KVC_FAST_UNIT_SHIFT;
    fi->gen_units = gen_units;
    fi->capacity = capacity;
    fi->nns = nns;
    fi->nbuckets = (uint32_t)nb;
    fi->hdr = map;
    fi->nslay = (uint64_t *)(fi->map + ns_off);
    fi->ents = (struct kvc_fast_ent *)(fi->map + ents_off);
    fi->stash = fi->ents + nb * KVC_FAST_WAYS;
    fi->gens = (uint32_t *)(fi->map + gens_off);
    *fi->hdr = (struct kvc_fast_hdr){.version = KVC_FAST_VERSION,
                                     .arena_id = arena_id,
                                     .seed = fi->seed,
                                     .arena_bytes = arena_bytes,
                                     .ents_off = ents_off,
                                     .gens_off = gens_off,
                                     .total = bytes,
                                     .ns_off = ns_off,
                                     .nns = nns,
                                     .nbuckets = (uint32_t)nb,
                                     .ways = KVC_FAST_WAYS,
                                     .nstash = KVC_FAST_STASH,
                                     .gen_units = gen_units};
    __atomic_store_n(&fi->hdr->magic, KVC_FAST_MAGIC, __ATOMIC_RELEASE);
    return fi;
}

void fast_index_free(struct fast_index *fi)
{
    if (!fi)
        return;
    munmap(fi->map, fi->bytes);
    close(fi->fd);
    free(fi);
}

uint64_t fast_index_capacity(const struct fast_index *fi)
{
    return fi->capacity;
}

void fast_index_faulted_set(struct fast_index *fi, uint64_t bytes)
{
    if (fi)
        __atomic_store_n(&fi->hdr->faulted, bytes, __ATOMIC_RELEASE);
}

void fast_index_retire(struct fast_index *fi)
{
    /* Before any slot it names is freed without its generation moving (the host tier bumps
     * the newer index's from now on): the readers' check after their copy sees it. */
    __atomic_store_n(&fi->hdr->retired, 1, __ATOMIC_SEQ_CST);
}

uint32_t *fast_index_gens(struct fast_index *fi)
{
    return fi->gens;
}

uint32_t fast_index_gen_units(const struct fast_index *fi)
{
    return fi->gen_units;
}

int fast_index_fd_ro(const struct fast_index *fi)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fi->fd);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

uint64_t fast_index_bytes(const struct fast_index *fi)
{
    return fi->bytes;
}

void fast_index_stats_get(const struct fast_index *fi, struct fast_index_stats *st)
{
    st->published = fi->published;
    st->full = fi->full;
    st->stash = fi->stash_used;
    st->moves = fi->moves;
}

bool fast_index_lost_any(const struct fast_index *fi)
{
    return fi->full != 0;
}

static bool fast_ent_is(const struct kvc_fast_ent *e, uint16_t ns, const struct kvc_wire_key *k)
{
    return e->klo == k->lo && e->khi == k->hi && e->ns == ns && (k->lo | k->hi);
}

static bool fast_ent_empty(const struct kvc_fast_ent *e)
{
    return (e->klo | e->khi) == 0;
}

static struct kvc_fast_ent *fast_bucket(struct fast_index *fi, uint32_t b)
{
    return fi->ents + (uint64_t)b * KVC_FAST_WAYS;
}

/* The entry of (ns, k) in its two buckets or the stash, or NULL. */
static struct kvc_fast_ent *fast_find(struct fast_index *fi, uint16_t ns,
                                      const struct kvc_wire_key *k, uint32_t *b1, uint32_t *b2)
{
    kvc_fast_buckets(fi->seed, fi->nbuckets, ns, k->lo, k->hi, b1, b2);
    struct kvc_fast_ent *e1 = fast_bucket(fi, *b1), *e2 = fast_bucket(fi, *b2);
    for (uint32_t w = 0; w < KVC_FAST_WAYS; w++) {
        if (fast_ent_is(&e1[w], ns, k))
            return &e1[w];
        if (fast_ent_is(&e2[w], ns, k))
            return &e2[w];
    }
    for (uint32_t i = 0; fi->stash_used && i < KVC_FAST_STASH; i++)
        if (fast_ent_is(&fi->stash[i], ns, k))
            return &fi->stash[i];
    return NULL;
}

/* The writer's half of the entry's sequence lock: odd while it changes. The daemon is the
 * only writer; the fields are stored atomically so readers never see a torn word. */
static void fast_write_begin(struct kvc_fast_ent *e)
{
    __atomic_store_n(&e->seq, (uint16_t)(e->seq + 1), __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static void fast_write_end(struct kvc_fast_ent *e)
{
    __atomic_store_n(&e->seq, (uint16_t)(e->seq + 1), __ATOMIC_RELEASE);
}

/* Writes the fields of src into entry e (under its sequence count). */
static void fast_ent_write(struct kvc_fast_ent *e, const struct kvc_fast_ent *src)
{
    fast_write_begin(e);
    __atomic_store_n(&e->ns, src->ns, __ATOMIC_RELAXED);
    __atomic_store_n(&e->gen, src->gen, __ATOMIC_RELAXED);
    __atomic_store_n(&e->klo, src->klo, __ATOMIC_RELAXED);
    __atomic_store_n(&e->khi, src->khi, __ATOMIC_RELAXED);
    __atomic_store_n(&e->unit, src->unit, __ATOMIC_RELAXED);
    __atomic_store_n(&e->fmt, src->fmt, __ATOMIC_RELAXED);
    fast_write_end(e);
}

static void fast_ent_clear(struct kvc_fast_ent *e)
{
    fast_write_begin(e);
    __atomic_store_n(&e->klo, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->khi, 0, __ATOMIC_RELAXED);
    fast_write_end(e);
}

/* The other bucket of the entry that sits in bucket b. */
static uint32_t fast_alt(const struct fast_index *fi, const struct kvc_fast_ent *e, uint32_t b)
{
    uint32_t b1, b2;
    kvc_fast_buckets(fi->seed, fi->nbuckets, e->ns, e->klo, e->khi, &b1, &b2);
    return b == b1 ? b2 : b1;
}

static struct kvc_fast_ent *fast_free_way(struct fast_index *fi, uint32_t b)
{
    struct kvc_fast_ent *e = fast_bucket(fi, b);
    for (uint32_t w = 0; w < KVC_FAST_WAYS; w++)
        if (fast_ent_empty(&e[w]))
            return &e[w];
    return NULL;
}

/* A free way of the emptier of b1 and b2 (two choices keep buckets even, so later inserts
 * seldom need moves), or NULL when both are full. */
static struct kvc_fast_ent *fast_free_way2(struct fast_index *fi, uint32_t b1, uint32_t b2)
{
    struct kvc_fast_ent *e1 = fast_bucket(fi, b1), *e2 = fast_bucket(fi, b2), *f1 = NULL;
    uint32_t n1 = 0, n2 = 0, w;
    struct kvc_fast_ent *f2 = NULL;
    for (w = 0; w < KVC_FAST_WAYS; w++) {
        if (fast_ent_empty(&e1[w]) && n1++ == 0)
            f1 = &e1[w];
        if (fast_ent_empty(&e2[w]) && n2++ == 0)
            f2 = &e2[w];
    }
    return n2 > n1 ? f2 : f1;
}

/* Makes a way free in bucket b1 or b2 by moving entries along a path to a bucket with room,
 * found breadth first (the shortest, so the fewest moves): that way, or NULL. Each move
 * writes the entry into its other bucket before it clears the old place, so a reader misses
 * it at worst for that moment (and takes the socket). */
#define FAST_BFS_NODES 512
struct fast_bfs_node {
    uint32_t bucket;
    int32_t parent; /* node whose entry at way `way` would move into this bucket */
    uint32_t way;
    bool ready; /* alt holds the other buckets of its entries, asked for */
    uint32_t alt[KVC_FAST_WAYS];
};

/* The other buckets of node n's entries, each asked of the memory system at once: in a large
 * table each is a cache miss, and a path is found after a few of them (a publication at the
 * index's load moves an entry about nine times in ten). */
static void fast_bfs_prepare(struct fast_index *fi, struct fast_bfs_node *n)
{
    const struct kvc_fast_ent *e = fast_bucket(fi, n->bucket);
    for (uint32_t w = 0; w < KVC_FAST_WAYS; w++) {
        n->alt[w] = fast_alt(fi, &e[w], n->bucket);
        const char *a = (const char *)fast_bucket(fi, n->alt[w]);
        __builtin_prefetch(a);
        __builtin_prefetch(a + KVC_FAST_WAYS * sizeof(*e) - 1);
    }
    n->ready = true;
}

static struct kvc_fast_ent *fast_make_room(struct fast_index *fi, uint32_t b1, uint32_t b2)
{
    struct fast_bfs_node q[FAST_BFS_NODES];
    uint32_t head = 0, tail = 0;
    q[tail++] = (struct fast_bfs_node){.bucket = b1, .parent = -1};
    q[tail++] = (struct fast_bfs_node){.bucket = b2, .parent = -1};
    while (head < tail) {
        uint32_t x = head++;
        struct kvc_fast_ent *e = fast_bucket(fi, q[x].bucket);
        /* This node's buckets and the next one's on their way together. */
        if (!q[x].ready)
            fast_bfs_prepare(fi, &q[x]);
        if (x + 1 < tail && !q[x + 1].ready)
            fast_bfs_prepare(fi, &q[x + 1]);
        for (uint32_t w = 0; w < KVC_FAST_WAYS; w++) {
            uint32_t alt = q[x].alt[w];
            struct kvc_fast_ent *room = fast_free_way(fi, alt);
            if (room) {
                /* Move e[w] there, then each entry on the path into the way it left. */
                struct kvc_fast_ent *dst = room, *src = &e[w];
                int32_t node = (int32_t)x;
                for (;;) {
                    struct kvc_fast_ent copy = *src;
                    fast_ent_write(dst, &copy);
                    fast_ent_clear(src);
                    fi->moves++;
                    if (q[node].parent < 0)
                        return src;
                    dst = src;
                    src = fast_bucket(fi, q[q[node].parent].bucket) + q[node].way;
                    node = q[node].parent;
                }
            }
            if (tail < FAST_BFS_NODES)
                q[tail++] = (struct fast_bfs_node){.bucket = alt, .parent = (int32_t)x, .way = w};
        }
    }
    return NULL;
}

/* A stash entry whose bucket has room now goes back there (after a removal from bucket b). */
static void fast_stash_drain(struct fast_index *fi, uint32_t b)
{
    for (uint32_t i = 0; i < KVC_FAST_STASH && fi->stash_used; i++) {
        struct kvc_fast_ent *s = &fi->stash[i];
        uint32_t b1, b2;
        if (fast_ent_empty(s))
            continue;
        kvc_fast_buckets(fi->seed, fi->nbuckets, s->ns, s->klo, s->khi, &b1, &b2);
        if (b1 != b && b2 != b)
            continue;
        struct kvc_fast_ent *room = fast_free_way(fi, b), copy = *s;
        if (!room)
            return;
        fast_ent_write(room, &copy);
        fast_ent_clear(s);
        if (--fi->stash_used == 0)
            __atomic_store_n(&fi->hdr->stash_used, 0, __ATOMIC_RELEASE);
    }
}

void fast_prefetch(struct fast_index *fi, uint16_t ns, const struct kvc_wire_key *k, uint64_t off)
{
    uint32_t b1, b2;
    uint64_t unit = off >> KVC_FAST_UNIT_SHIFT;
    kvc_fast_buckets(fi->seed, fi->nbuckets, ns, k->lo, k->hi, &b1, &b2);
    for (uint32_t i = 0; i < 2; i++) {
        const char *a = (const char *)fast_bucket(fi, i ? b2 : b1);
        __builtin_prefetch(a, 1);
        __builtin_prefetch(a + KVC_FAST_WAYS * sizeof(struct kvc_fast_ent) - 1, 1);
    }
    if (unit < fi->units)
        __builtin_prefetch(&fi->gens[unit / fi->gen_units]);
}

void fast_publish(struct fast_index *fi, uint16_t ns, const struct kvc_wire_key *k, uint64_t off,
                  uint64_t len, uint8_t format)
{
    uint32_t b1, b2;
    struct kvc_fast_ent *e = fast_find(fi, ns, k, &b1, &b2);
    uint64_t unit = off >> KVC_FAST_UNIT_SHIFT;
    uint64_t lunits = (len + (1u << KVC_FAST_UNIT_SHIFT) - 1) >> KVC_FAST_UNIT_SHIFT;
    if (unit >= fi->units || (off & 4095) || lunits >= (1u << 24) || !(k->lo | k->hi))
        return; /* not a slot of this arena: never published */
    struct kvc_fast_ent want = {
        .ns = ns,
        .gen = __atomic_load_n(&fi->gens[unit / fi->gen_units], __ATOMIC_RELAXED),
        .klo = k->lo,
        .khi = k->hi,
        .unit = (uint32_t)unit,
        .fmt = KVC_FAST_FMT(format, format == KVC_WIRE_FORMAT_RAW ? 0 : lunits)};
    if (e) {
        if (e->unit != want.unit || e->gen != want.gen || e->fmt != want.fmt)
            fast_ent_write(e, &want);
        return; /* else unchanged (a touch): readers keep their entry */
    }
    if (!(e = fast_free_way2(fi, b1, b2)) && !(e = fast_make_room(fi, b1, b2))) {
        for (uint32_t i = 0; i < KVC_FAST_STASH && !e; i++)
            if (fast_ent_empty(&fi->stash[i]))
                e = &fi->stash[i];
        if (!e) {
            fi->full++;
            return;
        }
        if (fi->stash_used++ == 0)
            __atomic_store_n(&fi->hdr->stash_used, 1, __ATOMIC_RELEASE);
    }
    fast_ent_write(e, &want);
    fi->published++;
}

void fast_unpublish(struct fast_index *fi, uint16_t ns, const struct kvc_wire_key *k)
{
    uint32_t b1, b2;
    struct kvc_fast_ent *e = fast_find(fi, ns, k, &b1, &b2);
    if (!e)
        return;
    fast_ent_clear(e);
    fi->published--;
    if (e >= fi->stash) {
        if (--fi->stash_used == 0)
            __atomic_store_n(&fi->hdr->stash_used, 0, __ATOMIC_RELEASE);
    } else if (fi->stash_used) {
        fast_stash_drain(fi, (uint32_t)((uint64_t)(e - fi->ents) / KVC_FAST_WAYS));
    }
}

void fast_ns_set(struct fast_index *fi, uint32_t ns, const struct kvc_wire_layout *l)
{
    if (ns < fi->nns)
        __atomic_store_n(&fi->nslay[ns], l ? kvc_fast_layout_id(l) : 0, __ATOMIC_RELEASE);
}

/* ---- hit rings --------------------------------------------------------------------- */

struct fast_ring *fast_ring_new(int *fd, int *err)
{
    struct fast_ring *r = calloc(1, sizeof(*r));
    void *map;
    if (!r) {
        *err = -ENOMEM;
        return NULL;
    }
    r->bytes = sizeof(struct kvc_fast_ring) + KVC_FAST_RING_ENTS * sizeof(struct kvc_fast_hit);
    r->fd = fast_memfd("kvcd-hits", r->bytes, false, &map);
    if (r->fd < 0) {
        *err = r->fd;
        free(r);
        return NULL;
    }
    r->r = map;
    r->ents = (struct kvc_fast_hit *)(r->r + 1);
    r->r->nents = KVC_FAST_RING_ENTS;
    r->allow_milli = (uint64_t)KVC_FAST_RING_ENTS * 1000; /* a ring's worth to begin with */
    __atomic_store_n(&r->r->magic, KVC_FAST_RING_MAGIC, __ATOMIC_RELEASE);
    *fd = r->fd;
    return r;
}

void fast_ring_free(struct fast_ring *r)
{
    if (!r)
        return;
    munmap(r->r, r->bytes);
    close(r->fd);
    free(r);
}

void fast_ring_refill(struct fast_ring *r, uint64_t now_ms, uint32_t rate)
{
    const uint64_t full = (uint64_t)KVC_FAST_RING_ENTS * 1000;
    if (now_ms <= r->allow_ms)
        return;
    uint64_t add = (now_ms - r->allow_ms) * rate; /* thousandths of entries */
    r->allow_ms = now_ms;
    r->allow_milli = add >= full - r->allow_milli ? full : r->allow_milli + add;
}

uint32_t fast_ring_allowance(const struct fast_ring *r)
{
    return (uint32_t)(r->allow_milli / 1000);
}

uint32_t fast_ring_unread(const struct fast_ring *r)
{
    uint64_t head = __atomic_load_n(&r->r->head, __ATOMIC_ACQUIRE);
    if (head <= r->tail)
        return head == r->tail ? 0 : 1; /* moved backwards: a lie for fast_ring_take to see */
    return head - r->tail > KVC_FAST_RING_ENTS ? KVC_FAST_RING_ENTS : (uint32_t)(head - r->tail);
}

/* Puts the read position back in the ring after the client moved head too far either way:
 * true when it had to (a lie, or hits overwritten before they were read). */
static bool fast_ring_clamp(struct fast_ring *r, uint64_t head)
{
    if (head - r->tail > KVC_FAST_RING_ENTS && head >= r->tail) {
        r->tail = head - KVC_FAST_RING_ENTS; /* overwritten before we read them (or a lie) */
        return true;
    }
    if (head < r->tail) { /* moved backwards: a lie; start again from there */
        r->tail = head;
        return true;
    }
    return false;
}

uint32_t fast_ring_take(struct fast_ring *r, struct kvc_fast_hit *out, uint32_t max, bool *lied)
{
    /* The client owns head and may write anything there: only our own tail is trusted. */
    uint64_t head = __atomic_load_n(&r->r->head, __ATOMIC_ACQUIRE);
    uint32_t n = 0, allow = fast_ring_allowance(r);
    *lied = fast_ring_clamp(r, head);
    if (max > allow)
        max = allow;
    while (r->tail != head && n < max) {
        memcpy(&out[n++], &r->ents[r->tail % KVC_FAST_RING_ENTS], sizeof(*out));
        r->tail++;
    }
    r->allow_milli -= (uint64_t)n * 1000;
    __atomic_store_n(&r->r->tail, r->tail, __ATOMIC_RELEASE);
    return n;
}

uint32_t fast_ring_shed(struct fast_ring *r, uint32_t keep, bool *lied)
{
    uint64_t head = __atomic_load_n(&r->r->head, __ATOMIC_ACQUIRE);
    uint32_t allow = fast_ring_allowance(r);
    if (allow > keep)
        allow = keep;
    *lied = fast_ring_clamp(r, head);
    if (head - r->tail <= allow)
        return 0;
    uint32_t n = (uint32_t)(head - r->tail - allow); /* at most a ring's worth: clamped */
    r->tail += n;
    __atomic_store_n(&r->r->tail, r->tail, __ATOMIC_RELEASE);
    return n;
}

void fast_ring_bell_set(struct fast_ring *r, uint32_t bit)
{
    __atomic_store_n(&r->r->bell, bit, __ATOMIC_RELEASE);
}

/* ---- bells ------------------------------------------------------------------------- */

struct fast_bell *fast_bell_new(int *err)
{
    struct fast_bell *b = calloc(1, sizeof(*b));
    void *map;
    if (!b) {
        *err = -ENOMEM;
        return NULL;
    }
    b->fd = fast_memfd("kvcd-bell", KVC_FAST_BELL_BYTES, false, &map);
    if (b->fd < 0) {
        *err = b->fd;
        free(b);
        return NULL;
    }
    b->words = map;
    return b;
}

void fast_bell_free(struct fast_bell *b)
{
    if (!b)
        return;
    munmap(b->words, KVC_FAST_BELL_BYTES);
    close(b->fd);
    free(b->owner);
    free(b);
}

int fast_bell_fd(const struct fast_bell *b)
{
    return b->fd;
}

uint64_t fast_bell_bytes(const struct fast_bell *b)
{
    (void)b;
    return KVC_FAST_BELL_BYTES;
}

int fast_bell_bit_take(struct fast_bell *b, void *owner)
{
    uint32_t w = 0;
    while (w < KVC_FAST_BELL_BITS / 64 && b->used[w] == UINT64_MAX)
        w++;
    if (w == KVC_FAST_BELL_BITS / 64)
        return -ENOSPC;
    uint32_t bit = w * 64 + (uint32_t)__builtin_ctzll(~b->used[w]);
    if (bit >= b->cap) {
        uint32_t cap = b->cap ? b->cap * 2 : 64;
        void **o = realloc(b->owner, cap * sizeof(*o));
        if (!o)
            return -ENOMEM;
        memset(o + b->cap, 0, (cap - b->cap) * sizeof(*o));
        b->owner = o;
        b->cap = cap;
    }
    b->used[w] |= 1ull << (bit % 64);
    b->owner[bit] = owner;
    if (w >= b->nwords)
        b->nwords = w + 1;
    __atomic_fetch_and(&b->words[w], ~(1ull << (bit % 64)), __ATOMIC_RELAXED);
    return (int)bit;
}

void fast_bell_bit_put(struct fast_bell *b, uint32_t bit)
{
    uint32_t w = bit / 64;
    if (bit >= b->cap || !b->owner[bit])
        return;
    b->owner[bit] = NULL;
    b->used[w] &= ~(1ull << (bit % 64));
    __atomic_fetch_and(&b->words[w], ~(1ull << (bit % 64)), __ATOMIC_RELAXED);
    while (b->nwords && !b->used[b->nwords - 1])
        b->nwords--;
}

void fast_bell_collect(struct fast_bell *b, void (*fn)(void *owner, void *arg), void *arg)
{
    for (uint32_t w = 0; w < b->nwords; w++) {
        /* A plain load first: a word with no bit set (most of them) is not written. */
        if (!__atomic_load_n(&b->words[w], __ATOMIC_RELAXED))
            continue;
        /* Bits no connection holds (a client may set any) are cleared and ignored. */
        uint64_t x = __atomic_exchange_n(&b->words[w], 0, __ATOMIC_RELAXED) & b->used[w];
        while (x) {
            uint32_t bit = w * 64 + (uint32_t)__builtin_ctzll(x);
            x &= x - 1;
            fn(b->owner[bit], arg);
        }
    }
}

void fast_bell_fence(void)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
