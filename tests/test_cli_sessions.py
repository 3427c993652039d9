"""``suffixmem sessions list|show|delete|vacuum``: stored sessions managed without an engine
(an operator had only the REPL, the HTTP API or Python, and SQLite never gave space back)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suffixmem.conversation.records import NewMessage, TurnEvent
from suffixmem.conversation.store import Store


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "suffixmem.cli", "sessions", *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def test_list_show_delete_vacuum(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    store = Store(url)
    store.open_session("keep", system_prompt="Be brief.")
    store.append_messages("keep", [NewMessage("user", "Hi"), NewMessage("assistant", "Hello!")])
    store.commit_turn("keep", [NewMessage("user", "Tell me about Mars."),
                               NewMessage("assistant", "A red planet.")],
                      TurnEvent(prompt_tokens=9, cached_tokens=0, ttft_s=0.1, latency_s=0.2,
                                temperature=0.0, topic_jump=True), temperature=0.0,
                      window_start=0)
    store.set_temperature_range("keep", 0.7, 0.1, lambda t: max(0.1, t))
    for i in range(60):  # enough rows that deleting them frees pages
        store.open_session(f"old{i}")
        store.append_messages(f"old{i}", [NewMessage("user", "x" * 2000)])
    store.close()

    r = _run("list", "--json", "--database", url)
    assert r.returncode == 0, r.stderr
    listed = {s["id"]: s["messages"] for s in json.loads(r.stdout)}
    assert listed["keep"] == 4 and len(listed) == 61
    r = _run("show", "keep", "--json", "--database", url)
    shown = json.loads(r.stdout)
    assert shown == {
        "id": "keep", "system_prompt": "Be brief.", "temperature": 0.1,
        "temperature_hot": 0.7, "temperature_cold": 0.1, "messages": [
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Tell me about Mars."},
            {"role": "assistant", "content": "A red planet."}],
        "turns": [{"prompt_tokens": 9, "cached_tokens": 0, "completion_tokens": 0,
                   "ttft_s": 0.1, "temperature": 0.0, "topic_jump": True,
                   "message_index": 3}]}, shown
    # the text form: the session's temperature and range, each reply's turn below it
    out = _run("show", "keep", "--database", url).stdout.splitlines()
    assert out[0] == "temperature 0.10 (its own range: hot 0.7, cold 0.1)"
    assert out[-2:] == ["assistant: A red planet.", "temperature 0.00 · topic jump"]

    r = _run("delete", *[f"old{i}" for i in range(60)], "--database", url)
    assert r.returncode == 0, r.stderr
    size = db.stat().st_size
    assert _run("vacuum", "--database", url).returncode == 0
    assert db.stat().st_size < size / 2  # the deleted sessions' pages went back
    r = _run("list", "--json", "--database", url)
    assert [s["id"] for s in json.loads(r.stdout)] == ["keep"]

    r = _run("show", "gone", "--database", url)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == ["error: unknown session 'gone'"]
    r = _run("delete", "gone", "--database", url)
    assert r.returncode == 2 and "unknown session 'gone'" in r.stderr


@pytest.mark.postgres
def test_vacuum_and_list_on_postgresql(fresh_pg_database: str) -> None:
    store = Store(fresh_pg_database)
    store.open_session("pg")
    store.append_messages("pg", [NewMessage("user", "Hi")])
    store.close()
    assert _run("delete", "pg", "--database", fresh_pg_database).returncode == 0
    r = _run("vacuum", "--database", fresh_pg_database)
    assert r.returncode == 0, r.stderr
    assert json.loads(_run("list", "--json", "--database", fresh_pg_database).stdout) == []


def test_delete_removes_the_sessions_kv_tier_folders(tmp_path: Path) -> None:
    from suffixmem.engine.kv_tier import salt_digest

    url = f"sqlite:///{tmp_path / 's.db'}"
    store = Store(url)
    for sid in ("gone", "kept"):
        store.open_session(sid)
        for model in ("model-a", "model-b"):  # one tier folder per model fingerprint
            folder = tmp_path / "kv" / model / salt_digest(sid)
            folder.mkdir(parents=True)
            (folder / "block.kv").write_bytes(b"x")
    store.close()
    r = _run("delete", "gone", "--database", url, SUFFIXMEM_HOME=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "2 KV-tier files" in r.stdout
    assert not list((tmp_path / "kv").glob(f"*/{salt_digest('gone')}"))
    assert len(list((tmp_path / "kv").glob(f"*/{salt_digest('kept')}/block.kv"))) == 2


def test_delete_finds_tier_files_in_a_configured_folder(tmp_path: Path) -> None:
    from suffixmem.engine.kv_tier import salt_digest

    url = f"sqlite:///{tmp_path / 's.db'}"
    store = Store(url)
    store.open_session("gone")
    store.close()
    folder = tmp_path / "elsewhere" / "model-a" / salt_digest("gone")  # EngineConfig.kv_tier_dir
    folder.mkdir(parents=True)
    (folder / "block.kv").write_bytes(b"x")
    r = _run("delete", "gone", "--database", url, "--kv-tier-dir", str(tmp_path / "elsewhere"),
             SUFFIXMEM_HOME=str(tmp_path / "home"))
    assert r.returncode == 0, r.stderr
    assert "1 KV-tier file\n" in r.stdout and not folder.exists()


def test_a_database_path_that_names_no_file_is_an_error_not_a_new_database(
        tmp_path: Path) -> None:
    typo = tmp_path / "typo.db"
    for args in (["list"], ["show", "x"], ["delete", "x"]):
        r = _run(*args, "--database", f"sqlite:///{typo}")
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            f"error: no database at sqlite:///{typo} (no such file)"], r.stderr
    assert not typo.exists()
    Store(f"sqlite:///{typo}").close()
    r = _run("list", "--database", f"sqlite:///{typo}")
    assert r.returncode == 0 and r.stdout.strip() == "no sessions"  # it printed nothing
