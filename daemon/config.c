/*
 * config.c — kvcd's configuration: parsing, checking, printing and reload checks, all driven
 * by the option table CONFIG_OPTIONS in config.h.
 *
 * DESIGN
 * Every value, whether a default from the table, a file line or an -o override, goes through
 * one function, config_option_set: parse by type, check the bounds, store. So a default is
 * held to the same rules as user input, and config_get/config_print write each type back in
 * a form the same parser reads, which makes "print, then load" an identity (a test holds us
 * to it, and another that etc/kvcd.ini is exactly config_print of the defaults).
 * inih splits the text into sections and keys. We feed it through our own line reader over
 * a buffer in memory (a file is read whole first): the reader knows the line number, which
 * the packaged inih does not pass to handlers; it strips leading whitespace, so inih never
 * sees an indented line as the continuation of the previous value; and it catches what inih
 * would pass silently: a NUL byte, a line too long for inih's buffer (inih would split it
 * into two lines), and an unknown [section] that holds no keys. The first error by line
 * number is reported. Owned by the loop thread; nothing here keeps global state.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>

#include <ini.h>

#include "daemon/config.h"
#include "daemon/config_ns.h"
#include "daemon/config_parse.h"
#include "tiers/remote_rec.h"

#define CONFIG_FILE_MAX (1u << 20) /* a config file is a few KiB; this catches a wrong path */
#define CONFIG_TEXT_MAX 256        /* value texts and messages built here */
#define CONFIG_WRAP 80             /* columns of the help comments in config_print */
/* Longest string value: "name = value" must fit in inih's line buffer, or a printed
 * configuration would not load back. Paths for the socket stop at 107 bytes anyway. */
#define CONFIG_STRING_MAX 128
#define CONFIG_STRINGIFY_(x) #x
#define CONFIG_STRINGIFY(x) CONFIG_STRINGIFY_(x)
#define CONFIG_NAME_MAX (INI_MAX_LINE - 3 - 3 - CONFIG_STRING_MAX) /* "\r\n\0", " = " */
#define CONFIG_SECRET_SET "(set)" /* what config_get writes for a secret that is set */

/* Options whose value is an owned string: STRING and SECRET. */
static bool config_is_string(const struct config_option *o)
{
    return o->type == CONFIG_TYPE_STRING || o->type == CONFIG_TYPE_SECRET;
}

const struct config_option config_options[] = {
#define CONFIG_ROW(sec, nm, type, def, lo, hi, reload, choices, help)                          \
    {#sec, #nm, CONFIG_TYPE_##type, def, lo, hi, reload, choices, help,                        \
     offsetof(struct config, sec##_##nm)},
    CONFIG_OPTIONS(CONFIG_ROW)
#undef CONFIG_ROW
};

enum {
#define CONFIG_COUNT(sec, nm, type, def, lo, hi, reload, choices, help) +1
    CONFIG_NOPTIONS = 0 CONFIG_OPTIONS(CONFIG_COUNT)
#undef CONFIG_COUNT
};

const size_t config_noptions = CONFIG_NOPTIONS;

/* One parsed value, before it is stored. */
union config_value {
    bool b;
    int64_t i;
    uint64_t u; /* SIZE, DURATION */
    double d;
    char *s; /* owned by the union until stored */
    uint32_t mode;
    int e;
};

static void config_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void config_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!err || !errlen)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static void *config_field(struct config *c, const struct config_option *o)
{
    return (char *)c + o->offset;
}

static const void *config_field_const(const struct config *c, const struct config_option *o)
{
    return (const char *)c + o->offset;
}

/* ---- names and suggestions ----------------------------------------------------------- */

/* Edit distance with adjacent transpositions (optimal string alignment), ignoring case, so
 * "szie" is one edit from "size". Long strings are never suggested. */
static unsigned config_distance(const char *a, const char *b)
{
    enum { N = 64 };
    unsigned short d[N + 1][N + 1];
    size_t la = strlen(a), lb = strlen(b);

    if (la > N || lb > N)
        return UINT16_MAX;
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (unsigned short)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (unsigned short)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int ca = config_parse_lower((unsigned char)a[i - 1]);
            int cb = config_parse_lower((unsigned char)b[j - 1]);
            unsigned best = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1u < best)
                best = d[i - 1][j] + 1u;
            if (d[i][j - 1] + 1u < best)
                best = d[i][j - 1] + 1u;
            if (i > 1 && j > 1 && ca == config_parse_lower((unsigned char)b[j - 2]) &&
                config_parse_lower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1u < best)
                best = d[i - 2][j - 2] + 1u;
            d[i][j] = (unsigned short)best;
        }
    }
    return d[la][lb];
}

/* Close enough to be a typo: two edits, or a third of the candidate's length. */
static bool config_close(unsigned dist, const char *candidate)
{
    return dist <= 2 || dist * 3 <= strlen(candidate);
}

static bool config_section_known(const char *section)
{
    if (strncmp(section, "namespace.", 10) == 0)
        return true; /* the second table, config_ns.h */
    for (size_t i = 0; i < config_noptions; i++)
        if (strcmp(config_options[i].section, section) == 0)
            return true;
    return false;
}

static const struct config_option *config_option_lookup(const char *section, const char *name)
{
    for (size_t i = 0; i < config_noptions; i++)
        if (strcmp(config_options[i].section, section) == 0 &&
            strcmp(config_options[i].name, name) == 0)
            return &config_options[i];
    return NULL;
}

const struct config_option *config_option_find(const char *key)
{
    const char *dot = key ? strchr(key, '.') : NULL;
    char section[64];

    if (!dot || (size_t)(dot - key) >= sizeof(section))
        return NULL;
    memcpy(section, key, (size_t)(dot - key));
    section[dot - key] = '\0';
    return config_option_lookup(section, dot + 1);
}

/* " (did you mean [host]?)" or the list of sections. */
static void config_suggest_section(const char *section, char *out, size_t len)
{
    const char *best = NULL;
    unsigned best_dist = UINT16_MAX;
    size_t n = 0;

    for (size_t i = 0; i < config_noptions; i++) {
        unsigned d = config_distance(section, config_options[i].section);
        if (d < best_dist) {
            best_dist = d;
            best = config_options[i].section;
        }
    }
    if (best && config_close(best_dist, best)) {
        snprintf(out, len, " (did you mean [%s]?)", best);
        return;
    }
    n += (size_t)snprintf(out, len, " (sections:");
    for (size_t i = 0; i < config_noptions && n < len; i++) {
        size_t j = 0;
        while (strcmp(config_options[j].section, config_options[i].section) != 0)
            j++;
        if (j == i) /* first row of its section */
            n += (size_t)snprintf(out + n, len - n, " [%s]", config_options[i].section);
    }
    if (n < len)
        snprintf(out + n, len - n, ")");
}

/* " (did you mean 'size'?)", " (it belongs in [server])" or the keys of the section. */
static void config_suggest_key(const char *section, const char *name, char *out, size_t len)
{
    const struct config_option *best = NULL;
    unsigned best_dist = UINT16_MAX;
    size_t n = 0;

    for (size_t i = 0; i < config_noptions; i++) {
        if (strcmp(config_options[i].name, name) == 0) {
            snprintf(out, len, " (it belongs in [%s])", config_options[i].section);
            return;
        }
    }
    for (size_t i = 0; i < config_noptions; i++) {
        const struct config_option *o = &config_options[i];
        unsigned d;
        if (strcmp(o->section, section) != 0)
            continue;
        d = config_distance(name, o->name);
        if (d < best_dist) {
            best_dist = d;
            best = o;
        }
    }
    if (best && config_close(best_dist, best->name)) {
        snprintf(out, len, " (did you mean '%s'?)", best->name);
        return;
    }
    n += (size_t)snprintf(out, len, " (keys in [%s]:", section);
    for (size_t i = 0; i < config_noptions && n < len; i++)
        if (strcmp(config_options[i].section, section) == 0)
            n += (size_t)snprintf(out + n, len - n, " %s", config_options[i].name);
    if (n < len)
        snprintf(out + n, len - n, ")");
}

/* " (did you mean 'host.size'?)" for a "section.name" key. */
static void config_suggest_option(const char *key, char *out, size_t len)
{
    const struct config_option *best = NULL;
    unsigned best_dist = UINT16_MAX;
    char full[128]; /* section and name are identifiers of the table: short */

    out[0] = '\0';
    for (size_t i = 0; i < config_noptions; i++) {
        const struct config_option *o = &config_options[i];
        unsigned d;
        snprintf(full, sizeof(full), "%s.%s", o->section, o->name);
        d = config_distance(key, full);
        if (d < best_dist) {
            best_dist = d;
            best = o;
        }
    }
    if (!best)
        return;
    snprintf(full, sizeof(full), "%s.%s", best->section, best->name);
    if (config_close(best_dist, full))
        snprintf(out, len, " (did you mean '%.*s'?)", (int)(len > 24 ? len - 24 : 0), full);
}

/* ---- values: parse and format, one pair per type ---------------------------------------- */

static void config_format_size(uint64_t v, char *buf, size_t len)
{
    static const char units[] = "kmgt";

    for (int i = 3; i >= 0 && v; i--) {
        unsigned shift = 10u * (unsigned)(i + 1);
        if ((v & ((UINT64_C(1) << shift) - 1)) == 0) {
            snprintf(buf, len, "%" PRIu64 "%c", v >> shift, units[i]);
            return;
        }
    }
    snprintf(buf, len, "%" PRIu64, v);
}

static void config_format_duration(uint64_t ms, char *buf, size_t len)
{
    if (ms == 0)
        snprintf(buf, len, "0");
    else if (ms % 3600000 == 0)
        snprintf(buf, len, "%" PRIu64 "h", ms / 3600000);
    else if (ms % 60000 == 0)
        snprintf(buf, len, "%" PRIu64 "m", ms / 60000);
    else if (ms % 1000 == 0)
        snprintf(buf, len, "%" PRIu64 "s", ms / 1000);
    else
        snprintf(buf, len, "%" PRIu64 "ms", ms);
}

/* The shortest text that reads back as the same double: 0.95, not 0.94999999999999996. */
static void config_format_double(double d, char *buf, size_t len)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, d);
        if (strtod(buf, NULL) == d)
            return;
    }
}

/* Index of s among "a|b|c" (case-insensitive), or -1. */
static int config_choice_find(const char *choices, const char *s)
{
    size_t slen = strlen(s);
    int idx = 0;

    for (const char *p = choices; p; idx++) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == slen && strncasecmp(p, s, n) == 0)
            return idx;
        p = bar ? bar + 1 : NULL;
    }
    return -1;
}

static int config_choice_count(const char *choices)
{
    int n = 1;

    for (const char *p = choices; *p; p++)
        n += *p == '|';
    return n;
}

static void config_choice_name(const char *choices, int idx, char *buf, size_t len)
{
    const char *p = choices;

    for (int i = 0; i < idx && p; i++) {
        p = strchr(p, '|');
        p = p ? p + 1 : NULL;
    }
    if (!p || idx < 0) {
        snprintf(buf, len, "?");
        return;
    }
    snprintf(buf, len, "%.*s", (int)strcspn(p, "|"), p);
}

/* A string must survive the trip through an ini file unchanged. */
static const char *config_string_problem(const char *s)
{
    size_t n = strlen(s);

    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f)
            return "a control character";
        if (ch == ';' && i > 0 && s[i - 1] == ' ')
            return "\" ;\", which starts a comment";
    }
    if (n && (s[0] == ' ' || s[n - 1] == ' '))
        return "leading or trailing spaces";
    if (s[0] == ';') /* after "name = " it would start a comment */
        return "a leading ';'";
    if (n > CONFIG_STRING_MAX)
        return "more than " CONFIG_STRINGIFY(CONFIG_STRING_MAX) " bytes";
    return NULL;
}

/* s -> *v by o's type; why gets the reason on -EINVAL. */
static int config_value_parse(const struct config_option *o, const char *s,
                              union config_value *v, char *why, size_t whylen)
{
    static const char *const yes[] = {"yes", "true", "on", "1"};
    static const char *const no[] = {"no", "false", "off", "0"};
    const char *end;
    const char *problem;
    uint64_t u;
    char *e;
    int rc = -EINVAL;

    if (!*s && !config_is_string(o)) {
        config_err(why, whylen, "empty value");
        goto out;
    }
    switch (o->type) {
    case CONFIG_TYPE_BOOL:
        for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
            if (config_parse_streq_nocase(s, yes[i]) || config_parse_streq_nocase(s, no[i])) {
                v->b = config_parse_streq_nocase(s, yes[i]);
                rc = 0;
            }
        }
        if (rc)
            config_err(why, whylen, "'%s' is not a boolean (yes/no, true/false, on/off, 1/0)",
                       s);
        break;
    case CONFIG_TYPE_INT:
        /* An integer with words (choices): the n-th word is held as -1 - n, below every
         * number the option allows (negative numbers are refused for it). */
        if (o->choices && config_choice_find(o->choices, s) >= 0) {
            v->i = -1 - (int64_t)config_choice_find(o->choices, s);
            rc = 0;
            break;
        }
        if (o->choices && *s == '-') {
            config_err(why, whylen, "'%s' is out of range", s);
            break;
        }
        rc = config_parse_digits(s + (*s == '-'), &u, &end);
        if (rc == 0 && *end)
            rc = -EINVAL;
        if (rc == 0 && u > (uint64_t)INT64_MAX + (*s == '-'))
            rc = -ERANGE;
        if (rc == 0)
            v->i = *s == '-' ? (int64_t)(0 - u) : (int64_t)u;
        else if (rc == -ERANGE)
            config_err(why, whylen, "'%s' is out of range", s);
        else
            config_err(why, whylen, "'%s' is not an integer", s);
        rc = rc ? -EINVAL : 0;
        break;
    case CONFIG_TYPE_SIZE:
    case CONFIG_TYPE_DURATION:
        rc = o->type == CONFIG_TYPE_SIZE ? config_parse_size(s, &v->u)
                                         : config_parse_duration_ms(s, &v->u);
        if (rc == -ERANGE)
            config_err(why, whylen, "'%s' is out of range", s);
        else if (rc && strchr(s, '.'))
            config_err(why, whylen, "'%s' has a fraction; write whole %s", s,
                       o->type == CONFIG_TYPE_SIZE ? "units (1536m, not 1.5g)"
                                                   : "units (1500ms, not 1.5s)");
        else if (rc && o->type == CONFIG_TYPE_SIZE)
            config_err(why, whylen, "'%s' is not a size (bytes, or a number with k, m, g or "
                                    "t: 64k, 512m, 4g)", s);
        else if (rc)
            config_err(why, whylen, "'%s' is not a duration (a number with ms, s, m or h: "
                                    "500ms, 10s; a plain number is ms)", s);
        rc = rc ? -EINVAL : 0;
        break;
    case CONFIG_TYPE_DOUBLE:
        /* Plain decimal only: strtod would also take "inf", "nan", hex and leading space. */
        if (strspn(s, "0123456789.eE+-") == strlen(s)) {
            errno = 0;
            v->d = strtod(s, &e);
            if (*e == '\0' && e != s && errno == 0 && isfinite(v->d))
                rc = 0;
        }
        if (rc)
            config_err(why, whylen, "'%s' is not a number", s);
        break;
    case CONFIG_TYPE_STRING:
    case CONFIG_TYPE_SECRET:
        problem = config_string_problem(s);
        if (problem) {
            config_err(why, whylen, "value has %s", problem);
            break;
        }
        v->s = strdup(s);
        rc = v->s ? 0 : -ENOMEM;
        if (rc)
            config_err(why, whylen, "out of memory");
        break;
    case CONFIG_TYPE_MODE:
        if (strspn(s, "01234567") == strlen(s) && strlen(s) <= 6) {
            v->mode = (uint32_t)strtoul(s, NULL, 8);
            rc = 0;
        } else {
            config_err(why, whylen, "'%s' is not an octal mode (such as 0660)", s);
        }
        break;
    case CONFIG_TYPE_ENUM:
        v->e = config_choice_find(o->choices, s);
        if (v->e >= 0) {
            rc = 0;
        } else {
            char list[CONFIG_TEXT_MAX];
            snprintf(list, sizeof(list), "%s", o->choices);
            for (char *p = list; *p; p++)
                if (*p == '|')
                    *p = '/';
            config_err(why, whylen, "'%s' is not one of %s", s, list);
        }
        break;
    }
out:
    return rc;
}

/* Whether v is one of an integer option's words (held as -1 - its index in choices). */
static bool config_int_word(const struct config_option *o, const union config_value *v)
{
    return o->type == CONFIG_TYPE_INT && o->choices && v->i < 0;
}

/* Numeric view of a value for the bounds check; false for types without bounds. */
static bool config_has_bounds(const struct config_option *o)
{
    bool numeric = o->type == CONFIG_TYPE_INT || o->type == CONFIG_TYPE_SIZE ||
                   o->type == CONFIG_TYPE_DURATION || o->type == CONFIG_TYPE_DOUBLE ||
                   o->type == CONFIG_TYPE_MODE;
    return numeric && !(o->min == 0 && o->max == 0);
}

static bool config_value_number(const struct config_option *o, const union config_value *v,
                                double *d)
{
    if (!config_has_bounds(o) || config_int_word(o, v))
        return false;
    switch (o->type) {
    case CONFIG_TYPE_INT: *d = (double)v->i; return true;
    case CONFIG_TYPE_SIZE:
    case CONFIG_TYPE_DURATION: *d = (double)v->u; return true;
    case CONFIG_TYPE_DOUBLE: *d = v->d; return true;
    case CONFIG_TYPE_MODE: *d = v->mode; return true;
    default: return false;
    }
}

/* Text of a value as a file would hold it. */
static void config_value_format(const struct config_option *o, const union config_value *v,
                                char *buf, size_t len)
{
    switch (o->type) {
    case CONFIG_TYPE_BOOL: snprintf(buf, len, "%s", v->b ? "yes" : "no"); break;
    case CONFIG_TYPE_INT:
        if (config_int_word(o, v))
            config_choice_name(o->choices, (int)(-1 - v->i), buf, len);
        else
            snprintf(buf, len, "%" PRId64, v->i);
        break;
    case CONFIG_TYPE_SIZE: config_format_size(v->u, buf, len); break;
    case CONFIG_TYPE_DURATION: config_format_duration(v->u, buf, len); break;
    case CONFIG_TYPE_DOUBLE: config_format_double(v->d, buf, len); break;
    case CONFIG_TYPE_STRING: snprintf(buf, len, "%s", v->s); break;
    case CONFIG_TYPE_SECRET: snprintf(buf, len, "%s", *v->s ? CONFIG_SECRET_SET : ""); break;
    case CONFIG_TYPE_MODE: snprintf(buf, len, "%04" PRIo32, v->mode); break;
    case CONFIG_TYPE_ENUM: config_choice_name(o->choices, v->e, buf, len); break;
    }
}

/* A bound (a double in the table) in the option's own notation: 16m, 0777, 1h. */
static void config_bound_format(const struct config_option *o, double bound, char *buf,
                                size_t len)
{
    union config_value v;

    switch (o->type) {
    case CONFIG_TYPE_INT: v.i = (int64_t)bound; break;
    case CONFIG_TYPE_SIZE:
    case CONFIG_TYPE_DURATION: v.u = (uint64_t)bound; break;
    case CONFIG_TYPE_MODE: v.mode = (uint32_t)bound; break;
    default: v.d = bound; break;
    }
    config_value_format(o, &v, buf, len);
}

static void config_value_load(const struct config *c, const struct config_option *o,
                              union config_value *v)
{
    const void *f = config_field_const(c, o);

    switch (o->type) {
    case CONFIG_TYPE_BOOL: v->b = *(const bool *)f; break;
    case CONFIG_TYPE_INT: v->i = *(const int64_t *)f; break;
    case CONFIG_TYPE_SIZE:
    case CONFIG_TYPE_DURATION: v->u = *(const uint64_t *)f; break;
    case CONFIG_TYPE_DOUBLE: v->d = *(const double *)f; break;
    case CONFIG_TYPE_STRING:
    case CONFIG_TYPE_SECRET: v->s = *(char *const *)f; break;
    case CONFIG_TYPE_MODE: v->mode = *(const uint32_t *)f; break;
    case CONFIG_TYPE_ENUM: v->e = *(const int *)f; break;
    }
}

/* Takes ownership of v->s for strings. */
static void config_value_store(struct config *c, const struct config_option *o,
                               const union config_value *v)
{
    void *f = config_field(c, o);

    switch (o->type) {
    case CONFIG_TYPE_BOOL: *(bool *)f = v->b; break;
    case CONFIG_TYPE_INT: *(int64_t *)f = v->i; break;
    case CONFIG_TYPE_SIZE:
    case CONFIG_TYPE_DURATION: *(uint64_t *)f = v->u; break;
    case CONFIG_TYPE_DOUBLE: *(double *)f = v->d; break;
    case CONFIG_TYPE_STRING:
    case CONFIG_TYPE_SECRET:
        free(*(char **)f);
        *(char **)f = v->s;
        break;
    case CONFIG_TYPE_MODE: *(uint32_t *)f = v->mode; break;
    case CONFIG_TYPE_ENUM: *(int *)f = v->e; break;
    }
}

static bool config_value_equal(const struct config_option *o, const union config_value *a,
                               const union config_value *b)
{
    switch (o->type) {
    case CONFIG_TYPE_BOOL: return a->b == b->b;
    case CONFIG_TYPE_INT: return a->i == b->i;
    case CONFIG_TYPE_SIZE:
    case CONFIG_TYPE_DURATION: return a->u == b->u;
    case CONFIG_TYPE_DOUBLE: return a->d == b->d;
    case CONFIG_TYPE_STRING:
    case CONFIG_TYPE_SECRET: return strcmp(a->s, b->s) == 0;
    case CONFIG_TYPE_MODE: return a->mode == b->mode;
    case CONFIG_TYPE_ENUM: return a->e == b->e;
    }
    return false;
}

/* "out of bounds (16m .. 4t)" into why, or 0. */
static int config_value_check(const struct config_option *o, const union config_value *v,
                              char *why, size_t whylen)
{
    char text[CONFIG_TEXT_MAX], lo[64], hi[64];
    double d;

    if (o->type == CONFIG_TYPE_ENUM && (v->e < 0 || v->e >= config_choice_count(o->choices))) {
        config_err(why, whylen, "enum index %d is out of range", v->e);
        return -EINVAL;
    }
    if (!config_value_number(o, v, &d) || (d >= o->min && d <= o->max))
        return 0;
    config_value_format(o, v, text, sizeof(text));
    config_bound_format(o, o->min, lo, sizeof(lo));
    config_bound_format(o, o->max, hi, sizeof(hi));
    config_err(why, whylen, "%s is out of bounds (%s .. %s)", text, lo, hi);
    return -EINVAL;
}

/* The one way a value gets in: parse, check bounds, store. */
static int config_option_set(struct config *c, const struct config_option *o, const char *s,
                             char *why, size_t whylen)
{
    union config_value v;
    int rc = config_value_parse(o, s, &v, why, whylen);

    if (rc < 0)
        goto out;
    rc = config_value_check(o, &v, why, whylen);
    if (rc < 0) {
        if (config_is_string(o))
            free(v.s);
        goto out;
    }
    config_value_store(c, o, &v);
out:
    return rc;
}

uint32_t config_io_threads_auto(long cpus)
{
    return cpus < 4 ? 0 : cpus >= 16 ? 4 : (uint32_t)(cpus / 4);
}

/* ---- lifetime -------------------------------------------------------------------------- */

void config_free(struct config *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < config_noptions; i++)
        if (config_is_string(&config_options[i])) {
            char *v = *(char **)config_field(c, &config_options[i]);
            if (v && config_options[i].type == CONFIG_TYPE_SECRET)
                explicit_bzero(v, strlen(v));
            free(v);
        }
    config_ns_clear(&c->ns);
    free(c);
}

struct config *config_new(void)
{
    struct config *c = calloc(1, sizeof(*c));
    char why[CONFIG_TEXT_MAX];

    if (!c)
        return NULL;
    for (size_t i = 0; i < config_noptions; i++) {
        const struct config_option *o = &config_options[i];
        int rc;
        assert(o->type != CONFIG_TYPE_ENUM || o->choices);
        assert(strlen(o->name) <= CONFIG_NAME_MAX);
        rc = config_option_set(c, o, o->def, why, sizeof(why));
        if (rc == -ENOMEM) {
            config_free(c);
            return NULL;
        }
        /* A default that does not parse or is out of its own bounds is a bug in the table. */
        assert(rc == 0);
    }
    return c;
}

struct config *config_dup(const struct config *c)
{
    struct config *d = malloc(sizeof(*d));

    if (!d)
        return NULL;
    memcpy(d, c, sizeof(*d));
    /* Unshare every string first, so that a failure half-way frees only our copies. */
    for (size_t i = 0; i < config_noptions; i++)
        if (config_is_string(&config_options[i]))
            *(char **)config_field(d, &config_options[i]) = NULL;
    if (config_ns_copy(&d->ns, &c->ns)) {
        config_free(d);
        return NULL;
    }
    for (size_t i = 0; i < config_noptions; i++) {
        const struct config_option *o = &config_options[i];
        char **s;
        if (!config_is_string(o))
            continue;
        s = config_field(d, o);
        *s = strdup(*(char *const *)config_field_const(c, o));
        if (!*s) {
            config_free(d);
            return NULL;
        }
    }
    return d;
}

/* ---- parsing a file -------------------------------------------------------------------- */

struct config_parse {
    struct config *c;
    const char *name; /* file name in messages */
    const char *buf;  /* borrowed for the parse */
    size_t len, pos;
    int lineno;      /* of the line inih is processing */
    int err_line;    /* of the first error; 0 while none */
    int rc;          /* 0, -EINVAL or -ENOMEM */
    char *err;
    size_t errlen;
    int set_line[CONFIG_NOPTIONS]; /* where each option was set, to refuse duplicates */
};

static void config_parse_fail(struct config_parse *p, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void config_parse_fail(struct config_parse *p, int rc, const char *fmt, ...)
{
    char msg[2 * CONFIG_TEXT_MAX];
    va_list ap;

    if (p->err_line)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    p->err_line = p->lineno;
    p->rc = rc;
    config_err(p->err, p->errlen, "%s:%d: %s", p->name, p->lineno, msg);
}

static void config_parse_section(struct config_parse *p, const char *line)
{
    const char *end = strchr(line, ']');
    char section[64], hint[CONFIG_TEXT_MAX];
    size_t n;

    if (!end)
        return; /* inih reports it as a syntax error */
    n = (size_t)(end - line - 1);
    if (n >= sizeof(section))
        n = sizeof(section) - 1;
    memcpy(section, line + 1, n);
    section[n] = '\0';
    if (config_section_known(section))
        return;
    config_suggest_section(section, hint, sizeof(hint));
    config_parse_fail(p, -EINVAL, "unknown section [%s]%s", section, hint);
}

/* fgets for inih over the buffer: one line per call, so inih's line count is ours. */
static char *config_parse_reader(char *str, int num, void *stream)
{
    struct config_parse *p = stream;
    const char *line, *nl;
    size_t n;

    if (p->pos >= p->len)
        return NULL;
    line = p->buf + p->pos;
    nl = memchr(line, '\n', p->len - p->pos);
    n = nl ? (size_t)(nl - line) : p->len - p->pos;
    p->pos += n + (nl != NULL);
    p->lineno++;
    if (p->lineno == 1 && n >= 3 && memcmp(line, "\xef\xbb\xbf", 3) == 0) {
        line += 3;
        n -= 3;
    }
    while (n && (*line == ' ' || *line == '\t')) {
        line++;
        n--;
    }
    if (memchr(line, '\0', n)) {
        config_parse_fail(p, -EINVAL, "NUL byte in line");
        n = 0;
    } else if (num < 3 || n > (size_t)num - 3) {
        /* inih needs room for "\r\n\0"; it would split a longer line in two. */
        config_parse_fail(p, -EINVAL, "line longer than %d characters", num - 3);
        n = 0;
    }
    memcpy(str, line, n);
    str[n] = '\0';
    if (n && str[0] == '[')
        config_parse_section(p, str);
    return str;
}

static int config_parse_handler(void *user, const char *section, const char *name,
                                const char *value)
{
    struct config_parse *p = user;
    const struct config_option *o;
    char why[CONFIG_TEXT_MAX];
    size_t idx;
    int rc;

    if (!*section) {
        config_parse_fail(p, -EINVAL, "key '%s' outside of any [section]", name);
        goto out;
    }
    if (!config_section_known(section)) {
        config_suggest_section(section, why, sizeof(why));
        config_parse_fail(p, -EINVAL, "unknown section [%s]%s", section, why);
        goto out;
    }
    if (strncmp(section, "namespace.", 10) == 0) {
        rc = config_ns_set(&p->c->ns, section + 10, name, value, why, sizeof(why));
        if (rc < 0)
            config_parse_fail(p, rc, "%s", why);
        goto out;
    }
    o = config_option_lookup(section, name);
    if (!o) {
        config_suggest_key(section, name, why, sizeof(why));
        config_parse_fail(p, -EINVAL, "unknown key '%s' in [%s]%s", name, section, why);
        goto out;
    }
    idx = (size_t)(o - config_options);
    if (p->set_line[idx]) {
        config_parse_fail(p, -EINVAL, "duplicate key '%s' in [%s] (first set on line %d)",
                          name, section, p->set_line[idx]);
        goto out;
    }
    p->set_line[idx] = p->lineno;
    rc = config_option_set(p->c, o, value, why, sizeof(why));
    if (rc < 0)
        config_parse_fail(p, rc, "%s.%s: %s", section, name, why);
out:
    /* Always go on: we keep the first error ourselves, with our line numbers. */
    return 1;
}

int config_load_buffer(struct config *c, const char *name, const char *buf, size_t len,
                       char *err, size_t errlen)
{
    struct config_parse p = {
        .c = c, .name = name, .buf = buf, .len = len, .err = err, .errlen = errlen,
    };
    int line;

    if (err && errlen)
        err[0] = '\0';
    line = ini_parse_stream(config_parse_reader, &p, config_parse_handler, &p);
    if (line == -2 && !p.err_line) {
        config_err(err, errlen, "%s: out of memory", name);
        p.rc = -ENOMEM;
    } else if (line > 0 && (!p.err_line || line < p.err_line)) {
        config_err(err, errlen, "%s:%d: syntax error (expected [section] or key = value)",
                   name, line);
        p.rc = -EINVAL;
    }
    return p.rc;
}

int config_load_file(struct config *c, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "re");
    char *buf = NULL;
    size_t len = 0, n;
    int rc = 0;

    if (err && errlen)
        err[0] = '\0';
    if (!f) {
        rc = -errno;
        config_err(err, errlen, "%s: %s", path, strerror(-rc));
        goto out;
    }
    buf = malloc(CONFIG_FILE_MAX + 1);
    if (!buf) {
        rc = -ENOMEM;
        config_err(err, errlen, "%s: out of memory", path);
        goto out;
    }
    while ((n = fread(buf + len, 1, CONFIG_FILE_MAX + 1 - len, f)) > 0 &&
           len + n <= CONFIG_FILE_MAX)
        len += n;
    if (ferror(f)) {
        rc = errno ? -errno : -EIO;
        config_err(err, errlen, "%s: %s", path, strerror(-rc));
        goto out;
    }
    if (n > 0) {
        rc = -EFBIG;
        config_err(err, errlen, "%s: larger than %u bytes", path, CONFIG_FILE_MAX);
        goto out;
    }
    rc = config_load_buffer(c, path, buf, len, err, errlen);
out:
    free(buf);
    if (f)
        fclose(f);
    return rc;
}

/* ---- overrides, queries, checks -------------------------------------------------------- */

int config_set(struct config *c, const char *key, const char *value, char *err, size_t errlen)
{
    const struct config_option *o = config_option_find(key);
    char why[CONFIG_TEXT_MAX];
    int rc;

    if (err && errlen)
        err[0] = '\0';
    if (!o) {
        if (!strchr(key, '.')) {
            config_err(err, errlen, "'%s' is not section.name (such as host.size)", key);
        } else {
            config_suggest_option(key, why, sizeof(why));
            config_err(err, errlen, "unknown option '%s'%s", key, why);
        }
        return -EINVAL;
    }
    rc = config_option_set(c, o, value, why, sizeof(why));
    if (rc < 0)
        config_err(err, errlen, "%s.%s: %s", o->section, o->name, why);
    return rc;
}

/* The string options by who may read them (config_option_access). */
#define CONFIG_STRING_ACCESS(X)                                                                \
    X("server.socket", ANYONE)                                                                 \
    X("server.socket_group", ADMIN)                                                            \
    X("server.admin_group", ADMIN)                                                             \
    X("disk.path", ADMIN)                                                                      \
    X("disk.checkpoint_path", ADMIN)                                                           \
    X("remote.nodes", ADMIN)                                                                   \
    X("remote.user", ADMIN)                                                                    \
    X("remote.password", ADMIN)                                                                \
    X("remote.password_file", ADMIN)                                                           \
    X("remote.key_file", ADMIN)

enum config_access config_option_access(const struct config_option *o)
{
    static const struct {
        const char *key;
        enum config_access access;
    } table[] = {
#define CONFIG_ACCESS_ROW(key, who) {key, CONFIG_ACCESS_##who},
        CONFIG_STRING_ACCESS(CONFIG_ACCESS_ROW)
#undef CONFIG_ACCESS_ROW
    };
    size_t sl = strlen(o->section);
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (strncmp(table[i].key, o->section, sl) == 0 && table[i].key[sl] == '.' &&
            strcmp(table[i].key + sl + 1, o->name) == 0)
            return table[i].access;
    return config_is_string(o) ? CONFIG_ACCESS_NONE : CONFIG_ACCESS_ANYONE;
}

int config_get(const struct config *c, const char *key, char *buf, size_t len)
{
    const struct config_option *o = config_option_find(key);
    union config_value v;
    char text[CONFIG_TEXT_MAX];
    int n;

    if (!o) {
        if (len)
            buf[0] = '\0';
        return -ENOENT;
    }
    config_value_load(c, o, &v);
    if (o->type == CONFIG_TYPE_STRING) {
        n = snprintf(buf, len, "%s", v.s);
    } else {
        config_value_format(o, &v, text, sizeof(text));
        n = snprintf(buf, len, "%s", text);
    }
    return n >= 0 && (size_t)n < len ? 0 : -ENOSPC;
}

int config_get_json(const struct config *c, const struct config_option *o, char *buf, size_t len)
{
    union config_value v;
    char text[CONFIG_TEXT_MAX];
    const char *s = text;
    size_t n = 0;

    config_value_load(c, o, &v);
    switch (config_int_word(o, &v) ? CONFIG_TYPE_ENUM : o->type) { /* a word: a string */
    case CONFIG_TYPE_BOOL: n = (size_t)snprintf(buf, len, "%s", v.b ? "true" : "false"); break;
    case CONFIG_TYPE_INT: n = (size_t)snprintf(buf, len, "%" PRId64, v.i); break;
    case CONFIG_TYPE_SIZE:
    case CONFIG_TYPE_DURATION: n = (size_t)snprintf(buf, len, "%" PRIu64, v.u); break;
    case CONFIG_TYPE_DOUBLE: n = (size_t)snprintf(buf, len, "%.17g", v.d); break;
    default:
        /* a JSON string: quotes, backslashes and control characters escaped */
        if (o->type == CONFIG_TYPE_STRING)
            s = v.s;
        else
            config_value_format(o, &v, text, sizeof(text));
        if (len)
            buf[n++] = '"';
        for (; *s && n + 8 < len; s++) {
            unsigned char ch = (unsigned char)*s;
            if (ch == '"' || ch == '\\')
                n += (size_t)snprintf(buf + n, len - n, "\\%c", ch);
            else if (ch < 0x20)
                n += (size_t)snprintf(buf + n, len - n, "\\u%04x", ch);
            else
                buf[n++] = (char)ch;
        }
        if (*s || n + 2 > len)
            return -ENOSPC;
        buf[n++] = '"';
        buf[n] = '\0';
        return 0;
    }
    return n < len ? 0 : -ENOSPC;
}

/* An unsealed remote tier takes no namespace with access lists, and no group secret. */
static int config_validate_unsealed(const struct config *c, char *err, size_t errlen)
{
    for (size_t i = 0; i < c->ns.n; i++) {
        const struct config_ns *ns = &c->ns.sec[i];
        if (ns->remote_key_file[0] || (ns->remote == 1 && config_ns_restricted(ns))) {
            config_err(err, errlen,
                       "[namespace.%s]: %s needs remote.seal = yes (an unsealed remote tier "
                       "holds only namespaces open to everyone)",
                       ns->pattern,
                       ns->remote_key_file[0] ? "remote_key_file"
                                              : "remote = yes with read or write lists");
            return -EINVAL;
        }
    }
    return 0;
}

int config_validate(const struct config *c, char *err, size_t errlen)
{
    char why[CONFIG_TEXT_MAX];
    int rc = 0;

    if (err && errlen)
        err[0] = '\0';
    /* Bounds again: code may have filled the struct without config_set. */
    for (size_t i = 0; i < config_noptions; i++) {
        const struct config_option *o = &config_options[i];
        union config_value v;
        config_value_load(c, o, &v);
        if (config_is_string(o) && !v.s) {
            config_err(err, errlen, "%s.%s: missing value", o->section, o->name);
            return -EINVAL;
        }
        if (config_value_check(o, &v, why, sizeof(why)) < 0) {
            config_err(err, errlen, "%s.%s: %s", o->section, o->name, why);
            return -EINVAL;
        }
    }
    if (!(c->host_low_watermark < c->host_high_watermark)) {
        config_err(err, errlen, "host.low_watermark (%g) must be below host.high_watermark (%g)",
                   c->host_low_watermark, c->host_high_watermark);
        rc = -EINVAL;
    } else if (c->host_page_size & (c->host_page_size - 1)) {
        config_format_size(c->host_page_size, why, sizeof(why));
        config_err(err, errlen, "host.page_size (%s) must be a power of two", why);
        rc = -EINVAL;
    } else if (c->host_size < c->host_page_size) {
        char page[64];
        config_format_size(c->host_size, why, sizeof(why));
        config_format_size(c->host_page_size, page, sizeof(page));
        config_err(err, errlen, "host.size (%s) must be at least host.page_size (%s)", why,
                   page);
        rc = -EINVAL;
    } else if (c->remote_part_size && c->remote_part_size < REMOTE_REC_PART_MIN) {
        config_format_size(c->remote_part_size, why, sizeof(why));
        config_err(err, errlen,
                   "remote.part_size (%s) must be 0 (a block is one value) or at least 64k", why);
        rc = -EINVAL;
    } else if (!c->remote_seal && (rc = config_validate_unsealed(c, err, errlen)) != 0) {
        /* named in err */
    } else if (c->gpu_pool_page_size & (c->gpu_pool_page_size - 1)) {
        config_format_size(c->gpu_pool_page_size, why, sizeof(why));
        config_err(err, errlen, "gpu.pool_page_size (%s) must be a power of two", why);
        rc = -EINVAL;
    } else if (strlen(c->server_socket) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
        config_err(err, errlen, "server.socket: path longer than %zu bytes",
                   sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
        rc = -EINVAL;
    }
    return rc;
}

int config_check_reload(const struct config *cur, const struct config *next, char *err,
                        size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    for (size_t i = 0; i < config_noptions; i++) {
        const struct config_option *o = &config_options[i];
        union config_value a, b;
        char ta[CONFIG_TEXT_MAX], tb[CONFIG_TEXT_MAX];
        if (o->reloadable)
            continue;
        config_value_load(cur, o, &a);
        config_value_load(next, o, &b);
        if (config_value_equal(o, &a, &b))
            continue;
        config_value_format(o, &a, ta, sizeof(ta));
        config_value_format(o, &b, tb, sizeof(tb));
        config_err(err, errlen,
                   "%s.%s cannot change on reload ('%s' -> '%s'); restart kvcd to apply it",
                   o->section, o->name, ta, tb);
        return -EROFS;
    }
    return config_ns_check_reload(&cur->ns, &next->ns, err, errlen);
}

/* ---- printing -------------------------------------------------------------------------- */

/* Text as "# " comment lines of at most CONFIG_WRAP columns, broken at spaces. */
static void config_print_comment(FILE *f, const char *text)
{
    const size_t width = CONFIG_WRAP - 2;

    while (*text) {
        size_t n = strlen(text), cut = n;
        if (n > width) {
            cut = width;
            while (cut > 0 && text[cut] != ' ')
                cut--;
            if (cut == 0) /* one word longer than a line: keep it whole */
                cut = strcspn(text, " ");
        }
        fprintf(f, "# %.*s\n", (int)cut, text);
        text += cut;
        while (*text == ' ')
            text++;
    }
}

/* "TYPE[ CHOICES][, MIN .. MAX]; default: D; reloadable: yes|no" of an option, into line. */
static void config_option_line(const struct config_option *o, char *line, size_t len)
{
    static const char *const type_names[] = {
        [CONFIG_TYPE_BOOL] = "boolean (yes/no)",
        [CONFIG_TYPE_INT] = "integer",
        [CONFIG_TYPE_SIZE] = "size (bytes; k, m, g, t)",
        [CONFIG_TYPE_DURATION] = "duration (ms, s, m, h)",
        [CONFIG_TYPE_DOUBLE] = "number",
        [CONFIG_TYPE_STRING] = "string",
        [CONFIG_TYPE_SECRET] = "secret string (never shown)",
        [CONFIG_TYPE_MODE] = "octal mode",
        [CONFIG_TYPE_ENUM] = "one of",
    };
    char lo[64], hi[64], def[CONFIG_TEXT_MAX];
    union config_value v;
    int n;

    n = snprintf(line, len, "%s", type_names[o->type]);
    if (o->type == CONFIG_TYPE_ENUM)
        n += snprintf(line + n, len - (size_t)n, " %s", o->choices);
    else if (o->choices) /* an integer with words */
        n += snprintf(line + n, len - (size_t)n, " or %s", o->choices);
    if (config_has_bounds(o)) {
        config_bound_format(o, o->min, lo, sizeof(lo));
        config_bound_format(o, o->max, hi, sizeof(hi));
        n += snprintf(line + n, len - (size_t)n, ", %s .. %s", lo, hi);
    }
    /* The default as config_get would write it: 0.9, not the table's 0.90. */
    if (config_value_parse(o, o->def, &v, def, sizeof(def)) == 0) {
        config_value_format(o, &v, def, sizeof(def));
        if (config_is_string(o))
            free(v.s);
    }
    if (!*def)
        snprintf(def, sizeof(def), "empty");
    snprintf(line + n, len - (size_t)n, "; default: %s; reloadable: %s", def,
             o->reloadable ? "yes" : "no");
}

static void config_print_option(FILE *f, const struct config *c, const struct config_option *o)
{
    char line[2 * CONFIG_TEXT_MAX], def[CONFIG_TEXT_MAX];
    union config_value v;

    config_print_comment(f, o->help);
    config_option_line(o, line, sizeof(line));
    config_print_comment(f, line);
    config_value_load(c, o, &v);
    if (config_is_string(o) && !*v.s) {
        fprintf(f, "%s =\n", o->name);
    } else if (o->type == CONFIG_TYPE_SECRET) {
        fprintf(f, "# %s is set; its value is never printed\n", o->name);
    } else if (o->type == CONFIG_TYPE_STRING) {
        fprintf(f, "%s = %s\n", o->name, v.s);
    } else {
        config_value_format(o, &v, def, sizeof(def));
        fprintf(f, "%s = %s\n", o->name, def);
    }
}

/* Text for a troff paragraph: a backslash as \e, hyphens as \-, no leading . or '. */
static void config_man_text(FILE *f, const char *s)
{
    if (*s == '.' || *s == '\'')
        fputs("\\&", f);
    for (; *s; s++) {
        if (*s == '\\')
            fputs("\\e", f);
        else if (*s == '-')
            fputs("\\-", f);
        else
            fputc(*s, f);
    }
}

int config_print_man(FILE *f)
{
    char line[2 * CONFIG_TEXT_MAX];
    for (size_t i = 0; i < config_noptions; i++) {
        size_t first = 0;
        while (strcmp(config_options[first].section, config_options[i].section) != 0)
            first++;
        if (first != i)
            continue; /* section already printed */
        fprintf(f, ".SS [%s]\n", config_options[i].section);
        for (size_t j = i; j < config_noptions; j++) {
            const struct config_option *o = &config_options[j];
            if (strcmp(o->section, config_options[i].section) != 0)
                continue;
            fputs(".TP\n.B ", f);
            config_man_text(f, o->name);
            fputc('\n', f);
            config_man_text(f, o->help);
            fputs("\n.br\n", f);
            config_option_line(o, line, sizeof(line));
            config_man_text(f, line);
            fputc('\n', f);
        }
    }
    return ferror(f) ? -EIO : 0;
}

int config_print(const struct config *c, FILE *f)
{
    fputs("# kvcd configuration, generated by `kvcd --print-config` from the option\n"
          "# table in daemon/config.h. etc/kvcd.ini is that output for the defaults\n"
          "# (`make config-ini`): there every option is at its default, and a test fails\n"
          "# if the file drifts from the table.\n"
          "#\n"
          "# Each option: its help; its type, bounds, default and whether `kvcctl reload`\n"
          "# applies a change (reloadable: no needs a restart); then its value. Sizes take\n"
          "# k, m, g, t (binary: 1k = 1024 bytes); durations ms, s, m, h (a plain number\n"
          "# is milliseconds); no fractions. A key given twice is an error. Override one\n"
          "# option on the command line with -o section.name=value.\n",
          f);
    for (size_t i = 0; i < config_noptions; i++) {
        size_t first = 0;
        while (strcmp(config_options[first].section, config_options[i].section) != 0)
            first++;
        if (first != i)
            continue; /* section already printed */
        fprintf(f, "\n[%s]\n", config_options[i].section);
        for (size_t j = i; j < config_noptions; j++) {
            if (strcmp(config_options[j].section, config_options[i].section) != 0)
                continue;
            fputc('\n', f);
            config_print_option(f, c, &config_options[j]);
        }
    }
    config_ns_print(&c->ns, f);
    return ferror(f) ? -EIO : 0;
}
