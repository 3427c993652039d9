"""OpenAI wire format: the pydantic models of what ``suffixmem serve`` reads and writes.

They mirror OpenAI's chat-completions API (as vLLM's ``entrypoints/openai/protocol.py`` does),
limited to what suffixmem implements. Unknown request fields are ignored, as OpenAI clients send
optional fields freely; fields we know but cannot honour (``n > 1``, the legacy
``functions``, ``logprobs``,
non-zero penalties, a ``logit_bias``) are rejected by the serving class with a 400 naming the
field. Scalars are strict, as OpenAI's API is: ``"temperature": "0.5"`` or ``true`` is a 400,
not a number (an integer is a number: ``"temperature": 1``). Responses may carry one extra object,
``suffixmem`` (session id, TTFT, temperature, how the history was reconciled), which OpenAI
clients ignore and the web page reads.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ChatMessage(_Lenient):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls in a resent history
    tool_call_id: str | None = None


class StreamOptions(_Lenient):
    include_usage: StrictBool = False


class JsonSchemaFormat(_Lenient):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class ResponseFormat(_Lenient):
    type: Literal["text", "json_schema", "json_object"] = "text"
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(_Lenient):
    """``POST /v1/chat/completions``. ``prompt_cache_key`` names the session when no
    ``X-Session-ID`` header does (``user``, OpenAI's end-user id, names none); ``top_k`` and
    ``ignore_eos`` are vLLM's extensions. ``logprobs``, ``top_logprobs``,
    ``logit_bias``, ``modalities``, ``audio`` and ``prediction`` are read only to refuse what
    the engines cannot do (``ChatService``), never silently dropped; fields OpenAI does not
    define are ignored, as vLLM's server ignores them."""

    model: StrictStr | None = None
    messages: list[ChatMessage]
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    top_k: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    prompt_cache_key: StrictStr | None = None
    user: StrictStr | None = None
    ignore_eos: StrictBool | None = None
    response_format: ResponseFormat | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None
    frequency_penalty: StrictFloat | None = None
    presence_penalty: StrictFloat | None = None
    logit_bias: dict[str, Any] | None = None
    modalities: list[StrictStr] | None = None
    audio: Any = None
    prediction: Any = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TurnInfo(BaseModel):
    """suffixmem's per-turn figures (an extension field OpenAI clients ignore)."""

    session_id: str | None
    history: str
    ttft_s: float
    latency_s: float
    temperature: float
    topic_jump: bool


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[Choice]
    usage: Usage
    suffixmem: TurnInfo | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    suffixmem: TurnInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "suffixmem"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
