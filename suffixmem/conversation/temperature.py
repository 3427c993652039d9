"""Semantic temperature: a session's sampling temperature, driven by topic jumps, scaled to the
model's own recommended sampling.

The idea: right after the subject changes (and on a session's first turn, which opens a topic)
the model should stay close to what it knows, so it samples *cold*; while the topic holds it
warms up, turn by turn, to *hot*. Hot is the model's recommended temperature (from
``suffixmem.models`` or the model folder's ``generation_config.json``), never a fixed 0.8: a
135M model at 0.8 answers "What is the capital of France?" with an invented city in about a
third of samples. Cold is greedy (0.0) by default: measured on SmolLM2-135M-Instruct, even 0.05
starts with "L'Étoile ..." in 3 of 12 seeds (the first token is a near tie), while greedy
answers "The capital of France is Paris." in transformers and vLLM alike.

Who overrides what:
- per manager: ``SemanticTemperature.for_model(model, hot=..., cold_ratio=..., recovery_turns=...)``
- per session: a session may carry its own hot and/or cold temperature (stored in its row,
  ``sessions.temperature_hot/temperature_cold``, migration 0004; set with
  ``ConversationManager.set_temperature_range``); ``scheme.for_session(hot, cold)`` is the
  manager's scheme with them, warming up over as many on-topic turns as the manager's.
- per call: an explicit ``temperature=`` wins over the semantic one (``effective_temperature``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suffixmem.engine.checks import MAX_TEMPERATURE
from suffixmem.errors import ConfigError, InvalidRequestError

# fallbacks for a model that recommends nothing (transformers' own default is 1.0, which small
# models cannot afford): the old design's range, kept for compatibility
START_TEMPERATURE = 0.8
JUMP_TEMPERATURE = 0.3
COLD_RATIO = 0.0  # cold = hot * COLD_RATIO: greedy, see the module docstring
RECOVERY_TURNS = 4  # on-topic turns to warm from cold back to hot


@dataclass(slots=True, frozen=True)
class SemanticTemperature:
    """``start`` (hot) while a topic holds, ``jump`` (cold) on a jump and on a session's first
    turn, then ``+recovery`` per on-topic turn back up to ``start``. Temperatures in [0, 2]
    (``MAX_TEMPERATURE``, the sampling range)."""

    start: float = START_TEMPERATURE
    jump: float = JUMP_TEMPERATURE
    recovery: float = 0.1

    def __post_init__(self) -> None:
        for name in ("start", "jump", "recovery"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ConfigError(f"{name} temperature must be a number, got {v!r}")
        if not 0.0 <= self.jump <= self.start <= MAX_TEMPERATURE:
            raise ConfigError(
                f"need 0 <= jump temperature ({self.jump}) <= start temperature ({self.start})"
                f" <= {MAX_TEMPERATURE}")
        if self.recovery <= 0:
            raise ConfigError(f"recovery must be > 0, got {self.recovery}")

    @classmethod
    def for_model(cls, model: str | Path | None, *, hot: float | None = None,
                  cold_ratio: float = COLD_RATIO,
                  recovery_turns: int = RECOVERY_TURNS) -> SemanticTemperature:
        """The range for ``model`` (a registered name or a model folder): hot = ``hot`` or the
        model's recommended temperature, cold = hot * ``cold_ratio``."""
        if not 0.0 <= cold_ratio <= 1.0:
            raise ConfigError(f"cold_ratio must be in [0, 1], got {cold_ratio}")
        if recovery_turns < 1:
            raise ConfigError(f"recovery_turns must be >= 1, got {recovery_turns}")
        top = recommended_temperature(model) if hot is None else float(hot)
        return cls.with_turns(top, top * cold_ratio, recovery_turns)

    @classmethod
    def with_turns(cls, hot: float, cold: float, recovery_turns: int) -> SemanticTemperature:
        step = (hot - cold) / recovery_turns if hot > cold else 1.0
        return cls(round(hot, 6), round(cold, 6), round(step, 6))

    def with_range(self, hot: float | None = None, cold: float | None = None,
                   ) -> SemanticTemperature:
        """This scheme with a session's own hot/cold temperatures (None keeps this scheme's),
        warming from cold to hot over as many on-topic turns as this scheme does. A bad value
        raises ``InvalidRequestError`` naming ``temperature_hot`` or ``temperature_cold``."""
        h, c = check_range(self, hot, cold)
        if (h, c) == (self.start, self.jump):
            return self
        return self.with_turns(h, c, self.recovery_turns())

    def for_session(self, hot: float | None, cold: float | None) -> SemanticTemperature:
        """``with_range`` for values read back from a session row, which never fails a turn:
        a stored value the manager's current range makes inconsistent (a cold above a hot
        configured since) is clamped to it."""
        if hot is None and cold is None:
            return self
        h = min(MAX_TEMPERATURE, max(0.0, self.start if hot is None else float(hot)))
        c = min(h, max(0.0, self.jump if cold is None else float(cold)))
        return self.with_turns(h, c, self.recovery_turns())

    def recovery_turns(self) -> int:
        """On-topic turns to warm from cold back to hot."""
        if self.start <= self.jump:
            return RECOVERY_TURNS
        return max(1, round((self.start - self.jump) / self.recovery))

    def clamp(self, current: float) -> float:
        """``current`` moved into [cold, hot] (a session's temperature after its range moved)."""
        return round(min(self.start, max(self.jump, current)), 6)

    def initial(self) -> float:
        """A new session's temperature: cold (its first turn opens a topic)."""
        return self.jump

    def next(self, current: float, jumped: bool) -> float:
        """The temperature for this turn, given the session's current one."""
        if jumped:
            return self.jump
        return round(min(self.start, max(self.jump, current + self.recovery)), 6)


def check_range(scheme: SemanticTemperature, hot: float | None, cold: float | None,
                ) -> tuple[float, float]:
    """(hot, cold) for a session, None meaning ``scheme``'s own; ``InvalidRequestError``
    naming the field for a non-number, a value outside [0, 2] or a cold above the hot."""
    out = []
    for name, v, default in (("temperature_hot", hot, scheme.start),
                             ("temperature_cold", cold, scheme.jump)):
        if v is None:
            out.append(default)
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                0.0 <= v <= MAX_TEMPERATURE):
            raise InvalidRequestError(
                f"{name} must be a number in [0, {MAX_TEMPERATURE:g}], got {v!r}")
        out.append(float(v))
    h, c = out
    if c > h:
        raise InvalidRequestError(
            f"temperature_cold ({c:g}) must not be above temperature_hot ({h:g})")
    return h, c


def session_range(record: Any) -> tuple[float | None, float | None]:
    """(hot, cold) stored with a session record (``temperature_hot``/``temperature_cold``);
    (None, None) for no record: the manager's range."""
    if record is None:
        return None, None
    return (getattr(record, "temperature_hot", None), getattr(record, "temperature_cold", None))


def effective_temperature(semantic: float, requested: float | None) -> float:
    """The temperature a turn samples at: the caller's explicit one, else the semantic one."""
    return semantic if requested is None else requested


def recommended_temperature(model: str | Path | None) -> float:
    """The model's recommended sampling temperature: its registry entry
    (``suffixmem.models.MODELS``), else ``generation_config.json`` in its folder (greedy
    ``do_sample: false`` -> 0.0), else ``START_TEMPERATURE``."""
    from suffixmem.models import MODELS

    if model is None:
        from suffixmem.config import DEFAULT_MODEL

        model = DEFAULT_MODEL
    key = str(model)
    spec = MODELS.get(key) or next(
        (s for s in MODELS.values() if Path(key).name == s.name), None)
    if spec is not None and spec.temperature is not None:
        return spec.temperature
    gen = Path(key).expanduser() / "generation_config.json"
    if gen.is_file():
        try:
            cfg = json.loads(gen.read_text())
        except (OSError, json.JSONDecodeError):
            cfg = {}
        if cfg.get("do_sample") is False:
            return 0.0
        t = cfg.get("temperature")
        if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t <= MAX_TEMPERATURE:
            return float(t)
    return START_TEMPERATURE


def scheme_for(model: str | Path | None, start: float | None = None, jump: float | None = None,
               recovery: float | None = None) -> SemanticTemperature:
    """The manager's scheme: ``model``'s own range, with any of hot (``start``), cold (``jump``)
    and the per-turn ``recovery`` that the caller names instead."""
    base = SemanticTemperature.for_model(model)
    if jump is not None and start is None and jump > base.start:
        raise ConfigError(f"jump_temperature ({jump}) must be <= start_temperature, which is "
                          f"{base.start} for {model} (its recommended temperature); set "
                          "start_temperature too")
    if start is not None and jump is None and start < base.jump:
        raise ConfigError(f"start_temperature ({start}) must be >= jump_temperature, which is "
                          f"{base.jump} for {model}; set jump_temperature too")
    return SemanticTemperature(
        base.start if start is None else start,
        base.jump if jump is None else jump,
        base.recovery if recovery is None else recovery,
    )
