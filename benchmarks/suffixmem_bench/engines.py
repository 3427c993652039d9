"""``suffixmem bench engines``: the torch engine, transformers ``generate`` and vLLM on one
~1,500-token prompt of real text, in one run, against this machine's measured limits.

For each engine: cold prefill seconds (nothing cached), warm time to first token (same session,
same prompt again) and decode milliseconds per token (greedy, EOS ignored, after a cached
prompt). transformers has no cross-request reuse, so its "warm" figure is another full prefill.

Limits are measured in the same process just before: a large bf16 matmul (FLOP/s) and a
large memory copy (bytes read + written per second). Each engine's prefill is then expressed as
a fraction of the matmul rate (model FLOPs / prefill time), and its decode as a fraction of the
copy bandwidth (bytes of weights and KV read per token / decode time).
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import typer

from suffixmem.config import DEFAULT_MODEL
from suffixmem_bench.corpus import reference_text

ENGINE_NAMES = ("torch", "transformers", "vllm")


def measure_limits(size: int = 2048, copy_mib: int = 256, repeats: int = 5) -> dict[str, float]:
    """Best-of-``repeats`` bf16 matmul FLOP/s (``size``³) and memory-copy bytes/s (read +
    written) of a ``copy_mib`` MiB tensor, with torch's current thread count."""
    import torch

    a = torch.randn(size, size, dtype=torch.bfloat16)
    b = torch.randn(size, size, dtype=torch.bfloat16)
    a @ b  # warm-up
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    src = torch.ones(copy_mib << 18, dtype=torch.float32)  # copy_mib MiB
    dst = torch.empty_like(src)
    dst.copy_(src)
    best_copy = min(_timed(lambda: dst.copy_(src)) for _ in range(repeats))
    return {
        "bf16_matmul_flops_per_s": 2 * size**3 / best,
        "copy_bytes_per_s": 2 * src.numel() * 4 / best_copy,
        "threads": float(torch.get_num_threads()),
    }


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def model_costs(model_path: Any, prompt_tokens: int) -> dict[str, float]:
    """FLOPs of a prefill of ``prompt_tokens`` (matmuls + causal attention, lm_head once) and
    bf16 bytes read per decode token (weights + KV of the prompt), from ``config.json``."""
    from suffixmem.engine.torch.llama import read_config

    c = read_config(model_path)
    e, hd = c.hidden_size, c.head_dim
    per_token = 2 * e * ((c.num_heads + 2 * c.num_kv_heads) * hd + c.num_heads * hd
                         + 3 * c.intermediate_size)
    n = prompt_tokens
    attn = 4 * c.num_heads * hd * (n * (n + 1) // 2)  # QK^T and PV over the visible keys
    flops = c.num_layers * (n * per_token + attn) + 2 * e * c.vocab_size
    params = c.num_layers * (per_token // 2 + 2 * e) + e + c.vocab_size * e * (
        1 if c.tie_word_embeddings else 2)
    kv = c.num_layers * 2 * c.num_kv_heads * hd * n
    return {"prefill_flops": float(flops), "decode_bytes_per_token": float(2 * (params + kv))}


def _protocol_engine(name: str, model: str, prompt: Sequence[int], decode_tokens: int,
                     repeats: int) -> dict[str, float]:
    """Cold, warm and decode figures of a suffixmem engine (torch or vllm)."""
    from suffixmem.engine import create_engine
    from suffixmem.engine.protocol import Message, Request, SamplingParams

    engine = create_engine(name, model=model, max_model_len=4096, kv_cache_gib=1.0)
    try:
        one = SamplingParams(max_tokens=1)
        for i in range(2):  # warm-up: one-time start-up costs are not "cold"
            engine.generate(Request(f"warmup-{i}", messages=[Message("user", "Hello there")],
                                    sampling=SamplingParams(max_tokens=4)))
        session = f"bench-engines-{uuid.uuid4().hex[:8]}"
        cold = engine.generate(Request(session, token_ids=prompt, sampling=one))
        warm = [engine.generate(Request(session, token_ids=prompt, sampling=one))
                for _ in range(repeats)]
        dec = engine.generate(Request(session, token_ids=prompt, sampling=SamplingParams(
            max_tokens=decode_tokens + 1, ignore_eos=True)))
        span = dec.latency_s - dec.ttft_s
        return {
            "prefill_s": cold.ttft_s,
            "warm_ttft_s": statistics.median(r.ttft_s for r in warm),
            "decode_ms_per_token": 1000 * span / max(1, dec.output_tokens - 1),
            "prompt_tokens": float(cold.prompt_tokens),
            "warm_cached_tokens": float(warm[-1].cached_tokens),
        }
    finally:
        engine.close()


def _transformers(model_path: Any, prompt: Sequence[int], decode_tokens: int,
                  repeats: int) -> dict[str, float]:
    """transformers ``generate`` in bf16: 1 new token (prefill) and ``decode_tokens + 1``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.bfloat16).eval()
    ids = torch.tensor([list(prompt)])

    def gen(n: int) -> float:
        with torch.inference_mode():
            t = time.perf_counter()
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            elapsed = time.perf_counter() - t
        assert out.shape[1] == ids.shape[1] + n
        return elapsed

    gen(2)  # warm-up on the real prompt (first-call allocations)
    cold = gen(1)
    warm = statistics.median(gen(1) for _ in range(repeats))
    total = gen(decode_tokens + 1)
    return {
        "prefill_s": cold,
        "warm_ttft_s": warm,
        "decode_ms_per_token": 1000 * (total - min(cold, warm)) / decode_tokens,
        "prompt_tokens": float(ids.shape[1]),
        "warm_cached_tokens": 0.0,
    }


def run_engines(prompt_tokens: int = 1500, decode_tokens: int = 64, model: str = DEFAULT_MODEL,
                engines: Sequence[str] = ENGINE_NAMES, repeats: int = 3) -> dict[str, Any]:
    """Measure every engine in ``engines`` on one prompt; returns the JSON-ready figures."""
    import os

    import torch
    from transformers import AutoTokenizer

    from suffixmem.chat_template import ChatTemplate
    from suffixmem.engine.protocol import Message
    from suffixmem.models import resolve_model

    unknown = [e for e in engines if e not in ENGINE_NAMES]
    if unknown:
        raise typer.BadParameter(f"unknown engines {unknown}; expected some of {ENGINE_NAMES}")
    torch.set_num_threads(os.cpu_count() or 1)
    path = resolve_model(model)
    tok = AutoTokenizer.from_pretrained(str(path))
    doc = reference_text(prompt_tokens - 40,
                         lambda t: len(tok(t, add_special_tokens=False)["input_ids"]))
    prompt = ChatTemplate(tok).render(
        [Message("user", f"{doc}\n\nSummarize the text above in one sentence.")])
    limits = measure_limits()
    costs = model_costs(path, len(prompt))
    out: dict[str, Any] = {}
    for name in engines:
        try:
            if name == "transformers":
                figures = _transformers(path, prompt, decode_tokens, repeats)
            else:
                figures = _protocol_engine(name, model, prompt, decode_tokens, repeats)
        except Exception as e:  # one engine failing (vLLM missing) must not hide the others
            out[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        torch.set_num_threads(os.cpu_count() or 1)  # vLLM may have changed it
        figures["prefill_flops_fraction"] = (
            costs["prefill_flops"] / figures["prefill_s"] / limits["bf16_matmul_flops_per_s"])
        figures["decode_bandwidth_fraction"] = (
            costs["decode_bytes_per_token"] / (figures["decode_ms_per_token"] / 1000)
            / limits["copy_bytes_per_s"])
        out[name] = figures
    return {
        "prompt_tokens": len(prompt),
        "decode_tokens": decode_tokens,
        "engines": out,
        "limits": {**limits, **costs},
        "targets": _targets(out),
    }


def _targets(engines: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets for the torch engine, as measured ratios."""
    t, hf = engines.get("torch", {}), engines.get("transformers", {})
    if "prefill_s" not in t:
        return {}
    res: dict[str, Any] = {
        "warm_over_cold": t["warm_ttft_s"] / t["prefill_s"],
        "warm_ttft_at_most_1_20_of_cold": t["warm_ttft_s"] <= t["prefill_s"] / 20,
    }
    if "prefill_s" in hf:
        res.update(
            prefill_vs_transformers=t["prefill_s"] / hf["prefill_s"],
            prefill_no_slower_than_transformers=t["prefill_s"] <= hf["prefill_s"],
            decode_speedup_vs_transformers=hf["decode_ms_per_token"] / t["decode_ms_per_token"],
            decode_at_least_2x_transformers=(
                hf["decode_ms_per_token"] >= 2 * t["decode_ms_per_token"]),
        )
    return res


def register(bench: typer.Typer) -> None:
    @bench.command("engines")
    def engines_cmd(
        prompt_tokens: int = typer.Option(1500, help="Approximate prompt length in tokens."),
        decode_tokens: int = typer.Option(64, help="Tokens decoded for the per-token figure."),
        engines: str = typer.Option(",".join(ENGINE_NAMES), help="Comma-separated engines."),
        model: str = typer.Option(DEFAULT_MODEL, help="Model name, .gguf file or folder."),
        repeats: int = typer.Option(3, help="Warm runs (median)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Prefill, warm TTFT and decode speed of torch, transformers and vLLM, vs limits."""
        from rich.console import Console

        from suffixmem.stdio import quiet_stdout

        console = Console()

        names = [e.strip() for e in engines.split(",") if e.strip()]
        with quiet_stdout(as_json):
            result = run_engines(prompt_tokens, decode_tokens, model, names, repeats)
        if as_json:
            print(json.dumps(result))
            return
        _print(console, result)


def _print(console: Any, result: dict[str, Any]) -> None:
    from rich.table import Table

    lim = result["limits"]
    table = Table(title=f"{result['prompt_tokens']}-token prompt, {result['decode_tokens']} "
                        "decoded tokens")
    for col in ("engine", "cold prefill", "warm TTFT", "decode/token", "prefill % of matmul",
                "decode % of copy BW"):
        table.add_column(col, justify="right")
    for name, f in result["engines"].items():
        if "error" in f:
            table.add_row(name, f"[red]{f['error']}[/]", "", "", "", "")
            continue
        table.add_row(name, f"{f['prefill_s']:.2f} s", f"{f['warm_ttft_s'] * 1000:.0f} ms",
                      f"{f['decode_ms_per_token']:.1f} ms",
                      f"{100 * f['prefill_flops_fraction']:.0f}%",
                      f"{100 * f['decode_bandwidth_fraction']:.0f}%")
    console.print(table)
    console.print(f"limits: bf16 matmul {lim['bf16_matmul_flops_per_s'] / 1e9:.0f} GFLOP/s, "
                  f"copy {lim['copy_bytes_per_s'] / 1e9:.1f} GB/s, "
                  f"{int(lim['threads'])} threads")
    for key, value in result["targets"].items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        console.print(f"  {key}: {shown}")
