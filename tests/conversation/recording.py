"""A real engine that records every request it is sent (for tests that check what the
manager asked for)."""

from __future__ import annotations

from typing import Any

from suffixmem.engine.protocol import Request


class Recorder:
    """The real engine, recording each request (``requests``) and forwarding everything."""

    def __init__(self, engine: Any) -> None:
        self.inner = engine
        self.requests: list[Request] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def stream(self, request: Request) -> Any:
        self.requests.append(request)
        return self.inner.stream(request)
