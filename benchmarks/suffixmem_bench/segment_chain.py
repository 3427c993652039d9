"""Chained reuse: whole ``rag`` sessions served with segment reuse (``bench segments --chained``).

``bench segments --events rag`` measures each reuse event once: the fill the event reuses from
is computed exactly. Serving chains them: turn t places the history from turn t-1's sequence,
whose history was itself placed from turn t-2's, so an early message's KV is re-placed at every
later turn, each time by the approximate method. This module measures what users get from
that chain, through the serving engine, against two references on the same prompts:

- **exact**: the same prompt computed exactly (``exact=True``, its own session key);
- **one hop** (unchained): a fresh session key that first computes the previous turn's sequence
  exactly (prompt plus the reply the chained run gave; ``exact=False`` without marked passages,
  so nothing is placed and context shift has nothing to shift from), then sends this turn's
  prompt with reuse: what ``--events`` measures, one placement from exact KV.

Each session plants ``The code of this chat is NNNN.`` in its first user message; after every
later turn a side request (the turn's system prompt and history, then ``QUESTION``) asks for
the code in all three arms, and the answers (``answer_of``) are compared with the exact one.
The side request goes to the chained session's own key: it continues the turn's sequence (a
prefix-cache hit on the turn's placed KV, no new placement), and the next turn shifts from it.
Its one-hop arm computes the turn before's sequence exactly and places the history from it.
The history is the chained run's own replies (the conversation as served); every arm sees the
same token ids each turn.

Figures per arm: free-running agreement of the turn's greedy reply with the exact reply (the
shared prefix's share of the longer of the two; 1.0 when identical) and task agreement with the
exact answer; ``by_turn`` gives them per turn index, where drift along the chain would show.
``chained_verdict`` adds the chained task agreement to the rag class's default: below the
gate's task bar, the class stays exact.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

SIDE_TOKENS = 24  # "The code of this chat is 4821." and what ends the number


@dataclass(slots=True, frozen=True)
class ChainTurn:
    """One turn of a chained session: agreement of each arm with the exact run. ``answers``
    (the code question after this turn: exact, chained, one hop) is empty on the first turn,
    as is ``free_unchained`` (no previous turn to place from)."""

    session: int
    turn: int
    prompt_tokens: int
    reused_chained: int
    reused_unchained: int
    free_chained: float
    free_unchained: float | None
    code: str
    answers: tuple[str, ...] = ()


def agreement(reference: Sequence[int], other: Sequence[int]) -> float:
    """The shared leading tokens' share of the longer reply (1.0 when identical)."""
    from suffixmem_bench.chat.metrics import common_prefix_len

    if list(reference) == list(other):
        return 1.0
    return common_prefix_len(reference, other) / max(len(reference), len(other))


def chain_session(engine: Any, workload: Any, s: int, code: int,
                  decode: Callable[[list[int]], str], tag: str = "chain") -> list[ChainTurn]:
    """Serve session ``s`` of the ``rag`` ``workload`` in the three arms (module docs)."""
    from suffixmem.conversation.layout import passage_segments
    from suffixmem.engine.protocol import Message, Request, SamplingParams
    from suffixmem_bench.segment_task import CODE, EVENT_NAME, QUESTION, answer_of

    def gen(key: str, ids: Sequence[int], segments: Sequence[Any] = (), exact: bool = True,
            max_tokens: int = workload.max_tokens) -> tuple[list[int], int]:
        r = engine.generate(Request(key, token_ids=list(ids), segments=tuple(segments),
                                    exact=exact, sampling=SamplingParams(
                                        max_tokens=max_tokens, temperature=0.0)))
        return list(r.token_ids), int(r.reused_segment_tokens)

    def one_hop(key: str, before: Sequence[int], ids: Sequence[int], segments: Sequence[Any],
                max_tokens: int) -> tuple[list[int], int]:
        gen(key, before, (), exact=False, max_tokens=1)  # exact: nothing cached under ``key``
        return gen(key, ids, segments, exact=False, max_tokens=max_tokens)

    users = list(workload.sessions[s])
    users[0] = f"{CODE.format(name=EVENT_NAME, code=code)} {users[0]}"
    question = QUESTION.format(name=EVENT_NAME)
    chained_key, exact_key = f"{tag}-c{s}", f"{tag}-x{s}"
    history: list[Message] = []
    previous: list[int] | None = None
    out: list[ChainTurn] = []
    for t, user in enumerate(users):
        system = workload.turn_systems[s][t]
        ids = engine.render([Message("system", system), *history, Message("user", user)])
        marked = passage_segments(engine, system, ids)
        exact, _ = gen(exact_key, ids)
        chained, reused = gen(chained_key, ids, marked, exact=False)
        free_u, reused_u = None, 0
        if previous is not None:
            hop, reused_u = one_hop(f"{tag}-u{s}-{t}", previous, ids, marked, workload.max_tokens)
            free_u = agreement(exact, hop)
        history += [Message("user", user), Message("assistant", decode(chained) or " ")]
        answers: tuple[str, ...] = ()
        if t >= 1:
            side = engine.render([Message("system", system), *history,
                                  Message("user", question)])
            side_marked = passage_segments(engine, system, side)
            # one hop: from the turn before's sequence, so that the side prompt places the
            # history once (from this turn's own sequence it would be a prefix hit: exact)
            assert previous is not None
            replies = [gen(exact_key, side, max_tokens=SIDE_TOKENS)[0],
                       gen(chained_key, side, side_marked, False, SIDE_TOKENS)[0],
                       one_hop(f"{tag}-v{s}-{t}", previous, side, side_marked,
                               SIDE_TOKENS)[0]]
            answers = tuple(answer_of(decode(r)) for r in replies)
        out.append(ChainTurn(s, t, len(ids), reused, reused_u, agreement(exact, chained),
                             free_u, str(code), answers))
        previous = ids + chained
    return out


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def summarize(turns: Sequence[ChainTurn]) -> dict[str, Any]:
    """The figures of chained turns (module docs): per arm, over turns after the first."""
    later = [t for t in turns if t.free_unchained is not None]
    asked = [t for t in turns if t.answers]

    def figures(rows: Sequence[ChainTurn], questions: Sequence[ChainTurn]) -> dict[str, Any]:
        return {
            "free_running_agreement": _mean([t.free_chained for t in rows]),
            "free_running_unchained": _mean([t.free_unchained or 0.0 for t in rows]),
            "task_agreement": _mean([t.answers[1] == t.answers[0] for t in questions]),
            "task_agreement_unchained": _mean([t.answers[2] == t.answers[0] for t in questions]),
            "task_exact_accuracy": _mean([t.answers[0] == t.code for t in questions]),
            "task_reuse_accuracy": _mean([t.answers[1] == t.code for t in questions]),
        }

    last = max((t.turn for t in turns), default=0)
    return {
        "sessions": len({t.session for t in turns}), "turns": len(later),
        "task_events": len(asked),
        "reused_tokens_mean": _mean([t.reused_chained for t in later]),
        "reused_tokens_unchained_mean": _mean([t.reused_unchained for t in later]),
        **figures(later, asked),
        "by_turn": {str(n): figures([t for t in later if t.turn == n],
                                    [t for t in asked if t.turn == n])
                    for n in range(1, last + 1)},
    }


def measure_chain(model: str, threads: int, count: Callable[[str], int],
                  decode: Callable[[list[int]], str], sessions: int, turns: int | None = None,
                  seed: int = 0, progress: Callable[[str], None] | None = None,
                  method: str | None = None, dtype: str | None = None) -> dict[str, Any]:
    """``summarize`` over the first ``sessions`` sessions of the ``rag`` workload (``turns``
    per session, None: the pinned 10) served on a torch engine as users get it: its default
    method for the dtype it serves and the default ``session`` isolation scope (so that a
    one-hop key finds no passage another key computed), a 4,096-token window, ``threads``
    torch threads; plus that method's label and the dtype served. ``method`` (a
    ``BlendConfig`` label) replaces the default method; ``dtype`` (``float32``, ``bfloat16``)
    the engine's default dtype, and with it the default method (``blend.default_blend``)."""
    from suffixmem.engine import create_engine
    from suffixmem_bench.segment_events import serving_dtype
    from suffixmem_bench.workloads import rag

    say = progress or (lambda _m: None)
    w = rag.build(count, sessions=sessions, **({"turns": turns} if turns else {}))
    rng = random.Random(seed)
    rows: list[ChainTurn] = []
    engine = create_engine("torch", model=model, max_model_len=4096, kv_cache_gib=0.5,
                           extra={"num_threads": threads},
                           **({"segment_method": method} if method else {}),
                           **({"dtype": dtype} if dtype else {}))
    try:
        blend = engine.reuse.blend  # type: ignore[attr-defined]
        for s in range(sessions):
            say(f"rag chained: session {s + 1} of {sessions} ({blend.label()})")
            rows += chain_session(engine, w, s, rng.randrange(1000, 10000), decode)
        served = serving_dtype(engine)
    finally:
        engine.close()
    return {**summarize(rows), "method": blend.label(), "dtype": served}


def chained_verdict(verdict: dict[str, Any], chained: dict[str, Any] | None) -> dict[str, Any]:
    """``verdict`` with whole sessions served by its method (``segment_chain``), when they
    were: reuse placed on reuse turn over turn must also keep the task check's bar (answers as
    the exact run's), or the class stays exact. Sessions served by another method only
    report theirs."""
    from suffixmem_bench.segment_scenarios import GATE

    if not chained or chained.get("task_agreement") is None:
        return verdict
    out = {**verdict, "chained_method": chained["method"],
           "chained_task_agreement": chained["task_agreement"]}
    if (verdict["segment_reuse"] and chained["method"] == verdict["method"]
            and chained["task_agreement"] < GATE["task_min"]):
        out.update(segment_reuse=False,
                   why="gate missed on the chained sessions' task: exact mode stays the default")
    return out
