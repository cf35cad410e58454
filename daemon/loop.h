/*
 * loop.h — the daemon's one event loop (epoll; level-triggered).
 *
 * Every descriptor the daemon watches is registered with a callback; callbacks run on the
 * loop thread, one at a time, and must not block. Signals arrive as a readable signalfd.
 */
#ifndef KVC_LOOP_H
#define KVC_LOOP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>

struct loop;
typedef void (*loop_fn)(struct loop *l, int fd, uint32_t events, void *arg);

struct loop *loop_new(int *err);
void loop_free(struct loop *l);
/* Watches fd for events (EPOLLIN, ...). The same fd is registered once. 0 or -errno. */
int loop_add(struct loop *l, int fd, uint32_t events, loop_fn fn, void *arg);
int loop_del(struct loop *l, int fd);
/* Runs until loop_stop(); wakes at least every tick_ms to call tick(arg). A stop takes
 * effect after the handlers of the events the current wait returned. */
int loop_run(struct loop *l, int tick_ms, void (*tick)(void *arg), void *arg);
void loop_stop(struct loop *l);
/* Whether a registered descriptor is ready now (a poll of the epoll descriptor, nothing
 * taken from it): work that can wait stops for the requests (engine_trim). */
bool loop_input_ready(const struct loop *l);
/* fn(arg) runs before every wait for events (one per batch of handlers): work the handlers
 * gathered goes out together there. NULL removes it. */
void loop_before_wait(struct loop *l, void (*fn)(void *arg), void *arg);
/* fn(arg) runs after every batch of handlers (and after every wait that found none): work
 * kept off the handlers, done a bounded step at a time. It returns in how many ms it wants
 * to run again at the latest (0: at once, the next wait does not sleep), or -1 for no
 * sooner than events or the tick bring it. NULL removes it. */
void loop_after(struct loop *l, int (*fn)(void *arg), void *arg);
/* fn(arg) runs once, after the loop's next wait returns (events or not) and before anything
 * else the loop runs then — handlers, `after`, the tick — or before a tick due first. When
 * no event is ready and nothing is due at once, that wait sleeps pause_us at most (under
 * 1,000), not until the tick: the loop thread gives up its CPU, so a process it has just
 * woken (a reply's reader) runs first where both share a CPU. What asks for it, and the `after` and `before_wait`
 * hooks between, must not need fn's work; a later call replaces an earlier one not run yet.
 * A kernel without epoll_pwait2 sleeps a millisecond. */
void loop_pause(struct loop *l, uint32_t pause_us, void (*fn)(void *arg), void *arg);
/* loop_pause calls so far (tests). */
uint64_t loop_pauses(const struct loop *l);
/* Monotonic milliseconds since the loop was created. */
uint64_t loop_now_ms(const struct loop *l);

#endif
