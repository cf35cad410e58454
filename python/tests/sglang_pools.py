# DESIGN: host pools built as SGLang's (python/sglang/srt/mem_cache/pool_host/mha.py, mla.py,
# mamba.py at 001067ff): the kv_buffer shapes of every layout, get_data_page /
# set_from_flat_data_page / get_dummy_flat_data_page, alloc/free of host indices, and the
# "shm" allocator (the buffer in a memfd, as ShmHostTensorAllocator). Pages are filled with
# KV that depends only on the page's key and the head (page_kv), as a model's KV depends
# only on its prefix, so any instance of any layout or TP size can check what it loads.
# The layout code here is written apart from kvcd.sglang's on purpose: each pool converts
# between its own layout and the canonical [layer][k/v][token][head][dim] with explicit
# index loops, so a wrong view in the backend cannot agree with itself.
import hashlib
import mmap
import os

import torch


def page_kv(key, layers, heads, tokens, dim, head0=0, head1=None, dtype=torch.float16,
            k_only=False):
    """The canonical block of page `key` for heads [head0, head1):
    [layer][k/v][token][head][dim] ([layer][token][1][dim] for k_only), each head's values
    drawn from a generator seeded by (key, head)."""
    head1 = heads if head1 is None else head1
    kinds = 1 if k_only else 2
    out = torch.empty((layers, kinds, tokens, head1 - head0, dim), dtype=torch.float32)
    for h in range(head0, head1):
        seed = int.from_bytes(hashlib.blake2b(("%s/%d" % (key, h)).encode(),
                                              digest_size=8).digest(), "little") >> 1
        g = torch.Generator().manual_seed(seed)
        out[:, :, :, h - head0] = torch.randn((layers, kinds, tokens, dim), generator=g)
    if dtype == torch.uint8:  # fp8 bytes: any byte pattern
        out = (out * 40).clamp(-127, 127).to(torch.int8).view(torch.uint8)
    else:
        out = out.to(dtype)
    return out[:, 0] if k_only else out


class _Fp8:  # the device pool's dtype of an fp8 KV cache (older torch has no float8)
    def __str__(self):
        return "torch.float8_e4m3fn"


class _Fp8e5m2:
    def __str__(self):
        return "torch.float8_e5m2"


def shm_tensor(shape, dtype):
    """A tensor in a memfd shared-memory mapping (SGLang's "shm" allocator); the fd and the
    mapping are kept on the returned tensor's holder."""
    n = 1
    for s in shape:
        n *= s
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    fd = os.memfd_create("sglang-host-pool")
    os.ftruncate(fd, nbytes)
    mm = mmap.mmap(fd, nbytes)
    t = torch.frombuffer(mm, dtype=dtype).view(shape)
    return t, fd, mm


class _ShmAllocator:
    def __init__(self):
        self.fds, self.mms = [], []


class HostPool:
    """SGLang's MHATokenToKVPoolHost (layout layer_first, page_first, page_first_direct,
    page_head) or MLATokenToKVPoolHost (mla=True: one latent of `dim`, no page_head)."""

    def __init__(self, layout, layers=3, heads=2, dim=16, page=4, pages=8,
                 dtype=torch.float16, mla=False, fp8=None, allocator="default"):
        self.layout, self.page_size, self.layer_num = layout, page, layers
        self.head_num, self.head_dim, self.mla = (1 if mla else heads), dim, mla
        self.size, self.page_num = pages * page, pages
        self.dtype = torch.uint8 if fp8 else dtype
        self.kv_dtype = self.dtype
        self.device_pool = type("DevicePool", (), {"dtype": fp8() if fp8 else dtype})()
        if mla:
            self.kv_lora_rank = dim
            dims = {"layer_first": (layers, self.size, 1, dim),
                    "page_first": (self.size, layers, 1, dim),
                    "page_first_direct": (pages, layers, page, 1, dim)}[layout]
        else:
            H = heads
            dims = {"layer_first": (2, layers, self.size, H, dim),
                    "page_first": (2, self.size, layers, H, dim),
                    "page_first_direct": (2, pages, layers, page, H, dim),
                    "page_head": (2, pages, H, page, layers, dim)}[layout]
        if allocator == "shm":
            self.allocator = _ShmAllocator()
            self.kv_buffer, fd, mm = shm_tensor(dims, self.dtype)
            self.allocator.fds.append(fd)
            self.allocator.mms.append(mm)
        else:
            self.kv_buffer = torch.zeros(dims, dtype=self.dtype)
        self.free_slots = list(range(0, self.size, page))

    # -- HostKVCache's allocator
    def alloc(self, need):
        n = need // self.page_size
        if n > len(self.free_slots):
            return None
        got, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return torch.tensor([p + t for p in got for t in range(self.page_size)],
                            dtype=torch.int64)

    def free(self, indices):
        self.free_slots += [int(i) for i in indices[::self.page_size]]

    # -- SGLang's flat page interface
    def _page(self, index):
        p, r = index // self.page_size, index
        if self.mla:
            return {"layer_first": lambda: self.kv_buffer[:, r:r + self.page_size],
                    "page_first": lambda: self.kv_buffer[r:r + self.page_size],
                    "page_first_direct": lambda: self.kv_buffer[p:p + 1]}[self.layout]()
        return {"layer_first": lambda: self.kv_buffer[:, :, r:r + self.page_size],
                "page_first": lambda: self.kv_buffer[:, r:r + self.page_size],
                "page_first_direct": lambda: self.kv_buffer[:, p:p + 1],
                "page_head": lambda: self.kv_buffer[:, p:p + 1]}[self.layout]()

    def get_data_page(self, index, flat=True):
        page = self._page(int(index))
        return page.flatten() if flat else page

    def set_from_flat_data_page(self, index, data_page):
        page = self._page(int(index))
        page.copy_(data_page.reshape(page.shape))

    def get_dummy_flat_data_page(self):
        return torch.zeros(self._page(0).numel(), dtype=self.dtype)

    # -- the canonical block of a page, by explicit loops (independent of kvcd.sglang)
    def _cell(self, kv, layer, token_index, head):
        """The [dim] vector of (K or V, layer, host token index, head)."""
        b, t, P = self.kv_buffer, token_index, self.page_size
        if self.mla:
            return {"layer_first": lambda: b[layer, t, 0],
                    "page_first": lambda: b[t, layer, 0],
                    "page_first_direct": lambda: b[t // P, layer, t % P, 0]}[self.layout]()
        return {"layer_first": lambda: b[kv, layer, t, head],
                "page_first": lambda: b[kv, t, layer, head],
                "page_first_direct": lambda: b[kv, t // P, layer, t % P, head],
                "page_head": lambda: b[kv, t // P, head, t % P, layer]}[self.layout]()

    def write_canonical(self, index, block, head0=0):
        kinds = 1 if self.mla else 2
        for layer in range(self.layer_num):
            for kv in range(kinds):
                for tok in range(self.page_size):
                    for h in range(block.shape[-2]):
                        src = block[layer, tok, h] if self.mla else block[layer, kv, tok, h]
                        self._cell(kv, layer, index + tok, head0 + h).copy_(src)

    def read_canonical(self, index, head0=0, heads=None):
        heads = self.head_num if heads is None else heads
        kinds = 1 if self.mla else 2
        out = torch.empty((self.layer_num, kinds, self.page_size, heads, self.head_dim),
                          dtype=self.dtype)
        for layer in range(self.layer_num):
            for kv in range(kinds):
                for tok in range(self.page_size):
                    for h in range(heads):
                        out[layer, kv, tok, h] = self._cell(kv, layer, index + tok, head0 + h)
        return out[:, 0] if self.mla else out

    def fill(self, index, key, total_heads=None, head0=0):
        """Page at host index `index` := page_kv(key) for this pool's heads."""
        total = total_heads or self.head_num
        blk = page_kv(key, self.layer_num, total, self.page_size, self.head_dim, head0,
                      head0 + self.head_num, self.dtype, self.mla)
        self.write_canonical(index, blk)
        return blk


class MambaPool:
    """SGLang's MambaPoolHost, page_first: one state per slot (page_size 1), a temporal state
    [slots][layers][1][*shape] and conv states [slots][layers][1][*conv_shape]; a flat page
    is the concatenated bytes of them."""

    layout = "page_first"

    def __init__(self, slots=8, layers=2, temporal=(4, 8), conv=((6, 3),),
                 dtype=torch.float32):
        self.page_size, self.size, self.num_mamba_layers = 1, slots, layers
        self.temporal_buffer = torch.zeros((slots, layers, 1) + tuple(temporal), dtype=dtype)
        self.conv_buffer = [torch.zeros((slots, layers, 1) + tuple(c), dtype=torch.float16)
                            for c in conv]
        self.kv_buffer = [self.temporal_buffer, *self.conv_buffer]
        self.size_per_token = sum(b[0].numel() * b.element_size() for b in self.kv_buffer)
        self.free_slots = list(range(slots))

    def alloc(self, need):
        if need > len(self.free_slots):
            return None
        got, self.free_slots = self.free_slots[:need], self.free_slots[need:]
        return torch.tensor(got, dtype=torch.int64)

    def free(self, indices):
        self.free_slots += [int(i) for i in indices]

    def _tensors(self, index):
        yield self.temporal_buffer[index]
        for c in self.conv_buffer:
            yield c[index]

    def get_data_page(self, index, flat=True):
        return torch.cat([t.contiguous().view(torch.uint8).reshape(-1)
                          for t in self._tensors(int(index))])

    def get_dummy_flat_data_page(self):
        return torch.zeros(self.page_size * self.size_per_token, dtype=torch.uint8)

    def set_from_flat_data_page(self, index, data_page):
        flat = data_page.contiguous().view(torch.uint8).reshape(-1)
        at = 0
        for t in self._tensors(int(index)):
            n = t.numel() * t.element_size()
            t.copy_(flat[at:at + n].view(t.dtype).reshape(t.shape))
            at += n

    def fill(self, index, key):
        """The state taken at the end of page `key`."""
        g = torch.Generator().manual_seed(int(hashlib.blake2b(key.encode(), digest_size=7)
                                              .hexdigest(), 16))
        for t in self._tensors(int(index)):
            t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
        return self.get_data_page(index).clone()
