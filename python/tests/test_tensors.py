# DESIGN: torch tensors (CPU) through every call of the kvcd package against a real kvcd:
# get_prefix/put_prefix, copy_into/write, and the paged calls (Lease.scatter,
# Reservation.gather) over the engines' published layouts — vLLM's per-layer K and V
# [pages, page_tokens, heads, dim], the flash-attn [2, pages, ...] and FlashInfer
# [pages, 2, ...] combined tensors, heads-before-tokens strides (HND), SGLang's token-major
# pool viewed in pages, MLA's latent cache (K only, 3-D) and NumPy arrays — with engine pages
# smaller, equal to and larger than kvcd's blocks. What kvcd stores is compared element by
# element with the canonical blocks computed from the engine's tensors in torch
# (kvtensors.canonical), and what a scatter writes with the source, pages it must not touch
# included. Bad shapes, dtypes and block tables are refused before anything is written.
import errno

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kvcd  # noqa: E402
from kvcd.engine.daemon import PrivateDaemon  # noqa: E402
from kvtensors import LAYOUTS, canonical, make_cache, stored_blocks  # noqa: E402

L, H, D, BT = 3, 2, 16, 8  # 3 layers, 2 KV heads of 16, 8-token blocks: 3 KiB fp16 blocks
_ids = iter(range(10**6))


@pytest.fixture(scope="module")
def daemon():
    with PrivateDaemon(["host.size=64m"]) as d:
        yield d


@pytest.fixture
def client(daemon):
    with kvcd.Client(daemon.socket) as c:
        yield c


def ns_of(client, k_only=False, heads=H, dim=D):
    return client.namespace("tensors-%d" % next(_ids), L, 1 if k_only else heads, dim, BT,
                            k_only=k_only)


def test_prefix_copy_and_write_take_torch_tensors(client):
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(6 * BT))
    bb = ns.block_bytes
    src = [torch.randn(bb // 2).half() for _ in range(6)]
    assert ns.put_prefix(keys[:3], src[:3]) == 3
    with ns.reserve(keys[3:], parent=keys[2]) as r:
        for i in range(3):
            r.write(i, src[3 + i].view(torch.uint8))  # any dtype: bytes
    dst = [torch.zeros(bb // 2, dtype=torch.float16) for _ in range(6)]
    assert ns.get_prefix(keys, dst) == 6
    assert all(torch.equal(a, b) for a, b in zip(dst, src))
    with ns.lookup(keys) as lease:
        out = torch.zeros(bb // 2, dtype=torch.float16)
        lease.copy_into(4, out)
        assert torch.equal(out, src[4])
        assert lease.ready() == 6 and lease.tier(0) == "host"
        with pytest.raises(ValueError):
            lease.copy_into(0, torch.zeros(bb, dtype=torch.float16)[::2])  # not contiguous
        with pytest.raises(ValueError):
            lease.copy_into(0, torch.zeros(bb // 4, dtype=torch.float16))  # too small
    with pytest.raises(TypeError):
        ns.get_prefix(keys[:1], [object()])


def test_lookup_nowait_ready_and_wait(client):
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(4 * BT))
    ns.put_prefix(keys, [torch.zeros(ns.block_bytes, dtype=torch.uint8)] * 4)
    with ns.lookup(keys, nowait=True) as lease:  # host blocks: all in memory
        assert len(lease) == 4 and lease.ready() == 4 and lease.wait(100) == 4
    with ns.lookup(keys, ready_only=True) as lease:
        assert len(lease) == 4


def store_and_reload(ns, layout, page_tokens, first_block, nblocks, pages=12, seed=1):
    """Gathers blocks [first_block, first_block + nblocks) of a sequence from one engine cache
    into kvcd, checks what was stored, scatters them into another cache and checks it."""
    src = make_cache(layout, L, pages, page_tokens, H, D, seed=seed)
    kc, vc, kv_dim, kviews, vviews = src
    ntok = (first_block + nblocks) * BT
    need = -(-ntok // page_tokens)
    g = torch.Generator().manual_seed(seed + 7)
    table = torch.randperm(pages, generator=g)[:need].tolist()
    keys = ns.keys_from_tokens(range(ntok))
    first_token = first_block * BT
    with ns.reserve(keys) as r:  # in two gathers: the second from token first_token on
        assert r.reserved == first_block + nblocks
        assert r.gather(kc, vc, table, n=first_block, kv_dim=kv_dim) == first_block
        assert r.gather(kc, vc, table, first=first_block, first_token=first_token,
                        kv_dim=kv_dim) == nblocks
    want = canonical(kviews, vviews, table, first_token, nblocks, BT)
    with ns.lookup(keys) as lease:
        assert len(lease) == first_block + nblocks
        got = stored_blocks(lease, len(lease))[first_block:]
        assert torch.equal(got.view(want.shape), want)
        # Into another cache of the same layout, other pages: only those pages change.
        dst = make_cache(layout, L, pages, page_tokens, H, D, seed=seed + 100)
        dkc, dvc, _, dk, dv = dst
        before = [t.clone() for t in dk + (dv or [])]
        table2 = torch.randperm(pages, generator=torch.Generator().manual_seed(seed + 9))
        table2 = table2[:need].tolist()
        assert lease.scatter(dkc, dvc, table2, first=first_block, n=nblocks,
                             first_token=first_token, kv_dim=kv_dim) == nblocks
    assert torch.equal(canonical(dk, dv, table2, first_token, nblocks, BT), want)
    # Tokens outside the loaded run are as they were.
    written = set()
    for p in range(first_token, ntok):
        written.add((table2[p // page_tokens], p % page_tokens))
    for t, b in zip(dk + (dv or []), before):
        for pg in range(pages):
            for off in range(page_tokens):
                if (pg, off) not in written:
                    assert torch.equal(t[pg, off], b[pg, off]), (pg, off)


# libkvc's kern_pack_check (kernels/kern_pack.c) asks token_stride >= (heads - 1) *
# head_stride + a row, which only token-major pages meet: heads-before-tokens strides (HND,
# FlashInfer's and NIXL's layout) are refused with EINVAL though their rows do not overlap.
HND_REFUSED = pytest.mark.xfail(raises=kvcd.Error, strict=True,
                                reason="libkvc refuses HND strides (kern_pack_check)")


@pytest.mark.parametrize("layout", [pytest.param(x, marks=HND_REFUSED) if x == "hnd" else x
                                    for x in LAYOUTS])
@pytest.mark.parametrize("page_tokens", [4, 8, 16])
def test_gather_then_scatter_in_engine_layouts(client, layout, page_tokens):
    ns = ns_of(client)
    store_and_reload(ns, layout, page_tokens, first_block=1, nblocks=3)


def test_mla_latent_cache(client):
    ns = ns_of(client, k_only=True, dim=24)
    kc, vc, _, kviews, _ = make_cache("vllm", L, 8, BT, 1, 24, k_only=True, seed=3)
    assert vc is None
    table = [5, 2, 7]
    keys = ns.keys_from_tokens(range(3 * BT))
    with ns.reserve(keys) as r:
        assert r.gather(kc, None, table) == 3
    want = canonical(kviews, None, table, 0, 3, BT)
    with ns.lookup(keys) as lease:
        assert torch.equal(stored_blocks(lease, 3).view(want.shape), want)
        dst = [torch.zeros(8, BT, 24, dtype=torch.float16) for _ in range(L)]
        assert lease.scatter(dst, None, [1, 0, 3]) == 3
    got = canonical([t.view(8, BT, 1, 24) for t in dst], None, [1, 0, 3], 0, 3, BT)
    assert torch.equal(got, want)
    with pytest.raises(ValueError):
        with ns.lookup(keys) as lease:
            lease.scatter(dst, dst, [1, 0, 3])  # no V in an MLA namespace


def test_numpy_paged_arrays(client):
    ns = ns_of(client)
    rng = np.random.default_rng(4)
    k = [rng.standard_normal((6, 4, H, D)).astype(np.float16) for _ in range(L)]
    v = [rng.standard_normal((6, 4, H, D)).astype(np.float16) for _ in range(L)]
    keys = ns.keys_from_tokens(range(2 * BT))
    table = [3, 0, 5, 1]
    with ns.reserve(keys) as r:
        assert r.gather(k, v, table) == 2
    want = canonical([torch.from_numpy(a) for a in k], [torch.from_numpy(a) for a in v], table,
                     0, 2, BT)
    with ns.lookup(keys) as lease:
        assert torch.equal(stored_blocks(lease, 2).view(want.shape), want)
        k2 = [np.zeros_like(a) for a in k]
        v2 = [np.zeros_like(a) for a in v]
        assert lease.scatter(k2, v2, table) == 2
    assert all(np.array_equal(a[table], b[table]) for a, b in zip(k + v, k2 + v2))
    assert not any(b[[2, 4]].any() for b in k2 + v2)  # pages out of the table untouched
    with ns.lookup(keys) as lease:
        ro = [a.copy() for a in k]
        for a in ro:
            a.flags.writeable = False
        with pytest.raises((BufferError, ValueError)):
            lease.scatter(ro, v2, table)  # a scatter writes


def test_bad_paged_arguments_are_refused(client):
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(2 * BT))
    kc, vc, _, kviews, vviews = make_cache("vllm", L, 4, BT, H, D, seed=5)
    with ns.reserve(keys) as r:
        r.gather(kc, vc, [0, 1])
    with ns.lookup(keys) as lease:
        k0 = [t.clone() for t in kc]
        for bad, exc in (
                (dict(block_table=[0]), ValueError),  # too short for 2 blocks
                (dict(block_table=[0, 4]), ValueError),  # page 4 of 4
                (dict(block_table=[-1, 1]), ValueError),
                (dict(k=kc[:2]), ValueError),  # a layer missing
                (dict(k=[t.float() for t in kc], v=[t.float() for t in vc]), TypeError),
                (dict(k=[t[:, :, :1] for t in kc], v=[t[:, :, :1] for t in vc]), ValueError),
                (dict(k=[t.transpose(2, 3) for t in kc]), ValueError),  # dim not contiguous
                (dict(k=kc, v=None), ValueError),  # separate K and V tensors: v needed
                (dict(n=3), IndexError),
                (dict(layers=range(0, 3, 2)), ValueError),
                (dict(layers=range(2, 5)), ValueError),
                (dict(stream="s"), TypeError)):
            args = dict(k=kc, v=vc, block_table=[2, 3])
            args.update(bad)
            kw = {x: args.pop(x) for x in ("n", "layers", "stream") if x in args}
            with pytest.raises(exc):
                lease.scatter(args["k"], args["v"], args["block_table"], **kw)
        assert all(torch.equal(a, b) for a, b in zip(kc, k0))  # nothing was written
        with pytest.raises(ValueError):  # a first_token past the table's pages
            lease.scatter(kc, vc, [0, 1, 2, 3], first_token=BT * 3)



def test_block_table_is_read_up_to_the_last_page_touched(client):
    """An engine passes its whole table to load a prefix of it: only the entries up to the
    last page a call touches are read (a list or tuple of ints in place, without converting
    the rest), so what lies past them is never looked at; entries the call reads are checked
    as before, whatever the table's type."""
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(2 * BT))
    kc, vc, _, kviews, vviews = make_cache("vllm", L, 4, BT, H, D, seed=21)
    junk = [None, 2**70, -1, 4, "page"]  # past the pages read: never converted
    with ns.reserve(keys) as r:
        assert r.gather(kc, vc, [3, 1] + junk) == 2
    want = canonical(kviews, vviews, [3, 1], 0, 2, BT)

    class Page(int):  # not an exact int: converted the general way
        pass

    tables = ([0, 2] + junk, tuple([0, 2] + junk), [Page(0), Page(2)] + junk,
              np.array([0, 2, -1, 7], dtype=np.int64), torch.tensor([0, 2, -1, 7]),
              range(0, 4, 2))
    with ns.lookup(keys) as lease:
        assert torch.equal(stored_blocks(lease, 2).view(want.shape), want)
        for table in tables:
            dk = [torch.zeros_like(t) for t in kc]
            dv = [torch.zeros_like(t) for t in vc]
            assert lease.scatter(dk, dv, table) == 2
            assert torch.equal(canonical(dk, dv, [0, 2], 0, 2, BT), want)
            assert not any(t[[1, 3]].any() for t in dk + dv)
        # one block from token BT: entries 0 and 1 read, entry 0 not checked (not touched)
        dk = [torch.zeros_like(t) for t in kc]
        dv = [torch.zeros_like(t) for t in vc]
        assert lease.scatter(dk, dv, [-5, 3, None], first=1, n=1, first_token=BT) == 1
        assert all(torch.equal(a[3], b[1]) for a, b in zip(dk + dv, kc + vc))
        assert not any(t[:3].any() for t in dk + dv)
        for bad, exc in (([0, 2**70], OverflowError), ([0, None], TypeError),
                         ([0, 4], ValueError), ((0, -1), ValueError), ([0], ValueError),
                         ([Page(0), 2**40], ValueError)):
            with pytest.raises(exc):
                lease.scatter(dk, dv, bad)


def test_layer_ranges(client):
    """A layer range moves only its layers; a reservation filled layer by layer publishes
    once every layer was written."""
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(2 * BT))
    kc, vc, _, kviews, vviews = make_cache("vllm", L, 4, BT, H, D, seed=6)
    with ns.reserve(keys) as r:
        assert r.gather(kc, vc, [0, 1], layers=range(0, 1)) == 2
        with pytest.raises(kvcd.Error) as e:  # not every layer written: nothing published
            r.commit()
        assert e.value.errno == errno.EBUSY and not r.finished
        for layer in range(1, L):
            assert r.gather(kc, vc, [0, 1], layers=range(layer, layer + 1)) == 2
    want = canonical(kviews, vviews, [0, 1], 0, 2, BT)
    with ns.lookup(keys) as lease:
        assert torch.equal(stored_blocks(lease, 2).view(want.shape), want)
        dk = [torch.zeros_like(t) for t in kc]
        dv = [torch.zeros_like(t) for t in vc]
        assert lease.scatter(dk, dv, [2, 3], layers=1) == 2
    for layer in range(L):
        moved = torch.equal(dk[layer][2:4], kc[layer][0:2])
        assert moved == (layer == 1) and (layer == 1 or not dk[layer].any())


def test_paged_kv_read_once(client):
    """Namespace.paged_kv reads a cache's tensors once; scatter and gather take it as
    k_caches and move the same bytes as with the tensors themselves."""
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(3 * BT))
    kc, vc, kv_dim, kviews, vviews = make_cache("flash_attn", L, 6, 4, H, D, seed=11)
    paged = ns.paged_kv(kc, vc, kv_dim=kv_dim)
    assert isinstance(paged, kvcd.PagedKV) and paged.pages == 6 and paged.page_tokens == 4
    assert not paged.on_device
    table = [5, 3, 1, 0, 2, 4]
    with ns.reserve(keys) as r:
        assert r.gather(paged, None, table) == 3
    want = canonical(kviews, vviews, table, 0, 3, BT)
    with ns.lookup(keys) as lease:
        assert torch.equal(stored_blocks(lease, 3).view(want.shape), want)
        dkc, dvc, _, dk, dv = make_cache("flash_attn", L, 6, 4, H, D, seed=12)
        dpaged = ns.paged_kv(dkc, dvc, kv_dim=kv_dim)
        del dkc  # the PagedKV holds its tensors
        assert lease.scatter(dpaged, None, [1, 0, 4, 5, 3, 2], layers=range(1, L)) == 3
        assert lease.scatter(dpaged, None, [1, 0, 4, 5, 3, 2], layers=0) == 3
        other = client.namespace("tensors-other-%d" % next(_ids), L, H, D, BT * 2)
        with pytest.raises(ValueError):  # made for another layout
            lease.scatter(other.paged_kv(kc, vc, kv_dim=kv_dim), None, table)
        with pytest.raises(ValueError):
            lease.scatter(paged, kc, table)  # v_caches with a PagedKV
        with pytest.raises(ValueError):  # pages are checked per call all the same
            lease.scatter(paged, None, [6, 0, 1, 2, 3, 4])
    assert torch.equal(canonical(dk, dv, [1, 0, 4, 5, 3, 2], 0, 3, BT), want)
