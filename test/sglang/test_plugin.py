"""The plugin's wiring in the real SGLang: entry point, targets, dispatch, switches, report."""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys

import pytest

SITE_TARGETS = {
    "accept": (
        "sglang.kernels.ops.speculative.dspark.dspark_accept._row_argmax",
        "sglang.kernels.ops.speculative.dspark.dspark_accept.accept_greedy",
        "sglang.kernels.ops.speculative.dspark.dspark_accept.accept_greedy_triton",
    ),
    "router": ("sglang.srt.multimodal.dsv41.vl_routing.vision_topk",),
    "combine": ("sglang.srt.models.deepseek_v4_mhc._combine",),
    "sched": (
        "sglang.srt.layers.attention.deepseek_v4_backend._maybe_precompute_flashmla_sched_meta",
    ),
    "mhc": (
        "sglang.srt.models.deepseek_v4_mhc._mix_stats_impl",
        "sglang.srt.models.deepseek_v4.DeepseekV4DecoderLayerBase.refresh_mhc_norm_weight_cache",
    ),
    "wo_a": (
        "sglang.srt.models.deepseek_v4.MQALayer.forward",
        "sglang.srt.models.deepseek_v4.fused_rope_inplace",
        "sglang.srt.models.deepseek_v4.sglang_per_token_group_quant_fp8",
    ),
    "verify_gather": (
        "sglang.srt.speculative.dspark_components.dspark_worker_v2.DSparkWorkerV2.__init__",
        "sglang.srt.layers.logits_processor.LogitsProcessor._get_logits",
        "sglang.srt.distributed.device_communicators.triton_symm_mem_ag.MultimemAllGatherer."
        "__call__",
        "sglang.srt.speculative.dspark_components.dspark_verify.TargetVerifyExecutor."
        "_forward_prepared_verify",
    ),
}


@contextlib.contextmanager
def fresh_registry():
    """SGLang's HookRegistry emptied for a ``install()`` call, then restored as it was."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    saved = {target: list(hooks) for target, hooks in HookRegistry._hooks.items()}
    HookRegistry._hooks.clear()
    try:
        yield HookRegistry._hooks
    finally:
        HookRegistry._hooks.clear()
        HookRegistry._hooks.update(saved)


def test_entry_point_loaded_by_sglang(plugin):
    from importlib.metadata import entry_points

    names = {ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert "dsv41_kernels.sglang_plugin:register" in names
    assert plugin.status() == {switch: "on" for switch in plugin.SWITCHES}


def test_every_target_resolves_and_is_patched(plugin):
    from sglang.srt.plugins.hook_registry import HookRegistry

    targets = [t for site in SITE_TARGETS.values() for t in site]
    assert plugin.unresolved(targets) == []
    for site in plugin.SITES:
        hooks = importlib.import_module(site.module)
        assert {t for t, _, _ in hooks.HOOKS} == set(SITE_TARGETS[site.switch])
        assert plugin.unresolved(hooks.REQUIRES) == []
    assert set(targets) <= HookRegistry._patched


def test_call_sites_bind_our_hooks(plugin):
    """The patched functions wrap ours, including the by-name imports of other modules that
    SGLang's registry rewrites (the verify epilogue's ``_row_argmax``, the model's router)."""
    from sglang.kernels.ops.attention.dsv4 import norm_rope
    from sglang.kernels.ops.quantization import fp8_kernel
    from sglang.kernels.ops.speculative.dspark import dspark_accept
    from sglang.srt.models import deepseek_v2, deepseek_v4, deepseek_v4_mhc
    from sglang.srt.multimodal.dsv41 import vl_routing
    from sglang.srt.speculative.dspark_components import dspark_verify

    for fn in (
        dspark_accept._row_argmax,
        dspark_accept.accept_greedy,
        dspark_accept.accept_greedy_triton,
        vl_routing.vision_topk,
        deepseek_v4_mhc._combine,
        deepseek_v4_mhc._mix_stats_impl,
        deepseek_v4.MQALayer.forward,
        deepseek_v4.fused_rope_inplace,
        deepseek_v4.sglang_per_token_group_quant_fp8,
    ):
        assert hasattr(fn, "__wrapped__"), fn
    # The attention output's two functions are rewritten where they are defined too.
    assert norm_rope.fused_rope_inplace is deepseek_v4.fused_rope_inplace
    quantizer = deepseek_v4.sglang_per_token_group_quant_fp8
    assert fp8_kernel.sglang_per_token_group_quant_fp8 is quantizer
    assert dspark_verify._row_argmax is dspark_accept._row_argmax
    assert deepseek_v2.vision_topk is vl_routing.vision_topk
    mega_moe = sys.modules.get("sglang.srt.layers.moe.mega_moe")
    if mega_moe is not None:
        assert mega_moe.vision_topk is vl_routing.vision_topk


@pytest.mark.parametrize(
    "value, off",
    [
        ("", set()),
        ("accept", {"accept"}),
        ("router, sched", {"router", "sched"}),
        ("COMBINE,mhc", {"combine", "mhc"}),
        ("wo_a", {"wo_a"}),
        ("all", set(SITE_TARGETS)),
    ],
)
def test_switches(plugin, value, off):
    with fresh_registry() as registered:
        status = plugin.install({"DSV41_KERNELS_DISABLE": value})
        registered_targets = set(registered)
    for switch, targets in SITE_TARGETS.items():
        if switch in off:
            assert status[switch] == "off (DSV41_KERNELS_DISABLE)"
            assert not registered_targets & set(targets)
        else:
            assert status[switch] == "on"
            assert set(targets) <= registered_targets


def test_startup_report_one_line(plugin, caplog):
    with fresh_registry(), caplog.at_level(logging.INFO, logger=plugin.__name__):
        plugin.install({"DSV41_KERNELS_DISABLE": "sched,bogus"})
    lines = [r.getMessage() for r in caplog.records if r.name == plugin.__name__]
    assert len(lines) == 1
    line = lines[0]
    assert "dsv41-kernels" in line and "sglang 0.5.23" in line
    assert "on: accept, router, combine, mhc, wo_a, verify_gather;" in line
    assert "off: sched (DSV41_KERNELS_DISABLE)" in line
    assert "ignored unknown DSV41_KERNELS_DISABLE names: bogus" in line


def test_missing_target_is_reported_and_left_alone(plugin, monkeypatch, caplog):
    """A target absent from the installed SGLang turns its call site off, logs why, and
    registers nothing for it; the other call sites are unaffected and nothing raises."""
    from dsv41_kernels.sglang_plugin import router

    missing = "sglang.srt.multimodal.dsv41.vl_routing.vision_topk_renamed_later"
    monkeypatch.setattr(router, "HOOKS", ((missing, router.vision_topk_hook, None),))
    with fresh_registry() as registered, caplog.at_level(logging.INFO, logger=plugin.__name__):
        status = plugin.install({})
        registered_targets = set(registered)
    assert status["router"].startswith("off (missing in this SGLang: ")
    assert missing in status["router"] and "AttributeError" in status["router"]
    assert not any("vl_routing" in t for t in registered_targets)
    assert all(status[s] == "on" for s in SITE_TARGETS if s != "router")
    assert missing in caplog.text


def test_site_that_cannot_import_is_off(plugin, monkeypatch):
    sites = (plugin.Site("accept", "dsv41_kernels.sglang_plugin.no_such_module", "x"),)
    monkeypatch.setattr(plugin, "SITES", sites)
    with fresh_registry() as registered:
        status = plugin.install({})
        assert not registered
    assert status["accept"].startswith("off (cannot import its SGLang names: ")


def test_disable_parsing(plugin):
    assert plugin.disabled_switches("") == (frozenset(), ())
    assert plugin.disabled_switches(" all ,x") == (frozenset(plugin.SWITCHES), ("x",))
    assert plugin.disabled_switches("mhc,,accept") == (frozenset({"mhc", "accept"}), ())


# ---------------------------------------------------------------------------------------------
# What a server process shows: the start-up line, the fire counts at exit

_SERVER_START = """
from test.sglang.cpu_import import define_torchvision_schemas
define_torchvision_schemas()
from sglang.srt.plugins import load_plugins  # what every SGLang process runs first
load_plugins()
import torch
from sglang.kernels.ops.speculative.dspark import dspark_accept
dspark_accept._row_argmax(torch.randn(2, 4099))
dspark_accept._row_argmax(torch.randn(2, 100))
"""


def run_server_start(plugin, **env):
    import os
    import subprocess

    environ = {
        **os.environ,
        "SGLANG_PLUGINS": "dsv41_kernels",
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, (os.getcwd(), os.environ.get("PYTHONPATH")))),
        **env,
    }
    environ.pop("DSV41_KERNELS_DISABLE", None)
    done = subprocess.run(
        [sys.executable, "-c", _SERVER_START],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def test_startup_report_reaches_a_process_without_logging(plugin):
    """SGLang loads plugins before it configures logging; the line still shows, once."""
    stderr = run_server_start(plugin)
    lines = [line for line in stderr.splitlines() if line.startswith("dsv41-kernels 0.1.0 on")]
    assert len(lines) == 1, stderr[-2000:]
    assert "on: accept, router, combine, sched, mhc, wo_a, verify_gather; off: -" in lines[0]
    assert "fire counts" not in stderr  # only with DSV41_KERNELS_REPORT=1


def test_exit_report_prints_fire_counts(plugin):
    import json

    stderr = run_server_start(plugin, DSV41_KERNELS_REPORT="1")
    prefix = "dsv41-kernels fire counts:"
    (line,) = [line for line in stderr.splitlines() if line.startswith(prefix)]
    counts = json.loads(line.split(":", 1)[1])
    assert counts["accept._row_argmax"]["ours"] == 1
    (reason,) = counts["accept._row_argmax"]["sglang"]  # 100 columns: below the kernel's minimum
    assert counts["accept._row_argmax"]["sglang"][reason] == 1


# ---------------------------------------------------------------------------------------------
# A hook whose op raises hands the call to SGLang and stays off


def test_failing_op_falls_back_once_and_stays_off(plugin, fired, monkeypatch, caplog):
    import torch
    from sglang.kernels.ops.speculative.dspark import dspark_accept

    from dsv41_kernels.sglang_plugin import accept, failed_hooks

    def broken(logits, **_):
        raise RuntimeError("injected")

    monkeypatch.setattr(accept, "row_argmax", broken)
    logits = torch.randn(3, 4099)
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        for _ in range(3):
            assert torch.equal(dspark_accept._row_argmax(logits), torch.argmax(logits, -1))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "accept._row_argmax" in warnings[0].getMessage()
    assert failed_hooks() == {"accept._row_argmax": "RuntimeError: injected"}
    assert fired()["accept._row_argmax"] == {
        "ours": 0,
        "sglang": {
            "error: RuntimeError: injected": 1,
            "off after an error: RuntimeError: injected": 2,
        },
    }


def test_replicated_hooks_raise_on_a_multi_rank_run(
    plugin, fired, monkeypatch, sglang_torch_sinkhorn
):
    """combine and mhc feed the residual streams every rank holds a copy of: on one of several
    ranks an error of ours is raised, not answered with SGLang's (other) bits; alone, the
    process falls back as every hook does."""
    import torch
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from dsv41_kernels.sglang_plugin import combine, dispatch
    from dsv41_kernels.sglang_plugin import mhc as mhc_hook
    from test.sglang import callers

    def broken(*_, **__):
        raise RuntimeError("injected")

    monkeypatch.setattr(combine, "hc_combine_norm", broken)
    monkeypatch.setattr(mhc_hook, "hc_mix_stats", broken)
    hc = callers.v41_decoder_layer(torch.Generator().manual_seed(3), "cpu", hidden=64).attn_hc
    x = torch.randn(3, 4, 64).bfloat16()
    pre = torch.rand(3, 4) + 0.1
    calls = (lambda: mhc.combine(hc, mhc.HcState(x, pre)), lambda: mhc.mix_stats(hc, x))
    monkeypatch.setattr(dispatch, "ranks", lambda: 4)
    for call in calls:
        with pytest.raises(RuntimeError, match="injected"):
            call()
    monkeypatch.setattr(dispatch, "ranks", lambda: 1)
    for call in calls:
        call()  # SGLang's function
    counts = fired()
    for hook in ("combine._combine", "mhc._mix_stats_impl"):
        assert counts[hook]["ours"] == 0
        assert counts[hook]["sglang"] == {
            "raised on 1 of 4 ranks: RuntimeError: injected": 1,
            "error: RuntimeError: injected": 1,
        }
