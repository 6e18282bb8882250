"""Inverse RoPE and FP8 group quantization of the attention output in one launch (Hopper).

SGLang 0.5.23 fuses the inverse RoPE into ``wo_a`` only on SM100 (``fused_rope_wo_a_bf16``,
gated by ``_fused_wo_a_arch_supported()``, ``srt/models/deepseek_v4.py:487``). On SM90, with the
FP8 ``wo_a`` (128x128 block scales, ``SGLANG_OPT_FP8_WO_A_GEMM`` on by default), every attention
layer runs (``MQALayer.forward``, ``deepseek_v4.py:2952-3024``):

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

Kernels (the admission's ``kernel``; both give the same bits):

- ``cuda``: ``sgl-kernel/csrc/inverse_rope_quant_fp8.cu`` on sm_90+ for SGLang's group size
  128: a warp a group (several when the grid would not be resident at once), only the lanes of
  rope pairs waiting on the position and the table, launched as SGLang launches its own two
  kernels on Hopper (a programmatic dependent launch; with ``tables_ready`` the position and
  the table are read before the wait, as SGLang's RoPE kernel reads them).
  It needs ``o`` 8-byte aligned with token and head strides of 4 values, table rows 16-byte
  aligned with unit last stride and an even width, and the module at hand (prebuilt, cached or
  built now);
- ``triton``: the kernel below, for every other admitted call (any group size, any even
  strides, the interpreter on CPU, no CUDA module).

Contract: ``(o_fp8, o_scales)`` and the rotated ``o`` are **bitwise equal** to
:func:`dsv41_kernels.reference.inverse_rope_quant.inverse_rope_quant_fp8`, the restatement of
SGLang's two kernels (read there). On a GPU the instructions that decide the bits are the ones
SGLang's kernels compile to (checked in the SASS of both, sm_90a): one ``fma.rn.f32`` per
rotated value with the sine product rounded first, the scale ``amax * 0x3B124925``, the
multiplier ``div.approx.ftz.f32(448, amax)`` (``MUFU.RCP`` then ``FMUL.FTZ``) and
``cvt.rn.satfinite.e4m3x2.f32``, one per (even, odd) pair; the bf16 rounding of the rotated
values (to nearest even, NaN -> 0x7FFF) and the NaN-ignoring maximum are integer arithmetic on
every device. Under the Triton interpreter the e4m3 conversion is emulated with integers and
the reciprocal is the reference's model of ``MUFU.RCP``. Outputs
are ``o_fp8`` float8_e4m3fn ``[T, G, D]`` and ``o_scales`` fp32 ``[T, G, D / group_size]``,
contiguous: the layouts SGLang's quantizer allocates (row-major scales) and its ``wo_a`` reads.
A position outside ``freqs_cis`` gives NaN in that token's rotated values, never a read out of
bounds. A Triton program quantizes ``BLOCK_GROUPS`` groups of one token, a CUDA warp one
group. Neither syncs the host or allocates anything but the outputs (``out=`` takes the
caller's), so both capture into a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.admission import (
    Admission,
    admit,
    check_tensor,
    cuda_kernel_runs,
    invalid,
    refuse,
    triton_device,
)
from dsv41_kernels.devices import device_capability, one_wave
from dsv41_kernels.interpreter import serialized
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.quantization.mxfp8_encode import e4m3_rne_satfinite
from dsv41_kernels.reference.inverse_rope_quant import (
    AMAX_FLOOR_BITS,
    BF16_CANONICAL_NAN,
    RCP_448_BITS,
    RCP_APPROX_STEPS,
    RCP_FLUSH_ABOVE,
)
from dsv41_kernels.reference.inverse_rope_quant import (
    inverse_rope_quant_fp8 as reference_inverse_rope_quant_fp8,
)

GROUP_SIZES = (16, 32, 64, 128, 256)  # SGLang's quantizer's (per_token_group_quant.py)
POSITION_DTYPES = (torch.int32, torch.int64)
VALUES_PER_PROGRAM = 1024
TRITON = "triton"
CUDA = "cuda"
MODULE = "inverse_rope_quant_fp8"  # sgl-kernel/csrc/inverse_rope_quant_fp8.cu
CUDA_GROUP_SIZE = 128
CUDA_MAX_GROUPS_PER_TOKEN = 65535  # the CUDA grid's y limit
CUDA_GROUPS_PER_WARP = 2
"""Groups a warp of the CUDA kernel takes when a warp a group would not be resident at once:
their loads overlap, where one group a warp is one chain of latencies."""
# Kernels see module constants only as constexpr.
_AMAX_FLOOR_BITS = tl.constexpr(AMAX_FLOOR_BITS)
_RCP_448_BITS = tl.constexpr(RCP_448_BITS)
_RCP_FLUSH_ABOVE = tl.constexpr(RCP_FLUSH_ABOVE)
_NAN_BITS = tl.constexpr(BF16_CANONICAL_NAN << 16)
_SIGN_BIT = tl.constexpr(-(1 << 31))
_RCP_STEP_FIELDS = tl.constexpr(tuple(RCP_APPROX_STEPS))
_RCP_STEPS = tl.constexpr(tuple(RCP_APPROX_STEPS.values()))
_RCP_STEP_COUNT = tl.constexpr(len(RCP_APPROX_STEPS))


def _validate(o, freqs_cis, positions, o_groups, group_size, out) -> None:
    """Raise ValueError naming the argument unless the call is well-formed."""
    check_tensor("o", o, dtypes=(torch.bfloat16,), ndim=3)
    check_tensor("freqs_cis", freqs_cis, dtypes=(torch.complex64,), ndim=2)
    check_tensor("positions", positions, dtypes=POSITION_DTYPES, ndim=1)
    tokens, heads, head_dim = o.shape
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size!r}")
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
    if not isinstance(o_groups, int) or o_groups < 1 or heads < 1 or heads % o_groups:
        raise ValueError(f"o_groups must be a positive divisor of o.shape[1] ({heads} heads)")
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


def _plan(o: torch.Tensor, freqs_cis: torch.Tensor, group_size: int) -> Admission:
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
        return admit(CUDA, f"cuda, {tuple(o.shape)}{note}", MODULE)
    return admit(TRITON, f"{where.reason}, triton, {tuple(o.shape)}{note or f' ({why_not})'}")


def inverse_rope_quant_fp8_admission(
    o, freqs_cis, positions, *, o_groups, group_size: int = 128, out=None
) -> Admission:
    """Which kernel runs for this call (``cuda`` or ``triton``), or why none does (the torch
    fallback then); pure: shapes, dtypes, strides, device, the module's availability."""
    try:
        _validate(o, freqs_cis, positions, o_groups, group_size, out)
    except ValueError as e:
        return invalid(e)
    return _plan(o, freqs_cis, group_size)


@triton.jit
def _bf16_bits(v):
    """fp32 -> bf16 bits in the low half of an int32, to nearest even, NaN -> 0x7FFF: what the
    GPU's ``cvt.rn.bf16x2.f32`` gives, in integers on every device (Triton 3.6 emits the scalar
    ``F2F.BF16.F32`` instead, and the interpreter's cast does not round to even)."""
    bits = tl.where(v != v, _NAN_BITS, v.to(tl.int32, bitcast=True))
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


@triton.jit
def _e4m3_emulated(v):
    """fp32 -> e4m3 code (int32 0..255) as ``cvt.rn.satfinite`` gives it, in integers."""
    finite = e4m3_rne_satfinite(tl.minimum(tl.maximum(v, -448.0), 448.0))
    return tl.where(v != v, 0x7F, finite)


@triton.jit
def _e4m3_pair_codes(high, low, HW: tl.constexpr):
    """``(e4m3(high) << 8) | e4m3(low)`` as int32: one ``cvt.rn.satfinite.e4m3x2.f32``, or its
    emulation. The pair is converted into one 32-bit register because Triton 3.6's float8 cast,
    whose bytes are then taken apart with 16-bit moves, is miscompiled by its ptxas for sm_90a:
    every odd pair's low code (x_r's) was read from the stack pointer's register (0xFC, -384),
    a quarter of all bytes."""
    if HW:
        codes = tl.inline_asm_elementwise(
            "{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, $1, $2; cvt.u32.u16 $0, t; }",
            "=r,f,f",
            [high, low],
            dtype=tl.int32,
            is_pure=True,
            pack=1,
        )
    else:
        codes = (_e4m3_emulated(high) << 8) | _e4m3_emulated(low)
    return codes


@triton.jit
def _rcp_approx_model(amax):
    """The reference's model of ``rcp.approx.ftz.f32`` on what ``amax`` holds (bf16 values and
    fp32(1e-10)): the correctly rounded reciprocal, stepped on the significands it misses."""
    bits = amax.to(tl.int32, bitcast=True)
    field = tl.where((bits & 0xFFFF) == 0, (bits >> 16) & 0x7F, -1)
    step = tl.zeros_like(bits)
    for k in tl.static_range(_RCP_STEP_COUNT):
        step = tl.where(field == _RCP_STEP_FIELDS[k], _RCP_STEPS[k], step)
    rcp = ((1.0 / amax).to(tl.int32, bitcast=True) + step).to(tl.float32, bitcast=True)
    return tl.where(amax > _RCP_FLUSH_ABOVE, 0.0, rcp)


@triton.jit
def inverse_rope_quant_fp8_kernel(
    o_ptr,  # int32 view of bf16 o [T, H, HEAD_DIM / 2]: one (even, odd) pair per word
    freqs_ptr,  # int64 view of complex64 freqs_cis [rows, ROPE_DIM / 2]: (cos, sin) per word
    positions_ptr,  # int32 / int64 [T]
    codes_ptr,  # int16 view of e4m3 [T, GROUPS_PER_TOKEN * GROUP_SIZE / 2], contiguous
    scales_ptr,  # fp32 [T, GROUPS_PER_TOKEN], contiguous
    table_rows,
    stride_ot,  # o's strides in pairs
    stride_oh,
    stride_pos,
    stride_fs,
    stride_fp,
    HEAD_DIM: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS_PER_TOKEN: tl.constexpr,
    BLOCK_GROUPS: tl.constexpr,
    ROTATE_O: tl.constexpr,
    HW: tl.constexpr,  # GPU instructions; False: their emulation (the interpreter)
):
    """Program p quantizes groups [BLOCK_GROUPS * (p % programs per token), ...) of token
    p // (programs per token), each [GROUP_SIZE] values of one head held as GROUP_SIZE / 2
    pairs (x_r, x_i) = (x[2j], x[2j + 1]), the layout of the rotation."""
    PROGRAMS_PER_TOKEN: tl.constexpr = (GROUPS_PER_TOKEN + BLOCK_GROUPS - 1) // BLOCK_GROUPS
    GROUPS_PER_HEAD: tl.constexpr = HEAD_DIM // GROUP_SIZE
    PAIRS: tl.constexpr = GROUP_SIZE // 2
    pid = tl.program_id(0)
    token = (pid // PROGRAMS_PER_TOKEN).to(tl.int64)
    group = (pid % PROGRAMS_PER_TOKEN) * BLOCK_GROUPS + tl.arange(0, BLOCK_GROUPS)
    live = (group < GROUPS_PER_TOKEN)[:, None]
    head = group // GROUPS_PER_HEAD
    j = tl.arange(0, PAIRS)[None, :]
    pair = (group % GROUPS_PER_HEAD)[:, None] * PAIRS + j  # the pair's index within its head
    word_ptr = o_ptr + token * stride_ot + head[:, None] * stride_oh + pair
    words = tl.load(word_ptr, mask=live, other=0)
    x_r = (words << 16).to(tl.float32, bitcast=True)
    x_i = (words & -65536).to(tl.float32, bitcast=True)  # the high half, 0xFFFF0000

    # Rope pairs are the head's last ROPE_DIM / 2; pair k of them is row k of the table.
    rope_pair = pair - (HEAD_DIM - ROPE_DIM) // 2
    rope = live & (rope_pair >= 0)
    position = tl.load(positions_ptr + token * stride_pos).to(tl.int64)
    inside = (position >= 0) & (position < table_rows)  # else NaN, and row 0 is read instead
    f_ptr = freqs_ptr + tl.where(inside, position, 0) * stride_fs + rope_pair * stride_fp
    rotation = tl.load(f_ptr, mask=rope, other=0)  # (cosine, sine) as one word, like o's pairs
    cos = tl.where(inside, rotation.to(tl.int32).to(tl.float32, bitcast=True), float("nan"))
    sin = (rotation >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    sin = tl.where(inside, sin, float("nan"))
    rotated_r = _bf16_bits(tl.fma(cos, x_r, sin * x_i))
    # The sign flipped in its bit: Triton lowers -v to 0 - v, which turns -0 into +0.
    minus_sin_x_r = ((sin * x_r).to(tl.int32, bitcast=True) ^ _SIGN_BIT).to(
        tl.float32, bitcast=True
    )
    rotated_i = _bf16_bits(tl.fma(cos, x_i, minus_sin_x_r))
    y_r = tl.where(rope, (rotated_r << 16).to(tl.float32, bitcast=True), x_r)
    y_i = tl.where(rope, (rotated_i << 16).to(tl.float32, bitcast=True), x_i)
    if ROTATE_O:
        tl.store(word_ptr, (rotated_i << 16) | rotated_r, mask=rope)

    # Quantization: NaN-ignoring maximum of the magnitudes as integers (non-negative fp32 bits
    # order like their values), floored, then the scale and the multiplier.
    magnitude_r = y_r.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    magnitude_i = y_i.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    magnitude = tl.maximum(
        tl.where(magnitude_r > 0x7F800000, 0, magnitude_r),
        tl.where(magnitude_i > 0x7F800000, 0, magnitude_i),
    )
    amax = tl.max(magnitude, axis=1).to(tl.float32, bitcast=True)
    amax = tl.maximum(amax, tl.full([], _AMAX_FLOOR_BITS, tl.int32).to(tl.float32, bitcast=True))
    scale = amax * tl.full([], _RCP_448_BITS, tl.int32).to(tl.float32, bitcast=True)
    if HW:
        multiplier = tl.inline_asm_elementwise(
            "div.approx.ftz.f32 $0, $1, $2;",
            "=f,f,f",
            [tl.full(amax.shape, 448.0, tl.float32), amax],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
    else:
        multiplier = _rcp_approx_model(amax) * 448.0
    codes = _e4m3_pair_codes(y_i * multiplier[:, None], y_r * multiplier[:, None], HW)
    out_pair = group[:, None] * PAIRS + j
    codes = codes.to(tl.int16)
    tl.store(codes_ptr + token * (GROUPS_PER_TOKEN * PAIRS) + out_pair, codes, mask=live)
    tl.store(scales_ptr + token * GROUPS_PER_TOKEN + group, scale, mask=group < GROUPS_PER_TOKEN)


def launch(
    o,
    freqs_cis,
    positions,
    codes,
    scales,
    *,
    group_size: int,
    rotate_o: bool,
    block_groups: int | None = None,
    num_warps: int = 4,
) -> None:
    """The kernel on valid, admitted arguments, into ``codes`` / ``scales`` (contiguous).
    ``block_groups`` (a power of two; default ``VALUES_PER_PROGRAM`` values) and ``num_warps``
    set the launch shape (tuning: every shape gives the same bits)."""
    tokens, heads, head_dim = o.shape
    groups_per_token = heads * head_dim // group_size
    if block_groups is None:
        block_groups = VALUES_PER_PROGRAM // group_size
    block_groups = min(triton.next_power_of_2(groups_per_token), block_groups)
    words = o.view(torch.int32)
    table = freqs_cis.view(torch.int64)
    with serialized():
        inverse_rope_quant_fp8_kernel[(tokens * triton.cdiv(groups_per_token, block_groups),)](
            words,
            table,
            positions,
            codes.view(torch.int16),
            scales,
            table.shape[0],
            words.stride(0),
            words.stride(1),
            positions.stride(0),
            table.stride(0),
            table.stride(1),
            HEAD_DIM=head_dim,
            ROPE_DIM=2 * freqs_cis.shape[1],
            GROUP_SIZE=group_size,
            GROUPS_PER_TOKEN=groups_per_token,
            BLOCK_GROUPS=block_groups,
            ROTATE_O=rotate_o,
            HW=o.is_cuda,
            num_warps=num_warps,
            enable_fp_fusion=False,  # the one fused multiply-add per rotated value is explicit
        )


def launch_cuda(
    o,
    freqs_cis,
    positions,
    codes,
    scales,
    *,
    rotate_o: bool,
    tables_ready: bool = False,
    warps: int = 0,
    groups: int = 0,
):
    """The CUDA kernel on admitted arguments with at least one token (``tables_ready``: as in
    :func:`inverse_rope_quant_fp8`; ``warps``: per CTA, 1, 2,
    4 or 8, 0 for its default; ``groups``: per warp, 1, 2 or 4, 0 for one while a warp a group
    is surely resident at once (:func:`dsv41_kernels.devices.one_wave`, a bound below the kernel's
    own occupancy) and :data:`CUDA_GROUPS_PER_WARP` beyond; tuning: every shape gives the same
    bits)."""
    tokens = o.shape[0]
    if groups == 0:
        resident = one_wave(codes.numel() // 128, 1, o.device)  # warps at one group a warp
        groups = 1 if resident else CUDA_GROUPS_PER_WARP
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

    ``o``: bf16 ``[T, H, head_dim]``, the rope values the last ``2 * freqs_cis.shape[1]`` of
    each head; ``freqs_cis``: complex64 ``[rows, rope_dim / 2]`` (cosine, sine); ``positions``:
    int32/int64 ``[T]``, rows of ``freqs_cis``; ``o_groups``: ``G``, the groups ``o`` is viewed
    in (``H`` a multiple); ``group_size``: values per scale. Returns ``(o_fp8, o_scales)``:
    e4m3 ``[T, G, D]`` and fp32 ``[T, G, D / group_size]``, ``D = H * head_dim / G``, into
    ``out`` when given (both contiguous). ``rotate_o``: also write the rotated rope values into
    ``o``, as SGLang's in-place RoPE leaves them. ``tables_ready``: the caller's promise that
    the kernel launched just before on this stream does not write ``positions`` or
    ``freqs_cis``; the CUDA kernel then reads them before waiting for that kernel (a
    programmatic dependent launch), as SGLang's own RoPE kernel does, and the bits are the
    same. ``admission``: this call's
    :func:`inverse_rope_quant_fp8_admission`, when the caller already made it.
    """
    _validate(o, freqs_cis, positions, o_groups, group_size, out)
    if admission is None:
        admission = _plan(o, freqs_cis, group_size)
    codes_shape, scales_shape = _output_shapes(o, o_groups, group_size)
    if out is None:
        out = (
            torch.empty(codes_shape, dtype=torch.float8_e4m3fn, device=o.device),
            torch.empty(scales_shape, dtype=torch.float32, device=o.device),
        )
    codes, scales = out
    if not admission:
        ref_codes, ref_scales, rotated = reference_inverse_rope_quant_fp8(
            o, freqs_cis, positions, o_groups=o_groups, group_size=group_size
        )
        codes.copy_(ref_codes)
        scales.copy_(ref_scales)
        if rotate_o:
            o.copy_(rotated)
    elif o.shape[0] and admission.kernel == CUDA:
        launch_cuda(
            o, freqs_cis, positions, codes, scales, rotate_o=rotate_o, tables_ready=tables_ready
        )
    elif o.shape[0]:
        launch(o, freqs_cis, positions, codes, scales, group_size=group_size, rotate_o=rotate_o)
    return codes, scales
