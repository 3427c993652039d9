"""Rotary position embedding (RoPE), rotate-half convention as in Hugging Face Llama.

A head vector ``x`` at position ``p`` becomes ``x * cos(p * f) + rotate_half(x) * sin(p * f)``
with ``f = theta ** (-(0, 2, ..., D-2) / D)`` repeated twice (the first and second halves of the
head dimension form the rotated pairs). Rotations compose, so a key cached at position ``p`` is
moved to position ``p + delta`` by rotating it once more by ``delta`` (``rerotate``); that is how
segment reuse places cached keys at new positions.

Shapes: ``x`` is ``[N, heads, D]`` (one row per token), ``positions`` is ``[N]`` (int).
"""

from __future__ import annotations

import torch

RE_ROTATE_ROWS = 1024  # rows per chunk of ``rerotate``: fp32 temporaries of ~0.8 MB, reused


def inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """``[D/2]`` fp32 inverse frequencies, computed exactly as transformers does."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


def cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
            dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin`` of shape ``[N, D]`` for integer (or float) ``positions [N]``, computed in
    fp32 and then cast to ``dtype`` (transformers' order of operations)."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq(head_dim, theta).to(positions.device)
    emb = torch.cat((freqs, freqs), dim=-1)  # [N, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` along the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_with(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [N, heads, D]`` with precomputed ``cos, sin [N, D]`` (same dtype as ``x``)."""
    cos = cos[:, None, :]  # [N, 1, D]: broadcast over heads
    sin = sin[:, None, :]
    return x * cos + rotate_half(x) * sin


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin [N, D]`` with its first half negated, for ``rope_signed``."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rope_signed(x: torch.Tensor, cos: torch.Tensor, ssin: torch.Tensor) -> torch.Tensor:
    """``rope_with(x, cos, sin)`` bit for bit, given ``ssin = signed_sin(sin)``: the halves of
    ``x`` swapped by one ``roll`` times the signed sine is ``rotate_half(x) * sin`` (negation is
    exact), in four tensor ops instead of seven; the hot path of every forward step."""
    return x * cos[:, None, :] + x.roll(x.shape[-1] // 2, -1) * ssin[:, None, :]


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate ``x [N, heads, D]`` to ``positions [N]``, in ``x``'s dtype as transformers does
    (cos/sin computed in fp32, cast to ``x.dtype``, then multiplied)."""
    cos, sin = cos_sin(positions, x.shape[-1], theta, x.dtype)
    return rope_with(x, cos, sin)


def rerotate(k: torch.Tensor, delta_positions: torch.Tensor | int, theta: float,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """Move already rotated keys ``k [N, kv_heads, D]`` by ``delta_positions`` (``[N]`` or one
    int; may be negative): the result equals keys rotated directly to ``p + delta`` up to
    rounding. Computed in fp32 and cast back to ``k.dtype`` so that bf16 keys lose at most one
    rounding. Written to ``out`` (default a new tensor); ``out=k`` rotates in place."""
    if isinstance(delta_positions, int):
        # one delta for every row: one row of trigonometry, broadcast (the same values, so the
        # same result bit for bit as a row per key; a segment's keys over 30 layers are
        # thousands of rows)
        delta_positions = torch.tensor([delta_positions], dtype=torch.long)
    cos, sin = cos_sin(delta_positions.to(k.device), k.shape[-1], theta, torch.float32)
    ssin = signed_sin(sin)
    # A segment's keys over every layer are megabytes: whole-tensor fp32 temporaries were
    # fresh buffers whose page faults cost more than the arithmetic (13 ms for 500 tokens x 30
    # layers on the AMD EPYC host). Row chunks reuse small buffers: 1.6 ms. rope_signed gives
    # rope_with's values bit for bit.
    if out is None:
        out = torch.empty_like(k)
    for a in range(0, k.shape[0], RE_ROTATE_ROWS):
        b = a + RE_ROTATE_ROWS
        c, s = (cos, ssin) if cos.shape[0] == 1 else (cos[a:b], ssin[a:b])
        out[a:b] = rope_signed(k[a:b].to(torch.float32), c, s)
    return out


class RopeTable:
    """Precomputed ``cos, signed sin [max_positions, D]`` in the model's dtype, for the engine's
    hot path (one lookup per step instead of recomputing the trigonometry); the pairs it returns
    are what ``Llama.qkv(rope=...)`` takes (see ``rope_signed``)."""

    def __init__(self, head_dim: int, theta: float, max_positions: int,
                 dtype: torch.dtype) -> None:
        self.head_dim = head_dim
        self.theta = theta
        self.cos, sin = cos_sin(torch.arange(max_positions), head_dim, theta, dtype)
        self.ssin = signed_sin(sin)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, signed sin [N, D]`` for ``positions [N]`` (torch raises IndexError past the
        end)."""
        return self.cos[positions], self.ssin[positions]
