"""Causal prefill attention through vLLM's CPU attention kernel.

A prefill's attention is half of its time on SDPA's CPU flash kernel (24 ms a layer at 1,564
tokens on the AMD EPYC host: ~120 GFLOP/s, a seventh of the machine's bf16 matmul rate); vLLM's
own CPU kernel (``cpu_attention_with_kv_cache``, the one the vLLM engine runs) does the same
work in 9 ms. ``PrefillKernel`` calls it for the common prefill shape: the queries are the last
``Nq`` tokens of a context whose keys sit at positions ``0 .. T-1`` (a cold prefill, a chunk of
one, or the new tokens of a warm turn). Any other shape (tokens at scattered positions: segment
reuse) stays on SDPA.

The kernel reads K/V from its own paged layout (written by its ``reshape_and_cache``, whose
format depends on the instruction set), so each call copies the context's K/V into a scratch
cache first: ~1 MB a layer at 1,564 tokens, a few percent of what it saves. Loading: the
shared library is opened with ``torch.ops.load_library`` (the one vLLM itself picks for this
CPU), without importing the ``vllm`` package; ``PrefillKernel.load()`` returns ``None`` where
vLLM is not installed or the library lacks the ops, and attention then stays on SDPA.

Numerics: bf16 inputs, fp32 softmax inside the kernel; not bit-identical to SDPA (another
summation order), so the model uses one of the two for every prefill (``Llama.attend``), and a
prompt computed cold or chunked gets the same K/V either way up to that order. fp32 models, the
reference mode, never use it.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import torch
import torch.nn.functional as F

log = logging.getLogger("suffixmem.engine.torch")

BLOCK = 32  # the kernel's block size: a multiple of 32 for its vectorised paths
PROBE_TOLERANCE = 0.05  # bf16 outputs of unit-variance inputs: a few units in the last place
_LOADED: list[bool] = []  # whether the library was opened (once per process)


def _library() -> Path | None:
    """The vLLM CPU library for this CPU (vLLM's own choice in ``CpuPlatform.import_kernels``),
    without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent
    if torch.cpu._is_avx512_supported() and not torch.cpu._is_avx512_bf16_supported():
        names = ["_C_AVX512.abi3.so"]
    elif torch.cpu._is_avx512_supported():
        names = ["_C.abi3.so"]
    else:
        names = ["_C_AVX2.abi3.so", "_C.abi3.so"]
    return next((folder / n for n in names if (folder / n).exists()), None)


def _isa(head_dim: int) -> str:
    """vLLM's ISA choice for bf16 with 32-token blocks (``cpu_attn._get_attn_isa``)."""
    if head_dim % 32 and head_dim % 16 == 0:
        return "vec16"
    return "amx" if torch.cpu._is_amx_tile_supported() else "vec"


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """fp32 SDPA of ``PrefillKernel.__call__``'s contract (the load-time probe's reference)."""
    nq, t = q.shape[0], k.shape[0]
    mask = torch.arange(t)[None, :] <= torch.arange(t - nq, t)[:, None]
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1)[None], k.float().transpose(0, 1)[None],
        v.float().transpose(0, 1)[None], attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(nq, -1)


class PrefillKernel:
    """vLLM's CPU attention for suffix-causal queries (module docstring)."""

    def __init__(self, isa: str) -> None:
        self.isa = isa
        self._ops = torch.ops._C

    @classmethod
    def load(cls, num_heads: int, num_kv_heads: int, head_dim: int) -> PrefillKernel | None:
        """The kernel for this attention shape, or ``None`` where it cannot serve it (no vLLM,
        another build, a head size it lacks): a probe against fp32 SDPA decides."""
        if not _LOADED:
            path = _library()
            ok = False
            if path is not None:
                try:
                    torch.ops.load_library(str(path))
                    ok = hasattr(torch.ops._C, "cpu_attention_with_kv_cache")
                except (OSError, RuntimeError) as e:
                    log.info("vLLM's CPU attention kernel is unavailable (%s): SDPA", e)
            _LOADED.append(ok)
        if not _LOADED[0]:
            return None
        kernel = cls(_isa(head_dim))
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(n, h, head_dim, generator=gen).to(torch.bfloat16)
                   for n, h in ((40, num_heads), (70, num_kv_heads), (70, num_kv_heads)))
        scale = head_dim ** -0.5
        try:
            err = (kernel(q, k, v, scale).float() - _reference(q, k, v, scale)).abs().max()
        except RuntimeError as e:  # a shape this build does not support
            log.info("vLLM's CPU attention kernel cannot serve head_dim %d (%s): SDPA",
                     head_dim, e)
            return None
        return kernel if float(err) <= PROBE_TOLERANCE else None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 scale: float) -> torch.Tensor:
        """Attention of ``q [Nq, H, D]``, the last ``Nq`` positions of a context whose keys
        and values ``k, v [T, KV, D]`` sit at positions ``0 .. T-1``; query ``j`` sees keys
        ``0 .. T - Nq + j``. bf16 only. Returns ``[Nq, H * D]``."""
        nq, heads, d = q.shape
        t, kvh, _ = k.shape
        nb = -(-t // BLOCK)
        # the kernel's paged layout: [blocks, KV, 2 * BLOCK, D], keys then values per block
        cache = torch.empty(nb, kvh, 2 * BLOCK, d, dtype=k.dtype)
        # the last block's unused slots are read (weight 0): NaN garbage there would leak
        cache[-1].zero_()
        kc, vc = cache.chunk(2, dim=2)
        ops = self._ops
        ops.cpu_attn_reshape_and_cache(k, v, kc, vc, torch.arange(t, dtype=torch.int64),
                                       self.isa, 1.0, 1.0, "auto")
        qsl = torch.tensor([0, nq], dtype=torch.int32)
        lens = torch.tensor([t], dtype=torch.int32)
        table = torch.arange(nb, dtype=torch.int32).view(1, nb)
        meta = ops.get_scheduler_metadata(1, heads, kvh, d, lens, q.dtype, qsl, True, -1,
                                          self.isa, False, None, "auto")
        out = torch.empty_like(q)
        ops.cpu_attention_with_kv_cache(q.contiguous(), kc, vc, out, qsl, lens, scale, True,
                                        None, -1, table, 0.0, meta, None, None, 1.0, 1.0, "auto")
        return out.view(nq, heads * d)
