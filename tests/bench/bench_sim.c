/*
 * bench_sim — block hit ratio of each policy against Belady MIN at the same capacity, on the
 * Mooncake conversation trace (or the trace given as argv[2] or $KVC_TRACE). Every policy
 * and the infinite cache; case POLICY@CAPACITY, value the hit ratio, baseline "min" with MIN's
 * hit ratio, ratio = value / MIN (a MIN of 0 is refused: no ratio without hits).
 * Then hit ratio per byte (case bytes/POLICY+CODECS@BUDGET): the precision ladder at a byte
 * budget of 1k and 10k raw blocks against raw LRU at 1.8x (q8_0) and 2.5x (q8_0, q4_1) the
 * bytes, and against the raw default at the same budget; targets: ratio >= 1.0.
 * Then the new rungs (case rungs/BUDGET@CAP): the ladder of every codec whose attention
 * error (kern_codec_attn_error) is within a fidelity budget of 0.3 and of 0.7, against the
 * ladder of the codecs it had before rot2/rot4/merge/lowrank at the same budget, both
 * charging each codec what the store's slot costs for a Llama-3-8B block of 16 tokens
 * (32 x 8 x 128, 2 MiB pages); the rungs each ladder took are printed. A ratio of 1 is a
 * new rung that never pays.
 * KVC_BENCH_SMOKE=1: the smallest capacity only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern.h"
#include "policies/policy.h"
#include "tests/lib/bench.h"
#include "tests/lib/sim.h"
#include "tiers/slab.h"

/* The new rungs at a fidelity budget against the old codecs' ladder at the same budget. */
static int bench_rungs(const struct sim_trace *t, struct bench_row *rows, size_t *nrows)
{
    static const double budgets[] = {0.3, 0.7}, bcaps[] = {1000, 10000};
    const uint32_t old = 1u << POLICY_CODEC_Q8 | 1u << POLICY_CODEC_FP8 | 1u << POLICY_CODEC_KIVI4 |
                         1u << POLICY_CODEC_Q4 | 1u << POLICY_CODEC_KIVI2 | 1u << POLICY_CODEC_Q5;
    struct kern_layout lay = {32, 8, 128, 16, KERN_DTYPE_FP16, 0};
    struct sim_config c;
    sim_config_init(&c);
    double raw = slab_slot_cost(2u << 20, kern_raw_size(&lay));
    for (int k = 1; k < POLICY_CODEC_COUNT; k++) {
        struct kern_recipe rec;
        enum kern_codec kc = (enum kern_codec)sim_kern_codec((enum policy_codec)k);
        kern_recipe_fill(&rec, kc, kc, 0);
        c.codec_room[k] = slab_slot_cost(2u << 20, (uint64_t)kern_encoded_size(&lay, &rec)) / raw;
    }
    printf("%-40s %8s %8s %8s  %s\n", "case", "new", "old", "ratio", "rungs new | old");
    for (size_t bi = 0; bi < sizeof(budgets) / sizeof(budgets[0]); bi++)
        for (size_t ci = 0; ci < (bench_smoke() ? 1u : 2u); ci++) {
            uint32_t all = 0;
            for (int k = 1; k < POLICY_CODEC_COUNT; k++)
                if (kern_codec_attn_error((enum kern_codec)sim_kern_codec((enum policy_codec)k)) <=
                    budgets[bi])
                    all |= 1u << k;
            struct sim_result rn, ro;
            char names[2][160] = {"", ""};
            c.policy = POLICY_DEFAULT;
            c.capacity = bcaps[ci];
            for (int w = 0; w < 2; w++) {
                c.ladder = w == 0 ? all : all & old;
                if (sim_run(t, &c, w == 0 ? &rn : &ro) < 0) {
                    bench_fail("sim: rungs at %.0f failed", bcaps[ci]);
                    return -1;
                }
                const struct sim_result *rr = w == 0 ? &rn : &ro;
                for (uint32_t k = 1; k < rr->rungs; k++)
                    snprintf(names[w] + strlen(names[w]), sizeof(names[w]) - strlen(names[w]),
                             "%s%s", names[w][0] ? "," : "",
                             policy_codec_name((enum policy_codec)rr->rung_codec[k]));
            }
            double vn = sim_ratio(rn.hits_full + rn.hits_lossy, rn.refs);
            double vo = sim_ratio(ro.hits_full + ro.hits_lossy, ro.refs);
            char name[64];
            snprintf(name, sizeof(name), "rungs/budget%.1f@%.0f", budgets[bi], bcaps[ci]);
            printf("%-40s %8.4f %8.4f %8.3f  %s | %s\n", name, vn, vo, vo > 0 ? vn / vo : 0,
                   names[0], names[1]);
            bench_row_add(rows, 256, nrows, name, vn, "hit_ratio", "old_rungs", vo);
        }
    return 0;
}

int main(int argc, char **argv)
{
    static const double caps[] = { 1000, 10000, 50000, 100000 };
    static const int pols[] = { POLICY_LRU,     POLICY_LFU,    POLICY_PREFIX,
                                POLICY_STREAMING, POLICY_H2O,  POLICY_SNAPKV,
                                POLICY_KEYNORM, POLICY_QUEST,  POLICY_DEFAULT,
                                SIM_POLICY_INFINITE };
    const char *out = argc > 1 ? argv[1] : "build/bench/sim.json";
    const char *path = argc > 2 ? argv[2] : getenv("KVC_TRACE");
    if (!path)
        path = KVC_SRC_DIR "/../shared/traces/conversation_trace.jsonl";
    struct sim_trace t;
    int rc = 1;
    static struct bench_row rows[256];
    size_t nrows = 0;

    int r = sim_trace_load(&t, path);
    if (r < 0) {
        fprintf(stderr, "bench_sim: %s: cannot load trace (%s)\n", path, strerror(-r));
        return 1;
    }
    printf("%-18s %8s %8s %8s\n", "case", "hit", "min", "ratio");
    const size_t ncaps = bench_smoke() ? 1 : sizeof(caps) / sizeof(caps[0]);
    for (size_t ci = 0; ci < ncaps; ci++) {
        struct sim_config c;
        struct sim_result mr, res;
        sim_config_init(&c);
        c.capacity = caps[ci];
        c.policy = SIM_POLICY_MIN;
        if (sim_run(&t, &c, &mr) < 0) {
            bench_fail("sim: MIN at %.0f failed", caps[ci]);
            goto out;
        }
        double minv = sim_ratio(mr.hits_full, mr.refs);
        for (size_t pi = 0; pi < sizeof(pols) / sizeof(pols[0]); pi++) {
            c.policy = pols[pi];
            if (sim_run(&t, &c, &res) < 0) {
                bench_fail("sim: %s at %.0f failed", sim_policy_name(pols[pi]), caps[ci]);
                goto out;
            }
            double v = sim_ratio(res.hits_full + res.hits_lossy + res.hits_disk, res.refs);
            char name[64];
            snprintf(name, sizeof(name), "%s@%.0f", sim_policy_name(pols[pi]), caps[ci]);
            printf("%-18s %8.4f %8.4f %8.3f\n", name, v, minv, minv > 0 ? v / minv : 0);
            bench_row_add(rows, sizeof(rows) / sizeof(rows[0]), &nrows, name, v, "hit_ratio",
                          "min", minv);
        }
    }
    /* Hit ratio per byte: the precision ladder (policy_ladder.c) at a byte budget of 1k and
     * 10k raw blocks against raw LRU given 1.8x (q8_0) and 2.5x (q8_0 then q4_1) the bytes,
     * and against the raw default at the same budget. The share of lossy hits is printed
     * (lossy: lossy hits over all hits). */
    printf("%-40s %8s %8s %8s %8s\n", "case", "hit", "base", "ratio", "lossy");
    static const double bcaps[] = { 1000, 10000 };
    const size_t nb = bench_smoke() ? 1 : sizeof(bcaps) / sizeof(bcaps[0]);
    for (size_t ci = 0; ci < nb; ci++) {
        struct {
            const char *name, *base;
            uint32_t ladder;
            int base_policy;
            double base_scale;
        } cases[] = {
            {"default+q8_0", "lru", 1u << POLICY_CODEC_Q8, POLICY_LRU, 1.8},
            {"default+q8_0,q4_1", "lru", 1u << POLICY_CODEC_Q8 | 1u << POLICY_CODEC_Q4,
             POLICY_LRU, 2.5},
            {"default+q8_0", "default", 1u << POLICY_CODEC_Q8, POLICY_DEFAULT, 1.0},
        };
        for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
            struct sim_config c;
            struct sim_result res, base;
            sim_config_init(&c);
            c.policy = cases[k].base_policy;
            c.capacity = bcaps[ci] * cases[k].base_scale;
            if (sim_run(&t, &c, &base) < 0) {
                bench_fail("sim: %s at %.0f failed", cases[k].base, c.capacity);
                goto out;
            }
            c.policy = POLICY_DEFAULT;
            c.capacity = bcaps[ci];
            c.ladder = cases[k].ladder;
            if (sim_run(&t, &c, &res) < 0) {
                bench_fail("sim: %s at %.0f failed", cases[k].name, bcaps[ci]);
                goto out;
            }
            double v = sim_ratio(res.hits_full + res.hits_lossy + res.hits_disk, res.refs);
            double bv = sim_ratio(base.hits_full + base.hits_lossy + base.hits_disk, base.refs);
            char name[96], bname[64];
            snprintf(bname, sizeof(bname), "%s@%.0f", cases[k].base,
                     bcaps[ci] * cases[k].base_scale);
            snprintf(name, sizeof(name), "bytes/%s@%.0f:%s", cases[k].name, bcaps[ci], bname);
            printf("%-40s %8.4f %8.4f %8.3f %8.3f\n", name, v, bv, bv > 0 ? v / bv : 0,
                   sim_ratio(res.hits_lossy, res.hits_full + res.hits_lossy + res.hits_disk));
            bench_row_add(rows, sizeof(rows) / sizeof(rows[0]), &nrows, name, v, "hit_ratio",
                          bname, bv);
        }
    }
    if (bench_rungs(&t, rows, &nrows) < 0)
        goto out;
out:
    rc = bench_finish(out, rows, nrows);
    sim_trace_free(&t);
    return rc;
}
