/*
 * host.c — the host tier: one memfd arena shared with clients, cut by a slab allocator.
 *
 * DESIGN
 * The arena is created once and never resized: it is sealed against shrinking and growing
 * (a client holding the read-write descriptor could otherwise truncate it and make the
 * daemon's next copy SIGBUS), and F_SEAL_SEAL stops a client from adding a write seal that
 * would lock out every other writer. Its mode is set to 0600 so that a reader of another
 * user cannot turn its read-only descriptor into a writable one by reopening
 * /proc/self/fd/N. Pages are faulted in when asked: the first touch of a shmem page costs
 * far more than the copy into it, and a put should run at memcpy speed.
 *
 * Fault-in. At 0.3-1 GB/s (what a VM faults shmem pages at) a 256 GiB arena takes minutes,
 * so with prefault_threads the arena is faulted in by that many threads in the background
 * after a first part (prefault_first bytes) is faulted before tier_host_new returns. The
 * threads take 2 MiB chunks (or huge pages) in ascending order and populate them with
 * MADV_POPULATE_WRITE, which makes the pages resident and writable without changing a byte
 * (clients may already be writing there). The slab allocator hands out the lowest free pages
 * first, so it takes faulted memory first; a slot it hands out before its pages are faulted
 * (a chunk still in a thread's hands, or an arena faulted out of order) is populated on the
 * spot, in tier_host_alloc. tier_host_faulted says how far it got; the threads are joined
 * when they are done or when the tier goes.
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
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc_huge.h"
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

/* The background fault-in (see "Fault-in" above). The threads write only the atomics. */
#define TIER_HOST_FAULT_CHUNK (2u << 20)
#define TIER_HOST_COLLAPSE_FAILS 16u
#define TIER_HOST_FAULT_THREADS_MAX 64
struct tier_host_fault {
    uint64_t chunk; /* bytes a thread takes at once (a multiple of the page) */
    uint64_t nchunks;
    _Atomic uint64_t next;     /* first chunk no thread has taken yet */
    _Atomic uint64_t *done;    /* a bit per chunk: populated */
    _Atomic uint64_t ndone;    /* chunks populated */
    _Atomic int stop;          /* the tier goes: threads leave after their chunk */
    _Atomic uint64_t t_end_ns; /* CLOCK_MONOTONIC when the last chunk was done (0: not yet) */
    uint64_t t_start_ns;
    pthread_t threads[TIER_HOST_FAULT_THREADS_MAX];
    uint32_t nthreads; /* not joined yet */
    uint32_t nstarted;
    bool complete;       /* loop thread's view: every chunk done, threads joined */
    uint64_t prefix;     /* loop thread's view: chunks [0, prefix) are done */
    bool populate_write; /* MADV_POPULATE_WRITE works here (else a locked add of 0) */
    /* host.thp_collapse: each 2 MiB chunk made one huge page before it is populated
     * (client/kvc_huge.h), until the kernel says it never will or TIER_HOST_COLLAPSE_FAILS
     * chunks failed (memory too fragmented, pages pinned: each try costs a scan). */
    _Atomic int collapse;
    _Atomic uint32_t collapse_fails;
    _Atomic uint64_t collapsed; /* chunks */
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
    uint64_t gen_bytes; /* the arena's bytes a generation covers */
    struct tier_host_fault *fault; /* background fault-in in progress or done; NULL: none */
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

/* ---- fault-in --------------------------------------------------------------------------- */

static uint64_t tier_host_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Makes [p, p + len) resident and writable without changing a byte: MADV_POPULATE_WRITE, or
 * on a kernel without it a locked add of 0 to a byte of each page (atomic against a client
 * writing the same byte). Errors (a hole nobody can fill on hugetlb) are left to the SIGBUS
 * guard; the populate never raises one. */
static void tier_host_populate(char *p, uint64_t len, uint64_t page, bool populate_write)
{
    if (populate_write && madvise(p, len, MADV_POPULATE_WRITE) == 0)
        return;
    if (populate_write && errno != EINVAL)
        return;
    for (uint64_t o = 0; o < len; o += page)
        __atomic_fetch_add(p + o, 0, __ATOMIC_RELAXED);
}

static void tier_host_fault_chunk(struct tier_host *h, uint64_t c)
{
    struct tier_host_fault *f = h->fault;
    uint64_t off = c * f->chunk, len = h->size - off < f->chunk ? h->size - off : f->chunk;
    uint64_t page = h->guard ? h->guard->unit : 4096;
    if (len == KVC_HUGE_BYTES && atomic_load_explicit(&f->collapse, memory_order_relaxed)) {
        int rc = kvc_huge_collapse((char *)h->map + off);
        if (rc == 0)
            atomic_fetch_add(&f->collapsed, 1);
        else if (rc == -EINVAL ||
                 atomic_fetch_add(&f->collapse_fails, 1) + 1 >= TIER_HOST_COLLAPSE_FAILS)
            atomic_store(&f->collapse, 0);
    }
    tier_host_populate((char *)h->map + off, len, page, f->populate_write);
    atomic_fetch_or(&f->done[c / 64], UINT64_C(1) << (c % 64));
    if (atomic_fetch_add(&f->ndone, 1) + 1 == f->nchunks)
        atomic_store(&f->t_end_ns, tier_host_mono_ns());
}

static void *tier_host_fault_main(void *arg)
{
    struct tier_host *h = arg;
    struct tier_host_fault *f = h->fault;
    while (!atomic_load(&f->stop)) {
        uint64_t c = atomic_fetch_add(&f->next, 1);
        if (c >= f->nchunks)
            break;
        tier_host_fault_chunk(h, c);
    }
    return NULL;
}

static bool tier_host_chunk_done(const struct tier_host_fault *f, uint64_t c)
{
    return atomic_load_explicit(&f->done[c / 64], memory_order_acquire) >> (c % 64) & 1;
}

/* Faults in the first `first` bytes now and starts `threads` threads for the rest (none: all
 * of it now). 0 or -errno; on failure nothing is left running. */
static int tier_host_fault_start(struct tier_host *h, uint64_t first, uint32_t threads,
                                 bool collapse)
{
    struct tier_host_fault *f = calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    uint64_t page = h->guard ? h->guard->unit : 4096;
    f->chunk = page > TIER_HOST_FAULT_CHUNK ? page : TIER_HOST_FAULT_CHUNK;
    f->nchunks = (h->size + f->chunk - 1) / f->chunk;
    f->done = calloc((f->nchunks + 63) / 64, sizeof(*f->done));
    if (!f->done) {
        free(f);
        return -ENOMEM;
    }
    f->t_start_ns = tier_host_mono_ns();
    /* Probe once: a kernel before 5.14 answers EINVAL. */
    f->populate_write = madvise(h->map, 0, MADV_POPULATE_WRITE) == 0 || errno != EINVAL;
    /* Huge pages by collapse: 2 MiB chunks of a shmem arena at 2 MiB boundaries. */
    atomic_store(&f->collapse, collapse && !h->hugetlb && f->chunk == KVC_HUGE_BYTES &&
                                   f->populate_write &&
                                   ((uintptr_t)h->map & (KVC_HUGE_BYTES - 1)) == 0);
    h->fault = f;
    if (threads > TIER_HOST_FAULT_THREADS_MAX)
        threads = TIER_HOST_FAULT_THREADS_MAX;
    uint64_t nfirst = threads ? (first + f->chunk - 1) / f->chunk : f->nchunks;
    if (nfirst > f->nchunks)
        nfirst = f->nchunks;
    for (uint64_t c = 0; c < nfirst; c++)
        tier_host_fault_chunk(h, c);
    atomic_store(&f->next, nfirst);
    for (uint32_t i = 0; i < threads && nfirst < f->nchunks; i++) {
        if (pthread_create(&f->threads[f->nthreads], NULL, tier_host_fault_main, h) != 0)
            break;
        f->nthreads++;
    }
    f->nstarted = f->nthreads;
    if (nfirst < f->nchunks && f->nthreads == 0) /* no thread: the rest now, as before */
        for (uint64_t c = atomic_exchange(&f->next, f->nchunks); c < f->nchunks; c++)
            tier_host_fault_chunk(h, c);
    return 0;
}

/* Stops the threads (after their chunk) and joins them. */
static void tier_host_fault_stop(struct tier_host *h)
{
    struct tier_host_fault *f = h->fault;
    if (!f)
        return;
    atomic_store(&f->stop, 1);
    for (uint32_t i = 0; i < f->nthreads; i++)
        pthread_join(f->threads[i], NULL);
    f->nthreads = 0;
}

/* A slot about to be handed out: its pages faulted in now if a thread has not yet. */
static void tier_host_fault_slot(struct tier_host *h, uint64_t off, uint64_t len)
{
    struct tier_host_fault *f = h->fault;
    if (!f || f->complete)
        return;
    uint64_t page = h->guard ? h->guard->unit : 4096;
    for (uint64_t c = off / f->chunk; c <= (off + len - 1) / f->chunk; c++) {
        if (tier_host_chunk_done(f, c))
            continue;
        uint64_t a = off & ~(page - 1), e = (off + len + page - 1) & ~(page - 1);
        tier_host_populate((char *)h->map + a, (e < h->size ? e : h->size) - a, page,
                           f->populate_write);
        return;
    }
}

/* memfd, size, seals and mapping for one backing; 0 or -errno, nothing left behind on
 * failure. */
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
    /* Pages are faulted in after the huge-page advice (tier_host_fault_start). A hugetlb
     * mapping reserves its pages here, so populating it later cannot run out of them. */
    map = kvc_huge_map(fd, size, PROT_READ | PROT_WRITE, 0);
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
     * per second from a huge-page arena on this VM (docs/design/disk.md). Best effort;
     * where the host does not allow them, the fault-in collapses each 2 MiB into one
     * (host.thp_collapse, client/kvc_huge.h): hence the mapping at a 2 MiB boundary. */
    if (!huge)
        (void)madvise(map, size, MADV_HUGEPAGE);
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
    tier_host_fault_slot(h, off, slot);
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
        __atomic_fetch_add(&h->gens[loc->off / h->gen_bytes], 1, __ATOMIC_RELEASE);
    slab_release(h->slab, loc->off);
}

void tier_host_gens_set(struct tier *t, uint32_t *gens, uint64_t gen_bytes)
{
    struct tier_host *h = tier_host_of(t);
    h->gens = gen_bytes ? gens : NULL;
    h->gen_bytes = gen_bytes;
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
    tier_host_fault_stop(h);
    if (h->fault) {
        free((void *)h->fault->done);
        free(h->fault);
    }
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
    if (cfg->prefault) {
        ret = tier_host_fault_start(h, cfg->prefault_first, cfg->prefault_threads, cfg->collapse);
        if (ret < 0)
            goto out;
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

uint64_t tier_host_faulted(const struct tier *t)
{
    const struct tier_host *h = tier_host_of(t);
    const struct tier_host_fault *f = h->fault;
    if (!f)
        return 0;
    uint64_t n = atomic_load(&f->ndone);
    return n == f->nchunks ? h->size : n * f->chunk;
}

bool tier_host_range_faulted(const struct tier *t, uint64_t off, uint64_t len)
{
    const struct tier_host *h = tier_host_of(t);
    const struct tier_host_fault *f = h->fault;
    if (!f || !len)
        return true;
    if (off >= h->size || len > h->size - off)
        return false;
    for (uint64_t c = off / f->chunk; c <= (off + len - 1) / f->chunk; c++)
        if (!tier_host_chunk_done(f, c))
            return false;
    return true;
}

uint64_t tier_host_faulted_prefix(struct tier *t)
{
    struct tier_host *h = tier_host_of(t);
    struct tier_host_fault *f = h->fault;
    if (!f)
        return h->size;
    while (f->prefix < f->nchunks && tier_host_chunk_done(f, f->prefix))
        f->prefix++;
    return f->prefix == f->nchunks ? h->size : f->prefix * f->chunk;
}

uint64_t tier_host_collapsed(const struct tier *t)
{
    const struct tier_host_fault *f = tier_host_of(t)->fault;
    return f ? atomic_load(&f->collapsed) * f->chunk : 0;
}

bool tier_host_fault_done(struct tier *t, struct tier_host_fault_stats *st)
{
    struct tier_host *h = tier_host_of(t);
    struct tier_host_fault *f = h->fault;
    if (st)
        *st = (struct tier_host_fault_stats){0};
    if (!f)
        return true;
    bool done = atomic_load(&f->ndone) == f->nchunks;
    if (done && !f->complete) {
        tier_host_fault_stop(h); /* every thread has left its loop or is about to */
        f->complete = true;
    }
    if (st) {
        uint64_t end = atomic_load(&f->t_end_ns);
        st->faulted = tier_host_faulted(t);
        st->threads = f->nstarted;
        st->ns = (end ? end : tier_host_mono_ns()) - f->t_start_ns;
        st->collapsed = tier_host_collapsed(t);
    }
    return done;
}
