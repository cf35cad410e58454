/*
 * bench_sim — block hit ratio of each policy against Belady MIN at the same capacity, on the
 * Mooncake conversation trace (or the trace given as argv[2] or $KVC_TRACE). Every policy
 * and the infinite cache; case POLICY@CAPACITY, value the hit ratio, baseline "min" with MIN's
 * hit ratio, ratio = value / MIN (a MIN of 0 is refused: no ratio without hits).
 * KVC_BENCH_SMOKE=1: the smallest capacity only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policies/policy.h"
#include "tests/lib/bench.h"
#include "tests/lib/sim.h"

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
out:
    rc = bench_finish(out, rows, nrows);
    sim_trace_free(&t);
    return rc;
}
