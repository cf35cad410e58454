# DESIGN: the CUDA paths of the kvcd package on a real device (skipped where torch sees none;
# etc/device-check.sh runs them on a GPU host). The fake device (test_cuda_fake.py) checks
# the call structure — streams, events, no host waits, bounded operations; these check that
# the bytes land where they must on a real GPU: torch CUDA tensors through get/put_prefix,
# copy_into and write; gathers from and scatters into engines' paged CUDA caches (vLLM,
# flash-attn, FlashInfer, SGLang, MLA) compared element by element with the canonical blocks
# computed independently; layer ranges moving only their layers; work on a side stream
# ordered by an event; blocks in the daemon's own GPU pool moved device to device; and the
# prefill benchmark's decoder (kvcd.engine.prefill) storing and loading its KV through both.
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (etc/device-check.sh runs these on a GPU host)",
                allow_module_level=True)

import errno  # noqa: E402

import kvcd  # noqa: E402
from kvcd.engine.daemon import PrivateDaemon  # noqa: E402
from kvtensors import canonical, make_cache, stored_blocks  # noqa: E402

L, H, D, BT = 3, 2, 64, 16  # 12 KiB fp16 blocks
_ids = iter(range(10**6))


def cuda_alloc(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="cuda")


def cpu(views):
    return None if views is None else [v.cpu() for v in views]


@pytest.fixture(scope="module")
def daemon():
    with PrivateDaemon(["host.size=64m", "gpu.pool_size=64m"]) as d:
        yield d


@pytest.fixture
def client(daemon):
    with kvcd.Client(daemon.socket) as c:
        yield c


def ns_of(client, k_only=False, dim=D):
    return client.namespace("cuda-%d" % next(_ids), L, 1 if k_only else H, dim, BT,
                            k_only=k_only)


def test_prefix_calls_with_cuda_tensors(client):
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(6 * BT))
    n16 = ns.block_bytes // 2
    src = [torch.randn(n16, device="cuda").half() for _ in range(6)]
    assert ns.put_prefix(keys[:3], src[:3]) == 3
    with ns.reserve(keys[3:], parent=keys[2]) as r:
        for i in range(3):
            r.write(i, src[3 + i])
    dst = [torch.zeros(n16, dtype=torch.float16, device="cuda") for _ in range(6)]
    assert ns.get_prefix(keys, dst) == 6
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(dst, src))
    # Rows of one tensor, and copy_into on a stream of its own.
    rows = torch.zeros(6, n16, dtype=torch.float16, device="cuda")
    assert ns.get_prefix(keys, [rows[i] for i in range(6)]) == 6
    side = torch.cuda.Stream()
    out = torch.zeros(n16, dtype=torch.float16, device="cuda")
    side.wait_stream(torch.cuda.current_stream())  # after the zeros are written
    with ns.lookup(keys) as lease:
        lease.copy_into(4, out, stream=side)
    side.synchronize()
    torch.cuda.synchronize()
    assert torch.equal(rows, torch.stack(src)) and torch.equal(out, src[4])


@pytest.mark.parametrize("layout", ["vllm", "flash_attn", "flashinfer", "sglang"])
def test_gather_and_scatter_cuda_caches(client, layout):
    ns = ns_of(client)
    pages, pt, first_block, nblocks = 12, 8, 1, 3
    kc, vc, kv_dim, kv, vv = make_cache(layout, L, pages, pt, H, D, seed=3, alloc=cuda_alloc)
    ntok = (first_block + nblocks) * BT
    need = -(-ntok // pt)
    table = torch.randperm(pages, generator=torch.Generator().manual_seed(4))[:need].tolist()
    keys = ns.keys_from_tokens(range(ntok))
    with ns.reserve(keys) as r:
        assert r.gather(kc, vc, table, kv_dim=kv_dim) == first_block + nblocks
    torch.cuda.synchronize()
    want = canonical(cpu(kv), cpu(vv), table, first_block * BT, nblocks, BT)
    with ns.lookup(keys) as lease:
        assert len(lease) == first_block + nblocks
        got = stored_blocks(lease, len(lease))[first_block:]
        assert torch.equal(got.view(want.shape), want)
        dkc, dvc, _, dk, dv = make_cache(layout, L, pages, pt, H, D, seed=5, alloc=cuda_alloc)
        before = [t.cpu() for t in dk + (dv or [])]
        table2 = torch.randperm(pages, generator=torch.Generator().manual_seed(6))[:need]
        table2 = table2.tolist()
        assert lease.scatter(dkc, dvc, table2, first=first_block, n=nblocks,
                             first_token=first_block * BT, kv_dim=kv_dim) == nblocks
    torch.cuda.synchronize()
    assert torch.equal(canonical(cpu(dk), cpu(dv), table2, first_block * BT, nblocks, BT), want)
    written = {(table2[p // pt], p % pt) for p in range(first_block * BT, ntok)}
    for t, b in zip(cpu(dk) + (cpu(dv) or []), before):
        for pg in range(pages):
            for off in range(pt):
                if (pg, off) not in written:
                    assert torch.equal(t[pg, off], b[pg, off]), (pg, off)


def test_mla_latent_cuda_cache(client):
    ns = ns_of(client, k_only=True, dim=96)
    kc, _, _, kv, _ = make_cache("vllm", L, 6, BT, 1, 96, k_only=True, seed=7, alloc=cuda_alloc)
    keys = ns.keys_from_tokens(range(3 * BT))
    with ns.reserve(keys) as r:
        assert r.gather(kc, None, [2, 0, 5]) == 3
    dst = [torch.zeros_like(t) for t in kc]
    with ns.lookup(keys) as lease:
        assert lease.scatter(dst, None, [1, 4, 3]) == 3
    torch.cuda.synchronize()
    for layer in range(L):
        assert torch.equal(dst[layer][[1, 4, 3]], kc[layer][[2, 0, 5]])


def test_layer_ranges_and_events(client):
    """A load split by layer on a side stream, each layer behind its own event: only the
    layers asked for move, and the compute stream that waits on an event sees its layer."""
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(2 * BT))
    kc, vc, _, kv, vv = make_cache("vllm", L, 4, BT, H, D, seed=8, alloc=cuda_alloc)
    with ns.reserve(keys) as r:
        assert r.gather(kc, vc, [0, 1], layers=range(0, 1)) == 2
        with pytest.raises(kvcd.Error) as e:
            r.commit()
        assert e.value.errno == errno.EBUSY and not r.finished
        assert r.gather(kc, vc, [0, 1], layers=range(1, L)) == 2
    dk = [torch.zeros_like(t) for t in kc]
    dv = [torch.zeros_like(t) for t in vc]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # after the zeros are written
    events = [torch.cuda.Event() for _ in range(L)]
    with ns.lookup(keys) as lease:
        for layer in (2, 0):
            with torch.cuda.stream(side):
                assert lease.scatter(dk, dv, [2, 3], layers=layer, stream=side) == 2
                events[layer].record(side)
        main = torch.cuda.current_stream()
        main.wait_event(events[2])
        seen = dk[2][2:4].clone()  # on the compute stream, after the event
    torch.cuda.synchronize()
    assert torch.equal(seen, kc[2][0:2])
    for layer in range(L):
        moved = layer in (0, 2)
        assert torch.equal(dk[layer][2:4], kc[layer][0:2]) == moved
        assert torch.equal(dv[layer][2:4], vc[layer][0:2]) == moved
        assert not dk[layer][0:2].any()


def test_blocks_in_the_gpu_pool(client):
    """Slots in the daemon's GPU pool: a gather writes them device to device, a lookup
    with gpu=True finds them there, and a scatter loads them device to device."""
    if client.gpu_attach() != 1:
        pytest.skip("the daemon's GPU pool is not mapped here")
    ns = ns_of(client)
    keys = ns.keys_from_tokens(range(4 * BT))
    kc, vc, _, kv, vv = make_cache("vllm", L, 8, BT, H, D, seed=9, alloc=cuda_alloc)
    with ns.reserve(keys, gpu=True) as r:
        assert r.gather(kc, vc, [5, 1, 7, 2]) == 4
    dk = [torch.zeros_like(t) for t in kc]
    dv = [torch.zeros_like(t) for t in vc]
    with ns.lookup(keys, gpu=True) as lease:
        assert len(lease) == 4
        tiers = [lease.tier(i) for i in range(4)]
        assert lease.scatter(dk, dv, [0, 3, 4, 6]) == 4
    torch.cuda.synchronize()
    assert "gpu" in tiers, tiers
    for layer in range(L):
        assert torch.equal(dk[layer][[0, 3, 4, 6]], kc[layer][[5, 1, 7, 2]])
        assert torch.equal(dv[layer][[0, 3, 4, 6]], vc[layer][[5, 1, 7, 2]])


@pytest.mark.parametrize("tier", ["host", "pool"])
def test_prefill_decoder_loads_hits_on_the_gpu(daemon, client, tier):
    """kvcd.engine.prefill on the device, as bench_python.py's 8B rows run it at a small
    size: a prefill's KV stored through kvcd (into the host arena by reservations and
    lookups without gpu=True, into the pool with it from a client attached to the pool),
    loaded back into zeroed device pages by a scatter on torch's stream, the very bytes
    computed; the prefill of the rest of the prompt against them gives the no-cache logits
    to bf16 precision."""
    from kvcd.engine.prefill import Decoder, PagedCache, load, small_config, store
    cfg = small_config(layers=2, dim=64, heads=4, kv_heads=2, head_dim=16, ffn_dim=128)
    n, bt = 9 * BT + 3, BT
    m = (n - 1) // bt
    with kvcd.Client(daemon.socket) as pc:
        gpu = tier == "pool"
        c = pc if gpu else client
        ns = c.namespace("cuda-prefill-%d" % next(_ids), cfg.layers, cfg.kv_heads, cfg.head_dim,
                         bt, "bf16")
        if gpu and pc.gpu_attach() != 1:
            pytest.skip("the daemon's GPU pool is not mapped here")
        model = Decoder(cfg, "cuda", n)
        cache = PagedCache(cfg, bt, n, "cuda")
        prompt = torch.randint(0, cfg.vocab, (n,), generator=torch.Generator().manual_seed(5))
        paged = ns.paged_kv(cache.k_layers, cache.v_layers)
        keys = ns.keys_from_tokens(prompt.tolist())[:m]
        prompt = prompt.cuda()
        full = model.forward(prompt, 0, cache)
        ref = cache.pages(m).clone()
        assert store(ns, paged, keys, cache.table, bt, gpu=gpu, device="cuda", chunk=4) == m
        c.flush()
        cache.kv.zero_()
        tiers = []
        assert load(ns, paged, keys, cache.table, gpu=gpu, device="cuda", tiers=tiers) == m
        assert tiers == ["gpu" if gpu else "host"] * m
        assert torch.equal(cache.pages(m), ref)
        hit = model.forward(prompt[m * bt:], m * bt, cache)
        torch.cuda.synchronize()
        assert float((hit - full).abs().max()) <= 0.05 * float(full.abs().max())
