"""Typed checks for values that cross the engine boundary (issue 18).

Each raises ``InvalidRequestError`` with one line that names the field; strings must be valid
Unicode (no lone surrogates) without NUL, numbers real numbers (never ``str`` or ``bool``).
"""

from __future__ import annotations

from suffixmem.errors import InvalidRequestError

MAX_SEED = 2**63 - 1
# OpenAI's range, and vLLM's: one range on every engine and surface (a session's semantic
# temperature range too, or a range above it would fail every turn)
MAX_TEMPERATURE = 2.0
MAX_SESSION_KEY_CHARS = 256


def check_text(what: str, value: object) -> str:
    """``value`` if it is a ``str`` of valid Unicode (no lone surrogates) without NUL."""
    if not isinstance(value, str):
        raise InvalidRequestError(f"{what} must be a string, got {type(value).__name__}")
    if "\x00" in value:
        raise InvalidRequestError(f"{what} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(
            f"{what} is not valid Unicode (lone surrogate at index {e.start})") from None
    return value


def check_session_key(key: object) -> str:
    """A session key: a non-empty string of valid Unicode, no NUL, at most 256 characters."""
    if not isinstance(key, str) or not key:
        raise InvalidRequestError("session_key must be a non-empty string")
    if len(key) > MAX_SESSION_KEY_CHARS:
        raise InvalidRequestError(
            f"session_key is {len(key)} characters long; the limit is {MAX_SESSION_KEY_CHARS}")
    return check_text("session_key", key)


def real_number(what: str, value: object, lo: float, hi: float) -> float:
    """``value`` as a float in ``[lo, hi]``; a str, bool, NaN or other type is refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(f"{what} must be a number, got {value!r}")
    x = float(value)
    if not lo <= x <= hi:  # also false for NaN
        raise InvalidRequestError(f"{what} must be in [{lo:g}, {hi:g}], got {value!r}")
    return x


def integer(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{what} must be an integer, got {value!r}")
    return value
