"""``suffixmem bench segments``: prompt construction, metrics, default choice, registration, and
the quality harness on the real model."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import typer

from suffixmem_bench import segments as bench


@pytest.fixture(scope="module")
def encode(tokenizer):  # type: ignore[no-untyped-def]
    return lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_prompts_are_real_text_with_reused_segments_at_new_positions(encode) -> None:  # type: ignore[no-untyped-def]
    prompts = bench.build_prompts(encode, count=3, seed=1)
    assert len(prompts) == 3
    for p in prompts:
        assert len(p.segments) == len(p.fill_segments) == 2
        for (a, b), (fa, fb) in zip(p.segments, p.fill_segments, strict=True):
            assert p.ids[a:b] == p.fill_ids[fa:fb]  # the same tokens ...
        assert p.segments[0][0] != p.fill_segments[0][0]  # ... behind a different prefix
        assert p.ids[: p.segments[0][0]] != p.fill_ids[: p.fill_segments[0][0]]
        assert p.ids[p.segments[-1][1]:] != p.fill_ids[p.fill_segments[-1][1]:]  # question
        assert p.segment_share >= bench.GATE_SHARE
    # different seeds, different text
    other = bench.build_prompts(encode, count=1, seed=2)[0]
    assert other.ids != prompts[0].ids


def test_compare_metrics() -> None:
    ref = torch.tensor([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0]])
    assert bench._compare(ref, ref) == (0.0, 1.0, 1.0)
    got = ref.clone()
    got[2] = torch.tensor([0.0, 6.0, 5.0])  # step 2 disagrees
    kl, top1, free = bench._compare(ref, got)
    assert kl > 0 and top1 == 0.75 and free == 0.5


def row(k: int, r: float, kl: float, top1: float, speed: float) -> dict:
    return {"k": k, "r": r, "mean_kl": kl, "top1_agreement": top1, "ttft_speedup": speed}


def test_choose_defaults_takes_the_most_accurate_setting_with_speed_to_spare() -> None:
    grid = [row(0, 0.0, 0.2, 0.9, 4.0), row(4, 0.0, 0.04, 0.96, 3.0),
            row(16, 0.0, 0.01, 0.97, 2.5), row(16, 0.15, 0.01, 0.98, 2.1),
            row(32, 0.3, 0.01, 0.99, 1.5)]
    best, passed = bench.choose_defaults(grid)
    assert passed and (best["k"], best["r"]) == (16, 0.0)  # 2.1x passes but has no margin
    tight = [row(4, 0.0, 0.04, 0.96, 2.2), row(16, 0.15, 0.01, 0.98, 2.1)]
    best, passed = bench.choose_defaults(tight)
    assert passed and best["k"] == 4  # no setting has the margin: the fastest passing one
    slow = [row(32, 0.3, 0.01, 0.99, 1.5), row(16, 0.0, 0.01, 0.97, 1.8)]
    best, passed = bench.choose_defaults(slow)
    assert not passed and best["k"] == 16  # quality kept, fastest of those
    bad = [row(0, 0.0, 0.2, 0.9, 4.0), row(4, 0.0, 0.1, 0.93, 3.0)]
    best, passed = bench.choose_defaults(bad)
    assert not passed and best["k"] == 4


def test_bench_command_is_registered() -> None:
    app = typer.Typer()
    bench.register(app)
    names = [c.name for c in app.registered_commands]
    assert names == ["segments"]
    params = app.registered_commands[0].callback.__code__.co_varnames  # type: ignore[union-attr]
    assert "as_json" in params


def _app() -> typer.Typer:
    app = typer.Typer()
    bench.register(app)

    @app.command("noop")  # a second command keeps typer from collapsing the group
    def noop() -> None:
        pass

    return app


def test_events_of_an_unknown_workload_are_a_usage_error() -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(_app(), ["segments", "--events", "overflow,chat"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "overflow,chat" in result.output
    result = CliRunner().invoke(_app(), ["segments", "--events", "overflow", "--event-turns", "-1"])
    assert result.exit_code == 2 and "--event-turns" in result.output
    # chained sessions are rag sessions: not without rag among the events
    for args in (["--events", "overflow", "--chained", "2"], ["--chained", "2"]):
        result = CliRunner().invoke(_app(), ["segments", *args])
        assert result.exit_code == 2 and "--chained" in result.output, args
        assert "Traceback" not in result.output
    result = CliRunner().invoke(_app(), ["segments", "--events", "rag", "--chained", "1",
                                         "--chained-method", "k16-x"])
    assert result.exit_code == 2 and "k16-x" in result.output
    # the served dtype is the events replay's: a name it knows, and only with --events
    for args in (["--events", "rag", "--serve-dtype", "fp8"], ["--serve-dtype", "float32"]):
        result = CliRunner().invoke(_app(), ["segments", *args])
        assert result.exit_code == 2 and "--serve-dtype" in result.output, args
        assert "Traceback" not in result.output


def test_chain_agreement_and_summary() -> None:
    """``segment_chain``'s figures: the shared leading tokens' share of the longer reply, and
    per arm the means over the turns after the first, also per turn index."""
    from suffixmem_bench.segment_chain import ChainTurn, agreement, summarize

    assert agreement([1, 2, 3], [1, 2, 3]) == 1.0 and agreement([], []) == 1.0
    assert agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 0.5
    assert agreement([1, 2], [1, 2, 3, 4]) == 0.5  # one stopped early: the longer counts
    assert agreement([7], [8]) == 0.0
    rows = [
        ChainTurn(0, 0, 100, 0, 0, 1.0, None, "1234"),
        ChainTurn(0, 1, 200, 80, 70, 0.5, 1.0, "1234", ("1234", "1234", "1234")),
        ChainTurn(0, 2, 300, 160, 150, 1.0, 0.25, "1234", ("1234", "999", "1234")),
        ChainTurn(1, 1, 200, 60, 60, 0.0, 0.5, "42", ("7", "7", "8")),
    ]
    s = summarize(rows)
    assert (s["sessions"], s["turns"], s["task_events"]) == (2, 3, 3)
    third = round(1 / 3, 4)
    assert s["free_running_agreement"] == 0.5
    assert s["free_running_unchained"] == round(1.75 / 3, 4)
    assert s["task_agreement"] == s["task_agreement_unchained"] == round(2 / 3, 4)
    assert s["task_exact_accuracy"] == round(2 / 3, 4) and s["task_reuse_accuracy"] == third
    assert s["reused_tokens_mean"] == 100.0
    assert s["reused_tokens_unchained_mean"] == round(280 / 3, 4)
    assert set(s["by_turn"]) == {"1", "2"}
    assert s["by_turn"]["1"]["free_running_agreement"] == 0.25
    second = s["by_turn"]["2"]
    assert second["task_agreement"] == 0.0 and second["task_agreement_unchained"] == 1.0


def test_events_report_prints_tables_not_json() -> None:
    """``--events`` without ``--json`` prints the methods table and the defaults per workload
    class, here of the committed fp32 replay of the rag workload's 59 events."""
    import json
    from pathlib import Path

    from rich.console import Console

    from suffixmem_bench.segment_report import print_events_report

    root = Path(__file__).resolve().parents[2]
    result = json.loads((root / "results/segments-rag-events-avx2-fp32-8527c13.json").read_text())
    console = Console(record=True, width=160)
    print_events_report(console, result)
    text = console.export_text()
    assert "rag: 59 reuse events" in text and "rag events (59) (float32 primitives)" in text
    assert "k16-p0.2" in text and "0.966" in text  # its task agreement, 57 of 59
    assert "default for rag: segment reuse on (k16-p0.2): gate passed" in text
    assert "{" not in text


@pytest.mark.slow
def test_events_only_replays_just_the_named_workload(model_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from typer.testing import CliRunner

    result = CliRunner().invoke(_app(), [
        "segments", "--events", "rag", "--event-sessions", "1", "--event-turns", "2",
        "--methods", "k0 k0-r1@1", "--threads", "2", "--chained", "1", "--serve-dtype",
        "float32", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out["events"]) == set(out["workload_defaults"]) == {"rag"}
    rag = out["events"]["rag"]
    assert rag["events"] <= 1 and out["setup"]["methods"] == ["k0", "k0-r1@1"]
    # quality is measured in the dtype the engine serves: here fp32, what a host without
    # AVX-512 BF16 serves, on any host
    assert out["setup"]["dtype"] == "float32"
    if rag["events"]:  # the task check asks for a code planted in the event's reused span
        assert rag["task_events"] == 1
        for row in rag["methods"].values():
            assert {"task_agreement", "first_line_agreement", "task_exact_accuracy"} <= set(row)
    verdict = out["workload_defaults"]["rag"]
    assert verdict["segment_reuse"] == (verdict["why"] == "gate passed")
    assert "noisy" in out and "load_avg" in out  # the measurement discipline's fields
    # --chained: one whole session served with the engine's own method, turn 2 against exact
    # and one-hop reuse, the planted code asked for after it
    from suffixmem.engine.reuse.blend import default_blend

    chained = rag["chained"]
    assert out["setup"]["chained_sessions"] == 1
    assert chained["method"] == default_blend(out["setup"]["dtype"]).label()
    assert chained["dtype"] == out["setup"]["dtype"]  # served as the events were measured
    assert (chained["sessions"], chained["turns"], chained["task_events"]) == (1, 1, 1)
    assert set(chained["by_turn"]) == {"1"}
    # turn 2 places turn 1's exchange at its new position in both reuse arms
    assert chained["reused_tokens_mean"] > 0 and chained["reused_tokens_unchained_mean"] > 0
    for key in ("free_running_agreement", "free_running_unchained", "task_agreement",
                "task_agreement_unchained", "task_exact_accuracy", "task_reuse_accuracy"):
        assert 0 <= chained[key] <= 1, key


@pytest.mark.slow
def test_quality_harness_is_exact_when_nothing_moves(encode, fp32_llama) -> None:  # type: ignore[no-untyped-def]
    """With the fill prompt equal to the evaluated one, reuse changes nothing: KL ~ 0 and full
    agreement. With a different prefix, the same harness reports a real gap."""
    p = bench.build_prompts(encode, count=1, segment_tokens=60, seed=3)[0]
    same = dataclasses.replace(p, fill_ids=p.ids, fill_segments=p.segments)
    res = bench.measure_quality(fp32_llama, [same, p], [(0, 0.0)], continuation=8)
    q = res[(0, 0.0)]
    assert q.kl[0] < 1e-6 and q.top1[0] == 1.0 and q.free[0] == 1.0
    assert q.kl[1] > 1e-4
