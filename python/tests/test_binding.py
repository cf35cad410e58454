# DESIGN: tests of the kvcd Python package against a real kvcd (build/bin/kvcd, or $KVCD_BIN)
# started on a Unix socket in a temporary directory with a small host arena, as the C suites
# do (tests/lib/daemon.c), and stopped by its pid at the end (kvcd.engine.daemon.PrivateDaemon;
# with KVC_NO_FASTPATH=1, as tests/run-checks.sh's second run sets it, the daemon runs without
# the fast path too, and test_fast_path_as_the_environment_says checks which path served).
# Run by `make check` through build/tests/check_python with PYTHONPATH=build/python; by hand:
#   PYTHONPATH=build/python /usr/bin/python3 -m pytest -q python/tests
import errno
import gc
import itertools
import os
import sys
import threading
import time

import numpy as np
import pytest

import kvcd
from kvcd.engine.daemon import PrivateDaemon, fast_path_off

HERE = os.path.dirname(os.path.abspath(__file__))
KVCD_BIN = os.environ.get("KVCD_BIN") or os.path.join(HERE, "..", "..", "build", "bin", "kvcd")
LAYOUT = dict(layers=2, kv_heads=2, head_dim=16, block_tokens=4)  # 512-byte fp16 blocks
_models = itertools.count()


@pytest.fixture(scope="module")
def daemon():
    with PrivateDaemon(["host.size=32m"], binary=KVCD_BIN) as d:
        yield d.socket


@pytest.fixture
def client(daemon):
    with kvcd.Client(daemon) as c:
        yield c


def new_ns(client, **kw):
    """A namespace of its own for each test: no test sees another's blocks."""
    layout = dict(LAYOUT, **kw)
    return client.namespace("python-test-%d" % next(_models), **layout)


def blocks_for(ns, n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(ns.block_bytes // 2).astype(np.float16) for _ in range(n)]


def tokens(n, start=0):
    return list(range(start, start + n))


def test_put_then_lookup_round_trip(client):
    ns = new_ns(client)
    assert ns.block_bytes == 2 * 2 * 2 * 16 * 4 * 2  # layers, K/V, heads, dim, tokens, fp16
    keys = ns.keys_from_tokens(tokens(8 * ns.block_tokens + 3))
    assert len(keys) == 8 and all(isinstance(k, bytes) and len(k) == 16 for k in keys)
    blocks = blocks_for(ns, 8)
    assert ns.put_prefix(keys, blocks) == 8
    with ns.lookup(keys) as lease:
        assert len(lease) == 8
        for i, b in enumerate(blocks):
            out = np.zeros_like(b)
            lease.copy_into(i, out)
            assert np.array_equal(out, b)
    outs = [np.zeros_like(b) for b in blocks]
    assert ns.get_prefix(keys, outs) == 8
    assert all(np.array_equal(o, b) for o, b in zip(outs, blocks))
    # A longer chain hits its cached prefix only.
    more = ns.keys_from_tokens(tokens(4 * ns.block_tokens, 10_000), parent=keys[-1])
    with ns.lookup(keys + more) as lease:
        assert len(lease) == 8
    stats = client.stats()
    assert isinstance(stats, dict) and stats and all(isinstance(v, int) for v in stats.values())


def test_flush_makes_puts_visible_to_other_clients(daemon, client):
    ns = new_ns(client)
    keys = ns.keys_from_tokens(tokens(6 * ns.block_tokens))
    blocks = blocks_for(ns, 6, seed=5)
    assert ns.put_prefix(keys, blocks) == 6  # its commit is not waited for
    client.flush()  # now every client sees the blocks
    client.flush()  # nothing in flight: at once
    with kvcd.Client(daemon) as other:
        ons = other.namespace(ns.model_id, **LAYOUT)
        outs = [np.zeros_like(b) for b in blocks]
        assert ons.get_prefix(keys, outs) == 6
        assert all(np.array_equal(o, b) for o, b in zip(outs, blocks))
        other.flush()
    client.close()
    with pytest.raises(ValueError):
        client.flush()


def test_keys_are_chained_and_stable(client):
    ns = new_ns(client)
    t = tokens(6 * ns.block_tokens)
    keys = ns.keys_from_tokens(t)
    assert keys == ns.keys_from_tokens(np.array(t, dtype=np.uint32))
    assert ns.keys_from_tokens(t[:12])[:3] == keys[:3]
    assert ns.keys_from_tokens(t[12:], parent=keys[2]) == keys[3:]
    assert ns.keys_from_tokens(t, extra=b"adapter-1") != keys


def test_zero_copy_view_is_read_only(client):
    ns = new_ns(client)
    keys = ns.keys_from_tokens(tokens(3 * ns.block_tokens))
    blocks = blocks_for(ns, 3, seed=1)
    ns.put_prefix(keys, blocks)
    with ns.lookup(keys) as lease:
        mv = lease[1]
        assert isinstance(mv, memoryview) and mv.readonly and mv.nbytes == ns.block_bytes
        assert mv.obj.codec == "raw" and not mv.obj.encoded
        a = np.frombuffer(lease[1], dtype=np.float16)
        assert not a.flags.writeable
        assert np.array_equal(a, blocks[1])
        with pytest.raises(ValueError):
            a[0] = 1
        # Zero copy: two views of one hit are the same arena bytes.
        b = np.frombuffer(lease[1], dtype=np.float16)
        assert a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        assert np.array_equal(np.frombuffer(lease[-1], np.float16), blocks[2])
        with pytest.raises(IndexError):
            lease[3]
        del a, b, mv


def test_reservation_commit(client):
    ns = new_ns(client)
    keys = ns.keys_from_tokens(tokens(4 * ns.block_tokens))
    blocks = blocks_for(ns, 4, seed=2)
    with ns.reserve(keys) as r:
        assert len(r) == 4 and r.reserved == 4
        assert r.statuses == [kvcd.SLOT_RESERVED] * 4
        for i in range(2):  # through a writable view, zero copy
            np.frombuffer(r[i], dtype=np.float16)[:] = blocks[i]
        for i in range(2, 4):  # through a copy
            r.write(i, blocks[i])
    assert r.finished
    with ns.lookup(keys) as lease:
        assert len(lease) == 4
        assert all(np.array_equal(np.frombuffer(lease[i], np.float16), blocks[i])
                   for i in range(4))
    with ns.reserve(keys) as r:
        assert r.reserved == 0 and r.status(0) == kvcd.SLOT_PRESENT
        with pytest.raises(ValueError):
            r[0]  # no slot to write


def test_reservation_partial_commit_and_abort(client):
    ns = new_ns(client)
    keys = ns.keys_from_tokens(tokens(4 * ns.block_tokens))
    blocks = blocks_for(ns, 4, seed=3)
    with pytest.raises(RuntimeError):
        with ns.reserve(keys) as r:
            r.write(0, blocks[0])
            raise RuntimeError("engine failed mid-write")
    assert r.finished
    with ns.lookup(keys) as lease:
        assert len(lease) == 0 and lease.released
    r = ns.reserve(keys)
    for i in range(4):
        r.write(i, blocks[i])
    assert r.commit(2) == 2
    with pytest.raises(ValueError):
        r.commit()
    with ns.lookup(keys) as lease:
        assert len(lease) == 2
    r = ns.reserve(keys[2:], parent=keys[1])
    assert r.reserved == 2
    r.abort()
    r.abort()  # idempotent
    with ns.lookup(keys) as lease:
        assert len(lease) == 2


def test_commit_refused_while_slot_view_exported(client):
    ns = new_ns(client)
    keys = ns.keys_from_tokens(tokens(ns.block_tokens))
    r = ns.reserve(keys)
    mv = r[0]
    mv[:] = bytes(ns.block_bytes)
    with pytest.raises(BufferError):
        r.commit()
    mv.release()
    assert r.commit() == 1


def test_codecs_stored_format_and_evict(client):
    with pytest.raises(ValueError):
        new_ns(client, k_codec="q3_k")  # no such codec
    with pytest.raises(kvcd.Error) as e:
        new_ns(client, dtype="fp32", k_codec="q8_0")  # fp16 and bf16 only
    assert e.value.errno == errno.EINVAL
    ns = new_ns(client, k_codec="q8_0", v_codec="q8_0", raw_layers=1)
    keys = ns.keys_from_tokens(tokens(3 * ns.block_tokens))
    ns.put_prefix(keys, blocks_for(ns, 3))
    with ns.lookup(keys) as lease:  # no pressure here: stored raw
        assert [lease.stored(i) for i in range(len(lease))] == ["raw"] * 3
        with pytest.raises(IndexError):
            lease.stored(3)
    assert client.evict(ns.id) == 3  # this user started the daemon: an admin
    with ns.lookup(keys) as lease:
        assert len(lease) == 0


def test_errors(daemon, client):
    assert issubclass(kvcd.Error, OSError)
    with pytest.raises(kvcd.Error) as e:
        client.namespace("python-bad-layout", 0, 2, 16, 4)
    assert e.value.errno == errno.EINVAL and e.value.strerror
    with pytest.raises(ValueError):
        client.namespace("python-bad-dtype", 2, 2, 16, 4, dtype="fp7")
    ns = new_ns(client)
    with pytest.raises(kvcd.Error) as e:
        client.namespace(ns.model_id, 2, 2, 32, 4)  # known with another layout
    assert e.value.errno == errno.EEXIST
    with pytest.raises(kvcd.Error) as e:
        kvcd.Client(os.path.join(os.path.dirname(daemon), "nobody.sock"))
    assert e.value.errno in (errno.ENOENT, errno.ECONNREFUSED)
    keys = ns.keys_from_tokens(tokens(2 * ns.block_tokens))
    with pytest.raises(ValueError):
        ns.lookup([b"short"])
    with pytest.raises(kvcd.Error) as e:
        ns.lookup([keys[0], keys[0]])  # a key repeated
    assert e.value.errno == errno.EINVAL
    with pytest.raises(ValueError):
        ns.put_prefix(keys, [bytes(ns.block_bytes)])  # one buffer for two keys
    with pytest.raises(ValueError):
        ns.put_prefix(keys, [bytes(10), bytes(10)])  # buffers smaller than a block
    with pytest.raises((BufferError, TypeError)):
        ns.get_prefix(keys, [bytes(ns.block_bytes)] * 2)  # read-only buffers


def test_connect_errors_name_the_path(daemon, monkeypatch, tmp_path):
    """A failed connect says which path it tried (the default one too) and why, in words for
    a connect: it was "[Errno 2] not found (no daemon at the socket path, or unknown
    namespace)" with no path."""
    missing = str(tmp_path / "nobody.sock")
    with pytest.raises(kvcd.Error) as e:
        kvcd.Client(missing)
    assert e.value.errno == errno.ENOENT and e.value.filename == missing
    assert "cannot reach kvcd: no socket there" in str(e.value) and missing in str(e.value)
    monkeypatch.setenv("KVCD_SOCKET", missing)
    with pytest.raises(kvcd.Error) as e:
        kvcd.Client()
    assert e.value.filename == missing == kvcd.default_socket()
    with pytest.raises(kvcd.Error) as e:
        kvcd.Client(str(tmp_path))  # a directory, not a socket
    assert e.value.errno == errno.ECONNREFUSED and "not a socket" in e.value.strerror
    monkeypatch.setenv("KVCD_SOCKET", daemon)
    with kvcd.Client() as c:
        assert c.stats() is not None


def test_use_after_close_raises(daemon):
    c = kvcd.Client(daemon)
    ns = new_ns(c)
    keys = ns.keys_from_tokens(tokens(2 * ns.block_tokens))
    ns.put_prefix(keys, blocks_for(ns, 2))
    lease = ns.lookup(keys)  # left unreleased on purpose
    r = ns.reserve(ns.keys_from_tokens(tokens(ns.block_tokens, 500)))
    c.close()
    c.close()
    assert c.closed and lease.released and r.finished
    for call in (lambda: ns.lookup(keys), lambda: ns.put_prefix(keys, blocks_for(ns, 2)),
                 lambda: ns.block_bytes, lambda: c.stats(), lambda: lease[0],
                 lambda: lease.copy_into(0, bytearray(ns.block_bytes)), lambda: r.commit(),
                 lambda: r.write(0, bytes(ns.block_bytes)), lambda: c.namespace("x", 1, 1, 1, 1)):
        with pytest.raises((ValueError, kvcd.Error)):
            call()
    lease.release()
    r.abort()
    del lease, r, ns, c
    gc.collect()


def test_views_outlive_their_lease_and_client(daemon):
    """Documented behaviour: a view stays valid (its block pinned, the arena mapped) until
    the view and every array made from it are gone, after release() and after close()."""
    c = kvcd.Client(daemon)
    ns = new_ns(c)
    keys = ns.keys_from_tokens(tokens(2 * ns.block_tokens))
    blocks = blocks_for(ns, 2, seed=4)
    ns.put_prefix(keys, blocks)
    with ns.lookup(keys) as lease:
        a = np.frombuffer(lease[0], np.float16)
        mv = lease[1]
    assert lease.released
    with pytest.raises(ValueError):
        lease[0]
    assert np.array_equal(a, blocks[0])
    c.close()
    assert np.array_equal(a, blocks[0])
    assert np.array_equal(np.frombuffer(mv, np.float16), blocks[1])
    del a, mv, lease
    gc.collect()
    # The last view gone, the pins went with the connection: another client sees the blocks.
    with kvcd.Client(daemon) as c2:
        ns2 = c2.namespace(ns.model_id, **LAYOUT)
        r = ns2.reserve(keys)
        assert r.statuses == [kvcd.SLOT_PRESENT] * 2
        r.abort()


# ASan's quarantine keeps freed memory: RSS says nothing there (reference counts still do).
ASAN = bool(os.environ.get("KVC_PY_SANITIZER"))


def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_no_reference_leak_over_10000_lookups(client):
    ns = new_ns(client)
    keys = ns.keys_from_tokens(tokens(4 * ns.block_tokens))
    ns.put_prefix(keys, blocks_for(ns, 4))
    out = np.zeros(ns.block_bytes // 2, np.float16)

    def round_(n):
        for _ in range(n):
            with ns.lookup(keys) as lease:
                v = np.frombuffer(lease[0], np.float16)
                lease.copy_into(1, out)
                del v

    round_(500)
    gc.collect()
    refs = (sys.getrefcount(client), sys.getrefcount(ns), sys.getrefcount(keys),
            sys.getrefcount(keys[0]), sys.getrefcount(out))
    rss = _rss_kib()
    round_(10_000)
    gc.collect()
    assert (sys.getrefcount(client), sys.getrefcount(ns), sys.getrefcount(keys),
            sys.getrefcount(keys[0]), sys.getrefcount(out)) == refs
    assert ASAN or _rss_kib() - rss < 8 * 1024, "RSS grew by more than 8 MiB over 10,000 lookups"


def test_no_reference_leak_over_10000_puts(client):
    ns = new_ns(client)
    blocks = blocks_for(ns, 2)
    outs = [np.zeros_like(b) for b in blocks]

    def round_(n, base):
        for j in range(n):
            keys = ns.keys_from_tokens(tokens(2 * ns.block_tokens, base + 8 * j))
            assert ns.put_prefix(keys, blocks) == 2
            assert ns.get_prefix(keys, outs) == 2
            with ns.reserve(keys) as r:  # present: nothing reserved
                assert r.reserved == 0

    round_(500, 0)
    gc.collect()
    refs = (sys.getrefcount(client), sys.getrefcount(ns), sys.getrefcount(blocks),
            sys.getrefcount(blocks[0]), sys.getrefcount(outs[0]))
    rss = _rss_kib()
    round_(10_000, 1_000_000)
    gc.collect()
    assert (sys.getrefcount(client), sys.getrefcount(ns), sys.getrefcount(blocks),
            sys.getrefcount(blocks[0]), sys.getrefcount(outs[0])) == refs
    assert ASAN or _rss_kib() - rss < 8 * 1024, "RSS grew by more than 8 MiB over 10,000 puts"


def test_two_threads_share_one_client(client):
    ns = new_ns(client)
    errors = []

    def worker(t):
        try:
            for j in range(100):
                keys = ns.keys_from_tokens(tokens(2 * ns.block_tokens, 1_000_000 * t + 100 * j))
                blocks = blocks_for(ns, 2, seed=t * 1000 + j)
                ns.put_prefix(keys, blocks)
                with ns.lookup(keys) as lease:
                    assert len(lease) == 2
                    out = np.zeros_like(blocks[0])
                    for i in range(2):
                        lease.copy_into(i, out)
                        assert np.array_equal(out, blocks[i])
        except Exception as e:  # reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors


def test_close_while_other_thread_copies(daemon):
    """close() from one thread while another is inside calls with the GIL released: the
    other thread's calls either finish or raise ValueError; nothing is freed under it."""
    c = kvcd.Client(daemon)
    ns = new_ns(c)
    keys = ns.keys_from_tokens(tokens(4 * ns.block_tokens))
    ns.put_prefix(keys, blocks_for(ns, 4))
    stop = threading.Event()
    seen = []

    def reader():
        out = bytearray(ns.block_bytes)
        while not stop.is_set():
            try:
                with ns.lookup(keys) as lease:
                    for i in range(len(lease)):
                        lease.copy_into(i, out)
            except ValueError:
                seen.append("closed")
                return

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.2)
    c.close()
    t.join(timeout=30)
    stop.set()
    assert not t.is_alive() and seen == ["closed"]


def test_hint_heads(client):
    """Per-(layer, head) hints through the daemon: a block's H2O mass is the sum of its head
    scores (the heaviest block wins an h2o budget), and every count is checked."""
    ns = new_ns(client)
    lh = LAYOUT["layers"] * LAYOUT["kv_heads"]
    keys = ns.keys_from_tokens(tokens(8 * ns.block_tokens))
    assert ns.put_prefix(keys, blocks_for(ns, 8)) == 8
    scores = np.zeros((8, lh), dtype=np.float32)
    scores[3, 1] = 9.0  # one head looks at block 3 only
    scores[5, :] = 1.0  # every head a little at block 5: sum 4 < 9
    assert ns.hint_heads(keys, scores.ravel().tolist(), LAYOUT["layers"], LAYOUT["kv_heads"]) == 8
    pos, nprefix, lease = ns.lookup_budget(keys, 3, policy="h2o", sinks=1, recent=1)
    with lease:
        assert pos == [0, 3, 7]
    assert ns.hint_heads(keys[:3], [1.0] * (3 * lh), LAYOUT["layers"], LAYOUT["kv_heads"],
                         kind="snapkv") == 3
    # a score past 1e9 (KVC_HINT_SCORE_MAX) is refused whole, as a negative one is
    for bad in (2e9, 3e38, -1.0):
        with pytest.raises(kvcd.Error) as e:
            ns.hint_heads(keys[:1], [bad] + [0.0] * (lh - 1), LAYOUT["layers"],
                          LAYOUT["kv_heads"])
        assert e.value.errno == errno.EINVAL
    # per-head budgets: heads 0, 2 and 3 look at the sink only, head 1 spreads (block 3
    # heaviest): a budget of 3 a head is 12 head-blocks, 1 for each sink-only head, 9 for head 1
    pos, nprefix, lease, prof = ns.lookup_budget(keys, 3, policy="h2o", sinks=1, per_head=True)
    with lease:  # every head spread its hints so far: all full, the plain budget
        assert prof == [kvcd.HEAD_FULL] * lh and len(lease) == 3 and pos == [0, 3, 5]
    sink = np.zeros((8, lh), dtype=np.float32)
    sink[0, :] = 50.0
    sink[:, 1] = 1.0
    sink[3, 1] = 9.0
    assert ns.hint_heads(keys, sink.ravel().tolist(), LAYOUT["layers"], LAYOUT["kv_heads"]) == 8
    pos, nprefix, lease, prof = ns.lookup_budget(keys, 3, policy="h2o", sinks=1, per_head=True)
    with lease:
        assert prof == [kvcd.HEAD_SINK, kvcd.HEAD_FULL, kvcd.HEAD_SINK, kvcd.HEAD_SINK]
        assert nprefix == 8 and pos == list(range(8)) and len(lease) == 8  # 9 > 8 blocks
    pos, nprefix, lease = ns.lookup_budget(keys, 3, policy="h2o", sinks=1)
    with lease:
        assert len(pos) == 3  # the plain budget is unchanged
    # 64 x 64 heads: 16 KiB of scores a block, so 12 blocks go in three requests
    big = new_ns(client, layers=64, kv_heads=64, head_dim=8, block_tokens=1)
    bkeys = big.keys_from_tokens(tokens(12))
    assert big.put_prefix(bkeys, blocks_for(big, 12)) == 12
    assert big.hint_heads(bkeys, [0.5] * (12 * 64 * 64), 64, 64) == 12
    with pytest.raises(ValueError):
        ns.hint_heads(keys, [1.0] * lh, LAYOUT["layers"], LAYOUT["kv_heads"])  # per key
    with pytest.raises(ValueError):
        ns.hint_heads(keys[:1], [], 0, LAYOUT["kv_heads"])
    with pytest.raises(ValueError):
        ns.hint_heads(keys[:1], [1.0] * 8193, 8193, 1)  # past KVC_HINT_HEADS_MAX
    with pytest.raises(kvcd.Error) as e:  # not the namespace's shape
        ns.hint_heads(keys[:1], [1.0] * lh, LAYOUT["kv_heads"] * 2, LAYOUT["layers"] // 2)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(kvcd.Error) as e:
        ns.hint_heads(keys[:1], [-1.0] * lh, LAYOUT["layers"], LAYOUT["kv_heads"])
    assert e.value.errno == errno.EINVAL


def test_hint_heads_keep_retrieval_heads_raw():
    """Per-head hints pick the heads a quantized block keeps bit-exact: the daemon quantizes
    the blocks under pressure and the one head the hints show attending everywhere (a
    retrieval head) comes back bit for bit, the sink-only heads as q8_0 gives them."""
    from quantfill import QUANT_OPTIONS, fill_first, fill_until_quantizing
    shape = (2, 2, 32, 2, 32)  # layers, K/V, tokens, kv heads, dim
    with PrivateDaemon(QUANT_OPTIONS) as d, kvcd.Client(d.socket) as c:
        ns = c.namespace("python-test-per-head", layers=2, kv_heads=2, head_dim=32,
                         block_tokens=32, k_codec="q8_0", v_codec="q8_0")
        fill_first(c, 1 << 20)  # colder than the test's blocks (quantfill.py)
        keys = ns.keys_from_tokens(tokens(6 * 32))
        data = blocks_for(ns, 6, seed=5)
        assert ns.put_prefix(keys, data) == 6
        sc = np.zeros((6, 4), dtype=np.float32)
        sc[0, :] = 5.0  # every head on the sink block...
        sc[:, 1] = 1.0  # ...but (layer 0, head 1), which looks everywhere
        assert ns.hint_heads(keys, sc.ravel().tolist(), 2, 2) == 6
        assert fill_until_quantizing(c, 6, ns.block_bytes) >= 6
        with ns.lookup(keys) as lease:
            assert len(lease) == 6
            for i in range(6):
                assert lease.stored(i) == "q8_0"
                got = np.empty(ns.block_bytes // 2, dtype=np.float16)
                lease.copy_into(i, got)
                got, want = got.reshape(shape).view(np.uint16), data[i].reshape(shape).view(np.uint16)
                assert np.array_equal(got[0, :, :, 1], want[0, :, :, 1])  # the raw head
                for layer, head in ((0, 0), (1, 0), (1, 1)):
                    assert not np.array_equal(got[layer, :, :, head], want[layer, :, :, head])


def test_hint_and_lookup_budget(client):
    ns = new_ns(client)
    keys = ns.keys_from_tokens(tokens(16 * ns.block_tokens))
    assert ns.put_prefix(keys, blocks_for(ns, 16)) == 16
    # H2O mass on blocks 5 and 9: an h2o budget of 4 with one sink and one recent block
    # takes 0, 15 and the heavier of the two.
    scores = [0.0] * 16
    scores[5], scores[9] = 1.0, 8.0
    assert ns.hint(keys, scores) == 16
    pos, nprefix, lease = ns.lookup_budget(keys, 3, policy="h2o", sinks=1, recent=1)
    with lease:
        assert nprefix == 16
        assert pos == [0, 9, 15]
        assert len(lease) == 3
        expect = blocks_for(ns, 16)
        for i, p in enumerate(pos):
            assert bytes(lease[i]) == bytes(expect[p])
    assert ns.hint(keys[:2], [1.0, 2.0], kind="snapkv") == 2
    with pytest.raises(ValueError):
        ns.hint(keys, [1.0])  # one score per key
    with pytest.raises(ValueError):
        ns.hint(keys, scores, kind="nope")
    with pytest.raises(kvcd.Error) as e:
        ns.hint(keys[:1], [-1.0])
    assert e.value.errno == errno.EINVAL
    with pytest.raises(kvcd.Error) as e:
        ns.lookup_budget(keys, 2, policy="no-such-policy")
    assert e.value.errno == errno.EINVAL
    with pytest.raises(kvcd.Error) as e:
        ns.lookup_budget(keys, 2, policy="quest", query=[1.0, 2.0])  # not head_dim floats
    assert e.value.errno == errno.EINVAL
    with pytest.raises(ValueError):
        ns.lookup_budget(keys, 0)


def test_metrics_and_namespaces(client):
    ns = new_ns(client)
    keys = ns.keys_from_tokens(tokens(2 * ns.block_tokens))
    assert ns.put_prefix(keys, blocks_for(ns, 2)) == 2
    text = client.metrics()
    assert "# TYPE kvcd_committed_blocks_total counter" in text
    assert "kvcd_fast_index_blocks" in text
    mine = [d for d in client.namespaces() if d["id"] == ns.id]
    assert len(mine) == 1
    d = mine[0]
    assert d["model_id"] == ns.model_id
    assert d["block_bytes"] == ns.block_bytes and d["block_tokens"] == ns.block_tokens
    assert d["blocks"] >= 2 and d["dtype"] == "fp16" and d["kv_kind"] == "kv"


def test_fast_path_as_the_environment_says():
    """get_prefix of committed host blocks copies through the shared index (fast_hits moves
    by the hits); with KVC_NO_FASTPATH=1 in the environment (client and daemon) the hits
    take a LOOKUP through the socket and fast_hits stays. A daemon of its own: the module's
    fills its index (1,024 entries here) with the other tests' tiny blocks, and blocks left
    out of a full index take the socket."""
    with PrivateDaemon(["host.size=32m"], binary=KVCD_BIN) as d, kvcd.Client(d.socket) as c:
        ns = new_ns(c)
        keys = ns.keys_from_tokens(tokens(5 * ns.block_tokens))
        blocks = blocks_for(ns, 5, seed=11)
        assert ns.put_prefix(keys, blocks) == 5
        c.flush()
        with kvcd.Client(d.socket) as reader:  # its own counters are its reads
            rns = reader.namespace(ns.model_id, **LAYOUT)
            before = reader.stats()
            outs = [np.zeros_like(b) for b in blocks]
            assert rns.get_prefix(keys, outs) == 5
            assert all(np.array_equal(o, b) for o, b in zip(outs, blocks))
            after = reader.stats()  # a request: the daemon takes the client's hit ring first
    assert after["hit_blocks"] - before["hit_blocks"] == 5
    # Either way the daemon counts one lookup: a LOOKUP, or the ring's record of the copies.
    assert after["lookups"] - before["lookups"] == 1
    assert after["fast_index_blocks"] == (0 if fast_path_off() else 5)
    assert after["fast_hits"] - before["fast_hits"] == (0 if fast_path_off() else 5)


def test_negative_indexes_count_from_the_end(client):
    ns = new_ns(client)
    keys = ns.keys_from_tokens(tokens(3 * ns.block_tokens))
    blocks = blocks_for(ns, 3, seed=12)
    ns.put_prefix(keys, blocks)
    with ns.lookup(keys[:1]) as one:
        assert len(one) == 1
        assert bytes(one[-1]) == blocks[0].tobytes()
        for bad in (-2, 1, -(2**62), 2**62):
            with pytest.raises(IndexError):
                one[bad]
        with pytest.raises(IndexError):
            one.copy_into(-2, np.zeros_like(blocks[0]))
        with pytest.raises(IndexError):
            one.stored(-2)
        with pytest.raises(TypeError):
            one["0"]
    with ns.lookup(keys) as lease:
        assert [bytes(lease[i]) for i in (-1, -2, -3)] == [b.tobytes() for b in blocks[::-1]]
        assert [bytes(v) for v in lease] == [b.tobytes() for b in blocks]  # iteration stops
        out = np.zeros_like(blocks[0])
        lease.copy_into(-3, out)
        assert np.array_equal(out, blocks[0])
        with pytest.raises(IndexError):
            lease[-4]
    more = ns.keys_from_tokens(tokens(2 * ns.block_tokens, 900))
    with ns.reserve(more) as r:
        r[-1][:] = blocks[1].tobytes()
        r[0][:] = blocks[0].tobytes()
        assert r.status(-1) == kvcd.SLOT_RESERVED
        with pytest.raises(IndexError):
            r[-3]
        with pytest.raises(IndexError):
            r.status(-3)
    with ns.lookup(more) as lease:
        assert [bytes(v) for v in lease] == [blocks[0].tobytes(), blocks[1].tobytes()]


def test_nul_in_names_is_refused(client):
    for bad in ("a\x00b", "python-nul\x00"):
        with pytest.raises(ValueError):
            client.namespace(bad, **LAYOUT)
    with pytest.raises(ValueError):
        new_ns(client, k_codec="q8_0\x00x")
    assert not [d for d in client.namespaces() if d["model_id"] in ("a", "python-nul")]


def test_lossy_hit_view_is_the_stored_bytes():
    """A hit the daemon quantized in place is viewed as the encoded block it is:
    kvc_lease_stored bytes (not block_bytes over a smaller slot, which would cover the
    slots after it), and the view says so (its .obj's codec and encoded); copy_into still
    gives the decoded block."""
    from quantfill import QUANT_OPTIONS, fill_first, fill_until_quantizing
    with PrivateDaemon(QUANT_OPTIONS, binary=KVCD_BIN) as d, kvcd.Client(d.socket) as c:
        ns = c.namespace("python-lossy-view", 2, 2, 32, 32, k_codec="q8_0", v_codec="q8_0")
        bb = ns.block_bytes  # 16 KiB
        fill_first(c, 1 << 20)  # colder than the test's blocks (quantfill.py)
        keys = ns.keys_from_tokens(tokens(4 * 32))
        blocks = blocks_for(ns, 4, seed=13)
        assert ns.put_prefix(keys, blocks) == 4
        c.flush()
        assert fill_until_quantizing(c, 4, bb) >= 4
        with ns.lookup(keys) as lease:
            assert [lease.stored(i) for i in range(4)] == ["q8_0"] * 4
            for i in range(4):
                mv = lease[i]
                # q8_0: 34 bytes per 32 values (8,704 for 8,192 fp16 values) and a header.
                assert 8704 < mv.nbytes < bb // 1.8, mv.nbytes
                assert mv.readonly and mv.obj.encoded and mv.obj.codec == "q8_0"
                out = np.zeros_like(blocks[i])
                lease.copy_into(i, out)
                err = np.abs(out.astype(np.float32) - blocks[i].astype(np.float32)).max()
                assert 0 < err < 0.05, err  # decoded: q8_0's error, not the encoded bytes
                del mv
        with ns.reserve(ns.keys_from_tokens(tokens(32, 10_000))) as r:
            mv = r[0]
            assert mv.nbytes == bb and not mv.obj.encoded and mv.obj.codec == "raw"
            mv[:] = blocks[0].tobytes()
            del mv
