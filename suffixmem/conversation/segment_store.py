"""The segment half of the conversation store: the segment log (sightings), per-segment
counters and tiers. A mixin of ``Store``: each method is one transaction (``_tx``)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from suffixmem.conversation.records import SegmentEvent, SegmentRecord, SegmentSighting, aware
from suffixmem.conversation.schema import SegmentEventRow, SegmentRow, utcnow


class SegmentQueries:
    """Segment queries over ``Store``'s transactions."""

    def _tx(self, read: bool = False) -> contextlib.AbstractContextManager[Session]:
        raise NotImplementedError  # provided by Store

    def _retrying(self, fn: Any) -> Any:
        raise NotImplementedError  # provided by Store

    # -- segments -------------------------------------------------------------------------------
    def record_segments(
        self, session_id: str | None, sightings: Sequence[SegmentSighting],
        seen_at: datetime | None = None,
    ) -> None:
        """Log sightings (the value model's training data) and update the segments' counters:
        a sighting with ``hit`` adds one hit and its tokens to ``tokens_saved``."""
        when = seen_at or utcnow()

        def run(s: Session) -> None:
            for g in sightings:
                first_here = session_id is not None and g.scope == "*" and s.scalar(
                    select(SegmentEventRow.id).where(
                        SegmentEventRow.hash == g.hash, SegmentEventRow.scope == "*",
                        SegmentEventRow.session_id == session_id,
                    ).limit(1)
                ) is None
                s.add(SegmentEventRow(
                    hash=g.hash, scope=g.scope, session_id=session_id, kind=g.kind,
                    tokens=g.tokens, seen_at=when, hit=g.hit,
                    features=json.dumps(g.features, sort_keys=True),
                ))
                row = s.execute(
                    select(SegmentRow).where(SegmentRow.hash == g.hash,
                                             SegmentRow.scope == g.scope)
                ).scalar_one_or_none()
                if row is None:
                    s.add(SegmentRow(
                        hash=g.hash, scope=g.scope, kind=g.kind, tokens=g.tokens, tier="none",
                        hits=int(g.hit), tokens_saved=g.tokens if g.hit else 0,
                        sessions_seen=1, created_at=when, last_seen_at=when,
                    ))
                    s.flush()
                    continue
                if first_here:
                    row.sessions_seen += 1
                if g.hit:
                    row.hits += 1
                    row.tokens_saved += g.tokens
                row.last_seen_at = when
                s.flush()

        self._retrying(run)

    def set_segment_tier(
        self, hash_: str, scope: str, tier: str, score: float | None,
        expires_at: datetime | None,
    ) -> None:
        with self._tx() as s:
            s.execute(
                update(SegmentRow).where(SegmentRow.hash == hash_, SegmentRow.scope == scope)
                .values(tier=tier, score=score, expires_at=expires_at)
            )

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
            if r is None:
                return None
            return SegmentRecord(
                hash=r.hash, scope=r.scope, kind=r.kind, tokens=r.tokens, tier=r.tier,
                score=r.score, expires_at=aware(r.expires_at), hits=r.hits,
                tokens_saved=r.tokens_saved, sessions_seen=r.sessions_seen,
                created_at=aware(r.created_at),  # type: ignore[arg-type]
                last_seen_at=aware(r.last_seen_at),  # type: ignore[arg-type]
            )

    def sightings(self, hash_: str, scope: str) -> int:
        """How many times the segment was logged as seen."""
        with self._tx(read=True) as s:
            return int(s.scalar(
                select(func.count()).select_from(SegmentEventRow).where(
                    SegmentEventRow.hash == hash_, SegmentEventRow.scope == scope)
            ) or 0)

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


