/*
 * kinds.h — what the end-to-end suites of the hybrid kinds share: opening a KV_WINDOW or
 * STATE namespace, putting blocks each as its own root (a window's block, a state), and
 * checking a lookup's span byte for byte (daemon_block_fill's bytes). Check assertions: for
 * a case's own process.
 */
#ifndef KVC_TESTS_KINDS_H
#define KVC_TESTS_KINDS_H

#include <stddef.h>
#include <stdint.h>

#include "client/kvc.h"

/* Opens layout l as kind (a KV_WINDOW namespace with window tokens, others with none). */
kvc_ns *kinds_open(kvc_client *c, struct kvc_layout l, enum kvc_kv_kind kind, uint32_t window);
/* Puts keys[i] for every i in idx[0..m), each as its own root, its bytes a function of it. */
void kinds_put_roots(kvc_ns *ns, const struct kvc_key *keys, const int *idx, int m);
/* Looks keys[0..n) up: the hits must be keys[first..first + hits), byte for byte. */
void kinds_expect(kvc_ns *ns, const struct kvc_key *keys, uint32_t n, size_t first, int hits);

#endif
