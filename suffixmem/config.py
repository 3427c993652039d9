"""Process-wide locations and validated engine configuration."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suffixmem.errors import ConfigError

DEFAULT_MODEL = "smollm2-135m-instruct"
ENGINES = ("vllm", "torch", "remote")

def suffixmem_home() -> Path:
    """Where models and the default database live: ``$SUFFIXMEM_HOME`` or the user cache dir.

    The folder is created if missing. Raises ``ConfigError`` (one line) when it is a file, cannot
    be created, or is not writable, so that no command gets as far as a traceback over it.
    """
    env = os.environ.get("SUFFIXMEM_HOME")
    if env:
        home, name = Path(env).expanduser(), f"SUFFIXMEM_HOME={env}"
    else:
        from platformdirs import user_cache_dir

        home = Path(user_cache_dir("suffixmem"))
        name = f"the suffixmem cache folder {home}"
    if home.exists() and not home.is_dir():
        raise ConfigError(f"{name} is a file, not a folder; set SUFFIXMEM_HOME to a folder")
    try:
        # 0700 when new: it holds every conversation (the database) and their KV
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"{name} cannot be created ({e.strerror or e}); set SUFFIXMEM_HOME to a writable "
            "folder") from None
    if not os.access(home, os.W_OK | os.X_OK):
        raise ConfigError(f"{name} is not writable; set SUFFIXMEM_HOME to a writable folder")
    return home

_SCALARS: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def check_field_types(config: Any) -> None:
    """Each scalar field of the dataclass ``config`` (``int``, ``float``, ``bool``, ``str``,
    each optionally ``| None``) holds its type, else a one-line ``ConfigError`` naming it: a
    string or a float where an integer belongs reached torch or vLLM and failed there, as a
    ``TypeError`` naming no field or a pydantic error of several lines. A bool is no number;
    a float must be finite."""
    import math
    from dataclasses import fields

    for f in fields(config):
        kinds = [k.strip() for k in str(f.type).split("|")]
        optional = "None" in kinds
        kinds = [k for k in kinds if k != "None"]
        if len(kinds) != 1 or kinds[0] not in _SCALARS:
            continue
        value = getattr(config, f.name)
        if value is None and optional:
            continue
        want = _SCALARS[kinds[0]]
        if (not isinstance(value, want) or (isinstance(value, bool) and bool not in want)
                or (isinstance(value, float) and not math.isfinite(value))):
            kind = {"int": "an integer", "float": "a finite number", "bool": "True or False",
                    "str": "a string"}[kinds[0]]
            raise ConfigError(f"{f.name} must be {kind}{' or None' if optional else ''}, "
                              f"got {value!r}")


def kv_tier_dir(configured: str | None = None) -> Path:
    """Where the KV tier keeps its files: ``configured``, else ``$SUFFIXMEM_HOME/kv``."""
    return Path(configured).expanduser() if configured else suffixmem_home() / "kv"

def default_database_url() -> str:
    """SQLite file under ``suffixmem_home()``, unless ``$SUFFIXMEM_DATABASE_URL`` is set."""
    env = os.environ.get("SUFFIXMEM_DATABASE_URL")
    if env:
        return env
    return f"sqlite:///{suffixmem_home() / 'suffixmem.db'}"

def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, for messages and logs; works on URLs that
    SQLAlchemy cannot parse too (everything between ``user:`` and the last ``@``)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return re.sub(r"(://[^/@:]*:).*@", r"\1***@", url)

def database_url(url: str | None = None) -> str:
    """The database URL to use: ``url``, else ``default_database_url()``; checked to parse.

    Raises ``ConfigError`` naming the URL with its password masked (never echoed in clear).
    """
    from sqlalchemy.engine import make_url

    raw = default_database_url() if url is None else url
    try:
        make_url(raw)
    except Exception:
        raise ConfigError(
            f"cannot parse the database URL {mask_url(raw)!r}; expected "
            "dialect+driver://user:password@host:port/database or sqlite:///path") from None
    return raw

def cuda_available() -> bool:
    """True when a CUDA device is usable (imports torch)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch ships with every engine extra
        return False
    return bool(torch.cuda.is_available())

def resolve_dtype(dtype: str) -> str:
    """``auto`` -> ``bfloat16`` where bf16 products run natively (CUDA, or a CPU with AVX-512
    BF16), ``float32`` elsewhere; any other name unchanged."""
    if dtype != "auto":
        return dtype
    import torch

    if cuda_available() or torch.cpu._is_avx512_bf16_supported():
        return "bfloat16"
    return "float32"


@dataclass(slots=True)
class EngineConfig:
    """Options shared by all engines. ``None`` means "pick a sane default for this device".

    - ``block_size``: KV block size in tokens. vLLM on CPU needs a multiple of 32 (default 32);
      on CUDA 16. The torch engine defaults to 16.
    - ``kv_cache_gib``: KV pool size in GiB.
    - ``dtype``: ``auto`` (default), ``bfloat16``, ``float32`` or ``float16`` (CUDA only).
      ``auto`` resolves at construction (``resolve_dtype``): ``bfloat16`` on CUDA and on CPUs
      with AVX-512 BF16, ``float32`` on other CPUs, where bf16 products are emulated and both
      engines ran ~2.5x slower in bf16 than in fp32 (an AVX2-only host, docs/torch-engine.md).
    - ``segment_reuse``: (torch engine, default on) keep a segment cache so that marked
      segments of a prompt (``Request.segments``) are reused at new positions when a request
      sets ``exact=False``; exact requests are never affected. The conversation manager sends
      such requests by default only for the workload classes whose quality gate passed
      (``ManagerConfig.rag_reuse``, ``context_shift``; docs/segment-reuse.md "Defaults").
    - ``segment_method``: (torch engine) the recompute method of segment reuse, a
      ``BlendConfig`` label (``k16``, ``k16-q0.4``, ``k16-p0.1``;
      ``suffixmem.engine.reuse.blend``); ``None``: the served dtype's method
      (``blend.default_blend``: ``k16-p0.2`` in fp32, whose rag gate passed; ``k16-q0.4`` in
      bf16, whose gate passed on two hosts of three, so bf16 turns are exact by default).
      Context shift alone keeps its own method. docs/segment-reuse.md measures each.
    - ``context_shift``: (torch engine, default on) when a request with ``exact=False`` drops a
      session's old turns, its kept turns' KV is reused at their new positions (RoPE
      re-rotation; ``suffixmem.engine.reuse.context_shift``). On by default: ``bench segments``'
      gate passes on the overflow workload's real eviction turns (docs/segment-reuse.md);
      exact requests are never affected. The vLLM engine has no such hook and ignores it.
    - ``kv_tier``: keep KV blocks that leave the pool on disk and load them back when their
      session returns, also after a restart (see docs/kv-tier.md). ``kv_tier_dir`` (default
      ``$SUFFIXMEM_HOME/kv``), ``kv_tier_gib`` (byte budget) and ``kv_tier_policy`` (a
      ``suffixmem.retention`` policy name) configure it.
    - ``isolation``: who shares prefix-cache KV (``suffixmem.engine.isolation``): ``session``
      (default, nothing shared between sessions), ``public-prefix`` (torch engine: the shared
      system prompt's blocks are shared by the ``tenant``'s sessions, history stays per
      session) or ``app`` (every block shared by the ``tenant``'s sessions).
    """

    model: str = DEFAULT_MODEL
    max_model_len: int = 8192
    max_num_seqs: int = 16
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    kv_cache_gib: float = 1.0
    dtype: str = "auto"
    enforce_eager: bool | None = None
    seed: int = 0
    segment_reuse: bool = True
    segment_method: str | None = None
    context_shift: bool = True
    kv_tier: bool = False
    kv_tier_dir: str | None = None
    kv_tier_gib: float = 4.0
    kv_tier_policy: str = "pinned-lru"
    isolation: str = "session"
    tenant: str = "default"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.max_model_len < 32:
            raise ConfigError(f"max_model_len must be >= 32, got {self.max_model_len}")
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.block_size is not None and (
            isinstance(self.block_size, bool) or self.block_size < 1
        ):
            raise ConfigError(f"block_size must be a positive integer, got {self.block_size!r}")
        if self.kv_cache_gib <= 0:
            raise ConfigError(f"kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ConfigError("max_num_batched_tokens must be >= 1, got "
                              f"{self.max_num_batched_tokens}")
        if self.kv_tier:
            folder = kv_tier_dir(self.kv_tier_dir)
            try:  # before a model loads: the tier made its folders only after
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError(f"kv_tier_dir {str(folder)!r} cannot be used: "
                                  f"{e.strerror or e}") from None
        if isinstance(self.kv_tier_gib, bool) or not self.kv_tier_gib > 0:
            raise ConfigError(f"kv_tier_gib must be > 0, got {self.kv_tier_gib!r}")
        if self.dtype not in ("auto", "bfloat16", "float32", "float16"):
            raise ConfigError(f"unknown dtype {self.dtype!r}; expected 'auto', 'bfloat16', "
                              "'float32' or 'float16'")
        # resolved here, so fingerprints, stats and the KV tier name the dtype actually used
        self.dtype = resolve_dtype(self.dtype)
        if self.segment_method is not None:
            from suffixmem.engine.reuse.blend import BlendConfig

            BlendConfig.parse(self.segment_method)  # raises ConfigError naming the label
        from suffixmem.engine.isolation import IsolationPolicy

        IsolationPolicy.from_config(self)  # raises ConfigError naming the field
