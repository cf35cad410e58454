# DESIGN: getting a private kvcd to quantize blocks in place, for the tests that need lossy
# hits (test_engine.py, test_binding.py). The lru policy quantizes the coldest blocks of
# namespaces that allow a codec once an arena is over its high watermark, down to the low
# one, and evicts only what is still over the high watermark after that (as
# tests/e2e/check_e2e_quant.c gets the daemon to quantize). The test's blocks go in first
# (the coldest), raw filler blocks follow one at a time until the daemon starts quantizing:
# quantizing every test block then brings the arena back under the high watermark without
# an eviction.
import os
import time

# The deadlines scale as the C suites' (tests/lib/daemon.h, daemon_slow): 4 x under a
# sanitizer, times KVC_TEST_SLOW on a host more loaded than usual.
SLOW = (4 if os.environ.get("KVC_PY_SANITIZER") else 1) * \
    max(1, min(100, int(os.environ.get("KVC_TEST_SLOW", "1") or 1)))

QUANT_OPTIONS = ["host.size=16m", "host.page_size=64k", "cache.policy=lru",
                 "host.high_watermark=0.95", "host.low_watermark=0.90",
                 "host.quantize_inflight=1024"]


def fill_until_quantizing(c, blocks, block_bytes, deadline_s=20):
    """Puts raw filler blocks until the daemon has quantized the `blocks` test blocks (of
    block_bytes each), for deadline_s x SLOW at most; returns the count it reached."""
    ns = c.namespace("kvcd-ref/test-quant-filler", 2, 2, 32, 64)
    fill = bytearray(ns.block_bytes)
    bulk = int((16 << 20) * 0.9) // ns.block_bytes - blocks * block_bytes // ns.block_bytes
    i = 0
    for i in range(0, bulk, 64):  # to about 90 %, quickly
        keys = ns.keys_from_tokens(range(i * 64, min(bulk, i + 64) * 64), extra=b"fill")
        ns.put_prefix(keys, [fill] * len(keys))
    i = bulk
    end = time.monotonic() + deadline_s * SLOW
    while time.monotonic() < end:
        q = c.stats().get("quantized_blocks", 0)
        if q >= blocks:
            return q
        if q == 0:  # one more block at a time, until the first quantization
            keys = ns.keys_from_tokens(range(i * 64, (i + 1) * 64), extra=b"fill")
            ns.put_prefix(keys, [fill])
            i += 1
        else:
            time.sleep(0.01)
    return c.stats().get("quantized_blocks", 0)
