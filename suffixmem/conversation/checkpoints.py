"""SQL storage of LangGraph checkpoints (tables of migration 0002), framework-free.

Contract: ``CheckpointStore(url)`` connects to the conversation database (the same URL as the
``ConversationManager``, so a LangGraph thread and the suffixmem session of the same id live
side by side) and upgrades its schema. Values arrive already serialised as ``(type, bytes)``
pairs (the LangGraph saver owns serialisation; this module never imports LangGraph). Every
method is one transaction; database failures raise ``StoreError`` with the URL's password
masked (``suffixmem.conversation.database.Database``: the same connect, migrate and
transaction plumbing as the conversation ``Store``).

- ``put`` stores a checkpoint and the channel values of its new versions (a value already stored
  at a version is kept: versions are immutable); re-putting a checkpoint id replaces it.
- ``put_writes`` stores a task's pending writes; a write with ``idx >= 0`` already stored is kept
  (LangGraph retries a task with the same writes), special writes (``idx < 0``: error, interrupt,
  ...) are replaced.
- ``get`` / ``list`` return ``StoredCheckpoint``s newest first (checkpoint ids are uuid6, which
  sort in creation order) with their channel values and their writes in LangGraph's
  ``writes_sort_key`` order (task path, task id, index).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from suffixmem.conversation.database import Database
from suffixmem.conversation.schema import CheckpointBlobRow, CheckpointRow, CheckpointWriteRow

Typed = tuple[str, bytes]
# serialised checkpoint -> its channel versions (the store cannot deserialise it itself)
VersionsOf = Callable[[Typed], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class StoredWrite:
    task_id: str
    channel: str
    value: Typed
    task_path: str
    idx: int


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint: Typed
    metadata: Typed
    values: dict[str, Typed]  # channel -> value; channels cleared at their version are absent
    writes: tuple[StoredWrite, ...]


class CheckpointStore:
    """LangGraph checkpoints in the suffixmem SQL database (see the module docstring)."""

    def __init__(self, url: str, *, migrate: bool = True) -> None:
        self.db = Database(url, migrate=migrate, label="checkpoint database")
        self.url = self.db.url  # password masked
        self.engine = self.db.engine

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Session]:
        try:
            with self.db.transaction() as s:
                yield s
        except IntegrityError as e:  # a concurrent writer of the same row: still a StoreError
            raise self.db.error(e) from e

    def close(self) -> None:
        self.db.close()

    # -- writing --------------------------------------------------------------------------------
    def put(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str,
            parent_checkpoint_id: str | None, checkpoint: Typed, metadata: Typed,
            values: Mapping[str, tuple[str, Typed | None]]) -> None:
        """Store a checkpoint; ``values``: channel -> (version, value or ``None`` if cleared)."""
        with self._tx() as s:
            for channel, (version, value) in values.items():
                key = (thread_id, checkpoint_ns, channel, str(version))
                if s.get(CheckpointBlobRow, key) is not None:
                    continue
                s.add(CheckpointBlobRow(
                    thread_id=thread_id, checkpoint_ns=checkpoint_ns, channel=channel,
                    version=str(version), type=value[0] if value else "empty",
                    blob=value[1] if value else None))
            row = s.get(CheckpointRow, (thread_id, checkpoint_ns, checkpoint_id))
            if row is None:
                row = CheckpointRow(thread_id=thread_id, checkpoint_ns=checkpoint_ns,
                                    checkpoint_id=checkpoint_id)
                s.add(row)
            row.parent_checkpoint_id = parent_checkpoint_id
            row.type, row.checkpoint = checkpoint
            row.meta_type, row.meta = metadata

    def put_writes(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str,
                   writes: Sequence[StoredWrite]) -> None:
        with self._tx() as s:
            for w in writes:
                key = (thread_id, checkpoint_ns, checkpoint_id, w.task_id, w.idx)
                row = s.get(CheckpointWriteRow, key)
                if row is not None and w.idx >= 0:
                    continue
                if row is None:
                    row = CheckpointWriteRow(
                        thread_id=thread_id, checkpoint_ns=checkpoint_ns,
                        checkpoint_id=checkpoint_id, task_id=w.task_id, idx=w.idx)
                    s.add(row)
                row.channel, row.task_path = w.channel, w.task_path
                row.type, row.blob = w.value

    def delete_thread(self, thread_id: str) -> None:
        with self._tx() as s:
            for table in (CheckpointWriteRow, CheckpointBlobRow, CheckpointRow):
                s.execute(delete(table).where(table.thread_id == thread_id))

    def delete_checkpoints(self, keys: Sequence[tuple[str, str, str]]) -> None:
        """Delete checkpoints (thread, namespace, id) and their writes; channel values stay
        (other checkpoints may share a version)."""
        with self._tx() as s:
            for thread_id, ns, cid in keys:
                for table in (CheckpointWriteRow, CheckpointRow):
                    s.execute(delete(table).where(
                        table.thread_id == thread_id, table.checkpoint_ns == ns,
                        table.checkpoint_id == cid))

    def copy_thread(self, source: str, target: str) -> None:
        """Every checkpoint, value and write of ``source`` under ``target`` (replacing what
        ``target`` had): the whole parent chain, so delta channels stay reconstructible."""
        with self._tx() as s:
            for table in (CheckpointWriteRow, CheckpointBlobRow, CheckpointRow):
                s.execute(delete(table).where(table.thread_id == target))
                cols = [c.key for c in table.__table__.columns]
                for row in s.scalars(select(table).where(table.thread_id == source)).all():
                    data = {c: getattr(row, c) for c in cols}
                    data["thread_id"] = target
                    s.add(table(**data))

    # -- reading --------------------------------------------------------------------------------
    def get(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None,
            versions_of: VersionsOf) -> StoredCheckpoint | None:
        """The checkpoint ``checkpoint_id`` of the thread's namespace, or its newest one."""
        found = self.list(thread_id, checkpoint_ns, checkpoint_id, None, 1, versions_of)
        return found[0] if found else None

    def list(self, thread_id: str | None, checkpoint_ns: str | None, checkpoint_id: str | None,
             before: str | None, limit: int | None, versions_of: VersionsOf,
             ) -> list[StoredCheckpoint]:
        """Checkpoints newest first, filtered by each argument that is not ``None``."""
        q = select(CheckpointRow)
        if thread_id is not None:
            q = q.where(CheckpointRow.thread_id == thread_id)
        if checkpoint_ns is not None:
            q = q.where(CheckpointRow.checkpoint_ns == checkpoint_ns)
        if checkpoint_id is not None:
            q = q.where(CheckpointRow.checkpoint_id == checkpoint_id)
        if before is not None:
            q = q.where(CheckpointRow.checkpoint_id < before)
        q = q.order_by(CheckpointRow.thread_id, CheckpointRow.checkpoint_ns,
                       CheckpointRow.checkpoint_id.desc())
        if limit is not None:
            q = q.limit(limit)
        with self._tx() as s:
            return [self._load(s, row, versions_of) for row in s.scalars(q).all()]

    def iter_all(self, thread_id: str | None, checkpoint_ns: str | None,
                 checkpoint_id: str | None, before: str | None, versions_of: VersionsOf,
                 page: int = 64) -> Iterator[StoredCheckpoint]:
        """``list`` without a limit, read ``page`` checkpoints per transaction (a filtered
        listing stops early without loading the whole table)."""
        # keyset pagination over (thread, namespace, -id)
        last: tuple[str, str, str] | None = None
        while True:
            q = select(CheckpointRow)
            if thread_id is not None:
                q = q.where(CheckpointRow.thread_id == thread_id)
            if checkpoint_ns is not None:
                q = q.where(CheckpointRow.checkpoint_ns == checkpoint_ns)
            if checkpoint_id is not None:
                q = q.where(CheckpointRow.checkpoint_id == checkpoint_id)
            if before is not None:
                q = q.where(CheckpointRow.checkpoint_id < before)
            if last is not None:
                t, ns, cid = last
                q = q.where(
                    (CheckpointRow.thread_id > t)
                    | ((CheckpointRow.thread_id == t) & (CheckpointRow.checkpoint_ns > ns))
                    | ((CheckpointRow.thread_id == t) & (CheckpointRow.checkpoint_ns == ns)
                       & (CheckpointRow.checkpoint_id < cid)))
            q = q.order_by(CheckpointRow.thread_id, CheckpointRow.checkpoint_ns,
                           CheckpointRow.checkpoint_id.desc()).limit(page)
            with self._tx() as s:
                rows = s.scalars(q).all()
                batch = [self._load(s, row, versions_of) for row in rows]
            yield from batch
            if len(rows) < page:
                return
            last = (rows[-1].thread_id, rows[-1].checkpoint_ns, rows[-1].checkpoint_id)

    @staticmethod
    def _load(s: Session, row: CheckpointRow, versions_of: VersionsOf) -> StoredCheckpoint:
        checkpoint = (row.type, row.checkpoint)
        values: dict[str, Typed] = {}
        for channel, version in versions_of(checkpoint).items():
            blob = s.get(CheckpointBlobRow,
                         (row.thread_id, row.checkpoint_ns, channel, str(version)))
            if blob is not None and blob.type != "empty" and blob.blob is not None:
                values[channel] = (blob.type, blob.blob)
        writes = s.scalars(select(CheckpointWriteRow).where(
            CheckpointWriteRow.thread_id == row.thread_id,
            CheckpointWriteRow.checkpoint_ns == row.checkpoint_ns,
            CheckpointWriteRow.checkpoint_id == row.checkpoint_id)).all()
        ordered = sorted(writes, key=lambda w: (w.task_path, w.task_id, w.idx))
        return StoredCheckpoint(
            row.thread_id, row.checkpoint_ns, row.checkpoint_id, row.parent_checkpoint_id,
            checkpoint, (row.meta_type, row.meta), values,
            tuple(StoredWrite(w.task_id, w.channel, (w.type, w.blob), w.task_path, w.idx)
                  for w in ordered))
