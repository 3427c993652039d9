"""By default (context_shift and segment_reuse on) the hook shifts turns and keeps the segment
cache; release_session reaches it. segment_reuse=False shifts turns but ignores document
segments; context_shift=False and segment_reuse=False install nothing."""

from __future__ import annotations

import pytest

from suffixmem.engine import create_engine
from suffixmem.engine.protocol import Message, Request, SamplingParams, Segment

pytestmark = pytest.mark.slow


def _document_request(engine, session: str) -> Request:  # type: ignore[no-untyped-def]
    doc = ("The json module encodes and decodes JSON. Use dumps to serialize an object to "
           "a string and loads to parse a string back into Python objects. ") * 4
    ids = engine.render([Message("user", doc)], add_generation_prompt=False)
    seg = (Segment(3, len(ids) - 2, kind="document"),)
    tail = engine.tokenize("<|im_start|>assistant\n")
    return Request(session, token_ids=ids + tail, segments=seg, exact=False,
                   sampling=SamplingParams(max_tokens=2))


def test_segment_reuse_switch_and_release() -> None:
    plain = create_engine("torch", max_model_len=1024, kv_cache_gib=0.1, context_shift=False,
                          segment_reuse=False)
    try:
        assert plain.reuse is None and plain.release_session("x") == 0
    finally:
        plain.close()
    shift_only = create_engine("torch", max_model_len=1024, kv_cache_gib=0.1,
                               segment_reuse=False)
    try:
        assert shift_only.reuse is not None and shift_only.reuse.shift is not None
        assert not shift_only.reuse.documents
        for _ in range(2):  # a document segment is neither stored nor reused
            out = shift_only.generate(_document_request(shift_only, "d1"))
            assert out.reused_segment_tokens == 0
        assert shift_only.reuse.stats().entries == 0 and not shift_only.reuse._stores
    finally:
        shift_only.close()
    engine = create_engine("torch", max_model_len=1024, kv_cache_gib=0.1)  # the defaults
    try:
        assert engine.reuse is not None and engine.reuse.documents
        assert engine.reuse.shift is not None
        engine.generate(_document_request(engine, "s1"))
        assert engine.reuse.stats().entries >= 1
        assert engine.release_session("s1") >= 1
        assert engine.reuse.stats().entries == 0
    finally:
        engine.close()


def test_segment_method_sets_the_documents_method_and_keeps_context_shifts() -> None:
    from suffixmem.config import EngineConfig
    from suffixmem.engine.reuse.context_shift import SHIFT_BLEND
    from suffixmem.errors import ConfigError

    with pytest.raises(ConfigError, match=r"segment reuse method 'q0\.4'"):
        EngineConfig(segment_method="q0.4")
    engine = create_engine("torch", max_model_len=1024, kv_cache_gib=0.1, segment_reuse=True,
                           segment_method="k8-p0.25")
    try:
        assert engine.reuse is not None and engine.reuse.blend.label() == "k8-p0.25"
        assert engine.reuse.shift is not None and engine.reuse.shift.blend == SHIFT_BLEND
        first = _document_request(engine, "s1")
        engine.generate(first)
        # the same document after a note: a new position, found in the segment cache
        note = engine.render([Message("user", "A note first.")], add_generation_prompt=False)
        seg = first.segments[0]
        moved = Request("s1", token_ids=[*note, *first.token_ids], exact=False,
                        segments=(Segment(seg.start + len(note), seg.end + len(note),
                                          kind="document"),),
                        sampling=SamplingParams(max_tokens=2))
        again = engine.generate(moved)
        # the first 8 tokens and the attended quarter of the rest are recomputed
        rest = len(seg) - 8
        assert again.reused_segment_tokens == rest - round(0.25 * rest)
    finally:
        engine.close()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_rag_default_follows_the_gate_of_the_method_and_dtype(dtype: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from suffixmem.conversation.manager import ConversationManager, ManagerConfig
    from suffixmem.engine.reuse.blend import default_blend

    engine = create_engine("torch", max_model_len=1024, kv_cache_gib=0.1, dtype=dtype)
    try:
        # the dtype's default method; its rag gate passed in fp32 only (in bf16 it missed
        # on one host of three), so rag turns are approximate by default in fp32 only
        assert engine.reuse.blend == default_blend(dtype)
        passes = engine.reuse_passes_gate("rag")
        assert passes == (dtype == "float32") and not engine.reuse_passes_gate("documents")
        # None (the default) asks the engine; the caller's choice wins
        for given, want in ((None, passes), (True, True), (False, False)):
            mgr = ConversationManager(engine, f"sqlite:///{tmp_path / 'm.db'}",
                                      ManagerConfig(rag_reuse=given))
            try:
                assert mgr.rag_reuse is want
            finally:
                mgr.close()
    finally:
        engine.close()
    plain = create_engine("torch", max_model_len=1024, kv_cache_gib=0.1, dtype=dtype,
                          context_shift=False, segment_reuse=False)
    try:  # no approximate reuse: nothing passes
        assert not plain.reuse_passes_gate("rag")
    finally:
        plain.close()
    if dtype != "float32":  # once is enough (each engine loads the model)
        return
    fast = create_engine("torch", max_model_len=1024, kv_cache_gib=0.1, dtype=dtype,
                         segment_method="k16")
    try:  # a method chosen for speed whose gate missed: the manager keeps rag turns exact
        assert not fast.reuse_passes_gate("rag")
        mgr = ConversationManager(fast, f"sqlite:///{tmp_path / 'f.db'}")
        try:
            assert not mgr.rag_reuse
        finally:
            mgr.close()
    finally:
        fast.close()


def test_the_driver_thread_loads_and_runs_the_model() -> None:
    # libgomp keeps an OpenMP pool per thread running parallel work: a model loaded in the
    # constructing thread and run in the driver thread gave two pools and halved decode speed
    import threading

    import torch

    eng = create_engine("torch", max_model_len=512, kv_cache_gib=0.05)
    try:
        seen: list[str] = []
        original = eng.runner.forward

        def forward(*a: object, **k: object) -> object:
            seen.append(threading.current_thread().name)
            return original(*a, **k)

        eng.runner.forward = forward  # type: ignore[method-assign]
        out = eng.generate(Request("s", messages=[Message("user", "Hi")],
                                   sampling=SamplingParams(max_tokens=3, temperature=0.0)))
        assert out.output_tokens >= 1 and set(seen) == {"suffixmem-torch"}
        assert eng.run_in_driver(lambda e: torch.get_num_threads()) == torch.get_num_threads()
    finally:
        eng.close()


def test_a_failed_load_in_the_driver_thread_reaches_the_caller() -> None:
    from suffixmem.engine.base import BaseEngine

    class Broken(BaseEngine):
        name = "broken"

        def __init__(self) -> None:
            super().__init__()

            def setup() -> None:
                raise ValueError("weights missing")

            self._start_driver("broken-driver", setup)

        for m in ("_prepare", "_stream", "stats", "_add", "_abort", "_has_work", "_step",
                  "_step_failed", "reset_prefix_cache"):
            locals()[m] = lambda self, *a: None

    import threading

    with pytest.raises(ValueError, match="weights missing"):
        Broken()
    assert not any(t.name == "broken-driver" for t in threading.enumerate())
