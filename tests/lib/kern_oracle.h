/*
 * kern_oracle.h — a second, straightforward implementation of the encoded block format, for
 * the kernel tests: the expected bytes of every codec, computed without the code under test.
 *
 * DESIGN
 * Written from the format description alone (kernels/kern.h, docs/kernels.md): header and
 * section table laid out byte by byte, every codec as plain loops over (layer, kind, token,
 * head, group), fp16 and bf16 rounding through double arithmetic (nearbyint), E4M3 by a
 * search for the nearest of the 127 magnitudes. It shares no code with kernels/: kern.h
 * gives it the types and constants only, and nothing of kern_fmt.h is used, so a bug in
 * the arithmetic the reference, AVX2 and CUDA versions share cannot hide from it. Slow and
 * single-threaded; fine for test blocks of a few hundred KiB.
 */
#ifndef KVC_TESTS_KERN_ORACLE_H
#define KVC_TESTS_KERN_ORACLE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kern.h"

/* The encoded block of raw block src (layout lay, codecs rec) into a new buffer *out (the
 * caller frees it). Its size, or -1 for a layout or recipe the format does not allow. With
 * kmin/kmax/knorm (all three or none): the key statistics as kern.h defines them. */
int64_t oracle_encode(const struct kern_layout *lay, const struct kern_recipe *rec,
                      const void *src, uint8_t **out, float *kmin, float *kmax, float *knorm);

/* Decodes an encoded block of layout lay and recipe rec (the section offsets are derived
 * from them, not read from enc) into dst, elements of out_dtype. */
void oracle_decode(const struct kern_layout *lay, const struct kern_recipe *rec,
                   const uint8_t *enc, void *dst, uint32_t out_dtype);

/* Scalar conversions, exposed for their own checks. */
uint16_t oracle_f2h(float f);
float oracle_h2f(uint16_t h);
uint16_t oracle_f2bf(float f);
uint8_t oracle_e4m3(float x);
float oracle_e4m3_value(uint8_t code);

#endif
