"""Incremental detokenization with stop strings, for engines that decode token by token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class Detokenizer:
    """Turns a growing list of token ids into text deltas and watches for stop strings.

    ``push(id)`` returns the text that is now final. Text is held back while it ends in an
    incomplete UTF-8 sequence (U+FFFD) or while its tail could still become a stop string, so no
    part of a stop string is ever emitted. Once a stop string appears, ``stopped`` is true and
    ``text`` is cut just before it.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.ids: list[int] = []
        self.text = ""  # final, emitted text
        self.stopped = False
        self._hold = max((len(s) for s in self.stop), default=1) - 1

    def _decode(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self.ids.append(token_id)
        full = self._decode()
        for s in self.stop:
            at = full.find(s, max(0, len(self.text) - len(s)))
            if at >= 0:
                self.stopped = True
                delta = full[len(self.text):at] if at > len(self.text) else ""
                self.text = full[:at] if at >= len(self.text) else self.text
                return delta
        safe = len(full)
        while safe > len(self.text) and full[safe - 1] == "\ufffd":
            safe -= 1
        safe = max(len(self.text), safe - self._hold) if self.stop else safe
        delta = full[len(self.text):safe]
        self.text += delta
        return delta

    def flush(self) -> str:
        """Emit whatever was held back (call at the end when no stop string matched)."""
        if self.stopped:
            return ""
        full = self._decode()
        delta = full[len(self.text):]
        self.text = full
        return delta
