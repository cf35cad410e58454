/*
 * remote_seal.c — keys, names and the sealing of the remote tier's records
 * (tiers/remote_seal.h).
 */
#include "tiers/remote_seal.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(crypto_aead_xchacha20poly1305_ietf_ABYTES == REMOTE_SEAL_TAG, "tag size");
_Static_assert(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES == 24, "nonce size");
_Static_assert(crypto_aead_xchacha20poly1305_ietf_KEYBYTES == REMOTE_SEAL_KEY_BYTES, "key size");
_Static_assert(crypto_generichash_blake2b_PERSONALBYTES == 16, "personalisation size");

/* The clear bytes' layout: byte offsets. */
enum {
    REMOTE_SEAL_O_MAGIC = 0,                                   /* u32: REMOTE_REC_MAGIC */
    REMOTE_SEAL_O_VERSION = 4,                                 /* u16: REMOTE_SEAL_VERSION */
    REMOTE_SEAL_O_HDRLEN = 6,                                  /* u16: REMOTE_SEAL_HDR */
    REMOTE_SEAL_O_ALG = 8,                                     /* u32: REMOTE_SEAL_ALG_* */
    REMOTE_SEAL_O_NONCE = 16,                                  /* 24 bytes */
    REMOTE_SEAL_O_HDRCT = REMOTE_SEAL_CLEAR,                   /* the header, encrypted */
    REMOTE_SEAL_O_HDRTAG = REMOTE_SEAL_CLEAR + REMOTE_REC_HDR, /* its tag */
};
/* Zero: [12, 16) and [40, 48). */

/* What the reader expects of a value, bound into its header's tag: the clear bytes, then
 * the namespace descriptor, the block key, the part's index, the cut. */
#define REMOTE_SEAL_AD_HDR (REMOTE_SEAL_CLEAR + REMOTE_REC_NS_BYTES + 16 + 4 + 4 + 8 + 8)
/* The data's: the clear bytes and the plaintext header. */
#define REMOTE_SEAL_AD_DATA (REMOTE_SEAL_CLEAR + REMOTE_REC_HDR)

static void remote_seal_put16(uint8_t *p, uint16_t v)
{
    memcpy(p, &v, sizeof(v));
}

static void remote_seal_put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, sizeof(v));
}

static void remote_seal_put64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, sizeof(v));
}

static uint16_t remote_seal_get16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static uint32_t remote_seal_get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

int remote_seal_init(void)
{
    return sodium_init() < 0 ? -EIO : 0;
}

void remote_seal_wipe(void *p, size_t len)
{
    sodium_memzero(p, len);
}

/* ---- keys ------------------------------------------------------------------------------ */

/* out = BLAKE2b-256 of msg, keyed with key (NULL: none), personalised with the 16 bytes of
 * pers, a 15-character name and its NUL (each derivation its own). */
static void remote_seal_hash(uint8_t *out, size_t outlen, const void *msg, size_t len,
                             const uint8_t *key, const char *pers)
{
    crypto_generichash_blake2b_salt_personal(out, outlen, msg, len, key,
                                             key ? REMOTE_SEAL_KEY_BYTES : 0, NULL,
                                             (const unsigned char *)pers);
}

__attribute__((format(printf, 3, 4))) static void remote_seal_why(char *why, size_t whylen,
                                                                  const char *fmt, ...)
{
    va_list ap;
    if (!why || !whylen)
        return;
    va_start(ap, fmt);
    vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
}

int remote_seal_private_read(const char *path, uint8_t *buf, size_t cap, size_t *len, char *why,
                             size_t whylen)
{
    struct stat st;
    int rc = 0, fd;

    *len = 0;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        rc = -errno;
        remote_seal_why(why, whylen, "%s: %s", path, strerror(-rc));
        return rc;
    }
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        remote_seal_why(why, whylen, "%s: %s", path, strerror(-rc));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = -EINVAL;
        remote_seal_why(why, whylen, "%s: not a regular file", path);
        goto out;
    }
    if (st.st_mode & 077) {
        rc = -EPERM;
        remote_seal_why(why, whylen,
                        "%s: mode %04o lets group or others read or write it (chmod 0600)", path,
                        (unsigned)(st.st_mode & 07777));
        goto out;
    }
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        rc = -EPERM;
        remote_seal_why(why, whylen, "%s: owned by uid %u, not by kvcd's user (%u) or root", path,
                        (unsigned)st.st_uid, (unsigned)geteuid());
        goto out;
    }
    for (;;) {
        ssize_t r = read(fd, buf + *len, cap - *len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            remote_seal_why(why, whylen, "%s: %s", path, strerror(-rc));
            goto out;
        }
        if (r == 0)
            break;
        *len += (size_t)r;
        if (*len == cap) {
            rc = -EMSGSIZE;
            remote_seal_why(why, whylen, "%s: longer than %zu bytes", path, cap - 1);
            goto out;
        }
    }
out:
    if (rc) {
        sodium_memzero(buf, cap);
        *len = 0;
    }
    close(fd);
    return rc;
}

int remote_seal_secret_load(const char *path, uint8_t key[REMOTE_SEAL_KEY_BYTES], char *why,
                            size_t whylen)
{
    uint8_t buf[REMOTE_SEAL_SECRET_MAX + 1];
    size_t len;
    int rc;

    if (remote_seal_init())
        return -EIO;
    rc = remote_seal_private_read(path, buf, sizeof(buf), &len, why, whylen);
    if (rc == 0 && len < REMOTE_SEAL_SECRET_MIN) {
        rc = -EMSGSIZE;
        remote_seal_why(why, whylen,
                        "%s: %zu bytes of secret, fewer than %u (e.g. head -c 32 /dev/urandom)",
                        path, len, REMOTE_SEAL_SECRET_MIN);
    }
    if (rc == 0)
        remote_seal_hash(key, REMOTE_SEAL_KEY_BYTES, buf, len, NULL, "kvcd-rseal-secr");
    sodium_memzero(buf, sizeof(buf));
    return rc;
}

void remote_seal_group(const uint8_t master[REMOTE_SEAL_KEY_BYTES], const uint8_t *group_secret,
                       uint8_t group[REMOTE_SEAL_KEY_BYTES])
{
    static const uint8_t none[REMOTE_SEAL_KEY_BYTES];
    uint8_t msg[1 + REMOTE_SEAL_KEY_BYTES];
    msg[0] = group_secret != NULL; /* a group of its own never equals the default group */
    memcpy(msg + 1, group_secret ? group_secret : none, REMOTE_SEAL_KEY_BYTES);
    remote_seal_hash(group, REMOTE_SEAL_KEY_BYTES, msg, sizeof(msg), master, "kvcd-rseal-grup");
    sodium_memzero(msg, sizeof(msg));
}

void remote_seal_ns(const uint8_t group[REMOTE_SEAL_KEY_BYTES],
                    const uint8_t ns[REMOTE_REC_NS_BYTES], struct remote_seal *k)
{
    remote_seal_hash(k->name, sizeof(k->name), ns, REMOTE_REC_NS_BYTES, group, "kvcd-rseal-name");
    remote_seal_hash(k->hdr, sizeof(k->hdr), ns, REMOTE_REC_NS_BYTES, group, "kvcd-rseal-head");
    remote_seal_hash(k->data, sizeof(k->data), ns, REMOTE_REC_NS_BYTES, group, "kvcd-rseal-data");
}

/* ---- names --------------------------------------------------------------------------- */

size_t remote_seal_key(char *buf, const struct remote_seal *k, const uint64_t key[2],
                       const struct remote_rec_geom *g, uint32_t index)
{
    static const char hex[] = "0123456789abcdef";
    uint8_t msg[16], h[16];
    size_t n = 5;
    memcpy(msg, &key[0], 8);
    memcpy(msg + 8, &key[1], 8);
    remote_seal_hash(h, sizeof(h), msg, sizeof(msg), k->name, "kvcd-rseal-rkey");
    memcpy(buf, "kvc3:", 5);
    for (size_t i = 0; i < sizeof(h); i++) {
        buf[n++] = hex[h[i] >> 4];
        buf[n++] = hex[h[i] & 0xf];
    }
    buf[n] = '\0';
    return remote_rec_key_named(buf, n, g, index);
}

/* ---- sealing ------------------------------------------------------------------------- */

void remote_seal_nonce(uint8_t nonce[24])
{
    randombytes_buf(nonce, 24);
}

/* The header's associated data: the clear bytes at sealed, then what the reader expects. */
static void remote_seal_ad_hdr(uint8_t *ad, const uint8_t *sealed, const struct remote_rec_meta *m,
                               const struct remote_rec_geom *g, uint32_t index)
{
    uint8_t *p = ad;
    memcpy(p, sealed, REMOTE_SEAL_CLEAR);
    p += REMOTE_SEAL_CLEAR;
    memcpy(p, m->ns, REMOTE_REC_NS_BYTES);
    p += REMOTE_REC_NS_BYTES;
    remote_seal_put64(p, m->key[0]);
    remote_seal_put64(p + 8, m->key[1]);
    p += 16;
    remote_seal_put32(p, index);
    remote_seal_put32(p + 4, g->count);
    remote_seal_put64(p + 8, g->size);
    remote_seal_put64(p + 16, g->len);
}

static void remote_seal_ad_data(uint8_t *ad, const uint8_t *sealed, const uint8_t *hdr)
{
    memcpy(ad, sealed, REMOTE_SEAL_CLEAR);
    memcpy(ad + REMOTE_SEAL_CLEAR, hdr, REMOTE_REC_HDR);
}

void remote_seal_part(uint8_t *out_hdr, uint8_t *ct, uint8_t tag[REMOTE_SEAL_TAG],
                      const uint8_t *hdr, const void *pt, uint64_t len, const struct remote_seal *k,
                      const struct remote_rec_meta *m, const struct remote_rec_geom *g,
                      uint32_t index, const uint8_t nonce[24])
{
    uint8_t ad[REMOTE_SEAL_AD_DATA > REMOTE_SEAL_AD_HDR ? REMOTE_SEAL_AD_DATA : REMOTE_SEAL_AD_HDR];
    memset(out_hdr, 0, REMOTE_SEAL_CLEAR);
    remote_seal_put32(out_hdr + REMOTE_SEAL_O_MAGIC, REMOTE_REC_MAGIC);
    remote_seal_put16(out_hdr + REMOTE_SEAL_O_VERSION, (uint16_t)REMOTE_SEAL_VERSION);
    remote_seal_put16(out_hdr + REMOTE_SEAL_O_HDRLEN, (uint16_t)REMOTE_SEAL_HDR);
    remote_seal_put32(out_hdr + REMOTE_SEAL_O_ALG, REMOTE_SEAL_ALG_XCHACHA20POLY1305);
    memcpy(out_hdr + REMOTE_SEAL_O_NONCE, nonce, 24);
    remote_seal_ad_hdr(ad, out_hdr, m, g, index);
    crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
        out_hdr + REMOTE_SEAL_O_HDRCT, out_hdr + REMOTE_SEAL_O_HDRTAG, NULL, hdr, REMOTE_REC_HDR,
        ad, REMOTE_SEAL_AD_HDR, NULL, nonce, k->hdr);
    remote_seal_ad_data(ad, out_hdr, hdr);
    crypto_aead_xchacha20poly1305_ietf_encrypt_detached(ct, tag, NULL, pt, len, ad,
                                                        REMOTE_SEAL_AD_DATA, NULL, nonce, k->data);
}

int remote_seal_open_header(const uint8_t *sealed, size_t vlen, const struct remote_seal *k,
                            const struct remote_rec_meta *want, const struct remote_rec_geom *g,
                            uint32_t index, uint8_t *hdr)
{
    static const uint8_t zero[8];
    uint8_t ad[REMOTE_SEAL_AD_HDR];
    if (!sealed || vlen < REMOTE_SEAL_O_HDRLEN + 2 ||
        remote_seal_get32(sealed + REMOTE_SEAL_O_MAGIC) != REMOTE_REC_MAGIC)
        return -EPROTO;
    if (remote_seal_get16(sealed + REMOTE_SEAL_O_VERSION) != REMOTE_SEAL_VERSION ||
        remote_seal_get16(sealed + REMOTE_SEAL_O_HDRLEN) != REMOTE_SEAL_HDR)
        return -EPROTONOSUPPORT;
    if (vlen < REMOTE_SEAL_HDR + REMOTE_SEAL_TAG)
        return -EPROTO;
    if (remote_seal_get32(sealed + REMOTE_SEAL_O_ALG) != REMOTE_SEAL_ALG_XCHACHA20POLY1305 ||
        memcmp(sealed + 12, zero, 4) != 0 || memcmp(sealed + 40, zero, 8) != 0)
        return -EPROTONOSUPPORT;
    if (index >= g->count || g->len != want->len ||
        vlen - REMOTE_SEAL_HDR - REMOTE_SEAL_TAG != remote_rec_part_len(g, index))
        return -EMSGSIZE;
    remote_seal_ad_hdr(ad, sealed, want, g, index);
    if (crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
            hdr, NULL, sealed + REMOTE_SEAL_O_HDRCT, REMOTE_REC_HDR, sealed + REMOTE_SEAL_O_HDRTAG,
            ad, REMOTE_SEAL_AD_HDR, sealed + REMOTE_SEAL_O_NONCE, k->hdr) != 0) {
        memset(hdr, 0, REMOTE_REC_HDR);
        return -EKEYREJECTED;
    }
    return 0;
}

int remote_seal_open_data(const uint8_t *sealed, const uint8_t *hdr, const struct remote_seal *k,
                          void *data, uint64_t len, const uint8_t tag[REMOTE_SEAL_TAG])
{
    uint8_t ad[REMOTE_SEAL_AD_DATA];
    remote_seal_ad_data(ad, sealed, hdr);
    /* The tag is checked before a byte is decrypted; in place is allowed. */
    return crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
               data, NULL, data, len, tag, ad, REMOTE_SEAL_AD_DATA, sealed + REMOTE_SEAL_O_NONCE,
               k->data) == 0
               ? 0
               : -EKEYREJECTED;
}
