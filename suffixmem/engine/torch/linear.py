"""Linear products ``x @ w.T`` on CPU through oneDNN-prepacked bf16 weights.

``torch.ops.mkldnn._linear_pointwise`` on a weight reordered once reads it ~2x faster than
``F.linear`` for the few-row products of decoding (and a little faster for prefill), with
bit-identical bf16 results: each weight is checked at load against ``F.linear``, and any
mismatch or missing op leaves that weight on ``F.linear``. fp32 weights are never packed:
oneDNN's fp32 kernels round differently from MKL's, and fp32 is the reference mode.

``PackedLinears.bind(w)`` returns a one-argument function for the decode loop: the packed op is
looked up once, not per call (a decode step makes ~120 of these calls, where Python and
dispatcher overhead is a visible share of the step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

Linear = Callable[[torch.Tensor], torch.Tensor]


def _pointwise_op() -> Any:
    """The C++ callable of ``mkldnn::_linear_pointwise`` (its default overload), or ``None``
    where this torch build has no oneDNN. Called straight, it skips the op packet's Python-level
    overload resolution."""
    try:
        overload = torch.ops.mkldnn._linear_pointwise.default
    except (AttributeError, RuntimeError):
        return None
    return getattr(overload, "_op", overload)


class PackedLinears:
    """oneDNN-prepacked copies of bf16 weights, keyed by the weight tensor's identity."""

    def __init__(self) -> None:
        self._packed: dict[int, Any] = {}
        self._op = _pointwise_op()

    def pack(self, w: torch.Tensor) -> None:
        """Prepack ``w [out, in]`` if it is a CPU bf16 weight and the packed product is
        bit-identical to ``F.linear`` on a probe; otherwise leave it to ``F.linear``."""
        if self._op is None or w.dtype != torch.bfloat16 or w.device.type != "cpu":
            return
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)
            probe = torch.randn(3, w.shape[1], dtype=w.dtype)
            same = torch.equal(self._call(probe, packed), F.linear(probe, w))
        except (RuntimeError, AttributeError):  # no oneDNN or no bf16 support on this CPU
            return
        if same:
            self._packed[id(w)] = packed

    def _call(self, x: torch.Tensor, packed: Any) -> torch.Tensor:
        return self._op(x, packed, None, "none", [None], "")

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``F.linear(x [N, in], w [out, in])``, through the packed copy when there is one."""
        packed = self._packed.get(id(w))
        return F.linear(x, w) if packed is None else self._call(x.contiguous(), packed)

    def bind(self, w: torch.Tensor) -> Linear:
        """``x -> F.linear(x [N, in], w)`` as one function."""
        packed = self._packed.get(id(w))
        if packed is None:
            return lambda x: F.linear(x, w)
        op, scalars = self._op, [None]
        # contiguous(): a no-op on the decode loop's inputs, which are contiguous by
        # construction; the packed kernel is only checked on contiguous rows
        return lambda x: op(x.contiguous(), packed, None, "none", scalars, "")

    def __len__(self) -> int:
        return len(self._packed)
