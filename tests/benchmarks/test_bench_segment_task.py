"""``bench segments``' task check (suffixmem_bench/segment_task.py): a code written into a
reused segment, at the same place in the prompt and in the fill it is reused from."""

from __future__ import annotations

import pytest

from suffixmem_bench import segment_scenarios as sc
from suffixmem_bench import segment_task as task


@pytest.fixture(scope="module")
def encode(tokenizer):  # type: ignore[no-untyped-def]
    return lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])


PIECES = ["Document 2", " code", " is", " 9", "3", "7", "6", ".", "\n", "More", "\n"]


def piece_decode(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids)


def test_answer_is_the_first_number_else_the_first_line() -> None:
    assert task.answer_of("The code of Document 2 is 9376.\nThe code of 1 is 5") == "9376"
    assert task.answer_of("\n  No Number   here\nnext") == "no number here"
    assert task.answer_of("   ") == ""
    assert task.answer_of("Document 12: 40") == "40"


def test_answer_end_counts_tokens_through_what_ends_the_number() -> None:
    assert task.answer_end(piece_decode, list(range(11))) == 8  # "." ends "9376"
    assert task.answer_end(piece_decode, list(range(6))) == 6  # "937": never ended
    assert task.answer_end(piece_decode, [0, 1, 8, 9, 10]) == 3  # no digit: the first line
    assert task.answer_end(None, [0, 1]) == 2
    assert task.first_line_end(piece_decode, [8, 9, 10]) == 3  # a leading newline does not count


def assert_spans_hold_their_fills(p: sc.ScenarioPrompt) -> None:
    for (a, b), (fi, fs) in zip(p.spans, p.origin, strict=True):
        assert p.fills[fi][0][fs:fs + b - a] == p.ids[a:b]
    for tokens, spans in p.fills:
        assert all(0 <= s < e <= len(tokens) for s, e in spans)


def test_plant_writes_the_code_into_the_longest_reused_span_and_its_fill(encode) -> None:  # type: ignore[no-untyped-def]
    user = encode(task.USER)
    p1, p2 = list(range(1000, 1064)), list(range(2000, 2020))
    fill = [1] * 10 + p1 + [2] * 26 + p2 + [3] * 4   # p1 at 10, p2 at 100
    other = [4] * 8 + list(range(3000, 3030))        # a second fill, its run at 8
    ids = [5] * 16 + p1 + [6] * 10 + p2 + list(range(3000, 3030)) + user + [7] * 5
    event = sc.ScenarioPrompt(ids, ((16, 80), (90, 110), (110, 140)),
                              ((fill, ((10, 74), (100, 120))), (other, ((8, 38),))),
                              ((0, 10), (0, 100), (1, 8)))
    assert_spans_hold_their_fills(event)
    got = task.plant(event, encode, 4821)
    needle = encode(" " + task.CODE.format(name=task.EVENT_NAME, code=4821) + " ")
    n = len(needle)
    assert got.answer == "4821"
    assert got.ids[48:48 + n] == needle  # the middle of the longest span (16..80)
    assert got.spans == ((16, 80 + n), (90 + n, 110 + n), (110 + n, 140 + n))
    assert got.origin == ((0, 10), (0, 100 + n), (1, 8))  # the later run of that fill moved
    assert got.fills[1] == event.fills[1]
    assert_spans_hold_their_fills(got)
    question = encode(task.QUESTION.format(name=task.EVENT_NAME) + task.TAIL)
    assert got.ids[-len(question):] == question
    assert got.ids[:-len(question)][-len(user):] == user  # the old question is gone
    assert got.ids[-5:] != [7] * 5


def test_plant_clips_spans_at_the_question_and_needs_one_before_it(encode) -> None:  # type: ignore[no-untyped-def]
    user = encode(task.USER)
    fill = list(range(100, 140))
    ids = [5] * 4 + user + list(range(100, 140))
    after = sc.ScenarioPrompt(ids, ((4 + len(user), len(ids)),), ((fill, ((0, 40),)),),
                              ((0, 0),))
    with pytest.raises(ValueError, match="no reused span"):
        task.plant(after, encode, 1234)
    assert task.plant_all([after], encode) == []
    with pytest.raises(ValueError, match="no user message"):
        task.plant(sc.ScenarioPrompt([1, 2], ((0, 1),), (([1], ((0, 1),)),), ((0, 0),)),
                   encode, 1234)


@pytest.mark.parametrize("scenario", sc.SCENARIOS)
def test_scenario_documents_hold_the_code_asked_for(encode, tokenizer, scenario) -> None:  # type: ignore[no-untyped-def]
    prompts = sc.build_scenario(encode, scenario, count=4, segment_tokens=60, seed=2)
    for p in prompts:
        j = int(tokenizer.decode(p.ids[-30:]).split("code of Document ")[1][0])
        docs = [tokenizer.decode(p.ids[a:b]) for a, b in p.spans]
        assert f"The code of Document {j} is {p.answer}." in docs[j - 1]
        assert f"The code of Document {3 - j} is " in docs[2 - j]  # a code to confuse it with
        assert p.answer not in docs[2 - j]
