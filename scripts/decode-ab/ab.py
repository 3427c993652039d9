"""A/B of decode steps: main's ModelRunner (suffixmem_old) vs this branch's, interleaved in one
process, same weights, same token ids. Prints JSON lines.

usage: python ab.py THREADS ROUNDS STEPS
"""
import json
import os
import sys
import time

sys.path.insert(0, "/tmp/h4ab/old")  # scripts/decode-ab/make-old
import torch

threads, rounds, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
MODEL = os.path.expanduser("~/.cache/suffixmem/models/smollm2-135m-instruct")

from suffixmem_old.engine.torch.kv_pool import KVPool as OldPool  # noqa: E402
from suffixmem_old.engine.torch.llama import Llama as OldLlama  # noqa: E402
from suffixmem_old.engine.torch.model_runner import ModelRunner as OldRunner  # noqa: E402
from suffixmem_old.engine.torch.model_runner import SeqInput as OldIn  # noqa: E402

from suffixmem.engine.torch.kv_pool import KVPool as NewPool  # noqa: E402
from suffixmem.engine.torch.llama import Llama as NewLlama  # noqa: E402
from suffixmem.engine.torch.model_runner import ModelRunner as NewRunner  # noqa: E402
from suffixmem.engine.torch.model_runner import SeqInput as NewIn  # noqa: E402

BS = 16
MAXPOS = 2048
arms = {}
for name, L, P, R, In in (("old", OldLlama, OldPool, OldRunner, OldIn),
                          ("new", NewLlama, NewPool, NewRunner, NewIn)):
    m = L.from_pretrained(MODEL, torch.bfloat16)
    c = m.config
    pool = P(c.num_layers, c.num_kv_heads, c.head_dim, BS, 600, m.dtype)
    arms[name] = (R(m, pool, MAXPOS), In)

g = torch.Generator().manual_seed(0)
ids = torch.randint(0, 49152, (4, MAXPOS), generator=g).tolist()


def tables(kind, b, ctx):
    nb = -(-(ctx + steps) // BS)
    if kind == "view":
        return [list(range(i * 130, i * 130 + nb)) for i in range(b)]
    # a later turn: cached blocks, then fresh ones elsewhere (not consecutive)
    half = nb // 2
    return [list(range(i * 130, i * 130 + half))
            + list(range(i * 130 + 70, i * 130 + 70 + nb - half)) for i in range(b)]


scenarios = [("b1_view", "view", 1, 256), ("b1_later_turn", "later", 1, 1024),
             ("b4", "view", 4, 256), ("b4_later_turn", "later", 4, 1024)]
if len(sys.argv) > 4:
    scenarios = [s for s in scenarios if s[0] in sys.argv[4].split(",")]
for sname, kind, b, ctx in scenarios:
    tb = tables(kind, b, ctx)
    res = {"old": [], "new": []}
    cpu = {"old": [], "new": []}
    with torch.inference_mode():
        for runner, In in arms.values():
            runner.forward([In(ids[i][:ctx], list(range(ctx)), tb[i], ctx) for i in range(b)])
        for r in range(rounds + 1):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for name in order:
                runner, In = arms[name]
                t, tc = time.perf_counter(), time.process_time()
                for p in range(ctx, ctx + steps):
                    runner.forward([In([ids[i][p]], [p], tb[i], p + 1) for i in range(b)])
                if r:  # round 0 warms up
                    res[name].append((time.perf_counter() - t) / steps * 1e3)
                    cpu[name].append((time.process_time() - tc) / steps * 1e3)
    # same logits at the last step? (bf16, same weights)
    outs = {}
    for name, (runner, In) in arms.items():
        p = ctx + steps - 1
        outs[name] = runner.forward([In([ids[i][p]], [p], tb[i], p + 1) for i in range(b)]).logits
    srt = {k: sorted(v) for k, v in res.items()}
    print(json.dumps({
        "scenario": sname, "threads": threads, "batch": b, "context": ctx, "steps": steps,
        "rounds": rounds, "load": os.getloadavg()[0],
        "old_ms_min": round(srt["old"][0], 2),
        "old_ms_med": round(srt["old"][len(srt["old"]) // 2], 2),
        "new_ms_min": round(srt["new"][0], 2),
        "new_ms_med": round(srt["new"][len(srt["new"]) // 2], 2),
        "old_cpu_ms_min": round(min(cpu["old"]), 2), "new_cpu_ms_min": round(min(cpu["new"]), 2),
        "logits_equal": bool(torch.equal(outs["old"], outs["new"])),
        "argmax_equal": bool(torch.equal(outs["old"].argmax(-1), outs["new"].argmax(-1))),
        "max_abs_diff": float((outs["old"] - outs["new"]).abs().max()),
    }), flush=True)
