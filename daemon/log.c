/*
 * log.c — see log.h.
 *
 * DESIGN
 * Under systemd (JOURNAL_STREAM set) lines carry a "<N>" syslog priority prefix that the
 * journal turns into the level and no timestamp (the journal adds one); otherwise a UTC
 * timestamp. The rate limit is a one-second window: at most `limited_per_sec` client-caused
 * lines per window, then one summary line when the next window opens.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "daemon/log.h"

static enum log_level log_level_max = LOG_LEVEL_INFO;
static uint32_t log_per_sec = 20;
static bool log_journal;
static time_t log_window;
static uint32_t log_window_count;
static uint64_t log_window_dropped;
static uint64_t log_dropped_total;

static const int log_syslog_prio[] = {3, 4, 6, 7};
static const char *const log_level_names[] = {"error", "warning", "info", "debug"};

void log_setup(enum log_level level, uint32_t limited_per_sec)
{
    log_level_max = level;
    log_per_sec = limited_per_sec ? limited_per_sec : 1;
    log_journal = getenv("JOURNAL_STREAM") != NULL;
}

static void log_vwrite(enum log_level level, const char *fmt, va_list ap)
{
    char line[1024];
    vsnprintf(line, sizeof(line), fmt, ap);
    if (log_journal) {
        fprintf(stderr, "<%d>%s\n", log_syslog_prio[level], line);
    } else {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ kvcd[%s] %s\n", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                ts.tv_nsec / 1000000, log_level_names[level], line);
    }
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    va_list ap;
    if (level > log_level_max)
        return;
    va_start(ap, fmt);
    log_vwrite(level, fmt, ap);
    va_end(ap);
}

static void log_summary(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(LOG_LEVEL_WARNING, fmt, ap);
    va_end(ap);
}

void log_limited(enum log_level level, const char *fmt, ...)
{
    va_list ap;
    time_t now = time(NULL);
    if (level > log_level_max)
        return;
    if (now != log_window) {
        if (log_window_dropped)
            log_summary("log: %llu client-caused lines suppressed in the last window",
                        (unsigned long long)log_window_dropped);
        log_window = now;
        log_window_count = 0;
        log_window_dropped = 0;
    }
    if (log_window_count >= log_per_sec) {
        log_window_dropped++;
        log_dropped_total++;
        return;
    }
    log_window_count++;
    va_start(ap, fmt);
    log_vwrite(level, fmt, ap);
    va_end(ap);
}

uint64_t log_suppressed(void)
{
    return log_dropped_total;
}
