"""LlamaIndex LLM on suffixmem (distribution ``llama-index-llms-suffixmem``).

``SuffixMemLLM`` goes through suffixmem's ``ConversationManager``: real streaming (sync and
async), the model's chat template, turns stored per session, topic jumps, semantic temperature,
prefix caching; usage with cached tokens in each response's ``raw``.
"""

from llama_index.llms.suffixmem.base import SuffixMemLLM

__all__ = ["SuffixMemLLM"]
