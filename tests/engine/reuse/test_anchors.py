"""Structural anchors: system tail, recurring templates, JSON schema blocks, merging."""

from __future__ import annotations

import json

import pytest

from suffixmem.engine.protocol import Segment
from suffixmem.engine.reuse.anchors import (
    common_suffix_length,
    json_schema_segments,
    json_schema_spans,
    merge_segments,
    recurring_runs,
    system_tail,
)


def test_common_suffix_length() -> None:
    assert common_suffix_length([1, 2, 3, 4], [9, 3, 4]) == 2
    assert common_suffix_length([1, 2], [3]) == 0
    assert common_suffix_length([], [1]) == 0


def test_system_tail_is_the_shared_end_of_two_system_prompts() -> None:
    rules = list(range(500, 520))
    prompt = [1, 2, 3, 70, 71, *rules, 9, 9]  # system message = positions 0..25
    seg = system_tail((0, 25), prompt, previous_system_ids=[1, 2, 3, 80, 81, *rules])
    assert seg == Segment(5, 25, kind="system_tail")
    assert system_tail((0, 25), prompt) == Segment(0, 25, kind="system_tail")
    assert system_tail((0, 25), prompt, previous_system_ids=[7, 7]) is None
    with pytest.raises(ValueError):
        system_tail((0, 99), prompt)


def test_recurring_runs_finds_a_template_after_a_varying_prefix() -> None:
    template = list(range(300, 320))
    turn1 = [5, 6, 7, *template, 8]
    turn2 = [1, 2, 3, 4, 10, 11, *template, 12, 13]
    segs = recurring_runs(turn2, [turn1], min_tokens=12)
    assert segs == [Segment(6, 26, kind="template")]
    # the prefix-cache hit is skipped
    assert recurring_runs(turn2, [turn1], min_tokens=12, skip_prefix=10) == [
        Segment(10, 26, kind="template")
    ]
    assert recurring_runs(turn2, [turn1], min_tokens=21) == []
    assert recurring_runs(turn2, [], min_tokens=12) == []


def test_recurring_runs_takes_the_longest_earlier_match() -> None:
    a = list(range(100, 112))
    earlier = [[*a, 1], [*a, 50, 51, 52]]
    now = [0, *a, 50, 51, 52, 0]
    assert recurring_runs(now, earlier, min_tokens=12) == [Segment(1, 16, kind="template")]


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name"],
}


def test_json_schema_spans_skip_plain_json_and_prose() -> None:
    text = (
        'Reply with {"a": 1} style data. Schema: ' + json.dumps(SCHEMA)
        + " and {not json} then " + json.dumps({"type": "array", "items": {"type": "number"}})
    )
    spans = json_schema_spans(text)
    assert [json.loads(text[a:b]) for a, b in spans] == [
        SCHEMA, {"type": "array", "items": {"type": "number"}}
    ]


def test_json_schema_segments_cover_whole_tokens_inside(tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = "Answer using this schema: " + json.dumps(SCHEMA, indent=1) + "\nThanks."
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    (seg,) = json_schema_segments(text, enc["offset_mapping"], base=40)
    ids = enc["input_ids"][seg.start - 40:seg.end - 40]
    decoded = tokenizer.decode(ids)
    assert seg.kind == "json_schema"
    assert decoded.strip().endswith("}") and "properties" in decoded
    lo, hi = json_schema_spans(text)[0]
    assert decoded in text[lo - 1:hi]


def test_merge_prefers_explicit_then_structure_then_detection() -> None:
    segs = [
        Segment(0, 30, kind="detected"),
        Segment(10, 20, kind="anchor"),
        Segment(25, 40, kind="json_schema"),
        Segment(45, 60, kind="template"),
        Segment(50, 70, kind="detected"),
        Segment(90, 120, kind="document"),  # beyond the prompt
    ]
    assert merge_segments(segs, prompt_len=100) == [
        Segment(10, 20, kind="anchor"),
        Segment(25, 40, kind="json_schema"),
        Segment(45, 60, kind="template"),
    ]
