# DESIGN: getting a private kvcd to quantize blocks in place, for the tests that need lossy
# hits (test_engine.py, test_binding.py). The lru policy quantizes the coldest quantizable
# blocks of an arena once it is over its high watermark, down to the low one (the raw slots
# of jobs in flight count as free already), and evicts what is still over it from the LRU's
# cold end (as tests/e2e/check_e2e_quant.c gets the daemon to quantize). Raw filler (a
# namespace with no codec) goes in first (fill_first), to some room below the high
# watermark; then the test's blocks; then more filler (fill_until_quantizing), in bulk to
# 90 % and then one block at a time, until the daemon has quantized every test block. The
# test blocks are then neither the coldest blocks nor the newest: an eviction that follows
# the quantization (the last trim stopped above the low watermark, or the quantized slots
# freed less than the raw ones counted) takes the older filler first, so the blocks a test
# measures stay cached. With the test's blocks first instead (the coldest), such a trim took
# them: about one run in ten lost a codec's blocks.
import os
import time

# The deadlines scale as the C suites' (tests/lib/daemon.h, daemon_slow): 4 x under a
# sanitizer, times KVC_TEST_SLOW on a host more loaded than usual.
SLOW = (4 if os.environ.get("KVC_PY_SANITIZER") else 1) * \
    max(1, min(100, int(os.environ.get("KVC_TEST_SLOW", "1") or 1)))

QUANT_OPTIONS = ["host.size=16m", "host.page_size=64k", "cache.policy=lru",
                 "host.high_watermark=0.95", "host.low_watermark=0.90",
                 "host.quantize_inflight=1024"]


FILLER = ("kvcd-ref/test-quant-filler", 2, 2, 32, 64)  # a 64-token block is 32 KiB


def _filler(c):
    return c.namespace(*FILLER)


def _put_filler(ns, first, count, tag):
    """Puts filler blocks first .. first + count - 1 of `tag`, 64 to a call."""
    fill = bytearray(ns.block_bytes)
    for i in range(first, first + count, 64):
        n = min(first + count, i + 64) - i
        keys = ns.keys_from_tokens(range(i * 64, (i + n) * 64), extra=tag)
        ns.put_prefix(keys, [fill] * n)


def fill_first(c, reserve_bytes):
    """Puts raw filler until the arena is 90 % full less reserve_bytes (the room the test's
    blocks will take), before the test puts them: the filler is then colder than they are."""
    ns = _filler(c)
    st = c.stats()
    room = int(st["host_capacity"] * 0.9) - st["host_used"] - reserve_bytes
    if room >= ns.block_bytes:
        _put_filler(ns, 0, room // ns.block_bytes, b"fill-first")


def fill_until_quantizing(c, blocks, block_bytes, deadline_s=20):
    """Puts raw filler blocks until the daemon has quantized the `blocks` test blocks (of
    block_bytes each), for deadline_s x SLOW at most; returns the count it reached.
    block_bytes is for the caller's record: the filler's amount follows the arena's use."""
    ns = _filler(c)
    st = c.stats()
    room = int(st["host_capacity"] * 0.9) - st["host_used"]
    i = max(0, room // ns.block_bytes)
    _put_filler(ns, 0, i, b"fill")  # to about 90 %, quickly
    end = time.monotonic() + deadline_s * SLOW
    while time.monotonic() < end:
        q = c.stats().get("quantized_blocks", 0)
        if q >= blocks:
            return q
        if q == 0:  # one more block at a time, until the first quantization
            _put_filler(ns, i, 1, b"fill")
            i += 1
        else:
            time.sleep(0.01)
    return c.stats().get("quantized_blocks", 0)
