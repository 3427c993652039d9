"""The ``suffixmem`` command line: ``chat``, ``ask``, ``serve``, ``model``, ``sessions ...``,
``bench ...``.

Heavy modules (torch, vLLM) load only inside the commands that need them, so ``--help`` is
instant. ``bench`` commands come from the ``suffixmem.bench`` entry-point group (the separate
``suffixmem-bench`` distribution under benchmarks/); the library never imports them by name.

Every bad input (unknown option values, bad text, an unusable SUFFIXMEM_HOME or database URL,
an unknown session) prints one line on stderr and exits with code 2; the chat REPL reports a
bad line and goes on. Everything that can be checked is checked before the engine starts.
"""

from __future__ import annotations

import io
import json
import sys
import uuid
from importlib.metadata import entry_points
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from suffixmem import repl
from suffixmem.cli_checks import (
    _check_database,
    _check_engine,
    _check_engine_options,
    _check_isolation,
    _check_kv_sizes,
    _check_port,
    _manager_config,
    _preflight,
    check_text,
    session_to_use,
)
from suffixmem.cli_help import unwrap_help
from suffixmem.cli_sessions import sessions_app
from suffixmem.config import DEFAULT_MODEL, suffixmem_home
from suffixmem.errors import ConfigError, SuffixmemError, UnknownSessionError
from suffixmem.stdio import quiet_start, quiet_stdout

try:  # typer >= 0.20 vendors click; older ones use click itself
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import ClickException, NoArgsIsHelpError  # type: ignore[no-redef]

console = Console()
err_console = Console(stderr=True)

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="suffixmem: chat with a local LLM whose KV cache lives across turns and sessions.",
)
bench_app = typer.Typer(
    no_args_is_help=True,
    help="Benchmarks that print measured figures (installed with the suffixmem-bench "
    "distribution, benchmarks/ in the repository).")
app.add_typer(bench_app, name="bench")
app.add_typer(sessions_app, name="sessions")

BENCH_GROUP = "suffixmem.bench"  # entry points: NAME = "module:register", register(bench_app)

UPSTREAM = typer.Option(
    None, "--upstream", metavar="URL",
    help="vLLM server URL for --engine remote (repeat for replicas).")

NEW = typer.Option(False, "--new", metavar="",
                   help="Create the --session id instead of resuming.")

TOPIC_SIGNAL = typer.Option(
    "tfidf", "--topic-signal", help="What topic jumps weigh besides TF-IDF and conversation "
    "cues: tfidf (nothing more), hidden (the served model's hidden states, about 15 ms a turn "
    "at p99) or gain (its context gain, about 170 ms a turn at p99); see docs/conversation.md.")

KV_TIER = typer.Option(
    False, "--kv-tier", metavar="",  # a flag: no value to show in --help
    help="Keep KV blocks that leave the pool on disk ($SUFFIXMEM_HOME/kv, 4 GiB) and load "
    "them back when their session returns, also after a restart (vllm and torch engines; "
    "docs/kv-tier.md).")


def _make_manager(engine_name: str, model: str, database: str, max_model_len: int,
                  upstream: list[str] | None = None, topic_signal: str = "tfidf",
                  kv_tier: bool = False, system: str | None = None) -> Any:
    from suffixmem.conversation.manager import ConversationManager
    from suffixmem.engine import create_engine

    # before the engine: its errors are cheap; "sync": a turn whose commit fails (a full disk)
    # is an error line, not an answer printed as stored
    config = _manager_config(model, topic_signal, durability="sync", system_prompt=system)

    _check_engine_options(engine_name, upstream, kv_tier)
    if engine_name == "remote":
        # the session rows pin each session to its replica, shared by every process
        engine = create_engine("remote", urls=upstream, database_url=database, model=model,
                               max_model_len=max_model_len)
    else:
        engine = create_engine(engine_name, model=model, max_model_len=max_model_len,
                               kv_tier=kv_tier)
    try:
        mgr = ConversationManager(engine, database_url=database, config=config)
        # Load the topic detector (scikit-learn and the shipped IDF, about a second) now rather
        # than inside the first turn, so the first reply's TTFT is the engine's.
        with err_console.status("preparing the topic detector"):
            mgr.detector()
    except BaseException:
        engine.close()
        raise
    return mgr


def _session_to_use(mgr: Any, session: str | None, new: bool) -> str | None:
    """``session_to_use`` once the manager is up (``_preflight`` checked before the engine
    started; this catches another process creating or deleting the session meanwhile)."""
    if session is None:
        return None
    try:
        mgr.get_session(session)
        exists = True
    except UnknownSessionError:
        exists = False
    return session_to_use(exists, session, new)


@app.command()
def chat(
    engine: str = typer.Option("vllm", help="Engine: vllm (default), torch or remote."),
    upstream: list[str] | None = UPSTREAM,
    model: str = typer.Option(DEFAULT_MODEL, help="Model name, .gguf file or folder."),
    session: str | None = typer.Option(
        None, help="Resume this existing session (with --new: start a session with this id)."),
    new: bool = NEW,
    system: str | None = typer.Option(None, help="System prompt for a new session."),
    max_tokens: int = typer.Option(256, help="Reply length limit in tokens."),
    temperature: float | None = typer.Option(
        None, help="Sampling temperature (default: the session's semantic temperature)."),
    database: str | None = typer.Option(None, help="SQLAlchemy URL (default: SQLite file)."),
    max_model_len: int = typer.Option(8192, help="Context window in tokens."),
    topic_signal: str = TOPIC_SIGNAL,
    kv_tier: bool = KV_TIER,
) -> None:
    """Interactive, streaming chat. Commands: /new, /sessions, /stats, /help, /quit."""
    sampling, url = _preflight(engine, max_tokens, temperature, database, session, new,
                               system=system, max_model_len=max_model_len, model=model)
    if isinstance(sys.stdin, io.TextIOWrapper):
        # undecodable bytes become lone surrogates, which check_text rejects line by line,
        # instead of a UnicodeDecodeError that would end the REPL
        sys.stdin.reconfigure(errors="surrogateescape")
    with quiet_start() as terminal, Console(file=terminal).status(
            f"starting the {engine} engine on {model} ..."):
        mgr = _make_manager(engine, model, url, max_model_len, upstream, topic_signal, kv_tier)
    try:
        sid = _session_to_use(mgr, session, new)
        info = (mgr.get_session(sid) if sid is not None and not new
                else mgr.open_session(sid, system_prompt=system))
        console.print(
            f"[bold]suffixmem[/] chat — session [cyan]{escape(info.id)}[/] on {engine}/{model}. "
            "Type /help for commands."
        )
        repl.run(mgr, info, sampling, system, created=sid is None or new)
    finally:
        mgr.close()
        mgr.engine.close()


@app.command()
def ask(
    text: str = typer.Argument(..., help="The message to send."),
    session: str | None = typer.Option(
        None, help="Continue this existing session (with --new: create it with this turn)."),
    new: bool = NEW,
    system: str | None = typer.Option(None, help="System prompt for a new session."),
    engine: str = typer.Option("vllm", help="Engine: vllm (default), torch or remote."),
    upstream: list[str] | None = UPSTREAM,
    model: str = typer.Option(DEFAULT_MODEL, help="Model name, .gguf file or folder."),
    max_tokens: int = typer.Option(256, help="Reply length limit in tokens."),
    temperature: float | None = typer.Option(
        None, help="Sampling temperature (default: the session's semantic temperature)."),
    database: str | None = typer.Option(None, help="SQLAlchemy URL (default: SQLite file)."),
    max_model_len: int = typer.Option(8192, help="Context window in tokens."),
    topic_signal: str = TOPIC_SIGNAL,
    kv_tier: bool = KV_TIER,
    as_json: bool = typer.Option(False, "--json", metavar="", help="Print one JSON object."),
) -> None:
    """One-shot question; the turn is stored (a new session unless --session names one). A
    later ask --session continues it from SQL in a new process, which computes the history
    again. A failed turn stores nothing, not even an empty session."""
    sampling, url = _preflight(engine, max_tokens, temperature, database, session, new,
                               message=text, system=system, max_model_len=max_model_len,
                               model=model)
    with quiet_start():
        mgr = _make_manager(engine, model, url, max_model_len, upstream, topic_signal, kv_tier,
                            system)
    try:
        sid = _session_to_use(mgr, session, new) or uuid.uuid4().hex
        # create=True: the session row is written with the turn's commit, never before it
        if as_json:
            with quiet_stdout():
                turn = mgr.chat(sid, text, create=True, **sampling)
            print(json.dumps({
                "text": turn.text,
                "session_id": turn.session_id,
                "prompt_tokens": turn.prompt_tokens,
                "cached_tokens": turn.cached_tokens,
                "output_tokens": turn.result.output_tokens,
                "ttft_s": turn.ttft_s,
                "latency_s": turn.latency_s,
                "finish_reason": turn.result.finish_reason,
                "temperature": turn.temperature,
                "topic_jump": turn.topic_jump,
            }))
            return
        repl.stream_turn(mgr.stream_chat(sid, text, create=True, **sampling))
        console.print(f"[dim]session {escape(sid)}[/]")
    finally:
        with quiet_stdout(as_json):
            mgr.close()
            mgr.engine.close()


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8000, help="TCP port."),
    engine: str = typer.Option("vllm", help="Engine: vllm (default), torch or remote."),
    model: str = typer.Option(DEFAULT_MODEL, help="Model name, .gguf file or folder."),
    database: str | None = typer.Option(None, help="SQLAlchemy URL (default: SQLite file)."),
    upstream: list[str] | None = UPSTREAM,
    api_key: list[str] | None = typer.Option(  # noqa: B008 - a list option, read-only
        None, metavar="KEY", help="Require this bearer key (repeatable; default: "
        "$SUFFIXMEM_API_KEY, comma-separated). Each key sees only its own sessions."),
    max_model_len: int = typer.Option(8192, help="Context window in tokens."),
    max_pending: int = typer.Option(64, help="Requests in flight before 429."),
    max_body_bytes: int = typer.Option(4 * 1024 * 1024, help="Largest request body (413)."),
    served_model_name: str | None = typer.Option(
        None, help="Model id in /v1/models (default: the model's name)."),
    durability: str = typer.Option(
        "async", help="When a finished turn is stored: async (just after the reply; the "
        "default) or sync (before it is sent). See docs/conversation.md."),
    topic_signal: str = TOPIC_SIGNAL,
    rag_reuse: bool | None = typer.Option(
        None, "--rag-reuse/--no-rag-reuse", help="Reuse retrieved passages and history at new "
        "positions when a client rewrites the passages in its system prompt (torch engine; "
        "default: where the quality gate passed). See docs/segment-reuse.md."),
    kv_tier: bool = KV_TIER,
    kv_tier_gib: float | None = typer.Option(
        None, metavar="GIB", help="The disk tier's budget in GiB (default 4; needs --kv-tier)."),
    kv_cache_gib: float | None = typer.Option(
        None, metavar="GIB", help="The engine's KV pool in memory, in GiB (vllm and torch "
        "engines; default: the engine's)."),
    isolation: str = typer.Option(
        "session", help="Who shares cached KV: session (nothing shared; the default), "
        "public-prefix (sessions share the system prompt's blocks, never history; torch "
        "engine) or app (every session of --tenant shares every block). See "
        "docs/segment-reuse.md."),
    tenant: str = typer.Option("default", help="The tenant whose sessions share KV under "
                               "--isolation public-prefix or app."),
    context_shift: bool = typer.Option(
        True, "--context-shift/--no-context-shift", help="When a history outgrows the window, "
        "reuse the kept turns' KV at their new positions (approximate; torch engine); off: "
        "every turn exact. See docs/segment-reuse.md."),
) -> None:
    """OpenAI-compatible HTTP server with sessions and a web chat page at / (see
    docs/server.md)."""
    import os

    try:
        from suffixmem.server import ServerConfig
        from suffixmem.server import serve as run_server
    except ModuleNotFoundError as e:
        raise ConfigError(f"suffixmem serve needs {e.name}: pip install 'suffixmem[server]'"
                          ) from None

    _check_engine(engine)
    _check_engine_options(engine, upstream, kv_tier)
    sizes = _check_kv_sizes(engine, kv_tier, kv_cache_gib, kv_tier_gib)
    url = _check_database(database, writable=True)
    keys = tuple(api_key or [k.strip() for k in os.environ.get("SUFFIXMEM_API_KEY", "").split(",")
                             if k.strip()])
    config = ServerConfig(api_keys=keys, max_body_bytes=max_body_bytes, max_pending=max_pending,
                          served_model_name=served_model_name)
    # checked before anything starts
    manager_config = _manager_config(model, topic_signal, durability=durability,
                                     rag_reuse=rag_reuse, context_shift=context_shift)
    scope = _check_isolation(engine, isolation, tenant)
    _check_port(host, port)  # after every option: a taken port must not hide a bad option
    run_server(host, port, engine=engine, model=model, database_url=url, config=config,
               max_model_len=max_model_len, upstream=upstream, manager_config=manager_config,
               kv_tier=kv_tier, isolation=scope, engine_options=sizes,
               on_ready=lambda: err_console.print(
                   f"suffixmem: serving on http://{host}:{port} "
                   f"({'API key required' if keys else 'no API key'})"))


@app.command()
def model(
    name: str = typer.Argument(DEFAULT_MODEL, help="Model name, .gguf file or folder."),
    verify: bool = typer.Option(False, help="Also check every file's sha256."),
    as_json: bool = typer.Option(False, "--json", metavar="", help="Print one JSON object."),
) -> None:
    """Provision (once) and describe a model."""
    from suffixmem.models import MODELS, model_info, resolve_model
    from suffixmem.models import verify as verify_folder

    check_text(name, "the model name")
    suffixmem_home()
    folder = resolve_model(name, progress=not as_json)
    info = model_info(folder)
    if verify:
        info["problems"] = verify_folder(folder, deep=True)
    if name in MODELS:
        info["name"] = name
        info["description"] = MODELS[name].description
    if as_json:
        print(json.dumps(info))
    else:
        for key, value in info.items():
            console.print(f"[bold]{key}[/]: {value}")
    if info["problems"]:
        raise typer.Exit(1)  # with --json too: scripts check the status


def register_benches(bench: typer.Typer = bench_app) -> list[str]:
    """Add every ``suffixmem.bench`` entry point's commands to ``bench``; the names loaded.

    An entry point whose own module is not there (a distribution part not built yet) is
    skipped; any other import error is a bug in that benchmark and is raised."""
    loaded = []
    for ep in entry_points(group=BENCH_GROUP):
        try:
            register = ep.load()
        except ModuleNotFoundError as e:
            if e.name and ep.module.startswith(e.name):
                continue
            raise
        register(bench)
        loaded.append(ep.name)
    return loaded


def _one_line(message: str) -> None:
    # line breaks only: spaces inside a quoted value are the value's (a session 'a  b')
    line = " ".join(part.strip() for part in message.strip().splitlines() if part.strip())
    err_console.print(f"[red]error:[/] {escape(line)}", soft_wrap=True)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point. Bad input of any kind (a suffixmem error or a usage error)
    prints one line on stderr and exits with code 2; no traceback."""
    register_benches()
    unwrap_help(app)
    try:
        code = app(args=argv, standalone_mode=False)
    except NoArgsIsHelpError as e:
        e.show()
        raise SystemExit(e.exit_code) from None
    except SuffixmemError as e:
        _one_line(str(e))
        raise SystemExit(2) from None
    except ClickException as e:  # usage errors: unknown option, a value of the wrong type...
        _one_line(e.format_message())
        raise SystemExit(e.exit_code) from None
    except typer.Abort:
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
