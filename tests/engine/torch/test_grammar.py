"""Constrained decoding on the torch engine (``suffixmem/engine/torch/grammar.py``, xgrammar):
the logits mask against xgrammar's own matcher, one compilation per schema, bad input refused
in one line, greedy output equal to transformers' ``generate`` under the same grammar, guided
and free requests batched together unchanged, and tool calls from the real model that always
parse against their tool's schema, greedy and sampled."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

from suffixmem.engine.protocol import Message, Request, Result, SamplingParams
from suffixmem.engine.torch.grammar import Grammars, mask_logits
from suffixmem.errors import InvalidRequestError
from suffixmem.tool_calls import ToolSpec, parse_reply, reply_schema, tools_prompt

pytestmark = pytest.mark.slow

MULTIPLY = ToolSpec("multiply", "Multiply two whole numbers.", {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]})
CONVERT = ToolSpec("convert", "Convert a weight of flour to grams.", {
    "type": "object",
    "properties": {"amount": {"type": "number"}, "unit": {"enum": ["g", "kg", "lb"]}},
    "required": ["amount", "unit"]})
TOOLS = [MULTIPLY, CONVERT]
PARAMS = {t.name: dict(t.parameters) for t in TOOLS}


def tool_messages(question: str) -> list[Message]:
    return [Message("system", tools_prompt(TOOLS)), Message("user", question)]


def guided(engine: Any, session: str, messages: list[Message], schema: dict[str, Any] | None,
           **sampling: Any) -> Result:
    return engine.generate(Request(session, messages=messages, sampling=SamplingParams(
        json_schema=schema, **{"max_tokens": 96, **sampling})))


# -- the mask ---------------------------------------------------------------------------------
def test_mask_forbids_exactly_what_the_grammar_refuses(tokenizer: Any) -> None:
    """Rows with a guide are masked as xgrammar's matcher decides token by token; a row
    without one is left bit for bit."""
    vocab = len(tokenizer)
    grammars = Grammars(tokenizer, vocab, [tokenizer.eos_token_id])
    schema = reply_schema(TOOLS, "required")
    assert schema is not None
    start = grammars.guide(SamplingParams(json_schema=schema))
    mid = grammars.guide(SamplingParams(json_schema=schema))
    assert start is not None and mid is not None
    for tok in tokenizer.encode('{"name": "mul', add_special_tokens=False):
        mid.accept(tok)
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    mask_logits([start, None, mid], logits)
    assert torch.equal(logits[1], before[1])
    gen = torch.Generator().manual_seed(1)
    for row, guide in ((0, start), (2, mid)):
        allowed = torch.isfinite(logits[row])
        assert 0 < int(allowed.sum()) < vocab
        assert torch.equal(logits[row][allowed], before[row][allowed])
        # every allowed token, and a sample of forbidden ones, against the matcher itself
        forbidden = (~allowed).nonzero().flatten()
        sample = forbidden[torch.randperm(len(forbidden), generator=gen)[:300]]
        for tok in [*allowed.nonzero().flatten().tolist(), *sample.tolist()]:
            assert guide.matcher.fork().accept_token(tok) == bool(allowed[tok]), tok
    # after '{"name": "mul' only the rest of "multiply" (then its closing quote) can follow
    for tok in torch.isfinite(logits[2]).nonzero().flatten().tolist():
        text = tokenizer.decode([tok])
        assert text and ('tiply"'.startswith(text) or text.startswith('tiply"')), text


def test_each_schema_is_compiled_once(tokenizer: Any) -> None:
    grammars = Grammars(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    a, b = {"type": "object", "properties": {"x": {"type": "integer"}}}, \
        {"type": "object", "properties": {"x": {"type": "integer"}}}
    assert grammars.compiled(a) is grammars.compiled(b)
    # property order is part of the grammar: another order is another schema
    c = {"properties": {"x": {"type": "integer"}}, "type": "object"}
    assert grammars.compiled(c) is not grammars.compiled(a)
    info = grammars.cache_info()
    assert (info.misses, info.hits) == (2, 2)


# -- the engine -------------------------------------------------------------------------------
def test_bad_schema_and_ignore_eos_are_refused(torch_engine: Any) -> None:
    msgs = [Message("user", "Say yes or no.")]
    with pytest.raises(InvalidRequestError, match="json_schema"):
        guided(torch_engine, "bad-schema", msgs, {"type": "no-such-type"})
    with pytest.raises(InvalidRequestError, match="ignore_eos cannot be combined with "
                                                  "json_schema"):
        guided(torch_engine, "bad-eos", msgs, {"type": "boolean"}, ignore_eos=True)
    # the engine is fine afterwards, and a boolean schema gives a boolean
    out = guided(torch_engine, "good-schema", msgs, {"type": "boolean"})
    assert out.finish_reason == "stop" and json.loads(out.text) in (True, False)


def test_greedy_guided_equals_transformers_with_xgrammar(model_path: Path,
                                                          torch_engine_fp32: Any) -> None:
    """The engine's fp32 greedy reply under a tool schema is token for token what transformers'
    ``generate`` gives with xgrammar's own logits processor on the same compiled grammar."""
    from transformers import AutoModelForCausalLM
    from xgrammar.contrib.hf import LogitsProcessor

    e = torch_engine_fp32
    schema = reply_schema(TOOLS)
    assert schema is not None
    msgs = tool_messages("What is 12 times 7?")
    out = guided(e, "vs-hf", msgs, schema, max_tokens=64)
    assert out.finish_reason == "stop"

    hf = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
    prompt = torch.tensor(e.render(msgs))[None]
    with torch.inference_mode():
        ref = hf.generate(prompt, max_new_tokens=64, do_sample=False,
                          eos_token_id=sorted(e.stop_token_ids),
                          logits_processor=[LogitsProcessor(e.grammars.compiled(schema))])
    ref_ids = ref[0, prompt.shape[1]:].tolist()
    assert ref_ids[-1] in e.stop_token_ids  # the grammar ended the reply
    assert list(out.token_ids) == ref_ids[:-1]


def test_guided_and_free_requests_share_a_batch(torch_engine_fp32: Any) -> None:
    """Decoded in one batch, a guided and a free request each give what they give alone."""
    e = torch_engine_fp32
    schema = reply_schema(TOOLS, "required")
    jobs = [(tool_messages("Convert 2 lb of flour to grams."), schema),
            ([Message("user", "Write one sentence about rivers.")], None)]
    alone = [guided(e, f"mix-alone-{i}", m, s, max_tokens=48) for i, (m, s) in enumerate(jobs)]
    barrier = threading.Barrier(len(jobs))
    together: dict[int, Result] = {}

    def worker(i: int) -> None:
        barrier.wait()
        together[i] = guided(e, f"mix-together-{i}", jobs[i][0], jobs[i][1], max_tokens=48)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [together[i].token_ids for i in range(len(jobs))] == [r.token_ids for r in alone]
    assert parse_reply(alone[0].text).calls


QUESTIONS = ("What is 12 times 7?", "Convert 2 lb of flour to grams.",
             "Multiply 3 by 4, please.")


@pytest.mark.parametrize(("choice", "temperature", "seed"), [
    (None, 0.0, None), ("required", 0.0, None), (None, 0.8, 1), ("required", 1.2, 2)])
def test_tool_calls_always_parse_against_their_schema(torch_engine: Any, choice: str | None,
                                                      temperature: float, seed: int | None
                                                      ) -> None:
    """The real default model in bf16, greedy and sampled: every reply is JSON that matches the
    reply schema, and a call's arguments validate against its own tool's schema."""
    schema = reply_schema(TOOLS, choice)
    assert schema is not None
    for i, question in enumerate(QUESTIONS):
        out = guided(torch_engine, f"parse-{choice}-{seed}-{i}", tool_messages(question), schema,
                     temperature=temperature, seed=seed, max_tokens=128)
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)
        reply = parse_reply(out.text)
        assert reply.error is None
        if choice == "required":
            assert len(reply.calls) == 1
        for call in reply.calls:
            jsonschema.validate(call.arguments, PARAMS[call.name])
