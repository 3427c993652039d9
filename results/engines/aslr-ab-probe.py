"""The decode probe of docs/profile-decode.md round 9 (run as written, alone, 2 threads).

The vLLM engine, a 1,500-token prompt, 64 greedy tokens with EOS ignored, three requests in
one process; prints ``RESULT {"decode_ms": [...]}``: each request's median gap between tokens.
The A/B ran it in fresh processes, alternating ``python aslr-ab-probe.py`` and ``setarch -R
python aslr-ab-probe.py`` (no address-space randomisation), six of each, OMP_NUM_THREADS=2.
"""

import itertools
import json
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from suffixmem.engine import create_engine
from suffixmem.engine.protocol import Request, SamplingParams, TokenEvent

engine = create_engine("vllm", max_model_len=4096, kv_cache_gib=1.0)
text = "The history of the printing press " * 200
ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"][:1500]
out = []
for rep in range(3):
    request = Request(session_key=f"probe-{rep}", token_ids=ids,
                      sampling=SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
    stamps = [time.perf_counter() for event in engine.stream(request)
              if isinstance(event, TokenEvent)]
    out.append(statistics.median(b - a for a, b in itertools.pairwise(stamps)) * 1000)
engine.close()
print("RESULT", json.dumps({"decode_ms": out}), flush=True)
os._exit(0)  # vLLM leaves threads behind
