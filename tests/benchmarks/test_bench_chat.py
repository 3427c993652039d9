"""End to end: ``suffixmem bench chat`` on a tiny workload writes valid JSON, markdown and PNGs,
and a configuration that cannot exist here is reported missing, not measured."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from suffixmem_bench.chat.peers import EngineOptions
from suffixmem_bench.chat.run import register, run_one
from suffixmem_bench.chat.workload import Workload

KEYS = ("ttft_p50_s", "ttft_p50_from_turn8_s", "ttft_p99_s", "latency_p50_s", "latency_p99_s",
        "output_tok_s", "prompt_tok_s", "hit_rate", "hit_ceiling", "peak_rss_mb")


def _app() -> typer.Typer:
    bench = typer.Typer()
    register(bench)

    @bench.command("noop")  # a second command keeps typer from collapsing the group
    def noop() -> None:
        pass

    return bench


@pytest.mark.slow
@pytest.mark.vllm
def test_tiny_run_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), [
        "chat", "--configs", "naive,transformers", "--sessions", "1", "--turns", "2",
        "--max-tokens", "4", "--system-tokens", "40", "--out", str(tmp_path), "--json",
        "--repeats", "3",
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report) >= {"configs", "targets", "machine", "workload"}
    machine = report["machine"]  # the host and the library versions, both
    assert machine["l3"] and machine["cores"] >= 1 and machine["platform"]
    assert machine["versions"]["torch"]
    assert report["workload"]["sessions"] == 1 and report["workload"]["turns"] == 2
    assert report["workload"]["repeats"] == 3 and report["baselines"] == ["naive"]
    assert isinstance(report["noisy"], bool) and report["commit"]
    assert report["matmul_gflops"]["before"] > 0 and len(report["load_avg"]["after"]) == 3
    for name in ("naive", "transformers"):
        fig = report["configs"][name]
        assert fig["status"] == "ok", fig
        assert fig["turns"] == 2
        for key in KEYS:
            assert key in fig
        assert fig["ttft_p50_from_turn8_s"] is None  # no turn 8 in a 2-turn run
        assert 0 < fig["ttft_p50_s"] <= fig["latency_p50_s"]
        assert fig["output_tokens"] >= 2 and fig["peak_rss_mb"] > 100
        # turn 2 repeats turn 1's prompt and reply: the ceiling is positive, and neither
        # configuration reuses anything (naive has prefix caching off)
        assert 0 < fig["hit_ceiling"] < 1
        assert fig["hit_rate"] == 0
        assert fig["hit_ceiling"] <= fig["hit_ceiling_cross_session"] < 1
        assert fig["manager_overhead_ms_p50"] is None  # no manager in these configurations
        assert fig["repeats"] == 3 and len(fig["runs"]["ttft_p50_s"]) == 3
        lo, hi = fig["spread"]["ttft_p50_s"]
        assert lo <= fig["ttft_p50_s"] <= hi
    assert report["configs"]["naive"]["ttft_p50_vs_naive"] == 1.0
    ratio = report["configs"]["transformers"]["latency_p50_vs_naive"]
    assert math.isclose(ratio, report["configs"]["transformers"]["latency_p50_s"]
                        / report["configs"]["naive"]["latency_p50_s"])

    folder = tmp_path / "default"
    assert json.loads((folder / "report.json").read_text()) == report
    md = (folder / "report.md").read_text()
    assert "| naive |" in md and "| transformers |" in md
    assert md.count("Machine:") == 1 and f"(L3 {machine['l3']}, {machine['isa']})" in md
    assert f"dtype {machine['dtype']}" in md
    turns = [json.loads(line) for line in (folder / "turns.jsonl").read_text().splitlines()]
    # alternating processes: every configuration once per round
    assert [(t["repeat"], t["config"], t["turn"]) for t in turns] == [
        (r, c, n) for r in range(3) for c in ("naive", "transformers") for n in (1, 2)]
    first, second = turns[0], turns[1]
    assert first["seen_tokens"] == 0
    assert 0 < second["seen_tokens"] <= first["prompt_tokens"] + first["output_tokens"]

    import matplotlib.image

    for name in ("ttft_by_turn.png", "hit_rate_by_turn.png"):
        data = (folder / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) < 200_000
        image = matplotlib.image.imread(folder / name)
        assert image.shape[0] == 400 and image.shape[1] == 700


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None,
                    reason="llama-cpp-python is installed here")
def test_absent_package_is_reported_missing(tmp_path: Path) -> None:
    workload = Workload(name="default", system_prompt="Be brief.", sessions=[["Hello"]],
                        max_tokens=4)
    from suffixmem.config import DEFAULT_MODEL

    figures, records = run_one("llamacpp", workload, EngineOptions(model=DEFAULT_MODEL),
                               timeout_s=300, log_dir=tmp_path)
    assert figures["status"] == "missing" and records == []
    assert "llama_cpp" in figures["reason"]


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is not installed (benchmarks[llamacpp])")
def test_llamacpp_peer_runs_and_reuses_its_cache(tmp_path: Path) -> None:
    workload = Workload(name="default", system_prompt="Be brief.",
                        sessions=[["Hello", "What is the capital of France?"]], max_tokens=8)
    from suffixmem.config import DEFAULT_MODEL

    figures, records = run_one("llamacpp", workload, EngineOptions(model=DEFAULT_MODEL),
                               timeout_s=300, log_dir=tmp_path)
    assert figures["status"] == "ok", figures
    assert [r.turn for r in records] == [1, 2]
    assert records[0].cached_tokens == 0 and records[1].cached_tokens > 0  # turn 1's prefix
    assert all(r.output_tokens > 0 and r.text for r in records)


def test_unknown_configuration_is_refused() -> None:
    result = CliRunner().invoke(_app(), ["chat", "--configs", "naive,gpt5"])
    assert result.exit_code != 0
    assert "gpt5" in result.output


def test_lockstep_refuses_the_returning_workload_before_any_engine_starts() -> None:
    result = CliRunner().invoke(_app(), ["chat", "--workload", "returning", "--lockstep"])
    assert result.exit_code == 2
    assert "--lockstep" in result.output and "Traceback" not in result.output


def test_too_few_repeats_is_a_usage_error_not_a_traceback() -> None:
    result = CliRunner().invoke(_app(), ["chat", "--configs", "naive", "--repeats", "1"])
    assert result.exit_code == 2  # click's usage error, before any engine starts
    assert "--repeats" in result.output and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_bad_segment_method_is_a_usage_error_naming_it() -> None:
    result = CliRunner().invoke(_app(), ["chat", "--configs", "suffixmem_torch_segments",
                                         "--segment-method", "q0.4"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "'q0.4'" in result.output


def test_the_segment_method_reaches_only_the_segment_reuse_engine() -> None:
    from suffixmem_bench.chat.configs import SuffixmemChat
    from suffixmem_bench.chat.peers import EngineOptions

    seen: list[dict[str, object]] = []

    class Stop(Exception):
        pass

    def fake_engine(name: str, **flags: object) -> None:
        seen.append(flags)
        raise Stop

    import suffixmem.engine as engines

    original = engines.create_engine
    engines.create_engine = fake_engine  # type: ignore[assignment]
    try:
        opts = EngineOptions(model="m", segment_method="k16-p0.2", threads=1)
        for segments in (True, False):
            with pytest.raises(Stop):
                SuffixmemChat("x", "torch", opts, segments=segments)
    finally:
        engines.create_engine = original
    assert seen[0]["segment_method"] == "k16-p0.2" and seen[0]["segment_reuse"] is True
    assert "segment_method" not in seen[1]


def test_keep_db_gives_every_round_a_fresh_database(tmp_path: Path) -> None:
    # one database reused across rounds continued the last round's sessions: longer prompts
    # than the peers' (found in a --keep-db run: 110k prompt tokens against vllm_direct's 60k)
    from suffixmem_bench.chat.configs import kept_database

    first = kept_database(tmp_path, "suffixmem_vllm")
    assert first.name == "suffixmem_vllm.db"
    first.touch()
    second = kept_database(tmp_path, "suffixmem_vllm")
    assert second.name == "suffixmem_vllm-2.db"
    second.touch()
    assert kept_database(tmp_path, "suffixmem_vllm").name == "suffixmem_vllm-3.db"
    assert kept_database(tmp_path, "suffixmem_torch").name == "suffixmem_torch.db"


def test_step_orders_are_seeded_permutations_that_vary() -> None:
    from suffixmem_bench.chat.child import step_order

    names = ["a", "b", "c", "d", "e", "f"]
    orders = [step_order(names, r, i) for r in range(3) for i in range(40)]
    assert all(sorted(o) == names for o in orders)
    assert orders == [step_order(names, r, i) for r in range(3) for i in range(40)]  # seeded
    assert {o[0] for o in orders} == set(names)  # everyone goes first some time
    # no configuration always follows the same one (a rotation of one order would)
    for name in names:
        before = {o[o.index(name) - 1] for o in orders if o.index(name) > 0}
        assert len(before) == len(names) - 1


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("mode", ["round_robin", "concurrent"])
def test_lockstep_round_steps_every_configuration_turn_by_turn(tmp_path: Path,
                                                               mode: str) -> None:
    from suffixmem.config import DEFAULT_MODEL
    from suffixmem_bench.chat.child import run_lockstep, step_order

    workload = Workload(name="default", system_prompt="You are brief.",
                        sessions=[["Hi there.", "Name a fruit."],
                                  ["Name a colour.", "Another one?"]],
                        max_tokens=4, mode=mode)
    events: list[tuple[str, str]] = []
    out = run_lockstep(("naive", "transformers"), workload,
                       EngineOptions(model=DEFAULT_MODEL, max_tokens=4, threads=2), rnd=1,
                       timeout_s=600, log_dir=tmp_path,
                       on_event=lambda name, event: events.append((name, event["event"])))
    # start-ups one after another, before any step
    assert [n for n, e in events if e == "started"] == ["naive", "transformers"]
    assert events.index(("transformers", "started")) < events.index(("naive", "turn"))
    steps = [(n, e) for n, e in events if e in ("turn", "ack")]
    # every step runs in both, in the order step_order gives round 1
    per_step = 2 if mode == "concurrent" else 1  # turns a step runs in one configuration
    order = [n for n, e in steps if e == "ack"]
    n_steps = 2 if mode == "concurrent" else 4
    assert order == [name for i in range(n_steps)
                     for name in step_order(["naive", "transformers"], 1, i)]
    for i, name in enumerate(order):  # a configuration's turns come right before its ack
        block = steps[i * (per_step + 1):(i + 1) * (per_step + 1)]
        assert block == [(name, "turn")] * per_step + [(name, "ack")]
    for name in ("naive", "transformers"):
        fig, records = out[name]
        assert fig["status"] == "ok", fig
        assert fig["turns"] == 4 and len(records) == 4
        # throughput is over the busy steps, which hold at least every turn's own latency
        # (sequential) or the longest turn of each wave (concurrent)
        assert fig["wall_s"] >= max(r.latency_s for r in records)
        assert fig["output_tok_s"] == pytest.approx(fig["output_tokens"] / fig["wall_s"])
