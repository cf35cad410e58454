/*
 * kvcreplay — replays a Mooncake-format JSONL trace through a running kvcd, as engine
 * processes would, and checks every byte it gets back.
 *
 * DESIGN
 * A trace line is one request: `hash_ids` name its 512-token blocks. Each trace block is one
 * kvcd block of --block-bytes in a namespace whose layout has exactly that size (fp16 K+V,
 * 512 tokens a block, layers x heads x head_dim = bytes / 2048), so the daemon's token
 * counters are trace tokens. Keys are XXH3-128 of the id (each id already names a whole
 * prefix) or, with --chain, of (parent key, id) for traces whose ids hash one block's
 * content. A block's bytes are a keystream seeded by XXH3-64 of the whole 128-bit key and
 * the fill seed, each word also XORed with a key half, so any process can check any block
 * and a block served under the wrong key or torn anywhere shows up as wrong bytes.
 *
 * The parent reads the trace once before anything reaches the daemon: it validates every
 * line (a malformed one stops the run with its line number), counts requests, blocks and
 * tokens, and computes the infinite-cache hit ratio (a block hits iff its key was seen
 * before; the set of keys is the only memory that grows with the trace, 32 bytes a distinct
 * block). Then it forks P processes; each takes the next request of the trace not yet taken
 * (a shared counter), so the processes serve neighbouring requests in trace order, each over
 * its own connection, re-reading the file (so no process holds the trace).
 * Per request: one LOOKUP for the whole prefix without waiting, then kvc_lease_wait() for the
 * blocks the daemon reads back from disk (so disk hits count as hits), copy each hit out
 * and check every byte, release, then reserve / fill / commit the missing suffix. Timestamps
 * only order the requests: the replay runs as fast as the daemon serves it.
 *
 * Figures beside the replay's own: the daemon's counters (hits per tier, promotions, disk
 * writes) as deltas around the run, and kvcsim's prediction for the same trace, policy and
 * capacity. kvcsim is executed (found next to kvcreplay) rather than linked: kvcreplay stays
 * a pure libkvc client, as STYLE.md asks of client/, and the prediction is the one the
 * simulator's users get. Exit status: 0 ok; 1 a wrong byte, an error from the daemon other
 * than a refusal (no room, quota), or a process that failed; 2 usage or a malformed trace.
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
#include "client/kvcreplay_trace.h"

#define REPLAY_RESERVE_CHUNK 2048u     /* keys per RESERVE (the protocol's batch) */
#define REPLAY_SIM_OUT_MAX (64u << 10) /* bytes of kvcsim's output read */

const char *const replay_codec_names[REPLAY_NCODECS] = {
    "raw", "q8_0", "q4_1", "q5_1", "kivi2", "kivi4", "fp8", "rot2", "rot4", "merge", "lowrank"};

/* Counters of one replay process, in a MAP_SHARED page the parent reads after waitpid. */
struct replay_counts {
    uint64_t requests, blocks, tokens;
    uint64_t hits, hits_ready, tokens_hit, bytes_loaded, hits_lossy;
    uint64_t put_blocks, put_present, put_busy, put_refused, lookups_refused;
    uint64_t wrong_bytes, wrong_blocks, errors;
    double lookup_s, put_s;
    double lossy_err_max; /* largest normalised RMS error of a lossy hit */
    int finished; /* 1 once the process reached the end of its share */
};

/* Totals of the validation pass. */
struct replay_scan {
    uint64_t requests, blocks, tokens, inf_hits, inf_tokens_hit, distinct;
    int sim_fd; /* memfd with the trace as kvcsim should see it, or -1: the file itself */
};

/* ---- keys and block bytes ---------------------------------------------------------------- */

static const uint64_t replay_key_seed = 0x6b766372706c6179ull; /* "kvcrplay" */

/* keys[i] for the ids of r: XXH3-128 of the id, or of (parent key, id) with chain. */
static void replay_keys_make(const struct replay_req *r, bool chain, struct kvc_key *keys)
{
    struct kvc_key prev = {0, 0};
    for (uint32_t i = 0; i < r->n; i++) {
        uint64_t in[3] = {htole64(prev.lo), htole64(prev.hi), htole64(r->ids[i])};
        XXH128_hash_t h = chain ? XXH3_128bits_withSeed(in, sizeof(in), replay_key_seed)
                                : XXH3_128bits_withSeed(&in[2], 8, replay_key_seed);
        if ((h.low64 | h.high64) == 0) /* all-zero is "no parent" in kvc.h */
            h.low64 = 1;
        keys[i].lo = h.low64;
        keys[i].hi = h.high64;
        prev = keys[i];
    }
}

/* The keystream of a block: wyrand, seeded by XXH3-64 of both key halves and the fill seed. */
static uint64_t replay_fill_seed(const struct kvc_key *k, uint64_t seed)
{
    uint64_t kk[2] = {htole64(k->lo), htole64(k->hi)};
    return XXH3_64bits_withSeed(kk, sizeof(kk), seed ^ 0x9e3779b97f4a7c15ull);
}

static inline uint64_t replay_fill_next(uint64_t *s)
{
    unsigned __int128 t;
    *s += 0xa0761d6478bd642full;
    t = (unsigned __int128)*s * (*s ^ 0xe7037ed1a0b428dbull);
    return (uint64_t)(t >> 64) ^ (uint64_t)t;
}

/* Word i of a block also carries a key half, so even two keys whose 64-bit seeds collided
 * would not share bytes. len is a multiple of 8 (block sizes are multiples of 2 KiB). */
static void replay_fill(const struct kvc_key *k, uint64_t seed, void *buf, size_t len)
{
    uint64_t s = replay_fill_seed(k, seed);
    uint8_t *p = buf;
    for (size_t i = 0; i + 8 <= len; i += 8) {
        uint64_t w = replay_fill_next(&s) ^ ((i & 8) ? k->hi : k->lo);
        memcpy(p + i, &w, 8);
    }
}

/* --quant: the block of k as smooth fp16 values a codec can represent (a sine per block,
 * phase and noise from the same seed), so a lossy hit is checked against its codec's error
 * bound and a block served under another key is still far off. */
#define REPLAY_SINE 1024 /* positions of the sine the smooth fill walks */
/* fp16 values of the smooth fill (3 sin + noise, 16 noise levels in [-1, 1)) and fp16 ->
 * float for the check: tables, because without F16C each conversion is a library call. */
static uint16_t replay_smooth_tab[REPLAY_SINE][16];
static float replay_h2f[65536];

static void replay_smooth_init(void)
{
    if (replay_h2f[0x3c00] == 1.0f) /* fp16 1.0: built already (each process builds its own) */
        return;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t u = (uint16_t)i;
        _Float16 h;
        memcpy(&h, &u, 2);
        replay_h2f[i] = (float)h;
    }
    for (int i = 0; i < REPLAY_SINE; i++)
        for (int n = 0; n < 16; n++) {
            _Float16 h =
                (_Float16)(3.0 * sin(6.283185307179586 * i / REPLAY_SINE) + (n + 0.5) / 8.0 - 1.0);
            memcpy(&replay_smooth_tab[i][n], &h, 2);
        }
}

static void replay_fill_smooth(const struct kvc_key *k, uint64_t seed, void *buf, size_t len)
{
    uint64_t s = replay_fill_seed(k, seed), r = 0;
    uint32_t phase = (uint32_t)(replay_fill_next(&s) >> 40);
    uint16_t *p = buf;
    replay_smooth_init();
    for (size_t j = 0; j < len / 2; j++) {
        if ((j & 15) == 0) /* 16 noise levels of 4 bits from each 64-bit draw */
            r = replay_fill_next(&s);
        uint32_t pos = (phase + (uint32_t)j * 61u) % REPLAY_SINE;
        p[j] = replay_smooth_tab[pos][(r >> (4 * (j & 15))) & 15];
    }
}

/* Normalised RMS error of buf against the smooth block of k. */
static double replay_smooth_err(const struct kvc_key *k, uint64_t seed, const void *buf, size_t len,
                                void *scratch)
{
    const uint16_t *want = scratch, *got = buf;
    double e = 0, r = 0;
    replay_fill_smooth(k, seed, scratch, len);
    for (size_t j = 0; j < len / 2; j++) {
        double a = replay_h2f[want[j]], b = replay_h2f[got[j]];
        e += (a - b) * (a - b);
        r += a * a;
    }
    return r > 0 ? sqrt(e / r) : INFINITY;
}

/* The error a lossy hit may show (docs/kernels.md's bounds for each codec; MERGE's at its
 * default threshold; LOWRANK's keys at the rank its R allows: the smooth fill's sine is rank
 * 2, its noise what the factors leave). A block served under another key is off by about
 * 1.4 (an unrelated sine of the same amplitude), far past every bound. */
static double replay_codec_bound(int codec)
{
    switch (codec) {
    case KVC_CODEC_Q8_0:
        return 0.02;
    case KVC_CODEC_FP8:
        return 0.05;
    case KVC_CODEC_Q5_1:
        return 0.06;
    case KVC_CODEC_Q4_1:
    case KVC_CODEC_KIVI4:
    case KVC_CODEC_ROT4:
        return 0.12;
    case KVC_CODEC_KIVI2:
    case KVC_CODEC_ROT2:
    case KVC_CODEC_MERGE:
    case KVC_CODEC_LOWRANK:
        return 0.5;
    default:
        return 0.0;
    }
}

/* Bytes of buf that differ from the block of k. */
static uint64_t replay_check(const struct kvc_key *k, uint64_t seed, const void *buf, size_t len)
{
    uint64_t s = replay_fill_seed(k, seed), wrong = 0;
    const uint8_t *p = buf;
    for (size_t i = 0; i + 8 <= len; i += 8) {
        uint64_t w = replay_fill_next(&s) ^ ((i & 8) ? k->hi : k->lo), got;
        memcpy(&got, p + i, 8);
        if (got != w) {
            uint64_t x = got ^ w;
            for (int b = 0; b < 8; b++)
                wrong += ((x >> (8 * b)) & 0xff) != 0;
        }
    }
    return wrong;
}

/* The replay's namespace: raw, or with --quant the codecs allowed and the first as the recipe
 * of K and V (the daemon quantizes in place under pressure). */
static int replay_ns_open(const struct replay_opts *o, kvc_client *c, const struct kvc_layout *lay,
                          kvc_ns **ns)
{
    struct kvc_quant q = {.allowed = o->quant_allowed,
                          .k_codec = (uint32_t)o->quant_codec,
                          .v_codec = (uint32_t)o->quant_codec};
    return o->quant_allowed ? kvc_ns_open_quant(c, lay, &q, ns) : kvc_ns_open(c, lay, ns);
}

/* A namespace layout of exactly `bytes` per 512-token block: fp16 K+V, so layers x kv_heads x
 * head_dim = bytes / 2048, head_dim up to 128 and kv_heads up to 8 as real models have them. */
static int replay_layout(const char *model, uint64_t bytes, struct kvc_layout *l)
{
    uint64_t x, dim = 1, heads = 1;
    if (bytes == 0 || bytes % 2048)
        return -EINVAL;
    x = bytes / 2048;
    while (dim < 128 && x % 2 == 0) {
        dim *= 2;
        x /= 2;
    }
    while (heads < 8 && x % 2 == 0) {
        heads *= 2;
        x /= 2;
    }
    if (x > 4096)
        return -E2BIG;
    *l = (struct kvc_layout){.model_id = model,
                             .layers = (uint32_t)x,
                             .kv_heads = (uint32_t)heads,
                             .head_dim = (uint32_t)dim,
                             .block_tokens = REPLAY_BLOCK_TOKENS,
                             .dtype = KVC_DTYPE_FP16,
                             .kv_kind = KVC_KV_KIND_KV};
    return 0;
}

/* ---- the validation pass and the infinite cache ---------------------------------------------- */

/* Open addressing over 128-bit keys; {0, 0} marks an empty slot (keys are never zero). */
struct replay_set {
    struct kvc_key *slot;
    size_t cap, n;
};

static int replay_set_grow(struct replay_set *s)
{
    size_t cap = s->cap ? s->cap * 2 : 1u << 16;
    struct kvc_key *t = calloc(cap, sizeof(*t));
    if (!t)
        return -ENOMEM;
    for (size_t i = 0; i < s->cap; i++) {
        struct kvc_key k = s->slot[i];
        if (!(k.lo | k.hi))
            continue;
        size_t h = (size_t)(k.lo ^ k.hi) & (cap - 1);
        while (t[h].lo | t[h].hi)
            h = (h + 1) & (cap - 1);
        t[h] = k;
    }
    free(s->slot);
    s->slot = t;
    s->cap = cap;
    return 0;
}

/* 1 if k was in the set, 0 if it was added, -ENOMEM. */
static int replay_set_add(struct replay_set *s, const struct kvc_key *k)
{
    size_t h;
    if ((s->n + 1) * 2 > s->cap && replay_set_grow(s))
        return -ENOMEM;
    h = (size_t)(k->lo ^ k->hi) & (s->cap - 1);
    while (s->slot[h].lo | s->slot[h].hi) {
        if (s->slot[h].lo == k->lo && s->slot[h].hi == k->hi)
            return 1;
        h = (h + 1) & (s->cap - 1);
    }
    s->slot[h] = *k;
    s->n++;
    return 0;
}

/* One request of the trace kvcreplay hands kvcsim, a line as the trace format has it. kvcsim
 * takes an id as naming a whole prefix: with --chain (keys not NULL) the key does, and its
 * low half, shifted below 2^63 as the format bounds ids (kvcreplay_trace.c), stands for it.
 * 0, or -ENOMEM. */
static int replay_sim_line(FILE *sim, const struct replay_req *r, const struct kvc_key *keys)
{
    json_t *ids = json_array(), *line;
    char *text;
    int rc = -ENOMEM;
    for (uint32_t i = 0; i < r->n; i++)
        json_array_append_new(ids, json_integer((json_int_t)(keys ? keys[i].lo >> 1 : r->ids[i])));
    line = json_pack("{s:I, s:I, s:o}", "timestamp", (json_int_t)floor(r->ts), "input_length",
                     (json_int_t)r->input_len, "hash_ids", ids);
    text = line && json_array_size(ids) == r->n ? json_dumps(line, 0) : NULL;
    if (text) {
        fprintf(sim, "%s\n", text);
        rc = 0;
    }
    free(text);
    json_decref(line);
    return rc;
}

/* Reads the whole trace (up to the request limit): validates every line, counts, and replays
 * it against an infinite cache. With --chain or -n, also writes the trace as kvcsim must see
 * it (ids naming prefixes, the first N requests) into a memfd. 0, or 2 (reported). */
static int replay_scan_run(const struct replay_opts *o, struct replay_scan *sc)
{
    struct replay_reader rd;
    struct replay_req r = {0};
    struct replay_set seen = {0};
    struct kvc_key *keys = NULL;
    FILE *sim = NULL;
    char err[200];
    int rc = 2, got;
    size_t len;
    char *line;

    memset(sc, 0, sizeof(*sc));
    sc->sim_fd = -1;
    got = replay_reader_open(&rd, o->trace);
    if (got) {
        fprintf(stderr, "kvcreplay: %s: %s\n", o->trace, strerror(-got));
        return 2;
    }
    r.ids = malloc(REPLAY_MAX_BLOCKS * sizeof(*r.ids));
    keys = malloc(REPLAY_MAX_BLOCKS * sizeof(*keys));
    if (!r.ids || !keys) {
        fprintf(stderr, "kvcreplay: out of memory\n");
        goto out;
    }
    if (!o->no_sim && (o->chain || o->limit != UINT64_MAX)) {
        sc->sim_fd = memfd_create("kvcreplay-sim-trace", 0);
        int dupfd = sc->sim_fd >= 0 ? dup(sc->sim_fd) : -1;
        sim = dupfd >= 0 ? fdopen(dupfd, "w") : NULL;
        if (!sim) {
            fprintf(stderr, "kvcreplay: cannot make the simulator's trace (%s)\n", strerror(errno));
            if (dupfd >= 0)
                close(dupfd);
            goto out;
        }
    }
    while (sc->requests < o->limit && (got = replay_reader_next(&rd, &line, &len)) > 0) {
        if (replay_line_blank(line, len))
            continue;
        if (replay_line_parse(line, len, &r, err, sizeof(err))) {
            fprintf(stderr, "kvcreplay: %s:%" PRIu64 ": %s\n", o->trace, rd.line, err);
            goto out;
        }
        replay_keys_make(&r, o->chain, keys);
        for (uint32_t i = 0; i < r.n; i++) {
            int was = replay_set_add(&seen, &keys[i]);
            uint64_t t = replay_block_tokens(&r, i);
            if (was < 0) {
                fprintf(stderr, "kvcreplay: out of memory (%zu distinct blocks)\n", seen.n);
                goto out;
            }
            sc->inf_hits += (uint64_t)was;
            sc->inf_tokens_hit += was ? t : 0;
            sc->tokens += t;
        }
        sc->blocks += r.n;
        sc->requests++;
        if (sim && replay_sim_line(sim, &r, o->chain ? keys : NULL)) {
            fprintf(stderr, "kvcreplay: out of memory (the trace for kvcsim)\n");
            goto out;
        }
    }
    if (got < 0) {
        fprintf(stderr, "kvcreplay: %s:%" PRIu64 ": %s\n", o->trace, rd.line,
                got == -E2BIG ? "line longer than 1 MiB" : strerror(-got));
        goto out;
    }
    if (sc->requests == 0) {
        fprintf(stderr, "kvcreplay: %s: no requests\n", o->trace);
        goto out;
    }
    sc->distinct = seen.n;
    if (sim && (fflush(sim) != 0 || ferror(sim))) {
        fprintf(stderr, "kvcreplay: cannot write the simulator's trace\n");
        goto out;
    }
    rc = 0;
out:
    if (sim)
        fclose(sim);
    if (rc && sc->sim_fd >= 0) {
        close(sc->sim_fd);
        sc->sim_fd = -1;
    }
    free(seen.slot);
    free(keys);
    free(r.ids);
    replay_reader_close(&rd);
    return rc;
}

/* ---- one replay process ------------------------------------------------------------------- */

/* A refusal is the daemon saying no room or over quota: counted, not an error. */
static bool replay_refusal(int rc)
{
    return rc == -ENOSPC || rc == -EDQUOT || rc == -EMFILE;
}

static double replay_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct replay_worker {
    const struct replay_opts *o;
    int id;
    kvc_ns *ns;
    size_t bb;
    struct kvc_key *keys; /* [REPLAY_MAX_BLOCKS] */
    uint8_t *buf;         /* one block: where hits are copied to */
    uint8_t *scratch;     /* one block: the expected bytes of a lossy hit (--quant) */
    struct replay_counts *cnt;
};

/* Looks the prefix of r up, copies and checks each hit. The number of hits, or -errno. */
static int replay_worker_get(struct replay_worker *w, const struct replay_req *r)
{
    kvc_lease *l = NULL;
    int hit, ready, rc;
    double t0 = replay_now();
    hit = kvc_lookup(w->ns, w->keys, r->n, KVC_LOOKUP_NOWAIT, &l);
    if (hit <= 0) {
        if (hit < 0 && replay_refusal(hit)) {
            w->cnt->lookups_refused++;
            hit = 0;
        }
        w->cnt->lookup_s += replay_now() - t0;
        return hit;
    }
    ready = kvc_lease_ready(l);
    /* Blocks the daemon reads back from disk: wait for them, so they count as hits. */
    rc = kvc_lease_wait(l, w->o->wait_ms);
    if (rc < 0) {
        kvc_release(l);
        return rc;
    }
    w->cnt->hits_ready += (uint64_t)(ready < rc ? ready : rc);
    hit = rc;
    for (int i = 0; i < hit; i++) {
        uint64_t wrong;
        rc = kvc_lease_copy(l, (size_t)i, w->buf, w->bb);
        if (rc < 0) {
            kvc_release(l);
            return rc;
        }
        if (w->o->quant_allowed) {
            const void *data;
            size_t slen;
            int f = kvc_lease_stored(l, (size_t)i, &data, &slen);
            double err =
                replay_smooth_err(&w->keys[i], w->o->verify_seed, w->buf, w->bb, w->scratch);
            w->cnt->hits_lossy += f > 0;
            if (f > 0 && err > w->cnt->lossy_err_max)
                w->cnt->lossy_err_max = err;
            /* raw: exact; lossy: within its codec's bound; else the whole block is wrong */
            wrong = (f == KVC_CODEC_RAW ? err == 0.0 : f > 0 && err <= replay_codec_bound(f))
                        ? 0
                        : w->bb;
        } else {
            wrong = replay_check(&w->keys[i], w->o->verify_seed, w->buf, w->bb);
        }
        if (wrong) {
            if (w->cnt->wrong_blocks < 5)
                fprintf(stderr,
                        "kvcreplay: process %d: line %" PRIu64 " block %d (key %016" PRIx64
                        "%016" PRIx64 "): %" PRIu64 " wrong bytes\n",
                        w->id, r->line, i, w->keys[i].hi, w->keys[i].lo, wrong);
            w->cnt->wrong_bytes += wrong;
            w->cnt->wrong_blocks++;
        }
        w->cnt->tokens_hit += replay_block_tokens(r, (uint32_t)i);
        w->cnt->bytes_loaded += w->bb;
    }
    rc = kvc_release(l);
    w->cnt->lookup_s += replay_now() - t0;
    return rc < 0 ? rc : hit;
}

/* Puts keys[from..n) of r, chained to keys[from-1], a batch of REPLAY_RESERVE_CHUNK at a
 * time. 0 or -errno. */
static int replay_worker_put(struct replay_worker *w, const struct replay_req *r, uint32_t from)
{
    double t0 = replay_now();
    int rc = 0;
    while (from < r->n) {
        uint32_t n = r->n - from < REPLAY_RESERVE_CHUNK ? r->n - from : REPLAY_RESERVE_CHUNK;
        const struct kvc_key *parent = from ? &w->keys[from - 1] : NULL;
        kvc_resv *rv = NULL;
        uint32_t reserved = 0, committed, ok = 0;
        bool busy = false;
        rc = kvc_reserve(w->ns, parent, &w->keys[from], n, &rv);
        if (rc < 0) {
            if (replay_refusal(rc)) {
                w->cnt->put_refused += r->n - from;
                rc = 0;
            }
            goto out;
        }
        for (uint32_t i = 0; i < n; i++) {
            int st = kvc_resv_status(rv, i);
            void *slot;
            switch (st) {
            case KVC_SLOT_PRESENT: /* another process put it since our lookup */
                w->cnt->put_present++;
                ok = i + 1;
                break;
            case KVC_SLOT_RESERVED:
                slot = kvc_resv_data(rv, i);
                if (!slot) {
                    kvc_abort(rv);
                    rc = -EPROTO;
                    goto out;
                }
                (w->o->quant_allowed ? replay_fill_smooth : replay_fill)(&w->keys[from + i],
                                                                         w->o->seed, slot, w->bb);
                reserved++;
                ok = i + 1;
                break;
            case KVC_SLOT_BUSY: /* another process writes it: so does the chain after it */
                w->cnt->put_busy++;
                busy = true;
                break;
            case KVC_SLOT_SKIPPED:
                if (busy)
                    w->cnt->put_busy++;
                else
                    w->cnt->put_refused++;
                break;
            case KVC_SLOT_NOSPACE:
                w->cnt->put_refused++;
                break;
            default:
                kvc_abort(rv);
                rc = st < 0 ? st : -EPROTO;
                goto out;
            }
        }
        rc = kvc_commit(rv, SIZE_MAX);
        if (rc < 0 && !replay_refusal(rc))
            goto out;
        committed = rc < 0 ? 0 : (uint32_t)rc;
        w->cnt->put_blocks += committed;
        if (committed < reserved)
            w->cnt->put_refused += reserved - committed;
        rc = 0;
        if (ok < n) /* the chain stops here: the rest has no cached parent */
            break;
        from += n;
    }
out:
    w->cnt->put_s += replay_now() - t0;
    return rc;
}

/* Process `id`: replays the requests it takes from the shared dispatch counter `next`, in
 * trace order. Exit status: 0 or 1. */
static int replay_worker_run(const struct replay_opts *o, int id, struct replay_counts *cnt,
                             _Atomic uint64_t *next)
{
    struct replay_worker w = {.o = o, .id = id, .cnt = cnt};
    struct replay_reader rd = {.fd = -1};
    struct replay_req r = {0};
    struct kvc_layout lay;
    kvc_client *c = NULL;
    uint64_t idx = 0, mine = atomic_fetch_add(next, 1);
    char err[200], *line;
    size_t len;
    int rc, got = 0;

    rc = kvc_connect(o->socket, &c);
    if (rc) {
        fprintf(stderr, "kvcreplay: process %d: cannot reach kvcd: %s\n", id, kvc_strerror(rc));
        goto out;
    }
    replay_layout(o->model, o->block_bytes, &lay);
    rc = replay_ns_open(o, c, &lay, &w.ns);
    if (rc) {
        fprintf(stderr, "kvcreplay: process %d: namespace %s: %s\n", id, o->model,
                kvc_strerror(rc));
        goto out;
    }
    w.bb = kvc_ns_block_bytes(w.ns);
    rc = replay_reader_open(&rd, o->trace);
    if (rc) {
        fprintf(stderr, "kvcreplay: process %d: %s: %s\n", id, o->trace, strerror(-rc));
        goto out;
    }
    r.ids = malloc(REPLAY_MAX_BLOCKS * sizeof(*r.ids));
    w.keys = malloc(REPLAY_MAX_BLOCKS * sizeof(*w.keys));
    w.buf = aligned_alloc(64, w.bb);
    w.scratch = aligned_alloc(64, w.bb);
    if (!r.ids || !w.keys || !w.buf || !w.scratch) {
        rc = -ENOMEM;
        fprintf(stderr, "kvcreplay: process %d: out of memory\n", id);
        goto out;
    }
    while (idx < o->limit && (got = replay_reader_next(&rd, &line, &len)) > 0) {
        int hit;
        if (replay_line_blank(line, len))
            continue;
        /* The next request not yet taken goes to whichever process is free, so the P
         * processes always work on neighbouring requests of the trace (as engines serving
         * arrivals in order); a fixed i % P split lets them drift apart in trace time. */
        if (idx++ != mine)
            continue;
        mine = atomic_fetch_add(next, 1);
        rc = replay_line_parse(line, len, &r, err, sizeof(err));
        if (rc) { /* the file changed since the validation pass */
            fprintf(stderr, "kvcreplay: %s:%" PRIu64 ": %s\n", o->trace, rd.line, err);
            goto out;
        }
        r.line = rd.line;
        replay_keys_make(&r, o->chain, w.keys);
        cnt->requests++;
        cnt->blocks += r.n;
        for (uint32_t i = 0; i < r.n; i++)
            cnt->tokens += replay_block_tokens(&r, i);
        if (r.n == 0)
            continue;
        hit = replay_worker_get(&w, &r);
        if (hit < 0) {
            rc = hit;
            fprintf(stderr, "kvcreplay: process %d: line %" PRIu64 ": lookup: %s\n", id, r.line,
                    kvc_strerror(rc));
            goto out;
        }
        cnt->hits += (uint64_t)hit;
        rc = replay_worker_put(&w, &r, (uint32_t)hit);
        if (rc) {
            fprintf(stderr, "kvcreplay: process %d: line %" PRIu64 ": put: %s\n", id, r.line,
                    kvc_strerror(rc));
            goto out;
        }
    }
    if (got < 0) {
        rc = got;
        fprintf(stderr, "kvcreplay: process %d: %s: %s\n", id, o->trace, strerror(-got));
        goto out;
    }
    cnt->finished = 1;
out:
    if (rc)
        cnt->errors++;
    free(w.buf);
    free(w.scratch);
    free(w.keys);
    free(r.ids);
    replay_reader_close(&rd);
    kvc_disconnect(c);
    return rc || cnt->wrong_bytes ? 1 : 0;
}

/* ---- the daemon's counters ----------------------------------------------------------------- */

/* Counters read around the run: namespace scope where the daemon keeps them per namespace
 * (hits), daemon scope for the disk tier's. */
#define REPLAY_STATS(X)                                                                            \
    X(hit_blocks, 1)                                                                               \
    X(hit_tokens_host, 1)                                                                          \
    X(hit_tokens_disk, 1)                                                                          \
    X(hit_tokens_gpu, 1)                                                                           \
    X(promoted_blocks, 1)                                                                          \
    X(demoted_blocks, 1)                                                                           \
    X(demote_dropped, 1)                                                                           \
    X(evicted_blocks, 1)                                                                           \
    X(bytes_out, 1)                                                                                \
    X(committed_blocks, 1)                                                                         \
    X(nospace_blocks, 1)                                                                           \
    X(busy_blocks, 1)                                                                              \
    X(checksum_failures, 0)                                                                        \
    X(disk_evicted_blocks, 0)                                                                      \
    X(disk_writes, 0)                                                                              \
    X(disk_reads, 0)                                                                               \
    X(disk_bytes_written, 0)

enum replay_stat {
#define REPLAY_STAT_ENUM(name, per_ns) REPLAY_STAT_##name,
    REPLAY_STATS(REPLAY_STAT_ENUM)
#undef REPLAY_STAT_ENUM
        REPLAY_STAT_COUNT
};

static const char *const replay_stat_names[] = {
#define REPLAY_STAT_NAME(name, per_ns) #name,
    REPLAY_STATS(REPLAY_STAT_NAME)
#undef REPLAY_STAT_NAME
};

static const bool replay_stat_per_ns[] = {
#define REPLAY_STAT_SCOPE(name, per_ns) per_ns,
    REPLAY_STATS(REPLAY_STAT_SCOPE)
#undef REPLAY_STAT_SCOPE
};

struct replay_stats {
    uint64_t v[REPLAY_STAT_COUNT];
    bool have[REPLAY_STAT_COUNT];
    uint64_t host_capacity, disk_capacity; /* gauges, bytes */
    bool have_disk;
};

static uint64_t replay_stat_find(const struct kvc_stat *s, size_t n, const char *name, bool *have)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s[i].name, name) == 0) {
            *have = true;
            return s[i].value;
        }
    *have = false;
    return 0;
}

static int replay_stats_read(kvc_client *c, uint32_t ns_id, struct replay_stats *st)
{
    struct kvc_stat *g = NULL, *ns = NULL;
    size_t ng = 0, nn = 0;
    bool have;
    int rc = kvc_stats(c, 0, &g, &ng);
    if (rc == 0)
        rc = kvc_stats(c, ns_id, &ns, &nn);
    if (rc)
        goto out;
    memset(st, 0, sizeof(*st));
    for (int i = 0; i < REPLAY_STAT_COUNT; i++) {
        if (replay_stat_per_ns[i])
            st->v[i] = replay_stat_find(ns, nn, replay_stat_names[i], &st->have[i]);
        if (!st->have[i])
            st->v[i] = replay_stat_find(g, ng, replay_stat_names[i], &st->have[i]);
    }
    st->host_capacity = replay_stat_find(g, ng, "host_capacity", &have);
    st->disk_capacity = replay_stat_find(g, ng, "disk_capacity", &st->have_disk);
out:
    free(g);
    free(ns);
    return rc;
}

/* Waits (up to 30 s) until no disk write or move is in flight, so that the disk counters read
 * after the run include every write the run caused. */
static void replay_stats_settle(kvc_client *c)
{
    double end = replay_now() + 30.0;
    while (replay_now() < end) {
        struct kvc_stat *g;
        size_t n;
        bool h1, h2;
        if (kvc_stats(c, 0, &g, &n))
            return;
        uint64_t busy = replay_stat_find(g, n, "disk_writes_inflight", &h1) +
                        replay_stat_find(g, n, "disk_moves_inflight", &h2);
        free(g);
        if (busy == 0)
            return;
        usleep(20000);
    }
}

/* ---- kvcsim's prediction ---------------------------------------------------------------------- */

struct replay_sim {
    bool ok;
    char policy[32];
    double capacity, disk, block_hit, token_hit;
    char page_size[32]; /* the daemon's host.page_size ("" unknown: kvcsim's default) */
    char why[160];      /* when !ok */
};

/* kvcsim next to this binary. */
static int replay_sim_path(char *out, size_t len)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    char *slash;
    if (n <= 0)
        return -errno;
    self[n] = 0;
    slash = strrchr(self, '/');
    if (!slash)
        return -ENOENT;
    *slash = 0;
    if ((size_t)snprintf(out, len, "%s/kvcsim", self) >= len)
        return -ENAMETOOLONG;
    return 0;
}

/* Runs kvcsim -c CAP -p POLICY [--disk D --admit-hits A] TRACE and reads its one row. */
static void replay_sim_run(const struct replay_opts *o, const struct replay_scan *sc,
                           unsigned admit_hits, struct replay_sim *sim)
{
    char path[PATH_MAX], cap[32], disk[32], admit[16], trace[64], layout[64], procs[16];
    char quant[128] = "";
    char *out = NULL;
    const char *argv[28];
    int pfd[2] = {-1, -1}, st, n = 0;
    size_t used = 0;
    pid_t pid;

    sim->ok = false;
    if (o->kvcsim)
        snprintf(path, sizeof(path), "%s", o->kvcsim);
    else if (replay_sim_path(path, sizeof(path)))
        snprintf(path, sizeof(path), "kvcsim");
    if (access(path, X_OK) != 0) {
        snprintf(sim->why, sizeof(sim->why), "%.100s not found (make kvcsim, or --kvcsim PATH)",
                 path);
        return;
    }
    snprintf(cap, sizeof(cap), "%.0f", sim->capacity);
    snprintf(disk, sizeof(disk), "%.0f", sim->disk);
    snprintf(admit, sizeof(admit), "%u", admit_hits);
    if (sc->sim_fd >= 0)
        snprintf(trace, sizeof(trace), "/proc/self/fd/%d", sc->sim_fd);
    argv[n++] = path;
    argv[n++] = "-c";
    argv[n++] = cap;
    argv[n++] = "-p";
    argv[n++] = sim->policy;
    if (sim->disk > 0) {
        argv[n++] = "--disk";
        argv[n++] = disk;
        argv[n++] = "--admit-hits";
        argv[n++] = admit;
    }
    /* The smooth fill has no runs of alike tokens: merge refuses every block, and the daemon
     * takes merge off the ladder (STORE_MERGE_WINDOW). kvcsim, which sees no bytes, counts a
     * merge step as done: it is given the codecs but merge. */
    for (int k = 1; k < REPLAY_NCODECS; k++)
        if ((o->quant_allowed & (1u << k)) && k != KVC_CODEC_MERGE)
            snprintf(quant + strlen(quant), sizeof(quant) - strlen(quant), "%s%s",
                     quant[0] ? "," : "", replay_codec_names[k]);
    if (quant[0] && strcmp(sim->policy, "lru") != 0) {
        /* The daemon's namespace climbs down the same precision ladder. */
        argv[n++] = "--quant";
        argv[n++] = quant;
        /* What the daemon spends on a block of each codec: its slot (kvcsim --layout), not
         * the codec's nominal ratio (a q4_1 copy of a 64 KiB block takes a 24 KiB slot). */
        struct kvc_layout lay;
        if (replay_layout(o->model, o->block_bytes, &lay) == 0) {
            snprintf(layout, sizeof(layout), "%ux%ux%ux%u", lay.layers, lay.kv_heads, lay.head_dim,
                     lay.block_tokens);
            argv[n++] = "--layout";
            argv[n++] = layout;
            if (sim->page_size[0]) {
                argv[n++] = "--page-size";
                argv[n++] = sim->page_size;
            }
        }
    } else if (quant[0] && o->quant_codec != KVC_CODEC_MERGE) {
        /* under lru the fixed order quantizes the coldest */
        argv[n++] = "--victim-quant";
        argv[n++] = replay_codec_names[o->quant_codec];
    }
    if (o->procs > 1) {
        /* Requests overlap as the processes take them: each one's puts hold their room and
         * are nobody's hits until the next procs - 1 requests have looked up. */
        snprintf(procs, sizeof(procs), "%d", o->procs);
        argv[n++] = "--procs";
        argv[n++] = procs;
    }
    argv[n++] = sc->sim_fd >= 0 ? trace : o->trace;
    argv[n] = NULL;
    out = malloc(REPLAY_SIM_OUT_MAX + 1);
    if (!out || pipe2(pfd, O_CLOEXEC) < 0) {
        snprintf(sim->why, sizeof(sim->why), "cannot run kvcsim (%s)", strerror(errno));
        goto out;
    }
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        execv(path, (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    pfd[1] = -1;
    if (pid < 0) {
        snprintf(sim->why, sizeof(sim->why), "cannot run kvcsim (%s)", strerror(errno));
        goto out;
    }
    for (;;) {
        ssize_t got = read(pfd[0], out + used, REPLAY_SIM_OUT_MAX - used);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        used += (size_t)got;
        if (used == REPLAY_SIM_OUT_MAX)
            break;
    }
    out[used] = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        snprintf(sim->why, sizeof(sim->why), "kvcsim failed (status %d)",
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        goto out;
    }
    /* One CSV row: policy,capacity,block_hit,prefix_hit,token_hit,... */
    for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n")) {
        size_t pl = strlen(sim->policy);
        if (strncmp(l, sim->policy, pl) != 0 || l[pl] != ',')
            continue;
        if (sscanf(l + pl + 1, "%*[^,],%lf,%*[^,],%lf", &sim->block_hit, &sim->token_hit) == 2)
            sim->ok = true;
        break;
    }
    if (!sim->ok)
        snprintf(sim->why, sizeof(sim->why), "kvcsim printed no row for %s", sim->policy);
out:
    if (pfd[0] >= 0)
        close(pfd[0]);
    if (pfd[1] >= 0)
        close(pfd[1]);
    free(out);
}

/* ---- report ------------------------------------------------------------------------------------ */

static double replay_ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0.0;
}

struct replay_result {
    const struct replay_opts *o;
    struct replay_counts t; /* summed over processes */
    struct replay_stats before, after;
    struct replay_sim sim;
    struct replay_scan sc;
    int failed_procs;
    double wall_s;
};

/* Delta of a daemon counter, or -1 when the daemon does not have it. */
static int64_t replay_delta(const struct replay_result *res, enum replay_stat i)
{
    if (!res->before.have[i] || !res->after.have[i])
        return -1;
    return (int64_t)(res->after.v[i] - res->before.v[i]);
}

/* A fraction with the 6 decimals the report has always printed. */
static json_t *replay_json_ratio(double v)
{
    return json_real(round(v * 1e6) / 1e6);
}

/* Seconds with 3 decimals. */
static json_t *replay_json_s(double v)
{
    return json_real(round(v * 1e3) / 1e3);
}

/* The report as one JSON object on one line (jansson; reals with 15 significant digits, so a
 * value rounded to its decimals prints as exactly those). 0, or -ENOMEM. */
static int replay_report_json(const struct replay_opts *o, const struct replay_result *res)
{
    const struct replay_counts *t = &res->t;
    json_t *daemon = json_object(), *sim = json_null(), *doc;
    char *text;
    int bad = 0;
    for (int i = 0; i < REPLAY_STAT_COUNT; i++) {
        int64_t d = replay_delta(res, (enum replay_stat)i);
        bad |= json_object_set_new(daemon, replay_stat_names[i],
                                   d < 0 ? json_null() : json_integer(d));
    }
    if (res->sim.ok)
        sim = json_pack("{s:s, s:I, s:I, s:o, s:o}", "policy", res->sim.policy, "capacity_blocks",
                        (json_int_t)llround(res->sim.capacity), "disk_blocks",
                        (json_int_t)llround(res->sim.disk), "block_hit_ratio",
                        replay_json_ratio(res->sim.block_hit), "token_hit_ratio",
                        replay_json_ratio(res->sim.token_hit));
    doc = json_pack(
        "{s:o, s:o, s:i, s:I, s:b, s:I, s:I, s:I, s:o, s:I, s:I, s:o, s:I, s:I, s:I, s:I, s:I, "
        "s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:i, s:o, s:o, s:o, s:I, s:I, s:o, s:o, s:o, s:o}",
        "trace", json_stringn_nocheck(o->trace, strlen(o->trace)), "model",
        json_stringn_nocheck(o->model, strlen(o->model)), "processes", o->procs, "block_bytes",
        (json_int_t)o->block_bytes, "chain", (int)o->chain, "requests", (json_int_t)t->requests,
        "blocks_looked_up", (json_int_t)t->blocks, "blocks_hit", (json_int_t)t->hits,
        "block_hit_ratio", replay_json_ratio(replay_ratio(t->hits, t->blocks)), "tokens",
        (json_int_t)t->tokens, "tokens_hit", (json_int_t)t->tokens_hit, "token_hit_ratio",
        replay_json_ratio(replay_ratio(t->tokens_hit, t->tokens)), "hits_in_memory",
        (json_int_t)t->hits_ready, "hits_waited", (json_int_t)(t->hits - t->hits_ready),
        "bytes_loaded", (json_int_t)t->bytes_loaded, "blocks_put", (json_int_t)t->put_blocks,
        "blocks_present", (json_int_t)t->put_present, "blocks_busy", (json_int_t)t->put_busy,
        "puts_refused", (json_int_t)t->put_refused, "lookups_refused",
        (json_int_t)t->lookups_refused, "wrong_bytes", (json_int_t)t->wrong_bytes, "wrong_blocks",
        (json_int_t)t->wrong_blocks, "errors", (json_int_t)t->errors, "hits_lossy",
        (json_int_t)t->hits_lossy, "lossy_err_max", t->lossy_err_max, "failed_processes",
        res->failed_procs, "wall_s", replay_json_s(res->wall_s), "lookup_s",
        replay_json_s(t->lookup_s), "put_s", replay_json_s(t->put_s), "distinct_blocks",
        (json_int_t)res->sc.distinct, "infinite_hits", (json_int_t)res->sc.inf_hits,
        "infinite_hit_ratio", replay_json_ratio(replay_ratio(res->sc.inf_hits, res->sc.blocks)),
        "infinite_token_hit_ratio",
        replay_json_ratio(replay_ratio(res->sc.inf_tokens_hit, res->sc.tokens)), "daemon",
        bad ? NULL : daemon, "kvcsim", sim);
    if (bad)
        json_decref(daemon);
    text = doc ? json_dumps(doc, JSON_REAL_PRECISION(15)) : NULL;
    json_decref(doc);
    if (!text) {
        fprintf(stderr, "kvcreplay: cannot write the report (out of memory)\n");
        return -ENOMEM;
    }
    printf("%s\n", text);
    free(text);
    return 0;
}

static void replay_report_text(const struct replay_opts *o, const struct replay_result *res)
{
    const struct replay_counts *t = &res->t;
    int64_t hh = replay_delta(res, REPLAY_STAT_hit_tokens_host);
    int64_t hd = replay_delta(res, REPLAY_STAT_hit_tokens_disk);
    int64_t hg = replay_delta(res, REPLAY_STAT_hit_tokens_gpu);
    int64_t dw = replay_delta(res, REPLAY_STAT_disk_writes);
    int64_t pr = replay_delta(res, REPLAY_STAT_promoted_blocks);
    printf("kvcreplay: %s, %" PRIu64 " requests, %d process%s, %" PRIu64
           "-byte blocks, namespace %s%s\n",
           o->trace, t->requests, o->procs, o->procs == 1 ? "" : "es", o->block_bytes, o->model,
           o->chain ? ", chained ids" : "");
    printf("%-28s %12s %12s %12s\n", "", "replay", "kvcsim", "infinite");
    printf("%-28s %12.4f ", "block hit ratio", replay_ratio(t->hits, t->blocks));
    if (res->sim.ok)
        printf("%12.4f ", res->sim.block_hit);
    else
        printf("%12s ", "-");
    printf("%12.4f\n", replay_ratio(res->sc.inf_hits, res->sc.blocks));
    printf("%-28s %12.4f ", "token hit ratio", replay_ratio(t->tokens_hit, t->tokens));
    if (res->sim.ok)
        printf("%12.4f ", res->sim.token_hit);
    else
        printf("%12s ", "-");
    printf("%12.4f\n", replay_ratio(res->sc.inf_tokens_hit, res->sc.tokens));
    printf("%-28s %12" PRIu64 " %12s %12" PRIu64 "\n", "blocks hit", t->hits, "", res->sc.inf_hits);
    printf("%-28s %12" PRIu64 "\n", "blocks looked up", t->blocks);
    printf("%-28s %12" PRIu64 "\n", "distinct blocks", res->sc.distinct);
    printf("%-28s %12" PRIu64 " (in memory at lookup %" PRIu64 ", waited for %" PRIu64 ")\n",
           "hits (client)", t->hits, t->hits_ready, t->hits - t->hits_ready);
    if (res->o->quant_allowed)
        printf("%-28s %12" PRIu64
               " (%.4f of the blocks looked up; within the codec's bound; largest error %.4f)\n",
               "lossy hits (client)", t->hits_lossy, replay_ratio(t->hits_lossy, t->blocks),
               t->lossy_err_max);
    printf("%-28s ", "hits per tier (daemon)");
    if (hh >= 0 && hd >= 0)
        printf("host %" PRId64 ", disk %" PRId64 ", gpu %" PRId64 " blocks\n",
               hh / REPLAY_BLOCK_TOKENS, hd / REPLAY_BLOCK_TOKENS,
               hg >= 0 ? hg / REPLAY_BLOCK_TOKENS : 0);
    else
        printf("-\n");
    printf("%-28s %12.1f MiB\n", "bytes loaded", (double)t->bytes_loaded / 1048576.0);
    printf("%-28s %12" PRIu64 " (present %" PRIu64 ", busy %" PRIu64 ")\n", "blocks put",
           t->put_blocks, t->put_present, t->put_busy);
    printf("%-28s %12" PRIu64 " (lookups refused %" PRIu64 ")\n", "puts refused", t->put_refused,
           t->lookups_refused);
    if (dw >= 0)
        printf("%-28s %12" PRId64 " (%.3f per distinct block)\n", "disk writes (daemon)", dw,
               replay_ratio((uint64_t)dw, res->sc.distinct));
    else
        printf("%-28s %12s\n", "disk writes (daemon)", "no disk tier");
    if (pr >= 0)
        printf("%-28s %12" PRId64 "\n", "promoted blocks (daemon)", pr);
    printf("%-28s %12" PRIu64 " in %" PRIu64 " blocks\n", "wrong bytes", t->wrong_bytes,
           t->wrong_blocks);
    printf("%-28s %12" PRIu64 "%s\n", "errors", t->errors,
           res->failed_procs ? " (a process failed)" : "");
    printf("%-28s %12.2f s (%.0f requests/s; lookups %.2f s, puts %.2f s over all processes)\n",
           "wall time", res->wall_s, res->wall_s > 0 ? (double)t->requests / res->wall_s : 0.0,
           t->lookup_s, t->put_s);
    if (res->sim.ok)
        printf("kvcsim: policy %s, %.0f host blocks, %.0f disk blocks\n", res->sim.policy,
               res->sim.capacity, res->sim.disk);
    else if (!o->no_sim)
        printf("kvcsim: no prediction: %s\n", res->sim.why);
}

/* ---- main ----------------------------------------------------------------------------------- */

/* Opens the namespace once (so a refusal stops the run before any process starts) and reads
 * what the prediction needs. 0 or 1 (reported). */
static int replay_prepare(const struct replay_opts *o, uint32_t *ns_id, struct replay_stats *st,
                          char *policy, size_t policy_len, unsigned *admit_hits, char *page_size,
                          size_t page_size_len)
{
    struct kvc_layout lay;
    kvc_client *c = NULL;
    kvc_ns *ns;
    char buf[64];
    int rc = kvc_connect(o->socket, &c);
    if (rc) {
        fprintf(stderr, "kvcreplay: cannot reach kvcd at %s: %s\n",
                o->socket ? o->socket : kvc_default_socket(), kvc_strerror(rc));
        goto out;
    }
    rc = replay_layout(o->model, o->block_bytes, &lay);
    if (rc == 0)
        rc = replay_ns_open(o, c, &lay, &ns);
    if (rc) {
        fprintf(stderr, "kvcreplay: namespace %s (%" PRIu64 "-byte blocks): %s\n", o->model,
                o->block_bytes, kvc_strerror(rc));
        goto out;
    }
    if (kvc_ns_block_bytes(ns) != o->block_bytes) {
        fprintf(stderr, "kvcreplay: namespace %s has %zu-byte blocks, not %" PRIu64 "\n", o->model,
                kvc_ns_block_bytes(ns), o->block_bytes);
        rc = -EPROTO;
        goto out;
    }
    *ns_id = kvc_ns_id(ns);
    rc = replay_stats_read(c, *ns_id, st);
    if (rc) {
        fprintf(stderr, "kvcreplay: stats: %s\n", kvc_strerror(rc));
        goto out;
    }
    if (kvc_policy_get(c, *ns_id, policy, policy_len) != 0)
        snprintf(policy, policy_len, "default");
    policy[strcspn(policy, " \n")] = 0;
    *admit_hits = 0;
    if (kvc_config_get(c, "disk.admit_hits", buf, sizeof(buf)) == 0) {
        const char *eq = strchr(buf, '=');
        *admit_hits = (unsigned)strtoul(eq ? eq + 1 : buf, NULL, 10);
    }
    page_size[0] = 0;
    if (kvc_config_get(c, "host.page_size", buf, sizeof(buf)) == 0) {
        const char *eq = strchr(buf, '=');
        eq = eq ? eq + 1 : buf;
        eq += strspn(eq, " ");
        snprintf(page_size, page_size_len, "%.*s", (int)strcspn(eq, " \n"), eq);
    }
out:
    kvc_disconnect(c);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    struct replay_opts o;
    struct replay_result res = {.o = &o};
    struct replay_counts *cnt = MAP_FAILED;
    _Atomic uint64_t *next = NULL; /* the next request not yet taken (shared) */
    pid_t pids[REPLAY_MAX_PROCS];
    kvc_client *c = NULL;
    unsigned admit_hits = 0;
    uint32_t ns_id = 0;
    char ns_policy[32];
    double t0;
    int rc, nproc = 0;

    res.sc.sim_fd = -1;
    rc = replay_opts_parse(argc, argv, &o);
    if (rc)
        return rc;
    signal(SIGPIPE, SIG_IGN); /* a daemon that goes away is -EPIPE, not a dead replayer */
    rc = replay_scan_run(&o, &res.sc);
    if (rc)
        goto out;
    rc = replay_prepare(&o, &ns_id, &res.before, ns_policy, sizeof(ns_policy), &admit_hits,
                        res.sim.page_size, sizeof(res.sim.page_size));
    if (rc)
        goto out;
    snprintf(res.sim.policy, sizeof(res.sim.policy), "%s", o.sim_policy ? o.sim_policy : ns_policy);
    cnt = mmap(NULL, (size_t)o.procs * sizeof(*cnt), PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (cnt == MAP_FAILED) {
        fprintf(stderr, "kvcreplay: %s\n", strerror(errno));
        rc = 1;
        goto out;
    }
    memset(cnt, 0, (size_t)o.procs * sizeof(*cnt));
    next = mmap(NULL, sizeof(*next), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (next == MAP_FAILED) {
        fprintf(stderr, "kvcreplay: %s\n", strerror(errno));
        next = NULL;
        rc = 1;
        goto out;
    }
    atomic_init(next, 0);
    fflush(NULL);
    t0 = replay_now();
    for (; nproc < o.procs; nproc++) {
        pid_t parent = getpid();
        pids[nproc] = fork();
        if (pids[nproc] < 0) {
            fprintf(stderr, "kvcreplay: fork: %s\n", strerror(errno));
            res.failed_procs++;
            break;
        }
        if (pids[nproc] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* no replay outlives its parent */
            if (getppid() != parent)
                _exit(1);
            _exit(replay_worker_run(&o, nproc, &cnt[nproc], next));
        }
    }
    for (int i = 0; i < nproc; i++) {
        int st;
        while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR)
            ;
        if (!WIFEXITED(st) || !cnt[i].finished) {
            if (WIFSIGNALED(st))
                fprintf(stderr, "kvcreplay: process %d died of signal %d\n", i, WTERMSIG(st));
            res.failed_procs++;
        }
    }
    res.wall_s = replay_now() - t0;
    for (int i = 0; i < nproc; i++) {
        const struct replay_counts *p = &cnt[i];
        res.t.requests += p->requests;
        res.t.blocks += p->blocks;
        res.t.tokens += p->tokens;
        res.t.hits += p->hits;
        res.t.hits_ready += p->hits_ready;
        res.t.hits_lossy += p->hits_lossy;
        if (p->lossy_err_max > res.t.lossy_err_max)
            res.t.lossy_err_max = p->lossy_err_max;
        res.t.tokens_hit += p->tokens_hit;
        res.t.bytes_loaded += p->bytes_loaded;
        res.t.put_blocks += p->put_blocks;
        res.t.put_present += p->put_present;
        res.t.put_busy += p->put_busy;
        res.t.put_refused += p->put_refused;
        res.t.lookups_refused += p->lookups_refused;
        res.t.wrong_bytes += p->wrong_bytes;
        res.t.wrong_blocks += p->wrong_blocks;
        res.t.errors += p->errors;
        res.t.lookup_s += p->lookup_s;
        res.t.put_s += p->put_s;
    }
    rc = kvc_connect(o.socket, &c);
    if (rc == 0) {
        replay_stats_settle(c);
        rc = replay_stats_read(c, ns_id, &res.after);
    }
    if (rc) {
        fprintf(stderr, "kvcreplay: stats after the run: %s\n", kvc_strerror(rc));
        res.t.errors++;
        memset(&res.after, 0, sizeof(res.after));
    }
    kvc_disconnect(c);
    if (!o.no_sim) {
        res.sim.capacity = o.sim_capacity >= 0
                               ? o.sim_capacity
                               : floor((double)res.before.host_capacity / (double)o.block_bytes);
        res.sim.disk = o.sim_disk >= 0 ? o.sim_disk
                       : res.before.have_disk
                           ? floor((double)res.before.disk_capacity / (double)o.block_bytes)
                           : 0;
        replay_sim_run(&o, &res.sc, admit_hits, &res.sim);
    } else {
        snprintf(res.sim.why, sizeof(res.sim.why), "--no-sim");
    }
    rc = 0;
    if (o.json)
        rc = replay_report_json(&o, &res) ? 1 : 0;
    else
        replay_report_text(&o, &res);
    fflush(stdout);
    rc |= res.t.wrong_bytes || res.t.errors || res.failed_procs ? 1 : 0;
out:
    if (cnt != MAP_FAILED)
        munmap(cnt, (size_t)o.procs * sizeof(*cnt));
    if (next)
        munmap((void *)next, sizeof(*next));
    if (res.sc.sim_fd >= 0)
        close(res.sc.sim_fd);
    return rc;
}
