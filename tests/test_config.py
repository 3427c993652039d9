"""``EngineConfig`` and ``ManagerConfig`` refuse a value of the wrong type or range with one
line naming the field, before any model loads (a string where an integer belongs reached torch
or vLLM and failed there without naming it, or was accepted and broke every turn)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from suffixmem.config import EngineConfig
from suffixmem.conversation.manager_config import ManagerConfig
from suffixmem.errors import ConfigError


@pytest.mark.parametrize(("fields", "message"), [
    ({"max_model_len": "4096"}, "max_model_len must be an integer, got '4096'"),
    ({"max_model_len": 4096.5}, "max_model_len must be an integer"),
    ({"seed": "x"}, "seed must be an integer"),
    ({"block_size": 2.5}, "block_size must be an integer or None"),
    ({"kv_cache_gib": float("nan")}, "kv_cache_gib must be a finite number"),
    ({"enforce_eager": "no"}, "enforce_eager must be True or False or None"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be >= 1"),
])
def test_engine_config_names_the_bad_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        EngineConfig(**fields)


def test_engine_config_checks_the_kv_tier_folder(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError, match=r"kv_tier_dir .* cannot be used: Not a directory"):
        EngineConfig(kv_tier=True, kv_tier_dir=str(afile / "kv"))
    EngineConfig(kv_tier=True, kv_tier_dir=str(tmp_path / "kv"))
    assert (tmp_path / "kv").is_dir()
    EngineConfig(kv_tier_dir=str(afile / "kv"))  # no tier: the folder is not used


@pytest.mark.parametrize(("fields", "message"), [
    ({"max_tokens": 2.5}, "max_tokens must be an integer, got 2.5"),
    ({"max_tokens": True}, "max_tokens must be an integer, got True"),
    ({"evict_fraction": "0.5"}, "evict_fraction must be a finite number"),
    ({"system_prompt": 5}, "system_prompt must be a string or None"),
    ({"detect_topics": "no"}, "detect_topics must be True or False"),
])
def test_manager_config_names_the_bad_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ManagerConfig(**fields)
    assert ManagerConfig(max_tokens=7, evict_fraction=1 / 3).max_tokens == 7  # ints as floats
