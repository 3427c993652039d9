"""``suffixmem.tool_calls`` without a model: the reply schema accepts exactly the calls that
parse against their tool (checked with ``jsonschema``), ``tool_choice`` narrows it, replies
parse back with fresh ids, and rendering is canonical."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from suffixmem.errors import InvalidRequestError
from suffixmem.tool_calls import (
    AnswerStream,
    ToolSpec,
    openai_choice,
    parse_reply,
    render_calls,
    render_result,
    reply_schema,
    tools_prompt,
)

ADD = ToolSpec("add", "Add two integers", {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]})
LOAF = ToolSpec("bake", "Bake a loaf", {
    "type": "object", "properties": {"loaf": {"$ref": "#/$defs/Loaf"}}, "required": ["loaf"],
    "$defs": {"Loaf": {"type": "object", "properties": {"kind": {"enum": ["rye", "wheat"]}},
                       "required": ["kind"]}}})


def _ok(schema: dict, value: object) -> bool:
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


def test_auto_accepts_calls_and_answers_only() -> None:
    s = reply_schema([ADD, LOAF])
    assert s is not None
    assert _ok(s, {"name": "add", "arguments": {"a": 1, "b": 2}})
    assert _ok(s, {"name": "bake", "arguments": {"loaf": {"kind": "rye"}}})  # hoisted $defs
    assert _ok(s, {"response": "hello"})
    assert not _ok(s, {"name": "add", "arguments": {"a": 1}})
    assert not _ok(s, {"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}})
    assert not _ok(s, {"name": "bake", "arguments": {"loaf": {"kind": "corn"}}})
    assert not _ok(s, {"name": "mul", "arguments": {}})


def test_choice_narrows_the_schema() -> None:
    required = reply_schema([ADD, LOAF], "required")
    assert required is not None and not _ok(required, {"response": "hi"})
    only_add = reply_schema([ADD, LOAF], "add")
    assert only_add is not None
    assert not _ok(only_add, {"name": "bake", "arguments": {"loaf": {"kind": "rye"}}})
    assert reply_schema([], None) is None  # no tools: free text
    # "none": the plain answer only (the system prompt asks for JSON whatever the choice),
    # read back as text
    none = reply_schema([ADD], "none")
    assert none is not None and _ok(none, {"response": "hi"})
    assert not _ok(none, {"name": "add", "arguments": {"a": 1, "b": 2}})
    assert parse_reply('{"response": "It is 42."}').text == "It is 42."
    with pytest.raises(InvalidRequestError, match="tool_choice"):
        reply_schema([ADD], "mul")


def test_parse_and_render() -> None:
    a, b = parse_reply('{"name": "add", "arguments": {"a": 1, "b": 2}}'), \
        parse_reply('{"name": "add", "arguments": {"a": 1, "b": 2}}')
    assert a.calls[0].arguments == {"a": 1, "b": 2} and a.calls[0].id != b.calls[0].id
    assert parse_reply('{"response": "hi"}').text == "hi"
    cut = parse_reply('{"name": "add", "argu')
    assert cut.error and not cut.calls and cut.text == '{"name": "add", "argu'
    assert render_calls([("add", {"b": 2, "a": 1})]) == \
        '{"arguments": {"a": 1, "b": 2}, "name": "add"}'
    assert json.loads(render_result("3", "add")) == {"tool": "add", "result": "3"}
    assert render_result("3", None) == "3"
    assert tools_prompt([ADD]) == tools_prompt([ADD])  # one text per tool set


def test_no_argument_tool_takes_exactly_an_empty_object() -> None:
    s = reply_schema([ToolSpec("ping")], "required")
    assert s is not None and _ok(s, {"name": "ping", "arguments": {}})
    assert not _ok(s, {"name": "ping", "arguments": {"x": 1}})


def test_a_cut_off_answer_reads_as_its_text_so_far() -> None:
    """Under "auto" a plain answer cut off by max_tokens came back as the raw JSON fragment
    ('{"response": "The answer is 18.6'), which the framework showed the user."""
    cut = parse_reply('{"response": "The answer is 18.6')
    assert (cut.text, cut.error, cut.calls) == ("The answer is 18.6", "the answer was cut off", ())
    assert parse_reply('{"response": "caf\\u00e').text == "caf"  # a half-written escape
    assert parse_reply('{"response": "a \\').text == "a "
    call = parse_reply('{"name": "add", "arguments": {"a": 1')  # a call is never guessed
    assert call.calls == () and call.error and "cut off" in call.error


def test_a_tool_whose_arguments_are_not_an_object_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="'shout': parameters must be a JSON schema "
                                                  "of an object"):
        ToolSpec("shout", "", {"type": "string"})
    assert ToolSpec("ok", "", {"properties": {}}).name == "ok"  # "object" when unsaid


def test_tool_choice_in_openai_langchain_and_anthropic_spellings() -> None:
    for choice, want in (({"type": "any"}, "any"), ({"type": "auto"}, "auto"),
                         ({"type": "none"}, "none"), ({"type": "tool", "name": "add"}, "add"),
                         ({"type": "function", "function": {"name": "add"}}, "add"),
                         (True, "required"), (None, None), ("add", "add")):
        assert openai_choice(choice) == want
    assert reply_schema([ADD], openai_choice({"type": "any"})) is not None
    with pytest.raises(InvalidRequestError, match="tool_choice"):
        openai_choice({"type": "function"})


def _fed(reply: str, cuts: list[int]) -> tuple[list[str], AnswerStream]:
    stream, pieces, start = AnswerStream(), [], 0
    for end in [*sorted(c % (len(reply) + 1) for c in cuts), len(reply)]:
        if end > start:
            pieces.append(stream.feed(reply[start:end]))
            start = end
    return pieces, stream


@given(st.text(), st.lists(st.integers(min_value=0), max_size=12), st.booleans(),
       st.integers(min_value=0, max_value=8))
def test_a_plain_answer_streams_as_the_text_parse_reply_reads(
        answer: str, cuts: list[int], ascii_only: bool, cut_off: int) -> None:
    """However the generated JSON is split into tokens (escapes, surrogate pairs and
    ``\\uXXXX`` split anywhere, a reply cut off by max_tokens), the pieces ``feed`` returns
    join to a prefix of the answer and, with ``rest``, to exactly what ``parse_reply`` reads."""
    reply = json.dumps({"response": answer}, ensure_ascii=ascii_only)
    reply = reply[:len(reply) - cut_off] if cut_off else reply
    pieces, stream = _fed(reply, cuts)
    parsed = parse_reply(reply)
    assert "".join(pieces) == stream.text and answer.startswith(stream.text)
    assert stream.text + stream.rest(parsed.text) == parsed.text
    if not cut_off:
        assert stream.text == answer  # all of it streamed before the closing brace
        assert stream.rest(parsed.text) == ""


@given(st.lists(st.integers(min_value=0), max_size=12))
def test_a_call_streams_nothing(cuts: list[int]) -> None:
    reply = ' { "name": "add", "arguments": {"a": 1, "b": 2}}'
    pieces, stream = _fed(reply, cuts)
    assert pieces == [""] * len(pieces) and stream.rest(None) == ""
    undecided = AnswerStream()  # nothing shows before the answer's opening quote
    assert undecided.feed('{"response": ') == "" and undecided.feed('"Hi') == "Hi"
