"""rmsnorm_quant_fp8: the quantizer restated exactly (hand cases, NaN and Inf included), the
fallback's norm against float64, the admission table, and bad arguments named. The CUDA
kernel's bits against FlashInfer's norm and SGLang's quantizer are the GPU tier's
(``test/sglang/test_rmsnorm_quant_fp8.py``); the restated quantizer against SGLang's own
Triton statement of it is there too."""

from __future__ import annotations

import pytest
import torch

from dsv41_kernels.ops.quantization.rmsnorm_quant_fp8 import (
    rmsnorm_quant_fp8,
    rmsnorm_quant_fp8_admission,
)
from dsv41_kernels.reference.rmsnorm_quant_fp8 import group_quant_ue8m0
from test.machine import on_cuda, pretend_arch, pretend_toolchain

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
NAN, INF = float("nan"), float("inf")


def q_bytes(q: torch.Tensor) -> list[int]:
    return q.view(torch.uint8).flatten().tolist()


def test_quantizer_by_hand():
    """Scales 2^ceil(log2(amax / 448)); a NaN quantizes to -448 (fmaxf); a +Inf maximum gives
    the scale +Inf and the multiplier the bits of -Inf; an all-zero group the floor's 2^-42."""
    y = torch.zeros(3, 32)
    y[0, :4] = torch.tensor([1.0, -2.0, NAN, 0.0])
    y[0, 4:] = 0.5
    y[1, :4] = torch.tensor([INF, 1.0, 0.0, -3.0])
    q, scales = group_quant_ue8m0(y.bfloat16(), 32)
    assert scales.flatten().tolist() == [2.0**-7, INF, 2.0**-42]
    assert q_bytes(q[0, :5]) == [0x70, 0xF8, 0xFE, 0x00, 0x68]  # 128, -256, -448, 0, 64
    assert q_bytes(q[1, :4]) == [0xFE, 0xFE, 0xFE, 0x7E]  # -Inf*-Inf, 1*-Inf, 0*-Inf, -3*-Inf
    assert q_bytes(q[2]) == [0] * 32


def test_quantizer_scales_are_powers_of_two_that_never_saturate():
    """On finite groups: a power of two at least amax / 448 and below twice it (above the
    floor), so |q| <= 448 without clamping, and q * scale is y to e4m3's precision."""
    gen = torch.Generator().manual_seed(1)
    y = (torch.randn(64, 256, generator=gen) * torch.logspace(-20, 20, 64)[:, None]).bfloat16()
    q, scales = group_quant_ue8m0(y, 32)
    amax = y.float().abs().unflatten(-1, (-1, 32)).amax(-1)
    mantissa, _ = torch.frexp(scales)
    assert (mantissa == 0.5).all()
    above = amax > 1e-10
    assert (scales * 448 >= amax).all() and (scales * 224 < amax)[above].all()
    assert (scales[~above] == 2.0**-42).all()
    back = q.float().unflatten(-1, (-1, 32)) * scales[..., None]
    error = (back.flatten(-2) - y.float()).abs()
    assert (error <= y.float().abs() * 2.0**-4 + scales.repeat_interleave(32, -1) * 2.0**-10).all()


@pytest.mark.parametrize("rows", [1, 6, 64])
def test_fallback_norm_within_an_ulp_and_quantizes_its_own_rows(rows):
    gen = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 1280, generator=gen) * 3).bfloat16()
    x[0, :7] = torch.tensor([0.0, -0.0, 1e-30, 3e4, -3e4, 2.0**-126, 65504.0]).bfloat16()
    w = (1 + 0.1 * torch.randn(1280, generator=gen)).bfloat16()
    y, q, scales = rmsnorm_quant_fp8(x, w, 1e-6)
    xd = x.double()
    exact = xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + 1e-6) * w.double()
    ulp = torch.ldexp(torch.ones_like(exact), torch.frexp(exact)[1] - 8).clamp(min=2.0**-133)
    assert ((y.double() - exact).abs() <= ulp).all()
    ref_q, ref_scales = group_quant_ue8m0(y, 32)
    assert q_bytes(q) == q_bytes(ref_q) and torch.equal(scales, ref_scales)


def test_fallback_writes_out_in_place():
    x = torch.randn(2, 256).bfloat16()
    w = torch.ones(256).bfloat16()
    out = (
        torch.empty(2, 256, dtype=torch.bfloat16),
        torch.empty(2, 256, dtype=torch.float8_e4m3fn),
        torch.empty(2, 2, dtype=torch.float32),
    )
    got = rmsnorm_quant_fp8(x, w, 1e-6, group_size=128, out=out)
    assert all(a is b for a, b in zip(got, out))
    ref = rmsnorm_quant_fp8(x, w, 1e-6, group_size=128)
    assert torch.equal(out[0], ref[0]) and q_bytes(out[1]) == q_bytes(ref[1])


def _pretend_h200(monkeypatch):
    pretend_arch(9, monkeypatch.setattr)
    pretend_toolchain(True, monkeypatch.setattr)
    from dsv41_kernels.ops.quantization import rmsnorm_quant_fp8 as op

    monkeypatch.setattr(op, "device_capability", lambda index: (9, 0))
    monkeypatch.setattr(op, "cuda_index", lambda device: 0)


def test_admission_table(monkeypatch):
    """The kernel on sm_90+ for aligned rows up to 8192 columns (q_lora's strided view
    included); the fallback elsewhere, with the reason."""
    x, w = torch.randn(6, 1792).bfloat16(), torch.ones(1280).bfloat16()
    q_lora = x[:, :1280]
    assert rmsnorm_quant_fp8_admission(q_lora, w, 1e-6).reason == "not a CUDA tensor"
    _pretend_h200(monkeypatch)
    admitted = rmsnorm_quant_fp8_admission(on_cuda(q_lora), on_cuda(w), 1e-6)
    assert admitted and admitted.kernel == "cuda", admitted.reason
    odd = on_cuda(torch.randn(6, 1283).bfloat16()[:, :1280])
    assert "16-byte aligned" in rmsnorm_quant_fp8_admission(odd, on_cuda(w), 1e-6).reason
    wide = on_cuda(torch.randn(2, 8192 + 32).bfloat16())
    wide_w = on_cuda(torch.ones(8192 + 32).bfloat16())
    assert "up to 8192" in rmsnorm_quant_fp8_admission(wide, wide_w, 1e-6).reason
    monkeypatch.setattr(
        "dsv41_kernels.ops.quantization.rmsnorm_quant_fp8.device_capability", lambda i: (8, 9)
    )
    assert "sm_90" in rmsnorm_quant_fp8_admission(on_cuda(q_lora), on_cuda(w), 1e-6).reason


X, W = torch.randn(4, 256).bfloat16(), torch.ones(256).bfloat16()
BAD = [
    (dict(x=X.float()), "x must have dtype"),
    (dict(x=X[0]), "x must be 2-D"),
    (dict(weight=W[:128]), "weight must be \\[256\\]"),
    (dict(eps=-1.0), "eps"),
    (dict(group_size=48), "group_size must be one of"),
    (
        dict(x=torch.randn(4, 96).bfloat16(), weight=torch.ones(96).bfloat16(), group_size=64),
        "multiple",
    ),
    (dict(out=(X,)), "out must be a tuple"),
    (
        dict(out=(torch.empty(4, 256).bfloat16(), torch.empty(4, 256), torch.empty(4, 8))),
        "out\\[1\\] \\(q\\)",
    ),
    (
        dict(
            out=(
                X,
                torch.empty(4, 256, dtype=torch.float8_e4m3fn),
                torch.empty(4, 8),
            )
        ),
        "x shares memory with the output",
    ),
]


@pytest.mark.parametrize("index", range(len(BAD)))
def test_bad_arguments_are_named(index):
    change, match = BAD[index]
    arguments = dict(x=X, weight=W, eps=1e-6, group_size=32, out=None) | change
    with pytest.raises(ValueError, match=match):
        rmsnorm_quant_fp8(
            arguments["x"], arguments["weight"], arguments["eps"],
            group_size=arguments["group_size"], out=arguments["out"],
        )  # fmt: skip
    verdict = rmsnorm_quant_fp8_admission(
        arguments["x"], arguments["weight"], arguments["eps"],
        group_size=arguments["group_size"], out=arguments["out"],
    )  # fmt: skip
    assert not verdict and verdict.reason.startswith("invalid arguments")
