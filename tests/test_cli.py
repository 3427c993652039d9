"""The command line, run as a user runs it (subprocesses on the real model).

Every bad input prints exactly one line on stderr and exits with code 2 (issue 18); those that
need no engine are rejected before one starts (no engine log on stderr)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

EXE = [sys.executable, "-m", "suffixmem.cli"]
BAD_BYTE = os.fsdecode(b"caf\xe9 \xff")  # Latin-1 text in argv: not UTF-8


def _run(args: list[str], db: Path, stdin: str | bytes | None = None, timeout: int = 300,
         **env: str):  # type: ignore[no-untyped-def]
    full_env = {**os.environ, "SUFFIXMEM_DATABASE_URL": f"sqlite:///{db}", **env}
    if isinstance(stdin, str):
        stdin = stdin.encode()
    r = subprocess.run([*EXE, *args], input=stdin, capture_output=True, env=full_env,
                       timeout=timeout)
    r.stdout = r.stdout.decode("utf-8", "replace")
    r.stderr = r.stderr.decode("utf-8", "replace")
    return r


def _one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit code 2 and a stderr of exactly one line, ``error: ...``, containing ``needles``."""
    lines = r.stderr.splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _error_lines(r: subprocess.CompletedProcess[str]) -> list[str]:
    """After an engine started (its logs share stderr): the ``error: ...`` lines (in the REPL
    after its ``you>`` prompt), and no traceback anywhere."""
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr[-3000:]
    lines = (r.stdout + "\n" + r.stderr).splitlines()
    return [line[line.index("error: "):] for line in lines if "error: " in line]


def _session_rows(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM sessions").fetchone()[0]


def test_bad_arguments_fail_fast_with_a_clear_message(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    _one_line_error(_run(["ask", "--engine", "nope", "hi"], db), "unknown engine 'nope'")
    _one_line_error(_run(["ask", "--max-tokens", "0", "hi"], db), "max_tokens must be > 0")
    _one_line_error(_run(["ask", "--max-tokens", "abc", "hi"], db), "--max-tokens")
    _one_line_error(_run(["ask", "   "], db), "empty")
    _one_line_error(_run(["nosuch"], db), "nosuch")
    # the texts are checked before the database is opened (docs/errors.md's order)
    bad_db = "postgresql+psycopg://alice:hunter2@db.example:port/chat"
    _one_line_error(_run(["ask", "--database", bad_db, "   "], db), "the message is empty")
    _one_line_error(_run(["chat", "--database", bad_db, "--system", BAD_BYTE], db),
                    "--system is not valid UTF-8")


def test_help_shows_each_docstring_paragraph_as_one_flowing_text(tmp_path: Path) -> None:
    # "ask"'s docstring is wrapped at "(a new session unless --session names one). A\n"; in the
    # command list rich would show that break as a line of its own, cut mid-sentence.
    r = _run(["--help"], tmp_path / "db.sqlite", COLUMNS="300")
    assert r.returncode == 0, r.stderr[-2000:]
    ask = next(line for line in r.stdout.splitlines() if " ask " in line)
    assert "names one). A later ask --session continues it from SQL" in ask, r.stdout
    r = _run(["bench", "--help"], tmp_path / "db.sqlite", COLUMNS="300")
    segments = next(line for line in r.stdout.splitlines() if " segments " in line)
    assert "reuse events, and the defaults per workload class." in segments, r.stdout


def test_non_utf8_arguments_are_one_line_errors(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    _one_line_error(_run(["ask", BAD_BYTE], db), "the message is not valid UTF-8")
    _one_line_error(_run(["ask", "--session", BAD_BYTE, "hi"], db),
                    "--session is not valid UTF-8")
    _one_line_error(_run(["chat", "--system", BAD_BYTE], db), "--system is not valid UTF-8")
    _one_line_error(_run(["model", BAD_BYTE], db), "model name is not valid UTF-8")


def test_unusable_suffixmem_home_is_a_one_line_config_error(tmp_path: Path) -> None:
    a_file = tmp_path / "home-is-a-file"
    a_file.write_text("not a folder")
    # no SUFFIXMEM_DATABASE_URL: the default database lives under SUFFIXMEM_HOME
    env = {k: v for k, v in os.environ.items() if k != "SUFFIXMEM_DATABASE_URL"}
    for home, why in ((a_file, "is a file"), (a_file / "sub", "cannot be created")):
        for args in (["ask", "hi"], ["chat"], ["model"]):
            r = subprocess.run([*EXE, *args], capture_output=True, text=True, timeout=120,
                               env={**env, "SUFFIXMEM_HOME": str(home)})
            _one_line_error(r, "SUFFIXMEM_HOME", why)


def test_blocked_paths_inside_the_home_are_one_line_errors(tmp_path: Path) -> None:
    """A file where ``logs/`` belongs, a folder where the turn lock file belongs: one line
    each, no traceback (found by an outside audit)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "logs").write_text("in the way")
    from suffixmem.config import suffixmem_home

    (home / "models").symlink_to(suffixmem_home() / "models")  # no conversion first
    env = {k: v for k, v in os.environ.items() if k != "SUFFIXMEM_DATABASE_URL"}
    r = subprocess.run([*EXE, "ask", "--engine", "torch", "hi"], capture_output=True,
                       text=True, timeout=120, env={**env, "SUFFIXMEM_HOME": str(home)})
    _one_line_error(r, "engine's start log", "SUFFIXMEM_HOME")
    from suffixmem.conversation.cluster import _file_lock
    from suffixmem.errors import StoreError

    (tmp_path / "db-turns.lock").mkdir()
    with pytest.raises(StoreError, match=r"cannot open the turn lock file .*db-turns\.lock"), \
            _file_lock(str(tmp_path / "db-turns.lock"), "s", 1.0):
        pass


def test_manager_settings_in_the_database_url_place_are_a_clear_type_error() -> None:
    from suffixmem.conversation.manager import ConversationManager, ManagerConfig

    with pytest.raises(TypeError, match=r"database_url must be a string .* config=") as e:
        ConversationManager(object(), ManagerConfig())  # type: ignore[arg-type]
    assert "\n" not in str(e.value)


def test_unparseable_database_url_is_shown_with_its_password_masked(tmp_path: Path) -> None:
    url = "postgresql+psycopg://alice:hunter2@db.example:port/chat"
    for args in (["ask", "--database", url, "hi"], ["chat", "--database", url]):
        line = _one_line_error(_run(args, tmp_path / "db.sqlite"), "cannot parse",
                               "alice:***@db.example")
        assert "hunter2" not in line
    r = _run(["ask", "hi"], tmp_path / "db.sqlite", SUFFIXMEM_DATABASE_URL=url)
    assert "hunter2" not in _one_line_error(r, "alice:***@")


def test_ask_checks_the_database_before_starting_the_engine(tmp_path: Path) -> None:
    unreachable = "postgresql+psycopg://alice:hunter2@127.0.0.1:1/chat"  # nothing listens there
    line = _one_line_error(_run(["ask", "--database", unreachable, "hi"], tmp_path / "x"),
                           "cannot open the database", "alice:***@127.0.0.1:1")
    assert "hunter2" not in line
    missing_dir = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}"
    _one_line_error(_run(["ask", "--database", missing_dir, "hi"], tmp_path / "x"),
                    "cannot open the database")
    # a schema this suffixmem does not know (a newer one migrated it): one line, before the
    # engine starts (it was a 343-line traceback after the start); an unreachable upstream
    # shows that no engine was tried
    future = tmp_path / "future.db"
    with sqlite3.connect(future) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('0099_from_the_future')")
    for command in (["ask", "hi"], ["serve"]):
        _one_line_error(_run([*command, "--database", f"sqlite:///{future}", "--engine",
                              "remote", "--upstream", "http://127.0.0.1:9"], tmp_path / "x"),
                        "0099_from_the_future", "newer suffixmem")


def test_topic_signal_option_builds_the_detector(tmp_path: Path) -> None:
    """``--topic-signal hidden|gain`` (chat, ask, serve): the manager's detector weighs that
    signal of the served model, each with its fitted model; a model it cannot load or an
    unknown signal is a one-line error before any engine starts."""
    from suffixmem.cli import _manager_config
    from suffixmem.context_gain import ContextGain
    from suffixmem.conversation.topic_signals import GAIN_MODEL, HIDDEN_MODEL
    from suffixmem.errors import ConfigError
    from suffixmem.hidden_similarity import HiddenSimilarity

    config = _manager_config("smollm2-135m-instruct", "gain", durability="sync")
    detector = config.topic_detector
    assert isinstance(detector.gain, ContextGain) and detector.model is GAIN_MODEL
    assert config.durability == "sync"
    hidden = _manager_config("smollm2-135m-instruct", "hidden").topic_detector
    assert isinstance(hidden.gain, HiddenSimilarity) and hidden.model is HIDDEN_MODEL
    assert _manager_config("smollm2-135m-instruct").topic_detector is None
    with pytest.raises(ConfigError, match="durability"):  # before the model loads
        _manager_config(str(tmp_path / "none"), "gain", durability="never")
    for command in (["ask", "hi"], ["serve"]):
        _one_line_error(_run([*command, "--topic-signal", "gain", "--model",
                              str(tmp_path / "none")], tmp_path / "x"), "none")
    _one_line_error(_run(["ask", "--topic-signal", "bert", "hi"], tmp_path / "x"),
                    "--topic-signal must be tfidf, hidden or gain")


def test_serve_checks_its_port_before_the_engine_starts(tmp_path: Path) -> None:
    """A port out of range or already taken is one line before the engine starts (uvicorn
    said so after a 30 s start, among 20 lines, and served 99999 nowhere)."""
    import socket

    _one_line_error(_run(["serve", "--port", "99999"], tmp_path / "x"), "--port must be 1..65535")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _one_line_error(_run(["serve", "--port", str(port)], tmp_path / "x"),
                        f"cannot listen on 127.0.0.1:{port}")
    # an engine that cannot start: its one line, and no "serving on" line above it
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    r = _run(["serve", "--engine", "remote", "--upstream", "http://127.0.0.1:9", "--port",
              str(port)], tmp_path / "x")
    assert r.returncode == 2 and "serving on" not in r.stderr, r.stderr[-2000:]
    assert _error_lines(r)[0].startswith("error: no replica answered: http://127.0.0.1:9")


def test_serve_rag_reuse_option_reaches_the_manager_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve --rag-reuse/--no-rag-reuse`` sets ``ManagerConfig.rag_reuse`` (default None:
    the engine's gate decides), ``--no-context-shift`` its ``context_shift``, ``--isolation``
    and ``--tenant`` the engine's scope; the server itself is not started here."""
    import suffixmem.server
    from suffixmem.cli import main

    seen: list[object] = []
    monkeypatch.setattr(suffixmem.server, "serve",
                        lambda *a, **k: seen.append((k["manager_config"].rag_reuse,
                                                     k["manager_config"].context_shift,
                                                     k["isolation"])))
    monkeypatch.setenv("SUFFIXMEM_HOME", str(tmp_path))
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])  # free: serve checks it can listen there
    flags = (["--rag-reuse"], ["--no-rag-reuse"], [], ["--no-context-shift"],
             ["--isolation", "public-prefix", "--tenant", "shop"])
    for flag in flags:
        with pytest.raises(SystemExit) as done:
            main(["serve", "--engine", "torch", "--database", f"sqlite:///{tmp_path}/s.db",
                  "--port", port, *flag])
        assert done.value.code == 0
    default = {"isolation": "session", "tenant": "default"}
    assert seen == [(True, True, default), (False, True, default), (None, True, default),
                    (None, False, default),
                    (None, True, {"isolation": "public-prefix", "tenant": "shop"})]
    # a scope the engine cannot serve: one line before anything starts
    with pytest.raises(SystemExit) as done:
        main(["serve", "--isolation", "public-prefix", "--port", port])
    assert done.value.code == 2 and len(seen) == len(flags)


def test_serve_sizes_the_kv_pool_and_tier(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve --kv-cache-gib/--kv-tier-gib`` reach the engine's options (an operator could
    not size either: the tier was 4 GiB for good); bad sizes are one line before anything
    starts."""
    import socket

    import suffixmem.engine
    from suffixmem.cli import main

    class Stop(Exception):
        pass

    seen: list[dict[str, object]] = []

    def create_engine(name: str, **options: object) -> None:
        seen.append(options)
        raise Stop  # the engine's options are all this test needs

    monkeypatch.setattr(suffixmem.engine, "create_engine", create_engine)
    monkeypatch.setenv("SUFFIXMEM_HOME", str(tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    with pytest.raises(Stop):
        main(["serve", "--engine", "torch", "--port", port, "--kv-cache-gib", "0.5",
              "--kv-tier", "--kv-tier-gib", "2"])
    assert seen[0]["kv_cache_gib"] == 0.5 and seen[0]["kv_tier_gib"] == 2.0
    assert seen[0]["kv_tier"] is True
    for flags, said in ((["--kv-tier-gib", "2"], "--kv-tier-gib needs --kv-tier"),
                        (["--kv-cache-gib", "0"], "--kv-cache-gib must be > 0"),
                        (["--engine", "remote", "--upstream", "http://127.0.0.1:9",
                          "--kv-cache-gib", "1"], "--kv-cache-gib needs --engine vllm")):
        _one_line_error(_run(["serve", "--port", port, *flags], tmp_path / "x"), said)
    assert len(seen) == 1


@pytest.mark.slow
def test_ask_json_then_continue_the_session(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    greedy = ["--temperature", "0"]  # sessions otherwise sample at their semantic temperature
    r = _run(["ask", "--json", "--max-tokens", "16", *greedy, "What is the capital of Japan?"],
             db)
    assert r.returncode == 0, r.stderr[-2000:]
    first = json.loads(r.stdout)  # stdout holds only the JSON object
    assert "Tokyo" in first["text"]
    assert r.stderr == ""  # vLLM's start-up warnings went to the start-up log
    for key in ("session_id", "prompt_tokens", "cached_tokens", "ttft_s", "latency_s"):
        assert key in first
    # continued on the torch engine: the stored session is the engine's business, not the
    # session's (and one vLLM start-up less for the suite)
    r = _run(["ask", "--json", "--max-tokens", "16", *greedy, "--session", first["session_id"],
              "--engine", "torch", "And the capital of Italy?"], db)
    assert r.returncode == 0, r.stderr[-2000:]
    second = json.loads(r.stdout)
    assert second["session_id"] == first["session_id"]
    assert second["prompt_tokens"] > first["prompt_tokens"]


@pytest.mark.slow
def test_ask_kv_tier_serves_a_later_process_from_disk(tmp_path: Path) -> None:
    """``--kv-tier``: a later ``ask`` on the session (a new process) loads its KV from disk;
    without the flag it computes the history again."""
    from suffixmem.config import suffixmem_home

    home = tmp_path / "home"  # a tier of its own, so no earlier run's files can hit
    home.mkdir()
    (home / "models").symlink_to(suffixmem_home() / "models")
    db, env = tmp_path / "db.sqlite", {"SUFFIXMEM_HOME": str(home)}
    greedy = ["--json", "--engine", "torch", "--temperature", "0", "--max-tokens", "8"]
    turns = [(["--kv-tier", "--new"], "What is the capital of Japan? Answer in one sentence."),
             (["--kv-tier"], "And of Italy?"), ([], "And of Spain?")]
    cached = []
    for flags, text in turns:
        r = _run(["ask", *greedy, *flags, "--session", "kvt", text], db, **env)
        assert r.returncode == 0, r.stderr[-2000:]
        cached.append(json.loads(r.stdout)["cached_tokens"])
    assert cached[0] == 0 and cached[1] >= 32 and cached[2] == 0, cached
    assert any((home / "kv").rglob("*")), "the tier wrote its blocks"
    _one_line_error(_run(["ask", "--kv-tier", "--engine", "remote", "--upstream",
                          "http://127.0.0.1:9", "hi"], db, **env), "--kv-tier needs")


@pytest.mark.slow
def test_interactive_chat_commands(tmp_path: Path) -> None:
    script = "What is the capital of Japan?\n/stats\n/sessions\n/new\n/sessions\n/quit\n"
    r = _run(["chat", "--max-tokens", "16", "--temperature", "0"], tmp_path / "db.sqlite",
             stdin=script)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "Tokyo" in out
    assert "cached" in out and "ttft" in out and "tok/s" in out
    assert "new session" in out
    assert out.count("messages ·") >= 3  # /sessions listed 1, then 2 sessions
    assert "temperature 0.00" in out  # the turn's temperature, shown after the turn
    # /new's session ended without a turn: it is not left behind; the answered one stays
    assert _session_rows(tmp_path / "db.sqlite") == 1


@pytest.mark.slow
def test_chat_repl_reports_undecodable_input_and_goes_on(tmp_path: Path) -> None:
    script = b"caf\xe9 \xff\nWhat is the capital of Japan?\n/quit\n"
    r = _run(["chat", "--engine", "torch", "--max-tokens", "16", "--temperature", "0"],
             tmp_path / "db.sqlite", stdin=script)
    assert r.returncode == 0, r.stderr[-2000:]
    errors = _error_lines(r)
    assert errors == ["error: the message is not valid UTF-8 text (undecodable byte at "
                      "character 3)"], errors
    assert "Tokyo" in r.stdout  # the next line was answered
    assert "temperature" in r.stdout


@pytest.mark.slow
def test_unknown_session_is_an_error_not_a_new_session(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    # checked before the engine starts: a model that does not exist is never reached
    absent = ["--engine", "torch", "--model", "/no/such/model"]
    for args in (["chat", "--session", "typo"], ["ask", "--session", "typo", "hi"]):
        r = _run([*args, *absent, "--max-tokens", "4"], db, stdin="hi\n/quit\n")
        assert r.returncode == 2, r.stderr[-2000:]
        assert _error_lines(r) == ["error: unknown session 'typo'"]
        assert _session_rows(db) == 0
    # --new creates it explicitly, and then refuses to create it twice
    r = _run(["ask", "--session", "mine", "--new", "--engine", "torch", "--max-tokens", "4",
              "--system", "You are terse.", "hi"], db)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _session_rows(db) == 1
    with sqlite3.connect(db) as conn:  # ask --system: the new session's system prompt
        assert conn.execute("SELECT system_prompt FROM sessions").fetchone()[0] == \
            "You are terse."
    r = _run(["ask", "--session", "mine", "--new", *absent, "hi"], db)
    assert r.returncode == 2 and _error_lines(r) == [
        "error: --session 'mine' already exists; drop --new to continue it"]
    # options that would be ignored are refused: --new without the id to create, and a
    # --system other than the stored session's own
    _one_line_error(_run(["ask", "--new", *absent, "hi"], db), "--new creates the session")
    _one_line_error(_run(["chat", "--session", "mine", "--system", "Be terse.", *absent], db,
                         stdin="/quit\n"), "session 'mine' has its own")
    # its own system prompt again is no conflict: the model's error comes next
    r = _run(["ask", "--session", "mine", "--system", "You are terse.", *absent, "hi"], db)
    assert r.returncode == 2 and "/no/such/model" in _error_lines(r)[0], r.stderr[-2000:]
    # the same model with a session that exists: now the model's own error
    r = _run(["ask", "--session", "mine", *absent, "hi"], db)
    assert r.returncode == 2 and "/no/such/model" in _error_lines(r)[0], r.stderr[-2000:]


@pytest.mark.slow
def test_failed_ask_leaves_no_empty_session(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    too_long = "lighthouse " * 400  # far more than the 64-token window below
    r = _run(["ask", "--engine", "torch", "--max-model-len", "64", "--max-tokens", "8",
              too_long], db)
    assert r.returncode == 2, r.stderr[-2000:]
    (line,) = _error_lines(r)
    assert "does not fit the context window" in line
    assert _session_rows(db) == 0


@pytest.mark.slow
def test_chat_repl_commands_survive_a_session_deleted_elsewhere(tmp_path: Path) -> None:
    """Another process deletes the REPL's session: /stats reports it in one error line on
    stderr and the REPL goes on (it ended with exit code 2 before); /help shows its
    "[system prompt]" (Rich read it as markup and printed nothing)."""
    import sqlite3

    db = tmp_path / "db.sqlite"
    env = {**os.environ, "SUFFIXMEM_DATABASE_URL": f"sqlite:///{db}"}
    proc = subprocess.Popen([*EXE, "chat", "--engine", "torch", "--session", "gone", "--new"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("/sessions\n")
    proc.stdin.flush()
    while "gone" not in (line := proc.stdout.readline()) or "messages" not in line:
        assert line, proc.stderr.read() if proc.stderr else ""  # EOF: the REPL ended
    with sqlite3.connect(db) as conn:  # the other process
        conn.execute("DELETE FROM sessions WHERE id = 'gone'")
    out, err = proc.communicate("/stats\n/help\n/frobnicate\n/quit\n", timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert [line for line in err.splitlines() if "error: " in line] == [
        "error: unknown session 'gone'", "error: unknown command /frobnicate; /help lists them"]
    assert "/new [system prompt] · /sessions" in out
    assert err.count("\n") == 2 and "error" not in out  # no start-up log, no stray lines


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_chat_ended_by_a_signal_leaves_no_empty_session(tmp_path: Path, sig: int) -> None:
    """`kill` or a closed terminal ends `chat` as /quit does: its session, opened up front
    and never answered, is deleted (Python's default for these signals ended the process
    at once and left a 0-message session in `sessions list`)."""
    db = tmp_path / "db.sqlite"
    env = {**os.environ, "SUFFIXMEM_DATABASE_URL": f"sqlite:///{db}"}
    proc = subprocess.Popen([*EXE, "chat", "--engine", "torch"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("/sessions\n")
    proc.stdin.flush()
    while "0 messages" not in (line := proc.stdout.readline()):
        assert line, proc.stderr.read() if proc.stderr else ""  # EOF: the REPL ended
    assert _session_rows(db) == 1  # opened up front
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert _session_rows(db) == 0


def _without_root_override() -> list[str]:
    """A command prefix that drops root's override of file modes (CI runs as root)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux): file modes do not apply")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}"]


def test_a_read_only_database_is_refused_before_the_engine_starts(tmp_path: Path) -> None:
    """``ask`` answered, printed a session id and exited 0 while every commit failed behind it
    (``chat`` likewise, turn after turn); now a database it cannot write is one line, before
    the engine starts, and ``sessions vacuum`` on it too (it was a traceback)."""
    db = tmp_path / "ro.db"
    from suffixmem.conversation.store import Store

    Store(f"sqlite:///{db}").close()
    db.chmod(0o444)
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "SUFFIXMEM_HOME": str(home), "SUFFIXMEM_DATABASE_URL": f"sqlite:///{db}"}
    for args in (["ask", "--engine", "torch", "hi"], ["sessions", "vacuum"]):
        r = subprocess.run([*_without_root_override(), *EXE, *args], capture_output=True,
                           text=True, env=env, timeout=120)
        _one_line_error(r, "readonly database")


def test_bad_model_window_and_options_are_one_line_errors(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    fake = tmp_path / "fake.gguf"
    fake.write_text("junk")
    _one_line_error(_run(["ask", "--model", str(fake), "hi"], db), "is not a GGUF file")
    folder = tmp_path / "notamodel"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    _one_line_error(_run(["ask", "--engine", "torch", "--model", str(folder), "hi"], db),
                    "is not a causal LM folder", "num_attention_heads")
    _one_line_error(_run(["model", str(fake)], db), "is not a GGUF file")
    # vLLM's own check was a 159-line pydantic traceback
    _one_line_error(_run(["ask", "--max-model-len", "100000", "hi"], db),
                    "max_model_len 100000 exceeds the model's context of 8192 tokens")
    # checked before the engine starts (they were checked after it, or on every turn)
    _one_line_error(_run(["ask", "--max-tokens", "8192", "hi"], db),
                    "max_tokens=8192 alone fills the context window of 8192 tokens")
    # a window under the floor names its own flag, not --max-tokens
    _one_line_error(_run(["ask", "--max-model-len", "10", "hi"], db),
                    "--max-model-len must be >= 32, got 10")
    _one_line_error(_run(["chat", "--system", "  "], db), "--system is empty")
    _one_line_error(_run(["ask", "--engine", "remote", "--upstream", "notaurl", "hi"], db),
                    "--upstream 'notaurl' is not an http(s) URL")
    # a quoted value keeps its spaces (they were collapsed: 'a b' named another session)
    _one_line_error(_run(["ask", "--session", "a  b", "hi"], db), "unknown session 'a  b'")
