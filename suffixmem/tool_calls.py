"""Tool calling by guided decoding, framework-free (the LangChain and LlamaIndex adapters share it).

A small model has no tool template; instead its reply is constrained (``json_schema`` guided
decoding, engines with ``supports_json_schema``) to one JSON object:

- a tool call: ``{"name": "<tool>", "arguments": {...}}`` where ``arguments`` follows that tool's
  parameter schema (top-level extra keys refused), so a call always parses against its tool;
- with ``tool_choice="auto"`` also a plain answer: ``{"response": "<text>"}``; with "none" only
  that answer.

``reply_schema(tools, choice)`` builds that schema; ``parse_reply(text)`` reads a reply back
(``Reply.calls`` or ``Reply.text``), and ``AnswerStream`` reads a plain answer's text while it
is generated, so an agent's final answer streams as free text does. The reply is stored in the
session exactly as generated, and adapters resend it verbatim (kept in the framework message's
metadata), so the next turn finds it in the cache. A tool call the model did not generate (a
framework's few-shot history) is rendered by ``render_calls`` (one canonical JSON object per
call, one per line), and a tool result by ``render_result`` (``{"tool": name, "result": text}``,
or the bare text without a name); both are deterministic, so a resent history renders to the
same tokens every time.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from suffixmem.engine.protocol import Message
from suffixmem.errors import InvalidRequestError

ANSWER_KEY = "response"


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: its name, description and JSON schema of its arguments (an object)."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}})

    def __post_init__(self) -> None:
        # arguments are an object (OpenAI's rule too): a string schema was accepted at bind
        # time and its calls could not be read back
        kind = self.parameters.get("type", "object") if isinstance(self.parameters,
                                                                   Mapping) else None
        if kind != "object":
            raise InvalidRequestError(
                f"tool {self.name!r}: parameters must be a JSON schema of an object "
                f"({{'type': 'object', 'properties': ...}}), got {self.parameters!r:.80}")


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str


@dataclass(frozen=True, slots=True)
class Reply:
    """A parsed reply: tool calls, or text (``error`` set when the reply could not be read,
    e.g. cut off by ``max_tokens``; ``text`` is then the raw output)."""

    text: str = ""
    calls: tuple[ToolCall, ...] = ()
    error: str | None = None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def check_choice(tools: Sequence[ToolSpec], choice: str | None) -> str | None:
    """``choice``: ``None``/"auto" (call a tool or answer), "none" (answer, no call),
    "required"/"any" (call some tool), or a tool's name."""
    if choice in (None, "auto", "none", "required", "any"):
        return choice
    names = [t.name for t in tools]
    if choice not in names:
        raise InvalidRequestError(
            f"tool_choice: {choice!r} is not one of the bound tools {names} nor "
            "'auto', 'none', 'required', 'any'")
    return choice


def _call_schema(tool: ToolSpec, defs: dict[str, Any]) -> dict[str, Any]:
    params = copy.deepcopy(dict(tool.parameters))
    # references point at the root ("#/$defs/..."): hoist the tool's definitions there
    defs.update(params.pop("$defs", {}))
    params.pop("title", None)
    if params.get("type", "object") == "object":
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        params.setdefault("additionalProperties", False)
        if not params["properties"]:
            # no arguments: the literal {} (an empty object's grammar lets a small model emit
            # whitespace inside it until max_tokens runs out)
            params = {"const": {}}
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    if tool.description:
        schema["description"] = tool.description
    return schema


ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object", "properties": {ANSWER_KEY: {"type": "string"}},
    "required": [ANSWER_KEY], "additionalProperties": False,
    "description": "a plain answer, without calling a tool",
}


def reply_schema(tools: Sequence[ToolSpec], choice: str | None = None) -> dict[str, Any] | None:
    """The JSON schema the reply is constrained to, or ``None`` (free text: no tools).
    ``choice="none"`` holds it to the plain answer, ``{"response": ...}``, which
    ``parse_reply`` reads back as text: the system prompt describes the tools and that JSON
    whatever the choice (so it stays cached), and a free reply came back as raw JSON."""
    choice = check_choice(tools, choice)
    if not tools:
        return None
    if choice == "none":
        return copy.deepcopy(ANSWER_SCHEMA)
    chosen = [t for t in tools if choice in (None, "auto", "required", "any") or t.name == choice]
    defs: dict[str, Any] = {}
    options = [_call_schema(t, defs) for t in chosen]
    if choice in (None, "auto"):
        options.append(copy.deepcopy(ANSWER_SCHEMA))
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    if defs:
        schema = {**schema, "$defs": defs}
    return schema


def parse_reply(text: str) -> Reply:
    """Read a reply generated under ``reply_schema``; fresh ids for its calls."""
    try:
        data = json.loads(text)
    except ValueError as e:
        answer = _cut_answer(text)
        if answer is not None:  # an answer cut off (max_tokens): its text so far
            return Reply(text=answer, error="the answer was cut off")
        return Reply(text=text, error=f"reply is not JSON ({e.msg}); was it cut off?")
    if isinstance(data, dict) and "name" in data and isinstance(data.get("arguments"), dict):
        return Reply(calls=(ToolCall(str(data["name"]), data["arguments"], new_call_id()),))
    if isinstance(data, dict) and isinstance(data.get(ANSWER_KEY), str):
        return Reply(text=data[ANSWER_KEY])
    return Reply(text=text, error="reply is neither a tool call nor an answer")


def _cut_answer(text: str) -> str | None:
    """The text of a plain answer whose JSON was cut off (``{"response": "The answer is 1``),
    None for anything else: closed by hand, dropping a half-written escape at the end."""
    if not text.lstrip().startswith("{"):
        return None
    for drop in range(6):  # "\\u00e" is the longest half escape
        for tail in ('"}', "}"):
            try:
                data = json.loads(text[:len(text) - drop] + tail)
            except ValueError:
                continue
            if isinstance(data, dict) and list(data) == [ANSWER_KEY] and isinstance(
                    data[ANSWER_KEY], str):
                return data[ANSWER_KEY]
    return None


# the opening of a plain answer as guided decoding may write it (JSON whitespace allowed)
_ANSWER_OPEN = re.compile(r'\s*\{\s*"' + ANSWER_KEY + r'"\s*:\s*"')
_ANSWER_OPEN_BARE = '{"' + ANSWER_KEY + '":"'


class AnswerStream:
    """A reply generated under ``reply_schema``, read as it arrives: ``feed(delta)`` returns the
    plain answer's new characters (``{"response": "..."}``, JSON escapes decoded, a half-written
    escape held back until complete); a tool call returns nothing (its JSON is read whole at the
    end, by ``parse_reply``). ``rest(text)`` is what the parsed whole reply's text adds to the
    text fed out so far, so that the streamed pieces join to ``Reply.text``."""

    def __init__(self) -> None:
        self._raw = ""
        self._answer: bool | None = None  # None: cannot tell yet
        self._pos = 0  # where the answer's undecoded characters start in _raw
        self._closed = False
        self.text = ""  # the answer's text fed out so far

    def feed(self, delta: str) -> str:
        self._raw += delta
        if self._answer is None:
            m = _ANSWER_OPEN.match(self._raw)
            if m is not None:
                self._answer, self._pos = True, m.end()
            elif not _ANSWER_OPEN_BARE.startswith("".join(self._raw.split())):
                self._answer = False
        if not self._answer or self._closed:
            return ""
        end = self._complete_end()
        piece = json.loads(f'"{self._raw[self._pos:end]}"') if end > self._pos else ""
        self._pos, self._closed = end, self._raw.startswith('"', end)
        self.text += piece
        return piece

    def _complete_end(self) -> int:
        """Where the answer's complete characters end: at its closing quote, or before a
        half-written escape."""
        raw, i = self._raw, self._pos
        while i < len(raw):
            c = raw[i]
            if c == '"':
                break
            if c != "\\":
                i += 1
                continue
            n = 6 if raw.startswith("u", i + 1) else 2
            if n == 6 and 0xD800 <= _hex(raw[i + 2:i + 6]) < 0xDC00:
                n = 12  # a high surrogate: decode it with its low half
                if not raw.startswith("\\u", i + 6) and len(raw) >= i + 8:
                    n = 6  # no low half follows: alone, as json.loads reads it
            if i + n > len(raw):
                break
            i += n
        return i

    def rest(self, text: str | None) -> str:
        """The whole reply's text (``Reply.text``; ``None`` for calls) less what was fed out:
        all of it where the stream showed nothing, e.g. a reply that is not JSON."""
        if not text or not text.startswith(self.text):
            return ""  # a call; or never (a reply read under its schema): never repeat text
        return text[len(self.text):]


def _hex(digits: str) -> int:
    try:
        return int(digits, 16) if len(digits) == 4 else -1
    except ValueError:
        return -1


def openai_specs(tools: Sequence[Any]) -> list[ToolSpec]:
    """Tools in OpenAI's function format (``{"type": "function", "function": {"name",
    "description", "parameters"}}``: the HTTP API's ``tools``, LangChain's bound tools)."""
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequestError(
                f"tools[{i}] is not an OpenAI function tool ({{'type': 'function', "
                "'function': {'name': ...}})")
        out.append(ToolSpec(fn["name"], fn.get("description") or "",
                            fn.get("parameters") or {"type": "object", "properties": {}}))
    return out


def openai_choice(tool_choice: Any) -> str | None:
    """A ``tool_choice`` as OpenAI, LangChain or Anthropic spell it -> a ``reply_schema``
    choice: ``None``/False/"auto", "none", "any"/"required"/True (one tool must be called), a
    tool's name, ``{"type": "function", "function": {"name": ...}}``, Anthropic's ``{"type":
    "auto" | "any" | "none"}`` and ``{"type": "tool", "name": ...}``."""
    if tool_choice is None or tool_choice is False:
        return None
    if tool_choice is True:
        return "required"
    if isinstance(tool_choice, dict) and tool_choice.get("type") in ("auto", "any", "none"):
        tool_choice = tool_choice["type"]
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
        if not isinstance(name, str):
            raise InvalidRequestError(f"tool_choice: cannot read a tool name from {tool_choice}")
        tool_choice = name
    if not isinstance(tool_choice, str):
        raise InvalidRequestError(
            f"tool_choice must be a string, dict or bool, got {type(tool_choice).__name__}")
    return tool_choice


def with_tools_prompt(messages: list[Message], tools: Sequence[ToolSpec]) -> list[Message]:
    """``messages`` with the tools described at the end of the system prompt (added if none)."""
    if not tools:
        return messages
    text = tools_prompt(tools)
    if messages and messages[0].role == "system":
        return [Message("system", f"{messages[0].content}\n\n{text}"), *messages[1:]]
    return [Message("system", text), *messages]


def render_calls(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Canonical text of tool calls (name, arguments) the model did not generate itself."""
    return "\n".join(
        json.dumps({"name": name, "arguments": dict(args)}, ensure_ascii=False, sort_keys=True)
        for name, args in calls)


def render_result(content: str, name: str | None) -> str:
    """Canonical text of a tool's result (the ``tool`` message of the session)."""
    if not name:
        return content
    return json.dumps({"tool": name, "result": content}, ensure_ascii=False)


def tools_prompt(tools: Sequence[ToolSpec]) -> str:
    """What the model is told about its tools, appended to the system prompt. It depends on the
    tools only (not on ``tool_choice``), so every call of an agent with the same tools renders
    the same system prompt and the conversation after it stays cached; the reply's JSON schema
    itself is enforced by guided decoding."""
    listing = [{"name": t.name, "description": t.description, "parameters": dict(t.parameters)}
               for t in tools]
    return (
        "You can call these tools. To call one, reply with a JSON object "
        '{"name": <tool name>, "arguments": {...}}; to answer without a tool, reply '
        f'{{"{ANSWER_KEY}": <your answer>}}.\n'
        "Tools: " + json.dumps(listing, ensure_ascii=False, sort_keys=True)
    )
