"""``SuffixMemLLM``: a LlamaIndex LLM on suffixmem's ``ConversationManager``.

Translation only: LlamaIndex messages become suffixmem messages, the manager's events become
``ChatResponse``/``CompletionResponse`` deltas, and each reply's usage (cached prompt tokens,
time to first token, topic verdict, temperature) rides in ``raw`` and ``additional_kwargs``.
The manager reconciles the sent history with the stored session, lays the prompt out for the
cache and stores the turn.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection, default_completion_to_prompt
from llama_index.llms.suffixmem.messages import STORED_KEY, to_suffixmem
from llama_index.llms.suffixmem.responses import (
    aresponses,
    chat_response,
    completion_response,
    responses,
    skip_none,
    text_session_key,
    tool_responder,
    usage,
)
from llama_index.llms.suffixmem.tools import specs, tool_selections

from suffixmem import runtime
from suffixmem.config import DEFAULT_MODEL
from suffixmem.conversation.manager import ConversationManager, ManagerConfig, TurnResult
from suffixmem.conversation.reconcile import readable
from suffixmem.conversation.stored_turns import STORED_TURNS
from suffixmem.conversation.validation import check_settings, one_line_settings
from suffixmem.engine import check_engine
from suffixmem.engine.async_stream import aiter_events
from suffixmem.engine.protocol import Message, Result, SamplingParams
from suffixmem.errors import InvalidRequestError
from suffixmem.tool_calls import ToolSpec, reply_schema, with_tools_prompt

_SAMPLING_KWARGS = frozenset(
    {"temperature", "top_p", "top_k", "max_tokens", "seed", "stop", "json_schema", "ignore_eos",
     "frequency_penalty", "presence_penalty"})


class SuffixMemLLM(FunctionCallingLLM):
    """LlamaIndex LLM on suffixmem: the model's chat template, real token streaming (sync and
    async), turns stored per session with topic jumps, semantic temperature and prefix caching.

    ```python
    from llama_index.core.chat_engine import SimpleChatEngine
    from llama_index.core.memory import ChatMemoryBuffer
    from llama_index.llms.suffixmem import SuffixMemLLM
    from llama_index.storage.chat_store.suffixmem import SuffixMemChatStore

    llm = SuffixMemLLM(session_id="alice", max_tokens=64)
    memory = ChatMemoryBuffer.from_defaults(
        chat_store=SuffixMemChatStore(), chat_store_key="alice")
    SimpleChatEngine.from_defaults(llm=llm, memory=memory).chat("Hello")
    ```

    ``engine`` is an engine name started on first use and shared process-wide, or an engine
    instance; calls go through the process-wide ``ConversationManager`` of that engine and
    ``database_url`` (``suffixmem.runtime.get_manager``). ``session_id`` (also per call) names
    the stored session: use the chat store key, so the turn the manager stores is the one the
    chat store holds. ``None`` (default) is stateless. Sampling fields left ``None`` take the
    manager's defaults (``temperature=None``: the session's semantic temperature).

    Every response's ``raw["usage"]`` and ``additional_kwargs`` hold the usage. Empty user,
    system and tool messages before the last one are left out of what the model reads
    (``suffixmem.conversation.reconcile.readable``: a chat engine stores an empty user message
    before it calls the LLM; it must not make every later turn fail). ``complete``
    sends the prompt as one user message through the chat template unless ``formatted=True``
    or a custom ``completion_to_prompt`` is set; then the text is completed as is
    (``ConversationManager.stream_text``, nothing stored).

    **Tools** (``FunctionCallingLLM``: ``chat_with_tools``, ``get_tool_calls_from_response``,
    agents, ``structured_predict``) on engines with JSON-schema guided decoding
    (``suffixmem.tool_calls``): the tools are described at the end of the system prompt, and
    the reply is constrained to a call whose arguments follow the tool's schema (or, unless
    ``tool_required``, a plain answer). Calls come back in
    ``message.additional_kwargs["tool_calls"]`` (``{"id", "name", "arguments"}``); streamed, a
    plain answer under tools arrives as it is generated, a call as one response once complete.
    Other engines raise
    ``NotImplementedError`` and ``metadata.is_function_calling_model`` is false.
    """

    engine: Any = Field(default="vllm", exclude=True, description="engine name or instance")
    model: str = Field(default=DEFAULT_MODEL, description="model name or path")
    engine_options: dict[str, Any] = Field(default_factory=dict)
    database_url: str | None = Field(default=None, description="default: suffixmem's own")
    manager_config: ManagerConfig | None = Field(
        default=None, exclude=True,
        description="the manager's settings (rag_reuse, layout, ...); equal configs share one")
    session_id: str | None = Field(default=None, description="the chat store key; None: stateless")
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    timeout: float | None = Field(default=None, description="seconds, checked between tokens")

    _manager: ConversationManager | None = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        check_settings(type(self).__name__, data, type(self))
        with one_line_settings(type(self).__name__):
            super().__init__(**data)
        # checked here, not in a pydantic validator, which would wrap the library's one-line
        # InvalidRequestError / ConfigError into a multi-line ValidationError
        self._check_engine()

    def _check_engine(self) -> None:
        # a remote engine's database_url option is the manager's database too (its pins)
        self.database_url, self.engine_options = runtime.database_of(self.database_url,
                                                                     self.engine_options)
        if isinstance(self.engine, str):  # fail early on a bad name or options
            check_engine(self.engine, self.engine_options, model=self.model)
        else:
            self.model = self.engine.model_name
        if self.timeout is not None and self.timeout <= 0:
            raise InvalidRequestError(f"timeout must be > 0 seconds, got {self.timeout}")
        SamplingParams(**self._call_args({})[1])  # the instance's values, checked now

    @classmethod
    def class_name(cls) -> str:
        return "SuffixMemLLM"

    def get_manager(self) -> ConversationManager:
        """The shared manager (its engine started on first call)."""
        if self._manager is None:
            if isinstance(self.engine, str):
                self._manager = runtime.get_manager(
                    self.engine, database_url=self.database_url, config=self.manager_config,
                    model=self.model, **self.engine_options)
            else:
                self._manager = runtime.get_manager(self.engine, database_url=self.database_url,
                                                    config=self.manager_config)
        return self._manager

    @property
    def metadata(self) -> LLMMetadata:
        # the live engine's window, or (not started yet) the one it will be started with
        if not isinstance(self.engine, str):
            window = int(self.engine.max_model_len)
        elif self._manager is not None:
            window = int(self._manager.engine.max_model_len)
        else:  # not started yet: the window it will be started with
            window = check_engine(self.engine, self.engine_options,
                                  model=self.model).max_model_len
        return LLMMetadata(
            context_window=window,
            num_output=self.max_tokens or ManagerConfig().max_tokens,
            is_chat_model=True,
            is_function_calling_model=runtime.supports_json_schema(self.engine),
            model_name=self.model,
            system_role=MessageRole.SYSTEM,
        )

    # -- translation ----------------------------------------------------------------------------
    def _call_args(self, kwargs: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        kwargs = dict(kwargs)
        # an explicit ``session_id=None`` is stateless for this call, not the instance's session
        session_id = kwargs.pop("session_id") if "session_id" in kwargs else self.session_id
        unknown = sorted(set(kwargs) - _SAMPLING_KWARGS)
        if unknown:
            raise InvalidRequestError(
                f"unsupported keyword argument(s) {unknown}; accepted: "
                f"{sorted(_SAMPLING_KWARGS | {'session_id'})}"
            )
        values: dict[str, Any] = {
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
            "max_tokens": self.max_tokens, "seed": self.seed,
            "frequency_penalty": self.frequency_penalty, "presence_penalty": self.presence_penalty,
            "stop": tuple(self.stop) if self.stop is not None else None,
        }
        values.update(kwargs)
        if isinstance(values.get("stop"), list):
            values["stop"] = tuple(values["stop"])
        # None means "the default": leave it out so the manager decides
        return session_id, {k: v for k, v in values.items() if v is not None}

    def _chat_events(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any],
                     asynchronous: bool) -> Any:
        kwargs = dict(kwargs)
        tools: list[ToolSpec] = kwargs.pop("tools", None) or []
        choice = kwargs.pop("tool_choice", None)
        session_id, sampling = self._call_args(kwargs)
        schema = reply_schema(tools, choice)
        if schema is not None:
            if not runtime.supports_json_schema(self.engine):
                raise NotImplementedError(
                    "tool calling is not supported by this engine (it has no JSON-schema "
                    "guided decoding); use the 'vllm' engine (or install xgrammar for the "
                    "'torch' engine)")
            sampling["json_schema"] = schema
        sent = with_tools_prompt(readable(to_suffixmem(messages)), tools)
        manager = self.get_manager()
        if asynchronous:
            return session_id, manager.astream_complete(session_id, sent, **sampling)
        return session_id, manager.stream_complete(session_id, sent, **sampling)

    def _text_events(self, prompt: str, formatted: bool, kwargs: dict[str, Any],
                     asynchronous: bool) -> Any:
        session_id, sampling = self._call_args(kwargs)
        manager = self.get_manager()
        if not formatted and self.completion_to_prompt is default_completion_to_prompt:
            sent = [Message("user", prompt)]
            if asynchronous:
                return session_id, manager.astream_complete(session_id, sent, **sampling)
            return session_id, manager.stream_complete(session_id, sent, **sampling)
        if not formatted:
            prompt = self.completion_to_prompt(prompt)
        events = manager.stream_text(session_id or text_session_key(prompt), prompt, **sampling)
        return None, (aiter_events(events) if asynchronous else events)

    def _final(self, event: Result | TurnResult, session_id: str | None) -> dict[str, Any]:
        u = usage(event, self.model)
        if isinstance(event, TurnResult) and session_id is not None and (
                event.history != "stateless"):  # one message sent alone stores nothing
            # where the reply now sits in the session, so our chat store does not store it twice
            manager = self.get_manager()
            count = manager.get_session(session_id).message_count
            u[STORED_KEY] = {"session_id": session_id, "index": count - 1}
            # for chat engines that put a fresh copy of the reply, without the marker
            STORED_TURNS.note(manager, session_id, count - 1, event.text)
        return u

    # -- streams (undecorated, so a call emits one LlamaIndex event, not two) ------------------
    def _gen(self, session_id: str | None, events: Iterator[Any], respond: Any) -> Iterator[Any]:
        return responses(events, respond, lambda e: self._final(e, session_id), self.timeout)

    def _agen(self, session_id: str | None, events: AsyncIterator[Any], respond: Any
              ) -> AsyncIterator[Any]:
        return aresponses(events, respond, lambda e: self._final(e, session_id), self.timeout)

    def _chat_stream(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> Any:
        session_id, events = self._chat_events(messages, kwargs, False)  # bad input raises here
        if kwargs.get("tools"):
            return (r for r in self._gen(session_id, events, tool_responder()) if r is not None)
        return self._gen(session_id, events, chat_response)

    def _achat_stream(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> Any:
        session_id, events = self._chat_events(messages, kwargs, True)
        if kwargs.get("tools"):
            return skip_none(self._agen(session_id, events, tool_responder()))
        return self._agen(session_id, events, chat_response)

    # -- FunctionCallingLLM ---------------------------------------------------------------------
    def _prepare_chat_with_tools(
        self,
        tools: Sequence[Any],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Chat arguments: the messages, the tools as specs, and ``tool_choice`` ("required"
        when ``tool_required``, else "auto"). One call per reply (no parallel calls)."""
        messages = list(chat_history or [])
        if isinstance(user_msg, str):
            user_msg = ChatMessage(role=MessageRole.USER, content=user_msg)
        if user_msg is not None:
            messages.append(user_msg)
        return {"messages": messages, "tools": specs(tools),
                "tool_choice": "required" if tool_required else "auto", **kwargs}

    def get_tool_calls_from_response(self, response: ChatResponse,
                                     error_on_no_tool_call: bool = True, **kwargs: Any
                                     ) -> list[ToolSelection]:
        return tool_selections(response, error_on_no_tool_call)

    def _complete_stream(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> Any:
        session_id, events = self._text_events(prompt, formatted, kwargs, False)
        return self._gen(session_id, events, completion_response)

    def _acomplete_stream(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> Any:
        session_id, events = self._text_events(prompt, formatted, kwargs, True)
        return self._agen(session_id, events, completion_response)

    # -- the LlamaIndex API ---------------------------------------------------------------------
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        (last,) = deque(self._chat_stream(messages, kwargs), maxlen=1)
        return ChatResponse(message=last.message, raw=last.raw,
                            additional_kwargs=last.additional_kwargs)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._chat_stream(messages, kwargs)  # type: ignore[no-any-return]

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        last = None
        async for last in self._achat_stream(messages, kwargs):  # noqa: B007
            pass
        assert last is not None
        return ChatResponse(message=last.message, raw=last.raw,
                            additional_kwargs=last.additional_kwargs)

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        return self._achat_stream(messages, kwargs)  # type: ignore[no-any-return]

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        (last,) = deque(self._complete_stream(prompt, formatted, kwargs), maxlen=1)
        return CompletionResponse(text=last.text, raw=last.raw,
                                  additional_kwargs=last.additional_kwargs)

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        return self._complete_stream(prompt, formatted, kwargs)  # type: ignore[no-any-return]

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        last = None
        async for last in self._acomplete_stream(prompt, formatted, kwargs):  # noqa: B007
            pass
        assert last is not None
        return CompletionResponse(text=last.text, raw=last.raw,
                                  additional_kwargs=last.additional_kwargs)

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        return self._acomplete_stream(prompt, formatted, kwargs)  # type: ignore[no-any-return]

