"""``suffixmem sessions ...``: the stored sessions of a database, without starting an engine:
``list``, ``show``, ``delete`` and ``vacuum`` (give a deleted session's space back to the file
system). Everything goes through ``Store`` (its transactions, its one-line errors); ``--json``
prints machine-readable output. ``delete`` also removes the session's KV-tier folders under
``$SUFFIXMEM_HOME/kv`` or ``--kv-tier-dir`` (every model's), as
``ConversationManager.delete_session`` does; a running engine's tier reads their blocks as
misses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from suffixmem.cli_checks import _check_database, check_text

console = Console()
sessions_app = typer.Typer(no_args_is_help=True,
                           help="List, show, delete stored sessions; vacuum the database.")

DATABASE = typer.Option(None, help="SQLAlchemy URL (default: SQLite file).")
AS_JSON = typer.Option(False, "--json", metavar="", help="Print JSON.")


def _store(database: str | None) -> Any:
    """The store of the database: these commands manage sessions that exist, so a SQLite
    path given that names no file (a typo) is an error, not a new empty database."""
    from sqlalchemy.engine import make_url

    from suffixmem.config import database_url, mask_url
    from suffixmem.conversation.store import Store
    from suffixmem.errors import StoreError

    url = database_url(database)  # parsed here: a bad URL is its one-line ConfigError
    parsed = make_url(url)
    path = parsed.database if parsed.get_backend_name() == "sqlite" else None
    if database is not None and path and path != ":memory:" and not Path(path).exists():
        raise StoreError(f"no database at {mask_url(url)} (no such file)")
    return Store(_check_database(url))


@sessions_app.command("list")
def list_sessions(database: str | None = DATABASE, as_json: bool = AS_JSON) -> None:
    """Every session, most recently active first."""
    store = _store(database)
    try:
        rows = store.list_sessions()
    finally:
        store.close()
    if as_json:
        print(json.dumps([{"id": r.id, "title": r.title, "messages": r.message_count,
                           "model": r.model, "temperature": r.temperature,
                           "created_at": r.created_at.isoformat(),
                           "updated_at": r.updated_at.isoformat()} for r in rows]))
        return
    if not rows:
        console.print("no sessions", style="dim")
    for r in rows:
        console.print(f"[cyan]{escape(r.id)}[/] {r.message_count} messages · "
                      f"{r.updated_at:%Y-%m-%d %H:%M} · {escape(r.title or '')}", soft_wrap=True)


@sessions_app.command("show")
def show(session: str = typer.Argument(..., help="The session id."),
         database: str | None = DATABASE, as_json: bool = AS_JSON) -> None:
    """A session's system prompt, temperature and messages, each reply with its turn's
    sampling temperature and topic jump (--json: also the turns' figures, as the server's
    GET /v1/sessions/{id} gives them)."""
    from suffixmem.conversation.records import turn_summaries

    check_text(session, "the session id")
    store = _store(database)
    try:
        rec = store.require_session(session)
        messages = store.messages(session)
        turns = turn_summaries([m.position for m in messages], store.turn_events(session))
    finally:
        store.close()
    if as_json:
        print(json.dumps({"id": rec.id, "system_prompt": rec.system_prompt,
                          "temperature": rec.temperature, "temperature_hot": rec.temperature_hot,
                          "temperature_cold": rec.temperature_cold,
                          "messages": [{"role": m.role, "content": m.content}
                                       for m in messages], "turns": turns}))
        return
    own = ("" if rec.temperature_hot is None and rec.temperature_cold is None else
           f" (its own range: hot {rec.temperature_hot}, cold {rec.temperature_cold})")
    console.print(f"[dim]temperature {rec.temperature:.2f}{own}[/]")
    if rec.system_prompt:
        console.print(f"[dim]system:[/] {escape(rec.system_prompt)}", soft_wrap=True)
    of_reply = {t["message_index"]: t for t in turns if t["message_index"] is not None}
    for i, m in enumerate(messages):
        console.print(f"[bold]{m.role}:[/] {escape(m.content)}", soft_wrap=True)
        if (t := of_reply.get(i)) is not None:
            jump = " · [yellow]topic jump[/]" if t["topic_jump"] else ""
            console.print(f"[dim]temperature {t['temperature']:.2f}{jump}[/]")


@sessions_app.command("delete")
def delete(sessions: list[str] = typer.Argument(..., help="Session ids."),  # noqa: B008
           database: str | None = DATABASE,
           kv_tier_dir: str | None = typer.Option(
               None, help="The KV tier's folder, where an engine was given one "
                          "(EngineConfig.kv_tier_dir; default: $SUFFIXMEM_HOME/kv).")) -> None:
    """Delete sessions with their messages and statistics; an unknown id is an error, after
    the known ones before it were deleted."""
    for sid in sessions:
        check_text(sid, "the session id")
    store = _store(database)
    try:
        for sid in sessions:
            store.delete_session(sid)
            files = _delete_tier_files(sid, kv_tier_dir)
            console.print(f"deleted [cyan]{escape(sid)}[/]"
                          + (f" and {files} KV-tier file{'s' * (files > 1)}" if files else ""))
    finally:
        store.close()


def _delete_tier_files(session_id: str, configured: str | None) -> int:
    """Remove the session's folders of the KV tier (one per model); how many files."""
    import shutil

    from suffixmem.config import kv_tier_dir
    from suffixmem.engine.kv_tier import salt_digest

    files = 0
    for folder in kv_tier_dir(configured).glob(f"*/{salt_digest(session_id)}"):
        files += sum(1 for p in folder.rglob("*") if p.is_file())
        shutil.rmtree(folder, ignore_errors=True)
    return files


@sessions_app.command("vacuum")
def vacuum(database: str | None = DATABASE) -> None:
    """Give the space of deleted sessions back to the file system (SQLite's and PostgreSQL's
    VACUUM; SQLite keeps freed pages in the file until then)."""
    from suffixmem.config import mask_url
    from suffixmem.conversation.database import make_engine
    from suffixmem.errors import StoreError

    url = _check_database(database)
    engine = make_engine(url)
    raw = engine.raw_connection()
    try:
        # VACUUM cannot run inside a transaction: the driver's own autocommit, since our
        # engine begins SQLite transactions itself (database.make_engine)
        driver = raw.driver_connection
        if engine.dialect.name == "sqlite":
            driver.isolation_level = None  # type: ignore[union-attr]
        else:
            driver.autocommit = True  # type: ignore[union-attr]
        driver.execute("VACUUM")  # type: ignore[union-attr]
    except Exception as e:  # the driver's own error (a read-only file): one line
        raise StoreError(f"vacuum of {mask_url(url)} failed: {e}") from None
    finally:
        raw.close()
        engine.dispose()
    console.print("vacuumed")
