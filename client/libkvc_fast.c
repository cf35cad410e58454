/*
 * libkvc_fast.c — copy-outs through an arena's shared index, with no round trip
 * (client/kvc_fast.h has the protocol).
 *
 * kvc_get_prefix() tries this first: it resolves each key in the index, checks the slot's
 * generation, copies (or decodes) the block into the caller's buffer and checks the
 * generation again. The first key it cannot serve that way ends the run; the rest of the
 * prefix takes the socket as before. Hits are written to the connection's hit ring so the
 * daemon's policies count them. Anything unexpected (no index, an old daemon, a malformed
 * mapping) turns the fast path off for that arena and the socket serves everything.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc_fast.h"
#include "client/kvc_huge.h"
#include "client/libkvc_internal.h"
#include "kernels/kern.h"

/* Maps the descriptor of a FAST_ATTACH reply at a 2 MiB boundary; NULL on failure (the fd is
 * closed). With huge (the index), the mapping is advised for transparent huge pages before it
 * is populated: a hit's bucket and generation are two random reads into an index of tens of
 * MiB at a million blocks, and on 4 KiB pages each costs a page walk that itself misses the
 * caches. Its pages are huge where the host allows huge pages for shared memory
 * (shmem_enabled advise, within_size or always; docs/performance.md) or the daemon collapsed
 * them (client/kvc_huge.h); a kernel before MADV_POPULATE_READ (5.14) faults them in on first
 * use. */
static void *kvc_fast_map(int fd, uint64_t bytes, int prot, bool huge)
{
    void *m = MAP_FAILED;
    if (fd >= 0 && bytes && bytes <= SIZE_MAX)
        m = kvc_huge_map(fd, bytes, prot, huge ? 0 : MAP_POPULATE);
    if (fd >= 0)
        close(fd);
    if (m == MAP_FAILED)
        return NULL;
    if (huge) {
        (void)madvise(m, bytes, MADV_HUGEPAGE);
        (void)madvise(m, bytes, MADV_POPULATE_READ);
    }
    return m;
}

/* FAST_ATTACH what (arena for INDEX); the descriptor and size of its mapping. c->mu held. */
static int kvc_fast_attach_call(kvc_client *c, uint32_t what, uint32_t arena, int *fd,
                                uint64_t *bytes)
{
    struct kvc_fast_attach_req *q = kvci_req(c);
    const struct kvc_fast_attach_rep *p;
    uint32_t len;
    *q = (struct kvc_fast_attach_req){.what = what, .arena_id = arena};
    int rc = kvci_call(c, KVC_OP_FAST_ATTACH, sizeof(*q), fd);
    if (rc)
        return rc;
    p = kvci_rep(c, &len);
    if (len != sizeof(*p) || p->what != what || p->arena_id != arena ||
        (what != KVC_FAST_SYNC && (!fd || *fd < 0)))
        return -EPROTO;
    if (bytes)
        *bytes = p->bytes;
    return 0;
}

/* Checks a mapped index against the arena it names; 0 or -EPROTO. */
static int kvc_fast_check(const struct kvc_fast_hdr *h, uint64_t bytes, uint32_t arena,
                          uint64_t arena_bytes)
{
    uint64_t ngens = kvc_fast_ngens(arena_bytes, h->gen_units);
    const uint64_t esz = sizeof(struct kvc_fast_ent);
    if (bytes < sizeof(*h) || h->magic != KVC_FAST_MAGIC || h->version != KVC_FAST_VERSION ||
        h->arena_id != arena || h->arena_bytes != arena_bytes || h->total != bytes ||
        h->ways != KVC_FAST_WAYS || h->nbuckets < 2 || h->nstash != KVC_FAST_STASH ||
        h->ns_off < sizeof(*h) || h->ns_off > bytes || h->nns > (bytes - h->ns_off) / 8 ||
        h->ents_off < h->ns_off + (uint64_t)h->nns * 8 || h->ents_off > bytes ||
        (uint64_t)h->nbuckets * KVC_FAST_WAYS + KVC_FAST_STASH > (bytes - h->ents_off) / esz ||
        h->gens_off <
            h->ents_off + ((uint64_t)h->nbuckets * KVC_FAST_WAYS + KVC_FAST_STASH) * esz ||
        h->gen_units == 0 || h->gens_off > bytes ||
        ngens > (bytes - h->gens_off) / sizeof(uint32_t) ||
        (h->ns_off | h->ents_off | h->gens_off) % 8)
        return -EPROTO;
    return 0;
}

/* Maps the bell of the connection's uid, its bit in the header of ring r. false when it
 * cannot: the daemon gave the bit, so a ring written without it would be read only at the
 * daemon's sweeps. c->mu held. */
static bool kvc_fast_bell_map(kvc_client *c, const struct kvc_fast_ring *r)
{
    int fd = -1;
    uint64_t bytes = 0;
    if (kvc_fast_attach_call(c, KVC_FAST_BELL, 0, &fd, &bytes)) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    uint32_t bit = __atomic_load_n(&r->bell, __ATOMIC_ACQUIRE);
    if (bytes != KVC_FAST_BELL_BYTES || bit >= KVC_FAST_BELL_BITS) {
        close(fd);
        return false;
    }
    uint64_t *b = kvc_fast_map(fd, bytes, PROT_READ | PROT_WRITE, false);
    if (!b)
        return false;
    c->bell = b;
    c->bell_bit = bit;
    return true;
}

/* Maps the hit ring (and its bell, from a daemon that has one), once per client: true when
 * it is there. c->mu held. */
static bool kvc_fast_ring_map(kvc_client *c)
{
    int fd = -1;
    uint64_t bytes = 0;
    if (c->ring)
        return true;
    if (kvc_fast_attach_call(c, KVC_FAST_RING, 0, &fd, &bytes)) {
        if (fd >= 0)
            close(fd);
        /* an old daemon, or server.fast_path = no */
        __atomic_store_n(&c->fast_off, true, __ATOMIC_RELAXED);
        return false;
    }
    struct kvc_fast_ring *r = kvc_fast_map(fd, bytes, PROT_READ | PROT_WRITE, false);
    if (!r)
        return false;
    if (bytes != sizeof(*r) + (uint64_t)KVC_FAST_RING_ENTS * sizeof(struct kvc_fast_hit) ||
        r->magic != KVC_FAST_RING_MAGIC || r->nents != KVC_FAST_RING_ENTS ||
        ((c->features & KVC_HELLO_F_FAST_BELL) && !kvc_fast_bell_map(c, r))) {
        munmap(r, bytes);
        __atomic_store_n(&c->fast_off, true, __ATOMIC_RELAXED);
        return false;
    }
    c->ring = r;
    c->ring_bytes = bytes;
    return true;
}

/* Maps arena a's index (the daemon's latest) and, once per client, the hit ring; the new view
 * replaces c->fast[a].view, which it keeps as older. true when both are there. c->mu held. */
static bool kvc_fast_attach_maps(kvc_client *c, uint32_t a)
{
    struct kvc_fastmap *m = &c->fast[a];
    struct kvc_fastview *v;
    int fd = -1;
    uint64_t bytes = 0;
    if (c->dead || !c->arenas[a].base || !kvc_fast_ring_map(c))
        return false;
    if (kvc_fast_attach_call(c, KVC_FAST_INDEX, a, &fd, &bytes)) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    const struct kvc_fast_hdr *h = kvc_fast_map(fd, bytes, PROT_READ, true);
    if (!h)
        return false;
    if (kvc_fast_check(h, bytes, a, c->arenas[a].size) || !(v = calloc(1, sizeof(*v)))) {
        munmap((void *)h, bytes);
        return false;
    }
    v->map = (const uint8_t *)h;
    v->bytes = bytes;
    v->hdr = h;
    v->seed = h->seed;
    v->nbuckets = h->nbuckets;
    v->nns = h->nns;
    v->units = (h->arena_bytes + (1u << KVC_FAST_UNIT_SHIFT) - 1) >> KVC_FAST_UNIT_SHIFT;
    v->gen_units = h->gen_units;
    v->nslay = (const uint64_t *)(v->map + h->ns_off);
    v->ents = (const struct kvc_fast_ent *)(v->map + h->ents_off);
    v->stash = v->ents + (uint64_t)v->nbuckets * KVC_FAST_WAYS;
    v->gens = (const uint32_t *)(v->map + h->gens_off);
    v->older = m->view;
    __atomic_store_n(&m->view, v, __ATOMIC_RELEASE);
    return true;
}

/* kvc_fast_attach_maps, then the verdict published for readers without c->mu. */
static void kvc_fast_attach(kvc_client *c, uint32_t a)
{
    bool ok = kvc_fast_attach_maps(c, a);
    __atomic_store_n(&c->fast[a].state, ok ? 1 : -1, __ATOMIC_RELEASE);
}

uint64_t kvci_fast_faulted(kvc_client *c, uint32_t a)
{
    struct kvc_fastmap *m = &c->fast[a];
    if (__atomic_load_n(&c->fast_off, __ATOMIC_RELAXED))
        return UINT64_MAX;
    if (m->state == 0 ||
        (m->state == 1 && __atomic_load_n(&m->view->hdr->retired, __ATOMIC_ACQUIRE)))
        kvc_fast_attach(c, a);
    if (m->state != 1 || !m->view)
        return UINT64_MAX;
    uint64_t f = __atomic_load_n(&m->view->hdr->faulted, __ATOMIC_ACQUIRE);
    return f ? f : UINT64_MAX;
}

void kvci_fast_fini(kvc_client *c)
{
    for (int a = 0; a < KVC_MAX_ARENAS; a++)
        for (struct kvc_fastview *v = c->fast[a].view, *o; v; v = o) {
            o = v->older;
            munmap((void *)v->map, v->bytes);
            free(v);
        }
    if (c->ring)
        munmap(c->ring, c->ring_bytes);
    if (c->bell)
        munmap(c->bell, KVC_FAST_BELL_BYTES);
}

void kvci_fast_bell(kvc_client *c, uint64_t was)
{
    if (c->bell && c->ring->head != was)
        kvc_fast_bell_ring(c->ring, was, c->bell, c->bell_bit);
}

bool kvci_fast_unread(const kvc_client *c)
{
    return c->ring && c->ring->head != __atomic_load_n(&c->ring->tail, __ATOMIC_ACQUIRE);
}

void kvci_fast_flush(kvc_client *c)
{
    pthread_mutex_lock(&c->mu);
    if (kvci_fast_unread(c) && !c->dead)
        (void)kvc_fast_attach_call(c, KVC_FAST_SYNC, 0, NULL, NULL);
    pthread_mutex_unlock(&c->mu);
}

/* Entry e read whole under its sequence count into *out: whether it is (ns, k)'s. */
static bool kvc_fast_read(const struct kvc_fast_ent *e, uint32_t ns, const struct kvc_key *k,
                          struct kvc_fast_ent *out)
{
    for (int tries = 0; tries < 64; tries++) {
        uint16_t s1 = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE);
        if (s1 & 1)
            continue; /* being rewritten */
        out->ns = __atomic_load_n(&e->ns, __ATOMIC_RELAXED);
        out->klo = __atomic_load_n(&e->klo, __ATOMIC_RELAXED);
        out->khi = __atomic_load_n(&e->khi, __ATOMIC_RELAXED);
        out->gen = __atomic_load_n(&e->gen, __ATOMIC_RELAXED);
        out->unit = __atomic_load_n(&e->unit, __ATOMIC_RELAXED);
        out->fmt = __atomic_load_n(&e->fmt, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&e->seq, __ATOMIC_RELAXED) != s1)
            continue;
        return out->klo == k->lo && out->khi == k->hi && out->ns == ns;
    }
    return false;
}

/* The entry of (ns, k): in one of its two buckets (bk, when the caller has them already), or
 * in the stash when the daemon has put entries there. */
static bool kvc_fast_find(const struct kvc_fastview *v, uint32_t ns, const struct kvc_key *k,
                          const uint32_t *bk, struct kvc_fast_ent *out)
{
    uint32_t b[2];
    if (bk) {
        b[0] = bk[0];
        b[1] = bk[1];
    } else {
        kvc_fast_buckets(v->seed, v->nbuckets, ns, k->lo, k->hi, &b[0], &b[1]);
    }
    for (int i = 0; i < 2; i++) {
        const struct kvc_fast_ent *e = v->ents + (uint64_t)b[i] * KVC_FAST_WAYS;
        for (uint32_t w = 0; w < KVC_FAST_WAYS; w++)
            if (__atomic_load_n(&e[w].klo, __ATOMIC_RELAXED) == k->lo &&
                kvc_fast_read(&e[w], ns, k, out))
                return true;
    }
    if (!__atomic_load_n(&v->hdr->stash_used, __ATOMIC_ACQUIRE))
        return false;
    for (uint32_t i = 0; i < KVC_FAST_STASH; i++)
        if (__atomic_load_n(&v->stash[i].klo, __ATOMIC_RELAXED) == k->lo &&
            kvc_fast_read(&v->stash[i], ns, k, out))
            return true;
    return false;
}

/* Appends a request's hits to the ring; asks the daemon to read it first when it is half
 * full (its answer comes once it has read them, or skipped those past its rate). Hits that
 * find no room are counted as lost (the copies stand). */
static void kvc_fast_record(kvc_client *c, struct kvc_fast_hit *rec, size_t n)
{
    pthread_mutex_lock(&c->mu);
    struct kvc_fast_ring *r = c->ring;
    struct kvc_fast_hit *ents = (struct kvc_fast_hit *)(r + 1);
    uint64_t head = r->head, was = head;
    uint64_t tail = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
    if (head - tail + n > KVC_FAST_RING_ENTS / 2 && !c->dead &&
        kvc_fast_attach_call(c, KVC_FAST_SYNC, 0, NULL, NULL) == 0)
        tail = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
    for (size_t i = 0; i < n; i++) {
        if (head - tail >= KVC_FAST_RING_ENTS) {
            r->lost += n - i;
            break;
        }
        ents[head % KVC_FAST_RING_ENTS] = rec[i];
        head++;
    }
    __atomic_store_n(&r->head, head, __ATOMIC_RELEASE);
    kvci_fast_bell(c, was);
    pthread_mutex_unlock(&c->mu);
}

/* A published block, checked against the arena: where and how it is stored, and the word of
 * its slot's generation (gen when published), to check around the copy. */
struct kvc_fast_loc {
    uint64_t off, len;
    const uint32_t *genp;
    uint32_t gen;
    uint8_t format;
};

/* Whether what was read through view v still stands: the slot's generation unchanged and the
 * index not retired (after a retirement the daemon no longer keeps its generations). */
static bool kvc_fast_still(const struct kvc_fastview *v, const struct kvc_fast_loc *l)
{
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(l->genp, __ATOMIC_RELAXED) == l->gen &&
           !__atomic_load_n(&v->hdr->retired, __ATOMIC_RELAXED);
}

/* Copies the block at l into dst: 0, or -1 when it is not what the entry said any more. */
static int kvc_fast_copy(const kvc_ns *ns, const struct kvc_fastview *v, const uint8_t *base,
                         const struct kvc_fast_loc *l, void *dst)
{
    if (l->format == KVC_WIRE_FORMAT_RAW) {
        kvci_copy_from_arena(dst, base + l->off, ns->block_bytes);
        return kvc_fast_still(v, l) ? 0 : -1;
    }
    /* Quantized: copied to private memory, checked, then decoded (as kvc_lease_copy). */
    struct kern_layout kl = {.layers = ns->layout.layers,
                             .heads = ns->layout.kv_heads,
                             .head_dim = ns->layout.head_dim,
                             .tokens = ns->layout.block_tokens,
                             .dtype = ns->layout.dtype,
                             .k_only = ns->layout.kv_kind == KVC_WIRE_KV_KIND_K_ONLY};
    void *priv = malloc(l->len ? l->len : 1);
    int rc = -1;
    if (!priv)
        return -1;
    memcpy(priv, base + l->off, l->len);
    if (kvc_fast_still(v, l) &&
        kern_decode_cpu(&kl, priv, l->len, dst, ns->block_bytes, (enum kern_dtype)kl.dtype) >= 0)
        rc = 0;
    free(priv);
    return rc;
}

/* ns's arena index, mapped on first use (and again when the daemon replaced it by a larger
 * one), when ns may be read through it; else NULL. */
static const struct kvc_fastview *kvc_fast_view_of(kvc_ns *ns)
{
    kvc_client *c = ns->c;
    struct kvc_fastmap *m = &c->fast[ns->arena];
    const struct kvc_fastview *v;
    /* A connection found dead (a failed call: the ring's drain requests are calls too) stops
     * the fast path, so an engine whose daemon went away hears of it from the socket path
     * instead of reading an orphaned index forever. */
    if (__atomic_load_n(&c->fast_off, __ATOMIC_RELAXED) ||
        __atomic_load_n(&c->dead, __ATOMIC_RELAXED))
        return NULL;
    v = __atomic_load_n(&m->view, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&m->state, __ATOMIC_ACQUIRE) == 0 ||
        (v && __atomic_load_n(&v->hdr->retired, __ATOMIC_ACQUIRE))) {
        pthread_mutex_lock(&c->mu);
        if (!c->fast_off && (m->state == 0 || (m->state == 1 && m->view == v)))
            kvc_fast_attach(c, ns->arena);
        pthread_mutex_unlock(&c->mu);
        v = __atomic_load_n(&m->view, __ATOMIC_ACQUIRE);
    }
    if (__atomic_load_n(&m->state, __ATOMIC_ACQUIRE) != 1 || !v || ns->id >= v->nns ||
        __atomic_load_n(&v->nslay[ns->id], __ATOMIC_ACQUIRE) != ns->fast_lay)
        return NULL; /* not our namespace under that id (dropped, or never in the index) */
    return v;
}

/* k's two buckets into bk, both asked for (each bucket's two lines) without waiting: a key
 * the daemon moved to its second bucket (a good share of them at the index's load) then
 * costs one wait on memory for its entry, not two in turn. */
static void kvc_fast_prefetch_key(const struct kvc_fastview *v, uint32_t ns,
                                  const struct kvc_key *k, uint32_t *bk)
{
    kvc_fast_buckets(v->seed, v->nbuckets, ns, k->lo, k->hi, &bk[0], &bk[1]);
    for (int i = 0; i < 2; i++) {
        const struct kvc_fast_ent *e = v->ents + (uint64_t)bk[i] * KVC_FAST_WAYS;
        __builtin_prefetch(e);
        __builtin_prefetch(e + KVC_FAST_WAYS - 1);
    }
}

/* Where k's block is (bk: its buckets, or NULL), checked against the arena and its slot's
 * generation now. With base (the arena's mapping, for a copy to come), the block's first line
 * is asked for before the generation is read: its page walk and miss overlap the
 * generation's instead of following them, and the core's prefetchers take the rest of the
 * block once the copy reads it. */
static bool kvc_fast_entry(const kvc_ns *ns, const struct kvc_fastview *v, const struct kvc_key *k,
                           const uint32_t *bk, struct kvc_fast_loc *l, const uint8_t *base)
{
    uint64_t asize = ns->c->arenas[ns->arena].size;
    struct kvc_fast_ent e;
    if (!kvc_fast_find(v, ns->id, k, bk, &e) || e.unit >= v->units)
        return false;
    l->format = (uint8_t)KVC_FAST_FMT_FORMAT(e.fmt);
    l->off = (uint64_t)e.unit << KVC_FAST_UNIT_SHIFT;
    l->len = l->format == KVC_WIRE_FORMAT_RAW
                 ? ns->block_bytes
                 : (uint64_t)KVC_FAST_FMT_UNITS(e.fmt) << KVC_FAST_UNIT_SHIFT;
    if (KVC_FAST_FMT_FORMAT(e.fmt) >= KVC_WIRE_FORMAT_COUNT || l->off > asize ||
        l->len > asize - l->off)
        return false;
    if (base)
        __builtin_prefetch(base + l->off);
    l->gen = e.gen;
    l->genp = &v->gens[e.unit / v->gen_units];
    return __atomic_load_n(l->genp, __ATOMIC_ACQUIRE) == l->gen;
}

int kvci_fast_resolve(kvc_ns *ns, const struct kvc_key *k, const void **data, size_t *len)
{
    const struct kvc_fastview *v = kvc_fast_view_of(ns);
    struct kvc_fast_loc l;
    if (!v || !kvc_fast_entry(ns, v, k, NULL, &l, NULL))
        return 0;
    *data = ns->c->arenas[ns->arena].base + l.off;
    *len = l.len;
    return 1;
}

/* Microseconds since *t0 (at least 1), and *t0 moved to now. */
static uint32_t kvc_fast_us(uint64_t *t0)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t t = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec, us = (t - *t0) / 1000;
    *t0 = t;
    return us == 0 ? 1 : us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

size_t kvci_fast_get(kvc_ns *ns, const struct kvc_key *keys, size_t n, void *const *dst)
{
    kvc_client *c = ns->c;
    /* A run from keys[0] is no window's and no state's answer: the daemon finds their span
     * (a window cut short or a state of another boundary must never be served). */
    bool run = ns->layout.kv_kind != KVC_WIRE_KV_KIND_KV_WINDOW &&
               ns->layout.kv_kind != KVC_WIRE_KV_KIND_STATE;
    const struct kvc_fastview *v = n && run ? kvc_fast_view_of(ns) : NULL;
    struct kvc_fast_hit stackrec[64], *rec = stackrec;
    size_t hits = 0;
    if (!v)
        return 0;
    const uint8_t *base = c->arenas[ns->arena].base;
    if (n > 64 && !(rec = malloc((n < KVC_PROTO_MAX_KEYS ? n : KVC_PROTO_MAX_KEYS) * sizeof(*rec))))
        return 0;
    size_t cap = n > 64 ? (n < KVC_PROTO_MAX_KEYS ? n : KVC_PROTO_MAX_KEYS) : 64;
    size_t nrec = 0, first = 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t t0 = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    /* One key ahead: the next block's entry and generation are read, and its first line asked
     * for, before this block is copied, so the index's and the arena's misses (and the page
     * walks of a large arena) overlap the copy instead of following it; the buckets of the
     * key after are asked for too (its buckets kept in bq[j & 1] for key j, not hashed
     * again). Reading an entry early only widens the window its generation is checked over
     * (read before the copy, again after it). */
    struct kvc_fast_loc cur, nxt = {0};
    uint32_t bq[2][2];
    kvc_fast_prefetch_key(v, ns->id, &keys[0], bq[0]);
    if (n > 1)
        kvc_fast_prefetch_key(v, ns->id, &keys[1], bq[1]);
    bool have = kvc_fast_entry(ns, v, &keys[0], bq[0], &cur, base);
    while (hits < n && have) {
        bool next = false;
        if (hits + 1 < n) {
            if (hits + 2 < n)
                kvc_fast_prefetch_key(v, ns->id, &keys[hits + 2], bq[hits & 1]);
            next = kvc_fast_entry(ns, v, &keys[hits + 1], bq[(hits + 1) & 1], &nxt, base);
        }
        if (kvc_fast_copy(ns, v, base, &cur, dst[hits]))
            break;
        rec[nrec++] = (struct kvc_fast_hit){.ns = ns->id,
                                            .block = UINT32_MAX,
                                            .klo = keys[hits].lo,
                                            .khi = keys[hits].hi,
                                            .pos = (uint16_t)hits};
        hits++;
        cur = nxt;
        have = next;
        if (nrec == cap) { /* a request's worth: recorded as one lookup */
            rec[0].nkeys = (uint16_t)(hits - first);
            rec[0].load_us = kvc_fast_us(&t0);
            kvc_fast_record(c, rec, nrec);
            nrec = 0;
            first = hits;
        }
    }
    if (nrec) {
        rec[0].nkeys = (uint16_t)(hits - first);
        rec[0].load_us = kvc_fast_us(&t0);
        kvc_fast_record(c, rec, nrec);
    }
    if (rec != stackrec)
        free(rec);
    return hits;
}
