/*
 * loop.c — see loop.h.
 *
 * DESIGN
 * Registrations live in a small table indexed by descriptor number, so a callback that
 * closes another descriptor (a connection dying while others are ready in the same batch)
 * cannot leave a dangling pointer: events for a descriptor deleted during the batch are
 * dropped by checking the table before each call.
 * A pause (loop_pause) is work a handler left for after the next wait, which sleeps then
 * (unless an event is ready or a tick or `after` is due at once) for pause_us at most, not
 * until the tick (epoll_pwait2's timeout in nanoseconds): the one way a single-threaded
 * daemon lets a process it has just woken on its own CPU run before its deferred work. The
 * work runs first thing after that wait, or before a tick due earlier.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "daemon/loop.h"

struct loop_entry {
    loop_fn fn;
    void *arg;
    uint32_t gen;
};

struct loop {
    int epfd;
    bool stop;
    struct loop_entry *entries; /* by fd */
    int nentries;
    uint64_t t0;
    void (*before_wait)(void *arg);
    void *before_wait_arg;
    int (*after)(void *arg);
    void *after_arg;
    void (*pause_fn)(void *arg); /* loop_pause: runs after the next wait, before the rest */
    void *pause_arg;
    uint32_t pause_us;
    bool no_pwait2;  /* epoll_pwait2 missing (ENOSYS): the pause is a millisecond */
    uint64_t pauses; /* loop_pause calls */
};

static uint64_t loop_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

struct loop *loop_new(int *err)
{
    struct loop *l = calloc(1, sizeof(*l));
    if (!l) {
        *err = -ENOMEM;
        return NULL;
    }
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (l->epfd < 0) {
        *err = -errno;
        free(l);
        return NULL;
    }
    l->t0 = loop_mono_ms();
    return l;
}

void loop_free(struct loop *l)
{
    if (!l)
        return;
    close(l->epfd);
    free(l->entries);
    free(l);
}

int loop_add(struct loop *l, int fd, uint32_t events, loop_fn fn, void *arg)
{
    struct epoll_event ev = {.events = events, .data.u64 = 0};
    if (fd < 0)
        return -EBADF;
    if (fd >= l->nentries) {
        int n = l->nentries ? l->nentries : 64;
        while (n <= fd)
            n *= 2;
        struct loop_entry *ne = realloc(l->entries, (size_t)n * sizeof(*ne));
        if (!ne)
            return -ENOMEM;
        memset(ne + l->nentries, 0, (size_t)(n - l->nentries) * sizeof(*ne));
        l->entries = ne;
        l->nentries = n;
    }
    l->entries[fd].gen++;
    ev.data.u64 = ((uint64_t)l->entries[fd].gen << 32) | (uint32_t)fd;
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
        return -errno;
    l->entries[fd].fn = fn;
    l->entries[fd].arg = arg;
    return 0;
}

int loop_del(struct loop *l, int fd)
{
    if (fd < 0 || fd >= l->nentries || !l->entries[fd].fn)
        return -ENOENT;
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL);
    l->entries[fd].fn = NULL;
    l->entries[fd].arg = NULL;
    return 0;
}

/* epoll_pwait2 as the system call itself: glibc has its wrapper from 2.35 on, and kvcd's
 * binaries also run on hosts with an older one (a device bundle); -1 and ENOSYS where the
 * kernel (before 5.11) or its headers have none. */
static int loop_pwait2(int epfd, struct epoll_event *evs, int max, const struct timespec *ts)
{
#ifdef SYS_epoll_pwait2
    return (int)syscall(SYS_epoll_pwait2, epfd, evs, max, ts, NULL, (size_t)0);
#else
    (void)epfd, (void)evs, (void)max, (void)ts;
    errno = ENOSYS;
    return -1;
#endif
}

/* Runs what loop_pause asked for, once. */
static void loop_pause_end(struct loop *l)
{
    void (*fn)(void *) = l->pause_fn;
    l->pause_fn = NULL;
    fn(l->pause_arg);
}

int loop_run(struct loop *l, int tick_ms, void (*tick)(void *arg), void *arg)
{
    struct epoll_event evs[64];
    uint64_t next_tick = loop_mono_ms() + (uint64_t)tick_ms;
    int again = -1; /* what `after` asked for last: ms until it runs again, -1 no need */
    l->stop = false;
    while (!l->stop) {
        uint64_t now = loop_mono_ms();
        int timeout = now >= next_tick ? 0 : (int)(next_tick - now);
        int n;
        if (again >= 0 && again < timeout)
            timeout = again;
        if (l->before_wait)
            l->before_wait(l->before_wait_arg);
        if (l->pause_fn && timeout > 0) {
            /* pause_us at most (under the millisecond the timeout is at least): a process
             * this loop just woke may have this CPU first (loop_pause). */
            const struct timespec ts = {.tv_nsec = (long)l->pause_us * 1000};
            n = l->no_pwait2 ? -1 : loop_pwait2(l->epfd, evs, 64, &ts);
            if (n < 0 && (l->no_pwait2 || errno == ENOSYS)) {
                l->no_pwait2 = true;
                n = epoll_wait(l->epfd, evs, 64, 1);
            }
        } else {
            n = epoll_wait(l->epfd, evs, 64, timeout);
        }
        int werr = n < 0 ? errno : 0;
        if (l->pause_fn) /* before any handler, `after` or tick */
            loop_pause_end(l);
        if (n < 0) {
            if (werr == EINTR)
                continue;
            return -werr;
        }
        /* Every event the wait returned is handled, even once a handler stopped the loop:
         * an edge-triggered descriptor (server_io.c's `back`) would not report a dropped one
         * again, and a later loop_run would wait for it forever. */
        for (int i = 0; i < n; i++) {
            int fd = (int)(uint32_t)evs[i].data.u64;
            uint32_t gen = (uint32_t)(evs[i].data.u64 >> 32);
            struct loop_entry *e = &l->entries[fd];
            if (!e->fn || e->gen != gen)
                continue; /* deleted (or replaced) earlier in this batch */
            e->fn(l, fd, evs[i].events, e->arg);
        }
        if (l->after && !l->stop)
            again = l->after(l->after_arg);
        if (tick && loop_mono_ms() >= next_tick) {
            if (l->pause_fn) /* asked by a handler of this batch: before the tick too */
                loop_pause_end(l);
            tick(arg);
            next_tick = loop_mono_ms() + (uint64_t)tick_ms;
        }
    }
    return 0;
}

void loop_pause(struct loop *l, uint32_t pause_us, void (*fn)(void *arg), void *arg)
{
    l->pause_fn = fn;
    l->pause_arg = arg;
    l->pauses++;
    l->pause_us = pause_us < 1000 ? (pause_us ? pause_us : 1) : 999;
}

uint64_t loop_pauses(const struct loop *l)
{
    return l->pauses;
}

void loop_before_wait(struct loop *l, void (*fn)(void *arg), void *arg)
{
    l->before_wait = fn;
    l->before_wait_arg = arg;
}

void loop_after(struct loop *l, int (*fn)(void *arg), void *arg)
{
    l->after = fn;
    l->after_arg = arg;
}

bool loop_input_ready(const struct loop *l)
{
    struct pollfd p = {.fd = l->epfd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

void loop_stop(struct loop *l)
{
    l->stop = true;
}

uint64_t loop_now_ms(const struct loop *l)
{
    return loop_mono_ms() - l->t0;
}
