/*
 * config_parse.c — the configuration's value parsers (config_parse.h).
 *
 * DESIGN
 * See config_parse.h: below both the option table and the namespace sections, knowing
 * neither. Pure functions; nothing here keeps state.
 */
#include <errno.h>
#include <stddef.h>

#include "daemon/config_parse.h"

int config_parse_lower(int ch)
{
    return ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch;
}

bool config_parse_streq_nocase(const char *a, const char *b)
{
    while (*a && config_parse_lower((unsigned char)*a) == config_parse_lower((unsigned char)*b)) {
        a++;
        b++;
    }
    return *a == '\0' && *b == '\0';
}

int config_parse_digits(const char *s, uint64_t *v, const char **end)
{
    uint64_t acc = 0;
    const char *p = s;

    if (*p < '0' || *p > '9')
        return -EINVAL;
    for (; *p >= '0' && *p <= '9'; p++)
        if (__builtin_mul_overflow(acc, 10, &acc) || __builtin_add_overflow(acc, *p - '0', &acc))
            return -ERANGE;
    *v = acc;
    *end = p;
    return 0;
}

int config_parse_size(const char *s, uint64_t *out)
{
    uint64_t v;
    const char *p;
    unsigned shift = 0;
    int rc = config_parse_digits(s, &v, &p);

    if (rc < 0)
        return rc;
    switch (config_parse_lower((unsigned char)*p)) {
    case 'k':
        shift = 10;
        break;
    case 'm':
        shift = 20;
        break;
    case 'g':
        shift = 30;
        break;
    case 't':
        shift = 40;
        break;
    case '\0':
        break;
    case 'b': /* bytes: "512b" */
        if (p[1])
            return -EINVAL;
        *out = v;
        return 0;
    default:
        return -EINVAL;
    }
    if (shift) {
        p++;
        if (config_parse_lower((unsigned char)*p) == 'i' &&
            config_parse_lower((unsigned char)p[1]) == 'b')
            p += 2;
        else if (config_parse_lower((unsigned char)*p) == 'b')
            p++;
    }
    if (*p)
        return -EINVAL;
    if (shift && v > (UINT64_MAX >> shift))
        return -ERANGE;
    *out = v << shift;
    return 0;
}

int config_parse_duration_ms(const char *s, uint64_t *out)
{
    static const struct {
        const char *suffix;
        uint64_t ms;
    } units[] = {{"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
    uint64_t v;
    const char *p;
    int rc = config_parse_digits(s, &v, &p);

    if (rc < 0)
        return rc;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (config_parse_streq_nocase(p, units[i].suffix)) {
            if (__builtin_mul_overflow(v, units[i].ms, &v))
                return -ERANGE;
            *out = v;
            return 0;
        }
    }
    return -EINVAL;
}
