# DESIGN: the CUDA paths of the kvcd package against the strict fake device
# (tests/lib/fake_dev.c through python/tests/fake_dev_py.c, installed into this process's
# extension) and a real kvcd (host tier: the daemon has no GPU here, so hits are DMA-copied
# from the pinned arena). The fake performs a copy or kernel only when its stream or an event
# after it is waited for, and refuses a kernel that meets host memory: so these tests see
# that CUDA tensors reach libkvc as device pointers (and CPU ones as host pointers), that
# work lands on the stream the caller named (an int or an object with .cuda_stream) and
# behind the event it passed, that no call waits for the device on the host (the fake counts
# every wait) nor allocates per hit, that release() and commit() wait for what was queued,
# and that a layer range moves only its layers. Tensors are kvtensors.FakeCudaTensor: they
# look to kvcd as torch CUDA tensors do.
import os

import pytest

torch = pytest.importorskip("torch")

import kvcd  # noqa: E402
from kvcd.engine.daemon import PrivateDaemon  # noqa: E402
from kvtensors import (FakeDevice, canonical, fakedev_path, make_cache,  # noqa: E402
                       stored_blocks)

if not os.path.exists(fakedev_path()):
    pytest.skip("the fake device library is not built (make build/tests/check_python)",
                allow_module_level=True)

L, H, D, BT = 2, 2, 16, 8
_ids = iter(range(10**6))


class Stream:
    """A stream object as torch's: .cuda_stream is the raw handle."""

    def __init__(self, handle):
        self.cuda_stream = handle


@pytest.fixture(scope="module")
def daemon():
    with PrivateDaemon(["host.size=32m"]) as d:
        yield d


@pytest.fixture
def dev():
    d = FakeDevice()
    d.install()
    yield d
    d.uninstall()


@pytest.fixture
def direct_dma(monkeypatch):
    """libkvc's least DMA piece at 4 KiB (KVC_GPU_DMA_MIN, read at the attach; 1 MiB by
    default): these small shapes' page pieces then go straight into and out of the pages."""
    monkeypatch.setenv("KVC_GPU_DMA_MIN", "4096")


@pytest.fixture
def client(daemon, dev):
    with kvcd.Client(daemon.socket) as c:
        yield c


def ns_of(client):
    return client.namespace("fake-%d" % next(_ids), L, H, D, BT)


def filled(ns, keys, seed=0):
    """Puts random blocks under keys from host memory; returns them."""
    g = torch.Generator().manual_seed(seed)
    blocks = [torch.randn(ns.block_bytes // 2, generator=g).half() for _ in keys]
    assert ns.put_prefix(keys, blocks) == len(keys)
    return blocks


def test_copy_into_a_device_tensor_is_queued_on_the_stream(client, dev):
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(3 * BT))
    blocks = filled(ns, keys)
    s = dev.stream()
    dst = [dev.empty((ns.block_bytes // 2,)) for _ in keys]
    for t in dst:
        t.alias.zero_()
    with ns.lookup(keys) as lease:
        lease.copy_into(0, dst[0])  # the legacy default stream: no stream given, not torch's
        before = dev.stats()
        lease.copy_into(1, dst[1], stream=s)
        lease.copy_into(2, dst[2], stream=Stream(s))
        after = dev.stats()
        assert after["waits"] == before["waits"]  # no host wait inside a call
        assert after["allocs"] == before["allocs"]  # nor an allocation per hit
        assert after["queued"] > 0 and after["copies"] - before["copies"] == 2
        assert not dst[1].alias.any()  # the strict fake has not performed it yet
        assert dev.sync(s) == 0
        assert torch.equal(dst[1].alias, blocks[1]) and torch.equal(dst[2].alias, blocks[2])
    # release() waited for every copy of the lease, the legacy stream's one included
    assert torch.equal(dst[0].alias, blocks[0])
    assert dev.stat("device_syncs") == 0
    assert dev.stat("bad_kinds") == 0 and dev.stat("bad_packs") == 0


def test_whole_prefix_calls_with_device_tensors(client, dev):
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(4 * BT))
    g = torch.Generator().manual_seed(3)
    src = [dev.empty((ns.block_bytes // 2,)) for _ in keys]
    for t in src:
        t.alias.copy_(torch.randn(ns.block_bytes // 2, generator=g).half())
    s = dev.stream()
    # put: each block DMA-copied from the device into its slot; commit waits for them.
    assert ns.put_prefix(keys[:2], src[:2], stream=s) == 2
    mixed = [src[2], src[3].alias.clone()]  # a device tensor and a CPU one in one call
    assert ns.put_prefix(keys[2:], mixed, parent=keys[1], stream=s) == 2
    with ns.lookup(keys) as lease:
        got = stored_blocks(lease, 4)
    assert all(torch.equal(got[i], src[i].alias) for i in range(4))
    dst = [dev.empty((ns.block_bytes // 2,)) for _ in keys]
    assert ns.get_prefix(keys, dst, stream=s) == 4  # its release waited for its copies
    assert all(torch.equal(dst[i].alias, src[i].alias) for i in range(4))
    assert dev.stat("device_syncs") == 0


def test_scatter_and_gather_on_the_device(client, dev):
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(3 * BT))
    kc, vc, kv_dim, kv, vv = make_cache("flash_attn", L, 6, 4, H, D, seed=2, alloc=dev.empty)
    table = [4, 1, 5, 0, 2, 3]
    s, ev = dev.stream(), dev.event()
    with ns.reserve(keys) as r:
        before = dev.stats()
        assert r.gather(kc, vc, table, stream=s, event=ev, kv_dim=kv_dim) == 3
        after = dev.stats()
        assert after["waits"] == before["waits"] and after["packs"] > before["packs"]
    # commit() waited for the gather and the copies out of the device scratch
    want = canonical(kv, vv, table, 0, 3, BT)
    with ns.lookup(keys) as lease:
        assert torch.equal(stored_blocks(lease, 3).view(want.shape), want)
        dkc, dvc, _, dk, dv = make_cache("flash_attn", L, 6, 4, H, D, seed=9, alloc=dev.empty)
        old = [t.clone() for t in dk + dv]
        table2 = [3, 5, 0, 4, 1, 2]
        dev.set("hold", 1)  # the device is busy: the event is not reached yet
        before = dev.stats()
        assert lease.scatter(dkc, dvc, table2, stream=Stream(s), event=ev, kv_dim=kv_dim) == 3
        after = dev.stats()
        assert after["waits"] == before["waits"]  # the caller's stream waits, not the host
        assert after["allocs"] == before["allocs"] and after["device_syncs"] == 0
        assert dev.lib.fdp_event_query(ev) != 0  # queued behind the event
        assert all(torch.equal(a, b) for a, b in zip(dk + dv, old))  # nothing landed yet
        dev.set("hold", 0)
        assert dev.lib.fdp_event_wait(ev) == 0
        assert torch.equal(canonical(dk, dv, table2, 0, 3, BT), want)
    assert dev.stat("bad_packs") == 0 and dev.stat("bad_kinds") == 0


def test_pointer_kinds_follow_the_tensors_device(client, dev):
    """A tensor that says cuda is handed to libkvc as device memory: one whose memory is not
    the device's makes the fake's kernel fault (as a real kernel reading host memory would),
    and the fault surfaces, never a silent host copy; CPU tensors take the host path (no
    device work)."""
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(2 * BT))
    filled(ns, keys)
    kc, vc, _, kv, vv = make_cache("vllm", L, 4, BT, H, D, seed=1)  # CPU tensors
    from kvtensors import FakeCudaTensor
    liars = [FakeCudaTensor(t) for t in kc], [FakeCudaTensor(t) for t in vc]
    s = dev.stream()
    with ns.lookup(keys) as lease:
        before = dev.stats()
        assert lease.scatter(kc, vc, [0, 1]) == 2  # host tensors: a CPU copy
        assert dev.stats()["packs"] == before["packs"] and dev.stats()["copies"] == before["copies"]
        assert lease.scatter(liars[0], liars[1], [2, 3], stream=s) == 2
        assert dev.stat("packs") == before["packs"] + 1
        assert dev.sync(s) != 0 and dev.stat("bad_packs") == 1
    with pytest.raises((ValueError, kvcd.Error)):  # host and device tensors in one cache
        with ns.lookup(keys) as lease:
            lease.scatter(kc[:1] + liars[0][1:], vc, [0, 1], stream=s)


def test_layer_ranges_land_only_their_layers(client, dev):
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(2 * BT))
    kc, vc, _, kv, vv = make_cache("vllm", L, 4, BT, H, D, seed=4, alloc=dev.empty)
    s = dev.stream()
    with ns.reserve(keys) as r:
        for layer in range(L):
            r.gather(kc, vc, [0, 1], layers=range(layer, layer + 1), stream=s)
    want = canonical(kv, vv, [0, 1], 0, 2, BT)
    with ns.lookup(keys) as lease:
        assert torch.equal(stored_blocks(lease, 2).view(want.shape), want)
        dkc, dvc, _, dk, dv = make_cache("vllm", L, 4, BT, H, D, seed=8, alloc=dev.empty)
        old = [t.clone() for t in dk + dv]
        evs = []
        for layer in reversed(range(L)):
            ev = dev.event()
            before = dev.stat("waits")
            lease.scatter(dkc, dvc, [2, 3], layers=layer, stream=s, event=ev)
            assert dev.stat("waits") == before
            evs.append((layer, ev))
        layer, ev = evs[0]  # the last layer first: only it has landed after its event
        assert dev.lib.fdp_event_wait(ev) == 0
        for i, (t, o) in enumerate(zip(dk + dv, old)):
            assert torch.equal(t, o) != (i % L == layer)
        dev.sync(s)
    assert torch.equal(canonical(dk, dv, [2, 3], 0, 2, BT), want)


def test_device_operations_per_call_are_bounded(client, dev):
    """Whatever the number of blocks, a get_prefix into rows of one device tensor and a
    scatter queue the same few device operations (libkvc's batched copies and kernels)."""
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(8 * BT))
    blocks = filled(ns, keys, seed=5)
    s = dev.stream()
    ops = {}
    for n in (2, 8):
        rows = dev.empty((n, ns.block_bytes // 2))
        before = dev.stat("ops")
        assert ns.get_prefix(keys[:n], [rows[i] for i in range(n)], stream=s) == n
        ops["get", n] = dev.stat("ops") - before
        assert all(torch.equal(rows.alias[i], blocks[i]) for i in range(n))
        kc, vc, _, kv, vv = make_cache("vllm", L, 8, BT, H, D, seed=6, alloc=dev.empty)
        with ns.lookup(keys[:n]) as lease:
            before = dev.stat("ops")
            assert lease.scatter(kc, vc, list(range(n)), stream=s) == n
            ops["scatter", n] = dev.stat("ops") - before
        got = canonical(kv, vv, list(range(n)), 0, n, BT)
        assert torch.equal(got.view(n, -1), torch.stack(blocks[:n]))
    assert ops["get", 2] == ops["get", 8] and ops["scatter", 2] == ops["scatter", 8], ops


def test_long_dma_batches_are_queued_in_growing_calls(direct_dma, client, dev):
    """A load or put of many host blocks straight into or out of packed pages (one DMA range
    per block, layer and kind: 64 per block here) is queued in calls of 512 ranges, then 1,024
    each, so that the copy engines start on the first ranges while the driver takes the next
    (issue 26: one call of every range held the whole submission before the first byte
    moved); up to 512 ranges stay one call. Every byte lands, nothing waits in a call."""
    layers, heads, dim, bt = 32, 2, 64, 16  # a section: 4 KiB, direct at KVC_GPU_DMA_MIN=4096
    ns = client.namespace("fake-dma-%d" % next(_ids), layers, heads, dim, bt)
    pages = 32
    keys = ns.keys_from_tokens(range(pages * bt))
    table = torch.randperm(pages, generator=torch.Generator().manual_seed(4)).tolist()
    kc, vc, _, kv, vv = make_cache("vllm", layers, pages, bt, heads, dim, seed=8,
                                   alloc=dev.empty)
    s = dev.stream()
    calls = {}
    for first, n in ((0, 4), (4, 28)):  # 256 ranges; 1,792 ranges
        with ns.reserve(keys[first:first + n], parent=keys[first - 1] if first else None) as r:
            before = dev.stats()
            b0 = dev.stat("copy_batches")
            assert r.gather(kc, vc, table, first_token=first * bt, stream=s) == n
            calls["gather", n] = dev.stat("copy_batches") - b0
            assert dev.stats()["waits"] == before["waits"]
    want = canonical(kv, vv, table, 0, pages, bt)
    dkc, dvc, _, dk, dv = make_cache("vllm", layers, pages, bt, heads, dim, seed=9,
                                     alloc=dev.empty)
    with ns.lookup(keys) as lease:
        assert torch.equal(stored_blocks(lease, pages).view(want.shape), want)
        for first, n in ((0, 4), (4, 28)):
            before = dev.stats()
            b0 = dev.stat("copy_batches")
            assert lease.scatter(dkc, dvc, table, first=first, n=n, first_token=first * bt,
                                 stream=s) == n
            calls["scatter", n] = dev.stat("copy_batches") - b0
            assert dev.stats()["waits"] == before["waits"]
            assert dev.stats()["packs"] == before["packs"]  # straight into the pages
    assert torch.equal(canonical(dk, dv, table, 0, pages, bt), want)
    # 256 ranges: one call; 1,792: 512 + 1,024 + the last 256
    assert calls == {("gather", 4): 1, ("gather", 28): 3, ("scatter", 4): 1,
                     ("scatter", 28): 3}, calls
    assert dev.stat("bad_kinds") == 0


def test_arena_mapped_after_the_attach_is_registered(daemon, dev):
    """A client that attached to the device before it opened a namespace maps that arena
    afterwards: it is registered for DMA then, as the attach registers the arenas mapped
    before it (else its hits crossed from pageable memory: the driver stages them, and the C
    path of bench_python's load_cpu rows, which attaches first, took 247 us a block of the
    calling thread instead of 2.8), and unregistered when the client closes."""
    before = dev.stat("registered")
    with kvcd.Client(daemon.socket) as c:
        assert c.gpu_attach() == 0  # the fake device, no pool: host copies
        assert dev.stat("registered") == before  # nothing mapped yet
        ns = c.namespace("fake-late-%d" % next(_ids), L, H, D, BT)
        assert dev.stat("registered") > before
        keys = ns.keys_from_tokens(range(2 * BT))
        blocks = filled(ns, keys, seed=11)
        kc, vc, _, kv, vv = make_cache("vllm", L, 2, BT, H, D, seed=12, alloc=dev.empty)
        with ns.lookup(keys) as lease:
            assert lease.scatter(kc, vc, [1, 0], stream=dev.stream()) == 2
        got = canonical(kv, vv, [1, 0], 0, 2, BT)
        assert torch.equal(got.view(2, -1), torch.stack(blocks))
    assert dev.stat("registered") == before
