"""GPU tier: each hook inside SGLang 0.5.23's own caller on CUDA tensors (the H200).

The callers (``test/sglang/callers.py``) are SGLang's: DSpark's verify epilogue, the mHC
``combine`` / ``mix_stats`` of a DeepSeek-V4.1 decoder layer after SGLang's post-load step,
the model's ``vision_topk`` binding with a real ``MoEGate``. SGLang's own result comes from the
same caller with our hooks taken out. Each test asserts through the plugin's fire counts which
function ran. The scheduler hook, inside FlashMLA itself, is ``test_gpu_decoding_sched_meta.py``.
"""

from __future__ import annotations

import pytest
import torch

from dsv41_kernels.cases.hc_mix_stats import stats_relative_error
from test.sglang import callers

pytestmark = pytest.mark.gpu

VOCAB = 129280
ACCEPT_HOOK = "accept_greedy.accept_greedy_triton"


# ---------------------------------------------------------------------------------------------
# accept_greedy: DsparkVerifyEpilogue -> AcceptGreedy.execute -> accept_greedy_triton


def accept_case(bs, seed, *, nan):
    gen = torch.Generator().manual_seed(seed)
    logits = callers.verify_logits(gen, bs, VOCAB, nan=nan).cuda()
    return callers.StaticVerifyStep(callers.draft_candidates(logits, bs, gen), logits)


def sglang_accept(step, *, fused_argmax):
    """The same epilogue with SGLang's functions: ``fused_argmax`` (what it runs for V4.1) or
    torch.argmax (the composition the accept rule is defined over)."""
    with callers.stock_epilogue():
        epilogue = callers.verify_epilogue(step.batch.batch_size, "cuda", fused_argmax=fused_argmax)
        return step.run(epilogue)


def assert_accept_equal(ours, theirs, what):
    for name, value in theirs.items():
        assert ours[name].dtype == value.dtype, (what, name)
        assert torch.equal(ours[name], value), (what, name)


@pytest.mark.parametrize("bs", [1, 4, 16, 64])
def test_verify_epilogue_eager(plugin, fired, bs):
    with_nan, nan_free = accept_case(bs, bs, nan=True), accept_case(bs, 100 + bs, nan=False)
    with callers.epilogue_in_steps():
        ours_nan = with_nan.run(callers.verify_epilogue(bs, "cuda"))
        ours = nan_free.run(callers.verify_epilogue(bs, "cuda"))
    assert fired()[ACCEPT_HOOK] == {"ours": 2, "sglang": {}}
    assert_accept_equal(ours_nan, sglang_accept(with_nan, fused_argmax=False), "torch.argmax")
    assert_accept_equal(ours, sglang_accept(nan_free, fused_argmax=False), "torch.argmax")
    # SGLang's own V4.1 accept (its fused argmax) agrees wherever no row holds NaN.
    assert_accept_equal(ours, sglang_accept(nan_free, fused_argmax=True), "SGLang 0.5.23")


@pytest.mark.parametrize("bs", [1, 4, 16])
def test_verify_epilogue_in_cuda_graph(plugin, fired, bs):
    """Captured once (after an eager warm-up, as SGLang's graph runner does), replayed with new
    logits and drafts written in place: every replay's accept buffers equal the torch.argmax
    composition on those values, NaN rows included."""
    step = accept_case(bs, 7 * bs, nan=True)
    epilogue = callers.verify_epilogue(bs, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with callers.epilogue_in_steps():
        with torch.cuda.stream(side):
            step.run(epilogue)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            epilogue.begin_static_step(bs, armed=False)
            epilogue._static_epilogue(step.out, step.batch)
    assert fired()[ACCEPT_HOOK] == {"ours": 2, "sglang": {}}  # the warm-up and the capture
    for replay in range(4):
        new = accept_case(bs, 1000 * bs + replay, nan=replay % 2 == 0)
        step.out.next_token_logits.copy_(new.out.next_token_logits)
        step.batch.input_ids.copy_(new.batch.input_ids)
        graph.replay()
        torch.cuda.synchronize()
        got = callers.read_accept(epilogue, bs)
        assert_accept_equal(got, sglang_accept(new, fused_argmax=False), f"replay {replay}")
    assert fired()[ACCEPT_HOOK]["ours"] == 2  # replays run no Python: not counted


# ---------------------------------------------------------------------------------------------
# hc_combine_norm and hc_mix_stats of a V4.1 decoder layer


@pytest.fixture(scope="module")
def v41_layer(plugin):
    """A V4.1 decoder layer (H = 5120) after SGLang's post-load step, on the GPU: on SM90 it
    holds SGLang's bf16 parts and our derived weights."""
    return callers.v41_decoder_layer(torch.Generator().manual_seed(0), "cuda")


ROWS = [1, 6, 32, 128, 4096]
# Every branch of SGLang's SM90 dispatch and of ours: 1, 2-31 and 32+ rows on SGLang's side;
# small-row below 128, compensated from 128 (16384: its fused kernel) on ours.
MIX_STATS_ROWS = [1, 6, 32, 128, 1024, 4096, 16384]


@pytest.mark.parametrize("rows", ROWS)
def test_combine_of_a_v41_layer(v41_layer, fired, rows):
    from sglang.srt.models import deepseek_v4_mhc as mhc

    hc = v41_layer.attn_hc
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 4, callers.HIDDEN, generator=gen).bfloat16().cuda()
    pre = (torch.rand(rows, 4, generator=gen) + 0.1).cuda()
    ours = mhc.combine(hc, mhc.HcState(x, pre))  # Hopper: no quantized consumer
    counts = fired()["hc_combine_norm._combine"]
    branch = callers.sm90_combine_branch(rows)
    if counts["ours"] == 0:  # declined where measured slower: SGLang's own branch ran
        (reason,) = counts["sglang"]
        assert reason.startswith("measured slower than SGLang 0.5.23"), (reason, branch)
        return
    assert counts == {"ours": 1, "sglang": {}}, counts
    ref = callers.combine_norm_float64(x, pre, hc.norm.weight, hc.norm.variance_epsilon)
    error = callers.bf16_ulp_error(ours, ref)
    assert error <= 1.0
    with callers.sglang_functions(mhc):
        theirs, why = callers.run_sglang(lambda: mhc.combine(hc, mhc.HcState(x, pre)))
    if why is not None:
        pytest.skip(f"SGLang's own {branch} does not run here ({why})")
    assert error <= max(1.0, callers.bf16_ulp_error(theirs, ref)), f"SGLang's {branch} is closer"


@pytest.mark.parametrize("rows", MIX_STATS_ROWS)
def test_mix_stats_of_a_v41_layer(v41_layer, fired, rows):
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from dsv41_kernels.reference.hc_mix_stats import hc_mix_stats as reference

    hc = v41_layer.attn_hc
    if torch.cuda.get_device_capability()[0] == 9:
        assert hc.bf16_parts is not None  # SGLang's SM90 load step built them
    x = torch.randn(rows, 4, callers.HIDDEN, generator=torch.Generator().manual_seed(rows))
    x = x.bfloat16().cuda()
    ours = mhc.mix_stats(hc, x)
    assert fired()["hc_mix_stats._mix_stats_impl"] == {"ours": 1, "sglang": {}}
    ref = reference(x, hc.fn, hc.scale, hc.base, iters=20, eps=1e-6, rms_eps=1e-6)
    error = stats_relative_error(ours, ref)
    assert error <= 1e-6, error  # the compensated statistics' bound against float64
    branch = callers.sm90_mix_stats_branch(rows)
    with callers.sglang_functions(mhc):
        theirs, why = callers.run_sglang(lambda: mhc.mix_stats(hc, x))
    if why is not None:  # e.g. tilelang absent: the 2-31-row branch
        pytest.skip(f"SGLang's own {branch} does not run here ({why}); ours: error {error:.2e}")
    if branch == "hc_mix_stats_sinkhorn_bf16x3":  # SGLang's compensated path: ours is closer
        assert error <= stats_relative_error(theirs, ref), f"SGLang's {branch} is closer"
    else:  # its fp32 split-K paths: both at fp32 rounding level
        assert stats_relative_error(theirs, ref) <= 1e-6


@pytest.mark.parametrize("bs", [1, 2, 16, 64])  # 6 .. 384 rows: both CUDA argmax kernels
def test_fused_accept_tail_row_argmax(plugin, fired, bs):
    """The fused accept tail's argmax (``dspark_verify``'s own ``_row_argmax`` binding) on the
    GPU: equal to torch.argmax, NaN rows included (SGLang's own fused argmax is inexact on
    NaN); from 96 rows the op's one-CTA-a-row kernel runs."""
    from sglang.srt.speculative.dspark_components import dspark_verify

    gen = torch.Generator().manual_seed(bs)
    for nan in (False, True):
        logits = callers.verify_logits(gen, bs, VOCAB, nan=nan).cuda()
        assert torch.equal(dspark_verify._row_argmax(logits, fused=True), logits.argmax(-1))
    assert fired()["accept_greedy._row_argmax"] == {"ours": 2, "sglang": {}}


# ---------------------------------------------------------------------------------------------
# moe_fused_gate: vision routing through the model's vision_topk binding, a real MoEGate


def route_inputs(tokens, seed):
    """``(logits, input_ids)`` on the GPU: random gate outputs, every third token an image's."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, 129000, (tokens,), generator=gen)
    input_ids[::3] = callers.IMAGE_TOKEN_ID
    logits = torch.randn(tokens, callers.EXPERTS, generator=gen)
    return logits.cuda(), input_ids.cuda()


def route(moe, tokens, seed):
    from sglang.srt.models import deepseek_v2

    logits, input_ids = route_inputs(tokens, seed)
    ours = deepseek_v2.vision_topk(moe, logits, input_ids)
    theirs = deepseek_v2.vision_topk.__wrapped__(moe, logits, input_ids)
    return ours, theirs


NEAR_TIE_ULP = 4
"""SGLang's router computes its scores in fast math, within about an ulp of the exact ones."""


def assert_same_experts_but_near_ties(moe, tokens, ours, theirs):
    """SGLang's ids equal ours (which equal the torch reference) but at slots where the two
    experts' exact biased scores lie within :data:`NEAR_TIE_ULP`: there its fast-math scores
    may order them the other way (on the H200 from 2560 tokens of random logits)."""
    from dsv41_kernels.cases.moe_fused_gate import fp32_ulp_distance
    from dsv41_kernels.reference.moe_fused_gate import sqrt_softplus

    logits, input_ids = route_inputs(tokens, tokens)
    gate = moe.gate
    image = (input_ids == moe.config.image_token_id)[:, None]
    bias = torch.where(image, gate.e_score_correction_bias_vl, gate.e_score_correction_bias)
    biased = sqrt_softplus(logits) + bias.float()
    rows, slots = (ours != theirs).nonzero(as_tuple=True)
    distance = fp32_ulp_distance(
        biased[rows, ours[rows, slots].long()], biased[rows, theirs[rows, slots].long()]
    )
    assert bool((distance <= NEAR_TIE_ULP).all()), (tokens, rows.tolist(), distance.tolist())


@pytest.mark.parametrize("runner", [None, "flashinfer_mxfp4"])
def test_vision_topk_fires_where_it_measured_faster(plugin, fired, runner):
    """Unforced, the hook takes every token count on the H200 (its policy: measured faster
    there, the CUDA kernel's three layouts to 65536 tokens) and declines every size on a GPU
    without a policy. Where it fires,
    the ids equal SGLang's and the torch reference's, the weights are within the op's stated
    bound of the reference and no farther from it than SGLang's fast-math kernel, and the
    packed ids are the op's own packing of its ids and weights."""
    from dsv41_kernels.cases.moe_fused_gate import WEIGHT_ULP_BOUND, fp32_ulp_distance
    from dsv41_kernels.reference.moe_fused_gate import pack_topk
    from dsv41_kernels.sglang_plugin.policy import for_device

    measured = for_device(torch.cuda.current_device()).policy is not None  # the H200's
    moe = callers.vision_moe(torch.Generator().manual_seed(3), "cuda", runner=runner)
    token_counts = (1, 6, 64, 256, 257, 1024, 2048, 2049, 2560, 4096)
    fires = {tokens: measured for tokens in token_counts}
    for tokens, ours_run in fires.items():
        ours, theirs = route(moe, tokens, tokens)
        assert_same_experts_but_near_ties(moe, tokens, ours.topk_ids, theirs.topk_ids)
        assert hasattr(ours, "packed_topk_ids") == (runner is not None)
        if not ours_run:
            continue
        if runner is not None:
            assert torch.equal(ours.packed_topk_ids, pack_topk(ours.topk_ids, ours.topk_weights))
        ref_weights, ref_ids = callers.reference_route(moe, *route_inputs(tokens, tokens))
        assert torch.equal(ours.topk_ids, ref_ids)
        ours_ulp = int(fp32_ulp_distance(ours.topk_weights, ref_weights).max())
        theirs_ulp = int(fp32_ulp_distance(theirs.topk_weights, ref_weights).max())
        assert ours_ulp <= min(WEIGHT_ULP_BOUND, theirs_ulp), (tokens, ours_ulp, theirs_ulp)
    counts = fired()["moe_fused_gate.vision_topk"]
    assert counts["ours"] == sum(fires.values()), counts
    assert sum(counts["sglang"].values()) == len(fires) - sum(fires.values()), counts
    assert all(r.startswith(("measured slower", "not measured")) for r in counts["sglang"])


@pytest.mark.parametrize("runner", [None, "flashinfer_mxfp4"])
def test_vision_topk_forced_equals_sglang(plugin, fired, monkeypatch, runner):
    from dsv41_kernels.cases.moe_fused_gate import fp32_ulp_distance

    monkeypatch.setenv("DSV41_KERNELS_FORCE", "moe_fused_gate")
    moe = callers.vision_moe(torch.Generator().manual_seed(2), "cuda", runner=runner)
    for tokens in (1, 6, 64):
        ours, theirs = route(moe, tokens, 10 + tokens)
        assert torch.equal(ours.topk_ids, theirs.topk_ids)
        assert int(fp32_ulp_distance(ours.topk_weights, theirs.topk_weights).max()) <= 2
        if runner is not None:
            assert torch.equal(ours.packed_topk_ids, theirs.packed_topk_ids)
    assert fired()["moe_fused_gate.vision_topk"] == {"ours": 3, "sglang": {}}
