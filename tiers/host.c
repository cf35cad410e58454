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
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tiers/host.h"
#include "tiers/slab.h"

struct tier_host {
    struct tier base;
    struct slab *slab;
    int fd;
    void *map;
    uint64_t size;
    uint32_t arena_id;
    bool hugetlb;
};

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
     * per second from a huge-page arena on this VM (docs/disk.md). Best effort. */
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
    if (loc->arena == h->arena_id)
        slab_release(h->slab, loc->off);
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
    if (!h->slab)
        ret = -ENOMEM;
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
