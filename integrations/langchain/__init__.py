"""LangChain adapters for suffixmem (``pip install 'suffixmem[langchain]'``).

- ``SuffixMemChatModel``: chat model (``BaseChatModel``) with real streaming, the model's chat
  template, per-session prefix caching and structured output by guided decoding.
- ``SuffixMemLLM``: text LLM (``BaseLLM``).
- ``SuffixMemChatMessageHistory``: chat history in suffixmem's SQL conversation store.
"""

from integrations.langchain.chat_message_histories import SuffixMemChatMessageHistory
from integrations.langchain.chat_models import SuffixMemChatModel
from integrations.langchain.llms import SuffixMemLLM

__all__ = ["SuffixMemChatMessageHistory", "SuffixMemChatModel", "SuffixMemLLM"]
