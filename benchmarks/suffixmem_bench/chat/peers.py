"""What users would run instead of suffixmem: each peer keeps a plain text history per session
and sends the whole of it every turn, rendered with the model's chat template.

Every configuration (here and in ``configs``) is a ``ChatConfig``:
``open(session, system_prompt)`` once per session, then ``turn(session, text) -> TurnOutcome``;
``turn`` is called from one thread per session in concurrent mode, so per-session state is kept
apart and engine access is serialized where the engine is not thread-safe (llama.cpp).

Timing contract (see ``metrics``): the clock starts before the history is rendered
and tokenized, since a user of the peer pays for that every turn too.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIB = 1 << 20


@dataclass(slots=True)
class TurnOutcome:
    """One turn as a configuration reports it. ``prompt_ids`` are the ids the model saw;
    ``reply_ids`` the generated ids without the end-of-turn token."""

    text: str
    prompt_ids: list[int]
    reply_ids: list[int]
    cached_tokens: int
    ttft_s: float
    latency_s: float
    engine_ttft_s: float | None = None
    manager_overhead_ms: float | None = None  # suffixmem configurations only
    dropped_turns: int | None = None  # exchanges the prompt dropped to fit (None: unknown)


@dataclass(slots=True)
class EngineOptions:
    """What every configuration is built with (the same for all, for a fair comparison)."""

    model: str
    max_model_len: int = 4096
    kv_cache_gib: float = 1.0
    max_tokens: int = 32
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    kv_tier: bool = False  # suffixmem configurations: keep evicted KV on disk
    state_dir: str | None = None  # survives a restart: the database and the KV tier
    exact_pool: bool = False  # cap vLLM's pool at kv_cache_gib (vLLM on CPU rounds to GiB)
    segment_method: str | None = None  # segment reuse's recompute method (None: the engine's)


class ChatConfig:
    """Base of every configuration; subclasses set ``name`` and implement the methods."""

    name = "base"

    def open(self, session: int, system_prompt: str) -> None:
        raise NotImplementedError

    def turn(self, session: int, text: str) -> TurnOutcome:
        raise NotImplementedError

    def set_system(self, session: int, system_prompt: str) -> None:
        """Replace ``session``'s system prompt before its next turn, keeping the history (the
        ``rag`` workload writes the retrieved passages into it every turn). Peers keep a text
        history (``self.chat``) and re-render it."""
        chat = getattr(self, "chat", None)
        if not isinstance(chat, TextHistory):
            raise NotImplementedError(f"{self.name} cannot change a session's system prompt")
        chat.set_system(session, system_prompt)

    def resume(self, session: int, system_prompt: str, turns: Sequence[tuple[str, str]]) -> None:
        """Continue ``session`` in a new process after ``turns`` (user, reply) pairs."""
        raise NotImplementedError

    def settle(self) -> None:
        """Finish work queued by the turns so far (``bench chat --lockstep`` calls it after
        each turn, on the configuration's clock); nothing for configurations that queue none."""

    def tier_stats(self) -> dict[str, Any]:
        """KV tier figures (``tier_hits``, ``tier_misses``, ``tier_bytes``, ``tier_load_ms``);
        empty when the configuration has no tier."""
        return {}

    def kv_memory(self) -> dict[str, float]:
        """``kv_pool_mb``: memory set aside for KV (allocated pool, or the largest transient
        cache); ``kv_held_mb``: KV kept for reuse at the end of the run. NaN when unknown."""
        return {"kv_pool_mb": float("nan"), "kv_held_mb": float("nan")}

    def close(self) -> None:
        """Release the engine."""


def vllm_pool_extra(options: EngineOptions, block_size: int = 32) -> dict[str, Any]:
    """vLLM options that make its pool hold ``kv_cache_gib`` exactly when ``exact_pool`` is
    set: on CPU ``VLLM_CPU_KVCACHE_SPACE`` takes whole GiB (at least 1), so the number of
    blocks is capped instead (``num_gpu_blocks_override``)."""
    if not options.exact_pool:
        return {}
    from suffixmem.models import resolve_model

    per_block = block_size * kv_bytes_per_token(resolve_model(options.model, progress=False))
    return {"extra": {"num_gpu_blocks_override": max(1, int(options.kv_cache_gib * (1 << 30))
                                                     // per_block)}}


def wrap_stream(engine: Any, before: Callable[[Any], None]) -> Callable[[], None]:
    """Make ``engine.stream(request)`` call ``before(request)`` first (outside the engine's
    timing: the harness notes what a request held or when it arrived). Returns the undo, which
    puts back whatever ``engine.stream`` was, an outer wrapper included: an engine shared by
    several configurations (``bench paired``) outlives each one's wrapper."""
    inner: Callable[[Any], Iterator[Any]] = engine.stream
    outer = engine.__dict__.get("stream")

    def stream(request: Any) -> Iterator[Any]:
        before(request)
        return inner(request)

    def undo() -> None:
        if outer is None:
            del engine.stream
        else:
            engine.stream = outer

    engine.stream = stream
    return undo


def kv_bytes_per_token(model_path: Path, dtype: str = "auto") -> int:
    """K and V of every layer for one token, from the model's config.json, in ``dtype``
    (``auto``: what ``EngineConfig`` resolves it to on this device; ``float16``: llama.cpp's
    default KV type)."""
    import json

    from suffixmem.config import resolve_dtype
    from suffixmem.engine.torch.kv_pool import torch_dtype

    dtype_bytes = torch_dtype(resolve_dtype(dtype)).itemsize
    cfg = json.loads((model_path / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * dtype_bytes


class TextHistory:
    """Per-session chat history as ``{"role", "content"}`` dicts, the way a framework keeps it.

    With ``budget`` (prompt tokens: the context window less the reply's ``max_tokens``) a prompt
    that would not fit drops the session's oldest exchanges, user and reply together, until it
    does: the sliding window frameworks apply (LangChain's ``trim_messages(strategy="last",
    include_system=True)``, LlamaIndex's ``ChatMemoryBuffer``). The window only moves forward.
    Without a budget nothing is dropped and an over-long prompt is the engine's error.
    """

    def __init__(self, tokenizer: Any, budget: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.budget = budget
        self.history: dict[int, list[dict[str, str]]] = {}
        self.start: dict[int, int] = {}  # session -> index of its first exchange kept
        self.dropped_turns = 0  # exchanges dropped by the window, all sessions
        self.last_dropped: dict[int, int] = {}  # session -> dropped by its last prompt_ids

    def open(self, session: int, system_prompt: str) -> None:
        self.history[session] = (
            [{"role": "system", "content": system_prompt}] if system_prompt else []
        )
        self.start[session] = 0

    def set_system(self, session: int, system_prompt: str) -> None:
        hist = self.history[session]
        rest = hist[1:] if hist and hist[0]["role"] == "system" else hist
        self.history[session] = [{"role": "system", "content": system_prompt}, *rest]

    def _head(self, session: int) -> int:
        """1 when the session's history starts with its system message (never dropped)."""
        hist = self.history[session]
        return 1 if hist and hist[0]["role"] == "system" else 0

    def _messages(self, session: int, text: str) -> list[dict[str, str]]:
        hist, head = self.history[session], self._head(session)
        kept = hist[head + 2 * self.start.get(session, 0):]
        return [*hist[:head], *kept, {"role": "user", "content": text}]

    def prompt_text(self, session: int, text: str) -> str:
        return self.tokenizer.apply_chat_template(
            self._messages(session, text), tokenize=False, add_generation_prompt=True
        )

    def prompt_ids(self, session: int, text: str) -> list[int]:
        self.last_dropped[session] = 0
        while True:
            ids = list(self.tokenizer(self.prompt_text(session, text),
                                      add_special_tokens=False)["input_ids"])
            exchanges = ((len(self.history[session]) - self._head(session)) // 2
                         - self.start.get(session, 0))
            if self.budget is None or len(ids) <= self.budget or exchanges <= 0:
                return ids
            self.start[session] = self.start.get(session, 0) + 1
            self.dropped_turns += 1
            self.last_dropped[session] += 1

    def append(self, session: int, user: str, reply: str) -> None:
        self.history[session] += [{"role": "user", "content": user},
                                  {"role": "assistant", "content": reply}]


def vllm_held_blocks(engine: Any) -> int | None:
    """Blocks holding a prefix-cache hash in an in-process vLLM engine (None if not found)."""
    core = getattr(getattr(engine, "_engine", None), "engine_core", None)
    core = getattr(core, "engine_core", core)
    manager = getattr(getattr(core, "scheduler", None), "kv_cache_manager", None)
    pool = getattr(manager, "block_pool", None) or getattr(
        getattr(manager, "coordinator", None), "block_pool", None)
    cached = getattr(pool, "cached_block_hash_to_block", None)
    return len(cached) if cached is not None else None


class VLLMHistory(ChatConfig):
    """vLLM with the whole text history rendered and sent every turn.

    ``naive``: prefix caching off, so every turn recomputes the whole prompt.
    ``vllm_direct``: prefix caching on, as vLLM's ``LLM.chat`` user gets it: the chat template
    renders the text history (assistant replies are re-tokenized from their text), and there is
    no per-session cache salt, so all sessions share one namespace (and the system prompt).
    ``vllm_direct_salted``: the same with one cache salt per session, the isolation suffixmem
    gives its sessions, so the two compare like for like.
    It runs on suffixmem's ``VLLMEngine`` driver so that the engine settings, the streaming path
    and the TTFT clock are the same as suffixmem_vllm's: the difference between the two is what
    the conversation manager adds or costs. ``engine``: run on that engine (``bench paired``
    shares one between this and a suffixmem configuration) instead of building one; it is
    then not closed here. The salt of a session is ``NAME-SESSION``: a new name, new salts.
    """

    def __init__(self, name: str, options: EngineOptions, *, prefix_caching: bool,
                 salted: bool = False, engine: Any = None) -> None:
        from suffixmem.engine import create_engine

        self.name = name
        self.salted = salted
        self.options = options
        self._owns_engine = engine is None
        self.engine = engine if engine is not None else create_engine(
            "vllm", model=options.model, max_model_len=options.max_model_len,
            kv_cache_gib=options.kv_cache_gib, enable_prefix_caching=prefix_caching,
            **vllm_pool_extra(options),
        )
        self.chat = TextHistory(self.engine.tokenizer,
                                 budget=options.max_model_len - options.max_tokens)
        self.prefix_caching = prefix_caching

    def open(self, session: int, system_prompt: str) -> None:
        self.chat.open(session, system_prompt)

    def resume(self, session: int, system_prompt: str, turns: Sequence[tuple[str, str]]) -> None:
        self.chat.open(session, system_prompt)
        for user, reply in turns:
            self.chat.append(session, user, reply)

    def turn(self, session: int, text: str) -> TurnOutcome:
        from suffixmem.engine.protocol import Request, Result, SamplingParams, TokenEvent

        t0 = time.perf_counter()
        ids = self.chat.prompt_ids(session, text)
        key = ("direct" if self.prefix_caching and not self.salted
               else f"{self.name}-{session}")
        request = Request(session_key=key, token_ids=ids,
                          sampling=SamplingParams(temperature=0.0,
                                                  max_tokens=self.options.max_tokens))
        ttft = 0.0
        result: Result | None = None
        for event in self.engine.stream(request):
            if isinstance(event, TokenEvent):
                if not ttft and event.token_id >= 0:
                    ttft = time.perf_counter() - t0
            else:
                result = event
        latency = time.perf_counter() - t0
        assert result is not None
        self.chat.append(session, text, result.text)
        return TurnOutcome(result.text, ids, list(result.token_ids), result.cached_tokens,
                           ttft or latency, latency, result.ttft_s,
                           dropped_turns=self.chat.last_dropped.get(session, 0))

    def kv_memory(self) -> dict[str, float]:
        stats = self.engine.stats()
        held = vllm_held_blocks(self.engine)
        per_token = kv_bytes_per_token(self.engine.model_path, self.engine.config.dtype)
        return {
            "kv_pool_mb": stats.kv_capacity_bytes / MIB,
            "kv_held_mb": float("nan") if held is None
            else held * self.engine.block_size * per_token / MIB,
        }

    def close(self) -> None:
        if self._owns_engine:
            self.engine.close()


class _FirstTokenClock:
    """A transformers streamer that notes when the first generated token arrives.

    ``generate`` calls ``put`` once with the prompt, then once per new token."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.calls = 0
        self.ttft: float | None = None

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2:
            self.ttft = time.perf_counter() - self.t0

    def end(self) -> None:
        pass


class TransformersGenerate(ChatConfig):
    """Plain ``model.generate`` over the full history every turn, bf16, greedy: what a
    ``HuggingFacePipeline`` user gets. No cache survives a turn."""

    name = "transformers"

    def __init__(self, options: EngineOptions) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from suffixmem.config import resolve_dtype
        from suffixmem.engine.torch.kv_pool import torch_dtype
        from suffixmem.models import resolve_model

        torch.set_num_threads(options.threads)
        self.options = options
        self.path = resolve_model(options.model, progress=False)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.path))
        # the engines' own dtype on this device (fp32 where bf16 is emulated), so the
        # peer is not slowed by a dtype the engines avoid
        self.dtype = resolve_dtype("auto")
        self.model = AutoModelForCausalLM.from_pretrained(str(self.path),
                                                          dtype=torch_dtype(self.dtype))
        self.model.eval()
        self.eos = self.tokenizer.eos_token_id
        self.chat = TextHistory(self.tokenizer,
                                 budget=options.max_model_len - options.max_tokens)
        self.per_token = kv_bytes_per_token(self.path, self.dtype)
        self.peak_tokens = 0
        self._lock = threading.Lock()

    def open(self, session: int, system_prompt: str) -> None:
        self.chat.open(session, system_prompt)

    def resume(self, session: int, system_prompt: str, turns: Sequence[tuple[str, str]]) -> None:
        self.chat.open(session, system_prompt)
        for user, reply in turns:
            self.chat.append(session, user, reply)

    def turn(self, session: int, text: str) -> TurnOutcome:
        import torch

        t0 = time.perf_counter()
        ids = self.chat.prompt_ids(session, text)
        clock = _FirstTokenClock(t0)
        with torch.inference_mode():
            out = self.model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=self.options.max_tokens, do_sample=False,
                eos_token_id=self.eos, pad_token_id=self.eos, streamer=clock,
            )
        reply = [int(t) for t in out[0, len(ids):]]
        if reply and reply[-1] == self.eos:
            reply = reply[:-1]
        reply_text = self.tokenizer.decode(reply, skip_special_tokens=True)
        latency = time.perf_counter() - t0
        with self._lock:
            self.peak_tokens = max(self.peak_tokens, len(ids) + len(reply) + 1)
        self.chat.append(session, text, reply_text)
        return TurnOutcome(reply_text, ids, reply, 0, clock.ttft or latency, latency,
                           dropped_turns=self.chat.last_dropped.get(session, 0))

    def kv_memory(self) -> dict[str, float]:
        # The DynamicCache lives for one generate call: report the largest one.
        return {"kv_pool_mb": self.peak_tokens * self.per_token / MIB, "kv_held_mb": 0.0}
