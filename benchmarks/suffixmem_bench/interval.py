"""Prediction intervals: where a rerun's figure lands, from how runs of this host differ.

Issue 10's last rule asks that no published figure differ from a rerun of its command by more
than its reported spread. The rounds' [min, max] of a pooled report (``bench pool``) describe
the runs behind it, not the next one: on a host whose speed drifts 10-20% from day to day, a
pool of 3 runs taken on one or two days leaves a rerun from another day outside it for about a
third of absolute times (``bench table --held-out`` measured 191 of 313 inside).

A figure's **prediction interval** is where its next run's median lands with probability
``LEVEL`` (99%), under a log-normal model of run-to-run variation: ``exp(mean ± t · σ ·
sqrt(1 + 1/n))`` over the log of its ``n`` runs' medians, ``t`` the Student quantile at the
pooled degrees of freedom. One figure has 3-6 runs, too few to estimate its own σ, so σ is
pooled across the figures of one **kind** over every row of the README (``kind``): one host's
drift moves every absolute time alike, and its effect on a ratio depends on whether both arms
ran in one process (``paired``) or in alternating processes (``ratio``). The interval quoted is
the union of the prediction interval and the rounds' [min, max], so it never hides a round.

A figure of kind ``other`` (a count, a hit share, a quality score), whose runs all agree, or
that is not positive keeps its rounds' range: the model is for timings and their ratios.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from suffixmem_bench.compare import Figure

LEVEL = 0.99


@dataclass(frozen=True)
class Drift:
    """The pooled run-to-run spread of one kind of figure: ``sigma`` of the log of a run's
    median around its figure's mean, over ``dof`` degrees of freedom (runs minus one, summed
    over figures)."""

    sigma: float
    dof: int


def kind(name: str) -> str:
    """The class of figure ``name`` whose run-to-run spread is pooled: ``paired`` (a ratio of
    two arms on one engine, turn by turn: ``same_engine...round_ratio...``), ``ratio`` (arms
    in separate processes: ``..._vs_...``, ``...ratio``, ``...speedup...``, ``..._over_...``),
    ``throughput`` (``...tok_s``), ``time`` (``ttft...``, ``..._ms...``, ``..._s``) or
    ``other``."""
    leaf = name.rsplit(".", 1)[-1]
    if "round_ratio" in name or name.startswith("same_engine."):
        return "paired"
    if any(s in leaf for s in ("_vs_", "ratio", "speedup", "_over_")):
        return "ratio"
    if leaf.endswith("tok_s"):
        return "throughput"
    if "ttft" in leaf or "_ms" in leaf or leaf.endswith("_s"):
        return "time"
    return "other"


def drift(rows: Iterable[Mapping[str, Sequence[float]]]) -> dict[str, Drift]:
    """The pooled ``Drift`` of each kind over ``rows`` (one per benchmark: figure name -> its
    runs' medians). Figures of kind ``other``, with fewer than 2 runs or with a value <= 0 add
    nothing; a kind with no degrees of freedom is left out, so its figures keep their range."""
    squares: dict[str, float] = {}
    dof: dict[str, int] = {}
    for row in rows:
        for name, values in row.items():
            if len(values) < 2 or min(values) <= 0:
                continue
            k = kind(name)
            if k == "other":  # counts and shares: not timings, the model does not apply
                continue
            logs = [math.log(v) for v in values]
            mean = sum(logs) / len(logs)
            squares[k] = squares.get(k, 0.0) + sum((x - mean) ** 2 for x in logs)
            dof[k] = dof.get(k, 0) + len(logs) - 1
    return {k: Drift(math.sqrt(squares[k] / dof[k]), dof[k]) for k in sorted(squares) if dof[k]}


def predict(values: Sequence[float], spread: Drift, level: float = LEVEL) -> tuple[float, float]:
    """The ``level`` prediction interval of the next run's median given the runs' ``values``
    (all > 0) and their kind's pooled ``spread``."""
    from scipy.stats import t  # scikit-learn's dependency; imported only here

    logs = [math.log(v) for v in values]
    mean = sum(logs) / len(logs)
    half = float(t.ppf(0.5 + level / 2, spread.dof)) * spread.sigma * math.sqrt(1 + 1 / len(logs))
    return math.exp(mean - half), math.exp(mean + half)


def widen(figure: Figure, name: str, values: Sequence[float], drifts: Mapping[str, Drift],
          level: float = LEVEL) -> Figure:
    """``figure`` (median, min, max over the rounds) with its range joined to the prediction
    interval of ``name``'s next run from the runs' ``values`` (module docstring); unchanged when
    the runs agree, a value is not positive, or the kind has no pooled spread."""
    spread = drifts.get(kind(name))
    if spread is None or len(set(values)) < 2 or min(values) <= 0:
        return figure
    lo, hi = predict(values, spread, level)
    median, low, high = figure
    return median, min(low, lo), max(high, hi)
