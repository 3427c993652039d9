"""Per-session change stamps, bounded: how a turn planned before it held its session's lock
finds that the stored history changed meanwhile (``TurnPath._run`` plans it again).

- ``get(sid)`` is the stamp to remember with a plan; ``bump(sid)`` marks a change (a turn
  committed, the history appended to, cleared or deleted). A plan is stale exactly when the
  stamp it remembered differs from ``get(sid)`` under the lock.
- Stamps come from one clock for all sessions, and only the ``capacity`` most recently changed
  sessions keep theirs (a long-running server sees unboundedly many ids). Any other session
  reads ``floor``: the newest stamp ever dropped. So a session whose stamp was dropped after a
  plan remembered it, or after a plan remembered the floor, reads a larger value than the plan
  did: the plan is found stale (at worst needlessly planned again, never wrongly kept).
"""

from __future__ import annotations

import threading
from collections import OrderedDict


class Versions:
    """Change stamps of sessions (module docstring)."""

    def __init__(self, capacity: int = 65_536) -> None:
        self.capacity = capacity
        self._stamps: OrderedDict[str, int] = OrderedDict()
        self._clock = 0
        self._floor = 0  # the newest stamp dropped: what every session without one reads
        self._lock = threading.Lock()

    def get(self, session_id: str) -> int:
        with self._lock:
            return self._stamps.get(session_id, self._floor)

    def bump(self, session_id: str) -> None:
        with self._lock:
            self._clock += 1
            self._stamps[session_id] = self._clock
            self._stamps.move_to_end(session_id)
            while len(self._stamps) > self.capacity:
                _, dropped = self._stamps.popitem(last=False)
                self._floor = max(self._floor, dropped)

    def __len__(self) -> int:
        return len(self._stamps)
