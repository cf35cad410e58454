/*
 * kvcctl_blocks.c — kvcctl's commands over what is cached: ns (and ns drop), ls, show.
 *
 * DESIGN
 * Each lists through the daemon's listing requests (NS_LIST, BLOCK_LIST page by page with a
 * cursor) and filters on the client side; show stops at the second match, so an ambiguous
 * prefix costs one page, not the whole cache.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "client/kvc.h"
#include "client/kvcctl.h"

/* Whether s is 1 to 32 hex digits (a key or a prefix of one). */
static bool ctl_hex(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 32)
        return false;
    for (; *s; s++)
        if (!isxdigit((unsigned char)*s))
            return false;
    return true;
}

/* Width of a MODEL column: the longest id of the table (at least `min`). */
static int ctl_model_width(const struct kvc_ns_info *ns, size_t n, int min)
{
    size_t w = (size_t)min;
    for (size_t i = 0; i < n; i++)
        w = strlen(ns[i].model_id) > w ? strlen(ns[i].model_id) : w;
    return (int)w;
}

static const char *ctl_dtype_name(enum kvc_dtype d)
{
    switch (d) {
    case KVC_DTYPE_FP16:
        return "fp16";
    case KVC_DTYPE_BF16:
        return "bf16";
    case KVC_DTYPE_FP32:
        return "fp32";
    case KVC_DTYPE_FP8_E4M3:
        return "fp8_e4m3";
    case KVC_DTYPE_INT8:
        return "int8";
    default:
        return "?";
    }
}

/* Names of the wire tier and format numbers (kvc_proto.h KVC_WIRE_TIER_*, *_FORMAT_*). */
static const char *ctl_tier_name(uint8_t t)
{
    return t == 1 ? "host" : t == 2 ? "disk" : t == 3 ? "gpu" : "?";
}

static const char *ctl_codec_name(uint8_t f)
{
    static const char *const names[] = {"raw", "q8_0", "q4_1", "q5_1", "kivi2", "kivi4", "fp8"};
    return f < sizeof(names) / sizeof(names[0]) ? names[f] : "?";
}

static void ctl_key(const struct kvc_key *k, char out[33])
{
    snprintf(out, 33, "%016" PRIx64 "%016" PRIx64, k->hi, k->lo);
}

/* ns drop ID (admin). */
static int ctl_ns_drop(struct ctl *x, int argc, char **argv)
{
    uint32_t id = argc == 3 ? ctl_parse_ns(argv[2]) : 0;
    uint64_t n = 0;
    int rc;
    if (!id)
        return ctl_bad("ns", "drop takes one namespace id (a number from kvcctl ns)");
    if (ctl_connect(x))
        return 1;
    rc = kvc_ns_drop(x->c, id, &n);
    if (rc)
        return ctl_fail("ns drop", rc,
                        rc == -ENOENT  ? "no such namespace"
                        : rc == -EBUSY ? "in use: a client holds a lease or reservation on it, "
                                         "or a block of it is moving (try again)"
                                       : NULL);
    if (x->json)
        return ctl_json_print(
            json_pack("{s:I, s:o}", "dropped", (json_int_t)id, "blocks", ctl_json_u64(n)));
    printf("namespace %u dropped with its %" PRIu64 " blocks\n", id, n);
    return 0;
}

/* A namespace's kind as ns, ls and show print it. */
static const char *ctl_kind_name(enum kvc_kv_kind k)
{
    return k == KVC_KV_KIND_KV          ? "kv"
           : k == KVC_KV_KIND_K_ONLY    ? "k"
           : k == KVC_KV_KIND_KV_WINDOW ? "kv_window"
           : k == KVC_KV_KIND_STATE     ? "state"
                                        : "?";
}

int ctl_ns(struct ctl *x, int argc, char **argv)
{
    struct kvc_ns_info *ns;
    size_t n;
    int rc;
    if (argc >= 2 && strcmp(argv[1], "drop") == 0)
        return ctl_ns_drop(x, argc, argv);
    if (argc != 1)
        return ctl_bad("ns", "takes no arguments, or drop ID ('%s')", argv[1]);
    if (ctl_connect(x))
        return 1;
    rc = kvc_ns_list(x->c, &ns, &n);
    if (rc) {
        fprintf(stderr, "kvcctl: ns: %s\n", kvc_strerror(rc));
        return 1;
    }
    int mw = ctl_model_width(ns, n, 32);
    json_t *list = x->json ? json_array() : NULL;
    bool ok = true;
    if (!x->json)
        printf("%-4s %-*s %6s %5s %5s %6s %-8s %-4s %12s %8s %12s\n", "ID", mw, "MODEL", "LAYERS",
               "HEADS", "DIM", "TOKENS", "DTYPE", "KIND", "BLOCK_BYTES", "BLOCKS", "BYTES");
    for (size_t i = 0; i < n; i++) {
        const struct kvc_ns_info *o = &ns[i];
        const char *kind = ctl_kind_name(o->kv_kind);
        uint32_t window = 0;
        char kbuf[24];
        if (o->kv_kind == KVC_KV_KIND_KV_WINDOW && kvc_ns_window(x->c, o->ns_id, &window) == 0) {
            snprintf(kbuf, sizeof(kbuf), "kv_window:%u", window);
            kind = x->json ? kind : kbuf;
        }
        if (x->json) {
            ok &=
                json_array_append_new(
                    list, json_pack("{s:I, s:o, s:I, s:I, s:I, s:I, s:s, s:s, s:I, s:o, s:o, "
                                    "s:o, s:I}",
                                    "id", (json_int_t)o->ns_id, "model", ctl_json_text(o->model_id),
                                    "layers", (json_int_t)o->layers, "kv_heads",
                                    (json_int_t)o->kv_heads, "head_dim", (json_int_t)o->head_dim,
                                    "block_tokens", (json_int_t)o->block_tokens, "dtype",
                                    ctl_dtype_name(o->dtype), "kv_kind", kind, "window_tokens",
                                    (json_int_t)window, "block_bytes", ctl_json_u64(o->block_bytes),
                                    "blocks", ctl_json_u64(o->blocks), "bytes",
                                    ctl_json_u64(o->bytes), "arena", (json_int_t)o->arena_id)) == 0;
        } else {
            printf("%-4u %-*s %6u %5u %5u %6u %-8s %-4s %12" PRIu64 " %8" PRIu64 " %12" PRIu64 "\n",
                   o->ns_id, mw, o->model_id, o->layers, o->kv_heads, o->head_dim, o->block_tokens,
                   ctl_dtype_name(o->dtype), kind, o->block_bytes, o->blocks, o->bytes);
        }
    }
    free(ns);
    if (x->json) {
        if (!ok) {
            json_decref(list);
            list = NULL;
        }
        return ctl_json_print(list);
    }
    return 0;
}

int ctl_ls(struct ctl *x, int argc, char **argv)
{
    static const struct option opts[] = {
        {"ns", required_argument, NULL, 'n'},     {"limit", required_argument, NULL, 'l'},
        {"tier", required_argument, NULL, 't'},   {"codec", required_argument, NULL, 'c'},
        {"prefix", required_argument, NULL, 'p'}, {NULL, 0, NULL, 0}};
    struct kvc_ns_info *ns = NULL;
    size_t nns = 0, shown = 0;
    long want_ns = 0, limit = 1000;
    const char *want_tier = NULL, *want_codec = NULL, *want_prefix = NULL;
    int opt, rc;
    optind = 1;
    while ((opt = getopt_long(argc, argv, ":n:l:t:c:p:", opts, NULL)) != -1) {
        char *end;
        switch (opt) {
        case 't':
            want_tier = optarg;
            if (strcmp(optarg, "gpu") && strcmp(optarg, "host") && strcmp(optarg, "disk"))
                return ctl_bad("ls", "--tier takes gpu, host or disk, not '%s'", optarg);
            break;
        case 'c': {
            bool known = false;
            want_codec = optarg;
            for (uint8_t f = 0; strcmp(ctl_codec_name(f), "?") != 0; f++)
                known |= strcmp(optarg, ctl_codec_name(f)) == 0;
            if (!known)
                return ctl_bad("ls",
                               "--codec takes raw, q8_0, q4_1, q5_1, kivi2, kivi4 or fp8, not "
                               "'%s'",
                               optarg);
            break;
        }
        case 'p':
            want_prefix = optarg;
            if (!ctl_hex(optarg))
                return ctl_bad("ls", "--prefix takes 1 to 32 hex digits of a key, not '%s'",
                               optarg);
            break;
        case 'n':
            want_ns = strtol(optarg, &end, 10);
            if (*end || want_ns <= 0 || want_ns > 65535)
                return ctl_bad("ls",
                               "--ns takes a namespace id (a number from kvcctl ns), not "
                               "'%s'",
                               optarg);
            break;
        case 'l':
            limit = strtol(optarg, &end, 10);
            if (*end || limit <= 0)
                return ctl_bad("ls", "--limit takes a number above 0, not '%s'", optarg);
            break;
        default:
            return ctl_bad_option("ls", argv, opt);
        }
    }
    if (optind != argc)
        return ctl_bad("ls", "takes options only ('%s')", argv[optind]);
    if (ctl_connect(x))
        return 1;
    rc = kvc_ns_list(x->c, &ns, &nns);
    if (rc) {
        fprintf(stderr, "kvcctl: ls: %s\n", kvc_strerror(rc));
        return 1;
    }
    json_t *list = x->json ? json_array() : NULL;
    bool ok = true;
    if (!x->json)
        printf("%-4s %-32s %-32s %5s %10s %6s %5s %5s %10s\n", "NS", "KEY", "PARENT", "DEPTH",
               "BYTES", "HITS", "PINS", "CHILD", "LAST_MS");
    for (size_t k = 0; k < nns && shown < (size_t)limit; k++) {
        uint64_t cursor = 0;
        if (want_ns && ns[k].ns_id != (uint32_t)want_ns)
            continue;
        do {
            struct kvc_block_info *b;
            size_t n;
            rc = kvc_block_list(x->c, ns[k].ns_id, &cursor, 512, &b, &n);
            if (rc) {
                fprintf(stderr, "kvcctl: ls: %s\n", kvc_strerror(rc));
                json_decref(list);
                free(ns);
                return 1;
            }
            for (size_t i = 0; i < n && shown < (size_t)limit; i++) {
                char key[33], parent[33];
                ctl_key(&b[i].key, key);
                ctl_key(&b[i].parent, parent);
                if ((want_tier && strcmp(want_tier, ctl_tier_name(b[i].tier)) != 0) ||
                    (want_codec && strcmp(want_codec, ctl_codec_name(b[i].format)) != 0) ||
                    (want_prefix && strncasecmp(key, want_prefix, strlen(want_prefix)) != 0))
                    continue;
                shown++;
                if (x->json)
                    ok &= json_array_append_new(
                              list,
                              json_pack("{s:I, s:s, s:s, s:s, s:I, s:o, s:I, s:I, s:I, s:o, s:s, "
                                        "s:s}",
                                        "ns", (json_int_t)ns[k].ns_id, "kind",
                                        ctl_kind_name(ns[k].kv_kind), "key", key, "parent", parent,
                                        "depth", (json_int_t)b[i].depth, "bytes",
                                        ctl_json_u64(b[i].bytes), "hits", (json_int_t)b[i].hits,
                                        "pins", (json_int_t)b[i].pins, "children",
                                        (json_int_t)b[i].children, "last_access_ms",
                                        ctl_json_u64(b[i].last_access_ms), "tier",
                                        ctl_tier_name(b[i].tier), "codec",
                                        ctl_codec_name(b[i].format))) == 0;
                else
                    printf("%-4u %-32s %-32s %5u %10" PRIu64 " %6u %5u %5u %10" PRIu64 "\n",
                           ns[k].ns_id, key, parent, b[i].depth, b[i].bytes, b[i].hits, b[i].pins,
                           b[i].children, b[i].last_access_ms);
            }
            free(b);
        } while (cursor && shown < (size_t)limit);
    }
    free(ns);
    if (x->json) {
        if (!ok) {
            json_decref(list);
            list = NULL;
        }
        return ctl_json_print(list);
    }
    return 0;
}

/* show KEY: the block whose key is KEY, or the one key that starts with KEY. A prefix that
 * more keys start with is refused (exit 1) once a second is seen, not listed. */
int ctl_show(struct ctl *x, int argc, char **argv)
{
    struct kvc_ns_info *ns = NULL;
    struct kvc_block_info one = {0};
    size_t nns = 0, one_ns = 0, klen;
    char first[33] = "", second[33] = "";
    int rc, found = 0;
    if (argc != 2)
        return ctl_bad("show", "takes one KEY (32 hex digits, or a prefix of them)");
    if (!ctl_hex(argv[1]))
        return ctl_bad("show", "KEY is 1 to 32 hex digits, not '%s'", argv[1]);
    klen = strlen(argv[1]);
    if (ctl_connect(x))
        return 1;
    rc = kvc_ns_list(x->c, &ns, &nns);
    if (rc)
        return ctl_fail("show", rc, NULL);
    for (size_t k = 0; k < nns && found < 2; k++) {
        uint64_t cursor = 0;
        do {
            struct kvc_block_info *b;
            size_t n;
            rc = kvc_block_list(x->c, ns[k].ns_id, &cursor, 512, &b, &n);
            if (rc) {
                free(ns);
                return ctl_fail("show", rc, NULL);
            }
            for (size_t i = 0; i < n && found < 2; i++) {
                char key[33];
                ctl_key(&b[i].key, key);
                if (strncasecmp(key, argv[1], klen) != 0)
                    continue;
                if (found++ == 0) {
                    one = b[i];
                    one_ns = k;
                    memcpy(first, key, sizeof(first));
                } else {
                    memcpy(second, key, sizeof(second));
                }
            }
            free(b);
        } while (cursor && found < 2 && !(found && klen == 32));
    }
    if (found != 1) {
        if (found)
            fprintf(stderr,
                    "kvcctl show: %s is ambiguous: keys %s and %s (at least) start "
                    "with it; give more digits\n",
                    argv[1], first, second);
        else
            fprintf(stderr, "kvcctl show: no cached block has a key %s %s\n",
                    klen == 32 ? "equal to" : "starting with", argv[1]);
        free(ns);
        return 1;
    }
    const struct kvc_ns_info *o = &ns[one_ns];
    char parent[33];
    ctl_key(&one.parent, parent);
    if (x->json) {
        json_t *doc = json_pack(
            "[{s:I, s:o, s:s, s:s, s:s, s:I, s:o, s:I, s:I, s:I, s:I, s:o, s:s, s:I, s:s}]", "ns",
            (json_int_t)o->ns_id, "model", ctl_json_text(o->model_id), "kind",
            ctl_kind_name(o->kv_kind), "key", first, "parent", parent, "depth",
            (json_int_t)one.depth, "bytes", ctl_json_u64(one.bytes), "tokens",
            (json_int_t)o->block_tokens, "hits", (json_int_t)one.hits, "pins", (json_int_t)one.pins,
            "children", (json_int_t)one.children, "last_access_ms",
            ctl_json_u64(one.last_access_ms), "tier", ctl_tier_name(one.tier), "arena",
            (json_int_t)o->arena_id, "codec", ctl_codec_name(one.format));
        free(ns);
        return ctl_json_print(doc);
    } else {
        printf("key          %s\nparent       %s\nnamespace    %u (%s, %s)\n"
               "depth        %u (tokens %u..%u of its prefix)\nbytes        %" PRIu64
               "\nhits         %u\npins         %u\nchildren     %u\n"
               "last access  %" PRIu64 " ms after start\nlives in     %s tier, "
               "arena %u, codec %s\n",
               first, parent, o->ns_id, o->model_id, ctl_kind_name(o->kv_kind), one.depth,
               one.depth * o->block_tokens, (one.depth + 1) * o->block_tokens - 1, one.bytes,
               one.hits, one.pins, one.children, one.last_access_ms, ctl_tier_name(one.tier),
               o->arena_id, ctl_codec_name(one.format));
    }
    free(ns);
    return 0;
}
