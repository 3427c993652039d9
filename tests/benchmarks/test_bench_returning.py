"""The ``returning`` workload of ``bench chat`` (issue 13): its shape, its figures and targets,
and one tiny end-to-end run through the CLI with a restart in the middle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from suffixmem_bench.chat.metrics import TurnRecord
from suffixmem_bench.chat.returning import (
    build_returning_workload,
    returning_figures,
    returning_targets,
)
from suffixmem_bench.chat.run import register
from suffixmem_bench.chat.workload import schedule


def words(text: str) -> int:
    return len(text.split())


def test_sessions_have_their_own_prompts_and_interleave() -> None:
    w = build_returning_workload(count=words, sessions=5, turns=4, prompt_tokens=400,
                                 restart_after=2)
    assert w.name == "returning" and w.restart_after == 2
    assert len(set(w.system_prompts)) == 5 and w.system_prompt == ""
    firsts = {p.split("\n", 1)[0] for p in w.system_prompts}
    assert len(firsts) == 5  # no shared first block: nothing is shared across sessions
    assert all(280 <= words(p) <= 500 for p in w.system_prompts)  # about 400
    assert w.system_prompt_of(3) == w.system_prompts[3]
    order = schedule(w)
    assert order[:5] == [(s, 0) for s in range(5)]  # each session returns after the others
    with pytest.raises(ValueError, match="restart_after"):
        build_returning_workload(count=words, sessions=2, turns=3, restart_after=3)


def rec(turn: int, ttft: float) -> TurnRecord:
    return TurnRecord(session=0, turn=turn, prompt_tokens=10, cached_tokens=0, output_tokens=1,
                      seen_tokens=0, ttft_s=ttft, latency_s=ttft)


def test_figures_and_targets() -> None:
    records = [rec(1, 9.0), rec(2, 1.0), rec(3, 3.0), rec(4, 2.0)]
    f = returning_figures(records, 3, {"tier_hits": 3, "tier_misses": 1,
                                       "tier_load_ms": [1.0, 2.0, 4.0], "tier_bytes": 10})
    assert f == {"ttft_p50_returning_s": 2.0, "ttft_p50_after_restart_s": 2.0,
                 "tier_hit_rate": 0.75, "tier_load_ms_p50": 2.0, "tier_bytes": 10}
    ok = {"status": "ok"}
    t = returning_targets({
        "naive": {**ok, "ttft_p50_after_restart_s": 10.0},
        "vllm_direct": {**ok, "ttft_p50_returning_s": 5.0},
        "suffixmem_torch": {**ok, "ttft_p50_returning_s": 0.9, "ttft_p50_after_restart_s": 2.5},
    })
    assert t["returning_le_fifth_of_vllm_direct"]["passed"] is True
    assert t["after_restart_le_fifth_of_naive"]["passed"] is False
    assert returning_targets({"suffixmem_torch": {**ok}})[
        "returning_le_fifth_of_vllm_direct"]["passed"] is None


@pytest.mark.slow
def test_tiny_returning_run_restores_torch_sessions_after_the_restart(tmp_path: Path) -> None:
    bench = typer.Typer()
    register(bench)

    @bench.command("noop")
    def noop() -> None:
        pass

    result = CliRunner().invoke(bench, [
        "chat", "--workload", "returning", "--configs", "suffixmem_torch", "--sessions", "2",
        "--turns", "2", "--max-tokens", "4", "--max-model-len", "2048", "--kv-cache-gib",
        "0.1", "--out", str(tmp_path), "--json",
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])
    fig = report["configs"]["suffixmem_torch"]
    assert fig["status"] == "ok" and fig["turns"] == 4
    assert report["workload"]["restart_after"] == 1
    # round 2 runs in a new process: its prompts come back from the tier
    assert fig["tier_hit_rate"] > 0 and fig["tier_bytes"] > 0 and fig["hit_rate"] > 0.4
    assert (tmp_path / "returning" / "report.md").exists()


def test_returning_keeps_its_own_sizes_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned workload's sizes (24 x 6, 256 MiB, its four configs) apply when the options
    are left at `bench chat`'s defaults; only options given on the command line override."""
    import suffixmem_bench.chat.run as run_module
    from suffixmem_bench.chat.returning import CONFIGS, KV_CACHE_GIB

    seen: list[dict] = []

    def fake(**kw: object) -> tuple[dict, list]:
        seen.append(kw)
        raise typer.Exit(0)

    monkeypatch.setattr(run_module, "run_returning_chat", fake)
    bench = typer.Typer()
    register(bench)

    @bench.command("noop")
    def noop() -> None:
        pass

    assert CliRunner().invoke(bench, ["chat", "--workload", "returning"]).exit_code == 0
    assert CliRunner().invoke(bench, ["chat", "--workload", "returning", "--sessions", "3",
                                      "--kv-cache-gib", "0.5"]).exit_code == 0
    first, second = seen
    assert (first["sessions"], first["turns"], first["kv_cache_gib"]) == (24, 6, KV_CACHE_GIB)
    assert tuple(first["configs"]) == CONFIGS
    assert (second["sessions"], second["turns"], second["kv_cache_gib"]) == (3, 6, 0.5)
