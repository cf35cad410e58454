/*
 * log.h — leveled logging to stderr (the journal under systemd).
 *
 * Lines read "subsystem: what failed (cause)". Lines a client can trigger go through
 * log_limited(), a token bucket per second; what it drops is counted and summarised.
 * Called from the loop thread only.
 */
#ifndef KVC_LOG_H
#define KVC_LOG_H

#include <stdint.h>

enum log_level { LOG_LEVEL_ERROR, LOG_LEVEL_WARNING, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };

void log_setup(enum log_level level, uint32_t limited_per_sec);
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_limited(enum log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Lines log_limited() dropped since start. */
uint64_t log_suppressed(void);

#define log_err(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LEVEL_WARNING, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
