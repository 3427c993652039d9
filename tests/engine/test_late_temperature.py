"""``Request.temperature_later`` (``engine/late_temperature.py``) on the real model: on the vLLM
and torch engines, the same tokens as that temperature given up front (greedy and seeded); the
callable runs first in the caller's thread, once the request is queued, and is read again by the
sampler; a failing one is sampled greedily and leaves the engine serving; ``resolve``'s
checks."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from suffixmem.engine.late_temperature import resolve
from suffixmem.engine.protocol import Message, Request, SamplingParams
from suffixmem.errors import InvalidRequestError

PROMPT = [Message("system", "You are a helpful assistant who writes vivid short poems. " * 8),
          Message("user", "Write a short poem about the sea at night.")]
_keys = iter(range(1 << 30))


def test_resolve_checks_the_value() -> None:
    assert resolve(lambda: 0.7) == 0.7
    assert resolve(lambda: 0) == 0.0
    for bad in (lambda: -1.0, lambda: float("nan"), lambda: True, lambda: "0.5",
                lambda: 5.5, lambda: 1 / 0):
        assert resolve(bad) == 0.0  # greedy, logged


def test_a_request_refuses_a_late_temperature_that_is_not_callable() -> None:
    with pytest.raises(InvalidRequestError, match="temperature_later"):
        Request("k", messages=PROMPT, temperature_later=0.5)  # type: ignore[arg-type]


class Late:
    """An idempotent late temperature (the contract) that records every call's thread."""

    def __init__(self, value: float | Exception) -> None:
        self.value = value
        self.threads: list[str] = []
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.threads.append(threading.current_thread().name)
            if isinstance(self.value, Exception):
                raise self.value
            return self.value


@pytest.fixture(scope="module")
def torch_engine() -> Iterator[Any]:
    from suffixmem.engine import create_engine

    engine = create_engine("torch", max_model_len=1024, kv_cache_gib=0.25)
    yield engine
    engine.close()


@pytest.fixture(params=["vllm", pytest.param("torch", marks=pytest.mark.slow)])
def engine(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_engine")


def _ids(engine: Any, late: Late | None = None, **sampling: Any) -> tuple[int, ...]:
    # a session key of its own per run: nothing is served from another run's cache
    request = Request(f"late-{next(_keys)}", messages=PROMPT,
                      sampling=SamplingParams(max_tokens=24, **sampling),
                      temperature_later=late)
    return engine.generate(request).token_ids


@pytest.mark.vllm
def test_a_late_temperature_samples_as_that_temperature_up_front(engine: Any) -> None:
    assert engine.late_temperature
    greedy = _ids(engine, temperature=0.0)
    late = Late(0.0)
    # the placeholder temperature is ignored: the late value decides
    assert _ids(engine, late, temperature=1.0, seed=3) == greedy
    # first in the caller's thread (right after queueing, during the prefill), then read once
    # more where the first token is sampled
    assert late.threads[0] == threading.current_thread().name and len(late.threads) == 2
    seeded = _ids(engine, temperature=0.9, seed=11)
    assert seeded != greedy  # the seed and temperature do sample
    assert _ids(engine, Late(0.9), temperature=0.0, seed=11) == seeded


@pytest.mark.vllm
def test_a_failing_late_temperature_is_greedy_and_the_engine_serves_on(engine: Any) -> None:
    greedy = _ids(engine, temperature=0.0)
    broken = Late(RuntimeError("verdict failed"))
    assert _ids(engine, broken, temperature=1.0, seed=5) == greedy
    assert _ids(engine, Late(0.9), seed=11) == _ids(engine, temperature=0.9, seed=11)
