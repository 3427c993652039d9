"""Reconciling a resent message list with the stored session (``ConversationManager.complete``).

Frameworks such as LangChain and LlamaIndex resend the whole conversation on every call. The
manager keeps one copy (SQL) and decides what the call means:

- **new**: the session does not exist; it is created, with the sent history, in the same commit
  as the turn.
- **appended**: the stored history (and system prompt) is a prefix of what was sent; the rest
  (one user message, or tool results...) is appended with the reply.
- **one user message alone** (after no system message, or after the stored system prompt) sent
  to a session that has history: with ``continue_single`` (``suffixmem serve``'s "only the new
  message", its web page) it continues the session (**appended**, as ``chat`` reads it);
  otherwise (the framework adapters) it is answered **stateless**, from what was sent alone,
  and the session is left as it is. A framework sends exactly that list when it trims a
  history to its last question, regenerates or edits the first answer, starts over on a
  thread (LangGraph's ``delete_thread``, ``RemoveMessage``, a replay from the first
  checkpoint) or makes a helper call under the thread's config (a title, a condensed
  question); the model must read what was sent, as with any OpenAI-style model, and neither
  reading the stored history into it nor replacing that history is what the app meant.
- **windowed**: what was sent is the stored history less its oldest messages, then new
  messages (the application's sliding window: LangChain's ``trim_messages``, LlamaIndex's
  ``ChatMemoryBuffer`` token limit). The stored history stays whole and the new messages are
  appended, as for **appended**; the prompt starts where the window does (``dropped``: how
  many stored messages it leaves out), with the kept messages' generated ids. Replacing the
  history by the window would lose what a memory over this session keeps (a LlamaIndex chat
  store's whole conversation).
- **rewritten**: anything else (an edited or truncated history, another system prompt); the
  stored history is replaced by what was sent, atomically with the turn. Under another system
  prompt, a window over the stored history (a RAG chat engine's passages over a memory's
  window) replaces the system prompt only: the history stays whole, as for **windowed**.
- **stateless**: ``session_id=None``; nothing is stored (see ``anon_key``). Also a list that
  ends with a reply: one more reply is asked after it, as OpenAI answers such a list
  (LangGraph's structured response over a finished agent conversation); it is a question
  about the conversation, not a turn of it, so the session's cache serves it and nothing is
  stored. Its tail is that last reply.

A leading ``system`` message is the session's system prompt (a stored one too, as a framework's
history store writes it, when the session has no other). The messages after the last
assistant message form the *tail* the model answers (at least one, none of them assistant,
except for a list that ends with a reply).
Assistant messages matched against stored ones are rendered from the stored generated token
ids (one place for token ids: SQL), so the prompt is the one ``chat`` would have built.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from suffixmem.conversation.validation import check_text
from suffixmem.engine.protocol import Message
from suffixmem.errors import InvalidRequestError

HistoryKind = Literal["new", "appended", "windowed", "rewritten", "stateless"]


@dataclass(slots=True, frozen=True)
class Reconciled:
    """``history`` (rendered before the tail, stored ids attached) and ``tail`` (answered now);
    ``to_store`` is what the turn commits before the reply; ``replace`` says whether it replaces
    the stored history; ``dropped``: how many of the oldest stored messages a window (a
    ``windowed`` call, or one ``rewritten`` under another system prompt) leaves out of the
    prompt (``history`` holds them: the layout starts after them)."""

    kind: HistoryKind
    system_prompt: str | None
    history: tuple[Message, ...]
    tail: tuple[Message, ...]
    to_store: tuple[Message, ...]
    replace: bool
    dropped: int = 0

    def window_start(self, stored: int) -> int:
        """Where the prompt starts in the history, given the session's stored ``window_start``
        (its layout's evictions): a window's own start (the model reads what was sent; the
        layout evicts further only if it must); 0 for another replaced history."""
        if self.dropped:
            return self.dropped
        return 0 if self.replace else stored


def check_messages(messages: object, max_chars: int) -> tuple[Message, ...]:
    """The sent messages, checked: suffixmem ``Message``s, valid text, something to answer."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InvalidRequestError(
            f"messages must be a sequence of Message, got {type(messages).__name__}")
    out = tuple(messages)
    if not out:
        raise InvalidRequestError("messages is empty: nothing to answer")
    for i, m in enumerate(out):
        if not isinstance(m, Message):
            raise InvalidRequestError(
                f"messages[{i}] is a {type(m).__name__}, not a suffixmem Message")
        check_text(f"messages[{i}].content", m.content, max_chars=max_chars,
                   allow_empty=m.role == "assistant")
    if len(out) == 1 and out[0].role == "system":
        raise InvalidRequestError(
            "messages[0] is 'system': nothing to answer (send a user message after it)")
    return out


def split(messages: Sequence[Message]) -> tuple[str | None, list[Message], list[Message]]:
    """(system prompt, conversation before the tail, tail)."""
    system = messages[0].content if messages[0].role == "system" else None
    conv = list(messages[1:] if system is not None else messages)
    k = len(conv)
    while k > 0 and conv[k - 1].role != "assistant":
        k -= 1
    return system, conv[:k], conv[k:]


def _same(sent: Message, stored: Message) -> bool:
    if sent.role != stored.role:
        return False
    if sent.content == stored.content:
        return True
    # a tool call comes back re-serialised (an HTTP client resends the call's name and
    # arguments, which render canonically, not the reply as the model generated it): the same
    # JSON object is the same message, so the stored one, with its generated ids, is kept
    return sent.role == "assistant" and _same_json(sent.content, stored.content)


def _same_json(a: str, b: str) -> bool:
    if not (a.startswith("{") and b.lstrip().startswith("{")):
        return False
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return False


def reconcile(messages: Sequence[Message], stored: Sequence[Message] | None,
              stored_system: str | None, default_system: str | None, *,
              continue_single: bool = False) -> Reconciled:
    """What ``messages`` means against the stored history (``None``: no such session)."""
    system, before, tail = split(messages)
    if not tail:
        return _after_a_reply(system, before, stored, stored_system, default_system)
    if stored is None:
        sp = system if system is not None else default_system
        return Reconciled("new", sp, tuple(before), tuple(tail), (*before, *tail), False)
    if stored and stored[0].role == "system" and stored_system in (None, stored[0].content):
        # a history store wrote the system message as one (a chat store's set_messages): it is
        # the system prompt it would be if sent, and it stays a stored message for that store
        stored_system, stored = stored[0].content, stored[1:]
    sp = system if system is not None else stored_system
    conv = [*before, *tail]
    n = len(stored)
    held = n <= len(conv) and all(_same(conv[i], stored[i]) for i in range(n))
    if held and sp != stored_system and stored_system is None and all(
            m.role != "assistant" for m in stored):
        # a history store wrote the question before the model's first reply (a LlamaIndex
        # chat engine), into a session without a system prompt: the first turn sets it
        merged = (*stored, *conv[n:])
        return Reconciled("appended", sp, merged[:len(before)], tuple(tail), merged, True)
    prefix = held and sp == stored_system
    if prefix:
        # matched assistant turns come back from SQL with their generated ids; messages already
        # stored (a framework's history store may hold the user message) are not stored twice
        merged = (*stored, *conv[n:])
        return Reconciled("appended", sp, merged[:len(before)], tuple(tail), tuple(conv[n:]),
                          False)
    if not before and len(tail) == 1 and tail[0].role == "user" and sp == stored_system:
        # one message to a session with history (module docstring); after the prefix case, so
        # a message a chat store already holds is not stored twice
        if continue_single:
            return Reconciled("appended", sp, tuple(stored), tuple(tail), tuple(tail), False)
        return Reconciled("stateless", sp, (), tuple(tail), (), False)
    d = _dropped(conv, stored)
    if d:  # a window: the whole stored history, then the new messages; read from the window on
        merged = (*stored, *conv[n - d:])
        if sp == stored_system:
            return Reconciled("windowed", sp, merged[:d + len(before)], tuple(tail),
                              tuple(conv[n - d:]), False, d)
        # the same window under another system prompt (a RAG chat engine writes each turn's
        # passages into it, over a memory's window): the system prompt is replaced, the
        # history kept whole
        return Reconciled("rewritten", sp, merged[:d + len(before)], tuple(tail), merged, True,
                          d)
    # an edited history, or the same one under another system prompt (a RAG chat engine writes
    # each turn's passages into it): where the sent message still matches at its place, the
    # stored one comes back with its generated ids, so the prompt holds the tokens the model
    # produced (what the engine cached), not a re-tokenization of their text
    hist = tuple(stored[i] if i < n and _same(m, stored[i]) else m
                 for i, m in enumerate(before))
    return Reconciled("rewritten", sp, hist, tuple(tail), (*hist, *tail), True)


def _after_a_reply(system: str | None, conv: list[Message], stored: Sequence[Message] | None,
                   stored_system: str | None, default_system: str | None) -> Reconciled:
    """A conversation that ends with a reply, answered as OpenAI answers it: one more reply
    after it. LangGraph's prebuilt agent asks so for its structured response, over the
    finished conversation. It is a question about the conversation, not a turn of it:
    stateless (the session's cache still serves the prefix; matched replies come back with
    their generated ids), nothing stored."""
    if stored is None:
        sp = system if system is not None else default_system
    else:
        if stored and stored[0].role == "system" and stored_system in (None, stored[0].content):
            stored_system, stored = stored[0].content, stored[1:]
        sp = system if system is not None else stored_system
        conv = [stored[i] if i < len(stored) and _same(m, stored[i]) else m
                for i, m in enumerate(conv)]
    return Reconciled("stateless", sp, tuple(conv[:-1]), (conv[-1],), (), False)


def _dropped(conv: Sequence[Message], stored: Sequence[Message]) -> int:
    """The fewest oldest messages of ``stored`` whose removal leaves a prefix of ``conv`` (a
    window; it may start with a reply: LangChain's ``trim_messages`` keeps the last messages
    whatever their role by default); 0 when none does."""
    n = len(stored)
    if not conv:
        return 0
    for d in range(1, n):
        if n - d <= len(conv) and _same(conv[0], stored[d]) and all(
                _same(conv[i], stored[d + i]) for i in range(1, n - d)):
            return d
    return 0


def anon_key(messages: Sequence[Message], scope: str = "") -> str:
    """Session key of a stateless call: a hash of ``scope`` (a tenant or API key's namespace:
    callers of different scopes never share cache entries), the system prompt and the first
    user message, so a growing resent conversation keeps hitting its own cache entries."""
    system, before, tail = split(messages)
    first = next((m.content for m in (*before, *tail) if m.role == "user"), "")
    h = hashlib.blake2b(digest_size=12)
    h.update(scope.encode())
    h.update(b"\x00")
    h.update((system or "").encode())
    h.update(b"\x00")
    h.update(first.encode())
    return f"anon-{h.hexdigest()}"


def readable(messages: list[Message]) -> list[Message]:
    """A resent list without the empty user, system or tool messages before the last one.

    They give the model nothing to read, and a framework keeps them: LangGraph checkpoints a
    thread's input before the model runs, a LlamaIndex chat engine stores the user message
    before it calls the LLM, so one empty message, refused once, would be resent and refused
    with every later turn. The last message stays (an empty new message is still refused,
    naming it), and so do empty replies: the session stores them, so dropping one would read
    as a rewritten history and recompute the prompt."""
    last = len(messages) - 1
    return [m for i, m in enumerate(messages)
            if i == last or m.role == "assistant" or m.content.strip()]
