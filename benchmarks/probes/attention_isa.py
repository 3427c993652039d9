"""Probe: is vLLM-CPU's AMX attention kernel less accurate than its AVX-512 ("vec") path?

The README's France note rests on this. Greedy fp32 ``transformers`` answers to 60 short
questions (``questions.py``) are the reference; vLLM (bf16, 32-token blocks, eager) scores the
same prompt+answer ids teacher-forced (``prompt_logprobs``), once on its default path and once
with AMX reported absent (its ``vec`` path), each in its own process. Prints one JSON object:
per path, the share of answer positions whose top-1 token matches fp32's and the mean and p95
KL(fp32 || vLLM) over fp32's top-20 tokens (vLLM's top-20, a token outside them at vLLM's
20th log-probability). On a host without AMX both rows are the same path.

    .venv/bin/python benchmarks/probes/attention_isa.py
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def reference(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from suffixmem.models import resolve_model

    sys.path.insert(0, str(HERE))
    from questions import QUESTIONS

    folder = resolve_model("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    rows = []
    for q in QUESTIONS:
        ids = tok.apply_chat_template([{"role": "user", "content": q}],
                                      add_generation_prompt=True, return_dict=True)["input_ids"]
        with torch.no_grad():
            full = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0]
            lps = torch.log_softmax(model(full[None]).logits[0].float(), -1)
        top = torch.topk(lps[len(ids) - 1:len(full) - 1], 20)
        rows.append({"prompt": ids, "answer": full[len(ids):].tolist(),
                     "top_ids": top.indices.tolist(), "top_lp": top.values.tolist()})
    out.write_text(json.dumps(rows))


def score(ref_path: Path, path: str) -> dict[str, float | int | str]:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    if path == "vec":  # vLLM picks its attention kernel from this (cpu_attn._get_attn_isa)
        torch.cpu._is_amx_tile_supported = lambda: False
    from vllm import LLM, SamplingParams, TokensPrompt

    from suffixmem.models import resolve_model

    ref = json.loads(ref_path.read_text())
    llm = LLM(str(resolve_model("smollm2-135m-instruct")), dtype="bfloat16", block_size=32,
              max_model_len=2048, enforce_eager=True, seed=0, gpu_memory_utilization=0.1)
    outs = llm.generate([TokensPrompt(prompt_token_ids=r["prompt"] + r["answer"]) for r in ref],
                        SamplingParams(max_tokens=1, prompt_logprobs=20, temperature=0))
    agree, kls = 0, []
    for r, o in zip(ref, outs, strict=True):
        start = len(r["prompt"])
        for j, (ids, lps) in enumerate(zip(r["top_ids"], r["top_lp"], strict=True)):
            got = {t: v.logprob for t, v in o.prompt_logprobs[start + j].items()}
            agree += max(got, key=got.__getitem__) == ids[0]
            floor = min(got.values())
            kls.append(sum(math.exp(a) * (a - got.get(t, floor)) for t, a in
                           zip(ids, lps, strict=True)))
    kls.sort()
    return {"path": path, "positions": len(kls), "top1": round(agree / len(kls), 4),
            "kl_mean": round(sum(kls) / len(kls), 5), "kl_p95": round(kls[int(0.95 * len(kls))], 5),
            "amx_tiles": bool(torch.cpu._is_amx_tile_supported())}


def main() -> None:
    if len(sys.argv) == 3:  # a child: one path
        print(json.dumps(score(Path(sys.argv[1]), sys.argv[2])))
        return
    with tempfile.TemporaryDirectory() as tmp:
        ref = Path(tmp) / "ref.json"
        reference(ref)
        rows = []
        for path in ("default", "vec"):
            out = subprocess.run([sys.executable, __file__, str(ref), path], check=True,
                                 stdout=subprocess.PIPE, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    print(json.dumps({"paths": rows}))


if __name__ == "__main__":
    main()
