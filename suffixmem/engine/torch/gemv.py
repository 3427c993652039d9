"""A bf16 matrix-vector product for the fast decode path's 1-4 row products (``gemv.c``).

A decode step of a small model is its weights read once: 269 MB for the default model. oneDNN's
one-row bf16 product (the prepacked ``PackedLinears``) reads them at ~16 GB/s in a step's layer
order on the 2-core AMD EPYC hosts, where a plain read gets ~30 GB/s, so the products alone took
~15 ms of a ~22 ms step. ``gemv.c`` reads each thread's share of a weight strictly in address
order, one output row at a time, with AVX-512 BF16 dot products: the same bytes in layer order in
~9.5 ms (docs/profile-decode.md, round 7).

Contract: ``Gemv.bind(w, fallback)`` returns ``x [M, K] -> x @ w.T [M, N]`` (bf16): for 1-4
contiguous rows through the kernel (fp32 accumulation, one rounding to bf16: within a unit in
the last place of oneDNN's result, not bit-identical), otherwise through ``fallback``. So it
serves only the steps whose numerics are already not the primitives' (``fused.FusedOps``), never
``exact_decode``, prefill or fp32 models.

Building: the C source ships with the package and is compiled once per machine by the system C
compiler (``$CC``, else ``cc``; ~0.5 s) into ``$SUFFIXMEM_HOME/kernels``, keyed by the source and
flags. ``Gemv.load`` returns ``None`` (the products stay on oneDNN) where the CPU lacks AVX-512
BF16, no compiler works, or ``SUFFIXMEM_GEMV=0``; a probe against fp32 decides per model.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from suffixmem.engine.torch.linear import Linear

log = logging.getLogger("suffixmem.engine.torch")

SOURCE = Path(__file__).with_name("gemv.c")
MAX_ROWS = 4  # the kernel's specialisations; bigger batches read the weights fast enough
FLAGS = ("-O3", "-mavx512f", "-mavx512bf16", "-fopenmp", "-shared", "-fPIC")
PROBE_TOLERANCE = 0.01  # of the largest output: bf16 rounding is 2^-9 of each output
_LOADED: list[Gemv | None] = []  # the library, once per process


def _cache_folder() -> Path:
    from suffixmem.config import suffixmem_home
    from suffixmem.errors import ConfigError

    try:
        return suffixmem_home() / "kernels"
    except ConfigError:  # no usable home: a folder of this process's own
        return Path(tempfile.mkdtemp(prefix="suffixmem-kernels-"))


def build(folder: Path | None = None) -> Path:
    """The compiled library's path, compiling ``gemv.c`` into ``folder`` unless already there.
    Raises ``OSError`` (no compiler) or ``subprocess.CalledProcessError`` (it failed)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise FileNotFoundError("no C compiler (cc) on PATH")
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join((cc, *FLAGS)).encode()).hexdigest()
    folder = _cache_folder() if folder is None else folder
    path = folder / f"gemv-{key[:16]}.so"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{path.name}.{os.getpid()}"  # then renamed: processes may race here
    try:
        subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(tmp)], check=True,
                       capture_output=True, timeout=300)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


class Gemv:
    """The compiled kernel (module docstring). Build with ``load``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fn = ctypes.CDLL(str(path)).suffixmem_gemv_bf16
        fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3
        fn.restype = ctypes.c_int
        self._fn = fn

    @classmethod
    def load(cls) -> Gemv | None:
        """The kernel, or ``None`` where it cannot serve (module docstring); once per process."""
        if not _LOADED:
            _LOADED.append(cls._open())
        return _LOADED[0]

    @classmethod
    def _open(cls) -> Gemv | None:
        if os.environ.get("SUFFIXMEM_GEMV", "1") == "0":
            return None
        if not torch.cpu._is_avx512_bf16_supported():
            return None
        try:
            path = build()
            try:
                return cls(path)
            except OSError:  # a damaged library in the cache (a copy cut short): build anew
                path.unlink(missing_ok=True)
                return cls(build())
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", b"") or b""
            log.info("the decode GEMV kernel is unavailable (%s %s): oneDNN's products", e,
                     detail.decode(errors="replace")[:200])
            return None

    def bind(self, w: torch.Tensor, fallback: Linear) -> Linear:
        """``x -> x @ w.T`` (module docstring); ``fallback`` for shapes the kernel lacks."""
        if (w.dtype != torch.bfloat16 or w.device.type != "cpu" or w.dim() != 2
                or not w.is_contiguous() or w.shape[1] % 32):
            return fallback
        n, k = w.shape
        fn, wp, empty, bf16 = self._fn, w.data_ptr(), torch.empty, torch.bfloat16

        def linear(x: torch.Tensor, _w: torch.Tensor = w) -> torch.Tensor:  # _w: keeps wp valid
            rows = x.shape[0]
            if rows > MAX_ROWS or x.dtype != bf16 or not x.is_contiguous():
                return fallback(x)
            y = empty(rows, n, dtype=bf16)
            fn(x.data_ptr(), wp, y.data_ptr(), rows, n, k)
            return y

        return linear

    def probe(self, w: torch.Tensor, fallback: Linear) -> float:
        """Largest difference from fp32 maths over 1..4 random rows, relative to the largest
        output (a wrong build or layout shows as ~1)."""
        f = self.bind(w, fallback)
        gen = torch.Generator().manual_seed(0)
        worst = 0.0
        for rows in range(1, MAX_ROWS + 1):
            x = torch.randn(rows, w.shape[1], generator=gen).to(torch.bfloat16)
            ref = x.float() @ w.float().T
            worst = max(worst, float((f(x).float() - ref).abs().max() / ref.abs().max()))
        return worst
