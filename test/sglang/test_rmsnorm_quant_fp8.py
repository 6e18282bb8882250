"""rmsnorm_quant_fp8 against SGLang 0.5.23's own pair. CPU: the restated quantizer's scales
equal SGLang's Triton statement of its ue8m0 quantizer (``_per_token_group_quant_8bit_colmajor``,
``SCALE_UE8M0``; finite rows: the Triton statement propagates NaN where the CUDA kernel SGLang
runs ignores it), its codes torch's e4m3 cast of the scaled values. GPU (the H200): the
kernel's ``y`` equals FlashInfer's RMSNorm as ``sgl_kernel`` builds it (headers staged by
``tools/flashinfer_norm/stage.py``), and its ``(q, scales)`` what
``sglang_per_token_group_quant_fp8(y, 32, scale_ue8m0=True)`` returns there (the JIT kernel
``per_token_group_quant_8bit_v2``), bit for bit, on ``q_lora``'s strided view and on special
values."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from dsv41_kernels.reference.rmsnorm_quant_fp8 import group_quant_ue8m0
from dsv41_kernels.sglang_plugin import dispatch
from test.sglang import callers

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
NAN, INF = float("nan"), float("inf")


def finite_rows(rows: int, d: int, seed: int) -> torch.Tensor:
    """bf16 rows of every magnitude, an all-zero group, ties of the maximum, signed zeros."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn(rows, d, generator=gen) * torch.logspace(-30, 30, rows)[:, None]
    y[0, :32] = 0.0
    y[0, 32:40] = torch.tensor([0.0, -0.0, 448.0, -448.0, 448.0, 1e-30, -1e-38, 3e38])
    y[-1, 64:96] = 2.0**-133  # bf16's smallest subnormal
    return y.bfloat16()


def test_quantizer_is_sglangs_triton_statement(sglang):
    from sglang.kernels.ops.quantization.fp8_kernel import _per_token_group_quant_8bit_colmajor

    rows, d, group = 24, 1280, 32
    y = finite_rows(rows, d, seed=3)
    q = torch.empty(rows, d, dtype=torch.float8_e4m3fn)
    scales = torch.empty(d // group, rows)  # SGLang's column-major scale buffer
    _per_token_group_quant_8bit_colmajor[(rows * d // group,)](
        y, q, scales, group, d, scales.stride(0), 1e-10, -448.0, 448.0,
        BLOCK=group, SCALE_UE8M0=True,
    )  # fmt: skip
    ours_q, ours_scales = group_quant_ue8m0(y, group)
    assert torch.equal(ours_scales, scales.t())
    # The interpreter's e4m3 conversion does not round to nearest even (the GPU's does): the
    # codes are held to torch's own cast of the exactly scaled values instead.
    scaled = y.float().unflatten(-1, (-1, group)) / ours_scales[..., None]
    codes = scaled.flatten(-2).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(ours_q.view(torch.uint8), codes.view(torch.uint8))


# ---- GPU tier ------------------------------------------------------------------------------


def flashinfer_rmsnorm():
    from benchmark.kernels import common

    return common.flashinfer_rmsnorm(torch.cuda.current_device())


def needs_staged_flashinfer():
    from benchmark.kernels.common import flashinfer_norm_include

    return pytest.mark.skipif(
        flashinfer_norm_include() is None,
        reason="FlashInfer's norm headers not staged (python tools/flashinfer_norm/stage.py)",
    )


def sglang_pair(x, weight, eps, reference_norm):
    """SGLang's Q side on SM90: FlashInfer's RMSNorm, then its own ue8m0 group quantizer."""
    from sglang.kernels.ops.quantization.fp8_kernel import sglang_per_token_group_quant_fp8

    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    reference_norm(x, weight, y, eps)
    q, scales = sglang_per_token_group_quant_fp8(y, 32, scale_ue8m0=True)
    return y, q, scales


def assert_pair_equal(ours, theirs, what):
    (y, q, s), (ty, tq, ts) = ours, theirs
    assert torch.equal(y.view(torch.int16), ty.view(torch.int16)), what
    assert torch.equal(q.view(torch.uint8), tq.view(torch.uint8)), what
    assert torch.equal(s, ts), what


@pytest.mark.gpu
@needs_staged_flashinfer()
@pytest.mark.parametrize("rows", [1, 6, 24, 64, 384])
def test_gpu_equals_flashinfer_norm_and_sglangs_quantizer(sglang, rows):
    from dsv41_kernels.ops.quantization.rmsnorm_quant_fp8 import (
        rmsnorm_quant_fp8,
        rmsnorm_quant_fp8_admission,
    )

    norm = flashinfer_rmsnorm()
    gen = torch.Generator().manual_seed(rows)
    for trial in range(6):
        qkv_a = (torch.randn(rows, 1792, generator=gen) * 4.0**trial).bfloat16().cuda()
        q_lora = qkv_a[:, :1280]  # the view SGLang normalizes
        if trial % 3 == 2:  # special values: NaN, +-Inf, subnormals, signed zeros, a zero row
            q_lora[0, :8] = torch.tensor([NAN, INF, -INF, 0.0, -0.0, 1e-40, 3e38, -3e38])
            q_lora[-1] = 0.0
        weight = (1 + 0.1 * torch.randn(1280, generator=gen)).bfloat16().cuda()
        admission = rmsnorm_quant_fp8_admission(q_lora, weight, 1e-6)
        assert admission.kernel == "cuda", admission.reason
        ours = rmsnorm_quant_fp8(q_lora, weight, 1e-6, admission=admission)
        assert_pair_equal(ours, sglang_pair(q_lora, weight, 1e-6, norm), (rows, trial))


@pytest.mark.gpu
@needs_staged_flashinfer()
def test_gpu_hidden_width_and_graph_replay(sglang):
    """The 5120-wide hidden rows too, into out= buffers, captured once and replayed."""
    from dsv41_kernels.ops.quantization.rmsnorm_quant_fp8 import rmsnorm_quant_fp8

    norm = flashinfer_rmsnorm()
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(6, 5120, generator=gen).bfloat16().cuda()
    weight = torch.randn(5120, generator=gen).bfloat16().cuda()
    out = (
        torch.empty(6, 5120, dtype=torch.bfloat16, device="cuda"),
        torch.empty(6, 5120, dtype=torch.float8_e4m3fn, device="cuda"),
        torch.empty(6, 160, dtype=torch.float32, device="cuda"),
    )
    rmsnorm_quant_fp8(x, weight, 1e-6, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rmsnorm_quant_fp8(x, weight, 1e-6, out=out)
    for replay in range(3):
        x.copy_(torch.randn(6, 5120, generator=gen).bfloat16() * 10.0**replay)
        graph.replay()
        torch.cuda.synchronize()
        assert_pair_equal(out, sglang_pair(x, weight, 1e-6, norm), replay)


# ---- the hook on MQALayer._normalize_q_lora -----------------------------------------------

HOOK = "rmsnorm_quant_fp8._normalize_q_lora"


DeepGemmBlockLinear = callers.BlockFp8WqB
q_side_layer = callers.q_side_layer


def test_hook_is_on_the_call_site_and_declines_off_sm90(plugin, fired):
    layer = q_side_layer("cpu")
    y, for_wq_b = layer._compute_q_a(None, qkv_a=callers.wqkv_a_output(6, "cpu"))
    assert for_wq_b is y  # SGLang's own SM90 branch: the normed rows, twice
    counts = fired()[HOOK]
    assert counts["ours"] == 0 and any("not SM90" in r for r in counts["sglang"]), counts


def test_declines_where_wq_b_would_not_take_the_pair(plugin, fired, monkeypatch):
    """On a pretended SM90: the checks run in order up to the op's admission (CPU tensors: the
    kernel refuses them), each reason counted."""
    from sglang.srt.layers.quantization import fp8_utils

    from dsv41_kernels.sglang_plugin import rmsnorm_quant_fp8 as hook

    monkeypatch.setattr(hook, "get_platform", lambda: types.SimpleNamespace(is_sm90=True))
    monkeypatch.setattr(fp8_utils, "_deepgemm_block_fp8_supported", lambda *a: True)
    qkv_a = callers.wqkv_a_output(6, "cpu")
    cases = [
        (DeepGemmBlockLinear("cpu", dispatch=lambda **k: None), "not the block-FP8 DeepGEMM"),
        (DeepGemmBlockLinear("cpu"), "not a CUDA tensor"),
    ]
    marlin = DeepGemmBlockLinear("cpu")
    marlin.quant_method.use_marlin = True
    cases.append((marlin, "Marlin or MXFP8"))
    blocks = DeepGemmBlockLinear("cpu")
    blocks.quant_method.weight_block_size = [128, 128]
    cases.append((blocks, "not [32, 32]"))
    for wq_b, reason in cases:
        dispatch.reset()
        layer = q_side_layer("cpu", wq_b)
        layer.q_norm._forward_method = layer.q_norm.forward_cuda  # as on a CUDA machine
        # SGLang's CUDA norm cannot run here; the hook counted its decision before calling it.
        with contextlib.suppress(NameError):
            layer._compute_q_a(None, qkv_a=qkv_a)
        (why,) = fired()[HOOK]["sglang"]
        assert reason in why, (reason, why)
    monkeypatch.setattr(fp8_utils, "_deepgemm_block_fp8_supported", lambda *a: False)
    dispatch.reset()
    layer = q_side_layer("cpu")
    layer.q_norm._forward_method = layer.q_norm.forward_cuda
    with contextlib.suppress(NameError):
        layer._compute_q_a(None, qkv_a=qkv_a)
    (why,) = fired()[HOOK]["sglang"]
    assert "Triton fallback" in why, why
    dispatch.reset()
    q_side_layer("cpu")._compute_q_a(None, qkv_a=qkv_a)  # a CPU norm: its CPU forward
    (why,) = fired()[HOOK]["sglang"]
    assert "does not dispatch to its CUDA forward" in why, why


@pytest.mark.gpu
@needs_staged_flashinfer()
@pytest.mark.parametrize("rows", [1, 6, 64])
def test_gpu_hook_returns_sglangs_pair(plugin, fired, monkeypatch, rows):
    """Forced (no policy range measured yet), with ``wq_b`` as SM90 serves a V4.1 checkpoint:
    SGLang's caller gets FlashInfer's normed rows and SGLang's (q, scales) of them."""
    from sglang.srt.layers.quantization import fp8_utils

    monkeypatch.setenv("DSV41_KERNELS_FORCE", "rmsnorm_quant_fp8")
    monkeypatch.setattr(fp8_utils, "_deepgemm_block_fp8_supported", lambda *a: True)
    layer = q_side_layer("cuda")
    qkv_a = callers.wqkv_a_output(rows, "cuda", seed=rows)
    y, (codes, scales) = layer._compute_q_a(None, qkv_a=qkv_a)
    q = qkv_a[:, :1280]
    assert fired()[HOOK] == {"ours": 1, "sglang": {}}
    norm = layer.q_norm
    theirs = sglang_pair(q, norm.weight, norm.variance_epsilon, flashinfer_rmsnorm())
    assert_pair_equal((y, codes, scales), theirs, rows)


def test_benchmarks_run_flashinfers_norm_where_sgl_kernel_is_a_stand_in(sglang, monkeypatch):
    """``common.sgl_kernel_rmsnorm``: a stand-in ``layernorm.rmsnorm`` (the H200's environment)
    runs FlashInfer's norm inside the block, and is put back after; a real one is left alone."""
    from benchmark.kernels import common
    from sglang.srt.layers import layernorm

    class _PlaceholderMeta(type):  # the stand-ins' metaclass, by name
        pass

    stand_in = _PlaceholderMeta("rmsnorm", (), {})
    calls = []
    monkeypatch.setattr(common, "flashinfer_rmsnorm", lambda index=0: lambda *a: calls.append(a))
    monkeypatch.setattr(layernorm, "rmsnorm", stand_in, raising=False)
    x, w = torch.randn(2, 16).bfloat16(), torch.ones(16).bfloat16()
    with common.sgl_kernel_rmsnorm():
        y = layernorm.rmsnorm(x, w, 1e-6)
        assert y.shape == x.shape and y.is_contiguous() and calls[0][2] is y
    assert layernorm.rmsnorm is stand_in
    real = lambda *a: None  # noqa: E731
    monkeypatch.setattr(layernorm, "rmsnorm", real)
    with common.sgl_kernel_rmsnorm():
        assert layernorm.rmsnorm is real


class _StopAfterWqB(BaseException):  # past the hook's fallback, which takes Exception
    pass


class RecordingWqB(callers.BlockFp8WqB):
    """The indexer's ``wq_b``: records its input, then stops ``compute_q`` (its later fused
    kernels need CUDA)."""

    def __init__(self, device):
        super().__init__(device)
        self.inputs = []

    def __call__(self, x):
        self.inputs.append(x)
        raise _StopAfterWqB


def c4_indexer(wq_b):
    from sglang.srt.layers.attention.dsv4.indexer import C4Indexer

    indexer = C4Indexer.__new__(C4Indexer)
    torch.nn.Module.__init__(indexer)
    object.__setattr__(indexer, "wq_b", wq_b)
    return indexer


def test_indexer_takes_the_pair_of_our_rows(plugin, fired, monkeypatch):
    """``C4Indexer.compute_q`` hands its ``wq_b`` the pair our launch made of the same rows
    (through ``q_lora_quant``); other rows, or a pair of SGLang's, go as SGLang passes them."""
    from sglang.srt.layers.quantization import fp8_utils

    from dsv41_kernels.sglang_plugin import rmsnorm_quant_fp8 as hook

    monkeypatch.setattr(fp8_utils, "_deepgemm_block_fp8_supported", lambda *a: True)  # SM90
    wq_b = RecordingWqB("cpu")
    indexer = c4_indexer(wq_b)
    y = torch.randn(6, 1280).bfloat16()
    pair = (torch.zeros(6, 1280, dtype=torch.float8_e4m3fn), torch.ones(6, 40))
    setattr(y, hook.PAIR, (*pair, 32))
    with pytest.raises(_StopAfterWqB):
        indexer.compute_q(y, None, None)
    # (the stop inside wq_b leaves the call uncounted: a hook counts ours when it returns)
    assert wq_b.inputs[-1][0] is pair[0] and wq_b.inputs[-1][1] is pair[1]
    dispatch.reset()
    plain = torch.randn(6, 1280).bfloat16()
    with pytest.raises(_StopAfterWqB):
        indexer.compute_q(plain, None, None)
    assert wq_b.inputs[-1] is plain
    (why,) = fired()[hook.INDEXER_HOOK]["sglang"]
    assert "not rows our Q-side launch normed" in why
    setattr(y, hook.PAIR, (*pair, 128))
    dispatch.reset()
    with pytest.raises(_StopAfterWqB):
        indexer.compute_q(y, None, None)
    assert wq_b.inputs[-1] is y
    (why,) = fired()[hook.INDEXER_HOOK]["sglang"]
    assert "groups 32 columns, the pair 128" in why
