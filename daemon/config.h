/*
 * config.h — kvcd's configuration: one table of options drives everything.
 *
 * DESIGN
 * CONFIG_OPTIONS below is the only place an option is declared. It expands into the fields
 * of struct config, the parser (inih, with file and line in every error), validation
 * against bounds, `-o section.key=value` overrides, `kvcd --check-config`,
 * `kvcd --print-config` (which generates the shipped etc/kvcd.ini) and reload, which is
 * all-or-nothing: a new configuration is built and validated whole, then swapped in,
 * or refused with the old one left untouched. Owned by the loop thread.
 *
 * X(section, name, type, default, min, max, reloadable, choices, help)
 *   type     BOOL, INT, SIZE (512m, 4g), DURATION (500ms, 10s, 1m), DOUBLE, STRING, MODE
 *            (octal), ENUM (one of `choices`, "a|b|c"), SECRET (a string never shown: not by
 *            CONFIG_GET, --print-config, metrics or logs; config_get writes "(set)")
 *   default  as a string, parsed by the same code as a file value
 *   min/max  bounds for numeric types (bytes for SIZE, milliseconds for DURATION)
 */
#ifndef KVC_CONFIG_H
#define KVC_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/config_ns.h"
#include "daemon/config_parse.h" /* config_parse_size and _duration_ms, for their users */

#define CONFIG_OPTIONS(X)                                                                          \
    X(server, socket, STRING, "", 0, 0, 0, NULL,                                                   \
      "Unix socket path. Empty: $XDG_RUNTIME_DIR/kvcd.sock for a user, /run/kvcd/kvcd.sock "       \
      "for root.")                                                                                 \
    X(server, socket_mode, MODE, "0660", 0, 0777, 0, NULL, "Permission bits of the socket file.")  \
    X(server, socket_group, STRING, "", 0, 0, 0, NULL,                                             \
      "Group owning the socket file. Empty: the daemon's group.")                                  \
    X(server, max_clients, INT, "1024", 1, 65536, 1, NULL,                                         \
      "Connections accepted at once; more are refused (EUSERS) with a log line.")                  \
    X(server, max_clients_per_uid, INT, "64", 1, 65536, 1, NULL,                                   \
      "Connections one user (uid) may hold at once; more are refused (EUSERS). Admins are "        \
      "exempt.")                                                                                   \
    X(server, io_threads, INT, "auto", 0, 64, 0, "auto",                                           \
      "Threads that read the clients' requests from their sockets and send the replies, "          \
      "connections spread over them; the requests themselves still run on the one loop "           \
      "thread, in order. 0: the loop thread does the sockets too. Worth it with many busy "        \
      "clients and cores to spare (docs/performance.md). auto: 0 below 4 CPUs, else one per 4 "    \
      "CPUs the daemon may run on, at most 4.")                                                    \
    X(server, io_threads_min_active, INT, "0", 0, 65536, 1, NULL,                                  \
      "With io_threads: the connections with a request within 100ms from which their sockets "     \
      "go to the I/O threads; below half as many the loop thread reads and writes them itself, "   \
      "as with io_threads 0, so few clients pay no thread hand-over. 0: twice io_threads; "        \
      "1: always the I/O threads.")                                                                \
    X(server, hello_timeout, DURATION, "5s", 100, 3600000, 1, NULL,                                \
      "A connection that sends no HELLO within this time is closed.")                              \
    X(server, idle_timeout, DURATION, "1h", 1000, 604800000, 1, NULL,                              \
      "A connection with no request for this long is closed; its leases and reservations "         \
      "go back (the client's next call fails with ETIMEDOUT).")                                    \
    X(server, max_leases, INT, "4096", 1, 1048576, 1, NULL,                                        \
      "Open leases and reservations per client.")                                                  \
    X(server, max_waits, INT, "16", 1, 4096, 1, NULL,                                              \
      "WAIT requests one client may have pending at once (one per lease).")                        \
    X(server, reservation_timeout, DURATION, "60s", 100, 86400000, 1, NULL,                        \
      "A reservation not committed or aborted within this time is aborted; COMMIT or ABORT "       \
      "of it then fails with ETIMEDOUT.")                                                          \
    X(server, max_namespaces, INT, "256", 1, 65535, 0, NULL, "Namespaces the daemon holds.")       \
    X(server, fast_path, BOOL, "yes", 0, 0, 0, NULL,                                               \
      "Publish each arena's cached blocks in a read-only shared index, so clients copy hits "      \
      "with no round trip (docs/performance.md). Clients also turn it off with "                   \
      "KVC_NO_FASTPATH=1.")                                                                        \
    X(server, fast_ring_rate, INT, "65536", 1000, 16777216, 1, NULL,                               \
      "Hits per second the daemon reads from one connection's hit ring (the fast path's "          \
      "record of its hits, for the policies), a ring's worth (4096) banked; hits past it "         \
      "are not counted (fast_dropped). Rings are read in bounded passes between requests, "        \
      "at most a quarter of the loop's time; past that too, a client asking for room has its "     \
      "unread hits skipped (fast_dropped) rather than wait (docs/security.md).")                   \
    X(server, max_namespaces_per_uid, INT, "16", 1, 65535, 1, NULL,                                \
      "Namespaces one user (uid) may create; more are refused (EDQUOT). Admins are exempt; "       \
      "kvcctl ns drop frees them.")                                                                \
    X(server, admin_group, STRING, "", 0, 0, 1, NULL,                                              \
      "Group whose members may run admin requests (reload, config set, policy set, evict, "        \
      "ns drop, shutdown) besides root and the daemon's user. Empty: none.")                       \
    X(log, level, ENUM, "info", 0, 0, 1, "error|warning|info|debug",                               \
      "Least severe level written to stderr (the journal under systemd).")                         \
    X(log, rate_limit, INT, "20", 1, 100000, 1, NULL,                                              \
      "Lines per second a client can trigger; the rest are counted and summarised.")               \
    X(host, size, SIZE, "1g", 16 << 20, 1ull << 42, 0, NULL,                                       \
      "Bytes of the host-tier arena (shared memory, faulted in while kvcd serves).")               \
    X(host, page_size, SIZE, "2m", 64 << 10, 1 << 30, 0, NULL,                                     \
      "Allocator page: a power of two; 2m matches huge pages.")                                    \
    X(host, hugepages, ENUM, "auto", 0, 0, 0, "auto|on|off",                                       \
      "Back the arena with hugetlb pages: auto uses them when enough are free.")                   \
    X(host, prefault, BOOL, "yes", 0, 0, 0, NULL,                                                  \
      "Fault every arena page in so that copies run at full speed: the first 64 MiB before "       \
      "kvcd serves, the rest in the background, the pages handed out first first.")                \
    X(host, prefault_threads, INT, "0", 0, 64, 0, NULL,                                            \
      "Threads that fault the arena in while kvcd serves (0: one per CPU, at most 8).")            \
    X(host, thp_collapse, BOOL, "yes", 0, 0, 0, NULL,                                              \
      "Without hugetlb pages: make each 2 MiB of the arena and of the shared index one "           \
      "transparent huge page as it is faulted in (MADV_COLLAPSE, Linux 6.1), whatever the "        \
      "host's shmem THP setting allows; where the kernel cannot, 4 KiB pages.")                    \
    X(host, high_watermark, DOUBLE, "0.99", 0.05, 1.0, 1, NULL,                                    \
      "Fraction of the arena in use above which unpinned blocks are evicted (after a commit, "     \
      "off the client's path), down to low_watermark. A put that finds the arena full evicts "     \
      "what it needs itself, so memory below the band is cache lost, not safety.")                 \
    X(host, low_watermark, DOUBLE, "0.98", 0.0, 1.0, 1, NULL,                                      \
      "Fraction of the arena in use at which eviction stops. Must be below high_watermark.")       \
    X(host, quantize_inflight, INT, "8", 0, 1024, 1, NULL,                                         \
      "Blocks of one host arena quantized in place at once above high_watermark, before "          \
      "evicting, in namespaces whose creator allowed a codec (0: never quantize, evict). Each "    \
      "arena has its own count, so the jobs of one arena never hold back another's. A slab "       \
      "quantized whole to make room for the smaller size starts below it and may pass it once.")   \
    X(host, quantize_threads, INT, "1", 0, 16, 0, NULL,                                            \
      "Threads that encode quantize-in-place jobs (0: one per CPU, at most 4). Their results "     \
      "land in the order the jobs were queued. Puts that wait for the precision ladder's "         \
      "room wait for these threads.")                                                              \
    X(host, head_step, BOOL, "yes", 0, 0, 1, NULL,                                                 \
      "Once a namespace's per-head hints keep its retrieval heads raw in its quantized blocks, "   \
      "a block outside the sinks leaving raw takes the precision ladder's second codec at once "   \
      "for its other (sink-only and local) heads, which read next to nothing from it "             \
      "(docs/policies.md). no: the first codec, as without per-head hints.")                       \
    X(cache, policy, ENUM, "default", 0, 0, 1,                                                     \
      "lru|lfu|prefix|streaming|h2o|snapkv|keynorm|quest|default|vatp",                            \
      "Policy of the namespaces no [namespace.PATTERN] section names one for: their eviction "     \
      "order and, with codecs or a disk tier, what leaves memory how (docs/policies.md). lru "     \
      "keeps the original order: quantize, then demote to disk, then drop, coldest first.")        \
    X(cache, ghosts, DOUBLE, "8", 0.0, 64.0, 1, NULL,                                              \
      "Evicted blocks remembered, as a multiple of a namespace's capacity in blocks (at most "     \
      "1/1024 of the host memory, 512 KiB at least): one committed again soon after its "          \
      "eviction gets its decayed access count back, as ARC's ghost lists do. 0: none. Ignored "    \
      "under lru.")                                                                                \
    X(cache, recompute_tokens_per_s, INT, "8000", 1, 100000000, 1, NULL,                           \
      "Prefill throughput of the engines, in tokens per second: kvcd reports the time its "        \
      "hits saved as hit tokens divided by this, beside the load time clients report.")            \
    X(quota, client_pins, INT, "262144", 0, 1ll << 40, 1, NULL,                                    \
      "Blocks one client may hold pinned through lookups at once. 0: no limit.")                   \
    X(quota, client_reservations, INT, "1024", 0, 1048576, 1, NULL,                                \
      "Reservations one client may hold open at once. 0: no limit.")                               \
    X(quota, client_reserved_bytes, SIZE, "0", 0, 1ull << 42, 1, NULL,                             \
      "Bytes of reserved, uncommitted slots one client may hold at once. 0: no limit (the "        \
      "per-user share below still holds).")                                                        \
    X(quota, uid_pins, INT, "1048576", 1, 1ll << 40, 1, NULL,                                      \
      "Blocks the clients of one user (uid) may hold pinned at once, all connections together. "   \
      "Admins are exempt.")                                                                        \
    X(quota, uid_leases, INT, "16384", 1, 1ll << 30, 1, NULL,                                      \
      "Leases and reservations the clients of one user (uid) may hold open at once. Admins are "   \
      "exempt.")                                                                                   \
    X(quota, uid_reserved_share, INT, "25", 1, 100, 1, NULL,                                       \
      "Percent of an arena that the reserved, uncommitted slots of one user (uid) may take. "      \
      "Admins are exempt.")                                                                        \
    X(disk, path, STRING, "", 0, 0, 0, NULL,                                                       \
      "Files or block devices of the disk tier, separated by commas (at most 8); files are "       \
      "created and sized at start. Empty: no disk tier, blocks leaving memory are dropped.")       \
    X(disk, capacity, SIZE, "16g", 1 << 20, 1ull << 50, 0, NULL,                                   \
      "Bytes used on each path (whole pages; a block device gives at most its size).")             \
    X(disk, page, SIZE, "16m", 64 << 10, 1 << 30, 0, NULL,                                         \
      "Append unit of the disk tier, a multiple of 4k: a page is reused once all its blocks "      \
      "are gone (docs/disk.md).")                                                                  \
    X(disk, queue_depth, INT, "32", 1, 4096, 0, NULL,                                              \
      "Disk reads, and disk writes, on the device at once (as fio's iodepth); as many again may "  \
      "be hashing or waiting for a slot. Every host arena shares them: while puts wait for "       \
      "write-back, writes go in turn to the arenas they wait in.")                                 \
    X(disk, write_rate, SIZE, "1g", 0, 1ull << 40, 0, NULL,                                        \
      "Bytes per second written to disk at most (spares the drive); 0: unbounded. Shared by "      \
      "every host arena as disk.queue_depth is.")                                                  \
    X(disk, put_wait, DURATION, "2s", 0, 60000, 1, NULL,                                           \
      "How long a put that finds memory full of blocks still being written to disk waits for "     \
      "room before it is refused (NOSPACE), and a lookup for that room or for the GPU pool's "     \
      "copies to a client without the pool before it is answered with what there is; 0: at "       \
      "once. Meanwhile its arena's writes take turns with those of other arenas whose puts wait, " \
      "ahead of any other write-back.")                                                            \
    X(disk, admit_hits, INT, "0", 0, 1000000, 1, NULL,                                             \
      "Hits a block needs before leaving memory for disk instead of being dropped "                \
      "(docs/disk.md).")                                                                           \
    X(disk, compact_below, INT, "50", 0, 100, 0, NULL,                                             \
      "Percent of a disk page still live under which the compactor moves its blocks to free "      \
      "it, once fewer than a quarter of the pages are free; 0: never.")                            \
    X(disk, compress, INT, "0", 0, 19, 1, NULL,                                                    \
      "zstd level of the blocks written to disk (1-19; 1 is as good as 3 on KV data, "             \
      "docs/disk.md); 0: stored raw. [namespace.PATTERN] disk_compress overrides it.")             \
    X(disk, workers, INT, "2", 1, 16, 0, NULL,                                                     \
      "Threads that hash, compress and decompress disk records off the loop thread.")              \
    X(disk, format, ENUM, "auto", 0, 0, 0, "auto|never|force",                                     \
      "A path without a kvcd disk tier on it: auto formats it only when it is new, empty (its "    \
      "first 4k all zero) or an older kvcd's, and refuses anything else; never refuses it (and "   \
      "creates no file); force formats it, losing what it holds.")                                 \
    X(disk, checkpoint_interval, DURATION, "60s", 0, 86400000, 0, NULL,                            \
      "How often the disk index is checkpointed when it changed, and at a clean stop: a restart "  \
      "reads it and the pages written since instead of every record header (docs/disk.md). The "   \
      "first one comes a second after start once the disk holds records. 0: none is written or "   \
      "read.")                                                                                     \
    X(disk, checkpoint_bytes, SIZE, "1g", 0, 1ull << 50, 1, NULL,                                  \
      "A checkpoint also follows every this many bytes written to disk (at most one a second, "    \
      "and one taking at most 1/20 of the daemon's time), which bounds what a restart after a "    \
      "crash walks. 0: checkpoint_interval alone.")                                                \
    X(disk, checkpoint_path, STRING, "", 0, 0, 0, NULL,                                            \
      "File of the disk index checkpoint. Empty: the first disk.path with .ckpt appended when it " \
      "is a file; a block device gets none unless a file is named here.")                          \
    X(remote, nodes, STRING, "", 0, 0, 0, NULL,                                                    \
      "Seed nodes of the Redis Cluster holding the remote tier, host:port separated by commas "    \
      "(docs/remote.md). Empty: no remote tier (no thread, no connection).")                       \
    X(remote, user, STRING, "", 0, 0, 0, NULL,                                                     \
      "ACL user of AUTH on every connection. Empty: AUTH with the password alone.")                \
    X(remote, password, SECRET, "", 0, 0, 0, NULL,                                                 \
      "Password of AUTH; never shown (kvcctl config get says (set)). Prefer password_file. "       \
      "Empty: password_file, else the credential kvcd-remote-password, else no AUTH.")             \
    X(remote, password_file, STRING, "", 0, 0, 0, NULL,                                            \
      "File holding the password of AUTH (its first line; mode 0600, owned by kvcd's user or "     \
      "root). Empty: remote.password, else $CREDENTIALS_DIRECTORY/kvcd-remote-password.")          \
    X(remote, seal, BOOL, "yes", 0, 0, 0, NULL,                                                    \
      "Seal every record (XChaCha20-Poly1305 under keys from remote.key_file): values a kvcd "     \
      "without the key wrote or changed are misses, and the cluster holds only ciphertext "        \
      "(docs/remote.md). no: plain records anyone who reaches the cluster can read or forge; "     \
      "then namespaces with read or write lists never go to the remote tier.")                     \
    X(remote, seal_threads, INT, "4", 0, 64, 0, NULL,                                              \
      "Threads that seal and open records beside the remote tier's network thread (about 1 GB/s "  \
      "each); 0: the network thread does it. Idle threads cost nothing.")                          \
    X(remote, key_file, STRING, "", 0, 0, 0, NULL,                                                 \
      "File of the deployment secret that seals records: 32 to 4096 random bytes (head -c 32 "     \
      "/dev/urandom), mode 0600, owned by kvcd's user or root; the same on every kvcd sharing "    \
      "the cluster. Empty: $CREDENTIALS_DIRECTORY/kvcd-remote-key (systemd LoadCredential=).")     \
    X(remote, connect_timeout, DURATION, "500ms", 1, 60000, 0, NULL,                               \
      "Time a connection to a cluster node may take.")                                             \
    X(remote, timeout, DURATION, "2s", 1, 60000, 0, NULL,                                          \
      "Time a read or write on a cluster connection may take; past it the tier is degraded.")      \
    X(remote, max_inflight, INT, "256", 2, 65536, 0, NULL,                                         \
      "Remote block reads and writes queued or on the wire at once; half each at most for "        \
      "lookups and for write-behind.")                                                             \
    X(remote, batch, INT, "64", 1, 4096, 0, NULL,                                                  \
      "Values (block parts) pipelined in one batch to the cluster; a block's parts always go "     \
      "in one batch.")                                                                             \
    X(remote, part_size, SIZE, "1m", 0, 1 << 30, 0, NULL,                                          \
      "A block larger than this is stored as parts of this size, each its own value, spread "      \
      "over the masters (docs/remote.md); 0 or at least 64k; 0: a block is one value. Set it "     \
      "alike on every kvcd sharing the cluster.")                                                  \
    X(remote, queue, INT, "4096", 1, 1048576, 0, NULL,                                             \
      "Admitted blocks waiting for their write-behind at most; more are not written (counted).")   \
    X(remote, min_hits, INT, "0", 0, 1000000, 1, NULL,                                             \
      "Hits a block needs before it is written to the remote tier; 0: every block at commit.")     \
    X(remote, negative_ttl, DURATION, "2s", 0, 3600000, 1, NULL,                                   \
      "How long a key the remote tier did not have is not asked for again; 0: always asked.")      \
    X(remote, backoff_min, DURATION, "100ms", 1, 60000, 0, NULL,                                   \
      "First wait before a degraded remote tier is probed again; doubled after each failure.")     \
    X(remote, backoff_max, DURATION, "10s", 1, 600000, 0, NULL,                                    \
      "Longest wait between probes of a degraded remote tier.")                                    \
    X(gpu, pool_size, SIZE, "0", 0, 1ull << 44, 0, NULL,                                           \
      "Bytes of the GPU tier's device pool, shared with engines on that GPU. 0: no GPU "           \
      "tier. Without a device or driver the tier is disabled with one log line.")                  \
    X(gpu, device, INT, "0", 0, 1023, 0, NULL, "CUDA ordinal of the GPU holding the pool.")        \
    X(gpu, pool_page_size, SIZE, "2m", 64 << 10, 1 << 30, 0, NULL,                                 \
      "Allocator page of the pool: a power of two.")

#define CONFIG_CTYPE_BOOL bool
#define CONFIG_CTYPE_INT int64_t
#define CONFIG_CTYPE_SIZE uint64_t
#define CONFIG_CTYPE_DURATION uint64_t /* milliseconds */
#define CONFIG_CTYPE_DOUBLE double
#define CONFIG_CTYPE_STRING char * /* owned, never NULL */
#define CONFIG_CTYPE_SECRET char * /* owned, never NULL */
#define CONFIG_CTYPE_MODE uint32_t
#define CONFIG_CTYPE_ENUM int /* index into choices */

enum config_type {
    CONFIG_TYPE_BOOL,
    CONFIG_TYPE_INT,
    CONFIG_TYPE_SIZE,
    CONFIG_TYPE_DURATION,
    CONFIG_TYPE_DOUBLE,
    CONFIG_TYPE_STRING,
    CONFIG_TYPE_MODE,
    CONFIG_TYPE_ENUM,
    CONFIG_TYPE_SECRET,
};

/* The values. Field names are section_name. */
struct config {
#define CONFIG_FIELD(sec, name, type, def, min, max, reload, choices, help)                        \
    CONFIG_CTYPE_##type sec##_##name;
    CONFIG_OPTIONS(CONFIG_FIELD)
#undef CONFIG_FIELD
    /* [namespace.PATTERN] sections, in file order (daemon/config_ns.h); owned. */
    struct config_ns_table ns;
};

/* Row of the option table, for code that walks options generically. */
struct config_option {
    const char *section;
    const char *name;
    enum config_type type;
    const char *def;
    double min, max;
    bool reloadable;
    const char *choices;
    const char *help;
    size_t offset; /* of the field in struct config */
};

extern const struct config_option config_options[];
extern const size_t config_noptions;

/* Values of the enum options, in their `choices` order. */
enum config_log_level { CONFIG_LOG_ERROR, CONFIG_LOG_WARNING, CONFIG_LOG_INFO, CONFIG_LOG_DEBUG };
enum config_hugepages { CONFIG_HUGEPAGES_AUTO, CONFIG_HUGEPAGES_ON, CONFIG_HUGEPAGES_OFF };
enum config_disk_format {
    CONFIG_DISK_FORMAT_AUTO,
    CONFIG_DISK_FORMAT_NEVER,
    CONFIG_DISK_FORMAT_FORCE,
};

/* server.io_threads = auto for a daemon that may run on `cpus` CPUs: none below 4, else one
 * per 4 of them, at most 4 (bench_scale on 16 cores: 4 threads gave 2.0-2.5 times the loop
 * alone from 16 clients, and about as much as the loop alone from one client, whose socket
 * the threads leave to the loop: server.io_threads_min_active). */
uint32_t config_io_threads_auto(long cpus);

/* A configuration holding every default. NULL when out of memory. A default that does not
 * parse is a bug in the table: config_new asserts. */
struct config *config_new(void);
void config_free(struct config *c); /* NULL is a no-op; frees the strings too */
/* Deep copy. NULL when out of memory. */
struct config *config_dup(const struct config *c);

/* Applies the file over c. Errors name the file and line ("kvcd.ini:12: unknown key 'szie'
 * in [host] (did you mean 'size'?)"); the first error is reported. Each value is parsed and
 * checked against its bounds; combinations are config_validate's job, to be called once
 * every source (file, then -o overrides) has been applied.
 * Rules: '#' or ';' starts a comment line, " ;" an inline comment; leading whitespace is
 * ignored (there are no continuation lines); a key set twice in one file is an error (it is
 * almost always an edit gone wrong), while a [section] may be opened more than once; a key
 * outside any section, an unknown section (even an empty one) or key, a line that is not
 * "[section]" or "key = value", a NUL byte and a line too long for inih are errors.
 * Returns 0; -EINVAL for any error in the text; -errno of opening or reading the file
 * (-ENOENT, -EACCES, -EISDIR, ...); -EFBIG past 1 MiB; -ENOMEM. err is always NUL-terminated.
 * On failure c may be partly changed: parse into a copy (config_dup). */
int config_load_file(struct config *c, const char *path, char *err, size_t errlen);

/* Same as config_load_file on len bytes of text in memory (need not be NUL-terminated);
 * name stands for the file in messages. The fuzzing entry point; tests use it too. */
int config_load_buffer(struct config *c, const char *name, const char *buf, size_t len, char *err,
                       size_t errlen);

/* Sets one option from "section.name" and a value string, as -o does, with the checks a file
 * value gets. A string value must be writable back to an ini file: at most 128 bytes, no
 * control characters, no leading or trailing spaces, no leading ';' and no " ;" (both start
 * a comment). 0, -EINVAL or -ENOMEM. */
int config_set(struct config *c, const char *key, const char *value, char *err, size_t errlen);

/* Every value within its bounds, then the cross-option checks: low_watermark <
 * high_watermark, page_size a power of two, size >= page_size, a socket path that fits in
 * sockaddr_un. 0 or -EINVAL naming the first failure. */
int config_validate(const struct config *c, char *err, size_t errlen);

/* Writes an ini file of every option, grouped by section, each with its help wrapped as
 * comments, its type, bounds or choices, default and whether a reload applies it, then
 * "name = value" with c's value. Used by --print-config to generate etc/kvcd.ini; loading
 * the output gives back c. 0 or -EIO. */
int config_print(const struct config *c, FILE *f);

/* Every option as troff (kvcd.ini(5)'s OPTIONS, between its generated markers): per section
 * ".SS [section]", per option its name, help, type, bounds, default and reloadability.
 * `kvcd --print-man` writes it; `make man-ini` puts it in docs/man/kvcd.ini.5. 0 or -EIO. */
int config_print_man(FILE *f);

/* The value of "section.name" as text (what a config file would hold: sizes with the largest
 * exact suffix, 1g; durations likewise, 90s; modes 0660; enums by name). 0, -ENOENT for an
 * unknown key, -ENOSPC when len is too small (buf then holds a truncated, terminated text). */
int config_get(const struct config *c, const char *key, char *buf, size_t len);

/* The same value as one JSON value, typed: booleans true/false, integers and doubles as
 * numbers, sizes in bytes and durations in milliseconds (numbers), modes, enums and strings
 * as strings (a secret: "(set)" or ""). Returns as config_get. */
int config_get_json(const struct config *c, const struct config_option *o, char *buf, size_t len);

/* Who may see an option's value through CONFIG_GET. Every string option is classified in
 * config.c's CONFIG_STRING_ACCESS (check_config fails on one that is not): those naming
 * where data lives or who may reach it (paths, cluster nodes and users, groups) are for
 * admins only; secrets are shown to nobody, admins included (config_get writes "(set)").
 * CONFIG_ACCESS_NONE: an option that is not a string and not in the list (anyone). */
enum config_access { CONFIG_ACCESS_NONE, CONFIG_ACCESS_ANYONE, CONFIG_ACCESS_ADMIN };
enum config_access config_option_access(const struct config_option *o);

/* Reload check: 0 if every option that differs between cur and next is reloadable; else
 * -EROFS with the first offender named in err. */
int config_check_reload(const struct config *cur, const struct config *next, char *err,
                        size_t errlen);

/* Option row for "section.name", or NULL. */
const struct config_option *config_option_find(const char *key);

#endif
