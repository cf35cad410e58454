# DESIGN: `make demo-engine`: several reference-engine processes against one real kvcd
# started in a temporary directory, on the GPU when torch sees one (hits scattered straight
# into the engine's paged cache in device memory), else on the CPU. Each process builds a prompt from a shared system prompt,
# a shared few-shot header and a question of its own, generates with kvcd (loading what
# others computed, putting what it computed) and again without it, and prints both prefill
# times and the tokens loaded and computed. A process exits 1 when any generated token
# differs from its run without kvcd; the demo exits non-zero when any process did.
import argparse
import json
import subprocess
import sys

from kvcd.engine import Engine, ModelConfig
from kvcd.engine.daemon import PrivateDaemon
from kvcd.engine.prompts import chat_prompt

# (name, system prompt, few-shot header, question): A warms the cache alone, then the rest
# run side by side: B and C share A's system prompt and header, D neither; then E shares
# A's system prompt only, F D's system prompt and header.
PLAN = [[("A", 0, 0, 0)], [("B", 0, 0, 1), ("C", 0, 0, 2), ("D", 1, 1, 3)],
        [("E", 0, 1, 4), ("F", 1, 1, 5)]]


def worker(a):
    prompt = chat_prompt(a.system, a.fewshot, a.question, a.system_tokens)
    with Engine(ModelConfig(), block_tokens=a.block_tokens, max_tokens=len(prompt) + a.new,
                socket_path=a.socket, threads=1) as e:
        hit = e.generate(prompt, a.new)
        ref = e.generate(prompt, a.new, use_cache=False, put=False)
    same = hit.tokens == ref.tokens
    print("%s (%s): %d-token prompt: prefill %.3f s with kvcd (%d tokens loaded, %d "
          "computed), %.3f s without (%d computed): %.1fx; %d tokens generated, %s" %
          (a.name, e.device.type, len(prompt), hit.prefill_s, hit.loaded_tokens,
           hit.computed_tokens,
           ref.prefill_s, ref.computed_tokens, ref.prefill_s / hit.prefill_s, a.new,
           "all equal to the run without kvcd" if same else
           "DIFFERENT from the run without kvcd: %s vs %s" % (hit.tokens, ref.tokens)),
          flush=True)
    print(json.dumps(dict(name=a.name, device=e.device.type, prompt=len(prompt),
                          prefill_hit_s=hit.prefill_s,
                          prefill_nocache_s=ref.prefill_s, loaded=hit.loaded_tokens,
                          computed=hit.computed_tokens, put_blocks=hit.put_blocks,
                          same=same)), file=sys.stderr)
    return 0 if same else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--socket", help="a running kvcd (default: start one in a temp dir)")
    p.add_argument("--kvcd", help="the kvcd binary to start (default: $KVCD_BIN, build/bin)")
    p.add_argument("--system-tokens", type=int, default=768)
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--new", type=int, default=16, help="tokens to generate")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--name", default="A")
    p.add_argument("--system", type=int, default=0)
    p.add_argument("--fewshot", type=int, default=0)
    p.add_argument("--question", type=int, default=0)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    daemon = None
    if not a.socket:
        daemon = PrivateDaemon(["host.size=256m"], binary=a.kvcd).start()
        a.socket = daemon.socket
        print("== kvcd (pid %d) serving %s" % (daemon.proc.pid, a.socket), flush=True)
    failed = 0
    try:
        for wave in PLAN:
            print("== %s" % ", ".join(w[0] for w in wave) + (" side by side" if len(wave) > 1
                                                            else " alone"), flush=True)
            procs = []
            for name, system, fewshot, question in wave:
                cmd = [sys.executable, "-m", "kvcd.engine.demo", "--worker", "--socket",
                       a.socket, "--name", name, "--system", str(system), "--fewshot",
                       str(fewshot), "--question", str(question), "--system-tokens",
                       str(a.system_tokens), "--block-tokens", str(a.block_tokens), "--new",
                       str(a.new)]
                procs.append((name, subprocess.Popen(cmd, stderr=subprocess.DEVNULL)))
            for name, proc in procs:
                try:
                    rc = proc.wait(timeout=600)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    rc = proc.wait()
                if rc != 0:
                    print("demo-engine: %s failed (exit %d)" % (name, rc), flush=True)
                    failed += 1
    finally:
        if daemon:
            daemon.stop()
    print("== %s" % ("every process generated the same tokens as without kvcd" if not failed
                     else "%d process(es) failed" % failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
