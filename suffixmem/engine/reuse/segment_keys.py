"""Segment identities: namespaces, keys, the hit type callers see, and the block-reference
protocol the segment cache needs from an engine's pool. Pure Python, no tensors.

A segment is keyed by a 16-byte BLAKE2b of its token ids within a namespace: the session's own
(``session:<key>``) or the global one for ``shared`` segments (a common system prompt). Equal ids
in different namespaces have different keys, so one session never finds another's entries.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from suffixmem.retention import Tier

__all__ = ["GLOBAL_NAMESPACE", "BlockRefs", "SegmentHit", "SegmentKey", "namespace_for",
           "segment_key"]

GLOBAL_NAMESPACE = "global"
"""Namespace label of shared segments; session namespaces are ``session:<key>``."""


def namespace_for(session_key: str, shared: bool) -> str:
    """The cache namespace of a segment: global when ``shared``, else the session's own."""
    return GLOBAL_NAMESPACE if shared else f"session:{session_key}"


@dataclass(slots=True, frozen=True)
class SegmentKey:
    """A segment's identity: 16-byte BLAKE2b of (namespace, token ids)."""

    digest: bytes

    def hex(self) -> str:
        return self.digest.hex()


def segment_key(token_ids: Sequence[int], namespace: str) -> SegmentKey:
    """Hash ``token_ids`` within ``namespace``; equal ids in different namespaces differ."""
    h = hashlib.blake2b(digest_size=16)
    h.update(namespace.encode("utf-8"))
    h.update(b"\x00")
    h.update(array("q", token_ids).tobytes())
    return SegmentKey(h.digest())


@runtime_checkable
class BlockRefs(Protocol):
    """The engine's block pool as the segment cache uses it: reference counting only."""

    def incref(self, block_ids: Sequence[int]) -> None: ...

    def decref(self, block_ids: Sequence[int]) -> None: ...


@dataclass(slots=True, frozen=True)
class SegmentHit:
    """A cached segment as callers see it.

    Token ``i`` of the segment sits in pool slot ``(offset + i)`` of the concatenated
    ``block_ids`` (block ``block_ids[(offset + i) // block_size]``), with keys rotated for
    position ``origin_start + i``.
    """

    key: SegmentKey
    token_ids: tuple[int, ...]
    block_ids: tuple[int, ...]
    offset: int
    origin_start: int
    tier: Tier
    shared: bool
    score: float | None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)
