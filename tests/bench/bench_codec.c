/*
 * bench_codec.c — what the disk codecs (tiers/disk_codec.c) get on synthetic KV blocks:
 * compression ratio, compress and decompress throughput (one thread), for zstd with and
 * without byte planes at levels 1 and 3, over 2 MiB blocks of fp16 and bf16 drawn from a
 * normal distribution (values), and keys whose channels include a few outliers (4 of every
 * 128 channels 20x larger, as in the KIVI and KVQuant observations). The baseline of the
 * throughput rows is memcpy of the same bytes. Usage: bench_codec OUT.json
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/lib/bench.h"
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
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
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

static void add(const char *name, double v, const char *unit, const char *baseline, double base)
{
    bench_row_add(rows, sizeof(rows) / sizeof(rows[0]), &nrows, name, v, unit, baseline, base);
    printf("%-44s %9.3f %-6s %-10s %9.1f\n", name, v, unit, baseline, base);
}

int main(int argc, char **argv)
{
    static const char *const kinds[4] = {"fp16 normal", "fp16 keys+outliers", "bf16 normal",
                                         "bf16 keys+outliers"};
    uint8_t *src = malloc((size_t)NBLOCKS * BLOCK), *dst = malloc(disk_codec_bound(BLOCK));
    uint8_t *back = malloc(BLOCK), *cp = malloc(BLOCK);
    struct disk_codec *c = disk_codec_new();
    if (argc < 2 || !src || !dst || !back || !cp || !c) {
        fprintf(stderr, "usage: bench_codec OUT.json\n");
        return 2;
    }
    double t0 = now_s();
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < NBLOCKS; b++)
            memcpy(cp, src + (size_t)b * BLOCK, BLOCK);
    double memcpy_mbs = 4.0 * NBLOCKS * BLOCK / (now_s() - t0) / 1048576.0;
    printf("%-44s %9s %-6s %-10s %9s\n", "case", "value", "unit", "baseline", "value");
    for (int k = 0; k < 4; k++) {
        for (int b = 0; b < NBLOCKS; b++)
            gen((uint16_t *)(src + (size_t)b * BLOCK), BLOCK / 2, k >= 2, k & 1);
        for (int planes = 0; planes < 2; planes++) {
            for (int level = 1; level <= 3; level += 2) {
                enum tier_disk_codec codec =
                    planes ? TIER_DISK_CODEC_ZSTD_PLANES : TIER_DISK_CODEC_ZSTD;
                uint64_t in = 0, outb = 0;
                double tc = 0, td = 0;
                for (int b = 0; b < NBLOCKS; b++) {
                    const uint8_t *blk = src + (size_t)b * BLOCK;
                    double a = now_s();
                    long n = disk_codec_compress(c, codec, level, blk, BLOCK, dst,
                                                 disk_codec_bound(BLOCK));
                    tc += now_s() - a;
                    in += BLOCK;
                    if (n < 0) {
                        outb += BLOCK;
                        continue;
                    }
                    outb += (uint64_t)n;
                    a = now_s();
                    if (disk_codec_decompress(c, codec, dst, (size_t)n, back, BLOCK) ||
                        memcmp(back, blk, BLOCK)) {
                        fprintf(stderr, "bench_codec: round trip failed\n");
                        return 1;
                    }
                    td += now_s() - a;
                }
                char name[96];
                snprintf(name, sizeof(name), "%s zstd-%d%s ratio", kinds[k], level,
                         planes ? " planes" : "");
                add(name, (double)in / (double)outb, "x", "raw", 1.0);
                snprintf(name, sizeof(name), "%s zstd-%d%s compress", kinds[k], level,
                         planes ? " planes" : "");
                add(name, (double)in / tc / 1048576.0, "MiB/s", "memcpy", memcpy_mbs);
                snprintf(name, sizeof(name), "%s zstd-%d%s decompress", kinds[k], level,
                         planes ? " planes" : "");
                add(name, td > 0 ? (double)in / td / 1048576.0 : 0, "MiB/s", "memcpy",
                    memcpy_mbs);
            }
        }
    }
    if (bench_json_write(argv[1], rows, nrows))
        return 1;
    disk_codec_free(c);
    free(src);
    free(dst);
    free(back);
    free(cp);
    return 0;
}
