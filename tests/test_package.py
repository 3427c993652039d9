"""Importing suffixmem is cheap: no torch, vLLM, LangChain or LlamaIndex until used."""

from __future__ import annotations

import json
import subprocess
import sys


def test_import_is_light() -> None:
    code = (
        "import sys, json, suffixmem, suffixmem.cli; "
        "heavy = ['torch', 'vllm', 'transformers', 'langchain_core', 'llama_index']; "
        "print(json.dumps({m: m in sys.modules for m in heavy}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == {m: False for m in loaded}, loaded


def test_lazy_public_names_resolve() -> None:
    import suffixmem

    for name in suffixmem.__all__:
        assert getattr(suffixmem, name) is not None
