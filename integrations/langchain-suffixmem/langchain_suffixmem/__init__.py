"""LangChain adapters for suffixmem (``pip install 'suffixmem[langchain]'``).

- ``SuffixMemChatModel``: chat model (``BaseChatModel``) with real streaming, the model's chat
  template, per-session prefix caching and structured output by guided decoding.
- ``SuffixMemLLM``: text LLM (``BaseLLM``).
- ``SuffixMemChatMessageHistory``: chat history in suffixmem's SQL conversation store.
"""

try:
    import langchain_core  # noqa: F401
except ImportError as e:  # say how to get it, not just what is missing
    raise ImportError(
        "suffixmem's LangChain adapters need LangChain: pip install 'suffixmem[langchain]'"
    ) from e

from integrations.langchain.chat_message_histories import SuffixMemChatMessageHistory
from integrations.langchain.chat_models import SuffixMemChatModel
from integrations.langchain.llms import SuffixMemLLM

__all__ = ["SuffixMemChatMessageHistory", "SuffixMemChatModel", "SuffixMemLLM"]
