"""``suffixmem bench engines``: the torch engine, transformers ``generate`` and vLLM on one
~1,500-token prompt of real text, interleaved, against this machine's measured limits.

For each engine: cold prefill seconds (a fresh session: nothing cached), warm time to first
token (same session, same prompt again) and decode milliseconds per token (greedy, EOS ignored,
after a cached prompt). transformers has no cross-request reuse, so its "warm" figure is another
full prefill. Measurement follows ``measure``: all engines are built at one thread count, each
in a child process of its own (``engine_child`` says why), then measured A/B/C/A/B/C for
``repeats`` (>= 3) rounds; each figure is the median with its min, max
and runs; this is done at 1 thread and at all cores (``by_threads``; the top-level figures are
at all cores). The JSON carries ``commit``, ``load_avg``, ``matmul_gflops`` and ``noisy``.

Limits are measured in the same process just before: a large matmul in the engines' dtype
(``matmul_dtype``: bf16 with AVX-512 BF16, else fp32; FLOP/s) and a
large memory copy (bytes read + written per second). Each engine's prefill is then expressed as
a fraction of the matmul rate (model FLOPs / prefill time), and its decode as a fraction of the
copy bandwidth (bytes of weights and KV read per token / decode time). ``limits`` also holds
the bandwidth limit of one decode step (``bandwidth_limit_ms``: weight bytes / copy bandwidth)
and the torch model runner's batch-1 and batch-4 decode step against it
(``runner_decode_ms_per_token_b1``/``_b4``, ``runner_ratio_b1``/``_b4``, at the top thread count;
``runner_by_threads`` has them at every thread count measured).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import typer

from suffixmem.config import DEFAULT_MODEL
from suffixmem_bench.corpus import reference_text
from suffixmem_bench.engine_child import ChildArm
from suffixmem_bench.measure import RunContext, check_repeats, interleave, set_threads, spread

ENGINE_NAMES = ("torch", "transformers", "vllm")


def measure_limits(size: int = 2048, copy_mib: int = 256, repeats: int = 5,
                   dtype: str = "auto") -> dict[str, Any]:
    """Best-of-``repeats`` matmul FLOP/s (``size``³) in ``dtype`` (``auto``: the engines' dtype
    on this device, bf16 with AVX-512 BF16, else fp32) and memory-copy bytes/s (read + written)
    of a ``copy_mib`` MiB tensor, with torch's current thread count."""
    import torch

    from suffixmem.config import resolve_dtype
    from suffixmem.engine.torch.kv_pool import torch_dtype

    dtype = resolve_dtype(dtype)
    a = torch.randn(size, size, dtype=torch_dtype(dtype))
    b = torch.randn(size, size, dtype=torch_dtype(dtype))
    a @ b  # warm-up
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    src = torch.ones(copy_mib << 18, dtype=torch.float32)  # copy_mib MiB
    dst = torch.empty_like(src)
    dst.copy_(src)
    best_copy = min(_timed(lambda: dst.copy_(src)) for _ in range(repeats))
    return {
        "matmul_flops_per_s": 2 * size**3 / best,
        "matmul_dtype": dtype,
        "copy_bytes_per_s": 2 * src.numel() * 4 / best_copy,
        "threads": float(torch.get_num_threads()),
    }


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def model_costs(model_path: Any, prompt_tokens: int, dtype_bytes: int = 2) -> dict[str, float]:
    """FLOPs of a prefill of ``prompt_tokens`` (matmuls + causal attention, lm_head once) and
    bytes read per decode token (weights + KV of the prompt, ``dtype_bytes`` each), from
    ``config.json``."""
    from suffixmem.engine.torch.model_config import read_config

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
    return {"prefill_flops": float(flops),
            "decode_bytes_per_token": float(dtype_bytes * (params + kv))}


class _ProtocolArm:
    """A suffixmem engine (torch or vllm) built once, measured once per round: cold prefill
    (a fresh session: nothing cached), warm TTFT (the same prompt again) and decode."""

    def __init__(self, name: str, model: str, prompt: Sequence[int], decode_tokens: int,
                 threads: int) -> None:
        from suffixmem.engine import create_engine
        from suffixmem.engine.protocol import Message, Request, SamplingParams

        flags: dict[str, Any] = {"extra": {"num_threads": threads}} if name == "torch" else {}
        self.engine = create_engine(name, model=model, max_model_len=4096, kv_cache_gib=1.0,
                                    **flags)
        self.prompt = list(prompt)
        self.decode_tokens = decode_tokens
        for i in range(2):  # warm-up: one-time start-up costs are not "cold"
            self.engine.generate(Request(f"warmup-{i}", messages=[Message("user", "Hello")],
                                         sampling=SamplingParams(max_tokens=4)))

    def __call__(self) -> dict[str, float]:
        from suffixmem.engine.protocol import Request, SamplingParams

        one = SamplingParams(max_tokens=1)
        session = f"bench-engines-{uuid.uuid4().hex[:8]}"
        cold = self.engine.generate(Request(session, token_ids=self.prompt, sampling=one))
        warm = self.engine.generate(Request(session, token_ids=self.prompt, sampling=one))
        dec = self.engine.generate(Request(session, token_ids=self.prompt, sampling=SamplingParams(
            max_tokens=self.decode_tokens + 1, ignore_eos=True)))
        return {
            "prefill_s": cold.ttft_s,
            "warm_ttft_s": warm.ttft_s,
            "decode_ms_per_token": 1000 * (dec.latency_s - dec.ttft_s)
            / max(1, dec.output_tokens - 1),
            "prompt_tokens": float(cold.prompt_tokens),
            "cold_cached_tokens": float(cold.cached_tokens),
            "warm_cached_tokens": float(warm.cached_tokens),
        }

    def close(self) -> None:
        self.engine.close()


class _TransformersArm:
    """transformers ``generate`` in the engines' dtype (``EngineConfig``'s ``auto``: bf16 with
    AVX-512 BF16, else fp32): 1 new token (prefill; it has no cross-request reuse, so "warm"
    is another full prefill) and ``decode_tokens + 1``."""

    def __init__(self, model_path: Any, prompt: Sequence[int], decode_tokens: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from suffixmem.config import resolve_dtype
        from suffixmem.engine.torch.kv_pool import torch_dtype

        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_path), dtype=torch_dtype(resolve_dtype("auto"))).eval()
        self.ids = torch.tensor([list(prompt)])
        self.decode_tokens = decode_tokens
        self._gen(2)  # warm-up on the real prompt (first-call allocations)

    def _gen(self, n: int) -> float:
        import torch

        with torch.inference_mode():
            t = time.perf_counter()
            out = self.model.generate(self.ids, max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False)
            elapsed = time.perf_counter() - t
        assert out.shape[1] == self.ids.shape[1] + n
        return elapsed

    def __call__(self) -> dict[str, float]:
        cold = self._gen(1)
        warm = self._gen(1)
        total = self._gen(self.decode_tokens + 1)
        return {
            "prefill_s": cold,
            "warm_ttft_s": warm,
            "decode_ms_per_token": 1000 * (total - min(cold, warm)) / self.decode_tokens,
            "prompt_tokens": float(self.ids.shape[1]),
            "cold_cached_tokens": 0.0,
            "warm_cached_tokens": 0.0,
        }

    def close(self) -> None:
        del self.model


TIMED = ("prefill_s", "warm_ttft_s", "decode_ms_per_token")


def _measure_at(threads: int, engines: Sequence[str], model: str, prompt: Sequence[int],
                decode_tokens: int, repeats: int) -> dict[str, dict[str, Any]]:
    """Every engine built at ``threads`` threads, each in a child process of its own
    (``engine_child``: vLLM binds its threads once per process; engines sharing one slow each
    other's OpenMP waits), then measured A/B/C/A/B/C... ``repeats`` rounds. An engine that
    cannot be built (vLLM missing) is reported, not estimated."""
    arms: dict[str, Any] = {}
    out: dict[str, dict[str, Any]] = {}
    try:
        for name in engines:
            try:
                arms[name] = ChildArm(name, model, prompt, decode_tokens, threads)
            except Exception as e:  # one engine failing must not hide the others
                out[name] = {"error": f"{type(e).__name__}: {e}"}
        runs = interleave(dict(arms), repeats)
    finally:
        for a in arms.values():
            a.close()
    for name, rs in runs.items():
        fig: dict[str, Any] = {k: rs[-1][k] for k in rs[-1] if k not in TIMED}
        for key in TIMED:
            s = spread([r[key] for r in rs])
            fig[key] = s["median"]
            fig[f"{key}_runs"] = s["runs"]
            fig[f"{key}_min"], fig[f"{key}_max"] = s["min"], s["max"]
        out[name] = fig
    return {n: out[n] for n in engines if n in out}


def run_engines(prompt_tokens: int = 1500, decode_tokens: int = 64, model: str = DEFAULT_MODEL,
                engines: Sequence[str] = ENGINE_NAMES, repeats: int = 3,
                threads: Sequence[int] | None = None, limit_steps: int = 32) -> dict[str, Any]:
    """Measure every engine in ``engines`` on one prompt, interleaved, at each thread count of
    ``threads`` (default: 1 and all cores); returns the JSON-ready figures. The top-level
    ``engines`` figures are those at the largest thread count; ``by_threads`` has them all."""
    from transformers import AutoTokenizer

    from suffixmem.chat_template import ChatTemplate
    from suffixmem.engine.protocol import Message
    from suffixmem.engine.torch.kv_pool import torch_dtype
    from suffixmem.models import resolve_model

    unknown = [e for e in engines if e not in ENGINE_NAMES]
    if unknown:
        raise typer.BadParameter(f"unknown engines {unknown}; expected some of {ENGINE_NAMES}")
    check_repeats(repeats)
    cores = os.cpu_count() or 1
    counts = sorted(set(threads or (1, cores)))
    path = resolve_model(model)
    tok = AutoTokenizer.from_pretrained(str(path))
    doc = reference_text(prompt_tokens - 40,
                         lambda t: len(tok(t, add_special_tokens=False)["input_ids"]))
    prompt = ChatTemplate(tok).render(
        [Message("user", f"{doc}\n\nSummarize the text above in one sentence.")])
    with RunContext(counts[-1]) as ctx:
        set_threads(counts[-1])
        limits = measure_limits()
        limits.update(model_costs(path, len(prompt),
                                  torch_dtype(limits["matmul_dtype"]).itemsize))
        runner_by_threads: dict[str, dict[str, float]] = {}
        for t in counts:  # the runner's decode steps at each thread count, the top one last
            set_threads(t)
            runner_by_threads[str(t)] = decode_limits(path, limits["copy_bytes_per_s"],
                                                      limit_steps)
        limits.update(runner_by_threads[str(counts[-1])])
        limits["runner_by_threads"] = runner_by_threads  # type: ignore[assignment]
        by_threads = {str(t): _measure_at(t, engines, model, prompt, decode_tokens, repeats)
                      for t in counts}
    out = by_threads[str(counts[-1])]
    for figures in out.values():
        if "error" in figures:
            continue
        figures["prefill_flops_fraction"] = (
            limits["prefill_flops"] / figures["prefill_s"] / limits["matmul_flops_per_s"])
        figures["decode_bandwidth_fraction"] = (
            limits["decode_bytes_per_token"] / (figures["decode_ms_per_token"] / 1000)
            / limits["copy_bytes_per_s"])
        figures["decode_over_limit"] = (figures["decode_ms_per_token"]
                                        / limits["bandwidth_limit_ms"])
    return {
        "prompt_tokens": len(prompt),
        "decode_tokens": decode_tokens,
        "repeats": repeats,
        "engines": out,
        "by_threads": by_threads,
        "limits": limits,
        "targets": _targets(out, limits),
        **ctx.fields(),
        "threads": counts,
    }


def decode_limits(path: Any, copy_bytes_per_s: float, steps: int = 32) -> dict[str, float]:
    """Batch-1 and batch-4 decode steps of the torch model runner against the memory-bandwidth
    limit (weights bytes / measured copy bandwidth), from ``model_runner.measure_decode``."""
    from suffixmem.engine.torch.model_runner import measure_decode

    d = measure_decode(path, batch_sizes=(1, 4), steps=steps,
                       mem_bytes_per_s=copy_bytes_per_s)
    return {f"runner_{k}" if k.startswith(("decode_", "ratio_")) else k: v for k, v in d.items()
            if k != "threads"}


def _targets(engines: dict[str, dict[str, Any]], limits: dict[str, float]) -> dict[str, Any]:
    """The issues' targets for the torch engine, as measured ratios (medians)."""
    t, hf = engines.get("torch", {}), engines.get("transformers", {})
    if "prefill_s" not in t:
        return {}
    res: dict[str, Any] = {
        "warm_over_cold": t["warm_ttft_s"] / t["prefill_s"],
        "warm_ttft_at_most_1_20_of_cold": t["warm_ttft_s"] <= t["prefill_s"] / 20,
        "decode_over_bandwidth_limit": t["decode_ms_per_token"] / limits["bandwidth_limit_ms"],
        "decode_at_most_2x_bandwidth_limit": (
            t["decode_ms_per_token"] <= 2 * limits["bandwidth_limit_ms"]),
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
        repeats: int = typer.Option(3, min=3,
                                    help="Interleaved rounds (>= 3; median, min, max)."),
        threads: str = typer.Option("", help="Comma-separated thread counts "
                                    "(default: 1 and all cores)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Prefill, warm TTFT and decode speed of torch, transformers and vLLM, vs limits."""
        from rich.console import Console

        from suffixmem.stdio import quiet_stdout

        console = Console()

        names = [e.strip() for e in engines.split(",") if e.strip()]
        with quiet_stdout(as_json):
            counts = [int(t) for t in threads.split(",") if t.strip()] or None
            result = run_engines(prompt_tokens, decode_tokens, model, names, repeats, counts)
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
        table.add_row(name, f"{f['prefill_s']:.2f} s ({f['prefill_s_min']:.2f}-"
                      f"{f['prefill_s_max']:.2f})",
                      f"{f['warm_ttft_s'] * 1000:.0f} ms",
                      f"{f['decode_ms_per_token']:.1f} ms ({f['decode_ms_per_token_min']:.1f}-"
                      f"{f['decode_ms_per_token_max']:.1f})",
                      f"{100 * f['prefill_flops_fraction']:.0f}%",
                      f"{100 * f['decode_bandwidth_fraction']:.0f}%")
    console.print(table)
    console.print(f"limits: {lim['matmul_dtype']} matmul "
                  f"{lim['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s, "
                  f"copy {lim['copy_bytes_per_s'] / 1e9:.1f} GB/s, "
                  f"{int(lim['threads'])} threads; decode limit "
                  f"{lim['bandwidth_limit_ms']:.1f} ms/step")
    for t, r in lim.get("runner_by_threads", {}).items():
        console.print(f"  runner decode at {t} thread(s): batch 1 "
                      f"{r['runner_decode_ms_per_token_b1']:.1f} ms "
                      f"({r['runner_ratio_b1']:.2f}x the limit), batch 4 "
                      f"{r['runner_decode_ms_per_token_b4']:.1f} ms per step "
                      f"({r['runner_ratio_b4']:.2f}x)")
    console.print(f"median of {result['repeats']} interleaved rounds; load "
                  f"{result['load_avg']['before']} -> {result['load_avg']['after']}"
                  + ("; [red]NOISY: do not publish[/]" if result["noisy"] else ""))
    for key, value in result["targets"].items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        console.print(f"  {key}: {shown}")
