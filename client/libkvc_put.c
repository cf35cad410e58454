/*
 * libkvc_put.c — libkvc's writes: reservations (kvc_reserve, the slot calls, kvc_commit,
 * kvc_abort), layer-wise puts, kvc_put_prefix and kvc_flush.
 *
 * DESIGN
 * A put is reserve (the daemon dedups: a key already present gets no slot) → the client
 * writes its slots in the arena → commit makes them visible; nothing uncommitted is ever
 * seen. kvc_put_prefix sends its COMMIT without waiting for the reply (kvci_send_nowait,
 * libkvc.c's DESIGN): a failed commit is kept in the client and reported by the next put or
 * kvc_flush, so a put costs one round trip.
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

/* ---- writing -------------------------------------------------------------------------- */

KVC_API int kvc_reserve(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                        size_t n, kvc_resv **out)
{
    return kvci_reserve_flags(ns, parent, keys, n, 0, out);
}

/* ABORT of reservation id. Caller holds c->mu. */
static int kvc_abort_id(kvc_client *c, uint64_t id)
{
    struct kvc_abort_req *q = kvci_req(c);
    q->resv_id = id;
    return kvci_call(c, KVC_OP_ABORT, sizeof(*q), NULL);
}

/* kvci_reserve_flags with c->mu held by the caller; *out NULL on error. */
static int kvc_reserve_locked(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                              size_t n, uint32_t flags, kvc_resv **out)
{
    kvc_client *c = ns->c;
    kvc_resv *r;
    uint32_t len;
    int rc;
    *out = NULL;
    r = calloc(1, sizeof(*r) + n * sizeof(r->slots[0]));
    if (!r)
        return -ENOMEM;
    r->ns = ns;
    r->n = n;
    struct kvc_reserve_req *q = kvci_req(c);
    memset(q, 0, sizeof(*q));
    q->ns_id = ns->id;
    q->flags = c->gpu_base ? flags & KVC_RESERVE_F_GPU : 0;
    q->nkeys = (uint32_t)n;
    if (parent) {
        q->parent.lo = parent->lo;
        q->parent.hi = parent->hi;
    }
    memcpy(q + 1, keys, n * sizeof(struct kvc_key));
    rc = kvci_call(c, KVC_OP_RESERVE, (uint32_t)(sizeof(*q) + n * sizeof(struct kvc_key)), NULL);
    if (rc)
        goto out;
    const struct kvc_reserve_rep *p = kvci_rep(c, &len);
    const struct kvc_wire_slot_rep *slots = (const struct kvc_wire_slot_rep *)(p + 1);
    if (len < sizeof(*p) || p->nkeys != n ||
        len != sizeof(*p) + n * sizeof(struct kvc_wire_slot_rep) || p->nreserved > n ||
        (p->nreserved > 0) != (p->resv_id != 0)) {
        rc = -EPROTO;
        goto out;
    }
    r->id = p->resv_id;
    for (size_t i = 0; i < n; i++) {
        r->slots[i].status = slots[i].status;
        if (slots[i].status < KVC_SLOT_PRESENT || slots[i].status > KVC_SLOT_NOSPACE) {
            rc = -EPROTO;
            break;
        }
        if (slots[i].status == KVC_SLOT_RESERVED) {
            r->slots[i].tier = slots[i].loc.tier;
            if ((slots[i].loc.tier == KVC_WIRE_TIER_HOST && !c->arenas[ns->arena].writable) ||
                (slots[i].loc.tier == KVC_WIRE_TIER_GPU && !(q->flags & KVC_RESERVE_F_GPU)) ||
                !(r->slots[i].data = kvci_loc_ptr(ns, &slots[i].loc))) {
                rc = -EPROTO;
                break;
            }
            r->nreserved++;
        }
    }
    if (rc == 0 && r->nreserved != p->nreserved)
        rc = -EPROTO;
    if (rc && r->id && !c->dead)
        kvc_abort_id(c, r->id);
out:
    if (rc) {
        free(r);
        return rc;
    }
    *out = r;
    return (int)r->nreserved;
}

int kvci_reserve_flags(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                       size_t n, uint32_t flags, kvc_resv **out)
{
    int rc;
    if (!ns || !out || (!keys && n))
        return -EINVAL;
    *out = NULL;
    if (n == 0) {
        /* Nothing left to write (a prefix wholly cached): an empty reservation and no round
         * trip, as kvc_lookup of no keys, so that a caller needs no special case. */
        *out = calloc(1, sizeof(**out));
        if (!*out)
            return -ENOMEM;
        (*out)->ns = ns;
        return 0;
    }
    if (n > KVC_PROTO_MAX_KEYS)
        return -E2BIG;
    pthread_mutex_lock(&ns->c->mu);
    rc = kvc_reserve_locked(ns, parent, keys, n, flags, out);
    pthread_mutex_unlock(&ns->c->mu);
    return rc;
}

KVC_API int kvc_resv_status(const kvc_resv *r, size_t i)
{
    if (!r)
        return -EINVAL;
    return i < r->n ? r->slots[i].status : -ERANGE;
}

KVC_API void *kvc_resv_data(kvc_resv *r, size_t i)
{
    return r && i < r->n ? r->slots[i].data : NULL;
}

KVC_API int kvc_resv_write(kvc_resv *r, size_t i, const void *src, size_t len)
{
    if (!r || !src)
        return -EINVAL;
    if (i >= r->n)
        return -ERANGE;
    if (!r->slots[i].data || len != r->ns->block_bytes)
        return -EINVAL;
    if (r->slots[i].tier == KVC_WIRE_TIER_GPU) {
        int rc = r->ns->c->gpu_hooks->copy_sync(r->ns->c, r->slots[i].data, src, len);
        return rc ? rc : kvci_resv_layers_mark(r, i, 1, 0, r->ns->layout.layers);
    }
    kvci_copy_to_arena(r->slots[i].data, src, len);
    return kvci_resv_layers_mark(r, i, 1, 0, r->ns->layout.layers);
}

/* ---- layer-wise puts ---------------------------------------------------------------------
 * A slot may be written layer by layer (kvc_resv_gather_layers). Nothing is tracked until a
 * gather writes only some layers of a slot; from then on each slot of the reservation has a
 * bitmap of the layers written, and kvc_commit() refuses (-EBUSY, nothing done) to publish a
 * slot some of whose layers were written and others not: its bytes would mix this put's
 * layers with whatever the slot held before. */

int kvci_resv_layers_mark(kvc_resv *r, size_t first, size_t n, uint32_t lf, uint32_t lc)
{
    kvc_client *c = r->ns->c;
    const uint32_t layers = r->ns->layout.layers;
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    if (!r->layer_bits && lc < layers) {
        r->layer_words = (layers + 63) / 64;
        r->layer_bits = calloc(r->n ? r->n : 1, r->layer_words * sizeof(uint64_t));
        if (!r->layer_bits)
            rc = -ENOMEM;
    }
    for (size_t j = first; rc == 0 && r->layer_bits && j < first + n; j++) {
        if (!r->slots[j].data)
            continue;
        uint64_t *bits = r->layer_bits + j * r->layer_words;
        for (uint32_t x = lf; x < lf + lc; x++)
            bits[x / 64] |= 1ull << (x % 64);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* 1 when a slot among the first n reserved ones has some layers written and not all. */
static int kvc_resv_partial(kvc_resv *r, size_t n)
{
    const uint32_t layers = r->ns->layout.layers;
    int partial = 0;
    pthread_mutex_lock(&r->ns->c->mu);
    for (size_t j = 0, k = 0; r->layer_bits && j < r->n && k < n && !partial; j++) {
        if (!r->slots[j].data)
            continue;
        k++;
        const uint64_t *bits = r->layer_bits + j * r->layer_words;
        uint32_t set = 0;
        for (uint32_t w = 0; w < r->layer_words; w++)
            set += (uint32_t)__builtin_popcountll(bits[w]);
        partial = set != 0 && set != layers;
    }
    pthread_mutex_unlock(&r->ns->c->mu);
    return partial;
}

KVC_API int kvc_commit(kvc_resv *r, size_t n)
{
    kvc_client *c;
    uint32_t len;
    int rc;
    if (!r)
        return -EINVAL;
    c = r->ns->c;
    if (kvc_resv_partial(r, n))
        return -EBUSY; /* a slot written layer by layer, not all its layers yet */
    if (r->gpu.nev || r->gpu.scratch || r->gpu.err) {
        /* The bytes land before commit; a copy or kernel that faulted publishes nothing. */
        int wrc = c->gpu_hooks->wait(c, &r->gpu);
        if (wrc) {
            kvc_abort(r);
            return wrc;
        }
    }
    if (!r->id) {
        free(r->layer_bits);
        free(r);
        return 0;
    }
    pthread_mutex_lock(&c->mu);
    struct kvc_commit_req *q = kvci_req(c);
    memset(q, 0, sizeof(*q));
    q->resv_id = r->id;
    q->ncommit = n >= UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    rc = kvci_call(c, KVC_OP_COMMIT, sizeof(*q), NULL);
    if (rc == 0) {
        const struct kvc_commit_rep *p = kvci_rep(c, &len);
        rc = len == sizeof(*p) ? (int)p->committed : -EPROTO;
    }
    pthread_mutex_unlock(&c->mu);
    if (rc == -EAGAIN)
        return rc; /* its parent's reservation commits first: the daemon kept it, r is ours */
    free(r->layer_bits);
    free(r);
    return rc;
}

KVC_API int kvc_abort(kvc_resv *r)
{
    kvc_client *c;
    int rc = 0;
    if (!r)
        return 0;
    if (r->gpu.nev || r->gpu.scratch || r->gpu.err)
        r->ns->c->gpu_hooks->wait(r->ns->c, &r->gpu);
    if (r->id) {
        c = r->ns->c;
        pthread_mutex_lock(&c->mu);
        rc = kvc_abort_id(c, r->id);
        pthread_mutex_unlock(&c->mu);
    }
    free(r->layer_bits);
    free(r);
    return rc;
}

/* The failure kept from a request sent without waiting, cleared: 0 if none. c->mu held. */
static int kvc_defer_err_take(kvc_client *c)
{
    int err = c->defer_err;
    c->defer_err = 0;
    return err;
}

/*
 * A put is a RESERVE round trip for the whole prefix (one per KVC_PROTO_MAX_KEYS keys), the
 * copies, and a COMMIT whose reply no one waits for here: the next call on the client reads
 * it (the daemon answers a connection in order, so it comes before that call's own reply).
 * The daemon also handles the connection's requests in order, so every later request of
 * this client finds the blocks committed, and a chunk's RESERVE can hang from the chunk
 * before it. A failed commit is kept (kvc_defer_fail) and reported by the next put or
 * kvc_flush(): a put reports one of an earlier call before it does anything (it stores
 * nothing then), and one of its own earlier chunk (read with the next chunk's RESERVE) by
 * returning the blocks stored before that chunk.
 */
KVC_API int kvc_put_prefix(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                           size_t n, const void *const *blocks)
{
    kvc_client *c;
    uint64_t tag;
    int written = 0, rc;
    if (!ns || (!keys && n) || (!blocks && n))
        return -EINVAL;
    c = ns->c;
    pthread_mutex_lock(&c->mu);
    kvci_defer_drain(c, false); /* replies already here: a failure among them is reported now */
    rc = kvc_defer_err_take(c);
    tag = ++c->put_calls;
    pthread_mutex_unlock(&c->mu);
    if (rc)
        return rc;
    /* One reservation per chunk; a chunk is committed before the next one hangs from it. */
    for (size_t done = 0; done < n;) {
        size_t chunk = n - done > KVC_PROTO_MAX_KEYS ? KVC_PROTO_MAX_KEYS : n - done;
        const struct kvc_key *par = done ? &keys[done - 1] : parent;
        kvc_resv *r;
        pthread_mutex_lock(&c->mu);
        rc = kvc_reserve_locked(ns, par, keys + done, chunk, 0, &r);
        /* The RESERVE's reply came after those of the commits before it: one of them failed
         * (this call's previous chunk, or, before this call stored anything, an earlier
         * call's)? */
        if (c->defer_err && (c->defer_err_tag == tag || written == 0)) {
            if (c->defer_err_tag == tag)
                written -= (int)c->defer_err_blocks;
            int err = kvc_defer_err_take(c);
            if (r && r->id && !c->dead)
                kvc_abort_id(c, r->id);
            pthread_mutex_unlock(&c->mu);
            free(r);
            return written > 0 ? written : err;
        }
        pthread_mutex_unlock(&c->mu);
        if (rc < 0)
            return written ? written : rc;
        for (size_t i = 0; i < chunk; i++)
            if (r->slots[i].status == KVC_SLOT_RESERVED)
                kvci_copy_to_arena(r->slots[i].data, blocks[done + i], ns->block_bytes);
        bool complete = r->slots[chunk - 1].status == KVC_SLOT_PRESENT ||
                        r->slots[chunk - 1].status == KVC_SLOT_RESERVED;
        if (r->id) {
            pthread_mutex_lock(&c->mu);
            rc = kvci_defer_room(c);
            if (rc == 0) {
                struct kvc_commit_req *q = kvci_req(c);
                *q = (struct kvc_commit_req){
                    .resv_id = r->id, .ncommit = UINT32_MAX, .flags = KVC_COMMIT_F_QUIET};
                rc = kvci_send_nowait(c, KVC_OP_COMMIT, sizeof(*q), true, (uint32_t)r->nreserved,
                                      tag);
            }
            pthread_mutex_unlock(&c->mu);
            if (rc < 0) {
                free(r);
                return written ? written : rc;
            }
            written += (int)r->nreserved;
        }
        free(r);
        if (!complete)
            break; /* busy elsewhere or no room: the rest has no cached parent */
        done += chunk;
    }
    return written;
}

KVC_API int kvc_flush(kvc_client *c)
{
    int rc;
    if (!c)
        return -EINVAL;
    pthread_mutex_lock(&c->mu);
    rc = kvci_defer_settle(c);
    int err = kvc_defer_err_take(c);
    pthread_mutex_unlock(&c->mu);
    return err ? err : rc;
}
