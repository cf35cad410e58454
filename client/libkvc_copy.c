/*
 * libkvc_copy.c — how a put's bytes go into the arena.
 *
 * DESIGN
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
 */
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
__attribute__((target("avx2"))) static void kvc_copy_avx2(uint8_t *d, const uint8_t *s,
                                                           size_t len)
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

/* 0 not decided yet, 1 memcpy, 2 SSE2, 3 AVX2. */
static int kvc_copy_kind;

static int kvc_copy_pick(void)
{
    int k = 1;
#if defined(__x86_64__)
    const char *e = getenv("KVC_PUT_STREAM");
    if (!e || strcmp(e, "0") != 0) {
        __builtin_cpu_init();
        k = __builtin_cpu_supports("avx2") ? 3 : 2;
    }
#endif
    __atomic_store_n(&kvc_copy_kind, k, __ATOMIC_RELAXED);
    return k;
}

void kvci_copy_to_arena(void *dst, const void *src, size_t len)
{
    int k = __atomic_load_n(&kvc_copy_kind, __ATOMIC_RELAXED);
    if (!k)
        k = kvc_copy_pick();
#if defined(__x86_64__)
    if (len >= KVCI_STREAM_MIN) {
        if (k == 3 && ((uintptr_t)dst & 31) == 0) {
            kvc_copy_avx2(dst, src, len);
            return;
        }
        if (k >= 2 && ((uintptr_t)dst & 15) == 0) {
            kvc_copy_sse2(dst, src, len);
            return;
        }
    }
#endif
    memcpy(dst, src, len);
}
