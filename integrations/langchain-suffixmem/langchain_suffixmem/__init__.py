"""LangChain integration of suffixmem (distribution ``langchain-suffixmem``).

Every class goes through suffixmem's ``ConversationManager`` (shared per process and database
by ``suffixmem.runtime.get_manager``):

- ``SuffixMemChatModel``: chat model (``BaseChatModel``) with real streaming, per-session
  turns stored in SQL, topic jumps, semantic temperature, prefix caching, and structured output
  by guided decoding.
- ``SuffixMemLLM``: text LLM (``BaseLLM``).
- ``SuffixMemChatMessageHistory``: chat history of a suffixmem session.
"""

from langchain_suffixmem.chat_message_histories import SuffixMemChatMessageHistory
from langchain_suffixmem.chat_models import SuffixMemChatModel
from langchain_suffixmem.checkpoint import SuffixMemSaver
from langchain_suffixmem.llms import SuffixMemLLM

__all__ = ["SuffixMemChatMessageHistory", "SuffixMemChatModel", "SuffixMemLLM", "SuffixMemSaver"]
