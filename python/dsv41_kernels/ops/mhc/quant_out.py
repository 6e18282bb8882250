"""The ``quant_out`` argument of the mHC ops that norm the next sublayer's input
(:func:`~.hc_boundary.hc_boundary`, :func:`~.hc_post_combine_norm.hc_post_combine_norm`,
:func:`~.hc_combine_norm.hc_combine_norm`): a ``(q, scales)`` pair the op fills with its
normed rows' e4m3 groups of :data:`QUANT_GROUP` columns and their power-of-two scales, bitwise
SGLang 0.5.23's ``sglang_per_token_group_quant_fp8(normed, 32, scale_ue8m0=True)`` on SM90
(:func:`dsv41_kernels.reference.rmsnorm_quant_fp8.group_quant_ue8m0`): what the next
sublayer's block-FP8 linear would compute from those rows.

The kernels take "no groups" as a pair without rows (:func:`no_quant_out`).
"""

from __future__ import annotations

import torch

from dsv41_kernels.admission import check_inputs_apart, check_tensor
from dsv41_kernels.reference.rmsnorm_quant_fp8 import group_quant_ue8m0

QUANT_GROUP = 32
"""The columns of one FP8 group (V4.1's ``[32, 32]`` block-FP8 linears)."""
Q_NAME, SCALES_NAME = "quant_out[0] (q)", "quant_out[1] (scales)"


def validate_quant_out(quant_out, m: int, h: int, device, inputs: dict) -> None:
    """ValueError naming the part of ``quant_out`` that is off: ``q`` float8_e4m3fn ``[m, h]``
    and ``scales`` fp32 ``[m, h / 32]``, contiguous, on ``device``, 16-byte aligned, apart from
    each other and from every tensor of ``inputs`` (named as the op's arguments)."""
    if not isinstance(quant_out, (tuple, list)) or len(quant_out) != 2:
        raise ValueError("quant_out must be a tuple (q, scales)")
    want = (
        (Q_NAME, (m, h), torch.float8_e4m3fn),
        (SCALES_NAME, (m, h // QUANT_GROUP), torch.float32),
    )
    for (name, shape, dtype), t in zip(want, quant_out):
        check_tensor(name, t, dtypes=(dtype,))
        if tuple(t.shape) != shape or t.device != device or not t.is_contiguous():
            raise ValueError(f"{name} must be {list(shape)}, contiguous, on {device}")
        if t.data_ptr() % 16:
            raise ValueError(f"{name} must start 16-byte aligned")
    check_inputs_apart(dict(zip((Q_NAME, SCALES_NAME), quant_out)), inputs)
    check_inputs_apart({SCALES_NAME: quant_out[1]}, {Q_NAME: quant_out[0]})


def empty_quant_out(m: int, h: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``quant_out`` for ``m`` rows of width ``h``, uninitialised."""
    return (
        torch.empty((m, h), dtype=torch.float8_e4m3fn, device=device),
        torch.empty((m, h // QUANT_GROUP), dtype=torch.float32, device=device),
    )


_NO_QUANT_OUT: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}


def no_quant_out(device: torch.device, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' "no FP8 groups": a pair without rows (made once a device and width)."""
    key = (device, h)
    if key not in _NO_QUANT_OUT:
        _NO_QUANT_OUT[key] = empty_quant_out(0, h, device)
    return _NO_QUANT_OUT[key]


def fill_quant_out(quant_out, normed: torch.Tensor) -> None:
    """The fallbacks' ``quant_out``: the reference quantizer of ``normed``, copied in."""
    for out, value in zip(quant_out, group_quant_ue8m0(normed, QUANT_GROUP), strict=True):
        out.copy_(value)
