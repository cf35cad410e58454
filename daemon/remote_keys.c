/*
 * remote_keys.c — the remote tier's secrets (daemon/remote_keys.h).
 */
#include "daemon/remote_keys.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/config_ns.h"

#define REMOTE_KEYS_PASSWORD_MAX 512

struct remote_keys {
    bool sealed;
    char password[REMOTE_KEYS_PASSWORD_MAX];
    uint8_t deflt[REMOTE_SEAL_KEY_BYTES]; /* the default group's key */
    size_t ngroups;
    uint8_t (*groups)[REMOTE_SEAL_KEY_BYTES]; /* per [namespace.PATTERN] section */
};

/* $CREDENTIALS_DIRECTORY/name into path when systemd passed that credential: 1, else 0. */
static int remote_keys_credential(const char *name, char *path, size_t len)
{
    const char *dir = getenv("CREDENTIALS_DIRECTORY");
    int n;
    if (!dir || !*dir)
        return 0;
    n = snprintf(path, len, "%s/%s", dir, name);
    return n > 0 && (size_t)n < len && access(path, F_OK) == 0;
}

/* The password: remote.password, else the first line of password_file or the credential. */
static int remote_keys_password_load(struct remote_keys *k, const struct config *c, char *err,
                                     size_t errlen)
{
    char path[4096];
    const char *file = c->remote_password_file;
    uint8_t buf[REMOTE_KEYS_PASSWORD_MAX];
    size_t len;
    int rc;
    if (c->remote_password[0] && c->remote_password_file[0]) {
        snprintf(err, errlen, "remote.password and remote.password_file are both set; keep one");
        return -EINVAL;
    }
    if (c->remote_password[0]) {
        snprintf(k->password, sizeof(k->password), "%s", c->remote_password);
        return 0;
    }
    if (!file[0] && remote_keys_credential(REMOTE_KEYS_CRED_PASSWORD, path, sizeof(path)))
        file = path;
    if (!file[0])
        return 0;
    rc = remote_seal_private_read(file, buf, sizeof(buf), &len, err, errlen);
    if (rc)
        return rc;
    len = strcspn((const char *)buf, "\r\n") < len ? strcspn((const char *)buf, "\r\n") : len;
    if (memchr(buf, '\0', len)) {
        snprintf(err, errlen, "%s: the password holds a NUL byte", file);
        remote_seal_wipe(buf, sizeof(buf));
        return -EINVAL;
    }
    memcpy(k->password, buf, len);
    k->password[len] = '\0';
    remote_seal_wipe(buf, sizeof(buf));
    return 0;
}

struct remote_keys *remote_keys_load(const struct config *c, int *rc, char *err, size_t errlen)
{
    struct remote_keys *k = calloc(1, sizeof(*k));
    uint8_t master[REMOTE_SEAL_KEY_BYTES], group[REMOTE_SEAL_KEY_BYTES];
    char path[4096];
    const char *file = c->remote_key_file;

    err[0] = '\0';
    *rc = -ENOMEM;
    if (!k)
        return NULL;
    k->sealed = c->remote_seal;
    *rc = remote_keys_password_load(k, c, err, errlen);
    if (*rc)
        goto fail;
    if (!k->sealed)
        return k;
    if (!file[0] && remote_keys_credential(REMOTE_KEYS_CRED_KEY, path, sizeof(path)))
        file = path;
    if (!file[0]) {
        *rc = -EINVAL;
        snprintf(err, errlen,
                 "remote.seal needs the deployment secret: set remote.key_file (or pass the "
                 "credential " REMOTE_KEYS_CRED_KEY "), or remote.seal = no");
        goto fail;
    }
    *rc = remote_seal_secret_load(file, master, err, errlen);
    if (*rc)
        goto fail;
    remote_seal_group(master, NULL, k->deflt);
    k->ngroups = c->ns.n;
    k->groups = calloc(c->ns.n ? c->ns.n : 1, sizeof(*k->groups));
    *rc = -ENOMEM;
    if (!k->groups)
        goto fail_master;
    for (size_t i = 0; i < c->ns.n; i++) {
        if (!c->ns.sec[i].remote_key_file[0]) {
            memcpy(k->groups[i], k->deflt, sizeof(k->deflt));
            continue;
        }
        *rc = remote_seal_secret_load(c->ns.sec[i].remote_key_file, group, err, errlen);
        if (*rc)
            goto fail_master;
        remote_seal_group(master, group, k->groups[i]);
    }
    remote_seal_wipe(group, sizeof(group));
    remote_seal_wipe(master, sizeof(master));
    *rc = 0;
    return k;
fail_master:
    remote_seal_wipe(group, sizeof(group));
    remote_seal_wipe(master, sizeof(master));
fail:
    remote_keys_free(k);
    return NULL;
}

void remote_keys_free(struct remote_keys *k)
{
    if (!k)
        return;
    if (k->groups)
        remote_seal_wipe(k->groups, k->ngroups * sizeof(*k->groups));
    free(k->groups);
    remote_seal_wipe(k, sizeof(*k));
    free(k);
}

const char *remote_keys_password(const struct remote_keys *k)
{
    return k->password;
}

bool remote_keys_sealed(const struct remote_keys *k)
{
    return k->sealed;
}

int remote_keys_ns(const struct remote_keys *k, const struct config *c, const char *model_id,
                   const uint8_t ns[REMOTE_REC_NS_BYTES], struct remote_seal *seal)
{
    size_t idx = 0;
    const struct config_ns *sec;
    if (!config_ns_remote(&c->ns, c->remote_seal, model_id))
        return 0;
    if (!k->sealed)
        return 1;
    sec = config_ns_match(&c->ns, model_id, &idx);
    /* Sections cannot be added or removed by a reload: the index is the one read at start. */
    remote_seal_ns(sec && idx < k->ngroups ? k->groups[idx] : k->deflt, ns, seal);
    return 1;
}
