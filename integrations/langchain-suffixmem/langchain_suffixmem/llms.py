"""``SuffixMemLLM``: a LangChain text LLM (string in, string out) on a suffixmem engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseLLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from integrations.langchain._base import SessionConfigMixin, SuffixMemParams
from suffixmem import client
from suffixmem.engine.protocol import Message, Result, TokenEvent


class SuffixMemLLM(SessionConfigMixin, SuffixMemParams, BaseLLM):
    """Text completion on a suffixmem engine, streaming token by token.

    With ``chat_template=True`` (the default) the prompt is sent as one user message through
    the model's chat template, which is what an instruction-tuned model expects; with
    ``chat_template=False`` it is tokenized as is and the model continues it. Each generation's
    ``generation_info`` holds the usage (``suffixmem.client.usage``), including
    ``cached_tokens`` and ``ttft_s``. Sessions work as in ``SuffixMemChatModel``.
    """

    chat_template: bool = True

    @property
    def _llm_type(self) -> str:
        return "suffixmem-llm"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model, "chat_template": self.chat_template}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "suffixmem"
        params["ls_model_name"] = self.model
        return params

    def _prompt(self, prompt: str) -> list[Message] | str:
        return [Message("user", prompt)] if self.chat_template else prompt

    def _chunk(self, event: TokenEvent | Result) -> GenerationChunk:
        if isinstance(event, TokenEvent):
            return GenerationChunk(text=event.text)
        return GenerationChunk(
            text="", generation_info={**client.usage(event), "model_name": self.model}
        )

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        session_id, sampling = self._call_args(stop, kwargs)
        for event in client.stream(
            self.get_engine(), session_id, self._prompt(prompt), sampling, timeout=self.timeout
        ):
            if isinstance(event, TokenEvent) and not event.text:
                continue
            chunk = self._chunk(event)
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
        session_id, sampling = self._call_args(stop, kwargs)
        async for event in client.astream(
            self.get_engine(), session_id, self._prompt(prompt), sampling, timeout=self.timeout
        ):
            if isinstance(event, TokenEvent) and not event.text:
                continue
            chunk = self._chunk(event)
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
                    for key in ("prompt_tokens", "cached_tokens", "output_tokens", "total_tokens")
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
        return self._result(generations, self.model)

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
        return self._result(generations, self.model)
