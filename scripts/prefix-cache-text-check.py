"""Does stock vLLM's own prefix cache change greedy text against full recomputation (bf16, CPU)?

The `returning` workload's first 8 sessions, 3 turns each, straight on vLLM (no suffixmem): each
turn's prompt is generated greedily once with the cache holding the earlier turns (prefix hit)
and once after `reset_prefix_cache()` (recomputed); prints the share of turns 2-3 whose text is
the same. Context for `text_same_as_naive` in `bench chat --workload returning`.
Run: `.venv/bin/python scripts/prefix-cache-text-check.py` (about 2 minutes).
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from vllm import LLM, SamplingParams

from suffixmem.models import resolve_model
from suffixmem_bench.chat.returning import build_returning_workload
from suffixmem_bench.chat.run import token_counter

MODEL = "smollm2-135m-instruct"


def main(sessions: int = 8, turns: int = 3) -> None:
    path = str(resolve_model(MODEL, progress=False))
    llm = LLM(path, enable_prefix_caching=True, block_size=32, max_model_len=4096,
              enforce_eager=True)
    tok = llm.get_tokenizer()
    work = build_returning_workload(count=token_counter(MODEL))
    greedy = SamplingParams(temperature=0, max_tokens=32)
    same = total = 0
    for s in range(sessions):
        msgs = [{"role": "system", "content": work.system_prompts[s]}]
        for t, question in enumerate(work.sessions[s][:turns], start=1):
            msgs.append({"role": "user", "content": question})
            prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            cached = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].text
            llm.reset_prefix_cache()
            recomputed = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].text
            if t > 1:  # turn 1 has nothing cached
                total += 1
                same += cached == recomputed
            msgs.append({"role": "assistant", "content": recomputed})
    print(json.dumps({"turns_compared": total, "same_text_cached_vs_recomputed": same / total}))


if __name__ == "__main__":
    main()
