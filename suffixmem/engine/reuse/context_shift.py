"""Context shift: reuse a session's earlier KV when its turns moved to new positions.

When a conversation outgrows the window, the stable layout drops old turns: the new prompt is
the system prompt, then the kept turns *earlier* than before, then the new message. A prefix
cache hits only the system prompt and recomputes every kept turn. Their KV is still in the pool,
in the blocks of the session's previous sequence, at the old positions. Context shift finds the
runs of the new prompt that occur in that previous sequence and places them at their new
positions (``placement.place_segments``: RoPE re-rotation, then the blend policy's recompute of
the first tokens of each run), like llama.cpp's context shift but with the boundary tokens
recomputed.

Contract:
- ``ContextShift.remember(session_key, token_ids)`` keeps a reference to the list of the
  session's newest sequence (its prompt now, its output once generated: the engine appends in
  place), for at most ``max_sessions`` sessions (least recently used forgotten first).
- ``ContextShift.continues(session_key, prompt)``: the prompt extends the previous sequence, so
  nothing moved (checked before any block lookup).
- ``ContextShift.runs(session_key, prompt, start, cached_len)`` returns ``ShiftRun``s: disjoint
  spans of ``prompt[start:]`` equal to spans of the previous sequence's first ``cached_len``
  tokens (the ones whose KV is still cached), in order, each at least ``min_run`` tokens.
  Pure Python; which of those tokens still have KV is the caller's ``cached_len``.
- Everything placed this way is approximate (positions moved, the dropped turns are no longer
  attended): the engine caches those blocks under the approximate salt only, so an exact lookup
  never returns them. When nothing was dropped the prefix cache covers every reusable token and
  no run is found: output stays exact.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from suffixmem.engine.reuse.blend import BlendConfig

DEFAULT_MIN_RUN = 32
ANCHOR = 8  # find_runs' index key: n-grams of old (any length >= 1 gives the same runs)
DEFAULT_MAX_SESSIONS = 1024
SHIFT_BLEND = BlendConfig(first_k=0, ratio=0.0)
"""Re-rotation alone: the method ``bench segments`` chose on the overflow workload's eviction
turns (the cheapest one passing the gate there; docs/segment-reuse.md). The segment hook
gives it to its ``ContextShift`` unless it is installed with a ``blend`` of its own."""


@dataclass(slots=True, frozen=True)
class ShiftRun:
    """``length`` tokens at ``new_start`` of the prompt equal the previous sequence's tokens at
    ``old_start``."""

    new_start: int
    old_start: int
    length: int

    @property
    def new_end(self) -> int:
        return self.new_start + self.length


def find_runs(old: Sequence[int], new: Sequence[int], start: int,
              min_run: int = DEFAULT_MIN_RUN) -> list[ShiftRun]:
    """Order-preserving common runs of ``new[start:]`` and ``old`` of at least ``min_run``
    tokens: ``difflib.SequenceMatcher``'s matching blocks (without junk) of that size, the same
    list, found faster. difflib takes the longest common run (earliest in ``old``, then in
    ``new``), then recurses on each side of it; a side whose longest run is shorter than
    ``min_run`` holds nothing kept, so the recursion may stop there. Every candidate is a
    maximal common run found through an index of ``old``'s ``ANCHOR``-grams, so one call reads
    each token a few times instead of difflib's per-token dictionary walk (6 ms -> ~1 ms a rag
    turn)."""
    b = list(new[start:])
    if not b or not old:
        return []
    a = list(old)
    runs = _maximal_runs(a, b, min_run)
    found: list[ShiftRun] = []
    todo = [(0, len(a), 0, len(b))]
    while todo:
        alo, ahi, blo, bhi = todo.pop()
        best: tuple[int, int, int] | None = None  # (-length, old start, new start)
        for i, j, n in runs:  # each maximal run, clipped to the range
            lo = max(alo - i, blo - j, 0)
            hi = min(n, ahi - i, bhi - j)
            if hi - lo >= min_run and (best is None or (lo - hi, i + lo, j + lo) < best):
                best = (lo - hi, i + lo, j + lo)
        if best is None:
            continue
        size, i, j = -best[0], best[1], best[2]
        found.append(ShiftRun(start + j, i, size))
        if alo < i and blo < j:
            todo.append((alo, i, blo, j))
        if i + size < ahi and j + size < bhi:
            todo.append((i + size, ahi, j + size, bhi))
    return sorted(found, key=lambda r: r.new_start)


def _maximal_runs(a: list[int], b: list[int], min_run: int) -> list[tuple[int, int, int]]:
    """Every maximal common diagonal run ``(i, j, n)`` (``a[i:i+n] == b[j:j+n]``, extendable
    neither way) with ``n >= min_run``."""
    g = min(ANCHOR, min_run)
    index: dict[tuple[int, ...], list[int]] = {}
    for i in range(len(a) - g + 1):
        index.setdefault(tuple(a[i:i + g]), []).append(i)
    la, lb = len(a), len(b)
    out = []
    for j in range(lb - g + 1):
        for i in index.get(tuple(b[j:j + g]), ()):
            if i and j and a[i - 1] == b[j - 1]:
                continue  # not a run's start: found from the start
            n = g
            while i + n < la and j + n < lb and a[i + n] == b[j + n]:
                n += 1
            if n >= min_run:
                out.append((i, j, n))
    return out


class ContextShift:
    """Remembers each session's newest sequence and finds shifted runs in it (module docs)."""

    def __init__(self, min_run: int = DEFAULT_MIN_RUN,
                 max_sessions: int = DEFAULT_MAX_SESSIONS,
                 blend: BlendConfig | None = None) -> None:
        if min_run < 1 or max_sessions < 1:
            raise ValueError(f"need min_run >= 1 and max_sessions >= 1, got {min_run}, "
                             f"{max_sessions}")
        self.min_run = min_run
        self.max_sessions = max_sessions
        self.blend = blend  # the recompute method of shifted runs (None: the hook's)
        self._last: OrderedDict[str, list[int]] = OrderedDict()
        self.shifts = 0  # requests that reused shifted runs
        self.shifted_tokens = 0

    def __len__(self) -> int:
        return len(self._last)

    def previous(self, session_key: str) -> list[int] | None:
        """The session's newest remembered sequence (prompt plus output so far), if any."""
        return self._last.get(session_key)

    def remember(self, session_key: str, token_ids: list[int]) -> None:
        """Make ``token_ids`` (kept by reference) the session's newest sequence."""
        self._last[session_key] = token_ids
        self._last.move_to_end(session_key)
        while len(self._last) > self.max_sessions:
            self._last.popitem(last=False)

    def forget(self, session_key: str) -> bool:
        return self._last.pop(session_key, None) is not None

    def runs(self, session_key: str, prompt: Sequence[int], start: int,
             cached_len: int) -> list[ShiftRun]:
        """Shifted runs of ``prompt[start:]`` in the session's previous sequence, restricted to
        its first ``cached_len`` tokens (see the module contract)."""
        old = self._last.get(session_key)
        if old is None or cached_len <= 0:
            return []
        return find_runs(old[:cached_len], prompt, start, self.min_run)

    def continues(self, session_key: str, prompt: Sequence[int]) -> bool:
        """Whether ``prompt`` continues the session's previous sequence (every turn that
        dropped nothing): then whatever is reusable sits at its old position, where the prefix
        cache has it, and there is nothing to shift. (The previous sequence's last token never
        had KV written, so it need not match.) A list comparison: no block lookups."""
        old = self._last.get(session_key)
        if old is None:
            return True
        n = min(len(old) - 1, len(prompt))
        return list(prompt[:n]) == old[:n]


def subtract(runs: Sequence[ShiftRun], taken: Sequence[tuple[int, int]],
             min_run: int) -> list[ShiftRun]:
    """``runs`` minus the prompt spans ``taken`` (by other reuse), pieces of at least
    ``min_run`` tokens kept."""
    out: list[ShiftRun] = []
    for r in runs:
        pieces = [(r.new_start, r.new_end)]
        for a, b in taken:
            pieces = [q for s, e in pieces for q in ((s, min(e, a)), (max(s, b), e)) if q[0] < q[1]]
        out.extend(ShiftRun(s, r.old_start + (s - r.new_start), e - s)
                   for s, e in pieces if e - s >= min_run)
    return sorted(out, key=lambda r: r.new_start)
