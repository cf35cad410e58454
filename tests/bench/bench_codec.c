/*
 * bench_codec.c — what the disk codecs (tiers/disk_codec.c) get on synthetic KV blocks:
 * compression ratio, compress and decompress throughput (one thread), for zstd with and
 * without byte planes at levels 1 and 3, over 2 MiB blocks of fp16 and bf16 drawn from a
 * normal distribution (values), and keys whose channels include a few outliers (4 of every
 * 128 channels 20x larger, as in the KIVI and KVQuant observations). The baseline of the
 * throughput rows is memcpy of the same bytes, from the same written blocks into a written
 * (pre-faulted) buffer, timed in every round beside the codec; best and median of the
 * rounds. KVC_BENCH_SMOKE=1: 2 blocks, 1 round. Usage: bench_codec OUT.json
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/lib/bench.h"
#include "tests/lib/rng.h"
#include "tiers/disk_codec.h"

#define BLOCK (2u << 20)
#define NBLOCKS 8
#define HEAD_DIM 128

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double uniform(void)
{
    return ((double)(rng_next(&rng) >> 11) + 0.5) / 9007199254740992.0;
}

static double normal(void)
{
    return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform());
}

static uint16_t to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t m = x & 0x7fffffu;
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        m |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t h = m >> shift;
        if ((m >> (shift - 1)) & 1)
            h++;
        return (uint16_t)(sign | h);
    }
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
    if (m & 0x1000u)
        h++;
    return (uint16_t)h;
}

static uint16_t to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static void gen(uint16_t *p, size_t n, int bf16, int outliers)
{
    for (size_t i = 0; i < n; i++) {
        size_t ch = i % HEAD_DIM;
        double v = normal();
        if (outliers && ch % 32 == 7)
            v *= 20.0;
        p[i] = bf16 ? to_bf16((float)v) : to_fp16((float)v);
    }
}

static struct bench_row rows[128];
static size_t nrows;

static void add(const char *name, double v, const char *unit, const char *baseline, double base,
                double med, double base_med)
{
    if (!bench_row_add(rows, sizeof(rows) / sizeof(rows[0]), &nrows, name, v, unit, baseline,
                       base))
        return;
    if (baseline)
        printf("%-40s %9.3f %9.3f %-6s %-7s %9.1f %9.1f %6.3f\n", name, v, med, unit,
               baseline, base, base_med, v / base);
    else
        printf("%-40s %9.3f %9s %-6s\n", name, v, "", unit);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Best (largest) and median of v[0..n). */
static double best_of(double *v, int n, double *median)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    *median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    return v[n - 1];
}

#define MAX_ROUNDS 9

int main(int argc, char **argv)
{
    static const char *const kinds[4] = {"fp16 normal", "fp16 keys+outliers", "bf16 normal",
                                         "bf16 keys+outliers"};
    const int nblocks = bench_smoke() ? 2 : NBLOCKS, rounds = bench_smoke() ? 1 : 5;
    uint8_t *src = malloc((size_t)NBLOCKS * BLOCK), *dst = malloc(disk_codec_bound(BLOCK));
    uint8_t *back = malloc(BLOCK), *cp = malloc((size_t)NBLOCKS * BLOCK);
    struct disk_codec *c = disk_codec_new();
    if (argc < 2 || !src || !dst || !back || !cp || !c) {
        fprintf(stderr, "usage: bench_codec OUT.json\n");
        return 2;
    }
    /* every page of the buffers written before anything is timed: no first-touch fault, no
     * read of the shared zero page, in any timed copy */
    memset(cp, 0x5a, (size_t)NBLOCKS * BLOCK);
    memset(dst, 0x5a, disk_codec_bound(BLOCK));
    memset(back, 0x5a, BLOCK);
    printf("%d blocks of %u MiB, %d rounds; MiB/s of block bytes (uncompressed) in and out, "
           "best and median round;\nbaseline: memcpy of the same written blocks into written "
           "buffers, timed in the same rounds\n",
           nblocks, BLOCK >> 20, rounds);
    printf("%-40s %9s %9s %-6s %-7s %9s %9s %6s\n", "case", "best", "median", "unit",
           "base", "best", "median", "ratio");
    for (int k = 0; k < 4; k++) {
        for (int b = 0; b < nblocks; b++)
            gen((uint16_t *)(src + (size_t)b * BLOCK), BLOCK / 2, k >= 2, k & 1);
        for (int planes = 0; planes < 2; planes++) {
            for (int level = 1; level <= 3; level += 2) {
                enum tier_disk_codec codec =
                    planes ? TIER_DISK_CODEC_ZSTD_PLANES : TIER_DISK_CODEC_ZSTD;
                double comp[MAX_ROUNDS], decomp[MAX_ROUNDS], copy[MAX_ROUNDS];
                uint64_t in = 0, outb = 0, in_dec = 0;
                for (int r = 0; r < rounds; r++) {
                    double tc = 0, td = 0, a;
                    in = outb = in_dec = 0;
                    for (int b = 0; b < nblocks; b++) {
                        const uint8_t *blk = src + (size_t)b * BLOCK;
                        a = now_s();
                        long n = disk_codec_compress(c, codec, level, blk, BLOCK, dst,
                                                     disk_codec_bound(BLOCK));
                        tc += now_s() - a;
                        in += BLOCK;
                        if (n == -ENOSPC) { /* not smaller: the tier stores it raw */
                            outb += BLOCK;
                            continue;
                        }
                        if (n < 0) {
                            bench_fail("codec: %s level %d: compress: %s", kinds[k], level,
                                       strerror((int)-n));
                            return bench_finish(argv[1], rows, nrows);
                        }
                        outb += (uint64_t)n;
                        a = now_s();
                        int rc = disk_codec_decompress(c, codec, dst, (size_t)n, back, BLOCK);
                        td += now_s() - a;
                        if (rc || memcmp(back, blk, BLOCK)) {
                            bench_fail("codec: %s level %d: round trip failed", kinds[k], level);
                            return bench_finish(argv[1], rows, nrows);
                        }
                        in_dec += BLOCK;
                    }
                    a = now_s();
                    for (int b = 0; b < nblocks; b++)
                        memcpy(cp + (size_t)b * BLOCK, src + (size_t)b * BLOCK, BLOCK);
                    double tm = now_s() - a;
                    comp[r] = tc > 0 ? (double)in / tc / 1048576.0 : 0;
                    decomp[r] = td > 0 ? (double)in_dec / td / 1048576.0 : 0;
                    copy[r] = tm > 0 ? (double)in / tm / 1048576.0 : 0;
                }
                double mc_med, c_med, d_med;
                double mc = best_of(copy, rounds, &mc_med);
                double cb = best_of(comp, rounds, &c_med), db = best_of(decomp, rounds, &d_med);
                char name[96];
                snprintf(name, sizeof(name), "%s zstd-%d%s ratio", kinds[k], level,
                         planes ? " planes" : "");
                add(name, (double)in / (double)outb, "x", NULL, 0, (double)in / (double)outb, 0);
                snprintf(name, sizeof(name), "%s zstd-%d%s compress", kinds[k], level,
                         planes ? " planes" : "");
                add(name, cb, "MiB/s", "memcpy", mc, c_med, mc_med);
                snprintf(name, sizeof(name), "%s zstd-%d%s decompress", kinds[k], level,
                         planes ? " planes" : "");
                if (in_dec)
                    add(name, db, "MiB/s", "memcpy", mc, d_med, mc_med);
                else
                    printf("%-40s every block stored raw: nothing to decompress\n", name);
            }
        }
    }
    disk_codec_free(c);
    free(src);
    free(dst);
    free(back);
    free(cp);
    return bench_finish(argv[1], rows, nrows);
}
