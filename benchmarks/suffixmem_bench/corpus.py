"""Real text for benchmarks: Python's own standard-library documentation.

Generated filler would flatter caches (repetitive text) and models alike; module docstrings
are real prose that every Python installation carries.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence

STDLIB_MODULES: tuple[str, ...] = (
    "json", "collections", "functools", "itertools", "pathlib", "argparse", "logging",
    "threading", "asyncio", "subprocess", "datetime", "decimal", "fractions", "statistics",
    "contextlib", "dataclasses", "typing", "heapq", "bisect", "textwrap", "string", "re",
    "shutil", "tempfile", "csv", "sqlite3", "zipfile", "tarfile", "hashlib", "random",
)


def stdlib_paragraphs(modules: Sequence[str] = STDLIB_MODULES) -> list[str]:
    """Non-trivial paragraphs of the named modules' docstrings and their public members'."""
    out: list[str] = []
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ImportError:  # pragma: no cover - every CPython has these
            continue
        docs = [inspect.getdoc(mod) or ""]
        for attr in sorted(getattr(mod, "__all__", []) or dir(mod)):
            if attr.startswith("_"):
                continue
            obj = getattr(mod, attr, None)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                docs.append(inspect.getdoc(obj) or "")
        for doc in docs:
            for para in doc.split("\n\n"):
                para = " ".join(para.split())
                if len(para) > 80:
                    out.append(para)
    return out


def reference_text(
    n_tokens: int, count: Callable[[str], int], skip: int = 0,
    modules: Sequence[str] = STDLIB_MODULES,
) -> str:
    """About ``n_tokens`` tokens (by ``count``) of consecutive documentation paragraphs,
    starting ``skip`` paragraphs in (different ``skip`` gives different text)."""
    paras = stdlib_paragraphs(modules)
    if not paras:
        raise RuntimeError("no standard-library documentation found")
    picked: list[str] = []
    total = 0
    i = skip
    while total < n_tokens:
        para = paras[i % len(paras)]
        picked.append(para)
        total += count(para) + 1
        i += 1
    return "\n\n".join(picked)
