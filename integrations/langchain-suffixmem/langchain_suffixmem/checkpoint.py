"""``SuffixMemSaver``: a LangGraph checkpointer on suffixmem's SQL store (SQLite, PostgreSQL).

A LangGraph thread is a suffixmem session. Checkpoints live in the tables of migration 0002 of
the conversation database; give the saver the same ``database_url`` as the chat model and a
graph run with ``{"configurable": {"thread_id": "t1"}}`` keeps its checkpoints beside the
session ``t1`` that ``SuffixMemChatModel`` reads the thread's ``thread_id`` as. The model's
calls then resend the graph's messages, the manager finds its stored turns as a prefix
("appended") and each step is a cache hit on the previous one.

```python
from langchain_suffixmem import SuffixMemChatModel, SuffixMemSaver

with SuffixMemSaver.from_conn_string("sqlite:///agent.db") as saver:  # or `async with`
    graph = builder.compile(checkpointer=saver)   # builder: your StateGraph
    graph.invoke({"messages": [("user", "hi")]}, {"configurable": {"thread_id": "t1"}})
```

Sync and async methods; the async ones run the SQL in a worker thread (never block the loop).
Implemented beyond the base contract: ``delete_for_runs`` and ``copy_thread`` (whole parent
chain). Not implemented: ``prune`` (a safe ``keep_latest`` must keep delta-channel ancestors).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
    get_checkpoint_id,
    get_checkpoint_metadata,
)

from suffixmem import runtime
from suffixmem.config import default_database_url
from suffixmem.conversation.checkpoints import (
    CheckpointStore,
    StoredCheckpoint,
    StoredWrite,
    Typed,
)
from suffixmem.errors import InvalidRequestError


def _thread(config: RunnableConfig) -> tuple[str, str]:
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None or thread_id == "":
        raise InvalidRequestError(
            "config['configurable']['thread_id'] is required by SuffixMemSaver")
    return str(thread_id), str(configurable.get("checkpoint_ns", ""))


class SuffixMemSaver(BaseCheckpointSaver[str]):
    """LangGraph ``BaseCheckpointSaver`` on the suffixmem database (see the module docstring).

    ``database_url`` defaults to suffixmem's default database (``$SUFFIXMEM_DATABASE_URL`` or
    the SQLite file under the suffixmem home), the one ``SuffixMemChatModel`` uses by default.
    """

    def __init__(self, database_url: str | None = None, *,
                 serde: SerializerProtocol | None = None,
                 store: CheckpointStore | None = None) -> None:
        super().__init__(serde=serde)
        self.store = store or CheckpointStore(database_url or default_database_url())

    @classmethod
    def from_conn_string(cls, conn_string: str, *,
                         serde: SerializerProtocol | None = None) -> SuffixMemSaver:
        """A saver on ``conn_string`` (a SQLAlchemy URL), for ``with`` or ``async with``
        (LangGraph's sync savers use the one, its async savers the other; this saver is both),
        closed when the block ends."""
        return cls(conn_string, serde=serde)

    def __enter__(self) -> SuffixMemSaver:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    async def __aenter__(self) -> SuffixMemSaver:
        return self

    async def __aexit__(self, *_: object) -> None:
        await asyncio.to_thread(self.close)

    def setup(self) -> None:
        """Nothing to do: the store upgrades the schema (Alembic) when it connects."""

    def close(self) -> None:
        self.store.close()

    # -- translation ----------------------------------------------------------------------------
    def _versions_of(self, typed: Typed) -> Mapping[str, Any]:
        return self.serde.loads_typed(typed).get("channel_versions", {})  # type: ignore[no-any-return]

    def _tuple(self, c: StoredCheckpoint) -> CheckpointTuple:
        checkpoint: Checkpoint = self.serde.loads_typed(c.checkpoint)
        ids = {"thread_id": c.thread_id, "checkpoint_ns": c.checkpoint_ns}
        return CheckpointTuple(
            config={"configurable": {**ids, "checkpoint_id": c.checkpoint_id}},
            checkpoint={**checkpoint, "channel_values": {
                k: self.serde.loads_typed(v) for k, v in c.values.items()}},
            metadata=self.serde.loads_typed(c.metadata),
            parent_config=(
                {"configurable": {**ids, "checkpoint_id": c.parent_checkpoint_id}}
                if c.parent_checkpoint_id else None),
            pending_writes=[(w.task_id, w.channel, self.serde.loads_typed(w.value))
                            for w in c.writes],
        )

    # -- sync API -------------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, ns = _thread(config)
        found = self.store.get(thread_id, ns, get_checkpoint_id(config), self._versions_of)
        return None if found is None else self._tuple(found)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None,
             ) -> Iterator[CheckpointTuple]:
        configurable = (config or {}).get("configurable") or {}
        thread_id = configurable.get("thread_id")
        ns = configurable.get("checkpoint_ns")
        if limit is not None and limit <= 0:
            return
        rows = self.store.iter_all(
            None if thread_id is None else str(thread_id), ns,
            get_checkpoint_id(config) if config else None,
            get_checkpoint_id(before) if before else None, self._versions_of)
        n = 0
        for row in rows:
            if filter:
                # metadata is serialised by LangGraph's serde, so the filter runs here
                metadata = self.serde.loads_typed(row.metadata)
                if not all(metadata.get(k) == v for k, v in filter.items()):
                    continue
            yield self._tuple(row)
            n += 1
            if limit is not None and n >= limit:
                return

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        thread_id, ns = _thread(config)
        c = checkpoint.copy()
        values: dict[str, Any] = c.pop("channel_values")  # type: ignore[misc]
        parent = (config.get("configurable") or {}).get("checkpoint_id")
        self.store.put(
            thread_id, ns, checkpoint["id"], parent,
            self.serde.dumps_typed(c),
            self.serde.dumps_typed(get_checkpoint_metadata(config, metadata)),
            {k: (str(v), self.serde.dumps_typed(values[k]) if k in values else None)
             for k, v in new_versions.items()},
        )
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                 "checkpoint_id": checkpoint["id"]}}

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        thread_id, ns = _thread(config)
        checkpoint_id = (config.get("configurable") or {}).get("checkpoint_id")
        if not checkpoint_id:
            raise InvalidRequestError(
                "config['configurable']['checkpoint_id'] is required by put_writes")
        self.store.put_writes(thread_id, ns, str(checkpoint_id), [
            StoredWrite(task_id, channel, self.serde.dumps_typed(value), task_path,
                        WRITES_IDX_MAP.get(channel, i))
            for i, (channel, value) in enumerate(writes)])

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints, channel values and writes, and the suffixmem
        session of the same id on this database: its messages and statistics, and its cached
        KV where a manager of this process serves it (``runtime.delete_session_on``). A
        LangGraph user deletes a thread to forget it; the session kept the whole conversation,
        and the thread's next first turn, a lone message to a session with history, was
        answered statelessly and not stored."""
        tid = str(thread_id)
        self.store.delete_thread(tid)
        runtime.delete_session_on(self.store.engine.url.render_as_string(hide_password=False),
                                  tid)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete every checkpoint (and its writes) whose metadata names one of ``run_ids``."""
        wanted = {str(r) for r in run_ids}
        if not wanted:
            return
        doomed = [
            (row.thread_id, row.checkpoint_ns, row.checkpoint_id)
            for row in self.store.iter_all(None, None, None, None, lambda _: {})
            if str(self.serde.loads_typed(row.metadata).get("run_id")) in wanted]
        self.store.delete_checkpoints(doomed)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.store.copy_thread(str(source_thread_id), str(target_thread_id))

    def get_next_version(self, current: str | None, channel: None) -> str:
        # LangGraph's own scheme (InMemorySaver, PostgresSaver): a zero-padded counter that
        # sorts as text, plus a random fraction so that concurrent forks do not collide
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # -- async API: the same SQL in a worker thread ---------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *,
                    filter: dict[str, Any] | None = None, before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        items = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in items:
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)
