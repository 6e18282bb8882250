"""The plugin's wiring in the real SGLang: entry point, targets, dispatch, switches, report."""

from __future__ import annotations

import contextlib
import importlib
import logging
import pathlib
import re
import sys

import pytest

SITE_TARGETS = {
    "accept_greedy": (
        "sglang.kernels.ops.speculative.dspark.dspark_accept._row_argmax",
        "sglang.kernels.ops.speculative.dspark.dspark_accept.accept_greedy",
        "sglang.kernels.ops.speculative.dspark.dspark_accept.accept_greedy_triton",
    ),
    "moe_fused_gate": ("sglang.srt.multimodal.dsv41.vl_routing.vision_topk",),
    "hc_combine_norm": (
        "sglang.srt.models.deepseek_v4_mhc._combine",
        "sglang.srt.models.deepseek_v4_mhc.run_attn_post",  # shared with hc_boundary
        "sglang.srt.models.deepseek_v4_mhc.run_moe_post",
        "sglang.srt.models.deepseek_v4_mhc.post",
        "sglang.srt.models.deepseek_v4.sglang_per_token_group_quant_fp8",
    ),
    "decoding_sched_meta": (
        "sglang.srt.layers.attention.deepseek_v4_backend._maybe_precompute_flashmla_sched_meta",
    ),
    "hc_mix_stats": (
        "sglang.srt.models.deepseek_v4_mhc._mix_stats_impl",
        "sglang.srt.models.deepseek_v4.DeepseekV4DecoderLayerBase.refresh_mhc_norm_weight_cache",
    ),
    "inverse_rope_quant_fp8": (
        "sglang.srt.models.deepseek_v4.MQALayer.forward",
        "sglang.srt.models.deepseek_v4.fused_rope_inplace",
        "sglang.srt.models.deepseek_v4.sglang_per_token_group_quant_fp8",
    ),
    "hc_boundary": (
        "sglang.srt.models.deepseek_v4_mhc._post_fusion",
        "sglang.srt.models.deepseek_v4_mhc.run_attn_post",
        "sglang.srt.models.deepseek_v4_mhc.run_moe_post",
        "sglang.srt.models.deepseek_v4_mhc.post",
        "sglang.srt.models.deepseek_v4.sglang_per_token_group_quant_fp8",  # shared, registered once
    ),
    "hc_stats_stream": ("sglang.srt.models.deepseek_v4_mhc.use_stats_stream",),
    "rmsnorm_quant_fp8": (
        "sglang.srt.models.deepseek_v4.MQALayer._normalize_q_lora",
        "sglang.srt.layers.attention.dsv4.indexer.C4Indexer.compute_q",
    ),
    "accept_greedy_epilogue": (
        "sglang.srt.speculative.dspark_components.dspark_verify.DsparkVerifyEpilogue."
        "_accept_static_greedy",
    ),
    "sharded_accept_greedy": (
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
    from sglang.srt.layers.quantization import fp8_utils
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
    # and in every FP8 linear; the hook two sites share wraps SGLang's function once
    assert fp8_utils.sglang_per_token_group_quant_fp8 is quantizer
    assert not hasattr(quantizer.__wrapped__, "__wrapped__")
    assert dspark_verify._row_argmax is dspark_accept._row_argmax
    assert deepseek_v2.vision_topk is vl_routing.vision_topk
    mega_moe = sys.modules.get("sglang.srt.layers.moe.mega_moe")
    if mega_moe is not None:
        assert mega_moe.vision_topk is vl_routing.vision_topk


@pytest.mark.parametrize(
    "value, off",
    [
        ("", set()),
        ("accept_greedy", {"accept_greedy"}),
        ("moe_fused_gate, decoding_sched_meta", {"moe_fused_gate", "decoding_sched_meta"}),
        ("HC_COMBINE_NORM,hc_mix_stats", {"hc_combine_norm", "hc_mix_stats"}),
        ("inverse_rope_quant_fp8", {"inverse_rope_quant_fp8"}),
        ("hc_boundary", {"hc_boundary"}),  # the posts' hooks stay for hc_combine_norm
        ("sharded_accept_greedy", {"sharded_accept_greedy"}),
        ("all", set(SITE_TARGETS)),
        # the names the switches had before: aliases of the op names
        ("accept,router", {"accept_greedy", "moe_fused_gate"}),
        ("combine, SCHED,mhc", {"hc_combine_norm", "decoding_sched_meta", "hc_mix_stats"}),
        ("wo_a,verify_gather", {"inverse_rope_quant_fp8", "sharded_accept_greedy"}),
    ],
)
def test_switches(plugin, value, off):
    with fresh_registry() as registered:
        status = plugin.install({"DSV41_KERNELS_DISABLE": value})
        registered_targets = set(registered)
    on = {t for switch, targets in SITE_TARGETS.items() if switch not in off for t in targets}
    for switch, targets in SITE_TARGETS.items():
        if switch in off:
            assert status[switch] == "off (DSV41_KERNELS_DISABLE)"
            assert not registered_targets & (set(targets) - on)  # a shared hook stays for others
        else:
            assert status[switch] == "on"
            assert set(targets) <= registered_targets


def test_startup_report_one_line(plugin, caplog):
    with fresh_registry(), caplog.at_level(logging.INFO, logger=plugin.__name__):
        plugin.install({"DSV41_KERNELS_DISABLE": "decoding_sched_meta,bogus"})
    lines = [r.getMessage() for r in caplog.records if r.name == plugin.__name__]
    assert len(lines) == 1
    line = lines[0]
    assert "dsv41-kernels" in line and "sglang 0.5.23" in line
    on = "accept_greedy, moe_fused_gate, hc_combine_norm, hc_mix_stats, inverse_rope_quant_fp8"
    later = (
        "hc_boundary, hc_stats_stream, rmsnorm_quant_fp8, accept_greedy_epilogue, "
        "sharded_accept_greedy"
    )
    assert f"on: {on}, {later};" in line
    assert "off: decoding_sched_meta (DSV41_KERNELS_DISABLE)" in line
    assert "ignored unknown DSV41_KERNELS_DISABLE names: bogus" in line


def test_missing_target_is_reported_and_left_alone(plugin, monkeypatch, caplog):
    """A target absent from the installed SGLang turns its call site off, logs why, and
    registers nothing for it; the other call sites are unaffected and nothing raises."""
    from dsv41_kernels.sglang_plugin import moe_fused_gate as hooks

    missing = "sglang.srt.multimodal.dsv41.vl_routing.vision_topk_renamed_later"
    monkeypatch.setattr(hooks, "HOOKS", ((missing, hooks.vision_topk_hook, None),))
    with fresh_registry() as registered, caplog.at_level(logging.INFO, logger=plugin.__name__):
        status = plugin.install({})
        registered_targets = set(registered)
    assert status["moe_fused_gate"].startswith("off (missing in this SGLang: ")
    assert missing in status["moe_fused_gate"] and "AttributeError" in status["moe_fused_gate"]
    assert not any("vl_routing" in t for t in registered_targets)
    assert all(status[s] == "on" for s in SITE_TARGETS if s != "moe_fused_gate")
    assert missing in caplog.text


def test_site_that_cannot_import_is_off(plugin, monkeypatch):
    sites = (plugin.Site("accept_greedy", "dsv41_kernels.sglang_plugin.no_such_module", "x"),)
    monkeypatch.setattr(plugin, "SITES", sites)
    with fresh_registry() as registered:
        status = plugin.install({})
        assert not registered
    assert status["accept_greedy"].startswith("off (cannot import its SGLang names: ")


def test_disable_parsing(plugin):
    assert plugin.disabled_switches("") == (frozenset(), ())
    assert plugin.disabled_switches(" all ,x") == (frozenset(plugin.SWITCHES), ("x",))
    both = frozenset({"hc_mix_stats", "accept_greedy"})
    assert plugin.disabled_switches("hc_mix_stats,,accept_greedy") == (both, ())
    assert plugin.disabled_switches("mhc,,accept") == (both, ())  # the deprecated names


def test_deprecated_switch_names_warn_once(plugin, monkeypatch, caplog):
    """An old switch name is taken as its op's name, with one WARNING line per name and
    process, in DSV41_KERNELS_DISABLE and DSV41_KERNELS_FORCE alike."""
    from dsv41_kernels.sglang_plugin import switches

    monkeypatch.setattr(switches, "_deprecated_seen", set())
    switches.switch_names.cache_clear()
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        assert switches.forced("inverse_rope_quant_fp8", {"DSV41_KERNELS_FORCE": "wo_a"})
        assert switches.forced("inverse_rope_quant_fp8", {"DSV41_KERNELS_FORCE": "x, wo_a"})
        assert plugin.disabled_switches("wo_a,router") == (
            frozenset({"inverse_rope_quant_fp8", "moe_fused_gate"}),
            (),
        )
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 2, lines
    assert "'wo_a'" in lines[0] and "deprecated, use 'inverse_rope_quant_fp8'" in lines[0]
    assert "'router'" in lines[1] and "'moe_fused_gate'" in lines[1]
    switches.switch_names.cache_clear()


# ---------------------------------------------------------------------------------------------
# docs/sglang.md against the code

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "sglang.md"
HOOK_ROW = re.compile(r"^\| `(\w+)` \| (AROUND|AFTER|BEFORE|REPLACE) \| `([\w.]+)` \|$", re.M)


def test_startup_line_example_is_what_the_plugin_prints(plugin, monkeypatch):
    """The example in docs/sglang.md is the line a process with every call site on prints, on
    a machine without a GPU."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    text = DOCS.read_text()
    after = text.split("Each process that loads the plugin prints one line", 1)[1]
    example = after.split("```\n", 2)[1].strip()
    assert example == plugin.report_line({switch: "on" for switch in plugin.SWITCHES})


def test_docs_list_every_hook(plugin):
    """docs/sglang.md's table of hooks lists each registered hook, with its type, and no other."""
    listed = set(HOOK_ROW.findall(DOCS.read_text()))
    registered = {
        (site.switch, hook_type.name, target)
        for site in plugin.SITES
        for target, _, hook_type in importlib.import_module(site.module).HOOKS
    }
    assert listed == registered


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
    on = ", ".join(SITE_TARGETS)
    assert f"on: {on}; off: -" in lines[0]
    assert "fire counts" not in stderr  # only with DSV41_KERNELS_REPORT=1


def test_exit_report_prints_fire_counts(plugin):
    import json

    stderr = run_server_start(plugin, DSV41_KERNELS_REPORT="1")
    prefix = "dsv41-kernels fire counts:"
    (line,) = [line for line in stderr.splitlines() if line.startswith(prefix)]
    counts = json.loads(line.split(":", 1)[1])
    hook = counts["accept_greedy._row_argmax"]
    assert hook["ours"] == 1
    (reason,) = hook["sglang"]  # 100 columns: below the kernel's minimum
    assert hook["sglang"][reason] == 1


# ---------------------------------------------------------------------------------------------
# A hook whose op raises hands the call to SGLang and stays off


def test_failing_op_falls_back_once_and_stays_off(plugin, fired, monkeypatch, caplog):
    import torch
    from sglang.kernels.ops.speculative.dspark import dspark_accept

    from dsv41_kernels.sglang_plugin import accept_greedy as hooks
    from dsv41_kernels.sglang_plugin import failed_hooks

    def broken(logits, **_):
        raise RuntimeError("injected")

    monkeypatch.setattr(hooks, "row_argmax", broken)
    logits = torch.randn(3, 4099)
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        for _ in range(3):
            assert torch.equal(dspark_accept._row_argmax(logits), torch.argmax(logits, -1))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "accept_greedy._row_argmax" in warnings[0].getMessage()
    assert failed_hooks() == {"accept_greedy._row_argmax": "RuntimeError: injected"}
    assert fired()["accept_greedy._row_argmax"] == {
        "ours": 0,
        "sglang": {
            "error: RuntimeError: injected": 1,
            "off after an error: RuntimeError: injected": 2,
        },
    }


def test_error_after_a_capture_says_the_graphs_keep_ours(plugin, fired, monkeypatch, caplog):
    """A hook switched off by an error after a CUDA-graph capture took ours: the graphs captured
    before keep replaying ours while eager calls run SGLang's function from then on. The
    warning, failed_hooks() and the counts say so; a hook never captured says nothing of it."""
    import torch
    from sglang.kernels.ops.speculative.dspark import dspark_accept

    from dsv41_kernels.sglang_plugin import accept_greedy as hooks
    from dsv41_kernels.sglang_plugin import dispatch, failed_hooks

    logits = torch.randn(3, 4099)
    monkeypatch.setattr(dispatch, "_capturing", lambda: True)
    dspark_accept._row_argmax(logits)  # a graph capture takes ours
    monkeypatch.setattr(dispatch, "_capturing", lambda: False)

    def broken(*_, **__):
        raise RuntimeError("injected")

    monkeypatch.setattr(hooks, "row_argmax", broken)
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        for _ in range(2):
            assert torch.equal(dspark_accept._row_argmax(logits), torch.argmax(logits, -1))
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert dispatch.GRAPHS_KEEP_OURS in warning
    failure = f"RuntimeError: injected; {dispatch.GRAPHS_KEEP_OURS}"
    assert failed_hooks() == {"accept_greedy._row_argmax": failure}
    assert fired()["accept_greedy._row_argmax"] == {
        "ours": 1,
        "sglang": {f"error: {failure}": 1, f"off after an error: {failure}": 1},
    }


def test_replicated_hooks_raise_on_a_multi_rank_run(
    plugin, fired, monkeypatch, sglang_torch_sinkhorn
):
    """hc_combine_norm and hc_mix_stats feed the residual streams every rank holds a copy of,
    and every rank routes the same tokens with moe_fused_gate, their expert outputs summed
    across ranks: on one of several ranks an error of ours is raised, not answered with SGLang's
    (other) bits; alone, the process falls back as every hook does."""
    import torch
    from sglang.srt.models import deepseek_v2
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from dsv41_kernels.sglang_plugin import dispatch, hc_combine_norm, hc_mix_stats
    from dsv41_kernels.sglang_plugin import moe_fused_gate as router
    from test.sglang import callers

    def broken(*_, **__):
        raise RuntimeError("injected")

    monkeypatch.setattr(hc_combine_norm, "hc_combine_norm", broken)
    monkeypatch.setattr(hc_mix_stats, "hc_mix_stats", broken)
    monkeypatch.setattr(router, "moe_fused_gate", broken)
    monkeypatch.setenv("DSV41_KERNELS_FORCE", "moe_fused_gate")  # CPU: not measured, declined
    gen = torch.Generator().manual_seed(3)
    hc = callers.v41_decoder_layer(gen, "cpu", hidden=64).attn_hc
    x = torch.randn(3, 4, 64).bfloat16()
    pre = torch.rand(3, 4) + 0.1
    moe = callers.vision_moe(gen, "cpu", num_experts=64)
    input_ids = torch.full((5,), callers.IMAGE_TOKEN_ID)
    logits = torch.randn(5, 64, generator=gen)
    calls = (
        lambda: mhc.combine(hc, mhc.HcState(x, pre)),
        lambda: mhc.mix_stats(hc, x),
        lambda: deepseek_v2.vision_topk(moe, logits, input_ids),  # DeepseekV2MoE's binding
    )
    monkeypatch.setattr(dispatch, "ranks", lambda: 4)
    for call in calls:
        with pytest.raises(RuntimeError, match="injected"):
            call()
    monkeypatch.setattr(dispatch, "ranks", lambda: 1)
    for call in calls:
        call()  # SGLang's function
    counts = fired()
    for hook in (
        "hc_combine_norm._combine",
        "hc_mix_stats._mix_stats_impl",
        "moe_fused_gate.vision_topk",
    ):
        assert counts[hook]["ours"] == 0
        assert counts[hook]["sglang"] == {
            "raised on 1 of 4 ranks: RuntimeError: injected": 1,
            "error: RuntimeError: injected": 1,
        }, hook
