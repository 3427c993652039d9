"""SQL statements compiled once for a database dialect and run on the DBAPI cursor.

A turn's read and commit are a handful of small statements. Through SQLAlchemy's execution
layer each costs ~50 us of Python on a hot CPU and ~3x that right after a decode has flushed
the caches, several times the statement itself in SQLite (~5 us); on the path from the last
token to the caller that was most of ``manager_overhead_ms``. ``Prepared`` keeps SQLAlchemy for
what it is good at (the SQL text in the dialect's syntax and paramstyle, the types' bind and
result conversions, the transaction with its ``BEGIN IMMEDIATE`` hook and the pool) and runs the
compiled text on the transaction's own DBAPI cursor.

Contract: ``Prepared(stmt, dialect, column_keys)`` compiles ``stmt`` once (``column_keys``: an
INSERT's columns). ``run(conn, params)`` / ``run_many(conn, rows)`` execute it on a DBAPI
connection (``database.dbapi_transaction``) or on a SQLAlchemy ``Connection``'s own, inside
the transaction it holds, with the same parameter
names the statement's ``bindparam``\\ s (or columns) have; ``rows(...)`` returns the result rows
converted as SQLAlchemy would (e.g. SQLite's stored datetimes parsed), with attribute access by
column key. DBAPI errors are raised as SQLAlchemy's (``IntegrityError``, ``OperationalError``,
...), so callers handle them as for ``Connection.execute``.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.sql import ClauseElement


def _dbapi(conn: Any) -> Any:
    return conn.connection if isinstance(conn, Connection) else conn


def _result_processor(type_: Any, dialect: Dialect) -> Callable[[Any], Any] | None:
    try:
        return type_.dialect_impl(dialect).result_processor(dialect, None)  # type: ignore[no-any-return]
    except (SQLAlchemyError, TypeError):
        # it wants the DBAPI's column type code, known only after a query (psycopg's
        # numerics): such drivers return the column's Python type natively
        return None


class Prepared:
    """One statement compiled for one dialect (module docstring)."""

    def __init__(self, stmt: ClauseElement, dialect: Dialect,
                 column_keys: Sequence[str] | None = None) -> None:
        compiled = stmt.compile(dialect=dialect, column_keys=list(column_keys or ()) or None)
        self.sql = compiled.string
        self._error = dialect.loaded_dbapi.Error
        # qmark / format / numeric styles take a tuple in this order; named styles a dict
        self._order: tuple[str, ...] | None = (
            tuple(compiled.positiontup) if compiled.positiontup is not None else None)
        self._binds: dict[str, Callable[[Any], Any]] = {}
        for name, bind in compiled.binds.items():
            proc = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if proc is not None:
                self._binds[name] = proc
        self._results: list[Callable[[Any], Any] | None] = []
        self._row: Any = None
        columns = getattr(stmt, "selected_columns", None)
        if columns is not None and not getattr(stmt, "is_dml", False):
            self._results = [_result_processor(c.type, dialect) for c in columns]
            self._row = namedtuple("Row", [c.key for c in columns], rename=True)

    def _params(self, values: Mapping[str, Any]) -> Any:
        binds = self._binds
        converted = {k: (binds[k](v) if k in binds and v is not None else v)
                     for k, v in values.items()}
        if self._order is None:
            return converted
        return tuple(converted[k] for k in self._order)

    def run(self, conn: Any, values: Mapping[str, Any]) -> Any:
        """Execute with ``values``; returns the DBAPI cursor (``rowcount``, rows)."""
        params = self._params(values)
        try:
            cursor = _dbapi(conn).cursor()
            cursor.execute(self.sql, params)
        except self._error as e:
            raise DBAPIError.instance(self.sql, params, e, self._error) from e
        return cursor

    def run_many(self, conn: Any, rows: Sequence[Mapping[str, Any]]) -> None:
        """Execute once per row of values (the DBAPI's executemany)."""
        params = [self._params(r) for r in rows]
        try:
            _dbapi(conn).cursor().executemany(self.sql, params)
        except self._error as e:
            raise DBAPIError.instance(self.sql, params, e, self._error) from e

    def rows(self, conn: Any, values: Mapping[str, Any]) -> list[Any]:
        """A SELECT's rows, converted, with attribute access by column key."""
        raw = self.run(conn, values).fetchall()
        procs, row = self._results, self._row
        return [row(*[p(v) if p is not None else v for p, v in zip(procs, r, strict=True)])
                for r in raw]

    def scalar(self, conn: Any, values: Mapping[str, Any]) -> Any:
        """The first column of the first row (None without rows)."""
        found = self.rows(conn, values)
        return found[0][0] if found else None
