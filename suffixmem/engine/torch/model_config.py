"""The shape of a Llama-family model, read from a transformers ``config.json``: what the torch
engine sizes its KV pool and its forward by, and the one place that refuses what the forward
does not implement (other RoPE types, biases, activations), so a wrong model fails at load with
one line instead of producing wrong text."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suffixmem.errors import ModelError

__all__ = ["ModelConfig", "read_config", "stop_token_ids"]


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """The shape of a Llama-family model (read from a transformers ``config.json``)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 8192

    @property
    def n_rep(self) -> int:
        """Query heads per key/value head."""
        return self.num_heads // self.num_kv_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers, in elements (multiply by the dtype size)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        """From a transformers config dict (``config.json``); rejects what we do not implement."""
        arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
        if cfg.get("model_type", "llama") != "llama" and arch != "LlamaForCausalLM":
            raise ModelError(f"the torch engine runs Llama-family models, not {arch}")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ModelError(f"RoPE type {rope_type!r} is not supported by the torch engine")
        if cfg.get("attention_bias") or cfg.get("mlp_bias"):
            raise ModelError("attention/MLP biases are not supported by the torch engine")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ModelError(f"activation {cfg.get('hidden_act')!r} is not supported")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        return cls(
            num_layers=int(cfg["num_hidden_layers"]),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            rope_theta=float(theta),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 8192)),
        )


def read_config(folder: str | Path) -> ModelConfig:
    """The ``ModelConfig`` of a transformers model folder (reads ``config.json`` only)."""
    path = Path(folder) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"cannot read {path}: {e}") from e
    return ModelConfig.from_hf(cfg)


def stop_token_ids(folder: str | Path, eos_token_id: int | None) -> frozenset[int]:
    """The tokens that end a reply: the tokenizer's eos and every eos of the folder's
    ``generation_config.json`` (chat models often list the turn-end token there only)."""
    ids = {eos_token_id}
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(str(folder)).eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    except OSError:  # no generation_config.json: the tokenizer's eos is enough
        pass
    return frozenset(int(i) for i in ids if i is not None)
