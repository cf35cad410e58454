/*
 * kvcctl.h — what kvcctl's files share: the invocation, the command table's entry, the
 * helpers every command uses (kvcctl.c) and the commands, one family per file. Not
 * installed; kvcctl is a client of libkvc like any other.
 */
#ifndef KVC_KVCCTL_H
#define KVC_KVCCTL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "client/kvc.h"

struct ctl {
    const char *socket;
    bool json;
    kvc_client *c;
};

struct ctl_cmd {
    const char *name;
    const char *args;
    const char *help;
    int (*run)(struct ctl *x, int argc, char **argv);
    const char *detail; /* options and output forms, for `kvcctl CMD --help`; may be NULL */
};

/* Connects x to the daemon (x->socket, else the default); 0, or 1 with one line on stderr
 * saying why not. */
int ctl_connect(struct ctl *x);
/* A usage error of command cmd: one line on stderr, exit status 2. */
__attribute__((format(printf, 2, 3))) int ctl_bad(const char *cmd, const char *fmt, ...);
/* After getopt_long (opterr 0, optstring starting with ':') returned '?' or ':'. */
int ctl_bad_option(const char *cmd, char **argv, int opt);
/* Prints a refusal on one line and returns the exit status (1): msg, the cause (the
 * daemon's reason, or what kvcctl knows the errno means here), else kvc_strerror. */
int ctl_fail(const char *what, int rc, const char *msg);
/* A namespace id (1 to 65535), or 0 when s is not one. */
uint32_t ctl_parse_ns(const char *s);

/* --json output is built with jansson and written by ctl_json_print: one document on one
 * line, members separated by ", " and ": " (jansson's layout, which kvcctl's output has
 * always had). ctl_json_print takes the reference to doc (NULL: a failed build) and
 * returns 0, or 1 with a line on stderr. */
int ctl_json_print(json_t *doc);
/* A string of s's bytes as they are (a model id or a label is not checked for UTF-8 here:
 * the daemon validates what it accepts). */
json_t *ctl_json_text(const char *s);
/* A counter: an integer (a real past INT64_MAX, where jansson's integers end). */
json_t *ctl_json_u64(uint64_t v);
/* v rounded to `decimals` digits after the point: an integer for 0 (bytes per second),
 * else a real; null when v is not finite. */
json_t *ctl_json_fixed(double v, int decimals);
/* Sets obj[key] = v, taking v's reference; -1 when either is NULL (out of memory). */
int ctl_json_add(json_t *obj, const char *key, json_t *v);

/* The commands (argv[0] is the command's name). kvcctl_watch.c: */
int ctl_status(struct ctl *x, int argc, char **argv);
int ctl_stats(struct ctl *x, int argc, char **argv);
int ctl_clients(struct ctl *x, int argc, char **argv);
int ctl_metrics(struct ctl *x, int argc, char **argv);
int ctl_top(struct ctl *x, int argc, char **argv);
int ctl_tiers(struct ctl *x, int argc, char **argv);
/* kvcctl_blocks.c: */
int ctl_ns(struct ctl *x, int argc, char **argv);
int ctl_ls(struct ctl *x, int argc, char **argv);
int ctl_show(struct ctl *x, int argc, char **argv);
/* kvcctl_admin.c: */
int ctl_policy(struct ctl *x, int argc, char **argv);
int ctl_config(struct ctl *x, int argc, char **argv);
int ctl_reload(struct ctl *x, int argc, char **argv);
int ctl_evict(struct ctl *x, int argc, char **argv);
int ctl_flush(struct ctl *x, int argc, char **argv);
int ctl_shutdown(struct ctl *x, int argc, char **argv);

#endif
