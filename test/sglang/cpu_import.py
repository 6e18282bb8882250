"""Make the real SGLang importable on a CPU-only machine, for the plugin's CPU test tier.

``import sglang`` reaches torchvision through transformers. The torchvision wheel that SGLang's
requirements pull is a CUDA build: on a CPU machine its native library does not load, so its
operators are never defined, and torchvision's own fake-tensor registrations then fail with
``operator torchvision::nms does not exist``. Defining the two operator schemas those
registrations need (no kernels: nothing calls them) lets the import go through. A real GPU
server has a loadable torchvision and never runs this; the plugin itself does not touch
torchvision.

Run as a script, it imports the SGLang modules the plugin hooks and prints their version.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib

import torch

# SGLang's plugin loader and modules of call sites the plugin hooks; loading the plugin imports
# the rest of the modules it hooks.
SGLANG_MODULES = (
    "sglang.srt.plugins",
    "sglang.srt.plugins.hook_registry",
    "sglang.kernels.ops.speculative.dspark.dspark_accept",
    "sglang.srt.multimodal.dsv41.vl_routing",
    "sglang.srt.models.deepseek_v4_mhc",
    "sglang.srt.layers.attention.deepseek_v4_backend",
    "sglang.srt.model_executor.model_runner_components.weight_updater",
)

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_library = None  # kept alive: dropping a torch.library.Library removes its definitions


def _torchvision_native_library() -> pathlib.Path | None:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = pathlib.Path(next(iter(spec.submodule_search_locations)))
    return next(iter(sorted(package.glob("_C*.so"))), None)


def define_torchvision_schemas() -> bool:
    """Define torchvision's nms/qnms schemas when its native library cannot load here.

    Returns True when the schemas were defined, False when torchvision is absent or its own
    library loaded (then it defines them itself). Idempotent.
    """
    global _library
    if _library is not None:
        return True
    native = _torchvision_native_library()
    if native is None:
        return False
    try:
        torch.ops.load_library(str(native))
        return False
    except OSError:
        pass
    _library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        _library.define(schema)
    return True


def import_sglang():
    """Import SGLang and the hooked modules; raises whatever the import raises."""
    define_torchvision_schemas()
    for name in SGLANG_MODULES:
        importlib.import_module(name)
    return importlib.import_module("sglang")


if __name__ == "__main__":
    sglang = import_sglang()
    print(f"sglang {sglang.__version__} imports on torch {torch.__version__}")
