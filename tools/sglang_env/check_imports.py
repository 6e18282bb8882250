"""Import every SGLang module the GPU tests and benchmarks use, under the activated environment.

    source tools/sglang_env/activate.sh && python3 tools/sglang_env/check_imports.py

Prints one line per module (ok, or the error), then where SGLang was imported from, which
stand-ins were imported (importing one is expected; using one raises StandInUsed), and whether
tilelang imports. Exits 1 if any module fails, except, on a machine without CUDA, the ones that
load CUDA libraries when imported (FlashMLA's extension), which are reported as such.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = (
    "sglang",
    "sglang.srt.plugins",
    "sglang.srt.plugins.hook_registry",
    "sglang.kernels.ops.speculative.dspark.dspark_accept",
    "sglang.kernels.ops.speculative.row_argmax",
    "sglang.srt.speculative.dspark_components.dspark_verify",
    "sglang.srt.speculative.spec_tp_sync",
    "sglang.srt.multimodal.dsv41.vl_routing",
    "sglang.srt.layers.moe.topk",
    "sglang.srt.layers.moe.utils",
    "sglang.kernels.ops.moe.moe_fused_gate",
    "sglang.srt.models.deepseek_v4_mhc",
    "sglang.srt.models.deepseek_v4",
    "sglang.kernels.ops.layernorm.mhc",
    "sglang.kernels.ops.layernorm.hc_combine_norm",
    "sglang.srt.layers.attention.deepseek_v4_backend",
    "sglang.kernels.ops.attention.flash_mla_interface",
    "sglang.kernels.ops.attention.dsv4.flashmla_sched_meta",
    "sglang.srt.model_executor.model_runner_components.weight_updater",
    "sglang.srt.batch_invariant_ops",
    "sglang.srt.layers.layernorm",
    "dsv41_kernels",
    "dsv41_kernels.sglang_plugin",
)
# Import a CUDA extension at module level: on a machine without CUDA they cannot import.
NEEDS_CUDA = {"sglang.kernels.ops.attention.flash_mla_interface": "flash_mla"}


def _fake_h200(torch):
    import types

    props = types.SimpleNamespace(
        name="NVIDIA H200", major=9, minor=0, total_memory=150_000_000_000,
        multi_processor_count=132, L2_cache_size=60 * 2**20, warp_size=32,
        max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536,
        shared_memory_per_block_optin=232448, gcnArchName="", uuid="fake",
    )  # fmt: skip
    torch.cuda.is_available = lambda: True
    torch.version.cuda = "13.0"
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_name = lambda device=None: "NVIDIA H200"
    torch.cuda.get_device_properties = lambda device=None: props
    torch.cuda.mem_get_info = lambda device=None: (140_000_000_000, 150_000_000_000)
    torch.cuda.is_bf16_supported = lambda *a, **k: True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the results here")
    ap.add_argument(
        "--fake-cuda",
        action="store_true",
        help="CPU-only analysis: torch claims one H200 so that SGLang's CUDA import branches "
        "run (sgl_kernel, deep_gemm, ...); nothing is launched, CUDA extensions still fail",
    )
    args = ap.parse_args()
    import torch

    if args.fake_cuda:
        _fake_h200(torch)

    cuda = torch.cuda.is_available() and not args.fake_cuda
    if not cuda:  # the CPU tier's torchvision schemas (test/sglang/cpu_import.py)
        sys.path.insert(0, str(ROOT))
        from test.sglang.cpu_import import define_torchvision_schemas

        define_torchvision_schemas()
    results, bad = {}, 0
    for name in MODULES:
        t = time.time()
        try:
            importlib.import_module(name)
            results[name] = "ok"
            print(f"ok    {name}  ({time.time() - t:.1f} s)")
        except BaseException as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            if not cuda and name in NEEDS_CUDA:
                results[name] = f"needs CUDA ({msg})"
                print(f"cuda  {name}  imports {NEEDS_CUDA[name]}, a CUDA extension: {msg}")
            else:
                bad += 1
                results[name] = msg
                print(f"FAIL  {name}  {msg}")
                traceback.print_exc(limit=-4)
    import sglang

    standins = sorted(
        n for n, m in list(sys.modules.items()) if m is not None and vars(m).get("__standin__")
    )
    rust = sorted(
        n for n in list(sys.modules) if "rust_extensions._" in n or "rust_tree_core.mem_cache" in n
    )
    try:
        import tilelang  # noqa: F401

        tl = f"tilelang {tilelang.__version__} imports"
    except BaseException as e:  # noqa: BLE001
        tl = f"tilelang does not import ({type(e).__name__}: {str(e)[:120]})"
    summary = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": cuda,
        "sglang": f"{sglang.__version__} from {pathlib.Path(sglang.__file__).parent}",
        "sglang_modules": sum(1 for n in sys.modules if n.startswith("sglang")),
        "standins_imported": standins,
        "rust_extensions_imported": rust,
        "tilelang": tl,
        "failed": bad,
    }
    for k, v in summary.items():
        print(f"{k}: {v}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"modules": results, **summary}, indent=1))
    sys.exit(1 if bad or rust else 0)


if __name__ == "__main__":
    main()
