/*
 * check_e2e_install — `make install` of this build into a DESTDIR (PREFIX=/usr), and what a
 * user of the installed files meets:
 *  - kvcsim is installed beside kvcreplay, and the installed kvcreplay runs it for its
 *    prediction (against a real kvcd, on a small trace);
 *  - libkvc.pc names no path of the build host (no CUDA toolkit, no source or build tree):
 *    a program links statically against the installed libkvc.a with
 *    `pkg-config --static --libs libkvc` alone and runs, and that archive asks for no CUDA
 *    symbol (a CUDA build installs its device paths as libkvc-cuda.a / libkvc-cuda.pc);
 *  - the programs, libkvc.so.1 and the Python extension are stripped, each naming its debug
 *    file (.gnu_debuglink) under /usr/lib/debug, which holds the debug info; with
 *    INSTALL_STRIP=0 they are installed as built, debug info inside;
 *  - make uninstall takes back all of it but the configuration file.
 * make runs on this build's directory with its SAN and CUDA, so it finds everything built.
 */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/lib/daemon.h"

#if defined(__SANITIZE_ADDRESS__)
#define INST_SAN "SAN=1"
#elif defined(__SANITIZE_THREAD__)
#define INST_SAN "SAN=thread"
#else
#define INST_SAN "SAN=0"
#endif
#define INST_CUDA "CUDA=" INST_STR(KVC_CUDA)
#define INST_STR(x) INST_STR2(x)
#define INST_STR2(x) #x
#define INST_OUT (1 << 20)

static struct daemon inst_d;
static char inst_out[INST_OUT], inst_err[INST_OUT];
static char inst_build[DAEMON_PATH_MAX]; /* this build's directory (KVC_BUILD_BIN/..) */

/* make -C SRC BUILD=... SAN CUDA PREFIX=/usr DESTDIR=stage TARGET [extra]; exit status. */
static int inst_make(const char *stage, const char *target, const char *extra)
{
    char destdir[DAEMON_PATH_MAX + 16], build[DAEMON_PATH_MAX + 16];
    snprintf(destdir, sizeof(destdir), "DESTDIR=%s", stage);
    snprintf(build, sizeof(build), "BUILD=%s", inst_build);
    const char *argv[] = {"/usr/bin/make",
                          "-s",
                          "--no-print-directory",
                          "-C",
                          KVC_SRC_DIR,
                          build,
                          INST_SAN,
                          INST_CUDA,
                          "PREFIX=/usr",
                          destdir,
                          target,
                          extra,
                          NULL};
    int rc =
        daemon_run(argv, inst_out, sizeof(inst_out), inst_err, sizeof(inst_err), daemon_ms(600000));
    if (rc != 0)
        fprintf(stderr, "make %s: exit %d\n%s\n%s\n", target, rc, inst_out, inst_err);
    return rc;
}

/* Runs a shell command line; its exit status, stdout in inst_out. */
static int inst_sh(const char *cmd)
{
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    return daemon_run(argv, inst_out, sizeof(inst_out), inst_err, sizeof(inst_err),
                      daemon_ms(120000));
}

static void inst_setup(void)
{
    snprintf(inst_build, sizeof(inst_build), "%s", KVC_BUILD_BIN);
    char *slash = strrchr(inst_build, '/');
    ck_assert_ptr_nonnull(slash);
    *slash = 0;
    memset(&inst_d, 0, sizeof(inst_d));
    ck_assert_int_eq(daemon_dir_init(&inst_d), 0);
}

static void inst_teardown(void)
{
    daemon_cleanup(&inst_d);
}

/* dir/stage-NAME, made fresh. */
static void inst_stage(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%.150s/stage-%s", inst_d.dir, name);
    ck_assert_int_eq(mkdir(out, 0700), 0);
}

/* Whether file (under stage) has a section named sec, by readelf. */
static bool inst_has_section(const char *path, const char *sec)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "readelf -SW '%s'", path);
    ck_assert_int_eq(inst_sh(cmd), 0);
    char pat[64];
    snprintf(pat, sizeof(pat), " %s ", sec);
    return strstr(inst_out, pat) != NULL;
}

/* The whole file as a string (malloc'd), or NULL. */
static char *inst_slurp(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return NULL;
    char *buf = calloc(1, 1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    (void)n;
    fclose(f);
    return buf;
}

START_TEST(test_install_kvcsim_beside_kvcreplay)
{
    char stage[DAEMON_PATH_MAX], path[DAEMON_PATH_MAX * 2], trace[DAEMON_PATH_MAX * 2];
    inst_stage(stage, sizeof(stage), "tools");
    ck_assert_int_eq(inst_make(stage, "install", NULL), 0);
    static const char *const bins[] = {"kvcd", "kvcctl", "kvcreplay", "kvcsim"};
    for (size_t i = 0; i < sizeof(bins) / sizeof(bins[0]); i++) {
        snprintf(path, sizeof(path), "%s/usr/bin/%s", stage, bins[i]);
        ck_assert_msg(access(path, X_OK) == 0, "%s is not installed", path);
    }
    /* The installed kvcreplay against a real kvcd predicts with the installed kvcsim. */
    static const char *const args[] = {"-o", "host.size=32m",      "-o", "host.prefault=no",
                                       "-o", "host.hugepages=off", NULL};
    ck_assert_int_eq(daemon_start(&inst_d, args), 0);
    snprintf(trace, sizeof(trace), "%s/trace.jsonl", inst_d.dir);
    FILE *f = fopen(trace, "we");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 20; i++)
        fprintf(f,
                "{\"timestamp\": %d, \"input_length\": 1500, \"output_length\": 10, "
                "\"hash_ids\": [1, 2, %d]}\n",
                i * 100, 100 + i % 5);
    ck_assert_int_eq(fclose(f), 0);
    snprintf(path, sizeof(path), "%s/usr/bin/kvcreplay", stage);
    const char *argv[] = {path, "-s", inst_d.sock, "--json", trace, NULL};
    int rc =
        daemon_run(argv, inst_out, sizeof(inst_out), inst_err, sizeof(inst_err), daemon_ms(60000));
    ck_assert_msg(rc == 0, "installed kvcreplay: exit %d\n%s\n%s", rc, inst_out, inst_err);
    ck_assert_msg(strstr(inst_out, "\"kvcsim\": {") && strstr(inst_out, "block_hit_ratio"),
                  "no kvcsim prediction:\n%s\n%s", inst_out, inst_err);
    ck_assert_ptr_null(strstr(inst_err, "not found"));
    ck_assert_int_eq(daemon_stop(&inst_d), 0);
}
END_TEST

START_TEST(test_install_pkgconfig_static_link_no_cuda)
{
    char stage[DAEMON_PATH_MAX], path[DAEMON_PATH_MAX * 2], cmd[2048];
    inst_stage(stage, sizeof(stage), "pc");
    ck_assert_int_eq(inst_make(stage, "install", NULL), 0);
    snprintf(path, sizeof(path), "%s/usr/lib/pkgconfig/libkvc.pc", stage);
    char *pc = inst_slurp(path);
    ck_assert_ptr_nonnull(pc);
    ck_assert_msg(!strstr(pc, "cuda") && !strstr(pc, "/usr/local") && !strstr(pc, KVC_SRC_DIR) &&
                      !strstr(pc, inst_build),
                  "libkvc.pc names a build-host path:\n%s", pc);
    free(pc);
    /* no installed text file names the source or build tree */
    snprintf(cmd, sizeof(cmd), "grep -rlI -e '%s' -e '%s' '%s' || true", KVC_SRC_DIR, inst_build,
             stage);
    ck_assert_int_eq(inst_sh(cmd), 0);
    ck_assert_msg(inst_out[0] == 0, "files naming the build tree:\n%s", inst_out);
    /* the installed static archive asks for no symbol of the CUDA runtime or driver */
    snprintf(cmd, sizeof(cmd),
             "nm -u '%s/usr/lib/libkvc.a' | grep -cE ' U (cuda|cu[A-Z]|__cuda)' || true", stage);
    ck_assert_int_eq(inst_sh(cmd), 0);
    ck_assert_int_eq(atoi(inst_out), 0);
    /* a program linked with what pkg-config says, statically (the sanitizer builds link
     * their runtime, which cannot be static) */
    snprintf(path, sizeof(path), "%s/prog.c", inst_d.dir);
    FILE *f = fopen(path, "we");
    ck_assert_ptr_nonnull(f);
    fputs(
        "#include <stdio.h>\n#include <kvc.h>\nint main(void)\n{\n    kvc_client *c;\n"
        "    int rc = kvc_connect(\"/nonexistent/kvcd.sock\", &c);\n"
        "    printf(\"connect: %d %s\\n\", rc, kvc_strerror(rc));\n    return rc < 0 ? 0 : 1;\n}\n",
        f);
    ck_assert_int_eq(fclose(f), 0);
    /* The sanitizer builds link the installed archive by path (their runtime is shared):
     * $flags with -lkvc taken out. */
    const char *san = strcmp(INST_SAN, "SAN=1") == 0   ? "-fsanitize=address,undefined"
                      : strcmp(INST_SAN, "SAN=0") != 0 ? "-fsanitize=thread"
                                                       : NULL;
    if (!san)
        snprintf(cmd, sizeof(cmd),
                 "set -e; export PKG_CONFIG_SYSROOT_DIR='%s' "
                 "PKG_CONFIG_LIBDIR='%s/usr/lib/pkgconfig'; "
                 "flags=$(pkg-config --static --cflags --libs libkvc); echo \"flags: $flags\"; "
                 "cc -static -o '%s/prog' '%s' $flags; '%s/prog'",
                 stage, stage, inst_d.dir, path, inst_d.dir);
    else
        snprintf(cmd, sizeof(cmd),
                 "set -e; export PKG_CONFIG_SYSROOT_DIR='%s' "
                 "PKG_CONFIG_LIBDIR='%s/usr/lib/pkgconfig'; "
                 "flags=$(pkg-config --static --cflags --libs libkvc); echo \"flags: $flags\"; "
                 "cc %s -o '%s/prog' '%s' '%s/usr/lib/libkvc.a' $(echo \" $flags \" | "
                 "sed 's/ -lkvc / /'); '%s/prog'",
                 stage, stage, san, inst_d.dir, path, stage, inst_d.dir);
    int rc = inst_sh(cmd);
    ck_assert_msg(rc == 0, "static link: exit %d\n%s\n%s", rc, inst_out, inst_err);
    ck_assert_ptr_null(strstr(inst_out, "cuda"));
    ck_assert_ptr_nonnull(strstr(inst_out, "connect: -"));
    /* a CUDA build installs the device paths apart */
    snprintf(path, sizeof(path), "%s/usr/lib/pkgconfig/libkvc-cuda.pc", stage);
    ck_assert_int_eq(access(path, R_OK) == 0, KVC_CUDA);
    if (KVC_CUDA) {
        pc = inst_slurp(path);
        ck_assert_ptr_nonnull(pc);
        ck_assert_msg(strstr(pc, "-lcudart_static") && !strstr(pc, "-L/"), "libkvc-cuda.pc:\n%s",
                      pc);
        free(pc);
    }
}
END_TEST

START_TEST(test_install_stripped_debug_beside)
{
    char stage[DAEMON_PATH_MAX], path[DAEMON_PATH_MAX * 2], dbg[DAEMON_PATH_MAX * 2];
    inst_stage(stage, sizeof(stage), "strip");
    ck_assert_int_eq(inst_make(stage, "install", NULL), 0);
    static const char *const elfs[] = {"usr/bin/kvcd", "usr/bin/kvcctl", "usr/bin/kvcreplay",
                                       "usr/bin/kvcsim", "usr/lib/libkvc.so.1"};
    for (size_t i = 0; i < sizeof(elfs) / sizeof(elfs[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", stage, elfs[i]);
        snprintf(dbg, sizeof(dbg), "%s/usr/lib/debug/%s.debug", stage, elfs[i]);
        ck_assert_msg(!inst_has_section(path, ".debug_info"), "%s has debug info", path);
        ck_assert_msg(!inst_has_section(path, ".symtab"), "%s is not stripped", path);
        ck_assert_msg(inst_has_section(path, ".gnu_debuglink"), "%s names no debug file", path);
        ck_assert_msg(inst_has_section(dbg, ".debug_info"), "%s: no debug info", dbg);
    }
    /* The Python extension, where the package is installed (not in the sanitizer builds). */
    char cmd[600];
    snprintf(cmd, sizeof(cmd),
             "find '%s/usr/lib' -name '_kvcd*.so' -path '*dist-packages*' "
             "! -path '*/debug/*'",
             stage);
    ck_assert_int_eq(inst_sh(cmd), 0);
    if (inst_out[0]) {
        inst_out[strcspn(inst_out, "\n")] = 0;
        ck_assert_uint_lt(strlen(inst_out), sizeof(path));
        memcpy(path, inst_out, strlen(inst_out) + 1);
        ck_assert(!inst_has_section(path, ".debug_info"));
        ck_assert(inst_has_section(path, ".gnu_debuglink"));
    }
    snprintf(path, sizeof(path), "%s/usr/lib/libkvc.a", stage);
    snprintf(cmd, sizeof(cmd), "readelf -SW '%s' | grep -c ' .debug_info ' || true", path);
    ck_assert_int_eq(inst_sh(cmd), 0);
    ck_assert_int_eq(atoi(inst_out), 0);

    /* INSTALL_STRIP=0: as built */
    char raw[DAEMON_PATH_MAX];
    inst_stage(raw, sizeof(raw), "nostrip");
    ck_assert_int_eq(inst_make(raw, "install", "INSTALL_STRIP=0"), 0);
    snprintf(path, sizeof(path), "%s/usr/bin/kvcd", raw);
    ck_assert(inst_has_section(path, ".debug_info"));
    snprintf(path, sizeof(path), "%s/usr/lib/debug", raw);
    ck_assert_int_ne(access(path, F_OK), 0);

    /* make uninstall leaves the configuration file alone */
    ck_assert_int_eq(inst_make(stage, "uninstall", NULL), 0);
    snprintf(cmd, sizeof(cmd), "cd '%s' && find . -type f -o -type l | sort", stage);
    ck_assert_int_eq(inst_sh(cmd), 0);
    ck_assert_str_eq(inst_out, "./etc/kvcd/kvcd.ini\n");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_install");
    TCase *tc = tcase_create("install");
    if (daemon_suite_init("e2e_install") < 0)
        return 1;
    tcase_set_timeout(tc, daemon_slow() * 900);
    tcase_add_checked_fixture(tc, inst_setup, inst_teardown);
    tcase_add_test(tc, test_install_kvcsim_beside_kvcreplay);
    tcase_add_test(tc, test_install_pkgconfig_static_link_no_cuda);
    tcase_add_test(tc, test_install_stripped_debug_beside);
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
