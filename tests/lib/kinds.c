/*
 * kinds.c — see kinds.h.
 */
#include <check.h>
#include <stdlib.h>

#include "tests/lib/daemon.h"
#include "tests/lib/kinds.h"

kvc_ns *kinds_open(kvc_client *c, struct kvc_layout l, enum kvc_kv_kind kind, uint32_t window)
{
    kvc_ns *ns = NULL;
    int rc;
    l.kv_kind = kind;
    rc = kind == KVC_KV_KIND_KV_WINDOW ? kvc_ns_open_window(c, &l, window, &ns)
                                       : kvc_ns_open(c, &l, &ns);
    ck_assert_msg(rc == 0, "open %s: %s", l.model_id, kvc_strerror(rc));
    return ns;
}

void kinds_put_roots(kvc_ns *ns, const struct kvc_key *keys, const int *idx, int m)
{
    size_t bb = kvc_ns_block_bytes(ns);
    uint8_t *buf = malloc(bb);
    ck_assert_ptr_nonnull(buf);
    for (int j = 0; j < m; j++) {
        const void *p = buf;
        daemon_block_fill(&keys[idx[j]], buf, bb);
        ck_assert_int_eq(kvc_put_prefix(ns, NULL, &keys[idx[j]], 1, &p), 1);
    }
    free(buf);
}

void kinds_expect(kvc_ns *ns, const struct kvc_key *keys, uint32_t n, size_t first, int hits)
{
    kvc_lease *l = NULL;
    int h = kvc_lookup(ns, keys, n, 0, &l);
    ck_assert_msg(h == hits, "prefix %u: %d hits, want %d", n, h, hits);
    if (!h)
        return;
    ck_assert_msg(kvc_lease_first(l) == first, "prefix %u: first %zu, want %zu", n,
                  kvc_lease_first(l), first);
    for (int i = 0; i < h; i++)
        ck_assert_msg(daemon_block_check(&keys[first + (size_t)i], kvc_lease_data(l, (size_t)i),
                                         kvc_ns_block_bytes(ns)) < 0,
                      "prefix %u hit %d: wrong bytes", n, i);
    ck_assert_int_eq(kvc_release(l), 0);
}
