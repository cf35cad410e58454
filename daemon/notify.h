/*
 * notify.h — systemd's service protocols through libsystemd: readiness, status, reload
 * and stop notifications, the watchdog keep-alive, and socket activation.
 *
 * Every call is a no-op when the daemon was not started by systemd (no NOTIFY_SOCKET,
 * no LISTEN_FDS), so kvcd runs the same from a shell. Called from the loop thread only.
 */
#ifndef KVC_NOTIFY_H
#define KVC_NOTIFY_H

#include <stdint.h>

/* READY=1 with a STATUS line: the socket is bound and the tiers are loaded. */
void notify_ready(const char *status);
/* STATUS=... alone. */
void notify_status(const char *status);
/* RELOADING=1 with MONOTONIC_USEC (what Type=notify-reload expects too); READY=1 follows
 * through notify_ready once the verdict is in. */
void notify_reloading(void);
/* STOPPING=1. */
void notify_stopping(void);
/* EXTEND_TIMEOUT_USEC: more time for a long start step (pre-faulting a large arena,
 * loading a disk index); call again before it runs out. */
void notify_extend_timeout(uint64_t usec);
/* Milliseconds between watchdog keep-alives (half of WatchdogSec), 0 when the service
 * has no watchdog. Reads WATCHDOG_USEC/WATCHDOG_PID once. */
uint64_t notify_watchdog_period_ms(void);
/* WATCHDOG=1, at most every period from the loop tick; now in milliseconds. */
void notify_watchdog(uint64_t now_ms);
/* A listening socket passed by systemd (LISTEN_FDS, one SOCK_SEQPACKET unix socket):
 * 1 and *fd, 0 when none was passed, -EINVAL when what was passed is not such a socket. */
int notify_listen_fd(int *fd);

#endif
