"""Pinned chat workloads of issue 14 for ``suffixmem bench chat --workload NAME``.

Each module (``overflow``, ``rag``, ``shared``) exposes:

- ``ENGINE_OPTIONS``: ``EngineOptions`` fields the workload pins (``max_model_len`` ...);
- ``CAPABILITY``: per configuration name, the extra engine flags (``EngineConfig`` fields) and
  manager flags (``ManagerConfig`` fields) that turn on the capability the workload measures;
- ``build(count, **overrides) -> Workload``: the deterministic workload (``overrides`` replace
  the pinned sizes, for small runs).

``get(name)`` returns the module. The chat harness (``suffixmem_bench.chat``) looks workloads up
here; nothing here imports an engine.
"""

from __future__ import annotations

import importlib
from types import ModuleType

WORKLOADS: tuple[str, ...] = ("overflow", "rag", "shared")


def get(name: str) -> ModuleType:
    """The workload module called ``name`` (``ValueError`` naming the choices otherwise)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; expected one of {list(WORKLOADS)}")
    return importlib.import_module(f"suffixmem_bench.workloads.{name}")
