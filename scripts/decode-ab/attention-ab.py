"""Interleaved A/B of decode attention: whole ``ModelRunner`` decode steps with
``attention.one_query`` forced to packed SDPA or to the block-diagonal products, at each context
length given (2 threads, 5 rounds of 24 steps, median [min, max] ms a step).

usage: python scripts/decode-ab/attention-ab.py CTX [CTX ...]
"""
import os
import statistics
import sys
import time

import torch

import suffixmem.engine.torch.attention as attention
from suffixmem.engine.torch.kv_pool import KVPool
from suffixmem.engine.torch.llama import Llama
from suffixmem.engine.torch.model_runner import ModelRunner, SeqInput
from suffixmem.models import resolve_model

BS, STEPS, ROUNDS = 32, 24, 5
ARMS = (("sdpa", 10**9), ("block_diagonal", 0))


def main() -> None:
    torch.set_num_threads(2)
    model = Llama.from_pretrained(resolve_model(progress=False), torch.bfloat16)
    c = model.config
    for ctx in [int(x) for x in sys.argv[1:]]:
        n = ctx + 2 * (ROUNDS + 1) * STEPS + 8
        ids = torch.randint(0, c.vocab_size, (n,)).tolist()
        nb = -(-n // BS)
        table = list(range(nb))
        pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, BS, nb + 4, model.dtype)
        runner = ModelRunner(model, pool, n + 64)
        res: dict[str, list[float]] = {name: [] for name, _ in ARMS}
        runner.forward([SeqInput(ids[:ctx], list(range(ctx)), table, ctx)])
        p = ctx
        for r in range(ROUNDS + 1):  # round 0 warms up
            for name, switch in ARMS:
                attention.LONG_CONTEXT = switch
                t = time.perf_counter()
                for _ in range(STEPS):
                    runner.forward([SeqInput([ids[p]], [p], table, p + 1)])
                    p += 1
                if r:
                    res[name].append((time.perf_counter() - t) / STEPS * 1e3)
        print(ctx, {k: (round(statistics.median(v), 2), round(min(v), 2), round(max(v), 2))
                    for k, v in res.items()}, "load", os.getloadavg()[0], flush=True)


if __name__ == "__main__":
    main()
