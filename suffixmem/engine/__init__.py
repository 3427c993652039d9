"""Engines behind one protocol (``suffixmem.engine.protocol``).

``create_engine("vllm" | "torch", config)`` builds one; the heavy import happens here, not when
``suffixmem`` is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from suffixmem.config import ENGINES, EngineConfig
from suffixmem.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from suffixmem.engine.base import BaseEngine


def create_engine(
    name: str = "vllm", config: EngineConfig | None = None, **options: Any
) -> BaseEngine:
    """Build the engine called ``name`` with ``config`` (or ``EngineConfig(**options)``)."""
    if config is None:
        config = EngineConfig(**options)
    elif options:
        raise ConfigError("give either config or keyword options, not both")
    if name == "vllm":
        from suffixmem.engine.vllm_engine import VLLMEngine

        return VLLMEngine(config)
    if name == "torch":
        from suffixmem.engine.torch.engine import TorchEngine

        return TorchEngine(config)
    raise ConfigError(f"unknown engine {name!r}; expected one of {list(ENGINES)}")
