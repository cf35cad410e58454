# DESIGN: kvcd.engine.prefill (the decoder of the 8B prefill benchmark, issue 26) against a
# real kvcd on the CPU, at a small size: the KV a prefill computed, stored through kvcd
# (reserve + gather from the paged cache) and loaded back (lookup + scatter into zeroed
# pages), is the very bytes computed, from the host tier; the prefill of the rest of the
# prompt against it gives the no-cache logits to bf16 precision, and against zeroed pages
# (no load) it does not, so the load is what the logits rest on. The decoder's calls to
# scaled_dot_product_attention (PyTorch 2, the GPU hosts) checked against SDPA as documented.
# And bench_python.py's prefill rows run end to end (the CPU smoke `make bench-python` runs)
# and write their rows.
# The same calls on a GPU, host tier and pool: test_cuda_device.py.
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import kvcd  # noqa: E402
from kvcd.engine.daemon import PrivateDaemon  # noqa: E402
from kvcd.engine.prefill import Decoder, PagedCache, load, small_config, store  # noqa: E402

BT = 16
TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def close(a, b):
    """Logits agree to bf16 precision: 5 % of their scale (a prefill without the loaded KV
    is off by about 30 %)."""
    return float((a - b).abs().max()) <= 0.05 * float(b.abs().max())


def test_prefill_with_a_hit_loads_the_stored_kv():
    cfg = small_config(layers=2, dim=64, heads=4, kv_heads=2, head_dim=16, ffn_dim=128)
    n = 10 * BT + 5
    m = (n - 1) // BT
    model = Decoder(cfg, "cpu", n)
    cache = PagedCache(cfg, BT, n, "cpu")
    prompt = torch.randint(0, cfg.vocab, (n,), generator=torch.Generator().manual_seed(3))
    with PrivateDaemon(["host.size=16m"]) as d, kvcd.Client(d.socket) as c:
        ns = c.namespace(cfg.model_id("-test"), cfg.layers, cfg.kv_heads, cfg.head_dim, BT,
                         "bf16")
        assert ns.block_bytes == cache.page_bytes
        paged = ns.paged_kv(cache.k_layers, cache.v_layers)
        keys = ns.keys_from_tokens(prompt.tolist())[:m]
        full = model.forward(prompt, 0, cache)
        ref = cache.pages(m).clone()
        assert ref.abs().sum() > 0
        assert store(ns, paged, keys, cache.table, BT, chunk=4) == m  # three reservations
        c.flush()
        cache.kv.zero_()
        blind = model.forward(prompt[m * BT:], m * BT, cache)  # zeroed pages: no KV
        cache.kv.zero_()
        tiers = []
        assert load(ns, paged, keys, cache.table, tiers=tiers) == m
        assert tiers == ["host"] * m
        assert torch.equal(cache.pages(m), ref)
        assert not cache.pages(cache.npages)[:, :, m:].any()  # nothing past the hits
        hit = model.forward(prompt[m * BT:], m * BT, cache)
        assert close(hit, full) and not close(blind, full)
        # A prefix of the keys loads that prefix only.
        cache.kv.zero_()
        assert load(ns, paged, keys[:3], cache.table) == 3
        assert torch.equal(cache.pages(3), ref[:, :, :3]) and not cache.pages(m)[:, :, 3:].any()
        # held: the lease is the caller's, pinned until it releases it (as an engine's, after
        # its forward); without, load released it.
        cache.kv.zero_()
        held = []
        assert load(ns, paged, keys, cache.table, held=held) == m
        assert len(held) == 1 and not held[0].released and len(held[0]) == m
        assert torch.equal(cache.pages(m), ref)
        assert c.stats()["pins_now"] == m
        held[0].release()
        assert held[0].released and c.stats()["pins_now"] == 0


def test_decoder_refuses_what_does_not_fit():
    cfg = small_config(layers=1, dim=32, heads=2, kv_heads=2, head_dim=16, ffn_dim=64)
    model = Decoder(cfg, "cpu", 32)
    cache = PagedCache(cfg, BT, 32, "cpu")
    with pytest.raises(ValueError):
        model.forward(torch.zeros(33, dtype=torch.long), 0, cache)
    with pytest.raises(ValueError):
        Decoder(small_config(heads=3, kv_heads=2), "cpu", 32)


def test_bench_prefill_rows(tmp_path):
    """bench_python.py --cases prefill --append: the CPU smoke's rows are added to the
    file's, the 8B rows and the pool rows say SKIP without a GPU."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU the bench's prefill rows are the 8B ones (etc/device-check.sh)")
    out = tmp_path / "python.json"
    out.write_text(json.dumps([dict(case="kept", value=1, unit="s", baseline="b",
                                    baseline_value=1, ratio=1),
                               dict(case="load_small_64tok_host_cpu", value=9, unit="s",
                                    baseline="b", baseline_value=1, ratio=9)]))
    env = dict(os.environ, KVC_BENCH_PREFILL_TOKENS="64", KVC_BENCH_SMOKE="1")
    p = subprocess.run([sys.executable, os.path.join(TOP, "tests/bench/bench_python.py"),
                        "--cases", "prefill", "--append", str(out)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SKIP: prefill_8b_" in p.stdout and "SKIP: load_small_64tok_pool_cpu" in p.stdout
    rows = {r["case"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"kept", "load_small_64tok_host_cpu", "prefill_small_64tok_host_hit_cpu"}
    load_row, hit_row = rows["load_small_64tok_host_cpu"], rows["prefill_small_64tok_host_hit_cpu"]
    assert load_row["baseline"] == "memcpy" and hit_row["baseline"] == "no cache"
    for r in (load_row, hit_row):
        assert r["value"] > 0 and r["baseline_value"] > 0
        assert r["ratio"] == pytest.approx(r["value"] / r["baseline_value"])
    bad = subprocess.run([sys.executable, os.path.join(TOP, "tests/bench/bench_python.py"),
                          "--cases", "prefill", str(out)],
                         env=dict(env, KVC_BENCH_PREFILL_TOKENS="8"), capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "KVC_BENCH_PREFILL_TOKENS" in bad.stderr


def test_bench_loadstages_rows(tmp_path):
    """bench_python.py --cases loadstages on the strict fake device (the CPU smoke): each
    stage timed for Python and C, and a row per prefix of the fixed part against C."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU the bench's loadstages rows are the device's (etc/device-check.sh)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kvtensors import fakedev_path
    if not os.path.exists(fakedev_path()):
        pytest.skip("no fake device library (make build/tests/check_python)")
    out = tmp_path / "python.json"
    env = dict(os.environ, KVC_BENCH_SMOKE="1")
    p = subprocess.run([sys.executable, os.path.join(TOP, "tests/bench/bench_python.py"),
                        "--cases", "loadstages", str(out)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {r["case"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"load_stages_8b_64blk_host_fake_fixed",
                         "load_stages_8b_128blk_host_fake_fixed"}
    for r in rows.values():
        assert r["value"] > 0 and r["baseline_value"] > 0 and r["baseline"] == "C (libkvc)"
        assert r["ratio"] == pytest.approx(r["value"] / r["baseline_value"])
    for stage in ("lookup", "scatter", "wait", "release", "fixed"):
        assert "load_stages_8b_128blk_host_fake %s" % stage in p.stdout


def sdpa_as_documented(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
    """torch.nn.functional.scaled_dot_product_attention as PyTorch documents it (2.0 and
    later): is_causal masks top-left aligned, a bool attn_mask is True where a query may
    attend."""
    s = (q.float() @ k.float().transpose(-2, -1)) / (q.shape[-1] ** 0.5)
    if is_causal:
        attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


def test_the_sdpa_path_computes_what_the_explicit_one_does():
    """The calls the decoder makes to scaled_dot_product_attention where PyTorch has it (on
    the GPU hosts): its arguments, with SDPA's documented meaning, give the explicit
    softmax's logits, with and without a loaded prefix."""
    cfg = small_config(layers=2, dim=64, heads=4, kv_heads=2, head_dim=16, ffn_dim=128)
    n = 4 * BT + 7
    m = (n - 1) // BT
    prompt = torch.randint(0, cfg.vocab, (n,), generator=torch.Generator().manual_seed(9))
    out = {}
    for name, fn in (("explicit", None), ("sdpa", sdpa_as_documented)):
        model = Decoder(cfg, "cpu", n)
        model.sdpa = fn
        cache = PagedCache(cfg, BT, n, "cpu")
        full = model.forward(prompt, 0, cache)
        tail = model.forward(prompt[m * BT:], m * BT, cache)  # against the KV just computed
        out[name] = (full, tail, cache.kv.clone())
    for a, b in zip(out["explicit"], out["sdpa"]):
        assert torch.allclose(a.float(), b.float(), rtol=0, atol=1e-2)
    assert close(out["sdpa"][1], out["sdpa"][0])
