/*
 * key.c — chained block keys.
 *
 * DESIGN
 * key_i = XXH3-128(seed = namespace salt, parent key ‖ token ids of block i ‖ extra), with
 * the parent of block 0 the caller's parent or all-zero. The namespace salt is XXH3-64 of
 * the model id and every layout field, so blocks of two layouts never share a key even if
 * a daemon mixed them up. Token ids are hashed as little-endian uint32, so keys are the same
 * on every machine, in every process and run (no per-process seed).
 */
#include <errno.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "client/kvc.h"
#include "client/libkvc_internal.h"

uint64_t kvc_layout_salt(const struct kvc_wire_layout *l)
{
    XXH3_state_t st;
    uint32_t f[6] = {l->layers, l->kv_heads, l->head_dim, l->block_tokens, l->dtype, l->kv_kind};
    for (int i = 0; i < 6; i++)
        f[i] = htole32(f[i]);
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, "kvcd-ns-v1", 10);
    XXH3_64bits_update(&st, l->model_id, strnlen(l->model_id, sizeof(l->model_id)));
    XXH3_64bits_update(&st, f, sizeof(f));
    return XXH3_64bits_digest(&st);
}

void kvc_key_chain(uint64_t salt, const struct kvc_key *parent, const uint32_t *tokens,
                   size_t ntokens, uint32_t block_tokens, const void *extra, size_t extra_len,
                   struct kvc_key *keys, size_t nkeys)
{
    struct kvc_key prev = parent ? *parent : (struct kvc_key){0, 0};
    uint32_t buf[256];
    XXH3_state_t st;
    /* A state on the stack must start with seed 0: reset_withSeed skips deriving the secret
     * when the (uninitialised) seed field happens to equal the salt, and the keys then
     * depend on whatever the stack held (test_key_chain_dirty_stack). */
    XXH3_INITSTATE(&st);
    (void)ntokens;
    for (size_t i = 0; i < nkeys; i++) {
        const uint32_t *t = tokens + i * block_tokens;
        uint64_t p[2] = {htole64(prev.lo), htole64(prev.hi)};
        XXH128_hash_t h;
        XXH3_128bits_reset_withSeed(&st, salt);
        XXH3_128bits_update(&st, p, sizeof(p));
        for (uint32_t off = 0; off < block_tokens; off += 256) {
            uint32_t m = block_tokens - off < 256 ? block_tokens - off : 256;
            for (uint32_t j = 0; j < m; j++)
                buf[j] = htole32(t[off + j]);
            XXH3_128bits_update(&st, buf, m * sizeof(uint32_t));
        }
        if (extra && extra_len)
            XXH3_128bits_update(&st, extra, extra_len);
        h = XXH3_128bits_digest(&st);
        /* All-zero means "no parent": never hand it out as a key. */
        if ((h.low64 | h.high64) == 0)
            h.low64 = 1;
        keys[i].lo = h.low64;
        keys[i].hi = h.high64;
        prev = keys[i];
    }
}

KVC_API int kvc_keys_from_tokens(const kvc_ns *ns, const struct kvc_key *parent,
                                 const uint32_t *tokens, size_t ntokens, const void *extra,
                                 size_t extra_len, struct kvc_key *keys, size_t max_keys)
{
    size_t n;
    if (!ns || (!tokens && ntokens) || (!keys && max_keys) || (!extra && extra_len))
        return -EINVAL;
    n = ntokens / ns->block_tokens;
    if (n > max_keys)
        n = max_keys;
    if (n > INT32_MAX)
        return -EINVAL;
    kvc_key_chain(ns->salt, parent, tokens, ntokens, ns->block_tokens, extra, extra_len, keys,
                  n);
    return (int)n;
}
