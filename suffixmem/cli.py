"""The ``suffixmem`` command line: ``chat``, ``ask``, ``model``, ``bench ...``.

Heavy modules (torch, vLLM) load only inside the commands that need them, so ``--help`` is
instant. Bench commands are contributed by modules with a ``register(bench)`` function.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import typer
from rich.console import Console

from suffixmem.config import DEFAULT_MODEL, ENGINES
from suffixmem.errors import SuffixmemError

console = Console()
err_console = Console(stderr=True)

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="suffixmem: chat with a local LLM whose KV cache lives across turns and sessions.",
)
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print measured figures.")
app.add_typer(bench_app, name="bench")

# modules that contribute `suffixmem bench NAME` commands; missing ones are skipped
BENCH_MODULES = (
    "suffixmem.bench.ttft",
    "suffixmem.bench.engines",
    "suffixmem.bench.segments",
    "suffixmem.bench.layout",
    "suffixmem.bench.topics",
    "suffixmem.bench.retention",
    "benchmarks.chat",
)


@contextlib.contextmanager
def quiet_stdout(active: bool = True) -> Iterator[None]:
    """Send everything written to stdout (vLLM's logs, C++ warnings) to stderr, so that a
    ``--json`` command's stdout holds only its JSON."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _check_engine(name: str) -> None:
    if name not in ENGINES:
        raise typer.BadParameter(f"unknown engine {name!r}; expected one of {list(ENGINES)}")


def _sampling(max_tokens: int, temperature: float | None) -> dict[str, Any]:
    """Sampling options for the manager, validated before paying for an engine start; without
    a temperature the session's semantic temperature applies."""
    from suffixmem.engine.protocol import SamplingParams

    sampling: dict[str, Any] = {"max_tokens": max_tokens}
    if temperature is not None:
        sampling["temperature"] = temperature
    SamplingParams(**sampling)
    return sampling


def _make_manager(engine_name: str, model: str, database: str | None, max_model_len: int) -> Any:
    from suffixmem.conversation.manager import ConversationManager
    from suffixmem.engine import create_engine

    engine = create_engine(engine_name, model=model, max_model_len=max_model_len)
    mgr = ConversationManager(engine, database_url=database)
    # Load the topic detector now rather than inside the first turn (its first build, once per
    # SUFFIXMEM_HOME, fits it on chatterbot-corpus and takes about a minute).
    with err_console.status("preparing the topic detector (first run only: about a minute)"):
        mgr.detector()
    return mgr


def _turn_line(turn: Any) -> str:
    out_tokens = turn.result.output_tokens
    tps = turn.result.decode_tokens_per_s
    jump = " · [yellow]topic jump[/]" if getattr(turn, "topic_jump", False) else ""
    return (
        f"[dim]prompt {turn.prompt_tokens} · cached {turn.cached_tokens} · "
        f"ttft {turn.ttft_s * 1000:.0f} ms · {out_tokens} tokens at {tps:.1f} tok/s · "
        f"temperature {turn.temperature:.2f}{jump}[/]"
    )


@app.command()
def chat(
    engine: str = typer.Option("vllm", help="Engine: vllm (default) or torch."),
    model: str = typer.Option(DEFAULT_MODEL, help="Model name, .gguf file or folder."),
    session: str | None = typer.Option(None, help="Resume this session id."),
    system: str | None = typer.Option(None, help="System prompt for a new session."),
    max_tokens: int = typer.Option(256, help="Reply length limit in tokens."),
    temperature: float | None = typer.Option(
        None, help="Sampling temperature (default: the session's semantic temperature)."),
    database: str | None = typer.Option(None, help="SQLAlchemy URL (default: SQLite file)."),
    max_model_len: int = typer.Option(8192, help="Context window in tokens."),
) -> None:
    """Interactive, streaming chat. Commands: /new, /sessions, /stats, /help, /quit."""
    _check_engine(engine)
    sampling = _sampling(max_tokens, temperature)
    with err_console.status(f"starting the {engine} engine on {model} ..."), quiet_stdout():
        mgr = _make_manager(engine, model, database, max_model_len)
    try:
        info = mgr.open_session(session, system_prompt=system)
        console.print(
            f"[bold]suffixmem[/] chat — session [cyan]{info.id}[/] on {engine}/{model}. "
            "Type /help for commands."
        )
        while True:
            try:
                text = console.input("[bold green]you>[/] ")
            except (EOFError, KeyboardInterrupt):
                console.print()
                break
            text = text.strip()
            if not text:
                continue
            if text.startswith("/"):
                cmd = text.split()[0]
                if cmd in ("/quit", "/exit"):
                    break
                if cmd == "/help":
                    console.print("/new [system prompt] · /sessions · /stats · /quit")
                elif cmd == "/new":
                    rest = text[len("/new"):].strip() or system
                    info = mgr.open_session(None, system_prompt=rest)
                    console.print(f"new session [cyan]{info.id}[/]")
                elif cmd == "/sessions":
                    for s in mgr.list_sessions():
                        mark = "*" if s.id == info.id else " "
                        console.print(
                            f"{mark} [cyan]{s.id}[/] {s.message_count} messages · "
                            f"temperature {s.temperature:.2f} · {s.title or ''}"
                        )
                elif cmd == "/stats":
                    console.print_json(data=mgr.stats(info.id))
                else:
                    console.print(f"[red]unknown command {cmd}[/]; /help lists them")
                continue
            console.print("[bold blue]bot>[/] ", end="")
            try:
                turn = None
                for event in mgr.stream_chat(info.id, text, **sampling):
                    if hasattr(event, "token_id"):
                        console.print(event.text, end="", markup=False, highlight=False)
                    else:
                        turn = event
                console.print()
                if turn is not None:
                    console.print(_turn_line(turn))
            except KeyboardInterrupt:
                console.print("\n[yellow]cancelled; the turn was not stored[/]")
            except SuffixmemError as e:
                console.print(f"\n[red]error:[/] {e}")
    finally:
        mgr.close()
        mgr.engine.close()


@app.command()
def ask(
    text: str = typer.Argument(..., help="The message to send."),
    session: str | None = typer.Option(None, help="Continue this session (created if new)."),
    engine: str = typer.Option("vllm", help="Engine: vllm (default) or torch."),
    model: str = typer.Option(DEFAULT_MODEL, help="Model name, .gguf file or folder."),
    max_tokens: int = typer.Option(256, help="Reply length limit in tokens."),
    temperature: float | None = typer.Option(
        None, help="Sampling temperature (default: the session's semantic temperature)."),
    database: str | None = typer.Option(None, help="SQLAlchemy URL (default: SQLite file)."),
    max_model_len: int = typer.Option(8192, help="Context window in tokens."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """One-shot question; with --session the turn is stored and later turns reuse its cache."""
    _check_engine(engine)
    from suffixmem.errors import InvalidRequestError

    sampling = _sampling(max_tokens, temperature)
    if not text.strip():
        raise InvalidRequestError("the message is empty")
    with quiet_stdout():  # engine start-up logs go to stderr
        mgr = _make_manager(engine, model, database, max_model_len)
    try:
        info = mgr.open_session(session)
        if as_json:
            with quiet_stdout():
                turn = mgr.chat(info.id, text, **sampling)
            print(json.dumps({
                "text": turn.text,
                "session_id": info.id,
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
        turn = None
        for event in mgr.stream_chat(info.id, text, **sampling):
            if hasattr(event, "token_id"):
                console.print(event.text, end="", markup=False, highlight=False)
            else:
                turn = event
        console.print()
        if turn is not None:
            console.print(_turn_line(turn))
        console.print(f"[dim]session {info.id}[/]")
    finally:
        with quiet_stdout(as_json):
            mgr.close()
            mgr.engine.close()


@app.command()
def model(
    name: str = typer.Argument(DEFAULT_MODEL, help="Model name, .gguf file or folder."),
    verify: bool = typer.Option(False, help="Also check every file's sha256."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Provision (once) and describe a model."""
    from suffixmem.models import MODELS, model_info, resolve_model
    from suffixmem.models import verify as verify_folder

    folder = resolve_model(name, progress=not as_json)
    info = model_info(folder)
    if verify:
        info["problems"] = verify_folder(folder, deep=True)
    if name in MODELS:
        info["name"] = name
        info["description"] = MODELS[name].description
    if as_json:
        print(json.dumps(info))
        return
    for key, value in info.items():
        console.print(f"[bold]{key}[/]: {value}")
    if info["problems"]:
        raise typer.Exit(1)


def _register_benches() -> None:
    for module in BENCH_MODULES:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):
                continue  # not built yet
            raise
        mod.register(bench_app)


def main() -> None:
    """Console-script entry point: suffixmem errors print as one clear line, exit code 2."""
    _register_benches()
    try:
        app()
    except SuffixmemError as e:
        err_console.print(f"[red]error:[/] {e}")
        raise SystemExit(2) from e


if __name__ == "__main__":  # pragma: no cover
    main()
