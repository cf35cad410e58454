/*
 * remote_pool.h — a few threads that run the remote tier's CPU work (sealing a block,
 * opening a part) beside its network worker.
 *
 * DESIGN
 * The remote tier has one network thread that keeps every master's connection busy from one
 * poll loop. Sealing and opening records is CPU work of about a millisecond per MiB: done on
 * that thread, it stops every connection meanwhile. The pool takes it: the worker submits
 * jobs (each embedded in the block or part it works on, so submitting allocates nothing),
 * the pool's threads run them in submission order, and the worker collects the finished
 * ones when the pool's eventfd (in its poll set) says some wait. A job's memory and what it
 * works on belong to the pool from submit until the worker collects it; the worker touches
 * none of it meanwhile. Threads: submit, collect and free on the worker; run on the pool's.
 * Never includes daemon headers.
 */
#ifndef KVC_TIER_REMOTE_POOL_H
#define KVC_TIER_REMOTE_POOL_H

struct remote_job {
    struct remote_job *next; /* the pool's queues */
    void (*run)(struct remote_job *j);
};

struct remote_pool;

/* Starts threads (1..64) threads. NULL with -errno in *err: -EINVAL, -ENOMEM, or that of
 * eventfd or pthread_create. */
struct remote_pool *remote_pool_new(unsigned threads, int *err);
/* Runs what is queued, joins the threads, frees. NULL is a no-op. Jobs done but not
 * collected are dropped: collect them first. */
void remote_pool_free(struct remote_pool *p);

/* Queues j (j->run set); j is the pool's until remote_pool_collect returns it. */
void remote_pool_submit(struct remote_pool *p, struct remote_job *j);
/* Readable when finished jobs wait to be collected. */
int remote_pool_fd(const struct remote_pool *p);
/* The finished jobs, in the order they finished (a list by next), or NULL. */
struct remote_job *remote_pool_collect(struct remote_pool *p);

#endif
