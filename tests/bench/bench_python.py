# DESIGN: `make bench-python` (not part of make check): the kvcd Python package against the
# C path, and the reference engine's prefill with and without a full hit; rows in
# build/bench/python.json like every benchmark here ({"case", "value", "unit", "baseline",
# "baseline_value", "ratio"}, ratio = value / baseline_value).
#  - get_prefix / put_prefix from Python into / out of preallocated torch tensors (numpy
#    views of them, no copy), for 2 MiB and 16 MiB blocks (the layouts of bench_host.c),
#    256 MiB of blocks per case and 16 MiB per round trip, as bench_host.c does; best of 11
#    repetitions after a warm-up, median beside it. The baseline is bench_host.c's own
#    figure for the same operation and size (get: lookup + kvc_lease_copy + release;
#    put_prefix), run as a subprocess in the same run. Target: ratio >= 0.9.
#  - the engine (default ModelConfig, 16-token blocks) on a 4096-token prompt: prefill time
#    with every full block but the last loaded from kvcd (value) against no cache
#    (baseline); the speed-up is baseline / value. Generated tokens are checked equal.
# Exit status 1 when something broke (a short hit, wrong bytes, different tokens, a failed
# C run), 0 with figures otherwise (a missed target is reported, not failed).
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import kvcd
from kvcd.engine import Engine, ModelConfig
from kvcd.engine.daemon import PrivateDaemon
from kvcd.engine.prompts import system_prompt

SIZES = {"2MiB": ("bench/py-32l-8h-128d", 32, 8, 128, 16),
         "16MiB": ("bench/py-32l-8h-128d-t128", 32, 8, 128, 128)}
WS = 256 << 20
OP = 16 << 20
REPS = 11


def gbps(nbytes, secs):
    return nbytes / secs / 1e9


def host_case(c, size):
    model, layers, heads, dim, tokens = SIZES[size]
    ns = c.namespace(model, layers, heads, dim, tokens)
    bb = ns.block_bytes
    n, per_op = WS // bb, max(1, OP // bb)
    src = torch.randn(n, bb // 2).half()
    dst = torch.zeros(n, bb // 2, dtype=torch.float16)
    srcs = [src[i].numpy() for i in range(n)]
    dsts = [dst[i].numpy() for i in range(n)]
    toks = list(range(n * tokens))
    put_t, get_t = [], []
    for rep in range(REPS + 1):
        keys = ns.keys_from_tokens(toks, extra=b"rep%d" % rep)
        t0 = time.perf_counter()
        for j in range(0, n, per_op):
            w = ns.put_prefix(keys[j:j + per_op], srcs[j:j + per_op],
                              parent=keys[j - 1] if j else None)
            if w != len(keys[j:j + per_op]):
                raise RuntimeError("put_prefix wrote %d of %d" % (w, per_op))
        t1 = time.perf_counter()
        for j in range(0, n, per_op):
            h = ns.get_prefix(keys[j:j + per_op], dsts[j:j + per_op])
            if h != len(keys[j:j + per_op]):
                raise RuntimeError("get_prefix hit %d of %d" % (h, per_op))
        t2 = time.perf_counter()
        if not torch.equal(src, dst):
            raise RuntimeError("get_prefix returned other bytes than put")
        dst.zero_()
        c.evict(ns.id)  # room for the next repetition's fresh keys
        if rep:  # the first is the warm-up
            put_t.append(t1 - t0)
            get_t.append(t2 - t1)
    return ({"put_prefix": [gbps(WS, t) for t in put_t], "get": [gbps(WS, t) for t in get_t]},
            n * bb)


def c_case(size, build):
    """bench_host.c's figures for one size, one process: {op: (best, median)}."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "host.json")
        p = subprocess.run([os.path.join(build, "bench", "bench_host"), out, size + "_x1"],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise RuntimeError("bench_host failed: " + p.stderr[-2000:])
        res = {}
        for line in p.stdout.splitlines():
            f = line.split()
            for op in ("put_prefix", "get"):
                if f and f[0] == "%s_%s_x1" % (op, size):
                    res[op] = (float(f[1]), float(f[2]))
        return res


def engine_case(sock):
    prompt = system_prompt(0, 4096)
    with Engine(ModelConfig(), block_tokens=16, max_tokens=4096 + 8, socket_path=sock,
                threads=2) as e:
        cold = e.generate(prompt, 4, put=True)  # computes and puts every full block
        nohit, hit = [cold.prefill_s], []
        for _ in range(2):
            g = e.generate(prompt, 4, use_cache=False, put=False)
            nohit.append(g.prefill_s)
            if g.tokens != cold.tokens:
                raise RuntimeError("tokens differ between runs without kvcd")
        for _ in range(5):
            g = e.generate(prompt, 4, put=False)
            if g.tokens != cold.tokens or g.loaded_tokens != 4096 - 16:
                raise RuntimeError("hit run: %d loaded, tokens %s vs %s" %
                                   (g.loaded_tokens, g.tokens, cold.tokens))
            hit.append(g.prefill_s)
    return hit, nohit


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/bench/python.json"
    build = os.environ.get("KVC_BUILD", "build")
    rows = []

    def row(case, best, med, unit, base_name, base):
        rows.append(dict(case=case, value=best, unit=unit, baseline=base_name,
                         baseline_value=base, ratio=best / base))
        print("%-34s %9.3f %9.3f %-4s  %-16s %9.3f  ratio %.3f" %
              (case, best, med, unit, base_name, base, best / base), flush=True)

    print("kvcd from Python (torch tensors) against bench_host.c's C path, the same run; "
          "256 MiB of blocks per case, 16 MiB per round trip, %d repetitions;\nbest and median "
          "GB/s, ratio = best Python / best C (target >= 0.9)\n" % REPS)
    print("%-34s %9s %9s %-4s  %-16s %9s" % ("case", "best", "median", "unit", "baseline",
                                             "best"))
    with PrivateDaemon(["host.size=1g", "host.prefault=yes"]) as d:
        with kvcd.Client(d.socket) as c:
            for size in SIZES:
                py, _ = host_case(c, size)
                cres = c_case(size, build)
                for op in ("get", "put_prefix"):
                    v = py[op]
                    cb, cm = cres[op]
                    row("%s_%s_python" % (op, size), max(v), statistics.median(v), "GB/s",
                        "C (bench_host)", cb)
                    print("%-34s %9s %9.3f (C median)" % ("", "", cm))
        print("\nreference engine, default model, 4096-token prompt, 16-token blocks: prefill "
              "seconds, best of runs (median beside)")
        hit, nohit = engine_case(d.socket)
    rows.append(dict(case="engine_prefill_4k_full_hit", value=min(hit), unit="s",
                     baseline="no cache", baseline_value=min(nohit),
                     ratio=min(hit) / min(nohit)))
    print("%-34s %9.3f %9.3f s     %-16s %9.3f  speed-up %.1fx (medians %.1fx)" %
          ("engine_prefill_4k_full_hit", min(hit), statistics.median(hit), "no cache",
           min(nohit), min(nohit) / min(hit), statistics.median(nohit) / statistics.median(hit)))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)
    print("\nwrote %s" % out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        print("bench_python: %s" % e, file=sys.stderr)
        sys.exit(1)
