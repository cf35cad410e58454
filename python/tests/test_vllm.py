# DESIGN: conformance of kvcd.vllm.KvcdConnector with vLLM's connector protocol, without
# vLLM (not installable here): the scheduler side runs in this process and each worker
# (tensor-parallel rank) in a process of its own (vllm_worker.py), both sides sharing one
# real kvcd, driven exactly as vLLM's v1 scheduler and model runner drive a connector
# (vllm_driver.py: the same call order, SchedulerOutput / NewRequestData / CachedRequestData
# built the same way and pickled to the workers, the KVConnectorOutput coming back). The
# worker's "model" writes KV that is a pure function of the tokens before it, so its
# attention checks every token it reads: a second request with the same prefix gets
# num_external_tokens > 0 and loads exactly what the first one saved; a block evicted
# between scheduling and loading comes back through get_block_ids_with_load_errors and is
# recomputed, never read wrong; LoRA, cache salt and multimodal inputs change the keys;
# saves commit asynchronously and hold the request's blocks until get_finished says so;
# with two ranks each keeps its own namespace shard and a hit needs both; the optional hooks
# vLLM calls answer as vLLM expects of a cache, a step whose layer hooks do not run (a
# replayed CUDA graph) still saves the bytes the model wrote, and a preempted request
# resumes by loading what it saved before. A hybrid model (test_hybrid_*: a full-attention
# and a sliding-window KV cache group, the stand-in scheduler drawing both groups' blocks
# from one pool with vLLM's null block) saves and loads per group, the prefix being the one
# every group gives. A model with Mamba layers (test_mamba_*: a full-attention and a Mamba
# group in vLLM's align mode, whose stand-in layers run a recurrence from the state they
# find in the running block) saves the state of each block-aligned chunk end and loads the
# state of the prefix's end where vLLM reads it, so its output equals a run without kvcd.
import time

import pytest

torch = pytest.importorskip("torch")

import vllm_driver as drv  # noqa: E402  (puts the vLLM stand-in on sys.path)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

import kvcd  # noqa: E402
from kvcd.engine.daemon import PrivateDaemon  # noqa: E402

BS = 16
_models = iter(range(10**6))


@pytest.fixture(scope="module")
def daemon():
    with PrivateDaemon(["host.size=64m"]) as d:
        yield d


class Setup:
    """A scheduler-side connector in this process, `tp` worker processes, one kvcd. `worker`
    makes a rank's worker (vllm_driver.Worker: a process of vllm_worker.py; test_vllm_cuda.py
    passes one with its KV caches on the fake device)."""

    def __init__(self, daemon, tp=1, budget=1 << 30, groups=None, worker=None, **extra):
        self.p = dict(model="test/vllm-%d" % next(_models), block_size=BS, layers=2,
                      heads=2 * tp, head_size=16, num_blocks=64, tp=tp,
                      extra=dict(dict(socket=daemon.socket), **extra))
        if groups:  # a hybrid model: [(model layer indices, window or 0), ...]
            self.p["groups"] = [dict(layers=list(ly), window=w) for ly, w in groups]
            self.p["layers"] = sum(len(ly) for ly, _ in groups)
        vc, kc, _ = drv.configs(self.p)
        self.sched_conn = drv.load_connector(vc, KVConnectorRole.SCHEDULER, kc)
        self.sched = drv.MiniScheduler(self.sched_conn, self.p["num_blocks"], BS, budget,
                                       windows=[w for _, w in groups] if groups else None)
        self.workers = [(worker or drv.Worker)(self.p, r) for r in range(tp)]
        self.outputs = [dict() for _ in self.workers]  # per rank: req_id -> Mamba output
        self.wrong = 0
        self.stats = [dict() for _ in self.workers]
        self.steps = 0
        self._sending, self._recving = {}, {}  # ranks yet to report each request

    def step(self, before_workers=None, layer_hooks=True):
        out = self.sched.schedule()
        if before_workers:
            before_workers(out)
        replies = [w.step(out, layer_hooks) for w in self.workers]
        self.steps += 1
        kv_out = replies[0]["kv_out"]
        # vLLM aggregates its workers' outputs (KVOutputAggregator): each rank reports a
        # request once, in the step its transfer ends, and the request is finished when every
        # rank has reported it, in whatever steps; a block failed when one rank failed it.
        for field, left in (("finished_sending", self._sending), ("finished_recving",
                                                                  self._recving)):
            done = set()
            for r in replies:
                for req_id in getattr(r["kv_out"], field) or ():
                    left[req_id] = left.get(req_id, len(replies)) - 1
                    if left[req_id] == 0:
                        del left[req_id]
                        done.add(req_id)
            setattr(kv_out, field, done or None)
        kv_out.invalid_block_ids = set().union(*[r["kv_out"].invalid_block_ids for r in replies])
        for i, r in enumerate(replies):
            self.wrong += r["wrong"]
            self.stats[i] = r["stats"]
            self.outputs[i].update(r.get("outputs") or {})
        self.sched.update_from_output(out, kv_out)
        return out, kv_out

    def run(self, *reqs, limit=1000, before_workers=None, deadline_s=60, layer_hooks=True):
        """Steps until every request is done and its blocks are freed (a save committing in
        the background keeps them: vLLM keeps stepping meanwhile)."""
        for r in reqs:
            self.sched.add(r)
        outs = []
        end = time.monotonic() + deadline_s
        while not self.sched.idle() and len(outs) < limit and time.monotonic() < end:
            busy = self.sched.waiting or self.sched.running
            outs.append(self.step(before_workers, layer_hooks))
            before_workers = None
            if not busy:
                time.sleep(0.005)  # only commits in flight: an idle engine step
        assert self.sched.idle(), "requests left after %d steps" % len(outs)
        return outs

    def ns(self, client, rank=0, group=None):
        lay = self.sched_conn._lay
        if group is not None:
            return lay.groups[group].open(client, rank)
        return lay.open(client, rank)

    def close(self):
        for w in self.workers:
            w.close()
        self.sched_conn.shutdown()  # as vLLM's Scheduler.shutdown does


@pytest.fixture
def setup(daemon, request):
    made = []

    def make(**kw):
        s = Setup(daemon, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def prompt(n, seed=0, prefix=None):
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, 30000, (n,), generator=g).tolist()
    if prefix:
        toks[:len(prefix)] = prefix
    return toks


def check_kv(s, req_id, n):
    """Tokens [0, n) of a finished request hold the model's KV on every rank."""
    for w in s.workers:
        assert w.call("expect", req_id, n) == 0


def test_second_request_loads_what_the_first_saved(setup, daemon):
    s = setup()
    a = prompt(100, seed=1)
    s.run(Request("A", a))
    assert s.stats[0]["saved_blocks"] == 6  # 100 tokens: 6 full blocks
    b = prompt(120, seed=2, prefix=a[:96])
    req_b = Request("B", b)
    # The scheduler asks as vLLM does (side-effect free, may repeat).
    assert s.sched_conn.get_num_new_matched_tokens(req_b, 0) == (96, False)
    assert s.sched_conn.get_num_new_matched_tokens(req_b, 0) == (96, False)
    assert s.sched_conn.get_num_new_matched_tokens(req_b, 32) == (64, False)
    outs = s.run(req_b)
    out, kv_out = outs[0]
    assert req_b.num_external_computed_tokens == 96
    assert [sp.count for sp in out.kv_connector_metadata.loads] == [6]
    assert not kv_out.invalid_block_ids
    assert s.stats[0]["loaded_blocks"] == 6 and s.stats[0]["load_lookups"] == 1
    assert s.wrong == 0  # every token attention read held the model's KV
    check_kv(s, "B", 120)
    # The bytes in kvcd are the first request's KV, element by element.
    with kvcd.Client(daemon.socket) as c:
        ns = s.ns(c)
        from kvcd.vllm import span_keys
        keys = span_keys(ns, a, [(0, b"")], 6)
        with ns.lookup(keys) as lease:
            assert len(lease) == 6
            blk = torch.frombuffer(bytearray(lease[5]), dtype=torch.float16).view(
                2, 2, BS, 2, 16)  # [layer][k/v][token][head][dim]
        for layer in range(2):
            for kind in range(2):
                for t in range(BS):
                    assert torch.equal(blk[layer, kind, t],
                                       drv.kv_value(a, 5 * BS + t, layer, kind, 0, 2, 16))


def test_block_evicted_between_scheduling_and_loading(setup, daemon):
    s = setup()
    a = prompt(80, seed=3)
    s.run(Request("A", a))
    b = prompt(90, seed=4, prefix=a[:64])
    seen = {}

    def evict(out):  # after build_connector_meta, before the workers load
        seen["loads"] = [sp.count for sp in out.kv_connector_metadata.loads]
        with kvcd.Client(daemon.socket) as c:
            assert c.evict(s.ns(c).id) >= 4  # this user started kvcd: an admin here
    req_b = Request("B", b)
    outs = s.run(req_b, before_workers=evict)
    assert seen["loads"] == [4]
    ids = s.sched.done["B"][1]
    assert outs[0][1].invalid_block_ids == set(ids[:4])  # reported, every one of them
    assert s.stats[0]["load_missing_blocks"] == 4 and s.stats[0].get("loaded_blocks", 0) == 0
    assert len(outs) >= 2  # recomputed in a later step
    assert s.wrong == 0
    check_kv(s, "B", 90)


def test_lora_salt_and_multimodal_change_the_keys(setup):
    s = setup()
    a = prompt(100, seed=5)
    s.run(Request("A", a))
    c = s.sched_conn
    assert c.get_num_new_matched_tokens(Request("x1", a), 0) == (96, False)
    assert c.get_num_new_matched_tokens(
        Request("x2", a, lora_request=LoRARequest("adapter-1", 1)), 0) == (0, False)
    assert c.get_num_new_matched_tokens(Request("x3", a, cache_salt="tenant-2"), 0) == (0, False)
    image = MultiModalFeatureSpec(None, "image", "img-hash-1", PlaceholderRange(40, 10))
    # Blocks before the image's (block 2) are shared; from it on the image is in the keys.
    assert c.get_num_new_matched_tokens(Request("x4", a, mm_features=[image]), 0) == (32, False)
    s.run(Request("M", a, mm_features=[image]))
    other = MultiModalFeatureSpec(None, "image", "img-hash-2", PlaceholderRange(40, 10))
    assert c.get_num_new_matched_tokens(Request("x5", a, mm_features=[image]), 0) == (96, False)
    assert c.get_num_new_matched_tokens(Request("x6", a, mm_features=[other]), 0) == (32, False)
    assert s.wrong == 0


def test_chunked_prefill_saves_each_chunk_and_async_commit_holds_blocks(setup):
    s = setup(budget=40)  # 40 tokens a step: the prompt in chunks
    a = prompt(130, seed=6)
    outs = s.run(Request("A", a))
    saves = [[(sp.first, sp.count) for sp in o.kv_connector_metadata.saves] for o, _ in outs]
    assert [x for x in saves if x] == [[(0, 2)], [(2, 3)], [(5, 2)], [(7, 1)]]
    # Each chunk hangs from the last one's blocks: all 8 stored, none skipped.
    assert s.stats[0]["saved_blocks"] == 8 and s.stats[0]["save_not_reserved"] == 0
    # request_finished kept the blocks until every rank reported the commits done.
    assert any(kv.finished_sending == {"A"} for _, kv in outs)
    assert not s.sched.delayed and len(s.sched.free) == s.p["num_blocks"]
    b = prompt(140, seed=7, prefix=a[:128])
    s.run(Request("B", b))
    assert s.stats[0]["loaded_blocks"] == 8 and s.wrong == 0
    check_kv(s, "B", 140)


def test_chunk_reserves_while_the_last_chunk_commits(setup, daemon):
    """Chunked prefill with the worker's committing thread held: each chunk's save reserves
    under the last chunk's blocks while that chunk's commit is still queued (kvcd takes a
    parent the same client reserved and has not committed), so no step waits for the
    thread; once it runs, the commits land in order and a second request loads every block,
    byte for byte."""
    from kvcd.vllm import span_keys
    s = setup(budget=40)
    a = prompt(130, seed=16)
    s.workers[0].call("hold_commits")
    s.sched.add(Request("A", a))
    for _ in range(4):  # the prompt's four chunks
        t0 = time.monotonic()
        s.step()
        assert time.monotonic() - t0 < 10  # not the connector's wait for the commits
    st = s.stats[0]
    assert st["save_reserved"] == 8 and st.get("save_not_reserved", 0) == 0
    assert st.get("saved_blocks", 0) == 0 and st.get("save_waited_for_commits", 0) == 0
    with kvcd.Client(daemon.socket) as c:
        ns = s.ns(c)
        assert c.stats(ns.id)["reserved_chained_blocks"] == 6  # chunks 2, 3 and 4
        with ns.lookup(span_keys(ns, a, [(0, b"")], 8)) as lease:
            assert len(lease) == 0  # nothing committed yet
    s.workers[0].call("release_commits")
    outs = s.run()
    assert any(kv.finished_sending == {"A"} for _, kv in outs)
    assert s.stats[0]["saved_blocks"] == 8 and s.stats[0].get("save_failed", 0) == 0
    with kvcd.Client(daemon.socket) as c:
        assert c.stats(s.ns(c).id)["commit_parent_busy"] == 0
    b = prompt(140, seed=17, prefix=a[:128])
    s.run(Request("B", b))
    assert s.stats[0]["loaded_blocks"] == 8 and s.wrong == 0
    check_kv(s, "B", 140)


def test_two_tensor_parallel_ranks(setup, daemon):
    s = setup(tp=2)
    a = prompt(70, seed=8)
    s.run(Request("A", a))
    assert [st["saved_blocks"] for st in s.stats] == [4, 4]  # each rank its shard
    b = prompt(75, seed=9, prefix=a[:64])
    s.run(Request("B", b))
    assert [st["loaded_blocks"] for st in s.stats] == [4, 4] and s.wrong == 0
    check_kv(s, "B", 75)
    # A hit counts only where every rank has it: rank 1's shard gone, no external tokens.
    with kvcd.Client(daemon.socket) as c:
        assert c.evict(s.ns(c, 1).id) >= 4
    assert s.sched_conn.get_num_new_matched_tokens(Request("C", b), 0) == (0, False)


def test_the_documented_configuration(setup):
    """docs/engines.md's `vllm serve --kv-transfer-config` loads this connector as vLLM's
    factory would (vllm_driver.configs uses the same module path, class and role), its extra
    config works (the socket pointed at the test's kvcd), and every extra key the page lists
    is one the connector reads, and every key it reads is listed."""
    import importlib
    import json
    import os
    import re
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "engines.md")).read()
    m = re.search(r"--kv-transfer-config '(.*?)'", doc, re.S)
    cfg = json.loads(m.group(1))
    assert (cfg["kv_connector_module_path"], cfg["kv_connector"], cfg["kv_role"]) == (
        "kvcd.vllm", "KvcdConnector", "kv_both")
    assert getattr(importlib.import_module(cfg["kv_connector_module_path"]),
                   cfg["kv_connector"]) is importlib.import_module("kvcd.vllm").KvcdConnector
    listed = re.search(r"^`kv_connector_extra_config`: (.*?)\n\n", doc, re.S | re.M).group(1)
    names = re.findall(r"`(\w+)`\s\(", listed)
    assert {"socket", "model_id", "layerwise", "async_save", "disk_wait_s"} <= set(names)
    src = open(importlib.import_module("kvcd.vllm").__file__).read()
    for name in names:
        assert 'extra.get("%s"' % name in src, "docs/engines.md lists %s, unread" % name
    read = set(re.findall(r'extra\.get\("(\w+)"', src))
    assert read <= set(names), "read, not in docs/engines.md: %s" % sorted(read - set(names))
    extra = {k: v for k, v in cfg["kv_connector_extra_config"].items() if k != "socket"}
    s = setup(**extra)
    a = prompt(64, seed=7)
    s.run(Request("A", a))
    req = Request("B", prompt(80, seed=8, prefix=a))
    assert s.sched_conn.get_num_new_matched_tokens(req, 0) == (64, False)
    s.run(req)
    assert s.wrong == 0


def test_the_optional_hooks_vllm_asks(setup):
    """What vLLM reads from a connector beyond the abstract methods (base.py at 003df29):
    the class-level questions its config and factory ask before any instance exists, the
    properties the scheduler reads, and the per-step hooks the worker and the scheduler
    call (driven every step by vllm_driver / vllm_worker)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                                    supports_hma)
    from kvcd.vllm import KvcdConnector
    # Layer-by-layer loads and saves need piecewise CUDA graphs; without them, none.
    assert KvcdConnector.requires_piecewise_for_cudagraph({}) is True
    assert KvcdConnector.requires_piecewise_for_cudagraph({"layerwise": True}) is True
    assert KvcdConnector.requires_piecewise_for_cudagraph({"layerwise": False}) is False
    assert KVConnectorBase_V1.requires_piecewise_for_cudagraph({}) is False
    s = setup()
    vc, _, _ = drv.configs(s.p)
    assert KvcdConnector.get_required_kvcache_layout(vc) == "NHD"  # libkvc's, not HND
    # A hybrid-allocator connector: vLLM keeps its hybrid allocator on and calls
    # request_finished_all_groups, with one group too (test_hybrid_* drive several).
    assert supports_hma(KvcdConnector)
    assert KvcdConnector.build_kv_connector_stats() is None
    c = s.sched_conn
    # kv_both is a producer role, for which vLLM's default asks for reliable delivery
    # (recompute a request preempted while its save commits); a cache does not need it.
    assert vc.kv_transfer_config.is_kv_producer
    assert c.requires_kv_delivery is False
    assert c.get_finished_count() is None and c.has_pending_push_work() is False
    a = prompt(100, seed=11)
    outs = s.run(Request("A", a))
    assert s.sched.events == []  # take_events, after every step's output
    for _, kv_out in outs:
        assert kv_out.kv_connector_stats is None and kv_out.kv_connector_worker_meta is None
        assert kv_out.kv_cache_events is None
    # The last steps only wait for the commits: no tokens, no forward, no layer hook.
    assert outs[-1][0].total_num_scheduled_tokens == 0
    assert any(kv.finished_sending == {"A"} for _, kv in outs)
    assert s.stats[0]["saved_blocks"] == 6


def test_saves_when_a_replayed_cuda_graph_skips_the_layer_hooks(setup, daemon):
    """A full CUDA graph's replay runs the attention but not save_kv_layer (vLLM's
    requires_piecewise_for_cudagraph exists for this): the blocks reserved for the step's
    saves must still hold the KV the model wrote when wait_for_save commits them, never
    unwritten slots another request then loads."""
    s = setup()
    a = prompt(100, seed=12)
    s.run(Request("A", a), layer_hooks=False)
    assert s.stats[0]["saved_blocks"] == 6
    with kvcd.Client(daemon.socket) as c:
        from kvcd.vllm import span_keys
        ns = s.ns(c)
        with ns.lookup(span_keys(ns, a, [(0, b"")], 6)) as lease:
            assert len(lease) == 6
            for i in range(6):
                blk = torch.frombuffer(bytearray(lease[i]), dtype=torch.float16).view(
                    2, 2, BS, 2, 16)
                for layer in range(2):
                    for kind in range(2):
                        want = drv.kv_values(tuple(a[:(i + 1) * BS]), layer, kind, 0, 2, 16)
                        assert torch.equal(blk[layer, kind], want[i * BS:]), (i, layer, kind)
    assert s.stats[0]["save_layers_gathered_late"] == 2  # both layers, at wait_for_save
    b = prompt(110, seed=13, prefix=a[:96])
    req_b = Request("B", b)
    s.run(req_b)
    assert req_b.num_external_computed_tokens == 96
    assert s.stats[0]["loaded_blocks"] == 6 and s.wrong == 0
    check_kv(s, "B", 110)


def test_preempted_request_resumes_from_what_it_saved(setup, daemon):
    """vLLM preempts a running request: its blocks are freed at once and another request
    writes into them; the request comes back as a resumed cached request (resumed_req_ids,
    all its block ids anew) whose first chunk, saved before the preemption, is found by
    get_num_new_matched_tokens and loaded into its new blocks."""
    from kvcd.vllm import span_keys
    s = setup(budget=40)
    a = prompt(130, seed=14)
    s.sched.add(Request("A", a))
    out1, _ = s.step()
    assert [(sp.first, sp.count) for sp in out1.kv_connector_metadata.saves] == [(0, 2)]
    old_ids = list(s.sched.blocks["A"])
    with kvcd.Client(daemon.socket) as c:  # the first chunk's commit lands
        ns = s.ns(c)
        keys = span_keys(ns, a, [(0, b"")], 2)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            with ns.lookup(keys) as lease:
                if len(lease) == 2:
                    break
            time.sleep(0.01)
    s.sched.preempt("A")
    s.sched.waiting.insert(0, Request("B", prompt(40, seed=15)))  # takes A's old blocks
    outs = s.run()
    assert outs[0][0].preempted_req_ids == {"A"}
    resumed = [o for o, _ in outs if "A" in o.scheduled_cached_reqs.resumed_req_ids]
    assert len(resumed) == 1
    assert [(sp.req_id, sp.first, sp.count) for sp in resumed[0].kv_connector_metadata.loads] \
        == [("A", 0, 2)]
    new_ids = s.sched.done["A"][1]
    assert not set(new_ids[:2]) & set(old_ids[:3])  # B's blocks now, written by B
    assert s.stats[0]["loaded_blocks"] == 2 and s.wrong == 0
    check_kv(s, "A", 130)
    # Every block of A stored once, none refused: 8 of A, 2 of B.
    assert s.stats[0]["saved_blocks"] == 10 and s.stats[0]["save_not_reserved"] == 0


# A hybrid model as vLLM's hybrid allocator groups it: full-attention layers 0 and 2 in
# group 0, sliding-window layers 1 and 3 (a 32-token window: 2 blocks) in group 1.
HYBRID = [((0, 2), 0), ((1, 3), 32)]


def saved_kv(daemon, s, group, tokens, nblocks):
    """{block: bytes as [layer][k/v][token][head][dim]} of a group's namespace for the
    prefix of nblocks blocks of tokens (a window group: the window's blocks)."""
    from kvcd.vllm import span_keys
    with kvcd.Client(daemon.socket) as c:
        ns = s.ns(c, group=group)
        # Every group's blocks are under the first group's keys (one chain for hybrid_lookup).
        keys = span_keys(s.ns(c, group=0), tokens, [(0, b"")], nblocks)
        with ns.lookup(keys) as lease:
            return {lease.first + i: torch.frombuffer(bytearray(lease[i]), dtype=torch.float16)
                    .view(2, 2, BS, 2, 16).clone() for i in range(len(lease))}


def check_saved(daemon, s, group, tokens, nblocks, want_blocks):
    """The group's namespace holds the model's KV of each of want_blocks, element by
    element (layers of the group in order)."""
    got = saved_kv(daemon, s, group, tokens, nblocks)
    assert sorted(got) == list(want_blocks)
    layers = s.p["groups"][group]["layers"]
    for b in want_blocks:
        for j, layer in enumerate(layers):
            for kind in range(2):
                want = drv.kv_values(tuple(tokens[:(b + 1) * BS]), layer, kind, 0, 2, 16)
                assert torch.equal(got[b][j, kind], want[b * BS:]), (group, b, layer, kind)


def test_hybrid_groups_save_and_load_per_group(setup, daemon):
    """Two KV cache groups (full attention, sliding window): one namespace each, of the
    group's kind; the first request's blocks are saved into both; a second request with the
    same prefix gets all of it as external tokens and loads the full-attention group's 6
    blocks and the window group's last 2 (vLLM gives the 4 before them the null block),
    which hold exactly what the first request saved; its attention reads only right KV."""
    s = setup(groups=HYBRID)
    a = prompt(100, seed=21)
    s.run(Request("A", a))
    st = s.stats[0]
    assert (st["saved_blocks_g0"], st["saved_blocks_g1"]) == (6, 6)
    with kvcd.Client(daemon.socket) as c:
        kinds = {n["model_id"]: n["kv_kind"] for n in c.namespaces()}
    lay = s.sched_conn._lay
    assert [kinds[g.ns_name(0)] for g in lay.groups] == ["kv", "kv_window"]
    assert lay.groups[1].window == 32 and lay.groups[0].ns_name(0).startswith(
        lay.model_id + "/g0-")
    check_saved(daemon, s, 0, a, 6, range(6))
    check_saved(daemon, s, 1, a, 6, [4, 5])  # the window of the 6-block prefix
    b = prompt(120, seed=22, prefix=a[:96])
    req_b = Request("B", b)
    assert s.sched_conn.get_num_new_matched_tokens(req_b, 0) == (96, False)
    assert s.sched_conn.get_num_new_matched_tokens(req_b, 32) == (64, False)
    outs = s.run(req_b)
    (out, kv_out) = outs[0]
    assert req_b.num_external_computed_tokens == 96
    [load] = out.kv_connector_metadata.loads
    assert (load.first, load.count) == (0, 6)
    full_ids, win_ids = load.group_block_ids
    assert 0 not in full_ids and win_ids[:4] == [0, 0, 0, 0] and 0 not in win_ids[4:]
    assert not kv_out.invalid_block_ids
    st = s.stats[0]
    assert (st["loaded_blocks"], st["loaded_blocks_g0"], st["loaded_blocks_g1"]) == (6, 6, 2)
    assert s.wrong == 0
    check_kv(s, "B", 120)
    # B saved its 7 blocks' new ones only: block 6 in each group.
    assert (st["saved_blocks_g0"], st["saved_blocks_g1"]) == (7, 7)


def test_hybrid_window_load_skips_the_null_blocks(setup, daemon):
    """A 33-token window over 16-token blocks: kvcd's window of a 6-block prefix is its last
    3 blocks (ceil(33 / 16)), while vLLM keeps only the last 2 (the query after token 96
    sees tokens 64..96) and gives blocks 0-3 the null block. The load writes blocks 4 and 5
    only: a load from the window's first block would write block 3's KV into the null
    block, which the worker counts as wrong."""
    s = setup(groups=[((0, 2), 0), ((1, 3), 33)])
    a = prompt(100, seed=31)
    s.run(Request("A", a))
    check_saved(daemon, s, 1, a, 6, [3, 4, 5])  # kvcd's window: 3 blocks
    b = prompt(120, seed=32, prefix=a[:96])
    req_b = Request("B", b)
    outs = s.run(req_b)
    (out, kv_out) = outs[0]
    assert req_b.num_external_computed_tokens == 96
    [load] = out.kv_connector_metadata.loads
    full_ids, win_ids = load.group_block_ids
    assert win_ids[:4] == [0, 0, 0, 0] and 0 not in win_ids[4:]
    st = s.stats[0]
    assert (st["loaded_blocks_g0"], st["loaded_blocks_g1"]) == (6, 2)
    assert not kv_out.invalid_block_ids and s.wrong == 0
    check_kv(s, "B", 120)


def test_hybrid_window_missing_a_block_shortens_the_match(setup, daemon):
    """The full-attention group holds 6 blocks of a prefix, the window group only blocks
    0-3 (its namespace evicted, then a 4-block prompt stored them again): the 6-block
    prefix lacks its window (blocks 4 and 5), the 4-block one has it (2 and 3), so a
    request with the 6-block prefix is given 64 tokens, not 96, and reads only right KV."""
    s = setup(groups=HYBRID)
    a = prompt(100, seed=23)
    s.run(Request("A", a))
    with kvcd.Client(daemon.socket) as c:
        assert c.evict(s.ns(c, group=1).id) >= 2
    req = Request("X", prompt(100, seed=24, prefix=a[:96]))
    assert s.sched_conn.get_num_new_matched_tokens(req, 0) == (0, False)  # no window at all
    s.run(Request("C", prompt(70, seed=25, prefix=a[:64])))
    assert s.stats[0]["saved_blocks_g1"] == 10 and s.stats[0]["saved_blocks_g0"] == 6
    check_saved(daemon, s, 1, a, 4, [2, 3])
    b = prompt(110, seed=26, prefix=a[:96])
    req_b = Request("B", b)
    assert s.sched_conn.get_num_new_matched_tokens(req_b, 0) == (64, False)
    outs = s.run(req_b)
    assert req_b.num_external_computed_tokens == 64
    [load] = outs[0][0].kv_connector_metadata.loads
    assert (load.first, load.count) == (0, 4)
    assert not outs[0][1].invalid_block_ids
    st = s.stats[0]
    assert (st["loaded_blocks_g0"], st["loaded_blocks_g1"]) == (4, 2)
    assert s.wrong == 0
    check_kv(s, "B", 110)


def test_hybrid_configs_refused_or_mapped():
    """A Mamba group maps to a state namespace in vLLM's align mode and is refused, with an
    error naming why, in its other cache modes and with speculative blocks, as is a spec
    class with no namespace kind and groups of different block sizes; MLA and chunked local
    attention groups map to k_only and kv_window namespaces."""
    from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec,
                                            KVCacheConfig, KVCacheGroupSpec,
                                            MLAAttentionSpec, MambaSpec)
    from kvcd.vllm import _Layout

    def layout(*specs):
        p = dict(model="test/cfg", block_size=BS, layers=2, heads=2, head_size=16,
                 num_blocks=8, tp=1, extra={})
        vc, _, _ = drv.configs(p)
        kc = KVCacheConfig(num_blocks=8, kv_cache_groups=[
            KVCacheGroupSpec(["l%d" % i], spec) for i, spec in enumerate(specs)])
        return _Layout(vc, kc, {})

    full = FullAttentionSpec(BS, num_kv_heads=2, head_size=16, dtype=torch.float16)
    mamba = MambaSpec(BS, shapes=((4, 8), (2, 8, 16)), dtypes=(torch.float16, torch.float32))
    with pytest.raises(ValueError, match="mamba_cache_mode 'none'.*align"):
        layout(full, mamba)
    with pytest.raises(ValueError, match="mamba_cache_mode 'all'"):
        layout(full, MambaSpec(BS, shapes=((4, 8),), dtypes=(torch.float16,),
                               mamba_cache_mode="all"))
    with pytest.raises(ValueError, match="2 speculative blocks"):
        layout(full, MambaSpec(BS, shapes=((4, 8),), dtypes=(torch.float16,),
                               mamba_cache_mode="align", num_speculative_blocks=2))
    # Mixed dtypes: int8 bytes, 4*8*2 + 2*8*16*4 = 1088 a layer; one dtype: its elements.
    lay = layout(full, MambaSpec(BS, shapes=((4, 8), (2, 8, 16)), dtypes=(
        torch.float16, torch.float32), mamba_cache_mode="align"),
        MambaSpec(BS, shapes=((3, 8), (2, 4, 4)), dtypes=(torch.bfloat16, torch.bfloat16),
                  mamba_cache_mode="align"))
    assert [(g.kind, g.dtype, g.heads * g.head_size) for g in lay.groups[1:]] == [
        ("state", "int8", 1088), ("state", "bf16", 56)]
    assert lay.groups[1].ns_name(1).endswith("/tp1-1")  # a rank's shard, as KV heads
    # A model of Mamba layers only: one state group, mapped as a hybrid model's.
    lay = layout(MambaSpec(BS, shapes=((4, 8),), dtypes=(torch.float16,),
                           mamba_cache_mode="align"))
    assert [g.kind for g in lay.groups] == ["state"]
    with pytest.raises(ValueError, match="different block sizes"):
        layout(full, FullAttentionSpec(2 * BS, num_kv_heads=2, head_size=16,
                                       dtype=torch.float16))

    class OtherSpec(FullAttentionSpec):
        pass
    with pytest.raises(ValueError, match="OtherSpec"):
        layout(full, OtherSpec(BS, num_kv_heads=2, head_size=16, dtype=torch.float16))
    lay = layout(full, MLAAttentionSpec(BS, num_kv_heads=1, head_size=64,
                                        dtype=torch.float16),
                 ChunkedLocalAttentionSpec(BS, num_kv_heads=2, head_size=16,
                                           dtype=torch.float16, attention_chunk_size=40))
    assert [(g.kind, g.window, g.heads) for g in lay.groups] == [
        ("kv", 0, 2), ("k_only", 0, 1), ("kv_window", 40, 2)]
    assert lay.groups[1].ns_name(3).endswith("/mla")
    # vLLM's chunked local manager keeps the chunk a prefix's next token is in.
    assert [lay.groups[2].skipped(n) for n in (2, 3, 5, 6)] == [0, 2, 5, 5]


def test_hybrid_chunked_prefill_and_two_ranks(setup, daemon):
    """A hybrid model over two tensor-parallel ranks with chunked prefill (40 tokens a
    step): each chunk's blocks go into each group's namespace of each rank (a chunk hangs
    from the last one's in the window namespace too), the scheduler frees the window
    group's blocks no query sees any more as the prompt advances, and a second request with
    the prefix gets it only where every group of every rank has it."""
    s = setup(tp=2, budget=40, groups=HYBRID)
    a = prompt(130, seed=27)
    outs = s.run(Request("A", a))
    saves = [[(sp.first, sp.count) for sp in o.kv_connector_metadata.saves] for o, _ in outs]
    assert [x for x in saves if x] == [[(0, 2)], [(2, 3)], [(5, 2)], [(7, 1)]]
    for st in s.stats:
        assert (st["saved_blocks_g0"], st["saved_blocks_g1"]) == (8, 8)
        assert st["save_not_reserved"] == 0
    b = prompt(140, seed=28, prefix=a[:128])
    req_b = Request("B", b)
    assert s.sched_conn.get_num_new_matched_tokens(req_b, 0) == (128, False)
    s.run(req_b)
    assert req_b.num_external_computed_tokens == 128
    assert [(st["loaded_blocks_g0"], st["loaded_blocks_g1"]) for st in s.stats] == [(8, 2)] * 2
    assert s.wrong == 0
    check_kv(s, "B", 140)
    # Rank 1's window namespace gone: no rank's prefix is usable.
    with kvcd.Client(daemon.socket) as c:
        assert c.evict(s.ns(c, 1, group=1).id) >= 2
    assert s.sched_conn.get_num_new_matched_tokens(Request("C", b), 0) == (0, False)


def evict_group_before_load(daemon, s, group, at_least):
    """(seen, hook) for s.run's before_workers: the hook records the step's one load's
    group block ids in seen["ids"] and evicts that group's namespace (at least `at_least`
    blocks), after the scheduler counted them and before the workers load."""
    seen = {}

    def evict(out):
        [load] = out.kv_connector_metadata.loads
        seen["ids"] = load.group_block_ids
        with kvcd.Client(daemon.socket) as c:
            assert c.evict(s.ns(c, group=group).id) >= at_least
    return seen, evict


def test_hybrid_window_evicted_between_scheduling_and_loading(setup, daemon):
    """The window group's blocks evicted after the scheduler counted them: the worker's
    lookup finds no usable prefix, every group's blocks of the load (those vLLM gave it a
    block for) are reported through get_block_ids_with_load_errors, and the request is
    recomputed, never reading wrong KV."""
    s = setup(groups=HYBRID)
    a = prompt(80, seed=29)
    s.run(Request("A", a))
    seen, evict = evict_group_before_load(daemon, s, 1, 2)
    outs = s.run(Request("B", prompt(90, seed=30, prefix=a[:64])), before_workers=evict)
    full_ids, win_ids = seen["ids"]
    assert win_ids[:2] == [0, 0]  # a 64-token prefix's window: blocks 2 and 3
    assert outs[0][1].invalid_block_ids == set(full_ids[:4]) | set(win_ids[2:4])
    assert s.stats[0]["load_missing_blocks"] == 4 and s.stats[0].get("loaded_blocks", 0) == 0
    assert len(outs) >= 2 and s.wrong == 0
    check_kv(s, "B", 90)


def test_hybrid_preempted_request_resumes_per_group(setup, daemon):
    """A hybrid request preempted after its first chunk was saved: its blocks of every group
    are freed and written by another request; it resumes (resumed_req_ids, every group's
    block ids anew) by loading that chunk into each group's new blocks."""
    from kvcd.vllm import span_keys
    s = setup(budget=40, groups=HYBRID)
    a = prompt(130, seed=31)
    s.sched.add(Request("A", a))
    out1, _ = s.step()
    assert [(sp.first, sp.count) for sp in out1.kv_connector_metadata.saves] == [(0, 2)]
    old_ids = [list(g) for g in s.sched.blocks["A"]]
    with kvcd.Client(daemon.socket) as c:  # the first chunk's commits land, in both groups
        keys = span_keys(s.ns(c, group=0), a, [(0, b"")], 2)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            with kvcd.hybrid_lookup([s.ns(c, group=0), s.ns(c, group=1)], keys) as hit:
                if hit.length == 2:
                    break
            time.sleep(0.01)
    s.sched.preempt("A")
    s.sched.waiting.insert(0, Request("B", prompt(40, seed=32)))  # takes A's old blocks
    outs = s.run()
    resumed = [o for o, _ in outs if "A" in o.scheduled_cached_reqs.resumed_req_ids]
    assert len(resumed) == 1
    [load] = resumed[0].kv_connector_metadata.loads
    assert (load.req_id, load.first, load.count) == ("A", 0, 2)
    new_ids = s.sched.done["A"][1]
    assert not set(new_ids[0][:2]) & set(old_ids[0][:3] + old_ids[1][:3])
    st = s.stats[0]
    assert (st["loaded_blocks_g0"], st["loaded_blocks_g1"]) == (2, 2) and s.wrong == 0
    check_kv(s, "A", 130)
    assert (st["saved_blocks_g0"], st["saved_blocks_g1"]) == (10, 10)
    assert st["save_not_reserved"] == 0


# A hybrid model with Mamba layers (Qwen3.5 / Jamba style): full-attention layers 0 and 2 in
# group 0, Mamba layers 1 and 3 in group 1 (vLLM's align mode: a state at block boundaries).
HYMAMBA = [((0, 2), 0), ((1, 3), drv.MAMBA)]


def state_bytes(tokens, n, layers=(1, 3), rank=0):
    """The state block kvcd keeps for the prefix tokens[:n]: each Mamba layer's conv then
    SSM state, as the run without a cache has them."""
    out = b""
    for layer in layers:
        conv, ssm = drv.state_value(tokens, n, layer, rank)
        out += conv.numpy().tobytes() + ssm.numpy().tobytes()
    return out


def saved_state(daemon, s, tokens, nblocks, rank=0):
    """(first, bytes) of the state group's answer for the prefix of nblocks blocks."""
    from kvcd.vllm import span_keys
    with kvcd.Client(daemon.socket) as c:
        keys = span_keys(s.ns(c, rank, group=0), tokens, [(0, b"")], nblocks)
        with s.ns(c, rank, group=1).lookup(keys) as lease:
            return (lease.first, bytes(lease[0])) if len(lease) else (None, None)


def test_mamba_group_saves_and_loads_the_state(setup, daemon):
    """A full-attention and a Mamba group: the first request's prompt (100 tokens) runs as
    vLLM's align mode splits it (96 tokens, then 4), so the state after block 5 is saved
    with the 6 blocks of KV, byte for byte the model's; a second request with the 96-token
    prefix gets it as external tokens, loads the KV and that state into the blocks vLLM
    reads it from, and its Mamba layers start from exactly the state a run without a cache
    has there: its output equals a run without kvcd's."""
    s = setup(groups=HYMAMBA)
    a = prompt(100, seed=41)
    outs = s.run(Request("A", a))
    assert [o.num_scheduled_tokens["A"] for o, _ in outs if "A" in o.num_scheduled_tokens] \
        == [96, 4]
    st = s.stats[0]
    assert (st["saved_blocks_g0"], st["saved_states_g1"]) == (6, 1)
    with kvcd.Client(daemon.socket) as c:
        kinds = {n["model_id"]: n["kv_kind"] for n in c.namespaces()}
    assert kinds[s.sched_conn._lay.groups[1].ns_name(0)] == "state"
    assert saved_state(daemon, s, a, 6) == (5, state_bytes(a, 96))
    b = prompt(120, seed=42, prefix=a[:96])
    req_b = Request("B", b)
    assert s.sched_conn.get_num_new_matched_tokens(req_b, 0) == (96, False)
    outs = s.run(req_b)
    out, kv_out = outs[0]
    assert req_b.num_external_computed_tokens == 96
    [load] = out.kv_connector_metadata.loads
    assert (load.first, load.count, load.step_end) == (0, 6, 112)  # 96 + 16 (block aligned)
    state_ids = load.group_block_ids[1]
    assert state_ids[:5] == [0] * 5 and 0 not in (state_ids[5], state_ids[6])
    assert not kv_out.invalid_block_ids
    st = s.stats[0]
    assert (st["loaded_blocks_g0"], st["loaded_states_g1"]) == (6, 1)
    assert s.wrong == 0
    check_kv(s, "B", 120)
    assert s.outputs[0]["B"] == state_bytes(b, 120)
    # The same request where kvcd has nothing (another model id): the same output.
    fresh = setup(groups=HYMAMBA)
    fresh.run(Request("B", b))
    assert fresh.stats[0].get("loaded_states_g1", 0) == 0
    assert fresh.outputs[0]["B"] == s.outputs[0]["B"]


def test_mamba_hits_withheld_where_vllm_asserts_none_come(setup, daemon, monkeypatch):
    """vLLM's scheduler as read at 00024d3 asserts that no external tokens reach a model
    with Mamba layers: under such a vLLM the connector reports no hit for it (the engine
    would stop at the first) and says so in its stats, while a full-attention model's hits
    and a vLLM without the assert are untouched. The detection reads the scheduler's
    source: the assert's line, or its absence, decides."""
    from kvcd import vllm as kv

    class Asserting:
        def _mamba_block_aligned_split(self, request, num_new_tokens,
                                       num_new_local_computed_tokens=0,
                                       num_external_computed_tokens=0):
            assert num_external_computed_tokens == 0, (
                "External KV connector is not verified yet")
            return num_new_tokens

    class Taking:
        def _mamba_block_aligned_split(self, request, num_new_tokens,
                                       num_new_local_computed_tokens=0,
                                       num_external_computed_tokens=0):
            return num_new_tokens

    assert kv.vllm_takes_mamba_external(Asserting) is False
    assert kv.vllm_takes_mamba_external(Taking) is True
    assert kv.vllm_takes_mamba_external(object) is True  # no such split
    s = setup(groups=HYMAMBA)
    a = prompt(100, seed=43)
    s.run(Request("A", a))
    b = prompt(120, seed=44, prefix=a[:96])
    monkeypatch.setattr(kv, "vllm_takes_mamba_external", lambda: False)
    s.sched_conn._mamba_ok = None
    assert s.sched_conn.get_num_new_matched_tokens(Request("B", b), 0) == (0, False)
    assert s.sched_conn.stats["mamba_hits_withheld"] == 1
    monkeypatch.setattr(kv, "vllm_takes_mamba_external", lambda: True)
    s.sched_conn._mamba_ok = None
    assert s.sched_conn.get_num_new_matched_tokens(Request("B", b), 0) == (96, False)


def test_mamba_missing_state_shortens_the_match(setup, daemon):
    """Chunks of 40 tokens run as 32 (align mode ends them at block boundaries): states
    after blocks 1, 3 and 5 are kept. A request sharing 90 tokens has 5 blocks of KV but no
    state after block 4: it gets the 4-block prefix, whose state is there. With the state
    namespace gone, nothing."""
    s = setup(groups=HYMAMBA, budget=40)
    a = prompt(100, seed=43)
    s.run(Request("A", a))
    assert s.stats[0]["saved_states_g1"] == 3
    assert saved_state(daemon, s, a, 6)[0] == 5 and saved_state(daemon, s, a, 5)[0] == 3
    b = prompt(110, seed=44, prefix=a[:90])
    req_b = Request("B", b)
    assert s.sched_conn.get_num_new_matched_tokens(req_b, 0) == (64, False)
    outs = s.run(req_b)
    assert req_b.num_external_computed_tokens == 64
    [load] = outs[0][0].kv_connector_metadata.loads
    assert (load.first, load.count) == (0, 4)
    assert s.wrong == 0 and s.outputs[0]["B"] == state_bytes(b, 110)
    with kvcd.Client(daemon.socket) as c:
        assert c.evict(s.ns(c, group=1).id) >= 3
    assert s.sched_conn.get_num_new_matched_tokens(Request("C", b), 0) == (0, False)


def test_mamba_state_evicted_between_scheduling_and_loading(setup, daemon):
    """The state evicted after the scheduler counted it: the worker loads nothing, reports
    the load's blocks of every group (the full-attention blocks and the state's block)
    through get_block_ids_with_load_errors, saves nothing of that step (its forward ran
    from no state: its blocks 5 and 6 and the state after them would be wrong), and the
    request starts over, recomputing everything: its output and what it saved are the
    model's."""
    s = setup(groups=HYMAMBA)
    a = prompt(80, seed=45)
    s.run(Request("A", a))
    seen, evict = evict_group_before_load(daemon, s, 1, 1)
    b = prompt(120, seed=46, prefix=a)  # A's state is after its 80 tokens: block 4
    outs = s.run(Request("B", b), before_workers=evict)
    full_ids, state_ids = seen["ids"]
    assert outs[0][0].num_scheduled_tokens["B"] == 32  # to block 6's end: a state there
    assert outs[0][1].invalid_block_ids == set(full_ids[:5]) | {state_ids[4]}
    st = s.stats[0]
    assert st["load_missing_blocks"] == 5 and st.get("loaded_states_g1", 0) == 0
    assert st.get("loaded_blocks", 0) == 0 and st["save_skipped_load_failed"] == 2
    assert len(outs) >= 2 and s.wrong == 0
    assert s.outputs[0]["B"] == state_bytes(b, 120)
    assert saved_state(daemon, s, b, 7) == (6, state_bytes(b, 112))
    check_saved(daemon, s, 0, b, 7, range(7))


def test_mamba_chunked_prefill_and_two_ranks(setup, daemon):
    """Two tensor-parallel ranks (each its shard of the state, in a namespace of its own)
    with chunked prefill: each chunk's KV and its end's state are saved per rank; a second
    request with the 128-token prefix loads both ranks' states and KV, and each rank's
    output is the model's; with rank 1's states gone, no rank's prefix is usable."""
    s = setup(tp=2, budget=40, groups=HYMAMBA)
    a = prompt(130, seed=47)
    outs = s.run(Request("A", a))
    assert [o.num_scheduled_tokens["A"] for o, _ in outs if "A" in o.num_scheduled_tokens] \
        == [32, 32, 32, 32, 2]
    for rank, st in enumerate(s.stats):
        assert (st["saved_blocks_g0"], st["saved_states_g1"]) == (8, 4)
        assert saved_state(daemon, s, a, 8, rank) == (7, state_bytes(a, 128, rank=rank))
    b = prompt(140, seed=48, prefix=a[:128])
    req_b = Request("B", b)
    assert s.sched_conn.get_num_new_matched_tokens(req_b, 0) == (128, False)
    s.run(req_b)
    assert req_b.num_external_computed_tokens == 128
    assert [(st["loaded_blocks_g0"], st["loaded_states_g1"]) for st in s.stats] == [(8, 1)] * 2
    assert s.wrong == 0
    check_kv(s, "B", 140)
    for rank in range(2):
        assert s.outputs[rank]["B"] == state_bytes(b, 140, rank=rank)
    with kvcd.Client(daemon.socket) as c:
        assert c.evict(s.ns(c, 1, group=1).id) >= 4
    assert s.sched_conn.get_num_new_matched_tokens(Request("C", b), 0) == (0, False)


def test_sync_save_reports_no_request_as_sent(setup, daemon):
    """Without async_save the commits run in wait_for_save and request_finished frees a
    request's blocks at once: get_finished must not report it as sent later (vLLM's
    scheduler asserts that a request reported so is one whose blocks it kept; the stand-in
    scheduler fails on it)."""
    s = setup(budget=48, async_save=False)
    a = prompt(150, seed=9)
    s.run(Request("A", a))
    s.run(Request("B", prompt(160, seed=10, prefix=a[:144])))
    assert s.stats[0]["saved_blocks"] == 10 and s.stats[0]["loaded_blocks"] == 9
    assert s.wrong == 0
    check_kv(s, "B", 160)
