/*
 * proto.h — the daemon's decoder of client requests: every length, count and reserved
 * field is checked here, before any other code sees the message.
 */
#ifndef KVC_DAEMON_PROTO_H
#define KVC_DAEMON_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/kvc_proto.h"

struct proto_req {
    const struct kvc_msg_hdr *hdr;
    const void *body; /* the fixed part of the payload */
    const void *tail; /* the array after it (keys, lease ids) */
    uint32_t ntail;   /* entries in tail */
    const void *tail2; /* LOOKUP_BUDGET: the query vector after the keys, or NULL;
                          HINT_HEADS: the scores after the keys */
    uint32_t ntail2;   /* its floats */
    bool dup_key;      /* refused (-EINVAL) for naming one key twice in its batch */
};

/*
 * Decodes one datagram of n bytes (8-byte aligned). Returns 0 and fills r, or:
 *   -EPROTO     unreadable: too short for a header, bad magic, bad version. Close.
 *   -EBADMSG    header readable, payload length or layout wrong. Reply with the error.
 *   -EOPNOTSUPP unknown opcode. Reply.
 *   -EINVAL     a field out of range (reserved field not zero, count 0), or a key named twice
 *               in one LOOKUP, RESERVE, LOOKUP_BUDGET or HINT (r->dup_key). Reply.
 *   -E2BIG      more keys or leases than one message may carry. Reply.
 * *why names what was wrong.
 */
int proto_decode(const void *buf, size_t n, struct proto_req *r, const char **why);

/* Whether two of the n keys at `keys` (one every `stride` bytes) are equal. O(n): a hash
 * set keyed with a secret drawn at start, so clients cannot aim keys at one bucket. */
/* Whether any of n keys (each at the start of a stride-byte entry) is all-zero. */
bool proto_keys_zero(const void *keys, uint32_t n, size_t stride);
bool proto_keys_repeat(const void *keys, uint32_t n, size_t stride);

/* Whether an opcode is admin-only (the third column of KVC_OPCODES). */
int proto_op_admin(uint32_t op);

/* Name of an opcode ("LOOKUP"), "?" if unknown. */
const char *proto_op_name(uint32_t op);

#endif
