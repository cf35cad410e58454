/*
 * acl.h — who may use which namespace, and how much: per-namespace access lists, the host
 * arenas they imply, and the quotas of clients and namespaces.
 *
 * DESIGN
 * The rules come from the [namespace.PATTERN] sections (config_ns.h) and the [quota]
 * options. At start acl_new() creates one private host arena per distinct access list, so
 * that a client can be handed exactly the memory of the namespaces it may use: read-write
 * where it may write, a read-only descriptor where it may only read (the kernel then
 * refuses its stores), nothing otherwise. A namespace is bound to its section when it is
 * created and keeps it. Admins (root, the daemon's user, the admin group) pass every list.
 * Quotas are checked before the store is called: a request that would pass a limit is cut
 * to what fits, or refused with -EDQUOT when nothing fits; a namespace over max_bytes first
 * evicts its own coldest blocks. Owned by the loop thread.
 */
#ifndef KVC_ACL_H
#define KVC_ACL_H

#include <stdbool.h>
#include <stdint.h>

struct kvc_wire_layout;

struct config;
struct config_ns;
struct store;
struct store_owner;

#define ACL_GROUPS_MAX 32

/* A connected client as the access rules see it. */
struct acl_peer {
    uint32_t uid, gid;
    uint32_t groups[ACL_GROUPS_MAX]; /* supplementary groups (SO_PEERGROUPS) */
    uint32_t ngroups;
    bool admin;
};

struct acl;

/* Creates the arenas of the access lists in c (borrowed; acl_reload swaps it). NULL and
 * *err = -errno on failure (-ENOSPC: more distinct lists than arenas). */
struct acl *acl_new(struct store *s, const struct config *c, int *err);
void acl_free(struct acl *a); /* NULL is a no-op */
/* Takes the new configuration (only quotas may differ: config_check_reload saw to it). */
void acl_reload(struct acl *a, const struct config *c);

/* KVC_ACCESS_* bits a peer has on the namespace of model_id (existing or not). */
uint32_t acl_access_model(const struct acl *a, const struct acl_peer *p, const char *model_id);
/* Same for an existing namespace (bound by acl_ns_bind). */
uint32_t acl_access(const struct acl *a, const struct acl_peer *p, uint32_t ns_id);
/* The host arena of model_id's section (0: the shared one). */
uint32_t acl_ns_arena(const struct acl *a, const char *model_id);
/* Binds a namespace to its section (access lists, quotas). -EXDEV when it is not in the
 * section's arena, -ENOENT. */
int acl_ns_bind(struct acl *a, uint32_t ns_id);
/* Opens or creates the namespace of l, a new one in its section's arena from the start, and
 * binds it; a namespace that cannot be placed and bound is not created. Errors of
 * store_ns_open_in and acl_ns_bind. Used by NS_OPEN and by the disk tier's adoption. */
int acl_ns_open(struct acl *a, const struct kvc_wire_layout *l, uint32_t *ns_id, bool *created);
/* Forgets the binding of a dropped namespace, so that its id starts clean. NULL a: no-op. */
void acl_ns_unbind(struct acl *a, uint32_t ns_id);
/* Whether a namespace's section has access lists (then its blocks stay out of the shared
 * GPU pool). False for NULL a. */
bool acl_ns_restricted(const struct acl *a, uint32_t ns_id);

/* Quotas. *n is the key count of the request, cut to what the limits allow; 0 or -EDQUOT
 * (nothing fits). */
int acl_quota_lookup(struct acl *a, const struct store_owner *o, uint32_t ns_id, uint32_t *n);
int acl_quota_reserve(struct acl *a, const struct store_owner *o, uint32_t ns_id, uint32_t *n,
                      uint64_t now);

/* Reservations and reserved bytes an owner holds now. */
void acl_owner_reserved(const struct store *s, const struct store_owner *o, uint32_t *nresv,
                        uint64_t *bytes);

/* Whether peer uid/gid/groups is an admin: root, the daemon's euid, or member of admin_gid
 * (when has_admin_gid). */
bool acl_is_admin(uint32_t uid, uint32_t gid, const uint32_t *groups, uint32_t ngroups,
                  bool has_admin_gid, uint32_t admin_gid);

#endif
