# DESIGN: the binding cannot crash the interpreter (issue 28). Each attack of the audit runs
# in a Python process of its own against a real kvcd, so a crash (SIGSEGV, an ASan report)
# is seen here as that process's exit status, a test failure, never the end of pytest. The
# attacks close the client, release the lease or abort the reservation from Python code the
# binding runs while it reads its arguments (__index__, __iter__, __len__, __float__, a
# finalizer), or re-initialise a closed client; each must end in a Python exception
# (ValueError, RuntimeError) with the process alive and the daemon serving. Under the ASan
# build (build/asan/tests/check_python) the same processes run with libasan preloaded, so
# an invalid read that happens not to crash fails too, and every process runs with Python's
# allocator debug hooks (PYTHONMALLOC=malloc_debug): a write past a buffer the binding took
# from PyMem is a fatal error when it is freed.
import os
import subprocess
import sys
import textwrap

import pytest

from kvcd.engine.daemon import PrivateDaemon

HERE = os.path.dirname(os.path.abspath(__file__))
KVCD_BIN = os.environ.get("KVCD_BIN") or os.path.join(HERE, "..", "..", "build", "bin", "kvcd")

# Run first in every attack: a client, a namespace with 4 cached blocks, their keys.
PRELUDE = """
import gc, sys
import kvcd
c = kvcd.Client(sys.argv[1])
ns = c.namespace("crash-%d" % abs(hash(sys.argv[2])), 2, 2, 16, 4)
keys = ns.keys_from_tokens(list(range(16)))
blocks = [bytes([i]) * ns.block_bytes for i in range(4)]
assert ns.put_prefix(keys, blocks) == 4

def expect(exc, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        print("raised", type(e).__name__, e)
        return
    raise SystemExit("no %s from %r" % (exc.__name__, fn))

class Closer:
    # An int whose __index__ closes the client first.
    def __init__(self, v=1, target=None):
        self.v, self.target = v, target
    def __index__(self):
        (self.target or c).close()
        return self.v
    __int__ = __index__

class Releaser(Closer):
    def __index__(self):
        self.target.release() if hasattr(self.target, "release") else self.target.abort()
        return self.v

class CloseIter:
    # A sequence whose __len__ and __iter__ close the client, then yield the items.
    def __init__(self, items):
        self.items = items
    def __len__(self):
        c.close()
        return len(self.items)
    def __iter__(self):
        c.close()
        return iter(self.items)
"""

ATTACKS = {
    # issue 28 row 5: a closed client re-initialised, a namespace of the old connection used.
    "reinit_after_close": """
        c.close()
        expect(RuntimeError, c.__init__, sys.argv[1])
        expect(ValueError, ns.lookup, [keys[0]])
        expect(ValueError, ns.keys_from_tokens, [1, 2, 3, 4])
        assert c.closed
    """,
    "reinit_while_open": """
        expect(RuntimeError, c.__init__, sys.argv[1])
        with ns.lookup(keys) as l:
            assert len(l) == 4
    """,
    # row 5: __index__ of a token closes the client inside keys_from_tokens.
    "keys_from_tokens_index_closes": """
        expect(ValueError, ns.keys_from_tokens, [1, 2, 3, Closer(4)] * 64)
    """,
    "keys_from_tokens_iter_closes": """
        expect(ValueError, ns.keys_from_tokens, CloseIter(list(range(64))))
    """,
    # A list emptied by an __index__ while it is read: read from a copy, never past its end.
    "keys_from_tokens_list_cleared": """
        toks = list(range(64))
        class Clear:
            def __index__(self):
                toks.clear()
                gc.collect()
                return 7
        toks[0] = Clear()
        assert len(ns.keys_from_tokens(toks)) == 16
    """,
    "lookup_keys_iter_closes": """
        expect(ValueError, ns.lookup, CloseIter(keys))
    """,
    "put_prefix_buffers_iter_closes": """
        more = ns.keys_from_tokens(list(range(100, 116)))
        expect(ValueError, ns.put_prefix, more, CloseIter(blocks))
    """,
    "get_prefix_buffers_iter_closes": """
        outs = [bytearray(ns.block_bytes) for _ in keys]
        expect(ValueError, ns.get_prefix, keys, CloseIter(outs))
    """,
    "get_prefix_keys_iter_closes": """
        outs = [bytearray(ns.block_bytes) for _ in keys]
        expect(ValueError, ns.get_prefix, CloseIter(keys), outs)
    """,
    "reserve_keys_iter_closes": """
        more = ns.keys_from_tokens(list(range(200, 216)))
        expect(ValueError, ns.reserve, CloseIter(more))
    """,
    "hint_scores_float_closes": """
        class F:
            def __float__(self):
                c.close()
                return 1.0
        expect(ValueError, ns.hint, keys, [1.0, 1.0, 1.0, F()])
    """,
    "lookup_budget_query_float_closes": """
        class F:
            def __float__(self):
                c.close()
                return 1.0
        expect(ValueError, ns.lookup_budget, keys, 2, "quest", 0, 0, [F()] * 16)
    """,
    "namespace_layers_index_closes": """
        expect(ValueError, c.namespace, "crash-other", Closer(2), 2, 16, 4)
    """,
    "lease_index_releases": """
        l = ns.lookup(keys)
        expect(ValueError, l.__getitem__, Releaser(1, l))
        l = ns.lookup(keys)
        expect(ValueError, l.copy_into, Releaser(1, l), bytearray(ns.block_bytes))
        l = ns.lookup(keys)
        expect(ValueError, l.stored, Releaser(1, l))
        l = ns.lookup(keys)
        expect(ValueError, l.__getitem__, Closer(1))
    """,
    "reservation_index_aborts": """
        more = ns.keys_from_tokens(list(range(300, 316)))
        r = ns.reserve(more)
        expect(ValueError, r.commit, Releaser(2, r))
        r = ns.reserve(more)
        expect(ValueError, r.status, Releaser(0, r))
        r = ns.reserve(more)
        expect(ValueError, r.__getitem__, Releaser(0, r))
        r = ns.reserve(more)
        expect(ValueError, r.write, Releaser(0, r), blocks[0])
        r = ns.reserve(more)
        expect(ValueError, r.commit, Closer(2))
    """,
    # A tensor whose data_ptr() closes the client, as get_prefix reads it.
    "tensor_data_ptr_closes": """
        import ctypes
        from types import SimpleNamespace
        buf = ctypes.create_string_buffer(ns.block_bytes)
        class T:
            device = SimpleNamespace(type="cpu", index=None)
            def is_contiguous(self): return True
            def element_size(self): return 1
            def numel(self): return ns.block_bytes
            def data_ptr(self):
                c.close()
                return ctypes.addressof(buf)
        expect(ValueError, ns.get_prefix, keys[:1], [T()])
    """,
    # A paged call whose block table's __index__ releases the lease, then closes the client.
    "scatter_table_releases": """
        import array
        k = [bytearray(4 * 4 * 2 * 16 * 2) for _ in range(2)]
        v = [bytearray(4 * 4 * 2 * 16 * 2) for _ in range(2)]
        kv = [memoryview(b).cast("B").cast("H", (4, 4, 2, 16)) for b in k]
        vv = [memoryview(b).cast("B").cast("H", (4, 4, 2, 16)) for b in v]
        l = ns.lookup(keys)
        expect(ValueError, l.scatter, kv, vv, [0, 1, 2, Releaser(3, l)], n=4)
        l = ns.lookup(keys)
        expect(ValueError, l.scatter, kv, vv, [0, 1, 2, Closer(3)], n=4)
    """,
    # A finalizer run by the collector while the binding allocates closes the client.
    "finalizer_closes": """
        class Bomb:
            def __del__(self):
                c.close()
        for _ in range(200):
            a = Bomb(); b = Bomb(); a.b = b; b.a = a; del a, b  # cycles: the collector's
            try:
                ns.keys_from_tokens(list(range(64)))
                with ns.lookup(keys) as l:
                    bytes(l[0])
            except ValueError:
                break
        else:
            raise SystemExit("the collector never ran a finalizer")
    """,
    # A budget whose positions array overflows size_t (2^61 x 8 bytes is 0): the binding
    # sized pos by the budget and libkvc wrote one entry per selected block past it. A budget
    # above the keys selects them all.
    "budget_size_overflow": """
        for budget in (2**61, 2**61 + 1, 2**62, 2**63 - 1):
            pos, nprefix, lease = ns.lookup_budget(keys, budget, policy="lru")
            with lease:
                assert pos == [0, 1, 2, 3] and nprefix == 4 and len(lease) == 4, pos
        pos, nprefix, lease, prof = ns.lookup_budget(keys, 2**61, policy="lru", per_head=True)
        with lease:
            assert pos == [0, 1, 2, 3] and len(prof) == 4
        expect(OverflowError, ns.lookup_budget, keys, 2**63)
    """,
}


@pytest.fixture(scope="module")
def daemon():
    with PrivateDaemon(["host.size=32m"], binary=KVCD_BIN) as d:
        yield d


def run_attack(sock, name, body):
    code = PRELUDE + textwrap.dedent(body) + "\nprint('alive')\n"
    env = dict(os.environ)
    # The allocator's debug hooks: a write past a PyMem buffer that happens not to crash is
    # a fatal error at its free (malloc underneath, so that ASan sees the buffers too).
    env["PYTHONMALLOC"] = "malloc_debug"
    p = subprocess.run([sys.executable, "-c", code, sock, name], capture_output=True,
                       text=True, timeout=120, env=env)
    return p


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_ends_in_an_exception(daemon, name):
    p = run_attack(daemon.socket, name, ATTACKS[name])
    assert p.returncode == 0 and p.stdout.rstrip().endswith("alive"), (
        "%s: exit %d\nstdout:\n%s\nstderr:\n%s" % (name, p.returncode, p.stdout, p.stderr))
    assert "ERROR: AddressSanitizer" not in p.stderr and "runtime error" not in p.stderr
    # The daemon served the attacker and serves the next client.
    check = run_attack(daemon.socket, name, "")
    assert check.returncode == 0, check.stderr
