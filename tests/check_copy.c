/* check_copy — libkvc's copy of a put into the arena (client/libkvc_copy.c): the same bytes
 * as memcpy for every length around the streaming threshold and its 64/128-byte steps, for
 * aligned and unaligned sources and destinations, with nothing written past the end; and
 * with streaming turned off (KVC_PUT_STREAM=0, in a child so the choice is made afresh). */
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

/* Copies len bytes from src+so to dst+doff through kvci_copy_to_arena: whether they and the
 * guard bytes around them are right. */
static bool cp_one(size_t len, size_t so, size_t doff)
{
    static uint8_t src[CP_MAX + 256] __attribute__((aligned(64)));
    static uint8_t dst[CP_MAX + 512] __attribute__((aligned(64)));
    cp_fill(src, sizeof(src), (uint32_t)(len * 31 + so));
    memset(dst, 0xcc, sizeof(dst));
    kvci_copy_to_arena(dst + 64 + doff, src + so, len);
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
    SRunner *sr;
    int failed;
    tcase_set_timeout(tc, daemon_slow() * 60);
    tcase_add_test(tc, test_copy_same_bytes);
    tcase_add_test(tc, test_copy_without_streaming);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
