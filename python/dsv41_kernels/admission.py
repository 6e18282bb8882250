"""Admission: whether an op's kernel runs for these arguments, which kernel, and why.

Every op has one pure admission function returning an :class:`Admission`. It reads only
shapes, dtypes, strides, alignment and the device (never tensor values, so it never syncs the
host) and it never raises: arguments the op itself rejects are refused, with the op's error as
the reason. The public function validates its arguments (``ValueError`` naming the argument),
makes the same decision once, and dispatches on :attr:`Admission.kernel`, running the torch
fallback when the admission refuses. A caller that already holds the admission (an SGLang
hook choosing between the op and SGLang's own function) passes it in, so the choice is made
once per call either way.

The Triton interpreter counts as a device when this process's kernels run in it
(:mod:`dsv41_kernels.interpreter`), so the CPU tier runs the real Triton kernels on CPU tensors.
Scalars are checked here too (:func:`check_int`, :func:`check_float`, :func:`check_flag`):
Python and NumPy numbers are taken, bools are not numbers.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dsv41_kernels.interpreter import interpreter_unusable, triton_interpreter
from dsv41_kernels.jit import module_available


@dataclass(frozen=True)
class Admission:
    """``ok``: the kernel path is taken; ``reason``: why, in a few words; ``kernel``: which
    kernel runs (the op's own name for it, e.g. ``"triton"``), None when refused; ``module``:
    the CUDA module that kernel loads (``sgl-kernel/csrc/<module>.cu``), None for the others;
    ``plan``: what the launcher runs, as the op's own typed value (a frozen dataclass naming
    the kernel and its launch shape), chosen here once and never re-derived by the launcher.
    None when refused."""

    ok: bool
    reason: str
    kernel: str | None = None
    module: str | None = None
    plan: Any = None

    def __bool__(self) -> bool:
        return self.ok

    @property
    def path(self) -> str:
        return "kernel" if self.ok else "fallback"


def admit(
    kernel: str, reason: str | None = None, module: str | None = None, plan: Any = None
) -> Admission:
    return Admission(True, kernel if reason is None else reason, kernel, module, plan)


def refuse(reason: str) -> Admission:
    return Admission(False, reason)


def invalid(error: Exception) -> Admission:
    """The refusal for arguments the op's validation rejects (its error is the reason)."""
    return refuse(f"invalid arguments: {error}")


def triton_device(t: torch.Tensor) -> Admission:
    """Where a Triton kernel can read ``t``: CUDA, or a CPU tensor under the interpreter."""
    if t.is_cuda:
        return admit("triton", "cuda")
    if t.device.type == "cpu" and triton_interpreter():
        unusable = interpreter_unusable()
        return refuse(unusable) if unusable else admit("triton", "triton interpreter")
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


def _not_bool(name: str, value: object, kind: str) -> None:
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be {kind}, got the bool {value!r}")


def check_int(name: str, value: object, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as a Python int: an int or NumPy integer (not a bool) in ``[low, high]``; else
    ``ValueError`` naming ``name``."""
    _not_bool(name, value, "an int")
    if not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise ValueError(f"{name} must be in {bounds}, got {value}")
    return value


def check_float(name: str, value: object, *, low: float | None = None) -> float:
    """``value`` as a Python float: an int, float or NumPy real (not a bool), ``>= low``; else
    ``ValueError`` naming ``name``."""
    _not_bool(name, value, "a number")
    if not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if low is not None and not value >= low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


def check_flag(name: str, value: object) -> bool:
    """``value`` as a Python bool: a bool or NumPy bool; else ``ValueError`` naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_device(name: str, value: object) -> torch.device:
    """``value`` (a ``torch.device``, a string such as ``"cuda:0"`` or a CUDA index) as a
    ``torch.device`` this machine has; else ``ValueError`` naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (torch.device, str, int)):
        raise ValueError(f"{name} must be a torch.device, got {type(value).__name__} {value!r}")
    try:
        device = torch.device("cuda", value) if isinstance(value, int) else torch.device(value)
    except RuntimeError as e:
        raise ValueError(f"{name}: {e}") from e
    if device.type == "cuda" and not (
        torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()
    ):
        raise ValueError(f"{name} {device}: no such CUDA device on this machine")
    return device


def _owns_its_elements(t: torch.Tensor) -> bool:
    """True when no two indices of ``t`` address one element: after dropping size-1 dims and
    ordering the rest by stride, each stride exceeds the span of the dims below it (sufficient,
    and exact for every layout a view, transpose, slice or ``empty_strided`` makes)."""
    span = 0
    dims = sorted(((abs(st), s) for s, st in zip(t.shape, t.stride()) if s > 1))
    for stride, size in dims:
        if stride <= span:
            return False
        span += (size - 1) * stride
    return True


def check_outputs(outputs: dict[str, torch.Tensor | None]) -> None:
    """Raise ``ValueError`` naming the argument when an output tensor addresses one element
    through two indices (an ``expand`` view, say) or shares memory with another output: a
    kernel's rows would overwrite each other where the torch fallback raises or differs.
    ``None`` entries (outputs the op allocates) are skipped."""
    given = [(name, t) for name, t in outputs.items() if t is not None and t.numel()]
    for name, t in given:
        if not _owns_its_elements(t):
            raise ValueError(
                f"{name} has overlapping elements (stride {tuple(t.stride())} for shape "
                f"{tuple(t.shape)}, e.g. an expand view): an output must own each element"
            )
    spans = [(name, *_span(t)) for name, t in given]
    for i, (a, dev_a, lo_a, hi_a) in enumerate(spans):
        for b, dev_b, lo_b, hi_b in spans[i + 1 :]:
            if dev_a == dev_b and lo_a < hi_b and lo_b < hi_a:
                raise ValueError(f"{a} and {b} share memory: each output needs its own")


def _span(t: torch.Tensor) -> tuple[torch.device, int, int]:
    """``(device, first byte, one past the last byte)`` that ``t``'s elements can touch."""
    start = t.data_ptr() + t.element_size() * sum(
        (s - 1) * st for s, st in zip(t.shape, t.stride()) if st < 0
    )
    length = t.element_size() * (1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())))
    return t.device, start, start + length


def check_inputs_apart(
    outputs: dict[str, torch.Tensor | None], inputs: dict[str, torch.Tensor | None]
) -> None:
    """Raise ``ValueError`` naming both when an input shares memory with an output: a kernel
    would read values it is overwriting (the torch fallback reads them first). ``None`` and
    empty tensors are skipped."""
    spans = lambda given: [(n, *_span(t)) for n, t in given.items() if t is not None and t.numel()]
    for out, dev_o, lo_o, hi_o in spans(outputs):
        for name, dev_i, lo_i, hi_i in spans(inputs):
            if dev_o == dev_i and lo_o < hi_i and lo_i < hi_o:
                raise ValueError(f"{name} shares memory with the output {out}: give it its own")


def check_admission(value: object) -> Admission | None:
    """``value`` if it is an :class:`Admission` or None; else ``TypeError`` naming
    ``admission`` (a string such as ``"kernel"`` is not a decision the op can run)."""
    if value is not None and not isinstance(value, Admission):
        raise TypeError(
            f"admission must be an Admission from the op's *_admission function or None, got "
            f"{type(value).__name__} {value!r}"
        )
    return value
