# DESIGN: type stub of the kvcd package (python/kvcd/_kvcd*.c); the docstrings are the API's
# reference. Keys are 16-byte bytes objects (libkvc's struct kvc_key); blocks are buffers of
# Namespace.block_bytes bytes in the namespace's layout and dtype.
from types import TracebackType
from typing import Any, Optional, Sequence, Type, Union
from os import PathLike

# Any object with the buffer protocol (numpy arrays included) is accepted where Buffer is,
# and so is a tensor: any object with data_ptr(), element_size(), numel(), is_contiguous()
# and device (.type "cpu" or "cuda"), as torch.Tensor has. CUDA tensors take libkvc's
# device paths. The package imports neither torch nor CUDA.
Buffer = Union[bytes, bytearray, memoryview, Any]
# A CUDA stream: None (torch's current stream for a torch CUDA tensor, else the legacy
# default stream), a cudaStream_t as an int, or an object with .cuda_stream
# (torch.cuda.Stream).
Stream = Union[None, int, Any]
# An engine's paged KV cache of one kind (K or V): one tensor per layer of the namespace,
# [pages, page_tokens, kv_heads, head_dim] (any strides, head_dim contiguous), or for K+V in
# one tensor [2, pages, ...] (kv_dim=0, flash-attn) / [pages, 2, ...] (kv_dim=1, FlashInfer)
# with v_caches None, or MLA's [pages, page_tokens, dim] (a K-only namespace).
KVCaches = Sequence[Any]

SLOT_PRESENT: int  #: already cached: nothing to write
SLOT_RESERVED: int  #: a slot is yours: write it, then commit
SLOT_BUSY: int  #: another client is writing this block now
SLOT_SKIPPED: int  #: follows a busy key; try again after that one is committed
SLOT_NOSPACE: int  #: no room could be made
HEAD_UNKNOWN: int  #: a head with no per-head hint yet (counted as full)
HEAD_SINK: int  #: a head that looks at the sink blocks
HEAD_LOCAL: int  #: a head that looks at the sinks and the most recent blocks
HEAD_FULL: int  #: a head that spreads its attention (retrieval)

class Error(OSError):
    """A libkvc call failed. ``errno`` is the error (``errno.EPIPE``...), ``strerror``
    libkvc's message (kvc_strerror)."""

def default_socket() -> str:
    """The socket path ``Client()`` connects to: $KVCD_SOCKET, else
    $XDG_RUNTIME_DIR/kvcd.sock, else /run/kvcd/kvcd.sock."""

class Client:
    """One connection to kvcd. Usable from several threads (libkvc serialises the calls of
    one client; use one client per thread for parallel round trips). Round trips and copies
    release the GIL."""

    closed: bool
    def __init__(self, socket_path: Union[str, bytes, PathLike, None] = None) -> None:
        """Connects; raises Error (ENOENT, ECONNREFUSED, EACCES, EUSERS...; the path tried,
        default_socket() without one, is its filename). A Client
        connects once: calling __init__ again (even after close()) raises RuntimeError;
        make a new Client instead."""
    def namespace(self, model_id: str, layers: int, kv_heads: int, head_dim: int,
                  block_tokens: int, dtype: str = "fp16", k_only: bool = False,
                  k_codec: Optional[str] = None, v_codec: Optional[str] = None,
                  raw_layers: int = 0) -> Namespace:
        """Opens (creating if new) the namespace of ``model_id`` with this layout. dtype:
        fp16, bf16, fp32, fp8_e4m3 or int8. Error EINVAL on a bad layout, EEXIST when the
        model id is known with another layout.

        k_codec / v_codec (kvc_ns_open_quant): let the daemon store cold blocks of this
        namespace lossy under memory pressure, keys in k_codec and values in v_codec (one
        of q8_0, q4_1, q5_1, kivi2, kivi4, fp8, rot2, rot4, merge, lowrank; None keeps that kind raw), layers
        [0, raw_layers) raw; fp16 and bf16 only. The creator's setting stays with the
        namespace: another one under the same model id is EEXIST."""
    def namespace_kind(self, model_id: str, layers: int, kv_heads: int, head_dim: int,
                       block_tokens: int, dtype: str = "fp16", kind: str = "kv",
                       window_tokens: int = 0) -> Namespace:
        """Opens (creating if new) the namespace of one kind of layer of a hybrid model (one
        namespace per kind, under the same keys; docs/engines.md "Hybrid models"): "kv",
        "k_only", "kv_window" (sliding-window layers laid out as KV; window_tokens the window,
        1..65535: a lookup answers with the window of the longest prefix whose window is
        cached, Lease.first where it starts) or "state" (a fixed-size state per layer,
        layers x kv_heads x head_dim elements, valid at the end of the block it is stored
        under: a lookup answers with the state of the longest prefix that has one). The kind
        and window are part of the layout (another under the same model id is EEXIST); a
        state namespace takes no codec. ValueError for an unknown kind or a window given to
        another kind (or missing for kv_window)."""
    def evict(self, ns_id: int = 0, tier: int = 0) -> int:
        """(admin) Evicts every unpinned block of namespace ns_id (0: all) in tier (0: all,
        1: host); returns how many. Error EPERM for a client that is not an admin, ENOENT
        for an unknown namespace."""
    def metrics(self) -> str:
        """Every counter the caller may see, in the Prometheus text format (kvc_metrics)."""
    def namespaces(self) -> list[dict]:
        """The namespaces the caller may see: a dict each with id, arena, model_id, layers,
        kv_heads, head_dim, block_tokens, dtype, kv_kind ("kv", "k_only", "kv_window",
        "state"), block_bytes, blocks, bytes."""
    def stats(self, scope: int = 0) -> dict[str, int]:
        """The daemon's counters (scope 0) or a namespace's (scope = Namespace.id)."""
    def flush(self) -> None:
        """Waits until every block put_prefix on this client stored is visible to every
        client (kvc_flush). put_prefix sends its commit without waiting: this connection sees
        the blocks at once, others once the daemon took the commit. Raises Error for a commit
        that failed since the last report (put_prefix raises it first if it comes first)."""
    def close(self) -> None:
        """Closes the connection. Every later call on it, its namespaces, leases and
        reservations raises ValueError. Leases and reservations not finished are released
        and aborted; views still exported from them stay valid, and the connection and its
        arena mapping stay until the last of them is released. Idempotent."""
    def gpu_attach(self) -> int:
        """Attaches to the daemon's GPU pool and registers the host arenas for DMA
        (kvc_gpu_attach; the first call that needs it does it). 1: the pool is mapped here
        (device-to-device hits), 0: hits are copied from host memory. Call it from a thread
        whose current CUDA device is the engine's."""
    def __enter__(self) -> Client: ...
    def __exit__(self, t: Optional[Type[BaseException]], v: Optional[BaseException],
                 tb: Optional[TracebackType]) -> bool:
        """close()."""

class Namespace:
    """One model's KV layout, opened by Client.namespace(). Holds its client."""

    block_bytes: int  #: bytes of one block
    block_tokens: int  #: tokens per block
    id: int  #: the daemon's namespace id
    model_id: str
    kind: str  #: "kv", "k_only", "kv_window" or "state"
    window_tokens: int  #: the window of a kv_window namespace (0 for the other kinds)
    def keys_from_tokens(self, tokens: Sequence[int], parent: Optional[bytes] = None,
                         extra: bytes = b"") -> list[bytes]:
        """Chained keys of the full blocks of ``tokens`` (the tail of fewer than
        block_tokens gets none). ``parent``: the last key of an earlier call, to continue a
        prefix; ``extra`` (adapter id, tenant salt) is mixed into every key. No round trip."""
    def lookup(self, keys: Sequence[bytes], ready_only: bool = False, nowait: bool = False,
               gpu: bool = False) -> Lease:
        """Pins the longest cached prefix of ``keys``; ``len(lease)`` is the number of hits
        (0: an empty lease). ready_only: stop at the first block not in memory now (the
        reads of the rest still start); nowait: return at once, with hits still being read
        from disk too (Lease.ready() counts the leading ones in memory, Lease.wait() waits;
        the daemon does not wait for room or the pool's copy slots either); gpu: hits may
        be in the daemon's GPU pool (device memory: no view; copy_into or scatter). Error
        EINVAL (a key repeated), EDQUOT, EMFILE, EPIPE."""
    def hint(self, keys: Sequence[bytes], scores: Sequence[float],
             kind: str = "attention") -> int:
        """Per-block importance for the eviction policies: ``kind`` "attention" (H2O: the
        attention mass each block received, added to its decayed mass) or "snapkv" (the
        observation window's score). Returns how many cached blocks took one. Error EINVAL
        (a negative or non-finite score, more than 2048 keys)."""
    def hint_heads(self, keys: Sequence[bytes], scores: Sequence[float], layers: int,
                   heads: int, kind: str = "attention") -> int:
        """hint() with one score per (layer, KV head): ``scores`` flat, len(keys) x layers x
        heads, layer-major; layers and heads the namespace's. A block takes the sum of its
        scores; the daemon learns which heads look at sinks, a local window or everything and
        keeps the latter raw in quantized blocks (docs/policies.md). ValueError for a count
        that does not match; Error EINVAL (a negative or non-finite score, another shape)."""
    def lookup_budget(self, keys: Sequence[bytes], budget: int, policy: Optional[str] = None,
                      sinks: int = 0, recent: int = 0,
                      query: Optional[Sequence[float]] = None,
                      per_head: bool = False) -> tuple[Any, ...]:
        """Of the longest cached prefix of ``keys`` in memory, at most ``budget`` blocks:
        the ``sinks`` first and ``recent`` last ones, the rest by ``policy``'s importance
        ("h2o", "snapkv", "quest" with a ``query`` of head_dim floats, ...; None: the
        namespace's). Returns (positions of the selected blocks in keys, ascending; the
        cached prefix's length; a Lease whose hit i is the block at positions[i]).
        ``per_head``: ``budget`` is the blocks of each (layer, kv head) on average over the
        namespace's head profile (kvc_lookup_budget_heads: sink-only and local heads keep
        the sinks, at least 1, and the window; the full heads share the rest, so the Lease
        holds what a full head keeps); returns (positions, prefix length, Lease, profile:
        layers x kv_heads of HEAD_UNKNOWN/HEAD_SINK/HEAD_LOCAL/HEAD_FULL, layer-major)."""
    def paged_kv(self, k_caches: KVCaches, v_caches: Optional[KVCaches] = None,
                 kv_dim: int = 0) -> PagedKV:
        """An engine's paged KV cache (as Lease.scatter takes it) read and checked against
        this namespace once, for the scatters and gathers of every step: pass it as
        k_caches with v_caches None. It holds the tensors; they must not be resized."""
    def reserve(self, keys: Sequence[bytes], parent: Optional[bytes] = None,
                gpu: bool = False) -> Reservation:
        """Reserves slots for the keys of the chain parent -> keys[0] -> ... not cached yet.
        The parent may be a slot this client reserved and has not committed yet (commit
        that reservation first). Finish it (commit/abort, or a with block) within the daemon's
        server.reservation_timeout. No keys (a prefix wholly hit) give an empty
        reservation, no round trip. gpu: slots may be in the daemon's GPU pool (no views;
        write or gather)."""
    def put_prefix(self, keys: Sequence[bytes], buffers: Sequence[Buffer],
                   parent: Optional[bytes] = None, stream: Stream = None) -> int:
        """Stores buffers[i] (block_bytes each, C-contiguous) under keys[i] for every key not
        cached yet; returns the number of blocks written. One round trip: the commit is sent
        without waiting, so this client sees the blocks at once and other clients once the
        daemon took it (Client.flush() waits for that). A commit that failed is raised by the
        next put_prefix (which then stores nothing) or Client.flush(). With CUDA tensors
        among the buffers: per 2,048 keys a reservation, each block copied from the device on
        ``stream``, and a commit that waits for those copies and for the daemon."""
    def get_prefix(self, keys: Sequence[bytes], buffers: Sequence[Buffer],
                   stream: Stream = None) -> int:
        """Copies the longest cached prefix into the writable buffers[0..hit); returns hit.
        Into CUDA tensors the copies are queued on ``stream`` (rows of one tensor: one range
        copy) and the call returns once they landed (its release waits for its own copies,
        never the whole device)."""

class PagedKV:
    """An engine's paged KV cache checked once (Namespace.paged_kv)."""

    pages: int  #: pages of the cache
    page_tokens: int  #: tokens per page
    on_device: bool  #: CUDA tensors

class Lease:
    """Pinned hits of one lookup. A context manager: the with block releases it."""

    released: bool  #: True after release() or the client's close() (and for 0 hits)
    block_bytes: int
    first: int  #: position in the looked-up keys of hit 0 (kv_window, state; 0 otherwise)
    def __len__(self) -> int:
        """Number of hits."""
    def __getitem__(self, i: int) -> memoryview:
        """A read-only memoryview of hit i (negative i counts from the end) inside the
        shared arena, without a copy: ``numpy.frombuffer(lease[i], numpy.float16)`` views
        it. It is the hit as stored: block_bytes of raw KV, or, for a hit the daemon
        quantized, the encoded block (smaller; ``lease[i].obj.encoded`` is True and
        ``lease[i].obj.codec`` names the codec, as stored(i) does; copy_into() decodes).
        The view holds the lease: it stays valid (the block stays pinned and mapped) after
        release() or close(), until the view and everything made from it are gone.
        ValueError once released; BufferError for a hit in the GPU pool."""
    def copy_into(self, i: int, buffer: Buffer, stream: Stream = None) -> None:
        """Copies hit i (dequantized if stored lossy) into a writable buffer or tensor of at
        least block_bytes; the GIL is released during the copy. Into a CUDA tensor it is
        queued on ``stream`` and returns at once; release() waits for it."""
    def scatter(self, k_caches: KVCaches, v_caches: Optional[KVCaches],
                block_table: Sequence[int], *, first: int = 0, n: Optional[int] = None,
                first_token: int = 0, layers: Union[None, int, range] = None,
                stream: Stream = None, event: Optional[int] = None, kv_dim: int = 0) -> int:
        """Loads hits [first, first + n) (n None: the rest) into an engine's paged KV cache:
        hit j is sequence tokens [first_token + j*block_tokens, ...), token p at page
        block_table[p // page_tokens]. ``layers`` (an int or a range of step 1): only those
        layers move, the others are not touched. CUDA tensors: queued on ``stream`` (pool
        hits by a kernel, host hits by DMA), ``event`` (a cudaEvent_t) recorded after it;
        the caller's stream waits on it, never the host (with torch: record a
        torch.cuda.Event on the stream after the call). Every page touched is checked
        against the tensors' page count, shapes and dtype against the namespace; ValueError
        or TypeError before anything moves. ``block_table`` is read only up to the last
        page the call touches. Returns n."""
    def ready(self) -> int:
        """The leading hits in memory now (lookup(nowait=True) may return hits still being
        read from disk; views, copies and scatters refuse those)."""
    def wait(self, timeout_ms: int = 10000) -> int:
        """Waits for the hits being read from disk; returns ready(). Hits after one that
        failed verification are dropped (len() shrinks)."""
    def tier(self, i: int) -> str:
        """Where hit i is: "host" (the shared arena) or "gpu" (the daemon's GPU pool)."""
    def stored(self, i: int) -> str:
        """How hit i is stored: "raw" (the namespace's dtype), or the codec the daemon
        quantized it to ("q8_0", "fp8", "kivi4", ...); copy_into() decodes either."""
    def release(self) -> None:
        """Unpins the hits; views still exported keep theirs pinned until released. The
        unpin is sent without waiting for the daemon: this client's next call is handled
        after it, ``Client.flush()`` before another process must see it."""
    def __enter__(self) -> Lease: ...
    def __exit__(self, t: Optional[Type[BaseException]], v: Optional[BaseException],
                 tb: Optional[TracebackType]) -> bool: ...

class Reservation:
    """Slots of one reservation. A context manager: the with block commits on success and
    aborts on an exception."""

    reserved: int  #: slots reserved
    statuses: list[int]  #: SLOT_* of every key
    finished: bool  #: after commit(), abort() or the client's close()
    block_bytes: int
    def __len__(self) -> int:
        """Number of keys."""
    def __getitem__(self, i: int) -> memoryview:
        """A writable memoryview of the slot of key i (status SLOT_RESERVED, else
        ValueError). Release every such view (del, or memoryview.release()) before commit:
        commit() raises BufferError while one is exported."""
    def status(self, i: int) -> int:
        """SLOT_* status of key i."""
    def write(self, i: int, buffer: Buffer, stream: Stream = None) -> None:
        """Copies one block (a buffer or tensor) into the slot of key i (GIL released); from
        a CUDA tensor it is queued on ``stream`` and commit() waits for it."""
    def gather(self, k_caches: KVCaches, v_caches: Optional[KVCaches],
               block_table: Sequence[int], *, first: int = 0, n: Optional[int] = None,
               first_token: int = 0, layers: Union[None, int, range] = None,
               stream: Stream = None, event: Optional[int] = None, kv_dim: int = 0) -> int:
        """Stores the engine's KV of tokens [first_token, first_token + n*block_tokens) into
        the reserved slots of keys [first, first + n) (keys not RESERVED skipped), the paged
        layout as Lease.scatter takes it; ``layers``: a slot may be filled layer by layer
        over several calls. CUDA tensors: queued on ``stream``, commit() waits. Returns the
        slots written."""
    def commit(self, n: Optional[int] = None) -> int:
        """Publishes the first n reserved slots (None: all), frees the rest; returns the
        number committed. Error ETIMEDOUT when the daemon had aborted the reservation; EIO
        when device work queued on it failed (nothing published); EBUSY while a slot
        gathered layer by layer lacks layers, EAGAIN while the reservation of this client
        that it hangs from (Namespace.reserve's parent) is not committed (nothing done
        either way, the reservation is still yours); 0 when that one ended without
        committing its parent (its slots went with it)."""
    def abort(self) -> None:
        """Frees every slot unseen (once no view of a slot is left)."""
    def __enter__(self) -> Reservation: ...
    def __exit__(self, t: Optional[Type[BaseException]], v: Optional[BaseException],
                 tb: Optional[TracebackType]) -> bool: ...

class HybridHit:
    """The usable prefix of hybrid_lookup(): ``length`` keys and one Lease per namespace
    (in the order given): the ``length`` blocks of a kv / k_only namespace, the window's
    blocks of a kv_window one (Lease.first where they start), the state at ``length - 1``
    of a state one; none when ``length`` is 0."""

    length: int
    leases: list[Lease]
    def release(self) -> None: ...
    def __enter__(self) -> HybridHit: ...
    def __exit__(self, t: Optional[Type[BaseException]], v: Optional[BaseException],
                 tb: Optional[TracebackType]) -> bool: ...

def hybrid_lookup(namespaces: Sequence[Namespace], keys: Sequence[bytes],
                  ready_only: bool = False, gpu: bool = False,
                  limit: Optional[int] = None) -> HybridHit:
    """The longest prefix of ``keys`` (at most ``limit``, and 8 x 2048) every namespace (one
    per kind of layer of a hybrid model, under the same keys) can give: the full-attention
    hit length intersected with the window's and the state's availability at that position.
    A few round trips: one per namespace, one more per namespace each time the prefix
    shrinks."""
