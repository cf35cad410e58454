/*
 * remote_pool.c — the remote tier's CPU threads (tiers/remote_pool.h).
 */
#include "tiers/remote_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define REMOTE_POOL_MAX 64

struct remote_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct remote_job *q_head, *q_tail; /* to run, under mu */
    struct remote_job *d_head, *d_tail; /* finished, under mu */
    bool stop;
    int efd;
    unsigned n;
    pthread_t thr[REMOTE_POOL_MAX];
};

static void *remote_pool_main(void *arg)
{
    struct remote_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        struct remote_job *j = p->q_head;
        if (!j) {
            if (p->stop)
                break;
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        p->q_head = j->next;
        if (!p->q_head)
            p->q_tail = NULL;
        pthread_mutex_unlock(&p->mu);
        j->run(j);
        j->next = NULL;
        pthread_mutex_lock(&p->mu);
        if (p->d_tail)
            p->d_tail->next = j;
        else
            p->d_head = j;
        p->d_tail = j;
        uint64_t one = 1;
        ssize_t w = write(p->efd, &one, sizeof(one));
        (void)w; /* a counter that cannot overflow in practice; a full one is still readable */
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

struct remote_pool *remote_pool_new(unsigned threads, int *err)
{
    struct remote_pool *p;
    if (threads < 1 || threads > REMOTE_POOL_MAX) {
        *err = -EINVAL;
        return NULL;
    }
    p = calloc(1, sizeof(*p));
    if (!p) {
        *err = -ENOMEM;
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->efd < 0) {
        *err = -errno;
        remote_pool_free(p);
        return NULL;
    }
    for (; p->n < threads; p->n++) {
        int rc = pthread_create(&p->thr[p->n], NULL, remote_pool_main, p);
        if (rc) {
            *err = -rc;
            remote_pool_free(p);
            return NULL;
        }
    }
    return p;
}

void remote_pool_free(struct remote_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < p->n; i++)
        pthread_join(p->thr[i], NULL);
    if (p->efd >= 0)
        close(p->efd);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void remote_pool_submit(struct remote_pool *p, struct remote_job *j)
{
    j->next = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->q_tail)
        p->q_tail->next = j;
    else
        p->q_head = j;
    p->q_tail = j;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

int remote_pool_fd(const struct remote_pool *p)
{
    return p->efd;
}

struct remote_job *remote_pool_collect(struct remote_pool *p)
{
    struct remote_job *j;
    uint64_t v;
    ssize_t r = read(p->efd, &v, sizeof(v));
    (void)r; /* EAGAIN: nothing signalled since the last collect; the list says */
    pthread_mutex_lock(&p->mu);
    j = p->d_head;
    p->d_head = p->d_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    return j;
}
