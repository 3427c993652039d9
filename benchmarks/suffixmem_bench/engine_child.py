"""An engine arm of ``bench engines`` hosted in a child process.

Every arm runs in a child of its own, one per thread count, interleaved round by round: the
parent writes ``run`` on the child's stdin, the child answers one JSON line with the arm's
figures. Two reasons: vLLM's CPU backend binds its OpenMP threads once per process (a second
thread count in the same process fails its attention kernel's check), and libgomp keeps one
OpenMP thread pool per thread that runs parallel work: engines sharing a process (transformers
in the main thread, the torch engine in its driver thread) give it more threads than cores, so
it throttles its spin waits and every engine's decode slows by half (measured: 21 -> 37 ms per
token for the torch model runner). Alone in its process each engine runs as a user's would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any


class ChildArm:
    """``_ProtocolArm(name, ...)`` in a child process pinned to ``threads`` threads."""

    def __init__(self, name: str, model: str, prompt: Sequence[int], decode_tokens: int,
                 threads: int) -> None:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads),
                   VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}" if threads > 1 else "0")
        spec = {"name": name, "model": model, "prompt": list(prompt),
                "decode_tokens": decode_tokens, "threads": threads}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "suffixmem_bench.engine_child"], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._send(spec)
        self._receive()  # "ready" once the engine is built and warmed up

    def _send(self, obj: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def _receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"engine child exited with {self.proc.wait()}")
        msg = json.loads(line)
        if "error" in msg:
            raise RuntimeError(msg["error"])
        return msg  # type: ignore[no-any-return]

    def __call__(self) -> dict[str, float]:
        self._send("run")
        return self._receive()

    def close(self) -> None:
        if self.proc.poll() is None:
            self._send("exit")
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def main() -> None:
    """Child side: build the arm from the first line, then answer ``run`` until ``exit``."""
    from suffixmem.stdio import quiet_stdout
    from suffixmem_bench.engines import _ProtocolArm, _TransformersArm
    from suffixmem_bench.measure import set_threads

    out = sys.stdout
    spec = json.loads(sys.stdin.readline())
    arm: Any
    try:
        with quiet_stdout(True):
            set_threads(spec["threads"])
            if spec["name"] == "transformers":
                from suffixmem.models import resolve_model

                arm = _TransformersArm(resolve_model(spec["model"], progress=False),
                                       spec["prompt"], spec["decode_tokens"])
            else:
                arm = _ProtocolArm(spec["name"], spec["model"], spec["prompt"],
                                   spec["decode_tokens"], spec["threads"])
    except Exception as e:  # reported to the parent as the arm's error
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), file=out, flush=True)
        return
    print(json.dumps({"ready": True}), file=out, flush=True)
    try:
        for line in sys.stdin:
            if json.loads(line) != "run":
                break
            with quiet_stdout(True):
                figures = arm()
            print(json.dumps(figures), file=out, flush=True)
    finally:
        arm.close()


if __name__ == "__main__":
    main()
