"""Pretend machine facts for CPU tests of choices made from them: a CUDA device, an
architecture, a toolchain. Admissions read only tensor metadata and these facts, so a CPU
tensor that says it lives on ``cuda:0`` shows which kernel a GPU machine would take."""

from __future__ import annotations

import sys

import pytest
import torch


class OnCuda(torch.Tensor):
    """A CPU tensor whose ``is_cuda`` and ``device`` say ``cuda:0`` (metadata only: never
    launch anything on it)."""

    @property
    def is_cuda(self) -> bool:
        return True

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0)


def on_cuda(t: torch.Tensor) -> OnCuda:
    return torch.Tensor._make_subclass(OnCuda, t)


def _set_everywhere(name: str, value, setattr_=setattr) -> None:
    """Rebind ``name`` in every loaded dsv41_kernels module that has it (they import by name)."""
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("dsv41_kernels") and hasattr(module, name):
            setattr_(module, name, value)


def pretend_toolchain(available: bool, setattr_=setattr) -> None:
    """Every module sees a machine with (or without) nvcc and apache-tvm-ffi, and no prebuilt
    modules: each CUDA module is built on first use, or cannot be had."""
    from dsv41_kernels.jit import BUILT_SOURCE, ModuleAvailability

    found = (
        ModuleAvailability(True, "pretended: built on first use", BUILT_SOURCE)
        if available
        else ModuleAvailability(False, "pretended: none prebuilt, no toolchain to build it")
    )
    _set_everywhere("toolchain_available", lambda: available, setattr_)
    _set_everywhere("module_available", lambda name, device_index: found, setattr_)


def pretend_arch(major: int, setattr_=setattr) -> None:
    """Every module sees CUDA devices of compute capability ``major``."""
    _set_everywhere("sm_major", lambda index: major, setattr_)


def _kernels_run_here() -> bool:
    from dsv41_kernels.admission import triton_interpreter

    return torch.cuda.is_available() or triton_interpreter()


needs_kernel = pytest.mark.skipif(not _kernels_run_here(), reason="no Triton device")
"""For tests of the Triton kernels: they run on a CUDA GPU, or under the interpreter."""
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
"""Where kernel tests put their tensors."""
