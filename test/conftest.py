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
