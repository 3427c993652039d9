"""The langchain-suffixmem distribution: its public names, its dependencies, and that the old
``integrations`` package is gone."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import langchain_suffixmem

ROOT = Path(__file__).resolve().parents[3]


def test_public_names() -> None:
    assert langchain_suffixmem.__all__ == [
        "SuffixMemChatMessageHistory", "SuffixMemChatModel", "SuffixMemLLM", "SuffixMemSaver"]
    for name in langchain_suffixmem.__all__:
        assert getattr(langchain_suffixmem, name).__name__ == name


def test_distribution_depends_on_suffixmem_core_and_checkpoint_only() -> None:
    meta = tomllib.loads((ROOT / "integrations/langchain-suffixmem/pyproject.toml").read_text())
    assert meta["project"]["name"] == "langchain-suffixmem"
    deps = [d.split(">")[0].split("=")[0] for d in meta["project"]["dependencies"]]
    # langgraph-checkpoint: SuffixMemSaver's base class (not LangGraph itself)
    assert deps == ["suffixmem", "langchain-core", "langgraph-checkpoint"]
    # installed from this worktree (editable), not some other copy
    assert Path(langchain_suffixmem.__file__).is_relative_to(ROOT / "integrations")


def test_old_integrations_package_is_gone(tmp_path: Path) -> None:
    # from a neutral directory: the repository root itself would offer its folders as
    # namespace packages
    out = subprocess.run(
        [sys.executable, "-c", "import integrations"], cwd=tmp_path, capture_output=True,
        text=True)
    assert out.returncode == 1 and "No module named 'integrations'" in out.stderr


def test_suffixmem_imports_without_frameworks(tmp_path: Path) -> None:
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('langchain_core', 'llama_index'):
            raise ImportError('blocked ' + name)
sys.meta_path.insert(0, Block())
import suffixmem, suffixmem.runtime
heavy = ['torch', 'vllm', 'transformers', 'langchain_core', 'llama_index']
print(sorted(m for m in heavy if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out == ["[]"]
