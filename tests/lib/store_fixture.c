/*
 * store_fixture.c — see store_fixture.h.
 */
#include <check.h>
#include <stdbool.h>

#include "daemon/engine.h"
#include "daemon/quant.h"
#include "tests/lib/layout.h"
#include "tests/lib/store_fixture.h"
#include "tiers/host.h"

struct store_params store_fixture_params(void)
{
    return (struct store_params){.host_size = 4 << 20,
                                 .host_page_size = 64 << 10,
                                 .host_huge = TIER_HOST_HUGE_OFF,
                                 .high_watermark = 0.9,
                                 .low_watermark = 0.5,
                                 .max_namespaces = 8,
                                 .max_handles = 64,
                                 .policy = POLICY_LRU,
                                 .head_step = true};
}

struct store *store_fixture_new(const struct store_params *p, struct quant **q)
{
    int err = 0;
    struct store *s = store_new(p, &err);
    ck_assert_msg(s, "store_new: %d", err);
    engine_attach(s);
    if (q) {
        *q = quant_new(NULL, s, &err);
        ck_assert_msg(*q, "quant_new: %d", err);
    }
    return s;
}

void store_fixture_free(struct store *s, struct store_owner *o)
{
    if (!s)
        return;
    if (o)
        store_owner_fini(s, o);
    engine_stop(s);
    store_free(s);
}

uint32_t store_fixture_ns(struct store *s, const char *model, uint32_t layers, uint32_t flags)
{
    struct kvc_wire_layout l = layout_fp16(model, layers, flags);
    uint32_t id;
    bool created;
    ck_assert_int_eq(store_ns_open(s, &l, &id, &created), 0);
    return id;
}
