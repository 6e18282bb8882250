"""Admission: whether an op's kernel runs for these arguments, which kernel, and why.

Every op has one pure admission function returning an :class:`Admission`. It reads only
shapes, dtypes, strides, alignment and the device (never tensor values, so it never syncs the
host) and it never raises: arguments the op itself rejects are refused, with the op's error as
the reason. The public function validates its arguments (``ValueError`` naming the argument),
makes the same decision once, and dispatches on :attr:`Admission.kernel`, running the torch
fallback when the admission refuses. A caller that already holds the admission (an SGLang
hook choosing between the op and SGLang's own function) passes it in, so the choice is made
once per call either way.

The Triton interpreter (``TRITON_INTERPRET=1``) counts as a device, so the CPU tier runs the
real Triton kernels on CPU tensors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from dsv41_kernels.jit import module_available


@dataclass(frozen=True)
class Admission:
    """``ok``: the kernel path is taken; ``reason``: why, in a few words; ``kernel``: which
    kernel runs (the op's own name for it, e.g. ``"triton"``), None when refused; ``module``:
    the CUDA module that kernel loads (``sgl-kernel/csrc/<module>.cu``), None for the others."""

    ok: bool
    reason: str
    kernel: str | None = None
    module: str | None = None

    def __bool__(self) -> bool:
        return self.ok

    @property
    def path(self) -> str:
        return "kernel" if self.ok else "fallback"


def admit(kernel: str, reason: str | None = None, module: str | None = None) -> Admission:
    return Admission(True, kernel if reason is None else reason, kernel, module)


def refuse(reason: str) -> Admission:
    return Admission(False, reason)


def invalid(error: Exception) -> Admission:
    """The refusal for arguments the op's validation rejects (its error is the reason)."""
    return refuse(f"invalid arguments: {error}")


def triton_interpreter() -> bool:
    """True when Triton kernels run in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_device(t: torch.Tensor) -> Admission:
    """Where a Triton kernel can read ``t``: CUDA, or a CPU tensor under the interpreter."""
    if t.is_cuda:
        return admit("triton", "cuda")
    if t.device.type == "cpu" and triton_interpreter():
        return admit("triton", "triton interpreter")
    return refuse(f"{t.device.type} tensor without a Triton device")


def check_tensor(name: str, t: object, *, dtypes=None, ndim: int | None = None) -> torch.Tensor:
    """Raise ``ValueError`` naming ``name`` unless ``t`` is a tensor of ``dtypes`` and ``ndim``."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got {t.dim()}-D shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(
            f"{name} must have dtype in ({names}), got {str(t.dtype).replace('torch.', '')}"
        )
    return t


def cuda_kernel_runs(module: str, t: torch.Tensor, fits: bool) -> tuple[bool, str]:
    """Whether a CUDA kernel of ``module`` runs on ``t``'s device, and a note for the
    admission's reason. It runs when ``fits`` (the kernel's arch and layout conditions) and the
    module can be had (:func:`dsv41_kernels.jit.module_available`: prebuilt, cached or built
    on first use); the note says from where, or why not, and is empty when it does not fit."""
    if not fits:
        return False, ""
    found = module_available(module, t.device.index or 0)
    return found.ok, f" ({module}: {found.reason})"
