"""The served model's opinion on a topic jump: how much the conversation's last turn makes a new
user message more likely (its *context gain*).

    gain = mean over the message's tokens of  log p(token | last turn) - log p(token | nothing)

in nats per token, each side under the model's own chat template after one fixed system
prompt. A follow-up ("why does that work?", "and the second one?", "那第二个呢") is far more
likely after the turn it follows than on its own, so its gain is high; a message that opens a
new subject is about as likely with or without the last turn, so its gain is near zero. The
conditional probability alone carries no signal (ROC AUC ~0.5 on the natural tuning set: a
fluent new question is as likely as a follow-up); the difference does (~0.9 there, with one
previous turn as context as well as with the whole history; docs/conversation.md).

It is what TF-IDF cannot see: an elliptical follow-up shares no n-gram with the topic, a new
question in the same domain shares several. ``TopicDetector(gain=ContextGain(...))`` adds it to
the signal model (``topic_signals.GAIN_MODEL``).

Cost: two forward passes of the served model per message that reaches the signal model (the
last turn plus the message, and the message alone: at most ``max_context`` + ``max_message``
tokens), each ~0.35 ms per token plus ~18 ms of per-layer overhead on the 2-core CPU this
project measures on: 75-90 ms a message for the default model (``bench topics --context-gain``
reports it). When the semantic temperature decides a turn, that is before the engine starts,
so this is an opt-in for accuracy, not the default. The weights are the served model's, loaded
from its local folder (no download), a second copy in memory.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from suffixmem.errors import ConfigError

SYSTEM = "You are a helpful assistant."
_MARK = "\x00message\x00"  # where the message goes in the rendered template


class ContextGain:
    """``gain(last_turn, message)``: the context gain of ``message`` (module docstring).

    ``model``: a causal LM with a chat template (a transformers folder or a registry name, as
    ``resolve_model`` takes; or an already loaded ``(model, tokenizer)`` pair, for tests).
    ``max_context``/``max_message``: tokens kept of the last turn (each of its two messages
    gets half, their beginnings) and of the message (its beginning). Thread-safe: one forward
    at a time.
    """

    feature = "context_gain"  # the signal model's feature this fills (topic_signals.GAIN_MODEL)

    def __init__(self, model: str | Path | tuple[Any, Any], *, dtype: str = "bfloat16",
                 max_context: int = 160, max_message: int = 48) -> None:
        if max_context < 2 or max_message < 1:
            raise ConfigError(f"max_context must be >= 2 and max_message >= 1, got "
                              f"{max_context} and {max_message}")
        import torch

        from suffixmem.engine.torch.kv_pool import torch_dtype as parse_dtype

        torch_dtype = parse_dtype(dtype)
        if isinstance(model, tuple):
            self.model, self.tokenizer = model
        else:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from suffixmem.models import resolve_model

            path = resolve_model(str(model), progress=False)
            self.tokenizer = AutoTokenizer.from_pretrained(str(path))
            self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
        self.model.eval()
        self._decoder = self.model.get_decoder()  # the layers, without the vocabulary head
        self._head = self.model.get_output_embeddings()
        self.max_context = max_context
        self.max_message = max_message
        self._lock = threading.Lock()
        self._torch = torch
        # the message-alone prefix (system turn, user header) never changes: rendered once
        self._alone_prefix = self._prefix_ids([])

    # -- rendering -------------------------------------------------------------------------------
    def _prefix_ids(self, turn: list[tuple[str, str]]) -> list[int]:
        """Ids of the template up to where the next user message's text starts."""
        messages = [{"role": "system", "content": SYSTEM}]
        for user, reply in turn:
            messages += [{"role": "user", "content": user},
                         {"role": "assistant", "content": reply}]
        text = self.tokenizer.apply_chat_template(
            [*messages, {"role": "user", "content": _MARK}], tokenize=False)
        return list(self.tokenizer(text[:text.index(_MARK)], add_special_tokens=False)
                    ["input_ids"])

    def _clip(self, text: str, tokens: int) -> str:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return text if len(ids) <= tokens else self.tokenizer.decode(ids[:tokens])

    # -- the signal ------------------------------------------------------------------------------
    def __call__(self, last_turn: tuple[str, str], message: str) -> float:
        """Nats per token by which ``last_turn`` (user, reply) makes ``message`` more likely;
        0.0 for a message without tokens."""
        target = list(self.tokenizer(message, add_special_tokens=False)["input_ids"])
        target = target[:self.max_message]
        if not target:
            return 0.0
        half = self.max_context // 2
        user, reply = last_turn
        context = self._prefix_ids([(self._clip(user, half), self._clip(reply, half))])
        with self._lock:
            with_turn, alone = self._logprobs([context, self._alone_prefix], target)
        return sum(a - b for a, b in zip(with_turn, alone, strict=True)) / len(target)

    def _logprobs(self, prefixes: list[list[int]], target: list[int]) -> list[list[float]]:
        """Per prefix, log p of each ``target`` token after it. One forward per prefix: a
        padded batch of the two cost more (the prefixes differ by a whole turn)."""
        torch = self._torch
        out = []
        with torch.inference_mode():
            for p in prefixes:
                hidden = self._decoder(input_ids=torch.tensor([p + target])).last_hidden_state
                # only the positions that predict the target go through the vocabulary
                # projection (49k x 576 per row; for the whole prompt it would cost more than
                # the layers)
                h = hidden[0, len(p) - 1:len(p) - 1 + len(target)]
                logp = self._head(h).float().log_softmax(-1)
                out.append(logp[torch.arange(len(target)), torch.tensor(target)].tolist())
        return out
