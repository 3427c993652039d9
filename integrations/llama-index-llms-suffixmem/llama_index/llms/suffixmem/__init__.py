"""LlamaIndex adapters for suffixmem (``pip install 'suffixmem[llamaindex]'``).

- ``SuffixMemLLM``: LLM with real streaming (sync and async), the model's chat template and
  per-session prefix caching; usage with cached tokens in each response's ``raw``.
- ``SuffixMemChatStore``: chat store in suffixmem's SQL conversation store.
"""

try:
    import llama_index.core  # noqa: F401
except ImportError as e:  # say how to get it, not just what is missing
    raise ImportError(
        "suffixmem's LlamaIndex adapters need LlamaIndex: pip install 'suffixmem[llamaindex]'"
    ) from e

from integrations.llama_index.chat_stores import SuffixMemChatStore
from integrations.llama_index.llms import SuffixMemLLM

__all__ = ["SuffixMemChatStore", "SuffixMemLLM"]
