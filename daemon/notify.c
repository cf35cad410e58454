/*
 * notify.c — see notify.h.
 *
 * DESIGN
 * libsystemd implements the protocols (the notification datagram, its credentials, the
 * LISTEN_PID check) so we do not; it is a dependency already. The watchdog period is read
 * once at start: systemd does not change WatchdogSec under a running service without a
 * WATCHDOG_USEC= message from the service itself.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "daemon/log.h"
#include "daemon/notify.h"

static uint64_t notify_wd_ms;
static bool notify_wd_read;
static uint64_t notify_wd_last;

void notify_ready(const char *status)
{
    sd_notifyf(0, "READY=1\nSTATUS=%s", status);
}

void notify_status(const char *status)
{
    sd_notifyf(0, "STATUS=%s", status);
}

void notify_reloading(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    sd_notifyf(0, "RELOADING=1\nSTATUS=reloading the configuration\nMONOTONIC_USEC=%llu",
               (unsigned long long)ts.tv_sec * 1000000ull +
                   (unsigned long long)ts.tv_nsec / 1000ull);
}

void notify_stopping(void)
{
    sd_notify(0, "STOPPING=1\nSTATUS=stopping");
}

void notify_extend_timeout(uint64_t usec)
{
    sd_notifyf(0, "EXTEND_TIMEOUT_USEC=%llu", (unsigned long long)usec);
}

uint64_t notify_watchdog_period_ms(void)
{
    uint64_t usec = 0;
    if (!notify_wd_read) {
        notify_wd_read = true;
        if (sd_watchdog_enabled(0, &usec) > 0)
            notify_wd_ms = usec / 2000 ? usec / 2000 : 1;
    }
    return notify_wd_ms;
}

void notify_watchdog(uint64_t now_ms)
{
    uint64_t period = notify_watchdog_period_ms();
    if (!period || (notify_wd_last && now_ms - notify_wd_last < period))
        return;
    notify_wd_last = now_ms ? now_ms : 1;
    sd_notify(0, "WATCHDOG=1");
}

int notify_listen_fd(int *fd)
{
    int n = sd_listen_fds(1);
    if (n <= 0)
        return n < 0 ? n : 0;
    if (n > 1) {
        log_err("notify: %d sockets passed; kvcd serves one", n);
        return -EINVAL;
    }
    if (sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_SEQPACKET, 1, NULL, 0) <= 0) {
        log_err("notify: the passed socket is not a listening SOCK_SEQPACKET unix socket "
                "(ListenSequentialPacket= in kvcd.socket)");
        return -EINVAL;
    }
    *fd = SD_LISTEN_FDS_START;
    return 1;
}
