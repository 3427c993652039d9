"""The segment half of the conversation store: the segment log (sightings), per-segment
counters and tiers. A mixin of ``Store``: each method is one transaction (``_tx``).

The log is written after every turn by the manager's background worker, in the same SQLite file
as the turns' commits, so its write transaction is built like a commit's (``turn_store``):
statements compiled once (``SegmentSQL``), run on the DBAPI connection, everything computed
before ``BEGIN``. A slow one held the database's write lock while other sessions' commits
queued behind it (``manager_overhead_ms`` p99 with concurrent sessions).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, delete, exists, func, insert, select, update
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from suffixmem.conversation.prepared import Prepared
from suffixmem.conversation.records import SegmentEvent, SegmentRecord, SegmentSighting, aware
from suffixmem.conversation.schema import SegmentEventRow, SegmentRow, utcnow

SEGMENTS = SegmentRow.__table__
EVENTS = SegmentEventRow.__table__
_KEY = (SEGMENTS.c.hash == bindparam("hash")) & (SEGMENTS.c.scope == bindparam("scope"))
_EVENT_KEYS = ("hash", "scope", "session_id", "kind", "tokens", "seen_at", "hit", "features")
_SEGMENT_KEYS = ("hash", "scope", "kind", "tokens", "tier", "hits", "tokens_saved",
                 "sessions_seen", "created_at", "last_seen_at")

TierUpdate = tuple[str, str, str, float | None, datetime | None]
"""``(hash, scope, tier, score, expires_at)`` for ``record_segments(..., tiers=)``."""


class SegmentSQL:
    """The segment log's write statements prepared for one dialect (``Store.segment_sql``)."""

    def __init__(self, dialect: Dialect) -> None:
        self.seen_by = Prepared(select(exists().where(
            EVENTS.c.hash == bindparam("hash"), EVENTS.c.scope == bindparam("scope"),
            EVENTS.c.session_id == bindparam("sid"))), dialect)
        self.insert_event = Prepared(insert(EVENTS), dialect, _EVENT_KEYS)
        self.segment = Prepared(select(SEGMENTS.c.id).where(_KEY), dialect)
        self.insert_segment = Prepared(insert(SEGMENTS), dialect, _SEGMENT_KEYS)
        self.count = Prepared(update(SEGMENTS).where(SEGMENTS.c.id == bindparam("row")).values(
            sessions_seen=SEGMENTS.c.sessions_seen + bindparam("new_session"),
            hits=SEGMENTS.c.hits + bindparam("hit"),
            tokens_saved=SEGMENTS.c.tokens_saved + bindparam("saved"),
            last_seen_at=bindparam("when")), dialect)
        self.tier = Prepared(update(SEGMENTS).where(_KEY).values(
            tier=bindparam("new_tier"), score=bindparam("new_score"),
            expires_at=bindparam("new_expires")), dialect)
        # a segment's row and how often it was sighted, for the log's features (every turn)
        sightings = (select(func.count()).select_from(EVENTS)
                     .where(EVENTS.c.hash == SEGMENTS.c.hash, EVENTS.c.scope == SEGMENTS.c.scope)
                     .scalar_subquery().label("sightings"))
        self.state = Prepared(select(*SEGMENTS.c, sightings).where(_KEY), dialect)


class SegmentQueries:
    """Segment queries over ``Store``'s transactions."""

    segment_sql: SegmentSQL

    def _tx(self, read: bool = False) -> contextlib.AbstractContextManager[Session]:
        raise NotImplementedError  # provided by Store

    def _retrying(self, fn: Any, core: bool = False) -> Any:
        raise NotImplementedError  # provided by Store

    def _conn(self, read: bool = False) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError  # provided by Store

    # -- segments -------------------------------------------------------------------------------
    def record_segments(
        self, session_id: str | None, sightings: Sequence[SegmentSighting],
        seen_at: datetime | None = None, tiers: Sequence[TierUpdate] = (),
    ) -> None:
        """Log sightings (the value model's training data) and update the segments' counters:
        a sighting with ``hit`` adds one hit and its tokens to ``tokens_saved``; a shared
        (``"*"``) segment seen for the first time in ``session_id`` adds one to
        ``sessions_seen``. ``tiers`` are set in the same transaction, after the sightings."""
        when = seen_at or utcnow()
        # everything but the SQL is done before the transaction takes the write lock
        events = [{"hash": g.hash, "scope": g.scope, "session_id": session_id, "kind": g.kind,
                   "tokens": g.tokens, "seen_at": when, "hit": g.hit,
                   "features": json.dumps(g.features, sort_keys=True)} for g in sightings]
        tier_rows = [{"hash": h, "scope": sc, "new_tier": t, "new_score": score,
                      "new_expires": exp} for h, sc, t, score, exp in tiers]
        sql = self.segment_sql

        def run(conn: Any) -> None:
            for g, event in zip(sightings, events, strict=True):
                first_here = session_id is not None and g.scope == "*" and not sql.seen_by.scalar(
                    conn, {"hash": g.hash, "scope": "*", "sid": session_id})
                sql.insert_event.run(conn, event)
                found = sql.segment.rows(conn, {"hash": g.hash, "scope": g.scope})
                if not found:
                    sql.insert_segment.run(conn, {
                        "hash": g.hash, "scope": g.scope, "kind": g.kind, "tokens": g.tokens,
                        "tier": "none", "hits": int(g.hit),
                        "tokens_saved": g.tokens if g.hit else 0, "sessions_seen": 1,
                        "created_at": when, "last_seen_at": when})
                    continue
                sql.count.run(conn, {"row": found[0][0], "new_session": int(first_here),
                                     "hit": int(g.hit), "saved": g.tokens if g.hit else 0,
                                     "when": when})
            for row in tier_rows:
                sql.tier.run(conn, row)

        self._retrying(run, core=True)

    def segment_states(self, keys: Sequence[tuple[str, str]]
                       ) -> dict[tuple[str, str], tuple[SegmentRecord, int]]:
        """``(hash, scope) -> (record, sightings)`` for the keys that exist, in one read."""
        out: dict[tuple[str, str], tuple[SegmentRecord, int]] = {}
        state = self.segment_sql.state
        # prepared statements on the DBAPI connection, as the turn's own read: this runs in the
        # background after every turn, and through the ORM it was its largest piece (~2.5 ms
        # with four sessions at once, docs/profile.md round 7)
        with self._conn(read=True) as conn:
            for h, scope in dict.fromkeys(keys):
                found = state.rows(conn, {"hash": h, "scope": scope})
                if found:
                    out[(h, scope)] = (_segment_record(found[0]), int(found[0].sightings or 0))
        return out

    def release_segments(self, scope: str) -> int:
        """Mark every segment of ``scope`` as no longer cached; returns how many."""
        with self._tx() as s:
            return int(s.execute(
                update(SegmentRow).where(SegmentRow.scope == scope)
                .values(tier="none", expires_at=utcnow())
            ).rowcount or 0)

    def segment(self, hash_: str, scope: str) -> SegmentRecord | None:
        with self._tx(read=True) as s:
            r = s.execute(
                select(SegmentRow).where(SegmentRow.hash == hash_, SegmentRow.scope == scope)
            ).scalar_one_or_none()
            return None if r is None else _segment_record(r)

    def segment_events(self, limit: int | None = None) -> list[SegmentEvent]:
        """Logged sightings, oldest first."""
        with self._tx(read=True) as s:
            q = select(SegmentEventRow).order_by(SegmentEventRow.seen_at, SegmentEventRow.id)
            if limit is not None:
                q = q.limit(limit)
            return [
                SegmentEvent(
                    hash=r.hash, scope=r.scope, session_id=r.session_id, kind=r.kind,
                    tokens=r.tokens, seen_at=aware(r.seen_at), hit=r.hit,  # type: ignore[arg-type]
                    features=json.loads(r.features),
                )
                for r in s.scalars(q)
            ]


def delete_segment_log(s: Session, session_id: str) -> None:
    """Delete a deleted session's sightings, and the shared (``*``) segments no other
    session's sighting still names (the log kept both for every session ever deleted); in the
    caller's transaction."""
    hashes = sorted(set(s.scalars(select(SegmentEventRow.hash).where(
        SegmentEventRow.session_id == session_id).distinct())))
    s.execute(delete(SegmentEventRow).where(SegmentEventRow.session_id == session_id))
    for i in range(0, len(hashes), 500):  # bounds the statement's parameters (SQLite's limit)
        chunk = hashes[i:i + 500]
        named = set(s.scalars(select(SegmentEventRow.hash).where(
            SegmentEventRow.hash.in_(chunk)).distinct()))
        orphans = [h for h in chunk if h not in named]
        if orphans:
            s.execute(delete(SegmentRow).where(SegmentRow.scope == "*",
                                               SegmentRow.hash.in_(orphans)))


def _segment_record(r: Any) -> SegmentRecord:
    """From an ORM ``SegmentRow`` or a prepared statement's row (same attribute names)."""
    return SegmentRecord(
        hash=r.hash, scope=r.scope, kind=r.kind, tokens=r.tokens, tier=r.tier,
        score=r.score, expires_at=aware(r.expires_at), hits=r.hits,
        tokens_saved=r.tokens_saved, sessions_seen=r.sessions_seen,
        created_at=aware(r.created_at),  # type: ignore[arg-type]
        last_seen_at=aware(r.last_seen_at),  # type: ignore[arg-type]
    )
