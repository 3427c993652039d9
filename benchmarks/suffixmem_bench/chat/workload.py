"""The chat workload: real conversations from chatterbot-corpus, a real system prompt and an
optional real reference document.

Contract:
- ``build_workload`` is deterministic: the same arguments (and the same corpus and Python
  version, whose module docs form the reference document) give the same workload, so figures
  compare across versions of suffixmem.
- Session ``i`` takes the user utterances of topic ``SESSION_TOPICS[i % n]`` in file order,
  dropping repeats, and continues into the next topic when one runs out, so sessions stay on
  one subject as real chats do. Most corpus files list a question followed by alternative
  answers, so only each conversation's opener is a user line; in ``DIALOGUE_TOPICS`` the
  utterances really alternate, and every even position is a user line.
- The system prompt is built from the corpus's own bot profile; the reference document
  (``--long``) from the docstrings of standard-library modules. Both are cut at whole
  paragraphs or lines to about the requested number of tokens, as counted by ``count``.
- ``schedule`` gives the round-robin order of turns: turn 1 of every session, then turn 2, ...
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

# Topics in the order sessions draw them: the richer conversational ones first.
SESSION_TOPICS: tuple[str, ...] = (
    "conversations", "ai", "computers", "emotion", "science", "history", "food", "movies",
    "sports", "psychology", "literature", "money", "humor", "greetings", "gossip", "politics",
    "health", "coding", "tech_support", "trivia",
)
# Topics whose conversations alternate user and bot lines (elsewhere: one question, then
# alternative answers).
DIALOGUE_TOPICS: frozenset[str] = frozenset({"conversations"})
DOCUMENT_MODULES: tuple[str, ...] = ("json", "itertools", "heapq", "csv", "argparse", "re")
SYSTEM_PREAMBLE = (
    "You are Chatbot, a friendly and concise assistant. Answer the user's questions briefly and "
    "helpfully. When users ask about you, stay consistent with the profile below, which lists "
    "questions people have asked you before and the answers you gave."
)
DOCUMENT_PREAMBLE = (
    "Reference material: the documentation of some Python standard-library modules. Use it "
    "when a question is about Python."
)

Counter = Callable[[str], int]


@dataclass(slots=True)
class Workload:
    """What every configuration runs: ``sessions[i]`` is session ``i``'s user messages.

    ``system_prompt`` is the full text of each session's system message (the reference document,
    when there is one, is already appended to it). ``mode`` is ``round_robin`` (one turn at a
    time, sessions interleaved) or ``concurrent`` (one thread per session).
    """

    name: str
    system_prompt: str
    sessions: list[list[str]]
    max_tokens: int
    mode: str = "round_robin"
    system_tokens: int = 0
    document_tokens: int = 0
    # per-session system prompts (the ``returning`` workload); empty: all use system_prompt
    system_prompts: list[str] = field(default_factory=list)
    restart_after: int = 0  # rounds before the engine process is restarted (0: never)
    # per-turn system prompts (the ``rag`` workload: retrieved passages written into it every
    # turn), ``turn_systems[session][turn]``; empty: the session's prompt never changes
    turn_systems: list[list[str]] = field(default_factory=list)

    def system_prompt_of(self, session: int) -> str:
        return self.system_prompts[session] if self.system_prompts else self.system_prompt

    def system_prompt_at(self, session: int, turn: int) -> str | None:
        """The system prompt turn ``turn`` (0-based) of ``session`` is sent with, when the
        workload changes it every turn; ``None`` otherwise."""
        return self.turn_systems[session][turn] if self.turn_systems else None

    @property
    def num_sessions(self) -> int:
        return len(self.sessions)

    @property
    def num_turns(self) -> int:
        return len(self.sessions[0]) if self.sessions else 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workload:
        return cls(**data)


def corpus_dir(language: str = "english") -> Path:
    """The installed chatterbot-corpus folder for ``language``."""
    import chatterbot_corpus

    path = Path(chatterbot_corpus.__file__).parent / "data" / language
    if not path.is_dir():
        raise FileNotFoundError(f"chatterbot-corpus has no {language!r} folder at {path}")
    return path


@cache
def conversations(topic: str, language: str = "english") -> tuple[tuple[str, ...], ...]:
    """The corpus conversations of ``topic`` (each a tuple of alternating utterances)."""
    data = yaml.safe_load((corpus_dir(language) / f"{topic}.yml").read_text(encoding="utf-8"))
    out = []
    for conv in data.get("conversations") or ():
        utterances = tuple(" ".join(str(u).split()) for u in conv if u is not None)
        if utterances:
            out.append(utterances)
    return tuple(out)


def user_turns(topic: str, language: str = "english") -> list[str]:
    """The user lines of ``topic``'s conversations, in order, without repeats (see the module
    contract for which lines are the user's)."""
    seen: set[str] = set()
    out: list[str] = []
    for conv in conversations(topic, language):
        for text in conv[::2] if topic in DIALOGUE_TOPICS else conv[:1]:
            if text and text.lower() not in seen:
                seen.add(text.lower())
                out.append(text)
    return out


def session_turns(index: int, turns: int, language: str = "english") -> list[str]:
    """``turns`` user messages for session ``index`` (see the module contract)."""
    out: list[str] = []
    for k in range(len(SESSION_TOPICS)):
        topic = SESSION_TOPICS[(index + k) % len(SESSION_TOPICS)]
        for text in user_turns(topic, language):
            if text not in out:
                out.append(text)
            if len(out) == turns:
                return out
    raise ValueError(f"the corpus has fewer than {turns} distinct user turns")


def _take(pieces: Iterator[str], n_tokens: int, count: Counter, sep: str) -> str:
    """Whole pieces while they fit in ``n_tokens`` (always at least one)."""
    picked: list[str] = []
    total = 0
    for piece in pieces:
        size = count(piece) + 1
        if picked and total + size > n_tokens:
            break
        picked.append(piece)
        total += size
        if total >= n_tokens:
            break
    return sep.join(picked)


def system_prompt_text(n_tokens: int, count: Counter, language: str = "english") -> str:
    """About ``n_tokens`` tokens: a preamble and the corpus bot profile as Q/A lines."""

    def lines() -> Iterator[str]:
        yield SYSTEM_PREAMBLE + "\n\nProfile:"
        for conv in conversations("botprofile", language):
            for q, a in zip(conv[::2], conv[1::2], strict=False):
                yield f"- Q: {q} A: {a}"

    return _take(lines(), n_tokens, count, "\n")


def document_paragraphs(modules: tuple[str, ...] = DOCUMENT_MODULES) -> Iterator[str]:
    """Paragraphs of the named standard-library modules' docstrings, each module headed."""
    yield DOCUMENT_PREAMBLE
    for name in modules:
        doc = inspect.getdoc(importlib.import_module(name)) or ""
        first = True
        for para in doc.split("\n\n"):
            para = para.strip()
            if not para:
                continue
            yield f"## Module {name}\n{para}" if first else para
            first = False


def reference_document(n_tokens: int, count: Counter) -> str:
    """About ``n_tokens`` tokens of standard-library documentation, cut at paragraphs."""
    return _take(document_paragraphs(), n_tokens, count, "\n\n")


def build_workload(
    *,
    sessions: int = 4,
    turns: int = 10,
    max_tokens: int = 32,
    system_tokens: int = 300,
    document_tokens: int = 0,
    count: Counter,
    mode: str = "round_robin",
    language: str = "english",
) -> Workload:
    """The workload (see the module contract). ``document_tokens`` 0 means no document."""
    if sessions < 1 or turns < 1:
        raise ValueError(f"need at least one session and one turn, got {sessions}x{turns}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if mode not in ("round_robin", "concurrent"):
        raise ValueError(f"mode must be 'round_robin' or 'concurrent', got {mode!r}")
    system = system_prompt_text(system_tokens, count, language) if system_tokens > 0 else ""
    document = reference_document(document_tokens, count) if document_tokens > 0 else ""
    prompt = "\n\n".join(p for p in (system, document) if p)
    return Workload(
        name="long" if document_tokens > 0 else "default",
        system_prompt=prompt,
        sessions=[session_turns(i, turns, language) for i in range(sessions)],
        max_tokens=max_tokens,
        mode=mode,
        system_tokens=count(system) if system else 0,
        document_tokens=count(document) if document else 0,
    )


def schedule(workload: Workload) -> list[tuple[int, int]]:
    """Round-robin order of ``(session, turn)`` pairs, both 0-based."""
    return [(s, t) for t in range(workload.num_turns) for s in range(workload.num_sessions)]
