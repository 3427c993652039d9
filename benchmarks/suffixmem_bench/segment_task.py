"""The task check of ``bench segments``: a code written into reused KV, asked for after it.

Issue 14's task check is "the answer to a question about a passage matches the exact run's".
The question must be one the served model can answer, or agreement measures bf16 noise between
two wrong answers: asked which Python module a documentation passage describes, the default
135M model invents one in most prompts ("Docutils", "`Document 1`"), and asked to repeat an
earlier question or quote a passage it mostly fails too. What it does reliably is retrieve a
number written into its context (a passkey, the usual probe of approximate KV): asked "What
is the code of Document 2?", the exact run answers with the code in 10 of 12 prompts.

So the check plants a code sentence *inside a reused segment* (``The code of Document 2 is
4821.``; in a workload event, the longest span reused at a new position), asks for it as the
last user message, and compares the answer, the first run of digits in the reply
(``answer_of``), with the exact run's. Teacher-forced on the primitives, the reuse run must
reproduce the reference's tokens up to the end of that number (``answer_end``); through the
engine both runs decode freely and only the numbers are compared. The planted code also gives
each arm's accuracy, which says whether the task is within the model's reach.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # segment_scenarios imports this module
    from suffixmem_bench.segment_scenarios import ScenarioPrompt

CODE = "The code of {name} is {code}."
QUESTION = "What is the code of {name}? Answer with the number only."
EVENT_NAME = "this chat"
TAIL = "<|im_end|>\n<|im_start|>assistant\n"
USER = "<|im_start|>user\n"
NUMBER = re.compile(r"(?<!Document )(?<!\d)\d+")
"""A number in a reply, not a document's name ("Document 2"), which answers often repeat."""

Encode = Callable[[str], list[int]]


def new_code(rng: random.Random) -> int:
    """A four-digit code (no leading zero, so the answer is one run of four digits)."""
    return rng.randrange(1000, 10000)


def answer_of(text: str) -> str:
    """The answer in a reply: its first number (``NUMBER``); without one, its first non-empty
    line, lower-cased and whitespace-normalised (so two replies without a number compare)."""
    m = NUMBER.search(text)
    if m:
        return m.group()
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return " ".join(lines[0].lower().split()) if lines else ""


def answer_end(decode: Callable[[list[int]], str] | None, cont: Sequence[int]) -> int:
    """How many tokens of the greedy continuation ``cont`` a reuse run must reproduce to give
    the same answer: through the token that ends its first number (``NUMBER``; the next token
    could extend it); ``first_line_end`` when the continuation has none; all of it when the
    number never ends or without ``decode``."""
    if decode is None:
        return len(cont)
    if not NUMBER.search(decode(list(cont))):
        return first_line_end(decode, cont)
    for j in range(1, len(cont) + 1):
        text = decode(list(cont[:j]))
        m = NUMBER.search(text)
        if m and m.end() < len(text):  # something follows the digits: the number ended
            return j
    return len(cont)


def first_line_end(decode: Callable[[list[int]], str] | None, cont: Sequence[int]) -> int:
    """How many tokens of ``cont`` it takes to finish its first non-empty line (all of it when
    the line never ends, or without ``decode``)."""
    if decode is None:
        return len(cont)
    for j in range(1, len(cont) + 1):
        text = decode(list(cont[:j])).lstrip()
        if text and "\n" in text:
            return j
    return len(cont)


def plant(event: ScenarioPrompt, encode: Encode, code: int, name: str = EVENT_NAME
          ) -> ScenarioPrompt:
    """``event`` turned into a task prompt: ``CODE`` inserted in the middle of its longest
    reused span, at the same place in the prompt and in the fill it is reused from (so the
    span still holds the fill's tokens), and the last user message replaced by ``QUESTION``;
    ``answer`` is the code. Spans past the last user message's start are clipped there."""
    from suffixmem_bench.segment_scenarios import ScenarioPrompt
    user = encode(USER)
    ids = list(event.ids)
    starts = [i for i in range(len(ids) - len(user) + 1) if ids[i:i + len(user)] == user]
    if not starts:
        raise ValueError("the event's prompt has no user message to replace")
    question_at = starts[-1] + len(user)
    spans = [(a, min(b, question_at)) for a, b in event.spans]
    keep = [i for i, (a, b) in enumerate(spans) if b > a]
    if not keep:
        raise ValueError("no reused span before the event's last user message")
    pick = max(keep, key=lambda i: (spans[i][1] - spans[i][0], -i))
    a, b = spans[pick]
    at = a + (b - a) // 2
    fill_index, source = event.origin[pick]
    fill_at = source + (at - a)
    needle = encode(" " + CODE.format(name=name, code=code) + " ")
    n = len(needle)
    new_ids = ids[:at] + needle + ids[at:question_at] + encode(
        QUESTION.format(name=name) + TAIL)
    new_spans, new_origin = [], []
    for i in keep:
        s, e = spans[i]
        fi, fs = event.origin[i]
        grow = n if i == pick else 0
        shift = n if s >= at and i != pick else 0
        new_spans.append((s + shift, e + shift + grow))
        new_origin.append((fi, fs + n if fi == fill_index and fs > fill_at else fs))
    fills = []
    for fi, (tokens, fspans) in enumerate(event.fills):
        if fi != fill_index:
            fills.append((tokens, fspans))
            continue
        moved = tuple((s + n, e + n) if s > fill_at else (s, e + n) if s <= fill_at < e
                      else (s, e) for s, e in fspans)
        fills.append((list(tokens[:fill_at]) + needle + list(tokens[fill_at:]), moved))
    return ScenarioPrompt(new_ids, tuple(new_spans), tuple(fills), tuple(new_origin),
                          answer=str(code))


def plant_all(events: Sequence[ScenarioPrompt], encode: Encode, seed: int = 0
              ) -> list[ScenarioPrompt]:
    """``plant`` over ``events``, a code drawn per event from ``seed``; events with no reused
    span before their question are left out."""
    rng = random.Random(seed)
    out = []
    for event in events:
        code = new_code(rng)
        try:
            out.append(plant(event, encode, code))
        except ValueError:
            continue
    return out
