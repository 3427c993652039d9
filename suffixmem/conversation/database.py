"""Database plumbing of the conversation store: engine creation, per-backend settings, and the
Alembic migrations shipped inside the package (``suffixmem/migrations``).

Contract: ``make_engine(url)`` gives a SQLAlchemy engine with the settings the store relies on;
``read_engine(engine)`` the same engine for read-only transactions; ``dbapi_transaction`` one
transaction on a pooled DBAPI connection, begun the same way; ``StatementReader`` one held
SQLite connection for single-statement reads; ``upgrade``/``downgrade``/``current_revision``
run the migrations programmatically (the folder is found from the installed package, never
from the working directory). Every error message shows the URL with its password
masked (``suffixmem.config.mask_url``).

**SQLite transactions.** A transaction that writes starts with ``BEGIN IMMEDIATE``: it takes the
database's single write lock up front, so concurrent writers queue (``busy_timeout``) instead of
failing on a lock upgrade. A read-only transaction (``read_engine``) starts with a plain deferred
``BEGIN``: under WAL it reads a consistent snapshot and never waits for a writer, so one
session's commit does not hold up another session's turn.

**SQLite durability** (``?synchronous=`` in the URL, default ``normal``). File databases run in
WAL mode with ``PRAGMA synchronous=NORMAL``: a commit is appended to the WAL without an fsync
(the WAL is synced at checkpoints). SQLite documents this as safe from corruption, and a crash
of the *process* loses nothing; a power loss or OS crash may lose the last commits (turns) before
the next checkpoint. ``?synchronous=full`` fsyncs every commit (a turn is durable when ``chat``
returns, at about one fsync per turn); ``off`` and ``extra`` are SQLite's other levels. The
parameter is ours: it is removed from the URL before the driver sees it. PostgreSQL's
equivalent is the server's ``synchronous_commit`` setting.

**Writers of one process queue on a lock, not on SQLite's busy handler.** SQLite lets a waiting
``BEGIN IMMEDIATE`` poll the write lock with sleeps of 1, 2, 5, 10, ... ms, so a turn's commit
that meets another session's commit (or the background segment log) lost several ms for a hold
of well under one. ``writer_lock(engine)`` is one ``RLock`` per SQLite file and process, taken
around every write transaction of the store (``dbapi_transaction``, ``Store._tx``,
``Database.transaction``): a waiter wakes as soon as the holder commits. Other processes still
meet the busy handler; PostgreSQL needs no such lock (row locks queue without polling).

``Database(url)`` is an opened, reachable, migrated database with one ``transaction()`` context
for each unit of work.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from suffixmem.config import mask_url
from suffixmem.errors import StoreError


def migrations_dir() -> Path:
    """The folder holding ``alembic.ini``, ``env.py`` and ``versions/``."""
    import suffixmem.migrations

    return Path(suffixmem.migrations.__file__).resolve().parent


def alembic_config(connection: Any = None) -> Any:
    """An Alembic ``Config`` for our migrations, optionally bound to an open connection."""
    from alembic.config import Config

    here = migrations_dir()
    cfg = Config(str(here / "alembic.ini"))
    cfg.set_main_option("script_location", str(here))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def mask(text: str, url: str) -> str:
    """``text`` with the password of ``url`` (if any) replaced by ``***``, first line only."""
    try:
        password = make_url(url).password
    except Exception:
        password = None
    line = text.strip().splitlines()[0] if text.strip() else text
    return line.replace(str(password), "***") if password else line


SYNCHRONOUS = ("off", "normal", "full", "extra")
"""SQLite's ``PRAGMA synchronous`` levels accepted as ``?synchronous=`` (module docstring)."""
_READ_OPTION = "suffixmem_read_only"


def make_engine(url: str) -> Engine:
    """A SQLAlchemy engine for ``url`` with the settings the store relies on.

    SQLite: foreign keys on, WAL journal with ``synchronous`` from the URL (default
    ``normal``), a 30 s busy timeout, ``BEGIN IMMEDIATE`` for transactions that may write and a
    deferred ``BEGIN`` for those of ``read_engine`` (module docstring).
    """
    try:
        parsed = make_url(url)
    except Exception as e:
        # never echo the URL: it may hold a password and cannot be parsed to mask it
        raise StoreError(f"invalid database URL ({type(e).__name__})") from None
    backend = parsed.get_backend_name()
    if backend == "postgres":  # the spelling hosting platforms hand out; SQLAlchemy's is longer
        raise StoreError(f"database URL {mask_url(url)}: SQLAlchemy names PostgreSQL "
                         "'postgresql'; start the URL with postgresql+psycopg://")
    kwargs: dict[str, Any] = {}
    synchronous = "normal"
    if backend == "sqlite":
        given = parsed.query.get("synchronous")
        if given is not None:
            synchronous = str(given if isinstance(given, str) else given[-1]).lower()
            if synchronous not in SYNCHRONOUS:
                raise StoreError(
                    f"database URL {mask_url(url)}: synchronous must be one of "
                    f"{', '.join(SYNCHRONOUS)}, got {given!r}")
            parsed = parsed.difference_update_query(["synchronous"])
            url = parsed.render_as_string(hide_password=False)
        memory = parsed.database in (None, "", ":memory:")
        if not memory and not str(parsed.database).startswith("file:"):
            _create_private(Path(str(parsed.database)))
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        if memory:
            kwargs["poolclass"] = StaticPool  # one shared connection, or each gets an empty DB
    elif backend == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": 5}
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(url, **kwargs)
    except Exception as e:  # missing driver, bad options
        raise StoreError(
            f"cannot use database {mask_url(url)}: {mask(str(e), url)}") from e
    if backend == "sqlite":

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see below)
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            if parsed.database not in (None, "", ":memory:"):
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute(f"PRAGMA synchronous={synchronous.upper()}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            # readers take no lock up front (WAL snapshot); writers take the write lock at once
            read_only = conn.get_execution_options().get(_READ_OPTION, False)
            conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine


@contextlib.contextmanager
def dbapi_transaction(engine: Engine, read: bool = False,
                      writer: contextlib.AbstractContextManager[Any] | None = None
                      ) -> Iterator[Any]:
    """One transaction on a pooled DBAPI connection (yielded), begun as ``engine``'s own
    transactions are (SQLite: ``BEGIN IMMEDIATE``, or a deferred ``BEGIN`` with ``read``) and
    committed at the end (rolled back on an exception). For ``prepared`` statements on the
    per-turn path, where SQLAlchemy's connection and event layer cost more than the SQL; the
    DBAPI's errors are raised as SQLAlchemy's, as ``Connection`` would. A write transaction
    holds ``writer`` (``writer_lock(engine)``) from before its BEGIN until it ended."""
    with writer if writer is not None and not read else _NO_LOCK:
        dbapi_error = engine.dialect.loaded_dbapi.Error
        conn = engine.raw_connection()
        try:
            try:
                if engine.dialect.name == "sqlite":
                    conn.driver_connection.execute("BEGIN" if read else "BEGIN IMMEDIATE")
                yield conn
                conn.commit()
            except dbapi_error as e:
                with contextlib.suppress(dbapi_error):  # the first error is the one to report
                    conn.rollback()
                raise DBAPIError.instance(None, None, e, dbapi_error) from e
            except BaseException:
                with contextlib.suppress(dbapi_error):
                    conn.rollback()
                raise
        finally:
            conn.close()  # back to the pool


class StatementReader:
    """One SQLite connection held for reads of a single statement (the per-turn session row).

    A lone ``SELECT`` on a SQLite connection in autocommit mode is its own read transaction (a
    WAL snapshot that ends with the statement), so it needs neither ``BEGIN`` nor ``COMMIT``,
    and a connection held across turns skips the pool's checkout and check-in: together about
    a sixth of a turn's overhead in a turn's cold caches (docs/profile.md, round 11).
    ``rows`` returns ``None`` when the reader cannot serve (not a SQLite file, another thread
    reading, closed, or a driver error, after which the connection is dropped): the caller then
    reads in a transaction as before, which reports any error. PostgreSQL and in-memory SQLite
    (one connection shared by the pool) never use it."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._error = engine.dialect.loaded_dbapi.Error
        self._usable = (engine.dialect.name == "sqlite"
                        and engine.url.database not in (None, "", ":memory:"))
        self._lock = threading.Lock()
        self._conn: Any = None

    def rows(self, prepared: Any, values: dict[str, Any]) -> list[Any] | None:
        """``prepared.rows`` on the held connection, or ``None`` (class docstring)."""
        if not self._usable or not self._lock.acquire(blocking=False):
            return None
        try:
            if self._conn is None:
                self._conn = self._engine.raw_connection()
            return prepared.rows(self._conn, values)  # type: ignore[no-any-return]
        except (DBAPIError, self._error):  # ``Prepared`` wraps the driver's errors
            self._drop(broken=True)
            return None
        finally:
            self._lock.release()

    def _drop(self, broken: bool = False) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                # a broken connection is discarded; a sound one goes back to the pool
                conn.invalidate() if broken else conn.close()

    def close(self) -> None:
        """Give the connection back; later calls return ``None``."""
        with self._lock:
            self._usable = False
            self._drop()


_WRITERS: dict[str, threading.RLock] = {}
_WRITERS_GUARD = threading.Lock()
_NO_LOCK = contextlib.nullcontext()


def writer_lock(engine: Engine) -> contextlib.AbstractContextManager[Any]:
    """The lock this process's write transactions on ``engine``'s database hold (module
    docstring): one ``RLock`` per SQLite file, shared by every engine of the process on that
    file; a no-op for PostgreSQL and in-memory SQLite (one connection, nothing to queue on).
    Reentrant, so a write transaction opened inside another by the same thread meets SQLite's
    own lock as before rather than deadlocking here."""
    database = engine.url.database
    if engine.dialect.name != "sqlite" or database in (None, "", ":memory:"):
        return _NO_LOCK
    key = os.path.realpath(database)
    with _WRITERS_GUARD:
        return _WRITERS.setdefault(key, threading.RLock())


def read_engine(engine: Engine) -> Engine:
    """``engine`` (same pool, same events) for transactions that only read: on SQLite they
    begin deferred, so they never queue behind a writer (module docstring). A transaction of
    this engine must not write: on SQLite a write in it may fail with ``database is locked``
    instead of waiting."""
    return engine.execution_options(**{_READ_OPTION: True})


def upgrade(url_or_engine: str | Engine, revision: str = "head") -> None:
    """Upgrade the database to ``revision`` (default: the newest). A database already at the
    newest is only read: the upgrade's write lock would make every open (a read-only
    ``sessions list`` included) wait behind any long writer, and fail after its busy timeout."""
    if revision == "head" and current_revision(url_or_engine) == head_revision():
        return
    _migrate(url_or_engine, "upgrade", revision)


@functools.cache
def head_revision() -> str | None:
    """The newest revision this suffixmem ships."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def downgrade(url_or_engine: str | Engine, revision: str = "base") -> None:
    """Downgrade the database to ``revision`` (default: empty)."""
    _migrate(url_or_engine, "downgrade", revision)


def current_revision(url_or_engine: str | Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
    try:
        with read_engine(engine).connect() as conn:  # never queues behind a writer
            return MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as e:
        raise StoreError(
            f"cannot read schema revision of {mask_url(str(engine.url))}: "
            f"{mask(reason(e), engine.url.render_as_string(hide_password=False))}") from e
    finally:
        if isinstance(url_or_engine, str):
            engine.dispose()


# the advisory lock that serialises migrations on PostgreSQL (any fixed 64-bit key)
MIGRATION_LOCK = 0x5346584D454D  # "SFXMEM"


def _migrate(url_or_engine: str | Engine, direction: str, revision: str) -> None:
    from alembic import command
    from alembic.util.exc import CommandError

    engine = make_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
    where = f"cannot {direction} database {mask_url(str(engine.url))} to {revision!r}"
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # processes opening a fresh database at once raced on CREATE TABLE ("duplicate
                # key ... pg_type_typname_nsp_index"); serialised, the later ones find it done.
                # (SQLite's BEGIN IMMEDIATE serialises them already.)
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
            getattr(command, direction)(alembic_config(conn), revision)
    except SQLAlchemyError as e:
        raise StoreError(
            f"{where}: {mask(reason(e), engine.url.render_as_string(hide_password=False))}"
        ) from e
    except CommandError as e:  # a revision this suffixmem does not know: a newer one wrote it
        detail = " ".join(str(e).split())
        raise StoreError(f"{where}: {detail} (a database written by a newer suffixmem? "
                         "upgrade suffixmem, or use another database)") from e
    finally:
        if isinstance(url_or_engine, str):
            engine.dispose()


def reason(e: SQLAlchemyError) -> str:
    orig = getattr(e, "orig", None)
    return str(orig if orig is not None else e).strip().splitlines()[0]


class Database:
    """An opened database: ``engine`` (``make_engine``'s settings), checked reachable, upgraded
    to the newest migration unless ``migrate=False``.

    ``transaction()`` is one unit of work (a SQLAlchemy ``Session``, committed on success,
    rolled back on error). Database failures become ``StoreError`` with the URL's password
    masked, prefixed by ``label``; ``IntegrityError`` passes through as is, for callers that
    retry or report conflicts. ``url`` is the masked URL.
    """

    def __init__(self, url: str, *, migrate: bool = True, label: str = "database") -> None:
        self.url = mask_url(url)  # shown in messages and logs: password masked
        self.label = label
        self._raw_url = url
        self.engine = make_engine(url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.writer = writer_lock(self.engine)
        try:
            with self.engine.connect():
                pass
        except SQLAlchemyError as e:
            self.engine.dispose()
            raise StoreError(
                f"cannot connect to {label} {self.url}: {mask(reason(e), url)}") from e
        if migrate:
            try:
                upgrade(self.engine)
            except StoreError:
                self.engine.dispose()
                raise

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        """One transaction; database failures become ``StoreError``."""
        try:
            with self.writer, self.sessions.begin() as s:
                yield s
        except IntegrityError:
            raise
        except SQLAlchemyError as e:
            raise self.error(e) from e

    def error(self, e: SQLAlchemyError) -> StoreError:
        """``e`` as the one-line ``StoreError`` of this database (password masked)."""
        detail = reason(e) if isinstance(e, DBAPIError) else str(e)
        return StoreError(f"{self.label} {self.url} failed: {mask(detail, self._raw_url)}")

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()


def _create_private(path: Path) -> None:
    """Create a missing SQLite file readable by its owner only (0600; SQLite gives its WAL and
    shared-memory files the same mode): it holds every conversation, and SQLite's own 0644
    let every local user read them. An existing file, or a missing folder (the connect then
    fails with its own message), is left alone."""
    with contextlib.suppress(FileExistsError, FileNotFoundError, NotADirectoryError,
                             PermissionError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
