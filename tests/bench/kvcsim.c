/*
 * kvcsim — replays a Mooncake-format JSONL trace against kvcd's policies.
 *
 *   kvcsim [-c CAPS] [-p POLICIES] [--block-bytes N] [--quant CODECS] [--lossy-weight W]
 *          [--victim-quant CODEC] [--layout LxHxDxT] [--page-size N] [--procs P]
 *          [--disk BLOCKS]
 *          [--admit-hits N] [--ghost F] [--fixed-half-life] [--half-life H] [--tune 0|1]
 *          [--csv FILE] [--counts]
 *          [--plot FILE.png] TRACE
 *
 * CAPS: comma list of capacities in blocks, or in bytes (suffix k/m/g/t) with --block-bytes.
 * POLICIES: comma list of policy names (lru, lfu, prefix, streaming, h2o, snapkv, keynorm,
 * quest, default, vatp) plus min (Belady, offline) and inf (infinite cache).
 * --half-life: the initial (with --fixed-half-life, the fixed) half-life in requests;
 * --tune 0|1: policy_tune's half-life off/on (default: on for `default` only).
 * --quant CODECS: comma list of codecs (q8_0, fp8, merge, lowrank, q5_1, rot4, kivi4, q4_1, rot2,
 * kivi2): the precision ladder
 * (policies/policy_ladder.c), a block stepping down one codec at a time before it leaves;
 * --lossy-weight W: what a lossy hit costs against a miss (default 0: the most hits);
 * --victim-quant CODEC: instead, policy_decide may quantize the eviction victim (the daemon's
 * engine today). raw_share: the ladder's learnt share of bytes kept raw; lossy_by_codec:
 * lossy hits per reference, by the codec that served them.
 * --layout LAYERSxHEADSxDIMxTOKENS (fp16, K and V; the block size follows): a block in codec c
 * takes what the daemon's store spends on it — the slot of its encoded size (kern_encoded_size,
 * K and V in c) on pages of --page-size (default 2m, host.page_size's default), as the slab
 * allocator cuts them (slab_slot_cost) — not the codec's nominal ratio; capacities in bytes
 * count raw blocks at their slot's cost too.
 * --procs P: P clients replay the requests in turn, as kvcreplay -p P runs them: a request's
 * new blocks take their room (raw, pinned) at its lookup and are committed — visible to
 * lookups, rankable, quantizable — once the next P - 1 requests have looked up; a lookup that
 * meets one is a miss (busy), and the request's blocks below it are put (the daemon holds a
 * put behind another client's of the same user until that one commits).
 * --counts: each row's counts on stderr (hits by kind, ghost hits, evictions, ladder steps,
 * busy references), to set beside the daemon's kvcctl stats.
 * Prints one CSV row per (policy, capacity); --plot draws hit ratio vs capacity with gnuplot.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern.h"
#include "policies/policy.h"
#include "tests/lib/sim.h"
#include "tiers/slab.h"

#define KVCSIM_MAX 64

static double kvcsim_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 't':
    case 'T':
        v *= 1024.0; /* fall through */
    case 'g':
    case 'G':
        v *= 1024.0; /* fall through */
    case 'm':
    case 'M':
        v *= 1024.0; /* fall through */
    case 'k':
    case 'K':
        v *= 1024.0;
        break;
    default:
        break;
    }
    return v;
}

static int kvcsim_split(char *s, char **out, int max)
{
    int n = 0;
    for (char *tok = strtok(s, ","); tok && n < max; tok = strtok(NULL, ","))
        out[n++] = tok;
    return n;
}

/* --layout: each codec's room from the store's slot for its encoded block, over the raw
 * block's slot (*raw_cost, bytes; *raw, the raw block's bytes). 0 or -EINVAL. */
static int kvcsim_rooms(const char *spec, uint64_t page, struct sim_config *c, double *raw_cost,
                        double *raw)
{
    struct kern_layout lay = {.dtype = KERN_DTYPE_FP16};
    struct kern_recipe rec;
    if (sscanf(spec, "%ux%ux%ux%u", &lay.layers, &lay.heads, &lay.head_dim, &lay.tokens) != 4 ||
        kern_layout_check(&lay))
        return -EINVAL;
    *raw = (double)kern_raw_size(&lay);
    *raw_cost = slab_slot_cost(page, kern_raw_size(&lay));
    if (*raw_cost <= 0)
        return -EINVAL;
    for (int k = 1; k < POLICY_CODEC_COUNT; k++) {
        int kc = sim_kern_codec((enum policy_codec)k);
        if (kc <= 0)
            continue;
        kern_recipe_fill(&rec, (enum kern_codec)kc, (enum kern_codec)kc, 0);
        int64_t n = kern_encoded_size(&lay, &rec);
        if (n <= 0)
            return -EINVAL;
        c->codec_room[k] = slab_slot_cost(page, (uint64_t)n) / *raw_cost;
    }
    return 0;
}

static void kvcsim_usage(void)
{
    fprintf(stderr,
            "usage: kvcsim [-c CAPS] [-p POLICIES] [--block-bytes N] [--quant CODECS]\n"
            "              [--lossy-weight W] [--victim-quant CODEC]\n"
            "              [--layout LxHxDxT] [--page-size N] [--procs P]\n"
            "              [--disk BLOCKS] [--admit-hits N] [--ghost F] [--fixed-half-life]\n"
            "              [--half-life H] [--tune 0|1]\n"
            "              [--csv FILE] [--counts] [--plot FILE.png] TRACE\n");
}

static int kvcsim_plot(const char *csv, const char *png, char **pols, int npol)
{
    char gp[4096], cmd[4200];
    FILE *f;
    int rc;

    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        fprintf(stderr, "kvcsim: gnuplot not found, no plot\n");
        return 0;
    }
    snprintf(gp, sizeof(gp), "%s.gp", csv);
    if (!(f = fopen(gp, "w")))
        return -errno;
    fprintf(f,
            "set terminal png size 900,600\nset output '%s'\n"
            "set datafile separator ','\nset logscale x\nset key left top\n"
            "set xlabel 'capacity (blocks)'\nset ylabel 'block hit ratio'\n"
            "set title 'kvcsim: block hit ratio vs capacity'\nset grid\nplot ",
            png);
    for (int i = 0; i < npol; i++)
        fprintf(f, "%s'%s' using (strcol(1) eq '%s' ? $2 : 1/0):3 with linespoints title '%s'",
                i ? ", " : "", csv, pols[i], pols[i]);
    fprintf(f, "\n");
    fclose(f);
    snprintf(cmd, sizeof(cmd), "gnuplot '%s'", gp);
    rc = system(cmd);
    remove(gp);
    if (rc != 0)
        fprintf(stderr, "kvcsim: gnuplot failed (%d)\n", rc);
    return rc == 0 ? 0 : -EIO;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"capacities", required_argument, 0, 'c'},   {"policies", required_argument, 0, 'p'},
        {"block-bytes", required_argument, 0, 'b'},  {"quant", required_argument, 0, 'q'},
        {"victim-quant", required_argument, 0, 'V'}, {"lossy-weight", required_argument, 0, 'W'},
        {"disk", required_argument, 0, 'd'},         {"admit-hits", required_argument, 0, 'A'},
        {"ghost", required_argument, 0, 'g'},        {"fixed-half-life", no_argument, 0, 'f'},
        {"half-life", required_argument, 0, 'H'},    {"tune", required_argument, 0, 'T'},
        {"csv", required_argument, 0, 'o'},          {"plot", required_argument, 0, 'P'},
        {"layout", required_argument, 0, 'L'},       {"page-size", required_argument, 0, 'S'},
        {"procs", required_argument, 0, 'R'},        {"counts", no_argument, 0, 'C'},
        {0, 0, 0, 0},
    };
    char capbuf[1024] = "1000,10000,50000,100000", polbuf[1024] = "lru,lfu,prefix,default,min,inf";
    char *caps[KVCSIM_MAX], *pols[KVCSIM_MAX];
    const char *csv_path = NULL, *plot_path = NULL, *layout = NULL;
    uint64_t page_size = 2u << 20;
    double block_bytes = 0, raw_cost = 0, raw_bytes = 0;
    struct sim_config base;
    struct sim_trace t;
    FILE *csv = NULL;
    int rc = 1, o, counts = 0;

    sim_config_init(&base);
    while ((o = getopt_long(argc, argv, "c:p:h", opts, NULL)) != -1) {
        switch (o) {
        case 'c':
            snprintf(capbuf, sizeof(capbuf), "%s", optarg);
            break;
        case 'p':
            snprintf(polbuf, sizeof(polbuf), "%s", optarg);
            break;
        case 'b':
            block_bytes = kvcsim_size(optarg);
            break;
        case 'q':
        case 'V': {
            /* --quant: the codecs of the precision ladder; --victim-quant: one codec for
             * policy_decide's victims (the daemon's engine as it is) */
            char buf[256], *save = NULL;
            snprintf(buf, sizeof(buf), "%s", optarg);
            for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                int codec = -1;
                for (int c = 1; c < POLICY_CODEC_COUNT; c++)
                    if (strcmp(tok, policy_codec_name((enum policy_codec)c)) == 0)
                        codec = c;
                if (codec < 0 || (o == 'V' && base.codec)) {
                    fprintf(stderr, "kvcsim: %s %s\n",
                            codec < 0 ? "unknown codec" : "one codec for",
                            codec < 0 ? tok : "--victim-quant");
                    return 2;
                }
                if (o == 'V')
                    base.codec = codec;
                else
                    base.ladder |= 1u << codec;
            }
            break;
        }
        case 'W':
            base.lossy_weight = strtod(optarg, NULL);
            break;
        case 'd':
            base.disk_blocks = strtoull(optarg, NULL, 0);
            break;
        case 'A':
            base.admit_hits = (uint32_t)strtoul(optarg, NULL, 0);
            break;
        case 'g':
            base.ghost_factor = strtod(optarg, NULL);
            break;
        case 'f':
            base.adapt = 0;
            break;
        case 'H':
            base.half_life = strtod(optarg, NULL);
            break;
        case 'T':
            base.tune = atoi(optarg);
            break;
        case 'o':
            csv_path = optarg;
            break;
        case 'P':
            plot_path = optarg;
            break;
        case 'L':
            layout = optarg;
            break;
        case 'S':
            page_size = (uint64_t)kvcsim_size(optarg);
            break;
        case 'R':
            base.procs = (uint32_t)strtoul(optarg, NULL, 0);
            break;
        case 'C':
            counts = 1;
            break;
        default:
            kvcsim_usage();
            return 2;
        }
    }
    if (optind != argc - 1) {
        kvcsim_usage();
        return 2;
    }
    if (layout && kvcsim_rooms(layout, page_size, &base, &raw_cost, &raw_bytes)) {
        fprintf(stderr,
                "kvcsim: --layout %s with --page-size %llu: not a layout of fp16 K+V "
                "blocks (LAYERSxHEADSxDIMxTOKENS) on power-of-two pages of 4k or more\n",
                layout, (unsigned long long)page_size);
        return 2;
    }
    int r = sim_trace_load(&t, argv[optind]);
    if (r < 0) {
        fprintf(stderr, "kvcsim: %s: cannot load trace (%s)\n", argv[optind], strerror(-r));
        return 1;
    }
    int ncap = kvcsim_split(capbuf, caps, KVCSIM_MAX);
    int npol = kvcsim_split(polbuf, pols, KVCSIM_MAX);
    if (plot_path && !csv_path)
        csv_path = "kvcsim.csv";
    if (csv_path && !(csv = fopen(csv_path, "w"))) {
        fprintf(stderr, "kvcsim: %s: %s\n", csv_path, strerror(errno));
        goto out;
    }
    const char *head = "policy,capacity,block_hit,prefix_hit,token_hit,full_hit,lossy_hit,"
                       "disk_hit,disk_bytes,half_life,raw_share,lossy_by_codec\n";
    printf("# %s: %zu requests, %zu block references, %u distinct blocks\n", argv[optind], t.nreq,
           t.nref, t.nblocks);
    fputs(head, stdout);
    if (csv)
        fputs(head, csv);
    for (int pi = 0; pi < npol; pi++) {
        int pol = sim_policy_from_name(pols[pi]);
        if (pol < 0) {
            fprintf(stderr, "kvcsim: unknown policy %s\n", pols[pi]);
            goto out;
        }
        for (int ci = 0; ci < ncap; ci++) {
            struct sim_config c = base;
            struct sim_result res;
            double cap = kvcsim_size(caps[ci]);
            c.policy = pol;
            /* With --layout a raw block takes its slot's cost: capacities in blocks are
             * blocks of the layout's size, counted in slots. */
            if (raw_cost > 0)
                c.capacity = (block_bytes > 0 ? cap : cap * raw_bytes) / raw_cost;
            else
                c.capacity = block_bytes > 0 ? cap / block_bytes : cap;
            if (sim_run(&t, &c, &res) < 0) {
                fprintf(stderr, "kvcsim: %s@%s failed\n", pols[pi], caps[ci]);
                goto out;
            }
            uint64_t hits = res.hits_full + res.hits_lossy + res.hits_disk;
            char line[512], by[160] = "", *p = by;
            for (int k = 1; k < POLICY_CODEC_COUNT; k++)
                if (res.hits_codec[k])
                    p += snprintf(p, sizeof(by) - (size_t)(p - by), "%s%s=%.4f", p == by ? "" : ";",
                                  policy_codec_name((enum policy_codec)k),
                                  sim_ratio(res.hits_codec[k], res.refs));
            snprintf(line, sizeof(line),
                     "%s,%.0f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.0f,%.1f,%.3f,%s\n", pols[pi],
                     c.capacity, sim_ratio(hits, res.refs), sim_ratio(res.prefix_hits, res.refs),
                     sim_ratio(res.token_hits, res.tokens), sim_ratio(res.hits_full, res.refs),
                     sim_ratio(res.hits_lossy, res.refs), sim_ratio(res.hits_disk, res.refs),
                     (double)res.disk_writes * (block_bytes > 0 ? block_bytes : 1.0), res.half_life,
                     res.raw_share, by);
            fputs(line, stdout);
            if (counts)
                fprintf(stderr,
                        "%s,%.0f: refs %" PRIu64 ", raw hits %" PRIu64 ", lossy hits %" PRIu64
                        ", disk hits %" PRIu64 ", ghost hits %" PRIu64 ", evictions %" PRIu64
                        ", ladder steps %" PRIu64 ", busy %" PRIu64 "\n",
                        pols[pi], c.capacity, res.refs, res.hits_full, res.hits_lossy,
                        res.hits_disk, res.ghost_hits, res.evictions, res.ladder_steps, res.busy);
            fflush(stdout);
            if (csv)
                fputs(line, csv);
        }
    }
    if (csv) {
        fclose(csv);
        csv = NULL;
    }
    if (plot_path && kvcsim_plot(csv_path, plot_path, pols, npol) < 0)
        goto out;
    rc = 0;
out:
    if (csv)
        fclose(csv);
    sim_trace_free(&t);
    return rc;
}
