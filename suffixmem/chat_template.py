"""Cache-stable chat rendering: the model's own chat template, one message at a time.

Rendering a conversation as one string and tokenizing it lets a token boundary move when a
message is appended, and re-tokenizing an assistant turn may not give back the ids the model
generated. Both break prefix caching. ``ChatTemplate`` instead renders message ``i`` as the text
the template adds for it (``render(msgs[:i+1]) - render(msgs[:i])``), tokenizes each piece on its
own, and uses an assistant message's stored ``token_ids`` verbatim. For templates whose pieces
start and end at special tokens (ChatML, Llama-3) this equals tokenizing the whole string; the
test suite checks that on the default model.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from suffixmem.engine.protocol import Message
from suffixmem.errors import InvalidRequestError


class ChatTemplate:
    """Renders ``Message`` lists to token ids with a Hugging Face tokenizer's chat template."""

    def __init__(self, tokenizer: Any, cache_size: int = 4096) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise InvalidRequestError("the model's tokenizer has no chat template")
        self.tokenizer = tokenizer
        self._pieces: OrderedDict[tuple[str, str, bool], tuple[int, ...]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.eos_token_id: int = tokenizer.eos_token_id
        self.generation_prompt_ids: tuple[int, ...] = tuple(
            self._ids(self._text([Message("user", "x")], True)[len(self._text(
                [Message("user", "x")], False)):])
        )
        # how the template wraps an assistant message: header + content + footer
        probe = "\x00probe\x00"
        text = self._text([Message("user", "x"), Message("assistant", probe)], False)
        before = self._text([Message("user", "x")], False)
        piece = text[len(before):]
        at = piece.find(probe)
        if not text.startswith(before) or at < 0:
            raise InvalidRequestError("chat template is not prefix-stable; cannot render per turn")
        self._assistant_header = self._ids(piece[:at])
        self._assistant_footer = self._ids(piece[at + len(probe):])

    def _text(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        if not messages:
            return ""
        return self.tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def message_ids(self, messages: Sequence[Message], index: int) -> tuple[int, ...]:
        """Token ids the template adds for ``messages[index]`` after ``messages[:index]``."""
        m = messages[index]
        if m.token_ids is not None:
            return (*self._assistant_header, *m.token_ids, *self._assistant_footer)
        # ChatML-like templates depend only on the message and on whether it is the first one
        key = (m.role, m.content, index == 0)
        with self._lock:
            hit = self._pieces.get(key)
            if hit is not None:
                self._pieces.move_to_end(key)
                return hit
        context = [messages[0]] if index > 0 else []
        before = self._text(context, False)
        text = self._text([*context, m], False)
        if not text.startswith(before):
            raise InvalidRequestError("chat template is not prefix-stable; cannot render per turn")
        ids = tuple(self._ids(text[len(before):]))
        with self._lock:
            self._pieces[key] = ids
            if len(self._pieces) > self._cache_size:
                self._pieces.popitem(last=False)
        return ids

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the whole conversation, plus the assistant header when asked."""
        ids: list[int] = []
        for i in range(len(messages)):
            ids.extend(self.message_ids(messages, i))
        if add_generation_prompt:
            ids.extend(self.generation_prompt_ids)
        return ids

    def render_text(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The template's own string rendering (for display and for checking ``render``)."""
        return self._text(messages, add_generation_prompt)
