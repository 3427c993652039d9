"""Prompts of ``bench segments``' grid: ``[varying prefix][reused segments][question]`` from
real text (chatterbot-corpus dialogues as the prefix, Python standard-library documentation as
the segments). For each prompt the segments are computed once behind one prefix (the *fill*) and
reused behind another, at other positions.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from suffixmem_bench.corpus import reference_text, stdlib_paragraphs

Encode = Callable[[str], list[int]]

SYSTEM = "You are a helpful assistant. Answer from the documents when they are relevant."
QUESTIONS = (
    "Summarize Document {j} in one sentence.",
    "What is the main point of Document {j}?",
    "Which Python feature does Document {j} describe?",
    "Explain Document {j} to a beginner in two sentences.",
)



# -- the model's tokenizer -------------------------------------------------------------------
def model_codec(model: str) -> tuple[Path, Encode, Callable[[list[int]], str]]:
    """The model's folder and its tokenizer's ``encode`` (no special tokens) and ``decode``."""
    from transformers import AutoTokenizer

    from suffixmem.models import resolve_model

    path = resolve_model(model)
    tok = AutoTokenizer.from_pretrained(str(path))

    def encode(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def decode(ids: list[int]) -> str:
        return str(tok.decode(ids))

    return path, encode, decode


# -- real text -------------------------------------------------------------------------------
def dialogue_pairs(language: str = "english") -> list[tuple[str, str]]:
    """Question/answer pairs of every chatterbot-corpus conversation, in corpus order."""
    import chatterbot_corpus
    import yaml

    root = Path(chatterbot_corpus.__file__).parent / "data" / language
    pairs: list[tuple[str, str]] = []
    for path in sorted(root.glob("*.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for conv in data.get("conversations") or []:
            texts = [str(u).strip() for u in conv if u is not None]
            pairs.extend((texts[i], texts[i + 1]) for i in range(0, len(texts) - 1, 2)
                         if texts[i] and texts[i + 1])
    if not pairs:
        raise RuntimeError("chatterbot-corpus has no conversations installed")
    return pairs


def chatml(role: str, text: str) -> str:
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


@dataclass(slots=True, frozen=True)
class BenchPrompt:
    """One evaluated prompt (``ids`` with ``segments`` = (start, end) spans) and the ``fill``
    prompt that computed the same segments behind another prefix first."""

    ids: list[int]
    segments: tuple[tuple[int, int], ...]
    fill_ids: list[int]
    fill_segments: tuple[tuple[int, int], ...]

    @property
    def segment_share(self) -> float:
        return sum(b - a for a, b in self.segments) / len(self.ids)


def _prefix(encode: Encode, pairs: Sequence[tuple[str, str]]) -> list[int]:
    text = chatml("system", SYSTEM)
    for q, a in pairs:
        text += chatml("user", q) + chatml("assistant", a)
    return encode(text + "<|im_start|>user\n")


def build_prompts(
    encode: Encode, count: int = 6, num_segments: int = 2, segment_tokens: int = 200,
    seed: int = 0,
) -> list[BenchPrompt]:
    """``count`` prompt pairs from real text (see the module docstring). Each prefix is two
    dialogue exchanges (different ones for the fill and the evaluated prompt); segments are
    ``num_segments`` passages of about ``segment_tokens`` tokens."""
    rng = random.Random(seed)
    pairs = dialogue_pairs()
    n_paras = len(stdlib_paragraphs())
    out: list[BenchPrompt] = []
    for _ in range(count):
        docs = []
        for j in range(num_segments):
            body = reference_text(segment_tokens, lambda t: len(encode(t)),
                                  skip=rng.randrange(n_paras))
            ids = encode(f"Document {j + 1}:\n{body}\n\n")
            docs.append(ids[:segment_tokens + 40])
        j = rng.randrange(num_segments) + 1
        q_fill, q_eval = rng.sample(QUESTIONS, 2)
        variants = []
        for q in (q_fill, q_eval):
            dialogue = [pairs[rng.randrange(len(pairs))] for _ in range(2)]
            ids = _prefix(encode, dialogue)
            spans = []
            for d in docs:
                spans.append((len(ids), len(ids) + len(d)))
                ids = ids + d
            ids = ids + encode(q.format(j=j) + "<|im_end|>\n<|im_start|>assistant\n")
            variants.append((ids, tuple(spans)))
        (fill, fill_spans), (ids, spans) = variants
        out.append(BenchPrompt(ids, spans, fill, fill_spans))
    return out
