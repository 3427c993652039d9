"""Fixtures of the engine tests: a PostgreSQL database of this run's own for the remote engine's
shared-database tests (when ``SUFFIXMEM_TEST_PG_URL`` is set), dropped afterwards."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def remote_pg_url() -> Iterator[str | None]:
    """A throwaway PostgreSQL database URL, or None when no server is configured."""
    base = os.environ.get("SUFFIXMEM_TEST_PG_URL")
    if not base:
        yield None
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"suffixmem_remote_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
