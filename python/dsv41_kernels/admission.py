"""Admission: whether an op may take its kernel path, and why.

Every op has a pure admission function returning an :class:`Admission`. It reads only
shapes, dtypes, strides and the device (never tensor values, so it never syncs the host)
and the public function takes the kernel when admitted and the torch fallback otherwise.
The Triton interpreter (``TRITON_INTERPRET=1``) counts as a device, so the CPU tier runs
the real Triton kernels on CPU tensors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Admission:
    """``ok`` says whether the kernel path is taken; ``reason`` says why, in a few words."""

    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok

    @property
    def path(self) -> str:
        return "kernel" if self.ok else "fallback"


def admit(reason: str = "admitted") -> Admission:
    return Admission(True, reason)


def refuse(reason: str) -> Admission:
    return Admission(False, reason)


def triton_interpreter() -> bool:
    """True when Triton kernels run in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_device(t: torch.Tensor) -> Admission:
    """Where a Triton kernel can read ``t``: CUDA, or a CPU tensor under the interpreter."""
    if t.is_cuda:
        return admit("cuda")
    if t.device.type == "cpu" and triton_interpreter():
        return admit("triton interpreter")
    return refuse(f"{t.device.type} tensor without a Triton device")


def check_tensor(name: str, t: object, *, dtypes=None, ndim: int | None = None) -> torch.Tensor:
    """Raise ``ValueError`` naming ``name`` unless ``t`` is a tensor of ``dtypes`` and ``ndim``."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(
            f"{name} must have dtype in ({names}), got {str(t.dtype).replace('torch.', '')}"
        )
    return t
