"""Our Llama forward against transformers' ``LlamaForCausalLM``, and the RoPE helpers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from suffixmem.engine.torch.llama import Llama, ModelConfig, rms_norm
from suffixmem.engine.torch.rope import (
    RE_ROTATE_ROWS,
    RopeTable,
    apply_rope,
    cos_sin,
    rerotate,
    rope_signed,
    rope_with,
)
from suffixmem.errors import ModelError
from tests.engine.torch.conftest import rerun_without_amx


def hf_logits(hf: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return hf(ids[None]).logits[0].float()


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_forward_matches_transformers(make_tiny: Any, tied: bool) -> None:
    hf, ours = make_tiny(seed=1, tie_word_embeddings=tied)
    ids = torch.randint(0, 256, (70,))
    diff = (ours.forward(ids).float() - hf_logits(hf, ids)).abs().max().item()
    assert diff <= 1e-5
    assert (ours.lm_head is ours.embed_tokens) == tied


def test_loads_the_first_layers_for_their_hidden_states(tiny: Any, tmp_path: Path) -> None:
    """``from_pretrained(num_layers=n)`` reads only n decoder layers; ``hidden`` is then
    transformers' n-th hidden state after the final norm. ``pack_head=False`` changes no
    logit."""
    hf, ours = tiny
    hf.save_pretrained(tmp_path)
    ids = torch.randint(0, 256, (30,))
    cut = Llama.from_pretrained(tmp_path, torch.float32, num_layers=2)
    assert len(cut.layers) == cut.config.num_layers == 2
    with torch.inference_mode():
        states = hf(ids[None], output_hidden_states=True).hidden_states
        want = hf.model.norm(states[2][0])
    assert (cut.hidden(ids) - want).abs().max().item() <= 1e-5
    whole = Llama.from_pretrained(tmp_path, torch.float32, pack_head=False)
    assert torch.equal(whole.forward(ids), ours.forward(ids))
    for bad in (0, 4):
        with pytest.raises(ModelError, match="num_layers must be in"):
            Llama.from_pretrained(tmp_path, torch.float32, num_layers=bad)


def test_config_from_transformers(tiny: Any) -> None:
    hf, ours = tiny
    c = ours.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (3, 64, 4, 2,
                                                                                      16)
    assert (c.n_rep, c.rope_theta, c.vocab_size) == (2, 10000.0, 256)
    with pytest.raises(ModelError, match="RoPE type"):
        ModelConfig.from_hf({**hf.config.to_dict(),
                             "rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}})


def test_attention_is_causal_by_position_not_by_index(tiny: Any) -> None:
    """Feeding the same tokens in a shuffled row order, each with its position, gives each
    token the same logits: only positions decide what a query sees."""
    _, ours = tiny
    ids = torch.randint(0, 256, (40,))
    pos = torch.arange(40)
    ref = ours.forward(ids, pos)
    perm = torch.randperm(40)
    shuffled = ours.forward(ids[perm], pos[perm])
    assert (shuffled - ref[perm]).abs().max().item() <= 1e-5
    # non-contiguous positions: a gap shifts RoPE phases but attention stays well defined
    gap = torch.cat([torch.arange(10), torch.arange(50, 80)])
    out = ours.forward(ids, gap)
    assert torch.isfinite(out).all()
    assert (out[:10] - ref[:10]).abs().max().item() <= 1e-5  # before the gap: unchanged
    assert (out[10:] - ref[10:]).abs().max().item() > 1e-3  # after it: other phases


def test_layer_primitives_compose_to_forward(tiny: Any) -> None:
    hf, ours = tiny
    ids = torch.randint(0, 256, (33,))
    pos = torch.arange(33)
    h = ours.embed(ids)
    for i in range(ours.config.num_layers):
        q, k, v = ours.qkv(i, h, pos)
        assert q.shape == (33, 4, 16) and k.shape == (33, 2, 16) and v.shape == (33, 2, 16)
        out = ours.attend(q, k, v, pos, pos)
        assert out.shape == (33, 64)
        # the same attention by explicit masks, one query at a time over its visible keys
        for j in (0, 5, 32):
            one = ours.attend(q[j:j + 1], k[:j + 1], v[:j + 1], pos[j:j + 1], pos[:j + 1])
            assert (one - out[j:j + 1]).abs().max().item() <= 1e-5
        h = ours.finish(i, h, out)
    assert (ours.logits(h) - hf_logits(hf, ids)).abs().max().item() <= 1e-5


def test_attention_entropy(tiny: Any) -> None:
    _, ours = tiny
    ids = torch.randint(0, 256, (50,))
    pos = torch.arange(50)
    h = ours.embed(ids)
    q, k, v = ours.qkv(0, h, pos)
    sdpa = ours.attend(q, k, v, pos, pos)
    out, ent = ours.attend(q, k, v, pos, pos, entropy=True)
    assert (out - sdpa).abs().max().item() <= 1e-5  # same attention, explicit softmax
    assert ent.shape == (50,)
    assert ent[0].item() == 0.0  # one visible key
    assert bool(((ent >= 0) & (ent <= 1 + 1e-6)).all())
    # a zero query attends uniformly: entropy exactly log(n) / log(n) = 1
    _, flat = ours.attend(torch.zeros_like(q), k, v, pos, pos, entropy=True)
    assert torch.allclose(flat[1:], torch.ones(49), atol=1e-5)
    # reference: entropy of the explicit softmax of head 0 for the last query, averaged
    kr = k.repeat_interleave(2, dim=1)
    probs = torch.softmax((q[-1] * kr).sum(-1).T * ours.scale, dim=-1)  # [H, 50]
    expect = (-(probs * probs.log()).sum(-1) / torch.log(torch.tensor(50.0))).mean()
    assert abs(ent[-1].item() - expect.item()) <= 1e-5


def test_rope_matches_transformers_and_rerotates(tiny: Any) -> None:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, rotate_half

    cfg = tiny[0].config
    rot = LlamaRotaryEmbedding(cfg)
    x = torch.randn(20, 3, 16)
    pos = torch.arange(100, 120)
    cos, sin = rot(x, pos[None])
    hf = x * cos[0][:, None] + rotate_half(x) * sin[0][:, None]
    assert torch.equal(apply_rope(x, pos, 10000.0), hf)
    # keys computed at p, moved by delta == keys computed at p + delta
    for delta in (7, -50, torch.arange(20) * 3):
        target = pos + delta
        moved = rerotate(apply_rope(x, pos, 10000.0), delta, 10000.0)
        assert (moved - apply_rope(x, target, 10000.0)).abs().max().item() <= 1e-4
    # bf16 keys lose at most about one rounding
    xb = apply_rope(x, pos, 10000.0).to(torch.bfloat16)
    moved = rerotate(xb, 5, 10000.0).float()
    assert (moved - apply_rope(x, pos + 5, 10000.0)).abs().max().item() <= 0.05
    assert rerotate(xb, 5, 10000.0).dtype == torch.bfloat16
    # the plain rotate-half formula in fp32, bit for bit, over several row chunks (one delta
    # for all rows and one per row)
    many = torch.randn(2 * RE_ROTATE_ROWS + 77, 3, 16).to(torch.bfloat16)
    for delta in (5, torch.arange(many.shape[0]) % 91 - 40):
        cos, sin = cos_sin(torch.tensor([5]) if isinstance(delta, int) else delta, 16, 10000.0)
        assert torch.equal(rerotate(many, delta, 10000.0),
                           rope_with(many.float(), cos, sin).to(torch.bfloat16))
    # one delta for all rows (broadcast trigonometry) == that delta given per row, bit for bit
    assert torch.equal(rerotate(xb, -37, 10000.0),
                       rerotate(xb, torch.full((20,), -37), 10000.0))


@pytest.mark.slow
def test_real_model_fp32_logits_match_transformers(model_path: Path, real_fp32: Llama,
                                                   tokenizer: Any) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
    text = ("Paged attention stores keys and values in fixed-size blocks. A block table maps "
            "each sequence to its blocks, so memory is not fragmented. ") * 6
    ids = torch.tensor(tokenizer(text)["input_ids"])
    diff = (real_fp32.forward(ids).float() - hf_logits(hf, ids)).abs().max().item()
    assert diff <= 1e-4
    cfg = json.loads((model_path / "config.json").read_text())
    assert real_fp32.config.num_layers == cfg["num_hidden_layers"]
    assert real_fp32.config.tie_word_embeddings


@pytest.mark.slow
def test_real_model_bf16_200_token_greedy_continuation_same_argmax(
        model_path: Path, hf_bf16_greedy: tuple[list[int], list[int]]) -> None:
    """transformers' 200-token greedy continuation, run through transformers' forward and ours
    (bf16 both): the same argmax at every generated position (in fact bit-identical logits;
    on an AMX host with one oneDNN kernel for both, ``rerun_without_amx``)."""
    from transformers import AutoModelForCausalLM

    if rerun_without_amx(test_real_model_bf16_200_token_greedy_continuation_same_argmax):
        return
    prompt, gen = hf_bf16_greedy
    assert len(gen) == 200
    hf = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.bfloat16).eval()
    ours = Llama.from_pretrained(model_path, torch.bfloat16)
    ids = torch.tensor(prompt + gen[:-1])
    ref = hf_logits(hf, ids)[len(prompt) - 1:]
    got = ours.forward(ids).float()[len(prompt) - 1:]
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    assert (got - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fast_rope_and_rms_norm_are_bit_identical_to_transformers(dtype: torch.dtype) -> None:
    """The hot-path RoPE (one roll, signed-sine table) and the in-place RMSNorm give exactly
    transformers' results, so exact bf16 decoding is unaffected by them."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, rotate_half

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(50, 12, 64, generator=g) * 4).to(dtype)
    pos = torch.randint(0, 4000, (50,), generator=g)
    cos, sin = cos_sin(pos, 64, 100000.0, dtype)
    hf = x * cos[:, None] + rotate_half(x) * sin[:, None]
    table = RopeTable(64, 100000.0, 4096, dtype)
    assert torch.equal(rope_signed(x, *table.lookup(pos)), hf)
    assert torch.equal(rope_with(x, cos, sin), hf)
    norm = LlamaRMSNorm(576, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(576, generator=g) + 0.5)
    h = (torch.randn(64, 576, generator=g) * torch.rand(64, 1, generator=g) * 30).to(dtype)
    with torch.inference_mode():
        assert torch.equal(rms_norm(h, norm.weight.detach(), 1e-5), norm(h))
    assert h.abs().sum() > 0  # the input is not modified in place (fp32: no copy is made)


@pytest.mark.parametrize("nq", [3, 40])
def test_masked_attention_paths_agree(tiny: Any, nq: int) -> None:
    """Few queries (explicit matmuls) and many (SDPA with a mask) against the explicit-softmax
    reference, for queries at the end of a longer context."""
    _, ours = tiny
    n = 60
    h = ours.embed(torch.randint(0, 256, (n,)))
    pos = torch.arange(n)
    q, k, v = ours.qkv(1, h, pos)
    got = ours.attend(q[-nq:], k, v, pos[-nq:], pos)
    ref, _ = ours.attend(q[-nq:], k, v, pos[-nq:], pos, entropy=True)
    assert (got - ref).abs().max().item() <= 1e-5
