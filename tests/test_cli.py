"""The command line, run as a user runs it (subprocesses on the real model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXE = [sys.executable, "-m", "suffixmem.cli"]


def _run(args: list[str], db: Path, stdin: str | None = None, timeout: int = 300):  # type: ignore[no-untyped-def]
    env = {**os.environ, "SUFFIXMEM_DATABASE_URL": f"sqlite:///{db}"}
    return subprocess.run([*EXE, *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_bad_arguments_fail_fast_with_a_clear_message(tmp_path: Path) -> None:
    r = _run(["ask", "--engine", "nope", "hi"], tmp_path / "db.sqlite")
    assert r.returncode != 0 and "unknown engine 'nope'" in r.stdout + r.stderr
    r = _run(["ask", "--max-tokens", "0", "hi"], tmp_path / "db.sqlite")
    assert r.returncode == 2 and "max_tokens must be > 0" in r.stderr
    r = _run(["ask", "   "], tmp_path / "db.sqlite")
    assert r.returncode == 2 and "empty" in r.stderr


@pytest.mark.slow
def test_ask_json_then_continue_the_session(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    greedy = ["--temperature", "0"]  # sessions otherwise sample at their semantic temperature
    r = _run(["ask", "--json", "--max-tokens", "16", *greedy, "What is the capital of France?"],
             db)
    assert r.returncode == 0, r.stderr[-2000:]
    first = json.loads(r.stdout)  # stdout holds only the JSON object
    assert "Paris" in first["text"]
    for key in ("session_id", "prompt_tokens", "cached_tokens", "ttft_s", "latency_s"):
        assert key in first
    r = _run(["ask", "--json", "--max-tokens", "16", *greedy, "--session", first["session_id"],
              "And the capital of Italy?"], db)
    assert r.returncode == 0, r.stderr[-2000:]
    second = json.loads(r.stdout)
    assert second["session_id"] == first["session_id"]
    assert second["prompt_tokens"] > first["prompt_tokens"]


@pytest.mark.slow
def test_interactive_chat_commands(tmp_path: Path) -> None:
    script = "What is the capital of France?\n/stats\n/sessions\n/new\n/sessions\n/quit\n"
    r = _run(["chat", "--max-tokens", "16", "--temperature", "0"], tmp_path / "db.sqlite",
             stdin=script)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "Paris" in out
    assert "cached" in out and "ttft" in out and "tok/s" in out
    assert "new session" in out
    assert out.count("messages ·") >= 3  # /sessions listed 1, then 2 sessions
