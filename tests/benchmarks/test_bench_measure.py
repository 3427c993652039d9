"""The measurement discipline: interleaving order, spread, noisy flag, recorded fields."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from suffixmem.config import EngineConfig
from suffixmem_bench import measure
from suffixmem_bench.measure import RunContext, alternate, interleave, spread


def test_interleave_runs_arms_a_b_a_b() -> None:
    order: list[str] = []
    runs = interleave({"a": lambda: order.append("a") or len(order),
                       "b": lambda: order.append("b") or len(order)}, 3)
    assert order == ["a", "b", "a", "b", "a", "b"]
    assert runs == {"a": [1, 3, 5], "b": [2, 4, 6]}


@pytest.mark.parametrize("bad", [0, 2, 2.5, True, "3"])
def test_fewer_than_three_repeats_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="repeats must be an integer >= 3"):
        interleave({"a": lambda: 1}, bad)  # type: ignore[arg-type]


def test_spread_is_median_min_max_of_finite_runs() -> None:
    s = spread([3.0, 1.0, math.nan, 2.0, 10.0])
    assert s == {"median": 2.5, "min": 1.0, "max": 10.0, "runs": [3.0, 1.0, 2.0, 10.0]}
    assert math.isnan(spread([])["median"])


def test_alternate_runs_processes_in_turn() -> None:
    code = "import sys; print(sys.argv[1])"
    runs = alternate({"x": [sys.executable, "-c", code, "7"],
                      "y": [sys.executable, "-c", code, "8"]}, 3, lambda out: int(out))
    assert runs == {"x": [7, 7, 7], "y": [8, 8, 8]}


def test_run_context_records_load_probe_commit_and_idle(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(measure.IDLE_ENV, raising=False)
    idle = tmp_path / "idle.json"
    with RunContext(1, idle_path=idle, probe_s=0.02) as ctx:
        pass
    f = ctx.fields()
    assert f["matmul_gflops"]["before"] > 0 and f["matmul_gflops"]["after"] > 0
    assert len(f["load_avg"]["before"]) == 3 and len(f["load_avg"]["after"]) == 3
    assert f["threads"] == 1 and f["commit"]
    # the first run on a machine sets the idle rate to its own best probe: the idle-rate rule
    # cannot fire, only the drift rule (0.02 s probes on a loaded machine may drift)
    probes = f["matmul_gflops"].values()
    assert f["idle_gflops"] == max(probes)
    assert f["noisy"] is (min(probes) < measure.DRIFT_FRACTION * max(probes))
    assert json.loads(idle.read_text())  # recorded for the next run
    m = f["machine"]
    assert m["cores"] >= 1 and m["memory_gib"] > 0 and m["cpu"]
    assert m["l3"] == measure.l3_cache()


def test_the_idle_rate_is_kept_per_machine_l3_included(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hosts under one CPU name (a VM's generic model name) but different caches keep
    separate idle rates: a fast host's rate must not mark a slower host's runs noisy."""
    monkeypatch.delenv(measure.IDLE_ENV, raising=False)
    idle = tmp_path / "idle.json"
    monkeypatch.setattr(measure, "cpu_name", lambda default="?": "Some CPU")
    monkeypatch.setattr(measure, "l3_cache", lambda default="?": "262144K")
    measure.record_idle(2, 400.0, idle)
    monkeypatch.setattr(measure, "l3_cache", lambda default="?": "32768K")
    assert measure.idle_gflops(2, idle) is None
    measure.record_idle(2, 200.0, idle)
    assert measure.idle_gflops(2, idle) == 200.0
    assert sorted(json.loads(idle.read_text()).values()) == [200.0, 400.0]


def test_the_vector_extensions_come_from_the_cpu_flags_and_key_the_idle_rate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An AVX2-only host under the same name and cache as an AVX-512 BF16 one runs bf16 ~8x
    slower: it is named in ``machine()`` and keeps an idle rate of its own."""
    info = tmp_path / "cpuinfo"
    for flags, isa in (("fpu avx2 avx512f avx512_bf16 sse", "avx512_bf16"),
                       ("fpu avx2 avx512f", "avx512"), ("fpu sse avx2", "avx2"), ("fpu", "?")):
        info.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n")
        assert measure.vector_isa(info) == isa
    assert measure.vector_isa(tmp_path / "missing") == "?"
    assert measure.machine()["isa"] == measure.vector_isa()
    assert measure.machine()["dtype"] == EngineConfig().dtype  # what the engines ran in
    monkeypatch.delenv(measure.IDLE_ENV, raising=False)
    idle = tmp_path / "idle.json"
    monkeypatch.setattr(measure, "cpu_name", lambda default="?": "AMD EPYC")
    monkeypatch.setattr(measure, "l3_cache", lambda default="?": "32768K")
    monkeypatch.setattr(measure, "vector_isa", lambda: "avx512_bf16")
    measure.record_idle(2, 400.0, idle)
    monkeypatch.setattr(measure, "vector_isa", lambda: "avx2")
    assert measure.idle_gflops(2, idle) is None


def test_a_probe_below_half_the_idle_rate_is_noisy(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(measure.IDLE_ENV, "1e9")  # an idle rate no probe here reaches
    with RunContext(1, idle_path=tmp_path / "idle.json", probe_s=0.02) as ctx:
        pass
    f = ctx.fields()
    assert f["idle_gflops"] == 1e9 and f["noisy"] is True
    assert not (tmp_path / "idle.json").exists()  # an override is not recorded
    # 0.02 s probes on a loaded machine may differ by more than a quarter (the drift rule,
    # tested below): pin them equal so this checks the idle-rate rule alone
    ctx.probe_after = ctx.probe_before
    monkeypatch.setenv(measure.IDLE_ENV, "1e-9")
    assert ctx.fields()["noisy"] is False


def test_a_run_whose_probes_drift_by_more_than_a_quarter_is_noisy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine slowed during the run: noisy even above half the idle rate."""
    monkeypatch.setenv(measure.IDLE_ENV, "200")
    ctx = RunContext(1, idle_path=tmp_path / "idle.json")
    for before, after, noisy in ((194.0, 119.0, True), (119.0, 194.0, True),
                                 (194.0, 150.0, False), (194.0, 197.0, False),
                                 (194.0, math.nan, False)):
        ctx.probe_before, ctx.probe_after = before, after
        assert ctx.fields()["noisy"] is noisy, (before, after)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux /proc only")
def test_peak_rss_of_a_child_is_its_own_not_its_parents() -> None:
    # ru_maxrss survives exec: a child of a process holding 400 MB would report >= 400 MB
    import subprocess

    held = bytearray(400 << 20)
    held[::4096] = b"\x01" * len(held[::4096])  # touch every page so it is resident
    code = ("import json; from suffixmem_bench.measure import peak_rss_mb; "
            "big = bytearray(60 << 20); big[::4096] = b'\\x01' * len(big[::4096]); "
            "print(json.dumps(peak_rss_mb()))")
    child = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                      text=True, check=True).stdout)
    assert measure.peak_rss_mb() >= 400
    assert 60 <= child < 300, child  # its own 60 MB plus the interpreter, not the parent's 400
    del held
