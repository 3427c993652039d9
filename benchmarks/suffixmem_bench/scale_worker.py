"""One "suffixmem server" of ``bench scale``: a ConversationManager with the remote engine on
the shared database, answering turns read from stdin (one JSON object a line:
``{"session": ..., "message": ..., "max_tokens": ...}``) with one JSON line each on stdout.

``python -m suffixmem_bench.scale_worker DATABASE_URL POLICY URL [URL ...]``
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> None:
    from suffixmem.conversation.manager import ConversationManager, ManagerConfig
    from suffixmem.engine import create_engine
    from suffixmem.stdio import quiet_stdout

    db, policy, *urls = argv
    with quiet_stdout(True):
        engine = create_engine("remote", urls=urls, database_url=db, max_model_len=2048,
                               policy=policy, health_interval_s=1.0)
        mgr = ConversationManager(engine, db, ManagerConfig(detect_topics=False,
                                                            record_segments=False))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        t0 = time.perf_counter()
        try:
            r = mgr.chat(job["session"], job["message"], create=True,
                         max_tokens=job.get("max_tokens", 16), temperature=0.0)
            out = {"ok": True, "session": job["session"], "prompt_tokens": r.prompt_tokens,
                   "cached_tokens": r.cached_tokens, "output_tokens": len(r.token_ids),
                   "ttft_s": r.ttft_s, "latency_s": time.perf_counter() - t0,
                   "replica": getattr(engine, "replica_of", lambda s: None)(job["session"])}
        except Exception as e:  # reported, counted as an error by the driver
            out = {"ok": False, "session": job["session"], "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)
    mgr.close()
    engine.close()


if __name__ == "__main__":
    main(sys.argv[1:])
