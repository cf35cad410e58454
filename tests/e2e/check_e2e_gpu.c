/*
 * check_e2e_gpu.c — libkvc's GPU section against the real daemon.
 *
 * Everywhere: two processes share a prefix through paged engine layouts on the host
 * (vLLM-style pages with a shuffled block table in, a contiguous tensor out, every byte
 * compared); kvc_gpu_attach() against a daemon without a GPU tier says "host copies" and
 * registers the arenas once (fake device table), and gives them back at disconnect; a daemon
 * configured with a pool but no device logs one line, reports gpu_capacity 0 and serves
 * from the host arena as before.
 * With a CUDA device (make check-gpu on a GPU host): one process puts from device tensors
 * into the pool, another loads into its own device tensors through the pool, every byte
 * compared; host-tier hits land in device tensors the same way; a client killed while it
 * holds pool pins leaks nothing.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/kvc.h"
#include "kernels/kern.h"
#include "kernels/kern_dev.h"
#include "tests/lib/daemon.h"
#include "tests/lib/fake_dev.h"

void kvci_gpu_ops_set(const struct kern_dev_ops *ops); /* libkvc's test hook */

#define GE_LAYERS 2
#define GE_HEADS 2
#define GE_DIM 64
#define GE_BT 32          /* tokens per kvcd block */
#define GE_BLOCKS 6       /* the shared prefix */
#define GE_TOKENS (GE_BT * GE_BLOCKS)
#define GE_ROW (GE_DIM * 2) /* fp16 */

/* The value of element (layer, kind, token, head, dim): what any correct copy yields. */
static uint16_t ge_val(uint32_t l, uint32_t k, uint32_t t, uint32_t h, uint32_t d)
{
    return (uint16_t)(l * 40503u ^ k * 9176u ^ t * 2654435761u ^ h * 97u ^ d * 7919u);
}

/* One engine's KV on the host: per-layer K and V in pages of page_tokens, with a table. */
struct ge_engine {
    uint32_t page_tokens, npages;
    void *k[GE_LAYERS], *v[GE_LAYERS];
    int32_t table[GE_TOKENS];
    uint64_t bytes;
    struct kvc_paged_kv kv;
};

static void ge_engine_init(struct ge_engine *e, uint32_t page_tokens, int shuffle, int fill)
{
    memset(e, 0, sizeof(*e));
    e->page_tokens = page_tokens;
    e->npages = GE_TOKENS / page_tokens;
    e->bytes = (uint64_t)GE_TOKENS * GE_HEADS * GE_ROW;
    for (uint32_t i = 0; i < e->npages; i++)
        e->table[i] = (int32_t)(shuffle ? (i * 7 + 3) % e->npages : i);
    for (uint32_t l = 0; l < GE_LAYERS; l++) {
        e->k[l] = calloc(1, e->bytes);
        e->v[l] = calloc(1, e->bytes);
        for (uint32_t t = 0; fill && t < GE_TOKENS; t++)
            for (uint32_t h = 0; h < GE_HEADS; h++)
                for (uint32_t d = 0; d < GE_DIM; d++) {
                    uint64_t at = (((uint64_t)e->table[t / page_tokens] * page_tokens +
                                    t % page_tokens) * GE_HEADS + h) * GE_DIM + d;
                    ((uint16_t *)e->k[l])[at] = ge_val(l, 0, t, h, d);
                    ((uint16_t *)e->v[l])[at] = ge_val(l, 1, t, h, d);
                }
    }
    e->kv = (struct kvc_paged_kv){.k = e->k,
                                  .v = e->v,
                                  .block_table = e->table,
                                  .table_len = e->npages,
                                  .page_tokens = page_tokens,
                                  .page_stride = (uint64_t)page_tokens * GE_HEADS * GE_ROW,
                                  .token_stride = GE_HEADS * GE_ROW,
                                  .head_stride = GE_ROW};
}

static void ge_engine_fini(struct ge_engine *e)
{
    for (uint32_t l = 0; l < GE_LAYERS; l++) {
        free(e->k[l]);
        free(e->v[l]);
    }
}

/* 0 if tokens [0, ntok) of e hold the expected values. */
static int ge_engine_check(const struct ge_engine *e, uint32_t ntok)
{
    for (uint32_t l = 0; l < GE_LAYERS; l++)
        for (uint32_t t = 0; t < ntok; t++)
            for (uint32_t h = 0; h < GE_HEADS; h++)
                for (uint32_t d = 0; d < GE_DIM; d++) {
                    uint64_t at = (((uint64_t)e->table[t / e->page_tokens] * e->page_tokens +
                                    t % e->page_tokens) * GE_HEADS + h) * GE_DIM + d;
                    if (((uint16_t *)e->k[l])[at] != ge_val(l, 0, t, h, d) ||
                        ((uint16_t *)e->v[l])[at] != ge_val(l, 1, t, h, d))
                        return -1;
                }
    return 0;
}

static struct daemon ge_d;

static struct kvc_layout ge_layout(void)
{
    struct kvc_layout lay = {.model_id = "e2e-gpu",
                             .layers = GE_LAYERS,
                             .kv_heads = GE_HEADS,
                             .head_dim = GE_DIM,
                             .block_tokens = GE_BT,
                             .dtype = KVC_DTYPE_FP16,
                             .kv_kind = KVC_KV_KIND_KV};
    return lay;
}

static int ge_open(kvc_client **c, kvc_ns **ns, struct kvc_key *keys)
{
    static uint32_t tokens[GE_TOKENS];
    struct kvc_layout lay = ge_layout();
    for (uint32_t i = 0; i < GE_TOKENS; i++)
        tokens[i] = 1000 + i;
    if (kvc_connect(ge_d.sock, c) || kvc_ns_open(*c, &lay, ns))
        return -1;
    return kvc_keys_from_tokens(*ns, NULL, tokens, GE_TOKENS, NULL, 0, keys, GE_BLOCKS) ==
                   GE_BLOCKS
               ? 0
               : -1;
}

static void ge_setup(void)
{
    static const char *const args[] = {"-o", "host.size=32m", "-o", "host.page_size=64k", NULL};
    memset(&ge_d, 0, sizeof(ge_d));
    ck_assert_int_eq(daemon_start(&ge_d, args), 0);
}

static void ge_teardown(void)
{
    ck_assert_int_eq(daemon_stop(&ge_d), 0);
    daemon_cleanup(&ge_d);
}

/* Child: puts the prefix from a vLLM-style paged host engine (16-token pages, shuffled). */
static int ge_put_host(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    struct kvc_key keys[GE_BLOCKS];
    struct ge_engine e;
    (void)arg;
    if (ge_open(&c, &ns, keys))
        return 10;
    ge_engine_init(&e, 16, 1, 1);
    if (kvc_reserve(ns, NULL, keys, GE_BLOCKS, &r) != GE_BLOCKS)
        return 11;
    if (kvc_resv_gather(r, 0, GE_BLOCKS, &e.kv, 0, NULL, NULL) != GE_BLOCKS)
        return 12;
    if (kvc_commit(r, SIZE_MAX) != GE_BLOCKS)
        return 13;
    ge_engine_fini(&e);
    kvc_disconnect(c);
    return 0;
}

/* Child: loads the prefix into one contiguous host tensor per layer. */
static int ge_load_host(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS];
    struct ge_engine e;
    (void)arg;
    if (ge_open(&c, &ns, keys))
        return 20;
    ge_engine_init(&e, GE_TOKENS, 0, 0);
    if (kvc_lookup(ns, keys, GE_BLOCKS, 0, &l) != GE_BLOCKS)
        return 21;
    for (size_t i = 0; i < GE_BLOCKS; i++)
        if (kvc_lease_tier(l, i) != KVC_TIER_HOST)
            return 22;
    if (kvc_lease_scatter(l, 0, GE_BLOCKS, &e.kv, 0, NULL, NULL) != GE_BLOCKS)
        return 23;
    if (kvc_release(l))
        return 24;
    if (ge_engine_check(&e, GE_TOKENS))
        return 25;
    /* A missing lease is refused, not dereferenced. */
    if (kvc_lease_scatter(NULL, 0, 1, &e.kv, 0, NULL, NULL) != -EINVAL)
        return 26;
    ge_engine_fini(&e);
    kvc_disconnect(c);
    return 0;
}

START_TEST(test_paged_host_two_processes)
{
    pid_t a = daemon_child_spawn(ge_put_host, NULL);
    ck_assert_int_gt(a, 0);
    ck_assert_int_eq(daemon_child_wait(a, daemon_ms(20000), NULL), 0);
    pid_t b = daemon_child_spawn(ge_load_host, NULL);
    ck_assert_int_gt(b, 0);
    ck_assert_int_eq(daemon_child_wait(b, daemon_ms(20000), NULL), 0);
}
END_TEST

/* No GPU tier in the daemon: attach says "host copies" (0), pins each arena chunk once,
 * asks again with the same answer, and gives the registrations back at disconnect. */
START_TEST(test_attach_without_tier)
{
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key keys[GE_BLOCKS];
    ck_assert_int_eq(ge_open(&c, &ns, keys), 0);
    fake_dev_reset(1);
    kvci_gpu_ops_set(&fake_dev_ops);
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    ck_assert_int_eq(fake_dev.registered, 1); /* a 32 MiB arena: one chunk */
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    ck_assert_int_eq(fake_dev.registered, 1);
    /* Host copies work as before; async copies of host hits go through the device table,
     * and bring the block's own bytes. */
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *src = malloc(bb), *dst = malloc(bb);
    ck_assert(src && dst);
    daemon_block_fill(&keys[0], src, bb);
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, keys, 1, (const void *const[]){src}), 1);
    kvc_lease *l;
    ck_assert_int_eq(kvc_lookup(ns, keys, 1, KVC_LOOKUP_GPU, &l), 1);
    ck_assert_int_eq(kvc_lease_tier(l, 0), KVC_TIER_HOST);
    memset(dst, 0xee, bb);
    uint64_t copied = fake_dev.bytes;
    ck_assert_int_eq(kvc_lease_copy_async(l, 0, dst, bb, NULL), 0);
    ck_assert_int_eq(fake_dev.events_live, 1);
    ck_assert_int_eq(kvc_release(l), 0);
    ck_assert_int_eq(fake_dev.events_live, 0);
    ck_assert_uint_eq(fake_dev.bytes - copied, bb);
    ck_assert_int_eq(daemon_block_check(&keys[0], dst, bb), -1);
    free(src);
    free(dst);
    kvc_disconnect(c);
    ck_assert_int_eq(fake_dev.registered, 0);
    kvci_gpu_ops_set(NULL);
    /* This build's own table: a daemon without a GPU tier means host copies (0), with a
     * device here or without, and the same answer when asked again. */
    ck_assert_int_eq(ge_open(&c, &ns, keys), 0);
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    ck_assert_int_eq(kvc_gpu_attach(c), 0);
    kvc_disconnect(c);
}
END_TEST

static int ge_log_count(const char *needle)
{
    char buf[65536];
    FILE *f = fopen(ge_d.log, "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    int count = 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    for (const char *p = buf; (p = strstr(p, needle)); p++)
        count++;
    return count;
}

static uint64_t ge_stat(kvc_client *c, const char *name)
{
    struct kvc_stat *st;
    size_t n;
    uint64_t v = UINT64_MAX;
    ck_assert_int_eq(kvc_stats(c, 0, &st, &n), 0);
    for (size_t i = 0; i < n; i++)
        if (strcmp(st[i].name, name) == 0)
            v = st[i].value;
    free(st);
    return v;
}

/* A pool configured where there is no device: one log line, no GPU tier, the rest as ever.
 * Registered only where no device is found (main() says SKIP otherwise). */
START_TEST(test_configured_without_device)
{
    static const char *const args[] = {"-o", "host.size=32m", "-o", "gpu.pool_size=64m", NULL};
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key keys[GE_BLOCKS];
    ck_assert_int_eq(daemon_stop(&ge_d), 0);
    daemon_cleanup(&ge_d);
    memset(&ge_d, 0, sizeof(ge_d));
    ck_assert_int_eq(daemon_start(&ge_d, args), 0);
    ck_assert_int_eq(ge_log_count("gpu: tier disabled"), 1);
    ck_assert_int_eq(ge_open(&c, &ns, keys), 0);
    ck_assert_uint_eq(ge_stat(c, "gpu_capacity"), 0);
    ck_assert_uint_eq(ge_stat(c, "gpu_used"), 0);
    kvc_disconnect(c);
    char out[4096], err[4096];
    ck_assert_int_eq(daemon_kvcctl(&ge_d, out, sizeof(out), err, sizeof(err), "tiers", NULL), 0);
    ck_assert_msg(strstr(out, "gpu   disabled") && strstr(out, "host "), "%s", out);
    pid_t a = daemon_child_spawn(ge_put_host, NULL);
    ck_assert_int_eq(daemon_child_wait(a, daemon_ms(20000), NULL), 0);
    pid_t b = daemon_child_spawn(ge_load_host, NULL);
    ck_assert_int_eq(daemon_child_wait(b, daemon_ms(20000), NULL), 0);
}
END_TEST

/* ---- with a device ---------------------------------------------------------------------- */

/* Device copies of a host engine (same pages, same table). */
struct ge_dev_engine {
    void *k[GE_LAYERS], *v[GE_LAYERS];
    struct kvc_paged_kv kv;
};

static int ge_dev_from_host(struct ge_dev_engine *de, const struct ge_engine *e)
{
    for (uint32_t l = 0; l < GE_LAYERS; l++) {
        if (kern_cuda_alloc(&de->k[l], e->bytes) || kern_cuda_alloc(&de->v[l], e->bytes))
            return -1;
        if (kern_cuda_copy(de->k[l], e->k[l], e->bytes, KERN_CUDA_H2D, NULL) ||
            kern_cuda_copy(de->v[l], e->v[l], e->bytes, KERN_CUDA_H2D, NULL))
            return -1;
    }
    de->kv = e->kv;
    de->kv.k = de->k;
    de->kv.v = de->v;
    de->kv.on_device = 1;
    return 0;
}

static int ge_dev_to_host(const struct ge_dev_engine *de, struct ge_engine *e)
{
    for (uint32_t l = 0; l < GE_LAYERS; l++)
        if (kern_cuda_copy(e->k[l], de->k[l], e->bytes, KERN_CUDA_D2H, NULL) ||
            kern_cuda_copy(e->v[l], de->v[l], e->bytes, KERN_CUDA_D2H, NULL))
            return -1;
    return 0;
}

static void ge_dev_free(struct ge_dev_engine *de)
{
    for (uint32_t l = 0; l < GE_LAYERS; l++) {
        kern_cuda_free(de->k[l]);
        kern_cuda_free(de->v[l]);
    }
}

/* Child: puts from device tensors into the pool. */
static int ge_put_device(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_resv *r;
    struct kvc_key keys[GE_BLOCKS];
    struct ge_engine e;
    struct ge_dev_engine de;
    (void)arg;
    if (ge_open(&c, &ns, keys))
        return 30;
    if (kvc_gpu_attach(c) != 1)
        return 31;
    ge_engine_init(&e, 16, 1, 1);
    if (ge_dev_from_host(&de, &e))
        return 32;
    if (kvc_reserve_gpu(ns, NULL, keys, GE_BLOCKS, &r) != GE_BLOCKS)
        return 33;
    if (kvc_resv_gather(r, 0, GE_BLOCKS, &de.kv, 0, NULL, NULL) != GE_BLOCKS)
        return 34;
    if (kvc_commit(r, SIZE_MAX) != GE_BLOCKS)
        return 35;
    ge_dev_free(&de);
    ge_engine_fini(&e);
    kvc_disconnect(c);
    return 0;
}

/* Child: loads into its own device tensors (contiguous layout); arg != NULL: without the
 * pool flag (host-tier hits). */
static int ge_load_device(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS];
    struct ge_engine e;
    struct ge_dev_engine de;
    unsigned flags = arg ? 0 : KVC_LOOKUP_GPU;
    if (ge_open(&c, &ns, keys))
        return 40;
    if (kvc_gpu_attach(c) != 1)
        return 41;
    ge_engine_init(&e, GE_TOKENS, 0, 0);
    if (ge_dev_from_host(&de, &e))
        return 42;
    if (kvc_lookup(ns, keys, GE_BLOCKS, flags, &l) != GE_BLOCKS)
        return 43;
    for (size_t i = 0; i < GE_BLOCKS; i++)
        if (kvc_lease_tier(l, i) != (arg ? KVC_TIER_HOST : KVC_TIER_GPU))
            return 44;
    if (kvc_lease_scatter(l, 0, GE_BLOCKS, &de.kv, 0, NULL, NULL) != GE_BLOCKS)
        return 45;
    if (kvc_release(l))
        return 46;
    if (ge_dev_to_host(&de, &e) || ge_engine_check(&e, GE_TOKENS))
        return 47;
    ge_dev_free(&de);
    ge_engine_fini(&e);
    kvc_disconnect(c);
    return 0;
}

/* Child: pins pool blocks and dies without releasing them. */
static int ge_pin_and_die(void *arg)
{
    kvc_client *c;
    kvc_ns *ns;
    kvc_lease *l;
    struct kvc_key keys[GE_BLOCKS];
    (void)arg;
    if (ge_open(&c, &ns, keys) || kvc_gpu_attach(c) != 1)
        return 50;
    if (kvc_lookup(ns, keys, GE_BLOCKS, KVC_LOOKUP_GPU, &l) != GE_BLOCKS)
        return 51;
    _exit(0);
}

static void ge_gpu_setup(void)
{
    static const char *const args[] = {"-o", "host.size=32m", "-o", "host.page_size=64k",
                                       "-o", "gpu.pool_size=64m", NULL};
    memset(&ge_d, 0, sizeof(ge_d));
    ck_assert_int_eq(daemon_start(&ge_d, args), 0);
}

START_TEST(test_gpu_two_processes_through_pool)
{
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key keys[GE_BLOCKS];
    pid_t a = daemon_child_spawn(ge_put_device, NULL);
    ck_assert_int_eq(daemon_child_wait(a, daemon_ms(30000), NULL), 0);
    ck_assert_int_eq(ge_open(&c, &ns, keys), 0);
    ck_assert_uint_gt(ge_stat(c, "gpu_used"), 0);
    pid_t b = daemon_child_spawn(ge_load_device, NULL);
    ck_assert_int_eq(daemon_child_wait(b, daemon_ms(30000), NULL), 0);
    /* host-tier hits into device memory: a client without the pool flag demotes them */
    b = daemon_child_spawn(ge_load_device, (void *)1);
    ck_assert_int_eq(daemon_child_wait(b, daemon_ms(30000), NULL), 0);
    kvc_disconnect(c);
}
END_TEST

START_TEST(test_gpu_killed_with_pins)
{
    kvc_client *c;
    kvc_ns *ns;
    struct kvc_key keys[GE_BLOCKS];
    pid_t a = daemon_child_spawn(ge_put_device, NULL);
    ck_assert_int_eq(daemon_child_wait(a, daemon_ms(30000), NULL), 0);
    ck_assert_int_eq(ge_open(&c, &ns, keys), 0);
    uint64_t used = ge_stat(c, "gpu_used");
    pid_t b = daemon_child_spawn(ge_pin_and_die, NULL);
    ck_assert_int_eq(daemon_child_wait(b, daemon_ms(30000), NULL), 0);
    uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(10000);
    while (ge_stat(c, "pins_now") != 0 && daemon_now_ms() < end)
        usleep(10000);
    ck_assert_uint_eq(ge_stat(c, "pins_now"), 0);
    ck_assert_uint_eq(ge_stat(c, "gpu_used"), used);
    b = daemon_child_spawn(ge_load_device, NULL);
    ck_assert_int_eq(daemon_child_wait(b, daemon_ms(30000), NULL), 0);
    kvc_disconnect(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_gpu");
    TCase *tc = tcase_create("host");
    SRunner *sr;
    int failed;
    tcase_set_timeout(tc, daemon_slow() * 60);
    tcase_add_checked_fixture(tc, ge_setup, ge_teardown);
    tcase_add_test(tc, test_paged_host_two_processes);
    tcase_add_test(tc, test_attach_without_tier);
    /* Devices are counted in a child: neither main() nor a case that forks clients may
     * start CUDA, which does not survive fork(). */
    int devices = daemon_cuda_devices();
    if (devices == 0)
        tcase_add_test(tc, test_configured_without_device);
    else
        printf("SKIP: e2e_gpu: test_configured_without_device: %s\n",
               devices > 0 ? "a CUDA device is here (make check-gpu covers the pool)"
                           : "the CUDA probe died");
    suite_add_tcase(s, tc);
    if (devices > 0) {
        TCase *tg = tcase_create("gpu");
        tcase_set_timeout(tg, daemon_slow() * 120);
        tcase_add_checked_fixture(tg, ge_gpu_setup, ge_teardown);
        tcase_add_test(tg, test_gpu_two_processes_through_pool);
        tcase_add_test(tg, test_gpu_killed_with_pins);
        suite_add_tcase(s, tg);
    } else {
        const char *why = devices < 0 ? "the CUDA probe died" : "no CUDA device found";
        printf("SKIP: e2e_gpu: test_gpu_two_processes_through_pool: %s\n", why);
        printf("SKIP: e2e_gpu: test_gpu_killed_with_pins: %s\n", why);
    }
    fflush(stdout);
    if (daemon_suite_init("e2e-gpu"))
        return 1;
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    daemon_suite_fini();
    return failed ? 1 : 0;
}
