"""Run by test_remote.py as a separate process: one ConversationManager on a shared database
and the remote engine, sending TURNS turns to one session as soon as START_AT (epoch seconds)
arrives. Prints one line per committed turn: ``<tag> <turn> <prompt_tokens> <output_tokens>``.

Usage: python remote_turns.py DATABASE_URL SESSION TAG TURNS START_AT URL [URL ...]
"""

from __future__ import annotations

import sys
import time

from suffixmem.conversation.manager import ConversationManager, ManagerConfig
from suffixmem.engine import create_engine


def main(argv: list[str]) -> None:
    db, sid, tag, turns, start_at, *urls = argv
    engine = create_engine("remote", urls=urls, database_url=db, max_model_len=1024,
                           health_interval_s=0)
    mgr = ConversationManager(engine, db, ManagerConfig(detect_topics=False,
                                                        record_segments=False,
                                                        lock_timeout_s=300))
    time.sleep(max(0.0, float(start_at) - time.time()))
    for i in range(int(turns)):
        r = mgr.chat(sid, f"{tag} asks question number {i}: name a fruit.", max_tokens=8,
                     temperature=0.0)
        print(tag, i, r.prompt_tokens, len(r.token_ids), flush=True)
    mgr.close()
    engine.close()


if __name__ == "__main__":
    main(sys.argv[1:])
