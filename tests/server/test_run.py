"""``suffixmem.server.serve`` builds its manager with the settings it is given (the CLI's
``--durability``), on the real torch engine; uvicorn itself is not started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from suffixmem.conversation.manager_config import ManagerConfig


@pytest.mark.slow
def test_serve_builds_its_manager_with_the_given_durability(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import uvicorn

    from suffixmem.server.run import serve

    seen: dict[str, Any] = {}

    def run(app: Any, **kw: Any) -> None:  # where uvicorn would serve until interrupted
        seen["config"] = app.state.service.manager.config
        seen["kw"] = kw

    monkeypatch.setattr(uvicorn, "run", run)
    serve(port=8765, engine="torch", database_url=f"sqlite:///{tmp_path / 's.db'}",
          max_model_len=512, manager_config=ManagerConfig(durability="sync"))
    assert seen["config"].durability == "sync" and seen["kw"]["port"] == 8765
