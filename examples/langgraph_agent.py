"""A LangGraph ReAct-style agent with a calculator tool, checkpointed in suffixmem's store.

    .venv/bin/python examples/langgraph_agent.py [--thread math] [--engine vllm|torch]
        [--database-url URL] [QUESTION]

The graph: the model (tools bound) calls the calculator, the tool node runs it, the model reads
the result and answers. Guided decoding makes every call well formed, even from the 135M default
model, on either engine (vLLM's structured outputs, or xgrammar in the torch engine); so that
such a small model does not loop, this agent allows ``MAX_TOOL_CALLS`` calls
(the first is required) and then asks for the answer. The thread id is the suffixmem session:
the checkpoints (``SuffixMemSaver``) and the model's turns share it, so the model's second call
reads its first step from the KV cache (printed: prompt tokens, of which cached). Run it again
with the same ``--thread`` and the agent continues the conversation from its checkpoint.
"""

from __future__ import annotations

import argparse
import ast
import operator
import os
import sys
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_suffixmem import SuffixMemChatModel, SuffixMemSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

from suffixmem.config import default_database_url

MAX_TOOL_CALLS = 1
SYSTEM = "You are a careful assistant. Use the calculator for arithmetic, then answer briefly."

_OPS: dict[type, Any] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Pow: operator.pow, ast.Mod: operator.mod,
    ast.USub: operator.neg, ast.UAdd: operator.pos,
}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))  # type: ignore[no-any-return]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))  # type: ignore[no-any-return]
    raise ValueError("only numbers and + - * / ** % are allowed")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '12 * (3 + 4)'."""
    try:
        value = _eval(ast.parse(expression, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as e:
        return f"error: {e}"
    return str(int(value) if float(value).is_integer() else value)


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_agent(model: SuffixMemChatModel, saver: SuffixMemSaver) -> Any:
    """The compiled graph: agent -> (tools -> agent)* -> end, checkpointed by ``saver``."""

    def agent(state: State) -> dict[str, Any]:
        messages = state["messages"]
        # tool calls of this question (after its last human message)
        last_human = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        used = sum(isinstance(m, ToolMessage) for m in messages[last_human:])
        choice = "required" if used == 0 else ("auto" if used < MAX_TOOL_CALLS else "none")
        llm = model.bind_tools([calculator], tool_choice=choice)
        return {"messages": [llm.invoke([("system", SYSTEM), *messages])]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if getattr(last, "tool_calls", None) else END

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([calculator]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


def main() -> None:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--thread", default="langgraph-example")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--engine", choices=["vllm", "torch"], default="vllm")
    parser.add_argument("--database-url", default=None, help="default: suffixmem's own")
    parser.add_argument("question", nargs="?", default="What is 23 * 19?")
    args = parser.parse_args()

    # one database for the model's turns and the checkpoints: the thread is the session
    database_url = args.database_url or default_database_url()
    model = SuffixMemChatModel(engine=args.engine, max_tokens=args.max_tokens, temperature=0.0,
                               database_url=database_url)
    print("starting the engine...", file=sys.stderr, flush=True)
    model.get_manager()
    with SuffixMemSaver.from_conn_string(database_url) as saver:
        agent = build_agent(model, saver)
        config: Any = {"configurable": {"thread_id": args.thread}}
        result = agent.invoke({"messages": [HumanMessage(args.question)]}, config)
        for m in result["messages"]:
            usage = getattr(m, "usage_metadata", None)
            note = (f"  [{usage['input_tokens']} prompt tokens, "
                    f"{usage['input_token_details']['cache_read']} from cache]" if usage else "")
            calls = getattr(m, "tool_calls", None)
            body = f"calls {calls[0]['name']}({calls[0]['args']})" if calls else m.content
            print(f"{m.type}> {body}{note}")


if __name__ == "__main__":
    main()
