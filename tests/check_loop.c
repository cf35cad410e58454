/*
 * check_loop.c — the daemon's event loop: loop_pause (issue 26), what runs before what.
 *
 * A lookup's policy work waits for the loop's next wait (daemon/server_dispatch.c): the loop
 * must run it before the handlers of the events that wait returned and before a tick, and
 * that wait must sleep (the loop thread gives up its CPU) only a moment when nothing is
 * ready, not until the tick.
 */
#include <check.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "daemon/loop.h"

/* What ran, in order: 'p' the paused work, 'h' a handler, 't' the tick. */
struct lp_log {
    struct loop *l;
    char order[8];
    int n;
    int fd; /* the pipe's read end, drained by the handler */
};

static void lp_note(struct lp_log *g, char c)
{
    if (g->n < (int)sizeof(g->order) - 1)
        g->order[g->n++] = c;
}

static void lp_paused(void *arg)
{
    lp_note(arg, 'p');
}

static void lp_paused_stop(void *arg)
{
    struct lp_log *g = arg;
    lp_note(g, 'p');
    loop_stop(g->l);
}

static void lp_handler(struct loop *l, int fd, uint32_t events, void *arg)
{
    struct lp_log *g = arg;
    char b;
    (void)events;
    ck_assert_int_eq(read(fd, &b, 1), 1);
    lp_note(g, 'h');
    loop_stop(l);
}

/* The handler asks for a pause: the tick due in the same iteration comes after its work. */
static void lp_handler_pauses(struct loop *l, int fd, uint32_t events, void *arg)
{
    struct lp_log *g = arg;
    char b;
    (void)events;
    ck_assert_int_eq(read(fd, &b, 1), 1);
    lp_note(g, 'h');
    loop_pause(l, 50, lp_paused, g);
    usleep(2000); /* the tick of 1 ms is due when the handlers are done */
}

static void lp_tick(void *arg)
{
    struct lp_log *g = arg;
    lp_note(g, 't');
    loop_stop(g->l);
}

static double lp_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* A descriptor ready when the wait returns: the paused work runs before its handler. */
START_TEST(test_pause_before_handlers)
{
    struct lp_log g = {0};
    int p[2], err = 0;
    ck_assert_int_eq(pipe(p), 0);
    g.l = loop_new(&err);
    ck_assert_ptr_nonnull(g.l);
    ck_assert_int_eq(loop_add(g.l, p[0], EPOLLIN, lp_handler, &g), 0);
    ck_assert_int_eq(write(p[1], "x", 1), 1);
    loop_pause(g.l, 500, lp_paused, &g);
    ck_assert_uint_eq(loop_pauses(g.l), 1);
    ck_assert_int_eq(loop_run(g.l, 10000, NULL, NULL), 0);
    ck_assert_str_eq(g.order, "ph");
    loop_free(g.l);
    close(p[0]);
    close(p[1]);
}
END_TEST

/* Nothing ready: the wait sleeps about the pause, far less than the tick's 10 s, and the
 * work runs then. */
START_TEST(test_pause_sleeps_a_moment)
{
    struct lp_log g = {0};
    int err = 0;
    g.l = loop_new(&err);
    ck_assert_ptr_nonnull(g.l);
    loop_pause(g.l, 800, lp_paused_stop, &g);
    double t0 = lp_now_us();
    ck_assert_int_eq(loop_run(g.l, 10000, NULL, NULL), 0);
    double us = lp_now_us() - t0;
    ck_assert_str_eq(g.order, "p");
    ck_assert_msg(us >= 700 && us < 200000, "the pause took %.0f us", us);
    loop_free(g.l);
}
END_TEST

/* Asked by a handler with the tick due in the same iteration: the work before the tick. */
START_TEST(test_pause_before_tick)
{
    struct lp_log g = {0};
    int p[2], err = 0;
    ck_assert_int_eq(pipe(p), 0);
    g.l = loop_new(&err);
    ck_assert_ptr_nonnull(g.l);
    ck_assert_int_eq(loop_add(g.l, p[0], EPOLLIN, lp_handler_pauses, &g), 0);
    ck_assert_int_eq(write(p[1], "x", 1), 1);
    ck_assert_int_eq(loop_run(g.l, 1, lp_tick, &g), 0);
    ck_assert_str_eq(g.order, "hpt");
    loop_free(g.l);
    close(p[0]);
    close(p[1]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("loop");
    TCase *tc = tcase_create("pause");
    tcase_add_test(tc, test_pause_before_handlers);
    tcase_add_test(tc, test_pause_sleeps_a_moment);
    tcase_add_test(tc, test_pause_before_tick);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
