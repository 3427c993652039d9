"""LangGraph's checkpointer conformance suite against ``SuffixMemSaver`` on SQLite and
PostgreSQL: every base capability, and the extended ones the saver implements."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from langchain_suffixmem import SuffixMemSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability


@pytest.mark.asyncio
async def test_conformance(any_database_url: str) -> None:
    @checkpointer_test(name="SuffixMemSaver")
    async def saver() -> AsyncIterator[SuffixMemSaver]:
        s = SuffixMemSaver(any_database_url)
        try:
            yield s
        finally:
            s.close()

    report = await validate(saver)
    report.print_report()
    assert report.passed_all_base()
    # every extended capability the saver implements passes too (prune is not implemented)
    assert report.passed_all()
    implemented = {c for c, r in report.results.items() if r.detected}
    assert {Capability.DELETE_FOR_RUNS.value, Capability.COPY_THREAD.value} <= implemented


def test_from_conn_string_roundtrip(any_database_url: str) -> None:
    """The sync API on one checkpoint: put, get back, list, delete."""
    from langgraph.checkpoint.base import empty_checkpoint

    with SuffixMemSaver.from_conn_string(any_database_url) as saver:
        cp = empty_checkpoint()
        cp["channel_values"] = {"messages": ["hello"]}
        cp["channel_versions"] = {"messages": saver.get_next_version(None, None)}
        cfg = saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, cp,
                        {"source": "input", "step": -1}, cp["channel_versions"])
        got = saver.get_tuple({"configurable": {"thread_id": "t"}})
        assert got is not None and got.config == cfg
        assert got.checkpoint["channel_values"] == {"messages": ["hello"]}
        assert [t.config for t in saver.list({"configurable": {"thread_id": "t"}})] == [cfg]
        saver.delete_thread("t")
        assert saver.get_tuple({"configurable": {"thread_id": "t"}}) is None


@pytest.mark.asyncio
async def test_from_conn_string_opens_with_async_with(any_database_url: str) -> None:
    """LangGraph's async savers open with ``async with``; this one opens with either."""
    from langgraph.checkpoint.base import empty_checkpoint

    async with SuffixMemSaver.from_conn_string(any_database_url) as saver:
        cp = empty_checkpoint()
        cfg = await saver.aput({"configurable": {"thread_id": "ta", "checkpoint_ns": ""}}, cp,
                               {"source": "input", "step": -1}, {})
        got = await saver.aget_tuple({"configurable": {"thread_id": "ta"}})
        assert got is not None and got.config == cfg
        await saver.adelete_thread("ta")


def test_thread_id_is_required(tmp_path: object) -> None:
    from suffixmem.errors import InvalidRequestError

    with SuffixMemSaver.from_conn_string(f"sqlite:///{tmp_path}/x.db") as saver, \
            pytest.raises(InvalidRequestError, match="thread_id"):
        saver.get_tuple({"configurable": {}})
