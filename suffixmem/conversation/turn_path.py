"""The manager's turn path after planning: lock, topic step, stream, commit, bookkeeping.

A mixin of ``ConversationManager`` (its engine, store, locks, topic cache and background
worker; ``_plan`` and ``_temperature`` are the manager's). The steps and what each costs the
caller are in ``turns``' module docstring; this module is the code. Only the per-session locks
are taken: turns of different sessions share no lock here (the background worker is a queue,
and each of its jobs has its own lock).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from collections.abc import Callable, Generator, Iterator

from suffixmem.conversation import segment_log
from suffixmem.conversation.background import Background, Job
from suffixmem.conversation.cluster import SharedTurnLock
from suffixmem.conversation.locks import SessionLocks
from suffixmem.conversation.manager_config import ManagerConfig
from suffixmem.conversation.records import NewSession
from suffixmem.conversation.store import Store
from suffixmem.conversation.topic import TopicVerdict
from suffixmem.conversation.topic_cache import TopicCache
from suffixmem.conversation.turns import (
    Plan,
    TurnResult,
    TurnSpec,
    no_lock,
    stored_counts,
    stream_turn,
    turn_event,
    turn_messages,
    turn_result,
)
from suffixmem.conversation.versions import Versions
from suffixmem.engine.protocol import Engine, Result, TokenEvent
from suffixmem.errors import InvalidRequestError
from suffixmem.retention import RetentionPolicy
from suffixmem.tokens import TokenCounter

log = logging.getLogger("suffixmem.conversation.manager")
# finished topic updates are dropped once the map holds this many (``_bookkeep``)
TOPIC_UPDATES_PRUNE_AT = 2048


class TurnStream(Iterator[TokenEvent | TurnResult]):
    """A turn's events. Closed by a later call of the same consumer on the session while it
    was paused (``SessionLocks.park``: waiting would deadlock on the lock this stream holds),
    the turn is not stored, and stepping the stream again raises ``InvalidRequestError``
    rather than ending as if the reply were complete."""

    __slots__ = ("__weakref__", "_gen", "_taken_over", "session_id")

    def __init__(self, gen: Generator[TokenEvent | TurnResult, None, None],
                 session_id: str | None) -> None:
        self._gen, self.session_id, self._taken_over = gen, session_id, False

    def __next__(self) -> TokenEvent | TurnResult:
        if self._taken_over:
            raise InvalidRequestError(
                f"this stream of session {self.session_id!r} was closed unfinished, and its "
                "turn not stored: the same caller made another call on the session while it "
                "was paused (finish or close a stream before the next call on its session)")
        return next(self._gen)

    def take_over(self) -> None:
        self._gen.close()  # raises if it is being stepped: then it is not taken over
        self._taken_over = True

    def close(self) -> None:
        self._gen.close()


class TurnPath:
    """Running planned turns (module docstring)."""

    engine: Engine
    config: ManagerConfig
    store: Store
    counter: TokenCounter
    retention: RetentionPolicy
    topics: TopicCache
    rag_reuse: bool  # ManagerConfig.rag_reuse, resolved against the engine
    _locks: SessionLocks
    _shared: SharedTurnLock
    _versions: Versions
    _background: Background
    # session -> its last turn's topic update (a Job): the next verdict runs it first
    _topic_updates: dict[str, Job]

    def _plan(self, spec: TurnSpec) -> Plan:
        raise NotImplementedError  # provided by ConversationManager

    def _temperature(self, spec: TurnSpec, verdict: TopicVerdict) -> float:
        raise NotImplementedError  # provided by ConversationManager

    # -- topic step -----------------------------------------------------------------------------
    def _topic_job(self, plan: Plan) -> Job:
        """The turn's verdict as a job; it first folds the session's previous reply into the
        topic state (that update may still be queued in the background)."""
        spec = plan.spec
        previous = self._topic_updates.get(spec.session_id) if spec.session_id else None

        def verdict() -> TopicVerdict:
            if previous is not None:
                previous.run()
            return self.topics.verdict(spec.key, spec.history, spec.user_text,
                                       spec.fresh_topic, stateless=spec.session_id is None)

        return Job(verdict, "topic verdict")

    def _decide(self, plan: Plan, verdict: TopicVerdict) -> None:
        plan.verdict = verdict
        plan.temperature = self._temperature(plan.spec, verdict)
        if "temperature" not in plan.spec.sampling:  # an explicit temperature always wins
            plan.sampling = dataclasses.replace(plan.sampling, temperature=plan.temperature)

    def _update_topic(self, plan: Plan, reply: str) -> None:
        try:
            self.topics.advance(plan, reply)
        except Exception:  # the next verdict replays the history instead
            log.warning("topic update of %s failed", plan.spec.key, exc_info=True)
            self.topics.forget(plan.spec.key)

    # -- the turn -------------------------------------------------------------------------------
    def _turn(self, plan: Plan, respec: Callable[[], TurnSpec]
              ) -> Iterator[TokenEvent | TurnResult]:
        """The turn's event stream (``_run``), which can close itself: a later call of the
        same consumer on the session closes it if it was left paused (``SessionLocks.park``),
        and stepping it after that raises (``TurnStream``). By a weak reference: a cycle would
        keep an abandoned stream, and its lock, until the cyclic garbage collector ran, where
        CPython now closes it as soon as nothing refers to it."""
        def close() -> None:
            stream = ref()
            if stream is not None:
                stream.take_over()

        stream = TurnStream(self._run(plan, respec, close), plan.spec.session_id)
        ref = weakref.ref(stream)
        return stream

    def _run(self, plan: Plan, respec: Callable[[], TurnSpec], close: Callable[[], None]
             ) -> Generator[TokenEvent | TurnResult, None, None]:
        sid = plan.spec.session_id
        lock = self._locks.hold(sid, f"turn {id(plan):x}") if sid is not None else no_lock()
        shared = (self._shared.hold(sid, self.config.lock_timeout_s) if sid is not None
                  else no_lock())
        with lock, shared:
            if sid is not None and (self._shared.shared
                                    or self._versions.get(sid) != plan.spec.version):
                # another turn of this manager landed meanwhile, or, on a database shared by
                # several processes, may have: plan again from what is stored now
                plan = self._plan(respec())
                # which may find the turn stateless now (one user message, sent to a session
                # that got a history meanwhile): then it stores nothing
                sid = plan.spec.session_id
            topic = self._topic_job(plan)
            # the caller fixed the temperature: the verdict does not affect generation
            alongside = "temperature" in plan.spec.sampling
            if alongside:
                self._background.put(topic)
            else:
                self._decide(plan, topic.run())
                if plan.verdict.jump and sid is not None:
                    self._release_engine(sid)
            # the stored messages' token counts are needed only by the commit
            counting = self._background.submit(
                lambda: stored_counts(plan.spec, self.counter.count), "token counts")
            engine_start = time.perf_counter()
            result: Result | None = None
            kicked = False
            for event in stream_turn(self.engine, plan, self.config.exact,
                                     self.config.context_shift, self.rag_reuse):
                if isinstance(event, Result):
                    result = event
                    continue
                if not kicked:  # prefill is done: background work may use the CPU now
                    self._background.kick()
                    kicked = True
                if sid is None:
                    yield event
                    continue
                self._locks.park(sid, close)
                yield event
                self._locks.unpark(sid)
            assert result is not None  # stream_turn raises otherwise
            done = time.perf_counter()
            if alongside:
                self._decide(plan, topic.run())  # usually finished during generation
                if plan.verdict.jump and sid is not None:
                    # now, under the session's lock: queued, it could land after the next
                    # turn and forget that turn's sequence (its next window found no shift)
                    self._release_engine(sid)
            messages, text = turn_messages(plan, result, self.engine, self.counter.count,
                                           counting.run())
            if sid is not None:
                state = {"temperature": plan.temperature,
                         "window_start": plan.prompt.window_start,
                         "create": self._with_replica(plan.spec.create, plan.spec.key),
                         "replace_history": plan.spec.replace}
                event = turn_event(plan, result)
                if self.config.durability == "sync" or self._shared.shared:
                    self.store.commit_turn(sid, messages, event, **state)
                else:  # stored by the worker; this process's next read of sid waits for it
                    self._background.put(self.store.commit_later(sid, messages, event, **state))
                self._versions.bump(sid)
                self._bookkeep(sid, plan, result, text)
            overhead = (engine_start - plan.spec.started) + (time.perf_counter() - done)
            turn = turn_result(plan, result, text, overhead)
        yield turn

    def _with_replica(self, create: NewSession | None, key: str) -> NewSession | None:
        """A new session's row, with the replica that served its first turn (the remote
        engine): written with the row, so another process routes the next turn there too
        (the pin stayed in this process's memory until it next read the session)."""
        replica_of = getattr(self.engine, "replica_of", None)
        if create is None or replica_of is None:
            return create
        return dataclasses.replace(create, replica=replica_of(key))

    def _bookkeep(self, sid: str, plan: Plan, result: Result, text: str) -> None:
        """Queue what the committed turn leaves to do; nothing here waits."""
        bg = self._background
        if plan.verdict.jump:
            # before this turn's segment log: the log then marks the new topic's segments
            bg.submit(lambda: self._release_store(sid), "release segments (store)")
        if self.config.record_segments and plan.prompt.segments:
            bg.submit(lambda: self._record_segments(sid, plan, result), "segment log")
        update = bg.submit(lambda: self._update_topic(plan, text), "topic update")
        self._topic_updates[sid] = update
        if len(self._topic_updates) > TOPIC_UPDATES_PRUNE_AT:
            # a finished update need not be waited for: keep only those still queued, so
            # the map does not hold one per session ever served
            for key in [k for k, job in list(self._topic_updates.items()) if job.done]:
                self._topic_updates.pop(key, None)

    def _record_segments(self, sid: str, plan: Plan, result: Result) -> None:
        try:
            segment_log.record(self.store, self.retention, sid, plan.prompt, result)
        except Exception:  # bookkeeping only: the turn itself is committed
            log.warning("segment bookkeeping failed for session %s", sid, exc_info=True)

    # -- releasing a session's segments ---------------------------------------------------------
    def _release(self, session_id: str) -> None:
        self._release_engine(session_id)
        self._release_store(session_id)

    def _release_engine(self, session_id: str) -> None:
        try:
            self.engine.release_session(session_id)
        except Exception:  # the cache is an optimisation; a failed release is not fatal
            log.warning("engine.release_session(%r) failed", session_id, exc_info=True)

    def _release_store(self, session_id: str) -> None:
        try:
            self.store.release_segments(session_id)
        except Exception:
            log.warning("releasing segments of %s in the store failed", session_id,
                        exc_info=True)

    def _forget(self, session_id: str) -> None:
        """The stored history changed outside a turn (caller holds the session's lock)."""
        update = self._topic_updates.pop(session_id, None)
        if update is not None:
            update.run()  # a queued update must not land on the state rebuilt from now on
        self.topics.forget(session_id)
        self._versions.bump(session_id)
