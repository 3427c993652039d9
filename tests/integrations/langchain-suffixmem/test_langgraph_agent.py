"""The LangGraph example agent (examples/langgraph_agent.py) on the real model, on both engines:
a well-formed calculator call with an id, its result in the thread, the second model call
reading the first step from cache, and the thread's checkpoints in suffixmem's store."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_suffixmem import SuffixMemChatModel, SuffixMemSaver

from suffixmem.errors import UnknownSessionError

pytestmark = [pytest.mark.slow]

BLOCK = 32  # vLLM's KV block on CPU (the torch engine's 16 divides it): whole blocks hit


def _example() -> ModuleType:
    path = Path(__file__).parents[3] / "examples" / "langgraph_agent.py"
    spec = importlib.util.spec_from_file_location("langgraph_agent_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # LangGraph resolves the state's annotations through it
    spec.loader.exec_module(module)
    return module


def test_agent_calls_the_calculator_and_reads_its_first_step_from_cache(
    engine_params: dict[str, Any], database_url: str
) -> None:
    ex = _example()
    model = SuffixMemChatModel(**engine_params, max_tokens=96, temperature=0.0,
                               database_url=database_url)
    with SuffixMemSaver.from_conn_string(database_url) as saver:
        agent = ex.build_agent(model, saver)
        config: Any = {"configurable": {"thread_id": "agent-1"}}
        out = agent.invoke({"messages": [HumanMessage("What is 23 * 19?")]}, config)
        msgs = out["messages"]
        assert [type(m) for m in msgs] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
        call = msgs[1].tool_calls[0]
        assert call["name"] == "calculator" and call["id"].startswith("call_")
        jsonschema.validate(call["args"], ex.calculator.args_schema.model_json_schema())
        # OpenAI's finish reason for a call, as ChatOpenAI and our server report it
        assert msgs[1].response_metadata["finish_reason"] == "tool_calls"
        assert msgs[3].response_metadata["finish_reason"] in ("stop", "length")
        assert msgs[2].tool_call_id == call["id"]
        assert msgs[2].content == ex.calculator.invoke(call["args"])
        assert isinstance(msgs[3].content, str) and not msgs[3].tool_calls
        # tool_choice "none": an answer in text, not the JSON the system prompt describes
        assert msgs[3].content and not msgs[3].content.lstrip().startswith("{")

        first, second = msgs[1].usage_metadata, msgs[3].usage_metadata
        assert first is not None and second is not None
        step = first["input_tokens"] + first["output_tokens"]
        # the second call's prompt starts with the first call's prompt and reply (stored ids)
        assert second["input_token_details"]["cache_read"] >= step // BLOCK * BLOCK > 0
        assert second["input_token_details"]["cache_read"] > \
            first["input_token_details"]["cache_read"]

        # the thread is the session: the model's turns are stored under its id
        history = model.get_manager().history("agent-1")
        assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
        assert json.loads(history[1].content)["name"] == "calculator"

        # and checkpointed: the state comes back from the saver
        state = agent.get_state(config)
        assert [m.id for m in state.values["messages"]] == [m.id for m in msgs]
        assert saver.get_tuple(config) is not None

        # deleting the thread forgets it: its checkpoints and its session (the session kept
        # the conversation, and the thread's next first turn went unstored), so the thread
        # starts over as new
        saver.delete_thread("agent-1")
        assert saver.get_tuple(config) is None
        with pytest.raises(UnknownSessionError):
            model.get_manager().get_session("agent-1")
        again = agent.invoke({"messages": [HumanMessage("What is 2 * 3?")]}, config)
        assert again["messages"][1].response_metadata["history"] == "new"
        assert model.get_manager().history("agent-1")[0].content == "What is 2 * 3?"


def test_prebuilt_agent_with_a_structured_response(engine_params: dict[str, Any],
                                                   database_url: str) -> None:
    """``create_react_agent(..., response_format=Schema)`` ends by asking for the structured
    response over the finished conversation, which ends with the agent's own answer: that
    list was refused ("nothing to answer"; found by an outside audit). It is answered after
    the last reply, as OpenAI answers it, and stores nothing: the thread's session keeps the
    agent's turns only."""
    from langgraph.prebuilt import create_react_agent
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        sunny: bool

    model = SuffixMemChatModel(**engine_params, max_tokens=64, temperature=0.0,
                               database_url=database_url)
    agent = create_react_agent(model, [], response_format=Weather)
    config: Any = {"configurable": {"thread_id": "agent-structured"}}
    out = agent.invoke({"messages": [HumanMessage("It is sunny in Paris today.")]}, config)
    assert isinstance(out["structured_response"], Weather)
    roles = [m.role for m in model.get_manager().history("agent-structured")]
    assert roles == ["user", "assistant"]  # the structured step stored nothing
