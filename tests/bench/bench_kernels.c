/*
 * bench_kernels.c — codec throughput beside memcpy (and device-to-device copy on a GPU), and
 * the error each codec costs on synthetic KV.
 *
 * Throughput: one block of a typical model (32 layers x 8 kv heads x 128 dim x 32 tokens,
 * fp16, K and V: 4 MiB), a set of 8 different blocks cycled so the data is not L2
 * resident (a large L3 may still hold them). Every GB/s counts the raw (fp16) block bytes,
 * 1e9 per second, on both sides of a ratio: the raw bytes an encode reads, the raw bytes a
 * decode writes, the raw bytes memcpy copies (reading them once and writing them once);
 * encoded bytes are not counted. Ratio to memcpy of the same bytes between written buffers,
 * measured in the same run just before the codec's rows (target >= 0.5 for the vectorised
 * versions); the vectorised encoder also with key statistics (encode_stats), as the daemon
 * calls it. Every call's return value is checked, inside the timed loops too: a failed
 * encode or decode is an error of the run, never a number. On a GPU the CUDA twins beside
 * cudaMemcpy device-to-device of the same raw bytes, best and median of GPU_RUNS runs each
 * (targets: decode >= 0.5, encode >= 0.3), and the decode of a 32-block prefix straight into
 * an engine's paged tensors in one launch (what a lossy hit costs an engine), each decode
 * checked once against the CPU decoder.
 * KVC_BENCH_SMOKE=1: 10 ms per measurement, one seed of the error table. KVC_BENCH_CPUTIME=1:
 * the CPU rows by thread CPU time (a loaded shared host; see now_s()).
 *
 * Error: keys with a few large outlier channels, values without, fixed seeds; per codec
 * (K and V both in it) the RMSE and max error of K and V, and the relative error of the
 * attention output softmax(q K^T / sqrt(d)) V over 256 tokens (8 blocks of 32) for random
 * queries, dequantized against raw.
 *
 * Usage: bench_kernels OUT.json [CODEC...]
 * With codec names, only their throughput rows (ref and avx2) beside memcpy, no error table:
 * the quick loop for tuning one codec.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kern.h"
#include "kernels/kern_fmt.h"
#include "kernels/kern_pack.h"
#include "tests/lib/bench.h"
#include "tests/lib/rng.h"

#define NBLOCKS 8
#define MIN_SECONDS (bench_smoke() ? 0.01 : 0.4)

static struct bench_row rows[256];
static size_t nrows;

static void add_row(const char *name, double value, const char *unit, const char *baseline,
                    double base)
{
    bench_row_add(rows, sizeof(rows) / sizeof(rows[0]), &nrows, name, value, unit, baseline, base);
}

/* KVC_BENCH_CPUTIME=1: the CPU rows timed by this thread's CPU time instead of the wall clock
 * (memcpy too), for a host shared with other work, where a wall-clock ratio measures the
 * scheduler. The GPU rows keep their device timers. */
static double now_s(void)
{
    static int cpu = -1;
    if (cpu < 0) {
        const char *e = getenv("KVC_BENCH_CPUTIME");
        cpu = e && *e == '1';
    }
    struct timespec ts;
    clock_gettime(cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Keys: N(0,1) plus, on 4 outlier channels per head, a large per-channel offset and spread;
 * values: N(0,1). */
static void fill_block(const struct kern_layout *lay, uint16_t *b, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 12345;
    for (uint32_t l = 0; l < lay->layers; l++)
        for (uint32_t k = 0; k < 2; k++)
            for (uint32_t t = 0; t < lay->tokens; t++)
                for (uint32_t h = 0; h < lay->heads; h++)
                    for (uint32_t d = 0; d < lay->head_dim; d++) {
                        float v = rng_gauss(&s);
                        if (k == 0 && (d * 13 + h * 5 + l) % 32 == 0)
                            v = v * 3.0f + ((d + h) % 2 ? 15.0f : -10.0f);
                        b[kern_raw_index(lay, l, k, t, h) + d] = kern_f2h(v);
                    }
}

typedef int64_t (*enc_fn)(const struct kern_layout *, const struct kern_recipe *, const void *,
                          void *, size_t, const struct kern_key_stats *);
typedef int64_t (*dec_fn)(const struct kern_layout *, const void *, size_t, void *, size_t,
                          enum kern_dtype);

/* Key statistics for the encode-with-statistics rows (the daemon's call): the bench block's
 * 32 layers x 8 heads x 128 dim. */
static float st_kmin[32 * 8 * 128], st_kmax[32 * 8 * 128], st_knorm[32 * 8];
static const struct kern_key_stats bench_stats = {st_kmin, st_kmax, st_knorm};

/* Seconds per call of one of: memcpy (op 0), encode (1), decode (2), encode with key
 * statistics (3), cycling over blocks; -1 when a call failed (reported). An encode must
 * return the recipe's encoded size, a decode the raw size. */
static double time_op(int op, enc_fn enc, dec_fn dec, const struct kern_layout *lay,
                      const struct kern_recipe *rec, uint8_t **raw, uint8_t **encb, uint8_t **out,
                      uint64_t rs, uint64_t es)
{
    long n = 0;
    int64_t want = op == 0 ? 0 : op == 2 ? (int64_t)rs : kern_encoded_size(lay, rec), got = 0;
    double t0 = now_s(), t;
    do {
        int i = (int)(n % NBLOCKS);
        if (op == 0)
            memcpy(out[i], raw[i], rs);
        else if (op == 1 || op == 3)
            got = enc(lay, rec, raw[i], encb[i], es, op == 3 ? &bench_stats : NULL);
        else
            got = dec(lay, encb[i], es, out[i], rs, KERN_DTYPE_FP16);
        if (got != want) {
            bench_fail("kernels: %s %s: returned %lld, expected %lld",
                       kern_codec_name(rec ? rec->codec[0][0] : 0), op == 2 ? "decode" : "encode",
                       (long long)got, (long long)want);
            return -1;
        }
        n++;
        t = now_s() - t0;
    } while (t < MIN_SECONDS || n < NBLOCKS);
    return t / (double)n;
}

#define GPU_ITERS 20
#define GPU_RUNS 5
#define GPU_PREFIX 32 /* blocks of the prefix decoded into paged tensors in one launch */

struct gpu_arg {
    int op; /* 0 copy, 1 encode, 2 decode, 3 decode of the prefix into paged tensors */
    const struct kern_layout *lay;
    const struct kern_recipe *rec;
    void *raw, *enc, *out;
    uint64_t rs, es;
    /* the prefix: encoded blocks on the device, the engine's paged tensors */
    const void **srcs;
    uint64_t *lens;
    struct kern_pack_engine eng;
    void *big_src, *big_dst; /* the baseline of the prefix: its raw bytes copied */
};

/* One queued operation; 0, or -1 when it was refused (reported). */
static int gpu_op(struct gpu_arg *a)
{
    int64_t r;
    if (a->op == 0)
        r = kern_cuda_copy(a->out, a->raw, a->rs, KERN_CUDA_D2D, NULL);
    else if (a->op == 1)
        r = kern_encode_cuda(a->lay, a->rec, a->raw, a->enc, a->es, NULL, NULL);
    else if (a->op == 2)
        r = kern_decode_cuda(a->lay, a->enc, a->es, a->out, a->rs, KERN_DTYPE_FP16,
                             1u << a->rec->codec[0][0], NULL);
    else if (a->op == 3)
        r = kern_pack_decode_cuda(a->lay, 0, a->lay->layers, &a->eng, 0, GPU_PREFIX, a->srcs,
                                  a->lens, KERN_DTYPE_FP16, 1u << a->rec->codec[0][0], NULL);
    else
        r = kern_cuda_copy(a->big_dst, a->big_src, a->rs * GPU_PREFIX, KERN_CUDA_D2D, NULL);
    if (r < 0) {
        bench_fail("kernels: gpu op %d failed (%lld)", a->op, (long long)r);
        return -1;
    }
    return 0;
}

/* The timed form; its calls were checked once, untimed, just before. */
static void gpu_op_void(void *p)
{
    (void)gpu_op(p);
}

static int gpu_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* GB/s of `bytes` per call of op `op` and of the baseline op `base` (a device-to-device copy
 * of the same raw bytes), GPU_RUNS runs alternating; rows "NAME" (the best run of each) and
 * "NAME/median". 0, or -1 after bench_fail. */
static int gpu_time(struct gpu_arg *a, int op, int base, uint64_t bytes, const char *name)
{
    double v[GPU_RUNS], w[GPU_RUNS];
    for (int r = 0; r < GPU_RUNS; r++) {
        a->op = op;
        double ms = kern_cuda_time_ms(gpu_op_void, a, GPU_ITERS);
        a->op = base;
        double mb = kern_cuda_time_ms(gpu_op_void, a, GPU_ITERS);
        if (ms <= 0 || mb <= 0 || bench_failed()) {
            bench_fail("kernels: gpu: %s timing failed (%g, %g)", name, ms, mb);
            return -1;
        }
        v[r] = (double)bytes / (ms / GPU_ITERS * 1e-3) / 1e9;
        w[r] = (double)bytes / (mb / GPU_ITERS * 1e-3) / 1e9;
    }
    qsort(v, GPU_RUNS, sizeof(v[0]), gpu_cmp);
    qsort(w, GPU_RUNS, sizeof(w[0]), gpu_cmp);
    char med[80];
    snprintf(med, sizeof(med), "%s/median", name);
    printf("%-32s %10.2f GB/s  %.2f x d2d (median %.2f GB/s, %.2f x)\n", name, v[GPU_RUNS - 1],
           v[GPU_RUNS - 1] / w[GPU_RUNS - 1], v[GPU_RUNS / 2], v[GPU_RUNS / 2] / w[GPU_RUNS / 2]);
    add_row(name, v[GPU_RUNS - 1], "GB/s", "cudaMemcpy d2d", w[GPU_RUNS - 1]);
    add_row(med, v[GPU_RUNS / 2], "GB/s", "cudaMemcpy d2d", w[GPU_RUNS / 2]);
    return 0;
}

/* Is the device's decode at g_out the CPU decoder's output of the device's encoding at
 * g_enc (es bytes)? 0 when it is; host and ref are rs-byte scratch (ref keeps the CPU's). */
static int gpu_check_decode(const struct kern_layout *lay, const void *g_enc, uint64_t es,
                            const void *g_out, uint64_t rs, uint8_t *host, uint8_t *ref)
{
    uint8_t *enc = malloc(es);
    int bad = !enc || kern_cuda_copy(enc, g_enc, es, KERN_CUDA_D2H, NULL) ||
              kern_cuda_copy(host, g_out, rs, KERN_CUDA_D2H, NULL) || kern_cuda_stream_sync(NULL) ||
              kern_decode_cpu(lay, enc, es, ref, rs, KERN_DTYPE_FP16) != (int64_t)rs ||
              memcmp(host, ref, rs);
    free(enc);
    return bad ? -1 : 0;
}

/* The GPU rows: per codec, encode and decode of one block beside a device-to-device copy of
 * its raw bytes, and the decode of a prefix of GPU_PREFIX such blocks straight into an
 * engine's paged tensors (one launch; vLLM layout, pages of the block's tokens, the table
 * reversed) beside a copy of the prefix's raw bytes; each decode checked once against the CPU
 * decoder. GB/s count the raw bytes. */
static void bench_gpu(const struct kern_layout *lay, uint8_t **raw, uint64_t rs)
{
    void *g_raw = NULL, *g_enc = NULL, *g_out = NULL, *big_src = NULL, *big_dst = NULL;
    void *pk[KERN_MAX_LAYERS] = {0}, *pv[KERN_MAX_LAYERS] = {0}, *encs[GPU_PREFIX] = {0};
    const void *srcs[GPU_PREFIX];
    uint64_t lens[GPU_PREFIX];
    int32_t table[GPU_PREFIX];
    const uint64_t H = lay->heads, D = lay->head_dim, T = lay->tokens;
    const uint64_t tensor = GPU_PREFIX * T * H * D * 2;
    uint8_t *host = malloc(rs), *ref = malloc(rs);
    if (!host || !ref || kern_cuda_alloc(&g_raw, rs) || kern_cuda_alloc(&g_enc, rs + 65536) ||
        kern_cuda_alloc(&g_out, rs) || kern_cuda_alloc(&big_src, rs * GPU_PREFIX) ||
        kern_cuda_alloc(&big_dst, rs * GPU_PREFIX)) {
        bench_fail("kernels: gpu: no device memory");
        goto out;
    }
    for (uint32_t l = 0; l < lay->layers; l++)
        if (kern_cuda_alloc(&pk[l], tensor) || kern_cuda_alloc(&pv[l], tensor)) {
            bench_fail("kernels: gpu: no device memory for the paged tensors");
            goto out;
        }
    for (int j = 0; j < GPU_PREFIX; j++) {
        table[j] = GPU_PREFIX - 1 - j;
        if (kern_cuda_alloc(&encs[j], rs + 65536)) {
            bench_fail("kernels: gpu: no device memory for the prefix");
            goto out;
        }
        srcs[j] = encs[j];
    }
    if (kern_cuda_copy(g_raw, raw[0], rs, KERN_CUDA_H2D, NULL)) {
        bench_fail("kernels: gpu: copy to the device failed");
        goto out;
    }
    struct gpu_arg a = {.lay = lay, .raw = g_raw, .enc = g_enc, .out = g_out, .rs = rs};
    a.srcs = srcs;
    a.lens = lens;
    a.big_src = big_src;
    a.big_dst = big_dst;
    a.eng =
        (struct kern_pack_engine){pk, pv, table, GPU_PREFIX, T, T * H * D * 2, H * D * 2, D * 2};
    if (gpu_op(&a) < 0)
        goto out;
    double ms = kern_cuda_time_ms(gpu_op_void, &a, 50);
    if (ms <= 0) {
        bench_fail("kernels: gpu: d2d copy timing failed (%g)", ms);
        goto out;
    }
    double d2d = 2.0 * rs / (ms / 50 * 1e-3) / 1e9; /* read + write, as cudaMemcpy counts */
    double d2d_in = rs / (ms / 50 * 1e-3) / 1e9;
    printf("%-32s %10.2f GB/s (read+write %.1f); best of %d runs of %d calls, beside a "
           "d2d copy of the same raw bytes in each run\n",
           "gpu d2d copy", d2d_in, d2d, GPU_RUNS, GPU_ITERS);
    add_row("gpu/d2d_copy", d2d_in, "GB/s", "cudaMemcpy d2d", d2d_in);
    for (int c = KERN_CODEC_Q8_0; c < KERN_CODEC_COUNT; c++) {
        struct kern_recipe rec;
        char name[64];
        kern_recipe_fill(&rec, c, c, 0);
        a.rec = &rec;
        a.es = (uint64_t)kern_encoded_size(lay, &rec);
        for (int op = 1; op <= 2; op++) {
            a.op = op;
            if (gpu_op(&a) < 0 || kern_cuda_stream_sync(NULL) != 0) /* untimed: checked */
                goto out;
            /* the decode, checked against the CPU decoder of the GPU's own encoding before
             * the timed runs: their baseline copies the raw block over g_out */
            if (op == 2 && gpu_check_decode(lay, g_enc, a.es, g_out, rs, host, ref)) {
                bench_fail("kernels: gpu: %s: the GPU's decode is not the CPU's",
                           kern_codec_name(c));
                goto out;
            }
            snprintf(name, sizeof(name), "gpu/%s/%s", kern_codec_name(c),
                     op == 1 ? "encode" : "decode");
            if (gpu_time(&a, op, 0, rs, name))
                goto out;
        }
        /* the prefix: the same encoded block GPU_PREFIX times, into the paged tensors */
        for (int j = 0; j < GPU_PREFIX; j++) {
            lens[j] = a.es;
            if (kern_cuda_copy(encs[j], g_enc, a.es, KERN_CUDA_D2D, NULL))
                goto out;
        }
        a.op = 3;
        if (gpu_op(&a) < 0 || kern_cuda_stream_sync(NULL) != 0)
            goto out;
        /* block j is page GPU_PREFIX-1-j: check the last page's first token row of layer 0 */
        uint8_t row[2 * 1024];
        if (H * D * 2 <= sizeof(row) &&
            (kern_cuda_copy(row, pk[0], H * D * 2, KERN_CUDA_D2H, NULL) ||
             kern_cuda_stream_sync(NULL) || memcmp(row, ref + 0, H * D * 2))) {
            bench_fail("kernels: gpu: %s: the paged decode is not the CPU's", kern_codec_name(c));
            goto out;
        }
        snprintf(name, sizeof(name), "gpu/%s/decode_paged", kern_codec_name(c));
        if (gpu_time(&a, 3, 4, rs * GPU_PREFIX, name))
            goto out;
    }
out:
    for (uint32_t l = 0; l < lay->layers; l++) {
        kern_cuda_free(pk[l]);
        kern_cuda_free(pv[l]);
    }
    for (int j = 0; j < GPU_PREFIX; j++)
        kern_cuda_free(encs[j]);
    kern_cuda_free(g_raw);
    kern_cuda_free(g_enc);
    kern_cuda_free(g_out);
    kern_cuda_free(big_src);
    kern_cuda_free(big_dst);
    free(host);
    free(ref);
}

static char **only_codecs;
static int n_only;

static int codec_wanted(int c)
{
    if (n_only == 0)
        return 1;
    for (int i = 0; i < n_only; i++)
        if (kern_codec_from_name(only_codecs[i]) == c)
            return 1;
    return 0;
}

static void bench_throughput(void)
{
    struct kern_layout lay = {32, 8, 128, 32, KERN_DTYPE_FP16, 0};
    uint64_t rs = kern_raw_size(&lay), es = rs + 65536;
    uint8_t *raw[NBLOCKS], *encb[NBLOCKS], *out[NBLOCKS];
    /* On 64-byte lines, as the codecs' real sources and destinations are (kvcd's slots start
     * on pages, an engine's tensors on 64 bytes or more): malloc puts a block this large 16
     * bytes past a page (its mmap'd chunk's header), which splits every line a decode
     * streams out across two and cost LOWRANK's decode 13 % (docs/kernels.md). memcpy, the
     * baseline, copies between the same buffers. */
    for (int i = 0; i < NBLOCKS; i++) {
        raw[i] = aligned_alloc(64, (rs + 63) & ~(uint64_t)63);
        encb[i] = aligned_alloc(64, (es + 63) & ~(uint64_t)63);
        out[i] = aligned_alloc(64, (rs + 63) & ~(uint64_t)63);
        if (!raw[i] || !encb[i] || !out[i]) {
            fprintf(stderr, "bench_kernels: out of memory\n");
            exit(1);
        }
        fill_block(&lay, (uint16_t *)raw[i], (uint64_t)i + 1);
        memset(encb[i], 0x5a, es); /* written: no first-touch fault when timed (a zero
                                     * memset after malloc may become calloc) */
        memset(out[i], 0x5a, rs);
    }
    printf("block: 32 layers x 8 kv heads x 128 dim x 32 tokens fp16 K+V = %.1f MiB, "
           "%d blocks cycled; AVX2: %s\n",
           rs / 1048576.0, NBLOCKS, kern_supports() & KERN_SUPPORT_CPU_AVX2 ? "yes" : "no");
    printf("GB/s: raw fp16 bytes per second (1e9), read by an encode, written by a decode, "
           "copied by memcpy\n");
    double mc = rs / time_op(0, NULL, NULL, &lay, NULL, raw, encb, out, rs, es) / 1e9;
    int first = 1;
    printf("%-28s %10.2f GB/s\n", "memcpy", mc);
    add_row("cpu/memcpy", mc, "GB/s", NULL, 0);
    for (int c = KERN_CODEC_Q8_0; c < KERN_CODEC_COUNT; c++) {
        struct kern_recipe rec;
        if (!codec_wanted(c))
            continue;
        kern_recipe_fill(&rec, c, c, 0);
        /* memcpy again beside each codec's rows: the host is shared, and a ratio is only
         * meaningful against a copy measured under the same load */
        if (!first) {
            mc = rs / time_op(0, NULL, NULL, &lay, NULL, raw, encb, out, rs, es) / 1e9;
            printf("%-28s %10.2f GB/s\n", "memcpy", mc);
        }
        first = 0;
        for (int v = 0; v < 2; v++) {
            enc_fn enc = v ? kern_encode_cpu : kern_encode_ref;
            dec_fn dec = v ? kern_decode_cpu : kern_decode_ref;
            for (int op = 1; op <= (v ? 3 : 2); op++) {
                char name[64];
                double s = time_op(op, enc, dec, &lay, &rec, raw, encb, out, rs, es);
                if (s <= 0)
                    continue; /* reported: the run fails */
                double gbs = rs / s / 1e9;
                snprintf(name, sizeof(name), "cpu/%s/%s/%s", kern_codec_name(c),
                         op == 1   ? "encode"
                         : op == 2 ? "decode"
                                   : "encode_stats",
                         v ? "avx2" : "ref");
                printf("%-28s %10.2f GB/s  %.2f x memcpy\n", name, gbs, gbs / mc);
                add_row(name, gbs, "GB/s", "memcpy", mc);
            }
        }
    }
    if (n_only == 0 && kern_cuda_device_count() > 0)
        bench_gpu(&lay, raw, rs);
    else if (n_only == 0)
        printf("SKIP: bench_kernels: gpu rows: no device\n");
    for (int i = 0; i < NBLOCKS; i++) {
        free(raw[i]);
        free(encb[i]);
        free(out[i]);
    }
}

/* ---- error table ----------------------------------------------------------------------- */

#define ERR_LAYERS 4
#define ERR_HEADS 8
#define ERR_DIM 128
#define ERR_BT 32
#define ERR_BLOCKS 8
#define ERR_CTX (ERR_BT * ERR_BLOCKS)
#define ERR_QUERIES 4

/* Attention of one query over ctx tokens of one (layer, head): out[dim]. */
static void attend(const float *q, const float *K, const float *V, float *o)
{
    double s[ERR_CTX], mx = -1e300, sum = 0;
    for (int t = 0; t < ERR_CTX; t++) {
        double dot = 0;
        for (int d = 0; d < ERR_DIM; d++)
            dot += (double)q[d] * K[t * ERR_DIM + d];
        s[t] = dot / sqrt((double)ERR_DIM);
        mx = s[t] > mx ? s[t] : mx;
    }
    for (int t = 0; t < ERR_CTX; t++)
        sum += (s[t] = exp(s[t] - mx));
    for (int d = 0; d < ERR_DIM; d++) {
        double acc = 0;
        for (int t = 0; t < ERR_CTX; t++)
            acc += s[t] * V[t * ERR_DIM + d];
        o[d] = (float)(acc / sum);
    }
}

static void error_table(void)
{
    struct kern_layout lay = {ERR_LAYERS, ERR_HEADS, ERR_DIM, ERR_BT, KERN_DTYPE_FP16, 0};
    uint64_t rs = kern_raw_size(&lay), n = rs / 2;
    uint16_t *raw = malloc(rs * ERR_BLOCKS), *dec = malloc(rs * ERR_BLOCKS);
    uint8_t *enc = malloc(rs + 65536);
    /* [layer][kind][head][ctx][dim] floats, raw and dequantized */
    size_t nf = (size_t)ERR_LAYERS * 2 * ERR_HEADS * ERR_CTX * ERR_DIM;
    float *x = malloc(nf * 4), *y = malloc(nf * 4);
    if (!raw || !dec || !enc || !x || !y) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        exit(1);
    }
    printf("\nerror on synthetic KV (keys with outlier channels), %d layers x %d heads x %d dim, "
           "%d-token context in %d blocks; seeds 1-3\n",
           ERR_LAYERS, ERR_HEADS, ERR_DIM, ERR_CTX, ERR_BLOCKS);
    printf("%-6s %9s %9s %9s %9s %9s %12s\n", "codec", "bits/val", "K rmse", "K max", "V rmse",
           "V max", "attn rel err");
    for (int c = KERN_CODEC_Q8_0; c < KERN_CODEC_COUNT; c++) {
        struct kern_recipe rec;
        kern_recipe_fill(&rec, c, c, 0);
        int64_t es = kern_encoded_size(&lay, &rec);
        double se[2] = {0, 0}, mx[2] = {0, 0}, attn = 0;
        long cnt[2] = {0, 0}, na = 0;
        for (uint64_t seed = 1; seed <= (bench_smoke() ? 1u : 3u); seed++) {
            for (int b = 0; b < ERR_BLOCKS; b++) {
                fill_block(&lay, raw + b * n, seed * 100 + (uint64_t)b);
                if (kern_encode_cpu(&lay, &rec, raw + b * n, enc, (size_t)es, NULL) != es ||
                    kern_decode_cpu(&lay, enc, (size_t)es, dec + b * n, rs, KERN_DTYPE_FP16) !=
                        (int64_t)rs) {
                    bench_fail("kernels: %s: error table: encode or decode failed",
                               kern_codec_name(c));
                    goto next_codec;
                }
                for (uint32_t l = 0; l < ERR_LAYERS; l++)
                    for (uint32_t k = 0; k < 2; k++)
                        for (uint32_t t = 0; t < ERR_BT; t++)
                            for (uint32_t h = 0; h < ERR_HEADS; h++)
                                for (uint32_t d = 0; d < ERR_DIM; d++) {
                                    uint64_t i = kern_raw_index(&lay, l, k, t, h) + d;
                                    size_t j = ((((size_t)l * 2 + k) * ERR_HEADS + h) * ERR_CTX +
                                                (size_t)b * ERR_BT + t) *
                                                   ERR_DIM +
                                               d;
                                    x[j] = kern_h2f(raw[b * n + i]);
                                    y[j] = kern_h2f(dec[b * n + i]);
                                    double e = fabs((double)x[j] - y[j]);
                                    se[k] += e * e;
                                    mx[k] = e > mx[k] ? e : mx[k];
                                    cnt[k]++;
                                }
            }
            uint64_t s = seed * 7919;
            for (uint32_t l = 0; l < ERR_LAYERS; l++)
                for (uint32_t h = 0; h < ERR_HEADS; h++)
                    for (int qi = 0; qi < ERR_QUERIES; qi++) {
                        float q[ERR_DIM], o1[ERR_DIM], o2[ERR_DIM];
                        for (int d = 0; d < ERR_DIM; d++)
                            q[d] = rng_gauss(&s);
                        size_t kb = (((size_t)l * 2 + 0) * ERR_HEADS + h) * ERR_CTX * ERR_DIM;
                        size_t vb = (((size_t)l * 2 + 1) * ERR_HEADS + h) * ERR_CTX * ERR_DIM;
                        attend(q, x + kb, x + vb, o1);
                        attend(q, y + kb, y + vb, o2);
                        double num = 0, den = 0;
                        for (int d = 0; d < ERR_DIM; d++) {
                            num += (double)(o1[d] - o2[d]) * (o1[d] - o2[d]);
                            den += (double)o1[d] * o1[d];
                        }
                        attn += sqrt(num / den);
                        na++;
                    }
        }
        double kr = sqrt(se[0] / cnt[0]), vr = sqrt(se[1] / cnt[1]), ar = attn / na;
        double bpv = 8.0 * (double)es / (double)n;
        printf("%-6s %9.2f %9.4f %9.3f %9.4f %9.3f %12.5f\n", kern_codec_name(c), bpv, kr, mx[0],
               vr, mx[1], ar);
        char name[64];
        const char *nm = kern_codec_name(c);
        snprintf(name, sizeof(name), "err/%s/k_rmse", nm);
        add_row(name, kr, "abs", NULL, 0);
        snprintf(name, sizeof(name), "err/%s/k_max", nm);
        add_row(name, mx[0], "abs", NULL, 0);
        snprintf(name, sizeof(name), "err/%s/v_rmse", nm);
        add_row(name, vr, "abs", NULL, 0);
        snprintf(name, sizeof(name), "err/%s/v_max", nm);
        add_row(name, mx[1], "abs", NULL, 0);
        snprintf(name, sizeof(name), "err/%s/attn_rel", nm);
        add_row(name, ar, "rel", NULL, 0);
        snprintf(name, sizeof(name), "size/%s/bits_per_value", nm);
        add_row(name, bpv, "bits", "raw fp16", 16);
    next_codec:;
    }
    free(raw);
    free(dec);
    free(enc);
    free(x);
    free(y);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_kernels OUT.json\n");
        return 2;
    }
    only_codecs = argv + 2;
    n_only = argc - 2;
    bench_throughput();
    if (n_only == 0)
        error_table();
    return bench_finish(argv[1], rows, nrows);
}
