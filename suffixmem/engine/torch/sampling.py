"""Sampling one token from a logits row: OpenAI's frequency and presence penalties,
temperature, top-k, top-p (nucleus), seeded.

The engine's sampling step (``TorchEngine._sample``) first applies ``penalise`` to the rows of
penalised requests, then takes the batch's argmax for greedy requests and calls
``sample_token`` for the others.
"""

from __future__ import annotations

import torch

from suffixmem.engine.protocol import SamplingParams


def penalise(logits: torch.Tensor, output_ids: list[int], s: SamplingParams) -> None:
    """Lower ``logits [V]`` in place as OpenAI defines its penalties (and vLLM applies them):
    by ``frequency_penalty`` per occurrence of a token in ``output_ids`` (the output so far,
    not the prompt), plus ``presence_penalty`` once for a token that occurs at all."""
    if not output_ids or not s.penalised:
        return
    ids, counts = torch.unique(torch.tensor(output_ids, dtype=torch.long), return_counts=True)
    drop = counts.to(logits.dtype) * s.frequency_penalty + s.presence_penalty
    logits[ids] -= drop


def sample_token(logits: torch.Tensor, s: SamplingParams, generator: torch.Generator) -> int:
    """Sample from ``logits [V]`` with temperature, top-k and top-p (nucleus)."""
    if s.top_k == 1:
        return int(logits.argmax())  # top-1 sampling is greedy (ties: the lowest id, as argmax)
    x = logits.float() / max(s.temperature, 1e-5)
    if s.top_k > 0 and s.top_k < x.shape[-1]:
        # exactly k candidates, even when bf16 logits tie at the k-th value
        keep = torch.zeros_like(x, dtype=torch.bool).scatter_(0, torch.topk(x, s.top_k).indices,
                                                              True)
        x = x.masked_fill(~keep, float("-inf"))
    if s.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # drop a token when the tokens before it already reach top_p (the first always stays)
        drop = (torch.cumsum(probs, dim=-1) - probs) >= s.top_p
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(0, order, sorted_x)
    probs = torch.softmax(x, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())
