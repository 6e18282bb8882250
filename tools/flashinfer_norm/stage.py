"""Stage FlashInfer's RMSNorm headers for a machine without FlashInfer (the H200 device):
``python tools/flashinfer_norm/stage.py [--out .flashinfer_norm]``.

``rmsnorm_quant_fp8``'s GPU tests and benchmark compare its ``y`` with FlashInfer's
``RMSNormKernel`` (what ``sgl_kernel.rmsnorm`` runs), built beside them from FlashInfer's own
headers with ``-use_fast_math`` (``benchmark/kernels/flashinfer_rmsnorm.cu``). This copies, from
the FlashInfer installed here, only the headers ``flashinfer/norm.cuh`` includes (found by
``nvcc -M``; about 230 KB, small enough to carry beside ``.sglang_env``), and empty stand-ins for
the CUDA library headers they name but never use here (``cublasLt.h``, ...). The folder is
ignored by git; the tests find it at the repository root, or where ``FLASHINFER_NORM_INCLUDE``
points.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

STAND_INS = ("cublasLt.h", "cublas_v2.h", "curand_kernel.h")
PROBE = "#include <cuda_bf16.h>\n#include <flashinfer/norm.cuh>\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(".flashinfer_norm"))
    args = parser.parse_args()
    import flashinfer

    include = Path(flashinfer.__file__).parent / "data" / "include"
    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    stub = out / "stand_ins"
    stub.mkdir(parents=True)
    for name in STAND_INS:
        (stub / name).write_text("// empty stand-in: the RMSNorm instantiation uses none of it\n")
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.cu"
        probe.write_text(PROBE)
        deps = subprocess.run(
            ["nvcc", "-std=c++17", "-arch=sm_90a", f"-I{include}", f"-I{stub}", "-M", str(probe)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    headers = {Path(p) for p in deps.replace("\\\n", " ").split() if p.startswith(str(include))}
    for header in sorted(headers):
        target = out / "include" / header.relative_to(include)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(header, target)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{len(headers)} headers, {size / 1024:.0f} KiB in {out}")


if __name__ == "__main__":
    main()
