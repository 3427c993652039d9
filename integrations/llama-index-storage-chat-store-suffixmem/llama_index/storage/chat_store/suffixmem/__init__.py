"""LlamaIndex chat store on suffixmem (distribution ``llama-index-storage-chat-store-suffixmem``).

``SuffixMemChatStore`` keeps chat histories as suffixmem sessions, through the
``ConversationManager``, so ``suffixmem chat``, LangChain and LlamaIndex see one conversation.
"""

from llama_index.storage.chat_store.suffixmem.async_db import SuffixMemAsyncChatStore
from llama_index.storage.chat_store.suffixmem.base import SuffixMemChatStore

__all__ = ["SuffixMemAsyncChatStore", "SuffixMemChatStore"]
