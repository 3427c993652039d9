"""``suffixmem bench ttft``: one ~1,500-token prompt, cold then warm, in one run."""

from __future__ import annotations

import json
import uuid
from typing import Any

import typer

from suffixmem.config import DEFAULT_MODEL
from suffixmem_bench.corpus import reference_text


def run_ttft(
    engine_name: str = "vllm", prompt_tokens: int = 1500, model: str = DEFAULT_MODEL,
    repeats: int = 3,
) -> dict[str, Any]:
    """Cold (nothing cached) and warm (same session, same prompt) time to first token.

    A short warm-up request runs first so that one-time start-up costs do not count as "cold".
    The warm figure is the median of ``repeats`` runs.
    """
    import statistics

    from suffixmem.engine import create_engine
    from suffixmem.engine.protocol import Message, Request, SamplingParams

    engine = create_engine(engine_name, model=model, max_model_len=4096)
    try:
        sampling = SamplingParams(max_tokens=1)
        engine.generate(Request("warmup", messages=[Message("user", "Hello")], sampling=sampling))
        doc = reference_text(prompt_tokens - 40, lambda t: len(engine.tokenize(t)))
        messages = [Message("user", f"{doc}\n\nSummarize the text above in one sentence.")]
        session = f"bench-ttft-{uuid.uuid4().hex[:8]}"
        cold = engine.generate(Request(session, messages=messages, sampling=sampling))
        warm = [engine.generate(Request(session, messages=messages, sampling=sampling))
                for _ in range(repeats)]
        warm_ttft = statistics.median(r.ttft_s for r in warm)
        return {
            "engine": engine_name,
            "prompt_tokens": cold.prompt_tokens,
            "cold_ttft_s": cold.ttft_s,
            "cold_cached_tokens": cold.cached_tokens,
            "warm_ttft_s": warm_ttft,
            "warm_cached_tokens": warm[-1].cached_tokens,
            "ratio": cold.ttft_s / warm_ttft if warm_ttft > 0 else float("inf"),
        }
    finally:
        engine.close()


def register(bench: typer.Typer) -> None:
    @bench.command("ttft")
    def ttft(
        engine: str = typer.Option("vllm", help="Engine: vllm or torch."),
        prompt_tokens: int = typer.Option(1500, help="Approximate prompt length in tokens."),
        model: str = typer.Option(DEFAULT_MODEL, help="Model name, .gguf file or folder."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Time to first token of one long prompt, cold then warm (cached)."""
        from rich.console import Console

        from suffixmem.stdio import quiet_stdout

        console = Console()

        from suffixmem_bench.measure import RunContext

        with quiet_stdout(as_json), RunContext() as ctx:
            result = run_ttft(engine, prompt_tokens, model)
        result.update(ctx.fields())
        if as_json:
            print(json.dumps(result))
            return
        console.print(
            f"[bold]{result['engine']}[/]: {result['prompt_tokens']} prompt tokens — cold "
            f"{result['cold_ttft_s'] * 1000:.0f} ms, warm {result['warm_ttft_s'] * 1000:.1f} ms "
            f"({result['warm_cached_tokens']} cached) → [bold]{result['ratio']:.1f}x[/]"
        )
