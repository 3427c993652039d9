"""Conversations: SQL sessions, cache-stable prompt layout, topic jumps, segment value.

Nothing here imports torch or vLLM: the manager speaks token ids and the engine protocol.
Import the parts from their modules (``suffixmem.conversation.manager`` etc.); this package
file stays import-light.
"""
