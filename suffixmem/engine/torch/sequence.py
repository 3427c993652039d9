"""One request's state inside the torch engine: its tokens, its blocks, what is computed."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from suffixmem.engine.protocol import Request, Result
from suffixmem.engine.torch.block_pool import BlockHash

# the suffix of a session's approximate salt: blocks whose K/V came from (or follow) segment
# reuse are cached under salt + APPROX_MARK, which no exact lookup walks
APPROX_MARK = "\x00approx"


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """A prompt plus what was generated so far.

    Invariants while RUNNING: ``block_table`` covers positions ``0 .. len(token_ids) - 1``; the
    K/V of positions ``0 .. num_computed - 1`` are in those blocks (the newest sampled token is
    not computed until the next decode step feeds it). ``approx_from`` is the first position
    whose K/V may differ from a cache-free run (reused segment K/V, or anything computed after
    it); ``None`` means all exact. Blocks from there on are cached under ``approx_salt`` only.
    The first ``public_len // block_size`` blocks (the public-prefix isolation scope) are cached
    under ``public_salt``, the rest under ``salt``.
    """

    request: Request
    token_ids: list[int]
    num_prompt_tokens: int
    salt: str
    t_submit: float
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    pending: list[int] = field(default_factory=list)  # positions the next prefill computes
    approx_from: int | None = None
    public_len: int = 0  # leading public tokens (isolation scope public-prefix)
    public_salt: str | None = None
    num_cached_tokens: int = 0  # prefix-cache hit at first admission (for the Result)
    reused_segment_tokens: int = 0
    recomputed_tokens: int = 0
    reused_segments: tuple[tuple[int, int], ...] = ()  # spans taken from the segment cache
    admitted_once: bool = False
    status: SeqStatus = SeqStatus.WAITING
    # prefix-cache registration: full blocks hashed so far and the last hash
    num_hashed_blocks: int = 0
    last_hash: BlockHash | None = None
    # streaming state, owned by the engine
    detok: Any = None
    t_first_token: float = 0.0
    generator: Any = None  # torch.Generator for seeded sampling
    guide: Any = None  # grammar.Guide of a json_schema request

    @property
    def seq_id(self) -> str:
        return self.request.request_id

    @property
    def approx_salt(self) -> str:
        """The salt of blocks whose K/V came from (or follow) approximate segment reuse."""
        return self.salt + APPROX_MARK

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def result(self, finish_reason: str, now: float) -> Result:
        """The ``Result`` of this finished sequence at time ``now`` (``perf_counter``)."""
        return Result(
            text=self.detok.text,
            token_ids=tuple(self.output_ids),
            finish_reason=finish_reason,  # type: ignore[arg-type]
            prompt_tokens=self.num_prompt_tokens,
            cached_tokens=self.num_cached_tokens + self.reused_segment_tokens,
            ttft_s=(self.t_first_token or now) - self.t_submit,
            latency_s=now - self.t_submit,
            request_id=self.seq_id,
            session_key=self.request.session_key,
            reused_segment_tokens=self.reused_segment_tokens,
            recomputed_tokens=self.recomputed_tokens,
            reused_segments=self.reused_segments,
        )
