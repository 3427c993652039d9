"""A sampling temperature decided while the engine prefills (issue 19: the topic verdict off the
path to the first token).

The semantic temperature follows the topic verdict on the new message, and the verdict takes
~0.5-1 ms of Python. The prompt does not depend on it; only sampling does. So a ``Request`` may
carry ``temperature_later``: a callable that returns the temperature, used instead of
``sampling.temperature``. An engine that binds it late (``Engine.late_temperature``: the vLLM
and torch engines) queues the request first, then calls it in the caller's thread, so it runs
while the driver thread prefills (the prefill's kernels release the GIL), and reads its value
again before it samples the request's first token. Any other engine resolves it before the
request is queued (``BaseEngine.stream``): the same tokens, only later.

Contract of the callable: idempotent (it is called at least twice, from two threads; the
second call must return the first's value, waiting for it if it is still running), and it
should not raise. ``resolve`` is the engines' guard: a value that is not a temperature, or an
exception, is logged and sampled greedily (temperature 0), so a broken callable fails no other
request of the batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from suffixmem.engine.checks import real_number

log = logging.getLogger(__name__)

LateTemperature = Callable[[], float]


def resolve(late: LateTemperature) -> float:
    """``late()`` checked as a temperature (0..5); 0.0 (greedy) if it raises or is not one."""
    try:
        return real_number("temperature_later()", late(), 0.0, 5.0)
    except Exception:  # one request's bad temperature must not break the batch it is in
        log.exception("temperature_later failed; sampling this request greedily")
        return 0.0
