"""The embedded vLLM engine on the real default model (CPU)."""

from __future__ import annotations

import threading
import uuid

import pytest

from suffixmem.engine.protocol import Message, Request, Result, SamplingParams, TokenEvent
from suffixmem.errors import ConfigError, ContextWindowError, InvalidRequestError, ModelError

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

GREEDY = SamplingParams(max_tokens=24)
SYSTEM = (
    "You are a concise assistant for a travel agency. Answer in one short sentence. Never invent "
    "prices or opening hours; if you do not know something, say so plainly. Prefer metric units, "
    "use the 24-hour clock, and name cities in English. When asked about a capital city, give the "
    "city's name first. When a question is ambiguous, answer the most likely reading and say which "
    "one you chose. Do not use lists or markdown; plain prose only. Keep every answer under thirty "
    "words. Be friendly but not chatty, and never ask the traveller more than one question at a "
    "time. These rules apply to every turn of the conversation, including follow-up questions."
)


def _key() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def test_capital_of_japan_is_tokyo(vllm_engine) -> None:  # type: ignore[no-untyped-def]
    r = vllm_engine.generate(Request(_key(), messages=[
        Message("user", "What is the capital of Japan?")], sampling=GREEDY))
    assert "Tokyo" in r.text
    assert r.finish_reason == "stop"
    assert r.prompt_tokens > 0 and r.ttft_s > 0 and r.latency_s >= r.ttft_s
    assert vllm_engine.detokenize(r.token_ids) == r.text


def test_second_turn_hits_the_cache_and_sessions_are_isolated(vllm_engine) -> None:  # type: ignore[no-untyped-def]
    key = _key()
    turn1 = [Message("system", SYSTEM), Message("user", "What is the capital of Japan?")]
    r1 = vllm_engine.generate(Request(key, messages=turn1, sampling=GREEDY))
    assert r1.cached_tokens == 0
    turn2 = [*turn1, Message("assistant", r1.text, r1.token_ids),
             Message("user", "And the capital of Germany?")]
    r2 = vllm_engine.generate(Request(key, messages=turn2, sampling=GREEDY))
    assert r2.cached_tokens >= 0.9 * r1.prompt_tokens, (r2.cached_tokens, r1.prompt_tokens)
    # the same text under another session key shares nothing
    r3 = vllm_engine.generate(Request(_key(), messages=turn1, sampling=GREEDY))
    assert r3.cached_tokens == 0
    assert r3.text == r1.text


def test_streamed_text_equals_blocking_text(vllm_engine) -> None:  # type: ignore[no-untyped-def]
    msgs = [Message("user", "Write two sentences about the sea.")]
    blocking = vllm_engine.generate(Request(_key(), messages=msgs, sampling=GREEDY))
    events = list(vllm_engine.stream(Request(_key(), messages=msgs, sampling=GREEDY)))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    result = events[-1]
    assert isinstance(result, Result)
    assert len(tokens) > 1
    assert "".join(e.text for e in tokens) == result.text == blocking.text
    assert tuple(e.token_id for e in tokens) == result.token_ids


def test_stop_sequence(vllm_engine) -> None:  # type: ignore[no-untyped-def]
    msgs = [Message("user", "Describe Paris in two sentences.")]
    full = vllm_engine.generate(Request(_key(), messages=msgs, sampling=GREEDY))
    words = full.text.split()
    assert len(words) > 4
    stop = " " + words[3]
    cut = vllm_engine.generate(Request(_key(), messages=msgs,
                                       sampling=SamplingParams(max_tokens=24, stop=(stop,))))
    assert cut.text == full.text.split(stop)[0]
    assert cut.finish_reason == "stop"


def test_concurrent_sessions_stream_and_batch(vllm_engine) -> None:  # type: ignore[no-untyped-def]
    prompts = [f"Name a famous person born in the year {1900 + 10 * i}." for i in range(4)]
    results: dict[int, tuple[str, Result]] = {}

    def run(i: int) -> None:
        text = ""
        for ev in vllm_engine.stream(Request(_key(), messages=[Message("user", prompts[i])],
                                             sampling=SamplingParams(max_tokens=16))):
            if isinstance(ev, TokenEvent):
                text += ev.text
            else:
                results[i] = (text, ev)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == [0, 1, 2, 3]
    for text, result in results.values():
        assert text == result.text and result.output_tokens > 0


def test_cancelled_stream_frees_the_request(vllm_engine) -> None:  # type: ignore[no-untyped-def]
    gen = vllm_engine.stream(Request(_key(), messages=[Message("user", "Tell a long story.")],
                                     sampling=SamplingParams(max_tokens=200)))
    assert isinstance(next(gen), TokenEvent)
    gen.close()
    assert not vllm_engine._outboxes
    r = vllm_engine.generate(Request(_key(), messages=[
        Message("user", "What is the capital of Japan?")], sampling=GREEDY))
    assert "Tokyo" in r.text


def test_bad_input_is_rejected_and_engine_stays_usable(vllm_engine) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequestError, match="empty"):
        vllm_engine.generate(Request(_key(), messages=[Message("user", "")]))
    with pytest.raises(InvalidRequestError, match="role"):
        vllm_engine.generate(Request(_key(), messages=[Message("robot", "hi")]))
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    too_long = "word " * (vllm_engine.max_model_len + 10)
    with pytest.raises(ContextWindowError, match="context window"):
        vllm_engine.generate(Request(_key(), messages=[Message("user", too_long)]))
    nearly = [1] * (vllm_engine.max_model_len - 8)
    with pytest.raises(ContextWindowError, match="max_tokens"):
        vllm_engine.generate(Request(_key(), token_ids=nearly, sampling=SamplingParams(
            max_tokens=64)))
    # a schema vLLM cannot compile is this request's error (it was vLLM's own exception
    # class, a 500 on the server)
    bad_schema = {"type": "object", "properties": {"q": {"type": "no-such-type"}}}
    with pytest.raises(InvalidRequestError, match=r"request rejected: .*no-such-type"):
        vllm_engine.generate(Request(_key(), messages=[Message("user", "hi")],
                                     sampling=SamplingParams(max_tokens=4,
                                                             json_schema=bad_schema)))
    r = vllm_engine.generate(Request(_key(), messages=[
        Message("user", "What is the capital of Japan?")], sampling=GREEDY))
    assert "Tokyo" in r.text


def test_unknown_engine_and_model_names() -> None:
    from suffixmem.engine import create_engine

    with pytest.raises(ConfigError, match="unknown engine 'nope'"):
        create_engine("nope")
    with pytest.raises(ModelError, match="unknown model 'no-such-model'"):
        create_engine("vllm", model="no-such-model")


def test_block_size_validation() -> None:
    from suffixmem.engine.vllm_engine import choose_block_size

    assert choose_block_size(None, on_cuda=False) == 32
    assert choose_block_size(None, on_cuda=True) == 16
    assert choose_block_size(64, on_cuda=False) == 64
    with pytest.raises(ConfigError, match="multiple of 32"):
        choose_block_size(16, on_cuda=False)
    with pytest.raises(ConfigError, match="CUDA"):
        choose_block_size(24, on_cuda=True)
