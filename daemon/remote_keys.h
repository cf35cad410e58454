/*
 * remote_keys.h — the remote tier's secrets: the AUTH password, the deployment key and the
 * access groups' keys, read from private files at start.
 *
 * DESIGN
 * Secrets never sit in the option table's values that anyone can read back: the password
 * may (remote.password, a SECRET option, never shown), but the keys come only from files
 * only kvcd's user may read (remote.key_file, [namespace.PATTERN] remote_key_file) or from
 * systemd's credentials ($CREDENTIALS_DIRECTORY/kvcd-remote-key, kvcd-remote-password),
 * read once at start (a reload keeps them: the files named cannot change without a restart).
 * What is kept is the password and, per [namespace.PATTERN] section, the key of its group
 * (tiers/remote_seal.h): a section that names its own secret has a group of its own, every
 * other namespace the deployment's default group. A namespace's three keys are derived from
 * its group's key and its layout when the engine first asks. Wiped at free. Owned by the
 * loop thread.
 */
#ifndef KVC_REMOTE_KEYS_H
#define KVC_REMOTE_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tiers/remote_rec.h"
#include "tiers/remote_seal.h"

struct config;

#define REMOTE_KEYS_CRED_KEY "kvcd-remote-key"
#define REMOTE_KEYS_CRED_PASSWORD "kvcd-remote-password"

struct remote_keys;

/* Reads what c's remote tier needs. NULL with -errno in *rc and a reason in err: -EINVAL
 * (remote.seal without a key, a password given twice), or remote_seal_private_read's errors
 * naming the file; -ENOMEM. */
struct remote_keys *remote_keys_load(const struct config *c, int *rc, char *err, size_t errlen);
void remote_keys_free(struct remote_keys *k); /* NULL is a no-op */

/* The AUTH password ("" none). Borrowed until remote_keys_free. */
const char *remote_keys_password(const struct remote_keys *k);
/* Whether records are sealed. */
bool remote_keys_sealed(const struct remote_keys *k);

/* Whether namespaces of model_id (layout descriptor ns) use the remote tier under c: 1, with
 * their keys in *seal when sealed; 0 when they stay out (config_ns_remote). */
int remote_keys_ns(const struct remote_keys *k, const struct config *c, const char *model_id,
                   const uint8_t ns[REMOTE_REC_NS_BYTES], struct remote_seal *seal);

#endif
