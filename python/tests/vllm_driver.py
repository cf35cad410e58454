# DESIGN: the vLLM side of the connector conformance test (test_vllm.py), for tests only:
# the configuration both processes build, the connector loaded as vLLM's KVConnectorFactory
# does (kv_connector_module_path + kv_connector), a scheduler that calls the connector in
# vLLM's v1 order (Scheduler.schedule: get_num_new_matched_tokens for a waiting request,
# block allocation, update_state_after_alloc, NewRequestData.from_request -- or, for a
# request preempted earlier, a resumed CachedRequestData entry with all its block ids --
# then build_connector_meta into SchedulerOutput.kv_connector_metadata; update_from_output:
# invalid blocks roll the request back to its first failed block for recompute,
# update_connector_output, take_events, request_finished -- or request_finished_all_groups
# for a SupportsHMA connector -- when a request is done, its blocks freed at once or when
# the workers report it finished sending; preempt as _preempt_request), and the model
# runner of a worker process (vllm_worker.py) that receives the pickled SchedulerOutput as
# vLLM's workers do.
# The "model" writes, for each token, KV that is a pure function of the tokens up to it
# (kv_value), so a loaded block holds right bytes exactly when they equal that function; a
# Mamba layer's states are a recurrence over the tokens (state_step), so a layer started
# from a wrong or missing state gives another result than state_value, the run without a
# cache. With a Mamba group the scheduler follows vLLM's align mode (MambaManager's block
# lists, _mamba_block_aligned_split's chunks) and refuses external tokens, as vLLM's
# scheduler at 00024d3 does, unless the connector says supports_mamba_external_kv.
import functools
import importlib
import os
import pickle
import struct
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join(HERE, "vllm_shim")
if SHIM not in sys.path:
    sys.path.insert(0, SHIM)

from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma  # noqa: E402
from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig,  # noqa: E402
                         ParallelConfig, VllmConfig)
from vllm.v1.core.kv_cache_manager import KVCacheBlock, KVCacheBlocks  # noqa: E402
from vllm.v1.core.sched.output import (CachedRequestData, NewRequestData,  # noqa: E402
                                       SchedulerOutput)
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, MambaSpec, SlidingWindowSpec)

# A Mamba layer's states on one rank (vLLM's MambaSpec shapes and dtypes): a conv state of
# the last 3 tokens' 8 channels and an SSM state of 2 heads x 4 x 8, of other dtypes.
STATE_SHAPES = ((3, 8), (2, 4, 8))
STATE_DTYPES = (torch.float16, torch.float32)
MAMBA = "mamba"  # a group's window in a test setup that makes it a Mamba group


def configs(p):
    """(VllmConfig, KVCacheConfig) of a test setup p (a dict, the same in every process)."""
    vc = VllmConfig(
        model_config=ModelConfig(model=p["model"], dtype="float16"),
        cache_config=CacheConfig(block_size=p["block_size"]),
        parallel_config=ParallelConfig(tensor_parallel_size=p["tp"]),
        kv_transfer_config=KVTransferConfig(
            kv_connector="KvcdConnector", kv_connector_module_path="kvcd.vllm",
            kv_role="kv_both", kv_connector_extra_config=dict(p["extra"])))
    names = ["model.layers.%d.self_attn.attn" % i for i in range(p["layers"])]
    shape = dict(num_kv_heads=p["heads"] // p["tp"], head_size=p["head_size"],
                 dtype=torch.float16)
    if not p.get("groups"):
        kc = KVCacheConfig(num_blocks=p["num_blocks"], kv_cache_groups=[KVCacheGroupSpec(
            names, FullAttentionSpec(p["block_size"], **shape))])
        return vc, kc, names
    # A hybrid model as vLLM's hybrid allocator groups it: one group per kind of layer
    # (p["groups"]: the model's layer indices of each and its window, 0 for full
    # attention), the layer names in model order.
    groups = []
    for g in p["groups"]:
        if g["window"] == MAMBA:  # vLLM's align mode: the states of block boundaries kept
            spec = MambaSpec(p["block_size"], shapes=STATE_SHAPES, dtypes=STATE_DTYPES,
                             mamba_cache_mode="align")
        else:
            spec = (SlidingWindowSpec(p["block_size"], sliding_window=g["window"], **shape)
                    if g["window"] else FullAttentionSpec(p["block_size"], **shape))
        groups.append(KVCacheGroupSpec([names[i] for i in g["layers"]], spec))
    return vc, KVCacheConfig(num_blocks=p["num_blocks"], kv_cache_groups=groups), names


def group_of_layers(p):
    """{model layer index: (group, window)} of a hybrid setup p."""
    return {i: (gi, g["window"]) for gi, g in enumerate(p.get("groups") or ())
            for i in g["layers"]}


def skipped_blocks(window, num_tokens, block_size):
    """The leading blocks vLLM's sliding-window manager gives a request no block for (the
    null block) once num_tokens are computed: those no later query can see."""
    if not window or window == MAMBA:
        return 0
    return max(0, num_tokens - window + 1) // block_size


def _state_input(token, layer, rank, n):
    x = token * 1e-3 + layer * 1.3 + rank * 0.7 + torch.arange(n, dtype=torch.float64) * 0.37
    return torch.sin(x)


def state_step(conv, ssm, token, layer, rank):
    """One token of a Mamba layer's recurrence on `rank`: the conv state shifts the token's
    input in, the SSM state decays and adds it (so every earlier token, and the state it
    started from, shows in the result)."""
    c = _state_input(token, layer, rank, conv.shape[-1]).to(conv.dtype)
    conv = torch.cat([conv[1:], c[None]])
    u = _state_input(token, layer, rank, ssm.numel()).to(torch.float32).view(ssm.shape)
    ssm = ssm * 0.9 + u + conv[0].float().mean()
    return conv, ssm


@functools.lru_cache(maxsize=64)
def _states(tokens, layer, rank):
    conv = torch.zeros(STATE_SHAPES[0], dtype=STATE_DTYPES[0])
    ssm = torch.zeros(STATE_SHAPES[1], dtype=STATE_DTYPES[1])
    out = [(conv, ssm)]
    for t in tokens:
        conv, ssm = state_step(conv, ssm, t, layer, rank)
        out.append((conv, ssm))
    return out


def state_value(tokens, n, layer, rank):
    """(conv, ssm): a Mamba layer's states after tokens[:n] from zero, as a run without a
    cache computes them."""
    return _states(tuple(tokens), layer, rank)[n]


def load_connector(vllm_config, role, kv_cache_config):
    """As vLLM's KVConnectorFactory does for an out-of-tree connector."""
    ktc = vllm_config.kv_transfer_config
    cls = getattr(importlib.import_module(ktc.kv_connector_module_path), ktc.kv_connector)
    return cls(vllm_config, role, kv_cache_config)


@functools.lru_cache(maxsize=64)
def _prefix_hashes(tokens):
    out, h = [], 0
    for t in tokens:
        h = (h * 1000003 + t + 1) % (1 << 61)
        out.append(h % 100003)
    return torch.tensor(out, dtype=torch.float64)


def kv_values(tokens, layer, kind, rank, heads, dim):
    """The KV [len(tokens), heads, dim] the model computes for each token in (layer, K/V) on
    `rank`: token p's is a function of tokens[:p + 1]."""
    base = _prefix_hashes(tuple(tokens)) * 1e-3 + layer * 1.3 + kind * 2.1 + rank * 0.7
    x = base[:, None] + torch.arange(heads * dim, dtype=torch.float64)[None, :] * 0.37
    return torch.sin(x).view(len(tokens), heads, dim).half()


def kv_value(tokens, pos, layer, kind, rank, heads, dim):
    """kv_values of one token."""
    return kv_values(tuple(tokens[:pos + 1]), layer, kind, rank, heads, dim)[pos]


def track_requests(out, reqs):
    """A model runner's requests after SchedulerOutput out (reqs: req_id -> dict(tokens,
    blocks: a list of block ids per KV cache group), updated); returns each scheduled
    request's first token of the step (its num_computed_tokens)."""
    for new in out.scheduled_new_reqs:
        reqs[new.req_id] = dict(tokens=list(new.prompt_token_ids),
                                blocks=[list(g) for g in new.block_ids])
    cached = out.scheduled_cached_reqs
    for i, rid in enumerate(cached.req_ids):
        nb = cached.new_block_ids[i]
        if rid in cached.resumed_req_ids:  # its block ids anew
            reqs[rid]["blocks"] = [list(g) for g in nb]
        elif nb:
            for ids, more in zip(reqs[rid]["blocks"], nb):
                ids += list(more)
    starts = {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs}
    for i, rid in enumerate(cached.req_ids):
        starts[rid] = cached.num_computed_tokens[i]
    return starts


# ---- pickled messages over a pipe, as vLLM sends SchedulerOutput to its workers ----------


def send(f, obj):
    data = pickle.dumps(obj)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def recv(f):
    head = f.read(8)
    if len(head) < 8:
        raise EOFError
    (n,) = struct.unpack("<Q", head)
    return pickle.loads(f.read(n))


class Worker:
    """One worker process (a tensor-parallel rank) of vllm_worker.py."""

    def __init__(self, p, rank):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([SHIM, HERE] + env.get("PYTHONPATH", "").split(
            os.pathsep))
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "vllm_worker.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        send(self.proc.stdin, dict(p, rank=rank))
        assert recv(self.proc.stdout) == "ready"

    def step(self, out, layer_hooks=True):
        send(self.proc.stdin, ("step", out, layer_hooks))
        return recv(self.proc.stdout)

    def call(self, *msg):
        send(self.proc.stdin, msg)
        return recv(self.proc.stdout)

    def close(self):
        try:
            send(self.proc.stdin, ("exit",))
            self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


class MiniScheduler:
    """vLLM's v1 scheduler, cut down to what the connector sees: no local prefix cache,
    one KV cache group, prefill only (each request ends after its prompt), a token budget per
    step (chunked prefill). With `windows` (one per KV cache group, 0 for full attention) it
    is the hybrid allocator's: the groups draw their blocks from one pool whose block 0 is
    the null block; a sliding-window group gets the null block for the blocks a request's
    next query cannot see, when external tokens are allocated (allocate_new_computed_blocks)
    and as it computes (remove_skipped_blocks, which frees them); every connector call gets
    each group's block ids."""

    def __init__(self, connector, num_blocks, block_size, budget=1 << 30, windows=None):
        self.c = connector
        self.bs = block_size
        self.windows = windows
        self.free = list(range(1 if windows else 0, num_blocks))
        self.budget = budget
        self.waiting, self.running = [], []
        self.blocks = {}  # req_id -> block ids
        self.new_blocks = {}  # req_id -> blocks allocated since the last step
        self.delayed = {}  # req_id -> blocks kept for a save in flight
        self.finished_ids = set()
        self.done = {}  # req_id -> Request
        self.asked_again = 0  # get_num_new_matched_tokens answered None
        self.events = []  # what take_events gave
        self.preempted = set()  # preempted since the last SchedulerOutput
        self.resumable = set()  # preempted, not scheduled again yet
        # A connector without SupportsHMA is given the blocks of the one KV cache group.
        self.hma = supports_hma(connector)
        # Mamba groups (align mode), as vLLM's MambaManager keeps them: a request's state
        # block list holds only the running state (block (computed - 1) // block_size) and
        # the one before it (freed a step later), the rest the null block; chunks end at
        # block boundaries (_mamba_block_aligned_split).
        self.mamba = {i for i, w in enumerate(windows or ()) if w == MAMBA}
        self.last_state = {}  # req_id -> index of the previous running state block
        # vLLM's scheduler at the versions read asserts that no external tokens reach its
        # Mamba split; PR #42620 proposed letting those of a connector that says it can.
        self.mamba_external = bool(getattr(connector, "supports_mamba_external_kv", False))

    def add(self, req):
        self.waiting.append(req)

    def preempt(self, req_id):
        """As vLLM's _preempt_request: the running request's blocks are freed at once
        (first in line for the next allocation, so another request's writes land in
        them), it computes nothing, and goes back to the head of the waiting queue; the
        next SchedulerOutput lists it in preempted_req_ids. No connector call: it is
        resumed later through get_num_new_matched_tokens like a new request, then sent as
        a resumed cached request."""
        req = next(r for r in self.running if r.request_id == req_id)
        self.running.remove(req)
        ids = self.blocks.pop(req_id)
        if self.windows:
            ids = [b for g in ids for b in g if b != 0]
        self.free = ids + self.free
        self.last_state.pop(req_id, None)
        req.num_computed_tokens = 0
        req.num_preemptions = getattr(req, "num_preemptions", 0) + 1
        self.preempted.add(req_id)
        self.resumable.add(req_id)
        self.waiting.insert(0, req)

    def _alloc(self, n):
        ids, self.free = self.free[:n], self.free[n:]
        assert len(ids) == n, "out of blocks"
        return ids

    def _alloc_groups(self, num_tokens, computed):
        """Each group's block ids for num_tokens, `computed` of them loaded (null blocks for
        what a window no longer sees; a Mamba group: one block for the state of the loaded
        prefix, at its last block, as vLLM's allocate_new_computed_blocks gives it)."""
        n = -(-num_tokens // self.bs)
        out = []
        for gi, w in enumerate(self.windows):
            if gi in self.mamba:
                h = computed // self.bs
                out.append([0] * (h - 1) + self._alloc(1) if h else [])
                continue
            skip = skipped_blocks(w, computed, self.bs)
            out.append([0] * skip + self._alloc(n - skip))
        return out

    def _mamba_split(self, req, computed, n):
        """vLLM's _mamba_block_aligned_split: a prefill chunk ends at a block boundary, the
        prompt's last full block's end at the latest, so that a state is kept there."""
        if computed < max(req.num_prompt_tokens, req.num_tokens - 1):
            last = req.num_tokens - req.num_tokens % self.bs
            after = computed + n
            if after < last:
                n = n // self.bs * self.bs
            elif computed < last < after:
                n = last - computed
        return n

    def _mamba_grow(self, req_id, computed, n):
        """Each Mamba group's new block ids for a step computing tokens [computed,
        computed + n): the running state's block (computed + n - 1) // block_size, null
        blocks up to it; the previous running block kept one more step (MambaManager's
        allocate_new_blocks and remove_skipped_blocks in align mode)."""
        new = {}
        for gi in self.mamba:
            ids = self.blocks[req_id][gi]
            last = self.last_state.get(req_id)
            if last is not None and last < -(-computed // self.bs) - 1 and ids[last] != 0:
                self.free.append(ids[last])
                ids[last] = 0
            need = -(-(computed + n) // self.bs)
            prev = len(ids)
            if need <= prev:
                new[gi] = []
                continue
            if prev:
                self.last_state[req_id] = prev - 1
            ids += [0] * (need - 1 - prev) + self._alloc(1)
            new[gi] = ids[prev:]
        return new

    def _release(self, ids):
        """Frees a request's blocks: a list, or a hybrid request's lists (not the null
        block)."""
        if self.windows:
            self.free += [b for g in ids for b in g if b != 0]
        else:
            self.free += ids

    def _remove_skipped(self, req):
        for w, ids in zip(self.windows, self.blocks[req.request_id]):
            for i in range(skipped_blocks(w, req.num_computed_tokens, self.bs)):
                if ids[i] != 0:
                    self.free.append(ids[i])
                    ids[i] = 0

    def schedule(self):
        new_reqs, num_sched = [], {}
        cached = CachedRequestData.make_empty()
        budget = self.budget
        for req in self.running:
            left = req.num_tokens - req.num_computed_tokens
            if left <= 0 or budget <= 0:
                continue
            n = min(left, budget)
            if self.mamba:
                n = self._mamba_split(req, req.num_computed_tokens, n)
                if n <= 0:
                    continue
            if self.windows:
                self._remove_skipped(req)
            budget -= n
            num_sched[req.request_id] = n
            cached.req_ids.append(req.request_id)
            if self.mamba:  # the running state's new block
                grown = self._mamba_grow(req.request_id, req.num_computed_tokens, n)
                cached.new_block_ids.append(tuple(grown.get(gi, [])
                                                  for gi in range(len(self.windows))))
            else:
                cached.new_block_ids.append(None)
            cached.num_computed_tokens.append(req.num_computed_tokens)
            cached.num_output_tokens.append(0)
            cached.new_token_ids.append([])
        still = []
        for req in self.waiting:
            if budget <= 0:
                still.append(req)
                continue
            ext, load_async = self.c.get_num_new_matched_tokens(req, 0)
            if ext is None:  # the connector needs more time: asked again next step
                self.asked_again += 1
                still.append(req)
                continue
            assert not load_async and ext % self.bs == 0
            n = min(req.num_tokens - ext, budget)
            if self.mamba:
                assert not ext or self.mamba_external, "External KV connector is not verified yet"
                n = self._mamba_split(req, ext, n)
                if n <= 0:
                    still.append(req)
                    continue
            if self.windows:
                groups = self._alloc_groups(req.num_tokens, ext)
                self.blocks[req.request_id] = groups
                self._mamba_grow(req.request_id, ext, n)
                self.c.update_state_after_alloc(req, KVCacheBlocks(tuple(
                    [KVCacheBlock(i) for i in g] for g in groups)), ext)
                block_ids = tuple(list(g) for g in groups)
            else:
                ids = self._alloc(-(-req.num_tokens // self.bs))
                self.blocks[req.request_id] = ids
                self.c.update_state_after_alloc(req, KVCacheBlocks(([KVCacheBlock(i)
                                                                     for i in ids],)), ext)
                block_ids = (list(ids),)
            req.num_external_computed_tokens = ext
            req.num_computed_tokens = ext
            budget -= n
            num_sched[req.request_id] = n
            if req.request_id in self.resumable:  # resumed: all its block ids anew
                self.resumable.discard(req.request_id)
                cached.req_ids.append(req.request_id)
                cached.resumed_req_ids.add(req.request_id)
                cached.all_token_ids[req.request_id] = list(req.all_token_ids)
                cached.new_block_ids.append(block_ids)
                cached.num_computed_tokens.append(ext)
                cached.num_output_tokens.append(0)
                cached.new_token_ids.append([])
            else:
                new_reqs.append(NewRequestData.from_request(req, block_ids))
            self.running.append(req)
        self.waiting = still
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_sched, total_num_scheduled_tokens=sum(num_sched.values()),
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0], finished_req_ids=self.finished_ids,
            free_encoder_mm_hashes=[], preempted_req_ids=self.preempted)
        self.finished_ids, self.preempted = set(), set()
        out.kv_connector_metadata = self.c.build_connector_meta(out)
        return out

    def update_from_output(self, out, kv_out):
        invalid = set(kv_out.invalid_block_ids or ())
        for req in list(self.running):
            n = out.num_scheduled_tokens.get(req.request_id)
            if n is None:
                continue
            ids = self.blocks[req.request_id]
            if self.windows:  # the first block any group failed to load
                bad = sorted(i for g in ids for i, b in enumerate(g) if b in invalid)
            else:
                bad = [i for i, b in enumerate(ids) if b in invalid]
            if bad and bad[0] * self.bs < req.num_computed_tokens + n:
                if self.mamba:
                    # A Mamba state has no earlier boundary to go back to in the request's
                    # blocks: the request starts over (freed and resumed, as a preemption),
                    # asking the connector again.
                    self.preempt(req.request_id)
                    continue
                # vLLM's recompute policy: back to the first block that failed to load.
                req.num_computed_tokens = min(req.num_computed_tokens, bad[0] * self.bs)
                continue
            req.num_computed_tokens += n
        self.c.update_connector_output(kv_out)
        # After every step's output, as vLLM publishes them: the connector's KV events.
        self.events += list(self.c.take_events() or ())
        for req_id in kv_out.finished_sending or ():
            self._release(self.delayed.pop(req_id))
        for req in list(self.running):
            if req.num_computed_tokens >= req.num_tokens:
                self.running.remove(req)
                self.last_state.pop(req.request_id, None)
                ids = self.blocks.pop(req.request_id)
                groups = tuple(list(g) for g in ids) if self.windows else (list(ids),)
                if self.hma:
                    delay, _ = self.c.request_finished_all_groups(req, groups)
                else:
                    assert not self.windows, "vLLM runs a hybrid model only with SupportsHMA"
                    delay, _ = self.c.request_finished(req, list(ids))
                if delay:
                    self.delayed[req.request_id] = ids
                else:
                    self._release(ids)
                self.finished_ids.add(req.request_id)
                self.done[req.request_id] = (req, ids)

    def idle(self):
        return not self.waiting and not self.running and not self.delayed
