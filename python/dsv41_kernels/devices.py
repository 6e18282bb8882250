"""What the ops ask of a CUDA device: its arch, SM count, and whether a launch may start early.

Queries only, cached per device index (admissions and launch shapes ask on every call); the
build and load of the CUDA modules is :mod:`dsv41_kernels.jit`'s. torch is imported inside the
functions, so that the wheel build (which imports :mod:`dsv41_kernels.jit`) needs no torch.
"""

from __future__ import annotations

import functools


def arch_name(capability: tuple[int, int]) -> str:
    """tvm-ffi's arch string for a device, e.g. ``9.0a``: the arch-specific target on Hopper and
    Blackwell, whose instructions (setmaxnreg, wgmma, tcgen05) plain ``sm_90`` lacks."""
    major, minor = capability
    return f"{major}.{minor}{'a' if major in (9, 10, 12) else ''}"


@functools.cache
def device_capability(device_index: int) -> tuple[int, int]:
    """A CUDA device's compute capability (cached: admissions ask on every call)."""
    import torch

    return torch.cuda.get_device_capability(device_index)


@functools.cache
def device_arch(device_index: int) -> str:
    """The arch string (:func:`arch_name`) of a CUDA device."""
    return arch_name(device_capability(device_index))


def sm_major(device_index: int) -> int:
    """The compute capability's major version of a CUDA device."""
    return device_capability(device_index)[0]


def dependent_launch(device) -> bool:
    """Whether kernels on ``device`` launch as programmatic dependent launches (PDL): compiled
    kernels on an NVIDIA GPU of sm_90 or later, as SGLang's own kernels launch there. Such a
    kernel may start while the previous one on the stream finishes and waits for it
    (``griddepcontrol.wait``) before its first global access."""
    import torch

    from dsv41_kernels.interpreter import triton_interpreter

    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip or triton_interpreter():
        return False
    return sm_major(cuda_index(device)) >= 9


RESIDENT_WARPS_PER_SM = 16
"""Warps an SM surely holds at once of a kernel of at most 128 registers a thread and little
shared memory: 16 such warps fill its 64 K registers (Hopper and Blackwell hold up to 64 warps
when the registers allow). Heavier kernels must not use :func:`one_wave`."""


def one_wave(programs: int, num_warps: int, device) -> bool:
    """Whether a grid of ``programs`` programs of ``num_warps`` warps of a light kernel
    (:data:`RESIDENT_WARPS_PER_SM`) is surely resident on ``device`` at once. A dependent launch
    of one wave lets the next launch start as it starts (``gdc_launch_dependents``); one of
    several waves does not: the early start then crowds the grid's later waves and slows it."""
    import torch

    device = torch.device(device)
    return programs * num_warps <= RESIDENT_WARPS_PER_SM * multiprocessors(cuda_index(device))


def cuda_index(device) -> int:
    """A CUDA ``torch.device``'s index, the current device's when it names none."""
    import torch

    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def multiprocessors(device_index: int) -> int:
    """A CUDA device's SM count (cached: launch shapes ask on every call)."""
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count
