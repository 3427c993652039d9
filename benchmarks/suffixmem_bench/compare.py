"""``suffixmem bench compare PUBLISHED RERUN``: does a rerun stay inside the published spreads?

Issue 10's last rule: no published figure may differ from a rerun of its command by more than
its reported spread. This command checks it for any two reports of one benchmark (the committed
``report.json`` and a fresh one): every figure that carries a spread in the published report is
looked up in the rerun, and the rerun's median must lie inside the published [min, max].

A figure with a spread is either
- a dict ``{"median", "min", "max", ...}`` (``measure.spread``: ``bench paired``, ``serve``
  ...), named by its path (``arms.stock.ttft_p50_from_turn8_ms``), or
- a number next to a ``spread`` dict holding ``[min, max]`` (``bench chat``'s
  ``configs.NAME.spread``, ratios included: ``configs.NAME.output_tok_vs_vllm_direct``) or a
  ``{"median", "min", "max"}`` dict (``bench serve``'s ``suffixmem.spread``) under its key, or
- a number ``X`` next to ``X_min`` and ``X_max`` (``bench engines``: ``engines.torch.prefill_s``).

A figure whose spread is a single value (every round alike: token counts, hit rates) must
match it exactly. A ``bench pool`` report of several runs has all of these shapes.

Report (JSON): ``figures`` (how many were compared), ``inside``, ``outside``: one entry per
figure outside its spread with the published ``median``/``min``/``max``, the rerun's median
(``rerun``) and ``move`` (the rerun's median over the published one, minus 1), ``missing``
(published figures the rerun lacks; a plain number at the figure's path counts: a one-round
figure to which a pooled report gives the runs' range), and ``survives`` (nothing outside or
missing). ``only``: compare only figures whose name contains one of these strings.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from suffixmem_bench.measure import finite_number

Figure = tuple[float, float, float]  # median, min, max


def figures(report: Any, path: str = "") -> Iterator[tuple[str, Figure]]:
    """Every figure with a spread in ``report`` (module docstring), as (name, (median, min,
    max)); non-finite ones are skipped."""
    if not isinstance(report, dict):
        return
    if {"median", "min", "max"} <= report.keys():
        fig = (report["median"], report["min"], report["max"])
        if all(finite_number(v) for v in fig):
            yield path, tuple(float(v) for v in fig)  # type: ignore[misc]
        return
    spreads = report.get("spread")
    if isinstance(spreads, dict):
        for key, bounds in spreads.items():
            if isinstance(bounds, dict) and {"min", "max"} <= bounds.keys():
                bounds = [bounds["min"], bounds["max"]]
            value = report.get(key)
            if (isinstance(bounds, list | tuple) and len(bounds) == 2 and finite_number(value)
                    and all(finite_number(b) for b in bounds)):
                yield _join(path, key), (float(value), float(bounds[0]), float(bounds[1]))
    for key, value in report.items():
        lo, hi = report.get(f"{key}_min"), report.get(f"{key}_max")
        if finite_number(value) and finite_number(lo) and finite_number(hi):
            yield _join(path, key), (float(value), float(lo), float(hi))
        elif isinstance(value, dict) and key not in ("spread", "runs"):
            yield from figures(value, _join(path, key))


def compare(published: Any, rerun: Any, only: Sequence[str] = (),
            exactly: Collection[str] | None = None) -> dict[str, Any]:
    """The check of ``rerun`` against ``published`` (module docstring); ``exactly``: only the
    figures of these names (the ones a README quotes), where a plain number without a spread
    must come back equal."""
    found = list(figures(published))
    if exactly is not None:  # a quoted plain number (a deterministic figure) must come back
        known = {name for name, _ in found}
        for name in sorted(set(exactly) - known):
            value = number_at(published, name)
            if value is not None:
                found.append((name, (value, value, value)))
    return check([(name, fig) for name, fig in found
                  if (not only or any(s in name for s in only))
                  and (exactly is None or name in exactly)], rerun)


def check(published: Iterable[tuple[str, Figure]], rerun: Any) -> dict[str, Any]:
    """``rerun``'s median of each named figure against its published (median, min, max):
    ``compare``'s result (module docstring). ``bench table --rerun`` checks the README's
    brackets with it."""
    mine = dict(figures(rerun))
    outside: list[dict[str, Any]] = []
    missing: list[str] = []
    compared = 0
    for name, (median, lo, hi) in published:
        new = median_at(rerun, name, mine)
        if new is None:
            missing.append(name)
            continue
        compared += 1
        if not lo <= new <= hi:
            outside.append({"figure": name, "median": median, "min": lo, "max": hi,
                            "rerun": new,
                            "move": new / median - 1 if median else math.inf})
    return {"figures": compared, "inside": compared - len(outside), "outside": outside,
            "missing": missing, "survives": not outside and not missing}


def median_at(report: Any, name: str, found: Mapping[str, Figure]) -> float | None:
    """A report's median of figure ``name``: from ``found`` (``dict(figures(report))``, built
    once by a caller that looks up many names) where it has a spread, else the plain number at
    that path (``number_at``)."""
    return found[name][0] if name in found else number_at(report, name)


def number_at(report: Any, name: str) -> float | None:
    """The plain number at dotted path ``name`` (a figure that one run reports without a
    spread, such as a one-round workload's, and a pooled report with the runs' range); a key
    with dots in it is written in brackets: ``methods[k16-q0.4].task_agreement``."""
    for bracketed, plain in re.findall(r"\[([^\]]+)\]|([^.\[\]]+)", name):
        key = bracketed or plain
        if not isinstance(report, dict) or key not in report:
            return None
        report = report[key]
    return float(report) if finite_number(report) else None


def load_report(path: str) -> Any:
    """The JSON report at ``path``; a one-line ``ValueError`` when it cannot be read."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else str(key)


def register(bench: Any) -> None:
    """Add ``suffixmem bench compare`` to the CLI's ``bench`` group."""
    import typer

    @bench.command("compare")
    def compare_cmd(
        published: str = typer.Argument(..., help="The committed report.json."),
        rerun: str = typer.Argument(..., help="A rerun's report.json of the same command."),
        only: list[str] = typer.Option(  # noqa: B008
            [], help="Compare only figures whose name contains this (repeatable)."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        """Check that a rerun's figures lie inside the published report's spreads."""
        from rich.console import Console

        try:
            reports = [load_report(p) for p in (published, rerun)]
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        result = compare(*reports, only=only)
        if as_json:
            print(json.dumps(result, indent=2))
        else:
            err = Console(stderr=True)
            for x in result["outside"]:
                err.print(f"outside: {x['figure']}: rerun {x['rerun']:.4g} against "
                          f"{x['median']:.4g} [{x['min']:.4g}-{x['max']:.4g}] "
                          f"({x['move']:+.1%})")
            for name in result["missing"]:
                err.print(f"missing in the rerun: {name}")
            err.print(f"{result['inside']} of {result['figures']} figures inside their "
                      "published spread" + ("" if result["survives"] else "; does not survive"))
        if not result["survives"]:
            raise typer.Exit(1)
