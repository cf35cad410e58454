/*
 * kvc-demo — a stand-in inference engine for `make demo`.
 *
 * It builds a prompt of a shared system prefix plus a suffix of its own, loads the prompt's
 * cached blocks from kvcd, "computes" the KV of the rest, and stores what it computed. The
 * KV of a block is a deterministic function of the block's key (which names the whole
 * prefix), made costly on purpose so that a hit visibly saves work; every loaded block is
 * checked byte for byte against a fresh computation (outside the timings).
 *
 * The KV cache is what an engine has: one buffer for the whole prompt, allocated once with
 * malloc (so 16 bytes past a page, as a large malloc is) and written through before the
 * first request (an engine zeroes its cache pool at start), blocks at block-size strides.
 * Hits are loaded with kvc_get_prefix, as an engine would: through the shared index, no
 * system call. Beside the load, the same bytes are copied with memcpy from a page-aligned
 * buffer into the same cache addresses (best of three), the machine's limit measured in the
 * same run. --record FILE appends the run's figures as one key=value line (for demo.sh's
 * summary).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "client/kvc.h"

static double demo_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t demo_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The "forward pass": `rounds` passes over the block, each depending on the last. */
static void demo_compute(const struct kvc_key *k, uint8_t *out, size_t bytes, int rounds)
{
    uint64_t s = k->lo ^ (k->hi * 0x9e3779b97f4a7c15ull) ^ 1;
    uint64_t *w = (uint64_t *)out;
    size_t n = bytes / 8;
    for (size_t i = 0; i < n; i++)
        w[i] = demo_next(&s);
    for (int r = 1; r < rounds; r++)
        for (size_t i = 1; i < n; i++)
            w[i] ^= (w[i - 1] >> 3) * 0xff51afd7ed558ccdull;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'}, {"name", required_argument, NULL, 'n'},
        {"shared", required_argument, NULL, 'p'}, {"own", required_argument, NULL, 'o'},
        {"seed", required_argument, NULL, 'e'},   {"rounds", required_argument, NULL, 'r'},
        {"record", required_argument, NULL, 'R'}, {NULL, 0, NULL, 0}};
    const char *sock = NULL, *name = "engine", *record = NULL;
    long shared = 4096, own = 512, seed = 1, rounds = 24;
    int opt, rc = 1;
    while ((opt = getopt_long(argc, argv, "s:n:p:o:e:r:R:", opts, NULL)) != -1) {
        switch (opt) {
        case 's': sock = optarg; break;
        case 'n': name = optarg; break;
        case 'p': shared = atol(optarg); break;
        case 'o': own = atol(optarg); break;
        case 'e': seed = atol(optarg); break;
        case 'r': rounds = atol(optarg); break;
        case 'R':
            record = optarg;
            break;
        default:
            fprintf(stderr, "usage: kvc-demo [-s SOCKET] [--name N] [--shared TOKENS] "
                            "[--own TOKENS] [--seed S] [--rounds R] [--record FILE]\n");
            return 2;
        }
    }
    if (shared < 0 || own < 0 || shared + own <= 0 || rounds < 1) {
        fprintf(stderr, "kvc-demo: bad sizes\n");
        return 2;
    }
    /* A small model: 8 layers, 4 KV heads of 128, fp16, 16 tokens per block = 256 KiB. */
    struct kvc_layout layout = {.model_id = "demo/tiny-8l-4h-128d@rev1", .layers = 8,
                                .kv_heads = 4, .head_dim = 128, .block_tokens = 16,
                                .dtype = KVC_DTYPE_FP16, .kv_kind = KVC_KV_KIND_KV};
    size_t ntok = (size_t)(shared + own);
    uint32_t *tokens = malloc(ntok * sizeof(*tokens));
    kvc_client *c = NULL;
    kvc_ns *ns = NULL;
    struct kvc_key *keys = NULL;
    uint8_t *kv = NULL, *check = NULL, *src = MAP_FAILED;
    void **blocks = NULL;
    size_t src_len = 0;
    uint64_t s1 = 0x5eed0001, s2 = 0x1000 + (uint64_t)seed;
    for (size_t i = 0; i < (size_t)shared; i++)
        tokens[i] = (uint32_t)(demo_next(&s1) % 128000);
    for (size_t i = (size_t)shared; i < ntok; i++)
        tokens[i] = (uint32_t)(demo_next(&s2) % 128000);

    if ((rc = kvc_connect(sock, &c)) || (rc = kvc_ns_open(c, &layout, &ns))) {
        fprintf(stderr, "%s: kvcd: %s\n", name, kvc_strerror(rc));
        rc = 1;
        goto out;
    }
    size_t bb = kvc_ns_block_bytes(ns), nblk = ntok / layout.block_tokens;
    keys = calloc(nblk, sizeof(*keys));
    kv = malloc(nblk * bb);
    check = malloc(bb);
    blocks = calloc(nblk, sizeof(*blocks));
    if (!keys || !kv || !check || !blocks) {
        fprintf(stderr, "%s: out of memory\n", name);
        rc = 1;
        goto out;
    }
    memset(kv, 0, nblk * bb); /* the engine's cache pool, zeroed at start */
    int n = kvc_keys_from_tokens(ns, NULL, tokens, ntok, NULL, 0, keys, nblk);
    for (int i = 0; i < n; i++)
        blocks[i] = kv + (size_t)i * bb;

    double t0 = demo_now();
    int hit = kvc_get_prefix(ns, keys, (size_t)n, blocks);
    double t_load = demo_now() - t0;
    if (hit < 0) {
        fprintf(stderr, "%s: load: %s\n", name, kvc_strerror(hit));
        rc = 1;
        goto out;
    }

    t0 = demo_now();
    for (int i = hit; i < n; i++)
        demo_compute(&keys[i], kv + (size_t)i * bb, bb, (int)rounds);
    double t_compute = demo_now() - t0;

    int stored = n > hit ? kvc_put_prefix(ns, NULL, keys, (size_t)n, (const void *const *)blocks) : 0;
    if (stored < 0) {
        fprintf(stderr, "%s: put: %s\n", name, kvc_strerror(stored));
        rc = 1;
        goto out;
    }

    /* Byte-exact check of every loaded block against a fresh computation. */
    int bad = 0;
    for (int i = 0; i < hit; i++) {
        demo_compute(&keys[i], check, bb, (int)rounds);
        bad += memcmp(check, kv + (size_t)i * bb, bb) != 0;
    }
    /* The limit: memcpy of the same bytes into the same cache addresses, from a page-aligned
     * source as the arena is (best of three; the cache's contents are checked above). */
    double t_memcpy = 0;
    src_len = (size_t)hit * bb;
    if (hit) {
        src = mmap(NULL, src_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (src == MAP_FAILED) {
            fprintf(stderr, "%s: out of memory\n", name);
            rc = 1;
            goto out;
        }
        memset(src, 0x5a, src_len);
        for (int r = 0; r < 3; r++) {
            t0 = demo_now();
            for (int i = 0; i < hit; i++)
                memcpy(blocks[i], src + (size_t)i * bb, bb);
            double t = demo_now() - t0;
            t_memcpy = r == 0 || t < t_memcpy ? t : t_memcpy;
        }
    }
    double load_mib = (double)hit * (double)bb / 1048576.0;
    printf("%-3s prompt %5d tokens: %5d loaded from kvcd", name, n * (int)layout.block_tokens,
           hit * (int)layout.block_tokens);
    if (hit)
        printf(" (%.1f MiB in %.1f ms, %.2f GB/s; memcpy %.2f GB/s)", load_mib, t_load * 1e3,
               (double)src_len / t_load / 1e9, (double)src_len / t_memcpy / 1e9);
    printf(", %5d computed in %.0f ms; %d blocks stored; loaded bytes exact: %s\n",
           (n - hit) * (int)layout.block_tokens, t_compute * 1e3, stored, bad ? "NO" : "yes");
    if (record) {
        FILE *f = fopen(record, "ae");
        if (!f ||
            fprintf(f,
                    "name=%s hit_tokens=%d computed_tokens=%d load_bytes=%zu load_s=%.9f "
                    "memcpy_s=%.9f compute_s=%.9f\n",
                    name, hit * (int)layout.block_tokens, (n - hit) * (int)layout.block_tokens,
                    src_len, t_load, t_memcpy, t_compute) < 0) {
            fprintf(stderr, "%s: %s: cannot append the figures\n", name, record);
            bad = 1;
        }
        if (f)
            fclose(f);
    }
    rc = bad ? 1 : 0;
out:
    kvc_disconnect(c);
    free(tokens);
    free(keys);
    free(kv);
    free(check);
    free(blocks);
    if (src != MAP_FAILED)
        munmap(src, src_len);
    return rc;
}
