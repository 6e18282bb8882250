"""Builds a probe module for sm_90a: run from the probe folder, `python build.py router_probe`;
the kernel headers come from the repository's sgl-kernel/csrc (dsv41_kernels.jit.CSRC)."""
import os
import sys

import tvm_ffi.cpp
from dsv41_kernels import jit

os.environ["TVM_FFI_CUDA_ARCH_LIST"] = "9.0a"
os.environ["CUDA_HOME"] = jit.cuda_home()
name = sys.argv[1]
print(tvm_ffi.cpp.build(name, sources=[f"{name}.cu"], extra_cuda_cflags=["-O3", "-std=c++17", "-lineinfo"],
      extra_include_paths=[str(jit.CSRC)], build_directory=f"build_{name}"))
