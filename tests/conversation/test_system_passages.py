"""Passages an application writes into the system prompt (LlamaIndex's
``CondensePlusContextChatEngine``): ``layout.passage_segments`` marks them, and an approximate
manager (``exact=False``) on the torch engine with segment reuse serves a passage another
session's prompt computed, at its new position; an exact manager never does. Real model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from suffixmem.conversation.layout import MIN_PASSAGE_TOKENS, passage_segments
from suffixmem.conversation.manager import ConversationManager, ManagerConfig
from suffixmem.engine.protocol import Message
from suffixmem.engine.reuse.blend import DEFAULT_BLEND

from .recording import Recorder

pytestmark = [pytest.mark.slow]

PASSAGES = [
    "The json module encodes Python objects as JSON text and decodes JSON text back into "
    "dictionaries, lists, strings, numbers, booleans and None. Use json.dumps to produce a "
    "string and json.loads to parse one; json.dump and json.load work with open files.",
    "The pathlib module offers classes representing filesystem paths with semantics "
    "appropriate for different operating systems. Path objects join with the slash operator, "
    "and methods such as read_text, exists and glob replace many os.path helpers.",
    "The csv module reads and writes tabular data in comma-separated form. A reader yields "
    "one list of strings per row; DictReader maps each row onto the header line's names, and "
    "a writer quotes fields that contain the delimiter.",
    "The heapq module implements the heap queue algorithm, also known as the priority queue. "
    "heappush and heappop keep the smallest item at index zero in logarithmic time, and nlargest "
    "returns the biggest items of any iterable.",
]
TEMPLATE = """
  The following is a friendly conversation between a user and an AI assistant.
  Here are the relevant documents for the context:

  {context}

  Instruction: Based on the above documents, provide a detailed answer for the user question.
  """


def system(*indices: int) -> str:
    return TEMPLATE.format(context="\n\n".join(PASSAGES[i] for i in indices))


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[Recorder]:
    from suffixmem.engine import create_engine

    eng = create_engine("torch", max_model_len=2048, kv_cache_gib=0.25, segment_reuse=True)
    yield Recorder(eng)
    eng.close()


def test_each_passage_is_marked_where_it_lies(engine: Recorder) -> None:
    text = system(0, 1, 2)
    ids = tuple(engine.render([Message("system", text), Message("user", "Which module?")]))
    segments = passage_segments(engine, text, ids)
    assert len(segments) == 3
    assert all(s.kind == "document" and s.shared for s in segments)
    assert [s.start for s in segments] == sorted(s.start for s in segments)
    for s, passage in zip(segments, PASSAGES[:3], strict=True):
        assert len(s) >= MIN_PASSAGE_TOKENS
        # the passage's own tokens but the first (which may merge with the indentation or
        # line break before it)
        assert list(ids[s.start:s.end]) == engine.tokenize(passage)[1:]
    assert passage_segments(engine, "You are a helpful assistant.", ids) == ()
    assert passage_segments(engine, None, ids) == ()


def test_a_passage_another_session_computed_is_reused_only_when_approximate(
        engine: Recorder, tmp_path: Path) -> None:
    reuse, exact = (ConversationManager(
        engine, f"sqlite:///{tmp_path / f'{name}.db'}",
        ManagerConfig(exact=is_exact, detect_topics=False, max_tokens=16))
        for name, is_exact in (("reuse", False), ("exact", True)))
    try:
        for mgr, tag in ((reuse, "r"), (exact, "e")):
            # session one's prompt computes passages 0, 1, 2; session two's has 3, 2, 0
            mgr.complete(f"{tag}1", [Message("system", system(0, 1, 2)),
                                     Message("user", "How do I parse JSON?")], temperature=0.0)
        first = exact.complete("e2", [Message("system", system(3, 2, 0)),
                                      Message("user", "How do I read a CSV file?")],
                               temperature=0.0)
        request = engine.requests[-1]  # (sent as exact=False for context shift: no documents)
        assert not any(s.kind == "document" for s in request.segments)
        assert first.result.reused_segment_tokens == 0
        second = reuse.complete("r2", [Message("system", system(3, 2, 0)),
                                       Message("user", "How do I read a CSV file?")],
                                temperature=0.0)
        request = engine.requests[-1]
        marked = [s for s in request.segments if s.kind == "document"]
        # the three passages (the template's paragraphs are shorter than MIN_PASSAGE_TOKENS)
        assert not request.exact and len(marked) == 3
        # passages 2 and 0 come from session one's prompt: all their tokens but the
        # recomputed first ones of each (the blend's first_k) and the share the question
        # reads most (its query_ratio)
        reused = second.result.reused_segment_tokens
        rest = sum(len(s) for s in marked[1:]) - 2 * DEFAULT_BLEND.first_k
        assert reused == rest - round(DEFAULT_BLEND.query_ratio * rest) > 0
        assert second.cached_tokens >= reused
        assert second.text.strip()
    finally:
        reuse.close()
        exact.close()
