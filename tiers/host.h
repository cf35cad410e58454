/*
 * host.h — the host tier: one shared-memory arena (memfd) with a slab allocator.
 *
 * DESIGN
 * The arena is a memfd (hugetlb pages when asked or available, normal pages otherwise),
 * mapped once by the daemon and faulted in when asked (copying into fresh pages runs at a
 * tenth of memcpy speed): a first part at creation, the rest by background threads, the
 * allocator's lowest pages (those it hands out first) first. Clients receive the descriptor over the socket and map it
 * themselves; a read-only descriptor (the memfd reopened O_RDONLY) is what readers get, so
 * the kernel enforces what the daemon's ACL says. Namespaces with the same access list share
 * an arena. The daemon's loop thread owns the arena's allocator.
 */
#ifndef KVC_TIER_HOST_H
#define KVC_TIER_HOST_H

#include <stdbool.h>
#include <stdint.h>

#include "tiers/tier.h"

enum tier_host_huge {
    TIER_HOST_HUGE_OFF = 0,  /* normal pages */
    TIER_HOST_HUGE_AUTO = 1, /* hugetlb if the kernel has enough free huge pages */
    TIER_HOST_HUGE_ON = 2,   /* hugetlb or fail */
};

struct tier_host_config {
    const char *name;   /* arena name, shown in /proc/<pid>/fd */
    uint32_t arena_id;  /* id carried in tier_loc.arena and on the wire */
    uint64_t size;      /* bytes; rounded up to page_size */
    uint64_t page_size; /* allocator page, power of two (2 MiB matches huge pages) */
    enum tier_host_huge huge;
    bool prefault; /* fault every page in: prefault_first bytes at creation, the rest by
                      prefault_threads threads in the background (0 threads: all at creation) */
    uint64_t prefault_first;
    uint32_t prefault_threads;
    bool collapse; /* with prefault, no hugetlb: each 2 MiB made one transparent huge page as it
                      is faulted in, whatever the host's shmem THP setting (client/kvc_huge.h) */
};

/* Creates the arena. On failure returns NULL and sets *err to a negative errno. */
struct tier *tier_host_new(const struct tier_host_config *cfg, int *err);

/* Read-write memfd descriptor (owned by the tier; dup it before passing it on). */
int tier_host_fd(const struct tier *t);
/* A new read-only descriptor of the same arena; the caller owns and closes it. -errno. */
int tier_host_fd_ro(const struct tier *t);
/* The daemon's own mapping of the arena. */
void *tier_host_base(const struct tier *t);
uint32_t tier_host_arena_id(const struct tier *t);
uint64_t tier_host_size(const struct tier *t);
bool tier_host_hugetlb(const struct tier *t);
/* Size class that would serve len bytes (see slab_class_get). */
int tier_host_class(struct tier *t, uint64_t len);
/* The allocator, for stats and for eviction that needs room in one class. */
struct slab *tier_host_slab(const struct tier *t);
/* Slot generations: from now on, freeing a slot first adds one to gens[off / gen_bytes] (no
 * slot smaller than gen_bytes, so no two slots share a generation), so readers outside the
 * daemon can tell that bytes they copied may have been reused. NULL (or gen_bytes 0): none. */
void tier_host_gens_set(struct tier *t, uint32_t *gens, uint64_t gen_bytes);

/* Bytes of the arena faulted in so far (the whole size once done; 0 without prefault). */
uint64_t tier_host_faulted(const struct tier *t);
/* Whether every page of [off, off + len) has been faulted in (true without prefault: nothing
 * is faulted on the daemon's behalf then). Any thread: what registers the arena with a
 * device (pinning it) waits for this, so that the pinning never faults a page in itself,
 * ahead of the fault-in and of its collapse into 2 MiB pages. */
bool tier_host_range_faulted(const struct tier *t, uint64_t off, uint64_t len);
/* Bytes from the arena's start every page of which has been faulted in (the whole size
 * without prefault, as tier_host_range_faulted says). Loop thread. */
uint64_t tier_host_faulted_prefix(struct tier *t);
/* Bytes of the arena made 2 MiB pages by collapse so far (tier_host_config.collapse). */
uint64_t tier_host_collapsed(const struct tier *t);
struct tier_host_fault_stats {
    uint64_t faulted;   /* bytes */
    uint64_t ns;        /* since the fault-in started, until it ended (or now) */
    uint32_t threads;   /* background threads it ran with */
    uint64_t collapsed; /* bytes made huge pages by collapse (tier_host_config.collapse) */
};
/* Whether the fault-in is over (or was never asked for); its figures into *st (may be NULL).
 * Joins the finished threads: loop thread. */
bool tier_host_fault_done(struct tier *t, struct tier_host_fault_stats *st);

/*
 * Faults of the daemon's own accesses (see host.c, "Holes"): a SIGBUS inside the arena's
 * mapping — a writer punched a hole the kernel could not fill again — is survived by mapping
 * private zeros over the page. The loop thread then takes the pages that faulted and
 * quarantines them (their slots are not handed out again), drops the blocks there, and
 * calls tier_host_repair() until each page maps the arena's memory again.
 */
/* Pages (offsets, tier_host_fault_unit() bytes each) that faulted since the last call, at
 * most max (the rest come with the next call); they are quarantined from now on. */
uint32_t tier_host_faults_take(struct tier *t, uint64_t *offs, uint32_t max);
/* Bytes of one fault unit (the backing page, or a multiple of it in very large arenas);
 * 0 when the arena is unguarded. */
uint64_t tier_host_fault_unit(const struct tier *t);
/* Maps every quarantined page from the arena again and faults it in; a page that now holds
 * memory leaves quarantine. Returns the pages still quarantined (retry later). */
uint32_t tier_host_repair(struct tier *t);

#endif
