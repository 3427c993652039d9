"""The exceptions suffixmem raises. Every message names what was wrong and how to fix it.

``InvalidRequestError`` subclasses ``ValueError`` so framework adapters and callers that already
catch ``ValueError`` for bad input keep working.
"""

from __future__ import annotations


class SuffixmemError(Exception):
    """Base class of every suffixmem error."""


class InvalidRequestError(SuffixmemError, ValueError):
    """The request itself is malformed (empty message, unknown role, bad sampling values...)."""


class ContextWindowError(InvalidRequestError):
    """The prompt plus the reserved reply does not fit the model's context window."""

    def __init__(self, prompt_tokens: int, max_model_len: int, detail: str = "") -> None:
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len
        msg = (
            f"prompt of {prompt_tokens} tokens does not fit the context window of "
            f"{max_model_len} tokens"
        )
        super().__init__(f"{msg}{': ' + detail if detail else ''}")


class ConfigError(SuffixmemError, ValueError):
    """A configuration value is invalid (unknown engine, block size, dtype...)."""


class ModelError(SuffixmemError):
    """The model cannot be found, provisioned or loaded."""


class UnknownSessionError(SuffixmemError, KeyError):
    """No session with that id exists."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(session_id)

    def __str__(self) -> str:
        return f"unknown session {self.session_id!r}"


class CapacityError(SuffixmemError, RuntimeError):
    """The KV cache cannot hold the request even after evicting everything evictable."""


class EngineClosedError(SuffixmemError, RuntimeError):
    """The engine was closed; create a new one."""


class StoreError(SuffixmemError, RuntimeError):
    """The conversation store (database) cannot be reached or used."""
