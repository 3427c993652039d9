"""``SuffixMemLLM`` as a LlamaIndex ``FunctionCallingLLM`` on the real model, on both engines
(vLLM's guided decoding, xgrammar on the torch engine): tool calls with ids whose arguments
parse against the tool's schema, tool results back into the session (a cache hit on the call),
and ``structured_predict``."""


from typing import Any, Literal

import jsonschema
import pytest
from adapter_setup import TORCH_PARAMS
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.llms.suffixmem import SuffixMemLLM
from pydantic import BaseModel

from suffixmem.errors import InvalidRequestError

pytestmark = [pytest.mark.slow]


def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers."""
    return a * b


def convert(amount: float, unit: Literal["g", "kg", "lb"]) -> str:
    """Convert a weight of flour to grams."""
    factor = {"g": 1.0, "kg": 1000.0, "lb": 453.6}[unit]
    return f"{amount * factor:g} g"


TOOLS = [FunctionTool.from_defaults(multiply), FunctionTool.from_defaults(convert)]
SCHEMAS = {t.metadata.get_name(): t.metadata.get_parameters_dict() for t in TOOLS}


class Loaf(BaseModel):
    name: str
    flour_grams: int


def _llm(params: dict[str, Any], database_url: str, **kwargs: Any) -> SuffixMemLLM:
    return SuffixMemLLM(**params, database_url=database_url,
                        **{"max_tokens": 64, "temperature": 0.0, **kwargs})


def test_tool_call_then_result_in_the_session(engine_params: dict[str, Any],
                                              database_url: str) -> None:
    llm = _llm(engine_params, database_url, session_id="tools-1")
    assert llm.metadata.is_function_calling_model
    response = llm.chat_with_tools(TOOLS, "What is 12 times 7?", tool_required=True)
    (call,) = llm.get_tool_calls_from_response(response)
    assert call.tool_id.startswith("call_") and call.tool_name in SCHEMAS
    assert response.raw["usage"]["finish_reason"] == "tool_calls"  # OpenAI's, as the server
    jsonschema.validate(call.tool_kwargs, SCHEMAS[call.tool_name])
    first = response.raw["usage"]
    # the call resent without its result has nothing to answer; OpenAI refuses it too
    with pytest.raises(InvalidRequestError, match="messages\\[1\\] is a tool call without its"):
        llm.chat_with_tools(TOOLS, chat_history=[
            ChatMessage(role=MessageRole.USER, content="What is 12 times 7?"), response.message])

    tool = {t.metadata.get_name(): t for t in TOOLS}[call.tool_name]
    result = ChatMessage(role=MessageRole.TOOL, content=str(tool(**call.tool_kwargs)),
                         additional_kwargs={"tool_call_id": call.tool_id,
                                            "name": call.tool_name})
    history = [ChatMessage(role=MessageRole.USER, content="What is 12 times 7?"),
               response.message, result]
    final = llm.chat_with_tools(TOOLS, chat_history=history)
    second = final.raw["usage"]
    assert second["history"] == "appended"  # the stored call matched what was resent
    block = 32  # vLLM's block size on CPU; the torch engine's 16 divides it
    assert second["cached_tokens"] >= (first["prompt_tokens"] + first["completion_tokens"]) \
        // block * block > 0
    roles = [m.role for m in llm.get_manager().history("tools-1")]
    assert roles == ["user", "assistant", "tool", "assistant"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_tool_calls_always_parse_against_the_schema(
    engine_params: dict[str, Any], database_url: str, seed: int
) -> None:
    """Hot sampling cannot break the shape: guided decoding keeps every call valid."""
    llm = _llm(engine_params, database_url, temperature=1.2, seed=seed, max_tokens=96)
    response = llm.chat_with_tools(TOOLS, "Convert 2 lb of flour, or multiply 3 by 4.",
                                   tool_required=True)
    if response.raw["usage"]["finish_reason"] == "length":
        pytest.skip("cut off by max_tokens (no call to check)")
    (call,) = llm.get_tool_calls_from_response(response)
    jsonschema.validate(call.tool_kwargs, SCHEMAS[call.tool_name])


def test_a_plain_answer_under_tools_streams(engine_params: dict[str, Any],
                                            database_url: str) -> None:
    """A plain answer under tools (``{"response": ...}``) streams its text in pieces as it is
    generated (it came as one response at the end); the deltas join to the last message."""
    llm = _llm(engine_params, database_url, max_tokens=24)
    responses = list(llm.stream_chat_with_tools(TOOLS, "Greet the team warmly.",
                                                tool_choice="none"))
    deltas = [r.delta for r in responses if r.delta]
    last = responses[-1]
    assert len(deltas) >= 4 and "".join(deltas) == last.message.content
    assert not str(last.message.content).lstrip().startswith("{")  # the text, not its JSON
    assert not llm.get_tool_calls_from_response(last, error_on_no_tool_call=False)
    assert last.raw["usage"]["completion_tokens"] > 0


def test_structured_predict(engine_params: dict[str, Any], database_url: str) -> None:
    llm = _llm(engine_params, database_url, max_tokens=48)
    loaf = llm.structured_predict(
        Loaf, PromptTemplate("Describe a {kind} loaf and its flour in grams."), kind="rye")
    assert isinstance(loaf, Loaf)
    # a call cut off by max_tokens says so (it said "the response has no tool call")
    short = _llm(engine_params, database_url, max_tokens=6)
    with pytest.raises(InvalidRequestError, match="cut off by max_tokens"):
        short.structured_predict(
            Loaf, PromptTemplate("Describe a {kind} loaf and its flour in grams."), kind="rye")


def test_without_guided_decoding_tool_calls_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine without guided decoding (the torch engine where xgrammar is not installed):
    honest flags without starting it, and a one-line refusal."""
    from suffixmem.engine.torch.engine import TorchEngine

    assert SuffixMemLLM(**TORCH_PARAMS).metadata.is_function_calling_model is True
    monkeypatch.setattr(TorchEngine, "supports_json_schema", False)
    llm = SuffixMemLLM(**TORCH_PARAMS)
    assert llm.metadata.is_function_calling_model is False
    with pytest.raises(NotImplementedError, match="not supported by this engine"):
        llm.chat_with_tools(TOOLS, "What is 2 times 3?", tool_required=True)


def test_an_agent_out_of_iterations_generates_its_last_answer(engine_params: dict[str, Any],
                                                            database_url: str) -> None:
    """``FunctionAgent(early_stopping_method="generate")``, LlamaIndex's own advice once an
    agent runs out of iterations, appends a system message after the conversation: it was
    refused ("only the first message may be one"; found by an outside audit), and is read
    where it stands, as OpenAI reads it."""
    import asyncio

    from llama_index.core.agent.workflow import FunctionAgent

    agent = FunctionAgent(tools=TOOLS, llm=_llm(engine_params, database_url, max_tokens=48),
                          system_prompt="Use the tools.", early_stopping_method="generate")

    async def run() -> Any:  # the workflow starts its tasks on the running loop
        return await agent.run(user_msg="What is 12 times 7?", max_iterations=1)

    out = asyncio.run(run())
    assert str(out.response.content).strip()
