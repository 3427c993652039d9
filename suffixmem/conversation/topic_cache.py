"""Per-session topic state for the manager, so a turn costs one ``observe_user`` call.

The verdict (jump or not) must be known before generation because it decides the turn's
semantic temperature; replaying a whole history through the detector every turn would put that
work on the path to the first token. So the state after each committed turn is kept per session
key, stamped with the history length it describes; it is replayed from the history only when
the stamp does not match (another process wrote, the history was edited) or the caller's
history is not the stored one (rewritten). A stateless conversation, resent whole on every call,
keeps the state its last call left under its key, stamped with that call's history: when the
next call's history is that one plus the exchange since (the message judged, then its reply),
the state advances by that exchange instead of a replay of everything (it replayed every turn,
over 20 ms late in a 50-turn conversation). At most ``MAX_STATES`` sessions' states
are kept, least recently used dropped (a dropped one is replayed if its session returns), so a
long-running server does not grow by a state per session it ever served.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from suffixmem import heap
from suffixmem.conversation.topic import TopicDetector, TopicState, TopicVerdict
from suffixmem.conversation.turns import Plan, turn_pairs
from suffixmem.engine.protocol import Message

MAX_STATES = 4096  # 27-62 KB each (8 to 50 short turns)


class TopicCache:
    """Topic verdicts per session key over one lazily built detector."""

    def __init__(self, enabled: bool, detector: TopicDetector | None,
                 factory: Callable[[], TopicDetector]) -> None:
        self.enabled = enabled
        self._detector = detector
        self._factory = factory
        self._build_lock = threading.Lock()
        self._states: OrderedDict[str, tuple[int, TopicState]] = OrderedDict()
        # stateless keys: (history stamp, state, the message judged, its verdict's jump)
        self._resent: OrderedDict[str, tuple[int, TopicState, str, bool]] = OrderedDict()
        self._lock = threading.Lock()

    def detector(self) -> TopicDetector:
        with self._build_lock:
            if self._detector is None:
                self._detector = self._factory()
                heap.settle()  # its vocabulary out of full collections (suffixmem.heap)
            return self._detector

    def verdict(self, key: str, history: Sequence[Message], user_text: str | None,
                fresh: bool, *, stateless: bool = False) -> TopicVerdict:
        """Is ``user_text`` a jump from ``history``? (``fresh``: do not trust the cache;
        ``stateless``: ``history`` is a resent conversation, see the module docstring)."""
        if not self.enabled:
            return TopicVerdict(False, None, reason="detection off")
        if user_text is None:
            return TopicVerdict(False, None, reason="no user message")
        if stateless:
            return self._resent_verdict(key, history, user_text)
        detector = self.detector()
        cached = None if fresh else self._states.get(key)
        if cached is None or cached[0] != len(history):
            state = detector.replay(turn_pairs(history))
            if not fresh:
                self._keep(key, (len(history), state))
        else:
            state = cached[1]
            with self._lock:  # another session's turn may have dropped it meanwhile
                if key in self._states:
                    self._states.move_to_end(key)
        return detector.observe_user(state, user_text)

    def advance(self, plan: Plan, reply: str) -> None:
        """Account the committed turn (or drop the state, rebuilt on the next turn)."""
        spec = plan.spec
        cached = self._states.get(spec.key)
        if (not self.enabled or spec.user_text is None or spec.fresh_topic or cached is None
                or cached[0] != len(spec.history)):
            self._states.pop(spec.key, None)
            return
        self.detector().add_turn(cached[1], spec.user_text, reply, plan.verdict.jump)
        self._keep(spec.key, (len(spec.history) + len(spec.to_store) + 1, cached[1]))

    def _resent_verdict(self, key: str, history: Sequence[Message],
                        user_text: str) -> TopicVerdict:
        detector = self.detector()
        with self._lock:  # taken out: a concurrent call with this key replays instead
            entry = self._resent.pop(key, None)
        state = None
        if entry is not None and len(history) >= 2:
            stamp, kept, judged, jump = entry
            asked, reply = history[-2], history[-1]
            if (asked.role == "user" and asked.content == judged and reply.role == "assistant"
                    and stamp == _stamp(history[:-2])):
                detector.add_turn(kept, judged, reply.content, jump)
                state = kept
        if state is None:
            state = detector.replay(turn_pairs(history))
        verdict = detector.observe_user(state, user_text)
        self._keep(key, (_stamp(history), state, user_text, verdict.jump), self._resent)
        return verdict

    def _keep(self, key: str, entry: Any, states: OrderedDict[str, Any] | None = None) -> None:
        """``entry`` as ``key``'s latest in ``states`` (the sessions' by default), least
        recently used dropped past ``MAX_STATES``."""
        states = self._states if states is None else states
        with self._lock:  # sessions' turns run in several threads at once
            states[key] = entry
            states.move_to_end(key)
            while len(states) > MAX_STATES:
                states.popitem(last=False)

    def forget(self, key: str) -> None:
        with self._lock:
            self._states.pop(key, None)
            self._resent.pop(key, None)


def _stamp(history: Sequence[Message]) -> int:
    """What a resent history was, for equality within this process (string hashes are
    cached on the strings, salted per process)."""
    return hash(tuple((m.role, m.content) for m in history))
