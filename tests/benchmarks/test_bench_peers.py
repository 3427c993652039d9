"""The peers' text history: with a token budget it slides like a framework's window (oldest
exchanges dropped whole, the system prompt kept, the newest exchanges kept), so a peer can run
a workload whose history outgrows the context; without one it keeps everything."""

from __future__ import annotations

from suffixmem_bench.chat.peers import TextHistory

SYSTEM = "You are a careful assistant. " * 20


def _fill(chat: TextHistory, session: int, turns: int) -> None:
    chat.open(session, SYSTEM)
    for i in range(turns):
        chat.append(session, f"question number {i} about the weather in town {i}?",
                    f"answer number {i}: it is sunny in town {i}, " + "really " * 12)


def test_window_keeps_system_and_newest_exchanges_within_budget(tokenizer) -> None:  # type: ignore[no-untyped-def]
    unbounded = TextHistory(tokenizer)
    _fill(unbounded, 0, 30)
    full = unbounded.prompt_ids(0, "and tomorrow?")
    budget = len(full) // 2
    chat = TextHistory(tokenizer, budget=budget)
    _fill(chat, 0, 30)

    ids = chat.prompt_ids(0, "and tomorrow?")
    text = tokenizer.decode(ids)
    assert len(ids) <= budget < len(full)
    assert text.count("careful assistant") == 20  # the system prompt is never trimmed
    assert "question number 29 " in text and "answer number 29:" in text
    dropped = chat.start[0]
    assert dropped == chat.dropped_turns == chat.last_dropped[0] > 0
    chat.append(0, "and tomorrow?", "rain")
    chat.prompt_ids(0, "ok")  # the next prompt fits after at most one more exchange goes
    assert chat.last_dropped[0] <= 1 and chat.start[0] == dropped + chat.last_dropped[0]
    chat.start[0] = dropped
    # whole exchanges go: the oldest kept exchange has both its question and its answer
    assert f"question number {dropped - 1} " not in text
    assert f"answer number {dropped - 1}:" not in text
    assert f"question number {dropped} " in text and f"answer number {dropped}:" in text
    # one exchange fewer would not have fitted: the window drops only what it must
    chat.start[0] = dropped - 1
    assert len(tokenizer(chat.prompt_text(0, "and tomorrow?"),
                         add_special_tokens=False)["input_ids"]) > budget


def test_window_only_moves_forward_and_sessions_are_independent(tokenizer) -> None:  # type: ignore[no-untyped-def]
    chat = TextHistory(tokenizer, budget=400)
    _fill(chat, 0, 30)
    _fill(chat, 1, 2)
    chat.prompt_ids(0, "a long question " * 20)
    after_long = chat.start[0]
    chat.prompt_ids(0, "ok?")  # a shorter prompt does not bring dropped exchanges back
    assert chat.start[0] == after_long > 0
    assert chat.start[1] == 0
    assert len(chat.prompt_ids(1, "ok?")) <= 400


def test_without_budget_nothing_is_dropped(tokenizer) -> None:  # type: ignore[no-untyped-def]
    chat = TextHistory(tokenizer)
    _fill(chat, 0, 30)
    text = tokenizer.decode(chat.prompt_ids(0, "and tomorrow?"))
    assert "question number 0 " in text and chat.dropped_turns == 0
