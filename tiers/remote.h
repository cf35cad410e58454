/*
 * remote.h — the remote tier: block records in a Redis Cluster shared by the kvcd of several
 * hosts, reached with hiredis on a worker thread.
 *
 * DESIGN
 * The daemon's loop never waits on the network. Requests (a GET of a block into a memory
 * slot, a PUT of a slot's bytes) go on a queue under a mutex; one worker thread takes them in
 * batches and runs each batch's parts together. A block larger than the part size is cut
 * into parts, each its own value under its own key (tiers/remote_rec.h: the keys put the
 * parts of a block in slots spread over the masters); a block's parts always travel in one
 * batch. The worker routes each part to the master of its key's slot, and drives every
 * master's connection at once from one poll loop: commands go out with sendmsg straight
 * from the slot's memory (header, data: no copy into an output buffer), replies are parsed
 * as they come by a reader per connection that resumes where the socket left it, so a GET's
 * value goes from the socket straight into its place in the destination slot (the part's
 * header first, checked, then its bytes, checked before the part counts as read). All
 * masters send and receive at once: a read of one large block is served by all of them in
 * parallel. A block is done when its last part is: a GET then needs every part valid and
 * all of one write (remote_rec_same_write), else the block is a miss (some parts missing:
 * part_missing) or refused (bad_records; parts of different writes: part_mixed), never
 * served. A PUT's headers (which carry the XXH3 of the whole block) are made when its first
 * part is about to go out. A sealed tier (remote_seal.h) seals each part then, into a copy
 * of the block's bytes held while its batch runs, and sends the copy; a GET's sealed header
 * is opened before it is checked, and the part's bytes, received into their place as
 * ciphertext, are opened in place once their tag has come: nothing of a part counts before
 * both opened. That CPU work runs on seal_threads threads beside the worker
 * (tiers/remote_pool.h): a PUT's block is sealed there while the worker sends what is ready
 * (its parts wait in their connections' queues), and a GET's part is opened there while the
 * worker reads the next replies; a round ends when the network and the pool are done.
 * Routing: the slot map comes from CLUSTER SLOTS of any node that answers (seeds first);
 * MOVED updates the slot's entry and retries there (the map is refreshed after the batch),
 * ASK retries once on the named node behind ASKING; a part is redirected at most
 * REMOTE_REDIRECTS_MAX times. Connections are opened on first use and after any error;
 * hiredis opens them and runs the simple commands between batches (AUTH, CLUSTER ...).
 * Faults: a connection error, a timeout (a connection with work that moves no byte for the
 * configured timeout) or a cluster that refuses (CLUSTERDOWN, TRYAGAIN, LOADING, MASTERDOWN)
 * fails the requests concerned and opens the circuit breaker: the tier is degraded, new
 * requests fail at once (-EAGAIN) without touching the network, and after a backoff
 * (doubling from backoff_min to backoff_max) the worker probes: a slot map refresh from a
 * node reporting cluster_state:ok. A probe that passes closes the breaker; one that fails
 * doubles the backoff.
 * Threads: submit, plug, poll, stats and free on the caller's (the daemon's loop) thread;
 * the network on the worker. Never includes daemon headers.
  */
#ifndef KVC_TIER_REMOTE_H
#define KVC_TIER_REMOTE_H

#include <stdbool.h>
#include <stdint.h>

#include "tiers/remote_rec.h"
#include "tiers/remote_seal.h"

#define TIER_REMOTE_MAX_NODES 64
#define REMOTE_REDIRECTS_MAX 5

struct tier_remote_config {
    const char *nodes;           /* seeds: "host:port,host:port" (at least one) */
    const char *user;            /* "" or NULL: AUTH with the password alone */
    const char *password;        /* "" or NULL: no AUTH */
    uint32_t connect_timeout_ms; /* per connection attempt */
    uint32_t timeout_ms;         /* per socket read or write */
    uint32_t max_inflight;       /* requests queued or on the wire; more: -EAGAIN */
    uint32_t batch;              /* parts per pipelined batch (a block's parts stay together) */
    uint64_t part_size;          /* 0: a block is one value; else >= REMOTE_REC_PART_MIN */
    bool sealed; /* every record sealed (remote_seal.h): each get and put names its keys */
    uint32_t seal_threads; /* a sealed tier: threads that seal and open (0: the worker) */
    uint32_t backoff_min_ms, backoff_max_ms;
};

struct tier_remote;

/* Called on the caller's thread from tier_remote_poll: status 0 (a GET's *got holds what the
 * record says of the block; its bytes are in the buffer), -ENOENT (no value under the block's
 * keys, or not under all of them: a part missing), -EPROTO, -EPROTONOSUPPORT, -EMSGSIZE,
 * -ESTALE, -EBADMSG (a value that is not a valid part of this block: see
 * remote_rec_check_header; -ESTALE also for parts of different writes), -EKEYREJECTED (a
 * sealed tier: a value that does not open under the block's keys), -EIO (network or
 * cluster error), -EAGAIN (the cluster asked to retry, or the tier is degraded), -ECANCELED
 * (the tier is stopping). */
typedef void (*tier_remote_done_fn)(void *arg, int status, const struct remote_rec_meta *got);

/* Parses the seeds and starts the worker, which loads the slot map at once (a cluster that
 * is down at start makes a degraded tier, not an error). NULL with *err: -EINVAL (no valid
 * seed, more than TIER_REMOTE_MAX_NODES, a part size below REMOTE_REC_PART_MIN), -ENOMEM,
 * -errno of eventfd or pthread_create. */
struct tier_remote *tier_remote_new(const struct tier_remote_config *cfg, int *err);
/* Stops the worker (requests not started complete with -ECANCELED, run here), closes the
 * connections and frees. NULL is a no-op. */
void tier_remote_free(struct tier_remote *t);

/* The eventfd readable when completions wait; tier_remote_poll runs them. */
int tier_remote_fd(const struct tier_remote *t);
int tier_remote_poll(struct tier_remote *t);

/* Reads the block want (its ns and key name the Redis keys; want->len is its exact size,
 * which with the part size gives its cut) into dst: done gets 0 once its want->len bytes are
 * there. seal: the namespace's keys in a sealed tier (copied), NULL in an unsealed one. dst
 * must stay valid until done. Returns 0, or -EAGAIN (degraded, or max_inflight reached:
 * nothing queued), -EMSGSIZE (more than REMOTE_REC_PARTS_MAX parts), -EINVAL (seal given
 * to an unsealed tier or missing in a sealed one), -ENOMEM. */
int tier_remote_get(struct tier_remote *t, const struct remote_rec_meta *want,
                    const struct remote_seal *seal, void *dst, tier_remote_done_fn done, void *arg);
/* Writes m->len bytes at src as the block m, in parts when larger than the part size (SETs
 * that replace any values); sealed under seal in a sealed tier. src must stay unchanged
 * until done. Returns as tier_remote_get. */
int tier_remote_put(struct tier_remote *t, const struct remote_rec_meta *m,
                    const struct remote_seal *seal, const void *src, tier_remote_done_fn done,
                    void *arg);

/* Between plug and unplug (which nest), submitted requests are held and handed to the worker
 * together at the last unplug: a lookup's or a pump's requests make one batch, where the
 * worker would otherwise wake for the first alone. */
void tier_remote_plug(struct tier_remote *t);
void tier_remote_unplug(struct tier_remote *t);

/* Whether the circuit breaker is open now. */
bool tier_remote_degraded(const struct tier_remote *t);

struct tier_remote_stats {
    uint64_t nodes;    /* masters in the slot map */
    uint64_t slots;    /* slots with a master in the map (16384 when whole) */
    uint64_t inflight; /* requests queued, on the wire, or not yet polled */
    uint64_t gets, hits, misses, bad_records; /* blocks */
    uint64_t puts, puts_ok;                   /* blocks */
    uint64_t parts_read, parts_written;       /* values moved (a block is one or more) */
    uint64_t part_missing; /* blocks missed because some of their parts were not there */
    uint64_t part_mixed;   /* blocks refused because their parts were of different writes */
    uint64_t seal_refused; /* blocks refused because a part did not open under their keys */
    uint64_t batches;      /* batches run (a batch: one pipelined round trip or a few) */
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
