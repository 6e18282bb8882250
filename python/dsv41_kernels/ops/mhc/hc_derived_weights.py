"""The derived weights of the mHC projection: ``fn``'s TF32 residual, made once.

A TF32 tensor core reads an fp32 operand truncated to 11 significant bits. Splitting ``fn``
into its TF32 part and the exact residual, ``fn = hi + lo`` (:func:`split_tf32`), lets two
tensor-core products ``x·hi + x·lo`` carry ``fn`` to about 22 bits (docs/specs.md C.7). Only
``lo`` is stored: ``hi`` is what the tensor core reads from ``fn``'s own bits, so the kernels
take ``fn`` for it (the Triton projection clears the 13 bits while loading, which gives the same
values). At DeepSeek-V4.1's ``fn [24, 20480]`` that is 1.97 MB per sublayer, where SGLang's
bf16x3 parts take 2.95 MB (a packed ``[hi | lo]`` copy took 5.2 MB).

:class:`HcDerivedWeights` holds the residual of one sublayer's ``fn``, built at load. While it
is active ``fn`` must not be updated in place: the residual, and any CUDA graph captured with
it, would keep serving the old weights. :meth:`HcDerivedWeights.update_refusal` says so and
names the fix (``release()``, then a new holder); an integration publishes it where its weight
updater looks (the SGLang plugin does, for SGLang's). An in-place write through ``fn`` itself
is caught at the next use (``fn``'s version counter moved); writes through ``fn.data`` or
CUDA-graph replays cannot be seen, which is why the refusal exists.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dsv41_kernels.admission import check_tensor
from dsv41_kernels.reference.hc_mix_stats import HC_MIX

TF32_DROPPED_BITS = 13
"""fp32 has 23 explicit mantissa bits, TF32 10; the tensor core ignores the low 13 (C.7)."""
_TF32_MASK = -(1 << TF32_DROPPED_BITS)  # 0xFFFFE000 as int32


def split_tf32(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split fp32 ``w`` into ``(hi, lo)`` with ``hi + lo == w`` bitwise.

    Rule: **truncation**. ``hi`` is ``w`` with its low 13 mantissa bits cleared, i.e. exactly
    what a TF32 tensor core reads from the raw fp32 value (round toward zero, docs/specs.md
    C.7), so a pass over ``hi`` alone reproduces single-pass TF32. ``lo = w - hi`` is exact in
    fp32 (same sign and exponent range, Sterbenz) and carries ``w``'s sign, so ``-0.0`` splits into
    ``(-0.0, -0.0)`` and the sum keeps the sign of zero. Subnormals split like any other
    value. Non-finite values are not split: ``hi = w`` (NaN payload kept) and ``lo = ±0``.
    The tensor core truncates ``lo`` again to its top 11 bits, so ``x·hi + x·lo`` carries
    about 22 of ``w``'s 24 significant bits.
    """
    check_tensor("w", w, dtypes=(torch.float32,))
    truncated = (w.view(torch.int32) & _TF32_MASK).view(torch.float32)
    finite = torch.isfinite(w)
    hi = torch.where(finite, truncated, w)
    lo = torch.copysign(torch.where(finite, w - hi, torch.zeros_like(w)), w)
    return hi, lo


def tf32_residual(fn: torch.Tensor) -> torch.Tensor:
    """``lo`` of :func:`split_tf32`, contiguous: what the compensated kernels read beside ``fn``."""
    return split_tf32(fn.detach())[1].contiguous()


class HcDerivedWeights:
    """One sublayer's ``fn [24, 4H]`` and its TF32 residual, built once at load.

    ``lo`` (``[24, 4H]`` fp32, contiguous) is what the compensated kernels read beside ``fn``;
    ``fn`` is kept, readable and unchanged. ``name`` labels ``fn`` in messages; ``on_release``
    is called by :meth:`release` (an integration clears the refusal it published there).
    """

    def __init__(
        self, fn: torch.Tensor, *, name: str = "fn", on_release: Callable[[], None] | None = None
    ):
        check_tensor("fn", fn, dtypes=(torch.float32,), ndim=2)
        if fn.shape[0] != HC_MIX:
            raise ValueError(f"fn must have {HC_MIX} rows, got shape {tuple(fn.shape)}")
        self.fn = fn
        self.name = name
        self._lo: torch.Tensor | None = tf32_residual(fn)
        self._fn_version = fn._version
        self._on_release = on_release

    @property
    def active(self) -> bool:
        return self._lo is not None

    @property
    def lo(self) -> torch.Tensor:
        return self.require_active()

    def update_refusal(self) -> str | None:
        """Why ``fn`` may not be updated in place now, or ``None``."""
        if not self.active:
            return None
        return (
            f"online update of mHC weight {self.name!r} refused: its compensated-TF32 residual "
            "(lo) is active and an in-place write would leave it, and any CUDA graph captured "
            "with it, serving the old weights; call HcDerivedWeights.release() before updating, "
            "then build a new HcDerivedWeights(fn)"
        )

    def release(self) -> None:
        """Drop the residual; in-place updates of ``fn`` are allowed again."""
        self._lo = None
        if self._on_release is not None:
            self._on_release()

    def require_active(self) -> torch.Tensor:
        """``lo``, unless the holder was released or ``fn`` changed since it was made."""
        if self._lo is None:
            raise ValueError(
                f"weights: the HcDerivedWeights of {self.name!r} was released; "
                "build a new HcDerivedWeights(fn) (or pass fn)"
            )
        if self.fn._version != self._fn_version:
            raise RuntimeError(
                f"weights: {self.name!r} was modified in place after its residual was made; "
                "call release(), update, and build a new HcDerivedWeights(fn)"
            )
        return self._lo
