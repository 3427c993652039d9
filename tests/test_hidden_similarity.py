"""The hidden-state similarity (``suffixmem.hidden_similarity``) on the real default model:
checked against the full model's own hidden states, and on what it is for (a follow-up reads
like the message before it, a new subject less so)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from suffixmem.conversation.topic import default_detector
from suffixmem.conversation.topic_signals import HIDDEN_FEATURES, HIDDEN_MODEL
from suffixmem.errors import ConfigError
from suffixmem.hidden_similarity import HiddenSimilarity

LAPTOP = ("Can you recommend a laptop for programming under 1000 dollars?",
          "Look at a ThinkPad T-series or a MacBook Air with 16 GB of RAM.")


@pytest.fixture(scope="module")
def sim(model_path: Path) -> HiddenSimilarity:
    return HiddenSimilarity(model_path, dtype="float32")


def _reference(model_path: Path, text: str, layer: int, max_tokens: int) -> torch.Tensor:
    """The unit mean of layer ``layer``'s output (then the final norm) over the text's first
    tokens, from the whole model loaded by transformers with every hidden state returned."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path))
    full = AutoModel.from_pretrained(str(model_path), dtype=torch.float32).eval()
    ids = tok(text, add_special_tokens=False)["input_ids"][:max_tokens]
    with torch.inference_mode():
        states = full(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        mean = full.norm(states[layer][0]).mean(0)
    return mean / mean.norm()


def test_equals_the_full_models_hidden_states(sim: HiddenSimilarity, model_path: Path) -> None:
    """Only ``layer`` layers are loaded, yet the vector is the full model's at that layer."""
    assert len(sim.decoder.layers) == sim.decoder.config.num_layers == 12
    message = "Is 16 GB of RAM really necessary for that?"
    got = torch.from_numpy(sim._vector(message))
    want = _reference(model_path, message, 12, sim.max_tokens)
    assert torch.allclose(got, want, atol=1e-4)
    expected = float(want @ _reference(model_path, LAPTOP[0], 12, sim.max_tokens))
    assert sim(LAPTOP, message) == pytest.approx(expected, abs=1e-4)
    assert sim(LAPTOP, LAPTOP[0]) == pytest.approx(1.0, abs=1e-5)


def test_bf16_hidden_states_are_transformers_bit_for_bit(model_path: Path) -> None:
    """The serving dtype: the engine's primitives (prepacked oneDNN products) cut to 12 layers
    give what transformers' base model cut alike gives, to the bit, so ``HIDDEN_MODEL``, fitted
    on transformers' states, reads the same features."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    bf16 = HiddenSimilarity(model_path)  # bfloat16, the default
    config = AutoConfig.from_pretrained(str(model_path))
    config.num_hidden_layers = 12
    cut = AutoModel.from_pretrained(str(model_path), config=config, dtype=torch.bfloat16).eval()
    tok = AutoTokenizer.from_pretrained(str(model_path))
    for text in (LAPTOP[0], "顺便问一下，猫也能吃吗", "ok"):
        ids = tok(text, add_special_tokens=False)["input_ids"][:bf16.max_tokens]
        with torch.inference_mode():
            want = cut(input_ids=torch.tensor([ids])).last_hidden_state[0]
        assert torch.equal(bf16.decoder.hidden(torch.tensor(ids)), want), text


def test_other_architectures_run_through_transformers(model_path: Path, tmp_path: Path) -> None:
    """A model the engine's primitives refuse (a tiny random Qwen2: attention biases) is cut
    and run by transformers instead: its vector is the full model's hidden state there."""
    import shutil

    from transformers import Qwen2Config, Qwen2Model

    for f in model_path.iterdir():  # the default model's tokenizer, for a vocabulary
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(f, tmp_path / f.name)
    torch.manual_seed(0)
    full = Qwen2Model(Qwen2Config(vocab_size=49152, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2)).eval()
    full.save_pretrained(tmp_path)
    cut = HiddenSimilarity(tmp_path, layer=2, dtype="float32")
    assert len(cut.decoder.layers) == 2
    ids = cut.tokenizer(LAPTOP[0], add_special_tokens=False)["input_ids"][:cut.max_tokens]
    with torch.inference_mode():
        states = full(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        mean = full.norm(states[2][0]).mean(0)
    got = torch.from_numpy(cut._vector(LAPTOP[0]))
    assert torch.allclose(got, mean / mean.norm(), atol=1e-5)
    with pytest.raises(ConfigError, match="past the model's 3 layers"):
        HiddenSimilarity(tmp_path, layer=4)


def test_a_follow_up_reads_closer_than_a_new_subject(sim: HiddenSimilarity) -> None:
    follow_up = sim(LAPTOP, "Is 16 GB really necessary?")
    new_subject = sim(LAPTOP, "What's the best way to store fresh basil?")
    assert -1.0 <= new_subject < follow_up <= 1.0


@contextmanager
def _counted_forwards(sim: HiddenSimilarity) -> Iterator[list[int]]:
    """One entry per forward ``sim`` runs inside the block."""
    calls: list[int] = []
    forward = sim.decoder.hidden

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return forward(*args, **kwargs)

    sim.decoder.hidden = counted  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        del sim.decoder.hidden


def test_remembers_the_last_messages(sim: HiddenSimilarity) -> None:
    """A turn runs one forward: the last user message's vector is remembered."""
    with _counted_forwards(sim) as calls:
        sim(LAPTOP, "What about battery life?")
        before = len(calls)
        sim(("What about battery life?", "12 hours."), "ok, and the ThinkPad?")
        assert len(calls) == before + 1
        assert sim(LAPTOP, "") == 0.0  # no tokens: no similarity


def test_the_detector_primes_each_turns_message(sim: HiddenSimilarity) -> None:
    """``add_turn`` (after the reply) computes the turn's message vector, so the next verdict
    runs one forward, also after a first turn, which the signal never sees; ``replay`` primes
    only the last turn's message."""
    detector = default_detector(gain=sim)
    sim.forget()
    with _counted_forwards(sim) as calls:
        state = detector.replay([])
        first = detector.observe_user(state, LAPTOP[0])
        assert first.reason == "first turn" and calls == []
        detector.add_turn(state, LAPTOP[0], LAPTOP[1], first.jump)
        assert len(calls) == 1
        second = detector.observe_user(state, "Is 16 GB really necessary for an IDE?")
        assert second.reason == "signals" and len(calls) == 2
        sim.forget()
        calls.clear()
        detector.replay([LAPTOP, ("What about battery life?", "About 12 hours.")])
        assert len(calls) == 1


def test_the_detector_pairs_it_with_its_model(sim: HiddenSimilarity) -> None:
    detector = default_detector(gain=sim)
    assert detector.model is HIDDEN_MODEL and HIDDEN_MODEL.features == HIDDEN_FEATURES
    assert HIDDEN_MODEL.weights[-1] < 0  # reading alike weighs against a jump
    state = detector.replay([LAPTOP])
    verdict = detector.observe_user(state, "Is 16 GB really necessary for an IDE?")
    assert verdict.reason == "signals" and not verdict.jump
    with pytest.raises(ConfigError, match="hidden_sim"):
        default_detector(gain=None, model=HIDDEN_MODEL)


def test_bad_settings_are_one_line_errors(model_path: Path) -> None:
    with pytest.raises(ConfigError, match="past the model's 30 layers"):
        HiddenSimilarity(model_path, layer=31)
    with pytest.raises(ConfigError, match="layer and max_tokens"):
        HiddenSimilarity(model_path, layer=0)
    with pytest.raises(ConfigError, match="unknown dtype"):
        HiddenSimilarity(model_path, dtype="float7")
    with pytest.raises(ConfigError, match="unknown dtype"):  # a loaded pair: checked the same
        HiddenSimilarity((object(), object()), dtype="float7")
