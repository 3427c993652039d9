"""``suffixmem bench layout``: prefix-cache hit rate of the cache-stable layout against a
per-message sliding window, measured on the real embedded vLLM engine.

One 40-turn session (questions from chatterbot-corpus, greedy replies of up to ``max_tokens``)
runs twice through ``ConversationManager`` on the same engine, under a context window small
enough that the history must be evicted: once with ``CacheStableLayout`` (chunked eviction) and
once with ``SlidingWindowLayout`` (LlamaIndex ``ChatMemoryBuffer``'s policy). The hit rate is
vLLM's own count: the sum over turns of ``cached_tokens`` (prefix-cache hits reported by the
engine, ``RequestOutput.num_cached_tokens``) over the sum of ``prompt_tokens``.

Beside the hit rate, for both layouts (issue 10 item 4): ``tokens_computed`` (prompt tokens the
engine had to compute: prompt minus cached, summed over turns) and the turns of history kept in
the prompt (earlier user/assistant turns actually rendered; mean over turns and at the end),
counted from the prompt token ids the engine received (``<|im_start|>`` markers beyond those of
a first turn, two per kept turn). A layout that hits more by keeping less history is visible.
"""

from __future__ import annotations

import json
import random
import tempfile
import uuid
from pathlib import Path
from typing import Any

SYSTEM_PROMPT = (
    "You are a friendly and knowledgeable assistant. Answer the user's questions clearly and "
    "briefly, in plain English. When a question is ambiguous, say what you assume. When you do "
    "not know something, say so instead of guessing. Keep a warm, patient tone, avoid jargon "
    "unless the user uses it first, and never invent facts, names, dates or numbers."
)


def session_questions(turns: int, seed: int = 0) -> list[str]:
    """``turns`` user questions from chatterbot-corpus (English), in a fixed random order."""
    from suffixmem.conversation.topic_corpus import load_topics

    qs = sorted({p[0] for convs in load_topics("english").values() for conv in convs
                 for p in conv if 12 <= len(p[0]) <= 120})
    random.Random(seed).shuffle(qs)
    return qs[:turns]


def _marker_id(engine: Any) -> int:
    """The id of the chat template's message-start token (ChatML ``<|im_start|>``)."""
    from transformers import AutoTokenizer

    from suffixmem.models import resolve_model

    tok = AutoTokenizer.from_pretrained(str(resolve_model(engine.model_name, progress=False)))
    marker = tok.convert_tokens_to_ids("<|im_start|>")
    if not isinstance(marker, int) or marker == tok.unk_token_id:
        raise ValueError(f"{engine.model_name}: no <|im_start|> token to count turns by")
    return marker


class _PromptSpy:
    """Wraps ``engine.stream`` to keep the last prompt's token ids (outside any timing)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.inner = engine.stream
        self.last: list[int] = []

    def __enter__(self) -> _PromptSpy:
        def stream(request: Any) -> Any:
            self.last = list(request.token_ids if request.token_ids is not None
                             else self.engine.render(request.messages))
            return self.inner(request)

        self.engine.stream = stream
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.stream = self.inner


def run_session(engine: Any, layout: str, questions: list[str], context_window: int,
                max_tokens: int, evict_fraction: float, database_url: str) -> dict[str, Any]:
    """One session through the manager; the per-turn engine figures, summed."""
    from suffixmem.conversation.manager import ConversationManager, ManagerConfig

    marker = _marker_id(engine)

    cfg = ManagerConfig(
        system_prompt=SYSTEM_PROMPT, layout=layout, evict_fraction=evict_fraction,
        context_window=context_window, max_tokens=max_tokens, detect_topics=False,
        record_segments=False,
    )
    with ConversationManager(engine, database_url, cfg) as mgr, _PromptSpy(engine) as spy:
        sid = mgr.open_session(f"bench-{layout}-{uuid.uuid4().hex[:8]}").id
        prompt = cached = evictions = 0
        per_turn = []
        kept: list[int] = []
        base = 0
        for i, q in enumerate(questions):
            t = mgr.chat(sid, q, temperature=0.0, max_tokens=max_tokens)
            prompt += t.prompt_tokens
            cached += t.cached_tokens
            evictions += int(t.evicted_turns > 0)
            markers = spy.last.count(marker)
            base = base or markers  # the first turn has no history
            kept.append((markers - base) // 2)
            assert kept[-1] <= i, "more turns in the prompt than the session has had"
            per_turn.append((t.prompt_tokens, t.cached_tokens, t.evicted_turns, kept[-1]))
    return {"hit_rate": cached / prompt if prompt else 0.0, "prompt_tokens": prompt,
            "cached_tokens": cached, "tokens_computed": prompt - cached,
            "evictions": evictions, "turns_kept_mean": sum(kept) / len(kept) if kept else 0.0,
            "turns_kept_final": kept[-1] if kept else 0, "per_turn": per_turn}


def run_layout(turns: int = 40, context_window: int = 2048, max_tokens: int = 64,
               evict_fraction: float = 0.5, seed: int = 0, engine: Any = None
               ) -> dict[str, Any]:
    """Both layouts on one engine (created here unless given); returns both hit rates."""
    own = engine is None
    if own:
        from suffixmem.engine import create_engine

        engine = create_engine("vllm", max_model_len=max(context_window, 1024),
                               kv_cache_gib=1.0)
    questions = session_questions(turns, seed)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'bench.db'}"
            stable = run_session(engine, "stable", questions, context_window, max_tokens,
                                 evict_fraction, url)
            sliding = run_session(engine, "sliding", questions, context_window, max_tokens,
                                  evict_fraction, url)
    finally:
        if own:
            engine.close()
    return {
        "suffixmem_hit_rate": stable["hit_rate"],
        "sliding_window_hit_rate": sliding["hit_rate"],
        "turns": len(questions),
        "context_window": context_window,
        "max_tokens": max_tokens,
        "evict_fraction": evict_fraction,
        "suffixmem_evictions": stable["evictions"],
        "sliding_window_evictions": sliding["evictions"],
        "suffixmem_prompt_tokens": stable["prompt_tokens"],
        "sliding_window_prompt_tokens": sliding["prompt_tokens"],
        "layouts": {name: {k: v for k, v in r.items() if k != "per_turn"}
                    for name, r in (("stable", stable), ("sliding", sliding))},
        "engine": getattr(engine, "name", "?"),
    }


def register(bench: Any) -> None:
    import typer

    @bench.command("layout")
    def layout_cmd(
        turns: int = typer.Option(40, help="turns in the session"),
        context_window: int = typer.Option(2048, help="tokens for prompt + reply"),
        max_tokens: int = typer.Option(64, help="reply length (also the reply reserve)"),
        evict_fraction: float = typer.Option(0.5, help="share of the budget evicted at once"),
        seed: int = typer.Option(0, help="order of the questions"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """Cache hit rate: cache-stable layout vs a per-message sliding window (vLLM)."""
        from suffixmem.stdio import quiet_stdout
        from suffixmem_bench.measure import RunContext

        with quiet_stdout(as_json), RunContext() as ctx:
            result = run_layout(turns, context_window, max_tokens, evict_fraction, seed)
        result.update(ctx.fields())
        if as_json:
            print(json.dumps(result))
            return
        from rich.console import Console

        c = Console()
        c.print(f"{result['turns']} turns, context window {context_window}, "
                f"replies <= {max_tokens} tokens")
        c.print(f"cache-stable layout: hit rate {result['suffixmem_hit_rate']:.3f} "
                f"({result['suffixmem_evictions']} evictions)")
        c.print(f"sliding window:      hit rate {result['sliding_window_hit_rate']:.3f} "
                f"({result['sliding_window_evictions']} evictions)")
        for name, r in result["layouts"].items():
            c.print(f"{name}: {r['tokens_computed']} tokens computed, "
                    f"{r['turns_kept_mean']:.1f} turns of history kept on average "
                    f"({r['turns_kept_final']} at the end)")
