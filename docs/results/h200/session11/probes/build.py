import sys, tvm_ffi.cpp, os
os.environ["TVM_FFI_CUDA_ARCH_LIST"] = "9.0a"
from dsv41_kernels import jit
os.environ["CUDA_HOME"] = jit.cuda_home()
name = sys.argv[1]
print(tvm_ffi.cpp.build(name, sources=[f"{name}.cu"], extra_cuda_cflags=["-O3", "-std=c++17", "-lineinfo"],
      extra_include_paths=["/work/main/sgl-kernel/csrc"], build_directory=f"build_{name}"))
