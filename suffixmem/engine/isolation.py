"""Isolation scopes: which requests may share prefix-cache KV. One policy for every engine.

A prefix cache shares KV between requests whose block hashes are equal; the hash of every block
chains a *salt*. Who shares a salt shares KV, and can learn (from a fast first token) that another
request of that salt sent the same tokens recently: the side channel of every prefix cache.
The scope decides who shares a salt:

- ``session`` (the default, the strongest isolation): every session key is its own salt. Nothing
  is shared between sessions, so nothing can be learned about another session.
- ``public-prefix`` (torch engine): the prompt's leading *public* span, the segment the
  application marks ``shared=True`` at position 0 (the conversation manager marks the system
  prompt so), is hashed under one salt per tenant; every block after it is salted per session
  (its hash chains the public prefix's, under the session's salt). Exact: a block's KV depends
  only on the tokens up to it, so a shared system prompt's blocks are the very KV each session
  would compute. What leaks: that *some* session of the tenant used this public prompt recently,
  nothing of any session's history (it never shares a block). Only whole blocks are public: the
  block straddling the end of the public span is salted per session.
- ``app`` (one salt per application or tenant): every session of the tenant shares every block,
  history included. Exact too, the widest sharing, and the widest side channel (a session can
  probe another's history by timing). vLLM's ``cache_salt`` covers the whole block chain, so this
  is the scope between ``session`` and nothing that vLLM can offer.

Session keys never contain NUL (``Request`` validation), so the tenant salts below, which start
with NUL, can never equal a session's salt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from suffixmem.errors import ConfigError


def public_head(segments: Sequence[Any]) -> tuple[Any, ...]:
    """The segments a public prefix is made of: the ``shared`` ones starting at position 0
    (``IsolationPolicy.public_tokens``; the manager keeps them in every request for it)."""
    return tuple(s for s in segments if s.start == 0 and getattr(s, "shared", False))


Scope = Literal["session", "public-prefix", "app"]
SCOPES: tuple[str, ...] = ("session", "public-prefix", "app")
DEFAULT_SCOPE: Scope = "session"
MAX_TENANT_CHARS = 256
# the scopes each engine serves: vLLM's salt (embedded or behind ``vllm serve``) covers the
# whole block chain, so a public prefix under private blocks is the torch engine's alone
ENGINE_SCOPES: dict[str, tuple[str, ...]] = {
    "torch": SCOPES, "vllm": ("session", "app"), "remote": ("session", "app")}


@dataclass(slots=True, frozen=True)
class IsolationPolicy:
    """Validated isolation scope (see the module docstring) and the tenant it shares within."""

    scope: str = DEFAULT_SCOPE
    tenant: str = "default"

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ConfigError(f"isolation must be one of {list(SCOPES)}, got {self.scope!r}")
        if (not isinstance(self.tenant, str) or not self.tenant or "\x00" in self.tenant
                or len(self.tenant) > MAX_TENANT_CHARS):
            raise ConfigError(
                f"isolation tenant must be a non-empty string without NUL of at most "
                f"{MAX_TENANT_CHARS} characters, got {self.tenant!r}"
            )

    @classmethod
    def from_config(cls, config: Any) -> IsolationPolicy:
        """The policy of an ``EngineConfig`` (its ``isolation`` and ``tenant`` fields)."""
        return cls(getattr(config, "isolation", DEFAULT_SCOPE),
                   getattr(config, "tenant", "default"))

    def salt(self, session_key: str) -> str:
        """Salt of the request's private blocks (everything in ``session`` scope)."""
        if self.scope == "app":
            return f"\x00app:{self.tenant}"
        return session_key

    @property
    def shares_across_sessions(self) -> bool:
        """Whether what a session marks ``shared`` may serve the tenant's other sessions (the
        public prefix, and the segment cache's shared segments): every scope but ``session``."""
        return self.scope != "session"

    @property
    def public_salt(self) -> str:
        """Salt of public-prefix blocks (shared by the tenant's sessions)."""
        return f"\x00public:{self.tenant}"

    def public_tokens(self, segments: Sequence[Any], prompt_len: int) -> int:
        """How many leading prompt tokens are public: the end of the ``shared`` segment that
        starts at position 0 in ``public-prefix`` scope (capped at ``prompt_len``), else 0."""
        if self.scope != "public-prefix":
            return 0
        ends = [int(s.end) for s in public_head(segments)]
        return min(max(ends), prompt_len) if ends else 0

    def require(self, engine_name: str) -> None:
        """Raise ``ConfigError`` unless the engine serves this scope (``ENGINE_SCOPES``)."""
        supported = ENGINE_SCOPES[engine_name]
        if self.scope not in supported:
            raise ConfigError(
                f"isolation {self.scope!r} is not supported by the {engine_name} engine "
                f"(supported: {list(supported)})"
            )
