/*
 * kvc_huge.h — shared memory on 2 MiB pages where the host's settings alone would give 4 KiB
 * ones. Internal: shared by the daemon (the host arenas and the shared index) and libkvc (its
 * mappings of them).
 *
 * DESIGN
 * At a million blocks, a hit through the shared index reads a bucket, a generation and the
 * block at three random places of an index of tens of MiB and an arena of GiB; on 4 KiB pages
 * each costs a page walk that itself misses the caches, and a disk request needs a segment per
 * 4 KiB page of its block. Advice (MADV_HUGEPAGE) gives shared memory huge pages only where
 * the host allows them (/sys/kernel/mm/transparent_hugepage/shmem_enabled advise, within_size
 * or always); Debian's default is never. MADV_COLLAPSE (Linux 6.1) makes 2 MiB of a shmem
 * file one huge page whatever that setting says (but deny): the daemon faults in the first
 * 4 KiB of each 2 MiB, asks for the collapse — the kernel builds the huge page from that page
 * and zeros, which costs less than faulting the other 511 — and populates the rest as before
 * (already there when the collapse worked). The kernel maps a huge page with one entry only
 * where the file's 2 MiB boundaries fall on the address space's, so every mapping of an arena
 * or an index, the daemon's and each client's, is placed at a 2 MiB boundary (kvc_huge_map).
 * A collapse that fails (a kernel before 6.1, deny, no free 2 MiB of physical memory, pages
 * pinned for a device) leaves 4 KiB pages, as before: best effort, nothing depends on it.
 */
#ifndef KVC_HUGE_H
#define KVC_HUGE_H
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif

#define KVC_HUGE_BYTES (UINT64_C(2) << 20)

/* mmap(NULL, bytes, prot, MAP_SHARED | flags, fd, 0) at a 2 MiB boundary when bytes is at
 * least 2 MiB (address space for bytes + 2 MiB taken first, the mapping placed at its first
 * boundary, the rest given back; where the kernel refuses that place, wherever it puts it);
 * MAP_FAILED and errno as mmap. */
static inline void *kvc_huge_map(int fd, uint64_t bytes, int prot, int flags)
{
    if (bytes < KVC_HUGE_BYTES || bytes > SIZE_MAX - KVC_HUGE_BYTES)
        return mmap(NULL, bytes, prot, MAP_SHARED | flags, fd, 0);
    size_t span = (size_t)(bytes + KVC_HUGE_BYTES);
    uint8_t *r = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED)
        return mmap(NULL, bytes, prot, MAP_SHARED | flags, fd, 0);
    uintptr_t a = ((uintptr_t)r + KVC_HUGE_BYTES - 1) & ~(uintptr_t)(KVC_HUGE_BYTES - 1);
    void *m = mmap((void *)a, bytes, prot, MAP_SHARED | MAP_FIXED | flags, fd, 0);
    if (m == MAP_FAILED) { /* e.g. hugetlb pages of 1 GiB: the kernel places those itself */
        munmap(r, span);
        return mmap(NULL, bytes, prot, MAP_SHARED | flags, fd, 0);
    }
    long ps = sysconf(_SC_PAGESIZE);
    uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096;
    uintptr_t end = (a + (uintptr_t)bytes + page - 1) & ~(page - 1), rend = (uintptr_t)r + span;
    if (a > (uintptr_t)r)
        munmap(r, a - (uintptr_t)r);
    if (rend > end)
        munmap((void *)end, rend - end);
    return m;
}

/* Makes the 2 MiB at p (a 2 MiB boundary of a writable shared mapping from kvc_huge_map) one
 * huge page: its first 4 KiB faulted in, then MADV_COLLAPSE. No byte changes (the kernel
 * copies what is there). 0, or -errno of the collapse: EINVAL where this kernel or host never
 * will (stop asking), others for this 2 MiB only (no free huge page, pages pinned). */
static inline int kvc_huge_collapse(void *p)
{
    if ((uintptr_t)p & (KVC_HUGE_BYTES - 1))
        return -EINVAL;
    if (madvise(p, 4096, MADV_POPULATE_WRITE) < 0)
        return -errno;
    return madvise(p, KVC_HUGE_BYTES, MADV_COLLAPSE) < 0 ? -errno : 0;
}

#endif
