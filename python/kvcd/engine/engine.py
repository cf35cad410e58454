# DESIGN: the reference engine: greedy generation with its paged KV cache shared through
# kvcd, on the CPU or a CUDA device (device=None: CUDA when torch sees one). A request
# computes the chained keys of its prompt's full blocks, loads the longest cached prefix into
# its pages (one lookup, one scatter of the hits into the paged cache: on a GPU straight into
# device memory on the current stream), computes the rest, and puts the blocks it computed
# (its pages, device tensors on a GPU). Prefill runs block by block, each chunk exactly one block aligned
# to the block grid: the KV of a block then depends on its tokens and the KV before it alone,
# never on how much of the prompt happened to be cached, so a raw hit holds the very bytes
# this process would have computed and generation with hits is bit for bit the run without.
# The last prompt token is always computed (its logits give the first new token), so at most
# (len(prompt) - 1) // block_tokens blocks are loaded.
import collections
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

import kvcd
from kvcd.engine.cache import PagedKVCache
from kvcd.engine.model import Model, ModelConfig


@dataclass
class Generation:
    """What one generate() call produced and what it cost."""

    tokens: List[int]  #: the greedy tokens (argmax of each step's logits)
    logits: List[torch.Tensor] = field(default_factory=list)  #: per step, when kept
    prefill_s: float = 0.0  #: lookup + loads + prompt compute, up to the first logits
    #  (on a GPU: until the device finished them)
    load_s: float = 0.0  #: of which lookup and copies out of kvcd
    put_s: float = 0.0  #: storing the computed blocks, after prefill
    hit_blocks: int = 0
    loaded_tokens: int = 0
    computed_tokens: int = 0  #: prompt tokens computed
    put_blocks: int = 0  #: blocks this call wrote into kvcd
    formats: Dict[str, int] = field(default_factory=dict)  #: hits by stored format


class Engine:
    """A model, a paged KV cache of max_tokens, and optionally a kvcd namespace.

    Without a socket or client the engine runs with no cache. k_codec/v_codec name codecs
    the namespace allows the daemon to store its blocks in (kvcd.Client.namespace); a
    different setting needs a different model_id."""

    def __init__(self, cfg: Optional[ModelConfig] = None, block_tokens: int = 16,
                 max_tokens: int = 8192, socket_path=None, client=None, model_id=None,
                 k_codec=None, v_codec=None, raw_layers=0, model: Optional[Model] = None,
                 threads: Optional[int] = None, device=None):
        if threads:
            torch.set_num_threads(threads)
        if device is None:
            device = model.device if model is not None else (
                "cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(device)
        self.model = model or Model(cfg or ModelConfig(), device=self.device)
        if self.model.device != self.device:
            raise ValueError("the model is on %s, the engine on %s" %
                             (self.model.device, self.device))
        self.cfg = self.model.cfg
        self.block_tokens = block_tokens
        self.cache = PagedKVCache(self.cfg, block_tokens, max_tokens, device=self.device)
        self.max_tokens = self.cache.npages * block_tokens
        self._own_client = None
        self.client = client
        self.ns = None
        if client is None and socket_path is not None:
            self.client = self._own_client = kvcd.Client(socket_path)
        if self.client is not None:
            c = self.cfg
            # KV computed on another kind of device differs in its last bits: its own
            # namespace (everything that changes the KV is in the model id).
            mid = model_id or "%s-t%d%s" % (c.model_id(), block_tokens,
                                             "" if self.device.type == "cpu" else
                                             "-" + self.device.type)
            self.ns = self.client.namespace(mid, c.layers, c.kv_heads, c.head_dim, block_tokens,
                                            "fp16", k_codec=k_codec, v_codec=v_codec,
                                            raw_layers=raw_layers)
            if self.ns.block_bytes != self.cache.page_bytes:
                raise RuntimeError("kvcd block of %d bytes, page of %d" %
                                   (self.ns.block_bytes, self.cache.page_bytes))
            # The paged cache as kvcd's scatter takes it, read and checked once.
            self.paged = self.ns.paged_kv(self.cache.k_layers, self.cache.v_layers)

    def _sync(self):
        """Times on a GPU count the device's work: wait for it."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self):
        if self._own_client is not None:
            self._own_client.close()
            self._own_client = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _prefill_from(self, prompt, pos):
        """Computes prompt[pos:] block by block (pos on the block grid); returns the last
        logits."""
        t, n = self.block_tokens, len(prompt)
        logits = None
        while pos < n:
            end = min(n, (pos // t + 1) * t)
            logits = self.model.forward(prompt[pos:end], pos, self.cache)
            pos = end
        return logits[-1]

    def generate(self, prompt, max_new_tokens=16, use_cache=True, put=True, forced=None,
                 keep_logits=False) -> Generation:
        """Greedy generation of max_new_tokens after prompt (a list of token ids).

        use_cache: load the cached prefix from kvcd; put: store the prompt's computed full
        blocks. forced: feed these tokens instead of the model's own picks (teacher forcing,
        to compare logits step by step against another run); tokens still reports the
        model's picks. keep_logits: keep every step's logits (fp32 tensors)."""
        prompt = [int(x) for x in prompt]
        n, t = len(prompt), self.block_tokens
        if n == 0 or n + max_new_tokens > self.max_tokens:
            raise ValueError("prompt of %d tokens + %d new does not fit %d" %
                             (n, max_new_tokens, self.max_tokens))
        g = Generation(tokens=[])
        formats = collections.Counter()
        keys = self.ns.keys_from_tokens(prompt) if self.ns is not None else []
        self._sync()
        t0 = time.perf_counter()
        usable = keys[:(n - 1) // t]
        if use_cache and usable:
            with self.ns.lookup(usable) as lease:
                g.hit_blocks = len(lease)
                if g.hit_blocks:  # into the pages, on the current stream on a GPU
                    lease.scatter(self.paged, None, self.cache.table)
                for i in range(g.hit_blocks):
                    formats[lease.stored(i)] += 1
            self.cache.loaded(0, g.hit_blocks)
        self._sync()
        g.load_s = time.perf_counter() - t0
        g.loaded_tokens = g.hit_blocks * t
        g.computed_tokens = n - g.loaded_tokens
        last = self._prefill_from(prompt, g.loaded_tokens)
        self._sync()
        g.prefill_s = time.perf_counter() - t0
        g.formats = dict(formats)
        if put and len(keys) > g.hit_blocks:
            t1 = time.perf_counter()
            h = g.hit_blocks
            g.put_blocks = self.ns.put_prefix(keys[h:], [self.cache.page(i)
                                                         for i in range(h, len(keys))],
                                              parent=keys[h - 1] if h else None)
            g.put_s = time.perf_counter() - t1
        pos = n
        for step in range(max_new_tokens):
            tok = int(torch.argmax(last))
            g.tokens.append(tok)
            if keep_logits:
                g.logits.append(last.clone())
            if step + 1 == max_new_tokens:
                break
            feed = forced[step] if forced is not None else tok
            last = self.model.forward([feed], pos, self.cache)[-1]
            pos += 1
        return g
