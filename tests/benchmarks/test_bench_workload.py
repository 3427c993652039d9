"""The chat workload is built from the real corpus, has the asked shape, interleaves sessions
round-robin and sizes its texts with the model's tokenizer."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

import pytest
import yaml

from suffixmem_bench.chat.workload import (
    DIALOGUE_TOPICS,
    SESSION_TOPICS,
    build_workload,
    corpus_dir,
    schedule,
    session_turns,
    user_turns,
)


@pytest.fixture(scope="module")
def count(tokenizer) -> Callable[[str], int]:  # type: ignore[no-untyped-def]
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _user_lines(topic: str) -> set[str]:
    """User lines of a topic, read straight from the YAML file (independent of the module)."""
    data = yaml.safe_load((corpus_dir() / f"{topic}.yml").read_text(encoding="utf-8"))
    out = set()
    for conv in data["conversations"]:
        lines = conv[::2] if topic in DIALOGUE_TOPICS else conv[:1]
        out.update(" ".join(str(u).split()) for u in lines)
    return out


def test_user_turns_come_from_the_corpus_without_repeats() -> None:
    for topic in ("ai", "conversations", "computers"):
        turns = user_turns(topic)
        assert turns, topic
        assert set(turns) <= _user_lines(topic)
        assert len({t.lower() for t in turns}) == len(turns)
    # computers.yml lists one question then alternative answers: answers are not user lines
    data = yaml.safe_load((corpus_dir() / "computers.yml").read_text(encoding="utf-8"))
    answers = {" ".join(str(u).split()) for conv in data["conversations"] for u in conv[1:]}
    assert not answers & set(user_turns("computers"))


def test_sessions_stay_on_their_topic_and_continue_into_the_next() -> None:
    first = SESSION_TOPICS[1]
    turns = session_turns(1, 5)
    assert turns == user_turns(first)[:5]
    n = len(user_turns(first))
    longer = session_turns(1, n + 3)
    assert longer[:n] == user_turns(first)
    assert set(longer[n:]) <= set(user_turns(SESSION_TOPICS[2]))


def test_workload_shape_sizes_and_determinism(count: Callable[[str], int]) -> None:
    w = build_workload(sessions=3, turns=7, max_tokens=16, system_tokens=300, count=count)
    assert w.name == "default" and w.num_sessions == 3 and w.num_turns == 7
    assert all(len(s) == 7 and len(set(s)) == 7 for s in w.sessions)
    assert len({tuple(s) for s in w.sessions}) == 3  # sessions differ
    assert 250 <= w.system_tokens <= 310
    assert count(w.system_prompt) == w.system_tokens
    assert w.document_tokens == 0
    again = build_workload(sessions=3, turns=7, max_tokens=16, system_tokens=300, count=count)
    assert again.to_dict() == w.to_dict()


def test_long_workload_appends_real_module_documentation(count: Callable[[str], int]) -> None:
    w = build_workload(sessions=1, turns=2, system_tokens=300, document_tokens=1500,
                       count=count)
    assert w.name == "long"
    assert 1350 <= w.document_tokens <= 1530  # "about": separators merge into tokens
    assert 1650 <= count(w.system_prompt) <= 1820
    json_doc = inspect.getdoc(importlib.import_module("json")) or ""
    first_paragraph = json_doc.split("\n\n")[0].strip()
    assert "## Module json\n" + first_paragraph in w.system_prompt
    assert w.system_prompt.startswith("You are Chatbot")


def test_schedule_interleaves_round_robin(count: Callable[[str], int]) -> None:
    w = build_workload(sessions=3, turns=4, system_tokens=20, count=count)
    order = schedule(w)
    assert sorted(order) == [(s, t) for s in range(3) for t in range(4)]
    assert order[:4] == [(0, 0), (1, 0), (2, 0), (0, 1)]
    assert [t for _, t in order] == sorted(t for _, t in order)


def test_bad_arguments_are_refused(count: Callable[[str], int]) -> None:
    with pytest.raises(ValueError):
        build_workload(sessions=0, turns=2, count=count)
    with pytest.raises(ValueError):
        build_workload(sessions=1, turns=2, mode="bursty", count=count)
    with pytest.raises(ValueError, match="fewer than"):
        session_turns(0, 100_000)


def test_the_shared_workloads_tool_descriptions_are_the_same_in_every_process() -> None:
    """Defaults whose repr carries an address (``shutil.copytree``'s ``copy_function``) made the
    shared system prompt, and its token count, differ from one process to the next."""
    import subprocess
    import sys

    code = ("from suffixmem_bench.workloads.shared import tool_descriptions; "
            "print('\\n'.join(tool_descriptions()))")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout for _ in range(2)]
    assert runs[0] == runs[1]
    assert "shutil.copytree(" in runs[0] and " at 0x" not in runs[0]
