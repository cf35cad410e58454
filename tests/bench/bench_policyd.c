/*
 * bench_policyd — cost of one eviction in the store under each policy: a store full of
 * 4 KiB blocks in chains of 8 (with hits and hints on some), then store_victim + store_evict
 * until half are gone. LRU (the 16 coldest leaves) is the baseline; the other policies add
 * 16 random probes and a ranking with their key. Prints a table and writes JSON (argv[1]).
 * A store that could not be built or evicted nothing fails the run. KVC_BENCH_SMOKE=1: the
 * small store only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/engine.h"
#include "daemon/store.h"
#include "tests/lib/bench.h"
#include "tiers/host.h"

#define PB_CHAIN 8

static double pb_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ns per eviction under policy k, with nblocks blocks cached. */
static double pb_run(enum policy_kind k, uint32_t nblocks)
{
    struct store_params p = {.host_size = (uint64_t)nblocks * 4096 + (8u << 20),
                             .host_page_size = 64 << 10,
                             .host_huge = TIER_HOST_HUGE_OFF,
                             .high_watermark = 1.0,
                             .low_watermark = 1.0,
                             .max_namespaces = 4,
                             .max_handles = 1u << 20,
                             .policy = k};
    struct kvc_wire_layout l;
    struct store_owner o;
    uint32_t ns;
    bool created;
    int err;
    struct store *s = store_new(&p, &err);
    if (s)
        engine_attach(s);
    if (!s)
        return -1;
    memset(&l, 0, sizeof(l));
    snprintf(l.model_id, sizeof(l.model_id), "bench");
    l.layers = 1;
    l.kv_heads = 1;
    l.head_dim = 64;
    l.block_tokens = 16; /* 1 * 2 * 16 * 64 * 2 = 4 KiB */
    l.dtype = KVC_WIRE_DTYPE_FP16;
    l.kv_kind = KVC_WIRE_KV_KIND_KV;
    store_ns_open(s, &l, &ns, &created);
    store_owner_init(&o);
    unsigned seed = 1;
    for (uint32_t c = 0; c < nblocks / PB_CHAIN; c++) {
        struct kvc_wire_key parent = {0}, keys[PB_CHAIN];
        struct kvc_wire_loc locs[PB_CHAIN];
        struct kvc_wire_hint h[PB_CHAIN];
        uint8_t st[PB_CHAIN];
        uint64_t resv, lease;
        uint32_t dropped;
        for (uint32_t i = 0; i < PB_CHAIN; i++) {
            keys[i] = (struct kvc_wire_key){.lo = (uint64_t)c * PB_CHAIN + i + 1, .hi = 3};
            h[i] = (struct kvc_wire_hint){.key = keys[i], .score = (float)(rand_r(&seed) % 64)};
        }
        store_reserve(s, &o, ns, &parent, keys, PB_CHAIN, c, &resv, st, locs);
        store_commit(s, &o, resv, UINT32_MAX, c, &dropped);
        if (rand_r(&seed) % 4 == 0 &&
            engine_lookup(s, &o, ns, keys, PB_CHAIN, c + 1, &lease, locs) > 0)
            store_release(s, &o, lease);
        if (rand_r(&seed) % 4 == 0)
            store_hint(s, ns, KVC_HINT_H2O, h, PB_CHAIN, c + 1);
    }
    uint32_t n = 0, goal = nblocks / 2;
    double t0 = pb_now();
    while (n < goal) {
        uint32_t v = engine_victim(s, 0, -1, nblocks);
        if (v == INDEX_NONE)
            break;
        engine_evict(s, v);
        n++;
    }
    double dt = pb_now() - t0;
    store_owner_fini(s, &o);
    if (s)
        engine_stop(s);
    store_free(s);
    return n ? dt * 1e9 / n : -1;
}

int main(int argc, char **argv)
{
    const char *json = argc > 1 ? argv[1] : "build/bench/policyd.json";
    static const uint32_t sizes[] = {16384, 131072};
    const size_t nsizes = bench_smoke() ? 1 : sizeof(sizes) / sizeof(sizes[0]);
    static char bases[2][32]; /* the rows point at their baseline's name */
    static struct bench_row rows[2 * POLICY_KIND_COUNT];
    size_t nrows = 0;
    printf("%-10s %8s %14s %10s\n", "policy", "blocks", "ns/eviction", "vs lru");
    for (size_t z = 0; z < nsizes; z++) {
        double lru = pb_run(POLICY_LRU, sizes[z]);
        snprintf(bases[z], sizeof(bases[z]), "lru@%u", sizes[z]);
        for (int k = 0; k < POLICY_KIND_COUNT; k++) {
            double v = k == POLICY_LRU ? lru : pb_run((enum policy_kind)k, sizes[z]);
            printf("%-10s %8u %14.0f %10.2f\n", policy_name((enum policy_kind)k), sizes[z], v,
                   v / lru);
            char name[32];
            snprintf(name, sizeof(name), "%s@%u", policy_name((enum policy_kind)k), sizes[z]);
            bench_row_add(rows, sizeof(rows) / sizeof(rows[0]), &nrows, name, v,
                          "ns/eviction", bases[z], lru);
        }
    }
    int rc = bench_finish(json, rows, nrows); /* a failed run (-1 ns) is refused there */
    printf("\nwrote %s\n", json);
    return rc;
}
