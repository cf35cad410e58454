# DESIGN: kvcd.sglang.KvcdHiCacheStorage driven directly, as SGLang's HiCache controller
# drives an L3 backend, with torch tensors and a real kvcd: host pools that mimic SGLang's
# MHA host pool in its two layouts, set/get/exists round trips, the batch calls and their
# prefix semantics, the zero-copy v1 calls, and a second backend instance in another process
# that sees the first one's pages. Skipped without python3-torch.
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from kvcd.engine.daemon import PrivateDaemon  # noqa: E402
from kvcd.sglang import KvcdHiCacheStorage  # noqa: E402

LAYERS, HEADS, DIM, PAGE = 3, 2, 16, 4


class HostPool:
    """SGLang's MHA host pool as the backend sees it: kv_buffer in "layer_first"
    [2][layer][token][head][dim] or "page_first" [2][token][layer][head][dim]; pages are
    addressed by their first token index."""

    def __init__(self, layout, pages=8, dtype=torch.float16, seed=0):
        self.layout, self.page_size, self.dtype = layout, PAGE, dtype
        self.layer_num, self.head_num, self.head_dim = LAYERS, HEADS, DIM
        size = pages * PAGE
        shape = ((2, LAYERS, size, HEADS, DIM) if layout == "layer_first"
                 else (2, size, LAYERS, HEADS, DIM))
        g = torch.Generator().manual_seed(seed)
        self.kv_buffer = torch.randn(shape, generator=g).to(dtype)

    def get_data_page(self, index, flat=True):
        if self.layout == "layer_first":
            page = self.kv_buffer[:, :, index:index + PAGE]
        else:
            page = self.kv_buffer[:, index:index + PAGE]
        return page.flatten() if flat else page

    def set_from_flat_data_page(self, index, data_page):
        page = self.get_data_page(index, flat=False)
        page.copy_(data_page.reshape(page.shape))

    def get_dummy_flat_data_page(self):
        return torch.zeros(2 * LAYERS * PAGE * HEADS * DIM, dtype=self.dtype)


def config(sock, model="test/sglang-model", tp_rank=0, extra=None):
    return SimpleNamespace(tp_rank=tp_rank, tp_size=2, pp_rank=0, pp_size=1,
                           attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
                           enable_storage_metrics=False, is_page_first_layout=False,
                           model_name=model, extra_config=dict(socket=sock, **(extra or {})))


@pytest.fixture(scope="module")
def daemon():
    with PrivateDaemon(["host.size=32m"]) as d:
        yield d


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_v1_round_trip_through_the_host_pool(daemon, layout):
    src = HostPool(layout, seed=1)
    be = KvcdHiCacheStorage(config(daemon.socket, model="v1-" + layout), src)
    keys = ["page-%s-%d" % (layout, i) for i in range(4)]
    idx = torch.arange(4 * PAGE, dtype=torch.int64)  # pages 0..3 of the pool
    assert be.batch_exists(keys) == 0
    assert be.batch_set_v1(keys, idx) == [True] * 4
    assert be.batch_set_v1(keys, idx) == [True] * 4  # present: costs nothing
    assert be.batch_exists(keys) == 4
    assert be.batch_exists(keys + ["never-stored"]) == 4
    dst = HostPool(layout, seed=2)
    be.register_mem_pool_host(dst)
    # Load into pages 4..7 of another pool: same bytes, page by page.
    got = be.batch_get_v1(keys + ["never-stored"], torch.arange(4 * PAGE, 9 * PAGE))
    assert got == [True] * 4 + [False]
    for i in range(4):
        assert torch.equal(dst.get_data_page(4 * PAGE + i * PAGE),
                           src.get_data_page(i * PAGE))
    # The stored block is kvcd's canonical layout [layer][k/v][token][head][dim].
    with be.ns.lookup([be._key(keys[1])]) as lease:
        block = torch.frombuffer(bytearray(lease[0]), dtype=torch.float16)
    want = src.get_data_page(PAGE, flat=False)
    want = want.permute(1, 0, 2, 3, 4) if layout == "layer_first" else want.permute(2, 0, 1, 3, 4)
    assert torch.equal(block, want.reshape(-1))
    stats = be.get_stats()
    assert stats["get_hits"] == 4 and stats["set_written"] == 4
    be.close()


def test_value_calls_and_prefix_semantics(daemon):
    pool = HostPool("layer_first", seed=3)
    be = KvcdHiCacheStorage(config(daemon.socket, model="values"), pool)
    pages = [pool.get_data_page(i * PAGE) for i in range(3)]
    assert be.set("v-0", pages[0]) and be.exists("v-0") and not be.exists("v-1")
    assert torch.equal(be.get("v-0"), pages[0])
    assert be.get("v-1") is None
    target = pool.get_dummy_flat_data_page()
    assert be.get("v-0", target) is target and torch.equal(target, pages[0])
    assert be.batch_set(["v-1", "v-2"], pages[1:])
    got = be.batch_get(["v-0", "v-1", "v-2", "v-3"])
    assert all(torch.equal(a, b) for a, b in zip(got[:3], pages)) and got[3] is None
    assert be.batch_exists(["v-0", "v-1", "v-2"]) == 3
    assert be.batch_exists(["v-0", "missing", "v-2"]) == 1  # the leading run only
    be.clear()  # this user started the daemon: it is kvcd's admin here
    assert be.batch_exists(["v-0", "v-1", "v-2"]) == 0
    be.close()


def test_built_as_the_dynamic_loader_does(daemon):
    """SGLang's dynamic loader calls backend_class(storage_config, kwargs) and registers the
    host pool afterwards."""
    be = KvcdHiCacheStorage(config(daemon.socket, model="dynamic"), {})
    assert be.ns is None
    pool = HostPool("page_first", seed=5)
    be.register_mem_pool_host(pool)
    assert be.batch_set_v1(["d-0"], torch.arange(PAGE)) == [True]
    assert be.exists("d-0")
    be.close()


def test_without_host_pool_from_extra_config(daemon):
    extra = dict(layers=LAYERS, kv_heads=HEADS, head_dim=DIM, page_size=PAGE, dtype="fp16")
    be = KvcdHiCacheStorage(config(daemon.socket, model="nopool", extra=extra))
    page = torch.randn(LAYERS * 2 * PAGE * HEADS * DIM).half()
    assert be.set("np-0", page) and torch.equal(be.get("np-0"), page)
    be.close()


SECOND = r"""
import json, sys, torch
sys.path.insert(0, %(here)r)
from test_sglang import HostPool, config, PAGE
from kvcd.sglang import KvcdHiCacheStorage
pool = HostPool("page_first", seed=9)
be = KvcdHiCacheStorage(config(%(sock)r, model="shared"), pool)
keys = ["shared-%%d" %% i for i in range(5)]
n = be.batch_exists(keys)
ok = be.batch_get_v1(keys, torch.arange(5 * PAGE))
# page_first [2][token][layer][head][dim] as layer_first's [2][layer][token][head][dim]
pages = [pool.get_data_page(i * PAGE, flat=False).permute(0, 2, 1, 3, 4).contiguous()
         .view(torch.int16).flatten().tolist() for i in range(n)]
print(json.dumps(dict(exists=n, ok=ok, pages=pages)))
"""


def test_second_instance_in_another_process_sees_the_pages(daemon):
    pool = HostPool("layer_first", seed=4)
    be = KvcdHiCacheStorage(config(daemon.socket, model="shared"), pool)
    keys = ["shared-%d" % i for i in range(4)]
    assert all(be.batch_set_v1(keys, torch.arange(4 * PAGE)))
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run([sys.executable, "-c", SECOND % dict(here=here, sock=daemon.socket)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["exists"] == 4 and r["ok"] == [True] * 4 + [False]
    # Another layout in that process, the same page contents, element by element (the
    # pages' fp16 bits, in layer_first order: a sum would not see two elements swapped).
    for i in range(4):
        got = torch.tensor(r["pages"][i], dtype=torch.int16).view(torch.float16)
        assert torch.equal(got, pool.get_data_page(i * PAGE)), i
    be.close()
