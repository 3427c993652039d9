"""``suffixmem bench pool REPORT...``: several runs of one command as one report.

Issue 10's last rule asks that no published figure differ from a rerun of its command by more
than its reported spread. One run's [min, max] over 3 rounds cannot promise that: a rerun's
median leaves it by chance 40% of the time, and more when the machine runs one process 10-20%
faster than the next (docs/benchmark.md). Pooling independent runs (separate processes, other
hours) puts that drift inside the spread: the README quotes a pooled report, and
``--held-out`` measures how well such spreads hold by pooling all runs but one and comparing
the one left out (``bench compare``), for each run in turn.

The pooled report has the shape of its inputs, so ``bench compare`` reads it:
- a figure with rounds (``{"median", "min", "max", "runs"}`` dicts; ``bench chat``'s
  ``runs``/``spread`` beside the figure; ``bench engines``' ``X_runs``/``X_min``/``X_max``)
  gets every run's rounds concatenated, and its median, min and max recomputed over them;
  ``{"median", "min", "max"}`` without rounds gets the envelope (min of mins, max of maxes,
  median of medians) and ``"pooled": "envelope"``;
- a number without rounds that differs between runs (a one-round workload's figure, a paired
  ratio over all turns) becomes the median over runs, with the runs' [min, max] under
  ``spread`` and their values under ``across_runs`` beside it;
- a flag holds only if it held in every run (``False`` wins, then ``None``); each target keeps
  its ``rule``, ``passed`` (in every run) and ``passed_by_run``, not its values; a count of
  ``repeats`` is summed; equal lists of numbers are pooled element by element (median);
  anything else that differs becomes the list of the runs' values.

Top level: ``pooled_from`` (each input's ``path``, ``commit``, ``date``, ``load_avg``,
``matmul_gflops``), ``commit`` (the distinct commits joined by ``+``), ``noisy`` (any). The
inputs must share ``machine`` and ``workload`` where they have them (bar the fields named in
``ignore``, whose values ``pooled_differences`` keeps) and none may be noisy: each refusal is a
one-line ``ValueError`` naming the report.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from suffixmem_bench.compare import compare, load_report
from suffixmem_bench.measure import finite_number, spread

CONTEXT = ("commit", "date", "load_avg", "matmul_gflops", "idle_gflops", "noisy")
# Runs of one command on one host, or nothing to pool: the fields of ``machine`` that name the
# host (not its load or commit), and the ``workload`` bar how it was interleaved or paired.
SAME = {"machine": ("cpu", "isa", "cores", "l3", "memory_gib", "dtype"),
        "workload": None}
HOW = ("repeats", "interleave", "paired")


def pool(reports: Sequence[Any], names: Sequence[str] | None = None,
         ignore: Sequence[str] = ()) -> dict[str, Any]:
    """One report from ``reports`` (runs of one command; module docstring). ``ignore``:
    ``workload.KEY`` / ``machine.KEY`` fields allowed to differ (a prompt a few tokens longer in
    one run); their values are kept under ``pooled_differences``."""
    names = list(names) if names is not None else [f"report {i + 1}" for i in range(len(reports))]
    if len(reports) < 1 or len(names) != len(reports):
        raise ValueError("pool needs at least one report, each with a name")
    for name, report in zip(names, reports, strict=True):
        if not isinstance(report, dict):
            raise ValueError(f"{name} is not a report (a JSON object)")
        if report.get("noisy"):
            raise ValueError(f"{name} is a noisy run; noisy runs are never published or pooled")
    differences: dict[str, list[Any]] = {}
    for name in ignore:
        part, _, field = name.partition(".")
        if part not in SAME or not field:
            raise ValueError(f"cannot ignore {name!r}: only workload.KEY or machine.KEY")
        differences[name] = [(r.get(part) or {}).get(field) for r in reports]
    for key, fields in SAME.items():
        skip = {n.partition(".")[2] for n in ignore if n.startswith(f"{key}.")}
        values = [_identity(r.get(key), fields, skip) for r in reports]
        for name, value in zip(names, values, strict=True):
            if key in reports[0] and value != values[0]:
                raise ValueError(f"{name} has another {key} than {names[0]}: "
                                 "pool only runs of one command on one machine")
    body = _pool([{k: v for k, v in r.items() if k not in CONTEXT} for r in reports])
    commits = list(dict.fromkeys(str(r.get("commit")) for r in reports))
    body.update(
        commit="+".join(commits),
        noisy=False,
        pooled_from=[{"path": n, **{k: r.get(k) for k in CONTEXT if k != "noisy"}}
                     for n, r in zip(names, reports, strict=True)],
    )
    if differences:
        body["pooled_differences"] = differences
    return body


def _identity(value: Any, fields: Sequence[str] | None, skip: set[str]) -> Any:
    if not isinstance(value, dict):
        return value
    if fields is None:
        return {k: v for k, v in value.items() if k not in HOW and k not in skip}
    return {k: value.get(k) for k in fields if k not in skip}


def held_out(reports: Sequence[Any], names: Sequence[str],
             exactly: Collection[str] | None = None,
             ignore: Sequence[str] = ()) -> dict[str, Any]:
    """For each report, ``bench compare`` of it against the pool of all the others: how
    often a rerun stays inside pooled spreads (needs 3 reports or more). ``exactly``: only
    the figures of these names (those a README quotes: ``bench table --held-out``);
    ``ignore``: as ``pool``'s."""
    if len(reports) < 3:
        raise ValueError("--held-out needs at least 3 reports (2 to pool, 1 to check)")
    rows = []
    for i, name in enumerate(names):
        rest = [r for j, r in enumerate(reports) if j != i]
        result = compare(pool(rest, [n for j, n in enumerate(names) if j != i], ignore),
                         reports[i], exactly=exactly)
        rows.append({"report": name, "figures": result["figures"], "inside": result["inside"],
                     "outside": [x["figure"] for x in result["outside"]],
                     "missing": len(result["missing"])})
    figures = sum(r["figures"] for r in rows)
    inside = sum(r["inside"] for r in rows)
    return {"held_out": rows, "figures": figures, "inside": inside,
            "inside_share": inside / figures if figures else float("nan")}


def _pool(values: list[Any]) -> Any:
    first = values[0]
    if all(isinstance(v, dict) for v in values):
        if {"median", "min", "max"} <= first.keys():
            return _pool_spread(values)
        return _pool_dict(values)
    if all(isinstance(v, bool) or v is None for v in values):
        return False if False in values else (None if None in values else True)
    if all(finite_number(v) for v in values):
        return statistics.median(values)
    if (all(isinstance(v, list) and len(v) == len(first) for v in values)
            and all(finite_number(x) for v in values for x in v)):
        return [statistics.median(xs) for xs in zip(*values, strict=True)]
    return first if all(v == first for v in values) else list(values)


def _pool_spread(values: list[dict[str, Any]]) -> dict[str, Any]:
    out = _pool_dict(values)
    if all(isinstance(v.get("runs"), list) for v in values):
        out.update(spread([x for v in values for x in v["runs"]]))
    else:
        out.update(median=statistics.median(v["median"] for v in values),
                   min=min(v["min"] for v in values), max=max(v["max"] for v in values),
                   pooled="envelope")
    return out


def _targets(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each target's rule and verdict per run, and ``passed`` only if it passed in every run:
    a verdict's values and limits are not pooled (runs may take them from other methods)."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(k for r in runs for k in r):
        entries = [r[name] for r in runs if isinstance(r.get(name), dict)]
        verdicts = [e.get("passed") for e in entries]
        out[name] = {"rule": entries[0].get("rule") if entries else None,
                     "passed": _pool(verdicts) if verdicts else None,
                     "passed_by_run": verdicts}
    return out


def _envelope(spreads: list[Any]) -> dict[str, list[float]]:
    """``bench chat``'s ``spread`` dicts of [min, max] lists joined: the widest bounds."""
    out: dict[str, list[float]] = {}
    for one in spreads:
        for key, bounds in (one or {}).items():
            if isinstance(bounds, list) and len(bounds) == 2:
                lo, hi = out.get(key, bounds)
                out[key] = [min(lo, bounds[0]), max(hi, bounds[1])]
    return out


def _pool_dict(values: list[dict[str, Any]]) -> dict[str, Any]:
    keys = list(dict.fromkeys(k for v in values for k in v))
    out: dict[str, Any] = {}
    for key in keys:
        present = [v[key] for v in values if key in v]
        if key == "repeats" and all(finite_number(x) for x in present):
            out[key] = sum(present)
        elif key == "targets" and all(isinstance(x, dict) and all(
                isinstance(t, dict) and "passed" in t for t in x.values()) for x in present):
            out[key] = _targets(present)
        elif key not in ("runs", "spread", "across_runs"):
            out[key] = _pool(present)
    covered = set()
    if any(isinstance(v.get("runs"), dict) for v in values):  # bench chat: runs + spread
        runs: dict[str, list[float]] = {}
        bounds = _envelope([v.get("spread") for v in values])
        rounds = [v.get("runs") if isinstance(v.get("runs"), dict) else {} for v in values]
        for key in dict.fromkeys(k for r in rounds for k in r):
            r = spread([x for v in rounds for x in v.get(key, [])])
            if r["runs"]:
                runs[key], bounds[key] = r["runs"], [r["min"], r["max"]]
                out[key] = r["median"]
                covered.add(key)
        out["runs"], out["spread"] = runs, bounds
    elif any(isinstance(v.get("spread"), dict) for v in values):  # bench serve: spread dicts
        out["spread"] = _pool([v["spread"] for v in values if isinstance(v.get("spread"), dict)])
        for key, s in out["spread"].items():
            if isinstance(s, dict) and key in out:
                out[key] = s["median"]
                covered.add(key)
    for key in keys:  # bench engines: X, X_runs, X_min, X_max
        if key.endswith("_runs") and key[:-5] in out:
            base = key[:-5]
            r = spread([x for v in values for x in v.get(key, [])])
            out.update({base: r["median"], key: r["runs"], f"{base}_min": r["min"],
                        f"{base}_max": r["max"]})
            covered |= {base, f"{base}_min", f"{base}_max"}
    across = {key: [v[key] for v in values if key in v] for key in keys
              if key not in covered and key != "repeats" and not key.endswith(("_min", "_max"))}
    across = {k: xs for k, xs in across.items()
              if len(xs) > 1 and all(finite_number(x) for x in xs) and len(set(xs)) > 1}
    if across:
        ranges = out.setdefault("spread", {})
        for key, xs in across.items():
            ranges[key] = [min(xs), max(xs)]
        out["across_runs"] = across
    return out


def register(bench: Any) -> None:
    """Add ``suffixmem bench pool`` to the CLI's ``bench`` group."""
    import typer

    @bench.command("pool")
    def pool_cmd(
        reports: list[str] = typer.Argument(  # noqa: B008
            ..., help="report.json files of runs of one command on one machine."),
        out: str = typer.Option("", help="Write the pooled report here."),
        ignore: list[str] = typer.Option(  # noqa: B008
            [], help="workload.KEY or machine.KEY allowed to differ (repeatable; recorded)."),
        check: bool = typer.Option(False, "--held-out",
                                   help="Compare each report with the pool of the others."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        """Pool runs of one benchmark into one report whose spreads cover every run."""
        try:
            loaded = [load_report(p) for p in reports]
            result = (held_out(loaded, reports, ignore=ignore) if check
                      else pool(loaded, reports, ignore))
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        if as_json:
            print(json.dumps(result, indent=2))
        elif check:
            for row in result["held_out"]:
                print(f"{row['report']}: {row['inside']} of {row['figures']} figures inside "
                      "the others' pooled spreads")
            print(f"all: {result['inside']} of {result['figures']} "
                  f"({result['inside_share']:.0%})")
        else:
            print(f"pooled {len(reports)} reports ({result['commit']})"
                  + (f" into {out}" if out else ""))
