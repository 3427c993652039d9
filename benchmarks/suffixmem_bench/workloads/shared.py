"""``shared``: 16 sessions x 4 turns behind one ~1,500-token public system prompt (issue 14).

The system prompt is an application's instructions (the corpus bot profile) followed by tool
descriptions (standard-library function docstrings written as tools), the same for every
session. vLLM with one salt for everything (``vllm_direct``) shares it all; per-session salts
share nothing. Capability: the ``public-prefix`` isolation scope on the torch engine (the
system prompt's blocks shared by the tenant's sessions, history salted per session; exact), and
``app`` on vLLM.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

from suffixmem_bench.chat.workload import (
    Counter,
    Workload,
    _take,
    session_turns,
    system_prompt_text,
)

NAME = "shared"
PINNED: dict[str, int] = {"sessions": 16, "turns": 4, "max_tokens": 32, "system_tokens": 1500}
INSTRUCTION_TOKENS = 300
TOOL_MODULES: tuple[str, ...] = ("json", "shutil", "pathlib", "csv", "datetime", "statistics")
ENGINE_OPTIONS: dict[str, Any] = {"max_model_len": 4096}


def tool_descriptions() -> Iterator[str]:
    """One line per public function of ``TOOL_MODULES``: ``- tool module.name(signature): doc``."""
    import importlib

    yield "Tools you may call (reply with a JSON object {\"tool\": NAME, \"args\": {...}}):"
    for mod_name in TOOL_MODULES:
        mod = importlib.import_module(mod_name)
        for attr in sorted(getattr(mod, "__all__", []) or dir(mod)):
            fn = getattr(mod, attr, None)
            if attr.startswith("_") or not inspect.isfunction(fn):
                continue
            doc = " ".join((inspect.getdoc(fn) or "").split("\n\n")[0].split())
            try:
                # a default's repr may carry its address ("<function copy2 at 0x7f...>"),
                # which would change the prompt, and its token count, in every process
                sig = re.sub(r" at 0x[0-9a-fA-F]+", "", str(inspect.signature(fn)))
            except (TypeError, ValueError):
                sig = "(...)"
            if doc:
                yield f"- {mod_name}.{attr}{sig}: {doc}"


def build(count: Counter, **overrides: int) -> Workload:
    """The pinned workload (``overrides``: sessions, turns, max_tokens, system_tokens)."""
    sizes = {**PINNED, **overrides}
    instructions = system_prompt_text(min(INSTRUCTION_TOKENS, sizes["system_tokens"]), count)
    tools = _take(tool_descriptions(), max(1, sizes["system_tokens"] - count(instructions)),
                  count, "\n")
    prompt = instructions + "\n\n" + tools
    return Workload(
        name=NAME, system_prompt=prompt,
        sessions=[session_turns(i, sizes["turns"]) for i in range(sizes["sessions"])],
        max_tokens=sizes["max_tokens"], system_tokens=count(prompt),
    )


def targets(configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """TTFT p50 from turn 2 within 10% of vllm_direct's (which shares everything)."""
    from suffixmem_bench.workloads import from_turn, ttft_vs_direct

    return ttft_vs_direct(configs, "ttft_from_turn2_within_10pct_of_vllm_direct",
                          "median of per-turn p50 TTFT from turn 2 <= 1.1 x vllm_direct's",
                          lambda f: from_turn(f, 2), 1.1)
