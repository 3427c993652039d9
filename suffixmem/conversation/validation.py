"""Checks at the manager's boundary (issue 18): every request is validated before anything is
planned, cached, queued or stored, and each failure is one ``InvalidRequestError`` line naming
the field. Nothing here imports the engine or the database.

- Text (messages, context blocks, system prompts, titles): a ``str``, valid Unicode (no lone
  surrogates: PostgreSQL and UTF-8 files cannot hold them), no NUL (PostgreSQL ``text`` refuses
  it *after* the whole reply was generated), at most ``max_chars`` characters.
- Session ids: non-empty, valid Unicode, no NUL, at most ``MAX_ID_LEN`` characters.
- Sampling keywords: only ``SamplingParams`` fields; ``None`` means "default" and is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

from suffixmem.engine.protocol import SamplingParams
from suffixmem.errors import InvalidRequestError

MAX_ID_LEN = 128
MAX_TEXT_CHARS = 1_000_000
SAMPLING_FIELDS = frozenset(f.name for f in fields(SamplingParams))


def check_text(field: str, value: object, *, max_chars: int = MAX_TEXT_CHARS,
               allow_empty: bool = False) -> str:
    """``value`` if it is acceptable text for ``field``; else one-line InvalidRequestError."""
    if not isinstance(value, str):
        raise InvalidRequestError(f"{field} must be a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise InvalidRequestError(
            f"{field} is too long: {len(value)} characters, the limit is {max_chars}")
    if not allow_empty and not value.strip():
        raise InvalidRequestError(f"{field} is empty")
    if "\x00" in value:
        raise InvalidRequestError(f"{field} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(
            f"{field} is not valid Unicode (lone surrogate at index {e.start})") from None
    return value


def check_session_id(session_id: object, field: str = "session_id") -> str:
    """A usable session id (see the module docstring)."""
    if not isinstance(session_id, str) or not session_id.strip():
        raise InvalidRequestError(f"{field} must be a non-empty string, got {session_id!r:.80}")
    return check_text(field, session_id, max_chars=MAX_ID_LEN)


def check_settings(owner: str, given: Mapping[str, Any], model: Any,
                   accepted: Iterable[str] = ()) -> None:
    """The keyword arguments ``given`` to a pydantic model class ``model`` (an adapter's
    constructor) are all its fields, their aliases or ``accepted`` (the framework's standard
    settings that mean nothing here, e.g. an ``api_key``): pydantic drops others silently, so
    a typo (``max_token=5``) was a setting that did nothing. Sampling values get the checks a
    call's get (``check_sampling``), so ``temperature="0.5"`` is refused here as it is per
    call, not coerced by pydantic."""
    fields = model.model_fields
    known = set(fields) | {f.alias for f in fields.values() if f.alias} | set(accepted)
    unknown = sorted(set(given) - known)
    if unknown:
        raise InvalidRequestError(
            f"{owner}: unknown setting(s) {unknown}; known: {sorted(known)}")
    try:
        check_sampling({k: v for k, v in given.items() if k in SAMPLING_FIELDS})
    except InvalidRequestError as e:
        raise InvalidRequestError(f"{owner}: {e}") from None


@contextmanager
def one_line_settings(owner: str) -> Iterator[None]:
    """Turn pydantic's multi-line ``ValidationError`` of a constructor into one
    ``InvalidRequestError`` line naming each bad field (``engine_options=[1]``, say)."""
    from pydantic import ValidationError  # the adapters' dependency, not the core's

    try:
        yield
    except ValidationError as e:
        bad = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'settings'}: {err['msg']}"
                        for err in e.errors())
        raise InvalidRequestError(f"{owner}: {bad}") from None


def check_sampling(sampling: dict[str, Any]) -> dict[str, Any]:
    """The keyword sampling values with ``None`` ("default") dropped; unknown names rejected.
    Types and ranges are checked by ``SamplingParams`` itself when the request is built."""
    unknown = set(sampling) - SAMPLING_FIELDS
    if unknown:
        raise InvalidRequestError(
            f"unknown sampling parameters {sorted(unknown)}; expected some of "
            f"{sorted(SAMPLING_FIELDS)}")
    out = {k: v for k, v in sampling.items() if v is not None}
    for name in ("temperature", "top_p"):
        v = out.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise InvalidRequestError(f"{name} must be a number, got {type(v).__name__}")
    for name in ("top_k", "max_tokens", "seed"):
        v = out.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise InvalidRequestError(f"{name} must be an integer, got {type(v).__name__}")
    seed = out.get("seed")
    if seed is not None and not 0 <= seed < 2**63:
        raise InvalidRequestError(f"seed must be in 0..2**63-1, got {seed}")
    stop = out.get("stop")
    if stop is not None:
        stops = (stop,) if isinstance(stop, str) else stop
        if not isinstance(stops, list | tuple):
            raise InvalidRequestError(f"stop must be a string or a list of strings, got "
                                      f"{type(stop).__name__}")
        for i, s in enumerate(stops):
            # "\n" is a stop sequence (LangChain's stop=["\n"]): only "" is empty here
            check_text(f"stop[{i}]", s, max_chars=1000, allow_empty=True)
            if not s:
                raise InvalidRequestError(f"stop sequences must be non-empty strings: {s!r}")
    return out
