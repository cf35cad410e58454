/*
 * check_config.c — the configuration module: defaults, files good and bad, value formats,
 * -o overrides, validation, reload checks, print/load round trips, and etc/kvcd.ini kept
 * identical to config_print of the defaults.
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/config_ns.h"
#include "policies/policy.h"
#include "tests/lib/daemon.h"

/* ---- temp files: one mkdtemp directory for the suite -------------------------------------
 * An unchecked fixture, so it runs in the parent: a failing case (whose fork exits at the
 * failed assertion) still has its files removed. */

static char tmp_dir[64];

static void tmp_setup(void)
{
    snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/check_config.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static void tmp_teardown(void)
{
    DIR *d = opendir(tmp_dir);
    struct dirent *e;

    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, ".."))
            unlinkat(dirfd(d), e->d_name, 0);
    if (d)
        closedir(d);
    rmdir(tmp_dir);
}

/* Writes text to a new file in the suite's directory; the path stays valid for 8 calls. */
static const char *tmp_write(const char *name, const char *text, size_t len)
{
    static char paths[8][128];
    static unsigned n;
    char *path = paths[n++ % 8];
    FILE *f;

    snprintf(path, sizeof(paths[0]), "%s/%s", tmp_dir, name);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(text, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

static const char *tmp_write_str(const char *name, const char *text)
{
    return tmp_write(name, text, strlen(text));
}

/* config_load_buffer on a string, name "t.ini". */
static int load_str(struct config *c, const char *text, char *err, size_t errlen)
{
    return config_load_buffer(c, "t.ini", text, strlen(text), err, errlen);
}

static void assert_get(const struct config *c, const char *key, const char *want)
{
    char buf[256];

    ck_assert_int_eq(config_get(c, key, buf, sizeof(buf)), 0);
    ck_assert_msg(strcmp(buf, want) == 0, "%s: got '%s', want '%s'", key, buf, want);
}

/* Every option of a and b reads the same. */
static void assert_same(const struct config *a, const struct config *b)
{
    for (size_t i = 0; i < config_noptions; i++) {
        char key[128], va[256], vb[256];
        snprintf(key, sizeof(key), "%s.%s", config_options[i].section, config_options[i].name);
        ck_assert_int_eq(config_get(a, key, va, sizeof(va)), 0);
        ck_assert_int_eq(config_get(b, key, vb, sizeof(vb)), 0);
        ck_assert_msg(strcmp(va, vb) == 0, "%s: '%s' != '%s'", key, va, vb);
    }
}

/* ---- the table and the defaults --------------------------------------------------------- */

/* cache.policy's choices are the policy library's names, in enum policy_kind order. */
START_TEST(test_policy_choices)
{
    struct config *c = config_new();
    char err[256];
    for (int k = 0; k < POLICY_KIND_COUNT; k++) {
        ck_assert_msg(config_set(c, "cache.policy", policy_name((enum policy_kind)k), err,
                                 sizeof(err)) == 0,
                      "%s", err);
        ck_assert_int_eq(c->cache_policy, k);
    }
    ck_assert_int_ne(config_set(c, "cache.policy", "nonesuch", err, sizeof(err)), 0);
    ck_assert_int_eq(config_ns_set(&c->ns, "m*", "policy", "h2o", err, sizeof(err)), 0);
    ck_assert_int_eq(c->ns.sec[0].policy, POLICY_H2O);
    ck_assert_int_eq(config_ns_set(&c->ns, "n*", "policy", "nonesuch", err, sizeof(err)), -EINVAL);
    /* the precision ladder's keys: numbers >= 0, anything else refused with a reason */
    ck_assert_int_eq(config_ns_set(&c->ns, "m*", "lossy_weight", "2.5", err, sizeof(err)), 0);
    ck_assert_int_eq(config_ns_set(&c->ns, "m*", "max_error", "0.05", err, sizeof(err)), 0);
    ck_assert_double_eq(c->ns.sec[0].lossy_weight, 2.5);
    ck_assert_double_eq(c->ns.sec[0].max_error, 0.05);
    ck_assert_int_eq(config_ns_set(&c->ns, "m*", "max_error", "0.1", err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "duplicate"));
    static const char *const bad[] = {"-1", "x", "", "0.5x", "nan", "1e9"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(config_ns_set(&c->ns, "o*", "max_error", bad[i], err, sizeof(err)),
                         -EINVAL);
        ck_assert_ptr_nonnull(strstr(err, "max_error"));
        ck_assert_int_eq(config_ns_set(&c->ns, "o*", "lossy_weight", bad[i], err, sizeof(err)),
                         -EINVAL);
        ck_assert_ptr_nonnull(strstr(err, "lossy_weight"));
    }
    config_free(c);
}
END_TEST

START_TEST(test_defaults)
{
    struct config *c = config_new();
    char err[256];

    ck_assert_ptr_nonnull(c);
    ck_assert_str_eq(c->server_socket, "");
    ck_assert_str_eq(c->server_socket_group, "");
    ck_assert_uint_eq(c->server_socket_mode, 0660);
    ck_assert_int_eq(c->server_max_clients, 1024);
    ck_assert_int_eq(c->server_max_leases, 4096);
    ck_assert_int_eq(c->server_max_namespaces, 256);
    ck_assert_int_eq(c->log_level, CONFIG_LOG_INFO);
    ck_assert_int_eq(c->log_rate_limit, 20);
    ck_assert_uint_eq(c->host_size, UINT64_C(1) << 30);
    ck_assert_uint_eq(c->host_page_size, UINT64_C(2) << 20);
    ck_assert_int_eq(c->host_hugepages, CONFIG_HUGEPAGES_AUTO);
    ck_assert(c->host_prefault);
    ck_assert_double_eq(c->host_high_watermark, 0.99);
    ck_assert_double_eq(c->host_low_watermark, 0.98);
    ck_assert_int_eq(c->cache_policy, POLICY_DEFAULT);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), 0);
    ck_assert_str_eq(err, "");
    config_free(c);
    config_free(NULL);
}
END_TEST

/* The limits (docs/security.md): every one on by default, bounded, reloadable, and shown by
 * CONFIG_GET the way a file writes it. */
START_TEST(test_limits)
{
    static const char *const shown[][2] = {
        {"server.max_clients_per_uid", "64"},  {"server.hello_timeout", "5s"},
        {"server.idle_timeout", "1h"},         {"server.max_waits", "16"},
        {"server.reservation_timeout", "1m"},  {"server.max_namespaces_per_uid", "16"},
        {"quota.client_pins", "262144"},       {"quota.client_reservations", "1024"},
        {"quota.uid_pins", "1048576"},         {"quota.uid_leases", "16384"},
        {"quota.uid_reserved_share", "25"},
    };
    static const char *const bad[][2] = {
        {"server.max_clients_per_uid", "0"}, {"server.hello_timeout", "99ms"},
        {"server.hello_timeout", "2h"},      {"server.idle_timeout", "999"},
        {"server.max_waits", "0"},           {"server.reservation_timeout", "50ms"},
        {"server.max_namespaces_per_uid", "0"}, {"quota.uid_pins", "0"},
        {"quota.uid_leases", "0"},           {"quota.uid_reserved_share", "0"},
        {"quota.uid_reserved_share", "101"}, {"server.idle_timeout", "-1s"},
    };
    struct config *c = config_new(), *next;
    char err[256], buf[64];

    ck_assert_int_eq(c->server_max_clients_per_uid, 64);
    ck_assert_uint_eq(c->server_hello_timeout, 5000);
    ck_assert_uint_eq(c->server_idle_timeout, 3600000);
    ck_assert_int_eq(c->server_max_waits, 16);
    ck_assert_uint_eq(c->server_reservation_timeout, 60000);
    ck_assert_int_eq(c->server_max_namespaces_per_uid, 16);
    ck_assert_int_eq(c->quota_client_pins, 262144);
    ck_assert_int_eq(c->quota_client_reservations, 1024);
    ck_assert_int_eq(c->quota_uid_pins, 1048576);
    ck_assert_int_eq(c->quota_uid_leases, 16384);
    ck_assert_int_eq(c->quota_uid_reserved_share, 25);
    for (size_t i = 0; i < sizeof(shown) / sizeof(shown[0]); i++) {
        ck_assert_int_eq(config_get(c, shown[i][0], buf, sizeof(buf)), 0);
        ck_assert_msg(strcmp(buf, shown[i][1]) == 0, "%s = %s", shown[i][0], buf);
        ck_assert_msg(config_option_find(shown[i][0])->reloadable, "%s", shown[i][0]);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(config_set(c, bad[i][0], bad[i][1], err, sizeof(err)) == -EINVAL,
                      "%s = %s accepted", bad[i][0], bad[i][1]);
    ck_assert_int_eq(config_set(c, "server.hello_timeout", "250ms", err, sizeof(err)), 0);
    ck_assert_uint_eq(c->server_hello_timeout, 250);
    ck_assert_int_eq(config_set(c, "server.reservation_timeout", "2m", err, sizeof(err)), 0);
    ck_assert_uint_eq(c->server_reservation_timeout, 120000);
    ck_assert_int_eq(config_set(c, "quota.uid_reserved_share", "100", err, sizeof(err)), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), 0);
    /* All of them change on reload, in one go. */
    next = config_dup(c);
    ck_assert_int_eq(config_set(next, "server.max_clients_per_uid", "2", NULL, 0), 0);
    ck_assert_int_eq(config_set(next, "server.idle_timeout", "10s", NULL, 0), 0);
    ck_assert_int_eq(config_set(next, "quota.uid_pins", "7", NULL, 0), 0);
    ck_assert_int_eq(config_check_reload(c, next, err, sizeof(err)), 0);
    /* From a file, with line numbers in the errors. */
    static const char text[] = "[server]\nhello_timeout = 1s\nmax_waits = 4\n"
                               "[quota]\nuid_reserved_share = 0\n";
    ck_assert_int_eq(config_load_buffer(next, "l.ini", text, sizeof(text) - 1, err, sizeof(err)),
                     -EINVAL);
    ck_assert_msg(strstr(err, "l.ini:5:") != NULL, "%s", err);
    config_free(next);
    config_free(c);
}
END_TEST

/* Walks the option table: every string option says who may read it (config_option_access:
 * a new one that does not fails here), every option whose name says it holds a secret is a
 * SECRET for admins only, and a secret that is set is shown by neither config_get ("(set)")
 * nor config_print, nor in a message about it. */
START_TEST(test_secrets_never_shown)
{
    static const char *const secretish[] = {"password",   "passwd",     "secret",  "token",
                                            "passphrase", "credential", "private", "apikey"};
    struct config *c = config_new();
    int secrets = 0;
    ck_assert_ptr_nonnull(c);
    for (size_t i = 0; i < config_noptions; i++) {
        const struct config_option *o = &config_options[i];
        size_t nl = strlen(o->name);
        bool file = nl > 5 && (strcmp(o->name + nl - 5, "_file") == 0 ||
                               strcmp(o->name + nl - 5, "_path") == 0);
        char key[128], value[128], buf[512], err[512];
        if (o->type == CONFIG_TYPE_STRING || o->type == CONFIG_TYPE_SECRET)
            ck_assert_msg(config_option_access(o) != CONFIG_ACCESS_NONE,
                          "%s.%s: a string option not in CONFIG_STRING_ACCESS", o->section,
                          o->name);
        /* Word by word ("recompute_tokens_per_s" holds no token). */
        char words[128];
        snprintf(words, sizeof(words), "%s", o->name);
        for (char *save = NULL, *wd = strtok_r(words, "_", &save); wd && !file;
             wd = strtok_r(NULL, "_", &save))
            for (size_t w = 0; w < sizeof(secretish) / sizeof(secretish[0]); w++)
                ck_assert_msg(strcmp(wd, secretish[w]) != 0 || o->type == CONFIG_TYPE_SECRET,
                              "%s.%s holds a secret: make it a SECRET", o->section, o->name);
        if (o->type != CONFIG_TYPE_SECRET)
            continue;
        secrets++;
        ck_assert_int_eq(config_option_access(o), CONFIG_ACCESS_ADMIN);
        snprintf(key, sizeof(key), "%s.%s", o->section, o->name);
        snprintf(value, sizeof(value), "s3cret-%s-v4lue", o->name);
        ck_assert_int_eq(config_set(c, key, value, err, sizeof(err)), 0);
        ck_assert_int_eq(config_get(c, key, buf, sizeof(buf)), 0);
        ck_assert_str_eq(buf, "(set)");
        /* A bad value's message does not repeat it. */
        ck_assert_int_eq(config_set(c, key, "s3cret\twith-a-tab", err, sizeof(err)), -EINVAL);
        ck_assert_msg(!strstr(err, "s3cret"), "%s", err);
        ck_assert_int_eq(config_get(c, key, buf, sizeof(buf)), 0);
        ck_assert_str_eq(buf, "(set)");
    }
    ck_assert_int_ge(secrets, 1); /* remote.password */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(config_print(c, f), 0);
    fclose(f);
    ck_assert_msg(!strstr(text, "s3cret"), "config_print shows a secret");
    ck_assert_ptr_nonnull(strstr(text, "# password is set; its value is never printed"));
    free(text);
    /* Cleared, it reads as empty again. */
    char err[256], buf[64];
    ck_assert_int_eq(config_set(c, "remote.password", "", err, sizeof(err)), 0);
    ck_assert_int_eq(config_get(c, "remote.password", buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "");
    config_free(c);
}
END_TEST

/* Namespaces with access lists stay out of the remote tier unless their section says so,
 * and only in a sealed tier; a group secret needs a sealed tier. */
START_TEST(test_remote_restricted)
{
    struct config *c = config_new();
    char err[512];
    ck_assert_int_eq(config_ns_set(&c->ns, "open*", "remote", "no", err, sizeof(err)), 0);
    ck_assert_int_eq(config_ns_set(&c->ns, "locked*", "read", "0", err, sizeof(err)), 0);
    ck_assert_int_eq(config_ns_set(&c->ns, "shared*", "read", "0", err, sizeof(err)), 0);
    ck_assert_int_eq(config_ns_set(&c->ns, "shared*", "remote", "yes", err, sizeof(err)), 0);
    ck_assert_int_eq(config_ns_set(&c->ns, "anyone*", "read", "*", err, sizeof(err)), 0);
    ck_assert(!config_ns_remote(&c->ns, c->remote_seal, "open-model"));
    ck_assert(!config_ns_remote(&c->ns, c->remote_seal, "locked-model"));
    ck_assert(config_ns_remote(&c->ns, c->remote_seal, "shared-model"));
    ck_assert(config_ns_remote(&c->ns, c->remote_seal,
                               "anyone-model")); /* a list of everyone restricts nothing */
    ck_assert(config_ns_remote(&c->ns, c->remote_seal, "unmatched"));
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), 0);
    ck_assert_int_eq(config_set(c, "remote.seal", "no", err, sizeof(err)), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "[namespace.shared*]") && strstr(err, "remote.seal = yes"), "%s",
                  err);
    ck_assert(!config_ns_remote(&c->ns, c->remote_seal, "shared-model")); /* never unsealed */
    config_free(c);
    c = config_new();
    ck_assert_int_eq(config_ns_set(&c->ns, "g*", "remote_key_file", "relative", err, sizeof(err)),
                     -EINVAL);
    ck_assert_int_eq(
        config_ns_set(&c->ns, "g*", "remote_key_file", "/etc/kvcd/g.key", err, sizeof(err)), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), 0);
    ck_assert_int_eq(config_set(c, "remote.seal", "no", err, sizeof(err)), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "remote_key_file"));
    config_free(c);
}
END_TEST

/* server.io_threads: an integer or the word auto (the default, held as -1), which the daemon
 * resolves from its CPUs: none below 4, one per 4, at most 4. */
START_TEST(test_io_threads_auto)
{
    struct config *c = config_new();
    const struct config_option *o = config_option_find("server.io_threads");
    char err[256], buf[64];
    ck_assert_ptr_nonnull(c);
    assert_get(c, "server.io_threads", "auto");
    ck_assert_int_eq(c->server_io_threads, -1);
    ck_assert_int_eq(config_get_json(c, o, buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "\"auto\"");
    ck_assert_int_eq(config_set(c, "server.io_threads", "4", err, sizeof(err)), 0);
    ck_assert_int_eq(c->server_io_threads, 4);
    ck_assert_int_eq(config_get_json(c, o, buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "4");
    ck_assert_int_eq(config_set(c, "server.io_threads", "AUTO", err, sizeof(err)), 0);
    assert_get(c, "server.io_threads", "auto");
    ck_assert_int_eq(config_set(c, "server.io_threads", "0", err, sizeof(err)), 0);
    assert_get(c, "server.io_threads", "0");
    /* no number below 0 (auto's -1 is not one to write), none past 64, no other word */
    ck_assert_int_eq(config_set(c, "server.io_threads", "-1", err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(config_set(c, "server.io_threads", "65", err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(config_set(c, "server.io_threads", "automatic", err, sizeof(err)), -EINVAL);
    assert_get(c, "server.io_threads", "0");
    static const long cpus[] = {1, 2, 3, 4, 7, 8, 12, 15, 16, 64, 1024};
    static const uint32_t want[] = {0, 0, 0, 1, 1, 2, 3, 3, 4, 4, 4};
    for (size_t i = 0; i < sizeof(cpus) / sizeof(cpus[0]); i++)
        ck_assert_uint_eq(config_io_threads_auto(cpus[i]), want[i]);
    config_free(c);
}
END_TEST

START_TEST(test_table)
{
    struct config *c = config_new();

    ck_assert_uint_eq(config_noptions, 73);
    for (size_t i = 0; i < config_noptions; i++) {
        const struct config_option *o = &config_options[i];
        char key[128];
        ck_assert(*o->section && *o->name && *o->help);
        ck_assert(o->type != CONFIG_TYPE_ENUM || o->choices);
        ck_assert(o->offset < sizeof(struct config));
        snprintf(key, sizeof(key), "%s.%s", o->section, o->name);
        ck_assert_ptr_eq(config_option_find(key), o);
    }
    ck_assert_uint_eq(config_option_find("host.size")->offset, offsetof(struct config, host_size));
    ck_assert_int_eq(config_option_find("host.size")->type, CONFIG_TYPE_SIZE);
    ck_assert_ptr_null(config_option_find("host"));
    ck_assert_ptr_null(config_option_find("host."));
    ck_assert_ptr_null(config_option_find(".size"));
    ck_assert_ptr_null(config_option_find("host.size.x"));
    ck_assert_ptr_null(config_option_find(NULL));
    /* The C enums follow the choices' order. */
    ck_assert_int_eq(config_set(c, "log.level", "error", NULL, 0), 0);
    ck_assert_int_eq(c->log_level, CONFIG_LOG_ERROR);
    ck_assert_int_eq(config_set(c, "log.level", "warning", NULL, 0), 0);
    ck_assert_int_eq(c->log_level, CONFIG_LOG_WARNING);
    ck_assert_int_eq(config_set(c, "log.level", "DEBUG", NULL, 0), 0);
    ck_assert_int_eq(c->log_level, CONFIG_LOG_DEBUG);
    ck_assert_int_eq(config_set(c, "host.hugepages", "on", NULL, 0), 0);
    ck_assert_int_eq(c->host_hugepages, CONFIG_HUGEPAGES_ON);
    ck_assert_int_eq(config_set(c, "host.hugepages", "off", NULL, 0), 0);
    ck_assert_int_eq(c->host_hugepages, CONFIG_HUGEPAGES_OFF);
    config_free(c);
}
END_TEST

START_TEST(test_dup)
{
    struct config *c = config_new(), *d;

    ck_assert_int_eq(config_set(c, "server.socket", "/run/a.sock", NULL, 0), 0);
    d = config_dup(c);
    ck_assert_ptr_nonnull(d);
    ck_assert_ptr_ne(d->server_socket, c->server_socket);
    ck_assert_int_eq(config_set(c, "server.socket", "/run/b.sock", NULL, 0), 0);
    ck_assert_str_eq(d->server_socket, "/run/a.sock");
    ck_assert_str_eq(c->server_socket, "/run/b.sock");
    ck_assert_int_eq(config_set(d, "server.socket", "/run/a.sock", NULL, 0), 0);
    config_free(c);
    config_free(d);
}
END_TEST

/* ---- files ------------------------------------------------------------------------------ */

START_TEST(test_load_good)
{
    static const char text[] =
        "\xef\xbb\xbf# a comment\r\n"
        "; another\n"
        "\n"
        "[server]\n"
        "socket = /run/kvcd/test.sock\n"
        "  socket_mode = 600   ; indented, with an inline comment\n"
        "\tmax_clients=17\n"
        "socket_group: kvc\n"
        "[host]\n"
        "size = 4GiB\n"
        "page_size = 64K\n"
        "prefault = Off\n"
        "hugepages = ON\n"
        "high_watermark = 0.8\n"
        "low_watermark = 5e-1\n"
        "[log]\n"
        "level = debug\n"
        "[server]\n" /* a section may be opened again */
        "max_leases = 1\n"
        "max_namespaces = 65535";
    struct config *c = config_new();
    char err[256];
    const char *path = tmp_write_str("good.ini", text);

    ck_assert_int_eq(config_load_file(c, path, err, sizeof(err)), 0);
    ck_assert_str_eq(err, "");
    ck_assert_str_eq(c->server_socket, "/run/kvcd/test.sock");
    ck_assert_uint_eq(c->server_socket_mode, 0600);
    ck_assert_int_eq(c->server_max_clients, 17);
    ck_assert_str_eq(c->server_socket_group, "kvc");
    ck_assert_uint_eq(c->host_size, UINT64_C(4) << 30);
    ck_assert_uint_eq(c->host_page_size, 64 << 10);
    ck_assert(!c->host_prefault);
    ck_assert_int_eq(c->host_hugepages, CONFIG_HUGEPAGES_ON);
    ck_assert_double_eq(c->host_high_watermark, 0.8);
    ck_assert_double_eq(c->host_low_watermark, 0.5);
    ck_assert_int_eq(c->log_level, CONFIG_LOG_DEBUG);
    ck_assert_int_eq(c->server_max_leases, 1);
    ck_assert_int_eq(c->server_max_namespaces, 65535);
    ck_assert_int_eq(c->log_rate_limit, 20); /* untouched */
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), 0);
    config_free(c);
}
END_TEST

START_TEST(test_load_empty)
{
    struct config *c = config_new(), *d = config_new();
    char err[64];

    ck_assert_int_eq(config_load_buffer(c, "e.ini", "", 0, err, sizeof(err)), 0);
    ck_assert_int_eq(load_str(c, "\n\n# only comments\n;\n", err, sizeof(err)), 0);
    ck_assert_int_eq(load_str(c, "[host]\n", err, sizeof(err)), 0);
    assert_same(c, d);
    /* The buffer need not be NUL-terminated: only len bytes are read. */
    ck_assert_int_eq(config_load_buffer(c, "n.ini", "[host]\nsize = 2gXXX", 16, err, sizeof(err)),
                     0);
    ck_assert_uint_eq(c->host_size, UINT64_C(2) << 30);
    config_free(c);
    config_free(d);
}
END_TEST

struct bad_case {
    const char *text;
    const char *err; /* exact message, or a prefix when it ends in '*' */
};

static const struct bad_case bad_cases[] = {
    {"[host]\nszie = 1g\n", "t.ini:2: unknown key 'szie' in [host] (did you mean 'size'?)"},
    {"[host]\npage_sise = 1m\n", "t.ini:2: unknown key 'page_sise' in [host] (did you mean "
                                 "'page_size'?)"},
    {"[host]\nmax_clients = 3\n",
     "t.ini:2: unknown key 'max_clients' in [host] (it belongs in [server])"},
    {"[log]\nzzzzzzzzzz = 1\n",
     "t.ini:2: unknown key 'zzzzzzzzzz' in [log] (keys in [log]: level rate_limit)"},
    {"[hots]\nsize = 1g\n", "t.ini:1: unknown section [hots] (did you mean [host]?)"},
    {"[server]\nmax_clients = 2\n[zzzzzzzz]\n",
     "t.ini:3: unknown section [zzzzzzzz] (sections: [server] [log] [host] [cache] [quota] [disk] [remote] [gpu])"},
    {"size = 1g\n", "t.ini:1: key 'size' outside of any [section]"},
    {"[host]\nprefault = maybe\n", "t.ini:2: host.prefault: 'maybe' is not a boolean*"},
    {"[host]\nprefault = 2\n", "t.ini:2: host.prefault: '2' is not a boolean*"},
    {"[host]\nsize = 12x\n", "t.ini:2: host.size: '12x' is not a size*"},
    {"[host]\nsize = -1g\n", "t.ini:2: host.size: '-1g' is not a size*"},
    {"[host]\nsize = 1.5g\n", "t.ini:2: host.size: '1.5g' has a fraction; write whole units*"},
    {"[host]\nsize = 99999999999999999999\n",
     "t.ini:2: host.size: '99999999999999999999' is out of range"},
    {"[host]\nsize = 1m\n", "t.ini:2: host.size: 1m is out of bounds (16m .. 4t)"},
    {"[host]\nsize = 8t\n", "t.ini:2: host.size: 8t is out of bounds (16m .. 4t)"},
    {"[host]\nsize =\n", "t.ini:2: host.size: empty value"},
    {"[server]\nsocket_mode = 0800\n",
     "t.ini:2: server.socket_mode: '0800' is not an octal mode (such as 0660)"},
    {"[server]\nsocket_mode = rw\n", "t.ini:2: server.socket_mode: 'rw' is not an octal*"},
    {"[server]\nsocket_mode = 01777\n",
     "t.ini:2: server.socket_mode: 1777 is out of bounds (0000 .. 0777)"},
    {"[log]\nlevel = verbose\n",
     "t.ini:2: log.level: 'verbose' is not one of error/warning/info/debug"},
    {"[server]\nmax_clients = 0\n",
     "t.ini:2: server.max_clients: 0 is out of bounds (1 .. 65536)"},
    {"[server]\nmax_clients = 12abc\n", "t.ini:2: server.max_clients: '12abc' is not an integer"},
    {"[server]\nmax_clients = 99999999999999999999\n",
     "t.ini:2: server.max_clients: '99999999999999999999' is out of range"},
    {"[server]\nmax_clients = -5\n",
     "t.ini:2: server.max_clients: -5 is out of bounds (1 .. 65536)"},
    {"[host]\nhigh_watermark = 1.5\n",
     "t.ini:2: host.high_watermark: 1.5 is out of bounds (0.05 .. 1)"},
    {"[host]\nhigh_watermark = nan\n", "t.ini:2: host.high_watermark: 'nan' is not a number"},
    {"[host]\nhigh_watermark = inf\n", "t.ini:2: host.high_watermark: 'inf' is not a number"},
    {"[host]\nhigh_watermark = 0x1p-1\n", "t.ini:2: host.high_watermark: '0x1p-1' is not*"},
    {"[host]\nhigh_watermark = 1e999\n", "t.ini:2: host.high_watermark: '1e999' is not*"},
    {"[host]\nsize 1g\n", "t.ini:2: syntax error (expected [section] or key = value)"},
    {"[host\nsize = 1g\n", "t.ini:1: syntax error (expected [section] or key = value)"},
    {"[host]\n\n\ngarbage\n", "t.ini:4: syntax error*"},
    {"[host]\nsize = 1g\npage_size = 4m\nsize = 2g\n",
     "t.ini:4: duplicate key 'size' in [host] (first set on line 2)"},
    {"[host]\nsize = 1g\n[server]\n[host]\nsize = 1g\n",
     "t.ini:5: duplicate key 'size' in [host] (first set on line 2)"},
    /* The first error by line wins, whoever finds it. */
    {"[host]\nszie = 1g\nnonsense\n", "t.ini:2: unknown key 'szie'*"},
    {"[host]\nnonsense\nszie = 1g\n", "t.ini:2: syntax error*"},
    {"[host]\n  size = 1g\n    page_size = 7\n", "t.ini:3: host.page_size: 7 is out of bounds*"},
    {"[server]\nsocket = a\x01z\n", "t.ini:2: server.socket: value has a control character"},
};

static void assert_err(const char *got, const char *want)
{
    size_t n = strlen(want);

    if (n && want[n - 1] == '*')
        ck_assert_msg(strncmp(got, want, n - 1) == 0, "got '%s', want '%s'", got, want);
    else
        ck_assert_msg(strcmp(got, want) == 0, "got '%s', want '%s'", got, want);
}

START_TEST(test_load_bad)
{
    const struct bad_case *t = &bad_cases[_i];
    struct config *c = config_new();
    char err[256];

    ck_assert_int_eq(load_str(c, t->text, err, sizeof(err)), -EINVAL);
    assert_err(err, t->err);
    config_free(c);
}
END_TEST

START_TEST(test_load_bad_file)
{
    struct config *c = config_new();
    char err[256], want[256];
    const char *path = tmp_write_str("bad.ini", "[host]\n\nszie = 1g\n");

    ck_assert_int_eq(config_load_file(c, path, err, sizeof(err)), -EINVAL);
    snprintf(want, sizeof(want), "%s:3: unknown key 'szie' in [host] (did you mean 'size'?)",
             path);
    ck_assert_str_eq(err, want);
    config_free(c);
}
END_TEST

START_TEST(test_load_missing)
{
    struct config *c = config_new();
    char path[128], err[256];

    snprintf(path, sizeof(path), "%s/nope.ini", tmp_dir);
    ck_assert_int_eq(config_load_file(c, path, err, sizeof(err)), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, path));
    ck_assert_int_eq(config_load_file(c, tmp_dir, err, sizeof(err)), -EISDIR);
    ck_assert_ptr_nonnull(strstr(err, tmp_dir));
    /* err is optional. */
    ck_assert_int_eq(config_load_file(c, path, NULL, 0), -ENOENT);
    config_free(c);
}
END_TEST

START_TEST(test_load_odd_bytes)
{
    struct config *c = config_new();
    char err[256], text[512];
    static const char nul[] = "[host]\nsize = 1g\0\n";

    ck_assert_int_eq(config_load_buffer(c, "t.ini", nul, sizeof(nul) - 1, err, sizeof(err)),
                     -EINVAL);
    ck_assert_str_eq(err, "t.ini:2: NUL byte in line");
    /* A line too long for inih is an error, not two lines. */
    snprintf(text, sizeof(text), "[server]\nsocket = /%0300d\nmax_clients = 5\n", 0);
    ck_assert_int_eq(load_str(c, text, err, sizeof(err)), -EINVAL);
    assert_err(err, "t.ini:2: line longer than *");
    ck_assert_str_eq(c->server_socket, "");
    /* A tiny err buffer is truncated and terminated. */
    ck_assert_int_eq(load_str(c, "[x]\n", err, 6), -EINVAL);
    ck_assert_str_eq(err, "t.ini");
    config_free(c);
}
END_TEST

START_TEST(test_load_big_file)
{
    struct config *c = config_new();
    char err[256];
    size_t len = (1u << 20) + 1;
    char *text = malloc(len);
    const char *path;

    ck_assert_ptr_nonnull(text);
    memset(text, '\n', len);
    path = tmp_write("big.ini", text, len);
    ck_assert_int_eq(config_load_file(c, path, err, sizeof(err)), -EFBIG);
    path = tmp_write("fits.ini", text, len - 1);
    ck_assert_int_eq(config_load_file(c, path, err, sizeof(err)), 0);
    free(text);
    config_free(c);
}
END_TEST

/* ---- sizes and durations ---------------------------------------------------------------- */

struct num_case {
    const char *s;
    int rc;
    uint64_t v;
};

static const struct num_case size_cases[] = {
    {"0", 0, 0},
    {"1", 0, 1},
    {"512", 0, 512},
    {"1b", 0, 1},
    {"1B", 0, 1},
    {"64k", 0, 64 << 10},
    {"64K", 0, 64 << 10},
    {"64kb", 0, 64 << 10},
    {"64KiB", 0, 64 << 10},
    {"64kIb", 0, 64 << 10},
    {"512m", 0, 512 << 20},
    {"512MB", 0, 512 << 20},
    {"4g", 0, UINT64_C(4) << 30},
    {"4G", 0, UINT64_C(4) << 30},
    {"4gib", 0, UINT64_C(4) << 30},
    {"1t", 0, UINT64_C(1) << 40},
    {"0g", 0, 0},
    {"007m", 0, 7 << 20},
    {"16777215t", 0, UINT64_C(16777215) << 40},
    {"17179869183g", 0, UINT64_C(17179869183) << 30},
    {"18446744073709551615", 0, UINT64_MAX},
    {"16777216t", -ERANGE, 0},
    {"17179869184g", -ERANGE, 0},
    {"18446744073709551616", -ERANGE, 0},
    {"99999999999999999999999k", -ERANGE, 0},
    {"", -EINVAL, 0},
    {"k", -EINVAL, 0},
    {"-1", -EINVAL, 0},
    {"+1", -EINVAL, 0},
    {" 1", -EINVAL, 0},
    {"1 ", -EINVAL, 0},
    {"1 m", -EINVAL, 0},
    {"1.5g", -EINVAL, 0},
    {"1kk", -EINVAL, 0},
    {"1kbb", -EINVAL, 0},
    {"1kib ", -EINVAL, 0},
    {"1i", -EINVAL, 0},
    {"1ib", -EINVAL, 0},
    {"1bb", -EINVAL, 0},
    {"1x", -EINVAL, 0},
    {"1p", -EINVAL, 0},
    {"0x10", -EINVAL, 0},
    {"1e3", -EINVAL, 0},
};

static const struct num_case duration_cases[] = {
    {"0", 0, 0},
    {"500", 0, 500},
    {"500ms", 0, 500},
    {"500MS", 0, 500},
    {"10s", 0, 10000},
    {"2m", 0, 120000},
    {"1h", 0, 3600000},
    {"0h", 0, 0},
    {"18446744073709551615", 0, UINT64_MAX},
    {"18446744073709551615ms", 0, UINT64_MAX},
    {"18446744073709551s", 0, UINT64_C(18446744073709551000)},
    {"18446744073709552s", -ERANGE, 0},
    {"18446744073709551615h", -ERANGE, 0},
    {"18446744073709551616", -ERANGE, 0},
    {"", -EINVAL, 0},
    {"ms", -EINVAL, 0},
    {"1.5s", -EINVAL, 0},
    {"-1s", -EINVAL, 0},
    {"1d", -EINVAL, 0},
    {"1min", -EINVAL, 0},
    {"1m30s", -EINVAL, 0},
    {"10 s", -EINVAL, 0},
    {"1us", -EINVAL, 0},
};

START_TEST(test_parse_size)
{
    const struct num_case *t = &size_cases[_i];
    uint64_t v = 0xdead;
    int rc = config_parse_size(t->s, &v);

    ck_assert_msg(rc == t->rc, "'%s': rc %d, want %d", t->s, rc, t->rc);
    ck_assert_msg(v == (t->rc ? 0xdead : t->v), "'%s': %llu", t->s, (unsigned long long)v);
}
END_TEST

START_TEST(test_parse_duration)
{
    const struct num_case *t = &duration_cases[_i];
    uint64_t v = 0xdead;
    int rc = config_parse_duration_ms(t->s, &v);

    ck_assert_msg(rc == t->rc, "'%s': rc %d, want %d", t->s, rc, t->rc);
    ck_assert_msg(v == (t->rc ? 0xdead : t->v), "'%s': %llu", t->s, (unsigned long long)v);
}
END_TEST

/* Sizes come back with the largest exact suffix. */
START_TEST(test_size_format)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"1073741824", "1g"}, {"1536m", "1536m"}, {"16777217", "16777217"}, {"4t", "4t"},
        {"4096g", "4t"},      {"2047m", "2047m"}, {"3g", "3g"},             {"17m", "17m"},
        {"16385k", "16385k"}, {"1024MiB", "1g"},
    };
    struct config *c = config_new();
    char err[256];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ck_assert_msg(config_set(c, "host.size", cases[i].in, err, sizeof(err)) == 0, "%s: %s",
                      cases[i].in, err);
        assert_get(c, "host.size", cases[i].out);
    }
    ck_assert_int_eq(config_set(c, "host.page_size", "65536", err, sizeof(err)), 0);
    assert_get(c, "host.page_size", "64k");
    config_free(c);
}
END_TEST

/* ---- -o overrides and config_get --------------------------------------------------------- */

START_TEST(test_set)
{
    struct config *c = config_new();
    char err[256], path[200];

    ck_assert_int_eq(config_set(c, "host.size", "4g", err, sizeof(err)), 0);
    ck_assert_str_eq(err, "");
    ck_assert_uint_eq(c->host_size, UINT64_C(4) << 30);
    assert_get(c, "host.size", "4g");
    ck_assert_int_eq(config_set(c, "server.socket_mode", "0600", err, sizeof(err)), 0);
    assert_get(c, "server.socket_mode", "0600");
    ck_assert_int_eq(config_set(c, "server.socket", "/tmp/with space.sock", err, sizeof(err)), 0);
    assert_get(c, "server.socket", "/tmp/with space.sock");
    ck_assert_int_eq(config_set(c, "host.prefault", "false", err, sizeof(err)), 0);
    assert_get(c, "host.prefault", "no");
    ck_assert_int_eq(config_set(c, "log.level", "Warning", err, sizeof(err)), 0);
    assert_get(c, "log.level", "warning");
    ck_assert_int_eq(config_set(c, "host.low_watermark", "0.1", err, sizeof(err)), 0);
    assert_get(c, "host.low_watermark", "0.1");

    ck_assert_int_eq(config_set(c, "host.szie", "4g", err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "unknown option 'host.szie' (did you mean 'host.size'?)");
    ck_assert_int_eq(config_set(c, "server.max_client", "4", err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "unknown option 'server.max_client' (did you mean "
                          "'server.max_clients'?)");
    ck_assert_int_eq(config_set(c, "nothing.like.it", "4", err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "unknown option 'nothing.like.it'");
    ck_assert_int_eq(config_set(c, "size", "4g", err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "'size' is not section.name (such as host.size)");

    /* A refused value leaves the old one. */
    ck_assert_int_eq(config_set(c, "host.size", "4x", err, sizeof(err)), -EINVAL);
    assert_err(err, "host.size: '4x' is not a size*");
    ck_assert_int_eq(config_set(c, "host.size", "1k", err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "host.size: 1k is out of bounds (16m .. 4t)");
    assert_get(c, "host.size", "4g");
    /* Strings that an ini file could not hold are refused. */
    ck_assert_int_eq(config_set(c, "server.socket", " lead", err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "server.socket: value has leading or trailing spaces");
    ck_assert_int_eq(config_set(c, "server.socket", "trail ", err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(config_set(c, "server.socket", "a ;b", err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(config_set(c, "server.socket", "a\nb", err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(config_set(c, "server.socket", "a\tb", err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(config_set(c, "server.socket", ";b", err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "server.socket: value has a leading ';'");
    memset(path, 'a', sizeof(path) - 1);
    path[sizeof(path) - 1] = '\0';
    ck_assert_int_eq(config_set(c, "server.socket_group", path, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "server.socket_group: value has more than 128 bytes");
    path[128] = '\0';
    ck_assert_int_eq(config_set(c, "server.socket_group", path, err, sizeof(err)), 0);
    ck_assert_int_eq(config_set(c, "server.socket_group", "", err, sizeof(err)), 0);
    assert_get(c, "server.socket", "/tmp/with space.sock");
    ck_assert_int_eq(config_set(c, "server.socket", "", err, sizeof(err)), 0);
    assert_get(c, "server.socket", "");
    config_free(c);
}
END_TEST

START_TEST(test_get)
{
    struct config *c = config_new();
    char buf[16];

    ck_assert_int_eq(config_get(c, "host.szie", buf, sizeof(buf)), -ENOENT);
    ck_assert_str_eq(buf, "");
    ck_assert_int_eq(config_get(c, "host.high_watermark", buf, 4), -ENOSPC);
    ck_assert_str_eq(buf, "0.9");
    assert_get(c, "host.high_watermark", "0.99");
    assert_get(c, "host.low_watermark", "0.98");
    assert_get(c, "server.socket_mode", "0660");
    assert_get(c, "server.socket", "");
    assert_get(c, "host.prefault", "yes");
    assert_get(c, "host.hugepages", "auto");
    assert_get(c, "cache.policy", "default");
    assert_get(c, "server.max_leases", "4096");
    assert_get(c, "host.page_size", "2m");
    /* Every value's text reads back as itself. */
    for (size_t i = 0; i < config_noptions; i++) {
        char key[128], v[256], v2[256];
        snprintf(key, sizeof(key), "%s.%s", config_options[i].section, config_options[i].name);
        ck_assert_int_eq(config_get(c, key, v, sizeof(v)), 0);
        ck_assert_int_eq(config_set(c, key, v, NULL, 0), 0);
        ck_assert_int_eq(config_get(c, key, v2, sizeof(v2)), 0);
        ck_assert_str_eq(v, v2);
    }
    config_free(c);
}
END_TEST

/* ---- validate and reload ----------------------------------------------------------------- */

START_TEST(test_validate)
{
    struct config *c = config_new();
    char err[256], path[200];

    ck_assert_int_eq(config_set(c, "host.low_watermark", "0.99", NULL, 0), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "host.low_watermark (0.99) must be below host.high_watermark (0.99)");
    ck_assert_int_eq(config_set(c, "host.high_watermark", "1", NULL, 0), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), 0);
    ck_assert_str_eq(err, "");

    ck_assert_int_eq(config_set(c, "host.page_size", "3m", NULL, 0), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "host.page_size (3m) must be a power of two");
    ck_assert_int_eq(config_set(c, "host.page_size", "1g", NULL, 0), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), 0);
    ck_assert_int_eq(config_set(c, "host.size", "512m", NULL, 0), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "host.size (512m) must be at least host.page_size (1g)");
    ck_assert_int_eq(config_set(c, "host.size", "1g", NULL, 0), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), 0);

    /* remote.part_size: 0 (never split) or at least 64k, at most 1g. */
    ck_assert_int_eq(config_set(c, "remote.part_size", "32k", NULL, 0), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "remote.part_size (32k) must be 0 (a block is one value) or at least 64k");
    ck_assert_int_eq(config_set(c, "remote.part_size", "0", NULL, 0), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), 0);
    ck_assert_int_eq(config_set(c, "remote.part_size", "64k", NULL, 0), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), 0);
    ck_assert_int_eq(config_set(c, "remote.part_size", "2g", err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(config_set(c, "remote.part_size", "1m", NULL, 0), 0);

    memset(path, 'a', sizeof(path) - 1);
    path[0] = '/';
    path[108] = '\0';
    ck_assert_int_eq(config_set(c, "server.socket", path, NULL, 0), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "server.socket: path longer than 107 bytes");
    path[107] = '\0';
    ck_assert_int_eq(config_set(c, "server.socket", path, NULL, 0), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), 0);

    /* Values written into the struct directly get their bounds checked too. */
    c->server_max_clients = 0;
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "server.max_clients: 0 is out of bounds (1 .. 65536)");
    c->server_max_clients = 1;
    c->log_level = 4;
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "log.level: enum index 4 is out of range");
    c->log_level = CONFIG_LOG_INFO;
    ck_assert_int_eq(config_validate(c, NULL, 0), 0);
    config_free(c);
}
END_TEST

START_TEST(test_reload)
{
    struct config *cur = config_new(), *next = config_dup(cur);
    char err[256];

    ck_assert_int_eq(config_check_reload(cur, next, err, sizeof(err)), 0);
    ck_assert_str_eq(err, "");
    /* Reloadable ones may change. */
    ck_assert_int_eq(config_set(next, "server.max_clients", "7", NULL, 0), 0);
    ck_assert_int_eq(config_set(next, "log.level", "debug", NULL, 0), 0);
    ck_assert_int_eq(config_set(next, "host.high_watermark", "0.99", NULL, 0), 0);
    ck_assert_int_eq(config_check_reload(cur, next, err, sizeof(err)), 0);
    /* The first non-reloadable one that differs is named. */
    ck_assert_int_eq(config_set(next, "host.size", "2g", NULL, 0), 0);
    ck_assert_int_eq(config_set(next, "host.prefault", "no", NULL, 0), 0);
    ck_assert_int_eq(config_check_reload(cur, next, err, sizeof(err)), -EROFS);
    ck_assert_str_eq(err, "host.size cannot change on reload ('1g' -> '2g'); restart kvcd to "
                          "apply it");
    ck_assert_int_eq(config_set(next, "host.size", "1g", NULL, 0), 0);
    ck_assert_int_eq(config_check_reload(cur, next, err, sizeof(err)), -EROFS);
    assert_err(err, "host.prefault cannot change on reload ('yes' -> 'no')*");
    ck_assert_int_eq(config_set(next, "host.prefault", "yes", NULL, 0), 0);
    ck_assert_int_eq(config_set(next, "server.socket", "/run/x.sock", NULL, 0), 0);
    ck_assert_int_eq(config_check_reload(cur, next, err, sizeof(err)), -EROFS);
    assert_err(err, "server.socket cannot change on reload ('' -> '/run/x.sock')*");
    config_free(cur);
    config_free(next);
}
END_TEST

/* ---- printing ---------------------------------------------------------------------------- */

static char *print_to_string(const struct config *c, size_t *len)
{
    char *text = NULL;
    FILE *f = open_memstream(&text, len);

    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(config_print(c, f), 0);
    ck_assert_int_eq(fclose(f), 0);
    return text;
}

START_TEST(test_print_round_trip)
{
    static const char *const sets[][2] = {
        {"server.socket", "/run/kvcd/other.sock"},
        {"server.socket_mode", "0604"},
        {"server.socket_group", "kvc"},
        {"server.max_clients", "3"},
        {"server.max_leases", "1048576"},
        {"server.max_namespaces", "1"},
        {"server.max_clients_per_uid", "2"},
        {"server.hello_timeout", "1500ms"},
        {"server.idle_timeout", "90s"},
        {"server.reservation_timeout", "100ms"},
        {"server.max_waits", "4096"},
        {"server.max_namespaces_per_uid", "1"},
        {"quota.uid_pins", "1"},
        {"quota.uid_leases", "1073741824"},
        {"quota.uid_reserved_share", "1"},
        {"log.level", "debug"},
        {"log.rate_limit", "100000"},
        {"host.size", "16777217"},
        {"host.page_size", "64k"},
        {"host.hugepages", "off"},
        {"host.prefault", "no"},
        {"host.high_watermark", "0.7000000000000001"},
        {"host.low_watermark", "0.1234567890123"},
        {"cache.policy", "lru"},
    };
    struct config *c = config_new(), *d = config_new();
    char err[256], *text;
    size_t len;
    const char *path;

    for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++)
        ck_assert_msg(config_set(c, sets[i][0], sets[i][1], err, sizeof(err)) == 0, "%s", err);
    text = print_to_string(c, &len);
    path = tmp_write("printed.ini", text, len);
    ck_assert_int_eq(config_load_file(d, path, err, sizeof(err)), 0);
    assert_same(c, d);
    ck_assert_double_eq(d->host_high_watermark, 0.7000000000000001);
    ck_assert_double_eq(d->host_low_watermark, 0.1234567890123);
    ck_assert_uint_eq(d->host_size, 16777217);
    ck_assert_int_eq(config_check_reload(c, d, err, sizeof(err)), 0);
    /* Every option is printed exactly once, as "name = value". */
    for (size_t i = 0; i < config_noptions; i++) {
        char needle[128];
        snprintf(needle, sizeof(needle), "\n%s =", config_options[i].name);
        const char *at = strstr(text, needle);
        ck_assert_msg(at != NULL, "%s missing", config_options[i].name);
        ck_assert_ptr_null(strstr(at + 1, needle));
    }
    /* Help comments are wrapped to 80 columns. */
    for (const char *p = text; *p;) {
        size_t n = strcspn(p, "\n");
        ck_assert_msg(n <= 80, "line of %zu columns: %.*s", n, (int)n, p);
        p += n + (p[n] == '\n');
    }
    free(text);

    /* The defaults' print loads into a config equal to the defaults. */
    text = print_to_string(d, &len);
    config_free(c);
    c = config_new();
    ck_assert_int_eq(config_load_buffer(c, "p.ini", text, len, err, sizeof(err)), 0);
    assert_same(c, d);
    free(text);
    config_free(c);
    config_free(d);
}
END_TEST

/* kvcd.ini(5)'s OPTIONS, between its markers, are config_print_man byte for byte: every
 * section and option of the table, with its help, type, bounds, default and reloadability. */
START_TEST(test_man_ini)
{
    static const char begin[] = ".\\\" BEGIN kvcd --print-man",
                      end[] = ".\\\" END kvcd --print-man";
    char *page = NULL, *want = NULL;
    size_t page_len = 0, want_len = 0;
    FILE *f = fopen(KVC_SRC_DIR "/docs/man/kvcd.ini.5", "re");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_gt(getdelim(&page, &page_len, '\0', f), 0);
    fclose(f);
    f = open_memstream(&want, &want_len);
    ck_assert_int_eq(config_print_man(f), 0);
    ck_assert_int_eq(fclose(f), 0);
    char *b = strstr(page, begin), *e = strstr(page, end);
    ck_assert_msg(b && e && e > b, "docs/man/kvcd.ini.5 has no generated OPTIONS markers");
    b = strchr(b, '\n') + 1;
    ck_assert_msg((size_t)(e - b) == want_len && memcmp(b, want, want_len) == 0,
                  "docs/man/kvcd.ini.5 differs from `kvcd --print-man`: run `make man-ini` and "
                  "commit it");
    for (size_t i = 0; i < config_noptions; i++) { /* every section is there */
        char sec[64];
        snprintf(sec, sizeof(sec), ".SS [%s]\n", config_options[i].section);
        ck_assert_msg(strstr(want, sec), "no %s", sec);
    }
    free(page);
    free(want);
}
END_TEST

/* etc/kvcd.ini is config_print of the defaults, byte for byte. */
START_TEST(test_shipped_ini)
{
    struct config *c = config_new();
    char *want, *got = NULL, err[256];
    size_t want_len, got_len = 0, line = 1, i;
    FILE *f = fopen(KVC_SRC_DIR "/etc/kvcd.ini", "r");

    ck_assert_msg(f != NULL, "cannot open %s", KVC_SRC_DIR "/etc/kvcd.ini");
    ck_assert_int_eq(getdelim(&got, &got_len, '\0', f) > 0, 1);
    got_len = strlen(got);
    fclose(f);
    want = print_to_string(c, &want_len);
    for (i = 0; i < want_len && i < got_len && want[i] == got[i]; i++)
        line += want[i] == '\n';
    ck_assert_msg(i == want_len && i == got_len,
                  "etc/kvcd.ini differs from `kvcd --print-config` at line %zu: run `make "
                  "config-ini` and commit it",
                  line);
    ck_assert_int_eq(config_load_file(c, KVC_SRC_DIR "/etc/kvcd.ini", err, sizeof(err)), 0);
    ck_assert_int_eq(config_validate(c, err, sizeof(err)), 0);
    free(want);
    free(got);
    config_free(c);
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("core");

    tcase_add_unchecked_fixture(tc, tmp_setup, tmp_teardown);
    tcase_add_test(tc, test_policy_choices);
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_limits);
    tcase_add_test(tc, test_table);
    tcase_add_test(tc, test_io_threads_auto);
    tcase_add_test(tc, test_secrets_never_shown);
    tcase_add_test(tc, test_remote_restricted);
    tcase_add_test(tc, test_dup);
    tcase_add_test(tc, test_load_good);
    tcase_add_test(tc, test_load_empty);
    tcase_add_loop_test(tc, test_load_bad, 0, sizeof(bad_cases) / sizeof(bad_cases[0]));
    tcase_add_test(tc, test_load_bad_file);
    tcase_add_test(tc, test_load_missing);
    tcase_add_test(tc, test_load_odd_bytes);
    tcase_add_test(tc, test_load_big_file);
    tcase_add_loop_test(tc, test_parse_size, 0, sizeof(size_cases) / sizeof(size_cases[0]));
    tcase_add_loop_test(tc, test_parse_duration, 0,
                        sizeof(duration_cases) / sizeof(duration_cases[0]));
    tcase_add_test(tc, test_size_format);
    tcase_add_test(tc, test_set);
    tcase_add_test(tc, test_get);
    tcase_add_test(tc, test_validate);
    tcase_add_test(tc, test_reload);
    tcase_add_test(tc, test_print_round_trip);
    tcase_add_test(tc, test_shipped_ini);
    tcase_add_test(tc, test_man_ini);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return daemon_suite_run(config_suite());
}
