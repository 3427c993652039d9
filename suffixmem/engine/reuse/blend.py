"""Choosing which tokens of a reused segment to recompute (CacheBlend / EPIC style).

A segment's KV cached after one prefix is wrong after another in two ways: keys carry the old
positions (fixed exactly by re-rotation) and every layer above the first mixed in attention to
the old prefix (not fixable without recomputation). Two cheap remedies, combined:

- **first k** (EPIC): the first tokens of a segment are the ones whose old context mattered most
  (they had little of the segment itself to attend to), and they soak up attention like a
  sequence start ("attention sinks"); recomputing them in the new context fixes most of the gap.
- **top r by deviation** (CacheBlend): at a check layer, compute the segment's KV in the new
  context for real and compare it with the cached KV; the ratio ``r`` of tokens that deviate
  most are recomputed in every layer above, the rest reuse the cache.
- **top q by the question's attention** (query-aware, for RAG): the tokens left to compute
  are computed in a draft pass over every layer against the placed KV, and the share ``q`` of
  all reused tokens that add most to the outputs of the prompt's tail (its last
  ``placement.QUERY_ROWS`` tokens: the question and the reply header; softmax attention times
  the value's norm, summed over layers and heads) is recomputed, each pick with the
  ``placement.QUERY_FOLLOW`` tokens after it. Deviation asks which tokens changed most; this
  asks which ones the answer reads, which is where an approximation costs answers (a code in
  one of three passages).
- **fresh lower layers** (a per-layer choice): every segment token is computed in the new
  context through the first ``full_layers`` layers, so that only the layers above read cached
  KV. Layer 0's KV depends on the token and its position alone (re-rotation makes it exact);
  each layer above mixes in more of the old context.

``select_recompute`` and ``select_attended`` are pure Python; ``kv_deviation`` works on tensors
(torch imported lazily).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from suffixmem.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(slots=True)
class BlendConfig:
    """Validated recompute policy.

    - ``first_k``: leading tokens of every reused segment that are always recomputed.
    - ``ratio``: share (0..1) of each segment's tokens, beyond the first k, recomputed because
      their KV deviates most at the check layers; ``0`` skips the check entirely.
    - ``check_layers``: 0-based layer indices where deviation is measured; layers up to the
      highest one are computed for the whole segment in the new context.
    - ``full_layers``: the lowest layers computed for every segment token in the new context
      whether or not a check runs (``0``: none beyond what the check needs).
    - ``query_ratio``: share (0..1) of all reused tokens (across segments, beyond the first k
      and the top r) recomputed because the prompt's tail attends to them most in a draft
      pass; ``0`` skips the draft.
    - ``query_patch``: how the picks are recomputed. False (labels ``-qQ``): the draft
      computes the positions left to compute, and the picks are recomputed together with
      every drafted position after the first pick, so each computed token sees them. True
      (labels ``-pQ``): the draft is the final computation of those positions, and only the
      picks and the prompt's last ``placement.QUERY_ROWS`` tokens are computed again; the
      tokens between keep K/V computed against the picks' cached K/V (cheaper by about the
      drafted count, one more approximation).

    The field defaults (k = 16, nothing else) are the cheapest method measured; the segment-
    reuse hook's default is ``DEFAULT_BLEND``.
    """

    first_k: int = 16
    ratio: float = 0.0
    check_layers: tuple[int, ...] = field(default=(1,))
    full_layers: int = 0
    query_ratio: float = 0.0
    query_patch: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.first_k, bool) or not isinstance(self.first_k, int) or self.first_k < 0:
            raise ConfigError(f"first_k must be an integer >= 0, got {self.first_k!r}")
        if not 0.0 <= float(self.ratio) <= 1.0 or math.isnan(float(self.ratio)):
            raise ConfigError(f"ratio must be in [0, 1], got {self.ratio}")
        self.check_layers = tuple(sorted(set(int(x) for x in self.check_layers)))
        if not self.check_layers or self.check_layers[0] < 0:
            raise ConfigError(f"check_layers must be non-empty layer indices >= 0, got "
                              f"{self.check_layers}")
        if not 0.0 <= float(self.query_ratio) <= 1.0 or math.isnan(float(self.query_ratio)):
            raise ConfigError(f"query_ratio must be in [0, 1], got {self.query_ratio}")
        if (isinstance(self.full_layers, bool) or not isinstance(self.full_layers, int)
                or self.full_layers < 0):
            raise ConfigError(f"full_layers must be an integer >= 0, got {self.full_layers!r}")

    @property
    def needs_check(self) -> bool:
        """Whether deviation must be measured (any top-r selection)."""
        return self.ratio > 0.0

    @property
    def fresh_depth(self) -> int:
        """How many lowest layers are computed for every uncached token in the new context
        before the reuse decision: ``max(full_layers, highest check layer + 1 if checking)``."""
        return max(self.full_layers, self.check_layers[-1] + 1 if self.needs_check else 0)

    @classmethod
    def parse(cls, label: str) -> BlendConfig:
        """The config a ``label()`` names: ``k16``, ``k16-r0.3@1``, ``k16-q0.1``, ``k16-p0.1``,
        ``k16-r0.3@1,4-q0.05-L8`` (``ConfigError`` naming the label otherwise)."""
        m = re.fullmatch(r"k(\d+)(?:-r([0-9.]+)@([0-9,]+))?(?:-([qp])([0-9.]+))?(?:-L(\d+))?",
                         str(label).strip())
        if m is None:
            raise ConfigError(f"segment reuse method {label!r}: expected a label such as k16, "
                              "k16-r0.3@1, k16-q0.4, k16-p0.1 or k16-L4")
        k, r, layers, how, q, full = m.groups()
        try:
            return cls(first_k=int(k), ratio=float(r or 0.0),
                       check_layers=tuple(int(x) for x in (layers or "1").split(",") if x),
                       full_layers=int(full or 0), query_ratio=float(q or 0.0),
                       query_patch=how == "p")
        except ValueError as e:  # "0.3.1": the numbers themselves
            raise ConfigError(f"segment reuse method {label!r}: {e}") from None

    def label(self) -> str:
        """A short name for reports: ``k16``, ``k16-r0.3@1``, ``k16-q0.1``, ``k16-p0.1``,
        ``k16-L4``."""
        out = f"k{self.first_k}"
        if self.needs_check:
            out += f"-r{self.ratio:g}@{','.join(map(str, self.check_layers))}"
        if self.query_ratio:
            out += f"-{'p' if self.query_patch else 'q'}{self.query_ratio:g}"
        if self.full_layers:
            out += f"-L{self.full_layers}"
        return out

    def num_deviating(self, num_tokens: int) -> int:
        """How many tokens of a ``num_tokens`` segment the top-r rule picks (beyond first k)."""
        rest = max(0, num_tokens - self.first_k)
        return min(rest, round(self.ratio * num_tokens))


DEFAULT_BLEND = BlendConfig(first_k=16, query_ratio=0.2, query_patch=True)
"""The segment-reuse method in fp32 and the hook's fallback (``k16-p0.2``: the first 16 tokens
of each segment, then the fifth of the reused tokens the question attends to most, patched in;
docs/segment-reuse.md; the torch engine picks by dtype, ``default_blend``). The cheapest
measured method that passes issue 14's gate anywhere: on the rag workload's 59 reuse events
in fp32 (task 57 of 59, top-1 0.995, free-running 0.91) at 0.44 of a full prefill's work.
In bf16 it misses the task check there (50 of 59, 0.85; the control, every reused token
recomputed, 0.97), and on documents cached on their own in both dtypes (0.75 fp32, 0.79
bf16); ``GATE_PASSED`` says where it may be on by default.
``k16-q0.4`` passed both in bf16 on two AMD hosts (0.93, 0.92) at 0.61-0.67 of a prefill,
which leaves little of the speed, and missed the rag events' task check on an Intel host
(0.88, 52 of 59), where whole sessions served with it, reuse chained turn over turn, agreed
on 0.91 of the code questions (0.96 placed once: ``bench segments --chained``). ``k16``
(the default before) computes a quarter of a prefill and misses the task check on both
(0.79-0.83 and 0.71); ``EngineConfig(segment_method="k16")`` picks it for speed."""

GATE_PASSED: dict[str, frozenset[tuple[str, str]]] = {
    # k16-p0.2 fp32: results/segments-rag-events-avx2-fp32-8527c13.json (57 of 59), again on an
    #   AVX-512 host: results/segments-rag-events-fp32-amd-6fbbf8a.json (57 of 59); whole
    #   sessions chained: results/segments-rag-chained-fp32-amd-594110b.json (51 of 54); bf16:
    #   results/segments-rag-events-avx512-bf16-c5355f2.json (50 of 59, missed, not listed)
    # k16-q0.4 bf16: passed on two AMD hosts (results/segments-rag-events-avx512-bf16-q04-
    #   1796beb.json, 55 of 59; results/segments-rag-events-amd-slow-ec8c679.json, 0.93) and
    #   missed on an Intel host (results/segments-rag-chained-intel-618e200.json: 52 of 59;
    #   whole sessions chained turn over turn 0.91, results/segments-rag-chained-q04-intel-
    #   1166f0b.json): not listed, since a default must pass where users rerun it
    "rag": frozenset({("k16-p0.2", "float32")}),
}
"""Workload class -> the (method label, serving dtype) pairs whose issue-14 quality gate passed
on that class's real reuse events (``bench segments --events CLASS``: top-1 >= 0.97, KL <=
0.02, free-running >= 0.5, task >= 0.9). A class is reused approximately by default only
where its pair is listed (``gate_passed``); a pair never measured counts as failed. Only the
classes the manager decides by it are here (``ManagerConfig.rag_reuse``); documents have no
default-on pair (docs/segment-reuse.md "Defaults")."""


DTYPE_BLENDS: dict[str, BlendConfig] = {
    "float32": DEFAULT_BLEND,
    "bfloat16": BlendConfig(first_k=16, query_ratio=0.4),
}
"""The hook's method when none is given, by the dtype the model serves: in fp32 ``k16-p0.2``,
whose rag gate passed (``GATE_PASSED``); in bf16 ``k16-q0.4``, the most accurate affordable
method measured, whose rag gate passed on two hosts and missed on a third, so in bf16 no class
is approximate by default and this is what ``rag_reuse=True`` or ``exact=False`` get. Other
dtypes (fp16 on CUDA, never measured) get ``DEFAULT_BLEND``, whose gate counts as failed
there."""


def default_blend(dtype: str) -> BlendConfig:
    """The segment-reuse method for a model served in ``dtype`` (``DTYPE_BLENDS``)."""
    return DTYPE_BLENDS.get(dtype, DEFAULT_BLEND)


def gate_passed(workload: str, blend: BlendConfig, dtype: str) -> bool:
    """Whether ``blend`` passed the quality gate on ``workload``'s reuse events with the model
    in ``dtype`` (``GATE_PASSED``)."""
    return (blend.label(), dtype) in GATE_PASSED.get(workload, frozenset())


def select_recompute(
    num_tokens: int, config: BlendConfig, deviation: Sequence[float] | None = None
) -> list[int]:
    """Sorted segment offsets to recompute: ``0..k-1`` plus the ``num_deviating`` offsets of
    highest ``deviation`` among the rest (ties: the earlier offset). ``deviation`` is required
    when ``config.ratio > 0`` and must have one value per token."""
    k = min(config.first_k, num_tokens)
    chosen = list(range(k))
    want = config.num_deviating(num_tokens)
    if want == 0:
        return chosen
    if deviation is None or len(deviation) != num_tokens:
        raise ValueError(f"need {num_tokens} deviation values for top-r selection")
    rest = sorted(range(k, num_tokens), key=lambda i: (-float(deviation[i]), i))
    return sorted(chosen + rest[:want])


def select_attended(candidates: Sequence[int], mass: Sequence[float], want: int,
                    follow: int = 0) -> list[int]:
    """Sorted subset of ``candidates`` (sorted positions) of size ``min(want, len(candidates))``:
    down the ranking by ``mass`` (one value per candidate; ties: the earlier position), each
    position is taken with the ``follow`` candidate positions right after it (``p + 1`` ...,
    while they are candidates), until ``want`` are taken."""
    if len(mass) != len(candidates):
        raise ValueError(f"need {len(candidates)} attention values, got {len(mass)}")
    present = set(candidates)
    order = sorted(range(len(candidates)), key=lambda i: (-float(mass[i]), candidates[i]))
    taken: set[int] = set()
    for i in order:
        if len(taken) >= want:
            break
        p = candidates[i]
        for q in range(p, p + follow + 1):
            if q not in present or len(taken) >= want:
                break
            taken.add(q)
    return sorted(taken)


def kv_deviation(
    k_new: torch.Tensor, v_new: torch.Tensor, k_old: torch.Tensor, v_old: torch.Tensor
) -> torch.Tensor:
    """Per-token deviation of freshly computed KV from the cached KV at one layer.

    All inputs are ``[n, kv_heads, head_dim]`` with keys rotated for the same positions. The
    result ``[n]`` (float32) is the L2 distance of keys plus that of values, each relative to the
    mean norm of the fresh ones, so that keys and values weigh alike.
    """
    dk = (k_new.float() - k_old.float()).flatten(1).norm(dim=1)
    dv = (v_new.float() - v_old.float()).flatten(1).norm(dim=1)
    nk = k_new.float().flatten(1).norm(dim=1).mean().clamp_min(1e-6)
    nv = v_new.float().flatten(1).norm(dim=1).mean().clamp_min(1e-6)
    return dk / nk + dv / nv


def combine_deviations(per_layer: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum of per-layer deviations ``[n]``, each divided by its mean so that every check layer
    counts alike."""
    total = None
    for d in per_layer:
        d = d.float() / d.float().mean().clamp_min(1e-12)
        total = d if total is None else total + d
    if total is None:
        raise ValueError("no check-layer deviations given")
    return total
