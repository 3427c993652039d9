"""``overflow``: history outgrows a 2,048-token window (issue 14).

4 sessions x 30 turns of real chat (chatterbot-corpus), a ~300-token system prompt, replies of
at most 48 tokens, ``max_model_len`` 2048. Baselines: the sliding window frameworks use
(``ManagerConfig(layout="sliding")``, exact) and the stable layout alone (evict to half, every
turn exact: ``suffixmem_torch_exact``). Capability: context shift, the kept turns' KV reused at
their new positions on the torch engine when the stable layout drops old turns: the manager's
and the torch engine's default (``suffixmem_torch``).
"""

from __future__ import annotations

import math
from typing import Any

from suffixmem_bench.chat.workload import Counter, Workload, build_workload

NAME = "overflow"
PINNED: dict[str, int] = {"sessions": 4, "turns": 30, "max_tokens": 48, "system_tokens": 300}
ENGINE_OPTIONS: dict[str, Any] = {"max_model_len": 2048, "max_tokens": 48}


def build(count: Counter, **overrides: int) -> Workload:
    """The pinned workload (``overrides``: sessions, turns, max_tokens, system_tokens)."""
    sizes = {**PINNED, **overrides}
    workload = build_workload(count=count, **sizes)
    workload.name = NAME
    return workload


def targets(configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's target, TTFT p50 <= 1/3 of vllm_direct's (the quality gate is ``bench
    segments'``), and the same rule over the turns whose prompt dropped history
    (``ttft_p50_window_s``, each configuration over its own such turns). The second is ours, not
    the issue's: as pinned, a session's history outgrows the window only in its last turns, so
    the p50 over all turns is a warm prefix-cache hit for every configuration and cannot show
    what happens when the window moves."""
    from suffixmem_bench.workloads import ttft_vs_direct

    out = ttft_vs_direct(configs, "ttft_p50_le_third_of_vllm_direct",
                         "p50 TTFT <= 1/3 of vllm_direct's", lambda f: f["ttft_p50_s"], 1 / 3)
    out.update(ttft_vs_direct(
        configs, "window_turn_ttft_p50_le_third_of_vllm_direct",
        "p50 TTFT over the turns that dropped history <= 1/3 of vllm_direct's (ours)",
        lambda f: f.get("ttft_p50_window_s", math.nan), 1 / 3))
    return out
