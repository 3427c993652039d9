"""Constrained decoding for the torch engine: output that follows a JSON schema (``xgrammar``).

The request field is the one every engine reads: ``SamplingParams.json_schema`` (a dict). The
manager, ``suffixmem.tool_calls`` and the adapters set it; the vLLM engine hands it to vLLM's
structured outputs, this module to the torch engine's sampling step.

Contract:

- ``Grammars(tokenizer, vocab_size, stop_token_ids)`` is one engine's grammar compiler.
  ``guide(sampling)`` returns ``None`` for a request without ``json_schema``, else a fresh
  ``Guide`` (its own matcher state). Each schema is compiled once and cached (LRU of
  ``cache_size`` schemas, keyed by the schema's JSON text in its own key order: property order
  is part of the grammar). Call it in the caller's thread (compiling takes milliseconds to
  seconds); a schema xgrammar cannot compile raises ``InvalidRequestError`` naming
  ``json_schema``, and so does ``ignore_eos`` with a schema (a finished grammar allows only
  the end-of-sequence token, which ``ignore_eos`` would not stop on).
- ``mask_logits(guides, logits)`` sets, in place, every logit a guided row's grammar forbids
  next to ``-inf`` (``guides[i]`` is row ``i``'s ``Guide`` or ``None``: row left untouched).
  Greedy, temperature, top-k and top-p then pick among allowed tokens only.
- ``Guide.accept(token)`` advances the grammar by the sampled token; a token the grammar
  refuses raises ``RuntimeError`` (cannot happen after ``mask_logits``; the engine fails that
  request alone if it does).

The grammar is compiled as vLLM's xgrammar backend compiles it by default (any whitespace,
strict mode: no properties the schema does not name), so both engines constrain replies to the
same language. Once the JSON value is complete the grammar allows only the engine's stop
tokens, so a guided reply ends with finish reason "stop" (or "length" when ``max_tokens`` cuts
it off first). ``xgrammar`` is imported on first use; ``available()`` says whether it can be.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from suffixmem.engine.protocol import SamplingParams
from suffixmem.errors import InvalidRequestError

DEFAULT_CACHE_SIZE = 64


def available() -> bool:
    """Whether ``xgrammar`` is installed (the torch engine's ``supports_json_schema``)."""
    return importlib.util.find_spec("xgrammar") is not None


class Guide:
    """One request's grammar state (owned by the engine's driver thread)."""

    __slots__ = ("matcher",)

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def accept(self, token: int) -> None:
        """Advance by ``token`` (the token sampled for this request)."""
        if not self.matcher.accept_token(int(token)):
            raise RuntimeError(f"token {token} does not follow the request's json_schema")

    @property
    def finished(self) -> bool:
        """The grammar has accepted its end (a stop token after complete JSON)."""
        return bool(self.matcher.is_terminated())


class Grammars:
    """Compiles JSON schemas for one tokenizer and hands out ``Guide``s (see the module
    docstring). Thread-safe: ``guide`` may be called from any thread."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int],
                 cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)  # the model's logits width, not len(tokenizer)
        self.stop_token_ids = sorted(int(t) for t in stop_token_ids)
        self._compiler: Any = None
        self._lock = threading.Lock()
        # the LRU over schema texts; lru_cache's bookkeeping is thread-safe
        self._compile = functools.lru_cache(maxsize=cache_size)(self._compile_text)

    def _xgr_compiler(self) -> Any:
        # built on first use: reading the vocabulary takes about a second, and most engines
        # never see a schema
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size,
                    stop_token_ids=self.stop_token_ids)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._compiler

    def _compile_text(self, schema_text: str) -> Any:
        try:
            return self._xgr_compiler().compile_json_schema(
                schema_text, any_whitespace=True, strict_mode=True)
        except (RuntimeError, ValueError) as e:  # xgrammar's errors for unsupported schemas
            detail = " ".join(str(e).split())[:300]
            raise InvalidRequestError(f"json_schema cannot be compiled: {detail}") from None

    def compiled(self, schema: dict[str, Any]) -> Any:
        """The compiled grammar of ``schema`` (cached)."""
        try:
            text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError) as e:
            raise InvalidRequestError(f"json_schema is not JSON-serialisable: {e}") from None
        return self._compile(text)

    def cache_info(self) -> Any:
        """``functools`` cache statistics of the compiled schemas (hits, misses, size)."""
        return self._compile.cache_info()

    def guide(self, sampling: SamplingParams) -> Guide | None:
        """A fresh ``Guide`` for a request's sampling, or ``None`` without ``json_schema``."""
        if sampling.json_schema is None:
            return None
        if sampling.ignore_eos:
            raise InvalidRequestError(
                "ignore_eos cannot be combined with json_schema: a complete reply ends with "
                "the end-of-sequence token")
        import xgrammar as xgr

        return Guide(xgr.GrammarMatcher(self.compiled(sampling.json_schema)))


def mask_logits(guides: Sequence[Guide | None], logits: torch.Tensor) -> None:
    """Forbid, in place, what each guided row's grammar does not allow next (``logits [B, V]``,
    ``guides[i]`` for row ``i``). Does nothing when no row is guided."""
    rows = [i for i, g in enumerate(guides) if g is not None]
    if not rows:
        return
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(len(guides), logits.shape[-1])  # [B, ceil(V / 32)]
    for i in rows:
        guides[i].matcher.fill_next_token_bitmask(bitmask, i)  # type: ignore[union-attr]
    xgr.apply_token_bitmask_inplace(logits, bitmask, indices=rows)
