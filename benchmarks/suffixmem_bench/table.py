"""``suffixmem bench table TEMPLATE``: the README's measured figures, read from committed reports.

Issue 10 asks that every figure in the README come from a committed ``results/`` report and
stay inside its reported spread when the command is rerun. A figure typed by hand can drift
from its report; here the README's "Measured" section is rendered from a markdown template
whose figures are placeholders into named reports, each written as its median with its
[min–max], so the README and the reports cannot disagree and every figure shows its spread.

The template starts with an HTML comment naming its reports, one ``ALIAS: PATH`` per line
(paths relative to the repository root), and writes each figure as ``{ALIAS.PATH|FORMAT}``:
``PATH`` is the figure's name as ``bench compare`` gives it (``configs.suffixmem_torch.
output_tok_s``; a plain number at that path also works, shown without a spread) and
``FORMAT`` one of ``FORMATS``. The README holds the rendering between ``<!-- measured:
TEMPLATE -->`` and ``<!-- /measured -->``; ``--write README.md`` replaces it, ``--check
README.md`` exits 1 when it differs (the test suite runs the check), and ``--held-out``
prints issue 10's rule checked on exactly the quoted figures (``held_out_check``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from suffixmem_bench.compare import figures, number_at
from suffixmem_bench.pool import held_out

# FORMAT -> (scale, decimals, suffix)
FORMATS: dict[str, tuple[float, int, str]] = {
    "ms": (1000.0, 1, " ms"),    # seconds shown in milliseconds
    "ms0": (1000.0, 0, " ms"),
    "rawms": (1.0, 2, " ms"),    # already milliseconds
    "s": (1.0, 2, " s"),
    "x": (1.0, 2, "×"),          # a ratio
    "x3": (1.0, 3, "×"),
    "tok": (1.0, 1, " tok/s"),
    "pct": (100.0, 0, "%"),
    "n": (1.0, 0, ""),
    "f1": (1.0, 1, ""),
    "f2": (1.0, 2, ""),
    "f3": (1.0, 3, ""),
}
PLACEHOLDER = re.compile(r"\{(\w+)\.([\w.\-\[\]]+)\|(\w+)\}")
REPORTS = re.compile(r"\A<!-- reports\n(.*?)\n-->\n", re.S)
BLOCK = re.compile(r"(<!-- measured: (\S+) -->\n)(.*?)(<!-- /measured -->)", re.S)


def render(template: str, load: Callable[[str], Any]) -> str:
    """``template`` with its reports comment removed and every placeholder replaced by the
    figure's median [min–max]; ``load(path)`` reads a report. A one-line ``ValueError`` names a
    placeholder whose alias, figure or format is unknown."""
    paths, body = _reports(template)
    loaded = {alias: load(path) for alias, path in paths.items()}
    found_in = {alias: dict(figures(report)) for alias, report in loaded.items()}

    def figure(m: re.Match[str]) -> str:
        alias, name, fmt = m.groups()
        if alias not in loaded:
            raise ValueError(f"{m.group(0)}: no report named {alias!r} in the template")
        if fmt not in FORMATS:
            raise ValueError(f"{m.group(0)}: unknown format {fmt!r} (one of {sorted(FORMATS)})")
        found = found_in[alias].get(name)
        if found is None:
            plain = number_at(loaded[alias], name)
            if plain is None:
                raise ValueError(f"{m.group(0)}: {paths[alias]} has no figure {name}")
            found = (plain, plain, plain)
        return _show(found, *FORMATS[fmt])

    return PLACEHOLDER.sub(figure, body)


def quoted(template: str) -> dict[str, set[str]]:
    """The figure names ``template`` quotes, by report alias."""
    out: dict[str, set[str]] = {}
    for alias, name, _ in PLACEHOLDER.findall(template):
        out.setdefault(alias, set()).add(name)
    return out


def held_out_check(template: str, load: Callable[[str], Any]) -> dict[str, Any]:
    """Issue 10's rule on the figures ``template`` quotes: for each report pooled from 3 runs
    or more (``bench pool``), each run against the pool of the others, only quoted figures
    (``pool.held_out``). Reports pooled from fewer runs are listed under ``unchecked``."""
    paths, _ = _reports(template)
    out: dict[str, Any] = {"reports": {}, "unchecked": []}
    for alias, names in quoted(template).items():
        try:
            pooled = load(paths[alias])
        except OSError:  # not written yet (the check's own result, on its first run)
            pooled = {}
        runs = [p.get("path") for p in pooled.get("pooled_from", [])]
        if len(runs) < 3:
            out["unchecked"].append(alias)
            continue
        result = held_out([load(p) for p in runs], runs, exactly=names,
                          ignore=list(pooled.get("pooled_differences", {})))
        out["reports"][alias] = {k: result[k] for k in ("figures", "inside")} | {
            "outside": {r["report"]: r["outside"] for r in result["held_out"] if r["outside"]}}
    out["figures"] = sum(r["figures"] for r in out["reports"].values())
    out["inside"] = sum(r["inside"] for r in out["reports"].values())
    return out


def replace_block(readme: str, rendered: Mapping[str, str]) -> str:
    """``readme`` with each ``<!-- measured: TEMPLATE -->`` block replaced by ``rendered``."""
    return BLOCK.sub(lambda m: m.group(1) + rendered[m.group(2)] + m.group(4), readme)


def templates(readme: str) -> list[str]:
    """The templates that ``readme``'s measured blocks name."""
    return [m.group(2) for m in BLOCK.finditer(readme)]


def _show(fig: tuple[float, float, float], scale: float, decimals: int, suffix: str) -> str:
    median, lo, hi = (f"{v * scale:,.{decimals}f}" for v in fig)
    if lo == hi:
        return f"{median}{suffix}"
    return f"{median}{suffix} [{lo}–{hi}]"


def _reports(template: str) -> tuple[dict[str, str], str]:
    """The template's reports (alias -> path) and the text after their comment."""
    head = REPORTS.match(template)
    if not head:
        raise ValueError("the template must start with <!-- reports ... --> naming its reports")
    paths = dict(_alias(line) for line in head.group(1).splitlines() if line.strip())
    return paths, template[head.end():]


def _alias(line: str) -> tuple[str, str]:
    alias, sep, path = line.partition(":")
    if not sep or not alias.strip().isidentifier():
        raise ValueError(f"reports line {line!r} is not 'ALIAS: PATH'")
    return alias.strip(), path.strip()


def register(bench: Any) -> None:
    """Add ``suffixmem bench table`` to the CLI's ``bench`` group."""
    import typer

    @bench.command("table")
    def table_cmd(
        readme: str = typer.Argument("README.md", help="The file with measured blocks."),
        write: bool = typer.Option(False, "--write", help="Replace the blocks in README."),
        check: bool = typer.Option(False, "--check",
                                   help="Exit 1 when a block differs from its rendering."),
        rerun_check: bool = typer.Option(
            False, "--held-out", help="JSON: each pooled run against the pool of the others, "
            "on the quoted figures only."),
    ) -> None:
        """Render the README's measured figures from the committed reports."""
        root = Path(readme).resolve().parent

        def load(path: str) -> Any:
            return json.loads((root / path).read_text(encoding="utf-8"))

        try:
            text = Path(readme).read_text(encoding="utf-8")
            names = templates(text)
            if not names:
                raise ValueError(f"{readme} has no <!-- measured: TEMPLATE --> block")
            sources = {n: (root / n).read_text(encoding="utf-8") for n in names}
            if rerun_check:  # one template's result as is, several by template
                checks = {n: held_out_check(t, load) for n, t in sources.items()}
                print(json.dumps(checks[names[0]] if len(names) == 1 else checks, indent=2))
                return
            rendered = {n: render(t, load) for n, t in sources.items()}
        except (OSError, ValueError) as e:
            raise typer.BadParameter(str(e)) from None
        new = replace_block(text, rendered)
        if write:
            Path(readme).write_text(new, encoding="utf-8")
        elif check:
            if new != text:
                print(f"{readme}'s measured figures differ from their reports; "
                      f"run `suffixmem bench table {readme} --write`")
                raise typer.Exit(1)
        else:
            print("\n".join(rendered.values()))
