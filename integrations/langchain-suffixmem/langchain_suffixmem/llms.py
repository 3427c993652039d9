"""``SuffixMemLLM``: a LangChain text LLM (string in, string out) on suffixmem's
``ConversationManager``."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseLLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from langchain_suffixmem._base import (
    SessionConfigMixin,
    SuffixMemParams,
    awith_deadline,
    with_deadline,
)
from suffixmem.conversation.manager import TurnResult
from suffixmem.engine.async_stream import aiter_events
from suffixmem.engine.protocol import Message, Result, TokenEvent


def text_session_key(prompt: str) -> str:
    """The cache namespace of a raw completion without a session: derived from the prompt's
    start, so a prompt that grows by appending reuses its own cache and unrelated prompts do
    not share one."""
    return "anon-" + hashlib.sha256(prompt[:1024].encode("utf-8", "surrogatepass")).hexdigest()[:16]


def usage(event: Result | TurnResult) -> dict[str, Any]:
    """Token counts, cached prompt tokens, seconds to first token and in all, finish reason and
    session of one reply."""
    result = event.result if isinstance(event, TurnResult) else event
    return {
        "prompt_tokens": result.prompt_tokens,
        "cached_tokens": result.cached_tokens,
        "completion_tokens": result.output_tokens,  # LangChain's and OpenAI's name
        "total_tokens": result.prompt_tokens + result.output_tokens,
        "ttft_s": result.ttft_s,
        "latency_s": result.latency_s,
        "finish_reason": result.finish_reason,
        "session_id": event.session_id if isinstance(event, TurnResult) else result.session_key,
    }


class SuffixMemLLM(SessionConfigMixin, SuffixMemParams, BaseLLM):
    """Text completion on suffixmem, streaming token by token.

    With ``chat_template=True`` (the default) the prompt is one user message through the
    model's chat template (what an instruction-tuned model expects), sent to
    ``ConversationManager.stream_complete``: with a session (config or ``session_id``) the
    turn is stored like a chat model's, without one it is stateless. With
    ``chat_template=False`` the prompt is tokenized as is and the model continues it
    (``ConversationManager.stream_text``; nothing is stored, the session only names the cache).
    Each generation's ``generation_info`` holds the usage, including ``cached_tokens`` and
    ``ttft_s``.
    """

    chat_template: bool = True

    @property
    def _llm_type(self) -> str:
        return "suffixmem-llm"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {**self._cache_params(), "chat_template": self.chat_template}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "suffixmem"
        model = kwargs.get("model")
        params["ls_model_name"] = model if isinstance(model, str) else self.model
        return params

    def _events(self, prompt: str, stop: list[str] | None, kwargs: dict[str, Any]
                ) -> tuple[Any, str]:
        session_id, sampling = self._call_args(stop, kwargs)  # checked before any engine starts
        manager, model = self._call_manager(kwargs)
        if self.chat_template:
            sent = [Message("user", prompt)]
            return manager.stream_complete(session_id, sent, **sampling), model
        key = session_id or text_session_key(prompt)
        return manager.stream_text(key, prompt, **sampling), model

    def _aevents(self, prompt: str, stop: list[str] | None, kwargs: dict[str, Any]
                 ) -> tuple[Any, str]:
        session_id, sampling = self._call_args(stop, kwargs)  # checked before any engine starts
        manager, model = self._call_manager(kwargs)
        if self.chat_template:
            sent = [Message("user", prompt)]
            return manager.astream_complete(session_id, sent, **sampling), model
        # raw completion has no async twin in the manager: drive the sync stream off the loop
        key = session_id or text_session_key(prompt)
        return aiter_events(manager.stream_text(key, prompt, **sampling)), model

    @staticmethod
    def _chunk(event: Any, model: str) -> GenerationChunk:
        if isinstance(event, TokenEvent):
            return GenerationChunk(text=event.text)
        return GenerationChunk(text="", generation_info={**usage(event), "model_name": model})

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        timeout = self.call_timeout(kwargs)
        events, model = self._events(prompt, stop, kwargs)
        for event in with_deadline(events, timeout):
            if isinstance(event, TokenEvent) and not event.text:
                continue
            chunk = self._chunk(event, model)
            if run_manager is not None and isinstance(event, TokenEvent):
                run_manager.on_llm_new_token(event.text, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationChunk]:
        timeout = self.call_timeout(kwargs)
        events, model = self._aevents(prompt, stop, kwargs)
        async for event in awith_deadline(events, timeout):
            if isinstance(event, TokenEvent) and not event.text:
                continue
            chunk = self._chunk(event, model)
            if run_manager is not None and isinstance(event, TokenEvent):
                await run_manager.on_llm_new_token(event.text, chunk=chunk)
            yield chunk

    @staticmethod
    def _result(generations: list[GenerationChunk], model: str) -> LLMResult:
        infos = [g.generation_info or {} for g in generations]
        return LLMResult(
            generations=[[Generation(text=g.text, generation_info=g.generation_info)]
                         for g in generations],
            llm_output={
                "model_name": model,
                "token_usage": {
                    key: sum(int(i.get(key, 0)) for i in infos)
                    for key in ("prompt_tokens", "cached_tokens", "completion_tokens",
                                "total_tokens")
                },
            },
        )

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        generations = []
        for prompt in prompts:
            full = GenerationChunk(text="")
            for chunk in self._stream(prompt, stop, run_manager, **kwargs):
                full += chunk
            generations.append(full)
        return self._result(generations, kwargs.get("model") or self.model)

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        generations = []
        for prompt in prompts:
            full = GenerationChunk(text="")
            async for chunk in self._astream(prompt, stop, run_manager, **kwargs):
                full += chunk
            generations.append(full)
        return self._result(generations, kwargs.get("model") or self.model)
