"""vLLM's CPU kernels for a decode step's elementwise work (the fast decode path).

A batch-1 decode step of a small model is its weights read once plus per-op overhead. Around its
four products, a layer of ``Decoder.step``'s transformers-identical path makes ~27 tensor ops
(two RMSNorms of eight ops each, RoPE in four, two residual adds, SiLU and the gate product),
each costing its dispatch rather than its arithmetic on a row of 576 values. vLLM's CPU library
(the one ``vllm_attention`` opens) has one kernel per group: ``fused_add_rms_norm`` (the
residual add and the next RMSNorm, in place), ``rotary_embedding`` (q and k in place, read
straight out of the fused q/k/v product) and ``silu_and_mul``: four calls per layer besides the
products and attention. On the slower AMD EPYC instance a batch-1 step at a 256-token context
went from ~27.5 to ~23 ms (docs/profile-decode.md, round 6).

They compute in fp32 and round once, where the layer primitives round after every op as
transformers does: not bit-identical (the default model's logits within ~0.25 of the
primitives', about what vLLM's attention kernel already changes). So they serve only the steps
that run that kernel too (``PagedMirror``), never ``exact_decode`` or the SDPA sources, whose
agreement with the primitives stays bit for bit. A load-time probe against the primitives in
fp32 decides whether this build serves the model's shapes.

The same steps run their products of 1-4 rows through ``gemv.Gemv`` where it builds and its fp32
probe passes (``use_gemv``): oneDNN's one-row product read the weights at about half the rate the
machine allows, so this took a batch-1 step at 256 tokens from ~24 to ~15 ms on the slower AMD
EPYC instance (docs/profile-decode.md, round 7).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from suffixmem.engine.torch.gemv import PROBE_TOLERANCE as GEMV_TOLERANCE
from suffixmem.engine.torch.gemv import Gemv
from suffixmem.engine.torch.linear import Linear
from suffixmem.engine.torch.llama import LayerLinears
from suffixmem.engine.torch.rope import RopeTable, rope_signed

if TYPE_CHECKING:
    from suffixmem.engine.torch.decode import KVSource
    from suffixmem.engine.torch.llama import Llama

log = logging.getLogger("suffixmem.engine.torch")

PROBE_TOLERANCE = 0.05  # bf16 results of unit-scale inputs: a few units in the last place
_OPS = ("rms_norm", "fused_add_rms_norm", "rotary_embedding", "silu_and_mul")


class FusedOps:
    """The fused decode step for one model (module docstring). Build with ``load``."""

    def __init__(self, model: Llama, rope: RopeTable) -> None:
        self.model = model
        half = model.config.head_dim // 2
        # vLLM's cache layout: cos then sin of each position's first half (neox style);
        # the table's signed sin holds +sin in its second half
        self.cos_sin = torch.cat([rope.cos[:, :half], rope.ssin[:, half:]], 1).contiguous()
        self._ops = torch.ops._C
        # the products: oneDNN's prepacked ones, or the GEMV kernel's (``use_gemv``)
        self.bound: list[LayerLinears] = model.bound
        self.lm_head: Linear = model.lm_head_linear
        self.gemv: Gemv | None = None

    def use_gemv(self, gemv: Gemv) -> bool:
        """Run the products of 1-4 rows through ``gemv`` (gemv.py) if its probe passes on
        every weight shape of the model; ``False`` (nothing changed) otherwise."""
        m = self.model
        w0, f0 = m.layers[0], m.bound[0]
        pairs = [(w0.w_qkv, f0.qkv), (w0.w_o, f0.o), (w0.w_gate_up, f0.gate_up),
                 (w0.w_down, f0.down), (m.lm_head, m.lm_head_linear)]
        err = max(gemv.probe(w, f) for w, f in pairs)
        if err > GEMV_TOLERANCE:
            log.info("the decode GEMV kernel disagrees with fp32 (%.3g): oneDNN's products", err)
            return False
        self.bound = [LayerLinears(gemv.bind(w.w_qkv, f.qkv), gemv.bind(w.w_o, f.o),
                                   gemv.bind(w.w_gate_up, f.gate_up),
                                   gemv.bind(w.w_down, f.down))
                      for w, f in zip(m.layers, m.bound, strict=True)]
        self.lm_head = gemv.bind(m.lm_head, m.lm_head_linear)
        self.gemv = gemv
        return True

    @classmethod
    def load(cls, model: Llama, rope: RopeTable) -> FusedOps | None:
        """The fused step for ``model``, or ``None`` where it cannot serve (no vLLM kernels
        loaded, a bf16-less model, a build that lacks an op or disagrees with the probe).
        Call after ``VllmAttention.load`` (which opens the library)."""
        if model.dtype != torch.bfloat16 or model.vllm_attention is None:
            return None
        if not all(hasattr(torch.ops._C, n) for n in _OPS):
            return None
        fused = cls(model, rope)
        try:
            err = fused._probe(rope)
        except RuntimeError as e:  # a shape or dtype this build does not support
            log.info("vLLM's fused CPU kernels cannot serve this model (%s)", e)
            return None
        if err > PROBE_TOLERANCE:
            log.info("vLLM's fused CPU kernels disagree with the primitives (%.3f): unused", err)
            return None
        gemv = Gemv.load()
        if gemv is not None:
            fused.use_gemv(gemv)
        return fused

    def _probe(self, rope: RopeTable) -> float:
        """Largest difference from the primitives (fp32 maths, RoPE from ``rope``'s own table,
        so a wrong ``cos_sin`` layout shows) on a 3-row batch whose q and k are strided views of
        one q/k/v row, as in ``step``."""
        c = self.model.config
        nh, kvh, d = c.num_heads, c.num_kv_heads, c.head_dim
        gen = torch.Generator().manual_seed(0)
        x, o = (torch.randn(3, c.hidden_size, generator=gen).to(torch.bfloat16)
                for _ in range(2))
        w = (1 + 0.1 * torch.randn(c.hidden_size, generator=gen)).to(torch.bfloat16)
        gu = torch.randn(3, 2 * c.intermediate_size, generator=gen).to(torch.bfloat16)
        qkv = torch.randn(3, (nh + 2 * kvh) * d, generator=gen).to(torch.bfloat16)
        # within the table: the kernel does not bound-check
        pos = torch.tensor([0, 7, 300]).clamp_(max=self.cos_sin.shape[0] - 1)
        eps = c.rms_norm_eps

        def norm(t: torch.Tensor) -> torch.Tensor:
            t = t.float()
            return t * torch.rsqrt(t.square().mean(-1, keepdim=True) + eps) * w.float()

        errs = []
        h, y = x.clone(), o.clone()
        self._ops.fused_add_rms_norm(y, h, w, eps)
        ref_h = x.float() + o.float()
        errs += [(h.float() - ref_h).abs().max(), (y.float() - norm(ref_h)).abs().max()]
        out = torch.empty_like(x)
        self._ops.rms_norm(out, x, w, eps)
        errs.append((out.float() - norm(x)).abs().max())
        act = torch.empty(3, c.intermediate_size, dtype=torch.bfloat16)
        self._ops.silu_and_mul(act, gu)
        g, u = gu.float().split(c.intermediate_size, -1)
        errs.append((act.float() - F.silu(g) * u).abs().max())
        qk_ref = qkv[:, :(nh + kvh) * d].float().view(3, nh + kvh, d)
        cos, ssin = rope.lookup(pos)
        ref = rope_signed(qk_ref, cos.float(), ssin.float())
        self._ops.rotary_embedding(pos, qkv[:, :nh * d], qkv[:, nh * d:(nh + kvh) * d], d,
                                   self.cos_sin, True)
        errs.append((qkv[:, :(nh + kvh) * d].float().view(3, nh + kvh, d) - ref).abs().max())
        return float(max(errs))

    def step(self, kv: KVSource, token_ids: Sequence[int], positions: torch.Tensor
             ) -> torch.Tensor:
        """``Decoder.step``'s layers with the fused kernels: logits ``[B, V]`` (fp32) of
        ``token_ids[b]`` at ``positions[b]`` (int64), attention and K/V stores by ``kv``."""
        m, c, ops = self.model, self.model.config, self._ops
        batch = len(token_ids)
        nh, kvh, d = c.num_heads, c.num_kv_heads, c.head_dim
        qd, kd = nh * d, kvh * d
        eps, layers = c.rms_norm_eps, m.layers
        x = m.embed_tokens[torch.tensor(token_ids, dtype=torch.long)]  # the residual [B, E]
        y = torch.empty_like(x)
        ops.rms_norm(y, x, layers[0].input_norm, eps)
        act = torch.empty(batch, c.intermediate_size, dtype=x.dtype)
        last = len(layers) - 1
        for i, f in enumerate(self.bound):
            qkv = f.qkv(y)  # [B, (H + 2 KV) D]
            q, k = qkv[:, :qd], qkv[:, qd:qd + kd]
            ops.rotary_embedding(positions, q, k, d, self.cos_sin, True)
            out = kv.attend(i, q.view(batch, nh, d), k.view(batch, kvh, d),
                            qkv[:, qd + kd:].view(batch, kvh, d), None)
            y = f.o(out)
            ops.fused_add_rms_norm(y, x, layers[i].post_norm, eps)  # x += y; y = norm(x)
            ops.silu_and_mul(act, f.gate_up(y))
            y = f.down(act)
            ops.fused_add_rms_norm(y, x, m.norm if i == last else layers[i + 1].input_norm,
                                   eps)
        kv.done()
        return self.lm_head(y).float()
