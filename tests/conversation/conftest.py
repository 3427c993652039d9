"""Database fixtures: a fresh SQLite file per test, and (when ``SUFFIXMEM_TEST_PG_URL`` is set)
the run's PostgreSQL database (``pg_database``, tests/conftest.py) emptied after each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


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
