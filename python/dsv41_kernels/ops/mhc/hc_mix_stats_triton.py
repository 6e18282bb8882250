"""The Triton kernels of the mHC mixing statistics (:mod:`.hc_mix_stats`) and their launches.

Two launches: the split-K projection :func:`_mix_partials_kernel` writes, per K slice, the
partial products ``[S, m, N]`` and the partial sums of squares ``[S, m]`` (the CUDA projection,
``sgl-kernel/csrc/hc_mix_stats.cu``, writes the same partials); then one finisher,
:func:`_mix_finish_kernel`, reduces the slices in a fixed order, adds the compensation columns
(Triton's partials keep them apart), applies the RMS factor, the gates and Sinkhorn. Launch
shapes come from the plan (:mod:`.hc_mix_stats_plan`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsv41_kernels.interpreter import serialized, triton_interpreter
from dsv41_kernels.ops.mhc.hc_derived_weights import TF32_DROPPED_BITS
from dsv41_kernels.ops.mhc.hc_mix_stats_plan import GATE_COLUMNS, MixStatsPlan, Numerics
from dsv41_kernels.reference.hc_mix_stats import HC_MIX, HC_MULT

_LO_COLUMN = 32  # compensated partials: where lo's columns start
_FINISH_WARPS = 4  # one per SM sub-partition: the finisher's lanes beyond its rows repeat work
_PREFETCH_STEPS = 4
"""How many K steps ahead the projection asks L2 for x (a slice is read once, in order)."""
_STREAMS = tl.constexpr(HC_MULT)  # kernels see module constants only as constexpr
_MIX = tl.constexpr(HC_MIX)
_GATE_N = tl.constexpr(GATE_COLUMNS)
_LO_N = tl.constexpr(_LO_COLUMN)
_TF32_MASK = tl.constexpr(-(1 << TF32_DROPPED_BITS))
_EXPONENT_BITS = tl.constexpr(0x7F800000)


@triton.jit
def _tf32_part(w):
    """``hi`` of ``split_tf32``: ``w`` with its low 13 bits cleared, ``w`` itself if not finite."""
    bits = w.to(tl.int32, bitcast=True)
    truncated = (bits & _TF32_MASK).to(tl.float32, bitcast=True)
    return tl.where((bits & _EXPONENT_BITS) != _EXPONENT_BITS, truncated, w)


@triton.jit(do_not_specialize=["m", "zero"])
def _mix_partials_kernel(
    x_ptr,
    w_ptr,  # fn [w_rows, K] (compensated: read as hi)
    lo_ptr,  # compensated: fn's residual [w_rows, K], contiguous
    part_ptr,  # fp32 [S, m, BLOCK_N]
    sqsum_ptr,  # fp32 [S, m]
    m,
    K,
    w_rows,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    zero,  # 0.0 at run time: see the fresh accumulator below
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr,
    COMPENSATED: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """``part[s, r, n] = Σ_{k in slice s} x[r, k]·w[n, k]``, ``sqsum[s, r] = Σ_{k in s} x[r, k]²``;
    ``COMPENSATED``: ``w`` is ``hi`` (made from fn while loading) in columns 0-23 and ``lo`` in
    32-55, the rest zero.

    Slice ``s`` of ``S`` takes ``nb // S + (s < nb % S)`` K blocks (``nb`` blocks in all) in
    order; ``m`` is not specialised, so every batch size runs the same code."""
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    n_blocks = tl.cdiv(K, BLOCK_K)
    first = split * (n_blocks // splits) + tl.minimum(split, n_blocks % splits)
    count = n_blocks // splits + (split < n_blocks % splits).to(tl.int32)

    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < m
    cols = tl.arange(0, BLOCK_N)
    hi_col = cols < _LO_N  # compensated: the columns of hi
    w_row = cols  # the row of fn (or of lo) a column reads
    if COMPENSATED:
        w_row = cols % _LO_N
    col_ok = w_row < w_rows
    ks = first * BLOCK_K + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + ks[None, :] * stride_xk
    w_ptrs = w_ptr + w_row[None, :] * stride_wn + ks[:, None] * stride_wk
    lo_ptrs = lo_ptr + w_row[None, :] * K + ks[:, None]

    # x is read through registers (it is converted to fp32 for the TF32 MMA), which Triton's
    # pipeliner does not prefetch: the next tile's load is issued by hand before this tile's
    # MMA, so one DRAM latency overlaps each step instead of adding to it.
    x_mask = rows[:, None] < tl.where(count > 0, m, 0)
    if not EVEN_K:
        x_mask = x_mask & (ks < K)[None, :]
    x = tl.load(x_ptrs, mask=x_mask, other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sqsum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if PREFETCH > 0:  # one address per 128-byte line of each row's tile
        line_ptrs = (
            x_ptr
            + rows.to(tl.int64)[:, None] * stride_xm
            + ((first + PREFETCH) * BLOCK_K + tl.arange(0, BLOCK_K // 64) * 64)[None, :] * stride_xk
        )
    for step in range(count):
        if PREFETCH > 0:
            # Register prefetch holds one tile in flight; an L2 prefetch PREFETCH steps ahead
            # keeps more of the slice moving without registers (x is read exactly once).
            ahead = rows[:, None] < tl.where(step + PREFETCH < count, m, 0)
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; "
                "mov.u32 $0, 0; }",
                "=r,l,r",
                [line_ptrs, ahead.to(tl.int32)],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )
            line_ptrs += BLOCK_K * stride_xk
        x_mask = rows[:, None] < tl.where(step + 1 < count, m, 0)
        w_mask = col_ok[None, :]
        if not EVEN_K:
            w_mask = w_mask & (ks + step * BLOCK_K < K)[:, None]
            x_mask = x_mask & (ks + (step + 1) * BLOCK_K < K)[None, :]
        if COMPENSATED:
            hi = tl.load(w_ptrs, mask=w_mask & hi_col[None, :], other=0.0)
            lo = tl.load(lo_ptrs, mask=w_mask & ~hi_col[None, :], other=0.0)
            w = tl.where(hi_col[None, :], _tf32_part(hi), lo)
        else:
            w = tl.load(w_ptrs, mask=w_mask, other=0.0)
        x_next = tl.load(x_ptrs + BLOCK_K * stride_xk, mask=x_mask, other=0.0)
        xf = x.to(tl.float32)  # bf16 -> fp32 is exact, and exact in TF32
        sqsum += tl.sum(xf * xf, axis=1)
        # A fresh accumulator per step, added with an IEEE fp32 add: the tensor core's own
        # accumulation is not round-to-nearest and drifts over a long K (~1e-5 at 5120). The
        # run-time zero keeps Triton from folding the add back into the MMA (it does so for a
        # constant zero), so each MMA chain is BLOCK_K products.
        fresh = tl.full((BLOCK_M, BLOCK_N), zero, tl.float32)
        acc = acc + tl.dot(xf, w, fresh, input_precision=PRECISION)
        x = x_next
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
        lo_ptrs += BLOCK_K

    out = split.to(tl.int64) * m + rows
    tl.store(part_ptr + out[:, None] * BLOCK_N + cols[None, :], acc, mask=row_ok[:, None])
    tl.store(sqsum_ptr + out, sqsum, mask=row_ok)


@triton.jit
def _div(a, b):
    """IEEE ``a / b`` as torch divides (Triton's fp32 ``/`` may be approximate); ``b`` is
    broadcast to ``a``'s shape (it may be a scalar)."""
    return tl.math.div_rn(a, tl.zeros_like(a) + b)


@triton.jit
def _sigmoid(z):
    return _div(tl.zeros_like(z) + 1.0, 1.0 + tl.exp(-z))


@triton.jit(do_not_specialize=["m", "splits"])
def _mix_finish_kernel(
    part_ptr,  # fp32 [S, m, PART_N]
    sqsum_ptr,  # fp32 [S, m]
    scale_ptr,  # fp32 [3]
    base_ptr,  # fp32 [24]
    pre_ptr,  # fp32 [m, 4]
    post_ptr,  # fp32 [m, 4]
    comb_ptr,  # fp32 [m, 4, 4]
    mix_ptr,  # fp32 [m, 24]: written here, then read back in the gates' shapes
    m,
    splits,
    k_float,
    rms_eps,
    eps,
    post_mult,
    PART_N: tl.constexpr,
    COMPENSATED: tl.constexpr,
    LO_COLUMN: tl.constexpr,
    ITERS: tl.constexpr,
    FAST_RCP: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Per row: reduce the slices, ``mix = g·rsqrt(Σx²/K + rms_eps)``, the gates and Sinkhorn
    (docs/specs.md C.3; IEEE divisions except in Sinkhorn, see below).

    The slices are summed ``BLOCK_S`` at a time, chunk after chunk: for a given launch shape
    every row sees the same order wherever it sits. Each (slice, row) is one contiguous run of
    columns, so the loads are coalesced; the 24 mix values then go through ``mix`` in global
    memory (one barrier) and come back one ``[R]`` vector each, so the gates and Sinkhorn work
    on a row's values inside its own thread."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < m
    cols = tl.arange(0, _GATE_N)
    # Chunks of BLOCK_S slices are added elementwise, then the slice axis is summed once: no
    # reduction (and no barrier) inside the loop, and its loads do not wait on one.
    sq_acc = tl.zeros((BLOCK_S, BLOCK_R), tl.float32)
    acc = tl.zeros((BLOCK_S, BLOCK_R, _GATE_N), tl.float32)
    for first in range(0, splits, BLOCK_S):
        s = first + tl.arange(0, BLOCK_S)
        ok = (s < splits)[:, None] & row_ok[None, :]  # [S, R]
        at = s.to(tl.int64)[:, None] * m + rows[None, :]
        ptrs = part_ptr + at[:, :, None] * PART_N + cols[None, None, :]  # [S, R, 32]
        sq = tl.load(sqsum_ptr + at, mask=ok, other=0.0)
        part = tl.load(ptrs, mask=ok[:, :, None], other=0.0)
        if COMPENSATED:  # the slice's x·lo next to its x·hi (lo is ~2^-11 of hi)
            part += tl.load(ptrs + LO_COLUMN, mask=ok[:, :, None], other=0.0)
        sq_acc += sq
        acc += part
    rms = tl.math.rsqrt(_div(tl.sum(sq_acc, axis=0), k_float) + rms_eps)
    mix = tl.sum(acc, axis=0) * rms[:, None]
    mix_rows = mix_ptr + rows.to(tl.int64) * _MIX
    tl.store(mix_rows[:, None] + cols[None, :], mix, mask=row_ok[:, None] & (cols < _MIX)[None, :])
    tl.debug_barrier()  # the CTA's own global writes are visible to all its threads after it

    # From here every value is its own [R] vector (one element a row), so the gates and the
    # 40 Sinkhorn normalisations run in each row's thread without any cross-lane reduction
    # (a [R, 4, 4] tile needs two shuffle rounds per normalisation).
    # Lanes beyond R repeat the work, so the program has 4 warps (one per SM sub-partition):
    # at 8 warps the repeats share issue slots and double the time.
    pre0, pre1, pre2, pre3 = _gates4(mix_rows, 0, row_ok, scale_ptr, base_ptr, eps, 1.0)
    post0, post1, post2, post3 = _gates4(
        mix_rows, 4, row_ok, scale_ptr + 1, base_ptr, 0.0, post_mult
    )
    c00, c01, c02, c03 = _row_softmax(mix_rows, 8, row_ok, scale_ptr + 2, base_ptr, eps, FAST_RCP)
    c10, c11, c12, c13 = _row_softmax(mix_rows, 12, row_ok, scale_ptr + 2, base_ptr, eps, FAST_RCP)
    c20, c21, c22, c23 = _row_softmax(mix_rows, 16, row_ok, scale_ptr + 2, base_ptr, eps, FAST_RCP)
    c30, c31, c32, c33 = _row_softmax(mix_rows, 20, row_ok, scale_ptr + 2, base_ptr, eps, FAST_RCP)
    # Sinkhorn: the row softmax + eps above, a column step, then ITERS - 1 rounds of rows,
    # columns (docs/specs.md C.3). Its 40 normalisations are one dependent chain, so each
    # multiplies by an approximate reciprocal (1.5 ulp; the drift stays far inside the comb
    # tolerance) rather than dividing with div.rn.
    c00, c10, c20, c30 = _normalize4(c00, c10, c20, c30, eps, FAST_RCP)
    c01, c11, c21, c31 = _normalize4(c01, c11, c21, c31, eps, FAST_RCP)
    c02, c12, c22, c32 = _normalize4(c02, c12, c22, c32, eps, FAST_RCP)
    c03, c13, c23, c33 = _normalize4(c03, c13, c23, c33, eps, FAST_RCP)
    for _ in range(ITERS - 1):
        c00, c01, c02, c03 = _normalize4(c00, c01, c02, c03, eps, FAST_RCP)
        c10, c11, c12, c13 = _normalize4(c10, c11, c12, c13, eps, FAST_RCP)
        c20, c21, c22, c23 = _normalize4(c20, c21, c22, c23, eps, FAST_RCP)
        c30, c31, c32, c33 = _normalize4(c30, c31, c32, c33, eps, FAST_RCP)
        c00, c10, c20, c30 = _normalize4(c00, c10, c20, c30, eps, FAST_RCP)
        c01, c11, c21, c31 = _normalize4(c01, c11, c21, c31, eps, FAST_RCP)
        c02, c12, c22, c32 = _normalize4(c02, c12, c22, c32, eps, FAST_RCP)
        c03, c13, c23, c33 = _normalize4(c03, c13, c23, c33, eps, FAST_RCP)

    at = rows.to(tl.int64) * _STREAMS
    _store4(pre_ptr + at, pre0, pre1, pre2, pre3, row_ok)
    _store4(post_ptr + at, post0, post1, post2, post3, row_ok)
    at = rows.to(tl.int64) * (_STREAMS * _STREAMS)
    _store4(comb_ptr + at, c00, c01, c02, c03, row_ok)
    _store4(comb_ptr + at + 4, c10, c11, c12, c13, row_ok)
    _store4(comb_ptr + at + 8, c20, c21, c22, c23, row_ok)
    _store4(comb_ptr + at + 12, c30, c31, c32, c33, row_ok)


@triton.jit
def _logits4(mix_rows, first, row_ok, scale_ptr, base_ptr):
    """``mix[:, first + j] · scale + base[first + j]`` for j < 4, as four [R] vectors."""
    scale = tl.load(scale_ptr)
    a = tl.load(mix_rows + first, mask=row_ok, other=0.0) * scale + tl.load(base_ptr + first)
    b = tl.load(mix_rows + first + 1, mask=row_ok, other=0.0) * scale + tl.load(
        base_ptr + first + 1
    )
    c = tl.load(mix_rows + first + 2, mask=row_ok, other=0.0) * scale + tl.load(
        base_ptr + first + 2
    )
    d = tl.load(mix_rows + first + 3, mask=row_ok, other=0.0) * scale + tl.load(
        base_ptr + first + 3
    )
    return a, b, c, d


@triton.jit
def _gates4(mix_rows, first, row_ok, scale_ptr, base_ptr, add, mult):
    """``σ(logit)·mult + add`` of the four gates from column ``first``."""
    a, b, c, d = _logits4(mix_rows, first, row_ok, scale_ptr, base_ptr)
    return (
        _sigmoid(a) * mult + add,
        _sigmoid(b) * mult + add,
        _sigmoid(c) * mult + add,
        _sigmoid(d) * mult + add,
    )


@triton.jit
def _reciprocal(v, FAST_RCP: tl.constexpr):
    """``1 / v``: one ``MUFU.RCP`` (1 ulp) on the GPU, where ``/`` costs seven instructions
    and Sinkhorn's divisions are the finisher's critical path; ``/`` in the interpreter.
    ``.ftz`` drops the subnormal handling (six more instructions): every ``v`` here is a sum
    that is at least ``eps`` (or 1, in the softmax), far above the subnormals."""
    if FAST_RCP:
        return tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=r,r", [v], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return 1.0 / v


@triton.jit
def _row_softmax(mix_rows, first, row_ok, scale_ptr, base_ptr, eps, FAST_RCP: tl.constexpr):
    """Softmax of one comb row's four logits, plus ``eps`` (Sinkhorn's first half step)."""
    a, b, c, d = _logits4(mix_rows, first, row_ok, scale_ptr, base_ptr)
    top = tl.maximum(tl.maximum(a, b), tl.maximum(c, d))
    a, b, c, d = tl.exp(a - top), tl.exp(b - top), tl.exp(c - top), tl.exp(d - top)
    inv = _reciprocal(((a + b) + c) + d, FAST_RCP)
    return a * inv + eps, b * inv + eps, c * inv + eps, d * inv + eps


@triton.jit
def _normalize4(a, b, c, d, eps, FAST_RCP: tl.constexpr):
    """``v / (Σv + eps)`` for one comb row or column, as ``v · (1 / (Σv + eps))``."""
    inv = _reciprocal((((a + b) + c) + d) + eps, FAST_RCP)
    return a * inv, b * inv, c * inv, d * inv


@triton.jit
def _store4(ptr, a, b, c, d, row_ok):
    tl.store(ptr, a, mask=row_ok)
    tl.store(ptr + 1, b, mask=row_ok)
    tl.store(ptr + 2, c, mask=row_ok)
    tl.store(ptr + 3, d, mask=row_ok)


def launch_partials(x2d, fn, lo, partial, sqsum, plan: MixStatsPlan) -> None:
    """The Triton projection into ``partial [S, m, plan.partial_columns]`` and ``sqsum [S, m]``;
    ``lo`` is read only with compensated numerics."""
    m, k = x2d.shape
    cfg = plan.config
    compensated = plan.numerics is Numerics.COMPENSATED
    with serialized():
        _mix_partials_kernel[(triton.cdiv(m, cfg.block_m), cfg.splits)](
            x2d,
            fn,
            lo if compensated else fn,  # not read unless compensated
            partial,
            sqsum,
            m,
            k,
            fn.shape[0],
            x2d.stride(0),
            x2d.stride(1),
            fn.stride(0),
            fn.stride(1),
            0.0,
            BLOCK_M=cfg.block_m,
            BLOCK_N=partial.shape[2],
            BLOCK_K=cfg.block_k,
            EVEN_K=k % cfg.block_k == 0,
            # tf32x3 (small_row): on the raw fn, its split made in registers (x's residual is 0).
            PRECISION="tf32x3" if plan.numerics is Numerics.TF32X3 else "tf32",
            COMPENSATED=compensated,
            PREFETCH=0 if triton_interpreter() or cfg.block_k < 64 else _PREFETCH_STEPS,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )


def launch_finish(
    partial, sqsum, scale, base, outputs, plan: MixStatsPlan, *, k, iters, rms_eps, eps, post_mult
) -> None:
    """The finisher: from the partials of a projection over ``k`` columns to ``outputs =
    (pre, post, comb, mix)``."""
    pre, post, comb, mix = outputs
    m = mix.shape[0]
    cfg = plan.config
    with serialized():
        _mix_finish_kernel[(triton.cdiv(m, cfg.finish_rows),)](
            partial,
            sqsum,
            scale.contiguous(),
            base.contiguous(),
            pre,
            post,
            comb,
            mix,
            m,
            cfg.splits,
            float(k),
            rms_eps,
            eps,
            post_mult,
            PART_N=plan.partial_columns,
            COMPENSATED=plan.partial_columns != GATE_COLUMNS,
            LO_COLUMN=_LO_COLUMN,
            ITERS=iters,
            FAST_RCP=not triton_interpreter(),
            BLOCK_S=plan.finish_slices,
            BLOCK_R=cfg.finish_rows,
            num_warps=_FINISH_WARPS,
        )
