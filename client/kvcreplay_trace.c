/*
 * kvcreplay_trace.c — see kvcreplay_trace.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "client/kvcreplay_trace.h"

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
 * Parsed by jansson (strict RFC 8259: duplicate keys refused, nesting bounded), then the fields
 * kvcreplay and kvcsim use are checked for their types and bounds; other fields are ignored.
 * The one reader of the format: kvcreplay, kvcsim and the tests all come here. */

__attribute__((format(printf, 3, 4))) static int replay_fail(char *err, size_t errlen,
                                                             const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

/* An unsigned integer field of at most `bits` bits. */
static int replay_uint(const json_t *v, const char *field, int bits, uint64_t *out, char *err,
                       size_t errlen)
{
    uint64_t max = bits == 64 ? UINT64_MAX : (1ull << bits) - 1;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max)
        return replay_fail(err, errlen, "%s: expected an unsigned %d-bit integer", field, bits);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* The timestamp: a number, or a string holding one (published traces write them both ways),
 * finite and >= 0. */
static int replay_ts(const json_t *v, double *ts, char *err, size_t errlen)
{
    if (json_is_number(v)) {
        *ts = json_number_value(v);
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        if (!*s || strspn(s, "0123456789.eE+-") != strlen(s))
            return replay_fail(err, errlen, "timestamp: \"%.40s\" is not a number", s);
        errno = 0;
        *ts = strtod(s, &end);
        if (*end || errno)
            return replay_fail(err, errlen, "timestamp: \"%.40s\" is not a number", s);
    } else {
        return replay_fail(err, errlen, "timestamp: expected a number");
    }
    if (!(*ts >= 0) || !isfinite(*ts))
        return replay_fail(err, errlen, "timestamp: expected a finite number >= 0");
    return 0;
}

int replay_line_parse(const char *s, size_t len, struct replay_req *r, char *err, size_t errlen)
{
    json_error_t je;
    json_t *o, *v;
    uint64_t u;
    int rc = -EINVAL;
    r->ts = 0;
    r->input_len = 0;
    r->n = 0;
    o = json_loadb(s, len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return replay_fail(err, errlen, "%s (column %d)", je.text, je.column);
    if (!json_is_object(o)) {
        replay_fail(err, errlen, "expected a JSON object");
        goto out;
    }
    v = json_object_get(o, "hash_ids");
    if (!v) {
        replay_fail(err, errlen, "no \"hash_ids\" field");
        goto out;
    }
    if (!json_is_array(v)) {
        replay_fail(err, errlen, "hash_ids: expected an array");
        goto out;
    }
    if (json_array_size(v) > REPLAY_MAX_BLOCKS) {
        replay_fail(err, errlen, "hash_ids: more than %u blocks in one request", REPLAY_MAX_BLOCKS);
        goto out;
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        if (replay_uint(json_array_get(v, i), "hash_ids", 63, &u, err, errlen))
            goto out;
        r->ids[r->n++] = u;
    }
    if ((v = json_object_get(o, "input_length")) &&
        replay_uint(v, "input_length", 32, &r->input_len, err, errlen))
        goto out;
    if (!v)
        r->input_len = (uint64_t)r->n * REPLAY_BLOCK_TOKENS;
    if ((v = json_object_get(o, "output_length")) &&
        replay_uint(v, "output_length", 32, &u, err, errlen))
        goto out;
    if ((v = json_object_get(o, "timestamp")) && replay_ts(v, &r->ts, err, errlen))
        goto out;
    rc = 0;
out:
    json_decref(o);
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
