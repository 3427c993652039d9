"""``SuffixMemLLM``: a LlamaIndex LLM on a suffixmem engine.

Translation only: LlamaIndex messages become suffixmem messages, engine events become
``ChatResponse``/``CompletionResponse`` deltas, and each reply's usage (cached prompt tokens,
time to first token) rides in ``raw`` and ``additional_kwargs``. Cache-stable rendering of the
history lives in ``suffixmem.client``.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterator, Sequence
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
from llama_index.core.bridge.pydantic import Field, PrivateAttr, model_validator
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.llm import LLM, default_completion_to_prompt

from integrations.llama_index.messages import to_suffixmem
from suffixmem import client
from suffixmem.config import DEFAULT_MODEL, EngineConfig
from suffixmem.engine.protocol import Engine, Message, Result, SamplingParams, TokenEvent

_SAMPLING_KWARGS = frozenset({"temperature", "top_p", "top_k", "max_tokens", "seed", "stop"})


def _new_session_id() -> str:
    return f"li-{uuid.uuid4().hex[:16]}"


def usage(result: Result, model_name: str) -> dict[str, Any]:
    """The usage LlamaIndex reads (``prompt_tokens``, ``completion_tokens``, ``total_tokens``)
    plus ``cached_tokens``, ``ttft_s``/``latency_s`` (seconds), finish reason and session."""
    u = client.usage(result)
    return {
        "prompt_tokens": u["prompt_tokens"],
        "completion_tokens": u["output_tokens"],
        "total_tokens": u["total_tokens"],
        "cached_tokens": u["cached_tokens"],
        "ttft_s": u["ttft_s"],
        "latency_s": u["latency_s"],
        "finish_reason": u["finish_reason"],
        "session_id": u["session_id"],
        "model_name": model_name,
    }


class SuffixMemLLM(LLM):
    """LlamaIndex LLM on a suffixmem engine: the model's chat template, real token streaming
    (sync and async), per-session prefix caching.

    ```python
    from llama_index.core.chat_engine import SimpleChatEngine
    from integrations.llama_index import SuffixMemLLM

    engine = SimpleChatEngine.from_defaults(llm=SuffixMemLLM(max_tokens=64))
    engine.chat("Hello")
    ```

    ``engine`` is an engine name started on first use and shared process-wide
    (``suffixmem.client.get_engine``), or an engine instance. ``session_id`` (the cache
    namespace) may also be given per call. Every response's ``raw["usage"]`` and
    ``additional_kwargs`` hold the usage, ``cached_tokens`` included. ``complete`` sends the
    prompt as one user message through the chat template unless ``formatted=True`` or a custom
    ``completion_to_prompt`` is set; then the prompt is tokenized as is.
    """

    engine: Any = Field(default="vllm", exclude=True, description="engine name or instance")
    model: str = Field(default=DEFAULT_MODEL, description="model name or path")
    engine_options: dict[str, Any] = Field(default_factory=dict)
    session_id: str = Field(default_factory=_new_session_id)
    temperature: float = 0.0
    max_tokens: int = 256
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    timeout: float | None = Field(default=None, description="seconds, checked between tokens")

    _engine: Engine | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_engine(self) -> SuffixMemLLM:
        if isinstance(self.engine, str):
            EngineConfig(model=self.model, **self.engine_options)  # fail early on bad options
            client.engine_supports_json_schema(self.engine)  # unknown names raise here
        else:
            self._engine = self.engine
            self.model = self.engine.model_name
        self._sampling({})
        return self

    @classmethod
    def class_name(cls) -> str:
        return "SuffixMemLLM"

    def get_engine(self) -> Engine:
        """The engine (started on first call, shared with every instance of equal config)."""
        if self._engine is None:
            self._engine = client.get_engine(self.engine, model=self.model, **self.engine_options)
        return self._engine

    @property
    def metadata(self) -> LLMMetadata:
        # the live engine's window, or (not started yet) the one it will be started with
        window = (
            self._engine.max_model_len if self._engine is not None
            else EngineConfig(model=self.model, **self.engine_options).max_model_len
        )
        return LLMMetadata(
            context_window=window,
            num_output=self.max_tokens,
            is_chat_model=True,
            is_function_calling_model=False,
            model_name=self.model,
            system_role=MessageRole.SYSTEM,
        )

    # -- translation ----------------------------------------------------------------------------
    def _sampling(self, kwargs: dict[str, Any]) -> tuple[str, SamplingParams]:
        kwargs = dict(kwargs)
        session_id = kwargs.pop("session_id", None) or self.session_id
        unknown = sorted(set(kwargs) - _SAMPLING_KWARGS)
        if unknown:
            raise ValueError(
                f"unsupported keyword argument(s) {unknown}; accepted: "
                f"{sorted(_SAMPLING_KWARGS | {'session_id'})}"
            )
        values: dict[str, Any] = {
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
            "max_tokens": self.max_tokens, "seed": self.seed, "stop": self.stop,
        }
        values.update(kwargs)
        return str(session_id), client.sampling_params(**values)

    def _prompt(self, prompt: str, formatted: bool) -> list[Message] | str:
        if formatted:
            return prompt
        if self.completion_to_prompt is not default_completion_to_prompt:
            return self.completion_to_prompt(prompt)
        return [Message("user", prompt)]

    def _events(self, prompt: Sequence[Message] | str, kwargs: dict[str, Any]) -> Iterator[Any]:
        session_id, sampling = self._sampling(kwargs)
        return client.stream(self.get_engine(), session_id, prompt, sampling, timeout=self.timeout)

    def _aevents(self, prompt: Sequence[Message] | str, kwargs: dict[str, Any]) -> Any:
        session_id, sampling = self._sampling(kwargs)
        return client.astream(
            self.get_engine(), session_id, prompt, sampling, timeout=self.timeout
        )

    def _chat_response(self, text: str, delta: str, result: Result | None) -> ChatResponse:
        message = ChatMessage(role=MessageRole.ASSISTANT, content=text)
        if result is None:
            return ChatResponse(message=message, delta=delta)
        u = usage(result, self.model)
        return ChatResponse(message=message, delta=delta, raw={"usage": u}, additional_kwargs=u)

    def _completion_response(
        self, text: str, delta: str, result: Result | None
    ) -> CompletionResponse:
        if result is None:
            return CompletionResponse(text=text, delta=delta)
        u = usage(result, self.model)
        return CompletionResponse(text=text, delta=delta, raw={"usage": u}, additional_kwargs=u)

    # -- streams (undecorated, so a call emits one LlamaIndex event, not two) ------------------
    def _chat_stream(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> Any:
        events = self._events(to_suffixmem(messages), kwargs)  # bad input raises here

        def gen() -> ChatResponseGen:
            text = ""
            for event in events:
                if isinstance(event, TokenEvent):
                    if event.text:
                        text += event.text
                        yield self._chat_response(text, event.text, None)
                else:
                    yield self._chat_response(text, "", event)

        return gen()

    def _achat_stream(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> Any:
        events = self._aevents(to_suffixmem(messages), kwargs)

        async def gen() -> ChatResponseAsyncGen:
            text = ""
            async for event in events:
                if isinstance(event, TokenEvent):
                    if event.text:
                        text += event.text
                        yield self._chat_response(text, event.text, None)
                else:
                    yield self._chat_response(text, "", event)

        return gen()

    def _complete_stream(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> Any:
        events = self._events(self._prompt(prompt, formatted), kwargs)

        def gen() -> CompletionResponseGen:
            text = ""
            for event in events:
                if isinstance(event, TokenEvent):
                    if event.text:
                        text += event.text
                        yield self._completion_response(text, event.text, None)
                else:
                    yield self._completion_response(text, "", event)

        return gen()

    def _acomplete_stream(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> Any:
        events = self._aevents(self._prompt(prompt, formatted), kwargs)

        async def gen() -> CompletionResponseAsyncGen:
            text = ""
            async for event in events:
                if isinstance(event, TokenEvent):
                    if event.text:
                        text += event.text
                        yield self._completion_response(text, event.text, None)
                else:
                    yield self._completion_response(text, "", event)

        return gen()

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
