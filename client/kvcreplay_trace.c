/*
 * kvcreplay_trace.c — see kvcreplay_trace.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/kvcreplay_trace.h"

#define REPLAY_JSON_DEPTH 32 /* nesting of the fields kvcreplay skips */

/* ---- lines ------------------------------------------------------------------------------ */

int replay_reader_open(struct replay_reader *rd, const char *path)
{
    memset(rd, 0, sizeof(*rd));
    rd->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (rd->fd < 0)
        return -errno;
    rd->buf = malloc(REPLAY_LINE_MAX + 1);
    if (!rd->buf) {
        close(rd->fd);
        rd->fd = -1;
        return -ENOMEM;
    }
    return 0;
}

void replay_reader_close(struct replay_reader *rd)
{
    if (rd->fd >= 0)
        close(rd->fd);
    free(rd->buf);
    rd->fd = -1;
    rd->buf = NULL;
}

/* The next line without its newline, NUL-terminated in the buffer: 1, 0 at the end, -E2BIG
 * for a line too long, -EIO/-errno for a read error. */
int replay_reader_next(struct replay_reader *rd, char **line, size_t *len)
{
    for (;;) {
        char *nl = memchr(rd->buf + rd->start, '\n', rd->end - rd->start);
        if (nl || (rd->eof && rd->start < rd->end)) {
            size_t e = nl ? (size_t)(nl - rd->buf) : rd->end;
            *line = rd->buf + rd->start;
            *len = e - rd->start;
            rd->buf[e] = 0;
            rd->start = nl ? e + 1 : e;
            rd->line++;
            return 1;
        }
        if (rd->eof)
            return 0;
        if (rd->start > 0) {
            memmove(rd->buf, rd->buf + rd->start, rd->end - rd->start);
            rd->end -= rd->start;
            rd->start = 0;
        }
        if (rd->end == REPLAY_LINE_MAX) {
            rd->line++;
            return -E2BIG;
        }
        ssize_t got = read(rd->fd, rd->buf + rd->end, REPLAY_LINE_MAX - rd->end);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (got == 0)
            rd->eof = true;
        rd->end += (size_t)got;
    }
}

/* ---- trace: one JSON object a line ----------------------------------------------------------
 * Strict JSON (RFC 8259) for the object, its keys and the fields kvcreplay reads; any other
 * field is skipped as a well-formed JSON value. */

struct replay_json {
    const char *s, *p, *end;
    char err[160];
};

static int replay_json_fail(struct replay_json *j, const char *what)
{
    if (!j->err[0])
        snprintf(j->err, sizeof(j->err), "%s (column %zu)", what, (size_t)(j->p - j->s) + 1);
    return -EINVAL;
}

static void replay_json_ws(struct replay_json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\r'))
        j->p++;
}

/* A string; its first out_len-1 bytes (escapes decoded, \u kept as '?') go to out. */
static int replay_json_string(struct replay_json *j, char *out, size_t out_len)
{
    size_t n = 0;
    if (j->p >= j->end || *j->p != '"')
        return replay_json_fail(j, "expected a string");
    j->p++;
    for (;;) {
        char c;
        if (j->p >= j->end)
            return replay_json_fail(j, "unterminated string");
        c = *j->p++;
        if (c == '"')
            break;
        if ((unsigned char)c < 0x20)
            return replay_json_fail(j, "control character in a string");
        if (c == '\\') {
            if (j->p >= j->end)
                return replay_json_fail(j, "unterminated string");
            c = *j->p++;
            switch (c) {
            case '"': case '\\': case '/': break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'u':
                for (int i = 0; i < 4; i++, j->p++)
                    if (j->p >= j->end || !*j->p || !strchr("0123456789abcdefABCDEF", *j->p))
                        return replay_json_fail(j, "bad \\u escape");
                c = '?';
                break;
            default:
                return replay_json_fail(j, "bad escape in a string");
            }
        }
        if (out && n + 1 < out_len)
            out[n++] = c;
    }
    if (out && out_len)
        out[n] = 0;
    return 0;
}

/* A JSON number. *is_uint: it is a non-negative integer that fits 64 bits (*u then holds it);
 * *d: its value as a double. */
static int replay_json_number(struct replay_json *j, bool *is_uint, uint64_t *u, double *d)
{
    const char *start = j->p;
    bool integer = true, overflow = false;
    uint64_t v = 0;
    char buf[64];
    if (j->p < j->end && *j->p == '-') {
        integer = false;
        j->p++;
    }
    if (j->p >= j->end || *j->p < '0' || *j->p > '9')
        return replay_json_fail(j, "expected a number");
    if (*j->p == '0') {
        j->p++;
    } else {
        for (; j->p < j->end && *j->p >= '0' && *j->p <= '9'; j->p++) {
            unsigned digit = (unsigned)(*j->p - '0');
            if (v > (UINT64_MAX - digit) / 10)
                overflow = true;
            v = v * 10 + digit;
        }
    }
    if (j->p < j->end && *j->p == '.') {
        integer = false;
        j->p++;
        if (j->p >= j->end || *j->p < '0' || *j->p > '9')
            return replay_json_fail(j, "expected a digit after '.'");
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            j->p++;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        integer = false;
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
            j->p++;
        if (j->p >= j->end || *j->p < '0' || *j->p > '9')
            return replay_json_fail(j, "expected a digit in the exponent");
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            j->p++;
    }
    *is_uint = integer && !overflow;
    *u = v;
    if ((size_t)(j->p - start) >= sizeof(buf)) {
        *d = integer ? (double)v : HUGE_VAL;
    } else {
        memcpy(buf, start, (size_t)(j->p - start));
        buf[j->p - start] = 0;
        *d = strtod(buf, NULL);
    }
    return 0;
}

static int replay_json_skip(struct replay_json *j, int depth);

/* An array or object after its opening bracket, each value skipped. */
static int replay_json_skip_seq(struct replay_json *j, int depth, char close, bool object)
{
    replay_json_ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return 0;
    }
    for (;;) {
        replay_json_ws(j);
        if (object) {
            if (replay_json_string(j, NULL, 0))
                return -EINVAL;
            replay_json_ws(j);
            if (j->p >= j->end || *j->p != ':')
                return replay_json_fail(j, "expected ':'");
            j->p++;
        }
        if (replay_json_skip(j, depth + 1))
            return -EINVAL;
        replay_json_ws(j);
        if (j->p < j->end && *j->p == close) {
            j->p++;
            return 0;
        }
        if (j->p >= j->end || *j->p != ',')
            return replay_json_fail(j, object ? "expected ',' or '}'" : "expected ',' or ']'");
        j->p++;
    }
}

static int replay_json_skip(struct replay_json *j, int depth)
{
    bool is_uint;
    uint64_t u;
    double d;
    if (depth > REPLAY_JSON_DEPTH)
        return replay_json_fail(j, "nested too deeply");
    replay_json_ws(j);
    if (j->p >= j->end)
        return replay_json_fail(j, "expected a value");
    switch (*j->p) {
    case '{':
        j->p++;
        return replay_json_skip_seq(j, depth, '}', true);
    case '[':
        j->p++;
        return replay_json_skip_seq(j, depth, ']', false);
    case '"':
        return replay_json_string(j, NULL, 0);
    case 't':
    case 'f':
    case 'n': {
        static const char *const words[] = {"true", "false", "null"};
        for (int i = 0; i < 3; i++) {
            size_t wl = strlen(words[i]);
            if ((size_t)(j->end - j->p) >= wl && memcmp(j->p, words[i], wl) == 0) {
                j->p += wl;
                return 0;
            }
        }
        return replay_json_fail(j, "expected a value");
    }
    default:
        return replay_json_number(j, &is_uint, &u, &d);
    }
}

/* A field that must hold an unsigned integer of at most `bits` bits. */
static int replay_json_uint(struct replay_json *j, const char *field, int bits, uint64_t *out)
{
    uint64_t max = bits == 64 ? UINT64_MAX : (1ull << bits) - 1;
    bool is_uint = false;
    double d;
    char what[96];
    snprintf(what, sizeof(what), "%s: expected an unsigned %d-bit integer", field, bits);
    if (j->p >= j->end || *j->p < '0' || *j->p > '9')
        return replay_json_fail(j, what);
    if (replay_json_number(j, &is_uint, out, &d))
        return -EINVAL;
    if (!is_uint || *out > max)
        return replay_json_fail(j, what);
    return 0;
}

static int replay_json_ids(struct replay_json *j, struct replay_req *r)
{
    if (j->p >= j->end || *j->p != '[')
        return replay_json_fail(j, "hash_ids: expected an array");
    j->p++;
    r->n = 0;
    replay_json_ws(j);
    if (j->p < j->end && *j->p == ']') {
        j->p++;
        return 0;
    }
    for (;;) {
        uint64_t id;
        replay_json_ws(j);
        if (replay_json_uint(j, "hash_ids", 64, &id))
            return -EINVAL;
        if (r->n == REPLAY_MAX_BLOCKS)
            return replay_json_fail(j, "hash_ids: more than 16384 blocks in one request");
        r->ids[r->n++] = id;
        replay_json_ws(j);
        if (j->p < j->end && *j->p == ']') {
            j->p++;
            return 0;
        }
        if (j->p >= j->end || *j->p != ',')
            return replay_json_fail(j, "hash_ids: expected ',' or ']'");
        j->p++;
    }
}

/* Parses one line into r (r->ids must hold REPLAY_MAX_BLOCKS). 0, or -EINVAL with the reason
 * in err. */
int replay_line_parse(const char *s, size_t len, struct replay_req *r, char *err,
                             size_t errlen)
{
    struct replay_json j = {.s = s, .p = s, .end = s + len};
    bool have_ids = false, have_len = false, have_ts = false, have_out = false;
    int rc = -EINVAL;
    r->ts = 0;
    r->input_len = 0;
    r->n = 0;
    replay_json_ws(&j);
    if (j.p >= j.end || *j.p != '{') {
        replay_json_fail(&j, "expected a JSON object");
        goto out;
    }
    j.p++;
    replay_json_ws(&j);
    if (j.p < j.end && *j.p == '}') {
        j.p++;
    } else {
        for (;;) {
            char key[32];
            bool *seen = NULL;
            uint64_t u;
            replay_json_ws(&j);
            if (replay_json_string(&j, key, sizeof(key)))
                goto out;
            replay_json_ws(&j);
            if (j.p >= j.end || *j.p != ':') {
                replay_json_fail(&j, "expected ':'");
                goto out;
            }
            j.p++;
            replay_json_ws(&j);
            if (strcmp(key, "hash_ids") == 0)
                seen = &have_ids;
            else if (strcmp(key, "input_length") == 0)
                seen = &have_len;
            else if (strcmp(key, "timestamp") == 0)
                seen = &have_ts;
            else if (strcmp(key, "output_length") == 0)
                seen = &have_out;
            if (seen && *seen) {
                char what[64];
                snprintf(what, sizeof(what), "duplicate field \"%s\"", key);
                replay_json_fail(&j, what);
                goto out;
            }
            if (seen == &have_ids) {
                if (replay_json_ids(&j, r))
                    goto out;
            } else if (seen == &have_len) {
                if (replay_json_uint(&j, "input_length", 32, &r->input_len))
                    goto out;
            } else if (seen == &have_out) {
                if (replay_json_uint(&j, "output_length", 32, &u))
                    goto out;
            } else if (seen == &have_ts) {
                bool is_uint;
                if (replay_json_number(&j, &is_uint, &u, &r->ts))
                    goto out;
                if (!(r->ts >= 0) || !isfinite(r->ts)) {
                    replay_json_fail(&j, "timestamp: expected a finite number >= 0");
                    goto out;
                }
            } else if (replay_json_skip(&j, 1)) {
                goto out;
            }
            if (seen)
                *seen = true;
            replay_json_ws(&j);
            if (j.p < j.end && *j.p == '}') {
                j.p++;
                break;
            }
            if (j.p >= j.end || *j.p != ',') {
                replay_json_fail(&j, "expected ',' or '}'");
                goto out;
            }
            j.p++;
        }
    }
    replay_json_ws(&j);
    if (j.p != j.end) {
        replay_json_fail(&j, "text after the object");
        goto out;
    }
    if (!have_ids) {
        replay_json_fail(&j, "no \"hash_ids\" field");
        goto out;
    }
    if (!have_len)
        r->input_len = (uint64_t)r->n * REPLAY_BLOCK_TOKENS;
    rc = 0;
out:
    if (rc)
        snprintf(err, errlen, "%s", j.err[0] ? j.err : "malformed line");
    return rc;
}

/* Whether a line holds nothing but white space (skipped, not a request). */
bool replay_line_blank(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

/* Tokens of block j of r, as kvcsim counts them: 512, the remainder for the last block, and a
 * whole block where input_length says fewer tokens than the ids cover. */
uint64_t replay_block_tokens(const struct replay_req *r, uint32_t j)
{
    uint64_t start = (uint64_t)j * REPLAY_BLOCK_TOKENS;
    if (r->input_len <= start)
        return REPLAY_BLOCK_TOKENS;
    return r->input_len - start < REPLAY_BLOCK_TOKENS ? r->input_len - start
                                                      : REPLAY_BLOCK_TOKENS;
}
