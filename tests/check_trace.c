/*
 * check_trace.c — the trace format's one reader (client/kvcreplay_trace.c), which kvcreplay,
 * kvcsim and the tests share: a well-formed line and its defaults; timestamps as numbers or
 * strings holding one (published traces write both); every way a line can be wrong refused
 * with its reason (not JSON, not an object, text after it, duplicate keys, wrong types,
 * negative or too large numbers, too many ids, nesting past the parser's bound); and kvcsim's
 * parse of a trace (tests/lib/sim.c) agreeing with kvcreplay's, line by line.
 */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvcreplay_trace.h"
#include "tests/lib/sim.h"
#include "tests/lib/daemon.h"

static uint64_t ids[REPLAY_MAX_BLOCKS];

static int parse(const char *s, struct replay_req *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof(*r));
    r->ids = ids;
    err[0] = '\0';
    return replay_line_parse(s, strlen(s), r, err, errlen);
}

START_TEST(test_well_formed)
{
    struct replay_req r;
    char err[160];
    ck_assert_int_eq(parse("{\"timestamp\": 27, \"input_length\": 1100, \"output_length\": 5, "
                           "\"hash_ids\": [7, 8, 9], \"extra\": {\"a\": [1, {\"b\": null}]}}",
                           &r, err, sizeof(err)),
                     0);
    ck_assert_double_eq(r.ts, 27);
    ck_assert_uint_eq(r.input_len, 1100);
    ck_assert_uint_eq(r.n, 3);
    ck_assert_uint_eq(ids[0], 7);
    ck_assert_uint_eq(ids[2], 9);
    ck_assert_uint_eq(replay_block_tokens(&r, 0), 512);
    ck_assert_uint_eq(replay_block_tokens(&r, 2), 1100 - 1024);
    /* Defaults: input_length 512 a block, timestamp 0; an empty request. */
    ck_assert_int_eq(parse("{\"hash_ids\": [1, 2]}", &r, err, sizeof(err)), 0);
    ck_assert_uint_eq(r.input_len, 1024);
    ck_assert_double_eq(r.ts, 0);
    ck_assert_int_eq(parse("  {\"hash_ids\": []}  ", &r, err, sizeof(err)), 0);
    ck_assert_uint_eq(r.n, 0);
    /* The largest id. */
    ck_assert_int_eq(parse("{\"hash_ids\": [9223372036854775807]}", &r, err, sizeof(err)), 0);
    ck_assert_uint_eq(ids[0], 9223372036854775807ull);
}
END_TEST

START_TEST(test_timestamps)
{
    struct replay_req r;
    char err[160];
    ck_assert_int_eq(parse("{\"timestamp\": \"1712.5\", \"hash_ids\": [1]}", &r, err, sizeof(err)),
                     0);
    ck_assert_double_eq(r.ts, 1712.5);
    ck_assert_int_eq(parse("{\"timestamp\": 3.25e2, \"hash_ids\": [1]}", &r, err, sizeof(err)), 0);
    ck_assert_double_eq(r.ts, 325);
    static const char *const bad[] = {
        "{\"timestamp\": \"soon\", \"hash_ids\": [1]}",
        "{\"timestamp\": \"\", \"hash_ids\": [1]}",
        "{\"timestamp\": \"12 \", \"hash_ids\": [1]}",
        "{\"timestamp\": -1, \"hash_ids\": [1]}",
        "{\"timestamp\": \"-1\", \"hash_ids\": [1]}",
        "{\"timestamp\": \"1e999\", \"hash_ids\": [1]}",
        "{\"timestamp\": null, \"hash_ids\": [1]}",
        "{\"timestamp\": [1], \"hash_ids\": [1]}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(parse(bad[i], &r, err, sizeof(err)) == -EINVAL, "%s", bad[i]);
        ck_assert_msg(strstr(err, "timestamp"), "%s: %s", bad[i], err);
    }
}
END_TEST

START_TEST(test_refused)
{
    static const struct {
        const char *line, *why;
    } bad[] = {
        {"", "column"},
        {"not json", "column"},
        {"[1, 2]", "expected a JSON object"},
        {"{\"hash_ids\": [1]} x", "column"},
        {"{\"hash_ids\": [1], \"hash_ids\": [2]}", "duplicate"},
        {"{\"timestamp\": 0}", "no \"hash_ids\""},
        {"{\"hash_ids\": 5}", "hash_ids: expected an array"},
        {"{\"hash_ids\": [1, \"2\"]}", "hash_ids: expected an unsigned"},
        {"{\"hash_ids\": [1, -2]}", "hash_ids: expected an unsigned"},
        {"{\"hash_ids\": [1.5]}", "hash_ids: expected an unsigned"},
        {"{\"hash_ids\": [18446744073709551615]}", "column"},
        {"{\"hash_ids\": [1], \"input_length\": 4294967296}", "input_length"},
        {"{\"hash_ids\": [1], \"input_length\": -1}", "input_length"},
        {"{\"hash_ids\": [1], \"output_length\": \"5\"}", "output_length"},
        {"{\"hash_ids\": [1], \"x\": \"\\ud800\"}", "column"},
        {"{\"hash_ids\": [1], \"x\": \"a\tb\"}", "column"},
    };
    struct replay_req r;
    char err[160];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(parse(bad[i].line, &r, err, sizeof(err)) == -EINVAL, "accepted: %s",
                      bad[i].line);
        ck_assert_msg(strstr(err, bad[i].why), "%s: \"%s\" lacks \"%s\"", bad[i].line, err,
                      bad[i].why);
    }
    /* Too many ids for one request. */
    size_t cap = 32 + (REPLAY_MAX_BLOCKS + 1) * 3;
    char *many = malloc(cap);
    size_t n = (size_t)snprintf(many, cap, "{\"hash_ids\": [");
    for (uint32_t i = 0; i <= REPLAY_MAX_BLOCKS; i++)
        n += (size_t)snprintf(many + n, cap - n, "%s1", i ? "," : "");
    snprintf(many + n, cap - n, "]}");
    ck_assert_int_eq(parse(many, &r, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "more than 16384"));
    /* Nesting past the parser's bound in a field nobody reads: refused, not a crash. */
    size_t deep = 100000;
    char *d = malloc(deep * 2 + 64);
    n = (size_t)snprintf(d, 64, "{\"hash_ids\": [1], \"x\": ");
    memset(d + n, '[', deep);
    memset(d + n + deep, ']', deep);
    snprintf(d + n + 2 * deep, 8, "}");
    ck_assert_int_eq(parse(d, &r, err, sizeof(err)), -EINVAL);
    free(d);
    free(many);
}
END_TEST

/* kvcsim reads what kvcreplay reads: the same requests, ids and times (kvcsim keeps whole
 * milliseconds), string timestamps included; a line kvcreplay refuses, kvcsim refuses. */
START_TEST(test_kvcsim_agrees)
{
    static const char text[] =
        "{\"timestamp\": \"0\", \"input_length\": 1536, \"hash_ids\": [1, 2, 3]}\n"
        "\n"
        "{\"timestamp\": 5.75, \"hash_ids\": [1, 2, 4], \"output_length\": 3}\n"
        "   \n"
        "{\"timestamp\": \"9.5\", \"input_length\": 700, \"hash_ids\": [1, 5]}\n";
    struct sim_trace t;
    struct replay_req r;
    char err[160];
    ck_assert_int_eq(sim_trace_parse(&t, text, strlen(text)), 0);
    ck_assert_uint_eq(t.nreq, 3);
    const char *p = text;
    size_t k = 0;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t len = (size_t)(eol - p);
        if (!replay_line_blank(p, len)) {
            memset(&r, 0, sizeof(r));
            r.ids = ids;
            ck_assert_int_eq(replay_line_parse(p, len, &r, err, sizeof(err)), 0);
            ck_assert_uint_eq(t.req[k].ts, (uint64_t)r.ts);
            ck_assert_uint_eq(t.req[k].input_len, r.input_len);
            ck_assert_uint_eq(t.req[k].len, r.n);
            k++;
        }
        p = eol + 1;
    }
    ck_assert_uint_eq(k, 3);
    ck_assert_uint_eq(t.nblocks, 5);
    sim_trace_free(&t);
    static const char bad[] = "{\"hash_ids\": [1]}\n{\"timestamp\": \"x\", \"hash_ids\": [2]}\n";
    ck_assert_int_eq(sim_trace_parse(&t, bad, strlen(bad)), -EINVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("trace");
    tcase_add_test(tc, test_well_formed);
    tcase_add_test(tc, test_timestamps);
    tcase_add_test(tc, test_refused);
    tcase_add_test(tc, test_kvcsim_agrees);
    suite_add_tcase(s, tc);
    return daemon_suite_run(s);
}
