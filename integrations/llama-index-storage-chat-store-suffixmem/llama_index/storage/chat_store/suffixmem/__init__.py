"""LlamaIndex chat store on suffixmem (distribution ``llama-index-storage-chat-store-suffixmem``).

``SuffixMemChatStore`` keeps chat histories as suffixmem sessions, through the
``ConversationManager``, so ``suffixmem chat``, LangChain and LlamaIndex see one conversation.
``SuffixMemAsyncChatStore`` (for ``Memory``) builds on llama-index-core's ``AsyncDBChatStore``
(0.14.24 and later) and is imported on first use, so that ``SuffixMemChatStore`` keeps
importing on older cores.
"""

from typing import Any

from llama_index.storage.chat_store.suffixmem.base import SuffixMemChatStore

__all__ = ["SuffixMemAsyncChatStore", "SuffixMemChatStore"]


def __getattr__(name: str) -> Any:
    if name != "SuffixMemAsyncChatStore":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from llama_index.storage.chat_store.suffixmem.async_db import SuffixMemAsyncChatStore
    except ImportError as e:
        from importlib.metadata import version

        raise ImportError(f"SuffixMemAsyncChatStore needs llama-index-core >= 0.14.24 (its "
                          f"AsyncDBChatStore); this is {version('llama-index-core')}: {e}"
                          ) from None
    return SuffixMemAsyncChatStore
