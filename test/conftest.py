"""Test tiers: the CPU tier runs everywhere (Triton kernels under the interpreter when no GPU
is present); tests marked ``gpu`` need CUDA and are skipped with that reason elsewhere."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must precede every op import: triton.jit picks the interpreter at decoration time.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu tier: no CUDA device on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def prebuilt_modules() -> dict[str, dict]:
    """The package's prebuilt folder with every module current (its manifest's entries): what
    the prebuild step of ``.ci/run`` made, else built now where nvcc is (incrementally)."""
    from dsv41_kernels import jit, prebuild

    try:
        return prebuild.prebuild(jit.PREBUILT, log=lambda line: None)
    except RuntimeError as e:
        if jit.toolchain_available():
            raise  # a source that does not compile, not a machine without a compiler
        pytest.skip(f"no prebuilt modules and no CUDA toolchain to build them: {e}")
