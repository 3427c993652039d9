"""Importing suffixmem is cheap (no torch, vLLM, scikit-learn, LangChain or LlamaIndex until
used: every CLI start, ``--help`` and one-line errors included, pays for what it imports), and the
packaging holds: the wheel is the ``suffixmem`` package alone, benchmarks are a distribution of
their own reached only through entry points."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib.metadata import entry_points
from pathlib import Path

import pytest

HEAVY = ("torch", "vllm", "transformers", "sklearn", "scipy", "langchain_core", "llama_index")
"""Top-level packages that take a second or more to import: loaded only where they are used."""


def test_import_is_light() -> None:
    code = (
        "import sys, json, suffixmem, suffixmem.cli; "
        f"heavy = {list(HEAVY)!r}; "
        "print(json.dumps({m: m in sys.modules for m in heavy}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == {m: False for m in loaded}, loaded


@pytest.mark.parametrize("args", [["--help"], ["nosuch"], ["ask", "   "]])
def test_a_cli_start_imports_nothing_heavy(args: list[str]) -> None:
    """``--help`` and a one-line usage error return before any model work: none of the heavy
    libraries is imported on the way (``-X importtime`` lists every module imported)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "suffixmem.cli", *args],
                         capture_output=True, text=True)
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0]
                for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert len(imported) > 10  # the listing is there
    assert not imported & set(HEAVY), imported & set(HEAVY)


def test_lazy_public_names_resolve() -> None:
    import suffixmem

    for name in suffixmem.__all__:
        assert getattr(suffixmem, name) is not None


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Every file name inside the wheel ``pip wheel .`` builds from this checkout's root
    distribution (copied first: an in-tree build would write build/ into the checkout)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("suffixmem", "integrations", "benchmarks", "migrations", "tests"):
        if (ROOT / name).is_dir():  # all of them, so the test sees what `find` would see
            shutil.copytree(ROOT / name, src / name, ignore=ignore)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
         "-q", "-w", str(out)], check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("suffixmem-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def test_wheel_installs_only_the_suffixmem_package(wheel_names: list[str]) -> None:
    top = {name.split("/")[0] for name in wheel_names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert len(dist_info) == 1
    assert top - dist_info == {"suffixmem"}  # no integrations, benchmarks, migrations, tests


def test_wheel_ships_the_migrations_as_package_data(wheel_names: list[str]) -> None:
    names = set(wheel_names)
    for f in ("alembic.ini", "script.py.mako", "env.py", "__init__.py"):
        assert f"suffixmem/migrations/{f}" in names, f
    shipped = {n for n in names if n.startswith("suffixmem/migrations/versions/")}
    in_tree = {f"suffixmem/migrations/versions/{p.name}"
               for p in (ROOT / "suffixmem/migrations/versions").glob("*.py")}
    assert in_tree and shipped >= in_tree


def _imported_modules(folder: Path) -> set[str]:
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
    return found


def test_library_and_benchmarks_stay_apart() -> None:
    lib = _imported_modules(ROOT / "suffixmem")
    assert not {m for m in lib if m.split(".")[0] in ("suffixmem_bench", "benchmarks")}
    bench = _imported_modules(ROOT / "benchmarks")
    assert "suffixmem.cli" not in bench
    assert not {m for m in bench if m.split(".")[0] == "benchmarks"}


def test_bench_commands_come_from_the_entry_point_group() -> None:
    import typer

    from suffixmem.cli import BENCH_GROUP, register_benches

    group = {ep.name: ep.value for ep in entry_points(group=BENCH_GROUP)}
    assert group["chat"] == "suffixmem_bench.chat.run:register"
    assert group["topics"] == "suffixmem_bench.topics:register"
    app = typer.Typer()
    loaded = register_benches(app)
    # every command the benchmark distribution declares, and nothing else
    import tomllib

    declared = tomllib.loads((ROOT / "benchmarks/pyproject.toml").read_text())
    expected = set(declared["project"]["entry-points"]["suffixmem.bench"])
    assert {"ttft", "engines", "segments", "layout", "retention", "chat", "topics", "serve",
            "scale", "profile"} <= expected
    assert set(loaded) == expected
    assert {c.name for c in app.registered_commands} == expected


def test_old_top_level_packages_are_gone() -> None:
    code = ("import importlib.util, json; print(json.dumps([m for m in "
            "('integrations', 'benchmarks', 'migrations') if importlib.util.find_spec(m)]))")
    # run outside the checkout so the working directory is not on sys.path
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(tempfile.gettempdir()))
    assert json.loads(out.stdout) == []
