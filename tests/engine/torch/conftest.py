"""Fixtures for the torch engine: a tiny random Llama built here (fast, exact references) and
the real model loaded once per session."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch


def rerun_without_amx(test: Callable[..., Any]) -> bool:
    """On a CPU with AMX, run ``test`` again in a pytest process whose oneDNN stays at AVX-512
    BF16 and assert it passes; True when it did (the caller returns). oneDNN picks its AMX
    bf16 kernels by shape, so two computations of one product in different shapes (ours and
    transformers') differ in the last bit there; a bit-for-bit claim is for one kernel. False
    elsewhere, or inside that rerun: the caller checks in place."""
    import inspect
    import os
    import subprocess
    import sys

    if not torch.cpu._is_amx_tile_supported() or "ONEDNN_MAX_CPU_ISA" in os.environ:
        return False
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"{inspect.getfile(test)}::{test.__name__}"],
        env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, capture_output=True,
        text=True, timeout=600)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-3000:]
    return True


def tiny_hf_config(**overrides: Any) -> Any:
    from transformers import LlamaConfig

    args: dict[str, Any] = dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, attn_implementation="sdpa",
    )
    args.update(overrides)
    return LlamaConfig(**args)


def build_tiny(seed: int = 0, **overrides: Any) -> tuple[Any, Any]:
    """A random transformers ``LlamaForCausalLM`` (fp32, eval) and our ``Llama`` on its
    weights. The weights are scaled up so that attention is far from uniform."""
    from transformers import LlamaForCausalLM

    from suffixmem.engine.torch.llama import Llama, ModelConfig

    torch.manual_seed(seed)
    hf = LlamaForCausalLM(tiny_hf_config(**overrides)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.15)
    ours = Llama.from_state_dict(ModelConfig.from_hf(hf.config.to_dict()), hf.state_dict(),
                                 torch.float32)
    return hf, ours


def state_of(model: Any) -> dict[str, torch.Tensor]:
    """transformers parameter names for our model's weights (to rebuild it in another dtype:
    ``Llama.from_state_dict(model.config, state_of(model), torch.bfloat16)``)."""
    c = model.config
    state = {"model.embed_tokens.weight": model.embed_tokens, "model.norm.weight": model.norm,
             "lm_head.weight": model.lm_head}
    q, k = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    for i, w in enumerate(model.layers):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = w.input_norm
        state[p + "post_attention_layernorm.weight"] = w.post_norm
        state[p + "self_attn.q_proj.weight"] = w.w_qkv[:q]
        state[p + "self_attn.k_proj.weight"] = w.w_qkv[q:q + k]
        state[p + "self_attn.v_proj.weight"] = w.w_qkv[q + k:]
        state[p + "self_attn.o_proj.weight"] = w.w_o
        state[p + "mlp.gate_proj.weight"] = w.w_gate_up[:c.intermediate_size]
        state[p + "mlp.up_proj.weight"] = w.w_gate_up[c.intermediate_size:]
        state[p + "mlp.down_proj.weight"] = w.w_down
    return state


@pytest.fixture(scope="session")
def make_tiny() -> Callable[..., tuple[Any, Any]]:
    """``make_tiny(seed=0, **llama_config_overrides) -> (hf_model, our_llama)``."""
    return build_tiny


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    return build_tiny()


@pytest.fixture(scope="session")
def real_fp32(model_path: Path) -> Any:
    from suffixmem.engine.torch.llama import Llama

    return Llama.from_pretrained(model_path, torch.float32)


GREEDY_PROMPT = "Tell me a long story about a lighthouse keeper."
GREEDY_TOKENS = 200


@pytest.fixture(scope="session")
def hf_bf16_greedy(model_path: Path, tokenizer: Any) -> tuple[list[int], list[int]]:
    """transformers' own bf16 greedy continuation (``generate``, KV cache): ``(prompt ids,
    200 generated ids)``. Computed once per session; it is the reference for bf16 tests."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.bfloat16).eval()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": GREEDY_PROMPT}], add_generation_prompt=True,
        tokenize=True, return_dict=False)
    with torch.inference_mode():
        gen = hf.generate(torch.tensor(prompt)[None], max_new_tokens=GREEDY_TOKENS,
                          do_sample=False)[0]
    return list(prompt), gen[len(prompt):].tolist()


@pytest.fixture(scope="session")
def torch_engine(model_path: Path) -> Iterator[Any]:
    """One torch engine for the session in the default dtype (``auto``: bf16 with AVX-512 BF16,
    else fp32), prefix caching on."""
    from suffixmem.engine import create_engine

    engine = create_engine("torch", max_model_len=2048, kv_cache_gib=0.25)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def torch_engine_fp32(model_path: Path) -> Iterator[Any]:
    """An fp32 torch engine: logits exact enough for equality of greedy outputs across paths."""
    from suffixmem.engine import create_engine

    engine = create_engine("torch", max_model_len=1024, kv_cache_gib=0.25, dtype="float32")
    yield engine
    engine.close()
