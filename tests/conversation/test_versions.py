"""``Versions``: change stamps that find a stale plan, also after a session's stamp was
dropped to keep the map bounded (a long-running server sees unboundedly many session ids)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from suffixmem.conversation.versions import Versions


def test_a_change_after_a_plan_is_seen_and_the_map_stays_bounded() -> None:
    v = Versions(capacity=2)
    planned = v.get("a")
    assert v.get("a") == planned  # nothing changed: the plan stands
    v.bump("a")
    assert v.get("a") != planned
    for i in range(100):
        v.bump(f"other-{i}")
    assert len(v) == 2


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.booleans()), max_size=40),
       st.integers(min_value=1, max_value=3))
def test_a_plan_is_never_wrongly_kept(steps: list[tuple[str, bool]], capacity: int) -> None:
    """Whatever other sessions do and whatever is dropped: a plan of ``a`` that saw its stamp
    before ``a`` changed always finds a different stamp afterwards."""
    v = Versions(capacity=capacity)
    planned = v.get("a")
    changed = False
    for session, bump in steps:
        if bump:
            v.bump(session)
            changed = changed or session == "a"
    if changed:
        assert v.get("a") != planned
