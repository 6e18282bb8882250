"""The SGLang plugin tier: runs against the real SGLang (0.5.23) when it imports here.

Nothing here imports SGLang at collection time: the session fixture ``sglang`` does, after
defining the torchvision schemas a CPU machine lacks (``cpu_import``), and skips every test
of this directory with the import error as its reason when SGLang is not installed (or fails
them, when ``DSV41_KERNELS_REQUIRE_SGLANG`` is set, as in ``.ci/run``). The
``plugin`` fixture then runs SGLang's own ``load_plugins()``, which finds this package through
its entry point (the package must be installed: ``pip install -e .``).
"""

from __future__ import annotations

import os

import pytest

from test.sglang.cpu_import import import_sglang

REQUIRE_ENV = "DSV41_KERNELS_REQUIRE_SGLANG"


@pytest.fixture(scope="session")
def sglang():
    try:
        return import_sglang()
    except Exception as e:  # ImportError, or whatever a half-installed SGLang raises
        reason = f"sglang is not importable here ({type(e).__name__}: {e})"
        # CI installs SGLang and sets this, so a broken install fails there instead of skipping.
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{reason}; {REQUIRE_ENV} is set")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def plugin(sglang):
    """SGLang's plugin loader run once for the session, with every call site switched on."""
    os.environ.pop("DSV41_KERNELS_DISABLE", None)
    os.environ["SGLANG_PLUGINS"] = "dsv41_kernels"  # other installed plugins stay out
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from dsv41_kernels import sglang_plugin

    if sglang_plugin.status() is None:
        pytest.fail(
            "load_plugins() did not call dsv41_kernels.sglang_plugin:register: the package's "
            "entry point is not installed in this environment (pip install -e .)"
        )
    return sglang_plugin


@pytest.fixture
def fired(plugin):
    """``fired()`` -> the plugin's fire counts since this test started."""
    from dsv41_kernels.sglang_plugin import dispatch

    dispatch.reset()
    yield dispatch.fire_counts
    dispatch.reset()


@pytest.fixture
def sglang_torch_sinkhorn(monkeypatch):
    """SGLang's split+Sinkhorn is a TileLang CUDA kernel; on CPU its own pure-torch statement
    (``sglang.test.kernels.mhc.hc_split_sinkhorn_torch``) stands in for it."""
    from sglang.kernels.ops.layernorm import mhc as kernels
    from sglang.test.kernels.mhc import hc_split_sinkhorn_torch

    monkeypatch.setattr(kernels, "hc_split_sinkhorn", hc_split_sinkhorn_torch)
