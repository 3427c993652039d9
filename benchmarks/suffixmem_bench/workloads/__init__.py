"""Pinned chat workloads of issue 14 for ``suffixmem bench chat --workload NAME``.

Each module (``overflow``, ``rag``, ``shared``) exposes:

- ``ENGINE_OPTIONS``: ``EngineOptions`` fields the workload pins (``max_model_len`` ...);
- ``build(count, **overrides) -> Workload``: the deterministic workload (``overrides`` replace
  the pinned sizes, for small runs);
- ``targets(configs) -> dict``: the issue's targets over the report's configurations.

A target ``passed`` when *some* suffixmem configuration (the capability) meets it. The
configurations, with the engine and manager flags that turn each capability on or off, are
``suffixmem_bench.chat.configs``' (``CONFIGS``, ``WORKLOAD_CONFIGS``): one table for every
workload.

``get(name)`` returns the module. The chat harness (``suffixmem_bench.chat``) looks workloads up
here; nothing here imports an engine.
"""

from __future__ import annotations

import importlib
import math
import statistics
from collections.abc import Callable
from types import ModuleType
from typing import Any

WORKLOADS: tuple[str, ...] = ("overflow", "rag", "shared")


def get(name: str) -> ModuleType:
    """The workload module called ``name`` (``ValueError`` naming the choices otherwise)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; expected one of {list(WORKLOADS)}")
    return importlib.import_module(f"suffixmem_bench.workloads.{name}")


def ttft_vs_direct(configs: dict[str, dict[str, Any]], name: str, rule: str,
                   key: Callable[[dict[str, Any]], float], factor: float) -> dict[str, Any]:
    """Target ``name``: every suffixmem configuration's ``key(figures)`` <= ``factor`` times
    vllm_direct's. ``passed`` is None when vllm_direct (or a figure) is missing."""
    ok = {k: v for k, v in configs.items() if v.get("status") == "ok"}
    direct = ok.get("vllm_direct")
    results: dict[str, Any] = {}
    for cfg, fig in ok.items():
        if not cfg.startswith("suffixmem"):
            continue
        if direct is None:
            results[cfg] = {"passed": None, "why": "vllm_direct did not run"}
            continue
        value, limit = key(fig), factor * key(direct)
        passed = value <= limit if math.isfinite(value) and math.isfinite(limit) else None
        results[cfg] = {"value": value, "limit": limit, "passed": passed}
    verdicts = [r["passed"] for r in results.values()]
    return {name: {"rule": rule, "configs": results,
                   "passed": None if not verdicts or None in verdicts else any(verdicts)}}


def from_turn(figures: dict[str, Any], first: int) -> float:
    """Median over turns >= ``first`` of the per-turn p50 TTFT (``by_turn``)."""
    rows = figures.get("by_turn") or {}
    vals = [v for t, v in zip(rows.get("turn", []), rows.get("ttft_p50_s", []), strict=False)
            if t >= first]
    return statistics.median(vals) if vals else float("nan")
