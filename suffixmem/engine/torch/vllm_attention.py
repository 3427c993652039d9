"""vLLM's CPU attention kernel as the torch engine's attention for prefill and decode.

On SDPA's CPU kernels attention was half of a cold prefill (24 ms a layer at 1,564 tokens on
the AMD EPYC host, ~120 GFLOP/s where bf16 matmuls reach ~900) and, with a padding mask, about
half of a batch-4 decode step. vLLM's own CPU kernel (``cpu_attention_with_kv_cache``, what the
vLLM engine runs) takes 9 ms for that prefill and a quarter of SDPA's time for a ragged decode
batch, without padding. ``VllmAttention`` wraps it:

- ``prefill(q, k, v, scale, q_pos)``: queries at ascending positions of a context whose keys sit
  at positions ``0 .. T-1``: its last ``Nq`` tokens (a cold prefill, a chunk of one, a warm
  turn's new tokens) or the tokens recomputed between reused spans (segment reuse, context
  shift), one kernel sequence per run of consecutive positions. The kernel reads K/V
  from its own paged layout (written by its ``reshape_and_cache``, whose format depends on the
  instruction set), so each call first copies the context into a scratch cache: ~1 MB a layer
  at 1,564 tokens, a few percent of what it saves.
- ``new_cache`` / ``write`` / ``metadata`` / ``attend``: the pieces of a paged cache kept across
  decode steps (``paged_mirror.PagedMirror``).

Loading: the shared library vLLM itself picks for this CPU is opened with
``torch.ops.load_library``, without importing the ``vllm`` package. ``VllmAttention.load``
returns ``None`` where vLLM is not installed, the library lacks the ops, or a probe against fp32
SDPA fails for the model's head size; attention then stays on SDPA.

Numerics: bf16 in, fp32 softmax inside; not bit-identical to SDPA (another summation order).
fp32 models (the reference mode), ``exact_decode`` and the dense reference ``Llama.forward``
never use it. In fp32 it would not pay either: on an AMD EPYC host without AVX-512 (where
``dtype="auto"`` serves fp32), 9 query and 3 KV heads of 64, its fp32 path took 1.4x SDPA's
time for a 1,500-token causal prefill (39 vs 29 ms a layer), 1.5x for 300 queries over 1,500
keys and 1.5-3x for one decode query over 2,000 (2026-12-04, two runs, min of 5 each, alone).
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
    """vLLM's ISA choice for bf16 with 32-token blocks (``cpu_attn._get_attn_isa``), less its
    ``amx`` path: on an Intel host with AMX that path's decode logits left the bound the
    ``vec`` path keeps against SDPA (``test_paged_mirror``), and it needs the process's AMX
    permission (without it, a process where no oneDNN matmul had asked died of SIGILL)."""
    if head_dim % 32 and head_dim % 16 == 0:
        return "vec16"
    return "vec"


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               q_pos: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 SDPA of ``VllmAttention.prefill``'s contract (the load-time probe's reference)."""
    nq, t = q.shape[0], k.shape[0]
    if q_pos is None:
        q_pos = torch.arange(t - nq, t)
    mask = torch.arange(t)[None, :] <= q_pos[:, None]
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1)[None], k.float().transpose(0, 1)[None],
        v.float().transpose(0, 1)[None], attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(nq, -1)


class VllmAttention:
    """vLLM's CPU attention kernel for one attention shape (module docstring)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.isa = _isa(head_dim)
        self._ops = torch.ops._C

    @classmethod
    def load(cls, num_heads: int, num_kv_heads: int, head_dim: int) -> VllmAttention | None:
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
        kernel = cls(num_heads, num_kv_heads, head_dim)
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(n, h, head_dim, generator=gen).to(torch.bfloat16)
                   for n, h in ((40, num_heads), (70, num_kv_heads), (70, num_kv_heads)))
        scale = head_dim ** -0.5
        try:
            err = (kernel.prefill(q, k, v, scale).float() - _reference(q, k, v, scale)).abs()
        except RuntimeError as e:  # a shape this build does not support
            log.info("vLLM's CPU attention kernel cannot serve head_dim %d (%s): SDPA",
                     head_dim, e)
            return None
        return kernel if float(err.max()) <= PROBE_TOLERANCE else None

    # -- a paged cache ----------------------------------------------------------------------------
    def new_cache(self, num_blocks: int, layers: int = 1, dtype: torch.dtype = torch.bfloat16
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Key and value caches ``[layers, num_blocks, KV, BLOCK, D]`` (views of one tensor,
        the kernel's layout), zeroed: a block's unused slots are read with weight 0, and NaN
        garbage there would leak into the output."""
        cache = torch.zeros(layers, num_blocks, self.num_kv_heads, 2 * BLOCK, self.head_dim,
                            dtype=dtype)
        k, v = cache.chunk(2, dim=3)
        return k, v

    def write(self, k: torch.Tensor, v: torch.Tensor, key_cache: torch.Tensor,
              value_cache: torch.Tensor, slots: torch.Tensor) -> None:
        """Store ``k, v [N, KV, D]`` at cache slots ``slots [N]`` (int64; slot ``s`` is
        position ``s % BLOCK`` of block ``s // BLOCK``) of one layer's caches."""
        self._ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, self.isa,
                                             1.0, 1.0, "auto")

    def metadata(self, query_start: torch.Tensor, seq_lens: torch.Tensor,
                 dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The kernel's work split for a batch (same for every layer): sequence ``b``'s
        queries are rows ``query_start[b] .. query_start[b + 1] - 1``, the last of its
        ``seq_lens[b]`` positions (int32 both)."""
        return self._ops.get_scheduler_metadata(
            len(seq_lens), self.num_heads, self.num_kv_heads, self.head_dim, seq_lens, dtype,
            query_start, True, -1, self.isa, False, None, "auto")

    def attend(self, q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               query_start: torch.Tensor, seq_lens: torch.Tensor, table: torch.Tensor,
               meta: torch.Tensor, scale: float) -> torch.Tensor:
        """Causal attention of ``q [N, H, D]`` (the batch's rows, ``metadata``'s split) over one
        layer's caches, sequence ``b``'s blocks in ``table[b]`` (int32). Returns ``[N, H * D]``.
        """
        out = torch.empty_like(q)
        self._ops.cpu_attention_with_kv_cache(
            q.contiguous(), key_cache, value_cache, out, query_start, seq_lens, scale, True,
            None, -1, table, 0.0, meta, None, None, 1.0, 1.0, "auto")
        return out.view(q.shape[0], -1)

    # -- prefill ----------------------------------------------------------------------------------
    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                q_pos: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of ``q [Nq, H, D]`` over a context whose keys and values ``k, v [T, KV,
        D]`` sit at positions ``0 .. T-1``; query ``j`` sits at position ``q_pos[j]`` (strictly
        ascending, below ``T``; default the last ``Nq`` positions) and sees keys ``0 ..
        q_pos[j]``. bf16 only. Returns ``[Nq, H * D]``.

        Scattered queries (a prefill after segment reuse or context shift: the recomputed
        tokens between reused spans) become one kernel sequence per run of consecutive
        positions, every run over the same scratch blocks: run ``a .. b`` is the last ``b - a +
        1`` queries of a ``b + 1``-token sequence, which is exactly its causal view."""
        nq, t = q.shape[0], k.shape[0]
        nb = -(-t // BLOCK)
        kc, vc = self.new_cache(nb, dtype=k.dtype)
        self.write(k, v, kc[0], vc[0], torch.arange(t, dtype=torch.int64))
        if q_pos is None:
            query_start = torch.tensor([0, nq], dtype=torch.int32)
            lens = torch.tensor([t], dtype=torch.int32)
        else:
            ends = torch.nonzero(q_pos[1:] != q_pos[:-1] + 1).flatten() + 1  # a run's end row
            bounds = torch.cat([ends, torch.tensor([nq])])
            query_start = torch.cat([torch.zeros(1, dtype=torch.int64), bounds]).to(torch.int32)
            lens = (q_pos[bounds - 1] + 1).to(torch.int32)
        table = torch.arange(nb, dtype=torch.int32).expand(len(lens), nb).contiguous()
        return self.attend(q, kc[0], vc[0], query_start, lens, table,
                           self.metadata(query_start, lens, q.dtype), scale)
