/*
 * host.c — the host tier: one memfd arena shared with clients, cut by a slab allocator.
 *
 * DESIGN
 * The arena is created once and never resized: it is sealed against shrinking and growing
 * (a client holding the read-write descriptor could otherwise truncate it and make the
 * daemon's next copy SIGBUS), and F_SEAL_SEAL stops a client from adding a write seal that
 * would lock out every other writer. Its mode is set to 0600 so that a reader of another
 * user cannot turn its read-only descriptor into a writable one by reopening
 * /proc/self/fd/N. Pages are faulted in at creation when asked: the first touch of a
 * shmem page costs far more than the copy into it, and a put should run at memcpy speed.
 * Hugetlb backing is used when configured ON, or when AUTO and /proc/meminfo shows enough
 * free huge pages; AUTO falls back to normal pages on any hugetlb failure.
 * The allocator's metadata is on the daemon's heap, out of the clients' reach. Reads and
 * writes are memcpy and complete before they return. Owned by the daemon's loop thread.
 *
 * Holes. Linux cannot hand out a writable shared mapping without the right to free its pages:
 * fallocate(PUNCH_HOLE) on the descriptor and madvise(MADV_REMOVE) on the mapping both work
 * for any writer, and the only seals that stop them (F_SEAL_WRITE, F_SEAL_FUTURE_WRITE) also
 * stop every new writable mapping. On shmem a hole reads as zeros and refills on the next
 * touch; on hugetlb the refill needs a free huge page, and a writer that punched holes and
 * took the free huge pages made the daemon's next touch die of SIGBUS. So the daemon guards
 * its own mappings: a SIGBUS inside an arena maps private zero pages over the faulting page
 * (the access completes, reading zeros, as the hole would) and records it; the loop then
 * (tier_host_faults_take) drops the blocks there and repairs the page — maps it from the file
 * again and faults it in with MADV_POPULATE_WRITE, which fails instead of raising SIGBUS.
 * Until a repair succeeds the page is quarantined: the allocator never hands out a slot
 * touching it, so no honest client is sent there. A hole costs the blocks in it what a
 * writer of the arena could do anyway (write zeros over them); it cannot stop the daemon.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tiers/host.h"
#include "tiers/slab.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* What the SIGBUS handler knows of one arena mapping: set before `base` is published.
 * Faulted pages are bits, one per `chunk` (the backing page, or coarser for huge arenas so
 * the map stays within 128 KiB): nothing is ever lost, however many pages fault at once. */
#define TIER_HOST_GUARDS 64
#define TIER_HOST_GUARD_BITS (1u << 20)
struct tier_host_guard {
    _Atomic int used;         /* slot claimed by an arena */
    _Atomic(uintptr_t) base; /* 0: not published (yet, or any more) */
    uint64_t size;
    uint64_t unit;            /* backing page size: what the handler replaces */
    uint64_t chunk;           /* what a bit stands for: a power-of-two multiple of unit */
    _Atomic uint64_t *bits;   /* size / chunk bits, owned by the tier */
    uint64_t nwords;
    _Atomic uint32_t nrec;    /* faults so far */
    uint32_t seen;            /* nrec when the loop last looked (loop thread only) */
};
static struct tier_host_guard tier_host_guards[TIER_HOST_GUARDS];
static struct sigaction tier_host_sigbus_prev;
static _Atomic int tier_host_sigbus_installed;

struct tier_host_held {
    uint64_t off, len;
};

struct tier_host {
    struct tier base;
    struct slab *slab;
    int fd;
    void *map;
    uint64_t size;
    uint32_t arena_id;
    bool hugetlb;
    struct tier_host_guard *guard; /* NULL: no slot was free (faults then kill, as before) */
    uint64_t *quar;                /* quarantined pages (offsets), unsorted */
    uint32_t nquar, capquar;
    struct tier_host_held *held;   /* slots kept from the allocator because they touch one */
    uint32_t nheld, capheld;
    uint32_t *gens; /* slot generations (tier_host_gens_set), or NULL */
    unsigned gen_shift;
};

/* ---- the SIGBUS guard -------------------------------------------------------------------- */

static void tier_host_on_sigbus(int sig, siginfo_t *si, void *uc)
{
    uintptr_t a = (uintptr_t)si->si_addr;
    (void)sig;
    (void)uc;
    for (int i = 0; i < TIER_HOST_GUARDS; i++) {
        struct tier_host_guard *g = &tier_host_guards[i];
        uintptr_t base = atomic_load_explicit(&g->base, memory_order_acquire);
        if (!base || a < base || a - base >= g->size)
            continue;
        uint64_t off = (a - base) & ~(uint64_t)(g->unit - 1);
        /* Private zeros stand in for the page; the faulting access then completes. */
        if (mmap((void *)(base + off), g->unit, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
            break;
        uint64_t bit = off / g->chunk;
        atomic_fetch_or(&g->bits[bit / 64], UINT64_C(1) << (bit % 64));
        atomic_fetch_add(&g->nrec, 1);
        return;
    }
    /* Not an arena: what would have happened without us. */
    sigaction(SIGBUS, &tier_host_sigbus_prev, NULL);
}

static struct tier_host_guard *tier_host_guard_add(void *map, uint64_t size, uint64_t unit)
{
    int expect = 0;
    uint64_t chunk = unit;
    while (size / chunk > TIER_HOST_GUARD_BITS)
        chunk *= 2;
    uint64_t nwords = (size / chunk + 64) / 64;
    _Atomic uint64_t *bits = calloc(nwords, sizeof(*bits));
    if (!bits)
        return NULL;
    if (atomic_compare_exchange_strong(&tier_host_sigbus_installed, &expect, 1)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = tier_host_on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, &tier_host_sigbus_prev);
    }
    for (int i = 0; i < TIER_HOST_GUARDS; i++) {
        struct tier_host_guard *g = &tier_host_guards[i];
        int free_slot = 0;
        /* Claim the slot, fill it, then publish the base the handler looks for. */
        if (!atomic_compare_exchange_strong(&g->used, &free_slot, 1))
            continue;
        g->unit = unit;
        g->chunk = chunk;
        g->bits = bits;
        g->nwords = nwords;
        atomic_store(&g->nrec, 0);
        g->seen = 0;
        g->size = size;
        atomic_store_explicit(&g->base, (uintptr_t)map, memory_order_release);
        return g;
    }
    free((void *)bits);
    return NULL;
}

/* Whether [off, off + len) touches a quarantined page. */
static bool tier_host_quarantined(const struct tier_host *h, uint64_t off, uint64_t len)
{
    for (uint32_t i = 0; i < h->nquar; i++)
        if (off < h->quar[i] + h->guard->chunk && h->quar[i] < off + len)
            return true;
    return false;
}

static int tier_host_push(uint64_t **v, uint32_t *n, uint32_t *cap, uint64_t x)
{
    if (*n == *cap) {
        uint32_t ncap = *cap ? *cap * 2 : 16;
        uint64_t *nv = realloc(*v, ncap * sizeof(*nv));
        if (!nv)
            return -ENOMEM;
        *v = nv;
        *cap = ncap;
    }
    (*v)[(*n)++] = x;
    return 0;
}

static struct tier_host *tier_host_of(const struct tier *t)
{
    return (struct tier_host *)t;
}

/* Free huge pages and their size from /proc/meminfo; 0 if unknown. */
static uint64_t tier_host_huge_free_bytes(uint64_t *huge_page)
{
    FILE *f = fopen("/proc/meminfo", "re");
    unsigned long long nfree = 0, kb = 0;
    char line[128];
    if (!f)
        goto out;
    while (fgets(line, sizeof(line), f)) {
        sscanf(line, "HugePages_Free: %llu", &nfree);
        sscanf(line, "Hugepagesize: %llu kB", &kb);
    }
    fclose(f);
out:
    *huge_page = kb * 1024;
    return nfree * kb * 1024;
}

/* memfd, size, seals, mapping and prefault for one backing; 0 or -errno, nothing left
 * behind on failure. */
static int tier_host_map(struct tier_host *h, const struct tier_host_config *cfg, bool huge,
                         uint64_t size)
{
    const char *name = cfg->name ? cfg->name : "kvcd-host";
    unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB : 0);
    int fd = memfd_create(name, flags);
    void *map = MAP_FAILED;
    int ret = 0;
    if (fd < 0) {
        ret = -errno;
        goto out;
    }
    if (fchmod(fd, 0600) < 0 || ftruncate(fd, (off_t)size) < 0) {
        ret = -errno;
        goto out;
    }
    /* Small pages are faulted in below, after the huge-page advice. */
    int mflags = MAP_SHARED | (cfg->prefault && huge ? MAP_POPULATE : 0);
    map = mmap(NULL, size, PROT_READ | PROT_WRITE, mflags, fd, 0);
    if (map == MAP_FAILED) {
        ret = -errno;
        goto out;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        ret = -errno;
        goto out;
    }
    /* Without hugetlb pages, ask for transparent huge pages (taken where the host allows
     * them for shared memory: /sys/kernel/mm/transparent_hugepage/shmem_enabled = advise
     * or within_size). A block in physically contiguous memory is one segment of a disk
     * request instead of one per 4 KiB page: bench-disk moves a fifth to two fifths more
     * per second from a huge-page arena on this VM (docs/design/disk.md). Best effort. */
    if (!huge)
        (void)madvise(map, size, MADV_HUGEPAGE);
    if (cfg->prefault) {
        /* MAP_POPULATE is best effort; a write per page makes every page resident and
         * writable in the page tables before the first put. */
        long ps = sysconf(_SC_PAGESIZE);
        uint64_t step = ps > 0 ? (uint64_t)ps : 4096;
        for (uint64_t o = 0; o < size; o += step)
            ((volatile char *)map)[o] = 0;
    }
out:
    if (ret < 0) {
        if (map != MAP_FAILED)
            munmap(map, size);
        if (fd >= 0)
            close(fd);
        return ret;
    }
    h->fd = fd;
    h->map = map;
    h->size = size;
    h->hugetlb = huge;
    return 0;
}

static int tier_host_alloc(struct tier *t, uint64_t len, struct tier_loc *loc)
{
    struct tier_host *h = tier_host_of(t);
    uint64_t off, slot;
    int cls;
    int ret = slab_alloc(h->slab, len, &off, &slot, &cls);
    /* A slot touching a quarantined page is kept back until the page is repaired. */
    while (ret == 0 && h->nquar && tier_host_quarantined(h, off, slot)) {
        if (h->nheld == h->capheld) {
            uint32_t ncap = h->capheld ? h->capheld * 2 : 16;
            struct tier_host_held *nv = realloc(h->held, ncap * sizeof(*nv));
            if (!nv) {
                slab_release(h->slab, off);
                return -ENOMEM;
            }
            h->held = nv;
            h->capheld = ncap;
        }
        h->held[h->nheld++] = (struct tier_host_held){off, slot};
        ret = slab_alloc(h->slab, len, &off, &slot, &cls);
    }
    if (ret < 0)
        return ret;
    loc->arena = h->arena_id;
    loc->cls = (uint32_t)cls;
    loc->off = off;
    loc->len = slot;
    return 0;
}

static void tier_host_free(struct tier *t, const struct tier_loc *loc)
{
    struct tier_host *h = tier_host_of(t);
    /* A location this tier never handed out is refused by the allocator and changes
     * nothing; free has no way to report it. */
    if (loc->arena != h->arena_id)
        return;
    /* Before the slot can be handed out again: a reader that copied from it sees the
     * generation change and discards the copy (client/kvc_fast.h). */
    if (h->gens && loc->off < h->size)
        __atomic_fetch_add(&h->gens[loc->off >> h->gen_shift], 1, __ATOMIC_RELEASE);
    slab_release(h->slab, loc->off);
}

void tier_host_gens_set(struct tier *t, uint32_t *gens, unsigned shift)
{
    struct tier_host *h = tier_host_of(t);
    h->gens = gens;
    h->gen_shift = shift;
}

/* Pointer to [off, off+len) inside loc, or NULL if any part is outside loc or the arena. */
static char *tier_host_span(struct tier_host *h, const struct tier_loc *loc, uint64_t off,
                            uint64_t len)
{
    if (loc->arena != h->arena_id || len == 0)
        return NULL;
    if (loc->off > h->size || loc->len > h->size - loc->off)
        return NULL;
    if (off > loc->len || len > loc->len - off)
        return NULL;
    return (char *)h->map + loc->off + off;
}

static int tier_host_read(struct tier *t, const struct tier_loc *loc, uint64_t off, void *dst,
                          uint64_t len, tier_done_fn done, void *arg)
{
    char *p = tier_host_span(tier_host_of(t), loc, off, len);
    if (!p)
        return -EINVAL;
    memcpy(dst, p, len);
    if (done)
        done(arg, 0);
    return 0;
}

static int tier_host_write(struct tier *t, const struct tier_loc *loc, uint64_t off,
                           const void *src, uint64_t len, tier_done_fn done, void *arg)
{
    char *p = tier_host_span(tier_host_of(t), loc, off, len);
    if (!p)
        return -EINVAL;
    memcpy(p, src, len);
    if (done)
        done(arg, 0);
    return 0;
}

static uint64_t tier_host_capacity(const struct tier *t)
{
    return tier_host_of(t)->size;
}

static uint64_t tier_host_usage(const struct tier *t)
{
    struct slab_stats st;
    slab_stats_get(tier_host_of(t)->slab, &st);
    return st.used;
}

static void tier_host_destroy(struct tier *t)
{
    struct tier_host *h = tier_host_of(t);
    if (h->guard) {
        _Atomic uint64_t *bits = h->guard->bits;
        atomic_store(&h->guard->base, 0);
        free((void *)bits);
        atomic_store(&h->guard->used, 0);
    }
    free(h->quar);
    free(h->held);
    if (h->map && h->map != MAP_FAILED)
        munmap(h->map, h->size);
    if (h->fd >= 0)
        close(h->fd);
    slab_free(h->slab);
    free(h);
}

static const struct tier_ops tier_host_ops = {
    .name = "host",
    .alloc = tier_host_alloc,
    .free = tier_host_free,
    .read = tier_host_read,
    .write = tier_host_write,
    .capacity = tier_host_capacity,
    .usage = tier_host_usage,
    .destroy = tier_host_destroy,
};

struct tier *tier_host_new(const struct tier_host_config *cfg, int *err)
{
    struct tier_host *h = NULL;
    int ret = 0;
    if (!cfg || cfg->size == 0 || cfg->page_size < SLAB_MIN_SLOT ||
        (cfg->page_size & (cfg->page_size - 1)) || cfg->huge > TIER_HOST_HUGE_ON) {
        ret = -EINVAL;
        goto out;
    }
    h = calloc(1, sizeof(*h));
    if (!h) {
        ret = -ENOMEM;
        goto out;
    }
    h->base.ops = &tier_host_ops;
    h->fd = -1;
    h->arena_id = cfg->arena_id;
    if (cfg->size > UINT64_MAX - cfg->page_size) {
        ret = -EINVAL;
        goto out;
    }
    uint64_t size = (cfg->size + cfg->page_size - 1) & ~(cfg->page_size - 1);

    uint64_t huge_page = 0;
    uint64_t huge_free = tier_host_huge_free_bytes(&huge_page);
    /* a hugetlb file is sized and mapped in whole huge pages */
    uint64_t huge_size = size;
    if (huge_page && size % huge_page)
        huge_size = size + huge_page - size % huge_page;
    bool try_huge = cfg->huge == TIER_HOST_HUGE_ON ||
                    (cfg->huge == TIER_HOST_HUGE_AUTO && huge_page && huge_free >= huge_size);
    if (try_huge) {
        ret = tier_host_map(h, cfg, true, huge_size);
        if (ret < 0 && cfg->huge == TIER_HOST_HUGE_ON)
            goto out;
    }
    if (!try_huge || ret < 0) {
        ret = tier_host_map(h, cfg, false, size);
        if (ret < 0)
            goto out;
    }
    h->slab = slab_new(h->size, cfg->page_size);
    if (!h->slab) {
        ret = -ENOMEM;
        goto out;
    }
    {
        long ps = sysconf(_SC_PAGESIZE);
        uint64_t unit = ps > 0 ? (uint64_t)ps : 4096;
        if (h->hugetlb && huge_page)
            unit = huge_page;
        h->guard = tier_host_guard_add(h->map, h->size, unit);
    }
out:
    if (ret < 0) {
        if (h)
            tier_host_destroy(&h->base);
        if (err)
            *err = ret;
        return NULL;
    }
    if (err)
        *err = 0;
    return &h->base;
}

int tier_host_fd(const struct tier *t)
{
    return tier_host_of(t)->fd;
}

int tier_host_fd_ro(const struct tier *t)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", tier_host_of(t)->fd);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

void *tier_host_base(const struct tier *t)
{
    return tier_host_of(t)->map;
}

uint32_t tier_host_arena_id(const struct tier *t)
{
    return tier_host_of(t)->arena_id;
}

uint64_t tier_host_size(const struct tier *t)
{
    return tier_host_of(t)->size;
}

bool tier_host_hugetlb(const struct tier *t)
{
    return tier_host_of(t)->hugetlb;
}

int tier_host_class(struct tier *t, uint64_t len)
{
    return slab_class_get(tier_host_of(t)->slab, len);
}

struct slab *tier_host_slab(const struct tier *t)
{
    return tier_host_of(t)->slab;
}

uint32_t tier_host_faults_take(struct tier *t, uint64_t *offs, uint32_t max)
{
    struct tier_host *h = tier_host_of(t);
    struct tier_host_guard *g = h->guard;
    uint32_t n = 0, rec;
    if (!g || (rec = atomic_load(&g->nrec)) == g->seen)
        return 0;
    for (uint64_t w = 0; w < g->nwords && n < max; w++) {
        uint64_t x = atomic_load(&g->bits[w]);
        while (x && n < max) {
            uint64_t b = x & -x, off = (w * 64 + (uint64_t)__builtin_ctzll(x)) * g->chunk;
            x &= x - 1;
            if (!tier_host_quarantined(h, off, 1) &&
                tier_host_push(&h->quar, &h->nquar, &h->capquar, off))
                return n; /* no memory: the bit stays for the next call */
            atomic_fetch_and(&g->bits[w], ~b);
            offs[n++] = off;
        }
        if (x)
            return n; /* more than max: the rest stay set, seen unchanged */
    }
    g->seen = rec;
    return n;
}

uint64_t tier_host_fault_unit(const struct tier *t)
{
    const struct tier_host *h = tier_host_of(t);
    return h->guard ? h->guard->chunk : 0;
}

/* Maps the page at off from the file again and faults it in; 0 or -errno. */
static int tier_host_page_repair(struct tier_host *h, uint64_t off)
{
    uint64_t unit = h->guard->chunk < h->size - off ? h->guard->chunk : h->size - off;
    char *p = (char *)h->map + off;
    if (mmap(p, unit, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, h->fd, (off_t)off) ==
        MAP_FAILED)
        return -errno;
    if (madvise(p, unit, MADV_POPULATE_WRITE) < 0 && errno != EINVAL)
        return -errno; /* EINVAL: a kernel without it; the guard covers the next touch */
    return 0;
}

uint32_t tier_host_repair(struct tier *t)
{
    struct tier_host *h = tier_host_of(t);
    uint32_t i = 0;
    while (i < h->nquar) {
        uint64_t q = h->quar[i];
        if (tier_host_page_repair(h, q)) {
            i++;
            continue;
        }
        h->quar[i] = h->quar[--h->nquar];
        /* Slots kept back for this page go back unless another page still holds them. */
        for (uint32_t k = 0; k < h->nheld;) {
            if (!tier_host_quarantined(h, h->held[k].off, h->held[k].len)) {
                slab_release(h->slab, h->held[k].off);
                h->held[k] = h->held[--h->nheld];
            } else {
                k++;
            }
        }
    }
    return h->nquar;
}
