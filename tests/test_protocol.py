"""Validation of the engine protocol's request types (no model needed)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suffixmem.engine.protocol import EngineStats, Message, Request, Result, SamplingParams, Segment
from suffixmem.errors import InvalidRequestError


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 2.5}, r"temperature must be in \[0, 2\]"),  # vLLM's range too
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"stop": ("",)}, "stop"),
    ],
)
def test_sampling_rejects_bad_values(kwargs: dict, needle: str) -> None:
    with pytest.raises(InvalidRequestError, match=needle):
        SamplingParams(**kwargs)


def test_a_schema_nested_past_the_limit_is_refused() -> None:
    """Compiling the grammar of a schema 400-600 levels deep cost ~20 s of CPU for a 17 KB
    request (an outside audit); real schemas nest a few levels."""
    from suffixmem.engine.protocol import MAX_SCHEMA_DEPTH

    def nested(levels: int) -> dict:
        schema: dict = {"type": "string"}
        for _ in range(levels - 1):
            schema = {"type": "array", "items": schema}
        return schema

    assert SamplingParams(json_schema=nested(MAX_SCHEMA_DEPTH)).json_schema is not None
    with pytest.raises(InvalidRequestError, match=f"nests deeper than {MAX_SCHEMA_DEPTH}"):
        SamplingParams(json_schema=nested(MAX_SCHEMA_DEPTH + 1))
    with pytest.raises(InvalidRequestError, match="nests deeper"):
        SamplingParams(json_schema=nested(100_000))  # no recursion limit to hit


def test_sampling_normalises_stop() -> None:
    assert SamplingParams(stop="\n").stop == ("\n",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")


def test_message_and_request_validation() -> None:
    with pytest.raises(InvalidRequestError, match="unknown message role 'wizard'"):
        Message("wizard", "hi")
    with pytest.raises(InvalidRequestError, match="token_ids"):
        Message("user", "hi", token_ids=(1, 2))
    with pytest.raises(InvalidRequestError, match="empty"):
        Request("s", messages=[])
    with pytest.raises(InvalidRequestError, match="empty content"):
        Request("s", messages=[Message("user", "  ")])
    with pytest.raises(InvalidRequestError, match="exactly one"):
        Request("s")
    with pytest.raises(InvalidRequestError, match="exactly one"):
        Request("s", messages=[Message("user", "x")], token_ids=[1])
    with pytest.raises(InvalidRequestError, match="session_key"):
        Request("", token_ids=[1])
    with pytest.raises(InvalidRequestError, match="beyond the prompt"):
        Request("s", token_ids=[1, 2], segments=(Segment(0, 5),))
    with pytest.raises(InvalidRequestError, match="segment kind"):
        Segment(0, 2, kind="nope")
    # an assistant turn may be empty (a model can answer with nothing)
    Request("s", messages=[Message("user", "x"), Message("assistant", "")])


def test_stats_hit_rate() -> None:
    stats = EngineStats()
    assert stats.hit_rate == 0.0
    stats.record(Result("a", (1, 2), "stop", 100, 75, 0.1, 0.2))
    stats.record(Result("b", (3,), "length", 100, 25, 0.1, 0.2))
    assert stats.hit_rate == pytest.approx(0.5)
    assert stats.output_tokens == 3


# -- validation at the boundary -----------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [
    ({"seed": 2**64}, "seed"), ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"),
    ({"temperature": "0.5"}, "temperature"), ({"temperature": True}, "temperature"),
    ({"temperature": float("nan")}, "temperature"), ({"top_k": 2.5}, "top_k"),
    ({"top_p": "1"}, "top_p"), ({"max_tokens": 2.0}, "max_tokens"), ({"stop": [""]}, "stop"),
    ({"stop": 5}, "stop"), ({"ignore_eos": 1}, "ignore_eos"),
    ({"json_schema": "{}"}, "json_schema"),
])
def test_bad_sampling_values_are_one_line_errors_naming_the_field(kwargs: dict, field: str
                                                                  ) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs)
    assert field in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("key", ["bad\ud800key", "nul\x00key", "k" * 257, "", 7])
def test_bad_session_keys_are_rejected(key: Any) -> None:
    with pytest.raises(InvalidRequestError, match="session_key"):
        Request(key, messages=[Message("user", "hi")])


@pytest.mark.parametrize("content", ["lone \udc80 surrogate", "nul \x00 char", b"bytes"])
def test_bad_message_text_is_rejected(content: Any) -> None:
    with pytest.raises(InvalidRequestError, match="message content"):
        Message("user", content)


class _Id(int):
    """An int subclass: accepted like an int (the fast path only takes exact ints)."""


@given(st.lists(st.one_of(st.integers(-3, 50_000), st.booleans(), st.floats(0, 9),
                          st.integers(0, 9).map(_Id), st.just("7"), st.none()),
                max_size=40))
def test_token_id_check_agrees_with_the_per_item_rule(ids: list[Any]) -> None:
    """``Request`` accepts token ids exactly when each is a non-negative int and not a bool
    (its fast path over exact ints must not change which requests pass)."""
    ok = bool(ids) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                           for t in ids)
    if ok:
        assert Request("s", token_ids=ids).token_ids == tuple(ids)
    else:
        with pytest.raises(InvalidRequestError, match="token_ids"):
            Request("s", token_ids=ids)
