/*
 * proto.c — see proto.h.
 *
 * DESIGN
 * Each opcode has a fixed body and, for the batched ones, a trailing array whose count sits
 * in the body; the payload length must equal body + count * entry exactly, so nothing is
 * read past the datagram and nothing trailing is ignored. A batch may not name one key twice:
 * a chain never repeats a key, and a repeat would only multiply the work (and the pins) one
 * message buys.
 */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/random.h>

#include "client/kvc_fast.h"
#include "daemon/proto.h"
#include "policies/policy.h"

struct proto_shape {
    uint32_t body;       /* bytes of the fixed part */
    uint32_t entry;      /* bytes per tail entry, 0 if none */
    uint32_t count_off;  /* offset of the uint32 count inside the body */
    uint32_t max;        /* most tail entries */
};

static const struct proto_shape proto_shapes[KVC_OP_MAX] = {
    [KVC_OP_HELLO] = {sizeof(struct kvc_hello_req), 0, 0, 0},
    [KVC_OP_NS_OPEN] = {sizeof(struct kvc_ns_open_req), 0, 0, 0},
    [KVC_OP_LOOKUP] = {sizeof(struct kvc_lookup_req), sizeof(struct kvc_wire_key),
                       offsetof(struct kvc_lookup_req, nkeys), KVC_PROTO_MAX_KEYS},
    [KVC_OP_RELEASE] = {sizeof(struct kvc_release_req), sizeof(uint64_t),
                        offsetof(struct kvc_release_req, nleases), KVC_PROTO_MAX_LEASES},
    [KVC_OP_RESERVE] = {sizeof(struct kvc_reserve_req), sizeof(struct kvc_wire_key),
                        offsetof(struct kvc_reserve_req, nkeys), KVC_PROTO_MAX_KEYS},
    [KVC_OP_COMMIT] = {sizeof(struct kvc_commit_req), 0, 0, 0},
    [KVC_OP_ABORT] = {sizeof(struct kvc_abort_req), 0, 0, 0},
    [KVC_OP_STATS] = {sizeof(struct kvc_stats_req), 0, 0, 0},
    [KVC_OP_NS_LIST] = {sizeof(struct kvc_ns_list_req), 0, 0, 0},
    [KVC_OP_BLOCK_LIST] = {sizeof(struct kvc_block_list_req), 0, 0, 0},
#define PROTO_ADMIN_SHAPE(name) [KVC_OP_##name] = {sizeof(struct kvc_admin_req), 0, 0, 0},
    PROTO_ADMIN_SHAPE(CLIENTS) PROTO_ADMIN_SHAPE(METRICS) PROTO_ADMIN_SHAPE(CONFIG_GET)
        PROTO_ADMIN_SHAPE(CONFIG_SET) PROTO_ADMIN_SHAPE(RELOAD) PROTO_ADMIN_SHAPE(POLICY_GET)
            PROTO_ADMIN_SHAPE(POLICY_SET) PROTO_ADMIN_SHAPE(EVICT) PROTO_ADMIN_SHAPE(SHUTDOWN)
                PROTO_ADMIN_SHAPE(NS_DROP)
#undef PROTO_ADMIN_SHAPE
                    [KVC_OP_WAIT] = {sizeof(struct kvc_wait_req), 0, 0, 0},
    [KVC_OP_GPU_ATTACH] = {sizeof(struct kvc_gpu_attach_req), 0, 0, 0},
    [KVC_OP_FAST_ATTACH] = {sizeof(struct kvc_fast_attach_req), 0, 0, 0},
    [KVC_OP_SYNC] = {sizeof(struct kvc_sync_req), 0, 0, 0},
    [KVC_OP_HINT] = {sizeof(struct kvc_hint_req), sizeof(struct kvc_wire_hint),
                     offsetof(struct kvc_hint_req, nhints), KVC_PROTO_MAX_KEYS},
    /* keys, then nhints * layers * heads floats: the length is checked in proto_decode() */
    [KVC_OP_HINT_HEADS] = {sizeof(struct kvc_hint_heads_req), sizeof(struct kvc_wire_key),
                           offsetof(struct kvc_hint_heads_req, nhints), KVC_PROTO_MAX_KEYS},
    /* keys, then qdim floats: the length is checked in proto_decode_budget() */
    [KVC_OP_LOOKUP_BUDGET] = {sizeof(struct kvc_lookup_budget_req), sizeof(struct kvc_wire_key),
                              offsetof(struct kvc_lookup_budget_req, nkeys), KVC_PROTO_MAX_KEYS},
};

const char *proto_op_name(uint32_t op)
{
    switch (op) {
#define PROTO_OP_NAME(name, num, admin, help)                                                  \
    case num:                                                                                  \
        return #name;
        KVC_OPCODES(PROTO_OP_NAME)
#undef PROTO_OP_NAME
    default:
        return "?";
    }
}

int proto_op_admin(uint32_t op)
{
    switch (op) {
#define PROTO_OP_ADMIN(name, num, admin, help)                                                 \
    case num:                                                                                  \
        return admin;
        KVC_OPCODES(PROTO_OP_ADMIN)
#undef PROTO_OP_ADMIN
    default:
        return 0;
    }
}

/* ---- repeated keys --------------------------------------------------------------------- */

#define PROTO_DUP_SLOTS (2 * KVC_PROTO_MAX_KEYS) /* a power of two, load <= 0.5 */

static uint64_t proto_dup_seed;

static uint32_t proto_key_slot(const struct kvc_wire_key *k, uint32_t mask)
{
    uint64_t h = (k->lo ^ proto_dup_seed) * 0x9e3779b97f4a7c15ull;
    h ^= k->hi + (h >> 29);
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return (uint32_t)h & mask;
}

bool proto_keys_zero(const void *keys, uint32_t n, size_t stride)
{
    const char *base = keys;
    for (uint32_t i = 0; i < n; i++) {
        struct kvc_wire_key k;
        memcpy(&k, base + i * stride, sizeof(k));
        if ((k.lo | k.hi) == 0)
            return true;
    }
    return false;
}

bool proto_keys_repeat(const void *keys, uint32_t n, size_t stride)
{
    uint16_t set[PROTO_DUP_SLOTS]; /* index + 1 of the key in the slot, 0 empty */
    const char *base = keys;
    uint32_t mask = 15;
    if (n < 2)
        return false;
    if (n <= 8) {
        for (uint32_t i = 1; i < n; i++)
            for (uint32_t j = 0; j < i; j++)
                if (memcmp(base + i * stride, base + j * stride, sizeof(struct kvc_wire_key)) == 0)
                    return true;
        return false;
    }
    if (!proto_dup_seed && getrandom(&proto_dup_seed, sizeof(proto_dup_seed), 0) !=
                               (ssize_t)sizeof(proto_dup_seed))
        proto_dup_seed = (uint64_t)(uintptr_t)&proto_dup_seed ^ 0x2545f4914f6cdd1dull;
    while (mask + 1 < 2 * n && mask + 1 < PROTO_DUP_SLOTS)
        mask = mask * 2 + 1;
    memset(set, 0, (mask + 1) * sizeof(set[0]));
    for (uint32_t i = 0; i < n; i++) {
        struct kvc_wire_key k;
        memcpy(&k, base + i * stride, sizeof(k));
        for (uint32_t s = proto_key_slot(&k, mask);; s = (s + 1) & mask) {
            struct kvc_wire_key o;
            if (!set[s]) {
                set[s] = (uint16_t)(i + 1);
                break;
            }
            memcpy(&o, base + (set[s] - 1) * stride, sizeof(o));
            if (o.lo == k.lo && o.hi == k.hi)
                return true;
        }
    }
    return false;
}

/* Fields every request must leave zero, and other per-opcode rules. */
static int proto_check_body(uint32_t op, const void *body, const char **why)
{
    switch (op) {
    case KVC_OP_LOOKUP: {
        const struct kvc_lookup_req *q = body;
        /* base is the namespace's to judge (server: KV_WINDOW namespaces only) */
        if (q->flags & ~(KVC_LOOKUP_F_READY_ONLY | KVC_LOOKUP_F_GPU | KVC_LOOKUP_F_LOCAL |
                         KVC_LOOKUP_F_NOWAIT))
            goto reserved;
        break;
    }
    case KVC_OP_RESERVE: {
        const struct kvc_reserve_req *q = body;
        if ((q->flags & ~KVC_RESERVE_F_GPU) || q->pad)
            goto reserved;
        break;
    }
    case KVC_OP_COMMIT:
        if (((const struct kvc_commit_req *)body)->flags & ~KVC_COMMIT_F_QUIET)
            goto reserved;
        break;
    case KVC_OP_STATS:
        if (((const struct kvc_stats_req *)body)->pad)
            goto reserved;
        break;
    case KVC_OP_SYNC:
        if (((const struct kvc_sync_req *)body)->flags || ((const struct kvc_sync_req *)body)->pad)
            goto reserved;
        break;
    case KVC_OP_NS_LIST:
        if (((const struct kvc_ns_list_req *)body)->pad)
            goto reserved;
        break;
    case KVC_OP_WAIT:
        if (((const struct kvc_wait_req *)body)->pad)
            goto reserved;
        break;
    case KVC_OP_GPU_ATTACH: {
        const struct kvc_gpu_attach_req *q = body;
        if ((q->flags & ~KVC_GPU_ATTACH_F_MAPPED) || q->pad)
            goto reserved;
        break;
    }
    case KVC_OP_FAST_ATTACH: {
        const struct kvc_fast_attach_req *q = body;
        if (q->what < KVC_FAST_INDEX || q->what > KVC_FAST_BELL) {
            *why = "unknown FAST_ATTACH kind";
            return -EINVAL;
        }
        if (q->what != KVC_FAST_INDEX && q->arena_id)
            goto reserved;
        break;
    }
    case KVC_OP_HINT: {
        const struct kvc_hint_req *q = body;
        const struct kvc_wire_hint *h = (const struct kvc_wire_hint *)(q + 1);
        if (q->pad)
            goto reserved;
        if (q->kind != KVC_HINT_H2O && q->kind != KVC_HINT_SNAPKV) {
            *why = "unknown hint kind";
            return -EINVAL;
        }
        for (uint32_t i = 0; i < q->nhints; i++) {
            if (h[i].pad)
                goto reserved;
            if (!isfinite(h[i].score) || h[i].score < 0) {
                *why = "hint score not finite or negative";
                return -EINVAL;
            }
        }
        break;
    }
    case KVC_OP_HINT_HEADS: {
        const struct kvc_hint_heads_req *q = body;
        if (q->pad)
            goto reserved;
        if (q->kind != KVC_HINT_H2O && q->kind != KVC_HINT_SNAPKV) {
            *why = "unknown hint kind";
            return -EINVAL;
        }
        break;
    }
    case KVC_OP_LOOKUP_BUDGET: {
        const struct kvc_lookup_budget_req *q = body;
        if (q->flags & ~KVC_BUDGET_F_HEADS)
            goto reserved;
        if (q->budget == 0) {
            *why = "budget is 0";
            return -EINVAL;
        }
        if (q->policy != KVC_POLICY_NS && q->policy >= POLICY_KIND_COUNT) {
            *why = "unknown policy";
            return -EINVAL;
        }
        break;
    }
    case KVC_OP_BLOCK_LIST:
        if (((const struct kvc_block_list_req *)body)->max == 0) {
            *why = "max is 0";
            return -EINVAL;
        }
        break;
    case KVC_OP_CLIENTS ... KVC_OP_NS_DROP: {
        const struct kvc_admin_req *q = body;
        if (!memchr(q->key, 0, sizeof(q->key)) || !memchr(q->value, 0, sizeof(q->value))) {
            *why = "key or value not NUL-terminated";
            return -EINVAL;
        }
        break;
    }
    default:
        break;
    }
    return 0;
reserved:
    *why = "reserved field not zero";
    return -EINVAL;
}

int proto_decode(const void *buf, size_t n, struct proto_req *r, const char **why)
{
    const struct kvc_msg_hdr *h = buf;
    const struct proto_shape *sh;
    uint32_t count = 0;
    memset(r, 0, sizeof(*r));
    *why = NULL;
    if (n < sizeof(*h)) {
        *why = "shorter than a header";
        return -EPROTO;
    }
    if (h->magic != KVC_PROTO_MAGIC) {
        *why = "bad magic";
        return -EPROTO;
    }
    if (h->version != KVC_PROTO_VERSION) {
        *why = "unsupported protocol version";
        return -EPROTO;
    }
    r->hdr = h;
    if (h->len != n - sizeof(*h)) {
        *why = "payload length does not match the datagram";
        return -EBADMSG;
    }
    if (h->status || (h->flags & ~KVC_MSG_F_QUIET)) {
        *why = "request header status/flags not zero";
        return -EINVAL;
    }
    if (h->opcode == 0 || h->opcode >= KVC_OP_MAX || proto_shapes[h->opcode].body == 0) {
        *why = "unknown opcode";
        return -EOPNOTSUPP;
    }
    if ((h->flags & KVC_MSG_F_QUIET) && h->opcode != KVC_OP_RELEASE) {
        *why = "KVC_MSG_F_QUIET on a request that is always answered";
        return -EINVAL;
    }
    sh = &proto_shapes[h->opcode];
    if (h->len < sh->body) {
        *why = "payload shorter than the request body";
        return -EBADMSG;
    }
    r->body = (const char *)buf + sizeof(*h);
    if (h->opcode == KVC_OP_LOOKUP_BUDGET) {
        const struct kvc_lookup_budget_req *q = r->body;
        const float *v;
        if (q->nkeys == 0) {
            *why = "empty batch";
            return -EINVAL;
        }
        if (q->nkeys > KVC_PROTO_MAX_KEYS || q->qdim > KVC_PROTO_MAX_QDIM) {
            *why = "more keys or query floats than the protocol allows";
            return -E2BIG;
        }
        if ((uint64_t)h->len != sh->body + (uint64_t)q->nkeys * sh->entry +
                                    (uint64_t)q->qdim * sizeof(float)) {
            *why = "payload length does not match the key and query counts";
            return -EBADMSG;
        }
        r->tail = (const char *)r->body + sh->body;
        r->ntail = q->nkeys;
        r->tail2 = q->qdim ? (const char *)r->tail + (size_t)q->nkeys * sh->entry : NULL;
        r->ntail2 = q->qdim;
        v = r->tail2;
        for (uint32_t i = 0; i < q->qdim; i++)
            if (!isfinite(v[i])) {
                *why = "query not finite";
                return -EINVAL;
            }
    } else if (h->opcode == KVC_OP_HINT_HEADS) {
        const struct kvc_hint_heads_req *q = r->body;
        uint64_t lh = (uint64_t)q->layers * q->heads, nf;
        const float *v;
        if (q->nhints == 0) {
            *why = "empty batch";
            return -EINVAL;
        }
        if (q->layers == 0 || q->heads == 0) {
            *why = "hint heads: layers or heads is 0";
            return -EINVAL;
        }
        if (q->nhints > KVC_PROTO_MAX_KEYS || lh > KVC_PROTO_MAX_HINT_HEADS) {
            *why = "more keys or heads per block than the protocol allows";
            return -E2BIG;
        }
        nf = (uint64_t)q->nhints * lh;
        if ((uint64_t)h->len != sh->body + (uint64_t)q->nhints * sh->entry + nf * sizeof(float)) {
            *why = "payload length does not match the key and head counts";
            return -EBADMSG;
        }
        r->tail = (const char *)r->body + sh->body;
        r->ntail = q->nhints;
        r->tail2 = (const char *)r->tail + (size_t)q->nhints * sh->entry;
        r->ntail2 = (uint32_t)nf;
        v = r->tail2;
        /* Bounded too: summed over blocks into the namespace's head masses, scores near
         * FLT_MAX made a mass infinite, which no aging brings back (one reader fixing the
         * namespace's head profiles for good). */
        for (uint64_t i = 0; i < nf; i++)
            if (!isfinite(v[i]) || v[i] < 0 || v[i] > KVC_PROTO_MAX_HINT_SCORE) {
                *why = "hint score not finite, negative or above 1e9";
                return -EINVAL;
            }
    } else if (sh->entry) {
        memcpy(&count, (const char *)r->body + sh->count_off, sizeof(count));
        if (count == 0) {
            *why = "empty batch";
            return -EINVAL;
        }
        if (count > sh->max) {
            *why = "batch larger than the protocol allows";
            return -E2BIG;
        }
        if ((uint64_t)h->len != sh->body + (uint64_t)count * sh->entry) {
            *why = "payload length does not match the batch count";
            return -EBADMSG;
        }
        r->tail = (const char *)r->body + sh->body;
        r->ntail = count;
    } else if (h->len != sh->body) {
        *why = "payload length does not match the request";
        return -EBADMSG;
    }
    int rc = proto_check_body(h->opcode, r->body, why);
    /* All-zero means "no parent" (kvc_proto.h): as a block's own key it would hang every
     * root of its namespace from that block (a tree the store cannot keep: found by
     * fuzz_server, tests/fuzz/crashes/server-zero-key-in-chain). */
    if (rc == 0 && r->ntail &&
        (h->opcode == KVC_OP_LOOKUP || h->opcode == KVC_OP_RESERVE ||
         h->opcode == KVC_OP_LOOKUP_BUDGET || h->opcode == KVC_OP_HINT ||
         h->opcode == KVC_OP_HINT_HEADS) &&
        proto_keys_zero(r->tail, r->ntail, sh->entry)) {
        *why = "an all-zero key (it means no parent)";
        rc = -EINVAL;
    }
    if (rc == 0 && r->ntail > 1 &&
        (h->opcode == KVC_OP_LOOKUP || h->opcode == KVC_OP_RESERVE ||
         h->opcode == KVC_OP_LOOKUP_BUDGET || h->opcode == KVC_OP_HINT ||
         h->opcode == KVC_OP_HINT_HEADS) &&
        proto_keys_repeat(r->tail, r->ntail, sh->entry)) {
        r->dup_key = true;
        *why = "a key repeated within the batch";
        rc = -EINVAL;
    }
    return rc;
}
