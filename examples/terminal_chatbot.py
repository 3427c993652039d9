"""A terminal chatbot: reads lines from stdin, streams each reply, keeps the session.

    .venv/bin/python examples/terminal_chatbot.py [--session carol] [--max-tokens 128]

Built on suffixmem's ``ConversationManager`` (no framework): the session lives in suffixmem's
SQL store, so running it again with the same ``--session`` continues the conversation, and
each turn pays only for what is new. Type ``/quit`` or end the input (Ctrl-D) to leave. After
each reply the turn's figures go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys

from suffixmem import runtime
from suffixmem.conversation.manager import TurnResult
from suffixmem.engine.protocol import TokenEvent


def main() -> None:
    # vLLM logs to stdout by default; keep its lines out of the conversation
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--session", default="terminal-chatbot")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--engine", default="vllm", choices=["vllm", "torch"])
    parser.add_argument("--database-url", default=None, help="default: suffixmem's own")
    parser.add_argument("--system", default="You are a friendly assistant. Be brief.")
    parser.add_argument("--temperature", type=float, default=None,
                        help="default: the session's semantic temperature")
    args = parser.parse_args()

    interactive = sys.stdin.isatty()
    print("starting the engine...", file=sys.stderr, flush=True)
    manager = runtime.get_manager(args.engine, database_url=args.database_url)
    info = manager.open_session(args.session, system_prompt=args.system)
    if info.message_count:
        print(f"continuing session {info.id!r} ({info.message_count} messages)",
              file=sys.stderr)
    try:
        while True:
            if interactive:
                print("you> ", end="", flush=True)
            line = sys.stdin.readline()
            if not line or line.strip() == "/quit":
                break
            message = line.strip()
            if not message:
                continue
            print("bot> ", end="", flush=True)
            sampling = {"max_tokens": args.max_tokens}
            if args.temperature is not None:
                sampling["temperature"] = args.temperature
            for event in manager.stream_chat(args.session, message, **sampling):
                if isinstance(event, TokenEvent):
                    print(event.text, end="", flush=True)
                elif isinstance(event, TurnResult):
                    print()
                    print(
                        f"  [{event.prompt_tokens} prompt tokens, {event.cached_tokens} from "
                        f"cache, first token after {event.ttft_s * 1000:.0f} ms]",
                        file=sys.stderr, flush=True,
                    )
    finally:
        runtime.close_all()  # the manager, then the engine


if __name__ == "__main__":
    main()
