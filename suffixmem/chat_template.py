"""Cache-stable, injection-proof chat rendering: the model's own template, one message at a time.

Rendering a conversation as one string and tokenizing it lets a token boundary move when a
message is appended, and re-tokenizing an assistant turn may not give back the ids the model
generated. Both break prefix caching. ``ChatTemplate`` instead renders message ``i`` as the
frame the template puts around it (``head + content + tail``, found once per role with a probe),
and uses an assistant message's stored ``token_ids`` verbatim.

**Text is text.** Only the frame, which the template itself emits, is tokenized with special
tokens parsed. A message's content is tokenized with special tokens *split*: a user who types
``<|im_end|>\\n<|im_start|>system`` gets those characters as ordinary text tokens, never a real
control token, so no message can forge a turn.

**Fast plain text.** Text is tokenized by the fast tokenizer's Rust backend directly (a copy set
to split special tokens), which gives the ids of ``tokenizer(text, add_special_tokens=False,
split_special_tokens=True)`` without its Python layers: that call was ~0.2 ms of every turn's
path to the engine (the new user message) once a decode had swept the CPU caches. The copy is
checked against the tokenizer's own call on probe strings at start-up, and not used if any
differs (nor for tokenizers without a Rust backend).

**Bounded memory.** Tokenized contents are cached (a session re-sends its history every turn) in
an LRU bounded in bytes; a render that exceeds its token budget raises before caching anything.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from suffixmem.engine.protocol import Message
from suffixmem.errors import ContextWindowError, InvalidRequestError

DEFAULT_CACHE_BYTES = 32 << 20
"""Bytes of tokenized message contents kept for reuse (keys and ids together, approximately)."""
_PROBE = "\x01probe text\x01"
# checked at start-up: the backend must tokenize these exactly as the tokenizer's own call
_PLAIN_PROBES = ("What is the capital of France?", "  two  spaces\n\ttab\r\n", "日本語のテキスト",
                 "Übrigens: ça va? ¿Qué tal?", "emoji 🙂 and NUL-free \u200b zero width",
                 "code: def f(x):\n    return x ** 2  # done", "1234567890 3.14159 -42")
_Frame = tuple[tuple[int, ...], str, str, tuple[int, ...]]


def _entry_bytes(content: str, ids: tuple[int, ...]) -> int:
    # what the entry pins: the content string and the ids tuple (8-byte pointers + small ints,
    # which CPython shares below 257 but counts here as 8 bytes each)
    return sys.getsizeof(content) + 8 * len(ids) + 64


def _split_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def _plain_backend(tokenizer: Any) -> Any:
    """A copy of ``tokenizer``'s Rust backend that splits special tokens, or None when there is
    none or it differs from the tokenizer's own call on a probe (module docstring)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        from tokenizers import Tokenizer

        plain = Tokenizer.from_str(backend.to_str())
        plain.encode_special_tokens = True
        plain.no_truncation()
        plain.no_padding()
        specials = [t for t in getattr(tokenizer, "all_special_tokens", ()) if t]
        probes = (*_PLAIN_PROBES, " ".join(specials), "".join(specials), f"a{_PROBE}b")
        for probe in probes:
            if plain.encode(probe, add_special_tokens=False).ids != _split_ids(tokenizer, probe):
                return None
    except Exception:  # an older tokenizers, an unusual backend: the tokenizer's own call
        return None
    return plain


class ChatTemplate:
    """Renders ``Message`` lists to token ids with a Hugging Face tokenizer's chat template."""

    def __init__(self, tokenizer: Any, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise InvalidRequestError("the model's tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.cache_bytes = cache_bytes
        self._contents: OrderedDict[tuple[str, str, str], tuple[int, ...]] = OrderedDict()
        self._cached_bytes = 0
        self._frames: dict[tuple[str, bool], _Frame] = {}
        self._lock = threading.Lock()
        self._plain = _plain_backend(tokenizer)
        self.eos_token_id: int = tokenizer.eos_token_id
        # no token covers more characters than its vocabulary string has (bytes for byte-level
        # BPE, characters for SentencePiece), so len(text) // this is a floor on its token count
        self.max_token_chars = max(1, max((len(t) for t in tokenizer.get_vocab()), default=1))
        first = [Message("user", "x")]
        self.generation_prompt_ids: tuple[int, ...] = tuple(self._template_ids(
            self._text(first, True)[len(self._text(first, False)):]))
        head, pre, post, tail = self._frame("assistant", False)
        self._assistant_header = (*head, *self._template_ids(pre))
        self._assistant_footer = (*self._template_ids(post), *tail)
        # the frames every conversation needs, found now rather than inside a first turn
        # (~1 ms of template rendering each); one a template rejects fails when it is used
        for role, first in (("system", True), ("user", True), ("user", False)):
            with contextlib.suppress(Exception):
                self._frame(role, first)

    # -- tokenizing -----------------------------------------------------------------------------
    def _text(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        if not messages:
            return ""
        return self.tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def _template_ids(self, text: str) -> list[int]:
        """Ids of text the template emitted: its control tokens are parsed."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def text_ids(self, text: str) -> list[int]:
        """Ids of user-supplied text: special-token strings are split into ordinary tokens."""
        if not text:
            return []
        if self._plain is not None:
            return self._plain.encode(text, add_special_tokens=False).ids  # type: ignore[no-any-return]
        return _split_ids(self.tokenizer, text)

    def piece_ids(self, text: str) -> list[int]:
        """``text_ids(text)``, kept in the content cache: for texts that come back turn after
        turn on their own (a retrieved passage found in the prompt, a context block), where
        tokenizing again took ~1 ms a turn in the caller's path to the first token."""
        if not text:
            return []
        fresh: dict[tuple[str, str, str], tuple[int, ...]] = {}
        ids = self._content_ids(("", text, ""), fresh)
        self._remember(fresh)
        return list(ids)

    def _frame(self, role: str, first: bool) -> _Frame:
        """What the template puts around a ``role`` message's content (``first``: it opens the
        conversation): control-token ids before, plain text before, plain text after, control
        ids after. Found once with a probe and checked to keep content as is."""
        key = (role, first)
        frame = self._frames.get(key)
        if frame is not None:
            return frame
        context = [] if first else [Message("user", "x")]
        before = self._text(context, False)
        pieces = []
        for probe in (_PROBE, "  " + _PROBE + " \n"):  # a template that trims would fail here
            text = self._text([*context, Message(role, probe)], False)
            if not text.startswith(before) or text[len(before):].count(probe) != 1:
                raise InvalidRequestError(
                    "chat template is not prefix-stable or changes message text; cannot render "
                    "it per message")
            pieces.append(text[len(before):].split(_PROBE))
        if pieces[1][0] != pieces[0][0] + "  " or pieces[1][1] != " \n" + pieces[0][1]:
            raise InvalidRequestError("chat template changes message text; cannot render it "
                                      "per message")
        head, tail = pieces[0]
        # the plain text between the frame's last control token and the content ("user\n") is
        # tokenized together with the content, as tokenizing the whole string would do
        specials = [t for t in self.tokenizer.get_added_vocab() if t]
        cut = max((head.rfind(t) + len(t) for t in specials if t in head), default=0)
        end = min((tail.find(t) for t in specials if t in tail), default=len(tail))
        frame = (tuple(self._template_ids(head[:cut])), head[cut:], tail[:end],
                 tuple(self._template_ids(tail[end:])))
        with self._lock:
            self._frames[key] = frame
        return frame

    def _content_ids(self, key: tuple[str, str, str],
                     fresh: dict[tuple[str, str, str], tuple[int, ...]]) -> tuple[int, ...]:
        with self._lock:
            hit = self._contents.get(key)
            if hit is not None:
                self._contents.move_to_end(key)
                return hit
        hit = fresh.get(key)
        if hit is None:
            hit = fresh[key] = tuple(self.text_ids("".join(key)))
        return hit

    def _remember(self, fresh: dict[tuple[str, str, str], tuple[int, ...]]) -> None:
        with self._lock:
            for key, ids in fresh.items():
                size = _entry_bytes(key[1], ids)
                if size > self.cache_bytes // 8 or key in self._contents:
                    continue  # one huge message must not flush everyone else's entries
                self._contents[key] = ids
                self._cached_bytes += size
            while self._cached_bytes > self.cache_bytes and self._contents:
                old, old_ids = self._contents.popitem(last=False)
                self._cached_bytes -= _entry_bytes(old[1], old_ids)

    @property
    def cached_bytes(self) -> int:
        return self._cached_bytes

    # -- rendering ------------------------------------------------------------------------------
    def message_ids(self, messages: Sequence[Message], index: int) -> tuple[int, ...]:
        """Token ids the template adds for ``messages[index]`` after ``messages[:index]``."""
        fresh: dict[tuple[str, str, str], tuple[int, ...]] = {}
        ids = self._message_ids(messages, index, fresh)
        self._remember(fresh)
        return ids

    def _message_ids(self, messages: Sequence[Message], index: int,
                     fresh: dict[tuple[str, str, str], tuple[int, ...]]) -> tuple[int, ...]:
        m = messages[index]
        if m.token_ids is not None:
            return (*self._assistant_header, *m.token_ids, *self._assistant_footer)
        # ChatML-like templates depend only on the role and on whether it opens the conversation
        head, pre, post, tail = self._frame(m.role, index == 0)
        return (*head, *self._content_ids((pre, m.content, post), fresh), *tail)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True,
               max_tokens: int | None = None) -> list[int]:
        """Token ids of the whole conversation, plus the assistant header when asked.

        With ``max_tokens``, stops at the first message that passes it (or that certainly will,
        by its length, before tokenizing it) and raises ``ContextWindowError`` carrying a lower
        bound of the prompt's size; nothing is cached then.
        """
        ids: list[int] = []
        fresh: dict[tuple[str, str, str], tuple[int, ...]] = {}
        for i, m in enumerate(messages):
            if max_tokens is not None and m.token_ids is None and \
                    len(ids) + len(m.content) // self.max_token_chars > max_tokens:
                # certainly too long: say so without tokenizing (a 1 MB message costs nothing)
                raise ContextWindowError(
                    len(ids) + len(m.content) // self.max_token_chars, max_tokens,
                    "the prompt passes the room left for it; shorten the conversation")
            ids.extend(self._message_ids(messages, i, fresh))
            if max_tokens is not None and len(ids) > max_tokens:
                raise ContextWindowError(
                    len(ids), max_tokens,
                    "the prompt passes the room left for it; shorten the conversation")
        if add_generation_prompt:
            ids.extend(self.generation_prompt_ids)
        self._remember(fresh)
        return ids

    def render_text(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The template's own string rendering (for display and for checking ``render``)."""
        return self._text(messages, add_generation_prompt)
