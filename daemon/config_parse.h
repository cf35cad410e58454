/*
 * config_parse.h — the value parsers of the configuration: sizes, durations, digits.
 *
 * DESIGN
 * The option table (config.c) and the [namespace.PATTERN] sections (config_ns.c) read the
 * same kinds of values, so the parsers sit below both, in a file that knows neither: the
 * configuration's layers point down (config -> config_ns -> config_parse), with no circle
 * (tests/check_layers.py). Pure functions over strings; no state, no locale (ASCII case
 * folding only, so a value reads the same under any LC_CTYPE).
 */
#ifndef KVC_CONFIG_PARSE_H
#define KVC_CONFIG_PARSE_H

#include <stdbool.h>
#include <stdint.h>

/* ch lowered when it is an ASCII capital, else ch. */
int config_parse_lower(int ch);
/* Whether a and b are the same string but for ASCII case. */
bool config_parse_streq_nocase(const char *a, const char *b);
/* Digits only, into *v; -EINVAL when there are none, -ERANGE past 2^64 - 1. Sets *end to the
 * first character after them. */
int config_parse_digits(const char *s, uint64_t *v, const char **end);

/* Sizes: digits with an optional suffix k, m, g or t (case-insensitive, binary: 1k = 1024),
 * optionally followed by "b" or "ib" ("4g", "4GiB", "64kb"), or "b" alone for bytes;
 * "1048576" is bytes. Durations: digits with ms, s, m (minutes) or h; a plain number is
 * milliseconds. Neither takes a sign, whitespace or a fraction ("1.5g" is refused: write
 * 1536m). 0, -EINVAL for text that is not one, -ERANGE past 2^64 - 1. *out is written only
 * on success. */
int config_parse_size(const char *s, uint64_t *out);
int config_parse_duration_ms(const char *s, uint64_t *out);

#endif
