"""``suffixmem serve``: an OpenAI-compatible HTTP server with sessions and a web chat page.

- ``create_app(manager, config)``: the FastAPI app over a ``ConversationManager``;
- ``ChatService``: the serving logic (no routing); ``ServerConfig``: its settings;
- ``serve(...)``: build the engine and manager and run uvicorn until interrupted.

Needs the ``server`` extra (fastapi, uvicorn). See docs/server.md.
"""

from __future__ import annotations

from suffixmem.server.app import create_app
from suffixmem.server.errors import APIError
from suffixmem.server.run import serve
from suffixmem.server.serving import ChatService, ServerConfig

__all__ = ["APIError", "ChatService", "ServerConfig", "create_app", "serve"]
