"""The SGLang plugin tier: runs against the real SGLang (0.5.23) when it imports here.

SGLang is imported once per session, after the tests are collected and selected, when a
selected test asks for it (its import takes seconds, most of this tier's fixed cost on a GPU
machine: it belongs to the session, not to the first test's setup), or else by the session
fixture ``sglang`` itself. The import first defines the torchvision schemas a CPU machine lacks
(``cpu_import``); when it fails, every test of this directory skips with the error as its
reason (or fails, when ``DSV41_KERNELS_REQUIRE_SGLANG`` is set, as in ``.ci/run``). The
``plugin`` fixture then has SGLang's own ``load_plugins()`` run, which finds this package
through its entry point (the package must be installed: ``pip install -e .``).
"""

from __future__ import annotations

import contextlib
import os

import pytest

from test.sglang.cpu_import import import_sglang

REQUIRE_ENV = "DSV41_KERNELS_REQUIRE_SGLANG"

_loaded: dict[str, object] = {}  # "sglang", "plugins": each step's result, or the error it raised


def _load_sglang():
    """SGLang and its plugins loaded, once: the module, or the exception its import raised."""
    if "sglang" not in _loaded:
        try:
            _loaded["sglang"] = import_sglang()
        except Exception as e:  # ImportError, or whatever a half-installed SGLang raises
            _loaded["sglang"] = e
    return _loaded["sglang"]


def _load_plugins() -> None:
    """SGLang's plugin loader run once, with every call site switched on (raises what it
    raised, every time)."""
    if "plugins" not in _loaded:
        os.environ.pop("DSV41_KERNELS_DISABLE", None)
        os.environ["SGLANG_PLUGINS"] = "dsv41_kernels"  # other installed plugins stay out
        from sglang.srt.plugins import load_plugins

        try:
            _loaded["plugins"] = load_plugins()
        except Exception as e:
            _loaded["plugins"] = e
    if isinstance(_loaded["plugins"], Exception):
        raise _loaded["plugins"]


def pytest_collection_finish(session):
    """Load SGLang and the plugin before the first test when a selected test uses them."""
    if session.config.option.collectonly:
        return
    needs = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    if "sglang" in needs and not isinstance(_load_sglang(), Exception) and "plugin" in needs:
        # An error is raised again by the plugin fixture, in the tests that use it.
        with contextlib.suppress(Exception):
            _load_plugins()


@pytest.fixture(scope="session")
def sglang():
    sglang = _load_sglang()
    if isinstance(sglang, Exception):
        reason = f"sglang is not importable here ({type(sglang).__name__}: {sglang})"
        # CI installs SGLang and sets this, so a broken install fails there instead of skipping.
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{reason}; {REQUIRE_ENV} is set")
        pytest.skip(reason)
    return sglang


@pytest.fixture(scope="session")
def plugin(sglang):
    """SGLang's plugin loader run once for the session, with every call site switched on."""
    _load_plugins()
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


@pytest.fixture
def on_gpu(monkeypatch, tmp_path):
    """``on_gpu(machine=H200, policy=None)``: every tensor a hook sees counts as on CUDA device
    0 of ``machine``; ``policy`` (a JSON object, or None: the user cache left empty and the
    built-in policies) is the one looked up. Returns the policy module."""
    import json

    from dsv41_kernels.sglang_plugin import policy as module
    from test.sglang.policies import H200

    def fake(machine=H200, policy=None):
        monkeypatch.setattr(module, "device_of", lambda t: 0)
        monkeypatch.setattr(module, "machine_key", lambda index: dict(machine))
        monkeypatch.setattr(module, "USER_DIR", tmp_path / "cache")
        monkeypatch.delenv(module.POLICY_ENV, raising=False)
        if policy is not None:
            path = tmp_path / "policy.json"
            path.write_text(json.dumps(policy))
            monkeypatch.setenv(module.POLICY_ENV, str(path))
        module.for_device.cache_clear()
        return module

    monkeypatch.delenv("DSV41_KERNELS_FORCE", raising=False)
    yield fake
    module.for_device.cache_clear()
