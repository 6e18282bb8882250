"""The ``hc_boundary`` hook inside SGLang 0.5.23's own chain: ``run_attn_post`` (the post of a
DeepSeek-V4.1 attention sublayer, as ``HcReadCall.update_and_read`` calls it with the consumer's
``HcNextBoundary``), then the consumer's ``combine`` and the next post with the precomputed
statistics. CPU: the hook is on the call site and declines; GPU (the H200): it fires, SGLang's
post bit for bit, the statistics and the normed rows our unfused ops' bits."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dsv41_kernels.cases.common import bit_mismatches
from test.sglang import callers

HOOK = "hc_boundary._post_fusion"
POST_COMBINE_NORM_HOOK = "hc_post_combine_norm._post_fusion"
SITE = "hc_post_combine_norm"


def chain(layer, y, y2, residual, *, ours: bool, stream=None):
    """attn post (-> ffn's input and stats) -> ffn combine -> ffn post with them: SGLang's chain,
    with our hooks (``ours``) or without; ``stream``: SGLang's stats stream, forked before each
    post's statistics as its layers fork it. Returns (updated, x, stats, residual out)."""
    from sglang.srt.models import deepseek_v4_mhc as mhc

    def run():
        boundary = mhc.make_boundary(
            layer.post_attention_layernorm, accepts_mxfp8=False, hc=layer.ffn_hc
        )
        mhc.fork_stats_stream(stream)
        first = mhc.run_attn_post(
            layer.attn_hc, y, residual, stats_stream=stream, next=boundary, world_size=1,
            precomputed=None,
        )  # fmt: skip
        stats = first.stats
        mhc.fork_stats_stream(stream)
        x = mhc.combine(layer.ffn_hc, first)
        updated = first.streams
        last = mhc.run_attn_post(
            layer.ffn_hc, y2, updated, stats_stream=stream, next=None, world_size=1,
            precomputed=stats,
        )  # fmt: skip
        return updated, x, stats, last.streams

    if ours:
        return run()
    with callers.sglang_functions(mhc):
        return run()


def inputs(rows, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn(rows, callers.HIDDEN, generator=gen).bfloat16().to(device)
    y2 = torch.randn(rows, callers.HIDDEN, generator=gen).bfloat16().to(device)
    residual = torch.randn(rows, 4, callers.HIDDEN, generator=gen).bfloat16().to(device)
    return y, y2, residual


@pytest.fixture
def cpu_layer(plugin):
    return callers.v41_decoder_layer(torch.Generator().manual_seed(0), "cpu")


def test_hook_is_on_the_call_site_and_declines_off_cuda(
    cpu_layer, fired, monkeypatch, sglang_torch_sinkhorn
):
    from sglang.srt.environ import envs

    monkeypatch.setenv("DSV41_KERNELS_FORCE", "hc_boundary")
    y, y2, residual = inputs(6, "cpu")
    # SGLang's torch post on CPU; a later CPU step of its chain may fail, after the hook ran.
    with envs.SGLANG_OPT_USE_TILELANG_MHC_POST.override(False), contextlib.suppress(Exception):
        chain(cpu_layer, y, y2, residual, ours=True)
    counts = fired().get(HOOK)
    assert counts is not None and counts["ours"] == 0, counts
    reasons = list(counts["sglang"])
    # Off SM90/Blackwell SGLang's post is its torch composition, which rounds another way.
    assert any("not the split-H fma chain" in reason for reason in reasons), reasons


def triplet_and_boundary(layer, rows: int):
    """A (pre, post, comb) triplet as the statistics give it, and the attention post's
    ``HcNextBoundary`` (the FFN hyper-connection and its norm)."""
    from sglang.srt.models import deepseek_v4_mhc as mhc

    gen = torch.Generator().manual_seed(9)
    post = 2 * torch.rand(rows, 4, generator=gen)
    comb = torch.rand(rows, 4, 4, generator=gen)
    triplet = (torch.rand(rows, 4, generator=gen) + 0.1, post, comb / comb.sum(1, keepdim=True))
    norm = layer.post_attention_layernorm
    return triplet, mhc.make_boundary(norm, accepts_mxfp8=False, hc=layer.ffn_hc)


@pytest.mark.parametrize("post_name", ["run_attn_post", "run_moe_post"])
def test_with_sglangs_stats_stream_the_boundary_leaves_the_statistics_out(
    cpu_layer, fired, post_name
):
    """Given SGLang's stats stream (a decode-like step), the statistics run beside the sublayer
    in SGLang: the hook offers the boundary without them (hc_post_combine_norm, counted apart)
    and never the fused one; without the stream, the fused one. Both posts that reach
    ``_post_fusion`` report their stream (the MoE one with an already reduced output, as its
    caller passes it off the collective kernels). Off SM90 SGLang's post rounds another way, so
    both decline here and SGLang's plain post runs."""
    from sglang.srt.environ import envs
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from dsv41_kernels.sglang_plugin import dispatch

    y, _, residual = inputs(6, "cpu")
    triplet, boundary = triplet_and_boundary(cpu_layer, 6)
    with envs.SGLANG_OPT_USE_TILELANG_MHC_POST.override(False):
        for stream, name in ((object(), POST_COMBINE_NORM_HOOK), (None, HOOK)):
            state = getattr(mhc, post_name)(
                cpu_layer.attn_hc, y, residual, stats_stream=stream, next=boundary,
                world_size=1, precomputed=triplet,
            )  # fmt: skip
            assert state.input is None and state.stats is None  # SGLang's plain post
            counts = fired()
            assert set(counts) & {HOOK, POST_COMBINE_NORM_HOOK} == {name}, counts
            assert counts[name]["ours"] == 0
            assert any("not the split-H fma chain" in r for r in counts[name]["sglang"]), counts
            dispatch.reset()


def test_post_combine_norm_admission_on_a_pretend_h200(cpu_layer, on_gpu, monkeypatch):
    """On an SM90 with SGLang's defaults the boundary without statistics is admitted (forced,
    under a policy that has not measured it) in hc_combine_norm's launch shape; it declines,
    each with its reason, where hc_combine_norm would not run, where no policy measured it, and
    where the seam is closed."""
    import types

    import dsv41_kernels.sglang_plugin as plugin_module
    from dsv41_kernels.sglang_plugin import hc_boundary as hook
    from dsv41_kernels.sglang_plugin.policy import SITE_SWITCH
    from test.machine import on_cuda, pretend_arch
    from test.sglang import policies

    every_row = {"series": [policies.series([(0, None)])]}
    # An H200 policy that has measured every site but this one.
    on_gpu(policy=policies.policy(sites={s: every_row for s in SITE_SWITCH if s != SITE}))
    pretend_arch(9, monkeypatch.setattr)
    platform = types.SimpleNamespace(is_blackwell=False, is_sm90=True)
    monkeypatch.setattr(hook, "get_platform", lambda: platform)
    y, _, residual = (on_cuda(t) for t in inputs(6, "cpu"))
    triplet, boundary = triplet_and_boundary(cpu_layer, 6)
    norm = boundary.norm
    fake = types.SimpleNamespace(
        weight=on_cuda(norm.weight.data), variance_epsilon=norm.variance_epsilon,
        cast_x_before_out_mul=False, variance_size_override=None,
    )  # fmt: skip
    boundary = boundary._replace(norm=fake, hc=boundary.hc._replace(norm=fake))
    admit = lambda next=boundary: hook.post_combine_norm_admission(
        cpu_layer.attn_hc, y, residual, tuple(on_cuda(t) for t in triplet), next
    )
    assert "not measured" in admit().reason
    monkeypatch.setenv("DSV41_KERNELS_FORCE", "hc_boundary")
    verdict = admit()
    assert verdict and verdict.kernel == "cuda cluster", verdict.reason
    assert verdict.plan.cuda == (4, 160)
    installed = plugin_module.status()
    off = {**installed, "hc_combine_norm": "off (DSV41_KERNELS_DISABLE)"}
    monkeypatch.setattr(plugin_module, "_registered", off)
    assert "hc_combine_norm switched off" in admit().reason
    monkeypatch.setattr(plugin_module, "_registered", installed)
    assert "seam is closed" in admit(None).reason


def test_post_rule_follows_sglangs_dispatch(plugin, monkeypatch):
    """Ours reproduces SGLang's split-H post: on Blackwell (which takes it first) up to 384 rows,
    and on SM90 with the TileLang post on and FlashInfer's off (their defaults) up to 384 (split-H
    to 64, the TileLang post with its bits above); not otherwise."""
    import types

    from sglang.srt.environ import envs

    from dsv41_kernels.sglang_plugin import hc_boundary as hook

    cfg = callers.v41_decoder_layer(torch.Generator().manual_seed(0), "cpu").attn_hc.cfg
    split_h = hook.sglang_post_is_split_h
    platform = lambda **kw: types.SimpleNamespace(**{"is_blackwell": False, "is_sm90": False, **kw})
    monkeypatch.setattr(hook, "get_platform", lambda: platform(is_sm90=True))
    with envs.SGLANG_OPT_USE_TILELANG_MHC_POST.override(True):
        assert split_h(cfg, 1) and split_h(cfg, 64) and split_h(cfg, 384)
        assert not split_h(cfg, 0) and not split_h(cfg, 385)
        with envs.SGLANG_OPT_USE_FLASHINFER_MHC.override(True):
            assert not split_h(cfg, 6)
    with envs.SGLANG_OPT_USE_TILELANG_MHC_POST.override(False):
        assert not split_h(cfg, 6)
        monkeypatch.setattr(hook, "get_platform", lambda: platform(is_blackwell=True))
        assert split_h(cfg, 6) and split_h(cfg, 384) and not split_h(cfg, 385)
    monkeypatch.setattr(hook, "get_platform", lambda: platform())
    assert not split_h(cfg, 6)


def test_declines_where_our_statistics_or_combine_would_not_run(plugin, monkeypatch):
    """The fused boundary produces our hc_mix_stats and hc_combine_norm bits: it declines where
    either would not run at an unfused seam (switched off, off after an error)."""
    import dsv41_kernels.sglang_plugin as plugin_module
    from dsv41_kernels.sglang_plugin import dispatch
    from dsv41_kernels.sglang_plugin import hc_boundary as hook

    rows = torch.zeros(6, 4, 8)
    assert hook.parts_refusal(rows) is None
    installed = plugin_module.status()
    off = {**installed, "hc_combine_norm": "off (DSV41_KERNELS_DISABLE)"}
    monkeypatch.setattr(plugin_module, "_registered", off)  # as install() leaves it then
    assert "hc_combine_norm switched off" in hook.parts_refusal(rows).reason
    monkeypatch.setattr(plugin_module, "_registered", installed)
    monkeypatch.setitem(dispatch._failed, "hc_mix_stats._mix_stats_impl", "RuntimeError: x")
    assert "hc_mix_stats is off after an error" in hook.parts_refusal(rows).reason


def test_the_overlap_mark_is_reset_when_the_post_raises(plugin):
    from dsv41_kernels.sglang_plugin import posts

    def raising(*args, **kwargs):
        assert posts.stats_beside_sublayer()
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        posts.post_hook(raising, stats_stream=object())
    assert not posts.stats_beside_sublayer()


@pytest.fixture
def gpu_layer(plugin):
    if not torch.cuda.is_available():
        pytest.skip("gpu tier: no CUDA device on this machine")
    return callers.v41_decoder_layer(torch.Generator().manual_seed(1), "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 6, 24, 48, 64])
def test_boundary_in_sglangs_chain(gpu_layer, fired, monkeypatch, rows):
    from dsv41_kernels.ops.mhc.hc_combine_norm import hc_combine_norm
    from dsv41_kernels.ops.mhc.hc_mix_stats import hc_mix_stats
    from dsv41_kernels.reference.hc_mix_stats import hc_mix_stats as reference

    monkeypatch.setenv("DSV41_KERNELS_FORCE", "hc_boundary,hc_mix_stats,hc_combine_norm")
    y, y2, residual = inputs(rows, "cuda", seed=rows)
    updated, x, stats, out = chain(gpu_layer, y, y2, residual, ours=True)
    counts = fired()[HOOK]
    assert counts == {"ours": 1, "sglang": {"the seam is closed (last layer or Engram): no next "
                                            "sublayer": 1}}, counts  # fmt: skip
    # The second post took the fused boundary's statistics: only the first computed its own.
    assert fired()["hc_mix_stats._mix_stats_impl"] == {"ours": 1, "sglang": {}}
    from sglang.srt.models import deepseek_v4_mhc as mhc

    # SGLang's own post on the same triplet (ours: our statistics hook made it), bit for bit.
    attn_pre, attn_post, attn_comb = mhc.mix_stats(gpu_layer.attn_hc, residual)
    theirs, why = callers.run_sglang(
        lambda: mhc.post(gpu_layer.attn_hc.cfg, y, residual, attn_post, attn_comb)
    )
    if why is not None:
        pytest.skip(f"SGLang's own post does not run here ({why})")
    assert bit_mismatches(updated, theirs) == 0
    ffn = gpu_layer.ffn_hc
    flat = updated.flatten(1)
    for a, b in zip(stats, hc_mix_stats(flat, ffn.fn, ffn.scale, ffn.base), strict=True):
        assert bit_mismatches(a, b) == 0
    ref = reference(updated, ffn.fn, ffn.scale, ffn.base, iters=20, eps=1e-6, rms_eps=1e-6)
    for a, b in zip(stats, ref, strict=True):
        assert (a.double() - b).abs().max() < 1e-5
    weight, eps = ffn.norm.weight, ffn.norm.variance_epsilon
    assert bit_mismatches(x, hc_combine_norm(flat, attn_pre, weight, eps)) == 0
    ref_x = callers.combine_norm_float64(updated, attn_pre, weight, eps)
    assert callers.bf16_ulp_error(x, ref_x) <= 1
    assert out.shape == residual.shape


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 6, 64])
def test_boundary_without_statistics_in_sglangs_chain(gpu_layer, fired, monkeypatch, rows):
    """With SGLang's stats stream: the first post takes hc_post_combine_norm (the second finds
    the seam closed), each post's statistics run on the stream (our hc_mix_stats, twice), the
    updated streams are SGLang's post of the same triplet bit for bit, and the normed rows our
    hc_combine_norm's of them."""
    from dsv41_kernels.ops.mhc.hc_combine_norm import hc_combine_norm

    monkeypatch.setenv("DSV41_KERNELS_FORCE", "hc_boundary,hc_mix_stats,hc_combine_norm")
    y, y2, residual = inputs(rows, "cuda", seed=rows)
    stream = torch.cuda.Stream()
    updated, x, stats, out = chain(gpu_layer, y, y2, residual, ours=True, stream=stream)
    torch.cuda.synchronize()
    counts = fired()
    closed = "the seam is closed (last layer or Engram): no next sublayer"
    assert counts[POST_COMBINE_NORM_HOOK] == {"ours": 1, "sglang": {closed: 1}}, counts
    assert HOOK not in counts and stats is None
    assert counts["hc_mix_stats._mix_stats_impl"] == {"ours": 2, "sglang": {}}
    from sglang.srt.models import deepseek_v4_mhc as mhc

    attn_pre, attn_post, attn_comb = mhc.mix_stats(gpu_layer.attn_hc, residual)
    ffn = gpu_layer.ffn_hc
    weight, eps = ffn.norm.weight, ffn.norm.variance_epsilon
    assert bit_mismatches(x, hc_combine_norm(updated.flatten(1), attn_pre, weight, eps)) == 0
    # SGLang's own post of the same triplet (ours: our statistics hook made it), bit for bit.
    post, why = callers.run_sglang(
        lambda: mhc.post(gpu_layer.attn_hc.cfg, y, residual, attn_post, attn_comb)
    )
    if why is not None:
        pytest.skip(f"SGLang's own post does not run here ({why})")
    assert bit_mismatches(updated, post) == 0
    assert out.shape == residual.shape
