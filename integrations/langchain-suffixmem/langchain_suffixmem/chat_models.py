"""``SuffixMemChatModel``: a LangChain chat model on a suffixmem engine.

Translation only: LangChain messages become suffixmem messages, the run's config names the
session (the engine's cache namespace), and engine events become ``AIMessageChunk``s. The
rendering that keeps the prompt cache-stable turn after turn lives in ``suffixmem.client``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
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
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.messages.ai import InputTokenDetails, UsageMetadata
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableMap,
    RunnablePassthrough,
)
from langchain_core.utils.function_calling import convert_to_json_schema
from langchain_core.utils.pydantic import is_basemodel_subclass

from integrations.langchain._base import SessionConfigMixin, SuffixMemParams
from integrations.langchain.messages import to_suffixmem
from suffixmem import client
from suffixmem.engine.protocol import Result, TokenEvent

StructuredMethod = Literal["json_schema", "json_mode", "function_calling"]


def usage_metadata(result: Result) -> UsageMetadata:
    """LangChain usage of one reply; ``input_token_details.cache_read`` = cached tokens."""
    return UsageMetadata(
        input_tokens=result.prompt_tokens,
        output_tokens=result.output_tokens,
        total_tokens=result.prompt_tokens + result.output_tokens,
        input_token_details=InputTokenDetails(cache_read=result.cached_tokens),
    )


def response_metadata(result: Result, model_name: str) -> dict[str, Any]:
    """Model name, finish reason, session, and timings (seconds) of one reply."""
    return {
        "model_name": model_name,
        "finish_reason": result.finish_reason,
        "session_id": result.session_key,
        "time_to_first_token_s": result.ttft_s,
        "latency_s": result.latency_s,
    }


class SuffixMemChatModel(SessionConfigMixin, SuffixMemParams, BaseChatModel):
    """Chat model on a suffixmem engine: the model's chat template, real token streaming,
    per-session prefix caching, and cached tokens reported as ``cache_read``.

    ```python
    from integrations.langchain import SuffixMemChatModel

    chat = SuffixMemChatModel(max_tokens=64)
    chat.invoke("Hello", config={"configurable": {"session_id": "alice"}})
    ```

    The session comes from ``config["configurable"]["session_id"]`` (or ``thread_id``), else a
    ``session_id=`` call argument, else the instance's ``session_id``. Per-call keyword
    arguments: ``temperature``, ``top_p``, ``top_k``, ``max_tokens``, ``seed``, ``stop``.
    ``with_structured_output`` uses the engine's JSON-schema guided decoding; it raises
    ``NotImplementedError`` on engines without it (``supports_json_schema`` is false). There is
    no tool calling (``bind_tools`` is LangChain's default, which raises).
    """

    @property
    def _llm_type(self) -> str:
        return "suffixmem-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model, "engine": self._engine_name()}

    def _engine_name(self) -> str:
        return self.engine if isinstance(self.engine, str) else str(self.engine.name)

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "suffixmem"
        model = kwargs.get("model")
        params["ls_model_name"] = model if isinstance(model, str) else self.model
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    # -- generation -----------------------------------------------------------------------------
    def _chunk(self, event: TokenEvent | Result) -> ChatGenerationChunk:
        if isinstance(event, TokenEvent):
            return ChatGenerationChunk(message=AIMessageChunk(content=event.text))
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                usage_metadata=usage_metadata(event),
                response_metadata=response_metadata(event, self.model),
                chunk_position="last",
            ),
            generation_info={"finish_reason": event.finish_reason},
        )

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        session_id, sampling = self._call_args(stop, kwargs)
        prompt = to_suffixmem(messages)
        events = client.stream(
            self.get_engine(), session_id, prompt, sampling,
            timeout=self.timeout, show_schema=self.show_schema,
        )
        for event in events:
            if isinstance(event, TokenEvent) and not event.text:
                continue  # a token that completes no character yet
            chunk = self._chunk(event)
            if run_manager is not None and isinstance(event, TokenEvent):
                run_manager.on_llm_new_token(event.text, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        session_id, sampling = self._call_args(stop, kwargs)
        prompt = to_suffixmem(messages)
        engine = self.get_engine()
        async for event in client.astream(
            engine, session_id, prompt, sampling,
            timeout=self.timeout, show_schema=self.show_schema,
        ):
            if isinstance(event, TokenEvent) and not event.text:
                continue
            chunk = self._chunk(event)
            if run_manager is not None and isinstance(event, TokenEvent):
                await run_manager.on_llm_new_token(event.text, chunk=chunk)
            yield chunk

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return generate_from_stream(self._stream(messages, stop, run_manager, **kwargs))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return await agenerate_from_stream(self._astream(messages, stop, run_manager, **kwargs))

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

        Every ``method`` is served by guided decoding: ``json_schema`` and ``function_calling``
        with the schema (there is no tool calling to use instead), ``json_mode`` with the
        schema when one is given and any JSON object otherwise. Output always matches the
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
                "with_structured_output is not available; use the 'vllm' engine"
            )
        if schema is None:
            if method != "json_mode":
                raise ValueError(f"method {method!r} needs a schema")
            json_schema: dict[str, Any] = {"type": "object"}
        else:
            json_schema = convert_to_json_schema(schema)
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
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(
            parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
        )
        unparsed = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks(
            [unparsed], exception_key="parsing_error"
        )


