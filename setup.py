"""The wheel's CUDA parts; everything else is in pyproject.toml.

A wheel carries the CUDA sources (``dsv41_kernels/csrc``, for the hash and the just-in-time
fallback) and, built where nvcc is, every module prebuilt for the archs the package admits
(``dsv41_kernels/prebuilt``: :mod:`dsv41_kernels.prebuild`), so that it runs the CUDA kernels
on a machine without nvcc. ``DSV41_KERNELS_PREBUILD``: ``auto`` (the default: prebuild where
nvcc and apache-tvm-ffi are present, else a wheel without modules), ``1`` (fail without them)
or ``0`` (sources only).
An editable install reads the checkout's sources and prebuilt folder instead.
"""

import os
import platform
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).resolve().parent / "python"))
from dsv41_kernels import jit, prebuild  # noqa: E402  (torch-free: the build has no torch)

WHEEL_PLATFORM = f"manylinux_2_28_{platform.machine()}"
"""The modules need at most glibc 2.28 and gcc 8's libstdc++ (test/test_wheel.py checks), plus
the CUDA runtime and libtvm_ffi that torch and apache-tvm-ffi bring."""


def _prebuilt_folder(build_lib: str) -> Path:
    return Path(build_lib) / "dsv41_kernels" / "prebuilt"


class BuildPy(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        csrc = Path(self.build_lib) / "dsv41_kernels" / "csrc"
        shutil.rmtree(csrc, ignore_errors=True)
        shutil.copytree(jit.CSRC, csrc)
        folder = _prebuilt_folder(self.build_lib)
        mode = os.environ.get("DSV41_KERNELS_PREBUILD", "auto")
        if mode != "0":
            try:
                prebuild.prebuild(folder, reuse=jit.PREBUILT)
                return
            except RuntimeError as e:
                if mode == "1":
                    raise
                print(f"dsv41-kernels: the wheel carries no prebuilt modules: {e}")
        shutil.rmtree(folder, ignore_errors=True)  # nor any that an earlier build left


class BdistWheel(bdist_wheel):
    def get_tag(self):
        """A platform tag once the wheel holds prebuilt modules; they need no given Python."""
        build_lib = self.get_finalized_command("build_py").build_lib
        if (_prebuilt_folder(build_lib) / jit.MANIFEST).is_file():
            return "py3", "none", WHEEL_PLATFORM
        return super().get_tag()


setup(cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel})
