"""The vLLM engine's late temperature (``late_temperature``): a vLLM logits processor.

vLLM fixes a request's ``SamplingParams`` when it is added, so a late temperature cannot be
set there. Instead the request is added with temperature 1 and ``extra_args[KEY] = its id``,
and this processor, registered when the engine is built (vLLM's ``logits_processors``; the
engine core runs in this process, so it sees ``PENDING``), does the temperature's work on that
request's logits row before vLLM's sampler: it divides the row by the late temperature, or for
0 keeps only the row's argmax (vLLM's greedy pick: the first maximum). vLLM then divides by 1
and applies top-k/top-p and its seeded generator as for any request, so the tokens equal those
of a request added with that temperature (tested, greedy and seeded).

The value is read once per request, at its first sampled token (``resolve``: the callable
usually finished in the caller's thread during the prefill) and kept for its later tokens.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from suffixmem.engine.late_temperature import LateTemperature, resolve

KEY = "suffixmem_late_temperature"
"""The ``SamplingParams.extra_args`` key holding the request id of a late temperature."""

_EPS = 1e-5  # vLLM's own: a temperature below it is greedy
PENDING: dict[str, LateTemperature] = {}
_lock = threading.Lock()


def register(request_id: str, late: LateTemperature) -> None:
    """Make ``late`` the temperature of the request ``request_id`` (before it is added)."""
    with _lock:
        PENDING[request_id] = late


def unregister(request_id: str) -> None:
    with _lock:
        PENDING.pop(request_id, None)


class _Row:
    __slots__ = ("late", "value")

    def __init__(self, late: LateTemperature) -> None:
        self.late = late
        self.value: float | None = None


class LateTemperatureProcessor(LogitsProcessor):
    """Applies each late request's temperature to its logits row (module docstring)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self._rows: dict[int, _Row] = {}  # batch index -> its request's late temperature

    def is_argmax_invariant(self) -> bool:
        return False  # greedy rows become one-hot; the argmax stays, but must run before sampling

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self._rows, batch_update, _new_row)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, row in self._rows.items():
            if row.value is None:
                row.value = resolve(row.late)
            x = logits[index]
            if row.value < _EPS:
                best = int(x.argmax())
                top = float(x[best])
                x.fill_(float("-inf"))
                x[best] = top
            else:
                x.div_(row.value)
        return logits


def _new_row(params: Any, _prompt: Any, _output: Any) -> _Row | None:
    extra = params.extra_args
    if not extra or KEY not in extra:
        return None
    with _lock:
        late = PENDING.get(extra[KEY])
    return None if late is None else _Row(late)
