"""The ``hc_stats_stream`` hook inside SGLang 0.5.23's own caller: ``HcReadCall.read`` (a
DeepSeek-V4.1 sublayer's read, which asks ``use_stats_stream`` and hands the layer's stats
stream to the sublayer's post through its ``ReadState``). On a pretended SM90 a verify step
SGLang runs inline takes the stream where the hook is admitted; every other step keeps SGLang's
answer."""

from __future__ import annotations

import types

import pytest
import torch

from test.sglang import callers

HOOK = "hc_stats_stream.use_stats_stream"
SM90 = types.SimpleNamespace(is_sm90=True, is_sm100=False, is_blackwell=False)


@pytest.fixture
def read(plugin, monkeypatch):
    """``read(mode, rows)`` -> the ``ReadState.stats_stream`` of an FFN read of ``rows`` through
    SGLang's ``HcReadCall.read``, on a pretended SM90 (SGLang's rule and the hook's), the layer's
    stream a marker and its fork recorded instead of run (CPU)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.models import deepseek_v4_boundary as boundary
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from dsv41_kernels.sglang_plugin import hc_stats_stream as hook

    monkeypatch.setattr(mhc, "get_platform", lambda: SM90)
    monkeypatch.setattr(hook, "get_platform", lambda: SM90)
    forks = []
    monkeypatch.setattr(mhc, "fork_stats_stream", forks.append)
    layer = callers.v41_decoder_layer(torch.Generator().manual_seed(0), "cpu")
    layer.boundary_pre_from_prev = True
    layer.hc_stats_stream = "the layer's stats stream"

    def run(mode, rows):
        gen = torch.Generator().manual_seed(rows)
        residual = torch.randn(rows, 4, callers.HIDDEN, generator=gen).bfloat16()
        pre = torch.rand(rows, 4, generator=gen) + 0.1
        batch = types.SimpleNamespace(forward_mode=getattr(ForwardMode, mode))
        spec = boundary.HcRead(layer, False)
        x, state = spec.bind(batch, None).read(mhc.HcState(residual, pre), None)
        assert x.shape == (rows, callers.HIDDEN) and forks[-1] == state.stats_stream
        return state.stats_stream

    return run


def test_a_verify_step_takes_the_stream_where_admitted(read, fired, monkeypatch, on_gpu):
    # CPU tensors: no GPU policy decides, so the hook is admitted (it is off CUDA).
    assert read("TARGET_VERIFY", 6) == "the layer's stats stream"
    assert fired()[HOOK] == {"ours": 1, "sglang": {}}
    # Where SGLang gives the stream itself (one row, a decode of up to 64) the hook says nothing.
    assert read("TARGET_VERIFY", 1) == "the layer's stats stream"
    assert read("DECODE", 12) == "the layer's stats stream"
    assert fired()[HOOK] == {"ours": 1, "sglang": {}}


def test_other_steps_and_unmeasured_gpus_keep_sglangs_answer(read, fired, monkeypatch, on_gpu):
    import dsv41_kernels.sglang_plugin as plugin_module
    from dsv41_kernels.sglang_plugin import dispatch

    assert read("EXTEND", 6) is None
    assert read("DECODE", 65) is None
    counts = fired()[HOOK]
    assert counts["ours"] == 0 and counts["sglang"] == {"not a target-verify step": 2}, counts
    from test.sglang import policies

    # The tensors count as on an H200 whose policy takes the boundary without statistics.
    every_row = {"series": [policies.series([(0, None)])]}
    on_gpu(policy=policies.policy(sites={"hc_post_combine_norm": every_row}))
    dispatch.reset()
    assert read("TARGET_VERIFY", 6) is None
    assert list(fired()[HOOK]["sglang"])[0].startswith("hc_stats_stream not measured")
    monkeypatch.setenv("DSV41_KERNELS_FORCE", "hc_stats_stream")
    assert read("TARGET_VERIFY", 6) == "the layer's stats stream"
    # A policy without it: forcing the stream alone would displace the fused boundary.
    on_gpu(policy=policies.policy())
    monkeypatch.setenv("DSV41_KERNELS_FORCE", "hc_stats_stream")
    dispatch.reset()
    assert read("TARGET_VERIFY", 6) is None
    (reason,) = fired()[HOOK]["sglang"]
    assert reason.startswith("hc_post_combine_norm: ") and "not measured" in reason
    monkeypatch.setenv("DSV41_KERNELS_FORCE", "hc_stats_stream,hc_boundary")
    assert read("TARGET_VERIFY", 6) == "the layer's stats stream"
    installed = plugin_module.status()
    off = {**installed, "hc_boundary": "off (DSV41_KERNELS_DISABLE)"}
    monkeypatch.setattr(plugin_module, "_registered", off)
    dispatch.reset()
    assert read("TARGET_VERIFY", 6) is None
    assert list(fired()[HOOK]["sglang"]) == ["hc_boundary switched off (DSV41_KERNELS_DISABLE)"]


def test_off_sm90_sglangs_rule_stands(plugin, monkeypatch):
    from dsv41_kernels.sglang_plugin import hc_stats_stream as hook

    blackwell = types.SimpleNamespace(is_sm90=False, is_blackwell=True)
    monkeypatch.setattr(hook, "get_platform", lambda: blackwell)
    cfg = types.SimpleNamespace(pre_from_prev=True)
    batch = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_target_verify=lambda: True))
    verdict = hook.stats_stream_admission(cfg, batch, torch.zeros(6, 4, 8))
    assert not verdict and "not SM90" in verdict.reason
    lagless = hook.stats_stream_admission(types.SimpleNamespace(pre_from_prev=False), batch, None)
    assert not lagless and "pre_from_prev" in lagless.reason
