#!/usr/bin/env python3
"""kvcsim_gen — synthetic traces in the Mooncake JSONL format, for checking that kvcd's
policies generalise beyond the production trace.

    tests/bench/kvcsim_gen.py SHAPE [-n REQUESTS] [--seed S] > trace.jsonl

Shapes (each a different reuse structure; ids are prefix hashes, so a shared id at a
position means the whole prefix up to it is shared):
  docs     Zipf(1.1)-popular shared documents (4-40 blocks) + a unique question (1-3 blocks)
  chat     multi-turn chats: each turn resends the history plus the last answer and a new
           question; lognormal think times, 1-12 turns, 2000 conversations open at once
  scan     a hot set of 200 prompts (uniform) mixed 1:1 with one-off long scans (30-80 blocks)
  recency  each request extends a recent request's prefix, how far back exponential with
           mean 40 requests (strong recency)
  mixed    docs, chat and scan interleaved (one third each)
"""
import argparse
import json
import random
import sys

BLOCK = 512


class Ids:
    def __init__(self):
        self.next = 1  # 0 = the shared system prompt block

    def new(self, n):
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def emit(out, ts, blocks, rng, partial=True):
    tokens = len(blocks) * BLOCK - (rng.randint(1, BLOCK - 1) if partial else 0)
    out.write(json.dumps({"timestamp": int(ts), "input_length": tokens,
                          "output_length": rng.randint(10, 800), "hash_ids": blocks}) + "\n")


def zipf_sampler(rng, n, s):
    w = [1.0 / (i + 1) ** s for i in range(n)]
    tot = sum(w)
    cum, acc = [], 0.0
    for x in w:
        acc += x / tot
        cum.append(acc)

    def draw():
        import bisect
        return min(bisect.bisect_left(cum, rng.random()), n - 1)
    return draw


def gen_docs(rng, ids, n):
    ndocs = 5000
    docs = [[0] + ids.new(rng.randint(4, 40)) for _ in range(ndocs)]
    draw = zipf_sampler(rng, ndocs, 1.1)
    for _ in range(n):
        yield docs[draw()] + ids.new(rng.randint(1, 3))


def gen_chat(rng, ids, n):
    open_convs = []
    for _ in range(n):
        if len(open_convs) < 2000 or rng.random() < 0.05:
            conv = {"path": [0] + ids.new(rng.randint(2, 10)), "left": rng.randint(0, 11)}
            open_convs.append(conv)
            yield conv["path"]
            continue
        # the conversation whose think time ran out first (lognormal think times)
        i = rng.randrange(len(open_convs))
        conv = open_convs[i]
        if rng.lognormvariate(0, 1.5) < 1.0:
            conv["path"] = conv["path"] + ids.new(rng.randint(1, 4))
            yield conv["path"]
            conv["left"] -= 1
            if conv["left"] <= 0:
                open_convs[i] = open_convs[-1]
                open_convs.pop()
        else:
            conv = {"path": [0] + ids.new(rng.randint(2, 10)), "left": rng.randint(0, 11)}
            open_convs.append(conv)
            yield conv["path"]


def gen_scan(rng, ids, n):
    hot = [[0] + ids.new(rng.randint(3, 12)) for _ in range(200)]
    for _ in range(n):
        if rng.random() < 0.5:
            yield hot[rng.randrange(len(hot))] + ids.new(1)
        else:
            yield [0] + ids.new(rng.randint(30, 80))


def gen_recency(rng, ids, n):
    recent = []
    for _ in range(n):
        if recent and rng.random() < 0.8:
            back = min(int(rng.expovariate(1.0 / 40.0)), len(recent) - 1)
            base = recent[-1 - back]
            cut = rng.randint(1, len(base))
            path = base[:cut] + ids.new(rng.randint(1, 6))
        else:
            path = [0] + ids.new(rng.randint(2, 16))
        recent.append(path)
        if len(recent) > 2000:
            recent.pop(0)
        yield path


def gen_mixed(rng, ids, n):
    gens = [gen_docs(rng, ids, n), gen_chat(rng, ids, n), gen_scan(rng, ids, n)]
    for _ in range(n):
        yield next(gens[rng.randrange(3)])


SHAPES = {"docs": gen_docs, "chat": gen_chat, "scan": gen_scan, "recency": gen_recency,
          "mixed": gen_mixed}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    ts = 0.0
    for blocks in SHAPES[a.shape](rng, Ids(), a.n):
        ts += rng.expovariate(1.0 / 300.0)  # ~3.3 requests per second, as in production
        emit(sys.stdout, ts, list(blocks), rng)


if __name__ == "__main__":
    main()
