"""Continuous batching: which sequences prefill, which decode, who gets blocks.

Each engine step asks ``schedule()`` for work. Waiting sequences are admitted first (FIFO) when
their blocks can be had (prefix-cache hit revived, the rest freshly allocated, evicting cached
blocks LRU-first); admitted sequences prefill together in that step. Otherwise every running
sequence decodes one token, batched. A decode that needs a new block and finds none preempts the
most recently admitted sequence (its blocks are released, it waits again and later recomputes
what the prefix cache no longer holds), as vLLM does. Before a sequence waits, is preempted or is
refused for want of blocks, ``reclaim`` (the segment cache's ``evict``, when there is one) is
asked to give its blocks back.

Pure bookkeeping over ``BlockPool``: no tensors here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from suffixmem.engine.torch.block_pool import BlockPool, Match
from suffixmem.engine.torch.sequence import SeqStatus, Sequence
from suffixmem.errors import CapacityError


@dataclass(slots=True)
class Schedule:
    """One step's work: ``prefill`` or ``decode`` (never both), and sequences that failed."""

    prefill: list[Sequence] = field(default_factory=list)
    decode: list[Sequence] = field(default_factory=list)
    failed: list[tuple[Sequence, Exception]] = field(default_factory=list)


class Scheduler:
    """Waiting queue, running list and their blocks."""

    def __init__(self, block_pool: BlockPool, max_num_seqs: int, max_prefill_tokens: int,
                 enable_prefix_caching: bool = True) -> None:
        self.pool = block_pool
        self.block_size = block_pool.block_size
        self.max_num_seqs = max_num_seqs
        self.max_prefill_tokens = max_prefill_tokens
        self.enable_prefix_caching = enable_prefix_caching
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # gives back up to n block references held outside the running sequences (the segment
        # cache's ``evict``) and returns how many: a cache must not make live requests wait,
        # be preempted or be refused
        self.reclaim: Callable[[int], int] | None = None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- the step -------------------------------------------------------------------------------
    def schedule(self) -> Schedule:
        out = Schedule()
        budget = self.max_prefill_tokens
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            need = seq.num_tokens - self._peek_hit(seq)
            if out.prefill and need > budget:
                break  # the next step takes it
            try:
                admitted = self._admit(seq)
            except CapacityError as e:
                self.waiting.popleft()
                seq.status = SeqStatus.FINISHED
                out.failed.append((seq, e))
                continue
            if not admitted:
                break  # blocks will come back when running sequences finish
            self.waiting.popleft()
            self.running.append(seq)
            out.prefill.append(seq)
            budget -= len(seq.pending)
        if out.prefill:
            return out
        for seq in list(self.running):
            if seq.status is not SeqStatus.RUNNING:
                continue  # preempted below while serving an earlier one
            if not self._ensure_slot(seq, out):
                continue
            out.decode.append(seq)
        return out

    def _peek_hit(self, seq: Sequence) -> int:
        if not self.enable_prefix_caching:
            return 0
        return self._match(seq).num_cached_tokens

    def _match(self, seq: Sequence) -> Match:
        approx = None if seq.request.exact else seq.approx_salt
        return self.pool.match(seq.token_ids, seq.salt, max_tokens=seq.num_tokens - 1,
                               approx_salt=approx, public_blocks=seq.public_len // self.block_size,
                               public_salt=seq.public_salt)

    def _admit(self, seq: Sequence) -> bool:
        """Give ``seq`` its blocks (hit + fresh). False if they cannot be had now; raises
        ``CapacityError`` when they cannot be had even with nothing else running."""
        pool = self.pool
        match = self._match(seq) if self.enable_prefix_caching else Match((), 0)
        total = self.blocks_needed(seq.num_tokens)
        new = total - len(match.block_ids)
        if not self._reclaim(lambda: pool.can_allocate(new, match.block_ids), new):
            if self.running:
                return False
            held = pool.num_used
            raise CapacityError(
                f"the KV pool cannot hold this request: it needs {total} blocks of "
                f"{self.block_size} tokens ({seq.num_tokens} tokens, {len(match.block_ids)} "
                f"cached) but only {pool.num_free} of {pool.num_blocks} can be freed "
                f"({held} are held elsewhere, e.g. by the segment cache); raise kv_cache_gib "
                "or shorten the prompt"
            )
        pool.incref(match.block_ids)
        seq.block_table = [*match.block_ids, *pool.allocate(new)]
        seq.num_computed = match.num_cached_tokens
        seq.pending = list(range(match.num_cached_tokens, seq.num_tokens))
        seq.approx_from = (match.num_exact_tokens
                           if match.num_exact_tokens < match.num_cached_tokens else None)
        seq.num_hashed_blocks = len(match.block_ids)
        seq.last_hash = match.block_hashes[-1] if match.block_hashes else None
        if not seq.admitted_once:
            seq.num_cached_tokens = match.num_cached_tokens
            seq.admitted_once = True
        seq.status = SeqStatus.RUNNING
        return True

    def _ensure_slot(self, seq: Sequence, out: Schedule) -> bool:
        """Make room for the K/V of ``seq``'s newest token; preempt others if needed."""
        if (seq.num_tokens - 1) // self.block_size < len(seq.block_table):
            return True
        while not self._reclaim(lambda: self.pool.num_free > 0, 1):
            victim = self.running[-1]
            self.preempt(victim)
            if victim is seq:
                return False  # alone and still no block: readmission reports CapacityError
        seq.block_table.extend(self.pool.allocate(1))
        return True

    def _reclaim(self, enough: Callable[[], bool], want: int) -> bool:
        """Whether ``enough()`` holds, after asking ``reclaim`` (when set and only while it does
        not) for ``want`` block references at a time until it does or nothing is left to give."""
        while self.reclaim is not None and not enough():
            if self.reclaim(want) == 0:
                break
        return enough()

    # -- leaving --------------------------------------------------------------------------------
    def preempt(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks and put it first in line; it recomputes on readmission."""
        self._release(seq)
        seq.status = SeqStatus.WAITING
        seq.pending = []
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks (its cached full blocks stay matchable until evicted)."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._release(seq)
        seq.status = SeqStatus.FINISHED

    def _release(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        if seq.block_table:
            self.pool.decref(seq.block_table)
        seq.block_table = []
        seq.num_computed = 0
        seq.num_hashed_blocks = 0
        seq.last_hash = None

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register every newly computed full block of ``seq`` in the prefix cache; blocks past
        ``approx_from`` go under the approximate salt, public ones under the public salt."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for j in range(seq.num_hashed_blocks, seq.num_computed // bs):
            exact = seq.approx_from is None or (j + 1) * bs <= seq.approx_from
            salt = seq.salt if exact else seq.approx_salt
            if exact and seq.public_salt is not None and (j + 1) * bs <= seq.public_len:
                salt = seq.public_salt
            seq.last_hash = self.pool.cache_block(
                seq.block_table[j], seq.last_hash, seq.token_ids[j * bs:(j + 1) * bs], salt)
            seq.num_hashed_blocks = j + 1
