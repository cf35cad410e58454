# DESIGN: the longest prefix a hybrid model can use, over one namespace per kind of layer
# (docs/engines.md, "Hybrid models"): full attention (kv, k_only) needs every block of the
# prefix, a sliding window (kv_window) the blocks of the prefix's last window, a recurrent
# layer (state) the state taken at the prefix's end. Each namespace's lookup of keys[:e]
# answers the longest prefix it can give, first + hits (first is 0 for a run); the usable
# prefix is the longest e that every namespace answers with exactly e. Lookups go round the
# namespaces with a shrinking e until one round agrees; e only shrinks, so this ends (a few
# round trips: one per namespace, and one more per namespace each time e shrinks).
from typing import List, Optional, Sequence

from kvcd._kvcd import Lease, Namespace

_LEASE_KEYS = 8 * 2048  # keys one lookup takes (libkvc: 8 requests of 2048)


class HybridHit:
    """The usable prefix of a hybrid lookup: ``length`` keys, and one lease per namespace
    (in the order given) pinning what that prefix needs of it: the ``length`` blocks of a
    kv / k_only namespace, the window's blocks of a kv_window one (``lease.first`` where
    they start), the state at ``length - 1`` of a state one. No leases when ``length`` is
    0. Release them with release() or a with block."""

    def __init__(self, length: int, leases: List[Lease]):
        self.length = length
        self.leases = leases

    def release(self) -> None:
        for lease in self.leases:
            lease.release()
        self.leases = []

    def __enter__(self) -> "HybridHit":
        return self

    def __exit__(self, t, v, tb) -> bool:
        self.release()
        return False


def hybrid_lookup(namespaces: Sequence[Namespace], keys: Sequence[bytes],
                  ready_only: bool = False, gpu: bool = False,
                  limit: Optional[int] = None) -> HybridHit:
    """The longest prefix of ``keys`` (at most ``limit`` keys) that every namespace in
    ``namespaces`` (one per kind of layer of the model, the same keys in each) can give:
    the full-attention hit length intersected with the window's and the state's
    availability at that position. ready_only and gpu as Namespace.lookup; at most 8 x
    2048 keys are looked at (a lease's: pass ``limit``, or the keys up to it, for longer
    prompts)."""
    if not namespaces:
        raise ValueError("kvcd.hybrid_lookup: no namespace")
    e = min(len(keys) if limit is None else min(len(keys), max(0, limit)), _LEASE_KEYS)
    leases: List[Lease] = []
    i = 0
    try:
        while e > 0 and i < len(namespaces):
            lease = namespaces[i].lookup(keys[:e], ready_only=ready_only, gpu=gpu)
            got = lease.first + len(lease) if len(lease) else 0
            if got == e:
                leases.append(lease)
                i += 1
                continue
            # A shorter prefix: the leases taken for the longer one are not its answers
            # (another window, another state); every namespace is asked again.
            lease.release()
            for held in leases:
                held.release()
            leases, i, e = [], 0, got
    except BaseException:
        for held in leases:
            held.release()
        raise
    return HybridHit(e, leases if e else [])
