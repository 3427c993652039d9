"""A LlamaIndex chat engine on suffixmem, its memory kept in suffixmem's store.

    .venv/bin/python examples/llama_index_chat.py [--session bob] [--max-tokens 64]

A ``SimpleChatEngine`` with a ``ChatMemoryBuffer`` over ``SuffixMemChatStore``, both on
suffixmem's ConversationManager (the LLM stores each turn once, with its generated token ids;
the chat store sees it is already there). Each answer streams token by token, and the cached
prompt tokens of each turn (from the response's ``raw["usage"]``, caught through LlamaIndex's
instrumentation) are printed after it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.llms.suffixmem import SuffixMemLLM
from llama_index.storage.chat_store.suffixmem import SuffixMemChatStore

QUESTIONS = (
    "What is a croissant?",
    "Which country made it famous?",
    "How many layers of butter does it have?",
)


class CacheReport(BaseEventHandler):
    """Prints the usage each finished chat call reports."""

    @classmethod
    def class_name(cls) -> str:
        return "CacheReport"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, LLMChatEndEvent) and event.response is not None:
            usage = (event.response.raw or {}).get("usage")
            if usage:
                print(
                    f"\n  [{usage['prompt_tokens']} prompt tokens, "
                    f"{usage['cached_tokens']} from cache, "
                    f"first token after {usage['ttft_s'] * 1000:.0f} ms]",
                    file=sys.stderr,
                )


def main() -> None:
    # vLLM logs to stdout by default; keep its lines out of the conversation
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--session", default="llama-index-example")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--database-url", default=None, help="default: suffixmem's own")
    parser.add_argument("questions", nargs="*", default=list(QUESTIONS))
    args = parser.parse_args()

    get_dispatcher().add_event_handler(CacheReport())
    # the LLM's session is the chat store key: the turn it stores is the one the memory holds
    llm = SuffixMemLLM(max_tokens=args.max_tokens, session_id=args.session,
                       database_url=args.database_url)
    print("starting the engine...", file=sys.stderr, flush=True)
    manager = llm.get_manager()  # else the first question waits for the engine
    memory = ChatMemoryBuffer.from_defaults(
        llm=llm,
        chat_store=SuffixMemChatStore(args.database_url, manager=manager),
        chat_store_key=args.session,
    )
    chat_engine = SimpleChatEngine.from_defaults(
        llm=llm, memory=memory,
        system_prompt="You are a helpful baker. Answer in two sentences at most.",
    )
    for question in args.questions:
        print(f"you> {question}\nbot> ", end="", flush=True)
        response = chat_engine.stream_chat(question)
        for token in response.response_gen:
            print(token, end="", flush=True)
        print()


if __name__ == "__main__":
    main()
