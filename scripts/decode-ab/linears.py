"""Where the weight-reading floor of a decode step is: the engine's prepacked bf16 products
timed per kind (30 in a row: one kind's weights stay in L3) and in a decode step's layer order
(every weight read once). usage: python linears.py [THREADS]  (docs/profile-decode.md, round 3)
"""
import os
import sys
import time

import torch

from suffixmem.engine.torch.llama import Llama, rms_norm

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
m = Llama.from_pretrained(os.path.expanduser("~/.cache/suffixmem/models/smollm2-135m-instruct"),
                          torch.bfloat16)
c = m.config
x = torch.randn(1, c.hidden_size, dtype=torch.bfloat16)
xi = torch.randn(1, c.intermediate_size, dtype=torch.bfloat16)


def bench(name: str, fn, n: int, all_weights: bool = False) -> None:
    with torch.inference_mode():
        for _ in range(5):
            fn()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        dt = (time.perf_counter() - t) / n
    rate = f"  ({m.weight_bytes / dt / 1e9:.1f} GB/s)" if all_weights else ""
    print(f"{name}: {dt * 1e3:.2f} ms{rate}")


for kind, arg in (("qkv", x), ("o", x), ("gate_up", x), ("down", xi)):
    bench(f"{kind} x30 layers", lambda kind=kind, arg=arg: [getattr(b, kind)(arg)
                                                         for b in m.bound], 30)
bench("lm_head", lambda: m.lm_head_linear(x), 50)


def step_order(norms: bool) -> None:
    for w, b in zip(m.layers, m.bound, strict=True):
        y = rms_norm(x, w.input_norm, c.rms_norm_eps) if norms else x
        b.qkv(y)
        b.o(x)
        y = rms_norm(x, w.post_norm, c.rms_norm_eps) if norms else x
        b.gate_up(y)
        b.down(xi)
    m.lm_head_linear(x)


bench("every product in layer order", lambda: step_order(False), 30, True)
bench("... with the RMSNorms", lambda: step_order(True), 30, True)
print(f"load average {os.getloadavg()[0]:.2f}")
