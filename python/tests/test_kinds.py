# DESIGN: the kinds of layers of hybrid models through the Python package, against a real
# kvcd: Client.namespace_kind() for kv_window (sliding-window layers) and state (Mamba /
# linear-attention state) namespaces, Lease.first, Namespace.kind and window_tokens,
# Client.namespaces()' kv_kind, and the refusals (an unknown kind, a window without its
# size). The daemon's side of the kinds is tests/e2e/check_e2e_kinds.c.
import pytest

import kvcd
from kvcd.engine.daemon import PrivateDaemon


@pytest.fixture(scope="module")
def client():
    with PrivateDaemon(["host.size=32m"]) as d:
        with kvcd.Client(d.socket) as c:
            yield c


def keys(n, salt):
    return [bytes([salt]) * 8 + i.to_bytes(8, "little") for i in range(1, n + 1)]


def test_window_namespace_answers_with_the_window(client):
    w = client.namespace_kind("py/swa", 2, 2, 16, 4, "fp16", kind="kv_window", window_tokens=10)
    assert (w.kind, w.window_tokens, w.block_bytes) == ("kv_window", 10, 2 * 2 * 4 * 2 * 16 * 2)
    k = keys(8, 1)
    blocks = [bytes([i]) * w.block_bytes for i in range(8)]
    assert w.put_prefix(k, blocks) == 8
    client.flush()
    with w.lookup(k) as lease:  # 10 tokens of 4-token blocks: the last 3 blocks
        assert (lease.first, len(lease)) == (5, 3)
        assert [bytes(lease[i])[:1] for i in range(3)] == [b"\x05", b"\x06", b"\x07"]
    with w.lookup(k[:2]) as lease:
        assert (lease.first, len(lease)) == (0, 2)


def test_state_namespace_answers_with_the_state_of_the_longest_prefix(client):
    s = client.namespace_kind("py/mamba", 3, 4, 8, 16, "fp32", kind="state")
    assert (s.kind, s.window_tokens, s.block_bytes) == ("state", 0, 3 * 4 * 8 * 4)
    k = keys(9, 2)
    s.put_prefix([k[2]], [b"\x02" * s.block_bytes])
    s.put_prefix([k[6]], [b"\x06" * s.block_bytes])
    client.flush()
    for n, want in ((9, 6), (7, 6), (6, 2), (3, 2), (2, None)):
        with s.lookup(k[:n]) as lease:
            if want is None:
                assert len(lease) == 0
            else:
                assert (lease.first, len(lease)) == (want, 1)
                assert bytes(lease[0]) == bytes([want]) * s.block_bytes
    kinds = {n["model_id"]: n["kv_kind"] for n in client.namespaces()}
    assert kinds["py/mamba"] == "state" and kinds["py/swa"] == "kv_window"


def test_refusals(client):
    with pytest.raises(ValueError, match="kind"):
        client.namespace_kind("py/bad", 1, 1, 8, 4, kind="mamba")
    with pytest.raises(ValueError, match="window_tokens"):
        client.namespace_kind("py/bad", 1, 1, 8, 4, kind="kv_window")
    with pytest.raises(ValueError, match="window_tokens"):
        client.namespace_kind("py/bad", 1, 1, 8, 4, kind="state", window_tokens=8)
    client.namespace_kind("py/taken", 1, 1, 8, 4, kind="state")
    with pytest.raises(kvcd.Error) as e:
        client.namespace_kind("py/taken", 1, 1, 8, 4, kind="kv")
    assert e.value.errno == 17  # EEXIST: the kind is part of the layout


def test_hybrid_lookup_finds_the_prefix_every_kind_can_give(client):
    """kvcd.hybrid_lookup over a full-attention, a sliding-window (3 blocks) and a state
    namespace under the same keys: the KV run is 10, the window of prefix 10 lacks block 6
    (prefix 6 has its window), the states are at the ends of prefixes 4 and 8: the usable
    prefix is 4, each lease pins exactly what prefix 4 needs of its kind."""
    kv = client.namespace_kind("py/hy-full", 2, 2, 16, 4, "fp16")
    w = client.namespace_kind("py/hy-swa", 2, 2, 16, 4, "fp16", kind="kv_window",
                              window_tokens=10)
    s = client.namespace_kind("py/hy-state", 2, 2, 16, 4, "fp16", kind="state")
    k = keys(12, 7)
    assert kv.put_prefix(k[:10], [bytes([i]) * kv.block_bytes for i in range(10)]) == 10
    for i in range(10):
        if i != 6:
            w.put_prefix([k[i]], [bytes([0x40 + i]) * w.block_bytes])
    for i in (3, 7):
        s.put_prefix([k[i]], [bytes([0x80 + i]) * s.block_bytes])
    client.flush()
    with kvcd.hybrid_lookup([kv, w, s], k) as hit:
        assert hit.length == 4
        lk, lw, ls = hit.leases
        assert (lk.first, len(lk)) == (0, 4)
        assert (lw.first, len(lw)) == (1, 3)
        assert [bytes(lw[i])[:1] for i in range(3)] == [b"\x41", b"\x42", b"\x43"]
        assert (ls.first, len(ls)) == (3, 1) and bytes(ls[0])[:1] == b"\x83"
    # Block 6 of the window stored: prefix 8 has everything.
    w.put_prefix([k[6]], [b"\x46" * w.block_bytes])
    client.flush()
    with kvcd.hybrid_lookup([s, w, kv], k, ready_only=True) as hit:
        assert hit.length == 8
        assert [(x.first, len(x)) for x in hit.leases] == [(7, 1), (5, 3), (0, 8)]
    assert kvcd.hybrid_lookup([kv, w, s], k, limit=7).length == 4
    # No state at all below the limit: nothing usable, no lease held.
    hit = kvcd.hybrid_lookup([kv, w, s], k, limit=3)
    assert (hit.length, hit.leases) == (0, [])
    with pytest.raises(ValueError):
        kvcd.hybrid_lookup([], k)
