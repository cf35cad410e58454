/*
 * rng.c — see rng.h.
 */
#include <math.h>

#include "tests/lib/rng.h"

uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

float rng_gauss(uint64_t *s)
{
    double u1 = ((rng_next(s) >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (rng_next(s) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
