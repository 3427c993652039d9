"""``ManagerConfig`` (the manager's settings) and ``SessionInfo`` (a session as callers see it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from suffixmem.conversation.layout import LAYOUTS
from suffixmem.conversation.records import SessionRecord
from suffixmem.conversation.topic import TopicDetector
from suffixmem.conversation.validation import MAX_TEXT_CHARS
from suffixmem.engine.checks import MAX_TEMPERATURE
from suffixmem.errors import ConfigError
from suffixmem.retention import RetentionPolicy

DURABILITY = ("async", "sync")
"""When a turn is stored: just after its call returns, or before (``ManagerConfig``)."""


@dataclass(slots=True)
class ManagerConfig:
    """Settings of a ``ConversationManager``.

    - ``system_prompt``: default system prompt of new sessions (None: the model template's).
    - ``layout``: ``"stable"`` (cache-stable, the default) or ``"sliding"`` (baseline).
    - ``evict_fraction``: share of the budget freed at once when the prompt is too long.
    - ``context_window``: tokens the prompt plus reply may use (None: the engine's
      ``max_model_len``). The budget for the prompt is this minus ``reply_reserve``
      (None: the turn's ``max_tokens``).
    - ``max_tokens``: default reply length.
    - ``start_temperature`` / ``jump_temperature`` / ``temperature_recovery``: semantic
      temperature, hot while a topic holds, cold on a jump and a session's first turn, warming
      by ``temperature_recovery`` per on-topic turn. None (the default): relative to the
      model's own recommended sampling (``SemanticTemperature.for_model``; for the default
      model hot 0.2, cold greedy). An explicit per-call ``temperature=`` always wins.
    - ``topic_detector``: the detector (None: ``default_detector()``, fitted on the bundled
      corpus when available); ``detect_topics=False`` turns detection off (no
      jumps: the temperature warms from the first turn's cold to hot and stays there).
    - ``retention``: the segment retention policy of the segment log (None: ``PinnedLRU``,
      the same default as the engine's segment cache).
    - ``lock_timeout_s``: how long a turn waits for its session's lock (``SessionBusyError``).
    - ``max_message_chars``: size limit of each message / context block / system prompt.
    - ``exact``: False sends every turn approximately (the engine may reuse any marked segment,
      context blocks included, at new positions); True (default) only the classes below.
    - ``rag_reuse``: when the application rewrites the system prompt with this turn's retrieved
      passages under a kept history (LlamaIndex's ``CondensePlusContextChatEngine``; a
      ``complete`` call whose history was rewritten (not windowed) and whose system prompt
      has passages), the turn goes to the engine with ``exact=False``: the passages are marked
      (``layout.passage_segments``) and the history is found by context shift, both reused at
      their new positions (torch engine with ``segment_reuse``). None (default): on exactly
      where the engine's method passed ``bench segments``' gate on the rag workload's reuse
      events in the dtype it serves (``Engine.reuse_passes_gate("rag")``): the torch engine's
      default method does in fp32 (``k16-p0.2``), not in bf16 (``k16-q0.4`` passed on two
      hosts and missed on a third), where such turns stay exact; a method
      chosen for speed whose gate missed (``segment_method="k16"``) keeps such turns exact
      (docs/segment-reuse.md "Defaults"); never on the vLLM engine, which has no approximate
      reuse. True sends such turns approximate anyway, False keeps them exact.
    - ``context_shift``: when the layout (or, through ``complete``, the application's own
      sliding window) drops a session's old turns, the engine may reuse the kept turns' KV at
      their new positions (the torch engine's context shift; vLLM ignores it): turns go to the
      engine with ``exact=False`` and no document segments, so only context shift
      approximates. Default on: ``bench segments``' gate passes on the overflow workload's
      eviction turns (docs/segment-reuse.md). Turns that drop nothing reproduce the exact run;
      False keeps those turns exact.
    - ``durability``: ``"async"`` (default) stores a finished turn just after the call
      returns, on the background worker, which saves the caller the commit (~0.5 ms); this
      process's next read of the session waits for it, but a process killed within
      ``Background.delay_s`` (0.2 s) of a reply loses that turn. ``"sync"`` commits before the
      call returns, and is used whatever this says when other processes may write the session
      (PostgreSQL). As LangGraph's ``durability``; see ``write_behind``.
    """

    system_prompt: str | None = None
    layout: str = "stable"
    evict_fraction: float = 0.5
    context_window: int | None = None
    reply_reserve: int | None = None
    max_tokens: int = 256
    start_temperature: float | None = None
    jump_temperature: float | None = None
    temperature_recovery: float | None = None
    detect_topics: bool = True
    topic_detector: TopicDetector | None = None
    retention: RetentionPolicy | None = None
    lock_timeout_s: float = 60.0
    max_message_chars: int = MAX_TEXT_CHARS
    record_segments: bool = True
    exact: bool = True
    rag_reuse: bool | None = None
    context_shift: bool = True
    durability: str = "async"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from suffixmem.config import check_field_types

        check_field_types(self)
        if self.layout not in LAYOUTS:
            raise ConfigError(f"unknown layout {self.layout!r}; expected one of {list(LAYOUTS)}")
        if not 0.0 < self.evict_fraction < 1.0:
            raise ConfigError(f"evict_fraction must be in (0, 1), got {self.evict_fraction}")
        if self.context_window is not None and self.context_window < 32:
            raise ConfigError(f"context_window must be >= 32, got {self.context_window}")
        if self.reply_reserve is not None and self.reply_reserve < 1:
            raise ConfigError(f"reply_reserve must be >= 1, got {self.reply_reserve}")
        if not self.lock_timeout_s > 0:
            raise ConfigError(f"lock_timeout_s must be > 0, got {self.lock_timeout_s}")
        if self.max_message_chars < 1:
            raise ConfigError(f"max_message_chars must be >= 1, got {self.max_message_chars}")
        if self.durability not in DURABILITY:
            raise ConfigError(f"durability must be one of {list(DURABILITY)}, "
                              f"got {self.durability!r}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        self._check_temperatures()

    def _check_temperatures(self) -> None:
        """The semantic temperature's fields, each named (the model's own range fills the
        ones left None when the manager starts: ``temperature.scheme_for``)."""
        for name in ("start_temperature", "jump_temperature"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= MAX_TEMPERATURE:
                raise ConfigError(f"{name} must be in [0, {MAX_TEMPERATURE}], got {v}")
        if self.temperature_recovery is not None and not self.temperature_recovery > 0:
            raise ConfigError(f"temperature_recovery must be > 0, got "
                              f"{self.temperature_recovery}")
        start, jump = self.start_temperature, self.jump_temperature
        if start is not None and jump is not None and jump > start:
            raise ConfigError(f"jump_temperature ({jump}) must be <= start_temperature "
                              f"({start})")

    @staticmethod
    def default_database_url() -> str:
        """SQLite under ``SUFFIXMEM_HOME`` unless ``$SUFFIXMEM_DATABASE_URL`` is set."""
        from suffixmem.config import default_database_url

        return default_database_url()


@dataclass(slots=True, frozen=True)
class SessionInfo:
    id: str
    title: str | None
    model: str | None
    temperature: float
    state: str
    created_at: datetime
    updated_at: datetime
    message_count: int
    system_prompt: str | None
    temperature_hot: float | None = None  # the session's own range; None: the manager's
    temperature_cold: float | None = None

    @classmethod
    def from_record(cls, r: SessionRecord) -> SessionInfo:
        return cls(r.id, r.title, r.model, r.temperature, r.state, r.created_at, r.updated_at,
                   r.message_count, r.system_prompt, r.temperature_hot, r.temperature_cold)
