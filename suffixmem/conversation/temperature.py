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
- per session: a session may carry its own ``(hot, cold)``; ``scheme.with_range(hot, cold)``
- per call: an explicit ``temperature=`` wins over the semantic one (``effective_temperature``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from suffixmem.errors import ConfigError

# fallbacks for a model that recommends nothing (transformers' own default is 1.0, which small
# models cannot afford): the old design's range, kept for compatibility
START_TEMPERATURE = 0.8
JUMP_TEMPERATURE = 0.3
COLD_RATIO = 0.0  # cold = hot * COLD_RATIO: greedy, see the module docstring
RECOVERY_TURNS = 4  # on-topic turns to warm from cold back to hot
MAX_TEMPERATURE = 5.0


@dataclass(slots=True, frozen=True)
class SemanticTemperature:
    """``start`` (hot) while a topic holds, ``jump`` (cold) on a jump and on a session's first
    turn, then ``+recovery`` per on-topic turn back up to ``start``. Temperatures in [0, 5]."""

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
        """This scheme with a session's own hot/cold temperatures (None keeps the current)."""
        return replace(self, start=self.start if hot is None else float(hot),
                       jump=self.jump if cold is None else float(cold))

    def initial(self) -> float:
        """A new session's temperature: cold (its first turn opens a topic)."""
        return self.jump

    def next(self, current: float, jumped: bool) -> float:
        """The temperature for this turn, given the session's current one."""
        if jumped:
            return self.jump
        return round(min(self.start, max(self.jump, current + self.recovery)), 6)


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
    return SemanticTemperature(
        base.start if start is None else start,
        base.jump if jump is None else jump,
        base.recovery if recovery is None else recovery,
    )
