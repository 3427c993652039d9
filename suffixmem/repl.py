"""The interactive loop of ``suffixmem chat``: read a line, run a command or stream a turn,
show its figures; a bad line or a failed turn prints one ``error: ...`` line on stderr and the
loop goes on (docs/errors.md). The command line's options and engine start-up are ``cli``'s."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from suffixmem.cli_checks import check_text
from suffixmem.errors import SuffixmemError

if TYPE_CHECKING:  # the manager loads lazily: --help and bad options stay fast
    from suffixmem.conversation.manager import ConversationManager, SessionInfo

console = Console()
err_console = Console(stderr=True)

# \[: Rich markup, not a tag
HELP = "/new \\[system prompt] · /sessions · /stats · /help · /quit (or /exit)"


def run(mgr: ConversationManager, info: SessionInfo, sampling: dict[str, Any],
        system: str | None, *, created: bool = False) -> None:
    """Chat on ``info``'s session until /quit, the end of input, SIGTERM or SIGHUP (a closed
    terminal). A session this chat ``created`` (and each one /new opens) is deleted again if
    it ends without a stored turn, so an abandoned chat leaves nothing behind, as a failed
    ``ask`` does (only SIGKILL skips that)."""
    opened = {info.id} if created else set()
    try:
        with _signals_end_the_chat():
            _loop(mgr, info, sampling, system, opened)
    finally:
        for sid in opened:
            drop_if_empty(mgr, sid)


@contextmanager
def _signals_end_the_chat() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``SystemExit`` (128 + the signal, the shell's convention)
    in the loop, so the cleanup in ``run`` and the caller's ``close`` run. Python's default
    ends the process at once, which left an empty session and an unclosed engine."""
    def end(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():  # signal.signal refuses
        yield
        return
    wanted = [s for s in ("SIGTERM", "SIGHUP") if hasattr(signal, s)]
    before = {name: signal.signal(getattr(signal, name), end) for name in wanted}
    try:
        yield
    finally:
        for name, handler in before.items():
            signal.signal(getattr(signal, name), handler)


def drop_if_empty(mgr: ConversationManager, session_id: str) -> None:
    """Delete ``session_id`` if it has no message (best effort: the chat is ending)."""
    try:
        if mgr.get_session(session_id).message_count == 0:
            mgr.delete_session(session_id)
    except SuffixmemError:  # deleted or unreachable meanwhile: nothing to leave behind
        pass


def _loop(mgr: ConversationManager, info: SessionInfo, sampling: dict[str, Any],
          system: str | None, opened: set[str]) -> None:
    while (line := read_line()) is not None:
        text = line.strip()
        if not text:
            continue
        try:
            check_text(text, "the message")
            if text.startswith("/"):
                if text.split()[0] in ("/quit", "/exit"):
                    break
                now = command(mgr, info, text, system)
                if now.id != info.id:  # /new opened it
                    opened.add(now.id)
                info = now
                continue
            stream_turn(mgr.stream_chat(info.id, text, **sampling), "[bold blue]bot>[/] ")
        except KeyboardInterrupt:
            console.print("[yellow]cancelled; the turn was not stored[/]")
        except SuffixmemError as e:  # one line on stderr, then the next prompt
            error(str(e))


def error(message: str) -> None:
    err_console.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)


def command(mgr: ConversationManager, info: SessionInfo, text: str, system: str | None
            ) -> SessionInfo:
    """Run one REPL command (a line starting with "/"); returns the session now in use. A
    library error (the session deleted by another process, say) reaches the loop's handler."""
    cmd = text.split()[0]
    if cmd == "/help":
        console.print(HELP)
    elif cmd == "/new":
        info = mgr.open_session(None, system_prompt=text[len("/new"):].strip() or system)
        console.print(f"new session [cyan]{info.id}[/]")
    elif cmd == "/sessions":
        for s in mgr.list_sessions():
            mark = "*" if s.id == info.id else " "
            console.print(f"{mark} [cyan]{escape(s.id)}[/] {s.message_count} messages · "
                          f"temperature {s.temperature:.2f} · {escape(s.title or '')}")
    elif cmd == "/stats":
        console.print_json(data=mgr.stats(info.id))
    else:
        error(f"unknown command {cmd}; /help lists them")
    return info


def turn_line(turn: Any) -> str:
    """The figures shown after every turn, the sampling temperature it used included."""
    out_tokens = turn.result.output_tokens
    tps = turn.result.decode_tokens_per_s
    jump = " · [yellow]topic jump[/]" if turn.topic_jump else ""
    return (
        f"[dim]prompt {turn.prompt_tokens} · cached {turn.cached_tokens} · "
        f"ttft {turn.ttft_s * 1000:.0f} ms · {out_tokens} tokens at {tps:.1f} tok/s · "
        f"temperature {turn.temperature:.2f}{jump}[/]"
    )


def stream_turn(events: Any, prefix: str = "") -> Any:
    """Print a turn's tokens as they come, after ``prefix``; the final ``TurnResult`` (or
    None). The prefix waits for the first event, so a turn refused before it starts (the
    context window, say) leaves stdout alone, and a started line is always ended."""
    turn = None
    started = False
    try:
        for event in events:
            if not started:
                console.print(prefix, end="")
                started = True
            if hasattr(event, "token_id"):
                console.print(event.text, end="", markup=False, highlight=False)
            else:
                turn = event
    finally:
        if started:
            console.print()
    if turn is not None:
        console.print(turn_line(turn))
    return turn


def read_line() -> str | None:
    """One line of input, None at end of input. Undecodable bytes come back as lone
    surrogates (stdin uses surrogateescape) so the loop can reject the line and go on."""
    try:
        return console.input("[bold green]you>[/] ")
    except (EOFError, KeyboardInterrupt):
        console.print()
        return None
