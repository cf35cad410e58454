/*
 * check_e2e_concurrent.c — several client processes share prefixes through a real kvcd.
 *
 * Four processes, each with its own connection, walk the same 16 prompts (4 families of 4
 * variants: 6 shared blocks, then 6 of their own) in different orders for several rounds:
 * look up, check every byte of every hit, put what is missing, look up again. The block
 * bytes are a function of the key, so every process can check every block whoever wrote
 * it. The arena holds everything, so a prompt's hit count never goes down, and at the end
 * the cache holds each distinct block exactly once. It runs twice: the loop thread on the
 * sockets, then server.io_threads = 2 (server_io.c).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/lib/daemon.h"

#define CON_PROCS 4
#define CON_ROUNDS 5
#define CON_FAMILIES 4
#define CON_VARIANTS 4
#define CON_SHARED 6
#define CON_BLOCKS 12
#define CON_PROMPTS (CON_FAMILIES * CON_VARIANTS)
#define CON_DISTINCT (CON_FAMILIES * CON_SHARED + CON_PROMPTS * (CON_BLOCKS - CON_SHARED))

static struct daemon con_d;

struct con_prompt {
    struct kvc_key keys[CON_BLOCKS];
    void *blocks[CON_BLOCKS];
    int best; /* most hits seen so far: never goes down while nothing is evicted */
};

struct con_client {
    kvc_client *c;
    kvc_ns *ns;
    size_t bb;
    struct con_prompt p[CON_PROMPTS];
    uint64_t verified; /* blocks whose bytes were checked */
};

static int con_client_open(struct con_client *x)
{
    struct kvc_layout lay = daemon_layout("e2e-concurrent", 16);
    int rc = kvc_connect(con_d.sock, &x->c);
    if (rc == 0)
        rc = kvc_ns_open(x->c, &lay, &x->ns);
    if (rc)
        return rc;
    x->bb = kvc_ns_block_bytes(x->ns);
    for (int i = 0; i < CON_PROMPTS; i++) {
        struct con_prompt *p = &x->p[i];
        rc = daemon_chain_keys(x->ns, (uint32_t)(i / CON_VARIANTS), (uint32_t)(i % CON_VARIANTS),
                               CON_SHARED, CON_BLOCKS, p->keys);
        if (rc)
            return rc;
        for (int b = 0; b < CON_BLOCKS; b++) {
            p->blocks[b] = malloc(x->bb);
            if (!p->blocks[b])
                return -1;
            daemon_block_fill(&p->keys[b], p->blocks[b], x->bb);
        }
    }
    return 0;
}

static void con_client_close(struct con_client *x)
{
    for (int i = 0; i < CON_PROMPTS; i++)
        for (int b = 0; b < CON_BLOCKS; b++)
            free(x->p[i].blocks[b]);
    kvc_disconnect(x->c);
}

/* Looks up prompt i, checks every hit; returns the hit count or -1 after a message. */
static int con_lookup_check(struct con_client *x, int i, const char *who)
{
    struct con_prompt *p = &x->p[i];
    kvc_lease *l;
    int h = kvc_lookup(x->ns, p->keys, CON_BLOCKS, 0, &l);
    if (h < 0) {
        fprintf(stderr, "%s: lookup of prompt %d: %s\n", who, i, kvc_strerror(h));
        return -1;
    }
    if ((size_t)h != kvc_lease_count(l)) {
        fprintf(stderr, "%s: lookup said %d hits, lease holds %zu\n", who, h, kvc_lease_count(l));
        kvc_release(l);
        return -1;
    }
    for (int b = 0; b < h; b++) {
        long bad = daemon_block_check(&p->keys[b], kvc_lease_data(l, (size_t)b), x->bb);
        if (bad >= 0) {
            fprintf(stderr, "%s: prompt %d block %d: wrong byte at %ld\n", who, i, b, bad);
            kvc_release(l);
            return -1;
        }
        x->verified++;
    }
    if (kvc_release(l)) {
        fprintf(stderr, "%s: release failed\n", who);
        return -1;
    }
    if (h < p->best) {
        fprintf(stderr, "%s: prompt %d had %d hits, now %d (nothing is evicted)\n", who, i,
                p->best, h);
        return -1;
    }
    p->best = h;
    return h;
}

/* Puts whatever of prompt i is missing; -1 after a message. */
static int con_put(struct con_client *x, int i, int h, const char *who)
{
    struct con_prompt *p = &x->p[i];
    int w;
    if (h == CON_BLOCKS)
        return 0;
    w = kvc_put_prefix(x->ns, h ? &p->keys[h - 1] : NULL, p->keys + h, (size_t)(CON_BLOCKS - h),
                       (const void *const *)(p->blocks + h));
    if (w < 0 || w > CON_BLOCKS - h) {
        fprintf(stderr, "%s: put of prompt %d: %d\n", who, i, w);
        return -1;
    }
    return 0;
}

static int con_child(void *arg)
{
    int id = (int)(intptr_t)arg;
    struct con_client x;
    char who[32];
    int rc = 1;
    memset(&x, 0, sizeof(x));
    snprintf(who, sizeof(who), "client %d", id);
    if (con_client_open(&x)) {
        fprintf(stderr, "%s: cannot connect\n", who);
        goto out;
    }
    for (int r = 0; r < CON_ROUNDS; r++)
        for (int k = 0; k < CON_PROMPTS; k++) {
            /* Each process and round walks the prompts in its own order. */
            int i = (k * 5 + id * 3 + r * 7) % CON_PROMPTS;
            int h = con_lookup_check(&x, i, who);
            if (h < 0 || con_put(&x, i, h, who) || con_lookup_check(&x, i, who) < 0)
                goto out;
        }
    /* Its own puts of the last round are there to read at least. */
    rc = x.verified > 0 ? 0 : 2;
out:
    con_client_close(&x);
    return rc;
}

START_TEST(test_concurrent_overlapping_prefixes)
{
    static const char *const args[] = {"-o", "host.size=32m",       "-o", "host.page_size=64k",
                                       "-o", "server.io_threads=0", NULL};
    static const char *const args_io[] = {"-o", "host.size=32m",
                                          "-o", "host.page_size=64k",
                                          "-o", "server.io_threads=2",
                                          "-o", "server.io_threads_min_active=1",
                                          NULL};
    pid_t pids[CON_PROCS];
    struct con_client x;
    uint64_t v;
    memset(&con_d, 0, sizeof(con_d));
    ck_assert_int_eq(daemon_start(&con_d, _i ? args_io : args), 0);
    for (int i = 0; i < CON_PROCS; i++) {
        pids[i] = daemon_child_spawn(con_child, (void *)(intptr_t)i);
        ck_assert_int_gt(pids[i], 0);
    }
    for (int i = 0; i < CON_PROCS; i++)
        ck_assert_msg(daemon_child_wait(pids[i], daemon_ms(90000), NULL) == 0, "client %d failed", i);

    /* Finish what every process left busy to another, then read everything back. */
    memset(&x, 0, sizeof(x));
    ck_assert_int_eq(con_client_open(&x), 0);
    for (int i = 0; i < CON_PROMPTS; i++) {
        int h = con_lookup_check(&x, i, "final");
        ck_assert_int_ge(h, 0);
        ck_assert_int_eq(con_put(&x, i, h, "final"), 0);
        ck_assert_int_eq(con_lookup_check(&x, i, "final"), CON_BLOCKS);
    }
    ck_assert_int_eq(daemon_client_stat(x.c, 0, "blocks_now", &v), 0);
    ck_assert_uint_eq(v, CON_DISTINCT); /* every shared block stored once */
    ck_assert_int_eq(daemon_client_stat(x.c, 0, "evicted_blocks", &v), 0);
    ck_assert_uint_eq(v, 0);
    ck_assert_int_eq(daemon_client_stat(x.c, 0, "pins_now", &v), 0);
    ck_assert_uint_eq(v, 0);
    ck_assert_int_eq(daemon_client_stat(x.c, 0, "reserved_now", &v), 0);
    ck_assert_uint_eq(v, 0);
    /* Dedup, deterministically: a writer of a fully cached chain gets no slot and every key
     * counts as already present. (Whether the racing clients above deduplicated depends on
     * timing, so it is not asserted.) */
    uint64_t dedup_before;
    kvc_resv *r;
    ck_assert_int_eq(daemon_client_stat(x.c, 0, "dedup_blocks", &dedup_before), 0);
    ck_assert_int_eq(kvc_reserve(x.ns, NULL, x.p[0].keys, CON_BLOCKS, &r), 0);
    for (int b = 0; b < CON_BLOCKS; b++)
        ck_assert_int_eq(kvc_resv_status(r, (size_t)b), KVC_SLOT_PRESENT);
    ck_assert_int_eq(kvc_abort(r), 0);
    ck_assert_int_eq(daemon_client_stat(x.c, 0, "dedup_blocks", &v), 0);
    ck_assert_uint_eq(v, dedup_before + CON_BLOCKS);
    con_client_close(&x);
    ck_assert_int_eq(daemon_stop(&con_d), 0);
    daemon_cleanup(&con_d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_concurrent");
    TCase *tc = tcase_create("concurrent");
    tcase_set_timeout(tc, daemon_slow() * 120);
    tcase_add_loop_test(tc, test_concurrent_overlapping_prefixes, 0, 2);
    suite_add_tcase(s, tc);
    if (daemon_suite_init("e2e-concurrent"))
        return 1;
    return daemon_suite_run(s);
}
