"""Just-in-time build of the CUDA sources in ``sgl-kernel/csrc`` through apache-tvm-ffi.

apache-tvm-ffi is what SGLang and FlashInfer use for their own just-in-time kernels: a
small C ABI (``TVM_FFI_DLL_EXPORT_TYPED_FUNC``) taking DLPack tensor views, so torch
tensors pass straight in without a torch C++ extension build (seconds, not a minute) and
kernels launch on the stream tvm-ffi reports for the device, which is torch's current one.
A module is compiled once per (sources' hash, GPU architecture) and cached on disk.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from pathlib import Path

import torch

CSRC = Path(
    os.environ.get(
        "DSV41_KERNELS_CSRC", Path(__file__).resolve().parents[2] / "sgl-kernel" / "csrc"
    )
)
CACHE = Path(os.environ.get("DSV41_KERNELS_CACHE", Path.home() / ".cache" / "dsv41-kernels"))


def arch_name(capability: tuple[int, int]) -> str:
    """tvm-ffi's arch string for a device, e.g. ``9.0a``: the arch-specific target on Hopper and
    Blackwell, whose instructions (setmaxnreg, wgmma, tcgen05) plain ``sm_90`` lacks."""
    major, minor = capability
    return f"{major}.{minor}{'a' if major in (9, 10, 12) else ''}"


def sources(name: str) -> list[Path]:
    """The ``.cu`` file of module ``name`` and every header beside it (headers change the hash)."""
    main = CSRC / f"{name}.cu"
    if not main.is_file():
        raise FileNotFoundError(
            f"no CUDA source {main} (set DSV41_KERNELS_CSRC to the csrc folder)"
        )
    return [main, *sorted(CSRC.rglob("*.cuh"))]


@functools.cache
def sm_major(device_index: int) -> int:
    """The compute capability's major version of a CUDA device (cached: admissions ask often)."""
    return torch.cuda.get_device_capability(device_index)[0]


@functools.cache
def toolchain_available() -> bool:
    """Whether CUDA sources can be built here: nvcc (or CUDA_HOME) and apache-tvm-ffi."""
    try:
        import tvm_ffi.cpp  # noqa: F401
    except ImportError:
        return False
    return shutil.which("nvcc") is not None or bool(os.environ.get("CUDA_HOME"))


@functools.cache
def load_module(name: str, device_index: int = 0):
    """Build (once) and load ``sgl-kernel/csrc/<name>.cu`` for the given CUDA device."""
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        raise RuntimeError(
            f"dsv41_kernels: building the CUDA module {name!r} needs nvcc; none is on PATH and "
            "CUDA_HOME is unset. Install the CUDA toolkit or use the torch fallback."
        )
    try:
        import tvm_ffi.cpp
    except ImportError as e:
        raise RuntimeError(
            "dsv41_kernels: CUDA modules are built with apache-tvm-ffi; "
            "pip install 'dsv41-kernels[cuda]'"
        ) from e
    srcs = sources(name)
    arch = arch_name(torch.cuda.get_device_capability(device_index))
    digest = hashlib.sha256()
    for path in srcs:
        digest.update(path.read_bytes())
    digest.update(arch.encode())
    build = CACHE / f"{name}-{digest.hexdigest()[:16]}"
    build.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("TVM_FFI_CUDA_ARCH_LIST")
    os.environ["TVM_FFI_CUDA_ARCH_LIST"] = arch  # tvm-ffi reads its target from here
    try:
        return tvm_ffi.cpp.load(
            name,
            sources=[str(srcs[0])],
            extra_cuda_cflags=["-O3", "-lineinfo"],
            extra_include_paths=[str(CSRC)],
            build_directory=str(build),
        )
    finally:
        if previous is None:
            del os.environ["TVM_FFI_CUDA_ARCH_LIST"]
        else:
            os.environ["TVM_FFI_CUDA_ARCH_LIST"] = previous
