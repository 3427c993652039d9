"""Cheap checks without the model: the page and its assets ship in the package with no
external references, the CLI validates ``serve`` options before starting anything, and
``ServerConfig`` rejects bad limits."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.resources import files

import pytest

from suffixmem.errors import InvalidRequestError
from suffixmem.server import ServerConfig


def test_static_assets_are_packaged_and_local() -> None:
    static = files("suffixmem.server") / "static"
    names = sorted(p.name for p in static.iterdir())
    assert names == ["app.js", "index.html", "style.css"]
    html = (static / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sorted(refs) == ["/static/app.js", "/static/style.css"]
    for name in names:
        text = (static / name).read_text()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in text


@pytest.mark.parametrize("kw", [{"max_pending": 0}, {"max_body_bytes": 10}, {"api_keys": ("",)}])
def test_server_config_rejects_bad_limits(kw: dict) -> None:
    with pytest.raises(InvalidRequestError):
        ServerConfig(**kw)


@pytest.mark.parametrize(("args", "word"), [
    (["--engine", "nope"], "engine"),
    (["--max-pending", "0"], "max_pending"),
    (["--port", "abc"], "port"),
    (["--durability", "eventually"], "durability"),
])
def test_serve_bad_options_one_line(args: list[str], word: str) -> None:
    r = subprocess.run([sys.executable, "-m", "suffixmem.cli", "serve", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and word in lines[0].replace("-", "_"), r.stderr


def test_a_model_folder_is_shown_by_its_name_not_its_path() -> None:
    """``--model /srv/models/x``: ``/health`` (no key needed) and ``/v1/models`` showed the
    host's path; the folder's own name is the id, and the path is still accepted."""
    from suffixmem.server.serving import _public_name

    assert _public_name("/srv/models/smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert _public_name("smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert _public_name("models/q.gguf") == "q.gguf"


def test_host_names_are_read_without_their_port() -> None:
    from suffixmem.server.guards import host_of

    def scope(host: bytes) -> dict:
        return {"headers": [(b"host", host)]}

    assert host_of(scope(b"127.0.0.1:8000")) == "127.0.0.1"
    assert host_of(scope(b"LocalHost")) == "localhost"
    assert host_of(scope(b"[::1]:8000")) == "::1"
    assert host_of(scope(b"rebind.test:8000")) == "rebind.test"
    assert host_of({"headers": []}) == ""
