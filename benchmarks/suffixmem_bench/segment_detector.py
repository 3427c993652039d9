"""The attention-entropy detector on multi-turn sessions, for ``bench segments``: how often its
regions are later met again outside the prefix cache."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from suffixmem_bench.corpus import reference_text, stdlib_paragraphs
from suffixmem_bench.segment_prompts import SYSTEM, Encode, chatml, dialogue_pairs

# -- the detector on multi-turn sessions ------------------------------------------------------
DETECTOR_SWEEP: tuple[tuple[float, float], ...] = (
    (0.5, 0.75), (0.4, 0.5), (0.35, 0.45), (0.3, 0.4),
)
"""(start threshold, extend threshold) pairs reported; the first is the detector's default."""


def detector_reuse(
    llama: Any, encode: Encode, sessions: int = 3, turns: int = 6, seed: int = 0,
    layers: Sequence[int] | None = None,
    sweep: Sequence[tuple[float, float]] = DETECTOR_SWEEP,
) -> dict[str, Any]:
    """Run ``EntropyDetector`` on each turn's new tokens (those past the previous turn's prompt,
    which a prefix cache holds) and count how many regions appear again, verbatim, in the new
    tokens of a later turn of the same session. Sessions: chat history from chatterbot-corpus,
    and each turn one passage retrieved from a pool of four, so passages recur by chance; the
    share of passages met again later is the ceiling a detector could reach."""
    from suffixmem.engine.reuse.detector import DetectorConfig, EntropyDetector

    rng = random.Random(seed)
    pairs = dialogue_pairs()
    n_paras = len(stdlib_paragraphs())
    layers = list(layers) if layers is not None else default_entropy_layers(llama)
    profiles: list[list[tuple[list[int], list[float]]]] = []  # session -> turn -> (new, ent)
    passages = passages_again = 0
    for _ in range(sessions):
        pool = [encode("Context:\n" + reference_text(
            120, lambda t: len(encode(t)), skip=rng.randrange(n_paras)) + "\n\n")
            for _ in range(4)]
        history = chatml("system", SYSTEM)
        prev: list[int] = []
        turns_out: list[tuple[list[int], list[float]]] = []
        picked: list[int] = []
        for _t in range(turns):
            q, a = pairs[rng.randrange(len(pairs))]
            picked.append(rng.randrange(len(pool)))
            ids = (encode(history + "<|im_start|>user\n") + pool[picked[-1]]
                   + encode(q + "<|im_end|>\n<|im_start|>assistant\n"))
            common = 0
            while common < min(len(ids), len(prev)) and ids[common] == prev[common]:
                common += 1
            ent = entropy_profile(llama, ids, layers)[common:].tolist()
            turns_out.append((ids[common:], ent))
            history += chatml("user", q) + chatml("assistant", a)
            prev = ids
        profiles.append(turns_out)
        passages += turns
        passages_again += sum(1 for t, x in enumerate(picked) if x in picked[t + 1:])
    rows = []
    for start, extend in sweep:
        det = EntropyDetector(DetectorConfig(threshold=start, extend_threshold=extend))
        regions = reused = tokens = reused_tokens = total = 0
        for turns_out in profiles:
            for t, (new, ent) in enumerate(turns_out):
                total += len(new)
                for reg in det.detect(ent):
                    ids = new[reg.start:reg.end]
                    regions += 1
                    tokens += len(ids)
                    if any(_contains(later, ids) for later, _ in turns_out[t + 1:]):
                        reused += 1
                        reused_tokens += len(ids)
        rows.append({
            "threshold": start, "extend_threshold": extend, "regions": regions,
            "regions_reused_later": reused,
            "region_reuse_rate": reused / regions if regions else 0.0,
            "region_tokens": tokens, "region_tokens_reused_later": reused_tokens,
            "new_tokens_covered": tokens / total if total else 0.0,
        })
    return {
        "sessions": sessions, "turns": turns, "entropy_layers": layers,
        "passages_reused_later_rate": passages_again / passages if passages else 0.0,
        "sweep": rows, **rows[0],
    }


def _contains(hay: Sequence[int], needle: Sequence[int]) -> bool:
    n = len(needle)
    return any(hay[i:i + n] == needle for i in range(len(hay) - n + 1)) if n else False


def default_entropy_layers(llama: Any) -> list[int]:
    """The detector's default layers: the middle third of the model."""
    n = llama.config.num_layers
    return list(range(n // 3, 2 * n // 3))


def entropy_profile(llama: Any, ids: Sequence[int], layers: Sequence[int]) -> Any:
    """Per-position normalized attention entropy ``[N]`` of a cold forward over ``ids``,
    averaged over ``layers`` (our ``Llama.attend(entropy=True)``)."""
    import torch

    with torch.inference_mode():
        pos = torch.arange(len(ids))
        rope = llama.rope(pos)
        h = llama.embed(torch.tensor(list(ids)))
        ents = []
        want = set(layers)
        for i in range(max(layers) + 1):
            q, k, v = llama.qkv(i, h, rope=rope)
            out = llama.attend(q, k, v, pos, pos, entropy=i in want)
            if isinstance(out, tuple):
                out, e = out
                ents.append(e)
            h = llama.finish(i, h, out)
        return torch.stack(ents).mean(0).clamp(0.0, 1.0)
