"""Inverse RoPE and FP8 group quantization of the attention output in one launch (Hopper).

SGLang 0.5.23 fuses the inverse RoPE into its ``wo_a`` linear layer only on SM100
(``fused_rope_wo_a_bf16``, gated by ``_fused_wo_a_arch_supported()``,
``srt/models/deepseek_v4.py:487``). On SM90, with the FP8 ``wo_a`` (128x128 block scales,
``SGLANG_OPT_FP8_WO_A_GEMM`` on by default), every attention layer runs
(``MQALayer.forward``, ``deepseek_v4.py:2952-3024``):

1. ``fused_rope_inplace(o[..., -64:], None, freqs_cis, positions=positions, inverse=True)``
   (:2954): a tvm-ffi JIT CUDA kernel (``kernels/ops/attention/dsv4/norm_rope.py:142``,
   ``jit/csrc/deepseek_v4/rope.cuh``), one warp per (token, head), in place;
2. ``o.reshape(T * G, D).contiguous()`` (:3011): a copy whenever ``o`` is a slice of a wider
   head buffer (the attention kernel's padding to 64 heads at TP > 1, :2904);
3. ``sglang_per_token_group_quant_fp8(..., group_size=128, scale_ue8m0=False)`` (:3010,
   ``kernels/ops/quantization/fp8_kernel.py:489``): on CUDA another tvm-ffi JIT kernel,
   ``per_token_group_quant`` (``kernels/ops/quantization/per_token_group_quant.py``, built with
   ``--use_fast_math`` from ``jit/csrc/gemm/per_token_group_quant.cuh``; the ``sgl_kernel``
   wheel is not involved), viewed back as ``[T, G, D]`` and ``[T, G, D / 128]`` for
   ``_fp8_wo_a_einsum`` (DeepGEMM ``fp8_einsum``, recipe ``(1, 128, 128)``).

Here ``o`` is ``[T, H, 512]`` (448 nope + 64 rope per head), ``G`` the local output groups and
``D = H * 512 / G`` (4096 for DeepSeek-V4.1's 64 heads in 8 groups). This op reads ``o`` where
it lies (any token and head strides), rotates the rope values in registers and writes SGLang's
e4m3 values and fp32 scales in one launch, optionally writing the rotated values back into
``o`` as step 1 leaves them.

Kernels (:class:`InverseRopeQuantKernel`, the admission's ``kernel``, in its
:class:`InverseRopeQuantPlan` with the launch shape; both give the same bits):

- ``cuda``: ``sgl-kernel/csrc/inverse_rope_quant_fp8.cu`` on sm_90+ for SGLang's group size
  128: a warp a group (several when the grid would not be resident at once), only the lanes of
  rope pairs waiting on the position and the table, launched as SGLang launches its own two
  kernels on Hopper (a programmatic dependent launch; with ``tables_ready`` the position and
  the table are read before the wait, as SGLang's RoPE kernel reads them).
  It needs ``o`` 8-byte aligned with token and head strides of 4 values, table rows 16-byte
  aligned with unit last stride and an even width, and the module at hand (prebuilt, cached or
  built now);
- ``triton``: :mod:`.inverse_rope_quant_fp8_triton`, for every other admitted call (any group
  size, any even strides, the interpreter on CPU, no CUDA module).

Contract: ``(o_fp8, o_scales)`` and the rotated ``o`` are **bitwise equal** to
:func:`dsv41_kernels.reference.inverse_rope_quant_fp8.inverse_rope_quant_fp8`, the restatement
of SGLang's two kernels (read there). On a GPU the instructions that decide the bits are the
ones SGLang's kernels compile to (checked in the SASS of both, sm_90a): one ``fma.rn.f32`` per
rotated value with the sine product rounded first, the scale ``amax * 0x3B124925``, the
multiplier ``div.approx.ftz.f32(448, amax)`` (``MUFU.RCP`` then ``FMUL.FTZ``) and
``cvt.rn.satfinite.e4m3x2.f32``, one per (even, odd) pair; the bf16 rounding of the rotated
values (to nearest even, NaN -> 0x7FFF) and the NaN-ignoring maximum are integer arithmetic on
every device. Under the Triton interpreter the e4m3 conversion is emulated with integers and
the reciprocal is the reference's model of ``MUFU.RCP``. Outputs are ``o_fp8`` float8_e4m3fn
``[T, G, D]`` and ``o_scales`` fp32 ``[T, G, D / group_size]``, contiguous: the layouts
SGLang's quantizer allocates (row-major scales) and the ``wo_a`` linear layer reads. A position
outside ``freqs_cis`` gives NaN in that token's rotated values, never a read out of bounds. A
Triton program quantizes a block of groups of one token, a CUDA warp one to four groups.
Neither syncs the host or allocates anything but the outputs (``out=`` takes the caller's), so
both capture into a CUDA graph.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import triton

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_admission,
    check_flag,
    check_int,
    check_outputs,
    check_tensor,
    cuda_kernel_runs,
    invalid,
    refuse,
    triton_device,
)
from dsv41_kernels.devices import device_capability, one_wave
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.attention.inverse_rope_quant_fp8_triton import launch_triton
from dsv41_kernels.reference.inverse_rope_quant_fp8 import (
    inverse_rope_quant_fp8 as reference_inverse_rope_quant_fp8,
)

GROUP_SIZES = (16, 32, 64, 128, 256)  # SGLang's quantizer's (per_token_group_quant.py)
POSITION_DTYPES = (torch.int32, torch.int64)
MODULE = "inverse_rope_quant_fp8"  # sgl-kernel/csrc/inverse_rope_quant_fp8.cu
CUDA_GROUP_SIZE = 128
CUDA_MAX_GROUPS_PER_TOKEN = 65535  # the CUDA grid's y limit
CUDA_WARPS = 4  # warps a CTA: the .cu's default, which the launch-shape sweep kept
CUDA_GROUPS_PER_WARP = 2
"""Groups a warp of the CUDA kernel takes when a warp a group would not be resident at once:
their loads overlap, where one group a warp is one chain of latencies."""
VALUES_PER_PROGRAM = 1024  # a Triton program's values (groups x group size), 8 a thread
TRITON_WARPS = 4  # 128 threads: four (even, odd) pairs a thread at VALUES_PER_PROGRAM


class InverseRopeQuantKernel(enum.Enum):
    CUDA = "cuda"  # sgl-kernel/csrc/inverse_rope_quant_fp8.cu, a warp per 1, 2 or 4 groups
    TRITON = "triton"  # inverse_rope_quant_fp8_triton.py, a program per block of groups


CUDA, TRITON = InverseRopeQuantKernel.CUDA.value, InverseRopeQuantKernel.TRITON.value
"""The admission's ``kernel`` names."""


@dataclass(frozen=True)
class InverseRopeQuantPlan:
    """The kernel and its launch shape, chosen by :func:`_plan` (every shape gives the same
    bits)."""

    kernel: InverseRopeQuantKernel
    warps: int  # CUDA: warps a CTA, 1, 2, 4 or 8; Triton: num_warps
    groups: int  # CUDA: groups a warp, 1, 2 or 4; Triton: groups a program, a power of two


def _validate(o, freqs_cis, positions, o_groups, group_size, out) -> tuple[int, int]:
    """Raise ValueError naming the argument unless the call is well-formed; returns
    ``(o_groups, group_size)`` as ints."""
    check_tensor("o", o, dtypes=(torch.bfloat16,), ndim=3)
    check_tensor("freqs_cis", freqs_cis, dtypes=(torch.complex64,), ndim=2)
    check_tensor("positions", positions, dtypes=POSITION_DTYPES, ndim=1)
    tokens, heads, head_dim = o.shape
    o_groups, group_size = _scalars(o, o_groups, group_size)
    if head_dim % group_size:
        raise ValueError(f"o.shape[2] (head_dim {head_dim}) must be a multiple of group_size")
    if freqs_cis.shape[0] == 0:
        raise ValueError("freqs_cis must have at least one row")
    if freqs_cis.is_conj():
        raise ValueError("freqs_cis must not be a lazily conjugated view (resolve_conj() it)")
    if not 0 < 2 * freqs_cis.shape[1] <= head_dim:
        raise ValueError(
            f"freqs_cis.shape[1] ({freqs_cis.shape[1]}) must give a rope width of at most the "
            f"head_dim {head_dim}"
        )
    if positions.shape[0] != tokens:
        raise ValueError(f"positions must have o.shape[0] ({tokens}) entries")
    for name, t in (("freqs_cis", freqs_cis), ("positions", positions)):
        if t.device != o.device:
            raise ValueError(f"{name} must be on o's device {o.device}, got {t.device}")
    if out is not None:
        codes_shape, scales_shape = _output_shapes(o, o_groups, group_size)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ValueError("out must be a pair (o_fp8, o_scales)")
        for name, t, shape, dtype in (
            ("out[0]", out[0], codes_shape, torch.float8_e4m3fn),
            ("out[1]", out[1], scales_shape, torch.float32),
        ):
            check_tensor(name, t, dtypes=(dtype,), ndim=3)
            if tuple(t.shape) != shape or not t.is_contiguous() or t.device != o.device:
                raise ValueError(
                    f"{name} must be a contiguous {shape} tensor on {o.device}, got "
                    f"{tuple(t.shape)} on {t.device}"
                )
            if t.data_ptr() % 4:
                raise ValueError(f"{name} must start 4-byte aligned (it is written in words)")
        check_outputs({"out[0]": out[0], "out[1]": out[1]})
    return o_groups, group_size


def _scalars(o, o_groups, group_size) -> tuple[int, int]:
    """``(o_groups, group_size)`` as Python ints, checked (ValueError naming the argument): on
    every call, a caller's admission or not, so the launch never gets a NumPy or float value."""
    group_size = check_int("group_size", group_size)
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    o_groups, heads = check_int("o_groups", o_groups), o.shape[1]
    if o_groups < 1 or heads < 1 or heads % o_groups:
        raise ValueError(f"o_groups must be a positive divisor of o.shape[1] ({heads} heads)")
    return o_groups, group_size


def _output_shapes(o, o_groups, group_size):
    tokens, heads, head_dim = o.shape
    width = heads * head_dim // o_groups
    return (tokens, o_groups, width), (tokens, o_groups, width // group_size)


def _pair_words(o: torch.Tensor) -> bool:
    """Whether the kernel can index ``o``: contiguous heads (read as one 32-bit word per
    (even, odd) pair, so strides and offset even), no two (token, head) rows overlapping,
    tokens outermost. Strides of size-1 dimensions only need to be even."""
    tokens, heads, head_dim = o.shape
    if o.stride(2) != 1 or o.stride(0) % 2 or o.stride(1) % 2 or o.storage_offset() % 2:
        return False
    if heads > 1 and o.stride(1) < head_dim:
        return False
    row = o.stride(1) * (heads - 1) + head_dim
    return tokens <= 1 or o.stride(0) >= row


def _cuda_fits(o: torch.Tensor, freqs_cis: torch.Tensor, group_size: int) -> str | None:
    """Why the CUDA kernel cannot take this admitted call, or None: what its host side checks
    (sm_90+, group size 128, o read in 8-byte pairs of pairs, the table as 16-byte rows)."""
    if device_capability(o.device.index) < (9, 0):
        return "the CUDA kernel is built for sm_90+"
    if group_size != CUDA_GROUP_SIZE:
        return f"the CUDA kernel takes group_size {CUDA_GROUP_SIZE}"
    if o.stride(0) % 4 or o.stride(1) % 4 or o.data_ptr() % 8:
        return "the CUDA kernel reads o in 8-byte words (strides of 4 values)"
    if (
        freqs_cis.shape[1] % 2
        or freqs_cis.stride(1) != 1
        or freqs_cis.stride(0) % 2
        or freqs_cis.data_ptr() % 16
    ):
        return "the CUDA kernel reads freqs_cis in 16-byte rows (an even width, contiguous rows)"
    if o.shape[1] * o.shape[2] // group_size > CUDA_MAX_GROUPS_PER_TOKEN or o.shape[0] >= 2**31:
        return "too many groups a token or tokens for the CUDA grid"
    return None


def cuda_plan(o: torch.Tensor) -> InverseRopeQuantPlan:
    """The CUDA kernel's launch shape: a group a warp while a warp a group is surely resident
    at once (:func:`dsv41_kernels.devices.one_wave`, a bound below the kernel's own occupancy),
    :data:`CUDA_GROUPS_PER_WARP` beyond."""
    tokens, heads, head_dim = o.shape
    resident = one_wave(tokens * heads * head_dim // CUDA_GROUP_SIZE, 1, o.device)
    groups = 1 if resident else CUDA_GROUPS_PER_WARP
    return InverseRopeQuantPlan(InverseRopeQuantKernel.CUDA, CUDA_WARPS, groups)


def triton_plan(o: torch.Tensor, group_size: int) -> InverseRopeQuantPlan:
    """The Triton kernel's launch shape: :data:`VALUES_PER_PROGRAM` values a program, fewer
    groups when a token has fewer."""
    groups_per_token = o.shape[1] * o.shape[2] // group_size
    block_groups = min(triton.next_power_of_2(groups_per_token), VALUES_PER_PROGRAM // group_size)
    return InverseRopeQuantPlan(InverseRopeQuantKernel.TRITON, TRITON_WARPS, block_groups)


def _plan(o: torch.Tensor, freqs_cis: torch.Tensor, group_size: int) -> Admission:
    """The admission of valid arguments, with its :class:`InverseRopeQuantPlan`."""
    where = triton_device(o)
    if not where:
        return where
    if o.is_cuda and (torch.version.hip or device_capability(o.device.index) < (8, 9)):
        return refuse("needs an NVIDIA GPU with e4m3 conversions (sm_89+): the kernel's are PTX")
    if not _pair_words(o):
        return refuse("o is not read as pairs of rows apart (last stride 1, even strides)")
    why_not = _cuda_fits(o, freqs_cis, group_size) if o.is_cuda else "no CUDA device"
    runs, note = cuda_kernel_runs(MODULE, o, why_not is None)
    if runs:
        return admit(CUDA, f"cuda, {tuple(o.shape)}{note}", MODULE, cuda_plan(o))
    reason = f"{where.reason}, triton, {tuple(o.shape)}{note or f' ({why_not})'}"
    return admit(TRITON, reason, plan=triton_plan(o, group_size))


def inverse_rope_quant_fp8_admission(
    o, freqs_cis, positions, *, o_groups, group_size: int = 128, out=None
) -> Admission:
    """Which kernel runs for this call (``cuda`` or ``triton``), or why none does (the torch
    fallback then); pure: shapes, dtypes, strides, device, the module's availability."""
    try:
        _, group_size = _validate(o, freqs_cis, positions, o_groups, group_size, out)
    except ValueError as e:
        return invalid(e)
    return _plan(o, freqs_cis, group_size)


def launch_cuda(
    o, freqs_cis, positions, codes, scales, *, warps: int, groups: int, rotate_o: bool,
    tables_ready: bool,
) -> None:  # fmt: skip
    """The CUDA kernel on admitted arguments with at least one token, ``warps`` warps a CTA
    and ``groups`` groups a warp (a plan's launch shape; ``tables_ready``: as in
    :func:`inverse_rope_quant_fp8`)."""
    tokens = o.shape[0]
    module = load_module(MODULE, o.device.index)
    module.inverse_rope_quant_fp8_cuda(
        o,
        freqs_cis.view(torch.float32),
        positions,
        codes.view(torch.uint8).view(tokens, -1),
        scales.view(tokens, -1),
        rotate_o,
        tables_ready,
        warps,
        groups,
    )


def launch(
    plan: InverseRopeQuantPlan, o, freqs_cis, positions, codes, scales, *, group_size: int,
    rotate_o: bool, tables_ready: bool,
) -> None:  # fmt: skip
    """The kernel ``plan`` names, at its launch shape, on valid, admitted arguments, into
    ``codes`` / ``scales`` (contiguous); nothing to launch without tokens."""
    if o.shape[0] == 0:
        return
    if plan.kernel is InverseRopeQuantKernel.CUDA:
        launch_cuda(
            o, freqs_cis, positions, codes, scales, warps=plan.warps, groups=plan.groups,
            rotate_o=rotate_o, tables_ready=tables_ready,
        )  # fmt: skip
    else:
        launch_triton(
            o, freqs_cis, positions, codes, scales, group_size=group_size, rotate_o=rotate_o,
            block_groups=plan.groups, num_warps=plan.warps,
        )  # fmt: skip


def inverse_rope_quant_fp8(
    o: torch.Tensor,
    freqs_cis: torch.Tensor,
    positions: torch.Tensor,
    *,
    o_groups: int,
    group_size: int = 128,
    rotate_o: bool = False,
    tables_ready: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    admission: Admission | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's inverse RoPE then FP8 group quantization of the attention output, bitwise.

    Args:
        o: bf16 ``[T, H, head_dim]``, the rope values the last ``2 * freqs_cis.shape[1]`` of
            each head.
        freqs_cis: complex64 ``[rows, rope_dim / 2]``, (cosine, sine) per rope pair.
        positions: int32/int64 ``[T]``, rows of ``freqs_cis`` (one outside it gives NaN).
        o_groups: ``G``, the groups ``o`` is viewed in (``H`` a multiple).
        group_size: values per scale, one of :data:`GROUP_SIZES`.
        rotate_o: also write the rotated rope values into ``o``, as SGLang's in-place RoPE
            leaves them.
        tables_ready: the caller's promise that the kernel launched just before on this stream
            does not write ``positions`` or ``freqs_cis``; the CUDA kernel then reads them
            before waiting for that kernel (a programmatic dependent launch), as SGLang's own
            RoPE kernel does, and the bits are the same.
        out: the caller's ``(o_fp8, o_scales)`` to write, both contiguous.
        admission: this call's :func:`inverse_rope_quant_fp8_admission`, when the caller
            already made it; an admitted one spares the tensor checks (the scalars and what
            the call writes are checked on every call).

    Returns ``(o_fp8, o_scales)``: e4m3 ``[T, G, D]`` and fp32 ``[T, G, D / group_size]``,
    ``D = H * head_dim / G``.
    """
    check_admission(admission)
    rotate_o, tables_ready = (
        check_flag("rotate_o", rotate_o),
        check_flag("tables_ready", tables_ready),
    )
    if admission is None or not admission:
        o_groups, group_size = _validate(o, freqs_cis, positions, o_groups, group_size, out)
        admission = _plan(o, freqs_cis, group_size) if admission is None else admission
    else:  # an admitted admission has validated the tensors: the scalars remain
        o_groups, group_size = _scalars(o, o_groups, group_size)
    # What the call writes (o too, with rotate_o) must own its elements and share none.
    written = {"o": o if rotate_o else None}
    check_outputs(written | ({} if out is None else {"out[0]": out[0], "out[1]": out[1]}))
    codes_shape, scales_shape = _output_shapes(o, o_groups, group_size)
    if out is None:
        out = (
            torch.empty(codes_shape, dtype=torch.float8_e4m3fn, device=o.device),
            torch.empty(scales_shape, dtype=torch.float32, device=o.device),
        )
    codes, scales = out
    if admission:
        launch(
            admission.plan, o, freqs_cis, positions, codes, scales, group_size=group_size,
            rotate_o=rotate_o, tables_ready=tables_ready,
        )  # fmt: skip
        return codes, scales
    ref_codes, ref_scales, rotated = reference_inverse_rope_quant_fp8(
        o, freqs_cis, positions, o_groups=o_groups, group_size=group_size
    )
    codes.copy_(ref_codes)
    scales.copy_(ref_scales)
    if rotate_o:
        o.copy_(rotated)
    return codes, scales
