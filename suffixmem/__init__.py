"""suffixmem: every turn of an LLM conversation pays only for what is new.

Importing this package is cheap: torch, vLLM, LangChain and LlamaIndex are imported only when
an engine or adapter is actually used (see ``__getattr__``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it; resolved on first attribute access
_LAZY = {
    "Message": "suffixmem.engine.protocol",
    "SamplingParams": "suffixmem.engine.protocol",
    "Request": "suffixmem.engine.protocol",
    "Segment": "suffixmem.engine.protocol",
    "TokenEvent": "suffixmem.engine.protocol",
    "Result": "suffixmem.engine.protocol",
    "Engine": "suffixmem.engine.protocol",
    "create_engine": "suffixmem.engine",
    "ConversationManager": "suffixmem.conversation.manager",
    "resolve_model": "suffixmem.models",
    "SuffixmemError": "suffixmem.errors",
}

__all__ = [
    "ConversationManager",
    "Engine",
    "Message",
    "Request",
    "Result",
    "SamplingParams",
    "Segment",
    "SuffixmemError",
    "TokenEvent",
    "__version__",
    "create_engine",
    "resolve_model",
]

if TYPE_CHECKING:  # pragma: no cover
    from suffixmem.conversation.manager import ConversationManager
    from suffixmem.engine import create_engine
    from suffixmem.engine.protocol import (
        Engine,
        Message,
        Request,
        Result,
        SamplingParams,
        Segment,
        TokenEvent,
    )
    from suffixmem.errors import SuffixmemError
    from suffixmem.models import resolve_model


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'suffixmem' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
