"""EngineConfig(segment_reuse=True) installs the segment cache; release_session reaches it."""

from __future__ import annotations

import pytest

from suffixmem.engine import create_engine
from suffixmem.engine.protocol import Message, Request, SamplingParams, Segment

pytestmark = pytest.mark.slow


def test_segment_reuse_switch_and_release() -> None:
    plain = create_engine("torch", max_model_len=1024, kv_cache_gib=0.1)
    try:
        assert plain.reuse is None and plain.release_session("x") == 0
    finally:
        plain.close()
    engine = create_engine("torch", max_model_len=1024, kv_cache_gib=0.1, segment_reuse=True)
    try:
        assert engine.reuse is not None
        doc = ("The json module encodes and decodes JSON. Use dumps to serialize an object to "
               "a string and loads to parse a string back into Python objects. ") * 4
        ids = engine.render([Message("user", doc)], add_generation_prompt=False)
        seg = (Segment(3, len(ids) - 2, kind="document"),)
        tail = engine.tokenize("<|im_start|>assistant\n")
        sampling = SamplingParams(max_tokens=2)
        engine.generate(Request("s1", token_ids=ids + tail, segments=seg, exact=False,
                                sampling=sampling))
        assert engine.reuse.stats().entries >= 1
        assert engine.release_session("s1") >= 1
        assert engine.reuse.stats().entries == 0
    finally:
        engine.close()
