"""Engines behind one protocol (``suffixmem.engine.protocol``).

``create_engine("vllm" | "torch", config)`` builds one; the heavy import happens here, not when
``suffixmem`` is imported. ``create_engine("remote", urls=[...])`` talks to ``vllm serve``
replicas (``suffixmem.engine.remote``); its own options are ``urls``, ``database_url`` (pins
sessions to replicas in the shared session rows), ``sticky`` and ``health_interval_s``.
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
    if name == "remote":
        return _remote(config, options)
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


_REMOTE_OPTIONS = ("sticky", "health_interval_s", "connect_timeout_s", "read_timeout_s",
                   "policy")


def _remote(config: EngineConfig | None, options: dict[str, Any]) -> BaseEngine:
    from suffixmem.engine.remote import RemoteEngine

    urls = options.pop("urls", None) or options.pop("upstream", None)
    if not urls:
        raise ConfigError("the remote engine needs urls=[...] (vLLM server base URLs)")
    database_url = options.pop("database_url", None)
    kwargs = {k: options.pop(k) for k in _REMOTE_OPTIONS if k in options}
    if config is None:
        config = EngineConfig(**options)
    elif options:
        raise ConfigError("give either config or keyword options, not both")
    pins = None
    if database_url is not None:
        from suffixmem.conversation.cluster import SqlPins

        pins = SqlPins(database_url)
    return RemoteEngine([urls] if isinstance(urls, str) else list(urls), config, pins=pins,
                        **kwargs)
