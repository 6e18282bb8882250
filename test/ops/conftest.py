"""Fixtures the op tests share."""

import pytest

from dsv41_kernels import interpreter
from test.machine import needs_kernel


@pytest.fixture(params=[pytest.param("kernel", marks=needs_kernel), "fallback"])
def path(request, monkeypatch):
    """Each op path in turn: the kernel's (on CPU, the Triton interpreter; without a Triton
    device it is not collected, the fallback's case covering it) and the torch fallback's (the
    interpreter switched off, so the admission refuses CPU tensors). A test that parametrizes
    ``path`` itself overrides this."""
    if request.param == "fallback":
        monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    return request.param
