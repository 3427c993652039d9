import json, os, sys, time, statistics
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
from suffixmem.engine import create_engine
from suffixmem.engine.protocol import Request, SamplingParams, TokenEvent
eng = create_engine("vllm", max_model_len=4096, kv_cache_gib=1.0)
ids = eng.tokenizer("The history of the printing press " * 200, add_special_tokens=False)["input_ids"][:1500]
out = []
for rep in range(3):
    req = Request(session_key=f"probe-{rep}", token_ids=ids, sampling=SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
    stamps = []
    for ev in eng.stream(req):
        if isinstance(ev, TokenEvent):
            stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    out.append(statistics.median(gaps) * 1000)
eng.close()
print("RESULT", json.dumps({"decode_ms": out}), flush=True)
os._exit(0)
