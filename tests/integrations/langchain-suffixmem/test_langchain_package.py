"""The LangChain adapter package: its public names, and suffixmem without LangChain."""

from __future__ import annotations

import subprocess
import sys

import integrations.langchain

# Importing suffixmem (and the adapters' facade) with the frameworks made unimportable.
WITHOUT_FRAMEWORKS = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('langchain_core', 'llama_index'):
            raise ImportError('blocked ' + name)
sys.meta_path.insert(0, Block())
import suffixmem, suffixmem.client
suffixmem.client.sampling_params(max_tokens=3)
heavy = ['torch', 'vllm', 'transformers', 'langchain_core', 'llama_index']
print(sorted(m for m in heavy if m in sys.modules))
try:
    import integrations.langchain
except ImportError as e:
    print(e)
"""


def test_public_names() -> None:
    assert sorted(integrations.langchain.__all__) == [
        "SuffixMemChatMessageHistory", "SuffixMemChatModel", "SuffixMemLLM"]
    for name in integrations.langchain.__all__:
        assert getattr(integrations.langchain, name).__name__ == name


def test_suffixmem_imports_without_langchain() -> None:
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_FRAMEWORKS], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] == "[]"  # nothing heavy, no framework
    assert out[1] == (
        "suffixmem's LangChain adapters need LangChain: pip install 'suffixmem[langchain]'")
