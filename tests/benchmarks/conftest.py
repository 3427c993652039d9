"""Fixtures for the benchmark tests: the real model loaded once in fp32 (the segment-reuse
quality harness and the engines bench's cost model compare against it exactly)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def fp32_llama(model_path: Path) -> Any:
    import torch

    from suffixmem.engine.torch.llama import Llama

    return Llama.from_pretrained(model_path, dtype=torch.float32)
