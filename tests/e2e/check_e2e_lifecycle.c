/*
 * check_e2e_lifecycle.c — start, refuse, replace, stop, reload and check-config of kvcd;
 * the checks a start makes before anything slow (another kvcd on the socket, the disk
 * path's directory and file system), so a start that cannot succeed fails at once and
 * leaves nothing behind; a large arena serving while it is still faulted in.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "tests/lib/daemon.h"

static const char *const lc_args[] = {"-o", "host.size=32m", "-o", "host.page_size=64k", NULL};

/* Whether the log holds `text` within timeout_ms. */
static bool lc_log_wait(const struct daemon *d, const char *text, int timeout_ms)
{
    static char buf[1 << 16];
    uint64_t end = daemon_now_ms() + (uint64_t)timeout_ms;
    do {
        FILE *f = fopen(d->log, "r");
        size_t n = 0;
        if (f) {
            n = fread(buf, 1, sizeof(buf) - 1, f);
            fclose(f);
        }
        buf[n] = 0;
        if (strstr(buf, text))
            return true;
        usleep(10000);
    } while (daemon_now_ms() < end);
    return false;
}

START_TEST(test_lifecycle_refuses_second_daemon)
{
    struct daemon d = {0};
    pid_t second;
    struct stat st;
    ck_assert_int_eq(daemon_start(&d, lc_args), 0);
    ck_assert_int_eq(daemon_spawn(&d, lc_args, &second), 0);
    ck_assert_int_gt(daemon_child_wait(second, daemon_ms(20000), NULL), 0);
    ck_assert(lc_log_wait(&d, "another kvcd is serving", 1000));
    ck_assert(daemon_alive(&d));
    ck_assert_int_eq(stat(d.sock, &st), 0); /* the loser did not remove the winner's socket */
    ck_assert_int_eq(daemon_roundtrip(&d), 0);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

START_TEST(test_lifecycle_replaces_stale_socket)
{
    struct daemon d = {0};
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    struct stat st;
    int fd;
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    strcpy(a.sun_path, d.sock);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    close(fd); /* the file stays, nobody listens */
    ck_assert_int_eq(stat(d.sock, &st), 0);
    ck_assert(S_ISSOCK(st.st_mode));
    ck_assert_int_eq(daemon_start(&d, lc_args), 0);
    ck_assert_int_eq(daemon_roundtrip(&d), 0);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

START_TEST(test_lifecycle_refuses_non_socket_path)
{
    struct daemon d = {0};
    char path[DAEMON_PATH_MAX];
    pid_t pid;
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    ck_assert_int_eq(daemon_file_write(&d, "kvcd.sock", "precious\n", path), 0);
    ck_assert_int_eq(daemon_spawn(&d, lc_args, &pid), 0);
    ck_assert_int_gt(daemon_child_wait(pid, daemon_ms(20000), NULL), 0);
    ck_assert_int_eq(access(path, F_OK), 0); /* a regular file is never unlinked */
    daemon_cleanup(&d);
}
END_TEST

/* A socket path whose directory is missing fails the start at once, before the arena is
 * made, naming the directory and what to change (it said "cannot listen on PATH (No such
 * file or directory)" after faulting the arena in; a user without XDG_RUNTIME_DIR met it on
 * /run/kvcd). */
START_TEST(test_lifecycle_socket_dir_missing_named)
{
    struct daemon d = {0};
    char want[DAEMON_PATH_MAX + 64];
    pid_t pid;
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    ck_assert_uint_lt(strlen(d.dir), sizeof(d.sock) - 20);
    memcpy(d.sock + strlen(d.dir), "/missing/kvcd.sock", 19);
    ck_assert_int_eq(daemon_spawn(&d, lc_args, &pid), 0);
    ck_assert_int_eq(daemon_child_wait(pid, daemon_ms(20000), NULL), 1);
    snprintf(want, sizeof(want), "the directory %s/missing does not exist", d.dir);
    ck_assert_msg(lc_log_wait(&d, want, 0), "the log does not say '%s'", want);
    ck_assert_msg(!lc_log_wait(&d, "host: arena", 0), "the arena was made first");
    daemon_cleanup(&d);
}
END_TEST

START_TEST(test_lifecycle_sigterm_removes_socket)
{
    struct daemon d = {0};
    struct stat st;
    ck_assert_int_eq(daemon_start(&d, lc_args), 0);
    ck_assert_int_eq(daemon_roundtrip(&d), 0);
    char lock[DAEMON_PATH_MAX + 8];
    snprintf(lock, sizeof(lock), "%s.lock", d.sock);
    ck_assert_int_eq(stat(lock, &st), 0); /* held while it serves */
    ck_assert_int_eq(daemon_stop(&d), 0);
    ck_assert_int_eq(stat(d.sock, &st), -1);
    ck_assert_int_eq(errno, ENOENT);
    ck_assert_int_eq(stat(lock, &st), -1); /* and gone with it */
    ck_assert(lc_log_wait(&d, "kvcd: stopped", 1000));
    daemon_cleanup(&d);
}
END_TEST

START_TEST(test_lifecycle_sighup_reload)
{
    static const char *good = "[host]\nsize = 32m\npage_size = 64k\n[log]\nlevel = info\n";
    static const char *loud = "[host]\nsize = 32m\npage_size = 64k\n[log]\nlevel = debug\n";
    static const char *big = "[host]\nsize = 64m\npage_size = 64k\n[log]\nlevel = debug\n";
    struct daemon d = {0};
    char path[DAEMON_PATH_MAX];
    const char *args[] = {"-c", path, NULL};
    uint64_t cap0, cap1;
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    ck_assert_int_eq(daemon_file_write(&d, "kvcd.ini", good, path), 0);
    ck_assert_int_eq(daemon_start(&d, args), 0);
    ck_assert_int_eq(daemon_stat(&d, "host_capacity", &cap0), 0);

    /* A reloadable change is applied. */
    ck_assert_int_eq(daemon_file_write(&d, "kvcd.ini", loud, path), 0);
    ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
    ck_assert_msg(lc_log_wait(&d, "config: reloaded", 10000), "reload not applied");
    ck_assert_int_eq(daemon_roundtrip(&d), 0);
    /* log.level=debug is in force: a client's connection is logged now. */
    ck_assert(lc_log_wait(&d, "connected", 10000));

    /* A change of host.size needs a restart: refused, the daemon serves on unchanged. */
    ck_assert_int_eq(daemon_file_write(&d, "kvcd.ini", big, path), 0);
    ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
    ck_assert_msg(lc_log_wait(&d, "reload refused (host.size", 10000), "reload not refused");
    ck_assert(daemon_alive(&d));
    ck_assert_int_eq(daemon_roundtrip(&d), 0);
    ck_assert_int_eq(daemon_stat(&d, "host_capacity", &cap1), 0);
    ck_assert_uint_eq(cap1, cap0);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

START_TEST(test_lifecycle_check_config)
{
    struct daemon d = {0};
    char good[DAEMON_PATH_MAX], bad[DAEMON_PATH_MAX], out[4096], err[4096], want[300];
    const char *argv_good[] = {DAEMON_KVCD, "--check-config", "-c", good, NULL};
    const char *argv_bad[] = {DAEMON_KVCD, "--check-config", "-c", bad, NULL};
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    ck_assert_int_eq(
        daemon_file_write(&d, "good.ini",
                          "[host]\nsize = 32m\npage_size = 64k\n[log]\nlevel = debug\n", good),
        0);
    ck_assert_int_eq(
        daemon_file_write(&d, "bad.ini",
                          "[host]\nsize = 32m\npage_size = banana\n[log]\nlevel = info\n", bad),
        0);
    ck_assert_int_eq(daemon_run(argv_good, out, sizeof(out), err, sizeof(err), 20000), 0);
    ck_assert_int_gt(daemon_run(argv_bad, out, sizeof(out), err, sizeof(err), 20000), 0);
    snprintf(want, sizeof(want), "%s:3", bad);
    ck_assert_msg(strstr(err, want), "no '%s' in: %s", want, err);
    ck_assert_int_eq(access(d.sock, F_OK), -1); /* checking starts nothing */
    /* a disk path whose directory is missing is reported, naming the directory; one whose
     * directory is there passes (the file is created at start) */
    {
        char opt[DAEMON_PATH_MAX + 64], missing[DAEMON_PATH_MAX + 32];
        const char *argv_disk[] = {DAEMON_KVCD, "--check-config", "-o", opt, NULL};
        snprintf(missing, sizeof(missing), "%s/no-such-dir", d.dir);
        snprintf(opt, sizeof(opt), "disk.path=%s/disk0.kvc", missing);
        ck_assert_int_gt(daemon_run(argv_disk, out, sizeof(out), err, sizeof(err), 20000), 0);
        snprintf(want, sizeof(want), "its directory %s does not exist", missing);
        ck_assert_msg(strstr(err, want), "no '%s' in: %s", want, err);
        snprintf(opt, sizeof(opt), "disk.path=%s/disk0.kvc", d.dir);
        ck_assert_int_eq(daemon_run(argv_disk, out, sizeof(out), err, sizeof(err), 20000), 0);
        ck_assert_int_ne(access(opt + strlen("disk.path="), F_OK), 0); /* nor creates it */
    }
    daemon_cleanup(&d);
}
END_TEST

/* Whether the log holds text now. */
static bool lc_log_has(const struct daemon *d, const char *text)
{
    return lc_log_wait(d, text, 0);
}

/* A second kvcd with a 2 GiB arena on a served socket learns so before it pre-faults
 * anything, within a second (scaled for sanitizer builds; it took 12 s to say so, after
 * touching its whole arena). */
START_TEST(test_lifecycle_second_daemon_refused_before_prefault)
{
    static const char *const big[] = {"-o", "host.size=2g",       "-o", "host.prefault=yes",
                                      "-o", "host.hugepages=off", NULL};
    struct daemon d = {0};
    pid_t second;
    ck_assert_int_eq(daemon_start(&d, lc_args), 0);
    uint64_t t0 = daemon_now_ms();
    ck_assert_int_eq(daemon_spawn(&d, big, &second), 0);
    ck_assert_int_eq(daemon_child_wait(second, daemon_ms(1000), NULL), 1);
    printf("e2e_lifecycle: the second kvcd gave up after %llu ms\n",
           (unsigned long long)(daemon_now_ms() - t0));
    ck_assert(lc_log_has(&d, "another kvcd is serving"));
    ck_assert_msg(!lc_log_has(&d, "arena of 2048 MiB"), "the second kvcd made its arena first");
    ck_assert_int_eq(daemon_roundtrip(&d), 0);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* A kvcd that has not bound its socket yet (still creating its arena) holds SOCK.lock: a
 * second one learns at once that the path is taken, before it makes an arena, whatever
 * host.size says. The test holds the lock as the first kvcd would; nothing serves. */
START_TEST(test_lifecycle_second_daemon_refused_while_first_starts)
{
    static const char *const big[] = {"-o", "host.size=8g",       "-o", "host.prefault=yes",
                                      "-o", "host.hugepages=off", NULL};
    struct daemon d = {0};
    char lock[DAEMON_PATH_MAX + 8];
    pid_t second;
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    int fd = daemon_hold_start_lock(&d, lock);
    ck_assert_int_ge(fd, 0);
    uint64_t t0 = daemon_now_ms();
    ck_assert_int_eq(daemon_spawn(&d, big, &second), 0);
    /* A second at most (scaled for sanitizer builds): nothing it could do takes longer. */
    ck_assert_int_eq(daemon_child_wait(second, daemon_ms(1000), NULL), 1);
    printf("e2e_lifecycle: the second kvcd gave up after %llu ms (the first still starting)\n",
           (unsigned long long)(daemon_now_ms() - t0));
    ck_assert(lc_log_has(&d, "another kvcd is starting or serving"));
    ck_assert_msg(!lc_log_has(&d, "arena of"), "the second kvcd made its arena first");
    ck_assert_int_eq(access(d.sock, F_OK), -1);
    close(fd);
    /* The lock let go, a kvcd starts there. */
    ck_assert_int_eq(daemon_start(&d, lc_args), 0);
    ck_assert_int_eq(daemon_roundtrip(&d), 0);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

/* host_faulted and host_arenas_bytes from `kvcctl status --json`. */
static void lc_faulted(const struct daemon *d, uint64_t *faulted, uint64_t *total)
{
    char out[4096], err[1024];
    ck_assert_int_eq(daemon_kvcctl(d, out, sizeof(out), err, sizeof(err), "--json", "status", NULL),
                     0);
    ck_assert_int_eq(daemon_json_u64(out, "host_faulted", faulted), 0);
    ck_assert_int_eq(daemon_json_u64(out, "host_arenas_bytes", total), 0);
}

/* A 4 GiB arena (one fault-in thread, so it takes seconds on any host): kvcd answers status
 * while the arena is still being faulted in, serves puts that reach past the faulted part
 * (their slots faulted on the spot) and gets of them byte for byte meanwhile, and says when
 * it is done. Under ASan too. */
START_TEST(test_lifecycle_large_arena_serves_while_faulting)
{
    static const char *const args[] = {"-o", "host.size=4g",       "-o", "host.prefault_threads=1",
                                       "-o", "host.hugepages=off", NULL};
    enum { NB = 12288 }; /* 192 MiB of 16 KiB blocks: past the 64 MiB faulted before serving */
    struct daemon d = {0};
    struct kvc_layout lay = daemon_layout("lc-faulting", 16);
    kvc_client *c;
    kvc_ns *ns;
    uint64_t faulted, total;
    ck_assert_int_eq(daemon_start(&d, args), 0);
    lc_faulted(&d, &faulted, &total);
    printf("e2e_lifecycle: status answered with %llu of %llu MiB faulted in\n",
           (unsigned long long)(faulted >> 20), (unsigned long long)(total >> 20));
    ck_assert_uint_eq(total, 4ull << 30);
    ck_assert_uint_lt(faulted, total);

    ck_assert_int_eq(kvc_connect(d.sock, &c), 0);
    ck_assert_int_eq(kvc_ns_open(c, &lay, &ns), 0);
    size_t bb = kvc_ns_block_bytes(ns);
    struct kvc_key *keys = calloc(NB, sizeof(*keys));
    void **blocks = calloc(NB, sizeof(*blocks));
    uint8_t *mem = malloc((size_t)NB * bb);
    ck_assert(keys && blocks && mem);
    ck_assert_int_eq(daemon_chain_keys(ns, 77, 1, 0, NB, keys), 0);
    for (int i = 0; i < NB; i++) {
        blocks[i] = mem + (size_t)i * bb;
        daemon_block_fill(&keys[i], blocks[i], bb);
    }
    ck_assert_int_eq(kvc_put_prefix(ns, NULL, keys, NB, (const void *const *)blocks), NB);
    ck_assert_int_eq(kvc_flush(c), 0);
    memset(mem, 0, (size_t)NB * bb);
    ck_assert_int_eq(kvc_get_prefix(ns, keys, NB, blocks), NB);
    for (int i = 0; i < NB; i++)
        ck_assert_int_lt(daemon_block_check(&keys[i], blocks[i], bb), 0);
    kvc_disconnect(c);
    lc_faulted(&d, &faulted, &total);
    printf("e2e_lifecycle: put and got %d blocks with %llu MiB faulted in\n", NB,
           (unsigned long long)(faulted >> 20));
    ck_assert_uint_lt(faulted, total); /* all of it while the fault-in went on */
    uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(120000);
    while (faulted < total && daemon_now_ms() < end) {
        usleep(200000);
        lc_faulted(&d, &faulted, &total);
    }
    ck_assert_uint_eq(faulted, total);
    ck_assert(lc_log_wait(&d, "faulted in within", daemon_ms(5000)));
    ck_assert_int_eq(daemon_roundtrip(&d), 0);
    ck_assert_int_eq(daemon_stop(&d), 0);
    free(keys);
    free(blocks);
    free(mem);
    daemon_cleanup(&d);
}
END_TEST

/* --check-config (the unit's ExecStartPre) fails a disk.path whose directory is missing, or
 * whose file system cannot hold disk.capacity; passes one it can create. */
START_TEST(test_lifecycle_check_config_disk_path)
{
    struct daemon d = {0};
    char path[DAEMON_PATH_MAX + 32], opt[DAEMON_PATH_MAX + 64], out[4096], err[4096];
    const char *argv[] = {DAEMON_KVCD, "--check-config",    "-o", opt,
                          "-o",        "disk.capacity=64m", NULL};
    const char *huge[] = {DAEMON_KVCD, "--check-config",         "-o", opt,
                          "-o",        "disk.capacity=1000000g", NULL};
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    snprintf(path, sizeof(path), "%s/missing/kvc.dat", d.dir);
    snprintf(opt, sizeof(opt), "disk.path=%s", path);
    ck_assert_int_eq(daemon_run(argv, out, sizeof(out), err, sizeof(err), 20000), 1);
    ck_assert_msg(strstr(err, "does not exist") && strstr(err, "/missing"), "%s", err);
    snprintf(path, sizeof(path), "%s/kvc.dat", d.dir);
    snprintf(opt, sizeof(opt), "disk.path=%s", path);
    ck_assert_int_eq(daemon_run(argv, out, sizeof(out), err, sizeof(err), 20000), 0);
    ck_assert_int_eq(daemon_run(huge, out, sizeof(out), err, sizeof(err), 20000), 1);
    ck_assert_msg(strstr(err, "file system has"), "%s", err);
    ck_assert_int_eq(access(path, F_OK), -1); /* checking creates nothing */
    daemon_cleanup(&d);
}
END_TEST

/* A start whose disk.capacity does not fit its file system (a 2 MiB tmpfs) fails before it
 * creates anything: no 4 KiB kvc.dat is left behind. Needs root (mount). */
START_TEST(test_lifecycle_full_fs_leaves_no_file)
{
    struct daemon d = {0};
    char fs[DAEMON_PATH_MAX], path[DAEMON_PATH_MAX + 16], opt[DAEMON_PATH_MAX + 32];
    pid_t pid;
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    snprintf(fs, sizeof(fs), "%.150s/fs", d.dir);
    ck_assert_int_eq(mkdir(fs, 0700), 0);
    ck_assert_int_eq(mount("tmpfs", fs, "tmpfs", 0, "size=2m"), 0);
    snprintf(path, sizeof(path), "%s/kvc.dat", fs);
    snprintf(opt, sizeof(opt), "disk.path=%s", path);
    const char *args[] = {"-o", "host.size=32m", "-o", opt, "-o", "disk.capacity=16m", NULL};
    ck_assert_int_eq(daemon_spawn(&d, args, &pid), 0);
    int rc = daemon_child_wait(pid, daemon_ms(20000), NULL);
    bool left = access(path, F_OK) == 0;
    ck_assert_int_eq(umount(fs), 0);
    ck_assert_int_eq(rc, 1);
    ck_assert(lc_log_has(&d, "file system has"));
    ck_assert_msg(!left, "a failed start left %s", path);
    ck_assert(!lc_log_has(&d, "arena of"));
    daemon_cleanup(&d);
}
END_TEST

/* A start that fails after the disk tier created its file (here: the file cannot grow to
 * disk.capacity, as on a file system that filled after the start's check, through a file
 * size limit the check cannot see) removes the file it created: no 4 KiB kvc.dat with a
 * fresh superblock is left behind. A file that was there before the start stays. */
START_TEST(test_lifecycle_failed_start_removes_created_file)
{
    struct daemon d = {0};
    char path[DAEMON_PATH_MAX + 16], opt[DAEMON_PATH_MAX + 32];
    struct rlimit old, lim;
    struct stat st;
    pid_t pid;
    int rc;
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    snprintf(path, sizeof(path), "%s/kvc.dat", d.dir);
    snprintf(opt, sizeof(opt), "disk.path=%s", path);
    const char *args[] = {"-o", "host.size=16m", "-o", opt, "-o", "disk.capacity=64m", NULL};
    /* The child inherits the limit (32 MiB: the arena's memfd, the superblock and the log
     * fit, 64 MiB do not) and SIGXFSZ ignored, so growing the file fails with EFBIG instead
     * of a signal. */
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 32u << 20;
    signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    rc = daemon_spawn(&d, args, &pid);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    ck_assert_int_eq(rc, 0);
    rc = daemon_child_wait(pid, daemon_ms(20000), NULL);
    ck_assert_int_eq(rc, 1);
    ck_assert(lc_log_has(&d, "cannot open the disk tier"));
    ck_assert_msg(access(path, F_OK) != 0, "a failed start left the %s it created", path);
    /* The same failure on a file that existed before the start leaves it where it was. */
    ck_assert_int_eq(daemon_file_write(&d, "kvc.dat", "", path), 0);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    rc = daemon_spawn(&d, args, &pid);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(daemon_child_wait(pid, daemon_ms(20000), NULL), 1);
    ck_assert_int_eq(stat(path, &st), 0);
    daemon_cleanup(&d);
}
END_TEST

/* A start that fails on its second disk.path (it holds someone's data: the tier refuses to
 * format it) removes the first, which it had just created. */
START_TEST(test_lifecycle_refused_path_removes_created_file)
{
    struct daemon d = {0};
    char fresh[DAEMON_PATH_MAX + 16], foreign[DAEMON_PATH_MAX], opt[2 * DAEMON_PATH_MAX + 32];
    pid_t pid;
    ck_assert_int_eq(daemon_dir_init(&d), 0);
    ck_assert_int_eq(daemon_file_write(&d, "data.bin", "someone's data\n", foreign), 0);
    snprintf(fresh, sizeof(fresh), "%s/kvc.dat", d.dir);
    snprintf(opt, sizeof(opt), "disk.path=%s,%s", fresh, foreign);
    const char *args[] = {"-o", "host.size=16m", "-o", opt, "-o", "disk.capacity=16m", NULL};
    ck_assert_int_eq(daemon_spawn(&d, args, &pid), 0);
    ck_assert_int_eq(daemon_child_wait(pid, daemon_ms(20000), NULL), 1);
    ck_assert(lc_log_has(&d, "refusing to overwrite it"));
    ck_assert_msg(access(fresh, F_OK) != 0, "a refused start left the %s it created", fresh);
    ck_assert_int_eq(access(foreign, F_OK), 0);
    daemon_cleanup(&d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_lifecycle");
    TCase *tc = tcase_create("lifecycle");
    tcase_set_timeout(tc, daemon_slow() * 60);
    tcase_add_test(tc, test_lifecycle_refuses_second_daemon);
    tcase_add_test(tc, test_lifecycle_replaces_stale_socket);
    tcase_add_test(tc, test_lifecycle_refuses_non_socket_path);
    tcase_add_test(tc, test_lifecycle_socket_dir_missing_named);
    tcase_add_test(tc, test_lifecycle_sigterm_removes_socket);
    tcase_add_test(tc, test_lifecycle_sighup_reload);
    tcase_add_test(tc, test_lifecycle_check_config);
    tcase_add_test(tc, test_lifecycle_second_daemon_refused_before_prefault);
    tcase_add_test(tc, test_lifecycle_second_daemon_refused_while_first_starts);
    tcase_add_test(tc, test_lifecycle_large_arena_serves_while_faulting);
    tcase_add_test(tc, test_lifecycle_check_config_disk_path);
    tcase_add_test(tc, test_lifecycle_failed_start_removes_created_file);
    tcase_add_test(tc, test_lifecycle_refused_path_removes_created_file);
    if (geteuid() == 0)
        tcase_add_test(tc, test_lifecycle_full_fs_leaves_no_file);
    else
        printf("SKIP: e2e_lifecycle: test_lifecycle_full_fs_leaves_no_file: not root (it "
               "mounts a small tmpfs)\n");
    suite_add_tcase(s, tc);
    if (daemon_suite_init("e2e-lifecycle"))
        return 1;
    return daemon_suite_run(s);
}
