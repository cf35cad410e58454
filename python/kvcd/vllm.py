# DESIGN: kvcd as vLLM's KV connector: KvcdConnector implements KVConnectorBase_V1
# (vllm/distributed/kv_transfer/kv_connector/v1/base.py), written against vLLM's main
# branch as read at commit 003df29 (after v0.20: SchedulerOutput with CachedRequestData's
# resumed_req_ids, KVCacheBlocks.get_block_ids() per group, request_finished(request,
# block_ids), get_block_ids_with_load_errors). vLLM loads it with
#   --kv-transfer-config '{"kv_connector": "KvcdConnector",
#                          "kv_connector_module_path": "kvcd.vllm", "kv_role": "kv_both",
#                          "kv_connector_extra_config": {"socket": "/run/kvcd/kvcd.sock"}}'
# (docs/engines.md lists every extra option and what was not exercised against a real vLLM).
#
# vLLM runs the scheduler and each tensor-parallel worker in processes of their own, and a
# kvcd lease (pins on a connection) never leaves its process: the scheduler side asks kvcd
# how long a prefix is cached with a non-blocking lookup (nowait: hits still being read from
# disk are counted as not yet there, and the request is asked again while they come back)
# and releases it at once (the release is not waited for: the lookup is the scheduler's one
# round trip); the worker looks the same keys up again when it loads (one more
# round trip per request and step, tens of microseconds against a prefill's milliseconds). A
# block evicted in between is a miss in the worker: its vLLM block id is reported through
# get_block_ids_with_load_errors and vLLM recomputes it, so nothing wrong is ever served.
#
# Keys are kvcd's own chained hashes of the token ids (ns.keys_from_tokens), the same in
# every process and run; extra bytes mix in what changes the KV for the same tokens: the LoRA
# adapter's name, the request's cache_salt, and from the block holding a multimodal input on,
# that input's hash. (vLLM's own block hashes start from a seed that differs between
# processes unless PYTHONHASHSEED is set, which would make instances miss each other.) Each
# tensor-parallel rank keeps its shard of the heads in a namespace of its own
# (<model_id>/tp<rank>-<size>); the scheduler counts a hit only where every rank has it. MLA
# models keep one latent cache for all ranks: rank 0 saves, every rank loads.
#
# A hybrid model (vLLM's hybrid allocator: several KV cache groups, this connector being a
# SupportsHMA one) keeps one namespace per group and rank, of the group's kind (full
# attention kv, MLA k_only, sliding window and chunked local kv_window, Mamba state), every
# group under the rank's first group's keys: the scheduler settles on the prefix every
# group of every rank gives (kvcd.hybrid_lookup), the worker loads each group's part (a
# window's blocks only where vLLM gave the group a block, not its null block) and saves
# each group's blocks layer by layer as with one group.
#
# Mamba groups (Mamba, gated delta net, linear attention), as vLLM's "align" cache mode
# keeps them (read in vLLM's scheduler.py at 00024d3, the worker's mamba_utils.py at
# 00b08dc and a recent single_type_kv_cache_manager.py; docs/engines.md): a request's state
# after (p + 1) * block_size tokens is in its Mamba block p, chunks end at block boundaries,
# and the running state of a step is in block (computed + scheduled - 1) // block_size.
# The worker saves the state of a chunk that ends at a block boundary under that block's
# key, every Mamba layer's states end to end as one state block. A prefix of h blocks is
# found only where its state is (stored under key h - 1); its state is loaded into block
# h - 1 (where vLLM's Mamba manager keeps a prefix hit's state) and into the step's
# running block, because vLLM's runner copies block h - 1 to the running block
# (preprocess_mamba) before it calls start_load_kv: a load into block h - 1 alone would
# leave the forward the stale bytes of that copy. A load that falls short loads nothing
# and reports every group's blocks (a shorter prefix's state has no block of the request
# to go to), and no request saves what a step with a failed load computed.
#
# Worker side, per step: start_load_kv looks up each load and queues its scatter into vLLM's
# paged KV cache layer by layer on a load stream, an event after each layer;
# wait_for_layer_load(layer) makes the compute stream wait for that layer's event (never the
# host). save_kv_layer gathers the layer vLLM just wrote into a reservation of the request's
# new full prompt blocks, on the compute stream (a chunk's reservation hangs from the last
# chunk's, which may still be committing: kvcd takes such a parent, the commits go in
# order); wait_for_save hands the reservations to a committing thread (kvc_commit waits
# for the gathers, then publishes) and returns;
# get_finished reports a finished request once its commits are done, and request_finished
# on the scheduler side keeps its blocks until then (without async_save the commits run in
# wait_for_save and nothing is reported). A load's leases go once the event after its copies
# says the device is done (get_finished asks, never waiting): start_load_kv never waits for
# the device on the host. Streams and events come from kvcd.vllm.streams (torch.cuda's).
# With "layerwise": false in the extra config a load is one scatter of all layers and a save
# one gather at wait_for_save; a layer whose save_kv_layer did not run (a replayed full
# CUDA graph skips it) is gathered there too. CPU tensors work the same, synchronously. Of
# vLLM's optional hooks it answers three: piecewise CUDA graphs while layer-wise (the
# per-layer waits cannot be captured), the NHD cache layout (libkvc's), and no
# reliable-delivery demand (a cache, not a hand-off); the others keep vLLM's defaults
# (docs/engines.md lists them).
import collections
import dataclasses
import queue
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Set, Tuple

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                                KVConnectorMetadata,
                                                                KVConnectorRole, SupportsHMA)

import kvcd

# How long the scheduler lets a request wait for its blocks coming back from kvcd's disk
# tier before it takes what is in memory (seconds), by default.
DISK_WAIT_S = 0.5


@dataclass
class KvcdSpan:
    """One request's run of blocks to load or to save, as the worker needs it: the tokens
    its keys chain over (from the first token of the sequence), the extra bytes of each key
    from a block on, and vLLM's block ids of the request from block 0."""

    req_id: str
    tokens: List[int]
    extras: List[Tuple[int, bytes]]
    block_ids: List[int]
    first: int  # first block of the run
    count: int  # blocks in the run
    # A hybrid model's block ids of the request from block 0, one list per KV cache group
    # (block_ids is the first group's); empty with one group.
    group_block_ids: Tuple[List[int], ...] = ()
    # Tokens the request has computed once this step's forward ran (num_computed_tokens +
    # num_scheduled_tokens): where a Mamba group's running state is (vLLM's block
    # (step_end - 1) // block_size), to load a state into and to save one from.
    step_end: int = 0


@dataclass
class KvcdConnectorMetadata(KVConnectorMetadata):
    loads: List[KvcdSpan] = field(default_factory=list)
    saves: List[KvcdSpan] = field(default_factory=list)


def _dtype_name(dtype):
    s = str(dtype).replace("torch.", "")
    return {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32",
            "float": "fp32", "float8_e4m3fn": "fp8_e4m3", "fp8": "fp8_e4m3",
            "fp8_e4m3": "fp8_e4m3", "int8": "int8", "auto": "fp16"}.get(s, s)


def request_extras(request, block_size):
    """The extra bytes of a request's keys by block: [(first block, extra), ...]. LoRA name
    and cache salt from block 0; each multimodal input's hash from the block holding its
    first placeholder token on."""
    base = b""
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        base += b"lora=" + str(getattr(lora, "lora_name", None) or
                               getattr(lora, "lora_int_id", "")).encode() + b";"
    salt = getattr(request, "cache_salt", None)
    if salt:
        base += b"salt=" + str(salt).encode() + b";"
    mm = []
    for f in getattr(request, "mm_features", None) or []:
        pos = getattr(f, "mm_position", None)
        ident = getattr(f, "identifier", None) or getattr(f, "mm_hash", None)
        if pos is not None and ident is not None:
            mm.append((int(pos.offset), str(ident).encode()))
    extras = [(0, base)]
    acc = base
    for offset, ident in sorted(mm):
        acc += b"mm=" + ident + b";"
        blk = offset // block_size
        if extras[-1][0] == blk:
            extras[-1] = (blk, acc)
        else:
            extras.append((blk, acc))
    return extras


def span_keys(ns, tokens, extras, nblocks):
    """The chained keys of blocks [0, nblocks) of tokens, with each segment's extra."""
    bs = ns.block_tokens
    keys: List[bytes] = []
    for j, (start, extra) in enumerate(extras):
        end = extras[j + 1][0] if j + 1 < len(extras) else nblocks
        end = min(end, nblocks)
        if end <= start:
            continue
        keys += ns.keys_from_tokens(tokens[start * bs:end * bs],
                                    parent=keys[-1] if keys else None, extra=extra)
    return keys[:nblocks]


# The namespace kind of each KV cache spec class of vLLM's hybrid allocator (by class name:
# a subclass with another page layout, such as a quantized or sink variant, is refused rather
# than taken for its parent).
_SPEC_KINDS = {"FullAttentionSpec": "kv", "MLAAttentionSpec": "k_only",
               "SlidingWindowSpec": "kv_window", "ChunkedLocalAttentionSpec": "kv_window"}


def vllm_takes_mamba_external(scheduler_cls=None):
    """Whether vLLM's scheduler takes external tokens for a model with Mamba layers. The
    scheduler read at 00024d3 asserts in _mamba_block_aligned_split that none come ("External
    KV connector is not verified yet"), so a hit reported there would stop the engine; later
    ones (487ecf187) take them. Read from the installed scheduler's source once; a vLLM
    without that split (or without its source) has nothing that refuses them."""
    try:
        import inspect
        if scheduler_cls is None:
            from vllm.v1.core.sched.scheduler import Scheduler as scheduler_cls
        src = inspect.getsource(scheduler_cls._mamba_block_aligned_split)
    except Exception:  # no such scheduler, split or source: nothing asserts
        return True
    return "assert num_external_computed_tokens == 0" not in src


def _state_shape(index, spec):
    """(dtype name, kv_heads, head_dim, [(shape, torch dtype, bytes), ...]) of a MambaSpec
    group's state namespace: one layer's states (conv, then SSM, as vLLM lists them) end to
    end, in their common dtype, or as int8 bytes where their dtypes differ, factored into
    kv_heads x head_dim within the namespace's bounds."""
    import torch
    shapes = [tuple(int(d) for d in sh) for sh in spec.shapes]
    dtypes = list(spec.dtypes)
    if not shapes or len(shapes) != len(dtypes):
        raise ValueError("kvcd.vllm: KV cache group %d: MambaSpec with %d shapes and %d "
                         "dtypes" % (index, len(shapes), len(dtypes)))
    pieces = []
    for sh, dt in zip(shapes, dtypes):
        n = 1
        for d in sh:
            n *= d
        if n <= 0:
            raise ValueError("kvcd.vllm: KV cache group %d: empty state shape %s" %
                             (index, sh))
        pieces.append((sh, dt, n * torch.empty((), dtype=dt).element_size()))
    total = sum(b for _, _, b in pieces)
    name = _dtype_name(dtypes[0])
    size = torch.empty((), dtype=dtypes[0]).element_size()
    if any(dt != dtypes[0] for dt in dtypes) or name not in ("fp16", "bf16", "fp32", "int8"):
        name, size = "int8", 1
    elems = total // size
    for heads in range(1, 4097):
        if elems % heads == 0 and elems // heads <= 65536:
            return name, heads, elems // heads, pieces
    raise ValueError("kvcd.vllm: KV cache group %d: a state of %d elements does not factor "
                     "into at most 4096 heads of at most 65536" % (index, elems))


class TorchStreams:
    """Where the worker's device path takes its streams and events: torch.cuda's (imported
    at the first call, so the module loads with a CPU-only torch). The connector uses of a
    stream .cuda_stream (what libkvc is handed), wait_stream and wait_event, and of an event
    record(stream) and query(). A test puts the strict fake device's in its place
    (kvcd.vllm.streams) before it builds a worker."""

    def stream(self, device):
        import torch
        return torch.cuda.Stream(device=device)

    def event(self):
        import torch
        return torch.cuda.Event()

    def current_stream(self):
        import torch
        return torch.cuda.current_stream()


streams = TorchStreams()


class _Group:
    """One KV cache group of a hybrid model (several groups): its layers and the kvcd
    namespace of its kind (docs/engines.md, "vLLM's hybrid allocator groups"). The
    namespace's name carries the group's index and a hash of its layer names, so a vLLM that
    groups the layers otherwise never reads another grouping's blocks."""

    def __init__(self, index, group, model_id, tp_size):
        spec = group.kv_cache_spec
        cls = type(spec).__name__
        self.kind = "state" if cls == "MambaSpec" else _SPEC_KINDS.get(cls)
        if self.kind is None:
            raise ValueError("kvcd.vllm: KV cache group %d has a %s, which has no kvcd "
                             "namespace kind" % (index, cls))
        self.index = index
        self.layer_names = list(group.layer_names)
        self.layers = len(self.layer_names)
        if not self.layers:
            raise ValueError("kvcd.vllm: KV cache group %d has no layer" % index)
        self.block_size = int(spec.block_size)
        self.window = 0
        self.chunked = False
        self.tp_size = tp_size
        crc = zlib.crc32("\0".join(self.layer_names).encode())
        self.base = "%s/g%d-%08x" % (model_id, index, crc)
        if self.kind == "state":
            self._mamba(index, spec)
            return
        self.head_size = int(spec.head_size)
        head_v = getattr(spec, "head_size_v", None)
        if head_v is not None and int(head_v) != self.head_size:
            raise ValueError("kvcd.vllm: KV cache group %d: V heads of another size than K "
                             "(%d, %d) are not supported" % (index, head_v, self.head_size))
        self.heads = 1 if self.kind == "k_only" else int(spec.num_kv_heads)
        self.dtype = _dtype_name(spec.dtype)
        # A window group: vLLM keeps (and a prefix needs) the tokens a query can still see.
        self.chunked = cls == "ChunkedLocalAttentionSpec"
        if self.kind == "kv_window":
            self.window = int(spec.attention_chunk_size if self.chunked else
                              spec.sliding_window)
            if self.window <= 0:
                raise ValueError("kvcd.vllm: KV cache group %d: window of %d tokens" %
                                 (index, self.window))

    def _mamba(self, index, spec):
        """A MambaSpec group: a state namespace of the group's layers. Only vLLM's "align"
        cache mode keeps a state at block boundaries (the state after (p + 1) * block_size
        tokens in the request's block p), which is what a prefix is stored and found by;
        "none" keeps the running state only and "all" keeps states this connector does not
        map; speculative blocks shift where the running state is."""
        mode = getattr(spec, "mamba_cache_mode", "none")
        if mode != "align":
            raise ValueError("kvcd.vllm: KV cache group %d: MambaSpec with mamba_cache_mode "
                             "%r: only \"align\" is supported (vLLM keeps the states of block "
                             "boundaries only there: --mamba-cache-mode align, with prefix "
                             "caching)" % (index, mode))
        spec_blocks = int(getattr(spec, "num_speculative_blocks", 0) or 0)
        if spec_blocks:
            raise ValueError("kvcd.vllm: KV cache group %d: MambaSpec with %d speculative "
                             "blocks (speculative decoding) is not supported" %
                             (index, spec_blocks))
        self.dtype, self.heads, self.head_size, self.pieces = _state_shape(index, spec)
        self.state_bytes = sum(b for _, _, b in self.pieces)  # of one layer

    def ns_name(self, rank):
        if self.kind == "k_only":  # one latent cache for every rank
            return "%s/mla" % self.base
        return "%s/tp%d-%d" % (self.base, rank, self.tp_size)

    def open(self, client, rank):
        if self.kind == "k_only":
            return client.namespace(self.ns_name(rank), self.layers, 1, self.head_size,
                                    self.block_size, self.dtype, k_only=True)
        return client.namespace_kind(self.ns_name(rank), self.layers, self.heads,
                                     self.head_size, self.block_size, self.dtype,
                                     kind=self.kind, window_tokens=self.window)

    def skipped(self, blocks):
        """The leading blocks of a prefix of `blocks` blocks that vLLM gives this group no
        block for (its null block) when the prefix is computed: those no query after it can
        see (vLLM's sliding-window and chunked-local managers, get_num_skipped_tokens)."""
        if self.kind == "state":  # only the state at the prefix's end (block blocks - 1)
            return max(0, blocks - 1)
        if not self.window:
            return 0
        tokens = blocks * self.block_size
        if self.chunked:
            return tokens // self.window * self.window // self.block_size
        return max(0, tokens - self.window + 1) // self.block_size


class _Layout:
    """The namespace layout of one rank: from the KV cache config, checked against the
    tensors at register_kv_caches."""

    def __init__(self, vllm_config, kv_cache_config, extra):
        cache = vllm_config.cache_config
        model = vllm_config.model_config
        par = vllm_config.parallel_config
        self.block_size = int(cache.block_size)
        self.tp_size = int(getattr(par, "tensor_parallel_size", 1) or 1)
        if int(getattr(par, "pipeline_parallel_size", 1) or 1) > 1:
            raise ValueError("kvcd.vllm: pipeline parallelism is not supported")
        self.mla = bool(getattr(model, "use_mla", False))
        spec = None
        layers = None
        self.groups: List[_Group] = []  # a hybrid model's KV cache groups (several)
        if kv_cache_config is not None and getattr(kv_cache_config, "kv_cache_groups", None):
            group = kv_cache_config.kv_cache_groups[0]
            if len(kv_cache_config.kv_cache_groups) > 1 or type(
                    group.kv_cache_spec).__name__ == "MambaSpec":  # a state has no KV heads
                self._hybrid(kv_cache_config.kv_cache_groups, model, extra)
                return
            spec = group.kv_cache_spec
            layers = len(group.layer_names)
        if spec is not None:
            self.heads = int(spec.num_kv_heads)
            self.head_size = int(spec.head_size)
            self.dtype = _dtype_name(spec.dtype)
            self.block_size = int(spec.block_size)
        else:
            self.heads = int(model.get_num_kv_heads(par))
            self.head_size = int(model.get_head_size())
            self.dtype = _dtype_name(getattr(cache, "cache_dtype", "auto") if
                                     getattr(cache, "cache_dtype", "auto") != "auto" else
                                     model.dtype)
        self.layers = int(extra.get("layers") or layers or model.get_num_layers(par))
        if self.mla:
            self.heads = 1
        base = extra.get("model_id") or "vllm/%s@%s/%s" % (
            model.model, getattr(model, "revision", None) or "main", self.dtype)
        self.model_id = base

    def _hybrid(self, groups, model, extra):
        """One namespace per KV cache group, all under the same keys (the groups share the
        block size: vLLM hashes one block of tokens for all of them)."""
        self.mla = False
        dtype = _dtype_name(groups[0].kv_cache_spec.dtype) if hasattr(
            groups[0].kv_cache_spec, "dtype") else _dtype_name(model.dtype)
        self.model_id = extra.get("model_id") or "vllm/%s@%s/%s" % (
            model.model, getattr(model, "revision", None) or "main", dtype)
        self.groups = [_Group(i, g, self.model_id, self.tp_size) for i, g in enumerate(groups)]
        sizes = {g.block_size for g in self.groups}
        if len(sizes) > 1:
            raise ValueError("kvcd.vllm: KV cache groups of different block sizes (%s) are not "
                             "supported" % sorted(sizes))
        self.block_size = self.groups[0].block_size
        self.layers = sum(g.layers for g in self.groups)

    def ns_name(self, rank):
        if self.mla:
            return "%s/mla" % self.model_id
        return "%s/tp%d-%d" % (self.model_id, rank, self.tp_size)

    def open(self, client, rank):
        return client.namespace(self.ns_name(rank), self.layers, self.heads, self.head_size,
                                self.block_size, self.dtype, k_only=self.mla)


class KvcdConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector over kvcd (see the DESIGN comment of kvcd/vllm.py)."""

    @property
    def requires_kv_delivery(self):
        """False: kvcd is a cache, not a hand-off. vLLM's default (True for kv_both)
        would recompute a request preempted while its save commits; a save that never
        lands here is only a later miss."""
        return False

    @property
    def supports_mamba_external_kv(self):
        """True: a Mamba group's state is loaded with the prefix it ends (a connector built
        with a Mamba group it cannot map fails at construction), so vLLM's scheduler may
        take external tokens for a model with Mamba layers in align mode. The property
        vLLM PR #42620 proposed (default False); vLLM versions without it never ask."""
        return True

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        """NHD: tokens before heads in each block, the layout libkvc's scatter and gather
        take; an attention backend that would pick HND is told to allocate NHD."""
        return "NHD"

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        """Layer-by-layer loads and saves run between the layers: a full CUDA graph's
        replay skips wait_for_layer_load and save_kv_layer, so the forward would read
        blocks still being scattered. vLLM then captures piecewise graphs instead."""
        return bool((extra_config or {}).get("layerwise", True))

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(getattr(self._kv_transfer_config, "kv_connector_extra_config", None) or {})
        self._extra = extra
        self._lay = _Layout(vllm_config, kv_cache_config, extra)
        self._bs = self._lay.block_size
        self._client = kvcd.Client(extra.get("socket"))
        self._disk_wait = float(extra.get("disk_wait_s", DISK_WAIT_S))
        self._layerwise = bool(extra.get("layerwise", True))
        self._async_save = bool(extra.get("async_save", True))
        if role == KVConnectorRole.SCHEDULER:
            self._sched_init()
        else:
            self._worker_init()

    # ==== scheduler side =======================================================

    def _sched_init(self):
        ranks = 1 if self._lay.mla else self._lay.tp_size
        if self._lay.groups:  # per rank, one namespace per KV cache group
            self._nss = [[g.open(self._client, r) for g in self._lay.groups]
                         for r in range(self._lay.tp_size)]
        else:
            self._nss = [self._lay.open(self._client, r) for r in range(ranks)]
        self._asked: Dict[str, Tuple[int, List[int], list, float]] = {}
        self._loads: Dict[str, Tuple[int, int, List[int]]] = {}
        self._reqs: Dict[str, dict] = {}
        self._saving: Set[str] = set()
        self._mamba_ok = None  # whether vLLM takes a Mamba model's hits (_mamba_refused)
        self.stats = collections.Counter()

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """Tokens beyond num_computed_tokens that kvcd holds for every rank, from a lookup
        that waits for nothing and pins nothing past the call; None while blocks are still
        coming back from disk (for at most disk_wait_s), so vLLM asks again later."""
        tokens = list(request.prompt_token_ids or [])
        bs = self._bs
        usable = (len(tokens) - 1) // bs  # the last prompt token is always computed
        first = num_computed_tokens // bs
        extras = request_extras(request, bs)
        now = time.monotonic()
        since = self._asked.get(request.request_id, (0, None, None, now))[3]
        self._asked[request.request_id] = (num_computed_tokens, tokens, extras, since)
        if usable <= first:
            return 0, False
        if self._lay.groups:
            if self._mamba_refused():
                return 0, False
            hits, pending = self._hybrid_hits(tokens, extras, usable)
            if pending and now - since < self._disk_wait:
                return None, False
            return (max(0, hits - first)) * bs, False
        hits = usable
        pending = False
        for ns in self._nss:
            keys = span_keys(ns, tokens, extras, usable)
            with ns.lookup(keys, nowait=True) as lease:
                n, ready = len(lease), lease.ready() if len(lease) else 0
            pending |= ready < n
            hits = min(hits, ready)
        if pending and now - since < self._disk_wait:
            return None, False
        if hits <= first:
            return 0, False
        return (hits - first) * bs, False

    def _mamba_refused(self):
        """A model with Mamba groups under a vLLM whose scheduler asserts that no external
        tokens reach them (vllm_takes_mamba_external): no hit is reported, so the engine
        keeps running and computes every prompt; its saves go on, for a vLLM that takes
        them. Counted in stats["mamba_hits_withheld"]."""
        if self._mamba_ok is None:
            self._mamba_ok = not any(g.kind == "state" for g in self._lay.groups) or \
                vllm_takes_mamba_external()
        if not self._mamba_ok:
            self.stats["mamba_hits_withheld"] += 1
        return not self._mamba_ok

    def _hybrid_hits(self, tokens, extras, usable):
        """(blocks, pending): the longest prefix of at most `usable` blocks that every group
        of every rank can give from memory now (kvcd.hybrid_lookup with ready_only, round the
        ranks with a shrinking end until all of them agree), and whether blocks of some
        group are still being read back from disk (a lookup with nowait in each). The keys
        are each rank's first group's, in every group (as that rank's worker saves them)."""
        keys = [span_keys(nss[0], tokens, extras, usable) for nss in self._nss]
        pending = False
        for nss, rank_keys in zip(self._nss, keys):
            for ns in nss:
                with ns.lookup(rank_keys, nowait=True) as lease:
                    pending |= bool(len(lease)) and lease.ready() < len(lease)
        end, agreed, r = usable, 0, 0
        while end > 0 and agreed < len(self._nss):
            with kvcd.hybrid_lookup(self._nss[r], keys[r][:end], ready_only=True) as hit:
                got = hit.length
            agreed = agreed + 1 if got == end else 1
            end, r = got, (r + 1) % len(self._nss)
        return end, pending

    def request_finished_all_groups(self, request, block_ids):
        """SupportsHMA: what request_finished does, with every group's block ids (a hybrid
        model's saves are per group already, at each step's end)."""
        return self.request_finished(request, block_ids)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens <= 0:
            return
        local = self._asked.get(request.request_id, (0,))[0]
        first = local // self._bs
        count = num_external_tokens // self._bs
        block_ids = list(blocks.get_block_ids()[0]) if blocks is not None else []
        self._loads[request.request_id] = (first, count, block_ids)

    def _req_state(self, req_id, tokens=None, block_ids=None, computed=0, groups=None):
        st = self._reqs.get(req_id)
        if st is None:
            asked = self._asked.pop(req_id, None)
            st = self._reqs[req_id] = dict(
                tokens=list(tokens if tokens is not None else (asked[1] if asked else [])),
                extras=asked[2] if asked else [(0, b"")],
                block_ids=list(block_ids or []),
                saved=computed // self._bs)
            if self._lay.groups:  # block_ids is the first group's list
                st["groups"] = self._group_ids(groups)
                st["block_ids"] = st["groups"][0]
        return st

    def _group_ids(self, ids):
        """A hybrid model's per-group block ids as vLLM sends them (a tuple with a list per
        group, or None), as lists, checked against the groups."""
        n = len(self._lay.groups)
        if not ids:
            return [[] for _ in range(n)]
        if len(ids) != n:
            raise ValueError("kvcd.vllm: block ids of %d KV cache groups, the config has %d" %
                             (len(ids), n))
        return [list(g) for g in ids]

    def _span_groups(self, st):
        if not self._lay.groups:
            return {}
        return dict(group_block_ids=tuple(list(g) for g in st["groups"]))

    def _save_span(self, req_id, st, end_tokens):
        """The run of full prompt blocks that become computed by end_tokens, not saved yet."""
        bs = self._bs
        full = min(end_tokens, len(st["tokens"])) // bs
        full = min(full, len(st["block_ids"]))
        for ids in st.get("groups", ()):
            full = min(full, len(ids))
        if full <= st["saved"]:
            return None
        span = KvcdSpan(req_id, st["tokens"][:full * bs], st["extras"], list(st["block_ids"]),
                        st["saved"], full - st["saved"], step_end=end_tokens,
                        **self._span_groups(st))
        st["saved"] = full
        self._saving.add(req_id)
        return span

    def build_connector_meta(self, scheduler_output):
        meta = KvcdConnectorMetadata()
        bs = self._bs
        for new in scheduler_output.scheduled_new_reqs:
            block_ids = list(new.block_ids[0]) if new.block_ids else []
            load = self._loads.pop(new.req_id, None)
            self._reqs.pop(new.req_id, None)  # a request scheduled anew starts over
            st = self._req_state(new.req_id, new.prompt_token_ids, block_ids,
                                 new.num_computed_tokens, new.block_ids)
            end = new.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(
                new.req_id, 0)
            if load:
                first, count, _ = load
                meta.loads.append(KvcdSpan(new.req_id, st["tokens"][:(first + count) * bs],
                                           st["extras"], block_ids, first, count,
                                           step_end=end, **self._span_groups(st)))
            span = self._save_span(new.req_id, st, end)
            if span:
                meta.saves.append(span)
        cached = scheduler_output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", None) or ())
        for i, req_id in enumerate(cached.req_ids):
            st = self._reqs.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            # Back where vLLM rolled the request back to (a load that failed): what was
            # computed after it is computed, and saved, again.
            st["saved"] = min(st["saved"], cached.num_computed_tokens[i] // bs)
            if self._lay.groups:  # each group's new block ids (a resumed request's all)
                if req_id in resumed:
                    st["groups"] = self._group_ids(new_ids)
                    st["saved"] = min(st["saved"], cached.num_computed_tokens[i] // bs)
                elif new_ids:
                    for ids, more in zip(st["groups"], self._group_ids(new_ids)):
                        ids += more
                st["block_ids"] = st["groups"][0]
            elif req_id in resumed:
                st["block_ids"] = list(new_ids[0]) if new_ids else []
                st["saved"] = min(st["saved"], cached.num_computed_tokens[i] // bs)
            elif new_ids:
                st["block_ids"] += list(new_ids[0])
            end = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens.get(
                req_id, 0)
            load = self._loads.pop(req_id, None)
            if load:
                first, count, _ = load
                meta.loads.append(KvcdSpan(req_id, st["tokens"][:(first + count) * bs],
                                           st["extras"], list(st["block_ids"]), first, count,
                                           step_end=end, **self._span_groups(st)))
            span = self._save_span(req_id, st, end)
            if span:
                meta.saves.append(span)
        self._loads.clear()
        return meta

    def update_connector_output(self, connector_output):
        for req_id in getattr(connector_output, "finished_sending", None) or ():
            self._saving.discard(req_id)

    def request_finished(self, request, block_ids):
        """Keeps the request's blocks while its saves may still be committing (the workers
        report it through get_finished)."""
        req_id = request.request_id
        self._reqs.pop(req_id, None)
        self._asked.pop(req_id, None)
        self._loads.pop(req_id, None)
        delay = self._async_save and req_id in self._saving
        return delay, None

    # ==== worker side ==========================================================

    def _worker_init(self):
        try:
            from vllm.distributed.parallel_state import (get_tensor_model_parallel_rank,
                                                         get_tensor_model_parallel_world_size)
            self._rank = int(get_tensor_model_parallel_rank())
            if int(get_tensor_model_parallel_world_size()) != self._lay.tp_size:
                raise ValueError("kvcd.vllm: the worker's TP size differs from the config's")
        except (ImportError, AssertionError):
            self._rank = int(self._extra.get("tp_rank", 0))
        if self._lay.groups:  # a namespace per KV cache group; MLA ones: rank 0 saves
            self._gns = [g.open(self._client, self._rank) for g in self._lay.groups]
            self._gsaves = [g.kind != "k_only" or self._rank == 0 for g in self._lay.groups]
            # Keys carry their namespace's salt: every group's blocks go under the first
            # group's chain, in every process, so that one hybrid_lookup asks all groups.
            self._ns = self._gns[0]
            self._saves_here = any(self._gsaves)
        else:
            self._ns = self._lay.open(self._client, 0 if self._lay.mla else self._rank)
            self._saves_here = not self._lay.mla or self._rank == 0
        self._names: List[str] = []
        self._k = self._v = None
        self._kv_dim = 0
        self._cuda = False
        self._errors: Set[int] = set()
        self._held: List[Any] = []  # leases of this step's loads
        # Device loads' leases with the event after their copies: released once the event
        # says the device is done (get_finished asks, never waiting).
        self._inflight: List[Tuple[Any, List[Any]]] = []
        self._dev = streams
        self._events: Dict[int, Any] = {}
        self._all_event = self._last_event = None
        self._loads: List[Tuple[Any, KvcdSpan, int]] = []
        self._resvs: List[Tuple[Any, KvcdSpan]] = []
        self._gathered: Set[int] = set()  # layers save_kv_layer gathered this step
        self._reserved = False  # this step's saves are reserved (self._resvs may be empty)
        self._saved_reqs: Set[str] = set()
        self._pending = collections.Counter()  # req_id -> commits not done
        self._finishing: Set[str] = set()
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)  # a commit finished
        self._commit_q: "queue.Queue" = queue.Queue()
        self._committer = None
        self._load_stream = None
        self._state_bufs: List[Any] = []  # staging of the last step's state loads
        # Requests a load failed for this step: vLLM discards their step, and what they
        # compute in it (from KV or a state that is not there) is not saved.
        self._load_failed: Set[str] = set()
        self.stats = collections.Counter()

    def register_kv_caches(self, kv_caches):
        """Keeps vLLM's per-layer KV tensors (in model order) and checks them against the
        namespace: flash-attn [2, blocks, block_size, heads, dim], FlashInfer
        [blocks, 2, ...], MLA [blocks, block_size, dim]. A hybrid model's layers go to the
        namespaces of their groups (the groups' layer_names)."""
        if self._lay.groups:
            return self._register_groups(kv_caches)
        self._names = list(kv_caches)
        tensors = [kv_caches[n] for n in self._names]
        t = tensors[0]
        if len(tensors) != self._lay.layers:
            raise ValueError("kvcd.vllm: %d KV cache layers, the namespace has %d" %
                             (len(tensors), self._lay.layers))
        if self._lay.mla:
            self._k, self._v = tensors, None
            shape = tuple(t.shape)
            ok = len(shape) == 3 and shape[1] == self._bs and shape[2] == self._lay.head_size
        else:
            shape = tuple(t.shape)
            self._kv_dim = 0 if shape[0] == 2 else 1
            self._k, self._v = tensors, None
            rest = shape[:self._kv_dim] + shape[self._kv_dim + 1:]
            ok = len(shape) == 5 and shape[self._kv_dim] == 2 and rest[1:] == (
                self._bs, self._lay.heads, self._lay.head_size)
        if not ok:
            raise ValueError("kvcd.vllm: a KV cache tensor of shape %s does not match the "
                             "namespace (block_size %d, %d heads of %d)" %
                             (shape, self._bs, self._lay.heads, self._lay.head_size))
        self._cuda = getattr(getattr(t, "device", None), "type", "cpu") == "cuda"
        if self._cuda:
            self._load_stream = self._dev.stream(t.device)
            self._client.gpu_attach()  # this thread's current device is the worker's
        self._layer_of = {n: i for i, n in enumerate(self._names)}
        # The tensors read and checked once: every scatter and gather of a step takes this.
        self._paged = self._ns.paged_kv(self._k, self._v, kv_dim=self._kv_dim)

    def _register_groups(self, kv_caches):
        self._names = list(kv_caches)
        self._layer_of = {}  # layer name -> (group, layer in the group)
        self._gpaged = []
        self._gstate = {}  # a Mamba group's index -> per layer, vLLM's state tensors
        t = None
        for gi, g in enumerate(self._lay.groups):
            if g.kind == "state":
                t = self._register_state(gi, g, kv_caches)
                self._gpaged.append(None)
                continue
            tensors = []
            for li, name in enumerate(g.layer_names):
                if name not in kv_caches or name in self._layer_of:
                    raise ValueError("kvcd.vllm: layer %s of KV cache group %d has no KV cache "
                                     "tensor of its own" % (name, gi))
                self._layer_of[name] = (gi, li)
                tensors.append(kv_caches[name])
            t = tensors[0]
            shape = tuple(t.shape)
            kv_dim = 0
            if g.kind == "k_only":
                ok = len(shape) == 3 and shape[1:] == (self._bs, g.head_size)
            else:
                kv_dim = 0 if shape[0] == 2 else 1
                rest = shape[:kv_dim] + shape[kv_dim + 1:]
                ok = len(shape) == 5 and shape[kv_dim] == 2 and rest[1:] == (
                    self._bs, g.heads, g.head_size)
            if not ok or any(tuple(x.shape) != shape for x in tensors):
                raise ValueError("kvcd.vllm: a KV cache tensor of shape %s does not match KV "
                                 "cache group %d (block_size %d, %d heads of %d)" %
                                 (shape, gi, self._bs, g.heads, g.head_size))
            self._gpaged.append(self._gns[gi].paged_kv(tensors, None, kv_dim=kv_dim))
        if len(self._layer_of) != len(kv_caches):
            raise ValueError("kvcd.vllm: %d KV cache tensors, the groups have %d layers" %
                             (len(kv_caches), len(self._layer_of)))
        self._cuda = getattr(getattr(t, "device", None), "type", "cpu") == "cuda"
        if self._cuda:
            self._load_stream = self._dev.stream(t.device)
            self._client.gpu_attach()

    def _register_state(self, gi, g, kv_caches):
        """A Mamba group's layers: each a list of vLLM's state tensors (conv, SSM), one
        [num_blocks, *shape] tensor per state, indexed by block id. Returns one of them."""
        layers = []
        nblocks = None
        for li, name in enumerate(g.layer_names):
            if name not in kv_caches or name in self._layer_of:
                raise ValueError("kvcd.vllm: layer %s of KV cache group %d has no state "
                                 "tensors of its own" % (name, gi))
            self._layer_of[name] = (gi, li)
            states = kv_caches[name]
            if not isinstance(states, (list, tuple)) or len(states) != len(g.pieces):
                raise ValueError("kvcd.vllm: layer %s of Mamba group %d: %d state tensors "
                                 "expected (one per MambaSpec shape)" %
                                 (name, gi, len(g.pieces)))
            for x, (shape, dtype, _) in zip(states, g.pieces):
                if tuple(x.shape[1:]) != shape or x.dtype != dtype or (
                        nblocks is not None and x.shape[0] != nblocks):
                    raise ValueError("kvcd.vllm: a state tensor of shape %s, %s in layer %s "
                                     "does not match Mamba group %d (blocks x %s, %s)" %
                                     (tuple(x.shape), x.dtype, name, gi, shape, dtype))
                nblocks = x.shape[0]
            layers.append(list(states))
        self._gstate[gi] = layers
        return layers[0][0]

    def _state_ids(self, gi, block):
        """vLLM's state tensors' blocks `block` of group gi, checked against their size (a
        block id comes from another process)."""
        n = self._gstate[gi][0][0].shape[0]
        if not 0 < block < n:  # block 0 is vLLM's null block, never a state's
            raise ValueError("kvcd.vllm: state block id %d out of range 1..%d" % (block, n - 1))
        return block

    def _load_state(self, span, gi, lease, got):
        """The state of the prefix of `got` blocks into the two blocks vLLM reads it from:
        block got - 1, where vLLM's Mamba manager puts the state of a prefix hit (and
        caches it under that block's hash), and the block of this step's running state,
        (step_end - 1) // block_size, which vLLM's runner copied from block got - 1 before
        the connector's load (preprocess_mamba runs first in the model runner's step):
        loaded into only the first, the forward would start from that copy's stale
        bytes."""
        ids = span.group_block_ids[gi]
        run = (span.step_end - 1) // self._bs
        if lease.first != got - 1 or len(lease) != 1 or not got <= run < len(ids):
            raise ValueError("kvcd.vllm: state of block %d for a prefix of %d blocks, running "
                             "state in block %d of %d" % (lease.first, got, run, len(ids)))
        blocks = [self._state_ids(gi, ids[got - 1]), self._state_ids(gi, ids[run])]
        self._state_load(gi, lease, blocks)
        self.stats["loaded_states_g%d" % gi] += 1

    def _state_load(self, gi, lease, blocks):
        """Copies a lease's one state into vLLM's state blocks `blocks` of group gi, on the
        compute stream (vLLM's Mamba layers wait for no layer load), every layer at once."""
        g = self._lay.groups[gi]
        layers = self._gstate[gi]
        import torch
        dev = layers[0][0].device
        buf = torch.empty(g.layers * g.state_bytes, dtype=torch.uint8, device=dev)
        lease.copy_into(0, buf, **self._stream_args())
        off = 0
        for states in layers:
            for x, (shape, dtype, nbytes) in zip(states, g.pieces):
                raw = buf[off:off + nbytes]
                if off % raw.new_empty((), dtype=dtype).element_size():
                    raw = raw.clone()  # a state after one of an odd size: realigned
                piece = raw.view(dtype).view(shape)
                for b in blocks:
                    x[b].copy_(piece)
                off += nbytes
        self._state_bufs.append(buf)  # until the copies ran (the next step's start)

    def _state_block(self, gi, block):
        """One state block of group gi as kvcd's layout: every layer's states end to end."""
        import torch
        return torch.cat([x[block].reshape(-1).view(torch.uint8)
                          for states in self._gstate[gi] for x in states])

    def _event(self, stream):
        ev = self._dev.event()
        ev.record(stream)
        return ev

    def _mark_loaded(self, stream, key):
        """The event wait_for_layer_load waits on for the layers from key (None: all of them)
        once the loads just queued on stream have run; nothing without a stream."""
        if stream is None:
            return
        ev = self._last_event = self._event(stream)
        if key is None:
            self._all_event = ev
        else:
            self._events[key] = ev

    def _stream_args(self):
        if not self._cuda:
            return {}
        return dict(stream=self._dev.current_stream())

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        if not self._cuda:
            self._release_held()  # the last step's loads were consumed by its forward
        self._events = {}
        self._all_event = self._last_event = None
        self._loads = []
        self._state_bufs = []
        self._load_failed = set()
        try:
            if self._lay.groups:
                return self._load_groups(meta)
            return self._load(meta)
        finally:
            self._track_held()

    def _load(self, meta):
        for span in getattr(meta, "loads", ()):
            keys = span_keys(self._ns, span.tokens, span.extras, span.first + span.count)
            # Waits for blocks read back from disk; on a GPU hits may be in kvcd's pool
            # (scattered device to device).
            lease = self._ns.lookup(keys[span.first:], gpu=self._cuda)
            hits = len(lease)
            self.stats["load_lookups"] += 1
            if hits < span.count:  # evicted since the scheduler looked: vLLM recomputes
                self._errors.update(span.block_ids[span.first + hits:span.first + span.count])
                self._load_failed.add(span.req_id)
                self.stats["load_missing_blocks"] += span.count - hits
            if hits:
                self._loads.append((lease, span, hits))
                self._held.append(lease)
            else:
                lease.release()
        if not self._loads:
            return
        stream = None
        if self._cuda:
            stream = self._load_stream
            stream.wait_stream(self._dev.current_stream())  # the blocks' last readers first
        ranges = [range(i, i + 1) for i in range(self._lay.layers)] if self._layerwise else [None]
        for r in ranges:
            for lease, span, hits in list(self._loads):
                try:
                    lease.scatter(self._paged, None, span.block_ids, n=hits,
                                  first_token=span.first * self._bs, layers=r,
                                  **({"stream": stream} if stream else {}))
                except (kvcd.Error, ValueError):
                    self._errors.update(span.block_ids[span.first:span.first + span.count])
                    self._load_failed.add(span.req_id)
                    self._loads.remove((lease, span, hits))
                    self.stats["load_failed"] += 1
            self._mark_loaded(stream, None if r is None else r.start)
        self.stats["loaded_blocks"] += sum(h for _, _, h in self._loads)

    def _load_groups(self, meta):
        """A hybrid model's loads: each one looked up again in every group at once
        (kvcd.hybrid_lookup); each group scatters what the prefix needs of it: a full
        attention group its blocks from the span's first, a window group the window's blocks
        vLLM gave it a block for. A shorter prefix than the scheduler's (evicted in between)
        hands every group's blocks from its end on back to vLLM for recompute."""
        groups = self._lay.groups
        stateful = any(g.kind == "state" for g in groups)
        for span in getattr(meta, "loads", ()):
            end = span.first + span.count
            keys = span_keys(self._ns, span.tokens, span.extras, end)
            hit = kvcd.hybrid_lookup(self._gns, keys, gpu=self._cuda)
            got = hit.length
            self.stats["load_lookups"] += 1
            if got < end and stateful:
                # A shorter prefix has its state in no block vLLM gave the request (only
                # the scheduler's prefix end has one): nothing is loaded, vLLM recomputes
                # from the span's first block.
                got = span.first
            if got < end:
                for g, ids in zip(groups, span.group_block_ids):
                    self._errors.update(ids[max(got, span.first, g.skipped(end)):end])
                    self._load_failed.add(span.req_id)
                self.stats["load_missing_blocks"] += end - max(got, span.first)
            parts = []  # (group, lease, block ids, first hit, hits, first block)
            states = []  # (group, lease)
            for gi, (g, lease) in enumerate(zip(groups, hit.leases)):
                if g.kind == "state":
                    if got > span.first:
                        states.append((gi, lease))
                    continue
                start = max(lease.first, span.first, g.skipped(end))
                if start < got:
                    parts.append((gi, lease, span.group_block_ids[gi], start - lease.first,
                                  got - start, start))
            if got <= span.first or not (parts or states):
                hit.release()
                continue
            try:
                for gi, lease in states:
                    self._load_state(span, gi, lease, got)
            except (kvcd.Error, ValueError):
                for g, ids in zip(groups, span.group_block_ids):
                    self._errors.update(ids[max(span.first, g.skipped(end)):end])
                    self._load_failed.add(span.req_id)
                self.stats["load_failed"] += 1
                hit.release()
                continue
            self._loads.append((hit, span, parts, got))
            self._held.append(hit)
        if not self._loads:
            return
        stream = None
        if self._cuda:
            stream = self._load_stream
            # The blocks' last readers first, and the state loads just queued there: the
            # last layer's event then covers every copy out of this step's leases.
            stream.wait_stream(self._dev.current_stream())
        order = [self._layer_of[n] for n in self._names] if self._layerwise else [None]
        for at in order:
            for item in list(self._loads):
                hit, span, parts, _ = item
                try:
                    for gi, lease, ids, first, n, start in parts:
                        if at is not None and at[0] != gi:
                            continue
                        lease.scatter(self._gpaged[gi], None, ids, first=first, n=n,
                                      first_token=start * self._bs,
                                      layers=None if at is None else at[1],
                                      **({"stream": stream} if stream else {}))
                except (kvcd.Error, ValueError):
                    end = span.first + span.count
                    for g, ids in zip(groups, span.group_block_ids):
                        self._errors.update(ids[max(span.first, g.skipped(end)):end])
                        self._load_failed.add(span.req_id)
                    self._loads.remove(item)
                    self.stats["load_failed"] += 1
            self._mark_loaded(stream, at)
        for _, span, parts, got in self._loads:
            self.stats["loaded_blocks"] += got - span.first  # blocks of the prefix loaded
            for gi, _, _, _, n, _ in parts:
                self.stats["loaded_blocks_g%d" % gi] += n

    def wait_for_layer_load(self, layer_name):
        """The compute stream waits for this layer's load; the host never does."""
        if not self._cuda:
            return
        ev = self._events.get(self._layer_of.get(layer_name, -1), self._all_event)
        if ev is not None:
            self._dev.current_stream().wait_event(ev)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        if not self._saves_here:
            return
        meta = self._get_connector_metadata()
        saves = getattr(meta, "saves", ())
        if not saves:
            return
        if not self._reserved:
            self._reserve(saves)
        if not self._layerwise:
            return  # one gather of every layer at wait_for_save
        if self._lay.groups:
            gi, li = self._layer_of[layer_name]
            if self._lay.groups[gi].kind == "state":
                return  # a state is saved whole, at wait_for_save
            for r, span, g in self._resvs:
                if g == gi:
                    r.gather(self._gpaged[gi], None, span.group_block_ids[gi],
                             first_token=span.first * self._bs, layers=li,
                             **self._stream_args())
            self._gathered.add((gi, li))
            return
        layer = self._layer_of[layer_name]
        for r, span in self._resvs:
            r.gather(self._paged, None, span.block_ids, first_token=span.first * self._bs,
                     layers=layer, **self._stream_args())
        self._gathered.add(layer)

    def _reserve(self, saves):
        self._reserved = True
        for span in saves:
            if span.req_id in self._load_failed:
                self.stats["save_skipped_load_failed"] += span.count
                continue
            keys = span_keys(self._ns, span.tokens, span.extras, span.first + span.count)
            if self._lay.groups:  # each group's blocks into its namespace
                for gi, ns in enumerate(self._gns):
                    if not self._gsaves[gi]:
                        continue
                    if self._lay.groups[gi].kind != "state":
                        self._reserve_one(ns, keys, span, gi)
                        continue
                    # The state after the span's last block: in vLLM's running block when the
                    # step's forward ends there (align mode ends chunks at block boundaries,
                    # but for a prompt's last few tokens).
                    end = span.first + span.count
                    if span.step_end == end * self._bs:
                        self._reserve_one(ns, keys[:end], dataclasses.replace(
                            span, first=end - 1, count=1), gi)
                continue
            r = self._reserve_chunk(self._ns, keys, span)
            self.stats["save_reserved"] += r.reserved
            self.stats["save_not_reserved"] += sum(
                st not in (kvcd.SLOT_RESERVED, kvcd.SLOT_PRESENT) for st in r.statuses)
            if r.reserved:
                self._resvs.append((r, span))
            else:
                r.abort()  # every block present (or busy in another writer)

    def _reserve_chunk(self, ns, keys, span):
        """A reservation of the span's keys under the block before them. A chunk hangs from
        the last one's blocks, whose commit may still be queued for the committing thread:
        kvcd takes a parent this client has reserved and not committed yet, and the thread
        commits in order (the last chunk first), so nothing waits here. A daemon that takes
        only committed parents (one older than that) skips every key: then the request's
        commits are waited for (the thread usually finished them during the last step) and
        the chunk reserved again. On a GPU, slots may be in kvcd's pool."""
        parent = keys[span.first - 1] if span.first else None
        r = ns.reserve(keys[span.first:], parent=parent, gpu=self._cuda)
        if r.reserved or not span.first or not r.statuses or \
                r.statuses[0] != kvcd.SLOT_SKIPPED:
            return r
        with self._done:
            if self._pending[span.req_id] <= 0:
                return r  # the parent is not cached (evicted) or another client's
        r.abort()
        self.stats["save_waited_for_commits"] += 1
        with self._done:
            self._done.wait_for(lambda: self._pending[span.req_id] <= 0, timeout=30)
        return ns.reserve(keys[span.first:], parent=parent, gpu=self._cuda)

    def _reserve_one(self, ns, keys, span, gi):
        r = self._reserve_chunk(ns, keys, span)
        self.stats["save_reserved"] += r.reserved
        self.stats["save_not_reserved"] += sum(
            st not in (kvcd.SLOT_RESERVED, kvcd.SLOT_PRESENT) for st in r.statuses)
        if r.reserved:
            self._resvs.append((r, span, gi))
        else:
            r.abort()

    def _wait_for_save_groups(self, meta):
        """wait_for_save of a hybrid model: every (group, layer) save_kv_layer did not
        gather is gathered here, then the commits as with one group."""
        if self._saves_here and meta is not None and meta.saves and not self._reserved:
            self._reserve(meta.saves)
        late = 0
        resvs = []
        for r, span, gi in self._resvs:
            g = self._lay.groups[gi]
            if g.kind == "state":  # the state block of the span's end, written whole
                try:
                    blk = self._state_block(gi, self._state_ids(
                        gi, span.group_block_ids[gi][span.first]))
                    r.write(0, blk, **self._stream_args())
                except (kvcd.Error, ValueError, IndexError):
                    r.abort()
                    self.stats["save_failed"] += 1
                    continue
                resvs.append((r, span, gi, blk))  # blk lives until the commit
                continue
            resvs.append((r, span, gi))
            missing = [li for li in range(g.layers) if (gi, li) not in self._gathered]
            late += len(missing)
            if len(missing) == g.layers:
                r.gather(self._gpaged[gi], None, span.group_block_ids[gi],
                         first_token=span.first * self._bs, **self._stream_args())
                continue
            for li in missing:
                r.gather(self._gpaged[gi], None, span.group_block_ids[gi],
                         first_token=span.first * self._bs, layers=li, **self._stream_args())
        if late and self._layerwise:
            self.stats["save_layers_gathered_late"] += late
        self._gathered, self._reserved = set(), False
        self._resvs = []
        self._commit_all(resvs)

    def _commit_all(self, resvs):
        if not self._async_save:
            for item in resvs:
                self._commit_one(item)
            return
        with self._lock:
            for item in resvs:
                self._pending[item[1].req_id] += 1
        if self._committer is None and resvs:
            self._committer = threading.Thread(target=self._commit_loop, daemon=True,
                                               name="kvcd-commit")
            self._committer.start()
        for item in resvs:
            self._commit_q.put(item)

    def _commit_one(self, item):
        n = item[0].commit()
        if len(item) >= 3 and self._lay.groups[item[2]].kind == "state":
            self.stats["saved_states_g%d" % item[2]] += n
            return
        self.stats["saved_blocks"] += n
        if len(item) >= 3:  # a hybrid model's: (reservation, span, group[, state block])
            self.stats["saved_blocks_g%d" % item[2]] += n

    def wait_for_save(self):
        """The gathers are queued; their commits go to a thread (async_save) that waits for
        them and publishes, or run here."""
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        # Only commits on the thread are reported by get_finished: without async_save the
        # scheduler's request_finished frees a request's blocks at once, and vLLM asserts
        # that a request reported as sent is one it kept.
        for span in (getattr(meta, "saves", ()) or ()) if self._async_save else ():
            self._saved_reqs.add(span.req_id)
        if self._lay.groups:
            return self._wait_for_save_groups(meta)
        if self._saves_here and meta is not None and meta.saves and not self._reserved:
            self._reserve(meta.saves)
        # Every layer save_kv_layer did not gather is gathered here: all of them without
        # "layerwise", and those whose hooks did not run (a replayed CUDA graph skips them),
        # so a commit never publishes a slot nobody wrote.
        missing = [i for i in range(self._lay.layers) if i not in self._gathered]
        for r, span in self._resvs if missing else ():
            if len(missing) == self._lay.layers:
                r.gather(self._paged, None, span.block_ids, first_token=span.first * self._bs,
                         **self._stream_args())
                continue
            for layer in missing:
                r.gather(self._paged, None, span.block_ids, first_token=span.first * self._bs,
                         layers=layer, **self._stream_args())
        if self._resvs and missing and self._layerwise:
            self.stats["save_layers_gathered_late"] += len(missing)
        self._gathered, self._reserved = set(), False
        resvs, self._resvs = self._resvs, []
        if not self._async_save:
            for r, span in resvs:
                self.stats["saved_blocks"] += r.commit()
            return
        with self._lock:
            for _, span in resvs:
                self._pending[span.req_id] += 1
        if self._committer is None and resvs:
            self._committer = threading.Thread(target=self._commit_loop, daemon=True,
                                               name="kvcd-commit")
            self._committer.start()
        for item in resvs:
            self._commit_q.put(item)

    def _commit_loop(self):
        while True:
            item = self._commit_q.get()
            if item is None:
                return
            span = item[1]
            try:
                self._commit_one(item)
            except (kvcd.Error, ValueError):
                self.stats["save_failed"] += 1
            with self._lock:
                self._pending[span.req_id] -= 1
                self._done.notify_all()

    def _release_held(self):
        for lease in self._held:
            lease.release()
        self._held = []

    def _track_held(self):
        """A device step's leases wait, with the event after the last copy its loads queued
        (the load stream's last one, which also covers the state loads queued on the
        compute stream before it waited for them), until the device is done with them:
        kvc_release waits for a lease's copies on the host, which start_load_kv must never
        do (the host may run a step ahead of the device)."""
        if not self._cuda or not self._held:
            return
        ev = self._last_event
        if ev is None:  # nothing queued from them
            self._release_held()
            return
        self._inflight.append((ev, self._held))
        self._held = []

    def _release_landed(self):
        """Releases the leases of device loads the device is done with (asked without
        waiting); the others wait for a later step."""
        left = []
        for ev, leases in self._inflight:
            if left or not ev.query():  # one load stream: later events are later
                left.append((ev, leases))
                continue
            for lease in leases:
                lease.release()
        self._inflight = left

    def get_finished(self, finished_req_ids):
        """Requests whose saves are all committed, among those vLLM said finished (every
        rank reports them: the scheduler waits for all). Loads into host tensors are done by
        now: their pins go here; loads into device tensors keep theirs until the event after
        their copies says the device is done, asked here without waiting (kvc_release
        would wait for them on the host)."""
        if self._cuda:
            self._release_landed()
        else:
            self._release_held()
        with self._lock:
            self._finishing |= {r for r in finished_req_ids if r in self._saved_reqs}
            done = {r for r in self._finishing if self._pending[r] <= 0}
            self._finishing -= done
            for r in done:
                self._pending.pop(r, None)
                self._saved_reqs.discard(r)
        return (done or None), None

    def get_block_ids_with_load_errors(self):
        errors, self._errors = self._errors, set()
        return errors

    def shutdown(self):
        if getattr(self, "_committer", None) is not None:
            self._commit_q.put(None)
            self._committer.join(timeout=30)
            self._committer = None
        if hasattr(self, "_held"):
            for _, leases in self._inflight:  # kvc_release waits for their copies
                self._held += leases
            self._inflight = []
            self._release_held()
        self._client.close()


__all__ = ["KvcdConnector", "KvcdConnectorMetadata", "KvcdSpan", "request_extras", "span_keys"]
