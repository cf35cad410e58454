/*
 * check_readme — README.md's folder table against the tree: every folder (and every folder
 * one level below it) that holds files is named in the table as `path/`, and every C and
 * CUDA source of the daemon and its libraries (daemon/, client/, tiers/, policies/,
 * kernels/) is named in its folder's row. A new file or folder without its line fails here.
 * Hidden folders, build outputs (build*), shared/ and __pycache__ are not part of the tree.
 * And the documentation's references hold: every relative link of README.md and of the pages
 * under docs/ leads to a file, and every `docs/….md` path they name exists (a page moved or
 * removed without its references fails here; a path named after `git log -- ` is history).
 * README.md's kvcctl and kvcreplay usage blocks are what the programs print.
 * And the C examples a newcomer copies (README.md's libkvc example, libkvc(3)'s EXAMPLE)
 * compile with -Wall -Werror against this build and do what they say against a real kvcd.
 */
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "tests/lib/daemon.h"

#define RM_TEXT (1 << 20)
/* The examples link this build's libkvc.so, instrumented as this suite is. */
#if defined(__SANITIZE_ADDRESS__)
#define RM_SAN "-fsanitize=address,undefined"
#elif defined(__SANITIZE_THREAD__)
#define RM_SAN "-fsanitize=thread"
#else
#define RM_SAN ""
#endif

static char rm_readme[RM_TEXT];
static char rm_table[RM_TEXT]; /* the folder table's rows */

static void rm_load(void)
{
    FILE *f = fopen(KVC_SRC_DIR "/README.md", "re");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(rm_readme, 1, sizeof(rm_readme) - 1, f);
    rm_readme[n] = 0;
    fclose(f);
    const char *start = strstr(rm_readme, "| folder | holds |");
    ck_assert_msg(start != NULL, "README.md has no folder table");
    const char *end = strstr(start, "\n\n");
    size_t len = end ? (size_t)(end - start) : strlen(start);
    memcpy(rm_table, start, len);
    rm_table[len] = 0;
}

/* Whether a directory entry is part of the source tree. */
static bool rm_skip(const char *name)
{
    return name[0] == '.' || strncmp(name, "build", 5) == 0 || strcmp(name, "shared") == 0 ||
           strcmp(name, "__pycache__") == 0;
}

/* Whether dir (under the source tree) holds a file, at any depth. */
static bool rm_has_files(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    bool any = false;
    while (d && !any && (e = readdir(d))) {
        char path[1024];
        struct stat st;
        if (rm_skip(e->d_name))
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (stat(path, &st) == 0)
            any = S_ISDIR(st.st_mode) ? rm_has_files(path) : true;
    }
    if (d)
        closedir(d);
    return any;
}

/* The folders (relative, depth 1 and 2) that hold files, into out (NUL-separated); count. */
static size_t rm_folders(char out[][128], size_t cap)
{
    size_t n = 0;
    DIR *top = opendir(KVC_SRC_DIR);
    struct dirent *e;
    ck_assert_ptr_nonnull(top);
    while ((e = readdir(top))) {
        char path[1024];
        struct stat st;
        if (rm_skip(e->d_name))
            continue;
        snprintf(path, sizeof(path), "%s/%s", KVC_SRC_DIR, e->d_name);
        if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode) || !rm_has_files(path))
            continue;
        ck_assert_uint_lt(n, cap);
        snprintf(out[n++], 128, "%.100s", e->d_name);
        DIR *sub = opendir(path);
        struct dirent *s2;
        while (sub && (s2 = readdir(sub))) {
            char p2[1200];
            if (rm_skip(s2->d_name))
                continue;
            snprintf(p2, sizeof(p2), "%.900s/%.200s", path, s2->d_name);
            if (stat(p2, &st) != 0 || !S_ISDIR(st.st_mode) || !rm_has_files(p2))
                continue;
            ck_assert_uint_lt(n, cap);
            snprintf(out[n++], 128, "%.60s/%.60s", e->d_name, s2->d_name);
        }
        if (sub)
            closedir(sub);
    }
    closedir(top);
    return n;
}

START_TEST(test_readme_names_every_folder)
{
    static char folders[256][128];
    size_t n = rm_folders(folders, 256);
    ck_assert_uint_gt(n, 10); /* the walk itself works */
    rm_load();
    for (size_t i = 0; i < n; i++) {
        char want[160];
        snprintf(want, sizeof(want), "`%s/`", folders[i]);
        ck_assert_msg(strstr(rm_table, want), "README.md's folder table does not name %s", want);
    }
}
END_TEST

/* The row of folder `dir/` in the table, as a string (static). */
static const char *rm_row(const char *dir)
{
    static char row[RM_TEXT];
    char head[64];
    snprintf(head, sizeof(head), "| `%s/` |", dir);
    const char *p = strstr(rm_table, head);
    ck_assert_msg(p != NULL, "README.md's folder table has no row for %s/", dir);
    size_t len = strcspn(p, "\n");
    memcpy(row, p, len);
    row[len] = 0;
    return row;
}

START_TEST(test_readme_names_every_source_file)
{
    static const char *const dirs[] = {"daemon", "client", "tiers", "policies", "kernels"};
    size_t checked = 0;
    rm_load();
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
        char path[512];
        const char *row = rm_row(dirs[i]);
        snprintf(path, sizeof(path), "%s/%s", KVC_SRC_DIR, dirs[i]);
        DIR *d = opendir(path);
        struct dirent *e;
        ck_assert_ptr_nonnull(d);
        while ((e = readdir(d))) {
            size_t l = strlen(e->d_name);
            char want[300];
            if (!((l > 2 && strcmp(e->d_name + l - 2, ".c") == 0) ||
                  (l > 3 && strcmp(e->d_name + l - 3, ".cu") == 0)))
                continue;
            snprintf(want, sizeof(want), "`%s`", e->d_name);
            ck_assert_msg(strstr(row, want), "README.md's row of %s/ does not name %s", dirs[i],
                          want);
            checked++;
        }
        closedir(d);
    }
    ck_assert_uint_gt(checked, 40);
}
END_TEST

/* The checks can fail: a table without a folder, a row without a file. */
START_TEST(test_readme_check_can_fail)
{
    rm_load();
    char *p = strstr(rm_table, "`tests/lib/`");
    ck_assert_ptr_nonnull(p);
    memcpy(p, "`tests/xxx/", 11);
    ck_assert_ptr_null(strstr(rm_table, "`tests/lib/`"));
    ck_assert_ptr_null(strstr(rm_row("tiers"), "`nonesuch.c`"));
}
END_TEST

/* Whether path (relative to base, a folder under the source tree) names a file or folder. */
static bool rm_exists(const char *base, const char *path, size_t len)
{
    char full[2048];
    struct stat st;
    if (len == 0 || len > 900)
        return false;
    snprintf(full, sizeof(full), "%s/%.*s", base, (int)len, path);
    return stat(full, &st) == 0;
}

/*
 * The broken references of one page's text (dir: its folder, under the source tree): relative
 * link targets `](target)` and `docs/….md` paths; each broken one is reported in msg. Count.
 */
static size_t rm_broken_refs(const char *text, const char *dir, const char *page, char *msg,
                             size_t cap)
{
    size_t broken = 0;
    for (const char *p = strstr(text, "]("); p; p = strstr(p + 2, "](")) {
        const char *t = p + 2;
        size_t len = strcspn(t, ")# \n");
        if (len == 0 || strncmp(t, "http:", 5) == 0 || strncmp(t, "https:", 6) == 0 ||
            strncmp(t, "mailto:", 7) == 0)
            continue;
        if (!rm_exists(dir, t, len) && broken++ == 0)
            snprintf(msg, cap, "%s links to %.*s, which does not exist", page, (int)len, t);
    }
    for (const char *p = strstr(text, "docs/"); p; p = strstr(p + 5, "docs/")) {
        size_t len =
            strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./");
        bool history = p - text >= 8 && strncmp(p - 8, "git log ", 8) == 0;
        history = history || (p - text >= 11 && strncmp(p - 11, "git log -- ", 11) == 0);
        if ((p > text && (p[-1] == '/' || isalnum((unsigned char)p[-1]))) || history)
            continue; /* part of a longer path (…/docs/…), or a pointer into git history */
        while (len > 0 && p[len - 1] == '.')
            len--;
        if (len < 8 || strncmp(p + len - 3, ".md", 3) != 0)
            continue;
        if (!rm_exists(KVC_SRC_DIR, p, len) && broken++ == 0)
            snprintf(msg, cap, "%s names %.*s, which does not exist", page, (int)len, p);
    }
    return broken;
}

/* Every Markdown page under dir (recursively), checked; the number of pages read. */
static size_t rm_check_pages(const char *dir)
{
    static char text[RM_TEXT];
    size_t pages = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    ck_assert_msg(d != NULL, "cannot open %s", dir);
    while ((e = readdir(d))) {
        char path[1024];
        struct stat st;
        size_t l = strlen(e->d_name);
        if (rm_skip(e->d_name))
            continue;
        snprintf(path, sizeof(path), "%.800s/%.200s", dir, e->d_name);
        if (stat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            pages += rm_check_pages(path);
            continue;
        }
        if (l < 4 || strcmp(e->d_name + l - 3, ".md") != 0)
            continue;
        FILE *f = fopen(path, "re");
        ck_assert_ptr_nonnull(f);
        size_t n = fread(text, 1, sizeof(text) - 1, f);
        text[n] = 0;
        fclose(f);
        char msg[1400] = "";
        ck_assert_msg(rm_broken_refs(text, dir, path, msg, sizeof(msg)) == 0, "%s", msg);
        pages++;
    }
    closedir(d);
    return pages;
}

START_TEST(test_doc_references_resolve)
{
    char msg[1400] = "";
    rm_load();
    ck_assert_msg(rm_broken_refs(rm_readme, KVC_SRC_DIR, "README.md", msg, sizeof(msg)) == 0, "%s",
                  msg);
    ck_assert_uint_gt(rm_check_pages(KVC_SRC_DIR "/docs"), 10);
    ck_assert_uint_ge(rm_check_pages(KVC_SRC_DIR "/python"), 1);
}
END_TEST

/* The reference check can fail: a link and a path to pages that are not there. */
START_TEST(test_doc_references_check_can_fail)
{
    char msg[1400] = "";
    const char *good = "see [engines](engines.md), docs/remote.md and `git log -- docs/gone.md`";
    ck_assert_uint_eq(rm_broken_refs(good, KVC_SRC_DIR "/docs", "good", msg, sizeof(msg)), 0);
    ck_assert_uint_eq(rm_broken_refs("[x](nope.md)", KVC_SRC_DIR "/docs", "a", msg, sizeof(msg)),
                      1);
    ck_assert_ptr_nonnull(strstr(msg, "nope.md"));
    ck_assert_uint_eq(
        rm_broken_refs("read docs/policies-ship.md.", KVC_SRC_DIR, "b", msg, sizeof(msg)), 1);
    ck_assert_ptr_nonnull(strstr(msg, "docs/policies-ship.md,"));
}
END_TEST

/* ---- the programs' usage as README.md shows it ------------------------------------- */

/* The README.md block that starts with `start`, up to the line closing it, into out. */
static void rm_block(const char *start, char *out, size_t len)
{
    const char *p = strstr(rm_readme, start), *end;
    ck_assert_msg(p != NULL, "README.md shows no \"%s\"", start);
    end = strstr(p, "\n```");
    ck_assert_ptr_nonnull(end);
    ck_assert_uint_lt((size_t)(end - p) + 1, len);
    memcpy(out, p, (size_t)(end - p) + 1);
    out[end - p + 1] = 0;
}

/* README.md's `kvcctl` block is what `kvcctl --help` prints (with the default socket of a
 * user without $XDG_RUNTIME_DIR, which is root's), and its `kvcreplay` synopsis the start of
 * `kvcreplay --help`: a new command or option changes both. */
START_TEST(test_readme_usages_match_the_programs)
{
    static char want[16384], out[16384], err[4096];
    const char *ctl[] = {"/usr/bin/env",          "-u",     "KVCD_SOCKET", "-u", "XDG_RUNTIME_DIR",
                         KVC_BUILD_BIN "/kvcctl", "--help", NULL};
    const char *replay[] = {KVC_BUILD_BIN "/kvcreplay", "--help", NULL};
    rm_load();
    rm_block("usage: kvcctl [-s SOCKET]", want, sizeof(want));
    ck_assert_int_eq(daemon_run(ctl, out, sizeof(out), err, sizeof(err), daemon_ms(20000)), 0);
    ck_assert_msg(strcmp(want, out) == 0, "README.md's kvcctl block:\n%s\nkvcctl --help:\n%s", want,
                  out);
    rm_block("usage: kvcreplay [-s SOCKET]", want, sizeof(want));
    ck_assert_int_eq(daemon_run(replay, out, sizeof(out), err, sizeof(err), daemon_ms(20000)), 0);
    ck_assert_msg(strncmp(want, out, strlen(want)) == 0,
                  "README.md's kvcreplay synopsis:\n%s\nkvcreplay --help:\n%s", want, out);
}
END_TEST

/* ---- the C examples, compiled and run ------------------------------------------------ */

#define RM_PROG (1 << 16)

/* The text between the line after `open` (from `from` on) and the next line starting with
 * `close`, into out with troff's "\-" read as "-"; 0, or -1 when there is none. */
static int rm_example(const char *text, const char *from, const char *open, const char *close,
                      char *out, size_t len)
{
    const char *p = strstr(text, from), *end;
    size_t n = 0;
    if (!p || !(p = strstr(p, open)) || !(p = strchr(p, '\n')) || !(end = strstr(++p, close)))
        return -1;
    for (; p < end && n + 1 < len; p++)
        if (!(p[0] == '\\' && p[1] == '-'))
            out[n++] = *p;
    out[n] = 0;
    return 0;
}

/* Writes prog.c into dir: the example's #include lines first, then main() with the names the
 * example leaves to the reader (decl: a prompt's tokens and an engine's cache of 2 MiB
 * blocks), the example's other lines, and a line printing n and hit before its
 * kvc_disconnect; compiles it against this build's libkvc.so into dir/prog. The cc exit. */
static int rm_build_example(const char *dir, const char *example, const char *decl)
{
    static char prog[RM_PROG];
    char path[512], out[4096], err[4096];
    size_t n = (size_t)snprintf(prog, sizeof(prog),
                                "#include <err.h>\n#include <stdint.h>\n#include <stdio.h>\n"
                                "#include <stdlib.h>\n#include <string.h>\n");
    for (const char *l = example; *l; l = strchr(l, '\n') + 1) {
        if (strncmp(l, "#include", 8) == 0)
            n += (size_t)snprintf(prog + n, sizeof(prog) - n, "%.*s\n", (int)(strchr(l, '\n') - l),
                                  l);
        if (!strchr(l, '\n'))
            break;
    }
    n += (size_t)snprintf(prog + n, sizeof(prog) - n,
                          "static __attribute__((unused)) void compute_kv(void **b, int n)\n{\n"
                          "    for (int i = 0; i < n; i++) memset(b[i], 7, 2u << 20);\n}\n"
                          "int main(void)\n{\n    static uint32_t tokens[100];\n"
                          "    size_t ntokens = 100;\n"
                          "    for (size_t i = 0; i < ntokens; i++) tokens[i] = (uint32_t)i;\n"
                          "%s\n",
                          decl);
    for (const char *l = example; *l;) {
        const char *e = strchr(l, '\n');
        int ll = e ? (int)(e - l) : (int)strlen(l);
        if (strncmp(l, "#include", 8) != 0) {
            if (strncmp(l, "kvc_disconnect(c);", 18) == 0)
                n += (size_t)snprintf(prog + n, sizeof(prog) - n,
                                      "printf(\"n %%d hit %%d\\n\", n, hit);\n");
            n += (size_t)snprintf(prog + n, sizeof(prog) - n, "%.*s\n", ll, l);
            /* the engine's cache, as the example's comment says */
            if (strncmp(l, "void *blocks[256];", 18) == 0)
                n += (size_t)snprintf(prog + n, sizeof(prog) - n,
                                      "for (int i = 0; i < 256; i++) blocks[i] = "
                                      "calloc(1, 2u << 20);\n");
        }
        if (!e)
            break;
        l = e + 1;
    }
    n += (size_t)snprintf(prog + n, sizeof(prog) - n, "    return 0;\n}\n");
    ck_assert_uint_lt(n, sizeof(prog) - 1);
    snprintf(path, sizeof(path), "%s/prog.c", dir);
    FILE *f = fopen(path, "we");
    ck_assert_ptr_nonnull(f);
    fputs(prog, f);
    ck_assert_int_eq(fclose(f), 0);
    const char *argv[] = {"/bin/sh", "-c",
                          "cc -std=gnu11 -Wall -Werror " RM_SAN " -I" KVC_SRC_DIR "/client -o "
                          "\"$0/prog\" \"$0/prog.c\" -L" KVC_BUILD_BIN "/../lib -lkvc "
                          "-Wl,-rpath," KVC_BUILD_BIN "/../lib",
                          dir, NULL};
    int rc = daemon_run(argv, out, sizeof(out), err, sizeof(err), daemon_ms(120000));
    ck_assert_msg(rc == 0, "the example does not compile (exit %d):\n%s\n%s%s", rc, prog, out, err);
    return rc;
}

/* Runs dir/prog against d twice: the first run computes every block, the second hits all. */
static void rm_run_example(const struct daemon *d, const char *what)
{
    char cmd[600], out[4096], err[4096];
    /* (leaks off: the engine's cache the harness gives the example lives until exit) */
    snprintf(cmd, sizeof(cmd), "ASAN_OPTIONS=detect_leaks=0 KVCD_SOCKET='%s' '%s/prog'", d->sock,
             d->dir);
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    for (int run = 0; run < 2; run++) {
        int rc = daemon_run(argv, out, sizeof(out), err, sizeof(err), daemon_ms(60000));
        ck_assert_msg(rc == 0, "%s, run %d: exit %d\n%s%s", what, run, rc, out, err);
        ck_assert_msg(strcmp(out, run ? "n 6 hit 6\n" : "n 6 hit 0\n") == 0, "%s, run %d: %s", what,
                      run, out);
    }
}

/* README.md's libkvc example and libkvc(3)'s EXAMPLE compile with -Wall -Werror against this
 * build and, run twice against a real kvcd, store a 100-token prompt's 6 blocks and then
 * load all of them. */
START_TEST(test_c_examples_compile_and_run)
{
    static char text[RM_TEXT], example[RM_PROG];
    static const char *const args[] = {"-o", "host.size=64m", NULL};
    struct daemon d = {0};
    ck_assert_int_eq(daemon_start(&d, args), 0);
    rm_load();
    ck_assert_int_eq(rm_example(rm_readme, "## libkvc", "```c", "```", example, sizeof(example)),
                     0);
    rm_build_example(d.dir, example,
                     "    static void *dst[256];\n    static const void *blocks[256];\n"
                     "    for (int i = 0; i < 256; i++) blocks[i] = dst[i] = calloc(1, 2u << 20);");
    rm_run_example(&d, "README.md's libkvc example");
    FILE *f = fopen(KVC_SRC_DIR "/docs/man/libkvc.3", "re");
    ck_assert_ptr_nonnull(f);
    text[fread(text, 1, sizeof(text) - 1, f)] = 0;
    fclose(f);
    ck_assert_int_eq(rm_example(text, ".SH EXAMPLE", ".nf", "\n.fi", example, sizeof(example)), 0);
    rm_build_example(d.dir, example, "");
    rm_run_example(&d, "libkvc(3)'s EXAMPLE");
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_cleanup(&d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("readme");
    TCase *tc = tcase_create("readme");
    tcase_set_timeout(tc, daemon_slow() * 300);
    tcase_add_test(tc, test_readme_names_every_folder);
    tcase_add_test(tc, test_readme_names_every_source_file);
    tcase_add_test(tc, test_readme_check_can_fail);
    tcase_add_test(tc, test_doc_references_resolve);
    tcase_add_test(tc, test_doc_references_check_can_fail);
    tcase_add_test(tc, test_c_examples_compile_and_run);
    tcase_add_test(tc, test_readme_usages_match_the_programs);
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
