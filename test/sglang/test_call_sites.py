"""Each hook fires when SGLang's own caller runs, and returns what SGLang's contract says.

CPU tier: the hooks run our Triton kernels under the interpreter. The callers are SGLang's
(``test/sglang/callers.py``): DSpark's verify epilogue, ``deepseek_v4_mhc.combine`` and
``mix_stats``, the model's ``vision_topk`` binding with a real ``MoEGate``, the V4 backend's
scheduler precompute. SGLang's own result comes from the same caller with our hooks taken
out (``callers.sglang_functions``). Integers (argmax, accept lengths, bonus tokens, router ids)
are compared bit for bit; floats within the op's documented bound. The plugin's fire counts
prove which function ran.
"""

from __future__ import annotations

import types

import pytest
import torch

from dsv41_kernels import interpreter
from test.sglang import callers, policies

VOCAB = 4099  # >= the row-argmax kernel's 4096 minimum, and not a multiple of any block


def only_ours(counts, hook, calls):
    assert counts.get(hook) == {"ours": calls, "sglang": {}}, counts


# ---------------------------------------------------------------------------------------------
# accept_greedy: the greedy accept


@pytest.mark.parametrize("bs", [1, 3])
def test_verify_epilogue_accepts_with_ours(plugin, fired, bs):
    """DSpark's static verify epilogue of a V4.1 target (``fused_argmax``), run in its steps,
    takes our accept, and its accept buffers equal the torch.argmax composition's, NaN rows
    included."""

    gen = torch.Generator().manual_seed(bs)
    logits = callers.verify_logits(gen, bs, VOCAB, nan=True)
    step = callers.StaticVerifyStep(callers.draft_candidates(logits, bs, gen), logits)
    with callers.epilogue_in_steps():
        ours = step.run(callers.verify_epilogue(bs, "cpu"))
    only_ours(fired(), "accept_greedy.accept_greedy", 1)  # CPU tensors: AcceptGreedy.torch

    with callers.stock_epilogue():
        torch_rule = step.run(callers.verify_epilogue(bs, "cpu", fused_argmax=False))
    for name, value in torch_rule.items():
        assert ours[name].dtype == value.dtype and torch.equal(ours[name], value), name


@pytest.mark.parametrize("cutoff", [None, "capped"])
def test_accept_greedy_equals_sglang(plugin, fired, cutoff):
    from sglang.kernels.ops.speculative.dspark import dspark_accept

    gen = torch.Generator().manual_seed(3)
    bs = 3
    for _ in range(3):
        logits = callers.verify_logits(gen, bs, VOCAB, nan=True)
        candidates = callers.draft_candidates(logits, bs, gen)
        cut = None if cutoff is None else torch.tensor([1, 3, 6], dtype=torch.int32)
        kwargs = dict(
            candidates=candidates,
            target_logits=logits,
            verify_num_draft_tokens=callers.VERIFY_ROWS,
            cutoff_verify_lens=cut,
            fused_argmax=True,
        )
        ours = dspark_accept.AcceptGreedy.execute(**kwargs)  # the call site (CPU: .torch)
        theirs = dspark_accept.accept_greedy.__wrapped__(**kwargs)
        for o, t in zip(ours, theirs, strict=True):
            assert o.dtype == t.dtype and torch.equal(o, t)
    only_ours(fired(), "accept_greedy.accept_greedy", 3)


def test_row_argmax_equals_torch_argmax(plugin, fired):
    """The fused accept tail's argmax (``dspark_verify``'s own ``_row_argmax`` binding)."""
    from sglang.kernels.ops.speculative.dspark import dspark_accept
    from sglang.srt.speculative.dspark_components import dspark_verify

    logits = callers.verify_logits(torch.Generator().manual_seed(5), 1, VOCAB, nan=True)
    for fused in (False, True):
        got = dspark_verify._row_argmax(logits, fused=fused)
        assert torch.equal(got, dspark_accept._row_argmax.__wrapped__(logits, fused=fused))
        assert torch.equal(got, torch.argmax(logits, -1))
    only_ours(fired(), "accept_greedy._row_argmax", 2)


def test_accept_falls_back_to_sglang_when_not_admitted(plugin, fired):
    from sglang.kernels.ops.speculative.dspark import dspark_accept

    logits = torch.randn(4, 1000)  # vocab below the kernel's minimum
    candidates = torch.zeros(2, 2, dtype=torch.int64)
    kwargs = dict(candidates=candidates, target_logits=logits, verify_num_draft_tokens=2)
    ours = dspark_accept.accept_greedy(**kwargs)
    theirs = dspark_accept.accept_greedy.__wrapped__(**kwargs)
    assert all(torch.equal(o, t) for o, t in zip(ours, theirs, strict=True))
    counts = fired()["accept_greedy.accept_greedy"]
    assert counts["ours"] == 0 and sum(counts["sglang"].values()) == 1
    (reason,) = counts["sglang"]
    assert "4096" in reason  # the admission's own words


def test_declined_accept_runs_sglangs_own_argmax(plugin, fired, monkeypatch, on_gpu):
    """Where our accept declines, SGLang's accept runs as it does without the plugin: the
    ``_row_argmax`` it calls is SGLang's own, counted as such, even where ours would take that
    argmax. Per call and per thread: another thread's argmax meanwhile, and every one after,
    take ours."""
    import threading

    from sglang.kernels.ops.speculative.dspark import dspark_accept

    from dsv41_kernels.sglang_plugin import accept_greedy as hooks

    on_gpu(policy=policies.declining_policy("accept_greedy", "a test"))
    gen = torch.Generator().manual_seed(8)
    bs = 2
    logits = callers.verify_logits(gen, bs, VOCAB, nan=True)
    step = callers.StaticVerifyStep(callers.draft_candidates(logits, bs, gen), logits)

    elsewhere = []  # another thread's argmax while SGLang's accept runs
    rule = "compute_dflash_correct_drafts_and_bonus"  # what SGLang's accept calls next
    sglangs_rule = getattr(dspark_accept, rule)

    def rule_with_a_second_thread(**kwargs):
        thread = threading.Thread(
            target=lambda: elsewhere.append(dspark_accept._row_argmax(logits))
        )
        thread.start()
        thread.join()
        return sglangs_rule(**kwargs)

    monkeypatch.setattr(dspark_accept, rule, rule_with_a_second_thread)
    with callers.epilogue_in_steps():
        declined_run = step.run(callers.verify_epilogue(bs, "cpu"))
    monkeypatch.setattr(dspark_accept, rule, sglangs_rule)
    dspark_accept._row_argmax(logits)  # after the accept: ours again
    counts = fired()
    (reason,) = counts["accept_greedy.accept_greedy"]["sglang"]
    assert reason.startswith("measured slower than SGLang") and reason.endswith("a test")
    argmax = counts["accept_greedy._row_argmax"]
    assert argmax["ours"] == 2, counts  # the other thread's and the one after
    assert argmax["sglang"] == {hooks.SGLANGS_ACCEPT.reason: 1}, counts
    assert torch.equal(elsewhere[0], torch.argmax(logits, -1))
    with callers.stock_epilogue():
        stock = step.run(callers.verify_epilogue(bs, "cpu"))
    for name, value in stock.items():
        assert torch.equal(declined_run[name], value), name


# ---------------------------------------------------------------------------------------------
# moe_fused_gate: vision routing


def route(moe, gen, tokens, dtype, rows=None):
    from sglang.srt.models import deepseek_v2

    input_ids = torch.randint(0, 1000, (tokens,), generator=gen)
    input_ids[::3] = callers.IMAGE_TOKEN_ID  # image tokens take the alternate bias
    logits = torch.randn(tokens, moe.gate.e_score_correction_bias.numel(), generator=gen)
    logits = logits.to(dtype)
    # The binding DeepseekV2MoE.forward_normal(_dual_stream) calls.
    ours = deepseek_v2.vision_topk(moe, logits, input_ids, num_token_non_padded=rows)
    theirs = deepseek_v2.vision_topk.__wrapped__(moe, logits, input_ids, num_token_non_padded=rows)
    return ours, theirs


def test_vision_topk_declines_by_default(plugin, fired, on_gpu):
    """On a GPU no policy matches, the hook hands SGLang's own one-launch packed gate every
    call."""
    on_gpu(machine=policies.GB300)
    gen = torch.Generator().manual_seed(10)
    moe = callers.vision_moe(gen, "cpu", num_experts=64)
    ours, theirs = route(moe, gen, 9, torch.float32)
    assert torch.equal(ours.topk_ids, theirs.topk_ids)
    assert torch.equal(ours.topk_weights, theirs.topk_weights)
    counts = fired()["moe_fused_gate.vision_topk"]
    assert counts["ours"] == 0
    assert counts["sglang"] == {"not measured on NVIDIA GB300; run `dsv41-kernels calibrate`": 1}


@pytest.mark.parametrize("runner", [None, "flashinfer_mxfp4"])
@pytest.mark.parametrize("padded", [False, True])
def test_vision_topk_forced_equals_sglang(plugin, fired, monkeypatch, runner, padded):
    from sglang.srt.layers.moe.topk import StandardTopKOutputPacked

    from dsv41_kernels.cases.moe_fused_gate import fp32_ulp_distance
    from dsv41_kernels.ops.moe.pack_topk import pack_topk

    monkeypatch.setenv("DSV41_KERNELS_FORCE", "moe_fused_gate")
    gen = torch.Generator().manual_seed(11)
    moe = callers.vision_moe(gen, "cpu", num_experts=64, runner=runner)
    for dtype in (torch.float32, torch.bfloat16):
        ours, theirs = route(moe, gen, 9, dtype, rows=torch.tensor([6]) if padded else None)
        assert torch.equal(ours.topk_ids, theirs.topk_ids)
        assert int(fp32_ulp_distance(ours.topk_weights, theirs.topk_weights).max()) <= 2
        assert isinstance(ours, StandardTopKOutputPacked) == (runner is not None)
        if runner is not None:
            expected = pack_topk(ours.topk_ids, ours.topk_weights)
            assert torch.equal(ours.packed_topk_ids, expected)
    only_ours(fired(), "moe_fused_gate.vision_topk", 2)


# ---------------------------------------------------------------------------------------------
# hc_combine_norm and hc_mix_stats: the mHC combine + norm and mixing statistics


@pytest.mark.parametrize("rows", [1, 6, 130])
def test_combine_is_ours_within_its_contract(plugin, fired, rows):
    from sglang.srt.layers.quantization.mxfp8_input import Mxfp8SwizzledInput
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from dsv41_kernels.ops.quantization.mxfp8_quantize import mxfp8_quantize
    from dsv41_kernels.sglang_plugin import hc_combine_norm as hooks

    gen = torch.Generator().manual_seed(rows)
    hc = callers.v41_decoder_layer(gen, "cpu", hidden=64).attn_hc
    quantized_calls = 0
    for decade in (1e-3, 1.0, 1e3):
        x = (torch.randn(rows, 4, 64, generator=gen) * decade).bfloat16()
        pre = torch.rand(rows, 4, generator=gen) + 0.1
        ours = mhc.combine(hc, mhc.HcState(x, pre))  # the sublayer's input, as the layer asks
        # The reduction orders differ, so the bar is the contract's float64 statement: ours
        # within one bf16 ulp of it, and no farther from it than SGLang's own path.
        ref = callers.combine_norm_float64(x, pre, hc.norm.weight, hc.norm.variance_epsilon)
        theirs = mhc._combine.__wrapped__(hc, mhc.HcState(x, pre), None)
        assert ours.dtype == theirs.dtype == torch.bfloat16
        error = callers.bf16_ulp_error(ours, ref)
        assert error <= 1.0
        assert error <= max(1.0, callers.bf16_ulp_error(theirs.detach(), ref))
        quantized = []  # what a swizzled-MXFP8 consumer (Blackwell) asks for
        y = mhc.combine(hc, mhc.HcState(x, pre), quantized)
        assert torch.equal(y, ours)
        if rows <= hooks.MAX_QUANTIZED_ROWS:
            (pair,) = quantized
            quantized_calls += 1
            assert isinstance(pair, Mxfp8SwizzledInput)
            data, scales = mxfp8_quantize(y)
            assert torch.equal(pair.data.view(torch.uint8), data.view(torch.uint8))
            assert torch.equal(pair.scales.view(torch.uint8), scales.view(torch.uint8))
        else:
            assert quantized == []  # the consumer quantizes for itself, as in SGLang
    only_ours(fired(), "hc_combine_norm._combine", 6)


def test_combine_first_sublayer_is_sglangs(plugin, fired):
    """Without a previous ``pre`` SGLang only norms stream 0; the hook hands that over."""
    from sglang.srt.models import deepseek_v4_mhc as mhc

    hc = callers.v41_decoder_layer(torch.Generator().manual_seed(2), "cpu", hidden=64).attn_hc
    x = torch.randn(3, 4, 64).bfloat16()
    y = mhc.combine(hc, mhc.HcState(x, None))
    assert torch.equal(y, hc.norm(x[:, 0, :]))
    counts = fired()["hc_combine_norm._combine"]
    assert counts["ours"] == 0 and list(counts["sglang"]) == [
        "no materialised residual or no pre (first sublayer)"
    ]


@pytest.mark.parametrize("rows", [1, 6, 130])
def test_mix_stats_are_ours_and_equal_sglang(plugin, fired, sglang_torch_sinkhorn, rows):
    from sglang.srt.models import deepseek_v4_mhc as mhc

    gen = torch.Generator().manual_seed(rows)
    hc = callers.v41_decoder_layer(gen, "cpu", hidden=64).attn_hc
    x = torch.randn(rows, 4, 64, generator=gen).bfloat16()
    ours = mhc.mix_stats(hc, x)  # on the caller's stream, as on CPU
    theirs = mhc._mix_stats_impl.__wrapped__(hc, x)
    for name, o, t in zip(("pre", "post", "comb"), ours, theirs, strict=True):
        assert o.shape == t.shape and o.dtype == t.dtype == torch.float32, name
        # fp32 statistics by two reduction orders, through 20 Sinkhorn iterations
        torch.testing.assert_close(o, t, rtol=2e-5, atol=2e-6, msg=name)
    only_ours(fired(), "hc_mix_stats._mix_stats_impl", 1)


# ---------------------------------------------------------------------------------------------
# hc_mix_stats: derived weights at load, and the weight updater's refusal


def test_derived_weights_built_at_load_and_used(plugin, fired, sglang_torch_sinkhorn):
    from sglang.srt.models import deepseek_v4_mhc as mhc

    from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights
    from dsv41_kernels.sglang_plugin import hc_mix_stats as hook

    layer = callers.v41_decoder_layer(torch.Generator().manual_seed(1), "cpu", hidden=64)
    holders = layer._hc_derived_weights  # built by our AFTER hook on SGLang's post-load step
    assert [type(h) for h in holders] == [HcDerivedWeights, HcDerivedWeights]
    assert hook.derived_weights(layer.attn_hc.fn) is holders[0]
    assert hook.derived_weights(layer.ffn_hc.fn) is holders[1]
    x = torch.randn(130, 4, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    ours = mhc.mix_stats(layer.attn_hc, x)  # 130 rows: the compensated path
    theirs = mhc._mix_stats_impl.__wrapped__(layer.attn_hc, x)
    for o, t in zip(ours, theirs, strict=True):
        torch.testing.assert_close(o, t, rtol=2e-5, atol=2e-6)
    only_ours(fired(), "hc_mix_stats._mix_stats_impl", 1)
    layer.refresh_mhc_norm_weight_cache()  # a rebuild releases the previous splits
    assert not any(h.active for h in holders)
    assert all(h.active for h in layer._hc_derived_weights)


def test_weight_updater_refuses_while_derived_weights_are_active(plugin):
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

    layer = callers.v41_decoder_layer(torch.Generator().manual_seed(4), "cpu", hidden=64)
    model = torch.nn.Sequential(layer)
    updater = WeightUpdater(
        tp_rank=0,
        device="cpu",
        gpu_id=0,
        model_config=None,
        custom_weight_loaders={},
        get_model=lambda: model,
        update_model_fields=None,
        recapture_cuda_graph=None,
        get_model_runner=None,
    )
    before = layer.hc_attn_fn.detach().clone()
    ok, message = updater.update_weights_from_tensor(
        named_tensors=[("0.hc_attn_fn", torch.zeros_like(before))]
    )
    assert not ok
    assert "refused" in message and "DSV41_KERNELS_DISABLE=hc_mix_stats" in message
    assert torch.equal(layer.hc_attn_fn, before)
    for holder in layer._hc_derived_weights:  # released: SGLang no longer refuses for us
        holder.release()
    assert layer._derived_weight_cache_error is None


# ---------------------------------------------------------------------------------------------
# decoding_sched_meta: CPU tensors leave the metadata to SGLang, untouched


def test_sched_meta_cpu_is_sglangs(plugin, fired):
    from sglang.srt.layers.attention import deepseek_v4_backend as backend

    from dsv41_kernels.sglang_plugin import decoding_sched_meta as hooks

    metadata = types.SimpleNamespace(tile_scheduler_metadata=None, num_splits=None)
    q = torch.zeros(6, 1, 64, 512)
    backend._maybe_precompute_flashmla_sched_meta(
        metadata,
        q=q,
        indices=torch.zeros(6, 1, 512, dtype=torch.int32),
        topk_length=torch.ones(6, dtype=torch.int32),
        extra_indices=None,
        extra_topk_length=None,
    )
    assert metadata.tile_scheduler_metadata is None
    assert not hooks.sched_meta_admission(q, None, None)
    assert fired()["decoding_sched_meta._maybe_precompute_flashmla_sched_meta"] == {
        "ours": 0,
        "sglang": {"not a CUDA device": 1},
    }


# ---------------------------------------------------------------------------------------------
# inverse_rope_quant_fp8: the attention output on the way to the FP8 wo_a. SGLang's own kernels
# are CUDA JIT, so on CPU ours (under the interpreter) is held to the reference statement of
# them; the GPU tier compares with SGLang's kernels themselves
# (test_gpu_inverse_rope_quant_fp8.py).

ROPE_HOOK, QUANT_HOOK = callers.ROPE_HOOK, callers.QUANT_HOOK


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_attention_output_is_ours_and_equals_sglangs_chain(plugin, fired, tp):
    from dsv41_kernels.reference.inverse_rope_quant_fp8 import inverse_rope_quant_fp8 as reference

    layer = callers.v41_attention_layer(tp, "cpu")
    o, positions = callers.attention_output(layer, 2, seed=tp)
    assert o.is_contiguous() == (tp == 1)  # a slice of the padded heads at TP > 1
    codes, scales, rotated = reference(o, layer.freqs_cis, positions, o_groups=layer.n_local_groups)
    o_fp8, o_s = callers.attention_output_to_wo_a(layer, o, positions)
    assert o_fp8.dtype == torch.float8_e4m3fn and o_s.dtype == torch.float32
    assert o_fp8.shape == (2, 8 // tp, 4096) and o_s.shape == (2, 8 // tp, 32)
    assert torch.equal(o_fp8.view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(o_s.view(torch.int32), scales.view(torch.int32))
    assert torch.equal(o.view(torch.int16), rotated.view(torch.int16))  # rotated in place
    counts = fired()
    only_ours(counts, ROPE_HOOK, 1)
    only_ours(counts, QUANT_HOOK, 1)


def test_calls_from_elsewhere_pass_through_uncounted(plugin, fired):
    """The registry rewrites every binding of both functions: the query's RoPE, calls outside an
    ``MQALayer`` forward and every other quantizer call go to SGLang's function, uncounted."""
    from dsv41_kernels.sglang_plugin import group_quant
    from dsv41_kernels.sglang_plugin import inverse_rope_quant_fp8 as hooks

    layer = callers.v41_attention_layer(4, "cpu")
    o, positions = callers.attention_output(layer, 2, seed=1)
    q = o[..., -64:]
    seen = []
    sglangs = lambda *args, **kwargs: seen.append(kwargs.get("inverse", False))
    hooks.rope_hook(sglangs, q, None, layer.freqs_cis, positions=positions, inverse=True)
    hooks.forward_hook(
        lambda layer: hooks.rope_hook(sglangs, q, None, layer.freqs_cis, positions=positions),
        layer,
    )
    quantizer_calls = []
    quantizer = lambda *args, **kwargs: quantizer_calls.append(args) or "sglang's"
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    assert group_quant.quant_hook(quantizer, x, 128) == "sglang's"
    assert seen == [True, False] and len(quantizer_calls) == 1
    assert fired() == {}


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        (dict(group_size=64), "group_size"),
        (dict(group_size=128, scale_ue8m0=True), "scale_ue8m0"),
        (dict(group_size=128, column_major_scales=True), "column_major_scales"),
        (dict(group_size=128, eps=1e-6), "eps"),
    ],
)
def test_quantizer_call_that_differs_gets_sglangs_function(plugin, fired, kwargs, reason):
    """Ours kept for the attention output only serves the quantizer call the output path makes;
    any other call runs SGLang's function (on ``x``, which holds the rotated values by then)."""
    from dsv41_kernels.sglang_plugin import group_quant
    from dsv41_kernels.sglang_plugin import inverse_rope_quant_fp8 as hooks

    layer = callers.v41_attention_layer(4, "cpu")
    o, positions = callers.attention_output(layer, 1, seed=2)
    x = o.reshape(1, -1).view(2, 4096)  # the output path's [T * G, D] (a copy: o is a slice)

    def output_path(layer):
        hooks.rope_hook(None, o[..., -64:], None, layer.freqs_cis, positions=positions,
                       inverse=True)  # fmt: skip
        return group_quant.quant_hook(lambda *args, **kw: "sglang's", x, **kwargs)

    assert hooks.forward_hook(output_path, layer) == "sglang's"
    counts = fired()
    only_ours(counts, ROPE_HOOK, 1)
    (why,) = counts[QUANT_HOOK]["sglang"]
    assert reason in why and counts[QUANT_HOOK]["ours"] == 0


def test_attention_output_declines(plugin, monkeypatch, on_gpu):
    """What the hook leaves to SGLang, by its admission (pure: SGLang's own originals would run
    next, and they are CUDA kernels)."""
    from sglang.srt.models import deepseek_v4

    from dsv41_kernels.sglang_plugin import inverse_rope_quant_fp8 as hooks

    layer = callers.v41_attention_layer(2, "cpu")
    o, positions = callers.attention_output(layer, 3, seed=3)
    q = o[..., -64:]
    verdict, rebuilt = hooks.rope_admission(layer, q, layer.freqs_cis, positions)
    assert verdict and rebuilt.data_ptr() == o.data_ptr() and rebuilt.stride() == o.stride()
    bf16 = callers.v41_attention_layer(2, "cpu", wo_a_fp8=False)
    assert "bf16 wo_a" in hooks.rope_admission(bf16, q, bf16.freqs_cis, positions)[0].reason
    not_a_tail = q.contiguous()
    assert (
        "rope tail" in hooks.rope_admission(layer, not_a_tail, layer.freqs_cis, positions)[0].reason
    )
    monkeypatch.setattr(deepseek_v4, "_FP8_WO_A_UE8M0", True)
    assert "UE8M0" in hooks.rope_admission(layer, q, layer.freqs_cis, positions)[0].reason
    monkeypatch.setattr(deepseek_v4, "_FP8_WO_A_UE8M0", False)
    on_gpu(policy=policies.declining_policy("inverse_rope_quant_fp8", "x us against y us"))
    assert "measured slower" in hooks.rope_admission(layer, q, layer.freqs_cis, positions)[0].reason
    monkeypatch.setenv("DSV41_KERNELS_FORCE", "inverse_rope_quant_fp8")
    assert hooks.rope_admission(layer, q, layer.freqs_cis, positions)[0]
    monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)  # no interpreter, CPU
    assert "Triton device" in hooks.rope_admission(layer, q, layer.freqs_cis, positions)[0].reason


def test_forward_hook_scopes_the_layer_and_drops_what_it_kept(plugin):
    from dsv41_kernels.sglang_plugin import group_quant
    from dsv41_kernels.sglang_plugin import inverse_rope_quant_fp8 as hooks

    layer = callers.v41_attention_layer(4, "cpu")
    o, positions = callers.attention_output(layer, 1, seed=4)

    def rope_only(layer):
        assert hooks._site.layer is layer
        hooks.rope_hook(None, o[..., -64:], None, layer.freqs_cis, positions=positions,
                       inverse=True)  # fmt: skip
        return group_quant._slots.pending

    kept = hooks.forward_hook(rope_only, layer)
    assert kept.hook == QUANT_HOOK and kept.result[0].shape == (2, 4096)
    assert hooks._site.layer is None and group_quant._slots.pending is None
