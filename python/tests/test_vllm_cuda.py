# DESIGN: the device path of kvcd.vllm.KvcdConnector (its KV caches on a CUDA device), driven
# as test_vllm.py drives the connector (its Setup: the stand-in scheduler of vllm_driver.py,
# a real kvcd) but with the worker in this process and its KV caches on the strict fake
# device (tests/lib/fake_dev.c through python/tests/fake_dev_py.c): tensors that look to
# kvcd as torch CUDA tensors do (kvtensors.FakeCudaTensor), and the connector's streams and
# events taken from the fake (kvtensors.FakeStreams in place of kvcd.vllm.streams). The fake
# performs a copy or kernel only when a host wait covers it, and a stream wait
# (wait_stream, wait_event) only orders what a later wait performs: so the model's own work
# is queued on the compute stream as a real model's is (its attention reads each layer's
# KV and writes the step's tokens there with copies of the fake, checked once the host
# waited for the step), and a missing or wrong stream wait in the connector shows as bytes
# read or saved in the wrong order. Checked, on every step of every test:
# - start_load_kv, wait_for_layer_load and save_kv_layer never block the host on the
#   device: no host wait of this thread finds device work still queued before its point,
#   no device or legacy sync (a wait on work already done may run there: a lease released
#   while the committing thread was inside libkvc is freed at the client's next call);
# - wait_for_layer_load(layer i) makes the compute stream wait for the event recorded after
#   layer i's load and for no other (the whole load's one event without "layerwise");
# - what attention reads (every earlier token of the request, queued after the wait) holds
#   the KV the model computes, and a request reported by get_finished has every full block
#   of its prompt in kvcd with the model's bytes.
# And in the tests named so: a second request loads what the first saved, byte for byte;
# the load comes after the compute stream's earlier work on its blocks even where the
# device runs the load stream first; after layer i's wait the next layer's blocks are not
# loaded yet (the loads are layer by layer); commits publish the bytes the step wrote; a
# block evicted between scheduling and loading is reported through
# get_block_ids_with_load_errors and recomputed; the host a step ahead of the device
# (the last step's loads still queued at start_load_kv); a hybrid model's groups.
import contextlib
import os
import pickle

import pytest

torch = pytest.importorskip("torch")

import vllm_driver as drv  # noqa: E402  (puts the vLLM stand-in on sys.path)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.distributed.parallel_state import set_tensor_model_parallel  # noqa: E402
from vllm.forward_context import ForwardContext  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

import kvcd  # noqa: E402
import kvcd.vllm  # noqa: E402
from kvtensors import FakeDevice, FakeStreams, fakedev_path  # noqa: E402
from test_vllm import BS, HYBRID, Setup, daemon, prompt  # noqa: E402,F401  (daemon: a fixture)
from vllm_worker import step_output, wrong_tokens  # noqa: E402

if not os.path.exists(fakedev_path()):
    pytest.skip("the fake device library is not built (make build/tests/check_python)",
                allow_module_level=True)


class CudaWorker:
    """One worker (rank) as vllm_worker.py runs it, in this process, its per-layer KV caches
    on the fake device in vLLM's flash-attn layout [2, num_blocks, block_size, heads, dim]
    or FlashInfer's [num_blocks, 2, ...]. loads_first: the device runs the load stream as
    soon as start_load_kv returns (before the compute stream's earlier work, unless the
    connector ordered it after). probe: after each layer's wait the host waits for the
    compute stream and checks that this layer's loads landed and the next one's did not.
    ahead: the host runs a step ahead of the device (vLLM's async scheduling): it waits for
    a step's work only after the next step's start_load_kv."""

    def __init__(self, p, rank, dev, layout="flash_attn", loads_first=False, probe=False,
                 ahead=False):
        self.p, self.rank, self.dev = p, rank, dev
        self.layout, self.loads_first, self.probe = layout, loads_first, probe
        self.ahead = ahead
        self.unsettled = None  # ahead: the last step's reads, checked once it ran
        set_tensor_model_parallel(rank, p["tp"])
        vc, kc, self.names = drv.configs(p)
        self.heads, self.dim, self.bs = p["heads"] // p["tp"], p["head_size"], p["block_size"]
        self.streams = FakeStreams(dev)
        saved, kvcd.vllm.streams = kvcd.vllm.streams, self.streams
        try:
            self.conn = drv.load_connector(vc, KVConnectorRole.WORKER, kc)
        finally:
            kvcd.vllm.streams = saved
        nb = p["num_blocks"]
        shape = (2, nb, self.bs, self.heads, self.dim)
        if layout == "flashinfer":
            shape = (nb, 2, self.bs, self.heads, self.dim)
        self.caches = {}
        for n in self.names:
            t = dev.empty(shape)
            t.alias.zero_()
            self.caches[n] = t
        self.conn.register_kv_caches(self.caches)
        assert self.conn._cuda  # the device path, not the CPU one
        self.reqs = {}
        self.client = kvcd.Client(p["extra"]["socket"])  # what kvcd holds, read apart
        self.checked_saves = 0
        self.layer_group = drv.group_of_layers(p) or {i: (0, 0) for i in range(len(self.names))}
        self.hybrid = bool(p.get("groups"))
        assert not (self.hybrid and (probe or ahead))
        lay = kvcd.vllm._Layout(vc, kc, p["extra"])
        self.ns = lay.groups[0].open(self.client, rank) if self.hybrid else lay.open(
            self.client, rank)
        self.saved_layers = p["groups"][0]["layers"] if self.hybrid else range(len(self.names))

    def span_ids(self, span, layer):
        """A load's block ids of the group of a model layer."""
        return span.group_block_ids[self.layer_group[layer][0]] if self.hybrid else \
            span.block_ids

    # ---- the model's device work, on the compute stream --------------------------------

    def kv(self, name):
        """The [2, blocks, block_size, heads, dim] view of a layer's cache (host alias)."""
        t = self.caches[name].alias
        return t if self.layout == "flash_attn" else t.transpose(0, 1)

    def page(self, layer, kind, block):
        return self.kv(self.names[layer])[kind, block]  # contiguous in both layouts

    def read(self, layer, kind, block):
        """A copy of a block's page queued on the compute stream (its bytes once the host
        waited for that stream)."""
        src = self.page(layer, kind, block)
        buf = torch.empty_like(src)
        self.dev.copy(buf.data_ptr(), src.data_ptr(), src.numel() * 2, self.streams.compute)
        return buf

    def write(self, layer, kind, block, off, vals):
        vals = vals.contiguous()
        dst = self.page(layer, kind, block)[off:off + len(vals)]
        self.dev.copy(dst.data_ptr(), vals.data_ptr(), vals.numel() * 2, self.streams.compute)

    @contextlib.contextmanager
    def no_host_wait(self, what):
        def counts():
            return [self.dev.stat(k) for k in ("thread_blocking_waits", "device_syncs",
                                               "legacy_syncs")]
        before = counts()
        yield
        assert counts() == before, "%s waited for the device on the host" % what

    # ---- one step, in the model runner's order -------------------------------------------

    def step(self, out, layer_hooks=True):
        out = pickle.loads(pickle.dumps(out))  # as a worker process receives it
        layer_hooks = layer_hooks and out.total_num_scheduled_tokens > 0
        conn, st, bs, layers = self.conn, self.streams, self.bs, len(self.names)
        starts = drv.track_requests(out, self.reqs)
        meta = out.kv_connector_metadata
        conn.bind_connector_metadata(meta)
        conn.handle_preemptions(meta)
        # The pages the loads write, read on the compute stream first: the blocks' last
        # readers (a freed block's earlier owner), which a load must come after.
        prior = [(self.page(li, kind, b).clone(), self.read(li, kind, b))
                 for span in meta.loads for li in range(layers)
                 for b in self.span_ids(span, li)[span.first:span.first + span.count]
                 if b != 0 or not self.hybrid for kind in (0, 1)]
        nrec = len(st.records)
        with self.no_host_wait("start_load_kv"):
            conn.start_load_kv(ForwardContext())
        late = self.settle_last()  # ahead: the last step's wrong reads
        loaded = [ev for ev, s in st.records[nrec:] if s is not st.compute]
        assert len(loaded) in (0, 1, layers)
        if self.loads_first:
            for s in st.made:
                s.synchronize()
        reads = []  # (block id, host buffer, the KV it must hold, tokens of it to compare)
        for li, name in enumerate(self.names):
            if layer_hooks:
                n0 = len(st.compute.waited)
                with self.no_host_wait("wait_for_layer_load"):
                    conn.wait_for_layer_load(name)
                want_ev = [loaded[li if len(loaded) == layers else 0]] if loaded else []
                assert st.compute.waited[n0:] == want_ev, "layer %d waited on another event" % li
                if self.probe and len(loaded) == layers and li + 1 < layers:
                    self.check_layer_landed(meta, li)
            gi, window = self.layer_group[li]
            if self.hybrid:  # vLLM's null block: a load must not write it
                reads += [(0, self.read(li, kind, 0), torch.zeros_like(self.page(li, kind, 0)),
                           bs) for kind in (0, 1)]
            for rid, n in out.num_scheduled_tokens.items():
                r, start = self.reqs[rid], starts[rid]
                ids = r["blocks"][gi]
                # What attention reads: every earlier token (a window: those it sees).
                first = max(0, start - window + 1) if window else 0
                for kind in (0, 1):
                    want = drv.kv_values(tuple(r["tokens"][:start + n]), li, kind, self.rank,
                                         self.heads, self.dim)
                    for blk in range(first // bs, (start + bs - 1) // bs):
                        lo, hi = max(first, blk * bs) - blk * bs, min(bs, start - blk * bs)
                        reads.append((ids[blk], self.read(li, kind, ids[blk])[lo:hi],
                                      want[blk * bs + lo:blk * bs + hi], hi - lo))
                    for blk in range(start // bs, (start + n + bs - 1) // bs):
                        lo, hi = max(start, blk * bs), min(start + n, (blk + 1) * bs)
                        self.write(li, kind, ids[blk], lo - blk * bs, want[lo:hi])
            if layer_hooks:
                with self.no_host_wait("save_kv_layer"):
                    conn.save_kv_layer(name, self.caches[name], None)
        conn.wait_for_save()
        if self.ahead:
            self.unsettled, wrong_at = (reads, prior), []
        else:
            st.compute.synchronize()  # the device ran the step's forward
            wrong_at = self.settle(reads, prior)
            if self.hybrid:  # what the model wrote there (a recompute's early positions)
                for name in self.names:
                    self.kv(name)[:, 0] = 0
        if not self.p["extra"].get("async_save", True):  # committed in wait_for_save
            for rid, n in out.num_scheduled_tokens.items():
                if starts[rid] + n == len(self.reqs[rid]["tokens"]):
                    self.check_saved(rid)
        sending, recving = conn.get_finished(out.finished_req_ids)
        for rid in sending or ():
            self.check_saved(rid)
        failed = conn.get_block_ids_with_load_errors()
        kv_out = step_output(conn, sending, recving, failed)
        return dict(kv_out=kv_out, wrong=late + sum(b not in failed for b in wrong_at),
                    stats=dict(conn.stats), outputs={})

    def settle(self, reads, prior):
        """Checks a step's reads once the host waited for them: the blocks attention read
        wrong (returned), and that no load came before the pages' earlier readers."""
        wrong_at = [b for b, buf, want, m in reads if not torch.equal(buf[:m], want)]
        assert 0 not in wrong_at, "a load wrote vLLM's null block"
        overrun = sum(not torch.equal(buf, old) for old, buf in prior)
        assert overrun == 0, "a load overwrote %d pages before the compute stream's " \
            "earlier reads of them ran" % overrun
        return wrong_at

    def settle_last(self):
        """ahead: waits for the last step's work and counts its wrong reads."""
        if self.unsettled is None:
            return 0
        self.streams.compute.synchronize()
        wrong = len(self.settle(*self.unsettled))
        self.unsettled = None
        return wrong

    def check_layer_landed(self, meta, li):
        """The host waits for the compute stream right after layer li's wait: the loads of
        layer li are there, those of layer li + 1 not yet (the strict fake performs them only
        when a wait covers them: the connector's events are per layer)."""
        self.streams.compute.synchronize()
        for span in meta.loads:
            r = self.reqs[span.req_id]
            for blk in range(span.first, span.first + span.count):
                b = span.block_ids[blk]
                toks = tuple(r["tokens"][:(blk + 1) * self.bs])
                for kind in (0, 1):
                    now = drv.kv_values(toks, li, kind, self.rank, self.heads,
                                        self.dim)[blk * self.bs:]
                    assert torch.equal(self.page(li, kind, b), now), \
                        "layer %d not loaded after its wait" % li
                    assert not self.page(li + 1, kind, b).any(), \
                        "layer %d loaded before its wait: not layer by layer" % (li + 1)

    def check_saved(self, rid):
        """A request get_finished reports (without async_save: one whose prompt ended in
        this step, after wait_for_save): every full block of its prompt is in kvcd, with
        the bytes the model wrote (no commit published a slot before its gather ran)."""
        toks = self.reqs[rid]["tokens"]
        full = len(toks) // self.bs
        keys = kvcd.vllm.span_keys(self.ns, toks, [(0, b"")], full)
        layers = len(self.saved_layers)  # a hybrid model's first group (full attention)
        with self.ns.lookup(keys) as lease:
            assert len(lease) == full, "%s reported with %d of %d blocks in kvcd" % (
                rid, len(lease), full)
            for i in range(full):
                blk = torch.frombuffer(bytearray(lease[i]), dtype=torch.float16).view(
                    layers, 2, self.bs, self.heads, self.dim)
                for j, li in enumerate(self.saved_layers):
                    for kind in (0, 1):
                        want = drv.kv_values(tuple(toks[:(i + 1) * self.bs]), li, kind,
                                             self.rank, self.heads, self.dim)[i * self.bs:]
                        assert torch.equal(blk[j, kind], want), \
                            "%s block %d layer %d saved wrong" % (rid, i, li)
        self.checked_saves += 1

    def call(self, *msg):
        assert msg[0] == "expect"
        _, rid, n = msg
        late = self.settle_last()
        self.streams.sync_all()  # before the host reads device memory
        caches = {name: self.kv(name) for name in self.names}
        return late + wrong_tokens(caches, self.names, self.reqs[rid], n, self.rank,
                                   self.heads, self.dim, self.bs, self.layer_group)

    def close(self):
        self.conn.shutdown()
        self.client.close()


@pytest.fixture
def dev():
    d = FakeDevice()
    d.install()
    yield d
    d.uninstall()


@pytest.fixture
def setup(daemon, dev):
    made = []

    def make(layout="flash_attn", loads_first=False, probe=False, ahead=False, **kw):
        workers = []

        def worker(p, rank):
            workers.append(CudaWorker(p, rank, dev, layout, loads_first, probe, ahead))
            return workers[-1]
        s = Setup(daemon, worker=worker, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()
    assert dev.stat("bad_kinds") == 0 and dev.stat("bad_packs") == 0


def check_kv(s, req_id, n):
    for w in s.workers:
        assert w.call("expect", req_id, n) == 0


@pytest.mark.parametrize("layout,layerwise", [("flash_attn", True), ("flashinfer", True),
                                              ("flash_attn", False)])
def test_cuda_second_request_loads_what_the_first_saved(setup, dev, layout, layerwise):
    s = setup(layout=layout, layerwise=layerwise)
    a = prompt(100, seed=1)
    s.run(Request("A", a))
    assert s.stats[0]["saved_blocks"] == 6
    assert s.workers[0].checked_saves == 1  # get_finished reported A, its blocks checked
    b = prompt(120, seed=2, prefix=a[:96])
    req_b = Request("B", b)
    outs = s.run(req_b)
    out, kv_out = outs[0]
    assert req_b.num_external_computed_tokens == 96
    assert [sp.count for sp in out.kv_connector_metadata.loads] == [6]
    assert not kv_out.invalid_block_ids
    assert s.stats[0]["loaded_blocks"] == 6
    assert s.wrong == 0  # attention read A's KV in B's blocks, after each layer's wait
    check_kv(s, "B", 120)
    assert dev.stat("stream_waits") > 0 and dev.stat("packs") > 0  # the device path ran


def test_cuda_load_is_queued_behind_the_compute_streams_work(setup, dev):
    """The device runs the load stream first wherever it may: the pages the load writes
    are still read, on the compute stream, with their earlier bytes (the worker checks)."""
    s = setup(loads_first=True)
    a = prompt(64, seed=5)
    s.run(Request("A", a))
    outs = s.run(Request("B", prompt(80, seed=6, prefix=a)))
    assert [sp.count for sp in outs[0][0].kv_connector_metadata.loads] == [4]
    assert s.stats[0]["loaded_blocks"] == 4 and s.wrong == 0
    check_kv(s, "B", 80)


@pytest.mark.parametrize("layout", ["flash_attn", "flashinfer"])
def test_cuda_each_layer_waits_for_its_own_load(setup, dev, layout):
    s = setup(layout=layout, probe=True)
    a = prompt(48, seed=7)
    s.run(Request("A", a))
    s.run(Request("B", prompt(60, seed=8, prefix=a)))
    assert s.stats[0]["loaded_blocks"] == 3 and s.wrong == 0
    check_kv(s, "B", 60)


def test_cuda_start_load_kv_never_waits_for_the_last_steps_loads(setup, dev):
    """The host runs a step ahead of the device: when C's start_load_kv runs, B's loads of
    the step before may still be queued. Their leases go once the event after them says
    the device is done (get_finished asks, without waiting), never with a host wait in
    start_load_kv (kvc_release would wait for their copies)."""
    s = setup(ahead=True)
    a = prompt(100, seed=11)
    s.run(Request("A", a))
    s.run(Request("B", prompt(106, seed=12, prefix=a[:96])))  # 6 blocks loaded, none saved
    s.run(Request("C", prompt(40, seed=13)))
    assert s.stats[0]["loaded_blocks"] == 6 and s.wrong == 0
    check_kv(s, "B", 106)
    check_kv(s, "C", 40)


@pytest.mark.parametrize("async_save", [True, False])
def test_cuda_commits_publish_what_the_step_wrote(setup, dev, async_save):
    """Chunked prefill (48 tokens a step): each chunk's blocks gathered on the compute
    stream after the model wrote them and committed after the gathers ran; get_finished
    reports a request once all of them are in kvcd with the model's bytes."""
    s = setup(budget=48, async_save=async_save)
    a = prompt(150, seed=9)
    outs = s.run(Request("A", a))
    assert len(outs) >= 4 and s.stats[0]["saved_blocks"] == 9
    assert s.workers[0].checked_saves == 1
    b = prompt(160, seed=10, prefix=a[:144])
    s.run(Request("B", b))
    assert s.stats[0]["loaded_blocks"] == 9 and s.wrong == 0
    check_kv(s, "B", 160)


def test_cuda_block_evicted_between_scheduling_and_loading(setup, daemon, dev):
    s = setup()
    a = prompt(80, seed=3)
    s.run(Request("A", a))
    seen = {}

    def evict(out):  # after build_connector_meta, before the worker loads
        seen["loads"] = [sp.count for sp in out.kv_connector_metadata.loads]
        with kvcd.Client(daemon.socket) as c:
            assert c.evict(s.ns(c).id) >= 4
    req_b = Request("B", prompt(90, seed=4, prefix=a[:64]))
    outs = s.run(req_b, before_workers=evict)
    assert seen["loads"] == [4]
    ids = s.sched.done["B"][1]
    assert outs[0][1].invalid_block_ids == set(ids[:4])
    assert s.stats[0]["load_missing_blocks"] == 4 and s.stats[0].get("loaded_blocks", 0) == 0
    assert len(outs) >= 2 and s.wrong == 0
    check_kv(s, "B", 90)


@pytest.mark.parametrize("window", [32, 33])
def test_cuda_hybrid_groups_load_per_group(setup, dev, window):
    """A full-attention and a sliding-window KV cache group (test_vllm's HYBRID) on the
    device: each layer waits for its own event whatever its group, the window group's
    load skips vLLM's null block (the worker reads it after each layer's wait; with a
    33-token window kvcd holds 3 blocks of the window, vLLM keeps 2), and the second
    request reads what the first saved in both groups."""
    s = setup(groups=[(HYBRID[0][0], 0), (HYBRID[1][0], window)])
    a = prompt(100, seed=21)
    s.run(Request("A", a))
    st = s.stats[0]
    assert (st["saved_blocks_g0"], st["saved_blocks_g1"]) == (6, 6)
    b = prompt(120, seed=22, prefix=a[:96])
    outs = s.run(Request("B", b))
    [load] = outs[0][0].kv_connector_metadata.loads
    assert load.group_block_ids[1][:4] == [0, 0, 0, 0]
    st = s.stats[0]
    assert (st["loaded_blocks_g0"], st["loaded_blocks_g1"]) == (6, 2)
    assert not outs[0][1].invalid_block_ids and s.wrong == 0
    check_kv(s, "B", 120)
