"""``sample_token``: temperature, top-k (exactly k, also on ties), top-p, seeds."""

from __future__ import annotations

import math

import torch

from suffixmem.engine.protocol import SamplingParams
from suffixmem.engine.torch.engine import sample_token


def draws(logits: list[float], n: int = 400, seed: int = 0, **params: float) -> set[int]:
    g = torch.Generator().manual_seed(seed)
    s = SamplingParams(**params)  # type: ignore[arg-type]
    return {sample_token(torch.tensor(logits), s, g) for _ in range(n)}


def test_top_k_keeps_exactly_k_even_on_ties() -> None:
    logits = [1.0, 3.0, 3.0, 3.0, 0.5]
    assert draws(logits, temperature=1.0, top_k=1) == {1}  # greedy: lowest tied id
    assert len(draws(logits, temperature=1.0, top_k=2)) == 2
    assert draws(logits, temperature=1.0, top_k=2) <= {1, 2, 3}
    assert draws(logits, temperature=1.0) == {0, 1, 2, 3, 4}


def test_top_p_keeps_the_smallest_nucleus() -> None:
    # probabilities 0.5, 0.25, 0.125, 0.125
    logits = [math.log(p) for p in (0.5, 0.25, 0.125, 0.125)]
    assert draws(logits, temperature=1.0, top_p=0.5) == {0}
    assert draws(logits, temperature=1.0, top_p=0.75) == {0, 1}
    # 0.5 + 0.25 < 0.8: a third token is needed; ids 2 and 3 tie, exactly one of them stays
    kept = draws(logits, temperature=1.0, top_p=0.8)
    assert len(kept) == 3 and kept >= {0, 1}
    assert draws(logits, temperature=1.0, top_p=1.0) == {0, 1, 2, 3}


def test_temperature_sharpens_and_seeds_reproduce() -> None:
    logits = [0.0, 1.0, 2.0]
    assert draws(logits, temperature=0.01) == {2}
    assert len(draws(logits, temperature=2.0)) == 3
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    s = SamplingParams(temperature=1.0)
    a = [sample_token(torch.tensor(logits), s, g1) for _ in range(50)]
    b = [sample_token(torch.tensor(logits), s, g2) for _ in range(50)]
    assert a == b
