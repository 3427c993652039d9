"""The context gain (``suffixmem.context_gain``) on the real default model: checked against a
plain full-logits forward, and on what it is for (a follow-up gains, a new subject does not)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from suffixmem.context_gain import SYSTEM, ContextGain
from suffixmem.errors import ConfigError

BASIL = ("How do I keep basil alive indoors?",
         "Give it a sunny windowsill, water when the top of the soil is dry and pinch off "
         "flower buds.")


@pytest.fixture(scope="module")
def gain(model_path: Path) -> ContextGain:
    return ContextGain(model_path, dtype="float32")


def _reference(gain: ContextGain, turn: list[dict[str, str]], message: str) -> list[float]:
    """log p of the message's tokens after ``turn`` (and the system prompt): the template
    rendered as text with the message in place, one forward over it, logits of every
    position (transformers' own path, not the span-only head)."""
    tok = gain.tokenizer
    msgs = [{"role": "system", "content": SYSTEM}, *turn, {"role": "user", "content": message}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    prefix = text[:text.index(message)]
    pre = tok(prefix, add_special_tokens=False)["input_ids"]
    target = tok(message, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logits = gain.model(torch.tensor([pre + target])).logits[0].float()
    logp = logits.log_softmax(-1)
    return [logp[len(pre) - 1 + i, t].item() for i, t in enumerate(target)]


def test_gain_equals_a_full_forward_reference(gain: ContextGain) -> None:
    message = "How much sun exactly?"
    with_turn = _reference(gain, [{"role": "user", "content": BASIL[0]},
                                  {"role": "assistant", "content": BASIL[1]}], message)
    alone = _reference(gain, [], message)
    want = sum(a - b for a, b in zip(with_turn, alone, strict=True)) / len(alone)
    assert gain(BASIL, message) == pytest.approx(want, abs=1e-4)


def test_a_follow_up_gains_and_a_new_subject_does_not(gain: ContextGain) -> None:
    follow_up = gain(BASIL, "And if the leaves droop?")
    new = gain(BASIL, "What's the fastest way to get rid of hiccups?")
    assert follow_up > 0.5 and follow_up > new + 0.5


def test_limits(gain: ContextGain, model_path: Path) -> None:
    assert gain(BASIL, "") == 0.0  # no tokens: nothing to predict
    # only the message's beginning counts: a long tail after it changes nothing
    short = ContextGain((gain.model, gain.tokenizer), max_message=4)
    assert short(BASIL, "And if the leaves droop? " + "x" * 500) == pytest.approx(
        short(BASIL, "And if the leaves droop?"), abs=1e-5)
    with pytest.raises(ConfigError, match="max_context"):
        ContextGain((gain.model, gain.tokenizer), max_context=1)
    for bad in ("float12", "ones"):  # no such attribute; an attribute that is no dtype
        with pytest.raises(ConfigError, match="dtype"):
            ContextGain(model_path, dtype=bad)
