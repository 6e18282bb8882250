"""mHC combine + RMSNorm, optionally with the MXFP8 quantization of its output, in one launch.

On DeepSeek-V4.1's hyper-connection path the four residual streams are collapsed with the
``pre`` gates, rounded to bf16 and RMS-normalised before the attention's first projection,
which (with an MXFP8 GEMM) then quantizes the result again in a second launch that only
re-reads what the first wrote. ``hc_combine_norm_mxfp8`` writes y, its e4m3 data and the
swizzled UE8M0 scales from the registers that hold the row.

Contract (``x [m, 4*H]`` bf16, ``pre [m, 4]`` fp32, ``weight [H]`` bf16, ``H % 32 == 0``):

- ``hc_combine_norm`` is **bitwise equal** to :func:`dsv41_kernels.reference.mhc.hc_combine_norm`:
  ``x_in = bf16(((p0·x0 + p1·x1) + p2·x2) + p3·x3)`` in fp32 without fused multiply-adds,
  then ``y = bf16((x_in · inv) · weight)`` with ``inv = 1/sqrt(Σx_in²/H + eps)`` (each step one
  IEEE fp32 rounding). Every element of y is within one bf16 ulp of the same norm evaluated
  in float64 (away from fp32 overflow of Σx_in²).
- The sum of squares has no reduction order to fix: each ``x_in²`` is an exact multiple of a
  power of two, so it is summed in int64 fixed point (unit 2^-48 of the row's largest binade,
  smaller terms truncated) and rounded once to fp32. Integer addition is associative, so a
  row's bits do not depend on ``m``, its position in the batch, the tiling, the number of
  warps or the device: y is batch-invariant by construction, and the Triton interpreter
  gives the GPU's bits.
- ``hc_combine_norm_mxfp8`` returns ``(y, Mxfp8SwizzledInput(data, scales))`` **bitwise equal**
  to ``hc_combine_norm`` followed by :func:`dsv41_kernels.mxfp8_quantize` (FlashInfer's cuda
  backend bytes, 128x4 swizzled scales); the scale buffer is written in full, padding rows up
  to the 128-row tile and padding columns 0, for any ``m``.

One program per row holds the whole row (``H`` rounded up to a power of two of 32-value
blocks) in registers and reads x once; with quantization, a few extra programs zero the
padding rows of the last scale tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.admission import Admission, admit, check_tensor, refuse, triton_device
from dsv41_kernels.ops.quantization.mxfp8_quantize import (
    Mxfp8SwizzledInput,
    bf16_bits_to_f32,
    mxfp8_encode_blocks,
    mxfp8_quantize,
    swizzled_scale_offset,
)
from dsv41_kernels.reference.mhc import HC_MULT
from dsv41_kernels.reference.mhc import hc_combine_norm as reference_hc_combine_norm
from dsv41_kernels.reference.mxfp8 import SF_VEC_SIZE, scale_buffer_size
from dsv41_kernels.reference.mxfp8 import mxfp8_quantize as reference_mxfp8_quantize

MAX_ROW_BLOCK = 16384  # values of one row held in registers (H rounded up to 32 * 2^k)
PAD_ROWS = 32  # scale-padding rows zeroed per extra program


def _check_inputs(x, pre, weight, eps, *, quantize: bool) -> tuple[int, int]:
    """Raise ValueError naming the argument unless the shapes and dtypes are the contract's."""
    check_tensor("x", x, dtypes=(torch.bfloat16,), ndim=2)
    m, width = x.shape
    if width % HC_MULT or width == 0:
        raise ValueError(f"x must be [m, {HC_MULT}*H] with H > 0, got {tuple(x.shape)}")
    h = width // HC_MULT
    if quantize and h % SF_VEC_SIZE:
        raise ValueError(f"x: H = {h} must be a multiple of {SF_VEC_SIZE} for MXFP8")
    check_tensor("pre", pre, dtypes=(torch.float32,), ndim=2)
    if tuple(pre.shape) != (m, HC_MULT):
        raise ValueError(f"pre must be [{m}, {HC_MULT}], got {tuple(pre.shape)}")
    check_tensor("weight", weight, dtypes=(torch.bfloat16,), ndim=1)
    if weight.shape[0] != h:
        raise ValueError(f"weight must be [{h}], got {tuple(weight.shape)}")
    for name, t in (("pre", pre), ("weight", weight)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}")
    if not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative float, got {eps!r}")
    return m, h


def _check_out(name: str, t, shape, dtype, device) -> None:
    check_tensor(name, t, dtypes=(dtype,), ndim=len(shape))
    if tuple(t.shape) != tuple(shape) or t.device != device:
        raise ValueError(
            f"{name} must be {list(shape)} on {device}, got {tuple(t.shape)} on {t.device}"
        )


def _row_block(h: int) -> int:
    """32-value blocks per program: H/32 rounded up to a power of two, at least 4 (one 128x4
    scale group, so the row's padding scale columns fall inside it)."""
    return max(4, triton.next_power_of_2(-(-h // SF_VEC_SIZE)))


def hc_combine_norm_admission(
    x: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor, *, quantize: bool = False, out=None
) -> Admission:
    """Whether the Triton kernel may run (``quantize``: the fused MXFP8 form); pure: shapes,
    dtypes, strides and the device, never values. ``out`` is the caller's output (y, or
    ``(y, Mxfp8SwizzledInput)`` with ``quantize``), whose strides matter too."""
    _, h = _check_inputs(x, pre, weight, 0.0, quantize=quantize)
    where = triton_device(x)
    if not where:
        return where
    if h % SF_VEC_SIZE:
        return refuse(f"H = {h} is not a multiple of {SF_VEC_SIZE}")
    if _row_block(h) * SF_VEC_SIZE > MAX_ROW_BLOCK:
        return refuse(f"H = {h}: a row does not fit one program's registers")
    if x.stride(1) != 1:
        return refuse("x's last-dim stride != 1")
    if out is not None:
        y, quantized = out if quantize else (out, None)
        if y.stride(1) != 1:
            return refuse("out y's last-dim stride != 1")
        if quantized is not None and (
            quantized.data.stride(1) != 1 or not quantized.scales.is_contiguous()
        ):
            return refuse("out data's last-dim stride != 1 or scales not contiguous")
    form = "combine+norm+mxfp8" if quantize else "combine+norm"
    return admit(f"{where.reason}, {form}, H = {h}")


@triton.jit
def _bf16_rne_bits(v):
    """fp32 -> bf16 bits (int32 in 0..0xFFFF), round to nearest even, NaN -> 0x7FC0."""
    bits = v.to(tl.int32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    return tl.where(v != v, 0x7FC0, rounded)


@triton.jit
def _sum_of_squares_bf16(bits):
    """Σ v² of a tile of bf16 bits as fp32, exact up to a 2^-48-of-the-top-binade truncation
    and one rounding, independent of the reduction order (see reference.mhc.bf16_sum_of_squares)."""
    exponent = (bits >> 7) & 0xFF
    mantissa = bits & 0x7F
    biased = tl.maximum(exponent, 1)
    emax = tl.max(tl.max(biased, axis=1), axis=0)  # 255 iff the row holds Inf or NaN
    significand = tl.where(exponent > 0, mantissa | 0x80, mantissa)
    square = (significand * significand).to(tl.int64)
    shift = 2 * (biased - emax) + 32
    units = tl.where(
        shift >= 0,
        square << tl.maximum(shift, 0).to(tl.int64),
        square >> tl.minimum(-shift, 20).to(tl.int64),
    )
    # With Inf/NaN present count them instead: NaN adds 2^32, Inf 1.
    nonfinite = tl.where(exponent == 0xFF, tl.where(mantissa != 0, 4294967296, 1), 0)
    units = tl.where(emax == 0xFF, nonfinite.to(tl.int64), units)
    total = tl.sum(tl.sum(units, axis=1), axis=0)
    unit = ((2 * emax - 300 + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)
    ss = (total.to(tl.float64) * unit).to(tl.float32)
    special = tl.where(total >= 4294967296, 0x7FC00000, 0x7F800000).to(tl.float32, bitcast=True)
    return tl.where(emax == 0xFF, special, ss)


@triton.jit(do_not_specialize=["rows"])
def hc_combine_norm_kernel(
    x_ptr,  # int16 view of bf16 x [rows, 4*H], last-dim stride 1
    pre_ptr,  # fp32 [rows, 4]
    w_ptr,  # int16 view of bf16 weight [H]
    y_ptr,  # int16 view of y [rows, H], last-dim stride 1
    q_ptr,  # uint8 view of the e4m3 data [rows, H] (QUANTIZE)
    sf_ptr,  # uint8 swizzled scales (QUANTIZE)
    rows,
    stride_xm,
    stride_pm,
    stride_pc,
    stride_w,
    stride_ym,
    stride_qm,
    H: tl.constexpr,
    EPS: tl.constexpr,  # an fp32 value
    ROW_BLOCKS: tl.constexpr,  # 32-value blocks per row tile (power of two >= H/32, >= 4)
    PADDED_COLS: tl.constexpr,  # scale columns of the swizzled buffer, rup(H/32, 4)
    QUANTIZE: tl.constexpr,
    PAD_ROWS: tl.constexpr,
):
    pid = tl.program_id(0)
    j = tl.arange(0, 32)[None, :]
    h = tl.arange(0, ROW_BLOCKS)[:, None] * 32 + j  # the row as [blocks, 32]
    inside = h < H
    if pid < rows:
        row = pid.to(tl.int64)
        x_row = x_ptr + row * stride_xm
        pre_row = pre_ptr + row * stride_pm
        # Products and sums rounded separately (launched with enable_fp_fusion=False).
        acc = bf16_bits_to_f32(tl.load(x_row + h, mask=inside, other=0)) * tl.load(pre_row)
        for i in tl.static_range(1, 4):
            stream = bf16_bits_to_f32(tl.load(x_row + i * H + h, mask=inside, other=0))
            acc = acc + stream * tl.load(pre_row + i * stride_pc)
        x_in = _bf16_rne_bits(acc)
        ss = _sum_of_squares_bf16(x_in)
        # One IEEE fp32 rounding per step, computed in float64 (fp32 div/sqrt are approximate
        # or flush subnormals on the GPU; f64 ops are IEEE and rounding once to fp32 is exact).
        r = ((ss.to(tl.float64) / H).to(tl.float32).to(tl.float64) + EPS).to(tl.float32)
        inv = (1.0 / tl.sqrt(r.to(tl.float64)).to(tl.float32).to(tl.float64)).to(tl.float32)
        w = bf16_bits_to_f32(tl.load(w_ptr + h * stride_w, mask=inside, other=0))
        y = _bf16_rne_bits((bf16_bits_to_f32(x_in) * inv) * w)
        y = tl.where(inside, y, 0)  # lanes past H are padding blocks: scale 0 even if inv is NaN
        tl.store(y_ptr + row * stride_ym + h, y.to(tl.int16), mask=inside)
        if QUANTIZE:
            codes, scale = mxfp8_encode_blocks(bf16_bits_to_f32(y), j)
            # A layout hint, not semantics: 8 contiguous bytes per thread lets the e4m3 store
            # share the bf16 tiles' layout instead of moving y through shared memory.
            q_offset = tl.max_contiguous(h, [1, 8])
            tl.store(q_ptr + row * stride_qm + q_offset, codes.to(tl.uint8), mask=inside)
            col = tl.arange(0, ROW_BLOCKS)  # blocks past H/32 read zeros: scale 0
            offset = swizzled_scale_offset(row, col, PADDED_COLS)
            tl.store(sf_ptr + offset, scale.to(tl.uint8), mask=col < PADDED_COLS)
    elif QUANTIZE:
        # Rows rows .. rup(rows, 128) - 1 of the last scale tile exist only as zero scales.
        first = rows + (pid - rows) * PAD_ROWS
        pad_row = (first + tl.arange(0, PAD_ROWS)[:, None]).to(tl.int64)
        pad_col = tl.arange(0, ROW_BLOCKS)[None, :]
        padded_rows = tl.cdiv(rows, 128) * 128
        zero = tl.zeros([PAD_ROWS, ROW_BLOCKS], dtype=tl.uint8)
        tl.store(
            sf_ptr + swizzled_scale_offset(pad_row, pad_col, PADDED_COLS),
            zero,
            mask=(pad_row < padded_rows) & (pad_col < PADDED_COLS),
        )


def launch(x, pre, weight, eps: float, y: torch.Tensor, quantized: Mxfp8SwizzledInput | None):
    rows, width = x.shape
    h = width // HC_MULT
    row_blocks = _row_block(h)
    padded_cols = -(-(h // SF_VEC_SIZE) // 4) * 4
    grid = rows
    if quantized is not None:
        grid += triton.cdiv(triton.cdiv(rows, 128) * 128 - rows, PAD_ROWS)
        q, scales = quantized.data.view(torch.uint8), quantized.scales
    else:
        q, scales = y.view(torch.uint8), y.view(torch.uint8)  # unused
    hc_combine_norm_kernel[(grid,)](
        x.view(torch.int16),
        pre,
        weight.view(torch.int16),
        y.view(torch.int16),
        q,
        scales,
        rows,
        x.stride(0),
        pre.stride(0),
        pre.stride(1),
        weight.stride(0),
        y.stride(0),
        q.stride(0),
        H=h,
        EPS=torch.tensor(eps, dtype=torch.float32).item(),
        ROW_BLOCKS=row_blocks,
        PADDED_COLS=padded_cols,
        QUANTIZE=quantized is not None,
        PAD_ROWS=PAD_ROWS,
        num_warps=max(1, min(16, row_blocks * SF_VEC_SIZE // 512)),
        enable_fp_fusion=False,
    )


def hc_combine_norm(
    x: torch.Tensor,
    pre: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Combine the 4 streams of ``x [m, 4*H]`` bf16 with ``pre [m, 4]`` fp32, round to bf16 and
    RMS-normalise with ``weight [H]`` bf16: ``y [m, H]`` bf16 (see the module contract).

    ``out`` (bf16 ``[m, H]``) is written in place, keeping the call allocation-free inside
    CUDA-graph capture.
    """
    m, h = _check_inputs(x, pre, weight, eps, quantize=False)
    if out is None:
        out = torch.empty((m, h), dtype=torch.bfloat16, device=x.device)
    else:
        _check_out("out", out, (m, h), torch.bfloat16, x.device)
    if m == 0:
        return out
    if hc_combine_norm_admission(x, pre, weight, out=out):
        launch(x, pre, weight, eps, out, None)
    else:
        out.copy_(reference_hc_combine_norm(x, pre, weight, eps))
    return out


def hc_combine_norm_mxfp8(
    x: torch.Tensor,
    pre: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: tuple[torch.Tensor, Mxfp8SwizzledInput] | None = None,
) -> tuple[torch.Tensor, Mxfp8SwizzledInput]:
    """:func:`hc_combine_norm` and its MXFP8 quantization in one launch (``H % 32 == 0``).

    Returns ``(y, Mxfp8SwizzledInput(data, scales))``: y bf16 [m, H], data float8_e4m3fn
    [m, H], scales uint8 ``rup(m, 128) * rup(H/32, 4)`` bytes in the 128x4 layout, bitwise
    equal to ``hc_combine_norm`` then ``mxfp8_quantize``. ``out`` (the same structure) is
    written in place.
    """
    m, h = _check_inputs(x, pre, weight, eps, quantize=True)
    if out is None:
        y = torch.empty((m, h), dtype=torch.bfloat16, device=x.device)
        quantized = Mxfp8SwizzledInput(
            torch.empty((m, h), dtype=torch.float8_e4m3fn, device=x.device),
            torch.empty(scale_buffer_size(m, h, swizzled=True), dtype=torch.uint8, device=x.device),
        )
    else:
        y, quantized = out
        quantized = Mxfp8SwizzledInput(*quantized)
        _check_out("out y", y, (m, h), torch.bfloat16, x.device)
        _check_out("out data", quantized.data, (m, h), torch.float8_e4m3fn, x.device)
        size = scale_buffer_size(m, h, swizzled=True)
        _check_out("out scales", quantized.scales, (size,), torch.uint8, x.device)
    if m == 0:
        return y, quantized
    if hc_combine_norm_admission(x, pre, weight, quantize=True, out=(y, quantized)):
        launch(x, pre, weight, eps, y, quantized)
    else:
        y.copy_(reference_hc_combine_norm(x, pre, weight, eps))
        data, scales = reference_mxfp8_quantize(y, swizzled=True)
        quantized.data.copy_(data)
        quantized.scales.copy_(scales)
    return y, quantized


def beyond_one_bf16_ulp(y: torch.Tensor, y64: torch.Tensor) -> int:
    """Elements of bf16 ``y`` farther than one bf16 ulp (at ``y64``'s magnitude) from the float64
    ``y64``; NaN matches NaN and an infinity itself."""
    yd = y.double()
    _, exponent = torch.frexp(y64)
    ulp = torch.ldexp(torch.ones_like(y64), torch.clamp(exponent - 1, min=-126) - 7)
    close = (yd - y64).abs() <= ulp
    special = (torch.isnan(yd) & torch.isnan(y64)) | (torch.isinf(y64) & (yd == y64))
    return int((~(close | special)).sum().item())


def example_inputs(m: int, h: int, device, *, seed: int, scale: float = 1.0):
    """x [m, 4h] bf16 at magnitude ``scale``, pre [m, 4] fp32 gates in (0, 1], weight [h] bf16."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(m, HC_MULT * h, generator=gen) * scale).to(torch.bfloat16)
    pre = torch.rand(m, HC_MULT, generator=gen) + 1e-6
    weight = (1.0 + 0.1 * torch.randn(h, generator=gen)).to(torch.bfloat16)
    return x.to(device), pre.to(device), weight.to(device)


def unfused(x, pre, weight, eps):
    """The pair the fused op replaces: :func:`hc_combine_norm` then :func:`mxfp8_quantize`."""
    y = hc_combine_norm(x, pre, weight, eps)
    return y, mxfp8_quantize(y, swizzled=True)


def check_cases(device: torch.device, small: bool) -> list:
    from dsv41_kernels.check import CheckCase, bit_mismatches

    eps = 1e-6
    shapes = [(3, 64), (5, 96)] if small else [(1, 5120), (6, 5120), (64, 5120), (300, 4096)]
    cases = []
    for m, h in shapes:
        x, pre, weight = example_inputs(m, h, device, seed=m * h)
        args = (x, pre, weight, eps)
        cases.append(
            CheckCase(
                op="hc_combine_norm",
                shape=f"[{m}, 4x{h}] bf16 (mismatches: beyond 1 bf16 ulp of float64)",
                admission=hc_combine_norm_admission(x, pre, weight),
                run=lambda a=args: hc_combine_norm(*a),
                reference=lambda a=args: reference_hc_combine_norm(*a, dtype=torch.float64),
                mismatches=beyond_one_bf16_ulp,
                baseline=lambda a=args: reference_hc_combine_norm(*a),
            )
        )
        cases.append(
            CheckCase(
                op="hc_combine_norm_mxfp8",
                shape=f"[{m}, 4x{h}] bf16 vs hc_combine_norm + mxfp8_quantize",
                admission=hc_combine_norm_admission(x, pre, weight, quantize=True),
                run=lambda a=args: hc_combine_norm_mxfp8(*a),
                reference=lambda a=args: unfused(*a),
                mismatches=bit_mismatches,
                baseline=lambda a=args: unfused(*a),
            )
        )
    return cases
