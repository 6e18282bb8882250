"""The device queries the ops' launch shapes and admissions ask (:mod:`dsv41_kernels.devices`)."""

import torch

from dsv41_kernels import devices


def test_dependent_launches_only_where_the_gpu_has_them(monkeypatch):
    """PDL on compiled kernels of sm_90+ NVIDIA GPUs only; one wave by the light-kernel bound."""
    assert not devices.dependent_launch(torch.device("cpu"))
    monkeypatch.setattr(devices, "device_capability", lambda index: (9, 0))
    monkeypatch.setattr("dsv41_kernels.interpreter.RUNS_IN_INTERPRETER", False)
    monkeypatch.setattr(torch.version, "hip", None)
    assert devices.dependent_launch("cuda:0")
    monkeypatch.setattr(devices, "device_capability", lambda index: (8, 0))
    assert not devices.dependent_launch("cuda:0")
    monkeypatch.setattr(devices, "multiprocessors", lambda index: 132)
    limit = devices.RESIDENT_WARPS_PER_SM * 132
    assert devices.one_wave(limit, 1, "cuda:0") and not devices.one_wave(limit + 1, 1, "cuda:0")
    assert devices.one_wave(limit // 4, 4, "cuda:0")
    assert not devices.one_wave(limit // 4 + 1, 4, "cuda:0")
