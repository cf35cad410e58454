/*
 * libkvc_copy.c — how a put's bytes go into the arena, and how a hit's come out of it.
 *
 * DESIGN
 * Put side (kvci_copy_to_arena).
 * A block a client puts is read back by other processes, later, if at all: never by this
 * one soon. An ordinary copy (glibc's memcpy at these sizes) first reads every line of the
 * slot into this CPU's cache to write it (read-for-ownership), then writes it back on
 * eviction, and fills the last-level cache the processes beside it share with lines nobody
 * here will read. Non-temporal stores write the lines straight to memory: two transfers per
 * line instead of three, and the cache left to others. The copy is weakly ordered, so it
 * ends with a store fence: the bytes are in memory (globally visible) before the caller
 * sends the commit that publishes them.
 * Used for copies of at least KVCI_STREAM_MIN bytes into a 16-byte-aligned slot (every slot
 * starts on a 4 KiB unit); smaller ones, and other architectures, take memcpy.
 * KVC_PUT_STREAM=0 in the environment (read once) turns it off. Thread-safe.
 *
 * Get side (kvci_copy_from_arena: the fast path, kvc_lease_copy, and through them
 * kvc_get_prefix and the Python binding's copies). The source is an arena slot (4 KiB
 * aligned); the destination is the engine's memory, rarely page-aligned (malloc hands out
 * addresses 16 bytes past a page; tensors sit at any offset). From 4 KiB on, glibc's memcpy
 * copies with `rep movsb`, which on AMD Zen runs at a third to a quarter of its speed when
 * source and destination are not both 64-byte aligned (2.2-2.5 against 8.4 GB/s on the
 * project's EPYC VM for blocks of 4-256 KiB 16 bytes past a page, docs/performance.md).
 * So a copy of KVCI_ALIGN_MIN bytes or more that is not 64-byte aligned on both sides copies
 * its first bytes unaligned up to the destination's next 64-byte boundary, then the rest
 * with aligned vector stores and unaligned loads (as fast as an aligned memcpy whatever the
 * offset); aligned copies and short ones take memcpy itself. Ordinary stores, as memcpy's:
 * the engine reads what it loaded next, so the lines stay in its cache. The vector width is
 * the CPU's (AVX2, else SSE2); other architectures take memcpy.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client/libkvc_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

/* 64 bytes a step with SSE2 (every x86-64 has it); the tail with memcpy. */
static void kvc_copy_sse2(uint8_t *d, const uint8_t *s, size_t len)
{
    size_t i = 0;
    for (; i + 64 <= len; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    _mm_sfence();
    if (i < len)
        memcpy(d + i, s + i, len - i);
}

/* 128 bytes a step with AVX2 (d 32-byte aligned). */
__attribute__((target("avx2"))) static void kvc_copy_avx2(uint8_t *d, const uint8_t *s, size_t len)
{
    size_t i = 0;
    for (; i + 128 <= len; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
        _mm256_stream_si256((__m256i *)(d + i + 64), c);
        _mm256_stream_si256((__m256i *)(d + i + 96), e);
    }
    _mm_sfence();
    if (i < len)
        memcpy(d + i, s + i, len - i);
}
#endif

#if defined(__x86_64__)
/* Aligned 16-byte stores, unaligned loads: d is 16-byte aligned. The tail with memcpy. */
static void kvc_copy_sse2_store(uint8_t *d, const uint8_t *s, size_t len)
{
    size_t i = 0;
    for (; i + 64 <= len; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_store_si128((__m128i *)(d + i), a);
        _mm_store_si128((__m128i *)(d + i + 16), b);
        _mm_store_si128((__m128i *)(d + i + 32), c);
        _mm_store_si128((__m128i *)(d + i + 48), e);
    }
    if (i < len)
        memcpy(d + i, s + i, len - i);
}

/* Aligned 32-byte stores, unaligned loads: d is 32-byte aligned. */
__attribute__((target("avx2"))) static void kvc_copy_avx2_store(uint8_t *d, const uint8_t *s,
                                                                size_t len)
{
    size_t i = 0;
    for (; i + 128 <= len; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_store_si256((__m256i *)(d + i), a);
        _mm256_store_si256((__m256i *)(d + i + 32), b);
        _mm256_store_si256((__m256i *)(d + i + 64), c);
        _mm256_store_si256((__m256i *)(d + i + 96), e);
    }
    if (i < len)
        memcpy(d + i, s + i, len - i);
}
#endif

/* What the CPU offers (0 not read yet, 1 nothing but memcpy, 2 SSE2, 3 AVX2), and whether
 * puts stream (KVC_PUT_STREAM): decided once, on first use. */
static int kvc_copy_cpu;
static bool kvc_copy_stream;

static int kvc_copy_pick(void)
{
    int k = 1;
#if defined(__x86_64__)
    __builtin_cpu_init();
    k = __builtin_cpu_supports("avx2") ? 3 : 2;
#endif
    const char *e = getenv("KVC_PUT_STREAM");
    __atomic_store_n(&kvc_copy_stream, !e || strcmp(e, "0") != 0, __ATOMIC_RELAXED);
    __atomic_store_n(&kvc_copy_cpu, k, __ATOMIC_RELEASE);
    return k;
}

static int kvc_copy_kind(void)
{
    int k = __atomic_load_n(&kvc_copy_cpu, __ATOMIC_ACQUIRE);
    return k ? k : kvc_copy_pick();
}

void kvci_copy_to_arena(void *dst, const void *src, size_t len)
{
    int k = kvc_copy_kind();
#if defined(__x86_64__)
    if (len >= KVCI_STREAM_MIN && __atomic_load_n(&kvc_copy_stream, __ATOMIC_RELAXED)) {
        if (k == 3 && ((uintptr_t)dst & 31) == 0) {
            kvc_copy_avx2(dst, src, len);
            return;
        }
        if (k >= 2 && ((uintptr_t)dst & 15) == 0) {
            kvc_copy_sse2(dst, src, len);
            return;
        }
    }
#else
    (void)k;
#endif
    memcpy(dst, src, len);
}

void kvci_copy_from_arena(void *dst, const void *src, size_t len)
{
    int k = kvc_copy_kind();
#if defined(__x86_64__)
    if (len >= KVCI_ALIGN_MIN && k >= 2 && (((uintptr_t)dst | (uintptr_t)src) & 63) != 0) {
        uint8_t *d = dst;
        const uint8_t *s = src;
        size_t head = (64 - ((uintptr_t)d & 63)) & 63;
        memcpy(d, s, head); /* under 64 bytes: memcpy's vector moves, any alignment */
        if (k == 3)
            kvc_copy_avx2_store(d + head, s + head, len - head);
        else
            kvc_copy_sse2_store(d + head, s + head, len - head);
        return;
    }
#else
    (void)k;
#endif
    memcpy(dst, src, len);
}
