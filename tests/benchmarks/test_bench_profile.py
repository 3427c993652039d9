"""``bench profile``: folding py-spy's collapsed stacks into self and inclusive shares."""

from __future__ import annotations

import pytest

from suffixmem_bench.profile import fold

RAW = """\
thread (0x1);main (a.py:1);turn (m.py:5);render (l.py:9) 6
thread (0x1);main (a.py:1);turn (m.py:5) 2
thread (0x2);drive (e.py:3);forward (r.py:7) 12
process 12:"python";main (a.py:1);main (a.py:1) 4
not a line
"""


def test_fold_counts_self_and_inclusive_once_per_stack() -> None:
    f = fold(RAW, top=3)
    assert f["samples"] == 24
    assert f["self"] == [
        {"function": "forward (r.py:7)", "share": pytest.approx(12 / 24)},
        {"function": "render (l.py:9)", "share": pytest.approx(6 / 24)},
        {"function": "main (a.py:1)", "share": pytest.approx(4 / 24)},
    ]
    incl = {row["function"]: row["share"] for row in fold(RAW, top=10)["inclusive"]}
    # a recursive frame counts once per stack; thread/process labels are not functions
    assert incl["main (a.py:1)"] == pytest.approx(12 / 24)
    assert incl["turn (m.py:5)"] == pytest.approx(8 / 24)
    assert not any(k.startswith(("thread", "process")) for k in incl)
    assert fold("") == {"samples": 0, "self": [], "inclusive": []}
    # focus: only the stacks through turn(): 8 samples, render 6 of them
    f = fold(RAW, focus="turn (")
    assert f["samples"] == 8 and f["self"][0] == {"function": "render (l.py:9)", "share": 0.75}
