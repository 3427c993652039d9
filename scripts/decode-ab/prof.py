"""torch.profiler of decode steps, old (main) vs new (branch): op calls per step and the top
self-CPU entries. usage: python prof.py THREADS CONTEXT KIND(view|later) STEPS"""
import os
import sys

sys.path.insert(0, "/tmp/h4ab/old")
import torch
from torch.profiler import ProfilerActivity, profile

threads, ctx, kind, steps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
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
ids = torch.randint(0, 49152, (ctx + steps + 1,)).tolist()
nb = -(-(ctx + steps + 1) // BS)
later = list(range(nb // 2)) + list(range(200, 200 + nb - nb // 2))  # not consecutive
table = list(range(nb)) if kind == "view" else later
for name, L, P, R, In in (("old", OldLlama, OldPool, OldRunner, OldIn),
                          ("new", NewLlama, NewPool, NewRunner, NewIn)):
    m = L.from_pretrained(MODEL, torch.bfloat16)
    c = m.config
    runner = R(m, P(c.num_layers, c.num_kv_heads, c.head_dim, BS, 400, m.dtype), 4096)
    with torch.inference_mode():
        runner.forward([In(ids[:ctx], list(range(ctx)), table, ctx)])
        for p in range(ctx, ctx + 4):  # warm-up (and the mirror's copy)
            runner.forward([In([ids[p]], [p], table, p + 1)])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for p in range(ctx + 4, ctx + 4 + steps):
                runner.forward([In([ids[p]], [p], table, p + 1)])
    ev = prof.key_averages()
    total_calls = sum(e.count for e in ev)
    total_self = sum(e.self_cpu_time_total for e in ev)
    print(f"== {name}: threads={threads} ctx={ctx} kind={kind} steps={steps} "
          f"load={os.getloadavg()[0]:.2f}: {total_calls / steps:.0f} op calls/step, "
          f"self CPU {total_self / steps / 1e3:.2f} ms/step")
    print(ev.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=48))
