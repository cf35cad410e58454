/*
 * stats.h — the daemon's counters, declared once.
 *
 * STATS_COUNTERS expands into the counter struct (kept per namespace and in total), the
 * aggregation and the names sent to STATS. Gauges (values computed when asked: clients,
 * blocks, bytes in use) are listed apart in STATS_GAUGES and filled by the store/server.
 */
#ifndef KVC_STATS_H
#define KVC_STATS_H

#include <stdint.h>

/* X(name, help) — monotonic counters. */
#define STATS_COUNTERS(X)                                                                      \
    X(lookups, "LOOKUP requests")                                                             \
    X(lookup_blocks, "blocks asked for by lookups")                                           \
    X(lookup_tokens, "tokens asked for by lookups")                                           \
    X(lookup_index_finds, "index resolutions by lookups, spans too (at most one a key)")      \
    X(hit_blocks, "blocks found (longest cached prefix)")                                     \
    X(hit_tokens, "tokens found")                                                             \
    X(hit_tokens_host, "tokens found in the host tier")                                       \
    X(hit_tokens_disk, "tokens found on disk (read back into memory for the lookup)")         \
    X(hit_tokens_gpu, "tokens found in the GPU pool")                                         \
    X(hit_blocks_lossy, "blocks found stored in a lossy codec (the six below)")               \
    X(hit_blocks_q8_0, "blocks found stored in q8_0")                                         \
    X(hit_blocks_q4_1, "blocks found stored in q4_1")                                         \
    X(hit_blocks_q5_1, "blocks found stored in q5_1")                                         \
    X(hit_blocks_kivi2, "blocks found stored in KIVI-2")                                      \
    X(hit_blocks_kivi4, "blocks found stored in KIVI-4")                                      \
    X(hit_blocks_fp8, "blocks found stored in fp8 (e4m3)")                                    \
    X(fast_hits, "of those, blocks copied through the shared index (no round trip)")         \
    X(fast_refused, "hit-ring entries refused (not a cached block the client may read)")      \
    X(fast_dropped, "hit-ring entries skipped: past fast_ring_rate or the passes' share")     \
    X(miss_blocks, "blocks asked for and not found")                                          \
    X(miss_tokens, "tokens asked for and not found")                                          \
    X(bytes_out, "bytes handed out as hits")                                                  \
    X(bytes_in, "bytes committed by clients")                                                 \
    X(reserves, "RESERVE requests")                                                           \
    X(reserve_keys, "keys in RESERVE requests")                                               \
    X(reserved_blocks, "slots handed out")                                                    \
    X(reserved_chained_blocks, "of those, under a slot the same client had not committed yet") \
    X(dedup_blocks, "keys already cached at RESERVE (no write needed)")                       \
    X(busy_blocks, "keys being written by another client at RESERVE")                         \
    X(nospace_blocks, "keys refused for lack of room")                                        \
    X(skipped_parent_blocks, "keys skipped at RESERVE: their parent is not cached (evicted)")  \
    X(skipped_parent_busy_blocks, "keys skipped at RESERVE: their parent is being written")    \
    X(skipped_busy_blocks, "keys skipped at RESERVE behind a key another client is writing")   \
    X(skipped_nospace_blocks, "keys skipped at RESERVE behind a key that found no room")       \
    X(skipped_failed_blocks, "keys skipped at RESERVE behind a slot that could not be made")   \
    X(quota_cut_blocks, "keys answered NOSPACE because a quota cut their RESERVE short")       \
    X(committed_blocks, "blocks made visible")                                                \
    X(commit_parent_busy, "COMMITs refused (EAGAIN): the slot they hang from is not committed") \
    X(aborted_blocks, "reserved slots freed unwritten (abort, partial commit, client exit)")  \
    X(evicted_blocks, "blocks evicted to make room")                                          \
    X(evicted_bytes, "bytes evicted")                                                         \
    X(trim_yields, "trims stopped early for a waiting request (the rest goes on after it)")     \
    X(reserve_evictions, "blocks evicted (or their memory dropped) inside a RESERVE, a put waiting") \
    X(load_us, "time clients reported copying hits out of the cache (us)")                   \
    X(load_refused_us, "copy time reported past what a client could spend (us)")           \
    X(pins, "block pins taken by lookups")                                                    \
    X(unpins, "block pins dropped (release or client exit)")                                  \
    X(quantized_blocks, "raw blocks quantized in place")                                           \
    X(quant_bytes_saved, "bytes freed by quantizing in place")                                     \
    X(quant_no_room, "blocks the lru trigger found no slot of the encoded size for")               \
    X(quant_slab_steps, "of those, slabs it quantized whole (their pages change size)")            \
    X(requantized_blocks, "lossy blocks re-encoded one rung down the precision ladder")            \
    X(head_stepped_blocks, "blocks with raw retrieval heads put at once on the second codec")      \
    X(ladder_steps, "steps down the precision ladder started (quantize jobs it queued)")           \
    X(ladder_slab_steps, "of those, whole slabs taken down at once (their pages change size)")     \
    X(ladder_missed, "steps placed on landing that found no slot then (the block stayed)")         \
    X(ladder_slot_outs, "blocks taken out of the last rung to make a step down its slot")          \
    X(merge_refused_blocks, "merge steps whose block had more runs than merge stores (sent past)") \
    X(merge_off, "times merge left a ladder that it refused nearly every block of (for a while)")   \
    X(compacted_slabs, "slabs emptied by moving their blocks to free slots of their size")         \
    X(compacted_blocks, "blocks moved by those compactions")                                       \
    X(errors, "requests answered with an error")                                                   \
    X(requests, "requests handled")                                                                \
    X(refused_access, "requests refused by a namespace access list (EACCES)")                      \
    X(refused_admin, "admin requests refused to a peer that is not an admin (EPERM)")              \
    X(refused_quota, "requests refused or cut short by a quota (EDQUOT)")                          \
    X(errors_proto, "malformed requests (bad length, field, opcode)")                              \
    X(errors_nospace, "requests that found no room (ENOSPC)")                                      \
    X(errors_other, "requests failed for another reason")                                          \
    X(evicted_quota_blocks, "blocks evicted to keep a namespace under its max_bytes")              \
    X(flushed_blocks, "blocks evicted by an operator (kvcctl evict/flush)")                        \
    X(flushed_bytes, "bytes evicted by an operator")                                               \
    X(demoted_blocks, "blocks written to disk (once per content: a clean block is not again)")     \
    X(demoted_clean, "blocks whose memory went while their clean copy stayed on disk (no write)")  \
    X(demote_dropped, "blocks dropped from memory without a disk write (admission, disk down)")    \
    X(put_waits, "RESERVEs and LOOKUPs that waited for room or pool moves (disk.put_wait)")        \
    X(put_wait_timeouts, "of those, answered NOSPACE: no room within disk.put_wait")               \
    X(put_waits_queued, "of those, RESERVEs that went behind their uid's waiting one untried")     \
    X(put_waits_writing, "of those, RESERVEs that waited for a key their uid was writing")         \
    X(promoted_blocks, "blocks read back from disk into memory")                                   \
    X(disk_evicted_blocks, "blocks evicted from disk to make room")                                \
    X(checksum_failures, "disk blocks that failed verification (dropped, served as misses)")       \
    X(disk_io_errors, "disk reads or writes that failed")                                          \
    X(gpu_promoted_blocks, "blocks moved from a host arena into the GPU pool")                     \
    X(gpu_demoted_blocks, "blocks moved from the GPU pool to a host arena")                     \
    X(gpu_move_failures, "pool moves whose copy failed (the block stayed where it was)")          \
    X(hint_blocks, "blocks that took a client hint (HINT)")                                        \
    X(ghost_hits, "blocks committed soon after their eviction, their count given back")      \
    X(budget_lookups, "budgeted lookups (LOOKUP_BUDGET)")                                          \
    X(io_to_threads, "connections handed from the loop thread to an I/O thread")               \
    X(io_to_loop, "connections handed from an I/O thread back to the loop thread")             \
    X(refused_connections, "connections refused: server.max_clients or max_clients_per_uid")       \
    X(closed_hello_timeout, "connections closed for sending no HELLO within server.hello_timeout") \
    X(closed_idle, "connections closed after server.idle_timeout without a request")               \
    X(refused_duplicates, "requests refused for a key repeated within one batch (EINVAL)")         \
    X(refused_pins, "lookups refused or cut short by quota.client_pins or quota.uid_pins")         \
    X(refused_leases, "requests refused by server.max_leases or quota.uid_leases (EMFILE)")        \
    X(refused_reserve_share, "reservations cut short by quota.uid_reserved_share (EDQUOT)")        \
    X(refused_waits, "WAITs refused by server.max_waits or a WAIT already pending (EBUSY)")        \
    X(refused_namespaces, "namespaces refused by server.max_namespaces_per_uid (EDQUOT)")          \
    X(expired_reservations, "reservations aborted after server.reservation_timeout")               \
    X(pin_saturated, "lookups cut short at a block whose pin count is at its ceiling")             \
    X(dropped_namespaces, "namespaces dropped by an operator (kvcctl ns drop)")                    \
    X(arena_faults, "faults on a host arena the daemon survived (a writer punched a hole)")

/* X(name, help) — values computed when asked. */
#define STATS_GAUGES(X)                                                                        \
    X(blocks_now, "committed blocks cached")                                                  \
    X(bytes_now, "bytes held by committed blocks")                                            \
    X(pins_now, "block pins held now")                                                        \
    X(reserved_now, "slots reserved and not yet committed")                                   \
    X(reserved_bytes_now, "bytes of those slots")                                             \
    X(clients_now, "connected clients")                                                       \
    X(namespaces_now, "namespaces")                                                           \
    X(host_capacity, "bytes of the host arena")                                               \
    X(host_used, "bytes of the host arena in slots")                                          \
    X(host_faulted, "bytes of the host arenas faulted in (of host_arenas_bytes)")             \
    X(host_arenas_bytes, "bytes of every host arena together")                                \
    X(host_collapsed, "bytes of the host arenas on 2 MiB pages by collapse")                  \
    X(gpu_capacity, "bytes of the GPU pool (0: no GPU tier)")                                 \
    X(gpu_used, "bytes of the GPU pool in slots")                                             \
    X(uptime_s, "seconds since start")                                                        \
    X(fast_index_blocks, "blocks published in the arenas' shared indexes (fast path)")        \
    X(fast_index_full, "blocks left out of a full index set (their hits take the socket)")

struct stats {
#define STATS_FIELD(name, help) uint64_t name;
    STATS_COUNTERS(STATS_FIELD)
#undef STATS_FIELD
};

#endif
