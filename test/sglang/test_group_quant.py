"""The FP8 groups a launch of ours writes for the next sublayer's block-FP8 linear (sites
``hc_boundary_quant_fp8``, the fused boundary; ``hc_post_combine_norm_quant_fp8``, the
boundary without statistics; ``hc_combine_norm_quant_fp8``, the combine at a seam the boundary
left unfused), taken by SGLang 0.5.23's own linear: on SM90
``deepgemm_w8a8_block_fp8_linear_with_fallback(act_scale_ue8m0=True)`` asks
``sglang_per_token_group_quant_fp8(x.view(-1, K), 32, scale_ue8m0=True)`` for its operands, and
the shared quantizer hook (``sglang_plugin.group_quant``) answers with the groups pinned to
those rows. CPU: a pretended SM90 linear gets pinned groups as its GEMM operands (each form's
own, from its fallback), every other call SGLang's quantizer, and the sites' admission. GPU
(the H200): SGLang's chain (post, combine, the linear) with the plugin on, with and without
SGLang's stats stream, and its combine alone, hands the GEMM SGLang's quantizer's bits of the
normed rows without launching it."""

from __future__ import annotations

import types

import pytest
import torch

from dsv41_kernels.cases.common import bit_mismatches
from dsv41_kernels.reference.rmsnorm_quant_fp8 import group_quant_ue8m0
from test.sglang import callers, policies

PINNED = "sglang_per_token_group_quant_fp8"
BOUNDARY_HOOK = "hc_boundary._post_fusion"
POST_COMBINE_NORM_HOOK = "hc_post_combine_norm._post_fusion"
COMBINE_HOOK = "hc_combine_norm._combine"
FORMS = {  # the form: its groups' policy site (their fire counts: <site>.PINNED), its switch
    "fused": ("hc_boundary_quant_fp8", "hc_boundary"),
    "without statistics": ("hc_post_combine_norm_quant_fp8", "hc_boundary"),
    "unfused seam": ("hc_combine_norm_quant_fp8", "hc_combine_norm"),
}
PINNED_HOOK = f"hc_boundary_quant_fp8.{PINNED}"
WQKV_A_OUT = 1792  # V4.1-Flash's fused wqkv_a: q_lora 1280 + kv 512


class DeepGemm:
    """SGLang's ``w8a8_block_fp8_matmul_deepgemm`` as a stand-in that records its operands (the
    GEMM is the same call in both arms; DeepGEMM does not run here)."""

    def __init__(self):
        self.operands = []

    def __call__(self, q, weight, scales, weight_scale, block_size, output_dtype):
        self.operands.append((q, scales))
        return torch.zeros(q.shape[0], weight.shape[0], dtype=output_dtype, device=q.device)


@pytest.fixture
def sm90_linear(plugin, monkeypatch):
    """SGLang's block-FP8 linear function, as SM90 runs it for V4.1's ``[32, 32]`` ue8m0
    checkpoint, with the GEMM recorded: ``linear(x)`` returns the operands it got."""
    from sglang.srt.layers.quantization import fp8_utils

    gemm = DeepGemm()
    monkeypatch.setattr(fp8_utils, "w8a8_block_fp8_matmul_deepgemm", gemm)
    monkeypatch.setattr(fp8_utils, "_deepgemm_block_fp8_supported", lambda *a: True)
    platform = types.SimpleNamespace(is_sm90=True, is_sm100=False, is_blackwell=False)
    monkeypatch.setattr(fp8_utils, "get_platform", lambda: platform)

    def linear(x):
        weight = torch.zeros(WQKV_A_OUT, x.shape[-1], dtype=torch.float8_e4m3fn, device=x.device)
        scale = torch.ones(WQKV_A_OUT // 32, x.shape[-1] // 32, device=x.device)
        fp8_utils.deepgemm_w8a8_block_fp8_linear_with_fallback(
            x, weight, [32, 32], scale, act_scale_ue8m0=True
        )
        return gemm.operands[-1]

    return linear


def normed_rows(rows: int, device="cpu", seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, callers.HIDDEN, generator=gen) * 3).bfloat16().to(device)


def pinned(rows: torch.Tensor):
    from dsv41_kernels.sglang_plugin import group_quant

    q, scales = group_quant_ue8m0(rows, 32)
    group_quant.pin(rows, (q, scales), "hc_boundary_quant_fp8")
    return q, scales


def test_sglangs_linear_takes_the_pinned_groups(sm90_linear, fired):
    rows = normed_rows(6)
    q, scales = pinned(rows)
    got_q, got_scales = sm90_linear(rows)
    assert got_q is q and got_scales is scales
    assert fired()[PINNED_HOOK] == {"ours": 1, "sglang": {}}


def test_other_rows_and_other_quantizations_get_sglangs_quantizer(plugin, fired):
    """The shared hook with SGLang's quantizer as a stand-in: rows without groups pass through
    uncounted (a copy of pinned rows too); a slice of them, another quantization of them, or
    the rows written in place since get SGLang's quantizer, each counted with its reason."""
    from dsv41_kernels.sglang_plugin import dispatch, group_quant

    sglangs = []

    def quantizer(x, group_size, *args, **kwargs):
        sglangs.append(group_size)
        return "sglang's"

    call = lambda x, *a, **k: group_quant.quant_hook(quantizer, x, *a, **k)  # noqa: E731
    assert call(normed_rows(2), 32, scale_ue8m0=True) == "sglang's"
    assert PINNED_HOOK not in fired()
    rows = normed_rows(6, seed=1)
    q, scales = pinned(rows)
    assert call(rows.view(-1, rows.shape[-1]), 32, scale_ue8m0=True) == (q, scales)  # a view
    assert call(rows.clone(), 32, scale_ue8m0=True) == "sglang's"  # other rows: uncounted
    assert fired()[PINNED_HOOK] == {"ours": 1, "sglang": {}}
    cases = [
        (lambda: call(rows[:3], 32, scale_ue8m0=True), "not the rows"),
        (lambda: call(rows, 64, scale_ue8m0=True), "group_size"),
        (lambda: call(rows, 32), "scale_ue8m0"),
        (lambda: call(rows, 32, column_major_scales=True, scale_ue8m0=True), "column_major"),
        (lambda: call(rows, 32, eps=1e-6, scale_ue8m0=True), "eps"),
    ]
    for run, reason in cases:
        dispatch.reset()
        assert run() == "sglang's"
        (why,) = fired()[PINNED_HOOK]["sglang"]
        assert reason in why, (reason, why)
    for written in (rows, q):  # the rows, or our groups, written in place: stale
        dispatch.reset()
        written.view(torch.uint8).add_(1)
        assert call(rows, 32, scale_ue8m0=True) == "sglang's"
        (why,) = fired()[PINNED_HOOK]["sglang"]
        assert "written in place" in why


def test_the_post_after_the_sublayer_drops_the_groups(plugin, fired):
    """The post of the sublayer that read the rows (SGLang's ``run_attn_post``, here off SM90:
    its torch post) ends their groups' life: the sublayer may have rewritten its input rows
    with a kernel (the in-place Triton MoE), which no version counter sees."""
    from sglang.srt.environ import envs
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from dsv41_kernels.sglang_plugin import group_quant
    from test.sglang.test_hc_boundary import inputs, triplet_and_boundary

    layer = callers.v41_decoder_layer(torch.Generator().manual_seed(0), "cpu")
    y, _, residual = inputs(6, "cpu")
    triplet, _ = triplet_and_boundary(layer, 6)
    rows = normed_rows(6)
    pinned(rows)
    assert group_quant.pinned_rows(rows.view(-1, rows.shape[-1])) is not None
    with envs.SGLANG_OPT_USE_TILELANG_MHC_POST.override(False):
        mhc.run_attn_post(
            layer.ffn_hc, y, residual, stats_stream=None, next=None, world_size=1,
            precomputed=triplet,
        )  # fmt: skip
    assert group_quant.pinned_rows(rows) is None and group_quant._slots.pinned is None


@pytest.fixture
def sm90(plugin, on_gpu, monkeypatch):
    """The pinned groups' admission on a pretended SM90 with the built-in H200 policy."""
    from dsv41_kernels.sglang_plugin import group_quant

    platform = types.SimpleNamespace(is_sm90=True, is_blackwell=False)
    monkeypatch.setattr(group_quant, "get_platform", lambda: platform)
    on_gpu()
    return group_quant


@pytest.mark.parametrize("form", FORMS)
def test_each_form_pins_its_groups_for_sglangs_linear(sm90, sm90_linear, fired, monkeypatch,
                                                      form):  # fmt: skip
    """Each form, its groups' site admitted (forced), pins the groups of the rows it returns
    (here its fallback's: the reference quantizer of them), and SGLang's linear takes them,
    counted under the site's name."""
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from dsv41_kernels.admission import refuse
    from dsv41_kernels.sglang_plugin import hc_boundary, hc_combine_norm
    from test.sglang.test_hc_boundary import inputs, triplet_and_boundary

    site, switch = FORMS[form]
    monkeypatch.setenv("DSV41_KERNELS_FORCE", switch)
    assert sm90.groups_admission(normed_rows(1), site)
    layer = callers.v41_decoder_layer(torch.Generator().manual_seed(0), "cpu")
    y, _, residual = inputs(2, "cpu")
    triplet, boundary = triplet_and_boundary(layer, 2)
    args = (y, residual, triplet, boundary, refuse("CPU"))
    if form == "fused":
        state = hc_boundary._boundary(layer.attn_hc, *args)
    elif form == "without statistics":
        state = hc_boundary._post_combine_norm(*args)
        assert state.stats is None
    else:  # the streams as SGLang's post left them, to our combine (as its hook calls it)
        state = mhc.HcState(residual, triplet[0])
    if form == "unfused seam":
        x = hc_combine_norm._combine(layer.ffn_hc, state, None, refuse("CPU"))
    else:
        x = mhc.combine(layer.ffn_hc, state)
    q, scales = sm90_linear(x)
    theirs = group_quant_ue8m0(x, 32)
    ours = (q.view(torch.uint8), scales)
    assert bit_mismatches(ours, (theirs[0].view(torch.uint8), theirs[1])) == 0
    assert fired()[f"{site}.{PINNED}"] == {"ours": 1, "sglang": {}}


@pytest.mark.parametrize("form", FORMS)
def test_the_sites_are_sm90_only_and_off_until_measured(plugin, on_gpu, monkeypatch, form):
    from dsv41_kernels.sglang_plugin import group_quant

    site, switch = FORMS[form]
    y = normed_rows(6)
    assert "not SM90" in group_quant.groups_admission(y, site).reason
    sm90 = types.SimpleNamespace(is_sm90=True, is_blackwell=False)
    monkeypatch.setattr(group_quant, "get_platform", lambda: sm90)
    on_gpu()  # the built-in H200 policy, which has not measured the site
    refusal = group_quant.groups_admission(y, site)
    assert not refusal and f"{site} not measured" in refusal.reason
    on_gpu(policy=policies.declining_policy(site, "x us against y us"))
    assert "measured slower" in group_quant.groups_admission(y, site).reason
    monkeypatch.setenv("DSV41_KERNELS_FORCE", switch)
    assert group_quant.groups_admission(y, site)
    with torch.inference_mode():  # no version counters: nothing to pin against
        assert "inference mode" in group_quant.groups_admission(y, site).reason
        assert "inference mode" in group_quant.groups_admission(normed_rows(6), site).reason


# ---- GPU tier ------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("stats_stream", [False, True], ids=["inline statistics", "stats stream"])
@pytest.mark.parametrize("rows", [1, 6, 17, 64])
def test_gpu_the_attention_linear_gets_sglangs_quantizer_bits(sm90_linear, fired, monkeypatch,
                                                              rows, stats_stream):  # fmt: skip
    """Forced (not measured yet): a boundary into an attention sublayer through SGLang's chain
    (``run_attn_post`` with the attention's ``HcNextBoundary``, its ``combine``, then its
    ``wqkv_a`` linear): our boundary fires (the fused one, or without SGLang's stats stream the
    one without statistics), the linear's quantizer call is answered with the pinned groups, and
    they are SGLang's own quantizer's bits of the rows the combine returned; with the plugin's
    mHC hooks off, SGLang's quantizer runs as before."""
    from sglang.kernels.ops.quantization.fp8_kernel import sglang_per_token_group_quant_fp8
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from test.sglang.test_hc_boundary import inputs, triplet_and_boundary

    monkeypatch.setenv("DSV41_KERNELS_FORCE", "hc_boundary,hc_mix_stats,hc_combine_norm")
    layer = callers.v41_decoder_layer(torch.Generator().manual_seed(rows), "cuda")
    y, _, residual = inputs(rows, "cuda", seed=rows)
    triplet, _ = triplet_and_boundary(layer, rows)
    triplet = tuple(t.cuda() for t in triplet)
    boundary = mhc.make_boundary(layer.input_layernorm, accepts_mxfp8=False, hc=layer.attn_hc)
    stream = torch.cuda.Stream() if stats_stream else None

    def chain():
        state = mhc.run_attn_post(
            layer.ffn_hc, y, residual, stats_stream=stream, next=boundary, world_size=1,
            precomputed=triplet,
        )  # fmt: skip
        x = mhc.combine(layer.attn_hc, state)
        return x, sm90_linear(x)

    x, (q, scales) = chain()
    boundary_hook, site = (
        (POST_COMBINE_NORM_HOOK, "hc_post_combine_norm_quant_fp8")
        if stats_stream
        else (BOUNDARY_HOOK, "hc_boundary_quant_fp8")
    )
    pinned_hook = f"{site}.{PINNED}"
    counts = fired()
    assert counts[boundary_hook]["ours"] == 1 and counts[pinned_hook] == {"ours": 1, "sglang": {}}
    theirs = sglang_per_token_group_quant_fp8.__wrapped__(x, 32, scale_ue8m0=True)
    assert bit_mismatches(q.view(torch.uint8), theirs[0].view(torch.uint8)) == 0
    assert bit_mismatches(scales, theirs[1]) == 0
    with callers.sglang_functions(mhc):  # the plugin's mHC off: SGLang's launch quantizes
        _, (sglang_q, _) = chain()
    assert sglang_q is not q and fired()[pinned_hook]["ours"] == 1


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 6, 96, 384, 2048])
def test_gpu_the_linear_after_sglangs_combine_gets_sglangs_quantizer_bits(
    sm90_linear, fired, monkeypatch, rows
):
    """Forced (not measured yet): SGLang's ``combine`` of an attention's streams (the seam the
    boundary leaves unfused: above 64 rows, or with the boundary off), then the attention's
    ``wqkv_a`` linear: our combine fires, the linear's quantizer call is answered with the
    pinned groups, and they are SGLang's own quantizer's bits of the rows the combine returned."""
    from sglang.kernels.ops.quantization.fp8_kernel import sglang_per_token_group_quant_fp8
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from test.sglang.test_hc_boundary import inputs, triplet_and_boundary

    monkeypatch.setenv("DSV41_KERNELS_FORCE", "hc_combine_norm")
    layer = callers.v41_decoder_layer(torch.Generator().manual_seed(rows), "cuda")
    _, _, residual = inputs(rows, "cuda", seed=rows)
    pre = triplet_and_boundary(layer, rows)[0][0].cuda()
    x = mhc.combine(layer.attn_hc, mhc.HcState(residual, pre))
    q, scales = sm90_linear(x)
    counts = fired()
    pinned_hook = f"hc_combine_norm_quant_fp8.{PINNED}"
    assert counts[COMBINE_HOOK]["ours"] == 1 and counts[pinned_hook] == {"ours": 1, "sglang": {}}
    theirs = sglang_per_token_group_quant_fp8.__wrapped__(x, 32, scale_ue8m0=True)
    assert bit_mismatches(q.view(torch.uint8), theirs[0].view(torch.uint8)) == 0
    assert bit_mismatches(scales, theirs[1]) == 0
