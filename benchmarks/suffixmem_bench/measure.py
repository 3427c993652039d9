"""The measurement discipline every ``suffixmem bench`` command follows (issue 10 item 1).

- **Interleave.** Arms being compared run A/B/A/B... in one process where the engines allow
  it (``interleave``), else as alternating child processes (``alternate``), so slow drift of
  the machine (another job starting, thermal state) hits every arm alike. At least
  ``MIN_REPEATS`` (3) rounds.
- **Spread.** Every timed figure is reported as its median with its min and max and the raw
  runs (``spread``); a README quotes the median with its spread.
- **Equal threads.** ``set_threads`` gives torch, OpenMP and vLLM the same thread count; the
  count is recorded.
- **Load.** ``RunContext`` records the 1/5/15-minute load average before and after the run,
  and a short matmul probe (fp32 GFLOP/s at the run's thread count, ~0.2 s) before and after.
- **Noisy.** The machine's idle probe rate is the best probe ever seen on it at that thread
  count (kept in ``~/.cache/suffixmem/bench/idle_probe.json``; ``SUFFIXMEM_BENCH_IDLE_GFLOPS``
  overrides it). A run whose slower probe is below half of that rate, or whose two probes
  differ by more than a quarter (the machine changed speed during the run: a sequential chat
  run read 194 then 119 GFLOP/s, above half the idle rate, with every configuration 35-60%
  slower than the run before), is ``"noisy": true``; noisy runs never feed the README. The
  first run on a machine sets the idle rate itself, so calibrate on a quiet machine first
  (``suffixmem bench engines --repeats 3`` alone).

Every bench's JSON carries ``RunContext.fields()``: ``commit``, ``load_avg``, ``noisy``,
``matmul_gflops``, ``idle_gflops``, ``threads`` and ``machine`` (CPU name, cores, L3 size,
memory: hosts sold under one CPU name differ several-fold in memory-bound timings, so a rerun
compares only with a run on the same ``machine``; the idle rate is kept per machine too).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

MIN_REPEATS = 3
NOISY_FRACTION = 0.5  # a probe below this share of the idle rate marks the run noisy
DRIFT_FRACTION = 0.75  # so does a slower probe below this share of the faster one
IDLE_FILE = Path.home() / ".cache" / "suffixmem" / "bench" / "idle_probe.json"
IDLE_ENV = "SUFFIXMEM_BENCH_IDLE_GFLOPS"


def check_repeats(repeats: int) -> int:
    """``repeats`` when it is at least ``MIN_REPEATS``, else a one-line ``ValueError``."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < MIN_REPEATS:
        raise ValueError(f"repeats must be an integer >= {MIN_REPEATS}, got {repeats!r}")
    return repeats


def finite_number(v: Any) -> bool:
    """Whether ``v`` is a finite int or float (a bool is a flag, not a figure)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def spread(values: Sequence[float]) -> dict[str, Any]:
    """``{"median", "min", "max", "runs"}`` of the finite ``values`` (NaN when none)."""
    xs = [float(v) for v in values if finite_number(v)]
    if not xs:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "runs": []}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def interleave(arms: Mapping[str, Callable[[], T]], repeats: int) -> dict[str, list[T]]:
    """Run every arm once per round, in the given order, for ``repeats`` rounds (A/B/A/B).

    Returns each arm's results in round order. An arm that raises stops the whole run: a
    comparison with a missing arm is not a comparison.
    """
    check_repeats(repeats)
    out: dict[str, list[T]] = {name: [] for name in arms}
    for _ in range(repeats):
        for name, arm in arms.items():
            out[name].append(arm())
    return out


def alternate(commands: Mapping[str, Sequence[str]], repeats: int,
              parse: Callable[[str], T], *, env: Mapping[str, str] | None = None,
              timeout_s: float | None = None) -> dict[str, list[T]]:
    """``interleave`` for arms that need a process each (engines that cannot share one):
    each round runs every command as a child process, one after another, and ``parse``s its
    stdout."""

    def runner(cmd: Sequence[str]) -> Callable[[], T]:
        def run() -> T:
            proc = subprocess.run(list(cmd), capture_output=True, text=True, check=True,
                                  env=dict(env) if env is not None else None, timeout=timeout_s)
            return parse(proc.stdout)
        return run

    return interleave({name: runner(cmd) for name, cmd in commands.items()}, repeats)


def set_threads(threads: int) -> int:
    """Give torch (intra-op), OpenMP children and vLLM the same thread count; returns it."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    os.environ["OMP_NUM_THREADS"] = str(threads)  # read by child processes and vLLM
    import torch

    torch.set_num_threads(threads)
    return torch.get_num_threads()


def matmul_gflops(size: int = 384, seconds: float = 0.2) -> float:
    """Best fp32 ``size``x``size`` matmul rate (GFLOP/s) over about ``seconds`` of repeats, at
    torch's current thread count: a quick probe of how much CPU this process is getting."""
    import torch

    a = torch.randn(size, size)
    b = torch.randn(size, size)
    a @ b  # warm-up
    best = math.inf
    end = time.perf_counter() + seconds
    while True:
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() >= end:
            break
    return 2 * size**3 / best / 1e9


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB since it started its program.

    Linux: ``VmHWM`` of ``/proc/self/status``, the high-water mark of the process's current
    memory map. Not ``getrusage``'s ``ru_maxrss``: the kernel carries it across ``exec``, so a
    child started by a 350 MB parent reports at least 350 MB however little it uses (Python's
    ``subprocess`` starts children with ``vfork``, which shares the parent's map until exec).
    Elsewhere ``ru_maxrss`` (KiB on Linux, bytes on macOS)."""
    import resource
    import sys

    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def load_avg() -> list[float]:
    """The 1/5/15-minute load average (empty where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def git_commit() -> str:
    """The checkout's commit (``+dirty`` when it has changes), or ``""`` outside git."""
    here = Path(__file__).parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=False, cwd=here).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=False,
                               cwd=here).stdout.strip()
    except OSError:
        return ""
    return f"{sha}+dirty" if sha and dirty else sha


def cpu_name(default: str = "?") -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else ``default``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return default


def l3_cache(default: str = "?") -> str:
    """The last-level cache's size as the kernel reports it (``"32768K"``), else ``default``.
    Hosts that report the same CPU name can differ here (a virtual machine's model name is
    often generic), and so do their memory-bound timings."""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        with contextlib.suppress(OSError):
            if (index / "level").read_text().strip() == "3":
                return (index / "size").read_text().strip()
    return default


def vector_isa(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The widest vector extension the CPU reports: ``avx512_bf16`` (bf16 dot products in
    hardware), ``avx512``, ``avx2``, else ``"?"``. It moves bf16 timings by up to ~8x (torch
    runs bf16 matrix products on AVX2 by converting to fp32), and hosts that report the same
    generic name ("AMD EPYC") differ here."""
    try:
        flags: set[str] = set()
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return "?"
    for flag, name in (("avx512_bf16", "avx512_bf16"), ("avx512f", "avx512"), ("avx2", "avx2")):
        if flag in flags:
            return name
    return "?"


def machine() -> dict[str, Any]:
    """What a rerun must match for its timings to compare: CPU name, vector extensions, cores,
    L3 size, memory, and the dtype the engines' ``auto`` picks there."""
    from suffixmem.config import resolve_dtype

    mem_gib = math.nan
    with contextlib.suppress(ValueError, OSError):
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    return {"cpu": cpu_name(), "isa": vector_isa(), "cores": os.cpu_count(), "l3": l3_cache(),
            "memory_gib": round(mem_gib, 1), "dtype": resolve_dtype("auto")}


def _machine_key(threads: int) -> str:
    isa = vector_isa()
    # keys written before the ISA was recorded stay valid for the AVX-512 BF16 hosts they came
    # from; any other host gets a key of its own
    tag = "" if isa == "avx512_bf16" else f"|{isa}"
    return f"{cpu_name()}|L3 {l3_cache()}|{os.cpu_count()} cores|{threads} threads{tag}"


def idle_gflops(threads: int, path: Path = IDLE_FILE) -> float | None:
    """This machine's idle probe rate at ``threads`` (env override, else the recorded best)."""
    env = os.environ.get(IDLE_ENV)
    if env:
        return float(env)
    try:
        value = json.loads(path.read_text()).get(_machine_key(threads))
    except (OSError, ValueError):
        return None
    return float(value) if isinstance(value, int | float) else None


def record_idle(threads: int, gflops: float, path: Path = IDLE_FILE) -> float:
    """Keep the best probe seen at ``threads``; returns the idle rate after this probe."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    key = _machine_key(threads)
    best = max(float(data.get(key, 0.0)), gflops)
    data[key] = best
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
    except OSError:
        pass  # a read-only home: the run still reports its own probe
    return best


class RunContext:
    """Load and probe around one benchmark run::

        with RunContext(threads) as ctx:
            ...measure...
        result.update(ctx.fields())

    ``threads``: the thread count the run measures at (the probe runs at it too)."""

    def __init__(self, threads: int | None = None, *, idle_path: Path = IDLE_FILE,
                 probe_s: float = 0.2) -> None:
        self.threads = threads or os.cpu_count() or 1
        self.idle_path = idle_path
        self.probe_s = probe_s
        self.load_before: list[float] = []
        self.load_after: list[float] = []
        self.probe_before = math.nan
        self.probe_after = math.nan
        self.commit = git_commit()

    def _probe(self) -> float:
        import torch

        saved = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            return matmul_gflops(seconds=self.probe_s)
        finally:
            torch.set_num_threads(saved)

    def __enter__(self) -> RunContext:
        self.load_before = load_avg()
        self.probe_before = self._probe()
        return self

    def __exit__(self, *exc: object) -> None:
        self.probe_after = self._probe()
        self.load_after = load_avg()

    def fields(self) -> dict[str, Any]:
        """The JSON every bench carries (see the module docstring)."""
        probes = [p for p in (self.probe_before, self.probe_after) if math.isfinite(p)]
        worst = min(probes) if probes else math.nan
        idle = idle_gflops(self.threads, self.idle_path)
        if probes and os.environ.get(IDLE_ENV) is None:
            idle = record_idle(self.threads, max(probes), self.idle_path)
        noisy = bool(idle and math.isfinite(worst) and worst < NOISY_FRACTION * idle)
        noisy = noisy or (len(probes) == 2 and worst < DRIFT_FRACTION * max(probes))
        return {
            "commit": self.commit,
            "load_avg": {"before": self.load_before, "after": self.load_after},
            "matmul_gflops": {"before": self.probe_before, "after": self.probe_after},
            "idle_gflops": idle,
            "noisy": noisy,
            "threads": self.threads,
            "machine": machine(),
        }
