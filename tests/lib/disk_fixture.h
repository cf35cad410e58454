/*
 * disk_fixture.h — what the disk tier's suites (check_tier_disk, check_tier_disk_open) share:
 * a directory for their disk files, a tier opened on one, deterministic block bytes and
 * metadata, and a record written or read to completion.
 *
 * DESIGN
 * disk_suite_run() picks the directory once per run: one that takes O_DIRECT (tmpfs before
 * Linux 6.6 does not: $KVC_TEST_DISK_DIR, /var/tmp, the build directory, /tmp), else /tmp with
 * buffered I/O, which the suite reports as a skip of its O_DIRECT path (a failure under
 * KVC_REQUIRE_ODIRECT=1). disk_open() asserts that the tier runs buffered exactly when the
 * directory does not take O_DIRECT. Check forks every case from main(), so disk_path's
 * counter starts over in each case; disk_fresh_path() adds the pid for a name of the case
 * alone, with nothing left there from an earlier run.
 */
#ifndef KVC_TESTS_DISK_FIXTURE_H
#define KVC_TESTS_DISK_FIXTURE_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tiers/disk.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024)

extern char disk_dir[256];
extern int disk_seq;
extern bool disk_buffered; /* no directory here takes O_DIRECT: the tier runs buffered */

/* Picks the directory, runs the suite (named `name` in its SKIP lines) and removes the
 * directory: main()'s exit status. */
int disk_suite_run(Suite *s, const char *name);

/* A new file name in disk_dir (unique within the case). */
void disk_path(char *buf, size_t len);
/* A file name of this case's process alone, with no file or checkpoint left there. */
void disk_fresh_path(char *buf, size_t len);

/* What a scan at open found (up to 64 records). */
struct found {
    int n;
    struct tier_disk_meta m[64];
    struct tier_loc loc[64];
};
/* The scan callback that fills a struct found. */
int disk_found_cb(void *arg, const struct tier_disk_meta *m, const struct tier_loc *loc);
/* Whether key k was found: 1 or 0. */
int disk_found_has(const struct found *f, uint64_t k);

/* A disk tier of `size` bytes in pages of `page` on path (queue depth 32), its scan into f
 * when f is not NULL; asserts it opened, buffered exactly when disk_buffered. */
struct tier *disk_open(const char *path, uint64_t size, uint64_t page, struct found *f);

/* A completion: how many callbacks, the last status. */
struct done {
    int calls, status;
};
void disk_done_cb(void *arg, int status);

/* Deterministic block bytes for a seed. */
void disk_fill(uint8_t *p, size_t n, unsigned seed);
/* The metadata of record k: key {k, ~k}, parent {k-1, ~(k-1)}, depth k, namespace "model-7". */
struct tier_disk_meta disk_meta(uint64_t k, uint64_t len);
/* Writes (reads) one record and drains the tier: the callback's status, or the call's error. */
int disk_put(struct tier *t, const struct tier_loc *loc, const struct tier_disk_meta *m,
             const void *src);
int disk_get(struct tier *t, const struct tier_loc *loc, const struct tier_disk_meta *m, void *dst,
             uint64_t len);

#endif
