# DESIGN: the reference engine's model: a small decoder of the Llama architecture (RMSNorm,
# rotary position embedding, grouped-query attention, SwiGLU), its weights drawn from a fixed
# seed, so every process builds the same model without a checkpoint. It computes in fp32 and
# keeps its KV in fp16, the dtype of its kvcd namespace; forward() reads and writes the KV
# through a cache object (cache.py), never owning it. The weights are drawn on the CPU and
# moved to the model's device (a CUDA device when the engine runs on one), so the same seed
# gives the same model everywhere.
import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the model. The default runs a 4k-token prompt on 2 CPU cores in seconds."""

    vocab: int = 512
    dim: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    ffn_dim: int = 384
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    seed: int = 0
    # The channel structure of real keys (KIVI, KVQuant: a few channels of Llama-family keys
    # are an order of magnitude larger): key_outliers channels of each KV head, chosen from
    # a generator of their own, get their wk rows scaled by outlier_scale. 0: none (the
    # weights are then those of earlier versions, bit for bit).
    key_outliers: int = 0
    outlier_scale: float = 10.0

    def model_id(self):
        """The model id of the kvcd namespace: everything that changes the KV is in it."""
        mid = ("kvcd-ref/llama-v%d-d%d-l%d-h%d-kv%d-hd%d-f%d-s%d" %
               (self.vocab, self.dim, self.layers, self.heads, self.kv_heads, self.head_dim,
                self.ffn_dim, self.seed))
        if self.key_outliers:
            mid += "-ko%d-x%g" % (self.key_outliers, self.outlier_scale)
        return mid


def tiny_config(**kw):
    """A model small enough for the test suite (a prompt takes milliseconds)."""
    base = dict(vocab=300, dim=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn_dim=128)
    base.update(kw)
    return ModelConfig(**base)


class Model:
    """The decoder. forward() runs n new tokens at positions [pos, pos + n) against the
    cache's KV of [0, pos), writes theirs into it and returns the logits of the n tokens."""

    def __init__(self, cfg: ModelConfig, device="cpu"):
        if cfg.heads % cfg.kv_heads:
            raise ValueError("heads must be a multiple of kv_heads")
        self.cfg = cfg
        self.device = torch.device(device)
        # None, or a list forward() appends (layer, attention output of its last query
        # [kv_heads, group, head_dim]) to: fidelity measurements compare them per layer.
        self.trace = None
        g = torch.Generator().manual_seed(cfg.seed)

        def w(rows, cols):
            return torch.randn(rows, cols, generator=g) / math.sqrt(cols)

        qd, kvd = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.embed = torch.randn(cfg.vocab, cfg.dim, generator=g)
        self.blocks = []
        for _ in range(cfg.layers):
            self.blocks.append(dict(
                attn_norm=1 + 0.1 * torch.randn(cfg.dim, generator=g),
                wq=w(qd, cfg.dim), wk=w(kvd, cfg.dim), wv=w(kvd, cfg.dim), wo=w(cfg.dim, qd),
                ffn_norm=1 + 0.1 * torch.randn(cfg.dim, generator=g),
                w1=w(cfg.ffn_dim, cfg.dim), w3=w(cfg.ffn_dim, cfg.dim),
                w2=w(cfg.dim, cfg.ffn_dim)))
        if cfg.key_outliers:
            if not 0 < cfg.key_outliers <= cfg.head_dim:
                raise ValueError("key_outliers must be in [0, head_dim]")
            go = torch.Generator().manual_seed(cfg.seed + 0x6b6f)
            for b in self.blocks:
                for h in range(cfg.kv_heads):
                    ch = torch.randperm(cfg.head_dim, generator=go)[:cfg.key_outliers]
                    b["wk"][h * cfg.head_dim + ch] *= cfg.outlier_scale
        self.norm = 1 + 0.1 * torch.randn(cfg.dim, generator=g)
        self.lm_head = w(cfg.vocab, cfg.dim)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim))
        self._inv_freq = inv
        if self.device.type != "cpu":
            dev = self.device
            self.embed, self.norm, self.lm_head = (self.embed.to(dev), self.norm.to(dev),
                                                   self.lm_head.to(dev))
            self._inv_freq = inv.to(dev)
            self.blocks = [{k: v.to(dev) for k, v in b.items()} for b in self.blocks]

    def rms_norm(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps) * weight

    def rope(self, x, pos):
        """Rotates pairs (2i, 2i+1) of each head of x [n, heads, head_dim] by pos * freq_i."""
        n = x.shape[0]
        angles = (torch.arange(pos, pos + n, dtype=torch.float32, device=self.device)[:, None] *
                  self._inv_freq)
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    @torch.no_grad()
    def forward(self, tokens, pos, cache):
        cfg = self.cfg
        n = len(tokens)
        end = pos + n
        group = cfg.heads // cfg.kv_heads
        x = self.embed[torch.as_tensor(tokens, dtype=torch.long, device=self.device)]
        # Causal mask of the n queries over keys [0, end).
        mask = (torch.arange(end, device=self.device)[None, :] >
                torch.arange(pos, end, device=self.device)[:, None])
        for layer, b in enumerate(self.blocks):
            h = self.rms_norm(x, b["attn_norm"])
            q = self.rope((h @ b["wq"].T).view(n, cfg.heads, cfg.head_dim), pos)
            k = self.rope((h @ b["wk"].T).view(n, cfg.kv_heads, cfg.head_dim), pos)
            v = (h @ b["wv"].T).view(n, cfg.kv_heads, cfg.head_dim)
            cache.write(layer, pos, k, v)
            keys, values = cache.read(layer, end)  # [end, kv_heads, head_dim], fp32
            qg = q.view(n, cfg.kv_heads, group, cfg.head_dim).permute(1, 2, 0, 3)
            scores = qg @ keys.permute(1, 2, 0)[:, None] / math.sqrt(cfg.head_dim)
            scores = scores.masked_fill(mask, float("-inf"))
            att = torch.softmax(scores, dim=-1) @ values.permute(1, 0, 2)[:, None]
            if self.trace is not None:
                self.trace.append((layer, att[:, :, -1].detach().clone()))
            x = x + att.permute(2, 0, 1, 3).reshape(n, -1) @ b["wo"].T
            h = self.rms_norm(x, b["ffn_norm"])
            x = x + (torch.nn.functional.silu(h @ b["w1"].T) * (h @ b["w3"].T)) @ b["w2"].T
        return self.rms_norm(x, self.norm) @ self.lm_head.T
