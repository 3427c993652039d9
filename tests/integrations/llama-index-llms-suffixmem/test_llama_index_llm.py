"""``SuffixMemLLM`` for LlamaIndex on the real model: streaming everywhere, usage with cached
tokens, and chat engines whose turns read ever more of the prompt from cache."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from adapter_setup import BAD_CONSTRUCTION, MODEL_PARAMS
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, MessageRole, TextBlock
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.memory import ChatMemoryBuffer, Memory
from llama_index.llms.suffixmem import SuffixMemLLM

from suffixmem.conversation.manager import ManagerConfig
from suffixmem.errors import ContextWindowError, InvalidRequestError

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.anyio]

QUESTION = [ChatMessage(role=MessageRole.USER, content="What is the capital of Japan?")]


@pytest.fixture
def llm(shared_engine: Any, manager: Any, database_url: str) -> SuffixMemLLM:
    model = SuffixMemLLM(**MODEL_PARAMS, max_tokens=16, temperature=0.0,
                         database_url=database_url)
    assert model.get_manager() is manager and manager.engine is shared_engine
    return model


def test_metadata_has_the_true_context_window(shared_engine: Any, database_url: str) -> None:
    fresh = SuffixMemLLM(**MODEL_PARAMS, database_url=database_url)
    # not started: the window it will start with
    assert fresh.metadata.context_window == shared_engine.max_model_len == 4096
    assert fresh.get_manager().engine is shared_engine
    meta = fresh.metadata
    assert meta.context_window == shared_engine.max_model_len
    # tool calling by the vLLM engine's guided decoding (test_llama_index_tools)
    assert meta.is_chat_model and meta.is_function_calling_model
    assert meta.model_name == shared_engine.model_name
    assert meta.num_output == ManagerConfig().max_tokens


def test_chat_and_stream_chat(llm: SuffixMemLLM) -> None:
    reply = llm.chat(QUESTION)
    assert "Tokyo" in reply.message.content
    assert reply.message.role == MessageRole.ASSISTANT
    usage = reply.raw["usage"]
    assert usage == reply.additional_kwargs
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 16
    assert 0 < usage["ttft_s"] <= usage["latency_s"] and usage["model_name"] == llm.model
    deltas, last = [], None
    for last in llm.stream_chat(QUESTION):
        deltas.append(last.delta)
    assert last is not None
    assert "".join(deltas) == last.message.content == reply.message.content
    assert len([d for d in deltas if d]) >= 4  # token by token
    # the same prompt again: stateless, but its cache namespace comes from the conversation
    assert last.raw["usage"]["cached_tokens"] > 0
    assert last.raw["usage"]["history"] == "stateless"
    assert "suffixmem_stored" not in last.message.additional_kwargs


def test_a_call_with_session_id_none_leaves_the_session_alone(llm: SuffixMemLLM) -> None:
    """``session_id=None`` on a call is stateless (docs/integrations.md), over the instance's
    session: a side question through the same LLM neither rewrites nor extends the chat."""
    bob = llm.model_copy(update={"session_id": "bob"})
    bob.chat(QUESTION)
    before = bob.get_manager().history("bob")
    side = bob.chat([ChatMessage(role=MessageRole.USER, content="Hi")], session_id=None)
    assert side.raw["usage"]["history"] == "stateless"
    bob.complete("Say hello", session_id=None)
    assert bob.get_manager().history("bob") == before and len(before) == 2
    # one message sent alone is read as sent, as the OpenAI LLM reads it (a condense step, a
    # title prompt): stateless, the chat untouched; the conversation resent continues it
    alone = bob.chat([ChatMessage(role=MessageRole.USER, content="And of Italy?")])
    assert alone.raw["usage"]["history"] == "stateless"
    assert "suffixmem_stored" not in alone.message.additional_kwargs
    assert bob.get_manager().history("bob") == before
    more = bob.chat([*(ChatMessage(role=m.role, content=m.content) for m in before),
                     ChatMessage(role=MessageRole.USER, content="And of Italy?")])
    assert more.raw["usage"]["history"] == "appended"
    assert bob.get_manager().history("bob")[:2] == before


def test_complete_and_stream_complete(llm: SuffixMemLLM, shared_engine: Any) -> None:
    done = llm.complete("What is the capital of Japan?")
    assert "Tokyo" in done.text
    pieces = [r.delta for r in llm.stream_complete("What is the capital of Japan?")]
    assert "".join(p or "" for p in pieces) == done.text and len(pieces) >= 4
    # formatted=True: the prompt is already formatted, so it is tokenized as is
    text = "The capital of France is"
    raw = llm.complete(text, formatted=True, max_tokens=3)
    assert raw.raw["usage"]["prompt_tokens"] == len(shared_engine.tokenize(text))


async def test_async_versions_stream(llm: SuffixMemLLM) -> None:
    reply = await llm.achat(QUESTION)
    deltas = [r.delta async for r in await llm.astream_chat(QUESTION)]
    assert "".join(d or "" for d in deltas) == reply.message.content and len(deltas) >= 4
    done = await llm.acomplete("What is the capital of Japan?")
    pieces = [r.delta async for r in await llm.astream_complete("What is the capital of Japan?")]
    assert "".join(p or "" for p in pieces) == done.text == reply.message.content


def _check_rising(usages: list[dict[str, Any]], block: int) -> list[int]:
    cached, previous_total = [], 0
    for u in usages:
        # every full block of the previous turn's prompt and reply is read from cache
        assert u["cached_tokens"] >= (previous_total - 1) // block * block, (u, previous_total)
        cached.append(u["cached_tokens"])
        previous_total = u["prompt_tokens"] + u["completion_tokens"]
    return cached


QUESTIONS = ("What is bread made of?", "And butter?", "Which one is older?", "Thank you!")


def test_simple_chat_engine_cached_tokens_rise(
    shared_engine: Any, manager: Any, database_url: str, usage_recorder: Any
) -> None:
    llm = SuffixMemLLM(**MODEL_PARAMS, max_tokens=24, temperature=0.0, session_id="li-rising",
                       database_url=database_url)
    memory = ChatMemoryBuffer.from_defaults(llm=llm)
    chat_engine = SimpleChatEngine.from_defaults(
        llm=llm, memory=memory, system_prompt="You are a friendly baker. Be brief.")
    for question in QUESTIONS:
        assert str(chat_engine.chat(question))
    assert len(memory.get_all()) == 2 * len(QUESTIONS)
    cached = _check_rising(usage_recorder.usages, shared_engine.block_size)
    assert cached[0] == 0 and cached == sorted(cached) and cached[-1] >= 3 * 32, cached
    # LlamaIndex's own memory holds the turns in process; the manager stored them in SQL
    assert [m.role for m in manager.history("li-rising")] == ["user", "assistant"] * 4


def test_streaming_chat_engine_with_memory(
    shared_engine: Any, database_url: str, usage_recorder: Any
) -> None:
    """LlamaIndex's newer ``Memory`` and a streaming chat engine."""
    llm = SuffixMemLLM(**MODEL_PARAMS, max_tokens=24, temperature=0.0, session_id="li-memory",
                       database_url=database_url)
    memory = Memory.from_defaults(session_id="li-memory", token_limit=3000)
    chat_engine = SimpleChatEngine.from_defaults(
        llm=llm, memory=memory, system_prompt="You are a friendly baker. Be brief.")
    for question in QUESTIONS:
        response = chat_engine.stream_chat(question)
        tokens = list(response.response_gen)
        assert len(tokens) >= 2 and "".join(tokens) == response.response
    assert [m.role for m in memory.get_all()] == [MessageRole.USER, MessageRole.ASSISTANT] * 4
    cached = _check_rising(usage_recorder.usages, shared_engine.block_size)
    assert cached[-1] > cached[0] and cached == sorted(cached), cached


def test_bad_input_raises_value_error(llm: SuffixMemLLM, shared_engine: Any) -> None:
    image = ChatMessage(role=MessageRole.USER, blocks=[
        TextBlock(text="What is this?"), ImageBlock(url="https://example.org/cat.png")])
    with pytest.raises(ValueError, match="ImageBlock"):
        llm.chat([image])
    tool_call = ChatMessage(role=MessageRole.ASSISTANT, content="",
                            additional_kwargs={"tool_calls": [{"id": "1"}]})
    with pytest.raises(ValueError, match="tool calls"):
        llm.chat([*QUESTION, tool_call])
    with pytest.raises(ContextWindowError, match="context window"):
        llm.complete("word " * shared_engine.max_model_len)
    with pytest.raises(ValueError, match="unsupported keyword"):
        llm.chat(QUESTION, logit_bias={"50256": -100})
    with pytest.raises(InvalidRequestError):  # nothing to answer
        list(llm.stream_chat([ChatMessage(role=MessageRole.USER, content="")]))
    # construction errors are the library's own one-line errors, not pydantic's wrapping
    for kwargs, error, says in BAD_CONSTRUCTION:
        with pytest.raises(error, match=says) as bad:
            SuffixMemLLM(**kwargs)
        assert "\n" not in str(bad.value) and "validation error" not in str(bad.value)
    assert llm.chat(QUESTION).message.content  # still usable


def test_penalties_reach_the_engine(llm: SuffixMemLLM) -> None:
    """``frequency_penalty``/``presence_penalty``, fields or per call: a reply that repeats
    itself greedily repeats less."""
    q = [ChatMessage(role=MessageRole.USER, content="Write the word dog ten times.")]
    plain = str(llm.chat(q, max_tokens=32).message.content)
    model = llm.model_copy(update={"frequency_penalty": 1.0, "presence_penalty": 0.5})
    penalised = str(model.chat(q, max_tokens=32).message.content)
    per_call = str(llm.chat(q, max_tokens=32, frequency_penalty=1.0,
                            presence_penalty=0.5).message.content)
    # not equal: the repeated prompt is cached, and bf16 logits differ a little from a cold run
    assert plain.lower().count("dog") > max(penalised.lower().count("dog"),
                                            per_call.lower().count("dog"))


def test_a_stream_left_unread_does_not_block_the_next_turn(llm: SuffixMemLLM) -> None:
    """LlamaIndex's idiom names the stream (``gen = llm.stream_chat(...)``), so stopping early
    leaves it referenced and unclosed: the next turn of the session closes it (nothing of it
    stored) instead of waiting a minute for its lock and failing; sync and async."""
    model = llm.model_copy(update={"session_id": "li-left", "max_tokens": 64})
    ask = [ChatMessage(role=MessageRole.USER, content="Count from one to fifty.")]
    gen = model.stream_chat(ask)
    next(gen)
    t0 = time.monotonic()
    reply = model.chat(QUESTION, max_tokens=8)
    assert time.monotonic() - t0 < 20 and reply.raw["usage"]["history"] == "new"

    async def run() -> Any:
        agen = await model.astream_chat(ask)
        async for _r in agen:
            break
        return await model.achat([*QUESTION, reply.message, *ask], max_tokens=8)

    again = asyncio.run(run())
    assert again.raw["usage"]["history"] == "appended"
    assert len(model.get_manager().history("li-left")) == 4
