# DESIGN: kvcd.sglang driven the way SGLang drives an L3 backend: SGLang's cache controller
# (the stand-in in sglang_shim, written from SGLang's source: its prefetch, prefetch-IO,
# prefetch-sync and backup threads, the call order, extra_info, interface_v1, the all()
# over batch_set_v1, the all-reduce over ranks, metrics collection) loads the backend as
# its dynamic backend, against a real kvcd, in SGLang "instances" that are separate
# processes (python/tests/sglang_instance.py): one backs pages up, another, of another host
# layout, TP size or rank, prefetches them and checks every page's bytes. Cases: the
# zero-copy v1 path and the generic path, metrics on, MLA (TP=2: rank 0 writes, both
# read), context parallelism (CP=2: each rank its own slice), SGLang's tp_lcm_size head
# split (a TP=1 page_head instance feeds a TP=2 one), fp8 pools, the shm allocator,
# attention-DP replicas writing one prompt at once, the hybrid v2 pools (Mamba state,
# SWA window, DSA indexer, a draft SWA pool on the SWA pool's indices registered after
# attach, MLA at TP=2 with TP-sharded Mamba state), a prefetch's router hint in
# extra_info, and prefix keys passed only with "hicache_storage_pass_prefix_keys".
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from kvcd.engine.daemon import PrivateDaemon  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
P = 4


@pytest.fixture(scope="module")
def daemon():
    with PrivateDaemon(["host.size=64m"]) as d:
        yield d


def instance(daemon, ops, wait=True, **spec):
    """Runs one SGLang instance (its ranks as threads) in a process of its own."""
    s = dict(socket=daemon.socket, model="ctl/model", page=P, layers=2, heads=4, dim=16,
             layout="page_first", interface_v1=True, metrics=True, ops=ops)
    s.update(spec)
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "sglang_instance.py"),
                          json.dumps(s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    if not wait:
        return p
    return finish(p)


def finish(p):
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err[-4000:]
    return json.loads(out)


def tokens(n_pages, salt=0):
    return [(salt * 7919 + i * 31) % 50000 for i in range(n_pages * P)]


def kvcctl_blocks(daemon, ns_id):
    kvcctl = os.path.join(os.path.dirname(os.environ.get("KVCD_BIN", "build/bin/kvcd")),
                          "kvcctl")
    out = subprocess.run([kvcctl, "-s", daemon.socket, "--json", "ls", "--ns", str(ns_id),
                          "--limit", "100000"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def ns_ids(daemon):
    import kvcd
    with kvcd.Client(daemon.socket) as c:
        return {n["model_id"]: n for n in c.namespaces()}


def test_v1_two_instances_share_pages_with_metrics(daemon):
    """130 pages (two of SGLang's 128-page batches) backed up by a page_first instance
    through batch_set_v1, prefetched by a layer_first instance in another process through
    batch_exists + batch_get_v1: every page right, the chain's parents the pages before
    them, metrics collected as StorageMetrics."""
    toks = tokens(130, salt=1)
    a = instance(daemon, [dict(op="backup", tokens=toks)], layout="page_first")[0]
    assert a["zero_copy"] and a["ops"][0]["completed_tokens"] == 130 * P
    assert a["metrics"]["backup_pgs"] == 130 and a["metrics"]["bandwidth_samples"] >= 2
    b = instance(daemon, [dict(op="prefetch", tokens=toks + tokens(3, salt=2))],
                 layout="layer_first")[0]
    op = b["ops"][0]
    assert op["hit_tokens"] == 130 * P and op["completed_tokens"] == 130 * P
    assert op["pages_ok"] == [True] * 130
    assert b["metrics"]["prefetch_pgs"] == 130
    assert b["namespaces"] == a["namespaces"]  # host layouts do not split the cache
    # One chain per batch of the backup: SGLang's prefix_keys was empty (the first node),
    # so each batch starts a root and its pages hang one from the other.
    nsid = ns_ids(daemon)[a["namespaces"]["kv"][0]]["id"]
    blocks = kvcctl_blocks(daemon, nsid)
    assert len(blocks) == 130
    depths = sorted(b_["depth"] for b_ in blocks)
    assert depths == sorted(list(range(128)) + [0, 1])
    assert a["stats"]["set_orphan"] == 0 and a["stats"]["set_failed"] == 0


def test_the_documented_configuration_takes_the_zero_copy_path(daemon):
    """The extra config docs/engines.md gives users, as SGLang reads it: the controller
    chooses batch_get_v1/batch_set_v1 and the backend gets extra_info."""
    doc = open(os.path.join(HERE, "..", "..", "docs", "engines.md")).read()
    line = next(ln for ln in doc.splitlines() if "--hicache-storage-backend-extra-config" in ln
                and "{" in ln)
    extra = json.loads(line[line.index("'") + 1:line.rindex("'")])
    toks = tokens(3, salt=11)
    a = instance(daemon, [dict(op="backup", tokens=toks), dict(op="prefetch", tokens=toks)],
                 extra_config=extra, model="ctl/docs")[0]
    assert a["zero_copy"] and a["ops"][1]["pages_ok"] == [True] * 3


def test_generic_path_without_interface_v1(daemon):
    """No "interface_v1": SGLang calls batch_set with flat pages and batch_get into dummy
    pages; the pages still arrive right."""
    toks = tokens(9, salt=3)
    a = instance(daemon, [dict(op="backup", tokens=toks)], interface_v1=False,
                 model="ctl/generic")[0]
    assert not a["zero_copy"] and a["ops"][0]["completed_tokens"] == 9 * P
    b = instance(daemon, [dict(op="prefetch", tokens=toks)], interface_v1=False,
                 model="ctl/generic", layout="page_first_direct")[0]
    assert b["ops"][0]["pages_ok"] == [True] * 9


def test_mla_tp2_rank0_writes_every_rank_reads(daemon):
    ranks = [dict(tp_rank=0, tp_size=2), dict(tp_rank=1, tp_size=2)]
    toks = tokens(6, salt=4)
    w = instance(daemon, [dict(op="backup", tokens=toks)], mla=True, ranks=ranks,
                 model="ctl/mla", layout="layer_first")
    assert [r["namespaces"] for r in w] == [w[0]["namespaces"]] * 2
    (mid,) = w[0]["namespaces"]["kv"]
    assert "/mla/" in mid and "tp" not in mid.split("/")[2]
    assert w[0]["stats"]["set_written"] == 6 and w[1]["stats"]["set_pages"] == 0
    r = instance(daemon, [dict(op="prefetch", tokens=toks)], mla=True, ranks=ranks,
                 model="ctl/mla", layout="page_first")
    for rank in r:
        assert rank["ops"][0]["pages_ok"] == [True] * 6


def test_cp2_each_rank_its_own_slice(daemon):
    ranks = [dict(tp_rank=0, tp_size=1, attn_cp_rank=c, attn_cp_size=2) for c in (0, 1)]
    toks = tokens(5, salt=5)
    w = instance(daemon, [dict(op="backup", tokens=toks)], ranks=ranks, model="ctl/cp")
    names = [r["namespaces"]["kv"][0].split("/")[2] for r in w]
    assert names == ["tp0-1-cp0-2", "tp0-1-cp1-2"]
    r = instance(daemon, [dict(op="prefetch", tokens=toks)], ranks=ranks, model="ctl/cp",
                 layout="layer_first")
    for rank in r:  # each rank's pages are its own slice (checked against its own KV)
        assert rank["ops"][0]["pages_ok"] == [True] * 5


def test_tp_lcm_split_heads_across_tp_sizes(daemon):
    """SGLang's tp_lcm_size with the page_head layout: a TP=1 instance stores each page as
    two head slices (tp0-2, tp1-2), which a TP=2 instance's ranks load."""
    toks = tokens(4, salt=6)
    a = instance(daemon, [dict(op="backup", tokens=toks)], layout="page_head", tp_lcm_size=2,
                 model="ctl/lcm")[0]
    assert [m.split("/")[2] for m in a["namespaces"]["kv"]] == ["tp0-2", "tp1-2"]
    ranks = [dict(tp_rank=0, tp_size=2), dict(tp_rank=1, tp_size=2)]
    b = instance(daemon, [dict(op="prefetch", tokens=toks)], ranks=ranks, tp_lcm_size=2,
                 model="ctl/lcm", layout="layer_first")
    assert [r["namespaces"]["kv"] for r in b] == [[m] for m in a["namespaces"]["kv"]]
    for rank in b:
        assert rank["ops"][0]["pages_ok"] == [True] * 4


def test_fp8_pool_and_shm_allocator(daemon):
    toks = tokens(5, salt=7)
    a = instance(daemon, [dict(op="backup", tokens=toks)], fp8=True, allocator="shm",
                 model="ctl/fp8")[0]
    assert "fp8_e4m3" in a["namespaces"]["kv"][0]
    b = instance(daemon, [dict(op="prefetch", tokens=toks)], fp8=True, model="ctl/fp8",
                 layout="page_head")[0]
    assert b["ops"][0]["pages_ok"] == [True] * 5


def test_dp_replicas_write_one_prompt_at_once(daemon):
    """Two attention-DP replicas (dp_rank 0 and 1, separate processes) back up the same
    prompt at the same moment: one namespace (the DP rank changes no byte), each page
    stored once, both backups complete (a page the other is writing counts as stored)."""
    toks = tokens(40, salt=8)
    ps = [instance(daemon, [dict(op="backup", tokens=toks)] * 3, wait=False, model="ctl/dp",
                   ranks=[dict(tp_rank=0, tp_size=1, dp_rank=d)]) for d in (0, 1)]
    res = [finish(p)[0] for p in ps]
    assert res[0]["namespaces"] == res[1]["namespaces"]
    for r in res:
        assert [o["completed_tokens"] for o in r["ops"]] == [40 * P] * 3
    assert sum(r["stats"]["set_written"] for r in res) == 40
    nsid = ns_ids(daemon)[res[0]["namespaces"]["kv"][0]]["id"]
    assert len(kvcctl_blocks(daemon, nsid)) == 40
    c = instance(daemon, [dict(op="prefetch", tokens=toks)], model="ctl/dp",
                 ranks=[dict(tp_rank=0, tp_size=1, dp_rank=1)])[0]
    assert c["ops"][0]["pages_ok"] == [True] * 40


def test_hybrid_v2_pools(daemon):
    """A hybrid model (Mamba state, an SWA window of 3 pages, a DSA indexer riding the KV
    indices) backed up by one instance and prefetched by another: batch_exists_v2 gives
    the longest KV prefix whose end has its state and window, and the state loaded is the
    one taken at that page, never one taken at another boundary."""
    toks = tokens(10, salt=9)
    hy = dict(swa_window=3, indexer=True)
    a = instance(daemon, [dict(op="backup", tokens=toks[:5 * P], state_at=[4]),
                          dict(op="backup", tokens=toks, state_at=[9])],
                 hybrid=hy, model="ctl/hybrid")[0]
    assert [o["completed_tokens"] for o in a["ops"]] == [5 * P, 10 * P]
    assert set(a["namespaces"]) == {"kv", "mamba", "swa", "indexer"}
    assert "/mamba-state-" in a["namespaces"]["mamba"][0]  # kvcd's state kind
    # 12 pages asked, 10 cached: the state and window at page 10 are there.
    b = instance(daemon, [dict(op="prefetch", tokens=toks + tokens(2, salt=10)),
                          dict(op="prefetch", tokens=toks[:7 * P], rid="short"),
                          dict(op="prefetch", tokens=toks[:5 * P], rid="five")],
                 hybrid=hy, model="ctl/hybrid", layout="layer_first")[0]
    full, short, five = b["ops"]
    assert full["exists_v2"] == dict(kv=10, pools=dict(kv=10, mamba=10, swa=10, indexer=10))
    assert full["completed_tokens"] == 10 * P and full["pages_ok"] == [True] * 10
    assert full["mamba_keys"] == [9] and full["mamba_state_ok"]
    assert full["swa_keys"] == [7, 8, 9] and full["swa_ok"] == [True] * 3
    assert full["indexer_ok"]
    # 7 pages asked: no state was taken at page 7, nor 6; at page 5 there is one (and its
    # window): the usable prefix is 5 pages, with the state taken at page 5.
    assert short["exists_v2"]["kv"] == 5 and short["exists_v2"]["pools"]["mamba"] == 5
    assert short["completed_tokens"] == 5 * P
    assert short["mamba_keys"] == [4] and short["mamba_state_ok"]
    assert short["swa_keys"] == [2, 3, 4] and short["swa_ok"] == [True] * 3
    assert five["exists_v2"]["kv"] == 5 and five["mamba_state_ok"]


def test_prefetch_router_hint_in_extra_info(daemon):
    """A prefetch with a router hint: SGLang hands it to batch_exists and batch_get_v1 in
    extra_info.extra_info ({"kvcc_router_hint": hint}) beside prefix_keys; the backend
    loads the same pages, byte for byte, as without one."""
    toks = tokens(6, salt=21)
    instance(daemon, [dict(op="backup", tokens=toks)], model="ctl/hint")
    hint = dict(worker="w1", overlap_blocks=6)
    b = instance(daemon, [dict(op="prefetch", tokens=toks, router_hint=hint),
                          dict(op="prefetch", tokens=toks, rid="plain")],
                 model="ctl/hint", layout="layer_first")[0]
    hinted, plain = b["ops"]
    assert hinted["completed_tokens"] == 6 * P and hinted["pages_ok"] == [True] * 6
    # one batch_exists and one batch_get_v1 (6 pages: one batch each), both with the hint
    assert hinted["extra_info_seen"] == [dict(kvcc_router_hint=hint)] * 2
    assert plain["pages_ok"] == [True] * 6 and plain["extra_info_seen"] == [None, None]


def test_hybrid_sidecar_on_another_pools_indices(daemon):
    """A draft SWA pool registered after attach (SGLang's register_host_pool_entry) rides
    the SWA pool's indices (indices_from_pool=swa, keys and policy its source's): backed
    up and prefetched with the SWA window, it holds exactly the window's pages. It must
    count as present when its window is, not be asked for every page of the prefix."""
    toks = tokens(8, salt=23)
    hy = dict(swa_window=3, draft_swa=True)
    a = instance(daemon, [dict(op="backup", tokens=toks, state_at=[7])],
                 hybrid=hy, model="ctl/draft")[0]
    assert a["ops"][0]["completed_tokens"] == 8 * P
    assert set(a["namespaces"]) == {"kv", "mamba", "swa", "draft_swa"}
    b = instance(daemon, [dict(op="prefetch", tokens=toks)], hybrid=hy, model="ctl/draft",
                 layout="layer_first")[0]
    full = b["ops"][0]
    assert full["exists_v2"] == dict(kv=8, pools=dict(kv=8, mamba=8, swa=8, draft_swa=8))
    assert full["completed_tokens"] == 8 * P and full["pages_ok"] == [True] * 8
    assert full["swa_keys"] == [5, 6, 7] and full["swa_ok"] == [True] * 3
    assert full["pool_hits"]["draft_swa"] == 3 and full["draft_swa_ok"] == [True] * 3


def test_mla_tp2_hybrid_rank1_backs_up_its_mamba_state_only(daemon):
    """An MLA model with TP-sharded Mamba state (SGLang's Kimi-K3 case) at TP=2: rank 0
    stores the KV pages (rank-replicated) and its state; rank 1 skips the KV but stores
    its own state slice with batch_set_v2, and SGLang counts its backup complete only when
    every sidecar page answered True. A TP=2 reader gets the KV on both ranks and each
    rank's own state."""
    toks = tokens(8, salt=29)
    hy = dict(swa_window=0)
    ranks = [dict(tp_rank=0, tp_size=2), dict(tp_rank=1, tp_size=2)]
    a = instance(daemon, [dict(op="backup", tokens=toks, state_at=[7])], hybrid=hy,
                 mla=True, ranks=ranks, model="ctl/mla-mamba")
    assert [x["ops"][0]["completed_tokens"] for x in a] == [8 * P, 8 * P]
    assert [x["stats"]["set_written"] for x in a] == [8 + 1, 1]
    assert a[0]["namespaces"]["kv"] == a[1]["namespaces"]["kv"]  # one "mla" namespace
    assert a[0]["namespaces"]["mamba"] != a[1]["namespaces"]["mamba"]  # one per TP rank
    nsid = ns_ids(daemon)[a[0]["namespaces"]["kv"][0]]["id"]
    assert len(kvcctl_blocks(daemon, nsid)) == 8
    b = instance(daemon, [dict(op="prefetch", tokens=toks)], hybrid=hy, mla=True,
                 ranks=ranks, model="ctl/mla-mamba", layout="layer_first")
    for x in b:
        op = x["ops"][0]
        assert op["completed_tokens"] == 8 * P and op["pages_ok"] == [True] * 8
        assert op["mamba_keys"] == [7] and op["mamba_state_ok"], x["rank"]


def test_prefix_keys_only_with_hicache_storage_pass_prefix_keys(daemon):
    """SGLang passes a node's prefix_keys to the backup only when the extra config has
    "hicache_storage_pass_prefix_keys": true (its tree cache takes the key out). With it,
    a node backed up under another continues that node's chain in kvcd (depths go on);
    without it the node is a root of its own: found all the same."""
    toks = tokens(8, salt=31)
    base = dict(backend_name="kvcd", module_path="kvcd.sglang",
                class_name="KvcdHiCacheStorage", interface_v1=1)
    depth = {}
    for on in (True, False):
        model = "ctl/prefix-%s" % ("on" if on else "off")
        extra = dict(base, hicache_storage_pass_prefix_keys=True) if on else base
        a = instance(daemon, [dict(op="backup", tokens=toks[:4 * P]),
                              dict(op="backup", tokens=toks, from_page=4),
                              dict(op="prefetch", tokens=toks)],
                     extra_config=extra, model=model)[0]
        assert [o.get("completed_tokens") for o in a["ops"]] == [4 * P, 4 * P, 8 * P]
        assert a["ops"][2]["pages_ok"] == [True] * 8
        nsid = ns_ids(daemon)[a["namespaces"]["kv"][0]]["id"]
        depth[on] = sorted(b["depth"] for b in kvcctl_blocks(daemon, nsid))
    d0 = depth[True][0]
    assert depth[True] == list(range(d0, d0 + 8))
    assert depth[False] == sorted(list(range(d0, d0 + 4)) * 2)
