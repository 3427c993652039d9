"""Smoke tests: every example runs as written, on the real model, with few tokens."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from suffixmem.conversation.store import Store

ROOT = Path(__file__).resolve().parents[1]
FIGURES = re.compile(r"\[(\d+) prompt tokens, (\d+) from cache")

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def run(example: str, *args: str, stdin: str | None = None) -> tuple[str, list[tuple[int, int]]]:
    """Run ``examples/<example>``; returns its stdout and each turn's (prompt, cached) tokens.

    The timeout is generous: on a fresh ``SUFFIXMEM_HOME`` the terminal chatbot's first turn
    trains the manager's topic detector (minutes on a loaded 2-core machine)."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / example), *args],
        input=stdin, capture_output=True, text=True, timeout=880, cwd=ROOT, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = [(int(p), int(c)) for p, c in FIGURES.findall(proc.stderr)]
    return proc.stdout, figures


def replies(stdout: str) -> list[str]:
    return [line[len("bot> "):] for line in stdout.splitlines() if line.startswith("bot> ")]


def check_turns(stdout: str, figures: list[tuple[int, int]], turns: int) -> None:
    answers = replies(stdout)
    assert len(answers) == turns and all(a.strip() for a in answers), stdout
    assert len(figures) == turns, figures
    # the first turn is new; every later one reads the earlier turns from cache
    assert figures[0][1] == 0 and all(c > 0 for _, c in figures[1:]), figures
    assert [p for p, _ in figures] == sorted(p for p, _ in figures)


def test_langchain_chain(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lc.db'}"
    stdout, figures = run(
        "langchain_chain.py", "--max-tokens", "24", "--database-url", url, "--session", "s",
        "What is bread?", "And cake?", "Which is sweeter?")
    check_turns(stdout, figures, 3)
    stored = Store(url).messages("s")
    # each turn once (the manager stored it; the history saw it was there), with its ids
    assert [m.role for m in stored] == ["user", "assistant"] * 3
    assert all(m.token_ids for m in stored if m.role == "assistant")


def test_llama_index_chat(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'li.db'}"
    stdout, figures = run(
        "llama_index_chat.py", "--max-tokens", "24", "--database-url", url, "--session", "s",
        "What is bread?", "And cake?", "Which is sweeter?")
    check_turns(stdout, figures, 3)
    stored = Store(url).messages("s")
    assert [m.role for m in stored] == ["user", "assistant"] * 3
    assert all(m.token_ids for m in stored if m.role == "assistant")


def test_terminal_chatbot(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tc.db'}"
    stdin = "What is the capital of Japan?\n\nAnd of Italy?\n/quit\nnever read\n"
    stdout, figures = run(
        "terminal_chatbot.py", "--max-tokens", "24", "--database-url", url, "--session", "s",
        "--temperature", "0", stdin=stdin)
    check_turns(stdout, figures, 2)
    assert "Tokyo" in replies(stdout)[0]
    assert [m.role for m in Store(url).messages("s")] == ["user", "assistant"] * 2
