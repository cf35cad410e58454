/*
 * store_fixture.h — what the store-level suites (check_store, check_quant, check_ladder,
 * check_store_policy, check_store_gpu) share: a store with the tier engine attached, made
 * from parameters each suite starts from and changes where its cases need, and namespaces of
 * layout_fp16. Check assertions: for a case's own process (or its fixture).
 */
#ifndef KVC_TESTS_STORE_FIXTURE_H
#define KVC_TESTS_STORE_FIXTURE_H

#include <stdint.h>

#include "daemon/store.h"

struct quant;

/* A 4 MiB host arena of 64 KiB pages without huge pages, watermarks 0.9 and 0.5, 8
 * namespaces, 64 handles, LRU; the rest zero. */
struct store_params store_fixture_params(void);
/* store_new(p) with the engine attached; with q, a quantize worker too (quant_new, freed
 * with the store). Fails the case when either cannot start. */
struct store *store_fixture_new(const struct store_params *p, struct quant **q);
/* Releases what o holds (store_owner_fini; o may be NULL), then engine_stop() and
 * store_free(); a NULL store is a no-op. */
void store_fixture_free(struct store *s, struct store_owner *o);
/* Opens layout_fp16(model, layers, flags) in s (created or found): its id. */
uint32_t store_fixture_ns(struct store *s, const char *model, uint32_t layers, uint32_t flags);

#endif
