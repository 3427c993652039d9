"""Database fixtures: a fresh SQLite file per test, and (when ``SUFFIXMEM_TEST_PG_URL`` is set)
a PostgreSQL database of its own for this test run, dropped afterwards."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A throwaway PostgreSQL database (URL) for the whole run; skips when no server is set."""
    base = os.environ.get("SUFFIXMEM_TEST_PG_URL")
    if not base:
        pytest.skip("SUFFIXMEM_TEST_PG_URL is not set (scripts/postgres prints one)")
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"suffixmem_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def pg_url(pg_database: str) -> Iterator[str]:
    """The run's PostgreSQL database, emptied (downgraded to base) after each test."""
    yield pg_database
    from suffixmem.conversation.store import downgrade

    downgrade(pg_database, "base")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test using this runs once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_url")
