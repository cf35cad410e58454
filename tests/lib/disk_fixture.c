/*
 * disk_fixture.c — see disk_fixture.h.
 */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/lib/disk_fixture.h"

char disk_dir[256];
int disk_seq;
bool disk_buffered;

/* A directory on a file system that takes O_DIRECT (tmpfs before Linux 6.6 does not); when
 * none does, /tmp with buffered I/O, which the suite says (disk_dir_pick_any). */
static void disk_dir_pick(void)
{
    const char *cands[] = {getenv("KVC_TEST_DISK_DIR"), "/var/tmp", KVC_SRC_DIR "/build", "/tmp"};
    for (size_t i = 0; i < sizeof(cands) / sizeof(cands[0]); i++) {
        char probe[300];
        int fd;
        if (!cands[i])
            continue;
        snprintf(disk_dir, sizeof(disk_dir), "%s/kvcd-disk-test-%d", cands[i], (int)getpid());
        if (mkdir(disk_dir, 0700) < 0)
            continue;
        snprintf(probe, sizeof(probe), "%s/probe", disk_dir);
        fd = open(probe, O_RDWR | O_CREAT | O_DIRECT, 0600);
        if (fd >= 0) {
            close(fd);
            unlink(probe);
            return;
        }
        rmdir(disk_dir);
    }
    disk_dir[0] = 0;
}

/* The fallback of disk_dir_pick: a directory without O_DIRECT. 0, or -1. */
static int disk_dir_pick_any(void)
{
    snprintf(disk_dir, sizeof(disk_dir), "/tmp/kvcd-disk-test-%d", (int)getpid());
    if (mkdir(disk_dir, 0700) < 0) {
        disk_dir[0] = 0;
        return -1;
    }
    disk_buffered = true;
    return 0;
}

void disk_path(char *buf, size_t len)
{
    snprintf(buf, len, "%s/t%d.kvc", disk_dir, disk_seq++);
}

int disk_found_cb(void *arg, const struct tier_disk_meta *m, const struct tier_loc *loc)
{
    struct found *f = arg;
    if (f->n >= 64)
        return 1;
    f->m[f->n] = *m;
    f->loc[f->n] = *loc;
    f->n++;
    return 0;
}

struct tier *disk_open(const char *path, uint64_t size, uint64_t page, struct found *f)
{
    struct tier_disk_config cfg = {.paths = {path},
                                   .npaths = 1,
                                   .size = size,
                                   .page_size = page,
                                   .queue_depth = 32,
                                   .scan = f ? disk_found_cb : NULL,
                                   .scan_arg = f};
    int err = 0;
    struct tier_disk_stats st;
    struct tier *t = tier_disk_new(&cfg, &err);
    ck_assert_msg(t != NULL, "tier_disk_new(%s): %s", path, strerror(-err));
    /* the tier never falls back to buffered I/O where the directory takes O_DIRECT */
    tier_disk_stats_get(t, &st);
    ck_assert_msg(st.buffered == disk_buffered, "%s: buffered I/O %d, expected %d", path,
                  st.buffered, disk_buffered);
    return t;
}

void disk_done_cb(void *arg, int status)
{
    struct done *d = arg;
    d->calls++;
    d->status = status;
}

void disk_fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 9));
}

struct tier_disk_meta disk_meta(uint64_t k, uint64_t len)
{
    struct tier_disk_meta m = {
        .key = {k, ~k}, .parent = {k - 1, ~(k - 1)}, .depth = (uint32_t)k, .len = len};
    snprintf((char *)m.ns, sizeof(m.ns), "model-%u", 7u);
    return m;
}

int disk_put(struct tier *t, const struct tier_loc *loc, const struct tier_disk_meta *m,
             const void *src)
{
    struct done d = {0, -1};
    int rc = tier_disk_put(t, loc, m, src, disk_done_cb, &d);
    if (rc)
        return rc;
    tier_disk_drain(t);
    ck_assert_int_eq(d.calls, 1);
    return d.status;
}

int disk_get(struct tier *t, const struct tier_loc *loc, const struct tier_disk_meta *m, void *dst,
             uint64_t len)
{
    struct done d = {0, -1};
    int rc = tier_disk_get(t, loc, m, dst, len, disk_done_cb, &d);
    if (rc)
        return rc;
    tier_disk_drain(t);
    ck_assert_int_eq(d.calls, 1);
    return d.status;
}

int disk_found_has(const struct found *f, uint64_t k)
{
    for (int i = 0; i < f->n; i++)
        if (f->m[i].key[0] == k)
            return 1;
    return 0;
}

/* A path of this test process alone (Check forks every test, so disk_path's counter starts
 * over in each), with nothing left there from a failed run. */
void disk_fresh_path(char *buf, size_t len)
{
    char cp[340];
    snprintf(buf, len, "%s/c%d-%d.kvc", disk_dir, (int)getpid(), disk_seq++);
    snprintf(cp, sizeof(cp), "%s.ckpt", buf);
    unlink(buf);
    unlink(cp);
}
int disk_suite_run(Suite *s, const char *name)
{
    int failed;
    disk_dir_pick();
    if (!disk_dir[0]) {
        /* the O_DIRECT path is what the daemon runs on NVMe: a run that must test it fails */
        const char *req = getenv("KVC_REQUIRE_ODIRECT");
        if (req && strcmp(req, "1") == 0) {
            printf("%s: no directory here takes O_DIRECT (KVC_REQUIRE_ODIRECT=1)\n", name);
            return 1;
        }
        if (disk_dir_pick_any() < 0) {
            printf("SKIP: %s: all: no directory for the disk files\n", name);
            return 0;
        }
        printf("SKIP: %s: O_DIRECT: no directory here takes it (set KVC_TEST_DISK_DIR); "
               "the cases run on the buffered fallback\n",
               name);
    }
    fflush(stdout);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    rmdir(disk_dir);
    return failed ? 1 : 0;
}
