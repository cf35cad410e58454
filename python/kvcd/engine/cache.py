# DESIGN: the reference engine's paged KV cache, on the engine's device (CPU or CUDA). A page
# is exactly one kvcd block: a contiguous fp16 tensor in kvcd's canonical layout
# [layer][k/v][token][kv_head][head_dim]. Pages come from one preallocated pool; a sequence
# owns the pages its block table names. The per-layer K and V views of the pool
# ([pages, tokens, heads, dim], strided) are what kvcd's paged calls take: hits are scattered
# into the pages by libkvc (device to device, or DMA from the pinned host arena, on the
# current CUDA stream), and a put reads whole pages. Attention reads an fp32 mirror of the
# sequence's KV, filled from the pages (the fp16 values, widened), so loaded and computed KV
# feed attention the same numbers.
import torch


class PagedKVCache:
    def __init__(self, cfg, block_tokens, max_tokens, device="cpu"):
        self.cfg = cfg
        self.block_tokens = block_tokens
        self.npages = -(-max_tokens // block_tokens)
        shape = (self.npages, cfg.layers, 2, block_tokens, cfg.kv_heads, cfg.head_dim)
        self.pages = torch.zeros(shape, dtype=torch.float16, device=device)
        # One sequence at a time: its block table is the pool in order.
        self.table = list(range(self.npages))
        mirror = (cfg.layers, self.npages * block_tokens, cfg.kv_heads, cfg.head_dim)
        self.k32 = torch.zeros(mirror, device=device)
        self.v32 = torch.zeros(mirror, device=device)
        self.page_bytes = self.pages[0].numel() * self.pages.element_size()
        # The paged views kvcd's scatter and gather take: per layer [pages, tokens, heads, dim].
        self.k_layers = [self.pages[:, layer, 0] for layer in range(cfg.layers)]
        self.v_layers = [self.pages[:, layer, 1] for layer in range(cfg.layers)]

    def page(self, i):
        """Block i of the sequence: its page, a contiguous tensor (no copy)."""
        return self.pages[self.table[i]]

    def write(self, layer, pos, k, v):
        """Stores the KV of tokens [pos, pos + n) of one layer, rounded to fp16."""
        n, t = k.shape[0], self.block_tokens
        k16, v16 = k.to(torch.float16), v.to(torch.float16)
        i = 0
        while i < n:
            p = pos + i
            off = p % t
            m = min(t - off, n - i)
            page = self.pages[self.table[p // t], layer]
            page[0, off:off + m] = k16[i:i + m]
            page[1, off:off + m] = v16[i:i + m]
            i += m
        self.k32[layer, pos:pos + n] = k16.float()
        self.v32[layer, pos:pos + n] = v16.float()

    def loaded(self, first, n):
        """Blocks [first, first + n) were written into their pages from outside (kvcd
        hits): widen them into the mirror."""
        if n <= 0:
            return
        t = self.block_tokens
        idx = torch.as_tensor(self.table[first:first + n], dtype=torch.long,
                              device=self.pages.device)
        kv = self.pages.index_select(0, idx).float()  # [n, layers, 2, t, heads, dim]
        kv = kv.permute(1, 2, 0, 3, 4, 5).reshape(self.cfg.layers, 2, n * t,
                                                  self.cfg.kv_heads, self.cfg.head_dim)
        self.k32[:, first * t:(first + n) * t] = kv[:, 0]
        self.v32[:, first * t:(first + n) * t] = kv[:, 1]

    def read(self, layer, end):
        """fp32 K and V of tokens [0, end) of one layer: views, [end, kv_heads, head_dim]."""
        return self.k32[layer, :end], self.v32[layer, :end]
