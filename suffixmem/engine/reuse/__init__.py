"""Position-independent segment KV reuse for the torch engine.

- ``segment_cache``: which token spans have cached KV, in which pool blocks, for how long (pure
  Python: keys, TTL, value tiers, session isolation).
- ``detector`` / ``anchors``: where reusable segments are (attention-entropy regions, structural
  anchors).
- ``blend``: which tokens of a reused segment to recompute (first k, top-r KV deviation).
- ``reuse``: the engine hook that moves cached KV to new positions (RoPE re-rotation) and
  recomputes the chosen tokens.

Nothing here is imported by ``import suffixmem``; the tensor modules import torch lazily.
"""
