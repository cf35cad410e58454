/*
 * server_fast.c — the fast path's hit rings (client/kvc_fast.h): a client that took hits
 * through the shared index (daemon/fast.c) reports them in its ring; the server reads them in
 * bounded steps and counts them as LOOKUP would.
 *
 * DESIGN
 * Loop thread only. Rings are read off the requests' path, at most SERVER_FAST_REQ entries
 * per request and SERVER_FAST_PASS_ALL per pass, passes taking at most SERVER_FAST_SHARE_US of
 * every SERVER_FAST_WINDOW_US, each connection at its own rate (server.fast_ring_rate): a
 * client flooding its ring cannot slow the daemon. Every entry is checked (a cached block of
 * a namespace the connection opened and may read); the rest are refused and counted.
 * A client never waits for the passes beyond their share: once a window's share is spent, a
 * SYNC (a client whose ring is half full) has its unread entries skipped, counted in
 * fast_dropped, and is answered at once. Otherwise every client's hits would be read by this
 * one thread at a quarter of its time, and all the clients of the host would copy their hits
 * at that thread's pace (bench_scale: 16 processes on 16 cores at 1.2 times one).
 * A pass looks only at the rings on sv->fast_active: those whose bit in their uid's bell it
 * found set (client/kvc_fast.h), those it left unread or whose SYNC waits, and those without
 * a bell; a ring read empty leaves the list until its bit is set again. Looking at every
 * ring (its head, a cache miss in a page of its own) each pass made the loop's cost per
 * request grow with the connections (bench_scale's clients: 5.4 us a socket get at 1,024
 * against 3.5 at 16). Every SERVER_FAST_SWEEP_US one pass looks at all of them still.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon/acl.h"
#include "daemon/admin.h"
#include "daemon/config.h"
#include "daemon/config_ns.h"
#include "daemon/engine.h"
#include "daemon/engine_disk.h"
#include "daemon/engine_gpu.h"
#include "daemon/engine_remote.h"
#include "daemon/fast.h"
#include "daemon/log.h"
#include "daemon/loop.h"
#include "daemon/proto.h"
#include "daemon/server.h"
#include "daemon/server_int.h"
#include "daemon/store.h"
#include "tiers/gpu.h"
#include "tiers/host.h"

/* ---- the fast path (client/kvc_fast.h) ------------------------------------------------ */

/* Counts at most max of the hits c took through the shared index (fewer when its allowance,
 * server.fast_ring_rate, is spent), as LOOKUP would: each entry must name a cached block of
 * a namespace c opened and may read; the rest are refused (counted). The entries read. */
uint32_t server_fast_drain(struct server *sv, struct conn *c, uint64_t now, uint32_t max)
{
    struct kvc_fast_hit *h = sv->fast_hits;
    struct stats before;
    uint32_t n;
    bool lied;
    if (!c->ring || !fast_ring_unread(c->ring))
        return 0;
    before = sv->store->total;
    fast_ring_refill(c->ring, now, (uint32_t)sv->lim.fast_ring_rate);
    n = fast_ring_take(c->ring, h, max, &lied);
    if (lied) /* a head moved backwards or past a ring's worth: one lie */
        sv->store->total.fast_refused++;
    /* Hits through the index are not requests: they keep no connection from idling out. */
    for (uint32_t first = 0, end; first < n; first = end) {
        /* A request's hits: from one with nkeys set to the next one. */
        for (end = first + 1; end < n && !h[end].nkeys; end++)
            ;
        /* Touched last to first, as LOOKUP does; the tuner sees them in prefix order. */
        for (uint32_t i = end; i-- > first;) {
            struct kvc_wire_key k = {.lo = h[i].klo, .hi = h[i].khi};
            if (server_ns_use(sv, c, h[i].ns, KVC_ACCESS_READ) ||
                store_fast_hit(sv->store, h[i].ns, h[i].block, &k, h[i].nkeys, now)) {
                sv->store->total.fast_refused++;
                h[i].pos = UINT16_MAX; /* not fed to the tuner */
                continue;
            }
            if (h[i].nkeys && h[i].load_us) /* as RELEASE reports a lease's copy time */
                server_load_add(sv, c, store_ns_get(sv->store, h[i].ns), h[i].load_us, now);
        }
        for (uint32_t i = first; i < end; i++)
            if (h[i].pos != UINT16_MAX) {
                struct kvc_wire_key k = {.lo = h[i].klo, .hi = h[i].khi};
                store_fast_ref(sv->store, h[i].ns, &k, h[i].pos, now);
            }
    }
    /* Counted as this connection's, and kept out of the request being handled, if any
     * (server_handle gives a connection the totals' change over its request). */
    server_stats_delta(&c->st, &before, &sv->store->total);
    server_stats_delta(&sv->fast_excl, &before, &sv->store->total);
    sv->fast_excl_any = true;
    return n;
}

void server_fast_active_add(struct server *sv, struct conn *c)
{
    if (c->fa_on)
        return;
    c->fa_on = true;
    c->fa_prev = NULL;
    c->fa_next = sv->fast_active;
    if (sv->fast_active)
        sv->fast_active->fa_prev = c;
    sv->fast_active = c;
}

static void server_fast_active_del(struct server *sv, struct conn *c)
{
    if (!c->fa_on)
        return;
    if (sv->fast_next == c)
        sv->fast_next = c->fa_next;
    if (c->fa_prev)
        c->fa_prev->fa_next = c->fa_next;
    else
        sv->fast_active = c->fa_next;
    if (c->fa_next)
        c->fa_next->fa_prev = c->fa_prev;
    c->fa_on = false;
    c->fa_prev = c->fa_next = NULL;
}

void server_fast_conn_fini(struct server *sv, struct conn *c)
{
    server_fast_active_del(sv, c);
    if (c->belled)
        fast_bell_bit_put(c->u->bell, c->bell_bit);
    c->belled = false;
}

static void server_fast_rung(void *owner, void *arg)
{
    server_fast_active_add(arg, owner);
}

/* The rings rung since the last pass go on the list (every ring, when a sweep is due); then
 * the fence after which their heads are read (fast_bell_collect). */
static void server_fast_collect(struct server *sv, bool sweep)
{
    for (struct server_uid *u = sv->uids; u; u = u->next)
        if (u->bell)
            fast_bell_collect(u->bell, server_fast_rung, sv);
    fast_bell_fence();
    for (struct conn *c = sweep ? sv->conns : NULL; c; c = c->next)
        if (c->ring && !c->fa_on && fast_ring_unread(c->ring))
            server_fast_active_add(sv, c);
}

/* Answers c's FAST_ATTACH SYNC: its ring has been read. Outside any request's handling
 * (the reply is built in sv->tx). */
static void server_fast_synced(struct server *sv, struct conn *c)
{
    struct kvc_msg_hdr req = {.opcode = KVC_OP_FAST_ATTACH, .req_id = c->sync_req};
    struct kvc_fast_attach_rep *p = server_reply_init(sv, &req, 0, sizeof(*p));
    *p = (struct kvc_fast_attach_rep){.what = KVC_FAST_SYNC};
    c->sync_wait = false;
    server_send(sv, c, -1); /* a client that does not read is dropped at its next request */
}

static uint64_t server_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* Whether the passes have taken their share of the loop in the current window (a new window
 * begins when the last one is over). */
static bool server_fast_share_spent(struct server *sv, uint64_t now_us)
{
    if (now_us - sv->fast_window_us >= SERVER_FAST_WINDOW_US) {
        sv->fast_window_us = now_us;
        sv->fast_window_busy_us = 0;
    }
    return sv->fast_window_busy_us >= SERVER_FAST_SHARE_US;
}

/* Skips c's unread entries, counted in fast_dropped as c's (outside its requests: kept out
 * of the request being handled, as server_fast_drain's counts). */
static void server_fast_shed_all(struct server *sv, struct conn *c)
{
    struct stats before = sv->store->total;
    bool lied;
    sv->store->total.fast_dropped += fast_ring_shed(c->ring, 0, &lied);
    sv->store->total.fast_refused += lied;
    server_stats_delta(&c->st, &before, &sv->store->total);
    server_stats_delta(&sv->fast_excl, &before, &sv->store->total);
    sv->fast_excl_any = true;
}

/* One pass over the rings that may hold entries (sv->fast_active, with those rung since the
 * last one; every ring with `sweep`): rounds of at most SERVER_FAST_CHUNK entries of each
 * ring, round robin from where the last pass stopped, until `budget` entries are read or
 * SERVER_FAST_PASS_US went by; then, with `reply`, the SYNCs whose rings are read are
 * answered. A ring of a connection with a bell that it finds empty leaves the list. Returns
 * in how many ms a ring will have entries it may be read for (0: now), or -1 when no ring
 * has unread entries. */
static int server_fast_pass(struct server *sv, uint32_t budget, bool reply, bool sweep)
{
    uint64_t now = loop_now_ms(sv->loop), rate = sv->lim.fast_ring_rate;
    uint64_t t0 = server_mono_us(), end = t0 + SERVER_FAST_PASS_US;
    int again = -1, rest = 0;
    if (!sv->conns || sv->fast_in_pass)
        return -1;
    sv->fast_in_pass = true;
    server_fast_collect(sv, sweep);
    /* The passes' share of the loop's time: when they took it all in this window, they read
     * nothing until the next one (the loop may sleep till then). */
    bool spent = server_fast_share_spent(sv, t0);
    if (spent) {
        budget = 0;
        rest = (int)((sv->fast_window_us + SERVER_FAST_WINDOW_US - t0 + 999) / 1000);
    }
    for (bool more = true; more && budget && sv->fast_active && server_mono_us() < end;) {
        struct conn *start = sv->fast_next ? sv->fast_next : sv->fast_active, *c = start;
        more = false;
        do {
            struct conn *next = c->fa_next ? c->fa_next : sv->fast_active;
            if (c->ring && fast_ring_unread(c->ring)) {
                uint32_t n = server_fast_drain(
                    sv, c, now, budget < SERVER_FAST_CHUNK ? budget : SERVER_FAST_CHUNK);
                budget -= n;
                more = more || n > 0;
                sv->fast_next = next;
                if (!budget || server_mono_us() >= end)
                    break;
            }
            c = next;
        } while (c != start);
    }
    /* Left unread for want of budget or time (the next pass reads on at once), or of
     * allowance (once the rate has given a chunk's worth). An eviction's pass (no `reply`)
     * wants none of that: the pass after the batch computes it. A ring read empty leaves the
     * list: the fence orders the tails stored before the heads read here, as the client's
     * orders its head before its look at tail (kvc_fast_bell_ring), so that a client whose
     * entries come after this look sees its ring read and sets its bit. */
    bool waiting = false;
    fast_bell_fence();
    for (struct conn *c = sv->fast_active, *next; c; c = next) {
        next = c->fa_next;
        uint32_t unread = c->ring ? fast_ring_unread(c->ring) : 0;
        if (!reply) { /* a SYNC waits for the pass after the batch: it stays */
            if (!unread && c->belled && !c->sync_wait)
                server_fast_active_del(sv, c);
            continue;
        }
        /* A SYNC does not wait for the next window, behind every other ring: what is
         * left unread goes (counted), as past the rate. */
        if (spent && c->sync_wait && unread) {
            server_fast_shed_all(sv, c);
            unread = fast_ring_unread(c->ring);
        }
        if (unread) {
            int ms = fast_ring_allowance(c->ring)
                         ? rest
                         : (int)((SERVER_FAST_CHUNK * 1000 + rate - 1) / rate);
            again = again < 0 || ms < again ? ms : again;
        } else if (c->sync_wait) {
            /* Read: answered now, whatever is left of its allowance. A client over its rate
             * has the excess of its next half ring dropped at its next SYNC (one request per
             * 2,048 hits): it never waits for the rate, which bounds what the daemon reads,
             * not how fast a client copies (a wait for the next entry's allowance was a
             * millisecond of the loop's timer every 32 fast gets of 64 blocks). */
            server_fast_synced(sv, c);
        }
        if (!unread && c->belled && !c->sync_wait)
            server_fast_active_del(sv, c);
        waiting = waiting || c->sync_wait;
    }
    if (reply)
        sv->fast_sync_any = waiting;
    sv->fast_window_busy_us += server_mono_us() - t0;
    sv->fast_in_pass = false;
    return again;
}

/* After every batch of requests (loop_after): a pass over the rings. */
int server_fast_after(void *arg)
{
    struct server *sv = arg;
    uint64_t t = server_mono_us();
    int again;
    sv->fast_evict_passed = false;
    if (!sv->fast_sync_any && !sv->fast_after_due && t - sv->fast_after_us < SERVER_FAST_AFTER_US) {
        again = (int)((sv->fast_after_us + SERVER_FAST_AFTER_US - t + 999) / 1000);
    } else {
        bool sweep = t - sv->fast_sweep_us >= SERVER_FAST_SWEEP_US;
        if (sweep)
            sv->fast_sweep_us = t;
        sv->fast_after_us = t;
        again = server_fast_pass(sv, SERVER_FAST_PASS_ALL, true, sweep);
        sv->fast_after_due = again == 0;
    }
    /* An eviction left half done at its time budget goes on between batches of requests,
     * so none waits behind all of it. */
    if (sv->store->trim_more) {
        engine_trim(sv->store, loop_now_ms(sv->loop));
        if (sv->store->trim_more)
            again = 0;
    }
    return again;
}

/* Before the engine evicts (store.on_evict): a pass, so that the hits clients took through
 * the index before this request count for the blocks they keep using; once per request
 * handled (or batch) however many evictions it makes. (Once per loop millisecond, as this
 * was, skipped the pass for a request that came in the millisecond of an earlier one.) */
void server_fast_evict(void *arg)
{
    struct server *sv = arg;
    if (sv->fast_evict_passed)
        return;
    sv->fast_evict_passed = true;
    (void)server_fast_pass(sv, SERVER_FAST_PASS_ALL, false, false);
}

int server_on_fast_attach(struct server *sv, struct conn *c, const struct proto_req *r,
                          uint64_t now, int *send_fd, bool *fd_owned)
{
    const struct kvc_fast_attach_req *q = r->body;
    struct kvc_fast_attach_rep *p =
        (struct kvc_fast_attach_rep *)((struct kvc_msg_hdr *)sv->tx + 1);
    int rc = 0;
    *p = (struct kvc_fast_attach_rep){.what = q->what, .arena_id = q->arena_id};
    if (q->what == KVC_FAST_SYNC) {
        /* The client needs room (half its ring is unread, or it is leaving). What its
         * allowance covers is read in the passes, and the answer waits for that; the rest
         * goes unread now, counted: no more work than the rate, and no wait for it. When
         * the passes have spent their share of this window, the rest goes too: the client
         * waits for no other client's ring. */
        bool lied;
        if (!c->ring || c->sync_wait)
            return sizeof(*p); /* nothing to read, or one SYNC waits already */
        fast_ring_refill(c->ring, now, (uint32_t)sv->lim.fast_ring_rate);
        uint32_t keep = server_fast_share_spent(sv, server_mono_us()) ? 0 : KVC_FAST_RING_ENTS;
        sv->store->total.fast_dropped += fast_ring_shed(c->ring, keep, &lied);
        sv->store->total.fast_refused += lied;
        if (!fast_ring_unread(c->ring))
            return sizeof(*p);
        c->sync_wait = true;
        sv->fast_sync_any = true;
        server_fast_active_add(sv, c);
        c->sync_req = r->hdr->req_id;
        return SERVER_DEFERRED;
    }
    if (!sv->store->fast[0])
        return -EOPNOTSUPP; /* server.fast_path = no */
    if (q->what == KVC_FAST_INDEX) {
        /* The index names where every block of the arena is: for a holder of the arena. */
        if (q->arena_id >= sv->store->narenas || !(c->arenas_sent & (1u << q->arena_id)))
            return -EACCES;
        int fd = fast_index_fd_ro(sv->store->fast[q->arena_id]);
        if (fd < 0)
            return fd;
        *send_fd = fd;
        *fd_owned = true;
        p->bytes = fast_index_bytes(sv->store->fast[q->arena_id]);
        return sizeof(*p);
    }
    if (q->what == KVC_FAST_BELL) {
        /* Its uid's bell, and a bit of it for this connection's ring: from then on a pass
         * looks at the ring only once the bit is set (or at a sweep). */
        if (!c->ring)
            return -ENOENT;
        if (c->belled)
            return -EEXIST; /* one per connection */
        if (!c->u->bell && !(c->u->bell = fast_bell_new(&rc)))
            return rc;
        if ((rc = fast_bell_bit_take(c->u->bell, c)) < 0)
            return rc;
        c->belled = true;
        c->bell_bit = (uint32_t)rc;
        fast_ring_bell_set(c->ring, c->bell_bit);
        *send_fd = fast_bell_fd(c->u->bell); /* stays the bell's */
        p->bytes = fast_bell_bytes(c->u->bell);
        return sizeof(*p);
    }
    if (c->ring)
        return -EEXIST; /* one per connection */
    if (!(c->ring = fast_ring_new(send_fd, &rc)))
        return rc; /* the descriptor stays the ring's */
    /* Looked at every pass until it has a bell and is found empty. */
    server_fast_active_add(sv, c);
    p->bytes = sizeof(struct kvc_fast_ring) + KVC_FAST_RING_ENTS * sizeof(struct kvc_fast_hit);
    return sizeof(*p);
}
