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

/* Everything the daemon decides about an index is kept here, privately: the shared header
 * is written once for the clients and never read back. The entries and generations are
 * read back (to find a key's way, to publish a slot's generation), but only the daemon can
 * have written them: the memfd is sealed against every writable mapping but this one. */
struct fast_index {
    int fd;
    uint8_t *map;
    uint64_t bytes;
    uint64_t arena_bytes;
    struct kvc_fast_hdr *hdr;
    struct kvc_fast_ent *ents;
    uint32_t *gens;
    uint64_t *nslay;
    uint32_t nns;
    uint32_t nsets;
    uint64_t seed;
    uint64_t published, full;
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
    *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
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
                                  int *err)
{
    struct fast_index *fi = calloc(1, sizeof(*fi));
    uint64_t units = (arena_bytes + (1u << KVC_FAST_UNIT_SHIFT) - 1) >> KVC_FAST_UNIT_SHIFT;
    /* An entry per 64 KiB of arena: every block of 64 KiB or more has room (a set full of
     * smaller ones leaves some out: fast_index_full); with the generations, 1/600 of the
     * arena in all. */
    uint64_t want = arena_bytes / (64u << 10);
    uint32_t nsets = 128;
    void *map;
    char name[32];
    if (!fi) {
        *err = -ENOMEM;
        return NULL;
    }
    while ((uint64_t)nsets * KVC_FAST_WAYS < want && nsets < (1u << 20))
        nsets *= 2;
    uint64_t ns_off = fast_round64(sizeof(struct kvc_fast_hdr));
    uint64_t ents_off = fast_round64(ns_off + (uint64_t)nns * sizeof(uint64_t));
    uint64_t gens_off =
        fast_round64(ents_off + (uint64_t)nsets * KVC_FAST_WAYS * sizeof(struct kvc_fast_ent));
    uint64_t bytes = (gens_off + units * sizeof(uint32_t) + 4095) & ~(uint64_t)4095;
    snprintf(name, sizeof(name), "kvcd-index-%u", arena_id);
    fi->fd = fast_memfd(name, bytes, true, &map);
    if (fi->fd < 0) {
        *err = fi->fd;
        free(fi);
        return NULL;
    }
    if (getrandom(&fi->seed, sizeof(fi->seed), 0) != sizeof(fi->seed))
        fi->seed = (uint64_t)(uintptr_t)fi ^ 0x9e3779b97f4a7c15ull;
    fi->map = map;
    fi->bytes = bytes;
    fi->arena_bytes = arena_bytes;
    fi->nns = nns;
    fi->nsets = nsets;
    fi->hdr = map;
    fi->nslay = (uint64_t *)(fi->map + ns_off);
    fi->ents = (struct kvc_fast_ent *)(fi->map + ents_off);
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
                                     .nsets = nsets,
                                     .ways = KVC_FAST_WAYS};
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

uint32_t *fast_index_gens(struct fast_index *fi)
{
    return fi->gens;
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
}

/* The entry of (ns, k) in its set, or NULL; *empty gets the set's first free way. */
static struct kvc_fast_ent *fast_find(struct fast_index *fi, uint16_t ns,
                                      const struct kvc_wire_key *k, struct kvc_fast_ent **empty)
{
    struct kvc_fast_ent *e = fi->ents + (uint64_t)kvc_fast_set(fi->seed, fi->nsets, ns, k->lo,
                                                               k->hi) * KVC_FAST_WAYS;
    *empty = NULL;
    for (uint32_t w = 0; w < KVC_FAST_WAYS; w++) {
        if (!e[w].used) {
            if (!*empty)
                *empty = &e[w];
            continue;
        }
        if (e[w].ns == ns && e[w].klo == k->lo && e[w].khi == k->hi)
            return &e[w];
    }
    return NULL;
}

/* The writer's half of the entry's sequence lock: odd while it changes. The daemon is the
 * only writer; the fields are stored atomically so readers never see a torn word. */
static void fast_write_begin(struct kvc_fast_ent *e)
{
    __atomic_store_n(&e->seq, e->seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static void fast_write_end(struct kvc_fast_ent *e)
{
    __atomic_store_n(&e->seq, e->seq + 1, __ATOMIC_RELEASE);
}

void fast_publish(struct fast_index *fi, uint16_t ns, const struct kvc_wire_key *k, uint64_t off,
                  uint32_t len, uint8_t format, uint32_t idx)
{
    struct kvc_fast_ent *empty, *e = fast_find(fi, ns, k, &empty);
    uint64_t unit = off >> KVC_FAST_UNIT_SHIFT;
    if (unit >= (fi->arena_bytes >> KVC_FAST_UNIT_SHIFT) || (off & 4095))
        return; /* not a slot of this arena: never published */
    uint32_t gen = __atomic_load_n(&fi->gens[unit], __ATOMIC_RELAXED);
    if (e && e->off == off && e->len == len && e->format == format && e->gen == gen &&
        e->block == idx)
        return; /* unchanged (a touch): readers keep their entry */
    if (!e && !(e = empty)) {
        fi->full++;
        return;
    }
    if (!e->used)
        fi->published++;
    fast_write_begin(e);
    __atomic_store_n(&e->ns, ns, __ATOMIC_RELAXED);
    __atomic_store_n(&e->format, format, __ATOMIC_RELAXED);
    __atomic_store_n(&e->gen, gen, __ATOMIC_RELAXED);
    __atomic_store_n(&e->len, len, __ATOMIC_RELAXED);
    __atomic_store_n(&e->off, off, __ATOMIC_RELAXED);
    __atomic_store_n(&e->klo, k->lo, __ATOMIC_RELAXED);
    __atomic_store_n(&e->khi, k->hi, __ATOMIC_RELAXED);
    __atomic_store_n(&e->block, idx, __ATOMIC_RELAXED);
    __atomic_store_n(&e->used, 1, __ATOMIC_RELAXED);
    fast_write_end(e);
}

void fast_unpublish(struct fast_index *fi, uint16_t ns, const struct kvc_wire_key *k)
{
    struct kvc_fast_ent *empty, *e = fast_find(fi, ns, k, &empty);
    if (!e)
        return;
    fast_write_begin(e);
    __atomic_store_n(&e->used, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->klo, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->khi, 0, __ATOMIC_RELAXED);
    fast_write_end(e);
    fi->published--;
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

uint32_t fast_ring_shed(struct fast_ring *r, bool *lied)
{
    uint64_t head = __atomic_load_n(&r->r->head, __ATOMIC_ACQUIRE);
    uint32_t allow = fast_ring_allowance(r);
    *lied = fast_ring_clamp(r, head);
    if (head - r->tail <= allow)
        return 0;
    uint32_t n = (uint32_t)(head - r->tail - allow); /* at most a ring's worth: clamped */
    r->tail += n;
    __atomic_store_n(&r->r->tail, r->tail, __ATOMIC_RELEASE);
    return n;
}
