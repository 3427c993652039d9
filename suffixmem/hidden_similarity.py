"""The served model's own similarity between two user messages: the cosine of their mean hidden
states at a middle layer.

    hidden_sim = cos(mean_t h_L(message)_t, mean_t h_L(last user message)_t)

where ``h_L`` is the output of decoder layer ``layer`` (after the model's final norm) over the
first ``max_tokens`` tokens of a text on its own, no template. The idea: two messages about one
subject read alike to the model even when they share no n-gram ("Is 16 GB really necessary?"
after "Can you recommend a laptop?"). Measured, the cosine alone ranks the conversation sets'
jumps no better than chance (ROC AUC 0.47-0.52 at layer 12, 0.47-0.56 at every layer from 8
to 30) while it separates chatterbot's topic files (0.77); as one feature of
``topic_signals.HIDDEN_MODEL`` it moves the F1 on some sets (docs/conversation.md).

Cost: one forward of ``layer`` decoder layers over at most ``max_tokens`` tokens per new
message (the last message's result is remembered). It runs on the torch engine's primitives
(``Llama.hidden``: oneDNN-prepacked bf16 weights), which give transformers' hidden states bit
for bit in about half its time: 24 tokens of the default model take ~10 ms against ~17-21 ms
through transformers (p50, bf16, 2 threads, the AMD EPYC host of 2026-12-06); a model of
an architecture the primitives do not run goes through transformers, as before. Only the
embeddings and the first ``layer`` layers are loaded, ~230 MB in bf16 for the default model
with the packed copies (no vocabulary head is packed). The weights are the served model's,
read from its local folder (no download).
``TopicDetector(gain=HiddenSimilarity(...))`` (through ``default_detector``) adds it to the
signal model (``topic_signals.HIDDEN_MODEL``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from suffixmem.errors import ConfigError


class HiddenSimilarity:
    """``sim(last_turn, message)``: the hidden-state cosine of ``message`` with the last turn's
    user message (module docstring), in [-1, 1]; 0.0 when either has no tokens.

    ``model``: a causal LM folder or a registry name, as ``resolve_model`` takes, or an already
    loaded ``(Llama, tokenizer)`` pair whose ``hidden`` is wanted (its loaded layers are the
    ones run). ``layer``: decoder layers run (the rest are not loaded);
    ``max_tokens``: tokens read of each message (its beginning names its subject). Keeps the
    vectors of the last ``remember`` texts (2.3 KB each for the default model), so that a turn
    pays one forward even when many sessions take turns. Thread-safe: one forward at a time.
    """

    feature = "hidden_sim"  # the signal model's feature this fills (topic_signals.HIDDEN_MODEL)

    def __init__(self, model: str | Path | tuple[Any, Any], *, layer: int = 12,
                 max_tokens: int = 24, dtype: str = "bfloat16", remember: int = 1024) -> None:
        if layer < 1 or max_tokens < 1 or remember < 2:
            raise ConfigError(f"layer and max_tokens must be >= 1 and remember >= 2, got "
                              f"{layer}, {max_tokens} and {remember}")
        import torch

        from suffixmem.engine.torch.kv_pool import torch_dtype

        dtype_ = torch_dtype(dtype)  # checked for a loaded pair too, as ContextGain does
        self._torch = torch
        self.decoder, self.tokenizer = (model if isinstance(model, tuple)
                                        else _load(str(model), layer, dtype_))
        self.max_tokens = max_tokens
        self._remember = remember
        self._vectors: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, last_turn: tuple[str, str], message: str) -> float:
        with self._lock:
            a, b = self._vector(message), self._vector(last_turn[0])
        if a is None or b is None:
            return 0.0
        return float(a @ b)

    def prime(self, text: str) -> None:
        """Compute and remember ``text``'s vector now (``TopicDetector.add_turn`` calls it
        after the reply), so that the next turn's call pays one forward, not two."""
        with self._lock:
            self._vector(text)

    def forget(self) -> None:
        """Drop the remembered vectors (a benchmark timing a cold session)."""
        with self._lock:
            self._vectors.clear()

    def _vector(self, text: str) -> Any:
        """The unit mean hidden state of ``text`` (None without tokens), remembered."""
        if text in self._vectors:
            self._vectors.move_to_end(text)
            return self._vectors[text]
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])[:self.max_tokens]
        vec = None
        if ids:
            torch = self._torch
            with torch.inference_mode():
                mean = self.decoder.hidden(torch.tensor(ids)).float().mean(0)
                vec = (mean / mean.norm().clamp_min(1e-6)).numpy()
        self._vectors[text] = vec
        if len(self._vectors) > self._remember:
            self._vectors.popitem(last=False)
        return vec


class _CutTransformers:
    """A transformers base model cut to its first layers, for the architectures the engine's
    primitives do not run (``Llama.from_pretrained`` refuses them): ``hidden`` as
    ``Llama.hidden``, at about twice its time."""

    def __init__(self, model: Any) -> None:
        self.model = model.eval()
        self.layers = model.layers

    def hidden(self, ids: Any) -> Any:
        return self.model(input_ids=ids[None]).last_hidden_state[0]


def _load(model: str, layer: int, dtype_: Any) -> tuple[Any, Any]:
    """(the model's first ``layer`` decoder layers, as a ``Llama`` for a Llama-family model,
    else through transformers; its tokenizer), read from the model's local folder; the layers
    past ``layer`` are never materialised."""
    from transformers import AutoConfig, AutoTokenizer

    from suffixmem.engine.torch.llama import Llama
    from suffixmem.engine.torch.model_config import read_config
    from suffixmem.errors import ModelError
    from suffixmem.models import resolve_model

    path = str(resolve_model(model, progress=False))
    config = None  # transformers' config, for a model the primitives do not run
    try:
        layers = read_config(path).num_layers
    except ModelError:  # not a Llama-family model the primitives run: transformers runs it
        config = AutoConfig.from_pretrained(path)
        layers = config.num_hidden_layers
    if layer > layers:  # before any weight or the tokenizer is read
        raise ConfigError(f"layer {layer} is past the model's {layers} layers")
    decoder = (Llama.from_pretrained(path, dtype_, num_layers=layer, pack_head=False)
               if config is None else _cut_transformers(path, config, layer, dtype_))
    return decoder, AutoTokenizer.from_pretrained(path)


def _cut_transformers(path: str, config: Any, layer: int, dtype_: Any) -> _CutTransformers:
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    config.num_hidden_layers = layer
    verbosity = hf_logging.get_verbosity()
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # the layers left out are "unused weights": meant
    hf_logging.disable_progress_bar()  # a chat's first line is not a loading bar
    try:
        return _CutTransformers(AutoModel.from_pretrained(path, config=config, dtype=dtype_))
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
