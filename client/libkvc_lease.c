/*
 * libkvc_lease.c — libkvc's reads: lookups and their leases (kvc_lookup, kvc_lookup_budget,
 * kvc_hint, the lease calls, kvc_release) and kvc_get_prefix.
 *
 * DESIGN
 * A lease holds the daemon's pins on the hits of one lookup, one id per chunk of
 * KVC_PROTO_MAX_KEYS keys, until kvc_release; every location in a reply is checked against
 * the client's mapping (kvci_loc_ptr) before it becomes a pointer. A hit being read from
 * disk is not ready until a WAIT says so (kvc_lease_wait). kvc_get_prefix takes the leading
 * hits through the shared index (libkvc_fast.c) and asks the socket only for the rest. The
 * time spent copying hits out is added to the lease and reported at release, so the daemon
 * can weigh load time against recompute time.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc.h"
#include "client/kvc_fast.h"
#include "client/kvc_proto.h"
#include "client/libkvc_internal.h"
#include "kernels/kern.h"
#include "kernels/kern_dev.h"

/* How long kvc_lookup waits for reads from disk before giving up on them. */
#define KVC_LOOKUP_WAIT_MS 60000u

/* ---- reading -------------------------------------------------------------------------- */

static void kvc_kern_layout(const kvc_ns *ns, struct kern_layout *kl)
{
    *kl = (struct kern_layout){.layers = ns->layout.layers,
                               .heads = ns->layout.kv_heads,
                               .head_dim = ns->layout.head_dim,
                               .tokens = ns->layout.block_tokens,
                               .dtype = ns->layout.dtype,
                               .k_only = ns->layout.kv_kind == KVC_WIRE_KV_KIND_K_ONLY};
}

static uint64_t kvc_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Adds the time of one copy out of the arena to the lease (several threads may copy from
 * one lease; the lease is otherwise read-only to them, hence the cast and the atomic). */
static void kvc_lease_account(const kvc_lease *l, uint64_t t0)
{
    __atomic_fetch_add(&((kvc_lease *)l)->load_ns, kvc_mono_ns() - t0, __ATOMIC_RELAXED);
}

/* RELEASE of ids[0..n), waited for; or, quiet where the daemon takes it, sent without
 * waiting (kvc_release: the connection's next reply says the pins went, its requests being
 * handled in order; a later SYNC for another process to see it). ids must not lie in c->rx
 * when quiet (making room may read replies). c->mu held. */
static int kvc_release_ids(kvc_client *c, const uint64_t *ids, size_t n, uint64_t load_ns,
                           bool quiet)
{
    quiet = quiet && (c->features & KVC_HELLO_F_QUIET);
    if (quiet) {
        int rc = kvci_defer_room(c);
        if (rc)
            return rc;
    }
    struct kvc_release_req *q = kvci_req(c);
    /* a copy under a microsecond counts as one, as the fast path's records do (truncated, a
     * client of small leases would never report its copies) */
    uint64_t us = load_ns && load_ns < 1000 ? 1 : load_ns / 1000;
    memset(q, 0, sizeof(*q));
    q->nleases = (uint32_t)n;
    q->load_us = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
    memcpy(q + 1, ids, n * sizeof(uint64_t));
    const uint32_t len = (uint32_t)(sizeof(*q) + n * sizeof(uint64_t));
    return quiet ? kvci_send_nowait(c, KVC_OP_RELEASE, len, true, 0, 0)
                 : kvci_call(c, KVC_OP_RELEASE, len, NULL);
}

/* WAIT on one lease; fills *rep. Caller holds c->mu. */
static int kvc_wait_id(kvc_client *c, uint64_t id, uint32_t timeout_ms, struct kvc_wait_rep *rep)
{
    struct kvc_wait_req *q = kvci_req(c);
    uint32_t len;
    int rc;
    *q = (struct kvc_wait_req){.lease_id = id, .timeout_ms = timeout_ms};
    rc = kvci_call(c, KVC_OP_WAIT, sizeof(*q), NULL);
    if (rc)
        return rc;
    const struct kvc_wait_rep *p = kvci_rep(c, &len);
    if (len != sizeof(*p) || p->nready > p->nhit)
        return -EPROTO;
    *rep = *p;
    return 0;
}

/* Waits for the hits of l still being read; trims l to the leading ready hits once no read
 * is left. Returns the leading ready hits. Caller holds c->mu. */
static int kvc_lease_wait_locked(kvc_lease *l, uint32_t timeout_ms)
{
    kvc_client *c = l->ns->c;
    size_t ready = 0, first = 0;
    bool pending = false;
    for (size_t k = 0; k < l->nids; k++) {
        struct kvc_wait_rep rep;
        size_t nk = 0;
        bool any = false;
        for (size_t i = first; i < l->n && l->hits[i].chunk == k; i++, nk++)
            any |= !l->hits[i].ready;
        if (any) {
            int rc = kvc_wait_id(c, l->ids[k], timeout_ms, &rep);
            if (rc)
                return rc;
            for (size_t i = 0; i < nk; i++)
                l->hits[first + i].ready = i < rep.nready;
            if (rep.pending)
                pending = true;
        }
        first += nk;
    }
    while (ready < l->n && l->hits[ready].ready)
        ready++;
    /* A read that failed (checksum, I/O) ends the prefix: what follows is a miss. */
    if (!pending)
        l->n = ready;
    return (int)ready;
}

/* Tries of a window's or a state's lookup whose reads failed, the last of the local tiers. */
#define KVC_LOOKUP_SPAN_TRIES 4

KVC_API int kvc_lookup(kvc_ns *ns, const struct kvc_key *keys, size_t n, unsigned flags,
                       kvc_lease **out)
{
    kvc_client *c;
    kvc_lease *l;
    int rc = 0;
    if (!ns || !out || (!keys && n) ||
        (flags & ~(KVC_LOOKUP_READY_ONLY | KVC_LOOKUP_NOWAIT | KVC_LOOKUP_GPU)))
        return -EINVAL;
    *out = NULL;
    if (n == 0)
        return 0;
    if (n > (size_t)KVC_LEASE_MAX_CHUNKS * KVC_PROTO_MAX_KEYS)
        return -E2BIG;
    /* A window's or a state's span is found over every key at once: one request. */
    bool span = ns->layout.kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW ||
                ns->layout.kv_kind == KVC_WIRE_KV_KIND_STATE;
    uint32_t tries = 0, local = 0; /* KVC_LOOKUP_F_LOCAL on the last try of a span */
    bool window = ns->layout.kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW;
    size_t w = window ? kvc_wire_window_blocks(&ns->layout) : 1, end;
    c = ns->c;
    l = calloc(1, sizeof(*l) + n * sizeof(l->hits[0]));
    if (!l)
        return -ENOMEM;
    l->ns = ns;
    pthread_mutex_lock(&c->mu);
again:
    end = n;
    for (size_t done = 0; done < n;) {
        uint32_t chunk = n - done > KVC_PROTO_MAX_KEYS ? KVC_PROTO_MAX_KEYS : (uint32_t)(n - done);
        size_t at = done;
        struct kvc_lookup_req *q = kvci_req(c);
        uint32_t len;
        if (span) {
            /* A window's or a state's span is searched from the end: keys[at..end), the
             * last ones whose prefixes are not judged yet; a window's judged where all its
             * blocks are among them (base: their position). */
            at = end > KVC_PROTO_MAX_KEYS ? end - KVC_PROTO_MAX_KEYS : 0;
            chunk = (uint32_t)(end - at);
        }
        memset(q, 0, sizeof(*q));
        q->ns_id = ns->id;
        q->nkeys = chunk;
        q->base = window ? (uint32_t)at : 0;
        q->flags = (flags & KVC_LOOKUP_READY_ONLY) ? KVC_LOOKUP_F_READY_ONLY : 0;
        if (flags & KVC_LOOKUP_NOWAIT) /* the daemon holds the answer for nothing either */
            q->flags |= KVC_LOOKUP_F_NOWAIT;
        if ((flags & KVC_LOOKUP_GPU) && c->gpu_base) /* else host locations only */
            q->flags |= KVC_LOOKUP_F_GPU;
        q->flags |= local;
        memcpy(q + 1, keys + at, chunk * sizeof(struct kvc_key));
        rc = kvci_call(c, KVC_OP_LOOKUP, (uint32_t)(sizeof(*q) + chunk * sizeof(struct kvc_key)),
                       NULL);
        if (rc)
            break;
        const struct kvc_lookup_rep *p = kvci_rep(c, &len);
        if (len < sizeof(*p) || p->nhit > chunk ||
            len != sizeof(*p) + (size_t)p->nhit * sizeof(struct kvc_wire_loc) ||
            (p->nhit > 0) != (p->lease_id != 0) || (p->first && !span) ||
            p->first > chunk - p->nhit) {
            rc = -EPROTO;
            break;
        }
        l->first = at + p->first;
        if (p->lease_id)
            l->ids[l->nids++] = p->lease_id;
        const struct kvc_wire_loc *locs = (const struct kvc_wire_loc *)(p + 1);
        for (uint32_t i = 0; i < p->nhit; i++) {
            uint8_t *ptr = kvci_loc_ptr(ns, &locs[i]);
            if (!ptr) {
                rc = -EPROTO;
                break;
            }
            if (locs[i].format >= KVC_WIRE_FORMAT_COUNT) {
                rc = -EPROTO;
                break;
            }
            l->hits[l->n++] = (struct kvc_hit){
                .data = ptr,
                .len = locs[i].format == KVC_WIRE_FORMAT_RAW ? ns->block_bytes : locs[i].length,
                .format = locs[i].format,
                .tier = locs[i].tier,
                .chunk = (uint32_t)(l->nids - 1),
                .ready = (locs[i].flags & KVC_LOC_F_READY) != 0};
        }
        if (span && !rc && !p->nhit && at > 0) {
            /* None there: the prefixes left end before at + w (a window reaching before
             * keys[at]) or at at (a state); w <= KVC_PROTO_MAX_WINDOW_BLOCKS, so each
             * request moves the end back by more than half a request. */
            end = at + w - 1;
            continue;
        }
        if (rc || p->nhit < chunk || span)
            break;
        done += chunk;
    }
    /* Unless asked not to, hits read from disk are waited for here, so that every hit
     * handed out is readable. */
    if (rc == 0 && !(flags & KVC_LOOKUP_NOWAIT) && l->n) {
        size_t asked = l->n;
        int r = kvc_lease_wait_locked(l, KVC_LOOKUP_WAIT_MS);
        if (r < 0) {
            rc = r;
        } else if (span && l->n < asked) {
            /* A read of a window's or a state's span failed (not in the remote tier after
             * all, a record refused, a checksum): what is left is no prefix's span. Asked
             * again: the daemon knows those keys missing now and answers a shorter prefix;
             * the last try of the local tiers alone. */
            if (!c->dead)
                kvc_release_ids(c, l->ids, l->nids, 0, false);
            l->n = l->nids = l->first = 0;
            if (!local) {
                local = ++tries < KVC_LOOKUP_SPAN_TRIES ? 0 : KVC_LOOKUP_F_LOCAL;
                goto again;
            }
        }
    }
    if ((rc || l->n == 0) && l->nids && !c->dead)
        kvc_release_ids(c, l->ids, l->nids, 0, false);
    pthread_mutex_unlock(&c->mu);
    if (rc || l->n == 0) {
        free(l);
        return rc;
    }
    *out = l;
    return (int)l->n;
}

KVC_API int kvc_hint(kvc_ns *ns, unsigned kind, const struct kvc_key *keys, const float *scores,
                     size_t n)
{
    kvc_client *c;
    uint32_t len;
    int rc;
    if (!ns || (kind != KVC_HINT_ATTENTION && kind != KVC_HINT_SNAPKV) ||
        (n && (!keys || !scores)) || n > KVC_HINT_MAX)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!(scores[i] >= 0) || scores[i] > 3.4e38f)
            return -EINVAL;
    if (n == 0)
        return 0;
    c = ns->c;
    pthread_mutex_lock(&c->mu);
    struct kvc_hint_req *q = kvci_req(c);
    struct kvc_wire_hint *h = (struct kvc_wire_hint *)(q + 1);
    *q = (struct kvc_hint_req){.ns_id = ns->id,
                               .kind = kind == KVC_HINT_ATTENTION ? KVC_HINT_H2O : KVC_HINT_SNAPKV,
                               .nhints = (uint32_t)n};
    for (size_t i = 0; i < n; i++) {
        memcpy(&h[i].key, &keys[i], sizeof(h[i].key));
        h[i].score = scores[i];
        h[i].pad = 0;
    }
    rc = kvci_call(c, KVC_OP_HINT, (uint32_t)(sizeof(*q) + n * sizeof(*h)), NULL);
    if (rc == 0) {
        const struct kvc_hint_rep *p = kvci_rep(c, &len);
        rc = len == sizeof(*p) && p->applied <= n ? (int)p->applied : -EPROTO;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

_Static_assert(KVC_HINT_HEADS_MAX == KVC_PROTO_MAX_HINT_HEADS, "one bound at both ends");
_Static_assert(KVC_HINT_SCORE_MAX == KVC_PROTO_MAX_HINT_SCORE, "one bound at both ends");

KVC_API int kvc_hint_heads(kvc_ns *ns, unsigned kind, const struct kvc_key *keys,
                           const float *scores, size_t n, unsigned layers, unsigned heads)
{
    kvc_client *c;
    uint32_t len;
    size_t lh = (size_t)layers * heads, per, done = 0;
    int rc = 0, applied = 0;
    if (!ns || (kind != KVC_HINT_ATTENTION && kind != KVC_HINT_SNAPKV) ||
        (n && (!keys || !scores)) || n > KVC_HINT_MAX || !layers || !heads ||
        lh > KVC_HINT_HEADS_MAX)
        return -EINVAL;
    for (size_t i = 0; i < n * lh; i++)
        if (!(scores[i] >= 0) || scores[i] > KVC_HINT_SCORE_MAX)
            return -EINVAL;
    /* blocks per request: the keys and their scores within one message */
    per = (KVC_PROTO_MAX_MSG - sizeof(struct kvc_msg_hdr) - sizeof(struct kvc_hint_heads_req)) /
          (sizeof(struct kvc_wire_key) + lh * sizeof(float));
    c = ns->c;
    pthread_mutex_lock(&c->mu);
    while (done < n && rc == 0) {
        size_t m = n - done < per ? n - done : per;
        struct kvc_hint_heads_req *q = kvci_req(c);
        struct kvc_wire_key *k = (struct kvc_wire_key *)(q + 1);
        *q = (struct kvc_hint_heads_req){.ns_id = ns->id,
                                         .kind = kind == KVC_HINT_ATTENTION ? KVC_HINT_H2O
                                                                            : KVC_HINT_SNAPKV,
                                         .nhints = (uint32_t)m,
                                         .layers = layers,
                                         .heads = heads};
        memcpy(k, keys + done, m * sizeof(*k));
        memcpy(k + m, scores + done * lh, m * lh * sizeof(float));
        rc = kvci_call(c, KVC_OP_HINT_HEADS,
                       (uint32_t)(sizeof(*q) + m * sizeof(*k) + m * lh * sizeof(float)), NULL);
        if (rc == 0) {
            const struct kvc_hint_rep *p = kvci_rep(c, &len);
            if (len != sizeof(*p) || p->applied > m)
                rc = -EPROTO;
            else
                applied += (int)p->applied;
        }
        done += m;
    }
    pthread_mutex_unlock(&c->mu);
    return rc < 0 ? rc : applied;
}

/* Policy numbers of LOOKUP_BUDGET: the daemon's order (kvcctl policy). */
static const char *const kvc_policy_names[] = {"lru",    "lfu",     "prefix", "streaming", "h2o",
                                               "snapkv", "keynorm", "quest",  "default",   "vatp"};

_Static_assert(KVC_HEAD_UNKNOWN == KVC_WIRE_HEAD_UNKNOWN && KVC_HEAD_SINK == KVC_WIRE_HEAD_SINK &&
                   KVC_HEAD_LOCAL == KVC_WIRE_HEAD_LOCAL && KVC_HEAD_FULL == KVC_WIRE_HEAD_FULL,
               "head categories are the wire's");

/* kvc_lookup_budget and kvc_lookup_budget_heads: flags 0 or KVC_BUDGET_F_HEADS (then pos holds
 * n entries and heads, when not NULL, gets the profile). */
static int kvc_lookup_budget_flags(kvc_ns *ns, const struct kvc_key *keys, size_t n,
                                   const struct kvc_budget *b, uint32_t flags, size_t *pos,
                                   unsigned char *heads, size_t *nprefix, kvc_lease **out)
{
    kvc_client *c;
    kvc_lease *l = NULL;
    uint32_t policy = KVC_POLICY_NS, len;
    size_t lh, most;
    int rc;
    if (out)
        *out = NULL;
    if (nprefix)
        *nprefix = 0;
    if (!ns || !b || !out || !pos || (!keys && n) || b->budget == 0 || n > KVC_PROTO_MAX_KEYS ||
        (b->query_dim && (!b->query || b->query_dim != ns->layout.head_dim)))
        return -EINVAL;
    if (b->policy) {
        for (policy = 0; policy < sizeof(kvc_policy_names) / sizeof(kvc_policy_names[0]); policy++)
            if (strcmp(b->policy, kvc_policy_names[policy]) == 0)
                break;
        if (policy == sizeof(kvc_policy_names) / sizeof(kvc_policy_names[0]))
            return -EINVAL;
    }
    if (n == 0)
        return 0;
    lh = flags ? (size_t)ns->layout.layers * ns->layout.kv_heads : 0;
    most = flags ? n : b->budget; /* what the selection may hold */
    c = ns->c;
    pthread_mutex_lock(&c->mu);
    struct kvc_lookup_budget_req *q = kvci_req(c);
    *q = (struct kvc_lookup_budget_req){
        .ns_id = ns->id,
        .nkeys = (uint32_t)n,
        .flags = flags,
        .budget = b->budget > KVC_PROTO_MAX_KEYS ? KVC_PROTO_MAX_KEYS : (uint32_t)b->budget,
        .policy = policy,
        .qdim = (uint32_t)b->query_dim,
        .sinks = b->sinks,
        .recent = b->recent};
    memcpy(q + 1, keys, n * sizeof(struct kvc_wire_key));
    if (b->query_dim)
        memcpy((struct kvc_wire_key *)(q + 1) + n, b->query, b->query_dim * sizeof(float));
    rc = kvci_call(
        c, KVC_OP_LOOKUP_BUDGET,
        (uint32_t)(sizeof(*q) + n * sizeof(struct kvc_wire_key) + b->query_dim * sizeof(float)),
        NULL);
    if (rc)
        goto out;
    const struct kvc_lookup_budget_rep *p = kvci_rep(c, &len);
    const struct kvc_wire_sel *sel = (const struct kvc_wire_sel *)(p + 1);
    if (len < sizeof(*p) || p->nsel > most || p->nsel > p->nprefix || p->nprefix > n ||
        len != sizeof(*p) + (size_t)p->nsel * sizeof(*sel) + lh ||
        (p->nsel > 0) != (p->lease_id != 0)) {
        rc = -EPROTO;
        goto out;
    }
    if (heads)
        memcpy(heads, (const unsigned char *)(sel + p->nsel), lh);
    if (nprefix)
        *nprefix = p->nprefix;
    if (p->nsel == 0)
        goto out;
    l = calloc(1, sizeof(*l) + p->nsel * sizeof(l->hits[0]));
    if (!l) {
        kvc_release_ids(c, &p->lease_id, 1, 0, false);
        rc = -ENOMEM;
        goto out;
    }
    l->ns = ns;
    l->ids[l->nids++] = p->lease_id;
    for (uint32_t i = 0; i < p->nsel; i++) {
        uint8_t *ptr = kvci_loc_ptr(ns, &sel[i].loc);
        if (!ptr || sel[i].loc.format >= KVC_WIRE_FORMAT_COUNT || sel[i].pos >= p->nprefix ||
            (i && sel[i].pos <= sel[i - 1].pos)) {
            rc = -EPROTO;
            break;
        }
        pos[i] = sel[i].pos;
        l->hits[l->n++] = (struct kvc_hit){
            .data = ptr,
            .len = sel[i].loc.format == KVC_WIRE_FORMAT_RAW ? ns->block_bytes : sel[i].loc.length,
            .format = sel[i].loc.format,
            .tier = sel[i].loc.tier,
            .chunk = 0,
            .ready = (sel[i].loc.flags & KVC_LOC_F_READY) != 0};
    }
    if (rc) {
        kvc_release_ids(c, l->ids, l->nids, 0, false);
        free(l);
        l = NULL;
        goto out;
    }
    *out = l;
    rc = (int)l->n;
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}

KVC_API int kvc_lookup_budget(kvc_ns *ns, const struct kvc_key *keys, size_t n,
                              const struct kvc_budget *b, size_t *pos, size_t *nprefix,
                              kvc_lease **out)
{
    return kvc_lookup_budget_flags(ns, keys, n, b, 0, pos, NULL, nprefix, out);
}

KVC_API int kvc_lookup_budget_heads(kvc_ns *ns, const struct kvc_key *keys, size_t n,
                                    const struct kvc_budget *b, size_t *pos, unsigned char *heads,
                                    size_t *nprefix, kvc_lease **out)
{
    if (out)
        *out = NULL;
    if (nprefix)
        *nprefix = 0;
    if (!ns || (size_t)ns->layout.layers * ns->layout.kv_heads > KVC_HINT_HEADS_MAX)
        return -EINVAL;
    return kvc_lookup_budget_flags(ns, keys, n, b, KVC_BUDGET_F_HEADS, pos, heads, nprefix, out);
}

KVC_API int kvc_lease_ready(const kvc_lease *l)
{
    size_t i = 0;
    if (!l)
        return -EINVAL;
    while (i < l->n && l->hits[i].ready)
        i++;
    return (int)i;
}

KVC_API int kvc_lease_wait(kvc_lease *l, unsigned timeout_ms)
{
    kvc_client *c;
    int rc;
    if (!l)
        return -EINVAL;
    c = l->ns->c;
    pthread_mutex_lock(&c->mu);
    rc = kvc_lease_wait_locked(l, timeout_ms);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

KVC_API size_t kvc_lease_count(const kvc_lease *l)
{
    return l ? l->n : 0;
}

KVC_API size_t kvc_lease_first(const kvc_lease *l)
{
    return l ? l->first : 0;
}

KVC_API const void *kvc_lease_data(const kvc_lease *l, size_t i)
{
    return l && i < l->n ? l->hits[i].data : NULL;
}

KVC_API int kvc_lease_copy(const kvc_lease *l, size_t i, void *dst, size_t len)
{
    if (!l || !dst)
        return -EINVAL;
    if (i >= l->n)
        return -ERANGE;
    if (len < l->ns->block_bytes)
        return -EINVAL;
    uint64_t t0 = kvc_mono_ns();
    if (l->hits[i].tier == KVC_WIRE_TIER_GPU && l->hits[i].format == KVC_WIRE_FORMAT_RAW) {
        int grc =
            l->ns->c->gpu_hooks->copy_sync(l->ns->c, dst, l->hits[i].data, l->ns->block_bytes);
        kvc_lease_account(l, t0);
        return grc;
    }
    if (l->hits[i].format == KVC_WIRE_FORMAT_RAW) {
        kvci_copy_from_arena(dst, l->hits[i].data, l->ns->block_bytes);
        kvc_lease_account(l, t0);
        return 0;
    }
    /* Writers of the arena can change these bytes while we read them: the header and
     * section table are checked and then used, so they are parsed from a private copy. */
    struct kern_layout kl;
    size_t n = l->hits[i].len;
    void *priv = malloc(n ? n : 1);
    if (!priv)
        return -ENOMEM;
    memcpy(priv, l->hits[i].data, n);
    kvc_kern_layout(l->ns, &kl);
    int64_t rc = kern_decode_cpu(&kl, priv, n, dst, len, (enum kern_dtype)kl.dtype);
    free(priv);
    kvc_lease_account(l, t0);
    return rc < 0 ? (int)rc : 0;
}

KVC_API int kvc_lease_stored(const kvc_lease *l, size_t i, const void **data, size_t *len)
{
    if (!l || !data || !len)
        return -EINVAL;
    if (i >= l->n)
        return -ERANGE;
    *data = l->hits[i].data;
    *len = l->hits[i].len;
    if (l->hits[i].format != KVC_WIRE_FORMAT_RAW) {
        int64_t n = kern_block_info(l->hits[i].data, l->hits[i].len, NULL, NULL);
        if (n > 0)
            *len = (size_t)n;
    }
    return l->hits[i].format;
}

KVC_API int kvc_lease_copy_cuda(const kvc_lease *l, size_t i, void *dst_dev, size_t len,
                                void *stream)
{
    struct kern_layout kl;
    void *scratch = NULL;
    int rc;
    if (!l || !dst_dev)
        return -EINVAL;
    if (i >= l->n)
        return -ERANGE;
    if (len < l->ns->block_bytes)
        return -EINVAL;
    /* A raw hit from an attached client is queued and tracked on the lease (kvc_release
     * waits for it); a pool hit is device memory, so the copy is device to device. The
     * lease's record of queued work is the only state that changes. */
    if (l->hits[i].format == KVC_WIRE_FORMAT_RAW && l->ns->c->gpu_hooks)
        return l->ns->c->gpu_hooks->lease_copy(
            (kvc_lease *)l, i, dst_dev,
            l->hits[i].tier == KVC_WIRE_TIER_GPU ? KERN_DEV_COPY_D2D : KERN_DEV_COPY_H2D, stream);
    if (l->ns->c->gpu_hooks && l->hits[i].tier != KVC_WIRE_TIER_GPU)
        return l->ns->c->gpu_hooks->lease_decode((kvc_lease *)l, i, dst_dev, stream);
    if (l->hits[i].tier == KVC_WIRE_TIER_GPU)
        return -ENOTSUP; /* only an attached client has pool hits */
    if (!(kern_supports() & KERN_SUPPORT_CUDA_BUILT))
        return -ENOTSUP;
    if (l->hits[i].format == KVC_WIRE_FORMAT_RAW) {
        /* Nothing tracks it on the lease: it has landed before the call returns. */
        rc = kern_cuda_copy(dst_dev, l->hits[i].data, l->ns->block_bytes, KERN_CUDA_H2D, stream);
        return rc ? rc : kern_cuda_stream_sync(stream);
    }
    /* the stored (2-4x smaller) block crosses PCIe, the GPU dequantizes it */
    size_t n = l->hits[i].len;
    kvc_kern_layout(l->ns, &kl);
    rc = kern_cuda_alloc(&scratch, n);
    if (rc)
        goto out;
    rc = kern_cuda_copy(scratch, l->hits[i].data, n, KERN_CUDA_H2D, stream);
    if (rc)
        goto out;
    const uint32_t fmt = l->hits[i].format;
    int64_t d = kern_decode_cuda(&kl, scratch, n, dst_dev, len, (enum kern_dtype)kl.dtype,
                                 fmt < 32 ? 1u << fmt : 0, stream);
    rc = d < 0 ? (int)d : kern_cuda_stream_sync(stream);
out:
    kern_cuda_free(scratch);
    return rc;
}

KVC_API int kvc_release(kvc_lease *l)
{
    kvc_client *c;
    int rc;
    if (!l)
        return 0;
    c = l->ns->c;
    int wrc = 0;
    if (l->gpu.nev || l->gpu.scratch || l->gpu.err) /* copies out of the pins first */
        wrc = c->gpu_hooks->wait(c, &l->gpu);
    pthread_mutex_lock(&c->mu);
    rc = l->nids
             ? kvc_release_ids(c, l->ids, l->nids, __atomic_load_n(&l->load_ns, __ATOMIC_RELAXED),
                               true)
             : 0;
    pthread_mutex_unlock(&c->mu);
    free(l);
    return wrc ? wrc : rc;
}

/* ---- whole prefixes ------------------------------------------------------------------- */

KVC_API int kvc_get_prefix(kvc_ns *ns, const struct kvc_key *keys, size_t n, void *const *dst)
{
    kvc_lease *l;
    int hits;
    size_t fast;
    if ((!dst && n) || !ns || (!keys && n))
        return -EINVAL;
    if (n > (size_t)KVC_LEASE_MAX_CHUNKS * KVC_PROTO_MAX_KEYS)
        return -E2BIG;
    if (ns->layout.kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW ||
        ns->layout.kv_kind == KVC_WIRE_KV_KIND_STATE) {
        /* A span, not a run from keys[0]: the daemon finds it (no shared-index walk). */
        hits = kvc_lookup(ns, keys, n, 0, &l);
        if (hits <= 0)
            return hits;
        size_t first = l->first;
        for (int i = 0; i < hits; i++)
            if (kvc_lease_copy(l, (size_t)i, dst[first + i], l->ns->block_bytes) < 0) {
                hits = i;
                break;
            }
        kvc_release(l);
        return hits ? (int)(first + (size_t)hits) : 0;
    }
    /* The leading hits through the shared index, the rest (if any) through the socket. */
    fast = kvci_fast_get(ns, keys, n, dst);
    if (fast == n)
        return (int)fast;
    hits = kvc_lookup(ns, keys + fast, n - fast, 0, &l);
    if (hits <= 0)
        return fast ? (int)fast : hits;
    for (int i = 0; i < hits; i++) /* each copy adds its time to the lease */
        if (kvc_lease_copy(l, (size_t)i, dst[fast + i], l->ns->block_bytes) < 0) {
            hits = i; /* what could not be decoded is a miss */
            break;
        }
    kvc_release(l);
    return (int)fast + hits;
}
