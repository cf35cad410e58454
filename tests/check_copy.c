/* check_copy — libkvc's copies (client/libkvc_copy.c). Into the arena (a put): the same bytes
 * as memcpy for every length around the streaming threshold and its 64/128-byte steps, for
 * aligned and unaligned sources and destinations, with nothing written past the end; and
 * with streaming turned off (KVC_PUT_STREAM=0, in a child so the choice is made afresh).
 * Out of the arena (a hit): the same for every destination offset 0..64 from a page and
 * source offsets 0, 16 and 48, at every length around the aligning threshold, the head
 * (one 64-byte line) and the 128-byte steps. */
#include <check.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/libkvc_internal.h"
#include "tests/lib/daemon.h"

#define CP_MAX (KVCI_STREAM_MIN * 4 + 512)

static void cp_fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (uint8_t)(seed >> 16);
    }
}

/* Copies len bytes from src+so to dst+doff through fn: whether they and the guard bytes
 * around them are right. */
static bool cp_with(void (*fn)(void *, const void *, size_t), size_t len, size_t so, size_t doff)
{
    static uint8_t src[CP_MAX + 256] __attribute__((aligned(4096)));
    static uint8_t dst[CP_MAX + 512] __attribute__((aligned(4096)));
    cp_fill(src, sizeof(src), (uint32_t)(len * 31 + so));
    memset(dst, 0xcc, sizeof(dst));
    fn(dst + 64 + doff, src + so, len);
    if (memcmp(dst + 64 + doff, src + so, len) != 0)
        return false;
    for (size_t i = 0; i < 64 + doff; i++)
        if (dst[i] != 0xcc)
            return false;
    for (size_t i = 64 + doff + len; i < sizeof(dst); i++)
        if (dst[i] != 0xcc)
            return false;
    return true;
}

static bool cp_one(size_t len, size_t so, size_t doff)
{
    return cp_with(kvci_copy_to_arena, len, so, doff);
}

/* Every length and alignment: 0, or 1 + the index of the first case that failed. */
static size_t cp_sweep(void)
{
    static const size_t lens[] = {0,
                                  1,
                                  63,
                                  4096,
                                  KVCI_STREAM_MIN - 1,
                                  KVCI_STREAM_MIN,
                                  KVCI_STREAM_MIN + 1,
                                  KVCI_STREAM_MIN + 16,
                                  KVCI_STREAM_MIN + 63,
                                  KVCI_STREAM_MIN + 64,
                                  KVCI_STREAM_MIN + 127,
                                  KVCI_STREAM_MIN + 129,
                                  KVCI_STREAM_MIN * 4 + 200};
    static const size_t offs[] = {0, 1, 8, 16, 32, 33};
    const size_t no = sizeof(offs) / sizeof(offs[0]);
    for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
        for (size_t a = 0; a < no; a++)
            for (size_t b = 0; b < no; b++)
                if (!cp_one(lens[l], offs[a], offs[b]))
                    return 1 + (l * no + a) * no + b;
    return 0;
}

/* The hit side: every destination offset from a 64-byte line (the guard before it is 64
 * bytes, so dst + 64 + doff is doff bytes past a page), a page-aligned source (an arena
 * slot) and two unaligned ones (a writer's own memory in tests that copy from anywhere). */
static size_t cp_sweep_from(void)
{
    static const size_t lens[] = {0,
                                  1,
                                  63,
                                  64,
                                  65,
                                  KVCI_ALIGN_MIN - 1,
                                  KVCI_ALIGN_MIN,
                                  KVCI_ALIGN_MIN + 1,
                                  KVCI_ALIGN_MIN + 63,
                                  KVCI_ALIGN_MIN + 64,
                                  KVCI_ALIGN_MIN + 127,
                                  KVCI_ALIGN_MIN + 128,
                                  KVCI_ALIGN_MIN + 129,
                                  4096,
                                  4096 + 16,
                                  KVCI_STREAM_MIN,
                                  KVCI_STREAM_MIN * 4 + 200};
    static const size_t soffs[] = {0, 16, 48};
    size_t ncase = 0;
    for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
        for (size_t a = 0; a < sizeof(soffs) / sizeof(soffs[0]); a++)
            for (size_t doff = 0; doff <= 64; doff++) {
                ncase++;
                if (!cp_with(kvci_copy_from_arena, lens[l], soffs[a], doff))
                    return ncase;
            }
    return 0;
}

START_TEST(test_copy_from_arena_every_alignment)
{
    ck_assert_uint_eq(cp_sweep_from(), 0);
}
END_TEST

START_TEST(test_copy_same_bytes)
{
    ck_assert_uint_eq(cp_sweep(), 0);
}
END_TEST

START_TEST(test_copy_without_streaming)
{
    pid_t pid = daemon_fork();
    int st;
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setenv("KVC_PUT_STREAM", "0", 1);
        _exit(cp_sweep() ? 1 : 0);
    }
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("copy");
    TCase *tc = tcase_create("copy");
    tcase_set_timeout(tc, daemon_slow() * 60);
    tcase_add_test(tc, test_copy_same_bytes);
    tcase_add_test(tc, test_copy_without_streaming);
    tcase_add_test(tc, test_copy_from_arena_every_alignment);
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
