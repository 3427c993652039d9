"""LangChain's own ``ChatOpenAI`` (langchain-openai) pointed at ``suffixmem serve``, in a chain
(prompt | model | parser), streaming too, with the server keeping the session."""

from __future__ import annotations

import uuid

import pytest

from suffixmem.server.serving import namespace
from tests.server.conftest import KEY_A, Server

pytest.importorskip("langchain_openai")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_chat_openai_in_a_chain(server: Server) -> None:
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_openai import ChatOpenAI

    sid = f"lc-{uuid.uuid4().hex[:8]}"
    llm = ChatOpenAI(base_url=server.url + "/v1", api_key=KEY_A, model=server.model,
                     temperature=0, max_tokens=16, max_retries=0,
                     default_headers={"X-Session-ID": sid}, stream_usage=True)
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You answer in a few words."), ("human", "{question}")])
    chain = prompt | llm | StrOutputParser()
    first = chain.invoke({"question": "What colour is the sky?"})
    assert isinstance(first, str) and first
    # the message list of the second call is system + one human message: the server treats
    # it as the new message of the stored session
    pieces = list(chain.stream({"question": "And the grass?"}))
    assert len(pieces) > 1 and "".join(pieces)
    stored = server.manager.history(namespace(KEY_A) + sid)  # type: ignore[attr-defined]
    assert [m.role for m in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[1].content == first and stored[3].content == "".join(pieces)
    msg = llm.invoke("One more word?")
    usage = msg.usage_metadata
    assert usage is not None and usage["input_token_details"]["cache_read"] > 0


def test_chat_openai_bind_tools(server: Server) -> None:
    """``ChatOpenAI.bind_tools`` against ``suffixmem serve``: a standard ``AIMessage.tool_calls``
    (it was a 400, "tools are not supported")."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    llm = ChatOpenAI(base_url=server.url + "/v1", api_key=KEY_A, model=server.model,
                     temperature=0, max_tokens=40, max_retries=0)
    msg = llm.bind_tools([multiply], tool_choice="multiply").invoke("What is 6 times 7?")
    assert len(msg.tool_calls) == 1 and msg.tool_calls[0]["name"] == "multiply"
    assert set(msg.tool_calls[0]["args"]) == {"a", "b"}
