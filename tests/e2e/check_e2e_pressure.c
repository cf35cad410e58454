/*
 * check_e2e_pressure.c — a 32 MiB arena under a working set several times its size.
 *
 * 48 chains of 40 blocks of 64 KiB (pairs of chains share 8 blocks): about 3.4 times the
 * arena. Evictions must happen, every hit must still be byte-exact, and the cache must
 * stay a prefix tree: a lookup's hit count is exactly the PRESENT run a RESERVE of the same
 * chain reports, and every cached block's parent is cached (BLOCK_LIST).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/lib/daemon.h"

#define PR_CHAINS 48
#define PR_BLOCKS 40
#define PR_SHARED 8
#define PR_PROCS 3

static const char *const pr_args[] = {"-o", "host.size=32m", "-o", "host.page_size=64k", NULL};

struct pr_client {
    kvc_client *c;
    kvc_ns *ns;
    size_t bb;
    struct kvc_key keys[PR_CHAINS][PR_BLOCKS];
    void *buf;
};

static int pr_open(const struct daemon *d, struct pr_client *x)
{
    struct kvc_layout lay = daemon_layout("e2e-pressure", 64);
    int rc = kvc_connect(d->sock, &x->c);
    if (rc == 0)
        rc = kvc_ns_open(x->c, &lay, &x->ns);
    if (rc)
        return rc;
    x->bb = kvc_ns_block_bytes(x->ns);
    x->buf = malloc(x->bb);
    if (!x->buf)
        return -1;
    for (int i = 0; i < PR_CHAINS && rc == 0; i++)
        rc = daemon_chain_keys(x->ns, (uint32_t)i / 2, (uint32_t)i % 2, PR_SHARED, PR_BLOCKS,
                               x->keys[i]);
    return rc;
}

static void pr_close(struct pr_client *x)
{
    free(x->buf);
    kvc_disconnect(x->c);
}

/* Looks chain i up and checks every hit's bytes: hits, or -1. */
static int pr_lookup(struct pr_client *x, int i)
{
    kvc_lease *l;
    int h = kvc_lookup(x->ns, x->keys[i], PR_BLOCKS, 0, &l);
    if (h < 0)
        return -1;
    for (int b = 0; b < h; b++) {
        long bad = daemon_block_check(&x->keys[i][b], kvc_lease_data(l, (size_t)b), x->bb);
        if (bad >= 0) {
            fprintf(stderr, "pressure: chain %d block %d: wrong byte at %ld\n", i, b, bad);
            kvc_release(l);
            return -1;
        }
    }
    kvc_release(l);
    return h;
}

/* Reserves chain i from the root. Writes and commits the slots when `commit`, else aborts;
 * *present gets the length of the PRESENT run from the first key. Committed count or -1. */
static int pr_reserve(struct pr_client *x, int i, bool commit, int *present)
{
    kvc_resv *r;
    int n = kvc_reserve(x->ns, NULL, x->keys[i], PR_BLOCKS, &r);
    if (n < 0)
        return -1;
    *present = 0;
    while (*present < PR_BLOCKS && kvc_resv_status(r, (size_t)*present) == KVC_SLOT_PRESENT)
        (*present)++;
    for (int b = *present; b < PR_BLOCKS; b++)
        if (kvc_resv_status(r, (size_t)b) == KVC_SLOT_PRESENT) {
            fprintf(stderr, "pressure: chain %d: block %d PRESENT after a missing one\n", i, b);
            kvc_abort(r);
            return -1;
        }
    if (!commit)
        return kvc_abort(r) == 0 ? 0 : -1;
    for (int b = 0; b < PR_BLOCKS; b++)
        if (kvc_resv_status(r, (size_t)b) == KVC_SLOT_RESERVED) {
            daemon_block_fill(&x->keys[i][b], x->buf, x->bb);
            if (kvc_resv_write(r, (size_t)b, x->buf, x->bb))
                return -1;
        }
    return kvc_commit(r, SIZE_MAX);
}

static int pr_key_cmp(const void *a, const void *b)
{
    const struct kvc_key *x = a, *y = b;
    if (x->hi != y->hi)
        return x->hi < y->hi ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static const struct kvc_block_info *pr_find(const struct kvc_block_info *v, size_t n,
                                            const struct kvc_key *k)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = pr_key_cmp(&v[mid].key, k);
        if (c == 0)
            return &v[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int pr_info_cmp(const void *a, const void *b)
{
    return pr_key_cmp(&((const struct kvc_block_info *)a)->key,
                      &((const struct kvc_block_info *)b)->key);
}

/* Every cached block's parent is cached, one level up, and counts it as a child. The list
 * comes in pages of 500 while the trims after the last commits may still run between them:
 * it is read again until no block came or went while it was read (blocks_now and evicted
 * the same before and after, and the list that long). */
static void pr_check_tree(kvc_client *c, uint32_t ns_id)
{
    struct kvc_block_info *all = NULL;
    size_t n = 0;
    uint64_t now = 0, now0 = 1, ev = 0, ev0 = 1;
    uint32_t *children;
    for (int tries = 0; now != now0 || ev != ev0 || n != now; tries++) {
        uint64_t cursor = 0;
        ck_assert_msg(tries < 200, "blocks kept coming and going: %zu listed, %llu cached", n,
                      (unsigned long long)now);
        if (tries)
            usleep(10000);
        ck_assert_int_eq(daemon_client_stat(c, ns_id, "blocks_now", &now0), 0);
        ck_assert_int_eq(daemon_client_stat(c, 0, "evicted_blocks", &ev0), 0);
        n = 0;
        do {
            struct kvc_block_info *b;
            size_t k;
            ck_assert_int_eq(kvc_block_list(c, ns_id, &cursor, 500, &b, &k), 0);
            all = realloc(all, (n + k + 1) * sizeof(*all));
            ck_assert_ptr_nonnull(all);
            memcpy(all + n, b, k * sizeof(*b));
            n += k;
            free(b);
        } while (cursor);
        ck_assert_int_eq(daemon_client_stat(c, ns_id, "blocks_now", &now), 0);
        ck_assert_int_eq(daemon_client_stat(c, 0, "evicted_blocks", &ev), 0);
    }
    qsort(all, n, sizeof(*all), pr_info_cmp);
    children = calloc(n + 1, sizeof(*children));
    ck_assert_ptr_nonnull(children);
    for (size_t i = 0; i < n; i++) {
        const struct kvc_block_info *p;
        if (all[i].parent.lo == 0 && all[i].parent.hi == 0) {
            ck_assert_uint_eq(all[i].depth, 0);
            continue;
        }
        p = pr_find(all, n, &all[i].parent);
        ck_assert_msg(p != NULL, "block at depth %u is cached, its parent is not", all[i].depth);
        ck_assert_uint_eq(all[i].depth, p->depth + 1);
        children[p - all]++;
    }
    for (size_t i = 0; i < n; i++)
        ck_assert_uint_eq(all[i].children, children[i]);
    free(children);
    free(all);
}

START_TEST(test_pressure_single_client)
{
    struct daemon d = {0};
    struct pr_client x = {0};
    uint64_t ev = 0, v;
    char out[65536];
    ck_assert_int_eq(daemon_start(&d, pr_args), 0);
    ck_assert_int_eq(pr_open(&d, &x), 0);
    /* First halves of every chain, then the second halves hung from them with no lookup in
     * between: the parents end up older than their children, at the cold end of the LRU
     * list, where only the tree rule keeps them from eviction. */
    for (int half = 0; half < 2; half++) {
        for (int i = 0; i < PR_CHAINS; i++) {
            const struct kvc_key *k = &x.keys[i][half * PR_BLOCKS / 2];
            kvc_resv *r;
            int n = kvc_reserve(x.ns, half ? k - 1 : NULL, k, PR_BLOCKS / 2, &r);
            ck_assert_int_ge(n, 0);
            for (int b = 0; b < PR_BLOCKS / 2; b++)
                if (kvc_resv_status(r, (size_t)b) == KVC_SLOT_RESERVED) {
                    daemon_block_fill(&k[b], x.buf, x.bb);
                    ck_assert_int_eq(kvc_resv_write(r, (size_t)b, x.buf, x.bb), 0);
                }
            ck_assert_int_eq(kvc_commit(r, SIZE_MAX), n);
        }
        pr_check_tree(x.c, kvc_ns_id(x.ns));
    }
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < PR_CHAINS; i++) {
            int h = pr_lookup(&x, i), present = -1;
            ck_assert_int_ge(h, 0);
            /* What a fresh put would need is exactly what the lookup did not find. */
            ck_assert_int_eq(pr_reserve(&x, i, false, &present), 0);
            ck_assert_int_eq(present, h);
            ck_assert_int_eq(pr_reserve(&x, i, true, &present), PR_BLOCKS - h);
            ck_assert_int_eq(present, h);
            ck_assert_int_eq(pr_lookup(&x, i), PR_BLOCKS);
            if (i % 8 == 7)
                pr_check_tree(x.c, kvc_ns_id(x.ns));
        }
    ck_assert_int_eq(daemon_client_stat(x.c, 0, "evicted_blocks", &ev), 0);
    ck_assert_uint_gt(ev, 0);
    ck_assert_int_eq(daemon_client_stat(x.c, 0, "host_used", &v), 0);
    ck_assert_int_eq(daemon_client_stat(x.c, 0, "host_capacity", &ev), 0);
    ck_assert_uint_le(v, ev);
    pr_close(&x);
    /* kvcctl shows the evictions too. */
    ck_assert_int_eq(daemon_kvcctl(&d, out, sizeof(out), NULL, 0, "stats", "--json", NULL), 0);
    ck_assert(daemon_json_valid(out));
    ck_assert_int_eq(daemon_json_u64(out, "evicted_blocks", &v), 0);
    ck_assert_uint_gt(v, 0);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

static struct daemon pr_d;

static int pr_child(void *arg)
{
    int id = (int)(intptr_t)arg;
    struct pr_client x = {0};
    int rc = 1;
    if (pr_open(&pr_d, &x))
        goto out;
    for (int k = 0; k < 2 * PR_CHAINS; k++) {
        int i = (k * 7 + id * 13) % PR_CHAINS;
        int h = pr_lookup(&x, i), present;
        if (h < 0 || pr_reserve(&x, i, true, &present) < 0 || pr_lookup(&x, i) < 0)
            goto out;
    }
    rc = 0;
out:
    pr_close(&x);
    return rc;
}

START_TEST(test_pressure_concurrent_clients)
{
    struct pr_client x = {0};
    pid_t pids[PR_PROCS];
    uint64_t v;
    memset(&pr_d, 0, sizeof(pr_d));
    ck_assert_int_eq(daemon_start(&pr_d, pr_args), 0);
    for (int i = 0; i < PR_PROCS; i++) {
        pids[i] = daemon_child_spawn(pr_child, (void *)(intptr_t)i);
        ck_assert_int_gt(pids[i], 0);
    }
    for (int i = 0; i < PR_PROCS; i++)
        ck_assert_msg(daemon_child_wait(pids[i], daemon_ms(120000), NULL) == 0, "client %d failed",
                      i);
    ck_assert_int_eq(pr_open(&pr_d, &x), 0);
    pr_check_tree(x.c, kvc_ns_id(x.ns));
    for (int i = 0; i < PR_CHAINS; i++)
        ck_assert_int_ge(pr_lookup(&x, i), 0);
    ck_assert_int_eq(daemon_client_stat(x.c, 0, "evicted_blocks", &v), 0);
    ck_assert_uint_gt(v, 0);
    ck_assert_int_eq(daemon_client_stat(x.c, 0, "pins_now", &v), 0);
    ck_assert_uint_eq(v, 0);
    ck_assert_int_eq(daemon_client_stat(x.c, 0, "reserved_now", &v), 0);
    ck_assert_uint_eq(v, 0);
    pr_close(&x);
    ck_assert_int_eq(daemon_stop(&pr_d), 0);
    daemon_cleanup(&pr_d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_pressure");
    TCase *tc = tcase_create("pressure");
    tcase_set_timeout(tc, daemon_slow() * 180);
    tcase_add_test(tc, test_pressure_single_client);
    tcase_add_test(tc, test_pressure_concurrent_clients);
    suite_add_tcase(s, tc);
    if (daemon_suite_init("e2e-pressure"))
        return 1;
    return daemon_suite_run(s);
}
