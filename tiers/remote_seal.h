/*
 * remote_seal.h — sealed records of the remote tier: who may write a block there, and who
 * may read it.
 *
 * DESIGN
 * Anyone who can reach the Redis Cluster can read, write and delete any value in it. A
 * checksum (remote_rec.h) proves a value is whole, not who wrote it. Sealing makes the
 * cluster an untrusted store: every part of a block is encrypted and authenticated with
 * XChaCha20-Poly1305 (libsodium) under keys only the daemons of one deployment hold, so a
 * value a kvcd without the key wrote, or changed, or moved under another Redis key, does not
 * open (a miss, counted), and a tenant who reads the cluster directly sees ciphertext, not
 * KV, model ids, prefix structure or block keys.
 * Keys. The deployment secret (remote.key_file, or systemd's credential kvcd-remote-key) is
 * hashed into a 32-byte master key. A group key comes from the master key and, for
 * namespaces whose section names one ([namespace.PATTERN] remote_key_file), that group's
 * own secret: a kvcd must hold both to read or write the group's blocks. Each namespace
 * then gets three keys from its group key and its layout descriptor (the model id and the
 * whole layout): one names its Redis keys, one seals headers, one seals data. Every
 * derivation is keyed BLAKE2b with its own personalisation, so no key can stand for another.
 * Names. A block's Redis key is "kvc3:" and 32 hex digits of a keyed hash of its block key
 * under the namespace's name key (parts add remote_rec_key_named's suffix): without the
 * key nobody can find a given prompt's blocks, tell which namespace a value is of, or link
 * values of one prefix.
 * A sealed part is REMOTE_SEAL_HDR bytes of header, the part's bytes encrypted, and a
 * REMOTE_SEAL_TAG-byte tag:
 *   [0, 48)     in clear: magic, version 3, header length, algorithm, a random 24-byte nonce
 *   [48, 432)   the part's remote_rec header (remote_rec_encode), encrypted
 *   [432, 448)  its tag; associated data: the clear bytes and what the reader expects of
 *               the value (namespace descriptor, block key, part index, the cut)
 *   data        the part's bytes, encrypted (same nonce, the data key); its associated data:
 *               the clear bytes and the plaintext header
 *   tag         16 bytes
 * So a sealed part opens only under the key, Redis key and position it was written for, and
 * its bytes only with its own header; the plaintext header then goes through every check of
 * remote_rec_check_header, and the bytes through remote_rec_check_data, as unsealed ones do.
 * What sealing cannot stop, anyone who reaches the cluster can still do: delete or replace
 * values (a miss), fill the cluster, and observe value sizes and when they are read or
 * written (docs/remote.md, docs/security.md).
 * Pure functions over memory but remote_seal_private_read and remote_seal_secret_load, which
 * read one file. Any thread.
 */
#ifndef KVC_TIER_REMOTE_SEAL_H
#define KVC_TIER_REMOTE_SEAL_H

#include <stddef.h>
#include <stdint.h>

#include "tiers/remote_rec.h"

#define REMOTE_SEAL_KEY_BYTES 32u
#define REMOTE_SEAL_VERSION 3u
#define REMOTE_SEAL_ALG_XCHACHA20POLY1305 1u
#define REMOTE_SEAL_CLEAR 48u                                                  /* the clear bytes */
#define REMOTE_SEAL_TAG 16u                                                    /* a tag */
#define REMOTE_SEAL_HDR (REMOTE_SEAL_CLEAR + REMOTE_REC_HDR + REMOTE_SEAL_TAG) /* 448 */
#define REMOTE_SEAL_SECRET_MIN 32u   /* bytes of a secret file at least */
#define REMOTE_SEAL_SECRET_MAX 4096u /* and at most */

/* One namespace's keys (remote_seal_ns). Secret: wipe with remote_seal_wipe. */
struct remote_seal {
    uint8_t name[REMOTE_SEAL_KEY_BYTES]; /* names its Redis keys */
    uint8_t hdr[REMOTE_SEAL_KEY_BYTES];  /* seals part headers */
    uint8_t data[REMOTE_SEAL_KEY_BYTES]; /* seals part bytes */
};

/* Initialises libsodium (any number of times, any thread). 0 or -EIO. */
int remote_seal_init(void);

/* Reads a secret file into a 32-byte key (keyed BLAKE2b of its bytes). The file must be a
 * regular file owned by this process's effective user or by root, with no permission for
 * group or others, of REMOTE_SEAL_SECRET_MIN to _MAX bytes. 0, or -errno with a reason in
 * why: -ENOENT, -EACCES (cannot open), -EINVAL (not a regular file), -EPERM (group or others
 * may read or write it, or another user owns it), -EMSGSIZE (too short or too long), -EIO. */
int remote_seal_secret_load(const char *path, uint8_t key[REMOTE_SEAL_KEY_BYTES], char *why,
                            size_t whylen);

/* Reads a private file into buf (cap bytes; at most cap - 1 read): a regular file owned by
 * this process's effective user or by root, with no permission for group or others. *len
 * gets the bytes read. 0, or -errno with a reason in why: -ENOENT, -EACCES (cannot open),
 * -EINVAL (not a regular file), -EPERM (group or others may read or write it, or another
 * user owns it), -EMSGSIZE (cap - 1 bytes or more), -EIO. buf is wiped on error. */
int remote_seal_private_read(const char *path, uint8_t *buf, size_t cap, size_t *len, char *why,
                             size_t whylen);

/* The key of a group: from the master key, and the group's own secret key when it has one
 * (NULL: the deployment's default group). */
void remote_seal_group(const uint8_t master[REMOTE_SEAL_KEY_BYTES], const uint8_t *group_secret,
                       uint8_t group[REMOTE_SEAL_KEY_BYTES]);

/* The keys of the namespace with descriptor ns in a group. */
void remote_seal_ns(const uint8_t group[REMOTE_SEAL_KEY_BYTES],
                    const uint8_t ns[REMOTE_REC_NS_BYTES], struct remote_seal *k);

/* Zeroes keys (not optimised away). */
void remote_seal_wipe(void *p, size_t len);

/* Writes the Redis key of part index of a block (key) cut as g, sealed under k, into buf
 * (REMOTE_REC_KEY_MAX bytes), NUL terminated; returns its length. */
size_t remote_seal_key(char *buf, const struct remote_seal *k, const uint64_t key[2],
                       const struct remote_rec_geom *g, uint32_t index);

/* Seals part index of the block m cut as g: hdr (REMOTE_REC_HDR bytes) is its plaintext
 * header (remote_rec_encode), pt its len bytes. Writes the sealed header to out_hdr
 * (REMOTE_SEAL_HDR bytes), the encrypted bytes to ct (len bytes; ct == pt is allowed) and
 * the tag to tag. nonce: 24 fresh random bytes (remote_seal_nonce). */
void remote_seal_part(uint8_t *out_hdr, uint8_t *ct, uint8_t tag[REMOTE_SEAL_TAG],
                      const uint8_t *hdr, const void *pt, uint64_t len, const struct remote_seal *k,
                      const struct remote_rec_meta *m, const struct remote_rec_geom *g,
                      uint32_t index, const uint8_t nonce[24]);

/* 24 random bytes. */
void remote_seal_nonce(uint8_t nonce[24]);

/* Opens the sealed header of a value of vlen bytes read under the key of part index of the
 * block want cut as g: on success writes its plaintext header to hdr (REMOTE_REC_HDR bytes,
 * still to be checked with remote_rec_check_header) and returns 0. Errors: -EPROTO (shorter
 * than a sealed header and tag, or bad magic: not a record), -EPROTONOSUPPORT (another
 * version, such as an unsealed record, another algorithm or header length, reserved bytes
 * set), -EMSGSIZE (the value's length is not this part's), -EKEYREJECTED (it does not open:
 * written under another key, for another block, part or namespace, or changed). */
int remote_seal_open_header(const uint8_t *sealed, size_t vlen, const struct remote_seal *k,
                            const struct remote_rec_meta *want, const struct remote_rec_geom *g,
                            uint32_t index, uint8_t *hdr);

/* Opens a part's len bytes at data in place, with the sealed header and the plaintext
 * header it came with, and its tag. 0 or -EKEYREJECTED (data is then unspecified). */
int remote_seal_open_data(const uint8_t *sealed, const uint8_t *hdr, const struct remote_seal *k,
                          void *data, uint64_t len, const uint8_t tag[REMOTE_SEAL_TAG]);

#endif
