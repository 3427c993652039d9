"""Prefill planning: the pending positions of admitted sequences cut into forward calls.

Pure bookkeeping, no tensors: ``chunk_prefill`` turns sequences into lists of ``SeqInput`` of at
most ``chunk`` tokens each (one forward call per list). A sequence longer than the room left
is split across calls; only the piece that ends its pending positions asks for logits (the
next token is sampled from it).
"""

from __future__ import annotations

from collections.abc import Iterable

from suffixmem.engine.torch.model_runner import SeqInput
from suffixmem.engine.torch.sequence import Sequence

Chunk = list[tuple[Sequence, SeqInput]]


def chunk_prefill(seqs: Iterable[Sequence], chunk: int) -> list[Chunk]:
    """Forward calls of at most ``chunk`` tokens covering every ``seq.pending`` position in
    order; each entry pairs an input with the sequence it belongs to."""
    if chunk < 1:
        raise ValueError(f"the prefill chunk must be >= 1 token, got {chunk}")
    calls: list[Chunk] = []
    current: Chunk = []
    room = chunk
    for seq in seqs:
        pending = seq.pending
        at = 0
        while at < len(pending):
            take = pending[at:at + room]
            at += len(take)
            current.append((seq, SeqInput(
                token_ids=[seq.token_ids[p] for p in take], positions=take,
                block_table=seq.block_table, context_len=take[-1] + 1,
                want_logits=at == len(pending))))
            room -= len(take)
            if room == 0:
                calls.append(current)
                current, room = [], chunk
    if current:
        calls.append(current)
    return calls
