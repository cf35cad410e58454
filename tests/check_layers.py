#!/usr/bin/env python3
"""check_layers: no new circle among the daemon's files (issue 31).

The daemon's layers point down (the rule is stated in daemon/engine.h and daemon/store.h):
a file may include and call the files below it, never one above. This reads two kinds of
dependency between daemon/ files and fails on any circle among them:
  - includes: a.c (or a.h) includes "daemon/b.h"  ->  a -> b
  - calls the linker resolves: nm of the daemon's objects; a.o needs a symbol b.o defines
    ->  a -> b
A file is its .c and its .h together (engine.c + engine.h is "engine"), with the .c files
that have no header of their own and carry its name (store_policy.c is "store",
engine_disk_ckpt.c "engine_disk"), and a private header X_int.h with X (server_int.h is
"server"); any other header without a .c (stats.h, engine_core.h) is a file of its own. An
edge that lies on a circle (its two ends in one strongly connected component) fails: there
is no list of circles allowed (the last, config <-> config_ns, was broken by moving the value
parsers below both into config_parse.c and handing config_ns its table of sections instead of
struct config). Break a new circle; never excuse it.

Usage: check_layers.py TOP OBJDIR   (OBJDIR: the build's obj/daemon)
Prints the graph's circles, then a summary line in Check's format for tests/run-checks.sh.
"""
import os
import re
import subprocess
import sys

def files(top):
    d = os.path.join(top, "daemon")
    names = sorted(os.listdir(d))
    stems_c = {n[:-2] for n in names if n.endswith(".c")}
    stems_h = {n[:-2] for n in names if n.endswith(".h")}
    owner = {}
    for n in names:
        if n.endswith(".c"):
            # A .c without a header of its own is the rest of the file whose name starts its
            # own (store_policy.c implements store.h, engine_disk_ckpt.c engine_disk.h).
            s = n[:-2]
            while s not in stems_h and "_" in s:
                s = s.rsplit("_", 1)[0]
            owner[n] = s if s in stems_h else n[:-2]
        elif n.endswith(".h"):
            # a private header X_int.h is X's (server_int.h is "server")
            s = n[:-6] if n.endswith("_int.h") else n[:-2]
            owner[n] = s if s in stems_c else n
    return d, owner


def include_edges(d, owner):
    edges = {}
    inc = re.compile(r'^\s*#\s*include\s+"daemon/([^"]+)"', re.M)
    for n, o in owner.items():
        with open(os.path.join(d, n), encoding="utf-8") as f:
            for m in inc.finditer(f.read()):
                t = owner.get(m.group(1))
                if t and t != o:
                    edges.setdefault((o, t), set()).add("#include " + m.group(1))
    return edges


def call_edges(objdir, owner, edges):
    defined, needed = {}, {}
    for n, o in owner.items():
        if not n.endswith(".c"):
            continue
        obj = os.path.join(objdir, n[:-2] + ".o")
        if not os.path.exists(obj):
            sys.exit("check_layers: %s is missing (build first)" % obj)
        out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True)
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            sym, kind = parts[0], parts[1]
            if kind == "U":
                needed.setdefault(o, set()).add(sym)
            elif kind.isupper() and kind not in "NW":
                defined[sym] = o
    for o, syms in needed.items():
        for s in syms:
            t = defined.get(s)
            if t and t != o:
                edges.setdefault((o, t), set()).add(s + "()")


def sccs(nodes, adj):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            out.append(comp)

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main():
    top, objdir = sys.argv[1], sys.argv[2]
    d, owner = files(top)
    edges = include_edges(d, owner)
    call_edges(objdir, owner, edges)
    nodes = set(owner.values())
    adj = {}
    for a, b in edges:
        adj.setdefault(a, set()).add(b)
    comp_of = {}
    circles = [c for c in sccs(nodes, adj) if len(c) > 1]
    for i, c in enumerate(circles):
        for v in c:
            comp_of[v] = i
    on_circle = {e for e in edges if e[0] in comp_of and comp_of[e[0]] == comp_of.get(e[1])}
    print("check_layers: %d files, %d edges (includes and resolved calls), %d circle(s)"
          % (len(nodes), len(edges), len(circles)))
    for c in circles:
        print("circle: " + ", ".join(sorted(c)))
        for e in sorted(x for x in on_circle if x[0] in c):
            why = sorted(edges[e])
            print("  %s -> %s: %s%s" % (e[0], e[1], ", ".join(why[:4]),
                                       " (+%d)" % (len(why) - 4) if len(why) > 4 else ""))
    for e in sorted("%s -> %s" % e for e in on_circle):
        print("FAIL: %s closes a circle among daemon/ files (the layers point down: "
              "see daemon/engine.h)" % e)
    # Two checks: the graph was read (a daemon file and an edge at least), and no circle.
    failed = (0 if nodes and edges else 1) + (1 if circles else 0)
    print("%d%%: Checks: 2, Failures: %d, Errors: 0" % (100 * (2 - failed) // 2, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
