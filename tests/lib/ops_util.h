/*
 * ops_util.h — end-to-end helpers of the operator tests: run the real kvcd on a private
 * socket and temp dir, run kvcctl and capture what it prints.
 */
#ifndef KVC_TESTS_OPS_UTIL_H
#define KVC_TESTS_OPS_UTIL_H

#include <stddef.h>
#include <sys/types.h>

struct ops_daemon {
    pid_t pid;
    char dir[64];   /* temp dir, 0755 so that other uids reach the socket */
    char sock[128]; /* dir/kvcd.sock */
    char log[128];  /* dir/kvcd.log: the daemon's stderr */
};

/* Starts build/bin/kvcd with -o server.socket=..., a small unfaulted arena, the given extra
 * arguments (NULL-terminated) and extra environment ("K=V", NULL-terminated, may be NULL);
 * waits as long as daemon_start() (DAEMON_START_MS, scaled) for the socket. kvcd comes
 * from daemon_fork(): it dies with the test process. 0 or -1. */
int ops_daemon_start(struct ops_daemon *d, const char *const *args, const char *const *env);
/* SIGTERM and wait; returns the exit status (or -1). Removes the temp dir. */
int ops_daemon_stop(struct ops_daemon *d);
/* Waits for a daemon already told to stop (a second SIGTERM would make it exit at once,
 * with status 1), then removes its directory. Its exit status. */
int ops_daemon_wait(struct ops_daemon *d);

/* Runs kvcctl -s SOCK with the arguments (NULL-terminated) under /bin/sh-free exec; fills
 * out (NUL-terminated, stdout then stderr) and returns the exit status. */
int ops_kvcctl(const struct ops_daemon *d, char *out, size_t len, const char *const *args);

/* Writes text to dir/name; the path into path. 0 or -1. */
int ops_write_file(const struct ops_daemon *d, const char *name, const char *text, char *path,
                   size_t len);

#endif
