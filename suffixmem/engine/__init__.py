"""Engines behind one protocol (``suffixmem.engine.protocol``).

``create_engine("vllm" | "torch", config)`` builds one; the heavy import happens here, not when
``suffixmem`` is imported. ``create_engine("remote", urls=[...])`` talks to ``vllm serve``
replicas (``suffixmem.engine.remote``); its own options (``REMOTE_OPTIONS``) are ``urls``,
``database_url`` (pins sessions to replicas in the shared session rows), ``sticky``,
``health_interval_s``, the timeouts and ``policy``; every other option is an ``EngineConfig``
field. ``check_engine`` validates a name and its options without building anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from suffixmem.config import ENGINES, EngineConfig
from suffixmem.engine.isolation import IsolationPolicy
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
        config = engine_config(options)
    elif options:
        raise ConfigError("give either config or keyword options, not both")
    return engine_class(name)(config)


def engine_class(name: str) -> type[BaseEngine]:
    """The class of the engine called ``name`` (imported now, nothing built): what
    ``create_engine`` builds, and what a name can be asked without starting one (its
    ``supports_json_schema``). ``ConfigError`` for an unknown name."""
    if name == "vllm":
        from suffixmem.engine.vllm_engine import VLLMEngine

        return VLLMEngine
    if name == "torch":
        from suffixmem.engine.torch.engine import TorchEngine

        return TorchEngine
    if name == "remote":
        from suffixmem.engine.remote import RemoteEngine

        return RemoteEngine
    raise _unknown(name)


def _unknown(name: str) -> ConfigError:
    return ConfigError(f"unknown engine {name!r}; expected one of {list(ENGINES)}")


REMOTE_OPTIONS = ("urls", "upstream", "database_url", "sticky", "health_interval_s",
                  "connect_timeout_s", "read_timeout_s", "policy")


def split_options(name: str, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the options that engine ``name`` takes itself, the ``EngineConfig`` ones) of
    ``options``: the remote engine's own are ``REMOTE_OPTIONS``; the embedded ones have none."""
    own = REMOTE_OPTIONS if name == "remote" else ()
    return ({k: v for k, v in options.items() if k in own},
            {k: v for k, v in options.items() if k not in own})


def engine_config(options: dict[str, Any]) -> EngineConfig:
    """``EngineConfig(**options)``; an option it has no field for is a one-line
    ``ConfigError`` naming it (not the constructor's ``TypeError``)."""
    known = {f.name for f in fields(EngineConfig)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"unknown engine options {unknown}; expected some of {sorted(known)}")
    return EngineConfig(**options)


def check_engine(name: str, options: Mapping[str, Any] | None = None, *,
                 model: str | None = None) -> EngineConfig:
    """Validate an engine name, its ``options`` and ``model`` as ``create_engine`` would,
    without building anything (an adapter's constructor: a typo costs nothing, not an engine
    start-up); returns the ``EngineConfig`` the engine would start with."""
    if name not in ENGINES:
        raise _unknown(name)
    options = dict(options or {})
    if model is not None:
        if "model" in options:
            raise ConfigError("the model is named twice, as model= and in the engine options;"
                              " give it once, as model=")
        options["model"] = model
    own, rest = split_options(name, options)
    if name == "remote" and not (own.get("urls") or own.get("upstream")):
        raise ConfigError("the remote engine needs urls=[...] (vLLM server base URLs)")
    config = engine_config(rest)
    IsolationPolicy.from_config(config).require(name)  # a scope this engine cannot serve
    return config


def _remote(config: EngineConfig | None, options: dict[str, Any]) -> BaseEngine:
    from suffixmem.engine.remote import RemoteEngine

    own, options = split_options("remote", options)
    urls, upstream = own.pop("urls", None), own.pop("upstream", None)
    urls = urls or upstream
    if not urls:
        raise ConfigError("the remote engine needs urls=[...] (vLLM server base URLs)")
    database_url = own.pop("database_url", None)
    if config is None:
        config = engine_config(options)
    elif options:
        raise ConfigError("give either config or keyword options, not both")
    pins = None
    if database_url is not None:
        from suffixmem.conversation.cluster import SqlPins

        pins = SqlPins(database_url)
    return RemoteEngine([urls] if isinstance(urls, str) else list(urls), config, pins=pins,
                        **own)
