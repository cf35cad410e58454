/*
 * kvcreplay_trace.h — the trace format: Mooncake-format JSONL, one request a line
 * ({"timestamp", "input_length", "output_length", "hash_ids"}), read a line at a time through
 * a fixed buffer and validated strictly (RFC 8259 JSON by jansson, duplicate keys refused;
 * the fields used typed and bounded: hash_ids unsigned integers below 2^63, input_length and
 * output_length unsigned 32-bit, timestamp a finite number >= 0 or a string holding one;
 * other fields ignored). The one reader of the format: kvcreplay, kvcsim (tests/lib/sim.c)
 * and the tests parse every line with replay_line_parse, so they read a trace the same way.
 */
#ifndef KVC_CLIENT_KVCREPLAY_TRACE_H
#define KVC_CLIENT_KVCREPLAY_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REPLAY_BLOCK_TOKENS 512u      /* tokens of one trace block */
#define REPLAY_MAX_BLOCKS 16384u      /* per request: what one kvc_lookup takes */
#define REPLAY_LINE_MAX (1u << 20)    /* bytes of one trace line */

/* One request as parsed; ids point into the parser's own array. */
struct replay_req {
    uint64_t line;
    double ts;
    uint64_t input_len;
    uint32_t n;
    uint64_t *ids; /* [REPLAY_MAX_BLOCKS], owned by whoever made the struct */
};

/* A line reader with a fixed buffer: a line longer than REPLAY_LINE_MAX is an error, never a
 * reason to grow. */
struct replay_reader {
    int fd;
    char *buf; /* REPLAY_LINE_MAX + 1 */
    size_t start, end;
    uint64_t line; /* number of the line last returned, from 1 */
    bool eof;
};

/* Opens path for reading. 0 or -errno (-ENOMEM). */
int replay_reader_open(struct replay_reader *rd, const char *path);
/* Closes the file and frees the buffer; a closed reader may be closed again. */
void replay_reader_close(struct replay_reader *rd);
/* The next line without its newline, NUL-terminated in the buffer (valid until the next
 * call): 1, 0 at the end, -E2BIG for a line longer than REPLAY_LINE_MAX, -errno for a read
 * error. rd->line is its number, from 1. */
int replay_reader_next(struct replay_reader *rd, char **line, size_t *len);

/* Parses one line into r (r->ids must hold REPLAY_MAX_BLOCKS; r->line is left alone). 0, or
 * -EINVAL with the reason (and, for a JSON error, its column) in err. A missing input_length
 * is 512 per id; a missing timestamp 0. */
int replay_line_parse(const char *s, size_t len, struct replay_req *r, char *err, size_t errlen);
/* Whether a line holds nothing but white space (skipped, not a request). */
bool replay_line_blank(const char *s, size_t len);
/* Tokens of block j of r, as kvcsim counts them: 512, the remainder for the last block, and a
 * whole block where input_length says fewer tokens than the ids cover. */
uint64_t replay_block_tokens(const struct replay_req *r, uint32_t j);

#endif
