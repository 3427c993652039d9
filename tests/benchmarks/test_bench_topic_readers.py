"""Independent readers' labels (``suffixmem_bench.topic_readers``): the shipped files fit their
data, a file that does not is named, agreement is scored against the writer, and the
chatterbot sample is still the bench's own construction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suffixmem_bench import topic_readers
from suffixmem_bench.topic_readers import (
    CHATTERBOT_SAMPLE,
    agreement,
    reader_files,
    reader_jumps,
    writer_jumps,
)
from suffixmem_bench.topic_sets import CONVERSATION_SETS


def test_shipped_readers_fit_their_data() -> None:
    read = {name: len(reader_files(path)) for name, path in CONVERSATION_SETS.items()
            if reader_files(path)}
    assert read == {"natural": 1, "natural-blind7": 1, "natural-blind8": 2, "natural-hard": 1}
    assert len(reader_files(CHATTERBOT_SAMPLE)) == 1
    for data in [*(CONVERSATION_SETS[n] for n in read), CHATTERBOT_SAMPLE]:
        writer = writer_jumps(data)
        for labels in reader_files(data):
            marked = reader_jumps(labels, writer)  # raises if a session or turn does not fit
            assert any(any(j) for j in marked.values()), labels.name


def _write(path: Path, content: object) -> Path:
    path.write_text(json.dumps(content) if not isinstance(content, str) else content)
    return path


@pytest.fixture
def small_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two sessions, writer jumps at s1[2] and s2[1]; readers' files go to tmp_path."""
    monkeypatch.setattr(topic_readers, "READERS_DIR", tmp_path)
    rows = [{"id": "s1", "turns": [{"user": "a", "assistant": "b", "jump": j}
                                   for j in (False, False, True, False)]},
            {"id": "s2", "turns": [{"user": "a", "assistant": "b", "jump": j}
                                   for j in (False, True, False)]}]
    return _write(tmp_path / "tiny.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")


def test_agreement_scores_each_reader_against_the_writer(small_set: Path) -> None:
    assert agreement(small_set) is None  # nobody read it yet
    _write(small_set.parent / "tiny.reader1.json", {"s1": [2], "s2": [1]})  # the writer's
    _write(small_set.parent / "tiny.reader2.json", {"s1": [3], "s2": [1]})  # one of two
    found = agreement(small_set)
    assert found is not None
    # reader 2: 1 true of 2 marked, 1 of 2 found -> F1 0.5; against reader 1 the same
    assert found["reader_f1_each"] == [1.0, 0.5] and found["reader_f1"] == 0.75
    assert found["readers"] == 2 and found["reader_pair_f1"] == 0.5


@pytest.mark.parametrize(("labels", "named"), [
    ({"s1": [2]}, "missing ['s2']"),
    ({"s1": [2], "s2": [1], "s3": []}, "unknown ['s3']"),
    ({"s1": [0], "s2": [1]}, "session s1 has no later turn 0"),
    ({"s1": [2], "s2": [3]}, "session s2 has no later turn 3"),
])
def test_labels_that_do_not_fit_are_named(small_set: Path, labels: dict[str, list[int]],
                                          named: str) -> None:
    bad = _write(small_set.parent / "tiny.reader1.json", labels)
    with pytest.raises(ValueError, match=r"^tiny\.reader1\.json: ") as e:
        agreement(small_set)
    assert named in str(e.value) and bad.exists()


def test_chatterbot_sample_is_the_bench_construction() -> None:
    """The sample is the first 40 English held-out sessions ``bench topics`` builds (seed 0,
    120 sessions, contiguous blocks), so its reader's figure sits beside the bench's."""
    from suffixmem.conversation.topic_corpus import load_topics
    from suffixmem_bench.topic_sets import (
        build_sessions,
        load_natural,
        pools,
        split_topic_names,
        utterances,
    )

    tune, test = split_topic_names(sorted(load_topics("english")), 0)
    built = build_sessions(pools("english", test, utterances(pools("english", tune))), 120, 2,
                           True)
    assert load_natural(CHATTERBOT_SAMPLE) == [list(s) for s in built[:40]]
