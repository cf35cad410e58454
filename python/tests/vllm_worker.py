# DESIGN: one vLLM worker process (a tensor-parallel rank) of the connector conformance test
# (test_vllm.py, vllm_driver.py): the connector built with role WORKER as vLLM's factory
# does, its KV caches registered as the model runner does (one flash-attn tensor
# [2, num_blocks, block_size, heads, dim] per layer, CPU here), and each step run in the
# model runner's order: bind_connector_metadata, handle_preemptions, start_load_kv, per layer
# wait_for_layer_load, the attention (which first checks that every token it reads holds
# the KV the model would compute, kv_value, then writes the KV of the scheduled tokens) and
# save_kv_layer, then wait_for_save, get_finished, get_block_ids_with_load_errors,
# get_kv_connector_stats, get_kv_connector_kv_cache_events, build_connector_worker_meta
# (into the KVConnectorOutput), clear_connector_metadata. A step with no tokens scheduled
# runs no forward, so no per-layer hook (vLLM's kv_connector_no_forward); a step sent with
# layer_hooks=False runs the attention without them, as a replayed full CUDA graph does.
# It answers with the KVConnectorOutput and what it saw: tokens read with wrong KV (which
# must stay 0), tokens loaded. A hybrid setup's layers each belong to one KV cache group and
# index their paged cache with that group's block ids; a sliding-window layer's attention
# reads only the tokens its window sees (the blocks before are vLLM's null block). A Mamba
# layer's cache is a list of state tensors indexed by block id; before the connector's
# start_load_kv the runner moves each request's state into its running block, as vLLM's
# preprocess_mamba does, and the layer checks the state it starts from, advances it over
# the step's tokens and reports a finished prompt's final states as its output.
import sys
import threading

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.parallel_state import set_tensor_model_parallel
from vllm.forward_context import ForwardContext
from vllm.v1.outputs import KVConnectorOutput
from vllm_driver import (MAMBA, STATE_DTYPES, STATE_SHAPES, configs, group_of_layers,
                         kv_values, load_connector, recv, send, state_step, state_value,
                         track_requests)


def main():
    inp, outp = sys.stdin.buffer, sys.stdout.buffer
    p = recv(inp)
    rank, tp = p["rank"], p["tp"]
    set_tensor_model_parallel(rank, tp)
    vc, kc, names = configs(p)
    heads, dim, bs = p["heads"] // tp, p["head_size"], p["block_size"]
    conn = load_connector(vc, KVConnectorRole.WORKER, kc)
    # "hold_commits" makes the committing thread wait before each commit until
    # "release_commits": commits still queued while later steps save.
    gate = threading.Event()
    gate.set()
    commit_one = conn._commit_one

    def gated_commit(item):
        gate.wait()
        return commit_one(item)

    conn._commit_one = gated_commit
    hybrid = bool(group_of_layers(p))
    layer_group = group_of_layers(p) or {i: (0, 0) for i in range(len(names))}
    # A Mamba layer's cache is vLLM's list of state tensors, [num_blocks, *shape] each.
    caches = {n: ([torch.zeros(p["num_blocks"], *sh, dtype=dt)
                   for sh, dt in zip(STATE_SHAPES, STATE_DTYPES)]
                  if layer_group[i][1] == MAMBA else
                  torch.zeros(2, p["num_blocks"], bs, heads, dim, dtype=torch.float16))
              for i, n in enumerate(names)}
    conn.register_kv_caches(caches)
    reqs = {}  # req_id -> dict(tokens, blocks: a list per KV cache group)
    mamba_groups = sorted({gi for gi, w in layer_group.values() if w == MAMBA})
    mamba_layers = [i for i in range(len(names)) if layer_group[i][1] == MAMBA]
    state_idx = {}  # req_id -> its running state's block index (vLLM's mamba_state_idx)
    send(outp, "ready")
    while True:
        msg = recv(inp)
        if msg[0] == "exit":
            conn.shutdown()
            send(outp, "bye")
            return
        if msg[0] in ("hold_commits", "release_commits"):
            (gate.clear if msg[0] == "hold_commits" else gate.set)()
            send(outp, "ok")
            continue
        if msg[0] == "expect":  # tokens [0, n) against kv_value: the wrong ones
            _, req_id, n = msg
            send(outp, wrong_tokens(caches, names, reqs[req_id], n, rank, heads, dim, bs,
                                    layer_group))
            continue
        out, layer_hooks = msg[1], msg[2]
        layer_hooks = layer_hooks and out.total_num_scheduled_tokens > 0
        starts = track_requests(out, reqs)
        if mamba_layers:
            premamba(out, reqs, starts, state_idx, caches, names, mamba_layers,
                     mamba_groups, bs)
        conn.bind_connector_metadata(out.kv_connector_metadata)
        # Every step, before the preempted requests' blocks can be written again.
        conn.handle_preemptions(out.kv_connector_metadata)
        conn.start_load_kv(ForwardContext())
        wrong_at = []  # blocks of tokens attention read with wrong KV
        wrong_states = []  # requests whose Mamba layer started from a wrong state
        outputs = {}  # req_id -> the Mamba layers' states after its prompt (its "output")
        null_loaded = 0  # layers whose null block a load wrote
        for li, name in enumerate(names):
            if layer_hooks:
                conn.wait_for_layer_load(name)
            gi, window = layer_group[li]
            if window == MAMBA:
                if any(t[0].any() for t in caches[name]):
                    null_loaded += 1
                mamba_forward(out, reqs, starts, caches[name], gi, li, rank, bs,
                              wrong_states, outputs)
                if layer_hooks:
                    conn.save_kv_layer(name, caches[name], None)
                continue
            # A hybrid setup's block 0 is vLLM's null block (the positions a window no
            # longer sees, never read): a load must not write it. Each layer where the
            # step's loads did counts as wrong (the model's own writes come after this).
            if hybrid and caches[name][:, 0].any():
                null_loaded += 1
            for rid, n in out.num_scheduled_tokens.items():
                r, start = reqs[rid], starts[rid]
                ids = r["blocks"][gi]
                pages, offs = slots(ids, start + n, bs)
                # What attention reads: every earlier token (a window: those it sees).
                lo = max(0, start - window + 1) if window else 0
                for kind in (0, 1):
                    want = kv_values(tuple(r["tokens"][:start + n]), li, kind, rank, heads,
                                     dim)
                    got = caches[name][kind, pages[lo:start], offs[lo:start]]
                    bad = (got != want[lo:start]).flatten(1).any(1).nonzero().flatten().tolist()
                    wrong_at += [ids[(lo + t) // bs] for t in bad]
                    caches[name][kind, pages[start:], offs[start:]] = want[start:]
            if layer_hooks:
                conn.save_kv_layer(name, caches[name], None)
        conn.wait_for_save()
        sending, recving = conn.get_finished(out.finished_req_ids)
        # Sync loads report their failures in the same step; vLLM then discards the step's
        # work of those requests: what attention read there does not count.
        failed = conn.get_block_ids_with_load_errors()
        wrong = sum(b not in failed for b in wrong_at) + null_loaded
        # A request a load failed for is recomputed: what it read this step does not count.
        wrong += sum(not any(set(g) & failed for g in reqs[rid]["blocks"])
                     for rid in wrong_states)
        for rid in outputs:
            if any(set(g) & failed for g in reqs[rid]["blocks"]):
                outputs[rid] = None
        if hybrid:  # what the model wrote there (a recompute's early positions): cleared
            for name in names:
                if isinstance(caches[name], list):
                    for t in caches[name]:
                        t[0] = 0
                else:
                    caches[name][:, 0] = 0
        kv_out = step_output(conn, sending, recving, failed)
        send(outp, dict(kv_out=kv_out, wrong=wrong, stats=dict(conn.stats),
                        outputs={r: o for r, o in outputs.items() if o is not None}))


def premamba(out, reqs, starts, state_idx, caches, names, mamba_layers, mamba_groups, bs):
    """What vLLM's model runner does for Mamba layers in align mode before the step's
    forward context is entered, so before the connector's start_load_kv
    (mamba_utils.preprocess_mamba): each scheduled request's running state moves to the
    block of its new running state, (computed + scheduled - 1) // block_size, from its
    last one, or for a request new here from block (computed - 1) // block_size (where a
    prefix hit's state is)."""
    cached = out.scheduled_cached_reqs
    for rid in list(out.finished_req_ids) + list(out.preempted_req_ids or ()) + list(
            cached.resumed_req_ids):
        state_idx.pop(rid, None)
    for rid, n in out.num_scheduled_tokens.items():
        start = starts[rid]
        prev = state_idx.get(rid, (start - 1) // bs)
        curr = (start + n - 1) // bs
        state_idx[rid] = curr
        if prev == -1 or prev == curr:
            continue
        for gi in mamba_groups:
            ids = reqs[rid]["blocks"][gi]
            for li in mamba_layers:
                for t in caches[names[li]]:
                    t[ids[curr]] = t[ids[prev]]


def mamba_forward(out, reqs, starts, states, gi, layer, rank, bs, wrong_states, outputs):
    """A Mamba layer's forward: each request's state is read from its running block (zero
    for a request at token 0), checked against the state a run without a cache has there,
    advanced over the scheduled tokens and written back; a request whose prompt ends in
    this step records its final states as its output."""
    conv_t, ssm_t = states
    for rid, n in out.num_scheduled_tokens.items():
        r, start = reqs[rid], starts[rid]
        block = r["blocks"][gi][(start + n - 1) // bs]
        if start:
            conv, ssm = conv_t[block].clone(), ssm_t[block].clone()
        else:
            conv, ssm = torch.zeros_like(conv_t[0]), torch.zeros_like(ssm_t[0])
        want = state_value(r["tokens"], start, layer, rank)
        if not (torch.equal(conv, want[0]) and torch.equal(ssm, want[1])) or block == 0:
            wrong_states.append(rid)
        for t in r["tokens"][start:start + n]:
            conv, ssm = state_step(conv, ssm, t, layer, rank)
        conv_t[block], ssm_t[block] = conv, ssm
        if start + n == len(r["tokens"]):
            prev = outputs.get(rid) or b""
            outputs[rid] = prev + conv.numpy().tobytes() + ssm.numpy().tobytes()


def slots(ids, n, bs):
    """(pages, offsets) of a request's tokens [0, n) in a group's paged cache."""
    pos = torch.arange(n)
    return torch.tensor(ids, dtype=torch.long)[pos // bs], pos % bs


def step_output(conn, sending, recving, failed):
    """The step's KVConnectorOutput, built as vLLM's runner builds it, and the connector's
    metadata cleared (the end of a step on a worker)."""
    kv_out = KVConnectorOutput(finished_sending=sending, finished_recving=recving,
                               invalid_block_ids=set(failed))
    kv_out.kv_connector_stats = conn.get_kv_connector_stats()
    kv_out.kv_cache_events = conn.get_kv_connector_kv_cache_events()
    kv_out.kv_connector_worker_meta = conn.build_connector_worker_meta()
    conn.clear_connector_metadata()
    return kv_out


def wrong_tokens(caches, names, r, n, rank, heads, dim, bs, layer_group):
    """Tokens [0, n) (a window layer: the last window - 1 of them, what a next query sees)
    whose KV is not the model's, over every layer."""
    bad = 0
    for li, name in enumerate(names):
        gi, window = layer_group[li]
        if window == MAMBA:  # its state: checked as the request's output
            continue
        pages, offs = slots(r["blocks"][gi], n, bs)
        lo = max(0, n - window + 1) if window else 0
        for kind in (0, 1):
            want = kv_values(tuple(r["tokens"][:n]), li, kind, rank, heads, dim)
            got = caches[name][kind, pages[lo:], offs[lo:]]
            bad += int((got != want[lo:]).flatten(1).any(1).sum())
    return bad


if __name__ == "__main__":
    main()
