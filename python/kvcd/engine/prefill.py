# DESIGN: a minimal decoder of the Llama-3 architecture for measuring what a kvcd hit saves
# an engine's prefill (tests/bench/bench_python.py, issue 26): bf16 weights drawn on the
# model's device from a fixed seed (one torch.randn per weight kind for every layer at once:
# 16 GB for the 8B shape in well under a second on a GPU, no checkpoint), a paged KV cache
# in vLLM's layout (per layer K and V tensors [pages, block_tokens, kv_heads, head_dim]), and
# the three things an engine does with kvcd around a prefill: store the KV it computed
# (reserve + gather from the paged cache, into the host arena or the daemon's GPU pool),
# load a prompt's cached prefix (one lookup, one scatter into the pages, on the current
# CUDA stream on a GPU) and compute the rest of the prompt against it.
#
# Unlike the reference engine (engine.py: fp32 compute, block by block, so that a hit
# reproduces the no-cache tokens bit for bit), a prefill here is one forward over all the
# tokens not loaded, as a serving engine runs it: attention through
# torch.nn.functional.scaled_dot_product_attention where PyTorch has it (2.0 and later: flash
# attention on a GPU), else an explicit softmax; RMSNorm without weights; RoPE in fp32. The
# KV a hit loads is the bytes an earlier prefill stored (checked by the benchmark), and the
# logits after a hit agree with the no-cache ones to bf16 precision (python/tests).
#
# The sequence's block table is the pool in order (one sequence at a time), so a layer's K
# of tokens [0, end) is a view of its tensor, no gather.
import math
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PrefillConfig:
    """Sizes of the decoder; the defaults are Llama-3-8B's."""

    vocab: int = 128256
    dim: int = 4096
    layers: int = 32
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    ffn_dim: int = 14336
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    seed: int = 0

    def model_id(self, tag=""):
        return ("kvcd-prefill/llama-v%d-d%d-l%d-h%d-kv%d-hd%d-f%d-s%d%s" %
                (self.vocab, self.dim, self.layers, self.heads, self.kv_heads, self.head_dim,
                 self.ffn_dim, self.seed, tag))

    def kv_token_bytes(self):
        """Bytes of KV of one token (bf16 K and V of every layer): 128 KiB for 8B."""
        return self.layers * 2 * self.kv_heads * self.head_dim * 2


LLAMA3_8B = PrefillConfig()


def small_config(**kw):
    """A decoder small enough for a CPU (the benchmark's smoke, the tests)."""
    base = dict(vocab=512, dim=128, layers=4, heads=4, kv_heads=2, head_dim=32, ffn_dim=384)
    base.update(kw)
    return PrefillConfig(**base)


def sync(device):
    """Times on a GPU count the device's work: wait for it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def current_stream(device):
    """The CUDA stream kvcd's calls queue on (torch's current one), None on the CPU."""
    if torch.device(device).type == "cuda":
        return torch.cuda.current_stream(device).cuda_stream
    return None


class PagedCache:
    """bf16 KV pages: one tensor [layers, 2, pages, block_tokens, kv_heads, head_dim]; the
    per-layer K and V views [pages, block_tokens, kv_heads, head_dim] are what kvcd's
    scatter and gather take."""

    def __init__(self, cfg, block_tokens, max_tokens, device):
        self.cfg = cfg
        self.block_tokens = block_tokens
        self.npages = -(-max_tokens // block_tokens)
        self.kv = torch.zeros(cfg.layers, 2, self.npages, block_tokens, cfg.kv_heads,
                              cfg.head_dim, dtype=torch.bfloat16, device=device)
        self.table = list(range(self.npages))
        self.k_layers = [self.kv[layer, 0] for layer in range(cfg.layers)]
        self.v_layers = [self.kv[layer, 1] for layer in range(cfg.layers)]
        self.page_bytes = cfg.layers * 2 * block_tokens * cfg.kv_heads * cfg.head_dim * 2

    def layer(self, layer):
        """K and V of one layer as [tokens, kv_heads, head_dim] views (the table is in order)."""
        n = self.npages * self.block_tokens
        return (self.kv[layer, 0].view(n, self.cfg.kv_heads, self.cfg.head_dim),
                self.kv[layer, 1].view(n, self.cfg.kv_heads, self.cfg.head_dim))

    def pages(self, n):
        """The first n pages of every layer, K and V (a view)."""
        return self.kv[:, :, :n]


class Decoder:
    """forward(tokens, pos, cache): the logits of the last of tokens at positions
    [pos, pos + len), attending to the cache's KV of [0, pos), its own written into it."""

    def __init__(self, cfg: PrefillConfig, device, max_tokens):
        if cfg.heads % cfg.kv_heads or cfg.head_dim % 2:
            raise ValueError("heads must be a multiple of kv_heads, head_dim even")
        self.cfg = cfg
        self.device = torch.device(device)
        g = torch.Generator(device=self.device).manual_seed(cfg.seed)
        bf = torch.bfloat16
        layers, d, f = cfg.layers, cfg.dim, cfg.ffn_dim
        qd, kvd = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim

        def w(*shape):  # [..., in, out], scaled so activations keep their size
            t = torch.empty(*shape, device=self.device, dtype=bf)
            for part in (t if len(shape) > 2 else [t]):  # a layer at a time: < 2^31 elements
                part.normal_(generator=g).mul_(1.0 / math.sqrt(shape[-2]))
            return t

        self.embed = torch.randn(cfg.vocab, d, generator=g, device=self.device, dtype=bf)
        self.wqkv = w(layers, d, qd + 2 * kvd)
        self.wo = w(layers, qd, d)
        self.w13 = w(layers, d, 2 * f)  # gate and up side by side
        self.w2 = w(layers, f, d)
        self.lm_head = w(d, cfg.vocab)
        half = cfg.head_dim // 2
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(half, dtype=torch.float32) / half))
        ang = torch.arange(max_tokens, dtype=torch.float32)[:, None] * inv[None, :]
        self.cos = ang.cos()[:, None, :].to(self.device)  # [tokens, 1, half]
        self.sin = ang.sin()[:, None, :].to(self.device)
        self.sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)

    def _rms(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)).to(x.dtype)

    def _rope(self, x, cos, sin):
        """Rotates the halves of each head of x [n, heads, head_dim] (Llama's rotate_half)."""
        xf = x.float()
        half = xf.shape[-1] // 2
        x0, x1 = xf[..., :half], xf[..., half:]
        return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).to(x.dtype)

    def _attend(self, q, k, v, pos):
        """q [n, heads, head_dim] at positions [pos, pos + n); k, v [pos + n, kv_heads,
        head_dim]. Returns [n, heads * head_dim]."""
        cfg = self.cfg
        n, end = q.shape[0], k.shape[0]
        group = cfg.heads // cfg.kv_heads
        qh = q.transpose(0, 1).unsqueeze(0)  # [1, heads, n, head_dim]
        kh = k.transpose(0, 1).repeat_interleave(group, 0).unsqueeze(0)
        vh = v.transpose(0, 1).repeat_interleave(group, 0).unsqueeze(0)
        mask = None
        if pos:  # queries see keys up to their own position (SDPA's is_causal is top-left)
            mask = (torch.arange(end, device=self.device)[None, :] <=
                    torch.arange(pos, end, device=self.device)[:, None])
        if self.sdpa is not None:
            o = (self.sdpa(qh, kh, vh, is_causal=True) if mask is None else
                 self.sdpa(qh, kh, vh, attn_mask=mask))
        else:
            if mask is None:
                mask = torch.ones(n, end, dtype=torch.bool, device=self.device).tril()
            s = (qh.float() @ kh.float().transpose(-1, -2)) / math.sqrt(cfg.head_dim)
            o = (torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ vh.float()).to(q.dtype)
        return o[0].transpose(0, 1).reshape(n, cfg.heads * cfg.head_dim)

    @torch.no_grad()
    def forward(self, tokens, pos, cache):
        """tokens: a 1-D integer tensor on the model's device. Returns fp32 logits [vocab]."""
        cfg = self.cfg
        n = tokens.shape[0]
        end = pos + n
        if end > cache.npages * cache.block_tokens or end > self.cos.shape[0]:
            raise ValueError("%d tokens do not fit the cache or the rope table" % end)
        qd, kvd = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        cos, sin = self.cos[pos:end], self.sin[pos:end]
        x = self.embed[tokens]
        for layer in range(cfg.layers):
            q, k, v = (self._rms(x) @ self.wqkv[layer]).split([qd, kvd, kvd], -1)
            q = self._rope(q.view(n, cfg.heads, cfg.head_dim), cos, sin)
            kc, vc = cache.layer(layer)
            kc[pos:end] = self._rope(k.view(n, cfg.kv_heads, cfg.head_dim), cos, sin)
            vc[pos:end] = v.view(n, cfg.kv_heads, cfg.head_dim)
            x = x + self._attend(q, kc[:end], vc[:end], pos) @ self.wo[layer]
            gate, up = (self._rms(x) @ self.w13[layer]).split(cfg.ffn_dim, -1)
            x = x + (torch.nn.functional.silu(gate) * up) @ self.w2[layer]
        return (self._rms(x[-1:]) @ self.lm_head).float()[0]


def store(ns, paged, keys, table, block_tokens, gpu=False, device="cpu", chunk=256):
    """Puts the cache's KV of the blocks of keys (sequence blocks 0..len-1) into kvcd:
    reserve + gather, chunk keys at a time (gpu: slots may be in the daemon's GPU pool).
    Returns the blocks written."""
    stream, done = current_stream(device), 0
    for j in range(0, len(keys), chunk):
        part = keys[j:j + chunk]
        with ns.reserve(part, parent=keys[j - 1] if j else None, gpu=gpu) as r:
            if r.reserved != len(part):
                raise RuntimeError("reserve: %d of %d slots (already cached?)" %
                                   (r.reserved, len(part)))
            done += r.gather(paged, None, table, first=0, first_token=j * block_tokens,
                             stream=stream)
    return done


def load(ns, paged, keys, table, gpu=False, device="cpu", tiers=None, held=None, stamps=None):
    """Loads the cached prefix of keys into the pages (one lookup, one scatter on the
    current stream) and waits for it; returns the hits. tiers: a list that gets each hit's
    tier ("host", "gpu"), outside any timing. held: None releases the lease before the
    wait (its release waits for the scatter, then unpins); a list gets the lease instead,
    for the caller to release once its forward has run, as an engine does (the vLLM
    connector releases a step's loads at the next step: the unpin is not on the load's
    path, and the release's wait finds the copies done). stamps: a list that gets
    time.perf_counter() after the lookup and after the scatter is queued (the wait follows),
    for a caller that splits the load's time."""
    lease = ns.lookup(keys, gpu=gpu)
    if stamps is not None:
        stamps.append(time.perf_counter())
    try:
        n = len(lease)
        if n:
            lease.scatter(paged, None, table, stream=current_stream(device))
        if stamps is not None:
            stamps.append(time.perf_counter())
        if tiers is not None:
            tiers.extend(lease.tier(i) for i in range(n))
    except BaseException:
        lease.release()
        raise
    if held is None:
        lease.release()
    sync(device)
    if held is not None:
        held.append(lease)
    return n
