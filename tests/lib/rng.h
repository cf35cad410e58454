/*
 * rng.h — the tests' and benchmarks' pseudo-random numbers: xorshift64 from a caller's state,
 * so every run of a case or a benchmark draws the same data from the same seed.
 */
#ifndef KVC_TESTS_RNG_H
#define KVC_TESTS_RNG_H

#include <stdint.h>

/* The next number of state *s (not 0: xorshift64 stays at 0). */
uint64_t rng_next(uint64_t *s);
/* A standard normal draw (Box-Muller over two rng_next draws). */
float rng_gauss(uint64_t *s);

#endif
