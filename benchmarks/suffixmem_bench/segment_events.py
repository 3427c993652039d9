"""Real reuse events of the ``overflow`` and ``rag`` workloads, for ``bench segments``.

An event is a turn whose prompt holds KV the session computed the turn before at other
positions: the kept turns after the stable layout dropped old ones (``overflow``), the history
and the passages retrieved again after the system prompt changed (``rag``). The workload's
sessions are replayed through the torch engine (exact, greedy, replies of the workload's
``max_tokens``, so the history is the model's own), each prompt built the way the chat harness
builds it:

- ``overflow``: the manager's ``CacheStableLayout`` (evict to half) within
  ``max_model_len - max_tokens`` of the pinned 2,048-token window;
- ``rag``: ``[system prompt with this turn's passages][history][question]``, the
  ``CondensePlusContextChatEngine`` layout of ``workloads/rag.py``. Its events also place the
  passages an earlier prompt (of any session) computed, as the shared paragraphs an
  approximate manager marks (``layout.passage_segments``) are served from the segment cache.

At each turn after the first, the runs that context shift finds (``find_runs`` against the
previous sequence, prompt plus reply, as far as its whole blocks go, from the prefix cache's
whole-block hit on, at least ``min_run`` tokens, never the last prompt token) become the
event's segments, as a ``ScenarioPrompt`` whose one fill is the
previous sequence. ``overflow`` keeps only the turns where the layout evicted (the others are
prefix-cache hits with nothing to shift). Events are what the engine's hook would place; their
quality is measured like the scenarios' (``segment_scenarios.methods_quality``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from suffixmem_bench.chat.metrics import common_prefix_len
from suffixmem_bench.segment_scenarios import ScenarioPrompt

EVENT_WORKLOADS: tuple[str, ...] = ("overflow", "rag")
BLOCK = 16  # the torch engine's block size: a prefix-cache hit covers whole blocks
TASK_CONTINUATION = 24  # "The code of this chat is 4821." and what ends the number


def shift_event(previous: Sequence[int], ids: Sequence[int], min_run: int = 32
                ) -> ScenarioPrompt | None:
    """The event of prompt ``ids`` after the session's ``previous`` sequence, or ``None`` when
    context shift would find nothing past the prefix-cache hit."""
    from suffixmem.engine.reuse.context_shift import ShiftRun, find_runs

    start = min(common_prefix_len(previous, ids), len(ids) - 1) // BLOCK * BLOCK
    # the previous sequence's KV lies in whole cached blocks (its last token was never fed)
    cached = previous[:(len(previous) - 1) // BLOCK * BLOCK]
    runs = []
    for r in find_runs(cached, ids, start, min_run):
        if r.new_end >= len(ids):  # the last prompt token is always computed
            r = ShiftRun(r.new_start, r.old_start, len(ids) - 1 - r.new_start)
        if r.length >= min_run:
            runs.append(r)
    if not runs:
        return None
    return ScenarioPrompt(
        list(ids), tuple((r.new_start, r.new_end) for r in runs),
        ((list(previous), tuple((r.old_start, r.old_start + r.length) for r in runs)),),
        tuple((0, r.old_start) for r in runs))


def _reply(engine: Any, key: str, ids: Sequence[int], max_tokens: int
           ) -> tuple[list[int], str]:
    """The greedy reply's ids (without the end of turn) and text, exact mode."""
    from suffixmem.engine.protocol import Request, SamplingParams

    r = engine.generate(Request(key, token_ids=list(ids),
                                sampling=SamplingParams(max_tokens=max_tokens)))
    return list(r.token_ids), r.text or " "


def overflow_events(engine: Any, count: Callable[[str], int], sessions: int = 2,
                    turns: int | None = None, max_model_len: int | None = None,
                    tag: str = "ev") -> list[ScenarioPrompt]:
    """The eviction turns of the first ``sessions`` sessions of ``overflow`` (module docs)."""
    from suffixmem.conversation.layout import CacheStableLayout
    from suffixmem.engine.protocol import Message
    from suffixmem_bench.workloads import overflow

    sizes = {"sessions": sessions, **({"turns": turns} if turns else {})}
    w = overflow.build(count, **sizes)
    window = max_model_len or overflow.ENGINE_OPTIONS["max_model_len"]
    budget = window - w.max_tokens
    layout = CacheStableLayout()
    events: list[ScenarioPrompt] = []
    for s, users in enumerate(w.sessions):
        history: list[Message] = []
        start = 0
        previous: list[int] | None = None
        for user in users:
            p = layout.build(engine, w.system_prompt, history, user, (), start, budget)
            start = p.window_start
            ids = list(p.token_ids)
            if p.evicted_turns and previous is not None:
                event = shift_event(previous, ids)
                if event is not None:
                    events.append(event)
            reply, text = _reply(engine, f"{tag}-overflow-{s}", ids, w.max_tokens)
            previous = ids + reply
            # the manager stores the generated ids and renders the next prompt from them
            keep = tuple(reply) if reply and engine.detokenize(reply) == text else None
            history += [Message("user", user), Message("assistant", text, token_ids=keep)]
    return events


def rag_event(previous: Sequence[int] | None, ids: Sequence[int],
              passages: Sequence[tuple[int, int]],
              seen: dict[tuple[int, ...], tuple[list[int], int]],
              min_run: int = 32) -> ScenarioPrompt | None:
    """The event of ``rag`` prompt ``ids``: its marked ``passages`` (spans) that an earlier
    prompt computed (``seen``: a passage's ids -> the prompt that stored it in the shared
    segment cache, and where), placed from that prompt; then context shift's runs against the
    session's ``previous`` sequence over the rest. ``None`` when neither reuses anything past
    the prefix-cache hit. ``seen`` learns this prompt's new passages."""
    from suffixmem.engine.reuse.context_shift import subtract

    start = min(common_prefix_len(previous, ids), len(ids) - 1) // BLOCK * BLOCK if previous else 0
    fills: list[tuple[list[int], tuple[tuple[int, int], ...]]] = []
    spans: list[tuple[int, int]] = []
    origin: list[tuple[int, int]] = []
    this = list(ids)
    index: dict[int, int] = {}  # id(fill prompt) -> its index in ``fills``
    for a, b in passages:
        key = tuple(ids[a:b])
        if key not in seen:  # stored by this prompt (even behind a prefix-cache hit)
            seen[key] = (this, a)
            continue
        if a < start or b >= len(ids):  # the prefix cache serves it; the last token computes
            continue
        fill, at = seen[key]
        i = index.setdefault(id(fill), len(fills))
        if i == len(fills):
            fills.append((fill, ()))
        fills[i] = (fill, (*fills[i][1], (at, at + b - a)))
        spans.append((a, b))
        origin.append((i, at))
    if previous is not None:
        shift = shift_event(previous, ids, min_run)
        if shift is not None:
            from suffixmem.engine.reuse.context_shift import ShiftRun

            runs = [ShiftRun(a, o, b - a) for (a, b), (_, o) in zip(shift.spans, shift.origin,
                                                                   strict=True)]
            runs = subtract(runs, spans, min_run)
            if runs:
                spans += [(r.new_start, r.new_end) for r in runs]
                origin += [(len(fills), r.old_start) for r in runs]
                fills.append((list(previous),
                              tuple((r.old_start, r.old_start + r.length) for r in runs)))
    if not spans:
        return None
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    return ScenarioPrompt(list(ids), tuple(spans[i] for i in order), tuple(fills),
                          tuple(origin[i] for i in order))


def rag_events(engine: Any, count: Callable[[str], int], sessions: int = 2,
               turns: int | None = None, tag: str = "ev") -> list[ScenarioPrompt]:
    """Every turn of the first ``sessions`` sessions of ``rag`` that reuses something: passages
    of its system prompt an earlier prompt (of any session) computed, the shared paragraphs an
    approximate manager marks (``layout.passage_segments``), and context shift's runs against
    the session's previous sequence (module docs)."""
    from suffixmem.conversation.layout import passage_segments
    from suffixmem.engine.protocol import Message
    from suffixmem_bench.workloads import rag

    sizes = {"sessions": sessions, **({"turns": turns} if turns else {})}
    w = rag.build(count, **sizes)
    events: list[ScenarioPrompt] = []
    seen: dict[tuple[int, ...], tuple[list[int], int]] = {}
    for s, users in enumerate(w.sessions):
        history: list[Message] = []
        previous: list[int] | None = None
        for t, user in enumerate(users):
            system = w.turn_systems[s][t]
            msgs = [Message("system", system), *history, Message("user", user)]
            ids = engine.render(msgs)
            marked = [(p.start, p.end) for p in passage_segments(engine, system, ids)]
            event = rag_event(previous, ids, marked, seen)
            if event is not None:
                events.append(event)
            reply, text = _reply(engine, f"{tag}-rag-{s}", ids, w.max_tokens)
            previous = ids + reply
            # the framework resends the history as text, re-tokenized every turn
            history += [Message("user", user), Message("assistant", text)]
    return events


def build_events(engine: Any, count: Callable[[str], int], sessions: int = 2,
                 turns: dict[str, int] | None = None,
                 workloads: Sequence[str] = EVENT_WORKLOADS) -> dict[str, list[ScenarioPrompt]]:
    """``{"overflow": [...], "rag": [...]}`` (see the module docstring), for ``workloads``."""
    turns = turns or {}
    build = {"overflow": overflow_events, "rag": rag_events}
    return {name: build[name](engine, count, sessions, turns.get(name)) for name in workloads}


def event_summary(events: Sequence[ScenarioPrompt]) -> dict[str, float]:
    """How many events, their mean prompt length and the share of it the runs cover."""
    if not events:
        return {"events": 0, "prompt_tokens_mean": 0.0, "shifted_share": 0.0}
    return {
        "events": len(events),
        "prompt_tokens_mean": sum(len(e.ids) for e in events) / len(events),
        "shifted_share": sum(sum(b - a for a, b in e.spans) / len(e.ids) for e in events)
        / len(events),
    }


WORKLOAD_CLASSES: dict[str, str] = {
    "documents": "documents cached on their own and reused behind other context (a RAG chunk "
                 "cache, marked passages): the independent construction",
    "overflow": "kept turns after the stable layout dropped old ones (context shift)",
    "rag": "passages and history after the system prompt changed (CondensePlusContext)",
}


def workload_defaults(independent: dict[str, float] | None, method: str | None,
                      events: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per workload class, whether segment reuse is on by default (exactly when its gate
    passes there, with the method chosen there) and why, from the measurements:
    ``independent`` is the independent construction's row through the engine with ``method``;
    ``events`` is ``measure_events``' result."""
    out = {"documents": gate_verdict(independent, method)}
    out.update(event_defaults(events, EVENT_WORKLOADS))
    return out


def event_defaults(events: dict[str, dict[str, Any]], names: Sequence[str] | None = None
                   ) -> dict[str, dict[str, Any]]:
    """``workload_defaults``' verdicts for the event workloads ``names`` (default: those in
    ``events``; one missing there is "not measured")."""
    from suffixmem_bench.segment_chain import chained_verdict

    out = {}
    for name in list(events) if names is None else names:
        ev = events.get(name) or {}
        chosen = ev.get("chosen")
        out[name] = chained_verdict(
            gate_verdict(ev.get("methods", {}).get(chosen) if chosen else None, chosen),
            ev.get("chained"))
    return out


def gate_verdict(row: dict[str, float] | None, method: str | None) -> dict[str, Any]:
    """Whether segment reuse is on by default for a class measured as ``row`` with ``method``,
    and why."""
    from suffixmem_bench.segment_scenarios import GATE, gate_passed

    if not row:
        return {"segment_reuse": False, "method": None,
                "why": "not measured: exact mode stays the default"}
    ok = gate_passed(row)
    misses = [name for name, bad in (
        ("top-1", row["top1_agreement"] < GATE["top1_min"]),
        ("KL", row["mean_kl"] > GATE["kl_max"]),
        ("free-running", row["free_running_agreement"] < GATE["free_min"]),
        ("task", row["task_agreement"] < GATE["task_min"])) if bad]
    why = ("gate passed" if ok else "gate missed on " + ", ".join(misses)
           + ": exact mode stays the default")
    return {"segment_reuse": ok, "method": method, "why": why,
            **{k: row[k] for k in ("mean_kl", "top1_agreement", "free_running_agreement",
                                   "task_agreement")}}


def measure_events(llama: Any, engine: Any, encode: Callable[[str], list[int]],
                   methods: Sequence[Any], continuation: int = 48, sessions: int = 2,
                   turns: dict[str, int] | None = None,
                   decode: Callable[[list[int]], str] | None = None,
                   progress: Callable[[str], None] | None = None,
                   workloads: Sequence[str] = EVENT_WORKLOADS) -> dict[str, dict[str, Any]]:
    """Per event workload: the events' summary, every method's quality on them
    (``methods_quality``, on ``llama``: load it in the serving dtype), the method
    ``choose_method`` picks and whether it passes the gate. Each method's ``task_agreement``
    (and ``task_exact_accuracy``) come from the events with a code planted in their longest
    reused span and asked for (``segment_task.plant_all``, ``task_events`` of them); the
    first-line check on the workload's own question stays as ``first_line_agreement``.
    Workloads without an event report ``events: 0`` and no method."""
    from suffixmem_bench.segment_scenarios import choose_method, methods_quality
    from suffixmem_bench.segment_task import plant_all

    say = progress or (lambda _m: None)
    count = lambda text: len(encode(text))  # noqa: E731
    out: dict[str, dict[str, Any]] = {}
    for name, evs in build_events(engine, count, sessions, turns, workloads).items():
        summary = event_summary(evs)
        if not evs:
            out[name] = {**summary, "methods": {}, "chosen": None, "passed": False}
            continue
        say(f"{name}: {len(evs)} reuse events x {len(methods)} methods")
        rows = methods_quality(llama, evs, methods, continuation, decode)
        planted = plant_all(evs, encode)
        say(f"{name}: the task check on {len(planted)} events with a planted code")
        if planted:
            by_task = methods_quality(llama, planted, methods, TASK_CONTINUATION, decode)
            for label, row in rows.items():
                row.update({k: v for k, v in by_task[label].items()
                            if k.startswith("task_")})
        chosen, passed = choose_method(rows)
        out[name] = {**summary, "task_events": len(planted), "methods": rows, "chosen": chosen,
                     "passed": passed}
    return out


def check_event_workloads(names: Sequence[str]) -> None:
    """``ValueError`` naming what is wrong unless ``names`` are some of ``EVENT_WORKLOADS``."""
    unknown = [w for w in names if w not in EVENT_WORKLOADS]
    if unknown or not names:
        raise ValueError(f"event workloads {unknown or '(none)'}: expected some of "
                         f"{', '.join(EVENT_WORKLOADS)}")


SERVE_DTYPES = ("auto", "float32", "bfloat16")


def serving_engine(model: str, threads: int, dtype: str = "auto") -> Any:
    """The torch engine ``bench segments`` replays and times through (``dtype``: by default
    ``auto``, bf16 with AVX-512 BF16 or CUDA, else fp32; ``float32`` replays on any host what
    a host without AVX-512 BF16 serves; a 4,096-token window, a 0.5 GiB pool, ``threads``
    torch threads). ``public-prefix`` scope, so that the ``shared`` segments one
    prompt computed serve the next (another session key); the bench's segments never start
    at position 0, so no prefix-cache block is shared."""
    from suffixmem.engine import create_engine

    return create_engine("torch", model=model, max_model_len=4096, kv_cache_gib=0.5,
                         isolation="public-prefix", dtype=dtype,
                         extra={"num_threads": threads})


def serving_dtype(engine: Any) -> str:
    """The dtype ``engine`` serves in: the quality primitives load the model in it, so that
    the gate measures the rounding users get (bf16 where it is native; fp32 on a CPU without
    AVX-512 BF16, where ``auto`` serves fp32 and a bf16 replay would measure what nobody
    serves, ~8x slower)."""
    return str(engine.stats().extra["dtype"])


def run_events(workloads: Sequence[str], sessions: int, turns: int | None = None,
               methods: Sequence[str] | None = None, model: str | None = None, threads: int = 1,
               continuation: int = 48, progress: Callable[[str], None] | None = None,
               chained: int = 0, chained_method: str | None = None,
               serve_dtype: str = "auto") -> dict[str, Any]:
    """Only the reuse events of ``workloads`` (``bench segments --events``): a larger replay
    than the whole bench affords (``sessions``, ``turns`` per session; None: the workload's
    pinned turns), every method of ``methods`` (labels; None: all) on them. JSON: ``events``
    and ``workload_defaults`` as in the whole bench, for those workloads only, and ``setup``.
    ``chained > 0`` (with ``rag``): also ``events.rag.chained``, that many whole sessions
    served with the engine's own method (or ``chained_method``, a label), reuse chained turn
    over turn (``segment_chain``). ``serve_dtype``: the dtype the engine serves, and with it
    the replay's and the chained sessions' (``SERVE_DTYPES``)."""
    import time

    import torch

    from suffixmem.config import DEFAULT_MODEL
    from suffixmem.engine.torch.kv_pool import torch_dtype
    from suffixmem.engine.torch.llama import Llama
    from suffixmem_bench.segment_prompts import model_codec
    from suffixmem_bench.segment_scenarios import blends, parse_method

    check_event_workloads(workloads)
    t0 = time.perf_counter()
    torch.set_num_threads(threads)
    model = model or DEFAULT_MODEL
    path, encode, decode = model_codec(model)
    method_list = [parse_method(m) for m in methods] if methods else blends()
    engine = serving_engine(model, threads, serve_dtype)
    dtype = serving_dtype(engine)
    try:
        llama = Llama.from_pretrained(path, torch_dtype(dtype))
        events = measure_events(llama, engine, encode, method_list, continuation, sessions,
                                {w: turns for w in workloads} if turns else None, decode,
                                progress, workloads)
    finally:
        engine.close()
    if chained and "rag" in events:
        from suffixmem_bench.segment_chain import measure_chain

        events["rag"]["chained"] = measure_chain(model, threads, lambda text: len(encode(text)),
                                                 decode, chained, turns, progress=progress,
                                                 method=chained_method, dtype=dtype)
    return {
        "events": events, "workload_defaults": event_defaults(events),
        "setup": {"workloads": list(workloads), "event_sessions": sessions,
                  "event_turns": turns, "continuation": continuation,
                  "methods": [m.label() for m in method_list], "threads": threads,
                  "chained_sessions": chained, "chained_method": chained_method,
                  "dtype": dtype, "seconds": round(time.perf_counter() - t0, 1)},
    }
