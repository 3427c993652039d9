"""``SuffixMemChatModel``: a LangChain chat model on suffixmem's ``ConversationManager``.

Translation only: LangChain messages become suffixmem messages, the run's config names the
session, and the manager's events become ``AIMessageChunk``s. The manager reconciles the sent
messages with the stored session (appended / windowed / rewritten / new / stateless), lays the
prompt out for the cache, detects topic jumps, picks the semantic temperature and stores the
turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import (
    agenerate_from_stream,
    generate_from_stream,
)
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import InputTokenDetails, UsageMetadata
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import (
    JsonOutputKeyToolsParser,
    PydanticToolsParser,
)
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableMap,
    RunnablePassthrough,
)
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass

from langchain_suffixmem._base import (
    SessionConfigMixin,
    SuffixMemParams,
    awith_deadline,
    with_deadline,
)
from langchain_suffixmem.messages import STORED_KEY, to_suffixmem
from langchain_suffixmem.tools import openai_tools, reply_chunk, tool_schema, with_tools_prompt
from suffixmem.conversation.manager import ConversationManager, TurnResult
from suffixmem.conversation.reconcile import readable
from suffixmem.conversation.stored_turns import STORED_TURNS
from suffixmem.engine.protocol import TokenEvent
from suffixmem.tool_calls import AnswerStream

StructuredMethod = Literal["json_schema", "json_mode", "function_calling"]


def usage_metadata(turn: TurnResult) -> UsageMetadata:
    """LangChain usage of one reply; ``input_token_details.cache_read`` = cached tokens."""
    output = turn.result.output_tokens
    return UsageMetadata(
        input_tokens=turn.prompt_tokens,
        output_tokens=output,
        total_tokens=turn.prompt_tokens + output,
        input_token_details=InputTokenDetails(cache_read=turn.cached_tokens),
    )


def response_metadata(turn: TurnResult, model_name: str, stored_index: int | None
                      ) -> dict[str, Any]:
    """Model name, finish reason, session, timings (seconds), the turn's topic verdict and
    temperature, and (for a stored turn) where the reply sits in the session's history, which
    ``SuffixMemChatMessageHistory.add_messages`` uses to not store it twice."""
    meta: dict[str, Any] = {
        "model_name": model_name,
        "finish_reason": turn.result.finish_reason,
        "session_id": turn.session_id,
        "time_to_first_token_s": turn.ttft_s,
        "latency_s": turn.latency_s,
        "topic_jump": turn.topic_jump,
        "temperature": turn.temperature,
        "history": getattr(turn, "history", None),
    }
    if stored_index is not None:
        meta[STORED_KEY] = {"session_id": turn.session_id, "index": stored_index}
    return meta


def _called(chunk: ChatGenerationChunk | None) -> bool:
    """Whether the reply's last chunk is a tool call."""
    return chunk is not None and bool(getattr(chunk.message, "tool_call_chunks", None))


class SuffixMemChatModel(SessionConfigMixin, SuffixMemParams, BaseChatModel):
    """Chat model on a suffixmem engine: the model's chat template, real token streaming,
    per-session prefix caching, and cached tokens reported as ``cache_read``.

    ```python
    from langchain_suffixmem import SuffixMemChatModel

    chat = SuffixMemChatModel(max_tokens=64)
    chat.invoke("Hello", config={"configurable": {"session_id": "alice"}})
    ```

    The session comes from ``config["configurable"]["session_id"]`` (or ``thread_id``), else a
    ``session_id=`` call argument, else the instance's ``session_id``; with none, the call is
    stateless (nothing stored). Per-call keyword
    arguments: ``temperature``, ``top_p``, ``top_k``, ``max_tokens``, ``seed``, ``stop``, and
    ``model`` (another model on the same kind of engine: its shared engine is started on first
    use; ``response_metadata["model_name"]`` says which model answered).
    ``with_structured_output`` and ``bind_tools`` use the engine's JSON-schema guided
    decoding (``suffixmem.tool_calls``: a reply is a tool call whose arguments follow the
    tool's schema, or with ``tool_choice="auto"`` a plain answer); both raise
    ``NotImplementedError`` on engines without it (``supports_json_schema`` is false). Under
    tools a plain answer streams as it is generated; a call comes as one chunk once complete
    (its JSON is not text to show), with ``finish_reason`` "tool_calls".
    """

    @property
    def _llm_type(self) -> str:
        return "suffixmem-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return self._cache_params()

    def get_num_tokens_from_messages(self, messages: list[BaseMessage],
                                     tools: Sequence[Any] | None = None) -> int:
        """Tokens of ``messages`` as the model reads them: under its chat template, with its
        own tokenizer (what ``trim_messages(token_counter=model)`` calls). ``tools`` are not
        counted, as in LangChain's default."""
        if not messages:
            return 0
        return len(self._template().render(readable(to_suffixmem(messages)), False))

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "suffixmem"
        model = kwargs.get("model")
        params["ls_model_name"] = model if isinstance(model, str) else self.model
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    # -- generation -----------------------------------------------------------------------------
    @staticmethod
    def _final_chunk(turn: TurnResult, session_id: str | None, manager: ConversationManager,
                     model: str, called: bool = False) -> ChatGenerationChunk:
        """The last chunk: usage and metadata; ``called``: the reply was a tool call, whose
        ``finish_reason`` is "tool_calls" (OpenAI's, as the server and ``ChatOpenAI`` say)."""
        index = None
        if turn.history == "stateless":  # one message sent alone to a session stores nothing
            session_id = None
        if session_id is not None:
            # the reply is the session's last message now (the session lock is released, but
            # a framework drives one session from one place at a time)
            index = manager.get_session(session_id).message_count - 1
            STORED_TURNS.note(manager, session_id, index, turn.text)
        meta = response_metadata(turn, model, index)
        if called:
            meta["finish_reason"] = "tool_calls"
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                usage_metadata=usage_metadata(turn),
                response_metadata=meta,
                chunk_position="last",
            ),
            generation_info={"finish_reason": meta["finish_reason"]},
        )

    def _tool_args(self, kwargs: dict[str, Any]
                   ) -> tuple[Any, dict[str, Any] | None, dict[str, Any]]:
        """The call's bound ``tools``, the reply schema of them and ``tool_choice`` (``None``:
        free text), and the other keyword arguments. The model reads the tools at the end of
        the system prompt (the same for every call, so the conversation stays cached)."""
        kwargs = dict(kwargs)
        tools, choice = kwargs.pop("tools", None), kwargs.pop("tool_choice", None)
        schema = tool_schema(tools, choice)
        if schema is not None and not self.supports_json_schema:
            raise NotImplementedError(
                f"engine {self._engine_name()!r} has no JSON-schema guided decoding, so tool "
                "calling is not supported by this engine; use the 'vllm' engine (or install "
                "xgrammar for the 'torch' engine)")
        return tools, schema, kwargs

    @staticmethod
    def _piece(event: TokenEvent, answer: AnswerStream | None) -> ChatGenerationChunk | None:
        """A token's chunk: its text; under tools only a plain answer's text (a call's JSON is
        read whole at the end); None where it completes no character yet."""
        text = event.text if answer is None else answer.feed(event.text)
        return ChatGenerationChunk(message=AIMessageChunk(content=text)) if text else None

    def _show_schema(self, sampling: dict[str, Any]) -> bool:
        # only structured output has a schema to show
        return self.show_schema and sampling.get("json_schema") is not None

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        tools, schema, kwargs = self._tool_args(kwargs)
        timeout = self.call_timeout(kwargs)
        session_id, sampling = self._call_args(stop, kwargs)  # checked before any engine starts
        manager, model = self._call_manager(kwargs)
        show = self._show_schema(sampling)  # structured output only: tools are in the system
        if schema is not None:
            sampling["json_schema"] = schema
        events = manager.stream_complete(  # bad input raises here
            session_id, with_tools_prompt(readable(to_suffixmem(messages)), tools),
            show_schema=show, **sampling)
        answer = None if schema is None else AnswerStream()
        for event in with_deadline(events, timeout):
            if isinstance(event, TokenEvent):
                chunk = self._piece(event, answer)
            else:
                chunk = None if answer is None else ChatGenerationChunk(
                    message=reply_chunk(event.text, answer))
            if chunk is not None:
                yield chunk
            if not isinstance(event, TokenEvent):
                yield self._final_chunk(event, session_id, manager, model, _called(chunk))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        tools, schema, kwargs = self._tool_args(kwargs)
        timeout = self.call_timeout(kwargs)
        session_id, sampling = self._call_args(stop, kwargs)  # checked before any engine starts
        manager, model = self._call_manager(kwargs)
        show = self._show_schema(sampling)
        if schema is not None:
            sampling["json_schema"] = schema
        events = manager.astream_complete(
            session_id, with_tools_prompt(readable(to_suffixmem(messages)), tools),
            show_schema=show, **sampling)
        answer = None if schema is None else AnswerStream()
        async for event in awith_deadline(events, timeout):
            if isinstance(event, TokenEvent):
                chunk = self._piece(event, answer)
            else:
                chunk = None if answer is None else ChatGenerationChunk(
                    message=reply_chunk(event.text, answer))
            if chunk is not None:
                yield chunk
            if not isinstance(event, TokenEvent):
                # the session lookup is SQL: keep it off the event loop
                yield await asyncio.to_thread(self._final_chunk, event, session_id, manager,
                                              model, _called(chunk))

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        # no token callbacks: LangChain calls _generate when it is not to stream (no streaming
        # handler, or disable_streaming), and streams through _stream itself, reporting each
        # chunk; reporting here too sent LangGraph every token of a disable_streaming model
        return self._with_llm_output(generate_from_stream(self._stream(messages, stop, **kwargs)))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._with_llm_output(
            await agenerate_from_stream(self._astream(messages, stop, **kwargs)))

    def _combine_llm_outputs(self, llm_outputs: list[dict[str, Any] | None]) -> dict[str, Any]:
        """``generate``'s ``llm_output`` over several prompts: usage summed (as ChatOpenAI)."""
        usage: dict[str, int] = {}
        model = None
        for out in llm_outputs:
            if out:
                model = out.get("model_name") or model
                for key, n in (out.get("token_usage") or {}).items():
                    usage[key] = usage.get(key, 0) + n
        return {"token_usage": usage, "model_name": model}

    @staticmethod
    def _with_llm_output(result: ChatResult) -> ChatResult:
        """``llm_output`` as ``ChatOpenAI`` fills it (``token_usage`` in OpenAI's names and the
        model), for callback handlers that read it rather than ``usage_metadata``."""
        message = result.generations[0].message
        u = getattr(message, "usage_metadata", None)
        if u:
            cached = (u.get("input_token_details") or {}).get("cache_read", 0)
            result.llm_output = {
                "token_usage": {"prompt_tokens": u["input_tokens"],
                                "completion_tokens": u["output_tokens"],
                                "total_tokens": u["total_tokens"], "cached_tokens": cached},
                "model_name": message.response_metadata.get("model_name"),
            }
        return result

    # LangChain's v3 event stream takes the config too; read the session from it.
    def stream_events(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        if kwargs.get("version") == "v3":
            kwargs = self._with_session(config, kwargs)
        return super().stream_events(input, config, **kwargs)

    def astream_events(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Any:
        if kwargs.get("version") == "v3":
            kwargs = self._with_session(config, kwargs)
        return super().astream_events(input, config, **kwargs)

    # -- tools ----------------------------------------------------------------------------------
    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        parallel_tool_calls: bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """The model with ``tools`` bound: each reply is a tool call (``AIMessage.tool_calls``,
        ids ``call_...``) whose arguments follow that tool's schema, or, with
        ``tool_choice`` ``None``/"auto", possibly a plain answer. ``tool_choice``: "auto",
        "none", "any"/"required"/``True``, a tool name or ``{"type": "function", "function":
        {"name": ...}}``. Guided decoding guarantees the shape; raises
        ``NotImplementedError`` on engines without it. ``parallel_tool_calls`` and ``strict``
        are accepted as ``ChatOpenAI`` takes them: a reply makes at most one call, and its
        arguments always follow the schema."""
        if not self.supports_json_schema:
            raise NotImplementedError(
                f"engine {self._engine_name()!r} has no JSON-schema guided decoding, so "
                "bind_tools is not supported by this engine; use the 'vllm' engine (or "
                "install xgrammar for the 'torch' engine)")
        formatted = openai_tools(tools)
        tool_schema(formatted, tool_choice)  # a bad tool_choice fails here, not at the call
        return self.bind(tools=formatted, tool_choice=tool_choice, **kwargs)

    # -- structured output ----------------------------------------------------------------------
    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: StructuredMethod = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
        """Output constrained to ``schema`` (a Pydantic class, TypedDict or JSON schema) by the
        engine's guided decoding; parsed into the Pydantic class, or a dict. Unless
        ``show_schema`` is off, the model is also shown the schema (as vLLM's documentation
        recommends), in a system message after the conversation.

        Every ``method`` is served by guided decoding: ``json_schema`` with the schema,
        ``function_calling`` as ``ChatOpenAI`` serves it, a forced call of the schema as the
        one bound tool (so ``include_raw``'s message carries ``tool_calls``), ``json_mode``
        with the schema when one is given and any JSON object otherwise. Output always matches the
        schema, so ``strict`` is accepted and needs no extra work. Raises
        ``NotImplementedError`` if the engine has no guided decoding.
        """
        if kwargs:
            raise ValueError(f"unsupported arguments {sorted(kwargs)}")
        if method not in ("json_schema", "json_mode", "function_calling"):
            raise ValueError(
                f"unknown method {method!r}; expected 'json_schema', 'json_mode' or "
                "'function_calling'"
            )
        if not self.supports_json_schema:
            raise NotImplementedError(
                f"engine {self._engine_name()!r} has no JSON-schema guided decoding, so "
                "with_structured_output is not available; use the 'vllm' engine (or install "
                "xgrammar for the 'torch' engine)"
            )
        if schema is None:
            if method != "json_mode":
                raise ValueError(f"method {method!r} needs a schema")
            json_schema: dict[str, Any] = {"type": "object"}
        else:
            json_schema = convert_to_json_schema(schema)
        if method == "function_calling":
            return self._function_calling_output(schema, include_raw, strict)
        llm = self.bind(
            json_schema=json_schema,
            ls_structured_output_format={
                "kwargs": {"method": method, "strict": strict},
                "schema": schema if schema is not None else json_schema,
            },
        )
        parser: Runnable[Any, Any]
        if isinstance(schema, type) and is_basemodel_subclass(schema):
            parser = PydanticOutputParser(pydantic_object=schema)
        else:
            parser = JsonOutputParser()
        return _with_raw(llm, parser) if include_raw else llm | parser

    def _function_calling_output(self, schema: dict[str, Any] | type, include_raw: bool,
                                 strict: bool | None) -> Runnable[LanguageModelInput, Any]:
        """``with_structured_output(method="function_calling")`` as ``ChatOpenAI`` builds it:
        the schema bound as the one tool, its call forced, its arguments parsed."""
        name = convert_to_openai_tool(schema)["function"]["name"]
        llm = self.bind_tools([schema], tool_choice=name, ls_structured_output_format={
            "kwargs": {"method": "function_calling", "strict": strict}, "schema": schema})
        parser: Runnable[Any, Any]
        if isinstance(schema, type) and is_basemodel_subclass(schema):
            parser = PydanticToolsParser(tools=[schema], first_tool_only=True)
        else:
            parser = JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
        return _with_raw(llm, parser) if include_raw else llm | parser


def _with_raw(llm: Runnable[Any, Any], parser: Runnable[Any, Any]) -> Runnable[Any, Any]:
    """``{"raw", "parsed", "parsing_error"}``, as ``include_raw=True`` returns it."""
    parsed = RunnablePassthrough.assign(
        parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
    )
    unparsed = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | parsed.with_fallbacks(
        [unparsed], exception_key="parsing_error"
    )
