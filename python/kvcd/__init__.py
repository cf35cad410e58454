# DESIGN: the kvcd package is the C extension kvcd._kvcd (python/kvcd/_kvcd*.c) over libkvc;
# this file re-exports it and the pure-Python hybrid_lookup (kvcd/hybrid.py), so `import
# kvcd` is the whole API (typed in __init__.pyi).
from kvcd._kvcd import (  # noqa: F401
    HEAD_FULL,
    HEAD_LOCAL,
    HEAD_SINK,
    HEAD_UNKNOWN,
    SLOT_BUSY,
    SLOT_NOSPACE,
    SLOT_PRESENT,
    SLOT_RESERVED,
    SLOT_SKIPPED,
    Client,
    Error,
    Lease,
    Namespace,
    PagedKV,
    Reservation,
    default_socket,
)
from kvcd.hybrid import HybridHit, hybrid_lookup  # noqa: F401

__all__ = [
    "Client", "Namespace", "Lease", "Reservation", "PagedKV", "Error", "default_socket",
    "SLOT_PRESENT", "SLOT_RESERVED", "SLOT_BUSY", "SLOT_SKIPPED", "SLOT_NOSPACE",
    "HEAD_UNKNOWN", "HEAD_SINK", "HEAD_LOCAL", "HEAD_FULL",
    "HybridHit", "hybrid_lookup",
]
