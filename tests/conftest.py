"""Shared fixtures. The real model is provisioned once into the default SUFFIXMEM_HOME (the user
cache, or $SUFFIXMEM_HOME) and shared by every test; engines are session-scoped because
starting one takes seconds.

PostgreSQL (every test directory's): ``SUFFIXMEM_TEST_PG_URL`` names a server (``scripts/postgres``
starts one and prints it); each fixture below makes a database of its own there and drops it
afterwards. ``pg_database`` (one per run; skips without a server), ``fresh_pg_database`` (one per
test, for code that caches per URL; skips), ``remote_pg_url`` (one per run, ``None`` without a
server, for tests that fall back to SQLite)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_ENV = "SUFFIXMEM_TEST_PG_URL"

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The default model's bf16 safetensors folder (converted on first use)."""
    from suffixmem.models import resolve_model

    return resolve_model(progress=False)


@pytest.fixture(scope="session")
def tokenizer(model_path: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_path))


@pytest.fixture(scope="session")
def vllm_engine(model_path: Path) -> Iterator[object]:
    """One embedded vLLM engine for the whole run (prefix caching on)."""
    from suffixmem.engine import create_engine

    engine = create_engine("vllm", max_model_len=4096, kv_cache_gib=1.0)
    yield engine
    engine.close()


# -- PostgreSQL --------------------------------------------------------------------------------
@contextlib.contextmanager
def throwaway_pg_database(prefix: str) -> Iterator[str]:
    """A new database ``<prefix>_<random>`` on the ``SUFFIXMEM_TEST_PG_URL`` server (its URL),
    dropped on exit even if connections to it are still open (``WITH (FORCE)``)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = os.environ[PG_ENV]
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _need_pg() -> None:
    if not os.environ.get(PG_ENV):
        pytest.skip(f"{PG_ENV} is not set (scripts/postgres prints one)")


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A PostgreSQL database (URL) for the whole run; skips when no server is set."""
    _need_pg()
    with throwaway_pg_database("suffixmem_t") as url:
        yield url


@pytest.fixture
def fresh_pg_database() -> Iterator[str]:
    """A PostgreSQL database (URL) of this test's own: a fresh name, so process-wide objects
    cached per URL (``suffixmem.runtime``'s managers) never see a reused one; skips when no
    server is set."""
    _need_pg()
    with throwaway_pg_database("suffixmem_f") as url:
        yield url


@pytest.fixture(scope="session")
def remote_pg_url() -> Iterator[str | None]:
    """A PostgreSQL database (URL) for the whole run, or ``None`` when no server is set."""
    if not os.environ.get(PG_ENV):
        yield None
        return
    with throwaway_pg_database("suffixmem_remote") as url:
        yield url
