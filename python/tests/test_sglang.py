# DESIGN: kvcd.sglang.KvcdHiCacheStorage called directly, method by method, with torch host
# pools built as SGLang's (sglang_pools.py) and a real kvcd: the v1 round trip for every
# host layout (MHA: layer_first, page_first, page_first_direct, page_head; MLA; fp8) with
# the stored block checked against kvcd's canonical layout, the generic value calls, the
# chain's parents from extra_info, a page another client is writing (waited for, or
# reported stored and the chain continued), batch_exists that does not wait for disk reads,
# get_stats as SGLang's StorageMetrics, long model ids, clear() for kvcd's admin and its
# refusal for anyone else, refusals that name what to change, and a reconnection after
# kvcd restarts. The controller-driven cases are test_sglang_controller.py.
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import kvcd  # noqa: E402
from kvcd.engine.daemon import PrivateDaemon, daemon_options  # noqa: E402
from kvcd.sglang import KvcdHiCacheStorage, StorageMetrics, _key  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sglang_pools import HostPool, _Fp8, _Fp8e5m2, page_kv  # noqa: E402

LAYERS, HEADS, DIM, PAGE = 3, 2, 16, 4
HERE = os.path.dirname(os.path.abspath(__file__))


def config(sock, model="test/sglang-model", tp_rank=0, tp_size=2, extra=None, **kw):
    c = dict(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
             attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
             is_page_first_layout=False, model_name=model, dp_rank=0, dp_size=1,
             tp_lcm_size=None, should_split_heads=False,
             extra_config=dict(socket=sock, interface_v1=1, **(extra or {})))
    c.update(kw)
    return SimpleNamespace(**c)


def kvkey_hex(key):
    d = _key(key)
    return "%016x%016x" % (int.from_bytes(d[8:], "little"), int.from_bytes(d[:8], "little"))


def blocks(sock, ns_id):
    kvcctl = os.path.join(os.path.dirname(os.environ.get("KVCD_BIN", "build/bin/kvcd")),
                          "kvcctl")
    out = subprocess.run([kvcctl, "-s", sock, "--json", "ls", "--ns", str(ns_id)],
                         capture_output=True, text=True, check=True)
    return {b["key"]: b for b in json.loads(out.stdout)}


def ns_of(be, sock, pool="kv", shard=0):
    mid = be.namespaces()[pool][shard]
    c = kvcd.Client(sock)
    for n in c.namespaces():
        if n["model_id"] == mid:
            return c, c.namespace(mid, n["layers"], n["kv_heads"], n["head_dim"],
                                  n["block_tokens"], n["dtype"],
                                  k_only=n["kv_kind"] != "kv")
    raise KeyError(mid)


@pytest.fixture(scope="module")
def daemon():
    with PrivateDaemon(["host.size=64m"]) as d:
        yield d


POOLS = [dict(layout=lay) for lay in ("layer_first", "page_first", "page_first_direct",
                                      "page_head")] + \
    [dict(layout=lay, mla=True) for lay in ("layer_first", "page_first", "page_first_direct")] \
    + [dict(layout="page_first", fp8=_Fp8), dict(layout="layer_first", dtype=torch.bfloat16)]


@pytest.mark.parametrize("kind", POOLS, ids=lambda k: "-".join(
    str(v) if not isinstance(v, type) else v.__name__ for v in k.values()))
def test_v1_round_trip_every_host_layout(daemon, kind):
    """batch_set_v1 from one pool, batch_get_v1 into another of the same kind: the pages
    arrive, and the block kvcd holds is the canonical [layer][k/v][token][head][dim]
    ([layer][token][1][dim] for MLA) whatever the pool's layout."""
    mla, layout = kind.get("mla", False), kind["layout"]
    model = "v1-" + "-".join(str(v) for v in kind.values()).replace(" ", "")
    src = HostPool(layout, LAYERS, HEADS, DIM, PAGE, 8, dtype=kind.get("dtype", torch.float16),
                   mla=mla, fp8=kind.get("fp8"))
    be = KvcdHiCacheStorage(config(daemon.socket, model=model, is_mla_model=mla), src)
    keys = ["%s-page-%d" % (model, i) for i in range(4)]
    want = [src.fill(i * PAGE, k) for i, k in enumerate(keys)]
    idx = torch.arange(4 * PAGE, dtype=torch.int64)
    assert be.batch_exists(keys) == 0
    assert be.batch_set_v1(keys, idx) == [True] * 4
    assert be.batch_set_v1(keys, idx) == [True] * 4  # present: costs nothing
    assert be.batch_exists(keys) == 4
    assert be.batch_exists(keys + ["never-stored"]) == 4
    assert be.batch_exists(["never-stored"] + keys) == 0
    dst = HostPool(layout, LAYERS, HEADS, DIM, PAGE, 8, dtype=kind.get("dtype", torch.float16),
                   mla=mla, fp8=kind.get("fp8"))
    be.register_mem_pool_host(dst)
    got = be.batch_get_v1(keys + ["never-stored"], torch.arange(3 * PAGE, 8 * PAGE))
    assert got == [True] * 4 + [False]
    for i in range(4):
        assert torch.equal(dst.read_canonical(3 * PAGE + i * PAGE), want[i]), i
    # What kvcd holds: the canonical block, byte for byte.
    c, ns = ns_of(be, daemon.socket)
    with ns.lookup([_key(keys[1])]) as lease:
        block = torch.frombuffer(bytearray(lease[0]), dtype=src.dtype)
    assert torch.equal(block, want[1].reshape(-1))
    c.close()
    st = be.stats()
    assert st["get_hits"] == 4 and st["set_written"] == 4 and st["set_present"] == 4
    be.close()


def test_operations_past_one_request():
    """SGLang hands over every page of an operation at once (page_size 1: one a token): a
    batch_set_v1 of more pages than one reservation takes (2048) and a batch_exists /
    batch_get_v1 of more than one lease takes (8 x 2048) go in pieces, every page stored,
    found and loaded byte for byte."""
    n = 8 * 2048 + 116
    with PrivateDaemon(["host.size=256m"]) as d:
        src = HostPool("layer_first", 1, 1, 8, 1, n)
        be = KvcdHiCacheStorage(config(d.socket, model="past-one-request"), src)
        keys = ["long-op-%d" % i for i in range(n)]
        for i, k in enumerate(keys):
            src.fill(i, k)
        idx = torch.arange(n, dtype=torch.int64)
        assert be.batch_set_v1(keys, idx) == [True] * n
        assert be.batch_exists(keys) == n
        assert be.batch_exists(keys + ["never-stored"]) == n
        dst = HostPool("layer_first", 1, 1, 8, 1, n)
        be.register_mem_pool_host(dst)
        assert be.batch_get_v1(keys, idx) == [True] * n
        assert torch.equal(dst.kv_buffer, src.kv_buffer)
        assert be.stats()["errors"] == 0
        be.close()


def test_value_calls_and_prefix_semantics(daemon):
    """The generic calls SGLang makes without interface_v1: flat pages in the pool's
    get_data_page(flat=True) order."""
    pool = HostPool("layer_first", LAYERS, HEADS, DIM, PAGE, 8)
    be = KvcdHiCacheStorage(config(daemon.socket, model="values"), pool)
    for i in range(3):
        pool.fill(i * PAGE, "v-%d" % i)
    pages = [pool.get_data_page(i * PAGE).clone() for i in range(3)]
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
    assert be.clear()  # this user started the daemon: it is kvcd's admin here
    assert be.batch_exists(["v-0", "v-1", "v-2"]) == 0
    be.close()


def test_built_as_the_dynamic_loader_does(daemon):
    """SGLang's dynamic loader calls backend_class(storage_config, kwargs) and registers the
    host pool afterwards."""
    be = KvcdHiCacheStorage(config(daemon.socket, model="dynamic"), {})
    assert be.pools == {}
    pool = HostPool("page_first", LAYERS, HEADS, DIM, PAGE, 8)
    be.register_mem_pool_host(pool)
    assert be.batch_set_v1(["d-0"], torch.arange(PAGE)) == [True]
    assert be.exists("d-0")
    be.close()


def test_without_host_pool_from_extra_config(daemon):
    extra = dict(layers=LAYERS, kv_heads=HEADS, head_dim=DIM, page_size=PAGE, dtype="fp16")
    be = KvcdHiCacheStorage(config(daemon.socket, model="nopool", extra=extra))
    page = torch.randn(LAYERS * 2 * PAGE * HEADS * DIM).half()
    assert be.set("np-0", page) and torch.equal(be.get("np-0"), page)
    c, ns = ns_of(be, daemon.socket)  # flat pages are kvcd's canonical blocks
    with ns.lookup([_key("np-0")]) as lease:
        assert torch.equal(torch.frombuffer(bytearray(lease[0]), dtype=torch.float16), page)
    c.close()
    be.close()


def test_parents_from_prefix_keys_and_orphans(daemon):
    """extra_info.prefix_keys[-1] is the chain's parent (SGLang passes it to batch_set_v1);
    a parent kvcd does not hold (evicted, or written before this backend) makes the batch a
    new root instead of losing it."""
    pool = HostPool("page_first", LAYERS, HEADS, DIM, PAGE, 8)
    be = KvcdHiCacheStorage(config(daemon.socket, model="parents"), pool)
    first, second = ["p-0", "p-1"], ["p-2", "p-3"]
    info = SimpleNamespace(prefix_keys=None, extra_info=None)
    assert be.batch_set_v1(first, torch.arange(2 * PAGE), info) == [True] * 2
    info = SimpleNamespace(prefix_keys=list(first), extra_info=None)
    assert be.batch_set_v1(second, torch.arange(2 * PAGE, 4 * PAGE), info) == [True] * 2
    orphan = SimpleNamespace(prefix_keys=["never-stored"], extra_info=None)
    assert be.batch_set_v1(["o-0", "o-1"], torch.arange(4 * PAGE, 6 * PAGE), orphan) == \
        [True] * 2
    c, ns = ns_of(be, daemon.socket)
    bl = blocks(daemon.socket, ns.id)
    assert bl[kvkey_hex("p-2")]["parent"] == kvkey_hex("p-1")
    assert [bl[kvkey_hex(k)]["depth"] for k in first + second] == [0, 1, 2, 3]
    assert bl[kvkey_hex("o-0")]["depth"] == 0 and bl[kvkey_hex("o-1")]["parent"] == \
        kvkey_hex("o-0")
    assert be.stats()["set_orphan"] == 1
    c.close()
    be.close()


def _busy_page_set(sock, model):
    """batch_set_v1 of four pages while another client holds the second one reserved and
    commits it 0.2 s later: the backend's statistics."""
    pool = HostPool("page_first", LAYERS, HEADS, DIM, PAGE, 8)
    be = KvcdHiCacheStorage(config(sock, model=model), pool)
    keys = ["b-%d" % i for i in range(4)]
    for i, k in enumerate(keys):
        pool.fill(i * PAGE, k)
    assert be.batch_set_v1(keys[:1], torch.arange(PAGE)) == [True]
    c, ns = ns_of(be, sock)
    r = ns.reserve([_key(keys[1])], parent=_key(keys[0]))
    assert r.statuses == [kvcd.SLOT_RESERVED]
    r.write(0, pool.read_canonical(PAGE).contiguous().view(torch.uint8).numpy())
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(
        "ok", be.batch_set_v1(keys, torch.arange(4 * PAGE))))
    t.start()
    time.sleep(0.2)
    assert t.is_alive()  # waiting for the other writer
    r.commit()
    t.join(10)
    assert out["ok"] == [True] * 4
    st = be.stats()
    bl = blocks(sock, ns.id)
    assert [bl[kvkey_hex(k)]["depth"] for k in keys] == [0, 1, 2, 3]
    c.close()
    be.close()
    return st


def test_page_another_client_writes_is_waited_for():
    """A page of the chain is being written by another instance (kvcd: BUSY, the pages
    after it SKIPPED, as it answers for a writer of another user, here with disk.put_wait
    = 0): batch_set_v1 waits for that commit and stores the rest after it; SGLang sees every
    page stored (its all() would otherwise stop the backup)."""
    with PrivateDaemon(["host.size=64m", "disk.put_wait=0"]) as d:
        st = _busy_page_set(d.socket, "busy")
    assert st["set_busy"] == 1 and st["set_busy_late"] == 0 and st["set_written"] == 3


def test_page_same_user_writes_is_waited_for_by_kvcd(daemon):
    """The same with a writer of the same user: kvcd itself holds the RESERVE until that
    commit (disk.put_wait), so the backend never sees BUSY and stores the rest."""
    st = _busy_page_set(daemon.socket, "busy-same")
    assert st["set_busy"] == 0 and st["set_busy_late"] == 0 and st["set_written"] == 3


def test_page_written_too_long_counts_stored_and_the_chain_goes_on(daemon):
    """A writer that keeps its page past busy_wait_ms: the page is reported stored (it is
    coming), and the pages after it are stored as a root of their own."""
    pool = HostPool("page_first", LAYERS, HEADS, DIM, PAGE, 8)
    be = KvcdHiCacheStorage(config(daemon.socket, model="busylate",
                                   extra=dict(busy_wait_ms=50)), pool)
    keys = ["l-%d" % i for i in range(4)]
    for i, k in enumerate(keys):
        pool.fill(i * PAGE, k)
    assert be.batch_set_v1(keys[:1], torch.arange(PAGE)) == [True]
    c, ns = ns_of(be, daemon.socket)
    r = ns.reserve([_key(keys[1])], parent=_key(keys[0]))
    assert be.batch_set_v1(keys, torch.arange(4 * PAGE)) == [True] * 4
    st = be.stats()
    assert st["set_busy_late"] == 1 and st["set_written"] == 3
    with ns.lookup([_key(k) for k in keys[2:]]) as lease:
        assert len(lease) == 2  # stored, as a root
    r.abort()
    c.close()
    be.close()


def test_batch_exists_does_not_wait_for_disk_reads():
    """SGLang calls batch_exists from its prefetch thread: pages on the disk tier are not
    waited for (a ready-only lookup: the run in memory now), their reads start, and once in
    memory they count; batch_get_v1 then loads them right."""
    tmp = tempfile.mkdtemp(prefix="kvcd-sg-disk.")
    opts = ["host.size=32m", "disk.path=%s/d.kvc" % tmp, "disk.capacity=256m", "disk.page=4m"]
    with PrivateDaemon(opts) as d:
        L, H, D, P = 8, 8, 128, 32  # 1 MiB pages: 48 of them overflow the 32 MiB arena
        src = HostPool("page_first", L, H, D, P, 48)
        src.kv_buffer.copy_(torch.randn(src.kv_buffer.shape).half())
        be = KvcdHiCacheStorage(config(d.socket, model="disk"), src)
        keys = ["k-%d" % i for i in range(48)]
        for j in range(0, 48, 8):
            info = SimpleNamespace(prefix_keys=keys[:j] or None, extra_info=None)
            assert be.batch_set_v1(keys[j:j + 8], torch.arange(j * P, (j + 8) * P), info) == \
                [True] * 8
        c, ns = ns_of(be, d.socket)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            tiers = {k: b["tier"] for k, b in blocks(d.socket, ns.id).items()}
            on_disk = [k for k in keys if tiers.get(kvkey_hex(k)) == "disk"]
            if len(on_disk) >= 16:
                break
            time.sleep(0.05)
        assert len(on_disk) >= 16, tiers

        # A lookup that waits would count them at once; batch_exists counts the run in
        # memory now (none: the first page is on disk) and starts the reads.
        got = on_disk[:8]
        assert be.batch_exists(got) == 0
        end = time.monotonic() + 20
        while be.batch_exists(got) < 8 and time.monotonic() < end:
            time.sleep(0.01)
        assert be.batch_exists(got) == 8
        assert {k: b["tier"] for k, b in blocks(d.socket, ns.id).items()}[
            kvkey_hex(got[0])] == "host"
        idx = [keys.index(k) for k in got]
        dst = HostPool("page_first", L, H, D, P, 48)
        be.register_mem_pool_host(dst)
        host = torch.tensor([i * P + t for i in idx for t in range(P)])
        assert be.batch_get_v1(got, host) == [True] * 8
        for i in idx:
            assert torch.equal(dst.get_data_page(i * P), src.get_data_page(i * P)), i
        c.close()
        be.close()


def test_get_stats_is_sglangs_storage_metrics(daemon):
    """get_stats() returns StorageMetrics (SGLang's collector asserts the type) with the
    pages and bandwidth of each batch since the last call, and needs no round trip."""
    names = [f.name for f in dataclasses.fields(StorageMetrics)]
    assert names == ["prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth",
                     "prefetch_occupied_ratios"]
    pool = HostPool("layer_first", LAYERS, HEADS, DIM, PAGE, 8)
    be = KvcdHiCacheStorage(config(daemon.socket, model="metrics",
                                   enable_storage_metrics=True), pool)
    keys = ["m-%d" % i for i in range(3)]
    be.batch_set_v1(keys, torch.arange(3 * PAGE))
    be.batch_get_v1(keys + ["m-absent"], torch.arange(4 * PAGE))
    be.close()  # nothing below talks to kvcd
    m = be.get_stats()
    assert isinstance(m, StorageMetrics)
    assert m.backup_pgs == [3] and m.prefetch_pgs == [3]
    assert len(m.backup_bandwidth) == 1 and m.backup_bandwidth[0] > 0
    assert len(m.prefetch_bandwidth) == 1 and m.prefetch_bandwidth[0] > 0
    assert be.get_stats() == StorageMetrics()  # drained


def test_long_model_ids_are_hashed_into_the_namespace(daemon):
    long_a = "/models/" + "x" * 150 + "/Llama-3.1-8B-Instruct-a"
    long_b = "/models/" + "x" * 150 + "/Llama-3.1-8B-Instruct-b"
    ids = []
    for name in (long_a, long_b):
        pool = HostPool("page_first", LAYERS, HEADS, DIM, PAGE, 8)
        pool.fill(0, "long-0")
        be = KvcdHiCacheStorage(config(daemon.socket, model=name), pool)
        (mid,) = be.namespaces()["kv"]
        assert len(mid.encode()) <= 127 and "~" in mid
        assert be.long_model_ids[mid].startswith("sglang/" + name.replace("/", "-"))
        assert be.batch_set_v1(["long-0"], torch.arange(PAGE)) == [True]
        ids.append(mid)
        be.close()
    assert ids[0] != ids[1]  # the hash covers the whole id


CLEAR_AS_NOBODY = r"""
import logging, sys, io
from types import SimpleNamespace
sys.path.insert(0, %(here)r)
from sglang_pools import HostPool
from kvcd.sglang import KvcdHiCacheStorage
buf = io.StringIO()
logging.basicConfig(stream=buf, level=logging.WARNING)
cfg = SimpleNamespace(tp_rank=0, tp_size=2, is_mla_model=False, model_name="clear",
                      extra_config=dict(socket=%(sock)r, interface_v1=1))
be = KvcdHiCacheStorage(cfg, HostPool("page_first", 3, 2, 16, 4, 8))
ok = be.clear()
print(ok, be.batch_exists(["c-0"]))
print(buf.getvalue())
"""


def as_nobody():
    os.setgid(65534)
    os.setuid(65534)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
def test_clear_refused_to_a_user_who_is_not_kvcds_admin():
    """clear() is kvcd's admin EVICT: refused (False, a log line naming kvcctl evict and
    server.admin_group) for another user, and nothing is evicted."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    probe = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); "
                            "import kvcd.sglang, sglang_pools" % HERE], capture_output=True,
                           text=True, timeout=120, env=env, preexec_fn=as_nobody)
    if probe.returncode != 0:
        pytest.skip("the package or the tests are not readable by another user here")
    with PrivateDaemon(["host.size=32m", "server.socket_mode=0666"]) as d:
        os.chmod(os.path.dirname(d.socket), 0o755)
        pool = HostPool("page_first", LAYERS, HEADS, DIM, PAGE, 8)
        be = KvcdHiCacheStorage(config(d.socket, model="clear"), pool)
        assert be.batch_set_v1(["c-0"], torch.arange(PAGE)) == [True]
        p = subprocess.run([sys.executable, "-c", CLEAR_AS_NOBODY % dict(here=HERE,
                                                                          sock=d.socket)],
                           capture_output=True, text=True, timeout=120, env=env,
                           preexec_fn=as_nobody)
        assert p.returncode == 0, p.stderr
        first, log = p.stdout.split("\n", 1)
        assert first == "False 1"
        assert "kvcctl evict" in log and "server.admin_group" in log
        assert be.batch_exists(["c-0"]) == 1
        assert be.clear() and be.batch_exists(["c-0"]) == 0  # kvcd's own user may
        be.close()


def test_refusals_name_what_to_change(daemon):
    with pytest.raises(NotImplementedError, match="--kv-cache-dtype fp8_e4m3"):
        KvcdHiCacheStorage(config(daemon.socket), HostPool("page_first", fp8=_Fp8e5m2))
    pool = HostPool("page_first")
    pool.layout = "tiled"
    with pytest.raises(NotImplementedError, match="--hicache-mem-layout"):
        KvcdHiCacheStorage(config(daemon.socket), pool)
    pool = HostPool("page_first")
    pool.kv_buffer = (pool.kv_buffer[0], pool.kv_buffer[1])  # K and V apart
    with pytest.raises(NotImplementedError, match="v_head_dim"):
        KvcdHiCacheStorage(config(daemon.socket), pool)
    with pytest.raises(NotImplementedError, match="heads do not split"):
        KvcdHiCacheStorage(config(daemon.socket, tp_size=1, tp_lcm_size=3,
                                  should_split_heads=True), HostPool("page_head", heads=2))


def test_mla_rank_other_than_0_writes_nothing(daemon):
    pool = HostPool("page_first", mla=True)
    be1 = KvcdHiCacheStorage(config(daemon.socket, model="mla1", tp_rank=1, is_mla_model=True),
                             pool)
    assert be1.batch_set_v1(["mla-0"], torch.arange(PAGE)) == [True]
    assert be1.batch_exists(["mla-0"]) == 0 and be1.stats()["set_written"] == 0
    be0 = KvcdHiCacheStorage(config(daemon.socket, model="mla1", tp_rank=0, is_mla_model=True),
                             pool)
    assert be0.namespaces() == be1.namespaces()
    assert be0.batch_set_v1(["mla-0"], torch.arange(PAGE)) == [True]
    assert be1.batch_exists(["mla-0"]) == 1
    be0.close()
    be1.close()


def test_reconnects_after_kvcd_restarts():
    """kvcd restarted under a running SGLang: the call that meets the dead connection
    fails (a miss, a failed page), the next one reconnects."""
    with PrivateDaemon(["host.size=32m"]) as d:
        pool = HostPool("page_first", LAYERS, HEADS, DIM, PAGE, 8)
        be = KvcdHiCacheStorage(config(d.socket, model="restart"), pool)
        assert be.batch_set_v1(["r-0"], torch.arange(PAGE)) == [True]
        os.kill(d.proc.pid, signal.SIGTERM)
        d.proc.wait(10)
        args = [d.binary, "-o", "server.socket=" + d.socket]
        for o in daemon_options(d.options):
            args += ["-o", o]
        os.unlink(d.socket) if os.path.exists(d.socket) else None
        d.proc = subprocess.Popen(args, stdout=d._log, stderr=d._log)
        end = time.monotonic() + 20
        while not os.path.exists(d.socket) and time.monotonic() < end:
            time.sleep(0.01)
        assert be.batch_exists(["r-0"]) == 0  # the old connection: failed, dropped
        assert be.batch_set_v1(["r-0"], torch.arange(PAGE)) == [True]  # a new one
        assert be.batch_exists(["r-0"]) == 1
        assert be.stats()["errors"] >= 1
        be.close()


def test_get_stats_type_from_sglangs_observability_module(tmp_path):
    """Newer SGLang trees keep StorageMetrics in srt/observability/metrics_collector.py
    (its collector asserts that type): the backend returns that class when it is the one
    SGLang has, not a look-alike of its own."""
    pkg = tmp_path / "sglang" / "srt" / "observability"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "sglang", tmp_path / "sglang" / "srt", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "metrics_collector.py").write_text(
        "from dataclasses import dataclass, field\n"
        "@dataclass\n"
        "class StorageMetrics:\n"
        "    prefetch_pgs: list = field(default_factory=list)\n"
        "    backup_pgs: list = field(default_factory=list)\n"
        "    prefetch_bandwidth: list = field(default_factory=list)\n"
        "    backup_bandwidth: list = field(default_factory=list)\n"
        "    prefetch_occupied_ratios: list = field(default_factory=list)\n")
    code = (
        "from types import SimpleNamespace\n"
        "import kvcd.sglang as ks\n"
        "from sglang.srt.observability.metrics_collector import StorageMetrics\n"
        "cfg = SimpleNamespace(tp_rank=0, tp_size=1, is_mla_model=False, model_name='m',\n"
        "                      enable_storage_metrics=True, extra_config={})\n"
        "be = ks.KvcdHiCacheStorage(cfg)\n"
        "assert ks.StorageMetrics is StorageMetrics\n"
        "assert isinstance(be.get_stats(), StorageMetrics)\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                           if p]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
