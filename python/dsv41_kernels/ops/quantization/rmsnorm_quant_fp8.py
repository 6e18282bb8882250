"""RMSNorm and e4m3 per-token-group quantization with power-of-two scales in one launch.

DeepSeek-V4.1's attention on Hopper (SGLang 0.5.23, ``MQALayer._normalize_q_lora`` then
``_compute_q_b``) runs ``q_norm`` on ``q_lora`` (``[T, 1280]``, a strided view of the fused
``wqkv_a`` output) and then ``wq_b``, whose block-FP8 linear (``[32, 32]`` ue8m0 checkpoints)
quantizes its bf16 input per group of 32 before DeepGEMM: two launches per attention layer, 40
per verify step. Only Blackwell fuses them (``rmsnorm_mxfp8``). The SM90 linear takes a
pre-quantized ``(q, scales)`` pair as it is, so one launch can produce both, and the bf16 rows
the indexer reads.

Contract: ``(y, q, scales)`` with ``y`` bf16 ``[T, d]`` the norm of ``x`` and ``(q, scales)`` the
quantization of ``y`` (:mod:`dsv41_kernels.reference.rmsnorm_quant_fp8`):
- ``kernel == "cuda"`` (sm_90+; ``sgl-kernel/csrc/rmsnorm_quant_fp8.cu``): ``y`` is bitwise
  FlashInfer's ``RMSNormKernel`` as ``sgl_kernel`` and FlashInfer's JIT build it
  (``-use_fast_math``: the same approximate division and reciprocal square root), and
  ``(q, scales)`` bitwise SGLang's ``per_token_group_quant_8bit_v2`` of that ``y``;
- the torch fallback: ``y`` in IEEE fp32 roundings (it may differ from FlashInfer's in the last
  bit), ``(q, scales)`` bitwise SGLang's quantizer of that ``y``.
``q`` float8_e4m3fn ``[T, d]``, ``scales`` fp32 ``[T, d / group_size]`` row-major, each ``2^e``:
what ``sglang_per_token_group_quant_fp8(y, group_size, scale_ue8m0=True)`` returns on SM90.
No host sync; with ``out`` nothing is allocated (CUDA-graph safe).
"""

from __future__ import annotations

import torch

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_admission,
    check_float,
    check_inputs_apart,
    check_int,
    check_tensor,
    cuda_kernel_runs,
    invalid,
    refuse,
)
from dsv41_kernels.devices import cuda_index, device_capability
from dsv41_kernels.jit import load_module
from dsv41_kernels.reference.rmsnorm_quant_fp8 import group_quant_ue8m0, rmsnorm

MODULE = "rmsnorm_quant_fp8"
GROUP_SIZES = (32, 64, 128)
MAX_COLUMNS = 8192
"""FlashInfer's one-round rows: 8 bf16 a thread, at most 1024 threads."""


def _validate(x, weight, eps, group_size, out) -> None:
    check_tensor("x", x, dtypes=(torch.bfloat16,), ndim=2)
    check_tensor("weight", weight, dtypes=(torch.bfloat16,), ndim=1)
    check_float("eps", eps, low=0.0)
    check_int("group_size", group_size)
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size}")
    rows, d = x.shape
    if d == 0 or d % group_size:
        raise ValueError(f"x's {d} columns must be a positive multiple of group_size")
    if weight.shape[0] != d or weight.device != x.device:
        raise ValueError(f"weight must be [{d}] on {x.device}, got {tuple(weight.shape)}")
    if out is None:
        return
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise ValueError("out must be a tuple (y, q, scales)")
    want = (
        ("out[0] (y)", (rows, d), torch.bfloat16),
        ("out[1] (q)", (rows, d), torch.float8_e4m3fn),
        ("out[2] (scales)", (rows, d // group_size), torch.float32),
    )
    for (name, shape, dtype), t in zip(want, out):
        check_tensor(name, t, dtypes=(dtype,), ndim=2)
        if tuple(t.shape) != shape or t.device != x.device or t.stride(-1) != 1:
            raise ValueError(f"{name} must be {list(shape)} with unit last stride on {x.device}")
    outputs = dict(zip(("out[0] (y)", "out[1] (q)", "out[2] (scales)"), out))
    check_inputs_apart(outputs, {"x": x, "weight": weight})


def _aligned(t: torch.Tensor, elements: int) -> bool:
    """Rows that start on a ``elements``-element boundary (16 bytes for bf16)."""
    rows_ok = t.stride(0) % elements == 0  # checked for one row too, as the module checks it
    return t.stride(-1) == 1 and rows_ok and t.data_ptr() % (elements * t.element_size()) == 0


def _plan(x, weight, out) -> Admission:
    if not x.is_cuda:
        return refuse("not a CUDA tensor")
    d = x.shape[1]
    if d > MAX_COLUMNS or d % 8:
        return refuse(f"{d} columns: the kernel takes multiples of 8 up to {MAX_COLUMNS}")
    if device_capability(cuda_index(x.device))[0] < 9:
        return refuse("the kernel needs sm_90+")
    tensors = [x, weight] + ([] if out is None else [out[0]])
    if not all(_aligned(t if t.dim() == 2 else t[None], 8) for t in tensors):
        return refuse("x, weight or y not 16-byte aligned with unit last stride")
    if out is not None and not _aligned(out[1].view(torch.uint8), 8):
        return refuse("q not 8-byte aligned with unit last stride")
    runs, note = cuda_kernel_runs(MODULE, x, True)
    if not runs:
        return refuse(note)
    return admit("cuda", f"one CTA a row, {d} columns{note}", module=MODULE)


def rmsnorm_quant_fp8_admission(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, group_size: int = 32, out=None
) -> Admission:
    """Whether the one-launch kernel runs (``kernel == "cuda"``), else why the fallback does;
    never raises, reads no values."""
    try:
        _validate(x, weight, eps, group_size, out)
    except ValueError as e:
        return invalid(e)
    return _plan(x, weight, out)


def rmsnorm_quant_fp8_torch(x, weight, eps, group_size, out=None):
    """The fallback: the norm in fp32 torch ops, then SGLang's quantizer of its ``y``."""
    y = rmsnorm(x, weight, eps)
    q, scales = group_quant_ue8m0(y, group_size)
    if out is None:
        return y, q, scales
    for dst, src in zip(out, (y, q, scales)):
        dst.copy_(src)
    return tuple(out)


def rmsnorm_quant_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    group_size: int = 32,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    admission: Admission | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, q, scales)`` of ``x`` (see the module's contract).

    - ``x``: bf16 ``[T, d]``, unit last stride (rows may be strided: ``q_lora`` is a view).
    - ``weight``: bf16 ``[d]``, the norm's; ``eps``: its epsilon.
    - ``group_size``: columns a scale covers (32, 64 or 128; V4.1's ``wq_b`` takes 32).
    - ``out``: preallocated ``(y bf16 [T, d], q e4m3 [T, d], scales fp32 [T, d / group_size])``
      with unit last strides, written in place (never overlapping ``x`` or ``weight``).
    - ``admission``: this call's :func:`rmsnorm_quant_fp8_admission`, when the caller made it.
    """
    check_admission(admission)
    if admission is None or not admission:
        _validate(x, weight, eps, group_size, out)
    if admission is None:
        admission = _plan(x, weight, out)
    if not admission:
        return rmsnorm_quant_fp8_torch(x, weight, eps, group_size, out)
    rows, d = x.shape
    if out is None:
        out = (
            torch.empty(rows, d, dtype=torch.bfloat16, device=x.device),
            torch.empty(rows, d, dtype=torch.float8_e4m3fn, device=x.device),
            torch.empty(rows, d // group_size, dtype=torch.float32, device=x.device),
        )
    y, q, scales = out
    load_module(MODULE, cuda_index(x.device)).rmsnorm_quant_fp8_cuda(
        x, weight, y, q.view(torch.uint8), scales, group_size, float(eps)
    )
    return tuple(out)
