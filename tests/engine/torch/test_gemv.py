"""The decode GEMV kernel (``gemv.py``): products against fp32 maths and oneDNN, the fallbacks,
the build cache, and its use by the fused decode step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from suffixmem.engine.torch import gemv
from suffixmem.engine.torch.kv_pool import KVPool
from suffixmem.engine.torch.llama import Llama
from suffixmem.engine.torch.model_runner import ModelRunner, SeqInput
from suffixmem.engine.torch.vllm_attention import VllmAttention
from tests.engine.torch.conftest import state_of

KERNEL = gemv.Gemv.load()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="no AVX-512 BF16 or no C compiler")


def ulps(a: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest difference in units of the last bf16 place of the reference's magnitude."""
    unit = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(1e-30))) - 7)
    return float(((a.float() - ref) / unit).abs().max())


def fail(_: torch.Tensor) -> torch.Tensor:
    raise AssertionError("the fallback was called")


@pytest.mark.parametrize("n,k", [(1, 32), (7, 96), (576, 576), (33, 1536), (4099, 64)])
def test_products_are_fp32_maths_rounded_once(n: int, k: int) -> None:
    """1-4 rows, K a multiple of 32 (including K % 64 == 32), N odd and split across threads:
    each output is the fp32 product rounded to bf16, within one unit of accumulation order."""
    assert KERNEL is not None
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    f = KERNEL.bind(w, fail)
    for rows in range(1, gemv.MAX_ROWS + 1):
        x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
        y = f(x)
        assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
        ref = x.double() @ w.double().T
        assert ulps(y, ref) <= 1.0
        # and oneDNN's bf16 product, which rounds the same fp32 sums
        assert ulps(y, F.linear(x, w).double()) <= 1.0


def test_other_shapes_and_inputs_go_to_the_fallback() -> None:
    """More than four rows, a non-contiguous or fp32 input: the fallback computes; a weight the
    kernel cannot read (K not a multiple of 32, fp32, transposed) binds to the fallback itself."""
    assert KERNEL is not None
    w = torch.randn(40, 64).to(torch.bfloat16)

    def fallback(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, w)

    f = KERNEL.bind(w, fallback)
    for x in (torch.randn(5, 64).to(torch.bfloat16), torch.randn(64, 2).to(torch.bfloat16).T,
              torch.randn(2, 64)):
        if x.dtype == torch.bfloat16:
            assert torch.equal(f(x), fallback(x))
        else:
            with pytest.raises(RuntimeError):  # F.linear refuses fp32 x bf16, as it should
                f(x)
    for bad in (torch.randn(8, 48).to(torch.bfloat16), torch.randn(8, 64),
                torch.randn(64, 8).to(torch.bfloat16).T):
        assert KERNEL.bind(bad, fallback) is fallback


def test_nan_and_inf_propagate() -> None:
    assert KERNEL is not None
    w = torch.ones(3, 32, dtype=torch.bfloat16)
    x = torch.ones(2, 32, dtype=torch.bfloat16)
    x[0, 5], x[1, 7] = float("nan"), float("inf")
    y = KERNEL.bind(w, fail)(x)
    assert y[0].isnan().all() and y[1].isposinf().all()


def test_the_build_is_cached_and_a_broken_compiler_leaves_onednn(tmp_path: Path,
                                                                 monkeypatch: Any) -> None:
    """A second build reuses the library; a compiler that fails raises from ``build`` and makes
    ``_open`` return ``None`` with nothing left behind; a damaged cached library is rebuilt;
    ``SUFFIXMEM_GEMV=0`` turns it off."""
    first = gemv.build(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert gemv.build(tmp_path) == first and first.stat().st_mtime_ns == stamp
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'no such flag' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with pytest.raises(subprocess.CalledProcessError):
        gemv.build(tmp_path)
    monkeypatch.setenv("SUFFIXMEM_HOME", str(tmp_path / "home"))
    assert gemv.Gemv._open() is None
    assert not list((tmp_path / "home").glob("kernels/*"))
    monkeypatch.delenv("CC")
    assert gemv.Gemv._open() is not None
    [lib] = (tmp_path / "home" / "kernels").glob("gemv-*.so")
    lib.unlink()  # a new file: the loaded one stays mapped in this process
    lib.write_bytes(b"not a library")  # damaged: rebuilt, not given up on
    # in a fresh process: this one's loader would hand back the library it holds by that path
    code = "from suffixmem.engine.torch.gemv import Gemv; print(Gemv.load() is not None)"
    env = {**os.environ, "SUFFIXMEM_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "True" and lib.read_bytes()[:4] == b"\x7fELF"
    monkeypatch.setenv("SUFFIXMEM_GEMV", "0")
    assert gemv.Gemv._open() is None


@pytest.mark.skipif(VllmAttention.load(4, 2, 64) is None,
                    reason="vLLM's CPU kernels are not installed")
def test_fused_steps_use_it_close_to_onednn_and_a_wrong_kernel_is_refused(
        make_tiny: Any, monkeypatch: Any) -> None:
    """The fused paged steps run their products through the kernel: logits within bf16
    rounding of the same steps on oneDNN's products. A kernel that the fp32 probe finds wrong
    is not used."""
    from suffixmem.engine.torch.fused import FusedOps

    calls = [0]
    bind = KERNEL.bind

    def counted(w: torch.Tensor, fallback: Any) -> Any:
        product = bind(w, fallback)

        def call(x: torch.Tensor) -> torch.Tensor:
            calls[0] += 1
            return product(x)
        return call

    monkeypatch.setattr(KERNEL, "bind", counted)

    _, ours = make_tiny(seed=5, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=64, num_hidden_layers=3)  # intermediate 96: K % 64 == 32
    model = Llama.from_state_dict(ours.config, state_of(ours), torch.bfloat16)
    c = model.config

    def runner() -> ModelRunner:
        pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, 16, 64, model.dtype)
        return ModelRunner(model, pool, 1000)

    fast, slow = runner(), runner()
    assert fast.decoder.fused is not None and fast.decoder.fused.gemv is KERNEL
    slow.decoder.fused = FusedOps(model, slow.rope)  # the fused step on oneDNN's products
    assert slow.decoder.fused.gemv is None
    gen = torch.Generator().manual_seed(6)
    seqs = [torch.randint(0, 256, (40,), generator=gen).tolist() for _ in range(2)]
    tables = [[7, 3, 11], [2, 9, 5]]
    pairs = list(zip(seqs, tables, strict=True))
    for r in (fast, slow):
        r.forward([SeqInput(s[:20], range(20), t, 20) for s, t in pairs])
    differs = False
    for p in range(20, 36):
        a, b = (r.forward([SeqInput([s[p]], [p], t, p + 1) for s, t in pairs])
                .logits for r in (fast, slow))
        assert fast.decoder.last_source == slow.decoder.last_source == "paged"
        d = (a - b).abs()
        assert d.max() <= 0.25 and d.mean() <= 0.05  # as test_paged_mirror's bound
        differs |= bool(d.max() > 0)
    # the kernel, not oneDNN, computed the fast steps (its rounding may equal oneDNN's: on an
    # Intel host with AMX these steps agreed bit for bit)
    assert calls[0] > 0, differs

    class Wrong(gemv.Gemv):
        def bind(self, w: torch.Tensor, fallback: Any) -> Any:
            return lambda x: fallback(x) * 1.02  # 2% off: far outside bf16 rounding

    wrong = Wrong(KERNEL.path)
    fused = FusedOps(model, fast.rope)
    assert not fused.use_gemv(wrong)
    assert fused.gemv is None and fused.bound is model.bound
