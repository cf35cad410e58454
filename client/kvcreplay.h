/*
 * kvcreplay.h — what kvcreplay's files share: the run's settings (struct replay_opts) and
 * their parsing from the command line (kvcreplay_opts.c); kvcreplay.c replays.
 */
#ifndef KVC_KVCREPLAY_H
#define KVC_KVCREPLAY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define REPLAY_MAX_PROCS 256
#define REPLAY_NCODECS 11

/* Run-wide settings, fixed before the processes fork. */
struct replay_opts {
    const char *socket;
    const char *trace;
    const char *model;
    const char *kvcsim;     /* path, or NULL: next to this binary */
    const char *sim_policy; /* NULL: the namespace's policy */
    uint64_t limit;         /* requests replayed; UINT64_MAX: all */
    uint64_t block_bytes;
    uint64_t seed, verify_seed;
    double sim_capacity, sim_disk; /* blocks; < 0: from the daemon's gauges */
    const char *quant;             /* --quant CODECS as given, or NULL: raw blocks */
    uint32_t quant_allowed;        /* 1u << KVC_CODEC_* of --quant */
    int quant_codec;               /* the first of them: the namespace's recipe for K and V */
    unsigned wait_ms;
    int procs;
    bool chain, json, no_sim;
    char model_buf[64];
};

/* Names of the codecs by KVC_CODEC_* (kvcsim's names). */
extern const char *const replay_codec_names[REPLAY_NCODECS];

/* The usage text, to f. */
void replay_usage(FILE *f);
/* The options of argv into o: 0, or 2 when they are not usable (said on stderr, with the
 * usage for an unknown one); --help prints the usage and exits. */
int replay_opts_parse(int argc, char **argv, struct replay_opts *o);

#endif
