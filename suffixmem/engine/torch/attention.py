"""One query per sequence over its whole context: the attention of a decode step.

Two ways to compute it, chosen by context length (shapes: ``B`` sequences, ``KV`` key/value
heads, ``R`` query heads per KV head, ``H = KV * R``, ``D`` head dim, ``T`` context length):

- **Packed SDPA** (short contexts): the ``R`` query heads of a KV head become rows of an
  MQA-shaped ``scaled_dot_product_attention`` call. Its CPU kernel splits work over (sequence,
  KV head), which for the default model is 3 work items on 2 cores, and runs an inner loop
  tuned for many queries: at 1,564 tokens it reads K/V at ~5 GB/s, a third of a decode step
  on the AMD EPYC host (docs/profile-decode.md, round 4).
- **Block-diagonal products** (long contexts): K and V are read as ``[T, KV * D]`` rows (their
  layout in the pool), once, by two batched matrix products that split freely over ``T``:
  scores ``[B, H, T] = Q' @ K^T`` where ``Q'`` ``[B, H, KV * D]`` holds each query head in its
  KV head's ``D`` columns and zeros elsewhere, a softmax in fp32, then ``P @ V`` whose
  diagonal ``D``-blocks are the heads' outputs. The zeros cost ``KV`` times the (tiny) FLOPs
  and contribute exactly 0. Measured there with the default model: attention alone over
  30 layers with cold caches 7.3 -> 5.1 ms at 1,564 tokens, 11.6 -> 6.1 at 3,000; whole decode
  steps (interleaved) 22.0 -> 21.2 ms at 1,564 tokens, 27.3 -> 22.9 at 3,000, slower below
  ~1,200 (docs/torch-engine.md).
  Numerics: the scores are rounded to the model's dtype before the fp32 softmax, as in
  transformers' eager attention (SDPA keeps them in fp32): a different last bit, not a
  different method.

``one_query`` takes the products for one sequence from ``LONG_CONTEXT`` tokens on; batches stay
on packed SDPA (with a padding mask), where the products measured 3-30% slower at every shape
tried (docs/profile-decode.md, round 4). Both ways are deterministic for a given shape, so a
decode step and the layer primitives (``Llama.attend``), which both call ``one_query``, agree
bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LONG_CONTEXT = 1536  # from this many context tokens on, the block-diagonal products (measured)


def one_query(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``q [B, KV, R, D]`` (one query per sequence, its heads grouped by KV head)
    over ``k, v [B, KV, T, D]``; ``mask [B, 1, 1, T]`` (bool, True = visible) or None for
    all-visible. Returns ``[B, H * D]``. Scale ``1 / sqrt(D)`` as SDPA's default."""
    b, kvh, r, d = q.shape
    if b > 1 or k.shape[2] < LONG_CONTEXT:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).reshape(b, kvh * r * d)
    return block_diagonal(q, k, v, mask)


def block_diagonal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """``one_query``'s long-context way for any batch (module docstring), same contract."""
    b, kvh, r, d = q.shape
    t = k.shape[2]
    # [B, T, KV * D]: a view when K/V rows are [KV, D] contiguous (pool, mirror, gather)
    kf, vf = k.transpose(1, 2).flatten(2), v.transpose(1, 2).flatten(2)
    eye = torch.eye(kvh, dtype=q.dtype).view(1, kvh, 1, kvh, 1)
    qbd = (q.unsqueeze(3) * eye).view(b, kvh * r, kvh * d)  # [B, H, KV * D], block diagonal
    scores = torch.bmm(qbd, kf.transpose(1, 2)).to(torch.float32).mul_(d ** -0.5)
    if mask is not None:
        scores.masked_fill_(~mask.view(b, 1, t), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = torch.bmm(probs, vf).view(b, kvh, r, kvh, d).diagonal(dim1=1, dim2=3)  # [B,R,D,KV]
    return out.permute(0, 3, 1, 2).reshape(b, kvh * r * d)
