"""Isolation scopes: who shares prefix-cache blocks (suffixmem/engine/isolation.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from suffixmem.config import EngineConfig
from suffixmem.engine.isolation import IsolationPolicy
from suffixmem.engine.protocol import Message, Request, SamplingParams, Segment
from suffixmem.engine.torch.block_pool import BlockPool
from suffixmem.errors import ConfigError

BS = 4


def test_policy_validates_and_names_the_field() -> None:
    with pytest.raises(ConfigError, match="isolation must be one of"):
        IsolationPolicy("tenant-wide")
    with pytest.raises(ConfigError, match="isolation tenant"):
        IsolationPolicy("app", "a\x00b")
    with pytest.raises(ConfigError, match="isolation must be one of"):
        EngineConfig(isolation="everything")
    assert EngineConfig().isolation == "session"  # the default: the strongest exact isolation
    with pytest.raises(ConfigError, match="not supported by the vllm engine"):
        IsolationPolicy("public-prefix").require("vllm")


def test_salts_per_scope() -> None:
    session, public, app = (IsolationPolicy(s, "acme") for s in
                            ("session", "public-prefix", "app"))
    assert session.salt("s1") != session.salt("s2")
    assert public.salt("s1") != public.salt("s2")  # history stays per session
    assert app.salt("s1") == app.salt("s2") != IsolationPolicy("app", "other").salt("s1")
    # a tenant salt can never equal a session key (keys never contain NUL)
    assert "\x00" in app.salt("s1") and "\x00" in public.public_salt
    segs = (Segment(0, 10, "system_tail", shared=True), Segment(12, 20, "document"))
    assert public.public_tokens(segs, 30) == 10
    assert public.public_tokens(segs, 7) == 7
    assert session.public_tokens(segs, 30) == 0 and app.public_tokens(segs, 30) == 0
    assert public.public_tokens((Segment(0, 10, "system_tail"),), 30) == 0  # not shared
    # shared segments (segment cache) cross sessions exactly where public blocks may
    assert [p.shares_across_sessions for p in (session, public, app)] == [False, True, True]


def _cache(pool: BlockPool, ids: list[int], salts: list[str]) -> list[int]:
    blocks = pool.allocate(len(ids) // BS)
    parent = None
    for j, b in enumerate(blocks):
        parent = pool.cache_block(b, parent, ids[j * BS:(j + 1) * BS], salts[j])
    return blocks


def test_block_pool_public_blocks_are_shared_history_blocks_are_not() -> None:
    pool = BlockPool(16, BS)
    public = IsolationPolicy("public-prefix", "t")
    ids = list(range(100, 116))  # 2 public blocks, then 2 history blocks
    salts = [public.public_salt] * 2 + [public.salt("alice")] * 2
    blocks = _cache(pool, ids, salts)
    same = pool.match(ids, public.salt("alice"), public_blocks=2, public_salt=public.public_salt)
    assert same.block_ids == tuple(blocks) and same.num_exact_tokens == 16
    other = pool.match(ids, public.salt("bob"), public_blocks=2, public_salt=public.public_salt)
    assert other.block_ids == tuple(blocks[:2]) and other.num_cached_tokens == 2 * BS
    # the session scope of the same tokens finds nothing: the public salt is not a session's
    assert pool.match(ids, "bob").num_cached_tokens == 0


@pytest.fixture(scope="module")
def public_engine() -> Iterator[object]:
    from suffixmem.engine import create_engine

    eng = create_engine("torch", max_model_len=1024, kv_cache_gib=0.25, dtype="float32",
                        isolation="public-prefix", tenant="shop", extra={"num_threads": 2})
    yield eng
    eng.close()


SYSTEM = ("You are the assistant of a hardware shop. Answer in one short sentence. Tools: "
          "search(query) finds products; stock(sku) tells how many are left; order(sku, n) "
          "places an order. Never invent a product; say when you do not know.")
HISTORY = [Message("user", "Do you sell hammers?"),
           Message("assistant", "Yes, we sell claw hammers and sledgehammers."),
           Message("user", "Which one is better for small nails, and do you have it in stock "
                            "today? I need two of them for a picture frame at home.")]


@pytest.mark.slow
def test_public_prefix_shares_the_system_prompt_and_never_the_history(public_engine) -> None:  # type: ignore[no-untyped-def]
    eng = public_engine
    bs = eng.block_size
    sys_ids = eng.render([Message("system", SYSTEM)], False)
    ids = eng.render([Message("system", SYSTEM), *HISTORY])
    assert ids[:len(sys_ids)] == sys_ids and len(ids) - len(sys_ids) > 3 * bs
    segs = (Segment(0, len(sys_ids), "system_tail", shared=True),)
    greedy = SamplingParams(max_tokens=12)

    def ask(session: str) -> object:
        return eng.generate(Request(session, token_ids=ids, segments=segs, sampling=greedy))

    first = ask("alice")
    assert first.cached_tokens == 0
    # another session with the very same history tokens: full hits on the public system
    # prompt's whole blocks, zero on every history block
    other = ask("bob")
    assert other.cached_tokens == len(sys_ids) // bs * bs
    # the owner hits its own history
    again = ask("alice")
    assert again.cached_tokens == (len(ids) - 1) // bs * bs
    # a deleted session's history blocks are gone: re-created under its id, it finds only
    # the public system prompt (it found its whole history before)
    eng.delete_session_kv("alice")
    assert ask("alice").cached_tokens == len(sys_ids) // bs * bs
    # exact: the shared blocks give what a cold run gives
    eng.reset_prefix_cache()
    cold = ask("carol")
    assert cold.cached_tokens == 0
    assert other.token_ids == cold.token_ids == first.token_ids == again.token_ids


@pytest.mark.slow
def test_a_managers_sessions_share_the_public_system_prompt(public_engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Through the manager with its defaults (context shift on: turns go to the engine as
    ``exact=False`` without document segments), another session's first turn still finds the
    public system prompt's whole blocks, and only those."""
    from suffixmem.conversation.manager import ConversationManager, ManagerConfig

    eng = public_engine
    eng.reset_prefix_cache()
    bs = eng.block_size
    public = len(eng.render([Message("system", SYSTEM)], False)) // bs * bs
    assert public >= bs
    config = ManagerConfig(system_prompt=SYSTEM, detect_topics=False)
    with ConversationManager(eng, f"sqlite:///{tmp_path / 'c.db'}", config) as mgr:
        first = mgr.chat("alice", "Do you sell hammers?", create=True, temperature=0.0,
                         max_tokens=4)
        other = mgr.chat("bob", "Do you sell nails?", create=True, temperature=0.0,
                         max_tokens=4)
        # deleting a session forgets its history's blocks: re-created with the same first
        # turn, it finds the public system prompt only (it found its history before)
        mgr.delete_session("alice")
        again = mgr.chat("alice", "Do you sell hammers?", create=True, temperature=0.0,
                         max_tokens=4)
    assert first.cached_tokens == 0
    assert other.cached_tokens == public
    assert again.cached_tokens == public and again.text == first.text


@pytest.mark.slow
def test_deleting_an_already_deleted_session_still_drops_its_kv(public_engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``runtime.delete_session_on`` (LangGraph's ``delete_thread``) on a session whose rows
    another process deleted: the manager of this process still drops its KV, so the id
    re-created finds the public system prompt only (it found its whole history before: the
    manager's delete stopped at the missing rows)."""
    from suffixmem import runtime
    from suffixmem.conversation.manager import ManagerConfig
    from suffixmem.conversation.store import Store

    eng = public_engine
    eng.reset_prefix_cache()
    bs = eng.block_size
    public = len(eng.render([Message("system", SYSTEM)], False)) // bs * bs
    url = f"sqlite:///{tmp_path / 'c.db'}"
    mgr = runtime.get_manager(eng, database_url=url,
                              config=ManagerConfig(system_prompt=SYSTEM, detect_topics=False))
    try:
        ask = {"temperature": 0.0, "max_tokens": 4, "create": True}
        first = mgr.chat("alice", "Do you sell hammers?", **ask)
        mgr.flush()  # the turn is written behind
        store = Store(url)  # another process deletes the rows
        store.delete_session("alice")
        store.close()
        runtime.delete_session_on(url, "alice")
        again = mgr.chat("alice", "Do you sell hammers?", **ask)
    finally:
        runtime.unregister_engine(eng)
    assert again.cached_tokens == public and again.text == first.text
