"""Passages an application writes into the system prompt (LlamaIndex's
``CondensePlusContextChatEngine``): ``layout.passage_segments`` marks them, and an approximate
manager (``exact=False``) on the torch engine with segment reuse serves a passage another
session's prompt computed (``public-prefix`` scope), at its new position; an exact manager's
first turn never does. By default (``rag_reuse``, where the engine's method passed the rag
gate in its dtype) a rewritten history whose system prompt carries passages is
reused within its session (``session`` scope), and never across sessions.
Real model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from suffixmem.conversation.layout import MIN_PASSAGE_TOKENS, passage_segments
from suffixmem.conversation.manager import ConversationManager, ManagerConfig
from suffixmem.conversation.turns import TurnResult
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

    # passages are the application's text: ``public-prefix`` shares them across sessions
    eng = create_engine("torch", max_model_len=2048, kv_cache_gib=0.25, segment_reuse=True,
                        isolation="public-prefix")
    yield Recorder(eng)
    eng.close()


@pytest.fixture(scope="module")
def private_engine(model_path: Path) -> Iterator[Recorder]:
    from suffixmem.engine import create_engine

    # the defaults, in fp32 (whose default method, k16-p0.2, the assertions below name; in
    # bf16 the default is k16-q0.4: blend.default_blend)
    eng = create_engine("torch", max_model_len=2048, kv_cache_gib=0.25, dtype="float32")
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
        # (before the exact session two: its system prompt's blocks would be public, a
        # prefix-cache hit for the approximate one)
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
        blend = engine.inner.reuse.blend  # the method of the dtype served (blend.default_blend)
        rest = sum(len(s) for s in marked[1:]) - 2 * blend.first_k
        assert reused == rest - round(blend.query_ratio * rest) > 0
        assert second.cached_tokens >= reused
        assert second.text.strip()
        first = exact.complete("e2", [Message("system", system(3, 2, 0)),
                                      Message("user", "How do I read a CSV file?")],
                               temperature=0.0)
        request = engine.requests[-1]  # (sent as exact=False for context shift: no documents)
        assert not any(s.kind == "document" for s in request.segments)
        assert first.result.reused_segment_tokens == 0
    finally:
        reuse.close()
        exact.close()


QUESTIONS = (
    "I am writing a small command line tool that keeps its settings in a file; how do I "
    "turn JSON text into Python objects?",
    "And how would I list every file below a folder?",
)


def rag_turns(mgr: ConversationManager, sid: str, first: tuple[int, ...],
              second: tuple[int, ...]) -> tuple[TurnResult, TurnResult]:
    """Two turns laid out as ``CondensePlusContextChatEngine`` does: this turn's passages in the
    system prompt, then the whole history (so the second turn rewrites the first's prompt)."""
    one = mgr.complete(sid, [Message("system", system(*first)), Message("user", QUESTIONS[0])],
                       temperature=0.0)
    two = mgr.complete(sid, [Message("system", system(*second)), Message("user", QUESTIONS[0]),
                             Message("assistant", one.text), Message("user", QUESTIONS[1])],
                       temperature=0.0)
    return one, two


def test_a_rewritten_history_with_passages_is_reused_by_default_within_its_session(
        private_engine: Recorder, tmp_path: Path) -> None:
    engine = private_engine
    mgr = ConversationManager(engine, f"sqlite:///{tmp_path / 'rag.db'}",
                              ManagerConfig(detect_topics=False, max_tokens=16))
    assert mgr.rag_reuse  # the default, resolved against this fp32 engine
    off = ConversationManager(engine, f"sqlite:///{tmp_path / 'off.db'}",
                              ManagerConfig(detect_topics=False, max_tokens=16, rag_reuse=False))
    try:
        one, two = rag_turns(mgr, "s1", (0, 1, 2), (1, 2, 3))
        first, request = engine.requests[-2], engine.requests[-1]
        # the first turn is not rewritten: no passage is sent (context shift's class only)
        assert not any(s.kind == "document" for s in first.segments)
        marked = [s for s in request.segments if s.kind == "document"]
        assert not request.exact and len(marked) == 3
        # passages 1 and 2 and the history come from the first turn's sequence (context shift:
        # the first turn marked nothing, so the segment cache had nothing yet), each at its
        # new position and placed by the document method (first k recomputed)
        assert two.result.reused_segments == ()
        assert two.result.reused_segment_tokens > sum(len(s) for s in marked[:2]) // 2
        assert two.result.recomputed_tokens >= DEFAULT_BLEND.first_k
        assert two.text.strip()
        # ... and this turn stored its passages (in s1's namespace). Another session whose
        # second turn retrieves passages 0, 1, 2: the default ``session`` scope never serves
        # it s1's passages 1 and 2 (in ``public-prefix`` scope it would: the test above)
        _, other = rag_turns(mgr, "s2", (3,), (0, 1, 2))
        request = engine.requests[-1]
        assert not request.exact and sum(s.kind == "document" for s in request.segments) == 3
        assert engine.inner.reuse.cache.stats().entries >= 3
        assert other.result.reused_segments == ()
        # its history still moved by context shift: a request that marks documents is the
        # rag class, so the shifted history is placed by the document method (first k and
        # the question's picks recomputed), not by re-rotation alone
        assert other.result.reused_segment_tokens > 0
        assert other.result.recomputed_tokens >= DEFAULT_BLEND.first_k
        # s1 again: passages 1 and 2 two turns later come from the segment cache
        again = mgr.complete("s1", [Message("system", system(2, 1)),
                                    Message("user", QUESTIONS[0]), Message("assistant", one.text),
                                    Message("user", QUESTIONS[1]),
                                    Message("assistant", two.text),
                                    Message("user", "Which of the two is simpler?")],
                             temperature=0.0)
        assert again.result.reused_segments
        # with rag_reuse off the same rewritten turn is exact
        rag_turns(off, "s3", (0, 1, 2), (1, 2, 3))
        assert engine.requests[-1].exact
        assert not any(s.kind == "document" for s in engine.requests[-1].segments)
    finally:
        mgr.close()
        off.close()
