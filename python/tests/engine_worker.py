# DESIGN: one engine process of the engine tests (test_engine.py): runs the reference engine
# on the prompts of a JSON job (argv[1]) against the kvcd at job["socket"] and prints one
# JSON result. For every prompt it generates with kvcd (loading hits, putting what it
# computed, as job says) and, with job["compare"], again without kvcd, teacher-forced on the
# no-cache tokens so the logits of every step compare one to one.
import json
import sys

import torch

from kvcd.engine import Engine, Model, tiny_config


def main():
    job = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    model = Model(tiny_config(**job.get("model", {})))
    out = []
    for run in job["engines"]:
        eng = Engine(model=model, block_tokens=run["block_tokens"],
                     max_tokens=max(len(p) for p in job["prompts"]) + job["new"],
                     socket_path=job["socket"], model_id=run.get("model_id"),
                     k_codec=run.get("codec"), v_codec=run.get("codec"))
        for prompt in job["prompts"]:
            r = dict(model_id=eng.ns.model_id, prompt=len(prompt),
                     block_bytes=eng.ns.block_bytes)
            ref = None
            if job.get("compare"):
                model.trace = []
                ref = eng.generate(prompt, job["new"], use_cache=False, put=False,
                                   keep_logits=True)
                ref_trace, model.trace = model.trace, []
            hit = eng.generate(prompt, job["new"], use_cache=job.get("use_cache", True),
                               put=job.get("put", True), keep_logits=True,
                               forced=ref.tokens if ref else None)
            r.update(hit_blocks=hit.hit_blocks, loaded=hit.loaded_tokens,
                     computed=hit.computed_tokens, put_blocks=hit.put_blocks,
                     formats=hit.formats, tokens=hit.tokens)
            if ref:
                # attention output of each step's query (the prompt's last token, then one
                # per generated token: the last layers x new forward entries of both runs,
                # whose prefills differ in length), per layer: relative error
                # |hit - ref| / |ref|, the largest over the steps
                attn = [0.0] * model.cfg.layers
                k = model.cfg.layers * job["new"]
                assert len(model.trace) >= k and len(ref_trace) >= k
                for (layer, a), (lb, b) in zip(model.trace[-k:], ref_trace[-k:]):
                    assert layer == lb
                    e = float((a - b).norm() / b.norm().clamp_min(1e-30))
                    attn[layer] = max(attn[layer], e)
                model.trace = None
                r.update(attn_rel=attn)
                diff = max(float((a - b).abs().max()) for a, b in zip(hit.logits, ref.logits))
                scale = max(float(b.abs().max()) for b in ref.logits)
                r.update(ref_tokens=ref.tokens, max_abs_diff=diff, logit_scale=scale,
                         agree=sum(a == b for a, b in zip(hit.tokens, ref.tokens)),
                         bitwise=all(torch.equal(a, b) for a, b in zip(hit.logits, ref.logits)))
            out.append(r)
        eng.close()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
