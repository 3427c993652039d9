"""The llama-index-llms-suffixmem and llama-index-storage-chat-store-suffixmem distributions:
public names, namespace packages, dependencies."""

from __future__ import annotations

import tomllib
from pathlib import Path

import llama_index.llms.suffixmem
import llama_index.storage.chat_store.suffixmem
import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("module", "names"), [
    (llama_index.llms.suffixmem, ["SuffixMemLLM"]),
    (llama_index.storage.chat_store.suffixmem,
     ["SuffixMemAsyncChatStore", "SuffixMemChatStore"]),
])
def test_public_names(module: object, names: list[str]) -> None:
    assert module.__all__ == names  # type: ignore[attr-defined]
    for name in names:
        assert getattr(module, name).__name__ == name


@pytest.mark.parametrize(("dist", "parts"), [
    ("llama-index-llms-suffixmem", ("llama_index", "llms")),
    ("llama-index-storage-chat-store-suffixmem", ("llama_index", "storage", "chat_store")),
])
def test_namespace_packages_and_dependencies(dist: str, parts: tuple[str, ...]) -> None:
    base = ROOT / "integrations" / dist
    # LlamaIndex's namespace packages: no __init__.py above our own package
    for depth in range(1, len(parts) + 1):
        assert not (base.joinpath(*parts[:depth]) / "__init__.py").exists()
    assert (base.joinpath(*parts) / "suffixmem" / "__init__.py").exists()
    meta = tomllib.loads((base / "pyproject.toml").read_text())
    assert meta["project"]["name"] == dist
    deps = [d.split(">")[0].split("=")[0] for d in meta["project"]["dependencies"]]
    assert deps == ["suffixmem", "llama-index-core"]
