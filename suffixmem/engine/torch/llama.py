"""Our own forward for the Llama family (RMSNorm, RoPE, grouped-query attention, SwiGLU, tied
embeddings), loading the same safetensors folder as transformers.

The model is exposed as *layer-level primitives* so that the model runner (paged KV) and the
segment-reuse code (KV moved to new positions) compose them freely. Shapes (``N`` tokens, ``H``
query heads, ``KV`` key/value heads, ``D`` head dim, ``E`` hidden size):

- ``embed(ids [N]) -> h [N, E]``
- ``qkv(i, h [N, E], positions [N]) -> q [N, H, D], k [N, KV, D], v [N, KV, D]``: layer ``i``'s
  input RMSNorm, the q/k/v projections, RoPE applied to ``q`` and ``k``.
- ``attend(q [Nq, H, D], k [Nk, KV, D], v [Nk, KV, D], q_pos [Nq], k_pos [Nk]) -> out [Nq, H*D]``:
  causal *by position*: the query at position ``p`` sees exactly the keys at positions ``<= p``,
  so tokens at arbitrary, non-contiguous positions work. With ``entropy=True`` it also returns
  each query's normalised attention entropy ``[Nq]`` (see ``attend``).
- ``finish(i, h [N, E], attn_out [N, H*D]) -> h [N, E]``: o_proj, residual, post-attention
  RMSNorm, SwiGLU MLP, residual.
- ``logits(h [N, E]) -> [N, vocab]``: final RMSNorm and the LM head.

Numerics follow transformers' ``LlamaForCausalLM`` operation by operation (RMSNorm in fp32 then
cast, cos/sin in fp32 then cast, SDPA) so that fp32 logits agree to ~1e-5 and bf16 greedy
decoding picks the same tokens. q/k/v and gate/up projections are fused into one matmul each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from suffixmem.engine.torch.attention import one_query
from suffixmem.engine.torch.linear import Linear, PackedLinears
from suffixmem.engine.torch.model_config import ModelConfig, read_config
from suffixmem.engine.torch.rope import cos_sin, rope_signed, signed_sin
from suffixmem.engine.torch.vllm_attention import VllmAttention
from suffixmem.errors import ModelError

__all__ = [
    "LayerLinears", "LayerWeights", "Llama", "ModelConfig", "PackedLinears", "read_config",
    "rms_norm",
]

SMALL_QUERY = 32  # up to this many queries, attention uses explicit batched matmuls


def _is_range(pos: torch.Tensor, start: int, n: int) -> bool:
    """Whether ``pos`` is exactly ``start, start + 1, ..., start + n - 1``."""
    return (pos.shape[0] == n and int(pos[0]) == start and int(pos[-1]) == start + n - 1
            and bool((pos[1:] > pos[:-1]).all()))


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer. Projection weights are ``[out, in]`` as in ``nn.Linear``."""

    input_norm: torch.Tensor  # [E]
    w_qkv: torch.Tensor  # [(H + 2 KV) D, E]: q, k, v projections stacked
    w_o: torch.Tensor  # [E, H D]
    post_norm: torch.Tensor  # [E]
    w_gate_up: torch.Tensor  # [2 I, E]: gate then up
    w_down: torch.Tensor  # [E, I]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: normalise in fp32, cast back, then scale. The same operations
    (bit-identical results), in place where that saves an allocation: it runs twice per layer
    per decode step, where op overhead dominates. (``torch.rms_norm`` is one call, but its CPU
    kernel rounds differently in bf16: not bit-identical, tested on torch 2.13.)"""
    xf = x.to(torch.float32)
    scaled = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True).add_(eps))
    return scaled.to(x.dtype).mul_(weight)


@dataclass(slots=True, frozen=True)
class LayerLinears:
    """One layer's projections bound to their weights (``PackedLinears.bind``)."""

    qkv: Linear
    o: Linear
    gate_up: Linear
    down: Linear


class Llama:
    """A Llama-family causal LM as plain tensors (no ``nn.Module``; inference only)."""

    def __init__(self, config: ModelConfig, embed_tokens: torch.Tensor,
                 layers: Sequence[LayerWeights], norm: torch.Tensor,
                 lm_head: torch.Tensor, pack_head: bool = True) -> None:
        self.config = config
        self.embed_tokens = embed_tokens  # [V, E]
        self.layers = list(layers)
        self.norm = norm  # [E]
        self.lm_head = lm_head  # [V, E]; the same tensor as embed_tokens when tied
        self.dtype = embed_tokens.dtype
        self.scale = 1.0 / math.sqrt(config.head_dim)
        self.linear = PackedLinears()
        for w in self.layers:
            for t in (w.w_qkv, w.w_o, w.w_gate_up, w.w_down):
                self.linear.pack(t)
        if pack_head:  # False: logits through F.linear, without a packed copy of the head
            self.linear.pack(self.lm_head)
        # the same products as one-argument functions, for the decode loop (decode.py)
        self.bound = [LayerLinears(self.linear.bind(w.w_qkv), self.linear.bind(w.w_o),
                                   self.linear.bind(w.w_gate_up), self.linear.bind(w.w_down))
                      for w in self.layers]
        self.lm_head_linear = self.linear.bind(self.lm_head)
        # vLLM's CPU attention kernel (bf16; ``None``: SDPA everywhere)
        self.vllm_attention = (VllmAttention.load(config.num_heads, config.num_kv_heads,
                                                  config.head_dim)
                               if self.dtype == torch.bfloat16 else None)

    # -- loading --------------------------------------------------------------------------------
    @classmethod
    def from_state_dict(cls, config: ModelConfig, state: Mapping[str, torch.Tensor],
                        dtype: torch.dtype = torch.bfloat16, pack_head: bool = True) -> Llama:
        """From transformers' parameter names (``model.layers.0.self_attn.q_proj.weight``...).
        ``pack_head``: as ``__init__``."""

        def get(name: str) -> torch.Tensor:
            try:
                return state[name].to(dtype)
            except KeyError:
                raise ModelError(f"weight {name!r} is missing from the checkpoint") from None

        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            layers.append(LayerWeights(
                input_norm=get(p + "input_layernorm.weight"),
                w_qkv=torch.cat([get(p + "self_attn.q_proj.weight"),
                                 get(p + "self_attn.k_proj.weight"),
                                 get(p + "self_attn.v_proj.weight")]).contiguous(),
                w_o=get(p + "self_attn.o_proj.weight").contiguous(),
                post_norm=get(p + "post_attention_layernorm.weight"),
                w_gate_up=torch.cat([get(p + "mlp.gate_proj.weight"),
                                     get(p + "mlp.up_proj.weight")]).contiguous(),
                w_down=get(p + "mlp.down_proj.weight").contiguous(),
            ))
        embed = get("model.embed_tokens.weight").contiguous()
        if config.tie_word_embeddings or "lm_head.weight" not in state:
            lm_head = embed
        else:
            lm_head = get("lm_head.weight").contiguous()
        return cls(config, embed, layers, get("model.norm.weight"), lm_head, pack_head)

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: torch.dtype = torch.bfloat16,
                        num_layers: int | None = None, pack_head: bool = True) -> Llama:
        """Load ``config.json`` and ``*.safetensors`` from a transformers model folder.
        ``num_layers``: read only the first that many decoder layers (for ``hidden``; the
        others are never materialised); ``pack_head``: as ``__init__``."""
        from safetensors import safe_open

        folder = Path(folder)
        config = read_config(folder)
        if num_layers is not None:
            if not 1 <= num_layers <= config.num_layers:
                raise ModelError(f"num_layers must be in [1, {config.num_layers}], got "
                                 f"{num_layers}")
            config = replace(config, num_layers=num_layers)
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ModelError(f"no .safetensors weights in {folder}")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():  # noqa: SIM118 (a safe_open handle is no mapping)
                    parts = name.split(".")  # model.layers.<i>.<...>
                    if parts[:2] != ["model", "layers"] or int(parts[2]) < config.num_layers:
                        state[name] = fh.get_tensor(name)
        return cls.from_state_dict(config, state, dtype, pack_head)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights read per forward step (the memory-bound decode floor)."""
        n = self.lm_head.numel() + self.norm.numel()
        for w in self.layers:
            n += sum(t.numel() for t in (w.input_norm, w.w_qkv, w.w_o, w.post_norm,
                                         w.w_gate_up, w.w_down))
        return n * self.lm_head.element_size()

    def flops_per_token(self, context: int = 0) -> int:
        """Matmul FLOPs of one token through the layers (lm_head excluded), plus attention
        over ``context`` keys."""
        c = self.config
        per_layer = 2 * c.hidden_size * ((c.num_heads + 2 * c.num_kv_heads) * c.head_dim
                                         + c.num_heads * c.head_dim + 3 * c.intermediate_size)
        attn = 4 * c.num_heads * c.head_dim * context
        return c.num_layers * (per_layer + attn)

    # -- the primitives -------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids [N]`` -> hidden states ``[N, E]``."""
        return self.embed_tokens[ids]

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, signed sin [N, D]`` (``rope.signed_sin``) for ``positions [N]`` in the model
        dtype (compute once per forward and pass to ``qkv`` as ``rope=``)."""
        cos, sin = cos_sin(positions, self.config.head_dim, self.config.rope_theta, self.dtype)
        return cos, signed_sin(sin)

    def qkv(self, i: int, h: torch.Tensor, positions: torch.Tensor | None = None,
            rope: tuple[torch.Tensor, torch.Tensor] | None = None,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer ``i``: ``h [N, E]`` -> ``q [N, H, D]``, ``k [N, KV, D]``, ``v [N, KV, D]``,
        with RoPE at ``positions [N]`` (or precomputed ``rope=(cos, signed sin)`` from
        ``rope()`` or ``RopeTable.lookup``) on q and k."""
        c = self.config
        w = self.layers[i]
        x = rms_norm(h, w.input_norm, c.rms_norm_eps)
        qkv = self.linear(x, w.w_qkv)  # [N, (H + 2KV) D]
        n = h.shape[0]
        qk = qkv[:, :(c.num_heads + c.num_kv_heads) * c.head_dim].view(
            n, c.num_heads + c.num_kv_heads, c.head_dim)
        v = qkv[:, (c.num_heads + c.num_kv_heads) * c.head_dim:].view(
            n, c.num_kv_heads, c.head_dim)
        if rope is None:
            if positions is None:
                raise ValueError("qkv needs positions or rope")
            rope = self.rope(positions)
        qk = rope_signed(qk, *rope)  # q and k rotated together: [N, H + KV, D]
        return qk[:, :c.num_heads], qk[:, c.num_heads:], v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               q_pos: torch.Tensor, k_pos: torch.Tensor, entropy: bool = False,
               kernel: bool = True) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention of ``q [Nq, H, D]`` over ``k, v [Nk, KV, D]``; query ``j`` sees key ``t``
        iff ``k_pos[t] <= q_pos[j]``. Returns ``out [Nq, H*D]``.

        With ``entropy=True`` returns ``(out, ent [Nq])``: per query the attention
        distribution's entropy divided by ``log(number of visible keys)`` (0..1; 0 when one key
        is visible), averaged over heads. That path uses an explicit fp32 softmax (chunked over
        queries). Otherwise, in bf16, queries at ascending positions over keys at ``0 .. Nk-1``
        (a prefill, a chunk of one, a warm turn's new tokens, the tokens recomputed between
        reused spans) go to vLLM's CPU kernel (``vllm_attention``) when it is installed and
        ``kernel`` (a query's result then mostly does not depend on which queries share the
        call: docs/torch-engine.md). Everything else runs SDPA
        (its causal fast path when the queries are exactly the keys in order: transformers' own
        call, bit for bit) or, for up to ``SMALL_QUERY`` queries, batched matmuls.
        """
        c = self.config
        nq, nk = q.shape[0], k.shape[0]
        if entropy:
            return self._attend_explicit(q, k, v, q_pos, k_pos)
        # Any count of queries. The kernel mostly gives a query the same result whichever
        # other queries share its call (a warm turn's few new tokens then equal the cold run's;
        # tested), where the batched-matmul path below for <= SMALL_QUERY queries always
        # rounded differently (a warm turn of 20 new tokens diverged from the cold run) and is
        # slower from 4 queries on (0.35 vs 0.50 ms for 32 queries over 1,100 keys, AMD EPYC
        # host). "Mostly": its key tiling depends on the query count (docs/torch-engine.md).
        if kernel and self.vllm_attention is not None and _is_range(k_pos, 0, nk):
            if _is_range(q_pos, nk - nq, nq):
                # the last nq tokens of a context at 0..nk-1: a prefill or a chunk of one
                return self.vllm_attention.prefill(q, k, v, self.scale)
            if int(q_pos[-1]) < nk and bool((q_pos[1:] > q_pos[:-1]).all()):
                # the tokens recomputed between reused spans: one kernel run per stretch (on
                # SDPA's masked path this was half of such a prefill)
                return self.vllm_attention.prefill(q, k, v, self.scale, q_pos)
        qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, Nq, D]
        kh = k.transpose(0, 1).unsqueeze(0)  # [1, KV, Nk, D]
        vh = v.transpose(0, 1).unsqueeze(0)
        if nq == nk and torch.equal(q_pos, k_pos) and (
                nq == 1 or bool((q_pos[1:] > q_pos[:-1]).all())):
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
        else:
            mask = k_pos[None, :] <= q_pos[:, None]  # [Nq, Nk]
            if nq == 1 and bool(mask.all()):
                # one query seeing everything (decode): the decode step's own attention
                packed = q.view(c.num_kv_heads, c.n_rep, c.head_dim).unsqueeze(0)
                return one_query(packed, kh, vh)
            if nq <= SMALL_QUERY:
                return self._attend_small(q, k, v, mask)
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)
        return out[0].transpose(0, 1).reshape(nq, c.num_heads * c.head_dim)

    def _attend_small(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
        """A few queries over many keys (a warm turn's new tokens): two batched matmuls per KV
        head with the query heads packed as rows, softmax in fp32. On CPU this is several
        times faster than the SDPA kernels, which are tuned for many queries."""
        c = self.config
        nq = q.shape[0]
        qp = q.view(nq, c.num_kv_heads, c.n_rep, c.head_dim).permute(1, 2, 0, 3).reshape(
            c.num_kv_heads, c.n_rep * nq, c.head_dim)  # [KV, R*Nq, D], rows r-major
        scores = torch.bmm(qp, k.permute(1, 2, 0)).to(torch.float32) * self.scale  # [KV,R*Nq,Nk]
        scores = scores.masked_fill(~mask.repeat(c.n_rep, 1), float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        out = torch.bmm(probs, v.transpose(0, 1))  # [KV, R*Nq, D]
        return out.view(c.num_kv_heads, c.n_rep, nq, c.head_dim).permute(2, 0, 1, 3).reshape(
            nq, c.num_heads * c.head_dim)

    def _attend_explicit(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         q_pos: torch.Tensor, k_pos: torch.Tensor,
                         chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        kr = k.to(torch.float32).repeat_interleave(c.n_rep, dim=1).transpose(0, 1)  # [H, Nk, D]
        vr = v.to(torch.float32).repeat_interleave(c.n_rep, dim=1).transpose(0, 1)
        outs, ents = [], []
        for s in range(0, q.shape[0], chunk):
            qc = q[s:s + chunk].to(torch.float32).transpose(0, 1)  # [H, n, D]
            mask = k_pos[None, :] <= q_pos[s:s + chunk, None]  # [n, Nk]
            scores = (qc @ kr.transpose(1, 2)) * self.scale  # [H, n, Nk]
            scores = scores.masked_fill(~mask, float("-inf"))
            p = torch.softmax(scores, dim=-1)
            outs.append((p @ vr).transpose(0, 1).reshape(qc.shape[1], -1))  # [n, H D]
            ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean(0)  # [n]
            visible = mask.sum(-1).to(torch.float32)
            ents.append(torch.where(visible > 1, ent / torch.log(visible.clamp_min(2.0)),
                                    torch.zeros_like(ent)))
        return torch.cat(outs).to(q.dtype), torch.cat(ents)

    def finish(self, i: int, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Layer ``i`` after attention: ``h [N, E]`` (the layer's input) plus o_proj of
        ``attn_out [N, H*D]``, then the SwiGLU MLP with its residual. Returns ``[N, E]``."""
        c = self.config
        w = self.layers[i]
        h = h + self.linear(attn_out, w.w_o)
        x = rms_norm(h, w.post_norm, c.rms_norm_eps)
        gate, up = self.linear(x, w.w_gate_up).split(c.intermediate_size, dim=-1)
        return h + self.linear(F.silu(gate) * up, w.w_down)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``h [N, E]`` -> logits ``[N, V]`` in the model dtype."""
        return self.linear(rms_norm(h, self.norm, self.config.rms_norm_eps), self.lm_head)

    # -- a dense reference forward (no cache) ---------------------------------------------------
    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None,
                entropy_layers: Sequence[int] = ()) -> torch.Tensor:
        """Logits ``[N, V]`` of every token of one sequence ``ids [N]`` at ``positions``
        (default ``0..N-1``), without any cache. Used as a reference and by tests: its
        attention is transformers' (SDPA), never the prefill kernel."""
        return self.logits(self._dense(ids, positions, entropy_layers))

    @torch.inference_mode()
    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """The output of the last loaded decoder layer after the final norm, ``[N, E]``, for
        one sequence ``ids [N]`` at positions ``0..N-1`` without any cache: transformers'
        ``last_hidden_state`` of a base model cut to these layers, bit for bit (tested)."""
        return rms_norm(self._dense(ids, None, ()), self.norm, self.config.rms_norm_eps)

    def _dense(self, ids: torch.Tensor, positions: torch.Tensor | None,
               entropy_layers: Sequence[int]) -> torch.Tensor:
        """``forward``'s layers: the residual stream ``[N, E]`` after the last layer."""
        if positions is None:
            positions = torch.arange(ids.shape[0])
        rope = self.rope(positions)
        h = self.embed(ids)
        for i in range(self.config.num_layers):
            q, k, v = self.qkv(i, h, rope=rope)
            out = self.attend(q, k, v, positions, positions, entropy=i in entropy_layers,
                              kernel=False)
            if isinstance(out, tuple):
                out = out[0]
            h = self.finish(i, h, out)
        return h
