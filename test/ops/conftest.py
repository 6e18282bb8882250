"""Fixtures the op tests share."""

import pytest
import torch

from dsv41_kernels import interpreter


@pytest.fixture(params=["kernel", "fallback"])
def path(request, monkeypatch):
    """Each op path in turn: the kernel's (on CPU, the Triton interpreter) and the torch
    fallback's (the interpreter switched off, so the admission refuses CPU tensors). A test
    that parametrizes ``path`` itself overrides this."""
    if request.param == "kernel" and not (
        torch.cuda.is_available() or interpreter.RUNS_IN_INTERPRETER
    ):
        pytest.skip("no Triton device: the fallback's case covers it")
    if request.param == "fallback":
        monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    return request.param
