"""What the standard suite does not check: sessions from the run's config (or stateless), cached
tokens rising turn after turn, exact stop sequences, real streaming, the LLM, errors on bad
input, and generated token ids kept in SQL."""

from __future__ import annotations

import time
from typing import Annotated, Any, TypedDict

import pytest
from adapter_setup import BAD_CONSTRUCTION, MODEL_PARAMS
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
)
from langchain_core.prompts import ChatPromptTemplate
from langchain_suffixmem import SuffixMemChatModel, SuffixMemLLM
from langchain_suffixmem.messages import RAW_KEY
from langgraph.graph.message import add_messages

from suffixmem.engine.protocol import Message
from suffixmem.errors import ContextWindowError, InvalidRequestError
from suffixmem.tool_calls import parse_reply

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.anyio]


class _State(TypedDict):  # a LangGraph chat thread (module level: LangGraph reads the hints)
    messages: Annotated[list[AnyMessage], add_messages]


@pytest.fixture
def chat(shared_engine: Any, manager: Any, database_url: str) -> SuffixMemChatModel:
    model = SuffixMemChatModel(
        **MODEL_PARAMS, max_tokens=12, temperature=0.0, database_url=database_url)
    # shared through the registry: the test's manager, on the session's engine
    assert model.get_manager() is manager and manager.engine is shared_engine
    return model


def test_session_comes_from_config_then_instance(chat: SuffixMemChatModel) -> None:
    def session(**call: Any) -> str:
        return str(chat.invoke("Hi", **call).response_metadata["session_id"])

    assert session(config={"configurable": {"session_id": "cfg-session"}}) == "cfg-session"
    assert session(config={"configurable": {"thread_id": "cfg-thread"}}) == "cfg-thread"
    assert session(session_id="kw-session") == "kw-session"
    # no session anywhere: stateless, nothing stored, a cache namespace of its own
    stateless = chat.invoke("Hi")
    assert stateless.response_metadata["history"] == "stateless"
    assert str(stateless.response_metadata["session_id"]).startswith("anon-")
    assert "suffixmem_stored" not in stateless.response_metadata
    assert {s.id for s in chat.get_manager().list_sessions()} == {
        "cfg-session", "cfg-thread", "kw-session"}
    # inside a chain the config reaches the model too
    chain = ChatPromptTemplate.from_messages([("human", "{q}")]) | chat
    out = chain.invoke({"q": "Hi"}, config={"configurable": {"session_id": "chain-session"}})
    assert out.response_metadata["session_id"] == "chain-session"
    streamed = list(chat.stream("Hi", config={"configurable": {"session_id": "stream-s"}}))
    assert streamed[-1].response_metadata["session_id"] == "stream-s"


def test_one_message_to_a_session_is_read_as_sent(chat: SuffixMemChatModel) -> None:
    """The model reads exactly the messages of the call, as ChatOpenAI's does: one message sent
    to a session with history (trim_messages down to the last question, a first answer
    regenerated, a helper call under a LangGraph thread's config) is answered from itself and
    leaves the session as it is; a call that resends the conversation continues it."""
    config: Any = {"configurable": {"session_id": "carol"}}
    first = chat.invoke("My name is Carol.", config=config)
    alone = chat.invoke("What is my name?", config=config)
    assert alone.response_metadata["history"] == "stateless"
    assert alone.usage_metadata["input_tokens"] < first.usage_metadata["input_tokens"] + 10  # type: ignore[index]
    stored = chat.get_manager().history("carol")
    assert [(m.role, m.content) for m in stored] == [
        ("user", "My name is Carol."), ("assistant", first.content)]
    again = chat.invoke([HumanMessage("My name is Carol."), first,
                         HumanMessage("What is my name?")], config=config)
    assert again.response_metadata["history"] == "appended"
    usage = again.usage_metadata
    assert usage is not None and usage["input_token_details"]["cache_read"] > 0
    assert len(chat.get_manager().history("carol")) == 4


def test_an_explicit_session_id_none_is_stateless(chat: SuffixMemChatModel) -> None:
    """``session_id=None`` on a call means stateless, over the config's and the instance's
    session (which stay untouched)."""
    chat_with = chat.model_copy(update={"session_id": "dave"})
    chat_with.invoke("Hello there.")
    before = chat.get_manager().history("dave")
    for call in ({}, {"config": {"configurable": {"session_id": "dave"}}}):
        out = chat_with.invoke("Hi", session_id=None, **call)
        assert out.response_metadata["history"] == "stateless"
    assert chat.get_manager().history("dave") == before and len(before) == 2


async def test_async_session_from_config(chat: SuffixMemChatModel) -> None:
    out = await chat.ainvoke("Hi", config={"configurable": {"session_id": "async-s"}})
    assert out.response_metadata["session_id"] == "async-s"
    last = None
    async for chunk in chat.astream("Hi", config={"configurable": {"thread_id": "async-t"}}):
        last = chunk
    assert last is not None and last.response_metadata["session_id"] == "async-t"


def test_cached_tokens_rise_turn_by_turn(shared_engine: Any, database_url: str) -> None:
    """LangChain re-sends the whole history as text; the manager renders each earlier reply
    from its stored generated ids, so every turn reads all full blocks of the previous turn's
    prompt and reply from cache."""
    chat = SuffixMemChatModel(**MODEL_PARAMS, max_tokens=24, temperature=0.0,
                              session_id="rising", database_url=database_url)
    block = shared_engine.block_size
    history: list[BaseMessage] = [SystemMessage("You are a friendly assistant. Be brief.")]
    cached, previous_total = [], 0
    for question in ("What is bread made of?", "And butter?", "Which is older?", "Thanks!"):
        history.append(HumanMessage(question))
        reply = chat.invoke(history)
        usage = reply.usage_metadata
        assert usage is not None
        read = usage["input_token_details"]["cache_read"]
        # the previous prompt + reply minus its last token (whose KV is never computed)
        assert read >= (previous_total - 1) // block * block
        cached.append(read)
        previous_total = usage["input_tokens"] + usage["output_tokens"]
        history.append(AIMessage(reply.content))
    assert cached == sorted(cached) and cached[-1] > cached[0] and cached[1] > 0, cached


def test_stop_sequence_cuts_exactly(chat: SuffixMemChatModel) -> None:
    full = str(chat.invoke("Name three colours.", max_tokens=20).content)
    words = full.split()
    assert len(words) >= 3, full
    stop = " " + words[2]
    cut = chat.invoke("Name three colours.", max_tokens=20, stop=[stop])
    assert cut.content == full[: full.index(stop)]
    assert cut.response_metadata["finish_reason"] == "stop"
    # the instance's stop list applies when the call gives none
    model = chat.model_copy(update={"max_tokens": 20, "stop": [stop]})
    assert model.invoke("Name three colours.").content == cut.content


def test_stream_is_token_by_token_and_equals_invoke(chat: SuffixMemChatModel) -> None:
    text = chat.invoke("Tell me about cats.", max_tokens=16).content
    chunks = list(chat.stream("Tell me about cats.", max_tokens=16,
                              stream_usage=True))  # ChatOpenAI's switch: accepted
    pieces = [c.content for c in chunks if c.content]
    assert "".join(pieces) == text  # type: ignore[arg-type]
    assert len(pieces) >= 8  # one chunk per token, not one per reply
    last = chunks[-1]
    assert last.chunk_position == "last" and last.usage_metadata is not None
    assert last.usage_metadata["output_tokens"] == 16
    # llm_output as ChatOpenAI fills it, for handlers that read it (it was None)
    llm_output = chat.generate([[HumanMessage("Tell me about cats.")]], max_tokens=16).llm_output
    assert llm_output is not None and llm_output["token_usage"]["completion_tokens"] == 16
    assert llm_output["token_usage"]["total_tokens"] == \
        llm_output["token_usage"]["prompt_tokens"] + 16
    meta = last.response_metadata
    assert meta["model_name"] == chat.model
    assert 0 < meta["time_to_first_token_s"] <= meta["latency_s"]


def test_a_plain_answer_under_tools_streams_and_equals_invoke(chat: SuffixMemChatModel) -> None:
    """Under tools a plain answer is generated as ``{"response": ...}``; its text streams in
    pieces as it is generated (it came as one chunk at the end), equal to ``invoke``'s."""
    add = {"type": "function", "function": {
        "name": "add", "description": "Add two integers", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"]}}}
    # ChatOpenAI's bind_tools arguments are accepted (bound, then refused at the call before)
    model = chat.bind_tools([add], tool_choice="none", parallel_tool_calls=False, strict=True)
    text = model.invoke("Greet the team warmly.", max_tokens=24).content
    chunks = list(model.stream("Greet the team warmly.", max_tokens=24))
    pieces = [c.content for c in chunks if c.content]
    assert len(pieces) >= 4 and "".join(pieces) == text  # type: ignore[arg-type]
    assert not str(text).lstrip().startswith("{")  # the text, not its JSON
    whole = chunks[0]
    for c in chunks[1:]:
        whole += c
    assert parse_reply(whole.response_metadata[RAW_KEY]).text == text  # resent verbatim
    assert not whole.tool_calls


def test_structured_output_with_include_raw(chat: SuffixMemChatModel) -> None:
    schema = {
        "title": "City", "type": "object",
        "properties": {"name": {"type": "string"}, "country": {"type": "string"}},
        "required": ["name", "country"],
    }
    out = chat.with_structured_output(schema, include_raw=True).invoke(
        "Name a city in France.", max_tokens=40)
    assert out["parsing_error"] is None, out
    assert set(out["parsed"]) == {"name", "country"}
    assert isinstance(out["raw"], AIMessage)
    # function_calling, as ChatOpenAI serves it: the raw message carries the forced call
    longer = chat.model_copy(update={"max_tokens": 80})  # invoke's kwargs stop at the map
    out = longer.with_structured_output(schema, method="function_calling", include_raw=True
                                        ).invoke("Name a city in France.")
    assert out["parsing_error"] is None, out
    (call,) = out["raw"].tool_calls
    assert call["name"] == "City" and call["args"] == out["parsed"]
    assert set(out["parsed"]) == {"name", "country"}
    assert out["raw"].response_metadata["finish_reason"] == "tool_calls"


def test_without_guided_decoding_tools_and_structured_output_are_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine without guided decoding (the torch engine where xgrammar is not installed):
    honest flags without starting it, and one-line refusals."""
    from adapter_setup import TORCH_PARAMS

    from suffixmem.engine.torch.engine import TorchEngine

    assert SuffixMemChatModel(**TORCH_PARAMS).supports_json_schema is True  # xgrammar here
    monkeypatch.setattr(TorchEngine, "supports_json_schema", False)
    model = SuffixMemChatModel(**TORCH_PARAMS)  # not started: the flag comes from the class
    assert model.supports_json_schema is False
    with pytest.raises(NotImplementedError, match="guided decoding"):
        model.with_structured_output({"type": "object"})
    with pytest.raises(NotImplementedError, match="not supported by this engine"):
        model.bind_tools([{"type": "function", "function": {"name": "f", "parameters": {}}}])


def test_llm_streams_and_reports_usage(shared_engine: Any, database_url: str) -> None:
    llm = SuffixMemLLM(**MODEL_PARAMS, max_tokens=10, temperature=0.0, database_url=database_url)
    text = llm.invoke("What is the capital of Japan?")
    assert "Tokyo" in text
    chunks = list(llm.stream("What is the capital of Japan?"))
    assert "".join(chunks) == text and len([c for c in chunks if c]) >= 2
    result = llm.generate(["What is the capital of Japan?"])
    info = result.generations[0][0].generation_info or {}
    assert info["completion_tokens"] <= 10 and info["cached_tokens"] > 0  # third identical
    assert result.llm_output is not None
    assert result.llm_output["token_usage"]["prompt_tokens"] == info["prompt_tokens"]
    assert result.llm_output["token_usage"]["completion_tokens"] == info["completion_tokens"]
    # raw continuation: the prompt is not wrapped in the chat template
    raw = SuffixMemLLM(**MODEL_PARAMS, max_tokens=4, chat_template=False,
                       database_url=database_url)
    out = raw.generate(["The capital of France is"]).generations[0][0].generation_info or {}
    assert out["prompt_tokens"] == len(shared_engine.tokenize("The capital of France is"))


async def test_llm_async(shared_engine: Any, database_url: str) -> None:
    llm = SuffixMemLLM(**MODEL_PARAMS, max_tokens=10, temperature=0.0, database_url=database_url)
    text = await llm.ainvoke("What is the capital of Japan?")
    chunks = [c async for c in llm.astream("What is the capital of Japan?")]
    assert "".join(chunks) == text and "Tokyo" in text


# -- bad input ------------------------------------------------------------------------------------


def test_bad_messages_raise_value_error(chat: SuffixMemChatModel) -> None:
    with pytest.raises(ValueError, match="FunctionMessage"):
        chat.invoke([FunctionMessage(content="3", name="f")])
    image = {"type": "image", "url": "https://example.org/cat.png"}
    with pytest.raises(ValueError, match="'image' content block"):
        chat.invoke([HumanMessage([{"type": "text", "text": "What is this?"}, image])])
    # a history ending in the model's own tool call has nothing to answer (tool calls render:
    # test_tool_calls_render_canonically); OpenAI refuses it too
    with pytest.raises(ValueError, match="a tool call without its result: nothing to answer"):
        chat.invoke([
            HumanMessage("add"),
            AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "1", "type": "tool_call"}]),
        ])
    with pytest.raises(InvalidRequestError, match="empty"):
        chat.invoke([HumanMessage("")])


def test_an_empty_message_refused_once_does_not_poison_the_thread(
    chat: SuffixMemChatModel, database_url: str
) -> None:
    """LangGraph checkpoints a thread's input before the model runs: an empty message is
    refused (one line) on its turn, then left out of what the model reads, so the thread's
    later turns work."""
    from langchain_suffixmem import SuffixMemSaver
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(_State)
    builder.add_node("agent", lambda state: {"messages": [chat.invoke(state["messages"])]})
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    config: Any = {"configurable": {"thread_id": "poison"}}
    with SuffixMemSaver.from_conn_string(database_url) as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke({"messages": [("user", "Hi")]}, config)
        with pytest.raises(InvalidRequestError, match="empty"):
            graph.invoke({"messages": [("user", "")]}, config)
        out = graph.invoke({"messages": [("user", "Hello again")]}, config)
    assert out["messages"][-1].response_metadata["history"] == "appended"
    # the same without LangGraph: an empty earlier message is left out
    assert chat.invoke([HumanMessage(""), AIMessage("ok"), HumanMessage("hi")]).content


def test_oversize_prompt_and_bad_arguments_raise_value_error(
    chat: SuffixMemChatModel, shared_engine: Any
) -> None:
    long = "word " * shared_engine.max_model_len
    with pytest.raises(ContextWindowError, match="context window") as err:
        chat.invoke(long)
    assert isinstance(err.value, ValueError)
    with pytest.raises(ValueError, match="unsupported keyword argument"):
        chat.invoke("Hi", logit_bias={"50256": -100})
    with pytest.raises(ValueError, match="model: unknown model 'gpt-4o'"):  # no such model
        chat.invoke("Hi", model="gpt-4o")
    with pytest.raises(ValueError, match="max_tokens"):
        chat.invoke("Hi", max_tokens=0)
    # construction errors are the library's own one-line errors, not pydantic's wrapping
    for kwargs, error, says in BAD_CONSTRUCTION:
        for cls in (SuffixMemChatModel, SuffixMemLLM):
            with pytest.raises(error, match=says) as bad:
                cls(**kwargs)
            assert "\n" not in str(bad.value) and "validation error" not in str(bad.value)
    # the engine is still fine after all that
    assert chat.invoke("Hi").content


def test_timeout_aborts_between_tokens(chat: SuffixMemChatModel) -> None:
    slow = chat.model_copy(update={"timeout": 1e-4})
    with pytest.raises(TimeoutError, match="aborted"):
        slow.invoke("Tell me a long story.", max_tokens=64)
    # per call too, as documented (it was refused as an unknown argument)
    with pytest.raises(TimeoutError, match="aborted"):
        chat.invoke("Tell me a long story.", max_tokens=64, timeout=1e-4)
    with pytest.raises(InvalidRequestError, match="timeout must be > 0"):
        chat.invoke("Hi", timeout=0)
    assert chat.invoke("Hi", max_tokens=4, timeout=600).content


def test_a_stop_string_is_one_stop_sequence(chat: SuffixMemChatModel) -> None:
    """``stop="2,"`` stops at "2," as OpenAI's API reads it (it stopped at "2" or ",")."""
    count = "Count from 1 to 10, separated by commas."
    full = str(chat.invoke(count, max_tokens=24).content)
    assert "2," in full
    assert chat.invoke(count, max_tokens=24, stop="2,").content == full[:full.index("2,")]
    assert chat.invoke(count, max_tokens=24, stop=["2,"]).content == full[:full.index("2,")]


def test_token_counts_use_the_models_tokenizer(chat: SuffixMemChatModel,
                                               shared_engine: Any) -> None:
    """``get_num_tokens`` and ``get_num_tokens_from_messages`` count with the model's own
    tokenizer and chat template (LangChain's default fetched GPT-2's from a model hub, and
    gave 0 offline), so ``trim_messages(token_counter=model)`` trims."""
    from langchain_core.messages import trim_messages

    text = "Grüße aus Köln, 東京タワー"
    assert chat.get_token_ids(text) == shared_engine.tokenize(text)
    assert chat.get_num_tokens(text) == len(shared_engine.tokenize(text))
    msgs = [SystemMessage("Be terse."), HumanMessage("Hi"), AIMessage("Hello!")]
    assert chat.get_num_tokens_from_messages(msgs) == len(shared_engine.render(
        [Message("system", "Be terse."), Message("user", "Hi"), Message("assistant", "Hello!")],
        False))
    fresh = SuffixMemChatModel(**MODEL_PARAMS)  # no engine started: the local folder's
    assert fresh.get_token_ids(text) == shared_engine.tokenize(text)
    assert SuffixMemLLM(**MODEL_PARAMS).get_num_tokens(text) == len(shared_engine.tokenize(text))
    long = [SystemMessage("Be terse.")] + [
        HumanMessage(f"question {i}") if i % 2 == 0 else AIMessage(f"answer {i}")
        for i in range(40)]
    kept = trim_messages(long, max_tokens=100, token_counter=chat, strategy="last",
                         include_system=True)
    assert 1 < len(kept) < len(long) and chat.get_num_tokens_from_messages(kept) <= 100


def test_the_response_cache_keys_on_the_instances_settings(chat: SuffixMemChatModel) -> None:
    """LangChain's response cache keys on ``_identifying_params``: two instances that differ
    in a setting that changes the reply never share an entry (a ``max_tokens=2`` model got
    another's 8-token reply, and a model with its own session a stateless cached one)."""
    from langchain_core.caches import InMemoryCache
    from langchain_core.globals import set_llm_cache

    set_llm_cache(InMemoryCache())
    try:
        long = chat.model_copy(update={"max_tokens": 8})
        short = chat.model_copy(update={"max_tokens": 2})
        first = long.invoke("Count from 1 to 20.")
        assert long.invoke("Count from 1 to 20.").content == first.content  # a cache hit
        assert short.invoke("Count from 1 to 20.").usage_metadata["output_tokens"] <= 2
        secret = SuffixMemChatModel(database_url="postgresql+psycopg://u:hunter2@db/x")
        assert "hunter2" not in str(secret._identifying_params)  # they reach tracing too
        own = chat.model_copy(update={"max_tokens": 8, "session_id": "cache-own"})
        own.invoke("Count from 1 to 20.")
        assert [m.role for m in own.get_manager().history("cache-own")] == ["user", "assistant"]
    finally:
        set_llm_cache(None)


def test_resent_replies_render_to_their_generated_ids(
    shared_engine: Any, database_url: str
) -> None:
    """A sampled reply often re-tokenizes differently; the manager keeps its generated ids in
    SQL and renders the resent text from them, so the next turn reads all of it from cache."""
    chat = SuffixMemChatModel(**MODEL_PARAMS, max_tokens=48, temperature=1.0,
                              database_url=database_url)
    manager = chat.get_manager()
    block = shared_engine.block_size
    candidates = [("What is 12 times 13?", 4), ("Describe a sunset in Paris.", 4)] + [
        (q, seed) for q in ("Explain how rain forms.", "List some French words.")
        for seed in range(16)
    ]
    for question, seed in candidates:
        session = f"retok-{seed}-{len(question)}"
        reply = chat.invoke([HumanMessage(question)], session_id=session, seed=seed)
        stored = manager.history(session)
        assert [m.role for m in stored] == ["user", "assistant"]
        ids = stored[-1].token_ids
        assert ids and stored[-1].content == reply.content
        user = Message("user", question)
        generated = shared_engine.render([user, Message("assistant", reply.content, ids)])
        retokenized = shared_engine.render([user, Message("assistant", reply.content)])
        if generated != retokenized:
            break
    else:
        pytest.fail("no sampled reply re-tokenized differently")
    usage = reply.usage_metadata
    assert usage is not None
    next_turn = [HumanMessage(question), AIMessage(reply.content), HumanMessage("Thanks!")]
    read = chat.invoke(next_turn, session_id=session, max_tokens=2).usage_metadata
    assert read is not None
    assert read["input_token_details"]["cache_read"] >= (
        usage["input_tokens"] + usage["output_tokens"] - 1) // block * block


def test_tool_calls_render_canonically() -> None:
    """Tool calls the model did not generate and tool results render as the documented JSON
    (deterministic, so a resent history is the same tokens); a reply the model generated is
    resent as generated."""
    from langchain_core.messages import ToolMessage
    from langchain_suffixmem.messages import RAW_KEY, to_suffixmem

    call = {"name": "add", "args": {"b": 2, "a": 1}, "id": "call_1", "type": "tool_call"}
    sent = to_suffixmem([
        HumanMessage("add 1 and 2"),
        AIMessage("", tool_calls=[call]),
        ToolMessage("3", tool_call_id="call_1", name="add"),
        AIMessage("", tool_calls=[call], response_metadata={RAW_KEY: '{"name":"add"}'}),
        ToolMessage("3", tool_call_id="call_1"),
    ])
    assert [(m.role, m.content) for m in sent] == [
        ("user", "add 1 and 2"),
        ("assistant", '{"arguments": {"a": 1, "b": 2}, "name": "add"}'),
        ("tool", '{"tool": "add", "result": "3"}'),
        ("assistant", '{"name":"add"}'),
        ("tool", "3"),
    ]


def test_anthropic_blocks_read_as_text() -> None:
    """Anthropic-style history (the standard suite's ``test_anthropic_inputs``): text blocks
    with extra keys are read, ``tool_use`` blocks repeat ``tool_calls`` (rendered once),
    ``thinking`` and ``reasoning`` blocks are left out; an image block is still refused."""
    from langchain_core.messages import ToolMessage
    from langchain_suffixmem.messages import to_suffixmem

    call = {"name": "pick", "args": {"color": "green"}, "id": "foo", "type": "tool_call"}
    sent = to_suffixmem([
        HumanMessage([{"type": "text", "text": "Pick", "cache_control": {"type": "ephemeral"}}]),
        AIMessage([{"type": "thinking", "thinking": "hmm", "signature": "x"},
                   {"type": "text", "text": "Let me see."},
                   {"type": "tool_use", "input": {"color": "green"}, "id": "foo",
                    "name": "pick"}], tool_calls=[call]),
        ToolMessage("Nice pick!", tool_call_id="foo"),
        AIMessage([{"type": "reasoning", "reasoning": "short"},
                   {"type": "text", "text": "Green."}]),
    ])
    assert [(m.role, m.content) for m in sent] == [
        ("user", "Pick"),
        ("assistant", 'Let me see.\n{"arguments": {"color": "green"}, "name": "pick"}'),
        ("tool", "Nice pick!"),
        ("assistant", "Green."),
    ]
    with pytest.raises(InvalidRequestError, match="'image' content block"):
        to_suffixmem([HumanMessage([{"type": "image", "url": "https://example.org/a.png"}])])


def test_manager_config_reaches_the_manager(shared_engine: Any, database_url: str) -> None:
    """``manager_config`` picks the manager's settings; equal configs share one manager (and
    its session locks), the default config another."""
    from suffixmem.conversation.manager import ManagerConfig

    layout = ManagerConfig(layout="sliding")
    chat = SuffixMemChatModel(**MODEL_PARAMS, manager_config=layout, database_url=database_url,
                              max_tokens=4, temperature=0.0)
    llm = SuffixMemLLM(**MODEL_PARAMS, manager_config=ManagerConfig(layout="sliding"),
                       database_url=database_url)
    plain = SuffixMemChatModel(**MODEL_PARAMS, database_url=database_url)
    assert chat.get_manager().config.layout == "sliding"
    assert chat.get_manager() is llm.get_manager()
    assert plain.get_manager() is not chat.get_manager()
    assert plain.get_manager().config.layout == "stable"
    assert chat.invoke("Hi", config={"configurable": {"session_id": "mc"}}).content
    assert [m.role for m in chat.get_manager().history("mc")] == ["user", "assistant"]


def test_penalties_reach_the_engine(chat: SuffixMemChatModel) -> None:
    """``frequency_penalty``/``presence_penalty`` as ``ChatOpenAI`` takes them: fields or per
    call; a reply that repeats itself greedily repeats less."""
    q = "Write the word cat ten times."
    plain = str(chat.invoke(q, max_tokens=32).content)
    model = chat.model_copy(update={"frequency_penalty": 1.0, "presence_penalty": 0.5})
    penalised = str(model.invoke(q, max_tokens=32).content)
    per_call = str(chat.invoke(q, max_tokens=32, frequency_penalty=1.0,
                               presence_penalty=0.5).content)
    # not equal: the repeated prompt is cached, and bf16 logits differ a little from a cold run
    assert plain.lower().count("cat") > max(penalised.lower().count("cat"),
                                            per_call.lower().count("cat"))


def test_a_stream_left_unread_does_not_block_the_next_turn(chat: SuffixMemChatModel) -> None:
    """A ``break`` out of a stream that is still referenced leaves it unclosed; the next turn
    of the session closes it (nothing of it stored) instead of waiting a minute for its lock
    and failing with ``SessionBusyError``."""
    cfg = {"configurable": {"session_id": "lc-left"}}
    it = chat.stream("Count from one to fifty.", config=cfg, max_tokens=64)
    for _ in it:
        break
    t0 = time.monotonic()
    reply = chat.invoke([HumanMessage("What is the capital of Japan?")], config=cfg)
    assert time.monotonic() - t0 < 20 and reply.response_metadata["history"] == "new"
    assert len(chat.get_manager().history("lc-left")) == 2


def test_disable_streaming_sends_no_token_events(chat: SuffixMemChatModel) -> None:
    """``disable_streaming=True`` inside a run that streams events (LangGraph's "messages"
    mode, ``astream_events``): the model's reply comes whole, with no per-token events, as
    LangChain's own models do; without it, the tokens stream (_generate reported every token
    through its callbacks, so the setting was ignored)."""
    import asyncio

    from langchain_core.runnables import RunnableLambda

    async def token_events(model: SuffixMemChatModel) -> list[Any]:
        node = RunnableLambda(lambda text: model.invoke(text, max_tokens=8))
        return [e async for e in node.astream_events("Name a fruit.", version="v2")
                if e["event"] == "on_chat_model_stream"]

    quiet = chat.model_copy(update={"disable_streaming": True})
    assert asyncio.run(token_events(quiet)) == []
    streamed = asyncio.run(token_events(chat))
    assert len([e for e in streamed if e["data"]["chunk"].content]) >= 2
    whole = quiet.invoke("Name a fruit.", max_tokens=8)
    assert whole.content and whole.usage_metadata["input_tokens"] > 0


def test_settings_round_trip_and_a_used_model_copies(chat: SuffixMemChatModel) -> None:
    """``model_dump`` keeps the engine (a rebuilt model switched to vLLM), ``ChatOpenAI``'s
    ``max_retries`` and ``api_key`` read back, and a model that has answered still pickles and
    deep-copies (its process-wide manager is shared, not copied)."""
    import copy
    import pickle

    torch_model = SuffixMemChatModel(engine="torch", max_retries=3, api_key="sk-secret")
    assert SuffixMemChatModel(**torch_model.model_dump()).engine == "torch"
    assert torch_model.max_retries == 3 and "sk-secret" not in repr(torch_model)
    assert torch_model.api_key.get_secret_value() == "sk-secret"
    assert '"engine":"torch"' in torch_model.model_dump_json()
    first = chat.invoke("Hi", max_tokens=4, session_id="copied")
    twin = copy.deepcopy(chat)
    assert twin.get_manager() is chat.get_manager()
    thawed = pickle.loads(pickle.dumps(chat))
    assert thawed.get_manager() is chat.get_manager()  # rebuilt: the process-wide manager
    again = thawed.invoke([("human", "Hi"), ("ai", first.content), ("human", "Thanks")],
                          max_tokens=4, session_id="copied")
    assert again.response_metadata["history"] == "appended"
