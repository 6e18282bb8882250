"""Every CUDA source compiles for Hopper (sm_90a) and Blackwell (sm_100a), GPU or not."""

import shutil
import subprocess
from pathlib import Path

import pytest

from dsv41_kernels.jit import CSRC

SOURCES = sorted(CSRC.glob("*.cu"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("source", SOURCES, ids=[s.name for s in SOURCES])
def test_compiles(source: Path, arch: str, tmp_path: Path):
    tvm_ffi_libinfo = pytest.importorskip("tvm_ffi.libinfo")
    includes = [
        tvm_ffi_libinfo.find_include_path(),
        tvm_ffi_libinfo.find_dlpack_include_path(),
        str(CSRC),
    ]
    cmd = ["nvcc", "-std=c++17", "-O3", f"-arch={arch}", "-c", str(source)]
    cmd += [f"-I{p}" for p in includes] + ["-o", str(tmp_path / "out.o")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_sources_exist():
    assert SOURCES, f"no CUDA sources under {CSRC}"
