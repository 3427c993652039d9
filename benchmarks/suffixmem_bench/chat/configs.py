"""The suffixmem configurations, and the registry of every configuration the benchmark knows.

A suffixmem configuration is what a user runs: a ``ConversationManager`` over an engine, with a
temporary SQLite database, greedy sampling (``temperature=0.0`` overrides the semantic
temperature) and streaming through ``stream_chat``. The manager's topic detector is loaded
during start-up, as a long-running application would have it loaded before its first turn.
The prompt ids the engine saw are recorded by wrapping the engine's ``stream`` (outside the
timed path: the ids are copied, not re-rendered).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from suffixmem_bench.chat.llamacpp import LlamaCpp
from suffixmem_bench.chat.peers import (
    MIB,
    ChatConfig,
    EngineOptions,
    TransformersGenerate,
    TurnOutcome,
    VLLMHistory,
    kv_bytes_per_token,
    vllm_held_blocks,
    vllm_pool_extra,
    wrap_stream,
)

KEEP_DB_ENV = "SUFFIXMEM_BENCH_KEEP_DB"


def kept_database(folder: Path, name: str) -> Path:
    """A fresh database file for one round of ``name`` under ``--keep-db``: ``NAME.db``, then
    ``NAME-2.db``, ... (reusing one would continue the previous round's sessions, whose
    histories would make this round's prompts longer than its peers')."""
    path, n = folder / f"{name}.db", 1
    while path.exists():
        n += 1
        path = folder / f"{name}-{n}.db"
    return path


class SuffixmemChat(ChatConfig):
    """``ConversationManager`` + an engine (``vllm`` or ``torch``). ``segments`` builds the
    engine with its segment cache (``EngineConfig.segment_reuse``) and asks the manager for
    approximate reuse (``ManagerConfig(exact=False)``). ``shared_engine``: run on that engine
    (built with this configuration's flags by the caller; ``bench paired``) instead of building
    one; it is then not closed here. Sessions are ``PREFIX-i`` (``session_prefix``), so a new
    prefix gives new cache salts."""

    def __init__(self, name: str, engine: str, options: EngineOptions, *,
                 segments: bool = False, engine_flags: dict[str, Any] | None = None,
                 manager_flags: dict[str, Any] | None = None, shared_engine: Any = None,
                 session_prefix: str = "bench") -> None:
        from suffixmem.conversation.manager import ConversationManager
        from suffixmem.engine import create_engine

        self.name = name
        self.options = options
        flags: dict[str, Any] = {"segment_reuse": True} if segments else {}
        if segments and options.segment_method:
            flags["segment_method"] = options.segment_method
        flags.update(engine_flags or {})  # a workload's capability (isolation scope ...)
        if engine == "torch":  # it sets torch's thread count itself (vLLM reads OMP_NUM_THREADS)
            flags["extra"] = {"num_threads": options.threads}
        if engine == "vllm":
            flags.update(vllm_pool_extra(options))
        if options.kv_tier:
            flags["kv_tier"] = True
            if options.state_dir:
                flags["kv_tier_dir"] = str(Path(options.state_dir) / "kv")
        self._owns_engine = shared_engine is None
        self.session_prefix = session_prefix
        self.engine = shared_engine if shared_engine is not None else create_engine(
            engine, model=options.model, max_model_len=options.max_model_len,
            kv_cache_gib=options.kv_cache_gib, **flags)
        if segments and getattr(self.engine, "reuse", None) is None:
            raise ModuleNotFoundError(f"the {engine} engine did not install segment reuse",
                                      name="suffixmem.engine.reuse.hook")
        self._tmp = tempfile.TemporaryDirectory(prefix="suffixmem-bench-")
        # The database outlives this process with a state folder (the returning workload) or
        # with KEEP_DB_ENV (``bench chat --keep-db DIR``: the segment log that
        # ``bench retention --trace`` replays stays in DIR/<configuration>.db)
        keep = os.environ.get(KEEP_DB_ENV)
        folder = Path(options.state_dir or keep or self._tmp.name)
        folder.mkdir(parents=True, exist_ok=True)
        # the returning workload's state folder is reopened on purpose (its restart round)
        fresh = keep and not options.state_dir
        path = kept_database(folder, name) if fresh else folder / (name + ".db")
        url = f"sqlite:///{path}"
        mconfig = manager_config(segments)
        if manager_flags:
            from dataclasses import replace

            from suffixmem.conversation.manager import ManagerConfig

            mconfig = replace(mconfig or ManagerConfig(), **manager_flags)
        self.manager = ConversationManager(self.engine, database_url=url, config=mconfig)
        # The topic detector loads on first use: load it now, so start-up pays for it rather
        # than the first turn.
        self.manager.detector()
        # last: a configuration that failed to build leaves a shared engine's stream as it was
        self._recorded = threading.local()
        self._wrap_stream()
        self.sessions: dict[int, str] = {}
        # sessions whose system prompt the workload rewrites every turn (rag): the application
        # holds the message list, as a framework's chat engine does, and resends all of it
        self.systems: dict[int, str] = {}
        self.texts: dict[int, list[Any]] = {}

    def _wrap_stream(self) -> None:
        local = self._recorded
        engine = self.engine

        def record(request: Any) -> None:
            if request.token_ids is not None:
                local.prompt_ids = list(request.token_ids)
            else:
                local.prompt_ids = None
                local.messages = request.messages

        def recorded_ids() -> list[int]:
            ids = getattr(local, "prompt_ids", None)
            return ids if ids is not None else engine.render(local.messages)

        self._unwrap = wrap_stream(engine, record)
        self._recorded_ids = recorded_ids

    def open(self, session: int, system_prompt: str) -> None:
        info = self.manager.open_session(f"{self.session_prefix}-{session}",
                                         title=f"bench session {session}",
                                         system_prompt=system_prompt or None)
        self.sessions[session] = info.id

    def resume(self, session: int, system_prompt: str, turns: Any) -> None:
        # the database kept the history: reopening returns the stored session unchanged
        self.open(session, system_prompt)

    def set_system(self, session: int, system_prompt: str) -> None:
        self.systems[session] = system_prompt
        self.texts.setdefault(session, [])

    def settle(self) -> None:
        self.manager.flush()  # the commit and topic update queued behind the last turn

    def tier_stats(self) -> dict[str, Any]:
        tier = getattr(self.engine, "kv_tier", None)
        if tier is None:
            return {}
        return {"tier_hits": tier.stats.hits, "tier_misses": tier.stats.misses,
                "tier_bytes": tier.num_bytes, "tier_load_ms": list(tier.stats.load_ms or [])}

    def turn(self, session: int, text: str) -> TurnOutcome:
        t0 = time.perf_counter()
        ttft = 0.0
        final: Any = None
        if session in self.systems:  # the whole conversation, resent (rag)
            from suffixmem.engine.protocol import Message

            history = self.texts[session]
            sent = [Message("system", self.systems[session]), *history, Message("user", text)]
            events = self.manager.stream_complete(self.sessions[session], sent,
                                                  temperature=0.0,
                                                  max_tokens=self.options.max_tokens)
        else:
            events = self.manager.stream_chat(self.sessions[session], text, temperature=0.0,
                                              max_tokens=self.options.max_tokens)
        for event in events:
            if hasattr(event, "token_id"):
                if not ttft and event.token_id >= 0:
                    ttft = time.perf_counter() - t0
            else:
                final = event
        latency = time.perf_counter() - t0
        if final is None:
            raise RuntimeError("stream_chat ended without a TurnResult")
        if session in self.systems:
            from suffixmem.engine.protocol import Message

            self.texts[session] += [Message("user", text), Message("assistant", final.text)]
        result = final.result
        return TurnOutcome(final.text, self._recorded_ids(), list(result.token_ids),
                           final.cached_tokens, ttft or latency, latency, result.ttft_s,
                           final.manager_overhead_ms, dropped_turns=final.evicted_turns)

    def kv_memory(self) -> dict[str, float]:
        stats = self.engine.stats()
        held: float = float("nan")
        if self.engine.name == "vllm":
            blocks = vllm_held_blocks(self.engine)
            if blocks is not None:
                held = blocks * self.engine.block_size * kv_bytes_per_token(
                    self.engine.model_path, self.engine.config.dtype) / MIB
        elif stats.extra.get("kv_blocks") and "kv_blocks_cached" in stats.extra:
            # the torch engine: cached (reusable) blocks times the bytes of one block
            block_bytes = stats.kv_capacity_bytes / stats.extra["kv_blocks"]
            held = stats.extra["kv_blocks_cached"] * block_bytes / MIB
        return {"kv_pool_mb": stats.kv_capacity_bytes / MIB, "kv_held_mb": held}

    def close(self) -> None:
        try:
            self.manager.close()
        finally:
            if self._owns_engine:
                self.engine.close()
            else:  # the engine outlives this configuration
                self._unwrap()
            self._tmp.cleanup()


def manager_config(segments: bool) -> Any:
    """``ManagerConfig(exact=False)`` for segment reuse; ``None`` (the defaults) otherwise."""
    if not segments:
        return None
    from suffixmem.conversation.manager import ManagerConfig

    return ManagerConfig(exact=False)


# name -> (factory, what it is). Factories import their engine lazily; an ImportError while
# building one means "not built / not installed here" and the configuration is reported missing.
CONFIGS: dict[str, tuple[Callable[[EngineOptions], ChatConfig], str]] = {
    "naive": (lambda o: VLLMHistory("naive", o, prefix_caching=False),
              "vLLM, prefix caching off: the whole history recomputed every turn"),
    "suffixmem_vllm": (lambda o: SuffixmemChat("suffixmem_vllm", "vllm", o),
                       "ConversationManager + embedded vLLM (prefix caching, per-session salt)"),
    "suffixmem_torch": (lambda o: SuffixmemChat("suffixmem_torch", "torch", o),
                        "ConversationManager + suffixmem's torch engine (prefix reuse; context "
                        "shift when a session outgrows the window, passages and history "
                        "reused when a rewritten history carries passages: the defaults)"),
    "suffixmem_torch_segments": (
        lambda o: SuffixmemChat("suffixmem_torch_segments", "torch", o, segments=True),
        "ConversationManager + torch engine, prefix and segment reuse (exact=False)"),
    "llamacpp": (LlamaCpp, "llama-cpp-python on the Q4_1 GGUF with LlamaRAMCache"),
    "transformers": (TransformersGenerate,
                     "transformers generate over the full history, bf16 (no reuse)"),
    "vllm_direct": (lambda o: VLLMHistory("vllm_direct", o, prefix_caching=True),
                    "vLLM with prefix caching, text history re-rendered, no suffixmem "
                    "(one cache for all sessions)"),
    "vllm_direct_salted": (
        lambda o: VLLMHistory("vllm_direct_salted", o, prefix_caching=True, salted=True),
        "vLLM with prefix caching, one cache salt per session (suffixmem's isolation)"),
}
# Capabilities of issue 14's workloads (``suffixmem_bench.workloads``): run with
# ``--workload NAME``, not by default.
WORKLOAD_CONFIGS: dict[str, tuple[Callable[[EngineOptions], ChatConfig], str]] = {
    "suffixmem_torch_sliding": (
        lambda o: SuffixmemChat("suffixmem_torch_sliding", "torch", o,
                                manager_flags={"layout": "sliding", "context_shift": False,
                                               "rag_reuse": False}),
        "ConversationManager + torch engine, sliding-window layout, exact (what frameworks "
        "do)"),
    "suffixmem_torch_exact": (
        lambda o: SuffixmemChat("suffixmem_torch_exact", "torch", o,
                                engine_flags={"context_shift": False,
                                              "segment_reuse": False},
                                manager_flags={"context_shift": False, "rag_reuse": False}),
        "ConversationManager + torch engine, context shift off: the stable layout alone, "
        "every turn exact"),
    "suffixmem_torch_public_prefix": (
        lambda o: SuffixmemChat("suffixmem_torch_public_prefix", "torch", o,
                                engine_flags={"isolation": "public-prefix",
                                              "tenant": "bench"}),
        "ConversationManager + torch engine, isolation public-prefix (system prompt shared)"),
    "suffixmem_vllm_app": (
        lambda o: SuffixmemChat("suffixmem_vllm_app", "vllm", o,
                                engine_flags={"isolation": "app", "tenant": "bench"}),
        "ConversationManager + embedded vLLM, isolation app (one salt for the tenant)"),
}

BASELINES: tuple[str, ...] = ("vllm_direct", "vllm_direct_salted", "naive")
"""The references every configuration is compared with, strongest first (the headline)."""
DEFAULT_CONFIGS: tuple[str, ...] = tuple(CONFIGS)
CONFIGS.update(WORKLOAD_CONFIGS)


def build_config(name: str, options: EngineOptions) -> ChatConfig:
    """Build configuration ``name`` (raises ``ImportError`` when it cannot exist here)."""
    try:
        factory, _ = CONFIGS[name]
    except KeyError:
        raise ValueError(
            f"unknown configuration {name!r}; expected some of {list(CONFIGS)}") from None
    return factory(options)
