"""Layout rules on the real model's tokenizer and chat template (no model weights needed)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from suffixmem.chat_template import ChatTemplate
from suffixmem.conversation.layout import (
    CacheStableLayout,
    Prompt,
    SlidingWindowLayout,
    turn_starts,
)
from suffixmem.engine.protocol import Message
from suffixmem.errors import ConfigError, ContextWindowError, InvalidRequestError

SYSTEM = "You are a terse assistant. Answer in one sentence."
QUESTIONS = [
    "What is the capital of France?", "How do plants make food?", "Who wrote Hamlet?",
    "Why is the sky blue?", "What is a prime number?", "How far is the Moon?",
    "What does DNA stand for?", "How do airplanes fly?", "What is inflation?",
    "Who painted the Mona Lisa?",
]


class TokenizerRenderer:
    """The two engine-protocol methods a layout uses, on the real tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.template = ChatTemplate(tokenizer)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        return self.template.render(messages, add_generation_prompt)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="module")
def renderer(tokenizer: Any) -> TokenizerRenderer:
    return TokenizerRenderer(tokenizer)


def _reply(r: TokenizerRenderer, i: int) -> Message:
    text = f"Answer number {i}: " + "this is a reasonably long reply sentence. " * 3
    return Message("assistant", text, tuple(r.tokenize(text)))


def _run(layout: Any, r: TokenizerRenderer, turns: int, budget: int) -> list[Prompt]:
    history: list[Message] = []
    window = 0
    prompts = []
    for i in range(turns):
        q = QUESTIONS[i % len(QUESTIONS)]
        p = layout.build(r, SYSTEM, history, q, (), window, budget)
        prompts.append(p)
        window = p.window_start
        history += [Message("user", q), _reply(r, i)]
    return prompts


def test_append_only_history_is_a_prefix_extension(renderer: TokenizerRenderer) -> None:
    prompts = _run(CacheStableLayout(), renderer, 6, budget=4000)
    assert all(p.evicted_turns == 0 and p.window_start == 0 for p in prompts)
    for i, (a, b) in enumerate(itertools.pairwise(prompts)):
        # turn i+1 = turn i's prompt, then the reply's ids verbatim, then the new question
        reply = _reply(renderer, i).token_ids or ()
        assert b.token_ids[:len(a) + len(reply)] == a.token_ids + reply
    # exactly what the chat template renders as one string (no boundary drift)
    last = prompts[-1]
    text = renderer.template.render_text(last.messages, True)
    assert list(last.token_ids) == renderer.tokenize(text)


def test_static_first_and_marked(renderer: TokenizerRenderer) -> None:
    sys_ids = renderer.render([Message("system", SYSTEM)], False)
    for p in _run(CacheStableLayout(0.5), renderer, 30, budget=600):
        assert p.token_ids[:len(sys_ids)] == tuple(sys_ids)
        seg = p.segments[0]
        assert (seg.start, seg.end, seg.kind, seg.shared) == (0, len(sys_ids), "system_tail", True)


@pytest.mark.parametrize("fraction", [0.3, 0.5, 0.7])
def test_eviction_in_whole_chunks(renderer: TokenizerRenderer, fraction: float) -> None:
    budget = 600
    prompts = _run(CacheStableLayout(fraction), renderer, 40, budget)
    evictions = [p for p in prompts if p.evicted_turns]
    assert evictions, "the budget must force eviction"
    history: list[Message] = []
    for i in range(40):
        history += [Message("user", QUESTIONS[i % len(QUESTIONS)]), _reply(renderer, i)]
    starts = set(turn_starts(history))
    for p in prompts:
        assert len(p) <= budget
        assert p.window_start in starts or p.window_start == 0
    for p in evictions:  # each eviction frees a whole chunk (down to the target) at once
        assert len(p) <= (1 - fraction) * budget
    # between evictions the prompt only grows: the window start moves only at evictions
    moves = sum(1 for a, b in itertools.pairwise(prompts)
                if a.window_start != b.window_start)
    assert moves == len(evictions)


def test_stable_layout_changes_the_prefix_less_often_than_a_sliding_window(
    renderer: TokenizerRenderer,
) -> None:
    budget = 600
    stable = _run(CacheStableLayout(0.5), renderer, 40, budget)
    sliding = _run(SlidingWindowLayout(), renderer, 40, budget)

    def prefix_breaks(prompts: list[Prompt]) -> int:
        # a break: the previous prompt is not a prefix of this one
        return sum(1 for a, b in itertools.pairwise(prompts)
                   if b.token_ids[:len(a)] != a.token_ids)

    assert prefix_breaks(stable) < prefix_breaks(sliding) / 3
    for p in sliding:  # the sliding window keeps as much as fits: one more turn would not
        assert len(p) <= budget


def test_sliding_window_keeps_the_longest_fitting_suffix(renderer: TokenizerRenderer) -> None:
    history: list[Message] = []
    for i in range(12):
        history += [Message("user", QUESTIONS[i % 10]), _reply(renderer, i)]
    p = SlidingWindowLayout().build(renderer, SYSTEM, history, "And now?", (), 0, 500)
    assert len(p) <= 500
    assert p.messages[1].role == "user"
    longer = [Message("system", SYSTEM), *history[p.window_start - 2:],
              Message("user", "And now?")]
    assert len(renderer.render(longer)) > 500


def test_context_goes_next_to_the_last_user_message(renderer: TokenizerRenderer) -> None:
    docs = ["Paris is the capital and largest city of France.",
            "The Eiffel Tower was completed in 1889 for the World's Fair."]
    history = [Message("user", "Hello"), _reply(renderer, 0)]
    plain = CacheStableLayout().build(renderer, SYSTEM, history, "When was it built?", (), 0, 4000)
    p = CacheStableLayout().build(renderer, SYSTEM, history, "When was it built?", docs, 0, 4000)
    before = renderer.render([Message("system", SYSTEM), *history], False)
    assert p.token_ids[:len(before)] == tuple(before)  # system prompt and history untouched
    assert p.messages[-1].content.endswith("When was it built?")
    docs_segs = [s for s in p.segments if s.kind == "document"]
    assert len(docs_segs) == 2
    for seg, doc in zip(docs_segs, docs, strict=True):
        assert seg.start >= len(before) and not seg.shared
        assert list(p.token_ids[seg.start:seg.end]) == renderer.tokenize(doc)
    assert len(p) > len(plain)


def test_bad_input(renderer: TokenizerRenderer) -> None:
    layout = CacheStableLayout()
    with pytest.raises(InvalidRequestError):
        layout.build(renderer, SYSTEM, [], "   ", (), 0, 1000)
    with pytest.raises(ContextWindowError):
        layout.build(renderer, SYSTEM, [], "word " * 2000, (), 0, 1000)
    with pytest.raises(ContextWindowError):
        SlidingWindowLayout().build(renderer, SYSTEM, [], "word " * 2000, (), 0, 1000)
    with pytest.raises(ConfigError):
        CacheStableLayout(1.0)
    with pytest.raises(ConfigError):
        layout.build(renderer, SYSTEM, [], "hi", (), 0, 0)


def test_a_window_that_starts_with_a_reply_is_rendered_from_it(renderer: TokenizerRenderer
                                                               ) -> None:
    """An application's window may begin with a reply (``trim_messages``' default): the prompt
    starts exactly there, as sent, and the start stays put on the next turn."""
    history = [Message("user", QUESTIONS[0]), _reply(renderer, 0),
               Message("user", QUESTIONS[1]), _reply(renderer, 1)]
    p = CacheStableLayout().build(renderer, SYSTEM, history, QUESTIONS[2], (), 1, 4096)
    assert p.window_start == 1 and p.evicted_turns == 0
    rendered = [m for m in p.messages if m.role != "system"]
    assert [m.content for m in rendered] == [history[1].content, QUESTIONS[1],
                                             history[3].content, QUESTIONS[2]]
