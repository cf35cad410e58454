/*
 * kvc_proto.h — kvcd wire protocol, version 1. Internal: shared by the daemon and libkvc,
 * nothing else.
 *
 * DESIGN
 * Control messages travel over a SOCK_SEQPACKET Unix socket, one request or reply per
 * datagram, so message boundaries are kept and descriptors ride along (SCM_RIGHTS).
 * Every message is a fixed header followed by `len` payload bytes. Integers are in host
 * byte order (both ends share the host) and naturally aligned; every payload struct has an
 * explicit layout with no implicit padding so that the decoder can compare sizes exactly.
 * Block bytes never cross the socket: replies carry locations inside shared arenas.
 *
 * Validation rule for the daemon: a message whose header is unreadable (short, bad magic)
 * closes the connection; a readable header with a bad payload gets an error reply
 * (status = -errno) with the same opcode and request id. A batch that names one key twice
 * (LOOKUP, RESERVE, LOOKUP_BUDGET, HINT) is refused with -EINVAL: a chain never repeats a key.
 *
 * Order: the daemon reads a connection's requests in the order they were sent and handles
 * each before it reads the next; most are answered at once, in that order (a WAIT, and a
 * RESERVE or LOOKUP waiting for disk room, are answered later; a COMMIT never waits). So a
 * reply says every earlier COMMIT of the connection was handled, and a client may send a
 * COMMIT without waiting for its reply: libkvc sends kvc_put_prefix's quiet
 * (KVC_COMMIT_F_QUIET: no reply unless it fails) and SYNC when it must know. A RELEASE
 * with KVC_MSG_F_QUIET in its header is answered only when it fails, too (kvc_release does
 * not wait for the unpin: the connection's next reply says it was done); a daemon says it
 * takes that flag in HELLO's reply (KVC_HELLO_F_QUIET), and refuses it on any other request.
 *
 * Notices: before the daemon closes a connection on its own — refused at accept (-EUSERS:
 * server.max_clients or max_clients_per_uid), no HELLO in time or idle too long
 * (-ETIMEDOUT) — it sends one reply with request id 0 (never used by a request), opcode HELLO
 * and that status, so the client can say why instead of "connection reset".
 */
#ifndef KVC_PROTO_H
#define KVC_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define KVC_PROTO_MAGIC 0x4443564bu /* "KVCD" read as little-endian bytes */
#define KVC_PROTO_VERSION 1u
/* Largest datagram either side sends; sized to fit a default unix socket buffer. */
#define KVC_PROTO_MAX_MSG (96u * 1024u)
/* Most keys in one LOOKUP or RESERVE; libkvc splits longer prefixes. */
#define KVC_PROTO_MAX_KEYS 2048u
#define KVC_PROTO_MODEL_ID_MAX 128u
#define KVC_PROTO_NAME_MAX 40u
#define KVC_PROTO_MAX_LEASES 1024u

/*
 * The opcode list. One table feeds the daemon's dispatcher, libkvc and `kvcctl help`:
 * X(NAME, number, admin-only, summary)
 */
#define KVC_OPCODES(X)                                                                             \
    X(HELLO, 1, 0, "negotiate the protocol version; learn the peer credentials")                   \
    X(NS_OPEN, 2, 0, "open or create a namespace (model id + KV layout); receive its arena")       \
    X(LOOKUP, 3, 0, "longest cached prefix of a key chain; hits are pinned under a lease")         \
    X(RELEASE, 4, 0, "drop leases taken by LOOKUP")                                                \
    X(RESERVE, 5, 0, "slots for the keys of a chain not yet cached")                               \
    X(COMMIT, 6, 0, "make reserved blocks visible")                                                \
    X(ABORT, 7, 0, "free a reservation")                                                           \
    X(STATS, 8, 0, "counters, global or per namespace")                                            \
    X(NS_LIST, 9, 0, "namespaces and their layouts")                                               \
    X(BLOCK_LIST, 10, 0, "blocks of a namespace with their metadata")                              \
    X(WAIT, 11, 0, "wait until the hits of a lease that were on disk are in memory")               \
    X(GPU_ATTACH, 12, 0, "the GPU pool: export handle (descriptor attached) and device")           \
    X(HINT, 16, 0, "per-block importance scores for the policies (H2O mass, SnapKV score)")        \
    X(LOOKUP_BUDGET, 17, 0, "at most N blocks of a cached prefix, chosen by a policy; pinned")     \
    X(FAST_ATTACH, 18, 0, "the fast path: an arena's shared index or this client's hit ring")      \
    X(SYNC, 19, 0, "a barrier: answered once every earlier request of the connection is handled")  \
    X(HINT_HEADS, 20, 0, "HINT with a score per (layer, head): head profiles, per-head codecs")    \
    X(CLIENTS, 32, 0, "connected clients: pid, uid, pins, reservations, counters")                 \
    X(METRICS, 33, 0, "every counter in the Prometheus text format, paged")                        \
    X(CONFIG_GET, 34, 0, "the value of one option")                                                \
    X(CONFIG_SET, 35, 1, "set a reloadable option, all-or-nothing like a reload")                  \
    X(RELOAD, 36, 1, "reload the configuration file; the reply carries the verdict")               \
    X(POLICY_GET, 37, 0, "the eviction policy in use")                                             \
    X(POLICY_SET, 38, 1, "change the eviction policy")                                             \
    X(EVICT, 39, 1, "evict unpinned blocks of a namespace, a tier or everything")                  \
    X(SHUTDOWN, 40, 1, "stop the daemon")                                                          \
    X(NS_DROP, 41, 1, "drop a namespace and its blocks (refused while any are pinned or reserved)")

enum kvc_op {
#define KVC_OP_ENUM(name, num, admin, help) KVC_OP_##name = num,
    KVC_OPCODES(KVC_OP_ENUM)
#undef KVC_OP_ENUM
    KVC_OP_MAX
};

/* Fixed header of every request and reply: 24 bytes. */
struct kvc_msg_hdr {
    uint32_t magic;   /* KVC_PROTO_MAGIC */
    uint16_t version; /* KVC_PROTO_VERSION */
    uint16_t opcode;  /* enum kvc_op; a reply repeats the request's */
    uint32_t req_id;  /* chosen by the client, echoed in the reply */
    uint32_t len;     /* payload bytes following the header */
    int32_t status;   /* replies: 0 or -errno; requests: 0 */
    uint32_t flags;   /* KVC_MSG_F_* */
};
#define KVC_MSG_F_FD 0x1u    /* reply: a descriptor is attached (SCM_RIGHTS) */
#define KVC_MSG_F_QUIET 0x2u /* request (RELEASE only): answer only a failure */

struct kvc_wire_key {
    uint64_t lo, hi;
};

/* HELLO */
struct kvc_hello_req {
    uint16_t min_version, max_version;
    uint32_t flags;
    char client_name[32]; /* NUL-padded, informational */
};
struct kvc_hello_rep {
    uint16_t version;
    uint16_t features; /* KVC_HELLO_F_*: what this daemon takes beyond version 1's first form
                        * (0 from a daemon that predates them) */
    uint32_t daemon_pid;
    uint32_t peer_pid, peer_uid, peer_gid; /* as the daemon sees them (SO_PEERCRED) */
    uint32_t max_keys;
    uint32_t max_msg;
    uint32_t conn_id;
};

#define KVC_HELLO_F_QUIET 0x1u     /* a RELEASE may carry KVC_MSG_F_QUIET */
#define KVC_HELLO_F_FAST_BELL 0x2u /* FAST_ATTACH takes KVC_FAST_BELL (client/kvc_fast.h) */

/* NS_OPEN */
enum kvc_wire_dtype {
    KVC_WIRE_DTYPE_FP16 = 1,
    KVC_WIRE_DTYPE_BF16 = 2,
    KVC_WIRE_DTYPE_FP32 = 3,
    KVC_WIRE_DTYPE_FP8_E4M3 = 4,
    KVC_WIRE_DTYPE_INT8 = 5,
};
/* The kind of a namespace's layers. Hybrid models (sliding-window attention, Mamba / linear
 * attention) keep one namespace per kind, under the same keys. */
enum kvc_wire_kv_kind {
    KVC_WIRE_KV_KIND_KV = 1,        /* keys and values */
    KVC_WIRE_KV_KIND_K_ONLY = 2,    /* one latent (MLA) */
    KVC_WIRE_KV_KIND_KV_WINDOW = 3, /* keys and values of sliding-window layers: a prefix needs
                                       only the blocks of its last window_tokens tokens */
    KVC_WIRE_KV_KIND_STATE = 4,     /* a fixed-size state per layer (layers x kv_heads x
                                       head_dim), valid at the end of the block whose key it
                                       is stored under; no token dimension */
};
struct kvc_wire_layout {
    char model_id[KVC_PROTO_MODEL_ID_MAX]; /* NUL-terminated within the array */
    uint32_t layers;
    uint32_t kv_heads;
    uint32_t head_dim;
    uint32_t block_tokens; /* tokens per key (a state block holds none: its prefix's end) */
    uint8_t dtype;   /* enum kvc_wire_dtype */
    uint8_t kv_kind; /* enum kvc_wire_kv_kind */
    uint16_t window_tokens; /* KV_WINDOW: the window (1..65535 tokens); 0 for other kinds */
    uint32_t flags; /* KVC_WIRE_QUANT_*: 0 keeps every block raw */
};
/* Tokens of one stored block, and its K/V sections (2: K and V, 1: one). */
static inline uint32_t kvc_wire_layout_tokens(const struct kvc_wire_layout *l)
{
    return l->kv_kind == KVC_WIRE_KV_KIND_STATE ? 1u : l->block_tokens;
}
static inline uint32_t kvc_wire_layout_kinds(const struct kvc_wire_layout *l)
{
    return l->kv_kind == KVC_WIRE_KV_KIND_KV || l->kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW ? 2u : 1u;
}
/* Blocks of a KV_WINDOW namespace a prefix needs: those its window's tokens touch. */
static inline uint32_t kvc_wire_window_blocks(const struct kvc_wire_layout *l)
{
    return ((uint32_t)l->window_tokens + l->block_tokens - 1) / l->block_tokens;
}
/* The widest window (in blocks) a KV_WINDOW namespace may have: a LOOKUP of a tail of a long
 * prompt judges the windows that end at least this far into its keys, so each request of a
 * scan from the end moves it by at least KVC_PROTO_MAX_KEYS - this + 1 keys. */
#define KVC_PROTO_MAX_WINDOW_BLOCKS (KVC_PROTO_MAX_KEYS / 2)
/* layout.flags at NS_OPEN: which codecs the namespace allows and the recipe quantize-in-place
 * uses (codec of the K and of the V sections, the first raw_layers layers kept raw). The
 * creator's value stays with the namespace; a later NS_OPEN may pass 0 or the same value. The
 * daemon refuses (EINVAL) unknown bits, a recipe codec outside the allowed set, and codecs on
 * a dtype or shape the kernels do not take (fp16/bf16 only). */
/* Bit c of the allowed set: format c may be stored; formats 0-7 in bits 0-7, formats 8-15 in
 * bits 24-31 (added with ROT4, MERGE and LOWRANK: a flags word without them reads as before). */
#define KVC_WIRE_QUANT_ALLOWED(f) (((f)&0xffu) | (((f) >> 16) & 0xff00u))
#define KVC_WIRE_QUANT_K(f) (((f) >> 8) & 0xfu)
#define KVC_WIRE_QUANT_V(f) (((f) >> 12) & 0xfu)
#define KVC_WIRE_QUANT_RAW_LAYERS(f) (((f) >> 16) & 0xffu)
#define KVC_WIRE_QUANT_MASK 0xffffffffu
#define KVC_WIRE_QUANT_FLAGS(allowed, k, v, raw_layers)                                            \
    (((uint32_t)(allowed)&0xffu) | (((uint32_t)(allowed)&0xff00u) << 16) |                         \
     (((uint32_t)(k)&0xfu) << 8) | (((uint32_t)(v)&0xfu) << 12) |                                  \
     (((uint32_t)(raw_layers)&0xffu) << 16))
struct kvc_ns_open_req {
    struct kvc_wire_layout layout;
};
struct kvc_ns_open_rep {
    uint32_t ns_id;
    uint32_t arena_id;
    uint64_t block_bytes;
    uint64_t arena_bytes;
    uint32_t access; /* KVC_ACCESS_* granted to this peer */
    uint32_t created;
};
#define KVC_ACCESS_READ 0x1u
#define KVC_ACCESS_WRITE 0x2u

/* A block location inside an arena. */
struct kvc_wire_loc {
    uint32_t arena_id;
    uint8_t tier;   /* KVC_WIRE_TIER_* */
    uint8_t format; /* KVC_WIRE_FORMAT_* */
    uint16_t flags; /* KVC_LOC_F_* */
    uint64_t offset;
    uint64_t length;
};
#define KVC_WIRE_TIER_HOST 1
#define KVC_WIRE_TIER_DISK 2 /* BLOCK_LIST only: a LOOKUP hands out host locations */
#define KVC_WIRE_TIER_GPU 3  /* offset into the GPU pool (GPU_ATTACH); arena_id is the pool's */
#define KVC_WIRE_FORMAT_RAW 0
/* A quantized block: an encoded block of kernels/kern.h (self-describing header and per
 * (layer, K/V) section table; the number is the codec of its K sections, the same as
 * enum kern_codec). loc.length is then the slot, at least the encoded size. */
#define KVC_WIRE_FORMAT_Q8_0 1
#define KVC_WIRE_FORMAT_Q4_1 2
#define KVC_WIRE_FORMAT_Q5_1 3
#define KVC_WIRE_FORMAT_KIVI2 4
#define KVC_WIRE_FORMAT_KIVI4 5
#define KVC_WIRE_FORMAT_FP8 6
#define KVC_WIRE_FORMAT_ROT2 7
#define KVC_WIRE_FORMAT_ROT4 8
#define KVC_WIRE_FORMAT_MERGE 9
#define KVC_WIRE_FORMAT_LOWRANK 10
#define KVC_WIRE_FORMAT_COUNT 11
#define KVC_LOC_F_READY 0x1u /* the bytes are in place now; else after WAIT says so */

/* LOOKUP: the hits are the longest run of committed blocks from keys[0] (KV, K_ONLY). Of a
 * KV_WINDOW namespace: the blocks of the window of the longest prefix keys[0..e) whose
 * window is cached (keys[e - window_blocks..e), fewer when base + e is shorter); of a STATE
 * namespace: the one state of the longest prefix keys[0..e) whose last key has one
 * (keys[e-1]). The reply's `first` is the position in keys of the first hit. A window is
 * answered whole or not at all (all its blocks pinned, or none). A hit on disk or in the
 * remote tier is being read into the host slot its location names (flags without READY):
 * WAIT for it. With KVC_LOOKUP_F_READY_ONLY the hits stop at the first block not in memory
 * now (reads of the blocks after it still start, so a later lookup finds them ready); a
 * window's or a state's span is then the one in memory now. KVC_LOOKUP_F_LOCAL: no read from
 * the remote tier (libkvc's last try of a span whose reads failed). The daemon may hold a
 * LOOKUP (up to disk.put_wait) for room to read into or for the pool's copies to a client
 * that cannot read it; with KVC_LOOKUP_F_READY_ONLY or KVC_LOOKUP_F_NOWAIT it answers at
 * once with what there is. */
#define KVC_LOOKUP_F_READY_ONLY 0x1u
#define KVC_LOOKUP_F_GPU 0x2u    /* hits may be GPU locations (the client mapped the pool) */
#define KVC_LOOKUP_F_LOCAL 0x4u  /* the local tiers only */
#define KVC_LOOKUP_F_NOWAIT 0x8u /* answer at once (libkvc's KVC_LOOKUP_NOWAIT) */
#define KVC_RESERVE_F_GPU 0x1u   /* RESERVE: slots may be GPU locations */
struct kvc_lookup_req {
    uint32_t ns_id;
    uint32_t flags;
    uint32_t nkeys;
    /* KV_WINDOW: the position in the caller's prompt of keys[0] (the keys are the tail of a
     * longer prefix: a window is judged only where all its blocks are among keys); 0 for a
     * whole prefix, and for every other kind. */
    uint32_t base;
    /* struct kvc_wire_key keys[nkeys]; */
};
struct kvc_lookup_rep {
    uint32_t nhit;
    uint32_t first;    /* position in keys of hit 0 (0 but for KV_WINDOW and STATE) */
    uint64_t lease_id; /* 0 when nhit == 0 */
    /* struct kvc_wire_loc locs[nhit]; */
};

/* WAIT: replies once no hit of the lease is still being read from disk, or after
 * timeout_ms (0: at once), so its reply may come after the replies to later requests.
 * nready counts the hits from the first that are in memory; hits after a failed read
 * (checksum, I/O error) are misses: release the lease. -ENOENT for an unknown lease. */
struct kvc_wait_req {
    uint64_t lease_id;
    uint32_t timeout_ms;
    uint32_t pad;
};
struct kvc_wait_rep {
    uint32_t nhit;
    uint32_t nready;
    uint32_t pending; /* hits still being read (after a timeout) */
    uint32_t pad;
};

/* RELEASE */
struct kvc_release_req {
    uint32_t nleases;
    uint32_t load_us; /* microseconds the client spent copying these leases' hits out of the
                       * arena (informational: feeds the load-vs-recompute counters) */
    /* uint64_t lease_ids[nleases]; */
};
struct kvc_release_rep {
    uint32_t released;
    uint32_t pad;
};

/*
 * RESERVE: keys[0] is the child of `parent` (all-zero for a root), keys[i] of keys[i-1].
 * Per key the reply says present (already cached), reserved (a slot to write), busy
 * (another client is writing it), nospace (no room, or past what a quota allows) or skipped
 * (its parent is not cached, or is still being written; or it follows a key that was busy,
 * found no room, or got no slot). The daemon counts every key by that fate (kvcctl stats:
 * reserved_blocks, dedup_blocks, busy_blocks, nospace_blocks, quota_cut_blocks, skipped_*).
 */
struct kvc_reserve_req {
    uint32_t ns_id;
    uint32_t flags;
    uint32_t nkeys;
    uint32_t pad;
    struct kvc_wire_key parent;
    /* struct kvc_wire_key keys[nkeys]; */
};
enum kvc_wire_slot {
    KVC_WIRE_SLOT_PRESENT = 1,
    KVC_WIRE_SLOT_RESERVED = 2,
    KVC_WIRE_SLOT_BUSY = 3,
    KVC_WIRE_SLOT_SKIPPED = 4,
    KVC_WIRE_SLOT_NOSPACE = 5,
};
struct kvc_reserve_rep {
    uint64_t resv_id; /* 0 when nothing was reserved */
    uint32_t nkeys;
    uint32_t nreserved;
    /* struct kvc_wire_slot_rep slots[nkeys]; */
};
struct kvc_wire_slot_rep {
    uint8_t status; /* enum kvc_wire_slot */
    uint8_t pad[7];
    struct kvc_wire_loc loc; /* valid when status == RESERVED */
};

/* COMMIT: the first `ncommit` reserved slots (in key order) become visible; the rest
 * are freed. ncommit = UINT32_MAX commits all. A reservation older than
 * server.reservation_timeout has been aborted by the daemon: COMMIT and ABORT of it answer
 * -ETIMEDOUT (its slots may hold other blocks by then: stop writing them). */
struct kvc_commit_req {
    uint64_t resv_id;
    uint32_t ncommit;
    uint32_t flags; /* KVC_COMMIT_F_* */
};
/* COMMIT flag: reply only if it fails. The client sends it without waiting (kvc_put_prefix):
 * a reply to any later request on the connection says it was handled, and the absence of an
 * error reply before it that it succeeded. */
#define KVC_COMMIT_F_QUIET 0x1u
struct kvc_commit_rep {
    uint32_t committed;
    uint32_t dropped;
};
struct kvc_abort_req {
    uint64_t resv_id;
};

/* SYNC: an empty reply (status 0), sent once every request before it on the connection has
 * been handled ("Order" above; a WAIT, or a RESERVE or LOOKUP waiting for disk room, may be
 * still pending). kvc_flush() sends it after quiet commits. Both fields zero. */
struct kvc_sync_req {
    uint32_t flags;
    uint32_t pad;
};

/* STATS: scope 0 is the whole daemon, scope n is namespace n. */
struct kvc_stats_req {
    uint32_t scope;
    uint32_t pad;
};
struct kvc_wire_stat {
    char name[KVC_PROTO_NAME_MAX];
    uint64_t value;
};
struct kvc_stats_rep {
    uint32_t nstats;
    uint32_t pad;
    /* struct kvc_wire_stat stats[nstats]; */
};

/* NS_LIST: paged by namespace id. */
struct kvc_ns_list_req {
    uint32_t cursor; /* first namespace id to return */
    uint32_t pad;
};
struct kvc_wire_ns {
    uint32_t ns_id;
    uint32_t arena_id;
    struct kvc_wire_layout layout;
    uint64_t block_bytes;
    uint64_t blocks;
    uint64_t bytes;
};
struct kvc_ns_list_rep {
    uint32_t nns;
    uint32_t next_cursor; /* 0: no more */
    /* struct kvc_wire_ns ns[nns]; */
};

/* BLOCK_LIST: paged by an opaque cursor. */
struct kvc_block_list_req {
    uint32_t ns_id;
    uint32_t max;
    uint64_t cursor; /* 0 to start */
};
struct kvc_wire_block {
    struct kvc_wire_key key;
    struct kvc_wire_key parent;
    uint64_t bytes;
    uint64_t last_access_ms; /* milliseconds since the daemon started */
    uint32_t hits;
    uint32_t pins;
    uint32_t children;
    uint32_t depth;
    uint8_t tier;
    uint8_t format;
    uint8_t state; /* 1 committed */
    uint8_t flags; /* KVC_WIRE_BLOCK_F_* */
    uint8_t pad[4];
};
#define KVC_WIRE_BLOCK_F_DISK 0x1u /* a copy is on disk (the only one for tier disk) */
struct kvc_block_list_rep {
    uint32_t nblocks;
    uint32_t pad;
    uint64_t next_cursor; /* 0: no more */
    /* struct kvc_wire_block blocks[nblocks]; */
};

/*
 * Operator requests (CLIENTS .. SHUTDOWN) share one request body; each uses the fields it
 * names and the others must be zero. Admin-only opcodes (the third column of KVC_OPCODES)
 * are refused with -EPERM unless the peer is root, the daemon's user or in its admin group.
 *   CLIENTS     cursor = first connection id to return
 *   METRICS     cursor = byte offset into the text
 *   CONFIG_GET  key = "section.name"
 *   CONFIG_SET  key, value
 *   POLICY_GET/SET  scope = 0: the default (cache.policy); GET answers it and one line per
 *               namespace "ID MODEL NAME SOURCE"; scope = namespace id: that namespace's;
 *               value = policy name for SET ("inherit": follow the default again)
 *   EVICT       scope = namespace id (0: every namespace), tier = KVC_WIRE_TIER_* (0: all)
 *   NS_DROP     scope = namespace id: every block of it goes and its id is free again;
 *               -EBUSY (nothing dropped) while a client holds a lease or a reservation on it,
 *               or a block of it is moving between tiers; value = blocks dropped
 * METRICS, CLIENTS and POLICY_GET show a client that is not an admin only the namespaces
 * NS_LIST shows it, and only the connections of its own uid.
 */
struct kvc_admin_req {
    uint32_t scope;
    uint32_t tier; /* EVICT: the tier; CONFIG_GET: 0 text, KVC_CONFIG_GET_JSON typed JSON */
    uint64_t cursor;
    char key[64];    /* NUL-terminated within the array */
    char value[192]; /* NUL-terminated within the array */
};
#define KVC_CONFIG_GET_JSON 1u
/* Reply of METRICS, CONFIG_*, RELOAD, POLICY_*, EVICT, SHUTDOWN: a verdict, a number and a
 * text (a value, a refusal's reason, a page of metrics). */
struct kvc_text_rep {
    int32_t result;       /* RELOAD, CONFIG_SET: 0 applied, -errno refused (reason in text) */
    uint32_t len;         /* text bytes following, no NUL */
    uint64_t value;       /* EVICT: blocks evicted */
    uint64_t next_cursor; /* METRICS: offset of the next page, 0 at the end */
    /* char text[len]; */
};
#define KVC_PROTO_TEXT_MAX (KVC_PROTO_MAX_MSG - 1024u)

struct kvc_wire_client {
    uint32_t conn_id;
    uint32_t pid, uid, gid;
    uint32_t leases, reservations;
    uint32_t flags; /* KVC_CLIENT_F_* */
    uint32_t pad;
    uint64_t pins;
    uint64_t reserved_bytes;
    uint64_t requests;
    uint64_t lookup_tokens, hit_tokens;
    uint64_t bytes_in, bytes_out;
    uint64_t errors, refusals;
    uint64_t connected_ms; /* since the daemon started */
    char name[32];         /* from HELLO */
};
#define KVC_CLIENT_F_ADMIN 0x1u
#define KVC_CLIENT_F_SELF 0x2u
struct kvc_clients_rep {
    uint32_t nclients;
    uint32_t next_cursor; /* 0: no more */
    /* struct kvc_wire_client clients[nclients]; */
};

/*
 * GPU_ATTACH: the first request (flags 0) returns the pool's handle: with handle
 * KVC_GPU_HANDLE_FD the descriptor rides along (SCM_RIGHTS), with KVC_GPU_HANDLE_LEGACY the
 * 64 bytes in `legacy` are a cudaIpcMemHandle_t. -ENODEV when the daemon has no GPU tier.
 * Once the client mapped the pool on the device with that uuid it sends GPU_ATTACH again
 * with KVC_GPU_ATTACH_F_MAPPED; only then may LOOKUP/RESERVE with the GPU flags return GPU
 * locations to it (a client on another device never sends it and gets host locations).
 * Access: the pool only ever holds blocks of namespaces without access lists (those of the
 * shared arena 0), so GPU_ATTACH is answered only to a client that already holds arena 0
 * read-write (it opened such a namespace) or is an admin; others get -EACCES. A namespace
 * with access lists never enters the pool: its hits and slots are host locations.
 */
#define KVC_GPU_ATTACH_F_MAPPED 0x1u
#define KVC_GPU_HANDLE_FD 1u
#define KVC_GPU_HANDLE_LEGACY 2u
struct kvc_gpu_attach_req {
    uint32_t flags;
    uint32_t pad;
};
struct kvc_gpu_attach_rep {
    uint32_t arena_id; /* carried by GPU locations */
    uint32_t handle;   /* KVC_GPU_HANDLE_* */
    uint64_t pool_bytes;
    uint8_t uuid[16]; /* the device's UUID */
    uint8_t legacy[64];
};

/*
 * HINT: per-block scores for the policies (docs/policies.md). kind KVC_HINT_H2O adds the
 * score (attention mass summed over the block's tokens, layers and heads) to the block's
 * H2O mass, which decays with the namespace's half-life; KVC_HINT_SNAPKV sets the block's
 * SnapKV score (the observation window's pooled attention at prefill end). Scores must be
 * finite and >= 0; keys that name no committed block are ignored.
 */
#define KVC_HINT_H2O 1u
#define KVC_HINT_SNAPKV 2u
struct kvc_hint_req {
    uint32_t ns_id;
    uint32_t kind; /* KVC_HINT_* */
    uint32_t nhints;
    uint32_t pad;
    /* struct kvc_wire_hint hints[nhints]; */
};
struct kvc_wire_hint {
    struct kvc_wire_key key;
    float score;
    uint32_t pad;
};
struct kvc_hint_rep {
    uint32_t applied; /* blocks that took a hint */
    uint32_t pad;
};

/*
 * HINT_HEADS: HINT with one score per (layer, head) of each block: keys[nhints], then
 * score[nhints][layers * heads] floats (layer-major), finite, >= 0 and at most
 * KVC_PROTO_MAX_HINT_SCORE (a head's attention mass over a block is bounded by the queries
 * that attended to it; the bound keeps the namespace's head masses finite). layers and heads must
 * be the namespace's layers and kv_heads (else -EINVAL), layers * heads at most
 * KVC_PROTO_MAX_HINT_HEADS. A block's H2O mass / SnapKV score takes the sum of its scores as
 * HINT would; the daemon also keeps the block's head concentration (store.h) and learns the
 * namespace's head profiles (docs/policies.md, "Per-head hints").
 */
#define KVC_PROTO_MAX_HINT_HEADS 8192u
#define KVC_PROTO_MAX_HINT_SCORE 1e9f
struct kvc_hint_heads_req {
    uint32_t ns_id;
    uint32_t kind; /* KVC_HINT_H2O or KVC_HINT_SNAPKV */
    uint32_t nhints;
    uint32_t layers;
    uint32_t heads;
    uint32_t pad;
    /* struct kvc_wire_key keys[nhints]; float score[nhints][layers * heads]; */
};

/*
 * LOOKUP_BUDGET: of the longest run of committed in-memory blocks of keys[0..nkeys), at most
 * `budget` blocks chosen by `policy` (KVC_POLICY_NS: the namespace's; else a policy number,
 * the order of `kvcctl policy`): the first `sinks` and the last `recent` first, the rest by
 * the policy's importance; with qdim > 0 the request carries a query vector of qdim floats
 * (the namespace's head_dim) after the keys and Quest ranks by its bound from the blocks' key
 * summaries. The selected blocks are pinned under one lease, in position order.
 */
#define KVC_POLICY_NS UINT32_MAX
#define KVC_PROTO_MAX_QDIM 4096u
/* flags: per-head budgets. `budget` is then the blocks of each (layer, kv head) on average:
 * sink-only and local heads (the namespace's head profile, learnt from HINT_HEADS) keep the
 * sinks (at least 1) and the recent window, the full heads share the rest, and the selection
 * is what a full head keeps (at most nkeys blocks). The reply carries, after sel[nsel], the
 * profile: layers * kv_heads bytes (enum kvc_wire_head), at most KVC_PROTO_MAX_HINT_HEADS. */
#define KVC_BUDGET_F_HEADS 1u
enum kvc_wire_head {
    KVC_WIRE_HEAD_UNKNOWN = 0,
    KVC_WIRE_HEAD_SINK = 1,
    KVC_WIRE_HEAD_LOCAL = 2,
    KVC_WIRE_HEAD_FULL = 3,
};
struct kvc_lookup_budget_req {
    uint32_t ns_id;
    uint32_t flags; /* 0 or KVC_BUDGET_F_HEADS */
    uint32_t nkeys;
    uint32_t budget; /* >= 1 */
    uint32_t policy;
    uint32_t qdim; /* floats of query after the keys, 0: none */
    uint32_t sinks;
    uint32_t recent;
    /* struct kvc_wire_key keys[nkeys]; float q[qdim]; */
};
struct kvc_wire_sel {
    uint32_t pos; /* index into the request's keys */
    uint32_t pad;
    struct kvc_wire_loc loc;
};
struct kvc_lookup_budget_rep {
    uint32_t nsel;
    uint32_t nprefix;  /* length of the cached run the selection came from */
    uint64_t lease_id; /* 0 when nsel == 0 */
    /* struct kvc_wire_sel sel[nsel]; with KVC_BUDGET_F_HEADS: uint8_t heads[layers * kv_heads] */
};

/* Layout checks: both ends compile these. */
_Static_assert(sizeof(struct kvc_wire_hint) == 24, "hint layout");
_Static_assert(sizeof(struct kvc_wire_sel) == 32, "sel layout");
_Static_assert(sizeof(struct kvc_hint_heads_req) == 24, "hint heads layout");
_Static_assert(sizeof(struct kvc_lookup_budget_req) == 32, "budget layout");
_Static_assert(sizeof(struct kvc_lookup_budget_req) +
                       KVC_PROTO_MAX_KEYS * sizeof(struct kvc_wire_key) +
                       KVC_PROTO_MAX_QDIM * sizeof(float) + sizeof(struct kvc_msg_hdr) <=
                   KVC_PROTO_MAX_MSG,
               "budgeted lookup fits");
_Static_assert(sizeof(struct kvc_lookup_budget_rep) +
                       KVC_PROTO_MAX_KEYS * sizeof(struct kvc_wire_sel) +
                       sizeof(struct kvc_msg_hdr) <=
                   KVC_PROTO_MAX_MSG,
               "budgeted lookup reply fits");
_Static_assert(sizeof(struct kvc_lookup_budget_rep) +
                       KVC_PROTO_MAX_KEYS * sizeof(struct kvc_wire_sel) + KVC_PROTO_MAX_HINT_HEADS +
                       sizeof(struct kvc_msg_hdr) <=
                   KVC_PROTO_MAX_MSG,
               "budgeted lookup reply with the head profile fits");
_Static_assert(sizeof(struct kvc_admin_req) == 272, "admin layout");
_Static_assert(sizeof(struct kvc_text_rep) == 24, "text layout");
_Static_assert(sizeof(struct kvc_wire_client) == 144, "client layout");
_Static_assert(sizeof(struct kvc_msg_hdr) == 24, "header layout");
_Static_assert(sizeof(struct kvc_wire_loc) == 24, "loc layout");
_Static_assert(sizeof(struct kvc_wire_slot_rep) == 32, "slot layout");
_Static_assert(sizeof(struct kvc_wire_layout) == 152, "layout layout");
_Static_assert(sizeof(struct kvc_wire_stat) == 48, "stat layout");
_Static_assert(sizeof(struct kvc_wire_block) == 72, "block layout");
_Static_assert(sizeof(struct kvc_wire_ns) == 184, "ns layout");
_Static_assert(sizeof(struct kvc_gpu_attach_rep) == 96, "gpu attach layout");
_Static_assert(sizeof(struct kvc_lookup_req) + KVC_PROTO_MAX_KEYS * sizeof(struct kvc_wire_key) +
                       sizeof(struct kvc_msg_hdr) <=
                   KVC_PROTO_MAX_MSG,
               "lookup fits");
_Static_assert(sizeof(struct kvc_reserve_rep) + KVC_PROTO_MAX_KEYS * sizeof(struct kvc_wire_slot_rep) +
                       sizeof(struct kvc_msg_hdr) <=
                   KVC_PROTO_MAX_MSG,
               "reserve reply fits");

#endif
