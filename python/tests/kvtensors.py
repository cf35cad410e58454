# DESIGN: helpers of the tensor tests (test_tensors.py, test_cuda_fake.py, test_vllm.py,
# test_vllm_cuda.py):
# engines' paged KV caches in their published layouts, the canonical kvcd block of a run of
# their tokens computed independently in torch (so a test compares what kvcd stored with
# what the engine holds, element by element), and the strict fake CUDA device of
# python/tests/fake_dev_py.c with tensors, streams and events on it (FakeStreams: torch.cuda's
# streams and events as kvcd.vllm takes them).
import ctypes
import os
from types import SimpleNamespace

import torch

HERE = os.path.dirname(os.path.abspath(__file__))

# Layouts of one layer's KV cache, each given as (k, v) views [pages, page_tokens, heads, dim]
# of what the engine allocates; kv_dim says how a combined tensor splits (None: separate K
# and V tensors, or K-only).
LAYOUTS = ("vllm", "flash_attn", "flashinfer", "hnd", "sglang")


def make_cache(layout, layers, pages, page_tokens, heads, dim, dtype=torch.float16,
               k_only=False, seed=0, alloc=None):
    """One engine's paged KV cache: returns (k_caches, v_caches, kv_dim, k_views, v_views)
    where k_caches/v_caches are what the engine hands to kvcd (v_caches None for combined
    tensors and K-only) and k_views/v_views the [pages, page_tokens, heads, dim] views the test
    reads. alloc(shape, dtype) allocates (torch.empty by default; the fake device's tensors
    otherwise), filled with random values from seed."""
    g = torch.Generator().manual_seed(seed)
    alloc = alloc or (lambda shape, dt: torch.empty(shape, dtype=dt))

    def fill(t):
        data = torch.randn(tuple(t.shape), generator=g).to(dtype)
        host(t).copy_(data)
        return t

    ks, vs, kc, vc, kv_dim = [], [], [], [], None
    for _ in range(layers):
        if k_only:
            t = fill(alloc((pages, page_tokens, dim), dtype))
            kc.append(t)
            ks.append(host(t).view(pages, page_tokens, 1, dim))
            continue
        if layout == "vllm":
            k, v = fill(alloc((pages, page_tokens, heads, dim), dtype)), \
                fill(alloc((pages, page_tokens, heads, dim), dtype))
            kc.append(k)
            vc.append(v)
            ks.append(host(k))
            vs.append(host(v))
        elif layout == "flash_attn":
            t = fill(alloc((2, pages, page_tokens, heads, dim), dtype))
            kc.append(t)
            ks.append(host(t)[0])
            vs.append(host(t)[1])
            kv_dim = 0
        elif layout == "flashinfer":
            t = fill(alloc((pages, 2, page_tokens, heads, dim), dtype))
            kc.append(t)
            ks.append(host(t)[:, 0])
            vs.append(host(t)[:, 1])
            kv_dim = 1
        elif layout == "hnd":  # heads before tokens in memory, the same logical shape
            k = fill(alloc((pages, heads, page_tokens, dim), dtype)).permute(0, 2, 1, 3)
            v = fill(alloc((pages, heads, page_tokens, dim), dtype)).permute(0, 2, 1, 3)
            kc.append(k)
            vc.append(v)
            ks.append(host(k))
            vs.append(host(v))
        elif layout == "sglang":  # token-major [tokens, heads, dim], pages of page_tokens
            k = fill(alloc((pages * page_tokens, heads, dim), dtype))
            v = fill(alloc((pages * page_tokens, heads, dim), dtype))
            kc.append(k.view(pages, page_tokens, heads, dim))
            vc.append(v.view(pages, page_tokens, heads, dim))
            ks.append(host(kc[-1]))
            vs.append(host(vc[-1]))
        else:
            raise ValueError(layout)
    return kc, (vc or None), (kv_dim if kv_dim is not None else 0), ks, (vs or None)


def host(t):
    """The torch CPU tensor a tensor's bytes can be read through (itself for CPU tensors)."""
    return t.alias if isinstance(t, FakeCudaTensor) else t


def canonical(k_views, v_views, table, first_token, nblocks, block_tokens):
    """The canonical kvcd blocks [nblocks][layer][k/v][token][head][dim] of the engine's
    tokens [first_token, first_token + nblocks * block_tokens), read through the block
    table."""
    pt = k_views[0].shape[1]
    pos = torch.arange(first_token, first_token + nblocks * block_tokens)
    table = torch.as_tensor(list(table), dtype=torch.long)
    pages, offs = table[pos // pt], pos % pt
    kinds = [k_views] + ([v_views] if v_views is not None else [])
    per = torch.stack([torch.stack([kk[layer][pages, offs] for kk in kinds])
                       for layer in range(len(k_views))])  # [L, kinds, ntok, H, D]
    L, K, _, H, D = per.shape
    per = per.view(L, K, nblocks, block_tokens, H, D).permute(2, 0, 1, 3, 4, 5)
    return per.contiguous()


def stored_blocks(lease, n, dtype=torch.float16):
    """The first n hits of a lease as one tensor of raw blocks."""
    return torch.stack([torch.frombuffer(bytearray(lease[i]), dtype=dtype) for i in range(n)])


# ---- the fake device ------------------------------------------------------------------------


def fakedev_path():
    p = os.environ.get("KVC_FAKEDEV_LIB")
    if p:
        return p
    return os.path.join(HERE, "..", "..", "build", "tests", "libkvc_fakedev_py.so")


class FakeCudaTensor:
    """A tensor in the fake device's memory, looking to kvcd as a torch CUDA tensor does
    (data_ptr, element_size, numel, shape, stride, is_contiguous, device, dtype). `alias` is
    a torch CPU tensor over the same bytes: tests read it once the stream or event that
    covers the copies into it was waited for, and write it directly to set up data."""

    def __init__(self, alias, owner=None):
        self.alias = alias
        self.owner = owner  # keeps the allocation
        self.device = SimpleNamespace(type="cuda", index=0)
        self.dtype = alias.dtype
        self.shape = alias.shape

    def data_ptr(self):
        return self.alias.data_ptr()

    def element_size(self):
        return self.alias.element_size()

    def numel(self):
        return self.alias.numel()

    def stride(self):
        return self.alias.stride()

    def is_contiguous(self):
        return self.alias.is_contiguous()

    def __getitem__(self, i):
        return FakeCudaTensor(self.alias[i], self.owner or self)

    def view(self, *shape):
        return FakeCudaTensor(self.alias.view(*shape), self.owner or self)

    def permute(self, *dims):
        return FakeCudaTensor(self.alias.permute(*dims), self.owner or self)


class FakeDevice:
    """The strict fake device installed into this process's kvcd extension."""

    def __init__(self):
        import kvcd._kvcd
        lib = ctypes.CDLL(fakedev_path())
        vp, c = ctypes.c_void_p, ctypes
        for name, res, args in (("fdp_install", c.c_int, [vp, c.c_int]),
                                ("fdp_alloc", vp, [c.c_uint64]), ("fdp_free", None, [vp]),
                                ("fdp_stream", vp, []), ("fdp_stream_free", None, [vp]),
                                ("fdp_stream_sync", c.c_int, [vp]), ("fdp_event", vp, []),
                                ("fdp_event_query", c.c_int, [vp]),
                                ("fdp_event_wait", c.c_int, [vp]),
                                ("fdp_event_free", None, [vp]),
                                ("fdp_stat", c.c_longlong, [c.c_char_p]),
                                ("fdp_set", c.c_int, [c.c_char_p, c.c_int]),
                                ("fdp_last_error", c.c_int, []),
                                ("fdp_event_record", c.c_int, [vp, vp]),
                                ("fdp_stream_wait_event", c.c_int, [vp, vp]),
                                ("fdp_copy", c.c_int, [vp, vp, c.c_uint64, c.c_int, vp])):
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        self.lib = lib
        ext = ctypes.CDLL(kvcd._kvcd.__file__)  # the loaded extension's own image
        self._set = ctypes.cast(ext.kvci_gpu_ops_set, ctypes.c_void_p).value
        self._allocs = []

    def install(self):
        self.lib.fdp_install(self._set, 1)

    def uninstall(self):
        self.lib.fdp_install(self._set, 0)

    def stat(self, name):
        v = self.lib.fdp_stat(name.encode())
        assert v >= 0, name
        return v

    def stats(self):
        return {k: self.stat(k) for k in ("allocs", "frees", "device_syncs", "legacy_syncs",
                                           "waits", "copies", "packs", "decodes", "bad_packs",
                                           "queued", "bad_kinds", "events_live", "ops",
                                           "records")}

    def set(self, name, v):
        assert self.lib.fdp_set(name.encode(), v) == 0

    def stream(self):
        return self.lib.fdp_stream()

    def sync(self, s):
        return self.lib.fdp_stream_sync(s)

    def event(self):
        return self.lib.fdp_event()

    def copy(self, dst, src, nbytes, stream):
        """Queues a copy of the test's own on stream (a pointer each way: host or device,
        the fake checks which)."""
        assert self.lib.fdp_copy(dst, src, nbytes, 0, stream.cuda_stream) == 0

    def empty(self, shape, dtype=torch.float16):
        n = 1
        for d in shape:
            n *= d
        nbytes = n * torch.tensor([], dtype=dtype).element_size()
        p = self.lib.fdp_alloc(nbytes)
        assert p
        self._allocs.append(p)
        buf = (ctypes.c_char * nbytes).from_address(p)
        alias = torch.frombuffer(buf, dtype=dtype).view(*shape)
        return FakeCudaTensor(alias)


class FakeEvent:
    """A torch.cuda.Event on the fake device: record(stream), query() (never waits; with
    the fake's `hold` set, False while the work before it is queued), synchronize() (a host
    wait). Events are never freed: a test's handful live until the process ends."""

    def __init__(self, streams):
        self.streams = streams
        self.handle = streams.dev.event()
        assert self.handle
        self.stream = None

    def record(self, stream=None):
        stream = stream or self.streams.current_stream()
        assert self.streams.dev.lib.fdp_event_record(self.handle, stream.cuda_stream) == 0
        self.stream = stream
        self.streams.records.append((self, stream))

    def query(self):
        rc = self.streams.dev.lib.fdp_event_query(self.handle)
        assert rc in (0, -11), rc  # -EAGAIN: not yet
        return rc == 0

    def synchronize(self):
        assert self.streams.dev.lib.fdp_event_wait(self.handle) == 0


class FakeStream:
    """A torch.cuda.Stream on the fake device: .cuda_stream is the fake's handle;
    wait_event and wait_stream queue cudaStreamWaitEvent's order (the waits are logged)."""

    def __init__(self, streams):
        self.streams = streams
        self.cuda_stream = streams.dev.stream()
        assert self.cuda_stream
        self.waited = []  # events this stream was made to wait for, in order

    def wait_event(self, ev):
        assert self.streams.dev.lib.fdp_stream_wait_event(self.cuda_stream, ev.handle) == 0
        self.waited.append(ev)

    def wait_stream(self, other):
        ev = FakeEvent(self.streams)
        ev.record(other)
        self.wait_event(ev)

    def synchronize(self):
        assert self.streams.dev.sync(self.cuda_stream) == 0


class FakeStreams:
    """kvcd.vllm.streams on the fake device: the streams the connector makes, its events,
    and `compute`, the stream torch.cuda.current_stream() would answer (the model runner's).
    records: every event recorded, with its stream, in order."""

    def __init__(self, dev):
        self.dev = dev
        self.records = []
        self.made = []
        self.compute = FakeStream(self)

    def stream(self, device):
        s = FakeStream(self)
        self.made.append(s)
        return s

    def event(self):
        return FakeEvent(self)

    def current_stream(self):
        return self.compute

    def sync_all(self):
        """The host waits for every stream (the test's, before it reads device memory)."""
        for s in [self.compute] + self.made:
            s.synchronize()
