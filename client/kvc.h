/*
 * kvc.h — libkvc, the client library of kvcd (stable C API, version 1).
 *
 * An inference process attaches to the kvcd daemon through a Unix socket, opens the
 * namespace of its model, and then shares KV blocks of common prompt prefixes with every
 * other process on the host. Block bytes never travel through the socket: the daemon
 * hands out its shared-memory arena once, and a hit is one memcpy out of it, a put one
 * memcpy into it.
 *
 * Typical use:
 *
 *     kvc_client *c;  kvc_ns *ns;  kvc_lease *l;
 *     kvc_connect(NULL, &c);                          // $KVCD_SOCKET or the default path
 *     kvc_ns_open(c, &layout, &ns);
 *     int n = kvc_keys_from_tokens(ns, NULL, tokens, ntok, NULL, 0, keys, maxkeys);
 *     int hit = kvc_lookup(ns, keys, n, 0, &l);       // longest cached prefix, pinned
 *     for (i = 0; i < hit; i++) kvc_lease_copy(l, i, dst[i], block_bytes);
 *     kvc_release(l);
 *     ... compute blocks hit..n-1, then kvc_put_prefix(ns, &keys[hit-1], keys+hit, ...) ...
 *     kvc_flush(c);                                   // before another process looks
 *
 * Errors: every function returning int returns 0 (or a count) on success and a negative
 * errno on failure; kvc_strerror() turns it into text. Common values:
 *   -ECONNREFUSED / -ENOENT  no daemon at the socket path
 *   -EPIPE / -ECONNRESET     the daemon went away (reconnect with a new kvc_client)
 *   -EPROTO                  protocol mismatch or malformed reply
 *   -EINVAL                  a bad argument (checked locally or by the daemon)
 *   -EEXIST                  kvc_ns_open: the model id exists with a different layout
 *   -EACCES                  not permitted for this user
 *   -ENOSPC                  the cache has no room that can be freed (everything pinned)
 *   -ENOMEM                  out of memory in this process
 *   -EDQUOT                  over a limit: pins, reservations, the user's share of an arena
 *                            or its namespaces (docs/security.md)
 *   -EMFILE                  too many leases and reservations (this client or its user)
 *   -EUSERS                  kvc_connect: kvcd holds as many connections as it allows
 *                            (in all, or of this user)
 *   -ETIMEDOUT               the daemon aborted a reservation older than its lifetime, or
 *                            closed this connection after its idle timeout (reconnect)
 *
 * Thread safety: a kvc_client and everything obtained from it (namespaces, leases,
 * reservations) may be used from several threads; calls on one client are serialised by
 * a mutex inside it. Use one client per thread for parallel round trips. Pointers into
 * the arena stay valid until the lease or reservation they came from is released, and
 * the mapping itself until kvc_disconnect().
 *
 * Keys: 128-bit chained hashes, XXH3-128 of (namespace salt, parent key, the block's token
 * ids, optional extra bytes). They are the same in every process, run and machine for the
 * same model id, layout and tokens. Engines with their own 128-bit block hashes may pass
 * those instead; equal keys must mean equal KV.
 */
#ifndef KVC_H
#define KVC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVC_API __attribute__((visibility("default")))

typedef struct kvc_client kvc_client; /* one connection to kvcd */
typedef struct kvc_ns kvc_ns;         /* an open namespace; owned by its client */
typedef struct kvc_lease kvc_lease;   /* pinned hits of one lookup */
typedef struct kvc_resv kvc_resv;     /* slots of one reservation */

/* A block key: 128 bits. All-zero is "no parent" (the root of a prefix). */
struct kvc_key {
    uint64_t lo, hi;
};

enum kvc_dtype {
    KVC_DTYPE_FP16 = 1,
    KVC_DTYPE_BF16 = 2,
    KVC_DTYPE_FP32 = 3,
    KVC_DTYPE_FP8_E4M3 = 4,
    KVC_DTYPE_INT8 = 5,
};

/* The kind of a namespace's layers. A hybrid model keeps one namespace per kind of layer
 * (as vLLM's KV cache groups and SGLang's host pools do), under the same keys; a lookup of
 * each answers for the same prefix (docs/engines.md, "Hybrid models"). */
enum kvc_kv_kind {
    KVC_KV_KIND_KV = 1,        /* keys and values, [layer][k/v][token][head][dim] */
    KVC_KV_KIND_K_ONLY = 2,    /* one latent per token (MLA), [layer][token][head][dim] */
    KVC_KV_KIND_KV_WINDOW = 3, /* sliding-window attention layers, laid out as KV: a prefix
                                  needs only its last window's blocks (kvc_ns_open_window) */
    KVC_KV_KIND_STATE = 4,     /* a fixed-size recurrent state per layer (Mamba, gated delta
                                  net, linear attention), [layer][head][dim] (kv_heads x
                                  head_dim elements a layer, any factoring), valid only at the
                                  end of the block whose key it is stored under */
};

/* One model's KV layout. Everything that changes the KV bytes belongs here or in the key. */
struct kvc_layout {
    const char *model_id; /* model and revision, at most 127 bytes */
    uint32_t layers;
    uint32_t kv_heads;
    uint32_t head_dim;
    uint32_t block_tokens; /* tokens per block */
    enum kvc_dtype dtype;
    enum kvc_kv_kind kv_kind;
};

/* Stored formats of a block (kvc_lease_stored) and the codecs a namespace may allow.
 * RAW is the namespace's layout and dtype; the others are encoded blocks of the kvcd
 * kernels (docs/kernels.md: header, per (layer, K/V) sections), named by their K codec. */
enum kvc_codec {
    KVC_CODEC_RAW = 0,
    KVC_CODEC_Q8_0 = 1,     /* ggml q8_0, 8.5 bits/value */
    KVC_CODEC_Q4_1 = 2,     /* ggml q4_1, 5 bits/value */
    KVC_CODEC_Q5_1 = 3,     /* ggml q5_1, 6 bits/value */
    KVC_CODEC_KIVI2 = 4,    /* KIVI 2-bit: keys per channel, values per token */
    KVC_CODEC_KIVI4 = 5,    /* KIVI 4-bit */
    KVC_CODEC_FP8 = 6,      /* E4M3 with a scale per (block, layer, K/V, head) */
    KVC_CODEC_ROT2 = 7,     /* keys rotated (randomized Hadamard per head) then KIVI 2-bit;
                            values KIVI 2-bit; head_dim a power of two, 8..256 */
    KVC_CODEC_ROT4 = 8,     /* the same at 4 bits */
    KVC_CODEC_MERGE = 9,    /* adjacent tokens within a cosine threshold stored once */
    KVC_CODEC_LOWRANK = 10, /* keys per head as rank-r factors, values q8_0;
                               min(block_tokens, head_dim) <= 64 */
};

/* What a namespace allows to be stored lossy (kvc_ns_open_quant). Default (kvc_ns_open):
 * nothing, every block stays raw. Under memory pressure the daemon may quantize a cold
 * block in place to k_codec for keys and v_codec for values (KVC_CODEC_RAW keeps that
 * kind raw), layers [0, raw_layers) kept raw. fp16 and bf16 namespaces only. */
struct kvc_quant {
    uint32_t allowed; /* bits 1u << KVC_CODEC_* (RAW excluded), up to KVC_CODEC_LOWRANK */
    enum kvc_codec k_codec;
    enum kvc_codec v_codec;
    uint32_t raw_layers;
};

/* Status of one key after kvc_reserve(). */
enum kvc_slot {
    KVC_SLOT_PRESENT = 1,  /* already cached: nothing to write */
    KVC_SLOT_RESERVED = 2, /* a slot is yours: write it, then commit */
    KVC_SLOT_BUSY = 3,     /* another client is writing this block now */
    KVC_SLOT_SKIPPED = 4,  /* not reserved: its parent is not cached (evicted) or still being
                              written by another client, or it follows a key that was busy or
                              found no room; try again once that one is committed */
    KVC_SLOT_NOSPACE = 5,  /* no room could be made (everything else pinned) */
};

/* One counter, as returned by kvc_stats(). */
struct kvc_stat {
    char name[40];
    uint64_t value;
};

/* One namespace, as returned by kvc_ns_list(). */
struct kvc_ns_info {
    uint32_t ns_id;
    uint32_t arena_id;
    char model_id[128];
    uint32_t layers, kv_heads, head_dim, block_tokens;
    enum kvc_dtype dtype;
    enum kvc_kv_kind kv_kind;
    uint64_t block_bytes;
    uint64_t blocks; /* committed blocks cached now */
    uint64_t bytes;  /* bytes they hold */
};

/* One block, as returned by kvc_block_list(). */
struct kvc_block_info {
    struct kvc_key key;
    struct kvc_key parent;
    uint64_t bytes;
    uint64_t last_access_ms; /* since the daemon started */
    uint32_t hits, pins, children, depth;
    uint8_t tier, format, state;
    uint8_t on_disk; /* a copy is on disk: the only one for tier 2, a clean one otherwise */
};

/* ---- connection --------------------------------------------------------------------- */

/* Connects to kvcd at `path`; NULL means $KVCD_SOCKET, else $XDG_RUNTIME_DIR/kvcd.sock, else
 * /run/kvcd/kvcd.sock. On success *out is owned by the caller until kvc_disconnect().
 * Errors: -ENOENT, -ECONNREFUSED, -EACCES, -EUSERS (kvcd holds as many connections as it
 * allows, of this user or in all), -EPROTO (version), -ENOMEM, -ENAMETOOLONG. */
KVC_API int kvc_connect(const char *path, kvc_client **out);

/* Closes the connection: every lease and reservation of this client is dropped by the
 * daemon, every namespace handle and arena mapping freed. NULL is a no-op. Commits that
 * kvc_put_prefix() sent without waiting land all the same (the daemon handles what the
 * connection sent before it ended); this waits for them (at most 2 s), so they are visible
 * to every client on return. Their errors are lost here: call kvc_flush() first to see them. */
KVC_API void kvc_disconnect(kvc_client *c);

/* The socket path kvc_connect(NULL, ...) would use. Static storage. */
KVC_API const char *kvc_default_socket(void);

/* Text for a negative errno returned by this library. Static storage. */
KVC_API const char *kvc_strerror(int err);

/* ---- namespaces --------------------------------------------------------------------- */

/* Opens (creating if new) the namespace of `layout->model_id` and maps its arena.
 * *out is owned by the client and freed with it. Errors: -EINVAL (layout), -EEXIST (model
 * id known with another layout), -EACCES, -ENOSPC (namespace table full), -EPIPE. */
KVC_API int kvc_ns_open(kvc_client *c, const struct kvc_layout *layout, kvc_ns **out);

/* kvc_ns_open() for a namespace that allows lossy storage (struct kvc_quant). The creator's
 * setting stays with the namespace: opening it later with another one fails with -EEXIST
 * (kvc_ns_open, which passes none, always matches). -EINVAL: codecs outside `allowed`, on a
 * dtype other than fp16/bf16, or a recipe that quantizes nothing. */
KVC_API int kvc_ns_open_quant(kvc_client *c, const struct kvc_layout *layout,
                              const struct kvc_quant *q, kvc_ns **out);

/* A KVC_KV_KIND_KV_WINDOW namespace (layout->kv_kind must say so): sliding-window layers
 * whose prefixes need only the blocks of their last window_tokens tokens (1..65535). A
 * lookup answers with the window of the longest prefix whose window is cached
 * (kvc_lease_first says where it starts); blocks before it may be gone. The window is part
 * of the layout: another window under the same model id is -EEXIST. Errors as kvc_ns_open;
 * -EINVAL for a window of 0 or over 65535 tokens. */
KVC_API int kvc_ns_open_window(kvc_client *c, const struct kvc_layout *layout,
                               uint32_t window_tokens, kvc_ns **out);

/* The kind of an open namespace (enum kvc_kv_kind), and the window of a KV_WINDOW one (0
 * for other kinds). */
KVC_API int kvc_ns_kind(const kvc_ns *ns);
KVC_API uint32_t kvc_ns_window_tokens(const kvc_ns *ns);

/* The window of namespace ns_id as kvc_ns_list would show it (0: not a KV_WINDOW one), for
 * tools that list namespaces they did not open. One round trip. Errors: -ENOENT, -EPIPE. */
KVC_API int kvc_ns_window(kvc_client *c, uint32_t ns_id, uint32_t *window_tokens);

/* Bytes of one block of this namespace (a STATE namespace: one state, layers x kv_heads x
 * head_dim elements). */
KVC_API size_t kvc_ns_block_bytes(const kvc_ns *ns);

/* Tokens per block of this namespace. */
KVC_API uint32_t kvc_ns_block_tokens(const kvc_ns *ns);

/* Chained keys for the full blocks of `tokens`: key i covers tokens
 * [i*block_tokens, (i+1)*block_tokens). `parent` NULL starts a prefix; pass the last key of
 * an earlier call to continue one. `extra` (adapter id, image hashes, tenant salt) is mixed
 * into every key. Writes at most `max_keys` keys and returns how many it wrote. The tail of
 * fewer than block_tokens tokens gets no key. Pure computation: no round trip. */
KVC_API int kvc_keys_from_tokens(const kvc_ns *ns, const struct kvc_key *parent,
                                 const uint32_t *tokens, size_t ntokens, const void *extra,
                                 size_t extra_len, struct kvc_key *keys, size_t max_keys);

/* ---- reading ------------------------------------------------------------------------ */

/* kvc_lookup flags. Blocks on disk are read back into memory by the daemon, and for a
 * client that did not ask for GPU hits, blocks in the GPU pool are copied into its host
 * arena; by default kvc_lookup waits for those reads and copies (and the daemon for room to
 * start them, up to disk.put_wait), so every hit it returns is readable. */
#define KVC_LOOKUP_READY_ONLY                                                                      \
    0x1u                       /* hits stop at the first block not in memory now (the
                                      reads of the blocks after it still start) */
#define KVC_LOOKUP_NOWAIT 0x2u /* return hits still being read: see kvc_lease_ready() */
/* With KVC_LOOKUP_READY_ONLY or KVC_LOOKUP_NOWAIT the daemon answers at once: it waits
 * neither for room to read into nor for the pool's copy slots, so the hits may be fewer. */

/* Finds the longest cached prefix of keys[0..n) and pins those blocks for this client.
 * Returns the number of hits (0..n). When it is above zero, *out is a lease that must be
 * released with kvc_release(); when zero, *out is NULL. Fewer hits than cached when the
 * client or its user is near its pin quota. Of a KV_WINDOW namespace the hits are the blocks
 * of the window of the longest prefix keys[0..e) whose window is cached, keys[e - w..e)
 * (w = window_tokens in blocks, fewer when e is shorter); of a STATE namespace the one state
 * of the longest prefix keys[0..e) that has one, keys[e-1]: kvc_lease_first() gives the
 * position of hit 0 in keys, so the prefix is first + hits long. Of those two kinds, keys
 * beyond KVC_LOOKUP_MAX_SPAN are searched from the end, one request per KVC_LOOKUP_MAX_SPAN
 * keys until a span is found (a window's requests overlap by the window), and a read from
 * the remote tier that fails is asked again (docs/remote.md); with KVC_LOOKUP_NOWAIT that is
 * the caller's: a window or a state whose hits are not all ready once kvc_lease_wait()
 * returns is no prefix's answer (release it and look up again). Errors: -EINVAL (a key
 * repeated in keys), -E2BIG (more than 8 x 2048 keys), -EPIPE,
 * -EDQUOT (no pin left under quota.client_pins / quota.uid_pins), -EMFILE (leases). */
KVC_API int kvc_lookup(kvc_ns *ns, const struct kvc_key *keys, size_t n, unsigned flags,
                       kvc_lease **out);

#define KVC_LOOKUP_MAX_SPAN 2048u

/* Position in the looked-up keys of hit 0 (0 but for KV_WINDOW and STATE namespaces). */
KVC_API size_t kvc_lease_first(const kvc_lease *l);

/* Hits of the lease, from the first, whose bytes are in memory now (kvc_lookup with
 * KVC_LOOKUP_NOWAIT may return hits still being read from disk; do not read those).
 * Errors: -EINVAL. */
KVC_API int kvc_lease_ready(const kvc_lease *l);

/* Waits up to timeout_ms (0: do not wait) for the hits being read from disk. Returns the
 * hits ready from the first. Once no read is left, hits after one that failed verification
 * are dropped from the lease (kvc_lease_count shrinks). Errors: -EINVAL, -EPIPE, -EPROTO. */
KVC_API int kvc_lease_wait(kvc_lease *l, unsigned timeout_ms);

/* Number of blocks in a lease. */
KVC_API size_t kvc_lease_count(const kvc_lease *l);

/* Read-only pointer to hit i inside the shared arena, valid until kvc_release(). NULL if i is
 * out of range. Its length is kvc_ns_block_bytes(). */
KVC_API const void *kvc_lease_data(const kvc_lease *l, size_t i);

/* Copies hit i into dst (len must be at least the block size) as raw data in the namespace's
 * layout and dtype: a quantized block is dequantized on the CPU. Errors: -EINVAL, -ERANGE,
 * -EBADMSG (a quantized block that does not decode), -ENOMEM. */
KVC_API int kvc_lease_copy(const kvc_lease *l, size_t i, void *dst, size_t len);

/* Hit i as stored: *data (inside the shared arena, valid until kvc_release) and *len (bytes
 * of the stored block: the block size when raw, else the encoded block's size). Returns its
 * format (enum kvc_codec) or -EINVAL, -ERANGE. kvc_lease_data() points at the same bytes. */
KVC_API int kvc_lease_stored(const kvc_lease *l, size_t i, const void **data, size_t *len);

/* GPU form of kvc_lease_copy: writes hit i as raw data (namespace layout and dtype) to device
 * memory dst_dev (len bytes, at least the block size), queued on `stream` (a cudaStream_t,
 * NULL: the legacy default stream). After kvc_gpu_attach() a raw hit is queued on the stream
 * (device to device for a pool hit, host to device for a host hit) and kvc_release() waits
 * for it; without it a raw host hit has landed when the call returns. A quantized block
 * crosses PCIe in its stored size and is dequantized on the device: after kvc_gpu_attach()
 * through a device scratch the client keeps (no allocation, free or wait per hit), queued
 * and tracked like a raw hit; without it a scratch is allocated and freed per call and the
 * stream synchronised before the call returns. -ENOTSUP: libkvc built without CUDA, or a
 * pool hit without kvc_gpu_attach(); -EBADMSG: a quantized block that is not of the
 * namespace's layout; -EIO: a CUDA error; -EINVAL, -ERANGE as above. */
KVC_API int kvc_lease_copy_cuda(const kvc_lease *l, size_t i, void *dst_dev, size_t len,
                                void *stream);

/* Waits for the device work queued on the lease (every call's, on every stream), then unpins
 * and frees it. The unpin is sent without waiting for the daemon (no round trip): the
 * connection's next call is handled after it, and kvc_flush() makes it seen by other
 * processes (e.g. before an admin drops the namespace). NULL is a no-op that returns 0.
 * -EIO: some of that work failed (the lease is released all the same); -EPIPE: the
 * connection is gone (so are its pins). */
KVC_API int kvc_release(kvc_lease *l);

/* ---- policies: hints and budgeted reads (docs/policies.md) ---------------------------- */

/* Hint kinds for kvc_hint. */
#define KVC_HINT_ATTENTION                                                                         \
    1u /* H2O: attention mass the block received (summed over its tokens,
                                 layers and heads); added to the block's mass, which decays */
#define KVC_HINT_SNAPKV                                                                            \
    2u /* SnapKV: the observation window's pooled score at prefill end;
                                 replaces the block's score */

/* Reports importance scores of n committed blocks of ns (keys[i] gets scores[i], finite and
 * >= 0), for the h2o, snapkv and default policies. Keys the daemon does not hold are
 * ignored. Returns the number of blocks that took a score. Errors: -EINVAL (kind, a score,
 * n above KVC_HINT_MAX), -EACCES, -EPIPE. */
#define KVC_HINT_MAX 2048u
KVC_API int kvc_hint(kvc_ns *ns, unsigned kind, const struct kvc_key *keys, const float *scores,
                     size_t n);

/* Per-head hints: scores[n][layers * heads] (layer-major; finite, >= 0, at most
 * KVC_HINT_SCORE_MAX: a head's attention mass over a block is bounded by its queries), one per (layer, kv
 * head) of each block, layers and heads the namespace's layers and kv_heads. A block takes
 * the sum of its scores as kvc_hint would; the daemon also learns the namespace's head
 * profiles (sink-only, local, full: docs/policies.md) and a block's head concentration.
 * Sent in as many requests as the protocol's message size needs. Returns the blocks that
 * took a score. Errors: -EINVAL (kind, a score, layers or heads 0 or not the namespace's,
 * layers * heads above KVC_HINT_HEADS_MAX, n above KVC_HINT_MAX), -EACCES, -EPIPE. */
#define KVC_HINT_HEADS_MAX 8192u
#define KVC_HINT_SCORE_MAX 1e9f
KVC_API int kvc_hint_heads(kvc_ns *ns, unsigned kind, const struct kvc_key *keys,
                           const float *scores, size_t n, unsigned layers, unsigned heads);

/* A budgeted read: what to select from the cached prefix. */
struct kvc_budget {
    size_t budget;      /* at most this many blocks (>= 1) */
    const char *policy; /* a policy name ("h2o", "quest", ...); NULL: the namespace's */
    unsigned sinks;     /* leading blocks always taken (attention sinks), typically 1 */
    unsigned recent;    /* trailing blocks of the prefix always taken, e.g. 2 */
    const float *query; /* Quest: a query vector of head_dim floats (NULL: none) */
    size_t query_dim;   /* its length: 0 or the namespace's head_dim */
};

/* Of the longest cached prefix of keys[0..n) that is in memory, selects at most b->budget
 * blocks: the sinks and the recent window first, the rest by the policy's importance (H2O
 * mass, SnapKV score, Quest bound of the query against the blocks' key summaries; blocks
 * without a summary count as unbounded), and pins them under one lease: hit i of the lease
 * is the block at position pos[i] of keys (ascending; pos holds min(b->budget, n) entries).
 * *nprefix (may be NULL) gets the cached prefix's length. Returns the number selected (0:
 * *out NULL). Errors: -EINVAL (budget 0, unknown policy, query_dim not head_dim, n above
 * KVC_PROTO's 2048 keys), -EACCES, -EMFILE, -EPIPE. */
KVC_API int kvc_lookup_budget(kvc_ns *ns, const struct kvc_key *keys, size_t n,
                              const struct kvc_budget *b, size_t *pos, size_t *nprefix,
                              kvc_lease **out);

/* Head categories the daemon learns from kvc_hint_heads (FastGen's; docs/policies.md). */
#define KVC_HEAD_UNKNOWN 0u /* no per-head hint yet: counted as full */
#define KVC_HEAD_SINK 1u    /* looks at the sink blocks */
#define KVC_HEAD_LOCAL 2u   /* at the sinks and the most recent blocks */
#define KVC_HEAD_FULL 3u    /* spreads its attention: a retrieval head */

/* kvc_lookup_budget with per-head budgets (Ada-KV-style, over the namespace's head profile):
 * b->budget is the blocks each (layer, kv head) keeps on average, budget x layers x kv_heads
 * head-blocks in all (the bytes of b->budget whole blocks). A sink-only head keeps the sinks
 * (b->sinks, at least 1: the selection always starts with them), a local head the sinks and
 * the last b->recent blocks, each charged that (at most b->budget); the full heads (and heads
 * not profiled yet) share the rest evenly, never less than b->budget each. The lease holds
 * what a full head keeps: more than b->budget blocks once some heads are sink-only or local;
 * without a profile exactly what kvc_lookup_budget selects with sinks >= 1. pos holds n
 * entries; heads (may be NULL) gets layers x kv_heads categories (KVC_HEAD_*, layer-major),
 * so that the engine knows which heads keep which of the blocks. Errors as
 * kvc_lookup_budget, and -EINVAL when layers x kv_heads is above KVC_HINT_HEADS_MAX. */
KVC_API int kvc_lookup_budget_heads(kvc_ns *ns, const struct kvc_key *keys, size_t n,
                                    const struct kvc_budget *b, size_t *pos, unsigned char *heads,
                                    size_t *nprefix, kvc_lease **out);

/* ---- writing ------------------------------------------------------------------------ */

/* Reserves slots for the keys of the chain parent → keys[0] → ... → keys[n-1] that are not
 * cached yet. The parent is a cached block, or a block this client has reserved and not
 * committed yet (a prompt's next chunk reserved while the last one's commit is on its way:
 * commit that reservation first, kvc_commit() answers -EAGAIN till then); under a parent
 * that is neither (not cached, or being written by another client) every key is
 * KVC_SLOT_SKIPPED. If the parent's reservation ends without committing the parent (abort,
 * a shorter commit, its timeout, a lost connection), the slots hanging from it are freed
 * with it, and committing this reservation then commits nothing (0). A key another client
 * is writing is KVC_SLOT_BUSY and every key after it KVC_SLOT_SKIPPED; when that client runs
 * as the same user, the daemon first waits for its commit or abort (then the key is PRESENT,
 * or reserved here, and the chain goes on), up to its disk.put_wait (2 s by default).
 * Returns the number of slots reserved; *out is always set (even at zero) and
 * tells the status of every key; finish it with kvc_commit() or kvc_abort() within the
 * daemon's server.reservation_timeout (60 s by default), after which it aborts the
 * reservation and its slots may be handed to others. Keys past what the quotas allow come
 * back NOSPACE. n may be 0 (every key already hit): 0 and an empty reservation, no round
 * trip. Errors: -EINVAL (a key repeated), -EACCES, -EPIPE, -EDQUOT (no room left under
 * the quotas or the user's share of the arena), -EMFILE. */
KVC_API int kvc_reserve(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                        size_t n, kvc_resv **out);

/* Status of key i of a reservation (enum kvc_slot), or -ERANGE. */
KVC_API int kvc_resv_status(const kvc_resv *r, size_t i);

/* Writable pointer to the slot of key i (status RESERVED), else NULL. Valid until commit or
 * abort. */
KVC_API void *kvc_resv_data(kvc_resv *r, size_t i);

/* Copies len bytes (the block size) into the slot of key i: blocks of 32 KiB and more with
 * non-temporal stores (they go to memory, not to this CPU's cache: the block is for other
 * processes to read; KVC_PUT_STREAM=0 in the environment makes it a memcpy), as
 * kvc_put_prefix does. Errors: -EINVAL, -ERANGE. */
KVC_API int kvc_resv_write(kvc_resv *r, size_t i, const void *src, size_t len);

/* Makes the first `n` reserved slots visible (SIZE_MAX: all) and frees the rest; frees r.
 * Returns the number of blocks committed. -ETIMEDOUT: the daemon had aborted the
 * reservation (older than server.reservation_timeout); nothing was committed. -EIO: device
 * work queued on the reservation (kvc_resv_write_async, kvc_resv_gather) failed; the
 * reservation is aborted and nothing was committed. -EBUSY: one of those n slots was written
 * layer by layer (kvc_resv_gather_layers) and not all its layers yet; nothing was done, r is
 * still yours (write the rest, or kvc_abort()). -EAGAIN: r hangs from a block of another
 * reservation of this client that is not committed yet (kvc_reserve()); nothing was done, r
 * is still yours (commit that one, then r again; or kvc_abort()). */
KVC_API int kvc_commit(kvc_resv *r, size_t n);

/* Frees every slot of r unseen, and r itself. NULL is a no-op. -ETIMEDOUT as kvc_commit. */
KVC_API int kvc_abort(kvc_resv *r);

/* ---- whole prefixes ----------------------------------------------------------------- */

/* Loads the longest cached prefix of keys into dst[0..hit) (each dst[i] block-sized).
 * Returns the number of blocks loaded. KV_WINDOW and STATE namespaces: the blocks of the
 * span kvc_lookup answers with go to dst[first..first+hits), and the prefix's length
 * first + hits is returned (0: none), through the socket. Hits in the host arena are copied through the
 * arena's shared index with no round trip (checked against reuse before and after each
 * copy); the rest of the prefix takes one lookup and one release. KVC_NO_FASTPATH=1 in the
 * environment (read at kvc_connect) sends everything through the socket. */
KVC_API int kvc_get_prefix(kvc_ns *ns, const struct kvc_key *keys, size_t n, void *const *dst);

/* Stores blocks[i] under keys[i] for every key not cached yet (chain as in kvc_reserve).
 * Returns the number of blocks written; keys busy in another client are left to it.
 *
 * It takes one round trip (a reservation of the whole prefix; one per 2048 keys), copies
 * the blocks as kvc_resv_write does, and sends the commit without waiting for its reply.
 * What that promises:
 *  - this client: every later call on it finds the blocks committed (the daemon handles a
 *    connection's requests in order), and a later put may hang from them (parent);
 *  - other clients and processes: the blocks are visible to them once the daemon has taken
 *    the commit, which is on its way but may not be done when this returns. kvc_flush()
 *    waits until it is: after kvc_flush() returned 0, every block this client's puts
 *    counted is visible to every client. Call it before telling another process to look.
 *  - errors: the commit's reply is read by the next call on this client that reads from
 *    the socket. A commit that failed (-ETIMEDOUT: the reservation outlived
 *    server.reservation_timeout; -EAGAIN: the parent was a block of a kvc_reserve() of this
 *    client not committed yet, and the daemon aborted the put's reservation;
 *    -EPIPE/-ECONNRESET: the connection ended before its reply) did not store the blocks it
 *    counted; its error is kept, never dropped, and returned by the next kvc_put_prefix()
 *    on this client (which then stores nothing, so the same call may be repeated) or
 *    kvc_flush(), whichever comes first. Other calls leave it kept.
 * Errors: -EINVAL, -EACCES, -EDQUOT, -EMFILE, -EPIPE, and a kept commit error as above. */
KVC_API int kvc_put_prefix(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                           size_t n, const void *const *blocks);

/* Waits for the replies of every commit kvc_put_prefix() sent without waiting (none in
 * flight: returns at once, with no system call). Returns 0 once every block those puts
 * counted is committed and visible to every client, or the first commit error kept since
 * the last report (which it clears; see kvc_put_prefix). Thread-safe like every call. */
KVC_API int kvc_flush(kvc_client *c);

/* ---- inspection --------------------------------------------------------------------- */

/* Counters: scope 0 the whole daemon, else a namespace id. *out is malloc'd (free() it). */
KVC_API int kvc_stats(kvc_client *c, uint32_t scope, struct kvc_stat **out, size_t *n);

/* Every namespace. *out is malloc'd (free() it). */
KVC_API int kvc_ns_list(kvc_client *c, struct kvc_ns_info **out, size_t *n);

/* Id of an open namespace. */
KVC_API uint32_t kvc_ns_id(const kvc_ns *ns);

/* Up to `max` blocks of namespace `ns_id` from *cursor (0 to start); sets *cursor to the next
 * position, 0 at the end. A page may hold fewer than `max` before the end (kvcd walks a
 * bounded share of its index per request, and this call asks again while a page holds none):
 * go on until *cursor is 0. *out is malloc'd (free() it). */
KVC_API int kvc_block_list(kvc_client *c, uint32_t ns_id, uint64_t *cursor, uint32_t max,
                           struct kvc_block_info **out, size_t *n);

/* Pid of the daemon and this connection's credentials as the daemon saw them. */
KVC_API int kvc_peer_info(const kvc_client *c, uint32_t *daemon_pid, uint32_t *uid, uint32_t *gid);

/* ---- operating kvcd ------------------------------------------------------------------ */
/*
 * What kvcctl uses. Calls marked (admin) are refused with -EPERM unless the caller is root,
 * the daemon's user or a member of its server.admin_group.
 */

/* One connected client, as returned by kvc_clients(). */
struct kvc_client_info {
    uint32_t conn_id, pid, uid, gid;
    uint32_t leases, reservations;
    int admin; /* may run admin calls */
    int self;  /* the connection that asked */
    uint64_t pins, reserved_bytes;
    uint64_t requests, lookup_tokens, hit_tokens, bytes_in, bytes_out, errors, refusals;
    uint64_t connected_ms; /* since the daemon started */
    char name[32];
};

/* Every connected client (an admin's view; others see their own uid's connections only).
 * *out is malloc'd (free() it). */
KVC_API int kvc_clients(kvc_client *c, struct kvc_client_info **out, size_t *n);

/* Every counter in the Prometheus text exposition format (version 0.0.4): the daemon's
 * totals, and per namespace and per client those the caller may see (an admin: all; others:
 * the namespaces kvc_ns_list shows them and their own uid's connections). *text is
 * malloc'd and NUL-terminated (free() it). */
KVC_API int kvc_metrics(kvc_client *c, char **text);

/* The value of option "section.name" as a config file would hold it; key NULL or "" gives
 * every option, one "section.name = value" a line. Errors: -ENOENT (no such option),
 * -ENOSPC (buf too small; it holds a truncated text). */
KVC_API int kvc_config_get(kvc_client *c, const char *key, char *buf, size_t len);

/* The same as JSON, typed: a key's value (true/false; integers and doubles as numbers, sizes
 * in bytes and durations in milliseconds as numbers; modes, enums and strings as strings),
 * or without a key one object {"section.name": value, ...} where an option the caller may
 * not see is null. Errors as kvc_config_get, and -EACCES for a key the caller may not see. */
KVC_API int kvc_config_get_json(kvc_client *c, const char *key, char *buf, size_t len);

/* (admin) Sets a reloadable option in the running daemon, checked like a reload; it holds
 * until the next reload rereads the file. 0, or the refusal with the daemon's reason in msg:
 * -ENOENT no such option, -EINVAL bad value, -EROFS the option cannot change while kvcd
 * runs (a restart applies it), -EPERM not an admin. */
KVC_API int kvc_config_set(kvc_client *c, const char *key, const char *value, char *msg,
                           size_t len);

/* (admin) Reloads the configuration file, all or nothing, and waits for the verdict:
 * 0 applied; -EINVAL (the file does not parse or validate) or -EROFS (an option that needs
 * a restart changed) with the daemon's reason in msg; -EPERM not an admin. */
KVC_API int kvc_reload(kvc_client *c, char *msg, size_t len);

/* Policies (docs/policies.md). scope 0: get writes the default (cache.policy) on the first
 * line of buf, then one line per namespace "ID MODEL POLICY SOURCE" (SOURCE: default, config
 * or admin); set changes the default. scope = a namespace id: get writes that namespace's
 * policy name, set changes it until the next reload ("inherit": follow the default again).
 * (admin for set) -EINVAL unknown name, -ENOENT unknown namespace. */
KVC_API int kvc_policy_get(kvc_client *c, uint32_t scope, char *buf, size_t len);
KVC_API int kvc_policy_set(kvc_client *c, uint32_t scope, const char *name);

/* (admin) Evicts every unpinned block of namespace ns_id (0: all) in tier `tier` (0: all,
 * 1: host). *evicted (may be NULL) gets the count. -ENOENT unknown namespace, -EOPNOTSUPP
 * unknown tier. */
KVC_API int kvc_evict(kvc_client *c, uint32_t ns_id, uint32_t tier, uint64_t *evicted);

/* (admin) Stops the daemon after the reply. */
KVC_API int kvc_shutdown(kvc_client *c);

/* (admin) Drops namespace ns_id: every block of it in every tier, then the namespace, whose
 * id may name another one afterwards (clients that had it open get -ENOENT). *dropped (may
 * be NULL) gets the blocks dropped. -ENOENT unknown namespace; -EBUSY while a client holds a
 * lease or reservation on it or a block of it is moving (the blocks that could go are gone,
 * the namespace stays). */
KVC_API int kvc_ns_drop(kvc_client *c, uint32_t ns_id, uint64_t *dropped);

/* ---- GPU (CUDA) ----------------------------------------------------------------------- */
/*
 * With a GPU tier the daemon owns a device pool shared with engines on the same GPU. After
 * kvc_gpu_attach() a lookup with KVC_LOOKUP_GPU may return hits inside the pool, which
 * libkvc copies device-to-device into the engine's memory; hits in the host arena are DMA
 * copies (the arena is registered as pinned memory). CUDA objects travel as void *:
 * `stream` is a cudaStream_t (NULL: the legacy default stream), `event` a cudaEvent_t the
 * caller created and owns (NULL: none). Copies are queued on the stream and return at
 * once, without waiting for earlier calls on the same lease, so a batch is in flight
 * together; kvc_release(), kvc_commit() and kvc_abort() wait for all the work queued on
 * their lease or reservation before they unpin or publish anything, so a lease can never
 * be reused under a copy still in flight. No call allocates or frees device memory per hit:
 * the device scratch of gathers and scatters is the client's, kept from call to call and
 * freed by kvc_disconnect(). A call stages at most 64 MiB through it: one whose staged
 * blocks need more goes in chunks of blocks that fit (a larger block is a chunk of its own),
 * each chunk's copy batch and kernels in turn on the call's stream through one scratch, and
 * a lease's or reservation's later calls on the same stream use the scratch it holds. Device
 * work runs on the device current in the calling
 * thread, and no call changes that device. The pool is used only by a client attached from
 * a thread whose current device is the pool's; synchronous copies (kvc_lease_copy,
 * kvc_resv_write into the pool) run on libkvc's own non-blocking stream and have landed on
 * return, without waiting for the engine's streams.
 * Errors of this section: -ENOTSUP (libkvc built without CUDA, or a device path asked of
 * host memory), -ENODEV (no device), -EIO (a CUDA error; one line on stderr).
 */

/* Lookup flag: hits may be locations in the GPU pool (kvc_lease_tier() says which). */
#define KVC_LOOKUP_GPU 0x4u

/* Where a hit or slot lives. */
enum kvc_tier {
    KVC_TIER_HOST = 1, /* host arena: kvc_lease_data() is a host pointer */
    KVC_TIER_GPU = 2,  /* the GPU pool: kvc_lease_data() is a device pointer */
};

/* Attaches to the daemon's GPU pool and registers the mapped host arenas as pinned memory
 * (in chunks, once; an arena a later kvc_ns_open() maps is registered then). Returns 1 when
 * the pool is mapped here (device-to-device loads and puts), 0 when this client works
 * from host memory (no GPU tier in the daemon, no device or CUDA here, or the pool on a
 * device this process does not see: host copies then), or -EPIPE, -EPROTO, -ENOMEM.
 * The pool is mapped only when the calling thread's current device is the pool's device
 * (its mapping is usable from that device alone); from another device the answer is 0.
 * Calling it again returns the first answer. The pool only holds namespaces without
 * access lists: a client that opened none of them (and is no admin) is refused the pool by
 * the daemon and gets 0, and hits and slots of namespaces with access lists are always host
 * memory. */
KVC_API int kvc_gpu_attach(kvc_client *c);

/* Tier of hit i (enum kvc_tier), or -ERANGE. */
KVC_API int kvc_lease_tier(const kvc_lease *l, size_t i);

/* Queues the copy of hit i into dst (device or host memory, len at least the block size)
 * on stream, as raw data; kvc_release() waits for it. A quantized host hit into device
 * memory crosses in its stored size and is dequantized on the device, queued the same way;
 * into host memory it is dequantized on the CPU before the call returns. Errors:
 * -EINVAL, -ERANGE, -EIO, -ENOMEM, -EBADMSG (a quantized block that does not decode),
 * -ENOTSUP (no kvc_gpu_attach). */
KVC_API int kvc_lease_copy_async(kvc_lease *l, size_t i, void *dst, size_t len, void *stream);

/* Queues the copy of hits [first, first+n) into dst, hit j at dst + j * block size (len at
 * least n block sizes), on stream, as kvc_lease_copy_async() does for one hit, in a bounded
 * number of device operations whatever n is: into device memory, one device-to-device copy
 * batch for the pool hits (pieces that continue each other merged; one kernel), one
 * host-to-device batch for the host hits, and one decode kernel for the quantized host hits
 * (their stored bytes cross in the same batch and are decoded straight into dst; beyond
 * 64 MiB of stored bytes, a batch and a decode kernel per 64 MiB chunk); then one event
 * record. Into host memory: raw hits as one batch, quantized hits decoded on the CPU
 * before the call returns. kvc_release() waits for it. Returns n.
 * Errors: -EINVAL (NULL, len below n blocks), -ERANGE (first, n), -ENOTSUP (no
 * kvc_gpu_attach; a quantized pool hit), -EBADMSG (a quantized block that is not of the
 * namespace's layout; nothing was queued), -EIO, -ENOMEM. */
KVC_API int kvc_lease_copy_range_async(kvc_lease *l, size_t first, size_t n, void *dst, size_t len,
                                       void *stream);

/* Queues the copy of src into the slot of key i (status RESERVED; src device or host
 * memory) on stream; kvc_commit() waits for it. Errors: -EINVAL, -ERANGE, -EIO. */
KVC_API int kvc_resv_write_async(kvc_resv *r, size_t i, const void *src, size_t len, void *stream);

/* An engine's paged KV: per-layer K and V tensors with a block table. Token p of the
 * sequence is at  k[layer] + block_table[p / page_tokens] * page_stride
 *                 + (p % page_tokens) * token_stride + head * head_stride
 * (head_dim elements contiguous). vLLM: tensors [num_pages][page_tokens][heads][dim] with
 * its block table; a contiguous [tokens][heads][dim] tensor: one entry {0} and
 * page_tokens = its token count. k, v and block_table are host arrays (borrowed for the
 * call); the tensors they point at are device memory when on_device, else host memory. */
struct kvc_paged_kv {
    void *const *k;             /* [layers] */
    void *const *v;             /* [layers]; NULL for K-only namespaces */
    const int32_t *block_table; /* [table_len] */
    uint32_t table_len;
    uint32_t page_tokens;
    uint64_t page_stride, token_stride, head_stride; /* bytes */
    int on_device;
};

/* Loads hits [first, first+n) of a lease into the engine's paged KV, hit j covering
 * sequence tokens [first_token + j*block_tokens, ...). With on_device, one call queues at
 * most: one host-to-device batch (the host hits: straight into the pages, a range per
 * (block, layer, K/V, page), where the heads and tokens of a page are packed — vLLM's
 * [num_pages, page_tokens, heads, dim] tensors — and those ranges are KVC_GPU_DMA_MIN, 1 MiB
 * by default, or more; else staged in the client's device scratch), one scatter kernel
 * (every raw pool hit, read straight from the pool, and every staged host hit), one decode
 * kernel (every lossy hit — a block the daemon quantized — decoded straight into the
 * tensors), and the event records; `event` is recorded after the last of it. Staged blocks
 * of more than 64 MiB go in chunks of that much: a batch, a scatter and a decode kernel per
 * chunk (libkvc.3). No call waits.
 * Without on_device: a CPU copy from host hits (pool hits are -ENOTSUP: look up without
 * KVC_LOOKUP_GPU), lossy hits decoded on the CPU first. Returns n.
 * Errors: -EINVAL (shape, strides, table), -ERANGE, -ENOTSUP (host tensors and a pool hit;
 * device tensors without kvc_gpu_attach), -EIO, -EBADMSG (a lossy hit that is not an
 * encoded block of the namespace's layout; nothing was queued), -ENOMEM. */
KVC_API int kvc_lease_scatter(kvc_lease *l, size_t first, size_t n, const struct kvc_paged_kv *kv,
                              uint64_t first_token, void *stream, void *event);

/* kvc_lease_scatter() of layers [layer_first, layer_first + layer_count) only, so that a load
 * can be split by layer and its first layers used while the next are in flight: kv->k and
 * kv->v still index every layer of the namespace; the other layers of the engine's tensors
 * are not touched. Host hits cross only the layers moved. kvc_lease_scatter() is the whole
 * range. The same bounded device operations per call (one scatter and one decode kernel
 * whatever n and the range). Errors as kvc_lease_scatter(), and -EINVAL (layer_count 0),
 * -ERANGE (layer_first + layer_count above the namespace's layers). */
KVC_API int kvc_lease_scatter_layers(kvc_lease *l, size_t first, size_t n,
                                     const struct kvc_paged_kv *kv, uint64_t first_token,
                                     uint32_t layer_first, uint32_t layer_count, void *stream,
                                     void *event);

/* kvc_reserve() that may hand out slots in the GPU pool (after kvc_gpu_attach() returned
 * 1); the daemon puts them in host memory when the pool is full. */
KVC_API int kvc_reserve_gpu(kvc_ns *ns, const struct kvc_key *parent, const struct kvc_key *keys,
                            size_t n, kvc_resv **out);

/* Stores the engine's KV of sequence tokens [first_token, first_token + n*block_tokens)
 * into the reserved slots of keys [first, first+n) (keys whose status is not RESERVED are
 * skipped). Device tensors: one gather kernel for every pool slot of the call (and every
 * host slot of a strided layout or of page pieces under KVC_GPU_DMA_MIN, through device
 * scratch; a kernel and a batch per 64 MiB chunk of them), one device-to-host batch into the
 * host slots (straight from the pages where kvc_lease_scatter() would go straight into
 * them); `event` is recorded after it; kvc_commit() waits. Host tensors: a CPU copy into
 * host slots. Returns the number of slots written. Errors as kvc_lease_scatter(). */
KVC_API int kvc_resv_gather(kvc_resv *r, size_t first, size_t n, const struct kvc_paged_kv *kv,
                            uint64_t first_token, void *stream, void *event);

/* kvc_resv_gather() of layers [layer_first, layer_first + layer_count) only: a slot may be
 * filled layer by layer over several calls (on any streams; kvc_commit() waits for all of
 * them). kv->k and kv->v index every layer of the namespace. Once a call has written some
 * layers of a slot and not others, kvc_commit() refuses with -EBUSY, and does nothing (the
 * reservation stays yours: write the missing layers, or kvc_abort()), to publish that slot
 * before all its layers are written by gathers or by kvc_resv_write()/kvc_resv_write_async()
 * (a whole block); bytes written through kvc_resv_data() are not seen by this count. Slots
 * past the `n` kvc_commit() publishes are not checked. Errors as kvc_lease_scatter_layers(),
 * -ENOMEM. */
KVC_API int kvc_resv_gather_layers(kvc_resv *r, size_t first, size_t n,
                                   const struct kvc_paged_kv *kv, uint64_t first_token,
                                   uint32_t layer_first, uint32_t layer_count, void *stream,
                                   void *event);

#ifdef __cplusplus
}
#endif
#endif
