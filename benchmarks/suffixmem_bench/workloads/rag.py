"""``rag``: retrieved passages in the system prompt, new ones every turn (issue 14).

Every turn the application retrieves the top 3 of ~60 fixed passages (TF-IDF over Python's
standard-library documentation, ~150 tokens each) for the user's question and writes them into
the system prompt, followed by the history, exactly as LlamaIndex's
``CondensePlusContextChatEngine`` lays it out (its default context template; the question is
used as its own condensed form, so no extra LLM call is timed). 4 sessions x 10 turns. The
prefix breaks near the top every turn, so a prefix cache recomputes the history each time.
Capability: passages and history turns reuse their cached KV at new positions (context shift
on the torch engine, ``exact=False``), the prompt the application wrote unchanged.

``build`` returns a ``RagWorkload``: a ``Workload`` whose ``turn_systems[s][t]`` is the system
prompt of session ``s``'s turn ``t`` (plus the passages, kept out of ``to_dict``). The chat
harness sets it before each turn (``ChatConfig.set_system``); the suffixmem configurations then
send the whole message list (``ConversationManager.stream_complete``), the way the framework
does, and the peers re-render their text history under the new system prompt.
"""

from __future__ import annotations

import math
import re
from collections import Counter as Bag
from dataclasses import dataclass, field
from typing import Any

from suffixmem_bench.chat.workload import Counter, Workload
from suffixmem_bench.corpus import STDLIB_MODULES, stdlib_paragraphs

NAME = "rag"
PINNED: dict[str, int] = {"sessions": 4, "turns": 10, "max_tokens": 48, "passages": 60,
                          "passage_tokens": 150, "top_k": 3}
ENGINE_OPTIONS: dict[str, Any] = {"max_model_len": 4096, "max_tokens": 48}
# llama_index.core.chat_engine.condense_plus_context DEFAULT_CONTEXT_PROMPT_TEMPLATE
CONTEXT_TEMPLATE = """
  The following is a friendly conversation between a user and an AI assistant.
  The assistant is talkative and provides lots of specific details from its context.
  If the assistant does not know the answer to a question, it truthfully says it
  does not know.

  Here are the relevant documents for the context:

  {context_str}

  Instruction: Based on the above documents, provide a detailed answer for the user question below.
  Answer "don't know" if not present in the document.
  """
QUESTIONS: tuple[str, ...] = (
    "How do I {verb} with the {module} module?",
    "What does {module} offer to {verb}?",
    "Can you show me how {module} helps to {verb}?",
)
TOPICS: tuple[tuple[str, str], ...] = (
    ("json", "encode and decode data"), ("pathlib", "work with file paths"),
    ("csv", "read spreadsheet rows"), ("datetime", "compute dates and times"),
    ("itertools", "combine iterators"), ("heapq", "keep a priority queue"),
    ("re", "match regular expressions"), ("logging", "log messages"),
    ("subprocess", "run other programs"), ("statistics", "compute averages"),
    ("threading", "run work in parallel"), ("hashlib", "hash a file"),
    ("random", "pick random items"), ("functools", "cache function results"),
)


@dataclass(slots=True)
class RagWorkload(Workload):
    """A ``Workload`` whose system prompt changes every turn (``turn_systems[s][t]``)."""

    passages: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A plain ``Workload``'s fields (what a worker process rebuilds)."""
        data = Workload.to_dict(self)
        data.pop("passages", None)
        return data


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_]+", text.lower())


def make_passages(count: Counter, n: int, passage_tokens: int) -> list[str]:
    """``n`` passages of about ``passage_tokens`` tokens, taken in turn from each module of
    ``STDLIB_MODULES``: consecutive documentation paragraphs of one module, joined until the
    size is reached (a paragraph longer than that is a passage of its own)."""
    per_module: list[list[str]] = []
    for module in STDLIB_MODULES:
        chunks: list[str] = []
        current: list[str] = []
        size = 0
        for para in stdlib_paragraphs((module,)):
            current.append(para)
            size += count(para)
            if size >= passage_tokens:
                chunks.append(" ".join(current))
                current, size = [], 0
        per_module.append(chunks)
    out: list[str] = []
    for i in range(max(len(c) for c in per_module)):
        out += [c[i] for c in per_module if i < len(c)]
    return out[:n]


class TfIdf:
    """Plain TF-IDF retrieval (log-scaled term frequency, smoothed IDF, cosine)."""

    def __init__(self, docs: list[str]) -> None:
        self.bags = [Bag(words(d)) for d in docs]
        df: Bag[str] = Bag()
        for bag in self.bags:
            df.update(bag.keys())
        n = len(docs)
        self.idf = {w: math.log((1 + n) / (1 + c)) + 1.0 for w, c in df.items()}
        self.vecs = [self._vec(b) for b in self.bags]

    def _vec(self, bag: Bag[str]) -> dict[str, float]:
        v = {w: (1 + math.log(c)) * self.idf.get(w, 0.0) for w, c in bag.items()}
        norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
        return {w: x / norm for w, x in v.items()}

    def top(self, query: str, k: int) -> list[int]:
        q = self._vec(Bag(words(query)))
        scores = [sum(q.get(w, 0.0) * x for w, x in v.items()) for v in self.vecs]
        return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]


def questions(session: int, turns: int) -> list[str]:
    """Session ``session``'s questions: topics in a rotation that starts at the session index,
    so sessions ask about different modules and come back to earlier ones."""
    out = []
    for t in range(turns):
        module, verb = TOPICS[(session * 3 + t) % len(TOPICS)]
        out.append(QUESTIONS[(session + t) % len(QUESTIONS)].format(module=module, verb=verb))
    return out


def build(count: Counter, **overrides: int) -> RagWorkload:
    """The pinned workload (``overrides``: sessions, turns, max_tokens, passages,
    passage_tokens, top_k)."""
    sizes = {**PINNED, **overrides}
    passages = make_passages(count, sizes["passages"], sizes["passage_tokens"])
    index = TfIdf(passages)
    sessions = [questions(s, sizes["turns"]) for s in range(sizes["sessions"])]
    systems = [[CONTEXT_TEMPLATE.format(context_str="\n\n".join(
        passages[i] for i in index.top(q, sizes["top_k"]))) for q in qs] for qs in sessions]
    return RagWorkload(
        name=NAME, system_prompt=systems[0][0], sessions=sessions,
        max_tokens=sizes["max_tokens"], system_tokens=count(systems[0][0]),
        document_tokens=sizes["top_k"] * sizes["passage_tokens"],
        turn_systems=systems, passages=passages,
    )


def targets(configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """TTFT p50 <= 1/3 of vllm_direct's (the quality gate is ``bench segments``')."""
    from suffixmem_bench.workloads import ttft_vs_direct

    return ttft_vs_direct(configs, "ttft_p50_le_third_of_vllm_direct",
                          "p50 TTFT <= 1/3 of vllm_direct's", lambda f: f["ttft_p50_s"], 1 / 3)
