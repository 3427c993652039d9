"""Placing cached segment KV at new positions of a sequence, and choosing what to recompute.

This is the tensor half of segment reuse; it runs on the torch engine's ``ModelRunner`` (our
``Llama`` primitives over the paged ``KVPool``). Contract of ``place_segments``:

1. Each reused segment's cached K/V (all layers) is copied from its pool slots into the
   sequence's slots for its new positions. Keys were rotated for ``origin_start + i``; they are
   re-rotated by ``delta = start - origin_start`` so that they sit exactly at ``start + i``.
   Values carry no position and are copied as they are.
2. Layers ``0 .. blend.fresh_depth - 1`` (the check layers with ``blend.ratio > 0``, and at
   least ``blend.full_layers``) are computed for every uncached position in the new context
   (cost ``fresh_depth / num_layers`` of a full prefill); at each check layer the fresh K/V of
   segment tokens are compared with the re-rotated cached ones (``blend.kv_deviation``). The
   fresh K/V of those lower layers stay in the pool: reused tokens read cached K/V only above.
3. The first ``k`` tokens of each segment and the top ``r`` deviating ones are marked for
   recomputation, as is every uncached token outside the segments and always the last prompt
   token (its logits start decoding). The result lists them; the caller computes them over all
   layers (``ModelRunner.forward`` with those positions and ``context_len = len(prompt)``).
4. With ``blend.query_ratio > 0`` the positions of step 3 are first computed here over every
   layer (a draft), recording what each reused position adds to the outputs of the prompt's
   last ``QUERY_ROWS`` tokens (attention times value norm); ``round(q * reused)`` reused
   positions join the recomputation, the top ones each with the ``QUERY_FOLLOW`` after it
   (``blend.select_attended``). Drafted positions before the first pick keep their K/V
   (nothing they attend to changes) and leave the list; the later ones are recomputed. With
   ``blend.query_patch`` only the last ``QUERY_ROWS`` of them are: the others keep K/V that
   attended to the picks' cached K/V.

The final layout has every position ``0 .. N-1`` exactly once and attention stays causal by
position: a position either holds cached K/V re-rotated to it or is computed there. Nothing here
approximates when ``delta == 0`` and the preceding tokens are the ones the segment was computed
after (the cached K/V then equal a recomputation up to floating-point order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from suffixmem.engine.reuse.blend import (
    BlendConfig,
    combine_deviations,
    kv_deviation,
    select_attended,
    select_recompute,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from suffixmem.engine.torch.model_runner import ModelRunner

QUERY_ROWS = 32
"""How many of the prompt's last tokens count as its question for query-aware recompute: a
chat template's reply header is ~5 tokens, and a question of a sentence or two fits."""
QUERY_FOLLOW = 3
"""Tokens after each attended pick recomputed with it: the question matches a phrase ("the
code of Document 2"), and what the answer copies is what follows it ("is 9376")."""


@dataclass(slots=True, frozen=True)
class SegmentSource:
    """A cached segment to reuse: ``len(src_slots)`` tokens whose K/V lie in pool slots
    ``src_slots`` (keys rotated for ``origin_start + i``), to be placed at ``start + i``."""

    start: int
    src_slots: tuple[int, ...]
    origin_start: int

    @property
    def end(self) -> int:
        return self.start + len(self.src_slots)

    @property
    def delta(self) -> int:
        return self.start - self.origin_start


@dataclass(slots=True, frozen=True)
class Placement:
    """What ``place_segments`` did and what remains to compute.

    ``compute_positions`` (ascending, ends with the last prompt position) must be computed over
    all layers; ``reused_positions`` hold re-rotated cached K/V in the layers above the fresh
    ones. ``recomputed`` counts segment tokens among ``compute_positions``; ``checked_layers``
    is how many lower layers were computed for the whole uncached span (``blend.fresh_depth``,
    0 without sources). ``drafted`` counts the positions the query-aware draft computed over
    every layer (step 4); those before the first attended pick (with ``query_patch``: all but
    the question rows after it) are in neither tuple: their K/V is final. Work done here, in
    token-layers: ``checked_layers * (N - num_cached) + drafted * num_layers``.
    """

    compute_positions: tuple[int, ...]
    reused_positions: tuple[int, ...]
    recomputed: int
    checked_layers: int
    drafted: int = 0


def forward_layers(
    runner: ModelRunner,
    block_table: Sequence[int],
    token_ids: Sequence[int],
    positions: Sequence[int],
    context_len: int,
    num_layers: int | None = None,
    kv_out: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
    want_logits: bool = False,
    attention_mass: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Compute ``token_ids`` at ``positions`` of one sequence through layers ``0..num_layers-1``
    (all by default), writing their K/V into the pool; every context position not computed here
    must already hold K/V. ``kv_out[layer]`` receives that layer's fresh ``(k, v)``
    ``[N, KV, D]`` for the layers it names. Returns the logits ``[N, V]`` (fp32) of every
    computed token when ``want_logits`` (requires all layers), else ``None``.
    ``attention_mass`` (fp32 ``[context_len]``) accumulates, over the layers run, heads and the
    last ``QUERY_ROWS`` computed tokens, what each context position adds to their attention
    outputs (``_attention_mass``).

    The runner's own ``forward`` returns only the last token's logits; teacher-forced evaluation
    and the check-layer pass need this all-rows, partial-depth variant.
    """
    import torch

    m, pool = runner.model, runner.kv_pool
    depth = m.config.num_layers if num_layers is None else num_layers
    if want_logits and depth != m.config.num_layers:
        raise ValueError("logits need every layer")
    with torch.inference_mode():
        ids = torch.tensor(list(token_ids), dtype=torch.long)
        pos = torch.tensor(list(positions), dtype=torch.long)
        slots = torch.tensor(runner.slots(block_table, positions), dtype=torch.long)
        nb = -(-context_len // runner.block_size)
        blocks = torch.tensor(list(block_table[:nb]), dtype=torch.long)
        k_pos = torch.arange(context_len)
        rope = runner.rope.lookup(pos)
        h = m.embed(ids)
        for layer in range(depth):
            q, k, v = m.qkv(layer, h, rope=rope)
            pool.write(layer, slots, k, v)
            if kv_out is not None and layer in kv_out:
                kv_out[layer] = (k, v)
            last = layer == depth - 1 and not want_logits
            if last and attention_mass is None:
                break  # the last layer's K/V is all a partial pass needs
            kc, vc = pool.gather(layer, blocks)
            if attention_mass is not None:
                attention_mass += _attention_mass(q[-QUERY_ROWS:], kc[:context_len],
                                                  vc[:context_len], pos[-QUERY_ROWS:], m.scale)
            if last:
                break
            out = m.attend(q, kc[:context_len], vc[:context_len], pos, k_pos)
            assert not isinstance(out, tuple)
            h = m.finish(layer, h, out)
        return m.logits(h).float() if want_logits else None


def place_segments(
    runner: ModelRunner,
    block_table: Sequence[int],
    prompt_ids: Sequence[int],
    num_cached: int,
    sources: Sequence[SegmentSource],
    blend: BlendConfig,
) -> Placement:
    """Write reused segments' K/V into the sequence and plan the rest (see the module contract).

    ``num_cached`` leading positions already hold K/V (a prefix-cache hit). ``sources`` must be
    sorted, non-overlapping and lie within ``[num_cached, len(prompt_ids))``.
    """
    import torch

    from suffixmem.engine.torch.rope import rerotate

    n = len(prompt_ids)
    m, pool = runner.model, runner.kv_pool
    last_end = num_cached
    for s in sources:
        if s.start < last_end or s.end > n or not s.src_slots:
            raise ValueError(
                f"segment sources must be sorted, disjoint, non-empty and within "
                f"[{num_cached}, {n}): got start {s.start}, end {s.end}"
            )
        last_end = s.end
    depth = blend.fresh_depth if sources else 0
    if depth > m.config.num_layers:
        raise ValueError(f"{blend.label()} needs {depth} fresh layers; the model has "
                         f"{m.config.num_layers}")

    cached_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    with torch.inference_mode():
        for s in sources:
            src = torch.tensor(s.src_slots, dtype=torch.long)
            dst = torch.tensor(runner.slots(block_table, range(s.start, s.end)), dtype=torch.long)
            if not blend.needs_check:  # the re-rotated keys are not needed afterwards
                pool.move(src, dst, partial(_rotate_in_place, delta=s.delta,
                                            theta=m.config.rope_theta) if s.delta else None)
                continue
            k, v = pool.read(src)  # [L, n, KV, D]
            if s.delta:
                lay, cnt, kvh, d = k.shape
                k = rerotate(k.reshape(lay * cnt, kvh, d), s.delta, m.config.rope_theta)
                k = k.view(lay, cnt, kvh, d)
            pool.write_all(dst, k, v)
            cached_kv.append((k, v))

    # fresh lower layers over the uncached span, and deviation at the check layers
    deviations: list[list[float] | None] = [None] * len(sources)
    if depth:
        span = range(num_cached, n)
        kv_out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {
            layer: (torch.empty(0), torch.empty(0))
            for layer in (blend.check_layers if blend.needs_check else ())
        }
        forward_layers(runner, block_table, [prompt_ids[p] for p in span], span, n,
                       num_layers=depth, kv_out=kv_out)
    if depth and blend.needs_check:
        for j, s in enumerate(sources):
            a, b = s.start - num_cached, s.end - num_cached
            per_layer = [
                kv_deviation(kv_out[layer][0][a:b], kv_out[layer][1][a:b],
                             cached_kv[j][0][layer], cached_kv[j][1][layer])
                for layer in blend.check_layers
            ]
            deviations[j] = combine_deviations(per_layer).tolist()

    reused: set[int] = set()
    recomputed = 0
    for s, dev in zip(sources, deviations, strict=True):
        chosen = set(select_recompute(len(s.src_slots), blend, dev))
        recomputed += len(chosen)
        reused.update(s.start + i for i in range(len(s.src_slots)) if i not in chosen)
    if n - 1 in reused:  # the last prompt token's logits start decoding: always compute it
        reused.discard(n - 1)
        recomputed += 1
    compute = [p for p in range(num_cached, n) if p not in reused]
    want = round(blend.query_ratio * len(reused))
    if not want:
        return Placement(tuple(compute), tuple(sorted(reused)), recomputed, depth)
    # step 4: draft the computed positions, then recompute what the tail attends to most
    mass = torch.zeros(n, dtype=torch.float32)
    forward_layers(runner, block_table, [prompt_ids[p] for p in compute], compute, n,
                   attention_mass=mass)
    candidates = sorted(reused)
    picked = select_attended(candidates, mass[candidates].tolist(), want, QUERY_FOLLOW)
    reused.difference_update(picked)
    first = picked[0]
    # patch: the draft stands, and only the question rows are computed again to see the picks
    after = compute[-QUERY_ROWS:] if blend.query_patch else compute
    redo = sorted({*picked, *(p for p in after if p > first)})
    return Placement(tuple(redo), tuple(sorted(reused)), recomputed + len(picked), depth,
                     drafted=len(compute))


def _attention_mass(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """How much each key position contributes to the outputs of queries ``q`` ``[R, H, D]`` at
    positions ``q_pos``: softmax attention over keys ``k`` ``[C, KV, D]`` (positions
    ``0..C-1``, causal) times the norm of that position's value ``v`` ``[C, KV, D]``, summed
    over queries and heads: ``[C]``. The value norm matters: attention sinks (a sentence's
    full stop, "the") take much of the softmax and contribute little, having small values."""
    import torch

    rep = q.shape[1] // k.shape[1]
    kh = k.float().repeat_interleave(rep, dim=1)  # [C, H, D]
    scores = torch.einsum("rhd,chd->hrc", q.float(), kh) * scale
    future = torch.arange(k.shape[0]).unsqueeze(0) > q_pos.unsqueeze(1)  # [R, C]
    scores.masked_fill_(future.unsqueeze(0), float("-inf"))
    vnorm = v.float().norm(dim=-1).repeat_interleave(rep, dim=1).T  # [H, C]
    return (scores.softmax(dim=-1).sum(dim=1) * vnorm).sum(dim=0)


def _rotate_in_place(k: torch.Tensor, delta: int, theta: float) -> None:
    from suffixmem.engine.torch.rope import rerotate

    rerotate(k, delta, theta, out=k)
