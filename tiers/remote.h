/*
 * remote.h — the remote tier: block records in a Redis Cluster shared by the kvcd of several
 * hosts, reached with hiredis on a worker thread.
 *
 * DESIGN
 * The daemon's loop never waits on the network. Requests (a GET of a record into a memory
 * slot, a PUT of a slot's bytes as a record) go on a queue under a mutex; one worker thread
 * takes them in batches, routes each to the master of its key's slot, pipelines every
 * node's share (all nodes are written before any is read, so the nodes work at once), reads
 * the replies, and hands the finished requests back on a list whose eventfd the loop
 * watches (tier_remote_fd, tier_remote_poll), as the disk tier's completions come back.
 * Routing: the slot map comes from CLUSTER SLOTS of any node that answers (seeds first);
 * MOVED updates the slot's entry and retries there (the map is refreshed after the batch),
 * ASK retries once on the named node behind ASKING; a request is redirected at most
 * REMOTE_REDIRECTS_MAX times. Connections are opened on first use and after any error.
 * Faults: a connection error, a timeout (every socket has the configured timeout) or a
 * cluster that refuses (CLUSTERDOWN, TRYAGAIN, LOADING, MASTERDOWN) fails the requests
 * concerned and opens the circuit breaker: the tier is degraded, new requests fail at once
 * (-EAGAIN) without touching the network, and after a backoff (doubling from backoff_min to
 * backoff_max) the worker probes: a slot map refresh from a node reporting cluster_state:ok.
 * Data path: a PUT's header and data are appended to hiredis' output buffer as they are (no
 * formatting); replies are parsed by the worker itself, so a GET's value goes from the
 * socket straight into its destination slot (header first, checked, then the data, checked
 * before the request completes) with no intermediate copy.
 * A probe that passes closes the breaker; one that fails doubles the backoff. A value read
 * is checked with remote_rec_check before a byte is copied to the caller's buffer, so
 * nothing torn, foreign or of another layout is ever handed back.
 * Threads: submit, poll, stats and free on the caller's (the daemon's loop) thread; the
 * network on the worker. Never includes daemon headers.
 */
#ifndef KVC_TIER_REMOTE_H
#define KVC_TIER_REMOTE_H

#include <stdbool.h>
#include <stdint.h>

#include "tiers/remote_rec.h"

#define TIER_REMOTE_MAX_NODES 64
#define REMOTE_REDIRECTS_MAX 5

struct tier_remote_config {
    const char *nodes;           /* seeds: "host:port,host:port" (at least one) */
    const char *user;            /* "" or NULL: AUTH with the password alone */
    const char *password;        /* "" or NULL: no AUTH */
    uint32_t connect_timeout_ms; /* per connection attempt */
    uint32_t timeout_ms;         /* per socket read or write */
    uint32_t max_inflight;       /* requests queued or on the wire; more: -EAGAIN */
    uint32_t batch;              /* requests per pipelined batch */
    uint32_t backoff_min_ms, backoff_max_ms;
};

struct tier_remote;

/* Called on the caller's thread from tier_remote_poll: status 0 (a GET's *got holds the
 * record's header; its data is in the buffer), -ENOENT (no value under the key), -EPROTO,
 * -EPROTONOSUPPORT, -EMSGSIZE, -ESTALE, -EBADMSG (a value that is not a valid record of
 * this block: see remote_rec_check), -EIO (network or cluster error), -EAGAIN (the cluster
 * asked to retry, or the tier is degraded), -ECANCELED (the tier is stopping). */
typedef void (*tier_remote_done_fn)(void *arg, int status, const struct remote_rec_meta *got);

/* Parses the seeds and starts the worker, which loads the slot map at once (a cluster that
 * is down at start makes a degraded tier, not an error). NULL with *err: -EINVAL (no valid seed, more
 * than TIER_REMOTE_MAX_NODES), -ENOMEM, -errno of eventfd or pthread_create. */
struct tier_remote *tier_remote_new(const struct tier_remote_config *cfg, int *err);
/* Stops the worker (requests not started complete with -ECANCELED, run here), closes the
 * connections and frees. NULL is a no-op. */
void tier_remote_free(struct tier_remote *t);

/* The eventfd readable when completions wait; tier_remote_poll runs them. */
int tier_remote_fd(const struct tier_remote *t);
int tier_remote_poll(struct tier_remote *t);

/* Reads the record of want (its ns and key name the Redis key) into dst: done gets 0 once
 * got->len (<= cap) data bytes are there. dst must stay valid until done. Returns 0, or
 * -EAGAIN (degraded, or max_inflight reached: nothing queued), -ENOMEM. */
int tier_remote_get(struct tier_remote *t, const struct remote_rec_meta *want, void *dst,
                    uint64_t cap, tier_remote_done_fn done, void *arg);
/* Writes m->len bytes at src as the record of m (a SET that replaces any value). src must
 * stay unchanged until done. Returns as tier_remote_get. */
int tier_remote_put(struct tier_remote *t, const struct remote_rec_meta *m, const void *src,
                    tier_remote_done_fn done, void *arg);

/* Whether the circuit breaker is open now. */
bool tier_remote_degraded(const struct tier_remote *t);

struct tier_remote_stats {
    uint64_t nodes;    /* masters in the slot map */
    uint64_t slots;    /* slots with a master in the map (16384 when whole) */
    uint64_t inflight; /* requests queued, on the wire, or not yet polled */
    uint64_t gets, hits, misses, bad_records;
    uint64_t puts, puts_ok;
    uint64_t bytes_read, bytes_written;
    uint64_t errors;       /* requests failed by the network or the cluster */
    uint64_t fast_fails;   /* requests refused at once while degraded */
    uint64_t moved, asked; /* redirects followed */
    uint64_t refreshes;    /* slot maps loaded */
    uint64_t connects;     /* connections opened */
    uint64_t trips;        /* times the breaker opened */
    bool degraded;
    char last_error[128]; /* the latest failure, for the log */
};
void tier_remote_stats(const struct tier_remote *t, struct tier_remote_stats *st);

#endif
