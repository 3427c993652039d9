"""Fixtures for the benchmark tests: the real model loaded once in fp32 (the segment-reuse
quality harness and the engines bench's cost model compare against it exactly), and a CLI app
holding one ``suffixmem bench`` command."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def fp32_llama(model_path: Path) -> Any:
    import torch

    from suffixmem.engine.torch.llama import Llama

    return Llama.from_pretrained(model_path, dtype=torch.float32)


@pytest.fixture
def bench_app() -> Callable[[Callable[[Any], None]], Any]:
    """``make(register)``: an app whose ``bench`` group holds the commands ``register`` adds, as
    ``suffixmem bench`` loads them (invoke it with ``["bench", NAME, ...]``)."""
    import typer

    def make(register: Callable[[Any], None]) -> Any:
        app, bench = typer.Typer(), typer.Typer()
        register(bench)

        @bench.command("noop")  # a second command keeps typer from collapsing the group
        def noop() -> None:
            pass

        app.add_typer(bench, name="bench")
        return app

    return make
