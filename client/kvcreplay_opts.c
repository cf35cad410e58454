/*
 * kvcreplay_opts.c — kvcreplay's command line: the usage text, sizes and counts read with
 * their bounds, --quant's codec list, and every option into struct replay_opts.
 *
 * DESIGN
 * Runs once, before the trace is read and before any process forks; whatever is not usable
 * is said on stderr with the option's name and ends the run (status 2), so a replay never
 * starts on a setting it would misread.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "client/kvc.h"
#include "client/kvcreplay.h"

void replay_usage(FILE *f)
{
    fprintf(
        f, "usage: kvcreplay [-s SOCKET] [-p PROCS] [-n REQUESTS] [--block-bytes N] [--model ID]\n"
           "                 [--chain] [--json] [--seed S] [--verify-seed S] [--wait-ms MS]\n"
           "                 [--kvcsim PATH | --no-sim] [--sim-policy NAME]\n"
           "                 [--sim-capacity BLOCKS] [--sim-disk BLOCKS] [--quant CODECS]\n"
           "                 TRACE.jsonl\n"
           "  -s, --socket PATH     kvcd's socket (default: $KVCD_SOCKET, then kvcd's default)\n"
           "  -p, --processes P     client processes, each with its own connection; request i\n"
           "                        goes to process i %% P (default 1, at most 256)\n"
           "  -n, --requests N      replay the first N requests only\n"
           "      --block-bytes N   bytes of one 512-token trace block (multiple of 2k; k/m\n"
           "                        suffixes; default 16k)\n"
           "      --model ID        namespace model id (default kvcreplay-BYTES)\n"
           "      --chain           ids are per-block content hashes: key_i = H(key_i-1, id_i)\n"
           "      --json            one JSON object instead of the table\n"
           "      --seed S          seed of the block bytes written (default 0)\n"
           "      --verify-seed S   seed the hits are checked against (default: --seed)\n"
           "      --wait-ms MS      longest wait for blocks read back from disk (default 60000)\n"
           "      --kvcsim PATH     the simulator (default: kvcsim next to kvcreplay)\n"
           "      --no-sim          no kvcsim prediction\n"
           "      --sim-policy NAME kvcsim policy (default: the namespace's policy)\n"
           "      --sim-capacity N  kvcsim host capacity in blocks (default: host tier / block)\n"
           "      --sim-disk N      kvcsim disk capacity in blocks (default: disk tier / block)\n"
           "      --quant CODECS    the namespace allows these codecs (q8_0,q4_1,q5_1,kivi2,\n"
           "                        kivi4,fp8,rot2,rot4,merge,lowrank; the first is its\n"
           "                        recipe): blocks are smooth fp16, a raw hit must be exact,\n"
           "                        a lossy one within its codec's bound\n"
           "                        (needs --block-bytes 64k or more)\n"
           "exit status: 0 ok; 1 wrong bytes, an error from kvcd or a failed process; 2 usage or\n"
           "a malformed trace\n");
}

/* A size: digits with an optional k/m/g suffix (powers of 1024). */
static int replay_size_parse(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;
    int shift = 0;
    if (!s || *s < '0' || *s > '9')
        return -EINVAL;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno)
        return -EINVAL;
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    default:
        break;
    }
    if (*end || v > (UINT64_MAX >> shift))
        return -EINVAL;
    *out = (uint64_t)v << shift;
    return 0;
}

static int replay_uint_parse(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    unsigned long long v;
    if (!s || *s < '0' || *s > '9')
        return -EINVAL;
    errno = 0;
    v = strtoull(s, &end, 0);
    if (errno || *end || v > max)
        return -EINVAL;
    *out = v;
    return 0;
}

/* --quant CODECS: a comma list; the first is the namespace's recipe. 0 or -EINVAL. */
static int replay_quant_parse(const char *arg, struct replay_opts *o)
{
    char buf[128], *save = NULL;
    if (strlen(arg) >= sizeof(buf))
        return -EINVAL;
    snprintf(buf, sizeof(buf), "%s", arg);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int c = -1;
        for (int k = 1; k < (int)(sizeof(replay_codec_names) / sizeof(*replay_codec_names)); k++)
            if (strcmp(t, replay_codec_names[k]) == 0)
                c = k;
        if (c < 0)
            return -EINVAL;
        if (!o->quant_allowed)
            o->quant_codec = c;
        o->quant_allowed |= 1u << c;
    }
    o->quant = o->quant_allowed ? arg : NULL;
    return o->quant_allowed ? 0 : -EINVAL;
}

int replay_opts_parse(int argc, char **argv, struct replay_opts *o)
{
    enum {
        O_BLOCK = 256,
        O_MODEL,
        O_CHAIN,
        O_JSON,
        O_SEED,
        O_VSEED,
        O_WAIT,
        O_KVCSIM,
        O_NOSIM,
        O_SPOL,
        O_SCAP,
        O_SDISK,
        O_QUANT
    };
    static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
                                         {"processes", required_argument, NULL, 'p'},
                                         {"requests", required_argument, NULL, 'n'},
                                         {"block-bytes", required_argument, NULL, O_BLOCK},
                                         {"model", required_argument, NULL, O_MODEL},
                                         {"chain", no_argument, NULL, O_CHAIN},
                                         {"json", no_argument, NULL, O_JSON},
                                         {"seed", required_argument, NULL, O_SEED},
                                         {"verify-seed", required_argument, NULL, O_VSEED},
                                         {"wait-ms", required_argument, NULL, O_WAIT},
                                         {"kvcsim", required_argument, NULL, O_KVCSIM},
                                         {"no-sim", no_argument, NULL, O_NOSIM},
                                         {"sim-policy", required_argument, NULL, O_SPOL},
                                         {"sim-capacity", required_argument, NULL, O_SCAP},
                                         {"sim-disk", required_argument, NULL, O_SDISK},
                                         {"quant", required_argument, NULL, O_QUANT},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    bool vseed = false;
    uint64_t v;
    int opt;
    *o = (struct replay_opts){.limit = UINT64_MAX,
                              .block_bytes = 16384,
                              .procs = 1,
                              .wait_ms = 60000,
                              .sim_capacity = -1,
                              .sim_disk = -1};
    while ((opt = getopt_long(argc, argv, "s:p:n:h", opts, NULL)) != -1) {
        const char *bad = NULL;
        switch (opt) {
        case 's':
            o->socket = optarg;
            break;
        case 'p':
            if (replay_uint_parse(optarg, REPLAY_MAX_PROCS, &v) || v == 0)
                bad = "-p takes 1..256";
            o->procs = (int)v;
            break;
        case 'n':
            if (replay_uint_parse(optarg, UINT64_MAX - 1, &o->limit))
                bad = "-n takes a count of requests";
            break;
        case O_BLOCK:
            if (replay_size_parse(optarg, &o->block_bytes) || o->block_bytes == 0 ||
                o->block_bytes % 2048 || o->block_bytes > (1ull << 30))
                bad = "--block-bytes takes a multiple of 2048 up to 1g";
            break;
        case O_MODEL:
            if (!*optarg || strlen(optarg) > 127)
                bad = "--model takes 1..127 bytes";
            o->model = optarg;
            break;
        case O_CHAIN:
            o->chain = true;
            break;
        case O_JSON:
            o->json = true;
            break;
        case O_SEED:
            if (replay_uint_parse(optarg, UINT64_MAX, &o->seed))
                bad = "--seed takes an unsigned integer";
            break;
        case O_VSEED:
            if (replay_uint_parse(optarg, UINT64_MAX, &o->verify_seed))
                bad = "--verify-seed takes an unsigned integer";
            vseed = true;
            break;
        case O_WAIT:
            if (replay_uint_parse(optarg, UINT_MAX, &v))
                bad = "--wait-ms takes milliseconds";
            o->wait_ms = (unsigned)v;
            break;
        case O_KVCSIM:
            o->kvcsim = optarg;
            break;
        case O_NOSIM:
            o->no_sim = true;
            break;
        case O_SPOL:
            if (strlen(optarg) >= 32)
                bad = "--sim-policy: unknown policy";
            o->sim_policy = optarg;
            break;
        case O_SCAP:
        case O_SDISK:
            if (replay_uint_parse(optarg, 1ull << 50, &v))
                bad = "--sim-capacity and --sim-disk take a count of blocks";
            *(opt == O_SCAP ? &o->sim_capacity : &o->sim_disk) = (double)v;
            break;
        case O_QUANT:
            if (replay_quant_parse(optarg, o))
                bad = "--quant takes codecs among q8_0,q4_1,q5_1,kivi2,kivi4,fp8,rot2,rot4,merge,"
                      "lowrank";
            break;
        case 'h':
            replay_usage(stdout);
            exit(0);
        default:
            replay_usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "kvcreplay: %s\n", bad);
            return 2;
        }
    }
    if (optind != argc - 1) {
        replay_usage(stderr);
        return 2;
    }
    o->trace = argv[optind];
    if (o->quant_allowed && o->block_bytes < 65536) {
        /* The layout's head_dim is block_bytes / 2048 up to 128: below 32 the codecs' groups
         * would pad every head, the encoded block is no smaller, and kvcd keeps it raw. */
        fprintf(stderr, "kvcreplay: --quant needs --block-bytes 64k or more (a head_dim of 32 "
                        "or more, which the codecs' groups need)\n");
        return 2;
    }
    if (!vseed)
        o->verify_seed = o->seed;
    if (!o->model) {
        snprintf(o->model_buf, sizeof(o->model_buf), "kvcreplay-%" PRIu64, o->block_bytes);
        o->model = o->model_buf;
    }
    return 0;
}
